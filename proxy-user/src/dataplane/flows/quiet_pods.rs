//! The quiet marks of pod interfaces (see `proxy_common::prefilter::quiet`):
//! `sb_to_pod` passes a packet unread when its pod has no flow of the
//! packet's class (TCP, the rest) that the tc layer translated, so the
//! socket layer's connections and a pod's own traffic pay no
//! connection-tracking miss.
//!
//! The data path counts the flows it tracks from each interface and class
//! (a generation). A mark names an interface and the generation it was made
//! at, and holds while the generation stays there. So the agent may mark at
//! any time, provided it read the generation before it looked at the
//! tables:
//! - the attacher marks a pod interface that appeared since the start before
//!   it first attaches the programs there (no flow can be tracked yet);
//! - the connection-tracking collector, after each pass over both tables,
//!   marks every attached pod interface whose addresses are the client of
//!   no kept flow of a class, with the generation it read before the pass
//!   ([`Look`]). A pod that stops making flows through the tc layer (its
//!   DNS flows expire) is quiet again at the next pass.
//!
//! The clients whose replies come through a pod interface are the
//! destinations its routes cover: a host route per pod address (most CNIs),
//! or the pod's own subnet on a point-to-point link. A client inside any
//! prefix routed through the interface makes it busy; a more specific route
//! elsewhere only makes that judgement stricter than it need be. An
//! interface with no route of its own (a bridge's port: its pods' routes
//! name the bridge) is never marked.
use std::{
    borrow::{Borrow, BorrowMut},
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::{Arc, Mutex},
};

use aya::maps::{Array, MapData, MapError};
use futures::TryStreamExt as _;
use netlink_packet_route::{
    route::{RouteAddress, RouteAttribute, RouteMessage, RouteType},
    AddressFamily,
};
use proxy_common::{
    ct_dir,
    prefilter::quiet::{self, QuietMark},
};

use crate::dataplane::{
    flows::entry::Key,
    pins::{MapsError, Pins},
};

/// The classes of protocol a mark speaks for.
pub const CLASSES: [u32; 2] = [quiet::TCP, quiet::OTHER];

/// A class's name, as `status` shows it.
pub fn class_name(class: u32) -> &'static str {
    match class {
        quiet::TCP => "tcp",
        _ => "other",
    }
}

/// The marks (written here) and the generations (the data path's).
pub struct QuietPods<T = MapData, G = MapData> {
    marks: Array<T, QuietMark>,
    gens: Array<G, u64>,
}

impl QuietPods {
    /// Both maps, from their pins.
    pub fn open(pins: Pins<'_>) -> Result<Self, MapsError> {
        Ok(Self::new(pins.quiet_pods()?, pins.quiet_gens()?))
    }
}

impl<T: BorrowMut<MapData>, G: Borrow<MapData>> QuietPods<T, G> {
    pub fn new(marks: Array<T, QuietMark>, gens: Array<G, u64>) -> Self {
        Self { marks, gens }
    }

    /// `ifindex`'s generation of `class` now.
    pub fn generation(&self, ifindex: u32, class: u32) -> Result<u64, MapError> {
        self.gens.get(&quiet::index(ifindex, class), 0)
    }

    /// Marks `ifindex` quiet for `class` as of generation `gen`, which must
    /// have been read before a look that found no flow of the class (or
    /// before any program could track one). The slot is cleared first: a
    /// reader that catches the write half done sees bytes of the mark and
    /// zeros, an index or a generation that is not the current one.
    pub fn mark(&mut self, ifindex: u32, class: u32, gen: u64) -> Result<(), MapError> {
        let index = quiet::index(ifindex, class);
        self.marks.set(index, QuietMark::default(), 0)?;
        let mark = QuietMark {
            ifindex,
            _pad: 0,
            gen,
        };
        self.marks.set(index, mark, 0)
    }

