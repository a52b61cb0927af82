//! The model kept up to date one object at a time.
//!
//! A changed Service or EndpointSlice marks its Service dirty; [`Model::update`]
//! recomputes only dirty Services ([`service::compute`]) and reports the
//! frontend addresses whose desired state changed, so the sync touches those
//! and nothing else. A change to this node (its addresses, zone or name)
//! marks every Service dirty.
//!
//! A version of an object that cannot be used (an object-level error, see
//! [`super::validate`]) is not recorded: the model keeps the last version of
//! that object it could use, and reports the new one's problems by field
//! ([`Model::rejections`]). Deleting the object forgets both.
//!
//! Two Services may claim one address. The older claim owns it: the earlier
//! `metadata.creationTimestamp` (a Service without one counts as newest), then
//! namespace, then name; so a new Service never takes a live address from a
//! running one. The others wait in `contested`, each with its own frontend,
//! and the next in order takes over when the owner lets go. The result is the
//! same as building everything at once over the last usable version of each
//! object ([`super::build_for_node`] does exactly that through this type),
//! which a test checks over random sequences of changes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::service::{self, ServiceOutput};
use super::validate;
use super::{
    DesiredState, Frontend, FrontendAddr, Keyed, ModelWarning, NodeInfo, ObjectKey, ServiceInfo,
    SliceInfo,
};

/// Which claim on an address wins: the smallest. The creation time in
/// milliseconds since the epoch (`i64::MAX` when unknown: newest), then the key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Rank {
    created_ms: i64,
    key: ObjectKey,
}

impl Rank {
    fn of(svc: Option<&ServiceInfo>, key: &ObjectKey) -> Rank {
        Rank {
            created_ms: svc.and_then(|s| s.created_unix_ms).unwrap_or(i64::MAX),
            key: key.clone(),
        }
    }
}

/// The kind of object a [`Rejection`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum ObjectKind {
    Service,
    EndpointSlice,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Service => "Service",
            ObjectKind::EndpointSlice => "EndpointSlice",
        }
    }
}

/// An object whose newest version cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// `true`: an earlier version is kept in its place (its last good
    /// state); `false`: the object was never usable and nothing of it is
    /// programmed.
    pub held: bool,
    /// For a slice: the Service (same namespace) its kept version serves.
    pub service: Option<ObjectKey>,
    /// `field: problem`, one per bad field.
    pub problems: Vec<String>,
    /// The warnings in force for it.
    warnings: Vec<ModelWarning>,
}

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

/// One Service's slices, sorted by name: the usual one inline (no block
/// of its own), more in a vector.
#[derive(Debug)]
enum ServiceSlices {
    One(Arc<SliceInfo>),
    Many(Vec<Arc<SliceInfo>>),
}

impl ServiceSlices {
    fn as_slice(&self) -> &[Arc<SliceInfo>] {
        match self {
            ServiceSlices::One(slice) => std::slice::from_ref(slice),
            ServiceSlices::Many(slices) => slices,
        }
    }

    /// Changes the list with `f`; returns whether it is empty now.
    fn edit(&mut self, f: impl FnOnce(&mut Vec<Arc<SliceInfo>>)) -> bool {
        let mut list = match std::mem::replace(self, ServiceSlices::Many(Vec::new())) {
            ServiceSlices::One(slice) => vec![slice],
            ServiceSlices::Many(slices) => slices,
        };
        f(&mut list);
        let empty = list.is_empty();
        *self = match <[Arc<SliceInfo>; 1]>::try_from(list) {
            Ok([one]) => ServiceSlices::One(one),
            Err(list) => ServiceSlices::Many(list),
        };
        empty
    }
}

/// An object in a set found by its key (a map would hold every key twice:
/// 32 bytes per object more, at 100k Services 6 MiB).
#[derive(Debug)]
struct ByKey<T>(Arc<T>);

impl<T: Keyed> ByKey<T> {
    fn key(&self) -> &ObjectKey {
        self.0.key()
    }
}

impl<T: Keyed> PartialEq for ByKey<T> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl<T: Keyed> Eq for ByKey<T> {}

impl<T: Keyed> std::hash::Hash for ByKey<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl<T: Keyed> std::borrow::Borrow<ObjectKey> for ByKey<T> {
    fn borrow(&self) -> &ObjectKey {
        self.key()
    }
}

