//! Packet fixtures (BPF_PROG_TEST_RUN) for two kube-proxy behaviours:
//!
//! - reject: a TCP or UDP packet to a frontend without endpoints is turned
//!   into an ICMP port unreachable from the frontend address, sent back out
//!   of the interface it came in on (tc: `TC_ACT_REDIRECT`; XDP: `XDP_TX`);
//!   never for an ICMP packet, a later fragment, or a packet with IP options
//!   (dropped), and never under `internalTrafficPolicy: Local` (dropped);
//! - hairpin: a pod given itself as the backend of its Service gets the
//!   packet from 169.254.42.1 (its own port kept), and its reply to that
//!   address is turned back into one from the frontend; both are sent back
//!   into the pod (`TC_ACT_REDIRECT`, Ethernet addresses swapped).
//!
//! Every output frame is compared byte for byte with one built from scratch
//! (checksums included). Needs root (CAP_BPF).
use std::net::Ipv4Addr;

use crate::support::{
    be32, capacities, frontend, Case, Hook, Loaded, TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC,
    XDP_DROP, XDP_TX,
};
use proxy_common::{ct_dir, ct_flags, hairpin, programs, proto, CtKey};
use proxy_testkit::packet::{
    checksums_valid, icmp_checksums_valid, icmp_port_unreachable, PacketSpec,
};
use proxy_user::model::{FrontendKind, Protocol};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 99);
const LOCAL_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 98);
const POD1: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 100);
const NODE_PORT: u16 = 30080;
const HAIRPIN: Ipv4Addr = Ipv4Addr::new(
    hairpin::ADDR[0],
    hairpin::ADDR[1],
    hairpin::ADDR[2],
    hairpin::ADDR[3],
);

fn fixture() -> Loaded {
    let mut local = frontend(
        FrontendKind::ClusterIp,
        LOCAL_VIP,
        80,
        Protocol::Tcp,
        "local",
        &[],
    );
    local.local_only = true;
    let frontends = vec![
        frontend(
            FrontendKind::ClusterIp,
            EMPTY_VIP,
            80,
            Protocol::Tcp,
            "empty",
            &[],
        ),
        frontend(
            FrontendKind::ClusterIp,
            EMPTY_VIP,
            53,
            Protocol::Udp,
            "empty-dns",
            &[],
        ),
        local,
        frontend(
            FrontendKind::NodePort,
            NODE,
            NODE_PORT,
            Protocol::Tcp,
            "np",
            &[],
        ),
        frontend(
            FrontendKind::NodePort,
            NODE,
            NODE_PORT,
            Protocol::Udp,
            "np-udp",
            &[],
        ),
        frontend(
            FrontendKind::ClusterIp,
            VIP,
            80,
            Protocol::Tcp,
            "web",
            &[(POD1, 8080)],
        ),
        frontend(
            FrontendKind::ClusterIp,
            VIP,
            53,
            Protocol::Udp,
            "dns",
            &[(POD1, 5353)],
        ),
    ];
    Loaded::new(capacities(4096), frontends)
}

/// The packets of Service `test/service` dropped for want of a backend.
fn drops_no_backend(fx: &Loaded, service: &str) -> u64 {
    fx.service_row(service).drops_no_backend
}

/// A TCP SYN with a payload long enough that the answer must shrink it, and
/// TOS set (the answer keeps it).
fn long_syn(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut spec = PacketSpec::tcp(src, sport, dst, dport);
    spec.payload = vec![0xab; 300];
    let mut frame = spec.build();
    // TOS 0x10, IPv4 checksum adjusted from scratch.
    frame[15] = 0x10;
    frame[24..26].fill(0);
    let csum = proxy_testkit::packet::checksum(&frame[14..34], 0);
    frame[24..26].copy_from_slice(&csum.to_be_bytes());
    frame
}

