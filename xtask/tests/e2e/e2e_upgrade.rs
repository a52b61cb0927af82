//! The upgrade guarantee (root only, netns sandbox): an agent of the next
//! release, started where this one ran, finds the pin root in the layout it
//! knows and keeps every tracked connection, every counter and every
//! programmed map; and a pin root of another layout is handled as
//! `docs/operate.md` says. The newer format's refusal is in
//! `e2e_lifecycle.rs`; here an older one is adopted and restamped, the
//! maps it lacks are created, and the pins this version does not use are
//! listed until `switchboard cleanup` removes them.
//!
//! The next release is the upgrade build of `cargo xtask test`
//! (`SWITCHBOARD_UPGRADE_BIN`: the same tree built with `switchboard`'s
//! feature `revision-1`, whose pod programs have other instructions).
//! Binaries as in e2e.rs (SWITCHBOARD_BIN, SB_ECHO_BIN).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use proxy_common::names;
use xtask::sandbox::{Attempt, ClientRun, Frontend, Sandbox, AGENT_READY, CLUSTER_IP};
use xtask::testenv::{
    bpftool_json, counters, demo_sandbox_with, open_idle_with, sb_echo_in, switchboard,
    wait_agent_log, wake, IdleClient,
};

/// Idle connections held across the upgrade.
const IDLE: usize = 6;

fn upgrade_binary() -> PathBuf {
    let path = std::env::var_os("SWITCHBOARD_UPGRADE_BIN")
        .map(PathBuf::from)
        .expect("SWITCHBOARD_UPGRADE_BIN is not set: run the tests through `cargo xtask test`");
    assert!(path.exists(), "{} does not exist", path.display());
    path
}

