//! The benchmark report: `report.md` (machine, kernel, commit, every figure,
//! the goals with the ratios computed from this run's numbers) and SVG plots
//! drawn with plotters.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;
use serde_json::Value;

use super::{
    DIRECT, DIRECT_HOST, DIRECT_SPREAD, DIRECT_SW, IPTABLES, NFTABLES, SW_SOCK_HOST,
    SW_SOCK_PINNED, SW_SOCK_POD, SW_TC,
};

use super::goals::{f, fmt_opt, size_label, verdict, Goal};

/// The file of the figures the docs may quote (the Goals table and the
/// run's header): `figures.json`, next to report.md.
pub(super) const FIGURES_FILE: &str = "figures.json";

/// Writes [`FIGURES_FILE`] into `dir`; a full run's copy goes to
/// `docs/benchmarks/latest.json`, where the docs check reads it.
fn write_figures(meta: &Value, goals: &[Goal], dir: &Path) -> Result<()> {
    let figures = crate::docs::BenchFigures {
        run: meta["timestamp"].as_str().unwrap_or("").to_string(),
        mode: meta["mode"].as_str().unwrap_or("").to_string(),
        commit: meta["commit"].as_str().unwrap_or("").to_string(),
        machine: format!(
            "{} × {}, {:.1} GiB",
            meta["cpus"],
            meta["cpu"].as_str().unwrap_or(""),
            f(&meta["memory_gib"]).unwrap_or(0.0)
        ),
        kernel: meta["kernel"].as_str().unwrap_or("").to_string(),
        goals: goals
            .iter()
            .map(|g| crate::docs::GoalFigure {
                goal: g.what.clone(),
                target: g.goal.clone(),
                measured: g.measured.clone(),
                verdict: verdict(g.met).trim_matches('*').to_string(),
            })
            .collect(),
    };
    let mut json = serde_json::to_string_pretty(&figures)?;
    json.push('\n');
    fs::write(dir.join(FIGURES_FILE), json)?;
    Ok(())
}

fn e2e_row<'a>(e2e: &'a [Value], path: &str, services: Option<u64>) -> Option<&'a Value> {
    e2e.iter()
        .find(|r| r["path"] == path && (services.is_none() || r["services"].as_u64() == services))
}

fn conn(e2e: &[Value], path: &str, services: Option<u64>) -> Option<f64> {
    e2e_row(e2e, path, services).and_then(|r| f(&r["m"]["conn_per_s"]))
}

/// The end-to-end paths, in the run's order: `(key, label)`. From
/// `e2e_paths` when the run wrote it, else from the rows.
fn e2e_paths(results: &Value, e2e: &[Value]) -> Vec<(String, String)> {
    let mut paths: Vec<(String, String)> = Vec::new();
    let listed = results["e2e_paths"].as_array().cloned().unwrap_or_default();
    for p in listed.iter().chain(e2e) {
        let Some(key) = p["path"].as_str() else {
            continue;
        };
        if paths.iter().all(|(k, _)| k != key) {
            let label = p["label"].as_str().unwrap_or(key);
            paths.push((key.to_string(), label.to_string()));
        }
    }
    paths
}

fn label_of<'a>(paths: &'a [(String, String)], key: &'a str) -> &'a str {
    paths
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, l)| l.as_str())
        .unwrap_or(key)
}

