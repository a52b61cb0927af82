//! The one way both sources hand objects to the agent: changes, per object.
//!
//! A source records each object that changed ([`FeedTx::service`],
//! [`FeedTx::slice`], [`FeedTx::node`]) and then [`publish`](FeedTx::publish)es.
//! The agent wakes, [`take`](FeedRx::take)s everything recorded since its last
//! take, and recomputes only the Services those objects touch. Changes to one
//! object made while the agent was busy collapse into the newest version, so
//! a burst costs one sync and memory stays bounded by the number of objects,
//! never by the number of events.
//!
//! The first publish carries the source's complete first view (the cluster
//! source's initial lists; the directory's first scan); nothing is published
//! before it, so a starting agent never programs or removes anything from a
//! partial view.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tokio::sync::watch;

use crate::model::{ModelWarning, NodeInfo, ObjectKey, ServiceInfo, SliceInfo};
use crate::util::btree::extend_whole;

/// Everything recorded since the last take. `None` values are deletions.
#[derive(Debug, Default)]
pub struct Changes {
    pub services: BTreeMap<ObjectKey, Option<Arc<ServiceInfo>>>,
    pub slices: BTreeMap<ObjectKey, Option<Arc<SliceInfo>>>,
    /// `Some`: this node's Node changed (to `None`: it is gone or unknown).
    pub node: Option<Option<NodeInfo>>,
    /// `Some`: the source's own problems changed to these (the complete set:
    /// files that do not parse or cannot be read, a directory that cannot be
    /// listed).
    pub problems: Option<Vec<ModelWarning>>,
    /// The publish count these changes cover (what `/healthz` tracks).
    pub seq: u64,
    /// When each Service and EndpointSlice event of these changes was
    /// recorded (after the first view only: the start is measured apart),
    /// for the time from an event's arrival to the map write.
    pub arrivals: Vec<Instant>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.slices.is_empty()
            && self.node.is_none()
            && self.problems.is_none()
    }

    /// Objects changed (for logs).
    pub fn len(&self) -> usize {
        self.services.len()
            + self.slices.len()
            + usize::from(self.node.is_some())
            + usize::from(self.problems.is_some())
    }
}

