//! The Kubernetes API source: Services, EndpointSlices and this node's Node
//! object, watched through the API server with kube-runtime watchers.
//!
//! Services and EndpointSlices are decoded from the API server's JSON
//! straight into the model's input types ([`crate::source::wire`]: only the
//! fields the model reads; no k8s-openapi object is built), the Node with
//! the k8s-openapi type ([`NodeInfo::from_node`]); each is recorded into the
//! [`FeedTx`] as it arrives: at 100k Services the agent holds what the model
//! reads, not whole objects, and a change costs one record rather than a
//! copy of the world. What a watch keeps for itself
//! is the key and resourceVersion of each object it recorded ([`Known`]).
//!
//! Nothing is published until all three watches have completed their first
//! list, so a starting agent never programs (or removes) anything from a
//! partial view; until then the log says, every few seconds, which are still
//! listing. After that, the events a stream has ready are recorded and
//! published at once (the feed collapses bursts on the agent's side).
//!
//! While the API server is unreachable or failing (errors, throttling,
//! broken streams) the watchers retry with kube-runtime's default backoff
//! (client-go's: 0.8 s doubling to 30 s, with jitter, reset by the next
//! success) and what is programmed stays; every failed attempt is logged
//! with what it waits for (`services watch failing: HTTP 500 …; retrying`),
//! and the first event after an outage with `recovered`.
//!
//! A watch that goes silent (held open, no event, no bookmark: a dead
//! connection behind a NAT, a wedged server) is detected by the client's
//! read timeout, [`WatchTiming::idle`]: longer than the watch's own
//! `timeoutSeconds`, after which a healthy server ends it, and than the
//! server's bookmark interval (a minute on kube-apiserver), so only a watch
//! that broke its promise trips it. The read fails, the watcher resumes
//! from its last resourceVersion, and the log says `watch silent`. An expired resourceVersion (410 Gone) or a
//! failed list makes a watcher relist (`Init`, `InitApply`…, `InitDone`;
//! with the default list-then-watch strategy every attempt starts with
//! `Init`). Listed objects are recorded as they come, except those whose
//! resourceVersion is the one already recorded; at `InitDone`, the keys the
//! relist no longer names are recorded as deleted.
//!
//! Services and EndpointSlices are selected on the server as kube-proxy
//! does: `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`.
//! With a proxy name of our own, objects labelled with exactly that name are
//! ours too, and one selector cannot say "absent or equal to X": the server
//! then filters on `!service.kubernetes.io/headless` only and the model
//! applies [`ProxyLabels::selected`](crate::model::ProxyLabels::selected).
//! The Node is selected by name.
use std::{
    collections::{hash_map::Entry, BTreeMap, HashMap},
    path::PathBuf,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use futures::{FutureExt as _, Stream, StreamExt as _};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    config::{KubeConfigOptions, Kubeconfig},
    runtime::{
        watcher::{self, Event},
        WatchStreamExt as _,
    },
    Api, Client, Config, Resource,
};
use serde::de::DeserializeOwned;
use tracing::{debug, error, info, warn};

use super::feed::FeedTx;
use super::wire::{ServiceObject, SliceObject, Undecodable};
use crate::model::{
    Interner, ModelWarning, NodeInfo, ObjectKey, ServiceInfo, SliceInfo, LABEL_HEADLESS,
    LABEL_SERVICE_PROXY_NAME,
};

/// The resources the agent watches, as `(API group, plural resource)`: taken
/// from the same k8s-openapi types the watchers below use. The agent only
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

/// The verbs a watcher uses: an initial list, then a watch.
pub const WATCH_VERBS: &[&str] = &["list", "watch"];

/// How often the log names the watches still on their first list.
const WAITING_LOG_EVERY: Duration = Duration::from_secs(5);

/// Most events recorded between two publishes while a stream keeps having
/// more ready, so a long burst still reaches the agent in steps.
const BATCH: usize = 1024;

/// Slices converted between two prunes of the node-name interner outside
/// relists (the name of a node that left stays there until then).
const PRUNE_EVERY: u32 = 4096;

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

/// How long watches last and when one counts as silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchTiming {
    /// `timeoutSeconds` of each watch request (`--watch-timeout`): the
    /// server ends the watch then and the watcher resumes it.
    pub watch_timeout: Duration,
}

impl Default for WatchTiming {
    /// kube-runtime's (and client-go's lower bound): 290 s.
    fn default() -> Self {
        Self {
            watch_timeout: Duration::from_secs(290),
        }
    }
}

impl WatchTiming {
    /// No byte for this long (no event, no bookmark, not the end of the
    /// watch) and the watch is silent: the watch timeout and a quarter of
    /// it (at least a second) on top.
    pub fn idle(&self) -> Duration {
        self.watch_timeout + (self.watch_timeout / 4).max(Duration::from_secs(1))
    }
}

/// A client from `--kubeconfig` if given, else the usual inference
/// (in-cluster service account, then `KUBECONFIG` / `~/.kube/config`).
pub async fn client(kubeconfig: Option<&PathBuf>) -> Result<Client, ClusterError> {
    client_with(kubeconfig, None).await
}

/// [`client`], with reads that fail after `read_timeout` without a byte
/// (the agent's watches: [`WatchTiming::idle`]); `None` keeps kube's
/// default.
pub async fn client_with(
    kubeconfig: Option<&PathBuf>,
    read_timeout: Option<Duration>,
) -> Result<Client, ClusterError> {
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
    let mut config = config;
    if read_timeout.is_some() {
        config.read_timeout = read_timeout;
    }
    Client::try_from(config).map_err(ClusterError::Client)
}

