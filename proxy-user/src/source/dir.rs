//! The standalone source, `--source dir:PATH`: Services and EndpointSlices
//! read from a directory of manifests, and followed as files are added,
//! edited and deleted.
//!
//! * Files: `*.yaml`, `*.yml`, `*.json` directly in the directory (not in
//!   subdirectories; hidden files, whose names start with `.`, are ignored, which
//!   also skips editors' swap files and the `..data` links of a mounted ConfigMap).
//! * Documents: a file holds one or more documents separated by `---` (JSON
//!   files: one or more JSON values). Empty documents are ignored. `kind: List`
//!   (what `kubectl get -o yaml` prints for several objects) and typed lists
//!   (`ServiceList`, `EndpointSliceList`) are expanded.
//! * Kinds: `v1` `Service` and `discovery.k8s.io/v1` `EndpointSlice`, read with
//!   the k8s-openapi types the cluster source uses. Other kinds are skipped with
//!   a note. An object without a namespace is put in `default`.
//! * Errors: a file that cannot be read or parsed is reported (naming the file,
//!   the document and the problem) and, while it stays broken, the objects it
//!   last held when it was good stay in the snapshot. The file is all or nothing:
//!   one bad document keeps the whole file at its last good state.
//! * The same object (kind, namespace, name) in two files: the one in the file
//!   whose path sorts first is used; the other is reported and ignored.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::hash::{Hash as _, Hasher as _};
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use serde::Deserialize as _;
use serde_json::Value;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

/// How long to wait after a file-system event for more to arrive before rescanning.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// The fallback rescan, in case an event is missed (it compares file metadata,
/// and reads only files whose size, modification time or inode changed).
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

/// All Services and EndpointSlices currently in the directory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
}

/// What one file holds: `(services, endpoint slices, notes about skipped objects)`.
pub type FileObjects = (Vec<Service>, Vec<EndpointSlice>, Vec<String>);

/// Why a manifest file was rejected. Every message names the file, and
/// (after the file could be read) the 1-based document number in it.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read (permissions, not UTF-8, ...).
    #[error("{}: cannot read the file: {error}", .path.display())]
    Read { path: PathBuf, error: io::Error },
    /// A document is not well-formed YAML (or JSON, for `.json` files).
    #[error("{}: document {document}: syntax error: {error}", .path.display())]
    Syntax {
        path: PathBuf,
        /// 1-based.
        document: usize,
        error: SyntaxError,
    },
    /// A document (or an item of a List) is not a Kubernetes object: not a
    /// mapping, or without `apiVersion` or `kind`.
    #[error("{}: {}: {problem}", .path.display(), Location(*.document, *.item))]
    NotAnObject {
        path: PathBuf,
        document: usize,
        /// 0-based index within the (innermost) List, for List items.
        item: Option<usize>,
        problem: String,
    },
    /// A Service or EndpointSlice that does not match the Kubernetes schema.
    #[error("{}: {}: {kind} {}: {error}", .path.display(), Location(*.document, *.item), .name.as_deref().unwrap_or("(without a name)"))]
    Invalid {
        path: PathBuf,
        document: usize,
        item: Option<usize>,
        kind: String,
        name: Option<String>,
        error: serde_json::Error,
    },
}

impl ManifestError {
    /// The file at fault.
    pub fn path(&self) -> &Path {
        match self {
            ManifestError::Read { path, .. }
            | ManifestError::Syntax { path, .. }
            | ManifestError::NotAnObject { path, .. }
            | ManifestError::Invalid { path, .. } => path,
        }
    }
}

/// The parser's own error, by file format.
#[derive(Debug, thiserror::Error)]
pub enum SyntaxError {
    #[error("{0}")]
    Yaml(serde_yaml::Error),
    #[error("{0}")]
    Json(serde_json::Error),
}

struct Location(usize, Option<usize>);

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.0)?;
        if let Some(item) = self.1 {
            write!(f, ", List item {item}")?;
        }
        Ok(())
    }
}

