//! Netns end-to-end tests of the hashing load-balancing algorithms for
//! traffic from outside the nodes (root only): Maglev over the 5-tuple and
//! source hash over the client address, which every node must compute alike
//! so that a flow (or a client) lands on the same backend whichever node a
//! router sends it to.
//!
//! Two-node sandbox (`xtask::sandbox::two_node`, see `e2e_external.rs`):
//! the LoadBalancer Service `ext/web-lb` (203.0.113.10, TCP 80 and UDP 53,
//! `externalTrafficPolicy: Cluster`) has all four pods as endpoints, every
//! node runs its own agent (default flags: on the kind-like LAN's veth
//! uplinks that is tc only), and client 1 sends from a
//! fixed source port (`sb-echo client --sport N`) first via node A, then via
//! node B (`route_services_via`). Through a node, a backend on the other node
//! is reached with SNAT (the pod sees the entry node's address) and a local
//! one without; what is compared is the NAME of the pod that answers.
//!
//! The binaries come from SWITCHBOARD_BIN and SB_ECHO_BIN (`cargo xtask test`).

use std::collections::{BTreeMap, BTreeSet};

use xtask::sandbox::two_node::manifests::{EntryPoint, ExternalService, Policy, Proto};
use xtask::sandbox::two_node::{Client, Node, Pod};
use xtask::sandbox::{Attempt, TwoNodeSandbox};
use xtask::testenv::{
    sb_echo, switchboard, two_node_sandbox, two_node_with_agents, wait_programmed,
};

/// Source ports tried per protocol.
const PORTS: u16 = 20;
/// First source port of UDP attempts; TCP ones start at `+ 1000`. Above the
/// ephemeral range (32768-60999): a port the kernel picked for an earlier
/// connection of the test could still be in TIME_WAIT.
const FIRST_SPORT: u16 = 61000;

/// The LoadBalancer Service's entry points (TCP 80, UDP 53 at the LB IP,
/// the same through either node).
fn lb_entries() -> Vec<EntryPoint> {
    ExternalService::LoadBalancer.entry_points(Node::A)
}

/// The source ports tried for `proto`.
fn sports(proto: Proto) -> impl Iterator<Item = u16> {
    let first = match proto {
        Proto::Udp => FIRST_SPORT,
        Proto::Tcp => FIRST_SPORT + 1000,
    };
    first..first + PORTS
}

/// One attempt from `from`, source port `sport`, to `entry`: the answering
/// pod's name. Panics (with the client output and the agent logs) when the
/// attempt fails, the client saw another peer than `entry`, or a pod of the
/// entry node (reached without SNAT) saw another source than the client's
/// own address and `sport`.
fn answer(sb: &TwoNodeSandbox, from: Client, via: Node, entry: &EntryPoint, sport: u16) -> String {
    let args = [
        entry.proto.client_flag(),
        &entry.addr(),
        "--count",
        "1",
        "--timeout-ms",
        "1000",
        "--sport",
        &sport.to_string(),
    ];
    let run = sb
        .client(&sb_echo(), from, &args)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let Some(Attempt::Ok {
        name,
        pod_saw,
        client_saw,
        ..
    }) = run.attempts.first()
    else {
        panic!(
            "{entry} from {}:{sport} via {}: no answer:\n{}\n--- agent A ---\n{}\n--- agent B ---\n{}",
            from.ip(),
            via.name(),
            run.raw,
            sb.agent_log(Node::A),
            sb.agent_log(Node::B)
        );
    };
    assert_eq!(
        client_saw,
        &entry.addr(),
        "{entry} from port {sport} via {}: the client saw another peer:\n{}",
        via.name(),
        run.raw
    );
    let local = via.pods().iter().any(|p| &p.name() == name);
    if local {
        assert_eq!(
            pod_saw,
            &format!("{}:{sport}", from.ip()),
            "{entry} via {}: {name} (local, DNAT only) saw another source than the client's \
             address and --sport:\n{}",
            via.name(),
            run.raw
        );
    } else {
        assert!(
            pod_saw.starts_with(&format!("{}:", via.ip())),
            "{entry} via {}: {name} (remote) should see the entry node's address (SNAT):\n{}",
            via.name(),
            run.raw
        );
    }
    name.clone()
}

/// For every source port of `entry`'s protocol, the pod answering `from`
/// through `via`.
fn answers_via(
    sb: &TwoNodeSandbox,
    from: Client,
    via: Node,
    entry: &EntryPoint,
) -> BTreeMap<u16, String> {
    sb.route_services_via(from, via)
        .unwrap_or_else(|e| panic!("route services via {}: {e:#}", via.name()));
    sports(entry.proto)
        .map(|sport| (sport, answer(sb, from, via, entry, sport)))
        .collect()
}

/// The source ports whose answers through A and B differ, as
/// `port: A → X, B → Y` lines.
fn disagreements(a: &BTreeMap<u16, String>, b: &BTreeMap<u16, String>) -> Vec<String> {
    a.iter()
        .filter(|(sport, pod)| b.get(sport) != Some(pod))
        .map(|(sport, pod)| format!("{sport}: via A → {pod}, via B → {:?}", b.get(sport)))
        .collect()
}

