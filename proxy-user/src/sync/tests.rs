pub(crate) use super::memstore::{k, MemStore};
use super::*;
use crate::model::FrontendKind;
use crate::model::ServicePortName;
use crate::model::{Frontend, Protocol};
use crate::sync::encode::{backend_addr, revnat_name, revnat_value, AnyBackend, AnyRevNat};
use proxy_common::{capacity, FrontendSlot};
use proxy_common::{Backend, CtEntry, CtKey};
use std::net::{Ipv4Addr, Ipv6Addr};

pub(crate) fn fe(
    ip: [u8; 4],
    port: u16,
    protocol: Protocol,
    name: &str,
    backends: &[(u8, u16)],
) -> Frontend {
    Frontend::cluster_ip(
        FrontendAddr {
            ip: IpAddr::from(ip),
            port,
            protocol,
        },
        ServicePortName {
            namespace: "default".into(),
            name: name.into(),
            port: "".into(),
        },
        backends
            .iter()
            .map(|(last, port)| BackendAddr {
                ip: Ipv4Addr::new(10, 244, 0, *last).into(),
                port: *port,
            })
            .collect(),
    )
}

pub(crate) fn state(frontends: Vec<Frontend>) -> DesiredState {
    DesiredState {
        frontends: frontends.into_iter().map(|f| (f.addr, f)).collect(),
    }
}

pub(crate) fn caps() -> Capacities {
    Capacities::default()
}

/// The id the sync gave `backend`.
fn backend_id(s: &Syncer<MemStore>, backend: BackendAddr, protocol: Protocol) -> u32 {
    s.backends
        .id_of(backend, protocol)
        .expect("the backend is held")
}

#[test]
fn new_service_is_written_with_slot_zero_holding_count_and_id() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let web = fe(
        [10, 96, 0, 10],
        80,
        Protocol::Tcp,
        "web",
        &[(1, 8080), (2, 8080)],
    );
    let report = s.apply(&state(vec![web.clone()]));
    assert_eq!(report.added, 1);
    assert!(report.failed.is_empty());
    let store = s.store();
    let head = store.frontends[&k(&frontend_key(&web.addr, 0))];
    assert_eq!(head.backend_count, 2);
    assert_ne!(head.service_id, 0);
    assert_eq!(store.view(&web.addr), Some(web.backends.clone()));
    assert_eq!(
        revnat_name(&store.revnat[&(IpFamily::V4, head.service_id)]),
        "default/web"
    );
    let AnyRevNat::V4(rnat) = store.revnat[&(IpFamily::V4, head.service_id)] else {
        panic!("an IPv4 frontend's reverse NAT is in the IPv4 map");
    };
    assert_eq!(rnat.port_be, 80u16.to_be());
}

#[test]
fn applying_the_same_state_twice_writes_nothing() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let desired = state(vec![fe(
        [10, 96, 0, 10],
        80,
        Protocol::Tcp,
        "web",
        &[(1, 80), (2, 80)],
    )]);
    s.apply(&desired);
    let report = s.apply(&desired);
    assert_eq!(report.writes, 0);
    assert_eq!(report.unchanged, 1);
}

#[test]
fn removing_one_backend_rewrites_only_what_changes() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let three = fe(
        [10, 96, 0, 10],
        80,
        Protocol::Tcp,
        "web",
        &[(1, 80), (2, 80), (3, 80)],
    );
    s.apply(&state(vec![three]));
    let before = s.store().writes;
    let two = fe(
        [10, 96, 0, 10],
        80,
        Protocol::Tcp,
        "web",
        &[(1, 80), (3, 80)],
    );
    let report = s.apply(&state(vec![two.clone()]));
    assert_eq!(report.updated, 1);
    // slot 2 takes backend 3, slot 0 shrinks, slot 3 goes, backend 2 goes.
    assert_eq!(s.store().writes - before, 4);
    assert_eq!(report.writes, 4);
    assert_eq!(s.store().view(&two.addr), Some(two.backends.clone()));
    assert_eq!(s.store().backends.len(), 2);
}

#[test]
fn removed_service_leaves_no_entries_and_purges_its_flows() {
    let mut store = MemStore::default();
    let web = fe([10, 96, 0, 10], 80, Protocol::Tcp, "web", &[(1, 80)]);
    let dns = fe([10, 96, 0, 53], 53, Protocol::Udp, "dns", &[(5, 53)]);
    store.conntrack.push((
        CtKey::default(),
        CtEntry {
            backend_id: 1,
            service_id: 1,
            ..CtEntry::default()
        },
    ));
    let mut s = Syncer::adopt(store, caps());
    s.apply(&state(vec![web.clone(), dns.clone()]));
    let web_id = s.programmed[&web.addr].service_id;
    s.store.conntrack = vec![
        (
            CtKey::default(),
            CtEntry {
                backend_id: 1,
                service_id: web_id,
                ..CtEntry::default()
            },
        ),
        (
            CtKey {
                proto: proto::UDP,
                ..CtKey::default()
            },
            CtEntry {
                backend_id: 9,
                service_id: 99,
                ..CtEntry::default()
            },
        ),
    ];
    let report = s.apply(&state(vec![dns.clone()]));
    assert_eq!(report.removed, 1);
    assert_eq!(report.conntrack_purged, 1);
    assert_eq!(s.store().view(&web.addr), None);
    assert!(s.store().frontends.keys().all(|key| key.2 == 53u16.to_be()));
    assert_eq!(s.store().revnat.len(), 1);
    assert_eq!(s.store().conntrack.len(), 1);
}