/// Reads one manifest file. `.json` files are parsed as JSON, anything else as YAML.
pub fn load_file(path: &Path) -> Result<FileObjects, ManifestError> {
    let bytes = std::fs::read(path).map_err(|error| ManifestError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    parse_manifests(path, &bytes)
}

/// Parses the contents of a manifest file; `path` decides the format (`.json`
/// or YAML) and names the file in errors and notes.
pub fn parse_manifests(path: &Path, bytes: &[u8]) -> Result<FileObjects, ManifestError> {
    let text = std::str::from_utf8(bytes).map_err(|e| ManifestError::Read {
        path: path.to_path_buf(),
        error: io::Error::new(io::ErrorKind::InvalidData, format!("not UTF-8 text: {e}")),
    })?;
    let mut out = Collector {
        path,
        services: Vec::new(),
        slices: Vec::new(),
        notes: Vec::new(),
    };
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if is_json {
        let stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
        for (i, doc) in stream.enumerate() {
            let document = i + 1;
            let value = doc.map_err(|e| ManifestError::Syntax {
                path: path.to_path_buf(),
                document,
                error: SyntaxError::Json(e),
            })?;
            out.value(value, document, None)?;
        }
    } else {
        for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let document = i + 1;
            let value = Value::deserialize(doc).map_err(|e| ManifestError::Syntax {
                path: path.to_path_buf(),
                document,
                error: SyntaxError::Yaml(e),
            })?;
            out.value(value, document, None)?;
        }
    }
    Ok((out.services, out.slices, out.notes))
}

struct Collector<'p> {
    path: &'p Path,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    notes: Vec<String>,
}

impl Collector<'_> {
    fn not_an_object(
        &self,
        document: usize,
        item: Option<usize>,
        problem: impl Into<String>,
    ) -> ManifestError {
        ManifestError::NotAnObject {
            path: self.path.to_path_buf(),
            document,
            item,
            problem: problem.into(),
        }
    }

    fn value(
        &mut self,
        value: Value,
        document: usize,
        item: Option<usize>,
    ) -> Result<(), ManifestError> {
        let obj = match &value {
            Value::Null => return Ok(()), // an empty document
            Value::Object(obj) => obj,
            _ => {
                return Err(self.not_an_object(
                    document,
                    item,
                    "is not a mapping (a Kubernetes object)",
                ))
            }
        };
        let Some(kind) = obj.get("kind").and_then(Value::as_str).map(str::to_owned) else {
            return Err(self.not_an_object(document, item, "has no kind"));
        };
        let Some(api_version) = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            return Err(self.not_an_object(document, item, format!("{kind} has no apiVersion")));
        };
        let meta = obj.get("metadata");
        let name = meta
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let namespaced_name = {
            let ns = meta
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                .filter(|ns| !ns.is_empty())
                .unwrap_or("default");
            format!("{ns}/{}", name.as_deref().unwrap_or("(without a name)"))
        };
        let invalid = |error: serde_json::Error| ManifestError::Invalid {
            path: self.path.to_path_buf(),
            document,
            item,
            kind: kind.clone(),
            name: name.clone(),
            error,
        };

        match (api_version.as_str(), kind.as_str()) {
            ("v1", "Service") => {
                let mut svc: Service = serde_json::from_value(value).map_err(invalid)?;
                default_namespace(&mut svc.metadata);
                self.services.push(svc);
            }
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                let mut slice: EndpointSlice = serde_json::from_value(value).map_err(invalid)?;
                default_namespace(&mut slice.metadata);
                self.slices.push(slice);
            }
            (_, list_kind) if list_kind.ends_with("List") && obj.contains_key("items") => {
                // `kind: List` holds complete objects; typed lists (ServiceList, as
                // the API returns them) may leave kind and apiVersion out of items.
                let item_kind = list_kind.strip_suffix("List").unwrap_or_default().to_owned();
                let Value::Object(mut obj) = value else {
                    return Ok(()); // unreachable: checked above
                };
                let items = match obj.remove("items") {
                    Some(Value::Array(items)) => items,
                    Some(Value::Null) | None => Vec::new(),
                    Some(_) => {
                        return Err(self.not_an_object(document, item, format!("{list_kind} items is not a sequence")));
                    }
                };
                for (i, mut it) in items.into_iter().enumerate() {
                    if let (Value::Object(io), false) = (&mut it, item_kind.is_empty()) {
                        io.entry("kind").or_insert_with(|| Value::String(item_kind.clone()));
                        io.entry("apiVersion")
                            .or_insert_with(|| Value::String(api_version.clone()));
                    }
                    self.value(it, document, Some(i))?;
                }
            }
            (_, "Service") | (_, "EndpointSlice") => {
                let want = if kind == "Service" { "v1" } else { "discovery.k8s.io/v1" };
                self.note(
                    document,
                    item,
                    format!("skipped {kind} {namespaced_name}: apiVersion {api_version} is not supported (use {want})"),
                );
            }
            ("v1", "Endpoints") => self.note(
                document,
                item,
                format!(
                    "skipped Endpoints {namespaced_name}: switchboard reads EndpointSlices (discovery.k8s.io/v1), not Endpoints"
                ),
            ),
            _ => self.note(
                document,
                item,
                format!("skipped {kind} {namespaced_name} (only Services and EndpointSlices are read)"),
            ),
        }
        Ok(())
    }

    fn note(&mut self, document: usize, item: Option<usize>, text: String) {
        self.notes.push(format!(
            "{}: {}: {text}",
            self.path.display(),
            Location(document, item)
        ));
    }
}