/// The frontends an update touched, as they were before it.
type Before = HashMap<FrontendAddr, Option<Box<Frontend>>>;

/// What a Service currently claims, and the warnings it (and its slices)
/// raised. Held for every Service, so boxed slices (no spare capacity),
/// and of its rank only the creation time (the key is the map's).
#[derive(Debug)]
struct Claims {
    /// The creation time the addresses were claimed with ([`Rank`]).
    created_ms: i64,
    addrs: Box<[FrontendAddr]>,
    warnings: Box<[ModelWarning]>,
}

/// Dirty Services computed together (over the cores) before their outputs
/// are put in place: what one batch's outputs hold at once.
const COMPUTE_BATCH: usize = 8192;

/// Services per thread below which [`Model::update`] computes on its own
/// thread.
const COMPUTE_PER_THREAD_MIN: usize = 512;

/// The desired state, maintained incrementally.
#[derive(Debug)]
pub struct Model {
    node: Option<NodeInfo>,
    proxy_name: Option<String>,
    /// By key: the object's own (see [`ByKey`]).
    services: HashSet<ByKey<ServiceInfo>>,
    slices: HashSet<ByKey<SliceInfo>>,
    /// Slices by the Service they name (same namespace), sorted by slice
    /// name. A Service has one slice per 100 endpoints, so a sorted list
    /// is both the smallest and a fast enough container.
    slices_by_service: HashMap<ObjectKey, ServiceSlices>,
    claims: HashMap<ObjectKey, Claims>,
    /// The creation time of each address's owner: with the owner's key (the
    /// Service its frontend in `desired` names), its [`Rank`].
    owners: HashMap<FrontendAddr, i64>,
    /// Claims that lost an address to an older Service: address → claimant → its frontend.
    contested: HashMap<FrontendAddr, BTreeMap<Rank, Frontend>>,
    /// Objects whose newest version cannot be used.
    rejections: BTreeMap<(ObjectKind, ObjectKey), Rejection>,
    /// Warnings to replace at the next update: (gone, new), from rejections
    /// and from the source.
    pending_warnings: Vec<(Vec<ModelWarning>, Vec<ModelWarning>)>,
    /// Problems the source reported (files, the directory), in force.
    source_problems: Vec<ModelWarning>,
    /// The warnings about each contested address (one per losing claimant).
    conflict_warnings: HashMap<FrontendAddr, Vec<ModelWarning>>,
    /// Every warning in force, counted (two objects may raise the same text).
    warnings: BTreeMap<ModelWarning, u32>,
    desired: DesiredState,
    dirty: HashSet<ObjectKey>,
    /// The most backends one frontend may have (`--max-endpoints-per-service`).
    max_endpoints: usize,
}

impl Model {
    /// An empty model for this node. `proxy_name`: our
    /// `service.kubernetes.io/service-proxy-name` (see [`super::ProxyLabels::selected`]).
    pub fn new(node: Option<NodeInfo>, proxy_name: Option<String>) -> Model {
        Model {
            node,
            proxy_name,
            services: HashSet::new(),
            slices: HashSet::new(),
            slices_by_service: HashMap::new(),
            claims: HashMap::new(),
            owners: HashMap::new(),
            contested: HashMap::new(),
            rejections: BTreeMap::new(),
            pending_warnings: Vec::new(),
            source_problems: Vec::new(),
            conflict_warnings: HashMap::new(),
            warnings: BTreeMap::new(),
            desired: DesiredState::default(),
            dirty: HashSet::new(),
            max_endpoints: usize::from(proxy_common::capacity::DEFAULT_BACKENDS_PER_SERVICE),
        }
    }

    /// Sets the most backends one frontend may have (at most
    /// [`proxy_common::capacity::MAX_BACKENDS_PER_SERVICE`], which the data
    /// path can index); every Service is recomputed.
    pub fn set_max_endpoints_per_port(&mut self, max: u16) {
        let max = usize::from(max.clamp(1, proxy_common::capacity::MAX_BACKENDS_PER_SERVICE));
        if max == self.max_endpoints {
            return;
        }
        self.max_endpoints = max;
        self.dirty
            .extend(self.services.iter().map(ByKey::key).cloned());
        self.dirty.extend(self.claims.keys().cloned());
    }

