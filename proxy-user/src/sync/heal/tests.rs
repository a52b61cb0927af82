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

/// `n` hashed frontends (Maglev, a LoadBalancer IP each, three backends),
/// and a random one (`web`), programmed; writes reset.
fn hashed(n: u8) -> (Syncer<MemStore>, DesiredState, Vec<crate::model::Frontend>) {
    let lbs: Vec<crate::model::Frontend> = (1..=n)
        .map(|i| {
            let mut lb = fe(
                [203, 0, 113, i],
                80,
                Protocol::Tcp,
                &format!("lb{i}"),
                &[(1, 8080), (2, 8080), (i + 2, 8080)],
            );
            lb.kind = crate::model::FrontendKind::LoadBalancer;
            lb.algorithm = Some(crate::model::LbAlgorithm::Maglev);
            lb
        })
        .collect();
    let mut all = lbs.clone();
    all.push(web());
    let desired = state(all);
    let mut s = Syncer::adopt(MemStore::default(), caps());
    assert!(s.apply(&desired).failed.is_empty());
    s.store_mut().writes = 0;
    (s, desired, lbs)
}

fn budget(tables: usize) -> maglev::MaglevBudget {
    maglev::MaglevBudget {
        tables,
        computed: tables,
    }
}

fn service_id(s: &Syncer<MemStore>, f: &crate::model::Frontend) -> u32 {
    s.store().frontends[&k(&frontend_key(&f.addr, 0))].service_id
}

#[test]
fn maglev_tables_as_written_are_clean_and_cost_no_write() {
    let (mut s, _, _) = hashed(3);
    let report = s.heal_maglev(budget(10));
    assert!(report.clean, "{:?}", report.findings);
    assert_eq!(report.entries, 3, "only the hashed frontends");
    assert_eq!(s.store().writes, 0);
    assert!(s.maglev_problems().is_empty());
}

/// An entry pointed elsewhere: the table is written back whole, with the
/// same backend ids (what a flow's conntrack entry names stays valid);
/// the other tables are not written.
#[test]
fn a_corrupted_maglev_entry_is_written_back_with_the_same_ids() {
    let (mut s, _, lbs) = hashed(3);
    let id = service_id(&s, &lbs[1]);
    let right = s.store().maglev[&id].clone();
    s.store_mut().maglev.get_mut(&id).expect("table")[7] = 999;
    let problems = s.maglev_problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].0, Some(lbs[1].addr));
    let report = s.heal_maglev(budget(10));
    assert_eq!(report.writes, 1, "{:?}", report.findings);
    assert_eq!(
        report.findings,
        [Finding {
            map: "maglev",
            what: format!(
                "203.0.113.2:80/TCP (service id {id}): 1 of 16381 entries differ (entry 7: backend id 999, expected {})",
                right[7]
            )
        }]
    );
    assert_eq!(s.store().maglev[&id], right);
    assert!(s.heal_maglev(budget(10)).clean);
}

#[test]
fn a_deleted_maglev_table_is_written_again_and_a_stray_one_deleted() {
    let (mut s, _, lbs) = hashed(2);
    let id = service_id(&s, &lbs[0]);
    let right = s.store_mut().maglev.remove(&id).expect("table");
    s.store_mut().maglev.insert(77, vec![1; 16381]);
    let report = s.heal_maglev(budget(10));
    assert_eq!(report.writes, 2, "{:?}", report.findings);
    let whats: Vec<&str> = report.findings.iter().map(|f| f.what.as_str()).collect();
    assert_eq!(
        whats,
        [
            format!("203.0.113.1:80/TCP (service id {id}): missing").as_str(),
            "service id 77: table left over (no hashed frontend the agent programmed has it)",
        ]
    );
    assert_eq!(s.store().maglev[&id], right);
    assert!(!s.store().maglev.contains_key(&77));
    assert!(s.heal_maglev(budget(10)).clean);
}