fn default_namespace(meta: &mut ObjectMeta) {
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some("default".to_string());
    }
}

/// Is this directory entry a manifest we read?
fn is_manifest_name(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    if name.starts_with('.') {
        return false;
    }
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
        ["yaml", "yml", "json"]
            .iter()
            .any(|x| e.eq_ignore_ascii_case(x))
    })
}

/// Cheap change detection for the periodic rescan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    ino: u64,
    dev: u64,
}

impl Fingerprint {
    fn of(meta: &std::fs::Metadata) -> Fingerprint {
        Fingerprint {
            len: meta.len(),
            modified: meta.modified().ok(),
            ino: meta.ino(),
            dev: meta.dev(),
        }
    }
}

fn content_hash(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

struct FileState {
    fingerprint: Option<Fingerprint>,
    content_hash: Option<u64>,
    /// The objects from the last time this file parsed.
    good: Option<(Vec<Service>, Vec<EndpointSlice>)>,
    /// The current problem, if the file is broken (logged once per change).
    error: Option<String>,
}

/// The directory as last read.
struct DirState {
    dir: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    /// The directory's identity, to notice it being replaced (then the watch is renewed).
    dir_id: Option<(u64, u64)>,
    dir_error: Option<String>,
}

impl DirState {
    fn new(dir: PathBuf) -> DirState {
        DirState {
            dir,
            files: BTreeMap::new(),
            dir_id: None,
            dir_error: None,
        }
    }

    /// Brings the state up to date with the directory. With `read_all`, every
    /// file is read and compared by content; otherwise only files whose
    /// metadata changed. Returns whether the set of good objects changed.
    fn scan(&mut self, read_all: bool) -> bool {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) => {
                let msg = format!(
                    "{}: cannot read the manifest directory: {e}",
                    self.dir.display()
                );
                if self.dir_error.as_deref() != Some(msg.as_str()) {
                    error!("{msg}; keeping the objects last read from it");
                    self.dir_error = Some(msg);
                }
                self.dir_id = None;
                return false;
            }
        };
        if self.dir_error.take().is_some() {
            info!(dir = %self.dir.display(), "manifest directory is readable again");
        }
        let mut changed = false;
        let mut seen = BTreeSet::new();
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            if !is_manifest_name(&path) {
                continue;
            }
            // metadata() follows symlinks, so ConfigMap-style links are read through.
            let meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue, // gone, or a dangling link
                Err(e) => {
                    seen.insert(path.clone());
                    self.file_error(
                        &path,
                        ManifestError::Read {
                            path: path.clone(),
                            error: e,
                        },
                        None,
                    );
                    continue;
                }
            };
            if !meta.is_file() {
                continue;
            }
            seen.insert(path.clone());
            let fingerprint = Fingerprint::of(&meta);
            if !read_all
                && self
                    .files
                    .get(&path)
                    .is_some_and(|f| f.fingerprint == Some(fingerprint))
            {
                continue;
            }
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    seen.remove(&path);
                    continue;
                }
                Err(e) => {
                    self.file_error(
                        &path,
                        ManifestError::Read {
                            path: path.clone(),
                            error: e,
                        },
                        Some(fingerprint),
                    );
                    continue;
                }
            };
            let hash = content_hash(&bytes);
            if let Some(f) = self.files.get_mut(&path) {
                f.fingerprint = Some(fingerprint);
                if f.content_hash == Some(hash) {
                    continue;
                }
                f.content_hash = Some(hash);
            }
            match parse_manifests(&path, &bytes) {
                Ok((services, slices, notes)) => {
                    for note in &notes {
                        info!("{note}");
                    }
                    info!(
                        file = %path.display(),
                        services = services.len(),
                        endpoint_slices = slices.len(),
                        "manifest file loaded"
                    );
                    let f = self.files.entry(path.clone()).or_insert_with(|| FileState {
                        fingerprint: Some(fingerprint),
                        content_hash: Some(hash),
                        good: None,
                        error: None,
                    });
                    let objects = Some((services, slices));
                    if f.good != objects {
                        f.good = objects;
                        changed = true;
                    }
                    f.error = None;
                }
                Err(e) => {
                    self.file_error(&path, e, Some(fingerprint));
                    if let Some(f) = self.files.get_mut(&path) {
                        f.content_hash = Some(hash);
                    }
                }
            }
        }
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !seen.contains(*p))
            .cloned()
            .collect();
        for path in gone {
            if let Some(f) = self.files.remove(&path) {
                info!(file = %path.display(), "manifest file removed; its objects are gone");
                changed |= f.good.is_some();
            }
        }
        changed
    }

    /// Records (and logs, once per distinct problem) a broken file, keeping its last good objects.
    fn file_error(&mut self, path: &Path, err: ManifestError, fingerprint: Option<Fingerprint>) {
        let f = self
            .files
            .entry(path.to_path_buf())
            .or_insert_with(|| FileState {
                fingerprint: None,
                content_hash: None,
                good: None,
                error: None,
            });
        if fingerprint.is_some() {
            f.fingerprint = fingerprint;
        }
        let msg = err.to_string();
        if f.error.as_deref() != Some(msg.as_str()) {
            match &f.good {
                Some((svcs, slices)) => error!(
                    "{msg}; keeping this file's last good objects ({} Services, {} EndpointSlices)",
                    svcs.len(),
                    slices.len()
                ),
                None => error!("{msg}; nothing from this file is used"),
            }
            f.error = Some(msg);
        }
    }

    /// All good objects, files in path order; an object defined again in a
    /// later file is reported and left out.
    fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot::default();
        let mut owner: BTreeMap<(&str, String, String), &Path> = BTreeMap::new();
        for (path, f) in &self.files {
            let Some((services, slices)) = &f.good else {
                continue;
            };
            for svc in services {
                if claim(&mut owner, "Service", &svc.metadata, path) {
                    snap.services.push(svc.clone());
                }
            }
            for slice in slices {
                if claim(&mut owner, "EndpointSlice", &slice.metadata, path) {
                    snap.endpoint_slices.push(slice.clone());
                }
            }
        }
        snap
    }

    /// The directory's (device, inode), to notice it being replaced.
    fn current_dir_id(&self) -> Option<(u64, u64)> {
        std::fs::metadata(&self.dir)
            .ok()
            .map(|m| (m.dev(), m.ino()))
    }
}

