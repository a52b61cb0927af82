//! `change`: one EndpointSlice change → kernel maps, the way the agent does
//! it with the incremental model, at 1k, 10k and 100k Services × 10
//! endpoints. Per change (one endpoint replaced in one slice), timed from
//! the decoded k8s object on:
//! 1. `SliceInfo::from_k8s` (what the source does with each object);
//! 2. `Model::set_slice` + `Model::update` (recomputes that one Service);
//! 3. `Syncer::apply_changed` with the frontends the update reported.
//!
//! Each change is checked: one Service recomputed, one frontend changed and
//! updated in the maps, carrying the new backend. The objects are generated
//! per Service (never all held at once), as a source holds only the
//! converted form. `sync` keeps the old whole-model rebuild for comparison.
use std::{
    net::Ipv4Addr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use proxy_user::model::{
    BackendAddr, FrontendAddr, Interner, Model, Protocol, ServiceInfo, SliceInfo,
};
use serde_json::{json, Value};

use crate::common::nth_ip;
use crate::progress;
use crate::sync::{k8s_service, k8s_slice, stats_ms, unpinned_syncer};

const ENDPOINTS: u32 = 10;

pub(crate) fn change_bench(quick: bool) -> Result<Value> {
    let sizes: &[u32] = &[1_000, 10_000, 100_000];
    // Changes per size: up to this many, within this much time.
    let (max_changes, budget) = if quick {
        (300, Duration::from_secs(5))
    } else {
        (2000, Duration::from_secs(30))
    };
    let mut runs = Vec::new();
    for &count in sizes {
        runs.push(one_size(count, max_changes, budget)?);
    }
    Ok(json!({"kind": "change", "runs": runs}))
}

fn one_size(count: u32, max_changes: u32, budget: Duration) -> Result<Value> {
    let setup = Instant::now();
    let mut interner = Interner::default();
    let mut model = Model::new(None, None);
    for i in 0..count {
        let svc = k8s_service(i);
        let info = ServiceInfo::from_k8s(&svc);
        model.set_service(info.key.clone(), Some(Arc::new(info)));
        let slice = k8s_slice(i, ENDPOINTS, None);
        let info = SliceInfo::from_k8s(&slice, &mut interner);
        model.set_slice(info.key.clone(), Some(Arc::new(info)));
    }
    let objects_s = setup.elapsed().as_secs_f64();
    let started = Instant::now();
    let delta = model.update();
    let model_s = started.elapsed().as_secs_f64();
    ensure!(
        delta.frontends.len() == count as usize
            && model.desired().frontends.len() == count as usize,
        "the model built {} frontends ({} in the delta) for {count} Services",
        model.desired().frontends.len(),
        delta.frontends.len()
    );

    let (ebpf, mut syncer) = unpinned_syncer(count, ENDPOINTS)?;
    let started = Instant::now();
    let report = syncer.apply(model.desired());
    let apply_s = started.elapsed().as_secs_f64();
    ensure!(
        report.failed.is_empty() && report.added == count as usize,
        "initial sync: added {}, failed {:?}",
        report.added,
        report.failed.first()
    );
    let setup_s = setup.elapsed().as_secs_f64();
    progress(&format!(
        "change: {count} services x {ENDPOINTS} endpoints ready in {setup_s:.1} s (objects + conversion {objects_s:.1} s, model {model_s:.2} s, first apply {apply_s:.2} s); changing one slice at a time"
    ));

    let mut total_ms = Vec::new();
    let mut convert_ms = Vec::new();
    let mut model_ms = Vec::new();
    let mut apply_ms = Vec::new();
    let mut writes = Vec::new();
    let changing = Instant::now();
    for k in 0..max_changes {
        if changing.elapsed() > budget {
            break;
        }
        let i = ((u64::from(k) * 7919) % u64::from(count)) as u32;
        let new_ip = nth_ip(Ipv4Addr::new(10, 160, 0, 0), k);
        // What the watch hands the source: the decoded object.
        let slice = k8s_slice(i, ENDPOINTS, Some(new_ip));
        let t0 = Instant::now();
        let info = SliceInfo::from_k8s(&slice, &mut interner);
        let t1 = Instant::now();
        model.set_slice(info.key.clone(), Some(Arc::new(info)));
        let delta = model.update();
        let t2 = Instant::now();
        let report = syncer.apply_changed(model.desired(), &delta.frontends);
        let t3 = Instant::now();

        let addr = FrontendAddr {
            ip: nth_ip(Ipv4Addr::new(10, 100, 0, 0), i).into(),
            port: 80,
            protocol: Protocol::Tcp,
        };
        ensure!(
            delta.services == 1 && delta.frontends.len() == 1 && delta.frontends.contains(&addr),
            "change {k}: the model recomputed {} Services and reported {:?}",
            delta.services,
            delta.frontends
        );
        ensure!(
            report.updated == 1 && report.failed.is_empty(),
            "change {k}: {report:?}"
        );
        let fe = model
            .desired()
            .frontends
            .get(&addr)
            .with_context(|| format!("change {k}: {addr} left the model"))?;
        ensure!(
            fe.backends.contains(&BackendAddr {
                ip: new_ip.into(),
                port: 8080
            }),
            "change {k}: {addr} lacks the new backend {new_ip}:8080"
        );
        total_ms.push((t3 - t0).as_secs_f64() * 1e3);
        convert_ms.push((t1 - t0).as_secs_f64() * 1e3);
        model_ms.push((t2 - t1).as_secs_f64() * 1e3);
        apply_ms.push((t3 - t2).as_secs_f64() * 1e3);
        writes.push(report.writes as f64);
    }
    writes.sort_by(f64::total_cmp);
    let run = json!({
        "services": count,
        "endpoints_per_service": ENDPOINTS,
        "setup_s": setup_s,
        "initial_model_s": model_s,
        "initial_apply_s": apply_s,
        "total": stats_ms(total_ms),
        "convert": stats_ms(convert_ms),
        "model": stats_ms(model_ms),
        "apply": stats_ms(apply_ms),
        "writes_per_change_median": writes.get(writes.len() / 2),
    });
    progress(&format!(
        "change: one EndpointSlice change at {count} services: {}",
        run["total"]
    ));
    drop(syncer);
    drop(ebpf);
    Ok(run)
}
