//! Netns end-to-end tests of the agent repairing what is deleted or
//! changed behind its back (root only), upstream's "should recreate its
//! iptables rules if they are deleted" in switchboard's terms. Tables of
//! damage, each case done while the agent runs:
//! - on the demo sandbox: the tc programs of a pod interface (a TCX link's
//!   pin removed, which detaches it; the netlink filters deleted, the
//!   clsact qdisc replaced under `--tc-attach netlink`); a socket-layer
//!   cgroup link's pin removed, and one detached from the cgroup with its
//!   pin kept (`bpftool link detach`); map entries (a frontend's slot 0
//!   deleted, a slot pointed at a backend id that does not exist, a backend
//!   entry deleted, a reverse-NAT entry deleted); a map's pin removed;
//! - on node A of the two-node sandbox (native XDP on its uplink): the
//!   uplink's TCX links detached with their pins kept, its XDP program
//!   taken off, the Maglev table of a Service annotated
//!   `switchboard.io/lb-algorithm: maglev` overwritten, the uplink map's
//!   entry deleted; and under `--tc-attach netlink`, the uplink's filters
//!   deleted.
//!
//! After each, the damaged path must answer again within 10 s, `switchboard
//! status` must show no problem and one more repair, and `verify` must pass.
//! Throughout, a Service that no damage touches (`demo/keep`, backed by
//! one pod) is asked every 100 ms by a new connection, and one established
//! connection to it stays open: neither may fail. On the demo sandbox the
//! client namespace asks it (pod 3 answers); on the two-node sandbox podA1
//! asks it (podA2 answers), a path that crosses node A but not its uplink.
//!
//! The binaries come from SWITCHBOARD_BIN and SB_ECHO_BIN (`cargo xtask test`).
use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use proxy_testkit::netns::{self, in_netns};
use serde_json::Value;
use xtask::sandbox::two_node::manifests::Policy;
use xtask::sandbox::two_node::{Client, Node, Pod, LB_IP, NODE_A_IP};
use xtask::sandbox::{ClientRun, Lan, NetnsCore, Sandbox, TwoNodeSandbox, AGENT, CLUSTER_IP};
use xtask::testenv::{
    demo_sandbox_with, open_idle_with, sb_echo, switchboard, two_node_sandbox_on, wait_programmed,
    wake, IdleClient,
};

/// How long a repair may take, from the damage to traffic answered.
const REPAIR: Duration = Duration::from_secs(10);
/// The untouched Service's address (backed by one pod).
const KEEP_IP: &str = "10.96.0.40";

/// `demo/keep`, ClusterIP [`KEEP_IP`] port 80, backed by `pod` alone.
fn keep_yaml(pod: &str, node: Option<&str>) -> String {
    let node = node.map_or(String::new(), |n| format!("  nodeName: {n}\n"));
    format!(
        "\
apiVersion: v1
kind: Service
metadata: {{name: keep, namespace: demo}}
spec:
  type: ClusterIP
  clusterIP: {KEEP_IP}
  clusterIPs: [{KEEP_IP}]
  ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: keep-1
  namespace: demo
  labels: {{kubernetes.io/service-name: keep}}
addressType: IPv4
endpoints:
- addresses: [{pod}]
  conditions: {{ready: true}}
{node}ports: [{{name: http, port: 8080, protocol: TCP}}]
"
    )
}

/// The agent a table damages: where it runs, its pin root and its log.
struct Agent<'a> {
    core: &'a NetnsCore,
    ns: String,
    pin: PathBuf,
    label: String,
}

/// A sandbox whose agent a table damages.
trait World {
    fn agent(&self) -> Agent<'_>;
}

impl World for Sandbox {
    fn agent(&self) -> Agent<'_> {
        Agent {
            core: self,
            ns: self.node_ns(),
            pin: self.pin_dir.clone(),
            label: AGENT.to_owned(),
        }
    }
}