/// Writes report.md and the plots into `dir`; returns the headline table
/// (also printed at the end of the run).
pub fn write(results: &Value, dir: &Path) -> Result<String> {
    let meta = &results["meta"];
    let pp = &results["perpacket"];
    let pp_rows = pp["rows"].as_array().cloned().unwrap_or_default();
    let sync_runs = results["sync"]["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let fwd_rows = results["fwd"]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let e2e = results["e2e"].as_array().cloned().unwrap_or_default();
    let programming = results["programming"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let rss = results["rss"].as_array().cloned().unwrap_or_default();

    let empty_tc = f(&pp["empty_tc_ns"]);
    let sizes: Vec<u64> = {
        let mut v: Vec<u64> = pp_rows
            .iter()
            .filter_map(|r| r["services_nominal"].as_u64())
            .collect();
        v.dedup();
        v
    };
    let pp_at = |nominal: u64, backends: u64, key: &str| -> Option<f64> {
        pp_rows
            .iter()
            .find(|r| {
                r["services_nominal"].as_u64() == Some(nominal)
                    && r["target_backends"].as_u64() == Some(backends)
            })
            .and_then(|r| f(&r[key]))
    };
    let smallest = sizes.first().copied().unwrap_or(1);
    let largest = sizes.last().copied().unwrap_or(1);

    // ---- goals ----
    let mut goals = Vec::new();
    let hit_small = pp_at(smallest, 1, "from_pod_service_existing_ns");
    let hit_large = pp_at(largest, 1, "from_pod_service_existing_ns");
    let flat = hit_small.zip(hit_large).map(|(a, b)| b / a);
    goals.push(Goal {
        what: format!(
            "per-packet cost, {} ÷ {} Services (sb_from_pod, existing flow)",
            size_label(largest),
            size_label(smallest)
        ),
        goal: "≤ 1.1".into(),
        measured: format!(
            "{} ({} ns ÷ {} ns)",
            fmt_opt(flat, 2),
            fmt_opt(hit_large, 1),
            fmt_opt(hit_small, 1)
        ),
        met: flat.map(|r| r <= 1.1),
    });
    // Issue 27's per-packet targets, at the largest size: (what, numerator,
    // denominator, target); each side a figure of this run.
    let v6_at = |key: &str| -> Option<f64> {
        pp["ipv6"]["rows"]
            .as_array()?
            .iter()
            .filter(|r| r["services_nominal"].as_u64().is_some_and(|n| n <= largest))
            .max_by_key(|r| r["services_nominal"].as_u64())
            .and_then(|r| f(&r[key]))
    };
    let v4 = |key: &str| pp_at(largest, 1, key);
    let at = size_label(largest);
    let per_packet_goals = [
        (
            format!("sb_from_pod existing flow ÷ empty tc program ({at} Services)"),
            hit_large,
            empty_tc,
            2.5,
        ),
        (
            format!("sb_to_pod reply ÷ empty tc program ({at} Services)"),
            v4("to_pod_reply_ns"),
            empty_tc,
            2.5,
        ),
        (
            "IPv6 ÷ IPv4, sb_from_pod existing flow".to_string(),
            v6_at("from_pod_service_existing_ns"),
            v4("from_pod_service_existing_ns"),
            1.2,
        ),
        (
            "IPv6 ÷ IPv4, sb_to_pod reply".to_string(),
            v6_at("to_pod_reply_ns"),
            v4("to_pod_reply_ns"),
            1.2,
        ),
        (
            "not ours: sb_from_pod, a packet to no frontend, ÷ empty tc program".to_string(),
            v4("from_pod_non_service_ns"),
            empty_tc,
            1.3,
        ),
        (
            "not ours, IPv6: sb_from_pod, an IPv6 packet to no frontend, ÷ empty tc program"
                .to_string(),
            v6_at("from_pod_non_service_ns"),
            empty_tc,
            1.3,
        ),
        (
            "a socket-balanced flow's packet on the pod veth, leaving the pod (sb_from_pod: to a pod address) ÷ empty tc program".to_string(),
            v4("from_pod_non_service_ns"),
            empty_tc,
            1.2,
        ),
        (
            "a socket-balanced flow's packet on the pod veth, into the pod (sb_to_pod: a quiet pod) ÷ empty tc program".to_string(),
            v4("to_pod_quiet_ns"),
            empty_tc,
            1.2,
        ),
    ];
    for (what, num, den, target) in per_packet_goals {
        let r = num.zip(den).map(|(a, b)| a / b);
        goals.push(Goal {
            what,
            goal: format!("≤ {target}"),
            measured: format!(
                "{} ({} ns ÷ {} ns)",
                fmt_opt(r, 2),
                fmt_opt(num, 1),
                fmt_opt(den, 1)
            ),
            met: r.map(|r| r <= target),
        });
    }
    let ns = &results["northsouth"];
    if ns.is_null() {
        goals.push(Goal {
            what: "switchboard ÷ empty XDP program".into(),
            goal: "≤ 3".into(),
            measured: format!(
                "not measured in this run (empty XDP: {} ns)",
                fmt_opt(f(&pp["empty_xdp_ns"]), 1)
            ),
            met: None,
        });
    } else {
        goals.extend(northsouth_goals(ns));
    }
    let e2e_sizes: Vec<u64> = {
        let mut v: Vec<u64> = e2e.iter().filter_map(|r| r["services"].as_u64()).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let e2e_max = e2e_sizes.last().copied();
    let paths = e2e_paths(results, &e2e);
    let at = e2e_max.map(size_label).unwrap_or_default();
    // (numerator, denominator, target, informative only)
    // Against direct traffic spread over the pods as a balancer spreads it
    // (the fair limit), and against each client held to one pod (the
    // pinned direct row, and the socket layer held the same way).
    let conn_goals = [
        (SW_SOCK_POD, DIRECT_SPREAD, 0.97, false),
        (SW_SOCK_POD, DIRECT, 0.97, true),
        (SW_SOCK_PINNED, DIRECT, 0.97, true),
        (SW_SOCK_PINNED, DIRECT_SW, 0.97, true),
        (SW_SOCK_POD, SW_TC, 1.0, false),
        (SW_SOCK_POD, IPTABLES, 3.0, false),
        (SW_SOCK_POD, NFTABLES, 1.2, false),
        (DIRECT_SW, DIRECT, 0.97, true),
        (DIRECT_SPREAD, DIRECT, 0.97, true),
        (SW_SOCK_HOST, DIRECT_HOST, 0.95, true),
        (SW_TC, DIRECT_SPREAD, 0.95, false),
        (SW_TC, DIRECT, 0.95, true),
        (SW_TC, IPTABLES, 3.0, false),
        (SW_TC, NFTABLES, 1.2, false),
    ];
    let paired = &results["e2e_paired"];
    for (num, den, goal, informative) in conn_goals {
        let (a, b) = (conn(&e2e, num, e2e_max), conn(&e2e, den, e2e_max));
        let rounds = a.zip(b).map(|(a, b)| a / b);
        let rounds_text = format!(
            "{} ({} ÷ {})",
            fmt_opt(rounds, 2),
            fmt_opt(a, 0),
            fmt_opt(b, 0)
        );
        // A goal's ratio from the paired phases where they measured both
        // paths (the rounds' medians beside it), else from the rounds.
        let (r, measured) = match super::paired::ratio(paired, num, den) {
            Some(p) => (
                Some(p.median),
                format!(
                    "{:.3} paired (quartiles {:.3}–{:.3}, {} repetitions); rounds' medians {rounds_text}",
                    p.median, p.q1, p.q3, p.repetitions
                ),
            ),
            None => (rounds, rounds_text),
        };
        goals.push(Goal {
            what: format!(
                "new TCP connections/s at {at} Services, {} ÷ {}",
                label_of(&paths, num),
                label_of(&paths, den)
            ),
            goal: if informative {
                format!("≥ {goal} (informative)")
            } else {
                format!("≥ {goal}")
            },
            measured,
            met: r.map(|r| r >= goal),
        });
    }
    let sync_main = sync_runs
        .iter()
        .max_by_key(|r| r["services"].as_u64().unwrap_or(0));
    if let Some(run) = sync_main {
        let apply = f(&run["apply_ms"]).map(|ms| ms / 1000.0);
        goals.push(Goal {
            what: format!(
                "program {} Services × {} endpoints (Syncer::apply into kernel maps)",
                size_label(run["services"].as_u64().unwrap_or(0)),
                run["endpoints_per_service"]
            ),
            goal: "< 0.5 s".into(),
            measured: format!(
                "{} s (+ {} s to build the model)",
                fmt_opt(apply, 3),
                fmt_opt(f(&run["model_ms"]).map(|m| m / 1000.0), 3)
            ),
            met: apply.map(|s| s < 0.5),
        });
    }

    let scale = &results["scale"];
    goals.extend(super::scale::report::goals(scale));

    let mut md = String::new();
    let _ = writeln!(
        md,
        "# switchboard benchmark — {}\n",
        meta["timestamp"].as_str().unwrap_or("")
    );
    let _ = writeln!(
        md,
        "- mode: {} (`cargo xtask bench{}`)\n- machine: {} × {}, {:.1} GiB\n- kernel: {}\n- commit: {}{}\n- tools: {}; {}; {}\n",
        meta["mode"].as_str().unwrap_or(""),
        if meta["mode"] == "quick" { " --quick" } else { "" },
        meta["cpus"],
        meta["cpu"].as_str().unwrap_or(""),
        f(&meta["memory_gib"]).unwrap_or(0.0),
        meta["kernel"].as_str().unwrap_or(""),
        meta["commit"].as_str().unwrap_or(""),
        if meta["dirty"] == true { " (with uncommitted changes)" } else { "" },
        meta["iptables"].as_str().unwrap_or(""),
        meta["nft"].as_str().unwrap_or(""),
        meta["wrk"].as_str().unwrap_or(""),
    );
    if let Some(agent) = meta["switchboard_binary"].as_str() {
        let _ = writeln!(
            md,
            "- agent: `{agent}` (`SB_BENCH_SWITCHBOARD`: another build's agent and programs in the end-to-end, scale and north-south parts; the per-packet rows measure this commit's object)\n"
        );
    }
    md.push_str("Every figure below was measured in this run; ratios are computed from them.\n\n");

    let mut headline = String::new();
    let _ = writeln!(
        headline,
        "| goal | target | measured | |\n|---|---|---|---|"
    );
    for g in &goals {
        let _ = writeln!(
            headline,
            "| {} | {} | {} | {} |",
            g.what,
            g.goal,
            g.measured,
            verdict(g.met)
        );
    }
    write_figures(meta, &goals, dir)?;
    md.push_str("## Goals\n\n");
    md.push_str(&headline);
    md.push_str(&limits(&e2e, e2e_max, &pp_rows, largest, empty_tc));
    md.push_str(&super::paired::limits_md(&results["e2e_paired"]));

    // ---- end to end ----
    md.push_str("\n## End to end (netns sandbox: client → node → 3 pods)\n\n");
    md.push_str("New TCP connections per second: on every path, three wrk processes run in parallel, each with 1 thread and 11 connections, `Connection: close` (one request per connection), `--latency`, for the same duration. conn/s, requests and errors are the sum of the three; p50 is the median of their three p50s and p99 the largest of their three p99s. Latency is wrk's per-request latency (request written → response read; the TCP handshake is not in it). On the direct paths the three wrk go to pod1, pod2 and pod3 (one each, on the pods' own addresses), so the limit spreads over the same three pods as the Service paths; on every other path all three go to the Service and the path's balancer spreads the connections. UDP: three `sb-http udp` clients in parallel, 3 flows each, request/response in lockstep (one client per pod on the direct paths, all three to the Service otherwise); rates summed, p50 the median and p99 the largest of the three. Bulk: one TCP stream, to pod1 on the direct paths, to the Service otherwise.\n\n");
    md.push_str("Where each path's clients run: the sandbox's client namespace stands for a pod, its node namespace for the host. The agent in the switchboard sandbox attaches its socket layer to that sandbox's own cgroup (`--cgroup-root`), so only processes in that cgroup are balanced at `connect()`: the socket-LB rows' clients join it before entering their namespace, the tc row's clients stay outside it and are translated per packet by the tc programs. For each switchboard row the run reads the agent's counters (`switchboard stats`) around each phase and checks the wrk phase: on the socket-LB rows the socket layer gave every TCP connection its backend and tc rewrote (next to) no packet; on the tc row the reverse (the growth of each phase is in results.json, `datapath_rounds`). The UDP clients' connected sockets are balanced by the socket layer on every socket-LB row, the pod client's as the host client's.\n\n");
    let listed = results["e2e_paths"].as_array().cloned().unwrap_or_default();
    if !listed.is_empty() {
        md.push_str("| path | sandbox | clients run in | they send to | balanced by |\n|---|---|---|---|---|\n");
        for p in &listed {
            let ports = p["client_local_ports"]
                .as_str()
                .map(|r| format!(", ephemeral ports {}", r.replace(' ', "–")))
                .unwrap_or_default();
            let _ = writeln!(
                md,
                "| {} | {} | {}{ports} | {} | {} |",
                p["label"].as_str().unwrap_or(""),
                p["sandbox"].as_str().unwrap_or(""),
                p["client"].as_str().unwrap_or(""),
                p["target"].as_str().unwrap_or(""),
                p["balancer"].as_str().unwrap_or(""),
            );
        }
        md.push('\n');
        if listed.iter().any(|p| p["client_local_ports"].is_string()) {
            md.push_str("Every pod client has an ephemeral port range of the same size (`net.ipv4.ip_local_port_range`, set before each of its measurements), so ports come round as often in every row. The tc row's client is a pod of its own in the switchboard sandbox (its own namespace, address and pod interface): its translated flows would otherwise keep the socket-LB rows' client pod from being quiet (`sb_to_pod` then looks up the conntrack table for every packet into it, where a pod whose connections the socket layer balanced needs no lookup), a cost of the tc row charged to the socket layer.\n\n");
        }
    }
    md.push_str("Each setup (direct, switchboard, iptables, nftables) has its own sandbox (so the conntrack hooks that NAT rules switch on stay out of the others); all four live at once and every path is measured in interleaved rounds (a different path first in each round); figures are medians over the rounds, and the conn/s of every round (and of each wrk client) is in results.json. The target Service sits in the middle of the Service list (kube-proxy's iptables mode matches Services in order). The direct paths (no Service) do not depend on the Services count; they are measured at every size as a reference for the noise.\n\n");
    let mut table = String::new();
    let _ = writeln!(table, "| path | Services | conn/s | p50 | p99 | UDP req/s | UDP p99 | 1 TCP stream | errors |\n|---|---|---|---|---|---|---|---|---|");
    for r in &e2e {
        let m = &r["m"];
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} µs | {} µs | {} | {} µs | {} Gbit/s | {} |",
            r["label"].as_str().or(r["path"].as_str()).unwrap_or(""),
            r["services"]
                .as_u64()
                .map(size_label)
                .unwrap_or_else(|| "–".into()),
            fmt_opt(f(&m["conn_per_s"]), 0),
            fmt_opt(f(&m["p50_us"]), 0),
            fmt_opt(f(&m["p99_us"]), 0),
            fmt_opt(f(&m["udp"]["rate"]), 0),
            fmt_opt(f(&m["udp"]["p99_us"]), 0),
            fmt_opt(f(&m["bulk"]["gbit_s"]), 2),
            m["errors"].as_u64().unwrap_or(0),
        );
    }
    md.push_str(&table);
    let _ = writeln!(
        md,
        "\nRatios (path ÷ other, new connections/s, same Services count):\n\n| Services | path | ÷ {} | ÷ {} | ÷ {} | ÷ {} |\n|---|---|---|---|---|---|",
        label_of(&paths, DIRECT),
        label_of(&paths, DIRECT_HOST),
        label_of(&paths, IPTABLES),
        label_of(&paths, NFTABLES)
    );
    for &n in &e2e_sizes {
        for (key, label) in &paths {
            let s = conn(&e2e, key, Some(n));
            let r = |o: &str| fmt_opt(s.zip(conn(&e2e, o, Some(n))).map(|(a, b)| a / b), 2);
            let _ = writeln!(
                md,
                "| {} | {label} | {} | {} | {} | {} |",
                size_label(n),
                r(DIRECT),
                r(DIRECT_HOST),
                r(IPTABLES),
                r(NFTABLES)
            );
        }
    }
    md.push_str("\n![new connections per second](conn_per_s.svg)\n");
    md.push_str(&super::paired::report_md(&results["e2e_paired"]));
    md.push_str(&super::progtime::report_md(
        results["e2e_program_time"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default(),
    ));

    // ---- per packet ----
    let _ = writeln!(
        md,
        "\n## Per-packet cost (BPF_PROG_TEST_RUN, {}-byte TCP frame, repeat {}, median of {} runs)\n",
        pp["frame_bytes"], pp["repeat"], pp["rounds"]
    );
    let _ = writeln!(
        md,
        "Floors on the same frame: empty tc program **{} ns**, empty XDP program **{} ns**. switchboard's XDP data path: {}.\n",
        fmt_opt(empty_tc, 1),
        fmt_opt(f(&pp["empty_xdp_ns"]), 1),
        pp["xdp_note"].as_str().unwrap_or("not implemented yet")
    );
    md.push_str("\"existing flow\": the two ping-pong Services A ⇄ B (see proxy-user/benches/sb_bench.rs) make every repetition a full lookup + conntrack hit + DNAT with checksum updates; the data path's own counters are checked to grow by exactly the repetitions. \"no rewrite\": a Service whose backend is itself (lookups and conntrack, rewrite helpers skipped). \"16 source ranges\": the same existing flow after Service A is restricted by `loadBalancerSourceRanges` (16 blocks): the one trie lookup a restricted frontend adds; every other column is a frontend without ranges, which pays one flag test and no lookup. Single-shot columns: `repeat = 1` per call (median of many), which includes the kernel timer's overhead — compare them only with each other (\"empty\" is the empty tc program measured the same way).\n\n");
    md.push_str("\"reply\": an ACK of the established flow from its backend; \"first reply\": the SYN-ACK, which no flow cache answers (a SYN-ACK may find a stale flow, so it always takes the table). Existing flows and replies repeat one flow, which each CPU's flow cache answers after the first repetition (`proxy-ebpf/src/ct/cache.rs`); \"to_pod non-service\" is a TCP segment of no tracked flow, which pays the cache's miss and the table's.\n\n");
    md.push_str("| Services | backends (target) | from_pod existing flow | from_pod no rewrite | from_pod, 16 source ranges | from_pod non-service (socket-balanced) | to_pod reply | to_pod first reply (SYN-ACK) | to_pod non-service | to_pod, quiet pod (socket-balanced) | single-shot: new flow | existing | empty |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &pp_rows {
        let ss = &r["single_shot"];
        let _ = writeln!(
            md,
            "| {} | {} | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns | {} ns |",
            size_label(r["services_nominal"].as_u64().unwrap_or(0)),
            r["target_backends"],
            fmt_opt(f(&r["from_pod_service_existing_ns"]), 1),
            fmt_opt(f(&r["from_pod_service_existing_no_rewrite_ns"]), 1),
            fmt_opt(f(&r["from_pod_service_existing_source_ranges_ns"]), 1),
            fmt_opt(f(&r["from_pod_non_service_ns"]), 1),
            fmt_opt(f(&r["to_pod_reply_ns"]), 1),
            fmt_opt(f(&r["to_pod_first_reply_ns"]), 1),
            fmt_opt(f(&r["to_pod_non_service_ns"]), 1),
            fmt_opt(f(&r["to_pod_quiet_ns"]), 1),
            fmt_opt(f(&ss["from_pod_service_new_ns"]), 0),
            fmt_opt(f(&ss["from_pod_service_existing_ns"]), 0),
            fmt_opt(f(&ss["empty_tc_ns"]), 0),
        );
    }
    md.push_str("\nRatios:\n\n| case | ");
    let _ = writeln!(
        md,
        "{} ÷ {} Services | ÷ empty tc (at {}) |\n|---|---|---|",
        size_label(largest),
        size_label(smallest),
        size_label(largest)
    );
    for (key, name) in [
        (
            "from_pod_service_existing_ns",
            "sb_from_pod, Service packet, existing flow",
        ),
        (
            "from_pod_service_existing_no_rewrite_ns",
            "sb_from_pod, existing flow, no rewrite",
        ),
        (
            "from_pod_service_existing_source_ranges_ns",
            "sb_from_pod, existing flow, 16 source ranges",
        ),
        (
            "from_pod_non_service_ns",
            "sb_from_pod, non-service packet (as a socket-balanced one)",
        ),
        ("to_pod_reply_ns", "sb_to_pod, reply"),
        ("to_pod_non_service_ns", "sb_to_pod, non-service packet"),
        (
            "to_pod_quiet_ns",
            "sb_to_pod, into a quiet pod (socket-balanced)",
        ),
    ] {
        let a = pp_at(smallest, 1, key);
        let b = pp_at(largest, 1, key);
        let _ = writeln!(
            md,
            "| {name} | {} | {} |",
            fmt_opt(a.zip(b).map(|(a, b)| b / a), 2),
            fmt_opt(b.zip(empty_tc).map(|(b, e)| b / e), 2)
        );
    }
    tracing_rows(&mut md, &pp_rows);
    md.push_str("\n![per-packet cost](perpacket.svg)\n");
    perpacket_ipv6(&mut md, &pp["ipv6"], &pp_at, empty_tc);
    perpacket_schedulers(&mut md, pp);

    // ---- control plane ----
    md.push_str("\n## Control plane\n\n| what | Services × endpoints | time |\n|---|---|---|\n");
    for run in &sync_runs {
        let n = size_label(run["services"].as_u64().unwrap_or(0));
        let e = &run["endpoints_per_service"];
        let _ = writeln!(
            md,
            "| switchboard: model (k8s objects → desired state) | {n} × {e} | {} ms |",
            fmt_opt(f(&run["model_ms"]), 1)
        );
        let _ = writeln!(
            md,
            "| switchboard: Syncer::apply into kernel maps ({} map writes) | {n} × {e} | {} ms |",
            run["map_writes"],
            fmt_opt(f(&run["apply_ms"]), 1)
        );
        let _ = writeln!(
            md,
            "| switchboard: apply again, nothing changed | {n} × {e} | {} ms |",
            fmt_opt(f(&run["noop_apply_ms"]), 1)
        );
    }
    for p in &programming {
        let _ = writeln!(
            md,
            "| {} | {} × 10 | {} ms |",
            p["tool"].as_str().unwrap_or(""),
            size_label(p["services"].as_u64().unwrap_or(0)),
            fmt_opt(f(&p["seconds"]).map(|s| s * 1000.0), 0)
        );
    }
    if scale.is_null() {
        // A run from before the scale section (`--report-only`).
        legacy_change_and_rss(&mut md, &sync_runs, &rss);
    } else {
        md.push_str(&super::scale::report::section(scale, &sync_runs));
    }

    // ---- forwarding ----
    let fmeta = &results["fwd"]["meta"];
    if let Some(why) = results["fwd"]["not_measured"].as_str() {
        let _ = writeln!(md, "\n## Forwarding rate, one core\n\n{why}.");
    } else {
        let _ = writeln!(
            md,
            "\n## Forwarding rate, one core (CPU {})\n\n{}. Frames: {} bytes UDP.\n\n| hook | setup | Mpps | ns/packet | frames reaching the pods |\n|---|---|---|---|---|",
            fmeta["cpu"],
            fmeta["generator"].as_str().unwrap_or(""),
            fmeta["frame_bytes"]
        );
    }
    for r in &fwd_rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            r["path"].as_str().unwrap_or(""),
            r["setup"].as_str().unwrap_or(""),
            fmt_opt(f(&r["mpps"]), 3),
            fmt_opt(f(&r["ns_per_packet"]), 0),
            r.get("reached_pods")
                .map(|v| format!("{v} of {}", r["frames"]))
                .unwrap_or_else(|| r["note"].as_str().unwrap_or("").to_string()),
        );
    }
    md.push('\n');
    if !ns.is_null() {
        md.push_str(&northsouth_section(ns));
    }
    fs::write(dir.join("report.md"), &md)?;

    // ---- plots ----
    if let Err(e) = plot_conn(&e2e, &paths, &e2e_sizes, &dir.join("conn_per_s.svg")) {
        eprintln!("bench: plot conn_per_s.svg: {e}");
    }
    if let Err(e) = plot_perpacket(&pp_rows, &sizes, empty_tc, &dir.join("perpacket.svg")) {
        eprintln!("bench: plot perpacket.svg: {e}");
    }
    Ok(headline + "\n" + &table)
}

