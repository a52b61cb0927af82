//! Sync: turn the desired state (from the model) into the smallest set of map
//! writes, ordered so that every slot a lookup can reach names a backend that
//! exists (no lookup meets a missing slot or backend).
//!
//! Write order for one frontend:
//! 1. reverse-NAT entry and backend entries (invisible until a slot names them);
//! 2. backend slots `1..=n` that changed (survivors keep their slot, so a
//!    change rewrites only the slots that really change);
//! 3. slot 0 with the new count (slots added past the old count become
//!    visible here, all at once; a changed slot below it was overwritten in
//!    place in step 2, so it is visible a moment earlier);
//! 4. slots past the new count are deleted, then backends nobody uses.
//!
//! A removed frontend loses slot 0 first (new packets stop matching at once),
//! then its slots, its reverse-NAT entry and its connection-tracking entries.
//! UDP flows pinned to a backend that left a service are forgotten, so the next
//! datagram picks a live backend (the stale-DNS-flow problem). The same goes
//! for the socket layer's per-socket entries; the connected UDP sockets among
//! them are reported ([`SyncReport::udp_sockets_left`]) so the agent can close
//! them, since no hook runs on their later sends.
//!
//! Both address families are synced the same way: a frontend, its backends
//! and its reverse-NAT entry go to its family's maps (`SB_FE6_V1`,
//! `SB_BE6_V1`, `SB_RNAT6_V1` for IPv6), picked by the key or value
//! ([`crate::sync::encode::AnyFrontendKey`]). Service ids and backend ids come from
//! one allocator each, so an id names an entry in exactly one family's map;
//! the Maglev tables (by service id) are shared. Each family's map has the
//! full capacity, so capacity is counted per family.
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;

use proxy_common::{
    capacity, frontend_flags, proto, scope, sock_dir, CtEntry, CtEntry6, CtKey, CtKey6,
    FrontendSlot, MaglevTable, SockEntry, SockEntry6, SockKey, SockKey6,
};
use tracing::{debug, warn};

use crate::model::cidr::IpCidr;
use crate::{
    model::{BackendAddr, DesiredState, Frontend, FrontendAddr, IpFamily, LbAlgorithm, Protocol},
    sync::backends::Backends,
    sync::encode::{
        backend_addr, backend_value, frontend_addr, frontend_key, ipv4, ipv6, proto_number,
        revnat_name, revnat_value, scoped_key, slot_zero_attributes, AnyBackend, AnyFrontendKey,
        AnyRevNat, FrontendDefaults,
    },
    sync::maglev::BackendKey,
    sync::store::Capacities,
    sync::store::{MapStore, WriteError},
};

/// What one frontend looks like in the maps. Held for every frontend, so
/// boxed slices (no spare capacity) rather than vectors.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Programmed {
    service_id: u32,
    /// The name its reverse-NAT entry was written with, hashed
    /// ([`NameHash`]): only ever compared, to rewrite the entry when the
    /// name changes (the name itself is in the map; the model has it too).
    name: NameHash,
    /// [`frontend_flags`] and the affinity timeout written in slot 0.
    flags: u16,
    affinity_timeout_s: u32,
    /// Backend id per slot, slot 1 first.
    slots: Box<[u32]>,
    /// The external (local-only) set's backend ids per slot, under
    /// [`scope::EXTERNAL`]: `Some` exactly when the frontend has one
    /// (`externalTrafficPolicy: Local`).
    external: Option<Box<[u32]>>,
    /// The `loadBalancerSourceRanges` blocks in the frontend's family's
    /// trie under its service id (sorted; empty without ranges).
    ranges: Box<[IpCidr]>,
    /// The shares per slot of the sets that are weighted
    /// ([`frontend_flags::WEIGHTED`]); `None` when neither is.
    weights: Option<Box<Shares>>,
}

/// A reverse-NAT name as the sync remembers it: 8 bytes per frontend
/// rather than a copy of the string (a `Service ns/name:port` at 100k
/// frontends took 4 MiB with its allocations). Two names that differ hash
/// alike once in 2^64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct NameHash(u64);

impl NameHash {
    fn of(name: &str) -> NameHash {
        use std::hash::{Hash as _, Hasher as _};
        // SipHash with fixed keys: the same name hashes alike in every run.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h);
        NameHash(h.finish())
    }
}

/// Each weighted set's share per slot (0: a drained backend's slot, past
/// the count new flows pick from).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Shares {
    internal: Option<Box<[u16]>>,
    external: Option<Box<[u16]>>,
}

impl Programmed {
    /// The shares per slot of set `scope`, if it is weighted.
    fn shares(&self, scope: u8) -> Option<&[u16]> {
        let weights = self.weights.as_deref()?;
        match scope {
            scope::INTERNAL => weights.internal.as_deref(),
            _ => weights.external.as_deref(),
        }
    }

    /// Frontend map entries this frontend uses.
    fn entries(&self) -> usize {
        1 + self.slots.len() + self.external.as_ref().map_or(0, |e| 1 + e.len())
    }
}

/// A count per address family.
#[derive(Clone, Copy, Debug, Default)]
struct PerFamily {
    v4: usize,
    v6: usize,
}

impl PerFamily {
    fn of(&mut self, family: IpFamily) -> &mut usize {
        match family {
            IpFamily::V4 => &mut self.v4,
            IpFamily::V6 => &mut self.v6,
        }
    }
}

/// A frontend the sync could not program, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unprogrammed {
    pub frontend: FrontendAddr,
    pub service: String,
    pub reason: String,
}

/// What one [`Syncer::apply`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    pub added: usize,
    pub updated: usize,
    pub removed: usize,
    pub unchanged: usize,
    /// Map entries written or deleted.
    pub writes: usize,
    /// Connection-tracking entries removed.
    pub conntrack_purged: usize,
    /// Socket-layer entries removed.
    pub sockets_purged: usize,
    /// Sockets the socket layer had balanced to a UDP backend that has now left
    /// its service: (socket cookie, backend). A connected one must be closed.
    pub udp_sockets_left: Vec<(u64, BackendAddr)>,
    pub failed: Vec<Unprogrammed>,
}

