//! A backend on this node: DNAT only, the client's address kept, the
//! reply reversed on the uplink's egress; `externalTrafficPolicy: Local`;
//! `loadBalancerSourceRanges`; Maglev and source hashing (IPv6).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{
    dst_of, from_client6, frontend, local_policy, node_port, standard6, uplinked, uplinked6,
    Uplinked, CLIENT6, LB_IP6, NODE6, NODE_PORT, POD_LOCAL6, POD_PORT,
};
use crate::support::{
    family::ct_key, netns::RunNode as _, rewritten, rewritten_checksums, v6::Fe6, Case, Loaded,
    Uplink as Prog, TC_ACT_OK, TC_ACT_SHOT,
};
use proxy_common::{
    addr6_be, capacity, ct_dir, ct_flags, frontend_flags,
    hash::{flow_hash6, source_hash6},
    scope, MaglevTable,
};
use proxy_testkit::packet::PacketSpec;
use proxy_testkit::packet6::{
    checksums_valid6, Packet6, NEXTHDR_DEST, NEXTHDR_HOP, NEXTHDR_ROUTING, PROTO_TCP, TCP_ACK,
};
use proxy_testkit::Frame;
use proxy_user::{
    model::cidr::IpCidr,
    model::{DesiredState, Frontend, FrontendKind, Protocol, SourceRanges},
    sync::maglev::{self, BackendKey},
    sync::store::MapStore,
};

type V4 = Ipv4Addr;
type V6 = Ipv6Addr;

crate::both_families!(
    outside_clients_reach_a_local_backend_by_dnat_only,
    local_policy_sends_outside_flows_only_to_local_endpoints_without_snat,
    local_policy_without_local_endpoints_drops_outside_traffic_only,
);

