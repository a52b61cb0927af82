//! IPv6 packet fixtures for the uplink (north-south) programs through
//! BPF_PROG_TEST_RUN: `sb_xdp_uplink` and `sb_from_uplink`, which tail-call
//! their IPv6 twins (`sb_xdp_uplink6`, `sb_from_uplink6`) for ethertype
//! 0x86DD. Each case checks the verdict and the exact output frame against
//! one built from scratch (its checksum computed independently over the
//! IPv6 pseudo-header). Needs root.
//!
//! As in `datapath_uplink.rs`, each test runs on a thread of its own in a
//! private network namespace (the route lookup decides local or remote):
//!
//! ```text
//! up0  (veth, 02:00:00:00:50:01) fd00:50::1/64, forwarding on   <- the uplink
//!      neighbours fd00:50::2 (gateway to other nodes) and fd00:50::100 (client)
//!      route fd00:244:2::/64 via fd00:50::2   (POD_REMOTE: another node)
//!      route fd00:244:3::/64 via fd00:50::3   (a gateway without neighbour entry)
//! pod0 (veth)  route fd00:244:1::/64          (POD_LOCAL: a pod on this node)
//! ```
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::support::{
    netns::{Node, NodeSpec},
    v6::{ct_key6, Fe6},
    Loaded, Uplink as Prog, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC, XDP_PASS,
    XDP_TX,
};
use proxy_common::{
    addr6_be, capacity, ct_dir, ct_flags, dsr, frontend_flags,
    hash::{flow_hash6, source_hash6},
    snat, uplink_flags, CtEntry6, MaglevTable,
};
use proxy_testkit::packet6::{
    checksums_valid6, icmp6_frame_macs, Packet6, NEXTHDR_DEST, NEXTHDR_HOP, NEXTHDR_ROUTING,
    PROTO_TCP, PROTO_UDP, TCP_ACK, TCP_RST, TCP_SYN,
};
use proxy_user::sync::maglev::{self, BackendKey};

const NODE: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 1);
const UPLINK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x50, 0x01];
const GATEWAY: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 2);
const GATEWAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const CLIENT: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 0x100);
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
const POD_LOCAL: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 2);
const POD_LOCAL_2: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 3);
const POD_REMOTE: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 2);
const POD_UNRESOLVED: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 3, 0, 0, 0, 0, 2);
const LB_IP: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x60, 0, 0, 0, 0, 0, 0x10);
const NODE_PORT: u16 = 30080;
const REMOTE_PORT: u16 = 30081;
const UNRESOLVED_PORT: u16 = 30082;
const EMPTY_LOCAL_PORT: u16 = 30083;
const POD_PORT: u16 = 8080;

/// The node: see the module documentation.
const THIS_NODE: NodeSpec<Ipv6Addr> = NodeSpec {
    uplink_mac: UPLINK_MAC,
    addr: NODE,
    prefix_len: 64,
    neighbours: &[(GATEWAY, GATEWAY_MAC), (CLIENT, CLIENT_MAC)],
    routes: &[
        ("fd00:244:2::/64", Some(GATEWAY)),
        (
            "fd00:244:3::/64",
            Some(Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 3)),
        ),
        ("fd00:244:1::/64", None),
    ],
};

// ---------------------------------------------------------------------------
// The loaded programs and the IPv6 maps.

/// Loads the programs with no IPv4 frontend and makes `up0` the uplink,
/// with IPv6 address `addr` (none: all-zero).
fn uplinked(node: &Node, addr: Option<Ipv6Addr>) -> Loaded {
    let mut fx = Loaded::on_uplink(node, Ipv4Addr::new(192, 168, 50, 1), Vec::new());
    fx.set_uplink6(node.uplink, addr);
    fx
}

/// The usual NodePort (TCP and UDP) to one local backend, a NodePort to a
/// remote backend, one to a backend behind an unresolved gateway, an
/// `externalTrafficPolicy: Local` LoadBalancer IP and a Local NodePort
/// without local endpoints.
fn standard(fx: &mut Loaded) {
    for (proto, sid, bid) in [(PROTO_TCP, 1, 101), (PROTO_UDP, 2, 102)] {
        fx.maps6.write(&Fe6 {
            addr: NODE,
            port: NODE_PORT,
            proto,
            service_id: sid,
            kind: frontend_flags::KIND_NODE_PORT,
            backend_port: POD_PORT,
            backends: &[(bid, POD_LOCAL)],
            local: None,
        });
    }
    for (proto, sid, bid) in [(PROTO_TCP, 3, 103), (PROTO_UDP, 4, 104)] {
        fx.maps6.write(&Fe6 {
            addr: NODE,
            port: REMOTE_PORT,
            proto,
            service_id: sid,
            kind: frontend_flags::KIND_NODE_PORT,
            backend_port: POD_PORT,
            backends: &[(bid, POD_REMOTE)],
            local: None,
        });
    }
    fx.maps6.write(&Fe6 {
        addr: NODE,
        port: UNRESOLVED_PORT,
        proto: PROTO_TCP,
        service_id: 5,
        kind: frontend_flags::KIND_NODE_PORT,
        backend_port: POD_PORT,
        backends: &[(105, POD_UNRESOLVED)],
        local: None,
    });
    fx.maps6.write(&Fe6 {
        addr: LB_IP,
        port: 80,
        proto: PROTO_TCP,
        service_id: 6,
        kind: frontend_flags::KIND_LOAD_BALANCER,
        backend_port: POD_PORT,
        backends: &[(106, POD_REMOTE), (107, POD_LOCAL_2)],
        local: Some(&[(107, POD_LOCAL_2)]),
    });
    fx.maps6.write(&Fe6 {
        addr: NODE,
        port: EMPTY_LOCAL_PORT,
        proto: PROTO_TCP,
        service_id: 7,
        kind: frontend_flags::KIND_NODE_PORT,
        backend_port: POD_PORT,
        backends: &[(108, POD_REMOTE)],
        local: Some(&[]),
    });
}

