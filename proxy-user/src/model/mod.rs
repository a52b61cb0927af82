//! The pure model: Services and EndpointSlices (and, when known, this node) in,
//! the desired set of frontends with their backends out.
//!
//! Nothing here touches the network, the maps or the clock. The agent keeps
//! one [`Model`] that both sources (the Kubernetes API and a directory of
//! manifests) feed with per-object changes; each update says which frontends
//! changed, and the map sync writes only those. [`build_for_node`] builds the
//! same state from whole objects at once (the CLI and the tests).
//!
//! The rules follow kube-proxy (pkg/proxy: `ShouldSkipService`, the
//! EndpointSlice cache and `CategorizeEndpoints`). Where this model deviates, or
//! adds something kube-proxy leaves to another component, the item says so.
//!
//! Input problems never panic and never abort the whole build: the object at
//! fault is skipped (or only the bad part of it) and a [`ModelWarning`] names it.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

pub mod cidr;
mod endpoints;
mod incremental;
pub mod input;
mod packed;
mod service;
mod slice_endpoint;
mod validate;

pub use incremental::{Model, ModelDelta, ObjectKind, Rejection};
pub use input::{
    EndpointInfo, Hints, Interner, IpFamilyPolicy, Keyed, LbIngress, ObjectKey, ProxyLabels,
    RareSpec, Raw, RawAddress, ServiceInfo, ServicePortInfo, ServiceSpecInfo, SliceInfo,
    SlicePortInfo,
};
pub use packed::{Address, Endpoint, Endpoints};

/// Label on an EndpointSlice naming the Service it belongs to (same namespace).
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label on a Service that hands it to another proxy implementation.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// Label marking a headless Service (and its EndpointSlices).
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Node label carrying the node's zone, used by topology hints.
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// Service annotation choosing how traffic from outside the node picks a
/// backend: `random`, `maglev`, `source-hash`, `round-robin` or
/// `least-conn` ([`LbAlgorithm`]).
pub const ANNOTATION_LB_ALGORITHM: &str = "switchboard.io/lb-algorithm";
/// EndpointSlice annotation giving its endpoints weights:
/// `address=weight` pairs separated by commas (`10.244.1.5=3,10.244.2.7=0`),
/// weights `0..=65535`; an endpoint not listed weighs 1 (IPVS's default).
/// Weight 0 drains an endpoint: no new flows, its open flows stay. Read by
/// every algorithm ([`Frontend::weights`]).
pub const ANNOTATION_WEIGHTS: &str = "switchboard.io/weights";
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

/// An address family. A frontend of one family gets only that family's
/// endpoints (kube-proxy reads only the EndpointSlices of the frontend's
/// address type), and each family has its own maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(ip: IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// The Kubernetes spelling (`ipFamilies`, `addressType`): `IPv4`, `IPv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }

    fn from_k8s(value: &str) -> Option<IpFamily> {
        match value {
            "IPv4" => Some(IpFamily::V4),
            "IPv6" => Some(IpFamily::V6),
            _ => None,
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `ip:port` as Kubernetes prints it: IPv6 addresses in brackets
/// (`[fd00::1]:80`).
fn write_ip_port(f: &mut fmt::Formatter<'_>, ip: IpAddr, port: u16) -> fmt::Result {
    match ip {
        IpAddr::V4(ip) => write!(f, "{ip}:{port}"),
        IpAddr::V6(ip) => write!(f, "[{ip}]:{port}"),
    }
}

/// What a client addresses: `10.96.0.10:80/TCP`, `[fd00::10]:80/TCP`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct FrontendAddr {
    pub ip: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

impl FrontendAddr {
    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.ip)
    }
}

impl fmt::Display for FrontendAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_ip_port(f, self.ip, self.port)?;
        write!(f, "/{}", self.protocol)
    }
}

/// Where a connection is sent: `10.244.1.2:8080`, `[fd00:10:244::2]:8080`
/// (same protocol and family as its frontend).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct BackendAddr {
    pub ip: IpAddr,
    pub port: u16,
}

impl BackendAddr {
    pub fn family(&self) -> IpFamily {
        IpFamily::of(self.ip)
    }
}

impl fmt::Display for BackendAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_ip_port(f, self.ip, self.port)
    }
}

