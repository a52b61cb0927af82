//! Netns end-to-end tests of traffic from outside the nodes (root only):
//! NodePort, LoadBalancer IP and external IP, with `externalTrafficPolicy`
//! Cluster and Local, the healthCheckNodePort, and the XDP modes.
//!
//! Each test builds a two-node sandbox (`xtask::sandbox::two_node`): nodes A
//! (192.168.50.1) and B (192.168.50.2) on a bridged LAN (kind-like: veth
//! uplinks, senders with checksum offload, and the agents' default flags,
//! unless a test is about an XDP mode and asks for `Lan::XdpReady`), pods podA1/podA2
//! (10.244.1.2/.3) and podB1/podB2 (10.244.2.2/.3), and external clients
//! 192.168.50.100 and .101 that send the Service addresses via node A unless
//! a test routes them elsewhere. Every node runs its own agent over one shared
//! manifest directory.
//!
//! Peer addresses asserted (what kube-proxy does):
//! - `Cluster` policy, backend on another node: the request is SNATed to the
//!   entry node's address, so the pod sees 192.168.50.1;
//! - `Cluster` policy, backend on the entry node: DNAT only, the pod sees the
//!   client's own address;
//! - `Local` policy: the pod sees the client's own address; through a node
//!   without local endpoints the request is dropped (the client times out).
//!
//! The binaries come from SWITCHBOARD_BIN and SB_ECHO_BIN (`cargo xtask test`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use xtask::sandbox::two_node::manifests::{
    EntryPoint, ExternalService, Policy, Proto, HEALTH_CHECK_NODE_PORT, NODEPORT_TCP, NODEPORT_UDP,
};
use xtask::sandbox::two_node::{Client, Node, Pod, CLIENT_IPS, EXTERNAL_IP, LB_IP};
use xtask::sandbox::{
    find_at, gro_enabled, is_mountpoint, list_netns, tx_checksum_enabled, Attempt, ClientRun, Lan,
    TwoNodeSandbox, PIN_BASE, POD_TCP_PORT, POD_UDP_PORT,
};
use xtask::testenv::{
    assert_answers, fragmented_udp_args, pod_saw_ips, sb_echo, switchboard, two_node_sandbox,
    two_node_with_agents, two_node_with_agents_on,
};

/// Attempts per entry point that must all succeed.
const COUNT: u32 = 20;

