//! What the maps should hold: the model rebuilt from the agent's source (a
//! manifest directory read with the agent's own loader, or the API server
//! listed once), and its comparison with what the maps hold. Ids differ
//! between runs, so frontends are compared by address, port, protocol and
//! scope, and backends as address sets.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use k8s_openapi::api::{
    core::v1::{Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{api::ListParams, Api, Client};
use serde::Serialize;

use super::ServiceRow;
use crate::{
    model::{self, DesiredState, NodeInfo},
    observe::status::{AgentStatus, UnprogrammedService},
    source::{cluster, load_file},
};

/// The objects the model is built from.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub node: Option<NodeInfo>,
    /// Files the loader rejected (`dir:` only).
    pub notes: Vec<String>,
}

/// Where the agent's objects come from, as its status file names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceKind {
    Dir(PathBuf),
    Cluster,
    Unknown(String),
}

pub fn source_kind(status: &AgentStatus) -> SourceKind {
    match status.source.split_once(':') {
        Some(("dir", path)) if !path.is_empty() => SourceKind::Dir(PathBuf::from(path)),
        _ if status.source == "cluster" => SourceKind::Cluster,
        _ => SourceKind::Unknown(status.source.clone()),
    }
}

/// Reads a manifest directory as the agent does: every `.yaml`, `.yml`
/// and `.json` file not starting with a dot, in path order; an object
/// defined again in a later file is left out.
pub fn read_dir(dir: &Path, node_name: &str) -> anyhow::Result<Inputs> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| is_manifest(p))
        .collect();
    paths.sort();
    let mut inputs = Inputs::default();
    let mut seen = BTreeSet::new();
    let mut first =
        |kind: &str, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            seen.insert((kind.to_owned(), meta.namespace.clone(), meta.name.clone()))
        };
    for path in paths {
        let objects = match load_file(&path) {
            Ok(objects) => objects,
            Err(e) => {
                inputs.notes.push(e.to_string());
                continue;
            }
        };
        for s in objects.services {
            if first("Service", &s.metadata) {
                inputs.services.push(s);
            }
        }
        for s in objects.endpoint_slices {
            if first("EndpointSlice", &s.metadata) {
                inputs.slices.push(s);
            }
        }
        for n in objects.nodes {
            if first("Node", &n.metadata) && n.metadata.name.as_deref() == Some(node_name) {
                inputs.node = Some(NodeInfo::from_node(&n));
            }
        }
    }
    Ok(inputs)
}

fn is_manifest(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or_default();
    !hidden
        && path.is_file()
        && ["yaml", "yml", "json"]
            .iter()
            .any(|x| ext.eq_ignore_ascii_case(x))
}

/// A client from `--kubeconfig`, else the agent's, else inference.
pub async fn client(flag: Option<&PathBuf>, status: &AgentStatus) -> anyhow::Result<Client> {
    let from_status = status.kubeconfig.as_ref().map(PathBuf::from);
    Ok(cluster::client(flag.or(from_status.as_ref())).await?)
}

/// Lists Services, EndpointSlices and this node once.
pub async fn list_cluster(client: &Client, node_name: &str) -> anyhow::Result<Inputs> {
    let lp = ListParams::default();
    let services = Api::<Service>::all(client.clone()).list(&lp).await?.items;
    let slices = Api::<EndpointSlice>::all(client.clone())
        .list(&lp)
        .await?
        .items;
    let node = Api::<Node>::all(client.clone())
        .get_opt(node_name)
        .await?
        .map(|n| NodeInfo::from_node(&n));
    Ok(Inputs {
        services,
        slices,
        node,
        notes: Vec::new(),
    })
}

