//! Adopting the maps: the sync's view of them rebuilt from what they hold
//! (a restarted agent adopts the pinned state instead of flushing it; a
//! write that failed half-way makes the maps the truth again), and every
//! entry no whole frontend uses removed.
use std::collections::{HashMap, HashSet};

use proxy_common::{capacity, frontend_flags, scope, FrontendSlot};
use tracing::warn;

use crate::{
    model::cidr::IpCidr,
    model::{FrontendAddr, IpFamily},
    sync::encode::{
        backend_addr, frontend_addr, revnat_name, AnyBackend, AnyFrontendKey, AnyRevNat,
    },
    sync::store::{Dump, MapStore, WriteError},
    sync::{NameHash, PerFamily, Programmed, Shares, Syncer},
};

impl<S: MapStore> Syncer<S> {
    /// Rebuilds the in-memory view from the maps and removes orphans:
    /// every whole frontend is adopted as the maps hold it (see
    /// [`adopt_frontend`](Self::adopt_frontend)), then every entry no
    /// adopted frontend uses is deleted. A frontend left half-written (by a
    /// crash, or a failed write) is not adopted; its entries go with the
    /// orphans, and the next apply writes it again.
    pub(super) fn reload(&mut self) {
        let dump = self.store.dump();
        self.programmed.clear();
        self.maglev_watch.forget();
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
        let external_ids = external.as_ref().map(|(ids, _)| ids);
        let ids = || internal.0.iter().chain(external_ids.into_iter().flatten());
        if ids().any(|id| self.held_by_other_family(*id, addr.family())) {
            warn!(frontend = %addr, "adopting maps: a backend id of this frontend is used by the other address family; the frontend is rewritten");
            return;
        }
        for (scope, set) in [
            (scope::INTERNAL, Some(&internal.0)),
            (scope::EXTERNAL, external_ids),
        ] {
            let Some(set) = set else { continue };
            for slot in 0..=set.len() as u16 {
                adopted.slots.insert(key.at(scope, slot));
            }
        }
        for id in ids() {
            adopted.backends.insert((*id, addr.family()));
            let backend = index.backends[&(addr.family(), *id)];
            self.backends
                .hold(*id, backend_addr(&backend), addr.protocol);
        }
        let programmed = index.programmed(&addr, head, internal, external);
        self.service_ids.insert(head.service_id);
        adopted
            .service_family
            .insert(head.service_id, addr.family());
        *self.frontend_entries.of(addr.family()) += programmed.entries();
        *self.range_entries.of(addr.family()) += programmed.ranges.len();
        if programmed.hashed() {
            self.maglev_watch.adopted(addr, programmed.service_id);
        }
        self.programmed.insert(addr, programmed);
    }

    /// Whether backend `id` is held by an adopted frontend of the other
    /// family than `family`.
    fn held_by_other_family(&self, id: u32, family: IpFamily) -> bool {
        self.backends
            .get(id)
            .is_some_and(|(b, _)| b.family() != family)
    }

    /// Deletes what no adopted frontend uses: the slots of frontends left
    /// out (every slot 0 first, in a fixed order, so a dropped frontend
    /// stops matching before its other slots go, as a removal does), unused
    /// backends, and the reverse-NAT entries and source blocks of service
    /// ids no frontend of their family has.
    fn remove_orphans(&mut self, dump: &Dump, index: &DumpIndex, adopted: &Adopted) {
        let mut orphans: Vec<AnyFrontendKey> = index
            .slots
            .keys()
            .filter(|k| !adopted.slots.contains(k))
            .copied()
            .collect();
        orphans.sort_by_key(|k| {
            (
                k.slot() != 0,
                k.ip(),
                k.port(),
                k.proto(),
                k.scope(),
                k.slot(),
            )
        });
        for key in orphans {
            log_write(self.store.delete_frontend(key));
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

fn log_write(result: Result<(), WriteError>) {
    if let Err(error) = result {
        warn!(%error, "removing an orphaned map entry failed");
    }
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
