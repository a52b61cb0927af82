//! IPv6 packet fixtures on the tc pod path through BPF_PROG_TEST_RUN: each
//! case feeds a frame to `sb_from_pod` or `sb_to_pod` and checks the verdict
//! and the exact output frame; translated frames must also carry valid
//! TCP/UDP/ICMPv6 checksums, computed here over the IPv6 pseudo-header. The
//! IPv6 maps are written directly. Needs root (CAP_BPF).
use std::net::Ipv6Addr;

use crate::support::{
    capacities, hex, translated_checksums, truncated,
    v6::{
        checksums_valid6, ct_key6, icmp6_frame, icmp6_frame_macs, Packet6, NEXTHDR_DEST,
        NEXTHDR_HOP, NEXTHDR_ROUTING, NODE_MAC, POD_MAC, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_RST,
        TCP_SYN,
    },
    with, Case, Hook, Loaded, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC,
};
use proxy_common::{ct_dir, ct_flags, hairpin, programs};
use proxy_user::dataplane::kctx::Access;

const CLIENT: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0x100, 0, 0, 0, 0, 2);
const VIP: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
const AFFINITY_VIP: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x20);
const EMPTY_VIP: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x99);
const POD1: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 2);
const POD2: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 2);
const ROUTER: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0xff, 0, 0, 0, 0, 1);

/// Service ids of the IPv6 frontends (ids are shared with IPv4; no IPv4
/// frontend is loaded here).
const SVC_WEB: u32 = 10;
const SVC_DNS: u32 = 11;
const SVC_EMPTY_TCP: u32 = 12;
const SVC_EMPTY_UDP: u32 = 13;
const SVC_STICKY: u32 = 14;
const SVC_SELF: u32 = 15;

/// One backend per frontend (every rewrite predictable), two frontends
/// without endpoints, one with affinity over two backends, and one whose
/// backend is the client pod itself (hairpin).
fn fixture() -> Loaded {
    fixture_as(&Access::detect())
}

/// [`fixture`] with the checksum state read as `access` says.
fn fixture_as(access: &Access) -> Loaded {
    let mut fx = Loaded::new_as(capacities(4096), Vec::new(), access);
    let maps = &mut fx.maps6;
    maps.frontend(VIP, 80, PROTO_TCP, SVC_WEB, None, &[(901, POD1, 8080)]);
    maps.frontend(VIP, 53, PROTO_UDP, SVC_DNS, None, &[(902, POD1, 5353)]);
    maps.frontend(EMPTY_VIP, 80, PROTO_TCP, SVC_EMPTY_TCP, None, &[]);
    maps.frontend(EMPTY_VIP, 53, PROTO_UDP, SVC_EMPTY_UDP, None, &[]);
    maps.frontend(
        AFFINITY_VIP,
        80,
        PROTO_TCP,
        SVC_STICKY,
        Some(600),
        &[(903, POD1, 8080), (904, POD2, 8080)],
    );
    maps.frontend(VIP, 9090, PROTO_TCP, SVC_SELF, None, &[(905, CLIENT, 9191)]);
    fx
}

#[test]
fn requests_replies_and_packets_that_are_not_ours() {
    requests_replies_and_not_ours(&Access::detect());
}

/// The same fixtures, the same packets out, with every L4 checksum update
/// through `bpf_l4_csum_replace`, as on a kernel without the kfunc.
#[test]
fn requests_replies_and_packets_that_are_not_ours_through_the_checksum_helper() {
    requests_replies_and_not_ours(&Access::Helper);
}

