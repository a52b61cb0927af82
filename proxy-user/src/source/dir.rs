//! The standalone source, `--source dir:PATH`: Services, EndpointSlices and
//! Nodes read from a directory of manifests, and followed as files are added,
//! edited and deleted.
//!
//! * Files: `*.yaml`, `*.yml`, `*.json` directly in the directory (not in
//!   subdirectories; hidden files, whose names start with `.`, are ignored, which
//!   also skips editors' swap files and the `..data` links of a mounted ConfigMap).
//! * Documents: a file holds one or more documents separated by `---` (JSON
//!   files: one or more JSON values). Empty documents are ignored. `kind: List`
//!   (what `kubectl get -o yaml` prints for several objects) and typed lists
//!   (`ServiceList`, `EndpointSliceList`, `NodeList`) are expanded.
//! * Kinds: `v1` `Service`, `discovery.k8s.io/v1` `EndpointSlice` and `v1`
//!   `Node`, read with the k8s-openapi types the cluster source uses. Other
//!   kinds are skipped with a note. A Service or EndpointSlice without a
//!   namespace is put in `default`; a Node is cluster-scoped (a namespace on it
//!   is ignored).
//! * This node: the snapshot's `node` comes from the Node whose `metadata.name`
//!   is the agent's node name (NodePort frontends, `Local` traffic policies,
//!   topology). Nodes with other names are read and kept but not used, so one
//!   directory can serve several nodes. Without a matching Node there is none,
//!   as before: no NodePort frontends, and `Local` policies act as `Cluster`.
//! * Errors: a file that cannot be read or parsed is reported (naming the file,
//!   the document and the problem) and, while it stays broken, the objects it
//!   last held when it was good stay in the snapshot. The file is all or nothing:
//!   one bad document keeps the whole file at its last good state.
//! * The same object (kind, namespace, name; kind and name for a Node) in two
//!   files: the one in the file whose path sorts first is used; the other is
//!   reported and ignored.

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
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use serde::Deserialize as _;
use serde_json::Value;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::model::NodeInfo;

/// How long to wait after a file-system event for more to arrive before rescanning.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// The fallback rescan, in case an event is missed (it compares file metadata,
/// and reads only files whose size, modification time or inode changed).
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

/// All Services and EndpointSlices currently in the directory, and this node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    /// This node, when the source knows it (the cluster source watches it; a
    /// directory has it when it holds a Node of this node's name). Without it:
    /// no NodePort frontends and no `Local` policies.
    pub node: Option<NodeInfo>,
}

/// What one manifest file holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FileObjects {
    pub services: Vec<Service>,
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Nodes of any name (only the one named like this node is used).
    pub nodes: Vec<Node>,
    /// Notes about skipped objects, each naming the file and the document.
    pub notes: Vec<String>,
}

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
    /// A Service, EndpointSlice or Node that does not match the Kubernetes schema.
    #[error("{0}")]
    Invalid(Box<InvalidObject>),
}

/// The details of [`ManifestError::Invalid`].
#[derive(Debug, thiserror::Error)]
#[error("{}: {}: {kind} {}: {field}: {error}", .path.display(), Location(*.document, *.item), .name.as_deref().unwrap_or("(without a name)"))]
pub struct InvalidObject {
    pub path: PathBuf,
    /// 1-based.
    pub document: usize,
    /// 0-based index within the (innermost) List, for List items.
    pub item: Option<usize>,
    /// `Service`, `EndpointSlice` or `Node`.
    pub kind: String,
    pub name: Option<String>,
    /// Where in the object, e.g. `spec.ports[0].port` (`.` for the object itself).
    pub field: String,
    pub error: serde_json::Error,
}

