//! The per-packet section: each case's nanoseconds at every size, next to
//! the empty programs; the live trace's cost; IPv6; and the schedulers (a
//! new flow's cost by algorithm, and the balance over mixed flows).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::bench::fmt::{fmt_opt, raw, size_label};
use crate::bench::results::{Case, CaseV6, PerPacket, PerPacketRow, PerPacketV6, Spread};

/// The section (the heading and floors even for a run without the
/// per-packet part).
pub fn section(pp: Option<&PerPacket>) -> String {
    let none = PerPacket::default();
    let pp = pp.unwrap_or(&none);
    let empty_tc = pp.empty_tc_ns;
    let (smallest, largest) = pp.smallest_largest();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\n## Per-packet cost (BPF_PROG_TEST_RUN, {}-byte TCP frame, repeat {}, median of {} runs)\n",
        raw(pp.frame_bytes),
        raw(pp.repeat),
        raw(pp.rounds)
    );
    let _ = writeln!(
        md,
        "Floors on the same frame: empty tc program **{} ns**, empty XDP program **{} ns**. switchboard's XDP data path: {}.\n",
        fmt_opt(empty_tc, 1),
        fmt_opt(pp.empty_xdp_ns, 1),
        pp.xdp_note.as_deref().unwrap_or("not implemented yet")
    );
    md.push_str("\"existing flow\": the two ping-pong Services A ⇄ B (see proxy-user/benches/sb_bench.rs) make every repetition a full lookup + conntrack hit + DNAT with checksum updates; the data path's own counters are checked to grow by exactly the repetitions. \"no rewrite\": a Service whose backend is itself (lookups and conntrack, rewrite helpers skipped). \"16 source ranges\": the same existing flow after Service A is restricted by `loadBalancerSourceRanges` (16 blocks): the one trie lookup a restricted frontend adds; every other column is a frontend without ranges, which pays one flag test and no lookup. Single-shot columns: `repeat = 1` per call (median of many), which includes the kernel timer's overhead — compare them only with each other (\"empty\" is the empty tc program measured the same way).\n\n");
    md.push_str("\"reply\": an ACK of the established flow from its backend; \"first reply\": the SYN-ACK, which no flow cache answers (a SYN-ACK may find a stale flow, so it always takes the table). Existing flows and replies repeat one flow, which each CPU's flow cache answers after the first repetition (`proxy-ebpf/src/ct/cache.rs`); \"to_pod non-service\" is a TCP segment of no tracked flow, which pays the cache's miss and the table's.\n\n");
    md.push_str("| Services | backends (target) | from_pod existing flow | from_pod no rewrite | from_pod, 16 source ranges | from_pod non-service (socket-balanced) | to_pod reply | to_pod first reply (SYN-ACK) | to_pod non-service | to_pod, quiet pod (socket-balanced) | single-shot: new flow | existing | empty |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &pp.rows {
        let ss = &r.single_shot;
        let _ = writeln!(
            md,
            "| {} | {} | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns |",
            size_label(r.services_nominal.unwrap_or(0)),
            raw(r.target_backends),
            fmt_opt(r.from_pod_service_existing_ns, 1),
            fmt_opt(r.from_pod_service_existing_no_rewrite_ns, 1),
            fmt_opt(r.from_pod_service_existing_source_ranges_ns, 1),
            fmt_opt(r.from_pod_non_service_ns, 1),
            fmt_opt(r.to_pod_reply_ns, 1),
            fmt_opt(r.to_pod_first_reply_ns, 1),
            fmt_opt(r.to_pod_non_service_ns, 1),
            fmt_opt(r.to_pod_quiet_ns, 1),
            fmt_opt(ss.from_pod_service_new_ns, 0),
            fmt_opt(ss.from_pod_service_existing_ns, 0),
            fmt_opt(ss.empty_tc_ns, 0),
        );
    }
    ratios(&mut md, pp, smallest, largest);
    tracing_rows(&mut md, &pp.rows);
    md.push_str("\n![per-packet cost](perpacket.svg)\n");
    if let Some(v6) = &pp.ipv6 {
        ipv6(&mut md, v6, pp);
    }
    schedulers(&mut md, pp);
    md
}

