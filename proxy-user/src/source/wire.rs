//! Services and EndpointSlices decoded straight from their JSON (the API
//! server's lists and watch events) or YAML (the directory's manifests)
//! into the model's input types ([`ServiceInfo`], [`SliceInfo`]), keeping
//! only the fields the model reads.
//!
//! Both sources used to build whole k8s-openapi objects (every label,
//! annotation, selector, managed field and status condition, each an
//! allocation) and convert them; at 100k Services that was most of the
//! start. Here the decoder skips what the model does not read without
//! building it, and the strings it reads are borrowed from the input where
//! the input allows (no escapes), so a Service costs the allocations of its
//! [`ServiceInfo`] and little more.
//!
//! The result is what [`ServiceInfo::from_k8s`] and [`SliceInfo::from_k8s`]
//! give for the same object (a test holds the two equal), with the same
//! leniency: every field may be absent or `null`. A field the model reads
//! with the wrong type is an error naming the field (`spec.ports[0].port:
//! invalid type: string "eighty", expected i32`, through
//! `serde_path_to_error`), as with the k8s-openapi types; a field it does not
//! read is not looked at.
//!
//! Strings that [`SliceInfo`] shares through an [`Interner`](crate::model::Interner) (node names,
//! port names) are decoded unshared, so decoding needs no shared state and
//! runs on any thread; [`SliceInfo::share`] puts them through the interner
//! afterwards.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::chrono::DateTime;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::model::input::{ip_family, shared_value, TRIGGER_TIME_ANNOTATION};
use crate::model::{
    EndpointInfo, Hints, IpFamilyPolicy, LbIngress, ObjectKey, ProxyLabels, RareSpec, Raw,
    RawAddress, ServiceInfo, ServicePortInfo, ServiceSpecInfo, SliceInfo, SlicePortInfo,
    ANNOTATION_LB_ALGORITHM, ANNOTATION_WEIGHTS, LABEL_HEADLESS, LABEL_SERVICE_NAME,
    LABEL_SERVICE_PROXY_NAME,
};

type Str<'a> = Cow<'a, str>;

/// `metadata`, as much of it as either kind needs.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Meta<'a> {
    #[serde(borrow)]
    name: Option<Str<'a>>,
    #[serde(borrow)]
    namespace: Option<Str<'a>>,
    #[serde(borrow)]
    resource_version: Option<Str<'a>>,
    #[serde(borrow)]
    creation_timestamp: Option<Str<'a>>,
    #[serde(default, deserialize_with = "picked")]
    labels: Option<Labels>,
    #[serde(default, deserialize_with = "picked")]
    annotations: Option<Annotations>,
}

impl Meta<'_> {
    fn key(&self) -> ObjectKey {
        ObjectKey::named(self.namespace.as_deref(), self.name.as_deref())
    }

    fn proxy_labels(&self) -> ProxyLabels {
        let labels = self.labels.as_ref();
        ProxyLabels {
            proxy_name: labels.and_then(|l| l.proxy_name.as_deref().map(Box::from)),
            headless: labels.is_some_and(|l| l.headless),
        }
    }

    /// The object's identity as kube-runtime reads it (name, namespace,
    /// resourceVersion; nothing else).
    fn object_meta(&self) -> ObjectMeta {
        ObjectMeta {
            name: self.name.as_deref().map(str::to_owned),
            namespace: self.namespace.as_deref().map(str::to_owned),
            resource_version: self.resource_version.as_deref().map(str::to_owned),
            ..ObjectMeta::default()
        }
    }
}

/// A map of strings of which a few keys are kept; a value that is not a
/// string is an error, as in a k8s-openapi object's label map.
trait Picks: Default {
    fn pick(&mut self, key: &str, value: Str<'_>);
}

struct PickVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Picks> Visitor<'de> for PickVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of strings")
    }
    /// A key given twice is an error, as YAML has it (the directory
    /// source's serde-saphyr fast path, taken when its block reader refuses
    /// a document, leaves duplicates to this map; JSON objects
    /// from the API server never repeat a key).
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut picked = T::default();
        let mut seen: Vec<Str<'de>> = Vec::new();
        while let Some(key) = map.next_key::<Str<'de>>()? {
            if seen.contains(&key) {
                return Err(de::Error::custom(format_args!("duplicate key {key:?}")));
            }
            let value = map.next_value::<Str<'de>>()?;
            picked.pick(&key, value);
            seen.push(key);
        }
        Ok(picked)
    }
}

/// The labels the model reads; the others are skipped.
#[derive(Default)]
struct Labels {
    proxy_name: Option<String>,
    headless: bool,
    service_name: Option<String>,
}

