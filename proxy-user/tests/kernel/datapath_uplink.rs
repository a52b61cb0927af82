//! Packet fixtures for the uplink (north-south) programs through
//! BPF_PROG_TEST_RUN: `sb_xdp_uplink` (XDP) and its tc twin `sb_from_uplink`.
//! Each case feeds a frame as if it arrived on an uplink and checks the
//! verdict and the exact output frame (checksums included, compared with a
//! frame built from scratch), the way Katran's tests do. Needs root.
//!
//! Whether a backend is local or on another node is decided by a route lookup
//! (`bpf_fib_lookup`), so every test runs on a thread of its own that first
//! moves into a private network namespace (`unshare(CLONE_NEWNET)` affects the
//! calling thread only, and the `ip` commands it spawns inherit it). There it
//! builds a node:
//!
//! ```text
//! up0  (veth, 02:00:00:00:50:01) 192.168.50.1/24, forwarding on   <- the uplink
//!      neighbours 192.168.50.2 (gateway to other nodes) and 192.168.50.100 (client)
//!      route 10.244.2.0/24 via 192.168.50.2   (POD_REMOTE: another node)
//!      route 10.244.3.0/24 via 192.168.50.3   (a gateway without neighbour entry)
//! pod0 (veth)  route 10.244.1.0/24            (POD_LOCAL: a pod on this node)
//! ```
//!
//! The namespace goes away with the thread (every `ip` child is waited for).
//! Nothing here touches the namespace the tests were started in.
use std::net::Ipv4Addr;

use crate::support::{
    be32,
    netns::{self, Node, NodeSpec},
    rewritten, rewritten_checksums, with, Case, Loaded, Uplink as Prog, TC_ACT_OK, TC_ACT_REDIRECT,
    TC_ACT_SHOT, TC_ACT_UNSPEC, XDP_DROP, XDP_PASS, XDP_TX,
};
use proxy_common::{
    ct_dir, ct_flags, ct_state, dsr, proto, scope, snat, uplink_flags, CtEntry, CtKey,
};
use proxy_testkit::packet::{
    checksum, checksums_valid, icmp_checksums_valid, icmp_error_checksums_valid,
    icmp_fragmentation_needed, icmp_frame, PacketSpec, ETH_HLEN,
};
use proxy_user::{
    model::cidr::IpCidr,
    model::{BackendAddr, DesiredState, Frontend, FrontendKind, Protocol, SourceRanges},
    sync::store::MapStore,
};

/// The node's address on its uplink `up0`.
const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
const UPLINK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x50, 0x01];
/// The next hop to the other nodes' pods.
const GATEWAY: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
const GATEWAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// A client outside the node, on the uplink's subnet.
const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 100);
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
/// A pod on this node (routed through `pod0`, not an uplink).
const POD_LOCAL: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
/// A pod on another node (routed through the uplink, via GATEWAY).
const POD_REMOTE: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
/// A pod on another node whose gateway has no neighbour entry.
const POD_UNRESOLVED: Ipv4Addr = Ipv4Addr::new(10, 244, 3, 2);
/// A pod of this node acting as an in-cluster client.
const POD_CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 50);
const LB_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 60, 10);
const EXTERNAL_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 70, 10);
const NODE_PORT: u16 = 30080;
const POD_PORT: u16 = 8080;

/// The node: see the module documentation.
const THIS_NODE: NodeSpec<Ipv4Addr> = NodeSpec {
    uplink_mac: UPLINK_MAC,
    addr: NODE,
    prefix_len: 24,
    neighbours: &[(GATEWAY, GATEWAY_MAC), (CLIENT, CLIENT_MAC)],
    routes: &[
        ("10.244.2.0/24", Some(GATEWAY)),
        ("10.244.3.0/24", Some(Ipv4Addr::new(192, 168, 50, 3))),
        ("10.244.1.0/24", None),
    ],
};

// ---------------------------------------------------------------------------
// Frontends and the loaded programs.

/// A frontend of `test/name` balancing over `backends`, each on POD_PORT.
fn frontend(
    kind: FrontendKind,
    ip: Ipv4Addr,
    port: u16,
    protocol: Protocol,
    name: &str,
    backends: &[Ipv4Addr],
) -> Frontend {
    let backends: Vec<_> = backends.iter().map(|&ip| (ip, POD_PORT)).collect();
    crate::support::frontend(kind, ip, port, protocol, name, &backends)
}

/// `externalTrafficPolicy: Local` with `external` as this node's endpoints.
fn local_policy(mut fe: Frontend, external: &[Ipv4Addr]) -> Frontend {
    fe.local_only = true;
    fe.external_backends = Some(
        external
            .iter()
            .map(|ip| BackendAddr {
                ip: (*ip).into(),
                port: POD_PORT,
            })
            .collect(),
    );
    fe
}

/// Loads the programs (in the calling thread's namespace), programs
/// `frontends` and makes `up0` the node's uplink with address NODE.
fn uplinked(node: &Node, frontends: Vec<Frontend>) -> Loaded {
    Loaded::on_uplink(node, NODE, frontends)
}

// ---------------------------------------------------------------------------
// Frames.

/// `frame` with TTL `ttl`, its IPv4 header checksum computed from scratch.
fn with_ttl(mut frame: Vec<u8>, ttl: u8) -> Vec<u8> {
    let ihl = usize::from(frame[ETH_HLEN] & 0x0f) * 4;
    frame[ETH_HLEN + 8] = ttl;
    frame[ETH_HLEN + 10..ETH_HLEN + 12].fill(0);
    let csum = checksum(&frame[ETH_HLEN..ETH_HLEN + ihl], 0);
    frame[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&csum.to_be_bytes());
    frame
}

/// `frame` with new destination and source MAC addresses.
fn with_macs(mut frame: Vec<u8>, dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame
}

/// What a router sends on: TTL one less, MACs of the next hop.
fn routed(frame: Vec<u8>, next_hop_mac: [u8; 6]) -> Vec<u8> {
    let ttl = frame[ETH_HLEN + 8];
    with_macs(with_ttl(frame, ttl - 1), next_hop_mac, UPLINK_MAC)
}

fn src_of(frame: &[u8]) -> (Ipv4Addr, u16) {
    let ip = &frame[ETH_HLEN..];
    let l4 = &ip[usize::from(ip[0] & 0x0f) * 4..];
    (
        Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
        u16::from_be_bytes([l4[0], l4[1]]),
    )
}

fn dst_of(frame: &[u8]) -> (Ipv4Addr, u16) {
    let ip = &frame[ETH_HLEN..];
    let l4 = &ip[usize::from(ip[0] & 0x0f) * 4..];
    (
        Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        u16::from_be_bytes([l4[2], l4[3]]),
    )
}

fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => proto::TCP,
        Protocol::Udp => proto::UDP,
    }
}

