//! The pod path's first tests (`proxy_common::prefilter`), through
//! BPF_PROG_TEST_RUN: the frontend bitmap follows the frontends the agent
//! writes and removes, and a pod interface's quiet mark lets `sb_to_pod`
//! skip packets of its class while its generation is current. A test run's skb is on the
//! loopback (interface 1), which stands for the pod interface here.
use std::net::Ipv4Addr;

use aya::maps::Array;
use proxy_common::{names, prefilter, prefilter::quiet, programs};
use proxy_testkit::packet::PacketSpec;
use proxy_user::{dataplane::flows::quiet_pods::QuietPods, model::Protocol};

use crate::support::{be32, capacities, cluster_ip, rewritten, Loaded, TC_ACT_OK, TC_ACT_UNSPEC};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const OTHER_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 7, 20);
const DNS_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 53);
const POD1: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const LOOPBACK: u32 = 1;

fn loaded() -> Loaded {
    Loaded::new(
        capacities(4096),
        vec![
            cluster_ip(VIP, 80, Protocol::Tcp, "web", &[(POD1, 8080)]),
            cluster_ip(OTHER_VIP, 80, Protocol::Tcp, "other", &[(POD1, 8080)]),
            cluster_ip(DNS_VIP, 53, Protocol::Udp, "dns", &[(POD1, 53)]),
        ],
    )
}

/// The bitmap's bit of `addr`, as the kernel holds it.
fn bit_set(fx: &Loaded, addr: Ipv4Addr) -> bool {
    let bit = prefilter::frontends::bit4(be32(addr), shift(fx));
    let (word, mask) = prefilter::frontends::word_and_mask(bit);
    fx.maps6.frontend_filter.get(&word, 0).expect("word") & mask != 0
}

/// How the loaded bitmap is indexed, from its size.
fn shift(fx: &Loaded) -> u32 {
    prefilter::frontends::shift_for(fx.maps6.frontend_filter.len())
}

/// The bitmap's bit of (`addr`, `port`, TCP), as the kernel holds it.
fn port_bit_set(fx: &Loaded, addr: Ipv4Addr, port: u16) -> bool {
    let shift = shift(fx);
    let addr_bit = prefilter::frontends::bit4(be32(addr), shift);
    let bit = prefilter::frontends::port_bit(addr_bit, port.to_be(), 6, shift);
    let (word, mask) = prefilter::frontends::word_and_mask(bit);
    fx.maps6.frontend_filter.get(&word, 0).expect("word") & mask != 0
}

/// The quiet marks and generations, taken out of the loaded object (the
/// programs keep them).
fn quiet(fx: &mut Loaded) -> QuietPods {
    let marks = fx.ebpf.take_map(names::QUIET_PODS).expect("marks");
    let gens = fx.ebpf.take_map(names::QUIET_GENS).expect("generations");
    QuietPods::new(
        Array::try_from(marks).expect("array"),
        Array::try_from(gens).expect("array"),
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

    // Rewritten twice (a new backend, then the first again), the frontend
    // is counted once: removing it clears its bits.
    for backend in [(POD1, 8081), (POD1, 8080)] {
        let report = fx.program(vec![cluster_ip(VIP, 80, Protocol::Tcp, "web", &[backend])]);
        assert!(report.failed.is_empty(), "{report:?}");
        assert!(bit_set(&fx, VIP));
    }
    let report = fx.program(Vec::new());
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(!bit_set(&fx, VIP), "the last frontend's bit is cleared");
    assert!(!port_bit_set(&fx, VIP, 80));
}

/// A reply of a tracked flow into its pod, translated (`true`) or passed
/// untouched because the interface's mark said the pod has no such flow.
fn translated(fx: &mut Loaded, reply: &PacketSpec, vip: Ipv4Addr, port: u16) -> bool {
    let (verdict, output) = fx.tc(programs::TC_TO_POD, &reply.build(), None);
    if verdict == TC_ACT_UNSPEC {
        assert_eq!(output, reply.build(), "a skipped packet is untouched");
        return false;
    }
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(
        output,
        rewritten(reply, |p| {
            p.src = vip;
            p.sport = port;
        })
    );
    true
}

/// The agent's contract with the data path: a mark made from a generation
/// read before the pod's flow was tracked never hides that flow's replies
/// (the collector reads generations, then the tables); one made at the
/// current generation does hide them, which is why it is made only after a
/// look at the tables finds no flow. Marks of the two classes (TCP, the
/// rest) are independent: a pod's DNS flow does not void its TCP mark.
#[test]
fn a_quiet_mark_holds_for_its_class_and_generation() {
    let mut fx = loaded();
    let mut marks = quiet(&mut fx);
    let request = PacketSpec::tcp(CLIENT, 61003, VIP, 80);
    let reply = PacketSpec {
        tcp_flags: 0x12,
        ..PacketSpec::tcp(POD1, 8080, CLIENT, 61003)
    };

    // A generation read, then the pod's first flow: the mark made from
    // that read is void, and the reply is translated.
    let before = marks.generation(LOOPBACK, quiet::TCP).expect("gen");
    assert_eq!(fx.run_from_pod(&request.build()).0, TC_ACT_OK);
    marks.mark(LOOPBACK, quiet::TCP, before).expect("mark");
    assert!(!marks.is_quiet(LOOPBACK, quiet::TCP).expect("read"));
    assert!(translated(&mut fx, &reply, VIP, 80));

    // A mark at the current generation holds: the reply passes unread.
    let now = marks.generation(LOOPBACK, quiet::TCP).expect("gen");
    assert_eq!(now, before + 1, "one flow, one generation");
    marks.mark(LOOPBACK, quiet::TCP, now).expect("mark");
    assert!(!translated(&mut fx, &reply, VIP, 80));

    // A UDP flow of the pod voids the other class's mark, not TCP's.
    marks.mark_unattached(LOOPBACK).expect("marks");
    let query = PacketSpec::udp(CLIENT, 61005, DNS_VIP, 53);
    assert_eq!(fx.run_from_pod(&query.build()).0, TC_ACT_OK);
    assert!(marks.is_quiet(LOOPBACK, quiet::TCP).expect("read"));
    assert!(!marks.is_quiet(LOOPBACK, quiet::OTHER).expect("read"));
    let answer = PacketSpec::udp(POD1, 53, CLIENT, 61005);
    assert!(translated(&mut fx, &answer, DNS_VIP, 53));
    assert!(!translated(&mut fx, &reply, VIP, 80));

    // A mark for another interface in the same slot is not this one's.
    let other = LOOPBACK + quiet::SLOTS;
    marks
        .mark(
            other,
            quiet::TCP,
            marks.generation(other, quiet::TCP).expect("gen"),
        )
        .expect("mark");
    assert!(translated(&mut fx, &reply, VIP, 80));
}
