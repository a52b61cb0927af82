//! What the model reads from a Service or an EndpointSlice, and nothing else.
//!
//! Both sources decode each object straight into these
//! (`crate::source::wire`, which gives what [`ServiceInfo::from_k8s`] and
//! [`SliceInfo::from_k8s`] give for the k8s-openapi objects the CLI reads):
//! an agent at 100k Services holds these instead of whole objects (managed
//! fields, selectors, status it never reads). The conversion never fails and never judges:
//! a value the model will refuse (an address that does not parse, a port out
//! of range) is kept as written, so the model can name it in its warning.
//!
//! Fields are raw where the model's rules decide (`type`, policies); parsed
//! where there are many of them and the parse is lossless (endpoint
//! addresses, node names shared through an [`Interner`]).

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::chrono::DateTime;

use super::packed::Endpoints;
pub use super::slice_endpoint::{EndpointInfo, Hints, RawAddress};
use super::{
    IpFamily, ANNOTATION_LB_ALGORITHM, ANNOTATION_WEIGHTS, LABEL_HEADLESS, LABEL_SERVICE_NAME,
    LABEL_SERVICE_PROXY_NAME,
};

/// The annotation the EndpointSlice controller stamps with the time of the
/// change that caused the slice's last update (for the programming-latency
/// metric).
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// A namespaced object's identity. An empty or missing namespace is
/// `default`, as the API server fills it in.
///
/// The strings are shared: the source's index, the feed and the model each
/// keep the keys of every object, and a clone costs two reference counts,
/// not two allocations.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
}

impl Default for ObjectKey {
    fn default() -> Self {
        ObjectKey::new("", "")
    }
}

impl ObjectKey {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> ObjectKey {
        ObjectKey {
            namespace: Arc::from(namespace.as_ref()),
            name: Arc::from(name.as_ref()),
        }
    }

    /// The key of an object from its metadata.
    pub fn of(meta: &ObjectMeta) -> ObjectKey {
        ObjectKey::named(meta.namespace.as_deref(), meta.name.as_deref())
    }

    /// The key of an object with this namespace and name, as written
    /// (either may be missing).
    pub fn named(namespace: Option<&str>, name: Option<&str>) -> ObjectKey {
        ObjectKey::new(
            namespace.filter(|n| !n.is_empty()).unwrap_or("default"),
            name.unwrap_or_default(),
        )
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.name.is_empty() {
            "?"
        } else {
            &self.name
        };
        write!(f, "{}/{}", self.namespace, name)
    }
}

/// An object found by its key (a Service or an EndpointSlice).
pub trait Keyed {
    fn key(&self) -> &ObjectKey;
}

impl Keyed for ServiceInfo {
    fn key(&self) -> &ObjectKey {
        &self.key
    }
}

impl Keyed for SliceInfo {
    fn key(&self) -> &ObjectKey {
        &self.key
    }
}

/// Shares equal strings (node names: one per node, named by every endpoint
/// on it; a slice's address type, port names and protocols) so a million
/// endpoints do not hold a million copies.
#[derive(Debug, Default)]
pub struct Interner {
    strings: HashSet<Arc<str>>,
}

impl Interner {
    pub fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(existing) = self.strings.get(s) {
            return Arc::clone(existing);
        }
        let new: Arc<str> = Arc::from(s);
        self.strings.insert(Arc::clone(&new));
        new
    }

    /// Forgets strings nothing else holds any more.
    pub fn prune(&mut self) {
        self.strings.retain(|s| Arc::strong_count(s) > 1);
    }
}

/// The labels that decide whether a proxy handles an object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyLabels {
    /// `service.kubernetes.io/service-proxy-name`.
    pub proxy_name: Option<Box<str>>,
    /// `service.kubernetes.io/headless` is present.
    pub headless: bool,
}

impl ProxyLabels {
    fn of(meta: &ObjectMeta) -> ProxyLabels {
        ProxyLabels {
            proxy_name: label(meta, LABEL_SERVICE_PROXY_NAME).map(Box::from),
            headless: label(meta, LABEL_HEADLESS).is_some(),
        }
    }