/// The flows from outside to a local backend only one family has, each a
/// new TCP flow to the NodePort.
trait OwnLocalFlows: Uplinked {
    fn own_local_flows() -> Vec<(&'static str, Self::Packet)>;
}

impl OwnLocalFlows for Ipv4Addr {
    fn own_local_flows() -> Vec<(&'static str, PacketSpec)> {
        vec![(
            "NodePort TCP with IPv4 options",
            PacketSpec {
                ip_option_words: 2,
                ..PacketSpec::tcp(V4::CLIENT, 40003, V4::NODE, NODE_PORT)
            },
        )]
    }
}

impl OwnLocalFlows for Ipv6Addr {
    fn own_local_flows() -> Vec<(&'static str, Packet6)> {
        Vec::new()
    }
}

fn outside_clients_reach_a_local_backend_by_dnat_only<F: OwnLocalFlows>() {
    let (client, node, pod) = (F::CLIENT, F::NODE, F::POD_LOCAL);
    F::THIS_NODE.run(|node_ns| {
        for prog in Prog::BOTH {
            let mut fx = uplinked::<F>(
                node_ns,
                vec![
                    node_port(Protocol::Tcp, "np-tcp", &[pod]),
                    node_port(Protocol::Udp, "np-udp", &[pod]),
                    frontend(
                        FrontendKind::LoadBalancer,
                        F::LB_IP,
                        443,
                        Protocol::Tcp,
                        "lb",
                        &[pod],
                    ),
                    frontend(
                        FrontendKind::ExternalIp,
                        F::EXTERNAL_IP,
                        53,
                        Protocol::Udp,
                        "ext",
                        &[pod],
                    ),
                    frontend(
                        FrontendKind::ExternalIp,
                        F::EXTERNAL_IP,
                        80,
                        Protocol::Tcp,
                        "ext-tcp",
                        &[pod],
                    ),
                ],
            );
            for (i, protocol) in [Protocol::Tcp, Protocol::Udp].into_iter().enumerate() {
                let case = format!("{prog:?} {protocol:?}");
                let sport = 40000 + i as u16;
                let input = F::from_client(F::packet(protocol, client, sport, node, NODE_PORT));
                let (verdict, out) = fx.run(prog, &input.build());
                assert_eq!(verdict, prog.delivered(), "{case}");
                // Source, TTL and MACs stay: the kernel delivers it.
                assert_eq!(
                    out,
                    input.to(pod, POD_PORT).build(),
                    "{case}: DNAT to the local backend"
                );
                assert!(F::checksums_valid(&out, &input.build()), "{case}");

                // Tracked as the pod path tracks it: both directions, no SNAT.
                let fwd = F::ct(
                    &fx,
                    &ct_key(client, sport, node, NODE_PORT, protocol, ct_dir::FORWARD),
                )
                .expect("forward entry");
                assert_eq!(fwd.flags & ct_flags::SNAT, 0, "{case}: {fwd:?}");
                assert_eq!(
                    (fwd.nat_addr_be, fwd.nat_port_be),
                    (pod.be(), POD_PORT.to_be()),
                    "{case}"
                );
                let rev = F::ct(
                    &fx,
                    &ct_key(pod, POD_PORT, client, sport, protocol, ct_dir::REPLY),
                )
                .expect("reply entry");
                assert_eq!(
                    (rev.nat_addr_be, rev.nat_port_be),
                    (node.be(), NODE_PORT.to_be()),
                    "{case}"
                );

                // The pod's reply leaves through the uplink's tc egress
                // (`sb_to_pod`) with the NodePort as its source again.
                let reply = F::packet(protocol, pod, POD_PORT, client, sport).flags(0x12);
                let (verdict, out) = fx.run_egress(&reply.build());
                assert_eq!(verdict, TC_ACT_OK, "{case}: reply");
                assert_eq!(
                    out,
                    reply.from(node, NODE_PORT).build(),
                    "{case}: reply from the NodePort"
                );
                assert!(F::checksums_valid(&out, &reply.build()), "{case}");

                // The next packet of the flow keeps its backend.
                let next = input.flags(if protocol == Protocol::Tcp { 0x10 } else { 0 });
                let (verdict, out) = fx.run(prog, &next.build());
                assert_eq!(verdict, prog.delivered(), "{case}");
                assert_eq!(dst_of::<F>(&out), (pod, POD_PORT), "{case}");
            }

            let mut udp_zero = F::Packet::udp(client, 40002, node, NODE_PORT);
            udp_zero.set_udp_zero_checksum();
            let mut flows = vec![
                ("NodePort UDP without checksum", udp_zero),
                (
                    "LoadBalancer IP TCP",
                    F::Packet::tcp(client, 40004, F::LB_IP, 443),
                ),
                (
                    "external IP UDP",
                    F::Packet::udp(client, 40005, F::EXTERNAL_IP, 53),
                ),
                (
                    "external IP TCP",
                    F::Packet::tcp(client, 40006, F::EXTERNAL_IP, 80),
                ),
            ];
            let own = F::own_local_flows();
            let own_flows = own.len() as u64;
            flows.extend(own);
            let cases: Vec<Case> = flows
                .iter()
                .map(|(name, p)| {
                    let p = F::from_client(p.clone());
                    Case {
                        hook: prog.into(),
                        name: format!("{name} to a local backend is DNATed only"),
                        input: p.build(),
                        verdict: prog.delivered(),
                        output: p.to(pod, POD_PORT).build(),
                    }
                })
                .collect();
            fx.run_table(&cases, rewritten_checksums::<F>);

            let n = 4 + flows.len() as u64;
            assert_eq!(fx.stat("ext_local"), n, "{prog:?}");
            assert_eq!(fx.stat("ext_remote"), 0, "{prog:?}");
            assert_eq!(
                fx.stat("forwarded"),
                0,
                "{prog:?}: not counted as pod traffic"
            );
            let np = fx.service_row("np-tcp");
            assert_eq!(
                (np.packets, np.new_flows),
                (2 + own_flows, 1 + own_flows),
                "{prog:?}: {np:?}"
            );
            assert_eq!(fx.service_row("lb").packets, 1, "{prog:?}");
        }
    });
}

fn local_policy_sends_outside_flows_only_to_local_endpoints_without_snat<F: Uplinked>() {
    let (client, node, pod, remote) = (F::CLIENT, F::NODE, F::POD_LOCAL, F::POD_REMOTE);
    F::THIS_NODE.run(|node_ns| {
        for prog in Prog::BOTH {
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                let np = node_port(protocol, "local", &[pod, remote]);
                let lb = frontend(
                    FrontendKind::LoadBalancer,
                    F::LB_IP,
                    443,
                    protocol,
                    "local-lb",
                    &[pod, remote],
                );
                let mut fx = uplinked::<F>(
                    node_ns,
                    vec![local_policy(np, &[pod]), local_policy(lb, &[pod])],
                );
                let mut cases = Vec::new();
                for sport in 20000..20100u16 {
                    for (vip, vport) in [(node, NODE_PORT), (F::LB_IP, 443)] {
                        let p = F::from_client(F::packet(protocol, client, sport, vip, vport));
                        cases.push(Case {
                            hook: prog.into(),
                            name: format!("{protocol:?} {client}:{sport} -> {vip}:{vport}"),
                            input: p.build(),
                            verdict: prog.delivered(),
                            // The client's address is kept: the pod sees it.
                            output: p.to(pod, POD_PORT).build(),
                        });
                    }
                }
                fx.run_table(&cases, rewritten_checksums::<F>);
                assert_eq!(fx.stat("ext_local"), 200, "{prog:?} {protocol:?}");
                assert_eq!(fx.stat("ext_remote"), 0, "{prog:?} {protocol:?}");

                // Pods of this node still get the cluster-wide set.
                let mut seen = std::collections::BTreeSet::new();
                for sport in 0..64u16 {
                    let (verdict, out) = fx.run_from_pod(
                        &F::packet(protocol, F::POD_CLIENT, 30000 + sport, node, NODE_PORT).build(),
                    );
                    assert_eq!(verdict, TC_ACT_OK);
                    seen.insert(dst_of::<F>(&out).0);
                }
                assert_eq!(
                    seen,
                    [pod, remote].into_iter().collect(),
                    "{prog:?} {protocol:?}: pod traffic uses both endpoints"
                );
            }
        }
    });
}

