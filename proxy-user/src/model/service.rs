//! One Service (with its EndpointSlices) to its frontends, in the steps a
//! reader can name: its kind, its addresses (cluster IPs, external IPs, load
//! balancer ingress), its attributes (algorithm, affinity, traffic policies),
//! then one frontend per address and port with the backends its policy picks.
//!
//! Nothing here looks at other Services: which Service keeps an address two of
//! them claim is decided by [`Model`](super::Model).
//!
//! [`Model`](super::Model) hands this only versions that
//! [`validate`](super::validate) accepts; the checks here that repeat its
//! object-level ones (an unparsable address, a port out of range) keep
//! [`compute`] total on any input, and never fire from the Model.

use std::net::IpAddr;
use std::sync::Arc;

use crate::model::cidr::IpCidr;

use super::endpoints::{Endpoints, ParsedSlice, Selection};
use super::{
    parse_ip, port_display, port_u16, BackendAddr, Frontend, FrontendAddr, FrontendKind, IpFamily,
    IpFamilyPolicy, LbAlgorithm, ModelWarning, NodeInfo, Protocol, Raw, ServiceInfo,
    ServicePortInfo, ServicePortName, ServiceSpecInfo, SliceInfo, SourceRanges,
    DEFAULT_AFFINITY_TIMEOUT_S, MAX_AFFINITY_TIMEOUT_S,
};

/// What one Service contributes: its frontends (each address at most once,
/// in the order they were made) and the problems found in it and its slices.
#[derive(Debug, Default)]
pub(super) struct ServiceOutput {
    pub frontends: Vec<Frontend>,
    pub warnings: Vec<ModelWarning>,
}

/// Computes one Service's frontends. `slices` are the Service's
/// EndpointSlices (already filtered by proxy labels), in name order;
/// `max_endpoints`: the most backends one frontend's set may have (the rest
/// are left out, last in address order first, and reported).
pub(super) fn compute(
    svc: &ServiceInfo,
    slices: &[&SliceInfo],
    node: Option<&NodeInfo>,
    max_endpoints: usize,
) -> ServiceOutput {
    let mut b = ServiceBuilder {
        node,
        max_endpoints,
        object: format!("Service {}", svc.key),
        out: ServiceOutput::default(),
    };
    if svc.key.name.is_empty() {
        b.warn("has no metadata.name; skipped");
    } else if let Some(spec) = &svc.spec {
        b.service(svc, spec, slices);
    } else {
        b.warn("has no spec; skipped");
    }
    b.out
}

/// The addresses a Service's frontends are made on (both families).
struct Addresses {
    cluster: Vec<IpAddr>,
    external: Vec<IpAddr>,
    load_balancer: Vec<IpAddr>,
}

/// What every frontend of the Service shares.
struct Attributes {
    kind: FrontendKind,
    algorithm: Option<LbAlgorithm>,
    affinity_timeout_s: Option<u32>,
    internal_local: bool,
    external_local: bool,
    health_check_node_port: Option<u16>,
    /// `loadBalancerSourceRanges` per family (IPv4, IPv6), for the
    /// LoadBalancer frontends; `None`: the Service lists none.
    source_ranges: Option<[SourceRanges; 2]>,
}

struct ServiceBuilder<'n> {
    node: Option<&'n NodeInfo>,
    max_endpoints: usize,
    object: String,
    out: ServiceOutput,
}

