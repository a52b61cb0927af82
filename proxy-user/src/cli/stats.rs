//! `switchboard stats`: the data path's counters (shared by both address
//! families) and how full each map is (each IPv6 table next to its IPv4
//! twin).
use std::{fmt::Write as _, path::Path};

use crate::dataplane::maps::readback::{read_stats, StatsReport};

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
    use crate::dataplane::maps::readback::fill;

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
