//! What the root-only integration tests (`xtask/tests/*.rs`) need from their
//! environment: the binaries `cargo xtask test` built, and root.
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::sandbox::two_node::manifests::{EntryPoint, ExternalService, Policy, Proto};
use crate::sandbox::two_node::{Lan, Node, Pod};
use crate::sandbox::{
    find, find_at, pod_ip, pod_name, Attempt, ClientRun, NetnsCore, Sandbox, TwoNodeSandbox, PODS,
};

/// A binary named by environment variable `var`. Panics with the command to
/// run when it is unset or missing: these tests never pass silently.
fn bin(var: &str) -> PathBuf {
    let path = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run the end-to-end tests with `cargo xtask test` (as root), which builds the binaries and sets it")
    });
    let path = PathBuf::from(path);
    assert!(
        path.exists(),
        "{var}={} does not exist: run `cargo xtask test`",
        path.display()
    );
    path
}

/// `SWITCHBOARD_BIN`: the agent and CLI.
pub fn switchboard() -> PathBuf {
    bin("SWITCHBOARD_BIN")
}

/// `SB_ECHO_BIN`: the pod server and client.
pub fn sb_echo() -> PathBuf {
    bin("SB_ECHO_BIN")
}

/// The `sb-echo client` arguments of ten 3000-byte UDP datagrams to `addr`
/// on a connected socket, each answered with 3000 bytes: at MTU 1500 every
/// one is fragmented, both ways.
pub fn fragmented_udp_args(addr: &str) -> [&str; 10] {
    [
        "--udp",
        addr,
        "--udp-mode",
        "connected",
        "--udp-size",
        "3000",
        "--count",
        "10",
        "--timeout-ms",
        "1000",
    ]
}

pub fn require_root() {
    assert!(
        crate::util::is_root(),
        "the netns end-to-end tests need root: run `cargo xtask test` as root"
    );
}

/// A sandbox with pods and an agent (started with `agent_args` on top of the
/// sandbox's own) serving the demo manifests, programmed with all three pods
/// on both ports.
pub fn demo_sandbox_with(agent_args: &[&str]) -> Sandbox {
    require_root();
    let (sw, echo) = (switchboard(), sb_echo());
    let mut sb = Sandbox::for_test().expect("create sandbox");
    sb.copy_manifests(&crate::util::repo_root().join("manifests/demo"))
        .expect("copy the demo manifests");
    sb.start_pods(&echo).expect("start pods");
    sb.start_agent_with(&sw, agent_args).expect("start agent");
    if let Err(e) = sb.wait_services(
        &sw,
        Duration::from_secs(10),
        "demo/echo:http and demo/echo:dns with 3 backends",
        |f| {
            ["demo/echo:http", "demo/echo:dns"]
                .iter()
                .all(|s| find(f, s).is_some_and(|fe| fe.backends.len() == PODS))
        },
    ) {
        panic!("{e:#}");
    }
    sb
}

/// Replaces a manifest atomically (write elsewhere, then rename into the
/// watched directory), the way editors and `kubectl ... > tmp && mv` do.
pub fn write_manifest(sb: &Sandbox, name: &str, contents: &str) {
    let tmp = sb.dir.join(format!(".{name}.tmp"));
    fs::write(&tmp, contents).expect("write the manifest");
    fs::rename(&tmp, sb.manifest_dir().join(name)).expect("write the manifest");
}

/// An EndpointSlice for `demo/echo` with the given pods (1-based) as endpoints.
pub fn endpointslice_yaml(pods: &[usize]) -> String {
    let mut s = String::from(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
         metadata:\n  name: echo-abc12\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: echo\n\
         endpoints:\n",
    );
    for &i in pods {
        s.push_str(&format!(
            "- addresses:\n  - {}\n  conditions:\n    ready: true\n  targetRef:\n    kind: Pod\n    name: {}\n    namespace: demo\n",
            pod_ip(i),
            pod_name(i)
        ));
    }
    s.push_str(
        "ports:\n- name: http\n  port: 8080\n  protocol: TCP\n- name: dns\n  port: 5353\n  protocol: UDP\n",
    );
    s
}

