//! Netns end-to-end test of connection tracking under pressure (root only):
//! idle long-lived connections through a Service survive a burst of short
//! connections many times the table's size. With an LRU table the burst
//! evicts their entries and their next packets go to a random backend,
//! which resets them.
//!
//! The clients run in the client (pod) namespace outside the socket layer's
//! cgroup, so every packet takes the tc path (`sb_from_pod`/`sb_to_pod`);
//! one flood comes from outside through a node's uplink instead.
//! Binaries as in e2e.rs (SWITCHBOARD_BIN, SB_ECHO_BIN).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use xtask::sandbox::two_node::manifests::{Policy, NODEPORT_TCP};
use xtask::sandbox::two_node::{Client, Node, Pod};
use xtask::sandbox::{Attempt, ClientRun, Sandbox, CLUSTER_IP};
use xtask::testenv::{
    counter, demo_sandbox_with, open_idle_with, sb_echo, sb_echo_in, switchboard, switchboard_out,
    two_node_with_agents, wake, IdleClient,
};

/// `--max-conntrack`: 256 flows.
const CAPACITY: usize = 512;
/// Long-lived connections left idle: with a random backend after eviction,
/// each survives by luck one time in three, all three one time in 27.
const IDLE: usize = 3;

fn open_idle(sb: &Sandbox, addr: &str) -> IdleClient {
    open_idle_with(&|args| sb_echo_in(sb, &sb.client_ns(), args), addr)
}

/// `switchboard conntrack list`'s forward TCP rows: (source, state,
/// seconds to expiry).
fn forward_tcp_rows(pin: &Path) -> Vec<(String, String, f64)> {
    let out = switchboard_out(&["conntrack", "list", "-o", "json"], pin);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out).expect("conntrack json");
    rows.iter()
        .filter(|r| r["direction"] == "forward" && r["protocol"] == "TCP")
        .map(|r| {
            (
                r["source"].as_str().unwrap_or("").to_owned(),
                r["state"].as_str().unwrap_or("").to_owned(),
                r["expires_in_s"].as_f64().unwrap_or(0.0),
            )
        })
        .collect()
}

