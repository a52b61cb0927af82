//! What the uplink programs leave alone (other families' and protocols'
//! packets, malformed frames, neighbour discovery), IPv6 fragments from
//! outside, and what an IPv6 frontend without endpoints answers.
use std::net::{Ipv4Addr, Ipv6Addr};

use super::{
    from_client6, frontend, snat_port, standard6, uplinked, uplinked6, with_hop_limit, Uplinked,
    CLIENT6, CLIENT_MAC, EMPTY_LOCAL_PORT, GATEWAY_MAC, LB_IP6, NODE6, NODE_PORT, POD_LOCAL6,
    POD_PORT, POD_REMOTE6, REMOTE_PORT, UPLINK_MAC,
};
use crate::support::{
    netns::RunNode as _, rewritten_checksums, v6::Fe6, Case, Loaded, Uplink as Prog,
    TC_ACT_REDIRECT, TC_ACT_SHOT, XDP_PASS,
};
use proxy_common::{frontend_flags, snat};
use proxy_testkit::packet::{PacketSpec, ETH_HLEN};
use proxy_testkit::packet6::{
    checksums_valid6, icmp6_frame_macs, Packet6, PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_RST,
};
use proxy_user::model::{FrontendKind, Protocol};

type V4 = Ipv4Addr;
type V6 = Ipv6Addr;

#[test]
fn packets_that_are_not_ours_pass_untouched() {
    V4::THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked::<V4>(
                node,
                vec![
                    frontend(
                        FrontendKind::NodePort,
                        V4::NODE,
                        NODE_PORT,
                        Protocol::Tcp,
                        "np",
                        &[V4::POD_LOCAL],
                    ),
                    frontend(
                        FrontendKind::NodePort,
                        V4::NODE,
                        NODE_PORT,
                        Protocol::Udp,
                        "np-udp",
                        &[V4::POD_REMOTE],
                    ),
                ],
            );
            let mut arp = vec![0xff; 6];
            arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
            arp.extend_from_slice(&[0u8; 28]);
            let mut ipv6 = PacketSpec::tcp(V4::CLIENT, 40000, V4::NODE, NODE_PORT).build();
            ipv6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
            let icmp = PacketSpec {
                proto: 1,
                payload: vec![8, 0, 0xf7, 0xff, 0, 0, 0, 0],
                ..PacketSpec::tcp(V4::CLIENT, 0, V4::NODE, 0)
            };
            let other_port = PacketSpec::tcp(V4::CLIENT, 40001, V4::NODE, 30081);
            let other_proto = PacketSpec::udp(V4::CLIENT, 40002, V4::LB_IP, NODE_PORT);
            let snat_range = PacketSpec::tcp(V4::POD_REMOTE, POD_PORT, V4::NODE, 61234);
            let snat_range_udp =
                PacketSpec::udp(V4::POD_REMOTE, POD_PORT, V4::NODE, snat::HIGH_MAX);
            let below_snat_range =
                PacketSpec::tcp(V4::POD_REMOTE, POD_PORT, V4::NODE, snat::HIGH_MIN - 1);
            let mut cut_tcp = PacketSpec::tcp(V4::CLIENT, 40003, V4::NODE, NODE_PORT).build();
            cut_tcp.truncate(ETH_HLEN + 20 + 10);
            let mut bad_ihl = PacketSpec::tcp(V4::CLIENT, 40004, V4::NODE, NODE_PORT).build();
            bad_ihl[ETH_HLEN] = 0x43;
            let mut short_total = PacketSpec::tcp(V4::CLIENT, 40005, V4::NODE, NODE_PORT).build();
            short_total[ETH_HLEN + 2..ETH_HLEN + 4].copy_from_slice(&24u16.to_be_bytes());
            let first_fragment = PacketSpec {
                frag_off: 0x2000,
                ..PacketSpec::udp(V4::CLIENT, 40006, V4::NODE, NODE_PORT)
            };
            let later_fragment = PacketSpec {
                frag_off: 0x0010,
                ..PacketSpec::tcp(V4::CLIENT, 40007, V4::NODE, NODE_PORT)
            };
            let untouched: Vec<(&str, Vec<u8>)> = vec![
                ("ARP", arp),
                ("IPv6", ipv6),
                ("ICMP echo to the node", icmp.build()),
                ("TCP to a node port that is no frontend", other_port.build()),
                (
                    "UDP to the LB IP on the NodePort number",
                    other_proto.build(),
                ),
                (
                    "TCP into the SNAT range without conntrack entry",
                    snat_range.build(),
                ),
                (
                    "UDP to the top of the SNAT range without entry",
                    snat_range_udp.build(),
                ),
                ("TCP just below the SNAT range", below_snat_range.build()),
                ("truncated TCP header", cut_tcp),
                ("IHL below 5", bad_ihl),
                ("total length shorter than the headers", short_total),
                ("later fragment without a first one", later_fragment.build()),
            ];
            // XDP hands every fragment to the tc program; the tc program
            // translates first fragments (tested with real traffic in
            // e2e_external), so only XDP leaves this one untouched.
            let mut untouched = untouched;
            if prog == Prog::Xdp {
                untouched.push(("first fragment", first_fragment.build()));
            }
            let cases: Vec<Case> = untouched
                .into_iter()
                .map(|(name, frame)| Case {
                    hook: prog.into(),
                    name: name.into(),
                    input: frame.clone(),
                    verdict: prog.untouched(),
                    output: frame,
                })
                .collect();
            fx.run_table(&cases, rewritten_checksums::<Ipv4Addr>);
            assert_eq!(fx.stat("malformed"), 3, "{prog:?}");
            if prog == Prog::Xdp {
                assert_eq!(fx.stat("fragment"), 2);
            } else {
                assert_eq!(fx.stat("frag_unknown"), 1);
            }
            for counter in [
                "ext_local",
                "ext_remote",
                "ext_reply",
                "drop_no_backend",
                "xdp_to_tc",
            ] {
                assert_eq!(fx.stat(counter), 0, "{prog:?}: {counter}");
            }
            assert_eq!(fx.syncer.store().conntrack_len(), 0, "{prog:?}");
        }
    });
}

