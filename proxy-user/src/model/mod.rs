//! The pure model: Services and EndpointSlices (and, when known, this node) in,
//! the desired set of frontends with their backends out.
//!
//! Nothing here touches the network, the maps or the clock; both sources (the
//! Kubernetes API and a directory of manifests) feed the same [`build_for_node`],
//! and the map sync diffs its result against what is programmed.
//!
//! The rules follow kube-proxy (pkg/proxy: `ShouldSkipService`, the
//! EndpointSlice cache and `CategorizeEndpoints`). Where this model deviates, or
//! adds something kube-proxy leaves to another component, the item says so.
//!
//! Input problems never panic and never abort the whole build: the object at
//! fault is skipped (or only the bad part of it) and a [`ModelWarning`] names it.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub mod input;
pub use input::{
    EndpointInfo, Hints, Interner, LbIngress, ObjectKey, ProxyLabels, RawAddress, ServiceInfo,
    ServicePortInfo, ServiceSpecInfo, SliceInfo, SlicePortInfo,
};

/// Label on an EndpointSlice naming the Service it belongs to (same namespace).
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label on a Service that hands it to another proxy implementation.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label marking a headless Service (and its EndpointSlices).
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Node label carrying the node's zone, used by topology hints.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// Service annotation choosing how traffic from outside the node picks a
/// backend: `random`, `maglev` or `source-hash` ([`LbAlgorithm`]).
pub const ANNOTATION_LB_ALGORITHM: &str = "switchboard.io/lb-algorithm";
/// `sessionAffinityConfig.clientIP.timeoutSeconds` when absent (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10_800;
/// The largest session-affinity timeout the API server accepts (1 day).
pub const MAX_AFFINITY_TIMEOUT_S: u32 = 86_400;

