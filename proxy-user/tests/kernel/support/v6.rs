//! The IPv6 maps of a loaded object written directly, for the IPv6 fixtures
//! that set exact service and backend ids (the agent's model writes them
//! for the others), and IPv6 conntrack keys. The IPv6 frame builders are
//! `proxy_testkit::packet6`.
use std::net::Ipv6Addr;

use std::os::fd::AsFd as _;

use aya::maps::{Array, HashMap, IterableMap as _, MapData};
use proxy_common::{
    addr6_be, frontend_flags, prefilter, scope, Backend6, CtEntry6, CtKey6, FrontendKey6,
    FrontendSlot,
};

/// One IPv6 frontend: address, port, protocol, service id, kind flags, its
/// backends (id, address, all on `backend_port`) and, under
/// `externalTrafficPolicy: Local`, its local set.
pub struct Fe6<'a> {
    pub addr: Ipv6Addr,
    pub port: u16,
    pub proto: u8,
    pub service_id: u32,
    pub kind: u16,
    pub backend_port: u16,
    pub backends: &'a [(u32, Ipv6Addr)],
    pub local: Option<&'a [(u32, Ipv6Addr)]>,
}

/// The IPv6 maps of a loaded object: second handles on the maps its
/// syncer's `PinnedMaps` holds, so a test writes them directly.
pub struct Maps6 {
    pub frontends: HashMap<MapData, FrontendKey6, FrontendSlot>,
    pub backends: HashMap<MapData, u32, Backend6>,
    pub conntrack: HashMap<MapData, CtKey6, CtEntry6>,
    /// The frontend address bitmap: a frontend written here gets its bit,
    /// as the agent's writes do.
    pub frontend_filter: Array<MapData, u64>,
}

/// Another handle on the same kernel map.
fn dup<K: aya::Pod, V: aya::Pod>(map: &HashMap<MapData, K, V>) -> HashMap<MapData, K, V> {
    let fd = map
        .map()
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .expect("dup map fd");
    let data = MapData::from_fd(fd).expect("map from fd");
    HashMap::try_from(aya::maps::Map::HashMap(data)).expect("hash map")
}

impl Maps6 {
    pub fn take(maps: &proxy_user::dataplane::maps::PinnedMaps) -> Self {
        Self {
            frontends: dup(&maps.frontends6),
            backends: dup(&maps.backends6),
            conntrack: dup(&maps.conntrack6),
            frontend_filter: {
                let map = maps
                    .frontend_filter_map()
                    .expect("the agent's maps keep the bitmap");
                let fd = map.fd().as_fd().try_clone_to_owned().expect("dup map fd");
                let data = MapData::from_fd(fd).expect("map from fd");
                Array::try_from(aya::maps::Map::Array(data)).expect("array map")
            },
        }
    }

    /// Sets the bitmap bits of frontend `addr`, `port`, `proto` (never
    /// cleared here): the address's and the address, port and protocol's.
    fn announce(&mut self, addr: Ipv6Addr, port: u16, proto: u8) {
        let shift = prefilter::frontends::shift_for(self.frontend_filter.len());
        let addr_bit = prefilter::frontends::bit6(&addr6_be(addr.octets()), shift);
        let port_bit = prefilter::frontends::port_bit(addr_bit, port.to_be(), proto, shift);
        for bit in [addr_bit, port_bit] {
            let (word, mask) = prefilter::frontends::word_and_mask(bit);
            let bits = self.frontend_filter.get(&word, 0).expect("bitmap word");
            self.frontend_filter
                .set(word, bits | mask, 0)
                .expect("bitmap word written");
        }
    }