    /// kube-proxy watches through the label selector
    /// `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`.
    /// With a proxy name of our own, objects labelled with exactly that name
    /// are ours too.
    pub fn selected(&self, proxy_name: Option<&str>) -> bool {
        if self.headless {
            return false;
        }
        match &self.proxy_name {
            None => true,
            Some(v) => proxy_name == Some(&**v),
        }
    }
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// A Service as the model reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceInfo {
    pub key: ObjectKey,
    pub labels: ProxyLabels,
    /// `metadata.creationTimestamp`, in milliseconds since the epoch (the
    /// API server writes whole seconds). Orders claims on one address: the
    /// older Service keeps it. The directory source, whose files carry no
    /// timestamp, stamps the time it first saw the object (see
    /// `source::dir`).
    pub created_unix_ms: Option<i64>,
    /// The `switchboard.io/lb-algorithm` annotation, as written.
    pub lb_algorithm: Option<Box<str>>,
    /// `None`: the object has no spec.
    pub spec: Option<ServiceSpecInfo>,
}

/// The parts of `spec` (and `status.loadBalancer`) the model reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceSpecInfo {
    /// This and the other fields with a few usual values (the policies,
    /// the affinity, the ports' protocols) share one copy of each usual
    /// value ([`shared_value`]): no allocation per Service.
    pub type_: Option<Arc<str>>,
    /// `clusterIPs` when it is set and not empty, else `clusterIP`; as written.
    pub cluster_ips: Box<[String]>,
    /// `ipFamilies` (empty when unset).
    pub ip_families: Box<[Raw<IpFamily>]>,
    /// `ipFamilyPolicy`.
    pub ip_family_policy: Option<Raw<IpFamilyPolicy>>,
    pub session_affinity: Option<Arc<str>>,
    pub external_traffic_policy: Option<Arc<str>>,
    pub internal_traffic_policy: Option<Arc<str>>,
    pub ports: Box<[ServicePortInfo]>,
    /// The fields most Services leave unset, in a block of their own
    /// ([`RareSpec::boxed`]: `None` when every one is unset), so that a
    /// usual Service does not pay for them.
    pub rare: Option<Box<RareSpec>>,
}

/// The fields of a Service's spec (and status) most Services leave unset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RareSpec {
    pub external_ips: Box<[String]>,
    /// `status.loadBalancer.ingress`.
    pub lb_ingress: Box<[LbIngress]>,
    /// `loadBalancerSourceRanges`, as written.
    pub lb_source_ranges: Box<[String]>,
    /// `sessionAffinityConfig.clientIP.timeoutSeconds`.
    pub affinity_timeout_s: Option<i32>,
    pub health_check_node_port: Option<i32>,
}

impl RareSpec {
    /// `self` in a block of its own, or `None` when every field is unset.
    pub fn boxed(self) -> Option<Box<RareSpec>> {
        (self != RareSpec::default()).then(|| Box::new(self))
    }
}

impl ServiceSpecInfo {
    pub fn external_ips(&self) -> &[String] {
        self.rare.as_deref().map_or(&[], |r| &r.external_ips)
    }

    /// `status.loadBalancer.ingress`.
    pub fn lb_ingress(&self) -> &[LbIngress] {
        self.rare.as_deref().map_or(&[], |r| &r.lb_ingress)
    }

    /// `loadBalancerSourceRanges`, as written.
    pub fn lb_source_ranges(&self) -> &[String] {
        self.rare.as_deref().map_or(&[], |r| &r.lb_source_ranges)
    }

    /// `sessionAffinityConfig.clientIP.timeoutSeconds`.
    pub fn affinity_timeout_s(&self) -> Option<i32> {
        self.rare.as_deref().and_then(|r| r.affinity_timeout_s)
    }

    pub fn health_check_node_port(&self) -> Option<i32> {
        self.rare.as_deref().and_then(|r| r.health_check_node_port)
    }
}

