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
    EndpointInfo, Hints, IpFamilyPolicy, LbIngress, ObjectKey, ProxyLabels, Raw, RawAddress,
    ServiceInfo, ServicePortInfo, ServiceSpecInfo, SliceInfo, SlicePortInfo,
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
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut picked = T::default();
        while let Some(key) = map.next_key::<Str<'de>>()? {
            let value = map.next_value::<Str<'de>>()?;
            picked.pick(&key, value);
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
                session_affinity: shared(spec.session_affinity),
                affinity_timeout_s: spec
                    .session_affinity_config
                    .and_then(|c| c.client_ip)
                    .and_then(|c| c.timeout_seconds),
                external_traffic_policy: shared(spec.external_traffic_policy),
                internal_traffic_policy: shared(spec.internal_traffic_policy),
                health_check_node_port: spec.health_check_node_port,
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

/// A Service as decoded: its identity for the watch, and the model's input.
#[derive(Clone, Debug)]
pub struct ServiceObject {
    /// Name, namespace and resourceVersion only.
    pub meta: ObjectMeta,
    pub info: ServiceInfo,
}

/// An EndpointSlice as decoded (its shared strings not yet shared: see
/// [`SliceInfo::share`]).
#[derive(Clone, Debug)]
pub struct SliceObject {
    /// Name, namespace and resourceVersion only.
    pub meta: ObjectMeta,
    pub info: SliceInfo,
}

impl<'de> Deserialize<'de> for ServiceObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = WireService::deserialize(d)?;
        let meta = wire.metadata.object_meta();
        Ok(ServiceObject {
            meta,
            info: wire.info()?,
        })
    }
}

impl<'de> Deserialize<'de> for SliceObject {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = WireSlice::deserialize(d)?;
        let meta = wire.metadata.object_meta();
        Ok(SliceObject {
            meta,
            info: wire.info(),
        })
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

/// The model's input for a Service, decoded from anything serde reads.
pub fn service_info<'de, D: Deserializer<'de>>(d: D) -> Result<ServiceInfo, D::Error> {
    WireService::deserialize(d)?.info()
}

/// The model's input for an EndpointSlice (see [`SliceInfo::share`]).
pub fn slice_info<'de, D: Deserializer<'de>>(d: D) -> Result<SliceInfo, D::Error> {
    Ok(WireSlice::deserialize(d)?.info())
}

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

    fn wire_slice(text: &str) -> SliceObject {
        let mut obj: SliceObject = serde_json::from_str(text).expect("wire");
        obj.info.share(&mut Interner::default());
        obj
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
            let obj: ServiceObject = serde_json::from_str(&text).expect("wire");
            assert_eq!(obj.info, k8s_service(&v), "{text}");
            let from_value: ServiceObject = serde_path_to_error::deserialize(&v).expect("value");
            assert_eq!(from_value.info, obj.info);
        }
        for v in [
            full_slice(),
            json!({"metadata": {"name": "bare"}}),
            json!({}),
        ] {
            let text = v.to_string();
            assert_eq!(wire_slice(&text).info, k8s_slice(&v), "{text}");
        }
    }

    #[test]
    fn the_watch_gets_the_identity_only() {
        let obj: ServiceObject = serde_json::from_str(&full_service().to_string()).expect("wire");
        assert_eq!(obj.meta.name.as_deref(), Some("web"));
        assert_eq!(obj.meta.namespace.as_deref(), Some("shop"));
        assert_eq!(obj.meta.resource_version.as_deref(), Some("42"));
        assert!(obj.meta.labels.is_none() && obj.meta.managed_fields.is_none());
        let slice = wire_slice(&full_slice().to_string());
        assert_eq!(slice.info.key, ObjectKey::new("default", "web-abcde"));
    }

    #[test]
    fn a_field_the_model_reads_with_the_wrong_type_is_named() {
        let mut v = full_service();
        v["spec"]["ports"][1]["port"] = json!("eighty");
        let err = serde_path_to_error::deserialize::<_, ServiceObject>(&v).expect_err("bad port");
        assert_eq!(err.path().to_string(), "spec.ports[1].port");
        assert!(err.to_string().contains("expected i32"), "{err}");

        let mut v = full_slice();
        v["endpoints"][0]["conditions"]["ready"] = json!("yes");
        let err = serde_path_to_error::deserialize::<_, SliceObject>(&v).expect_err("bad ready");
        assert_eq!(err.path().to_string(), "endpoints[0].conditions.ready");

        let mut v = full_service();
        v["metadata"]["labels"]["app"] = json!(3);
        assert!(
            serde_json::from_value::<ServiceObject>(v).is_err(),
            "labels are strings"
        );

        let mut v = full_service();
        v["metadata"]["creationTimestamp"] = json!("yesterday");
        assert!(serde_json::from_value::<ServiceObject>(v).is_err());
    }

    #[test]
    fn fields_the_model_does_not_read_are_not_looked_at() {
        let mut v = full_service();
        v["spec"]["selector"] = json!(["not", "a", "map"]);
        v["metadata"]["managedFields"] = json!(17);
        let obj: ServiceObject = serde_json::from_value(v).expect("skipped");
        assert_eq!(obj.info.key, ObjectKey::new("shop", "web"));
    }

    #[test]
    fn shared_strings_are_shared_after_share() {
        let text = full_slice().to_string();
        let mut interner = Interner::default();
        let mut a: SliceObject = serde_json::from_str(&text).expect("wire");
        let mut b: SliceObject = serde_json::from_str(&text).expect("wire");
        a.info.share(&mut interner);
        b.info.share(&mut interner);
        let node = |s: &SliceObject| {
            s.info
                .endpoints
                .get(0)
                .and_then(|e| e.node_name.cloned())
                .expect("node")
        };
        assert!(Arc::ptr_eq(&node(&a), &node(&b)));
        assert!(Arc::ptr_eq(&a.info.address_type, &b.info.address_type));
    }
}
