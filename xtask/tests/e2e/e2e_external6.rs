//! Netns end-to-end tests of IPv6 from outside the nodes (root only): a
//! dual-stack NodePort Service reached by an external client at node A's
//! IPv6 address, over TCP and UDP, through the uplink programs: with the
//! agents' defaults on the kind-like LAN (tc only on its veth uplinks), and
//! with native XDP on the XDP-ready LAN.
//!
//! The two-node sandbox (`xtask::sandbox::two_node`) is dual-stack: node A is
//! fd00:50::1, node B fd00:50::2, client 1 fd00:50::100, node A's pods
//! fd00:10:244:1::2/::3 and node B's fd00:10:244:2::2/::3. The Node manifests
//! name both addresses as InternalIPs, so each agent serves NodePorts on its
//! node's IPv6 address too. `ext/web6` is `RequireDualStack` (cluster IPs
//! 10.96.0.30 and fd00:96::30) with one EndpointSlice per family.
//!
//! Peer addresses asserted (as for IPv4 in e2e_external.rs):
//! - `Local` policy, backends on node A: DNAT only, the pod sees the
//!   client's own IPv6 address;
//! - `Cluster` policy, backends on node B: the request is SNATed to node A's
//!   IPv6 uplink address, which the pod sees;
//! - either way the client sees node A's `[address]:nodePort` as its peer
//!   (replies reverse-translated, no pod or node B address leaks).
//!
//! Fragmented datagrams take the same paths: node A's uplink translates
//! their later fragments as it did the first.
//!
//! The binaries come from SWITCHBOARD_BIN and SB_ECHO_BIN (`cargo xtask test`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use xtask::sandbox::two_node::manifests::{
    dual_stack_nodeport_yaml, dual_stack_slice_yaml, node_file, node_yaml_dual_stack, EntryPoint,
    Policy, Proto, DUAL_NODEPORT_TCP, DUAL_NODEPORT_UDP,
};
use xtask::sandbox::two_node::{Client, Node, Pod};

use crate::e2e_reject::assert_refused;
use xtask::sandbox::{find_at, Frontend, Lan, TwoNodeSandbox};
use xtask::testenv::{
    counters, fragmented_udp_args, pod_saw_ips, sb_echo, switchboard, two_node_sandbox_on,
};

/// Attempts per entry point that must all succeed.
const COUNT: u32 = 20;

/// The NodePort entry points of `ext/web6` at `address`.
fn nodeports_at(address: &str) -> Vec<EntryPoint> {
    [
        (DUAL_NODEPORT_TCP, Proto::Tcp),
        (DUAL_NODEPORT_UDP, Proto::Udp),
    ]
    .into_iter()
    .map(|(port, proto)| EntryPoint {
        address: address.to_string(),
        port,
        proto,
    })
    .collect()
}

