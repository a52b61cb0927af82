//! Netns end-to-end tests of `switchboard trace` (root only), in the demo
//! sandbox (`demo/echo` on 10.96.0.10, three pods) with one more Service
//! without endpoints (`demo/empty`, 10.96.0.20:80):
//!
//! - each event type appears, with the right fields, within a second of the
//!   packet: a new flow through the tc layer (client, frontend, backend,
//!   Service, algorithm) and through the socket layer, a reject (no
//!   endpoint: `rejected`, answered);
//! - several readers at once, each with a filter (client, frontend,
//!   backend, Service, protocol, type), see exactly the events of an
//!   unfiltered reader that their filter selects;
//! - readers killed with SIGKILL leave the kernel's switch at 0 within a
//!   second, read from the kernel (the agent's map, found through its file
//!   descriptors, dumped with bpftool);
//! - in the two-node sandbox (`xtask::sandbox::two_node`), a NodePort
//!   connection from an outside client shows on a reader of the entry node
//!   as a new flow of the uplink layer that decided it (tc with the agents'
//!   defaults on veth uplinks, xdp with `--xdp-mode generic` or `native`),
//!   with the client's own address (though the pod sees the entry node's),
//!   the NodePort frontend and the pod that answered; over IPv4 (`ext/web`)
//!   and IPv6 (`ext/web6`, `e2e_external6`'s dual-stack sandbox).
//!
//! The binaries come from `cargo xtask test` (SWITCHBOARD_BIN, SB_ECHO_BIN).
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::e2e_external6::dual_stack_with_agents;
use xtask::sandbox::two_node::manifests::{
    EntryPoint, ExternalService, Policy, Proto, DUAL_NODEPORT_TCP, NODEPORT_TCP,
};
use xtask::sandbox::two_node::{Client, Node, Pod};
use xtask::sandbox::{
    find_at, pod_ip, Lan, Sandbox, TwoNodeSandbox, AGENT, CLIENT_IP, CLUSTER_IP, POD_TCP_PORT,
};
use xtask::testenv::{
    bpftool_json, demo_sandbox_with, open_idle_with, sb_echo, switchboard, trace_events,
    two_node_with_agents, two_node_with_agents_on, wait_trace_event, wake, write_manifest,
    TRACE_WITHIN as WITHIN,
};

const EMPTY_IP: &str = "10.96.0.20";

const EMPTY: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: empty\n  namespace: demo\n\
spec:\n  clusterIP: 10.96.0.20\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n\
---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
metadata:\n  name: empty-abc12\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: empty\n\
ports:\n- name: http\n  port: 8080\n  protocol: TCP\nendpoints: []\n";

/// The demo sandbox with `demo/empty` programmed too.
fn sandbox() -> Sandbox {
    sandbox_with(&[])
}

/// [`sandbox`] with `agent_args` for its agent.
fn sandbox_with(agent_args: &[&str]) -> Sandbox {
    let mut sb = demo_sandbox_with(agent_args);
    add_without_backends(&mut sb, ("empty.yaml", EMPTY), "demo/empty:http");
    sb
}