fn requests_replies_and_not_ours(access: &Access) {
    let mut fx = fixture_as(access);
    let syn = Packet6::tcp(CLIENT, 40000, VIP, 80);
    let syn_ack = Packet6 {
        tcp_flags: TCP_SYN | TCP_ACK,
        ack: syn.seq + 1,
        ..Packet6::tcp(POD1, 8080, CLIENT, 40000)
    };
    let udp = Packet6::udp(CLIENT, 40001, VIP, 53);
    let udp_reply = Packet6::udp(POD1, 5353, CLIENT, 40001);
    let udp_zero = Packet6 {
        udp_zero_checksum: true,
        ..Packet6::udp(CLIENT, 40002, VIP, 53)
    };
    let ext = Packet6 {
        ext: vec![NEXTHDR_HOP, NEXTHDR_DEST],
        ..Packet6::tcp(CLIENT, 40003, VIP, 80)
    };
    let four_ext = Packet6 {
        ext: vec![NEXTHDR_HOP, NEXTHDR_DEST, NEXTHDR_ROUTING, NEXTHDR_DEST],
        ..Packet6::udp(CLIENT, 40004, VIP, 53)
    };
    let five_ext = Packet6 {
        ext: vec![
            NEXTHDR_HOP,
            NEXTHDR_DEST,
            NEXTHDR_ROUTING,
            NEXTHDR_DEST,
            NEXTHDR_DEST,
        ],
        ..Packet6::tcp(CLIENT, 40005, VIP, 80)
    };
    // Authentication header (51) before TCP: not ours.
    let mut ah = Packet6::tcp(CLIENT, 40006, VIP, 80).build();
    ah[20] = 51;
    let other_host = Packet6::tcp(CLIENT, 40007, POD2, 8080);
    let other_port = Packet6::tcp(CLIENT, 40008, VIP, 443);
    let cut_tcp = truncated(Packet6::tcp(CLIENT, 40009, VIP, 80).build(), 14 + 40 + 10);
    let cut_ext = truncated(
        Packet6 {
            ext: vec![NEXTHDR_HOP],
            ..Packet6::tcp(CLIENT, 40010, VIP, 80)
        }
        .build(),
        14 + 40 + 4,
    );
    // Payload length shorter than the TCP header it is followed by.
    let mut short_payload = Packet6::tcp(CLIENT, 40011, VIP, 80).build();
    short_payload[18..20].copy_from_slice(&12u16.to_be_bytes());
    // Neighbour solicitation and advertisement for the frontend address,
    // router solicitation, echo request to it.
    let ns = icmp6_frame(CLIENT, VIP, 135, 0, 0, &VIP.octets());
    let na = icmp6_frame(POD1, CLIENT, 136, 0, 0x6000_0000, &POD1.octets());
    let rs = icmp6_frame(CLIENT, VIP, 133, 0, 0, &[]);
    let echo = icmp6_frame(CLIENT, VIP, 128, 0, 0x0001_0001, b"ping");
    let echo_reply = icmp6_frame(POD1, CLIENT, 129, 0, 0x0001_0001, b"ping");
    // Before any request: a reply of nothing tracked.
    let stray_reply = Packet6::tcp(POD1, 8080, CLIENT, 49999);

    let cases = vec![
        Case {
            name: "TCP SYN to the IPv6 ClusterIP is DNATed to the backend".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: syn.build(),
            verdict: TC_ACT_OK,
            output: with(&syn, |p| {
                p.dst = POD1;
                p.dport = 8080;
            })
            .build(),
        },
        Case {
            name: "the backend's SYN-ACK is reversed to the frontend".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: syn_ack.build(),
            verdict: TC_ACT_OK,
            output: with(&syn_ack, |p| {
                p.src = VIP;
                p.sport = 80;
            })
            .build(),
        },
        Case {
            name: "UDP to the IPv6 ClusterIP is DNATed with its checksum fixed".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: udp.build(),
            verdict: TC_ACT_OK,
            output: with(&udp, |p| {
                p.dst = POD1;
                p.dport = 5353;
            })
            .build(),
        },
        Case {
            name: "the UDP reply is reversed".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: udp_reply.build(),
            verdict: TC_ACT_OK,
            output: with(&udp_reply, |p| {
                p.src = VIP;
                p.sport = 53;
            })
            .build(),
        },
        Case {
            name: "UDP with checksum 0 is DNATed and its checksum stays 0".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: udp_zero.build(),
            verdict: TC_ACT_OK,
            output: with(&udp_zero, |p| {
                p.dst = POD1;
                p.dport = 5353;
            })
            .build(),
        },
        Case {
            name: "hop-by-hop and destination options before TCP: still translated".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: ext.build(),
            verdict: TC_ACT_OK,
            output: with(&ext, |p| {
                p.dst = POD1;
                p.dport = 8080;
            })
            .build(),
        },
        Case {
            name: "four extension headers (the bound) before UDP: translated".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: four_ext.build(),
            verdict: TC_ACT_OK,
            output: with(&four_ext, |p| {
                p.dst = POD1;
                p.dport = 5353;
            })
            .build(),
        },
        Case {
            name: "five extension headers: more than the bound, untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: five_ext.build(),
            verdict: TC_ACT_UNSPEC,
            output: five_ext.build(),
        },
        Case {
            name: "an authentication header: untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: ah.clone(),
            verdict: TC_ACT_UNSPEC,
            output: ah,
        },
        Case {
            name: "traffic to a pod address is not ours".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: other_host.build(),
            verdict: TC_ACT_UNSPEC,
            output: other_host.build(),
        },
        Case {
            name: "a port the Service does not have is not ours".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: other_port.build(),
            verdict: TC_ACT_UNSPEC,
            output: other_port.build(),
        },
        Case {
            name: "truncated TCP header: untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: cut_tcp.clone(),
            verdict: TC_ACT_UNSPEC,
            output: cut_tcp,
        },
        Case {
            name: "truncated extension header: untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: cut_ext.clone(),
            verdict: TC_ACT_UNSPEC,
            output: cut_ext,
        },
        Case {
            name: "payload length shorter than the TCP header: untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: short_payload.clone(),
            verdict: TC_ACT_UNSPEC,
            output: short_payload,
        },
        Case {
            name: "neighbour solicitation for the frontend: untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: ns.clone(),
            verdict: TC_ACT_UNSPEC,
            output: ns,
        },
        Case {
            name: "neighbour advertisement into the pod: untouched".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: na.clone(),
            verdict: TC_ACT_UNSPEC,
            output: na,
        },
        Case {
            name: "router solicitation: untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: rs.clone(),
            verdict: TC_ACT_UNSPEC,
            output: rs,
        },
        Case {
            name: "echo request to the frontend: untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: echo.clone(),
            verdict: TC_ACT_UNSPEC,
            output: echo,
        },
        Case {
            name: "echo reply into the pod: untouched".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: echo_reply.clone(),
            verdict: TC_ACT_UNSPEC,
            output: echo_reply,
        },
        Case {
            name: "a reply of no tracked flow is not ours".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: stray_reply.build(),
            verdict: TC_ACT_UNSPEC,
            output: stray_reply.build(),
        },
    ];
    fx.run_table(&cases, translated_checksums::<Ipv6Addr>);

    // The flow's two entries, as for IPv4.
    let fwd = fx
        .maps6
        .ct(&ct_key6(CLIENT, 40000, VIP, 80, PROTO_TCP, ct_dir::FORWARD))
        .expect("forward entry");
    assert_eq!((fwd.backend_id, fwd.service_id), (901, SVC_WEB));
    assert_eq!(fwd.nat_addr_be, proxy_common::addr6_be(POD1.octets()));
    let reply = fx
        .maps6
        .ct(&ct_key6(
            POD1,
            8080,
            CLIENT,
            40000,
            PROTO_TCP,
            ct_dir::REPLY,
        ))
        .expect("reply entry");
    assert_eq!(reply.nat_addr_be, proxy_common::addr6_be(VIP.octets()));
    assert_eq!(u16::from_be(reply.nat_port_be), 80);
    assert_ne!(reply.state & proxy_common::ct_state::REPLIED, 0);

    assert_eq!(fx.stat("forwarded"), 5);
    assert_eq!(fx.stat("reversed"), 2);
    assert_eq!(fx.stat("malformed"), 3, "the three truncated frames");
    assert_eq!(fx.service_packets(SVC_WEB), (2, 2, 0));
    assert_eq!(fx.service_packets(SVC_DNS), (3, 3, 0));
}

