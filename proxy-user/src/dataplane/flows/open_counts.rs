//! Least-connection's open-flow counts (`SB_LC_V1`, a `u64` per backend
//! id): what the agent does with them.
//!
//! The data path keeps them: a new flow of a least-connection frontend is
//! counted and marked [`ct_flags::COUNTED`] in its forward entry, and its
//! first FIN or RST (or its removal to make room, or its replacement when
//! its backend left) clears the mark and takes it off, with atomic
//! instructions. Entries the connection-tracking collector removes are the
//! agent's to take off: the collector tallies, per backend, the counted
//! flows it removed and the counted flows still open, and [`settle`]
//! applies both after each pass:
//!
//! - the removed flows are subtracted (never below zero);
//! - the count is compared with the flows still open: the difference is
//!   the drift, reported as `switchboard_least_conn_drift`. A difference
//!   seen in two passes in a row with the same sign is corrected by the
//!   smaller of the two (a flow that opened or closed while the table was
//!   read shows once, a leak shows every time), and at the first pass
//!   after a start it is corrected at once: the map is not pinned, so an
//!   agent that starts, restarts or resizes the table rebuilds the counts
//!   of the flows it adopts from the table.
//!
//! Sockets the socket layer connected to a least-connection frontend count
//! too: the data path adds each at `connect()` and remembers its backend by
//! socket cookie (`SB_LC_SOCK_V1`), and `sock_release` takes it off; the
//! agent counts the remembered ones among the open flows.
//!
//! The agent writes a count with a lookup and an update, not an atomic
//! add: a flow the data path counts between the two is lost, and found
//! again as drift by a later pass.
use std::{
    borrow::{Borrow, BorrowMut},
    collections::BTreeMap,
};

use aya::maps::{HashMap, MapData};
use prometheus_client::{
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};
use proxy_common::{ct_dir, ct_flags, names};

use crate::dataplane::flows::entry::{Entry, Key};
use crate::dataplane::maps::{take_map, TakeError};

/// Per backend id: counted flows removed by a pass, and counted flows
/// still open after it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub removed: BTreeMap<u32, u64>,
    pub open: BTreeMap<u32, u64>,
}

impl Tally {
    /// Notes the entry under `key` as removed (`removed`) or kept; only
    /// counted forward entries matter.
    pub fn note<K: Key>(&mut self, key: &K, entry: &K::Entry, removed: bool) {
        if key.dir() != ct_dir::FORWARD || entry.flags() & ct_flags::COUNTED == 0 {
            return;
        }
        let tally = if removed {
            &mut self.removed
        } else {
            &mut self.open
        };
        *tally.entry(entry.backend_id()).or_default() += 1;
    }

    /// Notes the sockets of least-connection frontends (the socket layer's
    /// `SB_LC_SOCK_V1`: the backend id of each) as open flows.
    pub fn note_sockets(&mut self, backend_ids: impl IntoIterator<Item = u32>) {
        for id in backend_ids {
            *self.open.entry(id).or_default() += 1;
        }
    }

    /// Adds another family's tally.
    pub fn merge(&mut self, other: Tally) {
        for (id, n) in other.removed {
            *self.removed.entry(id).or_default() += n;
        }
        for (id, n) in other.open {
            *self.open.entry(id).or_default() += n;
        }
    }
}

/// The loaded object's least-connection maps, which are not pinned: the
/// counts by backend id (`SB_LC_V1`) and the counted sockets' backends by
/// cookie (`SB_LC_SOCK_V1`).
pub struct LeastConnMaps {
    pub counts: HashMap<MapData, u32, u64>,
    pub sockets: HashMap<MapData, u64, u32>,
}

impl LeastConnMaps {
    /// Takes both maps out of the loaded object.
    pub fn take(ebpf: &mut aya::Ebpf) -> Result<Self, TakeError> {
        Ok(Self {
            counts: take_map(ebpf, names::OPEN_FLOWS)?,
            sockets: take_map(ebpf, names::OPEN_SOCKETS)?,
        })
    }
}

/// The count map, as [`settle`] uses it (a trait so the logic is tested
/// on an in-memory map).
pub trait Counts {
    fn read_all(&self) -> std::io::Result<Vec<(u32, u64)>>;
    fn get(&self, backend_id: u32) -> Option<u64>;
    /// Writes a count; whether it was written.
    fn set(&mut self, backend_id: u32, count: u64) -> bool;
}

impl<T: Borrow<MapData> + BorrowMut<MapData>> Counts for HashMap<T, u32, u64> {
    fn read_all(&self) -> std::io::Result<Vec<(u32, u64)>> {
        self.iter()
            .map(|r| r.map_err(|e| std::io::Error::other(e.to_string())))
            .collect()
    }
    fn get(&self, backend_id: u32) -> Option<u64> {
        HashMap::get(self, &backend_id, 0).ok()
    }
    fn set(&mut self, backend_id: u32, count: u64) -> bool {
        self.insert(backend_id, count, 0).is_ok()
    }
}

/// A count as the data path reads it: a decrement caught mid-undo reads
/// as zero.
fn readable(count: u64) -> u64 {
    if count > i64::MAX as u64 {
        0
    } else {
        count
    }
}

/// What [`settle`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Sum over backends of |count − open flows|, after the removals.
    pub drift: u64,
    /// Flows added to or taken off counts to correct drift.
    pub corrected: u64,
}

