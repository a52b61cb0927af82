//! Following the directory: a file-system watch and a periodic rescan, on a
//! thread of its own, publishing whenever a rescan recorded changes.
//!
//! There is no fixed delay between a change and its rescan. An event that
//! says a file is complete (closed after writing, renamed into place,
//! removed) rescans at once; a burst is coalesced by draining the events
//! already pending before the rescan, not by waiting for more. A file with a
//! write seen but not yet its close is left alone until it is closed, so a
//! half-written file never replaces its objects (see [`Reread::writing`]).

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use notify::event::{AccessKind, AccessMode, ModifyKind};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use tracing::{debug, info, warn};

use super::state::{DirState, Reread};
use crate::source::feed::FeedTx;

/// The fallback rescan, in case an event is missed (it compares file metadata,
/// and reads only files whose size, modification time or inode changed). A
/// file whose write began longer ago than this without a close is read then too.
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

/// Notes what one file-system event asks of the next rescan in `reread`;
/// returns whether a rescan is due now. Our own reads show up as opens and
/// closes-after-reading; those ask nothing. A write in progress (a data
/// change, a regular file created) waits for its close.
fn note_event(ev: &notify::Result<notify::Event>, reread: &mut Reread, dir: &Path) -> bool {
    let ev = match ev {
        Ok(ev) if !ev.need_rescan() => ev,
        Ok(_) => {
            warn!(dir = %dir.display(), "file events were lost; reading every file");
            reread.all = true;
            return true;
        }
        Err(e) => {
            warn!(dir = %dir.display(), "file watch error: {e}; reading every file");
            reread.all = true;
            return true;
        }
    };
    let writing = match ev.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => false,
        EventKind::Access(_) => return false,
        EventKind::Modify(ModifyKind::Data(_)) => true,
        // A symlink (or a directory) is complete when created; a regular
        // file is then opened for writing, and its close follows.
        EventKind::Create(_) => ev
            .paths
            .iter()
            .all(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())),
        // A metadata change does not end a write in progress.
        EventKind::Modify(ModifyKind::Metadata(_)) => {
            reread.named.extend(ev.paths.iter().cloned());
            return true;
        }
        _ => false,
    };
    let now = Instant::now();
    for path in &ev.paths {
        if writing {
            reread.writing.insert(path.clone(), now);
        } else {
            reread.writing.remove(path);
            reread.named.insert(path.clone());
        }
    }
    !writing
}

/// Watches `dir` (see the module documentation) and feeds its objects to
/// `feed`. The directory is read once before this returns (a directory that
/// cannot be read fails here): its complete view is recorded and published
/// once. After that, each rescan records only the objects whose version in
/// effect changed, and publishes when there were any. Changes show up as
/// soon as a file-system event says a file is complete (see the module), or
/// within [`RESCAN_INTERVAL`] if an event is missed. The watch stops when the feed's receiver is dropped.
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

/// The watcher thread: rescans as soon as an event asks for it (after
/// draining the events already pending), and periodically, and publishes
/// whenever a rescan recorded changes.
fn follow(
    mut state: DirState,
    mut watcher: Option<RecommendedWatcher>,
    ev_tx: EventTx,
    ev_rx: EventRx,
    feed: FeedTx,
) {
    let mut next_rescan = Instant::now() + RESCAN_INTERVAL;
    let mut reread = Reread::default();
    loop {
        let wait = next_rescan.saturating_duration_since(Instant::now());
        let due = match ev_rx.recv_timeout(wait) {
            Ok(ev) => {
                let mut due = note_event(&ev, &mut reread, &state.dir);
                // Coalesce a burst: whatever is pending already goes into this rescan.
                while let Ok(ev) = ev_rx.try_recv() {
                    due |= note_event(&ev, &mut reread, &state.dir);
                }
                due
            }
            Err(RecvTimeoutError::Timeout) => {
                next_rescan = Instant::now() + RESCAN_INTERVAL;
                if let Some(cutoff) = Instant::now().checked_sub(RESCAN_INTERVAL) {
                    reread.forget_writes_before(cutoff);
                }
                true
            }
            Err(RecvTimeoutError::Disconnected) => false, // cannot happen: we hold a sender
        };
        if feed.is_closed() {
            break;
        }
        if !due {
            continue;
        }
        refresh_and_publish(&mut state, &reread, &feed);
        reread.answered();
        // Renew the watch if the directory was replaced (or the watch never started).
        let id = state.current_dir_id();
        if id.is_some() && (id != state.dir_id || watcher.is_none()) {
            watcher = None;
            match new_watcher(&state.dir, &ev_tx) {
                Ok(w) => {
                    watcher = Some(w);
                    state.dir_id = id;
                    // Something may have changed before the new watch took hold.
                    refresh_and_publish(&mut state, &Reread::all(), &feed);
                }
                Err(e) => {
                    debug!(dir = %state.dir.display(), "cannot watch the manifest directory yet: {e}")
                }
            }
        }
    }
    debug!(dir = %state.dir.display(), "manifest directory watch stopped");
}

