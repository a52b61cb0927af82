//! The sync engine against real kernel maps (not the in-memory store of the
//! unit tests): a first sync into empty maps goes out in batches
//! (`BPF_MAP_UPDATE_BATCH`), later ones entry by entry, and either way the
//! maps decode to exactly the model's desired state. Needs root (CAP_BPF).
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use proxy_common::scope;
use proxy_user::{
    dataplane::maps::PinnedMaps,
    model::{BackendAddr, DesiredState, FrontendAddr, Interner, Model, ObjectKey, SliceInfo},
    sync::encode::{backend_addr, frontend_addr, revnat_name, AnyBackend},
    sync::store::Capacities,
    sync::store::MapStore,
    sync::Syncer,
};
use serde_json::json;

fn service(i: u32) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": format!("svc-{i}"), "namespace": "kmap"},
        "spec": {"clusterIP": format!("10.100.{}.{}", i / 250, i % 250 + 1),
                 "ports": [{"name": "http", "port": 80}]}
    }))
    .expect("a Service")
}

fn slice(i: u32, first: u8) -> EndpointSlice {
    let eps: Vec<_> = (0..3u8)
        .map(|j| json!({"addresses": [format!("10.{}.{}.{}", 128 + i / 250, i % 250, first + j)]}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("svc-{i}-a"), "namespace": "kmap",
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080}]
    }))
    .expect("an EndpointSlice")
}

/// What the maps say: every complete internal set, by frontend, with its
/// Service name and backends (sorted).
fn decode(store: &PinnedMaps) -> BTreeMap<FrontendAddr, (String, Vec<BackendAddr>)> {
    let dump = store.dump();
    let backends: HashMap<u32, _> = dump.backends.iter().copied().collect();
    let revnat: HashMap<u32, _> = dump.revnat.iter().copied().collect();
    let slots: HashMap<_, _> = dump.frontends.iter().copied().collect();
    let mut out = BTreeMap::new();
    for (key, head) in dump
        .frontends
        .iter()
        .filter(|(k, _)| k.slot() == 0 && k.scope() == scope::INTERNAL)
    {
        let addr = frontend_addr(key).expect("a known protocol");
        let mut set: Vec<BackendAddr> = (1..=head.backend_count)
            .map(|slot| {
                let value = slots[&key.at(scope::INTERNAL, slot)];
                let backend: &AnyBackend = &backends[&value.backend_id];
                assert_eq!(
                    backend.family(),
                    key.family(),
                    "{addr}: backend id {} of the other family",
                    value.backend_id
                );
                backend_addr(backend)
            })
            .collect();
        set.sort();
        out.insert(addr, (revnat_name(&revnat[&head.service_id]), set));
    }
    out
}

/// A dual-stack Service: an IPv4 and an IPv6 cluster IP.
fn dual_service(i: u32) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": format!("dual-{i}"), "namespace": "kmap"},
        "spec": {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"],
                 "clusterIPs": [format!("10.101.{}.{}", i / 250, i % 250 + 1), format!("fd00:101::{:x}", i + 1)],
                 "ports": [{"name": "http", "port": 80}]}
    }))
    .expect("a Service")
}

/// The IPv6 slice of `dual_service(i)`: three endpoints from `first`.
fn slice6(i: u32, first: u16) -> EndpointSlice {
    let eps: Vec<_> = (0..3u16)
        .map(|j| json!({"addresses": [format!("fd00:244:{:x}::{:x}", i, first + j)]}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("dual-{i}-v6"), "namespace": "kmap",
                     "labels": {"kubernetes.io/service-name": format!("dual-{i}")}},
        "addressType": "IPv6",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080}]
    }))
    .expect("an EndpointSlice")
}

/// The IPv4 slice of `dual_service(i)`: two endpoints.
fn slice4(i: u32) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("dual-{i}-v4"), "namespace": "kmap",
                     "labels": {"kubernetes.io/service-name": format!("dual-{i}")}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [format!("10.201.{}.1", i % 250)]}, {"addresses": [format!("10.201.{}.2", i % 250)]}],
        "ports": [{"name": "http", "port": 8080}]
    }))
    .expect("an EndpointSlice")
}

fn want(desired: &DesiredState) -> BTreeMap<FrontendAddr, (String, Vec<BackendAddr>)> {
    desired
        .frontends
        .values()
        .map(|f| (f.addr, (f.service.to_string(), f.backends.clone())))
        .collect()
}

