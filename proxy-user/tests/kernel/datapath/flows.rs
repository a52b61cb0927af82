//! Conntrack and balancing on the pod path: replies translated only for
//! tracked flows, a closed connection's entries, client-IP affinity, new
//! flows spread over the backends, a departed backend, a full table, a pod
//! that is its own backend (hairpin).
use std::net::{Ipv4Addr, Ipv6Addr};

use super::{fixture6, loaded, single_backend, Pods, CLIENT6, POD1_6, SVC_WEB, VIP6};
use crate::support::{
    capacities, cluster_ip,
    family::{ct_key, TestFamily},
    hex, Loaded, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC,
};
use proxy_common::{ct_dir, ct_flags, hairpin, programs};
use proxy_testkit::packet::{checksums_valid, PacketSpec};
use proxy_testkit::packet6::{checksums_valid6, Packet6, NODE_MAC, POD_MAC, PROTO_TCP};
use proxy_testkit::Frame;
use proxy_user::model::{DesiredState, Protocol};
use proxy_user::sync::store::MapStore;

crate::both_families!(
    replies_are_reverse_natted_only_for_tracked_flows,
    a_closed_connection_does_not_capture_a_direct_one_on_the_same_ports,
    new_flows_spread_over_all_backends_and_a_flow_keeps_its_backend,
    a_flow_whose_backend_left_the_service_is_given_a_live_one,
    client_ip_affinity_sends_a_clients_new_flows_to_one_backend_until_it_leaves,
    an_established_tcp_connection_drains_to_its_departed_backend_a_new_one_does_not,
);

/// Whether a translated frame's checksums hold.
fn valid<F: TestFamily>(frame: &[u8]) -> bool {
    F::checksums_valid(frame, frame)
}

fn replies_are_reverse_natted_only_for_tracked_flows<F: Pods>() {
    let mut fx = single_backend::<F>();
    let (client, vip, pod1) = (F::CLIENT, F::VIP, F::POD1);
    for (request, reply) in [
        (
            F::Packet::tcp(client, 41000, vip, 80),
            F::Packet::tcp(pod1, 8080, client, 41000).flags(0x12),
        ),
        (
            F::Packet::udp(client, 41001, vip, 53),
            F::Packet::udp(pod1, 5353, client, 41001),
        ),
    ] {
        // Before the request: nothing is tracked, the reply is not ours.
        let (verdict, output) = fx.tc(programs::TC_TO_POD, &reply.build(), None);
        assert_eq!((verdict, &output), (TC_ACT_UNSPEC, &reply.build()));

        let (verdict, _) = fx.tc(programs::TC_FROM_POD, &request.build(), None);
        assert_eq!(verdict, TC_ACT_OK);
        let (verdict, output) = fx.tc(programs::TC_TO_POD, &reply.build(), None);
        assert_eq!(verdict, TC_ACT_OK);
        let expected = reply.from(vip, request.dst().1).build();
        assert_eq!(output, expected, "reply rewritten to the Service address");
        assert!(valid::<F>(&output));
    }
    // A packet to the client from the backend on another port is not a reply.
    let stray = F::Packet::tcp(pod1, 9999, client, 41000);
    assert_eq!(
        fx.tc(programs::TC_TO_POD, &stray.build(), None),
        (TC_ACT_UNSPEC, stray.build())
    );
    assert_eq!(fx.stat("reversed"), 2);
    // Both directions were rewritten in place, without a tail call.
    assert_eq!(fx.stat("tail_call_missed"), 0);
}

