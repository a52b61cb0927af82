//! `switchboard explain IP:PORT/PROTO [--from IP[:PORT]]`: what the data
//! path does with one flow, decided from the maps exactly as the kernel
//! programs decide (`proxy-ebpf/src/lb/mod.rs` and
//! `proxy-ebpf/src/nodeport/mod.rs`):
//!
//! 1. the frontend's slot 0 (internal set); traffic from outside to a
//!    frontend under `externalTrafficPolicy: Local` uses the external set;
//! 2. an empty set: rejected (ICMP port unreachable) unless the Service has
//!    endpoints elsewhere (`Local` from outside) or is an
//!    `internalTrafficPolicy: Local` ClusterIP: then dropped;
//! 3. a tracked flow keeps its backend while that backend is live;
//! 4. from outside, Maglev or source hash through the Service's table;
//! 5. `sessionAffinity: ClientIP`: the client's remembered backend while it
//!    is valid;
//! 6. otherwise a slot by the frontend's per-node scheduler (round-robin,
//!    least-conn) or a random one.
use std::{
    collections::HashMap,
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use proxy_common::{
    addr6_be, capacity, ct_dir, ct_flags, frontend_flags as ff, hash, proto, scope, AffinityEntry,
    AffinityKey, AffinityKey6, Backend, Backend6, CtEntry, CtEntry6, CtKey, CtKey6, FrontendKey,
    FrontendKey6, FrontendSlot,
};
use serde::Serialize;

use super::{hooks, Common, Done, Output};
use crate::{
    dataplane::{maps::PinnedMaps, pins::Pins},
    model::{IpFamily, LbAlgorithm},
    observe::status::UnprogrammedService,
    sync::encode::{backend_addr, revnat_name, AnyBackend, AnyFrontendKey},
    sync::store::MapStore as _,
};

/// A flow's destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// Either family.
    pub ip: IpAddr,
    pub port: u16,
    /// IP protocol number.
    pub proto: u8,
}

impl std::fmt::Display for Target {
    /// `10.96.0.10:80/TCP`, `[fd00::10]:80/TCP`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}",
            SocketAddr::new(self.ip, self.port),
            proto_name(self.proto)
        )
    }
}

fn proto_name(number: u8) -> &'static str {
    match number {
        proto::UDP => "UDP",
        proto::TCP => "TCP",
        _ => "?",
    }
}

/// Parses `IP:PORT[/PROTO]` (TCP when the protocol is left out); an IPv6
/// address in brackets: `[fd00::10]:80/UDP`.
pub fn parse_target(s: &str) -> Result<Target, String> {
    let (addr, protocol) = match s.split_once('/') {
        Some((addr, p)) => (addr, p),
        None => (s, "TCP"),
    };
    let proto = match protocol.to_ascii_uppercase().as_str() {
        "TCP" => proto::TCP,
        "UDP" => proto::UDP,
        other => return Err(format!("protocol {other:?}: TCP or UDP")),
    };
    let addr: SocketAddr = addr.parse().map_err(|_| {
        format!("{addr:?} is not ADDRESS:PORT (an IPv6 address in brackets: [fd00::10]:80)")
    })?;
    Ok(Target {
        ip: addr.ip(),
        port: addr.port(),
        proto,
    })
}

/// Parses `IP` or `IP:PORT` (`[IPv6]:PORT`).
pub fn parse_source(s: &str) -> Result<(IpAddr, Option<u16>), String> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok((ip, None));
    }
    let addr: SocketAddr = s.parse().map_err(|_| {
        format!(
            "{s:?} is not ADDRESS or ADDRESS:PORT (IPv6 with a port in brackets: [fd00::1]:4000)"
        )
    })?;
    Ok((addr.ip(), Some(addr.port())))
}

/// Where a flow comes from, as the data path tells it apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// From a pod of this node or the node itself (tc on the pod veths, or
    /// the socket layer).
    Internal,
    /// From outside the node, arriving on an uplink (XDP / tc there).
    External,
}

/// One question for [`explain`].
#[derive(Clone, Debug)]
pub struct Query {
    pub target: Target,
    /// Of the target's family (a flow has one family).
    pub src: Option<(IpAddr, Option<u16>)>,
    pub scope: Scope,
    pub scope_reason: String,
}

/// The map contents `explain` decides from (loaded from the pins, or built
/// by a test).
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Both families' frontend maps.
    pub frontends: HashMap<AnyFrontendKey, FrontendSlot>,
    /// Both families' backend maps (ids are one space).
    pub backends: HashMap<u32, AnyBackend>,
    pub names: HashMap<u32, String>,
    /// Maglev tables by service id.
    pub maglev: HashMap<u32, Vec<u32>>,
    /// IPv4 flows' entries (`SB_CT_V5`).
    pub conntrack: HashMap<CtKey, CtEntry>,
    /// IPv6 flows' entries (`SB_CT6_V1`).
    pub conntrack6: HashMap<CtKey6, CtEntry6>,
    /// IPv4 clients' entries (`SB_AFFINITY_V1`).
    pub affinity: HashMap<AffinityKey, AffinityEntry>,
    /// IPv6 clients' entries (`SB_AFFINITY6_V1`).
    pub affinity6: HashMap<AffinityKey6, AffinityEntry>,
    /// `CLOCK_MONOTONIC` now, in ns (what entries are stamped with).
    pub now_ns: u64,
    /// What the agent could not program (from its status file).
    pub unprogrammed: Vec<UnprogrammedService>,
    /// `loadBalancerSourceRanges` blocks by service id.
    pub source_ranges: HashMap<u32, Vec<crate::model::cidr::IpCidr>>,
}

/// What happens to the flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Rewritten to a backend (named, or one of the set).
    Forwarded,
    /// Dropped (and counted as `drop_no_backend`).
    Dropped,
    /// Answered with ICMP port unreachable from the frontend address.
    Rejected,
    /// Not a frontend: passed on untouched.
    NotHandled,
    /// Its source is outside the frontend's `loadBalancerSourceRanges`:
    /// dropped (a socket of the node gets `EPERM`).
    Denied,
}

/// The answer.
#[derive(Clone, Debug, Serialize)]
pub struct Explanation {
    pub flow: String,
    pub scope: Scope,
    pub scope_reason: String,
    pub service: Option<String>,
    pub service_id: Option<u32>,
    /// ClusterIP, NodePort, LoadBalancer, ExternalIP.
    pub kind: Option<&'static str>,
    /// How the frontend's new flows pick a backend.
    pub algorithm: Option<LbAlgorithm>,
    /// The backend set this flow picks from.
    pub backend_set: Vec<String>,
    pub verdict: Verdict,
    /// The backend the flow gets, when it can be named.
    pub backend: Option<String>,
    /// Why, step by step.
    pub reasons: Vec<String>,
}