struct Shared {
    pending: Mutex<Changes>,
    published: watch::Sender<u64>,
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, Changes> {
        // A panic while holding the lock cannot leave `Changes` half-updated
        // (every update is one map insert), so a poisoned lock is still usable.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The source's end.
#[derive(Clone)]
pub struct FeedTx {
    shared: Arc<Shared>,
}

/// The agent's end.
pub struct FeedRx {
    shared: Arc<Shared>,
    published: watch::Receiver<u64>,
}

/// A new feed: nothing published yet.
pub fn feed() -> (FeedTx, FeedRx) {
    let (published, rx) = watch::channel(0);
    let shared = Arc::new(Shared {
        pending: Mutex::new(Changes::default()),
        published,
    });
    (
        FeedTx {
            shared: Arc::clone(&shared),
        },
        FeedRx {
            shared,
            published: rx,
        },
    )
}

impl FeedTx {
    /// Records a Service's new version (`None`: deleted).
    pub fn service(&self, key: ObjectKey, info: Option<Arc<ServiceInfo>>) {
        let arrived = self.arrival();
        let mut pending = self.shared.pending();
        pending.services.insert(key, info);
        pending.arrivals.extend(arrived);
    }

    /// Records an EndpointSlice's new version (`None`: deleted).
    pub fn slice(&self, key: ObjectKey, info: Option<Arc<SliceInfo>>) {
        let arrived = self.arrival();
        let mut pending = self.shared.pending();
        pending.slices.insert(key, info);
        pending.arrivals.extend(arrived);
    }

    /// Records many versions at once: a first view (a list). The maps are
    /// built whole, their nodes full (one insert at a time leaves every
    /// node of an ordered run half empty: 15 MiB rather than 8 for 100k
    /// Services and their slices).
    pub fn versions(
        &self,
        services: impl IntoIterator<Item = (ObjectKey, Option<Arc<ServiceInfo>>)>,
        slices: impl IntoIterator<Item = (ObjectKey, Option<Arc<SliceInfo>>)>,
    ) {
        let arrived = self.arrival();
        let mut pending = self.shared.pending();
        fn newest<V>(_: &ObjectKey, old: &mut V, new: V) {
            *old = new;
        }
        let mut n = 0;
        let services = services.into_iter().inspect(|_| n += 1);
        extend_whole(&mut pending.services, services, newest);
        let slices = slices.into_iter().inspect(|_| n += 1);
        extend_whole(&mut pending.slices, slices, newest);
        if let Some(at) = arrived {
            pending.arrivals.extend(std::iter::repeat_n(at, n));
        }
    }

    /// Now, once the first view is published (its objects are not events
    /// to time, and would cost a stamp each at 100k).
    fn arrival(&self) -> Option<Instant> {
        (*self.shared.published.borrow() > 0).then(Instant::now)
    }

    /// Records this node's new state (`None`: gone or unknown).
    pub fn node(&self, node: Option<NodeInfo>) {
        self.shared.pending().node = Some(node);
    }

    /// Records the source's problems now in force (the complete set).
    pub fn problems(&self, problems: Vec<ModelWarning>) {
        self.shared.pending().problems = Some(problems);
    }

    /// Wakes the agent for what was recorded.
    pub fn publish(&self) {
        self.shared.published.send_modify(|n| *n += 1);
    }

    /// Whether the agent's end is gone (the source may stop).
    pub fn is_closed(&self) -> bool {
        self.shared.published.is_closed()
    }
}

/// The agent's end stopped listening.
#[derive(Debug, thiserror::Error)]
#[error("the source stopped")]
pub struct SourceStopped;

impl FeedRx {
    /// Waits for the next publish.
    pub async fn changed(&mut self) -> Result<(), SourceStopped> {
        self.published.changed().await.map_err(|_| SourceStopped)
    }

    /// Everything recorded so far, leaving nothing pending.
    pub fn take(&mut self) -> Changes {
        let seq = *self.published.borrow_and_update();
        let mut changes = std::mem::take(&mut *self.shared.pending());
        changes.seq = seq;
        changes
    }

    /// The publish count, to watch apart from the agent's loop (`/healthz`
    /// marks each publish as a queued change).
    pub fn publishes(&self) -> watch::Receiver<u64> {
        self.published.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str, port: i32) -> Arc<ServiceInfo> {
        Arc::new(ServiceInfo {
            key: ObjectKey::new("default", name),
            spec: Some(crate::model::ServiceSpecInfo {
                ports: Box::new([crate::model::ServicePortInfo {
                    port,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn versions_of_one_object_collapse_into_the_newest() {
        let (tx, mut rx) = feed();
        let key = ObjectKey::new("default", "web");
        tx.service(key.clone(), Some(svc("web", 80)));
        tx.publish();
        tx.service(key.clone(), Some(svc("web", 81)));
        tx.publish();
        rx.changed().await.expect("published");
        let changes = rx.take();
        assert_eq!(changes.seq, 2);
        assert_eq!(changes.services.len(), 1);
        assert_eq!(changes.services[&key], Some(svc("web", 81)));
        // The first version came before anything was published (the first
        // view): not timed; the second is.
        assert_eq!(changes.arrivals.len(), 1);
        assert!(rx.take().is_empty());
    }

    /// Many versions at once are recorded as one at a time would be.
    #[tokio::test]
    async fn versions_at_once_are_recorded_as_one_by_one() {
        let (tx, mut rx) = feed();
        let (a, b) = (
            ObjectKey::new("default", "a"),
            ObjectKey::new("default", "b"),
        );
        tx.versions([(a.clone(), Some(svc("a", 80)))], []);
        tx.versions([(b.clone(), None), (a.clone(), None)], []);
        tx.publish();
        rx.changed().await.expect("published");
        let changes = rx.take();
        assert_eq!(changes.services.keys().collect::<Vec<_>>(), [&a, &b]);
        assert_eq!(changes.services[&a], None);
        assert!(changes.arrivals.is_empty(), "before the first publish");
        tx.versions([(a.clone(), Some(svc("a", 81)))], []);
        assert_eq!(rx.take().arrivals.len(), 1);
    }

    #[tokio::test]
    async fn a_delete_after_an_update_is_a_delete() {
        let (tx, mut rx) = feed();
        let key = ObjectKey::new("default", "web");
        tx.service(key.clone(), Some(svc("web", 80)));
        tx.service(key.clone(), None);
        tx.publish();
        rx.changed().await.expect("published");
        assert_eq!(rx.take().services[&key], None);
    }
}
