//! Netns end-to-end tests on a k3s/flannel-shaped cluster (root only), with
//! the agents' default flags: the two-node sandbox on `Lan::K3sLike`
//! (`xtask::sandbox::two_node::flannel`), where each node's pods hang off a
//! bridge holding their gateway (flannel's `cni0`, MTU 1450) and the other
//! node's pods are reached over a VXLAN overlay (`flannel.1`, node A
//! 10.244.1.0, node B 10.244.2.0; `flannel-v6.1` for IPv6) instead of
//! routes via the other node's LAN address.
//!
//! - ClusterIPs from pods (not in the agents' cgroups: tc on the bridge
//!   ports does the work), both families, TCP and UDP: to a backend on the
//!   same bridge, to one across the overlay, and to the pod itself
//!   (hairpin). The backend sees the calling pod's own address (the hairpin
//!   address when it calls itself), the caller the ClusterIP.
//! - From an external client (via node A unless said otherwise): NodePort,
//!   LoadBalancer IP and external IP under `externalTrafficPolicy: Cluster`
//!   with backends on node A (the pod sees the client) and on node B (the
//!   request crosses the overlay SNATed to node A's overlay address
//!   10.244.1.0, what kube-proxy's MASQUERADE picks for traffic leaving
//!   through `flannel.1`, and the reply comes back from the entry point);
//!   under `Local` with backends on node B (dropped through node A, the pod
//!   sees the client through node B), and the healthCheckNodePort (200 on
//!   node B, 503 on node A).
//! - Across the overlay through node A's NodePort to node B's pods:
//!   3000-byte UDP datagrams (fragmented at the client's MTU 1500, again at
//!   the overlay's 1450) and a 200 kB TCP line each way.
//! - Direct server return (`--nodeport-mode dsr` on both agents) through
//!   node A to node B's pods across the overlay: the pod sees the client,
//!   the client the entry point, and no reply passes node A.
//! - IPv6 (dual-stack Nodes and `ext/web6`, default flags): node A's IPv6
//!   NodePort with node B's pods, across the IPv6 overlay, SNATed to node
//!   A's IPv6 overlay address.
//!
//! The binaries come from SWITCHBOARD_BIN and SB_ECHO_BIN (`cargo xtask test`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use xtask::sandbox::two_node::manifests::{
    EntryPoint, ExternalService, Policy, Proto, DUAL_NODEPORT_TCP, DUAL_NODEPORT_UDP,
    HEALTH_CHECK_NODE_PORT, NODEPORT_TCP, NODEPORT_UDP,
};
use xtask::sandbox::two_node::{Client, Node, Pod};
use xtask::sandbox::{
    find_at, Attempt, ClientRun, Frontend, Lan, TwoNodeSandbox, POD_TCP_PORT, POD_UDP_PORT,
};
use xtask::testenv::{
    counters, fragmented_udp_args, pod_saw_ips, sb_echo, switchboard, two_node_sandbox_on,
    two_node_with_agents_on, wait_programmed,
};

use crate::e2e_external6::dual_stack_with_agents;

/// Attempts per address that must all succeed.
const COUNT: u32 = 10;
/// The tc hairpin source addresses (`proxy_common::uplink::hairpin`).
const HAIRPIN: &str = "169.254.42.1";
const HAIRPIN6: &str = "fd53:6221::1";

