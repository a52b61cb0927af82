//! Following the directory: a file-system watch (debounced) and a periodic
//! rescan, on a thread of its own, publishing whenever a rescan recorded
//! changes.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use tracing::{debug, info, warn};

use super::state::DirState;
use crate::model::NodeInfo;
use crate::source::feed::FeedTx;

/// How long to wait after a file-system event for more to arrive before rescanning.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// The fallback rescan, in case an event is missed (it compares file metadata,
/// and reads only files whose size, modification time or inode changed).
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

type EventRx = mpsc::Receiver<notify::Result<notify::Event>>;
type EventTx = mpsc::Sender<notify::Result<notify::Event>>;

fn new_watcher(dir: &Path, events: &EventTx) -> notify::Result<RecommendedWatcher> {
    let tx = events.clone();
    let mut w = notify::recommended_watcher(move |ev| {
        // The receiver lives as long as the source; a failed send only happens at shutdown.
        let _ = tx.send(ev);
    })?;
    w.watch(dir, RecursiveMode::NonRecursive)?;
    Ok(w)
}

/// Events that can change what the directory holds. Our own reads show up as
/// opens and closes-after-reading; those must not trigger a rescan.
fn relevant(ev: &notify::Result<notify::Event>) -> bool {
    match ev {
        Ok(ev) => match ev.kind {
            EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
            EventKind::Access(_) => false,
            _ => true,
        },
        Err(_) => true,
    }
}

/// Watches `dir` (see the module documentation) and feeds its objects to
/// `feed`. The directory is read once before this returns (a directory that
/// cannot be read fails here): its complete view is recorded and published
/// once. After that, each rescan records only the objects whose version in
/// effect changed, and publishes when there were any. Changes show up within
/// [`DEBOUNCE`] of a file-system event, or within [`RESCAN_INTERVAL`] if an
/// event is missed. The watch stops when the feed's receiver is dropped.
/// `node_name` is the agent's node: the Node of that name is the one recorded.
pub async fn watch_dir(dir: PathBuf, node_name: String, feed: FeedTx) -> anyhow::Result<()> {
    let meta = tokio::fs::metadata(&dir)
        .await
        .with_context(|| format!("manifest directory {}", dir.display()))?;
    anyhow::ensure!(meta.is_dir(), "{} is not a directory", dir.display());

    let (ev_tx, ev_rx) = mpsc::channel();
    let first_feed = feed.clone();
    let (state, watcher, ev_tx) = tokio::task::spawn_blocking(move || {
        let mut state = DirState::new(dir, node_name);
        // Watch first, then read: a change in between is then not lost.
        let watcher = match new_watcher(&state.dir, &ev_tx) {
            Ok(w) => Some(w),
            Err(e) => {
                warn!(
                    dir = %state.dir.display(),
                    "cannot watch the manifest directory ({e}); rescanning every {:?} instead",
                    RESCAN_INTERVAL
                );
                None
            }
        };
        state.dir_id = state.current_dir_id();
        state.first(&first_feed);
        (state, watcher, ev_tx)
    })
    .await
    .context("reading the manifest directory")?;

    info!(
        dir = %state.dir.display(),
        files = state.files.len(),
        services = state.services.by_key.len(),
        endpoint_slices = state.slices.by_key.len(),
        "manifest directory read"
    );
    feed.publish();
    std::thread::Builder::new()
        .name("dir-source".into())
        .spawn(move || follow(state, watcher, ev_tx, ev_rx, feed))
        .context("starting the manifest directory watcher thread")?;
    Ok(())
}