#[test]
fn udp_flows_to_a_departed_backend_are_forgotten_tcp_flows_are_kept() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let dns = fe(
        [10, 96, 0, 53],
        53,
        Protocol::Udp,
        "dns",
        &[(1, 53), (2, 53)],
    );
    s.apply(&state(vec![dns.clone()]));
    let id = s.programmed[&dns.addr].service_id;
    let gone = backend_id(&s, dns.backends[1], Protocol::Udp);
    let stays = backend_id(&s, dns.backends[0], Protocol::Udp);
    let udp = CtKey {
        proto: proto::UDP,
        ..CtKey::default()
    };
    s.store.conntrack = vec![
        (
            udp,
            CtEntry {
                backend_id: gone,
                service_id: id,
                ..CtEntry::default()
            },
        ),
        (
            udp,
            CtEntry {
                backend_id: stays,
                service_id: id,
                ..CtEntry::default()
            },
        ),
    ];
    let report = s.apply(&state(vec![fe(
        [10, 96, 0, 53],
        53,
        Protocol::Udp,
        "dns",
        &[(1, 53)],
    )]));
    assert_eq!(report.conntrack_purged, 1);
    assert_eq!(s.store().conntrack[0].1.backend_id, stays);
}

#[test]
fn sockets_balanced_to_a_departed_udp_backend_are_purged_and_reported() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let dns = fe(
        [10, 96, 0, 53],
        53,
        Protocol::Udp,
        "dns",
        &[(1, 53), (2, 53)],
    );
    s.apply(&state(vec![dns.clone()]));
    let id = s.programmed[&dns.addr].service_id;
    let gone_addr = dns.backends[1];
    let gone = backend_id(&s, gone_addr, Protocol::Udp);
    let stays = backend_id(&s, dns.backends[0], Protocol::Udp);
    let sock = |cookie: u64, dir: u8, backend: u32, addr: &BackendAddr| {
        (
            SockKey {
                cookie,
                addr_be: match addr.ip {
                    IpAddr::V4(ip) => u32::from_ne_bytes(ip.octets()),
                    IpAddr::V6(_) => unreachable!("IPv4 test"),
                },
                port_be: addr.port.to_be(),
                proto: proto::UDP,
                dir,
            },
            SockEntry {
                backend_id: backend,
                service_id: id,
                ..SockEntry::default()
            },
        )
    };
    s.store.sockets = vec![
        sock(7, sock_dir::REVERSE, gone, &gone_addr),
        sock(7, sock_dir::FORWARD, gone, &gone_addr),
        sock(8, sock_dir::REVERSE, stays, &dns.backends[0]),
    ];
    let report = s.apply(&state(vec![fe(
        [10, 96, 0, 53],
        53,
        Protocol::Udp,
        "dns",
        &[(1, 53)],
    )]));
    assert_eq!(report.sockets_purged, 2);
    assert_eq!(report.udp_sockets_left, vec![(7, gone_addr)]);
    assert_eq!(s.store().sockets.len(), 1);
    assert_eq!(s.store().sockets[0].0.cookie, 8);
}

#[test]
fn backends_shared_by_two_services_are_stored_once_and_kept_while_used() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let a = fe([10, 96, 0, 1], 80, Protocol::Tcp, "a", &[(1, 80)]);
    let b = fe([10, 96, 0, 2], 80, Protocol::Tcp, "b", &[(1, 80)]);
    s.apply(&state(vec![a.clone(), b.clone()]));
    assert_eq!(s.store().backends.len(), 1);
    s.apply(&state(vec![b.clone()]));
    assert_eq!(s.store().backends.len(), 1);
    assert_eq!(s.store().view(&b.addr), Some(b.backends.clone()));
    s.apply(&DesiredState::default());
    assert!(s.store().backends.is_empty());
    assert!(s.store().frontends.is_empty());
}

#[test]
fn service_without_endpoints_keeps_a_zero_count_entry() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let empty = fe([10, 96, 0, 10], 80, Protocol::Tcp, "web", &[]);
    s.apply(&state(vec![empty.clone()]));
    let head = s.store().frontends[&k(&frontend_key(&empty.addr, 0))];
    assert_eq!(head.backend_count, 0);
    assert_eq!(s.store().view(&empty.addr), Some(vec![]));
}

#[test]
fn a_restarted_syncer_adopts_the_maps_without_rewriting_them() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let desired = state(vec![
        fe(
            [10, 96, 0, 10],
            80,
            Protocol::Tcp,
            "web",
            &[(1, 80), (2, 80)],
        ),
        fe([10, 96, 0, 53], 53, Protocol::Udp, "dns", &[(1, 53)]),
    ]);
    s.apply(&desired);
    let mut store = std::mem::take(&mut s.store);
    store.writes = 0;
    let mut restarted = Syncer::adopt(store, caps());
    assert_eq!(restarted.store().writes, 0);
    let report = restarted.apply(&desired);
    assert_eq!(report.writes, 0, "{report:?}");
    assert_eq!(report.unchanged, 2);
}