impl Picks for Labels {
    fn pick(&mut self, key: &str, value: Str<'_>) {
        match key {
            LABEL_SERVICE_PROXY_NAME => self.proxy_name = Some(value.into_owned()),
            LABEL_HEADLESS => self.headless = true,
            LABEL_SERVICE_NAME => self.service_name = Some(value.into_owned()),
            _ => {}
        }
    }
}

/// The annotations the model reads; the others are skipped.
#[derive(Default)]
struct Annotations {
    lb_algorithm: Option<String>,
    trigger_time: Option<String>,
    weights: Option<String>,
}

impl Picks for Annotations {
    fn pick(&mut self, key: &str, value: Str<'_>) {
        let slot = match key {
            ANNOTATION_LB_ALGORITHM => &mut self.lb_algorithm,
            TRIGGER_TIME_ANNOTATION => &mut self.trigger_time,
            ANNOTATION_WEIGHTS => &mut self.weights,
            _ => return,
        };
        *slot = Some(value.into_owned());
    }
}

fn picked<'de, D: Deserializer<'de>, T: Picks>(d: D) -> Result<Option<T>, D::Error> {
    Option::<Picked<T>>::deserialize(d).map(|p| p.map(|p| p.0))
}

/// A [`Picks`] map, for `Option` around it.
struct Picked<T>(T);

impl<'de, T: Picks> Deserialize<'de> for Picked<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(PickVisitor(std::marker::PhantomData))
            .map(Picked)
    }
}

/// An optional number or boolean as the tree of values reads it: only a
/// number is an `i32` (not a string of digits, which a YAML parser asked
/// for an `i32` would take from a quoted `'80'`), only `true`/`false` a
/// boolean; the errors are serde's for those types.
struct Strict<T>(std::marker::PhantomData<T>);

/// The visitor of `Strict<$t>`: null is `None`, and `$visits` the values.
macro_rules! strict {
    ($t:ty, $expecting:literal, { $($visits:item)* }) => {
        impl<'de> Visitor<'de> for Strict<$t> {
            type Value = Option<$t>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str($expecting)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            $($visits)*
        }
    };
}

strict!(i32, "i32", {
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        i32::try_from(v)
            .map(Some)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        i32::try_from(v)
            .map(Some)
            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
    }
});

strict!(bool, "a boolean", {
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Some(v))
    }
});

fn opt_i32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i32>, D::Error> {
    d.deserialize_any(Strict::<i32>(std::marker::PhantomData))
}

fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    d.deserialize_any(Strict::<bool>(std::marker::PhantomData))
}

/// `metadata.creationTimestamp` in milliseconds; a value that is not an
/// RFC 3339 time is an error, as with the k8s-openapi type.
fn created_ms<E: de::Error>(meta: &Meta<'_>) -> Result<Option<i64>, E> {
    meta.creation_timestamp
        .as_deref()
        .map(|t| {
            DateTime::parse_from_rfc3339(t)
                .map(|t| t.timestamp_millis())
                .map_err(|e| E::custom(format!("metadata.creationTimestamp {t:?}: {e}")))
        })
        .transpose()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireService<'a> {
    #[serde(borrow, default)]
    metadata: Meta<'a>,
    #[serde(borrow)]
    spec: Option<WireServiceSpec<'a>>,
    status: Option<WireServiceStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireServiceSpec<'a> {
    #[serde(rename = "type", borrow)]
    type_: Option<Str<'a>>,
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    cluster_ips: Option<Vec<String>>,
    #[serde(borrow)]
    ip_families: Option<Vec<Str<'a>>>,
    #[serde(borrow)]
    ip_family_policy: Option<Str<'a>>,
    #[serde(rename = "externalIPs")]
    external_ips: Option<Vec<String>>,
    load_balancer_source_ranges: Option<Vec<String>>,
    #[serde(borrow)]
    session_affinity: Option<Str<'a>>,
    session_affinity_config: Option<WireAffinityConfig>,
    #[serde(borrow)]
    external_traffic_policy: Option<Str<'a>>,
    #[serde(borrow)]
    internal_traffic_policy: Option<Str<'a>>,
    #[serde(default, deserialize_with = "opt_i32")]
    health_check_node_port: Option<i32>,
    #[serde(borrow)]
    ports: Option<Vec<WireServicePort<'a>>>,
}