/// The one-change and memory tables of runs from before the "Control plane
/// at scale" section.
fn legacy_change_and_rss(md: &mut String, sync_runs: &[Value], rss: &[Value]) {
    md.push_str("\nOne EndpointSlice change (one endpoint replaced) → maps written, the old way (rebuild the model from every object, then apply):\n\n| Services | total p50 | total p99 | model p50 | apply p50 | apply p99 | map writes |\n|---|---|---|---|---|---|---|\n");
    for run in sync_runs {
        let c = &run["one_slice_change"];
        let _ = writeln!(
            md,
            "| {} | {} ms | {} ms | {} ms | {} ms | {} ms | {} |",
            size_label(run["services"].as_u64().unwrap_or(0)),
            fmt_opt(f(&c["total"]["p50_ms"]), 2),
            fmt_opt(f(&c["total"]["p99_ms"]), 2),
            fmt_opt(f(&c["model"]["p50_ms"]), 2),
            fmt_opt(f(&c["apply"]["p50_ms"]), 2),
            fmt_opt(f(&c["apply"]["p99_ms"]), 2),
            c["writes_per_change_median"],
        );
    }
    md.push_str("\nAgent resident memory (a real `switchboard agent --source dir:` in a sandbox, fresh pins, Services × 10 endpoints as YAML):\n\n| Services | RSS | peak RSS | start → maps synced | manifests |\n|---|---|---|---|---|\n");
    for r in rss {
        let _ = writeln!(
            md,
            "| {} | {} MiB | {} MiB | {} s | {} MiB |",
            size_label(r["services"].as_u64().unwrap_or(0)),
            fmt_opt(f(&r["rss_mib"]), 1),
            fmt_opt(f(&r["peak_rss_mib"]), 1),
            fmt_opt(f(&r["startup_to_synced_s"]), 2),
            fmt_opt(f(&r["manifest_mib"]), 1),
        );
    }
}