#[test]
fn idle_connections_survive_a_burst_ten_times_the_table() {
    let max = CAPACITY.to_string();
    let sb = demo_sandbox_with(&[
        "--max-conntrack",
        &max,
        "--conntrack-tcp-timeout-closed",
        "1s",
    ]);
    let addr = format!("{CLUSTER_IP}:80");
    let idle: Vec<IdleClient> = (0..IDLE).map(|_| open_idle(&sb, &addr)).collect();

    let bin = sb_echo();

    // The burst: ten times the table's entries in short connections (each
    // one flow, two entries), through the same Service.
    let burst = 10 * CAPACITY;
    let started = Instant::now();
    let run = sb
        .client(
            &bin,
            &[
                "--tcp",
                &addr,
                "--count",
                &burst.to_string(),
                "--timeout-ms",
                "4000",
            ],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    let took = started.elapsed();
    let failed = run.failures();
    eprintln!(
        "burst: {burst} connections in {took:?}, {failed} failed, ct_full {}",
        counter(&sb.pin_dir, "ct_full")
    );
    // Every idle connection still reaches its own pod.
    let mut lost = Vec::new();
    for client in idle {
        match wake(client) {
            (pod, Attempt::Ok { name, .. }) if name == pod => {}
            (pod, other) => lost.push(format!("greeted by {pod}, then {other:?}")),
        }
    }
    assert!(
        lost.is_empty(),
        "idle connections broken by the burst:\n{}",
        lost.join("\n")
    );
    // The table was full at times (new flows were refused and retried), yet
    // the collector kept making room: nearly every connection got through.
    assert!(
        counter(&sb.pin_dir, "ct_full") > 0,
        "the burst never filled the table"
    );
    assert!(
        failed * 100 <= burst,
        "{failed} of {burst} short connections failed"
    );
}

/// `switchboard conntrack list` shows each flow's phase and time to expiry.
#[test]
fn conntrack_list_shows_state_and_expiry() {
    let sb = demo_sandbox_with(&["--conntrack-tcp-timeout-established", "2h"]);
    let addr = format!("{CLUSTER_IP}:80");
    let idle = open_idle(&sb, &addr);
    let deadline = Instant::now() + Duration::from_secs(5);
    let states = loop {
        let states = forward_tcp_rows(&sb.pin_dir);
        if !states.is_empty() || Instant::now() > deadline {
            break states;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(states.len(), 1, "{states:?}");
    let (_, state, expires_in_s) = &states[0];
    assert_eq!(state, "established");
    assert!(
        (7_000.0..=7_200.0).contains(expires_in_s),
        "expires in {expires_in_s} s, not about 2 h"
    );
    let (_, attempt) = wake(idle);
    assert!(matches!(attempt, Attempt::Ok { .. }), "{attempt:?}");
}

/// Where a flood test runs: a sandbox seen through what the test needs.
struct FloodSite<'a> {
    /// Runs `sb-echo <args>` where the real clients are.
    real_client: &'a dyn Fn(&[&str]) -> Command,
    /// Runs `sb-echo <args>` where the flood comes from.
    flooder: &'a dyn Fn(&[&str]) -> Command,
    /// The Service address flooded and connected to.
    addr: String,
    /// The agent's pin root and pid.
    pin: PathBuf,
    agent_pid: u32,
}

/// What a flood did, in the figures the test reports.
struct FloodFigures {
    flood: String,
    during: (usize, usize),
    after: (usize, usize),
    half_open: usize,
    ct_full: u64,
    stats_took: Duration,
    /// The agent's CPU time over the flood and the 2 s after it, in
    /// seconds (user and system), and that span.
    agent_cpu_s: f64,
    span_s: u64,
    idle: (String, Attempt),
}

/// The agent's CPU time so far (user and system, in clock ticks of 1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "switchboard", "pid {pid} is not the agent");
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the agent's /proc stat");
    // After the command name in parentheses: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0)
}

/// Seconds a flood lasts: 10, or `SB_FLOOD_SECS` (`cargo xtask soak`).
fn flood_secs() -> u64 {
    std::env::var("SB_FLOOD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
        .max(5)
}

/// Spoofed SYNs (random sources, as fast as one sender goes) at the
/// Service for [`flood_secs`]; a real client connects every 100 ms from 1 s
/// into it until 2 s before its end, and 20 times from 2 s after it; an
/// idle connection opened before it is used after it.
fn flood(site: &FloodSite) -> FloodFigures {
    let idle = open_idle_with(site.real_client, &site.addr);
    let cpu_before = cpu_ticks(site.agent_pid);
    let secs = flood_secs();
    let flood_ms = (secs * 1000).to_string();
    let probe_ms = ((secs - 3) * 1000).to_string();
    let flood = (site.flooder)(&["synflood", "--to", &site.addr, "--duration-ms", &flood_ms])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the flood");
    std::thread::sleep(Duration::from_millis(1000));
    let stats_started = Instant::now();
    counter(&site.pin, "ct_full");
    let stats_took = stats_started.elapsed();
    let probe = |args: &[&str]| {
        let mut all = vec![
            "client",
            "--tcp",
            &site.addr,
            "--interval-ms",
            "100",
            "--timeout-ms",
            "1000",
        ];
        all.extend_from_slice(args);
        let out = (site.real_client)(&all)
            .stdin(Stdio::null())
            .output()
            .expect("run sb-echo client");
        let run = ClientRun::parse(&String::from_utf8_lossy(&out.stdout))
            .unwrap_or_else(|e| panic!("{e:#}"));
        (run.attempts.len() - run.failures(), run.attempts.len())
    };
    let during = probe(&["--duration-ms", &probe_ms]);
    let out = flood.wait_with_output().expect("wait for the flood");
    let report = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success(), "the flood failed: {report}");
    let half_open = forward_tcp_rows(&site.pin)
        .iter()
        .filter(|(_, state, _)| state == "syn-sent" || state == "syn-recv")
        .count();
    let ct_full = counter(&site.pin, "ct_full");
    std::thread::sleep(Duration::from_secs(2));
    let agent_cpu_s = cpu_ticks(site.agent_pid).saturating_sub(cpu_before) as f64 / 100.0;
    let after = probe(&["--count", "20"]);
    let figures = FloodFigures {
        flood: report,
        during,
        after,
        half_open,
        ct_full,
        stats_took,
        agent_cpu_s,
        span_s: secs + 2,
        idle: wake(idle),
    };
    eprintln!(
        "flood: {}; during it {} of {} new connections succeeded; from 2 s after it {} of {}; \
         {} half-open flows in the table at its end; ct_full {}; stats took {:?}; agent CPU {:.2} s over {} s",
        figures.flood,
        figures.during.0,
        figures.during.1,
        figures.after.0,
        figures.after.1,
        figures.half_open,
        figures.ct_full,
        figures.stats_took,
        figures.agent_cpu_s,
        figures.span_s,
    );
    figures
}

/// What every flood test asserts: the idle connection survived; at least
/// 90% of new connections succeeded during the flood and all from 2 s after
/// it; the table was full of half-open flows (the flood did its worst);
/// `stats` and the agent's CPU stayed bounded.
fn assert_flood_held(f: &FloodFigures) {
    let (pod, attempt) = &f.idle;
    assert!(
        matches!(attempt, Attempt::Ok { name, .. } if name == pod),
        "the idle connection to {pod} did not survive the flood: {attempt:?}"
    );
    assert!(
        f.half_open > 1000,
        "the flood did not fill the table with half-open flows ({})",
        f.half_open
    );
    assert!(
        f.during.1 >= 20 && f.during.0 * 10 >= f.during.1 * 9,
        "during the flood {} of {} new connections succeeded (ct_full {})",
        f.during.0,
        f.during.1,
        f.ct_full
    );
    assert_eq!(
        f.after.0, f.after.1,
        "from 2 s after the flood {} of {} succeeded",
        f.after.0, f.after.1
    );
    assert!(
        f.stats_took < Duration::from_secs(2),
        "stats took {:?} under the flood",
        f.stats_took
    );
    // A quarter of one core at most; a collector walking the full table
    // every second took 26-41% of a core here.
    assert!(
        f.agent_cpu_s < f.span_s as f64 / 4.0,
        "the agent used {:.2} s of CPU over {} s",
        f.agent_cpu_s,
        f.span_s
    );
}

/// A spoofed SYN flood through a ClusterIP from a pod (the tc path), with a
/// table of 8192 entries. No spoofed source ever completes a handshake, so
/// their flows stay unestablished and new flows take the place of the
/// oldest of them.
#[test]
fn a_spoofed_syn_flood_locks_no_real_client_out() {
    let sb = demo_sandbox_with(&["--max-conntrack", "8192"]);
    let ns = sb.client_ns();
    let client = |args: &[&str]| sb_echo_in(&sb, &ns, args);
    let figures = flood(&FloodSite {
        real_client: &client,
        flooder: &client,
        addr: format!("{CLUSTER_IP}:80"),
        pin: sb.pin_dir.clone(),
        agent_pid: sb.agent_pid().expect("the agent runs"),
    });
    assert_flood_held(&figures);
}

/// The same flood from outside at a NodePort through node A's uplink, with
/// two local endpoints (DNAT only) and one on node B (source NAT to node A).
#[test]
fn a_spoofed_syn_flood_at_a_nodeport_locks_no_real_client_out() {
    let endpoints = [
        Pod::new(Node::A, 1),
        Pod::new(Node::A, 2),
        Pod::new(Node::B, 1),
    ];
    let sb = two_node_with_agents(Policy::Cluster, &endpoints, &["--max-conntrack", "8192"]);
    let sb_ref = &sb;
    let in_client = |client: Client| {
        let ns = sb_ref.client_ns(client);
        let bin = sb_echo().to_string_lossy().into_owned();
        move |args: &[&str]| {
            let mut cmd = vec![bin.as_str()];
            cmd.extend_from_slice(args);
            sb_ref.command(&ns, &cmd)
        }
    };
    let (real, flooder) = (in_client(Client::Two), in_client(Client::One));
    let figures = flood(&FloodSite {
        real_client: &real,
        flooder: &flooder,
        addr: format!("{}:{NODEPORT_TCP}", Node::A.ip()),
        pin: sb.pin_dir(Node::A),
        agent_pid: sb.agent_pid(Node::A).expect("node A's agent runs"),
    });
    assert_flood_held(&figures);
}

/// The quiet classes (`tcp`, `other`) `switchboard status` shows for the
/// client pod's interface, run in the node's namespace.
fn client_quiet(sb: &Sandbox) -> Vec<String> {
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb
        .exec_status(
            &sb.node_ns(),
            &[&bin, "status", "--pin-root", &pin, "-o", "json"],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status -o json");
    let row = json["interfaces"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == sb.client_if()))
        .unwrap_or_else(|| panic!("no row for the client's interface: {json}"));
    row["quiet"]
        .as_array()
        .map(|classes| {
            classes
                .iter()
                .filter_map(|c| c.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Polls [`client_quiet`] until it is `want`, for at most `within`.
fn wait_quiet(sb: &Sandbox, want: &[&str], within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let now = client_quiet(sb);
        if now == want || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A pod's quiet marks come back: the collector marks the client pod's
/// interface at its first pass (no flow), a DNS query through the tc layer
/// takes the `other` mark at once (its generation moved) and leaves `tcp`,
/// a TCP connection takes `tcp`, and once the flows expired the next pass
/// (the collector waits up to 30 s on a near-empty table) marks both again.
/// Connections made while marked, or right after, are translated: a mark
/// never hides the replies of a flow made after it.
#[test]
fn a_pod_is_quiet_again_once_its_tc_flows_expire() {
    let sb = demo_sandbox_with(&[
        "--conntrack-udp-timeout",
        "1s",
        "--conntrack-udp-timeout-stream",
        "1s",
        "--conntrack-tcp-timeout-closed",
        "1s",
    ]);
    let both = ["tcp", "other"];
    let quiet = wait_quiet(&sb, &both, Duration::from_secs(10));
    assert_eq!(quiet, both, "the first pass marks a pod without flows");

    let bin = sb_echo();
    let through_tc = |proto: &str, port: u16| {
        let addr = format!("{CLUSTER_IP}:{port}");
        let run = sb
            .client(&bin, &[proto, &addr, "--count", "3"])
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert!(
            run.all_ok(),
            "{proto} {addr} through the tc layer failed:\n{}",
            run.raw
        );
    };
    let query = || through_tc("--udp", 53);
    let connect = || through_tc("--tcp", 80);
    query();
    assert_eq!(client_quiet(&sb), ["tcp"], "a UDP flow voids only `other`");
    connect();
    assert!(client_quiet(&sb).is_empty(), "a TCP flow voids `tcp`");

    let quiet = wait_quiet(&sb, &both, Duration::from_secs(45));
    assert_eq!(
        quiet, both,
        "flows expired, yet the pod was not marked again"
    );
    // Marked again, the pod's new flows are translated both ways.
    query();
    connect();
}