/// A packet from the client (its MAC address to the uplink's).
fn from_client(p: Packet6) -> Packet6 {
    Packet6 {
        src_mac: CLIENT_MAC,
        dst_mac: UPLINK_MAC,
        ..p
    }
}

fn with_hop_limit(mut frame: Vec<u8>, hop_limit: u8) -> Vec<u8> {
    frame[21] = hop_limit;
    frame
}

fn with_macs(mut frame: Vec<u8>, dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame
}

/// The source port of a TCP/UDP frame without extension headers.
fn sport_of(frame: &[u8]) -> u16 {
    u16::from_be_bytes([frame[54], frame[55]])
}

fn dst_of(frame: &[u8]) -> (Ipv6Addr, u16) {
    let addr = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[38..54]).expect("16 bytes"));
    (addr, u16::from_be_bytes([frame[56], frame[57]]))
}

// ---------------------------------------------------------------------------
// 1: a local backend: DNAT only, tracked, the reply reversed on egress.

#[test]
fn outside_client_reaches_a_local_ipv6_backend_by_dnat_and_the_reply_is_reversed() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, Some(NODE));
            standard(&mut fx);
            for (i, proto) in [PROTO_TCP, PROTO_UDP].into_iter().enumerate() {
                let sport = 40000 + i as u16;
                let mk = |src, sp, dst, dp| match proto {
                    PROTO_TCP => Packet6::tcp(src, sp, dst, dp),
                    _ => Packet6::udp(src, sp, dst, dp),
                };
                let input = from_client(mk(CLIENT, sport, NODE, NODE_PORT));
                let (verdict, out) = fx.run(prog, &input.build());
                let want = Packet6 {
                    dst: POD_LOCAL,
                    dport: POD_PORT,
                    ..input.clone()
                };
                assert_eq!(verdict, prog.delivered(), "{prog:?} proto {proto}");
                assert_eq!(
                    out,
                    want.build(),
                    "{prog:?} proto {proto}: DNAT to the local backend"
                );
                assert!(checksums_valid6(&out, false));

                // Tracked as the pod path tracks it: both directions, no SNAT.
                let fwd = client_entry(&fx, proto, sport, NODE_PORT);
                assert_eq!(fwd.nat_addr_be, addr6_be(POD_LOCAL.octets()));
                assert_eq!(fwd.nat_port_be, POD_PORT.to_be());
                assert_eq!(fwd.flags & ct_flags::SNAT, 0);
                let rev = fx
                    .maps6
                    .ct(&ct_key6(
                        POD_LOCAL,
                        POD_PORT,
                        CLIENT,
                        sport,
                        proto,
                        ct_dir::REPLY,
                    ))
                    .expect("reply entry");
                assert_eq!(rev.nat_addr_be, addr6_be(NODE.octets()));
                assert_eq!(rev.nat_port_be, NODE_PORT.to_be());

                // The backend's reply leaves through the uplink: reversed.
                let mut reply = mk(POD_LOCAL, POD_PORT, CLIENT, sport);
                reply.tcp_flags = TCP_SYN | TCP_ACK;
                let (verdict, out) = fx.run_egress(&reply.build());
                assert_eq!(verdict, TC_ACT_OK, "{prog:?} proto {proto}: reply");
                let want = Packet6 {
                    src: NODE,
                    sport: NODE_PORT,
                    ..reply.clone()
                };
                assert_eq!(
                    out,
                    want.build(),
                    "{prog:?} proto {proto}: reply from the NodePort"
                );

                // The next packet of the flow keeps its backend.
                let mut next = input.clone();
                next.tcp_flags = if proto == PROTO_TCP { TCP_ACK } else { 0 };
                let (verdict, out) = fx.run(prog, &next.build());
                assert_eq!(verdict, prog.delivered());
                assert_eq!(dst_of(&out), (POD_LOCAL, POD_PORT));
            }
            assert_eq!(fx.stat("ext_local"), 4, "{prog:?}");
        }
    });
}

#[test]
fn outside_ipv6_packets_with_extension_headers_or_a_zero_udp_checksum_are_translated_exactly() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, Some(NODE));
            standard(&mut fx);
            let cases = [
                (
                    "hop-by-hop and destination options before TCP",
                    from_client(Packet6 {
                        ext: vec![NEXTHDR_HOP, NEXTHDR_DEST],
                        ..Packet6::tcp(CLIENT, 47000, NODE, NODE_PORT)
                    }),
                ),
                (
                    "routing header before UDP",
                    from_client(Packet6 {
                        ext: vec![NEXTHDR_ROUTING],
                        ..Packet6::udp(CLIENT, 47001, NODE, NODE_PORT)
                    }),
                ),
                (
                    "UDP with a zero checksum (stays zero)",
                    from_client(Packet6 {
                        udp_zero_checksum: true,
                        ..Packet6::udp(CLIENT, 47002, NODE, NODE_PORT)
                    }),
                ),
            ];
            for (name, input) in cases {
                let (verdict, out) = fx.run(prog, &input.build());
                let want = Packet6 {
                    dst: POD_LOCAL,
                    dport: POD_PORT,
                    ..input.clone()
                };
                assert_eq!(verdict, prog.delivered(), "{prog:?}: {name}");
                assert_eq!(out, want.build(), "{prog:?}: {name}");
                assert!(
                    checksums_valid6(&out, input.udp_zero_checksum),
                    "{prog:?}: {name}"
                );
            }
        }
    });
}

