//! What the pinned maps hold, read back as rows: every frontend with its
//! backends and counters ([`read_services`]), and the data path's counters
//! with how full each map is ([`read_stats`]). `switchboard services`,
//! `stats`, `status` and `doctor` print them; `/metrics` exports them.
use std::collections::{BTreeMap, HashMap};

use aya::maps::IterableMap as _;
use proxy_common::{frontend_flags as ff, scope, FrontendSlot, SvcStats};
use serde::Serialize;

use crate::{
    dataplane::maps::PinnedMaps,
    model::{FrontendAddr, IpFamily, LbAlgorithm},
    sync::{
        encode::{backend_addr, frontend_addr, revnat_name, AnyBackend, AnyFrontendKey, AnyRevNat},
        store::{Dump, MapStore as _},
    },
};

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ServiceRow {
    /// `namespace/name:port` as the agent recorded it.
    pub service: String,
    pub id: u32,
    pub address: String,
    pub port: u16,
    pub protocol: String,
    /// ClusterIP, NodePort, LoadBalancer or ExternalIP.
    pub kind: &'static str,
    /// The governing traffic policy is `Local`: `internalTrafficPolicy` on a
    /// ClusterIP frontend (its backends are this node's), `externalTrafficPolicy`
    /// on the others (their backends serve pod traffic, cluster-wide; traffic
    /// from outside gets `external_backends`).
    pub local_only: bool,
    /// No endpoint was ready; these are serving, terminating ones.
    pub terminating_fallback: bool,
    /// `sessionAffinity: ClientIP` timeout (the data path applies it).
    pub affinity_timeout_s: Option<u32>,
    /// How new flows pick a backend (`switchboard.io/lb-algorithm` or
    /// `--lb-algorithm`), as slot 0 records it.
    pub algorithm: LbAlgorithm,
    pub backends: Vec<BackendRow>,
    /// Under `externalTrafficPolicy: Local`: the backends traffic from
    /// outside the node gets (this node's endpoints).
    pub external_backends: Option<Vec<BackendRow>>,
    /// Slots that name a backend id absent from the backend map (should be 0).
    pub missing_backends: usize,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub drops_no_backend: u64,
    /// `loadBalancerSourceRanges`: the client blocks allowed in (`None`:
    /// the frontend is open to every source; empty: to none).
    pub source_ranges: Option<Vec<String>>,
    /// Packets dropped because their source was outside them.
    pub drops_source_range: u64,
    /// The agent keeps this Service (or one of its EndpointSlices) at its
    /// last good version: a newer version cannot be used (see `problems`).
    pub held: bool,
    /// Why, by object and field (from the agent's status file).
    pub problems: Vec<String>,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct BackendRow {
    pub id: u32,
    pub address: String,
    pub port: u16,
    /// In a weighted set (`switchboard.io/weights`, not all equal): the
    /// backend's weight as programmed, its share of the set's slots (the
    /// weights divided by their common divisor, scaled down when their sum
    /// is above the table's bound); 0: drained, no new flows. `None`: the
    /// set's backends weigh the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u16>,
}

#[cfg(test)]
impl ServiceRow {
    /// A TCP ClusterIP row with these backends and no counters (tests).
    pub(crate) fn for_test(
        service: &str,
        address: &str,
        port: u16,
        backends: Vec<BackendRow>,
    ) -> ServiceRow {
        ServiceRow {
            service: service.to_owned(),
            id: 1,
            address: address.to_owned(),
            port,
            protocol: "TCP".to_owned(),
            kind: "ClusterIP",
            local_only: false,
            terminating_fallback: false,
            affinity_timeout_s: None,
            algorithm: LbAlgorithm::Random,
            backends,
            external_backends: None,
            missing_backends: 0,
            packets: 0,
            bytes: 0,
            new_flows: 0,
            drops_no_backend: 0,
            source_ranges: None,
            drops_source_range: 0,
            held: false,
            problems: Vec::new(),
        }
    }
}

/// Reads every frontend (both families) with its backends and counters
/// from the maps.
pub fn read_services(maps: &PinnedMaps) -> Vec<ServiceRow> {
    let denied = maps.denied_by_service();
    rows(
        &maps.dump(),
        |id| maps.service_stats(id),
        |id| denied.get(&id).copied().unwrap_or(0),
    )
}

/// The rows of a copy of the maps, IPv4 frontends first, each family by
/// address, port and protocol; `stats` gives a service id's counters.
pub fn rows(
    dump: &Dump,
    stats: impl Fn(u32) -> SvcStats,
    denied: impl Fn(u32) -> u64,
) -> Vec<ServiceRow> {
    let mut blocks: HashMap<u32, Vec<crate::model::cidr::IpCidr>> = HashMap::new();
    for (id, block) in &dump.source_ranges {
        blocks.entry(*id).or_default().push(*block);
    }
    let blocks: HashMap<u32, Vec<String>> = blocks
        .into_iter()
        .map(|(id, mut list)| {
            list.sort();
            (id, list.iter().map(ToString::to_string).collect())
        })
        .collect();
    let slots: HashMap<AnyFrontendKey, FrontendSlot> = dump.frontends.iter().copied().collect();
    let backends: HashMap<(IpFamily, u32), AnyBackend> = dump
        .backends
        .iter()
        .map(|(id, b)| ((b.family(), *id), *b))
        .collect();
    let revnat: HashMap<(IpFamily, u32), AnyRevNat> = dump
        .revnat
        .iter()
        .map(|(id, r)| ((r.family(), *id), *r))
        .collect();
    let mut heads: Vec<(FrontendAddr, AnyFrontendKey, FrontendSlot)> = dump
        .frontends
        .iter()
        .filter(|(key, _)| key.slot() == 0 && key.scope() == scope::INTERNAL)
        .filter_map(|(key, head)| Some((frontend_addr(key)?, *key, *head)))
        .collect();
    heads.sort_by_key(|(addr, _, _)| *addr);
    let mut rows = Vec::new();
    for (addr, key, head) in heads {
        let (backends_rows, mut missing) = read_slots(&slots, &backends, &key, &head);
        let external_backends = ff::has_external_set(head.flags).then(|| {
            let ext_key = key.at(scope::EXTERNAL, 0);
            match slots.get(&ext_key) {
                Some(ext_head) => {
                    let (rows, ext_missing) = read_slots(&slots, &backends, &ext_key, ext_head);
                    missing += ext_missing;
                    rows
                }
                None => Vec::new(),
            }
        });
        let service = revnat
            .get(&(addr.family(), head.service_id))
            .map(revnat_name)
            .unwrap_or_default();
        let stats = stats(head.service_id);
        rows.push(ServiceRow {
            service,
            id: head.service_id,
            address: addr.ip.to_string(),
            port: addr.port,
            protocol: addr.protocol.to_string(),
            kind: match head.flags & ff::KIND_MASK {
                ff::KIND_NODE_PORT => "NodePort",
                ff::KIND_LOAD_BALANCER => "LoadBalancer",
                ff::KIND_EXTERNAL_IP => "ExternalIP",
                _ => "ClusterIP",
            },
            local_only: head.flags & ff::LOCAL_ONLY != 0,
            terminating_fallback: head.flags & ff::TERMINATING_FALLBACK != 0,
            affinity_timeout_s: (head.flags & ff::AFFINITY_CLIENT_IP != 0)
                .then_some(head.affinity_timeout_s),
            algorithm: LbAlgorithm::of_flags(head.flags),
            backends: backends_rows,
            external_backends,
            missing_backends: missing,
            packets: stats.packets,
            bytes: stats.bytes,
            new_flows: stats.new_flows,
            drops_no_backend: stats.drops_no_backend,
            source_ranges: (head.flags & ff::SOURCE_RANGES != 0)
                .then(|| blocks.get(&head.service_id).cloned().unwrap_or_default()),
            drops_source_range: denied(head.service_id),
            held: false,
            problems: Vec::new(),
        });
    }
    rows
}

/// The backends in slots `1..=count` of the set whose slot 0 is `head`, and
/// how many slots name no backend (of the frontend's family). A weighted
/// set ([`ff::WEIGHTED`]) lists each backend once, with its share, and
/// then its drained backends (the slots past the count, share 0).
fn read_slots(
    slots: &HashMap<AnyFrontendKey, FrontendSlot>,
    backends: &HashMap<(IpFamily, u32), AnyBackend>,
    key: &AnyFrontendKey,
    head: &FrontendSlot,
) -> (Vec<BackendRow>, usize) {
    let mut rows: Vec<BackendRow> = Vec::new();
    let mut missing = 0;
    let weighted = head.flags & ff::WEIGHTED != 0;
    let drained = (head.backend_count.saturating_add(1)..u16::MAX).map_while(|slot| {
        slots
            .get(&key.at(key.scope(), slot))
            .filter(|v| weighted && v.backend_count == 0)
            .map(|v| (slot, Some(v)))
    });
    let picked = (1..=head.backend_count).map(|slot| (slot, slots.get(&key.at(key.scope(), slot))));
    for (_, value) in picked.chain(drained) {
        let backend = value.and_then(|v| {
            backends
                .get(&(key.family(), v.backend_id))
                .map(|b| (v.backend_id, v.backend_count, b))
        });
        match backend {
            Some((id, _, _)) if weighted && rows.iter().any(|r| r.id == id) => {}
            Some((id, share, b)) => {
                let b = backend_addr(b);
                rows.push(BackendRow {
                    id,
                    address: b.ip.to_string(),
                    port: b.port,
                    weight: weighted.then_some(share),
                });
            }
            None => missing += 1,
        }
    }
    (rows, missing)
}

/// What `switchboard stats` reports.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct StatsReport {
    /// Global counters by name (see `proxy_common::stat`).
    pub counters: BTreeMap<&'static str, u64>,
    pub maps: Vec<MapFill>,
}

