//! Helpers shared by the tests of the submodules: manifests, a temporary
//! directory, and the view an agent builds from the feed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use crate::model::{NodeInfo, ObjectKey, ServiceInfo, SliceInfo};
use crate::source::feed::Changes;

pub(super) const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n";
pub(super) const SLICE: &str = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [10.244.1.2]}]\n";

pub(super) const NODE_A: &str = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-a\n  labels: {topology.kubernetes.io/zone: zone-1}\nstatus:\n  addresses:\n  - {type: Hostname, address: node-a}\n  - {type: ExternalIP, address: 203.0.113.7}\n  - {type: InternalIP, address: 192.168.1.10}\n  - {type: InternalIP, address: 'fd00::10'}\n";

pub(super) fn node_b() -> String {
    NODE_A
        .replace("node-a", "node-b")
        .replace("192.168.1.10", "192.168.1.11")
}

/// Services `range` with an EndpointSlice of 10 endpoints each, as the
/// benchmark writes them (`kubectl get -o yaml` style).
pub(super) fn bench_yaml(range: std::ops::Range<usize>) -> String {
    let mut text = String::new();
    for i in range {
        let (a, b) = (i / 250, i % 250);
        text.push_str(&format!("---\napiVersion: v1\nkind: Service\nmetadata:\n  name: fill-{i}\n  namespace: bench\nspec:\n  type: ClusterIP\n  clusterIP: 10.96.{a}.{b}\n  clusterIPs:\n  - 10.96.{a}.{b}\n  selector:\n    app: fill-{i}\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n"));
        text.push_str(&format!("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata:\n  name: fill-{i}-abcde\n  namespace: bench\n  labels:\n    kubernetes.io/service-name: fill-{i}\nendpoints:\n"));
        for e in 0..10 {
            text.push_str(&format!("- addresses:\n  - 10.{}.{}.{e}\n  conditions:\n    ready: true\n    serving: true\n    terminating: false\n", 128 + i / 62500, (i / 250) % 250));
        }
        text.push_str("ports:\n- name: http\n  port: 8080\n  protocol: TCP\n");
    }
    text
}

/// [`bench_yaml`]'s objects as people write them by hand: flow mappings
/// and sequences inside the block structure, some scalars quoted.
pub(super) fn bench_yaml_flow(range: std::ops::Range<usize>) -> String {
    let mut text = String::new();
    for i in range {
        let (a, b) = (i / 250, i % 250);
        text.push_str(&format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: fill-{i}, namespace: bench}}\nspec:\n  type: ClusterIP\n  clusterIP: 10.96.{a}.{b}\n  clusterIPs: [10.96.{a}.{b}]\n  selector: {{app: fill-{i}}}\n  ports: [{{name: http, port: 80, protocol: TCP, targetPort: 8080}}]\n"));
        text.push_str(&format!("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata:\n  name: fill-{i}-abcde\n  namespace: bench\n  labels: {{kubernetes.io/service-name: fill-{i}}}\nendpoints:\n"));
        for e in 0..10 {
            text.push_str(&format!("- addresses: [\"10.{}.{}.{e}\"]\n  conditions: {{ready: true, serving: true, terminating: false}}\n", 128 + i / 62500, (i / 250) % 250));
        }
        text.push_str("ports: [{name: http, port: 8080, protocol: TCP}]\n");
    }
    text
}

pub(super) fn svc(ip: &str) -> String {
    SERVICE.replace("10.96.0.10", ip)
}

/// Replaces `name` in `dir` with `contents` atomically: written under a
/// hidden name (the source skips it), then renamed into place.
pub(super) fn replace_atomically(dir: &std::path::Path, name: &str, contents: &str) {
    let staging = dir.join(format!(".{name}.tmp"));
    std::fs::write(&staging, contents).expect("write");
    std::fs::rename(&staging, dir.join(name)).expect("rename");
}

/// A fresh directory under the system temp dir, removed on drop.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let dir = std::env::temp_dir().join(format!(
            "switchboard-test-{tag}-{}-{nanos}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the agent builds from the feed: the recorded changes applied in turn.
#[derive(Debug, Default)]
pub(super) struct View {
    pub(super) services: BTreeMap<ObjectKey, Arc<ServiceInfo>>,
    pub(super) slices: BTreeMap<ObjectKey, Arc<SliceInfo>>,
    pub(super) node: Option<NodeInfo>,
}

fn apply_map<T>(
    map: &mut BTreeMap<ObjectKey, Arc<T>>,
    changes: &BTreeMap<ObjectKey, Option<Arc<T>>>,
) {
    for (key, obj) in changes {
        match obj {
            Some(obj) => {
                map.insert(key.clone(), Arc::clone(obj));
            }
            None => {
                map.remove(key);
            }
        }
    }
}

impl View {
    pub(super) fn apply(&mut self, changes: &Changes) {
        apply_map(&mut self.services, &changes.services);
        apply_map(&mut self.slices, &changes.slices);
        if let Some(node) = &changes.node {
            self.node.clone_from(node);
        }
    }

    /// Every Service's cluster IPs, sorted.
    pub(super) fn service_ips(&self) -> Vec<String> {
        let mut ips: Vec<String> = self
            .services
            .values()
            .filter_map(|s| s.spec.as_ref())
            .flat_map(|s| s.cluster_ips.iter().cloned())
            .collect();
        ips.sort();
        ips
    }
}