// ---------------------------------------------------------------------------
// externalTrafficPolicy: Local.

#[test]
fn local_policy_sends_outside_ipv6_flows_only_to_local_endpoints_without_snat() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, Some(NODE));
            standard(&mut fx);
            for sport in 41000..41016u16 {
                let input = from_client(Packet6::tcp(CLIENT, sport, LB_IP, 80));
                let (verdict, out) = fx.run(prog, &input.build());
                assert_eq!(verdict, prog.delivered(), "{prog:?} sport {sport}");
                let want = Packet6 {
                    dst: POD_LOCAL_2,
                    dport: POD_PORT,
                    ..input.clone()
                };
                assert_eq!(
                    out,
                    want.build(),
                    "{prog:?} sport {sport}: the local endpoint, client source kept"
                );
            }
            // A Local frontend without local endpoints drops traffic from
            // outside.
            let input = from_client(Packet6::tcp(CLIENT, 42000, NODE, EMPTY_LOCAL_PORT)).build();
            let drops = fx.stat("drop_no_backend");
            let (verdict, _) = fx.run(prog, &input);
            assert_eq!(
                verdict,
                prog.dropped(),
                "{prog:?}: Local without local endpoints"
            );
            assert_eq!(fx.stat("drop_no_backend"), drops + 1);
        }
    });
}

// ---------------------------------------------------------------------------
// 3: what is not ours, ICMPv6 and neighbour discovery, fragments.