fn refresh_and_publish(state: &mut DirState, reread: &Reread, feed: &FeedTx) {
    let recorded = state.refresh(reread, feed);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::dir::test_support::{
        replace_atomically, svc, TempDir, View, NODE_A, SERVICE, SLICE,
    };
    use crate::source::feed::{feed, FeedRx};

    /// Long enough for the watcher to have read a file it was told of (for
    /// checks that something did not change).
    const SETTLE: Duration = Duration::from_millis(500);

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
        tokio::time::sleep(SETTLE).await;
        view.apply(&rx.take());
        assert_eq!(view.service_ips(), ["10.96.0.1", "10.96.0.3"]);

        // Fix it again, atomically (write a hidden temporary file, rename over).
        replace_atomically(
            &dir,
            "b.yml",
            &svc("10.96.0.4").replace("name: web", "name: web2"),
        );
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
        tokio::time::sleep(SETTLE).await;
        view.apply(&rx.take());
        assert_eq!(view.service_ips(), ["10.96.0.4"]);

        std::fs::remove_file(dir.join("b.yml")).expect("remove");
        observe(&mut rx, &mut view, second, "last file deleted", |v| {
            v.services.is_empty()
        })
        .await;
        drop(rx);
    }

    /// A directory holding `a.yaml` with `contents`, watched, with its
    /// first view applied.
    async fn watching(tag: &str, contents: &str) -> (TempDir, FeedRx, View) {
        let tmp = TempDir::new(tag);
        std::fs::write(tmp.0.join("a.yaml"), contents).expect("write");
        let (tx, mut rx) = feed();
        watch_dir(tmp.0.clone(), "node-a".to_string(), tx)
            .await
            .expect("watch_dir");
        let mut view = View::default();
        view.apply(&rx.take());
        (tmp, rx, view)
    }

    /// A file replaced atomically (written aside, renamed into place)
    /// reaches the feed as soon as the rename is seen: no fixed delay. A
    /// fixed delay of D after each event would make every one of these at
    /// least D; the fastest of a few shows what is left without one (it is
    /// well under a millisecond on an idle machine).
    #[tokio::test]
    async fn a_renamed_file_reaches_the_feed_without_a_fixed_delay() {
        let (tmp, mut rx, mut view) = watching("nodelay", &svc("10.96.1.0")).await;
        let dir = tmp.0.clone();
        let mut took = Vec::new();
        for i in 1..=5 {
            let ip = format!("10.96.1.{i}");
            let renamed = Instant::now();
            replace_atomically(&dir, "a.yaml", &svc(&ip));
            observe(&mut rx, &mut view, Duration::from_secs(1), &ip, |v| {
                v.service_ips() == [ip.as_str()]
            })
            .await;
            took.push(renamed.elapsed());
        }
        let fastest = took.iter().min().copied().unwrap_or_default();
        assert!(
            fastest < Duration::from_millis(20),
            "rename → feed took {took:?}: every change waited (a fixed delay?)"
        );
    }

    /// A file seen being written is not read until it is closed: a rescan
    /// that another file's change causes meanwhile leaves its objects as
    /// they were, though the half written so far is valid YAML that drops
    /// one of them.
    #[tokio::test]
    async fn a_file_being_written_is_read_once_it_is_closed() {
        use std::io::Write as _;
        let web3 = |ip: &str| svc(ip).replace("name: web", "name: web3");
        let (tmp, mut rx, mut view) = watching(
            "halfwritten",
            &format!("{}---\n{}", svc("10.96.0.1"), web3("10.96.0.3")),
        )
        .await;
        let dir = tmp.0.clone();
        assert_eq!(view.service_ips(), ["10.96.0.1", "10.96.0.3"]);

        // Rewrite a.yaml in place, and stop halfway (the file stays open).
        let mut a = std::fs::File::create(dir.join("a.yaml")).expect("open");
        a.write_all(format!("{}---\n", svc("10.96.0.1")).as_bytes())
            .expect("write");
        a.flush().expect("flush");
        // Another file's change rescans the directory.
        replace_atomically(
            &dir,
            "b.yaml",
            &svc("10.96.0.2").replace("name: web", "name: web2"),
        );
        let second = Duration::from_secs(1);
        observe(&mut rx, &mut view, second, "the other file", |v| {
            v.service_ips().contains(&"10.96.0.2".to_string())
        })
        .await;
        tokio::time::sleep(SETTLE.min(RESCAN_INTERVAL / 2)).await;
        view.apply(&rx.take());
        assert_eq!(
            view.service_ips(),
            ["10.96.0.1", "10.96.0.2", "10.96.0.3"],
            "the half-written file was read"
        );

        // The rest of the write, and the close.
        a.write_all(web3("10.96.0.5").as_bytes()).expect("write");
        drop(a);
        observe(&mut rx, &mut view, second, "the closed file", |v| {
            v.service_ips() == ["10.96.0.1", "10.96.0.2", "10.96.0.5"]
        })
        .await;
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
