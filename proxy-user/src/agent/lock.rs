//! The start's first phase: the pin root checked and locked, and the undo
//! of a first start that fails.
use std::path::{Path, PathBuf};

use tracing::warn;

use crate::{
    dataplane::{load::object, pins::format},
    observe::lock::{self, AgentLock},
    observe::status,
};

/// The pin root, held for as long as the agent runs.
pub(super) struct LockedPinRoot {
    /// Dropped before the lock (fields drop in order): a failed first
    /// start takes its pins away while no other agent can start.
    first_start: FirstStart,
    pub lock: AgentLock,
    /// The format stamp the pin root had before this start (`None`: none).
    pub format: Option<u32>,
}

/// Checks the pin root and takes its lock. A pin root that is refused (not
/// a BPF file system, or stamped by a newer version) is refused before the
/// lock, so no lock file is left behind, and before anything is touched.
pub(super) fn lock_pin_root(pin_root: &Path) -> anyhow::Result<LockedPinRoot> {
    object::check_pin_root(pin_root)?;
    let format = format::check_format(pin_root)?;
    let lock = lock::acquire(pin_root)?;
    Ok(LockedPinRoot {
        first_start: FirstStart::new(pin_root),
        lock,
        format,
    })
}

impl LockedPinRoot {
    /// The programs took over: from here on a failure leaves what this
    /// start pinned in place.
    pub(super) fn start_succeeded(&mut self) {
        self.first_start.armed = false;
    }
}

/// The first start on a pin root (nothing of switchboard's pinned there):
/// if it fails, dropping this removes every pin it made (maps, links, the
/// format stamp) and the status file, so that the pin root is as it was.
/// A start on a pin root with pins leaves them: the data path they hold
/// keeps forwarding.
struct FirstStart {
    pin_root: PathBuf,
    /// Whether the pin root was empty and the start has not yet succeeded.
    armed: bool,
    /// Whether the status file was there before (then it stays).
    had_status: bool,
}

impl FirstStart {
    fn new(pin_root: &Path) -> Self {
        let ours = |dir: &Path, all: bool| {
            std::fs::read_dir(dir).map_or(0, |entries| {
                entries
                    .flatten()
                    .filter(|e| all || e.file_name().to_string_lossy().starts_with("SB_"))
                    .count()
            })
        };
        Self {
            pin_root: pin_root.to_owned(),
            armed: ours(pin_root, false) == 0 && ours(&pin_root.join("links"), true) == 0,
            had_status: status::status_path(pin_root).exists(),
        }
    }
}

impl Drop for FirstStart {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let removed = remove_pins(&self.pin_root);
        if !self.had_status {
            let _ = std::fs::remove_file(status::status_path(&self.pin_root));
        }
        if removed > 0 {
            warn!(removed, pin_root = %self.pin_root.display(), "the first start on this pin root failed: the pins it made are removed");
        }
    }
}

/// Removes the link pins (detaching their programs), the `links`
/// directory and every `SB_` pin under `pin_root`; returns how many pins
/// went. Failures are logged: this runs on the way out of a failed start.
fn remove_pins(pin_root: &Path) -> usize {
    let mut removed = 0;
    let mut remove = |path: &Path| match std::fs::remove_file(path) {
        Ok(()) => removed += 1,
        Err(error) => warn!(pin = %path.display(), %error, "could not remove a pin"),
    };
    let links = pin_root.join("links");
    for entry in std::fs::read_dir(&links).into_iter().flatten().flatten() {
        remove(&entry.path());
    }
    for entry in std::fs::read_dir(pin_root).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with("SB_") {
            remove(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(&links);
    removed
}