pub struct Syncer<S: MapStore> {
    store: S,
    caps: Capacities,
    programmed: BTreeMap<FrontendAddr, Programmed>,
    /// Every backend entry written, by address and by id.
    backends: Backends,
    service_ids: BTreeSet<u32>,
    next_service_id: u32,
    next_backend_id: u32,
    /// Frontend map entries in use (slot 0 plus one per backend, per
    /// frontend), per family: each family's map has the capacity.
    frontend_entries: PerFamily,
    /// Source-range trie entries in use, per family.
    range_entries: PerFamily,
    /// For frontends whose Service does not choose (`switchboard.io/lb-algorithm`).
    defaults: FrontendDefaults,
    /// Frontends the last syncs could not program; retried at every sync
    /// (a removal elsewhere may have made room).
    failed: BTreeMap<FrontendAddr, Unprogrammed>,
    /// The maps were reloaded after a failed write: the next sync compares
    /// every frontend, not only the changed ones.
    needs_full: bool,
    /// What the drift check knows of the Maglev tables written, and where
    /// its rotation goes on ([`heal::maglev`]).
    maglev_watch: heal::maglev::Watch,
}

/// Whether a sync into empty maps may write in batches (off when retrying
/// after a failed batch).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Batching {
    Allowed,
    Off,
}

/// A sync into empty maps with at least this many frontends writes in batches.
const BATCH_FROM: usize = 64;

/// Connection-tracking entries to drop once an apply has finished.
#[derive(Default)]
struct Purge {
    services: HashSet<u32>,
    udp_backends: HashSet<(u32, u32)>,
    /// The families whose tables hold entries to drop (each table is
    /// scanned only when one of its frontends left or lost a UDP backend).
    v4: bool,
    v6: bool,
}

impl Purge {
    fn family(&mut self, family: IpFamily) {
        match family {
            IpFamily::V4 => self.v4 = true,
            IpFamily::V6 => self.v6 = true,
        }
    }

    /// An entry of a removed service port, or a UDP flow to a backend that
    /// left its service.
    fn dooms(&self, proto: u8, service_id: u32, backend_id: u32) -> bool {
        self.services.contains(&service_id)
            || (proto == proto::UDP && self.udp_backends.contains(&(service_id, backend_id)))
    }
}

impl<S: MapStore> Syncer<S> {
    /// Starts from what the maps already hold (a restarted agent adopts the
    /// pinned state instead of flushing it). Entries that belong to no complete
    /// frontend are removed.
    pub fn adopt(store: S, caps: Capacities) -> Self {
        let mut syncer = Self {
            store,
            caps,
            programmed: BTreeMap::new(),
            backends: Backends::default(),
            service_ids: BTreeSet::new(),
            next_service_id: 1,
            next_backend_id: 1,
            frontend_entries: PerFamily::default(),
            range_entries: PerFamily::default(),
            defaults: FrontendDefaults::default(),
            failed: BTreeMap::new(),
            needs_full: false,
            maglev_watch: heal::maglev::Watch::default(),
        };
        syncer.reload();
        syncer.needs_full = false;
        syncer
    }

    /// The algorithm of frontends whose Service names none (`--lb-algorithm`).
    pub fn set_default_algorithm(&mut self, algorithm: LbAlgorithm) {
        self.defaults.algorithm = algorithm;
    }

    /// Whether NodePort, LoadBalancer and external-IP frontends return
    /// flows to other nodes directly (`--nodeport-mode dsr`).
    pub fn set_direct_return(&mut self, direct_return: bool) {
        self.defaults.direct_return = direct_return;
    }

    /// What the agent's flags decide for every frontend, as slot 0 records it.
    pub fn defaults(&self) -> FrontendDefaults {
        self.defaults
    }

