//! Resizing pinned maps online, without losing flows.
//!
//! A pinned map keeps the size and the flags it was created with, and aya
//! reuses a pinned map as it finds it. When a `--max-*` flag asks for
//! another size, a flow table grows ([`crate::dataplane::pins::growth`]), or a map
//! the object allocates per entry was pinned preallocated, the agent
//! loads its object with a fresh map of the new size pinned beside the old
//! one (`<NAME>_resize`), copies every entry over, syncs, and attaches the
//! programs (which use the new map from then on). It then copies again what
//! the old programs created in the meantime (new connections between the
//! first copy and the swap), without overwriting what the new programs wrote,
//! and finally moves the new pin over the old name. A map shrunk below its
//! entry count keeps what fits; the rest is counted and said.
//!
//! An agent that dies half-way leaves the old pin in place (the next start
//! removes every stale `_resize` pin, whether or not it resizes, and starts
//! over), so the maps a restart adopts are always the ones under their own
//! names.
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use aya::{
    maps::{HashMap, MapData, MapError, PerCpuArray, PerCpuValues},
    Pod,
};
use proxy_common::names;
use tracing::{info, warn};

use crate::dataplane::pins::{open_at, MapsError, Pins};

#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    #[error(transparent)]
    Pin(#[from] MapsError),
    #[error("removing the stale resize pin {path}")]
    Stale { path: PathBuf, source: io::Error },
    #[error("moving the resized map {map} over its old pin {path}")]
    Rename {
        map: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("copying the entries of map {map} into its resized copy")]
    Copy { map: &'static str, source: MapError },
    #[error("map {map} cannot be resized online")]
    Unsupported { map: &'static str },
}

/// A pinned map whose capacity differs from the one asked for, or that is
/// preallocated where the object allocates it per entry: the agent
/// recreates it online (see this module's documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityMismatch {
    pub map: &'static str,
    /// The flag that sets it.
    pub flag: &'static str,
    pub pinned: u32,
    pub wanted: u32,
    /// Pinned preallocated; the object allocates it per entry.
    pub preallocated: bool,
}

impl std::fmt::Display for CapacityMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pinned map {} holds {} entries and {} asks for {}",
            self.map, self.pinned, self.flag, self.wanted
        )?;
        if self.preallocated {
            f.write_str("; it is preallocated and is recreated allocated per entry")?;
        }
        Ok(())
    }
}

/// What a staging pin's name ends with.
pub const STAGING_SUFFIX: &str = "_resize";

/// Where the new map of `map` is pinned until it replaces the old one.
pub fn staging_path(pin_root: &Path, map: &str) -> PathBuf {
    pin_root.join(format!("{map}{STAGING_SUFFIX}"))
}

/// The staging pins under `pin_root`, by name (sorted). With no agent
/// resizing, each is left by one that died during a resize: a whole map,
/// locked in kernel memory, that nothing uses.
pub fn staging_pins(pin_root: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(pin_root) else {
        return Vec::new();
    };
    let mut found: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(STAGING_SUFFIX))
        .collect();
    found.sort();
    found
}

/// Removes every staging pin under `pin_root` (the caller holds the pin
/// root's lock: no other agent is resizing). Returns the names removed.
pub fn remove_staging_pins(pin_root: &Path) -> Result<Vec<String>, ResizeError> {
    let mut removed = Vec::new();
    for name in staging_pins(pin_root) {
        let path = pin_root.join(&name);
        match fs::remove_file(&path) {
            Ok(()) => {
                warn!(pin = %path.display(), "removed the staging pin of an interrupted resize");
                removed.push(name);
            }
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(ResizeError::Stale { path, source }),
        }
    }
    Ok(removed)
}

/// The maps being resized, old and new, until [`Resize::finish`].
pub struct Resize {
    pin_root: PathBuf,
    maps: Vec<&'static str>,
}

/// What one copy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    pub copied: usize,
    /// Entries that did not fit (the new map is smaller and full).
    pub dropped: usize,
}

impl Resize {
    /// Prepares resizing the maps in `mismatches` (none: nothing to resize):
    /// removes every stale staging pin an earlier, interrupted agent left,
    /// those of maps that are not resized now included. The caller loads the
    /// object with the maps in `mismatches` pinned at [`staging_path`].
    pub fn prepare(pin_root: &Path, mismatches: &[CapacityMismatch]) -> Result<Self, ResizeError> {
        let maps: Vec<&'static str> = mismatches.iter().map(|m| m.map).collect();
        remove_staging_pins(pin_root)?;
        Ok(Self {
            pin_root: pin_root.to_owned(),
            maps,
        })
    }

    /// The maps being resized.
    pub fn maps(&self) -> &[&'static str] {
        &self.maps
    }

    /// Copies every entry of the old maps into the new ones (before the
    /// sync: the new frontend, backend and reverse-NAT maps then hold what
    /// the syncer adopts). `overwrite: false` keeps entries already in the
    /// new map (the second copy, after the swap).
    pub fn copy(&self, overwrite: bool) -> Result<Vec<(&'static str, Copied)>, ResizeError> {
        let mut done = Vec::new();
        for &map in &self.maps {
            let copied = copy_map(&self.pin_root, map, overwrite)?;
            if copied.dropped > 0 {
                warn!(
                    map,
                    copied = copied.copied,
                    dropped = copied.dropped,
                    "the resized map is too small for every entry"
                );
            }
            done.push((map, copied));
        }
        Ok(done)
    }

    /// Moves each new map over its old pin (after the programs use them).
    pub fn finish(self) -> Result<(), ResizeError> {
        for map in self.maps {
            let path = self.pin_root.join(map);
            fs::rename(staging_path(&self.pin_root, map), &path)
                .map_err(|source| ResizeError::Rename { map, path, source })?;
            info!(map, "map resized");
        }
        Ok(())
    }
}