#[derive(Deserialize)]
struct WireAffinityConfig {
    #[serde(rename = "clientIP")]
    client_ip: Option<WireClientIp>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireClientIp {
    #[serde(default, deserialize_with = "opt_i32")]
    timeout_seconds: Option<i32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireServicePort<'a> {
    name: Option<String>,
    #[serde(borrow)]
    protocol: Option<Str<'a>>,
    #[serde(default, deserialize_with = "opt_i32")]
    port: Option<i32>,
    #[serde(default, deserialize_with = "opt_i32")]
    node_port: Option<i32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireServiceStatus {
    load_balancer: Option<WireLbStatus>,
}

#[derive(Deserialize)]
struct WireLbStatus {
    ingress: Option<Vec<WireLbIngress>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireLbIngress {
    ip: Option<String>,
    ip_mode: Option<String>,
}

impl WireService<'_> {
    fn info<E: de::Error>(self) -> Result<ServiceInfo, E> {
        let meta = &self.metadata;
        let shared = |s: Option<Str<'_>>| s.as_deref().map(shared_value);
        Ok(ServiceInfo {
            key: meta.key(),
            labels: meta.proxy_labels(),
            created_unix_ms: created_ms(meta)?,
            lb_algorithm: meta
                .annotations
                .as_ref()
                .and_then(|a| a.lb_algorithm.as_deref().map(Box::from)),
            spec: self.spec.map(|spec| ServiceSpecInfo {
                type_: shared(spec.type_),
                cluster_ips: match spec.cluster_ips {
                    Some(list) if !list.is_empty() => list.into(),
                    _ => spec.cluster_ip.into_iter().collect(),
                },
                ip_families: spec
                    .ip_families
                    .into_iter()
                    .flatten()
                    .map(|f| ip_family(&f))
                    .collect(),
                ip_family_policy: spec
                    .ip_family_policy
                    .map(|p| Raw::new(&p, IpFamilyPolicy::from_k8s)),
                rare: RareSpec {
                    external_ips: spec.external_ips.unwrap_or_default().into(),
                    lb_ingress: self
                        .status
                        .and_then(|s| s.load_balancer)
                        .and_then(|lb| lb.ingress)
                        .into_iter()
                        .flatten()
                        .map(|i| LbIngress {
                            ip: i.ip,
                            ip_mode: i.ip_mode,
                        })
                        .collect(),
                    lb_source_ranges: spec.load_balancer_source_ranges.unwrap_or_default().into(),
                    affinity_timeout_s: spec
                        .session_affinity_config
                        .and_then(|c| c.client_ip)
                        .and_then(|c| c.timeout_seconds),
                    health_check_node_port: spec.health_check_node_port,
                }
                .boxed(),
                session_affinity: shared(spec.session_affinity),
                external_traffic_policy: shared(spec.external_traffic_policy),
                internal_traffic_policy: shared(spec.internal_traffic_policy),
                ports: spec
                    .ports
                    .into_iter()
                    .flatten()
                    .map(|p| ServicePortInfo {
                        name: p.name.unwrap_or_default().into(),
                        protocol: shared(p.protocol),
                        port: p.port.unwrap_or_default(),
                        node_port: p.node_port,
                    })
                    .collect(),
            }),
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSlice<'a> {
    #[serde(borrow, default)]
    metadata: Meta<'a>,
    #[serde(borrow)]
    address_type: Option<Str<'a>>,
    #[serde(borrow)]
    endpoints: Option<Vec<WireEndpoint<'a>>>,
    #[serde(borrow)]
    ports: Option<Vec<WireSlicePort<'a>>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireEndpoint<'a> {
    #[serde(borrow)]
    addresses: Option<Addresses<'a>>,
    conditions: Option<WireConditions>,
    #[serde(borrow)]
    node_name: Option<Str<'a>>,
    #[serde(borrow)]
    hints: Option<WireHints<'a>>,
}

/// `addresses`: the first, and how many in all (the others are skipped).
struct Addresses<'a> {
    first: Option<Str<'a>>,
    count: u32,
}

impl<'de: 'a, 'a> Deserialize<'de> for Addresses<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Addresses<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence of strings")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let first = seq.next_element::<Str<'de>>()?;
                let mut count = u32::from(first.is_some());
                while seq.next_element::<Str<'de>>()?.is_some() {
                    count = count.saturating_add(1);
                }
                Ok(Addresses { first, count })
            }
        }
        d.deserialize_seq(V)
    }
}

#[derive(Deserialize)]
struct WireConditions {
    #[serde(default, deserialize_with = "opt_bool")]
    ready: Option<bool>,
    #[serde(default, deserialize_with = "opt_bool")]
    serving: Option<bool>,
    #[serde(default, deserialize_with = "opt_bool")]
    terminating: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireHints<'a> {
    #[serde(borrow)]
    for_nodes: Option<Vec<WireNamed<'a>>>,
    #[serde(borrow)]
    for_zones: Option<Vec<WireNamed<'a>>>,
}

#[derive(Deserialize)]
struct WireNamed<'a> {
    #[serde(borrow)]
    name: Option<Str<'a>>,
}