pub fn run(
    common: &Common,
    target: Target,
    from: Option<(IpAddr, Option<u16>)>,
    scope: Option<Scope>,
) -> anyhow::Result<Done> {
    if let Some((ip, _)) = from {
        if IpFamily::of(ip) != IpFamily::of(target.ip) {
            anyhow::bail!(
                "--from {ip} and {target} are of different address families: a flow has one"
            );
        }
    }
    let (scope, scope_reason) = match (scope, from) {
        (Some(s), _) => (s, "given with --scope".to_owned()),
        (None, None) => (Scope::Internal, "no --from: a client on this node".to_owned()),
        (None, Some((IpAddr::V6(ip), _))) => (
            Scope::Internal,
            format!("{ip}: IPv6 sources are not looked up among this node's routes; give --scope external for traffic from outside"),
        ),
        (None, Some((IpAddr::V4(ip), _))) => {
            let mut net = super::block_on(async {
                let mut handle = hooks::connect()?;
                hooks::inspect(&mut handle).await
            })??;
            // An uplink may be a veth too; it is never a pod interface.
            let listed = crate::observe::status::read(&common.pin_root).map(|s| s.interfaces).unwrap_or_default();
            for iface in &mut net.interfaces {
                if listed.iter().any(|l| l.index == iface.index && l.role == "uplink") {
                    iface.pod = false;
                }
            }
            classify_source(&net, ip)
        }
    };
    let query = Query {
        target,
        src: from,
        scope,
        scope_reason,
    };
    let maps = super::open_maps(&common.pin_root)?;
    let pins = Pins::new(&common.pin_root);
    let affinity = Affinity {
        v4: pins.affinity().ok(),
        v6: pins.affinity6().ok(),
    };
    let status = crate::observe::status::read(&common.pin_root);
    let view = load_view(
        &maps,
        &affinity,
        &query,
        status.map(|s| s.unprogrammed).unwrap_or_default(),
    );
    let explanation = explain(&view, &query);
    let text = match common.output {
        Output::Json => super::to_json(&explanation)?,
        Output::Table => render(&explanation),
    };
    Ok(Done {
        failed: explanation.verdict != Verdict::Forwarded,
        text,
    })
}

/// The rule `--from` follows: an address of this namespace, or one routed
/// through a pod interface, is internal; anything else arrives on an uplink.
pub fn classify_source(net: &hooks::NetView, ip: Ipv4Addr) -> (Scope, String) {
    if net.addresses.contains(&ip) {
        return (Scope::Internal, format!("{ip} is an address of this node"));
    }
    let Some(route) = hooks::route_to(&net.routes, ip) else {
        return (
            Scope::External,
            format!("no route to {ip}: not a pod of this node"),
        );
    };
    match net.interfaces.iter().find(|i| i.index == route.oif) {
        Some(iface) if iface.pod => (
            Scope::Internal,
            format!("{ip} is routed via pod interface {}", iface.name),
        ),
        Some(iface) => (
            Scope::External,
            format!(
                "{ip} is routed via {} (not a pod interface): it arrives on an uplink",
                iface.name
            ),
        ),
        None => (
            Scope::External,
            format!("{ip} is routed via interface {}", route.oif),
        ),
    }
}

/// The affinity maps (not among [`PinnedMaps`]: only `explain` reads
/// them); `explain` goes on without one that is not pinned.
struct Affinity {
    v4: Option<BpfHashMap<MapData, AffinityKey, AffinityEntry>>,
    v6: Option<BpfHashMap<MapData, AffinityKey6, AffinityEntry>>,
}

/// Reads what [`explain`] needs: every frontend, backend and name, and the
/// flow's own conntrack, affinity and Maglev entries.
fn load_view(
    maps: &PinnedMaps,
    affinity: &Affinity,
    query: &Query,
    unprogrammed: Vec<UnprogrammedService>,
) -> View {
    let dump = maps.dump();
    let mut source_ranges: HashMap<u32, Vec<crate::model::cidr::IpCidr>> = HashMap::new();
    for (id, block) in &dump.source_ranges {
        source_ranges.entry(*id).or_default().push(*block);
    }
    let mut view = View {
        source_ranges,
        frontends: dump.frontends.into_iter().collect(),
        backends: dump.backends.into_iter().collect(),
        names: dump
            .revnat
            .iter()
            .map(|(id, r)| (*id, revnat_name(r)))
            .collect(),
        now_ns: super::monotonic_ns(),
        unprogrammed,
        ..View::default()
    };
    let Some(head) = view
        .frontends
        .get(&head_key(&query.target, scope::INTERNAL))
        .copied()
    else {
        return view;
    };
    if let Some(key) = ct_key(query) {
        if let Ok(entry) = maps.conntrack.get(&key, 0) {
            view.conntrack.insert(key, entry);
        }
    }
    if let Some(key) = ct_key6(query) {
        if let Ok(entry) = maps.conntrack6.get(&key, 0) {
            view.conntrack6.insert(key, entry);
        }
    }
    if let Ok(table) = maps.maglev.get(&head.service_id, 0) {
        view.maglev
            .insert(head.service_id, table.backend_ids.to_vec());
    }
    match query.src {
        Some((IpAddr::V4(ip), _)) => {
            let key = affinity_key(ip, head.service_id);
            if let Some(entry) = affinity.v4.as_ref().and_then(|m| m.get(&key, 0).ok()) {
                view.affinity.insert(key, entry);
            }
        }
        Some((IpAddr::V6(ip), _)) => {
            let key = affinity_key6(ip, head.service_id);
            if let Some(entry) = affinity.v6.as_ref().and_then(|m| m.get(&key, 0).ok()) {
                view.affinity6.insert(key, entry);
            }
        }
        None => {}
    }
    view
}

fn affinity_key(ip: Ipv4Addr, service_id: u32) -> AffinityKey {
    AffinityKey {
        client_addr_be: u32::from_ne_bytes(ip.octets()),
        service_id,
    }
}

fn affinity_key6(ip: std::net::Ipv6Addr, service_id: u32) -> AffinityKey6 {
    AffinityKey6 {
        client_addr_be: addr6_be(ip.octets()),
        service_id,
    }
}

/// Slot 0 of the target's set `set`, in its family's map.
fn head_key(target: &Target, set: u8) -> AnyFrontendKey {
    let port_be = target.port.to_be();
    match target.ip {
        IpAddr::V4(ip) => AnyFrontendKey::V4(FrontendKey {
            addr_be: u32::from_ne_bytes(ip.octets()),
            port_be,
            proto: target.proto,
            scope: set,
            slot: 0,
            _pad1: [0; 2],
        }),
        IpAddr::V6(ip) => AnyFrontendKey::V6(FrontendKey6 {
            addr_be: addr6_be(ip.octets()),
            port_be,
            proto: target.proto,
            scope: set,
            slot: 0,
            _pad1: [0; 2],
        }),
    }
}

/// The flow's IPv4 addresses, for the IPv4 tables (conntrack, affinity,
/// the flow hash).
fn v4_flow(query: &Query) -> Option<(Ipv4Addr, Ipv4Addr, Option<u16>)> {
    match (query.src?, query.target.ip) {
        ((IpAddr::V4(src), port), IpAddr::V4(dst)) => Some((src, dst, port)),
        _ => None,
    }
}

/// The forward conntrack key of an IPv4 flow, when the source port is known.
fn ct_key(query: &Query) -> Option<CtKey> {
    let (ip, daddr, Some(port)) = v4_flow(query)? else {
        return None;
    };
    Some(CtKey {
        saddr_be: u32::from_ne_bytes(ip.octets()),
        daddr_be: u32::from_ne_bytes(daddr.octets()),
        sport_be: port.to_be(),
        dport_be: query.target.port.to_be(),
        proto: query.target.proto,
        dir: ct_dir::FORWARD,
        _pad: [0; 2],
    })
}

/// The forward conntrack key of an IPv6 flow, when the source port is known.
fn ct_key6(query: &Query) -> Option<CtKey6> {
    let ((IpAddr::V6(src), Some(port)), IpAddr::V6(dst)) = (query.src?, query.target.ip) else {
        return None;
    };
    Some(CtKey6 {
        saddr_be: addr6_be(src.octets()),
        daddr_be: addr6_be(dst.octets()),
        sport_be: port.to_be(),
        dport_be: query.target.port.to_be(),
        proto: query.target.proto,
        dir: ct_dir::FORWARD,
        _pad: [0; 2],
    })
}

/// A flow's conntrack entry, of either family, in the terms `explain` uses.
struct Tracked {
    backend_id: u32,
    service_id: u32,
    /// Where the flow is sent (the backend's address and port).
    nat: AnyBackend,
    /// The source it is NATed to (meaningful with `ct_flags::SNAT`).
    snat: AnyBackend,
    flags: u8,
    created_ns: u64,
}