#[test]
fn fin_marks_both_entries_closing_and_a_new_syn_is_a_new_flow() {
    let mut fx = fixture();
    let syn = Packet6::tcp(CLIENT, 42000, VIP, 80);
    assert_eq!(fx.run(programs::TC_FROM_POD, &syn.build()).0, TC_ACT_OK);
    let fin = Packet6 {
        tcp_flags: 0x11,
        ..syn.clone()
    };
    assert_eq!(fx.run(programs::TC_FROM_POD, &fin.build()).0, TC_ACT_OK);
    let fwd = fx
        .maps6
        .ct(&ct_key6(CLIENT, 42000, VIP, 80, PROTO_TCP, ct_dir::FORWARD))
        .expect("forward entry");
    let reply = fx
        .maps6
        .ct(&ct_key6(
            POD1,
            8080,
            CLIENT,
            42000,
            PROTO_TCP,
            ct_dir::REPLY,
        ))
        .expect("reply entry");
    assert_ne!(fwd.flags & ct_flags::CLOSING, 0);
    assert_ne!(reply.flags & ct_flags::CLOSING, 0);
    // A SYN-ACK on the closed flow's ports passes untouched, its entry gone.
    let syn_ack = Packet6 {
        tcp_flags: TCP_SYN | TCP_ACK,
        ..Packet6::tcp(POD1, 8080, CLIENT, 42000)
    };
    assert_eq!(
        fx.run(programs::TC_TO_POD, &syn_ack.build()),
        (TC_ACT_UNSPEC, syn_ack.build())
    );
    assert_eq!(fx.stat("ct_stale"), 1);
}

