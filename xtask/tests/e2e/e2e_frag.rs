//! Netns end-to-end tests of fragments and ICMP errors through a Service on
//! the tc path (root only; `cargo xtask test` passes SWITCHBOARD_BIN and
//! SB_ECHO_BIN). The client runs outside the sandbox's cgroup, so the socket
//! layer leaves its flows to the tc programs.
//!
//! - A 3000-byte UDP datagram to the ClusterIP leaves the client as three
//!   fragments and gets a 3000-byte answer, also fragmented, on a socket
//!   connected to the ClusterIP: an answer from the pod's own address would
//!   not be delivered to it.
//! - Path-MTU discovery through a Service: the node's links to the pods have
//!   an MTU of 1280, the client's 1500, and the pods advertise an MSS for
//!   1500. The client's first full-sized segments to the backend are too big
//!   to forward; the node answers "fragmentation needed" quoting the segment
//!   as translated (client → pod). Only once that quote is translated back
//!   (client → ClusterIP) does the client's kernel match it to its socket,
//!   learn the path MTU and resend smaller segments: the transfer completes
//!   instead of stalling.
use xtask::sandbox::{Attempt, CLUSTER_IP, PODS};
use xtask::testenv::{counters, demo_sandbox_with, fragmented_udp_args, sb_echo};

#[test]
fn a_fragmented_udp_datagram_to_the_clusterip_gets_a_fragmented_answer() {
    let sb = demo_sandbox_with(&[]);
    let addr = format!("{CLUSTER_IP}:53");
    let run = sb
        .client(&sb_echo(), &fragmented_udp_args(&addr))
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        run.all_ok(),
        "3000-byte datagrams through {addr}:\n{}",
        run.raw
    );
    assert_eq!(run.client_saw(), vec![addr.clone()], "{}", run.raw);
    assert!(run.attempts.iter().all(|a| matches!(a, Attempt::Ok { .. })));
    let counters = counters(&sb.pin_dir);
    // 10 datagrams, two later fragments each, both ways.
    assert!(
        counters["frag_translated"] >= 40,
        "later fragments translated: {counters:?}"
    );
}

#[test]
fn path_mtu_discovery_works_through_a_service() {
    let sb = demo_sandbox_with(&[]);
    for i in 1..=PODS {
        sb.exec(
            &sb.node_ns(),
            &["ip", "link", "set", &sb.pod_if(i), "mtu", "1280"],
        )
        .expect("set the MTU of a pod link");
    }
    let addr = format!("{CLUSTER_IP}:80");
    let run = sb
        .client(
            &sb_echo(),
            &["--tcp", &addr, "--tcp-size", "4000", "--timeout-ms", "5000"],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        run.all_ok(),
        "a 4000-byte request through {addr} with a 1280-byte MTU behind it:\n{}",
        run.raw
    );
    assert_eq!(run.client_saw(), vec![addr.clone()], "{}", run.raw);
    let route = sb
        .exec(&sb.client_ns(), &["ip", "route", "get", CLUSTER_IP])
        .expect("ip route get");
    let route = String::from_utf8_lossy(&route.stdout);
    assert!(
        route.contains("mtu 1280"),
        "the client learned the path MTU to the ClusterIP: {route}"
    );
    let counters = counters(&sb.pin_dir);
    assert!(
        counters["icmp_error_translated"] >= 1,
        "the node's fragmentation-needed was translated: {counters:?}"
    );
    // More connections now use the learned MTU from the start.
    let again = sb
        .client(
            &sb_echo(),
            &[
                "--tcp",
                &addr,
                "--tcp-size",
                "4000",
                "--count",
                "6",
                "--timeout-ms",
                "3000",
            ],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(again.all_ok(), "{}", again.raw);
}