#[test]
fn ipv6_packets_that_are_not_ours_pass_the_uplink_untouched() {
    V6::THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked6(node, Some(NODE6));
            standard6(&mut fx);
            let other = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1);
            let mut cases: Vec<(&str, Vec<u8>)> = vec![
                (
                    "the node, another port",
                    from_client6(Packet6::tcp(CLIENT6, 40000, NODE6, 22)).build(),
                ),
                (
                    "another address",
                    from_client6(Packet6::tcp(CLIENT6, 40000, other, NODE_PORT)).build(),
                ),
                (
                    "UDP to a TCP-only port",
                    from_client6(Packet6::udp(CLIENT6, 40000, LB_IP6, 80)).build(),
                ),
                (
                    "with a hop-by-hop header to another port",
                    from_client6(Packet6 {
                        ext: vec![0],
                        ..Packet6::tcp(CLIENT6, 40000, NODE6, 23)
                    })
                    .build(),
                ),
            ];
            // Neighbour solicitation for the node's address (to its
            // solicited-node group and to the address itself), a neighbour
            // advertisement, a router solicitation, an echo request to a
            // frontend address.
            let solicited = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 1);
            let mut target = NODE6.octets().to_vec();
            target.extend_from_slice(&[1, 1, 0x02, 0, 0, 0, 0, 0x64]);
            cases.push((
                "neighbour solicitation (multicast)",
                icmp6_frame_macs(
                    CLIENT_MAC,
                    [0x33, 0x33, 0xff, 0, 0, 1],
                    CLIENT6,
                    solicited,
                    135,
                    0,
                    0,
                    &target,
                ),
            ));
            cases.push((
                "neighbour solicitation (unicast)",
                icmp6_frame_macs(CLIENT_MAC, UPLINK_MAC, CLIENT6, NODE6, 135, 0, 0, &target),
            ));
            cases.push((
                "neighbour advertisement",
                icmp6_frame_macs(
                    CLIENT_MAC,
                    UPLINK_MAC,
                    CLIENT6,
                    NODE6,
                    136,
                    0,
                    0x6000_0000,
                    &target,
                ),
            ));
            cases.push((
                "router solicitation",
                icmp6_frame_macs(
                    CLIENT_MAC,
                    [0x33, 0x33, 0, 0, 0, 2],
                    CLIENT6,
                    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2),
                    133,
                    0,
                    0,
                    &[],
                ),
            ));
            cases.push((
                "echo request to a frontend address",
                icmp6_frame_macs(
                    CLIENT_MAC,
                    UPLINK_MAC,
                    CLIENT6,
                    LB_IP6,
                    128,
                    0,
                    0x0001_0001,
                    b"ping",
                ),
            ));
            // XDP hands the fragments of a datagram to a frontend on to the
            // tc program, which translates them
            // (`ipv6_fragments_from_outside_follow_their_first_fragment`).
            if prog == Prog::Xdp {
                let big = Packet6 {
                    payload: vec![0x5a; 64],
                    ..from_client6(Packet6::udp(CLIENT6, 40000, NODE6, NODE_PORT))
                };
                for (i, f) in big.fragments(32, 7).into_iter().enumerate() {
                    let name = match i {
                        0 => "first fragment",
                        _ => "later fragment",
                    };
                    cases.push((name, f));
                }
            }
            for (name, frame) in cases {
                let (verdict, out) = fx.run(prog, &frame);
                assert_eq!(verdict, prog.untouched(), "{prog:?}: {name}");
                assert_eq!(out, frame, "{prog:?}: {name} was changed");
            }
            assert_eq!(fx.stat("ext_local"), 0);
            assert_eq!(fx.stat("tail_call_missed"), 0);
        }
    });
}

