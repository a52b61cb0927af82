//! Writing one frontend: what it should be worked out first (and nothing
//! written if it is unchanged or would not fit), then the writes in the
//! order the sync's module doc gives, so that every slot a lookup can reach
//! names a backend that exists.
use std::collections::{HashMap, HashSet};

use proxy_common::{capacity, frontend_flags, scope, FrontendSlot, MaglevTable};
use tracing::debug;

use crate::{
    model::cidr::IpCidr,
    model::{BackendAddr, Frontend, FrontendAddr, IpFamily, Protocol},
    sync::encode::{
        backend_value, proto_number, revnat_value, scoped_key, slot_zero_attributes,
        FrontendDefaults,
    },
    sync::maglev::{self, BackendKey},
    sync::store::{MapStore, WriteError},
    sync::{place, weights},
    sync::{NameHash, Programmed, Purge, Shares, SyncReport, Syncer, UpsertError},
};

impl<S: MapStore> Syncer<S> {
    /// Adds `frontend`, or brings it to what it should be, under `name`,
    /// in the order the module doc gives: nothing is written when it is
    /// unchanged or would not fit (checked before any write); else the
    /// reverse-NAT entry, the new sets' backends
    /// ([`acquire_sets`](Self::acquire_sets)), what slot 0 announces and
    /// the slots ([`write_new`](Self::write_new)), and only then what the
    /// old frontend used and the new one does not
    /// ([`delete_unused`](Self::delete_unused),
    /// [`release_old`](Self::release_old)).
    pub(super) fn upsert(
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
        let service_id = self.service_id(old.as_ref())?;
        if old.as_ref().is_none_or(|o| o.name != wanted.name) {
            self.store
                .put_revnat(service_id, revnat_value(addr, name))?;
            report.writes += 1;
        }
        let old_entries = old.as_ref().map_or(0, Programmed::entries);
        let new_entries = wanted.entries();
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

    /// The service id of the frontend programmed as `old`, or a new one.
    fn service_id(&mut self, old: Option<&Programmed>) -> Result<u32, UpsertError> {
        match old {
            Some(old) => Ok(old.service_id),
            None => self.allocate_service_id().ok_or_else(|| {
                UpsertError::Capacity(format!(
                    "service id space full ({} service ports, --max-services)",
                    self.caps.services
                ))
            }),
        }
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
        // The IPv4 maps' messages name no family.
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
            let table = self.programmed_table(addr, new);
            self.store.put_maglev(new.service_id, &table)?;
            self.maglev_watch.wrote(*addr, new.service_id, &table);
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
            self.maglev_watch.deleted(addr);
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

    /// The Maglev table of programmed frontend `addr`: over its external
    /// set when it has one (the set traffic from outside hashes over), else
    /// its slots.
    pub(super) fn programmed_table(&self, addr: &FrontendAddr, p: &Programmed) -> Box<MaglevTable> {
        let (set, shares) = match &p.external {
            Some(external) => (&**external, p.shares(scope::EXTERNAL)),
            None => (&*p.slots, p.shares(scope::INTERNAL)),
        };
        self.maglev_table(set, shares, addr.protocol)
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

/// Sorted, deduplicated.
fn sorted_set(backends: &[BackendAddr]) -> Vec<BackendAddr> {
    let mut set = backends.to_vec();
    set.sort();
    set.dedup();
    set
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
