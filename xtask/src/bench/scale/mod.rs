//! The control plane at scale, each figure next to its target:
//! - one EndpointSlice change → maps at 1k, 10k, 100k Services × 10
//!   endpoints, in process (`sb_bench change`: the incremental model and
//!   `Syncer::apply_changed` into real kernel maps);
//! - start → maps synced, and the agent's memory, for a real `switchboard
//!   agent` in a sandbox, from YAML (`--source dir:`) in both styles a
//!   directory comes in ([`workload::Style`]: block, as `kubectl` prints,
//!   and flow, as people write by hand) and from the cluster source (the
//!   fake API server, the release `sb-apiserver` in the sandbox's node
//!   namespace, loaded from the block YAML);
//! - churn ([`churn`]): the EndpointSlice changes per second the agent keeps
//!   up with at 10k Services, the maps never more than 100 ms behind;
//! - file change → new backend answering ([`follow`]), the directory source
//!   at 10k Services, on the YAML agent measured above.
//!
//! Results go to `results["scale"]` ([`Scale`]), each figure's target is
//! in [`super::goals::targets`].

pub mod churn;
pub mod follow;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};

use super::agent::{agent_caps, wait_synced, write_manifests};
use super::goals::targets;
use super::plan::Plan;
use super::profile::status_kb;
use super::progress::{note, progress};
use super::results::{Churn, Heap, RssByMapping, Scale, StartPhases, StartRow};
use super::run_json;
use super::workload::{self, pod_ips, Style};
use crate::sandbox::Sandbox;
use crate::util::release_bin;

/// The sandbox the start and churn measurements use (one at a time, fresh
/// each time).
pub const TAG: &str = "sbbrss";

/// The sandbox of the start and churn measurements: [`TAG`], or
/// `SB_BENCH_SANDBOX_TAG` (at most 6 characters) for a run of the start
/// rows beside another benchmark on the same machine: each has its own
/// sandbox, and such a run purges only its own.
pub fn tag() -> &'static str {
    own_tag().unwrap_or(TAG)
}

/// `SB_BENCH_SANDBOX_TAG`, when set.
pub fn own_tag() -> Option<&'static str> {
    static OWN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| {
        std::env::var("SB_BENCH_SANDBOX_TAG")
            .ok()
            .filter(|t| !t.is_empty())
    })
    .as_deref()
}

/// The node name the agents are given (no Node object exists for it, in
/// either source: the same for both).
const NODE_NAME: &str = "sbb-node";

/// Where the agent serves /metrics, in the sandbox's node namespace.
const METRICS: &str = "127.0.0.1:10249";

/// Where the fake API server listens, in the sandbox's node namespace.
const API_ADDR: &str = "127.0.0.1:6443";

/// Progress lines this part prints.
pub fn steps(plan: &Plan) -> usize {
    1 + start_steps(plan) + usize::from(!plan.scale_sizes.contains(&targets::CHURN_SERVICES))
}

/// Progress lines of the start rows: per size, YAML of each style and
/// the cluster source.
pub fn start_steps(plan: &Plan) -> usize {
    3 * plan.scale_sizes.len()
}

/// The whole part: one change, every start, the churn.
pub fn run(plan: &Plan, sb_bench: &Path, switchboard: &Path, dir: &Path) -> Result<Scale> {
    progress("control plane at scale: one EndpointSlice change through the incremental model into kernel maps, 1k/10k/100k Services x 10 endpoints");
    let quick: &[&str] = if plan.quick { &["--quick"] } else { &[] };
    let change = run_json(
        sb_bench,
        &[&["change"], quick].concat(),
        &dir.join("change.json"),
    )?;

    let sb_apiserver = release_bin("sb-apiserver");
    ensure!(
        sb_apiserver.exists(),
        "{} missing after the build",
        sb_apiserver.display()
    );
    let churn_plan = churn::ChurnPlan::new(plan.quick);
    let mut start = Vec::new();
    let mut churned = None;
    for &n in &plan.scale_sizes {
        for style in [Style::Block, Style::Flow] {
            progress(&format!(
                "agent start and memory: a fresh `switchboard agent --source dir:` with {n} Services x 10 endpoints, {} YAML",
                style.name()
            ));
            start.push(start_yaml(switchboard, n, style, style == Style::Block)?);
        }
        progress(&format!(
            "agent start and memory: a fresh `switchboard agent --source cluster` (fake API server) with {n} Services x 10 endpoints{}",
            if n == targets::CHURN_SERVICES { ", then churn" } else { "" }
        ));
        let with_churn = (n == targets::CHURN_SERVICES).then_some(&churn_plan);
        let (row, churn) = start_cluster(switchboard, &sb_apiserver, n, plan.quick, with_churn)?;
        start.push(row);
        churned = churned.or(churn);
    }
    if churned.is_none() {
        progress(&format!(
            "churn: a `switchboard agent --source cluster` with {} Services",
            targets::CHURN_SERVICES
        ));
        churned = start_cluster(
            switchboard,
            &sb_apiserver,
            targets::CHURN_SERVICES,
            plan.quick,
            Some(&churn_plan),
        )?
        .1;
    }
    Ok(Scale {
        change: Some(change),
        start,
        churn: churned,
    })
}

