//! The benchmark report: `report.md` (machine, kernel, commit, every figure,
//! the goals with the ratios computed from this run's numbers), the
//! figures the docs may quote (`figures.json`) and SVG plots drawn with
//! plotters. One writer per section, in the report's order: the header,
//! the goals and what limits them ([`limits`]), end to end ([`e2e`], then
//! each conn/s row against its limit and the light workload, [`light`]), per
//! packet ([`perpacket`]), the control plane ([`control`], then
//! [`scale`]), the forwarding rate ([`forwarding`]) and north-south
//! ([`northsouth`]).

mod control;
mod e2e;
mod forwarding;
mod light;
mod limits;
mod northsouth;
mod perpacket;
mod plots;
mod scale;

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::Result;

use super::goals::{self, verdict, Goal};
use super::results::{Meta, Results};

/// The file of the figures the docs may quote (the Goals table and the
/// run's header): `figures.json`, next to report.md.
pub(super) const FIGURES_FILE: &str = "figures.json";

/// Writes report.md and the plots into `dir`; returns the headline table
/// (also printed at the end of the run).
pub fn write(results: &Results, dir: &Path) -> Result<String> {
    let goals = goals::all(results);
    let headline = goals_table(&goals);
    write_figures(&results.meta, &goals, dir)?;
    let mut md = header(&results.meta);
    md.push_str("## Goals\n\n");
    md.push_str(&headline);
    md.push_str(&limits::section(results));
    let (e2e, table) = e2e::section(results);
    md.push_str(&e2e);
    md.push_str(&light::section(results));
    md.push_str(&perpacket::section(results.perpacket.as_ref()));
    md.push_str(&control::section(results));
    md.push_str(&forwarding::section(results.fwd.as_ref()));
    if let Some(ns) = &results.northsouth {
        md.push_str(&northsouth::section(ns));
    }
    fs::write(dir.join("report.md"), &md)?;
    plots::draw(results, dir);
    Ok(headline + "\n" + &table)
}

/// The title and the run's machine, kernel, commit and tools.
fn header(meta: &Meta) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# switchboard benchmark — {}\n", meta.timestamp);
    let _ = writeln!(
        md,
        "- mode: {} (`cargo xtask bench{}`)\n- machine: {} × {}, {:.1} GiB\n- kernel: {}\n- commit: {}{}\n- tools: {}; {}; {}\n",
        meta.mode,
        if meta.mode == "quick" { " --quick" } else { "" },
        meta.cpus,
        meta.cpu,
        meta.memory_gib,
        meta.kernel,
        meta.commit,
        if meta.dirty { " (with uncommitted changes)" } else { "" },
        meta.iptables,
        meta.nft,
        meta.wrk,
    );
    if let Some(agent) = &meta.switchboard_binary {
        let _ = writeln!(
            md,
            "- agent: `{agent}` (`SB_BENCH_SWITCHBOARD`: another build's agent and programs in the end-to-end, scale and north-south parts; the per-packet rows measure this commit's object)\n"
        );
    }
    md.push_str("Every figure below was measured in this run; ratios are computed from them.\n\n");
    md
}

/// The Goals table.
fn goals_table(goals: &[Goal]) -> String {
    let mut table = String::new();
    let _ = writeln!(table, "| goal | target | measured | |\n|---|---|---|---|");
    for g in goals {
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} |",
            g.what,
            g.goal,
            g.measured,
            verdict(g.met)
        );
    }
    table
}

/// Writes [`FIGURES_FILE`] into `dir`; a full run's copy goes to
/// `docs/benchmarks/latest.json`, where the docs check reads it.
fn write_figures(meta: &Meta, goals: &[Goal], dir: &Path) -> Result<()> {
    let figures = crate::docs::BenchFigures {
        run: meta.timestamp.clone(),
        mode: meta.mode.clone(),
        commit: meta.commit.clone(),
        machine: format!("{} × {}, {:.1} GiB", meta.cpus, meta.cpu, meta.memory_gib),
        kernel: meta.kernel.clone(),
        goals: goals
            .iter()
            .map(|g| crate::docs::GoalFigure {
                goal: g.what.clone(),
                target: g.goal.clone(),
                measured: g.measured.clone(),
                verdict: verdict(g.met).trim_matches('*').to_string(),
            })
            .collect(),
    };
    let mut json = serde_json::to_string_pretty(&figures)?;
    json.push('\n');
    fs::write(dir.join(FIGURES_FILE), json)?;
    Ok(())
}