fn spec(protocol: Protocol, src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> PacketSpec {
    match protocol {
        Protocol::Tcp => PacketSpec::tcp(src, sport, dst, dport),
        Protocol::Udp => PacketSpec::udp(src, sport, dst, dport),
    }
}

// ---------------------------------------------------------------------------
// 1, 2: a backend on this node: DNAT only.

#[test]
fn outside_clients_reach_a_local_backend_by_dnat_only() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(
                node,
                vec![
                    frontend(
                        FrontendKind::NodePort,
                        NODE,
                        NODE_PORT,
                        Protocol::Tcp,
                        "np-tcp",
                        &[POD_LOCAL],
                    ),
                    frontend(
                        FrontendKind::NodePort,
                        NODE,
                        NODE_PORT,
                        Protocol::Udp,
                        "np-udp",
                        &[POD_LOCAL],
                    ),
                    frontend(
                        FrontendKind::LoadBalancer,
                        LB_IP,
                        443,
                        Protocol::Tcp,
                        "lb",
                        &[POD_LOCAL],
                    ),
                    frontend(
                        FrontendKind::ExternalIp,
                        EXTERNAL_IP,
                        53,
                        Protocol::Udp,
                        "ext",
                        &[POD_LOCAL],
                    ),
                    frontend(
                        FrontendKind::ExternalIp,
                        EXTERNAL_IP,
                        80,
                        Protocol::Tcp,
                        "ext-tcp",
                        &[POD_LOCAL],
                    ),
                ],
            );
            let flows = [
                (
                    "NodePort TCP",
                    PacketSpec::tcp(CLIENT, 40000, NODE, NODE_PORT),
                ),
                (
                    "NodePort UDP",
                    PacketSpec::udp(CLIENT, 40001, NODE, NODE_PORT),
                ),
                (
                    "NodePort UDP without checksum",
                    PacketSpec {
                        udp_zero_checksum: true,
                        ..PacketSpec::udp(CLIENT, 40002, NODE, NODE_PORT)
                    },
                ),
                (
                    "NodePort TCP with IPv4 options",
                    PacketSpec {
                        ip_option_words: 2,
                        ..PacketSpec::tcp(CLIENT, 40003, NODE, NODE_PORT)
                    },
                ),
                (
                    "LoadBalancer IP TCP",
                    PacketSpec::tcp(CLIENT, 40004, LB_IP, 443),
                ),
                (
                    "external IP UDP",
                    PacketSpec::udp(CLIENT, 40005, EXTERNAL_IP, 53),
                ),
                (
                    "external IP TCP",
                    PacketSpec::tcp(CLIENT, 40006, EXTERNAL_IP, 80),
                ),
            ];
            let cases: Vec<Case> = flows
                .iter()
                .map(|(name, p)| Case {
                    hook: prog.into(),
                    name: format!("{name} to a local backend is DNATed only"),
                    input: p.build(),
                    verdict: prog.delivered(),
                    // Source, TTL and MACs stay: the kernel delivers it.
                    output: rewritten(p, |p| {
                        p.dst = POD_LOCAL;
                        p.dport = POD_PORT;
                    }),
                })
                .collect();
            fx.run_table(&cases, rewritten_checksums::<Ipv4Addr>);

            let n = flows.len() as u64;
            assert_eq!(fx.stat("ext_local"), n, "{prog:?}");
            assert_eq!(fx.stat("ext_remote"), 0, "{prog:?}");
            assert_eq!(
                fx.stat("forwarded"),
                0,
                "{prog:?}: not counted as pod traffic"
            );
            let np = fx.service_row("np-tcp");
            assert_eq!((np.packets, np.new_flows), (2, 2), "{prog:?}: {np:?}");
            assert_eq!(fx.service_row("lb").packets, 1, "{prog:?}");
            // Local flows are tracked without SNAT.
            let fwd = fx
                .ct(&CtKey {
                    saddr_be: be32(CLIENT),
                    daddr_be: be32(NODE),
                    sport_be: 40000u16.to_be(),
                    dport_be: NODE_PORT.to_be(),
                    proto: proto::TCP,
                    dir: ct_dir::FORWARD,
                    _pad: [0; 2],
                })
                .expect("forward entry of the NodePort TCP flow");
            assert_eq!(fwd.flags & ct_flags::SNAT, 0, "{prog:?}: {fwd:?}");
            assert_eq!(
                (fwd.nat_addr_be, fwd.nat_port_be),
                (be32(POD_LOCAL), POD_PORT.to_be())
            );

            // The pod's reply leaves through the uplink's tc egress
            // (`sb_to_pod`) with the NodePort as its source again.
            let reply = PacketSpec {
                tcp_flags: 0x12,
                ..PacketSpec::tcp(POD_LOCAL, POD_PORT, CLIENT, 40000)
            };
            let (verdict, out) = fx.run_egress(&reply.build());
            assert_eq!(verdict, TC_ACT_OK, "{prog:?}");
            assert_eq!(
                out,
                rewritten(&reply, |p| {
                    p.src = NODE;
                    p.sport = NODE_PORT;
                }),
                "{prog:?}: reply from the NodePort"
            );
            assert!(checksums_valid(&out));
        }
    });
}

// ---------------------------------------------------------------------------
// 3: externalTrafficPolicy: Local.

#[test]
fn local_policy_sends_outside_flows_only_to_local_endpoints_without_snat() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                let np = frontend(
                    FrontendKind::NodePort,
                    NODE,
                    NODE_PORT,
                    protocol,
                    "local",
                    &[POD_LOCAL, POD_REMOTE],
                );
                let lb = frontend(
                    FrontendKind::LoadBalancer,
                    LB_IP,
                    443,
                    protocol,
                    "local-lb",
                    &[POD_LOCAL, POD_REMOTE],
                );
                let mut fx = uplinked(
                    node,
                    vec![
                        local_policy(np, &[POD_LOCAL]),
                        local_policy(lb, &[POD_LOCAL]),
                    ],
                );
                let mut cases = Vec::new();
                for sport in 20000..20100u16 {
                    for (vip, vport) in [(NODE, NODE_PORT), (LB_IP, 443)] {
                        let p = spec(protocol, CLIENT, sport, vip, vport);
                        cases.push(Case {
                            hook: prog.into(),
                            name: format!("{protocol:?} {CLIENT}:{sport} -> {vip}:{vport}"),
                            input: p.build(),
                            verdict: prog.delivered(),
                            // The client's address is kept: the pod sees it.
                            output: rewritten(&p, |p| {
                                p.dst = POD_LOCAL;
                                p.dport = POD_PORT;
                            }),
                        });
                    }
                }
                fx.run_table(&cases, rewritten_checksums::<Ipv4Addr>);
                assert_eq!(fx.stat("ext_local"), 200, "{prog:?} {protocol:?}");
                assert_eq!(fx.stat("ext_remote"), 0, "{prog:?} {protocol:?}");

                // Pods of this node still get the cluster-wide set.
                let mut seen = std::collections::BTreeSet::new();
                for sport in 0..64u16 {
                    let (verdict, out) = fx.run_from_pod(
                        &spec(protocol, POD_CLIENT, 30000 + sport, NODE, NODE_PORT).build(),
                    );
                    assert_eq!(verdict, TC_ACT_OK);
                    seen.insert(dst_of(&out).0);
                }
                assert_eq!(
                    seen,
                    [POD_LOCAL, POD_REMOTE].into_iter().collect(),
                    "{prog:?} {protocol:?}: pod traffic uses both endpoints"
                );
            }
        }
    });
}