    /// The frontends not programmed, and why (capacity).
    pub fn unprogrammed(&self) -> impl Iterator<Item = &Unprogrammed> {
        self.failed.values()
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The map store, for a new syncer to adopt (a restart, in tests).
    pub fn into_store(self) -> S {
        self.store
    }

    /// The map store, for tests that set up kernel state directly. Writes here
    /// bypass the sync's bookkeeping.
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// Rebuilds the in-memory view from the maps and removes orphans.
    fn reload(&mut self) {
        let dump = self.store.dump();
        self.programmed.clear();
        self.maglev_watch.forget();
        self.backends.clear();
        self.service_ids.clear();
        self.frontend_entries = PerFamily::default();
        self.range_entries = PerFamily::default();
        let mut ranges: HashMap<u32, Vec<IpCidr>> = HashMap::new();
        for (id, block) in &dump.source_ranges {
            ranges.entry(*id).or_default().push(*block);
        }

        // Each family's backends by id. Ids are one space: an id found in
        // both maps (a crash between a delete and a reuse) is kept for the
        // first frontend that uses it; another family's frontend naming it
        // is dropped and rewritten with a fresh id.
        let backends: HashMap<(IpFamily, u32), AnyBackend> = dump
            .backends
            .iter()
            .map(|(id, b)| ((b.family(), *id), *b))
            .collect();
        let revnat: HashMap<u32, AnyRevNat> = dump.revnat.iter().copied().collect();
        let slots: HashMap<AnyFrontendKey, FrontendSlot> = dump.frontends.iter().copied().collect();
        let mut keep_slots: HashSet<AnyFrontendKey> = HashSet::new();
        let mut keep_backends: HashSet<(u32, IpFamily)> = HashSet::new();
        let mut service_family: HashMap<u32, IpFamily> = HashMap::new();

        for (key, head) in dump
            .frontends
            .iter()
            .filter(|(k, _)| k.slot() == 0 && k.scope() == scope::INTERNAL)
        {
            let Some(addr) = frontend_addr(key) else {
                continue;
            };
            let internal = complete_slots(&slots, &backends, key, head);
            // Outer `None`: announced but incomplete; inner `None`: no
            // external set.
            let external: Option<Option<SlotSet>> = if frontend_flags::has_external_set(head.flags)
            {
                let ext_key = key.at(scope::EXTERNAL, 0);
                slots
                    .get(&ext_key)
                    .and_then(|ext_head| complete_slots(&slots, &backends, &ext_key, ext_head))
                    .map(Some)
            } else {
                Some(None)
            };
            let (Some((ids, internal_shares)), Some(external)) = (internal, external) else {
                // Half-written by a crash: drop it; the next apply rewrites it.
                warn!(frontend = %addr, "adopting maps: incomplete frontend entry removed");
                continue;
            };
            if head.service_id == 0
                || service_family
                    .get(&head.service_id)
                    .is_some_and(|f| *f != addr.family())
            {
                warn!(frontend = %addr, "adopting maps: incomplete frontend entry removed");
                continue;
            }
            let (external, external_shares) = match external {
                Some((ids, shares)) => (Some(ids), shares),
                None => (None, None),
            };
            let other_family = ids.iter().chain(external.iter().flatten()).any(|id| {
                self.backends
                    .get(*id)
                    .is_some_and(|(b, _)| b.family() != addr.family())
            });
            if other_family {
                warn!(frontend = %addr, "adopting maps: a backend id of this frontend is used by the other address family; the frontend is rewritten");
                continue;
            }
            for (scope, set) in [
                (scope::INTERNAL, Some(&ids)),
                (scope::EXTERNAL, external.as_ref()),
            ] {
                let Some(set) = set else { continue };
                for slot in 0..=set.len() as u16 {
                    keep_slots.insert(key.at(scope, slot));
                }
                for id in set {
                    keep_backends.insert((*id, addr.family()));
                    let backend = backends[&(addr.family(), *id)];
                    self.backends
                        .hold(*id, backend_addr(&backend), addr.protocol);
                }
            }
            let name = revnat
                .get(&head.service_id)
                .filter(|r| r.family() == addr.family())
                .map(revnat_name)
                .unwrap_or_default();
            self.service_ids.insert(head.service_id);
            service_family.insert(head.service_id, addr.family());
            // Blocks of the other family under this id are orphans.
            let mut blocks: Vec<IpCidr> = ranges
                .get(&head.service_id)
                .into_iter()
                .flatten()
                .filter(|b| b.is_ipv4() == (addr.family() == IpFamily::V4))
                .copied()
                .collect();
            blocks.sort();
            let weights = (internal_shares.is_some() || external_shares.is_some()).then(|| {
                Box::new(Shares {
                    internal: internal_shares.map(Into::into),
                    external: external_shares.map(Into::into),
                })
            });
            let programmed = Programmed {
                service_id: head.service_id,
                name: NameHash::of(&name),
                flags: head.flags & !frontend_flags::WEIGHTED,
                affinity_timeout_s: head.affinity_timeout_s,
                slots: ids.into(),
                external: external.map(Into::into),
                ranges: blocks.into(),
                weights,
            };
            *self.frontend_entries.of(addr.family()) += programmed.entries();
            *self.range_entries.of(addr.family()) += programmed.ranges.len();
            if heal::maglev::hashed(programmed.flags) {
                self.maglev_watch.adopted(addr, programmed.service_id);
            }
            self.programmed.insert(addr, programmed);
        }
        // Orphans: slots of dropped frontends, unused backends and rev-NAT entries.
        for key in slots.keys().filter(|k| !keep_slots.contains(k)) {
            log_write(self.store.delete_frontend(*key));
        }
        for (id, backend) in &dump.backends {
            if !keep_backends.contains(&(*id, backend.family())) {
                log_write(self.store.delete_backend(*id, backend.family()));
            }
        }
        for (id, rnat) in &dump.revnat {
            if service_family.get(id) != Some(&rnat.family()) {
                log_write(self.store.delete_revnat(*id, rnat.family()));
            }
        }
        for (id, block) in &dump.source_ranges {
            let family = if block.is_ipv4() {
                IpFamily::V4
            } else {
                IpFamily::V6
            };
            if service_family.get(id) != Some(&family) {
                log_write(self.store.delete_source_range(*id, *block));
            }
        }
        self.next_service_id = self.service_ids.last().map_or(1, |id| id + 1);
        self.next_backend_id = self.backends.max_id().map_or(1, |id| id + 1);
    }

    /// The frontends programmed now, with their backends (sorted, each once).
    pub fn programmed(&self) -> impl Iterator<Item = (&FrontendAddr, Vec<BackendAddr>)> {
        self.programmed.iter().map(|(addr, p)| {
            let mut backends = self.addrs_of(&p.slots);
            backends.dedup();
            (addr, backends)
        })
    }

    /// Brings the maps to `desired`, writing only what differs. Compares
    /// every frontend: for the first sync and after the maps were reloaded;
    /// otherwise [`apply_changed`](Self::apply_changed) does less work.
    pub fn apply(&mut self, desired: &DesiredState) -> SyncReport {
        self.sync_all(desired, Batching::Allowed)
    }

    /// Brings only the `changed` frontends to `desired` (those the model
    /// reported added, changed or removed): removals first, so the entries
    /// they free are there for what is added. Frontends that failed before
    /// are tried again; [`SyncReport::failed`] lists every frontend not
    /// programmed after this sync. After a failed write (the maps were
    /// reloaded) it compares every frontend instead.
    pub fn apply_changed(
        &mut self,
        desired: &DesiredState,
        changed: &BTreeSet<FrontendAddr>,
    ) -> SyncReport {
        if self.needs_full {
            return self.apply(desired);
        }
        self.sync_frontends(desired, changed, Batching::Allowed)
    }

    /// Every frontend programmed or desired.
    fn sync_all(&mut self, desired: &DesiredState, batching: Batching) -> SyncReport {
        self.needs_full = false;
        let mut addrs: BTreeSet<FrontendAddr> = self
            .programmed
            .keys()
            .filter(|addr| !desired.frontends.contains_key(addr))
            .copied()
            .collect();
        addrs.extend(desired.frontends.keys().copied());
        self.sync_frontends(desired, &addrs, batching)
    }

    fn sync_frontends(
        &mut self,
        desired: &DesiredState,
        changed: &BTreeSet<FrontendAddr>,
        batching: Batching,
    ) -> SyncReport {
        let mut retry: BTreeSet<FrontendAddr> = self.failed.keys().copied().collect();
        let changed = if retry.is_empty() {
            changed
        } else {
            retry.extend(changed.iter().copied());
            &retry
        };
        let mut report = SyncReport::default();
        let mut purge = Purge::default();
        let mut failed_write = false;

        for addr in changed
            .iter()
            .filter(|a| !desired.frontends.contains_key(a))
        {
            self.failed.remove(addr);
            if !self.programmed.contains_key(addr) {
                continue;
            }
            match self.remove(addr, &mut purge, &mut report.writes) {
                Ok(()) => report.removed += 1,
                Err(error) => {
                    failed_write = true;
                    warn!(frontend = %addr, %error, "removing frontend failed");
                }
            }
        }

        // Into empty maps (a fresh start), puts go out in batches: a start
        // at 100k Services writes over two million entries.
        let batched = batching == Batching::Allowed
            && self.programmed.is_empty()
            && changed.len() >= BATCH_FROM;
        if batched {
            self.store.hold_puts();
        }
        for frontend in changed.iter().filter_map(|a| desired.frontends.get(a)) {
            let addr = &frontend.addr;
            let name = frontend.service.to_string();
            let reason = match self.upsert(frontend, &name, &mut purge, &mut report) {
                Ok(()) => {
                    self.failed.remove(addr);
                    continue;
                }
                Err(UpsertError::Capacity(reason)) => reason,
                Err(UpsertError::Write(error)) => {
                    failed_write = true;
                    match &error {
                        WriteError::Full { map } => format!("map {map} is full"),
                        WriteError::Other { .. } => error.to_string(),
                    }
                }
            };
            let failed = Unprogrammed {
                frontend: *addr,
                service: name,
                reason,
            };
            self.failed.insert(*addr, failed);
        }
        if batched {
            if let Err(error) = self.store.flush() {
                // Which frontends made it is unknown: believe the maps, then
                // write the rest one entry at a time, so a failure is
                // reported against its frontend.
                warn!(%error, "batched map writes failed; writing one by one");
                self.reload();
                return self.sync_all(desired, Batching::Off);
            }
        }
        report.failed = self.failed.values().cloned().collect();

        if !purge.services.is_empty() || !purge.udp_backends.is_empty() {
            if purge.v4 {
                report.conntrack_purged +=
                    self.store.purge_conntrack(&|key: &CtKey, entry: &CtEntry| {
                        purge.dooms(key.proto, entry.service_id, entry.backend_id)
                    });
                let purged = self
                    .store
                    .purge_sockets(&|key: &SockKey, entry: &SockEntry| {
                        purge.dooms(key.proto, entry.service_id, entry.backend_id)
                    });
                report.sockets_purged += purged.len();
                report.udp_sockets_left.extend(
                    purged
                        .iter()
                        .filter(|key| key.proto == proto::UDP && key.dir == sock_dir::REVERSE)
                        .map(|key| {
                            (
                                key.cookie,
                                BackendAddr {
                                    ip: IpAddr::V4(ipv4(key.addr_be)),
                                    port: u16::from_be(key.port_be),
                                },
                            )
                        }),
                );
            }
            if purge.v6 {
                report.conntrack_purged +=
                    self.store
                        .purge_conntrack6(&|key: &CtKey6, entry: &CtEntry6| {
                            purge.dooms(key.proto, entry.service_id, entry.backend_id)
                        });
                let purged = self
                    .store
                    .purge_sockets6(&|key: &SockKey6, entry: &SockEntry6| {
                        purge.dooms(key.proto, entry.service_id, entry.backend_id)
                    });
                report.sockets_purged += purged.len();
                report.udp_sockets_left.extend(
                    purged
                        .iter()
                        .filter(|key| key.proto == proto::UDP && key.dir == sock_dir::REVERSE)
                        .map(|key| {
                            (
                                key.cookie,
                                BackendAddr {
                                    ip: IpAddr::V6(ipv6(key.addr_be)),
                                    port: u16::from_be(key.port_be),
                                },
                            )
                        }),
                );
            }
        }
        if failed_write {
            // Some write failed half-way: believe the maps, not our
            // bookkeeping, and compare everything at the next sync.
            self.reload();
            self.needs_full = true;
        }
        report
    }

    fn remove(
        &mut self,
        addr: &FrontendAddr,
        purge: &mut Purge,
        writes: &mut usize,
    ) -> Result<(), WriteError> {
        let Some(programmed) = self.programmed.get(addr).cloned() else {
            return Ok(());
        };
        self.store.delete_frontend(frontend_key(addr, 0))?;
        *writes += 1;
        for slot in 1..=programmed.slots.len() {
            self.store
                .delete_frontend(frontend_key(addr, slot as u16))?;
            *writes += 1;
        }
        if let Some(external) = &programmed.external {
            *writes += self.delete_external_set(addr, external.len())?;
        }
        if programmed.flags & frontend_flags::ALGO_MASK != frontend_flags::ALGO_RANDOM {
            self.store.delete_maglev(programmed.service_id)?;
            self.maglev_watch.deleted(addr);
            *writes += 1;
        }
        self.store
            .delete_revnat(programmed.service_id, addr.family())?;
        *writes += 1;
        // After slot 0: the frontend no longer matches, so no lookup meets
        // its flag without its blocks.
        for block in &programmed.ranges {
            self.store
                .delete_source_range(programmed.service_id, *block)?;
            *writes += 1;
        }
        *self.range_entries.of(addr.family()) -= programmed.ranges.len();
        for id in programmed
            .slots
            .iter()
            .chain(programmed.external.iter().flatten())
        {
            *writes += self.release_backend(*id)?;
        }
        purge.services.insert(programmed.service_id);
        purge.family(addr.family());
        self.service_ids.remove(&programmed.service_id);
        *self.frontend_entries.of(addr.family()) -= programmed.entries();
        self.programmed.remove(addr);
        debug!(frontend = %addr, "frontend removed");
        Ok(())
    }

    fn upsert(
        &mut self,
        frontend: &Frontend,
        name: &str,
        purge: &mut Purge,
        report: &mut SyncReport,
    ) -> Result<(), UpsertError> {
        let addr = &frontend.addr;
        let old = self.programmed.get(addr).cloned();
        let wanted = sorted_set(&frontend.backends);
        let (flags, affinity_timeout_s) = slot_zero_attributes(frontend, self.defaults);
        let wanted_external = frontend_flags::has_external_set(flags)
            .then(|| sorted_set(frontend.external_backends.as_deref().unwrap_or_default()));
        let distinct = wanted.len();
        let wanted = SetPlan::new(frontend, flags, wanted);
        let wanted_external = wanted_external.map(|set| SetPlan::new(frontend, flags, set));
        let wanted_ranges: Vec<IpCidr> = frontend
            .source_ranges
            .as_ref()
            .map(|r| r.blocks.to_vec())
            .unwrap_or_default();
        let limit = usize::from(capacity::MAX_BACKENDS_PER_SERVICE);
        if distinct > limit {
            return Err(UpsertError::Capacity(format!(
                "{distinct} endpoints, more than the {limit} one service port can have"
            )));
        }

        // Unchanged? Compare backend sets, not slot order (a weighted set's
        // order is its layout).
        if let Some(old) = &old {
            let same_external = match (&old.external, &wanted_external) {
                (None, None) => true,
                (Some(ids), Some(plan)) => self.same_set(ids, old.shares(scope::EXTERNAL), plan),
                _ => false,
            };
            if self.same_set(&old.slots, old.shares(scope::INTERNAL), &wanted)
                && same_external
                && old.name == NameHash::of(name)
                && old.flags == flags
                && old.affinity_timeout_s == affinity_timeout_s
                && *old.ranges == *wanted_ranges
            {
                report.unchanged += 1;
                return Ok(());
            }
        }

        // Capacity, checked before any write so a frontend that does not fit
        // leaves the maps as they were.
        let old_entries = old.as_ref().map_or(0, Programmed::entries);
        let new_entries =
            1 + wanted.addrs.len() + wanted_external.as_ref().map_or(0, |e| 1 + e.addrs.len());
        let family = addr.family();
        // The IPv4 wording predates IPv6 (and is kept).
        let which = match family {
            IpFamily::V4 => "",
            IpFamily::V6 => "IPv6 ",
        };
        if *self.frontend_entries.of(family) - old_entries + new_entries
            > self.caps.frontends as usize
        {
            return Err(UpsertError::Capacity(format!(
                "{which}frontend map full ({} entries)",
                self.caps.frontends
            )));
        }
        let new_backends = wanted
            .addrs
            .iter()
            .chain(wanted_external.iter().flat_map(|e| e.addrs.iter()))
            .collect::<HashSet<_>>()
            .into_iter()
            .filter(|b| self.backends.id_of(**b, addr.protocol).is_none())
            .count();
        if self.backends.len(family) + new_backends > self.caps.backends as usize {
            return Err(UpsertError::Capacity(format!(
                "{which}backend map full ({} entries)",
                self.caps.backends
            )));
        }

        let old_ranges = old.as_ref().map_or(0, |o| o.ranges.len());
        if *self.range_entries.of(family) - old_ranges + wanted_ranges.len()
            > capacity::SOURCE_RANGES as usize
        {
            return Err(UpsertError::Capacity(format!(
                "{which}loadBalancerSourceRanges map full ({} blocks)",
                capacity::SOURCE_RANGES
            )));
        }

        let service_id = match &old {
            Some(old) => old.service_id,
            None => self.allocate_service_id().ok_or_else(|| {
                UpsertError::Capacity(format!(
                    "service id space full ({} service ports, --max-services)",
                    self.caps.services
                ))
            })?,
        };
        if old.as_ref().is_none_or(|o| o.name != NameHash::of(name)) {
            self.store
                .put_revnat(service_id, revnat_value(addr, name))?;
            report.writes += 1;
        }

        // Take references on the new sets before dropping the old ones, so a
        // backend that stays is never deleted in between.
        let wanted_ids = self.acquire_all(&wanted.addrs, addr.protocol, &mut report.writes)?;
        let wanted_external_ids = match &wanted_external {
            Some(set) => Some(self.acquire_all(&set.addrs, addr.protocol, &mut report.writes)?),
            None => None,
        };
        let old_slots = old.as_ref().map(|o| o.slots.clone()).unwrap_or_default();
        let old_external = old.as_ref().and_then(|o| o.external.clone());
        let old_weights = old.as_ref().and_then(|o| o.weights.clone());
        let slots = wanted.place(&old_slots, wanted_ids);
        let external = wanted_external_ids.map(|ids| {
            let plan = wanted_external.as_ref().unwrap_or(&wanted);
            plan.place(old_external.as_deref().unwrap_or_default(), ids)
        });
        let weights = (wanted.shares.is_some()
            || wanted_external.as_ref().is_some_and(|e| e.shares.is_some()))
        .then(|| {
            Box::new(Shares {
                internal: wanted.shares.clone().map(Into::into),
                external: wanted_external
                    .as_ref()
                    .and_then(|e| e.shares.clone())
                    .map(Into::into),
            })
        });
        let shares_of = |weights: &Option<Box<Shares>>, scope: u8| -> Option<Box<[u16]>> {
            let w = weights.as_deref()?;
            match scope {
                scope::INTERNAL => w.internal.clone(),
                _ => w.external.clone(),
            }
        };

        // The Maglev table before either slot 0 announces the algorithm; it
        // names only backends referenced above.
        let (hashed_set, hashed_shares) = match &external {
            Some(external) => (external, shares_of(&weights, scope::EXTERNAL)),
            None => (&slots, shares_of(&weights, scope::INTERNAL)),
        };
        let old_hashed = old
            .as_ref()
            .is_some_and(|o| o.flags & frontend_flags::ALGO_MASK != frontend_flags::ALGO_RANDOM);
        if flags & frontend_flags::ALGO_MASK != frontend_flags::ALGO_RANDOM {
            let table = self.maglev_table(hashed_set, hashed_shares.as_deref(), addr.protocol);
            self.store.put_maglev(service_id, &table)?;
            self.maglev_watch.wrote(*addr, service_id, &table);
            report.writes += 1;
        }
        // New source blocks before slot 0 announces them, stale ones after:
        // at no moment is a source the new list allows denied, and the old
        // list's blocks go within this sync.
        let old_blocks = old.as_ref().map(|o| o.ranges.clone()).unwrap_or_default();
        for block in wanted_ranges.iter().filter(|b| !old_blocks.contains(b)) {
            self.store.put_source_range(service_id, *block)?;
            report.writes += 1;
        }
        // The external set first: slot 0 of the internal set announces it.
        if let Some(external) = &external {
            let old = old_external.as_deref().unwrap_or_default();
            report.writes += self.write_set(
                addr,
                scope::EXTERNAL,
                service_id,
                (old, shares_of(&old_weights, scope::EXTERNAL).as_deref()),
                (external, shares_of(&weights, scope::EXTERNAL).as_deref()),
                (flags, affinity_timeout_s),
            )?;
        }
        report.writes += self.write_set(
            addr,
            scope::INTERNAL,
            service_id,
            (
                &old_slots,
                shares_of(&old_weights, scope::INTERNAL).as_deref(),
            ),
            (&slots, shares_of(&weights, scope::INTERNAL).as_deref()),
            (flags, affinity_timeout_s),
        )?;
        if let (Some(old), None) = (&old_external, &external) {
            report.writes += self.delete_external_set(addr, old.len())?;
        }
        if old_hashed && flags & frontend_flags::ALGO_MASK == frontend_flags::ALGO_RANDOM {
            self.store.delete_maglev(service_id)?;
            self.maglev_watch.deleted(addr);
            report.writes += 1;
        }
        for block in old_blocks.iter().filter(|b| !wanted_ranges.contains(b)) {
            self.store.delete_source_range(service_id, *block)?;
            report.writes += 1;
        }
        let ranges = self.range_entries.of(family);
        *ranges = *ranges - old_blocks.len() + wanted_ranges.len();
        let kept: HashSet<u32> = slots
            .iter()
            .chain(external.iter().flatten())
            .copied()
            .collect();
        for id in old_slots.iter().chain(old_external.iter().flatten()) {
            if addr.protocol == Protocol::Udp && !kept.contains(id) {
                purge.udp_backends.insert((service_id, *id));
                purge.family(addr.family());
            }
            report.writes += self.release_backend(*id)?;
        }

        let entries = self.frontend_entries.of(family);
        *entries = *entries - old_entries + new_entries;
        if old.is_some() {
            report.updated += 1;
        } else {
            report.added += 1;
        }
        self.programmed.insert(
            *addr,
            Programmed {
                service_id,
                name: NameHash::of(name),
                flags,
                affinity_timeout_s,
                slots: slots.into(),
                external: external.map(Into::into),
                ranges: wanted_ranges.into(),
                weights,
            },
        );
        Ok(())
    }

    /// Whether the set programmed as `ids` (with `shares`, if weighted) is
    /// what `plan` wants.
    fn same_set(&self, ids: &[u32], shares: Option<&[u16]>, plan: &SetPlan) -> bool {
        match (shares, &plan.shares) {
            (None, None) => self.addrs_of(ids) == plan.addrs,
            (Some(old), Some(new)) => {
                *old == **new
                    && ids.len() == plan.addrs.len()
                    && ids
                        .iter()
                        .zip(&plan.addrs)
                        .all(|(id, addr)| self.backends.get(*id).map(|(b, _)| b) == Some(*addr))
            }
            _ => false,
        }
    }

    /// The Maglev table over `ids` (a frontend's backend set): computed from
    /// the backends' addresses, so every node gets the same table, then
    /// written with this node's ids.
    ///
    /// A weighted set (`shares` per slot) weights the table's population
    /// by each backend's share; drained backends get no entry.
    fn maglev_table(
        &self,
        ids: &[u32],
        shares: Option<&[u16]>,
        protocol: Protocol,
    ) -> Box<MaglevTable> {
        let keys: Vec<(BackendKey, u32)> = ids
            .iter()
            .filter_map(|id| {
                let (b, _) = self.backends.get(*id)?;
                Some((BackendKey::new(b.ip, b.port, proto_number(protocol)), *id))
            })
            .collect();
        let canonical =
            maglev::canonical_backends(&keys.iter().map(|(k, _)| *k).collect::<Vec<_>>());
        let share_of: HashMap<u32, u16> = match shares {
            Some(shares) => ids.iter().copied().zip(shares.iter().copied()).collect(),
            None => HashMap::new(),
        };
        let id_of: HashMap<BackendKey, u32> = keys.into_iter().collect();
        let entries = match shares {
            None => maglev::table(&canonical, capacity::MAGLEV_TABLE),
            Some(_) => {
                let weights: Vec<u16> = canonical
                    .iter()
                    .map(|k| {
                        id_of
                            .get(k)
                            .and_then(|id| share_of.get(id))
                            .copied()
                            .unwrap_or(0)
                    })
                    .collect();
                maglev::table_weighted(&canonical, &weights, capacity::MAGLEV_TABLE)
            }
        };
        let mut table = Box::new(MaglevTable {
            backend_ids: [0; capacity::MAGLEV_TABLE as usize],
        });
        // The size is a compile-time prime and the backend count is bounded
        // by MAX_BACKENDS_PER_SERVICE, so the table cannot be refused; an
        // empty set leaves every entry 0 (no backend: the data path falls
        // back to its random pick, which finds none).
        if let Ok(entries) = entries {
            for (slot, index) in table.backend_ids.iter_mut().zip(entries) {
                *slot = canonical
                    .get(usize::from(index))
                    .and_then(|k| id_of.get(k))
                    .copied()
                    .unwrap_or(0);
            }
        }
        table
    }

    /// The Maglev table a hashed frontend's set must have, as
    /// [`upsert`](Self::upsert) wrote it: over the external set when it
    /// has one (traffic from outside uses that), else over its own.
    fn programmed_table(&self, addr: &FrontendAddr, p: &Programmed) -> Box<MaglevTable> {
        let (ids, scope) = match &p.external {
            Some(external) => (external, scope::EXTERNAL),
            None => (&p.slots, scope::INTERNAL),
        };
        self.maglev_table(ids, p.shares(scope), addr.protocol)
    }

    /// The addresses of backend ids, sorted.
    fn addrs_of(&self, ids: &[u32]) -> Vec<BackendAddr> {
        let mut addrs: Vec<BackendAddr> = ids
            .iter()
            .filter_map(|id| self.backends.get(*id).map(|(b, _)| b))
            .collect();
        addrs.sort();
        addrs
    }

    /// A reference on each backend of `set`, creating entries as needed.
    fn acquire_all(
        &mut self,
        set: &[BackendAddr],
        protocol: Protocol,
        writes: &mut usize,
    ) -> Result<Vec<u32>, WriteError> {
        let mut ids = Vec::with_capacity(set.len());
        for backend in set {
            let (id, written) = self.acquire_backend(*backend, protocol)?;
            *writes += written;
            ids.push(id);
        }
        Ok(ids)
    }

    /// Writes one backend set of a frontend: the slots that changed, then
    /// slot 0 with the new count, then deletes the slots past it. Returns the
    /// number of writes.
    ///
    /// A weighted set (`Some` shares, one per slot) records each slot's
    /// share in it, counts only the slots of live backends in slot 0
    /// (drained ones follow them) and marks slot 0
    /// [`frontend_flags::WEIGHTED`].
    fn write_set(
        &mut self,
        addr: &FrontendAddr,
        scope: u8,
        service_id: u32,
        (old_slots, old_shares): (&[u32], Option<&[u16]>),
        (slots, shares): (&[u32], Option<&[u16]>),
        (flags, affinity_timeout_s): (u16, u32),
    ) -> Result<usize, WriteError> {
        let share = |shares: Option<&[u16]>, index: usize| {
            shares.and_then(|s| s.get(index)).copied().unwrap_or(0)
        };
        let mut writes = 0;
        for (index, id) in slots.iter().enumerate() {
            if old_slots.get(index) != Some(id) || share(old_shares, index) != share(shares, index)
            {
                self.store.put_frontend(
                    scoped_key(addr, scope, index as u16 + 1),
                    FrontendSlot {
                        backend_id: *id,
                        service_id,
                        backend_count: share(shares, index),
                        ..FrontendSlot::default()
                    },
                )?;
                writes += 1;
            }
        }
        let (count, flags) = match shares {
            Some(shares) => (
                shares.iter().filter(|s| **s > 0).count(),
                flags | frontend_flags::WEIGHTED,
            ),
            None => (slots.len(), flags),
        };
        self.store.put_frontend(
            scoped_key(addr, scope, 0),
            FrontendSlot {
                backend_id: 0,
                service_id,
                backend_count: count as u16,
                flags,
                affinity_timeout_s,
            },
        )?;
        writes += 1;
        for slot in slots.len() + 1..=old_slots.len() {
            self.store
                .delete_frontend(scoped_key(addr, scope, slot as u16))?;
            writes += 1;
        }
        if shares.is_some() && old_slots.len() <= slots.len() && slots.len() < usize::from(u16::MAX)
        {
            // A weighted set's drained slots are read back as far as they
            // run (`complete_slots`): make sure an orphan left by a failed
            // write does not extend them. Best effort: the slot is almost
            // always absent, which the kernel map reports as an error, and
            // an orphan that stays is only adopted as drained until the
            // next sync compares the set.
            let fence = scoped_key(addr, scope, slots.len() as u16 + 1);
            if let Err(error) = self.store.delete_frontend(fence) {
                debug!(frontend = %addr, %error, "no slot past a weighted set");
            }
            writes += 1;
        }
        Ok(writes)
    }

    /// Deletes a frontend's external set (slot 0 first). Returns the writes.
    fn delete_external_set(
        &mut self,
        addr: &FrontendAddr,
        len: usize,
    ) -> Result<usize, WriteError> {
        for slot in 0..=len {
            self.store
                .delete_frontend(scoped_key(addr, scope::EXTERNAL, slot as u16))?;
        }
        Ok(len + 1)
    }

    fn allocate_service_id(&mut self) -> Option<u32> {
        // Ids are 1..=services: the counter array has one more entry.
        let max = self.caps.services;
        if self.service_ids.len() as u32 >= max {
            return None;
        }
        // Walk forward from the cursor so a freed id is not reused at once.
        let mut id = self.next_service_id;
        loop {
            if id == 0 || id > max {
                id = 1;
            }
            if !self.service_ids.contains(&id) {
                self.service_ids.insert(id);
                self.next_service_id = id + 1;
                return Some(id);
            }
            id += 1;
        }
    }

    /// A reference on the backend id for `backend`, creating the entry if it is
    /// new. Returns the id and the number of map writes.
    fn acquire_backend(
        &mut self,
        backend: BackendAddr,
        protocol: Protocol,
    ) -> Result<(u32, usize), WriteError> {
        if let Some(id) = self.backends.acquire(backend, protocol) {
            return Ok((id, 0));
        }
        let mut id = self.next_backend_id.max(1);
        while self.backends.contains_id(id) {
            id = id.wrapping_add(1).max(1);
        }
        self.store
            .put_backend(id, backend_value(backend, protocol))?;
        self.next_backend_id = id.wrapping_add(1).max(1);
        self.backends.hold(id, backend, protocol);
        Ok((id, 1))
    }

    /// Drops one reference; the entry goes when nobody uses it.
    fn release_backend(&mut self, id: u32) -> Result<usize, WriteError> {
        let Some((backend, _)) = self.backends.release(id) else {
            return Ok(0);
        };
        self.store.delete_backend(id, backend.family())?;
        self.backends.remove(id);
        Ok(1)
    }
}

enum UpsertError {
    /// Would not fit; nothing was written.
    Capacity(String),
    Write(WriteError),
}

impl From<WriteError> for UpsertError {
    fn from(error: WriteError) -> Self {
        Self::Write(error)
    }
}

fn log_write(result: Result<(), WriteError>) {
    if let Err(error) = result {
        warn!(%error, "removing an orphaned map entry failed");
    }
}

/// Sorted, deduplicated.
fn sorted_set(backends: &[BackendAddr]) -> Vec<BackendAddr> {
    let mut set = backends.to_vec();
    set.sort();
    set.dedup();
    set
}

/// A set's backend ids per slot, and its shares per slot if it is weighted.
type SlotSet = (Vec<u32>, Option<Vec<u16>>);

/// The backend ids of slots `1..=count` of the set whose slot 0 is `head`, if
/// every slot is present and names a backend of the frontend's family. A
/// weighted set ([`frontend_flags::WEIGHTED`]) also has each slot's share,
/// and its drained backends' slots past the count (share 0), as many as
/// follow in a row.
fn complete_slots(
    slots: &HashMap<AnyFrontendKey, FrontendSlot>,
    backends: &HashMap<(IpFamily, u32), AnyBackend>,
    key: &AnyFrontendKey,
    head: &FrontendSlot,
) -> Option<SlotSet> {
    let entry = |slot: u16| {
        slots
            .get(&key.at(key.scope(), slot))
            .filter(|v| backends.contains_key(&(key.family(), v.backend_id)))
    };
    let set: Vec<&FrontendSlot> = (1..=head.backend_count).map(entry).collect::<Option<_>>()?;
    let mut ids: Vec<u32> = set.iter().map(|v| v.backend_id).collect();
    if head.flags & frontend_flags::WEIGHTED == 0 {
        return Some((ids, None));
    }
    let mut shares: Vec<u16> = set.iter().map(|v| v.backend_count.max(1)).collect();
    let drained = (head.backend_count.saturating_add(1)..capacity::MAX_BACKENDS_PER_SERVICE)
        .map_while(|slot| entry(slot).filter(|v| v.backend_count == 0));
    for v in drained {
        ids.push(v.backend_id);
        shares.push(0);
    }
    Some((ids, Some(shares)))
}

/// What one backend set of a frontend should be: its backends in slot
/// order, and for a weighted set each slot's share.
struct SetPlan {
    /// Unweighted: the backends, sorted, each once (slots are then placed
    /// so that survivors keep theirs). Weighted: the backend of each slot,
    /// as [`weights::layout`] lays them out (the table, then the drained).
    addrs: Vec<BackendAddr>,
    shares: Option<Vec<u16>>,
}

impl SetPlan {
    /// The plan for `set` (sorted, distinct) with `frontend`'s weights;
    /// `flags` (slot 0's) say whether it balances by least connection,
    /// whose sets hold each backend once ([`weights::layout_once`]).
    fn new(frontend: &Frontend, flags: u16, set: Vec<BackendAddr>) -> SetPlan {
        if frontend.weights.is_empty() {
            return SetPlan {
                addrs: set,
                shares: None,
            };
        }
        let weights: Vec<u16> = set.iter().map(|b| frontend.weight_of(b)).collect();
        let layout = match flags & frontend_flags::PICK_MASK {
            frontend_flags::PICK_LEAST_CONN => weights::layout_once(&weights),
            _ => weights::layout(&weights),
        };
        match layout {
            None => SetPlan {
                addrs: set,
                shares: None,
            },
            Some(layout) => SetPlan {
                addrs: layout.slots.iter().map(|i| set[*i]).collect(),
                shares: Some(layout.shares),
            },
        }
    }