/// `SB_BENCH_ONLY=start`: only the agent start and memory rows, from both
/// sources, at every size (no change, churn or file-change measurement).
pub fn run_start(plan: &Plan, switchboard: &Path) -> Result<Scale> {
    let sb_apiserver = release_bin("sb-apiserver");
    let mut start = Vec::new();
    for &n in &plan.scale_sizes {
        for style in [Style::Block, Style::Flow] {
            progress(&format!(
                "agent start and memory, {n} Services: YAML source, {} style",
                style.name()
            ));
            start.push(start_yaml(switchboard, n, style, false)?);
        }
        progress(&format!(
            "agent start and memory, {n} Services: cluster source"
        ));
        start.push(start_cluster(switchboard, &sb_apiserver, n, plan.quick, None)?.0);
    }
    Ok(Scale {
        start,
        ..Scale::default()
    })
}

/// Memory and start time of an agent started at `t0` that programs
/// `frontends` of `services` Services from `source`.
fn measure_start(
    sb: &mut Sandbox,
    pid: u32,
    (source, services, frontends): (&str, u32, usize),
    t0: Instant,
) -> Result<StartRow> {
    let synced = wait_synced(sb, frontends, 0, Duration::from_secs(600))?;
    let startup = (synced - t0).as_secs_f64();
    // Let the allocator settle after the initial sync.
    std::thread::sleep(Duration::from_millis(500));
    let rss = status_kb(pid, "VmRSS:")? as f64 / 1024.0;
    let hwm = status_kb(pid, "VmHWM:")? as f64 / 1024.0;
    let mappings = rss_by_mapping(pid)?;
    let log = sb.agent_log();
    // Logged once any resize is done: the maps the programs use.
    let loaded = log.lines().find(|l| l.contains("the maps' kernel memory"));
    Ok(StartRow {
        source: source.into(),
        services: services.into(),
        endpoints_per_service: workload::FILLER_ENDPOINTS,
        frontends,
        rss_mib: rss,
        peak_rss_mib: hwm,
        startup_to_synced_s: startup,
        heap: heap_steps(&log, frontends),
        rss_by_mapping: Some(mappings),
        phases: phases(&log, frontends),
        maps_kernel_mib: log_field(loaded, "maps_kernel_mib"),
        ipv6_maps_kernel_mib: log_field(loaded, "ipv6_maps_kernel_mib"),
        ..StartRow::default()
    })
}

/// The agent's RSS by what is mapped (MiB), from `/proc/<pid>/smaps`: its
/// binary, the shared libraries, the main heap (`[heap]`), anonymous
/// mappings (blocks malloc maps on their own, the threads' stacks), the main
/// thread's stack; and its threads.
fn rss_by_mapping(pid: u32) -> Result<RssByMapping> {
    let smaps = fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let exe = fs::read_link(format!("/proc/{pid}/exe"))?;
    let exe = exe.to_string_lossy();
    let exe = exe.trim_end_matches(" (deleted)");
    let (mut binary, mut libs, mut heap, mut anon, mut stack) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut anon_mappings = 0u32;
    let mut current: Option<String> = None;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            // A mapping's header: address perms offset dev inode [path].
            current = Some(words.nth(4).unwrap_or_default().to_owned());
            continue;
        }
        if first != "Rss:" {
            continue;
        }
        let kib: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        match current.as_deref() {
            Some(path) if path == exe => binary += kib,
            Some("[heap]") => heap += kib,
            Some("[stack]") => stack += kib,
            Some("") | None => {
                anon += kib;
                anon_mappings += u32::from(kib > 0);
            }
            Some(_) => libs += kib,
        }
    }
    let mib = |k: u64| k as f64 / 1024.0;
    Ok(RssByMapping {
        binary_mib: mib(binary),
        libraries_mib: mib(libs),
        main_heap_mib: mib(heap),
        anonymous_mib: mib(anon),
        anonymous_mappings: anon_mappings,
        main_stack_mib: mib(stack),
        threads: status_kb(pid, "Threads:")?,
    })
}