impl ManifestError {
    /// The file at fault.
    pub fn path(&self) -> &Path {
        match self {
            ManifestError::Read { path, .. }
            | ManifestError::Syntax { path, .. }
            | ManifestError::NotAnObject { path, .. } => path,
            ManifestError::Invalid(inv) => &inv.path,
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
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let out = if is_json {
        let mut out = Collector::new(path);
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
        out
    } else {
        parse_yaml(path, text)?
    };
    let notes = out
        .notes
        .into_iter()
        .map(|n| {
            format!(
                "{}: {}: {}",
                path.display(),
                Location(n.document, n.item),
                n.text
            )
        })
        .collect();
    Ok(FileObjects {
        services: out.services,
        endpoint_slices: out.slices,
        nodes: out.nodes,
        notes,
    })
}

fn parse_yaml<'p>(path: &'p Path, text: &str) -> Result<Collector<'p>, ManifestError> {
    let mut out = Collector::new(path);
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let document = i + 1;
        let value = Value::deserialize(doc).map_err(|e| ManifestError::Syntax {
            path: path.to_path_buf(),
            document,
            error: SyntaxError::Yaml(e),
        })?;
        out.value(value, document, None)?;
    }
    Ok(out)
}

struct Note {
    document: usize,
    item: Option<usize>,
    text: String,
}

struct Collector<'p> {
    path: &'p Path,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
    nodes: Vec<Node>,
    notes: Vec<Note>,
}