const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];

/// Every path's connections/s by Services count; host-client paths dashed.
fn plot_conn(
    e2e: &[Value],
    paths: &[(String, String)],
    sizes: &[u64],
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let ymax = e2e
        .iter()
        .filter_map(|r| f(&r["m"]["conn_per_s"]))
        .fold(0.0f64, f64::max)
        * 1.6; // room for the legend above the lines
    let n = sizes.len().max(1);
    let labels: Vec<String> = sizes.iter().map(|s| size_label(*s)).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "New TCP connections per second (higher is better)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), 0f64..ymax.max(1.0))?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc("Services")
        .y_desc("connections/s")
        .draw()?;
    for (i, (key, label)) in paths.iter().enumerate() {
        let pts: Vec<(f64, f64)> = sizes
            .iter()
            .enumerate()
            .filter_map(|(x, s)| conn(e2e, key, Some(*s)).map(|v| (x as f64, v)))
            .collect();
        let color = COLORS[i % COLORS.len()];
        let style = color.stroke_width(2);
        let label = if key == DIRECT || key == DIRECT_HOST {
            format!("{label}: no Service, the limit")
        } else {
            label.clone()
        };
        let series = if label.contains("host client") {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style))?
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), style))?
        };
        series.label(label).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
        });
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The IPv6 rows of the per-packet section: the same cases through the
/// IPv6 pod path, next to the IPv4 figure at the same size (1 backend).
/// The algorithms of `sb_bench perpacket`'s scheduler figures in the
/// order the report lists them (any other the run names follows).
const SCHEDULERS: [&str; 4] = ["random", "round-robin", "least-conn", "weighted random"];

