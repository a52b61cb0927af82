//! The kernel memory of the pinned maps, as the kernel accounts it: the
//! `memlock` line of each map's file-descriptor info (for a preallocated
//! hash map, every entry it can hold, used or not). The maps keep their
//! sizes while an agent runs (a resize happens at its start), so one reading
//! after the load holds for the agent's life.
use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use proxy_common::names;
use serde::{Deserialize, Serialize};

use crate::dataplane::pins::{data_at, MapsError};

#[derive(Debug, thiserror::Error)]
pub enum MapMemoryError {
    #[error(transparent)]
    Open(#[from] MapsError),
    #[error("reading the kernel's information on map {map}")]
    Fdinfo {
        map: &'static str,
        source: std::io::Error,
    },
    #[error("the kernel's information on map {map} has no memlock line")]
    NoMemlock { map: &'static str },
}

/// One pinned map's size and kernel memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapMemory {
    pub map: String,
    pub max_entries: u32,
    pub bytes: u64,
}

/// `max_entries` and `memlock` from a map's fdinfo text.
fn parse_fdinfo(text: &str) -> (Option<u32>, Option<u64>) {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim())
        })
    };
    (
        field("max_entries").and_then(|v| v.parse().ok()),
        field("memlock").and_then(|v| v.parse().ok()),
    )
}

/// Every map of this version pinned under `pin_root` (one not pinned there
/// is left out), in [`names::ALL`] order.
pub fn map_memory(pin_root: &Path) -> Result<Vec<MapMemory>, MapMemoryError> {
    let mut out = Vec::new();
    for map in names::ALL {
        let data = match data_at(map, &pin_root.join(map)) {
            Ok(data) => data,
            Err(MapsError::NotPinned { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let fd = data.fd().as_fd().as_raw_fd();
        let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
            .map_err(|source| MapMemoryError::Fdinfo { map, source })?;
        let (max_entries, memlock) = parse_fdinfo(&text);
        out.push(MapMemory {
            map: map.to_owned(),
            max_entries: max_entries.unwrap_or(0),
            bytes: memlock.ok_or(MapMemoryError::NoMemlock { map })?,
        });
    }
    Ok(out)
}

/// The maps of one family, IPv6: what an IPv4-only node pays for IPv6.
const IPV6: [&str; 11] = [
    names::FRONTENDS6,
    names::BACKENDS6,
    names::CONNTRACK6,
    names::REVNAT6,
    names::AFFINITY6,
    names::SOCKETS6,
    names::FRAGMENTS6,
    names::SOURCE_RANGES6,
    names::TAIL_CALLS6,
    names::UPLINKS6,
    names::XDP_TAIL_CALLS6,
];

/// The maps' total, and the part the IPv6 maps take, in bytes.
pub fn totals(maps: &[MapMemory]) -> (u64, u64) {
    let total = maps.iter().map(|m| m.bytes).sum();
    let ipv6 = maps
        .iter()
        .filter(|m| IPV6.contains(&m.map.as_str()))
        .map(|m| m.bytes)
        .sum();
    (total, ipv6)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_fields_are_read() {
        let text = "pos:\t0\nflags:\t02000002\nmap_type:\t1\nkey_size:\t4\nvalue_size:\t8\nmax_entries:\t1024\nmap_flags:\t0x0\nmemlock:\t90112\nmap_id:\t50\n";
        assert_eq!(parse_fdinfo(text), (Some(1024), Some(90112)));
        assert_eq!(parse_fdinfo("pos:\t0\n"), (None, None));
    }

    #[test]
    fn totals_split_out_the_ipv6_maps() {
        let m = |map: &str, bytes| MapMemory {
            map: map.into(),
            max_entries: 1,
            bytes,
        };
        let maps = [
            m(names::CONNTRACK, 100),
            m(names::CONNTRACK6, 300),
            m(names::FRONTENDS6, 5),
        ];
        assert_eq!(totals(&maps), (405, 305));
    }
}
