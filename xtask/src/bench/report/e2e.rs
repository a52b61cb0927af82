//! The end-to-end section: how the paths are measured, where their
//! clients run, each path's figures and ratios at every size, the paired
//! phases and switchboard's programs per connection.

use std::fmt::Write as _;

use crate::bench::fmt::{fmt_opt, size_label};
use crate::bench::paths::{DIRECT, DIRECT_HOST, IPTABLES, NFTABLES};
use crate::bench::results::{label_of, E2eRow, Paired, PairedPath, PathInfo, ProgTimeRow, Results};

/// The section, and its conn/s table (printed again at the end of a run).
pub fn section(results: &Results) -> (String, String) {
    let mut md = String::new();
    md.push_str("\n## End to end (netns sandbox: client → node → 3 pods)\n\n");
    md.push_str("New TCP connections per second: on every path, three wrk processes run in parallel, each with 1 thread and 11 connections, `Connection: close` (one request per connection), `--latency`, for the same duration. conn/s, requests and errors are the sum of the three; p50 is the median of their three p50s and p99 the largest of their three p99s. Latency is wrk's per-request latency (request written → response read; the TCP handshake is not in it). On the direct paths the three wrk go to pod1, pod2 and pod3 (one each, on the pods' own addresses), so the limit spreads over the same three pods as the Service paths; on every other path all three go to the Service and the path's balancer spreads the connections. UDP: three `sb-http udp` clients in parallel, 3 flows each, request/response in lockstep (one client per pod on the direct paths, all three to the Service otherwise); rates summed, p50 the median and p99 the largest of the three. Bulk: one TCP stream, to pod1 on the direct paths, to the Service otherwise.\n\n");
    md.push_str("Where each path's clients run: the sandbox's client namespace stands for a pod, its node namespace for the host. The agent in the switchboard sandbox attaches its socket layer to that sandbox's own cgroup (`--cgroup-root`), so only processes in that cgroup are balanced at `connect()`: the socket-LB rows' clients join it before entering their namespace, the tc row's clients stay outside it and are translated per packet by the tc programs. For each switchboard row the run reads the agent's counters (`switchboard stats`) around each phase and checks the wrk phase: on the socket-LB rows the socket layer gave every TCP connection its backend and tc rewrote (next to) no packet; on the tc row the reverse (the growth of each phase is in results.json, `datapath_rounds`). The UDP clients' connected sockets are balanced by the socket layer on every socket-LB row, the pod client's as the host client's.\n\n");
    paths_table(&mut md, results.e2e_paths.as_deref().unwrap_or_default());
    md.push_str("Each setup (direct, switchboard, iptables, nftables) has its own sandbox (so the conntrack hooks that NAT rules switch on stay out of the others); all four live at once and every path is measured in interleaved rounds (a different path first in each round); figures are medians over the rounds, and the conn/s of every round (and of each wrk client) is in results.json. The target Service sits in the middle of the Service list (kube-proxy's iptables mode matches Services in order). The direct paths (no Service) do not depend on the Services count; they are measured at every size as a reference for the noise.\n\n");
    let table = conn_table(results.e2e());
    md.push_str(&table);
    ratios(&mut md, results);
    md.push_str("\n![new connections per second](conn_per_s.svg)\n");
    if let Some(paired) = results.paired() {
        md.push_str(&paired_section(paired));
    }
    md.push_str(&program_time(
        results.e2e_program_time.as_deref().unwrap_or_default(),
    ));
    (md, table)
}

/// Where each path's clients run and what balances them.
fn paths_table(md: &mut String, listed: &[PathInfo]) {
    if listed.is_empty() {
        return;
    }
    md.push_str(
        "| path | sandbox | clients run in | they send to | balanced by |\n|---|---|---|---|---|\n",
    );
    for p in listed {
        let ports = p
            .client_local_ports
            .as_deref()
            .map(|r| format!(", ephemeral ports {}", r.replace(' ', "–")))
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} | {}{ports} | {} | {} |",
            p.label, p.sandbox, p.client, p.target, p.balancer,
        );
    }
    md.push('\n');
    if listed.iter().any(|p| p.client_local_ports.is_some()) {
        md.push_str("Every pod client has an ephemeral port range of the same size (`net.ipv4.ip_local_port_range`, set before each of its measurements), so ports come round as often in every row. The tc row's client is a pod of its own in the switchboard sandbox (its own namespace, address and pod interface): its translated flows would otherwise keep the socket-LB rows' client pod from being quiet (`sb_to_pod` then looks up the conntrack table for every packet into it, where a pod whose connections the socket layer balanced needs no lookup), a cost of the tc row charged to the socket layer.\n\n");
    }
}

