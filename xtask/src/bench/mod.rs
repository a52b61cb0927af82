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

mod goals;
pub mod kubeproxy;
pub mod northsouth;
mod paired;
pub mod progtime;
pub mod report;
pub mod scale;
pub mod workload;
pub mod xdpfwd;

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde_json::{json, Value};

use crate::sandbox::{self, Sandbox};
use crate::util::{cargo, is_root, release_bin, repo_root, run_capture, show};

/// Sandbox tags used by the benchmark (the north-south part's three
/// two-node sandboxes are in [`northsouth::TAGS`]).
const TAGS: [&str; 6] = ["sbbfwd", "sbbdir", "sbbsw", "sbbipt", "sbbnft", "sbbrss"];

/// Every tag a run may create; with `SB_BENCH_SANDBOX_TAG`, only that one
/// (see [`scale::tag`]).
fn all_tags() -> Box<dyn Iterator<Item = &'static str>> {
    match scale::own_tag() {
        Some(tag) => Box::new(std::iter::once(tag)),
        None => Box::new(TAGS.iter().chain(northsouth::TAGS.iter()).copied()),
    }
}

/// `SB_BENCH_ONLY=north-south` (or `scale`, or `e2e`) runs only that part
/// (and the report); `start` only the agent start and memory rows of
/// `scale`; unset, everything runs.
fn only() -> Result<Option<String>> {
    match std::env::var("SB_BENCH_ONLY") {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) if ["north-south", "scale", "start", "e2e"].contains(&v.as_str()) => Ok(Some(v)),
        Ok(v) => {
            bail!(
                "SB_BENCH_ONLY={v}: the parts that run alone are e2e, north-south, scale and start"
            )
        }
        Err(_) => Ok(None),
    }
}

pub struct Options {
    pub quick: bool,
    pub out: Option<PathBuf>,
}

/// What one run measures; `--quick` shrinks it to stay short.
struct Plan {
    quick: bool,
    e2e_sizes: Vec<u32>,
    /// Services counts of the agent start and memory rows (`scale`).
    scale_sizes: Vec<u32>,
    wrk_secs: u32,
    udp_ms: u32,
    bulk_ms: u32,
    fwd_frames: u32,
    /// Interleaved rounds per size (the report takes the median).
    rounds: usize,
    /// Rounds at the largest size, whose rows the goals quote: one round
    /// moves 6–12 % on these machines, so a median of three cannot tell
    /// 0.97 from 0.93.
    rounds_at_max: usize,
    /// The end-to-end paths measured (their keys); all when `None`.
    paths: Option<Vec<String>>,
    /// Repetitions of the paired conn/s phases at the largest size
    /// ([`paired`]; none in a quick run unless `SB_BENCH_PAIRED` asks).
    paired_reps: usize,
}

/// Services counts, comma separated, from the environment variable `name`
/// (`None` when unset).
fn sizes_from_env(name: &str) -> Result<Option<Vec<u32>>> {
    let Ok(v) = std::env::var(name) else {
        return Ok(None);
    };
    let sizes: Vec<u32> = v
        .split(',')
        .map(|n| n.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("{name}={v}: Services counts, comma separated"))?;
    ensure!(!sizes.is_empty(), "{name} is empty");
    Ok(Some(sizes))
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                e2e_sizes: vec![1, 1000],
                scale_sizes: vec![1000, 10_000],
                wrk_secs: 2,
                udp_ms: 1000,
                bulk_ms: 1000,
                fwd_frames: 1_000_000,
                rounds: 1,
                rounds_at_max: 1,
                paths: None,
                paired_reps: 0,
            }
        } else {
            Plan {
                quick,
                e2e_sizes: vec![1, 1000, 10_000],
                scale_sizes: vec![1000, 10_000, 100_000],
                wrk_secs: 5,
                udp_ms: 2000,
                bulk_ms: 2000,
                fwd_frames: 5_000_000,
                rounds: 3,
                rounds_at_max: 5,
                paths: None,
                paired_reps: 15,
            }
        }
    }
}

impl Plan {
    /// The end-to-end sizes, rounds and paths from `SB_BENCH_E2E_SIZES`
    /// (comma separated Services counts; `SB_BENCH_SCALE_SIZES` the same
    /// for the agent start and memory rows), `SB_BENCH_ROUNDS` and
    /// `SB_BENCH_PATHS` (comma separated path keys), when set: a run that
    /// looks at a few paths at one size closely.
    fn overridden(mut self) -> Result<Plan> {
        if let Some(sizes) = sizes_from_env("SB_BENCH_E2E_SIZES")? {
            self.e2e_sizes = sizes;
        }
        if let Some(sizes) = sizes_from_env("SB_BENCH_SCALE_SIZES")? {
            self.scale_sizes = sizes;
        }
        if let Ok(v) = std::env::var("SB_BENCH_ROUNDS") {
            self.rounds = v
                .parse()
                .with_context(|| format!("SB_BENCH_ROUNDS={v}: a number of rounds"))?;
            ensure!(self.rounds > 0, "SB_BENCH_ROUNDS must be at least 1");
            self.rounds_at_max = self.rounds;
        }
        if let Ok(v) = std::env::var("SB_BENCH_PAIRED") {
            self.paired_reps = v
                .parse()
                .with_context(|| format!("SB_BENCH_PAIRED={v}: a number of repetitions"))?;
        }
        if let Ok(v) = std::env::var("SB_BENCH_PATHS") {
            let keys: Vec<String> = v.split(',').map(|k| k.trim().to_string()).collect();
            for key in &keys {
                ensure!(
                    PATHS.iter().any(|p| p.key == key),
                    "SB_BENCH_PATHS: no end-to-end path {key} (the paths: {})",
                    PATHS.iter().map(|p| p.key).collect::<Vec<_>>().join(", ")
                );
            }
            self.paths = Some(keys);
        }
        Ok(self)
    }

    /// Interleaved rounds at `n` Services.
    fn rounds_at(&self, n: u32) -> usize {
        if self.e2e_sizes.iter().max() == Some(&n) {
            self.rounds_at_max
        } else {
            self.rounds
        }
    }

    /// Progress steps of the end-to-end part: per size, the programming,
    /// every path in every round and (full runs) the programs' time.
    fn e2e_steps(&self) -> usize {
        self.e2e_sizes
            .iter()
            .map(|&n| 1 + PATHS.len() * self.rounds_at(n) + usize::from(!self.quick))
            .sum::<usize>()
            + self.paired_reps
    }

    /// Whether the end-to-end path `key` is measured in this run.
    fn measures(&self, key: &str) -> bool {
        self.paths
            .as_ref()
            .is_none_or(|keys| keys.iter().any(|k| k == key))
    }
}