#[test]
fn local_policy_without_local_endpoints_drops_outside_traffic_only() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let np = frontend(
                FrontendKind::NodePort,
                NODE,
                NODE_PORT,
                Protocol::Tcp,
                "nolocal",
                &[POD_LOCAL, POD_REMOTE],
            );
            let mut fx = uplinked(node, vec![local_policy(np, &[])]);
            let p = PacketSpec::tcp(CLIENT, 40000, NODE, NODE_PORT);
            let q = PacketSpec::tcp(CLIENT, 40001, NODE, NODE_PORT);
            fx.run_table(
                &[
                    Case {
                        hook: prog.into(),
                        name: "no local endpoint: dropped".into(),
                        input: p.build(),
                        verdict: prog.dropped(),
                        output: p.build(),
                    },
                    Case {
                        hook: prog.into(),
                        name: "no local endpoint: another flow dropped too".into(),
                        input: q.build(),
                        verdict: prog.dropped(),
                        output: q.build(),
                    },
                ],
                rewritten_checksums::<Ipv4Addr>,
            );
            assert_eq!(fx.stat("drop_no_backend"), 2, "{prog:?}");
            assert_eq!(fx.stat("ext_local") + fx.stat("ext_remote"), 0, "{prog:?}");
            // The maps hold both sets: the internal one cluster-wide, the
            // external one empty. (Read from the maps directly: `switchboard
            // services` merges the two slot-0 entries, see the report.)
            let dump = fx.syncer.store().dump();
            let head = |scope| {
                dump.frontends
                    .iter()
                    .find(|(k, _)| k.slot() == 0 && k.scope() == scope)
                    .map(|(_, v)| *v)
            };
            let internal = head(scope::INTERNAL).expect("internal slot 0");
            assert_eq!(internal.backend_count, 2, "{prog:?}: {internal:?}");
            assert_eq!(
                head(scope::EXTERNAL).map_or(0, |v| v.backend_count),
                0,
                "{prog:?}: external set"
            );
            let backend_addr = |id: u32| {
                dump.backends
                    .iter()
                    .find(|(i, _)| *i == id)
                    .map(|(_, b)| proxy_user::sync::encode::backend_addr(b).ip)
            };
            let mut internal_set: Vec<Option<std::net::IpAddr>> = dump
                .frontends
                .iter()
                .filter(|(k, _)| k.scope() == scope::INTERNAL && k.slot() > 0)
                .map(|(_, v)| backend_addr(v.backend_id))
                .collect();
            internal_set.sort();
            assert_eq!(
                internal_set,
                vec![Some(POD_LOCAL.into()), Some(POD_REMOTE.into())],
                "{prog:?}"
            );
            assert!(
                !dump
                    .frontends
                    .iter()
                    .any(|(k, _)| k.scope() == scope::EXTERNAL && k.slot() > 0),
                "{prog:?}: the external set has no slots"
            );
            let svc = fx.syncer.store().service_stats(internal.service_id);
            assert_eq!(svc.drops_no_backend, 2, "{prog:?}: {svc:?}");
            // No flow was tracked for the dropped packets.
            assert_eq!(fx.syncer.store().conntrack_len(), 0, "{prog:?}");
            // A pod of this node reaches the same frontend.
            let (verdict, out) =
                fx.run_from_pod(&PacketSpec::tcp(POD_CLIENT, 30000, NODE, NODE_PORT).build());
            assert_eq!(verdict, TC_ACT_OK, "{prog:?}");
            assert!(
                [POD_LOCAL, POD_REMOTE].contains(&dst_of(&out).0),
                "{prog:?}"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// 4: a backend on another node: DNAT + SNAT, sent back out.

fn forward_key(protocol: Protocol, sport: u16) -> CtKey {
    CtKey {
        saddr_be: be32(CLIENT),
        daddr_be: be32(NODE),
        sport_be: sport.to_be(),
        dport_be: NODE_PORT.to_be(),
        proto: protocol_number(protocol),
        dir: ct_dir::FORWARD,
        _pad: [0; 2],
    }
}

fn reply_key(protocol: Protocol, snat_port: u16) -> CtKey {
    CtKey {
        saddr_be: be32(POD_REMOTE),
        daddr_be: be32(NODE),
        sport_be: POD_PORT.to_be(),
        dport_be: snat_port.to_be(),
        proto: protocol_number(protocol),
        dir: ct_dir::REPLY,
        _pad: [0; 2],
    }
}

#[test]
fn xdp_snats_a_flow_to_a_remote_backend_and_sends_it_and_its_reply_back_out() {
    THIS_NODE.run(|node| {
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let mut fx = uplinked(
                node,
                vec![frontend(
                    FrontendKind::NodePort,
                    NODE,
                    NODE_PORT,
                    protocol,
                    "remote",
                    &[POD_REMOTE],
                )],
            );
            let sport = 40000;
            let request = spec(protocol, CLIENT, sport, NODE, NODE_PORT);
            let (verdict, out) = fx.run(Prog::Xdp, &request.build());
            assert_eq!(verdict, XDP_TX, "{protocol:?}: egress == ingress");
            let (snat_addr, snat_port) = src_of(&out);
            assert_eq!(snat_addr, NODE, "{protocol:?}: source NATed to the uplink");
            assert!(
                snat::is_snat_port(snat_port),
                "{protocol:?}: SNAT port {snat_port}"
            );
            let expected = routed(
                rewritten(&request, |p| {
                    p.src = NODE;
                    p.sport = snat_port;
                    p.dst = POD_REMOTE;
                    p.dport = POD_PORT;
                }),
                GATEWAY_MAC,
            );
            assert_eq!(out, expected, "{protocol:?}: forwarded frame");
            assert!(checksums_valid(&out));
            assert_eq!(out[ETH_HLEN + 8], 63, "TTL decremented");
            assert_eq!(fx.stat("ext_remote"), 1);
            assert_eq!(fx.stat("ext_local"), 0);

            // Connection tracking: the forward entry and the reply entry.
            let fwd = fx.ct(&forward_key(protocol, sport)).expect("forward entry");
            assert_ne!(fwd.flags & ct_flags::SNAT, 0, "{fwd:?}");
            assert_eq!(
                (
                    fwd.nat_addr_be,
                    fwd.nat_port_be,
                    fwd.snat_addr_be,
                    fwd.snat_port_be
                ),
                (
                    be32(POD_REMOTE),
                    POD_PORT.to_be(),
                    be32(NODE),
                    snat_port.to_be()
                ),
                "{fwd:?}"
            );
            let rev = fx.ct(&reply_key(protocol, snat_port)).expect("reply entry");
            assert_ne!(rev.flags & ct_flags::SNAT, 0, "{rev:?}");
            assert_eq!(
                (
                    rev.nat_addr_be,
                    rev.nat_port_be,
                    rev.snat_addr_be,
                    rev.snat_port_be
                ),
                (be32(NODE), NODE_PORT.to_be(), be32(CLIENT), sport.to_be()),
                "{rev:?}"
            );
            assert_eq!(fx.syncer.store().conntrack_len(), 2);

            // The next packet of the flow keeps its SNAT port.
            let next = match protocol {
                Protocol::Tcp => PacketSpec {
                    tcp_flags: 0x10,
                    payload: b"GET /".to_vec(),
                    ..request.clone()
                },
                _ => PacketSpec {
                    payload: b"again".to_vec(),
                    ..request.clone()
                },
            };
            let (verdict, out) = fx.run(Prog::Xdp, &next.build());
            assert_eq!(verdict, XDP_TX);
            assert_eq!(
                out,
                routed(
                    rewritten(&next, |p| {
                        p.src = NODE;
                        p.sport = snat_port;
                        p.dst = POD_REMOTE;
                        p.dport = POD_PORT;
                    }),
                    GATEWAY_MAC
                ),
                "{protocol:?}: second packet, same SNAT port"
            );
            assert_eq!(fx.stat("ext_remote"), 2);
            assert_eq!(fx.syncer.store().conntrack_len(), 2, "no new entries");

            // The backend's reply goes back to the client from the NodePort.
            let reply = match protocol {
                Protocol::Tcp => PacketSpec {
                    tcp_flags: 0x12,
                    ..PacketSpec::tcp(POD_REMOTE, POD_PORT, NODE, snat_port)
                },
                _ => PacketSpec::udp(POD_REMOTE, POD_PORT, NODE, snat_port),
            };
            let (verdict, out) = fx.run(Prog::Xdp, &reply.build());
            assert_eq!(verdict, XDP_TX, "{protocol:?}: reply");
            assert_eq!(
                out,
                routed(
                    rewritten(&reply, |p| {
                        p.src = NODE;
                        p.sport = NODE_PORT;
                        p.dst = CLIENT;
                        p.dport = sport;
                    }),
                    CLIENT_MAC
                ),
                "{protocol:?}: reply frame"
            );
            assert!(checksums_valid(&out));
            assert_eq!(fx.stat("ext_reply"), 1);

            // To the SNAT port, but not from the flow's backend: not ours.
            let stranger = spec(protocol, POD_REMOTE, 9999, NODE, snat_port);
            assert_eq!(
                fx.run(Prog::Xdp, &stranger.build()),
                (XDP_PASS, stranger.build()),
                "{protocol:?}: SNAT port from another source port"
            );
            assert_eq!(fx.stat("ext_reply"), 1);
            assert_eq!(fx.stat("xdp_to_tc"), 0);
        }
    });
}