/// The names under `by` (a JSON object keyed by algorithm) in
/// [`SCHEDULERS`]' order, then the rest.
fn scheduler_names(by: &serde_json::Map<String, Value>) -> Vec<String> {
    let mut names: Vec<String> = SCHEDULERS
        .iter()
        .filter(|n| by.contains_key(**n))
        .map(|n| n.to_string())
        .collect();
    let rest: Vec<String> = by
        .keys()
        .filter(|k| !SCHEDULERS.contains(&k.as_str()))
        .cloned()
        .collect();
    names.extend(rest);
    names
}

/// The per-node schedulers (issue 23), from `sb_bench perpacket`: a new
/// flow's single-shot cost under each algorithm next to `random` (each
/// row's `single_shot.from_pod_service_new_by_algorithm_ns`), and the
/// balance over mixed-length flows against IPVS `lc`'s ideal
/// (`scheduler_balance`). Nothing when the run has neither.
fn perpacket_schedulers(md: &mut String, pp: &Value) {
    let rows: Vec<&Value> = pp["rows"]
        .as_array()
        .map(|r| r.iter().collect())
        .unwrap_or_default();
    let by_row: Vec<(&Value, &serde_json::Map<String, Value>)> = rows
        .iter()
        .filter_map(|r| {
            let by = r["single_shot"]["from_pod_service_new_by_algorithm_ns"].as_object()?;
            Some((*r, by))
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
            let random = f(&by.get("random").cloned().unwrap_or(Value::Null)["ns"]);
            let _ = write!(
                md,
                "| {} | {} |",
                size_label(r["services_nominal"].as_u64().unwrap_or(0)),
                r["target_backends"]
            );
            for name in &names {
                let cell = by.get(name).cloned().unwrap_or(Value::Null);
                let (ns, lo, hi) = (f(&cell["ns"]), f(&cell["min"]), f(&cell["max"]));
                let ratio = |v: Option<f64>| v.zip(random).map(|(v, r)| v / r);
                if name == "random" {
                    let _ = write!(md, " {} ns |", fmt_opt(ns, 0));
                } else {
                    let _ = write!(
                        md,
                        " {} ({}–{}) |",
                        fmt_opt(ratio(ns), 2),
                        fmt_opt(ratio(lo), 2),
                        fmt_opt(ratio(hi), 2)
                    );
                }
            }
            md.push('\n');
        }
    }
    let balance = &pp["scheduler_balance"];
    let Some(rows) = balance["rows"].as_array() else {
        return;
    };
    let ideal = rows
        .iter()
        .find(|r| {
            r["algorithm"]
                .as_str()
                .is_some_and(|a| a.starts_with("ideal"))
        })
        .and_then(|r| f(&r["max_over_mean_avg"]));
    let _ = writeln!(
        md,
        "\n## Schedulers: balance\n\n{} new flows to one Service of {} backends through `sb_from_pod`, one per step, lengths {}; each flow closes with an RST through the program. After each new flow past the first {}: the most loaded backend's active flows ÷ the mean (1.00 is perfect). IPVS `lc`'s ideal (always a least loaded backend) is computed on the same flows.\n",
        balance["flows"], balance["backends"], balance["lengths"].as_str().unwrap_or("mixed"), balance["warmup_flows"]
    );
    md.push_str("| algorithm | max ÷ mean, average | worst | average ÷ IPVS lc's ideal |\n|---|---|---|---|\n");
    for r in rows {
        let avg = f(&r["max_over_mean_avg"]);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            r["algorithm"].as_str().unwrap_or("?"),
            fmt_opt(avg, 2),
            fmt_opt(f(&r["max_over_mean_worst"]), 2),
            fmt_opt(avg.zip(ideal).map(|(a, i)| a / i), 2)
        );
    }
}