#[test]
fn session_affinity_keeps_a_client_on_one_backend() {
    let mut fx = fixture();
    let mut seen = std::collections::BTreeSet::new();
    for port in 0..16 {
        let syn = Packet6::tcp(CLIENT, 43000 + port, AFFINITY_VIP, 80);
        let (verdict, out) = fx.run(programs::TC_FROM_POD, &syn.build());
        assert_eq!(verdict, TC_ACT_OK);
        assert!(checksums_valid6(&out, false));
        let p = crate::support::v6::parse6(&out).expect("IPv6 out");
        seen.insert(p.dst);
    }
    assert_eq!(seen.len(), 1, "one backend for one client: {seen:?}");
    assert!(seen.iter().all(|a| *a == POD1 || *a == POD2));
    assert_eq!(fx.stat("affinity_hit"), 15);
    // Another client may land anywhere, but also sticks.
    let other = Ipv6Addr::new(0xfd00, 0x244, 0x100, 0, 0, 0, 0, 3);
    let mut seen = std::collections::BTreeSet::new();
    for port in 0..8 {
        let (_, out) = fx.run(
            programs::TC_FROM_POD,
            &Packet6::tcp(other, 44000 + port, AFFINITY_VIP, 80).build(),
        );
        seen.insert(crate::support::v6::parse6(&out).expect("IPv6 out").dst);
    }
    assert_eq!(seen.len(), 1);
}

#[test]
fn fragments_follow_their_first_fragment() {
    let mut fx = fixture();
    let datagram = Packet6 {
        payload: (0..100u8).collect(),
        ..Packet6::udp(CLIENT, 45000, VIP, 53)
    };
    let translated = with(&datagram, |p| {
        p.dst = POD1;
        p.dport = 5353;
    });
    let id = 0x1234_5678;
    let inputs = datagram.fragments(48, id);
    let expected = translated.fragments(48, id);
    assert_eq!(inputs.len(), 3);
    for (i, (input, want)) in inputs.iter().zip(&expected).enumerate() {
        let (verdict, out) = fx.run(programs::TC_FROM_POD, input);
        assert_eq!((verdict, hex(&out)), (TC_ACT_OK, hex(want)), "fragment {i}");
    }
    assert_eq!(fx.stat("frag_translated"), 2);
    // The reassembled datagram's checksum is valid for the backend.
    let whole = translated.build();
    assert!(checksums_valid6(&whole, false));

    // The reply, fragmented too, is reversed fragment by fragment.
    let reply = Packet6 {
        payload: (0..100u8).rev().collect(),
        ..Packet6::udp(POD1, 5353, CLIENT, 45000)
    };
    let reversed = with(&reply, |p| {
        p.src = VIP;
        p.sport = 53;
    });
    for (i, (input, want)) in reply
        .fragments(48, 7)
        .iter()
        .zip(&reversed.fragments(48, 7))
        .enumerate()
    {
        let (verdict, out) = fx.run(programs::TC_TO_POD, input);
        assert_eq!(
            (verdict, hex(&out)),
            (TC_ACT_OK, hex(want)),
            "reply fragment {i}"
        );
    }
    assert_eq!(fx.stat("frag_translated"), 4);

    // A later fragment of a datagram nobody translated: untouched.
    let other = Packet6 {
        payload: vec![1; 100],
        ..Packet6::udp(CLIENT, 45001, POD2, 53)
    };
    let later = other.fragments(48, 99).remove(1);
    assert_eq!(
        fx.run(programs::TC_FROM_POD, &later),
        (TC_ACT_UNSPEC, later.clone())
    );
    assert_eq!(fx.stat("frag_unknown"), 1);
}