#[test]
fn adoption_removes_half_written_frontends_and_orphans() {
    let mut store = MemStore::default();
    let addr = FrontendAddr {
        ip: Ipv4Addr::new(10, 96, 0, 9).into(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    // slot 0 says 2 backends but slot 2 is missing; backend 7 is unused.
    store.frontends.insert(
        k(&frontend_key(&addr, 0)),
        FrontendSlot {
            service_id: 4,
            backend_count: 2,
            ..Default::default()
        },
    );
    store.frontends.insert(
        k(&frontend_key(&addr, 1)),
        FrontendSlot {
            backend_id: 1,
            service_id: 4,
            ..Default::default()
        },
    );
    store
        .backends
        .insert((IpFamily::V4, 1), AnyBackend::V4(Backend::default()));
    store
        .backends
        .insert((IpFamily::V4, 7), AnyBackend::V4(Backend::default()));
    let s = Syncer::adopt(store, caps());
    assert!(s.store().frontends.is_empty());
    assert!(s.store().backends.is_empty());
    assert_eq!(s.programmed().count(), 0);
}

#[test]
fn a_service_that_does_not_fit_is_reported_by_name_and_the_rest_is_programmed() {
    let small = Capacities {
        frontends: 4,
        ..Capacities::default()
    };
    let mut s = Syncer::adopt(MemStore::default(), small);
    let a = fe([10, 96, 0, 1], 80, Protocol::Tcp, "a", &[(1, 80), (2, 80)]);
    let b = fe([10, 96, 0, 2], 80, Protocol::Tcp, "b", &[(3, 80), (4, 80)]);
    let report = s.apply(&state(vec![a.clone(), b.clone()]));
    assert_eq!(report.added, 1);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].service, "default/b");
    assert!(
        report.failed[0].reason.contains("full"),
        "{}",
        report.failed[0].reason
    );
    assert_eq!(s.store().view(&a.addr), Some(a.backends.clone()));
    assert_eq!(s.store().view(&b.addr), None);
}

/// Issue 11: `--max-services N` gives N service ports (ids 1..=N; the
/// counter array has N + 1 entries), not N − 1.
#[test]
fn max_services_n_programs_n_service_ports() {
    let small = Capacities {
        services: 3,
        ..Capacities::default()
    };
    assert_eq!(small.service_stats_entries(), 4);
    let mut s = Syncer::adopt(MemStore::default(), small);
    let fes: Vec<Frontend> = (1..=4u8)
        .map(|i| {
            fe(
                [10, 96, 0, i],
                80,
                Protocol::Tcp,
                &format!("s{i}"),
                &[(i, 80)],
            )
        })
        .collect();
    let report = s.apply(&state(fes[..3].to_vec()));
    assert_eq!(report.added, 3, "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    let ids: BTreeSet<u32> = s.store().revnat.keys().map(|(_, id)| *id).collect();
    assert_eq!(ids, BTreeSet::from([1, 2, 3]));
    let report = s.apply(&state(fes.clone()));
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert_eq!(report.failed[0].service, "default/s4");
    assert!(
        report.failed[0]
            .reason
            .contains("service id space full (3 service ports"),
        "{}",
        report.failed[0].reason
    );
}

#[test]
fn a_frontend_that_did_not_fit_is_programmed_once_another_leaves() {
    let small = Capacities {
        frontends: 4,
        ..Capacities::default()
    };
    let mut s = Syncer::adopt(MemStore::default(), small);
    let a = fe([10, 96, 0, 1], 80, Protocol::Tcp, "a", &[(1, 80), (2, 80)]);
    let b = fe([10, 96, 0, 2], 80, Protocol::Tcp, "b", &[(3, 80), (4, 80)]);
    s.apply(&state(vec![a.clone(), b.clone()]));
    // Only `a` changes (it goes away); `b` is not among the changed
    // frontends, yet it is retried and now fits.
    let report = s.apply_changed(&state(vec![b.clone()]), &BTreeSet::from([a.addr]));
    assert_eq!((report.removed, report.added), (1, 1), "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(s.store().view(&b.addr), Some(b.backends.clone()));
}

#[test]
fn only_the_changed_frontends_are_compared() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let a = fe([10, 96, 0, 1], 80, Protocol::Tcp, "a", &[(1, 80)]);
    let b = fe([10, 96, 0, 2], 80, Protocol::Tcp, "b", &[(2, 80)]);
    s.apply(&state(vec![a.clone(), b.clone()]));
    let mut a2 = a.clone();
    a2.backends = vec![BackendAddr {
        ip: Ipv4Addr::new(10, 244, 0, 9).into(),
        port: 80,
    }];
    let mut b2 = b.clone();
    b2.backends = vec![BackendAddr {
        ip: Ipv4Addr::new(10, 244, 0, 8).into(),
        port: 80,
    }];
    let report = s.apply_changed(&state(vec![a2.clone(), b2]), &BTreeSet::from([a.addr]));
    assert_eq!((report.updated, report.unchanged), (1, 0), "{report:?}");
    assert_eq!(s.store().view(&a.addr), Some(a2.backends));
    // `b` was not reported changed: left as it was.
    assert_eq!(s.store().view(&b.addr), Some(b.backends));
}

#[test]
fn a_full_map_mid_write_keeps_the_old_state_visible() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let a = fe([10, 96, 0, 1], 80, Protocol::Tcp, "a", &[(1, 80)]);
    s.apply(&state(vec![a.clone()]));
    s.store.frontend_limit = Some(2);
    let grown = fe(
        [10, 96, 0, 1],
        80,
        Protocol::Tcp,
        "a",
        &[(1, 80), (2, 80), (3, 80)],
    );
    let report = s.apply(&state(vec![grown]));
    assert_eq!(report.failed.len(), 1);
    assert_eq!(s.store().view(&a.addr), Some(a.backends.clone()));
}

