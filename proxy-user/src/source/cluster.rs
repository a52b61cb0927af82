//! The Kubernetes API source: Services, EndpointSlices and this node's Node
//! object, watched through the API server with kube-runtime reflectors.
//!
//! Nothing is published until all three watches have completed their first
//! list, so a starting agent never programs (or removes) anything from a
//! partial view. After that, every change marks the view dirty and a new
//! snapshot is cut once no event has arrived for [`COALESCE`] (or after
//! [`MAX_DELAY`] of continuous events), so a burst costs one sync. While the
//! API server is unreachable the watchers retry with backoff and the last
//! snapshot stays in force: what is programmed keeps forwarding. An expired
//! resourceVersion (410 Gone) makes the watcher relist; the reflector swaps
//! its store only when the relist is complete.
use std::{
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{Stream, StreamExt as _};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{
        reflector::{self, Store},
        watcher::{self, Event},
        WatchStreamExt as _,
    },
    Api, Client, Config, Resource,
};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use super::Snapshot;
use crate::model::NodeInfo;

/// The resources the agent watches, as `(API group, plural resource)`: taken
/// from the same k8s-openapi types the reflectors below use. The agent only
/// lists and watches them ([`WATCH_VERBS`]); the ClusterRole in `manifests/`
/// grants exactly that (a test holds the two equal).
pub fn watched_resources() -> Vec<(&'static str, &'static str)> {
    use k8s_openapi::Resource as _;
    vec![
        (Service::GROUP, Service::URL_PATH_SEGMENT),
        (EndpointSlice::GROUP, EndpointSlice::URL_PATH_SEGMENT),
        (Node::GROUP, Node::URL_PATH_SEGMENT),
    ]
}

/// The verbs a reflector uses: an initial list, then a watch.
pub const WATCH_VERBS: &[&str] = &["list", "watch"];

/// Quiet time after the last event before a snapshot is cut.
pub const COALESCE: Duration = Duration::from_millis(50);
/// Longest a continuous stream of events can hold a snapshot back.
pub const MAX_DELAY: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("reading kubeconfig {path}")]
    Kubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("no usable Kubernetes configuration (in-cluster service account or KUBECONFIG)")]
    Infer(#[source] kube::config::InferConfigError),
    #[error("building the Kubernetes client")]
    Client(#[source] kube::Error),
}

/// A client from `--kubeconfig` if given, else the usual inference
/// (in-cluster service account, then `KUBECONFIG` / `~/.kube/config`).
pub async fn client(kubeconfig: Option<&PathBuf>) -> Result<Client, ClusterError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ClusterError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClusterError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        None => Config::infer().await.map_err(ClusterError::Infer)?,
    };
    Client::try_from(config).map_err(ClusterError::Client)
}

/// Which object kind changed; for logs.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Service,
    EndpointSlice,
    Node,
}

/// Starts the three reflectors and returns the latest snapshot, published
/// only once every watch has listed.
pub async fn watch_cluster(client: Client, node_name: String) -> watch::Receiver<Arc<Snapshot>> {
    let (services, services_writer) = reflector::store::<Service>();
    let (slices, slices_writer) = reflector::store::<EndpointSlice>();
    let (nodes, nodes_writer) = reflector::store::<Node>();
    let (changed_tx, changed_rx) = mpsc::channel::<Kind>(1024);

    spawn_reflector(
        Kind::Service,
        Api::<Service>::all(client.clone()),
        watcher::Config::default(),
        services_writer,
        changed_tx.clone(),
    );
    spawn_reflector(
        Kind::EndpointSlice,
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default(),
        slices_writer,
        changed_tx.clone(),
    );
    spawn_reflector(
        Kind::Node,
        Api::<Node>::all(client),
        watcher::Config::default().fields(&format!("metadata.name={node_name}")),
        nodes_writer,
        changed_tx,
    );

    let (snapshot_tx, snapshot_rx) = watch::channel(Arc::new(Snapshot::default()));
    tokio::spawn(publish(
        Stores {
            services,
            slices,
            nodes,
        },
        node_name,
        changed_rx,
        snapshot_tx,
    ));
    snapshot_rx
}

struct Stores {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    nodes: Store<Node>,
}

impl Stores {
    fn snapshot(&self, node_name: &str) -> Snapshot {
        let node = self
            .nodes
            .state()
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(node_name))
            .map(|n| NodeInfo::from_node(&n));
        Snapshot {
            services: self
                .services
                .state()
                .iter()
                .map(|s| (**s).clone())
                .collect(),
            endpoint_slices: self.slices.state().iter().map(|s| (**s).clone()).collect(),
            node,
        }
    }
}

fn spawn_reflector<K>(
    kind: Kind,
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    changed: mpsc::Sender<Kind>,
) where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let stream = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
    tokio::spawn(drive(kind, stream, changed));
}

/// Runs one reflector stream, reporting each change. Errors are logged; the
/// backoff inside the stream retries.
async fn drive<K: Resource>(
    kind: Kind,
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    changed: mpsc::Sender<Kind>,
) {
    let mut stream = std::pin::pin!(stream);
    let mut healthy = true;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Apply(_) | Event::Delete(_) | Event::InitDone) => {
                if !healthy {
                    info!(?kind, "watch recovered");
                    healthy = true;
                }
                if changed.send(kind).await.is_err() {
                    return;
                }
            }
            Ok(Event::Init) => debug!(?kind, "listing"),
            Ok(Event::InitApply(_)) => {}
            Err(error) => {
                if healthy {
                    warn!(?kind, %error, "watch failed; retrying with backoff, what is programmed stays");
                }
                healthy = false;
            }
        }
    }
}

/// Cuts snapshots: first when every store has listed, then after each burst.
async fn publish(
    stores: Stores,
    node_name: String,
    mut changed: mpsc::Receiver<Kind>,
    snapshot_tx: watch::Sender<Arc<Snapshot>>,
) {
    for (kind, ready) in [
        ("services", stores.services.wait_until_ready().await),
        ("endpointslices", stores.slices.wait_until_ready().await),
        ("node", stores.nodes.wait_until_ready().await),
    ] {
        if ready.is_err() {
            warn!(kind, "watch ended before its first list");
            return;
        }
    }
    // Drain what the initial lists queued: the first snapshot covers it.
    while changed.try_recv().is_ok() {}
    let first = stores.snapshot(&node_name);
    if first.node.is_none() {
        warn!(node = %node_name, "this node's Node object was not found: no NodePort frontends, Local policies cannot be applied");
    }
    info!(
        services = first.services.len(),
        endpoint_slices = first.endpoint_slices.len(),
        "initial list complete"
    );
    if snapshot_tx.send(Arc::new(first)).is_err() {
        return;
    }
    while changed.recv().await.is_some() {
        let burst_start = Instant::now();
        loop {
            let remaining = MAX_DELAY.saturating_sub(burst_start.elapsed());
            if remaining.is_zero() {
                break;
            }
            match tokio::time::timeout(COALESCE.min(remaining), changed.recv()).await {
                Ok(Some(_)) => continue,
                Ok(None) => return,
                Err(_) => break,
            }
        }
        if snapshot_tx
            .send(Arc::new(stores.snapshot(&node_name)))
            .is_err()
        {
            return;
        }
    }
}