/// An ICMP answer's checksums hold (whatever else the program left).
fn icmp_answer_checksums(_: &Case, _: u32, output: &[u8]) -> bool {
    output.get(23) != Some(&1) || icmp_checksums_valid(output)
}

#[test]
fn the_builder_quotes_the_original_and_checksums_verify() {
    let syn = PacketSpec::tcp(CLIENT, 40000, EMPTY_VIP, 80).build();
    let icmp = icmp_port_unreachable(&syn);
    assert_eq!(icmp.len(), 14 + 20 + 8 + 28);
    assert!(icmp_checksums_valid(&icmp));
    assert_eq!(&icmp[0..6], &syn[6..12]);
    assert_eq!(&icmp[6..12], &syn[0..6]);
    assert_eq!(&icmp[26..30], &EMPTY_VIP.octets());
    assert_eq!(&icmp[30..34], &CLIENT.octets());
    assert_eq!((icmp[34], icmp[35]), (3, 3));
    assert_eq!(&icmp[42..], &syn[14..42]);
}

#[test]
fn pods_packets_to_a_frontend_without_endpoints_are_rejected_with_icmp() {
    let mut fx = fixture();
    let syn = PacketSpec::tcp(CLIENT, 40000, EMPTY_VIP, 80).build();
    let udp = PacketSpec::udp(CLIENT, 40001, EMPTY_VIP, 53).build();
    let long = long_syn(CLIENT, 40002, EMPTY_VIP, 80);
    let icmp_in = PacketSpec {
        proto: 1,
        payload: vec![8, 0, 0xf7, 0xff, 0, 0, 0, 0],
        ..PacketSpec::tcp(CLIENT, 0, EMPTY_VIP, 0)
    }
    .build();
    // An ICMP error as a client would send it (port unreachable about a UDP
    // datagram to the frontend): never answered.
    let icmp_error = icmp_port_unreachable(&PacketSpec::udp(EMPTY_VIP, 53, CLIENT, 40009).build());
    let options = PacketSpec {
        ip_option_words: 2,
        ..PacketSpec::tcp(CLIENT, 40003, EMPTY_VIP, 80)
    }
    .build();
    let later_fragment = PacketSpec {
        frag_off: 0x0010,
        ..PacketSpec::udp(CLIENT, 40004, EMPTY_VIP, 53)
    }
    .build();
    let local_only = PacketSpec::tcp(CLIENT, 40005, LOCAL_VIP, 80).build();
    let cases = [
        Case {
            hook: Hook::Tc(programs::TC_FROM_POD),
            name: "TCP SYN to an empty ClusterIP: port unreachable back into the pod".into(),
            output: icmp_port_unreachable(&syn),
            input: syn,
            verdict: TC_ACT_REDIRECT,
        },
        Case {
            hook: Hook::Tc(programs::TC_FROM_POD),
            name: "UDP to an empty ClusterIP: port unreachable (frame grown to 70 bytes)".into(),
            output: icmp_port_unreachable(&udp),
            input: udp,
            verdict: TC_ACT_REDIRECT,
        },
        Case {
            hook: Hook::Tc(programs::TC_FROM_POD),
            name: "a long segment is cut to the answer, TOS kept".into(),
            output: icmp_port_unreachable(&long),
            input: long,
            verdict: TC_ACT_REDIRECT,
        },
        Case {
            hook: Hook::Tc(programs::TC_FROM_POD),
            name: "ICMP to the frontend is not ours".into(),
            output: icmp_in.clone(),
            input: icmp_in,
            verdict: TC_ACT_UNSPEC,
        },
        Case {
            hook: Hook::Tc(programs::TC_FROM_POD),
            name: "IP options: dropped, not answered".into(),
            output: options.clone(),
            input: options,
            verdict: TC_ACT_SHOT,
        },
        Case {
            hook: Hook::Tc(programs::TC_FROM_POD),
            name: "internalTrafficPolicy Local without endpoints: dropped".into(),
            output: local_only.clone(),
            input: local_only,
            verdict: TC_ACT_SHOT,
        },
    ];
    fx.run_table(&cases, icmp_answer_checksums);
    assert_eq!(fx.stat("rejected"), 3);
    assert_eq!(fx.stat("drop_no_backend"), 2);
    assert_eq!(drops_no_backend(&fx, "empty"), 3);
    assert_eq!(drops_no_backend(&fx, "empty-dns"), 1);
    assert_eq!(drops_no_backend(&fx, "local"), 1);
    // Nothing was tracked for a rejected packet.
    assert_eq!(fx.syncer.store().conntrack_len(), 0);

    // Never an ICMP answer to an ICMP error or a later fragment (whatever
    // else the fragment path does with them).
    for (what, frame) in [
        ("ICMP error", icmp_error),
        ("later fragment", later_fragment),
    ] {
        let (_, out) = fx.tc(programs::TC_FROM_POD, &frame, None);
        assert_ne!(
            out,
            icmp_port_unreachable(&frame),
            "{what}: answered with ICMP"
        );
    }
    assert_eq!(fx.stat("rejected"), 3);
}

