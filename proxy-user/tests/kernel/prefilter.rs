//! The pod path's first tests (`proxy_common::prefilter`), through
//! BPF_PROG_TEST_RUN: the frontend bitmap follows the frontends the agent
//! writes and removes, and a quiet pod interface is skipped by `sb_to_pod`
//! until its pod makes a translated flow. A test run's skb is on the
//! loopback (interface 1), which stands for the pod interface here.
use std::net::Ipv4Addr;

use aya::maps::Array;
use proxy_common::{names, prefilter, programs};
use proxy_testkit::packet::PacketSpec;
use proxy_user::{dataplane::prefilter::QuietPods, model::Protocol};

use crate::support::{be32, capacities, cluster_ip, rewritten, Loaded, TC_ACT_OK, TC_ACT_UNSPEC};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const OTHER_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 7, 20);
const POD1: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const LOOPBACK: u32 = 1;

fn loaded() -> Loaded {
    Loaded::new(
        capacities(4096),
        vec![
            cluster_ip(VIP, 80, Protocol::Tcp, "web", &[(POD1, 8080)]),
            cluster_ip(OTHER_VIP, 80, Protocol::Tcp, "other", &[(POD1, 8080)]),
        ],
    )
}

/// The bitmap's bit of `addr`, as the kernel holds it.
fn bit_set(fx: &Loaded, addr: Ipv4Addr) -> bool {
    let (word, mask) = prefilter::frontends::word_and_mask(prefilter::frontends::bit4(be32(addr)));
    fx.maps6.frontend_filter.get(&word, 0).expect("word") & mask != 0
}

/// The bitmap's bit of (`addr`, `port`, TCP), as the kernel holds it.
fn port_bit_set(fx: &Loaded, addr: Ipv4Addr, port: u16) -> bool {
    let addr_bit = prefilter::frontends::bit4(be32(addr));
    let bit = prefilter::frontends::port_bit(addr_bit, port.to_be(), 6);
    let (word, mask) = prefilter::frontends::word_and_mask(bit);
    fx.maps6.frontend_filter.get(&word, 0).expect("word") & mask != 0
}

fn quiet(fx: &mut Loaded) -> QuietPods<&mut aya::maps::MapData> {
    QuietPods::new(
        Array::try_from(fx.ebpf.map_mut(names::QUIET_PODS).expect("marks")).expect("array"),
    )
}

/// A frontend's address has its bit from the moment it is programmed; a
/// removed frontend's address loses it, and its packets pass untouched
/// without a lookup. Bits of frontends that stay are kept.
#[test]
fn the_frontend_bitmap_follows_the_frontends() {
    let mut fx = loaded();
    assert!(bit_set(&fx, VIP));
    assert!(bit_set(&fx, OTHER_VIP));
    // The (address, port, protocol) bits the uplink tests: set for the
    // frontends' ports, clear for another port of the same address.
    assert!(port_bit_set(&fx, VIP, 80));
    assert!(port_bit_set(&fx, OTHER_VIP, 80));
    assert!(!port_bit_set(&fx, VIP, 81));
    let request = PacketSpec::tcp(CLIENT, 61001, OTHER_VIP, 80);
    assert_eq!(fx.run_from_pod(&request.build()).0, TC_ACT_OK);

    let report = fx.program(vec![cluster_ip(
        VIP,
        80,
        Protocol::Tcp,
        "web",
        &[(POD1, 8080)],
    )]);
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(bit_set(&fx, VIP), "a frontend that stays keeps its bit");
    assert!(
        !bit_set(&fx, OTHER_VIP),
        "a removed frontend's bit is cleared"
    );
    assert!(port_bit_set(&fx, VIP, 80));
    assert!(
        !port_bit_set(&fx, OTHER_VIP, 80),
        "a removed frontend's port bit is cleared"
    );
    let later = PacketSpec::tcp(CLIENT, 61002, OTHER_VIP, 80).build();
    assert_eq!(fx.run_from_pod(&later), (TC_ACT_UNSPEC, later.clone()));
}

/// A quiet pod interface: a reply of a tracked flow arriving there is not
/// looked up (the mark says the pod has none); once the pod makes a flow
/// through a frontend, the mark is gone and its replies are translated.
#[test]
fn a_quiet_pod_is_skipped_until_it_makes_a_translated_flow() {
    let mut fx = loaded();
    let request = PacketSpec::tcp(CLIENT, 61003, VIP, 80);
    let reply = PacketSpec {
        tcp_flags: 0x12,
        ..PacketSpec::tcp(POD1, 8080, CLIENT, 61003)
    };

    // Marked quiet: even a packet that matches nothing is passed unread.
    quiet(&mut fx).mark(LOOPBACK).expect("mark");
    let stray = PacketSpec::tcp(POD1, 8080, CLIENT, 61004).build();
    assert_eq!(
        fx.tc(programs::TC_TO_POD, &stray, None),
        (TC_ACT_UNSPEC, stray)
    );

    // The pod's first flow through a frontend takes the mark away...
    assert_eq!(fx.run_from_pod(&request.build()).0, TC_ACT_OK);
    let marks: Array<_, u32> =
        Array::try_from(fx.ebpf.map(names::QUIET_PODS).expect("marks")).expect("array");
    assert_eq!(
        marks
            .get(&prefilter::quiet::slot(LOOPBACK), 0)
            .expect("slot"),
        0
    );

    // ...so its reply is translated.
    let (verdict, output) = fx.tc(programs::TC_TO_POD, &reply.build(), None);
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(
        output,
        rewritten(&reply, |p| {
            p.src = VIP;
            p.sport = 80;
        })
    );

    // A mark for another interface in the same slot is not this one's.
    let other = LOOPBACK + prefilter::quiet::SLOTS;
    quiet(&mut fx).mark(other).expect("mark");
    assert_eq!(
        fx.tc(programs::TC_TO_POD, &reply.build(), None).0,
        TC_ACT_OK
    );
}
