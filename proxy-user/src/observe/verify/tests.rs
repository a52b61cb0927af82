//! The comparison over the sync's in-memory map store: what the sync
//! writes verifies clean; each kind of damage a map can carry is named.
use std::collections::BTreeMap;

use proxy_common::{Backend, FrontendSlot};

use super::*;
use crate::model::{FrontendKind, LbAlgorithm, Protocol};
use crate::sync::encode::{frontend_key, scoped_key};
use crate::sync::store::Capacities;
use crate::sync::store::MapStore as _;
use crate::sync::tests::{caps, fe, fe6, k, state, MemStore};
use crate::sync::Syncer;

fn web() -> Frontend {
    fe(
        [10, 96, 0, 10],
        80,
        Protocol::Tcp,
        "web",
        &[(1, 8080), (2, 8080), (3, 8080)],
    )
}

fn dns() -> Frontend {
    let mut dns = fe([10, 96, 0, 53], 53, Protocol::Udp, "dns", &[(5, 53)]);
    dns.affinity_timeout_s = Some(60);
    dns
}

/// A NodePort with `externalTrafficPolicy: Local` (an external set).
fn local_nodeport() -> Frontend {
    let mut np = fe(
        [192, 168, 50, 1],
        30080,
        Protocol::Tcp,
        "np",
        &[(1, 8080), (2, 8080)],
    );
    np.kind = FrontendKind::NodePort;
    np.local_only = true;
    np.external_backends = Some(vec![np.backends[0]]);
    np
}

fn synced(frontends: Vec<Frontend>) -> (Syncer<MemStore>, DesiredState) {
    let desired = state(frontends);
    let mut syncer = Syncer::adopt(MemStore::default(), caps());
    let report = syncer.apply(&desired);
    assert!(report.failed.is_empty(), "{report:?}");
    (syncer, desired)
}

fn verify(syncer: &Syncer<MemStore>, desired: &DesiredState) -> Verification {
    compare(
        desired,
        syncer.defaults(),
        &syncer.store().dump(),
        &BTreeMap::new(),
    )
}

fn kinds(v: &Verification) -> Vec<(String, ProblemKind)> {
    v.problems
        .iter()
        .map(|p| (p.frontend.clone(), p.kind))
        .collect()
}

#[test]
fn what_the_sync_wrote_matches_its_desired_state() {
    let (syncer, desired) = synced(vec![web(), dns(), local_nodeport()]);
    let v = verify(&syncer, &desired);
    assert!(v.matches(), "{:#?}", v.problems);
    assert_eq!((v.frontends_desired, v.frontends_in_maps), (3, 3));
    assert_eq!(
        v.backends_in_maps, 4,
        "10.244.0.1-3:8080 TCP and 10.244.0.5:53 UDP"
    );
}

#[test]
fn a_desired_frontend_not_in_the_maps_is_missing_with_the_reason_the_sync_gave() {
    let (syncer, mut desired) = synced(vec![web()]);
    let d = dns();
    desired.frontends.insert(d.addr, d.clone());
    let reasons = BTreeMap::from([(d.addr, "frontend map full (4 entries)".to_owned())]);
    let v = compare(
        &desired,
        syncer.defaults(),
        &syncer.store().dump(),
        &reasons,
    );
    assert_eq!(
        kinds(&v),
        vec![("10.96.0.53:53/UDP".into(), ProblemKind::Missing)]
    );
    assert_eq!(v.problems[0].service, "default/dns");
    assert!(
        v.problems[0].detail.contains("10.244.0.5:53"),
        "{}",
        v.problems[0].detail
    );
    assert!(
        v.problems[0].detail.contains("frontend map full"),
        "{}",
        v.problems[0].detail
    );
}

#[test]
fn a_frontend_in_the_maps_that_is_not_desired_is_extra() {
    let (syncer, mut desired) = synced(vec![web(), dns()]);
    desired.frontends.remove(&dns().addr);
    let v = verify(&syncer, &desired);
    assert_eq!(
        kinds(&v),
        vec![("10.96.0.53:53/UDP".into(), ProblemKind::Extra)]
    );
    assert_eq!(
        v.problems[0].service, "default/dns",
        "named from the reverse-NAT entry"
    );
    assert!(
        v.problems[0].detail.contains("10.244.0.5:53"),
        "{}",
        v.problems[0].detail
    );
}

