//! Netns end-to-end test of connection tracking under pressure (root only):
//! idle long-lived connections through a Service survive a burst of short
//! connections many times the table's size. With an LRU table the burst
//! evicts their entries and their next packets go to a random backend,
//! which resets them.
//!
//! The clients run in the client (pod) namespace outside the socket layer's
//! cgroup, so every packet takes the tc path (`sb_from_pod`/`sb_to_pod`).
//! Binaries as in e2e.rs (SWITCHBOARD_BIN, SB_ECHO_BIN).

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use xtask::sandbox::{Attempt, Sandbox, CLUSTER_IP};
use xtask::testenv::{demo_sandbox_with, sb_echo, switchboard};

/// `--max-conntrack`: 256 flows.
const CAPACITY: usize = 512;
/// Long-lived connections left idle: with a random backend after eviction,
/// each survives by luck one time in three, all three one time in 27.
const IDLE: usize = 3;

/// An idle connection's client, greeted and waiting for its go.
struct IdleClient {
    child: Child,
    pod: String,
}

fn open_idle(sb: &Sandbox, addr: &str) -> IdleClient {
    let bin = sb_echo().to_string_lossy().into_owned();
    let mut cmd = sb.command(
        &sb.client_ns(),
        &[&bin, "client", "--tcp", addr, "--idle-until-stdin", "--count", "5", "--timeout-ms", "2000"],
    );
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("start the idle client");
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read the greeting");
    let pod = match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["connected", pod, ..] => pod.to_owned(),
        _ => panic!("idle client did not connect: {line:?}"),
    };
    IdleClient { child, pod }
}

/// Tells the idle client to use its connection; returns its result line.
fn wake(mut idle: IdleClient) -> (String, Attempt) {
    idle.child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(b"go\n")
        .expect("wake the idle client");
    let out = idle.child.wait_with_output().expect("wait for the idle client");
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let run = xtask::sandbox::ClientRun::parse(&raw).unwrap_or_else(|e| panic!("{e:#}: {raw}"));
    let attempt = run.attempts.into_iter().next().unwrap_or_else(|| panic!("no result: {raw}"));
    (idle.pod, attempt)
}

fn stats_counter(sb: &Sandbox, name: &str) -> u64 {
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb
        .exec(&sb.node_ns(), &[&bin, "stats", "--pin-root", &pin, "-o", "json"])
        .expect("switchboard stats");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stats json");
    json["counters"][name].as_u64().unwrap_or_else(|| panic!("no counter {name}: {json}"))
}

/// `switchboard conntrack list`'s forward TCP rows: (source, state,
/// seconds to expiry).
fn forward_tcp_rows(sb: &Sandbox) -> Vec<(String, String, f64)> {
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb
        .exec(&sb.node_ns(), &[&bin, "conntrack", "list", "--pin-root", &pin, "-o", "json"])
        .expect("switchboard conntrack list");
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("conntrack json");
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
        .client(&bin, &["--tcp", &addr, "--count", &burst.to_string(), "--timeout-ms", "4000"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let took = started.elapsed();
    let failed = run.failures();
    eprintln!(
        "burst: {burst} connections in {took:?}, {failed} failed, ct_full {}",
        stats_counter(&sb, "ct_full")
    );
    // Every idle connection still reaches its own pod.
    let mut lost = Vec::new();
    for client in idle {
        match wake(client) {
            (pod, Attempt::Ok { name, .. }) if name == pod => {}
            (pod, other) => lost.push(format!("greeted by {pod}, then {other:?}")),
        }
    }
    assert!(lost.is_empty(), "idle connections broken by the burst:\n{}", lost.join("\n"));
    // The table was full at times (new flows were refused and retried), yet
    // the collector kept making room: nearly every connection got through.
    assert!(stats_counter(&sb, "ct_full") > 0, "the burst never filled the table");
    assert!(failed * 100 <= burst, "{failed} of {burst} short connections failed");
}

/// `switchboard conntrack list` shows each flow's phase and time to expiry.
#[test]
fn conntrack_list_shows_state_and_expiry() {
    let sb = demo_sandbox_with(&["--conntrack-tcp-timeout-established", "2h"]);
    let addr = format!("{CLUSTER_IP}:80");
    let idle = open_idle(&sb, &addr);
    let deadline = Instant::now() + Duration::from_secs(5);
    let states = loop {
        let states = forward_tcp_rows(&sb);
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

/// A spoofed SYN flood (random sources, as fast as one sender goes, 10 s)
/// through a ClusterIP from a pod, with a table of 8192 entries. No spoofed
/// source ever completes a handshake, so their flows stay unestablished and
/// new flows take the place of the oldest of them: the table fills with
/// half-open flows, yet an idle connection opened before the flood still
/// answers after it, and `stats` stays quick.
///
/// How many new connections succeed during the flood and from 2 s after
/// it, and how many were refused for want of room (`ct_full`), is printed,
/// not asserted: runs here range from 70 of 70 with `ct_full` 0 to half the
/// SYNs refused (the per-CPU memory of new flows runs dry under some runs;
/// issue 25 stays open on it).
#[test]
fn a_spoofed_syn_flood_locks_no_real_client_out() {
    let sb = demo_sandbox_with(&["--max-conntrack", "8192"]);
    let addr = format!("{CLUSTER_IP}:80");
    let idle = open_idle(&sb, &addr);
    let bin = sb_echo().to_string_lossy().into_owned();
    let flood = sb
        .command(&sb.client_ns(), &[&bin, "synflood", "--to", &addr, "--duration-ms", "10000"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the flood");
    std::thread::sleep(Duration::from_millis(1000));
    let stats_started = Instant::now();
    stats_counter(&sb, "ct_full");
    let stats_took = stats_started.elapsed();
    let during = sb
        .client(
            &sb_echo(),
            &["--tcp", &addr, "--duration-ms", "7000", "--interval-ms", "100", "--timeout-ms", "1000"],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    let out = flood.wait_with_output().expect("wait for the flood");
    let flood_report = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success(), "the flood failed: {flood_report}");
    let half_open = forward_tcp_rows(&sb)
        .iter()
        .filter(|(_, state, _)| state == "syn-sent" || state == "syn-recv")
        .count();
    let full = stats_counter(&sb, "ct_full");
    std::thread::sleep(Duration::from_secs(2));
    let after = sb
        .client(&sb_echo(), &["--tcp", &addr, "--count", "20", "--interval-ms", "100", "--timeout-ms", "1000"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let (pod, attempt) = wake(idle);
    eprintln!(
        "flood: {flood_report}; during it {} of {} new connections succeeded; from 2 s after it {} of {}; \
         {half_open} half-open flows in the table at its end; ct_full {full}; stats took {stats_took:?}",
        during.attempts.len() - during.failures(),
        during.attempts.len(),
        after.attempts.len() - after.failures(),
        after.attempts.len(),
    );
    assert!(
        matches!(&attempt, Attempt::Ok { name, .. } if *name == pod),
        "the idle connection to {pod} did not survive the flood: {attempt:?}"
    );
    assert!(half_open > 1000, "the flood did not fill the table with half-open flows ({half_open})");
    assert!(stats_took < Duration::from_secs(2), "stats took {stats_took:?} under the flood");
}
