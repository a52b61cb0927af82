//! Drift: what the maps hold against what this sync wrote there, and the
//! writes that put it back.
//!
//! The sync remembers every frontend it programmed (its service id, slot
//! layout, backend ids, shares, source ranges) and every backend entry, so
//! it can say, entry by entry, what the frontend, backend, reverse-NAT and
//! source-range maps must hold ([`Expected`]). Someone with `bpftool` (or a
//! bug) may change them behind its back; [`Syncer::heal`] finds that and
//! writes back only the entries that differ, in the sync's own order (a
//! backend before the slot naming it, the slots before their slot 0, slot 0
//! of an unknown set deleted before its slots), keeping every service id
//! and backend id: the flows the connection-tracking table holds keep
//! their reverse NAT, and nothing there is flushed.
//!
//! The check is made to be cheap when nothing drifted, which is nearly
//! always: both sides are folded into an order-free digest (a sum of one
//! 64-bit hash per entry) and the per-entry comparison ([`diff`]) runs only
//! when the digests or the counts differ. The Maglev tables, 16k entries
//! per hashed frontend, are compared a bounded number per check
//! ([`maglev`]).
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use proxy_common::{frontend_flags, scope, FrontendSlot};
use tracing::warn;

use crate::model::{cidr::IpCidr, DesiredState, IpFamily};
use crate::sync::encode::{
    backend_addr, backend_value, frontend_addr, revnat_name, revnat_value, scoped_key, AnyBackend,
    AnyFrontendKey, AnyRevNat,
};
use crate::sync::store::{Dump, MapStore, WriteError};
use crate::sync::{NameHash, Programmed, Syncer};

/// What the maps must hold, from the sync's memory of its writes.
#[derive(Clone, Debug, Default)]
pub struct Expected {
    /// Frontends, backends, reverse-NAT entries and source ranges.
    pub maps: Dump,
    /// Service ids whose reverse-NAT value is not known here (the frontend
    /// is no longer desired, or under another name, until the next sync):
    /// their entries are compared by presence only.
    pub revnat_unknown: HashSet<(IpFamily, u32)>,
}

/// One difference found, for the log and the status file.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// `frontends`, `backends`, `revnat` or `source-ranges`.
    pub map: &'static str,
    /// What was wrong, e.g. `10.96.0.10:53/UDP slot 0: missing`.
    pub what: String,
}

/// The writes that bring the maps back to [`Expected`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapRepairs {
    pub put_backends: Vec<(u32, AnyBackend)>,
    pub put_revnat: Vec<(u32, AnyRevNat)>,
    pub put_ranges: Vec<(u32, IpCidr)>,
    /// Slots past 0 first, then slot 0 of external sets, then of internal
    /// ones (see [`apply`]).
    pub put_frontends: Vec<(AnyFrontendKey, FrontendSlot)>,
    /// Slot 0 first (the set stops matching before its slots go).
    pub delete_frontends: Vec<AnyFrontendKey>,
    pub delete_backends: Vec<(u32, IpFamily)>,
    pub delete_revnat: Vec<(u32, IpFamily)>,
    pub delete_ranges: Vec<(u32, IpCidr)>,
    /// A reverse-NAT entry is missing whose value is not known here: the
    /// sync must compare its frontends again.
    pub resync: bool,
    pub findings: Vec<Finding>,
}

impl MapRepairs {
    pub fn is_empty(&self) -> bool {
        self.findings.is_empty()
    }

    /// Map writes these repairs make.
    pub fn writes(&self) -> usize {
        self.put_backends.len()
            + self.put_revnat.len()
            + self.put_ranges.len()
            + self.put_frontends.len()
            + self.delete_frontends.len()
            + self.delete_backends.len()
            + self.delete_revnat.len()
            + self.delete_ranges.len()
    }
}

/// What one [`Syncer::heal`] found and did.
#[derive(Clone, Debug, Default)]
pub struct HealReport {
    /// Entries compared (both sides).
    pub entries: usize,
    /// The digests matched: nothing was compared entry by entry.
    pub clean: bool,
    /// What was wrong, sorted.
    pub findings: Vec<Finding>,
    /// Map writes made.
    pub writes: usize,
    /// A write failed: the sync reloaded its view from the maps and
    /// compares every frontend at the next sync.
    pub failed: Option<String>,
}

