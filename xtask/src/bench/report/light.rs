//! The light workload's rows, and every conn/s row held to its limit
//! under both workloads: the socket layer and tc to the spread (the same
//! pods, no Service, the node's multipath route spreading the
//! connections), the socket layer with one backend per client and the
//! node with switchboard installed but no Service to direct (each client
//! to its own pod).

use std::fmt::Write as _;

use crate::bench::fmt::{fmt_opt, size_label};
use crate::bench::paths::{
    Workload, DIRECT, DIRECT_SPREAD, DIRECT_SW, DIRECT_SW_TC, IPTABLES, NFTABLES, SW_SOCK_PINNED,
    SW_SOCK_POD, SW_TC,
};
use crate::bench::results::{label_of, ConnMedians, E2eRow, Results};
use crate::bench::stats::{median, range};

/// The rows held to a limit: `(path, its limit)`.
const AGAINST: [(&str, &str); 7] = [
    (SW_SOCK_POD, DIRECT_SPREAD),
    (SW_SOCK_PINNED, DIRECT),
    (SW_TC, DIRECT_SPREAD),
    (NFTABLES, DIRECT_SPREAD),
    (IPTABLES, DIRECT_SPREAD),
    (DIRECT_SW, DIRECT),
    (DIRECT_SW_TC, DIRECT),
];

/// What a limit is, as the table names it.
fn limit(key: &str) -> &'static str {
    match key {
        DIRECT_SPREAD => "spread: no Service, no NAT; each connection to one of the same three pods by the node's multipath route (anything that balances)",
        DIRECT => "direct: each client to its own pod (one backend per client)",
        _ => "",
    }
}

/// How the table names a row.
fn row_name(paths: &[(String, String)], key: &str) -> String {
    match key {
        DIRECT_SW => format!(
            "agent installed, no Service: {}, with the agent's tc programs on the veths and its socket hooks on the client's cgroup",
            label_of(paths, key)
        ),
        DIRECT_SW_TC => format!(
            "agent installed, no Service, client outside the hooked cgroup: {}, with the agent's tc programs on the veths only",
            label_of(paths, key)
        ),
        _ => label_of(paths, key).to_owned(),
    }
}

/// The wrk phase of `workload` in `row`.
fn phase(row: &E2eRow, workload: Workload) -> Option<ConnMedians> {
    match workload {
        Workload::Default => Some(ConnMedians {
            conn_per_s: row.m.conn_per_s,
            p50_us: row.m.p50_us,
            p99_us: row.m.p99_us,
            errors: row.m.errors,
            busy_us_per_conn: row.m.busy_us_per_conn,
            conn_per_s_rounds: row.m.conn_per_s_rounds.clone(),
            conn_per_s_clients_rounds: Vec::new(),
        }),
        Workload::Light => row.m.light.as_ref().map(|l| ConnMedians {
            conn_per_s: l.conn_per_s,
            p50_us: l.p50_us,
            p99_us: l.p99_us,
            errors: l.errors,
            busy_us_per_conn: l.busy_us_per_conn,
            conn_per_s_rounds: l.conn_per_s_rounds.clone(),
            conn_per_s_clients_rounds: Vec::new(),
        }),
    }
}

/// Both tables; nothing for a run without end-to-end rows.
pub fn section(results: &Results) -> String {
    let Some(at) = results.e2e_sizes().last().copied() else {
        return String::new();
    };
    let mut md = String::new();
    against(&mut md, results, at);
    if results.e2e().iter().any(|r| r.m.light.is_some()) {
        light_rows(&mut md, results);
    }
    md
}

/// Every row held to its limit, at the largest size, under both
/// workloads: from the rounds (the ratio of the medians, and the range of
/// the round-by-round ratios; each round measures both paths) and from the
/// paired phases (the median of the ratios with their quartiles).
fn against(md: &mut String, results: &Results, at: u64) {
    let paths = results.e2e_paths();
    let _ = writeln!(
        md,
        "\n### New connections/s against their limits, both workloads ({} Services)\n\nEach row ÷ its limit, measured in the same run: the default workload (`sb-http`'s HTTP server) and the light one (its light server, below). Rounds: the ratio of the two medians, in parentheses the lowest and highest ratio of one round (a round measures both). Paired: the median of the paired phases' ratios, in parentheses the quartiles (where the paired phases measured both).\n\n| row | limit | default: rounds | default: paired | light: rounds | light: paired |\n|---|---|---|---|---|---|",
        size_label(at)
    );
    for (num, den) in AGAINST {
        let cells: Vec<String> = [Workload::Default, Workload::Light]
            .into_iter()
            .flat_map(|w| {
                [
                    rounds_cell(results, w, num, den, at),
                    paired_cell(results, w, num, den),
                ]
            })
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            row_name(&paths, num),
            limit(den),
            cells.join(" | ")
        );
    }
}