impl<'p> Collector<'p> {
    fn new(path: &'p Path) -> Collector<'p> {
        Collector {
            path,
            services: Vec::new(),
            slices: Vec::new(),
            nodes: Vec::new(),
            notes: Vec::new(),
        }
    }
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
        // For notes: the name as written (`ns/name`, or just `name` when the
        // object has no namespace, as cluster-scoped kinds do).
        let namespaced_name = {
            let name = name.as_deref().unwrap_or("(without a name)");
            match meta
                .and_then(|m| m.get("namespace"))
                .and_then(Value::as_str)
                .filter(|ns| !ns.is_empty())
            {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_string(),
            }
        };
        let invalid = |e: serde_path_to_error::Error<serde_json::Error>| {
            ManifestError::Invalid(Box::new(InvalidObject {
                path: self.path.to_path_buf(),
                document,
                item,
                kind: kind.clone(),
                name: name.clone(),
                field: e.path().to_string(),
                error: e.into_inner(),
            }))
        };

        match (api_version.as_str(), kind.as_str()) {
            ("v1", "Service") => {
                let mut svc: Service = serde_path_to_error::deserialize(value).map_err(invalid)?;
                default_namespace(&mut svc.metadata);
                self.services.push(svc);
            }
            ("discovery.k8s.io/v1", "EndpointSlice") => {
                let mut slice: EndpointSlice =
                    serde_path_to_error::deserialize(value).map_err(invalid)?;
                default_namespace(&mut slice.metadata);
                self.slices.push(slice);
            }
            ("v1", "Node") => {
                let mut node: Node = serde_path_to_error::deserialize(value).map_err(invalid)?;
                node.metadata.namespace = None; // cluster-scoped
                self.nodes.push(node);
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
            (_, "Service" | "EndpointSlice" | "Node") => {
                let want = if kind == "EndpointSlice" { "discovery.k8s.io/v1" } else { "v1" };
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
                format!("skipped {kind} {namespaced_name} (only Services, EndpointSlices and Nodes are read)"),
            ),
        }
        Ok(())
    }

    fn note(&mut self, document: usize, item: Option<usize>, text: String) {
        self.notes.push(Note {
            document,
            item,
            text,
        });
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
    /// The objects from the last time this file parsed (without the notes).
    good: Option<FileObjects>,
    /// The current problem, if the file is broken (logged once per change).
    error: Option<String>,
}

/// The directory as last read.
struct DirState {
    dir: PathBuf,
    /// The agent's node name: the Node of this name is the snapshot's `node`.
    node_name: String,
    files: BTreeMap<PathBuf, FileState>,
    /// The directory's identity, to notice it being replaced (then the watch is renewed).
    dir_id: Option<(u64, u64)>,
    dir_error: Option<String>,
}

impl DirState {
    fn new(dir: PathBuf, node_name: String) -> DirState {
        DirState {
            dir,
            node_name,
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
                Ok(mut objects) => {
                    for note in std::mem::take(&mut objects.notes) {
                        info!("{note}");
                    }
                    info!(
                        file = %path.display(),
                        services = objects.services.len(),
                        endpoint_slices = objects.endpoint_slices.len(),
                        nodes = objects.nodes.len(),
                        "manifest file loaded"
                    );
                    let f = self.files.entry(path.clone()).or_insert_with(|| FileState {
                        fingerprint: Some(fingerprint),
                        content_hash: Some(hash),
                        good: None,
                        error: None,
                    });
                    let objects = Some(objects);
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
                Some(good) => error!(
                    "{msg}; keeping this file's last good objects ({} Services, {} EndpointSlices, {} Nodes)",
                    good.services.len(),
                    good.endpoint_slices.len(),
                    good.nodes.len()
                ),
                None => error!("{msg}; nothing from this file is used"),
            }
            f.error = Some(msg);
        }
    }

    /// All good objects, files in path order; an object defined again in a
    /// later file is reported and left out. The Node named like this node
    /// becomes the snapshot's `node`.
    fn snapshot(&self) -> Snapshot {
        let mut snap = Snapshot::default();
        let mut owner: BTreeMap<(&str, String, String), &Path> = BTreeMap::new();
        for (path, f) in &self.files {
            let Some(good) = &f.good else {
                continue;
            };
            for svc in &good.services {
                if claim(&mut owner, "Service", &svc.metadata, path) {
                    snap.services.push(svc.clone());
                }
            }
            for slice in &good.endpoint_slices {
                if claim(&mut owner, "EndpointSlice", &slice.metadata, path) {
                    snap.endpoint_slices.push(slice.clone());
                }
            }
            for node in &good.nodes {
                if claim(&mut owner, "Node", &node.metadata, path)
                    && node.metadata.name.as_deref() == Some(self.node_name.as_str())
                {
                    snap.node = Some(NodeInfo::from_node(node));
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
            // Cluster-scoped objects (Nodes) have no namespace to show.
            let shown = if ns.is_empty() {
                name.clone()
            } else {
                format!("{ns}/{name}")
            };
            warn!(
                "{}: {kind} {shown} is also defined in {}; this copy is ignored",
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
/// receiver is dropped. `node_name` is the agent's node: the Node of that
/// name becomes the snapshots' `node`.
pub async fn watch_dir(
    dir: PathBuf,
    node_name: String,
) -> anyhow::Result<watch::Receiver<Arc<Snapshot>>> {
    let meta = tokio::fs::metadata(&dir)
        .await
        .with_context(|| format!("manifest directory {}", dir.display()))?;
    anyhow::ensure!(meta.is_dir(), "{} is not a directory", dir.display());

    let (ev_tx, ev_rx) = mpsc::channel();
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
        state.scan(true);
        (state, watcher, ev_tx)
    })
    .await
    .context("reading the manifest directory")?;

    let snap = state.snapshot();
    log_node_change(&state, None, snap.node.as_ref(), true);
    let (tx, rx) = watch::channel(Arc::new(snap));
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
            publish(&state, &tx, snap);
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
                        publish(&state, &tx, state.snapshot());
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

/// Sends a new snapshot, saying so when this node's Node appeared, changed or went.
fn publish(state: &DirState, tx: &watch::Sender<Arc<Snapshot>>, snap: Snapshot) {
    let old = tx.send_replace(Arc::new(snap));
    log_node_change(state, old.node.as_ref(), tx.borrow().node.as_ref(), false);
}

/// Logs this node's Node appearing, changing or going (at start: whether it is there).
fn log_node_change(state: &DirState, old: Option<&NodeInfo>, new: Option<&NodeInfo>, start: bool) {
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
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn parse(name: &str, text: &str) -> Result<FileObjects, ManifestError> {
        parse_manifests(Path::new(name), text.as_bytes())
    }

    fn names<T: k8s_openapi::Metadata<Ty = ObjectMeta>>(objs: &[T]) -> Vec<String> {
        objs.iter()
            .map(|o| {
                let m = o.metadata();
                format!(
                    "{}/{}",
                    m.namespace.as_deref().unwrap_or("?"),
                    m.name.as_deref().unwrap_or("?")
                )
            })
            .collect()
    }

    const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n";
    const SLICE: &str = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nports: [{port: 8080}]\nendpoints: [{addresses: [10.244.1.2]}]\n";

    #[test]
    fn multi_document_file_with_empty_documents() {
        let text = format!(
            "# leading comment\n---\n{SERVICE}---\n---\n# only a comment\n---\n{SLICE}---\n"
        );
        let FileObjects {
            services,
            endpoint_slices: slices,
            notes,
            ..
        } = parse("a.yaml", &text).expect("parses");
        assert_eq!(
            names(&services),
            ["default/web"],
            "namespace defaults to default"
        );
        assert_eq!(names(&slices), ["shop/web-1"]);
        assert!(notes.is_empty(), "{notes:?}");
        let spec = services[0].spec.as_ref().expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.0.10"));
    }

    #[test]
    fn empty_file_is_fine() {
        let FileObjects {
            services,
            endpoint_slices: slices,
            notes,
            ..
        } = parse("empty.yaml", "").expect("parses");
        assert!(services.is_empty() && slices.is_empty() && notes.is_empty());
        let FileObjects { services, .. } =
            parse("comments.yaml", "# nothing here\n").expect("parses");
        assert!(services.is_empty());
    }

    #[test]
    fn kubectl_list_is_expanded_and_feeds_the_model() {
        let text = include_str!("../../tests/fixtures/manifests/kubectl-get-list.yaml");
        let FileObjects {
            services,
            endpoint_slices: slices,
            notes,
            ..
        } = parse("list.yaml", text).expect("parses");
        assert_eq!(names(&services), ["shop/web"]);
        assert_eq!(names(&slices), ["shop/web-x7k2p"]);
        assert_eq!(
            notes,
            ["list.yaml: document 1, List item 2: skipped ConfigMap shop/web-config (only Services, EndpointSlices and Nodes are read)"]
        );
        let (state, warnings) = crate::model::build(&services, &slices);
        assert!(warnings.is_empty(), "{warnings:?}");
        let lines: Vec<String> = state.frontends.values().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            [
                "10.96.0.10:7/UDP ClusterIP shop/web:echo -> 10.244.1.2:7007",
                "10.96.0.10:80/TCP ClusterIP shop/web:http -> 10.244.1.2:8080",
            ]
        );
    }

    #[test]
    fn typed_list_items_get_kind_and_api_version() {
        let text = r#"
apiVersion: v1
kind: ServiceList
items:
- metadata: {name: a, namespace: x}
  spec: {clusterIP: 10.96.0.1}
- metadata: {name: b}
  spec: {clusterIP: 10.96.0.2}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSliceList
items:
- metadata: {name: a-1, namespace: x, labels: {kubernetes.io/service-name: a}}
  addressType: IPv4
  endpoints: null
---
apiVersion: v1
kind: List
items: []
"#;
        let FileObjects {
            services,
            endpoint_slices: slices,
            notes,
            ..
        } = parse("typed.yaml", text).expect("parses");
        assert_eq!(names(&services), ["x/a", "default/b"]);
        assert_eq!(names(&slices), ["x/a-1"]);
        assert!(slices[0].endpoints.is_empty());
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn other_kinds_are_skipped_with_a_note() {
        let text = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data: {a: b}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec: {}
---
apiVersion: v1
kind: Endpoints
metadata: {name: web}
---
apiVersion: discovery.k8s.io/v1beta1
kind: EndpointSlice
metadata: {name: old}
addressType: IPv4
endpoints: []
---
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Secret, metadata: {name: s}}
"#;
        let FileObjects {
            services,
            endpoint_slices: slices,
            notes,
            ..
        } = parse("mixed.yaml", text).expect("parses");
        assert!(services.is_empty() && slices.is_empty());
        assert_eq!(
            notes,
            [
                "mixed.yaml: document 1: skipped ConfigMap settings (only Services, EndpointSlices and Nodes are read)",
                "mixed.yaml: document 2: skipped Deployment shop/web (only Services, EndpointSlices and Nodes are read)",
                "mixed.yaml: document 3: skipped Endpoints web: switchboard reads EndpointSlices (discovery.k8s.io/v1), not Endpoints",
                "mixed.yaml: document 4: skipped EndpointSlice old: apiVersion discovery.k8s.io/v1beta1 is not supported (use discovery.k8s.io/v1)",
                "mixed.yaml: document 5, List item 0: skipped Secret s (only Services, EndpointSlices and Nodes are read)",
            ]
        );
    }

    #[test]
    fn json_files() {
        let text = r#"{"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
             "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}}]}
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web2"}}"#;
        let FileObjects { services, .. } = parse("objs.json", text).expect("parses");
        assert_eq!(names(&services), ["default/web", "default/web2"]);

        let err = parse("bad.json", "{\"kind\": ").expect_err("truncated JSON");
        assert!(
            matches!(
                err,
                ManifestError::Syntax {
                    document: 1,
                    error: SyntaxError::Json(_),
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn malformed_files_name_the_file_and_the_problem() {
        // YAML syntax error in the second document.
        let err = parse(
            "dir/broken.yaml",
            &format!("{SERVICE}---\nkind: Service\n  bad: [indent\n"),
        )
        .expect_err("syntax");
        assert!(
            matches!(
                err,
                ManifestError::Syntax {
                    document: 2,
                    error: SyntaxError::Yaml(_),
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.path(), Path::new("dir/broken.yaml"));
        let msg = err.to_string();
        assert!(
            msg.starts_with("dir/broken.yaml: document 2: syntax error: "),
            "{msg}"
        );

        // A Service that does not match the schema: names kind and name.
        let err = parse(
            "bad-svc.yaml",
            "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {ports: [{port: eighty}]}\n",
        )
        .expect_err("schema");
        match &err {
            ManifestError::Invalid(inv) => {
                assert_eq!(
                    (
                        inv.document,
                        inv.item,
                        inv.kind.as_str(),
                        inv.name.as_deref(),
                        inv.field.as_str()
                    ),
                    (1, None, "Service", Some("web"), "spec.ports[0].port")
                );
            }
            other => panic!("wrong error {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            "bad-svc.yaml: document 1: Service web: spec.ports[0].port: invalid type: string \"eighty\", expected i32"
        );

        // Inside a List: the item is named.
        let err = parse(
            "bad-list.yaml",
            "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: discovery.k8s.io/v1, kind: EndpointSlice, metadata: {name: s}, addressType: IPv4, endpoints: [{addresses: 5}]}\n",
        )
        .expect_err("schema in list");
        assert!(
            err.to_string().starts_with(
                "bad-list.yaml: document 1, List item 0: EndpointSlice s: endpoints[0].addresses: "
            ),
            "{err}"
        );

        // Not Kubernetes objects at all.
        let err = parse("scalar.yaml", "just a string\n").expect_err("scalar");
        assert_eq!(
            err.to_string(),
            "scalar.yaml: document 1: is not a mapping (a Kubernetes object)"
        );
        let err =
            parse("nokind.yaml", "apiVersion: v1\nmetadata: {name: x}\n").expect_err("no kind");
        assert_eq!(err.to_string(), "nokind.yaml: document 1: has no kind");
        let err =
            parse("noapi.yaml", "kind: Service\nmetadata: {name: x}\n").expect_err("no apiVersion");
        assert_eq!(
            err.to_string(),
            "noapi.yaml: document 1: Service has no apiVersion"
        );

        // Not UTF-8, and a file that is not there.
        let err = parse_manifests(Path::new("bin.yaml"), b"\xff\xfe").expect_err("not utf-8");
        assert!(
            matches!(err, ManifestError::Read { .. })
                && err
                    .to_string()
                    .starts_with("bin.yaml: cannot read the file: ")
        );
        let err = load_file(Path::new("/nonexistent/switchboard/x.yaml")).expect_err("missing");
        assert!(
            err.to_string()
                .starts_with("/nonexistent/switchboard/x.yaml: cannot read the file: "),
            "{err}"
        );
    }

    #[test]
    fn manifest_names() {
        for ok in ["a.yaml", "b.yml", "c.json", "d.YAML"] {
            assert!(is_manifest_name(Path::new(ok)), "{ok}");
        }
        for no in [
            ".a.yaml",
            ".a.yaml.swp",
            "a.yaml~",
            "a.txt",
            "..data",
            "yaml",
            "4913",
        ] {
            assert!(!is_manifest_name(Path::new(no)), "{no}");
        }
    }

    /// A fresh directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> TempDir {
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

    #[test]
    fn same_object_in_two_files_first_path_wins() {
        let tmp = TempDir::new("dup");
        std::fs::write(
            tmp.0.join("b.yaml"),
            SERVICE.replace("10.96.0.10", "10.96.0.99"),
        )
        .expect("write");
        std::fs::write(tmp.0.join("a.yaml"), SERVICE).expect("write");
        let mut state = DirState::new(tmp.0.clone(), "node-a".to_string());
        assert!(state.scan(true));
        let snap = state.snapshot();
        assert_eq!(snap.services.len(), 1);
        let ip = snap.services[0]
            .spec
            .as_ref()
            .and_then(|s| s.cluster_ip.clone());
        assert_eq!(ip.as_deref(), Some("10.96.0.10"));
        assert!(!state.scan(true), "nothing changed");
        assert!(!state.scan(false), "nothing changed");
    }

    const NODE_A: &str = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node-a\n  labels: {topology.kubernetes.io/zone: zone-1}\nstatus:\n  addresses:\n  - {type: Hostname, address: node-a}\n  - {type: ExternalIP, address: 203.0.113.7}\n  - {type: InternalIP, address: 192.168.1.10}\n  - {type: InternalIP, address: 'fd00::10'}\n";

    fn node_b() -> String {
        NODE_A
            .replace("node-a", "node-b")
            .replace("192.168.1.10", "192.168.1.11")
    }

    #[test]
    fn nodes_are_read_cluster_scoped() {
        let text = format!(
            "{NODE_A}---\n{}",
            node_b().replace("name: node-b", "name: node-b\n  namespace: shop")
        );
        let FileObjects { nodes, notes, .. } = parse("nodes.yaml", &text).expect("parses");
        let names: Vec<_> = nodes
            .iter()
            .map(|n| (n.metadata.name.as_deref(), n.metadata.namespace.as_deref()))
            .collect();
        assert_eq!(names, [(Some("node-a"), None), (Some("node-b"), None)]);
        assert!(notes.is_empty(), "{notes:?}");

        let text = "apiVersion: v1\nkind: NodeList\nitems:\n- metadata: {name: n1}\n";
        let FileObjects { nodes, .. } = parse("nodelist.yaml", text).expect("parses");
        assert_eq!(nodes.len(), 1);

        let FileObjects { nodes, notes, .. } = parse(
            "old.yaml",
            "apiVersion: v2\nkind: Node\nmetadata: {name: n1}\n",
        )
        .expect("parses");
        assert!(nodes.is_empty());
        assert_eq!(
            notes,
            ["old.yaml: document 1: skipped Node n1: apiVersion v2 is not supported (use v1)"]
        );
    }

    #[test]
    fn the_node_of_this_name_fills_node() {
        let tmp = TempDir::new("node");
        std::fs::write(
            tmp.0.join("nodes.yaml"),
            format!("{}---\n{NODE_A}", node_b()),
        )
        .expect("write");
        std::fs::write(tmp.0.join("svc.yaml"), SERVICE).expect("write");
        let mut state = DirState::new(tmp.0.clone(), "node-a".to_string());
        assert!(state.scan(true));
        let snap = state.snapshot();
        assert_eq!(snap.services.len(), 1);
        assert_eq!(
            snap.node,
            Some(NodeInfo {
                name: "node-a".to_string(),
                // InternalIP first, then ExternalIP; IPv6 and Hostname left out.
                addresses: vec![
                    std::net::Ipv4Addr::new(192, 168, 1, 10),
                    std::net::Ipv4Addr::new(203, 0, 113, 7)
                ],
                zone: Some("zone-1".to_string()),
                deleting: false,
            })
        );
    }

    #[test]
    fn another_nodes_node_is_not_used() {
        let tmp = TempDir::new("other-node");
        std::fs::write(tmp.0.join("node-b.yaml"), node_b()).expect("write");
        let mut state = DirState::new(tmp.0.clone(), "node-a".to_string());
        assert!(state.scan(true), "the Node is kept");
        assert_eq!(state.snapshot().node, None);
        // A directory shared by several nodes: each agent picks its own.
        let mut b = DirState::new(tmp.0.clone(), "node-b".to_string());
        assert!(b.scan(true));
        assert_eq!(
            b.snapshot().node.map(|n| n.addresses),
            Some(vec![
                std::net::Ipv4Addr::new(192, 168, 1, 11),
                std::net::Ipv4Addr::new(203, 0, 113, 7)
            ])
        );
    }

    #[test]
    fn same_node_in_two_files_first_path_wins() {
        let tmp = TempDir::new("dup-node");
        std::fs::write(
            tmp.0.join("b.yaml"),
            NODE_A.replace("192.168.1.10", "192.168.1.99"),
        )
        .expect("write");
        std::fs::write(tmp.0.join("a.yaml"), NODE_A).expect("write");
        let mut state = DirState::new(tmp.0.clone(), "node-a".to_string());
        assert!(state.scan(true));
        let addresses = state.snapshot().node.map(|n| n.addresses);
        assert_eq!(
            addresses.as_ref().and_then(|a| a.first()),
            Some(&std::net::Ipv4Addr::new(192, 168, 1, 10))
        );
    }

    #[test]
    fn malformed_node_names_the_file_and_field() {
        let err = parse(
            "node.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nstatus: {addresses: [{type: InternalIP, address: [10]}]}\n",
        )
        .expect_err("schema");
        match &err {
            ManifestError::Invalid(inv) => assert_eq!(
                (
                    inv.document,
                    inv.kind.as_str(),
                    inv.name.as_deref(),
                    inv.field.as_str()
                ),
                (1, "Node", Some("node-a"), "status.addresses[0].address")
            ),
            other => panic!("wrong error {other:?}"),
        }
        assert!(
            err.to_string()
                .starts_with("node.yaml: document 1: Node node-a: status.addresses[0].address: invalid type: sequence"),
            "{err}"
        );
    }

    fn service_ips(snap: &Snapshot) -> Vec<String> {
        let mut ips: Vec<String> = snap
            .services
            .iter()
            .filter_map(|s| s.spec.as_ref()?.cluster_ip.clone())
            .collect();
        ips.sort();
        ips
    }

    /// Waits (at most `limit`) until the snapshot satisfies `want`.
    async fn observe(
        rx: &mut watch::Receiver<Arc<Snapshot>>,
        limit: Duration,
        what: &str,
        want: impl Fn(&Snapshot) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if want(&rx.borrow_and_update()) {
                return;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => panic!("{what}: the watcher stopped"),
                Err(_) => panic!(
                    "{what}: not observed within {limit:?}; snapshot has services {:?}",
                    service_ips(&rx.borrow())
                ),
            }
        }
    }

    fn svc(ip: &str) -> String {
        SERVICE.replace("10.96.0.10", ip)
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

        let mut rx = watch_dir(dir.clone(), "node-a".to_string())
            .await
            .expect("watch_dir");
        {
            let snap = rx.borrow_and_update();
            assert_eq!(
                service_ips(&snap),
                ["10.96.0.1"],
                "the initial snapshot is there at once"
            );
            assert_eq!(snap.endpoint_slices.len(), 1);
        }
        let second = Duration::from_secs(1);

        // Add a file (the Service name differs, so both stay).
        std::fs::write(
            dir.join("b.yml"),
            svc("10.96.0.2").replace("name: web", "name: web2"),
        )
        .expect("write");
        observe(&mut rx, second, "added file", |s| {
            service_ips(s) == ["10.96.0.1", "10.96.0.2"]
        })
        .await;

        // Edit it.
        std::fs::write(
            dir.join("b.yml"),
            svc("10.96.0.3").replace("name: web", "name: web2"),
        )
        .expect("write");
        observe(&mut rx, second, "edited file", |s| {
            service_ips(s) == ["10.96.0.1", "10.96.0.3"]
        })
        .await;

        // Break it: the last good objects stay (give the watcher time to have read it).
        std::fs::write(
            dir.join("b.yml"),
            "apiVersion: v1\nkind: Service\nmetadata: {name: [oops\n",
        )
        .expect("write");
        tokio::time::sleep(DEBOUNCE * 5).await;
        assert_eq!(
            service_ips(&rx.borrow_and_update()),
            ["10.96.0.1", "10.96.0.3"]
        );

        // Fix it again, atomically (write a hidden temporary file, rename over).
        let tmp_file = dir.join(".b.yml.tmp");
        std::fs::write(
            &tmp_file,
            svc("10.96.0.4").replace("name: web", "name: web2"),
        )
        .expect("write");
        std::fs::rename(&tmp_file, dir.join("b.yml")).expect("rename");
        observe(&mut rx, second, "fixed by rename", |s| {
            service_ips(s) == ["10.96.0.1", "10.96.0.4"]
        })
        .await;

        // Delete a file: its objects go away (the broken-then-fixed one too).
        std::fs::remove_file(dir.join("a.yaml")).expect("remove");
        observe(&mut rx, second, "deleted file", |s| {
            service_ips(s) == ["10.96.0.4"] && s.endpoint_slices.is_empty()
        })
        .await;

        // A file that is broken from the start contributes nothing, the rest stays.
        std::fs::write(dir.join("c.yaml"), "kind: [\n").expect("write");
        tokio::time::sleep(DEBOUNCE * 5).await;
        assert_eq!(service_ips(&rx.borrow_and_update()), ["10.96.0.4"]);

        std::fs::remove_file(dir.join("b.yml")).expect("remove");
        observe(&mut rx, second, "last file deleted", |s| {
            s.services.is_empty()
        })
        .await;
        drop(rx);
    }

    #[tokio::test]
    async fn watch_dir_follows_this_nodes_node() {
        let tmp = TempDir::new("watch-node");
        let dir = tmp.0.clone();
        std::fs::write(dir.join("svc.yaml"), SERVICE).expect("write");
        let mut rx = watch_dir(dir.clone(), "node-a".to_string())
            .await
            .expect("watch_dir");
        assert_eq!(rx.borrow_and_update().node, None);
        let second = Duration::from_secs(1);
        std::fs::write(dir.join("node.yaml"), NODE_A).expect("write");
        observe(&mut rx, second, "Node added", |s| {
            s.node.as_ref().is_some_and(|n| n.name == "node-a")
        })
        .await;
        std::fs::remove_file(dir.join("node.yaml")).expect("remove");
        observe(&mut rx, second, "Node removed", |s| s.node.is_none()).await;
    }

    #[tokio::test]
    async fn watch_dir_rejects_a_missing_directory() {
        let err = watch_dir(
            PathBuf::from("/nonexistent/switchboard-manifests"),
            "node-a".to_string(),
        )
        .await
        .expect_err("missing dir");
        assert!(
            format!("{err:#}").contains("/nonexistent/switchboard-manifests"),
            "{err:#}"
        );
    }

    /// The fallback rescan alone (no file-system events) picks up changes.
    #[test]
    fn periodic_rescan_sees_metadata_changes() {
        let tmp = TempDir::new("rescan");
        let path = tmp.0.join("a.yaml");
        std::fs::write(&path, svc("10.96.0.1")).expect("write");
        let mut state = DirState::new(tmp.0.clone(), "node-a".to_string());
        assert!(state.scan(false));
        std::fs::write(&path, svc("10.96.0.2")).expect("write");
        assert!(state.scan(false));
        assert_eq!(service_ips(&state.snapshot()), ["10.96.0.2"]);
        std::fs::remove_file(&path).expect("remove");
        assert!(state.scan(false));
        assert!(state.snapshot().services.is_empty());
    }
}