#[test]
fn a_pod_that_is_its_own_backend_is_reached_from_the_hairpin_address() {
    let mut fx = fixture();
    let hairpin_addr = Ipv6Addr::from(hairpin::ADDR6);
    let syn = Packet6::tcp(CLIENT, 46000, VIP, 9090);
    let (verdict, out) = fx.run(programs::TC_FROM_POD, &syn.build());
    let want = with(&syn, |p| {
        p.src = hairpin_addr;
        p.dst = CLIENT;
        p.dport = 9191;
        p.src_mac = NODE_MAC;
        p.dst_mac = POD_MAC;
    });
    assert_eq!((verdict, hex(&out)), (TC_ACT_REDIRECT, hex(&want.build())));
    assert!(checksums_valid6(&out, false));

    // The pod answers the hairpin address; the answer goes back in from the
    // frontend.
    let answer = Packet6 {
        tcp_flags: TCP_SYN | TCP_ACK,
        ..Packet6::tcp(CLIENT, 9191, hairpin_addr, 46000)
    };
    let (verdict, out) = fx.run(programs::TC_FROM_POD, &answer.build());
    let want = with(&answer, |p| {
        p.src = VIP;
        p.sport = 9090;
        p.dst = CLIENT;
        p.src_mac = NODE_MAC;
        p.dst_mac = POD_MAC;
    });
    assert_eq!((verdict, hex(&out)), (TC_ACT_REDIRECT, hex(&want.build())));
    assert!(checksums_valid6(&out, false));
    assert_eq!(fx.stat("forwarded"), 1);
    assert_eq!(fx.stat("reversed"), 1);

    // Anything else to the hairpin address is not ours.
    let stray = Packet6::tcp(CLIENT, 9191, hairpin_addr, 47000);
    assert_eq!(
        fx.run(programs::TC_FROM_POD, &stray.build()),
        (TC_ACT_UNSPEC, stray.build())
    );
}