fn perpacket_ipv6(
    md: &mut String,
    ipv6: &Value,
    pp_at: &dyn Fn(u64, u64, &str) -> Option<f64>,
    empty_tc: Option<f64>,
) {
    let Some(rows) = ipv6["rows"].as_array() else {
        return;
    };
    let _ = writeln!(
        md,
        "\n### IPv6 ({}-byte TCP frame: the same payload, a 40-byte IPv6 header)\n",
        ipv6["frame_bytes"]
    );
    md.push_str("The IPv6 ping-pong pair beside the IPv4 rows' state (that many IPv4 Services, and up to 10k IPv6 ones).\n\n");
    md.push_str("| Services | case | IPv6 | × empty tc | IPv4 (same size) | IPv6 ÷ IPv4 |\n|---|---|---|---|---|---|\n");
    for r in rows {
        let size = r["services_nominal"].as_u64().unwrap_or(0);
        for (key, name) in [
            ("from_pod_service_existing_ns", "sb_from_pod, existing flow"),
            ("from_pod_non_service_ns", "sb_from_pod, non-service"),
            ("to_pod_reply_ns", "sb_to_pod, reply"),
            ("to_pod_first_reply_ns", "sb_to_pod, first reply (SYN-ACK)"),
        ] {
            let v6 = r[key].as_f64();
            let v4 = pp_at(size, 1, key);
            let _ = writeln!(
                md,
                "| {} | {name} | {} ns | {} | {} ns | {} |",
                size_label(size),
                fmt_opt(v6, 1),
                fmt_opt(v6.zip(empty_tc).map(|(a, e)| a / e), 2),
                fmt_opt(v4, 1),
                fmt_opt(v6.zip(v4).map(|(a, b)| a / b), 2),
            );
        }
    }
}

fn plot_perpacket(
    rows: &[Value],
    sizes: &[u64],
    empty: Option<f64>,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let keys = [
        (
            "from_pod_service_existing_ns",
            "sb_from_pod, Service, existing flow",
        ),
        ("from_pod_non_service_ns", "sb_from_pod, non-service"),
        ("to_pod_reply_ns", "sb_to_pod, reply"),
        ("to_pod_non_service_ns", "sb_to_pod, non-service"),
    ];
    let ymax = rows
        .iter()
        .flat_map(|r| keys.iter().filter_map(move |(k, _)| f(&r[*k])))
        .fold(empty.unwrap_or(0.0), f64::max)
        * 1.2;
    let n = sizes.len().max(1);
    let labels: Vec<String> = sizes.iter().map(|s| size_label(*s)).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Per-packet cost, tc (lower is better; 1 backend per Service)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.3f64..(n as f64 - 0.7), 0f64..ymax.max(1.0))?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                labels.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc("Services loaded")
        .y_desc("ns per packet")
        .draw()?;
    for (i, (key, name)) in keys.iter().enumerate() {
        let pts: Vec<(f64, f64)> = sizes
            .iter()
            .enumerate()
            .filter_map(|(x, s)| {
                rows.iter()
                    .find(|r| {
                        r["services_nominal"].as_u64() == Some(*s)
                            && r["target_backends"].as_u64() == Some(1)
                    })
                    .and_then(|r| f(&r[*key]))
                    .map(|v| (x as f64, v))
            })
            .collect();
        let color = COLORS[i];
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    if let Some(e) = empty {
        chart
            .draw_series(LineSeries::new(
                vec![(-0.3, e), (n as f64 - 0.7, e)],
                COLORS[4].stroke_width(2),
            ))?
            .label("empty tc program (floor)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], COLORS[4]));
        chart
            .draw_series(LineSeries::new(
                vec![(-0.3, 3.0 * e), (n as f64 - 0.7, 3.0 * e)],
                BLACK.mix(0.4).stroke_width(1),
            ))?
            .label("3 × empty (goal)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// What limits the goals, computed from this run's figures: how the per-packet
/// cost splits, and whether a conn/s target is reachable at all below the
/// direct (no load balancer) limit measured in the same run.
fn limits(
    e2e: &[Value],
    at: Option<u64>,
    pp_rows: &[Value],
    largest: u64,
    empty_tc: Option<f64>,
) -> String {
    let mut out = String::from("\nWhat limits them, from this run's figures:\n\n");
    let row = pp_rows.iter().find(|r| {
        r["services_nominal"].as_u64() == Some(largest) && r["target_backends"].as_u64() == Some(1)
    });
    if let (Some(row), Some(empty)) = (row, empty_tc) {
        let ns = |key: &str| f(&row[key]).unwrap_or(f64::NAN);
        let (hit, plain, miss, reply, first_reply) = (
            ns("from_pod_service_existing_ns"),
            ns("from_pod_service_existing_no_rewrite_ns"),
            ns("from_pod_non_service_ns"),
            ns("to_pod_reply_ns"),
            ns("to_pod_first_reply_ns"),
        );
        let _ = writeln!(
            out,
            "- per packet ({} Services): the empty program is {empty:.1} ns; a header read and one bit of the frontend bitmap (no parse) bring a non-service packet to {miss:.1} ns; the parse, this CPU's flow cache (one slot read and compared: no hash-table lookup, no frontend lookup) and the counters bring an established flow's packet to {plain:.1} ns ({:.2} × empty) before any byte is written; the rewrite (the address, the port and both checksums stored directly, the L4 one updated in place as the skb's `ip_summed` says, read through the kfunc `bpf_cast_to_kern_ctx`) adds {:.1} ns. A reply from the cache is {reply:.1} ns; the first reply (the SYN-ACK), which takes the table (jhash of the 16-byte key, the bucket walk, the compare), {first_reply:.1} ns: that lookup is the difference.",
            size_label(largest),
            plain / empty,
            hit - plain,
        );
    }
    let label = at.map(size_label).unwrap_or_default();
    if let Some(direct) = conn(e2e, DIRECT, at) {
        for (other, name, factor) in [(IPTABLES, "iptables", 3.0), (NFTABLES, "nftables", 1.2)] {
            if let Some(base) = conn(e2e, other, at) {
                let need = base * factor;
                let _ = writeln!(
                    out,
                    "- {factor} × {name} at {label} Services would be {need:.0} conn/s: {:.2} × the direct limit ({direct:.0} conn/s, no load balancer at all){}.",
                    need / direct,
                    if need > direct {
                        ", so no load balancer can reach it on this machine; the ratio is bounded by direct ÷ "
                            .to_string()
                            + name
                            + &format!(" = {:.2}", direct / base)
                    } else {
                        String::new()
                    }
                );
            }
        }
        let rounds = e2e_row(e2e, DIRECT, at)
            .and_then(|r| r["m"]["conn_per_s_rounds"].as_array().cloned())
            .unwrap_or_default();
        let v: Vec<f64> = rounds.iter().filter_map(Value::as_f64).collect();
        if let (Some(lo), Some(hi)) = (
            v.iter().copied().reduce(f64::min),
            v.iter().copied().reduce(f64::max),
        ) {
            let _ = writeln!(
                out,
                "- ÷ direct: the direct limit itself moved between {lo:.0} and {hi:.0} conn/s over the rounds ({:.0} % of its median), which is as large as the 5 % the target allows.",
                (hi - lo) / direct * 100.0
            );
        }
        explain_socket_gap(&mut out, e2e, at, direct);
    }
    out
}

/// Where the socket layer's gap to the direct limit lies, from the rows that
/// take it apart: the same client on a switchboard node with no Service
/// (control), the socket layer with one pod per client (as direct), and
/// direct traffic spread over the pods per connection (as a balancer).
fn explain_socket_gap(out: &mut String, e2e: &[Value], at: Option<u64>, direct: f64) {
    let c = |key| conn(e2e, key, at);
    if let Some(inside) = c(DIRECT_SW) {
        let _ = writeln!(
            out,
            "- being on a switchboard node: the same pod client sending to the pods' own addresses inside switchboard's sandbox (agent, tc programs, socket hooks, no Service) makes {inside:.0} conn/s, {:.2} × direct.",
            inside / direct
        );
        if let Some(pinned) = c(SW_SOCK_PINNED) {
            let _ = writeln!(
                out,
                "- the socket layer's own work per connect (frontend lookup, backend pick, the socket's storage): with each client held to one pod as in that row, socket-LB makes {pinned:.0} conn/s, {:.2} × that row.",
                pinned / inside
            );
        }
    }
    if let (Some(spread), Some(sock)) = (c(DIRECT_SPREAD), c(SW_SOCK_POD)) {
        let _ = writeln!(
            out,
            "- spreading: with no balancer at all, each client's connections spread over the three pods by the node's multipath route make {spread:.0} conn/s, {:.2} × direct (each client then wakes three servers rather than one on two cores); the socket layer spreading the same way is {:.2} × that.",
            spread / direct,
            sock / spread
        );
    }
}

// ---------------------------------------------------------------------------
// North-south
// ---------------------------------------------------------------------------

fn ns_row<'a>(ns: &'a Value, key: &str) -> Option<&'a Value> {
    ns["rows"].as_array()?.iter().find(|r| r["path"] == key)
}

fn ns_m(ns: &Value, key: &str, field: &str) -> Option<f64> {
    ns_row(ns, key).and_then(|r| f(&r["m"][field]))
}

fn uplink_case<'a>(ns: &'a Value, program: &str, case: &str) -> Option<&'a Value> {
    ns["perpacket"]["rows"].as_array()?.iter().find(|r| {
        r["program"] == program && r["case"].as_str().is_some_and(|c| c.starts_with(case))
    })
}