impl<S: MapStore> Syncer<S> {
    /// What the maps must hold after the syncs so far. `desired` gives
    /// the reverse-NAT names (the sync keeps only their hash).
    pub fn expected(&self, desired: &DesiredState) -> Expected {
        let mut expected = Expected::default();
        let maps = &mut expected.maps;
        for (addr, p) in &self.programmed {
            push_set(maps, addr, scope::INTERNAL, p, &p.slots);
            if let Some(external) = &p.external {
                push_set(maps, addr, scope::EXTERNAL, p, external);
            }
            maps.source_ranges
                .extend(p.ranges.iter().map(|b| (p.service_id, *b)));
            let name = desired
                .frontends
                .get(addr)
                .map(|f| f.service.to_string())
                .filter(|name| NameHash::of(name) == p.name);
            match name {
                Some(name) => maps.revnat.push((p.service_id, revnat_value(addr, &name))),
                None => {
                    expected
                        .revnat_unknown
                        .insert((addr.family(), p.service_id));
                }
            }
        }
        maps.backends.extend(
            self.backends
                .all()
                .map(|(id, b, proto)| (id, backend_value(b, proto))),
        );
        expected
    }

    /// Compares the maps with what this sync wrote and writes back what
    /// differs (see the module comment). A failed write leaves the sync
    /// believing the maps, as a failed sync does.
    pub fn heal(&mut self, desired: &DesiredState) -> HealReport {
        let expected = self.expected(desired);
        let actual = self.store.dump();
        let mut report = HealReport {
            entries: entries(&expected.maps) + entries(&actual),
            ..HealReport::default()
        };
        if Digest::of(&expected.maps, &expected.revnat_unknown)
            == Digest::of(&actual, &expected.revnat_unknown)
            && revnat_present(&expected, &actual)
        {
            report.clean = true;
            return report;
        }
        let repairs = diff(&expected, &actual);
        report.findings.clone_from(&repairs.findings);
        match apply(&mut self.store, &repairs) {
            Ok(writes) => report.writes = writes,
            Err(error) => {
                warn!(%error, "writing back a drifted map entry failed; the maps are read again");
                report.failed = Some(error.to_string());
                self.reload();
                self.needs_full = true;
            }
        }
        if repairs.resync {
            self.needs_full = true;
        }
        report
    }
}

/// Slot 0 and slots `1..` of one backend set, as [`Syncer::write_set`]
/// writes them.
fn push_set(
    maps: &mut Dump,
    addr: &crate::model::FrontendAddr,
    set: u8,
    p: &Programmed,
    ids: &[u32],
) {
    let shares = p.shares(set);
    let share = |i: usize| shares.and_then(|s| s.get(i)).copied().unwrap_or(0);
    for (i, id) in ids.iter().enumerate() {
        maps.frontends.push((
            scoped_key(addr, set, i as u16 + 1),
            FrontendSlot {
                backend_id: *id,
                service_id: p.service_id,
                backend_count: share(i),
                ..FrontendSlot::default()
            },
        ));
    }
    let (count, flags) = match shares {
        Some(s) => (
            s.iter().filter(|x| **x > 0).count(),
            p.flags | frontend_flags::WEIGHTED,
        ),
        None => (ids.len(), p.flags),
    };
    maps.frontends.push((
        scoped_key(addr, set, 0),
        FrontendSlot {
            backend_id: 0,
            service_id: p.service_id,
            backend_count: count as u16,
            flags,
            affinity_timeout_s: p.affinity_timeout_s,
        },
    ));
}

fn entries(d: &Dump) -> usize {
    d.frontends.len() + d.backends.len() + d.revnat.len() + d.source_ranges.len()
}

/// Whether every reverse-NAT entry of unknown value is there.
fn revnat_present(expected: &Expected, actual: &Dump) -> bool {
    if expected.revnat_unknown.is_empty() {
        return true;
    }
    let present: HashSet<(IpFamily, u32)> = actual
        .revnat
        .iter()
        .map(|(id, r)| (r.family(), *id))
        .collect();
    expected.revnat_unknown.is_subset(&present)
}

/// An order-free summary of a [`Dump`]: per map, the count and the sum of
/// one hash per entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Digest {
    counts: [usize; 4],
    sums: [u64; 4],
}

impl Digest {
    /// `skip_revnat`: reverse-NAT entries left out of the summary.
    fn of(d: &Dump, skip_revnat: &HashSet<(IpFamily, u32)>) -> Digest {
        let mut digest = Digest::default();
        let mut add = |map: usize, h: u64| {
            digest.counts[map] += 1;
            digest.sums[map] = digest.sums[map].wrapping_add(h);
        };
        for (k, v) in &d.frontends {
            add(0, entry_hash(&(key_bytes(k), bytemuck::bytes_of(v))));
        }
        for (id, b) in &d.backends {
            add(1, entry_hash(&(id, backend_bytes(b))));
        }
        for (id, r) in &d.revnat {
            if !skip_revnat.contains(&(r.family(), *id)) {
                add(2, entry_hash(&(id, revnat_bytes(r))));
            }
        }
        for (id, block) in &d.source_ranges {
            add(3, entry_hash(&(id, block)));
        }
        digest
    }
}

