//! Packet fixtures through BPF_PROG_TEST_RUN: each case feeds a frame to one
//! of the tc programs and checks the verdict and the exact output frame
//! (checksums included), the way Katran's tests do. Needs root (CAP_BPF).
use std::net::Ipv4Addr;

use crate::support::{
    capacities, cluster_ip, rewritten, translated_checksums, truncated, Case, Hook, Loaded,
    TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_UNSPEC,
};
use proxy_common::programs;
use proxy_testkit::packet::{checksums_valid, PacketSpec};
use proxy_user::dataplane::kctx::Access;
use proxy_user::{
    model::{DesiredState, Frontend, Protocol},
    sync::store::MapStore,
};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 99);
const POD1: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
const POD3: Ipv4Addr = Ipv4Addr::new(10, 244, 3, 2);

/// One backend per frontend, so every rewrite is predictable; plus a
/// frontend without endpoints.
fn single_backend() -> Loaded {
    single_backend_as(&Access::detect())
}

/// [`single_backend`] with the checksum state read as `access` says.
fn single_backend_as(access: &Access) -> Loaded {
    let frontends = vec![
        cluster_ip(VIP, 80, Protocol::Tcp, "web", &[(POD1, 8080)]),
        cluster_ip(VIP, 53, Protocol::Udp, "dns", &[(POD1, 5353)]),
        cluster_ip(EMPTY_VIP, 80, Protocol::Tcp, "empty", &[]),
    ];
    Loaded::new_as(capacities(4096), frontends, access)
}

fn loaded(frontends: Vec<Frontend>) -> Loaded {
    Loaded::new(capacities(4096), frontends)
}

/// The fixtures with each L4 checksum update in place, from the skb's
/// `ip_summed` (read through the kfunc this kernel has).
#[test]
fn request_and_malformed_fixtures() {
    let access = Access::detect();
    assert!(
        matches!(access, Access::Kfunc(_)),
        "this kernel (6.2+, with BTF) should give the programs ip_summed: {access:?}"
    );
    request_and_malformed(&access);
}

/// The same fixtures, the same packets out, with every L4 checksum update
/// through `bpf_l4_csum_replace`, as on a kernel without the kfunc.
#[test]
fn request_and_malformed_fixtures_through_the_checksum_helper() {
    request_and_malformed(&Access::Helper);
}