#[test]
fn ipv6_packets_that_are_not_ours_pass_the_uplink_untouched() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, Some(NODE));
            standard(&mut fx);
            let other = Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, 1);
            let mut cases: Vec<(&str, Vec<u8>)> = vec![
                (
                    "the node, another port",
                    from_client(Packet6::tcp(CLIENT, 40000, NODE, 22)).build(),
                ),
                (
                    "another address",
                    from_client(Packet6::tcp(CLIENT, 40000, other, NODE_PORT)).build(),
                ),
                (
                    "UDP to a TCP-only port",
                    from_client(Packet6::udp(CLIENT, 40000, LB_IP, 80)).build(),
                ),
                (
                    "with a hop-by-hop header to another port",
                    from_client(Packet6 {
                        ext: vec![0],
                        ..Packet6::tcp(CLIENT, 40000, NODE, 23)
                    })
                    .build(),
                ),
            ];
            // Neighbour solicitation for the node's address (to its
            // solicited-node group and to the address itself), a neighbour
            // advertisement, a router solicitation, an echo request to a
            // frontend address.
            let solicited = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 1);
            let mut target = NODE.octets().to_vec();
            target.extend_from_slice(&[1, 1, 0x02, 0, 0, 0, 0, 0x64]);
            cases.push((
                "neighbour solicitation (multicast)",
                icmp6_frame_macs(
                    CLIENT_MAC,
                    [0x33, 0x33, 0xff, 0, 0, 1],
                    CLIENT,
                    solicited,
                    135,
                    0,
                    0,
                    &target,
                ),
            ));
            cases.push((
                "neighbour solicitation (unicast)",
                icmp6_frame_macs(CLIENT_MAC, UPLINK_MAC, CLIENT, NODE, 135, 0, 0, &target),
            ));
            cases.push((
                "neighbour advertisement",
                icmp6_frame_macs(
                    CLIENT_MAC,
                    UPLINK_MAC,
                    CLIENT,
                    NODE,
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
                    CLIENT,
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
                    CLIENT,
                    LB_IP,
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
                    ..from_client(Packet6::udp(CLIENT, 40000, NODE, NODE_PORT))
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
    THIS_NODE.run(|node| {
        let prog = Prog::Tc;
        let mut fx = uplinked(node, Some(NODE));
        standard(&mut fx);
        let datagram = |sport, dport| Packet6 {
            payload: (0..100u8).collect(),
            ..from_client(Packet6::udp(CLIENT, sport, NODE, dport))
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
            dst: POD_LOCAL,
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
            src: NODE,
            sport: port,
            dst: POD_REMOTE,
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
            ..Packet6::udp(POD_REMOTE, POD_PORT, NODE, port)
        };
        let reversed = Packet6 {
            src: NODE,
            sport: REMOTE_PORT,
            dst: CLIENT,
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
// 2: a remote backend: DNAT + SNAT to the uplink's IPv6 address.

/// The forward entry of the client's flow from `sport` to NODE's `dport`.
fn client_entry(fx: &Loaded, proto: u8, sport: u16, dport: u16) -> CtEntry6 {
    fx.maps6
        .ct(&ct_key6(CLIENT, sport, NODE, dport, proto, ct_dir::FORWARD))
        .expect("forward entry")
}

/// The SNAT port a remote flow got (from its forward entry).
fn snat_port(fx: &Loaded, proto: u8, sport: u16, dport: u16) -> u16 {
    let fwd = client_entry(fx, proto, sport, dport);
    assert_ne!(fwd.flags & ct_flags::SNAT, 0, "a source-NATed flow");
    assert_eq!(fwd.snat_addr_be, addr6_be(NODE.octets()));
    u16::from_be(fwd.snat_port_be)
}

#[test]
fn remote_ipv6_backend_gets_dnat_and_snat_and_its_reply_goes_back_out() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, Some(NODE));
            standard(&mut fx);
            for (i, proto) in [PROTO_TCP, PROTO_UDP].into_iter().enumerate() {
                let sport = 43000 + i as u16;
                let mk = |src, sp, dst, dp| match proto {
                    PROTO_TCP => Packet6::tcp(src, sp, dst, dp),
                    _ => Packet6::udp(src, sp, dst, dp),
                };
                let input = from_client(mk(CLIENT, sport, NODE, REMOTE_PORT));
                let (verdict, out) = fx.run(prog, &input.build());
                let port = snat_port(&fx, proto, sport, REMOTE_PORT);
                assert!(snat::is_snat_port(port), "{port}");
                assert_eq!(sport_of(&out), port);
                let want = Packet6 {
                    src: NODE,
                    sport: port,
                    dst: POD_REMOTE,
                    dport: POD_PORT,
                    ..input.clone()
                };
                let want = with_hop_limit(want.build(), 63);
                match prog {
                    Prog::Xdp => {
                        assert_eq!(verdict, XDP_TX, "{prog:?} proto {proto}");
                        assert_eq!(
                            out,
                            with_macs(want, GATEWAY_MAC, UPLINK_MAC),
                            "{prog:?} proto {proto}"
                        );
                    }
                    Prog::Tc => {
                        assert_eq!(verdict, TC_ACT_REDIRECT, "{prog:?} proto {proto}");
                        assert_eq!(out, want, "{prog:?} proto {proto}");
                    }
                }
                assert!(checksums_valid6(&out, false), "{prog:?} proto {proto}");

                // The remote backend's reply to the SNAT port: both
                // translations reversed, sent to the client.
                let mut reply = Packet6 {
                    src_mac: GATEWAY_MAC,
                    dst_mac: UPLINK_MAC,
                    ..mk(POD_REMOTE, POD_PORT, NODE, port)
                };
                reply.tcp_flags = TCP_SYN | TCP_ACK;
                let (verdict, out) = fx.run(prog, &reply.build());
                let want = Packet6 {
                    src: NODE,
                    sport: REMOTE_PORT,
                    dst: CLIENT,
                    dport: sport,
                    ..reply.clone()
                };
                let want = with_hop_limit(want.build(), 63);
                match prog {
                    Prog::Xdp => {
                        assert_eq!(verdict, XDP_TX, "{prog:?} proto {proto}: reply");
                        assert_eq!(
                            out,
                            with_macs(want, CLIENT_MAC, UPLINK_MAC),
                            "{prog:?} proto {proto}: reply"
                        );
                    }
                    Prog::Tc => {
                        assert_eq!(verdict, TC_ACT_REDIRECT, "{prog:?} proto {proto}: reply");
                        assert_eq!(out, want, "{prog:?} proto {proto}: reply");
                    }
                }
            }
            assert_eq!(fx.stat("ext_remote"), 2, "{prog:?}");
            assert_eq!(fx.stat("ext_reply"), 2, "{prog:?}");
        }
    });
}

#[test]
fn xdp_leaves_an_ipv6_remote_flow_without_next_hop_neighbour_to_the_tc_twin() {
    THIS_NODE.run(|node| {
        let mut fx = uplinked(node, Some(NODE));
        standard(&mut fx);
        let input = from_client(Packet6::tcp(CLIENT, 44000, NODE, UNRESOLVED_PORT)).build();
        let (verdict, out) = fx.run(Prog::Xdp, &input);
        assert_eq!(verdict, XDP_PASS);
        assert_eq!(out, input, "handed on untranslated");
        assert_eq!(fx.stat("xdp_to_tc"), 1);
        // tc translates it from the same entry and lets the kernel resolve
        // the neighbour.
        let port = snat_port(&fx, PROTO_TCP, 44000, UNRESOLVED_PORT);
        let (verdict, out) = fx.run(Prog::Tc, &input);
        assert_eq!(verdict, TC_ACT_REDIRECT);
        assert_eq!(sport_of(&out), port, "the port XDP chose");
        assert_eq!(dst_of(&out), (POD_UNRESOLVED, POD_PORT));
        assert!(checksums_valid6(&out, false));
    });
}

#[test]
fn remote_ipv6_backend_without_an_uplink_ipv6_address_is_dropped_and_counted() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, None);
            standard(&mut fx);
            let input = from_client(Packet6::tcp(CLIENT, 45000, NODE, REMOTE_PORT)).build();
            let (verdict, _) = fx.run(prog, &input);
            assert_eq!(verdict, prog.dropped(), "{prog:?}");
            assert_eq!(fx.stat("no_route"), 1, "{prog:?}");
            // Local backends are still served.
            let input = from_client(Packet6::tcp(CLIENT, 45001, NODE, NODE_PORT)).build();
            let (verdict, out) = fx.run(prog, &input);
            assert_eq!(verdict, prog.delivered());
            assert_eq!(dst_of(&out), (POD_LOCAL, POD_PORT));
            let entry = fx
                .uplink6_entry(node.uplink)
                .expect("the uplink's IPv6 entry");
            assert_eq!(entry.addr_be, [0; 4], "written without an address");
        }
    });
}

#[test]
fn ipv6_hop_limit_1_to_a_remote_backend_is_not_forwarded() {
    THIS_NODE.run(|node| {
        let mut fx = uplinked(node, Some(NODE));
        standard(&mut fx);
        let input = with_hop_limit(
            from_client(Packet6::tcp(CLIENT, 46000, NODE, REMOTE_PORT)).build(),
            1,
        );
        let (verdict, out) = fx.run(Prog::Xdp, &input);
        assert_eq!(verdict, XDP_PASS, "XDP hands it to tc");
        assert_eq!(out, input);
        let (verdict, _) = fx.run(Prog::Tc, &input);
        assert_eq!(verdict, TC_ACT_SHOT, "tc drops it (hop limit exceeded)");
        assert_eq!(fx.stat("ttl_exceeded"), 1);
    });
}

/// A frame's bytes after the Ethernet header, with hop limit `hop_limit`:
/// what an ICMPv6 error quotes.
fn quote_of(p: &Packet6, hop_limit: u8) -> Vec<u8> {
    with_hop_limit(p.build(), hop_limit)[14..].to_vec()
}

