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
use serde_json::{json, Value};

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
) -> Value {
    let conns = connections.max(1) as f64;
    let mut programs = serde_json::Map::new();
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
            json!({
                "runs_per_conn": runs as f64 / conns,
                "ns_per_run": ns as f64 / runs as f64,
                "ns_per_conn": ns as f64 / conns,
            }),
        );
    }
    let busy_ns_per_conn = busy_secs * 1e9 / conns;
    json!({
        "connections": connections,
        "programs": programs,
        "programs_ns_per_conn": total_ns,
        "busy_ns_per_conn": busy_ns_per_conn,
        "share": total_ns / busy_ns_per_conn.max(1.0),
    })
}

/// The report's section: one row per path and size.
pub fn report_md(rows: &[Value]) -> String {
    use std::fmt::Write as _;
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\n### switchboard's programs per connection (BPF run-time statistics)\n\n\
         One wrk phase per switchboard path after the rounds, with the kernel's run-time \
         statistics of BPF programs on (they add a clock read to every run, so these are \
         upper bounds; kernel work the programs cause outside their own run, such as freeing \
         a socket's storage, is not in them). Per connection: each program's runs × its \
         mean run time, their sum, and that sum's share of the machine's busy CPU time \
         per connection in the same phase.\n\n\
         | path | Services | conn/s | programs (runs × ns per run) | programs per conn | busy CPU per conn | share |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let t = &r["time"];
        let parts: Vec<String> = t["programs"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(name, p)| {
                        format!(
                            "`{name}` {:.1} × {:.0}",
                            p["runs_per_conn"].as_f64().unwrap_or(0.0),
                            p["ns_per_run"].as_f64().unwrap_or(0.0)
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {:.2} µs | {:.1} µs | {:.1} % |",
            r["label"].as_str().unwrap_or(""),
            r["services"].as_u64().unwrap_or(0),
            r["conn_per_s"].as_f64().unwrap_or(0.0),
            parts.join(", "),
            t["programs_ns_per_conn"].as_f64().unwrap_or(0.0) / 1000.0,
            t["busy_ns_per_conn"].as_f64().unwrap_or(0.0) / 1000.0,
            t["share"].as_f64().unwrap_or(0.0) * 100.0,
        );
    }
    md
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
        let p = &v["programs"];
        assert_eq!(p["sb_from_pod"]["runs_per_conn"], 10.0);
        assert_eq!(p["sb_from_pod"]["ns_per_run"], 100.0);
        assert_eq!(p["sb_sock_connect"]["ns_per_conn"], 1000.0);
        assert!(p.get("sb_sock_release").is_none(), "{p}");
        assert_eq!(v["programs_ns_per_conn"], 2000.0);
        assert_eq!(v["busy_ns_per_conn"], 100_000.0);
        assert_eq!(v["share"], 0.02);
    }
}