#[test]
fn a_different_backend_set_names_what_is_missing_and_what_is_extra() {
    let (syncer, mut desired) = synced(vec![web()]);
    let moved = fe(
        [10, 96, 0, 10],
        80,
        Protocol::Tcp,
        "web",
        &[(1, 8080), (2, 8080), (4, 8080)],
    );
    desired.frontends.insert(moved.addr, moved);
    let v = verify(&syncer, &desired);
    assert_eq!(
        kinds(&v),
        vec![("10.96.0.10:80/TCP".into(), ProblemKind::WrongBackends)]
    );
    let detail = &v.problems[0].detail;
    assert!(
        detail.contains("missing: 10.244.0.4:8080; extra: 10.244.0.3:8080"),
        "{detail}"
    );

    // The external (local-only) set is compared too.
    let (syncer, mut desired) = synced(vec![local_nodeport()]);
    let mut np = local_nodeport();
    np.external_backends = Some(vec![np.backends[1]]);
    desired.frontends.insert(np.addr, np);
    let v = verify(&syncer, &desired);
    assert_eq!(
        kinds(&v),
        vec![("192.168.50.1:30080/TCP".into(), ProblemKind::WrongBackends)]
    );
    assert!(
        v.problems[0]
            .detail
            .starts_with("external (local-only) set"),
        "{}",
        v.problems[0].detail
    );
}

#[test]
fn slots_naming_absent_backends_or_absent_slots_are_dangling() {
    let (mut syncer, desired) = synced(vec![web()]);
    let addr = web().addr;
    let slot2 = syncer.store().frontends[&k(&frontend_key(&addr, 2))];
    syncer
        .store_mut()
        .delete_backend(slot2.backend_id, IpFamily::V4)
        .expect("delete");
    syncer
        .store_mut()
        .delete_frontend(frontend_key(&addr, 3))
        .expect("delete");
    let v = verify(&syncer, &desired);
    let dangling: Vec<&str> = v
        .problems
        .iter()
        .filter(|p| p.kind == ProblemKind::DanglingSlot)
        .map(|p| p.detail.as_str())
        .collect();
    assert_eq!(dangling.len(), 2, "{:#?}", v.problems);
    assert!(
        dangling.iter().any(|d| d.contains(&format!(
            "slot 2 names backend id {}, which is not in the IPv4 backend map",
            slot2.backend_id
        ))),
        "{dangling:?}"
    );
    assert!(
        dangling.iter().any(|d| d.contains("slot 3 of 3 is absent")),
        "{dangling:?}"
    );
    assert!(
        v.problems
            .iter()
            .any(|p| p.kind == ProblemKind::WrongBackends),
        "the data path reaches only one backend"
    );
}

#[test]
fn entries_nothing_reaches_are_orphans() {
    let (mut syncer, desired) = synced(vec![web()]);
    let addr = web().addr;
    let store = syncer.store_mut();
    store
        .put_backend(
            99,
            AnyBackend::V4(Backend {
                addr_be: u32::from_ne_bytes([10, 244, 9, 9]),
                port_be: 80u16.to_be(),
                proto: 6,
                flags: 0,
            }),
        )
        .expect("put");
    store
        .put_revnat(
            77,
            revnat_value(
                &fe([10, 96, 9, 9], 80, Protocol::Tcp, "gone", &[]).addr,
                "gone/svc:http",
            ),
        )
        .expect("put");
    store
        .put_frontend(
            frontend_key(&addr, 4),
            FrontendSlot {
                backend_id: 99,
                service_id: 1,
                ..FrontendSlot::default()
            },
        )
        .expect("put");
    let v = verify(&syncer, &desired);
    let mut got: Vec<ProblemKind> = v.problems.iter().map(|p| p.kind).collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ProblemKind::OrphanedSlot,
            ProblemKind::OrphanedBackend,
            ProblemKind::WrongRevnat
        ],
        "{:#?}",
        v.problems
    );
    let text: Vec<&str> = v.problems.iter().map(|p| p.detail.as_str()).collect();
    assert!(
        text.iter()
            .any(|d| d.contains("internal slot 4 (backend id 99) is past its set's count")),
        "{text:?}"
    );
    assert!(
        text.iter()
            .any(|d| d.contains("backend id 99 (10.244.9.9:80) is named by no slot")),
        "{text:?}"
    );
    assert!(
        text.iter()
            .any(|d| d.contains("reverse-NAT entry of service id 77 is named by no frontend")),
        "{text:?}"
    );
}

