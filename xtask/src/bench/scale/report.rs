//! The report's "Control plane at scale" section and its goals, from
//! `results["scale"]` (and the old whole-model rebuild of `results["sync"]`,
//! for comparison).

use std::fmt::Write as _;

use serde_json::Value;

use super::super::goals::{f, fmt_opt, size_label, verdict, Goal};
use super::targets;

fn services(row: &Value) -> u64 {
    row["services"].as_u64().unwrap_or(0)
}

fn change_runs(scale: &Value) -> Vec<Value> {
    scale["change"]["runs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn start_rows(scale: &Value) -> Vec<Value> {
    scale["start"].as_array().cloned().unwrap_or_default()
}

/// The row's source as the tables name it.
pub(super) fn source_label(row: &Value) -> &'static str {
    match (row["source"].as_str(), row["yaml_style"].as_str()) {
        (Some("cluster"), _) => "cluster (fake API server)",
        (_, Some("block")) => "YAML, block style",
        (_, Some("flow")) => "YAML, flow style",
        _ => "YAML",
    }
}

/// The start rows' sources, each as the goals name it: `(source, YAML
/// style, label)`.
const GOAL_SOURCES: [(&str, Option<&str>, &str); 3] = [
    ("yaml", Some("block"), "block-style YAML"),
    ("yaml", Some("flow"), "flow-style YAML"),
    ("cluster", None, "the cluster source"),
];

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

/// The goals of issue 10, for the report's goal table: every target, with
/// "not measured" where this run did not measure it (a quick run has no
/// 100k start).
pub(in crate::bench) fn goals(scale: &Value) -> Vec<Goal> {
    let mut goals = Vec::new();
    if scale.is_null() {
        return goals;
    }
    let change = change_runs(scale);
    for (n, bound) in targets::CHANGE_P99_MS {
        let run = change.iter().find(|r| services(r) == u64::from(n));
        let p99 = run.and_then(|r| f(&r["total"]["p99_ms"]));
        goals.push(Goal {
            what: format!(
                "one EndpointSlice change → maps at {} Services × 10, p99 (incremental model)",
                size_label(n.into())
            ),
            goal: format!("< {bound} ms"),
            measured: match run {
                Some(r) => format!(
                    "{} ms (p50 {} ms)",
                    fmt_opt(p99, 2),
                    fmt_opt(f(&r["total"]["p50_ms"]), 2)
                ),
                None => "not measured in this run".into(),
            },
            met: p99.map(|v| v < bound),
        });
    }
    let start = start_rows(scale);
    for (source, style, label) in GOAL_SOURCES {
        let row = |n: u32| {
            start.iter().find(|r| {
                r["source"] == source
                    && r["yaml_style"].as_str() == style
                    && services(r) == u64::from(n)
            })
        };
        for (n, bound) in targets::SYNCED_S {
            let v = row(n).and_then(|r| f(&r["startup_to_synced_s"]));
            goals.push(Goal {
                what: format!(
                    "agent start → maps synced, {} Services × 10 from {label}",
                    size_label(n.into())
                ),
                goal: format!("< {bound} s"),
                measured: v.map_or("not measured in this run".into(), |v| format!("{v:.2} s")),
                met: v.map(|v| v < bound),
            });
        }
        for (table, field, what) in [
            (&targets::RSS_MIB[..], "rss_mib", "agent RSS"),
            (&targets::PEAK_RSS_MIB[..], "peak_rss_mib", "agent peak RSS"),
        ] {
            for &(n, bound) in table {
                let v = row(n).and_then(|r| f(&r[field]));
                goals.push(Goal {
                    what: format!(
                        "{what}, {} Services × 10 from {label}",
                        size_label(n.into())
                    ),
                    goal: format!("< {bound} MiB"),
                    measured: v
                        .map_or("not measured in this run".into(), |v| format!("{v:.1} MiB")),
                    met: v.map(|v| v < bound),
                });
            }
        }
    }
    let n = targets::FILE_CHANGE_SERVICES;
    let change = start
        .iter()
        .filter(|r| r["source"] == "yaml" && services(r) == u64::from(n))
        .map(|r| &r["file_change"])
        .find(|c| !c.is_null());
    let median = change.and_then(|c| f(&c["median_ms"]));
    goals.push(Goal {
        what: format!(
            "file change → new backend answering, {} Services × 10, directory source, median",
            size_label(n.into())
        ),
        goal: format!("< {} ms", targets::FILE_CHANGE_MS),
        measured: match change {
            Some(c) => format!(
                "{} ms (max {} ms, {} changes)",
                fmt_opt(median, 0),
                fmt_opt(f(&c["max_ms"]), 0),
                c["rounds_ms"].as_array().map_or(0, Vec::len)
            ),
            None => "not measured in this run".into(),
        },
        met: median.map(|v| v < targets::FILE_CHANGE_MS),
    });
    goals
}

