//! The sync engine against real kernel maps (not the in-memory store of the
//! unit tests): a first sync into empty maps goes out in batches
//! (`BPF_MAP_UPDATE_BATCH`), later ones entry by entry, and either way the
//! maps decode to exactly the model's desired state. Needs root (CAP_BPF).
mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use proxy_common::scope;
use proxy_user::{
    ebpf::Capacities,
    encode::{backend_addr, frontend_addr, revnat_name, AnyBackend},
    maps::{MapStore, PinnedMaps},
    model::{BackendAddr, DesiredState, FrontendAddr, Interner, Model, ObjectKey, SliceInfo},
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
    for (key, head) in dump.frontends.iter().filter(|(k, _)| k.slot() == 0 && k.scope() == scope::INTERNAL) {
        let addr = frontend_addr(key).expect("a known protocol");
        let mut set: Vec<BackendAddr> = (1..=head.backend_count)
            .map(|slot| {
                let value = slots[&key.at(scope::INTERNAL, slot)];
                let backend: &AnyBackend = &backends[&value.backend_id];
                assert_eq!(backend.family(), key.family(), "{addr}: backend id {} of the other family", value.backend_id);
                backend_addr(backend)
            })
            .collect();
        set.sort();
        out.insert(addr, (revnat_name(&revnat[&head.service_id]), set));
    }
    out
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
    let count = 600;
    let caps = Capacities {
        frontends: 8192,
        backends: 4096,
        conntrack: 1024,
        services: 1024,
    };
    let (_ebpf, maps) = support::load(&caps);
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

    // Empty maps, 600 frontends: written in batches.
    let report = syncer.apply_changed(model.desired(), &delta.frontends);
    assert!(report.failed.is_empty(), "{:?}", report.failed.first());
    assert_eq!(report.added, count as usize);
    assert_eq!(report.writes, count as usize * (1 + 1 + 3 + 3), "revnat, slot 0, 3 slots, 3 backends each");
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

/// Issue 11: `--max-services N` programs N service ports, and every one of
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
    };
    let (_ebpf, maps) = support::load(&caps);
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
    assert!(report.failed[0].reason.contains("service id space full (4 service ports"), "{report:?}");
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