#[test]
fn icmpv6_errors_about_a_remote_flow_reach_the_client_translated() {
    THIS_NODE.run(|node| {
        let mut fx = uplinked(node, Some(NODE));
        standard(&mut fx);
        for (i, proto) in [PROTO_TCP, PROTO_UDP].into_iter().enumerate() {
            let sport = 48000 + i as u16;
            let mk = |src, sp, dst, dp| match proto {
                PROTO_TCP => Packet6::tcp(src, sp, dst, dp),
                _ => Packet6::udp(src, sp, dst, dp),
            };
            let client_sent = from_client(mk(CLIENT, sport, NODE, REMOTE_PORT));
            let (verdict, _) = fx.run(Prog::Tc, &client_sent.build());
            assert_eq!(verdict, TC_ACT_REDIRECT);
            let port = snat_port(&fx, proto, sport, REMOTE_PORT);
            let as_sent = mk(NODE, port, POD_REMOTE, POD_PORT);
            // A router on the way (the gateway) says "packet too big"; the
            // backend itself says "port unreachable".
            for (from, icmp_type, code, rest) in
                [(GATEWAY, 2u8, 0u8, 1280u32), (POD_REMOTE, 1, 4, 0)]
            {
                let error = icmp6_frame_macs(
                    GATEWAY_MAC,
                    UPLINK_MAC,
                    from,
                    NODE,
                    icmp_type,
                    code,
                    rest,
                    &quote_of(&as_sent, 63),
                );
                let xdp_before = fx.stat("icmp_error_translated");
                let (verdict, out) = fx.run(Prog::Xdp, &error);
                assert_eq!(
                    (verdict, &out),
                    (XDP_PASS, &error),
                    "XDP hands ICMPv6 to tc untouched"
                );
                assert_eq!(fx.stat("icmp_error_translated"), xdp_before);
                let (verdict, out) = fx.run(Prog::Tc, &error);
                assert_eq!(verdict, TC_ACT_REDIRECT, "proto {proto} type {icmp_type}");
                let outer_src = if from == POD_REMOTE { NODE } else { from };
                let want = with_hop_limit(
                    icmp6_frame_macs(
                        GATEWAY_MAC,
                        UPLINK_MAC,
                        outer_src,
                        CLIENT,
                        icmp_type,
                        code,
                        rest,
                        &quote_of(&client_sent, 63),
                    ),
                    63,
                );
                assert_eq!(out, want, "proto {proto} type {icmp_type}: translated back");
                assert!(checksums_valid6(&out, false));
                assert_eq!(fx.stat("icmp_error_translated"), xdp_before + 1);
            }
        }
        // An error about a flow we do not know passes untouched.
        let unknown = mk_unknown_error();
        let (verdict, out) = fx.run(Prog::Tc, &unknown);
        assert_eq!((verdict, out), (TC_ACT_UNSPEC, unknown));
    });
}

fn mk_unknown_error() -> Vec<u8> {
    let as_sent = Packet6::tcp(NODE, 2000, POD_REMOTE, POD_PORT);
    icmp6_frame_macs(
        GATEWAY_MAC,
        UPLINK_MAC,
        GATEWAY,
        NODE,
        2,
        0,
        1280,
        &quote_of(&as_sent, 63),
    )
}

// ---------------------------------------------------------------------------
// Maglev and source hashing: the kernel picks what userspace predicts.

const MAGLEV_PORT: u16 = 30090;
const SOURCE_HASH_PORT: u16 = 30091;
const MAGLEV_SERVICE: u32 = 20;
const SOURCE_HASH_SERVICE: u32 = 21;

/// Four backends on this node (fd00:244:1::10 ..= ::13), ids 201..=204.
fn hashed_backends() -> Vec<(u32, Ipv6Addr)> {
    (0..4u16)
        .map(|i| {
            (
                201 + u32::from(i),
                Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 0x10 + i),
            )
        })
        .collect()
}

/// The service's Maglev table, built as the agent builds it (from the
/// backends' addresses, written with their ids), written to `SB_MAGLEV_V1`.
/// Returns the table (backend ids by slot) for the predictions.
fn write_maglev_table(fx: &mut Loaded, service_id: u32, backends: &[(u32, Ipv6Addr)]) -> Vec<u32> {
    let keys: Vec<BackendKey> = backends
        .iter()
        .map(|&(_, a)| BackendKey::new(IpAddr::V6(a), POD_PORT, PROTO_TCP))
        .collect();
    let canonical = maglev::canonical_backends(&keys);
    let entries = maglev::table(&canonical, capacity::MAGLEV_TABLE).expect("a Maglev table");
    let id_of =
        |k: &BackendKey| backends[keys.iter().position(|x| x == k).expect("a known backend")].0;
    let ids: Vec<u32> = entries
        .iter()
        .map(|&i| id_of(&canonical[usize::from(i)]))
        .collect();
    let mut table = Box::new(MaglevTable {
        backend_ids: [0; capacity::MAGLEV_TABLE as usize],
    });
    table.backend_ids.copy_from_slice(&ids);
    fx.syncer
        .store_mut()
        .maglev
        .insert(service_id, table.as_ref(), 0)
        .expect("write the Maglev table");
    ids
}

fn addr_of(backends: &[(u32, Ipv6Addr)], id: u32) -> Ipv6Addr {
    backends
        .iter()
        .find(|b| b.0 == id)
        .expect("a backend of the set")
        .1
}