/// Starts the three watches (tokio tasks: call it inside the runtime). They
/// record into `feed` and publish once every watch has listed, then after
/// each batch of changes; they stop when the feed's receiving end is gone.
pub fn watch_cluster(
    client: Client,
    node_name: String,
    proxy_name: Option<String>,
    timing: WatchTiming,
    feed: FeedTx,
) {
    let labels = label_selector(proxy_name.as_deref());
    debug!(%labels, "Service and EndpointSlice label selector");
    let first = Arc::new(FirstList::default());
    let bad = Arc::new(BadObjects::default());
    let timeout = u32::try_from(timing.watch_timeout.as_secs())
        .unwrap_or(u32::MAX)
        .max(1);
    let base = watcher::Config::default().timeout(timeout);
    spawn(
        Services::default(),
        Api::all(client.clone()),
        base.clone().labels(&labels),
        timing,
        &feed,
        (&first, &bad),
    );
    spawn(
        Slices::default(),
        Api::all(client.clone()),
        base.clone().labels(&labels),
        timing,
        &feed,
        (&first, &bad),
    );
    let by_name = format!("metadata.name={node_name}");
    spawn(
        Nodes::new(node_name),
        Api::all(client),
        base.fields(&by_name),
        timing,
        &feed,
        (&first, &bad),
    );
    tokio::spawn(log_waiting(first, feed));
}

/// The label selector Services and EndpointSlices are watched with (see the
/// module doc for why a proxy name of our own loosens it).
fn label_selector(proxy_name: Option<&str>) -> String {
    match proxy_name {
        None => format!("!{LABEL_SERVICE_PROXY_NAME},!{LABEL_HEADLESS}"),
        Some(_) => format!("!{LABEL_HEADLESS}"),
    }
}

fn spawn<R: Recorder>(
    recorder: R,
    api: Api<R::Object>,
    config: watcher::Config,
    timing: WatchTiming,
    feed: &FeedTx,
    (first, bad): (&Arc<FirstList>, &Arc<BadObjects>),
) {
    let mut watch = Watch::new(recorder, feed.clone(), Arc::clone(first), timing);
    watch.bad = Arc::clone(bad);
    let stream = watcher::watcher(api, config).default_backoff();
    tokio::spawn(async move { watch.run(stream).await });
}

/// Says which watches are still on their first list until none is.
async fn log_waiting(first: Arc<FirstList>, feed: FeedTx) {
    loop {
        tokio::time::sleep(WAITING_LOG_EVERY).await;
        let listing = first.still_listing();
        if listing.is_empty() || feed.is_closed() {
            return;
        }
        info!(
            listing = %listing.join(", "),
            "waiting for the initial list; nothing is programmed or removed until it completes"
        );
    }
}

/// The kinds watched, in the order [`FirstList`] counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Service = 0,
    EndpointSlice = 1,
    Node = 2,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Service, Kind::EndpointSlice, Kind::Node];

    fn plural(self) -> &'static str {
        match self {
            Kind::Service => "services",
            Kind::EndpointSlice => "endpointslices",
            Kind::Node => "node",
        }
    }

    /// As the model names objects (`Service demo/echo`).
    fn name(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
        }
    }
}

/// The objects the API server sent that the model cannot read, with what
/// is wrong with each: the source's problems (`switchboard services` and
/// `status` list them), shared by the watches, since the feed takes the
/// complete set. An object leaves the set when a version of it that reads
/// arrives, or when it is deleted.
#[derive(Debug, Default)]
struct BadObjects {
    objects: Mutex<BTreeMap<(Kind, ObjectKey), BadObject>>,
}

#[derive(Debug)]
struct BadObject {
    problem: String,
    /// The model keeps the last version that read (this object was read
    /// before it went bad).
    keeps_last_good: bool,
}

/// What becomes of an object that cannot be read.
fn consequence(keeps_last_good: bool) -> &'static str {
    if keeps_last_good {
        "keeping the last version that could be read"
    } else {
        "not used until a version that can be read arrives"
    }
}

impl BadObjects {
    fn objects(&self) -> std::sync::MutexGuard<'_, BTreeMap<(Kind, ObjectKey), BadObject>> {
        // Every update is one map insert or remove: a poisoned lock is still consistent.
        self.objects.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes a bad version of an object; `known_before`: the watch had a
    /// version of it. Records the problems now in force into `feed`;
    /// returns whether the model keeps a last good version.
    fn bad(
        &self,
        feed: &FeedTx,
        kind: Kind,
        key: ObjectKey,
        problem: String,
        known_before: bool,
    ) -> bool {
        let mut objects = self.objects();
        let keeps_last_good = match objects.get(&(kind, key.clone())) {
            Some(earlier) => earlier.keeps_last_good,
            None => known_before,
        };
        objects.insert(
            (kind, key),
            BadObject {
                problem,
                keeps_last_good,
            },
        );
        feed.problems(Self::warnings(&objects));
        keeps_last_good
    }

    /// The object reads again, or is gone: true (and the problems now in
    /// force recorded into `feed`) when it was bad.
    fn forget(&self, feed: &FeedTx, kind: Kind, key: &ObjectKey) -> bool {
        let mut objects = self.objects();
        if objects.is_empty() || objects.remove(&(kind, key.clone())).is_none() {
            return false;
        }
        feed.problems(Self::warnings(&objects));
        true
    }

