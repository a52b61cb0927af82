//! Drift in the Maglev tables (`SB_MAGLEV_V1`, one table of
//! [`capacity::MAGLEV_TABLE`] backend ids per hashed frontend, by service
//! id, shared by both families): a table missing, entries that differ from
//! the table the sync computes for the frontend's set, and tables no hashed
//! frontend has.
//!
//! A table is 64 KiB, and computing one takes a fraction of a millisecond:
//! at 100k hashed frontends, comparing every table on every check would
//! cost seconds. So the sync keeps a 64-bit digest of each table it writes
//! ([`Watch`]), and each check reads and digests at most
//! [`MaglevBudget::tables`] tables, going on where the last check stopped:
//! every table is compared within `ceil(tables / budget)` checks. Only a
//! table whose digest is not the one written is computed again and
//! compared entry by entry, at most [`MaglevBudget::computed`] per check
//! (the rotation stops there and goes on at the next check): a table the
//! sync adopted from an earlier agent has no digest yet and is computed at
//! its first look. A table that differs is written whole (one map update:
//! a lookup sees the old table or the new), with the same backend ids, so
//! flows keep their backends. The walk over the map's own keys, for tables
//! no frontend has, goes on the same way, [`MaglevBudget::tables`] keys
//! per check.
//!
//! `switchboard verify` compares every table at once
//! ([`Syncer::maglev_problems`]), with the same comparison.
use std::collections::{BTreeMap, HashSet};
use std::ops::Bound;

use proxy_common::{capacity, frontend_flags, MaglevTable};
use tracing::warn;

use super::{entry_hash, Finding, HealReport};
use crate::model::FrontendAddr;
use crate::sync::store::MapStore;
use crate::sync::Syncer;

/// What the drift check knows of the Maglev tables written.
#[derive(Debug, Default)]
pub struct Watch {
    /// Every hashed frontend programmed, with its table.
    tables: BTreeMap<FrontendAddr, Table>,
    /// The frontend the rotation goes on after (`None`: from the first).
    after: Option<FrontendAddr>,
    /// The service id the walk of the map's keys goes on after.
    walk: Option<u32>,
}

/// A hashed frontend's table.
#[derive(Clone, Copy, Debug)]
struct Table {
    service_id: u32,
    /// Its digest as written (`None`: adopted from the maps, digested at
    /// its first look).
    digest: Option<u64>,
}

impl Watch {
    /// The sync wrote `table` for `addr` (service `service_id`).
    pub fn wrote(&mut self, addr: FrontendAddr, service_id: u32, table: &MaglevTable) {
        let digest = Some(digest(table));
        self.tables.insert(addr, Table { service_id, digest });
    }

    /// The sync adopted hashed frontend `addr` from the maps.
    pub fn adopted(&mut self, addr: FrontendAddr, service_id: u32) {
        let digest = None;
        self.tables.insert(addr, Table { service_id, digest });
    }

    /// `addr` has no table any more (removed, or no longer hashed).
    pub fn deleted(&mut self, addr: &FrontendAddr) {
        self.tables.remove(addr);
    }

    /// The sync reloads its view from the maps (and adopts again).
    pub fn forget(&mut self) {
        self.tables.clear();
    }
}

/// A digest of a table's entries: four independent lanes over pairs of
/// entries (a multiply's latency is not on one chain), each step a
/// bijection of the lane for a given word, so a single changed entry
/// always changes the digest; the lanes folded with
/// [`entry_hash`]'s finish.
pub fn digest(table: &MaglevTable) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut lanes = [K, K ^ 1, K ^ 2, K ^ 3];
    let mut words = table.backend_ids.chunks_exact(8);
    for chunk in &mut words {
        for (lane, pair) in lanes.iter_mut().zip(chunk.chunks_exact(2)) {
            let word = u64::from(pair[0]) | (u64::from(pair[1]) << 32);
            *lane = (*lane ^ word).wrapping_mul(K).rotate_left(29);
        }
    }
    for (i, id) in words.remainder().iter().enumerate() {
        lanes[i % 4] = (lanes[i % 4] ^ u64::from(*id))
            .wrapping_mul(K)
            .rotate_left(29);
    }
    entry_hash(&lanes)
}

