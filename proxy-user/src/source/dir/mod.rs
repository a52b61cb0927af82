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
//!   `Node`. Services and EndpointSlices are decoded straight into the
//!   model's input types ([`crate::source::wire`]); Nodes with the k8s-openapi
//!   type. Other
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
//! * Changes: each file's objects are read as the model's input types
//!   ([`ServiceInfo`], [`SliceInfo`], [`NodeInfo`]); a YAML document that is
//!   a Service or an EndpointSlice is read in one pass, without a tree of
//!   values, and the documents of a file are read on every core. The first scan records the complete
//!   view into the [`FeedTx`]; after that a rescan compares only the keys of
//!   the files that changed, and records the objects whose version in effect
//!   changed (added, changed, removed).
//!
//! Submodules:
//!
//! * `parse`: one manifest file's YAML/JSON documents into objects, or an error.
//! * `state`: the directory as last read, the copy in effect per key, rescans.
//! * `watch`: following the directory ([`watch_dir`]): events (a rescan as soon as a file is complete, no fixed delay), rescan.
//! * `test_support` (tests only): sample manifests, a temp dir, the feed's view.
//!
//! [`ServiceInfo`]: crate::model::ServiceInfo
//! [`SliceInfo`]: crate::model::SliceInfo
//! [`NodeInfo`]: crate::model::NodeInfo
//! [`FeedTx`]: super::feed::FeedTx

mod block;
mod parse;
mod state;
#[cfg(test)]
mod test_support;
mod watch;

pub use parse::{
    load_file, parse_manifests, FileObjects, InvalidObject, ManifestError, SyntaxError,
};
pub use watch::{watch_dir, RESCAN_INTERVAL};