/// A Service port, named as kube-proxy names it: `ns/name:port`, or `ns/name`
/// when the port has no name (single-port Services).
///
/// Every frontend names its Service port, so the strings are shared: the
/// namespace and name with the Service's [`ObjectKey`], the port name by
/// every frontend of the port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct ServicePortName {
    #[serde(serialize_with = "serialize_str")]
    pub namespace: Arc<str>,
    #[serde(serialize_with = "serialize_str")]
    pub name: Arc<str>,
    #[serde(serialize_with = "serialize_str")]
    pub port: Arc<str>,
}

fn serialize_str<S: serde::Serializer>(s: &Arc<str>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(s)
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
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    clap::ValueEnum,
)]
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
    /// Each new flow to the next backend in turn, strictly per node (one
    /// atomic add on a per-service cursor; IPVS `rr`). Every new flow, the
    /// node's own included.
    RoundRobin,
    /// The less loaded of two random backends by their open flows on this
    /// node, counted by the data path (IPVS `lc`, without its scan). Every
    /// new flow, the node's own included.
    LeastConn,
}

impl LbAlgorithm {
    /// The annotation spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LbAlgorithm::Random => "random",
            LbAlgorithm::Maglev => "maglev",
            LbAlgorithm::SourceHash => "source-hash",
            LbAlgorithm::RoundRobin => "round-robin",
            LbAlgorithm::LeastConn => "least-conn",
        }
    }

    /// The algorithm slot-0 `flags` record (the inverse of the sync
    /// engine's encoding).
    pub fn of_flags(flags: u16) -> Self {
        use proxy_common::frontend_flags as ff;
        match (flags & ff::PICK_MASK, flags & ff::ALGO_MASK) {
            (ff::PICK_ROUND_ROBIN, _) => LbAlgorithm::RoundRobin,
            (ff::PICK_LEAST_CONN, _) => LbAlgorithm::LeastConn,
            (_, ff::ALGO_MAGLEV) => LbAlgorithm::Maglev,
            (_, ff::ALGO_SOURCE_HASH) => LbAlgorithm::SourceHash,
            _ => LbAlgorithm::Random,
        }
    }

    fn from_annotation(value: &str) -> Option<Self> {
        [
            Self::Random,
            Self::Maglev,
            Self::SourceHash,
            Self::RoundRobin,
            Self::LeastConn,
        ]
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
    /// `backends`. The sync writes it as the frontend's external set, which
    /// the uplink programs pick from for traffic from outside.
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
    /// Describes `backends` only (see
    /// [`external_terminating_fallback`](Self::external_terminating_fallback)).
    pub terminating_fallback: bool,
    /// No endpoint of this node was ready, so
    /// [`external_backends`](Self::external_backends) are this node's
    /// serving-and-terminating ones: traffic from outside still drains to
    /// them, but they are not ready endpoints (the healthCheckNodePort does
    /// not count them).
    pub external_terminating_fallback: bool,
    /// Topology hints narrowed `backends` (only when every ready endpoint has
    /// hints; never for a local-only set).
    pub topology: Option<TopologyMode>,
    /// The Service's `switchboard.io/lb-algorithm` annotation, for traffic
    /// from outside the node; `None`: the agent's default.
    pub algorithm: Option<LbAlgorithm>,
    /// `loadBalancerSourceRanges`: `Some` exactly on the LoadBalancer
    /// frontends of a Service that lists any; only the sources it allows
    /// reach the frontend, on every path. NodePort, external-IP and
    /// ClusterIP frontends of the same Service stay open, as in kube-proxy.
    pub source_ranges: Option<SourceRanges>,
    /// The backends (of either set) whose weight is not 1, from their
    /// EndpointSlices' `switchboard.io/weights` ([`ANNOTATION_WEIGHTS`]),
    /// sorted by address; empty when every weight is 1. A backend of weight
    /// 0 is drained: it stays in its set for the flows it has, and gets no
    /// new one.
    pub weights: Box<[(BackendAddr, u16)]>,
}

fn serialize_blocks<S: serde::Serializer>(
    blocks: &Arc<[crate::model::cidr::IpCidr]>,
    s: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&blocks[..], s)
}