static STEP: AtomicUsize = AtomicUsize::new(0);
static TOTAL: AtomicUsize = AtomicUsize::new(0);
static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// The progress line: `bench [3/17 0:42] …`.
fn progress(msg: &str) {
    let step = STEP.fetch_add(1, Ordering::SeqCst) + 1;
    let total = TOTAL.load(Ordering::SeqCst);
    let secs = STARTED.get_or_init(Instant::now).elapsed().as_secs();
    println!(
        "bench [{step}/{total} {}:{:02}] {msg}",
        secs / 60,
        secs % 60
    );
}

fn note(msg: &str) {
    println!("bench        {msg}");
}

pub fn run(opts: Options) -> Result<()> {
    if !is_root() {
        bail!(
            "cargo xtask bench needs root (it loads eBPF programs and builds network namespaces)"
        );
    }
    let plan = Plan::new(opts.quick).overridden()?;
    let only = only()?;
    STARTED.get_or_init(Instant::now);
    TOTAL.store(
        if only.as_deref() == Some("north-south") {
            northsouth::steps(&plan) + 1
        } else if only.as_deref() == Some("start") {
            scale::start_steps(&plan) + 1
        } else if only.as_deref() == Some("scale") {
            scale::steps(&plan) + 1
        } else if only.is_some() {
            plan.e2e_steps() + 1 + 1
        } else {
            3 + 1 + plan.e2e_steps() + northsouth::steps(&plan) + scale::steps(&plan) + 1
        },
        Ordering::SeqCst,
    );

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
    let sb_bench = if only.as_deref() == Some("start") {
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
    let folder = match (plan.quick, &only) {
        (true, Some(part)) => format!("{stamp}-quick-{part}"),
        (false, Some(part)) => format!("{stamp}-{part}"),
        (true, None) => format!("{stamp}-quick"),
        (false, None) => stamp.clone(),
    };
    let dir = opts
        .out
        .clone()
        .unwrap_or_else(|| results_root.join(folder));
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    println!("bench: writing to {}", dir.display());

    let mut results = json!({
        "meta": meta(&stamp, plan.quick)?,
    });
    if switchboard != bins.switchboard {
        results["meta"]["switchboard_binary"] = json!(switchboard.display().to_string());
    }

    let quick = if plan.quick { vec!["--quick"] } else { vec![] };

    if only.is_none() {
        progress("per-packet cost: BPF_PROG_TEST_RUN of sb_from_pod / sb_to_pod at each Services count, next to the empty programs");
        results["perpacket"] = run_json(
            &sb_bench,
            &[&["perpacket"], quick.as_slice()].concat(),
            &dir.join("perpacket.json"),
        )?;

        progress("control plane: model + Syncer::apply of Services x 10 endpoints into kernel maps; one EndpointSlice change");
        results["sync"] = run_json(
            &sb_bench,
            &[&["sync"], quick.as_slice()].concat(),
            &dir.join("sync.json"),
        )?;

        progress("forwarding rate on one core: XDP live frames through the node's tc path");
        results["fwd"] = fwd(&sb_bench, &plan, &dir)?;
    }
    if only.is_none() || only.as_deref() == Some("e2e") {
        let e2e = e2e_all(&plan, &sb_http, &switchboard, &dir)?;
        results["e2e_paths"] = Value::Array(e2e.paths);
        results["e2e"] = Value::Array(e2e.rows);
        results["programming"] = Value::Array(e2e.programming);
        results["e2e_program_time"] = Value::Array(e2e.prog_time);
        results["e2e_paired"] = e2e.paired;
    }
    if only.is_none() || only.as_deref() == Some("scale") {
        results["scale"] = scale::run(&plan, &sb_bench, &switchboard, &dir)?;
    }
    if only.as_deref() == Some("start") {
        results["scale"] = scale::run_start(&plan, &switchboard)?;
    }
    if only.is_none() || only.as_deref() == Some("north-south") {
        results["northsouth"] = northsouth::run(&plan, &sb_http, &switchboard, &sb_bench, &dir)?;
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
    let results = read_json(&dir.join("results.json"))?;
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

fn capture(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if s.is_empty() {
                s = String::from_utf8_lossy(&o.stderr).trim().to_string();
            }
            s
        })
        .unwrap_or_default()
}

fn meta(stamp: &str, quick: bool) -> Result<Value> {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mem_kb: u64 = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let root = repo_root();
    let root = root.to_string_lossy();
    let commit = capture("git", &["-C", &root, "rev-parse", "--short=12", "HEAD"]);
    let dirty = !capture(
        "git",
        &["-C", &root, "status", "--porcelain", "--untracked-files=no"],
    )
    .is_empty();
    Ok(json!({
        "timestamp": stamp,
        "mode": if quick { "quick" } else { "full" },
        "cpu": cpu,
        "cpus": cpus,
        "memory_gib": mem_kb as f64 / 1024.0 / 1024.0,
        "kernel": capture("uname", &["-r"]),
        "commit": commit,
        "dirty": dirty,
        "iptables": capture("iptables", &["--version"]),
        "nft": capture("nft", &["--version"]),
        "wrk": capture("wrk", &["--version"]).lines().next().unwrap_or_default().to_string(),
    }))
}

/// Runs `sb_bench <args> --out <file>` (inheriting stderr, which carries its
/// own progress) and parses the JSON it wrote.
fn run_json(sb_bench: &Path, args: &[&str], file: &Path) -> Result<Value> {
    let mut c = Command::new(sb_bench);
    c.args(args).arg("--out").arg(file);
    let status = c
        .status()
        .with_context(|| format!("start `{}`", show(&c)))?;
    ensure!(status.success(), "`{}` failed: {status}", show(&c));
    read_json(file)
}

fn read_json(file: &Path) -> Result<Value> {
    let text = fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parse {}", file.display()))
}

fn pod_ips() -> Vec<Ipv4Addr> {
    (1..=sandbox::PODS)
        .map(|i| sandbox::pod_ip(i).parse().expect("valid pod address"))
        .collect()
}

// ---------------------------------------------------------------------------
// Forwarding rate
// ---------------------------------------------------------------------------

fn fwd(sb_bench: &Path, plan: &Plan, dir: &Path) -> Result<Value> {
    let sb = Sandbox::new("sbbfwd")?;
    let file = dir.join("fwd.json");
    let bin = sb_bench.to_string_lossy().into_owned();
    let file_s = file.to_string_lossy().into_owned();
    let frames = plan.fwd_frames.to_string();
    let pods: Vec<String> = (1..=sandbox::PODS)
        .map(|i| format!("{}:{}:{}", sb.pod_if(i), sb.pod_ns(i), sandbox::pod_ip(i)))
        .collect();
    let client_if = sb.client_if();
    let mut args: Vec<&str> = vec![
        &bin,
        "fwd",
        "--ingress",
        &client_if,
        "--count",
        &frames,
        "--out",
        &file_s,
    ];
    for p in &pods {
        args.extend(["--pod", p.as_str()]);
    }
    let mut c = sb.command(&sb.node_ns(), &args);
    let status = c
        .status()
        .with_context(|| format!("start `{}`", show(&c)))?;
    drop(sb);
    ensure!(status.success(), "`{}` failed: {status}", show(&c));
    read_json(&file)
}

// ---------------------------------------------------------------------------
// End to end
// ---------------------------------------------------------------------------

/// Where a benchmark client runs: which namespace, and whether it is a member
/// of the sandbox's cgroup (the one the agent's socket layer is attached to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Client {
    /// The client namespace (a pod), outside the cgroup: Service traffic is
    /// translated per packet (switchboard's tc programs, or the NAT rules).
    Pod,
    /// The second client namespace ([`Sandbox::add_second_client`]: a pod
    /// of its own, on its own pod interface), outside the cgroup.
    SecondPod,
    /// The client namespace, inside the cgroup: the socket layer picks the
    /// backend at `connect()`.
    PodInCgroup,
    /// The node namespace (the host), inside the cgroup.
    HostInCgroup,
    /// The node namespace, outside the cgroup.
    Host,
}

