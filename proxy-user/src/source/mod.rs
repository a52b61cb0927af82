//! Where Services and EndpointSlices come from.
//!
//! `dir`: a directory of YAML/JSON manifests, followed as it changes.
//! `cluster`: the Kubernetes API server, through kube-runtime watchers.
//! Both hand the agent per-object changes through a [`feed`].

pub mod cluster;
pub mod dir;
pub mod feed;
pub mod wire;

pub use dir::{load_file, watch_dir, InvalidObject, ManifestError};
pub use feed::{feed, Changes, FeedRx, FeedTx};