/// The flow's entry from its family's table: `None` when the source port is
/// not known (no key), `Some(None)` when there is no entry.
fn tracked_entry(view: &View, query: &Query) -> Option<Option<Tracked>> {
    let proto = query.target.proto;
    if let Some(key) = ct_key(query) {
        return Some(view.conntrack.get(&key).map(|c| Tracked {
            backend_id: c.backend_id,
            service_id: c.service_id,
            nat: AnyBackend::V4(Backend {
                addr_be: c.nat_addr_be,
                port_be: c.nat_port_be,
                proto,
                flags: 0,
            }),
            snat: AnyBackend::V4(Backend {
                addr_be: c.snat_addr_be,
                port_be: c.snat_port_be,
                proto,
                flags: 0,
            }),
            flags: c.flags,
            created_ns: c.created_ns,
        }));
    }
    let key = ct_key6(query)?;
    Some(view.conntrack6.get(&key).map(|c| Tracked {
        backend_id: c.backend_id,
        service_id: c.service_id,
        nat: AnyBackend::V6(Backend6 {
            addr_be: c.nat_addr_be,
            port_be: c.nat_port_be,
            proto,
            flags: 0,
        }),
        snat: AnyBackend::V6(Backend6 {
            addr_be: c.snat_addr_be,
            port_be: c.snat_port_be,
            proto,
            flags: 0,
        }),
        flags: c.flags,
        created_ns: c.created_ns,
    }))
}

fn kind_name(flags: u16) -> &'static str {
    match flags & ff::KIND_MASK {
        ff::KIND_NODE_PORT => "NodePort",
        ff::KIND_LOAD_BALANCER => "LoadBalancer",
        ff::KIND_EXTERNAL_IP => "ExternalIP",
        _ => "ClusterIP",
    }
}

fn addr_of(backend: &impl crate::sync::encode::BackendLike) -> String {
    backend_addr(backend).to_string()
}

/// Decides what happens to the flow, as the kernel would.
pub fn explain(view: &View, query: &Query) -> Explanation {
    let target = &query.target;
    let flow = match query.src {
        Some((ip, Some(port))) => format!("{} -> {target}", SocketAddr::new(ip, port)),
        Some((ip, None)) => format!("{ip} -> {target}"),
        None => format!("-> {target}"),
    };
    let mut e = Explanation {
        flow,
        scope: query.scope,
        scope_reason: query.scope_reason.clone(),
        service: None,
        service_id: None,
        kind: None,
        algorithm: None,
        backend_set: Vec::new(),
        verdict: Verdict::NotHandled,
        backend: None,
        reasons: Vec::new(),
    };
    let Some(head) = view
        .frontends
        .get(&head_key(target, scope::INTERNAL))
        .copied()
    else {
        e.reasons = no_frontend(view, target);
        return e;
    };
    e.service = Some(
        view.names
            .get(&head.service_id)
            .cloned()
            .unwrap_or_default(),
    );
    e.service_id = Some(head.service_id);
    e.kind = Some(kind_name(head.flags));
    e.algorithm = Some(LbAlgorithm::of_flags(head.flags));
    e.reasons.push(format!(
        "frontend {target} is {} {} of Service {} (id {})",
        a_or_an(kind_name(head.flags)),
        kind_name(head.flags),
        e.service.as_deref().unwrap_or("?"),
        head.service_id
    ));
    if head.flags & ff::SOURCE_RANGES != 0 && !source_allowed(view, &head, query, &mut e) {
        return e;
    }
    let (set_key, set) = backend_set(view, target, &head, query.scope, &mut e.reasons);
    if query.scope == Scope::External
        && head.flags & ff::DIRECT_RETURN != 0
        && !ff::has_external_set(head.flags)
    {
        e.reasons.push("direct server return (--nodeport-mode dsr): a backend on another node sees the client's own address, and its node answers the client from this frontend (the reply does not come back through this node)".into());
    }
    if head.flags & ff::TERMINATING_FALLBACK != 0 {
        e.reasons.push("no endpoint is ready: the set holds serving, terminating endpoints (kube-proxy's fallback)".into());
    }
    let slots = slot_backends(view, &set_key, &set);
    e.backend_set = Vec::new();
    for addr in slots.iter().map(|(_, _, b)| addr_of(b)) {
        // A weighted set names a backend in several slots.
        if !e.backend_set.contains(&addr) {
            e.backend_set.push(addr);
        }
    }
    if set.flags & ff::WEIGHTED != 0 {
        e.reasons.push(weights_reason(view, &set_key, &set));
    }
    if set.backend_count == 0 {
        empty_set(&mut e, &head, query.scope);
        return e;
    }
    e.verdict = Verdict::Forwarded;
    if tracked(view, query, &set, &mut e) {
        return e;
    }
    if query.scope == Scope::External && hashed(view, query, &set, &mut e) {
        return e;
    }
    if set.flags & ff::AFFINITY_CLIENT_IP != 0 && affinity(view, query, &set_key, &set, &mut e) {
        return e;
    }
    // A weighted least-connection set holds each backend once and weighs
    // them in the comparison; the others repeat them by weight.
    let least_conn = LbAlgorithm::of_flags(head.flags) == LbAlgorithm::LeastConn;
    let (of, load) = match (set.flags & ff::WEIGHTED != 0, least_conn) {
        (true, true) => (
            format!("{} backends", set.backend_count),
            "fewer open flows per unit of weight",
        ),
        (true, false) => (
            format!("{} weighted slots", set.backend_count),
            "fewer open flows",
        ),
        (false, _) => (
            format!("{} backends", set.backend_count),
            "fewer open flows",
        ),
    };
    e.reasons.push(match LbAlgorithm::of_flags(head.flags) {
        LbAlgorithm::RoundRobin => format!(
            "round-robin: each new flow takes the next of the {of} in turn (one turn counter per Service port on this node, shared by its CPUs)"
        ),
        LbAlgorithm::LeastConn => format!(
            "least-conn: each new flow picks two of the {of} at random and takes the one with {load} on this node"
        ),
        _ => format!("the first packet of each new flow picks one of the {of} at random"),
    });
    if query.scope == Scope::Internal {
        e.reasons.push("sockets in the node's own namespace are balanced at connect()/sendmsg() by the socket layer, the same way".into());
    }
    e
}

/// `loadBalancerSourceRanges`, decided as the data path decides: the
/// client's address against the frontend's blocks (longest match), or,
/// without `--from` (a socket of the node, which the socket layer judges
/// before the kernel picks its source), whether a block holds a node
/// address. Adds the reason; `false`: denied (the verdict is set).
fn source_allowed(view: &View, head: &FrontendSlot, query: &Query, e: &mut Explanation) -> bool {
    let blocks = view
        .source_ranges
        .get(&head.service_id)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let list = match blocks.is_empty() {
        true => "no block".to_owned(),
        false => blocks
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    };
    let allowed = match query.src {
        Some((ip, _)) => match blocks
            .iter()
            .filter(|b| b.contains(ip))
            .max_by_key(|b| b.prefix_len())
        {
            Some(block) => {
                e.reasons.push(format!(
                    "loadBalancerSourceRanges allow {ip}: it is inside {block}"
                ));
                true
            }
            None => {
                e.reasons.push(format!(
                    "denied by loadBalancerSourceRanges: {ip} is outside {list}; the packet is dropped and counted per Service (source_range_drops)"
                ));
                false
            }
        },
        None if head.flags & ff::SOURCE_RANGES_NODE != 0 => {
            e.reasons.push(format!(
                "loadBalancerSourceRanges ({list}) hold a node address: this node's sockets may connect"
            ));
            true
        }
        None => {
            e.reasons.push(format!(
                "denied by loadBalancerSourceRanges: no block of {list} holds a node address, so this node's sockets get EPERM (give --from IP for a pod or an outside client)"
            ));
            false
        }
    };
    if !allowed {
        e.verdict = Verdict::Denied;
    }
    allowed
}

