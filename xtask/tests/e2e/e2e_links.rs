//! Netns end-to-end tests of uplinks that change while the agent runs
//! (root only), in the two-node sandbox (`xtask::sandbox::two_node`, the
//! kind-like LAN and the agents' default flags):
//! - an uplink named with `--uplink` that does not exist when the agent
//!   starts: the agent runs, says it waits, and attaches the interface once
//!   it is created; then its IPv4 address changes (the Node manifest with
//!   it) and flows to backends on the other node are source-NATed to the new
//!   address;
//! - an uplink found from the Node's address (no `--uplink`) that lacks the
//!   address at start: found once the address is added; then the interface
//!   is deleted and created again (a new index): the new one is attached,
//!   the old one's link pins are gone, and `switchboard status` lists it.
//!
//! Every check sends NodePort traffic from an external client through node A
//! to the pods on node B, so the source NAT to node A's uplink address is
//! exercised (the pods must see that address).
//!
//! The binaries come from SWITCHBOARD_BIN and SB_ECHO_BIN (`cargo xtask test`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use xtask::sandbox::two_node::manifests::{
    node_file, node_yaml, EntryPoint, Policy, Proto, NODEPORT_TCP, NODEPORT_UDP,
};
use xtask::sandbox::two_node::{Client, Node};
use xtask::sandbox::{find_at, ClientRun, TwoNodeSandbox};
use xtask::testenv::{
    assert_answers, pod_saw_ips, sb_echo, switchboard, two_node_sandbox, wait_programmed,
};

/// Attempts per check that must all succeed.
const COUNT: u32 = 10;
/// How long a link change may take to reach the data path (events, and the
/// agent's 2 s rescan as the safety net).
const FOLLOW: Duration = Duration::from_secs(10);
/// Node A's address after the change.
const NODE_A_NEW_IP: &str = "192.168.50.3";

fn nodeports(address: &str) -> Vec<EntryPoint> {
    [(NODEPORT_TCP, Proto::Tcp), (NODEPORT_UDP, Proto::Udp)]
        .into_iter()
        .map(|(port, proto)| EntryPoint {
            address: address.to_owned(),
            port,
            proto,
        })
        .collect()
}

