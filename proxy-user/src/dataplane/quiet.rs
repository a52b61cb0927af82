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
//! A pod's addresses are the host routes through its interface (a CNI
//! routes each pod address to its veth). An interface with any other route
//! (a subnet behind the pod) is never marked: which clients answer through
//! it is not known.
use std::{
    borrow::{Borrow, BorrowMut},
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::{Arc, Mutex},
};

use aya::maps::{Array, MapData, MapError};
use futures::TryStreamExt as _;
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType,
};
use proxy_common::{
    ct_dir,
    prefilter::quiet::{self, QuietMark},
};

use super::{
    conntrack::Key,
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

/// An attached pod interface and its pod's addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRoutes {
    pub ifindex: u32,
    pub addrs: Vec<IpAddr>,
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

/// The host routes of each of `pods` (interface indices), from the main
/// table of both families; an interface with any other route is left out,
/// and so is one with none.
pub async fn pod_routes(
    handle: &rtnetlink::Handle,
    pods: &[u32],
) -> Result<Vec<PodRoutes>, rtnetlink::Error> {
    let mut routes = Vec::new();
    let mut v4 = handle
        .route()
        .get(rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute();
    while let Some(route) = v4.try_next().await? {
        routes.push(route);
    }
    let mut v6 = handle
        .route()
        .get(rtnetlink::RouteMessageBuilder::<Ipv6Addr>::new().build())
        .execute();
    while let Some(route) = v6.try_next().await? {
        routes.push(route);
    }
    Ok(host_routes(routes.iter().filter_map(route_of), pods))
}

/// What one route says for quiet marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub oif: u32,
    /// The destination when it is one address (a /32 or /128), `None` for
    /// a wider prefix.
    pub host: Option<IpAddr>,
}

/// A main-table unicast route's output interface and host destination;
/// `None` for routes of other tables and types, link-local IPv6 routes
/// (every interface has one; no Service client has such an address), and
/// routes without one output interface.
fn route_of(msg: &RouteMessage) -> Option<Route> {
    let table = msg
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(msg.header.table));
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) || msg.header.kind != RouteType::Unicast {
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
    if let Some(IpAddr::V6(a)) = dst {
        if a.is_unicast_link_local() {
            return None;
        }
    }
    let host_len = match dst {
        Some(IpAddr::V4(_)) => 32,
        Some(IpAddr::V6(_)) => 128,
        None => return oif.map(|oif| Route { oif, host: None }),
    };
    Some(Route {
        oif: oif?,
        host: (msg.header.destination_prefix_length == host_len).then_some(dst?),
    })
}

/// Each of `pods` whose routes are all host routes, with their
/// destinations.
pub fn host_routes(routes: impl IntoIterator<Item = Route>, pods: &[u32]) -> Vec<PodRoutes> {
    let mut addrs: HashMap<u32, Vec<IpAddr>> = HashMap::new();
    let mut other: HashSet<u32> = HashSet::new();
    for route in routes {
        match route.host {
            Some(addr) => addrs.entry(route.oif).or_default().push(addr),
            None => {
                other.insert(route.oif);
            }
        }
    }
    pods.iter()
        .filter(|index| !other.contains(index))
        .filter_map(|&ifindex| {
            let addrs = addrs.remove(&ifindex)?;
            Some(PodRoutes { ifindex, addrs })
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

    fn has(&self, addr: IpAddr, class: u32) -> bool {
        self.0.contains(&(addr, class))
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
    /// generation) whose pod's addresses are the client of no kept flow of
    /// that class.
    pub fn marks(&self, live: &LiveClients) -> Vec<(u32, u32, u64)> {
        let mut marks = Vec::new();
        for (pod, gens) in &self.before {
            for (class, gen) in CLASSES.into_iter().zip(gens) {
                let busy = pod.addrs.iter().any(|addr| live.has(*addr, class));
                if let (false, Some(gen)) = (busy, gen) {
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

    fn v4(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    fn host(oif: u32, addr: &str) -> Route {
        Route {
            oif,
            host: Some(v4(addr)),
        }
    }

    #[test]
    fn only_interfaces_with_host_routes_alone_are_candidates() {
        let routes = [
            host(5, "10.244.1.2"),
            host(5, "fd00:10:244::2"),
            host(6, "10.244.1.3"),
            // A subnet behind pod 6: not a candidate.
            Route { oif: 6, host: None },
            // The uplink's default route; the uplink is no pod.
            Route { oif: 2, host: None },
        ];
        let found = host_routes(routes, &[5, 6, 7]);
        assert_eq!(
            found,
            vec![PodRoutes {
                ifindex: 5,
                addrs: vec![v4("10.244.1.2"), v4("fd00:10:244::2")],
            }],
            "6 has a subnet route, 7 none"
        );
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

    /// A pod with a UDP flow (DNS) is quiet for TCP and not for UDP; a pod
    /// whose only entry is a reply (its forward entry gone) is not quiet for
    /// that class; a removed flow does not count.
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
            &key([10, 244, 1, 4], [10, 96, 0, 1], proto::TCP, ct_dir::FORWARD),
            true,
        );
        let look = Look {
            before: vec![
                (
                    PodRoutes {
                        ifindex: 5,
                        addrs: vec![v4("10.244.1.2")],
                    },
                    [Some(7), Some(9)],
                ),
                (
                    PodRoutes {
                        ifindex: 6,
                        addrs: vec![v4("10.244.1.3")],
                    },
                    [Some(1), Some(0)],
                ),
                (
                    PodRoutes {
                        ifindex: 8,
                        addrs: vec![v4("10.244.1.4")],
                    },
                    // A generation that could not be read: no mark.
                    [Some(3), None],
                ),
            ],
        };
        assert_eq!(
            look.marks(&live),
            vec![(5, quiet::TCP, 7), (6, quiet::OTHER, 0), (8, quiet::TCP, 3),]
        );
    }
}
