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
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;

use proxy_common::{
    frontend_flags, proto, scope, sock_dir, CtEntry, CtEntry6, CtKey, CtKey6, SockEntry,
    SockEntry6, SockKey, SockKey6,
};
use tracing::{debug, warn};

use crate::model::cidr::IpCidr;
use crate::{
    model::{BackendAddr, DesiredState, FrontendAddr, IpFamily, LbAlgorithm},
    sync::backends::Backends,
    sync::encode::{frontend_key, ipv4, ipv6, scoped_key, FrontendDefaults},
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

    /// The addresses of backend ids, sorted.
    fn addrs_of(&self, ids: &[u32]) -> Vec<BackendAddr> {
        let mut addrs: Vec<BackendAddr> = ids
            .iter()
            .filter_map(|id| self.backends.get(*id).map(|(b, _)| b))
            .collect();
        addrs.sort();
        addrs
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

mod adopt;
mod backends;
#[cfg(test)]
mod cases;
pub mod encode;
pub mod heal;
pub mod maglev;
#[cfg(test)]
pub(crate) mod maptext;
#[cfg(test)]
pub(crate) mod memstore;
#[cfg(test)]
mod properties;
pub mod store;
#[cfg(test)]
pub(crate) mod tests;
mod upsert;
pub mod weights;