impl Client {
    fn ns(self, sb: &Sandbox) -> String {
        match self {
            Client::Pod | Client::PodInCgroup => sb.client_ns(),
            Client::SecondPod => sb.second_client_ns(),
            Client::Host | Client::HostInCgroup => sb.node_ns(),
        }
    }

    fn in_cgroup(self) -> bool {
        matches!(self, Client::PodInCgroup | Client::HostInCgroup)
    }

    /// `cmd` run as this client (stdin closed, stdout and stderr piped).
    fn command(self, sb: &Sandbox, cmd: &[&str]) -> Result<Command> {
        let ns = self.ns(sb);
        let mut c = if self.in_cgroup() {
            sb.command_in_cgroup(&ns, cmd)?
        } else {
            sb.command(&ns, cmd)
        };
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(c)
    }

    fn describe(self) -> &'static str {
        match self {
            Client::Pod => "client namespace, outside the sandbox's cgroup",
            Client::SecondPod => {
                "a second client namespace (a pod of its own), outside the sandbox's cgroup"
            }
            Client::PodInCgroup => "client namespace, inside the sandbox's cgroup",
            Client::HostInCgroup => "node namespace, inside the sandbox's cgroup",
            Client::Host => "node namespace, outside the sandbox's cgroup",
        }
    }
}

/// Where the clients send to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// Each client to its own pod (pod1, pod2, pod3), on the pods' ports.
    Pods,
    /// Every client to the target Service's ClusterIP and ports.
    Service,
    /// Client `i` to the Service whose one endpoint is pod `i`: the spread
    /// of the direct rows, through a Service.
    PinnedServices,
    /// Every client to the address all pods share
    /// ([`Sandbox::add_spread_address`]), on the pods' ports: each
    /// connection lands on one pod by the node's multipath route, as a
    /// balancer spreads them, with no Service.
    Spread,
}

impl Target {
    /// One destination address per client: the pods, or the Service for each.
    fn hosts(self) -> Vec<String> {
        (1..=CLIENTS)
            .map(|i| match self {
                Target::Pods => sandbox::pod_ip(i),
                Target::Service => workload::TARGET_IP.to_string(),
                Target::PinnedServices => workload::pinned_ip(i).to_string(),
                Target::Spread => SPREAD_IP.to_string(),
            })
            .collect()
    }

    /// HTTP, UDP and bulk ports.
    fn ports(self) -> (u16, u16, u16) {
        match self {
            Target::Pods | Target::Spread => (
                workload::POD_HTTP_PORT,
                workload::POD_UDP_PORT,
                workload::POD_BULK_PORT,
            ),
            Target::Service | Target::PinnedServices => {
                (workload::HTTP_PORT, workload::UDP_PORT, workload::BULK_PORT)
            }
        }
    }

    fn describe(self) -> String {
        let (http, udp, bulk) = self.ports();
        match self {
            Target::Pods => format!(
                "pod1, pod2, pod3: one client each ({}–{}, ports {http}, {udp}); the stream to pod1:{bulk}",
                sandbox::pod_ip(1),
                sandbox::pod_ip(CLIENTS)
            ),
            Target::Service => format!(
                "the Service {}: all clients (ports {http}, {udp}); the stream to :{bulk}",
                workload::TARGET_IP
            ),
            Target::Spread => format!(
                "{SPREAD_IP}, an address of all three pods: every client, each connection to one pod by the node's multipath route (port {http}; no UDP, which the pods answer from their own addresses); the stream to one of them"
            ),
            Target::PinnedServices => format!(
                "{}–{}: one Service per client, each with one pod as its endpoint (ports {http}, {udp}); the stream to the first",
                workload::pinned_ip(1),
                workload::pinned_ip(CLIENTS)
            ),
        }
    }
}

/// Which of the four sandboxes a path runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Setup {
    Direct,
    Switchboard,
    Iptables,
    Nftables,
}

impl Setup {
    fn tag(self) -> &'static str {
        match self {
            Setup::Direct => "sbbdir",
            Setup::Switchboard => "sbbsw",
            Setup::Iptables => "sbbipt",
            Setup::Nftables => "sbbnft",
        }
    }
}

/// One end-to-end path: a sandbox, where its clients run and where they send.
struct E2ePath {
    /// The `path` of its rows in results.json.
    key: &'static str,
    label: &'static str,
    setup: Setup,
    client: Client,
    target: Target,
    /// What spreads the connections over the pods.
    balancer: &'static str,
    /// The client namespace's ephemeral ports while this path is measured
    /// (`net.ipv4.ip_local_port_range`), when not the default.
    local_ports: Option<&'static str>,
}

/// Keys of the end-to-end paths in results.json (the report looks them up).
pub const DIRECT: &str = "direct";
pub const DIRECT_HOST: &str = "direct_host";
pub const DIRECT_SPREAD: &str = "direct_spread";
pub const DIRECT_SW: &str = "direct_switchboard";
pub const SW_TC: &str = "switchboard";
pub const SW_SOCK_POD: &str = "socketlb_pod";
pub const SW_SOCK_PINNED: &str = "socketlb_pod_pinned";
pub const SW_SOCK_HOST: &str = "socketlb_host";
pub const IPTABLES: &str = "iptables";
pub const NFTABLES: &str = "nftables";

/// The ephemeral port range of every pod client (each row's client sets it
/// before its measurement), one size for all, so that a client port comes
/// round again as often in every row: the server's TIME_WAIT sockets are met
/// as often, and connect() searches a range as large. The tc row's client is
/// a pod of its own ([`Client::SecondPod`]), so no two rows of one sandbox
/// reach a pod from the same address once through DNAT and once directly
/// (which a pod's TIME_WAIT socket refuses by PAWS until a SYN retransmit).
const POD_LOCAL_PORTS: &str = "47000 60999";

const SOCKET_LB: &str = "switchboard's socket layer (cgroup connect4/sendmsg4/recvmsg4/getpeername4): the backend is chosen once per connect(), packets carry pod addresses and tc leaves them alone";