/// A field with a few valid values: parsed when it is one of them (no
/// allocation in the common case), else kept as written for the warning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Raw<T> {
    Known(T),
    Other(Box<str>),
}

impl<T> Raw<T> {
    pub(crate) fn new(s: &str, parse: impl Fn(&str) -> Option<T>) -> Raw<T> {
        match parse(s) {
            Some(known) => Raw::Known(known),
            None => Raw::Other(s.into()),
        }
    }
}

/// `spec.ipFamilyPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpFamilyPolicy {
    SingleStack,
    PreferDualStack,
    RequireDualStack,
}

impl IpFamilyPolicy {
    pub(crate) fn from_k8s(value: &str) -> Option<IpFamilyPolicy> {
        match value {
            "SingleStack" => Some(IpFamilyPolicy::SingleStack),
            "PreferDualStack" => Some(IpFamilyPolicy::PreferDualStack),
            "RequireDualStack" => Some(IpFamilyPolicy::RequireDualStack),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LbIngress {
    pub ip: Option<String>,
    pub ip_mode: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServicePortInfo {
    /// Empty when unnamed; shared by every Service naming a port alike
    /// (see [`ServiceInfo::share`]).
    pub name: Arc<str>,
    pub protocol: Option<Arc<str>>,
    pub port: i32,
    pub node_port: Option<i32>,
}

/// `value`, shared when it is one of the values a Service's type,
/// policies, affinity or port protocols usually take (one copy each for the
/// whole process), else a copy of its own.
pub fn shared_value(value: &str) -> Arc<str> {
    static USUAL: std::sync::LazyLock<Vec<Arc<str>>> = std::sync::LazyLock::new(|| {
        [
            "ClusterIP",
            "NodePort",
            "LoadBalancer",
            "ExternalName",
            "None",
            "ClientIP",
            "Cluster",
            "Local",
            "TCP",
            "UDP",
            "SCTP",
        ]
        .into_iter()
        .map(Arc::from)
        .collect()
    });
    USUAL
        .iter()
        .find(|usual| ***usual == *value)
        .cloned()
        .unwrap_or_else(|| Arc::from(value))
}

impl ServiceInfo {
    pub fn from_k8s(svc: &Service) -> ServiceInfo {
        let meta = &svc.metadata;
        ServiceInfo {
            key: ObjectKey::of(meta),
            labels: ProxyLabels::of(meta),
            created_unix_ms: meta
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.timestamp_millis()),
            lb_algorithm: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_LB_ALGORITHM))
                .map(|v| v.as_str().into()),
            spec: svc.spec.as_ref().map(|spec| ServiceSpecInfo {
                type_: spec.type_.as_deref().map(shared_value),
                cluster_ips: match spec.cluster_ips.as_deref() {
                    Some(list) if !list.is_empty() => list.into(),
                    _ => spec.cluster_ip.iter().cloned().collect(),
                },
                ip_families: spec
                    .ip_families
                    .iter()
                    .flatten()
                    .map(|f| Raw::new(f, IpFamily::from_k8s))
                    .collect(),
                ip_family_policy: spec
                    .ip_family_policy
                    .as_deref()
                    .map(|p| Raw::new(p, IpFamilyPolicy::from_k8s)),
                rare: RareSpec {
                    external_ips: spec.external_ips.clone().unwrap_or_default().into(),
                    lb_ingress: svc
                        .status
                        .as_ref()
                        .and_then(|s| s.load_balancer.as_ref())
                        .and_then(|lb| lb.ingress.as_ref())
                        .into_iter()
                        .flatten()
                        .map(|i| LbIngress {
                            ip: i.ip.clone(),
                            ip_mode: i.ip_mode.clone(),
                        })
                        .collect(),
                    lb_source_ranges: spec
                        .load_balancer_source_ranges
                        .clone()
                        .unwrap_or_default()
                        .into(),
                    affinity_timeout_s: spec
                        .session_affinity_config
                        .as_ref()
                        .and_then(|c| c.client_ip.as_ref())
                        .and_then(|c| c.timeout_seconds),
                    health_check_node_port: spec.health_check_node_port,
                }
                .boxed(),
                session_affinity: spec.session_affinity.as_deref().map(shared_value),
                external_traffic_policy: spec.external_traffic_policy.as_deref().map(shared_value),
                internal_traffic_policy: spec.internal_traffic_policy.as_deref().map(shared_value),
                ports: spec
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| ServicePortInfo {
                        name: p.name.as_deref().unwrap_or_default().into(),
                        protocol: p.protocol.as_deref().map(shared_value),
                        port: p.port,
                        node_port: p.node_port,
                    })
                    .collect(),
            }),
        }
    }
}