#[test]
fn outside_packets_to_an_empty_node_port_are_rejected_by_xdp_and_tc() {
    let mut fx = fixture();
    let syn = PacketSpec::tcp(OUTSIDE, 40000, NODE, NODE_PORT).build();
    let udp = PacketSpec::udp(OUTSIDE, 40001, NODE, NODE_PORT).build();
    let long = long_syn(OUTSIDE, 40002, NODE, NODE_PORT);
    let options = PacketSpec {
        ip_option_words: 1,
        ..PacketSpec::udp(OUTSIDE, 40003, NODE, NODE_PORT)
    }
    .build();
    let cases = |hook: Hook, verdict: u32, dropped: u32| {
        vec![
            Case {
                hook,
                name: "TCP SYN to an empty NodePort".into(),
                output: icmp_port_unreachable(&syn),
                input: syn.clone(),
                verdict,
            },
            Case {
                hook,
                name: "UDP to an empty NodePort".into(),
                output: icmp_port_unreachable(&udp),
                input: udp.clone(),
                verdict,
            },
            Case {
                hook,
                name: "a long segment is cut to the answer".into(),
                output: icmp_port_unreachable(&long),
                input: long.clone(),
                verdict,
            },
            Case {
                hook,
                name: "IP options: dropped".into(),
                output: options.clone(),
                input: options.clone(),
                verdict: dropped,
            },
        ]
    };
    fx.run_table(&cases(Hook::Xdp, XDP_TX, XDP_DROP), icmp_answer_checksums);
    assert_eq!((fx.stat("rejected"), fx.stat("drop_no_backend")), (3, 1));
    fx.run_table(
        &cases(
            Hook::Tc(programs::TC_FROM_UPLINK),
            TC_ACT_REDIRECT,
            TC_ACT_SHOT,
        ),
        icmp_answer_checksums,
    );
    assert_eq!((fx.stat("rejected"), fx.stat("drop_no_backend")), (6, 2));
    assert_eq!(
        drops_no_backend(&fx, "np") + drops_no_backend(&fx, "np-udp"),
        8
    );
}