#[test]
fn a_batched_first_sync_and_incremental_changes_leave_exactly_the_desired_state() {
    // 70,000 held puts: more than the store holds before it writes what
    // no lookup reaches yet (its spill), so the first sync spills.
    let count = 10_000;
    let caps = Capacities {
        frontends: 65_536,
        backends: 32_768,
        conntrack: 1024,
        services: 16_384,
        ..Capacities::default()
    };
    let (_ebpf, maps) = crate::support::load(&caps);
    let mut syncer = Syncer::adopt(maps, caps);
    let mut model = Model::new(None, None);
    let mut interner = Interner::default();
    let svc_info = |i| Arc::new(proxy_user::model::ServiceInfo::from_k8s(&service(i)));
    for i in 0..count {
        let s = svc_info(i);
        model.set_service(s.key.clone(), Some(s));
        let e = Arc::new(SliceInfo::from_k8s(&slice(i, 1), &mut interner));
        model.set_slice(e.key.clone(), Some(e));
    }
    let delta = model.update();
    assert_eq!(delta.frontends.len(), count as usize);

    // Empty maps, 10,000 frontends: written in batches.
    let report = syncer.apply_changed(model.desired(), &delta.frontends);
    assert!(report.failed.is_empty(), "{:?}", report.failed.first());
    assert_eq!(report.added, count as usize);
    assert_eq!(
        report.writes,
        count as usize * (1 + 1 + 3 + 3),
        "revnat, slot 0, 3 slots, 3 backends each"
    );
    assert_eq!(decode(syncer.store()), want(model.desired()));

    // Then one slice at a time, entry by entry: endpoints move, a Service goes.
    for i in (0..count).step_by(7) {
        let e = Arc::new(SliceInfo::from_k8s(&slice(i, 100), &mut interner));
        model.set_slice(e.key.clone(), Some(e));
    }
    model.set_service(ObjectKey::new("kmap", "svc-3"), None);
    let delta = model.update();
    let report = syncer.apply_changed(model.desired(), &delta.frontends);
    assert!(report.failed.is_empty(), "{:?}", report.failed.first());
    assert_eq!(report.removed, 1);
    assert_eq!(report.updated, delta.frontends.len() - 1);
    assert_eq!(decode(syncer.store()), want(model.desired()));

    // Nothing left to do: a full comparison writes nothing.
    let report = syncer.apply(model.desired());
    assert_eq!(report.writes, 0, "{report:?}");
    let unchanged: BTreeSet<_> = model.desired().frontends.keys().copied().collect();
    assert_eq!(report.unchanged, unchanged.len());
}

/// `--max-services N` programs N service ports, and every one of
/// their ids has a slot in the kernel's per-service counter array (ids
/// 1..=N, the array N + 1 entries); the N + 1st port is refused by name.
#[test]
fn max_services_n_gives_n_service_ports_each_with_counters() {
    let n = 4;
    let caps = Capacities {
        frontends: 64,
        backends: 64,
        conntrack: 64,
        services: n,
        ..Capacities::default()
    };
    let (_ebpf, maps) = crate::support::load(&caps);
    assert_eq!(maps.service_stats.len(), n + 1);
    let mut syncer = Syncer::adopt(maps, caps);
    let mut model = Model::new(None, None);
    for i in 0..=n {
        let s = Arc::new(proxy_user::model::ServiceInfo::from_k8s(&service(i)));
        model.set_service(s.key.clone(), Some(s));
    }
    let delta = model.update();
    let report = syncer.apply_changed(model.desired(), &delta.frontends);
    assert_eq!(report.added, n as usize, "{report:?}");
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert!(
        report.failed[0]
            .reason
            .contains("service id space full (4 service ports"),
        "{report:?}"
    );
    let dump = syncer.store().dump();
    let ids: BTreeSet<u32> = dump.revnat.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, (1..=n).collect::<BTreeSet<u32>>());
    for id in ids {
        syncer
            .store()
            .service_stats
            .get(&id, 0)
            .unwrap_or_else(|e| panic!("service id {id} has no counter slot: {e}"));
    }
}

