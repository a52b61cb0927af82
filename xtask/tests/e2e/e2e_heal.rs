//! Netns end-to-end tests of the agent repairing what is deleted or
//! changed behind its back (root only), upstream's "should recreate its
//! iptables rules if they are deleted" in switchboard's terms. One table of
//! damage, each case done to the demo sandbox while its agent runs:
//! - the tc programs of a pod interface: a TCX link's pin removed (which
//!   detaches it), the netlink filters deleted, the clsact qdisc replaced
//!   (`tc qdisc del` / `add`, under `--tc-attach netlink`);
//! - a socket-layer cgroup link's pin removed;
//! - map entries: a frontend's slot 0 deleted, a slot pointed at a backend
//!   id that does not exist, a backend entry deleted, a reverse-NAT entry
//!   deleted;
//! - a map's pin removed.
//!
//! After each, the damaged path must answer again within 10 s, `switchboard
//! status` must show no problem and one more repair, and `verify` must pass.
//! Throughout, a Service that no damage touches (`demo/keep`, backed by
//! pod 3 alone) is asked every 100 ms by a new connection, and one
//! established connection to it stays open: neither may fail.
//!
//! The binaries come from SWITCHBOARD_BIN and SB_ECHO_BIN (`cargo xtask test`).
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;
use xtask::sandbox::{ClientRun, Sandbox, CLUSTER_IP};
use xtask::testenv::{demo_sandbox_with, open_idle_with, sb_echo, sb_echo_in, switchboard, wake};

/// How long a repair may take, from the damage to traffic answered.
const REPAIR: Duration = Duration::from_secs(10);
/// The untouched Service's address (backed by pod 3 alone).
const KEEP_IP: &str = "10.96.0.20";

const KEEP_YAML: &str = "\
apiVersion: v1
kind: Service
metadata: {name: keep, namespace: demo}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: keep-1
  namespace: demo
  labels: {kubernetes.io/service-name: keep}
addressType: IPv4
endpoints:
- addresses: [10.244.3.2]
  conditions: {ready: true}
ports: [{name: http, port: 8080, protocol: TCP}]
";

