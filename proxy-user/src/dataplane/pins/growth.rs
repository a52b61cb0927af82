//! The flow tables that start small and grow with their load.
//!
//! The kernel preallocates an LRU hash map whole: every entry it may hold
//! is paid for when it is created, used or not. The LRU tables whose use
//! depends on traffic ([`TABLES`]: the socket layer's translations, session
//! affinity and fragments, both families) therefore start at
//! `--flow-table-start-entries` and grow, up to their maximum (the
//! `--max-*` flag that sizes them, or the default where there is none).
//! The other hash maps are allocated per entry (`BPF_F_NO_PREALLOC`) at
//! their full size: their memory follows what they hold already.
//!
//! A table grows by the online resize ([`crate::dataplane::pins::resize`]): a
//! fresh map of the new size pinned beside the old one, every entry
//! copied, the programs replaced, the entries written meanwhile copied too,
//! the pin moved. That happens at an agent's start, so:
//!
//! - while it runs, [`watch`] counts each table's entries every [`CHECK`]
//!   (batched lookups, a few system calls per table), and when a table
//!   below its maximum is half full or more ([`due`]) the agent restarts
//!   in place. A pass's cost is bounded: the next one waits at least
//!   [`PACE`] times as long as the last took;
//! - at its start the agent sizes each table by [`wanted`]: its pinned size
//!   (never less than the start size), doubled while it is 3/8 full or
//!   more, never above its maximum; a pinned table with no entry goes back
//!   to the start size ([`plan`]). The start grows at a lower fill than the
//!   check restarts at, so that the restart a half-full table made grows
//!   it even if some of its entries went meanwhile: a fill that hovers
//!   about one half makes one restart, not one every check.
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use proxy_common::{capacity, names};
use tracing::{debug, warn};

use crate::{
    dataplane::{maps::batch, pins::Pins},
    sync::store::Capacities,
};

/// A table that starts small and grows.
#[derive(Clone, Copy, Debug)]
pub struct Table {
    pub map: &'static str,
    /// What sets its maximum.
    pub flag: &'static str,
    max: fn(&Capacities) -> u32,
}

impl Table {
    /// The most entries it may hold.
    pub fn max(&self, caps: &Capacities) -> u32 {
        (self.max)(caps).max(1)
    }

    /// The size it starts at: `--flow-table-start-entries`, at least
    /// `floor` ([`lru_floor`]), or its maximum when that is smaller.
    pub fn start(&self, caps: &Capacities, floor: u32) -> u32 {
        caps.flow_start.max(floor).clamp(1, self.max(caps))
    }
}

/// The kernel's LRU hash keeps up to this many free entries aside per CPU
/// (`LOCAL_FREE_TARGET` in kernel/bpf/bpf_lru_list.c), and evicts from the
/// shared list when that runs dry, even while other CPUs hold free ones.
const LRU_LOCAL_FREE: u32 = 128;

/// The smallest size an LRU table starts at on this machine: four times
/// [`LRU_LOCAL_FREE`] per possible CPU. A table that size evicts nothing
/// before it holds its size less what the CPUs keep aside, at least three
/// quarters of it: well past the half at which it grows ([`due`]).
pub fn lru_floor() -> u32 {
    let cpus = aya::util::nr_cpus().unwrap_or(1).max(1);
    u32::try_from(cpus)
        .unwrap_or(u32::MAX)
        .saturating_mul(4 * LRU_LOCAL_FREE)
}

/// What sizes the tables with no flag of their own.
const DEFAULT: &str = "the default";

/// The tables that start small and grow.
pub const TABLES: [Table; 7] = [
    Table {
        map: names::SOCKETS,
        flag: "--max-conntrack",
        max: |caps| caps.conntrack,
    },
    Table {
        map: names::SOCKETS6,
        flag: "--max-conntrack",
        max: |caps| caps.conntrack,
    },
    Table {
        map: names::AFFINITY,
        flag: DEFAULT,
        max: |_| capacity::AFFINITY,
    },
    Table {
        map: names::AFFINITY6,
        flag: DEFAULT,
        max: |_| capacity::AFFINITY,
    },
    Table {
        map: names::SOCK_AFFINITY,
        flag: DEFAULT,
        max: |_| capacity::AFFINITY,
    },
    Table {
        map: names::FRAGMENTS,
        flag: DEFAULT,
        max: |_| capacity::FRAGMENTS,
    },
    Table {
        map: names::FRAGMENTS6,
        flag: DEFAULT,
        max: |_| capacity::FRAGMENTS,
    },
];

/// Each of [`TABLES`] with the most it may hold.
pub fn limits(caps: &Capacities) -> Vec<(&'static str, u32)> {
    TABLES.iter().map(|t| (t.map, t.max(caps))).collect()
}

/// The size each of [`TABLES`] is loaded with, in that order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowSizes([u32; TABLES.len()]);

