//! From a Service's EndpointSlices to the backends of one of its ports:
//! conditions read once per slice, the same address merged across slices,
//! then kube-proxy's cluster and local selections (with topology hints and
//! the serving-and-terminating fallback).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use std::collections::HashSet;

use super::{
    port_u16, BackendAddr, Endpoint, IpFamily, ModelWarning, NodeInfo, Protocol, SliceInfo,
    TopologyMode, ANNOTATION_WEIGHTS,
};

/// One endpoint address as the model sees it, after conditions are read.
#[derive(Clone, Debug)]
pub(super) struct Ep {
    ip: IpAddr,
    ready: bool,
    serving: bool,
    terminating: bool,
    local: bool,
    /// From the slice's `switchboard.io/weights` (1 when not listed).
    weight: u16,
    node_hints: BTreeSet<Arc<str>>,
    zone_hints: BTreeSet<Arc<str>>,
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
pub(super) struct ParsedSlice<'a> {
    slice: &'a SliceInfo,
    /// The slice's `addressType`: every endpoint kept is of this family.
    family: IpFamily,
    object: String,
    endpoints: Vec<Ep>,
}

impl ParsedSlice<'_> {
    /// The slice's copy of the port name `name`, if one of its ports has
    /// it (the sources share each name between every slice naming it).
    pub fn port_name(&self, name: &str) -> Option<&Arc<str>> {
        self.slice
            .ports
            .iter()
            .filter_map(|p| p.name.as_ref())
            .find(|n| ***n == *name)
    }
}

/// The backends chosen for one frontend and why.
#[derive(Default)]
pub(super) struct Selection {
    pub backends: Vec<BackendAddr>,
    /// The backends whose weight is not 1, sorted.
    pub weights: Vec<(BackendAddr, u16)>,
    pub terminating_fallback: bool,
    pub topology: Option<TopologyMode>,
}

/// Reads slices for one Service on one node, collecting warnings.
pub(super) struct Endpoints<'n, 'w> {
    pub node: Option<&'n NodeInfo>,
    pub warnings: &'w mut Vec<ModelWarning>,
}

impl Endpoints<'_, '_> {
    fn warn(&mut self, object: &str, problem: impl Into<String>) {
        self.warnings.push(ModelWarning {
            object: object.to_owned(),
            problem: problem.into(),
        });
    }

    /// Reads a slice's endpoints once. `None` for slices that are neither
    /// IPv4 nor IPv6.
    pub fn parse_slice<'s>(&mut self, slice: &'s SliceInfo) -> Option<ParsedSlice<'s>> {
        let object = format!("EndpointSlice {}", slice.key);
        let family = match &*slice.address_type {
            "" => {
                self.warn(&object, "has no addressType; ignored");
                return None;
            }
            other => IpFamily::from_k8s(other)?, // FQDN slices are not ours
        };
        let weights = self.slice_weights(slice, &object);
        let mut endpoints = Vec::new();
        for ep in slice.endpoints.iter() {
            let Some(first) = &ep.address else {
                self.warn(&object, "an endpoint has no addresses; ignored");
                continue;
            };
            if ep.address_count > 1 {
                self.warn(
                    &object,
                    format!(
                        "endpoint {first} lists {} addresses; only the first is used (as kube-proxy does)",
                        ep.address_count
                    ),
                );
            }
            let Some(ip) = first.ip().filter(|ip| IpFamily::of(*ip) == family) else {
                self.warn(
                    &object,
                    format!(
                        "endpoint address {:?} is not an {family} address; skipped",
                        first.to_string()
                    ),
                );
                continue;
            };
            let mut parsed = self.endpoint(&ep, ip);
            if let Some(weight) = weights.get(&ip) {
                parsed.weight = *weight;
            }
            endpoints.push(parsed);
        }
        let listed: HashSet<IpAddr> = endpoints.iter().map(|e| e.ip).collect();
        let mut unknown: Vec<String> = weights
            .keys()
            .filter(|ip| !listed.contains(ip))
            .map(ToString::to_string)
            .collect();
        if !unknown.is_empty() {
            unknown.sort();
            self.warn(
                &object,
                format!(
                    "annotation {ANNOTATION_WEIGHTS}: {} not an endpoint of this slice; ignored",
                    unknown.join(", ")
                ),
            );
        }
        Some(ParsedSlice {
            slice,
            family,
            object,
            endpoints,
        })
    }

    /// The weights the slice's annotation gives its addresses; one that does
    /// not parse is reported and every endpoint of the slice weighs 1.
    fn slice_weights(&mut self, slice: &SliceInfo, object: &str) -> HashMap<IpAddr, u16> {
        let Some(raw) = slice.weights.as_deref() else {
            return HashMap::new();
        };
        match parse_weights(raw) {
            Ok(weights) => weights,
            Err(problem) => {
                self.warn(
                    object,
                    format!(
                        "annotation {ANNOTATION_WEIGHTS}: {problem}; ignored (every endpoint of this slice weighs 1)"
                    ),
                );
                HashMap::new()
            }
        }
    }

    fn endpoint(&self, ep: &Endpoint<'_>, ip: IpAddr) -> Ep {
        let hints = ep.hints;
        Ep {
            ip,
            // `ready` as the slice says. kube-proxy never reads the Service's
            // publishNotReadyAddresses: the EndpointSlice controller applies it
            // when it writes `ready`, and a hand-written slice says what it means.
            ready: ep.ready.unwrap_or(true),
            serving: ep.serving.unwrap_or(true),
            terminating: ep.terminating.unwrap_or(false),
            local: match (self.node, ep.node_name) {
                (Some(n), Some(epn)) => *n.name == **epn,
                _ => false,
            },
            weight: 1,
            node_hints: hints
                .map(|h| h.for_nodes.iter().cloned().collect())
                .unwrap_or_default(),
            zone_hints: hints
                .map(|h| h.for_zones.iter().cloned().collect())
                .unwrap_or_default(),
        }
    }

    /// The endpoints serving one Service port for frontends of `family`
    /// across that family's slices (kube-proxy reads only the slices of a
    /// proxier's address type): the slice port with the same name and
    /// protocol gives the target port (per slice), and an address:port seen
    /// in several slices counts once.
    pub fn for_port(
        &mut self,
        parsed: &[ParsedSlice],
        port_name: &str,
        protocol: Protocol,
        family: IpFamily,
    ) -> Vec<(BackendAddr, Ep)> {
        let mut merged: BTreeMap<BackendAddr, Ep> = BTreeMap::new();
        for ps in parsed.iter().filter(|ps| ps.family == family) {
            let matching = ps.slice.ports.iter().find(|p| {
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
                        "port {port_name:?}/{protocol} {what}; its endpoints are not used for it"
                    ),
                );
                continue;
            };
            for ep in &ps.endpoints {
                merge(&mut merged, BackendAddr { ip: ep.ip, port }, ep);
            }
        }
        merged.into_iter().collect()
    }

    /// kube-proxy's "cluster" endpoints: ready ones (narrowed by topology hints
    /// when usable); if none is ready anywhere, the serving-and-terminating ones.
    pub fn cluster_selection(&self, eps: &[(BackendAddr, Ep)]) -> Selection {
        let topology = self.node.and_then(|n| topology_mode(eps, n));
        let ready: Vec<BackendAddr> = eps
            .iter()
            .filter(|(_, e)| e.ready)
            .filter(|(_, e)| match (topology, self.node) {
                (Some(TopologyMode::SameNode), Some(n)) => e.node_hints.contains(n.name.as_str()),
                (Some(TopologyMode::SameZone), Some(n)) => {
                    n.zone.as_deref().is_some_and(|z| e.zone_hints.contains(z))
                }
                _ => true,
            })
            .map(|(a, _)| *a)
            .collect();
        if !ready.is_empty() {
            return Selection {
                weights: weights_of(eps, &ready),
                backends: ready,
                terminating_fallback: false,
                topology,
            };
        }
        fallback(eps, |_| true)
    }

    /// kube-proxy's "local" endpoints: this node's ready ones, or if it has
    /// none, this node's serving-and-terminating ones.
    pub fn local_selection(&self, eps: &[(BackendAddr, Ep)]) -> Selection {
        let local_ready: Vec<BackendAddr> = eps
            .iter()
            .filter(|(_, e)| e.local && e.ready)
            .map(|(a, _)| *a)
            .collect();
        if !local_ready.is_empty() {
            return Selection {
                weights: weights_of(eps, &local_ready),
                backends: local_ready,
                ..Selection::default()
            };
        }
        fallback(eps, |e| e.local)
    }
}