/// Each case at the largest size ÷ at the smallest, and ÷ the empty tc
/// program.
fn ratios(md: &mut String, pp: &PerPacket, smallest: u64, largest: u64) {
    md.push_str("\nRatios:\n\n| case | ");
    let _ = writeln!(
        md,
        "{} ÷ {} Services | ÷ empty tc (at {}) |\n|---|---|---|",
        size_label(largest),
        size_label(smallest),
        size_label(largest)
    );
    let cases: [(Case, &str); 7] = [
        (
            |r| r.from_pod_service_existing_ns,
            "sb_from_pod, Service packet, existing flow",
        ),
        (
            |r| r.from_pod_service_existing_no_rewrite_ns,
            "sb_from_pod, existing flow, no rewrite",
        ),
        (
            |r| r.from_pod_service_existing_source_ranges_ns,
            "sb_from_pod, existing flow, 16 source ranges",
        ),
        (
            |r| r.from_pod_non_service_ns,
            "sb_from_pod, non-service packet (as a socket-balanced one)",
        ),
        (|r| r.to_pod_reply_ns, "sb_to_pod, reply"),
        (|r| r.to_pod_non_service_ns, "sb_to_pod, non-service packet"),
        (
            |r| r.to_pod_quiet_ns,
            "sb_to_pod, into a quiet pod (socket-balanced)",
        ),
    ];
    for (case, name) in cases {
        let a = pp.ns(smallest, case);
        let b = pp.ns(largest, case);
        let _ = writeln!(
            md,
            "| {name} | {} | {} |",
            fmt_opt(a.zip(b).map(|(a, b)| b / a), 2),
            fmt_opt(b.zip(pp.empty_tc_ns).map(|(b, e)| b / e), 2)
        );
    }
}

/// The live trace's cost: the existing flow and a new flow's single shot
/// with every event kind switched on (an existing flow's packet writes no
/// event; each new flow writes one, drained between samples), beside the
/// same figures with tracing off.
fn tracing_rows(md: &mut String, rows: &[PerPacketRow]) {
    md.push_str("\nThe live trace (`switchboard trace`): the same packets with every event kind switched on, beside the figures above, taken with it off (the switch is one load and one branch per call site; an existing flow's packet writes no event, a new flow writes one to the ring buffer). The single-shot columns are medians of different samples (tracing on: at most 2000 new flows, after the others), so they move by more than the event's cost; the existing-flow columns compare like for like.\n\n| Services | backends (target) | existing flow, tracing off | tracing on | single-shot new flow, tracing off | tracing on |\n|---|---|---|---|---|---|\n");
    for r in rows {
        let on = &r.tracing_on;
        let _ = writeln!(
            md,
            "| {} | {} | {} ns | {} ns | {} ns | {} ns |",
            size_label(r.services_nominal.unwrap_or(0)),
            raw(r.target_backends),
            fmt_opt(r.from_pod_service_existing_ns, 0),
            fmt_opt(on.from_pod_service_existing_ns, 0),
            fmt_opt(r.single_shot.from_pod_service_new_ns, 0),
            fmt_opt(on.single_shot_from_pod_service_new_ns, 0),
        );
    }
}