    /// Marks `ifindex` quiet for both classes at their current generations:
    /// only for an interface no program runs on yet.
    pub fn mark_unattached(&mut self, ifindex: u32) -> Result<(), MapError> {
        for class in CLASSES {
            let gen = self.generation(ifindex, class)?;
            self.mark(ifindex, class, gen)?;
        }
        Ok(())
    }

    /// Takes `ifindex`'s marks away, where its slots hold them.
    pub fn unmark(&mut self, ifindex: u32) -> Result<(), MapError> {
        for class in CLASSES {
            let index = quiet::index(ifindex, class);
            if self.marks.get(&index, 0)?.ifindex == ifindex {
                self.marks.set(index, QuietMark::default(), 0)?;
            }
        }
        Ok(())
    }

    /// Whether `ifindex` is quiet for `class` now, as the data path judges.
    pub fn is_quiet(&self, ifindex: u32, class: u32) -> Result<bool, MapError> {
        let mark = self.marks.get(&quiet::index(ifindex, class), 0)?;
        Ok(mark.holds(ifindex, self.generation(ifindex, class)?))
    }
}

/// An attached pod interface and the prefixes routed through it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRoutes {
    pub ifindex: u32,
    pub prefixes: Vec<Prefix>,
}

/// A route's destination: an address, masked to its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl Prefix {
    /// `addr` masked to `len` bits (the family's width at most).
    pub fn of(addr: IpAddr, len: u8) -> Self {
        let addr = match addr {
            IpAddr::V4(a) => {
                let len = u32::from(len.min(32));
                let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let len = u32::from(len.min(128));
                let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Self { addr, len }
    }
}

/// The pod interfaces the collector may mark: set by the agent's loop after
/// each rescan, read by the collector before each pass.
#[derive(Clone, Debug, Default)]
pub struct Candidates(Arc<Mutex<Vec<PodRoutes>>>);

impl Candidates {
    pub fn set(&self, pods: Vec<PodRoutes>) {
        // A poisoned lock only means a panic elsewhere mid-write of a Vec:
        // the value is whole either way.
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = pods;
    }

    pub fn get(&self) -> Vec<PodRoutes> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The routes through each of `pods` (interface indices), both families;
/// an interface with none is left out.
pub async fn pod_routes(
    handle: &rtnetlink::Handle,
    pods: &[u32],
) -> Result<Vec<PodRoutes>, rtnetlink::Error> {
    let mut routes = Vec::new();
    let dumps = [
        rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().build(),
        rtnetlink::RouteMessageBuilder::<Ipv6Addr>::new().build(),
    ];
    for request in dumps {
        let mut dump = handle.route().get(request).execute();
        while let Some(route) = dump.try_next().await? {
            routes.extend(route_of(&route));
        }
    }
    Ok(by_interface(routes, pods))
}

/// A unicast route's output interface and destination, of any table (a
/// policy route sends replies too); `None` for other types (local,
/// broadcast, multicast) and for routes without one output interface.
fn route_of(msg: &RouteMessage) -> Option<(u32, Prefix)> {
    if msg.header.kind != RouteType::Unicast {
        return None;
    }
    let mut oif = None;
    let mut dst = None;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Oif(index) => oif = Some(*index),
            RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = Some(IpAddr::V4(*a)),
            RouteAttribute::Destination(RouteAddress::Inet6(a)) => dst = Some(IpAddr::V6(*a)),
            _ => {}
        }
    }
    // No destination: a default route.
    let dst = dst.unwrap_or(match msg.header.address_family {
        AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    });
    Some((oif?, Prefix::of(dst, msg.header.destination_prefix_length)))
}

/// Each of `pods` that `routes` (output interface, destination) name, with
/// its prefixes.
pub fn by_interface(
    routes: impl IntoIterator<Item = (u32, Prefix)>,
    pods: &[u32],
) -> Vec<PodRoutes> {
    let mut prefixes: HashMap<u32, Vec<Prefix>> = HashMap::new();
    for (oif, prefix) in routes {
        prefixes.entry(oif).or_default().push(prefix);
    }
    pods.iter()
        .filter_map(|&ifindex| {
            let prefixes = prefixes.remove(&ifindex)?;
            Some(PodRoutes { ifindex, prefixes })
        })
        .collect()
}