fn claim<'a>(
    owner: &mut BTreeMap<(&'static str, String, String), &'a Path>,
    kind: &'static str,
    meta: &ObjectMeta,
    path: &'a Path,
) -> bool {
    let ns = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    match owner.get(&(kind, ns.clone(), name.clone())) {
        Some(first) => {
            warn!(
                "{}: {kind} {ns}/{name} is also defined in {}; this copy is ignored",
                path.display(),
                first.display()
            );
            false
        }
        None => {
            owner.insert((kind, ns, name), path);
            true
        }
    }
}

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

/// Watches `dir` (see the module documentation) and returns a receiver that
/// always holds the latest good snapshot. The directory is read once before
/// this returns, so the receiver starts with its current contents. Changes
/// show up within [`DEBOUNCE`] of a file-system event, or within
/// [`RESCAN_INTERVAL`] if an event is missed. The watch stops when every
/// receiver is dropped.
pub async fn watch_dir(dir: PathBuf) -> anyhow::Result<watch::Receiver<Arc<Snapshot>>> {
    let meta = tokio::fs::metadata(&dir)
        .await
        .with_context(|| format!("manifest directory {}", dir.display()))?;
    anyhow::ensure!(meta.is_dir(), "{} is not a directory", dir.display());

    let (ev_tx, ev_rx) = mpsc::channel();
    let (state, watcher, ev_tx) = tokio::task::spawn_blocking(move || {
        let mut state = DirState::new(dir);
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
        state.scan(true);
        (state, watcher, ev_tx)
    })
    .await
    .context("reading the manifest directory")?;

    let (tx, rx) = watch::channel(Arc::new(state.snapshot()));
    std::thread::Builder::new()
        .name("dir-source".into())
        .spawn(move || follow(state, watcher, ev_tx, ev_rx, tx))
        .context("starting the manifest directory watcher thread")?;
    Ok(rx)
}