    fn warnings(objects: &BTreeMap<(Kind, ObjectKey), BadObject>) -> Vec<ModelWarning> {
        objects
            .iter()
            .map(|((kind, key), bad)| ModelWarning {
                object: format!("{} {key}", kind.name()),
                problem: format!("{}; {}", bad.problem, consequence(bad.keeps_last_good)),
            })
            .collect()
    }
}

/// Which watches have completed their first list, and with how many objects:
/// the gate before the first publish, shared by the three watch tasks.
#[derive(Debug, Default)]
struct FirstList {
    counts: Mutex<[Option<usize>; 3]>,
}

impl FirstList {
    fn counts(&self) -> std::sync::MutexGuard<'_, [Option<usize>; 3]> {
        // Every update is one array store: a poisoned lock is still consistent.
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that `kind` completed a list of `count` objects. Returns every
    /// kind's count when this is the list that completes the set: its caller
    /// publishes the first view. Later lists change nothing.
    fn listed(&self, kind: Kind, count: usize) -> Option<[usize; 3]> {
        let mut counts = self.counts();
        if counts[kind as usize].is_some() {
            return None;
        }
        counts[kind as usize] = Some(count);
        let [Some(s), Some(e), Some(n)] = *counts else {
            return None;
        };
        Some([s, e, n])
    }

    fn complete(&self) -> bool {
        self.counts().iter().all(Option::is_some)
    }

    fn still_listing(&self) -> Vec<&'static str> {
        let counts = self.counts();
        Kind::ALL
            .into_iter()
            .filter(|k| counts[*k as usize].is_none())
            .map(Kind::plural)
            .collect()
    }
}

/// The objects a watch has recorded, by key, with the resourceVersion each
/// was recorded at: enough to skip what a relist re-sends unchanged and to
/// find what it no longer lists, without holding the objects.
#[derive(Debug, Default)]
struct Known {
    objects: HashMap<ObjectKey, Seen>,
    /// The keys' namespaces, one copy each (pruned after each list).
    namespaces: Interner,
    /// Bumped when a list starts; what the list names is stamped with it.
    epoch: u32,
}

#[derive(Debug)]
struct Seen {
    resource_version: Version,
    epoch: u32,
}

/// A resourceVersion as recorded: the usual decimal number inline (no
/// block of its own for each of 200k objects), anything else as written.
#[derive(Debug, PartialEq, Eq)]
enum Version {
    Number(u64),
    Text(Box<Box<str>>),
}

impl Version {
    fn of(text: &str) -> Version {
        match Version::number(text) {
            Some(n) => Version::Number(n),
            None => Version::Text(Box::new(text.into())),
        }
    }

    /// The number `text` writes, when it writes one as it prints (digits
    /// only, no leading zero), so that a number and its text are one version.
    fn number(text: &str) -> Option<u64> {
        let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        let leading_zero = text.len() > 1 && text.starts_with('0');
        (digits && !leading_zero)
            .then(|| text.parse().ok())
            .flatten()
    }

    /// Whether this is the version written `text`.
    fn is(&self, text: &str) -> bool {
        match self {
            Version::Number(n) => Version::number(text) == Some(*n),
            Version::Text(t) => ***t == *text,
        }
    }
}

impl Known {
    /// A list starts (the first, or a relist; a failed attempt is followed by
    /// a new start, so only the attempt that completes counts).
    fn list_started(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// Notes an object the watch sent. `Some` when it is new or its
    /// resourceVersion changed, so it must be recorded; an object without a
    /// resourceVersion always is. The key returned is the one held here
    /// (for a known object, the first one seen), so the source, the feed
    /// and the model share one copy of its strings.
    fn applied(&mut self, key: ObjectKey, resource_version: Option<&str>) -> Option<ObjectKey> {
        let resource_version = resource_version.unwrap_or_default();
        match self.objects.entry(key) {
            Entry::Occupied(mut entry) => {
                let seen = entry.get_mut();
                seen.epoch = self.epoch;
                if !resource_version.is_empty() && seen.resource_version.is(resource_version) {
                    return None;
                }
                seen.resource_version = Version::of(resource_version);
                Some(entry.key().clone())
            }
            Entry::Vacant(entry) => {
                // A new key: its namespace is shared with the other keys'.
                let namespace = self.namespaces.intern(&entry.key().namespace);
                let mut key = entry.into_key();
                key.namespace = namespace;
                self.objects.insert(
                    key.clone(),
                    Seen {
                        resource_version: Version::of(resource_version),
                        epoch: self.epoch,
                    },
                );
                Some(key)
            }
        }
    }

    fn deleted(&mut self, key: &ObjectKey) {
        self.objects.remove(key);
    }

    fn contains(&self, key: &ObjectKey) -> bool {
        self.objects.contains_key(key)
    }

    /// A list completed: the keys it did not name, now forgotten, for the
    /// caller to record as deleted.
    fn list_done(&mut self) -> Vec<ObjectKey> {
        let mut vanished = Vec::new();
        self.objects.retain(|key, seen| {
            let listed = seen.epoch == self.epoch;
            if !listed {
                vanished.push(key.clone());
            }
            listed
        });
        self.namespaces.prune();
        vanished
    }

    fn len(&self) -> usize {
        self.objects.len()
    }
}

/// How one kind's objects go into the feed.
trait Recorder: Send + 'static {
    type Object: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static;
    const KIND: Kind;