#[derive(Deserialize)]
struct WireSlicePort<'a> {
    #[serde(borrow)]
    name: Option<Str<'a>>,
    #[serde(borrow)]
    protocol: Option<Str<'a>>,
    #[serde(default, deserialize_with = "opt_i32")]
    port: Option<i32>,
}

/// A string [`SliceInfo::share`] will put through the interner: its own
/// copy until then.
fn unshared(s: &str) -> Arc<str> {
    Arc::from(s)
}

impl WireSlice<'_> {
    fn info(self) -> SliceInfo {
        let meta = &self.metadata;
        let annotations = meta.annotations.as_ref();
        let names = |list: Option<Vec<WireNamed<'_>>>| -> Box<[Arc<str>]> {
            list.into_iter()
                .flatten()
                .map(|n| unshared(n.name.as_deref().unwrap_or_default()))
                .collect()
        };
        SliceInfo {
            key: meta.key(),
            labels: meta.proxy_labels(),
            service_name: meta
                .labels
                .as_ref()
                .and_then(|l| l.service_name.as_deref().map(Arc::from)),
            address_type: shared_value(self.address_type.as_deref().unwrap_or_default()),
            endpoints: self
                .endpoints
                .into_iter()
                .flatten()
                .map(|ep| {
                    let (address, address_count) = match ep.addresses {
                        Some(a) => (a.first.as_deref().map(RawAddress::new), a.count),
                        None => (None, 0),
                    };
                    let c = ep.conditions;
                    EndpointInfo {
                        address,
                        address_count,
                        ready: c.as_ref().and_then(|c| c.ready),
                        serving: c.as_ref().and_then(|c| c.serving),
                        terminating: c.as_ref().and_then(|c| c.terminating),
                        node_name: ep.node_name.as_deref().map(unshared),
                        hints: ep.hints.map(|h| {
                            Box::new(Hints {
                                for_nodes: names(h.for_nodes),
                                for_zones: names(h.for_zones),
                            })
                        }),
                    }
                })
                .collect(),
            ports: self
                .ports
                .into_iter()
                .flatten()
                .map(|p| SlicePortInfo {
                    name: p.name.as_deref().map(unshared),
                    protocol: p.protocol.as_deref().map(shared_value),
                    port: p.port,
                })
                .collect(),
            trigger_time: annotations
                .and_then(|a| a.trigger_time.as_deref())
                .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
                .map(SystemTime::from),
            weights: annotations
                .and_then(|a| a.weights.as_deref())
                .map(Box::from),
        }
    }
}

/// One manifest document with the fields of both kinds, decoded in one
/// pass (no intermediate tree).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireDoc<'a> {
    #[serde(borrow)]
    api_version: Option<Str<'a>>,
    #[serde(borrow)]
    kind: Option<Str<'a>>,
    #[serde(borrow, default)]
    metadata: Meta<'a>,
    #[serde(borrow)]
    spec: Option<WireServiceSpec<'a>>,
    status: Option<WireServiceStatus>,
    #[serde(borrow)]
    address_type: Option<Str<'a>>,
    #[serde(borrow)]
    endpoints: Option<Vec<WireEndpoint<'a>>>,
    #[serde(borrow)]
    ports: Option<Vec<WireSlicePort<'a>>>,
}

/// A manifest document read straight into the model's input, when it is a
/// `v1` Service or a `discovery.k8s.io/v1` EndpointSlice (a slice's shared
/// strings not yet shared: [`SliceInfo::share`]).
pub enum DocInfo {
    Service(ServiceInfo),
    Slice(SliceInfo),
    /// Another kind, or a List: for the general path.
    Other,
}

impl<'de> Deserialize<'de> for DocInfo {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let doc = WireDoc::deserialize(d)?;
        Ok(match (doc.api_version.as_deref(), doc.kind.as_deref()) {
            (Some("v1"), Some("Service")) => DocInfo::Service(
                WireService {
                    metadata: doc.metadata,
                    spec: doc.spec,
                    status: doc.status,
                }
                .info()?,
            ),
            (Some("discovery.k8s.io/v1"), Some("EndpointSlice")) => DocInfo::Slice(
                WireSlice {
                    metadata: doc.metadata,
                    address_type: doc.address_type,
                    endpoints: doc.endpoints,
                    ports: doc.ports,
                }
                .info(),
            ),
            _ => DocInfo::Other,
        })
    }
}

/// An object the model cannot read at all (a field it reads with the wrong
/// type, a malformed creation time): what is wrong, naming the field
/// (`spec.ports[1].port: invalid type: string "eighty", expected i32`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undecodable {
    pub problem: String,
}

impl fmt::Display for Undecodable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.problem)
    }
}

/// A Service as the API server sent it: its identity for the watch, and the
/// model's input or what keeps the model from reading it.
#[derive(Clone, Debug)]
pub struct ServiceObject {
    /// Name, namespace and resourceVersion only (as far as they could be
    /// read, for an object that is [`Undecodable`]).
    pub meta: ObjectMeta,
    pub info: Result<ServiceInfo, Undecodable>,
}