/// Every path at every size: conn/s, latency, UDP, the stream, errors.
fn conn_table(e2e: &[E2eRow]) -> String {
    let mut table = String::new();
    let _ = writeln!(table, "| path | Services | conn/s | p50 | p99 | UDP req/s | UDP p99 | 1 TCP stream | errors |\n|---|---|---|---|---|---|---|---|---|");
    for r in e2e {
        let m = &r.m;
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} µs | {} µs | {} | {} µs | {} Gbit/s | {} |",
            r.label.as_deref().unwrap_or(&r.path),
            r.services.map(size_label).unwrap_or_else(|| "–".into()),
            fmt_opt(m.conn_per_s, 0),
            fmt_opt(m.p50_us, 0),
            fmt_opt(m.p99_us, 0),
            fmt_opt(m.udp.rate, 0),
            fmt_opt(m.udp.p99_us, 0),
            fmt_opt(m.bulk.gbit_s, 2),
            m.errors,
        );
    }
    table
}

/// Each path's conn/s ÷ the direct limits and the NAT rows, per size.
fn ratios(md: &mut String, results: &Results) {
    let paths = results.e2e_paths();
    let _ = writeln!(
        md,
        "\nRatios (path ÷ other, new connections/s, same Services count):\n\n| Services | path | ÷ {} | ÷ {} | ÷ {} | ÷ {} |\n|---|---|---|---|---|---|",
        label_of(&paths, DIRECT),
        label_of(&paths, DIRECT_HOST),
        label_of(&paths, IPTABLES),
        label_of(&paths, NFTABLES)
    );
    for n in results.e2e_sizes() {
        for (key, label) in &paths {
            let s = results.conn(key, Some(n));
            let r = |o: &str| fmt_opt(s.zip(results.conn(o, Some(n))).map(|(a, b)| a / b), 2);
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
}

/// The paired phases: each path's median rate and its ratio to the limit
/// with the quartiles.
fn paired_section(paired: &Paired) -> String {
    let mut md = format!(
        "\n### Paired conn/s ({} Services)\n\nEach path the conn/s goals compare, in a {} s wrk phase between two phases of the direct spread (the same three clients and connections as above; no UDP or stream in between), {} repetitions in a rotated order. A path's rate is divided by the mean of the two direct-spread phases around it; the goals take the median of these ratios, with their first and third quartiles, because a drift of the machine between the rounds above (minutes apart) moves a ratio of medians by as much as the targets' margins. The direct spread runs between every two paths so that its sandbox and switchboard's are each busy half of the time.\n\n| path | conn/s (median) | ÷ direct spread, paired: median | quartiles |\n|---|---|---|---|\n",
        paired.services,
        paired.phase_secs,
        paired.repetitions
    );
    paired_rows(&mut md, &paired.paths);
    if !paired.light.is_empty() {
        md.push_str("\nThe light workload ([below](#light-workload)), in the same repetitions (each repetition runs the default workload's phases, then the light workload's, the light direct spread between every two paths):\n\n| path | conn/s (median) | ÷ direct spread, paired: median | quartiles |\n|---|---|---|---|\n");
        paired_rows(&mut md, &paired.light);
    }
    md
}

/// One table row per path of the paired phases.
fn paired_rows(md: &mut String, rows: &[PairedPath]) {
    for row in rows {
        let f = |v: Option<f64>| v.unwrap_or(f64::NAN);
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.3} | {:.3}–{:.3} |",
            row.label,
            f(row.conn_per_s),
            f(row.ratio),
            f(row.ratio_q1),
            f(row.ratio_q3)
        );
    }
}

/// switchboard's programs per connection: one row per path and size.
fn program_time(rows: &[ProgTimeRow]) -> String {
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
        let t = &r.time;
        let parts: Vec<String> = t
            .programs
            .iter()
            .map(|(name, p)| format!("`{name}` {:.1} × {:.0}", p.runs_per_conn, p.ns_per_run))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {:.2} µs | {:.1} µs | {:.1} % |",
            r.label,
            r.services,
            r.conn_per_s,
            parts.join(", "),
            t.programs_ns_per_conn / 1000.0,
            t.busy_ns_per_conn / 1000.0,
            t.share * 100.0,
        );
    }
    md
}
