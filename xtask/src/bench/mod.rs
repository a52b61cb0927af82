//! `cargo xtask bench [--quick] [--out DIR]`: switchboard against its
//! baselines, on this machine, in one run, written to
//! `xtask/results/<timestamp>/` (report.md, results.json, SVG plots) and
//! copied to `xtask/results/latest/` (a `--quick` run writes
//! `<timestamp>-quick/` and leaves `latest/` alone).
//!
//! Steps (each prints a progress line):
//! 1. per-packet cost (`sb_bench perpacket`, BPF_PROG_TEST_RUN);
//! 2. control plane (`sb_bench sync`: model + map writes at 10k × 10);
//! 3. forwarding rate on one core (`sb_bench fwd` in a sandbox: XDP live
//!    frames into the node's stack through the tc path);
//! 4. end to end in netns sandboxes, one fresh sandbox per setup so nothing
//!    of one (conntrack hooks, rules, tc filters, cgroup hooks) touches
//!    another: direct to the three pods (from a pod and from the host),
//!    switchboard (tc with a pod client outside the sandbox's cgroup; socket
//!    layer with pod and host clients inside it), kube-proxy-style iptables,
//!    kube-proxy-style nftables, each at 1, 1k, 10k Services, measured in
//!    interleaved rounds: new TCP connections per second and latency (three
//!    wrk in parallel, `Connection: close`), UDP request/response rate (three
//!    clients), one TCP stream's throughput; plus the time to program 10k
//!    Services × 10 endpoints with each (iptables-restore, `nft -f`, agent);
//!    and after the rounds (full runs) one phase per switchboard path with
//!    the kernel's BPF run-time statistics on: its programs' time per
//!    connection (`progtime.rs`);
//! 5. the control plane at scale (`scale/`): one EndpointSlice change →
//!    maps through the incremental model at 1k, 10k, 100k Services
//!    (`sb_bench change`); a real agent's start → synced and memory from
//!    YAML and from the cluster source (the fake API server), at 1k and 10k
//!    Services (and 100k in a full run); churn at 10k Services (the changes
//!    per second it keeps up with, the maps at most 100 ms behind). Run
//!    alone with `SB_BENCH_ONLY=scale`;
//! 6. north-south (`northsouth.rs`): per-packet cost of the uplink programs
//!    (`sb_bench uplink`), then an external client to a NodePort in the
//!    two-node sandbox with local and remote backends through XDP, tc only,
//!    kube-proxy-style iptables NodePort rules and directly: new TCP
//!    connections/s and a one-core UDP flood (`sb_bench flood`). Run alone
//!    with `SB_BENCH_ONLY=north-south`;
//! 7. the report, with every ratio computed from this run's figures.
//!
//! Every sandbox uses a fixed `sbb…` tag: a new run first removes what an
//! interrupted one left, and Ctrl-C removes them before exiting. Rules and
//! traffic exist only inside the sandbox namespaces.
//!
//! The modules, by concern: [`plan`] (what a run measures), [`progress`]
//! (its progress lines), [`paths`], [`clients`] and [`workload`] (where
//! the end-to-end clients run, what they run and the Services they are
//! given), [`agent`] (the agent in a sandbox), [`e2e`], [`paired`],
//! [`progtime`], [`fwd`], [`northsouth`], [`xdpfwd`] and [`scale`] (the
//! measurements), [`profile`] (CPU and memory while they run), [`stats`]
//! (medians and quartiles), [`results`] (the typed results.json),
//! [`goals`] (every goal and its verdict) and [`report`] (report.md, one
//! writer per section, and the plots).

mod agent;
mod clients;
mod e2e;
mod fmt;
mod fwd;
mod goals;
pub mod kubeproxy;
mod meta;
pub mod northsouth;
mod paired;
mod paths;
mod plan;
mod profile;
mod progress;
pub mod progtime;
pub mod report;
pub mod results;
pub mod scale;
mod stats;
pub mod workload;
pub mod xdpfwd;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::sandbox;
use crate::util::{cargo, is_root, release_bin, repo_root, run_capture, show};
use paths::Setup;
use plan::{Part, Plan};
use progress::progress;
use results::Results;

/// Sandbox tags used by the benchmark (the north-south part's three
/// two-node sandboxes are in [`northsouth::TAGS`]).
const TAGS: [&str; 6] = [
    fwd::TAG,
    Setup::Direct.tag(),
    Setup::Switchboard.tag(),
    Setup::Iptables.tag(),
    Setup::Nftables.tag(),
    scale::TAG,
];

