//! The "Control plane at scale" section: one change through the
//! incremental model, the agent's start and memory from both sources,
//! watch event → map write, file change → new backend, and churn; each
//! figure next to its target ([`targets`]).

use std::fmt::Write as _;

use crate::bench::fmt::{fmt_opt, raw, raw_f64, size_label};
use crate::bench::goals::{targets, verdict};
use crate::bench::results::{Churn, Scale, StartRow, SyncRun};

/// The section, after the control plane's; `sync_runs` give the old
/// whole-model rebuild's one change, for comparison.
pub fn section(scale: &Scale, sync_runs: &[SyncRun]) -> String {
    let mut md = String::from("\n## Control plane at scale\n");
    one_change(&mut md, scale, sync_runs);
    start(&mut md, &scale.start);
    memory(&mut md, &scale.start);
    rss_beyond_heap(&mut md, &scale.start);
    kernel_memory(&mut md, &scale.start);
    event_to_map(&mut md, &scale.start);
    file_change(&mut md, &scale.start);
    if let Some(r) = scale.start.iter().find(|r| r.rss_after_churn_mib.is_some()) {
        let _ = writeln!(
            md,
            "\nAfter the churn below, the same agent ({} Services, cluster source): RSS {} MiB, peak {} MiB.",
            size_label(r.services),
            fmt_opt(r.rss_after_churn_mib, 1),
            fmt_opt(r.peak_rss_after_churn_mib, 1)
        );
    }
    if let Some(churn) = &scale.churn {
        churn_table(&mut md, churn);
    }
    md
}

/// The row's source as the tables name it.
fn source_label(row: &StartRow) -> &'static str {
    match (row.source.as_str(), row.yaml_style.as_deref()) {
        ("cluster", _) => "cluster (fake API server)",
        (_, Some("block")) => "YAML, block style",
        (_, Some("flow")) => "YAML, flow style",
        _ => "YAML",
    }
}

/// `≤ 5 ms` and whether `value` meets it; `–` without a target.
fn against(bound: Option<f64>, value: Option<f64>, unit: &str) -> (String, String) {
    match bound {
        Some(b) => (
            format!("< {b} {unit}"),
            verdict(value.map(|v| v < b)).to_string(),
        ),
        None => ("–".into(), "no target".into()),
    }
}

/// One EndpointSlice change → maps, incremental and (for comparison) the
/// old whole rebuild.
fn one_change(md: &mut String, scale: &Scale, sync_runs: &[SyncRun]) {
    let runs = scale
        .change
        .as_ref()
        .map(|c| c.runs.as_slice())
        .unwrap_or_default();
    md.push_str("\n### One EndpointSlice change → maps\n\nIn process (`sb_bench change`), into real kernel maps, Services × 10 endpoints, one endpoint of one slice replaced per change. Incremental: per change, the decoded slice is converted (`SliceInfo::from_k8s`, as the source does), then `Model::set_slice` + `Model::update` (that one Service recomputed), then `Syncer::apply_changed` on the frontends the update reported; each change is checked (one Service recomputed, one frontend updated, with the new backend). The old way, for comparison: the whole model rebuilt from every object, then `Syncer::apply` diffing every frontend (`sb_bench sync`).\n\n| Services | way | changes | total p50 | total p99 | max | convert p50 | model p50 | maps p50 | map writes | target (p99) | |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for run in runs {
        let n = run.services.unwrap_or(0);
        let p99 = run.total.p99_ms;
        let (target, met) = against(targets::at(&targets::CHANGE_P99_MS, n), p99, "ms");
        let _ = writeln!(
            md,
            "| {} | incremental | {} | {} ms | {} ms | {} ms | {} ms | {} ms | {} ms | {} | {target} | {met} |",
            size_label(n),
            raw(run.total.samples),
            fmt_opt(run.total.p50_ms, 3),
            fmt_opt(p99, 3),
            fmt_opt(run.total.max_ms, 3),
            fmt_opt(run.convert.p50_ms, 3),
            fmt_opt(run.model.p50_ms, 3),
            fmt_opt(run.apply.p50_ms, 3),
            fmt_opt(run.writes_per_change_median, 0),
        );
    }
    for run in sync_runs {
        let Some(c) = &run.one_slice_change else {
            continue;
        };
        let _ = writeln!(
            md,
            "| {} | old way (whole rebuild) | {} | {} ms | {} ms | {} ms | – | {} ms | {} ms | {} | – | for comparison |",
            size_label(run.services.unwrap_or(0)),
            raw(c.total.samples),
            fmt_opt(c.total.p50_ms, 2),
            fmt_opt(c.total.p99_ms, 2),
            fmt_opt(c.total.max_ms, 2),
            fmt_opt(c.model.p50_ms, 2),
            fmt_opt(c.apply.p50_ms, 2),
            raw_f64(c.writes_per_change_median),
        );
    }
    let setups: Vec<String> = runs
        .iter()
        .map(|r| {
            format!(
                "{}: {} s (model {} s, first apply {} s)",
                size_label(r.services.unwrap_or(0)),
                fmt_opt(r.setup_s, 1),
                fmt_opt(r.initial_model_s, 2),
                fmt_opt(r.initial_apply_s, 2)
            )
        })
        .collect();
    if !setups.is_empty() {
        let _ = writeln!(
            md,
            "\nSetting each size up (objects generated and converted, the model built, everything written to fresh maps): {}.",
            setups.join("; ")
        );
    }
}