/// Adds one slice's endpoint; an address already seen keeps the better
/// condition, and is local if either says so.
fn merge(merged: &mut BTreeMap<BackendAddr, Ep>, addr: BackendAddr, ep: &Ep) {
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

/// The serving-and-terminating endpoints among those `eligible`.
fn fallback(eps: &[(BackendAddr, Ep)], eligible: impl Fn(&Ep) -> bool) -> Selection {
    let backends: Vec<BackendAddr> = eps
        .iter()
        .filter(|(_, e)| eligible(e) && e.serving && e.terminating)
        .map(|(a, _)| *a)
        .collect();
    Selection {
        terminating_fallback: !backends.is_empty(),
        weights: weights_of(eps, &backends),
        backends,
        topology: None,
    }
}

/// The weights other than 1 of `chosen` (sorted, as `eps` is).
fn weights_of(eps: &[(BackendAddr, Ep)], chosen: &[BackendAddr]) -> Vec<(BackendAddr, u16)> {
    eps.iter()
        .filter(|(a, e)| e.weight != 1 && chosen.binary_search(a).is_ok())
        .map(|(a, e)| (*a, e.weight))
        .collect()
}

/// Parses a `switchboard.io/weights` value: `address=weight` pairs, comma
/// separated, spaces allowed around each part; weights `0..=65535`, each
/// address once.
pub(super) fn parse_weights(raw: &str) -> Result<HashMap<IpAddr, u16>, String> {
    let mut weights = HashMap::new();
    for pair in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((addr, weight)) = pair.split_once('=') else {
            return Err(format!("{pair:?} is not address=weight"));
        };
        let Ok(ip) = addr.trim().parse::<IpAddr>() else {
            return Err(format!("{:?} is not an IP address", addr.trim()));
        };
        let Ok(weight) = weight.trim().parse::<u16>() else {
            return Err(format!(
                "weight {:?} of {ip} is not a whole number in 0..=65535",
                weight.trim()
            ));
        };
        if weights.insert(ip, weight).is_some() {
            return Err(format!("{ip} is listed twice"));
        }
    }
    Ok(weights)
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
        && ready
            .iter()
            .any(|e| e.node_hints.contains(node.name.as_str()))
    {
        return Some(TopologyMode::SameNode);
    }
    let zone = node.zone.as_deref()?;
    if ready.iter().all(|e| !e.zone_hints.is_empty())
        && ready.iter().any(|e| e.zone_hints.contains(zone))
    {
        return Some(TopologyMode::SameZone);
    }
    None
}