/// `switchboard <args> --pin-root <pin>` in the node namespace.
fn sw(sb: &Sandbox, args: &[&str]) -> Output {
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let mut cmd = vec![bin.as_str()];
    cmd.extend_from_slice(args);
    cmd.extend(["--pin-root", pin.as_str()]);
    sb.exec_status(&sb.node_ns(), &cmd)
        .expect("run switchboard")
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn status_json(sb: &Sandbox) -> Value {
    serde_json::from_slice(&sw(sb, &["status", "-o", "json"]).stdout).unwrap_or(Value::Null)
}

fn repairs(status: &Value) -> u64 {
    status["status"]["repairs"]["count"].as_u64().unwrap_or(0)
}

/// `sh -c script` in the node namespace; panics with its output on failure.
fn node_sh(sb: &Sandbox, script: &str) {
    let out = sb
        .exec_status(&sb.node_ns(), &["sh", "-c", script])
        .expect("run sh");
    assert!(
        out.status.success(),
        "{script}: {}{}",
        text(&out),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The entries of pinned map `name`, as `bpftool -j map dump` gives them
/// (with their BTF-formatted fields).
fn dump(sb: &Sandbox, name: &str) -> Vec<Value> {
    let pin = sb.pin_dir.join(name).to_string_lossy().into_owned();
    let out = sb
        .exec(
            &sb.node_ns(),
            &["bpftool", "-j", "map", "dump", "pinned", &pin],
        )
        .expect("bpftool map dump");
    serde_json::from_slice(&out.stdout).expect("bpftool json")
}

/// bpftool's `["0x0a", ...]` byte list, as hex words for its command line.
fn bytes(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b.as_str().map(|s| s.trim_start_matches("0x").to_owned()))
        .collect()
}

/// `bpftool map <op> pinned <map> key hex <key> [value hex <value>]`.
fn bpftool_map(sb: &Sandbox, op: &str, map: &str, key: &[String], value: Option<&[String]>) {
    let pin = sb.pin_dir.join(map).to_string_lossy().into_owned();
    let mut cmd = format!("bpftool map {op} pinned {pin} key hex {}", key.join(" "));
    if let Some(value) = value {
        cmd.push_str(&format!(" value hex {}", value.join(" ")));
    }
    node_sh(sb, &cmd);
}

/// The http frontend's (10.96.0.10:80/TCP, internal) entry at `slot`.
fn http_slot(sb: &Sandbox, slot: u64) -> Value {
    dump(sb, "SB_FE_V1")
        .into_iter()
        .find(|e| {
            let k = &e["formatted"]["key"];
            // The address too: the untouched Service has port 80 as well.
            k["addr_be"] == u64::from(u32::from_ne_bytes([10, 96, 0, 10]))
                && k["port_be"] == u64::from(80u16.to_be())
                && k["proto"] == 6
                && k["slot"] == slot
                && k["scope"] == 0
        })
        .unwrap_or_else(|| panic!("no slot {slot} of 10.96.0.10:80/TCP"))
}

/// A slot of the http frontend whose backend is pod 1 (never pod 3: the
/// untouched Service shares pod 3's backend entry).
fn pod1_slot(sb: &Sandbox) -> Value {
    let pod1 = dump(sb, "SB_BE_V1")
        .into_iter()
        .find(|e| {
            e["formatted"]["value"]["addr_be"] == u64::from(u32::from_ne_bytes([10, 244, 1, 2]))
                && e["formatted"]["value"]["proto"] == 6
        })
        .expect("pod 1's TCP backend");
    let id = pod1["formatted"]["key"].clone();
    (1..=3)
        .map(|slot| http_slot(sb, slot))
        .find(|e| e["formatted"]["value"]["backend_id"] == id)
        .expect("a slot naming pod 1")
}

/// The interface index of `iface` in the node namespace.
fn ifindex(sb: &Sandbox, iface: &str) -> String {
    let out = sb
        .exec(
            &sb.node_ns(),
            &["cat", &format!("/sys/class/net/{iface}/ifindex")],
        )
        .expect("ifindex");
    text(&out).trim().to_owned()
}

/// One row of the table: what is damaged, and the traffic that must
/// answer again.
struct Case {
    name: &'static str,
    damage: fn(&Sandbox),
    check: Check,
}

#[derive(Clone, Copy)]
enum Check {
    /// Every pod answers the ClusterIP's TCP and UDP ports from the client
    /// namespace.
    Pods,
    /// A host client in the sandbox's cgroup reaches the ClusterIP (only
    /// the socket layer serves it).
    HostClient,
}

fn tcp_all_pods(sb: &Sandbox) -> Result<(), String> {
    let echo = sb_echo();
    for (proto, port) in [("--tcp", 80), ("--udp", 53)] {
        let addr = format!("{CLUSTER_IP}:{port}");
        let run = sb
            .client(
                &echo,
                // 30 random picks miss one of three pods about once in 60k
                // checks, so every pod answering is not left to chance.
                &[proto, &addr, "--count", "30", "--timeout-ms", "500"],
            )
            .map_err(|e| format!("{e:#}"))?;
        let names: std::collections::BTreeSet<String> = run.names().into_iter().collect();
        if !run.all_ok() || names.len() < 3 {
            return Err(format!("{addr}: {} ({names:?})", run.raw));
        }
    }
    Ok(())
}

fn host_client(sb: &Sandbox) -> Result<(), String> {
    let addr = format!("{CLUSTER_IP}:80");
    let run = sb
        .client_in_cgroup(
            &sb_echo(),
            &sb.node_ns(),
            &["--tcp", &addr, "--count", "3", "--timeout-ms", "500"],
        )
        .map_err(|e| format!("{e:#}"))?;
    run.all_ok().then_some(()).ok_or(run.raw)
}

fn works(sb: &Sandbox, check: Check) -> Result<(), String> {
    match check {
        Check::Pods => tcp_all_pods(sb),
        Check::HostClient => host_client(sb),
    }
}

/// Damages, then waits until the path answers again, `status` is clean
/// with one more repair, and `verify` passes, all within [`REPAIR`].
fn run_case(sb: &Sandbox, case: &Case) {
    works(sb, case.check).unwrap_or_else(|e| panic!("{}: not working before: {e}", case.name));
    let before = repairs(&status_json(sb));
    let damaged = Instant::now();
    (case.damage)(sb);
    loop {
        let status = status_json(sb);
        let clean = status["problems"].as_array().is_some_and(Vec::is_empty);
        let repaired = repairs(&status) > before;
        let last = if clean && repaired {
            match works(sb, case.check) {
                Ok(()) => break,
                Err(e) => e,
            }
        } else {
            format!(
                "problems {}, repairs {}",
                status["problems"],
                repairs(&status)
            )
        };
        assert!(
            damaged.elapsed() < REPAIR,
            "{}: not repaired within {REPAIR:?}: {last}\n--- agent log ---\n{}",
            case.name,
            sb.agent_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("{}: repaired in {:?}", case.name, damaged.elapsed());
    let verify = sw(sb, &["verify"]);
    assert!(
        verify.status.success(),
        "{}: verify: {}",
        case.name,
        text(&verify)
    );
    let log = sb.agent_log();
    assert!(
        log.contains("drift"),
        "{}: no drift logged\n{log}",
        case.name
    );
}

fn unpin_pod1_tcx(sb: &Sandbox) {
    let index = ifindex(sb, &sb.pod_if(1));
    for program in ["sb_from_pod", "sb_to_pod"] {
        let pin = sb
            .pin_dir
            .join("links")
            .join(format!("tcx_{index}_{program}"));
        std::fs::remove_file(&pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
    }
}

fn unpin_connect4(sb: &Sandbox) {
    let pin = sb.pin_dir.join("links").join("sb_sock_connect4");
    std::fs::remove_file(&pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
}

fn delete_dns_slot0(sb: &Sandbox) {
    let key = [
        "0a", "60", "00", "0a", "00", "35", "11", "00", "00", "00", "00", "00",
    ]
    .map(String::from);
    bpftool_map(sb, "delete", "SB_FE_V1", &key, None);
}

fn corrupt_pod1_slot(sb: &Sandbox) {
    let slot = pod1_slot(sb);
    let mut value = bytes(&slot["value"]);
    // backend_id (the first u32): an id no backend has.
    value[..4].clone_from_slice(&["e7", "03", "00", "00"].map(String::from));
    bpftool_map(sb, "update", "SB_FE_V1", &bytes(&slot["key"]), Some(&value));
}

fn delete_pod1_backend(sb: &Sandbox) {
    let slot = pod1_slot(sb);
    let id = slot["formatted"]["value"]["backend_id"]
        .as_u64()
        .expect("id") as u32;
    let key: Vec<String> = id
        .to_ne_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    bpftool_map(sb, "delete", "SB_BE_V1", &key, None);
}

fn delete_http_revnat(sb: &Sandbox) {
    let head = http_slot(sb, 0);
    let id = head["formatted"]["value"]["service_id"]
        .as_u64()
        .expect("id") as u32;
    let key: Vec<String> = id
        .to_ne_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    bpftool_map(sb, "delete", "SB_RNAT_V1", &key, None);
}

fn unpin_frontends(sb: &Sandbox) {
    let pin = sb.pin_dir.join("SB_FE_V1");
    std::fs::remove_file(&pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
}

fn delete_pod1_filters(sb: &Sandbox) {
    let iface = sb.pod_if(1);
    node_sh(
        sb,
        &format!("tc filter del dev {iface} ingress && tc filter del dev {iface} egress"),
    );
}

fn replace_pod1_qdisc(sb: &Sandbox) {
    let iface = sb.pod_if(1);
    // The agent may put its own qdisc back between the two (it follows
    // tc events): then `add` finds one, which is as good.
    node_sh(
        sb,
        &format!(
            "tc qdisc del dev {iface} clsact && (tc qdisc add dev {iface} clsact 2>/dev/null || true)"
        ),
    );
}

/// Runs `cases` on one demo sandbox (agent flags `args`), with the
/// untouched Service asked throughout.
fn heal_table(args: &[&str], cases: &[Case]) {
    let mut sb = demo_sandbox_with(args);
    xtask::testenv::write_manifest(&sb, "keep.yaml", KEEP_YAML);
    let sw_bin = switchboard();
    sb.wait_services(&sw_bin, Duration::from_secs(10), "demo/keep:http", |f| {
        xtask::sandbox::find(f, "demo/keep:http").is_some_and(|fe| fe.backends.len() == 1)
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let keep = format!("{KEEP_IP}:80");
    let idle = open_idle_with(&|a| sb_echo_in(&sb, &sb.client_ns(), a), &keep);
    let duration = (cases.len() as u64 * 12_000).to_string();
    let steady = sb
        .client_spawn(
            &sb_echo(),
            &[
                "--tcp",
                &keep,
                "--duration-ms",
                &duration,
                "--interval-ms",
                "100",
                "--timeout-ms",
                "1000",
            ],
        )
        .expect("start the steady client");
    for case in cases {
        run_case(&sb, case);
    }
    let out = steady.wait_with_output().expect("steady client");
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let run = ClientRun::parse(&raw).unwrap_or_else(|e| panic!("{e:#}: {raw}"));
    assert!(run.attempts.len() > 10, "{raw}");
    assert_eq!(
        run.failures(),
        0,
        "the untouched Service failed a request:\n{raw}"
    );
    let (pod, attempt) = wake(idle);
    assert!(
        matches!(attempt, xtask::sandbox::Attempt::Ok { .. }),
        "the established connection to {pod} broke: {attempt:?}"
    );
    let status = text(&sw(&sb, &["status"]));
    eprintln!("{status}");
    assert!(status.contains("Repairs:"), "{status}");
}

/// The default flags (TCX links, the socket layer on the sandbox's cgroup).
#[test]
fn deleted_programs_pins_and_map_entries_are_repaired_within_ten_seconds() {
    heal_table(
        &[],
        &[
            Case {
                name: "pod interface TCX links unpinned",
                damage: unpin_pod1_tcx,
                check: Check::Pods,
            },
            Case {
                name: "socket-layer link unpinned",
                damage: unpin_connect4,
                check: Check::HostClient,
            },
            Case {
                name: "frontend slot 0 deleted",
                damage: delete_dns_slot0,
                check: Check::Pods,
            },
            Case {
                name: "slot names a missing backend",
                damage: corrupt_pod1_slot,
                check: Check::Pods,
            },
            Case {
                name: "backend entry deleted",
                damage: delete_pod1_backend,
                check: Check::Pods,
            },
            Case {
                name: "reverse-NAT entry deleted",
                damage: delete_http_revnat,
                check: Check::Pods,
            },
            Case {
                name: "frontend map unpinned",
                damage: unpin_frontends,
                check: Check::Pods,
            },
        ],
    );
}

/// Netlink clsact filters: the filters deleted, then the qdisc replaced.
#[test]
fn deleted_filters_and_a_replaced_qdisc_are_repaired_within_ten_seconds() {
    heal_table(
        &["--tc-attach", "netlink"],
        &[
            Case {
                name: "pod interface filters deleted",
                damage: delete_pod1_filters,
                check: Check::Pods,
            },
            Case {
                name: "pod interface qdisc replaced",
                damage: replace_pod1_qdisc,
                check: Check::Pods,
            },
        ],
    );
}
