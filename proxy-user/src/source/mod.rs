//! Where Services and EndpointSlices come from.
//!
//! `dir`: a directory of YAML/JSON manifests, followed as it changes.
//! `cluster`: the Kubernetes API server, through kube-runtime reflectors.

pub mod cluster;
pub mod dir;
pub mod feed;

pub use dir::{load_file, watch_dir, InvalidObject, ManifestError, Snapshot};
