//! What switchboard's own programs cost per connection, from the kernel's
//! run-time statistics of BPF programs: an end-to-end row's conn/s moves
//! 6–12 % between rounds on these machines, more than every program of the
//! row costs, so the rows alone cannot say how much of a gap is the
//! programs'. This pass can: for each switchboard path, one wrk phase with
//! the statistics on (`BPF_ENABLE_STATS`, held by this process only for the
//! pass), and every `sb_…` program's run count and run time read around it,
//! divided by the connections wrk made.
//!
//! The pass runs after the interleaved rounds, never inside them: with the
//! statistics on, the kernel reads the clock around every program run,
//! which adds to each run (and to the figures here: they are upper bounds).
//! What the programs make the kernel do outside their own instructions (a
//! socket-local storage freed with its socket, a map's memory) is not in
//! them.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;

use anyhow::{Context, Result};

use super::results::{ProgTime, ProgramCost};

/// The statistics, on while this lives (the kernel turns them off when the
/// last holder closes its descriptor).
pub struct Stats(
    #[allow(dead_code, reason = "held, not read: closing it ends the statistics")] OwnedFd,
);

impl Stats {
    pub fn enable() -> Result<Stats> {
        let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .context("BPF_ENABLE_STATS (run time of BPF programs; Linux 5.8+)")?;
        Ok(Stats(fd))
    }
}

/// Run count and run time (ns) of every loaded switchboard program, summed
/// by name (the kernel keeps the first 15 bytes of a name).
#[derive(Clone, Default)]
pub struct Snapshot(BTreeMap<String, (u64, u64)>);

pub fn snapshot() -> Result<Snapshot> {
    let mut by_name = BTreeMap::new();
    for info in aya::programs::loaded_programs() {
        let info = info.context("reading a loaded program's information")?;
        let Some(name) = info.name_as_str().filter(|n| n.starts_with("sb_")) else {
            continue;
        };
        let run_ns = u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
        let e: &mut (u64, u64) = by_name.entry(name.to_string()).or_default();
        e.0 += info.run_count();
        e.1 += run_ns;
    }
    Ok(Snapshot(by_name))
}

/// The programs' runs and time per connection between two snapshots, and
/// their share of the machine's busy time per connection.
pub fn per_connection(
    before: &Snapshot,
    after: &Snapshot,
    connections: u64,
    busy_secs: f64,
) -> ProgTime {
    let conns = connections.max(1) as f64;
    let mut programs = BTreeMap::new();
    let mut total_ns = 0.0;
    for (name, &(runs, ns)) in &after.0 {
        let (runs0, ns0) = before.0.get(name).copied().unwrap_or_default();
        let (runs, ns) = (runs.saturating_sub(runs0), ns.saturating_sub(ns0));
        if runs == 0 {
            continue;
        }
        total_ns += ns as f64 / conns;
        programs.insert(
            name.clone(),
            ProgramCost {
                runs_per_conn: runs as f64 / conns,
                ns_per_run: ns as f64 / runs as f64,
                ns_per_conn: ns as f64 / conns,
            },
        );
    }
    let busy_ns_per_conn = busy_secs * 1e9 / conns;
    ProgTime {
        connections,
        programs,
        programs_ns_per_conn: total_ns,
        busy_ns_per_conn,
        share: total_ns / busy_ns_per_conn.max(1.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(rows: &[(&str, u64, u64)]) -> Snapshot {
        Snapshot(
            rows.iter()
                .map(|&(n, runs, ns)| (n.to_string(), (runs, ns)))
                .collect(),
        )
    }

    /// Each program's growth over the phase, per connection; a program that
    /// did not run in the phase is left out; the share is of the busy time.
    #[test]
    fn per_connection_divides_each_programs_growth_by_the_connections() {
        let before = snap(&[("sb_from_pod", 1000, 50_000), ("sb_sock_release", 7, 700)]);
        let after = snap(&[
            ("sb_from_pod", 21_000, 2_050_000),
            ("sb_sock_connect", 2_000, 2_000_000),
            ("sb_sock_release", 7, 700),
        ]);
        // 2000 connections in 0.2 s of busy CPU: 100 µs each.
        let v = per_connection(&before, &after, 2000, 0.2);
        let p = &v.programs;
        assert_eq!(p["sb_from_pod"].runs_per_conn, 10.0);
        assert_eq!(p["sb_from_pod"].ns_per_run, 100.0);
        assert_eq!(p["sb_sock_connect"].ns_per_conn, 1000.0);
        assert!(!p.contains_key("sb_sock_release"), "{p:?}");
        assert_eq!(v.programs_ns_per_conn, 2000.0);
        assert_eq!(v.busy_ns_per_conn, 100_000.0);
        assert_eq!(v.share, 0.02);
    }
}
