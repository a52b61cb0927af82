//! The control plane section: Services × endpoints into the maps, next to
//! iptables-restore and `nft -f` of the same Services; then the control
//! plane at scale ([`super::scale`]), or, for a run from before that part,
//! its one-change and memory tables.

use std::fmt::Write as _;

use super::scale;
use crate::bench::fmt::{fmt_opt, raw, raw_f64, size_label};
use crate::bench::results::{LegacyRss, Results, SyncRun};

pub fn section(results: &Results) -> String {
    let sync_runs = results
        .sync
        .as_ref()
        .map(|s| s.runs.as_slice())
        .unwrap_or_default();
    let mut md = String::new();
    md.push_str("\n## Control plane\n\n| what | Services × endpoints | time |\n|---|---|---|\n");
    for run in sync_runs {
        let n = size_label(run.services.unwrap_or(0));
        let e = raw(run.endpoints_per_service);
        let _ = writeln!(
            md,
            "| switchboard: model (k8s objects → desired state) | {n} × {e} | {} ms |",
            fmt_opt(run.model_ms, 1)
        );
        let _ = writeln!(
            md,
            "| switchboard: Syncer::apply into kernel maps ({} map writes) | {n} × {e} | {} ms |",
            raw(run.map_writes),
            fmt_opt(run.apply_ms, 1)
        );
        let _ = writeln!(
            md,
            "| switchboard: apply again, nothing changed | {n} × {e} | {} ms |",
            fmt_opt(run.noop_apply_ms, 1)
        );
    }
    for p in results.programming.as_deref().unwrap_or_default() {
        let _ = writeln!(
            md,
            "| {} | {} × 10 | {} ms |",
            p.tool,
            size_label(p.services),
            fmt_opt(Some(p.seconds * 1000.0), 0)
        );
    }
    match &results.scale {
        Some(s) => md.push_str(&scale::section(s, sync_runs)),
        None => legacy_change_and_rss(&mut md, sync_runs, &results.rss),
    }
    md
}

/// The one-change and memory tables of runs from before the "Control plane
/// at scale" section.
fn legacy_change_and_rss(md: &mut String, sync_runs: &[SyncRun], rss: &[LegacyRss]) {
    md.push_str("\nOne EndpointSlice change (one endpoint replaced) → maps written, the old way (rebuild the model from every object, then apply):\n\n| Services | total p50 | total p99 | model p50 | apply p50 | apply p99 | map writes |\n|---|---|---|---|---|---|---|\n");
    for run in sync_runs {
        let none = Default::default();
        let c = run.one_slice_change.as_ref().unwrap_or(&none);
        let _ = writeln!(
            md,
            "| {} | {} ms | {} ms | {} ms | {} ms | {} ms | {} |",
            size_label(run.services.unwrap_or(0)),
            fmt_opt(c.total.p50_ms, 2),
            fmt_opt(c.total.p99_ms, 2),
            fmt_opt(c.model.p50_ms, 2),
            fmt_opt(c.apply.p50_ms, 2),
            fmt_opt(c.apply.p99_ms, 2),
            raw_f64(c.writes_per_change_median),
        );
    }
    md.push_str("\nAgent resident memory (a real `switchboard agent --source dir:` in a sandbox, fresh pins, Services × 10 endpoints as YAML):\n\n| Services | RSS | peak RSS | start → maps synced | manifests |\n|---|---|---|---|---|\n");
    for r in rss {
        let _ = writeln!(
            md,
            "| {} | {} MiB | {} MiB | {} s | {} MiB |",
            size_label(r.services.unwrap_or(0)),
            fmt_opt(r.rss_mib, 1),
            fmt_opt(r.peak_rss_mib, 1),
            fmt_opt(r.startup_to_synced_s, 2),
            fmt_opt(r.manifest_mib, 1),
        );
    }
}