fn hit(
    sb: &TwoNodeSandbox,
    from: Client,
    entry: &EntryPoint,
    count: u32,
    timeout_ms: u64,
) -> ClientRun {
    sb.hit(&sb_echo(), from, entry, count, timeout_ms)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

fn names(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter().map(|p| p.name()).collect()
}

/// A timeout (the request was dropped), not a refusal or a reset.
fn is_timeout(message: &str) -> bool {
    message.contains("timed out") || message.contains("os error 11")
}

/// Every attempt of `run` timed out.
fn assert_dropped(run: &ClientRun, entry: &EntryPoint, why: &str) {
    let unexpected: Vec<&Attempt> = run
        .attempts
        .iter()
        .filter(|a| !matches!(a, Attempt::Err { message, .. } if is_timeout(message)))
        .collect();
    assert!(
        !run.attempts.is_empty() && unexpected.is_empty(),
        "{entry}: expected every attempt to time out ({why}), got:\n{}",
        run.raw
    );
}

/// Every entry point of every external Service through `via`.
fn entry_points(via: Node) -> Vec<EntryPoint> {
    ExternalService::ALL
        .iter()
        .flat_map(|s| s.entry_points(via))
        .collect()
}

// --- the sandbox itself ---------------------------------------------------

/// Without any agent: both external clients reach all four pods at their
/// own addresses over TCP and UDP (through node A, and through node B after
/// re-routing), pods reach each other across and within nodes, every peer
/// sees the other's own address, GRO is on where XDP needs NAPI, and cleanup
/// leaves nothing behind.
#[test]
fn two_node_topology_routes_pods_and_nodes() {
    let echo = sb_echo();
    let mut sb = two_node_sandbox();
    let tag = sb.tag.clone();
    sb.route_pods_via(Client::Two, Node::B)
        .expect("route client 2's pod traffic via node B");
    for client in Client::ALL {
        for pod in Pod::all() {
            for (flag, port) in [("--tcp", POD_TCP_PORT), ("--udp", POD_UDP_PORT)] {
                let addr = format!("{}:{port}", pod.ip());
                let run = sb
                    .client(&echo, client, &[flag, &addr, "--count", "3"])
                    .expect("run the client");
                assert!(run.all_ok(), "{client:?} {flag} {addr}:\n{}", run.raw);
                assert_eq!(run.names(), vec![pod.name(); 3], "{}", run.raw);
                assert_eq!(run.client_saw(), vec![addr.clone()], "{}", run.raw);
                assert_eq!(
                    pod_saw_ips(&run),
                    BTreeSet::from([client.ip().to_string()]),
                    "{client:?} {flag} {addr}: the pod saw another address:\n{}",
                    run.raw
                );
            }
        }
    }

    let a1 = Pod::new(Node::A, 1);
    for target in [Pod::new(Node::B, 1), Pod::new(Node::A, 2)] {
        for (flag, port) in [("--tcp", POD_TCP_PORT), ("--udp", POD_UDP_PORT)] {
            let addr = format!("{}:{port}", target.ip());
            let run = sb
                .client_in(&echo, &sb.pod_ns(a1), &[flag, &addr, "--count", "3"])
                .expect("run the client in podA1");
            assert!(run.all_ok(), "podA1 → {flag} {addr}:\n{}", run.raw);
            assert_eq!(run.names(), vec![target.name(); 3], "{}", run.raw);
            assert_eq!(
                pod_saw_ips(&run),
                BTreeSet::from([a1.ip()]),
                "podA1 → {addr}: {} saw another address:\n{}",
                target.name(),
                run.raw
            );
        }
    }

    // Kind-like: no GRO forced on the uplinks' peers, nothing attached to
    // them, and the senders (clients, pods) keep checksum offload on.
    for node in Node::ALL {
        let peer = sb.uplink_peer(node);
        assert!(
            !gro_enabled(&sb.lan_ns(), &peer).expect("read GRO"),
            "GRO is on on {peer}"
        );
        let out = sb
            .exec(&sb.lan_ns(), &["ip", "-d", "link", "show", &peer])
            .expect("ip link");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains("prog/xdp"),
            "{peer} carries an XDP program: {text}"
        );
    }
    for client in Client::ALL {
        assert!(
            tx_checksum_enabled(&sb.client_ns(client), "eth0").expect("read tx csum"),
            "{client:?} sends without checksum offload"
        );
    }
    for pod in Pod::all() {
        assert!(
            tx_checksum_enabled(&sb.pod_ns(pod), "eth0").expect("read tx csum"),
            "{} sends without checksum offload",
            pod.name()
        );
    }

    // Service routes follow route_services_via.
    sb.route_services_via(Client::One, Node::B)
        .expect("route services via node B");
    for service_ip in [LB_IP, EXTERNAL_IP] {
        let out = sb
            .exec(
                &sb.client_ns(Client::One),
                &["ip", "route", "get", service_ip],
            )
            .expect("ip route get");
        let route = String::from_utf8_lossy(&out.stdout);
        assert!(
            route.contains(&format!("via {}", Node::B.ip())),
            "{service_ip} not routed via node B: {route}"
        );
    }
    // Without an agent nothing answers the Service addresses.
    let lb = &ExternalService::LoadBalancer.entry_points(Node::B)[0];
    let run = hit(&sb, Client::One, lb, 1, 300);
    assert_eq!(
        run.failures(),
        1,
        "{lb} answered without an agent:\n{}",
        run.raw
    );

    let pins: Vec<_> = Node::ALL.iter().map(|&n| sb.pin_dir(n)).collect();
    let cgroups: Vec<_> = Node::ALL
        .iter()
        .map(|&n| sb.cgroup(n).expect("node cgroup").real.clone())
        .collect();
    for pin in &pins {
        assert!(is_mountpoint(pin), "{} is not a bpffs mount", pin.display());
    }
    sb.cleanup().expect("cleanup");
    let left: Vec<String> = list_netns()
        .expect("ip netns list")
        .into_iter()
        .filter(|ns| ns.starts_with(&format!("{tag}-")))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    for pin in &pins {
        assert!(!is_mountpoint(pin), "{} still mounted", pin.display());
    }
    for cgroup in &cgroups {
        assert!(!cgroup.exists(), "cgroup {} left", cgroup.display());
    }
    assert!(!std::path::Path::new(PIN_BASE).join(&tag).exists());
}

// --- what the agent does with traffic from outside ---------------