#[test]
fn maglev_ipv6_frontend_from_outside_picks_the_backend_the_userspace_hash_and_table_predict() {
    THIS_NODE.run(|node| {
        let backends = hashed_backends();
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, Some(NODE));
            fx.maps6.write(&Fe6 {
                addr: NODE,
                port: MAGLEV_PORT,
                proto: PROTO_TCP,
                service_id: MAGLEV_SERVICE,
                kind: frontend_flags::KIND_NODE_PORT | frontend_flags::ALGO_MAGLEV,
                backend_port: POD_PORT,
                backends: &backends,
                local: None,
            });
            let table = write_maglev_table(&mut fx, MAGLEV_SERVICE, &backends);
            let client_be = addr6_be(CLIENT.octets());
            let node_be = addr6_be(NODE.octets());
            let mut picked = std::collections::HashSet::new();
            for sport in 41000..41024u16 {
                let hash = flow_hash6(
                    &client_be,
                    &node_be,
                    sport.to_be(),
                    MAGLEV_PORT.to_be(),
                    PROTO_TCP,
                );
                let want = addr_of(&backends, table[(hash % capacity::MAGLEV_TABLE) as usize]);
                let input = from_client(Packet6::tcp(CLIENT, sport, NODE, MAGLEV_PORT));
                let (verdict, out) = fx.run(prog, &input.build());
                assert_eq!(verdict, prog.delivered(), "{prog:?} sport {sport}");
                assert_eq!(
                    dst_of(&out),
                    (want, POD_PORT),
                    "{prog:?} sport {sport}: the predicted backend"
                );
                assert!(checksums_valid6(&out, false));
                picked.insert(want);
            }
            // The prediction is not one backend for everything: the flows
            // spread, so a random pick would have missed it.
            assert!(
                picked.len() >= 3,
                "{prog:?}: {} backends over 24 flows",
                picked.len()
            );

            // Conntrack keeps a flow where it is, even when the table changes.
            let sport: u16 = 41000;
            let hash = flow_hash6(
                &client_be,
                &node_be,
                sport.to_be(),
                MAGLEV_PORT.to_be(),
                PROTO_TCP,
            );
            let first = addr_of(&backends, table[(hash % capacity::MAGLEV_TABLE) as usize]);
            let other = backends
                .iter()
                .find(|b| b.1 != first)
                .expect("another backend");
            let moved = Box::new(MaglevTable {
                backend_ids: [other.0; capacity::MAGLEV_TABLE as usize],
            });
            fx.syncer
                .store_mut()
                .maglev
                .insert(MAGLEV_SERVICE, moved.as_ref(), 0)
                .expect("rewrite");
            let mut next = from_client(Packet6::tcp(CLIENT, sport, NODE, MAGLEV_PORT));
            next.tcp_flags = TCP_ACK;
            let (verdict, out) = fx.run(prog, &next.build());
            assert_eq!(verdict, prog.delivered());
            assert_eq!(
                dst_of(&out),
                (first, POD_PORT),
                "{prog:?}: a tracked flow keeps its backend"
            );
            // A new flow follows the new table.
            let fresh = from_client(Packet6::tcp(CLIENT, 42000, NODE, MAGLEV_PORT));
            let (_, out) = fx.run(prog, &fresh.build());
            assert_eq!(
                dst_of(&out),
                (other.1, POD_PORT),
                "{prog:?}: a new flow uses the table"
            );
        }
    });
}