#[test]
fn many_remote_flows_get_distinct_snat_ports() {
    THIS_NODE.run(|node| {
        let mut fx = uplinked(
            node,
            vec![frontend(
                FrontendKind::NodePort,
                NODE,
                NODE_PORT,
                Protocol::Tcp,
                "remote",
                &[POD_REMOTE],
            )],
        );
        let mut ports = std::collections::BTreeSet::new();
        for sport in 0..200u16 {
            let (verdict, out) = fx.run(
                Prog::Xdp,
                &PacketSpec::tcp(CLIENT, 20000 + sport, NODE, NODE_PORT).build(),
            );
            assert_eq!(verdict, XDP_TX);
            assert_eq!(src_of(&out).0, NODE);
            ports.insert(src_of(&out).1);
        }
        assert_eq!(ports.len(), 200, "two flows share a SNAT port");
        assert!(ports.iter().all(|p| snat::is_snat_port(*p)));
        assert_eq!(fx.stat("ext_remote"), 200);
        assert_eq!(fx.stat("snat_exhausted"), 0);
    });
}

/// The tc twin rewrites both directions and sends the packet straight out
/// with `bpf_redirect_neigh` (the kernel's stack would drop a packet that
/// arrives on the uplink with the node's own address as its source), the TTL
/// down by one and the MAC addresses left to the neighbour lookup.
#[test]
fn tc_twin_snats_a_flow_to_a_remote_backend_and_restores_its_reply() {
    THIS_NODE.run(|node| {
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let mut fx = uplinked(
                node,
                vec![frontend(
                    FrontendKind::NodePort,
                    NODE,
                    NODE_PORT,
                    protocol,
                    "remote",
                    &[POD_REMOTE],
                )],
            );
            let sport = 40000;
            let request = spec(protocol, CLIENT, sport, NODE, NODE_PORT);
            let (verdict, out) = fx.run(Prog::Tc, &request.build());
            assert_eq!(verdict, TC_ACT_REDIRECT, "{protocol:?}");
            let (snat_addr, snat_port) = src_of(&out);
            assert_eq!(snat_addr, NODE);
            assert!(snat::is_snat_port(snat_port));
            assert_eq!(
                out,
                with_ttl(
                    rewritten(&request, |p| {
                        p.src = NODE;
                        p.sport = snat_port;
                        p.dst = POD_REMOTE;
                        p.dport = POD_PORT;
                    }),
                    63
                ),
                "{protocol:?}: request frame"
            );
            assert!(checksums_valid(&out));
            assert_eq!(fx.stat("ext_remote"), 1);
            let fwd = fx.ct(&forward_key(protocol, sport)).expect("forward entry");
            assert_ne!(fwd.flags & ct_flags::SNAT, 0);
            assert_eq!(fwd.snat_port_be, snat_port.to_be());
            assert!(
                fx.ct(&reply_key(protocol, snat_port)).is_some(),
                "reply entry"
            );

            let (_, again) = fx.run(Prog::Tc, &request.build());
            assert_eq!(src_of(&again), (NODE, snat_port), "same SNAT port");

            let reply = spec(protocol, POD_REMOTE, POD_PORT, NODE, snat_port);
            let (verdict, out) = fx.run(Prog::Tc, &reply.build());
            assert_eq!(verdict, TC_ACT_REDIRECT);
            assert_eq!(
                out,
                with_ttl(
                    rewritten(&reply, |p| {
                        p.src = NODE;
                        p.sport = NODE_PORT;
                        p.dst = CLIENT;
                        p.dport = sport;
                    }),
                    63
                ),
                "{protocol:?}: reply frame"
            );
            assert!(checksums_valid(&out));
            assert_eq!(fx.stat("ext_reply"), 1);
        }
    });
}

// ---------------------------------------------------------------------------
// 5: not ours, malformed, fragments.

