//! The model kept up to date one object at a time.
//!
//! A changed Service or EndpointSlice marks its Service dirty; [`Model::update`]
//! recomputes only dirty Services ([`service::compute`]) and reports the
//! frontend addresses whose desired state changed, so the sync touches those
//! and nothing else. A change to this node (its addresses, zone or name)
//! marks every Service dirty.
//!
//! Two Services may claim one address. The claim that sorts first (namespace,
//! then name) owns it; the others wait in `contested`, each with its own
//! frontend, and the next in order takes over when the owner lets go. The
//! result is the same as building everything at once ([`super::build_for_node`]
//! does exactly that through this type), which a test checks over random
//! sequences of changes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::service::{self, ServiceOutput};
use super::{DesiredState, Frontend, FrontendAddr, ModelWarning, NodeInfo, ObjectKey, ServiceInfo, SliceInfo};

/// What one [`Model::update`] changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelDelta {
    /// Frontend addresses added, changed or removed.
    pub frontends: BTreeSet<FrontendAddr>,
    /// Services recomputed.
    pub services: usize,
    /// Warnings that appeared, and those that went away.
    pub warnings_added: Vec<ModelWarning>,
    pub warnings_removed: Vec<ModelWarning>,
}

/// What a Service currently claims, and the warnings it (and its slices) raised.
#[derive(Debug, Default)]
struct Claims {
    addrs: Vec<FrontendAddr>,
    warnings: Vec<ModelWarning>,
}

/// The desired state, maintained incrementally.
#[derive(Debug, Default)]
pub struct Model {
    node: Option<NodeInfo>,
    proxy_name: Option<String>,
    services: HashMap<ObjectKey, Arc<ServiceInfo>>,
    slices: HashMap<ObjectKey, Arc<SliceInfo>>,
    /// Slices by the Service they name (same namespace), sorted by slice
    /// name. A Service has one slice per 100 endpoints, so a sorted Vec is
    /// both the smallest and a fast enough container.
    slices_by_service: HashMap<ObjectKey, Vec<Arc<SliceInfo>>>,
    claims: HashMap<ObjectKey, Claims>,
    /// Claims that lost an address to an earlier Service: address → claimant → its frontend.
    contested: HashMap<FrontendAddr, BTreeMap<ObjectKey, Frontend>>,
    /// The warnings about each contested address (one per losing claimant).
    conflict_warnings: HashMap<FrontendAddr, Vec<ModelWarning>>,
    /// Every warning in force, counted (two objects may raise the same text).
    warnings: BTreeMap<ModelWarning, u32>,
    desired: DesiredState,
    dirty: HashSet<ObjectKey>,
}

impl Model {
    /// An empty model for this node. `proxy_name`: our
    /// `service.kubernetes.io/service-proxy-name` (see [`super::ProxyLabels::selected`]).
    pub fn new(node: Option<NodeInfo>, proxy_name: Option<String>) -> Model {
        Model {
            node,
            proxy_name,
            ..Model::default()
        }
    }

    /// Records a Service's new version (`None`: deleted).
    pub fn set_service(&mut self, key: ObjectKey, info: Option<Arc<ServiceInfo>>) {
        let unchanged = match (&info, self.services.get(&key)) {
            (Some(new), Some(old)) => Arc::ptr_eq(new, old) || new == old,
            (None, None) => true,
            _ => false,
        };
        if unchanged {
            return;
        }
        match info {
            Some(info) => self.services.insert(key.clone(), info),
            None => self.services.remove(&key),
        };
        self.dirty.insert(key);
    }