/// Every tag a run may create; with `SB_BENCH_SANDBOX_TAG`, only that one
/// (see [`scale::tag`]).
fn all_tags() -> Box<dyn Iterator<Item = &'static str>> {
    match scale::own_tag() {
        Some(tag) => Box::new(std::iter::once(tag)),
        None => Box::new(TAGS.iter().chain(northsouth::TAGS.iter()).copied()),
    }
}

pub struct Options {
    pub quick: bool,
    pub out: Option<PathBuf>,
}

/// The progress steps a run of `only` (everything: `None`) prints.
fn steps(plan: &Plan, only: Option<Part>) -> usize {
    match only {
        Some(Part::NorthSouth) => northsouth::steps(plan) + 1,
        Some(Part::Start) => scale::start_steps(plan) + 1,
        Some(Part::Scale) => scale::steps(plan) + 1,
        Some(Part::E2e) => plan.e2e_steps() + 1 + 1,
        None => 3 + 1 + plan.e2e_steps() + northsouth::steps(plan) + scale::steps(plan) + 1,
    }
}

pub fn run(opts: Options) -> Result<()> {
    if !is_root() {
        bail!(
            "cargo xtask bench needs root (it loads eBPF programs and builds network namespaces)"
        );
    }
    let plan = Plan::new(opts.quick).overridden()?;
    let only = plan::only()?;
    progress::set_steps(steps(&plan, only));

    ctrlc::set_handler(|| {
        eprintln!("\nbench: interrupted, removing the benchmark sandboxes");
        for tag in all_tags() {
            if let Err(e) = sandbox::purge_tag(tag) {
                eprintln!("bench: cleanup {tag}: {e:#}");
            }
        }
        std::process::exit(130);
    })
    .context("install Ctrl-C handler")?;

    crate::setup::run()?;
    let bins = crate::build::bench()?;
    let switchboard = agent_binary(&bins.switchboard)?;
    let sb_http = release_bin("sb-http");
    ensure!(
        sb_http.exists(),
        "{} missing after the build",
        sb_http.display()
    );
    // The start rows run the agent alone: no in-process benchmark to build.
    let sb_bench = if only == Some(Part::Start) {
        PathBuf::new()
    } else {
        build_bench()?
    };
    for tag in all_tags() {
        sandbox::purge_tag(tag)?;
    }

    let stamp = timestamp()?;
    let results_root = repo_root().join("xtask/results");
    // Quick runs (smoke tests) get their own folders and leave latest/ to
    // the newest full run.
    let folder = match (plan.quick, only) {
        (true, Some(part)) => format!("{stamp}-quick-{}", part.name()),
        (false, Some(part)) => format!("{stamp}-{}", part.name()),
        (true, None) => format!("{stamp}-quick"),
        (false, None) => stamp.clone(),
    };
    let dir = opts
        .out
        .clone()
        .unwrap_or_else(|| results_root.join(folder));
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    println!("bench: writing to {}", dir.display());

    let mut results = Results {
        meta: meta::read(&stamp, plan.quick),
        ..Results::default()
    };
    if switchboard != bins.switchboard {
        results.meta.switchboard_binary = Some(switchboard.display().to_string());
    }

    let quick = if plan.quick { vec!["--quick"] } else { vec![] };

    if only.is_none() {
        progress("per-packet cost: BPF_PROG_TEST_RUN of sb_from_pod / sb_to_pod at each Services count, next to the empty programs");
        results.perpacket = Some(run_json(
            &sb_bench,
            &[&["perpacket"], quick.as_slice()].concat(),
            &dir.join("perpacket.json"),
        )?);

        progress("control plane: model + Syncer::apply of Services x 10 endpoints into kernel maps; one EndpointSlice change");
        results.sync = Some(run_json(
            &sb_bench,
            &[&["sync"], quick.as_slice()].concat(),
            &dir.join("sync.json"),
        )?);

        progress("forwarding rate on one core: XDP live frames through the node's tc path");
        results.fwd = Some(fwd::run(&sb_bench, &plan, &dir)?);
    }
    if only.is_none() || only == Some(Part::E2e) {
        let e2e = e2e::run(&plan, &sb_http, &switchboard, &dir)?;
        results.e2e_paths = Some(e2e.paths);
        results.e2e = Some(e2e.rows);
        results.programming = Some(e2e.programming);
        results.e2e_program_time = Some(e2e.prog_time);
        results.e2e_paired = e2e.paired;
    }
    if only.is_none() || only == Some(Part::Scale) {
        results.scale = Some(scale::run(&plan, &sb_bench, &switchboard, &dir)?);
    }
    if only == Some(Part::Start) {
        results.scale = Some(scale::run_start(&plan, &switchboard)?);
    }
    if only.is_none() || only == Some(Part::NorthSouth) {
        results.northsouth = Some(northsouth::run(
            &plan,
            &sb_http,
            &switchboard,
            &sb_bench,
            &dir,
        )?);
    }

    progress("report: tables, ratios and plots");
    fs::write(
        dir.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    let table = report::write(&results, &dir)?;
    if opts.out.is_none() && !plan.quick && only.is_none() {
        let latest = results_root.join("latest");
        let _ = fs::remove_dir_all(&latest);
        fs::create_dir_all(&latest)?;
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            fs::copy(entry.path(), latest.join(entry.file_name()))?;
        }
        publish_figures(&latest)?;
    }
    println!("\n{table}");
    println!("bench: report in {}", dir.join("report.md").display());
    let leftover: Vec<String> = sandbox::list_netns()?
        .into_iter()
        .filter(|ns| all_tags().any(|t| ns.starts_with(&format!("{t}-"))))
        .collect();
    ensure!(leftover.is_empty(), "namespaces left behind: {leftover:?}");
    Ok(())
}