    /// What keeps the model from reading `obj`, if anything.
    fn undecodable(_obj: &Self::Object) -> Option<&Undecodable> {
        None
    }

    /// Converts and records a new or changed object under `key` (the one
    /// [`Known`] holds, so both share its strings). False when nothing was
    /// recorded (not an object this watch reports, or no change the model
    /// reads).
    fn apply(&mut self, feed: &FeedTx, key: ObjectKey, obj: Self::Object) -> bool;

    /// Records a deletion; false when nothing was recorded.
    fn delete(&mut self, feed: &FeedTx, key: ObjectKey) -> bool;

    /// A list completed (a moment to drop what vanished objects left behind).
    fn listed(&mut self) {}
}

/// An interner of the strings one watch's objects share, pruned after
/// every [`PRUNE_EVERY`] objects and each list (a string nothing holds any
/// more stays until then).
#[derive(Default)]
struct Sharing {
    interner: Interner,
    since_prune: u32,
}

impl Sharing {
    /// The interner, for one more object.
    fn interner(&mut self) -> &mut Interner {
        self.since_prune += 1;
        if self.since_prune >= PRUNE_EVERY {
            self.prune();
        }
        &mut self.interner
    }

    fn prune(&mut self) {
        self.interner.prune();
        self.since_prune = 0;
    }
}

/// Services, with port names shared.
#[derive(Default)]
struct Services(Sharing);

impl Recorder for Services {
    type Object = ServiceObject;
    const KIND: Kind = Kind::Service;

    fn undecodable(svc: &ServiceObject) -> Option<&Undecodable> {
        svc.info.as_ref().err()
    }

    fn apply(&mut self, feed: &FeedTx, key: ObjectKey, svc: ServiceObject) -> bool {
        let Ok(info) = svc.info else {
            return false;
        };
        let mut info = ServiceInfo { key, ..info };
        info.share(self.0.interner());
        feed.service(info.key.clone(), Some(Arc::new(info)));
        true
    }

    fn delete(&mut self, feed: &FeedTx, key: ObjectKey) -> bool {
        feed.service(key, None);
        true
    }

    fn listed(&mut self) {
        self.0.prune();
    }
}

/// EndpointSlices, with node names, port names and the like shared.
#[derive(Default)]
struct Slices(Sharing);

impl Recorder for Slices {
    type Object = SliceObject;
    const KIND: Kind = Kind::EndpointSlice;

    fn undecodable(slice: &SliceObject) -> Option<&Undecodable> {
        slice.info.as_ref().err()
    }

    fn apply(&mut self, feed: &FeedTx, key: ObjectKey, slice: SliceObject) -> bool {
        let Ok(info) = slice.info else {
            return false;
        };
        let mut info = SliceInfo { key, ..info };
        info.share(self.0.interner());
        feed.slice(info.key.clone(), Some(Arc::new(info)));
        true
    }

    fn delete(&mut self, feed: &FeedTx, key: ObjectKey) -> bool {
        feed.slice(key, None);
        true
    }

    fn listed(&mut self) {
        self.0.prune();
    }
}

/// This node's Node, recorded only when what the model reads of it changes
/// (kubelet's status updates would otherwise wake the agent for nothing).
struct Nodes {
    name: String,
    last: Option<NodeInfo>,
}

impl Nodes {
    fn new(name: String) -> Nodes {
        Nodes { name, last: None }
    }
}

impl Recorder for Nodes {
    type Object = Node;
    const KIND: Kind = Kind::Node;

    fn apply(&mut self, feed: &FeedTx, _key: ObjectKey, node: Node) -> bool {
        if node.metadata.name.as_deref() != Some(self.name.as_str()) {
            return false;
        }
        let info = NodeInfo::from_node(&node);
        if self.last.as_ref() == Some(&info) {
            return false;
        }
        self.last = Some(info.clone());
        feed.node(Some(info));
        true
    }

    fn delete(&mut self, feed: &FeedTx, key: ObjectKey) -> bool {
        if *key.name != *self.name || self.last.is_none() {
            return false;
        }
        warn!(node = %self.name, "this node's Node object is gone: no NodePort frontends, Local policies cannot be applied");
        self.last = None;
        feed.node(None);
        true
    }
}

/// One watch: its recorder and what it knows between events.
struct Watch<R> {
    recorder: R,
    known: Known,
    feed: FeedTx,
    first: Arc<FirstList>,
    /// Shared with the other watches (a watch of its own: its own set).
    bad: Arc<BadObjects>,
    /// Failed attempts since the last event (0: healthy).
    failures: u32,
    timing: WatchTiming,
}

impl<R: Recorder> Watch<R> {
    fn new(recorder: R, feed: FeedTx, first: Arc<FirstList>, timing: WatchTiming) -> Watch<R> {
        Watch {
            recorder,
            known: Known::default(),
            feed,
            first,
            bad: Arc::default(),
            failures: 0,
            timing,
        }
    }

