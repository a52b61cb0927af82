//! `sync`: the control plane at scale (model + map writes, one change).
use std::{net::Ipv4Addr, time::Instant};

use anyhow::{ensure, Result};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use proxy_user::{
    ebpf::{self, Capacities},
    maps::PinnedMaps,
    model,
    sync::Syncer,
};
use serde_json::{json, Value};

use crate::common::*;
use crate::progress;

// ---------------------------------------------------------------------------
// sync: model + map writes at scale
// ---------------------------------------------------------------------------

/// `count` Services (ClusterIP 10.100.0.0 + i, port 80 → 8080) each with one
/// EndpointSlice of `endpoints` ready endpoints, as k8s-openapi objects (what
/// both sources hand to the model).
pub fn k8s_objects(count: u32, endpoints: u32) -> Result<(Vec<Service>, Vec<EndpointSlice>)> {
    let mut services = Vec::with_capacity(count as usize);
    let mut slices = Vec::with_capacity(count as usize);
    for i in 0..count {
        let ip = nth_ip(Ipv4Addr::new(10, 100, 0, 0), i).to_string();
        services.push(serde_json::from_value::<Service>(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
            "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
                     "selector": {"app": format!("svc-{i}")}}
        }))?);
        let eps: Vec<Value> = (0..endpoints)
            .map(|j| {
                json!({"addresses": [nth_ip(Ipv4Addr::new(10, 128, 0, 0), i * endpoints + j).to_string()],
                       "conditions": {"ready": true, "serving": true, "terminating": false}})
            })
            .collect();
        slices.push(serde_json::from_value::<EndpointSlice>(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": format!("svc-{i}-abcde"), "namespace": "bench",
                         "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
            "endpoints": eps,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }))?);
    }
    Ok((services, slices))
}

pub(crate) fn stats_ms(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    json!({
        "p50_ms": percentile(&v, 0.50),
        "p99_ms": percentile(&v, 0.99),
        "max_ms": v.last().copied().unwrap_or(f64::NAN),
        "samples": v.len(),
    })
}

pub(crate) fn sync_bench(quick: bool) -> Result<Value> {
    let endpoints = 10;
    let sizes: &[u32] = if quick { &[10_000] } else { &[1_000, 10_000] };
    let changes = if quick { 30 } else { 200 };
    let mut runs = Vec::new();
    for &count in sizes {
        let (services, mut slices) = k8s_objects(count, endpoints)?;
        let started = Instant::now();
        let (desired, warnings) = model::build(&services, &slices);
        let model_time = started.elapsed();
        ensure!(
            warnings.is_empty(),
            "model warnings: {:?}",
            warnings.first()
        );
        ensure!(
            desired.frontends.len() == count as usize,
            "model built {} frontends",
            desired.frontends.len()
        );

        let entries = count * (endpoints + 1);
        let caps = Capacities {
            frontends: (entries + 4096).next_power_of_two(),
            backends: (count * endpoints + 4096).next_power_of_two(),
            conntrack: 262_144,
            services: (count + 1024).next_power_of_two(),
        };
        let mut ebpf = ebpf::load_unpinned(&caps)?;
        let maps = PinnedMaps::take(&mut ebpf)?;
        let mut syncer = Syncer::adopt(maps, caps);
        let started = Instant::now();
        let report = syncer.apply(&desired);
        let apply_time = started.elapsed();
        ensure!(
            report.failed.is_empty(),
            "sync failed: {:?}",
            report.failed.first()
        );
        ensure!(report.added == count as usize, "added {}", report.added);
        let writes = report.writes;
        let started = Instant::now();
        let noop = syncer.apply(&desired);
        let noop_time = started.elapsed();
        ensure!(noop.writes == 0, "no-op apply wrote {}", noop.writes);
        progress(&format!(
            "sync: {count} services x {endpoints} endpoints: model {:.1} ms, apply {:.1} ms ({writes} map writes), no-op apply {:.1} ms",
            model_time.as_secs_f64() * 1e3,
            apply_time.as_secs_f64() * 1e3,
            noop_time.as_secs_f64() * 1e3
        ));

        // One EndpointSlice changes (one endpoint replaced): what the agent does
        // per change today — rebuild the model from every object, then apply.
        let mut model_ms = Vec::new();
        let mut apply_ms = Vec::new();
        let mut total_ms = Vec::new();
        let mut change_writes = Vec::new();
        for k in 0..changes {
            let idx = ((k as u64 * 7919) % u64::from(count)) as usize;
            let new_ip = nth_ip(Ipv4Addr::new(10, 160, 0, 0), k).to_string();
            slices[idx].endpoints[0].addresses = vec![new_ip];
            let t0 = Instant::now();
            let (desired, _) = model::build(&services, &slices);
            let t1 = Instant::now();
            let report = syncer.apply(&desired);
            let t2 = Instant::now();
            ensure!(
                report.updated == 1 && report.failed.is_empty(),
                "change {k}: {report:?}"
            );
            model_ms.push((t1 - t0).as_secs_f64() * 1e3);
            apply_ms.push((t2 - t1).as_secs_f64() * 1e3);
            total_ms.push((t2 - t0).as_secs_f64() * 1e3);
            change_writes.push(report.writes as f64);
        }
        let change = json!({
            "total": stats_ms(total_ms),
            "model": stats_ms(model_ms),
            "apply": stats_ms(apply_ms),
            "writes_per_change_median": median(&mut change_writes),
        });
        progress(&format!(
            "sync: one EndpointSlice change at {count} services: {change}"
        ));
        runs.push(json!({
            "services": count,
            "endpoints_per_service": endpoints,
            "model_ms": model_time.as_secs_f64() * 1e3,
            "apply_ms": apply_time.as_secs_f64() * 1e3,
            "map_writes": writes,
            "noop_apply_ms": noop_time.as_secs_f64() * 1e3,
            "one_slice_change": change,
        }));
        drop(syncer);
        drop(ebpf);
    }
    Ok(json!({"kind": "sync", "runs": runs}))
}