/// The IPv6 rows: the same cases through the IPv6 pod path, next to the
/// IPv4 figure at the same size (1 backend).
fn ipv6(md: &mut String, v6: &PerPacketV6, pp: &PerPacket) {
    let _ = writeln!(
        md,
        "\n### IPv6 ({}-byte TCP frame: the same payload, a 40-byte IPv6 header)\n",
        raw(v6.frame_bytes)
    );
    md.push_str("The IPv6 ping-pong pair beside the IPv4 rows' state (that many IPv4 Services, and up to 10k IPv6 ones).\n\n");
    md.push_str("| Services | case | IPv6 | × empty tc | IPv4 (same size) | IPv6 ÷ IPv4 |\n|---|---|---|---|---|---|\n");
    let cases: [(CaseV6, Case, &str); 4] = [
        (
            |r| r.from_pod_service_existing_ns,
            |r| r.from_pod_service_existing_ns,
            "sb_from_pod, existing flow",
        ),
        (
            |r| r.from_pod_non_service_ns,
            |r| r.from_pod_non_service_ns,
            "sb_from_pod, non-service",
        ),
        (
            |r| r.to_pod_reply_ns,
            |r| r.to_pod_reply_ns,
            "sb_to_pod, reply",
        ),
        (
            |r| r.to_pod_first_reply_ns,
            |r| r.to_pod_first_reply_ns,
            "sb_to_pod, first reply (SYN-ACK)",
        ),
    ];
    for r in &v6.rows {
        let size = r.services_nominal.unwrap_or(0);
        for (case6, case4, name) in cases {
            let v6 = case6(r);
            let v4 = pp.ns(size, case4);
            let _ = writeln!(
                md,
                "| {} | {name} | {} ns | {} | {} ns | {} |",
                size_label(size),
                fmt_opt(v6, 1),
                fmt_opt(v6.zip(pp.empty_tc_ns).map(|(a, e)| a / e), 2),
                fmt_opt(v4, 1),
                fmt_opt(v6.zip(v4).map(|(a, b)| a / b), 2),
            );
        }
    }
}

/// The algorithms of `sb_bench perpacket`'s scheduler figures in the
/// order the report lists them (any other the run names follows).
const SCHEDULERS: [&str; 4] = ["random", "round-robin", "least-conn", "weighted random"];

/// The names in `by` in [`SCHEDULERS`]' order, then the rest.
fn scheduler_names(by: &BTreeMap<String, Spread>) -> Vec<String> {
    let mut names: Vec<String> = SCHEDULERS
        .iter()
        .filter(|n| by.contains_key(**n))
        .map(|n| n.to_string())
        .collect();
    names.extend(
        by.keys()
            .filter(|k| !SCHEDULERS.contains(&k.as_str()))
            .cloned(),
    );
    names
}