/// The section, after the control plane's.
pub(in crate::bench) fn section(scale: &Value, sync_runs: &[Value]) -> String {
    let mut md = String::new();
    if scale.is_null() {
        return md;
    }
    md.push_str("\n## Control plane at scale\n");

    // ---- one change ----
    md.push_str("\n### One EndpointSlice change → maps\n\nIn process (`sb_bench change`), into real kernel maps, Services × 10 endpoints, one endpoint of one slice replaced per change. Incremental: per change, the decoded slice is converted (`SliceInfo::from_k8s`, as the source does), then `Model::set_slice` + `Model::update` (that one Service recomputed), then `Syncer::apply_changed` on the frontends the update reported; each change is checked (one Service recomputed, one frontend updated, with the new backend). The old way, for comparison: the whole model rebuilt from every object, then `Syncer::apply` diffing every frontend (`sb_bench sync`).\n\n| Services | way | changes | total p50 | total p99 | max | convert p50 | model p50 | maps p50 | map writes | target (p99) | |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for run in change_runs(scale) {
        let n = services(&run);
        let p99 = f(&run["total"]["p99_ms"]);
        let (target, met) = against(targets::at(&targets::CHANGE_P99_MS, n), p99, "ms");
        let _ = writeln!(
            md,
            "| {} | incremental | {} | {} ms | {} ms | {} ms | {} ms | {} ms | {} ms | {} | {target} | {met} |",
            size_label(n),
            run["total"]["samples"],
            fmt_opt(f(&run["total"]["p50_ms"]), 3),
            fmt_opt(p99, 3),
            fmt_opt(f(&run["total"]["max_ms"]), 3),
            fmt_opt(f(&run["convert"]["p50_ms"]), 3),
            fmt_opt(f(&run["model"]["p50_ms"]), 3),
            fmt_opt(f(&run["apply"]["p50_ms"]), 3),
            fmt_opt(f(&run["writes_per_change_median"]), 0),
        );
    }
    for run in sync_runs {
        let c = &run["one_slice_change"];
        if c.is_null() {
            continue;
        }
        let _ = writeln!(
            md,
            "| {} | old way (whole rebuild) | {} | {} ms | {} ms | {} ms | – | {} ms | {} ms | {} | – | for comparison |",
            size_label(services(run)),
            c["total"]["samples"],
            fmt_opt(f(&c["total"]["p50_ms"]), 2),
            fmt_opt(f(&c["total"]["p99_ms"]), 2),
            fmt_opt(f(&c["total"]["max_ms"]), 2),
            fmt_opt(f(&c["model"]["p50_ms"]), 2),
            fmt_opt(f(&c["apply"]["p50_ms"]), 2),
            c["writes_per_change_median"],
        );
    }
    let setups: Vec<String> = change_runs(scale)
        .iter()
        .map(|r| {
            format!(
                "{}: {} s (model {} s, first apply {} s)",
                size_label(services(r)),
                fmt_opt(f(&r["setup_s"]), 1),
                fmt_opt(f(&r["initial_model_s"]), 2),
                fmt_opt(f(&r["initial_apply_s"]), 2)
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

    // ---- start and memory ----
    md.push_str("\n### Agent start → maps synced, and memory\n\nA fresh `switchboard agent` in a sandbox (fresh pins, so it programs everything), Services × 10 endpoints. YAML: the manifests are written before the agent starts (`--source dir:`). Cluster: the fake API server (the release `sb-apiserver`, in the sandbox's node namespace) loads the same YAML before the agent starts (`--source cluster --kubeconfig`: paged lists and watches over HTTP, as against kube-apiserver; its serving of the lists is part of start → synced). Start → synced: from spawning the agent to its `maps synced` log line with every frontend. RSS: VmRSS 0.5 s after that; peak: VmHWM.\n\n| source | Services | start → synced | target | | RSS | target | | peak RSS | target | | input |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in start_rows(scale) {
        let n = services(&r);
        let synced = f(&r["startup_to_synced_s"]);
        let rss = f(&r["rss_mib"]);
        let (st, sm) = against(targets::at(&targets::SYNCED_S, n), synced, "s");
        let (rt, rm) = against(targets::at(&targets::RSS_MIB, n), rss, "MiB");
        let peak = f(&r["peak_rss_mib"]);
        let (pt, pm) = against(targets::at(&targets::PEAK_RSS_MIB, n), peak, "MiB");
        let input = match r["source"].as_str() {
            Some("cluster") => format!(
                "{} objects, API server up {} s after its start",
                r["api_objects"],
                fmt_opt(f(&r["api_load_s"]), 1)
            ),
            _ => format!("{} MiB of YAML", fmt_opt(f(&r["manifest_mib"]), 1)),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} s | {st} | {sm} | {} MiB | {rt} | {rm} | {} MiB | {pt} | {pm} | {input} |",
            source_label(&r),
            size_label(n),
            fmt_opt(synced, 2),
            fmt_opt(rss, 1),
            fmt_opt(peak, 1),
        );
    }
    md.push_str("\n### Where the memory goes\n\nThe agent counts the bytes it holds on the heap (its global allocator counts every allocation and free) and logs them at each step of its start; the rows above, read from their logs (MiB). Each step is the heap after it minus the heap before it: the source's first view (its objects, its indexes and the batch of changes it hands over), loading the eBPF objects and opening the maps, the batch replaced by the model's inputs (the model's maps from keys to the source's objects, the batch freed), the model's desired state, and the sync's mirror of the maps. RSS − heap: the binary, thread stacks, and what the allocator holds beyond the live bytes (free lists, fragmentation).\n\n| source | Services | before the source | source's first view | eBPF + maps loaded | batch → model inputs | desired state | sync mirror | heap after the sync | heap peak | RSS | RSS − heap |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in start_rows(scale) {
        let h = &r["heap"];
        let at = |k: &str| f(&h[k]);
        let step = |to: &str, from: &str| Some(at(to)? - at(from)?);
        let rss = f(&r["rss_mib"]);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            source_label(&r),
            size_label(services(&r)),
            fmt_opt(at("before_source_mib"), 1),
            fmt_opt(step("source_read_mib", "before_source_mib"), 1),
            fmt_opt(step("maps_loaded_mib", "source_read_mib"), 1),
            fmt_opt(step("inputs_mib", "changes_mib"), 1),
            fmt_opt(step("model_mib", "inputs_mib"), 1),
            fmt_opt(step("synced_mib", "model_mib"), 1),
            fmt_opt(at("synced_mib"), 1),
            fmt_opt(at("peak_mib"), 1),
            fmt_opt(rss, 1),
            fmt_opt(rss.zip(at("synced_mib")).map(|(r, h)| r - h), 1),
        );
    }
    md.push_str("\n### RSS beyond the heap\n\nThe same agents' RSS by mapping, from `/proc/<pid>/smaps` once synced (MiB): the `switchboard` binary's pages (its code and read-only data; the embedded eBPF object is handed back once loaded), the shared libraries, and the allocator's memory (the main heap and the anonymous mappings: blocks mapped on their own and the threads' stacks; the agent keeps one malloc arena) next to the live heap bytes it holds; the difference is the allocator's own overhead (a header and rounding per block: 8 to 23 bytes with glibc, then free lists and fragmentation), next to the blocks the heap holds.\n\n| source | Services | binary | libraries | allocator's memory | live heap | allocator overhead | blocks held | threads |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in start_rows(scale) {
        let m = &r["rss_by_mapping"];
        if m.is_null() {
            continue;
        }
        let held = f(&m["main_heap_mib"])
            .zip(f(&m["anonymous_mib"]))
            .map(|(h, a)| h + a + f(&m["main_stack_mib"]).unwrap_or(0.0));
        let live = f(&r["heap"]["synced_mib"]);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            source_label(&r),
            size_label(services(&r)),
            fmt_opt(f(&m["binary_mib"]), 1),
            fmt_opt(f(&m["libraries_mib"]), 1),
            fmt_opt(held, 1),
            fmt_opt(live, 1),
            fmt_opt(held.zip(live).map(|(h, l)| h - l), 1),
            f(&r["heap"]["blocks"]).map_or("–".to_owned(), |b| format!("{:.2} M", b / 1e6)),
            m["threads"],
        );
    }
    md.push_str("\n### Kernel memory of the maps\n\nThe same agents, at their start: the `memlock` the kernel accounts to every pinned map (the agent's `the maps' kernel memory` log line, after any resize; per map in `switchboard status` and `switchboard_map_memory_bytes`). The bench passes `--max-frontend-entries`, `--max-backends` and `--max-services` sized to the Services; every other table (conntrack, sockets, affinity, fragments) is at its default. The frontend, backend, reverse-NAT and conntrack maps of both families are allocated per entry (their bucket array and the entries they hold); the LRU flow tables (sockets, affinity, fragments, both families) are at their starting size (`--flow-table-start-entries`), grown online when one is half full. For scale: Cilium's defaults are `bpf-ct-global-tcp-max` 512k entries and `bpf-lb-map-max` 64k.\n\n| source | Services | all maps | of which IPv6 maps |\n|---|---|---|---|\n");
    for r in start_rows(scale) {
        let _ = writeln!(
            md,
            "| {} | {} | {} MiB | {} MiB |",
            source_label(&r),
            size_label(services(&r)),
            fmt_opt(f(&r["maps_kernel_mib"]), 1),
            fmt_opt(f(&r["ipv6_maps_kernel_mib"]), 1),
        );
    }
    let events: Vec<Value> = start_rows(scale)
        .into_iter()
        .filter(|r| !r["event_to_map"].is_null())
        .collect();
    if !events.is_empty() {
        let _ = write!(
            md,
            "\n### Cluster source: watch event → map write\n\nThe cluster agents above, once measured: EndpointSlice changes through the fake API server at {} per second (one endpoint of one filler Service's slice replaced per change, as in the churn below). The agent observes, for every Service and EndpointSlice event, the time from its source recording the decoded watch event to the end of the map writes of the sync that applied it (`switchboard_event_to_map_duration_seconds`; bounds are its bucket bounds, 1-2-5 steps from 0.1 ms).\n\n| Services | rate issued | events | p50 ≤ | p99 ≤ | max ≤ | target (p99) | |\n|---|---|---|---|---|---|---|---|\n",
            targets::EVENT_RATE
        );
        for r in &events {
            let e = &r["event_to_map"];
            let ms = |k: &str| f(&e[k]).map(|v| v * 1e3);
            let (target, met) = against(Some(targets::EVENT_P99_MS), ms("event_p99_le_s"), "ms");
            let _ = writeln!(
                md,
                "| {} | {}/s | {} | {} ms | {} ms | {} ms | {target} | {met} |",
                size_label(services(r)),
                fmt_opt(f(&e["achieved_per_s"]), 0),
                e["events"],
                fmt_opt(ms("event_p50_le_s"), 1),
                fmt_opt(ms("event_p99_le_s"), 1),
                fmt_opt(ms("event_max_le_s"), 1),
            );
        }
    }
    if let Some(r) = start_rows(scale)
        .iter()
        .find(|r| !r["file_change"].is_null())
    {
        let c = &r["file_change"];
        let median = f(&c["median_ms"]);
        let (target, met) = against(Some(targets::FILE_CHANGE_MS), median, "ms");
        let _ = writeln!(
            md,
            "\n### File change → new backend answering (directory source)\n\nThe YAML agent above ({} Services), once measured: the pods start, then the manifest file holding the target Service is replaced atomically (written under a hidden name, renamed into place) with the target's endpoints moved to another pod, while `sb-echo client` connects to the Service back to back from the client namespace (tc path). Time: from the rename to the first connection of the final stretch the new pod answers (the client's millisecond stamps). One warm-up change, then {} changes alternating between two pods.\n\n| changes (ms) | median | max | failed connections | target (median) | |\n|---|---|---|---|---|---|\n| {} | {} ms | {} ms | {} | {target} | {met} |",
            size_label(services(r)),
            c["rounds_ms"].as_array().map_or(0, Vec::len),
            c["rounds_ms"]
                .as_array()
                .map(|v| v.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
                .unwrap_or_default(),
            fmt_opt(median, 0),
            fmt_opt(f(&c["max_ms"]), 0),
            c["failed_connections"],
        );
    }
    if let Some(r) = start_rows(scale)
        .iter()
        .find(|r| !r["rss_after_churn_mib"].is_null())
    {
        let _ = writeln!(
            md,
            "\nAfter the churn below, the same agent ({} Services, cluster source): RSS {} MiB, peak {} MiB.",
            size_label(services(r)),
            fmt_opt(f(&r["rss_after_churn_mib"]), 1),
            fmt_opt(f(&r["peak_rss_after_churn_mib"]), 1)
        );
    }

    // ---- churn ----
    let churn = &scale["churn"];
    if !churn.is_null() {
        let behind_ms = f(&churn["behind_s"]).unwrap_or(targets::CHURN_BEHIND_S) * 1e3;
        let _ = writeln!(
            md,
            "\n### Churn: changes per second with the maps at most {behind_ms:.0} ms behind\n\nAn agent with the cluster source at {} Services (the one measured above). The benchmark replaces one endpoint of one EndpointSlice at a time with an HTTP PUT to the fake API server (one kept-alive connection, as a controller writes), at each rate in turn for {} s (round robin over the Services), stamping each changed slice with `endpoints.kubernetes.io/last-change-trigger-time` = now (µs precision). The agent observes now − trigger for every slice it programmed into `switchboard_network_programming_duration_seconds`; the benchmark reads that histogram from /metrics between rates (bounds below are bucket bounds). A rate is kept up with when the benchmark issued it (≥ {:.0} % of it), every change was observed, and none took longer than {behind_ms:.0} ms; the run stops at the first rate that is not.\n\n| rate | issued | changes | observed | > {behind_ms:.0} ms | p99 ≤ | max ≤ | target | |\n|---|---|---|---|---|---|---|---|---|",
            size_label(services(churn)),
            churn["rates"][0]["seconds"],
            f(&churn["achieved_min"]).unwrap_or(0.95) * 100.0
        );
        let bound = |v: &Value| match f(v) {
            Some(s) if s.is_finite() => format!("{} ms", fmt_opt(Some(s * 1e3), 0)),
            Some(_) => "∞".into(),
            None => "–".into(),
        };
        for r in churn["rates"].as_array().cloned().unwrap_or_default() {
            let passed = r["passed"].as_bool();
            let why = r["why"].as_str().filter(|w| !w.is_empty());
            let _ = writeln!(
                md,
                "| {}/s | {}/s | {} | {} | {} | {} | {} | all observed, none > {behind_ms:.0} ms | {}{} |",
                r["rate"],
                fmt_opt(f(&r["achieved_per_s"]), 0),
                r["changes"],
                fmt_opt(f(&r["observed"]), 0),
                fmt_opt(f(&r["over_behind"]), 0),
                bound(&r["p99_le_s"]),
                bound(&r["max_le_s"]),
                verdict(passed),
                why.map(|w| format!(": {w}")).unwrap_or_default()
            );
        }
        let check = &churn["final_check"];
        let _ = writeln!(
            md,
            "\n**Sustained: {}** at {} Services with the maps never more than {behind_ms:.0} ms behind. After the last change, the pinned maps (`switchboard services -o json`) show {} of the {} churned Services with the backends of their last change{}.",
            churn["sustained_per_s"]
                .as_u64()
                .map_or("below the lowest rate tried".to_string(), |r| format!("{r} changes/s")),
            size_label(services(churn)),
            check["services"].as_u64().unwrap_or(0).saturating_sub(check["mismatched"].as_u64().unwrap_or(0)),
            check["services"],
            check["example"]
                .as_str()
                .map(|e| format!(" (e.g. {e})"))
                .unwrap_or_default()
        );
    }
    md
}