/// The counter of packets denied by `loadBalancerSourceRanges`, summed over
/// every service.
pub const DENIED_SOURCE_RANGE: &str = "denied_source_range";

/// How full a map is.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct MapFill {
    pub map: &'static str,
    pub entries: usize,
    pub capacity: u32,
}

pub fn fill(map: &'static str, entries: usize, capacity: u32) -> MapFill {
    MapFill {
        map,
        entries,
        capacity,
    }
}

/// How full a hash map is, by walking its keys.
fn hash_fill<K: aya::Pod, V: aya::Pod>(
    map: &'static str,
    table: &aya::maps::HashMap<aya::maps::MapData, K, V>,
) -> MapFill {
    let capacity = table.map().info().map_or(0, |i| i.max_entries());
    fill(map, table.keys().filter(Result::is_ok).count(), capacity)
}

/// Reads the counters and how full the hash maps are (counting entries walks
/// each map: fine for an on-call look, not for a hot loop).
pub fn read_stats(maps: &PinnedMaps) -> StatsReport {
    let capacity =
        |info: Result<aya::maps::MapInfo, aya::maps::MapError>| info.map_or(0, |i| i.max_entries());
    let mut counters: BTreeMap<&'static str, u64> = maps.global_stats().into_iter().collect();
    // Kept per service (`SB_SVC_DENIED_V1`, see `services`); the total here.
    counters.insert(DENIED_SOURCE_RANGE, maps.denied_by_service().values().sum());
    let blocks = maps.source_range_blocks();
    let v4_blocks = blocks.iter().filter(|(_, b)| b.is_ipv4()).count();
    StatsReport {
        counters,
        maps: vec![
            hash_fill(proxy_common::names::FRONTENDS, &maps.frontends),
            hash_fill(proxy_common::names::FRONTENDS6, &maps.frontends6),
            hash_fill(proxy_common::names::BACKENDS, &maps.backends),
            hash_fill(proxy_common::names::BACKENDS6, &maps.backends6),
            fill(
                proxy_common::names::CONNTRACK,
                maps.conntrack_len(),
                capacity(maps.conntrack.map().info()),
            ),
            fill(
                proxy_common::names::CONNTRACK6,
                maps.conntrack6_len(),
                capacity(maps.conntrack6.map().info()),
            ),
            hash_fill(proxy_common::names::REVNAT, &maps.revnat),
            hash_fill(proxy_common::names::REVNAT6, &maps.revnat6),
            fill(
                proxy_common::names::SOCKETS,
                maps.sockets_len(),
                capacity(maps.sockets.map().info()),
            ),
            fill(
                proxy_common::names::SOCKETS6,
                maps.sockets6_len(),
                capacity(maps.sockets6.map().info()),
            ),
            hash_fill(proxy_common::names::FRAGMENTS, &maps.fragments),
            fill(
                proxy_common::names::SOURCE_RANGES,
                v4_blocks,
                capacity(maps.source_ranges.map().info()),
            ),
            fill(
                proxy_common::names::SOURCE_RANGES6,
                blocks.len() - v4_blocks,
                capacity(maps.source_ranges6.map().info()),
            ),
        ]
        .into_iter()
        .collect(),
    }
}