/// Whether a frontend has a table (Maglev or source hash).
pub fn hashed(flags: u16) -> bool {
    flags & frontend_flags::ALGO_MASK != frontend_flags::ALGO_RANDOM
}

/// A zeroed table on the heap.
fn empty_table() -> Box<MaglevTable> {
    Box::new(MaglevTable {
        backend_ids: [0; capacity::MAGLEV_TABLE as usize],
    })
}

/// What one table holds against what it must hold: `None` when they agree.
/// Pure: the unit tests give it tables.
pub fn table_drift(held: Option<&MaglevTable>, expected: &MaglevTable) -> Option<String> {
    let Some(held) = held else {
        return Some("missing".to_owned());
    };
    let mut differing = held
        .backend_ids
        .iter()
        .zip(&expected.backend_ids)
        .enumerate()
        .filter(|(_, (h, e))| h != e);
    let (first, (h, e)) = differing.next()?;
    Some(format!(
        "{} of {} entries differ (entry {first}: backend id {h}, expected {e})",
        differing.count() + 1,
        capacity::MAGLEV_TABLE
    ))
}

/// How much one step of the check may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaglevBudget {
    /// Tables read and digested (and keys of the map walked).
    pub tables: usize,
    /// Tables computed again (a digest that differs, or none yet).
    pub computed: usize,
}

/// What the agent's check does per look: every table is compared within
/// `ceil(tables / 2048)` looks (within one look up to 2048 hashed
/// frontends), and at most 64 tables are computed again per look (the
/// first rotation after a restart computes each adopted table once).
/// What it costs is measured by `heal_cost` in the tests.
pub const PER_CHECK: MaglevBudget = MaglevBudget {
    tables: 2048,
    computed: 64,
};

/// One table found to differ, and what it must hold.
struct Drifted {
    service_id: u32,
    what: String,
    expected: Box<MaglevTable>,
}

/// What one look at a table found.
enum Look {
    /// Its digest is the one written.
    Right,
    /// Computed again: right (its digest is known now), or what differs.
    Computed(Option<Drifted>),
    /// It must be computed again, and this look may not.
    NeedsComputing,
}

impl<S: MapStore> Syncer<S> {
    /// Compares `addr`'s table with what it must hold (`buf`: room to read
    /// it into). A table whose digest is the one written is taken as right
    /// without computing it again; one the sync adopted is computed and
    /// digested here, when `may_compute`.
    fn look_at_table(
        &mut self,
        addr: &FrontendAddr,
        buf: &mut MaglevTable,
        may_compute: bool,
    ) -> std::io::Result<Look> {
        let (Some(p), Some(table)) = (
            self.programmed.get(addr),
            self.maglev_watch.tables.get(addr).copied(),
        ) else {
            return Ok(Look::Right);
        };
        let service_id = p.service_id;
        let present = self.store.maglev(service_id, buf)?;
        if present && table.digest == Some(digest(buf)) {
            return Ok(Look::Right);
        }
        if !may_compute {
            return Ok(Look::NeedsComputing);
        }
        let expected = self.programmed_table(addr, p);
        let Some(what) = table_drift(present.then_some(&*buf), &expected) else {
            // Adopted: right, and known now.
            self.maglev_watch.wrote(*addr, service_id, &expected);
            return Ok(Look::Computed(None));
        };
        Ok(Look::Computed(Some(Drifted {
            service_id,
            what: format!("{addr} (service id {service_id}): {what}"),
            expected,
        })))
    }

    /// Up to `budget` hashed frontends, going on after the last check's.
    fn next_hashed(&self, budget: usize) -> Vec<FrontendAddr> {
        let tables = &self.maglev_watch.tables;
        let after = self.maglev_watch.after;
        let tail = match after {
            Some(a) => tables.range((Bound::Excluded(a), Bound::Unbounded)),
            None => tables.range(..),
        };
        let head = after.map(|a| tables.range(..=a)).into_iter().flatten();
        tail.chain(head)
            .map(|(addr, _)| *addr)
            .take(budget)
            .collect()
    }

    /// The service ids of every hashed frontend.
    fn hashed_ids(&self) -> HashSet<u32> {
        self.maglev_watch
            .tables
            .values()
            .map(|t| t.service_id)
            .collect()
    }

