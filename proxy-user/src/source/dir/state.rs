//! The directory as last read: every file's objects, converted to the
//! model's input types, the copy in effect for every key, and the rescan
//! that records into the feed what changed.
//!
//! Files carry no `creationTimestamp`, yet the model gives a contested
//! address to the older Service. So this source stamps each Service without
//! one with the time it first saw it, in milliseconds: in the first scan,
//! its file's modification time (so that after an agent restart the files
//! that were there keep their order as far as their files show it);
//! afterwards, the time of the scan that read it. The stamp stays while the
//! object exists (edits, moves between files): a new version without a
//! timestamp takes the one of the version in effect (which is that stamp, or
//! the timestamp that version was written with); deleting the object forgets
//! it. A new file therefore never takes an address from a Service already
//! running; equal stamps are settled by namespace/name.
//!
//! Problems with the files themselves (not YAML, not readable, a symlink
//! loop) and with the directory are recorded into the feed as the complete
//! set in force ([`FeedTx::problems`]) whenever it changes: they reach the
//! agent's warnings and go away when the file is fixed or removed. A broken
//! file keeps its last good objects in effect.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash as _, Hasher as _};
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tracing::{error, info, warn};

use super::parse::{parse_as, parse_each, yaml_documents, FileObjects, Inputs, ManifestError};
use crate::model::{Interner, Keyed, ModelWarning, NodeInfo, ObjectKey, ServiceInfo, SliceInfo};
use crate::source::feed::FeedTx;
use crate::util::btree::extend_whole;

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

/// Which files a rescan reads by content, and which it leaves alone; every
/// other file is read when its metadata changed.
#[derive(Debug, Default)]
pub(super) struct Reread {
    /// Every file (the first scan; after lost events, or a new watch).
    pub(super) all: bool,
    /// The files a file-system event named since the last rescan.
    pub(super) named: HashSet<PathBuf>,
    /// Files being written (a write was seen, its close not yet), with when
    /// the last write was seen: not read, whatever their metadata says, so a
    /// half-written file never replaces its objects. Files stay here until
    /// the watch sees them closed, renamed or removed (or [`Reread::forget_writes_before`]).
    pub(super) writing: HashMap<PathBuf, Instant>,
}

impl Reread {
    /// Every file, by content.
    pub(super) fn all() -> Reread {
        Reread {
            all: true,
            ..Reread::default()
        }
    }

    fn by_content(&self, path: &Path) -> bool {
        self.all || self.named.contains(path)
    }

    /// After a rescan: the events it answered are done with (the files
    /// being written stay).
    pub(super) fn answered(&mut self) {
        self.all = false;
        self.named.clear();
    }

    /// Stops waiting for the close of files whose last write is older than
    /// `cutoff` (a writer that keeps its file open, or a close the watch
    /// missed): the next rescan reads them as their metadata says.
    pub(super) fn forget_writes_before(&mut self, cutoff: Instant) {
        self.writing.retain(|_, at| *at >= cutoff);
    }
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

/// The objects of one file or document, decoded straight into the model's
/// input types.
type Decoded = FileObjects<ServiceInfo, SliceInfo>;

/// What one file contributes: the model's input types, decoded straight
/// from the documents (no k8s-openapi objects are built).
#[derive(Clone, Debug, Default, PartialEq)]
struct FileView {
    /// In key order, one per key.
    services: Vec<Arc<ServiceInfo>>,
    /// In key order, one per key.
    slices: Vec<Arc<SliceInfo>>,
    /// The Node named like this node; Nodes of other names are not kept.
    node: Option<Arc<NodeInfo>>,
}

impl FileView {
    /// Puts a parsed file's objects together, sharing their strings. An
    /// object the file holds twice keeps its first copy, as an object in two
    /// files keeps the first path's.
    fn convert(
        path: &Path,
        objects: Decoded,
        node_name: &str,
        interner: &mut Interner,
    ) -> FileView {
        let FileObjects {
            services,
            endpoint_slices,
            nodes,
            ..
        } = objects;
        let services = services
            .into_iter()
            .map(|mut svc| {
                svc.share(interner);
                Arc::new(svc)
            })
            .collect();
        let slices = endpoint_slices
            .into_iter()
            .map(|mut slice| {
                slice.share(interner);
                Arc::new(slice)
            })
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
            services,
            slices,
            node,
        }
        .finish(path)
    }