/// Node A's agent.
impl World for TwoNodeSandbox {
    fn agent(&self) -> Agent<'_> {
        Agent {
            core: self,
            ns: self.node_ns(Node::A),
            pin: self.pin_dir(Node::A),
            label: TwoNodeSandbox::agent_label(Node::A),
        }
    }
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Agent<'_> {
    /// `switchboard <args> --pin-root <pin>` in the agent's namespace.
    fn sw(&self, args: &[&str]) -> Output {
        let bin = switchboard().to_string_lossy().into_owned();
        let pin = self.pin.to_string_lossy().into_owned();
        let mut cmd = vec![bin.as_str()];
        cmd.extend_from_slice(args);
        cmd.extend(["--pin-root", pin.as_str()]);
        self.core
            .exec_status(&self.ns, &cmd)
            .expect("run switchboard")
    }

    fn status_json(&self) -> Value {
        serde_json::from_slice(&self.sw(&["status", "-o", "json"]).stdout).unwrap_or(Value::Null)
    }

    fn log(&self) -> String {
        self.core.read_log(&self.label)
    }

    /// `cmd` in the agent's namespace; panics with its output on failure.
    fn run(&self, cmd: &[&str]) {
        let out = self.core.exec_status(&self.ns, cmd).expect("run");
        assert!(
            out.status.success(),
            "{}: {}{}",
            cmd.iter().take(8).copied().collect::<Vec<_>>().join(" "),
            text(&out),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `sh -c script` in the agent's namespace; panics on failure.
    fn sh(&self, script: &str) {
        self.run(&["sh", "-c", script]);
    }

    fn pin_of(&self, name: &str) -> String {
        self.pin.join(name).to_string_lossy().into_owned()
    }

    /// The entries of pinned map `name`, as `bpftool -j map dump` gives them
    /// (with their BTF-formatted fields).
    fn dump(&self, name: &str) -> Vec<Value> {
        let pin = self.pin_of(name);
        let out = self
            .core
            .exec(&self.ns, &["bpftool", "-j", "map", "dump", "pinned", &pin])
            .expect("bpftool map dump");
        serde_json::from_slice(&out.stdout).expect("bpftool json")
    }

    /// `bpftool map <op> pinned <map> key hex <key> [value hex <value>]`.
    fn bpftool_map(&self, op: &str, map: &str, key: &[String], value: Option<&[String]>) {
        let pin = self.pin_of(map);
        let mut cmd: Vec<&str> = vec!["bpftool", "map", op, "pinned", &pin, "key", "hex"];
        cmd.extend(key.iter().map(String::as_str));
        if let Some(value) = value {
            cmd.extend(["value", "hex"]);
            cmd.extend(value.iter().map(String::as_str));
        }
        self.run(&cmd);
    }

    /// `bpftool link detach` of the link pinned at `links/<name>`: the
    /// link stays pinned, attached to nothing.
    fn detach_link(&self, name: &str) {
        let pin = self.pin_of(&format!("links/{name}"));
        self.run(&["bpftool", "link", "detach", "pinned", &pin]);
    }

    fn unpin(&self, name: &str) {
        let pin = self.pin.join(name);
        std::fs::remove_file(&pin).unwrap_or_else(|e| panic!("{}: {e}", pin.display()));
    }

    /// The interface index of `iface` in the agent's namespace.
    fn ifindex(&self, iface: &str) -> u32 {
        in_netns(&self.ns, || netns::ifindex(iface)).expect("an interface index")
    }

    /// Slot `slot` of the internal set of frontend `ip:port/proto`.
    fn slot(&self, ip: [u8; 4], port: u16, proto: u64, slot: u64) -> Value {
        self.dump("SB_FE_V1")
            .into_iter()
            .find(|e| {
                let k = &e["formatted"]["key"];
                k["addr_be"] == u64::from(u32::from_ne_bytes(ip))
                    && k["port_be"] == u64::from(port.to_be())
                    && k["proto"] == proto
                    && k["slot"] == slot
                    && k["scope"] == 0
            })
            .unwrap_or_else(|| panic!("no slot {slot} of {ip:?}:{port}/{proto}"))
    }

    /// The id of a backend entry at `ip` of protocol `proto`.
    fn backend_id(&self, ip: [u8; 4], proto: u64) -> u32 {
        let entry = self
            .dump("SB_BE_V1")
            .into_iter()
            .find(|e| {
                e["formatted"]["value"]["addr_be"] == u64::from(u32::from_ne_bytes(ip))
                    && e["formatted"]["value"]["proto"] == proto
            })
            .unwrap_or_else(|| panic!("no backend {ip:?}/{proto}"));
        entry["formatted"]["key"].as_u64().expect("id") as u32
    }
}

/// bpftool's `["0x0a", ...]` byte list, as hex words for its command line.
fn bytes(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b.as_str().map(|s| s.trim_start_matches("0x").to_owned()))
        .collect()
}