/// Through A and then through B, each source port reaches the same pod, and
/// the ports together reach more than one pod.
fn assert_maglev_agreement(sb: &TwoNodeSandbox, how: &str) {
    for entry in lb_entries() {
        let via_a = answers_via(sb, Client::One, Node::A, &entry);
        let via_b = answers_via(sb, Client::One, Node::B, &entry);
        eprintln!("{entry} ({how}): {via_a:?}");
        let differ = disagreements(&via_a, &via_b);
        assert!(
            differ.is_empty(),
            "{entry} ({how}): {} of {PORTS} source ports reached another pod through node B \
             than through node A:\n{}\nvia A: {via_a:?}\nvia B: {via_b:?}",
            differ.len(),
            differ.join("\n")
        );
        let used: BTreeSet<&String> = via_a.values().collect();
        assert!(
            used.len() > 1,
            "{entry} ({how}): all {PORTS} source ports reached {used:?}; a 5-tuple hash over \
             four backends should spread them: {via_a:?}"
        );
        // Back through A: the same pods again (tracked or re-hashed alike).
        sb.route_services_via(Client::One, Node::A)
            .expect("route services via node A");
    }
}

/// `--lb-algorithm maglev` on both agents: for ~20 fixed source ports, over
/// UDP and TCP, the pod that answers a 5-tuple through node A is the pod
/// that answers it through node B, and the ports spread over more than one
/// pod. (Under `random` the agreement would hold only by chance; that is not
/// asserted, it would be flaky.)
#[test]
fn maglev_sends_a_five_tuple_to_the_same_backend_through_either_node() {
    let pods = Pod::all();
    let sb = two_node_with_agents(Policy::Cluster, &pods, &["--lb-algorithm", "maglev"]);
    assert_maglev_agreement(&sb, "--lb-algorithm maglev");
}

/// The same agreement with the agents' default (`random`) and the Service
/// annotated `switchboard.io/lb-algorithm: maglev`.
#[test]
fn maglev_by_annotation_sends_a_five_tuple_to_the_same_backend_through_either_node() {
    let pods = Pod::all();
    let mut sb = two_node_sandbox();
    sb.write_nodes().expect("write the Node manifests");
    sb.write_services(Policy::Cluster, &pods)
        .expect("write the Service manifests");
    write_maglev_load_balancer(&sb);
    let sw = switchboard();
    for node in Node::ALL {
        sb.start_agent(node, &sw, &[])
            .unwrap_or_else(|e| panic!("start the agent of {}: {e:#}", node.name()));
    }
    for node in Node::ALL {
        wait_programmed(&mut sb, node, &pods);
        if let Err(e) = sb.wait_uplink_attached(node, std::time::Duration::from_secs(10)) {
            panic!("{e:#}");
        }
    }
    assert_maglev_agreement(&sb, "annotation switchboard.io/lb-algorithm: maglev");
}

/// `--lb-algorithm source-hash` on both agents: 20 source ports of client 1,
/// over UDP and TCP, all reach one pod through node A, and that same pod
/// through node B.
#[test]
fn source_hash_sends_a_client_to_one_backend() {
    let pods = Pod::all();
    let sb = two_node_with_agents(Policy::Cluster, &pods, &["--lb-algorithm", "source-hash"]);
    for entry in lb_entries() {
        let via_a = answers_via(&sb, Client::One, Node::A, &entry);
        let via_b = answers_via(&sb, Client::One, Node::B, &entry);
        eprintln!("{entry} (source hash): via A {via_a:?}, via B {via_b:?}");
        let used_a: BTreeSet<&String> = via_a.values().collect();
        let used_b: BTreeSet<&String> = via_b.values().collect();
        assert_eq!(
            used_a.len(),
            1,
            "{entry}: source hash through node A sent one client to several pods: {via_a:?}"
        );
        assert_eq!(
            used_b, used_a,
            "{entry}: source hash sent the client to another pod through node B than \
             through node A:\nvia A: {via_a:?}\nvia B: {via_b:?}"
        );
        sb.route_services_via(Client::One, Node::A)
            .expect("route services via node A");
    }
}

/// Writes `ext/web-lb` (the LoadBalancer Service) annotated
/// `switchboard.io/lb-algorithm: maglev`, over its plain manifest.
pub(crate) fn write_maglev_load_balancer(sb: &TwoNodeSandbox) {
    let lb = ExternalService::LoadBalancer;
    let yaml = lb.yaml(Policy::Cluster).replacen(
        "metadata:\n",
        "metadata:\n  annotations:\n    switchboard.io/lb-algorithm: maglev\n",
        1,
    );
    assert!(yaml.contains("switchboard.io/lb-algorithm"), "{yaml}");
    sb.write_manifest(&lb.service_file(), &yaml)
        .expect("write the annotated Service");
}