/// Agent start → maps synced, and its RSS, against the targets.
fn start(md: &mut String, rows: &[StartRow]) {
    md.push_str("\n### Agent start → maps synced, and memory\n\nA fresh `switchboard agent` in a sandbox (fresh pins, so it programs everything), Services × 10 endpoints. YAML: the manifests are written before the agent starts (`--source dir:`). Cluster: the fake API server (the release `sb-apiserver`, in the sandbox's node namespace) loads the same YAML before the agent starts (`--source cluster --kubeconfig`: paged lists and watches over HTTP, as against kube-apiserver; its serving of the lists is part of start → synced). Start → synced: from spawning the agent to its `maps synced` log line with every frontend. RSS: VmRSS 0.5 s after that; peak: VmHWM.\n\n| source | Services | start → synced | target | | RSS | target | | peak RSS | target | | input |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let n = r.services;
        let synced = Some(r.startup_to_synced_s);
        let rss = Some(r.rss_mib);
        let (st, sm) = against(targets::at(&targets::SYNCED_S, n), synced, "s");
        let (rt, rm) = against(targets::at(&targets::RSS_MIB, n), rss, "MiB");
        let peak = Some(r.peak_rss_mib);
        let (pt, pm) = against(targets::at(&targets::PEAK_RSS_MIB, n), peak, "MiB");
        let input = match r.source.as_str() {
            "cluster" => format!(
                "{} objects, API server up {} s after its start",
                raw(r.api_objects),
                fmt_opt(r.api_load_s, 1)
            ),
            _ => format!("{} MiB of YAML", fmt_opt(r.manifest_mib, 1)),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} s | {st} | {sm} | {} MiB | {rt} | {rm} | {} MiB | {pt} | {pm} | {input} |",
            source_label(r),
            size_label(n),
            fmt_opt(synced, 2),
            fmt_opt(rss, 1),
            fmt_opt(peak, 1),
        );
    }
}

/// The agent's heap at each step of its start.
fn memory(md: &mut String, rows: &[StartRow]) {
    md.push_str("\n### Where the memory goes\n\nThe agent counts the bytes it holds on the heap (its global allocator counts every allocation and free) and logs them at each step of its start; the rows above, read from their logs (MiB). Each step is the heap after it minus the heap before it: the source's first view (its objects, its indexes and the batch of changes it hands over), loading the eBPF objects and opening the maps, the batch replaced by the model's inputs (the model's maps from keys to the source's objects, the batch freed), the model's desired state, and the sync's mirror of the maps. RSS − heap: the binary, thread stacks, and what the allocator holds beyond the live bytes (free lists, fragmentation).\n\n| source | Services | before the source | source's first view | eBPF + maps loaded | batch → model inputs | desired state | sync mirror | heap after the sync | heap peak | RSS | RSS − heap |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let h = &r.heap;
        let step = |to: Option<f64>, from: Option<f64>| Some(to? - from?);
        let rss = Some(r.rss_mib);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            source_label(r),
            size_label(r.services),
            fmt_opt(h.before_source_mib, 1),
            fmt_opt(step(h.source_read_mib, h.before_source_mib), 1),
            fmt_opt(step(h.maps_loaded_mib, h.source_read_mib), 1),
            fmt_opt(step(h.inputs_mib, h.changes_mib), 1),
            fmt_opt(step(h.model_mib, h.inputs_mib), 1),
            fmt_opt(step(h.synced_mib, h.model_mib), 1),
            fmt_opt(h.synced_mib, 1),
            fmt_opt(h.peak_mib, 1),
            fmt_opt(rss, 1),
            fmt_opt(rss.zip(h.synced_mib).map(|(r, h)| r - h), 1),
        );
    }
}