    /// Records the stream's events, publishing after each batch once every
    /// watch has listed. Returns when the stream ends or the feed is closed.
    async fn run(&mut self, stream: impl Stream<Item = Result<Event<R::Object>, watcher::Error>>) {
        let mut stream = std::pin::pin!(stream.fuse());
        while let Some(event) = stream.next().await {
            let mut recorded = self.handle(event);
            // What the stream already holds joins the same publish.
            for _ in 1..BATCH {
                match stream.next().now_or_never() {
                    Some(Some(event)) => recorded |= self.handle(event),
                    Some(None) | None => break,
                }
            }
            if recorded && self.first.complete() {
                self.feed.publish();
            }
            if self.feed.is_closed() {
                debug!(kind = ?R::KIND, "the agent stopped listening; watch ends");
                return;
            }
        }
    }

    /// Records one event. True when something was recorded, or when this
    /// event completed the first view (which must be published even if
    /// empty).
    fn handle(&mut self, event: Result<Event<R::Object>, watcher::Error>) -> bool {
        let kind = R::KIND;
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                self.failed(&error);
                return false;
            }
        };
        // `Init` comes before the list request: it says nothing of the server.
        if self.failures > 0 && !matches!(event, Event::Init) {
            info!(
                watch = kind.plural(),
                failed_attempts = self.failures,
                "{} watch recovered",
                kind.plural()
            );
            self.failures = 0;
        }
        match event {
            Event::Init => {
                debug!(?kind, "listing");
                self.known.list_started();
                false
            }
            Event::Apply(obj) | Event::InitApply(obj) => {
                let meta = obj.meta();
                let key = ObjectKey::of(meta);
                if let Some(bad) = R::undecodable(&obj) {
                    return self.undecodable(key, meta.resource_version.as_deref(), bad);
                }
                let fixed = self.bad.forget(&self.feed, kind, &key);
                match self.known.applied(key, meta.resource_version.as_deref()) {
                    Some(key) => self.recorder.apply(&self.feed, key, obj) | fixed,
                    None => fixed,
                }
            }
            Event::Delete(obj) => self.deleted(ObjectKey::of(obj.meta())),
            Event::InitDone => self.list_done(),
        }
    }

    /// An object the model cannot read: reported by name (log and the
    /// source's problems), not recorded, so the model keeps the last version
    /// of it that read, if any; the rest of its list page or watch goes on.
    /// Noted in [`Known`] all the same: a relist that sends it unchanged
    /// neither reports it again nor counts it as vanished.
    fn undecodable(
        &mut self,
        key: ObjectKey,
        resource_version: Option<&str>,
        bad: &Undecodable,
    ) -> bool {
        let kind = R::KIND;
        if key.name.is_empty() {
            error!(
                kind = kind.name(),
                namespace = %key.namespace,
                problem = %bad,
                "the API server sent {} {} without a readable name; skipped",
                kind.name(),
                key,
            );
            return false;
        }
        let known_before = self.known.contains(&key);
        let Some(key) = self.known.applied(key, resource_version) else {
            return false;
        };
        let kept = self.bad.bad(
            &self.feed,
            kind,
            key.clone(),
            bad.problem.clone(),
            known_before,
        );
        error!(
            kind = kind.name(),
            object = %key,
            problem = %bad,
            "{} {key} cannot be read: {bad}; {}",
            kind.name(),
            consequence(kept)
        );
        true
    }

    /// Records a deletion (or an object a relist no longer names).
    fn deleted(&mut self, key: ObjectKey) -> bool {
        self.known.deleted(&key);
        let was_bad = self.bad.forget(&self.feed, R::KIND, &key);
        self.recorder.delete(&self.feed, key) | was_bad
    }

    /// Logs a failed attempt with what the watch now waits for; the
    /// watcher retries after its backoff.
    fn failed(&mut self, error: &watcher::Error) {
        self.failures += 1;
        let plural = R::KIND.plural();
        match describe(error) {
            Failure::Silent => warn!(
                watch = plural,
                attempt = self.failures,
                idle_s = self.timing.idle().as_secs_f64(),
                "{plural} watch silent: no event or bookmark for {:?}; restarting it from the last resourceVersion (what is programmed stays)",
                self.timing.idle()
            ),
            Failure::Other(what) => warn!(
                watch = plural,
                attempt = self.failures,
                "{plural} watch failing: {what}; retrying with backoff (what is programmed stays)"
            ),
        }
    }

    fn list_done(&mut self) -> bool {
        let mut recorded = false;
        for key in self.known.list_done() {
            recorded |= self.bad.forget(&self.feed, R::KIND, &key);
            recorded |= self.recorder.delete(&self.feed, key);
        }
        self.recorder.listed();
        debug!(kind = ?R::KIND, objects = self.known.len(), "list complete");
        let Some([services, endpoint_slices, nodes]) = self.first.listed(R::KIND, self.known.len())
        else {
            return recorded;
        };
        if nodes == 0 {
            warn!("this node's Node object was not found: no NodePort frontends, Local policies cannot be applied");
        }
        info!(services, endpoint_slices, "initial list complete");
        true
    }
}

/// What went wrong with a watch, for the log.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// The read timed out: nothing arrived for [`WatchTiming::idle`].
    Silent,
    Other(String),
}