/// A kind-like two-node sandbox (`TwoNodeSandbox::for_test`) with `sb-echo`
/// answering in its four pods; no agents yet.
pub fn two_node_sandbox() -> TwoNodeSandbox {
    two_node_sandbox_on(Lan::KindLike)
}

/// [`two_node_sandbox`] on the LAN `lan` ([`Lan::XdpReady`] for tests about
/// native XDP on veth uplinks).
pub fn two_node_sandbox_on(lan: Lan) -> TwoNodeSandbox {
    require_root();
    let mut sb = TwoNodeSandbox::for_test_on(lan)
        .unwrap_or_else(|e| panic!("create the two-node sandbox: {e:#}"));
    sb.start_pods(&sb_echo())
        .unwrap_or_else(|e| panic!("start the pods: {e:#}"));
    sb
}

/// A two-node sandbox with both Node manifests, every `ExternalService` under
/// `policy` with `endpoints`, and an agent on each node (started with
/// `agent_args` on top of the sandbox's own), each programmed (see
/// [`wait_programmed`]) and with a program on its uplink.
pub fn two_node_with_agents(
    policy: Policy,
    endpoints: &[Pod],
    agent_args: &[&str],
) -> TwoNodeSandbox {
    two_node_with_agents_on(Lan::KindLike, policy, endpoints, agent_args)
}

/// [`two_node_with_agents`] on the LAN `lan`.
pub fn two_node_with_agents_on(
    lan: Lan,
    policy: Policy,
    endpoints: &[Pod],
    agent_args: &[&str],
) -> TwoNodeSandbox {
    let mut sb = two_node_sandbox_on(lan);
    sb.write_nodes().expect("write the Node manifests");
    sb.write_services(policy, endpoints)
        .expect("write the Service manifests");
    let sw = switchboard();
    for node in Node::ALL {
        sb.start_agent(node, &sw, agent_args)
            .unwrap_or_else(|e| panic!("start the agent of {}: {e:#}", node.name()));
    }
    for node in Node::ALL {
        wait_programmed(&mut sb, node, endpoints);
        if let Err(e) = sb.wait_uplink_attached(node, Duration::from_secs(10)) {
            panic!("{e:#}");
        }
    }
    sb
}

/// Waits (10 s at most) until `node`'s maps hold a frontend for every
/// entry point of every `ExternalService` through that node, each with all
/// `endpoints` as backends or exactly `node`'s own among them (what a
/// `Local` policy may leave for traffic from outside). Panics with the agent
/// log otherwise.
pub fn wait_programmed(sb: &mut TwoNodeSandbox, node: Node, endpoints: &[Pod]) {
    let all = backend_set(endpoints.iter().copied());
    let local = backend_set(endpoints.iter().copied().filter(|p| p.node == node));
    let wanted: Vec<EntryPoint> = ExternalService::ALL
        .iter()
        .flat_map(|s| s.entry_points(node))
        .collect();
    let what = format!(
        "frontends {} with backends {:?}",
        wanted
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        endpoints.iter().map(|p| p.ip()).collect::<Vec<_>>()
    );
    let result = sb.wait_services(node, &switchboard(), Duration::from_secs(10), &what, |f| {
        wanted.iter().all(|e| {
            find_at(f, &e.address, e.port, e.proto.as_str()).is_some_and(|fe| {
                let got = fe.backend_addrs();
                got == backends_for(&all, e.proto) || got == backends_for(&local, e.proto)
            })
        })
    });
    if let Err(e) = result {
        panic!("{e:#}");
    }
}

/// Pod addresses, sorted.
fn backend_set(pods: impl Iterator<Item = Pod>) -> Vec<String> {
    let mut v: Vec<String> = pods.map(|p| p.ip()).collect();
    v.sort();
    v
}

/// `ip:port` of the pods' server for `proto`, sorted (as `backend_addrs`).
fn backends_for(ips: &[String], proto: Proto) -> Vec<String> {
    let mut v: Vec<String> = ips
        .iter()
        .map(|ip| format!("{ip}:{}", proto.pod_port()))
        .collect();
    v.sort();
    v
}