#[test]
fn kind_policy_and_affinity_are_recorded_in_slot_zero_and_a_change_rewrites_it() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let mut np = fe([192, 168, 50, 1], 30080, Protocol::Tcp, "web", &[(1, 80)]);
    np.kind = FrontendKind::NodePort;
    np.local_only = true;
    np.external_backends = Some(np.backends.clone());
    np.affinity_timeout_s = Some(10800);
    s.apply(&state(vec![np.clone()]));
    let head = s.store().frontends[&k(&frontend_key(&np.addr, 0))];
    assert_eq!(
        head.flags & frontend_flags::KIND_MASK,
        frontend_flags::KIND_NODE_PORT
    );
    assert_ne!(head.flags & frontend_flags::LOCAL_ONLY, 0);
    assert_ne!(head.flags & frontend_flags::AFFINITY_CLIENT_IP, 0);
    assert_eq!(head.affinity_timeout_s, 10800);

    np.affinity_timeout_s = None;
    let report = s.apply(&state(vec![np.clone()]));
    // Slot 0 of both sets: traffic from outside has affinity too.
    assert_eq!((report.updated, report.writes), (1, 2), "{report:?}");
    let head = s.store().frontends[&k(&frontend_key(&np.addr, 0))];
    assert_eq!(head.flags & frontend_flags::AFFINITY_CLIENT_IP, 0);
    // Adopted state carries the attributes: no rewrite after a restart.
    let store = std::mem::take(&mut s.store);
    let mut restarted = Syncer::adopt(store, caps());
    assert_eq!(restarted.apply(&state(vec![np])).writes, 0);
}

#[test]
fn external_local_set_is_written_before_it_is_announced_and_removed_after() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let mut np = fe(
        [192, 168, 50, 1],
        30080,
        Protocol::Tcp,
        "web",
        &[(1, 80), (2, 80), (3, 80)],
    );
    np.kind = FrontendKind::NodePort;
    np.local_only = true;
    np.external_backends = Some(vec![np.backends[1]]);
    s.apply(&state(vec![np.clone()]));
    let ext = |s: &Syncer<MemStore>, slot| {
        s.store()
            .frontends
            .get(&k(&scoped_key(&np.addr, scope::EXTERNAL, slot)))
            .copied()
    };
    let head = ext(&s, 0).expect("external slot 0");
    assert_eq!(head.backend_count, 1);
    let internal = s.store().frontends[&k(&frontend_key(&np.addr, 0))];
    assert_eq!(
        head.service_id, internal.service_id,
        "one service id for both sets"
    );
    assert_eq!(
        internal.backend_count, 3,
        "pods and the host keep every endpoint"
    );
    let id = ext(&s, 1).expect("external slot 1").backend_id;
    assert_eq!(
        backend_addr(&s.store().backends[&(IpFamily::V4, id)]),
        np.backends[1]
    );
    // The write order: the external set before the slot 0 that announces it.
    let order = s.store().log.clone();
    let ext_head = order
        .iter()
        .position(|w| w == &format!("put {:?}", k(&scoped_key(&np.addr, scope::EXTERNAL, 0))));
    let int_head = order
        .iter()
        .position(|w| w == &format!("put {:?}", k(&frontend_key(&np.addr, 0))));
    assert!(ext_head < int_head, "{order:?}");

    // A restart adopts both sets without a write.
    let store = std::mem::take(&mut s.store);
    let mut restarted = Syncer::adopt(store, caps());
    let report = restarted.apply(&state(vec![np.clone()]));
    assert_eq!((report.unchanged, report.writes), (1, 0), "{report:?}");

    // No local endpoint left: the set stays, empty (outside traffic is dropped).
    np.external_backends = Some(Vec::new());
    restarted.apply(&state(vec![np.clone()]));
    assert_eq!(ext(&restarted, 0).map(|h| h.backend_count), Some(0));
    assert_eq!(ext(&restarted, 1), None);

    // Back to Cluster: slot 0 stops announcing it, then it goes.
    np.local_only = false;
    np.external_backends = None;
    restarted.apply(&state(vec![np.clone()]));
    assert_eq!(ext(&restarted, 0), None);
    assert_eq!(restarted.store().frontends.len(), 4);
}