    /// Records a Service's new version (`None`: deleted). A version that
    /// cannot be used leaves the last usable one in place (see the module).
    pub fn set_service(&mut self, key: ObjectKey, info: Option<Arc<ServiceInfo>>) {
        let problems = match &info {
            Some(svc) if svc.labels.selected(self.proxy_name.as_deref()) => {
                validate::service_problems(svc)
            }
            _ => Vec::new(),
        };
        let held = !problems.is_empty() && self.services.contains(&key);
        self.set_rejection(ObjectKind::Service, &key, problems, held, None);
        if self
            .rejections
            .contains_key(&(ObjectKind::Service, key.clone()))
        {
            return;
        }
        self.use_service(key, info);
    }

    fn use_service(&mut self, key: ObjectKey, info: Option<Arc<ServiceInfo>>) {
        let unchanged = match (&info, self.services.get(&key)) {
            (Some(new), Some(ByKey(old))) => Arc::ptr_eq(new, old) || new == old,
            (None, None) => true,
            _ => false,
        };
        if unchanged {
            return;
        }
        match info {
            Some(info) => {
                debug_assert_eq!(info.key, key, "a Service is recorded under its own key");
                self.services.replace(ByKey(info));
            }
            None => {
                self.services.remove(&key);
            }
        };
        self.dirty.insert(key);
    }

    /// Records an EndpointSlice's new version (`None`: deleted). A version
    /// that cannot be used leaves the last usable one in place.
    pub fn set_slice(&mut self, key: ObjectKey, info: Option<Arc<SliceInfo>>) {
        let problems = match &info {
            Some(slice) if slice.labels.selected(self.proxy_name.as_deref()) => {
                validate::slice_problems(slice)
            }
            _ => Vec::new(),
        };
        let kept = self.slices.get(&key).map(|k| &k.0);
        let held = !problems.is_empty() && kept.is_some();
        let service = kept.and_then(|s| slice_service(s));
        self.set_rejection(ObjectKind::EndpointSlice, &key, problems, held, service);
        if self
            .rejections
            .contains_key(&(ObjectKind::EndpointSlice, key.clone()))
        {
            return;
        }
        self.use_slice(key, info);
    }

    /// Records (empty `problems`: clears) an object's rejection; its
    /// warnings change at the next update.
    fn set_rejection(
        &mut self,
        kind: ObjectKind,
        key: &ObjectKey,
        problems: Vec<String>,
        held: bool,
        service: Option<ObjectKey>,
    ) {
        let id = (kind, key.clone());
        let new = if problems.is_empty() {
            None
        } else {
            let warnings =
                validate::rejection_warnings(&format!("{} {key}", kind.as_str()), &problems, held);
            Some(Rejection {
                held,
                service,
                problems,
                warnings,
            })
        };
        let old = match new {
            Some(new) => {
                if self.rejections.get(&id) == Some(&new) {
                    return;
                }
                let added = new.warnings.clone();
                let old = self.rejections.insert(id, new);
                self.pending_warnings
                    .push((old.map(|o| o.warnings).unwrap_or_default(), added));
                return;
            }
            None => self.rejections.remove(&id),
        };
        if let Some(old) = old {
            self.pending_warnings.push((old.warnings, Vec::new()));
        }
    }

    /// Objects whose newest version cannot be used, with what is wrong.
    pub fn rejections(&self) -> impl Iterator<Item = (ObjectKind, &ObjectKey, &Rejection)> {
        self.rejections
            .iter()
            .map(|((kind, key), r)| (*kind, key, r))
    }

    /// Replaces the problems the source reports about its own input (files
    /// that do not parse, a directory that cannot be read); they are among
    /// [`warnings`](Self::warnings) from the next update on.
    pub fn set_source_problems(&mut self, mut problems: Vec<ModelWarning>) {
        problems.sort();
        problems.dedup();
        if problems == self.source_problems {
            return;
        }
        let old = std::mem::replace(&mut self.source_problems, problems.clone());
        self.pending_warnings.push((old, problems));
    }

