//! The one way to open a pinned map: [`Pins`] knows each map switchboard
//! pins (its name in `proxy_common::names`, and the aya type its layout
//! reads as) and opens it from the pin root, typed. Every failure is a
//! [`MapsError`] that names the map and the path.
//!
//! [`PinnedMaps`](crate::dataplane::maps::PinnedMaps) (the agent's and the CLI's set),
//! the conntrack collector, the resize and
//! the CLI's `explain` and `conntrack` all open their pins here.

pub mod format;
pub mod growth;
pub mod memory;
pub mod resize;
use std::path::{Path, PathBuf};

use aya::maps::{lpm_trie::LpmTrie, Array, HashMap, Map, MapData, MapError, PerCpuArray};
use proxy_common::{
    names, prefilter::quiet::QuietMark, AffinityEntry, AffinityKey, AffinityKey6, Backend,
    Backend6, Config, CtEntry, CtEntry6, CtKey, CtKey6, FragEntry, FragEntry6, FragKey, FragKey6,
    FrontendKey, FrontendKey6, FrontendSlot, MaglevTable, RevNat, RevNat6, SockAffinityKey,
    SockEntry, SockEntry6, SockKey, SockKey6, SrcRange4, SrcRange6, SvcStats, Uplink,
};

/// Opening a pinned map failed. (The kernel's error is boxed: it is large,
/// and this error travels inside others.)
#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    #[error("map {name} is not pinned at {path} (is the agent running with this --pin-root?)")]
    NotPinned { name: &'static str, path: PathBuf },
    #[error("opening pinned map {name} at {path}")]
    Open {
        name: &'static str,
        path: PathBuf,
        source: Box<MapError>,
    },
    #[error("pinned map {name} at {path} is not of the type and layout its name stands for")]
    Layout {
        name: &'static str,
        path: PathBuf,
        source: Box<MapError>,
    },
    #[error("reading the capacity of pinned map {name} at {path}")]
    Info {
        name: &'static str,
        path: PathBuf,
        source: Box<MapError>,
    },
    #[error("filling the frontend bitmap under {} from the frontends pinned there", .pin_root.display())]
    Filter {
        pin_root: PathBuf,
        source: Box<crate::sync::store::WriteError>,
    },
}

/// The maps pinned under one pin root.
#[derive(Clone, Copy, Debug)]
pub struct Pins<'a> {
    root: &'a Path,
}

impl<'a> Pins<'a> {
    pub fn new(root: &'a Path) -> Self {
        Self { root }
    }

    /// Where the map `name` is pinned.
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// The map pinned as `name`, untyped (for its kernel info).
    pub fn data(&self, name: &'static str) -> Result<MapData, MapsError> {
        data_at(name, &self.path(name))
    }

    /// The map pinned as `name`, as `M`. Prefer the map's own function
    /// ([`frontends`](Self::frontends), ...), which knows its type.
    pub fn open<M: TryFrom<Map, Error = MapError>>(
        &self,
        name: &'static str,
    ) -> Result<M, MapsError> {
        open_at(name, &self.path(name))
    }

    /// How many entries `map`, pinned as `name`, holds at most.
    pub fn capacity(&self, name: &'static str, map: &MapData) -> Result<u32, MapsError> {
        map.info()
            .map(|info| info.max_entries())
            .map_err(|source| MapsError::Info {
                name,
                path: self.path(name),
                source: Box::new(source),
            })
    }
}

/// The map `name` pinned at `path` (its own name, or a staging pin beside
/// it), untyped. A path that is not there is [`MapsError::NotPinned`]; a pin
/// root one may not look into says why when the pin is opened (permission
/// denied).
pub fn data_at(name: &'static str, path: &Path) -> Result<MapData, MapsError> {
    if matches!(path.try_exists(), Ok(false)) {
        return Err(MapsError::NotPinned {
            name,
            path: path.to_owned(),
        });
    }
    MapData::from_pin(path).map_err(|source| MapsError::Open {
        name,
        path: path.to_owned(),
        source: Box::new(source),
    })
}

/// The map `name` pinned at `path`, as `M`.
pub fn open_at<M: TryFrom<Map, Error = MapError>>(
    name: &'static str,
    path: &Path,
) -> Result<M, MapsError> {
    let layout = |source| MapsError::Layout {
        name,
        path: path.to_owned(),
        source: Box::new(source),
    };
    let map = Map::from_map_data(data_at(name, path)?).map_err(layout)?;
    M::try_from(map).map_err(layout)
}

/// Each pinned map's function: its name and its type, once.
macro_rules! pinned_maps {
    ($($(#[$doc:meta])* $map:ident: $name:expr => $ty:ty;)*) => {
        impl Pins<'_> {
            $(
                $(#[$doc])*
                pub fn $map(&self) -> Result<$ty, MapsError> {
                    self.open($name)
                }
            )*
        }
    };
}

type Hash<K, V> = HashMap<MapData, K, V>;

pinned_maps! {
    frontends: names::FRONTENDS => Hash<FrontendKey, FrontendSlot>;
    backends: names::BACKENDS => Hash<u32, Backend>;
    revnat: names::REVNAT => Hash<u32, RevNat>;
    conntrack: names::CONNTRACK => Hash<CtKey, CtEntry>;
    sockets: names::SOCKETS => Hash<SockKey, SockEntry>;
    affinity: names::AFFINITY => Hash<AffinityKey, AffinityEntry>;
    sock_affinity: names::SOCK_AFFINITY => Hash<SockAffinityKey, AffinityEntry>;
    frontends6: names::FRONTENDS6 => Hash<FrontendKey6, FrontendSlot>;
    backends6: names::BACKENDS6 => Hash<u32, Backend6>;
    revnat6: names::REVNAT6 => Hash<u32, RevNat6>;
    conntrack6: names::CONNTRACK6 => Hash<CtKey6, CtEntry6>;
    sockets6: names::SOCKETS6 => Hash<SockKey6, SockEntry6>;
    affinity6: names::AFFINITY6 => Hash<AffinityKey6, AffinityEntry>;
    service_stats: names::SERVICE_STATS => PerCpuArray<MapData, SvcStats>;
    stats: names::GLOBAL_STATS => PerCpuArray<MapData, u64>;
    config: names::CONFIG => Array<MapData, Config>;
    uplinks: names::UPLINKS => Hash<u32, Uplink>;
    maglev: names::MAGLEV => Hash<u32, MaglevTable>;
    fragments: names::FRAGMENTS => Hash<FragKey, FragEntry>;
    fragments6: names::FRAGMENTS6 => Hash<FragKey6, FragEntry6>;
    source_ranges: names::SOURCE_RANGES => LpmTrie<MapData, SrcRange4, u8>;
    source_ranges6: names::SOURCE_RANGES6 => LpmTrie<MapData, SrcRange6, u8>;
    service_denied: names::SERVICE_DENIED => PerCpuArray<MapData, u64>;
    frontend_filter: names::FRONTEND_FILTER => Array<MapData, u64>;
    quiet_pods: names::QUIET_PODS => Array<MapData, QuietMark>;
    quiet_gens: names::QUIET_GENS => Array<MapData, u64>;
    ct_gen: names::CT_GEN => Array<MapData, u64>;
}