#[test]
fn source_hash_ipv6_frontend_keeps_one_client_on_one_backend_across_source_ports() {
    THIS_NODE.run(|node| {
        let backends = hashed_backends();
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, Some(NODE));
            fx.maps6.write(&Fe6 {
                addr: NODE,
                port: SOURCE_HASH_PORT,
                proto: PROTO_TCP,
                service_id: SOURCE_HASH_SERVICE,
                kind: frontend_flags::KIND_NODE_PORT | frontend_flags::ALGO_SOURCE_HASH,
                backend_port: POD_PORT,
                backends: &backends,
                local: None,
            });
            let table = write_maglev_table(&mut fx, SOURCE_HASH_SERVICE, &backends);
            let mut per_client = std::collections::HashSet::new();
            for c in 0..12u16 {
                let client = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 1, c);
                let hash = source_hash6(&addr6_be(client.octets()));
                let want = addr_of(&backends, table[(hash % capacity::MAGLEV_TABLE) as usize]);
                for sport in [40001u16, 40002, 51234, 65000] {
                    let input = from_client(Packet6::tcp(client, sport, NODE, SOURCE_HASH_PORT));
                    let (verdict, out) = fx.run(prog, &input.build());
                    assert_eq!(verdict, prog.delivered(), "{prog:?} {client} sport {sport}");
                    assert_eq!(
                        dst_of(&out),
                        (want, POD_PORT),
                        "{prog:?} {client} sport {sport}"
                    );
                }
                per_client.insert(want);
            }
            assert!(
                per_client.len() >= 2,
                "{prog:?}: twelve clients all on one backend"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// Reject: a frontend without any endpoint answers a client from outside.

const EMPTY_PORT: u16 = 30092;
const EMPTY_TCP_SERVICE: u32 = 22;
const EMPTY_UDP_SERVICE: u32 = 23;

#[test]
fn an_ipv6_frontend_without_endpoints_answers_outside_clients_with_rst_or_port_unreachable() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, Some(NODE));
            standard(&mut fx);
            for (proto, sid) in [
                (PROTO_TCP, EMPTY_TCP_SERVICE),
                (PROTO_UDP, EMPTY_UDP_SERVICE),
            ] {
                fx.maps6.write(&Fe6 {
                    addr: NODE,
                    port: EMPTY_PORT,
                    proto,
                    service_id: sid,
                    kind: frontend_flags::KIND_NODE_PORT,
                    backend_port: POD_PORT,
                    backends: &[],
                    local: None,
                });
            }
            let syn = from_client(Packet6::tcp(CLIENT, 40200, NODE, EMPTY_PORT));
            let rst_ack = Packet6 {
                tcp_flags: TCP_RST | TCP_ACK,
                seq: 0,
                ack: syn.seq + 1,
                window: 0,
                src_mac: UPLINK_MAC,
                dst_mac: CLIENT_MAC,
                ..Packet6::tcp(NODE, EMPTY_PORT, CLIENT, 40200)
            };
            let udp = from_client(Packet6::udp(CLIENT, 40201, NODE, EMPTY_PORT));
            let udp_frame = udp.build();
            let unreachable = icmp6_frame_macs(
                UPLINK_MAC,
                CLIENT_MAC,
                NODE,
                CLIENT,
                1,
                4,
                0,
                &udp_frame[14..14 + 48],
            );
            let a_rst = from_client(Packet6 {
                tcp_flags: TCP_RST,
                ..Packet6::tcp(CLIENT, 40202, NODE, EMPTY_PORT)
            });
            // Under `externalTrafficPolicy: Local` without a local endpoint
            // (the Service has one elsewhere) the packet drops, unanswered.
            let local_empty = from_client(Packet6::tcp(CLIENT, 40203, NODE, EMPTY_LOCAL_PORT));
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

// ---------------------------------------------------------------------------
// loadBalancerSourceRanges over IPv6: the same trie lookup as IPv4, keyed by
// service id and the 128-bit source.

#[test]
fn ipv6_load_balancer_source_ranges_admit_only_listed_clients() {
    use proxy_user::sync::store::MapStore as _;
    const OUTSIDER: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x51, 0, 0, 0, 0, 0, 0x100);
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, Some(NODE));
            let ranged = frontend_flags::KIND_LOAD_BALANCER | frontend_flags::SOURCE_RANGES;
            for (port, service_id, blocks) in [
                (443, 30, vec!["fd00:50::/64", "fd00:52::1/128"]),
                (444, 31, vec!["::/0"]),
                (445, 32, vec![]),
            ] {
                fx.maps6.write(&Fe6 {
                    addr: LB_IP,
                    port,
                    proto: PROTO_TCP,
                    service_id,
                    kind: ranged,
                    backend_port: POD_PORT,
                    backends: &[(100 + service_id, POD_LOCAL)],
                    local: None,
                });
                for block in blocks {
                    let block = block.parse().expect("a CIDR");
                    fx.syncer
                        .store_mut()
                        .put_source_range(service_id, block)
                        .expect("write a block");
                }
            }
            let mut sport = 41000;
            for (what, src, port, allowed) in [
                ("inside the /64", CLIENT, 443, true),
                (
                    "the /128",
                    Ipv6Addr::new(0xfd00, 0x52, 0, 0, 0, 0, 0, 1),
                    443,
                    true,
                ),
                ("outside every block", OUTSIDER, 443, false),
                ("inside ::/0", OUTSIDER, 444, true),
                ("with an empty list", CLIENT, 445, false),
            ] {
                sport += 1;
                let input = from_client(Packet6::tcp(src, sport, LB_IP, port));
                let (verdict, out) = fx.run(prog, &input.build());
                if allowed {
                    let want = Packet6 {
                        dst: POD_LOCAL,
                        dport: POD_PORT,
                        ..input.clone()
                    };
                    assert_eq!(
                        (verdict, out),
                        (prog.delivered(), want.build()),
                        "{prog:?}: {src} {what}"
                    );
                } else {
                    assert_eq!(
                        (verdict, out),
                        (prog.dropped(), input.build()),
                        "{prog:?}: {src} {what}"
                    );
                }
            }
            let denied = fx.syncer.store().denied_by_service();
            assert_eq!(denied.get(&30), Some(&1), "{prog:?}: {denied:?}");
            assert_eq!(denied.get(&32), Some(&1), "{prog:?}: {denied:?}");
            assert_eq!(denied.get(&31), None, "{prog:?}: {denied:?}");
        }
    });
}

// ---------------------------------------------------------------------------
// Direct server return (`--nodeport-mode dsr`): the frontend in a
// destination options header.

/// The frontend's node of a flow returned directly to a backend here.
const BALANCER: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 9);

/// `frame` (no extension headers) with the destination options header
/// naming frontend `addr:port` after its fixed header.
fn with_dsr_header(frame: Vec<u8>, addr: Ipv6Addr, port: u16) -> Vec<u8> {
    let mut hdr = vec![
        frame[20],
        dsr::HDR6_EXT_LEN,
        dsr::OPT6_TYPE,
        dsr::OPT6_DATA_LEN,
    ];
    hdr.extend_from_slice(&port.to_be_bytes());
    hdr.extend_from_slice(&[0, 0]);
    hdr.extend_from_slice(&addr.octets());
    let mut out = frame[..54].to_vec();
    out[20] = NEXTHDR_DEST;
    let len = u16::from_be_bytes([out[18], out[19]]) + u16::from(dsr::HDR6_LEN);
    out[18..20].copy_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&hdr);
    out.extend_from_slice(&frame[54..]);
    out
}

/// The uplink with IPv6 address NODE, accepting the option (`dsr` mode).
fn returning_directly(node: &Node) -> Loaded {
    let mut fx = uplinked(node, Some(NODE));
    fx.set_uplink_flags(
        node.uplink,
        Ipv4Addr::new(192, 168, 50, 1),
        uplink_flags::DSR_ACCEPT,
    );
    fx
}

