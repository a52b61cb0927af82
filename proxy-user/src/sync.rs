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
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;

use proxy_common::{
    capacity, frontend_flags, proto, scope, sock_dir, Backend, MaglevTable, CtEntry, CtKey, FrontendSlot,
    FrontendKey, RevNat, SockEntry, SockKey,
};
use tracing::{debug, warn};

use crate::{
    encode::{
        backend_addr, frontend_addr, frontend_key, proto_number, revnat_name, revnat_value, scoped_key,
        slot_zero_attributes,
    },
    ebpf::Capacities,
    maps::{MapStore, WriteError},
    maglev::{self, BackendKey},
    model::{BackendAddr, DesiredState, Frontend, FrontendAddr, LbAlgorithm, Protocol},
};

/// What one frontend looks like in the maps.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Programmed {
    service_id: u32,
    name: String,
    /// [`frontend_flags`] and the affinity timeout written in slot 0.
    flags: u16,
    affinity_timeout_s: u32,
    /// Backend id per slot, slot 1 first.
    slots: Vec<u32>,
    /// The external (local-only) set's backend ids per slot, under
    /// [`scope::EXTERNAL`]: `Some` exactly when the frontend has one
    /// (`externalTrafficPolicy: Local`).
    external: Option<Vec<u32>>,
}

impl Programmed {
    /// Frontend map entries this frontend uses.
    fn entries(&self) -> usize {
        1 + self.slots.len() + self.external.as_ref().map_or(0, |e| 1 + e.len())
    }
}