#[test]
fn packets_that_are_not_ours_pass_untouched() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(
                node,
                vec![
                    frontend(
                        FrontendKind::NodePort,
                        NODE,
                        NODE_PORT,
                        Protocol::Tcp,
                        "np",
                        &[POD_LOCAL],
                    ),
                    frontend(
                        FrontendKind::NodePort,
                        NODE,
                        NODE_PORT,
                        Protocol::Udp,
                        "np-udp",
                        &[POD_REMOTE],
                    ),
                ],
            );
            let mut arp = vec![0xff; 6];
            arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
            arp.extend_from_slice(&[0u8; 28]);
            let mut ipv6 = PacketSpec::tcp(CLIENT, 40000, NODE, NODE_PORT).build();
            ipv6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
            let icmp = PacketSpec {
                proto: 1,
                payload: vec![8, 0, 0xf7, 0xff, 0, 0, 0, 0],
                ..PacketSpec::tcp(CLIENT, 0, NODE, 0)
            };
            let other_port = PacketSpec::tcp(CLIENT, 40001, NODE, 30081);
            let other_proto = PacketSpec::udp(CLIENT, 40002, LB_IP, NODE_PORT);
            let snat_range = PacketSpec::tcp(POD_REMOTE, POD_PORT, NODE, 61234);
            let snat_range_udp = PacketSpec::udp(POD_REMOTE, POD_PORT, NODE, snat::HIGH_MAX);
            let below_snat_range = PacketSpec::tcp(POD_REMOTE, POD_PORT, NODE, snat::HIGH_MIN - 1);
            let mut cut_tcp = PacketSpec::tcp(CLIENT, 40003, NODE, NODE_PORT).build();
            cut_tcp.truncate(ETH_HLEN + 20 + 10);
            let mut bad_ihl = PacketSpec::tcp(CLIENT, 40004, NODE, NODE_PORT).build();
            bad_ihl[ETH_HLEN] = 0x43;
            let mut short_total = PacketSpec::tcp(CLIENT, 40005, NODE, NODE_PORT).build();
            short_total[ETH_HLEN + 2..ETH_HLEN + 4].copy_from_slice(&24u16.to_be_bytes());
            let first_fragment = PacketSpec {
                frag_off: 0x2000,
                ..PacketSpec::udp(CLIENT, 40006, NODE, NODE_PORT)
            };
            let later_fragment = PacketSpec {
                frag_off: 0x0010,
                ..PacketSpec::tcp(CLIENT, 40007, NODE, NODE_PORT)
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

// ---------------------------------------------------------------------------
// 6: what the XDP program leaves to the tc twin.

/// A flow to another node with a TTL of 1 is not sent out by XDP: it goes on
/// untranslated to the tc twin, which drops it (counted).
#[test]
fn xdp_leaves_a_remote_flow_with_ttl_1_to_the_tc_twin() {
    THIS_NODE.run(|node| {
        let mut fx = uplinked(
            node,
            vec![frontend(
                FrontendKind::NodePort,
                NODE,
                NODE_PORT,
                Protocol::Tcp,
                "remote",
                &[POD_REMOTE],
            )],
        );
        let request = PacketSpec::tcp(CLIENT, 40000, NODE, NODE_PORT);
        let dying = with_ttl(request.build(), 1);
        for round in 1..=3 {
            let (verdict, out) = fx.run(Prog::Xdp, &dying);
            assert_eq!(verdict, XDP_PASS, "TTL 1 must not be sent out");
            assert_eq!(out, dying, "passed untranslated");
            assert_eq!(fx.stat("xdp_to_tc"), round);
        }
        let (verdict, _) = fx.run(Prog::Tc, &dying);
        assert_eq!(verdict, TC_ACT_SHOT);
        assert_eq!(fx.stat("ttl_exceeded"), 1);
        // The same flow with a live TTL is sent out.
        let (verdict, out) = fx.run(Prog::Xdp, &request.build());
        assert_eq!(verdict, XDP_TX);
        assert_eq!(out[ETH_HLEN + 8], 63);
        assert_eq!(fx.stat("xdp_to_tc"), 3);
    });
}

/// No neighbour entry for the next hop: XDP cannot fill in the MAC
/// addresses, so the packet goes on untranslated; the tc twin translates it
/// from the same connection-tracking entry (the same SNAT port) and lets the
/// kernel resolve the neighbour (`bpf_redirect_neigh`).
#[test]
fn xdp_leaves_a_remote_flow_without_next_hop_neighbour_to_the_tc_twin() {
    THIS_NODE.run(|node| {
        let mut fx = uplinked(
            node,
            vec![frontend(
                FrontendKind::NodePort,
                NODE,
                NODE_PORT,
                Protocol::Udp,
                "unresolved",
                &[POD_UNRESOLVED],
            )],
        );
        let request = PacketSpec::udp(CLIENT, 40000, NODE, NODE_PORT);
        let (verdict, out) = fx.run(Prog::Xdp, &request.build());
        assert_eq!(verdict, XDP_PASS);
        assert_eq!(out, request.build(), "passed untranslated");
        assert_eq!(fx.stat("xdp_to_tc"), 1);
        assert_eq!(fx.stat("ext_remote"), 0);
        let fwd = fx
            .ct(&forward_key(Protocol::Udp, 40000))
            .expect("XDP tracked the flow");
        let snat_port = u16::from_be(fwd.snat_port_be);

        let (verdict, out) = fx.run(Prog::Tc, &request.build());
        assert_eq!(verdict, TC_ACT_REDIRECT);
        assert_eq!(
            out,
            with_ttl(
                rewritten(&request, |p| {
                    p.src = NODE;
                    p.sport = snat_port;
                    p.dst = POD_UNRESOLVED;
                    p.dport = POD_PORT;
                }),
                63
            ),
            "the tc twin uses XDP's translation"
        );
        assert!(checksums_valid(&out));
        assert_eq!(fx.stat("ext_remote"), 1);
    });
}

/// The overlay device of [`a_backend_behind_an_overlay_is_source_nated_to_it`]:
/// flannel's shape, a VXLAN over `up0` with its own address, routing
/// another node's pods (10.244.4.0/24) through it.
const OVERLAY_ADDR: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 0);
const POD_OVERLAY: Ipv4Addr = Ipv4Addr::new(10, 244, 4, 2);

/// Adds the overlay `ovl0` to the test namespace; returns its index.
fn add_overlay() -> u32 {
    for command in [
        "link add ovl0 type vxlan id 1 local 192.168.50.1 dstport 8472",
        "link set ovl0 address 02:00:00:00:f1:01 mtu 1450 up",
        "addr add 10.244.1.0/32 dev ovl0",
        "neigh add 10.244.4.0 lladdr 02:00:00:00:f1:04 dev ovl0 nud permanent",
        "route add 10.244.4.0/24 via 10.244.4.0 dev ovl0 onlink",
    ] {
        netns::ip(&command.split_whitespace().collect::<Vec<_>>());
    }
    netns::ifindex("ovl0")
}

/// A backend behind an overlay device (another node's pod, reached through
/// flannel's VXLAN rather than an uplink) is on another node: its flow is
/// source-NATed to the overlay's address (as kube-proxy's masquerade picks
/// it), so the pod's reply comes back through the overlay and is translated
/// there. XDP cannot send into a tunnel: it hands the packet to the tc twin,
/// which redirects it through the overlay.
#[test]
fn a_backend_behind_an_overlay_is_source_nated_to_it() {
    THIS_NODE.run(|node| {
        let overlay = add_overlay();
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let mut fx = uplinked(
                node,
                vec![frontend(
                    FrontendKind::NodePort,
                    NODE,
                    NODE_PORT,
                    protocol,
                    "overlay",
                    &[POD_OVERLAY],
                )],
            );
            fx.syncer
                .store_mut()
                .set_uplinks(&[
                    (node.uplink, proxy_common::Uplink::new(be32(NODE), 0)),
                    (
                        overlay,
                        proxy_common::Uplink::new(be32(OVERLAY_ADDR), uplink_flags::OVERLAY),
                    ),
                ])
                .expect("write the uplink map");
            let request = spec(protocol, CLIENT, 40000, NODE, NODE_PORT);
            let (verdict, out) = fx.run(Prog::Xdp, &request.build());
            assert_eq!(verdict, XDP_PASS, "{protocol:?}: XDP hands it to tc");
            assert_eq!(out, request.build(), "{protocol:?}: passed untranslated");
            assert_eq!(fx.stat("xdp_to_tc"), 1, "{protocol:?}");

            let (verdict, out) = fx.run(Prog::Tc, &request.build());
            assert_eq!(verdict, TC_ACT_REDIRECT, "{protocol:?}");
            let (src, snat_port) = src_of(&out);
            assert_eq!(src, OVERLAY_ADDR, "{protocol:?}: the overlay's address");
            assert!(snat::is_snat_port(snat_port), "{protocol:?}: {snat_port}");
            let left = rewritten(&request, |p| {
                p.src = OVERLAY_ADDR;
                p.sport = snat_port;
                p.dst = POD_OVERLAY;
                p.dport = POD_PORT;
            });
            assert_eq!(out, with_ttl(left, 63), "{protocol:?}");
            assert!(checksums_valid(&out), "{protocol:?}");

            let reply = spec(protocol, POD_OVERLAY, POD_PORT, OVERLAY_ADDR, snat_port);
            let (verdict, out) = fx.run(Prog::Tc, &reply.build());
            assert_eq!(verdict, TC_ACT_REDIRECT, "{protocol:?}: the reply goes out");
            let back = rewritten(&reply, |p| {
                p.src = NODE;
                p.sport = NODE_PORT;
                p.dst = CLIENT;
                p.dport = 40000;
            });
            assert_eq!(out, with_ttl(back, 63), "{protocol:?}");
            assert_eq!(fx.stat("ext_remote"), 1, "{protocol:?}");
            assert_eq!(fx.stat("ext_reply"), 1, "{protocol:?}");
        }
    });
}

