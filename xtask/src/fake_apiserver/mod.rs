//! A protocol-faithful fake Kubernetes API server for tests.
//!
//! Kubernetes cannot run on the test machines, so the agent's `--source
//! cluster` code (kube-rs watchers and reflectors, unmodified) is tested
//! against this server. It speaks plain HTTP/1.1 JSON like kube-apiserver for
//! core/v1 `services`, `nodes` and `pods` and discovery.k8s.io/v1 `endpointslices`:
//!
//! - **list** with `labelSelector`, `fieldSelector`, `limit`/`continue`
//!   (consistent snapshots: later pages are served as of the first page's
//!   resourceVersion), `resourceVersion` + `resourceVersionMatch`
//!   (`NotOlderThan`, `Exact`); list items omit `kind`/`apiVersion` as the real
//!   server's do.
//! - **watch** (`watch=true`): every event after `resourceVersion`, then live
//!   ones, as JSON lines `{"type":..,"object":..}`; `ADDED` for all objects
//!   when `resourceVersion` is empty or `0`; `BOOKMARK`s (when
//!   `allowWatchBookmarks=true`) every [`Config::bookmark_interval`];
//!   `sendInitialEvents=true` (streaming lists, with the
//!   `k8s.io/initial-events-end` bookmark); selector transitions turn
//!   `MODIFIED` into `ADDED`/`DELETED` as the watch cache does; the stream ends
//!   after `timeoutSeconds`. A resourceVersion older than the retained history
//!   gets HTTP 200 and one `ERROR` event carrying a 410 `Expired` Status —
//!   what makes kube-rs relist.
//! - **get / create (POST) / update (PUT) / merge-patch (PATCH) / delete** on
//!   the resource paths, answering `Status` 404/409/400 like the real server.
//! - `/version`, `/api`, `/apis`, `/api/v1`, `/apis/discovery.k8s.io[/v1]`,
//!   `/healthz`, `/livez`, `/readyz`.
//!
//! Faults, switched at runtime ([`FakeApiServer::set_faults`],
//! [`cut_watches_mid_event`](FakeApiServer::cut_watches_mid_event), or
//! `sb-apiserver` flags): HTTP 500 for the next N reads or a share of them,
//! 429 with `Retry-After`, a delay before each read is answered, watch
//! connections cut in the middle of an event line, and silent watches (held
//! open, nothing sent: no event, no bookmark, no end). Faults apply to
//! resource reads (list, watch, get); writes and discovery are served as
//! usual, so a test can change objects during a fault.
//!
//! Tests drive it through [`FakeApiServer`]: [`apply`](FakeApiServer::apply),
//! [`delete`](FakeApiServer::delete), [`compact`](FakeApiServer::compact),
//! [`drop_watches`](FakeApiServer::drop_watches), [`stop`](FakeApiServer::stop)
//! / [`start_again`](FakeApiServer::start_again) /
//! [`restart_fresh`](FakeApiServer::restart_fresh), and the request counters.
//!
//! The server runs on its own thread with its own tokio runtime, so it works
//! the same from sync tests, `#[tokio::test]`s and the `sb-apiserver` binary.
//! With a network namespace name, that thread `setns()`es into
//! `/run/netns/<name>` before binding, so the agent can reach it on the
//! namespace's loopback; no other thread changes namespace.

mod http;
pub mod selector;
mod store;

use std::collections::HashMap;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

pub use store::{ApiError, EventType};
use store::{PutMode, Store};