#[test]
fn a_full_conntrack_table_drops_new_flows_and_keeps_tracked_ones() {
    // Room for two flows (two entries each).
    let mut fx = Loaded::new(capacities(4), Vec::new());
    fx.maps6
        .frontend(VIP, 80, PROTO_TCP, SVC_WEB, None, &[(901, POD1, 8080)]);
    let handshake = |fx: &mut Loaded, port: u16| {
        let syn = Packet6::tcp(CLIENT, port, VIP, 80);
        assert_eq!(
            fx.run(programs::TC_FROM_POD, &syn.build()).0,
            TC_ACT_OK,
            "SYN {port}"
        );
        let syn_ack = Packet6 {
            tcp_flags: TCP_SYN | TCP_ACK,
            ..Packet6::tcp(POD1, 8080, CLIENT, port)
        };
        assert_eq!(
            fx.run(programs::TC_TO_POD, &syn_ack.build()).0,
            TC_ACT_OK,
            "SYN-ACK {port}"
        );
        let ack = Packet6 {
            tcp_flags: TCP_ACK,
            ..Packet6::tcp(CLIENT, port, VIP, 80)
        };
        assert_eq!(
            fx.run(programs::TC_FROM_POD, &ack.build()).0,
            TC_ACT_OK,
            "ACK {port}"
        );
    };
    handshake(&mut fx, 49000);
    // A SYN never answered gives way to the next new flow, which completes
    // its handshake.
    let unanswered = Packet6::tcp(CLIENT, 48999, VIP, 80);
    assert_eq!(
        fx.run(programs::TC_FROM_POD, &unanswered.build()).0,
        TC_ACT_OK
    );
    handshake(&mut fx, 49001);
    assert!(fx
        .maps6
        .ct(&ct_key6(CLIENT, 48999, VIP, 80, PROTO_TCP, ct_dir::FORWARD))
        .is_none());
    assert_eq!(fx.stat("ct_full"), 0);
    // Two established flows: a new one is refused.
    let third = Packet6::tcp(CLIENT, 49002, VIP, 80);
    assert_eq!(fx.run(programs::TC_FROM_POD, &third.build()).0, TC_ACT_SHOT);
    assert_eq!(fx.stat("ct_full"), 1);
    assert!(fx
        .maps6
        .ct(&ct_key6(CLIENT, 49002, VIP, 80, PROTO_TCP, ct_dir::FORWARD))
        .is_none());
    // A tracked flow goes on.
    let ack = Packet6 {
        tcp_flags: TCP_ACK,
        ..Packet6::tcp(CLIENT, 49000, VIP, 80)
    };
    let (verdict, out) = fx.run(programs::TC_FROM_POD, &ack.build());
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(
        out,
        with(&ack, |p| {
            p.dst = POD1;
            p.dport = 8080;
        })
        .build()
    );
    // SYN, ACK, SYN, SYN, ACK, ACK forwarded; three flows created.
    assert_eq!(fx.service_packets(SVC_WEB), (6, 3, 0));
}

#[test]
fn the_pod_programs_translate_ipv6_themselves_without_the_tail_called_programs() {
    let mut fx = fixture();
    let map = fx
        .ebpf
        .take_map(proxy_common::names::TAIL_CALLS6)
        .expect("IPv6 tail-call array");
    let mut tail: aya::maps::ProgramArray<_> =
        aya::maps::ProgramArray::try_from(map).expect("program array");
    for slot in [proxy_common::tail::FROM_POD6, proxy_common::tail::TO_POD6] {
        tail.clear_index(&slot).expect("clear the slot");
    }
    // sb_from_pod and sb_to_pod run the IPv6 body themselves: the slots
    // (kept for the previous release's programs during an upgrade) are not
    // needed.
    let syn = Packet6::tcp(CLIENT, 50000, VIP, 80);
    let (verdict, out) = fx.run(programs::TC_FROM_POD, &syn.build());
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(
        out,
        with(&syn, |p| {
            p.dst = POD1;
            p.dport = 8080;
        })
        .build()
    );
    let reply = Packet6 {
        tcp_flags: TCP_SYN | TCP_ACK,
        ack: syn.seq + 1,
        ..Packet6::tcp(POD1, 8080, CLIENT, 50000)
    };
    let (verdict, out) = fx.run(programs::TC_TO_POD, &reply.build());
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(
        out,
        with(&reply, |p| {
            p.src = VIP;
            p.sport = 80;
        })
        .build()
    );
    assert_eq!(fx.stat("tail_call_missed"), 0);
}

#[test]
fn ipv4_in_the_same_object_is_unaffected() {
    // The IPv4 fixtures live in datapath.rs; here only that an IPv6 frontend
    // with the same service id space does not disturb an IPv4 frame that is
    // not ours, and that a frame with the IPv6 ethertype but an IPv4 header
    // passes untouched.
    let mut fx = fixture();
    let mut fake = Packet6::tcp(CLIENT, 48000, VIP, 80).build();
    fake[14] = 0x45;
    assert_eq!(
        fx.run(programs::TC_FROM_POD, &fake),
        (TC_ACT_UNSPEC, fake.clone())
    );
}