/// An ICMP "fragmentation needed" the remote backend sends about a packet of
/// a source-NATed flow (quoting it as it left: node:port → pod) reaches the
/// client as an error from the frontend about the client's own packet
/// (client → frontend), every checksum valid, sent straight back out.
#[test]
fn icmp_errors_about_a_remote_flow_reach_the_client_translated() {
    THIS_NODE.run(|node| {
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let mut fx = uplinked(
                node,
                vec![frontend(
                    FrontendKind::NodePort,
                    NODE,
                    NODE_PORT,
                    protocol,
                    "remote",
                    &[POD_REMOTE],
                )],
            );
            let sport = 40000;
            let request = spec(protocol, CLIENT, sport, NODE, NODE_PORT);
            let (verdict, out) = fx.run(Prog::Xdp, &request.build());
            assert_eq!(verdict, XDP_TX, "{protocol:?}");
            let (_, snat_port) = src_of(&out);
            let left = rewritten(&request, |p| {
                p.src = NODE;
                p.sport = snat_port;
                p.dst = POD_REMOTE;
                p.dport = POD_PORT;
            });
            // Type 3 code 4 with next-hop MTU 1400 in the low 16 bits.
            let error = icmp_frame(POD_REMOTE, NODE, 3, 4, 1400, &left[ETH_HLEN..ETH_HLEN + 28]);
            assert!(icmp_error_checksums_valid(&error));
            let (verdict, out) = fx.run(Prog::Tc, &error);
            assert_eq!(verdict, TC_ACT_REDIRECT, "{protocol:?}");
            let original = request.build();
            let expected = with_ttl(
                icmp_frame(NODE, CLIENT, 3, 4, 1400, &original[ETH_HLEN..ETH_HLEN + 28]),
                63,
            );
            assert_eq!(
                out, expected,
                "{protocol:?}: the error as the client must see it"
            );
            assert!(icmp_error_checksums_valid(&out));
            assert_eq!(fx.stat("icmp_error_translated"), 1);

            // An error quoting a flow nobody source-NATed passes untouched.
            let stranger = rewritten(&request, |p| {
                p.src = NODE;
                p.sport = 61999;
                p.dst = POD_REMOTE;
                p.dport = POD_PORT;
            });
            let error = icmp_frame(
                POD_REMOTE,
                NODE,
                3,
                4,
                1400,
                &stranger[ETH_HLEN..ETH_HLEN + 28],
            );
            let (verdict, out) = fx.run(Prog::Tc, &error);
            assert_eq!((verdict, out), (TC_ACT_UNSPEC, error));
            assert_eq!(fx.stat("icmp_error_translated"), 1);

            // The same error from a router on the way: the router stays the
            // outer source; the rest is translated as above.
            let error = icmp_frame(GATEWAY, NODE, 3, 4, 1400, &left[ETH_HLEN..ETH_HLEN + 28]);
            let (verdict, out) = fx.run(Prog::Tc, &error);
            assert_eq!(verdict, TC_ACT_REDIRECT, "{protocol:?}: from a router");
            let expected = with_ttl(
                icmp_frame(
                    GATEWAY,
                    CLIENT,
                    3,
                    4,
                    1400,
                    &original[ETH_HLEN..ETH_HLEN + 28],
                ),
                63,
            );
            assert_eq!(
                out, expected,
                "{protocol:?}: the router's error, translated"
            );
            assert!(icmp_error_checksums_valid(&out));
            assert_eq!(fx.stat("icmp_error_translated"), 2);
        }
    });
}

/// `bpf_ktime_get_ns()`'s clock (CLOCK_MONOTONIC), in ns.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Every SNAT port of node → POD_REMOTE:POD_PORT held by a flow of another
/// client with `flags`, stamped `stamp_ns`.
fn hold_every_snat_port(fx: &mut Loaded, flags: u8, stamp_ns: u64) {
    let conntrack = &mut fx.syncer.store_mut().conntrack;
    for port in (0..snat::PORTS).map(snat::port) {
        let key = CtKey {
            saddr_be: u32::from_ne_bytes(POD_REMOTE.octets()),
            daddr_be: u32::from_ne_bytes(NODE.octets()),
            sport_be: POD_PORT.to_be(),
            dport_be: port.to_be(),
            proto: 6,
            dir: ct_dir::REPLY,
            _pad: [0; 2],
        };
        let entry = CtEntry {
            backend_id: 1,
            service_id: 1,
            nat_addr_be: u32::from_ne_bytes(NODE.octets()),
            nat_port_be: NODE_PORT.to_be(),
            flags,
            snat_addr_be: u32::from_ne_bytes([192, 168, 50, 101]),
            snat_port_be: port.to_be(),
            created_ns: stamp_ns,
            ..CtEntry::default()
        };
        conntrack
            .insert(key, entry, 0)
            .expect("seed a conntrack entry");
    }
}

/// A new flow to a remote backend takes a SNAT port held by a closed TCP
/// flow only once the close is older than the backend's TIME_WAIT; a port of
/// an open flow, or of one that closed just now, is never taken (the flow is
/// dropped and counted when every port is held).
#[test]
fn snat_ports_of_closed_flows_are_reused_only_after_time_wait() {
    THIS_NODE.run(|node| {
        let mut fx = uplinked(
            node,
            vec![frontend(
                FrontendKind::NodePort,
                NODE,
                NODE_PORT,
                Protocol::Tcp,
                "remote",
                &[POD_REMOTE],
            )],
        );
        let now = monotonic_ns();
        assert!(
            now > 2 * snat::REUSE_AFTER_NS,
            "the machine has been up long enough"
        );
        let syn = |sport| PacketSpec::tcp(CLIENT, sport, NODE, NODE_PORT).build();

        hold_every_snat_port(&mut fx, ct_flags::SNAT | ct_flags::CLOSING, now);
        let (verdict, _) = fx.run(Prog::Xdp, &syn(40000));
        assert_eq!(
            verdict, XDP_DROP,
            "closed just now: still in TIME_WAIT at the backend"
        );
        assert_eq!(fx.stat("snat_exhausted"), 1);

        hold_every_snat_port(&mut fx, ct_flags::SNAT, now - 2 * snat::REUSE_AFTER_NS);
        let (verdict, _) = fx.run(Prog::Xdp, &syn(40001));
        assert_eq!(
            verdict, XDP_DROP,
            "open flows keep their ports, however old"
        );
        assert_eq!(fx.stat("snat_exhausted"), 2);

        hold_every_snat_port(
            &mut fx,
            ct_flags::SNAT | ct_flags::CLOSING,
            now - 2 * snat::REUSE_AFTER_NS,
        );
        let (verdict, out) = fx.run(Prog::Xdp, &syn(40002));
        assert_eq!(verdict, XDP_TX, "a port closed long ago is taken");
        let (_, port) = src_of(&out);
        let entry = fx.ct(&reply_key(Protocol::Tcp, port)).expect("reply entry");
        assert_eq!(
            (
                entry.snat_addr_be,
                u16::from_be(entry.snat_port_be),
                entry.flags
            ),
            (
                u32::from_ne_bytes(CLIENT.octets()),
                40002,
                ct_flags::SNAT | ct_flags::HANDSHAKE
            ),
            "the entry now names the new client, open"
        );
        assert_eq!(fx.stat("snat_exhausted"), 2);
    });
}

// ---------------------------------------------------------------------------
// loadBalancerSourceRanges: one trie lookup for a restricted frontend, none
// for the others; a denied packet is dropped untouched and counted per
// Service; a change applies to the next packet.

/// A client outside the node outside `ALLOWED` (same subnet as CLIENT).
const OUTSIDER: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 200);
/// CLIENT's half of the uplink subnet.
const ALLOWED: &str = "192.168.50.0/25";

fn restricted(mut fe: Frontend, blocks: &[&str]) -> Frontend {
    let blocks: Vec<IpCidr> = blocks.iter().map(|b| b.parse().expect("a CIDR")).collect();
    fe.source_ranges = Some(SourceRanges {
        blocks: blocks.into(),
        allows_node: false,
    });
    fe
}