/// A UDP stream through the Service from one socket (one flow), a datagram
/// every 20 ms.
fn udp_stream(sb: &Sandbox, ms: u64) -> Child {
    let addr = format!("{CLUSTER_IP}:53");
    let ms = ms.to_string();
    let args = [
        "client",
        "--udp",
        &addr,
        "--udp-mode",
        "shared",
        "--duration-ms",
        &ms,
        "--interval-ms",
        "20",
    ];
    sb_echo_in(sb, &sb.client_ns(), &args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the UDP stream")
}

/// A TCP connection that exchanges a line every 100 ms for `secs`.
fn held_tcp(sb: &Sandbox, secs: f64) -> Child {
    let addr = format!("{CLUSTER_IP}:80");
    let secs = secs.to_string();
    sb_echo_in(
        sb,
        &sb.client_ns(),
        &[
            "client",
            "--tcp",
            &addr,
            "--hold",
            &secs,
            "--timeout-ms",
            "2000",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .expect("start the held connection")
}

fn finish(child: Child, what: &str) -> ClientRun {
    let out = child.wait_with_output().expect("wait for the client");
    ClientRun::parse(&String::from_utf8_lossy(&out.stdout))
        .unwrap_or_else(|e| panic!("{what}: {e:#}"))
}

fn open_idle(sb: &Sandbox, n: usize) -> Vec<IdleClient> {
    let addr = format!("{CLUSTER_IP}:80");
    let ns = sb.client_ns();
    let client = |args: &[&str]| sb_echo_in(sb, &ns, args);
    (0..n).map(|_| open_idle_with(&client, &addr)).collect()
}

/// Wakes every idle connection: those not answered by the pod that greeted
/// them, each with what happened.
fn lost_idle(idle: Vec<IdleClient>) -> Vec<String> {
    idle.into_iter()
        .filter_map(|client| match wake(client) {
            (pod, Attempt::Ok { name, .. }) if name == pod => None,
            (pod, other) => Some(format!("idle, greeted by {pod}, then {other:?}")),
        })
        .collect()
}

/// `switchboard <args> --pin-root <pin dir>` in the sandbox's node
/// namespace, whatever its exit status.
fn sw(sb: &Sandbox, args: &[&str]) -> Output {
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let mut cmd = vec![bin.as_str()];
    cmd.extend_from_slice(args);
    cmd.extend(["--pin-root", pin.as_str()]);
    sb.exec_status(&sb.node_ns(), &cmd)
        .expect("run switchboard")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `SB_` entries of the pin root (maps and the format stamp).
fn sb_pins(pin: &Path) -> BTreeSet<String> {
    std::fs::read_dir(pin)
        .expect("the pin root")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("SB_"))
        .collect()
}

/// The kernel's id of every map of this version pinned under `pin`: the
/// same id after a start means the map was adopted, not made anew.
fn map_ids(pin: &Path) -> BTreeMap<&'static str, u64> {
    names::ALL
        .iter()
        .filter(|name| pin.join(name).exists())
        .map(|name| {
            let path = pin.join(name).to_string_lossy().into_owned();
            let shown = bpftool_json(&["map", "show", "pinned", &path]);
            let id = shown["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("no map id for {name}: {shown}"));
            (*name, id)
        })
        .collect()
}

/// The format stamp's number.
fn stamp(pin: &Path) -> String {
    std::fs::read_link(pin.join("SB_FORMAT"))
        .expect("the format stamp")
        .to_string_lossy()
        .into_owned()
}

/// Every frontend with its service id and backends (`switchboard services
/// -o json` without the traffic counters).
fn programmed(sb: &Sandbox) -> Vec<Frontend> {
    sb.services(&switchboard()).expect("switchboard services")
}

/// The findings of `switchboard doctor`'s check of the pin root's layout.
fn layout_findings(sb: &Sandbox) -> Vec<serde_json::Value> {
    let text = stdout(&sw(sb, &["doctor", "-o", "json"]));
    let doctor: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("doctor -o json: {e}: {text}"));
    doctor
        .as_array()
        .and_then(|checks| checks.iter().find(|c| c["name"] == "pin root layout"))
        .and_then(|check| check["findings"].as_array())
        .unwrap_or_else(|| panic!("no check \"pin root layout\": {doctor:#}"))
        .clone()
}

/// Creates a small hash map pinned at `path`, as another version's agent
/// leaves one under a name this version does not know.
fn pin_a_map(path: &Path) {
    let out = std::process::Command::new("bpftool")
        .args(["map", "create"])
        .arg(path)
        .args([
            "type", "hash", "key", "4", "value", "4", "entries", "16", "name", "sb_other",
        ])
        .output()
        .expect("run bpftool");
    assert!(
        out.status.success(),
        "bpftool map create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Held connections, a held active one and a UDP stream across a stop of
/// this version's agent and a start of the next release's: every
/// connection answers from its own pod, the stream never fails nor changes
/// pod, no counter goes back, and the pin root is as it was: the same maps
/// (the same kernel objects, adopted), the same frontends and backends,
/// the same format, nothing for `doctor` to report.
#[test]
fn an_upgrade_keeps_every_connection_counter_and_programmed_map() {
    let upgrade = upgrade_binary();
    let mut sb = demo_sandbox_with(&[]);
    let idle = open_idle(&sb, IDLE);
    let run_ms = 6000;
    let udp = udp_stream(&sb, run_ms);
    let active = held_tcp(&sb, run_ms as f64 / 1000.0);
    std::thread::sleep(Duration::from_millis(1000));
    sb.stop_agent().expect("stop the agent");
    let (pins, ids, format) = (
        sb_pins(&sb.pin_dir),
        map_ids(&sb.pin_dir),
        stamp(&sb.pin_dir),
    );
    let services = programmed(&sb);
    let counted = counters(&sb.pin_dir);
    sb.start_agent(&upgrade)
        .expect("start the next release's agent");
    wait_agent_log(&sb, AGENT_READY, Duration::from_secs(15));
    let log = sb.agent_log();

    let mut lost = lost_idle(idle);
    let active = finish(active, "held connection");
    if !active.all_ok() {
        lost.push(format!("held active connection: {}", active.raw));
    }
    let udp = finish(udp, "UDP stream");
    let pods: BTreeSet<String> = udp.names().into_iter().collect();
    eprintln!(
        "upgrade: {} pins, {IDLE} idle connections and 1 active held, {} lost; \
         UDP stream {} exchanges, {} failed, answered by {pods:?}",
        ids.len(),
        lost.len(),
        udp.attempts.len(),
        udp.failures()
    );
    assert!(
        lost.is_empty(),
        "connections lost across the upgrade:\n{}\n{log}",
        lost.join("\n")
    );
    assert!(udp.all_ok(), "the UDP stream lost exchanges:\n{}", udp.raw);
    assert_eq!(pods.len(), 1, "the UDP stream changed pods: {pods:?}");
    assert!(
        udp.attempts.len() > 100,
        "too short a UDP stream:\n{}",
        udp.raw
    );
    let after = counters(&sb.pin_dir);
    let back: Vec<String> = counted
        .iter()
        .filter(|(name, before)| after.get(*name).is_none_or(|now| now < *before))
        .map(|(name, before)| format!("{name}: {before} -> {:?}", after.get(name)))
        .collect();
    assert!(back.is_empty(), "counters went back: {back:?}");
    assert!(
        after["forwarded"] > counted["forwarded"],
        "the next release forwarded nothing: {after:?}"
    );
    assert_eq!(sb_pins(&sb.pin_dir), pins, "the pins changed");
    assert_eq!(map_ids(&sb.pin_dir), ids, "a map was made anew");
    assert_eq!(stamp(&sb.pin_dir), format, "the format changed");
    assert_eq!(programmed(&sb), services, "the programmed maps changed");
    let findings = layout_findings(&sb);
    assert!(findings.is_empty(), "doctor: {findings:?}");
    sb.cleanup().expect("cleanup");
}

/// A pin root of an older format, without a map this version has and with
/// a map it does not know: `status` says so; the agent starts there,
/// adopts the maps it knows (held connections go on), creates the missing
/// one and records its own format; the unknown pin is left, listed by
/// `status` and `doctor` with the way out, and `switchboard cleanup`
/// removes it with the rest.
#[test]
fn an_older_layout_is_adopted_and_restamped_and_its_unknown_pins_listed_until_cleanup() {
    let mut sb = demo_sandbox_with(&[]);
    let ours = stamp(&sb.pin_dir);
    let older = (ours.parse::<u32>().expect("a format number") - 1).to_string();
    let idle = open_idle(&sb, 3);
    sb.stop_agent().expect("stop the agent");
    let stamp_path = sb.pin_dir.join("SB_FORMAT");
    std::fs::remove_file(&stamp_path).expect("remove the stamp");
    std::os::unix::fs::symlink(&older, &stamp_path).expect("stamp the older format");
    let missing = sb.pin_dir.join(names::SERVICE_DENIED);
    std::fs::remove_file(&missing).expect("unpin a map the older layout lacks");
    let other = sb.pin_dir.join("SB_CT_V4");
    pin_a_map(&other);

    let text = stdout(&sw(&sb, &["status"]));
    assert!(
        text.contains(&format!(
            "is of format {older}, older than this switchboard's (format {ours})"
        )),
        "{text}"
    );
    assert!(
        text.contains("pins this version does not use (another version's layout): SB_CT_V4"),
        "{text}"
    );

    sb.start_agent(&switchboard()).expect("start the agent");
    wait_agent_log(&sb, AGENT_READY, Duration::from_secs(15));
    let lost = lost_idle(idle);
    assert!(
        lost.is_empty(),
        "connections lost over the older layout:\n{}\n{}",
        lost.join("\n"),
        sb.agent_log()
    );
    assert_eq!(stamp(&sb.pin_dir), ours, "the agent records its format");
    assert!(missing.exists(), "the agent pins the map the layout lacked");
    assert!(other.exists(), "the unknown pin is left for the operator");
    let status = sw(&sb, &["status"]);
    let text = stdout(&status);
    assert!(!status.status.success(), "{text}");
    assert!(!text.contains("older than"), "{text}");
    assert!(
        text.contains("does not use") && text.contains("SB_CT_V4"),
        "{text}"
    );
    let findings = layout_findings(&sb);
    assert!(
        findings.len() == 1
            && findings[0]["what"]
                .as_str()
                .is_some_and(|what| what.contains("SB_CT_V4"))
            && findings[0]["fix"]
                .as_str()
                .is_some_and(|fix| fix.contains("switchboard cleanup")),
        "doctor: {findings:?}"
    );

    sb.stop_agent().expect("stop the agent");
    let cleanup = sw(&sb, &["cleanup", "-o", "json"]);
    let report = stdout(&cleanup);
    assert!(cleanup.status.success(), "{report}");
    assert!(
        report.contains("\"SB_CT_V4\""),
        "cleanup names it: {report}"
    );
    assert!(!other.exists(), "cleanup removes the unknown pin");
    let left: Vec<String> = match std::fs::read_dir(&sb.pin_dir) {
        Ok(dir) => dir
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".debug"))
            .collect(),
        Err(_) => Vec::new(),
    };
    assert!(
        left.is_empty(),
        "pin root not empty after cleanup: {left:?}"
    );
    sb.cleanup().expect("cleanup");
}
