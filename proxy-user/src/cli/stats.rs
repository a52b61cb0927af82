//! `switchboard stats`: the data path's counters (shared by both address
//! families) and how full each map is (each IPv6 table next to its IPv4
//! twin).
use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use aya::maps::IterableMap as _;
use serde::Serialize;

use crate::dataplane::maps::PinnedMaps;

/// What `switchboard stats` reports.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct StatsReport {
    /// Global counters by name (see `proxy_common::stat`).
    pub counters: BTreeMap<&'static str, u64>,
    pub maps: Vec<MapFill>,
}

/// The counter of packets denied by `loadBalancerSourceRanges`, summed over
/// every service.
pub const DENIED_SOURCE_RANGE: &str = "denied_source_range";

/// How full a map is.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct MapFill {
    pub map: &'static str,
    pub entries: usize,
    pub capacity: u32,
}

fn fill(map: &'static str, entries: usize, capacity: u32) -> MapFill {
    MapFill {
        map,
        entries,
        capacity,
    }
}

/// How full a hash map is, by walking its keys.
fn hash_fill<K: aya::Pod, V: aya::Pod>(
    map: &'static str,
    table: &aya::maps::HashMap<aya::maps::MapData, K, V>,
) -> MapFill {
    let capacity = table.map().info().map_or(0, |i| i.max_entries());
    fill(map, table.keys().filter(Result::is_ok).count(), capacity)
}

/// Reads the counters and how full the hash maps are (counting entries walks
/// each map: fine for an on-call look, not for a hot loop).
pub fn read_stats(maps: &PinnedMaps) -> StatsReport {
    let capacity =
        |info: Result<aya::maps::MapInfo, aya::maps::MapError>| info.map_or(0, |i| i.max_entries());
    let mut counters: BTreeMap<&'static str, u64> = maps.global_stats().into_iter().collect();
    // Kept per service (`SB_SVC_DENIED_V1`, see `services`); the total here.
    counters.insert(DENIED_SOURCE_RANGE, maps.denied_by_service().values().sum());
    let blocks = maps.source_range_blocks();
    let v4_blocks = blocks.iter().filter(|(_, b)| b.is_ipv4()).count();
    StatsReport {
        counters,
        maps: vec![
            hash_fill(proxy_common::names::FRONTENDS, &maps.frontends),
            hash_fill(proxy_common::names::FRONTENDS6, &maps.frontends6),
            hash_fill(proxy_common::names::BACKENDS, &maps.backends),
            hash_fill(proxy_common::names::BACKENDS6, &maps.backends6),
            fill(
                proxy_common::names::CONNTRACK,
                maps.conntrack_len(),
                capacity(maps.conntrack.map().info()),
            ),
            fill(
                proxy_common::names::CONNTRACK6,
                maps.conntrack6_len(),
                capacity(maps.conntrack6.map().info()),
            ),
            hash_fill(proxy_common::names::REVNAT, &maps.revnat),
            hash_fill(proxy_common::names::REVNAT6, &maps.revnat6),
            fill(
                proxy_common::names::SOCKETS,
                maps.sockets_len(),
                capacity(maps.sockets.map().info()),
            ),
            fill(
                proxy_common::names::SOCKETS6,
                maps.sockets6_len(),
                capacity(maps.sockets6.map().info()),
            ),
            hash_fill(proxy_common::names::FRAGMENTS, &maps.fragments),
            fill(
                proxy_common::names::SOURCE_RANGES,
                v4_blocks,
                capacity(maps.source_ranges.map().info()),
            ),
            fill(
                proxy_common::names::SOURCE_RANGES6,
                blocks.len() - v4_blocks,
                capacity(maps.source_ranges6.map().info()),
            ),
        ]
        .into_iter()
        // An agent older than IPv6 has no IPv6 maps: no row for them.
        .filter(|m| !maps.absent_ipv6().contains(&m.map))
        .collect(),
    }
}

pub fn render_stats(report: &StatsReport) -> String {
    let mut out = String::new();
    let width = report.counters.keys().map(|k| k.len()).max().unwrap_or(0);
    let _ = writeln!(out, "COUNTERS");
    for (name, value) in &report.counters {
        let _ = writeln!(out, "  {name:<width$}  {value}");
    }
    let _ = writeln!(out, "MAPS");
    for m in &report.maps {
        let percent = if m.capacity == 0 {
            0.0
        } else {
            m.entries as f64 * 100.0 / f64::from(m.capacity)
        };
        let _ = writeln!(
            out,
            "  {:<14}  {:>8} / {:<8} ({percent:.1}% full)",
            m.map, m.entries, m.capacity
        );
    }
    out
}

/// Runs `switchboard stats`.
pub fn stats(pin_root: &Path, json: bool) -> anyhow::Result<String> {
    let maps = super::open_maps(pin_root)?;
    let report = read_stats(&maps);
    if json {
        Ok(serde_json::to_string_pretty(&report)? + "\n")
    } else {
        Ok(render_stats(&report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_show_counters_and_how_full_each_map_is() {
        let report = StatsReport {
            counters: [("forwarded", 10u64), ("malformed", 1)]
                .into_iter()
                .collect(),
            maps: vec![fill("SB_FE_V1", 16384, 65536)],
        };
        let text = render_stats(&report);
        assert!(text.contains("forwarded"));
        assert!(text.contains("16384 / 65536"));
        assert!(text.contains("25.0% full"));
    }
}