fn request_and_malformed(access: &Access) {
    let mut fx = single_backend_as(access);
    let syn = PacketSpec::tcp(CLIENT, 40000, VIP, 80);
    let udp = PacketSpec::udp(CLIENT, 40001, VIP, 53);
    let udp_nocsum = PacketSpec {
        udp_zero_checksum: true,
        ..PacketSpec::udp(CLIENT, 40002, VIP, 53)
    };
    let options = PacketSpec {
        ip_option_words: 3,
        ..PacketSpec::tcp(CLIENT, 40003, VIP, 80)
    };
    let first_fragment = PacketSpec {
        frag_off: 0x2000,
        ..PacketSpec::udp(CLIENT, 40004, VIP, 53)
    };
    // Another datagram's (its id differs): nothing known about it.
    let later_fragment = PacketSpec {
        frag_off: 0x0010,
        ip_id: 0x9999,
        ..PacketSpec::udp(CLIENT, 40005, VIP, 53)
    };
    let other_host = PacketSpec::tcp(CLIENT, 40006, POD2, 8080);
    let other_port = PacketSpec::tcp(CLIENT, 40007, VIP, 443);
    let icmp = PacketSpec {
        proto: 1,
        payload: vec![8, 0, 0xf7, 0xff, 0, 0, 0, 0],
        ..PacketSpec::tcp(CLIENT, 0, VIP, 0)
    };
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend_from_slice(&[0u8; 28]);
    let mut ipv6 = PacketSpec::tcp(CLIENT, 40008, VIP, 80).build();
    ipv6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
    // Claims more bytes than it has: the TCP header is cut short.
    let cut_tcp = truncated(syn.build(), 14 + 20 + 10);
    // (A frame cut inside the IPv4 header cannot be fed: BPF_PROG_TEST_RUN
    // itself rejects IPv4 frames shorter than 20 bytes of IP header.)
    let mut bad_ihl = PacketSpec::tcp(CLIENT, 40009, VIP, 80).build();
    bad_ihl[14] = 0x43;
    let mut short_total = PacketSpec::tcp(CLIENT, 40010, VIP, 80).build();
    short_total[16..18].copy_from_slice(&24u16.to_be_bytes());

    let cases = vec![
        Case {
            name: "TCP SYN to the ClusterIP is DNATed to the backend".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: syn.build(),
            verdict: TC_ACT_OK,
            output: rewritten(&syn, |p| {
                p.dst = POD1;
                p.dport = 8080;
            }),
        },
        Case {
            name: "UDP to the ClusterIP is DNATed with its checksum fixed".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: udp.build(),
            verdict: TC_ACT_OK,
            output: rewritten(&udp, |p| {
                p.dst = POD1;
                p.dport = 5353;
            }),
        },
        Case {
            name: "UDP without checksum keeps checksum 0".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: udp_nocsum.build(),
            verdict: TC_ACT_OK,
            output: rewritten(&udp_nocsum, |p| {
                p.dst = POD1;
                p.dport = 5353;
            }),
        },
        Case {
            name: "IPv4 options: ports found after the options, header checksum fixed".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: options.build(),
            verdict: TC_ACT_OK,
            output: rewritten(&options, |p| {
                p.dst = POD1;
                p.dport = 8080;
            }),
        },
        Case {
            name: "first fragment is DNATed like a whole datagram".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: first_fragment.build(),
            verdict: TC_ACT_OK,
            output: rewritten(&first_fragment, |p| {
                p.dst = POD1;
                p.dport = 5353;
            }),
        },
        Case {
            name: "a later fragment of an unknown datagram is passed untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: later_fragment.build(),
            verdict: TC_ACT_UNSPEC,
            output: later_fragment.build(),
        },
        Case {
            name: "traffic to a pod IP is not ours".into(),
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
            name: "ICMP to the ClusterIP is not ours".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: icmp.build(),
            verdict: TC_ACT_UNSPEC,
            output: icmp.build(),
        },
        Case {
            name: "ARP passes".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: arp.clone(),
            verdict: TC_ACT_UNSPEC,
            output: arp,
        },
        Case {
            name: "IPv6 passes".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: ipv6.clone(),
            verdict: TC_ACT_UNSPEC,
            output: ipv6,
        },
        Case {
            name: "truncated TCP header passes untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: cut_tcp.clone(),
            verdict: TC_ACT_UNSPEC,
            output: cut_tcp,
        },
        Case {
            name: "IHL below 5 passes untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: bad_ihl.clone(),
            verdict: TC_ACT_UNSPEC,
            output: bad_ihl,
        },
        Case {
            name: "total length shorter than the headers passes untouched".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: short_total.clone(),
            verdict: TC_ACT_UNSPEC,
            output: short_total,
        },
        Case {
            // kube-proxy's REJECT: more in datapath_reject.rs.
            name: "a frontend without endpoints answers with ICMP port unreachable".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: PacketSpec::tcp(CLIENT, 40011, EMPTY_VIP, 80).build(),
            verdict: TC_ACT_REDIRECT,
            output: proxy_testkit::packet::icmp_port_unreachable(
                &PacketSpec::tcp(CLIENT, 40011, EMPTY_VIP, 80).build(),
            ),
        },
    ];

    fx.run_table(&cases, translated_checksums::<Ipv4Addr>);

    // Fragments: the first is translated, the unknown later one counted
    // (more in datapath_frag.rs).
    assert_eq!(fx.stat("fragment"), 0);
    assert_eq!(fx.stat("frag_unknown"), 1);
    assert_eq!(fx.stat("malformed"), 3);
    assert_eq!(fx.stat("drop_no_backend"), 0);
    assert_eq!(fx.stat("rejected"), 1);
    assert_eq!(fx.stat("forwarded"), 5);
    let rows = proxy_user::dataplane::readout::read_services(fx.syncer.store());
    let empty = rows
        .iter()
        .find(|r| r.service == "test/empty")
        .expect("empty service row");
    assert_eq!(empty.drops_no_backend, 1);
    let web = rows
        .iter()
        .find(|r| r.service == "test/web")
        .expect("web row");
    assert_eq!((web.packets, web.new_flows), (2, 2));
    let stats = proxy_user::dataplane::readout::read_stats(fx.syncer.store());
    assert_eq!(stats.counters["forwarded"], 5);
    let fe = &stats.maps[0];
    // web and dns: slot 0 + one backend each; empty: slot 0 only.
    assert_eq!((fe.map, fe.entries, fe.capacity), ("SB_FE_V1", 5, 1024));
    let ct = stats
        .maps
        .iter()
        .find(|m| m.map == proxy_common::names::CONNTRACK)
        .expect("conntrack row");
    assert_eq!(ct.entries, 10, "two CT entries per new flow: {stats:?}");
}