/// Dual-stack Services in the real maps. Each IPv6 frontend, its
/// backends and its reverse NAT are in the IPv6 maps (`SB_FE6_V1`,
/// `SB_BE6_V1`, `SB_RNAT6_V1`), the IPv4 ones where they always were, with
/// one id space; batched and entry by entry; a restarted agent adopts both
/// families without a write.
#[test]
fn dual_stack_services_fill_both_families_maps() {
    let count = 50;
    let caps = Capacities {
        frontends: 1024,
        backends: 1024,
        conntrack: 256,
        services: 256,
        ..Capacities::default()
    };
    let (_ebpf, maps) = crate::support::load(&caps);
    let mut syncer = Syncer::adopt(maps, caps);
    let mut model = Model::new(None, None);
    let mut interner = Interner::default();
    for i in 0..count {
        let s = Arc::new(proxy_user::model::ServiceInfo::from_k8s(&dual_service(i)));
        model.set_service(s.key.clone(), Some(s));
        for slice in [slice4(i), slice6(i, 1)] {
            let e = Arc::new(SliceInfo::from_k8s(&slice, &mut interner));
            model.set_slice(e.key.clone(), Some(e));
        }
    }
    let delta = model.update();
    assert!(
        model.warnings().next().is_none(),
        "{:?}",
        model.warnings().collect::<Vec<_>>()
    );
    assert_eq!(delta.frontends.len(), 2 * count as usize);

    // 100 frontends into empty maps: batched, per family.
    let report = syncer.apply_changed(model.desired(), &delta.frontends);
    assert!(report.failed.is_empty(), "{:?}", report.failed.first());
    assert_eq!(report.added, 2 * count as usize);
    assert_eq!(decode(syncer.store()), want(model.desired()));
    let store = syncer.store();
    let fe4 = store.frontends.keys().filter(Result::is_ok).count();
    let fe6 = store.frontends6.keys().filter(Result::is_ok).count();
    assert_eq!(
        (fe4, fe6),
        (count as usize * 3, count as usize * 4),
        "slot 0 plus 2 IPv4 or 3 IPv6 slots each"
    );
    let be4: BTreeSet<u32> = store.backends.keys().filter_map(Result::ok).collect();
    let be6: BTreeSet<u32> = store.backends6.keys().filter_map(Result::ok).collect();
    assert_eq!(
        (be4.len(), be6.len()),
        (count as usize * 2, count as usize * 3)
    );
    assert!(be4.is_disjoint(&be6), "one backend id space");
    let rn4: BTreeSet<u32> = store.revnat.keys().filter_map(Result::ok).collect();
    let rn6: BTreeSet<u32> = store.revnat6.keys().filter_map(Result::ok).collect();
    assert_eq!((rn4.len(), rn6.len()), (count as usize, count as usize));
    assert!(rn4.is_disjoint(&rn6), "one service id space");
    for (key, head) in store
        .frontends6
        .iter()
        .filter_map(Result::ok)
        .filter(|(k, _)| k.slot == 0)
    {
        let addr = frontend_addr(&key).expect("TCP");
        assert!(addr.ip.is_ipv6());
        let rnat = store
            .revnat6
            .get(&head.service_id, 0)
            .expect("the IPv6 reverse-NAT entry");
        assert_eq!((rnat.addr_be, rnat.port_be), (key.addr_be, key.port_be));
    }

    // Entry by entry: IPv6 endpoints move, a Service goes (both families).
    for i in (0..count).step_by(3) {
        let e = Arc::new(SliceInfo::from_k8s(&slice6(i, 100), &mut interner));
        model.set_slice(e.key.clone(), Some(e));
    }
    model.set_service(ObjectKey::new("kmap", "dual-4"), None);
    let delta = model.update();
    let report = syncer.apply_changed(model.desired(), &delta.frontends);
    assert!(report.failed.is_empty(), "{:?}", report.failed.first());
    assert_eq!(report.removed, 2, "dual-4's two frontends");
    assert_eq!(decode(syncer.store()), want(model.desired()));
    assert_eq!(
        syncer.store().revnat6.keys().filter(Result::is_ok).count(),
        count as usize - 1
    );

    // A restarted agent adopts both families: nothing to write.
    let mut restarted = Syncer::adopt(syncer.into_store(), caps);
    let report = restarted.apply(model.desired());
    assert_eq!(
        (report.writes, report.unchanged),
        (0, model.desired().frontends.len()),
        "{report:?}"
    );
    assert_eq!(decode(restarted.store()), want(model.desired()));
}
