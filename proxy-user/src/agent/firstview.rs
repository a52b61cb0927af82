//! The start's third phase, while the load runs: the source opened and its
//! first complete view read. Until that view is there, what is pinned keeps
//! forwarding untouched.
use anyhow::Context as _;
use tokio::sync::watch;
use tracing::info;

use crate::{
    agent::config::{AgentConfig, Source},
    observe::health::ProxyHealth,
    source::{self, cluster, dir, Changes, FeedRx},
    util::heap,
};

/// The source, and the first complete view it gave.
pub(super) struct FirstView {
    /// The source's later changes.
    pub feed: FeedRx,
    /// Every Service and EndpointSlice of the first view.
    pub changes: Changes,
}

/// Opens the source and reads its first complete view. Only opening can
/// fail (a bad kubeconfig, a missing directory), and it fails here, before
/// anything is written. What reading took is handed back to the kernel
/// before the first sync, and from here on every publish of the source
/// counts as a queued change on `/healthz`.
pub(super) async fn read(config: &AgentConfig, health: &ProxyHealth) -> anyhow::Result<FirstView> {
    let before_source = heap::heap();
    let mut feed = open_source(config).await?;
    // What reading it freed (file text, list pages, the parse's own
    // allocations on every core) goes back to the kernel before the first
    // sync adds the model, the desired state and the map mirror: otherwise
    // it stays resident beside them and makes the start's peak.
    heap::trim();
    let source_read = heap::heap();
    info!(
        heap_before_mib = before_source.live_mib(),
        heap_mib = source_read.live_mib(),
        heap_peak_mib = source_read.peak_mib(),
        "the source's first view is read"
    );
    tokio::spawn(mark_queued(feed.publishes(), health.clone()));
    let changes = feed.take();
    Ok(FirstView { feed, changes })
}

/// Opens the source and waits for its first complete view. A source that
/// cannot be read (a bad kubeconfig, a missing directory) fails here, before
/// anything is loaded.
async fn open_source(config: &AgentConfig) -> anyhow::Result<FeedRx> {
    let (tx, mut rx) = source::feed();
    match &config.source {
        Source::Dir(dir) => dir::watch_dir(dir.clone(), config.node_name.clone(), tx)
            .await
            .with_context(|| format!("watching {}", dir.display()))?,
        Source::Cluster => {
            let client =
                cluster::client_with(config.kubeconfig.as_ref(), Some(config.watch_timing.idle()))
                    .await
                    .context("connecting to the Kubernetes API")?;
            info!(node = %config.node_name, "watching the Kubernetes API");
            cluster::watch_cluster(
                client,
                config.node_name.clone(),
                config.proxy_name.clone(),
                config.watch_timing,
                tx,
            );
        }
    }
    // The first view is published once complete (every watch has listed;
    // the directory has been read); until then, what is pinned keeps
    // forwarding untouched.
    rx.changed()
        .await
        .context("the source stopped before its first complete view")?;
    Ok(rx)
}

/// Marks every publish of the source as a queued change, as kube-proxy's
/// event handlers do, apart from the loop that syncs it: a loop that hangs
/// leaves the change queued and `/healthz` turns unhealthy.
async fn mark_queued(mut publishes: watch::Receiver<u64>, health: ProxyHealth) {
    while publishes.changed().await.is_ok() {
        let seq = *publishes.borrow_and_update();
        health.queued_change(seq);
    }
}