fn a_or_an(word: &str) -> &'static str {
    if word.starts_with(['E', 'A', 'I', 'O', 'U']) {
        "an"
    } else {
        "a"
    }
}

/// Why no frontend matches.
fn no_frontend(view: &View, target: &Target) -> Vec<String> {
    let mut others: Vec<(u16, u8)> = view
        .frontends
        .keys()
        .filter(|k| k.ip() == target.ip && k.slot() == 0 && k.scope() == scope::INTERNAL)
        .map(|k| (k.port(), k.proto()))
        .collect();
    others.sort_unstable();
    let mut reasons = Vec::new();
    let listed = || {
        others
            .iter()
            .map(|(p, pr)| format!("{p}/{}", proto_name(*pr)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if others.iter().any(|(p, _)| *p == target.port) {
        reasons.push(format!(
            "{} is a frontend over another protocol only ({}), not {}",
            SocketAddr::new(target.ip, target.port),
            listed(),
            proto_name(target.proto)
        ));
    } else if !others.is_empty() {
        reasons.push(format!(
            "{} is a Service address, but not on port {}/{} (it serves {})",
            target.ip,
            target.port,
            proto_name(target.proto),
            listed()
        ));
    } else {
        reasons.push(format!(
            "no frontend at {}: it is not a ClusterIP, NodePort address, LoadBalancer IP or external IP switchboard programmed",
            target.ip
        ));
    }
    let wanted = target.to_string();
    for u in view.unprogrammed.iter().filter(|u| u.frontend == wanted) {
        reasons.push(format!(
            "the agent could not program {} for {}: {}",
            u.frontend, u.service, u.reason
        ));
    }
    reasons
        .push("the packet is not switchboard's: it goes on untouched, routed as addressed".into());
    reasons
}

/// The backend set the flow picks from: the external (local) one for
/// traffic from outside under `externalTrafficPolicy: Local`, else the
/// frontend's own.
fn backend_set(
    view: &View,
    target: &Target,
    head: &FrontendSlot,
    from: Scope,
    reasons: &mut Vec<String>,
) -> (AnyFrontendKey, FrontendSlot) {
    let internal = (head_key(target, scope::INTERNAL), *head);
    let local = head.flags & ff::LOCAL_ONLY != 0;
    match (from, ff::has_external_set(head.flags)) {
        (Scope::External, true) => {
            let key = head_key(target, scope::EXTERNAL);
            let set = view.frontends.get(&key).copied().unwrap_or(FrontendSlot {
                backend_count: 0,
                ..*head
            });
            reasons.push(format!(
                "externalTrafficPolicy: Local: traffic from outside gets this node's endpoints only ({} of {}), and keeps its source address",
                set.backend_count, head.backend_count
            ));
            (key, set)
        }
        (Scope::Internal, true) => {
            reasons.push("externalTrafficPolicy: Local applies to traffic from outside only; from pods and this node every endpoint serves".into());
            internal
        }
        (_, false) if local => {
            reasons.push("internalTrafficPolicy: Local: only this node's endpoints".into());
            internal
        }
        _ => internal,
    }
}

/// Slots `1..=count` of a set: (slot, backend id, backend), skipping slots
/// that name no backend of the frontend's family.
fn slot_backends(
    view: &View,
    key: &AnyFrontendKey,
    set: &FrontendSlot,
) -> Vec<(u16, u32, AnyBackend)> {
    (1..=set.backend_count)
        .filter_map(|slot| {
            let id = view.frontends.get(&key.at(key.scope(), slot))?.backend_id;
            let backend = view
                .backends
                .get(&id)
                .filter(|b| b.family() == key.family())?;
            Some((slot, id, *backend))
        })
        .collect()
}

/// A weighted set's weights as its slots record them: each backend's share
/// of the slots new flows pick from, and its drained backends (the slots
/// past the count).
fn weights_reason(view: &View, key: &AnyFrontendKey, set: &FrontendSlot) -> String {
    let mut shares: Vec<(String, u16)> = Vec::new();
    for (slot, _, backend) in slot_backends(view, key, set) {
        let share = view
            .frontends
            .get(&key.at(key.scope(), slot))
            .map_or(0, |v| v.backend_count);
        let addr = addr_of(&backend);
        if !shares.iter().any(|(a, _)| *a == addr) {
            shares.push((addr, share));
        }
    }
    let drained: Vec<String> = (set.backend_count.saturating_add(1)..u16::MAX)
        .map_while(|slot| {
            let v = view
                .frontends
                .get(&key.at(key.scope(), slot))
                .filter(|v| v.backend_count == 0)?;
            let backend = view.backends.get(&v.backend_id)?;
            Some(addr_of(backend))
        })
        .collect();
    let mut text = format!(
        "weights (switchboard.io/weights): {}",
        shares
            .iter()
            .map(|(a, w)| format!("{a} weight {w}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !drained.is_empty() {
        text.push_str(&format!(
            "; drained (weight 0: no new flows, open ones keep their backend): {}",
            drained.join(", ")
        ));
    }
    text
}

/// An empty set: rejected, or dropped under a `Local` policy.
fn empty_set(e: &mut Explanation, head: &FrontendSlot, from: Scope) {
    let local_clusterip =
        head.flags & ff::LOCAL_ONLY != 0 && head.flags & ff::KIND_MASK == ff::KIND_CLUSTER_IP;
    if from == Scope::External && ff::has_external_set(head.flags) && head.backend_count > 0 {
        e.verdict = Verdict::Dropped;
        e.reasons.push("no endpoint of the Service runs on this node: traffic from outside is dropped (not rejected), as kube-proxy does; send it to a node that runs one, or use externalTrafficPolicy: Cluster".into());
    } else if local_clusterip {
        e.verdict = Verdict::Dropped;
        e.reasons.push("internalTrafficPolicy: Local and no endpoint on this node: dropped, as kube-proxy does".into());
    } else {
        e.verdict = Verdict::Rejected;
        e.reasons.push("the Service has no endpoints: answered with ICMP port unreachable (the client sees \"connection refused\"), as kube-proxy's REJECT; check its EndpointSlices and its Pods' readiness".into());
    }
}

/// A tracked flow whose backend is live keeps it.
fn tracked(view: &View, query: &Query, set: &FrontendSlot, e: &mut Explanation) -> bool {
    let Some(entry) = tracked_entry(view, query) else {
        return false;
    };
    let Some(entry) = entry.filter(|c| c.service_id == set.service_id) else {
        e.reasons
            .push("no connection-tracking entry for this exact flow".into());
        return false;
    };
    let age = view.now_ns.saturating_sub(entry.created_ns) as f64 / 1e9;
    let nat = addr_of(&entry.nat);
    // Live: the id still names a backend at the address the flow was sent to
    // (of the flow's family).
    let live = view
        .backends
        .get(&entry.backend_id)
        .is_some_and(|b| b.family() == entry.nat.family() && addr_of(b) == nat);
    if !live {
        e.reasons.push(format!(
            "tracked flow to {nat} (backend id {}), which has left: an open TCP connection drains to it; a new connection or UDP datagram picks anew",
            entry.backend_id
        ));
        return false;
    }
    let mut line = format!(
        "tracked flow (entry {:.0}s old): keeps backend {nat} (id {})",
        age, entry.backend_id
    );
    if entry.flags & ct_flags::CLOSING != 0 {
        line.push_str("; the connection is closing, so a new SYN from this port picks anew");
    }
    if entry.flags & ct_flags::SNAT != 0 {
        let snat = addr_of(&entry.snat);
        line.push_str(&format!(
            "; source NATed to {snat} (backend on another node)"
        ));
    }
    if entry.flags & ct_flags::DSR_BALANCED != 0 {
        line.push_str("; returned directly: the backend's node answers the client");
    }
    e.reasons.push(line);
    e.backend = Some(nat);
    true
}

/// Maglev or source hash, computed as the uplink programs do
/// (`proxy-ebpf/src/nodeport/uplink.rs`: [`hash::flow_hash`] /
/// [`hash::source_hash`], and for IPv6 [`hash::flow_hash6`] /
/// [`hash::source_hash6`]).
fn hashed(view: &View, query: &Query, set: &FrontendSlot, e: &mut Explanation) -> bool {
    let algorithm = set.flags & ff::ALGO_MASK;
    let t = &query.target;
    let family = IpFamily::of(t.ip);
    // A source of the other family never reaches this frontend's program.
    let src = query.src.filter(|(ip, _)| IpFamily::of(*ip) == family);
    let hash = match (algorithm, src, t.ip) {
        (ff::ALGO_MAGLEV, Some((IpAddr::V4(ip), Some(port))), IpAddr::V4(daddr)) => {
            hash::flow_hash(
                u32::from_ne_bytes(ip.octets()),
                u32::from_ne_bytes(daddr.octets()),
                port.to_be(),
                t.port.to_be(),
                t.proto,
            )
        }
        (ff::ALGO_MAGLEV, Some((IpAddr::V6(ip), Some(port))), IpAddr::V6(daddr)) => {
            hash::flow_hash6(
                &addr6_be(ip.octets()),
                &addr6_be(daddr.octets()),
                port.to_be(),
                t.port.to_be(),
                t.proto,
            )
        }
        (ff::ALGO_MAGLEV, _, _) => {
            e.reasons.push("Maglev over the 5-tuple: the backend depends on the source port; give --from IP:PORT to name it".into());
            return true;
        }
        (ff::ALGO_SOURCE_HASH, Some((IpAddr::V4(ip), _)), _) => {
            hash::source_hash(u32::from_ne_bytes(ip.octets()))
        }
        (ff::ALGO_SOURCE_HASH, Some((IpAddr::V6(ip), _)), _) => {
            hash::source_hash6(&addr6_be(ip.octets()))
        }
        (ff::ALGO_SOURCE_HASH, None, _) => {
            e.reasons.push(
                "source hash: the backend depends on the client address; give --from IP".into(),
            );
            return true;
        }
        _ => return false,
    };
    let name = if algorithm == ff::ALGO_MAGLEV {
        "Maglev (5-tuple)"
    } else {
        "source hash"
    };
    let Some(table) = view.maglev.get(&set.service_id) else {
        e.reasons.push(format!(
            "{name} is configured but the Service has no Maglev table: falls back to a random pick"
        ));
        return false;
    };
    let index = (hash % capacity::MAGLEV_TABLE) as usize;
    let id = table.get(index).copied().unwrap_or(0);
    match view.backends.get(&id).filter(|b| b.family() == family) {
        Some(b) => {
            e.reasons.push(format!(
                "{name}: hash {hash:#010x} -> table entry {index} of {} -> backend id {id} = {}",
                capacity::MAGLEV_TABLE,
                addr_of(b)
            ));
            e.backend = Some(addr_of(b));
            true
        }
        None => {
            e.reasons.push(format!("{name}: table entry {index} names backend id {id}, which is gone: falls back to a random pick"));
            false
        }
    }
}

/// Session affinity, validated as the kernel's `lb` module validates it.
fn affinity(
    view: &View,
    query: &Query,
    key: &AnyFrontendKey,
    set: &FrontendSlot,
    e: &mut Explanation,
) -> bool {
    let timeout = set.affinity_timeout_s;
    let fallback = format!(
        "sessionAffinity: ClientIP ({timeout}s): the client's first new flow picks at random among {}, later ones stick to that backend",
        set.backend_count
    );
    // The client's entry in its family's table (a flow has one family).
    let (ip, entry) = match (query.src, query.target.ip) {
        (Some((IpAddr::V4(ip), _)), IpAddr::V4(_)) => (
            IpAddr::V4(ip),
            view.affinity.get(&affinity_key(ip, set.service_id)),
        ),
        (Some((IpAddr::V6(ip), _)), IpAddr::V6(_)) => (
            IpAddr::V6(ip),
            view.affinity6.get(&affinity_key6(ip, set.service_id)),
        ),
        _ => {
            // No client named: nothing to look up.
            e.reasons.push(fallback);
            return true;
        }
    };
    let valid = entry.and_then(|entry| {
        let idle_ns = view.now_ns.wrapping_sub(entry.last_used_ns);
        if idle_ns > u64::from(timeout) * 1_000_000_000
            || entry.slot == 0
            || entry.slot > set.backend_count
        {
            return None;
        }
        let slot = view.frontends.get(&key.at(key.scope(), entry.slot))?;
        (slot.backend_id == entry.backend_id).then_some(())?;
        Some((view.backends.get(&entry.backend_id)?, idle_ns))
    });
    match valid {
        Some((b, idle_ns)) => {
            let idle = idle_ns as f64 / 1e9;
            e.reasons.push(format!(
                "sessionAffinity: ClientIP: {ip}'s last new flow went to {} {idle:.0}s ago; it sticks for {:.0}s more",
                addr_of(b),
                f64::from(timeout) - idle
            ));
            e.backend = Some(addr_of(b));
        }
        None => e.reasons.push(fallback),
    }
    true
}

pub fn render(e: &Explanation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Flow:      {}", e.flow);
    let _ = writeln!(
        out,
        "From:      {} ({})",
        match e.scope {
            Scope::Internal => "inside the node",
            Scope::External => "outside the node",
        },
        e.scope_reason
    );
    if let (Some(service), Some(kind)) = (&e.service, e.kind) {
        let _ = writeln!(
            out,
            "Service:   {service} ({kind}, id {})",
            e.service_id.unwrap_or(0)
        );
        if let Some(algorithm) = e.algorithm {
            let _ = writeln!(out, "Algorithm: {}", algorithm.as_str());
        }
        let set = if e.backend_set.is_empty() {
            "(none)".to_owned()
        } else {
            e.backend_set.join(", ")
        };
        let _ = writeln!(out, "Backends:  {set}");
    }
    let verdict = match (e.verdict, &e.backend) {
        (Verdict::Forwarded, Some(b)) => format!("forwarded to {b}"),
        (Verdict::Forwarded, None) => "forwarded to one of the backends".to_owned(),
        (Verdict::Dropped, _) => "DROPPED".to_owned(),
        (Verdict::Rejected, _) => "REJECTED (ICMP port unreachable)".to_owned(),
        (Verdict::NotHandled, _) => "NOT HANDLED (no frontend)".to_owned(),
        (Verdict::Denied, _) => "DENIED by loadBalancerSourceRanges (dropped)".to_owned(),
    };
    let _ = writeln!(out, "Verdict:   {verdict}");
    let _ = writeln!(out, "Why:");
    for (i, r) in e.reasons.iter().enumerate() {
        let _ = writeln!(out, "  {}. {r}", i + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: u32 = 7;

    fn target(s: &str) -> Target {
        parse_target(s).expect("target")
    }

    fn be(ip: [u8; 4], port: u16) -> Backend {
        Backend {
            addr_be: u32::from_ne_bytes(ip),
            port_be: port.to_be(),
            proto: proto::TCP,
            flags: 0,
        }
    }

    /// A view with frontend `t` holding backends ids 1..=n (10.244.i.2:8080)
    /// and `flags`.
    fn view(t: &Target, n: u16, flags: u16) -> View {
        let mut v = View::default();
        let key = head_key(t, scope::INTERNAL);
        v.frontends.insert(
            key,
            FrontendSlot {
                service_id: SVC,
                backend_count: n,
                flags,
                affinity_timeout_s: 60,
                ..FrontendSlot::default()
            },
        );
        for i in 1..=n {
            v.frontends.insert(
                key.at(scope::INTERNAL, i),
                FrontendSlot {
                    backend_id: u32::from(i),
                    service_id: SVC,
                    ..FrontendSlot::default()
                },
            );
            v.backends
                .insert(u32::from(i), be([10, 244, i as u8, 2], 8080).into());
        }
        v.names.insert(SVC, "demo/echo:http".into());
        v.now_ns = 100_000_000_000;
        v
    }

    fn query(t: Target, src: Option<(Ipv4Addr, Option<u16>)>, scope: Scope) -> Query {
        Query {
            target: t,
            src: src.map(|(ip, port)| (IpAddr::V4(ip), port)),
            scope,
            scope_reason: "test".into(),
        }
    }

    #[test]
    fn load_balancer_source_ranges_deny_outside_sources_and_the_node_without_a_node_block() {
        let t = target("198.51.100.7:443/TCP");
        let mut v = view(&t, 2, ff::KIND_LOAD_BALANCER | ff::SOURCE_RANGES);
        let block: crate::model::cidr::IpCidr = "10.0.0.0/8".parse().expect("cidr");
        v.source_ranges.insert(SVC, vec![block]);
        let inside = explain(
            &v,
            &query(t, Some((Ipv4Addr::new(10, 1, 2, 3), None)), Scope::External),
        );
        assert_eq!(inside.verdict, Verdict::Forwarded);
        assert!(
            inside
                .reasons
                .iter()
                .any(|r| r.contains("inside 10.0.0.0/8")),
            "{inside:?}"
        );
        let outside = explain(
            &v,
            &query(
                t,
                Some((Ipv4Addr::new(192, 0, 2, 1), None)),
                Scope::External,
            ),
        );
        assert_eq!(outside.verdict, Verdict::Denied);
        assert!(
            render(&outside).contains("denied by loadBalancerSourceRanges"),
            "{}",
            render(&outside)
        );
        let node = explain(&v, &query(t, None, Scope::Internal));
        assert_eq!(
            node.verdict,
            Verdict::Denied,
            "no block holds a node address"
        );
        for slot in v.frontends.values_mut().filter(|s| s.backend_id == 0) {
            slot.flags |= ff::SOURCE_RANGES_NODE;
        }
        let node = explain(&v, &query(t, None, Scope::Internal));
        assert_eq!(node.verdict, Verdict::Forwarded);
    }

    #[test]
    fn parses_targets_and_sources() {
        assert_eq!(
            parse_target("10.96.0.10:53/udp"),
            Ok(Target {
                ip: Ipv4Addr::new(10, 96, 0, 10).into(),
                port: 53,
                proto: proto::UDP
            })
        );
        assert_eq!(target("10.96.0.10:80").proto, proto::TCP);
        assert!(parse_target("10.96.0.10:80/SCTP").is_err());
        assert!(parse_target("10.96.0.10").is_err());
        assert_eq!(
            parse_source("10.0.0.1"),
            Ok((Ipv4Addr::new(10, 0, 0, 1).into(), None))
        );
        assert_eq!(
            parse_source("10.0.0.1:4000"),
            Ok((Ipv4Addr::new(10, 0, 0, 1).into(), Some(4000)))
        );
        assert!(parse_source("x").is_err());
    }

    #[test]
    fn no_frontend_other_port_and_other_protocol_are_told_apart() {
        let t = target("10.96.0.10:80/TCP");
        let v = view(&t, 2, 0);
        let e = explain(&v, &query(target("10.96.0.99:80"), None, Scope::Internal));
        assert_eq!(e.verdict, Verdict::NotHandled);
        assert!(
            e.reasons[0].contains("no frontend at 10.96.0.99"),
            "{:?}",
            e.reasons
        );
        let e = explain(&v, &query(target("10.96.0.10:81"), None, Scope::Internal));
        assert!(
            e.reasons[0].contains("not on port 81/TCP (it serves 80/TCP)"),
            "{:?}",
            e.reasons
        );
        let e = explain(
            &v,
            &query(target("10.96.0.10:80/UDP"), None, Scope::Internal),
        );
        assert!(
            e.reasons[0].contains("another protocol only (80/TCP), not UDP"),
            "{:?}",
            e.reasons
        );
        let mut v = v;
        v.unprogrammed.push(UnprogrammedService {
            service: "demo/big:http".into(),
            frontend: "10.96.0.99:80/TCP".into(),
            reason: "frontend map full".into(),
        });
        let e = explain(&v, &query(target("10.96.0.99:80"), None, Scope::Internal));
        assert!(
            e.reasons[1].contains("frontend map full"),
            "{:?}",
            e.reasons
        );
    }

    #[test]
    fn empty_sets_are_rejected_or_dropped_as_the_kernel_does() {
        let t = target("10.96.0.10:80");
        let e = explain(&view(&t, 0, 0), &query(t, None, Scope::Internal));
        assert_eq!(e.verdict, Verdict::Rejected);
        let local_cip = ff::LOCAL_ONLY | ff::KIND_CLUSTER_IP;
        let e = explain(&view(&t, 0, local_cip), &query(t, None, Scope::Internal));
        assert_eq!(e.verdict, Verdict::Dropped);
        // externalTrafficPolicy: Local, endpoints elsewhere only.
        let flags = ff::LOCAL_ONLY | ff::KIND_NODE_PORT;
        let mut v = view(&t, 2, flags);
        v.frontends.insert(
            head_key(&t, scope::EXTERNAL),
            FrontendSlot {
                service_id: SVC,
                backend_count: 0,
                flags,
                ..FrontendSlot::default()
            },
        );
        let outside = query(
            t,
            Some((Ipv4Addr::new(192, 0, 2, 9), Some(5000))),
            Scope::External,
        );
        let e = explain(&v, &outside);
        assert_eq!(e.verdict, Verdict::Dropped);
        assert!(
            e.reasons
                .iter()
                .any(|r| r.contains("no endpoint of the Service runs on this node")),
            "{:?}",
            e.reasons
        );
        let e = explain(&v, &query(t, None, Scope::Internal));
        assert_eq!(e.verdict, Verdict::Forwarded);
        assert_eq!(e.backend_set.len(), 2);
    }

    #[test]
    fn direct_return_is_explained_for_traffic_from_outside_only() {
        let t = target("203.0.113.10:80");
        let v = view(&t, 2, ff::KIND_LOAD_BALANCER | ff::DIRECT_RETURN);
        let said = |scope| {
            let src = Some((Ipv4Addr::new(192, 0, 2, 9), Some(5000)));
            explain(&v, &query(t, src, scope))
                .reasons
                .iter()
                .any(|r| r.starts_with("direct server return"))
        };
        assert!(said(Scope::External));
        assert!(!said(Scope::Internal));
    }

    #[test]
    fn maglev_and_source_hash_name_the_backend_the_table_gives() {
        let t = target("203.0.113.10:80");
        let src = Ipv4Addr::new(192, 0, 2, 9);
        let mut v = view(&t, 3, ff::ALGO_MAGLEV | ff::KIND_LOAD_BALANCER);
        let table: Vec<u32> = (0..capacity::MAGLEV_TABLE).map(|i| i % 3 + 1).collect();
        v.maglev.insert(SVC, table);
        let hash = hash::flow_hash(
            u32::from_ne_bytes(src.octets()),
            u32::from_ne_bytes([203, 0, 113, 10]),
            40000u16.to_be(),
            80u16.to_be(),
            proto::TCP,
        );
        let expected_id = (hash % capacity::MAGLEV_TABLE) % 3 + 1;
        let e = explain(&v, &query(t, Some((src, Some(40000))), Scope::External));
        assert_eq!(
            e.backend,
            Some(format!("10.244.{expected_id}.2:8080")),
            "{:?}",
            e.reasons
        );
        // Without the source port the pick cannot be named.
        let e = explain(&v, &query(t, Some((src, None)), Scope::External));
        assert_eq!((e.verdict, e.backend), (Verdict::Forwarded, None));
        // From inside the node the pick is random whatever the algorithm.
        let e = explain(&v, &query(t, Some((src, Some(40000))), Scope::Internal));
        assert!(
            e.backend.is_none() && e.reasons.last().is_some_and(|r| r.contains("socket layer"))
        );
        // Source hash: the client address alone.
        if let Some(head) = v.frontends.get_mut(&head_key(&t, scope::INTERNAL)) {
            head.flags = ff::ALGO_SOURCE_HASH | ff::KIND_LOAD_BALANCER;
        }
        let id =
            (hash::source_hash(u32::from_ne_bytes(src.octets())) % capacity::MAGLEV_TABLE) % 3 + 1;
        let e = explain(&v, &query(t, Some((src, None)), Scope::External));
        assert_eq!(e.backend, Some(format!("10.244.{id}.2:8080")));
    }

    #[test]
    fn the_per_node_schedulers_are_named_and_explained() {
        let t = target("10.96.0.10:80");
        let src = Ipv4Addr::new(10, 244, 9, 9);
        for (flags, name, how) in [
            (ff::PICK_ROUND_ROBIN, "round-robin", "in turn"),
            (ff::PICK_LEAST_CONN, "least-conn", "fewer open flows"),
        ] {
            let v = view(&t, 3, flags | ff::KIND_LOAD_BALANCER);
            for scope in [Scope::Internal, Scope::External] {
                let e = explain(&v, &query(t, Some((src, Some(40000))), scope));
                assert_eq!(
                    (e.verdict, e.backend.as_deref()),
                    (Verdict::Forwarded, None)
                );
                assert!(
                    e.reasons.iter().any(|r| r.contains(how)),
                    "{name}: {:?}",
                    e.reasons
                );
                assert!(render(&e).contains(&format!("Algorithm: {name}")));
            }
        }
    }

    #[test]
    fn a_tracked_flow_and_a_valid_affinity_entry_name_the_backend() {
        let t = target("10.96.0.10:80");
        let src = Ipv4Addr::new(10, 244, 100, 2);
        let mut v = view(&t, 3, ff::AFFINITY_CLIENT_IP);
        let q = query(t, Some((src, Some(40000))), Scope::Internal);
        let key = ct_key(&q).expect("key");
        let b2 = be([10, 244, 2, 2], 8080);
        v.conntrack.insert(
            key,
            CtEntry {
                backend_id: 2,
                service_id: SVC,
                nat_addr_be: b2.addr_be,
                nat_port_be: b2.port_be,
                created_ns: v.now_ns - 5_000_000_000,
                ..CtEntry::default()
            },
        );
        let e = explain(&v, &q);
        assert_eq!(e.backend.as_deref(), Some("10.244.2.2:8080"));
        assert!(
            e.reasons
                .iter()
                .any(|r| r.contains("tracked flow (entry 5s old)")),
            "{:?}",
            e.reasons
        );
        // Another port: no conntrack entry, but affinity names slot 3's backend.
        let q = query(t, Some((src, Some(40001))), Scope::Internal);
        v.affinity.insert(
            AffinityKey {
                client_addr_be: u32::from_ne_bytes(src.octets()),
                service_id: SVC,
            },
            AffinityEntry {
                backend_id: 3,
                slot: 3,
                last_used_ns: v.now_ns - 10_000_000_000,
                ..AffinityEntry::default()
            },
        );
        let e = explain(&v, &q);
        assert_eq!(
            e.backend.as_deref(),
            Some("10.244.3.2:8080"),
            "{:?}",
            e.reasons
        );
        // Expired (timeout 60 s): a random pick, said as such.
        v.now_ns += 120_000_000_000;
        let e = explain(&v, &q);
        assert_eq!(e.backend, None);
        assert!(e
            .reasons
            .last()
            .is_some_and(|r| r.contains("first new flow picks at random among 3")));
        let text = render(&e);
        assert!(
            text.contains("Service:   demo/echo:http (ClusterIP, id 7)"),
            "{text}"
        );
        assert!(text.contains("forwarded to one of the backends"), "{text}");
    }

    #[test]
    fn sources_are_internal_when_local_or_routed_via_a_pod_interface() {
        let net = hooks::NetView {
            programs_unreadable: None,
            interfaces: vec![
                hooks::IfaceHooks {
                    name: "veth1".into(),
                    index: 5,
                    pod: true,
                    ..Default::default()
                },
                hooks::IfaceHooks {
                    name: "eth0".into(),
                    index: 2,
                    ..Default::default()
                },
            ],
            routes: vec![
                hooks::Route4 {
                    dst: Ipv4Addr::new(10, 244, 1, 0),
                    prefix: 24,
                    oif: 5,
                },
                hooks::Route4 {
                    dst: Ipv4Addr::UNSPECIFIED,
                    prefix: 0,
                    oif: 2,
                },
            ],
            addresses: vec![Ipv4Addr::new(192, 168, 1, 5)],
        };
        assert_eq!(
            classify_source(&net, Ipv4Addr::new(10, 244, 1, 2)).0,
            Scope::Internal
        );
        assert_eq!(
            classify_source(&net, Ipv4Addr::new(192, 168, 1, 5)).0,
            Scope::Internal
        );
        assert_eq!(
            classify_source(&net, Ipv4Addr::new(8, 8, 8, 8)).0,
            Scope::External
        );
    }

    /// A view with IPv6 frontend `t` holding backends ids 11..=10+n
    /// (`[fd00:244::i]:8080`), next to the IPv4 view's frontend.
    fn view6(t: &Target, n: u16, flags: u16) -> View {
        let mut v = view(&target("10.96.0.10:80/TCP"), 2, ff::KIND_CLUSTER_IP);
        let key = head_key(t, scope::INTERNAL);
        assert_eq!(key.family(), IpFamily::V6);
        v.frontends.insert(
            key,
            FrontendSlot {
                service_id: SVC + 1,
                backend_count: n,
                flags,
                ..FrontendSlot::default()
            },
        );
        for i in 1..=n {
            let id = 10 + u32::from(i);
            v.frontends.insert(
                key.at(scope::INTERNAL, i),
                FrontendSlot {
                    backend_id: id,
                    service_id: SVC + 1,
                    ..FrontendSlot::default()
                },
            );
            let ip: std::net::Ipv6Addr = format!("fd00:244::{i}").parse().expect("an address");
            v.backends.insert(
                id,
                proxy_common::Backend6 {
                    addr_be: addr6_be(ip.octets()),
                    port_be: 8080u16.to_be(),
                    proto: proto::TCP,
                    flags: 0,
                }
                .into(),
            );
        }
        v.names.insert(SVC + 1, "demo/echo6:http".into());
        v
    }

    #[test]
    fn ipv6_maglev_and_source_hash_name_the_backend_the_table_gives() {
        let t = target("[fd00:96::10]:80");
        let mut v = view6(&t, 3, ff::ALGO_MAGLEV | ff::KIND_LOAD_BALANCER);
        // Backend ids 11..=13 in turn.
        let table: Vec<u32> = (0..capacity::MAGLEV_TABLE).map(|i| i % 3 + 11).collect();
        v.maglev.insert(SVC + 1, table);
        let src: std::net::Ipv6Addr = "2001:db8::9".parse().unwrap();
        let q = |src_port: Option<u16>| Query {
            target: t,
            src: Some((IpAddr::V6(src), src_port)),
            scope: Scope::External,
            scope_reason: "test".into(),
        };
        for port in [40000u16, 40001, 40002, 51000] {
            let hash = hash::flow_hash6(
                &addr6_be(src.octets()),
                &addr6_be(
                    "fd00:96::10"
                        .parse::<std::net::Ipv6Addr>()
                        .unwrap()
                        .octets(),
                ),
                port.to_be(),
                80u16.to_be(),
                proto::TCP,
            );
            let i = (hash % capacity::MAGLEV_TABLE) % 3 + 1;
            let e = explain(&v, &q(Some(port)));
            assert_eq!(
                e.backend,
                Some(format!("[fd00:244::{i}]:8080")),
                "{:?}",
                e.reasons
            );
        }
        // Without the source port the pick cannot be named.
        let e = explain(&v, &q(None));
        assert_eq!((e.verdict, e.backend), (Verdict::Forwarded, None));
        // Source hash: the client address alone, whatever the port.
        if let Some(head) = v.frontends.get_mut(&head_key(&t, scope::INTERNAL)) {
            head.flags = ff::ALGO_SOURCE_HASH | ff::KIND_LOAD_BALANCER;
        }
        let i = (hash::source_hash6(&addr6_be(src.octets())) % capacity::MAGLEV_TABLE) % 3 + 1;
        for port in [None, Some(40000), Some(61000)] {
            let e = explain(&v, &q(port));
            assert_eq!(
                e.backend,
                Some(format!("[fd00:244::{i}]:8080")),
                "{:?}",
                e.reasons
            );
        }
        // A table entry naming an IPv4 backend id is not an IPv6 backend.
        v.maglev
            .insert(SVC + 1, vec![1; capacity::MAGLEV_TABLE as usize]);
        let e = explain(&v, &q(None));
        assert_eq!(e.backend, None, "{:?}", e.reasons);
    }

    #[test]
    fn ipv6_targets_and_sources_parse_bracketed() {
        let t = target("[fd00:96::10]:53/udp");
        assert_eq!(t.ip, "fd00:96::10".parse::<IpAddr>().unwrap());
        assert_eq!((t.port, t.proto), (53, proto::UDP));
        assert_eq!(t.to_string(), "[fd00:96::10]:53/UDP");
        assert!(
            parse_target("fd00:96::10:53").is_err(),
            "a port needs brackets"
        );
        assert_eq!(
            parse_source("fd00::1"),
            Ok(("fd00::1".parse().unwrap(), None))
        );
        assert_eq!(
            parse_source("[fd00::1]:4000"),
            Ok(("fd00::1".parse().unwrap(), Some(4000)))
        );
    }

    #[test]
    fn an_ipv6_tracked_flow_and_affinity_entry_name_the_backend() {
        let t = target("[fd00:96::10]:80");
        let mut v = view6(&t, 3, ff::KIND_CLUSTER_IP | ff::AFFINITY_CLIENT_IP);
        if let Some(head) = v.frontends.get_mut(&head_key(&t, scope::INTERNAL)) {
            head.affinity_timeout_s = 60;
        }
        let client: std::net::Ipv6Addr = "fd00:244::99".parse().unwrap();
        let q6 = |port| Query {
            target: t,
            src: Some((IpAddr::V6(client), Some(port))),
            scope: Scope::Internal,
            scope_reason: "test".into(),
        };
        let b2: std::net::Ipv6Addr = "fd00:244::2".parse().unwrap();
        v.conntrack6.insert(
            ct_key6(&q6(40000)).expect("key"),
            CtEntry6 {
                backend_id: 12,
                service_id: SVC + 1,
                nat_addr_be: addr6_be(b2.octets()),
                nat_port_be: 8080u16.to_be(),
                created_ns: v.now_ns - 5_000_000_000,
                ..CtEntry6::default()
            },
        );
        let e = explain(&v, &q6(40000));
        assert_eq!(
            e.backend.as_deref(),
            Some("[fd00:244::2]:8080"),
            "{:?}",
            e.reasons
        );
        assert!(
            e.reasons
                .iter()
                .any(|r| r.contains("tracked flow (entry 5s old)")),
            "{:?}",
            e.reasons
        );

        // The backend left (its id now names another address): picks anew.
        let mut gone = v.clone();
        gone.backends.insert(
            12,
            Backend6 {
                addr_be: addr6_be(
                    "fd00:244::77"
                        .parse::<std::net::Ipv6Addr>()
                        .unwrap()
                        .octets(),
                ),
                port_be: 8080u16.to_be(),
                proto: proto::TCP,
                flags: 0,
            }
            .into(),
        );
        let e = explain(&gone, &q6(40000));
        assert_eq!(e.backend, None);
        assert!(
            e.reasons.iter().any(|r| r
                .contains("tracked flow to [fd00:244::2]:8080 (backend id 12), which has left")),
            "{:?}",
            e.reasons
        );

        // Another port: no entry; the client's affinity names slot 3's backend.
        v.affinity6.insert(
            affinity_key6(client, SVC + 1),
            AffinityEntry {
                backend_id: 13,
                slot: 3,
                last_used_ns: v.now_ns - 10_000_000_000,
                ..AffinityEntry::default()
            },
        );
        let e = explain(&v, &q6(40001));
        assert!(
            e.reasons
                .iter()
                .any(|r| r == "no connection-tracking entry for this exact flow"),
            "{:?}",
            e.reasons
        );
        assert_eq!(
            e.backend.as_deref(),
            Some("[fd00:244::3]:8080"),
            "{:?}",
            e.reasons
        );
        assert!(
            e.reasons
                .iter()
                .any(|r| r.contains("fd00:244::99's last new flow went to [fd00:244::3]:8080")),
            "{:?}",
            e.reasons
        );
        // An IPv4 entry of the same service id does not stand in for it.
        v.affinity6.clear();
        v.affinity.insert(
            affinity_key(Ipv4Addr::new(10, 244, 100, 2), SVC + 1),
            AffinityEntry {
                backend_id: 13,
                slot: 3,
                last_used_ns: v.now_ns,
                ..AffinityEntry::default()
            },
        );
        assert_eq!(explain(&v, &q6(40001)).backend, None);
    }

    #[test]
    fn an_ipv6_frontend_is_explained_with_its_own_backends() {
        let t = target("[fd00:96::10]:80");
        let v = view6(&t, 2, ff::KIND_CLUSTER_IP);
        let q = Query {
            target: t,
            src: Some(("fd00:244::99".parse().unwrap(), Some(4000))),
            scope: Scope::Internal,
            scope_reason: "test".into(),
        };
        let e = explain(&v, &q);
        assert_eq!(e.verdict, Verdict::Forwarded, "{:?}", e.reasons);
        assert_eq!(e.service.as_deref(), Some("demo/echo6:http"));
        assert_eq!(e.backend_set, ["[fd00:244::1]:8080", "[fd00:244::2]:8080"]);
        assert_eq!(e.flow, "[fd00:244::99]:4000 -> [fd00:96::10]:80/TCP");
        let text = render(&e);
        assert!(
            text.contains("Backends:  [fd00:244::1]:8080, [fd00:244::2]:8080"),
            "{text}"
        );

        // Another port of the same IPv6 address: told apart.
        let e = explain(
            &v,
            &query(target("[fd00:96::10]:81"), None, Scope::Internal),
        );
        assert_eq!(e.verdict, Verdict::NotHandled);
        assert!(
            e.reasons[0].contains(
                "fd00:96::10 is a Service address, but not on port 81/TCP (it serves 80/TCP)"
            ),
            "{:?}",
            e.reasons
        );
        // The IPv4 frontend's port on an IPv6 address that has none.
        let e = explain(
            &v,
            &query(target("[fd00:96::11]:80"), None, Scope::Internal),
        );
        assert_eq!(e.verdict, Verdict::NotHandled);

        // A slot naming an IPv4 backend id reaches nothing.
        let mut broken = v.clone();
        broken.frontends.insert(
            head_key(&t, scope::INTERNAL).at(scope::INTERNAL, 2),
            FrontendSlot {
                backend_id: 1,
                service_id: SVC + 1,
                ..FrontendSlot::default()
            },
        );
        let e = explain(&broken, &q);
        assert_eq!(e.backend_set, ["[fd00:244::1]:8080"]);
    }
}
