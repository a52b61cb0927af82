use std::collections::HashSet;
use std::net::Ipv4Addr;

use proxy_common::{scope, FrontendSlot};

use super::*;
use crate::model::{BackendAddr, Protocol};
use crate::sync::encode::{backend_value, frontend_key, scoped_key};
use crate::sync::tests::{caps, fe, k, state, MemStore};

fn web() -> crate::model::Frontend {
    fe(
        [10, 96, 0, 10],
        80,
        Protocol::Tcp,
        "web",
        &[(1, 8080), (2, 8080), (3, 8080)],
    )
}

fn dns() -> crate::model::Frontend {
    fe(
        [10, 96, 0, 10],
        53,
        Protocol::Udp,
        "dns",
        &[(1, 5353), (2, 5353)],
    )
}

/// A syncer that programmed `web` and `dns`, the store's write count reset.
fn synced() -> (Syncer<MemStore>, DesiredState) {
    let desired = state(vec![web(), dns()]);
    let mut s = Syncer::adopt(MemStore::default(), caps());
    let report = s.apply(&desired);
    assert!(report.failed.is_empty());
    s.store_mut().writes = 0;
    s.store_mut().log.clear();
    (s, desired)
}

#[test]
fn maps_as_written_are_clean_and_cost_no_write() {
    let (mut s, desired) = synced();
    let report = s.heal(&desired);
    assert!(report.clean, "{:?}", report.findings);
    assert_eq!(report.writes, 0);
    assert_eq!(s.store().writes, 0);
}

#[test]
fn a_deleted_slot_zero_is_written_back_alone_with_its_service_id() {
    let (mut s, desired) = synced();
    let key = frontend_key(&web().addr, 0);
    let head = s.store_mut().frontends.remove(&k(&key)).expect("slot 0");
    let report = s.heal(&desired);
    assert!(!report.clean);
    assert_eq!(report.writes, 1, "{:?}", report.findings);
    assert_eq!(s.store().frontends[&k(&key)], head, "the same service id");
    assert_eq!(
        report.findings,
        [Finding {
            map: "frontends",
            what: "10.96.0.10:80/TCP slot 0: missing".into()
        }]
    );
    assert!(s.heal(&desired).clean);
}

#[test]
fn a_corrupted_slot_and_a_deleted_backend_are_mended_and_nothing_else_written() {
    let (mut s, desired) = synced();
    let slot2 = k(&frontend_key(&web().addr, 2));
    let right = s.store().frontends[&slot2];
    s.store_mut()
        .frontends
        .get_mut(&slot2)
        .expect("slot 2")
        .backend_id = 999;
    let dns_backend = s
        .backends
        .id_of(dns().backends[0], Protocol::Udp)
        .expect("held");
    s.store_mut()
        .backends
        .remove(&(IpFamily::V4, dns_backend))
        .expect("backend");
    let report = s.heal(&desired);
    assert_eq!(report.writes, 2, "{:?}", report.findings);
    assert_eq!(s.store().frontends[&slot2], right);
    assert!(s
        .store()
        .backends
        .contains_key(&(IpFamily::V4, dns_backend)));
    // The backend before the slot that names it, and nothing else.
    assert_eq!(
        s.store().log,
        [
            "put backend 1: 10.244.0.1:5353/UDP",
            "put frontend 10.96.0.10:80/TCP slot 2: service 2, backend 4"
        ]
    );
    assert!(s.heal(&desired).clean);
}

#[test]
fn entries_the_agent_did_not_write_are_removed_and_revnat_restored() {
    let (mut s, desired) = synced();
    let stray = scoped_key(&web().addr, scope::INTERNAL, 7);
    s.store_mut()
        .put_frontend(stray, FrontendSlot::default())
        .expect("put");
    let head = s.store().frontends[&k(&frontend_key(&dns().addr, 0))];
    let right = s.store().revnat[&(IpFamily::V4, head.service_id)];
    s.store_mut()
        .put_revnat(
            head.service_id,
            crate::sync::encode::revnat_value(&dns().addr, "default/other"),
        )
        .expect("put");
    let report = s.heal(&desired);
    assert_eq!(report.writes, 2, "{:?}", report.findings);
    assert!(!s.store().frontends.contains_key(&k(&stray)));
    assert_eq!(s.store().revnat[&(IpFamily::V4, head.service_id)], right);
    assert!(s.heal(&desired).clean);
}

fn v4_key(slot: u16, scope: u8) -> AnyFrontendKey {
    AnyFrontendKey::V4(proxy_common::FrontendKey {
        addr_be: u32::from_ne_bytes([10, 96, 0, 1]),
        port_be: 80u16.to_be(),
        proto: 6,
        scope,
        slot,
        ..Default::default()
    })
}