#[test]
fn maglev_tables_follow_the_external_set_and_go_with_the_algorithm() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let mut lb = fe(
        [203, 0, 113, 10],
        80,
        Protocol::Tcp,
        "lb",
        &[(1, 80), (2, 80), (3, 80)],
    );
    lb.kind = FrontendKind::LoadBalancer;
    lb.algorithm = Some(LbAlgorithm::Maglev);
    s.apply(&state(vec![lb.clone()]));
    let head = s.store().frontends[&k(&frontend_key(&lb.addr, 0))];
    assert_eq!(
        head.flags & frontend_flags::ALGO_MASK,
        frontend_flags::ALGO_MAGLEV
    );
    let table = s.store().maglev[&head.service_id].clone();
    assert_eq!(table.len(), capacity::MAGLEV_TABLE as usize);
    let ids: BTreeSet<u32> = table.iter().copied().collect();
    let live: BTreeSet<u32> = s.store().backends.keys().map(|(_, id)| *id).collect();
    assert_eq!(
        ids, live,
        "every entry names one of the three backends, and each appears"
    );

    // Another node with its own ids fills the same table by address.
    let mut other = Syncer::adopt(MemStore::default(), caps());
    let decoy = fe([10, 96, 0, 1], 80, Protocol::Tcp, "decoy", &[(9, 80)]);
    other.apply(&state(vec![decoy.clone()]));
    other.apply(&state(vec![decoy, lb.clone()]));
    let other_head = other.store().frontends[&k(&frontend_key(&lb.addr, 0))];
    let by_addr = |s: &Syncer<MemStore>, table: &[u32]| -> Vec<BackendAddr> {
        table
            .iter()
            .map(|id| backend_addr(&s.store().backends[&(IpFamily::V4, *id)]))
            .collect()
    };
    assert_eq!(
        by_addr(&s, &table),
        by_addr(&other, &other.store().maglev[&other_head.service_id]),
        "nodes agree on every entry"
    );

    // Local policy: the table covers what traffic from outside gets.
    lb.local_only = true;
    lb.external_backends = Some(vec![lb.backends[0]]);
    s.apply(&state(vec![lb.clone()]));
    let table = s.store().maglev[&head.service_id].clone();
    assert!(by_addr(&s, &table).iter().all(|b| *b == lb.backends[0]));

    // The agent's default applies when the Service names none.
    lb.algorithm = None;
    s.apply(&state(vec![lb.clone()]));
    assert!(!s.store().maglev.contains_key(&head.service_id));
    s.set_default_algorithm(LbAlgorithm::SourceHash);
    s.apply(&state(vec![lb.clone()]));
    let head = s.store().frontends[&k(&frontend_key(&lb.addr, 0))];
    assert_eq!(
        head.flags & frontend_flags::ALGO_MASK,
        frontend_flags::ALGO_SOURCE_HASH
    );
    assert!(s.store().maglev.contains_key(&head.service_id));
    s.apply(&state(vec![]));
    assert!(s.store().maglev.is_empty(), "removed with its frontend");
}

#[test]
fn place_keeps_survivors_in_their_slots() {
    assert_eq!(place(&[1, 2, 3], &[1, 3]), vec![1, 3]);
    assert_eq!(place(&[1, 2, 3], &[1, 3, 4]), vec![1, 4, 3]);
    assert_eq!(place(&[1, 2, 3], &[3]), vec![3]);
    assert_eq!(place(&[], &[5, 6]), vec![5, 6]);
    assert_eq!(place(&[1, 2], &[1, 2, 7]), vec![1, 2, 7]);
    assert_eq!(place(&[1, 2, 3, 4], &[4, 1]), vec![1, 4]);
    // Adopted from a stopped move: backend 1 in slots 1 and 2.
    assert_eq!(place(&[1, 1], &[1]), vec![1]);
    assert_eq!(place(&[2, 1, 1], &[1, 3]), vec![3, 1]);
}

/// A frontend of IPv6 addresses: `fd00:96::<host>` to `fd00:244::<last>`.
pub(crate) fn fe6(
    host: u16,
    port: u16,
    protocol: Protocol,
    name: &str,
    backends: &[(u16, u16)],
) -> Frontend {
    Frontend::cluster_ip(
        FrontendAddr {
            ip: Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, host).into(),
            port,
            protocol,
        },
        ServicePortName {
            namespace: "default".into(),
            name: name.into(),
            port: "".into(),
        },
        backends
            .iter()
            .map(|(last, port)| BackendAddr {
                ip: Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, *last).into(),
                port: *port,
            })
            .collect(),
    )
}