impl ServiceBuilder<'_> {
    fn warn(&mut self, problem: impl Into<String>) {
        self.out.warnings.push(ModelWarning {
            object: self.object.clone(),
            problem: problem.into(),
        });
    }

    fn service(&mut self, svc: &ServiceInfo, spec: &ServiceSpecInfo, slices: &[&SliceInfo]) {
        let Some(kind) = self.kind(spec) else { return };
        let Some(addresses) = self.addresses(spec, kind) else {
            return;
        };
        let attributes = self.attributes(svc, spec, kind, &addresses);
        let mut endpoints = Endpoints {
            node: self.node,
            warnings: &mut self.out.warnings,
        };
        let parsed: Vec<ParsedSlice> = slices
            .iter()
            .filter_map(|s| endpoints.parse_slice(s))
            .collect();
        for sp in &spec.ports {
            self.port(svc, sp, &attributes, &addresses, &parsed);
        }
    }

    /// The frontend kind from `spec.type`; `None`: nothing to program
    /// (ExternalName, or an unknown type, reported).
    fn kind(&mut self, spec: &ServiceSpecInfo) -> Option<FrontendKind> {
        match spec.type_.as_deref() {
            None | Some("ClusterIP") => Some(FrontendKind::ClusterIp),
            Some("NodePort") => Some(FrontendKind::NodePort),
            Some("LoadBalancer") => Some(FrontendKind::LoadBalancer),
            Some("ExternalName") => None,
            Some(other) => {
                self.warn(format!("unknown spec.type {other:?}; skipped"));
                None
            }
        }
    }

    /// Cluster IPs, external IPs and load-balancer ingress IPs. `None`: the
    /// whole Service is skipped (headless, or no cluster IP at all).
    fn addresses(&mut self, spec: &ServiceSpecInfo, kind: FrontendKind) -> Option<Addresses> {
        // "None" (headless) or unset: kube-proxy skips the whole Service.
        if spec.cluster_ips.iter().any(|ip| ip == "None") {
            return None;
        }
        if spec.cluster_ips.iter().all(|ip| ip.is_empty()) {
            self.warn("has no spec.clusterIP; skipped (a manifest directory has no IP allocator: set spec.clusterIP)");
            return None;
        }
        let mut cluster = Vec::new();
        for raw in &spec.cluster_ips {
            match parse_ip(raw) {
                Some(ip) => cluster.push(ip),
                None => self.warn(format!("clusterIP {raw:?} is not an IP address")),
            }
        }
        if spec.ip_family_policy == Some(Raw::Known(IpFamilyPolicy::RequireDualStack)) {
            if let [only] = cluster.as_slice() {
                // The API server allocates the other family; a manifest
                // directory has no allocator.
                self.warn(format!(
                    "ipFamilyPolicy RequireDualStack but only the {} cluster IP {only} is set; only it is programmed",
                    IpFamily::of(*only)
                ));
            }
        }
        let mut external = Vec::new();
        for raw in spec.external_ips() {
            match parse_ip(raw) {
                Some(ip) => external.push(ip),
                None => self.warn(format!("externalIP {raw:?} is not an IP address")),
            }
        }
        let load_balancer = if kind == FrontendKind::LoadBalancer {
            self.load_balancer_ips(spec)
        } else {
            Vec::new()
        };
        // kube-proxy serves a Service only in the families of its cluster
        // IPs (each family's proxier skips a Service without a cluster IP of
        // its own): an external or load-balancer IP of another family is
        // ignored, as are NodePorts on node addresses of another family.
        let served = |ip: &IpAddr| {
            cluster
                .iter()
                .any(|c| IpFamily::of(*c) == IpFamily::of(*ip))
        };
        let (external, other_external): (Vec<IpAddr>, Vec<IpAddr>) =
            external.into_iter().partition(served);
        let (load_balancer, other_lb): (Vec<IpAddr>, Vec<IpAddr>) =
            load_balancer.into_iter().partition(served);
        for (what, ip) in other_external.iter().map(|ip| ("externalIP", ip)).chain(
            other_lb
                .iter()
                .map(|ip| ("status.loadBalancer.ingress ip", ip)),
        ) {
            self.warn(format!(
                "{what} {ip} is {} but the Service has no {} cluster IP (ipFamilies); ignored, as kube-proxy does",
                IpFamily::of(*ip),
                IpFamily::of(*ip)
            ));
        }
        Some(Addresses {
            cluster,
            external,
            load_balancer,
        })
    }

    fn load_balancer_ips(&mut self, spec: &ServiceSpecInfo) -> Vec<IpAddr> {
        let mut ips = Vec::new();
        for ing in spec.lb_ingress() {
            // ipMode Proxy: the load balancer proxies and delivers to the node
            // itself, so kube-proxy programs nothing for this IP.
            if ing.ip_mode.as_deref() == Some("Proxy") {
                continue;
            }
            let Some(raw) = ing.ip.as_deref() else {
                continue; // hostname-only ingress: nothing to program
            };
            match parse_ip(raw) {
                Some(ip) => ips.push(ip),
                None => self.warn(format!(
                    "status.loadBalancer.ingress ip {raw:?} is not an IP address"
                )),
            }
        }
        ips
    }

    fn attributes(
        &mut self,
        svc: &ServiceInfo,
        spec: &ServiceSpecInfo,
        kind: FrontendKind,
        addresses: &Addresses,
    ) -> Attributes {
        let algorithm = self.lb_algorithm(svc);
        let affinity_timeout_s = self.affinity(spec);
        let (internal_local, external_local) = self.traffic_policies(spec, kind, addresses);
        let health_check_node_port = if kind == FrontendKind::LoadBalancer && external_local {
            spec.health_check_node_port().and_then(port_u16)
        } else {
            None
        };
        let source_ranges = self.source_ranges(spec, kind, addresses);
        Attributes {
            kind,
            algorithm,
            affinity_timeout_s,
            internal_local,
            external_local,
            health_check_node_port,
            source_ranges,
        }
    }

    /// `loadBalancerSourceRanges`, split by family, as kube-proxy reads it:
    /// the blocks of a family restrict that family's load-balancer IPs. An
    /// invalid block is reported and left out; it never opens the Service,
    /// and neither does a list without a block of some family (kube-proxy
    /// leaves such a family open; here its load-balancer IPs answer no one,
    /// reported). When a block holds one of the node's addresses, the
    /// Service's load-balancer IPs are allowed sources too (kube-proxy's
    /// rule for a load balancer whose IP is also local to the node).
    fn source_ranges(
        &mut self,
        spec: &ServiceSpecInfo,
        kind: FrontendKind,
        addresses: &Addresses,
    ) -> Option<[SourceRanges; 2]> {
        if kind != FrontendKind::LoadBalancer {
            return None;
        }
        let written: Vec<&str> = spec
            .lb_source_ranges()
            .iter()
            .map(|r| r.trim())
            .filter(|r| !r.is_empty())
            .collect();
        if written.is_empty() {
            return None;
        }
        let mut blocks: [Vec<IpCidr>; 2] = [Vec::new(), Vec::new()];
        for raw in written {
            match raw.parse::<IpCidr>() {
                Ok(cidr) => blocks[usize::from(!cidr.is_ipv4())].push(cidr.canonical()),
                Err(error) => self.warn(format!(
                    "loadBalancerSourceRanges: {error}; left out (the other blocks still restrict the Service)"
                )),
            }
        }
        let lb_families: Vec<IpFamily> = addresses
            .load_balancer
            .iter()
            .map(|ip| IpFamily::of(*ip))
            .collect();
        for block in blocks.iter().flatten() {
            let family = if block.is_ipv4() {
                IpFamily::V4
            } else {
                IpFamily::V6
            };
            if !lb_families.is_empty() && !lb_families.contains(&family) {
                self.warn(format!(
                    "loadBalancerSourceRanges block {block} is {family} but the Service has no {family} load-balancer IP; ignored, as kube-proxy does"
                ));
            }
        }
        let [v4, v6] = blocks;
        Some([
            self.family_ranges(IpFamily::V4, v4, &addresses.load_balancer),
            self.family_ranges(IpFamily::V6, v6, &addresses.load_balancer),
        ])
    }

    /// One family's [`SourceRanges`] from its valid `blocks`.
    fn family_ranges(
        &mut self,
        family: IpFamily,
        mut blocks: Vec<IpCidr>,
        lb_ips: &[IpAddr],
    ) -> SourceRanges {
        let lb_ips: Vec<IpAddr> = lb_ips
            .iter()
            .copied()
            .filter(|ip| IpFamily::of(*ip) == family)
            .collect();
        let node_addresses = self
            .node
            .map(|n| n.addresses.as_slice())
            .unwrap_or_default();
        let allows_node = blocks
            .iter()
            .any(|b| node_addresses.iter().any(|a| b.contains(*a)));
        if allows_node {
            blocks.extend(
                lb_ips
                    .iter()
                    .filter_map(|ip| IpCidr::new(*ip, if ip.is_ipv4() { 32 } else { 128 })),
            );
        }
        blocks.sort();
        blocks.dedup();
        // A block inside another adds nothing to the trie's answer.
        let covered = |b: &IpCidr| {
            blocks
                .iter()
                .any(|c| c.prefix_len() < b.prefix_len() && c.contains(b.network()))
        };
        let blocks: Vec<IpCidr> = blocks.iter().filter(|b| !covered(b)).copied().collect();
        if blocks.is_empty() && !lb_ips.is_empty() {
            self.warn(format!(
                "loadBalancerSourceRanges holds no valid {family} block: the {family} load-balancer IPs answer no client (kube-proxy would leave them open to every source)"
            ));
        }
        SourceRanges {
            blocks: Arc::from(blocks),
            allows_node,
        }
    }

    /// The `switchboard.io/lb-algorithm` annotation; an unknown value is
    /// reported and the agent's default used.
    fn lb_algorithm(&mut self, svc: &ServiceInfo) -> Option<LbAlgorithm> {
        let value = svc.lb_algorithm.as_deref()?;
        let algorithm = LbAlgorithm::from_annotation(value);
        if algorithm.is_none() {
            self.warn(format!(
                "annotation {}: {value:?} is not random, maglev, source-hash, round-robin or least-conn; the agent's default is used",
                super::ANNOTATION_LB_ALGORITHM
            ));
        }
        algorithm
    }

    /// `sessionAffinity: ClientIP` and its timeout.
    fn affinity(&mut self, spec: &ServiceSpecInfo) -> Option<u32> {
        match spec.session_affinity.as_deref() {
            Some("ClientIP") => match spec.affinity_timeout_s() {
                None => Some(DEFAULT_AFFINITY_TIMEOUT_S),
                Some(t) => match u32::try_from(t) {
                    Ok(t) if (1..=MAX_AFFINITY_TIMEOUT_S).contains(&t) => Some(t),
                    _ => {
                        self.warn(format!(
                            "sessionAffinityConfig.clientIP.timeoutSeconds {t} is out of range 1..={MAX_AFFINITY_TIMEOUT_S}; using {DEFAULT_AFFINITY_TIMEOUT_S}"
                        ));
                        Some(DEFAULT_AFFINITY_TIMEOUT_S)
                    }
                },
            },
            None | Some("None") => None,
            Some(other) => {
                self.warn(format!("unknown sessionAffinity {other:?}; ignored"));
                None
            }
        }
    }

    /// `(internal Local, external Local)` in effect (kube-proxy:
    /// InternalPolicyLocal / ExternalPolicyLocal). Without node knowledge both
    /// are Cluster, with a warning.
    fn traffic_policies(
        &mut self,
        spec: &ServiceSpecInfo,
        kind: FrontendKind,
        addresses: &Addresses,
    ) -> (bool, bool) {
        let externally_accessible =
            kind != FrontendKind::ClusterIp || !addresses.external.is_empty();
        let external_local =
            externally_accessible && spec.external_traffic_policy.as_deref() == Some("Local");
        let internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
        if self.node.is_none() && (external_local || internal_local) {
            let which = match (internal_local, external_local) {
                (true, true) => "internalTrafficPolicy and externalTrafficPolicy are",
                (true, false) => "internalTrafficPolicy is",
                _ => "externalTrafficPolicy is",
            };
            self.warn(format!(
                "{which} Local but this node is unknown (no node name); treated as Cluster"
            ));
            return (false, false);
        }
        (internal_local, external_local)
    }

    /// The frontends of one Service port: one per address, plus NodePorts.
    fn port(
        &mut self,
        svc: &ServiceInfo,
        sp: &ServicePortInfo,
        attributes: &Attributes,
        addresses: &Addresses,
        parsed: &[ParsedSlice],
    ) {
        let protocol = match Protocol::from_k8s(sp.protocol.as_deref()) {
            Ok(p) => p,
            Err(problem) => {
                self.warn(format!(
                    "port {}: {problem}",
                    port_display(&sp.name, sp.port)
                ));
                return;
            }
        };
        let Some(port) = port_u16(sp.port) else {
            self.warn(format!(
                "port {}: {} is not a valid port number",
                port_display(&sp.name, sp.port),
                sp.port
            ));
            return;
        };
        let spn = ServicePortName {
            namespace: Arc::clone(&svc.key.namespace),
            name: Arc::clone(&svc.key.name),
            // The slices' copy, when they have one: every frontend of
            // every Service naming its port `http` then shares one string.
            port: parsed
                .iter()
                .find_map(|ps| ps.port_name(&sp.name))
                .cloned()
                .unwrap_or_else(|| Arc::clone(&sp.name)),
        };
        let mut addrs: Vec<(FrontendKind, IpAddr, u16)> = Vec::new();
        addrs.extend(
            addresses
                .cluster
                .iter()
                .map(|&ip| (FrontendKind::ClusterIp, ip, port)),
        );
        addrs.extend(
            addresses
                .external
                .iter()
                .map(|&ip| (FrontendKind::ExternalIp, ip, port)),
        );
        addrs.extend(
            addresses
                .load_balancer
                .iter()
                .map(|&ip| (FrontendKind::LoadBalancer, ip, port)),
        );
        self.node_ports(sp, &spn, port, protocol, attributes.kind, &mut addrs);
        // NodePorts only on node addresses of the Service's families.
        addrs.retain(|(kind, ip, _)| {
            *kind != FrontendKind::NodePort
                || addresses
                    .cluster
                    .iter()
                    .any(|c| IpFamily::of(*c) == IpFamily::of(*ip))
        });

        // Each family's frontends get that family's endpoints only.
        for family in [IpFamily::V4, IpFamily::V6] {
            if !addrs.iter().any(|(_, ip, _)| IpFamily::of(*ip) == family) {
                continue;
            }
            let mut endpoints = Endpoints {
                node: self.node,
                warnings: &mut self.out.warnings,
            };
            let eps = endpoints.for_port(parsed, &sp.name, protocol, family);
            let cluster = endpoints.cluster_selection(&eps);
            let local = endpoints.local_selection(&eps);
            let cluster = self.limit(cluster, &spn, port, "");
            let local = if attributes.internal_local || attributes.external_local {
                self.limit(local, &spn, port, "local ")
            } else {
                local
            };
            for &(kind, ip, fport) in addrs
                .iter()
                .filter(|(_, ip, _)| IpFamily::of(*ip) == family)
            {
                let addr = FrontendAddr {
                    ip,
                    port: fport,
                    protocol,
                };
                let fe = frontend(addr, kind, &spn, attributes, &cluster, &local);
                self.insert(fe);
            }
        }
    }

    /// Keeps at most `max_endpoints` backends (the first in address order,
    /// so every node keeps the same ones) and reports the rest by address.
    fn limit(
        &mut self,
        mut sel: Selection,
        spn: &ServicePortName,
        port: u16,
        what: &str,
    ) -> Selection {
        if sel.backends.len() <= self.max_endpoints {
            return sel;
        }
        let dropped = sel.backends.split_off(self.max_endpoints);
        let kept = &sel.backends;
        sel.weights.retain(|(b, _)| kept.binary_search(b).is_ok());
        let (Some(first), Some(last)) = (dropped.first(), dropped.last()) else {
            return sel;
        };
        self.warn(format!(
            "port {}: {} {what}endpoints, more than the {} one service port may have (--max-endpoints-per-service); the {} last in address order ({first} to {last}) are not programmed",
            spn.port_or_number(port),
            sel.backends.len() + dropped.len(),
            self.max_endpoints,
            dropped.len(),
        ));
        sel
    }

    /// NodePort frontends on this node's addresses, for NodePort and
    /// LoadBalancer Services.
    fn node_ports(
        &mut self,
        sp: &ServicePortInfo,
        spn: &ServicePortName,
        port: u16,
        protocol: Protocol,
        kind: FrontendKind,
        addrs: &mut Vec<(FrontendKind, IpAddr, u16)>,
    ) {
        if !matches!(kind, FrontendKind::NodePort | FrontendKind::LoadBalancer) {
            return;
        }
        let Some(np) = sp.node_port else {
            if kind == FrontendKind::NodePort {
                // The API server always allocates one; a hand-written manifest may lack it.
                self.warn(format!(
                    "port {}: type NodePort without a nodePort; only the other frontends are programmed (set spec.ports[].nodePort)",
                    spn.port_or_number(port)
                ));
            }
            return;
        };
        match (port_u16(np), self.node) {
            (None, _) => self.warn(format!(
                "port {}: nodePort {np} is not a valid port number",
                spn.port_or_number(port)
            )),
            (Some(np), Some(node)) if !node.addresses.is_empty() => {
                addrs.extend(
                    node.addresses
                        .iter()
                        .map(|&ip| (FrontendKind::NodePort, ip, np)),
                );
            }
            (Some(np), _) => self.warn(format!(
                "nodePort {np}/{protocol} not programmed: this node's addresses are unknown"
            )),
        }
    }

    /// Adds a frontend unless this Service already made one on the address.
    fn insert(&mut self, fe: Frontend) {
        if let Some(existing) = self.out.frontends.iter().find(|f| f.addr == fe.addr) {
            let problem = format!(
                "{} frontend {} is already used by {} ({}); ignored",
                fe.kind, fe.addr, existing.service, existing.kind
            );
            self.warn(problem);
            return;
        }
        self.out.frontends.push(fe);
    }
}