fn slot(service_id: u32, backend_id: u32, count: u16) -> FrontendSlot {
    FrontendSlot {
        backend_id,
        service_id,
        backend_count: count,
        ..FrontendSlot::default()
    }
}

/// The pure diff: a set whose slot 0 and slot 1 are gone, one backend
/// of the wrong address, and an extra set's slot 0 and slot 1 that nothing
/// expects. Puts go backends first, slots before their slot 0; deletes
/// take slot 0 first.
#[test]
fn the_diff_orders_its_writes_as_the_sync_does() {
    let backend = |last: u8| {
        backend_value(
            BackendAddr {
                ip: Ipv4Addr::new(10, 244, 0, last).into(),
                port: 80,
            },
            Protocol::Tcp,
        )
    };
    let expected = Expected {
        maps: Dump {
            frontends: vec![
                (v4_key(1, scope::INTERNAL), slot(1, 5, 0)),
                (v4_key(0, scope::INTERNAL), slot(1, 0, 1)),
            ],
            backends: vec![(5, backend(1))],
            revnat: Vec::new(),
            source_ranges: Vec::new(),
        },
        revnat_unknown: HashSet::new(),
    };
    let actual = Dump {
        frontends: vec![
            (v4_key(0, scope::EXTERNAL), slot(1, 0, 1)),
            (v4_key(1, scope::EXTERNAL), slot(1, 5, 0)),
        ],
        backends: vec![(5, backend(2))],
        revnat: Vec::new(),
        source_ranges: Vec::new(),
    };
    let repairs = diff(&expected, &actual);
    assert_eq!(repairs.put_backends, [(5, backend(1))]);
    assert_eq!(
        repairs
            .put_frontends
            .iter()
            .map(|(k, _)| k.slot())
            .collect::<Vec<_>>(),
        [1, 0]
    );
    assert_eq!(
        repairs.delete_frontends,
        [v4_key(0, scope::EXTERNAL), v4_key(1, scope::EXTERNAL)]
    );
    assert_eq!(repairs.writes(), 5);
    assert_eq!(repairs.findings.len(), 5, "{:?}", repairs.findings);
    assert!(repairs
        .findings
        .iter()
        .any(|f| f.what == "IPv4 backend id 5: holds 10.244.0.2:80, expected 10.244.0.1:80"));
    assert!(diff(&expected, &expected.maps).is_empty());
}

/// The periodic check's cost at 100k Services (one frontend each, three
/// backends from a pool of 30k pods): building what the maps must hold
/// from the sync's memory, and the digests of both sides, against a dump
/// already read (the kernel's part, reading the maps, is not in it).
/// `cargo test --release -p proxy-user --lib heal_cost -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement; run by hand"]
fn heal_cost_at_100k_services() {
    const SERVICES: u32 = 100_000;
    let frontends = (0..SERVICES).map(|i| {
        let [_, _, c, d] = (i + 1).to_be_bytes();
        let backends: Vec<(u8, u16)> = (0..3u32)
            .map(|j| {
                (
                    ((i * 3 + j) % 250) as u8 + 1,
                    8000 + ((i * 3 + j) / 250 % 120) as u16,
                )
            })
            .collect();
        fe(
            [10, 96, c, d],
            80,
            Protocol::Tcp,
            &format!("svc-{i}"),
            &backends,
        )
    });
    let desired = state(frontends.collect());
    let caps = crate::sync::store::Capacities {
        frontends: 1 << 20,
        backends: 1 << 17,
        services: 1 << 17,
        ..caps()
    };
    let mut s = Syncer::adopt(MemStore::default(), caps);
    let report = s.apply(&desired);
    assert!(report.failed.is_empty(), "{:?}", report.failed.first());
    let dump = s.store().dump();
    let mut best = std::time::Duration::MAX;
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let expected = s.expected(&desired);
        let same = Digest::of(&expected.maps, &expected.revnat_unknown)
            == Digest::of(&dump, &expected.revnat_unknown);
        best = best.min(started.elapsed());
        assert!(same);
    }
    let started = std::time::Instant::now();
    let report = s.heal(&desired);
    let with_dump = started.elapsed();
    assert!(report.clean);
    eprintln!(
        "100k Services, {} entries compared: expected + digests {:.1} ms; with the in-memory dump {:.1} ms",
        report.entries,
        best.as_secs_f64() * 1e3,
        with_dump.as_secs_f64() * 1e3
    );
}