    fn use_slice(&mut self, key: ObjectKey, info: Option<Arc<SliceInfo>>) {
        let old = match (&info, self.slices.get(&key).map(|k| &k.0)) {
            (Some(new), Some(old)) if Arc::ptr_eq(new, old) || new == old => return,
            (None, None) => return,
            (_, old) => old.cloned(),
        };
        if let Some(old) = old {
            self.slices.remove(&key);
            if let Some(service) = slice_service(&old) {
                if let Some(list) = self.slices_by_service.get_mut(&service) {
                    let empty = list.edit(|list| list.retain(|s| s.key.name != key.name));
                    if empty {
                        self.slices_by_service.remove(&service);
                    }
                }
                self.dirty.insert(service);
            }
        }
        if let Some(new) = info {
            if let Some(service) = slice_service(&new) {
                let list = self
                    .slices_by_service
                    .entry(service.clone())
                    .or_insert_with(|| ServiceSlices::Many(Vec::new()));
                list.edit(|list| {
                    let at = list.partition_point(|s| s.key.name < key.name);
                    list.insert(at, Arc::clone(&new));
                });
                self.dirty.insert(service);
            }
            debug_assert_eq!(new.key, key, "a slice is recorded under its own key");
            self.slices.replace(ByKey(new));
        }
    }

    /// Records this node's new state; every Service is recomputed.
    pub fn set_node(&mut self, node: Option<NodeInfo>) {
        if node == self.node {
            return;
        }
        self.node = node;
        self.dirty
            .extend(self.services.iter().map(ByKey::key).cloned());
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
        // real changes. Boxed: a first sync touches every address, none of
        // which had a frontend, and an inline `Option<Frontend>` would cost
        // a whole frontend's bytes for each.
        let mut before: Before = HashMap::new();
        for (old, new) in std::mem::take(&mut self.pending_warnings) {
            self.count_warnings(&old, &new, &mut delta);
        }
        // Claims settle to the same owners in any order (the oldest
        // claimant always owns), so dirty Services need no sorting.
        let dirty: Vec<ObjectKey> = std::mem::take(&mut self.dirty).into_iter().collect();
        for batch in dirty.chunks(COMPUTE_BATCH) {
            for (key, output) in batch.iter().zip(self.compute_all(batch)) {
                self.settle(key.clone(), output, &mut before, &mut delta);
            }
        }
        for (addr, old) in before {
            self.conflicts(&addr, &mut delta);
            if self.desired.frontends.get(&addr) != old.as_deref() {
                delta.frontends.insert(addr);
            }
        }
        delta.warnings_added.sort();
        delta.warnings_removed.sort();
        delta
    }

    /// [`compute`](Self::compute) of each of `keys`, in order: spread over
    /// the cores when there are many (a start computes every Service; each
    /// computation reads the model and nothing else).
    fn compute_all(&self, keys: &[ObjectKey]) -> Vec<ServiceOutput> {
        crate::util::cores::chunks_on_cores(keys, COMPUTE_PER_THREAD_MIN, |chunk| {
            chunk.iter().map(|key| self.compute(key)).collect()
        })
    }

    /// Puts a dirty Service's new output in place of its old claims.
    fn settle(
        &mut self,
        key: ObjectKey,
        output: ServiceOutput,
        before: &mut Before,
        delta: &mut ModelDelta,
    ) {
        let old = self.claims.remove(&key);
        if let Some(old) = &old {
            let rank = Rank {
                created_ms: old.created_ms,
                key: key.clone(),
            };
            for addr in &old.addrs {
                self.remember(before, addr);
                self.withdraw(&rank, addr);
            }
        }
        let old_warnings = old.map(|o| o.warnings).unwrap_or_default();
        self.count_warnings(&old_warnings, &output.warnings, delta);
        let rank = Rank::of(self.services.get(&key).map(|s| &*s.0), &key);
        let mut addrs = Vec::with_capacity(output.frontends.len());
        for fe in output.frontends {
            self.remember(before, &fe.addr);
            addrs.push(fe.addr);
            self.claim(&rank, fe);
        }
        if !addrs.is_empty() || !output.warnings.is_empty() {
            let claims = Claims {
                created_ms: rank.created_ms,
                addrs: addrs.into(),
                warnings: output.warnings.into(),
            };
            self.claims.insert(key, claims);
        }
        delta.services += 1;
    }