    /// Records an EndpointSlice's new version (`None`: deleted).
    pub fn set_slice(&mut self, key: ObjectKey, info: Option<Arc<SliceInfo>>) {
        let old = match (&info, self.slices.get(&key)) {
            (Some(new), Some(old)) if Arc::ptr_eq(new, old) || new == old => return,
            (None, None) => return,
            (_, old) => old.cloned(),
        };
        if let Some(old) = old {
            self.slices.remove(&key);
            if let Some(service) = slice_service(&old) {
                if let Some(list) = self.slices_by_service.get_mut(&service) {
                    list.retain(|s| s.key.name != key.name);
                    if list.is_empty() {
                        self.slices_by_service.remove(&service);
                    }
                }
                self.dirty.insert(service);
            }
        }
        if let Some(new) = info {
            if let Some(service) = slice_service(&new) {
                let list = self.slices_by_service.entry(service.clone()).or_default();
                let at = list.partition_point(|s| s.key.name < key.name);
                list.insert(at, Arc::clone(&new));
                self.dirty.insert(service);
            }
            self.slices.insert(key, new);
        }
    }

    /// Records this node's new state; every Service is recomputed.
    pub fn set_node(&mut self, node: Option<NodeInfo>) {
        if node == self.node {
            return;
        }
        self.node = node;
        self.dirty.extend(self.services.keys().cloned());
        self.dirty.extend(self.claims.keys().cloned());
    }

    /// Everything that should be programmed, as of the last [`update`](Self::update).
    pub fn desired(&self) -> &DesiredState {
        &self.desired
    }

    /// Every warning in force, sorted, each once.
    pub fn warnings(&self) -> impl Iterator<Item = &ModelWarning> {
        self.warnings.keys()
    }

    /// The desired state, leaving the model empty (one-shot builds).
    pub fn into_desired(self) -> DesiredState {
        self.desired
    }

    /// Recomputes the Services touched since the last update.
    pub fn update(&mut self) -> ModelDelta {
        let mut delta = ModelDelta::default();
        // Each touched address's frontend before this update, to report only
        // real changes.
        let mut before: HashMap<FrontendAddr, Option<Frontend>> = HashMap::new();
        // Claims settle to the same owners in any order (the earliest
        // claimant always owns), so dirty Services need no sorting.
        for key in std::mem::take(&mut self.dirty) {
            let output = self.compute(&key);
            let old = self.claims.remove(&key).unwrap_or_default();
            for addr in &old.addrs {
                self.remember(&mut before, addr);
                self.withdraw(&key, addr);
            }
            self.count_warnings(&old.warnings, &output.warnings, &mut delta);
            let mut claims = Claims {
                addrs: Vec::with_capacity(output.frontends.len()),
                warnings: output.warnings,
            };
            for fe in output.frontends {
                self.remember(&mut before, &fe.addr);
                claims.addrs.push(fe.addr);
                self.claim(&key, fe);
            }
            if !claims.addrs.is_empty() || !claims.warnings.is_empty() {
                self.claims.insert(key, claims);
            }
            delta.services += 1;
        }
        for (addr, old) in before {
            self.conflicts(&addr, &mut delta);
            if self.desired.frontends.get(&addr) != old.as_ref() {
                delta.frontends.insert(addr);
            }
        }
        delta.warnings_added.sort();
        delta.warnings_removed.sort();
        delta
    }

    /// The Service's frontends and warnings now; nothing when it is gone or
    /// belongs to another proxy.
    fn compute(&self, key: &ObjectKey) -> ServiceOutput {
        let Some(svc) = self.services.get(key) else {
            return ServiceOutput::default();
        };
        if !svc.labels.selected(self.proxy_name.as_deref()) {
            return ServiceOutput::default();
        }
        let slices: Vec<&SliceInfo> = self
            .slices_by_service
            .get(key)
            .into_iter()
            .flatten()
            .filter(|s| s.labels.selected(self.proxy_name.as_deref()))
            .map(|s| &**s)
            .collect();
        service::compute(svc, &slices, self.node.as_ref())
    }

    fn remember(&self, before: &mut HashMap<FrontendAddr, Option<Frontend>>, addr: &FrontendAddr) {
        before
            .entry(*addr)
            .or_insert_with(|| self.desired.frontends.get(addr).cloned());
    }