/// The watcher thread: rescans after (debounced) events and periodically,
/// and publishes whenever a rescan recorded changes.
fn follow(
    mut state: DirState,
    mut watcher: Option<RecommendedWatcher>,
    ev_tx: EventTx,
    ev_rx: EventRx,
    feed: FeedTx,
) {
    let mut next_rescan = Instant::now() + RESCAN_INTERVAL;
    loop {
        let wait = next_rescan.saturating_duration_since(Instant::now());
        let read_all = match ev_rx.recv_timeout(wait) {
            Ok(ev) => {
                if !relevant(&ev) {
                    if feed.is_closed() {
                        break;
                    }
                    continue;
                }
                if let Err(e) = &ev {
                    warn!(dir = %state.dir.display(), "file watch error: {e}");
                }
                // Debounce: let a burst of events (an editor's save, a `cp` of
                // several files) settle, then read once.
                std::thread::sleep(DEBOUNCE);
                while ev_rx.try_recv().is_ok() {}
                true
            }
            Err(RecvTimeoutError::Timeout) => {
                next_rescan = Instant::now() + RESCAN_INTERVAL;
                false
            }
            Err(RecvTimeoutError::Disconnected) => false, // cannot happen: we hold a sender
        };
        if feed.is_closed() {
            break;
        }
        refresh_and_publish(&mut state, read_all, &feed);
        // Renew the watch if the directory was replaced (or the watch never started).
        let id = state.current_dir_id();
        if id.is_some() && (id != state.dir_id || watcher.is_none()) {
            watcher = None;
            match new_watcher(&state.dir, &ev_tx) {
                Ok(w) => {
                    watcher = Some(w);
                    state.dir_id = id;
                    // Something may have changed before the new watch took hold.
                    refresh_and_publish(&mut state, true, &feed);
                }
                Err(e) => {
                    debug!(dir = %state.dir.display(), "cannot watch the manifest directory yet: {e}")
                }
            }
        }
    }
    debug!(dir = %state.dir.display(), "manifest directory watch stopped");
}

fn refresh_and_publish(state: &mut DirState, read_all: bool, feed: &FeedTx) {
    let recorded = state.refresh(read_all, feed);
    if recorded > 0 {
        debug!(
            changed = recorded,
            services = state.services.by_key.len(),
            endpoint_slices = state.slices.by_key.len(),
            "manifest changes recorded"
        );
        feed.publish();
    }
}