/// Writes manifest `file` and waits until its frontend `service` is
/// programmed without a backend (on this node).
fn add_without_backends(sb: &mut Sandbox, (file, yaml): (&str, &str), service: &str) {
    write_manifest(sb, file, yaml);
    sb.wait_services(
        &switchboard(),
        Duration::from_secs(10),
        &format!("{service} without a backend"),
        |f| xtask::sandbox::find(f, service).is_some_and(|fe| fe.backends.is_empty()),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Starts `switchboard trace -o json <args>` in the node namespace as
/// `label`, and waits until the agent counts it as a client.
fn start_trace(sb: &mut Sandbox, label: &str, args: &[&str]) {
    let (ns, pin) = (sb.node_ns(), sb.pin_dir.clone());
    xtask::testenv::start_trace(sb, (&ns, &pin, AGENT), label, args);
}

/// One TCP connection from `ns` (outside the sandbox's cgroup: the tc
/// layer serves it) to `addr`; its outcome does not matter.
fn connect(sb: &Sandbox, ns: &str, addr: &str) {
    let _ = sb.client_in(&sb_echo(), ns, &["--tcp", addr, "--count", "1"]);
}

fn pod_ips() -> Vec<String> {
    (1..=xtask::sandbox::PODS)
        .map(|i| format!("{}:{POD_TCP_PORT}", pod_ip(i)))
        .collect()
}

#[test]
fn each_event_type_appears_with_its_fields_within_a_second() {
    let mut sb = sandbox();
    start_trace(&mut sb, "trace", &[]);
    let client = sb.client_ns();
    let http = format!("{CLUSTER_IP}:80");

    connect(&sb, &client, &http);
    let e = wait_trace_event(&sb, "trace", "tc new flow", |e| {
        e["kind"] == "new-flow" && e["layer"] == "tc"
    });
    assert_eq!(
        e["client"].as_str().unwrap().split(':').next(),
        Some(CLIENT_IP),
        "{e}"
    );
    assert_eq!(e["frontend"], http.as_str(), "{e}");
    assert!(
        pod_ips().contains(&e["backend"].as_str().unwrap().to_owned()),
        "{e}"
    );
    assert_eq!(e["service"], "demo/echo:http", "{e}");
    assert_eq!(e["protocol"], "tcp", "{e}");
    assert_eq!(e["family"], 4, "{e}");
    assert_eq!(e["algorithm"], "random", "{e}");

    connect(&sb, &client, &format!("{EMPTY_IP}:80"));
    let e = wait_trace_event(&sb, "trace", "reject", |e| e["kind"] == "drop");
    assert_eq!(e["reason"], "rejected", "{e}");
    assert_eq!(e["verdict"], "answered", "{e}");
    assert_eq!(e["service"], "demo/empty:http", "{e}");
    assert_eq!(e["frontend"], format!("{EMPTY_IP}:80").as_str(), "{e}");

    // The socket layer: a client of the node in the sandbox's cgroup.
    let node = sb.node_ns();
    sb.client_in_cgroup(&sb_echo(), &node, &["--tcp", &http, "--count", "1"])
        .expect("socket-layer client");
    let e = wait_trace_event(&sb, "trace", "socket-layer new flow", |e| {
        e["kind"] == "new-flow" && e["layer"] == "socket"
    });
    assert_eq!(e["frontend"], http.as_str(), "{e}");
    assert!(
        pod_ips().contains(&e["backend"].as_str().unwrap().to_owned()),
        "{e}"
    );
    assert_eq!(e["service"], "demo/echo:http", "{e}");
}

/// The value of the trace switch in the kernel: the agent's
/// switch map (`names::TRACE_ON`, its first 15 characters in the kernel),
/// found among its open map descriptors.
fn kernel_switch(agent_pid: u32) -> u64 {
    let name = &proxy_common::names::TRACE_ON[..15];
    let fds = std::fs::read_dir(format!("/proc/{agent_pid}/fdinfo")).expect("agent fdinfo");
    for fd in fds.flatten() {
        let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
        let Some(id) = info
            .lines()
            .find_map(|l| l.strip_prefix("map_id:"))
            .map(|v| v.trim().to_owned())
        else {
            continue;
        };
        let show = xtask::testenv::bpftool_json(&["map", "show", "id", &id]);
        if show["name"] != name {
            continue;
        }
        let dump =
            xtask::testenv::bpftool_json(&["map", "lookup", "id", &id, "key", "0", "0", "0", "0"]);
        let bytes: Vec<u8> = dump["value"]
            .as_array()
            .expect("value bytes")
            .iter()
            .map(|b| u8::from_str_radix(b.as_str().unwrap().trim_start_matches("0x"), 16).unwrap())
            .collect();
        return u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    }
    panic!("the agent holds no {name}");
}

/// What a reader's filter selects, decided by the test from an event.
type Selects = Box<dyn Fn(&Value) -> bool>;

#[test]
fn filters_select_exactly_their_events_and_killed_readers_switch_off() {
    let mut sb = sandbox();
    let agent = sb.agent_pid().expect("agent pid");
    assert_eq!(kernel_switch(agent), 0, "tracing on before any reader");
    let pod1 = pod_ip(1);
    // Each reader's filter, and what it selects as this test decides it.
    let ip = |v: &Value| {
        v.as_str()
            .map(|s| s.rsplit_once(':').map_or(s, |(ip, _)| ip).to_owned())
    };
    let backend_ip = pod1.clone();
    let filters: [(&str, Vec<&str>, Selects); 5] = [
        (
            "by-client",
            vec!["--client", "10.244.100.0/24", "--type", "new-flow"],
            Box::new(move |e| {
                e["kind"] == "new-flow"
                    && ip(&e["client"]).is_some_and(|c| c.starts_with("10.244.100."))
            }),
        ),
        (
            "by-frontend",
            vec!["--frontend", "10.96.0.20:80"],
            Box::new(|e| e["frontend"] == "10.96.0.20:80"),
        ),
        (
            "by-backend",
            vec!["--backend", &pod1],
            Box::new(move |e| ip(&e["backend"]).as_deref() == Some(backend_ip.as_str())),
        ),
        (
            "by-service",
            vec!["--service", "demo/echo"],
            Box::new(|e| {
                e["service"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("demo/echo:"))
            }),
        ),
        (
            "by-proto",
            vec!["--protocol", "udp"],
            Box::new(|e| e["protocol"] == "udp"),
        ),
    ];
    start_trace(&mut sb, "all", &[]);
    for (label, args, _) in &filters {
        start_trace(&mut sb, label, args);
    }
    assert_eq!(
        kernel_switch(agent),
        0b111,
        "the union of the readers' types"
    );

    let (client, pod2) = (sb.client_ns(), sb.pod_ns(2));
    let http = format!("{CLUSTER_IP}:80");
    for _ in 0..6 {
        connect(&sb, &client, &http);
    }
    for _ in 0..3 {
        connect(&sb, &pod2, &http);
    }
    connect(&sb, &client, &format!("{EMPTY_IP}:80"));
    let _ = sb.client_in(
        &sb_echo(),
        &client,
        &["--udp", &format!("{CLUSTER_IP}:53"), "--count", "2"],
    );
    // Every reader has had its second.
    std::thread::sleep(WITHIN);

    let all = trace_events(&sb, "all");
    let new_flows = all.iter().filter(|e| e["kind"] == "new-flow").count();
    assert!(
        new_flows >= 10,
        "the unfiltered reader saw {new_flows} new flows:\n{all:#?}"
    );
    for (label, _, selects) in &filters {
        let want: Vec<&Value> = all.iter().filter(|e| selects(e)).collect();
        let got = trace_events(&sb, label);
        assert!(
            !want.is_empty(),
            "{label}: no event to select in:\n{all:#?}"
        );
        assert_eq!(got.iter().collect::<Vec<_>>(), want, "{label}");
    }

    // SIGKILL every reader: nothing stays switched on.
    for label in std::iter::once("all").chain(filters.iter().map(|(l, _, _)| *l)) {
        sb.kill(label).expect("kill the reader");
    }
    let killed = Instant::now();
    while kernel_switch(agent) != 0 {
        assert!(
            killed.elapsed() < WITHIN,
            "tracing still on after its readers were killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// --- from outside the node: the uplink layers (two-node sandbox) ----------

/// The address of an event's `IP:PORT` (`[IPv6]:PORT`) field.
fn ip_of(v: &Value) -> Option<String> {
    v.as_str()
        .and_then(|c| c.rsplit_once(':'))
        .map(|(ip, _)| ip.trim_matches(['[', ']']).to_owned())
}

/// Asserts that event `e` was stamped within [`WITHIN`] of `sent`, the wall
/// clock when its packet was sent.
fn assert_stamped_within(e: &Value, sent: std::time::SystemTime) {
    let sent = sent
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let after = e["time"].as_f64().expect("time") - sent;
    assert!(
        (-0.01..WITHIN.as_secs_f64()).contains(&after),
        "stamped {after:.3} s after the packet was sent: {e}"
    );
}

/// The NodePort `entry` of node A reached over TCP by outside client 1
/// (backends on node B, `Cluster` policy: the pod sees node A's address
/// after SNAT) shows, within a second, on a reader on node A as a new flow
/// of `layer` with the client's own address (`client_ip`), the NodePort
/// frontend, the node-B pod that answered (`backend_ip` of it) and
/// `service`.
fn assert_uplink_new_flow_traced(
    mut sb: TwoNodeSandbox,
    entry: &EntryPoint,
    (client_ip, backend_ip): (&str, fn(&Pod) -> String),
    service: &str,
    layer: &str,
) {
    let (ns, pin) = (sb.node_ns(Node::A), sb.pin_dir(Node::A));
    let agent = TwoNodeSandbox::agent_label(Node::A);
    xtask::testenv::start_trace(&mut sb, (&ns, &pin, &agent), "trace-a", &[]);

    let run = sb
        .hit(&sb_echo(), Client::One, entry, 1, 1000)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(run.all_ok(), "{entry}:\n{}", run.raw);
    let e = wait_trace_event(&sb, "trace-a", "uplink new flow", |e| {
        e["kind"] == "new-flow" && e["frontend"] == entry.addr().as_str()
    });
    assert_eq!(e["layer"], layer, "{e}");
    assert_eq!(
        ip_of(&e["client"]).as_deref(),
        Some(client_ip),
        "the client's own address: {e}"
    );
    let answered = &run.names()[0];
    let backend = Node::B
        .pods()
        .iter()
        .find(|p| &p.name() == answered)
        .map(backend_ip);
    assert_eq!(
        ip_of(&e["backend"]),
        backend,
        "the pod that answered ({answered}): {e}"
    );
    assert_eq!(e["service"], service, "{e}");
    assert_eq!(e["protocol"], "tcp", "{e}");
    assert_eq!(
        e["family"],
        if client_ip.contains(':') { 6 } else { 4 },
        "{e}"
    );
}

/// The TCP NodePort of node A in `family`, backends on node B: `ext/web`
/// on node A's IPv4 address, or the dual-stack `ext/web6` on its IPv6
/// address (`e2e_external6`'s sandbox), traced in `layer`.
fn uplink_new_flow_is_traced(family: u8, lan: Lan, agent_args: &[&str], layer: &str) {
    let pods = Node::B.pods();
    let (sb, address, port, ips, service) = if family == 4 {
        let sb = two_node_with_agents_on(lan, Policy::Cluster, &pods, agent_args);
        let ips: (&str, fn(&Pod) -> String) = (Client::One.ip(), |p| p.ip());
        (sb, Node::A.ip(), NODEPORT_TCP, ips, "ext/web:http")
    } else {
        let sb = dual_stack_with_agents(lan, Policy::Cluster, &pods, agent_args);
        let ips: (&str, fn(&Pod) -> String) = (Client::One.ip6(), |p| p.ip6());
        (sb, Node::A.ip6(), DUAL_NODEPORT_TCP, ips, "ext/web6:http")
    };
    let entry = EntryPoint {
        address: address.to_string(),
        port,
        proto: Proto::Tcp,
    };
    assert_uplink_new_flow_traced(sb, &entry, ips, service, layer);
}

/// The agents' defaults on the kind-like LAN: XDP stays off on the veth
/// uplink, the tc program decides.
#[test]
fn outside_nodeport_new_flow_is_traced_at_tc() {
    uplink_new_flow_is_traced(4, Lan::KindLike, &[], "tc");
}

/// Generic XDP on the XDP-ready LAN: the XDP program decides.
#[test]
fn outside_nodeport_new_flow_is_traced_at_xdp() {
    uplink_new_flow_is_traced(4, Lan::XdpReady, &["--xdp-mode", "generic"], "xdp");
}

#[test]
fn outside_nodeport6_new_flow_is_traced_at_tc() {
    uplink_new_flow_is_traced(6, Lan::KindLike, &[], "tc");
}

#[test]
fn outside_nodeport6_new_flow_is_traced_at_xdp() {
    uplink_new_flow_is_traced(6, Lan::XdpReady, &["--xdp-mode", "native"], "xdp");
}

// --- a flood of drops while tracing ----------------------------------------

const FLOOD_IP: &str = "10.96.0.30";

/// `demo/flood` (10.96.0.30:80): `internalTrafficPolicy: Local`, its one
/// endpoint on another node: this node (the agent's `--node-name node`,
/// its Node object here without addresses) has none of its own, so what is
/// sent to it is dropped (`drop_no_backend`), not answered.
const FLOOD: &str = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node\n\
status:\n  addresses:\n  - type: Hostname\n    address: node\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: flood\n  namespace: demo\n\
spec:\n  clusterIP: 10.96.0.30\n  internalTrafficPolicy: Local\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n\
---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
metadata:\n  name: flood-abc12\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: flood\n\
endpoints:\n- addresses:\n  - 10.244.9.9\n  conditions:\n    ready: true\n  nodeName: elsewhere\n\
ports:\n- name: http\n  port: 8080\n  protocol: TCP\n";

/// Packets in the flood: the whole million (on 2 cores the sender takes
/// 3-4.5 s; the test 9-11 s).
const FLOOD_PACKETS: u64 = 1_000_000;

/// Field `field` (`VmRSS`, `VmHWM`) of `/proc/<pid>/status`, in KiB.
fn vm_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in:\n{status}"))
}

/// The `lost` records of reader `label`, summed: (kernel, reader).
fn trace_lost(sb: &Sandbox, label: &str) -> (u64, u64) {
    sb.read_log(label)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["record"] == "lost")
        .fold((0, 0), |(k, r), v| {
            (
                k + v["kernel"].as_u64().unwrap_or(0),
                r + v["reader"].as_u64().unwrap_or(0),
            )
        })
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child of this test; the result is checked.
    let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// A flood of [`FLOOD_PACKETS`] SYNs (spoofed sources, a raw socket in the
/// client's namespace) to `demo/flood`, each one a `drop_no_backend` event,
/// while two readers trace: one that asks for everything and is stopped
/// (SIGSTOP) for the flood, the slowest reader there is, and one that
/// follows `demo/echo`. Meanwhile pod 2 keeps opening connections through
/// `demo/echo`. Then:
/// - the agent's resident memory, peak included (`VmHWM`, reset before the
///   flood), grew by less than 4 MiB (measured: 0-1.3 MiB, the stopped
///   reader's full queue being 4,096 lines of about 330 bytes; that reader
///   alone misses some 700k events, which a queue without a bound would
///   hold as more than 200 MiB);
/// - every connection through `demo/echo` was answered;
/// - every drop the kernel counted reached the stopped reader, or was
///   reported to it as lost (by the kernel's ring buffer, or its own full
///   queue), and both readers were told the same kernel losses.
#[test]
fn a_flood_of_drops_while_tracing_leaves_rss_and_forwarding_alone_and_counts_losses() {
    const RSS_GROWTH_KIB: u64 = 4 * 1024;
    // The demo's endpoints are on Node `node`: this one.
    let mut sb = sandbox_with(&["--node-name", "node"]);
    add_without_backends(&mut sb, ("flood.yaml", FLOOD), "demo/flood:http");
    let agent = sb.agent_pid().expect("agent pid");
    let http = format!("{CLUSTER_IP}:80");
    start_trace(&mut sb, "stalled", &[]);
    start_trace(&mut sb, "echo", &["--frontend", &http]);
    signal(sb.pid("stalled").expect("stalled reader"), libc::SIGSTOP);

    let (client, pod2) = (sb.client_ns(), sb.pod_ns(2));
    let drops_before = xtask::testenv::counter(&sb.pin_dir, "drop_no_backend");
    // The peak (VmHWM) starts again from the resident size now.
    std::fs::write(format!("/proc/{agent}/clear_refs"), "5").expect("reset the agent's peak");
    let rss_before = vm_kib(agent, "VmRSS");

    let echo_bin = sb_echo().to_string_lossy().into_owned();
    let (flood_to, count) = (format!("{FLOOD_IP}:80"), FLOOD_PACKETS.to_string());
    let started = Instant::now();
    let mut flood = sb
        .command(
            &client,
            &[
                &echo_bin,
                "synflood",
                "--to",
                &flood_to,
                "--count",
                &count,
                "--duration-ms",
                "30000",
            ],
        )
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the flood");
    let mut checks = Vec::new();
    while flood.try_wait().expect("the flood").is_none() {
        let run = sb
            .client_in(
                &sb_echo(),
                &pod2,
                &["--tcp", &http, "--count", "5", "--interval-ms", "20"],
            )
            .expect("run a client");
        checks.push(run);
    }
    let flood_out = flood.wait_with_output().expect("the flood");
    let flood_took = started.elapsed();
    let rss_after = vm_kib(agent, "VmRSS");
    let peak = vm_kib(agent, "VmHWM");
    let flood_said = String::from_utf8_lossy(&flood_out.stdout).into_owned();
    assert!(flood_out.status.success(), "the flood: {flood_said}");
    let drops = xtask::testenv::counter(&sb.pin_dir, "drop_no_backend") - drops_before;

    signal(sb.pid("stalled").expect("stalled reader"), libc::SIGCONT);
    // Both readers drain, then have their last `lost` record (every 250 ms).
    std::thread::sleep(Duration::from_secs(2));
    let (stalled_kernel, stalled_reader) = trace_lost(&sb, "stalled");
    let (echo_kernel, _) = trace_lost(&sb, "echo");
    let events = trace_events(&sb, "stalled");
    let flood_events = events
        .iter()
        .filter(|e| e["frontend"] == flood_to.as_str() && e["reason"] == "drop_no_backend")
        .count() as u64;
    let attempts: usize = checks.iter().map(|r| r.attempts.len()).sum();
    let failed: Vec<&str> = checks
        .iter()
        .filter(|r| !r.all_ok())
        .map(|r| r.raw.as_str())
        .collect();
    eprintln!(
        "flood: {flood_said:?} in {flood_took:.2?}, {drops} drops counted; agent RSS {rss_before} KiB \
         before, {rss_after} KiB after, peak {peak} KiB; stalled reader: {} events ({flood_events} \
         of the flood), lost {stalled_kernel} in the kernel, {stalled_reader} in its queue; \
         echo reader told {echo_kernel} kernel losses; {attempts} connections through demo/echo, \
         {} failed",
        events.len(),
        failed.len()
    );

    assert!(
        drops >= FLOOD_PACKETS * 99 / 100,
        "the flood reached the program: {drops} drops of {FLOOD_PACKETS}"
    );
    assert!(
        peak.max(rss_after) < rss_before + RSS_GROWTH_KIB,
        "the agent's memory grew under the flood: {rss_before} KiB before, {rss_after} KiB after, \
         peak {peak} KiB"
    );
    assert!(
        attempts >= 5 && failed.is_empty(),
        "forwarding of demo/echo during the flood ({attempts} connections):\n{}",
        failed.join("\n")
    );
    // Each drop is one event: delivered, or counted as lost.
    let accounted = flood_events + stalled_kernel + stalled_reader;
    assert!(
        accounted >= drops,
        "{drops} drops, {flood_events} delivered, {stalled_kernel} + {stalled_reader} lost"
    );
    // The losses also hold the other events (demo/echo's new flows).
    assert!(
        accounted <= drops + attempts as u64 + 64,
        "more events accounted ({accounted}) than {drops} drops and {attempts} new flows"
    );
    assert!(
        stalled_reader > 0,
        "a stopped reader's queue overflows under the flood"
    );
    assert_eq!(
        echo_kernel, stalled_kernel,
        "every reader is told the kernel's losses"
    );
}

// --- drops and reverse-translation misses at the uplink --------------------

/// Sends one TCP connection from `client` to `entry`, which must be
/// dropped, and returns the drop event reader `trace-a` shows for it, after
/// asserting its fields: `reason`, dropped, from the client's address, to
/// `entry`, of `service`, TCP over IPv4, decided by `layer`, stamped within
/// [`WITHIN`] of the packet.
fn assert_drop_traced(
    sb: &TwoNodeSandbox,
    (client, entry): (Client, &EntryPoint),
    (reason, layer, service): (&str, &str, &str),
) -> Value {
    let sent = std::time::SystemTime::now();
    let run = sb
        .hit(&sb_echo(), client, entry, 1, 300)
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(run.failures(), 1, "{entry}: {reason}\n{}", run.raw);
    let e = wait_trace_event(sb, "trace-a", reason, |e| {
        e["frontend"] == entry.addr().as_str()
    });
    assert_eq!(e["reason"], reason, "{e}");
    assert_eq!(e["verdict"], "dropped", "{e}");
    assert_eq!(e["layer"], layer, "{e}");
    assert_eq!(ip_of(&e["client"]).as_deref(), Some(client.ip()), "{e}");
    assert_eq!(e["service"], service, "{e}");
    assert_eq!(e["protocol"], "tcp", "{e}");
    assert_eq!(e["family"], 4, "{e}");
    assert_eq!(e["backend"], Value::Null, "{e}");
    assert_stamped_within(&e, sent);
    e
}

/// Drops at node A's uplink of traffic from outside, traced by a reader on
/// node A as the layer that decided them (`layer`), with `--type drop`:
/// - `externalTrafficPolicy: Local` with every endpoint on node B: client
///   1's connection to node A's NodePort is dropped, `drop_no_backend`
///   (kube-proxy drops it too: no local endpoint);
/// - `ext/web-lb` restricted to client 1 (`loadBalancerSourceRanges`):
///   client 2's connection to the LoadBalancer IP is dropped,
///   `source_denied`.
fn uplink_drops_are_traced(lan: Lan, agent_args: &[&str], layer: &str) {
    let pods = Node::B.pods();
    let mut sb = two_node_with_agents_on(lan, Policy::Local, &pods, agent_args);
    let lb = ExternalService::LoadBalancer;
    let only_one = format!("{}/32", Client::One.ip());
    sb.write_manifest(
        &lb.service_file(),
        &lb.yaml_with_source_ranges(Policy::Local, &[&only_one]),
    )
    .expect("write the restricted Service");
    sb.wait_services(
        Node::A,
        &switchboard(),
        Duration::from_secs(10),
        "the LB restricted to client 1",
        |f| {
            lb.entry_points(Node::A).iter().all(|e| {
                find_at(f, &e.address, e.port, e.proto.as_str()).is_some_and(|fe| {
                    fe.source_ranges.as_deref() == Some(std::slice::from_ref(&only_one))
                })
            })
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let (ns, pin) = (sb.node_ns(Node::A), sb.pin_dir(Node::A));
    let agent = TwoNodeSandbox::agent_label(Node::A);
    xtask::testenv::start_trace(&mut sb, (&ns, &pin, &agent), "trace-a", &["--type", "drop"]);

    let node_port = EntryPoint {
        address: Node::A.ip().to_string(),
        port: NODEPORT_TCP,
        proto: Proto::Tcp,
    };
    assert_drop_traced(
        &sb,
        (Client::One, &node_port),
        ("drop_no_backend", layer, "ext/web:http"),
    );
    let lb_tcp = lb.entry_points(Node::A)[0].clone();
    assert_drop_traced(
        &sb,
        (Client::Two, &lb_tcp),
        ("source_denied", layer, "ext/web-lb:http"),
    );
    let kinds: Vec<Value> = trace_events(&sb, "trace-a")
        .into_iter()
        .filter(|e| e["kind"] != "drop")
        .collect();
    assert!(kinds.is_empty(), "--type drop: {kinds:#?}");
}

#[test]
fn outside_drops_are_traced_with_their_reason_at_tc() {
    uplink_drops_are_traced(Lan::KindLike, &[], "tc");
}

#[test]
fn outside_drops_are_traced_with_their_reason_at_xdp() {
    uplink_drops_are_traced(Lan::XdpReady, &["--xdp-mode", "generic"], "xdp");
}

/// A reply arrives at node A for a flow its conntrack does not know: a
/// connection from client 1 through node A's NodePort to a pod on node B
/// (source-NATed to node A's address) is established and idle; the reply
/// half of node A's tracking is deleted from the pinned map (as `bpftool`
/// would, or an entry lost to a race); then the client sends. Its packets
/// still go out through the forward entry, and the pod's answer, to node
/// A's source-NAT port, finds no flow: a `revnat-miss` of the tc layer with
/// the pod as the packet's source and node A's address and port as its
/// destination, within a second.
#[test]
fn outside_reply_without_conntrack_is_traced_as_a_revnat_miss() {
    let pods = Node::B.pods();
    let mut sb = two_node_with_agents(Policy::Cluster, &pods, &[]);
    let (ns, pin) = (sb.node_ns(Node::A), sb.pin_dir(Node::A));
    let agent = TwoNodeSandbox::agent_label(Node::A);
    xtask::testenv::start_trace(
        &mut sb,
        (&ns, &pin, &agent),
        "trace-a",
        &["--type", "revnat-miss"],
    );
    let node_port = EntryPoint {
        address: Node::A.ip().to_string(),
        port: NODEPORT_TCP,
        proto: Proto::Tcp,
    };
    let client = sb.client_ns(Client::One);
    let bin = sb_echo().to_string_lossy().into_owned();
    let idle = open_idle_with(
        &|args| {
            let mut cmd = vec![bin.as_str()];
            cmd.extend_from_slice(args);
            sb.command(&client, &cmd)
        },
        &node_port.addr(),
    );
    let map = pin.join(proxy_common::names::CONNTRACK);
    let map = map.to_string_lossy();
    let dump = bpftool_json(&["map", "dump", "pinned", &map]);
    let byte = |v: &Value| u8::from_str_radix(v.as_str().unwrap().trim_start_matches("0x"), 16);
    // `CtKey`: saddr, daddr, sport, dport, proto, then the direction.
    let replies: Vec<Vec<String>> = dump
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["key"].as_array().expect("key bytes"))
        .filter(|k| k.get(13).map(byte) == Some(Ok(proxy_common::ct_dir::REPLY)))
        .map(|k| {
            k.iter()
                .map(|b| format!("{:02x}", byte(b).unwrap()))
                .collect()
        })
        .collect();
    assert_eq!(replies.len(), 1, "one tracked flow: {dump:#}");
    let mut delete = vec!["map", "delete", "pinned", &map, "key", "hex"];
    delete.extend(replies[0].iter().map(String::as_str));
    xtask::testenv::stdout_of(std::process::Command::new("bpftool").args(&delete));
    assert!(
        trace_events(&sb, "trace-a").is_empty(),
        "no miss before the reply"
    );

    let sent = std::time::SystemTime::now();
    let (pod, _) = wake(idle);
    let e = wait_trace_event(&sb, "trace-a", "revnat miss", |e| {
        e["kind"] == "revnat-miss"
    });
    let pod_ip = pods
        .iter()
        .find(|p| p.name() == pod)
        .map(|p| p.ip())
        .unwrap_or_else(|| panic!("no pod {pod}"));
    assert_eq!(ip_of(&e["client"]), Some(pod_ip), "the reply's source: {e}");
    assert_eq!(
        ip_of(&e["frontend"]).as_deref(),
        Some(Node::A.ip()),
        "node A's SNAT address: {e}"
    );
    assert_eq!(e["layer"], "tc", "{e}");
    assert_eq!(e["protocol"], "tcp", "{e}");
    assert_eq!(e["family"], 4, "{e}");
    assert_stamped_within(&e, sent);
}