/// An EndpointSlice as the API server sent it (its shared strings not yet
/// shared: see [`SliceInfo::share`]).
#[derive(Clone, Debug)]
pub struct SliceObject {
    /// As [`ServiceObject::meta`].
    pub meta: ObjectMeta,
    pub info: Result<SliceInfo, Undecodable>,
}

// Each object of a list page or watch event is decoded on its own, and a
// problem in it becomes the object's `Undecodable`, not an error that fails
// the whole page (every other object of it lost until the object is fixed)
// or a watch that fails on the same event each time it resumes.
impl<'de> Deserialize<'de> for ServiceObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_newtype_struct(RAW_VALUE_TOKEN, ObjectVisitor(std::marker::PhantomData))
    }
}

impl<'de> Deserialize<'de> for SliceObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_newtype_struct(RAW_VALUE_TOKEN, ObjectVisitor(std::marker::PhantomData))
    }
}

/// The name serde_json's `RawValue` asks for: a serde_json deserializer
/// asked for a newtype of this name (with its `raw_value` feature) hands
/// over the object's JSON text, borrowed from the page (scanned once to find
/// where the object ends; nothing copied), rather than its contents. Any
/// other deserializer (kube-client's watch events go through serde's
/// buffer, the event being adjacently tagged) gives the contents, which are
/// decoded through a tree of values: slower, the same result. A test holds
/// list pages to the fast path.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

#[cfg(test)]
thread_local! {
    /// Objects decoded from their JSON text on this thread.
    static FROM_TEXT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// One object as the API server sent it: its JSON text, or a tree of values.
#[derive(Clone, Copy)]
enum Input<'a> {
    Text(&'a str),
    Value(&'a serde_json::Value),
}

impl<'a> Input<'a> {
    /// Decoded as `T`, or what is wrong, by field (the field found by a
    /// second decode that tracks where it is: only a bad object pays it).
    fn decode<T: Deserialize<'a>>(self) -> Result<T, Undecodable> {
        let fast = match self {
            Input::Text(text) => T::deserialize(&mut serde_json::Deserializer::from_str(text)),
            Input::Value(value) => T::deserialize(value),
        };
        if let Ok(decoded) = fast {
            return Ok(decoded);
        }
        let decoded = match self {
            Input::Text(text) => {
                serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(text))
            }
            Input::Value(value) => serde_path_to_error::deserialize(value),
        };
        decoded.map_err(|e| {
            let path = e.path().to_string();
            let error = without_position(e.inner());
            Undecodable {
                problem: if path == "." {
                    error
                } else {
                    format!("{path}: {error}")
                },
            }
        })
    }

    /// The object's name, namespace and resourceVersion, read on their own
    /// (empty when even they are unreadable).
    fn identity(self) -> ObjectMeta {
        #[derive(Deserialize, Default)]
        struct Identity<'a> {
            #[serde(borrow, default)]
            metadata: IdentityMeta<'a>,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct IdentityMeta<'a> {
            #[serde(borrow)]
            name: Option<Str<'a>>,
            #[serde(borrow)]
            namespace: Option<Str<'a>>,
            #[serde(borrow)]
            resource_version: Option<Str<'a>>,
        }
        let id = match self {
            Input::Text(text) => serde_json::from_str::<Identity<'_>>(text),
            Input::Value(value) => Identity::deserialize(value),
        }
        .unwrap_or_default();
        let owned = |s: Option<Str<'_>>| s.map(Cow::into_owned);
        ObjectMeta {
            name: owned(id.metadata.name),
            namespace: owned(id.metadata.namespace),
            resource_version: owned(id.metadata.resource_version),
            ..ObjectMeta::default()
        }
    }
}

/// An object decoded from its [`Input`], never failing: a problem is kept
/// in the object.
trait FromInput {
    fn from_input(input: Input<'_>) -> Self;
}

impl FromInput for ServiceObject {
    fn from_input(input: Input<'_>) -> Self {
        match input.decode::<WireService<'_>>() {
            Ok(wire) => ServiceObject {
                meta: wire.metadata.object_meta(),
                info: wire.info().map_err(|e: serde_json::Error| Undecodable {
                    problem: without_position(&e),
                }),
            },
            Err(bad) => ServiceObject {
                meta: input.identity(),
                info: Err(bad),
            },
        }
    }
}

impl FromInput for SliceObject {
    fn from_input(input: Input<'_>) -> Self {
        match input.decode::<WireSlice<'_>>() {
            Ok(wire) => SliceObject {
                meta: wire.metadata.object_meta(),
                info: Ok(wire.info()),
            },
            Err(bad) => SliceObject {
                meta: input.identity(),
                info: Err(bad),
            },
        }
    }
}