    /// Writes an IPv6 ClusterIP frontend with service id `service_id`,
    /// `sessionAffinity: ClientIP` with this timeout (seconds) if `affinity`
    /// is given, and `backends` (id, address, port) in slots 1..
    pub fn frontend(
        &mut self,
        addr: Ipv6Addr,
        port: u16,
        proto: u8,
        service_id: u32,
        affinity: Option<u32>,
        backends: &[(u32, Ipv6Addr, u16)],
    ) {
        let (flags, affinity_timeout_s) = match affinity {
            Some(timeout_s) => (frontend_flags::AFFINITY_CLIENT_IP, timeout_s),
            None => (0, 0),
        };
        let slot0 = FrontendSlot {
            backend_id: 0,
            service_id,
            backend_count: 0,
            flags: flags | frontend_flags::KIND_CLUSTER_IP,
            affinity_timeout_s,
        };
        self.write_set(addr, port, proto, scope::INTERNAL, slot0, backends);
    }

    /// Writes the frontend `fe`: its backends for traffic from inside and,
    /// under `externalTrafficPolicy: Local`, its local set for traffic from
    /// outside.
    pub fn write(&mut self, fe: &Fe6) {
        let mut flags = fe.kind;
        let with_port = |set: &[(u32, Ipv6Addr)]| -> Vec<(u32, Ipv6Addr, u16)> {
            set.iter()
                .map(|&(id, ip)| (id, ip, fe.backend_port))
                .collect()
        };
        let slot0 = |flags| FrontendSlot {
            backend_id: 0,
            service_id: fe.service_id,
            backend_count: 0,
            flags,
            affinity_timeout_s: 0,
        };
        if let Some(local) = fe.local {
            flags |= frontend_flags::LOCAL_ONLY;
            let set = with_port(local);
            self.write_set(
                fe.addr,
                fe.port,
                fe.proto,
                scope::EXTERNAL,
                slot0(flags),
                &set,
            );
        }
        let set = with_port(fe.backends);
        self.write_set(
            fe.addr,
            fe.port,
            fe.proto,
            scope::INTERNAL,
            slot0(flags),
            &set,
        );
    }

    /// Writes the backends `set` (id, address, port) of one frontend and
    /// scope in slots 1.., and `slot0` (its backend count set) in slot 0.
    fn write_set(
        &mut self,
        addr: Ipv6Addr,
        port: u16,
        proto: u8,
        scope_: u8,
        slot0: FrontendSlot,
        set: &[(u32, Ipv6Addr, u16)],
    ) {
        self.announce(addr, port, proto);
        let key = |slot: u16| FrontendKey6 {
            addr_be: addr6_be(addr.octets()),
            port_be: port.to_be(),
            proto,
            scope: scope_,
            slot,
            _pad1: [0; 2],
        };
        for (i, &(id, ip, bport)) in set.iter().enumerate() {
            let backend = Backend6 {
                addr_be: addr6_be(ip.octets()),
                port_be: bport.to_be(),
                proto,
                flags: 0,
            };
            self.backends
                .insert(id, backend, 0)
                .expect("write a backend");
            let slot = FrontendSlot {
                backend_id: id,
                service_id: slot0.service_id,
                ..FrontendSlot::default()
            };
            self.frontends
                .insert(key(i as u16 + 1), slot, 0)
                .expect("write a slot");
        }
        let slot0 = FrontendSlot {
            backend_count: set.len() as u16,
            ..slot0
        };
        self.frontends
            .insert(key(0), slot0, 0)
            .expect("write slot 0");
    }

    /// The conntrack entry under `key`, if there is one.
    pub fn ct(&self, key: &CtKey6) -> Option<CtEntry6> {
        self.conntrack.get(key, 0).ok()
    }
}

/// A conntrack key of an IPv6 flow.
pub fn ct_key6(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16, proto: u8, dir: u8) -> CtKey6 {
    CtKey6 {
        saddr_be: addr6_be(src.octets()),
        daddr_be: addr6_be(dst.octets()),
        sport_be: sport.to_be(),
        dport_be: dport.to_be(),
        proto,
        dir,
        _pad: [0; 2],
    }
}