/// The per-node schedulers, from `sb_bench perpacket`: a new flow's
/// single-shot cost under each algorithm next to `random` (each row's
/// `single_shot.from_pod_service_new_by_algorithm_ns`), and the balance
/// over mixed-length flows against IPVS `lc`'s ideal
/// (`scheduler_balance`). Nothing when the run has neither.
fn schedulers(md: &mut String, pp: &PerPacket) {
    let by_row: Vec<(&PerPacketRow, &BTreeMap<String, Spread>)> = pp
        .rows
        .iter()
        .filter_map(|r| {
            Some((
                r,
                r.single_shot
                    .from_pod_service_new_by_algorithm_ns
                    .as_ref()?,
            ))
        })
        .collect();
    if let Some((_, first)) = by_row.first() {
        let names = scheduler_names(first);
        md.push_str("\n## Schedulers: a new flow's cost by algorithm\n\n");
        md.push_str("Single shot (`repeat = 1`, timer included), the frame creating a new flow to ping-pong Service A under each algorithm: the median of five interleaved rounds' medians (the algorithms take turns), in parentheses the rounds' range, each ÷ `random`'s median.\n\n");
        let _ = write!(md, "| Services | backends (target) |");
        for name in &names {
            match name.as_str() {
                "random" => {
                    let _ = write!(md, " `random` |");
                }
                other => {
                    let _ = write!(md, " `{other}` ÷ random |");
                }
            }
        }
        let _ = writeln!(md, "\n|---|---|{}", "---|".repeat(names.len()));
        for (r, by) in &by_row {
            let random = by.get("random").and_then(|c| c.ns);
            let _ = write!(
                md,
                "| {} | {} |",
                size_label(r.services_nominal.unwrap_or(0)),
                raw(r.target_backends)
            );
            for name in &names {
                let cell = by.get(name).copied().unwrap_or_default();
                let ratio = |v: Option<f64>| v.zip(random).map(|(v, r)| v / r);
                if name == "random" {
                    let _ = write!(md, " {} ns |", fmt_opt(cell.ns, 0));
                } else {
                    let _ = write!(
                        md,
                        " {} ({}–{}) |",
                        fmt_opt(ratio(cell.ns), 2),
                        fmt_opt(ratio(cell.min), 2),
                        fmt_opt(ratio(cell.max), 2)
                    );
                }
            }
            md.push('\n');
        }
    }
    let Some(balance) = &pp.scheduler_balance else {
        return;
    };
    let Some(rows) = &balance.rows else {
        return;
    };
    let ideal = rows
        .iter()
        .find(|r| {
            r.algorithm
                .as_deref()
                .is_some_and(|a| a.starts_with("ideal"))
        })
        .and_then(|r| r.max_over_mean_avg);
    let _ = writeln!(
        md,
        "\n## Schedulers: balance\n\n{} new flows to one Service of {} backends through `sb_from_pod`, one per step, lengths {}; each flow closes with an RST through the program. After each new flow past the first {}: the most loaded backend's active flows ÷ the mean (1.00 is perfect). IPVS `lc`'s ideal (always a least loaded backend) is computed on the same flows.\n",
        raw(balance.flows),
        raw(balance.backends),
        balance.lengths.as_deref().unwrap_or("mixed"),
        raw(balance.warmup_flows)
    );
    md.push_str("| algorithm | max ÷ mean, average | worst | average ÷ IPVS lc's ideal |\n|---|---|---|---|\n");
    for r in rows {
        let avg = r.max_over_mean_avg;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            r.algorithm.as_deref().unwrap_or("?"),
            fmt_opt(avg, 2),
            fmt_opt(r.max_over_mean_worst, 2),
            fmt_opt(avg.zip(ideal).map(|(a, i)| a / i), 2)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scheduler figures `sb_bench perpacket` writes render as two
    /// tables, algorithms in a fixed order, ratios to `random` and to the
    /// ideal computed from the run's numbers.
    #[test]
    fn scheduler_rows_render_from_perpacket_json() {
        let pp: PerPacket = serde_json::from_value(serde_json::json!({
            "rows": [{
                "services_nominal": 10000,
                "target_backends": 1000,
                "single_shot": {"from_pod_service_new_by_algorithm_ns": {
                    "least-conn": {"ns": 1500.0, "min": 1400.0, "max": 1650.0},
                    "random": {"ns": 1000.0, "min": 950.0, "max": 1100.0},
                    "round-robin": {"ns": 900.0, "min": 890.0, "max": 1020.0}
                }}
            }],
            "scheduler_balance": {
                "backends": 10, "flows": 10000, "warmup_flows": 2000,
                "lengths": "80% 1-20 new flows long, 20% 200-2000",
                "rows": [
                    {"algorithm": "ideal lc (IPVS)", "max_over_mean_avg": 1.03, "max_over_mean_worst": 1.1},
                    {"algorithm": "least-conn", "max_over_mean_avg": 1.0815, "max_over_mean_worst": 1.3}
                ]
            }
        }))
        .expect("perpacket json");
        let mut md = String::new();
        schedulers(&mut md, &pp);
        assert!(
            md.contains("| Services | backends (target) | `random` | `round-robin` ÷ random | `least-conn` ÷ random |"),
            "{md}"
        );
        assert!(
            md.contains("| 10k | 1000 | 1000 ns | 0.90 (0.89–1.02) | 1.50 (1.40–1.65) |"),
            "{md}"
        );
        assert!(
            md.contains("| ideal lc (IPVS) | 1.03 | 1.10 | 1.00 |"),
            "{md}"
        );
        assert!(md.contains("| least-conn | 1.08 | 1.30 | 1.05 |"), "{md}");
        // A run without the figures (an older sb_bench) adds nothing.
        let mut none = String::new();
        let no_figures: PerPacket =
            serde_json::from_value(serde_json::json!({"rows": [{}]})).expect("perpacket json");
        schedulers(&mut none, &no_figures);
        assert!(none.is_empty());
    }
}