/// The Pods of `namespace` that `selector` matches: (total, ready).
pub async fn matching_pods(
    client: &Client,
    namespace: &str,
    selector: &BTreeMap<String, String>,
) -> anyhow::Result<(usize, usize)> {
    let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let lp = ListParams::default().labels(&labels.join(","));
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await?
        .items;
    let ready = pods.iter().filter(|p| pod_ready(p)).count();
    Ok((pods.len(), ready))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The model the agent would program from `inputs`.
pub fn build(inputs: &Inputs, status: &AgentStatus) -> DesiredState {
    model::build_limited(
        &inputs.services,
        &inputs.slices,
        inputs.node.as_ref(),
        status.proxy_name.as_deref(),
        status.max_endpoints_per_service,
    )
    .0
}

/// A frontend's backend set, by address, port, protocol and scope.
type SetKey = (String, &'static str);

/// One difference between the maps and the source.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Mismatch {
    /// `10.96.0.10:80/TCP` (`, from outside` for an external set).
    pub frontend: String,
    pub service: String,
    /// `missing`, `stale` or `backends differ`.
    pub problem: &'static str,
    /// The backends the maps send to, and those the source asks for.
    pub in_maps: Vec<String>,
    pub in_source: Vec<String>,
}

fn desired_sets(desired: &DesiredState) -> BTreeMap<SetKey, (String, Vec<String>)> {
    let mut sets = BTreeMap::new();
    for f in desired.frontends.values() {
        let list = |b: &[model::BackendAddr]| {
            let mut v: Vec<String> = b.iter().map(ToString::to_string).collect();
            v.sort();
            v
        };
        sets.insert(
            (f.addr.to_string(), "internal"),
            (f.service.to_string(), list(&f.backends)),
        );
        if let Some(ext) = &f.external_backends {
            sets.insert(
                (f.addr.to_string(), "external"),
                (f.service.to_string(), list(ext)),
            );
        }
    }
    sets
}

fn actual_sets(rows: &[ServiceRow]) -> BTreeMap<SetKey, (String, Vec<String>)> {
    let mut sets = BTreeMap::new();
    for r in rows {
        // As the model prints them: IPv6 addresses bracketed.
        let addr = format!(
            "{}/{}",
            super::services::host_port(&r.address, r.port),
            r.protocol
        );
        let list = |b: &[super::BackendRow]| {
            let mut v: Vec<String> = b
                .iter()
                .map(|b| super::services::host_port(&b.address, b.port))
                .collect();
            v.sort();
            v
        };
        sets.insert(
            (addr.clone(), "internal"),
            (r.service.clone(), list(&r.backends)),
        );
        if let Some(ext) = &r.external_backends {
            sets.insert((addr, "external"), (r.service.clone(), list(ext)));
        }
    }
    sets
}

/// Compares the maps with the model; frontends the agent reported as not
/// programmed are left out (they are reported as such).
pub fn compare(
    desired: &DesiredState,
    rows: &[ServiceRow],
    unprogrammed: &[UnprogrammedService],
) -> Vec<Mismatch> {
    let want = desired_sets(desired);
    let have = actual_sets(rows);
    let skipped = |addr: &str| unprogrammed.iter().any(|u| u.frontend == addr);
    let label = |(addr, scope): &SetKey| {
        if *scope == "external" {
            format!("{addr}, from outside")
        } else {
            addr.clone()
        }
    };
    let mut found = Vec::new();
    for (key, (service, backends)) in &want {
        match have.get(key) {
            None if skipped(&key.0) => {}
            None => found.push(Mismatch {
                frontend: label(key),
                service: service.clone(),
                problem: "missing",
                in_maps: Vec::new(),
                in_source: backends.clone(),
            }),
            Some((_, actual)) if actual != backends => found.push(Mismatch {
                frontend: label(key),
                service: service.clone(),
                problem: "backends differ",
                in_maps: actual.clone(),
                in_source: backends.clone(),
            }),
            Some(_) => {}
        }
    }
    for (key, (service, backends)) in have.iter().filter(|(k, _)| !want.contains_key(*k)) {
        found.push(Mismatch {
            frontend: label(key),
            service: service.clone(),
            problem: "stale",
            in_maps: backends.clone(),
            in_source: Vec::new(),
        });
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BackendAddr, Frontend, FrontendAddr, Protocol, ServicePortName};
    use std::net::Ipv4Addr;

    fn frontend(ip: [u8; 4], port: u16, backends: &[u8]) -> Frontend {
        Frontend::cluster_ip(
            FrontendAddr {
                ip: Ipv4Addr::from(ip).into(),
                port,
                protocol: Protocol::Tcp,
            },
            ServicePortName {
                namespace: "demo".into(),
                name: format!("s{port}").into(),
                port: "http".into(),
            },
            backends
                .iter()
                .map(|i| BackendAddr {
                    ip: Ipv4Addr::new(10, 244, *i, 2).into(),
                    port: 8080,
                })
                .collect(),
        )
    }

    fn row(ip: &str, port: u16, backends: &[u8]) -> ServiceRow {
        let backends = backends
            .iter()
            .rev()
            .map(|i| super::super::BackendRow {
                id: u32::from(*i) + 40,
                address: format!("10.244.{i}.2"),
                port: 8080,
                weight: None,
            })
            .collect();
        ServiceRow {
            id: 99,
            ..ServiceRow::for_test(&format!("demo/s{port}:http"), ip, port, backends)
        }
    }

    #[test]
    fn equal_sets_match_whatever_the_ids_and_order() {
        let mut desired = DesiredState::default();
        let f = frontend([10, 96, 0, 10], 80, &[1, 2]);
        desired.frontends.insert(f.addr, f);
        assert!(compare(&desired, &[row("10.96.0.10", 80, &[1, 2])], &[]).is_empty());
    }

    #[test]
    fn missing_stale_and_different_frontends_are_named() {
        let mut desired = DesiredState::default();
        for f in [
            frontend([10, 96, 0, 10], 80, &[1, 2]),
            frontend([10, 96, 0, 11], 81, &[1]),
            frontend([10, 96, 0, 12], 82, &[3]),
        ] {
            desired.frontends.insert(f.addr, f);
        }
        let rows = [row("10.96.0.10", 80, &[1]), row("10.96.0.99", 83, &[2])];
        let unprogrammed = [UnprogrammedService {
            service: "demo/s82:http".into(),
            frontend: "10.96.0.12:82/TCP".into(),
            reason: "map full".into(),
        }];
        let found = compare(&desired, &rows, &unprogrammed);
        let summary: Vec<(&str, &str)> = found
            .iter()
            .map(|m| (m.frontend.as_str(), m.problem))
            .collect();
        assert_eq!(
            summary,
            [
                ("10.96.0.10:80/TCP", "backends differ"),
                ("10.96.0.11:81/TCP", "missing"),
                ("10.96.0.99:83/TCP", "stale"),
            ]
        );
        assert_eq!(found[0].in_maps, ["10.244.1.2:8080"]);
        assert_eq!(found[0].in_source, ["10.244.1.2:8080", "10.244.2.2:8080"]);
    }

    #[test]
    fn an_external_set_is_compared_on_its_own() {
        let mut desired = DesiredState::default();
        let mut f = frontend([192, 168, 1, 5], 30080, &[1, 2]);
        f.external_backends = Some(vec![BackendAddr {
            ip: Ipv4Addr::new(10, 244, 1, 2).into(),
            port: 8080,
        }]);
        desired.frontends.insert(f.addr, f);
        let mut r = row("192.168.1.5", 30080, &[1, 2]);
        r.external_backends = Some(Vec::new());
        let found = compare(&desired, &[r], &[]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].frontend, "192.168.1.5:30080/TCP, from outside");
        assert_eq!(found[0].problem, "backends differ");
    }
}
