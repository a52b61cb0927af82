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
//! * This node: the Node whose `metadata.name` is the agent's node name is the
//!   one recorded (NodePort frontends, `Local` traffic policies, topology).
//!   Nodes with other names are read but not kept, so one directory can serve
//!   several nodes. Without a matching Node there is none: no NodePort
//!   frontends, and `Local` policies act as `Cluster`.
//! * Errors: a file that cannot be read or parsed is reported (naming the file,
//!   the document and the problem) and, while it stays broken, the objects it
//!   last held when it was good stay in effect. The file is all or nothing:
//!   one bad document keeps the whole file at its last good state.
//! * The same object (kind, namespace, name; kind and name for a Node) in two
//!   files: the one in the file whose path sorts first is used; the other is
//!   reported and ignored. Twice in one file: the first copy is used.
//! * Changes: each file's objects are converted to the model's input types
//!   ([`ServiceInfo`], [`SliceInfo`], [`NodeInfo`]) as soon as the file parses,
//!   and the k8s-openapi objects dropped. The first scan records the complete
//!   view into the [`FeedTx`]; after that a rescan compares only the keys of
//!   the files that changed, and records the objects whose version in effect
//!   changed (added, changed, removed).

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
use tracing::{debug, error, info, warn};

use super::feed::FeedTx;
use crate::model::{Interner, NodeInfo, ObjectKey, ServiceInfo, SliceInfo};

/// How long to wait after a file-system event for more to arrive before rescanning.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// The fallback rescan, in case an event is missed (it compares file metadata,
/// and reads only files whose size, modification time or inode changed).
pub const RESCAN_INTERVAL: Duration = Duration::from_secs(1);

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

/// An object the source finds by its key.
trait Keyed {
    fn key(&self) -> &ObjectKey;
}

impl Keyed for ServiceInfo {
    fn key(&self) -> &ObjectKey {
        &self.key
    }
}

impl Keyed for SliceInfo {
    fn key(&self) -> &ObjectKey {
        &self.key
    }
}

/// What one file contributes, converted as soon as the file parsed: the
/// k8s-openapi objects are dropped then, so the source holds only what the
/// model reads, and at most one file's k8s objects at a time.
#[derive(Debug, Default, PartialEq)]
struct FileView {
    /// In key order, one per key.
    services: Vec<Arc<ServiceInfo>>,
    /// In key order, one per key.
    slices: Vec<Arc<SliceInfo>>,
    /// The Node named like this node; Nodes of other names are not kept.
    node: Option<Arc<NodeInfo>>,
}

impl FileView {
    /// Converts a parsed file. An object the file holds twice keeps its first
    /// copy, as an object in two files keeps the first path's.
    fn convert(
        path: &Path,
        objects: FileObjects,
        node_name: &str,
        interner: &mut Interner,
    ) -> FileView {
        let FileObjects {
            services,
            endpoint_slices,
            nodes,
            ..
        } = objects;
        // `into_iter`: each k8s object is dropped as soon as it is converted.
        let services = services
            .into_iter()
            .map(|svc| Arc::new(ServiceInfo::from_k8s(&svc)))
            .collect();
        let slices = endpoint_slices
            .into_iter()
            .map(|slice| Arc::new(SliceInfo::from_k8s(&slice, interner)))
            .collect();
        let mut this_node = nodes
            .iter()
            .filter(|n| n.metadata.name.as_deref() == Some(node_name));
        let node = this_node.next().map(|n| Arc::new(NodeInfo::from_node(n)));
        if this_node.next().is_some() {
            warn!(
                "{}: Node {node_name} is defined twice in this file; the later copy is ignored",
                path.display()
            );
        }
        FileView {
            services: first_per_key(path, "Service", services),
            slices: first_per_key(path, "EndpointSlice", slices),
            node,
        }
    }

    fn is_empty(&self) -> bool {
        self.services.is_empty() && self.slices.is_empty() && self.node.is_none()
    }
}