#[test]
fn replies_are_reverse_natted_only_for_tracked_flows() {
    let mut fx = single_backend();
    for (request, reply) in [
        (
            PacketSpec::tcp(CLIENT, 41000, VIP, 80),
            PacketSpec {
                tcp_flags: 0x12,
                ..PacketSpec::tcp(POD1, 8080, CLIENT, 41000)
            },
        ),
        (
            PacketSpec::udp(CLIENT, 41001, VIP, 53),
            PacketSpec::udp(POD1, 5353, CLIENT, 41001),
        ),
    ] {
        // Before the request: nothing is tracked, the reply is not ours.
        let (verdict, output) = fx.tc(programs::TC_TO_POD, &reply.build(), None);
        assert_eq!((verdict, &output), (TC_ACT_UNSPEC, &reply.build()));

        let (verdict, _) = fx.tc(programs::TC_FROM_POD, &request.build(), None);
        assert_eq!(verdict, TC_ACT_OK);
        let (verdict, output) = fx.tc(programs::TC_TO_POD, &reply.build(), None);
        assert_eq!(verdict, TC_ACT_OK);
        let expected = rewritten(&reply, |p| {
            p.src = VIP;
            p.sport = request.dport;
        });
        assert_eq!(output, expected, "reply rewritten to the Service address");
        assert!(checksums_valid(&output));
    }
    // A packet to the client from the backend on another port is not a reply.
    let stray = PacketSpec::tcp(POD1, 9999, CLIENT, 41000);
    assert_eq!(
        fx.tc(programs::TC_TO_POD, &stray.build(), None),
        (TC_ACT_UNSPEC, stray.build())
    );
    assert_eq!(fx.stat("reversed"), 2);
    // Both directions were rewritten in place, without a tail call.
    assert_eq!(fx.stat("tail_call_missed"), 0);
}

/// A closed connection's entries do not capture a later connection that
/// reuses its ports without going through the frontend: after a FIN, a
/// SYN-ACK from the backend to the same client port passes untouched. A new
/// SYN through the frontend on those ports is a new flow again.
#[test]
fn a_closed_connection_does_not_capture_a_direct_one_on_the_same_ports() {
    for closer in ["client", "backend"] {
        let mut fx = single_backend();
        let syn = PacketSpec {
            tcp_flags: 0x02,
            ..PacketSpec::tcp(CLIENT, 43000, VIP, 80)
        };
        let fin_from_client = PacketSpec {
            tcp_flags: 0x11,
            ..PacketSpec::tcp(CLIENT, 43000, VIP, 80)
        };
        let fin_from_backend = PacketSpec {
            tcp_flags: 0x11,
            ..PacketSpec::tcp(POD1, 8080, CLIENT, 43000)
        };
        let syn_ack = PacketSpec {
            tcp_flags: 0x12,
            ..PacketSpec::tcp(POD1, 8080, CLIENT, 43000)
        };
        let to_vip = |p: &PacketSpec| {
            rewritten(p, |p| {
                p.src = VIP;
                p.sport = 80;
            })
        };
        assert_eq!(
            fx.tc(programs::TC_FROM_POD, &syn.build(), None).0,
            TC_ACT_OK
        );
        assert_eq!(
            fx.tc(programs::TC_TO_POD, &syn_ack.build(), None),
            (TC_ACT_OK, to_vip(&syn_ack)),
            "the service connection's SYN-ACK is translated"
        );
        if closer == "client" {
            assert_eq!(
                fx.tc(programs::TC_FROM_POD, &fin_from_client.build(), None)
                    .0,
                TC_ACT_OK
            );
        }
        // The closing connection's own packets are still translated.
        assert_eq!(
            fx.tc(programs::TC_TO_POD, &fin_from_backend.build(), None),
            (TC_ACT_OK, to_vip(&fin_from_backend)),
            "{closer} closed: the backend's FIN"
        );
        // A direct connection from the same client port to the pod.
        assert_eq!(
            fx.tc(programs::TC_TO_POD, &syn_ack.build(), None),
            (TC_ACT_UNSPEC, syn_ack.build()),
            "{closer} closed: a direct connection's SYN-ACK must pass untouched"
        );
        assert_eq!(fx.stat("ct_stale"), 1);
        // The same ports through the frontend again: a new flow, translated.
        let (verdict, out) = fx.tc(programs::TC_FROM_POD, &syn.build(), None);
        assert_eq!(verdict, TC_ACT_OK);
        assert!(checksums_valid(&out));
        assert_eq!(
            fx.tc(programs::TC_TO_POD, &syn_ack.build(), None),
            (TC_ACT_OK, to_vip(&syn_ack)),
            "{closer} closed: a new flow through the frontend"
        );
    }
}