/// Cluster policy, endpoints only on node A: through node A every request
/// reaches a pod of node A, which sees the client's own address (DNAT only).
#[test]
fn external_cluster_policy_local_backends_see_the_client() {
    let pods = Node::A.pods();
    let sb = two_node_with_agents(Policy::Cluster, &pods, &[]);
    for entry in entry_points(Node::A) {
        let run = hit(&sb, Client::One, &entry, COUNT, 1000);
        assert_answers(
            &run,
            &entry,
            &pods,
            Client::One.ip(),
            "Cluster policy, local backend through node A: DNAT only",
        );
    }
}

/// Cluster policy, endpoints only on node B: through node A every request is
/// forwarded to a pod of node B, which sees node A's address (SNAT).
#[test]
fn external_cluster_policy_remote_backends_see_the_entry_node() {
    let pods = Node::B.pods();
    let sb = two_node_with_agents(Policy::Cluster, &pods, &[]);
    for entry in entry_points(Node::A) {
        let run = hit(&sb, Client::One, &entry, COUNT, 1000);
        assert_answers(
            &run,
            &entry,
            &pods,
            Node::A.ip(),
            "Cluster policy, remote backend through node A: SNAT to node A",
        );
    }
}

/// Local policy, endpoints only on node A: through node A the pods see the
/// client's own address.
#[test]
fn external_local_policy_keeps_the_client_address() {
    let pods = Node::A.pods();
    let sb = two_node_with_agents(Policy::Local, &pods, &[]);
    for entry in entry_points(Node::A) {
        let run = hit(&sb, Client::One, &entry, COUNT, 1000);
        assert_answers(
            &run,
            &entry,
            &pods,
            Client::One.ip(),
            "Local policy keeps the client's address",
        );
    }
}

/// Local policy, endpoints only on node B: through node A (no local
/// endpoints) every request is dropped; through node B it reaches node B's
/// pods with the client's own address.
#[test]
fn external_local_policy_drops_without_local_endpoints() {
    let pods = Node::B.pods();
    let sb = two_node_with_agents(Policy::Local, &pods, &[]);
    for entry in entry_points(Node::A) {
        let run = hit(&sb, Client::One, &entry, 3, 500);
        assert_dropped(
            &run,
            &entry,
            "Local policy through node A, which has no local endpoint",
        );
    }
    sb.route_services_via(Client::One, Node::B)
        .expect("route services via node B");
    for entry in entry_points(Node::B) {
        let run = hit(&sb, Client::One, &entry, COUNT, 1000);
        assert_answers(
            &run,
            &entry,
            &pods,
            Client::One.ip(),
            "Local policy through node B, which has the endpoints",
        );
    }
}