/// A 64-bit hash of one entry (FxHash's step per word, then a
/// splitmix64 finish so that sums of hashes do not cancel).
fn entry_hash(entry: &impl Hash) -> u64 {
    let mut h = Mix(0);
    entry.hash(&mut h);
    let mut z = h.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

struct Mix(u64);

impl Hasher for Mix {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(word))
                .wrapping_mul(0x51_7C_C1_B7_27_22_0A_95);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

fn key_bytes(k: &AnyFrontendKey) -> (u8, &[u8]) {
    match k {
        AnyFrontendKey::V4(k) => (4, bytemuck::bytes_of(k)),
        AnyFrontendKey::V6(k) => (6, bytemuck::bytes_of(k)),
    }
}

fn backend_bytes(b: &AnyBackend) -> (u8, &[u8]) {
    match b {
        AnyBackend::V4(b) => (4, bytemuck::bytes_of(b)),
        AnyBackend::V6(b) => (6, bytemuck::bytes_of(b)),
    }
}

fn revnat_bytes(r: &AnyRevNat) -> (u8, &[u8]) {
    match r {
        AnyRevNat::V4(r) => (4, bytemuck::bytes_of(r)),
        AnyRevNat::V6(r) => (6, bytemuck::bytes_of(r)),
    }
}

/// The writes from `actual` to `expected`, with what each one mends.
/// Pure: the unit tests drive it with hand-made dumps.
pub fn diff(expected: &Expected, actual: &Dump) -> MapRepairs {
    let mut r = MapRepairs::default();
    diff_frontends(&expected.maps, actual, &mut r);
    diff_backends(&expected.maps, actual, &mut r);
    diff_revnat(expected, actual, &mut r);
    diff_ranges(&expected.maps, actual, &mut r);
    order(&mut r);
    r.findings.sort();
    r
}

fn frontend_name(k: &AnyFrontendKey) -> String {
    let set = if k.scope() == scope::EXTERNAL {
        "external "
    } else {
        ""
    };
    let addr = frontend_addr(k).map_or_else(|| format!("{k:?}"), |a| a.to_string());
    format!("{addr} {set}slot {}", k.slot())
}

fn slot_text(v: &FrontendSlot) -> String {
    format!(
        "backend {} service {} count {} flags {:#06x} affinity {}",
        v.backend_id, v.service_id, v.backend_count, v.flags, v.affinity_timeout_s
    )
}

fn diff_frontends(expected: &Dump, actual: &Dump, r: &mut MapRepairs) {
    let have: HashMap<AnyFrontendKey, FrontendSlot> = actual.frontends.iter().copied().collect();
    let want: HashSet<AnyFrontendKey> = expected.frontends.iter().map(|(k, _)| *k).collect();
    for (k, v) in &expected.frontends {
        let what = match have.get(k) {
            Some(h) if h == v => continue,
            Some(h) => format!("holds {}, expected {}", slot_text(h), slot_text(v)),
            None => "missing".to_owned(),
        };
        r.put_frontends.push((*k, *v));
        r.findings.push(Finding {
            map: "frontends",
            what: format!("{}: {what}", frontend_name(k)),
        });
    }
    for (k, _) in actual.frontends.iter().filter(|(k, _)| !want.contains(k)) {
        r.delete_frontends.push(*k);
        r.findings.push(Finding {
            map: "frontends",
            what: format!(
                "{}: left over (no frontend the agent programmed has it)",
                frontend_name(k)
            ),
        });
    }
}

fn diff_backends(expected: &Dump, actual: &Dump, r: &mut MapRepairs) {
    let have: HashMap<(IpFamily, u32), AnyBackend> = actual
        .backends
        .iter()
        .map(|(id, b)| ((b.family(), *id), *b))
        .collect();
    let want: HashSet<(IpFamily, u32)> = expected
        .backends
        .iter()
        .map(|(id, b)| (b.family(), *id))
        .collect();
    for (id, b) in &expected.backends {
        let what = match have.get(&(b.family(), *id)) {
            Some(h) if h == b => continue,
            Some(h) => format!("holds {}, expected {}", backend_addr(h), backend_addr(b)),
            None => format!("missing (expected {})", backend_addr(b)),
        };
        r.put_backends.push((*id, *b));
        r.findings.push(Finding {
            map: "backends",
            what: format!("{} backend id {id}: {what}", b.family()),
        });
    }
    for (id, b) in actual
        .backends
        .iter()
        .filter(|(id, b)| !want.contains(&(b.family(), *id)))
    {
        r.delete_backends.push((*id, b.family()));
        r.findings.push(Finding {
            map: "backends",
            what: format!(
                "{} backend id {id} ({}): left over (no frontend the agent programmed has it)",
                b.family(),
                backend_addr(b)
            ),
        });
    }
}

fn diff_revnat(expected: &Expected, actual: &Dump, r: &mut MapRepairs) {
    let have: HashMap<(IpFamily, u32), AnyRevNat> = actual
        .revnat
        .iter()
        .map(|(id, v)| ((v.family(), *id), *v))
        .collect();
    let want: HashSet<(IpFamily, u32)> = expected
        .maps
        .revnat
        .iter()
        .map(|(id, v)| (v.family(), *id))
        .chain(expected.revnat_unknown.iter().copied())
        .collect();
    for (id, v) in &expected.maps.revnat {
        let what = match have.get(&(v.family(), *id)) {
            Some(h) if h == v => continue,
            Some(h) => format!("says {:?}, expected {:?}", revnat_name(h), revnat_name(v)),
            None => format!("missing (expected {:?})", revnat_name(v)),
        };
        r.put_revnat.push((*id, *v));
        r.findings.push(Finding {
            map: "revnat",
            what: format!("{} service id {id}: {what}", v.family()),
        });
    }
    for (family, id) in &expected.revnat_unknown {
        if !have.contains_key(&(*family, *id)) {
            r.resync = true;
            r.findings.push(Finding {
                map: "revnat",
                what: format!("{family} service id {id}: missing"),
            });
        }
    }
    for (id, v) in actual
        .revnat
        .iter()
        .filter(|(id, v)| !want.contains(&(v.family(), *id)))
    {
        r.delete_revnat.push((*id, v.family()));
        r.findings.push(Finding {
            map: "revnat",
            what: format!(
                "{} service id {id} ({:?}): left over (no frontend the agent programmed has it)",
                v.family(),
                revnat_name(v)
            ),
        });
    }
}

fn diff_ranges(expected: &Dump, actual: &Dump, r: &mut MapRepairs) {
    let have: HashSet<(u32, IpCidr)> = actual.source_ranges.iter().copied().collect();
    let want: HashSet<(u32, IpCidr)> = expected.source_ranges.iter().copied().collect();
    for (id, block) in expected.source_ranges.iter().filter(|e| !have.contains(e)) {
        r.put_ranges.push((*id, *block));
        r.findings.push(Finding {
            map: "source-ranges",
            what: format!("service id {id} block {block}: missing"),
        });
    }
    for (id, block) in actual.source_ranges.iter().filter(|e| !want.contains(e)) {
        r.delete_ranges.push((*id, *block));
        r.findings.push(Finding {
            map: "source-ranges",
            what: format!("service id {id} block {block}: left over (no frontend the agent programmed has it)"),
        });
    }
}

/// Puts: slots past 0 before slot 0, the external set's slot 0 before the
/// internal one (which announces it). Deletes: the internal slot 0 first.
fn order(r: &mut MapRepairs) {
    let put_rank = |k: &AnyFrontendKey| match (k.slot(), k.scope()) {
        (0, scope::INTERNAL) => 2,
        (0, _) => 1,
        _ => 0,
    };
    r.put_frontends.sort_by_key(|(k, _)| put_rank(k));
    r.delete_frontends.sort_by_key(|k| 2 - put_rank(k));
}

/// Makes the writes of `repairs` in their order; returns how many.
pub fn apply<S: MapStore>(store: &mut S, repairs: &MapRepairs) -> Result<usize, WriteError> {
    for (id, b) in &repairs.put_backends {
        store.put_backend(*id, *b)?;
    }
    for (id, v) in &repairs.put_revnat {
        store.put_revnat(*id, *v)?;
    }
    for (id, block) in &repairs.put_ranges {
        store.put_source_range(*id, *block)?;
    }
    for (k, v) in &repairs.put_frontends {
        store.put_frontend(*k, *v)?;
    }
    for k in &repairs.delete_frontends {
        store.delete_frontend(*k)?;
    }
    for (id, family) in &repairs.delete_backends {
        store.delete_backend(*id, *family)?;
    }
    for (id, family) in &repairs.delete_revnat {
        store.delete_revnat(*id, *family)?;
    }
    for (id, block) in &repairs.delete_ranges {
        store.delete_source_range(*id, *block)?;
    }
    Ok(repairs.writes())
}

pub mod maglev;
#[cfg(test)]
mod tests;