/// A reply is translated from its connection-tracking entry alone: with the
/// reverse-NAT map emptied, the reply still gets the frontend as its source.
#[test]
fn a_reply_needs_only_its_conntrack_entry() {
    let mut fx = single_backend();
    let request = PacketSpec::tcp(CLIENT, 42000, VIP, 80);
    let reply = PacketSpec {
        tcp_flags: 0x12,
        ..PacketSpec::tcp(POD1, 8080, CLIENT, 42000)
    };
    assert_eq!(
        fx.tc(programs::TC_FROM_POD, &request.build(), None).0,
        TC_ACT_OK
    );
    let ids: Vec<u32> = fx
        .syncer
        .store()
        .dump()
        .revnat
        .iter()
        .map(|(id, _)| *id)
        .collect();
    assert!(!ids.is_empty());
    for id in ids {
        fx.syncer
            .store_mut()
            .revnat
            .remove(&id)
            .expect("remove rev-NAT entry");
    }
    let (verdict, output) = fx.tc(programs::TC_TO_POD, &reply.build(), None);
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(
        output,
        rewritten(&reply, |p| {
            p.src = VIP;
            p.sport = 80;
        })
    );
    assert!(checksums_valid(&output));
}

#[test]
fn new_flows_spread_over_all_backends_and_a_flow_keeps_its_backend() {
    let backends = [(POD1, 8080), (POD2, 8080), (POD3, 8080)];
    let mut fx = loaded(vec![cluster_ip(VIP, 80, Protocol::Tcp, "web", &backends)]);
    let mut hits = [0u32; 3];
    for port in 0..300u16 {
        let (verdict, out) = fx.tc(
            programs::TC_FROM_POD,
            &PacketSpec::tcp(CLIENT, 20000 + port, VIP, 80).build(),
            None,
        );
        assert_eq!(verdict, TC_ACT_OK);
        let dst = Ipv4Addr::new(out[30], out[31], out[32], out[33]);
        let index = backends
            .iter()
            .position(|(ip, _)| *ip == dst)
            .expect("a known backend");
        hits[index] += 1;
    }
    // Uniform would be 100 each; 50 is far outside random variation.
    assert!(hits.iter().all(|h| *h >= 50), "uneven spread: {hits:?}");

    let flow = PacketSpec::tcp(CLIENT, 33333, VIP, 80).build();
    let (_, first) = fx.tc(programs::TC_FROM_POD, &flow, None);
    for _ in 0..20 {
        let (_, again) = fx.tc(programs::TC_FROM_POD, &flow, None);
        assert_eq!(
            again[30..34],
            first[30..34],
            "a tracked flow stays on its backend"
        );
    }
}

#[test]
fn a_flow_whose_backend_left_the_service_is_given_a_live_one() {
    let mut fx = loaded(vec![cluster_ip(
        VIP,
        53,
        Protocol::Udp,
        "dns",
        &[(POD1, 5353)],
    )]);
    let query = PacketSpec::udp(CLIENT, 42000, VIP, 53).build();
    let (_, out) = fx.tc(programs::TC_FROM_POD, &query, None);
    assert_eq!(out[30..34], POD1.octets());
    let report = fx.program(vec![cluster_ip(
        VIP,
        53,
        Protocol::Udp,
        "dns",
        &[(POD2, 5353)],
    )]);
    assert!(report.conntrack_purged >= 1, "{report:?}");
    let (verdict, out) = fx.tc(programs::TC_FROM_POD, &query, None);
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(
        out[30..34],
        POD2.octets(),
        "the same UDP flow now reaches the live backend"
    );
    assert!(fx.syncer.store().dump().backends.len() == 1);
}

