//! Loading the eBPF object while the source reads its first view.
//!
//! Loading (parsing the object, creating or adopting the maps, the
//! verifier's pass over every program) needs nothing from the source but
//! the size of the IPv6 flow tables, which a node's first view decides (see
//! the agent's `ipv6_tables`). [`Preload::start`] loads on a thread of its
//! own with the size the pins suggest; [`Preload::finish`] hands the load
//! over when the first view agrees, and otherwise undoes it so that the
//! agent loads as if nothing had been tried.
//!
//! Undoing is exact: a load adopts the maps already pinned without writing
//! them, and pins only the maps that were absent; [`Preload`] remembers
//! which were, and removes those pins again (no program is attached yet, so
//! none uses them).
use std::{
    path::{Path, PathBuf},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use proxy_common::names;
use tracing::{info, warn};

use crate::{
    dataplane::load::object::{self, LoadError},
    sync::store::Capacities,
};

/// Logged when the first view sizes the IPv6 flow tables otherwise than the
/// early load did (a node's first IPv6 Service arrived while it was down).
const RELOAD: &str = "the early load sized the IPv6 flow tables otherwise: loading again";

/// A load under way on its own thread.
pub(super) struct Preload {
    /// The capacities it loads with.
    capacities: Capacities,
    /// The map pins that did not exist before it started.
    absent: Vec<PathBuf>,
    job: JoinHandle<Loaded>,
}

/// What the load's thread returns: the load and how long it took.
type Loaded = (Result<object::Loaded, LoadError>, Duration);

impl Preload {
    /// Starts loading `object` with `capacities`, unless a pinned map has
    /// another size: a resize then waits for the first view (it is rare,
    /// and it copies entries the running data path still writes).
    pub(super) fn start(
        object: &'static [u8],
        pin_root: &Path,
        capacities: Capacities,
    ) -> Option<Self> {
        if !object::capacity_mismatches(pin_root, &capacities).is_empty() {
            return None;
        }
        let absent = names::ALL
            .iter()
            .map(|name| pin_root.join(name))
            .filter(|pin| !pin.exists())
            .collect();
        let root = pin_root.to_owned();
        let job = std::thread::Builder::new()
            .name("sb-preload".to_owned())
            .spawn(move || {
                let started = Instant::now();
                let loaded = object::load(object, &root, &capacities, &[]);
                (loaded, started.elapsed())
            });
        match job {
            Ok(job) => Some(Self {
                capacities,
                absent,
                job,
            }),
            Err(error) => {
                // The agent loads after the first view instead.
                warn!(%error, "no thread to load the eBPF object early");
                None
            }
        }
    }

    /// The load, when it was made with `capacities`: waits for it to end.
    /// Otherwise the load is undone ([`Self::abandon`]) and `None` returned.
    pub(super) fn finish(
        self,
        capacities: &Capacities,
    ) -> Option<Result<object::Loaded, LoadError>> {
        if self.capacities.ipv6 != capacities.ipv6 {
            info!(
                guessed = ?self.capacities.ipv6,
                wanted = ?capacities.ipv6,
                "{RELOAD}"
            );
            self.abandon();
            return None;
        }
        let waited = Instant::now();
        let Some((loaded, took)) = join(self.job) else {
            unpin(&self.absent);
            return None;
        };
        info!(
            load_ms = took.as_secs_f64() * 1e3,
            waited_ms = waited.elapsed().as_secs_f64() * 1e3,
            "the eBPF object was loaded while the source read its first view"
        );
        Some(loaded)
    }

    /// Waits for the load to end, drops it and removes the pins it made.
    pub(super) fn abandon(self) {
        // Dropped here: its maps and programs close before their pins go.
        drop(join(self.job));
        unpin(&self.absent);
    }
}

/// Removes the pins the early load made (of `absent`, the ones it found
/// missing).
fn unpin(absent: &[PathBuf]) {
    for pin in absent {
        match std::fs::remove_file(pin) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                warn!(pin = %pin.display(), %error, "could not remove a pin the early load made")
            }
        }
    }
}

/// The thread's result; `None` (logged) if it panicked.
fn join(job: JoinHandle<Loaded>) -> Option<Loaded> {
    match job.join() {
        Ok(loaded) => Some(loaded),
        Err(_) => {
            warn!("the early load of the eBPF object panicked: loading again");
            None
        }
    }
}