#[test]
fn a_frontend_without_endpoints_answers_tcp_with_rst_and_udp_with_port_unreachable() {
    let mut fx = fixture();
    let syn = Packet6::tcp(CLIENT, 40100, EMPTY_VIP, 80);
    let rst_ack = Packet6 {
        tcp_flags: TCP_RST | TCP_ACK,
        seq: 0,
        ack: syn.seq + 1,
        window: 0,
        src_mac: NODE_MAC,
        dst_mac: POD_MAC,
        ..Packet6::tcp(EMPTY_VIP, 80, CLIENT, 40100)
    };
    // A segment with ACK and 10 bytes: the RST takes its acknowledgement
    // number as sequence number.
    let data = Packet6 {
        tcp_flags: TCP_ACK | 0x08,
        ack: 0x5555_0000,
        payload: vec![7; 10],
        ..Packet6::tcp(CLIENT, 40101, EMPTY_VIP, 80)
    };
    let rst = Packet6 {
        tcp_flags: TCP_RST,
        seq: 0x5555_0000,
        ack: 0,
        window: 0,
        src_mac: NODE_MAC,
        dst_mac: POD_MAC,
        ..Packet6::tcp(EMPTY_VIP, 80, CLIENT, 40101)
    };
    let fin = Packet6 {
        tcp_flags: 0x01,
        payload: vec![1; 3],
        ..Packet6::tcp(CLIENT, 40102, EMPTY_VIP, 80)
    };
    let fin_rst = Packet6 {
        tcp_flags: TCP_RST | TCP_ACK,
        seq: 0,
        ack: fin.seq + 3 + 1,
        window: 0,
        src_mac: NODE_MAC,
        dst_mac: POD_MAC,
        ..Packet6::tcp(EMPTY_VIP, 80, CLIENT, 40102)
    };
    let udp = Packet6::udp(CLIENT, 40103, EMPTY_VIP, 53);
    let udp_frame = udp.build();
    let unreachable = icmp6_frame_macs(
        NODE_MAC,
        POD_MAC,
        EMPTY_VIP,
        CLIENT,
        1,
        4,
        0,
        &udp_frame[14..14 + 48],
    );
    let with_ext = Packet6 {
        ext: vec![NEXTHDR_DEST],
        ..Packet6::tcp(CLIENT, 40104, EMPTY_VIP, 80)
    };
    let a_rst = Packet6 {
        tcp_flags: TCP_RST,
        ..Packet6::tcp(CLIENT, 40105, EMPTY_VIP, 80)
    };
    let multicast_src = Packet6::udp(
        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
        40106,
        EMPTY_VIP,
        53,
    );

    let cases = vec![
        Case {
            name: "SYN to an empty IPv6 frontend: RST+ACK from the frontend".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: syn.build(),
            verdict: TC_ACT_REDIRECT,
            output: rst_ack.build(),
        },
        Case {
            name: "a segment with ACK and data: RST with its acknowledgement number".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: data.build(),
            verdict: TC_ACT_REDIRECT,
            output: rst.build(),
        },
        Case {
            name: "FIN with data: acknowledged data and FIN".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: fin.build(),
            verdict: TC_ACT_REDIRECT,
            output: fin_rst.build(),
        },
        Case {
            name: "UDP to an empty IPv6 frontend: ICMPv6 port unreachable quoting it".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: udp_frame.clone(),
            verdict: TC_ACT_REDIRECT,
            output: unreachable,
        },
        Case {
            name: "extension headers: dropped, not answered".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: with_ext.build(),
            verdict: TC_ACT_SHOT,
            output: with_ext.build(),
        },
        Case {
            name: "a RST is never answered".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: a_rst.build(),
            verdict: TC_ACT_SHOT,
            output: a_rst.build(),
        },
        Case {
            name: "a multicast source is never answered".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: multicast_src.build(),
            verdict: TC_ACT_SHOT,
            output: multicast_src.build(),
        },
    ];
    fx.run_table(&cases, translated_checksums::<Ipv6Addr>);
    assert_eq!(fx.stat("rejected"), 4);
    assert_eq!(fx.stat("drop_no_backend"), 3);
    assert_eq!(fx.service_packets(SVC_EMPTY_TCP), (0, 0, 5));
    assert_eq!(fx.service_packets(SVC_EMPTY_UDP), (0, 0, 2));
}