/// The agent's RSS by mapping, and the allocator's overhead.
fn rss_beyond_heap(md: &mut String, rows: &[StartRow]) {
    md.push_str("\n### RSS beyond the heap\n\nThe same agents' RSS by mapping, from `/proc/<pid>/smaps` once synced (MiB): the `switchboard` binary's pages (its code and read-only data; the embedded eBPF object is handed back once loaded), the shared libraries, and the allocator's memory (the main heap and the anonymous mappings: blocks mapped on their own and the threads' stacks; the agent keeps one malloc arena) next to the live heap bytes it holds; the difference is the allocator's own overhead (a header and rounding per block: 8 to 23 bytes with glibc, then free lists and fragmentation), next to the blocks the heap holds.\n\n| source | Services | binary | libraries | allocator's memory | live heap | allocator overhead | blocks held | threads |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in rows {
        let Some(m) = &r.rss_by_mapping else {
            continue;
        };
        let held = Some(m.main_heap_mib + m.anonymous_mib + m.main_stack_mib);
        let live = r.heap.synced_mib;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            source_label(r),
            size_label(r.services),
            fmt_opt(Some(m.binary_mib), 1),
            fmt_opt(Some(m.libraries_mib), 1),
            fmt_opt(held, 1),
            fmt_opt(live, 1),
            fmt_opt(held.zip(live).map(|(h, l)| h - l), 1),
            r.heap
                .blocks
                .map_or("–".to_owned(), |b| format!("{:.2} M", b / 1e6)),
            m.threads,
        );
    }
}

/// The kernel memory of the maps the agents loaded.
fn kernel_memory(md: &mut String, rows: &[StartRow]) {
    md.push_str("\n### Kernel memory of the maps\n\nThe same agents, at their start: the `memlock` the kernel accounts to every pinned map (the agent's `the maps' kernel memory` log line, after any resize; per map in `switchboard status` and `switchboard_map_memory_bytes`). The bench passes `--max-frontend-entries`, `--max-backends` and `--max-services` sized to the Services; every other table (conntrack, sockets, affinity, fragments) is at its default. The frontend, backend, reverse-NAT and conntrack maps of both families are allocated per entry (their bucket array and the entries they hold); the LRU flow tables (sockets, affinity, fragments, both families) are at their starting size (`--flow-table-start-entries`), grown online when one is half full. For scale: Cilium's defaults are `bpf-ct-global-tcp-max` 512k entries and `bpf-lb-map-max` 64k.\n\n| source | Services | all maps | of which IPv6 maps |\n|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} MiB | {} MiB |",
            source_label(r),
            size_label(r.services),
            fmt_opt(r.maps_kernel_mib, 1),
            fmt_opt(r.ipv6_maps_kernel_mib, 1),
        );
    }
}

/// The cluster source: watch event → map write, at a fixed rate.
fn event_to_map(md: &mut String, rows: &[StartRow]) {
    let events: Vec<&StartRow> = rows.iter().filter(|r| r.event_to_map.is_some()).collect();
    if events.is_empty() {
        return;
    }
    let _ = write!(
        md,
        "\n### Cluster source: watch event → map write\n\nThe cluster agents above, once measured: EndpointSlice changes through the fake API server at {} per second (one endpoint of one filler Service's slice replaced per change, as in the churn below). The agent observes, for every Service and EndpointSlice event, the time from its source recording the decoded watch event to the end of the map writes of the sync that applied it (`switchboard_event_to_map_duration_seconds`; bounds are its bucket bounds, 1-2-5 steps from 0.1 ms).\n\n| Services | rate issued | events | p50 ≤ | p99 ≤ | max ≤ | target (p99) | |\n|---|---|---|---|---|---|---|---|\n",
        targets::EVENT_RATE
    );
    for r in events {
        let Some(e) = &r.event_to_map else {
            continue;
        };
        let ms = |v: Option<f64>| v.map(|v| v * 1e3);
        let (target, met) = against(Some(targets::EVENT_P99_MS), ms(e.event_p99_le_s), "ms");
        let _ = writeln!(
            md,
            "| {} | {}/s | {} | {} ms | {} ms | {} ms | {target} | {met} |",
            size_label(r.services),
            fmt_opt(e.achieved_per_s, 0),
            raw_f64(e.events),
            fmt_opt(ms(e.event_p50_le_s), 1),
            fmt_opt(ms(e.event_p99_le_s), 1),
            fmt_opt(ms(e.event_max_le_s), 1),
        );
    }
}