/// `switchboard stats` of both nodes and their agent logs' last lines, for
/// failure messages.
fn diagnostics(sb: &TwoNodeSandbox) -> String {
    let bin = switchboard().to_string_lossy().into_owned();
    let mut out = String::new();
    for node in Node::ALL {
        let pin = sb.pin_dir(node).to_string_lossy().into_owned();
        let stats = match sb.exec(&sb.node_ns(node), &[&bin, "stats", "--pin-root", &pin]) {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => format!("(switchboard stats failed: {e:#})"),
        };
        let log = sb.agent_log(node);
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        out.push_str(&format!(
            "--- stats of {0} ---\n{stats}--- last agent log lines of {0} ---\n{1}\n",
            node.name(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    out
}

/// Every attempt of `run` succeeded, answered by one of `pods`, the client
/// seeing `client_saw` as its peer and the pods `pod_saw`.
fn assert_run(
    sb: &TwoNodeSandbox,
    run: &ClientRun,
    what: &str,
    pods: &[Pod],
    client_saw: &str,
    pod_saw: &str,
) {
    let context = || format!("{}\n{}", run.raw, diagnostics(sb));
    assert!(
        run.all_ok(),
        "{what}: {} of {} attempts failed:\n{}",
        run.failures(),
        run.attempts.len(),
        context()
    );
    let answered: BTreeSet<String> = run.names().into_iter().collect();
    let allowed: BTreeSet<String> = pods.iter().map(|p| p.name()).collect();
    assert!(
        answered.is_subset(&allowed),
        "{what}: answered by {answered:?}, expected {allowed:?}:\n{}",
        context()
    );
    assert_eq!(
        run.client_saw(),
        vec![client_saw.to_string()],
        "{what}: the client saw another peer:\n{}",
        context()
    );
    assert_eq!(
        pod_saw_ips(run),
        BTreeSet::from([pod_saw.to_string()]),
        "{what}: the pod saw another peer address:\n{}",
        context()
    );
}

// --- ClusterIPs from pods ----------------------------------------------------

/// A dual-stack ClusterIP Service `k3s/to-<pod>` (10.96.1.<k>,
/// fd00:96::1:<k>; `http` TCP 80→8080, `dns` UDP 53→5353) whose only
/// endpoint is one pod.
struct ToPod {
    pod: Pod,
    k: u8,
}

impl ToPod {
    fn ip(&self, v6: bool) -> String {
        match v6 {
            false => format!("10.96.1.{}", self.k),
            true => format!("fd00:96::1:{}", self.k),
        }
    }

    fn name(&self) -> String {
        format!("to-{}", self.pod.name().to_lowercase())
    }

    /// The Service and one EndpointSlice per family.
    fn yaml(&self) -> String {
        let name = self.name();
        let mut s = format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: k3s}}\n\
             spec:\n  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n\
             \x20 clusterIP: {v4}\n  clusterIPs: [{v4}, \"{v6}\"]\n\
             \x20 ports:\n  - {{name: http, protocol: TCP, port: 80, targetPort: {POD_TCP_PORT}}}\n\
             \x20 - {{name: dns, protocol: UDP, port: 53, targetPort: {POD_UDP_PORT}}}\n",
            v4 = self.ip(false),
            v6 = self.ip(true)
        );
        for (family, addr) in [("IPv4", self.pod.ip()), ("IPv6", self.pod.ip6())] {
            s.push_str(&format!(
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n\
                 metadata: {{name: {name}-{fam}, namespace: k3s, labels: {{kubernetes.io/service-name: {name}}}}}\n\
                 addressType: {family}\n\
                 ports: [{{name: http, protocol: TCP, port: {POD_TCP_PORT}}}, {{name: dns, protocol: UDP, port: {POD_UDP_PORT}}}]\n\
                 endpoints:\n- addresses: [\"{addr}\"]\n  conditions: {{ready: true}}\n  nodeName: {node}\n",
                fam = family.to_lowercase(),
                node = self.pod.node.name()
            ));
        }
        s
    }

    /// Both families' frontends of both ports carry the pod.
    fn programmed(&self, frontends: &[Frontend]) -> bool {
        [(false, self.pod.ip()), (true, self.pod.ip6())]
            .iter()
            .all(|(v6, backend)| {
                [(80, "TCP"), (53, "UDP")].iter().all(|&(port, proto)| {
                    find_at(frontends, &self.ip(*v6), port, proto)
                        .is_some_and(|fe| fe.backends.iter().any(|b| &b.address == backend))
                })
            })
    }
}

/// One Service per pod (`to-poda1` ... `to-podb2`).
fn to_pods() -> Vec<ToPod> {
    Pod::all()
        .into_iter()
        .zip(1u8..)
        .map(|(pod, k)| ToPod { pod, k })
        .collect()
}

/// The sandbox routes the other node's pods over its VXLAN device, not via
/// the other node's LAN address.
fn assert_overlay_routes(sb: &TwoNodeSandbox) {
    for node in Node::ALL {
        let other = node.other().pods()[0];
        for (family, dst, dev) in [
            ("-4", other.ip(), sb.vxlan(node)),
            ("-6", other.ip6(), sb.vxlan6(node)),
        ] {
            let out = sb
                .exec(&sb.node_ns(node), &["ip", family, "route", "get", &dst])
                .unwrap_or_else(|e| panic!("{e:#}"));
            let route = String::from_utf8_lossy(&out.stdout);
            assert!(
                route.contains(&format!("dev {dev}")) && !route.contains("192.168.50."),
                "{}: {dst} not routed over the overlay: {route}",
                node.name()
            );
        }
    }
}

/// From podA1 and podB1, both families, TCP and UDP, to a ClusterIP whose
/// only backend is on the same bridge, one across the overlay, and the
/// caller itself: every attempt answered by that backend, which sees the
/// caller's own address (the hairpin address for itself); the caller sees
/// the ClusterIP.
#[test]
fn cluster_ips_from_pods_over_the_bridge_the_overlay_and_hairpin() {
    let mut sb = two_node_sandbox_on(Lan::K3sLike);
    assert_overlay_routes(&sb);
    sb.write_nodes().expect("write the Node manifests");
    let services = to_pods();
    for svc in &services {
        sb.write_manifest(&format!("{}.yaml", svc.name()), &svc.yaml())
            .expect("write the Services");
    }
    let sw = switchboard();
    for node in Node::ALL {
        sb.start_agent(node, &sw, &[])
            .unwrap_or_else(|e| panic!("start the agent of {}: {e:#}", node.name()));
    }
    for node in Node::ALL {
        let programmed = |f: &[Frontend]| services.iter().all(|s| s.programmed(f));
        let waited = sb.wait_services(node, &sw, Duration::from_secs(30), "to-pod*", programmed);
        waited.unwrap_or_else(|e| panic!("{e:#}"));
        sb.wait_uplink_attached(node, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    for caller in [Pod::new(Node::A, 1), Pod::new(Node::B, 1)] {
        let same_bridge = Pod::new(caller.node, 2);
        let across = Pod::new(caller.node.other(), 2);
        for target in [same_bridge, across, caller] {
            let svc = services
                .iter()
                .find(|s| s.pod == target)
                .expect("a Service");
            for v6 in [false, true] {
                let pod_saw = match (target == caller, v6) {
                    (true, false) => HAIRPIN.to_string(),
                    (true, true) => HAIRPIN6.to_string(),
                    (false, false) => caller.ip(),
                    (false, true) => caller.ip6(),
                };
                for (flag, port) in [("--tcp", 80), ("--udp", 53)] {
                    let addr = match v6 {
                        false => format!("{}:{port}", svc.ip(false)),
                        true => format!("[{}]:{port}", svc.ip(true)),
                    };
                    let what = format!("{} → {addr} ({})", caller.name(), target.name());
                    let args = [flag, &addr, "--count", "5", "--timeout-ms", "1000"];
                    let run = sb
                        .client_in(&sb_echo(), &sb.pod_ns(caller), &args)
                        .unwrap_or_else(|e| panic!("{e:#}"));
                    assert_run(&sb, &run, &what, &[target], &addr, &pod_saw);
                }
            }
        }
    }
}

// --- from outside the nodes ------------------------------------------------

/// Every entry point of every external Service through `via`.
fn entry_points(via: Node) -> Vec<EntryPoint> {
    ExternalService::ALL
        .iter()
        .flat_map(|s| s.entry_points(via))
        .collect()
}

fn hit(sb: &TwoNodeSandbox, entry: &EntryPoint, count: u32, timeout_ms: u64) -> ClientRun {
    sb.hit(&sb_echo(), Client::One, entry, count, timeout_ms)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// A timeout (the request was dropped), not a refusal or a reset.
fn is_timeout(message: &str) -> bool {
    message.contains("timed out") || message.contains("os error 11")
}

/// Polls `GET http://<node>:32000/` from client 1 until it answers
/// `status` (10 s at most).
fn wait_health(sb: &TwoNodeSandbox, node: Node, status: u16) {
    let addr: SocketAddr = format!("{}:{HEALTH_CHECK_NODE_PORT}", node.ip())
        .parse()
        .expect("valid address");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let last = sb.http_get(Client::One, addr, "/", Duration::from_millis(500));
        match &last {
            Ok(r) if r.status == status => return,
            _ if Instant::now() > deadline => panic!(
                "healthCheckNodePort of {} ({addr}): expected HTTP {status}, last answer: {last:?}\n{}",
                node.name(),
                diagnostics(sb)
            ),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// One sandbox, three states of the Services, through the NodePort, the
/// LoadBalancer IP and the external IP:
/// - `Cluster`, backends on node A, through node A: DNAT only, the pod sees
///   client 1;
/// - `Local`, backends on node B: through node A (no local endpoint) every
///   request is dropped; node B's healthCheckNodePort answers 200, node
///   A's 503; through node B the pods see client 1.
#[test]
fn external_clients_reach_local_backends_and_local_policy_keeps_the_client() {
    let a_pods = Node::A.pods();
    let mut sb = two_node_with_agents_on(Lan::K3sLike, Policy::Cluster, &a_pods, &[]);
    for entry in entry_points(Node::A) {
        let run = hit(&sb, &entry, COUNT, 1000);
        let what = format!("{entry}, Cluster policy, backends on node A (entry node)");
        assert_run(&sb, &run, &what, &a_pods, &entry.addr(), Client::One.ip());
    }

    let b_pods = Node::B.pods();
    sb.write_services(Policy::Local, &b_pods)
        .expect("write the Services");
    for node in Node::ALL {
        wait_programmed(&mut sb, node, &b_pods);
    }
    wait_health(&sb, Node::B, 200);
    wait_health(&sb, Node::A, 503);
    for entry in entry_points(Node::A) {
        let run = hit(&sb, &entry, 3, 500);
        let unexpected: Vec<&Attempt> = run
            .attempts
            .iter()
            .filter(|a| !matches!(a, Attempt::Err { message, .. } if is_timeout(message)))
            .collect();
        assert!(
            !run.attempts.is_empty() && unexpected.is_empty(),
            "{entry}: Local policy through node A (no local endpoint) must drop:\n{}",
            run.raw
        );
    }
    sb.route_services_via(Client::One, Node::B)
        .expect("route the Service addresses via node B");
    for entry in entry_points(Node::B) {
        let run = hit(&sb, &entry, COUNT, 1000);
        let what = format!("{entry}, Local policy through node B");
        assert_run(&sb, &run, &what, &b_pods, &entry.addr(), Client::One.ip());
    }
}

/// `Cluster` policy, backends only on node B, through node A: the request
/// crosses the overlay SNATed to node A's overlay address (10.244.1.0), and
/// the answer comes back from the entry point: 20 small requests per entry
/// point, then through the NodePort a 200 kB TCP line each way and
/// 3000-byte datagrams (fragmented both ways; the client's first fragment,
/// 1500 bytes, is larger than the overlay's MTU, so node A forwards it
/// fragmented again).
#[test]
fn external_clients_reach_remote_backends_over_the_overlay() {
    let pods = Node::B.pods();
    let sb = two_node_with_agents_on(Lan::K3sLike, Policy::Cluster, &pods, &[]);
    let overlay_a = Node::A.overlay_ip();
    for entry in entry_points(Node::A) {
        let run = hit(&sb, &entry, COUNT, 1000);
        let what = format!("{entry}, Cluster policy, backends on node B, over the overlay");
        assert_run(&sb, &run, &what, &pods, &entry.addr(), &overlay_a);
    }

    let tcp = format!("{}:{NODEPORT_TCP}", Node::A.ip());
    let args = [
        "--tcp",
        &tcp,
        "--tcp-size",
        "200000",
        "--tcp-reply-size",
        "200000",
        "--count",
        "3",
        "--timeout-ms",
        "15000",
    ];
    let run = sb
        .client(&sb_echo(), Client::One, &args)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let what = format!("200 kB each way through {tcp}, backends on node B");
    assert_run(&sb, &run, &what, &pods, &tcp, &overlay_a);

    let udp = format!("{}:{NODEPORT_UDP}", Node::A.ip());
    let run = sb
        .client(&sb_echo(), Client::One, &fragmented_udp_args(&udp))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let what = format!("3000-byte datagrams to {udp}, backends on node B");
    assert_run(&sb, &run, &what, &pods, &udp, &overlay_a);
}

/// Direct server return on the k3s shape: both agents with
/// `--nodeport-mode dsr`, `Cluster` policy, backends only on node B,
/// through node A's NodePort, LoadBalancer IP and external IP, TCP and UDP:
/// the request crosses the overlay unSNATed (the pod sees client 1), node
/// B answers from the entry point itself (the client sees the address it
/// sent to), and node A's uplink translates no reply.
#[test]
fn dsr_through_node_a_to_remote_backends_over_the_overlay() {
    let pods = Node::B.pods();
    let sb = two_node_with_agents_on(
        Lan::K3sLike,
        Policy::Cluster,
        &pods,
        &["--nodeport-mode", "dsr"],
    );
    assert_overlay_routes(&sb);
    let entries = entry_points(Node::A);
    for entry in &entries {
        let run = hit(&sb, entry, COUNT, 1000);
        let what = format!("{entry}, DSR, backends on node B, over the overlay");
        assert_run(&sb, &run, &what, &pods, &entry.addr(), Client::One.ip());
    }
    let a = counters(&sb.pin_dir(Node::A));
    assert!(
        a["ext_remote"] >= u64::from(COUNT) * entries.len() as u64,
        "DSR: node A forwarded fewer requests than sent: {a:?}\n{}",
        diagnostics(&sb)
    );
    assert_eq!(
        a["ext_reply"],
        0,
        "DSR: a reply passed node A: {a:?}\n{}",
        diagnostics(&sb)
    );
}

/// IPv6 across the overlay, default flags: dual-stack Nodes and `ext/web6`
/// (`Cluster` policy) with node B's pods; client 1 to node A's IPv6
/// NodePorts, TCP and UDP: every attempt answered by node B's pods, which
/// see node A's IPv6 overlay address (the request left through the IPv6
/// VXLAN device), the client seeing the NodePort.
#[test]
fn nodeport6_reaches_remote_backends_over_the_overlay() {
    let pods = Node::B.pods();
    let sb = dual_stack_with_agents(Lan::K3sLike, Policy::Cluster, &pods, &[]);
    assert_overlay_routes(&sb);
    let overlay_a6 = Node::A.overlay_ip6();
    for (port, proto) in [
        (DUAL_NODEPORT_TCP, Proto::Tcp),
        (DUAL_NODEPORT_UDP, Proto::Udp),
    ] {
        let entry = EntryPoint {
            address: Node::A.ip6().to_string(),
            port,
            proto,
        };
        let run = hit(&sb, &entry, COUNT, 1000);
        let what = format!("{entry}, IPv6, Cluster policy, backends on node B, over the overlay");
        assert_run(&sb, &run, &what, &pods, &entry.addr(), &overlay_a6);
    }
}