/// Applies a pass's tally to the counts and reconciles them (see the
/// module's documentation). `last` holds each backend's drift of the
/// previous pass (`None`: the first pass, corrected at once).
pub fn settle(
    counts: &mut impl Counts,
    tally: &Tally,
    last: &mut Option<BTreeMap<u32, i64>>,
) -> std::io::Result<Settled> {
    for (&id, &n) in &tally.removed {
        if let Some(count) = counts.get(id) {
            counts.set(id, readable(count).saturating_sub(n));
        }
    }
    let mut ids: BTreeMap<u32, u64> = counts
        .read_all()?
        .into_iter()
        .map(|(id, n)| (id, readable(n)))
        .collect();
    for &id in tally.open.keys() {
        ids.entry(id).or_default();
    }
    let mut settled = Settled::default();
    let mut drifts = BTreeMap::new();
    for (id, count) in ids {
        let open = tally.open.get(&id).copied().unwrap_or(0);
        let drift = count as i64 - open as i64;
        if drift == 0 {
            continue;
        }
        settled.drift += drift.unsigned_abs();
        let correction = match last {
            None => drift,
            Some(last) => match last.get(&id) {
                Some(&before) if before.signum() == drift.signum() => {
                    drift.signum() * before.abs().min(drift.abs())
                }
                _ => 0,
            },
        };
        if correction != 0 && counts.set(id, (count as i64 - correction).max(0) as u64) {
            settled.corrected += correction.unsigned_abs();
            drifts.insert(id, drift - correction);
        } else {
            drifts.insert(id, drift);
        }
    }
    *last = Some(drifts);
    Ok(settled)
}

/// The series on `/metrics`. Clones share them.
#[derive(Clone, Debug, Default)]
pub struct OpenFlowMetrics {
    drift: Gauge,
    corrected: Counter,
}

impl OpenFlowMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "switchboard_least_conn_drift",
            "At the last check: the sum over backends of how far least-connection's open-flow count was from the counted flows in connection tracking",
            self.drift.clone(),
        );
        registry.register(
            "switchboard_least_conn_corrected",
            "Flows added to or taken off least-connection's open-flow counts to correct a drift seen twice in a row (or at start)",
            self.corrected.clone(),
        );
    }

    pub fn observe(&self, settled: &Settled) {
        self.drift.set(settled.drift as i64);
        self.corrected.inc_by(settled.corrected);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Mem(BTreeMap<u32, u64>);

    impl Counts for Mem {
        fn read_all(&self) -> std::io::Result<Vec<(u32, u64)>> {
            Ok(self.0.iter().map(|(k, v)| (*k, *v)).collect())
        }
        fn get(&self, id: u32) -> Option<u64> {
            self.0.get(&id).copied()
        }
        fn set(&mut self, id: u32, n: u64) -> bool {
            self.0.insert(id, n);
            true
        }
    }

    fn tally(removed: &[(u32, u64)], open: &[(u32, u64)]) -> Tally {
        Tally {
            removed: removed.iter().copied().collect(),
            open: open.iter().copied().collect(),
        }
    }

    #[test]
    fn the_first_pass_rebuilds_the_counts_of_adopted_flows() {
        let mut counts = Mem::default();
        let mut last = None;
        let s = settle(&mut counts, &tally(&[], &[(7, 20), (8, 1)]), &mut last).expect("settle");
        assert_eq!(
            s,
            Settled {
                drift: 21,
                corrected: 21
            }
        );
        assert_eq!(counts.0, [(7, 20), (8, 1)].into_iter().collect());
    }

    #[test]
    fn removals_come_off_and_never_below_zero() {
        let mut counts = Mem([(7, 5), (8, 1)].into_iter().collect());
        let mut last = Some(BTreeMap::new());
        let s =
            settle(&mut counts, &tally(&[(7, 2), (8, 3)], &[(7, 3)]), &mut last).expect("settle");
        assert_eq!(s, Settled::default());
        assert_eq!(counts.0, [(7, 3), (8, 0)].into_iter().collect());
        // A value caught mid-undo reads as zero.
        let mut counts = Mem([(9, u64::MAX)].into_iter().collect());
        settle(&mut counts, &tally(&[(9, 1)], &[]), &mut last).expect("settle");
        assert_eq!(counts.0[&9], 0);
    }

    #[test]
    fn drift_is_corrected_only_when_seen_twice_with_one_sign() {
        let mut last = Some(BTreeMap::new());
        // A leak of 4 (flows the count still holds but the table has not).
        let mut counts = Mem([(7, 10)].into_iter().collect());
        let open = tally(&[], &[(7, 6)]);
        let s = settle(&mut counts, &open, &mut last).expect("settle");
        assert_eq!((s.drift, s.corrected, counts.0[&7]), (4, 0, 10));
        // A flow opened while the table was read shows once, the other way.
        let s = settle(&mut counts, &tally(&[], &[(7, 11)]), &mut last).expect("settle");
        assert_eq!((s.drift, s.corrected, counts.0[&7]), (1, 0, 10));
        let s = settle(&mut counts, &open, &mut last).expect("settle");
        assert_eq!((s.drift, s.corrected), (4, 0));
        let s = settle(&mut counts, &open, &mut last).expect("settle");
        assert_eq!((s.drift, s.corrected, counts.0[&7]), (4, 4, 6));
        let s = settle(&mut counts, &open, &mut last).expect("settle");
        assert_eq!(s, Settled::default());
    }
}