/// Sorts by key and keeps the first copy of each key (the sort is stable),
/// reporting the others.
fn first_per_key<T: Keyed>(path: &Path, kind: &str, mut objects: Vec<Arc<T>>) -> Vec<Arc<T>> {
    objects.sort_by(|a, b| a.key().cmp(b.key()));
    objects.dedup_by(|later, kept| {
        let twice = later.key() == kept.key();
        if twice {
            warn!(
                "{}: {kind} {} is defined twice in this file; the later copy is ignored",
                path.display(),
                later.key()
            );
        }
        twice
    });
    objects
}

/// The files holding one object, in path order: the first one's copy is used.
#[derive(Debug)]
struct Owners<T>(Vec<(Arc<Path>, Arc<T>)>);

impl<T> Default for Owners<T> {
    fn default() -> Self {
        Owners(Vec::new())
    }
}

impl<T> Owners<T> {
    fn used(&self) -> Option<&Arc<T>> {
        self.0.first().map(|(_, obj)| obj)
    }

    /// Adds `path`'s copy. When another file holds the object too, returns
    /// (the path whose copy is used, the path whose copy is now ignored).
    fn insert(&mut self, path: &Arc<Path>, obj: Arc<T>) -> Option<(Arc<Path>, Arc<Path>)> {
        let at = match self.0.binary_search_by(|(p, _)| p.cmp(path)) {
            // Not expected (a changed file's old copies go first); replace.
            Ok(at) => {
                self.0[at].1 = obj;
                return None;
            }
            Err(at) => at,
        };
        self.0.insert(at, (Arc::clone(path), obj));
        let ignored = if at == 0 {
            self.0.get(1)
        } else {
            Some(&self.0[at])
        };
        Some((Arc::clone(&self.0[0].0), Arc::clone(&ignored?.0)))
    }

    fn remove(&mut self, path: &Path) {
        self.0.retain(|(p, _)| **p != *path);
    }
}

/// Services (or EndpointSlices) by key, with the files that hold each.
struct Index<T> {
    kind: &'static str,
    by_key: BTreeMap<ObjectKey, Owners<T>>,
}

impl<T: Keyed> Index<T> {
    fn new(kind: &'static str) -> Index<T> {
        Index {
            kind,
            by_key: BTreeMap::new(),
        }
    }

    /// The copy in effect: the first path's.
    fn used(&self, key: &ObjectKey) -> Option<&Arc<T>> {
        self.by_key.get(key).and_then(Owners::used)
    }

    fn insert(&mut self, path: &Arc<Path>, obj: Arc<T>) {
        let Some(owners) = self.by_key.get_mut(obj.key()) else {
            self.by_key
                .insert(obj.key().clone(), Owners(vec![(Arc::clone(path), obj)]));
            return;
        };
        let key = obj.key().clone();
        if let Some((used, ignored)) = owners.insert(path, obj) {
            warn!(
                "{}: {} {key} is also defined in {}; this copy is ignored",
                ignored.display(),
                self.kind,
                used.display()
            );
        }
    }

    fn remove(&mut self, path: &Path, key: &ObjectKey) {
        if let Some(owners) = self.by_key.get_mut(key) {
            owners.remove(path);
            if owners.0.is_empty() {
                self.by_key.remove(key);
            }
        }
    }

    /// Every key with the copy in effect.
    fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &Arc<T>)> {
        self.by_key
            .iter()
            .filter_map(|(key, owners)| Some((key, owners.used()?)))
    }
}

#[derive(Default)]
struct FileState {
    fingerprint: Option<Fingerprint>,
    content_hash: Option<u64>,
    /// The objects from the last time this file parsed.
    good: Option<FileView>,
    /// The current problem, if the file is broken (logged once per change).
    error: Option<String>,
}

/// A file whose objects changed: its new objects (`None`: the file is gone).
struct FileChange {
    path: Arc<Path>,
    view: Option<FileView>,
}

/// What a scan found for one directory entry.
enum Checked {
    /// Not a regular file, or gone meanwhile.
    Absent,
    /// There, and its objects are as they were (or it is broken, keeping them).
    Unchanged,
    /// There, with these new objects.
    Changed(Arc<Path>, FileView),
}