/// The tc program translates a fragmented datagram from outside as IPv4's
/// does: the first fragment like a whole packet, the later ones get the
/// addresses it got (no ports, no checksum in them) and leave the node the
/// way it did; to a local backend, to a remote one (DNAT and SNAT, sent out
/// again) and that backend's fragmented reply back to the client.
#[test]
fn ipv6_fragments_from_outside_follow_their_first_fragment() {
    V6::THIS_NODE.run(|node| {
        let prog = Prog::Tc;
        let mut fx = uplinked6(node, Some(NODE6));
        standard6(&mut fx);
        let datagram = |sport, dport| Packet6 {
            payload: (0..100u8).collect(),
            ..from_client6(Packet6::udp(CLIENT6, sport, NODE6, dport))
        };
        let run_all = |fx: &mut Loaded, what, verdict, inputs: &[Vec<u8>], wants: &[Vec<u8>]| {
            assert_eq!(inputs.len(), wants.len(), "{what}");
            for (i, (input, want)) in inputs.iter().zip(wants).enumerate() {
                let got = fx.run(prog, input);
                assert_eq!(got, (verdict, want.clone()), "{what}: fragment {i}");
            }
        };

        // A local backend: DNAT; the stack delivers the fragments.
        let local = datagram(46000, NODE_PORT);
        let translated = Packet6 {
            dst: POD_LOCAL6,
            dport: POD_PORT,
            ..local.clone()
        };
        assert!(checksums_valid6(&translated.build(), false));
        let id = 0x0102_0304;
        let inputs = local.fragments(48, id);
        assert_eq!(inputs.len(), 3);
        run_all(
            &mut fx,
            "local backend",
            prog.delivered(),
            &inputs,
            &translated.fragments(48, id),
        );

        // A remote backend: DNAT and SNAT, every fragment sent back out.
        let remote = datagram(46001, REMOTE_PORT);
        let inputs = remote.fragments(48, id);
        let (verdict, first) = fx.run(prog, &inputs[0]);
        assert_eq!(verdict, TC_ACT_REDIRECT, "remote backend: first fragment");
        let port = snat_port(&fx, PROTO_UDP, 46001, REMOTE_PORT);
        let translated = Packet6 {
            src: NODE6,
            sport: port,
            dst: POD_REMOTE6,
            dport: POD_PORT,
            ..remote.clone()
        };
        let wants: Vec<Vec<u8>> = translated
            .fragments(48, id)
            .into_iter()
            .map(|f| with_hop_limit(f, 63))
            .collect();
        assert_eq!(first, wants[0], "remote backend: first fragment");
        run_all(
            &mut fx,
            "remote backend",
            TC_ACT_REDIRECT,
            &inputs[1..],
            &wants[1..],
        );

        // Its fragmented reply: both translations reversed, to the client.
        let reply = Packet6 {
            src_mac: GATEWAY_MAC,
            dst_mac: UPLINK_MAC,
            payload: (0..100u8).rev().collect(),
            ..Packet6::udp(POD_REMOTE6, POD_PORT, NODE6, port)
        };
        let reversed = Packet6 {
            src: NODE6,
            sport: REMOTE_PORT,
            dst: CLIENT6,
            dport: 46001,
            ..reply.clone()
        };
        let wants: Vec<Vec<u8>> = reversed
            .fragments(48, 9)
            .into_iter()
            .map(|f| with_hop_limit(f, 63))
            .collect();
        run_all(
            &mut fx,
            "remote reply",
            TC_ACT_REDIRECT,
            &reply.fragments(48, 9),
            &wants,
        );
        assert_eq!(fx.stat("frag_translated"), 6);

        // A later fragment whose first fragment never came passes untouched.
        let stray = datagram(46002, NODE_PORT).fragments(48, 0x0bad)[1].clone();
        let (verdict, out) = fx.run(prog, &stray);
        assert_eq!(
            (verdict, &out),
            (prog.untouched(), &stray),
            "a stray fragment"
        );
        assert_eq!(fx.stat("frag_unknown"), 1);
    });
}