#[test]
fn slot_zero_attributes_and_reverse_nat_are_compared() {
    // The maps were written under another --lb-algorithm than the agent's.
    let (syncer, desired) = synced(vec![web()]);
    let v = compare(
        &desired,
        crate::sync::encode::FrontendDefaults {
            algorithm: LbAlgorithm::Maglev,
            ..Default::default()
        },
        &syncer.store().dump(),
        &BTreeMap::new(),
    );
    assert_eq!(
        kinds(&v),
        vec![("10.96.0.10:80/TCP".into(), ProblemKind::WrongAttributes)]
    );

    // A reverse-NAT entry that names another Service.
    let (mut syncer, desired) = synced(vec![web()]);
    let id = syncer.store().frontends[&k(&scoped_key(&web().addr, scope::INTERNAL, 0))].service_id;
    let other = revnat_value(&web().addr, "default/other");
    syncer.store_mut().put_revnat(id, other).expect("put");
    let v = verify(&syncer, &desired);
    assert_eq!(
        kinds(&v),
        vec![("10.96.0.10:80/TCP".into(), ProblemKind::WrongRevnat)]
    );
    assert!(
        v.problems[0]
            .detail
            .contains("\"default/other\", desired \"default/web\""),
        "{}",
        v.problems[0].detail
    );
}

#[test]
fn a_frontend_the_sync_could_not_fit_is_reported_missing() {
    // Room for one frontend with three backends only.
    let small = Capacities {
        frontends: 4,
        ..caps()
    };
    let desired = state(vec![web(), dns()]);
    let mut syncer = Syncer::adopt(MemStore::default(), small);
    let report = syncer.apply(&desired);
    assert_eq!(report.failed.len(), 1);
    let reasons: Unprogrammed = syncer
        .unprogrammed()
        .map(|u| (u.frontend, u.reason.clone()))
        .collect();
    let v = compare(
        &desired,
        syncer.defaults(),
        &syncer.store().dump(),
        &reasons,
    );
    assert_eq!(
        kinds(&v),
        vec![("10.96.0.53:53/UDP".into(), ProblemKind::Missing)]
    );
    assert!(
        v.problems[0]
            .detail
            .contains("could not program it: frontend map full"),
        "{}",
        v.problems[0].detail
    );
}

/// Both families are compared, each against its own maps.
#[test]
fn ipv6_frontends_are_compared_in_the_ipv6_maps() {
    let web6 = fe6(0x10, 80, Protocol::Tcp, "web6", &[(1, 8080), (2, 8080)]);
    let (mut syncer, mut desired) = synced(vec![web(), web6.clone()]);
    let v = verify(&syncer, &desired);
    assert!(v.matches(), "{:#?}", v.problems);
    assert_eq!(
        (v.frontends_desired, v.frontends_in_maps, v.backends_in_maps),
        (2, 2, 5)
    );

    // The IPv6 set changed in the desired state: named, bracketed.
    let mut moved = web6.clone();
    moved.backends.pop();
    desired.frontends.insert(moved.addr, moved);
    let v = verify(&syncer, &desired);
    assert_eq!(
        kinds(&v),
        vec![("[fd00:96::10]:80/TCP".into(), ProblemKind::WrongBackends)]
    );
    assert!(
        v.problems[0].detail.contains("extra: [fd00:244::2]:8080"),
        "{}",
        v.problems[0].detail
    );
    desired.frontends.insert(web6.addr, web6.clone());

    // An IPv6 slot naming an IPv4 backend id reaches nothing: dangling.
    let id4 = syncer.store().frontends[&k(&frontend_key(&web().addr, 1))].backend_id;
    let slot1 = k(&frontend_key(&web6.addr, 1));
    syncer
        .store_mut()
        .frontends
        .get_mut(&slot1)
        .expect("slot 1")
        .backend_id = id4;
    let v = verify(&syncer, &desired);
    let dangling: Vec<&str> = v
        .problems
        .iter()
        .filter(|p| p.kind == ProblemKind::DanglingSlot)
        .map(|p| p.detail.as_str())
        .collect();
    assert_eq!(
        dangling,
        [format!(
            "slot 1 names backend id {id4}, which is not in the IPv6 backend map"
        )],
        "{:#?}",
        v.problems
    );
    // ... and the IPv6 backend it replaced is now an orphan of the IPv6 map.
    assert!(
        v.problems
            .iter()
            .any(|p| p.kind == ProblemKind::OrphanedBackend
                && p.detail.starts_with("IPv6 backend id")),
        "{:#?}",
        v.problems
    );
}