/// The north-south targets: the XDP program ≤ 3 × an empty XDP program per
/// packet, and the forwarding rate's ([`super::xdpfwd::goals`]).
fn northsouth_goals(ns: &Value) -> Vec<Goal> {
    let mut goals = Vec::new();
    for (case, label) in [
        (
            "existing local flow",
            "existing local flow, DNAT → XDP_PASS",
        ),
        (
            "existing remote flow",
            "existing remote flow, DNAT+SNAT+fib → XDP_TX (single runs, timer corrected)",
        ),
        ("not ours", "not ours → XDP_PASS"),
    ] {
        let row = uplink_case(ns, "sb_xdp_uplink", case);
        let ratio = row.and_then(|r| f(&r["ratio"]));
        goals.push(Goal {
            what: format!("sb_xdp_uplink ÷ empty XDP program ({label})"),
            goal: "≤ 3".into(),
            measured: format!(
                "{} ({} ns ÷ {} ns)",
                fmt_opt(ratio, 2),
                fmt_opt(row.and_then(|r| f(&r["ns"])), 1),
                fmt_opt(row.and_then(|r| f(&r["empty_ns"])), 1)
            ),
            met: ratio.map(|r| r <= 3.0),
        });
    }
    // The forwarding rate without a userspace sender in the way (the
    // end-to-end flood's figures stay in the section, not among the goals:
    // there the sender shares the core).
    goals.extend(super::xdpfwd::goals(&ns["xdpfwd"]));
    goals
}