/// `budget` tables per look, going on where the last look stopped: with
/// a budget of 2, five tables are all compared within three looks, and a
/// corrupted one is found at its turn.
#[test]
fn the_maglev_check_rotates_through_the_tables() {
    let (mut s, _, lbs) = hashed(5);
    let ids: Vec<u32> = lbs.iter().map(|f| service_id(&s, f)).collect();
    for id in &ids {
        s.store_mut().maglev.get_mut(id).expect("table")[0] ^= 1;
    }
    let mut found = Vec::new();
    for _ in 0..3 {
        let report = s.heal_maglev(budget(2));
        assert!(report.entries <= 2, "{}", report.entries);
        found.extend(report.findings);
    }
    assert_eq!(found.len(), 5, "{found:?}");
    assert!(s.heal_maglev(budget(5)).clean);
}

/// After a restart the sync adopts the tables without a digest: the first
/// look computes them (and writes nothing when they are right), and still
/// finds one that is wrong.
#[test]
fn adopted_maglev_tables_are_digested_at_their_first_look() {
    let (mut s, desired, lbs) = hashed(2);
    let id = service_id(&s, &lbs[1]);
    s.store_mut().maglev.get_mut(&id).expect("table")[100] = 5;
    let mut s = Syncer::adopt(s.into_store(), caps());
    let report = s.apply(&desired);
    assert!(report.failed.is_empty() && report.writes == 0, "{report:?}");
    let report = s.heal_maglev(budget(10));
    assert_eq!(report.findings.len(), 1, "{:?}", report.findings);
    assert_eq!(s.store().writes, 1);
    assert!(s.heal_maglev(budget(10)).clean);
}

/// At most `computed` tables are computed per look: five adopted tables
/// without a digest take three looks, the rotation going on where the
/// budget ran out; then every look only digests.
#[test]
fn computing_adopted_tables_is_spread_over_looks() {
    let (s, desired, _) = hashed(5);
    let mut s = Syncer::adopt(s.into_store(), caps());
    s.apply(&desired);
    let budget = maglev::MaglevBudget {
        tables: 100,
        computed: 2,
    };
    let looks: Vec<(usize, bool)> = (0..4)
        .map(|_| {
            let r = s.heal_maglev(budget);
            (r.entries, r.clean)
        })
        .collect();
    assert_eq!(looks, [(2, true), (2, true), (5, true), (5, true)]);
}

/// Any one entry changed, wherever it is (the remainder past the last
/// whole chunk too), changes the digest.
#[test]
fn one_changed_entry_changes_the_digest() {
    let mut table = Box::new(proxy_common::MaglevTable {
        backend_ids: [3; 16381],
    });
    let right = maglev::digest(&table);
    for i in [0, 1, 7, 8, 9000, 16375, 16379, 16380] {
        table.backend_ids[i] = 4;
        assert_ne!(maglev::digest(&table), right, "entry {i}");
        table.backend_ids[i] = 3;
    }
    assert_eq!(maglev::digest(&table), right);
}

#[test]
fn the_table_diff_counts_the_entries_that_differ() {
    let table = |f: fn(usize) -> u32| {
        let mut t = Box::new(proxy_common::MaglevTable {
            backend_ids: [0; 16381],
        });
        for (i, e) in t.backend_ids.iter_mut().enumerate() {
            *e = f(i);
        }
        t
    };
    let right = table(|i| (i % 3) as u32 + 1);
    assert_eq!(maglev::table_drift(Some(&right), &right), None);
    assert_eq!(
        maglev::table_drift(None, &right).as_deref(),
        Some("missing")
    );
    let wrong = table(|i| if i >= 16000 { 9 } else { (i % 3) as u32 + 1 });
    assert_eq!(
        maglev::table_drift(Some(&wrong), &right).as_deref(),
        Some("381 of 16381 entries differ (entry 16000: backend id 9, expected 2)")
    );
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
        // 10.96.0.1 on, into 10.97/16 past 65535: every address distinct.
        let [_, b, c, d] = (i + 1).to_be_bytes();
        let backends: Vec<(u8, u16)> = (0..3u32)
            .map(|j| {
                (
                    ((i * 3 + j) % 250) as u8 + 1,
                    8000 + ((i * 3 + j) / 250 % 120) as u16,
                )
            })
            .collect();
        fe(
            [10, 96 + b, c, d],
            80,
            Protocol::Tcp,
            &format!("svc-{i}"),
            &backends,
        )
    });
    let desired = state(frontends.collect());
    assert_eq!(desired.frontends.len(), SERVICES as usize);
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
    let started = std::time::Instant::now();
    let maglev_look = s.heal_maglev(maglev::PER_CHECK);
    let maglev_none = started.elapsed();
    assert!(maglev_look.clean && maglev_look.entries == 0);
    eprintln!(
        "100k Services, {} entries compared: expected + digests {:.1} ms; with the in-memory dump {:.1} ms; the Maglev step with no hashed frontend {:.2} ms",
        report.entries,
        best.as_secs_f64() * 1e3,
        with_dump.as_secs_f64() * 1e3,
        maglev_none.as_secs_f64() * 1e3
    );
}