    /// Drops `key`'s claim on `addr`; when it owned the address, the next
    /// claimant in order takes it over.
    fn withdraw(&mut self, key: &ObjectKey, addr: &FrontendAddr) {
        let owns = self
            .desired
            .frontends
            .get(addr)
            .is_some_and(|fe| owned_by(fe, key));
        if !owns {
            if let Some(waiting) = self.contested.get_mut(addr) {
                waiting.remove(key);
                if waiting.is_empty() {
                    self.contested.remove(addr);
                }
            }
            return;
        }
        self.desired.frontends.remove(addr);
        if let Some(waiting) = self.contested.get_mut(addr) {
            if let Some((_, next)) = waiting.pop_first() {
                self.desired.frontends.insert(*addr, next);
            }
            if waiting.is_empty() {
                self.contested.remove(addr);
            }
        }
    }

    /// Adds `key`'s claim: it owns the address unless an earlier Service does.
    fn claim(&mut self, key: &ObjectKey, fe: Frontend) {
        let addr = fe.addr;
        let Some(owner) = self.desired.frontends.get(&addr) else {
            self.desired.frontends.insert(addr, fe);
            return;
        };
        let owner_key = owner_key(owner);
        if *key < owner_key {
            let displaced = self.desired.frontends.insert(addr, fe);
            if let Some(displaced) = displaced {
                self.contested.entry(addr).or_default().insert(owner_key, displaced);
            }
        } else {
            self.contested.entry(addr).or_default().insert(key.clone(), fe);
        }
    }

    /// Re-derives the warnings about one address: one per claimant that lost it.
    fn conflicts(&mut self, addr: &FrontendAddr, delta: &mut ModelDelta) {
        let new: Vec<ModelWarning> = match (self.desired.frontends.get(addr), self.contested.get(addr)) {
            (Some(owner), Some(waiting)) => waiting
                .iter()
                .map(|(key, fe)| ModelWarning {
                    object: format!("Service {key}"),
                    problem: format!(
                        "{} frontend {} is already used by {} ({}); ignored",
                        fe.kind, fe.addr, owner.service, owner.kind
                    ),
                })
                .collect(),
            _ => Vec::new(),
        };
        let old = self.conflict_warnings.remove(addr).unwrap_or_default();
        self.count_warnings(&old, &new, delta);
        if !new.is_empty() {
            self.conflict_warnings.insert(*addr, new);
        }
    }

    /// Replaces one object's warnings in the counted set.
    fn count_warnings(&mut self, old: &[ModelWarning], new: &[ModelWarning], delta: &mut ModelDelta) {
        for w in new {
            let count = self.warnings.entry(w.clone()).or_insert(0);
            *count += 1;
            if *count == 1 {
                delta.warnings_added.push(w.clone());
            }
        }
        for w in old {
            if let Some(count) = self.warnings.get_mut(w) {
                *count -= 1;
                if *count == 0 {
                    self.warnings.remove(w);
                    match delta.warnings_added.iter().position(|a| a == w) {
                        Some(i) => {
                            delta.warnings_added.swap_remove(i);
                        }
                        None => delta.warnings_removed.push(w.clone()),
                    }
                }
            }
        }
        // A warning removed and raised again within one update is no change.
        delta.warnings_removed.retain(|w| !self.warnings.contains_key(w));
    }
}

/// The Service a slice belongs to (its `kubernetes.io/service-name` label).
fn slice_service(slice: &SliceInfo) -> Option<ObjectKey> {
    slice.service_name.as_ref().map(|name| ObjectKey {
        namespace: Arc::clone(&slice.key.namespace),
        name: Arc::from(name.as_str()),
    })
}

fn owned_by(fe: &Frontend, key: &ObjectKey) -> bool {
    *fe.service.namespace == *key.namespace && *fe.service.name == *key.name
}

fn owner_key(fe: &Frontend) -> ObjectKey {
    ObjectKey::new(fe.service.namespace.clone(), fe.service.name.clone())
}