/// Copies the map pinned as `map` into its staging pin, each opened as the
/// type of that map.
fn copy_map(pin_root: &Path, map: &'static str, overwrite: bool) -> Result<Copied, ResizeError> {
    let pins = Pins::new(pin_root);
    let staging = staging_path(pin_root, map);
    let copied = match map {
        names::FRONTENDS => copy_hash(pins.frontends()?, open_at(map, &staging)?, overwrite),
        names::BACKENDS => copy_hash(pins.backends()?, open_at(map, &staging)?, overwrite),
        names::CONNTRACK => copy_hash(pins.conntrack()?, open_at(map, &staging)?, overwrite),
        names::AFFINITY => copy_hash(pins.affinity()?, open_at(map, &staging)?, overwrite),
        names::SOCK_AFFINITY => {
            copy_hash(pins.sock_affinity()?, open_at(map, &staging)?, overwrite)
        }
        names::FRAGMENTS => copy_hash(pins.fragments()?, open_at(map, &staging)?, overwrite),
        names::REVNAT => copy_hash(pins.revnat()?, open_at(map, &staging)?, overwrite),
        names::SOCKETS => copy_hash(pins.sockets()?, open_at(map, &staging)?, overwrite),
        names::FRONTENDS6 => copy_hash(pins.frontends6()?, open_at(map, &staging)?, overwrite),
        names::BACKENDS6 => copy_hash(pins.backends6()?, open_at(map, &staging)?, overwrite),
        names::CONNTRACK6 => copy_hash(pins.conntrack6()?, open_at(map, &staging)?, overwrite),
        names::REVNAT6 => copy_hash(pins.revnat6()?, open_at(map, &staging)?, overwrite),
        names::SOCKETS6 => copy_hash(pins.sockets6()?, open_at(map, &staging)?, overwrite),
        names::AFFINITY6 => copy_hash(pins.affinity6()?, open_at(map, &staging)?, overwrite),
        names::FRAGMENTS6 => copy_hash(pins.fragments6()?, open_at(map, &staging)?, overwrite),
        names::SERVICE_STATS => copy_per_cpu_array(pins.service_stats()?, open_at(map, &staging)?),
        names::SERVICE_DENIED => {
            copy_per_cpu_array(pins.service_denied()?, open_at(map, &staging)?)
        }
        // Nothing to copy: the agent writes the new bitmap whole, for the
        // frontends the (copied) frontend maps hold, before the programs
        // that read it are attached; its bits sit elsewhere at a new size.
        names::FRONTEND_FILTER => Ok(Copied::default()),
        _ => return Err(ResizeError::Unsupported { map }),
    };
    copied.map_err(|source| ResizeError::Copy { map, source })
}

/// Copies a hash (or LRU hash) map entry by entry.
fn copy_hash<K: Pod, V: Pod>(
    old: HashMap<MapData, K, V>,
    mut new: HashMap<MapData, K, V>,
    overwrite: bool,
) -> Result<Copied, MapError> {
    // BPF_ANY overwrites, BPF_NOEXIST keeps what the new programs wrote.
    let flags = if overwrite { 0 } else { 1 };
    let mut result = Copied::default();
    for entry in old.iter() {
        // An entry that vanished while we walked (LRU eviction, expiry) is
        // simply not copied.
        let Ok((key, value)) = entry else { continue };
        match new.insert(key, value, flags) {
            Ok(()) => result.copied += 1,
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::E2BIG) => {
                result.dropped += 1
            }
            Err(error) => return Err(error),
        }
    }
    Ok(result)
}

/// Copies a per-CPU array index by index, as far as the smaller one reaches.
fn copy_per_cpu_array<V: Pod>(
    old: PerCpuArray<MapData, V>,
    mut new: PerCpuArray<MapData, V>,
) -> Result<Copied, MapError> {
    let (old_len, new_len) = (old.len(), new.len());
    let mut result = Copied::default();
    for index in 0..old_len.min(new_len) {
        let values = old.get(&index, 0)?;
        let values: Vec<V> = values.iter().copied().collect();
        new.set(index, PerCpuValues::try_from(values)?, 0)?;
        result.copied += 1;
    }
    result.dropped = old_len.saturating_sub(new_len) as usize;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A start killed during a resize left `_resize` pins that a
    /// later start which did not resize never removed. (A plain directory
    /// stands in for the bpffs: the pins are only names here.)
    #[test]
    fn every_stale_staging_pin_goes_at_start_whether_or_not_it_resizes() {
        let root = std::env::temp_dir().join(format!("sb-resize-stale-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("mkdir");
        for name in [names::CONNTRACK, names::FRONTENDS] {
            fs::write(root.join(name), "").expect("pin");
        }
        fs::write(staging_path(&root, names::CONNTRACK), "").expect("stale");
        fs::write(staging_path(&root, names::SOCKETS6), "").expect("stale");
        let mut want = vec![
            format!("{}{STAGING_SUFFIX}", names::CONNTRACK),
            format!("{}{STAGING_SUFFIX}", names::SOCKETS6),
        ];
        want.sort();
        assert_eq!(staging_pins(&root), want);
        let resize = Resize::prepare(&root, &[]).expect("prepare without resizing");
        assert!(resize.maps().is_empty());
        assert!(staging_pins(&root).is_empty(), "no staging pin is left");
        assert!(
            root.join(names::CONNTRACK).exists() && root.join(names::FRONTENDS).exists(),
            "the maps stay"
        );
        assert!(remove_staging_pins(&root).expect("again").is_empty());
        let _ = fs::remove_dir_all(&root);
    }
}