#[test]
fn load_balancer_source_ranges_admit_only_listed_clients() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let lb = |port: u16, name: &str| {
                frontend(
                    FrontendKind::LoadBalancer,
                    LB_IP,
                    port,
                    Protocol::Tcp,
                    name,
                    &[POD_LOCAL],
                )
            };
            let ranged = restricted(lb(443, "ranged"), &[ALLOWED, "10.244.1.50/32"]);
            let frontends = vec![
                ranged.clone(),
                restricted(lb(444, "all"), &["0.0.0.0/0"]),
                restricted(lb(445, "none"), &[]),
                lb(446, "open"),
                // The Service's NodePort stays open, as in kube-proxy.
                frontend(
                    FrontendKind::NodePort,
                    NODE,
                    NODE_PORT,
                    Protocol::Tcp,
                    "ranged-np",
                    &[POD_LOCAL],
                ),
            ];
            let mut fx = uplinked(node, frontends.clone());
            let delivered = |p: &PacketSpec| {
                rewritten(p, |p| {
                    p.dst = POD_LOCAL;
                    p.dport = POD_PORT;
                })
            };
            let mut cases = Vec::new();
            let mut sport = 41000;
            for (what, src, port, allowed) in [
                ("inside the /25", CLIENT, 443, true),
                ("outside the /25", OUTSIDER, 443, false),
                ("inside a /0", OUTSIDER, 444, true),
                ("with an empty list", CLIENT, 445, false),
                ("to an unrestricted frontend", OUTSIDER, 446, true),
                (
                    "to the NodePort of a restricted Service",
                    OUTSIDER,
                    NODE_PORT,
                    true,
                ),
            ] {
                sport += 1;
                let dst = if port == NODE_PORT { NODE } else { LB_IP };
                let p = PacketSpec::tcp(src, sport, dst, port);
                cases.push(Case {
                    hook: prog.into(),
                    name: format!(
                        "{src} {what}: {}",
                        if allowed { "forwarded" } else { "dropped" }
                    ),
                    input: p.build(),
                    verdict: if allowed {
                        prog.delivered()
                    } else {
                        prog.dropped()
                    },
                    output: if allowed { delivered(&p) } else { p.build() },
                });
            }
            fx.run_table(&cases, rewritten_checksums::<Ipv4Addr>);
            let row = fx.service_row("ranged");
            assert_eq!(row.drops_source_range, 1, "{prog:?}: {row:?}");
            assert_eq!(
                row.source_ranges,
                Some(vec!["10.244.1.50/32".to_owned(), ALLOWED.to_owned()])
            );
            assert_eq!(fx.service_row("none").drops_source_range, 1, "{prog:?}");
            assert_eq!(fx.service_row("open").source_ranges, None, "{prog:?}");
            assert_eq!(
                fx.service_row("ranged").packets,
                1,
                "{prog:?}: only the allowed packet counts as forwarded"
            );

            // Pods are held to the ranges too (kube-proxy checks every source).
            let pod = PacketSpec::tcp(POD_CLIENT, 42000, LB_IP, 443);
            assert_eq!(
                fx.run_from_pod(&pod.build()),
                (TC_ACT_OK, delivered(&pod)),
                "{prog:?}: a listed pod"
            );
            let other_pod = PacketSpec::tcp(Ipv4Addr::new(10, 244, 1, 51), 42001, LB_IP, 443);
            assert_eq!(
                fx.run_from_pod(&other_pod.build()),
                (TC_ACT_SHOT, other_pod.build()),
                "{prog:?}: an unlisted pod"
            );
            assert_eq!(fx.service_row("ranged").drops_source_range, 2, "{prog:?}");

            // Widening the list lets the outsider's next packet through.
            let mut widened = frontends;
            widened[0] = restricted(lb(443, "ranged"), &["192.168.50.0/24"]);
            let desired = DesiredState {
                frontends: widened.into_iter().map(|f| (f.addr, f)).collect(),
            };
            let report = fx.syncer.apply(&desired);
            assert!(report.failed.is_empty(), "{report:?}");
            let again = PacketSpec::tcp(OUTSIDER, 42002, LB_IP, 443);
            fx.run_table(
                &[Case {
                    hook: prog.into(),
                    name: "the outsider after widening".into(),
                    input: again.build(),
                    verdict: prog.delivered(),
                    output: delivered(&again),
                }],
                rewritten_checksums::<Ipv4Addr>,
            );
            let row = fx.service_row("ranged");
            assert_eq!(
                row.source_ranges,
                Some(vec!["192.168.50.0/24".to_owned()]),
                "{prog:?}: the /25 and /32 are gone"
            );
            // Dropping the ranges removes every block and the flag.
            let mut opened = desired;
            for fe in opened.frontends.values_mut() {
                fe.source_ranges = None;
            }
            assert!(fx.syncer.apply(&opened).failed.is_empty());
            assert!(
                fx.syncer.store().source_range_blocks().is_empty(),
                "{prog:?}"
            );
        }
    });
}

// ---------------------------------------------------------------------------
// Direct server return (`--nodeport-mode dsr`, IPv4).

/// The frontend's node of a flow returned directly (another node, whose
/// NodePort this node's backend answers for).
const BALANCER: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 9);

/// The direct-server-return option naming frontend `addr:port`.
fn dsr_option(addr: Ipv4Addr, port: u16) -> Vec<u8> {
    let mut opt = vec![dsr::OPT4_TYPE, dsr::OPT4_LEN];
    opt.extend_from_slice(&port.to_be_bytes());
    opt.extend_from_slice(&addr.octets());
    opt
}

/// Loads the programs on `node` with direct server return on: frontends
/// outside the cluster return flows directly, and the uplink accepts the
/// option.
fn returning_directly(node: &Node, frontends: Vec<Frontend>) -> Loaded {
    let mut fx = uplinked(node, Vec::new());
    fx.syncer.set_direct_return(true);
    fx.set_uplink_flags(node.uplink, NODE, uplink_flags::DSR_ACCEPT);
    let report = fx.program(frontends);
    assert!(report.failed.is_empty(), "{report:?}");
    fx
}

/// The packet `spec` as a flow returned directly leaves this node: to the
/// remote backend, the frontend in the option, routed to the gateway
/// (`xdp`: MAC addresses of the route; tc: the kernel resolves them).
fn carried(spec: &PacketSpec, xdp: bool) -> Vec<u8> {
    let frame = rewritten(spec, |p| {
        p.dst = POD_REMOTE;
        p.dport = POD_PORT;
        p.ip_options = dsr_option(NODE, NODE_PORT);
    });
    match xdp {
        true => routed(frame, GATEWAY_MAC),
        false => with_ttl(frame, 63),
    }
}

#[test]
fn a_remote_flow_is_returned_directly_with_the_frontend_in_an_option() {
    THIS_NODE.run(|node| {
        for (prog, sent) in [(Prog::Xdp, XDP_TX), (Prog::Tc, TC_ACT_REDIRECT)] {
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                let fe = frontend(
                    FrontendKind::NodePort,
                    NODE,
                    NODE_PORT,
                    protocol,
                    "dsr",
                    &[POD_REMOTE],
                );
                let mut fx = returning_directly(node, vec![fe]);
                let sport = 40000;
                let request = spec(protocol, CLIENT, sport, NODE, NODE_PORT);
                let (verdict, out) = fx.run(prog, &request.build());
                let case = format!("{prog:?} {protocol:?}");
                assert_eq!(verdict, sent, "{case}");
                assert_eq!(
                    out,
                    carried(&request, prog == Prog::Xdp),
                    "{case}: the client's source kept, the frontend carried"
                );
                assert!(checksums_valid(&out), "{case}");
                assert_eq!(fx.stat("ext_remote"), 1, "{case}");

                // Both entries, without source NAT; the reply entry only
                // pairs them (the replies bypass this node).
                let fwd = fx.ct(&forward_key(protocol, sport)).expect("forward entry");
                assert_eq!(fwd.flags & ct_flags::SNAT, 0, "{case}: {fwd:?}");
                assert_ne!(fwd.flags & ct_flags::DSR_BALANCED, 0, "{case}: {fwd:?}");
                assert_eq!(
                    (fwd.nat_addr_be, fwd.nat_port_be),
                    (be32(POD_REMOTE), POD_PORT.to_be()),
                    "{case}"
                );
                assert_eq!(fx.syncer.store().conntrack_len(), 2, "{case}");

                // The next packet keeps its backend and carries the option.
                let next = with(&request, |p| {
                    p.tcp_flags = 0x10;
                    p.payload = b"GET /".to_vec();
                });
                let (verdict, out) = fx.run(prog, &next.build());
                assert_eq!(
                    (verdict, out),
                    (sent, carried(&next, prog == Prog::Xdp)),
                    "{case}: next packet"
                );
                assert_eq!(fx.syncer.store().conntrack_len(), 2, "{case}");
            }
        }
    });
}