/// File change → new backend answering, the directory source.
fn file_change(md: &mut String, rows: &[StartRow]) {
    let Some((r, c)) = rows.iter().find_map(|r| Some((r, r.file_change.as_ref()?))) else {
        return;
    };
    let median = Some(c.median_ms as f64);
    let (target, met) = against(Some(targets::FILE_CHANGE_MS), median, "ms");
    let _ = writeln!(
        md,
        "\n### File change → new backend answering (directory source)\n\nThe YAML agent above ({} Services), once measured: the pods start, then the manifest file holding the target Service is replaced atomically (written under a hidden name, renamed into place) with the target's endpoints moved to another pod, while `sb-echo client` connects to the Service back to back from the client namespace (tc path). Time: from the rename to the first connection of the final stretch the new pod answers (the client's millisecond stamps). One warm-up change, then {} changes alternating between two pods.\n\n| changes (ms) | median | max | failed connections | target (median) | |\n|---|---|---|---|---|---|\n| {} | {} ms | {} ms | {} | {target} | {met} |",
        size_label(r.services),
        c.rounds_ms.len(),
        c.rounds_ms
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        fmt_opt(median, 0),
        fmt_opt(Some(c.max_ms as f64), 0),
        c.failed_connections,
    );
}

/// Churn: the rates tried, and the one kept up with.
fn churn_table(md: &mut String, churn: &Churn) {
    let behind_ms = churn.behind_s * 1e3;
    let _ = writeln!(
        md,
        "\n### Churn: changes per second with the maps at most {behind_ms:.0} ms behind\n\nAn agent with the cluster source at {} Services (the one measured above). The benchmark replaces one endpoint of one EndpointSlice at a time with an HTTP PUT to the fake API server (one kept-alive connection, as a controller writes), at each rate in turn for {} s (round robin over the Services), stamping each changed slice with `endpoints.kubernetes.io/last-change-trigger-time` = now (µs precision). The agent observes now − trigger for every slice it programmed into `switchboard_network_programming_duration_seconds`; the benchmark reads that histogram from /metrics between rates (bounds below are bucket bounds). A rate is kept up with when the benchmark issued it (≥ {:.0} % of it), every change was observed, and none took longer than {behind_ms:.0} ms; the run stops at the first rate that is not.\n\n| rate | issued | changes | observed | > {behind_ms:.0} ms | p99 ≤ | max ≤ | target | |\n|---|---|---|---|---|---|---|---|---|",
        size_label(churn.services as u64),
        churn
            .rates
            .first()
            .map_or_else(|| "null".to_owned(), |r| raw_f64(Some(r.seconds))),
        churn.achieved_min * 100.0
    );
    let bound = |v: Option<f64>| match v {
        Some(s) if s.is_finite() => format!("{} ms", fmt_opt(Some(s * 1e3), 0)),
        Some(_) => "∞".into(),
        None => "–".into(),
    };
    for r in &churn.rates {
        let why = Some(r.why.as_str()).filter(|w| !w.is_empty());
        let _ = writeln!(
            md,
            "| {}/s | {}/s | {} | {} | {} | {} | {} | all observed, none > {behind_ms:.0} ms | {}{} |",
            r.rate,
            fmt_opt(r.achieved_per_s, 0),
            r.changes,
            fmt_opt(Some(r.observed), 0),
            fmt_opt(Some(r.over_behind), 0),
            bound(r.p99_le_s),
            bound(r.max_le_s),
            verdict(Some(r.passed)),
            why.map(|w| format!(": {w}")).unwrap_or_default()
        );
    }
    let check = &churn.final_check;
    let _ = writeln!(
        md,
        "\n**Sustained: {}** at {} Services with the maps never more than {behind_ms:.0} ms behind. After the last change, the pinned maps (`switchboard services -o json`) show {} of the {} churned Services with the backends of their last change{}.",
        churn
            .sustained_per_s
            .map_or("below the lowest rate tried".to_string(), |r| format!("{r} changes/s")),
        size_label(churn.services as u64),
        check.services.saturating_sub(check.mismatched),
        check.services,
        check
            .example
            .as_deref()
            .map(|e| format!(" (e.g. {e})"))
            .unwrap_or_default()
    );
}