/// The IPv6 payload of a frame (what an ICMPv6 error quotes), cut at `len`.
fn quote(frame: &[u8], len: usize) -> Vec<u8> {
    frame[14..].iter().take(len).copied().collect()
}

#[test]
fn icmpv6_errors_about_translated_flows_are_translated_back() {
    let mut fx = fixture();
    let syn = Packet6::tcp(CLIENT, 40200, VIP, 80);
    let (verdict, dnat) = fx.run(programs::TC_FROM_POD, &syn.build());
    assert_eq!(verdict, TC_ACT_OK);
    let udp = Packet6 {
        payload: vec![9; 1200],
        ..Packet6::udp(CLIENT, 40201, VIP, 53)
    };
    let (verdict, udp_dnat) = fx.run(programs::TC_FROM_POD, &udp.build());
    assert_eq!(verdict, TC_ACT_OK);
    let syn_ack = Packet6 {
        tcp_flags: TCP_SYN | TCP_ACK,
        ..Packet6::tcp(POD1, 8080, CLIENT, 40200)
    };
    let (verdict, reply) = fx.run(programs::TC_TO_POD, &syn_ack.build());
    assert_eq!(verdict, TC_ACT_OK);
    let unknown = Packet6::tcp(CLIENT, 40299, POD2, 8080).build();

    let cases = vec![
        Case {
            name: "packet too big from a router about the DNATed SYN: quote back to the frontend (PMTU)".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp6_frame(ROUTER, CLIENT, 2, 0, 1280, &quote(&dnat, 1000)),
            verdict: TC_ACT_OK,
            output: icmp6_frame(ROUTER, CLIENT, 2, 0, 1280, &quote(&syn.build(), 1000)),
        },
        Case {
            name: "packet too big about a UDP datagram, quote cut short of the payload".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp6_frame(ROUTER, CLIENT, 2, 0, 1280, &quote(&udp_dnat, 1232)),
            verdict: TC_ACT_OK,
            output: icmp6_frame(ROUTER, CLIENT, 2, 0, 1280, &quote(&udp.build(), 1232)),
        },
        Case {
            name: "port unreachable from the backend itself: the outer source becomes the frontend".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp6_frame(POD1, CLIENT, 1, 4, 0, &quote(&dnat, 1000)),
            verdict: TC_ACT_OK,
            output: icmp6_frame(VIP, CLIENT, 1, 4, 0, &quote(&syn.build(), 1000)),
        },
        Case {
            name: "time exceeded quoting only 8 bytes of TCP: ports translated, no TCP checksum to fix".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp6_frame(ROUTER, CLIENT, 3, 0, 0, &quote(&dnat, 48)),
            verdict: TC_ACT_OK,
            output: icmp6_frame(ROUTER, CLIENT, 3, 0, 0, &quote(&syn.build(), 48)),
        },
        Case {
            name: "the client's error about the frontend's reply goes to the backend".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: icmp6_frame(CLIENT, VIP, 1, 4, 0, &quote(&reply, 1000)),
            verdict: TC_ACT_OK,
            output: icmp6_frame(CLIENT, POD1, 1, 4, 0, &quote(&syn_ack.build(), 1000)),
        },
        Case {
            name: "an error about a flow that is not ours: untouched".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp6_frame(ROUTER, CLIENT, 2, 0, 1280, &quote(&unknown, 1000)),
            verdict: TC_ACT_UNSPEC,
            output: icmp6_frame(ROUTER, CLIENT, 2, 0, 1280, &quote(&unknown, 1000)),
        },
    ];
    fx.run_table(&cases, translated_checksums::<Ipv6Addr>);
    assert_eq!(fx.stat("icmp_error_translated"), 5);
    assert_eq!(fx.stat("tail_call_missed"), 0);
}