#[test]
fn client_ip_affinity_sends_a_clients_new_flows_to_one_backend_until_it_leaves() {
    let backends = [(POD1, 8080), (POD2, 8080), (POD3, 8080)];
    let mut sticky = cluster_ip(VIP, 80, Protocol::Tcp, "sticky", &backends);
    sticky.affinity_timeout_s = Some(10800);
    let mut fx = loaded(vec![sticky.clone()]);
    let dst = |out: &[u8]| Ipv4Addr::new(out[30], out[31], out[32], out[33]);

    let (_, first) = fx.tc(
        programs::TC_FROM_POD,
        &PacketSpec::tcp(CLIENT, 50000, VIP, 80).build(),
        None,
    );
    let chosen = dst(&first);
    for port in 1..40u16 {
        let (verdict, out) = fx.tc(
            programs::TC_FROM_POD,
            &PacketSpec::tcp(CLIENT, 50000 + port, VIP, 80).build(),
            None,
        );
        assert_eq!(verdict, TC_ACT_OK);
        assert_eq!(
            dst(&out),
            chosen,
            "new flow {port} of the same client left its affinity backend"
        );
    }
    assert_eq!(fx.stat("affinity_hit"), 39);

    // Other clients are spread as usual.
    let mut seen = std::collections::BTreeSet::new();
    for last in 1..=60u8 {
        let other = Ipv4Addr::new(10, 244, 200, last);
        let (_, out) = fx.tc(
            programs::TC_FROM_POD,
            &PacketSpec::tcp(other, 40000, VIP, 80).build(),
            None,
        );
        seen.insert(dst(&out));
    }
    assert_eq!(
        seen.len(),
        3,
        "60 clients should reach all 3 backends: {seen:?}"
    );

    // The affinity backend leaves the service: the client's next flow goes elsewhere.
    sticky.backends.retain(|b| b.ip != chosen);
    let desired = DesiredState {
        frontends: [(sticky.addr, sticky.clone())].into_iter().collect(),
    };
    assert!(fx.syncer.apply(&desired).failed.is_empty());
    for port in 0..20u16 {
        let (verdict, out) = fx.tc(
            programs::TC_FROM_POD,
            &PacketSpec::tcp(CLIENT, 51000 + port, VIP, 80).build(),
            None,
        );
        assert_eq!(verdict, TC_ACT_OK);
        assert_ne!(
            dst(&out),
            chosen,
            "a backend that left the service must not be reused by affinity"
        );
    }
}

#[test]
fn an_established_tcp_connection_drains_to_its_departed_backend_a_new_one_does_not() {
    let mut fx = loaded(vec![cluster_ip(
        VIP,
        80,
        Protocol::Tcp,
        "web",
        &[(POD1, 8080)],
    )]);
    let syn = PacketSpec::tcp(CLIENT, 43000, VIP, 80);
    let ack = PacketSpec {
        tcp_flags: 0x10,
        ..syn.clone()
    };
    let (_, out) = fx.tc(programs::TC_FROM_POD, &syn.build(), None);
    assert_eq!(out[30..34], POD1.octets());
    // The endpoint leaves; POD2 takes over.
    let desired = DesiredState {
        frontends: [cluster_ip(VIP, 80, Protocol::Tcp, "web", &[(POD2, 8080)])]
            .into_iter()
            .map(|f| (f.addr, f))
            .collect(),
    };
    assert!(fx.syncer.apply(&desired).failed.is_empty());
    // Segments of the established connection still reach POD1, rewritten
    // exactly as before.
    let (verdict, out) = fx.tc(programs::TC_FROM_POD, &ack.build(), None);
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(
        out,
        rewritten(&ack, |p| {
            p.dst = POD1;
            p.dport = 8080;
        })
    );
    // A new connection reusing the same ports goes to the live backend.
    let (_, out) = fx.tc(programs::TC_FROM_POD, &syn.build(), None);
    assert_eq!(out[30..34], POD2.octets());
    assert_eq!(fx.stat("ct_reselected"), 1);
}