#[test]
fn a_flow_returned_directly_arrives_tracked_and_its_replies_leave_from_the_frontend() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                let case = format!("{prog:?} {protocol:?}");
                let mut fx = returning_directly(node, Vec::new());
                let sport = 40000;
                let arriving = with(&spec(protocol, CLIENT, sport, POD_LOCAL, POD_PORT), |p| {
                    p.ip_options = dsr_option(BALANCER, NODE_PORT)
                });
                let (verdict, out) = fx.run(prog, &arriving.build());
                assert_eq!(
                    (verdict, out),
                    (prog.delivered(), arriving.build()),
                    "{case}: delivered unchanged"
                );
                let fwd_key = CtKey {
                    daddr_be: be32(BALANCER),
                    ..forward_key(protocol, sport)
                };
                if !prog.tracks_dsr_arrivals() {
                    assert_eq!(fx.stat("ext_local"), 0, "{case}: left to tc");
                    assert!(fx.ct(&fwd_key).is_none(), "{case}: left to tc");
                    continue;
                }
                assert_eq!(fx.stat("ext_local"), 1, "{case}");
                let fwd = fx.ct(&fwd_key).expect("forward entry, by the frontend");
                assert_ne!(fwd.flags & ct_flags::DSR_ARRIVED, 0, "{case}: {fwd:?}");
                assert_eq!(
                    (fwd.nat_addr_be, fwd.nat_port_be),
                    (be32(POD_LOCAL), POD_PORT.to_be()),
                    "{case}"
                );

                // The pod's reply leaves the uplink from the frontend.
                let reply = spec(protocol, POD_LOCAL, POD_PORT, CLIENT, sport);
                let reply = match protocol {
                    Protocol::Tcp => with(&reply, |p| p.tcp_flags = 0x12),
                    Protocol::Udp => reply,
                };
                let (verdict, out) = fx.run_egress(&reply.build());
                assert_eq!(verdict, TC_ACT_OK, "{case}: reply");
                assert_eq!(
                    out,
                    rewritten(&reply, |p| {
                        p.src = BALANCER;
                        p.sport = NODE_PORT;
                    }),
                    "{case}: reply from the frontend"
                );
                assert!(checksums_valid(&out), "{case}");

                // The next packet is noted, not tracked anew.
                let next = with(&arriving, |p| p.tcp_flags = 0x10);
                let (verdict, _) = fx.run(prog, &next.build());
                assert_eq!(verdict, prog.delivered(), "{case}");
                assert_eq!(fx.syncer.store().conntrack_len(), 2, "{case}");
                if protocol == Protocol::Tcp {
                    let fwd = fx.ct(&fwd_key).expect("forward entry");
                    assert_ne!(fwd.state & ct_state::ACKED, 0, "{case}: the ACK noted");
                }
            }
        }
    });
}

#[test]
fn the_option_is_ignored_where_direct_return_is_off() {
    THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked(node, Vec::new());
            let arriving = with(&PacketSpec::tcp(CLIENT, 40000, POD_LOCAL, POD_PORT), |p| {
                p.ip_options = dsr_option(BALANCER, NODE_PORT)
            });
            let (verdict, out) = fx.run(prog, &arriving.build());
            assert_eq!(
                (verdict, out),
                (prog.untouched(), arriving.build()),
                "{prog:?}: not ours"
            );
            assert_eq!(fx.syncer.store().conntrack_len(), 0, "{prog:?}");
        }
    });
}

#[test]
fn a_packet_too_large_for_the_option_is_answered_with_fragmentation_needed() {
    THIS_NODE.run(|node| {
        let fe = frontend(
            FrontendKind::NodePort,
            NODE,
            NODE_PORT,
            Protocol::Udp,
            "dsr",
            &[POD_REMOTE],
        );
        let mut fx = returning_directly(node, vec![fe]);
        // 1500 bytes of IPv4: the route's MTU, with no room for the option.
        let mut big = PacketSpec::udp(CLIENT, 40000, NODE, NODE_PORT);
        big.payload = vec![0x5a; 1500 - 20 - 8];
        let frame = big.build();

        // XDP leaves it to tc, untouched.
        assert_eq!(fx.run(Prog::Xdp, &frame), (XDP_PASS, frame.clone()));
        assert_eq!(fx.stat("xdp_to_tc"), 1);

        // tc answers from the frontend, naming the room the option leaves.
        let (verdict, out) = fx.run(Prog::Tc, &frame);
        assert_eq!(verdict, TC_ACT_REDIRECT);
        assert_eq!(out, icmp_fragmentation_needed(&frame, 1500 - 8));
        assert!(icmp_checksums_valid(&out));
        assert_eq!(fx.stat("rejected"), 1);
        assert_eq!(fx.stat("ext_remote"), 0);

        // One that fits goes through.
        big.payload.truncate(1500 - 20 - 8 - 8);
        let (verdict, out) = fx.run(Prog::Tc, &big.build());
        assert_eq!((verdict, out), (TC_ACT_REDIRECT, carried(&big, false)));
    });
}

/// The XDP program remembers a route for 50 ms per CPU: a neighbour that
/// changes its MAC address is followed once that time has passed (on one
/// CPU, so the runs share a cache: within the time, the remembered address
/// is still used).
#[test]
fn a_changed_next_hop_is_followed_within_the_route_cache_time() {
    THIS_NODE.run(|node| {
        crate::support::run_on_cpu(0);
        let fe = frontend(
            FrontendKind::NodePort,
            NODE,
            NODE_PORT,
            Protocol::Udp,
            "remote",
            &[POD_REMOTE],
        );
        let mut fx = uplinked(node, vec![fe]);
        let request = PacketSpec::udp(CLIENT, 40000, NODE, NODE_PORT).build();
        let (verdict, out) = fx.run(Prog::Xdp, &request);
        assert_eq!((verdict, &out[0..6]), (XDP_TX, &GATEWAY_MAC[..]));
        let moved = [0x02, 0, 0, 0, 0, 0x22];
        crate::support::netns::ip(&[
            "neigh",
            "replace",
            &GATEWAY.to_string(),
            "lladdr",
            &crate::support::netns::mac(moved),
            "dev",
            "up0",
        ]);
        let (_, out) = fx.run(Prog::Xdp, &request);
        assert_eq!(&out[0..6], &GATEWAY_MAC[..], "remembered");
        std::thread::sleep(std::time::Duration::from_millis(120));
        let (verdict, out) = fx.run(Prog::Xdp, &request);
        assert_eq!(
            (verdict, &out[0..6]),
            (XDP_TX, &moved[..]),
            "the new MAC address after the cache time"
        );
    });
}
