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
    EntryPoint, Policy, Proto, DUAL_NODEPORT_TCP, NODEPORT_TCP,
};
use xtask::sandbox::two_node::{Client, Node, Pod};
use xtask::sandbox::{
    pod_ip, Lan, Sandbox, TwoNodeSandbox, AGENT, CLIENT_IP, CLUSTER_IP, POD_TCP_PORT,
};
use xtask::testenv::{
    demo_sandbox_with, sb_echo, switchboard, trace_events, two_node_with_agents_on,
    wait_trace_event, write_manifest, TRACE_WITHIN as WITHIN,
};

const EMPTY_IP: &str = "10.96.0.20";

const EMPTY: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: empty\n  namespace: demo\n\
spec:\n  clusterIP: 10.96.0.20\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n\
---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
metadata:\n  name: empty-abc12\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: empty\n\
ports:\n- name: http\n  port: 8080\n  protocol: TCP\nendpoints: []\n";

/// The demo sandbox with `demo/empty` programmed too.
fn sandbox() -> Sandbox {
    let mut sb = demo_sandbox_with(&[]);
    write_manifest(&sb, "empty.yaml", EMPTY);
    sb.wait_services(
        &switchboard(),
        Duration::from_secs(10),
        "demo/empty without endpoints",
        |f| xtask::sandbox::find(f, "demo/empty:http").is_some_and(|fe| fe.backends.is_empty()),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    sb
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
/// `SB_TRACE_ON_V1`, found among its open map descriptors.
fn kernel_switch(agent_pid: u32) -> u64 {
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
        if show["name"] != "SB_TRACE_ON_V1" {
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
    panic!("the agent holds no SB_TRACE_ON_V1");
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
    let ip_of = |v: &Value| {
        v.as_str()
            .and_then(|c| c.rsplit_once(':'))
            .map(|(ip, _)| ip.trim_matches(['[', ']']).to_owned())
    };
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