#[derive(Clone, Copy, Debug)]
struct BackendRef {
    id: u32,
    refs: u32,
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
    backends: HashMap<(BackendAddr, Protocol), BackendRef>,
    backend_addrs: HashMap<u32, (BackendAddr, Protocol)>,
    service_ids: BTreeSet<u32>,
    next_service_id: u32,
    next_backend_id: u32,
    /// Frontend map entries in use (slot 0 plus one per backend, per frontend).
    frontend_entries: usize,
    /// For frontends whose Service does not choose (`switchboard.io/lb-algorithm`).
    default_algorithm: LbAlgorithm,
    /// Frontends the last syncs could not program; retried at every sync
    /// (a removal elsewhere may have made room).
    failed: BTreeMap<FrontendAddr, Unprogrammed>,
    /// The maps were reloaded after a failed write: the next sync compares
    /// every frontend, not only the changed ones.
    needs_full: bool,
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
            backends: HashMap::new(),
            backend_addrs: HashMap::new(),
            service_ids: BTreeSet::new(),
            next_service_id: 1,
            next_backend_id: 1,
            frontend_entries: 0,
            default_algorithm: LbAlgorithm::Random,
            failed: BTreeMap::new(),
            needs_full: false,
        };
        syncer.reload();
        syncer.needs_full = false;
        syncer
    }

    /// The algorithm of frontends whose Service names none (`--lb-algorithm`).
    pub fn set_default_algorithm(&mut self, algorithm: LbAlgorithm) {
        self.default_algorithm = algorithm;
    }

    /// `--lb-algorithm`, which slot 0 records for Services that name none.
    pub fn default_algorithm(&self) -> LbAlgorithm {
        self.default_algorithm
    }

    /// The frontends not programmed, and why (capacity).
    pub fn unprogrammed(&self) -> impl Iterator<Item = &Unprogrammed> {
        self.failed.values()
    }

    pub fn store(&self) -> &S {
        &self.store
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
        self.backends.clear();
        self.backend_addrs.clear();
        self.service_ids.clear();
        self.frontend_entries = 0;

        let backends: HashMap<u32, Backend> = dump.backends.iter().copied().collect();
        let revnat: HashMap<u32, RevNat> = dump.revnat.iter().copied().collect();
        let slots: HashMap<FrontendKey, FrontendSlot> = dump.frontends.iter().copied().collect();
        let mut keep_slots: HashSet<FrontendKey> = HashSet::new();
        let mut keep_backends: HashSet<u32> = HashSet::new();

        for (key, head) in dump
            .frontends
            .iter()
            .filter(|(k, _)| k.slot == 0 && k.scope == scope::INTERNAL)
        {
            let Some(addr) = frontend_addr(key) else {
                continue;
            };
            let ids = complete_slots(&slots, &backends, key, head);
            // Outer `None`: announced but incomplete; inner `None`: no
            // external set.
            let external: Option<Option<Vec<u32>>> = if frontend_flags::has_external_set(head.flags) {
                let ext_key = FrontendKey {
                    scope: scope::EXTERNAL,
                    ..*key
                };
                slots
                    .get(&ext_key)
                    .and_then(|ext_head| complete_slots(&slots, &backends, &ext_key, ext_head))
                    .map(Some)
            } else {
                Some(None)
            };
            let (Some(ids), Some(external)) = (ids, external) else {
                // Half-written by a crash: drop it; the next apply rewrites it.
                warn!(frontend = %addr, "adopting maps: incomplete frontend entry removed");
                continue;
            };
            if head.service_id == 0 {
                warn!(frontend = %addr, "adopting maps: incomplete frontend entry removed");
                continue;
            }
            for (scope, set) in [(scope::INTERNAL, Some(&ids)), (scope::EXTERNAL, external.as_ref())] {
                let Some(set) = set else { continue };
                for slot in 0..=set.len() as u16 {
                    keep_slots.insert(FrontendKey { scope, slot, ..*key });
                }
                for id in set {
                    keep_backends.insert(*id);
                    let backend = backends[id];
                    let entry = (backend_addr(&backend), addr.protocol);
                    self.backends
                        .entry(entry)
                        .and_modify(|r| r.refs += 1)
                        .or_insert(BackendRef { id: *id, refs: 1 });
                    self.backend_addrs.insert(*id, entry);
                }
            }
            let name = revnat
                .get(&head.service_id)
                .map(revnat_name)
                .unwrap_or_default();
            self.service_ids.insert(head.service_id);
            let programmed = Programmed {
                service_id: head.service_id,
                name,
                flags: head.flags,
                affinity_timeout_s: head.affinity_timeout_s,
                slots: ids,
                external,
            };
            self.frontend_entries += programmed.entries();
            self.programmed.insert(addr, programmed);
        }
        // Orphans: slots of dropped frontends, unused backends and rev-NAT entries.
        for key in slots.keys().filter(|k| !keep_slots.contains(k)) {
            log_write(self.store.delete_frontend(*key));
        }
        for id in backends.keys().filter(|id| !keep_backends.contains(id)) {
            log_write(self.store.delete_backend(*id));
        }
        for id in revnat.keys().filter(|id| !self.service_ids.contains(id)) {
            log_write(self.store.delete_revnat(*id));
        }
        self.next_service_id = self.service_ids.last().map_or(1, |id| id + 1);
        self.next_backend_id = self.backend_addrs.keys().max().map_or(1, |id| id + 1);
    }

    /// The frontends programmed now, with their service name and backends.
    pub fn programmed(&self) -> impl Iterator<Item = (&FrontendAddr, &str, Vec<BackendAddr>)> {
        self.programmed.iter().map(|(addr, p)| {
            let backends = p
                .slots
                .iter()
                .filter_map(|id| self.backend_addrs.get(id).map(|(b, _)| *b))
                .collect();
            (addr, p.name.as_str(), backends)
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
    pub fn apply_changed(&mut self, desired: &DesiredState, changed: &BTreeSet<FrontendAddr>) -> SyncReport {
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

        for addr in changed.iter().filter(|a| !desired.frontends.contains_key(a)) {
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
        let batched = batching == Batching::Allowed && self.programmed.is_empty() && changed.len() >= BATCH_FROM;
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
            report.conntrack_purged =
                self.store.purge_conntrack(&|key: &CtKey, entry: &CtEntry| {
                    purge.services.contains(&entry.service_id)
                        || (key.proto == proto::UDP
                            && purge
                                .udp_backends
                                .contains(&(entry.service_id, entry.backend_id)))
                });
            let purged = self
                .store
                .purge_sockets(&|key: &SockKey, entry: &SockEntry| {
                    purge.services.contains(&entry.service_id)
                        || (key.proto == proto::UDP
                            && purge
                                .udp_backends
                                .contains(&(entry.service_id, entry.backend_id)))
                });
            report.sockets_purged = purged.len();
            report.udp_sockets_left = purged
                .iter()
                .filter(|key| key.proto == proto::UDP && key.dir == sock_dir::REVERSE)
                .map(|key| {
                    let backend = BackendAddr {
                        ip: Ipv4Addr::from(key.addr_be.to_ne_bytes()),
                        port: u16::from_be(key.port_be),
                    };
                    (key.cookie, backend)
                })
                .collect();
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
            *writes += 1;
        }
        self.store.delete_revnat(programmed.service_id)?;
        *writes += 1;
        for id in programmed.slots.iter().chain(programmed.external.iter().flatten()) {
            *writes += self.release_backend(*id)?;
        }
        purge.services.insert(programmed.service_id);
        self.service_ids.remove(&programmed.service_id);
        self.frontend_entries -= programmed.entries();
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
        let (flags, affinity_timeout_s) = slot_zero_attributes(frontend, self.default_algorithm);
        let wanted_external = frontend_flags::has_external_set(flags)
            .then(|| sorted_set(frontend.external_backends.as_deref().unwrap_or_default()));
        let limit = usize::from(capacity::MAX_BACKENDS_PER_SERVICE);
        if wanted.len() > limit {
            return Err(UpsertError::Capacity(format!(
                "{} endpoints, more than the {limit} one service port can have",
                wanted.len()
            )));
        }

        // Unchanged? Compare backend sets, not slot order.
        if let Some(old) = &old {
            if self.addrs_of(&old.slots) == wanted
                && old.external.as_ref().map(|e| self.addrs_of(e)) == wanted_external
                && old.name == name
                && old.flags == flags
                && old.affinity_timeout_s == affinity_timeout_s
            {
                report.unchanged += 1;
                return Ok(());
            }
        }

        // Capacity, checked before any write so a frontend that does not fit
        // leaves the maps as they were.
        let old_entries = old.as_ref().map_or(0, Programmed::entries);
        let new_entries = 1 + wanted.len() + wanted_external.as_ref().map_or(0, |e| 1 + e.len());
        if self.frontend_entries - old_entries + new_entries > self.caps.frontends as usize {
            return Err(UpsertError::Capacity(format!(
                "frontend map full ({} entries)",
                self.caps.frontends
            )));
        }
        let new_backends = wanted
            .iter()
            .chain(wanted_external.iter().flatten())
            .collect::<HashSet<_>>()
            .into_iter()
            .filter(|b| !self.backends.contains_key(&(**b, addr.protocol)))
            .count();
        if self.backends.len() + new_backends > self.caps.backends as usize {
            return Err(UpsertError::Capacity(format!(
                "backend map full ({} entries)",
                self.caps.backends
            )));
        }

        let service_id = match &old {
            Some(old) => old.service_id,
            None => self.allocate_service_id().ok_or_else(|| {
                UpsertError::Capacity(format!(
                    "service id space full ({} service ports)",
                    self.caps.services - 1
                ))
            })?,
        };
        if old.as_ref().is_none_or(|o| o.name != name) {
            self.store
                .put_revnat(service_id, revnat_value(addr, name))?;
            report.writes += 1;
        }

        // Take references on the new sets before dropping the old ones, so a
        // backend that stays is never deleted in between.
        let wanted_ids = self.acquire_all(&wanted, addr.protocol, &mut report.writes)?;
        let wanted_external_ids = match &wanted_external {
            Some(set) => Some(self.acquire_all(set, addr.protocol, &mut report.writes)?),
            None => None,
        };
        let old_slots = old.as_ref().map(|o| o.slots.clone()).unwrap_or_default();
        let old_external = old.as_ref().and_then(|o| o.external.clone());
        let slots = place(&old_slots, &wanted_ids);
        let external = wanted_external_ids
            .as_ref()
            .map(|ids| place(old_external.as_deref().unwrap_or_default(), ids));

        // The Maglev table before either slot 0 announces the algorithm; it
        // names only backends referenced above.
        let hashed_set = external.as_ref().unwrap_or(&slots);
        let old_hashed = old
            .as_ref()
            .is_some_and(|o| o.flags & frontend_flags::ALGO_MASK != frontend_flags::ALGO_RANDOM);
        if flags & frontend_flags::ALGO_MASK != frontend_flags::ALGO_RANDOM {
            let table = self.maglev_table(hashed_set, addr.protocol);
            self.store.put_maglev(service_id, &table)?;
            report.writes += 1;
        }
        // The external set first: slot 0 of the internal set announces it.
        if let Some(external) = &external {
            let old = old_external.as_deref().unwrap_or_default();
            report.writes += self.write_set(addr, scope::EXTERNAL, service_id, old, external, (flags, affinity_timeout_s))?;
        }
        report.writes += self.write_set(addr, scope::INTERNAL, service_id, &old_slots, &slots, (flags, affinity_timeout_s))?;
        if let (Some(old), None) = (&old_external, &external) {
            report.writes += self.delete_external_set(addr, old.len())?;
        }
        if old_hashed && flags & frontend_flags::ALGO_MASK == frontend_flags::ALGO_RANDOM {
            self.store.delete_maglev(service_id)?;
            report.writes += 1;
        }
        let kept: HashSet<u32> = slots.iter().chain(external.iter().flatten()).copied().collect();
        for id in old_slots.iter().chain(old_external.iter().flatten()) {
            if addr.protocol == Protocol::Udp && !kept.contains(id) {
                purge.udp_backends.insert((service_id, *id));
            }
            report.writes += self.release_backend(*id)?;
        }

        self.frontend_entries = self.frontend_entries - old_entries + new_entries;
        if old.is_some() {
            report.updated += 1;
        } else {
            report.added += 1;
        }
        self.programmed.insert(
            *addr,
            Programmed {
                service_id,
                name: name.to_owned(),
                flags,
                affinity_timeout_s,
                slots,
                external,
            },
        );
        Ok(())
    }

    /// The Maglev table over `ids` (a frontend's backend set): computed from
    /// the backends' addresses, so every node gets the same table, then
    /// written with this node's ids.
    fn maglev_table(&self, ids: &[u32], protocol: Protocol) -> Box<MaglevTable> {
        let keys: Vec<(BackendKey, u32)> = ids
            .iter()
            .filter_map(|id| {
                let (b, _) = self.backend_addrs.get(id)?;
                Some((BackendKey::new(b.ip, b.port, proto_number(protocol)), *id))
            })
            .collect();
        let canonical = maglev::canonical_backends(&keys.iter().map(|(k, _)| *k).collect::<Vec<_>>());
        let id_of: HashMap<BackendKey, u32> = keys.into_iter().collect();
        let mut table = Box::new(MaglevTable {
            backend_ids: [0; capacity::MAGLEV_TABLE as usize],
        });
        // The size is a compile-time prime and the backend count is bounded
        // by MAX_BACKENDS_PER_SERVICE, so the table cannot be refused; an
        // empty set leaves every entry 0 (no backend: the data path falls
        // back to its random pick, which finds none).
        if let Ok(entries) = maglev::table(&canonical, capacity::MAGLEV_TABLE) {
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

    /// The addresses of backend ids, sorted.
    fn addrs_of(&self, ids: &[u32]) -> Vec<BackendAddr> {
        let mut addrs: Vec<BackendAddr> = ids
            .iter()
            .filter_map(|id| self.backend_addrs.get(id).map(|(b, _)| *b))
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
    fn write_set(
        &mut self,
        addr: &FrontendAddr,
        scope: u8,
        service_id: u32,
        old_slots: &[u32],
        slots: &[u32],
        (flags, affinity_timeout_s): (u16, u32),
    ) -> Result<usize, WriteError> {
        let mut writes = 0;
        for (index, id) in slots.iter().enumerate() {
            if old_slots.get(index) != Some(id) {
                self.store.put_frontend(
                    scoped_key(addr, scope, index as u16 + 1),
                    FrontendSlot {
                        backend_id: *id,
                        service_id,
                        ..FrontendSlot::default()
                    },
                )?;
                writes += 1;
            }
        }
        self.store.put_frontend(
            scoped_key(addr, scope, 0),
            FrontendSlot {
                backend_id: 0,
                service_id,
                backend_count: slots.len() as u16,
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
        Ok(writes)
    }

    /// Deletes a frontend's external set (slot 0 first). Returns the writes.
    fn delete_external_set(&mut self, addr: &FrontendAddr, len: usize) -> Result<usize, WriteError> {
        for slot in 0..=len {
            self.store
                .delete_frontend(scoped_key(addr, scope::EXTERNAL, slot as u16))?;
        }
        Ok(len + 1)
    }

    fn allocate_service_id(&mut self) -> Option<u32> {
        let max = self.caps.services.saturating_sub(1);
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
        if let Some(existing) = self.backends.get_mut(&(backend, protocol)) {
            existing.refs += 1;
            return Ok((existing.id, 0));
        }
        let mut id = self.next_backend_id.max(1);
        while self.backend_addrs.contains_key(&id) {
            id = id.wrapping_add(1).max(1);
        }
        self.store.put_backend(
            id,
            Backend {
                addr_be: u32::from_ne_bytes(backend.ip.octets()),
                port_be: backend.port.to_be(),
                proto: proto_number(protocol),
                flags: 0,
            },
        )?;
        self.next_backend_id = id.wrapping_add(1).max(1);
        self.backends
            .insert((backend, protocol), BackendRef { id, refs: 1 });
        self.backend_addrs.insert(id, (backend, protocol));
        Ok((id, 1))
    }

    /// Drops one reference; the entry goes when nobody uses it.
    fn release_backend(&mut self, id: u32) -> Result<usize, WriteError> {
        let Some(entry) = self.backend_addrs.get(&id).copied() else {
            return Ok(0);
        };
        let Some(backend) = self.backends.get_mut(&entry) else {
            return Ok(0);
        };
        backend.refs -= 1;
        if backend.refs > 0 {
            return Ok(0);
        }
        self.store.delete_backend(id)?;
        self.backends.remove(&entry);
        self.backend_addrs.remove(&id);
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

/// The backend ids of slots `1..=count` of the set whose slot 0 is `head`, if
/// every slot is present and names a backend.
fn complete_slots(
    slots: &HashMap<FrontendKey, FrontendSlot>,
    backends: &HashMap<u32, Backend>,
    key: &FrontendKey,
    head: &FrontendSlot,
) -> Option<Vec<u32>> {
    (1..=head.backend_count)
        .map(|slot| {
            slots
                .get(&FrontendKey { slot, ..*key })
                .map(|v| v.backend_id)
                .filter(|id| backends.contains_key(id))
        })
        .collect()
}

/// New slot layout: backends that stay keep their slot; newcomers fill the
/// holes, then the end; on shrinking, the tail moves into the holes.
fn place(old: &[u32], wanted: &[u32]) -> Vec<u32> {
    let wanted_set: HashSet<u32> = wanted.iter().copied().collect();
    let mut slots: Vec<Option<u32>> = old
        .iter()
        .map(|id| wanted_set.contains(id).then_some(*id))
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::FrontendKind;
    use crate::maps::Dump;
    use crate::model::ServicePortName;

    /// An in-memory stand-in for the kernel maps, counting writes.
    #[derive(Default)]
    pub(crate) struct MemStore {
        pub(crate) frontends: BTreeMap<(u32, u16, u8, u8, u16), FrontendSlot>,
        /// Frontend writes in order (`put`/`delete` and the key).
        log: Vec<String>,
        /// Maglev tables by service id.
        maglev: BTreeMap<u32, Vec<u32>>,
        pub(crate) backends: BTreeMap<u32, Backend>,
        pub(crate) revnat: BTreeMap<u32, RevNat>,
        conntrack: Vec<(CtKey, CtEntry)>,
        sockets: Vec<(SockKey, SockEntry)>,
        writes: usize,
        frontend_limit: Option<usize>,
    }

    pub(crate) fn k(key: &FrontendKey) -> (u32, u16, u8, u8, u16) {
        (key.addr_be, key.port_be, key.proto, key.scope, key.slot)
    }

    impl MapStore for MemStore {
        fn put_frontend(
            &mut self,
            key: FrontendKey,
            value: FrontendSlot,
        ) -> Result<(), WriteError> {
            if let Some(limit) = self.frontend_limit {
                if self.frontends.len() >= limit && !self.frontends.contains_key(&k(&key)) {
                    return Err(WriteError::Full { map: "frontends" });
                }
            }
            self.writes += 1;
            self.log.push(format!("put {:?}", k(&key)));
            self.frontends.insert(k(&key), value);
            Ok(())
        }
        fn delete_frontend(&mut self, key: FrontendKey) -> Result<(), WriteError> {
            self.writes += 1;
            self.log.push(format!("delete {:?}", k(&key)));
            self.frontends.remove(&k(&key));
            Ok(())
        }
        fn put_backend(&mut self, id: u32, value: Backend) -> Result<(), WriteError> {
            self.writes += 1;
            self.backends.insert(id, value);
            Ok(())
        }
        fn delete_backend(&mut self, id: u32) -> Result<(), WriteError> {
            self.writes += 1;
            self.backends.remove(&id);
            Ok(())
        }
        fn put_revnat(&mut self, id: u32, value: RevNat) -> Result<(), WriteError> {
            self.writes += 1;
            self.revnat.insert(id, value);
            Ok(())
        }
        fn delete_revnat(&mut self, id: u32) -> Result<(), WriteError> {
            self.writes += 1;
            self.revnat.remove(&id);
            Ok(())
        }
        fn put_maglev(&mut self, id: u32, table: &MaglevTable) -> Result<(), WriteError> {
            self.writes += 1;
            self.maglev.insert(id, table.backend_ids.to_vec());
            Ok(())
        }
        fn delete_maglev(&mut self, id: u32) -> Result<(), WriteError> {
            self.writes += 1;
            self.maglev.remove(&id);
            Ok(())
        }
        fn purge_conntrack(&mut self, doomed: &dyn Fn(&CtKey, &CtEntry) -> bool) -> usize {
            let before = self.conntrack.len();
            self.conntrack.retain(|(key, entry)| !doomed(key, entry));
            before - self.conntrack.len()
        }
        fn purge_sockets(&mut self, doomed: &dyn Fn(&SockKey, &SockEntry) -> bool) -> Vec<SockKey> {
            let (gone, kept) = self
                .sockets
                .drain(..)
                .partition(|(key, entry)| doomed(key, entry));
            self.sockets = kept;
            gone.into_iter().map(|(key, _)| key).collect::<Vec<_>>()
        }
        fn dump(&self) -> Dump {
            Dump {
                frontends: self
                    .frontends
                    .iter()
                    .map(|(&(addr_be, port_be, proto, scope, slot), v)| {
                        (
                            FrontendKey {
                                addr_be,
                                port_be,
                                proto,
                                scope,
                                slot,
                                ..FrontendKey::default()
                            },
                            *v,
                        )
                    })
                    .collect(),
                backends: self.backends.iter().map(|(k, v)| (*k, *v)).collect(),
                revnat: self.revnat.iter().map(|(k, v)| (*k, *v)).collect(),
            }
        }
    }

    impl MemStore {
        /// The backends the data path would choose from, per frontend.
        fn view(&self, addr: &FrontendAddr) -> Option<Vec<BackendAddr>> {
            let head = self.frontends.get(&k(&frontend_key(addr, 0)))?;
            let mut out = Vec::new();
            for slot in 1..=head.backend_count {
                let v = self.frontends.get(&k(&frontend_key(addr, slot)))?;
                out.push(backend_addr(self.backends.get(&v.backend_id)?));
            }
            out.sort();
            Some(out)
        }
    }

    pub(crate) fn fe(
        ip: [u8; 4],
        port: u16,
        protocol: Protocol,
        name: &str,
        backends: &[(u8, u16)],
    ) -> Frontend {
        Frontend::cluster_ip(
            FrontendAddr {
                ip: Ipv4Addr::from(ip),
                port,
                protocol,
            },
            ServicePortName {
                namespace: "default".into(),
                name: name.into(),
                port: String::new(),
            },
            backends
                .iter()
                .map(|(last, port)| BackendAddr {
                    ip: Ipv4Addr::new(10, 244, 0, *last),
                    port: *port,
                })
                .collect(),
        )
    }

    pub(crate) fn state(frontends: Vec<Frontend>) -> DesiredState {
        DesiredState {
            frontends: frontends.into_iter().map(|f| (f.addr, f)).collect(),
        }
    }

    pub(crate) fn caps() -> Capacities {
        Capacities::default()
    }

    #[test]
    fn new_service_is_written_with_slot_zero_holding_count_and_id() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let web = fe(
            [10, 96, 0, 10],
            80,
            Protocol::Tcp,
            "web",
            &[(1, 8080), (2, 8080)],
        );
        let report = s.apply(&state(vec![web.clone()]));
        assert_eq!(report.added, 1);
        assert!(report.failed.is_empty());
        let store = s.store();
        let head = store.frontends[&k(&frontend_key(&web.addr, 0))];
        assert_eq!(head.backend_count, 2);
        assert_ne!(head.service_id, 0);
        assert_eq!(store.view(&web.addr), Some(web.backends.clone()));
        assert_eq!(revnat_name(&store.revnat[&head.service_id]), "default/web");
        assert_eq!(store.revnat[&head.service_id].port_be, 80u16.to_be());
    }

    #[test]
    fn applying_the_same_state_twice_writes_nothing() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let desired = state(vec![fe(
            [10, 96, 0, 10],
            80,
            Protocol::Tcp,
            "web",
            &[(1, 80), (2, 80)],
        )]);
        s.apply(&desired);
        let report = s.apply(&desired);
        assert_eq!(report.writes, 0);
        assert_eq!(report.unchanged, 1);
    }

    #[test]
    fn removing_one_backend_rewrites_only_what_changes() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let three = fe(
            [10, 96, 0, 10],
            80,
            Protocol::Tcp,
            "web",
            &[(1, 80), (2, 80), (3, 80)],
        );
        s.apply(&state(vec![three]));
        let before = s.store().writes;
        let two = fe(
            [10, 96, 0, 10],
            80,
            Protocol::Tcp,
            "web",
            &[(1, 80), (3, 80)],
        );
        let report = s.apply(&state(vec![two.clone()]));
        assert_eq!(report.updated, 1);
        // slot 2 takes backend 3, slot 0 shrinks, slot 3 goes, backend 2 goes.
        assert_eq!(s.store().writes - before, 4);
        assert_eq!(report.writes, 4);
        assert_eq!(s.store().view(&two.addr), Some(two.backends.clone()));
        assert_eq!(s.store().backends.len(), 2);
    }

    #[test]
    fn removed_service_leaves_no_entries_and_purges_its_flows() {
        let mut store = MemStore::default();
        let web = fe([10, 96, 0, 10], 80, Protocol::Tcp, "web", &[(1, 80)]);
        let dns = fe([10, 96, 0, 53], 53, Protocol::Udp, "dns", &[(5, 53)]);
        store.conntrack.push((
            CtKey::default(),
            CtEntry {
                backend_id: 1,
                service_id: 1,
                ..CtEntry::default()
            },
        ));
        let mut s = Syncer::adopt(store, caps());
        s.apply(&state(vec![web.clone(), dns.clone()]));
        let web_id = s.programmed[&web.addr].service_id;
        s.store.conntrack = vec![
            (
                CtKey::default(),
                CtEntry {
                    backend_id: 1,
                    service_id: web_id,
                    ..CtEntry::default()
                },
            ),
            (
                CtKey {
                    proto: proto::UDP,
                    ..CtKey::default()
                },
                CtEntry {
                    backend_id: 9,
                    service_id: 99,
                    ..CtEntry::default()
                },
            ),
        ];
        let report = s.apply(&state(vec![dns.clone()]));
        assert_eq!(report.removed, 1);
        assert_eq!(report.conntrack_purged, 1);
        assert_eq!(s.store().view(&web.addr), None);
        assert!(s.store().frontends.keys().all(|key| key.1 == 53u16.to_be()));
        assert_eq!(s.store().revnat.len(), 1);
        assert_eq!(s.store().conntrack.len(), 1);
    }

    #[test]
    fn udp_flows_to_a_departed_backend_are_forgotten_tcp_flows_are_kept() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let dns = fe(
            [10, 96, 0, 53],
            53,
            Protocol::Udp,
            "dns",
            &[(1, 53), (2, 53)],
        );
        s.apply(&state(vec![dns.clone()]));
        let id = s.programmed[&dns.addr].service_id;
        let gone = s.backends[&(dns.backends[1], Protocol::Udp)].id;
        let stays = s.backends[&(dns.backends[0], Protocol::Udp)].id;
        let udp = CtKey {
            proto: proto::UDP,
            ..CtKey::default()
        };
        s.store.conntrack = vec![
            (
                udp,
                CtEntry {
                    backend_id: gone,
                    service_id: id,
                    ..CtEntry::default()
                },
            ),
            (
                udp,
                CtEntry {
                    backend_id: stays,
                    service_id: id,
                    ..CtEntry::default()
                },
            ),
        ];
        let report = s.apply(&state(vec![fe(
            [10, 96, 0, 53],
            53,
            Protocol::Udp,
            "dns",
            &[(1, 53)],
        )]));
        assert_eq!(report.conntrack_purged, 1);
        assert_eq!(s.store().conntrack[0].1.backend_id, stays);
    }

    #[test]
    fn sockets_balanced_to_a_departed_udp_backend_are_purged_and_reported() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let dns = fe(
            [10, 96, 0, 53],
            53,
            Protocol::Udp,
            "dns",
            &[(1, 53), (2, 53)],
        );
        s.apply(&state(vec![dns.clone()]));
        let id = s.programmed[&dns.addr].service_id;
        let gone_addr = dns.backends[1];
        let gone = s.backends[&(gone_addr, Protocol::Udp)].id;
        let stays = s.backends[&(dns.backends[0], Protocol::Udp)].id;
        let sock = |cookie: u64, dir: u8, backend: u32, addr: &BackendAddr| {
            (
                SockKey {
                    cookie,
                    addr_be: u32::from_ne_bytes(addr.ip.octets()),
                    port_be: addr.port.to_be(),
                    proto: proto::UDP,
                    dir,
                },
                SockEntry {
                    backend_id: backend,
                    service_id: id,
                    ..SockEntry::default()
                },
            )
        };
        s.store.sockets = vec![
            sock(7, sock_dir::REVERSE, gone, &gone_addr),
            sock(7, sock_dir::FORWARD, gone, &gone_addr),
            sock(8, sock_dir::REVERSE, stays, &dns.backends[0]),
        ];
        let report = s.apply(&state(vec![fe(
            [10, 96, 0, 53],
            53,
            Protocol::Udp,
            "dns",
            &[(1, 53)],
        )]));
        assert_eq!(report.sockets_purged, 2);
        assert_eq!(report.udp_sockets_left, vec![(7, gone_addr)]);
        assert_eq!(s.store().sockets.len(), 1);
        assert_eq!(s.store().sockets[0].0.cookie, 8);
    }

    #[test]
    fn backends_shared_by_two_services_are_stored_once_and_kept_while_used() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let a = fe([10, 96, 0, 1], 80, Protocol::Tcp, "a", &[(1, 80)]);
        let b = fe([10, 96, 0, 2], 80, Protocol::Tcp, "b", &[(1, 80)]);
        s.apply(&state(vec![a.clone(), b.clone()]));
        assert_eq!(s.store().backends.len(), 1);
        s.apply(&state(vec![b.clone()]));
        assert_eq!(s.store().backends.len(), 1);
        assert_eq!(s.store().view(&b.addr), Some(b.backends.clone()));
        s.apply(&DesiredState::default());
        assert!(s.store().backends.is_empty());
        assert!(s.store().frontends.is_empty());
    }

    #[test]
    fn service_without_endpoints_keeps_a_zero_count_entry() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let empty = fe([10, 96, 0, 10], 80, Protocol::Tcp, "web", &[]);
        s.apply(&state(vec![empty.clone()]));
        let head = s.store().frontends[&k(&frontend_key(&empty.addr, 0))];
        assert_eq!(head.backend_count, 0);
        assert_eq!(s.store().view(&empty.addr), Some(vec![]));
    }

    #[test]
    fn a_restarted_syncer_adopts_the_maps_without_rewriting_them() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let desired = state(vec![
            fe(
                [10, 96, 0, 10],
                80,
                Protocol::Tcp,
                "web",
                &[(1, 80), (2, 80)],
            ),
            fe([10, 96, 0, 53], 53, Protocol::Udp, "dns", &[(1, 53)]),
        ]);
        s.apply(&desired);
        let mut store = std::mem::take(&mut s.store);
        store.writes = 0;
        let mut restarted = Syncer::adopt(store, caps());
        assert_eq!(restarted.store().writes, 0);
        let report = restarted.apply(&desired);
        assert_eq!(report.writes, 0, "{report:?}");
        assert_eq!(report.unchanged, 2);
    }

    #[test]
    fn adoption_removes_half_written_frontends_and_orphans() {
        let mut store = MemStore::default();
        let addr = FrontendAddr {
            ip: Ipv4Addr::new(10, 96, 0, 9),
            port: 80,
            protocol: Protocol::Tcp,
        };
        // slot 0 says 2 backends but slot 2 is missing; backend 7 is unused.
        store.frontends.insert(
            k(&frontend_key(&addr, 0)),
            FrontendSlot {
                service_id: 4,
                backend_count: 2,
                ..Default::default()
            },
        );
        store.frontends.insert(
            k(&frontend_key(&addr, 1)),
            FrontendSlot {
                backend_id: 1,
                service_id: 4,
                ..Default::default()
            },
        );
        store.backends.insert(1, Backend::default());
        store.backends.insert(7, Backend::default());
        let s = Syncer::adopt(store, caps());
        assert!(s.store().frontends.is_empty());
        assert!(s.store().backends.is_empty());
        assert_eq!(s.programmed().count(), 0);
    }

    #[test]
    fn a_service_that_does_not_fit_is_reported_by_name_and_the_rest_is_programmed() {
        let small = Capacities {
            frontends: 4,
            ..Capacities::default()
        };
        let mut s = Syncer::adopt(MemStore::default(), small);
        let a = fe([10, 96, 0, 1], 80, Protocol::Tcp, "a", &[(1, 80), (2, 80)]);
        let b = fe([10, 96, 0, 2], 80, Protocol::Tcp, "b", &[(3, 80), (4, 80)]);
        let report = s.apply(&state(vec![a.clone(), b.clone()]));
        assert_eq!(report.added, 1);
        assert_eq!(report.failed.len(), 1);
        assert_eq!(report.failed[0].service, "default/b");
        assert!(
            report.failed[0].reason.contains("full"),
            "{}",
            report.failed[0].reason
        );
        assert_eq!(s.store().view(&a.addr), Some(a.backends.clone()));
        assert_eq!(s.store().view(&b.addr), None);
    }

    #[test]
    fn a_frontend_that_did_not_fit_is_programmed_once_another_leaves() {
        let small = Capacities {
            frontends: 4,
            ..Capacities::default()
        };
        let mut s = Syncer::adopt(MemStore::default(), small);
        let a = fe([10, 96, 0, 1], 80, Protocol::Tcp, "a", &[(1, 80), (2, 80)]);
        let b = fe([10, 96, 0, 2], 80, Protocol::Tcp, "b", &[(3, 80), (4, 80)]);
        s.apply(&state(vec![a.clone(), b.clone()]));
        // Only `a` changes (it goes away); `b` is not among the changed
        // frontends, yet it is retried and now fits.
        let report = s.apply_changed(&state(vec![b.clone()]), &BTreeSet::from([a.addr]));
        assert_eq!((report.removed, report.added), (1, 1), "{report:?}");
        assert!(report.failed.is_empty(), "{report:?}");
        assert_eq!(s.store().view(&b.addr), Some(b.backends.clone()));
    }

    #[test]
    fn only_the_changed_frontends_are_compared() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let a = fe([10, 96, 0, 1], 80, Protocol::Tcp, "a", &[(1, 80)]);
        let b = fe([10, 96, 0, 2], 80, Protocol::Tcp, "b", &[(2, 80)]);
        s.apply(&state(vec![a.clone(), b.clone()]));
        let mut a2 = a.clone();
        a2.backends = vec![BackendAddr { ip: Ipv4Addr::new(10, 244, 0, 9), port: 80 }];
        let mut b2 = b.clone();
        b2.backends = vec![BackendAddr { ip: Ipv4Addr::new(10, 244, 0, 8), port: 80 }];
        let report = s.apply_changed(&state(vec![a2.clone(), b2]), &BTreeSet::from([a.addr]));
        assert_eq!((report.updated, report.unchanged), (1, 0), "{report:?}");
        assert_eq!(s.store().view(&a.addr), Some(a2.backends));
        // `b` was not reported changed: left as it was.
        assert_eq!(s.store().view(&b.addr), Some(b.backends));
    }

    #[test]
    fn a_full_map_mid_write_keeps_the_old_state_visible() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let a = fe([10, 96, 0, 1], 80, Protocol::Tcp, "a", &[(1, 80)]);
        s.apply(&state(vec![a.clone()]));
        s.store.frontend_limit = Some(2);
        let grown = fe(
            [10, 96, 0, 1],
            80,
            Protocol::Tcp,
            "a",
            &[(1, 80), (2, 80), (3, 80)],
        );
        let report = s.apply(&state(vec![grown]));
        assert_eq!(report.failed.len(), 1);
        assert_eq!(s.store().view(&a.addr), Some(a.backends.clone()));
    }

    #[test]
    fn kind_policy_and_affinity_are_recorded_in_slot_zero_and_a_change_rewrites_it() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let mut np = fe([192, 168, 50, 1], 30080, Protocol::Tcp, "web", &[(1, 80)]);
        np.kind = FrontendKind::NodePort;
        np.local_only = true;
        np.external_backends = Some(np.backends.clone());
        np.affinity_timeout_s = Some(10800);
        s.apply(&state(vec![np.clone()]));
        let head = s.store().frontends[&k(&frontend_key(&np.addr, 0))];
        assert_eq!(
            head.flags & frontend_flags::KIND_MASK,
            frontend_flags::KIND_NODE_PORT
        );
        assert_ne!(head.flags & frontend_flags::LOCAL_ONLY, 0);
        assert_ne!(head.flags & frontend_flags::AFFINITY_CLIENT_IP, 0);
        assert_eq!(head.affinity_timeout_s, 10800);

        np.affinity_timeout_s = None;
        let report = s.apply(&state(vec![np.clone()]));
        // Slot 0 of both sets: traffic from outside has affinity too.
        assert_eq!((report.updated, report.writes), (1, 2), "{report:?}");
        let head = s.store().frontends[&k(&frontend_key(&np.addr, 0))];
        assert_eq!(head.flags & frontend_flags::AFFINITY_CLIENT_IP, 0);
        // Adopted state carries the attributes: no rewrite after a restart.
        let store = std::mem::take(&mut s.store);
        let mut restarted = Syncer::adopt(store, caps());
        assert_eq!(restarted.apply(&state(vec![np])).writes, 0);
    }

    #[test]
    fn external_local_set_is_written_before_it_is_announced_and_removed_after() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let mut np = fe([192, 168, 50, 1], 30080, Protocol::Tcp, "web", &[(1, 80), (2, 80), (3, 80)]);
        np.kind = FrontendKind::NodePort;
        np.local_only = true;
        np.external_backends = Some(vec![np.backends[1]]);
        s.apply(&state(vec![np.clone()]));
        let ext = |s: &Syncer<MemStore>, slot| {
            s.store()
                .frontends
                .get(&k(&scoped_key(&np.addr, scope::EXTERNAL, slot)))
                .copied()
        };
        let head = ext(&s, 0).expect("external slot 0");
        assert_eq!(head.backend_count, 1);
        let internal = s.store().frontends[&k(&frontend_key(&np.addr, 0))];
        assert_eq!(head.service_id, internal.service_id, "one service id for both sets");
        assert_eq!(internal.backend_count, 3, "pods and the host keep every endpoint");
        let id = ext(&s, 1).expect("external slot 1").backend_id;
        assert_eq!(backend_addr(&s.store().backends[&id]), np.backends[1]);
        // The write order: the external set before the slot 0 that announces it.
        let order = s.store().log.clone();
        let ext_head = order.iter().position(|w| w == &format!("put {:?}", k(&scoped_key(&np.addr, scope::EXTERNAL, 0))));
        let int_head = order.iter().position(|w| w == &format!("put {:?}", k(&frontend_key(&np.addr, 0))));
        assert!(ext_head < int_head, "{order:?}");

        // A restart adopts both sets without a write.
        let store = std::mem::take(&mut s.store);
        let mut restarted = Syncer::adopt(store, caps());
        let report = restarted.apply(&state(vec![np.clone()]));
        assert_eq!((report.unchanged, report.writes), (1, 0), "{report:?}");

        // No local endpoint left: the set stays, empty (outside traffic is dropped).
        np.external_backends = Some(Vec::new());
        restarted.apply(&state(vec![np.clone()]));
        assert_eq!(ext(&restarted, 0).map(|h| h.backend_count), Some(0));
        assert_eq!(ext(&restarted, 1), None);

        // Back to Cluster: slot 0 stops announcing it, then it goes.
        np.local_only = false;
        np.external_backends = None;
        restarted.apply(&state(vec![np.clone()]));
        assert_eq!(ext(&restarted, 0), None);
        assert_eq!(restarted.store().frontends.len(), 4);
    }

    #[test]
    fn maglev_tables_follow_the_external_set_and_go_with_the_algorithm() {
        let mut s = Syncer::adopt(MemStore::default(), caps());
        let mut lb = fe([203, 0, 113, 10], 80, Protocol::Tcp, "lb", &[(1, 80), (2, 80), (3, 80)]);
        lb.kind = FrontendKind::LoadBalancer;
        lb.algorithm = Some(LbAlgorithm::Maglev);
        s.apply(&state(vec![lb.clone()]));
        let head = s.store().frontends[&k(&frontend_key(&lb.addr, 0))];
        assert_eq!(head.flags & frontend_flags::ALGO_MASK, frontend_flags::ALGO_MAGLEV);
        let table = s.store().maglev[&head.service_id].clone();
        assert_eq!(table.len(), capacity::MAGLEV_TABLE as usize);
        let ids: BTreeSet<u32> = table.iter().copied().collect();
        let live: BTreeSet<u32> = s.store().backends.keys().copied().collect();
        assert_eq!(ids, live, "every entry names one of the three backends, and each appears");

        // Another node with its own ids fills the same table by address.
        let mut other = Syncer::adopt(MemStore::default(), caps());
        let decoy = fe([10, 96, 0, 1], 80, Protocol::Tcp, "decoy", &[(9, 80)]);
        other.apply(&state(vec![decoy.clone()]));
        other.apply(&state(vec![decoy, lb.clone()]));
        let other_head = other.store().frontends[&k(&frontend_key(&lb.addr, 0))];
        let by_addr = |s: &Syncer<MemStore>, table: &[u32]| -> Vec<BackendAddr> {
            table.iter().map(|id| backend_addr(&s.store().backends[id])).collect()
        };
        assert_eq!(
            by_addr(&s, &table),
            by_addr(&other, &other.store().maglev[&other_head.service_id]),
            "nodes agree on every entry"
        );

        // Local policy: the table covers what traffic from outside gets.
        lb.local_only = true;
        lb.external_backends = Some(vec![lb.backends[0]]);
        s.apply(&state(vec![lb.clone()]));
        let table = s.store().maglev[&head.service_id].clone();
        assert!(by_addr(&s, &table).iter().all(|b| *b == lb.backends[0]));

        // The agent's default applies when the Service names none.
        lb.algorithm = None;
        s.apply(&state(vec![lb.clone()]));
        assert!(!s.store().maglev.contains_key(&head.service_id));
        s.set_default_algorithm(LbAlgorithm::SourceHash);
        s.apply(&state(vec![lb.clone()]));
        let head = s.store().frontends[&k(&frontend_key(&lb.addr, 0))];
        assert_eq!(head.flags & frontend_flags::ALGO_MASK, frontend_flags::ALGO_SOURCE_HASH);
        assert!(s.store().maglev.contains_key(&head.service_id));
        s.apply(&state(vec![]));
        assert!(s.store().maglev.is_empty(), "removed with its frontend");
    }

    #[test]
    fn place_keeps_survivors_in_their_slots() {
        assert_eq!(place(&[1, 2, 3], &[1, 3]), vec![1, 3]);
        assert_eq!(place(&[1, 2, 3], &[1, 3, 4]), vec![1, 4, 3]);
        assert_eq!(place(&[1, 2, 3], &[3]), vec![3]);
        assert_eq!(place(&[], &[5, 6]), vec![5, 6]);
        assert_eq!(place(&[1, 2], &[1, 2, 7]), vec![1, 2, 7]);
        assert_eq!(place(&[1, 2, 3, 4], &[4, 1]), vec![1, 4]);
    }
}