fn northsouth_section(ns: &Value) -> String {
    use super::northsouth::{
        NS_DIRECT_LOCAL, NS_DIRECT_REMOTE, NS_IPT_LOCAL, NS_IPT_REMOTE, NS_TC_LOCAL, NS_TC_REMOTE,
        NS_XDP_LOCAL, NS_XDP_REMOTE,
    };
    let meta = &ns["meta"];
    let pp = &ns["perpacket"];
    let mut md =
        String::from("\n## North-south: external client → NodePort (two-node sandbox)\n\n");
    md.push_str("The two-node sandbox (`xtask/src/sandbox/two_node.rs`): a LAN bridge, node A 192.168.50.1 and node B .2, two pods per node, external clients .100 and .101. Two NodePort Services on node A (`externalTrafficPolicy: Cluster`): `bench/np-local` (TCP 30080 → 8080, UDP 30090 → 9) with node A's two pods, `bench/np-remote` (30081, 30091) with node B's two pods, so node A DNATs to a local backend, or DNATs and SNATs to a backend on node B. Three sandboxes live at once (direct; switchboard's agent on node A, restarted per `--xdp-mode`, the mode checked on the uplink with `ip link`; kube-proxy-style iptables NodePort rules in node A's namespace, no agent), and the paths are measured in interleaved rounds (medians). Every pod runs `sb-http`.\n\n");
    md.push_str("**Remote backends go through XDP in generic mode**: native XDP_TX from a veth reaches its peer only when the peer has an XDP program (the bridge ports of this sandbox have none), so the remote XDP path runs with `--xdp-mode generic` (an skb is allocated before the program runs, then XDP_TX goes out through the stack's transmit path); local backends (XDP_PASS) use native XDP. Everything is veth: no NIC, no driver XDP.\n\n");
    if let Some(paths) = ns["paths"].as_array() {
        md.push_str("| path | backends | client | through |\n|---|---|---|---|\n");
        for p in paths {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                p["label"].as_str().unwrap_or(""),
                p["backends"].as_str().unwrap_or(""),
                p["client"].as_str().unwrap_or(""),
                p["via"].as_str().unwrap_or("")
            );
        }
        md.push('\n');
    }
    let _ = writeln!(
        md,
        "New TCP connections/s: two wrk in parallel (`-t 1 -c 11`, `Connection: close`, {} s), both to the NodePort (direct: one to each pod's own address, from the other client, so no pod sees a client tuple both translated and direct). Forwarding rate: `sb_bench flood` (sendmmsg, {} UDP flows, 60-byte frames, {} s) pinned to CPU {} in the client's namespace; what reached the backend pods is read from their `/proc/net/snmp` (Udp InDatagrams + NoPorts + InErrors; nothing listens on UDP 9). On veths the whole path (the sender's syscalls, the bridge, node A, node B for remote, the pods' receive) runs in the sending CPU's softirq, so the rate is one core's for the sender and the forwarding together.\n",
        meta["wrk_secs"], meta["flood_flows"], meta["flood_secs"], meta["flood_cpu"]
    );
    md.push_str("| path | conn/s | p50 | p99 | errors | Mpps at the pods (one core) | Mpps sent |\n|---|---|---|---|---|---|---|\n");
    for key in [
        NS_DIRECT_LOCAL,
        NS_XDP_LOCAL,
        NS_TC_LOCAL,
        NS_IPT_LOCAL,
        NS_DIRECT_REMOTE,
        NS_XDP_REMOTE,
        NS_TC_REMOTE,
        NS_IPT_REMOTE,
    ] {
        let Some(r) = ns_row(ns, key) else { continue };
        let m = &r["m"];
        let _ = writeln!(
            md,
            "| {} | {} | {} µs | {} µs | {} | {} | {} |",
            r["label"].as_str().unwrap_or(key),
            fmt_opt(f(&m["conn_per_s"]), 0),
            fmt_opt(f(&m["p50_us"]), 0),
            fmt_opt(f(&m["p99_us"]), 0),
            m["errors"].as_u64().unwrap_or(0),
            fmt_opt(f(&m["flood_mpps"]), 3),
            fmt_opt(f(&m["flood_sent_mpps"]), 3),
        );
    }
    md.push_str("\nRatios (same run):\n\n| | conn/s | Mpps |\n|---|---|---|\n");
    let ratio = |a: &str, b: &str, field: &str| {
        ns_m(ns, a, field)
            .zip(ns_m(ns, b, field))
            .map(|(a, b)| a / b)
    };
    for (a, b, name) in [
        (NS_XDP_LOCAL, NS_IPT_LOCAL, "XDP ÷ iptables, local backends"),
        (
            NS_XDP_REMOTE,
            NS_IPT_REMOTE,
            "XDP ÷ iptables, remote backends",
        ),
        (
            NS_TC_LOCAL,
            NS_IPT_LOCAL,
            "tc only ÷ iptables, local backends",
        ),
        (
            NS_TC_REMOTE,
            NS_IPT_REMOTE,
            "tc only ÷ iptables, remote backends",
        ),
        (NS_XDP_LOCAL, NS_TC_LOCAL, "XDP ÷ tc only, local backends"),
        (
            NS_XDP_REMOTE,
            NS_TC_REMOTE,
            "XDP ÷ tc only, remote backends",
        ),
        (
            NS_XDP_LOCAL,
            NS_DIRECT_LOCAL,
            "XDP ÷ direct, local backends",
        ),
        (
            NS_XDP_REMOTE,
            NS_DIRECT_REMOTE,
            "XDP ÷ direct, remote backends",
        ),
    ] {
        let _ = writeln!(
            md,
            "| {name} | {} | {} |",
            fmt_opt(ratio(a, b, "conn_per_s"), 2),
            fmt_opt(ratio(a, b, "flood_mpps"), 2)
        );
    }
    // What limits the forwarding target.
    let (x, i, d) = (
        ns_m(ns, NS_XDP_REMOTE, "flood_mpps"),
        ns_m(ns, NS_IPT_REMOTE, "flood_mpps"),
        ns_m(ns, NS_DIRECT_REMOTE, "flood_mpps"),
    );
    if let (Some(x), Some(i), Some(d)) = (x, i, d) {
        let _ = writeln!(
            md,
            "\nWhat limits the forwarding ratio, from these figures: per packet the core spends {:.0} ns through XDP, {:.0} ns through iptables and {:.0} ns on the direct path (plain forwarding, no Service), all including the sender's own sendmmsg and the veth/bridge hops, which are the same on every path. The part that differs between XDP and iptables is {:.0} ns per packet; the shared part (≈ the direct path) is {:.0} ns. Even a load balancer that cost nothing could reach at most {:.2} × iptables on this setup (iptables ÷ direct time), so the 2 × target is {}. Generic XDP on the remote path also allocates the skb before the program runs and transmits XDP_TX through the stack, which native XDP on a NIC would not.",
            1e3 / x,
            1e3 / i,
            1e3 / d,
            1e3 / i - 1e3 / x,
            1e3 / d,
            (1e3 / i) / (1e3 / d),
            if (1e3 / i) / (1e3 / d) < 2.0 { "out of reach with the sender on the same core" } else { "reachable in principle" }
        );
    }
    md.push_str(&super::xdpfwd::section(&ns["xdpfwd"]));
    // Per packet.
    let _ = writeln!(
        md,
        "\n### North-south per packet (BPF_PROG_TEST_RUN)\n\n{}.\n\nEmpty XDP {} ns, empty tc {} ns (repeat {}); single runs carry the kernel timer's own cost ({} ns for XDP, {} ns for tc: single empty run − repeated empty run), which the single-run rows subtract (check: the local flow's corrected single run is {} ns against {} ns repeated).\n\n| program | case | verdict | ns | ÷ empty | measured by |\n|---|---|---|---|---|---|",
        pp["method"].as_str().unwrap_or(""),
        fmt_opt(f(&pp["empty_xdp_ns"]), 1),
        fmt_opt(f(&pp["empty_tc_ns"]), 1),
        pp["repeat"],
        fmt_opt(f(&pp["timer_overhead_xdp_ns"]), 1),
        fmt_opt(f(&pp["timer_overhead_tc_ns"]), 1),
        fmt_opt(f(&pp["check_local_single_corrected_xdp_ns"]), 1),
        fmt_opt(uplink_case(ns, "sb_xdp_uplink", "existing local flow").and_then(|r| f(&r["ns"])), 1),
    );
    for r in pp["rows"].as_array().cloned().unwrap_or_default() {
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {} | {} | {} |",
            r["program"].as_str().unwrap_or(""),
            r["case"].as_str().unwrap_or(""),
            r["verdict"].as_str().unwrap_or(""),
            fmt_opt(f(&r["ns"]), 1),
            fmt_opt(f(&r["ratio"]), 2),
            r["how"].as_str().unwrap_or(""),
        );
    }
    let _ = writeln!(
        md,
        "\n<details><summary>iptables NodePort rules loaded into node A (iptables-restore)</summary>\n\n```\n{}```\n</details>\n",
        meta["iptables_rules"].as_str().unwrap_or("")
    );
    md
}

/// The live trace's cost: the existing flow and a new flow's single shot
/// with every event kind switched on (an existing flow's packet writes no
/// event; each new flow writes one, drained between samples), beside the
/// same figures with tracing off.
fn tracing_rows(md: &mut String, rows: &[Value]) {
    md.push_str("\nThe live trace (`switchboard trace`): the same packets with every event kind switched on, beside the figures above, taken with it off (the switch is one load and one branch per call site; an existing flow's packet writes no event, a new flow writes one to the ring buffer). The single-shot columns are medians of different samples (tracing on: at most 2000 new flows, after the others), so they move by more than the event's cost; the existing-flow columns compare like for like.\n\n| Services | backends (target) | existing flow, tracing off | tracing on | single-shot new flow, tracing off | tracing on |\n|---|---|---|---|---|---|\n");
    for r in rows {
        let on = &r["tracing_on"];
        let _ = writeln!(
            md,
            "| {} | {} | {} ns | {} ns | {} ns | {} ns |",
            size_label(r["services_nominal"].as_u64().unwrap_or(0)),
            r["target_backends"],
            fmt_opt(f(&r["from_pod_service_existing_ns"]), 0),
            fmt_opt(f(&on["from_pod_service_existing_ns"]), 0),
            fmt_opt(f(&r["single_shot"]["from_pod_service_new_ns"]), 0),
            fmt_opt(f(&on["single_shot_from_pod_service_new_ns"]), 0),
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
        let pp = serde_json::json!({
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
        });
        let mut md = String::new();
        perpacket_schedulers(&mut md, &pp);
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
        perpacket_schedulers(&mut none, &serde_json::json!({"rows": [{}]}));
        assert!(none.is_empty());
    }
}