/// For every key a scan touched, the object in effect before it: what the
/// agent was last told, since every scan that changed something is recorded.
#[derive(Default)]
struct Before {
    services: BTreeMap<ObjectKey, Option<Arc<ServiceInfo>>>,
    slices: BTreeMap<ObjectKey, Option<Arc<SliceInfo>>>,
    /// `Some` when a changed file held this node's Node (before or after).
    node: Option<Option<Arc<NodeInfo>>>,
}

impl Before {
    /// Notes the keys of `view` (a changed file's old or new objects) that
    /// are not noted yet, before anything of this scan changes them.
    fn note(&mut self, state: &DirState, view: Option<&FileView>) {
        let Some(view) = view else { return };
        note_keys(&mut self.services, &state.services, &view.services);
        note_keys(&mut self.slices, &state.slices, &view.slices);
        if view.node.is_some() && self.node.is_none() {
            self.node = Some(state.node.used().cloned());
        }
    }
}

fn note_keys<T: Keyed>(
    noted: &mut BTreeMap<ObjectKey, Option<Arc<T>>>,
    index: &Index<T>,
    objects: &[Arc<T>],
) {
    for obj in objects {
        if !noted.contains_key(obj.key()) {
            noted.insert(obj.key().clone(), index.used(obj.key()).cloned());
        }
    }
}

/// Records the keys whose object in effect differs from the noted one.
fn record_keys<T: Keyed + PartialEq>(
    before: BTreeMap<ObjectKey, Option<Arc<T>>>,
    index: &Index<T>,
    mut record: impl FnMut(ObjectKey, Option<Arc<T>>),
) -> usize {
    let mut recorded = 0;
    for (key, old) in before {
        let new = index.used(&key);
        if !same(old.as_ref(), new) {
            record(key, new.cloned());
            recorded += 1;
        }
    }
    recorded
}

/// The same version: the same allocation, or equal.
fn same<T: PartialEq>(a: Option<&Arc<T>>, b: Option<&Arc<T>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        _ => false,
    }
}