/// The clients of the flows a collector pass kept, by class: the source of
/// a forward entry, the destination of a reply entry (its flow's forward
/// entry may be gone; its replies are still translated).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveClients(HashSet<(IpAddr, u32)>);

impl LiveClients {
    /// Notes the client of the entry under `key`, unless it was `removed`.
    pub fn note<K: Key>(&mut self, key: &K, removed: bool) {
        if removed {
            return;
        }
        let client = match key.dir() {
            ct_dir::FORWARD => key.src().0,
            _ => key.dst().0,
        };
        self.0
            .insert((K::ip(client), quiet::class_of_flow(key.proto())));
    }
}

/// The generations of the candidates, read before a collector pass.
#[derive(Clone, Debug, Default)]
pub struct Look {
    before: Vec<(PodRoutes, [Option<u64>; 2])>,
}

impl Look {
    /// Reads each candidate's generations (one that cannot be read is not
    /// marked).
    pub fn new<T: BorrowMut<MapData>, G: Borrow<MapData>>(
        quiet: &QuietPods<T, G>,
        candidates: Vec<PodRoutes>,
    ) -> Self {
        let before = candidates
            .into_iter()
            .map(|pod| {
                let gens = CLASSES.map(|class| quiet.generation(pod.ifindex, class).ok());
                (pod, gens)
            })
            .collect();
        Self { before }
    }

    /// The marks the pass's `live` clients allow: each (interface, class,
    /// generation) with no kept flow of that class whose client lies in a
    /// prefix routed through the interface. Each client is masked to each
    /// prefix length the candidates have (a handful), and looked up.
    pub fn marks(&self, live: &LiveClients) -> Vec<(u32, u32, u64)> {
        let mut through: HashMap<Prefix, Vec<u32>> = HashMap::new();
        for (pod, _) in &self.before {
            for prefix in &pod.prefixes {
                through.entry(*prefix).or_default().push(pod.ifindex);
            }
        }
        let mut lengths: Vec<(bool, u8)> =
            through.keys().map(|p| (p.addr.is_ipv6(), p.len)).collect();
        lengths.sort_unstable();
        lengths.dedup();
        let mut busy: HashSet<(u32, u32)> = HashSet::new();
        for (client, class) in &live.0 {
            let lens = lengths.iter().filter(|(v6, _)| *v6 == client.is_ipv6());
            for (_, len) in lens {
                for ifindex in through
                    .get(&Prefix::of(*client, *len))
                    .into_iter()
                    .flatten()
                {
                    busy.insert((*ifindex, *class));
                }
            }
        }
        let mut marks = Vec::new();
        for (pod, gens) in &self.before {
            for (class, gen) in CLASSES.into_iter().zip(gens) {
                if let (false, Some(gen)) = (busy.contains(&(pod.ifindex, class)), gen) {
                    marks.push((pod.ifindex, class, *gen));
                }
            }
        }
        marks
    }
}