#[test]
fn an_ipv6_frontend_goes_to_the_ipv6_maps_with_ids_shared_with_ipv4() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let web4 = fe(
        [10, 96, 0, 10],
        80,
        Protocol::Tcp,
        "web",
        &[(1, 8080), (2, 8080)],
    );
    let web6 = fe6(0x10, 80, Protocol::Tcp, "web", &[(1, 8080), (2, 8080)]);
    let report = s.apply(&state(vec![web4.clone(), web6.clone()]));
    assert_eq!(report.added, 2, "{report:?}");
    let store = s.store();
    // Slot 0 and two slots per family, each in its own map.
    assert_eq!(store.frontends_of(IpFamily::V4), 3);
    assert_eq!(store.frontends_of(IpFamily::V6), 3);
    assert_eq!(store.view(&web6.addr), Some(web6.backends.clone()));
    assert_eq!(store.view(&web4.addr), Some(web4.backends.clone()));
    let head6 = store.frontends[&k(&frontend_key(&web6.addr, 0))];
    let head4 = store.frontends[&k(&frontend_key(&web4.addr, 0))];
    assert_ne!(head4.service_id, head6.service_id, "one service id space");
    let AnyRevNat::V6(rnat) = store.revnat[&(IpFamily::V6, head6.service_id)] else {
        panic!("an IPv6 reverse-NAT entry");
    };
    assert_eq!(
        crate::sync::encode::ipv6(rnat.addr_be),
        "fd00:96::10".parse::<Ipv6Addr>().unwrap()
    );
    assert_eq!(revnat_name(&rnat), "default/web");
    assert!(!store.revnat.contains_key(&(IpFamily::V4, head6.service_id)));
    // Backend ids: one space, each id in exactly one family's map.
    let ids4: BTreeSet<u32> = store
        .backends
        .keys()
        .filter(|(f, _)| *f == IpFamily::V4)
        .map(|(_, id)| *id)
        .collect();
    let ids6: BTreeSet<u32> = store
        .backends
        .keys()
        .filter(|(f, _)| *f == IpFamily::V6)
        .map(|(_, id)| *id)
        .collect();
    assert_eq!((ids4.len(), ids6.len()), (2, 2));
    assert!(ids4.is_disjoint(&ids6), "{ids4:?} {ids6:?}");
    assert!(store.backends.values().all(|b| b.proto() == proto::TCP));
}

#[test]
fn an_ipv6_frontend_moves_and_leaves_purging_only_ipv6_flows() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let dns4 = fe([10, 96, 0, 53], 53, Protocol::Udp, "dns", &[(1, 53)]);
    let dns6 = fe6(0x53, 53, Protocol::Udp, "dns", &[(1, 53), (2, 53)]);
    s.apply(&state(vec![dns4.clone(), dns6.clone()]));
    let id6 = s.programmed[&dns6.addr].service_id;
    let id4 = s.programmed[&dns4.addr].service_id;
    let gone = backend_id(&s, dns6.backends[1], Protocol::Udp);
    let stays = backend_id(&s, dns6.backends[0], Protocol::Udp);
    let udp6 = CtKey6 {
        proto: proto::UDP,
        ..CtKey6::default()
    };
    s.store.conntrack6 = vec![
        (
            udp6,
            CtEntry6 {
                backend_id: gone,
                service_id: id6,
                ..CtEntry6::default()
            },
        ),
        (
            udp6,
            CtEntry6 {
                backend_id: stays,
                service_id: id6,
                ..CtEntry6::default()
            },
        ),
    ];
    s.store.conntrack = vec![(
        CtKey {
            proto: proto::UDP,
            ..CtKey::default()
        },
        CtEntry {
            service_id: id4,
            ..CtEntry::default()
        },
    )];
    let gone_addr = dns6.backends[1];
    let proxy_common::Backend6 {
        addr_be: gone_be, ..
    } = match crate::sync::encode::backend_value(gone_addr, Protocol::Udp) {
        AnyBackend::V6(b) => b,
        AnyBackend::V4(_) => panic!("an IPv6 backend"),
    };
    s.store.sockets6 = vec![(
        SockKey6 {
            cookie: 7,
            addr_be: gone_be,
            port_be: 53u16.to_be(),
            proto: proto::UDP,
            dir: sock_dir::REVERSE,
            ..SockKey6::default()
        },
        SockEntry6 {
            backend_id: gone,
            service_id: id6,
            ..SockEntry6::default()
        },
    )];

    // Moved: one backend leaves, one arrives.
    let mut moved = dns6.clone();
    moved.backends = vec![
        dns6.backends[0],
        BackendAddr {
            ip: Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 3).into(),
            port: 53,
        },
    ];
    let report = s.apply(&state(vec![dns4.clone(), moved.clone()]));
    assert_eq!((report.updated, report.unchanged), (1, 1), "{report:?}");
    assert_eq!(s.store().view(&moved.addr), Some(moved.backends.clone()));
    assert_eq!(
        report.conntrack_purged, 1,
        "the flow to the departed IPv6 backend"
    );
    assert_eq!(s.store().conntrack6.len(), 1);
    assert_eq!(s.store().conntrack6[0].1.backend_id, stays);
    assert_eq!(s.store().conntrack.len(), 1, "IPv4 flows untouched");
    assert_eq!(
        report.udp_sockets_left,
        vec![(7, gone_addr)],
        "a connected IPv6 UDP socket to close"
    );
    assert!(!s.store().backends.contains_key(&(IpFamily::V6, gone)));

    // Removed: every IPv6 entry goes, the IPv4 frontend stays.
    let report = s.apply(&state(vec![dns4.clone()]));
    assert_eq!(report.removed, 1, "{report:?}");
    assert_eq!(s.store().frontends_of(IpFamily::V6), 0);
    assert!(s.store().backends.keys().all(|(f, _)| *f == IpFamily::V4));
    assert!(s.store().revnat.keys().all(|(f, _)| *f == IpFamily::V4));
    assert!(
        s.store().conntrack6.is_empty(),
        "the removed service's flows"
    );
    assert_eq!(s.store().conntrack.len(), 1);
    assert_eq!(s.store().view(&dns4.addr), Some(dns4.backends.clone()));
}