/// `cargo xtask bench --report-only DIR`: report.md and the plots again from
/// DIR/results.json, measuring nothing.
pub fn report_again(dir: &Path) -> Result<()> {
    let results: Results = read_json(&dir.join("results.json"))?;
    let table = report::write(&results, dir)?;
    println!("{table}");
    println!("bench: report in {}", dir.join("report.md").display());
    let latest = repo_root().join("xtask/results/latest");
    if fs::canonicalize(dir).ok() == fs::canonicalize(&latest).ok() {
        publish_figures(&latest)?;
    }
    Ok(())
}

/// The latest full run's figures to `docs/benchmarks/latest.json`, which
/// the docs check holds the README's and docs/benchmarks.md's quoted
/// figures to: a new full run whose figures the docs do not show fails it.
fn publish_figures(latest: &Path) -> Result<()> {
    let to = repo_root().join(crate::docs::FIGURES_PATH);
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::copy(latest.join(report::FIGURES_FILE), &to)
        .with_context(|| format!("copy the figures to {}", to.display()))?;
    println!("bench: figures for the docs in {}", to.display());
    Ok(())
}

/// The agent the end-to-end, scale and north-south parts run: this tree's
/// build, or `SB_BENCH_SWITCHBOARD=PATH`, another build's `switchboard`
/// binary (its eBPF object is inside it), for measuring two builds with
/// one harness on one machine. The per-packet rows always measure this
/// tree's object.
fn agent_binary(built: &Path) -> Result<PathBuf> {
    let Some(path) = std::env::var_os("SB_BENCH_SWITCHBOARD") else {
        return Ok(built.to_path_buf());
    };
    let path = PathBuf::from(path);
    ensure!(
        path.is_file(),
        "SB_BENCH_SWITCHBOARD={}: no such file",
        path.display()
    );
    println!(
        "bench: the agent is {} (SB_BENCH_SWITCHBOARD)",
        path.display()
    );
    Ok(path)
}

/// `cargo bench -p proxy-user --bench sb_bench --no-run`; the executable's path.
fn build_bench() -> Result<PathBuf> {
    println!("build: cargo bench -p proxy-user --bench sb_bench --no-run");
    let mut c = cargo();
    c.current_dir(repo_root())
        .args([
            "bench",
            "-p",
            "proxy-user",
            "--bench",
            "sb_bench",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(std::process::Stdio::inherit());
    let out = c
        .output()
        .with_context(|| format!("start `{}`", show(&c)))?;
    ensure!(
        out.status.success(),
        "`{}` failed ({}); its errors are above",
        show(&c),
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        let Ok(msg) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "sb_bench" {
            if let Some(exe) = msg["executable"].as_str() {
                return Ok(PathBuf::from(exe));
            }
        }
    }
    bail!("cargo bench --no-run did not report the sb_bench executable")
}

fn timestamp() -> Result<String> {
    let out = run_capture(Command::new("date").args(["-u", "+%Y%m%dT%H%M%SZ"]))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs `sb_bench <args> --out <file>` (inheriting stderr, which carries its
/// own progress) and parses the JSON it wrote.
fn run_json<T: DeserializeOwned>(sb_bench: &Path, args: &[&str], file: &Path) -> Result<T> {
    let mut c = Command::new(sb_bench);
    c.args(args).arg("--out").arg(file);
    let status = c
        .status()
        .with_context(|| format!("start `{}`", show(&c)))?;
    ensure!(status.success(), "`{}` failed: {status}", show(&c));
    read_json(file)
}

fn read_json<T: DeserializeOwned>(file: &Path) -> Result<T> {
    let text = fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parse {}", file.display()))
}