/// Polls `GET http://<node>:32000/` from client 1 until it answers `status`
/// (5 s at most); returns the body.
fn wait_health(sb: &TwoNodeSandbox, node: Node, status: u16) -> String {
    let addr: SocketAddr = format!("{}:{HEALTH_CHECK_NODE_PORT}", node.ip())
        .parse()
        .expect("valid address");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let last = sb.http_get(Client::One, addr, "/", Duration::from_millis(500));
        match &last {
            Ok(r) if r.status == status => return r.body.clone(),
            _ if Instant::now() > deadline => panic!(
                "healthCheckNodePort of {} ({addr}): expected HTTP {status}, last answer: {last:?}\n\
                 --- agent log ---\n{}",
                node.name(),
                sb.agent_log(node)
            ),
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// `localEndpoints` of a health check answer (kube-proxy's JSON body).
fn local_endpoints(body: &str) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    v.get("localEndpoints")?.as_u64()
}

/// healthCheckNodePort (32000) of the Local LoadBalancer Service: 200 with
/// `"localEndpoints": 2` on node A, which has both endpoints; 503 on node B,
/// which has none.
#[test]
fn health_check_node_port_reports_local_endpoints() {
    let pods = Node::A.pods();
    let sb = two_node_with_agents(Policy::Local, &pods, &[]);
    let body = wait_health(&sb, Node::A, 200);
    assert_eq!(
        local_endpoints(&body),
        Some(pods.len() as u64),
        "node A's health check body lacks \"localEndpoints\": {}: {body}",
        pods.len()
    );
    let body = wait_health(&sb, Node::B, 503);
    assert_eq!(
        local_endpoints(&body),
        Some(0),
        "node B's health check body lacks \"localEndpoints\": 0: {body}"
    );
}

/// Writes every `ExternalService`'s EndpointSlice with `ready` and
/// `terminating` pods, then waits until node A's maps send traffic from the
/// nodes to `ready` and traffic from outside to node A's own pods among
/// `local` (the Local policy's set: ready ones, else terminating ones).
fn write_slices_and_wait(
    sb: &mut TwoNodeSandbox,
    ready: &[Pod],
    terminating: &[Pod],
    local: &[Pod],
) {
    for service in ExternalService::ALL {
        sb.write_manifest(
            &service.slice_file(),
            &service.endpointslice_yaml_terminating(ready, terminating),
        )
        .expect("write the EndpointSlice");
    }
    let set = |pods: &[Pod], proto: Proto| -> Vec<String> {
        let mut v: Vec<String> = pods
            .iter()
            .map(|p| format!("{}:{}", p.ip(), proto.pod_port()))
            .collect();
        v.sort();
        v
    };
    let what = format!(
        "backends {:?}, from outside {:?}",
        names(ready),
        names(local)
    );
    sb.wait_services(
        Node::A,
        &switchboard(),
        Duration::from_secs(10),
        &what,
        |f| {
            entry_points(Node::A).iter().all(|e| {
                find_at(f, &e.address, e.port, e.proto.as_str()).is_some_and(|fe| {
                    fe.backend_addrs() == set(ready, e.proto)
                        && fe.external_backend_addrs() == Some(set(local, e.proto))
                })
            })
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// A local pod's whole termination, as kube-proxy answers it (upstream's
/// "should fail health check node port if there are only terminating
/// endpoints"), with podA1 on node A and podB1 on node B behind every
/// Service under `Local`. Ready: node A's healthCheckNodePort answers 200,
/// `"localEndpoints": 1`. Terminating (not ready, still serving): 503,
/// `"localEndpoints": 0`, since only ready endpoints count, while traffic
/// from outside through node A still reaches podA1 (the Local policy's
/// fallback to serving-and-terminating local endpoints), not podB1. Gone:
/// 503, and that traffic is dropped.
#[test]
fn health_check_node_port_fails_while_the_local_endpoint_terminates() {
    let a1 = Pod::new(Node::A, 1);
    let b1 = Pod::new(Node::B, 1);
    let mut sb = two_node_with_agents(Policy::Local, &[a1, b1], &[]);
    let body = wait_health(&sb, Node::A, 200);
    assert_eq!(local_endpoints(&body), Some(1), "podA1 ready: {body}");

    write_slices_and_wait(&mut sb, &[b1], &[a1], &[a1]);
    let body = wait_health(&sb, Node::A, 503);
    assert_eq!(local_endpoints(&body), Some(0), "podA1 terminating: {body}");
    for entry in entry_points(Node::A) {
        let run = hit(&sb, Client::One, &entry, COUNT, 1000);
        assert_answers(
            &run,
            &entry,
            &[a1],
            Client::One.ip(),
            "Local policy falls back to the terminating local pod",
        );
    }

    write_slices_and_wait(&mut sb, &[b1], &[], &[]);
    let body = wait_health(&sb, Node::A, 503);
    assert_eq!(local_endpoints(&body), Some(0), "podA1 gone: {body}");
    for entry in entry_points(Node::A) {
        let run = hit(&sb, Client::One, &entry, 3, 500);
        assert_dropped(
            &run,
            &entry,
            "Local policy through node A, whose pod is gone",
        );
    }
}

/// NodePort (TCP and UDP) through node A to backends on node B, with the
/// agents in `xdp_mode` on `lan`: every request answered by node B's pods,
/// which see node A's address.
fn nodeport_remote_with_xdp_mode(lan: Lan, xdp_mode: &str) {
    let pods = Node::B.pods();
    let sb = two_node_with_agents_on(lan, Policy::Cluster, &pods, &["--xdp-mode", xdp_mode]);
    for (port, proto) in [(NODEPORT_TCP, Proto::Tcp), (NODEPORT_UDP, Proto::Udp)] {
        let entry = EntryPoint {
            address: Node::A.ip().to_string(),
            port,
            proto,
        };
        let run = hit(&sb, Client::One, &entry, COUNT, 1000);
        assert_answers(
            &run,
            &entry,
            &pods,
            Node::A.ip(),
            &format!("--xdp-mode {xdp_mode}, remote backends through node A"),
        );
    }
}

/// Generic XDP, on a LAN whose senders write complete checksums (the XDP
/// program cannot update a partial one).
#[test]
fn nodeport_with_xdp_generic() {
    nodeport_remote_with_xdp_mode(Lan::XdpReady, "generic");
}

/// Native XDP on veth uplinks needs their peers to wake for XDP_TX frames
/// and complete checksums: the XDP-ready LAN.
#[test]
fn nodeport_with_xdp_native() {
    nodeport_remote_with_xdp_mode(Lan::XdpReady, "native");
}

#[test]
fn nodeport_with_xdp_off() {
    nodeport_remote_with_xdp_mode(Lan::KindLike, "off");
}

/// The agents' default flags on the kind-like LAN (veth uplinks, senders
/// with checksum offload, nothing set up for XDP on the peers): `auto`
/// leaves XDP off on the veth uplink, says why in the log and in
/// `switchboard status`, and NodePorts (TCP and UDP) through node A are
/// answered by local backends (the pod sees the client) and remote ones
/// (the pod sees node A).
#[test]
fn default_agent_on_kind_like_veth_uplinks_uses_tc_and_serves_nodeports() {
    let pods = Pod::all();
    let sb = two_node_with_agents(Policy::Cluster, &pods, &[]);
    assert_eq!(xdp_hook(&sb), "none", "auto on a veth: no XDP program");
    let log = sb.agent_log(Node::A);
    let chosen = log
        .lines()
        .find(|l| {
            l.contains("uplink XDP mode") && l.contains(&format!("iface={}", sb.uplink(Node::A)))
        })
        .unwrap_or_else(|| panic!("no `uplink XDP mode` line:\n{log}"));
    assert!(
        chosen.contains("xdp=off")
            && chosen.contains("kind=veth")
            && chosen.contains("auto: veth uplink"),
        "{chosen}"
    );
    assert!(
        !log.lines().any(|l| l.contains("WARN") && l.contains("XDP")),
        "an XDP warning with default flags:\n{log}"
    );

    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir(Node::A).to_string_lossy().into_owned();
    let out = sb
        .exec(&sb.node_ns(Node::A), &[&bin, "status", "--pin-root", &pin])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = format!(
        "{} xdp: off (auto: veth uplink: tc only",
        sb.uplink(Node::A)
    );
    assert!(text.contains(&line), "status lacks {line:?}:\n{text}");
    let out = sb
        .exec(
            &sb.node_ns(Node::A),
            &[&bin, "status", "--pin-root", &pin, "-o", "json"],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status -o json");
    let uplink = json["interfaces"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["role"] == "uplink"))
        .unwrap_or_else(|| panic!("no uplink row: {json}"));
    assert_eq!(uplink["xdp"]["mode"], "off", "{uplink}");

    for (port, proto) in [(NODEPORT_TCP, Proto::Tcp), (NODEPORT_UDP, Proto::Udp)] {
        let entry = EntryPoint {
            address: Node::A.ip().to_string(),
            port,
            proto,
        };
        let run = hit(&sb, Client::One, &entry, COUNT, 1000);
        assert!(
            run.all_ok(),
            "{entry}: {} failed:\n{}",
            run.failures(),
            run.raw
        );
        assert_eq!(
            run.client_saw(),
            vec![entry.addr()],
            "{entry}:\n{}",
            run.raw
        );
        let mut nodes = BTreeSet::new();
        for attempt in &run.attempts {
            let Attempt::Ok { name, pod_saw, .. } = attempt else {
                continue;
            };
            let pod = pods
                .iter()
                .find(|p| &p.name() == name)
                .unwrap_or_else(|| panic!("{entry}: answered by {name}:\n{}", run.raw));
            let want = match pod.node {
                Node::A => CLIENT_IPS[0],
                Node::B => Node::A.ip(),
            };
            assert_eq!(
                pod_saw.split(':').next(),
                Some(want),
                "{entry}, {name}:\n{}",
                run.raw
            );
            nodes.insert(pod.node);
        }
        assert_eq!(
            nodes.len(),
            2,
            "{entry}: not both local and remote backends answered:\n{}",
            run.raw
        );
    }
}

/// 3000-byte UDP datagrams (two fragments each way at MTU 1500) from outside
/// to a NodePort, answered with 3000 bytes: with local backends (DNAT only)
/// and with remote ones (DNAT plus SNAT, sent back out), the later fragments
/// follow their first fragment's translation both ways.
#[test]
fn fragmented_udp_through_a_nodeport_both_ways() {
    for (pods, why) in [
        (Node::A.pods(), "local backends"),
        (Node::B.pods(), "remote backends"),
    ] {
        let sb = two_node_with_agents(Policy::Cluster, &pods, &[]);
        let addr = format!("{}:{NODEPORT_UDP}", Node::A.ip());
        let run = sb
            .client(&sb_echo(), Client::One, &fragmented_udp_args(&addr))
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert!(
            run.all_ok(),
            "3000-byte datagrams to {addr} ({why}):\n{}",
            run.raw
        );
        let answered: BTreeSet<String> = run.names().into_iter().collect();
        assert!(answered.is_subset(&names(&pods)), "{why}: {answered:?}");
        assert_eq!(run.client_saw(), vec![addr.clone()], "{why}: {}", run.raw);
    }
}

/// `ip link` of node A's uplink: which XDP hook carries a program (`xdp`
/// is the native one, `xdpgeneric` the generic one).
fn xdp_hook(sb: &TwoNodeSandbox) -> String {
    let out = sb
        .exec(
            &sb.node_ns(Node::A),
            &["ip", "-d", "link", "show", &sb.uplink(Node::A)],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    let text = String::from_utf8_lossy(&out.stdout);
    ["xdpgeneric", "xdp"]
        .into_iter()
        .find(|hook| text.contains(&format!("{hook} ")) || text.contains(&format!("prog/{hook}")))
        .unwrap_or("none")
        .to_owned()
}

/// A restarted agent with another `--xdp-mode` replaces the earlier mode's
/// program (the kernel releases the old link asynchronously; the attach waits
/// for it) and traffic to remote backends flows in each mode.
#[test]
fn xdp_mode_changes_across_agent_restarts() {
    let pods = Node::B.pods();
    let mut sb = two_node_with_agents_on(Lan::XdpReady, Policy::Cluster, &pods, &[]);
    let entry = EntryPoint {
        address: Node::A.ip().to_string(),
        port: NODEPORT_TCP,
        proto: Proto::Tcp,
    };
    assert_eq!(xdp_hook(&sb), "none", "auto: no XDP on a veth uplink");
    for (mode, hook) in [
        ("native", "xdp"),
        ("generic", "xdpgeneric"),
        ("off", "none"),
    ] {
        sb.stop_agent(Node::A).unwrap_or_else(|e| panic!("{e:#}"));
        sb.start_agent(Node::A, &switchboard(), &["--xdp-mode", mode])
            .unwrap_or_else(|e| panic!("{e:#}"));
        // The old program stays attached until the new agent replaces it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while xdp_hook(&sb) != hook && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        assert_eq!(
            xdp_hook(&sb),
            hook,
            "--xdp-mode {mode}:\n{}",
            sb.agent_log(Node::A)
        );
        if mode == "native" {
            // Allowed on a veth, but not quietly.
            let log = sb.agent_log(Node::A);
            let warned = log.lines().any(|l| {
                l.contains("WARN")
                    && l.contains(&format!("iface={}", sb.uplink(Node::A)))
                    && l.contains("native XDP on a veth uplink")
            });
            assert!(warned, "no warning for native XDP on a veth:\n{log}");
        }
        sb.wait_uplink_attached(Node::A, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("--xdp-mode {mode}: {e:#}"));
        let run = hit(&sb, Client::One, &entry, 5, 1000);
        assert_answers(
            &run,
            &entry,
            &pods,
            Node::A.ip(),
            &format!("--xdp-mode {mode}"),
        );
    }
}

/// `--nodeport-addresses`: NodePorts are served on the node's interface
/// addresses within the given blocks, not only on the Node's InternalIP.
#[test]
fn nodeport_addresses_select_the_node_addresses_nodeports_answer_on() {
    let pods = Node::A.pods();
    let mut sb = two_node_with_agents(Policy::Cluster, &pods, &[]);
    let extra_ip = "192.168.50.11";
    sb.exec(
        &sb.node_ns(Node::A),
        &[
            "ip",
            "addr",
            "add",
            &format!("{extra_ip}/24"),
            "dev",
            &sb.uplink(Node::A),
        ],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let on_extra = EntryPoint {
        address: extra_ip.to_string(),
        port: NODEPORT_UDP,
        proto: Proto::Udp,
    };
    // Default: only the Node's InternalIP (192.168.50.1) serves the NodePort.
    let run = hit(&sb, Client::One, &on_extra, 3, 300);
    assert_eq!(
        run.failures(),
        3,
        "{on_extra} is no NodePort address yet:\n{}",
        run.raw
    );

    sb.stop_agent(Node::A).unwrap_or_else(|e| panic!("{e:#}"));
    sb.start_agent(
        Node::A,
        &switchboard(),
        &["--nodeport-addresses", "192.168.50.0/24"],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut run = hit(&sb, Client::One, &on_extra, 1, 300);
    while !run.all_ok() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        run = hit(&sb, Client::One, &on_extra, 1, 300);
    }
    let run = hit(&sb, Client::One, &on_extra, COUNT, 1000);
    assert_answers(
        &run,
        &on_extra,
        &pods,
        CLIENT_IPS[0],
        "--nodeport-addresses 192.168.50.0/24",
    );
}

// --- loadBalancerSourceRanges -----------------------------------

/// `ext/web-lb` restricted to client 1: client 1 reaches the LoadBalancer IP
/// (TCP and UDP) and keeps its address; client 2 gets no answer there and
/// node A counts its drops, while the Service's NodePort still answers it
/// (kube-proxy restricts only the load-balancer IPs). Widening the list to
/// client 2 lets it through within a second.
#[test]
fn load_balancer_source_ranges_admit_only_listed_clients() {
    let pods = Node::A.pods();
    let mut sb = two_node_with_agents(Policy::Cluster, &pods, &[]);
    let sw = switchboard();
    let lb = ExternalService::LoadBalancer;
    let only_one = format!("{}/32", Client::One.ip());
    let write = |sb: &TwoNodeSandbox, ranges: &[&str]| {
        sb.write_manifest(
            &lb.service_file(),
            &lb.yaml_with_source_ranges(Policy::Cluster, ranges),
        )
        .expect("write the restricted Service");
    };
    let restricted_to = |want: Vec<String>| {
        move |f: &[xtask::sandbox::Frontend]| {
            lb.entry_points(Node::A).iter().all(|e| {
                find_at(f, &e.address, e.port, e.proto.as_str())
                    .is_some_and(|fe| fe.source_ranges.as_ref() == Some(&want))
            })
        }
    };
    write(&sb, &[&only_one]);
    sb.wait_services(
        Node::A,
        &sw,
        Duration::from_secs(10),
        "the LB restricted to client 1",
        restricted_to(vec![only_one.clone()]),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));

    for entry in lb.entry_points(Node::A) {
        let run = hit(&sb, Client::One, &entry, COUNT, 1000);
        assert_answers(
            &run,
            &entry,
            &pods,
            Client::One.ip(),
            "client 1 is inside the ranges",
        );
        let run = hit(&sb, Client::Two, &entry, 3, 500);
        assert_dropped(&run, &entry, "client 2 is outside loadBalancerSourceRanges");
    }
    let frontends = sb.services(Node::A, &sw).expect("services");
    for entry in lb.entry_points(Node::A) {
        let fe = find_at(&frontends, &entry.address, entry.port, entry.proto.as_str())
            .expect("the LB frontend");
        assert!(
            fe.drops_source_range >= 3,
            "{entry}: client 2's drops are counted: {fe:?}"
        );
    }
    // The Service's NodePort is not restricted.
    let node_port = EntryPoint {
        address: Node::A.ip().to_string(),
        port: 30081,
        proto: Proto::Tcp,
    };
    let run = hit(&sb, Client::Two, &node_port, 3, 1000);
    assert!(
        run.all_ok(),
        "{node_port}: the NodePort of a restricted Service stays open:\n{}",
        run.raw
    );

    // Widened: client 2 gets through within a second of the file change.
    // 192.168.50.100/31 holds .100 and .101.
    let both = format!("{}/31", Client::One.ip());
    let tcp = lb.entry_points(Node::A)[0].clone();
    let widened = Instant::now();
    write(&sb, &[&both]);
    let through = loop {
        let run = hit(&sb, Client::Two, &tcp, 1, 200);
        if run.all_ok() {
            break widened.elapsed();
        }
        assert!(
            widened.elapsed() < Duration::from_secs(5),
            "client 2 still denied 5 s after widening:\n{}\n{}",
            run.raw,
            sb.agent_log(Node::A)
        );
    };
    assert!(
        through < Duration::from_secs(1),
        "client 2 got through {through:?} after widening: more than a second"
    );
}