#[test]
fn adoption_reads_both_families_and_drops_cross_family_leftovers() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let web4 = fe([10, 96, 0, 10], 80, Protocol::Tcp, "web", &[(1, 8080)]);
    let mut lb6 = fe6(
        0x20,
        443,
        Protocol::Tcp,
        "lb",
        &[(1, 8443), (2, 8443), (3, 8443)],
    );
    lb6.kind = FrontendKind::LoadBalancer;
    lb6.algorithm = Some(LbAlgorithm::Maglev);
    let desired = state(vec![web4.clone(), lb6.clone()]);
    s.apply(&desired);
    let head6 = s.store().frontends[&k(&frontend_key(&lb6.addr, 0))];
    // The Maglev table (shared map) names only the IPv6 backends.
    let table: BTreeSet<u32> = s.store().maglev[&head6.service_id]
        .iter()
        .copied()
        .collect();
    let ids6: BTreeSet<u32> = s
        .store()
        .backends
        .keys()
        .filter(|(f, _)| *f == IpFamily::V6)
        .map(|(_, id)| *id)
        .collect();
    assert_eq!(table, ids6);

    // Leftovers of a crash: an IPv6 backend nothing names, and an IPv4
    // reverse-NAT entry under the IPv6 frontend's service id.
    let mut store = std::mem::take(&mut s.store);
    store
        .put_backend(
            900,
            crate::sync::encode::backend_value(lb6.backends[0], Protocol::Udp),
        )
        .expect("put");
    store
        .put_revnat(head6.service_id, revnat_value(&web4.addr, "stale"))
        .expect("put");
    let mut restarted = Syncer::adopt(store, caps());
    assert!(!restarted
        .store()
        .backends
        .contains_key(&(IpFamily::V6, 900)));
    assert!(!restarted
        .store()
        .revnat
        .contains_key(&(IpFamily::V4, head6.service_id)));
    let report = restarted.apply(&desired);
    assert_eq!((report.unchanged, report.writes), (2, 0), "{report:?}");

    // An IPv6 slot naming an IPv4 backend id is not a complete frontend:
    // adoption drops it and the next sync rewrites it.
    let id4 = backend_id(&restarted, web4.backends[0], Protocol::Tcp);
    let mut store = std::mem::take(&mut restarted.store);
    store.frontends.insert(
        k(&frontend_key(&lb6.addr, 1)),
        FrontendSlot {
            backend_id: id4,
            service_id: head6.service_id,
            ..FrontendSlot::default()
        },
    );
    let mut again = Syncer::adopt(store, caps());
    assert!(again.store().view(&lb6.addr).is_none());
    let report = again.apply(&desired);
    assert_eq!((report.added, report.unchanged), (1, 1), "{report:?}");
    assert_eq!(again.store().view(&lb6.addr), Some(lb6.backends.clone()));
    assert_eq!(again.store().view(&web4.addr), Some(web4.backends.clone()));
}

#[test]
fn adoption_gives_an_id_found_in_both_families_maps_to_one_of_them() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let web4 = fe([10, 96, 0, 10], 80, Protocol::Tcp, "web", &[(1, 8080)]);
    let web6 = fe6(0x10, 80, Protocol::Tcp, "web6", &[(1, 8080)]);
    let desired = state(vec![web4.clone(), web6.clone()]);
    s.apply(&desired);
    let id4 = backend_id(&s, web4.backends[0], Protocol::Tcp);
    let id6 = backend_id(&s, web6.backends[0], Protocol::Tcp);
    // As if a crash had left the IPv6 backend under the IPv4 one's id.
    let mut store = std::mem::take(&mut s.store);
    let b6 = store
        .backends
        .remove(&(IpFamily::V6, id6))
        .expect("the IPv6 backend");
    store.backends.insert((IpFamily::V6, id4), b6);
    let slot = k(&frontend_key(&web6.addr, 1));
    store.frontends.get_mut(&slot).expect("slot 1").backend_id = id4;

    let mut restarted = Syncer::adopt(store, caps());
    assert_eq!(
        restarted.store().view(&web4.addr),
        Some(web4.backends.clone()),
        "the first claimant keeps the id"
    );
    assert!(
        restarted.store().view(&web6.addr).is_none(),
        "the other is dropped"
    );
    let report = restarted.apply(&desired);
    assert_eq!((report.added, report.unchanged), (1, 1), "{report:?}");
    assert_eq!(
        restarted.store().view(&web6.addr),
        Some(web6.backends.clone())
    );
    let ids = |f: IpFamily| -> BTreeSet<u32> {
        restarted
            .store()
            .backends
            .keys()
            .filter(|(g, _)| *g == f)
            .map(|(_, id)| *id)
            .collect()
    };
    assert!(
        ids(IpFamily::V4).is_disjoint(&ids(IpFamily::V6)),
        "one id space again"
    );
}