/// A NodePort of `proto` to POD_REMOTE whose flows are returned directly.
fn direct_frontend(fx: &mut Loaded, proto: u8, service_id: u32) {
    fx.maps6.write(&Fe6 {
        addr: NODE,
        port: REMOTE_PORT,
        proto,
        service_id,
        kind: frontend_flags::KIND_NODE_PORT | frontend_flags::DIRECT_RETURN,
        backend_port: POD_PORT,
        backends: &[(100 + service_id, POD_REMOTE)],
        local: None,
    });
}

#[test]
fn an_ipv6_remote_flow_is_returned_directly_with_the_frontend_in_a_destination_option() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = returning_directly(node);
            for (i, proto) in [PROTO_TCP, PROTO_UDP].into_iter().enumerate() {
                direct_frontend(&mut fx, proto, 1 + i as u32);
                let sport = 43100 + i as u16;
                let case = format!("{prog:?} proto {proto}");
                let input = from_client(match proto {
                    PROTO_TCP => Packet6::tcp(CLIENT, sport, NODE, REMOTE_PORT),
                    _ => Packet6::udp(CLIENT, sport, NODE, REMOTE_PORT),
                });
                let (verdict, out) = fx.run(prog, &input.build());
                let translated = Packet6 {
                    dst: POD_REMOTE,
                    dport: POD_PORT,
                    ..input.clone()
                };
                let want =
                    with_dsr_header(with_hop_limit(translated.build(), 63), NODE, REMOTE_PORT);
                match prog {
                    Prog::Xdp => {
                        assert_eq!(verdict, XDP_TX, "{case}");
                        assert_eq!(out, with_macs(want, GATEWAY_MAC, UPLINK_MAC), "{case}");
                    }
                    Prog::Tc => {
                        assert_eq!(verdict, TC_ACT_REDIRECT, "{case}");
                        assert_eq!(out, want, "{case}");
                    }
                }
                let fwd = client_entry(&fx, proto, sport, REMOTE_PORT);
                assert_eq!(fwd.flags & ct_flags::SNAT, 0, "{case}: {fwd:?}");
                assert_ne!(fwd.flags & ct_flags::DSR_BALANCED, 0, "{case}: {fwd:?}");
            }
            assert_eq!(fx.stat("ext_remote"), 2, "{prog:?}");
        }
    });
}

#[test]
fn an_ipv6_flow_returned_directly_arrives_tracked_and_its_replies_leave_from_the_frontend() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            for (i, proto) in [PROTO_TCP, PROTO_UDP].into_iter().enumerate() {
                let case = format!("{prog:?} proto {proto}");
                let mut fx = returning_directly(node);
                let sport = 43200 + i as u16;
                let sent = from_client(match proto {
                    PROTO_TCP => Packet6::tcp(CLIENT, sport, POD_LOCAL, POD_PORT),
                    _ => Packet6::udp(CLIENT, sport, POD_LOCAL, POD_PORT),
                });
                let arriving = with_dsr_header(sent.build(), BALANCER, NODE_PORT);
                let (verdict, out) = fx.run(prog, &arriving);
                assert_eq!(
                    (verdict, out),
                    (prog.delivered(), arriving.clone()),
                    "{case}: delivered unchanged"
                );
                let key = ct_key6(CLIENT, sport, BALANCER, NODE_PORT, proto, ct_dir::FORWARD);
                if !prog.tracks_dsr_arrivals() {
                    assert!(fx.maps6.ct(&key).is_none(), "{case}: left to tc");
                    continue;
                }
                let fwd = fx.maps6.ct(&key).expect("forward entry, by the frontend");
                assert_ne!(fwd.flags & ct_flags::DSR_ARRIVED, 0, "{case}: {fwd:?}");
                assert_eq!(fwd.nat_addr_be, addr6_be(POD_LOCAL.octets()), "{case}");

                let mut reply = match proto {
                    PROTO_TCP => Packet6::tcp(POD_LOCAL, POD_PORT, CLIENT, sport),
                    _ => Packet6::udp(POD_LOCAL, POD_PORT, CLIENT, sport),
                };
                reply.tcp_flags = if proto == PROTO_TCP {
                    TCP_SYN | TCP_ACK
                } else {
                    0
                };
                let (verdict, out) = fx.run_egress(&reply.build());
                assert_eq!(verdict, TC_ACT_OK, "{case}: reply");
                let want = Packet6 {
                    src: BALANCER,
                    sport: NODE_PORT,
                    ..reply.clone()
                };
                assert_eq!(out, want.build(), "{case}: reply from the frontend");
                assert!(checksums_valid6(&out, false), "{case}");
            }
        }
    });
}

#[test]
fn an_ipv6_packet_too_large_for_the_option_is_answered_with_packet_too_big() {
    THIS_NODE.run(|node| {
        let mut fx = returning_directly(node);
        direct_frontend(&mut fx, PROTO_UDP, 1);
        // 1500 bytes of IPv6: the route's MTU, with no room for the header.
        let mut big = from_client(Packet6::udp(CLIENT, 43300, NODE, REMOTE_PORT));
        big.payload = vec![0x5a; 1500 - 40 - 8];
        let frame = big.build();
        assert_eq!(fx.run(Prog::Xdp, &frame), (XDP_PASS, frame.clone()));
        let (verdict, out) = fx.run(Prog::Tc, &frame);
        assert_eq!(verdict, TC_ACT_REDIRECT);
        let mtu = 1500 - u32::from(dsr::HDR6_LEN);
        let want = icmp6_frame_macs(
            UPLINK_MAC,
            CLIENT_MAC,
            NODE,
            CLIENT,
            2,
            0,
            mtu,
            &frame[14..14 + 56],
        );
        assert_eq!(out, want, "packet too big from the frontend");
        assert_eq!(fx.stat("rejected"), 1);
        assert_eq!(fx.stat("ext_remote"), 0);
    });
}