fn local_policy_without_local_endpoints_drops_outside_traffic_only<F: Uplinked>() {
    let (client, node, pod, remote) = (F::CLIENT, F::NODE, F::POD_LOCAL, F::POD_REMOTE);
    F::THIS_NODE.run(|node_ns| {
        for prog in Prog::BOTH {
            let np = node_port(Protocol::Tcp, "nolocal", &[pod, remote]);
            let mut fx = uplinked::<F>(node_ns, vec![local_policy::<F>(np, &[])]);
            let p = F::from_client(F::Packet::tcp(client, 40000, node, NODE_PORT));
            let q = F::from_client(F::Packet::tcp(client, 40001, node, NODE_PORT));
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
                rewritten_checksums::<F>,
            );
            assert_eq!(fx.stat("drop_no_backend"), 2, "{prog:?}");
            assert_eq!(fx.stat("ext_local") + fx.stat("ext_remote"), 0, "{prog:?}");
            // The maps hold both sets: the internal one cluster-wide, the
            // external one empty. (Read from the maps directly: `switchboard
            // services` merges the two slot-0 entries.)
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
            let mut internal_set: Vec<Option<IpAddr>> = dump
                .frontends
                .iter()
                .filter(|(k, _)| k.scope() == scope::INTERNAL && k.slot() > 0)
                .map(|(_, v)| backend_addr(v.backend_id))
                .collect();
            internal_set.sort();
            assert_eq!(
                internal_set,
                vec![Some(pod.into()), Some(remote.into())],
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
            assert_eq!(F::ct_len(&fx), 0, "{prog:?}");
            // A pod of this node reaches the same frontend.
            let (verdict, out) =
                fx.run_from_pod(&F::Packet::tcp(F::POD_CLIENT, 30000, node, NODE_PORT).build());
            assert_eq!(verdict, TC_ACT_OK, "{prog:?}");
            assert!([pod, remote].contains(&dst_of::<F>(&out).0), "{prog:?}");
        }
    });
}