#[test]
fn each_family_has_its_own_map_capacity() {
    let small = Capacities {
        frontends: 4,
        backends: 3,
        ..Capacities::default()
    };
    let mut s = Syncer::adopt(MemStore::default(), small);
    let full4 = fe(
        [10, 96, 0, 1],
        80,
        Protocol::Tcp,
        "a",
        &[(1, 80), (2, 80), (3, 80)],
    );
    let more4 = fe([10, 96, 0, 2], 80, Protocol::Tcp, "b", &[(1, 80)]);
    let web6 = fe6(0x10, 80, Protocol::Tcp, "c", &[(1, 80), (2, 80), (3, 80)]);
    let report = s.apply(&state(vec![full4.clone(), more4.clone(), web6.clone()]));
    assert_eq!(report.added, 2, "{report:?}");
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert_eq!(report.failed[0].frontend, more4.addr);
    assert_eq!(report.failed[0].reason, "frontend map full (4 entries)");
    assert_eq!(
        s.store().view(&web6.addr),
        Some(web6.backends.clone()),
        "the IPv6 map has its own room"
    );
    let more6 = fe6(0x11, 80, Protocol::Tcp, "d", &[(4, 80)]);
    let report = s.apply(&state(vec![full4, web6, more6.clone()]));
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert_eq!(report.failed[0].frontend, more6.addr);
    assert_eq!(
        report.failed[0].reason,
        "IPv6 frontend map full (4 entries)"
    );
}

/// A LoadBalancer frontend restricted to `blocks`.
fn restricted(blocks: &[&str]) -> Frontend {
    let mut lb = fe([203, 0, 113, 10], 443, Protocol::Tcp, "lb", &[(1, 8443)]);
    lb.kind = FrontendKind::LoadBalancer;
    let blocks: Vec<IpCidr> = blocks.iter().map(|b| b.parse().expect("a CIDR")).collect();
    lb.source_ranges = Some(crate::model::SourceRanges {
        blocks: blocks.into(),
        allows_node: false,
    });
    lb
}

/// The position of `line` in the store's write log.
fn logged(store: &MemStore, line: &str) -> usize {
    store
        .log
        .iter()
        .position(|l| l.starts_with(line))
        .unwrap_or_else(|| panic!("{line:?} not in {:#?}", store.log))
}

#[test]
fn source_ranges_are_written_before_slot_zero_names_them_and_removed_after() {
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let lb = restricted(&["10.0.0.0/8", "192.0.2.1/32"]);
    let head = format!("put {:?}", k(&frontend_key(&lb.addr, 0)));
    s.apply(&state(vec![lb.clone()]));
    let id = s.programmed[&lb.addr].service_id;
    let slot0 = s.store().frontends[&k(&frontend_key(&lb.addr, 0))];
    assert_ne!(slot0.flags & frontend_flags::SOURCE_RANGES, 0);
    assert_eq!(slot0.flags & frontend_flags::SOURCE_RANGES_NODE, 0);
    assert!(logged(s.store(), &format!("put range {id} 10.0.0.0/8")) < logged(s.store(), &head));
    assert!(logged(s.store(), &format!("put range {id} 192.0.2.1/32")) < logged(s.store(), &head));

    // Narrowed: the new block goes in before slot 0 is rewritten, the
    // removed ones after; the block both lists hold is not rewritten.
    s.store_mut().log.clear();
    let narrowed = restricted(&["10.0.0.0/8", "198.51.100.0/24"]);
    let report = s.apply(&state(vec![narrowed.clone()]));
    assert_eq!(report.updated, 1, "{report:?}");
    let log = &s.store().log;
    assert_eq!(
        log.iter()
            .filter(|l| l.contains("range"))
            .cloned()
            .collect::<Vec<_>>(),
        vec![
            format!("put range {id} 198.51.100.0/24"),
            format!("delete range {id} 192.0.2.1/32")
        ],
        "{log:#?}"
    );
    assert_eq!(
        s.store().source_ranges.iter().copied().collect::<Vec<_>>(),
        vec![
            (id, "10.0.0.0/8".parse().unwrap()),
            (id, "198.51.100.0/24".parse().unwrap())
        ]
    );

    // A restart adopts the blocks and rewrites nothing; an orphan block (of
    // an id no frontend has) is removed.
    let mut store = std::mem::take(&mut s.store);
    store
        .source_ranges
        .insert((999, "10.9.0.0/16".parse().unwrap()));
    store.writes = 0;
    let mut restarted = Syncer::adopt(store, caps());
    assert!(
        !restarted
            .store()
            .source_ranges
            .iter()
            .any(|(i, _)| *i == 999),
        "the orphan is gone"
    );
    let report = restarted.apply(&state(vec![narrowed.clone()]));
    assert_eq!((report.writes, report.unchanged), (0, 1), "{report:?}");

    // Lifting the restriction clears the flag in slot 0 first, then the blocks.
    restarted.store_mut().log.clear();
    let mut open = narrowed;
    open.source_ranges = None;
    restarted.apply(&state(vec![open.clone()]));
    let slot0 = restarted.store().frontends[&k(&frontend_key(&open.addr, 0))];
    assert_eq!(slot0.flags & frontend_flags::SOURCE_RANGES, 0);
    assert!(
        logged(restarted.store(), &head)
            < logged(restarted.store(), &format!("delete range {id} 10.0.0.0/8"))
    );
    assert!(restarted.store().source_ranges.is_empty());

    // A removed frontend takes its blocks along.
    restarted.apply(&state(vec![restricted(&["10.0.0.0/8"])]));
    assert_eq!(restarted.store().source_ranges.len(), 1);
    restarted.apply(&state(vec![]));
    assert!(restarted.store().source_ranges.is_empty());
}