/// A string, borrowed from the input where it can be (serde's own `Cow`
/// always copies).
struct Text<'a>(Str<'a>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text<'de>, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Takes an object from whatever the deserializer gives ([`RAW_VALUE_TOKEN`]).
struct ObjectVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: FromInput> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    /// serde_json's raw value (a map of the one key [`RAW_VALUE_TOKEN`] to
    /// the text), or the object's own map from a deserializer that knows
    /// no raw values.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut object = serde_json::Map::new();
        if let Some(Text(key)) = map.next_key::<Text<'de>>()? {
            if key == RAW_VALUE_TOKEN {
                let Text(text) = map.next_value::<Text<'de>>()?;
                #[cfg(test)]
                FROM_TEXT.with(|n| n.set(n.get() + 1));
                return Ok(T::from_input(Input::Text(&text)));
            }
            object.insert(key.into_owned(), map.next_value()?);
            while let Some((key, value)) = map.next_entry()? {
                object.insert(key, value);
            }
        }
        Ok(T::from_input(Input::Value(&serde_json::Value::Object(
            object,
        ))))
    }

    /// A buffered deserializer's contents (kube-client's watch events).
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Ok(T::from_input(Input::Value(&value)))
    }
}

/// serde_json's message without its ` at line 1 column 312` (a position in
/// one object's text means nothing to the reader; the field path does).
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(at) if e.line() > 0 => text[..at].to_owned(),
        _ => text,
    }
}

/// A Service's model input, decoded from anything serde reads (the
/// directory source's general path); a problem is an error naming the field.
pub struct ServiceInput(pub ServiceInfo);

/// An EndpointSlice's model input (see [`SliceInfo::share`]), as [`ServiceInput`].
pub struct SliceInput(pub SliceInfo);

impl<'de> Deserialize<'de> for ServiceInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        WireService::deserialize(d)?.info().map(ServiceInput)
    }
}

impl<'de> Deserialize<'de> for SliceInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(SliceInput(WireSlice::deserialize(d)?.info()))
    }
}

/// The watch's view of the kind: what a watcher needs to list and watch
/// it (the k8s-openapi type's kind, group, version and plural) and the
/// decoded object's metadata.
macro_rules! watched_as {
    ($object:ty, $k8s:ty, $scope:ty) => {
        impl kube::Resource for $object {
            type DynamicType = ();
            type Scope = $scope;
            fn kind(dt: &()) -> Cow<'_, str> {
                <$k8s as kube::Resource>::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                <$k8s as kube::Resource>::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                <$k8s as kube::Resource>::version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                <$k8s as kube::Resource>::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.meta
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.meta
            }
        }
    };
}