/// An EndpointSlice as the model reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SliceInfo {
    pub key: ObjectKey,
    pub labels: ProxyLabels,
    /// `kubernetes.io/service-name`: the Service (same namespace) it
    /// serves. Shared with the model's key of that Service's slices.
    pub service_name: Option<Arc<str>>,
    /// Interned: one of a few values (`IPv4`, `IPv6`, `FQDN`) on every slice.
    pub address_type: Arc<str>,
    /// Compact ([`Endpoints`]): built from [`EndpointInfo`]s.
    pub endpoints: Endpoints,
    pub ports: Box<[SlicePortInfo]>,
    /// `endpoints.kubernetes.io/last-change-trigger-time`, when it parses.
    pub trigger_time: Option<SystemTime>,
    /// The `switchboard.io/weights` annotation, as written (rare: boxed).
    pub weights: Option<Box<str>>,
}

/// Names and protocols are interned: every slice of a Service repeats them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlicePortInfo {
    pub name: Option<Arc<str>>,
    pub protocol: Option<Arc<str>>,
    pub port: Option<i32>,
}

impl SliceInfo {
    /// Converts a slice; node names and hints go through `interner`.
    pub fn from_k8s(slice: &EndpointSlice, interner: &mut Interner) -> SliceInfo {
        let meta = &slice.metadata;
        SliceInfo {
            key: ObjectKey::of(meta),
            labels: ProxyLabels::of(meta),
            service_name: label(meta, LABEL_SERVICE_NAME).map(Arc::from),
            address_type: interner.intern(&slice.address_type),
            endpoints: slice
                .endpoints
                .iter()
                .map(|ep| EndpointInfo::from_k8s(ep, interner))
                .collect(),
            ports: slice
                .ports
                .iter()
                .flatten()
                .map(|p| SlicePortInfo {
                    name: p.name.as_deref().map(|n| interner.intern(n)),
                    protocol: p.protocol.as_deref().map(|n| interner.intern(n)),
                    port: p.port,
                })
                .collect(),
            trigger_time: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(TRIGGER_TIME_ANNOTATION))
                .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
                .map(SystemTime::from),
            weights: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_WEIGHTS))
                .map(|v| v.as_str().into()),
        }
    }
}

impl ServiceInfo {
    /// Puts the strings a Service shares with others (its namespace, port
    /// names) through `interner`: for a Service decoded without one.
    pub fn share(&mut self, interner: &mut Interner) {
        let mut share = |s: &mut Arc<str>| *s = interner.intern(s);
        share(&mut self.key.namespace);
        if let Some(spec) = &mut self.spec {
            spec.ports.iter_mut().for_each(|p| share(&mut p.name));
        }
    }
}

impl SliceInfo {
    /// Puts the strings a slice shares with others (namespace, address
    /// type, port names and protocols, node names, hints) through
    /// `interner`: for a slice decoded without one (`source::wire`, on any
    /// thread).
    pub fn share(&mut self, interner: &mut Interner) {
        let mut share = |s: &mut Arc<str>| *s = interner.intern(s);
        share(&mut self.key.namespace);
        share(&mut self.address_type);
        for port in &mut self.ports {
            port.name
                .iter_mut()
                .chain(&mut port.protocol)
                .for_each(&mut share);
        }
        self.endpoints.share(&mut share);
    }
}

/// `ipFamilies` item: parsed when it is `IPv4` or `IPv6`.
pub(crate) fn ip_family(value: &str) -> Raw<IpFamily> {
    Raw::new(value, IpFamily::from_k8s)
}