// ---------------------------------------------------------------------------
// Reject: an IPv6 frontend without any endpoint answers a client from outside.

const EMPTY_PORT: u16 = 30092;
const EMPTY_TCP_SERVICE: u32 = 22;
const EMPTY_UDP_SERVICE: u32 = 23;

#[test]
fn an_ipv6_frontend_without_endpoints_answers_outside_clients_with_rst_or_port_unreachable() {
    V6::THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked6(node, Some(NODE6));
            standard6(&mut fx);
            for (proto, sid) in [
                (PROTO_TCP, EMPTY_TCP_SERVICE),
                (PROTO_UDP, EMPTY_UDP_SERVICE),
            ] {
                fx.maps6.write(&Fe6 {
                    addr: NODE6,
                    port: EMPTY_PORT,
                    proto,
                    service_id: sid,
                    kind: frontend_flags::KIND_NODE_PORT,
                    backend_port: POD_PORT,
                    backends: &[],
                    local: None,
                });
            }
            let syn = from_client6(Packet6::tcp(CLIENT6, 40200, NODE6, EMPTY_PORT));
            let rst_ack = Packet6 {
                tcp_flags: TCP_RST | TCP_ACK,
                seq: 0,
                ack: syn.seq + 1,
                window: 0,
                src_mac: UPLINK_MAC,
                dst_mac: CLIENT_MAC,
                ..Packet6::tcp(NODE6, EMPTY_PORT, CLIENT6, 40200)
            };
            let udp = from_client6(Packet6::udp(CLIENT6, 40201, NODE6, EMPTY_PORT));
            let udp_frame = udp.build();
            let unreachable = icmp6_frame_macs(
                UPLINK_MAC,
                CLIENT_MAC,
                NODE6,
                CLIENT6,
                1,
                4,
                0,
                &udp_frame[14..14 + 48],
            );
            let a_rst = from_client6(Packet6 {
                tcp_flags: TCP_RST,
                ..Packet6::tcp(CLIENT6, 40202, NODE6, EMPTY_PORT)
            });
            // Under `externalTrafficPolicy: Local` without a local endpoint
            // (the Service has one elsewhere) the packet drops, unanswered.
            let local_empty = from_client6(Packet6::tcp(CLIENT6, 40203, NODE6, EMPTY_LOCAL_PORT));
            match prog {
                Prog::Tc => {
                    let (verdict, out) = fx.run(prog, &syn.build());
                    assert_eq!(
                        (verdict, out),
                        (TC_ACT_REDIRECT, rst_ack.build()),
                        "SYN: RST+ACK from the NodePort"
                    );
                    let (verdict, out) = fx.run(prog, &udp_frame);
                    assert_eq!(
                        (verdict, out),
                        (TC_ACT_REDIRECT, unreachable),
                        "UDP: port unreachable quoting it"
                    );
                    assert_eq!(fx.stat("rejected"), 2);
                }
                Prog::Xdp => {
                    // Handed to the uplink's tc program untouched, which answers.
                    for frame in [syn.build(), udp_frame.clone()] {
                        let (verdict, out) = fx.run(prog, &frame);
                        assert_eq!((verdict, out), (XDP_PASS, frame));
                    }
                    assert_eq!(fx.stat("xdp_to_tc"), 2);
                    assert_eq!(fx.stat("rejected"), 0);
                }
            }
            // A RST is never answered: tc drops it (XDP hands it on as any
            // packet to the empty frontend).
            let (verdict, out) = fx.run(prog, &a_rst.build());
            let want = if prog == Prog::Tc {
                TC_ACT_SHOT
            } else {
                XDP_PASS
            };
            assert_eq!((verdict, out), (want, a_rst.build()), "{prog:?}: a RST");
            let (verdict, _) = fx.run(prog, &local_empty.build());
            assert_eq!(
                verdict,
                prog.dropped(),
                "{prog:?}: Local policy without a local endpoint"
            );
            // Counted where the packet is answered or dropped (tc), once.
            let stats = fx.syncer.store().service_stats(EMPTY_TCP_SERVICE);
            let want = if prog == Prog::Tc { 2 } else { 0 };
            assert_eq!(
                stats.drops_no_backend, want,
                "{prog:?}: the SYN and the RST, counted once each"
            );
        }
    });
}