/// The resources the fake server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// core/v1 `services` (namespaced)
    Service,
    /// discovery.k8s.io/v1 `endpointslices` (namespaced)
    EndpointSlice,
    /// core/v1 `nodes` (cluster-scoped)
    Node,
    /// core/v1 `pods` (namespaced): served so `switchboard doctor` can ask
    /// which Pods a Service's selector matches.
    Pod,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Service, Kind::EndpointSlice, Kind::Node, Kind::Pod];

    pub fn group(self) -> &'static str {
        match self {
            Kind::EndpointSlice => "discovery.k8s.io",
            _ => "",
        }
    }
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            _ => "v1",
        }
    }
    pub fn kind(self) -> &'static str {
        match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::Pod => "Pod",
        }
    }
    pub fn list_kind(self) -> &'static str {
        match self {
            Kind::Service => "ServiceList",
            Kind::EndpointSlice => "EndpointSliceList",
            Kind::Node => "NodeList",
            Kind::Pod => "PodList",
        }
    }
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Service => "services",
            Kind::EndpointSlice => "endpointslices",
            Kind::Node => "nodes",
            Kind::Pod => "pods",
        }
    }
    /// `services`, `endpointslices.discovery.k8s.io` (as in server messages).
    pub fn qualified(self) -> String {
        if self.group().is_empty() {
            self.plural().to_string()
        } else {
            format!("{}.{}", self.plural(), self.group())
        }
    }
    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::Node)
    }
    /// The kind of an object from its `apiVersion` and `kind`.
    pub fn of(obj: &Value) -> Option<Kind> {
        let av = obj.get("apiVersion")?.as_str()?;
        let k = obj.get("kind")?.as_str()?;
        Kind::ALL
            .into_iter()
            .find(|x| x.api_version() == av && x.kind() == k)
    }
    fn from_path(group: &str, plural: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|x| x.group() == group && x.plural() == plural)
    }
}

impl FromStr for Kind {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "service" | "services" | "svc" => Ok(Kind::Service),
            "endpointslice" | "endpointslices" | "endpointslices.discovery.k8s.io" => {
                Ok(Kind::EndpointSlice)
            }
            "node" | "nodes" | "no" => Ok(Kind::Node),
            "pod" | "pods" | "po" => Ok(Kind::Pod),
            _ => bail!("unknown kind {s:?} (services, endpointslices, nodes, pods)"),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}

/// What a request did, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    List,
    Watch,
    Get,
    Create,
    Update,
    Patch,
    Delete,
}

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// The raw (still percent-encoded) query string.
    pub query: String,
    /// Set for resource requests.
    pub kind: Option<Kind>,
    pub verb: Option<Verb>,
    /// HTTP status of the response (watches: 200, even when they carry an
    /// ERROR event).
    pub status: u16,
    pub at: Instant,
}

impl RequestRecord {
    /// A decoded query parameter.
    pub fn param(&self, name: &str) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes())
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    }
}

/// Server behaviour knobs.
#[derive(Clone, Debug)]
pub struct Config {
    /// How many events the watch history retains (the real server's watch
    /// cache and etcd compaction window). Resuming from a resourceVersion
    /// older than the window gets `410 Expired`.
    pub history_limit: usize,
    /// How often a watch that asked for bookmarks gets one.
    pub bookmark_interval: Duration,
    /// Watch duration when the client sends no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// Upper bound on any watch's duration (tests: force frequent re-watches).
    pub max_watch_timeout: Option<Duration>,
    /// The resourceVersion of an empty server.
    pub initial_resource_version: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            history_limit: 100_000,
            bookmark_interval: Duration::from_secs(1),
            default_watch_timeout: Duration::from_secs(1800),
            max_watch_timeout: None,
            initial_resource_version: 1,
        }
    }
}

/// Faults the server injects into resource reads (list, watch, get).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Answer the next this many reads with HTTP 500.
    pub fail_next: u64,
    /// Then answer this share of reads (0 to 1, spread evenly) with 500.
    pub fail_fraction: f64,
    /// Answer the next this many reads with HTTP 429 and `Retry-After`.
    pub throttle_next: u64,
    /// The `Retry-After` of a 429 (whole seconds, at least 1).
    pub retry_after: Duration,
    /// Wait this long before answering each read.
    pub delay: Duration,
    /// Watches send nothing (open ones stop, new ones start silent) and
    /// never end on their own: a dead connection the client must detect.
    pub silent_watches: bool,
}

/// The faults and how far along they are.
#[derive(Default)]
struct FaultState {
    faults: Faults,
    /// Accumulates `fail_fraction` per read; a read fails when it reaches 1.
    fraction_acc: f64,
    /// Reads answered with an injected error so far.
    injected: u64,
}

/// What a read gets instead of its answer.
pub(crate) enum Injected {
    Error500,
    Throttle429 { retry_after_s: u64 },
}