/// Waits until one attempt from client 1 to `entry` is answered with
/// `snat` as the client the pods see, then sends
/// [`COUNT`] and asserts that each was answered by a pod of node B that saw
/// `snat` as the client (the source NAT to node A's uplink address).
fn assert_remote_answers(sb: &mut TwoNodeSandbox, entry: &EntryPoint, snat: &str, why: &str) {
    let deadline = Instant::now() + FOLLOW;
    loop {
        // Answered, with the source NAT the test expects: the agent
        // follows the change within FOLLOW.
        let run = hit(sb, entry, 1);
        if run.all_ok() && pod_saw_ips(&run) == BTreeSet::from([snat.to_owned()]) {
            break;
        }
        assert!(
            Instant::now() < deadline && sb.agent_running(Node::A),
            "{entry}: not answered within {FOLLOW:?} ({why}):\n{}\n--- agent A log ---\n{}",
            run.raw,
            sb.agent_log(Node::A)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let run = hit(sb, entry, COUNT);
    assert_answers(&run, entry, &Node::B.pods(), snat, why);
}

fn hit(sb: &TwoNodeSandbox, entry: &EntryPoint, count: u32) -> ClientRun {
    sb.hit(&sb_echo(), Client::One, entry, count, 1000)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// The uplink rows of node A's `switchboard status -o json`, or `None`
/// while `status` exits non-zero (something it lists is not in place, as
/// an interface being re-created).
fn uplink_rows(sb: &TwoNodeSandbox) -> Option<Vec<serde_json::Value>> {
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir(Node::A).to_string_lossy().into_owned();
    let out = sb
        .exec(
            &sb.node_ns(Node::A),
            &[&bin, "status", "--pin-root", &pin, "-o", "json"],
        )
        .ok()?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status -o json");
    json["interfaces"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter(|r| r["role"] == "uplink")
                .cloned()
                .collect()
        })
        .or(Some(Vec::new()))
}

/// Waits until node A's status lists exactly its uplink, at `index`.
fn wait_status_lists_uplink(sb: &TwoNodeSandbox, index: u32) {
    let deadline = Instant::now() + FOLLOW;
    loop {
        let rows = uplink_rows(sb).unwrap_or_default();
        let listed =
            rows.len() == 1 && rows[0]["name"] == sb.uplink(Node::A) && rows[0]["index"] == index;
        if listed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "status lists {rows:?}, not {} at index {index}\n--- agent A log ---\n{}",
            sb.uplink(Node::A),
            sb.agent_log(Node::A)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until node A's agent logged `needle`.
fn wait_log(sb: &TwoNodeSandbox, needle: &str) {
    let deadline = Instant::now() + FOLLOW;
    while !sb.agent_log(Node::A).contains(needle) {
        assert!(
            Instant::now() < deadline,
            "agent A never logged {needle:?}:\n{}",
            sb.agent_log(Node::A)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The sandbox with the Node manifests and every external Service backed
/// by node B's pods.
fn sandbox_with_remote_backends() -> TwoNodeSandbox {
    let sb = two_node_sandbox();
    sb.write_nodes().expect("write the Node manifests");
    sb.write_services(Policy::Cluster, &Node::B.pods())
        .expect("write the Service manifests");
    sb
}

fn start_b_and_wait(sb: &mut TwoNodeSandbox) {
    sb.start_agent(Node::B, &switchboard(), &[])
        .unwrap_or_else(|e| panic!("start agent B: {e:#}"));
    wait_programmed(sb, Node::B, &Node::B.pods());
}

/// `--uplink` names node A's uplink, deleted before the agent starts: the
/// agent starts anyway, warns that it waits, and attaches the uplink once
/// it exists; NodePorts through A then reach node B's pods source-NATed to
/// A's address. A's address then moves to another one (and the Node
/// manifest with it): the uplink map follows, and the pods see the new one.
#[test]
fn a_named_uplink_created_after_start_is_attached_and_follows_its_address() {
    let mut sb = sandbox_with_remote_backends();
    sb.delete_uplink(Node::A)
        .unwrap_or_else(|e| panic!("{e:#}"));
    start_b_and_wait(&mut sb);
    sb.start_agent(Node::A, &switchboard(), &[])
        .unwrap_or_else(|e| panic!("start agent A: {e:#}"));
    wait_programmed(&mut sb, Node::A, &Node::B.pods());
    wait_log(&sb, "uplink (--uplink) does not exist: waiting for it");
    assert!(sb.agent_running(Node::A), "{}", sb.agent_log(Node::A));
    assert!(
        uplink_rows(&sb).is_some_and(|rows| rows.is_empty()),
        "an uplink listed before it exists"
    );

    sb.recreate_uplink(Node::A)
        .unwrap_or_else(|e| panic!("{e:#}"));
    sb.wait_uplink_attached(Node::A, FOLLOW)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let index = sb.uplink_index(Node::A).expect("uplink index");
    wait_status_lists_uplink(&sb, index);
    for entry in nodeports(Node::A.ip()) {
        assert_remote_answers(&mut sb, &entry, Node::A.ip(), "uplink created after start");
    }

    // The address moves: the new one first, the Node manifest, then the
    // old one goes (the new one, a secondary of the same subnet, stays
    // only where secondaries are promoted).
    let promote = format!(
        "echo 1 > /proc/sys/net/ipv4/conf/{}/promote_secondaries",
        sb.uplink(Node::A)
    );
    sb.exec(&sb.node_ns(Node::A), &["sh", "-c", &promote])
        .unwrap_or_else(|e| panic!("{e:#}"));
    sb.add_uplink_addr(Node::A, NODE_A_NEW_IP)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let manifest = node_yaml(Node::A).replace(Node::A.ip(), NODE_A_NEW_IP);
    sb.write_manifest(&node_file(Node::A), &manifest)
        .expect("write node A's manifest");
    let sw = switchboard();
    sb.wait_services(
        Node::A,
        &sw,
        FOLLOW,
        "the NodePort on the new address",
        |f| {
            nodeports(NODE_A_NEW_IP)
                .iter()
                .all(|e| find_at(f, &e.address, e.port, e.proto.as_str()).is_some())
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    sb.del_uplink_addr(Node::A, Node::A.ip())
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_log(&sb, "uplink source-NAT address changed");
    for entry in nodeports(NODE_A_NEW_IP) {
        assert_remote_answers(&mut sb, &entry, NODE_A_NEW_IP, "uplink address changed");
    }
    assert!(sb.agent_running(Node::A), "{}", sb.agent_log(Node::A));
    wait_status_lists_uplink(&sb, index);
}

/// No `--uplink`: node A's uplink lacks the Node's address at start, so
/// the agent finds no uplink (and says so) but runs; once the address is
/// added the interface holding it is attached. Then the uplink is deleted
/// and created again: the new interface (another index) is attached, the
/// old one's link pins are removed, and `switchboard status` lists the new
/// one. NodePorts through A reach node B's pods after each change.
#[test]
fn a_found_uplink_follows_the_node_address_and_a_recreated_interface() {
    let mut sb = sandbox_with_remote_backends();
    sb.del_uplink_addr(Node::A, Node::A.ip())
        .unwrap_or_else(|e| panic!("{e:#}"));
    start_b_and_wait(&mut sb);
    sb.start_agent_finding_uplink(Node::A, &switchboard(), &[])
        .unwrap_or_else(|e| panic!("start agent A: {e:#}"));
    wait_programmed(&mut sb, Node::A, &Node::B.pods());
    wait_log(&sb, "no uplink found");
    assert!(sb.agent_running(Node::A), "{}", sb.agent_log(Node::A));

    sb.add_uplink_addr(Node::A, Node::A.ip())
        .unwrap_or_else(|e| panic!("{e:#}"));
    sb.wait_uplink_attached(Node::A, FOLLOW)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let old = sb.uplink_index(Node::A).expect("uplink index");
    wait_status_lists_uplink(&sb, old);
    for entry in nodeports(Node::A.ip()) {
        assert_remote_answers(&mut sb, &entry, Node::A.ip(), "address added after start");
    }

    sb.delete_uplink(Node::A)
        .unwrap_or_else(|e| panic!("{e:#}"));
    sb.recreate_uplink(Node::A)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let new = sb.uplink_index(Node::A).expect("uplink index");
    assert_ne!(old, new, "the re-created uplink kept its index");
    wait_status_lists_uplink(&sb, new);
    for entry in nodeports(Node::A.ip()) {
        assert_remote_answers(&mut sb, &entry, Node::A.ip(), "uplink re-created");
    }
    let links = sb.pin_dir(Node::A).join("links");
    let stale: Vec<String> = std::fs::read_dir(&links)
        .expect("read the link pins")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.split('_').nth(1) == Some(old.to_string().as_str()))
        .collect();
    assert!(
        stale.is_empty(),
        "pins of the deleted uplink (index {old}) left: {stale:?}"
    );
    assert!(sb.agent_running(Node::A), "{}", sb.agent_log(Node::A));
}