/// Every end-to-end path, in the order of the first round.
const PATHS: [E2ePath; 10] = [
    E2ePath {
        key: DIRECT,
        label: "direct (pod client)",
        setup: Setup::Direct,
        client: Client::Pod,
        target: Target::Pods,
        balancer: "none (no Service): the limit for pod clients",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: DIRECT_SPREAD,
        label: "direct, spread (pod client)",
        setup: Setup::Direct,
        client: Client::Pod,
        target: Target::Spread,
        balancer: "none (no Service, no NAT): the node's multipath route spreads each client's connections over the three pods by a hash of their ports, as a balancer does; the fair limit for the Service paths",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: DIRECT_HOST,
        label: "direct (host client)",
        setup: Setup::Direct,
        client: Client::Host,
        target: Target::Pods,
        balancer: "none (no Service): the limit for host clients",
        local_ports: None,
    },
    E2ePath {
        key: DIRECT_SW,
        label: "direct in switchboard's sandbox (pod client)",
        setup: Setup::Switchboard,
        client: Client::PodInCgroup,
        target: Target::Pods,
        balancer: "none (no Service), through everything switchboard adds to a node: its agent running, its tc programs on the veths and its socket hooks on the client's cgroup; the limit the socket layer can reach",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: SW_TC,
        label: "switchboard (tc, pod client)",
        setup: Setup::Switchboard,
        client: Client::SecondPod,
        target: Target::Service,
        balancer: "switchboard's tc programs on the node's veths (per-packet DNAT and connection tracking)",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: SW_SOCK_POD,
        label: "switchboard socket-LB (pod client)",
        setup: Setup::Switchboard,
        client: Client::PodInCgroup,
        target: Target::Service,
        balancer: SOCKET_LB,
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: SW_SOCK_PINNED,
        label: "switchboard socket-LB, one pod per client",
        setup: Setup::Switchboard,
        client: Client::PodInCgroup,
        target: Target::PinnedServices,
        balancer: "switchboard's socket layer, each client to a Service of one backend (its own pod), as in the direct rows: the socket layer's cost apart from spreading each client over three pods",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: SW_SOCK_HOST,
        label: "switchboard socket-LB (host client)",
        setup: Setup::Switchboard,
        client: Client::HostInCgroup,
        target: Target::Service,
        balancer: SOCKET_LB,
        local_ports: None,
    },
    E2ePath {
        key: IPTABLES,
        label: "iptables",
        setup: Setup::Iptables,
        client: Client::Pod,
        target: Target::Service,
        balancer: "kube-proxy-style iptables NAT rules in the node namespace (conntrack)",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: NFTABLES,
        label: "nftables",
        setup: Setup::Nftables,
        client: Client::Pod,
        target: Target::Service,
        balancer: "kube-proxy-style nftables NAT rules in the node namespace (conntrack)",
        local_ports: Some(POD_LOCAL_PORTS),
    },
];

/// The address all pods of the direct sandbox share ([`Target::Spread`]).
const SPREAD_IP: &str = "10.244.200.1";

/// Clients run in parallel per measurement (wrk and UDP): one per pod.
const CLIENTS: usize = sandbox::PODS;

fn start_http_pods(sb: &mut Sandbox, sb_http: &Path) -> Result<()> {
    let bin = sb_http.to_string_lossy().into_owned();
    for i in 1..=sandbox::PODS {
        let (ns, name) = (sb.pod_ns(i), sandbox::pod_name(i));
        sb.spawn(
            &name,
            &ns,
            &[
                &bin,
                "serve",
                "--name",
                &name,
                "--http",
                &workload::POD_HTTP_PORT.to_string(),
                "--udp",
                &workload::POD_UDP_PORT.to_string(),
                "--bulk",
                &workload::POD_BULK_PORT.to_string(),
            ],
        )?;
    }
    // Each pod answers UDP on its own address from the client.
    for ip in pod_ips() {
        let addr = format!("{ip}:{}", workload::POD_UDP_PORT);
        wait_udp(sb, sb_http, &addr)?;
    }
    Ok(())
}

fn wait_udp(sb: &Sandbox, sb_http: &Path, addr: &str) -> Result<()> {
    let bin = sb_http.to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = sb.exec_status(
            &sb.client_ns(),
            &[
                &bin,
                "udp",
                "--addr",
                addr,
                "--flows",
                "1",
                "--duration-ms",
                "200",
            ],
        )?;
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if v["requests"].as_u64().unwrap_or(0) > 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{addr} does not answer UDP from the client namespace: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// wrk's figures: requests (= connections, with `Connection: close`) per
/// second and latency percentiles in microseconds.
#[derive(Debug, Default)]
struct Wrk {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    requests: u64,
    errors: u64,
    /// Connections/s of each client (several wrk run in parallel).
    per_client: Vec<f64>,
}

fn parse_duration_us(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mult) = if let Some(v) = s.strip_suffix("us") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1e3)
    } else if let Some(v) = s.strip_suffix('m') {
        (v, 60e6)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|n| n * mult)
}

fn parse_wrk(text: &str) -> Result<Wrk> {
    let mut w = Wrk::default();
    for line in text.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            w.rps = v.trim().parse()?;
        } else if let Some(v) = t.strip_prefix("50%") {
            w.p50_us = parse_duration_us(v).ok_or_else(|| anyhow!("bad wrk line {t}"))?;
        } else if let Some(v) = t.strip_prefix("99%") {
            w.p99_us = parse_duration_us(v).ok_or_else(|| anyhow!("bad wrk line {t}"))?;
        } else if t.contains(" requests in ") {
            w.requests = t
                .split_whitespace()
                .next()
                .unwrap_or("0")
                .parse()
                .unwrap_or(0);
        } else if let Some(v) = t.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            w.errors += v
                .split(',')
                .filter_map(|kv| kv.split_whitespace().nth(1))
                .filter_map(|n| n.parse::<u64>().ok())
                .sum::<u64>();
        } else if let Some(v) = t.strip_prefix("Non-2xx or 3xx responses:") {
            w.errors += v.trim().parse::<u64>().unwrap_or(0);
        }
    }
    ensure!(
        w.rps > 0.0 && w.requests > 0,
        "wrk made no request:\n{text}"
    );
    Ok(w)
}

/// wrk per client: one thread, 11 connections; with the three clients, 33
/// connections keep the three pods busy without queueing in accept.
const WRK_CONNECTIONS: &str = "11";
/// UDP flows per client (sockets doing request/response in lockstep).
const UDP_FLOWS: &str = "3";