/// `num ÷ den` from the rounds: the ratio of the medians and the range of
/// the per-round ratios.
fn rounds_cell(results: &Results, workload: Workload, num: &str, den: &str, at: u64) -> String {
    let side = |key| {
        results
            .e2e_row(key, Some(at))
            .and_then(|r| phase(r, workload))
    };
    let (Some(a), Some(b)) = (side(num), side(den)) else {
        return "–".into();
    };
    let ratio = a.conn_per_s.zip(b.conn_per_s).map(|(a, b)| a / b);
    let per_round: Vec<f64> = a
        .conn_per_s_rounds
        .iter()
        .zip(&b.conn_per_s_rounds)
        .map(|(a, b)| a / b)
        .collect();
    let aligned = a.conn_per_s_rounds.len() == b.conn_per_s_rounds.len();
    match range(&per_round).filter(|_| aligned && per_round.len() > 1) {
        Some((lo, hi)) => format!(
            "{} ({}–{})",
            fmt_opt(ratio, 3),
            fmt_opt(Some(lo), 3),
            fmt_opt(Some(hi), 3)
        ),
        None => fmt_opt(ratio, 3),
    }
}

/// `num ÷ den` from the paired phases: the median and the quartiles.
fn paired_cell(results: &Results, workload: Workload, num: &str, den: &str) -> String {
    match results
        .paired()
        .and_then(|p| p.ratio_of(workload, num, den))
    {
        Some(p) => format!("{:.3} ({:.3}–{:.3})", p.median, p.q1, p.q3),
        None => "–".into(),
    }
}

/// The light workload's rows: conn/s with its range over the rounds,
/// latency and the machine's busy CPU per connection, beside the default
/// workload's.
fn light_rows(md: &mut String, results: &Results) {
    md.push_str("\n### Light workload\n\nThe same three wrk clients per path (1 thread, 11 connections, `Connection: close`, the same duration), in the same rounds, right after each path's stream, against the light server every pod runs beside the default one (`sb-http serve --light`): one thread accepts (with `TCP_DEFER_ACCEPT`, so a connection arrives with its request), reads the request, writes a fixed `200 OK` with an empty body and closes: four system calls and no other thread woken per connection, where the default server wakes one of its 16 threads blocked in accept. Busy CPU per connection: the whole machine's (user, system, softirq) over the wrk phase ÷ the connections made, clients, servers and the kernel's TCP included.\n\n| path | Services | conn/s | rounds: min–max | p50 | p99 | busy CPU per connection | default workload: conn/s | busy CPU per connection | errors |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for r in results.e2e() {
        let Some(light) = &r.m.light else {
            continue;
        };
        let spread = range(&light.conn_per_s_rounds)
            .map_or("–".into(), |(lo, hi)| format!("{lo:.0}–{hi:.0}"));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {spread} | {} µs | {} µs | {} µs | {} | {} µs | {} |",
            r.label.as_deref().unwrap_or(&r.path),
            r.services.map(size_label).unwrap_or_else(|| "–".into()),
            fmt_opt(light.conn_per_s, 0),
            fmt_opt(light.p50_us, 0),
            fmt_opt(light.p99_us, 0),
            fmt_opt(light.busy_us_per_conn, 1),
            fmt_opt(r.m.conn_per_s, 0),
            fmt_opt(r.m.busy_us_per_conn, 1),
            light.errors,
        );
    }
    let busy: Vec<f64> = results
        .e2e()
        .iter()
        .filter(|r| r.path == DIRECT)
        .filter_map(|r| Some(r.m.light.as_ref()?.busy_us_per_conn? / r.m.busy_us_per_conn?))
        .collect();
    if !busy.is_empty() {
        let _ = writeln!(
            md,
            "\nOn the direct row a light connection costs the machine {:.2} × a default one's CPU (median over the sizes).",
            median(busy)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's ratio to its limit from the rounds gives the range of the
    /// round-by-round ratios, and the light workload's cell reads the light
    /// phase.
    #[test]
    fn rows_are_held_to_their_limit_round_by_round() {
        let row = |path: &str, conn: [f64; 3], light: [f64; 3]| {
            serde_json::json!({"path": path, "label": path, "services": 10000, "program_s": null,
                "m": {"conn_per_s": conn[1], "conn_per_s_rounds": conn,
                      "light": {"conn_per_s": light[1], "p50_us": 100.0, "p99_us": 900.0,
                                "errors": 0, "busy_us_per_conn": 20.0,
                                "conn_per_s_rounds": light, "conn_per_s_clients_rounds": []}}})
        };
        let results: Results = serde_json::from_value(serde_json::json!({
            "meta": crate::bench::results::Meta::default(),
            "e2e": [row(DIRECT_SPREAD, [20000.0, 20000.0, 20000.0], [40000.0, 40000.0, 40000.0]),
                    row(SW_SOCK_POD, [19000.0, 19400.0, 19800.0], [36000.0, 38000.0, 40000.0])],
        }))
        .expect("results json");
        assert_eq!(
            rounds_cell(
                &results,
                Workload::Default,
                SW_SOCK_POD,
                DIRECT_SPREAD,
                10_000
            ),
            "0.970 (0.950–0.990)"
        );
        assert_eq!(
            rounds_cell(
                &results,
                Workload::Light,
                SW_SOCK_POD,
                DIRECT_SPREAD,
                10_000
            ),
            "0.950 (0.900–1.000)"
        );
        assert_eq!(
            rounds_cell(&results, Workload::Light, SW_TC, DIRECT_SPREAD, 10_000),
            "–"
        );
        let md = section(&results);
        assert!(md.contains("| socketlb_pod | spread: no Service"), "{md}");
        assert!(
            md.contains("| socketlb_pod | 10k | 38000 | 36000–40000 | 100 µs | 900 µs | 20.0 µs |"),
            "{md}"
        );
    }
}