/// Where the start went (s), from the agent's log timestamps: reading the
/// source's first view (from the agent's first log line), loading the
/// programs and maps, and the first sync (to the `maps synced` line with
/// every frontend).
fn phases(log: &str, frontends: usize) -> StartPhases {
    // `2026-12-05T05:27:41.302898Z …`: seconds into the day.
    let at = |line: Option<&str>| -> Option<f64> {
        let time = line?.split_whitespace().next()?.split('T').nth(1)?;
        let mut hms = time.trim_end_matches('Z').split(':');
        let (h, m, s) = (hms.next()?, hms.next()?, hms.next()?);
        Some(
            h.parse::<f64>().ok()? * 3600.0
                + m.parse::<f64>().ok()? * 60.0
                + s.parse::<f64>().ok()?,
        )
    };
    let line = |what: &str| log.lines().find(|l| l.contains(what));
    let all = format!("frontends={frontends} ");
    let start = at(log.lines().next());
    let read = at(line("the source's first view is read"));
    let loaded = at(line("first view of the source"));
    let synced = at(log
        .lines()
        .find(|l| l.contains("maps synced") && l.contains(&all)));
    let span = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| b - a);
    StartPhases {
        source_s: span(start, read),
        load_s: span(read, loaded),
        sync_s: span(loaded, synced),
    }
}

/// The number logged as `key=…` on `line`.
fn log_field(line: Option<&str>, key: &str) -> Option<f64> {
    line?
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse::<f64>().ok())
}

/// The agent's own memory accounting, from its log: the bytes it held on
/// the heap (its counting allocator) at each step of the start, in MiB.
/// The first sync is the `maps synced` line with every frontend.
fn heap_steps(log: &str, frontends: usize) -> Heap {
    let line = |what: &str| log.lines().find(|l| l.contains(what));
    let source = line("the source's first view is read");
    let loaded = line("first view of the source");
    let all = format!("frontends={frontends} ");
    let synced = log
        .lines()
        .find(|l| l.contains("maps synced") && l.contains(&all));
    Heap {
        before_source_mib: log_field(source, "heap_before_mib"),
        source_read_mib: log_field(source, "heap_mib"),
        source_read_peak_mib: log_field(source, "heap_peak_mib"),
        maps_loaded_mib: log_field(loaded, "heap_mib"),
        changes_mib: log_field(synced, "heap_changes_mib"),
        inputs_mib: log_field(synced, "heap_inputs_mib"),
        model_mib: log_field(synced, "heap_model_mib"),
        synced_mib: log_field(synced, "heap_synced_mib"),
        peak_mib: log_field(synced, "heap_peak_mib"),
        blocks: log_field(synced, "heap_blocks"),
    }
}

/// The YAML source: the manifests are written in `style`, then the agent
/// starts. With `follow`, the file change is measured too at its size (on
/// block YAML: the change rewrites a file in that style).
fn start_yaml(switchboard: &Path, n: u32, style: Style, follow: bool) -> Result<StartRow> {
    // A fresh sandbox each time: fresh pins, so the agent programs
    // everything instead of adopting.
    let mut sb = Sandbox::new(tag())?;
    let frontends = write_manifests(&sb, &workload::services(n, &pod_ips()), style)?;
    let yaml_bytes: u64 = fs::read_dir(sb.manifest_dir())?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    let caps = agent_caps(n);
    let mut args: Vec<&str> = vec!["--node-name", NODE_NAME];
    args.extend(caps.iter().map(String::as_str));
    let t0 = Instant::now();
    let pid = sb.start_agent_with(switchboard, &args)?;
    let mut row = measure_start(&mut sb, pid, ("yaml", n, frontends), t0)?;
    row.manifest_mib = Some(yaml_bytes as f64 / 1048576.0);
    row.yaml_style = Some(style.name().to_owned());
    note_row(&row);
    if follow && style == Style::Block && n == targets::FILE_CHANGE_SERVICES {
        let services = workload::services(n, &pod_ips());
        let change = follow::run(&mut sb, &release_bin("sb-echo"), &services)?;
        note(&format!(
            "{n} Services from YAML: file change → new backend answering, median {} ms, max {} ms over {} changes",
            change.median_ms, change.max_ms, follow::ROUNDS
        ));
        row.file_change = Some(change);
    }
    sb.stop_agent()?;
    sb.cleanup()?;
    Ok(row)
}