fn describe(error: &watcher::Error) -> Failure {
    // kube-runtime reports a watch the server answered with an error status
    // as `WatchFailed`, like a stream that broke later.
    let (stage, client) = match error {
        watcher::Error::InitialListFailed(e) => ("list", e),
        watcher::Error::WatchStartFailed(e) => ("watch request", e),
        watcher::Error::WatchFailed(e) => ("watch", e),
        watcher::Error::WatchError(status) => {
            return Failure::Other(format!(
                "the API server ended the watch: {}",
                api_status(status)
            ));
        }
        watcher::Error::NoResourceVersion => {
            return Failure::Other("the list carried no resourceVersion".into());
        }
    };
    if let kube::Error::Api(status) = client {
        return Failure::Other(format!("{stage} answered {}", api_status(status)));
    }
    if timed_out(client) {
        if stage == "watch" {
            return Failure::Silent;
        }
        return Failure::Other(format!(
            "{stage} timed out (no answer within the read timeout)"
        ));
    }
    Failure::Other(format!("{stage}: {}", error_chain(client)))
}

/// `HTTP 429 TooManyRequests: message` (the status the server answered).
fn api_status(status: &kube::core::ErrorResponse) -> String {
    let mut text = format!("HTTP {} {}", status.code, status.reason);
    if !status.message.is_empty() {
        text.push_str(": ");
        text.push_str(&status.message);
    }
    text
}

/// The error and its sources, `: `-joined.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = e.source();
    }
    text
}

