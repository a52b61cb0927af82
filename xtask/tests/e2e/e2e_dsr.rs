//! Netns end-to-end tests of direct server return (`--nodeport-mode dsr`,
//! root only), in the two-node sandbox (see `e2e_external`): both agents
//! run the mode, the Services' endpoints are node B's pods, and the clients
//! send to node A's NodePorts, the LoadBalancer IP and the external IP
//! (routed via node A).
//!
//! What direct server return promises, asserted here:
//! - the pods see the client's own address (no source NAT);
//! - the client sees the address it sent to as its peer (node B sends the
//!   replies from the frontend);
//! - the replies bypass node A: its uplink programs translate no reply
//!   (`ext_reply` stays 0), while it forwards every request (`ext_remote`),
//!   each tracked once on node B (`ext_local`);
//! - large transfers work both ways: requests larger than the path MTU
//!   once the option is in are answered with "fragmentation needed", and
//!   the client's path-MTU discovery takes it from there.

use std::collections::BTreeSet;

use xtask::sandbox::two_node::manifests::{
    EntryPoint, ExternalService, Policy, NODEPORT_TCP, NODEPORT_UDP,
};
use xtask::sandbox::two_node::{Client, Node};
use xtask::sandbox::{Lan, TwoNodeSandbox};
use xtask::testenv::{
    assert_answers, counters, fragmented_udp_args, sb_echo, status_line, two_node_with_agents_on,
};

const DSR: [&str; 2] = ["--nodeport-mode", "dsr"];

/// Both agents in DSR mode on `lan` with `extra` flags, node B's pods the
/// endpoints.
fn dsr_sandbox(lan: Lan, extra: &[&str]) -> TwoNodeSandbox {
    let args: Vec<&str> = DSR.iter().chain(extra).copied().collect();
    two_node_with_agents_on(lan, Policy::Cluster, &Node::B.pods(), &args)
}

/// Every entry point through node A answers from node B's pods, which see
/// the client; node A forwarded the requests and translated no reply.
fn replies_bypass_the_entry_node(sb: &TwoNodeSandbox, why: &str) {
    let pods = Node::B.pods();
    let entries: Vec<EntryPoint> = ExternalService::ALL
        .iter()
        .flat_map(|s| s.entry_points(Node::A))
        .collect();
    for entry in &entries {
        let run = sb
            .hit(&sb_echo(), Client::One, entry, 20, 1000)
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_answers(&run, entry, &pods, Client::One.ip(), why);
    }
    let a = counters(&sb.pin_dir(Node::A));
    assert!(
        a["ext_remote"] >= 20 * entries.len() as u64,
        "{why}: node A: {a:?}"
    );
    assert_eq!(a["ext_reply"], 0, "{why}: a reply passed node A: {a:?}");
    let b = counters(&sb.pin_dir(Node::B));
    assert!(
        b["ext_local"] > 0,
        "{why}: node B tracked no arrival: {b:?}"
    );
    // Each packet node A sent on was tracked once on node B (XDP tells tc
    // it did the work, so tc does not do it again).
    assert_eq!(
        b["ext_local"], a["ext_remote"],
        "{why}: node B's arrivals against node A's forwarded packets"
    );
    let (mode, status) = status_line(&sb.pin_dir(Node::A), "NodePort mode:");
    assert!(
        mode.is_some_and(|m| m.ends_with("dsr")),
        "{why}: status:\n{status}"
    );
}

/// The agents' defaults otherwise, on the kind-like LAN (tc only).
#[test]
fn dsr_replies_bypass_the_entry_node() {
    let sb = dsr_sandbox(Lan::KindLike, &[]);
    replies_bypass_the_entry_node(&sb, "--nodeport-mode dsr, tc");
}

/// Native XDP on the XDP-ready LAN: the option is put in at the driver.
#[test]
fn dsr_replies_bypass_the_entry_node_with_native_xdp() {
    let sb = dsr_sandbox(Lan::XdpReady, &["--xdp-mode", "native"]);
    replies_bypass_the_entry_node(&sb, "--nodeport-mode dsr, native XDP");
}

/// 200 kB each way over TCP, and 3000-byte UDP datagrams, through node A's
/// NodePort: the client learns the path MTU the option leaves. The client
/// sends every TCP segment on its own (no GSO: one segment per skb, as a
/// sender without segmentation offload does), so each full-sized one is
/// answered with "fragmentation needed"; with GSO, node A shrinks the
/// segments of a large skb to fit instead, and only the occasional lone
/// segment met the answer. Every such segment leaves the client's veth
/// with a partial checksum, and the kind-like LAN finishes checksums on
/// the way back to the client: the answer must survive that.
#[test]
fn dsr_large_transfers_work_both_ways() {
    let sb = dsr_sandbox(Lan::KindLike, &[]);
    let pods: BTreeSet<String> = Node::B.pods().iter().map(|p| p.name()).collect();
    sb.one_segment_per_skb(Client::One)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let tcp = format!("{}:{NODEPORT_TCP}", Node::A.ip());
    let run = sb
        .client(
            &sb_echo(),
            Client::One,
            &[
                "--tcp",
                &tcp,
                "--tcp-size",
                "200000",
                "--count",
                "5",
                "--timeout-ms",
                "15000",
            ],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        run.all_ok(),
        "200 kB through {tcp}:\n{}\nnode A: {:?}\nnode B: {:?}",
        run.raw,
        counters(&sb.pin_dir(Node::A)),
        counters(&sb.pin_dir(Node::B))
    );
    assert_eq!(run.client_saw(), vec![tcp.clone()], "{}", run.raw);
    let answered: BTreeSet<String> = run.names().into_iter().collect();
    assert!(answered.is_subset(&pods), "{answered:?}");
    let too_big_tcp = counters(&sb.pin_dir(Node::A))["rejected"];
    assert!(
        too_big_tcp >= 1,
        "no TCP segment was answered with fragmentation-needed: the test missed its path"
    );

    // A connected UDP socket gets EMSGSIZE once, at the error that lowers
    // its path MTU; it is replaced, and the rest arrive. The path MTU TCP
    // learned to node A is forgotten first, so UDP learns it again.
    sb.forget_path_mtus(Client::One)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let udp = format!("{}:{NODEPORT_UDP}", Node::A.ip());
    let run = sb
        .client(&sb_echo(), Client::One, &fragmented_udp_args(&udp))
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        run.failures() <= 1 && run.attempts.len() == 10,
        "3000-byte datagrams to {udp}:\n{}",
        run.raw
    );
    assert_eq!(run.client_saw(), vec![udp.clone()], "{}", run.raw);
    let a = counters(&sb.pin_dir(Node::A));
    assert!(
        a["rejected"] > too_big_tcp,
        "no fragmentation-needed for UDP from node A: {a:?}"
    );
    assert_eq!(a["ext_reply"], 0, "{a:?}");
}
