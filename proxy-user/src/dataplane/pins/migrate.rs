//! Pins an earlier version's agent left under the pin root in layouts this
//! version no longer uses, and how their contents come over, so an upgrade
//! resets no connection and loses no counter.
//!
//! | pin | layout | becomes |
//! |---|---|---|
//! | `SB_CT_V2` | LRU hash; both entries of a flow name its backend, replies find the frontend in `SB_RNAT_V1` | entries of `SB_CT_V5` |
//! | `SB_CT_V4` | LRU hash; entries carry their own translation, no TCP state | entries of `SB_CT_V5` |
//! | `SB_STATS_V1` | per-CPU counters 0-10 | added to the same counters of `SB_STATS_V5` |
//! | `SB_QUIET_V1` | quiet marks that last until a flow takes them | nothing: `SB_QUIET_V2` starts empty and the collector marks again |
//! | `SB_FE_FILTER_V1` | the frontend bitmap at a fixed 2^20 bits | nothing: `SB_FE_FILTER_V3` is written whole from the frontends before the programs that read it are attached |
//! | `SB_FE_FILTER_V2` | the frontend bitmap indexed by MurmurHash3's finalizer | nothing, as `SB_FE_FILTER_V1` |
//!
//! Flows are copied twice: at start, before the programs are replaced (the
//! old programs still track new flows in the old table meanwhile), and once
//! the new programs run ([`finish`]), for the flows of that window. Entries
//! already in the current table stay (`BPF_NOEXIST`). Counters are added
//! once, after the old programs are gone; the few packets the new programs
//! count during that read-and-write of a counter are lost to it. Each pin is
//! then removed. A pin of an earlier name whose map is not of that layout
//! is reported (its path and the problem) and left alone; the agent starts
//! all the same, and `status` goes on listing it.
//!
//! A migrated flow has no TCP state: it counts as answered (a reply entry is
//! `REPLIED`), so it is established by the rule of entries without
//! `HANDSHAKE` and keeps the established timeout, as before the upgrade.

use std::path::{Path, PathBuf};

use aya::maps::{HashMap, IterableMap as _, MapData, MapError, PerCpuArray, PerCpuValues};
use proxy_common::{
    ct_dir, ct_flags, ct_state, names, CtEntry, CtEntryV2, CtEntryV4, CtKey, RevNat,
};
use tracing::debug;

use crate::dataplane::{
    maps::PinnedMaps,
    pins::{MapsError, Pins},
};

/// The pins of earlier layouts, oldest first.
pub const EARLIER: [&str; 6] = [
    CONNTRACK_V2,
    names::CONNTRACK_V4,
    GLOBAL_STATS_V1,
    QUIET_V1,
    FRONTEND_FILTER_V1,
    FRONTEND_FILTER_V2,
];

/// The connection-tracking table before flows carried their own translation.
pub const CONNTRACK_V2: &str = names::CONNTRACK_V2;
/// The quiet marks before they named a generation: a mark lasted until
/// the pod's next flow took it. Only the previous release's programs read
/// it; once they are gone it is unpinned.
pub const QUIET_V1: &str = "SB_QUIET_V1";
/// The frontend bitmap before it was sized with the frontend map. Only the
/// previous release's programs read it (a downgrade to that release is
/// refused by the pin root's format); once they are gone it is unpinned.
pub const FRONTEND_FILTER_V1: &str = "SB_FE_FILTER_V1";
/// The frontend bitmap before its bits were chosen by Fibonacci hashing
/// (same sizes, other bits): as `FRONTEND_FILTER_V1`.
pub const FRONTEND_FILTER_V2: &str = "SB_FE_FILTER_V2";
/// The data-path counters before the socket layer's were added.
pub const GLOBAL_STATS_V1: &str = names::GLOBAL_STATS_V1;
/// How many counters `SB_STATS_V1` had; 1 to 10 mean what they mean now
/// (0 counted packets that were not ours, no longer counted).
const STATS_V1_COUNT: u32 = 11;

