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
use std::borrow::Cow;
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
    sync::store::{Dump, MapStore, WriteError},
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

    /// The slots and shares of set `scope` (the external set's slots are
    /// empty when it has none).
    fn set(&self, scope: u8) -> (&[u32], Option<&[u16]>) {
        let slots = match scope {
            scope::INTERNAL => &self.slots[..],
            _ => self.external.as_deref().unwrap_or_default(),
        };
        (slots, self.shares(scope))
    }

    /// Whether slot 0 names a hashing algorithm, whose Maglev table is in
    /// the maps under the service id.
    fn hashed(&self) -> bool {
        self.flags & frontend_flags::ALGO_MASK != frontend_flags::ALGO_RANDOM
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

    fn get(&self, family: IpFamily) -> usize {
        match family {
            IpFamily::V4 => self.v4,
            IpFamily::V6 => self.v6,
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

/// One sync under way: what it did so far, the flows to purge once it is
/// done, and whether a write failed.
#[derive(Default)]
struct Pass {
    report: SyncReport,
    purge: Purge,
    /// A write failed half-way: the maps are reloaded at the end.
    failed_write: bool,
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

    /// Rebuilds the in-memory view from the maps and removes orphans:
    /// every whole frontend is adopted as the maps hold it (see
    /// [`adopt_frontend`](Self::adopt_frontend)), then every entry no
    /// adopted frontend uses is deleted. A frontend left half-written (by a
    /// crash, or a failed write) is not adopted; its entries go with the
    /// orphans, and the next apply writes it again.
    fn reload(&mut self) {
        let dump = self.store.dump();
        self.programmed.clear();
        self.backends.clear();
        self.service_ids.clear();
        self.frontend_entries = PerFamily::default();
        self.range_entries = PerFamily::default();
        let index = DumpIndex::new(&dump);
        let mut adopted = Adopted::default();
        for (key, head) in dump
            .frontends
            .iter()
            .filter(|(k, _)| k.slot() == 0 && k.scope() == scope::INTERNAL)
        {
            self.adopt_frontend(&index, key, head, &mut adopted);
        }
        self.remove_orphans(&dump, &index, &adopted);
        self.next_service_id = self.service_ids.last().map_or(1, |id| id + 1);
        self.next_backend_id = self.backends.max_id().map_or(1, |id| id + 1);
    }

    /// Adopts the frontend whose internal slot 0 is `head` if it is whole:
    /// every slot of its sets present and naming a backend of its family, a
    /// service id no frontend of the other family has, and no backend id
    /// an adopted frontend of the other family holds. Ids are one space,
    /// so an id found in both families' maps (a crash between a delete and
    /// a reuse) stays with the first frontend that uses it; another
    /// family's frontend naming it is left out and rewritten with a fresh
    /// id.
    fn adopt_frontend(
        &mut self,
        index: &DumpIndex,
        key: &AnyFrontendKey,
        head: &FrontendSlot,
        adopted: &mut Adopted,
    ) {
        let Some(addr) = frontend_addr(key) else {
            return;
        };
        let Some((internal, external)) = index.complete_sets(key, head) else {
            // Half-written by a crash: drop it; the next apply rewrites it.
            warn!(frontend = %addr, "adopting maps: incomplete frontend entry removed");
            return;
        };
        if head.service_id == 0
            || adopted
                .service_family
                .get(&head.service_id)
                .is_some_and(|f| *f != addr.family())
        {
            warn!(frontend = %addr, "adopting maps: incomplete frontend entry removed");
            return;
        }
        let other_family = internal
            .0
            .iter()
            .chain(external.iter().flat_map(|(ids, _)| ids))
            .any(|id| {
                self.backends
                    .get(*id)
                    .is_some_and(|(b, _)| b.family() != addr.family())
            });
        if other_family {
            warn!(frontend = %addr, "adopting maps: a backend id of this frontend is used by the other address family; the frontend is rewritten");
            return;
        }
        let sets = [
            (scope::INTERNAL, Some(&internal.0)),
            (scope::EXTERNAL, external.as_ref().map(|(ids, _)| ids)),
        ];
        for (scope, set) in sets {
            let Some(set) = set else { continue };
            for slot in 0..=set.len() as u16 {
                adopted.slots.insert(key.at(scope, slot));
            }
            for id in set {
                adopted.backends.insert((*id, addr.family()));
                let backend = index.backends[&(addr.family(), *id)];
                self.backends
                    .hold(*id, backend_addr(&backend), addr.protocol);
            }
        }
        let programmed = index.programmed(&addr, head, internal, external);
        self.service_ids.insert(head.service_id);
        adopted
            .service_family
            .insert(head.service_id, addr.family());
        *self.frontend_entries.of(addr.family()) += programmed.entries();
        *self.range_entries.of(addr.family()) += programmed.ranges.len();
        self.programmed.insert(addr, programmed);
    }

    /// Deletes what no adopted frontend uses: the slots of frontends left
    /// out, unused backends, and the reverse-NAT entries and source blocks
    /// of service ids no frontend of their family has.
    fn remove_orphans(&mut self, dump: &Dump, index: &DumpIndex, adopted: &Adopted) {
        for key in index.slots.keys().filter(|k| !adopted.slots.contains(k)) {
            log_write(self.store.delete_frontend(*key));
        }
        for (id, backend) in &dump.backends {
            if !adopted.backends.contains(&(*id, backend.family())) {
                log_write(self.store.delete_backend(*id, backend.family()));
            }
        }
        for (id, rnat) in &dump.revnat {
            if adopted.service_family.get(id) != Some(&rnat.family()) {
                log_write(self.store.delete_revnat(*id, rnat.family()));
            }
        }
        for (id, block) in &dump.source_ranges {
            let family = if block.is_ipv4() {
                IpFamily::V4
            } else {
                IpFamily::V6
            };
            if adopted.service_family.get(id) != Some(&family) {
                log_write(self.store.delete_source_range(*id, *block));
            }
        }
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

    /// Brings the `changed` frontends, and those that failed before (a
    /// removal elsewhere may have made room), to `desired`. The steps'
    /// order is what the sync promises:
    /// 1. the frontends `desired` no longer has are removed, so the
    ///    entries they free are there for what is added;
    /// 2. the others are added or updated ([`upsert`](Self::upsert));
    ///    into empty maps, in batches;
    /// 3. the flows and sockets of what left are purged, once no slot
    ///    names it.
    ///
    /// A write that fails half-way makes the maps the truth: they are
    /// reloaded, and the next sync compares every frontend. A failed batch
    /// is written again at once, one entry at a time.
    fn sync_frontends(
        &mut self,
        desired: &DesiredState,
        changed: &BTreeSet<FrontendAddr>,
        batching: Batching,
    ) -> SyncReport {
        let changed = self.with_failed(changed);
        let mut pass = Pass::default();
        self.remove_gone(desired, &changed, &mut pass);
        // Into empty maps (a fresh start), puts go out in batches: a start
        // at 100k Services writes over two million entries.
        let batched = batching == Batching::Allowed
            && self.programmed.is_empty()
            && changed.len() >= BATCH_FROM;
        if batched {
            self.store.hold_puts();
        }
        self.upsert_desired(desired, &changed, &mut pass);
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
        let Pass {
            mut report,
            purge,
            failed_write,
        } = pass;
        report.failed = self.failed.values().cloned().collect();
        self.purge_flows(&purge, &mut report);
        if failed_write {
            // Some write failed half-way: believe the maps, not our
            // bookkeeping, and compare everything at the next sync.
            self.reload();
            self.needs_full = true;
        }
        report
    }

    /// `changed`, and the frontends that failed before.
    fn with_failed<'a>(
        &self,
        changed: &'a BTreeSet<FrontendAddr>,
    ) -> Cow<'a, BTreeSet<FrontendAddr>> {
        if self.failed.is_empty() {
            return Cow::Borrowed(changed);
        }
        let mut all: BTreeSet<FrontendAddr> = self.failed.keys().copied().collect();
        all.extend(changed.iter().copied());
        Cow::Owned(all)
    }

    /// Step 1: removes the `changed` frontends `desired` no longer has
    /// (slot 0 first: see [`remove`](Self::remove)). They are no longer
    /// failed either.
    fn remove_gone(
        &mut self,
        desired: &DesiredState,
        changed: &BTreeSet<FrontendAddr>,
        pass: &mut Pass,
    ) {
        for addr in changed
            .iter()
            .filter(|a| !desired.frontends.contains_key(a))
        {
            self.failed.remove(addr);
            if !self.programmed.contains_key(addr) {
                continue;
            }
            match self.remove(addr, &mut pass.purge, &mut pass.report.writes) {
                Ok(()) => pass.report.removed += 1,
                Err(error) => {
                    pass.failed_write = true;
                    warn!(frontend = %addr, %error, "removing frontend failed");
                }
            }
        }
    }

    /// Step 2: adds or updates the `changed` frontends `desired` has. One
    /// that does not fit, or whose write failed, is recorded as failed, with
    /// the reason; one programmed is no longer failed.
    fn upsert_desired(
        &mut self,
        desired: &DesiredState,
        changed: &BTreeSet<FrontendAddr>,
        pass: &mut Pass,
    ) {
        for frontend in changed.iter().filter_map(|a| desired.frontends.get(a)) {
            let addr = &frontend.addr;
            let name = frontend.service.to_string();
            let reason = match self.upsert(frontend, &name, &mut pass.purge, &mut pass.report) {
                Ok(()) => {
                    self.failed.remove(addr);
                    continue;
                }
                Err(UpsertError::Capacity(reason)) => reason,
                Err(UpsertError::Write(error)) => {
                    pass.failed_write = true;
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
    }

    /// Step 3: drops the connection-tracking and socket-layer entries of
    /// the service ports that left, and the UDP ones of backends that left
    /// their service (the next datagram picks a live backend), scanning
    /// only the tables of the families concerned. The connected UDP sockets
    /// among them are reported ([`SyncReport::udp_sockets_left`]).
    fn purge_flows(&mut self, purge: &Purge, report: &mut SyncReport) {
        if purge.services.is_empty() && purge.udp_backends.is_empty() {
            return;
        }
        let udp_reverse = |proto: u8, dir: u8| proto == proto::UDP && dir == sock_dir::REVERSE;
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
                    .filter(|key| udp_reverse(key.proto, key.dir))
                    .map(|key| {
                        (
                            key.cookie,
                            sock_backend(IpAddr::V4(ipv4(key.addr_be)), key.port_be),
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
                    .filter(|key| udp_reverse(key.proto, key.dir))
                    .map(|key| {
                        (
                            key.cookie,
                            sock_backend(IpAddr::V6(ipv6(key.addr_be)), key.port_be),
                        )
                    }),
            );
        }
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

    /// Adds `frontend`, or brings it to what it should be, under `name`,
    /// in the order the module doc gives: nothing is written when it is
    /// unchanged or would not fit (checked before any write); else the
    /// reverse-NAT entry, the new sets' backends
    /// ([`acquire_sets`](Self::acquire_sets)), what slot 0 announces and
    /// the slots ([`write_new`](Self::write_new)), and only then what the
    /// old frontend used and the new one does not
    /// ([`delete_unused`](Self::delete_unused),
    /// [`release_old`](Self::release_old)).
    fn upsert(
        &mut self,
        frontend: &Frontend,
        name: &str,
        purge: &mut Purge,
        report: &mut SyncReport,
    ) -> Result<(), UpsertError> {
        let addr = &frontend.addr;
        let old = self.programmed.get(addr).cloned();
        let wanted = Wanted::new(frontend, name, self.defaults)?;
        if old
            .as_ref()
            .is_some_and(|old| self.is_unchanged(old, &wanted))
        {
            report.unchanged += 1;
            return Ok(());
        }
        self.check_capacity(addr, old.as_ref(), &wanted)?;
        let service_id = match &old {
            Some(old) => old.service_id,
            None => self.allocate_service_id().ok_or_else(|| {
                UpsertError::Capacity(format!(
                    "service id space full ({} service ports, --max-services)",
                    self.caps.services
                ))
            })?,
        };
        if old.as_ref().is_none_or(|o| o.name != wanted.name) {
            self.store
                .put_revnat(service_id, revnat_value(addr, name))?;
            report.writes += 1;
        }
        let (old_entries, new_entries) = (
            old.as_ref().map_or(0, Programmed::entries),
            wanted.entries(),
        );
        let old_ranges = old.as_ref().map_or(0, |o| o.ranges.len());
        let (slots, external) =
            self.acquire_sets(&wanted, old.as_ref(), addr.protocol, &mut report.writes)?;
        let new = wanted.programmed(service_id, slots, external);
        self.write_new(addr, old.as_ref(), &new, &mut report.writes)?;
        self.delete_unused(addr, old.as_ref(), &new, &mut report.writes)?;
        let family = addr.family();
        let ranges = self.range_entries.of(family);
        *ranges = *ranges - old_ranges + new.ranges.len();
        self.release_old(addr, old.as_ref(), &new, purge, &mut report.writes)?;
        let entries = self.frontend_entries.of(family);
        *entries = *entries - old_entries + new_entries;
        if old.is_some() {
            report.updated += 1;
        } else {
            report.added += 1;
        }
        self.programmed.insert(*addr, new);
        Ok(())
    }

    /// Whether `old` is what `wanted` asks for. Backend sets are compared,
    /// not slot order (a weighted set's order is its layout).
    fn is_unchanged(&self, old: &Programmed, wanted: &Wanted) -> bool {
        let same_external = match (&old.external, &wanted.external) {
            (None, None) => true,
            (Some(ids), Some(plan)) => self.same_set(ids, old.shares(scope::EXTERNAL), plan),
            _ => false,
        };
        self.same_set(&old.slots, old.shares(scope::INTERNAL), &wanted.internal)
            && same_external
            && old.name == wanted.name
            && old.flags == wanted.flags
            && old.affinity_timeout_s == wanted.affinity_timeout_s
            && *old.ranges == *wanted.ranges
    }

    /// Whether `wanted` fits where `old` (if any) was: the frontend map's
    /// entries, the backend map's (backends no frontend has yet) and the
    /// source-range trie's, each counted in the frontend's family. Checked
    /// before any write, so a frontend that does not fit leaves the maps
    /// as they were.
    fn check_capacity(
        &self,
        addr: &FrontendAddr,
        old: Option<&Programmed>,
        wanted: &Wanted,
    ) -> Result<(), UpsertError> {
        let family = addr.family();
        // The IPv4 wording predates IPv6 (and is kept).
        let which = match family {
            IpFamily::V4 => "",
            IpFamily::V6 => "IPv6 ",
        };
        let old_entries = old.map_or(0, Programmed::entries);
        if self.frontend_entries.get(family) - old_entries + wanted.entries()
            > self.caps.frontends as usize
        {
            return Err(UpsertError::Capacity(format!(
                "{which}frontend map full ({} entries)",
                self.caps.frontends
            )));
        }
        let new_backends = wanted
            .internal
            .addrs
            .iter()
            .chain(wanted.external.iter().flat_map(|e| e.addrs.iter()))
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
        let old_ranges = old.map_or(0, |o| o.ranges.len());
        if self.range_entries.get(family) - old_ranges + wanted.ranges.len()
            > capacity::SOURCE_RANGES as usize
        {
            return Err(UpsertError::Capacity(format!(
                "{which}loadBalancerSourceRanges map full ({} blocks)",
                capacity::SOURCE_RANGES
            )));
        }
        Ok(())
    }

    /// Takes a reference on every backend of `wanted`'s sets, writing the
    /// entries of new ones, before any reference of `old` is dropped: a
    /// backend that stays is never deleted in between. Returns each set's
    /// slots (the external set's `None` when it has none); survivors keep
    /// their slot ([`SetPlan::place`]).
    fn acquire_sets(
        &mut self,
        wanted: &Wanted,
        old: Option<&Programmed>,
        protocol: Protocol,
        writes: &mut usize,
    ) -> Result<(Vec<u32>, Option<Vec<u32>>), WriteError> {
        let internal = self.acquire_all(&wanted.internal.addrs, protocol, writes)?;
        let external = match &wanted.external {
            Some(set) => Some(self.acquire_all(&set.addrs, protocol, writes)?),
            None => None,
        };
        let slots = wanted
            .internal
            .place(set_or_empty(old, scope::INTERNAL).0, internal);
        let external = wanted
            .external
            .as_ref()
            .zip(external)
            .map(|(plan, ids)| plan.place(set_or_empty(old, scope::EXTERNAL).0, ids));
        Ok((slots, external))
    }

    /// Writes `new` over `old` (if any) so that every lookup meets a whole
    /// frontend: the Maglev table and the new source blocks before either
    /// slot 0 announces them (the table names only backends referenced
    /// already; no source the new list allows is denied meanwhile), and
    /// the external set before the internal set, whose slot 0 announces it
    /// ([`write_set`](Self::write_set) for each).
    fn write_new(
        &mut self,
        addr: &FrontendAddr,
        old: Option<&Programmed>,
        new: &Programmed,
        writes: &mut usize,
    ) -> Result<(), WriteError> {
        if new.hashed() {
            let (set, shares) = match &new.external {
                Some(external) => (&**external, new.shares(scope::EXTERNAL)),
                None => (&*new.slots, new.shares(scope::INTERNAL)),
            };
            let table = self.maglev_table(set, shares, addr.protocol);
            self.store.put_maglev(new.service_id, &table)?;
            *writes += 1;
        }
        let old_blocks = old.map_or(&[][..], |o| &o.ranges);
        for block in new.ranges.iter().filter(|b| !old_blocks.contains(b)) {
            self.store.put_source_range(new.service_id, *block)?;
            *writes += 1;
        }
        let attributes = (new.flags, new.affinity_timeout_s);
        if new.external.is_some() {
            *writes += self.write_set(
                addr,
                scope::EXTERNAL,
                new.service_id,
                set_or_empty(old, scope::EXTERNAL),
                new.set(scope::EXTERNAL),
                attributes,
            )?;
        }
        *writes += self.write_set(
            addr,
            scope::INTERNAL,
            new.service_id,
            set_or_empty(old, scope::INTERNAL),
            new.set(scope::INTERNAL),
            attributes,
        )?;
        Ok(())
    }

    /// Deletes what `old` (if any) used and `new`, now announced, does
    /// not: its external set, its Maglev table, and its stale source
    /// blocks (the old list's blocks go within this sync).
    fn delete_unused(
        &mut self,
        addr: &FrontendAddr,
        old: Option<&Programmed>,
        new: &Programmed,
        writes: &mut usize,
    ) -> Result<(), WriteError> {
        let Some(old) = old else {
            return Ok(());
        };
        if let (Some(old), None) = (&old.external, &new.external) {
            *writes += self.delete_external_set(addr, old.len())?;
        }
        if old.hashed() && !new.hashed() {
            self.store.delete_maglev(new.service_id)?;
            *writes += 1;
        }
        for block in old.ranges.iter().filter(|b| !new.ranges.contains(b)) {
            self.store.delete_source_range(new.service_id, *block)?;
            *writes += 1;
        }
        Ok(())
    }

    /// Drops the references `old` (if any) held on its backends, once `new`
    /// is announced: an entry nobody uses goes. A UDP backend that left the
    /// service has its flows purged after the sync.
    fn release_old(
        &mut self,
        addr: &FrontendAddr,
        old: Option<&Programmed>,
        new: &Programmed,
        purge: &mut Purge,
        writes: &mut usize,
    ) -> Result<(), WriteError> {
        let Some(old) = old else {
            return Ok(());
        };
        let kept: HashSet<u32> = new
            .slots
            .iter()
            .chain(new.external.iter().flatten())
            .copied()
            .collect();
        for id in old.slots.iter().chain(old.external.iter().flatten()) {
            if addr.protocol == Protocol::Udp && !kept.contains(id) {
                purge.udp_backends.insert((new.service_id, *id));
                purge.family(addr.family());
            }
            *writes += self.release_backend(*id)?;
        }
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

/// A [`Dump`] of the maps, looked up by key.
struct DumpIndex {
    /// Each family's backends by id.
    backends: HashMap<(IpFamily, u32), AnyBackend>,
    revnat: HashMap<u32, AnyRevNat>,
    slots: HashMap<AnyFrontendKey, FrontendSlot>,
    /// The source blocks under each service id, both families.
    ranges: HashMap<u32, Vec<IpCidr>>,
}

impl DumpIndex {
    fn new(dump: &Dump) -> DumpIndex {
        let mut ranges: HashMap<u32, Vec<IpCidr>> = HashMap::new();
        for (id, block) in &dump.source_ranges {
            ranges.entry(*id).or_default().push(*block);
        }
        DumpIndex {
            backends: dump
                .backends
                .iter()
                .map(|(id, b)| ((b.family(), *id), *b))
                .collect(),
            revnat: dump.revnat.iter().copied().collect(),
            slots: dump.frontends.iter().copied().collect(),
            ranges,
        }
    }

    /// The sets of the frontend whose internal slot 0 is `head`: the
    /// internal one, and the external one when slot 0 announces it
    /// ([`frontend_flags::has_external_set`]); `None` when either is
    /// incomplete ([`complete_slots`]).
    fn complete_sets(
        &self,
        key: &AnyFrontendKey,
        head: &FrontendSlot,
    ) -> Option<(SlotSet, Option<SlotSet>)> {
        let internal = complete_slots(&self.slots, &self.backends, key, head)?;
        if !frontend_flags::has_external_set(head.flags) {
            return Some((internal, None));
        }
        let ext_key = key.at(scope::EXTERNAL, 0);
        let ext_head = self.slots.get(&ext_key)?;
        let external = complete_slots(&self.slots, &self.backends, &ext_key, ext_head)?;
        Some((internal, Some(external)))
    }

    /// The frontend at `addr` as the maps hold it, from its slot 0 (`head`)
    /// and its complete sets: its reverse-NAT name and source blocks are
    /// those of its family under its service id.
    fn programmed(
        &self,
        addr: &FrontendAddr,
        head: &FrontendSlot,
        (ids, internal_shares): SlotSet,
        external: Option<SlotSet>,
    ) -> Programmed {
        let (external, external_shares) = match external {
            Some((ids, shares)) => (Some(ids), shares),
            None => (None, None),
        };
        let name = self
            .revnat
            .get(&head.service_id)
            .filter(|r| r.family() == addr.family())
            .map(revnat_name)
            .unwrap_or_default();
        // Blocks of the other family under this id are orphans.
        let mut blocks: Vec<IpCidr> = self
            .ranges
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
        Programmed {
            service_id: head.service_id,
            name: NameHash::of(&name),
            flags: head.flags & !frontend_flags::WEIGHTED,
            affinity_timeout_s: head.affinity_timeout_s,
            slots: ids.into(),
            external: external.map(Into::into),
            ranges: blocks.into(),
            weights,
        }
    }
}

/// What the frontends adopted so far use; the rest of the dump is orphaned.
#[derive(Default)]
struct Adopted {
    slots: HashSet<AnyFrontendKey>,
    backends: HashSet<(u32, IpFamily)>,
    /// The family of each service id adopted.
    service_family: HashMap<u32, IpFamily>,
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

/// What one frontend should look like in the maps, before its backends
/// have ids.
struct Wanted {
    /// The reverse-NAT name, hashed.
    name: NameHash,
    /// Slot 0's flags and affinity timeout.
    flags: u16,
    affinity_timeout_s: u32,
    internal: SetPlan,
    /// `Some` exactly when slot 0 announces an external set.
    external: Option<SetPlan>,
    ranges: Vec<IpCidr>,
}

impl Wanted {
    /// What `frontend` asks for, under `name`, with the agent's
    /// `defaults`; refused when it has more endpoints than one service
    /// port can have.
    fn new(
        frontend: &Frontend,
        name: &str,
        defaults: FrontendDefaults,
    ) -> Result<Wanted, UpsertError> {
        let internal = sorted_set(&frontend.backends);
        let (flags, affinity_timeout_s) = slot_zero_attributes(frontend, defaults);
        let external = frontend_flags::has_external_set(flags)
            .then(|| sorted_set(frontend.external_backends.as_deref().unwrap_or_default()));
        let distinct = internal.len();
        let wanted = Wanted {
            name: NameHash::of(name),
            flags,
            affinity_timeout_s,
            internal: SetPlan::new(frontend, flags, internal),
            external: external.map(|set| SetPlan::new(frontend, flags, set)),
            ranges: frontend
                .source_ranges
                .as_ref()
                .map(|r| r.blocks.to_vec())
                .unwrap_or_default(),
        };
        let limit = usize::from(capacity::MAX_BACKENDS_PER_SERVICE);
        if distinct > limit {
            return Err(UpsertError::Capacity(format!(
                "{distinct} endpoints, more than the {limit} one service port can have"
            )));
        }
        Ok(wanted)
    }

    /// Frontend map entries it takes (as [`Programmed::entries`]).
    fn entries(&self) -> usize {
        1 + self.internal.addrs.len() + self.external.as_ref().map_or(0, |e| 1 + e.addrs.len())
    }

    /// The frontend as it will be programmed, with `service_id` and its
    /// sets' `slots` and `external` slots.
    fn programmed(
        self,
        service_id: u32,
        slots: Vec<u32>,
        external: Option<Vec<u32>>,
    ) -> Programmed {
        let internal_shares = self.internal.shares.map(Into::into);
        let external_shares = self.external.and_then(|e| e.shares).map(Into::into);
        let weights = (internal_shares.is_some() || external_shares.is_some()).then(|| {
            Box::new(Shares {
                internal: internal_shares,
                external: external_shares,
            })
        });
        Programmed {
            service_id,
            name: self.name,
            flags: self.flags,
            affinity_timeout_s: self.affinity_timeout_s,
            slots: slots.into(),
            external: external.map(Into::into),
            ranges: self.ranges.into(),
            weights,
        }
    }
}

/// The slots and shares of set `scope` of `programmed`; none of a
/// frontend not programmed.
fn set_or_empty(programmed: Option<&Programmed>, scope: u8) -> (&[u32], Option<&[u16]>) {
    programmed.map_or((&[], None), |p| p.set(scope))
}

/// The backend a socket-layer entry was balanced to (its port in network
/// byte order).
fn sock_backend(ip: IpAddr, port_be: u16) -> BackendAddr {
    BackendAddr {
        ip,
        port: u16::from_be(port_be),
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