/// Who may reach a LoadBalancer frontend restricted by
/// `loadBalancerSourceRanges`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SourceRanges {
    /// The allowed blocks of the frontend's family, host bits cleared,
    /// sorted, without duplicates. Empty: no source is allowed (every block
    /// listed was of the other family, or invalid).
    #[serde(serialize_with = "serialize_blocks")]
    pub blocks: Arc<[crate::model::cidr::IpCidr]>,
    /// A block holds one of this node's addresses. kube-proxy then also
    /// allows the Service's load-balancer IPs as sources (they are in
    /// `blocks` too), and the node's own sockets may connect.
    pub allows_node: bool,
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
            external_terminating_fallback: false,
            topology: None,
            algorithm: None,
            source_ranges: None,
            weights: Box::default(),
        }
    }

    /// The weight of `backend` (1 unless its slice's annotation says).
    pub fn weight_of(&self, backend: &BackendAddr) -> u16 {
        self.weights
            .binary_search_by(|(b, _)| b.cmp(backend))
            .map_or(1, |i| self.weights[i].1)
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
        if self.external_terminating_fallback {
            extras.push("terminating fallback from outside".to_string());
        }
        if let Some(t) = self.topology {
            extras.push(format!("topology {t}"));
        }
        if let Some(a) = self.algorithm {
            extras.push(format!("lb-algorithm {}", a.as_str()));
        }
        if !self.weights.is_empty() {
            let weights: Vec<String> = self
                .weights
                .iter()
                .map(|(b, w)| format!("{b}={w}"))
                .collect();
            extras.push(format!("weights {}", weights.join(" ")));
        }
        if let Some(r) = &self.source_ranges {
            let blocks: Vec<String> = r.blocks.iter().map(ToString::to_string).collect();
            extras.push(format!(
                "from {}{}",
                if blocks.is_empty() {
                    "no source".to_string()
                } else {
                    blocks.join(" ")
                },
                if r.allows_node { " (node allowed)" } else { "" }
            ));
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
    /// NodePort frontends are created on each of these (both families; each
    /// gets its own family's endpoints).
    pub addresses: Vec<IpAddr>,
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
    /// From a Node object: its name, its `InternalIP` and `ExternalIP`
    /// addresses of either family (in that order, deduplicated) and its zone
    /// label.
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
                if let Ok(ip) = a.address.trim().parse::<IpAddr>() {
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

/// Computes the desired frontends from whole objects at once: a fresh
/// [`Model`] fed everything. The agent keeps one [`Model`] and feeds it
/// changes instead; the CLI and tests use this.
///
/// * `node`: this node. Without it there are no NodePort frontends, topology
///   hints are not used, and `Local` traffic policies cannot be applied (they
///   are then treated as `Cluster`, with a warning).
/// * `proxy_name`: our `service.kubernetes.io/service-proxy-name`. Services
///   carrying that label with another value (or with any value, when this is
///   `None`) belong to another proxy and are skipped.
///
/// A version that cannot be used (see the `validate` module) is reported and
/// not programmed: with whole objects at once there is no earlier version.
/// When two Services claim the same frontend address, the older one
/// (`metadata.creationTimestamp`, then namespace/name) keeps it and the other
/// gets a warning. Warnings come out sorted, each once.
pub fn build_for_node(
    services: &[Service],
    slices: &[EndpointSlice],
    node: Option<&NodeInfo>,
    proxy_name: Option<&str>,
) -> (DesiredState, Vec<ModelWarning>) {
    build_limited(services, slices, node, proxy_name, None)
}

/// [`build_for_node`] with the agent's `--max-endpoints-per-service`
/// (`None`: the default).
pub fn build_limited(
    services: &[Service],
    slices: &[EndpointSlice],
    node: Option<&NodeInfo>,
    proxy_name: Option<&str>,
    max_endpoints_per_port: Option<u16>,
) -> (DesiredState, Vec<ModelWarning>) {
    let mut model = Model::new(node.cloned(), proxy_name.map(str::to_owned));
    if let Some(max) = max_endpoints_per_port {
        model.set_max_endpoints_per_port(max);
    }
    for svc in services {
        let info = ServiceInfo::from_k8s(svc);
        model.set_service(info.key.clone(), Some(Arc::new(info)));
    }
    let mut interner = Interner::default();
    for slice in slices {
        let info = SliceInfo::from_k8s(slice, &mut interner);
        model.set_slice(info.key.clone(), Some(Arc::new(info)));
    }
    model.update();
    let warnings = model.warnings().cloned().collect();
    (model.into_desired(), warnings)
}

/// Parses an IP address field of either family (surrounding whitespace
/// accepted); `None` for anything else.
fn parse_ip(s: &str) -> Option<IpAddr> {
    s.trim().parse::<IpAddr>().ok()
}

fn port_u16(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|&p| p != 0)
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
mod cases;
#[cfg(test)]
mod tests;