    /// The Service's frontends and warnings now; nothing when it is gone or
    /// belongs to another proxy.
    fn compute(&self, key: &ObjectKey) -> ServiceOutput {
        let Some(ByKey(svc)) = self.services.get(key) else {
            return ServiceOutput::default();
        };
        if !svc.labels.selected(self.proxy_name.as_deref()) {
            return ServiceOutput::default();
        }
        let slices: Vec<&SliceInfo> = self
            .slices_by_service
            .get(key)
            .map(ServiceSlices::as_slice)
            .into_iter()
            .flatten()
            .filter(|s| s.labels.selected(self.proxy_name.as_deref()))
            .map(|s| &**s)
            .collect();
        service::compute(svc, &slices, self.node.as_ref(), self.max_endpoints)
    }

    fn remember(&self, before: &mut Before, addr: &FrontendAddr) {
        before
            .entry(*addr)
            .or_insert_with(|| self.desired.frontends.get(addr).cloned().map(Box::new));
    }

    /// The rank of `addr`'s owner: its creation time, and the key of the
    /// Service its frontend names.
    fn owner(&self, addr: &FrontendAddr) -> Option<Rank> {
        let created_ms = *self.owners.get(addr)?;
        let service = &self.desired.frontends.get(addr)?.service;
        Some(Rank {
            created_ms,
            key: ObjectKey {
                namespace: Arc::clone(&service.namespace),
                name: Arc::clone(&service.name),
            },
        })
    }

    /// Drops the claim of rank `rank` on `addr`; when it owned the address,
    /// the next claimant in order takes it over.
    fn withdraw(&mut self, rank: &Rank, addr: &FrontendAddr) {
        if self.owner(addr).as_ref() != Some(rank) {
            if let Some(waiting) = self.contested.get_mut(addr) {
                waiting.remove(rank);
                if waiting.is_empty() {
                    self.contested.remove(addr);
                }
            }
            return;
        }
        self.desired.frontends.remove(addr);
        self.owners.remove(addr);
        if let Some(waiting) = self.contested.get_mut(addr) {
            if let Some((next_rank, next)) = waiting.pop_first() {
                self.desired.frontends.insert(*addr, next);
                self.owners.insert(*addr, next_rank.created_ms);
            }
            if waiting.is_empty() {
                self.contested.remove(addr);
            }
        }
    }

    /// Adds a claim: it owns the address unless an older Service does.
    fn claim(&mut self, rank: &Rank, fe: Frontend) {
        let addr = fe.addr;
        let Some(owner_rank) = self.owner(&addr) else {
            self.desired.frontends.insert(addr, fe);
            self.owners.insert(addr, rank.created_ms);
            return;
        };
        if *rank < owner_rank {
            let displaced = self.desired.frontends.insert(addr, fe);
            self.owners.insert(addr, rank.created_ms);
            if let Some(displaced) = displaced {
                self.contested
                    .entry(addr)
                    .or_default()
                    .insert(owner_rank, displaced);
            }
        } else {
            self.contested
                .entry(addr)
                .or_default()
                .insert(rank.clone(), fe);
        }
    }

    /// Re-derives the warnings about one address: one per claimant that lost it.
    fn conflicts(&mut self, addr: &FrontendAddr, delta: &mut ModelDelta) {
        let new: Vec<ModelWarning> = match (self.desired.frontends.get(addr), self.contested.get(addr)) {
            (Some(owner), Some(waiting)) => waiting
                .iter()
                .map(|(rank, fe)| ModelWarning {
                    object: format!("Service {}", rank.key),
                    problem: format!(
                        "{} frontend {} is already used by the older Service {} ({}); not programmed",
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
    fn count_warnings(
        &mut self,
        old: &[ModelWarning],
        new: &[ModelWarning],
        delta: &mut ModelDelta,
    ) {
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
        delta
            .warnings_removed
            .retain(|w| !self.warnings.contains_key(w));
    }
}

/// The Service a slice belongs to (its `kubernetes.io/service-name` label).
fn slice_service(slice: &SliceInfo) -> Option<ObjectKey> {
    slice.service_name.as_ref().map(|name| ObjectKey {
        namespace: Arc::clone(&slice.key.namespace),
        name: Arc::clone(name),
    })
}