pub(crate) struct Shared {
    config: Config,
    faults: Mutex<FaultState>,
    /// Mirrors `Faults::silent_watches` for open watch streams.
    silent_tx: tokio::sync::watch::Sender<bool>,
    /// Bumped by `cut_watches_mid_event`.
    cut_tx: tokio::sync::watch::Sender<u64>,
    store: Mutex<Store>,
    /// Latest resourceVersion; watches wait on it.
    rv_tx: tokio::sync::watch::Sender<u64>,
    /// Bumped by `drop_watches`.
    drop_tx: tokio::sync::watch::Sender<u64>,
    log: Mutex<Vec<RequestRecord>>,
    open_watches: Mutex<HashMap<Kind, usize>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }
    /// Runs a store mutation and wakes the watches.
    fn mutate<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        let (r, rv) = {
            let mut s = self.store();
            let r = f(&mut s);
            (r, s.rv)
        };
        self.rv_tx.send_replace(rv);
        r
    }
    fn record(&self, rec: RequestRecord) {
        lock(&self.log).push(rec);
    }
    /// The fault a read meets, if any (counts it).
    pub(crate) fn inject(&self) -> Option<Injected> {
        let mut state = lock(&self.faults);
        let injected = if state.faults.throttle_next > 0 {
            state.faults.throttle_next -= 1;
            Some(Injected::Throttle429 {
                retry_after_s: state.faults.retry_after.as_secs().max(1),
            })
        } else if state.faults.fail_next > 0 {
            state.faults.fail_next -= 1;
            Some(Injected::Error500)
        } else if state.faults.fail_fraction > 0.0 {
            state.fraction_acc += state.faults.fail_fraction.min(1.0);
            if state.fraction_acc >= 1.0 {
                state.fraction_acc -= 1.0;
                Some(Injected::Error500)
            } else {
                None
            }
        } else {
            None
        };
        if injected.is_some() {
            state.injected += 1;
        }
        injected
    }
    pub(crate) fn read_delay(&self) -> Duration {
        lock(&self.faults).faults.delay
    }
    pub(crate) fn silent_rx(&self) -> tokio::sync::watch::Receiver<bool> {
        self.silent_tx.subscribe()
    }
    pub(crate) fn cut_rx(&self) -> tokio::sync::watch::Receiver<u64> {
        self.cut_tx.subscribe()
    }
    fn watch_opened(&self, kind: Kind) {
        *lock(&self.open_watches).entry(kind).or_default() += 1;
    }
    fn watch_closed(&self, kind: Kind) {
        if let Some(n) = lock(&self.open_watches).get_mut(&kind) {
            *n = n.saturating_sub(1);
        }
    }
}

struct Running {
    shutdown: tokio::sync::oneshot::Sender<()>,
    thread: JoinHandle<()>,
}

/// The fake API server. Dropping it stops it.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    netns: Option<String>,
    running: Mutex<Option<Running>>,
}

impl FakeApiServer {
    /// Starts on `addr` (e.g. `127.0.0.1:0`) in the current network namespace.
    pub fn start(addr: &str) -> Result<Self> {
        Self::start_with(Config::default(), None, addr)
    }

    /// Starts with the listening socket created inside network namespace
    /// `netns` (a name under `/run/netns/`, or an absolute path such as
    /// `/proc/PID/ns/net`), or in the current one for `None`. Needs
    /// CAP_SYS_ADMIN for a namespace, and `lo` up in it for 127.0.0.1.
    pub fn start_in_netns(netns: Option<&str>, addr: &str) -> Result<Self> {
        Self::start_with(Config::default(), netns, addr)
    }