/// A `u32` key as bpftool's hex bytes (host order).
fn u32_key(v: u32) -> Vec<String> {
    v.to_ne_bytes().iter().map(|b| format!("{b:02x}")).collect()
}

/// One row of a table: what is damaged, and the traffic that must answer
/// again.
struct Case<W> {
    name: &'static str,
    damage: fn(&W),
    check: fn(&W) -> Result<(), String>,
}

fn repairs(status: &Value) -> u64 {
    status["status"]["repairs"]["count"].as_u64().unwrap_or(0)
}

/// Damages, then waits until the path answers again, `status` is clean
/// with one more repair, and `verify` passes, all within [`REPAIR`].
fn run_case<W: World>(w: &W, case: &Case<W>) {
    let agent = w.agent();
    (case.check)(w).unwrap_or_else(|e| panic!("{}: not working before: {e}", case.name));
    let before = repairs(&agent.status_json());
    let damaged = Instant::now();
    (case.damage)(w);
    loop {
        let status = agent.status_json();
        let clean = status["problems"].as_array().is_some_and(Vec::is_empty);
        let repaired = repairs(&status) > before;
        let last = if clean && repaired {
            match (case.check)(w) {
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
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("{}: repaired in {:?}", case.name, damaged.elapsed());
    let verify = agent.sw(&["verify"]);
    assert!(
        verify.status.success(),
        "{}: verify: {}",
        case.name,
        text(&verify)
    );
    let log = agent.log();
    assert!(
        log.contains("drift"),
        "{}: no drift logged\n{log}",
        case.name
    );
}

/// Runs `cases` one after another while the untouched Service is asked
/// from `client_ns`; then no untouched request may have failed, and
/// `status` shows the repairs.
fn run_table<W: World>(w: &W, core: &NetnsCore, client_ns: &str, cases: &[Case<W>]) {
    let flows = untouched(core, client_ns, cases.len());
    for case in cases {
        run_case(w, case);
    }
    flows.assert_unharmed();
    let status = text(&w.agent().sw(&["status"]));
    eprintln!("{status}");
    assert!(status.contains("Repairs:"), "{status}");
}

/// The untouched Service asked throughout a table: a steady client (a new
/// connection every 100 ms) and one established connection.
struct Untouched {
    steady: Child,
    idle: IdleClient,
}

impl Untouched {
    /// Neither the steady client nor the established connection failed.
    fn assert_unharmed(self) {
        let out = self.steady.wait_with_output().expect("steady client");
        let raw = String::from_utf8_lossy(&out.stdout).into_owned();
        let run = ClientRun::parse(&raw).unwrap_or_else(|e| panic!("{e:#}: {raw}"));
        assert!(run.attempts.len() > 10, "{raw}");
        assert_eq!(
            run.failures(),
            0,
            "the untouched Service failed a request:\n{raw}"
        );
        let (pod, attempt) = wake(self.idle);
        assert!(
            matches!(attempt, xtask::sandbox::Attempt::Ok { .. }),
            "the established connection to {pod} broke: {attempt:?}"
        );
    }
}

/// Starts [`Untouched`] from namespace `ns` of `core` for `cases` cases.
fn untouched(core: &NetnsCore, ns: &str, cases: usize) -> Untouched {
    let echo = sb_echo().to_string_lossy().into_owned();
    let keep = format!("{KEEP_IP}:80");
    let command = |args: &[&str]| {
        let mut cmd = vec![echo.as_str()];
        cmd.extend_from_slice(args);
        core.command(ns, &cmd)
    };
    let idle = open_idle_with(&command, &keep);
    let duration = (cases as u64 * 12_000).to_string();
    let mut steady = command(&[
        "client",
        "--tcp",
        &keep,
        "--duration-ms",
        &duration,
        "--interval-ms",
        "100",
        "--timeout-ms",
        "1000",
    ]);
    steady.stdin(Stdio::null()).stdout(Stdio::piped());
    let steady = steady.spawn().expect("start the steady client");
    Untouched { steady, idle }
}

// --- the demo sandbox ---------------------------------------------------

/// Every pod answers the ClusterIP's TCP and UDP ports from the client
/// namespace.
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

/// A host client in the sandbox's cgroup reaches the ClusterIP (only the
/// socket layer serves it).
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

/// The http frontend's (10.96.0.10:80/TCP, internal) entry at `slot`.
fn http_slot(sb: &Sandbox, slot: u64) -> Value {
    // The address too: the untouched Service has port 80 as well.
    sb.agent().slot([10, 96, 0, 10], 80, 6, slot)
}

/// A slot of the http frontend whose backend is pod 1 (never pod 3: the
/// untouched Service shares pod 3's backend entry).
fn pod1_slot(sb: &Sandbox) -> Value {
    let id = sb.agent().backend_id([10, 244, 1, 2], 6);
    (1..=3)
        .map(|slot| http_slot(sb, slot))
        .find(|e| e["formatted"]["value"]["backend_id"] == u64::from(id))
        .expect("a slot naming pod 1")
}

fn unpin_pod1_tcx(sb: &Sandbox) {
    let agent = sb.agent();
    let index = agent.ifindex(&sb.pod_if(1));
    for program in ["sb_from_pod", "sb_to_pod"] {
        agent.unpin(&format!("links/tcx_{index}_{program}"));
    }
}

fn unpin_connect4(sb: &Sandbox) {
    sb.agent().unpin("links/sb_sock_connect4");
}

fn detach_connect4(sb: &Sandbox) {
    sb.agent().detach_link("sb_sock_connect4");
}

fn delete_dns_slot0(sb: &Sandbox) {
    let key = [
        "0a", "60", "00", "0a", "00", "35", "11", "00", "00", "00", "00", "00",
    ]
    .map(String::from);
    sb.agent().bpftool_map("delete", "SB_FE_V1", &key, None);
}

fn corrupt_pod1_slot(sb: &Sandbox) {
    let slot = pod1_slot(sb);
    let mut value = bytes(&slot["value"]);
    // backend_id (the first u32): an id no backend has.
    value[..4].clone_from_slice(&["e7", "03", "00", "00"].map(String::from));
    sb.agent()
        .bpftool_map("update", "SB_FE_V1", &bytes(&slot["key"]), Some(&value));
}

fn delete_pod1_backend(sb: &Sandbox) {
    let slot = pod1_slot(sb);
    let id = slot["formatted"]["value"]["backend_id"]
        .as_u64()
        .expect("id") as u32;
    sb.agent()
        .bpftool_map("delete", "SB_BE_V1", &u32_key(id), None);
}

fn delete_http_revnat(sb: &Sandbox) {
    let head = http_slot(sb, 0);
    let id = head["formatted"]["value"]["service_id"]
        .as_u64()
        .expect("id") as u32;
    sb.agent()
        .bpftool_map("delete", "SB_RNAT_V1", &u32_key(id), None);
}

fn unpin_frontends(sb: &Sandbox) {
    sb.agent().unpin("SB_FE_V1");
}

fn delete_pod1_filters(sb: &Sandbox) {
    let iface = sb.pod_if(1);
    sb.agent().sh(&format!(
        "tc filter del dev {iface} ingress && tc filter del dev {iface} egress"
    ));
}

fn replace_pod1_qdisc(sb: &Sandbox) {
    let iface = sb.pod_if(1);
    // The agent may put its own qdisc back between the two (it follows
    // tc events): then `add` finds one, which is as good.
    sb.agent().sh(&format!(
        "tc qdisc del dev {iface} clsact && (tc qdisc add dev {iface} clsact 2>/dev/null || true)"
    ));
}

/// Runs `cases` on one demo sandbox (agent flags `args`), with the
/// untouched Service (pod 3) asked throughout from the client namespace.
fn heal_table(args: &[&str], cases: &[Case<Sandbox>]) {
    let mut sb = demo_sandbox_with(args);
    xtask::testenv::write_manifest(&sb, "keep.yaml", &keep_yaml("10.244.3.2", None));
    let sw_bin = switchboard();
    sb.wait_services(&sw_bin, Duration::from_secs(10), "demo/keep:http", |f| {
        xtask::sandbox::find(f, "demo/keep:http").is_some_and(|fe| fe.backends.len() == 1)
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let client_ns = sb.client_ns();
    run_table(&sb, &sb, &client_ns, cases);
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
                check: tcp_all_pods,
            },
            Case {
                name: "socket-layer link unpinned",
                damage: unpin_connect4,
                check: host_client,
            },
            Case {
                name: "socket-layer link detached, pin kept",
                damage: detach_connect4,
                check: host_client,
            },
            Case {
                name: "frontend slot 0 deleted",
                damage: delete_dns_slot0,
                check: tcp_all_pods,
            },
            Case {
                name: "slot names a missing backend",
                damage: corrupt_pod1_slot,
                check: tcp_all_pods,
            },
            Case {
                name: "backend entry deleted",
                damage: delete_pod1_backend,
                check: tcp_all_pods,
            },
            Case {
                name: "reverse-NAT entry deleted",
                damage: delete_http_revnat,
                check: tcp_all_pods,
            },
            Case {
                name: "frontend map unpinned",
                damage: unpin_frontends,
                check: tcp_all_pods,
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
                check: tcp_all_pods,
            },
            Case {
                name: "pod interface qdisc replaced",
                damage: replace_pod1_qdisc,
                check: tcp_all_pods,
            },
        ],
    );
}

// --- node A of the two-node sandbox -------------------------------------

/// Every pod of both nodes answers `addr` (TCP) from client 1, through
/// node A: local backends translated at node A's uplink both ways, remote
/// ones source-NATed to its uplink address.
fn all_pods_answer(sb: &TwoNodeSandbox, addr: &str) -> Result<(), String> {
    let run = sb
        .client(
            &sb_echo(),
            Client::One,
            // 40 random picks miss one of four pods about once in 25k checks.
            &["--tcp", addr, "--count", "40", "--timeout-ms", "500"],
        )
        .map_err(|e| format!("{e:#}"))?;
    let names: std::collections::BTreeSet<String> = run.names().into_iter().collect();
    if !run.all_ok() || names.len() < 4 {
        return Err(format!("{addr}: {} ({names:?})", run.raw));
    }
    Ok(())
}

/// `ext/web`'s NodePort on node A.
fn nodeport(sb: &TwoNodeSandbox) -> Result<(), String> {
    all_pods_answer(sb, &format!("{NODE_A_IP}:30080"))
}

/// `ext/web-lb`'s LoadBalancer IP (Maglev), routed via node A.
fn maglev_lb(sb: &TwoNodeSandbox) -> Result<(), String> {
    all_pods_answer(sb, &format!("{LB_IP}:80"))
}

fn uplink_index(sb: &TwoNodeSandbox) -> u32 {
    sb.agent().ifindex(&sb.uplink(Node::A))
}

fn detach_uplink_tcx(sb: &TwoNodeSandbox) {
    let index = uplink_index(sb);
    for program in ["sb_from_uplink", "sb_to_pod"] {
        sb.agent().detach_link(&format!("tcx_{index}_{program}"));
    }
}

/// `ip link set dev <uplink> xdp off`, or, where the kernel refuses that
/// for a program attached through a BPF link ("Can't replace active BPF
/// XDP link"), the link detached with `bpftool link detach`.
fn remove_uplink_xdp(sb: &TwoNodeSandbox) {
    let agent = sb.agent();
    let uplink = sb.uplink(Node::A);
    let out = sb
        .exec_status(
            &agent.ns,
            &["ip", "link", "set", "dev", &uplink, "xdp", "off"],
        )
        .expect("ip link");
    if !out.status.success() {
        eprintln!(
            "ip link set dev {uplink} xdp off: {}; detaching the XDP link instead",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        agent.detach_link(&format!("xdp_{}_native", uplink_index(sb)));
    }
}

fn delete_uplink_entry(sb: &TwoNodeSandbox) {
    let key = u32_key(uplink_index(sb));
    sb.agent().bpftool_map("delete", "SB_UPLINK_V1", &key, None);
}

/// Every entry of the LoadBalancer frontend's Maglev table pointed at a
/// UDP backend: a TCP flow from outside is sent to a pod's UDP port, and
/// refused.
fn corrupt_maglev_table(sb: &TwoNodeSandbox) {
    let agent = sb.agent();
    let [a, b, c, d] = LB_IP.parse::<std::net::Ipv4Addr>().expect("LB IP").octets();
    let head = agent.slot([a, b, c, d], 80, 6, 0);
    let service_id = head["formatted"]["value"]["service_id"]
        .as_u64()
        .expect("service id") as u32;
    let udp = agent.backend_id([10, 244, 1, 2], 17);
    let entry = u32_key(udp);
    let value: Vec<String> = (0..16381).flat_map(|_| entry.iter().cloned()).collect();
    agent.bpftool_map("update", "SB_MAGLEV_V1", &u32_key(service_id), Some(&value));
}

fn delete_uplink_filters(sb: &TwoNodeSandbox) {
    let uplink = sb.uplink(Node::A);
    sb.agent().sh(&format!(
        "tc filter del dev {uplink} ingress && tc filter del dev {uplink} egress"
    ));
}

/// Runs `cases` on node A of a two-node sandbox on `lan` (both agents with
/// flags `args`): every external Service under `Cluster` with all four
/// pods, `ext/web-lb` annotated `switchboard.io/lb-algorithm: maglev`, and
/// the untouched Service (podA2) asked throughout from podA1.
fn heal_table_two_node(lan: Lan, args: &[&str], cases: &[Case<TwoNodeSandbox>]) {
    let pods = Pod::all();
    let mut sb = two_node_sandbox_on(lan);
    sb.write_nodes().expect("write the Node manifests");
    sb.write_services(Policy::Cluster, &pods)
        .expect("write the Service manifests");
    crate::e2e_maglev::write_maglev_load_balancer(&sb);
    let keep_pod = Pod::new(Node::A, 2);
    sb.write_manifest(
        "keep.yaml",
        &keep_yaml(&keep_pod.ip(), Some(Node::A.name())),
    )
    .expect("write the untouched Service");
    let sw = switchboard();
    for node in Node::ALL {
        sb.start_agent(node, &sw, args)
            .unwrap_or_else(|e| panic!("start the agent of {}: {e:#}", node.name()));
    }
    for node in Node::ALL {
        wait_programmed(&mut sb, node, &pods);
        if let Err(e) = sb.wait_uplink_attached(node, Duration::from_secs(10)) {
            panic!("{e:#}");
        }
    }
    sb.wait_services(
        Node::A,
        &sw,
        Duration::from_secs(10),
        "demo/keep:http",
        |f| xtask::sandbox::find(f, "demo/keep:http").is_some_and(|fe| fe.backends.len() == 1),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let client_ns = sb.pod_ns(Pod::new(Node::A, 1));
    run_table(&sb, &sb, &client_ns, cases);
}

/// Node A with native XDP on its uplink (TCX links for tc).
#[test]
fn uplink_programs_maglev_tables_and_uplink_maps_are_repaired_within_ten_seconds() {
    heal_table_two_node(
        Lan::XdpReady,
        &["--xdp-mode", "native"],
        &[
            Case {
                name: "uplink TCX links detached, pins kept",
                damage: detach_uplink_tcx,
                check: nodeport,
            },
            Case {
                name: "uplink XDP program removed",
                damage: remove_uplink_xdp,
                check: nodeport,
            },
            Case {
                name: "Maglev table overwritten",
                damage: corrupt_maglev_table,
                check: maglev_lb,
            },
            Case {
                name: "uplink map entry deleted",
                damage: delete_uplink_entry,
                check: nodeport,
            },
        ],
    );
}

/// Node A with its uplink's tc programs as netlink filters.
#[test]
fn deleted_uplink_filters_are_repaired_within_ten_seconds() {
    heal_table_two_node(
        Lan::KindLike,
        &["--tc-attach", "netlink"],
        &[Case {
            name: "uplink filters deleted",
            damage: delete_uplink_filters,
            check: nodeport,
        }],
    );
}