/// Starts every command, then waits for all of them; fails if one failed.
fn run_parallel(cmds: Vec<Command>) -> Result<Vec<Output>> {
    let mut children = Vec::new();
    for mut c in cmds {
        match c.spawn() {
            Ok(child) => children.push((show(&c), child)),
            Err(e) => {
                for (_, mut child) in children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Err(e).with_context(|| format!("could not start `{}`", show(&c)));
            }
        }
    }
    let mut outs = Vec::new();
    let mut failed = Vec::new();
    for (what, child) in children {
        let out = child
            .wait_with_output()
            .with_context(|| format!("wait for `{what}`"))?;
        if !out.status.success() {
            failed.push(format!(
                "`{what}` failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            ));
        }
        outs.push(out);
    }
    ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(outs)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One wrk per URL, in parallel, each `-t 1 -c 11`, `Connection: close`.
/// Connections/s, requests and errors are summed; p50 is the median of the
/// clients' p50s, p99 the largest of their p99s.
fn wrk(sb: &Sandbox, client: Client, urls: &[String], secs: u32) -> Result<Wrk> {
    let d = format!("{secs}s");
    let cmds = urls
        .iter()
        .map(|url| {
            client.command(
                sb,
                &[
                    "wrk",
                    "-t",
                    "1",
                    "-c",
                    WRK_CONNECTIONS,
                    "-d",
                    &d,
                    "--latency",
                    "-H",
                    "Connection: close",
                    url,
                ],
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let each = run_parallel(cmds)?
        .iter()
        .map(|out| parse_wrk(&String::from_utf8_lossy(&out.stdout)))
        .collect::<Result<Vec<_>>>()?;
    Ok(Wrk {
        rps: each.iter().map(|w| w.rps).sum(),
        p50_us: median(each.iter().map(|w| w.p50_us).collect()),
        p99_us: each.iter().map(|w| w.p99_us).fold(0.0, f64::max),
        requests: each.iter().map(|w| w.requests).sum(),
        errors: each.iter().map(|w| w.errors).sum(),
        per_client: each.iter().map(|w| w.rps).collect(),
    })
}

/// One `sb-http udp` per address, in parallel, [`UDP_FLOWS`] flows each:
/// rates, requests and timeouts summed, p50 the median of the clients' p50s,
/// p99 the largest of their p99s.
fn udp(sb: &Sandbox, client: Client, sb_http: &str, addrs: &[String], ms: u32) -> Result<Value> {
    let ms = ms.to_string();
    let cmds = addrs
        .iter()
        .map(|addr| {
            client.command(
                sb,
                &[
                    sb_http,
                    "udp",
                    "--addr",
                    addr,
                    "--flows",
                    UDP_FLOWS,
                    "--duration-ms",
                    &ms,
                ],
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let mut runs = Vec::new();
    for (addr, out) in addrs.iter().zip(run_parallel(cmds)?) {
        let run: Value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "sb-http udp output: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })?;
        ensure!(
            run["requests"].as_u64().unwrap_or(0) > 0,
            "no UDP answer from {addr}: {run}"
        );
        runs.push(run);
    }
    let nums = |key: &str| -> Vec<f64> { runs.iter().filter_map(|r| r[key].as_f64()).collect() };
    Ok(json!({
        "requests": runs.iter().filter_map(|r| r["requests"].as_u64()).sum::<u64>(),
        "timeouts": runs.iter().filter_map(|r| r["timeouts"].as_u64()).sum::<u64>(),
        "rate": nums("rate").iter().sum::<f64>(),
        "p50_us": median(nums("p50_us")),
        "p99_us": nums("p99_us").into_iter().fold(0.0, f64::max),
        "clients": runs,
    }))
}

/// switchboard's counters, read between the phases of a measurement.
type Counters<'a> = &'a dyn Fn() -> Result<Value>;

/// Everything measured over one path at one size: three wrk clients, three
/// UDP clients, one TCP stream (to the first address). With `counters`, the
/// growth of switchboard's counters over each phase goes into `datapath`, and
/// the wrk phase is checked against the path's label ([`check_datapath`]).
fn measure(
    sb: &Sandbox,
    path: &E2ePath,
    sb_http: &Path,
    plan: &Plan,
    counters: Option<Counters>,
) -> Result<Value> {
    let snap = || counters.map(|read| read()).transpose();
    let bin = sb_http.to_string_lossy().into_owned();
    let hosts = path.target.hosts();
    let (_, udp_port, bulk_port) = path.target.ports();
    let urls = urls(path);
    if !plan.quick {
        wrk(sb, path.client, &urls, 1)?; // warm-up (neighbours, caches, conntrack)
    }
    let c0 = snap()?;
    let agent = (path.setup == Setup::Switchboard)
        .then(|| sb.agent_pid())
        .flatten();
    let cpu0 = CpuUse::read(agent)?;
    let profile = Profile::start(path.key, plan.wrk_secs)?;
    let w = wrk(sb, path.client, &urls, plan.wrk_secs)?;
    let cpu = CpuUse::read(agent)?.since(&cpu0);
    profile.finish()?;
    let c1 = snap()?;
    // The pods' UDP echo answers from its own address, not from the shared
    // one a spread client sent to: no UDP there.
    let udp = match path.target {
        Target::Spread => json!({"rate": null, "p99_us": null}),
        _ => {
            let addrs: Vec<String> = hosts.iter().map(|h| format!("{h}:{udp_port}")).collect();
            udp(sb, path.client, &bin, &addrs, plan.udp_ms)?
        }
    };
    let c2 = snap()?;
    let bulk_addr = format!("{}:{bulk_port}", hosts[0]);
    let bulk_ms = plan.bulk_ms.to_string();
    let out = run_capture(&mut path.client.command(
        sb,
        &[
            &bin,
            "bulk",
            "--addr",
            &bulk_addr,
            "--duration-ms",
            &bulk_ms,
        ],
    )?)?;
    let bulk: Value = serde_json::from_slice(&out.stdout).context("sb-http bulk output")?;
    let c3 = snap()?;
    let datapath = match (c0, c1, c2, c3) {
        (Some(c0), Some(c1), Some(c2), Some(c3)) => {
            let http = growth(&c0, &c1);
            check_datapath(path, &http, w.requests)?;
            json!({"http": http, "udp": growth(&c1, &c2), "bulk": growth(&c2, &c3)})
        }
        _ => Value::Null,
    };
    let per_client: Vec<String> = w.per_client.iter().map(|r| format!("{r:.0}")).collect();
    note(&format!(
        "{:.0} conn/s ({}; p50 {:.0} us, p99 {:.0} us, {} errors; CPU {}); UDP {:.0} req/s (p99 {} us); one TCP stream {:.2} Gbit/s",
        w.rps, per_client.join(" + "), w.p50_us, w.p99_us, w.errors, cpu.describe(), udp["rate"].as_f64().unwrap_or(0.0), udp["p99_us"], bulk["gbit_s"].as_f64().unwrap_or(0.0)
    ));
    Ok(json!({
        "conn_per_s": w.rps,
        "conn_per_s_clients": w.per_client,
        "p50_us": w.p50_us,
        "p99_us": w.p99_us,
        "requests": w.requests,
        "errors": w.errors,
        "udp": udp,
        "bulk": bulk,
        "datapath": datapath,
        "cpu": cpu.json(),
    }))
}

/// `SB_BENCH_PERF=DIR`: a `perf record -a -g` of the whole machine over
/// each wrk phase, to `DIR/<path>-<n>.data` (for comparing where two paths
/// spend their CPU with `perf report`); off unless set.
struct Profile(Option<std::process::Child>);

impl Profile {
    fn start(key: &str, secs: u32) -> Result<Profile> {
        let Some(dir) = std::env::var_os("SB_BENCH_PERF") else {
            return Ok(Profile(None));
        };
        let dir = PathBuf::from(dir);
        fs::create_dir_all(&dir)?;
        let n = (0..)
            .find(|n| !dir.join(format!("{key}-{n}.data")).exists())
            .unwrap_or(0);
        let out = dir.join(format!("{key}-{n}.data"));
        let child = Command::new("perf")
            .args(["record", "-a", "-g", "-F", "499", "-q", "-o"])
            .arg(&out)
            .args(["--", "sleep", &secs.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting perf record (SB_BENCH_PERF)")?;
        Ok(Profile(Some(child)))
    }

    fn finish(self) -> Result<()> {
        if let Some(mut child) = self.0 {
            child.wait().context("perf record")?;
        }
        Ok(())
    }
}

/// CPU time used, in clock ticks: the machine's, by kind (`/proc/stat`),
/// and the agent's (`/proc/PID/stat`), if there is one.
#[derive(Clone, Copy, Default)]
struct CpuUse {
    user: u64,
    system: u64,
    softirq: u64,
    idle: u64,
    agent: Option<u64>,
}

impl CpuUse {
    fn read(agent: Option<u32>) -> Result<CpuUse> {
        let stat = fs::read_to_string("/proc/stat").context("read /proc/stat")?;
        let line = stat
            .lines()
            .find(|l| l.starts_with("cpu "))
            .ok_or_else(|| anyhow!("/proc/stat has no cpu line"))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| v.get(i).copied().unwrap_or(0);
        let agent = match agent {
            Some(pid) => Some(process_ticks(pid)?),
            None => None,
        };
        Ok(CpuUse {
            user: at(0) + at(1),
            system: at(2),
            softirq: at(5) + at(6),
            idle: at(3) + at(4),
            agent,
        })
    }

    fn since(&self, before: &CpuUse) -> CpuUse {
        CpuUse {
            user: self.user - before.user,
            system: self.system - before.system,
            softirq: self.softirq - before.softirq,
            idle: self.idle - before.idle,
            agent: self.agent.zip(before.agent).map(|(a, b)| a - b),
        }
    }

    /// The machine's busy time (all CPUs together), in seconds.
    fn busy_secs(&self) -> f64 {
        // SAFETY: sysconf only reads a system constant.
        let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
        (self.user + self.system + self.softirq) as f64 / tck as f64
    }

    fn total(&self) -> u64 {
        (self.user + self.system + self.softirq + self.idle).max(1)
    }

    /// Shares of the machine's time (all CPUs together).
    fn json(&self) -> Value {
        let share = |t: u64| t as f64 / self.total() as f64;
        json!({
            "user": share(self.user),
            "system": share(self.system),
            "softirq": share(self.softirq),
            "idle": share(self.idle),
            "agent": self.agent.map(share),
        })
    }

    fn describe(&self) -> String {
        let pct = |t: u64| t as f64 * 100.0 / self.total() as f64;
        let agent = self
            .agent
            .map(|a| format!(", agent {:.1} %", pct(a)))
            .unwrap_or_default();
        format!(
            "user {:.0} %, system {:.0} %, softirq {:.0} %, idle {:.0} %{agent}",
            pct(self.user),
            pct(self.system),
            pct(self.softirq),
            pct(self.idle)
        )
    }
}

/// User and system clock ticks process `pid` has used.
fn process_ticks(pid: u32) -> Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("read /proc/{pid}/stat"))?;
    // The fields after the command name, which is in parentheses.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("/proc/{pid}/stat: no command name"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15, 12 and 13 after the name.
    Ok(tick(11) + tick(12))
}

/// switchboard's global data-path counters (`switchboard stats -o json`).
fn sb_counters(sb: &Sandbox, switchboard: &Path) -> Result<Value> {
    let bin = switchboard.to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb.exec(
        &sb.node_ns(),
        &[&bin, "stats", "--pin-root", &pin, "-o", "json"],
    )?;
    let v: Value = serde_json::from_slice(&out.stdout).context("`switchboard stats -o json`")?;
    Ok(v["counters"].clone())
}

/// How much switchboard's data-path counters grew between two readings.
fn growth(before: &Value, after: &Value) -> Value {
    let grew = |k: &str| {
        after[k]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(before[k].as_u64().unwrap_or(0))
    };
    json!({
        "tc_forwarded": grew("forwarded"),
        "sock_connect": grew("sock_connect"),
        "sock_sendmsg": grew("sock_sendmsg"),
    })
}

/// Checks, from the counters' growth over the wrk phase, that a switchboard
/// row measured the data path it is labelled with: the socket layer gave
/// every connection its backend and tc rewrote nothing, or the reverse.
fn check_datapath(path: &E2ePath, http: &Value, requests: u64) -> Result<()> {
    let forwarded = http["tc_forwarded"].as_u64().unwrap_or(0);
    let connects = http["sock_connect"].as_u64().unwrap_or(0);
    let (ok, layer) = if matches!(path.target, Target::Pods | Target::Spread) {
        // No Service: neither layer translates anything.
        (
            connects == 0 && forwarded <= requests / 1000,
            "neither layer",
        )
    } else if path.client.in_cgroup() {
        // A stray retransmission of an earlier tc flow may still pass tc.
        (
            connects >= requests && forwarded <= requests / 1000,
            "the socket layer",
        )
    } else {
        (connects == 0 && forwarded >= requests, "tc")
    };
    ensure!(
        ok,
        "{}: during wrk the socket layer balanced {connects} connects and tc rewrote {forwarded} packets for {requests} HTTP requests: the clients are not balanced by {layer}",
        path.label
    );
    Ok(())
}

/// Services per manifest file the benchmark writes.
const MANIFESTS_PER_FILE: usize = 1000;

/// Writes the manifests of `services` into the sandbox's manifest directory
/// (replacing what is there); returns their number of frontends.
fn write_manifests(
    sb: &Sandbox,
    services: &[workload::Svc],
    style: workload::Style,
) -> Result<usize> {
    let dir = sb.manifest_dir();
    for entry in fs::read_dir(&dir)? {
        fs::remove_file(entry?.path())?;
    }
    // Write into a hidden staging name first (the dir source ignores hidden
    // files), then rename, so the agent never reads a half-written file.
    for (name, text) in workload::manifest_files(services, MANIFESTS_PER_FILE, style) {
        let staging = dir.join(format!(".{name}"));
        fs::write(&staging, text)?;
        fs::rename(&staging, dir.join(&name))?;
    }
    Ok(workload::frontends(services))
}

/// Agent capacity flags large enough for `services` × 10 endpoints.
fn agent_caps(services: u32) -> Vec<String> {
    let entries = (u64::from(services) * 11 + 4096)
        .next_power_of_two()
        .max(65_536);
    let backends = (u64::from(services) * 10 + 4096)
        .next_power_of_two()
        .max(65_536);
    let ids = (u64::from(services) + 1024).next_power_of_two().max(16_384);
    vec![
        "--max-frontend-entries".into(),
        entries.to_string(),
        "--max-backends".into(),
        backends.to_string(),
        "--max-services".into(),
        ids.to_string(),
    ]
}

fn start_agent(sb: &mut Sandbox, switchboard: &Path, max_services: u32) -> Result<u32> {
    // The sandbox's own agent command: its socket layer goes on the
    // sandbox's cgroup, never on the host's cgroup root (the agent's default).
    let caps = agent_caps(max_services);
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    sb.start_agent_with(switchboard, &caps)
}

/// Waits until the agent's log has a `maps synced` line with `frontends=N`
/// after `skip` bytes of log; returns when it appeared.
fn wait_synced(
    sb: &mut Sandbox,
    frontends: usize,
    skip: usize,
    timeout: Duration,
) -> Result<Instant> {
    let want = format!("frontends={frontends} ");
    let deadline = Instant::now() + timeout;
    loop {
        let log = sb.agent_log();
        let fresh = log.get(skip..).unwrap_or_default();
        if fresh
            .lines()
            .any(|l| l.contains("maps synced") && l.contains(&want))
        {
            return Ok(Instant::now());
        }
        if !sb.agent_running() {
            bail!("the agent exited:\n{log}");
        }
        if Instant::now() > deadline {
            bail!(
                "the agent did not sync {frontends} frontends within {timeout:?}:\n{}",
                tail(&log, 30)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RuleSet {
    Iptables,
    Nftables,
}

impl RuleSet {
    fn name(self) -> &'static str {
        match self {
            RuleSet::Iptables => "iptables",
            RuleSet::Nftables => "nftables",
        }
    }
    fn load_command(self) -> &'static str {
        match self {
            RuleSet::Iptables => "iptables-restore",
            RuleSet::Nftables => "nft -f",
        }
    }
    fn render(self, services: &[workload::Svc]) -> String {
        match self {
            RuleSet::Iptables => kubeproxy::iptables(services),
            RuleSet::Nftables => kubeproxy::nftables(services),
        }
    }
    /// Loads `file` into the node namespace; returns the wall time of the
    /// loading command.
    fn load(self, sb: &Sandbox, file: &Path) -> Result<f64> {
        let f = file.to_string_lossy().into_owned();
        let node = sb.node_ns();
        let t0 = Instant::now();
        match self {
            // iptables-restore replaces the tables named in the file (nat, filter).
            RuleSet::Iptables => {
                let mut c = sb.command(&node, &["sh", "-c", "exec iptables-restore < \"$0\"", &f]);
                run_capture(&mut c)?;
            }
            RuleSet::Nftables => {
                sb.exec(&node, &["nft", "-f", &f])?;
            }
        }
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// Median of the numbers at `key` (a JSON pointer) over `runs`.
fn median_of(runs: &[Value], key: &str) -> Value {
    let mut v: Vec<f64> = runs
        .iter()
        .filter_map(|r| r.pointer(key).and_then(Value::as_f64))
        .collect();
    if v.is_empty() {
        return Value::Null;
    }
    v.sort_by(f64::total_cmp);
    json!(v[v.len() / 2])
}

/// The paths of [`PATHS`] over four sandboxes (direct, switchboard, iptables,
/// nftables), so that nothing of one setup, such as the conntrack hooks that
/// iptables/nftables NAT rules switch on, touches another. The switchboard
/// sandbox's one agent serves its three paths (tc with clients outside its
/// cgroup, socket layer with pod and host clients inside). All sandboxes are
/// alive at once so that the measurements can be interleaved: for each size,
/// every round measures every path, starting with a different one each round,
/// and the report takes the median over rounds. On a small machine shared
/// with other work this keeps slow drifts from favouring whichever path
/// happened to run in a quiet moment.
fn e2e_all(plan: &Plan, sb_http: &Path, switchboard: &Path, dir: &Path) -> Result<E2e> {
    progress(&format!(
        "end to end: four sandboxes (direct, switchboard, iptables, nftables) with three sb-http pods each; {} paths",
        PATHS.len()
    ));
    let mut direct = Sandbox::new(Setup::Direct.tag())?;
    direct.add_spread_address(SPREAD_IP)?;
    start_http_pods(&mut direct, sb_http)?;
    let mut sw = Sandbox::new(Setup::Switchboard.tag())?;
    // The tc row's client is a pod of its own: its translated flows would
    // keep the socket-LB rows' client pod from being quiet.
    sw.add_second_client()?;
    start_http_pods(&mut sw, sb_http)?;
    let mut ipt = Sandbox::new(Setup::Iptables.tag())?;
    start_http_pods(&mut ipt, sb_http)?;
    let mut nft = Sandbox::new(Setup::Nftables.tag())?;
    start_http_pods(&mut nft, sb_http)?;
    let max = *plan.e2e_sizes.iter().max().unwrap_or(&1);
    let mut rows = Vec::new();
    let mut programming = Vec::new();
    let mut prog_time = Vec::new();
    let mut agent_started = false;
    let mut paired_conn = Value::Null;
    for &n in &plan.e2e_sizes {
        progress(&format!(
            "end to end at {n} Services: programming switchboard, iptables, nftables"
        ));
        // switchboard: the agent follows its manifest directory.
        let skip = sw.agent_log().len();
        let t0 = Instant::now();
        let frontends = write_manifests(
            &sw,
            &workload::e2e_services(n, &pod_ips()),
            workload::Style::Block,
        )?;
        if !agent_started {
            start_agent(&mut sw, switchboard, max)?;
            agent_started = true;
        }
        let synced = wait_synced(&mut sw, frontends, skip, Duration::from_secs(300))?;
        let agent_s = (synced - t0).as_secs_f64();
        note(&format!("switchboard agent: {frontends} frontends programmed {agent_s:.2} s after the manifests were written"));
        let mut ipt_s = 0.0;
        let mut nft_s = 0.0;
        for (set, sb) in [(RuleSet::Iptables, &ipt), (RuleSet::Nftables, &nft)] {
            let services = workload::e2e_services(n, &pod_ips());
            let text = set.render(&services);
            let file = sb.dir.join(format!("{}-{n}.rules", set.name()));
            fs::write(&file, &text)?;
            let secs = set.load(sb, &file)?;
            let _ = fs::remove_file(&file);
            note(&format!(
                "{}: {n} Services (x {} endpoints) loaded in {secs:.2} s ({} lines)",
                set.load_command(),
                workload::FILLER_ENDPOINTS,
                text.lines().count()
            ));
            match set {
                RuleSet::Iptables => ipt_s = secs,
                RuleSet::Nftables => nft_s = secs,
            }
            if n == max {
                programming
                    .push(json!({"tool": set.load_command(), "services": n, "seconds": secs}));
                if !plan.quick {
                    let head: String = text.lines().take(80).collect::<Vec<_>>().join("\n");
                    fs::write(
                        dir.join(format!("{}-rules-head.txt", set.name())),
                        head + "\n",
                    )?;
                }
            }
        }
        if n == max {
            programming.push(json!({"tool": "switchboard agent (YAML written → maps synced)", "services": n, "seconds": agent_s}));
        }
        let sandbox = |path: &E2ePath| match path.setup {
            Setup::Direct => &direct,
            Setup::Switchboard => &sw,
            Setup::Iptables => &ipt,
            Setup::Nftables => &nft,
        };
        let mut runs: Vec<Vec<Value>> = vec![Vec::new(); PATHS.len()];
        let rounds = plan.rounds_at(n);
        for round in 0..rounds {
            for k in 0..PATHS.len() {
                let i = (k + round) % PATHS.len();
                let path = &PATHS[i];
                if !plan.measures(path.key) {
                    continue;
                }
                progress(&format!(
                    "end to end at {n} Services, round {}/{}: {}",
                    round + 1,
                    rounds,
                    path.label
                ));
                let sb = sandbox(path);
                prepare(sb, path)?;
                let read = || sb_counters(sb, switchboard);
                let counters = (path.setup == Setup::Switchboard).then_some(&read as Counters);
                let m = measure(sb, path, sb_http, plan, counters)?;
                runs[i].push(m);
            }
        }
        if n == max {
            paired_conn = paired::run(plan, n, sandbox)?;
        }
        if !plan.quick {
            progress(&format!(
                "end to end at {n} Services: switchboard's programs per connection (BPF run-time statistics)"
            ));
            for path in PATHS.iter().filter(|p| p.setup == Setup::Switchboard) {
                if plan.measures(path.key) {
                    prog_time.push(program_time(&sw, path, n, plan)?);
                }
            }
        }
        for (path, r) in PATHS.iter().zip(&runs) {
            let m = json!({
                "conn_per_s": median_of(r, "/conn_per_s"),
                "p50_us": median_of(r, "/p50_us"),
                "p99_us": median_of(r, "/p99_us"),
                "errors": r.iter().filter_map(|m| m["errors"].as_u64()).sum::<u64>(),
                "udp": {"rate": median_of(r, "/udp/rate"), "p50_us": median_of(r, "/udp/p50_us"), "p99_us": median_of(r, "/udp/p99_us")},
                "bulk": {"gbit_s": median_of(r, "/bulk/gbit_s")},
                "conn_per_s_rounds": r.iter().map(|m| m["conn_per_s"].clone()).collect::<Vec<_>>(),
                "conn_per_s_clients_rounds": r.iter().map(|m| m["conn_per_s_clients"].clone()).collect::<Vec<_>>(),
                "datapath_rounds": r.iter().map(|m| m["datapath"].clone()).filter(|d| !d.is_null()).collect::<Vec<_>>(),
            });
            note(&format!(
                "{} at {n} Services: median {} conn/s over {} rounds {}",
                path.label,
                m["conn_per_s"],
                r.len(),
                m["conn_per_s_rounds"]
            ));
            let program_s = match path.setup {
                Setup::Direct => Value::Null,
                Setup::Switchboard => json!(agent_s),
                Setup::Iptables => json!(ipt_s),
                Setup::Nftables => json!(nft_s),
            };
            rows.push(json!({"path": path.key, "label": path.label, "services": n, "m": m, "program_s": program_s}));
        }
    }
    sw.stop_agent()?;
    let mut errors = Vec::new();
    for mut sb in [direct, sw, ipt, nft] {
        if let Err(e) = sb.cleanup() {
            errors.push(format!("{e:#}"));
        }
    }
    ensure!(errors.is_empty(), "cleanup: {}", errors.join("; "));
    let paths = PATHS
        .iter()
        .map(|p| {
            json!({
                "path": p.key,
                "label": p.label,
                "sandbox": p.setup.tag(),
                "client": p.client.describe(),
                "target": p.target.describe(),
                "balancer": p.balancer,
                "client_local_ports": p.local_ports,
            })
        })
        .collect();
    Ok(E2e {
        paths,
        rows,
        programming,
        prog_time,
        paired: paired_conn,
    })
}

/// What [`e2e_all`] measured.
struct E2e {
    paths: Vec<Value>,
    rows: Vec<Value>,
    programming: Vec<Value>,
    /// [`program_time`] of each switchboard path and size.
    prog_time: Vec<Value>,
    /// [`paired::run`] at the largest size (null when not run).
    paired: Value,
}

/// Readies `path`'s client before a measurement: its own ephemeral port
/// range, and no conntrack entries of earlier connections in the NAT rows.
fn prepare(sb: &Sandbox, path: &E2ePath) -> Result<()> {
    if matches!(path.setup, Setup::Iptables | Setup::Nftables) {
        // Forget earlier connections (conntrack is per namespace).
        let _ = sb.exec_status(&sb.node_ns(), &["conntrack", "-F"]);
    }
    if let Some(range) = path.local_ports {
        let ns = path.client.ns(sb);
        sb.exec(
            &ns,
            &[
                "sysctl",
                "-qw",
                &format!("net.ipv4.ip_local_port_range={range}"),
            ],
        )?;
    }
    Ok(())
}

/// The wrk targets of `path`: one URL per client.
fn urls(path: &E2ePath) -> Vec<String> {
    let (http, _, _) = path.target.ports();
    path.target
        .hosts()
        .iter()
        .map(|h| format!("http://{h}:{http}/"))
        .collect()
}

/// One wrk phase of `path` with the kernel's BPF run-time statistics on:
/// switchboard's programs' time per connection ([`progtime`]).
fn program_time(sb: &Sandbox, path: &E2ePath, n: u32, plan: &Plan) -> Result<Value> {
    prepare(sb, path)?;
    let stats = progtime::Stats::enable()?;
    let before = progtime::snapshot()?;
    let cpu0 = CpuUse::read(None)?;
    let w = wrk(sb, path.client, &urls(path), plan.wrk_secs)?;
    let cpu = CpuUse::read(None)?.since(&cpu0);
    let after = progtime::snapshot()?;
    drop(stats);
    let time = progtime::per_connection(&before, &after, w.requests, cpu.busy_secs());
    note(&format!(
        "{}: {:.0} conn/s with the statistics on; switchboard's programs {:.2} us per connection of {:.1} us busy CPU ({:.1} %)",
        path.label,
        w.rps,
        time["programs_ns_per_conn"].as_f64().unwrap_or(0.0) / 1000.0,
        time["busy_ns_per_conn"].as_f64().unwrap_or(0.0) / 1000.0,
        time["share"].as_f64().unwrap_or(0.0) * 100.0
    ));
    Ok(
        json!({"path": path.key, "label": path.label, "services": n, "conn_per_s": w.rps, "time": time}),
    )
}

/// A process's `/proc/PID/status` field, in kB.
fn status_kb(pid: u32, key: &str) -> Result<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/status"))?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow!("{key} missing from /proc/{pid}/status"))
}