/// One frontend. Traffic from this node's pods and the host: ClusterIP
/// follows internalTrafficPolicy; external addresses are short-circuited to
/// the cluster-wide set whatever externalTrafficPolicy says (kube-proxy: "pod
/// traffic for .. external destinations" and "route LOCAL traffic .. to
/// service chain" in the EXT chain; UsesClusterEndpoints is true for every
/// externally accessible Service, even with both policies Local). Only
/// traffic from outside the node is held to externalTrafficPolicy: Local.
fn frontend(
    addr: FrontendAddr,
    kind: FrontendKind,
    spn: &ServicePortName,
    attributes: &Attributes,
    cluster: &Selection,
    local: &Selection,
) -> Frontend {
    let (local_only, sel, external): (bool, &Selection, Option<&Selection>) = if kind.is_external()
    {
        let external = attributes.external_local.then_some(local);
        (attributes.external_local, cluster, external)
    } else if attributes.internal_local {
        (true, local, None)
    } else {
        (false, cluster, None)
    };
    let external_backends = external.map(|e| e.backends.clone());
    let mut weights: Vec<(BackendAddr, u16)> = sel.weights.clone();
    if let Some(external) = external {
        weights.extend(external.weights.iter().copied());
        weights.sort();
        weights.dedup();
    }
    Frontend {
        addr,
        service: spn.clone(),
        backends: sel.backends.clone(),
        external_backends,
        kind,
        affinity_timeout_s: attributes.affinity_timeout_s,
        local_only,
        health_check_node_port: attributes.health_check_node_port,
        terminating_fallback: sel.terminating_fallback,
        external_terminating_fallback: external.is_some_and(|e| e.terminating_fallback),
        topology: sel.topology,
        algorithm: attributes.algorithm,
        source_ranges: match (&attributes.source_ranges, kind) {
            (Some([v4, v6]), FrontendKind::LoadBalancer) => Some(match IpFamily::of(addr.ip) {
                IpFamily::V4 => v4.clone(),
                IpFamily::V6 => v6.clone(),
            }),
            _ => None,
        },
        weights: weights.into(),
    }
}