impl FlowSizes {
    /// Every table at its maximum (maps that are not pinned: the packet
    /// fixtures and the benchmarks).
    pub fn at_max(caps: &Capacities) -> Self {
        Self(TABLES.map(|t| t.max(caps)))
    }

    /// Every table at its start size (no smaller than `floor`).
    pub fn at_start(caps: &Capacities, floor: u32) -> Self {
        Self(TABLES.map(|t| t.start(caps, floor)))
    }

    /// The size of `map`, if it is one of [`TABLES`].
    pub fn get(&self, map: &str) -> Option<u32> {
        TABLES
            .iter()
            .position(|t| t.map == map)
            .map(|index| self.0[index])
    }

    /// Each table with its size.
    pub fn iter(&self) -> impl Iterator<Item = (&'static Table, u32)> + '_ {
        TABLES.iter().zip(self.0.iter().copied())
    }
}

/// The size a table is loaded with: `pinned` (its size, if it is pinned)
/// holding `entries`, given its start size and maximum. A pinned table
/// keeps its size, or the start size if that is larger; it doubles while
/// it is 3/8 full or more; it never exceeds `max`. A table with no entry
/// starts over at `start` (nothing is lost by shrinking it).
pub fn wanted(pinned: Option<u32>, entries: u64, start: u32, max: u32) -> u32 {
    let max = max.max(1);
    let start = start.clamp(1, max);
    let mut size = match pinned {
        Some(pinned) if entries > 0 => pinned.max(start),
        _ => start,
    };
    while size < max && entries.saturating_mul(8) >= u64::from(size).saturating_mul(3) {
        size = size.saturating_mul(2);
    }
    size.min(max)
}

/// Whether a table of `size` entries holding `entries` must grow: it is
/// half full or more, and below `max`.
pub fn due(size: u32, entries: u64, max: u32) -> bool {
    size < max && entries.saturating_mul(2) >= u64::from(size)
}

/// A table grown at a start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Growth {
    pub map: &'static str,
    pub from: u32,
    pub to: u32,
    /// The entries it held when it was sized.
    pub entries: u64,
}

/// A pinned table: its size and how many entries it holds.
#[derive(Clone, Copy, Debug)]
struct Pinned {
    size: u32,
    entries: u64,
}

/// The table `map` pinned under `pin_root`, if it is (and can be read:
/// one that cannot is said and left at its size).
fn pinned(pin_root: &Path, map: &'static str) -> Option<Result<Pinned, String>> {
    let data = Pins::new(pin_root).data(map).ok()?;
    let read = || {
        let size = data.info().map_err(|e| e.to_string())?.max_entries();
        let entries = batch::count(&data).map_err(|e| e.to_string())?;
        Ok(Pinned {
            size,
            entries: entries as u64,
        })
    };
    Some(read())
}

/// The sizes to load [`TABLES`] with under `pin_root` ([`wanted`] of what
/// is pinned there), and the tables that grow.
pub fn plan(pin_root: &Path, caps: &Capacities) -> (FlowSizes, Vec<Growth>) {
    let floor = lru_floor();
    let mut sizes = FlowSizes::at_start(caps, floor);
    let mut grown = Vec::new();
    for (index, table) in TABLES.iter().enumerate() {
        let (max, start) = (table.max(caps), table.start(caps, floor));
        sizes.0[index] = match pinned(pin_root, table.map) {
            None => start,
            Some(Err(error)) => {
                // Unread, so left as it is (capped by its flag).
                warn!(map = table.map, %error, "counting a pinned table's entries failed: its size stays");
                Pins::new(pin_root)
                    .data(table.map)
                    .ok()
                    .and_then(|d| d.info().ok())
                    .map_or(start, |info| info.max_entries().min(max))
            }
            Some(Ok(p)) => {
                let size = wanted(Some(p.size), p.entries, start, max);
                if size > p.size {
                    grown.push(Growth {
                        map: table.map,
                        from: p.size,
                        to: size,
                        entries: p.entries,
                    });
                }
                size
            }
        };
    }
    (sizes, grown)
}

/// Logged when a table is found due to grow while the agent runs.
pub const DUE: &str = "a flow table is half full: restarting in place to grow it online";

/// Logged for each table a start grows.
pub const GROWING: &str = "growing a flow table online";

/// How often [`watch`] counts the tables' entries (at least).
pub const CHECK: Duration = Duration::from_secs(2);

/// A pass is followed by a wait of at least this many times its length,
/// so the check takes at most 1/(1 + PACE) of a core however large the
/// tables.
pub const PACE: u32 = 50;

/// A table found due to grow while the agent runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    pub map: &'static str,
    pub size: u32,
    pub max: u32,
    pub entries: u64,
}