/// `sb-echo <args>` in namespace `ns` of `sb`.
pub fn sb_echo_in(sb: &Sandbox, ns: &str, args: &[&str]) -> Command {
    let bin = sb_echo().to_string_lossy().into_owned();
    let mut cmd = vec![bin.as_str()];
    cmd.extend_from_slice(args);
    sb.command(ns, &cmd)
}

/// A TCP connection through a Service, greeted by its pod and left idle
/// until [`wake`].
pub struct IdleClient {
    child: Child,
    /// The pod that greeted it.
    pub pod: String,
}

/// Opens an [`IdleClient`] to `addr` from where `sb_echo` runs `sb-echo`.
pub fn open_idle_with(sb_echo: &dyn Fn(&[&str]) -> Command, addr: &str) -> IdleClient {
    let mut cmd = sb_echo(&[
        "client",
        "--tcp",
        addr,
        "--idle-until-stdin",
        "--count",
        "5",
        "--timeout-ms",
        "2000",
    ]);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = cmd.spawn().expect("start the idle client");
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the greeting");
    let pod = match line.split_whitespace().collect::<Vec<_>>()[..] {
        ["connected", pod, ..] => pod.to_owned(),
        _ => panic!("idle client did not connect: {line:?}"),
    };
    IdleClient { child, pod }
}

/// Tells the idle client to use its connection: (the pod that greeted it,
/// how its five exchanges went).
pub fn wake(mut idle: IdleClient) -> (String, Attempt) {
    idle.child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(b"go\n")
        .expect("wake the idle client");
    let out = idle
        .child
        .wait_with_output()
        .expect("wait for the idle client");
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    let run = ClientRun::parse(&raw).unwrap_or_else(|e| panic!("{e:#}: {raw}"));
    let attempt = run
        .attempts
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no result: {raw}"));
    (idle.pod, attempt)
}