/// After a pass over both tables: writes the marks `look` and `live` allow
/// where the slot does not hold a current one already; how many were
/// written, and the first error (the others are alike).
pub fn settle<T: BorrowMut<MapData>, G: Borrow<MapData>>(
    quiet: &mut QuietPods<T, G>,
    look: &Look,
    live: &LiveClients,
) -> Result<usize, MapError> {
    let mut written = 0;
    let mut first_error = None;
    for (ifindex, class, gen) in look.marks(live) {
        if quiet.is_quiet(ifindex, class).unwrap_or(false) {
            continue;
        }
        match quiet.mark(ifindex, class, gen) {
            Ok(()) => written += 1,
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    match first_error {
        Some(error) => Err(error),
        None => Ok(written),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxy_common::{proto, CtKey};

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    fn prefix(s: &str, len: u8) -> Prefix {
        Prefix::of(ip(s), len)
    }

    #[test]
    fn prefixes_are_masked_to_their_length() {
        assert_eq!(prefix("10.244.1.2", 24), prefix("10.244.1.0", 24));
        assert_eq!(prefix("10.244.1.2", 0).addr, ip("0.0.0.0"));
        assert_eq!(prefix("fd00:10:244:1::2", 64).addr, ip("fd00:10:244:1::"));
        assert_eq!(prefix("fd00::1", 128).addr, ip("fd00::1"));
    }

    #[test]
    fn an_interface_without_routes_is_no_candidate() {
        let routes = [
            (5, prefix("10.244.1.2", 32)),
            (5, prefix("fd00:10:244::2", 128)),
            (6, prefix("10.244.2.0", 24)),
            // The uplink's default route; the uplink is no pod.
            (2, prefix("0.0.0.0", 0)),
        ];
        let found = by_interface(routes, &[5, 6, 7]);
        let indices: Vec<u32> = found.iter().map(|p| p.ifindex).collect();
        assert_eq!(indices, vec![5, 6], "7 has no route (a bridge port)");
        assert_eq!(found[0].prefixes.len(), 2);
    }

    fn key(src: [u8; 4], dst: [u8; 4], protocol: u8, dir: u8) -> CtKey {
        CtKey {
            saddr_be: u32::from_ne_bytes(src),
            daddr_be: u32::from_ne_bytes(dst),
            sport_be: 40000u16.to_be(),
            dport_be: 80u16.to_be(),
            proto: protocol,
            dir,
            _pad: [0; 2],
        }
    }

    fn pod(
        ifindex: u32,
        prefixes: &[Prefix],
        gens: [Option<u64>; 2],
    ) -> (PodRoutes, [Option<u64>; 2]) {
        let prefixes = prefixes.to_vec();
        (PodRoutes { ifindex, prefixes }, gens)
    }

    /// A pod with a UDP flow (DNS) is quiet for TCP and not for UDP; a pod
    /// whose only entry is a reply (its forward entry gone) is not quiet for
    /// that class; a client inside a pod's subnet route counts like one on
    /// its host route; a removed flow does not count.
    #[test]
    fn marks_follow_the_clients_of_kept_flows_by_class() {
        let mut live = LiveClients::default();
        live.note(
            &key(
                [10, 244, 1, 2],
                [10, 96, 0, 10],
                proto::UDP,
                ct_dir::FORWARD,
            ),
            false,
        );
        live.note(
            &key([10, 244, 2, 1], [10, 244, 1, 3], proto::TCP, ct_dir::REPLY),
            false,
        );
        live.note(
            &key([10, 244, 9, 7], [10, 96, 0, 1], proto::TCP, ct_dir::FORWARD),
            false,
        );
        live.note(
            &key([10, 244, 1, 4], [10, 96, 0, 1], proto::TCP, ct_dir::FORWARD),
            true,
        );
        let look = Look {
            before: vec![
                pod(5, &[prefix("10.244.1.2", 32)], [Some(7), Some(9)]),
                pod(6, &[prefix("10.244.1.3", 32)], [Some(1), Some(0)]),
                // A subnet route: 10.244.9.7's TCP flow is behind it.
                pod(7, &[prefix("10.244.9.0", 24)], [Some(2), Some(2)]),
                // A generation that could not be read: no mark.
                pod(8, &[prefix("10.244.1.4", 32)], [Some(3), None]),
            ],
        };
        assert_eq!(
            look.marks(&live),
            vec![
                (5, quiet::TCP, 7),
                (6, quiet::OTHER, 0),
                (7, quiet::OTHER, 2),
                (8, quiet::TCP, 3),
            ]
        );
    }
}