#[test]
fn a_pod_reaching_itself_through_its_service_is_hairpinned_via_169_254_42_1() {
    let mut fx = fixture();
    let swap_macs = |mut f: Vec<u8>| {
        let (dst, src) = (f[0..6].to_vec(), f[6..12].to_vec());
        f[0..6].copy_from_slice(&src);
        f[6..12].copy_from_slice(&dst);
        f
    };
    for (protocol, vip_port, pod_port, sport) in [
        (Protocol::Tcp, 80u16, 8080u16, 45000u16),
        (Protocol::Udp, 53, 5353, 45001),
    ] {
        let spec = |src, sport, dst, dport| match protocol {
            Protocol::Tcp => PacketSpec::tcp(src, sport, dst, dport),
            Protocol::Udp => PacketSpec::udp(src, sport, dst, dport),
        };
        let l4 = match protocol {
            Protocol::Tcp => proto::TCP,
            Protocol::Udp => proto::UDP,
        };
        let request = spec(POD1, sport, VIP, vip_port);
        let mut reply = spec(POD1, pod_port, HAIRPIN, sport);
        reply.tcp_flags = 0x12;

        // Nothing tracked yet: a packet to the hairpin address is not ours.
        let (verdict, out) = fx.tc(programs::TC_FROM_POD, &reply.build(), None);
        assert_eq!(
            (verdict, &out),
            (TC_ACT_UNSPEC, &reply.build()),
            "{protocol:?}"
        );

        let (verdict, out) = fx.tc(programs::TC_FROM_POD, &request.build(), None);
        let mut want = request.clone();
        want.src = HAIRPIN;
        want.dst = POD1;
        want.dport = pod_port;
        assert_eq!(verdict, TC_ACT_REDIRECT, "{protocol:?}: request");
        assert_eq!(
            out,
            swap_macs(want.build()),
            "{protocol:?}: request rewritten"
        );
        assert!(checksums_valid(&out));

        let (verdict, out) = fx.tc(programs::TC_FROM_POD, &reply.build(), None);
        let mut want = reply.clone();
        want.src = VIP;
        want.sport = vip_port;
        want.dst = POD1;
        assert_eq!(verdict, TC_ACT_REDIRECT, "{protocol:?}: reply");
        assert_eq!(out, swap_macs(want.build()), "{protocol:?}: reply reversed");
        assert!(checksums_valid(&out));

        // The entries use the source-NAT encoding.
        let fwd = fx
            .ct(&CtKey {
                saddr_be: be32(POD1),
                daddr_be: be32(VIP),
                sport_be: sport.to_be(),
                dport_be: vip_port.to_be(),
                proto: l4,
                dir: ct_dir::FORWARD,
                _pad: [0; 2],
            })
            .expect("forward entry");
        assert_eq!(fwd.flags & ct_flags::SNAT, ct_flags::SNAT);
        assert_eq!(
            (
                fwd.nat_addr_be,
                fwd.nat_port_be,
                fwd.snat_addr_be,
                fwd.snat_port_be
            ),
            (
                be32(POD1),
                pod_port.to_be(),
                hairpin::ADDR_BE,
                sport.to_be()
            )
        );
        let rev = fx
            .ct(&CtKey {
                saddr_be: be32(POD1),
                daddr_be: hairpin::ADDR_BE,
                sport_be: pod_port.to_be(),
                dport_be: sport.to_be(),
                proto: l4,
                dir: ct_dir::REPLY,
                _pad: [0; 2],
            })
            .expect("reply entry");
        assert_eq!(
            (
                rev.nat_addr_be,
                rev.nat_port_be,
                rev.snat_addr_be,
                rev.snat_port_be
            ),
            (be32(VIP), vip_port.to_be(), be32(POD1), sport.to_be())
        );
        // A second packet of the flow is hairpinned the same way.
        let (verdict, out) = fx.tc(programs::TC_FROM_POD, &request.build(), None);
        assert_eq!(verdict, TC_ACT_REDIRECT);
        assert_eq!(&out[26..30], &HAIRPIN.octets());
    }
    // Another client of the same Service is DNATed as usual (no hairpin).
    let (verdict, out) = fx.tc(
        programs::TC_FROM_POD,
        &PacketSpec::tcp(POD2, 46000, VIP, 80).build(),
        None,
    );
    assert_eq!(verdict, 0);
    assert_eq!(&out[26..30], &POD2.octets());
    assert_eq!(fx.stat("forwarded"), 5);
    assert_eq!(fx.stat("reversed"), 2);
}