    /// One step of the Maglev check (see the module comment), within
    /// `budget`: what differs is written back, tables no hashed frontend
    /// has are deleted. A failed write is reported and tried again at the
    /// next look at that table.
    pub fn heal_maglev(&mut self, budget: MaglevBudget) -> HealReport {
        let mut report = HealReport::default();
        let mut buf = empty_table();
        let mut computed = 0;
        for addr in self.next_hashed(budget.tables) {
            let may_compute = computed < budget.computed;
            let drifted = match self.look_at_table(&addr, &mut buf, may_compute) {
                Ok(Look::Right) => None,
                Ok(Look::Computed(drifted)) => {
                    computed += 1;
                    drifted
                }
                // The computing budget is spent: the next step starts here.
                Ok(Look::NeedsComputing) => break,
                Err(error) => {
                    report.failed = Some(format!("reading the Maglev table of {addr}: {error}"));
                    None
                }
            };
            self.maglev_watch.after = Some(addr);
            report.entries += 1;
            let Some(d) = drifted else { continue };
            match self.store.put_maglev(d.service_id, &d.expected) {
                Ok(()) => {
                    self.maglev_watch.wrote(addr, d.service_id, &d.expected);
                    report.writes += 1;
                }
                Err(error) => {
                    warn!(%error, frontend = %addr, "writing back a drifted Maglev table failed");
                    report.failed = Some(error.to_string());
                }
            }
            report.findings.push(Finding {
                map: "maglev",
                what: d.what,
            });
        }
        match self.store.maglev_ids(self.maglev_watch.walk, budget.tables) {
            Ok(ids) => {
                self.maglev_watch.walk = match ids.len() < budget.tables {
                    true => None,
                    false => ids.last().copied(),
                };
                if !ids.is_empty() {
                    let wanted = self.hashed_ids();
                    for id in ids.into_iter().filter(|id| !wanted.contains(id)) {
                        match self.store.delete_maglev(id) {
                            Ok(()) => report.writes += 1,
                            Err(error) => report.failed = Some(error.to_string()),
                        }
                        report.findings.push(Finding {
                            map: "maglev",
                            what: leftover(id),
                        });
                    }
                }
            }
            Err(error) => report.failed = Some(format!("walking the Maglev tables: {error}")),
        }
        report.findings.sort();
        report.clean = report.findings.is_empty();
        report
    }

    /// Every table compared at once, nothing written (`switchboard
    /// verify`): what differs, by frontend (`None`: a table no hashed
    /// frontend has). Digests learnt on the way are kept.
    pub fn maglev_problems(&mut self) -> Vec<(Option<FrontendAddr>, String)> {
        let mut problems = Vec::new();
        let mut buf = empty_table();
        let hashed: Vec<FrontendAddr> = self.maglev_watch.tables.keys().copied().collect();
        for addr in hashed {
            match self.look_at_table(&addr, &mut buf, true) {
                Ok(Look::Computed(Some(d))) => problems.push((Some(addr), d.what)),
                Ok(_) => {}
                Err(error) => problems.push((
                    Some(addr),
                    format!("its Maglev table could not be read: {error}"),
                )),
            }
        }
        let wanted = self.hashed_ids();
        let mut after = None;
        // Bounded: more keys than any map holds (a walk whose key was
        // deleted under it starts again from the first).
        for _ in 0..WALK_CHUNKS {
            match self.store.maglev_ids(after, WALK_CHUNK) {
                Ok(ids) => {
                    let last = ids.last().copied();
                    let done = ids.len() < WALK_CHUNK;
                    problems.extend(
                        ids.into_iter()
                            .filter(|id| !wanted.contains(id))
                            .map(|id| (None, leftover(id))),
                    );
                    if done {
                        break;
                    }
                    after = last;
                }
                Err(error) => {
                    problems.push((None, format!("walking the Maglev tables: {error}")));
                    break;
                }
            }
        }
        problems
    }
}

/// Keys per call of `verify`'s walk, and calls at most.
const WALK_CHUNK: usize = 4096;
const WALK_CHUNKS: usize = 1024;

fn leftover(service_id: u32) -> String {
    format!(
        "service id {service_id}: table left over (no hashed frontend the agent programmed has it)"
    )
}