/// Waits until the sandbox's agent log contains `needle`; panics with the
/// log after `timeout`.
pub fn wait_agent_log(sb: &Sandbox, needle: &str, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while !sb.agent_log().contains(needle) {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never logged {needle:?} within {timeout:?}\n--- agent log ---\n{}",
            sb.agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `cmd`'s standard output; panics with its error output when it cannot
/// start or exits non-zero.
pub fn stdout_of(cmd: &mut Command) -> Vec<u8> {
    let shown = crate::util::show(cmd);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("start `{shown}`: {e}"));
    assert!(
        out.status.success(),
        "`{shown}`: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `switchboard <args> --pin-root <pin>`'s standard output (the maps are
/// read from the BPF file system, in no network namespace); panics on
/// failure.
pub fn switchboard_out(args: &[&str], pin: &Path) -> Vec<u8> {
    stdout_of(
        Command::new(switchboard())
            .args(args)
            .arg("--pin-root")
            .arg(pin),
    )
}

/// What `switchboard status` (the agent on pin root `pin`) shows on its line
/// labelled `label` (`"NodePort mode:"`), trimmed, if it has that line; and
/// the whole output, for a failing test's message.
pub fn status_line(pin: &Path, label: &str) -> (Option<String>, String) {
    let out = String::from_utf8_lossy(&switchboard_out(&["status"], pin)).into_owned();
    let value = out
        .lines()
        .find_map(|l| l.strip_prefix(label))
        .map(|v| v.trim().to_owned());
    (value, out)
}

/// `bpftool -j <args>`, parsed; panics on failure.
pub fn bpftool_json(args: &[&str]) -> serde_json::Value {
    let out = stdout_of(Command::new("bpftool").arg("-j").args(args));
    serde_json::from_slice(&out).expect("bpftool JSON")
}

/// The data-path counters of the agent on pin root `pin`, by name
/// (`switchboard stats -o json`).
pub fn counters(pin: &Path) -> BTreeMap<String, u64> {
    let out = switchboard_out(&["stats", "-o", "json"], pin);
    let report: serde_json::Value = serde_json::from_slice(&out).expect("stats -o json parses");
    serde_json::from_value(report["counters"].clone()).expect("counters by name")
}

/// The counter `name` of [`counters`]; panics when there is none.
pub fn counter(pin: &Path, name: &str) -> u64 {
    let counters = counters(pin);
    counters
        .get(name)
        .copied()
        .unwrap_or_else(|| panic!("no counter {name}: {counters:?}"))
}

/// Every attempt of `run` (to `entry`) succeeded, was answered by one of
/// `pods`, showed `entry` as the client's peer and `peer_ip` as the pod's.
pub fn assert_answers(run: &ClientRun, entry: &EntryPoint, pods: &[Pod], peer_ip: &str, why: &str) {
    assert!(
        run.all_ok(),
        "{entry}: {} of {} attempts failed ({why}):\n{}",
        run.failures(),
        run.attempts.len(),
        run.raw
    );
    let answered: BTreeSet<String> = run.names().into_iter().collect();
    let allowed: BTreeSet<String> = pods.iter().map(|p| p.name()).collect();
    assert!(
        answered.is_subset(&allowed),
        "{entry}: answered by {answered:?}, expected only {allowed:?} ({why}):\n{}",
        run.raw
    );
    assert_eq!(
        run.client_saw(),
        vec![entry.addr()],
        "{entry}: the client saw another peer (replies not reverse-NATed):\n{}",
        run.raw
    );
    assert_eq!(
        pod_saw_ips(run),
        BTreeSet::from([peer_ip.to_string()]),
        "{entry}: the pods saw another peer address than {peer_ip} ({why}):\n{}",
        run.raw
    );
}

/// The addresses (without port) the pods saw as their peer, of either
/// family (`addr:port` or `[addr]:port`).
pub fn pod_saw_ips(run: &ClientRun) -> BTreeSet<String> {
    run.attempts
        .iter()
        .filter_map(|a| match a {
            Attempt::Ok { pod_saw, .. } => pod_saw.parse::<std::net::SocketAddr>().ok(),
            Attempt::Err { .. } => None,
        })
        .map(|addr| addr.ip().to_string())
        .collect()
}

// --- `switchboard trace` readers ------------------------------------------

/// How long a trace event may take from the packet to the reader.
pub const TRACE_WITHIN: Duration = Duration::from_secs(1);

/// Starts `switchboard trace --pin-root <pin> -o json <args>` in namespace
/// `ns` of `core` as process `label`, and waits (5 s at most) until the agent
/// logging as `agent_label` counts it as a client.
pub fn start_trace(
    core: &mut NetnsCore,
    (ns, pin, agent_label): (&str, &Path, &str),
    label: &str,
    args: &[&str],
) {
    let joined = |core: &NetnsCore| {
        core.read_log(agent_label)
            .matches("trace: a client joined")
            .count()
    };
    let joined_before = joined(core);
    let (sw, pin) = (switchboard(), pin.to_string_lossy().into_owned());
    let sw = sw.to_string_lossy();
    let mut cmd = vec![&*sw, "trace", "--pin-root", &pin, "-o", "json"];
    cmd.extend_from_slice(args);
    core.spawn(label, ns, &cmd)
        .expect("start switchboard trace");
    let deadline = Instant::now() + Duration::from_secs(5);
    while joined(core) <= joined_before {
        assert!(
            Instant::now() < deadline,
            "{label} never joined:\n{}\n--- agent ---\n{}",
            core.read_log(label),
            core.read_log(agent_label)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The events the trace reader `label` printed so far.
pub fn trace_events(core: &NetnsCore, label: &str) -> Vec<serde_json::Value> {
    core.read_log(label)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["record"] == "event")
        .collect()
}

/// Waits (at most [`TRACE_WITHIN`]) for an event of reader `label` that
/// `pred` accepts; panics with the reader's output otherwise.
pub fn wait_trace_event(
    core: &NetnsCore,
    label: &str,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + TRACE_WITHIN;
    loop {
        if let Some(e) = trace_events(core, label).into_iter().find(&pred) {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} within {TRACE_WITHIN:?} in:\n{}",
            core.read_log(label)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