    /// The slots for `ids` (one per entry of `addrs`), given the set's
    /// `old` slots.
    fn place(&self, old: &[u32], ids: Vec<u32>) -> Vec<u32> {
        match self.shares {
            None => place(old, &ids),
            Some(_) => ids,
        }
    }
}

/// New slot layout: backends that stay keep their slot; newcomers fill the
/// holes, then the end; on shrinking, the tail moves into the holes. A
/// backend in two old slots (a move that a stopped agent left half done, as
/// adopted) stays only in the first.
fn place(old: &[u32], wanted: &[u32]) -> Vec<u32> {
    let mut unplaced: HashSet<u32> = wanted.iter().copied().collect();
    let mut slots: Vec<Option<u32>> = old
        .iter()
        .map(|id| unplaced.remove(id).then_some(*id))
        .collect();
    let placed: HashSet<u32> = slots.iter().flatten().copied().collect();
    let mut newcomers = wanted.iter().filter(|id| !placed.contains(id)).copied();
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        match newcomers.next() {
            Some(id) => *slot = Some(id),
            None => break,
        }
    }
    slots.extend(newcomers.map(Some));
    // Compact: move entries from the end into the remaining holes.
    let mut result: Vec<Option<u32>> = slots;
    let mut hole = 0;
    while hole < result.len() {
        if result[hole].is_none() {
            while matches!(result.last(), Some(None)) {
                result.pop();
            }
            if hole >= result.len() {
                break;
            }
            if let Some(last) = result.pop() {
                result[hole] = last;
            }
        }
        hole += 1;
    }
    result.into_iter().flatten().collect()
}

mod backends;
pub mod encode;
pub mod heal;
pub mod maglev;
#[cfg(test)]
pub(crate) mod memstore;
#[cfg(test)]
mod properties;
pub mod store;
#[cfg(test)]
pub(crate) mod tests;
pub mod weights;
