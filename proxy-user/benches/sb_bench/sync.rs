//! `sync`: the control plane at scale (model + map writes, one change).
use std::{collections::BTreeMap, net::Ipv4Addr, time::Instant};

use anyhow::{ensure, Result};
use k8s_openapi::{
    api::{
        core::v1::{Service, ServicePort, ServiceSpec},
        discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};
use proxy_user::{
    dataplane::load::object, dataplane::maps::PinnedMaps, model, sync::store::Capacities,
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
    Ok((0..count)
        .map(|i| (k8s_service(i), k8s_slice(i, endpoints, None)))
        .unzip())
}

/// Service `i` of [`k8s_objects`]: `bench/svc-i`, ClusterIP 10.100.0.0 + i,
/// port 80 → 8080.
pub fn k8s_service(i: u32) -> Service {
    let ip = nth_ip(Ipv4Addr::new(10, 100, 0, 0), i).to_string();
    let name = format!("svc-{i}");
    Service {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some("bench".into()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some(ip.clone()),
            cluster_ips: Some(vec![ip]),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                target_port: Some(IntOrString::Int(8080)),
                ..ServicePort::default()
            }]),
            selector: Some(BTreeMap::from([("app".to_string(), name)])),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// The EndpointSlice of Service `i`: `endpoints` ready endpoints at
/// 10.128.0.0 + i × endpoints + j, port 8080; `first` replaces the first
/// endpoint's address (a change).
pub fn k8s_slice(i: u32, endpoints: u32, first: Option<Ipv4Addr>) -> EndpointSlice {
    let endpoints = (0..endpoints)
        .map(|j| {
            let ip = match first {
                Some(ip) if j == 0 => ip,
                _ => nth_ip(Ipv4Addr::new(10, 128, 0, 0), i * endpoints + j),
            };
            Endpoint {
                addresses: vec![ip.to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                ..Endpoint::default()
            }
        })
        .collect();
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("svc-{i}-abcde")),
            namespace: Some("bench".into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/service-name".to_string(),
                format!("svc-{i}"),
            )])),
            ..ObjectMeta::default()
        },
        address_type: "IPv4".into(),
        endpoints,
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }]),
    }
}

/// Fresh unpinned maps sized for `count` Services × `endpoints`, and a
/// syncer on them (keep the `Ebpf` alive as long as the syncer).
pub(crate) fn unpinned_syncer(
    count: u32,
    endpoints: u32,
) -> Result<(aya::Ebpf, Syncer<PinnedMaps>)> {
    let caps = Capacities {
        frontends: (count * (endpoints + 1) + 4096).next_power_of_two(),
        backends: (count * endpoints + 4096).next_power_of_two(),
        conntrack: 262_144,
        services: (count + 1024).next_power_of_two(),
        ..Capacities::default()
    };
    let mut ebpf = object::load_unpinned(proxy_object::SWITCHBOARD, &caps)?;
    let maps = PinnedMaps::take(&mut ebpf)?;
    Ok((ebpf, Syncer::adopt(maps, caps)))
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

        let (ebpf, mut syncer) = unpinned_syncer(count, endpoints)?;
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