/// A dual-stack two-node sandbox: dual-stack Node manifests, `ext/web6`
/// under `policy` with `pods` in both EndpointSlices, an agent on each node
/// (with `agent_args`), node A programmed with `pods` behind its NodePorts of
/// both families, and both uplinks carrying the programs.
pub(crate) fn dual_stack_with_agents(
    lan: Lan,
    policy: Policy,
    pods: &[Pod],
    agent_args: &[&str],
) -> TwoNodeSandbox {
    let mut sb = two_node_sandbox_on(lan);
    let write = |sb: &TwoNodeSandbox, name: &str, yaml: &str| {
        sb.write_manifest(name, yaml)
            .unwrap_or_else(|e| panic!("write {name}: {e:#}"))
    };
    for node in Node::ALL {
        write(&sb, &node_file(node), &node_yaml_dual_stack(node));
    }
    write(
        &sb,
        "eps-web6-ipv4.yaml",
        &dual_stack_slice_yaml("IPv4", pods),
    );
    write(
        &sb,
        "eps-web6-ipv6.yaml",
        &dual_stack_slice_yaml("IPv6", pods),
    );
    write(&sb, "svc-web6.yaml", &dual_stack_nodeport_yaml(policy));
    let sw = switchboard();
    for node in Node::ALL {
        sb.start_agent(node, &sw, agent_args)
            .unwrap_or_else(|e| panic!("start the agent of {}: {e:#}", node.name()));
    }
    let mut wanted: Vec<(EntryPoint, BTreeSet<String>)> = Vec::new();
    for entry in nodeports_at(Node::A.ip()) {
        wanted.push((entry, pods.iter().map(|p| p.ip()).collect()));
    }
    for entry in nodeports_at(Node::A.ip6()) {
        wanted.push((entry, pods.iter().map(|p| p.ip6()).collect()));
    }
    let what = format!(
        "NodePorts {} with backends {:?}",
        wanted
            .iter()
            .map(|(e, _)| e.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        wanted.iter().map(|(_, b)| b).collect::<Vec<_>>()
    );
    let programmed = |f: &[Frontend]| {
        wanted.iter().all(|(e, backends)| {
            find_at(f, &e.address, e.port, e.proto.as_str()).is_some_and(|fe| {
                let got: BTreeSet<String> = fe.backends.iter().map(|b| b.address.clone()).collect();
                &got == backends
            })
        })
    };
    // The deadline covers both agents' starts (each loads its object):
    // 10 s under the test runner's parallel lanes on two cores, seen.
    if let Err(e) = sb.wait_services(Node::A, &sw, Duration::from_secs(30), &what, programmed) {
        panic!("{e:#}");
    }
    for node in Node::ALL {
        if let Err(e) = sb.wait_uplink_attached(node, Duration::from_secs(10)) {
            panic!("{e:#}");
        }
    }
    sb
}

/// `switchboard stats` of `node` (for failure messages).
fn stats(sb: &TwoNodeSandbox, node: Node) -> String {
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir(node).to_string_lossy().into_owned();
    match sb.exec(&sb.node_ns(node), &[&bin, "stats", "--pin-root", &pin]) {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => format!("(switchboard stats failed: {e:#})"),
    }
}

/// `COUNT` attempts from client 1 to `entry`: every one answered by one of
/// `pods`, the client seeing `entry` as its peer and the pods `peer_ip`.
/// Failure messages carry node A's `switchboard stats`.
fn assert_answers(sb: &TwoNodeSandbox, entry: &EntryPoint, pods: &[Pod], peer_ip: &str, why: &str) {
    let run = sb
        .hit(&sb_echo(), Client::One, entry, COUNT, 1000)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let context = || {
        format!(
            "{}\n--- switchboard stats of node-a ---\n{}",
            run.raw,
            stats(sb, Node::A)
        )
    };
    assert!(
        run.all_ok(),
        "{entry}: {} of {} attempts failed ({why}):\n{}",
        run.failures(),
        run.attempts.len(),
        context()
    );
    let answered: BTreeSet<String> = run.names().into_iter().collect();
    let allowed: BTreeSet<String> = pods.iter().map(|p| p.name()).collect();
    assert!(
        answered.is_subset(&allowed),
        "{entry}: answered by {answered:?}, expected only {allowed:?} ({why}):\n{}",
        context()
    );
    assert_eq!(
        run.client_saw(),
        vec![entry.addr()],
        "{entry}: the client saw another peer (replies not reverse-translated) ({why}):\n{}",
        context()
    );
    assert_eq!(
        pod_saw_ips(&run),
        BTreeSet::from([peer_ip.to_string()]),
        "{entry}: the pods saw another peer address than {peer_ip} ({why}):\n{}",
        context()
    );
}

/// Local policy, backends on node A: through node A's IPv6 address the pods
/// see client 1's own IPv6 address (DNAT only).
fn local_policy_keeps_the_client_address(lan: Lan, agent_args: &[&str]) {
    let pods = Node::A.pods();
    let sb = dual_stack_with_agents(lan, Policy::Local, &pods, agent_args);
    for entry in nodeports_at(Node::A.ip6()) {
        assert_answers(
            &sb,
            &entry,
            &pods,
            Client::One.ip6(),
            &format!(
                "IPv6, Local policy, backends on node A, agent args {agent_args:?}: DNAT only"
            ),
        );
    }
}

/// Cluster policy, backends on node B: through node A's IPv6 address the
/// requests reach node B's pods source-NATed to node A's IPv6 uplink address;
/// the IPv4 NodePort of the same Service still SNATs to node A's IPv4 one.
fn cluster_policy_snats_to_node_a(lan: Lan, agent_args: &[&str]) {
    let pods = Node::B.pods();
    let sb = dual_stack_with_agents(lan, Policy::Cluster, &pods, agent_args);
    for entry in nodeports_at(Node::A.ip6()) {
        assert_answers(
            &sb,
            &entry,
            &pods,
            Node::A.ip6(),
            &format!("IPv6, Cluster policy, backends on node B, agent args {agent_args:?}: SNAT to node A"),
        );
    }
    for entry in nodeports_at(Node::A.ip()) {
        assert_answers(
            &sb,
            &entry,
            &pods,
            Node::A.ip(),
            &format!(
                "IPv4 of the dual-stack Service, backends on node B, agent args {agent_args:?}"
            ),
        );
    }
}

#[test]
fn nodeport6_local_policy_keeps_the_client_address() {
    local_policy_keeps_the_client_address(Lan::KindLike, &[]);
}

#[test]
fn nodeport6_local_policy_keeps_the_client_address_with_native_xdp() {
    local_policy_keeps_the_client_address(Lan::XdpReady, &["--xdp-mode", "native"]);
}

#[test]
fn nodeport6_cluster_policy_remote_backends_see_node_a() {
    cluster_policy_snats_to_node_a(Lan::KindLike, &[]);
}

#[test]
fn nodeport6_cluster_policy_remote_backends_see_node_a_with_native_xdp() {
    cluster_policy_snats_to_node_a(Lan::XdpReady, &["--xdp-mode", "native"]);
}

/// 3000-byte UDP datagrams over IPv6 (three fragments each way at MTU
/// 1500) from client 1 to node A's IPv6 NodePort, answered with 3000
/// bytes, for each of `cases` (pods, policy, why): every datagram answered,
/// the client seeing the NodePort as its peer, so the later fragments
/// followed their first fragment's translation both ways.
fn fragmented_udp6(lan: Lan, agent_args: &[&str], cases: &[(Vec<Pod>, Policy, &str)]) {
    for (pods, policy, why) in cases {
        let sb = dual_stack_with_agents(lan, *policy, pods, agent_args);
        let addr = format!("[{}]:{DUAL_NODEPORT_UDP}", Node::A.ip6());
        let run = sb
            .client(&sb_echo(), Client::One, &fragmented_udp_args(&addr))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let context = || {
            format!(
                "{}\n--- stats of node-a ---\n{}",
                run.raw,
                stats(&sb, Node::A)
            )
        };
        assert!(
            run.all_ok(),
            "3000-byte datagrams to {addr} ({why}):\n{}",
            context()
        );
        let answered: BTreeSet<String> = run.names().into_iter().collect();
        let allowed: BTreeSet<String> = pods.iter().map(|p| p.name()).collect();
        assert!(
            answered.is_subset(&allowed),
            "{why}: {answered:?}\n{}",
            context()
        );
        assert_eq!(
            run.client_saw(),
            vec![addr.clone()],
            "{why}:\n{}",
            context()
        );
        // Ten datagrams, two later fragments each, both ways, through node
        // A's uplink programs.
        let translated = counters(&sb.pin_dir(Node::A))["frag_translated"];
        assert!(
            translated >= 40,
            "{why}: {translated} later fragments translated"
        );
    }
}

#[test]
fn nodeport6_fragmented_udp_both_ways() {
    fragmented_udp6(
        Lan::KindLike,
        &[],
        &[
            (Node::A.pods(), Policy::Local, "local backends, DNAT only"),
            (
                Node::B.pods(),
                Policy::Cluster,
                "remote backends, DNAT and SNAT",
            ),
        ],
    );
}

#[test]
fn nodeport6_fragmented_udp_both_ways_with_native_xdp() {
    fragmented_udp6(
        Lan::XdpReady,
        &["--xdp-mode", "native"],
        &[(
            Node::B.pods(),
            Policy::Cluster,
            "remote backends, XDP hands fragments to tc",
        )],
    );
}

/// Direct server return over IPv6 (`--nodeport-mode dsr`), backends on node
/// B: the pods see client 1's own IPv6 address, the client sees node A's
/// `[address]:nodePort` (node B answers from it), and node A translates no
/// reply; then 200 kB over TCP from a client that sends one segment per
/// skb (no GSO), so every full segment gets a packet too big, over a
/// partial checksum on the kind-like LAN (see `e2e_dsr`); then 3000-byte
/// datagrams: the first first-fragment too large for the destination
/// options header gets a packet too big, the client's path MTU shrinks,
/// and the rest arrive.
fn direct_return6(lan: Lan, extra: &[&str]) {
    let pods = Node::B.pods();
    let args: Vec<&str> = ["--nodeport-mode", "dsr"]
        .iter()
        .chain(extra)
        .copied()
        .collect();
    let sb = dual_stack_with_agents(lan, Policy::Cluster, &pods, &args);
    for entry in nodeports_at(Node::A.ip6()) {
        assert_answers(
            &sb,
            &entry,
            &pods,
            Client::One.ip6(),
            &format!("IPv6 direct server return, agent args {args:?}"),
        );
    }
    sb.one_segment_per_skb(Client::One)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let tcp = format!("[{}]:{DUAL_NODEPORT_TCP}", Node::A.ip6());
    let tcp_args = [
        "--tcp",
        &tcp,
        "--tcp-size",
        "200000",
        "--count",
        "3",
        "--timeout-ms",
        "15000",
    ];
    let run = sb
        .client(&sb_echo(), Client::One, &tcp_args)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let a = counters(&sb.pin_dir(Node::A));
    assert!(run.all_ok(), "200 kB through {tcp}:\n{}\n{a:?}", run.raw);
    assert_eq!(run.client_saw(), vec![tcp.clone()], "{}", run.raw);
    let too_big_tcp = a["rejected"];
    assert!(
        too_big_tcp >= 1,
        "no TCP segment got a packet too big: {a:?}"
    );
    // The path MTU TCP learned is forgotten, so UDP learns it again.
    sb.forget_path_mtus(Client::One)
        .unwrap_or_else(|e| panic!("{e:#}"));

    let addr = format!("[{}]:{DUAL_NODEPORT_UDP}", Node::A.ip6());
    let run = sb
        .client(&sb_echo(), Client::One, &fragmented_udp_args(&addr))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let a = counters(&sb.pin_dir(Node::A));
    assert!(
        run.failures() <= 1 && run.attempts.len() == 10,
        "3000-byte datagrams to {addr}:\n{}\n{a:?}",
        run.raw
    );
    assert_eq!(run.client_saw(), vec![addr.clone()], "{}", run.raw);
    assert!(
        a["rejected"] > too_big_tcp,
        "no packet too big for UDP from node A: {a:?}"
    );
    assert_eq!(a["ext_reply"], 0, "a reply passed node A: {a:?}");
    assert!(a["ext_remote"] >= 2 * u64::from(COUNT), "{a:?}");
}

/// A NodePort without endpoints refuses a client outside the cluster at
/// once, in both families (kube-proxy's REJECT): IPv4 with an ICMP port
/// unreachable, IPv6 with a RST, each written over the client's SYN, whose
/// checksum is partial (it left a veth), on the kind-like LAN, which
/// finishes checksums on the way to the client. Spoiled by that, the
/// answer would be dropped and the connect would time out
/// (`reject::Shield`).
#[test]
fn a_nodeport_without_endpoints_refuses_an_outside_client_at_once() {
    let sb = dual_stack_with_agents(Lan::KindLike, Policy::Cluster, &[], &[]);
    let addresses = [
        format!("{}:{DUAL_NODEPORT_TCP}", Node::A.ip()),
        format!("[{}]:{DUAL_NODEPORT_TCP}", Node::A.ip6()),
    ];
    for address in addresses {
        let args = ["--tcp", &address, "--count", "3", "--timeout-ms", "5000"];
        let began = Instant::now();
        let run = sb
            .client(&sb_echo(), Client::One, &args)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let what = format!("TCP connect to {address}");
        assert_refused(&run, began.elapsed(), 3, &what, || sb.agent_log(Node::A));
    }
}

#[test]
fn nodeport6_direct_server_return() {
    direct_return6(Lan::KindLike, &[]);
}

#[test]
fn nodeport6_direct_server_return_with_native_xdp() {
    direct_return6(Lan::XdpReady, &["--xdp-mode", "native"]);
}