impl EndpointInfo {
    fn from_k8s(ep: &Endpoint, interner: &mut Interner) -> EndpointInfo {
        let c = ep.conditions.as_ref();
        let hints = ep.hints.as_ref().map(|h| {
            Box::new(Hints {
                for_nodes: h
                    .for_nodes
                    .iter()
                    .flatten()
                    .map(|n| interner.intern(&n.name))
                    .collect(),
                for_zones: h
                    .for_zones
                    .iter()
                    .flatten()
                    .map(|z| interner.intern(&z.name))
                    .collect(),
            })
        });
        EndpointInfo {
            address: ep.addresses.first().map(|a| RawAddress::new(a)),
            address_count: u32::try_from(ep.addresses.len()).unwrap_or(u32::MAX),
            ready: c.and_then(|c| c.ready),
            serving: c.and_then(|c| c.serving),
            terminating: c.and_then(|c| c.terminating),
            node_name: ep.node_name.as_deref().map(|n| interner.intern(n)),
            hints,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    #[test]
    fn usual_service_values_are_shared_not_copied() {
        let (a, b) = (shared_value("ClusterIP"), shared_value("ClusterIP"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*shared_value("TCP"), "TCP");
        let (x, y) = (shared_value("Unusual"), shared_value("Unusual"));
        assert_eq!(x, y);
        assert!(
            !Arc::ptr_eq(&x, &y),
            "an unusual value is a copy of its own"
        );
    }

    #[test]
    fn canonical_addresses_are_parsed_anything_else_kept_as_written() {
        assert_eq!(
            RawAddress::new("10.0.0.1"),
            RawAddress::V4(Ipv4Addr::new(10, 0, 0, 1))
        );
        let zeros = RawAddress::new("10.0.0.01");
        assert_eq!(zeros.to_string(), "10.0.0.01");
        assert_eq!(zeros.ip(), None);
        let spaced = RawAddress::new(" 10.0.0.1");
        assert_eq!(spaced.to_string(), " 10.0.0.1");
        assert_eq!(spaced.ip(), Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
        let v6: Ipv6Addr = "fd00::1".parse().unwrap();
        assert_eq!(RawAddress::new("fd00::1"), RawAddress::V6(v6));
        assert_eq!(RawAddress::new("fd00::1").to_string(), "fd00::1");
        let long = RawAddress::new("fd00:0:0::1");
        assert_eq!(long.to_string(), "fd00:0:0::1");
        assert_eq!(long.ip(), Some(IpAddr::V6(v6)));
        assert_eq!(RawAddress::new("pod.example").ip(), None);
    }

    #[test]
    fn slices_share_their_address_type_port_names_and_protocols() {
        use k8s_openapi::api::discovery::v1::EndpointPort;
        let slice = |name: &str| EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                protocol: Some("TCP".into()),
                port: Some(8080),
                ..Default::default()
            }]),
            ..Default::default()
        };
        let mut interner = Interner::default();
        let a = SliceInfo::from_k8s(&slice("a"), &mut interner);
        let b = SliceInfo::from_k8s(&slice("b"), &mut interner);
        assert!(Arc::ptr_eq(&a.address_type, &b.address_type));
        let (pa, pb) = (&a.ports[0], &b.ports[0]);
        assert_eq!(pa.name.as_deref(), Some("http"));
        assert!(Arc::ptr_eq(
            pa.name.as_ref().unwrap(),
            pb.name.as_ref().unwrap()
        ));
        assert!(Arc::ptr_eq(
            pa.protocol.as_ref().unwrap(),
            pb.protocol.as_ref().unwrap()
        ));
    }

    #[test]
    fn node_names_are_shared_and_pruned() {
        let mut interner = Interner::default();
        let a = interner.intern("node-a");
        let b = interner.intern("node-a");
        assert!(Arc::ptr_eq(&a, &b));
        drop((a, b));
        interner.prune();
        assert!(interner.strings.is_empty());
    }
}