    pub fn start_with(config: Config, netns: Option<&str>, addr: &str) -> Result<Self> {
        let addr = addr
            .to_socket_addrs()
            .with_context(|| format!("fake apiserver: bad listen address {addr:?}"))?
            .next()
            .ok_or_else(|| anyhow!("fake apiserver: no address in {addr:?}"))?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(
                config.history_limit,
                config.initial_resource_version,
            )),
            rv_tx: tokio::sync::watch::Sender::new(config.initial_resource_version),
            drop_tx: tokio::sync::watch::Sender::new(0),
            config,
            faults: Mutex::new(FaultState::default()),
            silent_tx: tokio::sync::watch::Sender::new(false),
            cut_tx: tokio::sync::watch::Sender::new(0),
            log: Mutex::new(Vec::new()),
            open_watches: Mutex::new(HashMap::new()),
        });
        let netns = netns.map(str::to_string);
        let (running, bound) = spawn_server(shared.clone(), netns.clone(), addr)?;
        Ok(Self {
            shared,
            addr: bound,
            netns,
            running: Mutex::new(Some(running)),
        })
    }

    /// The address it listens on (the real port when started with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    /// A kubeconfig pointing at this server (plain HTTP, a dummy bearer token,
    /// context `fake`, default namespace `default`).
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: fake\n  cluster:\n    server: {url}\n\
             users:\n\
             - name: fake\n  user:\n    token: fake-token\n\
             contexts:\n\
             - name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\n\
             preferences: {{}}\n",
            url = self.url()
        )
    }

    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.kubeconfig_yaml())
            .with_context(|| format!("writing kubeconfig {}", path.display()))
    }

    // ---- state, as a test drives it ----

    /// Creates or replaces an object (anything that serializes to a
    /// Service, EndpointSlice or Node with `apiVersion` and `kind`, e.g. a
    /// k8s-openapi value or `serde_json::json!`). Sets
    /// `metadata.resourceVersion` (next global version), `uid` and
    /// `creationTimestamp` (kept on update), defaults the namespace to
    /// `default`, and emits ADDED or MODIFIED. An update that changes nothing
    /// is a no-op, as on the real server. Returns the stored object.
    pub fn apply(&self, obj: impl serde::Serialize) -> Result<Value> {
        let obj = serde_json::to_value(obj).context("serializing object")?;
        let kind = Kind::of(&obj).ok_or_else(|| {
            anyhow!(
                "apply: unsupported apiVersion/kind {:?}/{:?}",
                obj.get("apiVersion"),
                obj.get("kind")
            )
        })?;
        Ok(self
            .shared
            .mutate(|s| s.put(kind, obj, None, PutMode::Upsert))?)
    }

    /// Deletes an object (`ns` is ignored for nodes); emits DELETED with its
    /// last state. Returns that state, or None if there was no such object.
    pub fn delete(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        self.shared.mutate(|s| s.delete(kind, ns, name)).ok()
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<Value> {
        self.shared.store().get(kind, ns, name).cloned()
    }

    /// All objects of a kind, ordered by namespace and name.
    pub fn objects(&self, kind: Kind) -> Vec<Value> {
        self.shared.store().current(kind).into_values().collect()
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().rv
    }

    /// Events currently retained for resuming watches.
    pub fn history_len(&self) -> usize {
        self.shared.store().history_len()
    }

    /// Drops the retained history: a watch resuming from any older
    /// resourceVersion (including ones open watches reconnect with) gets
    /// `410 Expired`. Open watches are not disturbed by this alone.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// Aborts every open watch connection mid-stream, as a dropped
    /// connection (no terminating chunk). Clients re-watch from their last
    /// resourceVersion.
    pub fn drop_watches(&self) {
        self.shared.drop_tx.send_modify(|g| *g += 1);
    }

    /// Empties the store and starts a new resourceVersion epoch far above the
    /// old one with no history, so any resourceVersion a client still holds
    /// is unknown and answered with `410 Expired` (relist).
    pub fn reset_state(&self) {
        self.shared.mutate(|s| {
            let base = s.rv + 1000;
            *s = Store::new(self.shared.config.history_limit, base);
        });
    }

    // ---- faults ----

    /// Replaces the faults in force (`Faults::default()` clears them).
    pub fn set_faults(&self, faults: Faults) {
        let silent = faults.silent_watches;
        {
            let mut state = lock(&self.shared.faults);
            state.faults = faults;
            state.fraction_acc = 0.0;
        }
        self.shared.silent_tx.send_replace(silent);
    }

    /// Clears every fault. Watches that went silent stay silent (they are
    /// dead connections); the client's next watch is served normally.
    pub fn clear_faults(&self) {
        self.set_faults(Faults::default());
    }

    /// The faults in force (the counts left).
    pub fn faults(&self) -> Faults {
        lock(&self.shared.faults).faults.clone()
    }

    /// Reads answered with an injected 500 or 429 so far.
    pub fn faults_injected(&self) -> u64 {
        lock(&self.shared.faults).injected
    }

    /// Cuts every open watch connection in the middle of a line: the first
    /// half of a bookmark line goes out, then the connection is aborted.
    pub fn cut_watches_mid_event(&self) {
        self.shared.cut_tx.send_modify(|g| *g += 1);
    }

    // ---- lifecycle ----

    pub fn is_running(&self) -> bool {
        lock(&self.running).is_some()
    }

    /// Stops listening and closes every connection (open watches end
    /// mid-stream). State and counters are kept. Waits until the socket is
    /// closed.
    pub fn stop(&self) {
        let running = lock(&self.running).take();
        if let Some(r) = running {
            let _ = r.shutdown.send(());
            let _ = r.thread.join();
        }
    }

    /// Starts again on the same address (and namespace) after [`stop`](Self::stop),
    /// with whatever state the store has: resourceVersions continue.
    pub fn start_again(&self) -> Result<()> {
        let mut running = lock(&self.running);
        if running.is_some() {
            return Ok(());
        }
        let (r, _) = spawn_server(self.shared.clone(), self.netns.clone(), self.addr)?;
        *running = Some(r);
        Ok(())
    }

    /// Stop + start, keeping state: clients reconnect and resume.
    pub fn restart(&self) -> Result<()> {
        self.stop();
        self.start_again()
    }

    /// Stop + [`reset_state`](Self::reset_state) + start: clients reconnect,
    /// get `410 Expired` for their old resourceVersion and relist an empty
    /// store.
    pub fn restart_fresh(&self) -> Result<()> {
        self.stop();
        self.reset_state();
        self.start_again()
    }

    // ---- counters ----

    /// Every request so far (across restarts), oldest first.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.log).clone()
    }

    /// How many requests of `verb` on `kind` were made so far.
    pub fn request_count(&self, kind: Kind, verb: Verb) -> usize {
        lock(&self.shared.log)
            .iter()
            .filter(|r| r.kind == Some(kind) && r.verb == Some(verb))
            .count()
    }

    pub fn lists(&self, kind: Kind) -> usize {
        self.request_count(kind, Verb::List)
    }

    pub fn watches(&self, kind: Kind) -> usize {
        self.request_count(kind, Verb::Watch)
    }

    /// Watch streams currently open for `kind`.
    pub fn open_watches(&self, kind: Kind) -> usize {
        lock(&self.shared.open_watches)
            .get(&kind)
            .copied()
            .unwrap_or(0)
    }

    /// Polls `cond` every 10 ms until it holds or `timeout` passes; returns
    /// whether it held. (Blocking; from async code prefer a tokio loop.)
    pub fn wait_until(&self, timeout: Duration, mut cond: impl FnMut(&Self) -> bool) -> bool {
        let end = Instant::now() + timeout;
        loop {
            if cond(self) {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let sock = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // Rebinding the same port after stop() while old connections sit in
    // TIME_WAIT.
    sock.set_reuse_address(true)?;
    sock.set_nonblocking(true)?;
    sock.bind(&addr.into())?;
    sock.listen(1024)?;
    Ok(sock.into())
}

/// Runs one incarnation of the server on a dedicated thread: optionally
/// enter the namespace, bind, then serve on a current-thread runtime until
/// shut down. Dropping that runtime closes every connection.
fn spawn_server(
    shared: Arc<Shared>,
    netns: Option<String>,
    addr: SocketAddr,
) -> Result<(Running, SocketAddr)> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<SocketAddr>>();
    let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("sb-apiserver".into())
        .spawn(move || {
            let setup = || -> Result<(std::net::TcpListener, tokio::runtime::Runtime)> {
                if let Some(ns) = &netns {
                    proxy_testkit::netns::enter_netns(ns)?;
                }
                let listener = bind(addr).with_context(|| {
                    let hint = match &netns {
                        Some(ns) => {
                            format!(" in netns {ns} (is lo up? `ip -n {ns} link set lo up`)")
                        }
                        None => String::new(),
                    };
                    format!("fake apiserver: binding {addr}{hint}")
                })?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                Ok((listener, rt))
            };
            let (listener, rt) = match setup() {
                Ok(x) => x,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let local = match listener.local_addr() {
                Ok(a) => a,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(local));
            rt.block_on(http::serve(listener, shared, shutdown_rx));
            // `rt` drops here, cancelling every connection task.
        })
        .context("spawning fake apiserver thread")?;
    match ready_rx.recv() {
        Ok(Ok(local)) => Ok((
            Running {
                shutdown: shutdown_tx,
                thread,
            },
            local,
        )),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            bail!("fake apiserver thread exited during start-up")
        }
    }
}