#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error(transparent)]
    Pin(#[from] MapsError),
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("pin {path} holds {found} counters, not the {STATS_V1_COUNT} of its layout")]
    Shape { path: PathBuf, found: u32 },
    #[error("adding the counters of {path} to the current ones")]
    Counters { path: PathBuf, source: MapError },
    #[error("removing the pin {path}")]
    Unpin {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// An earlier pin, migrated: how many entries came over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migrated {
    pub pin: &'static str,
    pub copied: usize,
}

/// A V2 entry in the current layout, seen at `now_ns`. A forward entry is
/// translated to its backend; a reply entry to the frontend of its service
/// (`frontend`, its `SB_RNAT_V1` value): without one the service was gone
/// and the V2 programs no longer translated its replies, nor does this.
pub fn from_v2(
    key: &CtKey,
    old: &CtEntryV2,
    frontend: Option<&RevNat>,
    now_ns: u64,
) -> Option<CtEntry> {
    let (nat_addr_be, nat_port_be, state) = if key.dir == ct_dir::REPLY {
        let frontend = frontend?;
        (frontend.addr_be, frontend.port_be, ct_state::REPLIED)
    } else {
        (old.backend_addr_be, old.backend_port_be, 0)
    };
    Some(CtEntry {
        backend_id: old.backend_id,
        service_id: old.service_id,
        nat_addr_be,
        nat_port_be,
        flags: 0,
        state,
        snat_addr_be: 0,
        snat_port_be: 0,
        _pad2: [0; 2],
        created_ns: old.created_ns,
        last_seen_ns: now_ns,
    })
}

/// A V4 entry in the current layout, seen at `now_ns`: a reply entry counts
/// as answered (V4 kept only flows that had packets both ways, or were
/// about to), a closing one as half-closed (V4 did not say which way the FIN
/// went; its next FIN or RST closes it).
pub fn from_v4(key: &CtKey, old: &CtEntryV4, now_ns: u64) -> CtEntry {
    let mut state = 0;
    if key.dir == ct_dir::REPLY {
        state |= ct_state::REPLIED;
    } else if old.flags & ct_flags::CLOSING != 0 {
        state |= ct_state::FIN;
    }
    CtEntry {
        backend_id: old.backend_id,
        service_id: old.service_id,
        nat_addr_be: old.nat_addr_be,
        nat_port_be: old.nat_port_be,
        flags: old.flags,
        state,
        snat_addr_be: old.snat_addr_be,
        snat_port_be: old.snat_port_be,
        _pad2: [0; 2],
        created_ns: old.created_ns,
        last_seen_ns: now_ns,
    }
}