/// The watcher thread: rescans after (debounced) events and periodically,
/// and publishes a new snapshot whenever the good objects changed.
fn follow(
    mut state: DirState,
    mut watcher: Option<RecommendedWatcher>,
    ev_tx: EventTx,
    ev_rx: EventRx,
    tx: watch::Sender<Arc<Snapshot>>,
) {
    let mut next_rescan = Instant::now() + RESCAN_INTERVAL;
    loop {
        let wait = next_rescan.saturating_duration_since(Instant::now());
        let read_all = match ev_rx.recv_timeout(wait) {
            Ok(ev) => {
                if !relevant(&ev) {
                    if tx.is_closed() {
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
        if tx.is_closed() {
            break;
        }
        if state.scan(read_all) {
            let snap = state.snapshot();
            debug!(
                services = snap.services.len(),
                endpoint_slices = snap.endpoint_slices.len(),
                "manifest snapshot updated"
            );
            tx.send_replace(Arc::new(snap));
        }
        // Renew the watch if the directory was replaced (or the watch never started).
        let id = state.current_dir_id();
        if id.is_some() && (id != state.dir_id || watcher.is_none()) {
            watcher = None;
            match new_watcher(&state.dir, &ev_tx) {
                Ok(w) => {
                    watcher = Some(w);
                    state.dir_id = id;
                    // Something may have changed before the new watch took hold.
                    if state.scan(true) {
                        tx.send_replace(Arc::new(state.snapshot()));
                    }
                }
                Err(e) => {
                    debug!(dir = %state.dir.display(), "cannot watch the manifest directory yet: {e}")
                }
            }
        }
    }
    debug!(dir = %state.dir.display(), "manifest directory watch stopped");
}