/// Counts the entries of each of [`TABLES`] below its maximum, pinned
/// under `pin_root`, every [`CHECK`] (paced by [`PACE`]) on a thread of its
/// own, and sends the first table found [`due`] to grow; then stops.
pub fn watch(
    pin_root: &Path,
    caps: &Capacities,
) -> std::io::Result<tokio::sync::mpsc::UnboundedReceiver<Due>> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let root: PathBuf = pin_root.to_owned();
    let caps = *caps;
    std::thread::Builder::new()
        .name("sb-growth".to_owned())
        .spawn(move || loop {
            let started = Instant::now();
            let found = check(&root, &caps);
            let took = started.elapsed();
            debug!(took_us = took.as_micros() as u64, "flow tables counted");
            if let Some(due) = found {
                // The agent restarts; a closed channel means it stops.
                let _ = tx.send(due);
                return;
            }
            if tx.is_closed() {
                return;
            }
            std::thread::sleep(CHECK.max(took * PACE));
        })?;
    Ok(rx)
}

/// One pass of [`watch`]: the first table due to grow, if any. Tables at
/// their maximum are not counted.
fn check(pin_root: &Path, caps: &Capacities) -> Option<Due> {
    TABLES.iter().find_map(|table| {
        let max = table.max(caps);
        let data = Pins::new(pin_root).data(table.map).ok()?;
        let size = data.info().ok()?.max_entries();
        if size >= max {
            return None;
        }
        let entries = batch::count(&data).ok()? as u64;
        due(size, entries, max).then_some(Due {
            map: table.map,
            size,
            max,
            entries,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizing rule, one case a row: the pinned size (none: not
    /// pinned), its entries, the start size and the maximum, and the size
    /// wanted.
    const CASES: &[(Option<u32>, u64, u32, u32, u32)] = &[
        // Nothing pinned: the start size, capped by the maximum.
        (None, 0, 4096, 524288, 4096),
        (None, 0, 4096, 1000, 1000),
        // Pinned and below 3/8 full: it stays.
        (Some(4096), 1535, 4096, 524288, 4096),
        (Some(16384), 100, 4096, 524288, 16384),
        // 3/8 full or more: doubled (the check restarts at one half, and
        // some entries may have gone by the start).
        (Some(4096), 1536, 4096, 524288, 8192),
        (Some(4096), 2048, 4096, 524288, 8192),
        (Some(4096), 3000, 4096, 524288, 8192),
        // Filled further: doubled until below 3/8.
        (Some(4096), 4096, 4096, 524288, 16384),
        (Some(4096), 9000, 4096, 524288, 32768),
        // Never above the maximum.
        (Some(4096), 4096, 4096, 6000, 6000),
        (Some(8192), 8192, 4096, 8192, 8192),
        // A pinned table smaller than the start size grows to it.
        (Some(512), 3, 4096, 524288, 4096),
        (Some(512), 400, 4096, 524288, 4096),
        (Some(512), 3000, 4096, 524288, 8192),
        // A table with entries is never shrunk to the start size...
        (Some(524288), 1, 4096, 524288, 524288),
        // ...but an empty one starts over.
        (Some(524288), 0, 4096, 524288, 4096),
        // A maximum lowered below the pinned size caps it.
        (Some(524288), 10, 4096, 65536, 65536),
        // A start size above the maximum is the maximum.
        (None, 0, 100000, 8192, 8192),
    ];

    #[test]
    fn tables_are_sized_by_their_pinned_size_and_fill() {
        for &(pinned, entries, start, max, want) in CASES {
            assert_eq!(
                wanted(pinned, entries, start, max),
                want,
                "pinned {pinned:?} holding {entries}, start {start}, max {max}"
            );
        }
    }

    #[test]
    fn a_table_is_due_at_half_full_below_its_maximum() {
        assert!(!due(4096, 2047, 524288));
        assert!(due(4096, 2048, 524288));
        assert!(!due(8192, 8192, 8192), "at its maximum it stays");
    }

    #[test]
    fn each_table_starts_at_the_start_size_within_its_maximum() {
        let caps = Capacities {
            conntrack: 1000,
            flow_start: 2000,
            ..Capacities::default()
        };
        let start = FlowSizes::at_start(&caps, 0);
        assert_eq!(start.get(names::SOCKETS), Some(1000));
        assert_eq!(start.get(names::AFFINITY6), Some(2000));
        let floored = FlowSizes::at_start(&caps, 4000);
        assert_eq!(
            floored.get(names::AFFINITY6),
            Some(4000),
            "never below the floor"
        );
        assert_eq!(
            floored.get(names::SOCKETS),
            Some(1000),
            "nor above the maximum"
        );
        assert_eq!(start.get(names::CONNTRACK), None, "not a growing table");
        let max = FlowSizes::at_max(&caps);
        assert_eq!(max.get(names::SOCKETS6), Some(1000));
        assert_eq!(max.get(names::FRAGMENTS), Some(capacity::FRAGMENTS));
    }
}