/// The Maglev step's cost per look ([`maglev::PER_CHECK`]) at 100k
/// Services of which 10k are hashed (10k tables of 64 KiB in the in-memory
/// store: 655 MiB), with the digests known (every look but the first
/// rotation after a restart), and on the first look after a restart (the
/// adopted tables have no digest yet: 64 are computed). The in-memory read
/// copies each table as the kernel's lookup does, without the system call.
/// `cargo test --release -p proxy-user --lib heal_cost -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement; run by hand"]
fn heal_cost_of_maglev_tables() {
    const SERVICES: u32 = 100_000;
    const HASHED: u32 = 10_000;
    let frontends = (0..SERVICES).map(|i| {
        // 10.96.0.1 on, into 10.97/16 past 65535: every address distinct.
        let [_, b, c, d] = (i + 1).to_be_bytes();
        let backends: Vec<(u8, u16)> = (0..3u32)
            .map(|j| {
                (
                    ((i * 3 + j) % 250) as u8 + 1,
                    8000 + ((i * 3 + j) / 250 % 120) as u16,
                )
            })
            .collect();
        let mut f = fe(
            [10, 96 + b, c, d],
            80,
            Protocol::Tcp,
            &format!("svc-{i}"),
            &backends,
        );
        if i < HASHED {
            f.algorithm = Some(crate::model::LbAlgorithm::Maglev);
        }
        f
    });
    let desired = state(frontends.collect());
    assert_eq!(desired.frontends.len(), SERVICES as usize);
    let caps = crate::sync::store::Capacities {
        frontends: 1 << 20,
        backends: 1 << 17,
        services: 1 << 17,
        ..caps()
    };
    let mut s = Syncer::adopt(MemStore::default(), caps);
    let report = s.apply(&desired);
    assert!(report.failed.is_empty(), "{:?}", report.failed.first());
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let mut looks = Vec::new();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let r = s.heal_maglev(maglev::PER_CHECK);
        looks.push(started.elapsed());
        assert!(r.clean && r.entries == maglev::PER_CHECK.tables, "{r:?}");
    }
    let steady = looks.iter().min().copied().unwrap_or_default();
    let mut s = Syncer::adopt(s.into_store(), caps);
    assert_eq!(s.apply(&desired).writes, 0);
    let started = std::time::Instant::now();
    let first = s.heal_maglev(maglev::PER_CHECK);
    let adopted = started.elapsed();
    assert!(
        first.clean && first.entries == maglev::PER_CHECK.computed,
        "{first:?}"
    );
    let rotation = HASHED.div_ceil(maglev::PER_CHECK.tables as u32);
    eprintln!(
        "100k Services, 10k hashed: Maglev step {:.1} ms per look ({} tables digested, {:.1} us each), every table compared within {rotation} looks; first look after a restart {:.1} ms ({} tables computed, {:.0} us each)",
        ms(steady),
        maglev::PER_CHECK.tables,
        ms(steady) * 1e3 / maglev::PER_CHECK.tables as f64,
        ms(adopted),
        maglev::PER_CHECK.computed,
        ms(adopted) * 1e3 / maglev::PER_CHECK.computed as f64,
    );
}