watched_as!(
    ServiceObject,
    k8s_openapi::api::core::v1::Service,
    k8s_openapi::NamespaceResourceScope
);
watched_as!(
    SliceObject,
    k8s_openapi::api::discovery::v1::EndpointSlice,
    k8s_openapi::NamespaceResourceScope
);

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use serde_json::{json, Value};

    use super::*;
    use crate::model::Interner;

    /// A Service that sets every field the model reads, and some it does not.
    fn full_service() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {
                "name": "web", "namespace": "shop", "resourceVersion": "42",
                "creationTimestamp": "2025-01-02T03:04:05Z",
                "uid": "0f0e", "generation": 3,
                "labels": {"app": "web", "service.kubernetes.io/service-proxy-name": "sb",
                           "service.kubernetes.io/headless": ""},
                "annotations": {"switchboard.io/lb-algorithm": "maglev", "note": "x"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
            },
            "spec": {
                "type": "LoadBalancer", "clusterIP": "10.96.0.10",
                "clusterIPs": ["10.96.0.10", "fd00:96::a"],
                "ipFamilies": ["IPv4", "IPv6", "IPv7"], "ipFamilyPolicy": "PreferDualStack",
                "externalIPs": ["192.0.2.1"], "loadBalancerSourceRanges": ["10.0.0.0/8"],
                "sessionAffinity": "ClientIP",
                "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}},
                "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Cluster",
                "healthCheckNodePort": 31000,
                "selector": {"app": "web"},
                "ports": [
                    {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080},
                    {"protocol": "UDP", "port": 53, "targetPort": "dns"}
                ]
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.9", "ipMode": "VIP"}, {"hostname": "lb.example"}]},
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Up", "message": "",
                                        "lastTransitionTime": "2025-01-02T03:04:05Z"}]}
        })
    }

    fn full_slice() -> Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": "web-abcde", "resourceVersion": "7",
                "labels": {"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": "x"},
                "annotations": {
                    "endpoints.kubernetes.io/last-change-trigger-time": "2025-01-02T03:04:05Z",
                    "switchboard.io/weights": "10.244.1.5=3"
                },
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "u"}]
            },
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.1.5", "10.244.1.6"],
                 "conditions": {"ready": true, "serving": true, "terminating": false},
                 "nodeName": "node-a", "zone": "z1", "targetRef": {"kind": "Pod", "name": "p"},
                 "hints": {"forZones": [{"name": "z1"}], "forNodes": [{"name": "node-a"}]}},
                {"addresses": [" 10.244.1.7"], "nodeName": "node-a"},
                {"addresses": []},
                {"conditions": null}
            ],
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080, "appProtocol": "http"}, {"port": 53}]
        })
    }

    fn k8s_service(v: &Value) -> ServiceInfo {
        ServiceInfo::from_k8s(&serde_json::from_value::<Service>(v.clone()).expect("k8s"))
    }

    fn k8s_slice(v: &Value) -> SliceInfo {
        let slice = serde_json::from_value::<EndpointSlice>(v.clone()).expect("k8s");
        SliceInfo::from_k8s(&slice, &mut Interner::default())
    }

    fn wire_slice(text: &str) -> SliceInfo {
        let obj: SliceObject = serde_json::from_str(text).expect("wire");
        let mut info = obj.info.expect("decodable");
        info.share(&mut Interner::default());
        info
    }

    fn wire_service(text: &str) -> ServiceObject {
        serde_json::from_str(text).expect("wire")
    }

    /// The decoder gives what the k8s-openapi types and their conversion
    /// give, from JSON text (borrowed strings) and from a parsed value.
    #[test]
    fn the_model_reads_what_it_read_from_the_k8s_objects() {
        for v in [
            full_service(),
            json!({"metadata": {"name": "bare"}}),
            json!({}),
        ] {
            let text = v.to_string();
            let info = wire_service(&text).info.expect("decodable");
            assert_eq!(info, k8s_service(&v), "{text}");
            let from_value: ServiceInput = serde_path_to_error::deserialize(&v).expect("value");
            assert_eq!(from_value.0, info);
        }
        for v in [
            full_slice(),
            json!({"metadata": {"name": "bare"}}),
            json!({}),
        ] {
            let text = v.to_string();
            assert_eq!(wire_slice(&text), k8s_slice(&v), "{text}");
            let from_value: SliceInput = serde_path_to_error::deserialize(&v).expect("value");
            let mut info = from_value.0;
            info.share(&mut Interner::default());
            assert_eq!(info, k8s_slice(&v), "{text}");
        }
    }

    #[test]
    fn the_watch_gets_the_identity_only() {
        let obj = wire_service(&full_service().to_string());
        assert_eq!(obj.meta.name.as_deref(), Some("web"));
        assert_eq!(obj.meta.namespace.as_deref(), Some("shop"));
        assert_eq!(obj.meta.resource_version.as_deref(), Some("42"));
        assert!(obj.meta.labels.is_none() && obj.meta.managed_fields.is_none());
        let slice = wire_slice(&full_slice().to_string());
        assert_eq!(slice.key, ObjectKey::new("default", "web-abcde"));
    }

    /// The problem of an object the model cannot read, by field; the
    /// object still carries its identity.
    fn undecodable_service(v: &Value) -> (ObjectMeta, String) {
        let obj = wire_service(&v.to_string());
        (obj.meta, obj.info.expect_err("undecodable").problem)
    }

    #[test]
    fn a_field_the_model_reads_with_the_wrong_type_is_named() {
        let mut v = full_service();
        v["spec"]["ports"][1]["port"] = json!("eighty");
        let (meta, problem) = undecodable_service(&v);
        assert_eq!(
            problem,
            r#"spec.ports[1].port: invalid type: string "eighty", expected i32"#
        );
        assert_eq!(
            (meta.namespace.as_deref(), meta.name.as_deref()),
            (Some("shop"), Some("web"))
        );
        assert_eq!(meta.resource_version.as_deref(), Some("42"));
        let err = serde_path_to_error::deserialize::<_, ServiceInput>(&v)
            .err()
            .expect("bad port");
        assert_eq!(err.path().to_string(), "spec.ports[1].port");

        let mut v = full_slice();
        v["endpoints"][0]["conditions"]["ready"] = json!("yes");
        let obj: SliceObject = serde_json::from_str(&v.to_string()).expect("wire");
        let problem = obj.info.expect_err("bad ready").problem;
        assert!(
            problem.starts_with("endpoints[0].conditions.ready: invalid type: string"),
            "{problem}"
        );
        assert_eq!(obj.meta.name.as_deref(), Some("web-abcde"));

        let mut v = full_service();
        v["metadata"]["labels"]["app"] = json!(3);
        let (_, problem) = undecodable_service(&v);
        assert_eq!(
            problem,
            "metadata.labels.app: invalid type: integer `3`, expected a string"
        );

        let mut v = full_service();
        v["metadata"]["creationTimestamp"] = json!("yesterday");
        let (meta, problem) = undecodable_service(&v);
        assert!(
            problem.starts_with(r#"metadata.creationTimestamp "yesterday": "#),
            "{problem}"
        );
        assert_eq!(meta.name.as_deref(), Some("web"));

        // Not even the name reads: the problem still does.
        let (meta, problem) = undecodable_service(&json!({"metadata": {"name": 7}}));
        assert_eq!(meta.name, None);
        assert!(
            problem.starts_with("metadata.name: invalid type"),
            "{problem}"
        );
    }

    /// One bad object in a list page costs only itself.
    #[test]
    fn a_bad_item_leaves_the_rest_of_its_page_readable() {
        let mut bad = full_service();
        bad["metadata"]["name"] = json!("bad");
        bad["spec"]["ports"] = json!({"port": 80});
        let mut good = full_service();
        good["metadata"]["name"] = json!("good");
        let page = json!({"items": [full_service(), bad, good]}).to_string();
        #[derive(Deserialize)]
        struct Page {
            items: Vec<ServiceObject>,
        }
        let page: Page = serde_json::from_str(&page).expect("the page reads");
        let names: Vec<_> = page
            .items
            .iter()
            .map(|o| (o.meta.name.clone().unwrap_or_default(), o.info.is_ok()))
            .collect();
        assert_eq!(
            names,
            [
                ("web".into(), true),
                ("bad".into(), false),
                ("good".into(), true)
            ]
        );
        assert_eq!(
            page.items[1].info.as_ref().expect_err("bad").problem,
            "spec.ports: invalid type: map, expected a sequence"
        );
    }

    /// A list page's objects are decoded from their text (no tree of
    /// values); a watch event, which kube-client decodes through serde's
    /// buffer (the event is adjacently tagged), through a tree: the same
    /// objects, the same problems.
    #[test]
    fn pages_are_decoded_from_text_and_watch_events_through_a_tree() {
        #[derive(Deserialize)]
        struct Page {
            items: Vec<ServiceObject>,
        }
        #[derive(Deserialize)]
        #[serde(tag = "type", content = "object")]
        enum Event {
            #[serde(rename = "ADDED")]
            Added(ServiceObject),
        }
        let mut bad = full_service();
        bad["spec"]["ports"][0]["port"] = json!(true);
        let before = FROM_TEXT.with(|n| n.get());
        let page: Page =
            serde_json::from_str(&json!({"items": [full_service(), bad.clone()]}).to_string())
                .expect("page");
        assert_eq!(FROM_TEXT.with(|n| n.get()) - before, 2, "from text");

        let before = FROM_TEXT.with(|n| n.get());
        let events: Vec<ServiceObject> = [full_service(), bad]
            .into_iter()
            .map(|o| {
                let line = json!({"type": "ADDED", "object": o}).to_string();
                let Event::Added(obj) = serde_json::from_str(&line).expect("event");
                obj
            })
            .collect();
        assert_eq!(FROM_TEXT.with(|n| n.get()), before, "through a tree");
        for (listed, watched) in page.items.iter().zip(&events) {
            assert_eq!(listed.info, watched.info);
            assert_eq!(listed.meta, watched.meta);
        }
        assert_eq!(
            events[1].info.as_ref().expect_err("bad").problem,
            "spec.ports[0].port: invalid type: boolean `true`, expected i32"
        );
    }

    #[test]
    fn fields_the_model_does_not_read_are_not_looked_at() {
        let mut v = full_service();
        v["spec"]["selector"] = json!(["not", "a", "map"]);
        v["metadata"]["managedFields"] = json!(17);
        let info = wire_service(&v.to_string()).info.expect("skipped");
        assert_eq!(info.key, ObjectKey::new("shop", "web"));
    }

    #[test]
    fn shared_strings_are_shared_after_share() {
        let text = full_slice().to_string();
        let mut interner = Interner::default();
        let decode = |interner: &mut Interner| {
            let obj: SliceObject = serde_json::from_str(&text).expect("wire");
            let mut info = obj.info.expect("decodable");
            info.share(interner);
            info
        };
        let a = decode(&mut interner);
        let b = decode(&mut interner);
        let node = |s: &SliceInfo| {
            s.endpoints
                .get(0)
                .and_then(|e| e.node_name.cloned())
                .expect("node")
        };
        assert!(Arc::ptr_eq(&node(&a), &node(&b)));
        assert!(Arc::ptr_eq(&a.address_type, &b.address_type));
    }
}