/// The directory as last read, and the objects in effect.
struct DirState {
    dir: PathBuf,
    /// The agent's node name: the Node of this name is the one recorded.
    node_name: String,
    files: BTreeMap<Arc<Path>, FileState>,
    services: Index<ServiceInfo>,
    slices: Index<SliceInfo>,
    /// This node's Node, by file.
    node: Owners<NodeInfo>,
    /// Node names in endpoints, shared across all files.
    interner: Interner,
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
            services: Index::new("Service"),
            slices: Index::new("EndpointSlice"),
            node: Owners::default(),
            interner: Interner::default(),
            dir_id: None,
            dir_error: None,
        }
    }

    /// The first scan: records every object in effect, and this node's Node
    /// (also when there is none). Returns how many objects it recorded.
    fn first(&mut self, feed: &FeedTx) -> usize {
        let changes = self.scan(true);
        self.apply(changes, None);
        for (key, svc) in self.services.iter() {
            feed.service(key.clone(), Some(Arc::clone(svc)));
        }
        for (key, slice) in self.slices.iter() {
            feed.slice(key.clone(), Some(Arc::clone(slice)));
        }
        let node = self.node.used();
        log_node_change(self, None, node.map(|n| &**n), true);
        feed.node(node.map(|n| NodeInfo::clone(n)));
        self.services.by_key.len() + self.slices.by_key.len() + 1
    }

    /// Rescans (see [`scan`](Self::scan)) and records into `feed` each object
    /// whose version in effect changed: added, changed or removed. Only the
    /// changed files' keys are compared, so one edited file costs its own
    /// objects, whatever the directory holds. Returns how many it recorded.
    fn refresh(&mut self, read_all: bool, feed: &FeedTx) -> usize {
        let changes = self.scan(read_all);
        if changes.is_empty() {
            return 0;
        }
        let mut before = Before::default();
        if self.apply(changes, Some(&mut before)) {
            self.interner.prune();
        }
        self.record(before, feed)
    }

    /// Records the noted keys whose object in effect is another version now.
    fn record(&self, before: Before, feed: &FeedTx) -> usize {
        let mut recorded = record_keys(before.services, &self.services, |k, v| {
            feed.service(k, v);
        });
        recorded += record_keys(before.slices, &self.slices, |k, v| feed.slice(k, v));
        if let Some(old) = before.node {
            let new = self.node.used();
            if !same(old.as_ref(), new) {
                log_node_change(self, old.as_deref(), new.map(|n| &**n), false);
                feed.node(new.map(|n| NodeInfo::clone(n)));
                recorded += 1;
            }
        }
        recorded
    }

    /// Puts the changed files' objects in effect. With `before`, first notes
    /// what each touched key had. Returns whether objects were dropped (then
    /// interned names may have lost their last user).
    fn apply(&mut self, changes: Vec<FileChange>, mut before: Option<&mut Before>) -> bool {
        let mut dropped = false;
        // Every changed file's old objects go first, so an object moving
        // between two files in one scan is not reported as defined twice.
        for change in &changes {
            let old = match &change.view {
                None => self.files.remove(&change.path).and_then(|f| f.good),
                Some(_) => self.files.get_mut(&change.path).and_then(|f| f.good.take()),
            };
            if let Some(before) = before.as_deref_mut() {
                before.note(self, old.as_ref());
                before.note(self, change.view.as_ref());
            }
            if let Some(old) = old {
                dropped |= !old.is_empty();
                self.remove_view(&change.path, &old);
            }
        }
        // In path order (`scan` sorts), so the first path's copy is the one
        // reported as used.
        for FileChange { path, view } in changes {
            let Some(view) = view else { continue };
            self.insert_view(&path, &view);
            if let Some(f) = self.files.get_mut(&path) {
                f.good = Some(view);
            }
        }
        dropped
    }

    fn remove_view(&mut self, path: &Path, view: &FileView) {
        for svc in &view.services {
            self.services.remove(path, &svc.key);
        }
        for slice in &view.slices {
            self.slices.remove(path, &slice.key);
        }
        if view.node.is_some() {
            self.node.remove(path);
        }
    }

    fn insert_view(&mut self, path: &Arc<Path>, view: &FileView) {
        for svc in &view.services {
            self.services.insert(path, Arc::clone(svc));
        }
        for slice in &view.slices {
            self.slices.insert(path, Arc::clone(slice));
        }
        if let Some(node) = &view.node {
            if let Some((used, ignored)) = self.node.insert(path, Arc::clone(node)) {
                warn!(
                    "{}: Node {} is also defined in {}; this copy is ignored",
                    ignored.display(),
                    self.node_name,
                    used.display()
                );
            }
        }
    }

    /// Reads what changed in the directory. With `read_all`, every file is
    /// read and compared by content; otherwise only files whose metadata
    /// changed. Returns the files whose objects changed, in path order.
    fn scan(&mut self, read_all: bool) -> Vec<FileChange> {
        let Some(entries) = self.read_dir() else {
            return Vec::new();
        };
        let mut changes = Vec::new();
        let mut seen = BTreeSet::new();
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let path = entry.path();
            if !is_manifest_name(&path) {
                continue;
            }
            match self.check_file(&path, read_all) {
                Checked::Absent => continue,
                Checked::Unchanged => {}
                Checked::Changed(key, view) => changes.push(FileChange {
                    path: key,
                    view: Some(view),
                }),
            }
            seen.insert(path);
        }
        for (path, f) in &self.files {
            if !seen.contains(&**path) {
                info!(file = %path.display(), "manifest file removed; its objects are gone");
                if f.good.is_some() {
                    changes.push(FileChange {
                        path: Arc::clone(path),
                        view: None,
                    });
                }
            }
        }
        // A file gone while broken from the start held nothing: forget it here.
        self.files
            .retain(|path, f| f.good.is_some() || seen.contains(&**path));
        changes.sort_by(|a, b| a.path.cmp(&b.path));
        changes
    }

    /// Lists the directory; `None` (logged once) when it cannot be read,
    /// keeping the objects last read from it.
    fn read_dir(&mut self) -> Option<std::fs::ReadDir> {
        match std::fs::read_dir(&self.dir) {
            Ok(entries) => {
                if self.dir_error.take().is_some() {
                    info!(dir = %self.dir.display(), "manifest directory is readable again");
                }
                Some(entries)
            }
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
                None
            }
        }
    }

    /// Reads one manifest file if its metadata (or, with `read_all`, its
    /// content) changed, and converts its objects.
    fn check_file(&mut self, path: &Path, read_all: bool) -> Checked {
        // metadata() follows symlinks, so ConfigMap-style links are read through.
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Checked::Absent, // gone, or a dangling link
            Err(error) => {
                let path = path.to_path_buf();
                self.file_error(ManifestError::Read { path, error }, None);
                return Checked::Unchanged;
            }
        };
        if !meta.is_file() {
            return Checked::Absent;
        }
        let fingerprint = Fingerprint::of(&meta);
        if !read_all
            && self
                .files
                .get(path)
                .is_some_and(|f| f.fingerprint == Some(fingerprint))
        {
            return Checked::Unchanged;
        }
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Checked::Absent,
            Err(error) => {
                let path = path.to_path_buf();
                self.file_error(ManifestError::Read { path, error }, Some(fingerprint));
                return Checked::Unchanged;
            }
        };
        let key = match self.files.get_key_value(path) {
            Some((key, _)) => Arc::clone(key),
            None => Arc::from(path),
        };
        let hash = content_hash(&bytes);
        let f = self.files.entry(Arc::clone(&key)).or_default();
        f.fingerprint = Some(fingerprint);
        if f.content_hash.replace(hash) == Some(hash) {
            return Checked::Unchanged;
        }
        match parse_manifests(path, &bytes) {
            Ok(objects) => {
                drop(bytes);
                self.loaded(key, objects)
            }
            Err(e) => {
                self.file_error(e, None);
                Checked::Unchanged
            }
        }
    }

    /// Logs a file that parsed and converts its objects.
    fn loaded(&mut self, path: Arc<Path>, objects: FileObjects) -> Checked {
        for note in &objects.notes {
            info!("{note}");
        }
        info!(
            file = %path.display(),
            services = objects.services.len(),
            endpoint_slices = objects.endpoint_slices.len(),
            nodes = objects.nodes.len(),
            "manifest file loaded"
        );
        let view = FileView::convert(&path, objects, &self.node_name, &mut self.interner);
        let Some(f) = self.files.get_mut(&path) else {
            return Checked::Unchanged; // unreachable: `check_file` made it
        };
        f.error = None;
        if f.good.as_ref() == Some(&view) {
            return Checked::Unchanged;
        }
        Checked::Changed(path, view)
    }

    /// Records (and logs, once per distinct problem) a broken file, keeping its last good objects.
    fn file_error(&mut self, err: ManifestError, fingerprint: Option<Fingerprint>) {
        let f = self.files.entry(Arc::from(err.path())).or_default();
        if fingerprint.is_some() {
            f.fingerprint = fingerprint;
        }
        let msg = err.to_string();
        if f.error.as_deref() != Some(msg.as_str()) {
            match &f.good {
                Some(good) => error!(
                    "{msg}; keeping this file's last good objects ({} Services, {} EndpointSlices{})",
                    good.services.len(),
                    good.slices.len(),
                    if good.node.is_some() { ", this node's Node" } else { "" }
                ),
                None => error!("{msg}; nothing from this file is used"),
            }
            f.error = Some(msg);
        }
    }

    /// The directory's (device, inode), to notice it being replaced.
    fn current_dir_id(&self) -> Option<(u64, u64)> {
        std::fs::metadata(&self.dir)
            .ok()
            .map(|m| (m.dev(), m.ino()))
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
    use crate::source::feed::{feed, Changes, FeedRx};
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

    /// What the agent builds from the feed: the recorded changes applied in turn.
    #[derive(Debug, Default)]
    struct View {
        services: BTreeMap<ObjectKey, Arc<ServiceInfo>>,
        slices: BTreeMap<ObjectKey, Arc<SliceInfo>>,
        node: Option<NodeInfo>,
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
        fn apply(&mut self, changes: &Changes) {
            apply_map(&mut self.services, &changes.services);
            apply_map(&mut self.slices, &changes.slices);
            if let Some(node) = &changes.node {
                self.node.clone_from(node);
            }
        }

        /// Every Service's cluster IPs, sorted.
        fn service_ips(&self) -> Vec<String> {
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

    /// A directory state with its feed, and the view built from the feed.
    struct Fixture {
        state: DirState,
        tx: FeedTx,
        rx: FeedRx,
        view: View,
    }

    impl Fixture {
        fn new(dir: &Path, node_name: &str) -> Fixture {
            let (tx, rx) = feed();
            Fixture {
                state: DirState::new(dir.to_path_buf(), node_name.to_string()),
                tx,
                rx,
                view: View::default(),
            }
        }

        /// The first scan; returns what it recorded.
        fn first(&mut self) -> Changes {
            let recorded = self.state.first(&self.tx);
            let changes = self.take();
            assert_eq!(recorded, changes.len());
            changes
        }

        /// A rescan; returns what it recorded.
        fn refresh(&mut self, read_all: bool) -> Changes {
            let recorded = self.state.refresh(read_all, &self.tx);
            let changes = self.take();
            assert_eq!(recorded, changes.len());
            changes
        }

        fn take(&mut self) -> Changes {
            let changes = self.rx.take();
            self.view.apply(&changes);
            changes
        }
    }

    fn keys<T>(changes: &BTreeMap<ObjectKey, T>) -> Vec<String> {
        changes.keys().map(ToString::to_string).collect()
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
        let mut fx = Fixture::new(&tmp.0, "node-a");
        fx.first();
        assert_eq!(fx.view.service_ips(), ["10.96.0.10"]);
        assert!(fx.refresh(true).is_empty(), "nothing changed");
        assert!(fx.refresh(false).is_empty(), "nothing changed");
    }

    /// Only the changed file's objects are compared, and only those whose
    /// version changed are recorded.
    #[test]
    fn a_change_to_one_file_records_only_its_changed_objects() {
        let tmp = TempDir::new("one-file");
        let a = tmp.0.join("a.yaml");
        let b = tmp.0.join("b.yaml");
        let web2 = |ip: &str| svc(ip).replace("name: web", "name: web2");
        std::fs::write(&a, format!("{}---\n{SLICE}", svc("10.96.0.1"))).expect("write");
        std::fs::write(&b, web2("10.96.0.2")).expect("write");
        std::fs::write(tmp.0.join("node.yaml"), NODE_A).expect("write");
        let mut fx = Fixture::new(&tmp.0, "node-a");
        let first = fx.first();
        assert_eq!(keys(&first.services), ["default/web", "default/web2"]);
        assert_eq!(keys(&first.slices), ["shop/web-1"]);
        assert!(first.node.is_some());

        // b.yaml's Service changes: only it is recorded.
        std::fs::write(&b, web2("10.96.0.3")).expect("write");
        let changes = fx.refresh(true);
        assert_eq!(keys(&changes.services), ["default/web2"]);
        assert!(changes.slices.is_empty() && changes.node.is_none());
        assert_eq!(fx.view.service_ips(), ["10.96.0.1", "10.96.0.3"]);

        // a.yaml's slice changes, its Service does not: only the slice.
        let slice = SLICE.replace("10.244.1.2", "10.244.1.3");
        std::fs::write(&a, format!("{}---\n{slice}", svc("10.96.0.1"))).expect("write");
        let changes = fx.refresh(true);
        assert!(changes.services.is_empty(), "{changes:?}");
        assert_eq!(keys(&changes.slices), ["shop/web-1"]);

        // Other bytes, the same objects: nothing.
        std::fs::write(&b, format!("# edited\n{}", web2("10.96.0.3"))).expect("write");
        assert!(fx.refresh(true).is_empty());
    }

    #[test]
    fn removing_an_object_from_a_file_records_its_deletion() {
        let tmp = TempDir::new("remove-object");
        let a = tmp.0.join("a.yaml");
        std::fs::write(&a, format!("{SERVICE}---\n{SLICE}")).expect("write");
        let mut fx = Fixture::new(&tmp.0, "node-a");
        fx.first();
        assert_eq!(fx.view.slices.len(), 1);

        std::fs::write(&a, SERVICE).expect("write");
        let changes = fx.refresh(true);
        assert!(changes.services.is_empty(), "{changes:?}");
        assert_eq!(
            changes.slices.get(&ObjectKey::new("shop", "web-1")),
            Some(&None)
        );
        assert_eq!(changes.slices.len(), 1);
        assert!(fx.view.slices.is_empty());

        std::fs::remove_file(&a).expect("remove");
        let changes = fx.refresh(false);
        assert_eq!(
            changes.services.get(&ObjectKey::new("default", "web")),
            Some(&None)
        );
        assert!(fx.view.services.is_empty());
    }

    /// The same object in a.yaml and b.yaml: b's copy takes over when a's goes.
    #[test]
    fn when_the_first_copy_goes_the_next_files_copy_is_recorded() {
        let tmp = TempDir::new("owner");
        let (a, b) = (tmp.0.join("a.yaml"), tmp.0.join("b.yaml"));
        std::fs::write(&a, svc("10.96.0.10")).expect("write");
        std::fs::write(&b, svc("10.96.0.99")).expect("write");
        let mut fx = Fixture::new(&tmp.0, "node-a");
        fx.first();
        assert_eq!(fx.view.service_ips(), ["10.96.0.10"]);

        // The ignored copy changes: nothing in effect does.
        std::fs::write(&b, svc("10.96.0.98")).expect("write");
        assert!(fx.refresh(true).is_empty());

        std::fs::remove_file(&a).expect("remove");
        let changes = fx.refresh(true);
        assert_eq!(keys(&changes.services), ["default/web"]);
        assert_eq!(fx.view.service_ips(), ["10.96.0.98"]);

        // a.yaml comes back and wins again.
        std::fs::write(&a, svc("10.96.0.10")).expect("write");
        assert_eq!(keys(&fx.refresh(true).services), ["default/web"]);
        assert_eq!(fx.view.service_ips(), ["10.96.0.10"]);

        // The object in effect moves to b.yaml unchanged: nothing to record.
        std::fs::write(&b, svc("10.96.0.10")).expect("write");
        std::fs::remove_file(&a).expect("remove");
        assert!(fx.refresh(true).is_empty());
        assert_eq!(fx.view.service_ips(), ["10.96.0.10"]);
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
        let mut fx = Fixture::new(&tmp.0, "node-a");
        fx.first();
        assert_eq!(fx.view.services.len(), 1);
        assert_eq!(
            fx.view.node,
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
        let mut fx = Fixture::new(&tmp.0, "node-a");
        assert_eq!(fx.first().node, Some(None), "the first view says: no Node");
        assert_eq!(fx.view.node, None);
        // A directory shared by several nodes: each agent picks its own.
        let mut b = Fixture::new(&tmp.0, "node-b");
        b.first();
        assert_eq!(
            b.view.node.map(|n| n.addresses),
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
        let mut fx = Fixture::new(&tmp.0, "node-a");
        fx.first();
        let addresses = fx.view.node.map(|n| n.addresses);
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

    /// The fallback rescan alone (no file-system events) picks up changes.
    #[test]
    fn periodic_rescan_sees_metadata_changes() {
        let tmp = TempDir::new("rescan");
        let path = tmp.0.join("a.yaml");
        std::fs::write(&path, svc("10.96.0.1")).expect("write");
        let mut fx = Fixture::new(&tmp.0, "node-a");
        fx.first();
        std::fs::write(&path, svc("10.96.0.2")).expect("write");
        assert!(!fx.refresh(false).is_empty());
        assert_eq!(fx.view.service_ips(), ["10.96.0.2"]);
        std::fs::remove_file(&path).expect("remove");
        assert!(!fx.refresh(false).is_empty());
        assert!(fx.view.services.is_empty());
    }
}