    /// Puts the objects in key order, keeping each key's first copy.
    fn finish(self, path: &Path) -> FileView {
        FileView {
            services: first_per_key(path, "Service", self.services),
            slices: first_per_key(path, "EndpointSlice", self.slices),
            node: self.node,
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

/// The files holding one object, in path order: the first one's copy is
/// used. Held for every object, so the usual single file is inline (no
/// block of its own), and the rare list boxed (24 bytes in all).
#[derive(Debug)]
pub(super) enum Owners<T> {
    One((Arc<Path>, Arc<T>)),
    Many(Box<[(Arc<Path>, Arc<T>)]>),
}

impl<T> Default for Owners<T> {
    fn default() -> Self {
        Owners::Many(Box::default())
    }
}

impl<T> Owners<T> {
    fn as_slice(&self) -> &[(Arc<Path>, Arc<T>)] {
        match self {
            Owners::One(one) => std::slice::from_ref(one),
            Owners::Many(many) => many,
        }
    }

    /// Changes the list with `f`, keeping a single owner inline.
    fn edit<R>(&mut self, f: impl FnOnce(&mut Vec<(Arc<Path>, Arc<T>)>) -> R) -> R {
        let mut list = match std::mem::take(self) {
            Owners::One(one) => vec![one],
            Owners::Many(many) => many.into_vec(),
        };
        let result = f(&mut list);
        *self = match <[_; 1]>::try_from(list) {
            Ok([one]) => Owners::One(one),
            Err(list) => Owners::Many(list.into_boxed_slice()),
        };
        result
    }

    fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    fn used(&self) -> Option<&Arc<T>> {
        self.as_slice().first().map(|(_, obj)| obj)
    }

    /// Adds `path`'s copy. When another file holds the object too, returns
    /// (the path whose copy is used, the path whose copy is now ignored).
    fn insert(&mut self, path: &Arc<Path>, obj: Arc<T>) -> Option<(Arc<Path>, Arc<Path>)> {
        self.edit(|owners| {
            let at = match owners.binary_search_by(|(p, _)| p.cmp(path)) {
                // Not expected (a changed file's old copies go first); replace.
                Ok(at) => {
                    owners[at].1 = obj;
                    return None;
                }
                Err(at) => at,
            };
            owners.insert(at, (Arc::clone(path), obj));
            let ignored = if at == 0 {
                owners.get(1)
            } else {
                Some(&owners[at])
            };
            Some((Arc::clone(&owners[0].0), Arc::clone(&ignored?.0)))
        })
    }

    fn remove(&mut self, path: &Path) {
        self.edit(|owners| owners.retain(|(p, _)| **p != *path));
    }
}

/// Services (or EndpointSlices) by key, with the files that hold each.
pub(super) struct Index<T> {
    kind: &'static str,
    pub(super) by_key: BTreeMap<ObjectKey, Owners<T>>,
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
                .insert(obj.key().clone(), Owners::One((Arc::clone(path), obj)));
            return;
        };
        let key = obj.key().clone();
        let twice = owners.insert(path, obj);
        self.note_twice(twice, &key);
    }

    fn remove(&mut self, path: &Path, key: &ObjectKey) {
        if let Some(owners) = self.by_key.get_mut(key) {
            owners.remove(path);
            if owners.is_empty() {
                self.by_key.remove(key);
            }
        }
    }

    /// Adds the objects of `files` (in path order): what [`Index::insert`]
    /// of each would, but into an empty index built whole, its nodes full
    /// (one insert at a time leaves them a third empty or more).
    fn fill<'v>(&mut self, files: impl Iterator<Item = (&'v Arc<Path>, &'v [Arc<T>])>)
    where
        T: 'v,
    {
        if !self.by_key.is_empty() {
            for (path, objects) in files {
                objects
                    .iter()
                    .for_each(|o| self.insert(path, Arc::clone(o)));
            }
            return;
        }
        let items = files.flat_map(|(path, objects)| {
            objects.iter().map(move |o| {
                let owners = Owners::One((Arc::clone(path), Arc::clone(o)));
                (o.key().clone(), owners)
            })
        });
        let mut by_key = std::mem::take(&mut self.by_key);
        extend_whole(&mut by_key, items, |key, owners, new| {
            if let Owners::One((path, obj)) = new {
                self.note_twice(owners.insert(&path, obj), key);
            }
        });
        self.by_key = by_key;
    }

    /// Warns about an object defined in two files (see [`Owners::insert`]).
    fn note_twice(&self, twice: Option<(Arc<Path>, Arc<Path>)>, key: &ObjectKey) {
        if let Some((used, ignored)) = twice {
            warn!(
                "{}: {} {key} is also defined in {}; this copy is ignored",
                ignored.display(),
                self.kind,
                used.display()
            );
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
pub(super) struct FileState {
    fingerprint: Option<Fingerprint>,
    content_hash: Option<u64>,
    /// The objects from the last time this file parsed.
    good: Option<FileView>,
    /// Its documents then, in order (empty for a file parsed whole): a
    /// document whose text is unchanged keeps its objects without a parse.
    docs: Vec<Doc>,
    /// The current problem, if the file is broken (logged once per change).
    error: Option<String>,
    /// The same, as the agent reports it.
    problem: Option<ModelWarning>,
}

/// One document of a file as last converted, by the hash of its text.
#[derive(Clone, Debug)]
struct Doc {
    hash: u64,
    objects: DocObjects,
}

/// What one document contributes; most hold one object (no allocation of
/// their own then).
#[derive(Clone, Debug)]
enum DocObjects {
    Empty,
    Service(Arc<ServiceInfo>),
    Slice(Arc<SliceInfo>),
    More(Box<FileView>),
}

impl DocObjects {
    fn of(view: FileView) -> DocObjects {
        match (&view.services[..], &view.slices[..], &view.node) {
            ([], [], None) => DocObjects::Empty,
            ([svc], [], None) => DocObjects::Service(Arc::clone(svc)),
            ([], [slice], None) => DocObjects::Slice(Arc::clone(slice)),
            _ => DocObjects::More(Box::new(view)),
        }
    }

    /// Adds these objects to `view` (in document order; see [`FileView::finish`]).
    fn add_to(&self, view: &mut FileView, path: &Path, node_name: &str) {
        match self {
            DocObjects::Empty => {}
            DocObjects::Service(svc) => view.services.push(Arc::clone(svc)),
            DocObjects::Slice(slice) => view.slices.push(Arc::clone(slice)),
            DocObjects::More(more) => {
                view.services.extend(more.services.iter().cloned());
                view.slices.extend(more.slices.iter().cloned());
                if let Some(node) = &more.node {
                    if view.node.is_some() {
                        warn!(
                            "{}: Node {node_name} is defined twice in this file; the later copy is ignored",
                            path.display()
                        );
                    } else {
                        view.node = Some(Arc::clone(node));
                    }
                }
            }
        }
    }
}

/// A file whose objects changed: its new objects (`None`: the file is gone).
struct FileChange {
    path: Arc<Path>,
    view: Option<FileView>,
}

/// A file read: its objects, its documents (see [`Doc`]), and how many
/// of them were parsed (the others were unchanged).
struct Read {
    view: FileView,
    docs: Vec<Doc>,
    parsed: usize,
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
pub(super) struct DirState {
    pub(super) dir: PathBuf,
    /// The agent's node name: the Node of this name is the one recorded.
    pub(super) node_name: String,
    pub(super) files: BTreeMap<Arc<Path>, FileState>,
    pub(super) services: Index<ServiceInfo>,
    pub(super) slices: Index<SliceInfo>,
    /// This node's Node, by file.
    node: Owners<NodeInfo>,
    /// Namespaces, port names, node names and the like, shared across all
    /// files.
    interner: Interner,
    /// The directory's identity, to notice it being replaced (then the watch is renewed).
    pub(super) dir_id: Option<(u64, u64)>,
    dir_error: Option<String>,
    /// The first scan is done.
    started: bool,
    /// The problems last recorded into the feed.
    sent_problems: Vec<ModelWarning>,
}

impl DirState {
    pub(super) fn new(dir: PathBuf, node_name: String) -> DirState {
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
            started: false,
            sent_problems: Vec::new(),
        }
    }

    /// The first scan: records every object in effect, and this node's Node
    /// (also when there is none). Returns how many objects it recorded.
    pub(super) fn first(&mut self, feed: &FeedTx) -> usize {
        let changes = self.scan(&Reread::all());
        self.apply(changes, None);
        self.started = true;
        feed.versions(
            self.services
                .iter()
                .map(|(key, svc)| (key.clone(), Some(Arc::clone(svc)))),
            self.slices
                .iter()
                .map(|(key, slice)| (key.clone(), Some(Arc::clone(slice)))),
        );
        let node = self.node.used();
        log_node_change(self, None, node.map(|n| &**n), true);
        feed.node(node.map(|n| NodeInfo::clone(n)));
        self.services.by_key.len() + self.slices.by_key.len() + 1 + self.record_problems(feed)
    }

    /// The problems in force: the directory's, then each broken file's.
    pub(super) fn problems(&self) -> Vec<ModelWarning> {
        let dir = self.dir_error.as_ref().map(|msg| ModelWarning {
            object: format!("directory {}", self.dir.display()),
            problem: format!("{msg}; keeping the objects last read from it"),
        });
        dir.into_iter()
            .chain(self.files.values().filter_map(|f| f.problem.clone()))
            .collect()
    }

    /// Records the problems into `feed` when they changed; returns 1 if so.
    fn record_problems(&mut self, feed: &FeedTx) -> usize {
        let problems = self.problems();
        if problems == self.sent_problems {
            return 0;
        }
        feed.problems(problems.clone());
        self.sent_problems = problems;
        1
    }

    /// Rescans (see [`scan`](Self::scan)) and records into `feed` each object
    /// whose version in effect changed: added, changed or removed. Only the
    /// changed files' keys are compared, so one edited file costs its own
    /// objects, whatever the directory holds. Returns how many it recorded.
    pub(super) fn refresh(&mut self, reread: &Reread, feed: &FeedTx) -> usize {
        let changes = self.scan(reread);
        let mut recorded = 0;
        if !changes.is_empty() {
            let mut before = Before::default();
            if self.apply(changes, Some(&mut before)) {
                self.interner.prune();
            }
            recorded = self.record(before, feed);
        }
        recorded + self.record_problems(feed)
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
        let new = || {
            changes
                .iter()
                .filter_map(|c| Some((&c.path, c.view.as_ref()?)))
        };
        self.services
            .fill(new().map(|(path, view)| (path, &view.services[..])));
        self.slices
            .fill(new().map(|(path, view)| (path, &view.slices[..])));
        for (path, view) in new() {
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
        for FileChange { path, view } in changes {
            if let (Some(view), Some(f)) = (view, self.files.get_mut(&path)) {
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

    /// Reads what changed in the directory: the files `reread` names (or
    /// every file) by content, the others when their metadata changed, none
    /// that is being written. Returns the files whose objects changed, in
    /// path order.
    fn scan(&mut self, reread: &Reread) -> Vec<FileChange> {
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
            if reread.writing.contains_key(&path) {
                // Its objects (if it had any) stay as they are until the write ends.
                seen.insert(path);
                continue;
            }
            match self.check_file(&path, reread.by_content(&path)) {
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

    /// Reads one manifest file if its metadata (or, with `by_content`, its
    /// content) changed, and converts its objects.
    fn check_file(&mut self, path: &Path, by_content: bool) -> Checked {
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
        if !by_content
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
        // A file read by document is hashed by document (each byte once).
        let documents = yaml_documents(path, &bytes).map(|documents| {
            let hashes: Vec<u64> = documents
                .iter()
                .map(|text| content_hash(text.as_bytes()))
                .collect();
            (documents, hashes)
        });
        let hash = match &documents {
            Some((_, hashes)) => {
                let mut h = DefaultHasher::new();
                hashes.hash(&mut h);
                h.finish()
            }
            None => content_hash(&bytes),
        };
        let f = self.files.entry(Arc::clone(&key)).or_default();
        f.fingerprint = Some(fingerprint);
        if f.content_hash.replace(hash) == Some(hash) {
            return Checked::Unchanged;
        }
        let read = match documents {
            Some((documents, hashes)) => {
                self.read_documents(path, &documents, hashes, &bytes, fingerprint.modified)
            }
            None => self.read_whole(path, &bytes, fingerprint.modified),
        };
        match read {
            Ok(read) => self.loaded(key, read),
            Err(e) => {
                self.file_error(e, None);
                Checked::Unchanged
            }
        }
    }

    /// Parses the documents (`hashes`: of each one's text) whose text
    /// changed since the file was last read (the others keep their objects,
    /// unparsed), on every core, and puts
    /// the file's objects together. After an error the whole file is parsed, so that the error
    /// names its document as the file counts them.
    fn read_documents(
        &mut self,
        path: &Path,
        documents: &[&str],
        hashes: Vec<u64>,
        bytes: &[u8],
        modified: Option<SystemTime>,
    ) -> Result<Read, ManifestError> {
        let old: HashMap<u64, DocObjects> = self
            .files
            .get(path)
            .map(|f| f.docs.iter().map(|d| (d.hash, d.objects.clone())).collect())
            .unwrap_or_default();
        let fresh: Vec<&str> = documents
            .iter()
            .zip(&hashes)
            .filter(|(_, hash)| !old.contains_key(hash))
            .map(|(text, _)| *text)
            .collect();
        let parsed = fresh.len();
        let mut fresh = parse_each::<Inputs>(path, &fresh).into_iter();
        let mut docs = Vec::with_capacity(documents.len());
        for hash in hashes {
            let objects = match old.get(&hash) {
                Some(objects) => objects.clone(),
                None => match fresh.next() {
                    Some(Ok(objects)) => DocObjects::of(self.convert(path, objects, modified)),
                    _ => return self.read_whole(path, bytes, modified),
                },
            };
            docs.push(Doc { hash, objects });
        }
        let mut view = FileView::default();
        for doc in &docs {
            doc.objects.add_to(&mut view, path, &self.node_name);
        }
        Ok(Read {
            view: view.finish(path),
            docs,
            parsed,
        })
    }

    /// Parses the whole file (JSON, or YAML that is not read by document).
    fn read_whole(
        &mut self,
        path: &Path,
        bytes: &[u8],
        modified: Option<SystemTime>,
    ) -> Result<Read, ManifestError> {
        let objects = parse_as::<Inputs>(path, bytes)?;
        Ok(Read {
            view: self.convert(path, objects, modified),
            docs: Vec::new(),
            parsed: 1,
        })
    }

    /// Logs the notes of parsed objects and converts them (see [`Self::stamp`]).
    fn convert(&mut self, path: &Path, objects: Decoded, modified: Option<SystemTime>) -> FileView {
        for note in &objects.notes {
            info!("{note}");
        }
        let mut view = FileView::convert(path, objects, &self.node_name, &mut self.interner);
        self.stamp(&mut view, modified);
        view
    }

    /// Logs a file that parsed and keeps its documents.
    fn loaded(&mut self, path: Arc<Path>, read: Read) -> Checked {
        let Read { view, docs, parsed } = read;
        info!(
            file = %path.display(),
            services = view.services.len(),
            endpoint_slices = view.slices.len(),
            this_node = view.node.is_some(),
            documents = docs.len(),
            parsed,
            "manifest file loaded"
        );
        let Some(f) = self.files.get_mut(&path) else {
            return Checked::Unchanged; // unreachable: `check_file` made it
        };
        f.docs = docs;
        if f.error.take().is_some() {
            info!(file = %path.display(), "manifest file is good again");
        }
        f.problem = None;
        if f.good.as_ref() == Some(&view) {
            return Checked::Unchanged;
        }
        Checked::Changed(path, view)
    }

    /// Gives each Service without a creationTimestamp the time it was first
    /// seen (see the module); `modified`: its file's modification time.
    fn stamp(&mut self, view: &mut FileView, modified: Option<SystemTime>) {
        let seen_at = if self.started {
            Some(SystemTime::now())
        } else {
            modified
        };
        let ms = seen_at
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        for svc in &mut view.services {
            if svc.created_unix_ms.is_some() {
                continue;
            }
            // The version in effect has a stamp (or a timestamp of its
            // own): every Service in the index has one.
            let stamp = self
                .services
                .used(&svc.key)
                .and_then(|used| used.created_unix_ms)
                .unwrap_or(ms);
            Arc::make_mut(svc).created_unix_ms = Some(stamp);
        }
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
            let consequence = if f.good.is_some() {
                "keeping this file's last good objects"
            } else {
                "nothing from this file is used"
            };
            let path = err.path().display().to_string();
            let text = msg.strip_prefix(&format!("{path}: ")).unwrap_or(&msg);
            f.problem = Some(ModelWarning {
                object: format!("file {path}"),
                problem: format!("{text}; {consequence}"),
            });
            f.error = Some(msg);
        }
    }

    /// The directory's (device, inode), to notice it being replaced.
    pub(super) fn current_dir_id(&self) -> Option<(u64, u64)> {
        std::fs::metadata(&self.dir)
            .ok()
            .map(|m| (m.dev(), m.ino()))
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
    use crate::source::dir::test_support::{
        bench_yaml, bench_yaml_flow, node_b, svc, TempDir, View, NODE_A, SERVICE, SLICE,
    };
    use crate::source::feed::{feed, Changes, FeedRx};

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

        /// A directory holding `a.yaml` with `contents`, read once: the
        /// directory (removed on drop), the file, the fixture.
        fn one_file(tag: &str, contents: &str) -> (TempDir, PathBuf, Fixture) {
            let tmp = TempDir::new(tag);
            let path = tmp.0.join("a.yaml");
            std::fs::write(&path, contents).expect("write");
            let mut fx = Fixture::new(&tmp.0, "node-a");
            fx.first();
            (tmp, path, fx)
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
            let reread = if read_all {
                Reread::all()
            } else {
                Reread::default()
            };
            self.refresh_with(&reread)
        }

        fn refresh_with(&mut self, reread: &Reread) -> Changes {
            let recorded = self.state.refresh(reread, &self.tx);
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
                // InternalIPs first (both families), then ExternalIP; Hostname left out.
                addresses: vec![
                    std::net::Ipv4Addr::new(192, 168, 1, 10).into(),
                    "fd00::10".parse::<std::net::IpAddr>().expect("an address"),
                    std::net::Ipv4Addr::new(203, 0, 113, 7).into()
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
                std::net::IpAddr::from(std::net::Ipv4Addr::new(192, 168, 1, 11)),
                "fd00::10".parse::<std::net::IpAddr>().expect("an address"),
                std::net::Ipv4Addr::new(203, 0, 113, 7).into()
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
            Some(&std::net::IpAddr::from(std::net::Ipv4Addr::new(
                192, 168, 1, 10
            )))
        );
    }

    /// The fallback rescan alone (no file-system events) picks up changes.
    #[test]
    fn periodic_rescan_sees_metadata_changes() {
        let (_tmp, path, mut fx) = Fixture::one_file("rescan", &svc("10.96.0.1"));
        std::fs::write(&path, svc("10.96.0.2")).expect("write");
        assert!(!fx.refresh(false).is_empty());
        assert_eq!(fx.view.service_ips(), ["10.96.0.2"]);
        std::fs::remove_file(&path).expect("remove");
        assert!(!fx.refresh(false).is_empty());
        assert!(fx.view.services.is_empty());
    }

    /// A file is kept by document: when one document of a file changes, only
    /// it is parsed again, and the other documents' objects stay the same
    /// allocations (so only the changed object is recorded).
    #[test]
    fn a_change_to_one_document_parses_only_that_document() {
        let named = |name: &str, ip: &str| svc(ip).replace("name: web", &format!("name: {name}"));
        let file = |b_ip: &str| {
            format!(
                "{}---\n{}---\n{}---\n{SLICE}",
                named("a", "10.96.0.1"),
                named("b", b_ip),
                named("c", "10.96.0.3")
            )
        };
        let (_tmp, path, mut fx) = Fixture::one_file("docs", &file("10.96.0.2"));
        let used = |fx: &Fixture, name: &str| {
            fx.state
                .services
                .used(&ObjectKey::new("default", name))
                .cloned()
                .expect("in effect")
        };
        let (a, c) = (used(&fx, "a"), used(&fx, "c"));
        let slice = fx.state.slices.iter().next().map(|(_, s)| Arc::clone(s));
        std::fs::write(&path, file("10.96.0.22")).expect("write");
        let changes = fx.refresh(true);
        assert_eq!(keys(&changes.services), ["default/b"]);
        assert!(changes.slices.is_empty());
        assert_eq!(
            fx.view.service_ips(),
            ["10.96.0.1", "10.96.0.22", "10.96.0.3"]
        );
        assert!(
            Arc::ptr_eq(&a, &used(&fx, "a")),
            "document 1 was parsed again"
        );
        assert!(
            Arc::ptr_eq(&c, &used(&fx, "c")),
            "document 3 was parsed again"
        );
        let slice_now = fx.state.slices.iter().next().map(|(_, s)| Arc::clone(s));
        assert!(slice
            .zip(slice_now)
            .is_some_and(|(a, b)| Arc::ptr_eq(&a, &b)));

        // A broken document: the problem names it as the file counts them,
        // and the file's objects stay.
        std::fs::write(&path, file("10.96.0.22").replace("name: c", "name: [c")).expect("write");
        let broken = fx.refresh(true);
        let texts = problem_texts(&broken).expect("a problem");
        assert!(texts.iter().any(|t| t.contains("document 3")), "{texts:?}");
        assert_eq!(
            fx.view.service_ips(),
            ["10.96.0.1", "10.96.0.22", "10.96.0.3"]
        );
    }

    /// A file being written is not read, whatever its metadata says: its
    /// objects stay until its write ends (then it is read).
    #[test]
    fn a_file_being_written_keeps_its_objects_until_its_write_ends() {
        let (_tmp, path, mut fx) = Fixture::one_file("writing", &svc("10.96.0.1"));
        // Half of the new content: a valid document without its ports.
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Service\nmetadata: {name: web}\n",
        )
        .expect("write");
        let mut reread = Reread::default();
        reread.writing.insert(path.clone(), Instant::now());
        assert!(
            fx.refresh_with(&reread).is_empty(),
            "not read while written"
        );
        assert_eq!(fx.view.service_ips(), ["10.96.0.1"]);
        std::fs::write(&path, svc("10.96.0.2")).expect("write");
        reread.writing.clear();
        reread.named.insert(path);
        assert!(!fx.refresh_with(&reread).is_empty(), "read once closed");
        assert_eq!(fx.view.service_ips(), ["10.96.0.2"]);
    }

    /// A file an event named is read by content: a rewrite that leaves its
    /// size, inode and modification time as they were is seen too.
    #[test]
    fn a_named_file_is_read_even_when_its_metadata_did_not_change() {
        let (_tmp, path, mut fx) = Fixture::one_file("named", &svc("10.96.0.1"));
        let modified = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .expect("mtime");
        std::fs::write(&path, svc("10.96.0.2")).expect("write");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(modified))
            .expect("set mtime");
        assert!(
            fx.refresh(false).is_empty(),
            "the metadata alone shows nothing"
        );
        let mut reread = Reread::default();
        reread.named.insert(path);
        assert!(!fx.refresh_with(&reread).is_empty());
        assert_eq!(fx.view.service_ips(), ["10.96.0.2"]);
    }

    /// `VmRSS` and `VmHWM` of this process, in MiB.
    fn rss() -> (f64, f64) {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches(" kB").parse::<f64>().ok())
                .map_or(f64::NAN, |kb| kb / 1024.0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Where the time and the memory of the first view of a directory of
    /// the benchmark's shape go (`SB_PROBE_SERVICES`, default 100000,
    /// 1000 a file): `cargo test --release -p proxy-user --lib
    /// first_view_probe -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a test"]
    fn first_view_probe() {
        use crate::util::malloc::{mib, MallocStats};
        // The agent's malloc settings.
        crate::util::malloc::tune();
        let n: usize = std::env::var("SB_PROBE_SERVICES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100_000);
        let tmp = TempDir::new("probe");
        for (i, start) in (0..n).step_by(1000).enumerate() {
            let range = start..(start + 1000).min(n);
            let text = match std::env::var("SB_PROBE_STYLE").as_deref() {
                Ok("flow") => bench_yaml_flow(range),
                _ => bench_yaml(range),
            };
            std::fs::write(tmp.0.join(format!("services-{i:04}.yaml")), text).expect("write");
        }
        let used = || MallocStats::now().unwrap_or_default();
        let report = |what: &str, before: MallocStats| {
            let now = used();
            let (rss, hwm) = rss();
            eprintln!(
                "{what}: in use {:.1} MiB ({:+.1}), arenas {:.1} MiB, free in them {:.1} MiB, mapped {:.1} MiB; RSS {rss:.1} MiB (peak {hwm:.1})",
                mib(now.in_use),
                (now.in_use as f64 - before.in_use as f64) / 1_048_576.0,
                mib(now.arena),
                mib(now.free),
                mib(now.mapped),
            );
            now
        };
        let start = report("start", used());
        let t = Instant::now();
        let (tx, mut rx) = feed();
        let mut state = DirState::new(tmp.0.clone(), "node-a".to_string());
        let recorded = state.first(&tx);
        let first = t.elapsed();
        let read = report("first view read", start);
        // As the agent does after the first view (`util::heap::trim`).
        // SAFETY: malloc_trim only releases memory the allocator holds free.
        unsafe {
            libc::malloc_trim(0);
        }
        let trimmed = report("trimmed", read);
        if std::env::var_os("SB_PROBE_MALLOC_INFO").is_some() {
            // SAFETY: malloc_info writes the allocator's state to a stream
            // opened on standard error, flushed and then leaked (fd 2 stays).
            unsafe {
                let err = libc::fdopen(2, c"w".as_ptr());
                libc::malloc_info(0, err);
                libc::fflush(err);
            }
        }
        let t = Instant::now();
        let changes = rx.take();
        assert_eq!(changes.len(), recorded);
        eprintln!(
            "first view: {first:?} for {recorded} objects; take {:?}",
            t.elapsed()
        );
        drop(changes);
        let no_feed = report("without the feed's changes", trimmed);
        state.files.clear();
        let no_files = report("without the files' documents and views", no_feed);
        state.interner = Interner::default();
        let no_interner = report("without the interner's set", no_files);
        state.services.by_key.clear();
        let no_services = report("without the Services (and their index)", no_interner);
        state.slices.by_key.clear();
        report("without the slices (and their index)", no_services);

        // The parse alone, on every core.
        let texts: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&tmp.0)
            .expect("dir")
            .map(|e| {
                let path = e.expect("entry").path();
                let bytes = std::fs::read(&path).expect("read");
                (path, bytes)
            })
            .collect();
        let t = Instant::now();
        for (path, bytes) in &texts {
            let documents = yaml_documents(path, bytes).expect("split");
            let hashes: Vec<u64> = documents
                .iter()
                .map(|d| content_hash(d.as_bytes()))
                .collect();
            assert_eq!(hashes.len(), documents.len());
        }
        eprintln!("split and hash alone (one core): {:?}", t.elapsed());
        let t = Instant::now();
        let mut docs = 0;
        for (path, bytes) in &texts {
            let documents = yaml_documents(path, bytes).expect("split");
            docs += documents.len();
            let parsed = parse_each::<Inputs>(path, &documents);
            assert!(parsed.iter().all(Result::is_ok));
        }
        let parse = t.elapsed();
        eprintln!(
            "parse alone: {parse:?} for {docs} documents, {:?} per document on every core",
            parse / docs.max(1) as u32
        );
    }

    fn problem_texts(changes: &Changes) -> Option<Vec<String>> {
        changes
            .problems
            .as_ref()
            .map(|p| p.iter().map(ToString::to_string).collect())
    }

    /// A file that stops parsing keeps its objects and its problem
    /// reaches the feed (so the agent's warnings); fixing the file clears it.
    #[test]
    fn a_broken_file_keeps_its_objects_and_reports_its_problem_until_fixed() {
        let tmp = TempDir::new("broken");
        let path = tmp.0.join("a.yaml");
        std::fs::write(&path, svc("10.96.0.1")).expect("write");
        let mut fx = Fixture::new(&tmp.0, "node-a");
        let first = fx.first();
        assert!(first.problems.is_none(), "no problem at first");
        std::fs::write(&path, "kind: Service\nmetadata: {name: [unclosed\n").expect("write");
        let broken = fx.refresh(true);
        assert!(
            broken.services.is_empty(),
            "the last good objects stay: {broken:?}"
        );
        assert_eq!(fx.view.service_ips(), ["10.96.0.1"]);
        let problems = problem_texts(&broken).expect("the problem is recorded");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(&format!(
                "file {}: document 1: syntax error",
                path.display()
            )),
            "{problems:?}"
        );
        assert!(
            problems[0].ends_with("; keeping this file's last good objects"),
            "{problems:?}"
        );
        assert!(fx.refresh(true).is_empty(), "reported once");
        std::fs::write(&path, svc("10.96.0.2")).expect("write");
        let fixed = fx.refresh(true);
        assert_eq!(
            problem_texts(&fixed),
            Some(Vec::new()),
            "fixed: the problem goes"
        );
        assert_eq!(fx.view.service_ips(), ["10.96.0.2"]);
    }

    /// A binary file and a symlink loop are reported by name (they
    /// never held objects), and removing them clears the problem.
    #[test]
    fn unreadable_files_are_reported_and_cleared_when_removed() {
        let tmp = TempDir::new("unreadable");
        std::fs::write(tmp.0.join("good.yaml"), SERVICE).expect("write");
        let binary = tmp.0.join("bin.yaml");
        std::fs::write(&binary, [0xff_u8, 0xfe, 0x00, 0x01, 0x80]).expect("write");
        let looped = tmp.0.join("loop.yaml");
        std::os::unix::fs::symlink(&looped, &looped).expect("symlink");
        let mut fx = Fixture::new(&tmp.0, "node-a");
        let first = fx.first();
        let problems = problem_texts(&first).expect("problems at the first scan");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].starts_with(&format!("file {}: ", binary.display())),
            "{problems:?}"
        );
        assert!(
            problems[0].ends_with("; nothing from this file is used"),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with(&format!("file {}: cannot read the file", looped.display())),
            "{problems:?}"
        );
        assert_eq!(
            fx.view.service_ips(),
            ["10.96.0.10"],
            "the good file is used"
        );
        std::fs::remove_file(&binary).expect("remove");
        std::fs::remove_file(&looped).expect("remove");
        assert_eq!(problem_texts(&fx.refresh(true)), Some(Vec::new()));
    }

    /// A directory that cannot be read any more keeps the objects
    /// last read from it and says so.
    #[test]
    fn a_vanished_directory_is_reported() {
        let tmp = TempDir::new("vanish");
        let dir = tmp.0.join("manifests");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("a.yaml"), SERVICE).expect("write");
        let mut fx = Fixture::new(&dir, "node-a");
        fx.first();
        std::fs::remove_dir_all(&dir).expect("rm");
        let gone = fx.refresh(true);
        let problems = problem_texts(&gone).expect("reported");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with(&format!("directory {}: ", dir.display())),
            "{problems:?}"
        );
        assert_eq!(fx.view.service_ips(), ["10.96.0.10"]);
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("a.yaml"), SERVICE).expect("write");
        assert_eq!(problem_texts(&fx.refresh(true)), Some(Vec::new()));
    }

    /// A Service from a file is stamped with the time it was first
    /// seen (its file's mtime in the first scan, the scan's time later), and
    /// keeps the stamp across edits until it is deleted; so a new file's
    /// Service is always younger than a running one.
    #[test]
    fn services_are_stamped_when_first_seen_and_keep_the_stamp() {
        let tmp = TempDir::new("stamp");
        let old = tmp.0.join("zz-old.yaml");
        std::fs::write(&old, SERVICE).expect("write");
        let long_ago = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        std::fs::File::options()
            .write(true)
            .open(&old)
            .and_then(|f| f.set_modified(long_ago))
            .expect("set mtime");
        let mut fx = Fixture::new(&tmp.0, "node-a");
        fx.first();
        let web = ObjectKey::new("default", "web");
        let stamp = |fx: &Fixture, key: &ObjectKey| fx.view.services[key].created_unix_ms;
        assert_eq!(
            stamp(&fx, &web),
            Some(1_700_000_000_000),
            "first scan: the file's mtime"
        );
        // A newcomer in a file that sorts first, claiming the same address.
        std::fs::write(
            tmp.0.join("aa-new.yaml"),
            SERVICE.replace("name: web", "name: aaa"),
        )
        .expect("write");
        fx.refresh(true);
        let newcomer = stamp(&fx, &ObjectKey::new("default", "aaa")).expect("stamped");
        assert!(
            newcomer > 1_700_000_000_000,
            "later: the time it was first seen"
        );
        // An edit keeps the stamp.
        std::fs::write(&old, svc("10.96.0.99")).expect("write");
        fx.refresh(true);
        assert_eq!(fx.view.service_ips(), ["10.96.0.10", "10.96.0.99"]);
        assert_eq!(
            stamp(&fx, &web),
            Some(1_700_000_000_000),
            "kept across an edit"
        );
        // Deleted and back: a new object, a new stamp.
        std::fs::remove_file(&old).expect("rm");
        fx.refresh(true);
        std::fs::write(&old, SERVICE).expect("write");
        fx.refresh(true);
        assert!(stamp(&fx, &web) >= Some(newcomer), "stamped anew");
        // A creationTimestamp in the file is used as written.
        std::fs::write(
            &old,
            SERVICE.replace(
                "{name: web}",
                "{name: web, creationTimestamp: '2020-01-01T00:00:00Z'}",
            ),
        )
        .expect("write");
        fx.refresh(true);
        assert_eq!(stamp(&fx, &web), Some(1_577_836_800_000));
    }
}