/// The IPv6 `externalTrafficPolicy: Local` LoadBalancer IP of
/// [`standard6`] (a remote endpoint and a local one) and its Local
/// NodePort without local endpoints.
#[test]
fn local_policy_sends_outside_ipv6_flows_only_to_the_local_endpoint_of_two() {
    V6::THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked6(node, Some(NODE6));
            standard6(&mut fx);
            for sport in 41000..41016u16 {
                let input = from_client6(Packet6::tcp(CLIENT6, sport, LB_IP6, 80));
                let (verdict, out) = fx.run(prog, &input.build());
                assert_eq!(verdict, prog.delivered(), "{prog:?} sport {sport}");
                assert_eq!(
                    out,
                    input.to(super::POD_LOCAL6_2, POD_PORT).build(),
                    "{prog:?} sport {sport}: the local endpoint, client source kept"
                );
            }
            // A Local frontend without local endpoints drops traffic from
            // outside.
            let input =
                from_client6(Packet6::tcp(CLIENT6, 42000, NODE6, super::EMPTY_LOCAL_PORT)).build();
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
// IPv6 extension headers and a zero UDP checksum.

#[test]
fn outside_ipv6_packets_with_extension_headers_or_a_zero_udp_checksum_are_translated_exactly() {
    V6::THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked6(node, Some(NODE6));
            standard6(&mut fx);
            let cases = [
                (
                    "hop-by-hop and destination options before TCP",
                    from_client6(Packet6 {
                        ext: vec![NEXTHDR_HOP, NEXTHDR_DEST],
                        ..Packet6::tcp(CLIENT6, 47000, NODE6, NODE_PORT)
                    }),
                ),
                (
                    "routing header before UDP",
                    from_client6(Packet6 {
                        ext: vec![NEXTHDR_ROUTING],
                        ..Packet6::udp(CLIENT6, 47001, NODE6, NODE_PORT)
                    }),
                ),
                (
                    "UDP with a zero checksum (stays zero)",
                    from_client6(Packet6 {
                        udp_zero_checksum: true,
                        ..Packet6::udp(CLIENT6, 47002, NODE6, NODE_PORT)
                    }),
                ),
            ];
            for (name, input) in cases {
                let (verdict, out) = fx.run(prog, &input.build());
                let want = Packet6 {
                    dst: POD_LOCAL6,
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
// loadBalancerSourceRanges: one trie lookup for a restricted frontend, none
// for the others; a denied packet is dropped untouched and counted per
// Service; a change applies to the next packet.

/// A client outside the node outside `ALLOWED` (same subnet as V4::CLIENT).
const OUTSIDER: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 200);

/// V4::CLIENT's half of the uplink subnet.
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
    V4::THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let lb = |port: u16, name: &str| {
                frontend(
                    FrontendKind::LoadBalancer,
                    V4::LB_IP,
                    port,
                    Protocol::Tcp,
                    name,
                    &[V4::POD_LOCAL],
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
                    V4::NODE,
                    NODE_PORT,
                    Protocol::Tcp,
                    "ranged-np",
                    &[V4::POD_LOCAL],
                ),
            ];
            let mut fx = uplinked::<V4>(node, frontends.clone());
            let delivered = |p: &PacketSpec| {
                rewritten(p, |p| {
                    p.dst = V4::POD_LOCAL;
                    p.dport = POD_PORT;
                })
            };
            let mut cases = Vec::new();
            let mut sport = 41000;
            for (what, src, port, allowed) in [
                ("inside the /25", V4::CLIENT, 443, true),
                ("outside the /25", OUTSIDER, 443, false),
                ("inside a /0", OUTSIDER, 444, true),
                ("with an empty list", V4::CLIENT, 445, false),
                ("to an unrestricted frontend", OUTSIDER, 446, true),
                (
                    "to the NodePort of a restricted Service",
                    OUTSIDER,
                    NODE_PORT,
                    true,
                ),
            ] {
                sport += 1;
                let dst = if port == NODE_PORT {
                    V4::NODE
                } else {
                    V4::LB_IP
                };
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
            let pod = PacketSpec::tcp(V4::POD_CLIENT, 42000, V4::LB_IP, 443);
            assert_eq!(
                fx.run_from_pod(&pod.build()),
                (TC_ACT_OK, delivered(&pod)),
                "{prog:?}: a listed pod"
            );
            let other_pod = PacketSpec::tcp(Ipv4Addr::new(10, 244, 1, 51), 42001, V4::LB_IP, 443);
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
            let again = PacketSpec::tcp(OUTSIDER, 42002, V4::LB_IP, 443);
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

#[test]
fn ipv6_load_balancer_source_ranges_admit_only_listed_clients() {
    use proxy_user::sync::store::MapStore as _;
    const OUTSIDER: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x51, 0, 0, 0, 0, 0, 0x100);
    V6::THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked6(node, Some(NODE6));
            let ranged = frontend_flags::KIND_LOAD_BALANCER | frontend_flags::SOURCE_RANGES;
            for (port, service_id, blocks) in [
                (443, 30, vec!["fd00:50::/64", "fd00:52::1/128"]),
                (444, 31, vec!["::/0"]),
                (445, 32, vec![]),
            ] {
                fx.maps6.write(&Fe6 {
                    addr: LB_IP6,
                    port,
                    proto: PROTO_TCP,
                    service_id,
                    kind: ranged,
                    backend_port: POD_PORT,
                    backends: &[(100 + service_id, POD_LOCAL6)],
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
                ("inside the /64", CLIENT6, 443, true),
                (
                    "the /128",
                    Ipv6Addr::new(0xfd00, 0x52, 0, 0, 0, 0, 0, 1),
                    443,
                    true,
                ),
                ("outside every block", OUTSIDER, 443, false),
                ("inside ::/0", OUTSIDER, 444, true),
                ("with an empty list", CLIENT6, 445, false),
            ] {
                sport += 1;
                let input = from_client6(Packet6::tcp(src, sport, LB_IP6, port));
                let (verdict, out) = fx.run(prog, &input.build());
                if allowed {
                    let want = Packet6 {
                        dst: POD_LOCAL6,
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
// Maglev and source hashing (IPv6): the kernel picks what userspace predicts.

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
    V6::THIS_NODE.run(|node| {
        let backends = hashed_backends();
        for prog in Prog::BOTH {
            let mut fx = uplinked6(node, Some(NODE6));
            fx.maps6.write(&Fe6 {
                addr: NODE6,
                port: MAGLEV_PORT,
                proto: PROTO_TCP,
                service_id: MAGLEV_SERVICE,
                kind: frontend_flags::KIND_NODE_PORT | frontend_flags::ALGO_MAGLEV,
                backend_port: POD_PORT,
                backends: &backends,
                local: None,
            });
            let table = write_maglev_table(&mut fx, MAGLEV_SERVICE, &backends);
            let client_be = addr6_be(CLIENT6.octets());
            let node_be = addr6_be(NODE6.octets());
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
                let input = from_client6(Packet6::tcp(CLIENT6, sport, NODE6, MAGLEV_PORT));
                let (verdict, out) = fx.run(prog, &input.build());
                assert_eq!(verdict, prog.delivered(), "{prog:?} sport {sport}");
                assert_eq!(
                    dst_of::<V6>(&out),
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
            let mut next = from_client6(Packet6::tcp(CLIENT6, sport, NODE6, MAGLEV_PORT));
            next.tcp_flags = TCP_ACK;
            let (verdict, out) = fx.run(prog, &next.build());
            assert_eq!(verdict, prog.delivered());
            assert_eq!(
                dst_of::<V6>(&out),
                (first, POD_PORT),
                "{prog:?}: a tracked flow keeps its backend"
            );
            // A new flow follows the new table.
            let fresh = from_client6(Packet6::tcp(CLIENT6, 42000, NODE6, MAGLEV_PORT));
            let (_, out) = fx.run(prog, &fresh.build());
            assert_eq!(
                dst_of::<V6>(&out),
                (other.1, POD_PORT),
                "{prog:?}: a new flow uses the table"
            );
        }
    });
}

#[test]
fn source_hash_ipv6_frontend_keeps_one_client_on_one_backend_across_source_ports() {
    V6::THIS_NODE.run(|node| {
        let backends = hashed_backends();
        for prog in Prog::BOTH {
            let mut fx = uplinked6(node, Some(NODE6));
            fx.maps6.write(&Fe6 {
                addr: NODE6,
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
                    let input = from_client6(Packet6::tcp(client, sport, NODE6, SOURCE_HASH_PORT));
                    let (verdict, out) = fx.run(prog, &input.build());
                    assert_eq!(verdict, prog.delivered(), "{prog:?} {client} sport {sport}");
                    assert_eq!(
                        dst_of::<V6>(&out),
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