/// The cluster source: the fake API server (the release `sb-apiserver`, a
/// process of its own in the sandbox's node namespace: `cargo xtask` runs
/// unoptimised, and an unoptimised server would take most of the start
/// time serving the lists) loads the same YAML the YAML source reads, then
/// the agent starts and lists and watches it over HTTP. Once its start is
/// measured, EndpointSlice changes at [`targets::EVENT_RATE`] per second
/// time each watch event to its map write; with `churn`, the churn then runs
/// on this agent.
fn start_cluster(
    switchboard: &Path,
    sb_apiserver: &Path,
    n: u32,
    quick: bool,
    churn: Option<&churn::ChurnPlan>,
) -> Result<(StartRow, Option<Churn>)> {
    let mut sb = Sandbox::new(tag())?;
    let services = workload::services(n, &pod_ips());
    let frontends = write_manifests(&sb, &services, Style::Block)?;
    let kubeconfig = sb.dir.join("kubeconfig");
    let _ = fs::remove_file(&kubeconfig);
    let kc = kubeconfig.to_string_lossy().into_owned();
    let bin = sb_apiserver.to_string_lossy().into_owned();
    let manifests = sb.manifest_dir().to_string_lossy().into_owned();
    let node = sb.node_ns();
    let loading = Instant::now();
    // History enough for the churn's changes (a watch further behind
    // relists), without keeping every loaded object twice.
    sb.spawn(
        "apiserver",
        &node,
        &[
            &bin,
            "--listen",
            API_ADDR,
            "--kubeconfig",
            &kc,
            "--history",
            "50000",
            "-f",
            &manifests,
        ],
    )?;
    // The kubeconfig is written once everything is loaded.
    let deadline = Instant::now() + Duration::from_secs(600);
    while !kubeconfig.exists() {
        if !sb.running("apiserver") || Instant::now() > deadline {
            bail!(
                "sb-apiserver did not come up with {n} Services:\n{}",
                sb.read_log("apiserver")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let load_s = loading.elapsed().as_secs_f64();
    let caps = agent_caps(n);
    let mut args: Vec<&str> = vec![
        "--kubeconfig",
        &kc,
        "--node-name",
        NODE_NAME,
        "--metrics-bind-address",
        METRICS,
    ];
    args.extend(caps.iter().map(String::as_str));
    let t0 = Instant::now();
    let pid = sb.start_agent_from(switchboard, "cluster", &args)?;
    let mut row = measure_start(&mut sb, pid, ("cluster", n, frontends), t0)?;
    row.api_objects = Some(2 * services.len());
    row.api_load_s = Some(load_s);
    note_row(&row);
    let event_plan = churn::ChurnPlan::event_to_map(quick);
    let events = churn::run(
        &mut sb,
        API_ADDR,
        switchboard,
        &services,
        METRICS,
        &event_plan,
    )?;
    row.event_to_map = events.rates.into_iter().next();
    let churned = match churn {
        Some(plan) => {
            let result = churn::run(&mut sb, API_ADDR, switchboard, &services, METRICS, plan)?;
            let rss = status_kb(pid, "VmRSS:")? as f64 / 1024.0;
            let hwm = status_kb(pid, "VmHWM:")? as f64 / 1024.0;
            row.rss_after_churn_mib = Some(rss);
            row.peak_rss_after_churn_mib = Some(hwm);
            Some(result)
        }
        None => None,
    };
    sb.stop_agent()?;
    sb.cleanup()?;
    Ok((row, churned))
}

fn note_row(row: &StartRow) {
    let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
    if let Some(m) = &row.rss_by_mapping {
        note(&format!(
            "RSS by mapping (MiB): binary {:.1}, libraries {:.1}, main heap {:.1}, anonymous {:.1} in {} mappings, main stack {:.1}; {} threads; heap after the sync {:.1} (peak {:.1})",
            m.binary_mib,
            m.libraries_mib,
            m.main_heap_mib,
            m.anonymous_mib,
            m.anonymous_mappings,
            m.main_stack_mib,
            m.threads,
            nan(row.heap.synced_mib),
            nan(row.heap.peak_mib),
        ));
    }
    note(&format!(
        "{} Services from {}: start → maps synced {:.2} s (source read {:.2} s, maps loaded {:.2} s, first sync {:.2} s), RSS {:.1} MiB (peak {:.1} MiB){}",
        row.services,
        row.source,
        row.startup_to_synced_s,
        nan(row.phases.source_s),
        nan(row.phases.load_s),
        nan(row.phases.sync_s),
        row.rss_mib,
        row.peak_rss_mib,
        match (row.api_load_s, row.api_objects) {
            (Some(s), Some(objects)) => format!(
                ", the fake API server up with {objects} objects {s:.1} s after its start"
            ),
            _ => String::new(),
        }
    ));
}