/// Whether a read timed out somewhere down the error's sources.
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        {
            return true;
        }
        current = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use futures::stream;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::source::feed::{feed, FeedRx};

    fn meta(name: &str, rv: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            resource_version: (!rv.is_empty()).then(|| rv.into()),
            ..ObjectMeta::default()
        }
    }

    fn svc(name: &str, rv: &str) -> ServiceObject {
        ServiceObject {
            meta: meta(name, rv),
            info: Ok(ServiceInfo {
                key: key(name),
                ..ServiceInfo::default()
            }),
        }
    }

    fn node(name: &str, rv: &str, zone: &str) -> Node {
        let mut metadata = meta(name, rv);
        metadata.namespace = None;
        metadata.labels = Some([("topology.kubernetes.io/zone".into(), zone.into())].into());
        Node {
            metadata,
            ..Node::default()
        }
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("default", name)
    }

    type Events<K> = Vec<Result<Event<K>, watcher::Error>>;

    fn list<K>(objects: Vec<K>) -> Events<K> {
        let mut events = vec![Ok(Event::Init)];
        events.extend(objects.into_iter().map(|o| Ok(Event::InitApply(o))));
        events.push(Ok(Event::InitDone));
        events
    }

    async fn run<R: Recorder>(watch: &mut Watch<R>, events: Events<R::Object>) {
        watch.run(stream::iter(events)).await;
    }

    fn publishes(rx: &FeedRx) -> u64 {
        *rx.publishes().borrow()
    }

    #[test]
    fn a_relist_yields_the_keys_it_no_longer_names() {
        let mut known = Known::default();
        known.list_started();
        assert!(known.applied(key("a"), Some("1")).is_some());
        assert!(known.applied(key("b"), Some("1")).is_some());
        assert!(known.applied(key("c"), Some("1")).is_some());
        assert!(known.list_done().is_empty());
        known.deleted(&key("c"));

        known.list_started();
        assert!(
            known.applied(key("a"), Some("1")).is_none(),
            "unchanged: skipped"
        );
        assert!(known.applied(key("d"), Some("5")).is_some());
        assert_eq!(known.list_done(), vec![key("b")], "c was deleted already");
        assert_eq!(known.len(), 2);
    }

    #[test]
    fn resource_versions_are_compared_as_written() {
        for text in [
            "1",
            "0",
            "18446744073709551615",
            "01",
            "+1",
            "abc",
            "",
            "18446744073709551616",
        ] {
            let v = Version::of(text);
            assert!(v.is(text), "{text:?} is itself");
            for other in ["1", "0", "01", "+1", "abc", "", "2"] {
                assert_eq!(v.is(other), other == text, "{text:?} against {other:?}");
            }
        }
        assert_eq!(Version::of("42"), Version::Number(42));
        assert!(matches!(Version::of("042"), Version::Text(_)));
    }

    #[test]
    fn a_changed_or_missing_resource_version_is_recorded() {
        let mut known = Known::default();
        known.list_started();
        assert!(known.applied(key("a"), Some("1")).is_some());
        assert!(known.applied(key("a"), Some("2")).is_some());
        assert!(known.applied(key("a"), Some("2")).is_none());
        assert!(known.applied(key("n"), None).is_some());
        assert!(known.applied(key("n"), None).is_some());
    }

    #[test]
    fn a_changed_object_is_recorded_under_the_key_already_held() {
        let mut known = Known::default();
        known.list_started();
        let first = known.applied(key("a"), Some("1")).expect("new");
        let again = known.applied(key("a"), Some("2")).expect("changed");
        assert_eq!(again, key("a"));
        assert!(
            Arc::ptr_eq(&first.name, &again.name),
            "one copy of the name"
        );
        assert!(Arc::ptr_eq(&first.namespace, &again.namespace));
    }

    #[test]
    fn only_the_list_attempt_that_completes_counts() {
        let mut known = Known::default();
        known.list_started();
        assert!(known.applied(key("a"), Some("1")).is_some());
        // The list failed after a page; the watcher starts again.
        known.list_started();
        assert!(known.applied(key("b"), Some("2")).is_some());
        assert_eq!(known.list_done(), vec![key("a")]);
    }

    #[test]
    fn the_first_view_completes_once_with_every_count() {
        let first = FirstList::default();
        assert_eq!(
            first.still_listing(),
            ["services", "endpointslices", "node"]
        );
        assert_eq!(first.listed(Kind::Node, 1), None);
        assert_eq!(first.listed(Kind::Service, 7), None);
        assert_eq!(first.still_listing(), ["endpointslices"]);
        assert!(!first.complete());
        assert_eq!(first.listed(Kind::EndpointSlice, 3), Some([7, 3, 1]));
        assert!(first.complete());
        assert_eq!(
            first.listed(Kind::Service, 9),
            None,
            "a relist changes nothing"
        );
        assert!(first.still_listing().is_empty());
    }

    #[test]
    fn selectors_are_kube_proxys_or_leave_the_proxy_name_to_the_model() {
        assert_eq!(
            label_selector(None),
            "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"
        );
        assert_eq!(
            label_selector(Some("sb")),
            "!service.kubernetes.io/headless"
        );
    }

    #[tokio::test]
    async fn nothing_is_published_before_every_first_list_then_the_whole_view_is() {
        let (tx, mut rx) = feed();
        let first = Arc::new(FirstList::default());
        let mut services = Watch::new(
            Services::default(),
            tx.clone(),
            Arc::clone(&first),
            WatchTiming::default(),
        );
        let mut slices = Watch::new(
            Slices::default(),
            tx.clone(),
            Arc::clone(&first),
            WatchTiming::default(),
        );
        let mut nodes = Watch::new(
            Nodes::new("n1".into()),
            tx,
            Arc::clone(&first),
            WatchTiming::default(),
        );

        run(&mut services, list(vec![svc("a", "1"), svc("b", "1")])).await;
        // An update after the services listed, while the others still list.
        run(&mut services, vec![Ok(Event::Apply(svc("c", "2")))]).await;
        run(&mut slices, list(vec![])).await;
        assert_eq!(publishes(&rx), 0);

        run(&mut nodes, list(vec![node("n1", "1", "z1")])).await;
        assert_eq!(publishes(&rx), 1);
        let changes = rx.take();
        assert_eq!(
            changes.services.keys().cloned().collect::<Vec<_>>(),
            [key("a"), key("b"), key("c")]
        );
        assert!(changes.slices.is_empty());
        let node = changes.node.flatten().expect("the node");
        assert_eq!(
            (node.name.as_str(), node.zone.as_deref()),
            ("n1", Some("z1"))
        );
    }

    #[tokio::test]
    async fn an_empty_cluster_still_publishes_its_first_view() {
        let (tx, rx) = feed();
        let first = Arc::new(FirstList::default());
        run(
            &mut Watch::new(
                Services::default(),
                tx.clone(),
                Arc::clone(&first),
                WatchTiming::default(),
            ),
            list(vec![]),
        )
        .await;
        run(
            &mut Watch::new(
                Slices::default(),
                tx.clone(),
                Arc::clone(&first),
                WatchTiming::default(),
            ),
            list(vec![]),
        )
        .await;
        run(
            &mut Watch::new(Nodes::new("n1".into()), tx, first, WatchTiming::default()),
            list(vec![]),
        )
        .await;
        assert_eq!(publishes(&rx), 1);
    }

    /// A watch whose first list is done, as are the other two.
    fn listed_watch<R: Recorder>(recorder: R, tx: FeedTx) -> Watch<R> {
        let first = Arc::new(FirstList::default());
        for kind in Kind::ALL.into_iter().filter(|k| *k != R::KIND) {
            first.listed(kind, 0);
        }
        Watch::new(recorder, tx, first, WatchTiming::default())
    }

    #[tokio::test]
    async fn a_relist_records_changes_and_deletions_only() {
        let (tx, mut rx) = feed();
        let mut services = listed_watch(Services::default(), tx);
        run(
            &mut services,
            list(vec![svc("a", "1"), svc("b", "1"), svc("gone", "1")]),
        )
        .await;
        assert_eq!(rx.take().services.len(), 3);

        run(
            &mut services,
            vec![
                Err(watcher::Error::NoResourceVersion),
                Ok(Event::Delete(svc("gone", "2"))),
                Ok(Event::Init),
                Ok(Event::InitApply(svc("a", "1"))),
                Ok(Event::InitApply(svc("c", "3"))),
                Ok(Event::InitDone),
            ],
        )
        .await;
        let changes = rx.take();
        assert_eq!(
            changes
                .services
                .into_iter()
                .map(|(k, v)| (k, v.is_some()))
                .collect::<Vec<_>>(),
            [(key("b"), false), (key("c"), true), (key("gone"), false)],
            "a was re-sent unchanged"
        );
    }

    #[tokio::test]
    async fn the_node_is_recorded_when_what_the_model_reads_changes() {
        let (tx, mut rx) = feed();
        let mut nodes = listed_watch(Nodes::new("n1".into()), tx);
        run(&mut nodes, list(vec![node("n1", "1", "z1")])).await;
        assert!(rx.take().node.is_some());

        // A status heartbeat: new resourceVersion, same NodeInfo.
        let before = publishes(&rx);
        run(&mut nodes, vec![Ok(Event::Apply(node("n1", "2", "z1")))]).await;
        assert_eq!(publishes(&rx), before);
        assert!(rx.take().is_empty());

        run(&mut nodes, vec![Ok(Event::Apply(node("n1", "3", "z2")))]).await;
        assert_eq!(
            rx.take().node.flatten().and_then(|n| n.zone).as_deref(),
            Some("z2")
        );

        // Gone from a relist: recorded as unknown.
        run(&mut nodes, list(vec![])).await;
        assert_eq!(rx.take().node, Some(None));
    }

    fn bad_svc(name: &str, rv: &str) -> ServiceObject {
        ServiceObject {
            info: Err(Undecodable {
                problem: "spec.ports: invalid type: map, expected a sequence".into(),
            }),
            ..svc(name, rv)
        }
    }

    fn problems(changes: &crate::source::feed::Changes) -> Vec<String> {
        changes
            .problems
            .as_ref()
            .expect("problems recorded")
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[tokio::test]
    async fn an_object_that_cannot_be_read_is_reported_by_name_and_the_rest_is_used() {
        let (tx, mut rx) = feed();
        let mut services = listed_watch(Services::default(), tx);
        run(
            &mut services,
            list(vec![svc("a", "1"), bad_svc("bad", "1"), svc("b", "1")]),
        )
        .await;
        assert_eq!(publishes(&rx), 1);
        let changes = rx.take();
        assert_eq!(
            changes.services.keys().cloned().collect::<Vec<_>>(),
            [key("a"), key("b")]
        );
        assert_eq!(
            problems(&changes),
            ["Service default/bad: spec.ports: invalid type: map, expected a sequence; not used until a version that can be read arrives"]
        );

        // A relist sending it unchanged: neither reported again nor vanished.
        run(
            &mut services,
            list(vec![svc("a", "1"), bad_svc("bad", "1"), svc("b", "1")]),
        )
        .await;
        assert!(rx.take().is_empty());

        // A known object going bad: its last good version stays in use.
        run(&mut services, vec![Ok(Event::Apply(bad_svc("a", "2")))]).await;
        let changes = rx.take();
        assert!(changes.services.is_empty(), "nothing recorded for a");
        assert_eq!(
            problems(&changes),
            [
                "Service default/a: spec.ports: invalid type: map, expected a sequence; keeping the last version that could be read",
                "Service default/bad: spec.ports: invalid type: map, expected a sequence; not used until a version that can be read arrives",
            ]
        );

        // Fixed, and deleted: each leaves the problems.
        run(&mut services, vec![Ok(Event::Apply(svc("bad", "3")))]).await;
        let changes = rx.take();
        assert_eq!(
            changes.services.keys().cloned().collect::<Vec<_>>(),
            [key("bad")]
        );
        assert_eq!(problems(&changes).len(), 1);
        run(&mut services, vec![Ok(Event::Delete(bad_svc("a", "4")))]).await;
        let changes = rx.take();
        assert_eq!(changes.services.get(&key("a")), Some(&None));
        assert!(problems(&changes).is_empty());

        // Without a readable name: skipped, nothing else disturbed.
        let nameless = ServiceObject {
            meta: ObjectMeta::default(),
            ..bad_svc("", "")
        };
        let before = publishes(&rx);
        run(&mut services, vec![Ok(Event::Apply(nameless))]).await;
        assert_eq!(publishes(&rx), before);
    }

    fn status(code: u16, reason: &str, message: &str) -> kube::core::ErrorResponse {
        kube::core::ErrorResponse {
            status: "Failure".into(),
            message: message.into(),
            reason: reason.into(),
            code,
        }
    }

    #[test]
    fn failures_are_described_by_what_the_server_answered() {
        let list = watcher::Error::InitialListFailed(kube::Error::Api(status(
            500,
            "InternalError",
            "etcd is down",
        )));
        assert_eq!(
            describe(&list),
            Failure::Other("list answered HTTP 500 InternalError: etcd is down".into())
        );
        let throttled = watcher::Error::WatchFailed(kube::Error::Api(status(
            429,
            "TooManyRequests",
            "slow down",
        )));
        assert_eq!(
            describe(&throttled),
            Failure::Other("watch answered HTTP 429 TooManyRequests: slow down".into())
        );
        let gone = watcher::Error::WatchError(status(410, "Expired", "too old resource version"));
        assert_eq!(
            describe(&gone),
            Failure::Other(
                "the API server ended the watch: HTTP 410 Expired: too old resource version".into()
            )
        );
    }

    #[test]
    fn a_read_that_timed_out_inside_a_watch_is_a_silent_watch() {
        // As kube-client wraps a body read error: io::Error::other around
        // the transport's error, whose source is the timed-out read.
        #[derive(Debug, thiserror::Error)]
        #[error("error reading a body from connection")]
        struct Transport(#[source] std::io::Error);
        let read = std::io::Error::other(Transport(std::io::Error::from(
            std::io::ErrorKind::TimedOut,
        )));
        let silent = watcher::Error::WatchFailed(kube::Error::ReadEvents(read));
        assert_eq!(describe(&silent), Failure::Silent);
        let reset = std::io::Error::other(Transport(std::io::Error::from(
            std::io::ErrorKind::ConnectionReset,
        )));
        let Failure::Other(text) =
            describe(&watcher::Error::WatchFailed(kube::Error::ReadEvents(reset)))
        else {
            panic!("a reset connection is no silent watch");
        };
        assert!(text.starts_with("watch: "), "{text}");
        assert!(
            text.contains("error reading a body from connection"),
            "{text}"
        );
    }

    #[test]
    fn a_watch_is_silent_only_after_its_own_timeout_has_passed() {
        let default = WatchTiming::default();
        assert_eq!(default.idle(), Duration::from_millis(362_500));
        let short = WatchTiming {
            watch_timeout: Duration::from_secs(2),
        };
        assert_eq!(short.idle(), Duration::from_secs(3));
    }
}