/// L4 protocol of a frontend. SCTP is not supported (the kernel here lacks it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    /// The name Kubernetes uses: `"TCP"` or `"UDP"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }

    /// Parses a Kubernetes protocol field; absent means TCP.
    fn from_k8s(value: Option<&str>) -> Result<Protocol, String> {
        match value {
            None | Some("TCP") => Ok(Protocol::Tcp),
            Some("UDP") => Ok(Protocol::Udp),
            Some("SCTP") => Err("SCTP is not supported".to_string()),
            Some(other) => Err(format!("protocol {other:?} is not supported (TCP or UDP)")),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a client addresses: `10.96.0.10:80/TCP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct FrontendAddr {
    pub ip: Ipv4Addr,
    pub port: u16,
    pub protocol: Protocol,
}

impl fmt::Display for FrontendAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}/{}", self.ip, self.port, self.protocol)
    }
}

/// Where a connection is sent: `10.244.1.2:8080` (same protocol as its frontend).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct BackendAddr {
    pub ip: Ipv4Addr,
    pub port: u16,
}

impl fmt::Display for BackendAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ip, self.port)
    }
}

/// A Service port, named as kube-proxy names it: `ns/name:port`, or `ns/name`
/// when the port has no name (single-port Services).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct ServicePortName {
    pub namespace: String,
    pub name: String,
    pub port: String,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port.is_empty() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

/// Which kind of Service address a frontend is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum FrontendKind {
    /// `spec.clusterIPs` (or `spec.clusterIP`) × port.
    #[default]
    ClusterIp,
    /// One of this node's addresses × `nodePort`.
    NodePort,
    /// `status.loadBalancer.ingress[].ip` × port.
    LoadBalancer,
    /// `spec.externalIPs` × port.
    ExternalIp,
}

impl FrontendKind {
    /// Kubernetes spelling: `ClusterIP`, `NodePort`, `LoadBalancer`, `ExternalIP`.
    pub fn as_str(self) -> &'static str {
        match self {
            FrontendKind::ClusterIp => "ClusterIP",
            FrontendKind::NodePort => "NodePort",
            FrontendKind::LoadBalancer => "LoadBalancer",
            FrontendKind::ExternalIp => "ExternalIP",
        }
    }

    /// Traffic to this kind of frontend is governed by `externalTrafficPolicy`
    /// (otherwise by `internalTrafficPolicy`).
    pub fn is_external(self) -> bool {
        !matches!(self, FrontendKind::ClusterIp)
    }
}

impl fmt::Display for FrontendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a new flow from outside the node picks its backend.
///
/// IPVS's schedulers, as kube-proxy's IPVS mode offers them, and what stands
/// for each here: `rr` → [`Random`](Self::Random) (the same even spread; an
/// exact rotation would need a counter shared by every CPU), `sh` →
/// [`SourceHash`](Self::SourceHash), `mh` → [`Maglev`](Self::Maglev). There is
/// no least-connection (`lc`): it needs a live count of each backend's
/// connections shared by every CPU and every node, which a per-node data path
/// does not have; Maglev with per-flow connection tracking is what Katran and
/// Cilium offer instead. Traffic from this node's pods and host always picks
/// at random.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, clap::ValueEnum)]
pub enum LbAlgorithm {
    /// A random backend per new flow (kube-proxy's iptables mode).
    #[default]
    Random,
    /// Maglev consistent hashing of the 5-tuple: every node sends a flow to
    /// the same backend (ECMP in front of several nodes), and a backend that
    /// leaves moves only its own share of flows.
    Maglev,
    /// Maglev's table indexed by the client address alone: a client's flows
    /// all reach one backend, on every node (IPVS `sh`).
    SourceHash,
}

impl LbAlgorithm {
    /// The annotation spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LbAlgorithm::Random => "random",
            LbAlgorithm::Maglev => "maglev",
            LbAlgorithm::SourceHash => "source-hash",
        }
    }

    fn from_annotation(value: &str) -> Option<Self> {
        [Self::Random, Self::Maglev, Self::SourceHash]
            .into_iter()
            .find(|a| a.as_str() == value)
    }
}

/// Topology-aware routing that narrowed a frontend's backends (kube-proxy's
/// `PreferSameNode` / `PreferSameZone` modes, driven by EndpointSlice hints).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum TopologyMode {
    /// Only endpoints whose `hints.forNodes` names this node.
    SameNode,
    /// Only endpoints whose `hints.forZones` names this node's zone.
    SameZone,
}

impl fmt::Display for TopologyMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TopologyMode::SameNode => "same-node",
            TopologyMode::SameZone => "same-zone",
        })
    }
}

/// One address clients connect to, and where its connections go.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Frontend {
    pub addr: FrontendAddr,
    pub service: ServicePortName,
    /// Where traffic that originates on this node (its pods, the host) goes:
    /// what the data path programs today. Sorted, deduplicated. Empty means:
    /// drop (and count) this frontend's traffic.
    ///
    /// For a ClusterIP frontend this follows `internalTrafficPolicy` (only this
    /// node's endpoints when it is `Local`). For an external frontend (NodePort,
    /// LoadBalancer, external IP) it is always the cluster-wide set, also under
    /// `externalTrafficPolicy: Local`: kube-proxy short-circuits traffic from
    /// pods and from the host to those addresses to its cluster endpoints (as
    /// if it had gone out to the load balancer and come back), and applies the
    /// Local policy only to traffic from outside the node (see
    /// [`external_backends`](Self::external_backends)).
    pub backends: Vec<BackendAddr>,
    /// Where traffic from outside the node goes, when that differs by policy
    /// from [`backends`](Self::backends): `Some` exactly for external frontends
    /// whose `externalTrafficPolicy: Local` is in effect, and then it holds only
    /// this node's endpoints (ready ones, else serving-and-terminating ones;
    /// possibly none, and then such traffic is dropped). It may happen to equal
    /// `backends` (every endpoint is local). `None`: outside traffic gets
    /// `backends`. Recorded for the external path (NodePort from outside, XDP);
    /// the data path does not use it yet.
    pub external_backends: Option<Vec<BackendAddr>>,
    pub kind: FrontendKind,
    /// `sessionAffinity: ClientIP`, with its timeout in seconds.
    pub affinity_timeout_s: Option<u32>,
    /// The traffic policy that governs this frontend is `Local`: for a
    /// ClusterIP frontend (`internalTrafficPolicy`) that makes
    /// [`backends`](Self::backends) local-only; for an external frontend
    /// (`externalTrafficPolicy`) it makes
    /// [`external_backends`](Self::external_backends) local-only (and `Some`),
    /// while `backends` stays cluster-wide.
    pub local_only: bool,
    /// `spec.healthCheckNodePort` of a LoadBalancer Service with
    /// `externalTrafficPolicy: Local` (kube-proxy serves a health check there).
    pub health_check_node_port: Option<u16>,
    /// No endpoint was ready, so `backends` are the serving-and-terminating
    /// ones (kube-proxy's fallback that lets connections drain during rollouts).
    /// Describes `backends` only (`external_backends` falls back the same way
    /// among this node's endpoints).
    pub terminating_fallback: bool,
    /// Topology hints narrowed `backends` (only when every ready endpoint has
    /// hints; never for a local-only set).
    pub topology: Option<TopologyMode>,
    /// The Service's `switchboard.io/lb-algorithm` annotation, for traffic
    /// from outside the node; `None`: the agent's default.
    pub algorithm: Option<LbAlgorithm>,
}

impl Frontend {
    /// A plain ClusterIP frontend: no policies, no affinity, no topology.
    /// Tests, benchmarks and fixtures start from this.
    pub fn cluster_ip(
        addr: FrontendAddr,
        service: ServicePortName,
        backends: Vec<BackendAddr>,
    ) -> Self {
        Self {
            addr,
            service,
            backends,
            external_backends: None,
            kind: FrontendKind::ClusterIp,
            affinity_timeout_s: None,
            local_only: false,
            health_check_node_port: None,
            terminating_fallback: false,
            topology: None,
            algorithm: None,
        }
    }
}

impl fmt::Display for Frontend {
    /// One line: `10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.1.3:8080`,
    /// then `; from outside -> ..` when `external_backends` is set, then ` [..]`
    /// listing whichever of the optional attributes are set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list(f: &mut fmt::Formatter<'_>, backends: &[BackendAddr]) -> fmt::Result {
            if backends.is_empty() {
                f.write_str(" (none)")?;
            }
            for (i, b) in backends.iter().enumerate() {
                write!(f, "{}{b}", if i == 0 { " " } else { ", " })?;
            }
            Ok(())
        }
        write!(f, "{} {} {} ->", self.addr, self.kind, self.service)?;
        list(f, &self.backends)?;
        if let Some(external) = &self.external_backends {
            f.write_str("; from outside ->")?;
            list(f, external)?;
        }
        let mut extras = Vec::new();
        if let Some(t) = self.affinity_timeout_s {
            extras.push(format!("affinity {t}s"));
        }
        if self.local_only {
            extras.push("local-only".to_string());
        }
        if let Some(p) = self.health_check_node_port {
            extras.push(format!("healthCheckNodePort {p}"));
        }
        if self.terminating_fallback {
            extras.push("terminating fallback".to_string());
        }
        if let Some(t) = self.topology {
            extras.push(format!("topology {t}"));
        }
        if let Some(a) = self.algorithm {
            extras.push(format!("lb-algorithm {}", a.as_str()));
        }
        if !extras.is_empty() {
            write!(f, " [{}]", extras.join(", "))?;
        }
        Ok(())
    }
}

/// Everything that should be programmed, keyed by frontend address.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DesiredState {
    pub frontends: BTreeMap<FrontendAddr, Frontend>,
}

/// Something in the input that could not be (fully) honoured.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct ModelWarning {
    /// `"Service ns/name"` or `"EndpointSlice ns/name"`.
    pub object: String,
    pub problem: String,
}

impl fmt::Display for ModelWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.problem)
    }
}

/// What the model needs to know about the node it programs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    /// Matched against `endpoints[].nodeName` (local endpoints) and `hints.forNodes`.
    pub name: String,
    /// NodePort frontends are created on each of these.
    pub addresses: Vec<Ipv4Addr>,
    /// The node's `topology.kubernetes.io/zone` label, matched against `hints.forZones`.
    pub zone: Option<String>,
    /// The Node has a deletionTimestamp (or the cluster autoscaler's
    /// `ToBeDeletedByClusterAutoscaler` taint): `/healthz` turns unhealthy
    /// so load balancers stop sending new traffic here, as kube-proxy does.
    pub deleting: bool,
}

/// The taint the cluster autoscaler puts on a node it is about to delete.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";

impl NodeInfo {
    /// From a Node object: its name, its IPv4 `InternalIP` and `ExternalIP`
    /// addresses (in that order, deduplicated) and its zone label.
    pub fn from_node(node: &Node) -> NodeInfo {
        let mut addresses = Vec::new();
        for wanted in ["InternalIP", "ExternalIP"] {
            let all = node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .map(|a| a.as_slice())
                .unwrap_or_default();
            for a in all.iter().filter(|a| a.type_ == wanted) {
                if let Ok(ip) = a.address.parse::<Ipv4Addr>() {
                    if !addresses.contains(&ip) {
                        addresses.push(ip);
                    }
                }
            }
        }
        let zone = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_TOPOLOGY_ZONE))
            .filter(|z| !z.is_empty())
            .cloned();
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == TAINT_TO_BE_DELETED));
        NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(),
            addresses,
            zone,
            deleting: node.metadata.deletion_timestamp.is_some() || tainted,
        }
    }
}

/// [`build_for_node`] without node knowledge and with no proxy name of our own
/// (so Services labelled for any proxy are skipped, as kube-proxy does).
pub fn build(services: &[Service], slices: &[EndpointSlice]) -> (DesiredState, Vec<ModelWarning>) {
    build_for_node(services, slices, None, None)
}

/// Computes the desired frontends.
///
/// * `node`: this node. Without it there are no NodePort frontends, topology
///   hints are not used, and `Local` traffic policies cannot be applied (they
///   are then treated as `Cluster`, with a warning).
/// * `proxy_name`: our `service.kubernetes.io/service-proxy-name`. Services
///   carrying that label with another value (or with any value, when this is
///   `None`) belong to another proxy and are skipped.
///
/// Services are processed in namespace/name order; when two claim the same
/// frontend address, the first keeps it and the second gets a warning.
/// Warnings come out sorted.
pub fn build_for_node(
    services: &[Service],
    slices: &[EndpointSlice],
    node: Option<&NodeInfo>,
    proxy_name: Option<&str>,
) -> (DesiredState, Vec<ModelWarning>) {
    let mut b = Builder {
        node,
        state: DesiredState::default(),
        warnings: Vec::new(),
    };

    // EndpointSlices by (namespace, service name), in slice-name order.
    let mut by_service: BTreeMap<(&str, &str), Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        if !labels_select(&slice.metadata, proxy_name) {
            continue;
        }
        let Some(svc_name) = label(&slice.metadata, LABEL_SERVICE_NAME) else {
            continue;
        };
        by_service
            .entry((namespace(&slice.metadata), svc_name))
            .or_default()
            .push(slice);
    }
    for list in by_service.values_mut() {
        list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    }

    let mut sorted: Vec<&Service> = services.iter().collect();
    sorted.sort_by(|a, b| {
        (namespace(&a.metadata), &a.metadata.name).cmp(&(namespace(&b.metadata), &b.metadata.name))
    });
    for svc in sorted {
        if !labels_select(&svc.metadata, proxy_name) {
            continue;
        }
        let ns = namespace(&svc.metadata);
        let Some(name) = svc.metadata.name.as_deref().filter(|n| !n.is_empty()) else {
            b.warn(format!("Service {ns}/?"), "has no metadata.name; skipped");
            continue;
        };
        let svc_slices = by_service
            .get(&(ns, name))
            .map(Vec::as_slice)
            .unwrap_or_default();
        b.service(svc, ns, name, svc_slices);
    }

    b.warnings.sort();
    b.warnings.dedup();
    (b.state, b.warnings)
}

fn namespace(meta: &ObjectMeta) -> &str {
    meta.namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// kube-proxy watches Services and EndpointSlices through the label selector
/// `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`.
/// With a proxy name of our own, objects labelled with exactly that name are ours too.
fn labels_select(meta: &ObjectMeta, proxy_name: Option<&str>) -> bool {
    if label(meta, LABEL_HEADLESS).is_some() {
        return false;
    }
    match label(meta, LABEL_SERVICE_PROXY_NAME) {
        None => true,
        Some(v) => proxy_name == Some(v),
    }
}

/// Parses an IP address field: `Ok(Some)` for IPv4, `Ok(None)` for IPv6 (not
/// ours yet, silently), `Err` for anything else.
fn parse_v4(s: &str) -> Result<Option<Ipv4Addr>, ()> {
    match s.trim().parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => Ok(Some(ip)),
        Ok(IpAddr::V6(_)) => Ok(None),
        Err(_) => Err(()),
    }
}

fn port_u16(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|&p| p != 0)
}

/// One endpoint address as the model sees it, after conditions are read.
#[derive(Clone, Debug)]
struct Ep {
    ip: Ipv4Addr,
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
    node_hints: BTreeSet<String>,
    zone_hints: BTreeSet<String>,
}

impl Ep {
    /// Preference when the same address appears in several slices.
    fn rank(&self) -> u8 {
        if self.ready {
            2
        } else if self.serving && self.terminating {
            1
        } else {
            0
        }
    }
}

/// A slice with its endpoints parsed once (so per-endpoint warnings are issued once).
struct ParsedSlice<'a> {
    slice: &'a EndpointSlice,
    object: String,
    endpoints: Vec<Ep>,
}

/// The backends chosen for one frontend and why.
#[derive(Default)]
struct Selection {
    backends: Vec<BackendAddr>,
    terminating_fallback: bool,
    topology: Option<TopologyMode>,
}

struct Builder<'n> {
    node: Option<&'n NodeInfo>,
    state: DesiredState,
    warnings: Vec<ModelWarning>,
}

impl Builder<'_> {
    fn warn(&mut self, object: impl Into<String>, problem: impl Into<String>) {
        self.warnings.push(ModelWarning {
            object: object.into(),
            problem: problem.into(),
        });
    }

    fn service(&mut self, svc: &Service, ns: &str, name: &str, slices: &[&EndpointSlice]) {
        let object = format!("Service {ns}/{name}");
        let Some(spec) = svc.spec.as_ref() else {
            self.warn(object, "has no spec; skipped");
            return;
        };
        let kind = match spec.type_.as_deref() {
            None | Some("ClusterIP") => FrontendKind::ClusterIp,
            Some("NodePort") => FrontendKind::NodePort,
            Some("LoadBalancer") => FrontendKind::LoadBalancer,
            Some("ExternalName") => return,
            Some(other) => {
                self.warn(object, format!("unknown spec.type {other:?}; skipped"));
                return;
            }
        };

        // Cluster IPs. "None" (headless) or unset: kube-proxy skips the whole Service.
        let raw_ips: Vec<&str> = match spec.cluster_ips.as_deref() {
            Some(list) if !list.is_empty() => list.iter().map(String::as_str).collect(),
            _ => spec.cluster_ip.as_deref().into_iter().collect(),
        };
        if raw_ips.contains(&"None") {
            return;
        }
        if raw_ips.iter().all(|ip| ip.is_empty()) {
            self.warn(
                object,
                "has no spec.clusterIP; skipped (a manifest directory has no IP allocator: set spec.clusterIP)",
            );
            return;
        }
        let mut cluster_ips = Vec::new();
        for raw in raw_ips {
            match parse_v4(raw) {
                Ok(Some(ip)) => cluster_ips.push(ip),
                Ok(None) => {}
                Err(()) => self.warn(&object, format!("clusterIP {raw:?} is not an IP address")),
            }
        }

        let external_ips: Vec<Ipv4Addr> = spec
            .external_ips
            .iter()
            .flatten()
            .filter_map(|raw| match parse_v4(raw) {
                Ok(ip) => ip,
                Err(()) => {
                    self.warn(&object, format!("externalIP {raw:?} is not an IP address"));
                    None
                }
            })
            .collect();

        let mut lb_ips = Vec::new();
        if kind == FrontendKind::LoadBalancer {
            let ingress = svc
                .status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref());
            for ing in ingress.into_iter().flatten() {
                // ipMode Proxy: the load balancer proxies and delivers to the node
                // itself, so kube-proxy programs nothing for this IP.
                if ing.ip_mode.as_deref() == Some("Proxy") {
                    continue;
                }
                let Some(raw) = ing.ip.as_deref() else {
                    continue; // hostname-only ingress: nothing to program
                };
                match parse_v4(raw) {
                    Ok(Some(ip)) => lb_ips.push(ip),
                    Ok(None) => {}
                    Err(()) => self.warn(
                        &object,
                        format!("status.loadBalancer.ingress ip {raw:?} is not an IP address"),
                    ),
                }
            }
            if spec
                .load_balancer_source_ranges
                .as_ref()
                .is_some_and(|r| !r.is_empty())
            {
                self.warn(
                    &object,
                    "loadBalancerSourceRanges is not enforced by switchboard yet: traffic from any source is forwarded",
                );
            }
        }

        let algorithm = self.lb_algorithm(&object, svc);
        let affinity_timeout_s = match spec.session_affinity.as_deref() {
            Some("ClientIP") => {
                let raw = spec
                    .session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds);
                match raw {
                    None => Some(DEFAULT_AFFINITY_TIMEOUT_S),
                    Some(t) => match u32::try_from(t) {
                        Ok(t) if (1..=MAX_AFFINITY_TIMEOUT_S).contains(&t) => Some(t),
                        _ => {
                            self.warn(
                                &object,
                                format!(
                                    "sessionAffinityConfig.clientIP.timeoutSeconds {t} is out of range 1..={MAX_AFFINITY_TIMEOUT_S}; using {DEFAULT_AFFINITY_TIMEOUT_S}"
                                ),
                            );
                            Some(DEFAULT_AFFINITY_TIMEOUT_S)
                        }
                    },
                }
            }
            None | Some("None") => None,
            Some(other) => {
                self.warn(
                    &object,
                    format!("unknown sessionAffinity {other:?}; ignored"),
                );
                None
            }
        };

        // Traffic policies (kube-proxy: ExternalPolicyLocal / InternalPolicyLocal).
        let externally_accessible = kind != FrontendKind::ClusterIp || !external_ips.is_empty();
        let mut external_local =
            externally_accessible && spec.external_traffic_policy.as_deref() == Some("Local");
        let mut internal_local = spec.internal_traffic_policy.as_deref() == Some("Local");
        if self.node.is_none() && (external_local || internal_local) {
            let which = match (internal_local, external_local) {
                (true, true) => "internalTrafficPolicy and externalTrafficPolicy are",
                (true, false) => "internalTrafficPolicy is",
                _ => "externalTrafficPolicy is",
            };
            self.warn(
                &object,
                format!(
                    "{which} Local but this node is unknown (no node name); treated as Cluster"
                ),
            );
            external_local = false;
            internal_local = false;
        }
        let health_check_node_port = if kind == FrontendKind::LoadBalancer && external_local {
            spec.health_check_node_port.and_then(port_u16)
        } else {
            None
        };

        let publish_not_ready = spec.publish_not_ready_addresses == Some(true);
        let parsed: Vec<ParsedSlice> = slices
            .iter()
            .filter_map(|s| self.parse_slice(s, publish_not_ready))
            .collect();

        for sp in spec.ports.iter().flatten() {
            let port_name = sp.name.clone().unwrap_or_default();
            let protocol = match Protocol::from_k8s(sp.protocol.as_deref()) {
                Ok(p) => p,
                Err(problem) => {
                    self.warn(
                        &object,
                        format!("port {}: {problem}", port_display(&port_name, sp.port)),
                    );
                    continue;
                }
            };
            let Some(port) = port_u16(sp.port) else {
                self.warn(
                    &object,
                    format!(
                        "port {}: {} is not a valid port number",
                        port_display(&port_name, sp.port),
                        sp.port
                    ),
                );
                continue;
            };
            let spn = ServicePortName {
                namespace: ns.to_string(),
                name: name.to_string(),
                port: port_name.clone(),
            };

            let eps = self.endpoints_for_port(&parsed, &port_name, protocol);
            let cluster = self.cluster_selection(&eps);
            let local = self.local_selection(&eps);

            let mut addrs: Vec<(FrontendKind, Ipv4Addr, u16)> = Vec::new();
            addrs.extend(
                cluster_ips
                    .iter()
                    .map(|&ip| (FrontendKind::ClusterIp, ip, port)),
            );
            addrs.extend(
                external_ips
                    .iter()
                    .map(|&ip| (FrontendKind::ExternalIp, ip, port)),
            );
            addrs.extend(
                lb_ips
                    .iter()
                    .map(|&ip| (FrontendKind::LoadBalancer, ip, port)),
            );
            if matches!(kind, FrontendKind::NodePort | FrontendKind::LoadBalancer) {
                if let Some(np) = sp.node_port {
                    match (port_u16(np), self.node) {
                        (None, _) => self.warn(
                            &object,
                            format!("port {}: nodePort {np} is not a valid port number", spn.port_or_number(port)),
                        ),
                        (Some(np), Some(node)) if !node.addresses.is_empty() => {
                            addrs.extend(node.addresses.iter().map(|&ip| (FrontendKind::NodePort, ip, np)));
                        }
                        (Some(np), _) => self.warn(
                            &object,
                            format!("nodePort {np}/{protocol} not programmed: this node's addresses are unknown"),
                        ),
                    }
                } else if kind == FrontendKind::NodePort {
                    // The API server always allocates one; a hand-written manifest may lack it.
                    self.warn(
                        &object,
                        format!(
                            "port {}: type NodePort without a nodePort; only the other frontends are programmed (set spec.ports[].nodePort)",
                            spn.port_or_number(port)
                        ),
                    );
                }
            }

            for (fkind, ip, fport) in addrs {
                // Traffic from this node's pods and the host: ClusterIP follows
                // internalTrafficPolicy; external addresses are short-circuited
                // to the cluster-wide set whatever externalTrafficPolicy says
                // (kube-proxy: "pod traffic for .. external destinations" and
                // "route LOCAL traffic .. to service chain" in the EXT chain;
                // UsesClusterEndpoints is true for every externally accessible
                // Service, even with both policies Local). Only traffic from
                // outside the node is held to externalTrafficPolicy: Local.
                let (local_only, sel, external_backends) = if fkind.is_external() {
                    let external = external_local.then(|| local.backends.clone());
                    (external_local, &cluster, external)
                } else if internal_local {
                    (true, &local, None)
                } else {
                    (false, &cluster, None)
                };
                let fe = Frontend {
                    addr: FrontendAddr {
                        ip,
                        port: fport,
                        protocol,
                    },
                    service: spn.clone(),
                    backends: sel.backends.clone(),
                    external_backends,
                    kind: fkind,
                    affinity_timeout_s,
                    local_only,
                    health_check_node_port,
                    terminating_fallback: sel.terminating_fallback,
                    topology: sel.topology,
                    algorithm,
                };
                self.insert(&object, fe);
            }
        }
    }

    /// The `switchboard.io/lb-algorithm` annotation; an unknown value is
    /// reported and the agent's default used.
    fn lb_algorithm(&mut self, object: &str, svc: &Service) -> Option<LbAlgorithm> {
        let value = svc
            .metadata
            .annotations
            .as_ref()?
            .get(ANNOTATION_LB_ALGORITHM)?;
        let algorithm = LbAlgorithm::from_annotation(value);
        if algorithm.is_none() {
            self.warn(
                object,
                format!(
                    "annotation {ANNOTATION_LB_ALGORITHM}: {value:?} is not random, maglev or source-hash; the agent's default is used"
                ),
            );
        }
        algorithm
    }

    fn insert(&mut self, object: &str, fe: Frontend) {
        if let Some(existing) = self.state.frontends.get(&fe.addr) {
            let problem = format!(
                "{} frontend {} is already used by {} ({}); ignored",
                fe.kind, fe.addr, existing.service, existing.kind
            );
            self.warn(object, problem);
            return;
        }
        self.state.frontends.insert(fe.addr, fe);
    }

    /// Reads a slice's endpoints once. `None` for slices that are not IPv4.
    fn parse_slice<'s>(
        &mut self,
        slice: &'s EndpointSlice,
        publish_not_ready: bool,
    ) -> Option<ParsedSlice<'s>> {
        let object = format!(
            "EndpointSlice {}/{}",
            namespace(&slice.metadata),
            slice.metadata.name.as_deref().unwrap_or("?")
        );
        match slice.address_type.as_str() {
            "IPv4" => {}
            "" => {
                self.warn(object, "has no addressType; ignored");
                return None;
            }
            _ => return None, // IPv6 and FQDN slices are not ours
        }
        let mut endpoints = Vec::new();
        for ep in &slice.endpoints {
            let Some(first) = ep.addresses.first() else {
                self.warn(&object, "an endpoint has no addresses; ignored");
                continue;
            };
            if ep.addresses.len() > 1 {
                self.warn(
                    &object,
                    format!(
                        "endpoint {first} lists {} addresses; only the first is used (as kube-proxy does)",
                        ep.addresses.len()
                    ),
                );
            }
            let ip = match first.trim().parse::<Ipv4Addr>() {
                Ok(ip) => ip,
                Err(_) => {
                    self.warn(
                        &object,
                        format!("endpoint address {first:?} is not an IPv4 address; skipped"),
                    );
                    continue;
                }
            };
            endpoints.push(self.endpoint(ep, ip, publish_not_ready));
        }
        Some(ParsedSlice {
            slice,
            object,
            endpoints,
        })
    }

    fn endpoint(&self, ep: &Endpoint, ip: Ipv4Addr, publish_not_ready: bool) -> Ep {
        let c = ep.conditions.as_ref();
        let ready = c.and_then(|c| c.ready).unwrap_or(true);
        let serving = c.and_then(|c| c.serving).unwrap_or(true);
        let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
        let hints = ep.hints.as_ref();
        Ep {
            ip,
            // publishNotReadyAddresses: in a cluster the EndpointSlice controller
            // already marks such endpoints ready; doing it here too makes the
            // manifest-directory source behave the same.
            ready: ready || publish_not_ready,
            serving,
            terminating,
            local: match (self.node, ep.node_name.as_deref()) {
                (Some(n), Some(epn)) => n.name == epn,
                _ => false,
            },
            node_hints: hints
                .and_then(|h| h.for_nodes.as_ref())
                .into_iter()
                .flatten()
                .map(|n| n.name.clone())
                .collect(),
            zone_hints: hints
                .and_then(|h| h.for_zones.as_ref())
                .into_iter()
                .flatten()
                .map(|z| z.name.clone())
                .collect(),
        }
    }

    /// The endpoints serving one Service port across all slices: the slice
    /// port with the same name and protocol gives the target port (per slice),
    /// and an address:port seen in several slices counts once.
    fn endpoints_for_port(
        &mut self,
        parsed: &[ParsedSlice],
        port_name: &str,
        protocol: Protocol,
    ) -> Vec<(BackendAddr, Ep)> {
        let mut merged: BTreeMap<BackendAddr, Ep> = BTreeMap::new();
        for ps in parsed {
            let matching = ps.slice.ports.iter().flatten().find(|p| {
                p.name.as_deref().unwrap_or("") == port_name
                    && Protocol::from_k8s(p.protocol.as_deref()).ok() == Some(protocol)
            });
            let Some(sp) = matching else {
                continue;
            };
            let Some(port) = sp.port.and_then(port_u16) else {
                let what = match sp.port {
                    None => "has no port number".to_string(),
                    Some(p) => format!("has invalid port number {p}"),
                };
                self.warn(
                    &ps.object,
                    format!(
                        "port {:?}/{protocol} {what}; its endpoints are not used for it",
                        port_name
                    ),
                );
                continue;
            };
            for ep in &ps.endpoints {
                let addr = BackendAddr { ip: ep.ip, port };
                match merged.get_mut(&addr) {
                    None => {
                        merged.insert(addr, ep.clone());
                    }
                    Some(prev) => {
                        let local = prev.local || ep.local;
                        if ep.rank() > prev.rank() {
                            *prev = ep.clone();
                        }
                        prev.local = local;
                    }
                }
            }
        }
        merged.into_iter().collect()
    }

    /// kube-proxy's "cluster" endpoints: ready ones (narrowed by topology hints
    /// when usable); if none is ready anywhere, the serving-and-terminating ones.
    fn cluster_selection(&self, eps: &[(BackendAddr, Ep)]) -> Selection {
        let topology = self.node.and_then(|n| topology_mode(eps, n));
        let ready: Vec<BackendAddr> = eps
            .iter()
            .filter(|(_, e)| e.ready)
            .filter(|(_, e)| match (topology, self.node) {
                (Some(TopologyMode::SameNode), Some(n)) => e.node_hints.contains(&n.name),
                (Some(TopologyMode::SameZone), Some(n)) => {
                    n.zone.as_ref().is_some_and(|z| e.zone_hints.contains(z))
                }
                _ => true,
            })
            .map(|(a, _)| *a)
            .collect();
        if !ready.is_empty() {
            return Selection {
                backends: ready,
                terminating_fallback: false,
                topology,
            };
        }
        let fallback: Vec<BackendAddr> = eps
            .iter()
            .filter(|(_, e)| e.serving && e.terminating)
            .map(|(a, _)| *a)
            .collect();
        Selection {
            terminating_fallback: !fallback.is_empty(),
            backends: fallback,
            topology: None,
        }
    }

    /// kube-proxy's "local" endpoints: this node's ready ones, or if it has
    /// none, this node's serving-and-terminating ones.
    fn local_selection(&self, eps: &[(BackendAddr, Ep)]) -> Selection {
        let local_ready: Vec<BackendAddr> = eps
            .iter()
            .filter(|(_, e)| e.local && e.ready)
            .map(|(a, _)| *a)
            .collect();
        if !local_ready.is_empty() {
            return Selection {
                backends: local_ready,
                ..Selection::default()
            };
        }
        let fallback: Vec<BackendAddr> = eps
            .iter()
            .filter(|(_, e)| e.local && e.serving && e.terminating)
            .map(|(a, _)| *a)
            .collect();
        Selection {
            terminating_fallback: !fallback.is_empty(),
            backends: fallback,
            topology: None,
        }
    }
}

/// Topology hints are used only when every ready endpoint carries them and at
/// least one is meant for this node (node hints) or its zone (zone hints);
/// node hints take precedence (kube-proxy's PreferSameNode, then PreferSameZone).
fn topology_mode(eps: &[(BackendAddr, Ep)], node: &NodeInfo) -> Option<TopologyMode> {
    let ready: Vec<&Ep> = eps.iter().map(|(_, e)| e).filter(|e| e.ready).collect();
    if ready.is_empty() {
        return None;
    }
    if ready.iter().all(|e| !e.node_hints.is_empty())
        && ready.iter().any(|e| e.node_hints.contains(&node.name))
    {
        return Some(TopologyMode::SameNode);
    }
    let zone = node.zone.as_ref()?;
    if ready.iter().all(|e| !e.zone_hints.is_empty())
        && ready.iter().any(|e| e.zone_hints.contains(zone))
    {
        return Some(TopologyMode::SameZone);
    }
    None
}

fn port_display(name: &str, number: i32) -> String {
    if name.is_empty() {
        number.to_string()
    } else {
        format!("{name:?}")
    }
}

impl ServicePortName {
    fn port_or_number(&self, number: u16) -> String {
        port_display(&self.port, i32::from(number))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize as _;

    /// Services and EndpointSlices from a multi-document manifest.
    fn objects(yaml: &str) -> (Vec<Service>, Vec<EndpointSlice>) {
        let mut services = Vec::new();
        let mut slices = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(yaml) {
            let value = serde_yaml::Value::deserialize(doc).expect("test YAML parses");
            if value.is_null() {
                continue;
            }
            match value["kind"].as_str() {
                Some("Service") => services.push(serde_yaml::from_value(value).expect("a Service")),
                Some("EndpointSlice") => {
                    slices.push(serde_yaml::from_value(value).expect("an EndpointSlice"))
                }
                other => panic!("unexpected kind {other:?} in test YAML"),
            }
        }
        (services, slices)
    }

    #[derive(Clone, Copy, Debug)]
    enum NodeSel {
        /// No node knowledge (what `build` does).
        Unknown,
        /// node-a, addresses 192.168.1.10 and 203.0.113.10, zone zone-a.
        A,
        /// node-a without a zone label.
        ANoZone,
    }

    fn node(sel: NodeSel) -> Option<NodeInfo> {
        let a = NodeInfo {
            name: "node-a".into(),
            addresses: vec![
                Ipv4Addr::new(192, 168, 1, 10),
                Ipv4Addr::new(203, 0, 113, 10),
            ],
            zone: Some("zone-a".into()),
            deleting: false,
        };
        match sel {
            NodeSel::Unknown => None,
            NodeSel::A => Some(a),
            NodeSel::ANoZone => Some(NodeInfo { zone: None, ..a }),
        }
    }

    struct Case {
        name: &'static str,
        node: NodeSel,
        proxy_name: Option<&'static str>,
        yaml: &'static str,
        /// Every frontend, rendered with `Frontend`'s Display (which shows every field).
        frontends: &'static [&'static str],
        warnings: &'static [&'static str],
    }

    fn run(cases: &[Case]) {
        let mut failed = Vec::new();
        for c in cases {
            let (services, slices) = objects(c.yaml);
            let node = node(c.node);
            let (state, warnings) = build_for_node(&services, &slices, node.as_ref(), c.proxy_name);
            for (k, f) in &state.frontends {
                assert_eq!(*k, f.addr, "{}: key and frontend address differ", c.name);
                let mut sorted = f.backends.clone();
                sorted.sort();
                sorted.dedup();
                assert_eq!(
                    sorted, f.backends,
                    "{}: backends not sorted+deduplicated",
                    c.name
                );
                if let Some(external) = &f.external_backends {
                    let mut sorted = external.clone();
                    sorted.sort();
                    sorted.dedup();
                    assert_eq!(
                        &sorted, external,
                        "{}: external backends not sorted+deduplicated",
                        c.name
                    );
                }
                assert_eq!(
                    f.external_backends.is_some(),
                    f.local_only && f.kind.is_external(),
                    "{}: external_backends is set exactly for Local external frontends",
                    c.name
                );
            }
            let got: Vec<String> = state.frontends.values().map(ToString::to_string).collect();
            let got_w: Vec<String> = warnings.iter().map(ToString::to_string).collect();
            if got != c.frontends || got_w != c.warnings {
                failed.push(format!(
                    "case {}:\n  frontends want {:#?}\n            got  {:#?}\n  warnings want {:#?}\n           got  {:#?}",
                    c.name, c.frontends, got, c.warnings, got_w
                ));
            }
        }
        assert!(
            failed.is_empty(),
            "{} case(s) failed:\n{}",
            failed.len(),
            failed.join("\n")
        );
    }

    /// The plainest case, asserted field by field against the struct (the
    /// table tests compare the Display rendering, which shows every field).
    #[test]
    fn clusterip_exact_state() {
        let (services, slices) = objects(
            r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
- addresses: [10.244.1.3]
- addresses: [10.244.1.2]
  conditions: {ready: true}
"#,
        );
        let (state, warnings) = build(&services, &slices);
        assert!(warnings.is_empty(), "{warnings:?}");
        let addr = FrontendAddr {
            ip: Ipv4Addr::new(10, 96, 0, 10),
            port: 80,
            protocol: Protocol::Tcp,
        };
        let want = DesiredState {
            frontends: BTreeMap::from([(
                addr,
                Frontend {
                    addr,
                    service: ServicePortName {
                        namespace: "shop".into(),
                        name: "web".into(),
                        port: "http".into(),
                    },
                    backends: vec![
                        BackendAddr {
                            ip: Ipv4Addr::new(10, 244, 1, 2),
                            port: 8080,
                        },
                        BackendAddr {
                            ip: Ipv4Addr::new(10, 244, 1, 3),
                            port: 8080,
                        },
                    ],
                    external_backends: None,
                    kind: FrontendKind::ClusterIp,
                    affinity_timeout_s: None,
                    local_only: false,
                    health_check_node_port: None,
                    terminating_fallback: false,
                    topology: None,
                    algorithm: None,
                },
            )]),
        };
        assert_eq!(state, want);
    }

    #[test]
    fn displays() {
        let f = FrontendAddr {
            ip: Ipv4Addr::new(10, 96, 0, 10),
            port: 80,
            protocol: Protocol::Tcp,
        };
        assert_eq!(f.to_string(), "10.96.0.10:80/TCP");
        assert_eq!(Protocol::Udp.to_string(), "UDP");
        let b = BackendAddr {
            ip: Ipv4Addr::new(10, 244, 1, 2),
            port: 8080,
        };
        assert_eq!(b.to_string(), "10.244.1.2:8080");
        let mut spn = ServicePortName {
            namespace: "ns".into(),
            name: "name".into(),
            port: "port".into(),
        };
        assert_eq!(spn.to_string(), "ns/name:port");
        spn.port.clear();
        assert_eq!(spn.to_string(), "ns/name");
        let w = ModelWarning {
            object: "Service ns/name".into(),
            problem: "SCTP is not supported".into(),
        };
        assert_eq!(w.to_string(), "Service ns/name: SCTP is not supported");
    }

    #[test]
    fn node_info_from_node() {
        let k8s_node: Node = serde_yaml::from_str(
            r#"
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
status:
  addresses:
  - {type: Hostname, address: node-a}
  - {type: ExternalIP, address: 203.0.113.10}
  - {type: InternalIP, address: 192.168.1.10}
  - {type: InternalIP, address: "fd00::10"}
  - {type: InternalIP, address: 192.168.1.10}
"#,
        )
        .expect("a Node");
        assert_eq!(
            NodeInfo::from_node(&k8s_node),
            node(NodeSel::A).expect("node A")
        );
        let bare: Node = serde_yaml::from_str("apiVersion: v1\nkind: Node\nmetadata: {name: n}\n")
            .expect("a Node");
        assert_eq!(
            NodeInfo::from_node(&bare),
            NodeInfo {
                name: "n".into(),
                addresses: vec![],
                zone: None,
                deleting: false,
            }
        );
    }

    /// Issue 2: ClusterIP Services from manifests.
    #[test]
    fn cluster_ip_rules() {
        run(&[
            Case {
                name: "one ClusterIP port, ready and condition-less endpoints",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- {addresses: [10.244.1.2], conditions: {ready: true}}
- {addresses: [10.244.1.3]}
- {addresses: [10.244.1.4], conditions: {}}
- {addresses: [10.244.1.5], conditions: {ready: false}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.1.3:8080, 10.244.1.4:8080"],
                warnings: &[],
            },
            Case {
                name: "unnamed port, protocol absent means TCP on both sides",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP shop/web -> 10.244.1.2:8080"],
                warnings: &[],
            },
            Case {
                name: "multi-port TCP and UDP, each resolved by name and protocol",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: kube-system}
spec:
  clusterIP: 10.96.0.53
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: kube-system, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports:
- {name: dns, port: 5353, protocol: UDP}
- {name: dns-tcp, port: 5354, protocol: TCP}
- {name: metrics, port: 9153, protocol: TCP}
endpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.2.2]}]
"#,
                frontends: &[
                    "10.96.0.53:53/TCP ClusterIP kube-system/dns:dns-tcp -> 10.244.1.2:5354, 10.244.2.2:5354",
                    "10.96.0.53:53/UDP ClusterIP kube-system/dns:dns -> 10.244.1.2:5353, 10.244.2.2:5353",
                    "10.96.0.53:9153/TCP ClusterIP kube-system/dns:metrics -> 10.244.1.2:9153, 10.244.2.2:9153",
                ],
                warnings: &[],
            },
            Case {
                name: "a slice port of the right name but the wrong protocol does not match",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: dns}
spec:
  clusterIP: 10.96.0.53
  ports: [{name: dns, port: 53, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
ports: [{name: dns, port: 53, protocol: UDP}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &["10.96.0.53:53/TCP ClusterIP default/dns:dns -> (none)"],
                warnings: &[],
            },
            Case {
                name: "clusterIPs (dual-stack) wins over clusterIP; IPv6 is silently not ours",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.99
  clusterIPs: ["fd00::10", 10.96.0.10]
  ports: [{port: 80}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"],
                warnings: &[],
            },
            Case {
                name: "IPv6-only Service: nothing, no warning",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web6}
spec:
  clusterIP: "fd00::10"
  ports: [{port: 80}]
"#,
                frontends: &[],
                warnings: &[],
            },
            Case {
                name: "headless (clusterIP None) and ExternalName Services are skipped silently",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: db}
spec:
  clusterIP: None
  ports: [{port: 5432}]
---
apiVersion: v1
kind: Service
metadata: {name: db6}
spec:
  clusterIPs: [None]
  ports: [{port: 5432}]
---
apiVersion: v1
kind: Service
metadata: {name: ext}
spec:
  type: ExternalName
  externalName: example.com
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: db-1, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
ports: [{port: 5432}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &[],
                warnings: &[],
            },
            Case {
                name: "SCTP port is reported, the other ports still work",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: sig}
spec:
  clusterIP: 10.96.0.20
  ports:
  - {name: sctp, port: 3868, protocol: SCTP}
  - {name: tcp, port: 3868, protocol: TCP}
"#,
                frontends: &["10.96.0.20:3868/TCP ClusterIP default/sig:tcp -> (none)"],
                warnings: &["Service default/sig: port \"sctp\": SCTP is not supported"],
            },
            Case {
                name: "a port with no ready endpoints still gets a frontend with no backends",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2], conditions: {ready: false}}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"],
                warnings: &[],
            },
            Case {
                name: "a Service without any EndpointSlice gets a frontend with no backends",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lonely}
spec:
  clusterIP: 10.96.0.11
  ports: [{port: 80}]
"#,
                frontends: &["10.96.0.11:80/TCP ClusterIP default/lonely -> (none)"],
                warnings: &[],
            },
            Case {
                name: "all slices of the Service are joined; duplicates across slices count once",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.1.3]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.3]}, {addresses: [10.244.2.9]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.1.3:8080, 10.244.2.9:8080"],
                warnings: &[],
            },
            Case {
                name: "a duplicate that is ready in one slice and not in another counts as ready",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2], conditions: {ready: false}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2], conditions: {ready: true}}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080"],
                warnings: &[],
            },
            Case {
                name: "target port resolved per slice: the same port name maps to different numbers",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-old, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-new, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 9090}, {name: admin, port: 9091}]
endpoints: [{addresses: [10.244.1.3]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-other, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: admin, port: 9091}]
endpoints: [{addresses: [10.244.1.4]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080, 10.244.1.3:9090"],
                warnings: &[],
            },
            Case {
                name: "FQDN and IPv6 slices are ignored",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-fqdn, labels: {kubernetes.io/service-name: web}}
addressType: FQDN
ports: [{port: 8080}]
endpoints: [{addresses: [pod.example.com]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{port: 8080}]
endpoints: [{addresses: ["fd00::2"]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080"],
                warnings: &[],
            },
            Case {
                name: "slices join only through the label and in the same namespace",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: a}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: b, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, namespace: a}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.3]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-3, namespace: a, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.4]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP a/web -> 10.244.1.4:8080"],
                warnings: &[],
            },
            Case {
                name: "an endpoint address that is not IPv4 is reported and skipped, the rest works",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}, {addresses: [10.244.1.300]}, {addresses: [10.244.1.3]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080"],
                warnings: &["EndpointSlice default/web-1: endpoint address \"10.244.1.300\" is not an IPv4 address; skipped"],
            },
            Case {
                name: "an endpoint with several addresses uses the first, as kube-proxy does",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2, 10.244.1.3]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080"],
                warnings: &["EndpointSlice default/web-1: endpoint 10.244.1.2 lists 2 addresses; only the first is used (as kube-proxy does)"],
            },
            Case {
                name: "a matching slice port without a number is reported; the other slices still count",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http}]
endpoints: [{addresses: [10.244.1.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-2, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.244.1.3]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.3:8080"],
                warnings: &["EndpointSlice default/web-1: port \"http\"/TCP has no port number; its endpoints are not used for it"],
            },
            Case {
                name: "Services (and slices) labelled for another proxy or as headless are skipped",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: other, labels: {service.kubernetes.io/service-proxy-name: cilium}}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: hl, labels: {service.kubernetes.io/headless: ""}}
spec:
  clusterIP: 10.96.0.11
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: mine}
spec:
  clusterIP: 10.96.0.12
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: mine-1
  labels: {kubernetes.io/service-name: mine, service.kubernetes.io/headless: ""}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: mine-2, labels: {kubernetes.io/service-name: mine}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.3]}]
"#,
                frontends: &["10.96.0.12:80/TCP ClusterIP default/mine -> 10.244.1.3:8080"],
                warnings: &[],
            },
            Case {
                name: "a malformed Service is reported and does not affect the others",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: bad}
spec:
  clusterIP: 10.96.0.300
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: badport}
spec:
  clusterIP: 10.96.0.13
  ports: [{name: zero, port: 0}, {name: big, port: 70000}, {name: ok, port: 81}]
---
apiVersion: v1
kind: Service
metadata: {name: good}
spec:
  clusterIP: 10.96.0.12
  ports: [{port: 80}]
"#,
                frontends: &[
                    "10.96.0.12:80/TCP ClusterIP default/good -> (none)",
                    "10.96.0.13:81/TCP ClusterIP default/badport:ok -> (none)",
                ],
                warnings: &[
                    "Service default/bad: clusterIP \"10.96.0.300\" is not an IP address",
                    "Service default/badport: port \"big\": 70000 is not a valid port number",
                    "Service default/badport: port \"zero\": 0 is not a valid port number",
                ],
            },
            Case {
                name: "a Service without a clusterIP is reported (no allocator in a manifest directory)",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: noip}
spec:
  ports: [{port: 80}]
"#,
                frontends: &[],
                warnings: &["Service default/noip: has no spec.clusterIP; skipped (a manifest directory has no IP allocator: set spec.clusterIP)"],
            },
            Case {
                name: "two Services claiming one frontend: the first (by namespace/name) keeps it",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: zeta}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}, {name: other, port: 81}]
---
apiVersion: v1
kind: Service
metadata: {name: alpha}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/alpha -> (none)",
                    "10.96.0.10:81/TCP ClusterIP default/zeta:other -> (none)",
                ],
                warnings: &["Service default/zeta: ClusterIP frontend 10.96.0.10:80/TCP is already used by default/alpha (ClusterIP); ignored"],
            },
        ]);
    }

    /// Issue 3: Service types other than ClusterIP.
    #[test]
    fn service_type_rules() {
        run(&[
            Case {
                name: "NodePort: ClusterIP plus the node port on each node address",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{port: 80, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080",
                    "192.168.1.10:30080/TCP NodePort default/web -> 10.244.1.2:8080",
                    "203.0.113.10:30080/TCP NodePort default/web -> 10.244.1.2:8080",
                ],
                warnings: &[],
            },
            Case {
                name: "NodePort Service port without a nodePort (hand-written manifest) is reported",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web:http -> (none)"],
                warnings: &["Service default/web: port \"http\": type NodePort without a nodePort; only the other frontends are programmed (set spec.ports[].nodePort)"],
            },
            Case {
                name: "NodePort without node addresses is reported, the ClusterIP still works",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{port: 80, nodePort: 30080}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"],
                warnings: &["Service default/web: nodePort 30080/TCP not programmed: this node's addresses are unknown"],
            },
            Case {
                name: "LoadBalancer: ingress IPs (IPv6, hostname-only and ipMode Proxy skipped) and node ports",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  loadBalancerIP: 198.51.100.99
  ports: [{port: 443, nodePort: 30443}]
status:
  loadBalancer:
    ingress:
    - {ip: 198.51.100.7}
    - {ip: 198.51.100.8, ipMode: VIP}
    - {ip: 198.51.100.9, ipMode: Proxy}
    - {ip: "2001:db8::7"}
    - {hostname: lb.example.com}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, labels: {kubernetes.io/service-name: lb}}
addressType: IPv4
ports: [{port: 8443}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &[
                    "10.96.0.10:443/TCP ClusterIP default/lb -> 10.244.1.2:8443",
                    "192.168.1.10:30443/TCP NodePort default/lb -> 10.244.1.2:8443",
                    "198.51.100.7:443/TCP LoadBalancer default/lb -> 10.244.1.2:8443",
                    "198.51.100.8:443/TCP LoadBalancer default/lb -> 10.244.1.2:8443",
                    "203.0.113.10:30443/TCP NodePort default/lb -> 10.244.1.2:8443",
                ],
                warnings: &[],
            },
            Case {
                name: "LoadBalancer without node ports (allocateLoadBalancerNodePorts: false) and not yet provisioned",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  clusterIP: 10.96.0.10
  ports: [{port: 443}]
"#,
                frontends: &["10.96.0.10:443/TCP ClusterIP default/lb -> (none)"],
                warnings: &[],
            },
            Case {
                name: "loadBalancerSourceRanges is reported as not enforced",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: lb}
spec:
  type: LoadBalancer
  allocateLoadBalancerNodePorts: false
  clusterIP: 10.96.0.10
  loadBalancerSourceRanges: [10.0.0.0/8]
  ports: [{port: 443}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}]}}
"#,
                frontends: &[
                    "10.96.0.10:443/TCP ClusterIP default/lb -> (none)",
                    "198.51.100.7:443/TCP LoadBalancer default/lb -> (none)",
                ],
                warnings: &["Service default/lb: loadBalancerSourceRanges is not enforced by switchboard yet: traffic from any source is forwarded"],
            },
            Case {
                name: "ingress status on a non-LoadBalancer Service is ignored",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none)"],
                warnings: &[],
            },
            Case {
                name: "externalIPs on any type, every port; bad ones reported, IPv6 ignored",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalIPs: [198.51.100.20, "2001:db8::20", not-an-ip]
  ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: dns, port: 5353, protocol: UDP}]
endpoints: [{addresses: [10.244.1.2]}]
"#,
                frontends: &[
                    "10.96.0.10:53/UDP ClusterIP default/web:dns -> 10.244.1.2:5353",
                    "10.96.0.10:80/TCP ClusterIP default/web:http -> 10.244.1.2:8080",
                    "198.51.100.20:53/UDP ExternalIP default/web:dns -> 10.244.1.2:5353",
                    "198.51.100.20:80/TCP ExternalIP default/web:http -> 10.244.1.2:8080",
                ],
                warnings: &["Service default/web: externalIP \"not-an-ip\" is not an IP address"],
            },
            Case {
                name: "unknown Service type is reported and skipped",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: odd}
spec:
  type: Magic
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
"#,
                frontends: &[],
                warnings: &["Service default/odd: unknown spec.type \"Magic\"; skipped"],
            },
        ]);
    }

    /// Issue 3: endpoint conditions.
    #[test]
    fn condition_rules() {
        run(&[
            Case {
                name: "no ready endpoint: fall back to serving+terminating ones",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.1.3], conditions: {ready: false, serving: false, terminating: true}}
- {addresses: [10.244.1.4], conditions: {ready: false, serving: true, terminating: false}}
- {addresses: [10.244.1.5], conditions: {ready: false, terminating: true}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.5:8080 [terminating fallback]"],
                warnings: &[],
            },
            Case {
                name: "one ready endpoint: terminating ones are not used",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.1.3], conditions: {ready: true, serving: true, terminating: false}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.3:8080"],
                warnings: &[],
            },
            Case {
                name: "publishNotReadyAddresses: not-ready endpoints are used",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: peers}
spec:
  clusterIP: 10.96.0.10
  publishNotReadyAddresses: true
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: peers-1, labels: {kubernetes.io/service-name: peers}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], conditions: {ready: false}}
- {addresses: [10.244.1.3], conditions: {ready: true}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/peers -> 10.244.1.2:8080, 10.244.1.3:8080"],
                warnings: &[],
            },
        ]);
    }

    /// Issue 3: the service-proxy-name label with a name of our own.
    #[test]
    fn proxy_name_rules() {
        let yaml = r#"
apiVersion: v1
kind: Service
metadata: {name: ours, labels: {service.kubernetes.io/service-proxy-name: switchboard}}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: theirs, labels: {service.kubernetes.io/service-proxy-name: cilium}}
spec:
  clusterIP: 10.96.0.11
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: plain}
spec:
  clusterIP: 10.96.0.12
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ours-1
  labels: {kubernetes.io/service-name: ours, service.kubernetes.io/service-proxy-name: switchboard}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.1.2]}]
"#;
        run(&[
            Case {
                name: "with our name: labelled for us and unlabelled are ours",
                node: NodeSel::Unknown,
                proxy_name: Some("switchboard"),
                yaml,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/ours -> 10.244.1.2:8080",
                    "10.96.0.12:80/TCP ClusterIP default/plain -> (none)",
                ],
                warnings: &[],
            },
            Case {
                name: "without a name (kube-proxy): any label means another proxy",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml,
                frontends: &["10.96.0.12:80/TCP ClusterIP default/plain -> (none)"],
                warnings: &[],
            },
        ]);
    }

    const POLICY_SLICE: &str = r#"
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-a}
- {addresses: [10.244.2.2], nodeName: node-b}
- {addresses: [10.244.1.3], nodeName: node-a, conditions: {ready: false}}
"#;

    fn with_slice(service: &str) -> &'static str {
        Box::leak(format!("{service}{POLICY_SLICE}").into_boxed_str())
    }

    /// Issue 3: traffic policies.
    #[test]
    fn traffic_policy_rules() {
        run(&[
            Case {
                name: "externalTrafficPolicy Local: outside traffic to external frontends gets local endpoints, node traffic (pods, host) all; ClusterIP all; health check port recorded",
                node: NodeSel::A,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
  ports: [{port: 80, nodePort: 30080}]
status: {loadBalancer: {ingress: [{ip: 198.51.100.7}]}}
"#,
                ),
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080 [healthCheckNodePort 32000]",
                    "192.168.1.10:30080/TCP NodePort default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only, healthCheckNodePort 32000]",
                    "198.51.100.7:80/TCP LoadBalancer default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only, healthCheckNodePort 32000]",
                    "203.0.113.10:30080/TCP NodePort default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only, healthCheckNodePort 32000]",
                ],
                warnings: &[],
            },
            Case {
                name: "internalTrafficPolicy Local: ClusterIP uses local endpoints, external frontends all",
                node: NodeSel::A,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  externalIPs: [198.51.100.20]
  ports: [{port: 80}]
"#,
                ),
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080 [local-only]",
                    "198.51.100.20:80/TCP ExternalIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080",
                ],
                warnings: &[],
            },
            Case {
                name: "externalTrafficPolicy Local on a ClusterIP Service with externalIPs governs the external IPs",
                node: NodeSel::A,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  externalIPs: [198.51.100.20]
  ports: [{port: 80}]
"#,
                ),
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080",
                    "198.51.100.20:80/TCP ExternalIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only]",
                ],
                warnings: &[],
            },
            Case {
                name: "both policies Local: ClusterIP local-only, external frontends still cluster-wide for node traffic (kube-proxy keeps cluster endpoints for the short-circuit)",
                node: NodeSel::A,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  externalTrafficPolicy: Local
  ports: [{port: 80, nodePort: 30080}]
"#,
                ),
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080 [local-only]",
                    "192.168.1.10:30080/TCP NodePort default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only]",
                    "203.0.113.10:30080/TCP NodePort default/web -> 10.244.1.2:8080, 10.244.2.2:8080; from outside -> 10.244.1.2:8080 [local-only]",
                ],
                warnings: &[],
            },
            Case {
                name: "externalTrafficPolicy Local with no local endpoint: node traffic still reaches the cluster, outside traffic none",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  externalIPs: [198.51.100.20]
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.2.2], nodeName: node-b}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.2.2:8080",
                    "198.51.100.20:80/TCP ExternalIP default/web -> 10.244.2.2:8080; from outside -> (none) [local-only]",
                ],
                warnings: &[],
            },
            Case {
                name: "externalTrafficPolicy Local on a plain ClusterIP Service has no effect",
                node: NodeSel::A,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  ports: [{port: 80}]
"#,
                ),
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &[],
            },
            Case {
                name: "Local with no local endpoint: no backends (traffic dropped, as kube-proxy does)",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints: [{addresses: [10.244.2.2], nodeName: node-b}, {addresses: [10.244.2.3]}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none) [local-only]"],
                warnings: &[],
            },
            Case {
                name: "Local: no local ready endpoint, fall back to local serving+terminating ones",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}
- {addresses: [10.244.2.2], nodeName: node-b, conditions: {ready: true}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080 [local-only, terminating fallback]"],
                warnings: &[],
            },
            Case {
                name: "Local policies without node knowledge are reported and treated as Cluster",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  ports: [{port: 80}]
"#,
                ),
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &["Service default/web: internalTrafficPolicy is Local but this node is unknown (no node name); treated as Cluster"],
            },
            Case {
                name: "externalTrafficPolicy Local without node knowledge is reported; outside traffic gets all endpoints",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: with_slice(
                    r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  externalIPs: [198.51.100.20]
  ports: [{port: 80}]
"#,
                ),
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080",
                    "198.51.100.20:80/TCP ExternalIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080",
                ],
                warnings: &["Service default/web: externalTrafficPolicy is Local but this node is unknown (no node name); treated as Cluster"],
            },
        ]);
    }

    /// Issue 3: topology hints.
    #[test]
    fn topology_rules() {
        run(&[
            Case {
                name: "zone hints on every endpoint, one for our zone: only those",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], zone: zone-a, hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.2], zone: zone-b, hints: {forZones: [{name: zone-b}]}}
- {addresses: [10.244.3.2], zone: zone-c, hints: {forZones: [{name: zone-c}, {name: zone-a}]}}
- {addresses: [10.244.4.2], conditions: {ready: false}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.3.2:8080 [topology same-zone]"],
                warnings: &[],
            },
            Case {
                name: "one ready endpoint without hints: hints are not used",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.2]}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &[],
            },
            Case {
                name: "no hint for our zone: hints are not used",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], hints: {forZones: [{name: zone-b}]}}
- {addresses: [10.244.2.2], hints: {forZones: [{name: zone-c}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &[],
            },
            Case {
                name: "node without a zone label: zone hints are not used",
                node: NodeSel::ANoZone,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.2], hints: {forZones: [{name: zone-b}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &[],
            },
            Case {
                name: "unknown node: hints are not used",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.2], hints: {forZones: [{name: zone-b}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.2.2:8080"],
                warnings: &[],
            },
            Case {
                name: "node hints on every endpoint, one for this node: same-node wins over zone hints",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  trafficDistribution: PreferSameNode
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-a, hints: {forNodes: [{name: node-a}], forZones: [{name: zone-a}]}}
- {addresses: [10.244.1.9], nodeName: node-x, hints: {forNodes: [{name: node-x}], forZones: [{name: zone-a}]}}
- {addresses: [10.244.2.2], nodeName: node-b, hints: {forNodes: [{name: node-b}], forZones: [{name: zone-b}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080 [topology same-node]"],
                warnings: &[],
            },
            Case {
                name: "hints do not apply to Local policy frontends",
                node: NodeSel::A,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  internalTrafficPolicy: Local
  ports: [{port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{port: 8080}]
endpoints:
- {addresses: [10.244.1.2], nodeName: node-a, hints: {forZones: [{name: zone-b}]}}
- {addresses: [10.244.1.3], nodeName: node-a, hints: {forZones: [{name: zone-a}]}}
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> 10.244.1.2:8080, 10.244.1.3:8080 [local-only]"],
                warnings: &[],
            },
        ]);
    }

    /// Issue 3: session affinity.
    #[test]
    fn session_affinity_rules() {
        run(&[
            Case {
                name: "ClientIP with the default timeout, on every frontend of the Service",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  externalIPs: [198.51.100.20]
  sessionAffinity: ClientIP
  ports: [{port: 80}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> (none) [affinity 10800s]",
                    "198.51.100.20:80/TCP ExternalIP default/web -> (none) [affinity 10800s]",
                ],
                warnings: &[],
            },
            Case {
                name: "ClientIP with an explicit timeout",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports: [{port: 80}]
"#,
                frontends: &["10.96.0.10:80/TCP ClusterIP default/web -> (none) [affinity 60s]"],
                warnings: &[],
            },
            Case {
                name: "an out-of-range timeout is reported and replaced by the default; None means no affinity",
                node: NodeSel::Unknown,
                proxy_name: None,
                yaml: r#"
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  clusterIP: 10.96.0.10
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 0}}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: web2}
spec:
  clusterIP: 10.96.0.11
  sessionAffinity: None
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  ports: [{port: 80}]
"#,
                frontends: &[
                    "10.96.0.10:80/TCP ClusterIP default/web -> (none) [affinity 10800s]",
                    "10.96.0.11:80/TCP ClusterIP default/web2 -> (none)",
                ],
                warnings: &["Service default/web: sessionAffinityConfig.clientIP.timeoutSeconds 0 is out of range 1..=86400; using 10800"],
            },
        ]);
    }
}