/// Logs this node's Node appearing, changing or going (at start: whether it is there).
pub(super) fn log_node_change(
    state: &DirState,
    old: Option<&NodeInfo>,
    new: Option<&NodeInfo>,
    start: bool,
) {
    if old == new && !start {
        return;
    }
    match new {
        Some(node) => info!(
            node = %node.name,
            addresses = ?node.addresses,
            zone = node.zone.as_deref().unwrap_or(""),
            "this node's Node read from the manifest directory"
        ),
        None => info!(
            node = %state.node_name,
            dir = %state.dir.display(),
            "no Node of this node's name in the manifest directory: no NodePort frontends, Local traffic policies act as Cluster"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::dir::test_support::{svc, TempDir, View, NODE_A, SERVICE, SLICE};
    use crate::source::feed::{feed, FeedRx};

    /// Waits (at most `limit`) until the view, with what `rx` publishes
    /// applied, satisfies `want`.
    async fn observe(
        rx: &mut FeedRx,
        view: &mut View,
        limit: Duration,
        what: &str,
        want: impl Fn(&View) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            view.apply(&rx.take());
            if want(view) {
                return;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => panic!("{what}: the watcher stopped"),
                Err(_) => panic!(
                    "{what}: not observed within {limit:?}; the view has services {:?}",
                    view.service_ips()
                ),
            }
        }
    }

    #[tokio::test]
    async fn watch_dir_follows_add_edit_break_fix_rename_delete() {
        let tmp = TempDir::new("watch");
        let dir = tmp.0.clone();
        std::fs::write(
            dir.join("a.yaml"),
            format!("{}---\n{SLICE}", svc("10.96.0.1")),
        )
        .expect("write");
        std::fs::write(dir.join("notes.txt"), "not a manifest").expect("write");

        let (tx, mut rx) = feed();
        watch_dir(dir.clone(), "node-a".to_string(), tx)
            .await
            .expect("watch_dir");
        let mut view = View::default();
        let first = rx.take();
        assert_eq!(first.seq, 1, "the first view is published once");
        view.apply(&first);
        assert_eq!(
            view.service_ips(),
            ["10.96.0.1"],
            "the first view is there at once"
        );
        assert_eq!(view.slices.len(), 1);
        let second = Duration::from_secs(1);

        // Add a file (the Service name differs, so both stay).
        std::fs::write(
            dir.join("b.yml"),
            svc("10.96.0.2").replace("name: web", "name: web2"),
        )
        .expect("write");
        observe(&mut rx, &mut view, second, "added file", |v| {
            v.service_ips() == ["10.96.0.1", "10.96.0.2"]
        })
        .await;

        // Edit it.
        std::fs::write(
            dir.join("b.yml"),
            svc("10.96.0.3").replace("name: web", "name: web2"),
        )
        .expect("write");
        observe(&mut rx, &mut view, second, "edited file", |v| {
            v.service_ips() == ["10.96.0.1", "10.96.0.3"]
        })
        .await;

        // Break it: the last good objects stay (give the watcher time to have read it).
        std::fs::write(
            dir.join("b.yml"),
            "apiVersion: v1\nkind: Service\nmetadata: {name: [oops\n",
        )
        .expect("write");
        tokio::time::sleep(DEBOUNCE * 5).await;
        view.apply(&rx.take());
        assert_eq!(view.service_ips(), ["10.96.0.1", "10.96.0.3"]);

        // Fix it again, atomically (write a hidden temporary file, rename over).
        let tmp_file = dir.join(".b.yml.tmp");
        std::fs::write(
            &tmp_file,
            svc("10.96.0.4").replace("name: web", "name: web2"),
        )
        .expect("write");
        std::fs::rename(&tmp_file, dir.join("b.yml")).expect("rename");
        observe(&mut rx, &mut view, second, "fixed by rename", |v| {
            v.service_ips() == ["10.96.0.1", "10.96.0.4"]
        })
        .await;

        // Delete a file: its objects go away (the broken-then-fixed one too).
        std::fs::remove_file(dir.join("a.yaml")).expect("remove");
        observe(&mut rx, &mut view, second, "deleted file", |v| {
            v.service_ips() == ["10.96.0.4"] && v.slices.is_empty()
        })
        .await;

        // A file that is broken from the start contributes nothing, the rest stays.
        std::fs::write(dir.join("c.yaml"), "kind: [\n").expect("write");
        tokio::time::sleep(DEBOUNCE * 5).await;
        view.apply(&rx.take());
        assert_eq!(view.service_ips(), ["10.96.0.4"]);

        std::fs::remove_file(dir.join("b.yml")).expect("remove");
        observe(&mut rx, &mut view, second, "last file deleted", |v| {
            v.services.is_empty()
        })
        .await;
        drop(rx);
    }

    #[tokio::test]
    async fn watch_dir_follows_this_nodes_node() {
        let tmp = TempDir::new("watch-node");
        let dir = tmp.0.clone();
        std::fs::write(dir.join("svc.yaml"), SERVICE).expect("write");
        let (tx, mut rx) = feed();
        watch_dir(dir.clone(), "node-a".to_string(), tx)
            .await
            .expect("watch_dir");
        let mut view = View::default();
        let first = rx.take();
        assert_eq!(first.node, Some(None), "the first view says: no Node");
        view.apply(&first);
        let second = Duration::from_secs(1);
        std::fs::write(dir.join("node.yaml"), NODE_A).expect("write");
        observe(&mut rx, &mut view, second, "Node added", |v| {
            v.node.as_ref().is_some_and(|n| n.name == "node-a")
        })
        .await;
        std::fs::remove_file(dir.join("node.yaml")).expect("remove");
        observe(&mut rx, &mut view, second, "Node removed", |v| {
            v.node.is_none()
        })
        .await;
    }

    #[tokio::test]
    async fn watch_dir_rejects_a_missing_directory() {
        let (tx, _rx) = feed();
        let err = watch_dir(
            PathBuf::from("/nonexistent/switchboard-manifests"),
            "node-a".to_string(),
            tx,
        )
        .await
        .expect_err("missing dir");
        assert!(
            format!("{err:#}").contains("/nonexistent/switchboard-manifests"),
            "{err:#}"
        );
    }
}