/// A closed connection's entries do not capture a later connection that
/// reuses its ports without going through the frontend: a FIN marks both
/// entries closing, and after it a SYN-ACK from the backend to the same
/// client port passes untouched. A new SYN through the frontend on those
/// ports is a new flow again.
fn a_closed_connection_does_not_capture_a_direct_one_on_the_same_ports<F: Pods>() {
    let (client, vip, pod1) = (F::CLIENT, F::VIP, F::POD1);
    for closer in ["client", "backend"] {
        let mut fx = single_backend::<F>();
        let syn = F::Packet::tcp(client, 43000, vip, 80).flags(0x02);
        let fin_from_client = syn.flags(0x11);
        let fin_from_backend = F::Packet::tcp(pod1, 8080, client, 43000).flags(0x11);
        let syn_ack = F::Packet::tcp(pod1, 8080, client, 43000).flags(0x12);
        let to_vip = |p: &F::Packet| p.from(vip, 80).build();
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
            let entry = |src, sport, dst, dport, dir| {
                F::ct(&fx, &ct_key(src, sport, dst, dport, Protocol::Tcp, dir))
                    .expect("an entry of the closing flow")
            };
            let fwd = entry(client, 43000, vip, 80, ct_dir::FORWARD);
            let reply = entry(pod1, 8080, client, 43000, ct_dir::REPLY);
            assert_ne!(fwd.flags & ct_flags::CLOSING, 0, "{fwd:?}");
            assert_ne!(reply.flags & ct_flags::CLOSING, 0, "{reply:?}");
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
        assert!(valid::<F>(&out));
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
    let mut fx = single_backend::<Ipv4Addr>();
    let (client, vip, pod1) = (Ipv4Addr::CLIENT, Ipv4Addr::VIP, Ipv4Addr::POD1);
    let request = PacketSpec::tcp(client, 42000, vip, 80);
    let reply = PacketSpec {
        tcp_flags: 0x12,
        ..PacketSpec::tcp(pod1, 8080, client, 42000)
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
    assert_eq!(output, reply.from(vip, 80).build());
    assert!(checksums_valid(&output));
}

/// The backend a translated frame goes to.
fn backend_of<F: TestFamily>(frame: &[u8]) -> F {
    F::Packet::dst_of(frame).0
}

fn new_flows_spread_over_all_backends_and_a_flow_keeps_its_backend<F: Pods>() {
    let backends = [(F::POD1, 8080), (F::POD2, 8080), (F::POD3, 8080)];
    let (client, vip) = (F::CLIENT, F::VIP);
    let mut fx = loaded(vec![cluster_ip(vip, 80, Protocol::Tcp, "web", &backends)]);
    let mut hits = [0u32; 3];
    for port in 0..300u16 {
        let (verdict, out) = fx.tc(
            programs::TC_FROM_POD,
            &F::Packet::tcp(client, 20000 + port, vip, 80).build(),
            None,
        );
        assert_eq!(verdict, TC_ACT_OK);
        let dst = backend_of::<F>(&out);
        let index = backends
            .iter()
            .position(|(ip, _)| *ip == dst)
            .expect("a known backend");
        hits[index] += 1;
    }
    // Uniform would be 100 each; 50 is far outside random variation.
    assert!(hits.iter().all(|h| *h >= 50), "uneven spread: {hits:?}");

    let flow = F::Packet::tcp(client, 33333, vip, 80).build();
    let (_, first) = fx.tc(programs::TC_FROM_POD, &flow, None);
    for _ in 0..20 {
        let (_, again) = fx.tc(programs::TC_FROM_POD, &flow, None);
        assert_eq!(
            backend_of::<F>(&again),
            backend_of::<F>(&first),
            "a tracked flow stays on its backend"
        );
    }
}

fn a_flow_whose_backend_left_the_service_is_given_a_live_one<F: Pods>() {
    let (client, vip) = (F::CLIENT, F::VIP);
    let dns = |pod| cluster_ip(vip, 53, Protocol::Udp, "dns", &[(pod, 5353)]);
    let mut fx = loaded(vec![dns(F::POD1)]);
    let query = F::Packet::udp(client, 42000, vip, 53).build();
    let (_, out) = fx.tc(programs::TC_FROM_POD, &query, None);
    assert_eq!(backend_of::<F>(&out), F::POD1);
    let report = fx.program(vec![dns(F::POD2)]);
    assert!(report.conntrack_purged >= 1, "{report:?}");
    let (verdict, out) = fx.tc(programs::TC_FROM_POD, &query, None);
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(
        backend_of::<F>(&out),
        F::POD2,
        "the same UDP flow now reaches the live backend"
    );
    assert!(fx.syncer.store().dump().backends.len() == 1);
}

fn client_ip_affinity_sends_a_clients_new_flows_to_one_backend_until_it_leaves<F: Pods>() {
    let backends = [(F::POD1, 8080), (F::POD2, 8080), (F::POD3, 8080)];
    let (client, vip) = (F::CLIENT, F::VIP);
    let mut sticky = cluster_ip(vip, 80, Protocol::Tcp, "sticky", &backends);
    sticky.affinity_timeout_s = Some(10800);
    let mut fx = loaded(vec![sticky.clone()]);
    let syn = |src, sport| F::Packet::tcp(src, sport, vip, 80).build();

    let (_, first) = fx.tc(programs::TC_FROM_POD, &syn(client, 50000), None);
    let chosen = backend_of::<F>(&first);
    assert!(backends.iter().any(|b| b.0 == chosen), "{chosen}");
    for port in 1..40u16 {
        let (verdict, out) = fx.tc(programs::TC_FROM_POD, &syn(client, 50000 + port), None);
        assert_eq!(verdict, TC_ACT_OK);
        assert!(valid::<F>(&out));
        assert_eq!(
            backend_of::<F>(&out),
            chosen,
            "new flow {port} of the same client left its affinity backend"
        );
    }
    assert_eq!(fx.stat("affinity_hit"), 39);

    // Other clients are spread as usual, and each sticks too.
    let mut seen = std::collections::BTreeSet::new();
    for last in 1..=60u8 {
        let other = F::other_client(last);
        let (_, out) = fx.tc(programs::TC_FROM_POD, &syn(other, 40000), None);
        let theirs = backend_of::<F>(&out);
        seen.insert(theirs);
        if last <= 4 {
            for port in 1..8 {
                let (_, out) = fx.tc(programs::TC_FROM_POD, &syn(other, 40000 + port), None);
                assert_eq!(backend_of::<F>(&out), theirs, "client {other} sticks");
            }
        }
    }
    assert_eq!(
        seen.len(),
        3,
        "60 clients should reach all 3 backends: {seen:?}"
    );

    // The affinity backend leaves the service: the client's next flow goes elsewhere.
    sticky.backends.retain(|b| b.ip != chosen.into());
    let desired = DesiredState {
        frontends: [(sticky.addr, sticky.clone())].into_iter().collect(),
    };
    assert!(fx.syncer.apply(&desired).failed.is_empty());
    for port in 0..20u16 {
        let (verdict, out) = fx.tc(programs::TC_FROM_POD, &syn(client, 51000 + port), None);
        assert_eq!(verdict, TC_ACT_OK);
        assert_ne!(
            backend_of::<F>(&out),
            chosen,
            "a backend that left the service must not be reused by affinity"
        );
    }
}

fn an_established_tcp_connection_drains_to_its_departed_backend_a_new_one_does_not<F: Pods>() {
    let (client, vip) = (F::CLIENT, F::VIP);
    let web = |pod| cluster_ip(vip, 80, Protocol::Tcp, "web", &[(pod, 8080)]);
    let mut fx = loaded(vec![web(F::POD1)]);
    let syn = F::Packet::tcp(client, 43000, vip, 80);
    let ack = syn.flags(0x10);
    let (_, out) = fx.tc(programs::TC_FROM_POD, &syn.build(), None);
    assert_eq!(backend_of::<F>(&out), F::POD1);
    // The endpoint leaves; POD2 takes over.
    let desired = DesiredState {
        frontends: [web(F::POD2)].into_iter().map(|f| (f.addr, f)).collect(),
    };
    assert!(fx.syncer.apply(&desired).failed.is_empty());
    // Segments of the established connection still reach POD1, rewritten
    // exactly as before.
    let (verdict, out) = fx.tc(programs::TC_FROM_POD, &ack.build(), None);
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(out, ack.to(F::POD1, 8080).build());
    // A new connection reusing the same ports goes to the live backend.
    let (_, out) = fx.tc(programs::TC_FROM_POD, &syn.build(), None);
    assert_eq!(backend_of::<F>(&out), F::POD2);
    assert_eq!(fx.stat("ct_reselected"), 1);
}

#[test]
fn a_full_ipv6_conntrack_table_drops_new_flows_and_keeps_tracked_ones() {
    // Room for two flows (two entries each).
    let mut fx = Loaded::new(capacities(4), Vec::new());
    let (client, vip, pod1) = (CLIENT6, VIP6, POD1_6);
    fx.maps6
        .frontend(vip, 80, PROTO_TCP, SVC_WEB, None, &[(901, pod1, 8080)]);
    let handshake = |fx: &mut Loaded, port: u16| {
        let syn = Packet6::tcp(client, port, vip, 80);
        assert_eq!(
            fx.run(programs::TC_FROM_POD, &syn.build()).0,
            TC_ACT_OK,
            "SYN {port}"
        );
        let syn_ack = Packet6::tcp(pod1, 8080, client, port).flags(0x12);
        assert_eq!(
            fx.run(programs::TC_TO_POD, &syn_ack.build()).0,
            TC_ACT_OK,
            "SYN-ACK {port}"
        );
        let ack = Packet6::tcp(client, port, vip, 80).flags(0x10);
        assert_eq!(
            fx.run(programs::TC_FROM_POD, &ack.build()).0,
            TC_ACT_OK,
            "ACK {port}"
        );
    };
    let forward = |port| ct_key(client, port, vip, 80, Protocol::Tcp, ct_dir::FORWARD);
    handshake(&mut fx, 49000);
    // A SYN never answered gives way to the next new flow, which completes
    // its handshake.
    let unanswered = Packet6::tcp(client, 48999, vip, 80);
    assert_eq!(
        fx.run(programs::TC_FROM_POD, &unanswered.build()).0,
        TC_ACT_OK
    );
    handshake(&mut fx, 49001);
    assert!(fx.maps6.ct(&forward(48999)).is_none());
    assert_eq!(fx.stat("ct_full"), 0);
    // Two established flows: a new one is refused.
    let third = Packet6::tcp(client, 49002, vip, 80);
    assert_eq!(fx.run(programs::TC_FROM_POD, &third.build()).0, TC_ACT_SHOT);
    assert_eq!(fx.stat("ct_full"), 1);
    assert!(fx.maps6.ct(&forward(49002)).is_none());
    // A tracked flow goes on.
    let ack = Packet6::tcp(client, 49000, vip, 80).flags(0x10);
    let (verdict, out) = fx.run(programs::TC_FROM_POD, &ack.build());
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(out, ack.to(pod1, 8080).build());
    // SYN, ACK, SYN, SYN, ACK, ACK forwarded; three flows created.
    assert_eq!(fx.service_packets(SVC_WEB), (6, 3, 0));
}

#[test]
fn an_ipv6_pod_that_is_its_own_backend_is_reached_from_the_hairpin_address() {
    let mut fx = fixture6();
    let (client, vip) = (CLIENT6, VIP6);
    let hairpin_addr = Ipv6Addr::from(hairpin::ADDR6);
    let syn = Packet6::tcp(client, 46000, vip, 9090);
    let (verdict, out) = fx.run(programs::TC_FROM_POD, &syn.build());
    let want = Packet6 {
        src_mac: NODE_MAC,
        dst_mac: POD_MAC,
        ..syn.from(hairpin_addr, 46000).to(client, 9191)
    };
    assert_eq!((verdict, hex(&out)), (TC_ACT_REDIRECT, hex(&want.build())));
    assert!(checksums_valid6(&out, false));

    // The pod answers the hairpin address; the answer goes back in from the
    // frontend.
    let answer = Packet6::tcp(client, 9191, hairpin_addr, 46000).flags(0x12);
    let (verdict, out) = fx.run(programs::TC_FROM_POD, &answer.build());
    let want = Packet6 {
        src_mac: NODE_MAC,
        dst_mac: POD_MAC,
        ..answer.from(vip, 9090).to(client, 46000)
    };
    assert_eq!((verdict, hex(&out)), (TC_ACT_REDIRECT, hex(&want.build())));
    assert!(checksums_valid6(&out, false));
    assert_eq!(fx.stat("forwarded"), 1);
    assert_eq!(fx.stat("reversed"), 1);

    // Anything else to the hairpin address is not ours.
    let stray = Packet6::tcp(client, 9191, hairpin_addr, 47000);
    assert_eq!(
        fx.run(programs::TC_FROM_POD, &stray.build()),
        (TC_ACT_UNSPEC, stray.build())
    );
}