/// The earlier map `opened`, if it is pinned.
fn if_pinned<M>(opened: Result<M, MapsError>) -> Result<Option<M>, MigrateError> {
    match opened {
        Ok(map) => Ok(Some(map)),
        Err(MapsError::NotPinned { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Every entry of the earlier connection-tracking table `opened` (pinned as
/// `name`), if it is pinned.
fn read_table<V: aya::Pod + bytemuck::Pod>(
    pins: Pins,
    name: &'static str,
    opened: Result<HashMap<MapData, CtKey, V>, MapsError>,
) -> Result<Option<Vec<(CtKey, V)>>, MigrateError> {
    let Some(table) = if_pinned(opened)? else {
        return Ok(None);
    };
    crate::dataplane::maps::batch::lookup_all::<CtKey, V>(table.map())
        .map(Some)
        .map_err(|source| MigrateError::Read {
            path: pins.path(name),
            source,
        })
}

/// Copies the flows of every earlier connection-tracking table pinned into
/// the current one, keeping what it holds: per table found, how many
/// entries came over, or why none could (the pin is then left alone).
pub fn copy_flows(pin_root: &Path, maps: &mut PinnedMaps) -> Vec<Result<Migrated, MigrateError>> {
    let now = crate::util::clock::monotonic_ns();
    let mut copied = Vec::new();
    let pins = Pins::new(pin_root);
    match read_table(pins, CONNTRACK_V2, pins.conntrack_v2()) {
        Ok(None) => {}
        Ok(Some(entries)) => {
            let converted: Vec<(CtKey, CtEntry)> = entries
                .iter()
                .filter_map(|(key, old)| {
                    let frontend = maps.revnat.get(&old.service_id, 0).ok();
                    from_v2(key, old, frontend.as_ref(), now).map(|entry| (*key, entry))
                })
                .collect();
            copied.push(Ok(Migrated {
                pin: CONNTRACK_V2,
                copied: insert_new(&mut maps.conntrack, &converted),
            }));
        }
        Err(e) => copied.push(Err(e)),
    }
    match read_table(pins, names::CONNTRACK_V4, pins.conntrack_v4()) {
        Ok(None) => {}
        Ok(Some(entries)) => {
            let converted: Vec<(CtKey, CtEntry)> = entries
                .iter()
                .map(|(key, old)| (*key, from_v4(key, old, now)))
                .collect();
            copied.push(Ok(Migrated {
                pin: names::CONNTRACK_V4,
                copied: insert_new(&mut maps.conntrack, &converted),
            }));
        }
        Err(e) => copied.push(Err(e)),
    }
    copied
}

/// Inserts each entry the table does not hold yet; how many were.
fn insert_new(table: &mut HashMap<MapData, CtKey, CtEntry>, entries: &[(CtKey, CtEntry)]) -> usize {
    // BPF_NOEXIST: what the new programs wrote stays.
    const NOEXIST: u64 = 1;
    entries
        .iter()
        .filter(|(key, entry)| table.insert(key, entry, NOEXIST).is_ok())
        .count()
}

/// Once the new programs replaced the old ones: copies the flows the old
/// programs tracked meanwhile, adds the earlier counters to the current
/// ones, and removes each earlier pin that came over. One record per pin
/// found: migrated and removed, or why not (the pin is then left alone).
pub fn finish(pin_root: &Path, maps: &mut PinnedMaps) -> Vec<Result<Migrated, MigrateError>> {
    let mut done = copy_flows(pin_root, maps);
    match add_counters(pin_root, &mut maps.stats) {
        Ok(None) => {}
        Ok(Some(copied)) => done.push(Ok(Migrated {
            pin: GLOBAL_STATS_V1,
            copied,
        })),
        Err(e) => done.push(Err(e)),
    }
    for pin in [QUIET_V1, FRONTEND_FILTER_V1, FRONTEND_FILTER_V2] {
        if pin_root.join(pin).exists() {
            done.push(Ok(Migrated { pin, copied: 0 }));
        }
    }
    done.into_iter()
        .map(|outcome| outcome.and_then(|m| unpin(pin_root, m)))
        .collect()
}

fn unpin(pin_root: &Path, migrated: Migrated) -> Result<Migrated, MigrateError> {
    let path = pin_root.join(migrated.pin);
    match std::fs::remove_file(&path) {
        Ok(()) => debug!(pin = migrated.pin, "earlier pin removed"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(MigrateError::Unpin { path, source }),
    }
    Ok(migrated)
}

/// Adds the counters of `SB_STATS_V1` to the current ones, CPU by CPU; how
/// many counters (`None`: not pinned).
fn add_counters(
    pin_root: &Path,
    stats: &mut PerCpuArray<MapData, u64>,
) -> Result<Option<usize>, MigrateError> {
    let pins = Pins::new(pin_root);
    let Some(old) = if_pinned(pins.stats_v1())? else {
        return Ok(None);
    };
    let path = pins.path(GLOBAL_STATS_V1);
    if old.len() != STATS_V1_COUNT {
        return Err(MigrateError::Shape {
            path,
            found: old.len(),
        });
    }
    for index in 1..STATS_V1_COUNT {
        let earlier = old
            .get(&index, 0)
            .map_err(|source| MigrateError::Counters {
                path: path.clone(),
                source,
            })?;
        let now = stats
            .get(&index, 0)
            .map_err(|source| MigrateError::Counters {
                path: path.clone(),
                source,
            })?;
        let sums: Vec<u64> = now
            .iter()
            .zip(earlier.iter())
            .map(|(a, b)| a.saturating_add(*b))
            .collect();
        let values = PerCpuValues::try_from(sums).map_err(|source| MigrateError::Read {
            path: path.clone(),
            source,
        })?;
        stats
            .set(index, values, 0)
            .map_err(|source| MigrateError::Counters {
                path: path.clone(),
                source,
            })?;
    }
    Ok(Some(STATS_V1_COUNT as usize - 1))
}

#[cfg(test)]
mod tests {
    use proxy_common::{ct_flags, proto};

    use super::*;
    use crate::dataplane::flows::expiry::{verdict, Flow, Phase, Timeouts};

    const S: u64 = 1_000_000_000;

    fn keys() -> (CtKey, CtKey) {
        let forward = CtKey {
            saddr_be: u32::from_be_bytes([10, 0, 0, 9]).to_be(),
            daddr_be: u32::from_be_bytes([10, 96, 0, 10]).to_be(),
            sport_be: 40_000u16.to_be(),
            dport_be: 80u16.to_be(),
            proto: proto::TCP,
            dir: ct_dir::FORWARD,
            _pad: [0; 2],
        };
        let reply = CtKey {
            saddr_be: u32::from_be_bytes([10, 244, 0, 2]).to_be(),
            daddr_be: forward.saddr_be,
            sport_be: 8080u16.to_be(),
            dport_be: forward.sport_be,
            dir: ct_dir::REPLY,
            ..forward
        };
        (forward, reply)
    }

    fn phase(forward: &CtEntry, reply: &CtEntry) -> Option<Phase> {
        let flow = Flow {
            protocol: proto::TCP,
            forward: Some(forward),
            reply: Some(reply),
        };
        verdict(&flow, &Timeouts::default()).and_then(|v| v.phase)
    }

    #[test]
    fn v2_flows_come_over_translated_both_ways_and_established() {
        let (fk, rk) = keys();
        let old = CtEntryV2 {
            backend_id: 3,
            service_id: 7,
            backend_addr_be: rk.saddr_be,
            backend_port_be: rk.sport_be,
            _pad: [0; 2],
            created_ns: 5,
        };
        let frontend = RevNat {
            addr_be: fk.daddr_be,
            port_be: fk.dport_be,
            proto: proto::TCP,
            ..RevNat::default()
        };
        let f = from_v2(&fk, &old, Some(&frontend), 99 * S).expect("a forward entry");
        let r = from_v2(&rk, &old, Some(&frontend), 99 * S).expect("a reply entry");
        // Forward packets go to the backend, replies come from the frontend.
        assert_eq!((f.nat_addr_be, f.nat_port_be), (rk.saddr_be, rk.sport_be));
        assert_eq!((r.nat_addr_be, r.nat_port_be), (fk.daddr_be, fk.dport_be));
        assert_eq!(
            (f.backend_id, f.service_id, f.created_ns, f.last_seen_ns),
            (3, 7, 5, 99 * S)
        );
        assert_eq!(
            f.flags & ct_flags::HANDSHAKE,
            0,
            "no handshake was recorded in V2"
        );
        assert_eq!(phase(&f, &r), Some(Phase::Established));
        // A service gone: its replies were no longer translated.
        assert_eq!(from_v2(&rk, &old, None, 99 * S), None);
        assert!(from_v2(&fk, &old, None, 99 * S).is_some());
    }

    #[test]
    fn v4_entries_come_over_as_answered_flows_seen_now() {
        let (fk, rk) = keys();
        let old = CtEntryV4 {
            backend_id: 3,
            service_id: 7,
            nat_addr_be: 1,
            nat_port_be: 2,
            flags: ct_flags::CLOSING,
            created_ns: 5,
            ..CtEntryV4::default()
        };
        let (f, r) = (from_v4(&fk, &old, 99 * S), from_v4(&rk, &old, 99 * S));
        assert_eq!(
            (f.backend_id, f.service_id, f.created_ns, f.last_seen_ns),
            (3, 7, 5, 99 * S)
        );
        assert_eq!(phase(&f, &r), Some(Phase::HalfClosed));
        let open = CtEntryV4 { flags: 0, ..old };
        let (f, r) = (from_v4(&fk, &open, 99 * S), from_v4(&rk, &open, 99 * S));
        assert_eq!(phase(&f, &r), Some(Phase::Established));
    }

    #[test]
    fn no_earlier_pin_bears_a_current_name() {
        for pin in EARLIER {
            assert!(!names::ALL.contains(&pin), "{pin} is a current name");
        }
    }
}
