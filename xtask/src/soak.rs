//! Churn under traffic (and, for `cargo xtask soak --faults`, under API
//! server faults): the agent with `--source cluster` watches the fake API
//! server while Services and EndpointSlices change at a set rate, and a
//! client in a pod namespace keeps opening connections to a Service that
//! does not change.
//!
//! What is checked: no connection to the unchanged Service fails; the
//! agent's RSS after the churn is at most its RSS after the warm-up (the
//! same churn, run first so allocator caches and arenas reach their working
//! size) plus [`rss_margin_kib`]; the maps converge to the API server's
//! final state; and `switchboard verify` passes (the pinned maps decode to
//! exactly the agent's desired state).
//!
//! The changes, round robin over the churned Services: three in four
//! replace the endpoints of one Service's EndpointSlice (a new generation of
//! pod addresses), one in four moves one Service's port between 80 and 81
//! (its frontend is removed and another added: a new service id,
//! reverse-NAT entry and backend references). They are made through
//! [`FakeApiServer::apply`] in this process, so the rate is not limited by
//! an HTTP client.
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use crate::fake_apiserver::{FakeApiServer, Faults};
use crate::sandbox::{pod_ip, Frontend, Sandbox, CLUSTER_IP};

const NODE_NAME: &str = "node-a";
const NODE_IP: &str = "10.244.100.1";
/// The unchanged Service's pods (the sandbox's three).
const PODS: [usize; 3] = [1, 2, 3];

pub struct ChurnOptions {
    /// Churn run before the first RSS figure that counts.
    pub warmup: Duration,
    /// The measured churn.
    pub churn: Duration,
    /// Changes per second (Services and EndpointSlices together).
    pub rate: u32,
    /// Services that change (each with one EndpointSlice).
    pub services: usize,
    /// Cycle API server faults through the churn (500s, 429s, slow answers,
    /// watches cut mid-event, silent watches), each for a few seconds with
    /// a clean gap after it.
    pub faults: bool,
    pub switchboard: PathBuf,
    pub sb_echo: PathBuf,
}

/// What a run measured.
#[derive(Clone, Debug, Default)]
pub struct ChurnReport {
    pub services: usize,
    pub changes: u64,
    pub churn_s: f64,
    /// Changes per second achieved over warm-up and churn.
    pub rate_achieved: f64,
    pub requests_sent: u64,
    pub requests_failed: u64,
    pub rss_start_kib: u64,
    pub rss_warm_kib: u64,
    pub rss_peak_kib: u64,
    pub rss_end_kib: u64,
    /// The RSS curve: (seconds since the churn started, KiB), one sample
    /// every [`CURVE_EVERY`] and the end figure.
    pub rss_curve: Vec<(f64, u64)>,
    /// From the end of the churn until the maps held the final state.
    pub converged_after_s: f64,
    /// `switchboard verify` passed.
    pub verify_ok: bool,
    pub verify_text: String,
    /// Faults injected (reads answered 500/429 and the phases run).
    pub faults_injected: u64,
    pub fault_phases: Vec<String>,
}

/// How often the RSS curve is sampled.
pub const CURVE_EVERY: Duration = Duration::from_secs(10);

/// The RSS growth allowed over the warm-up figure: 8 MiB or a tenth of it.
pub fn rss_margin_kib(rss_warm_kib: u64) -> u64 {
    (8 * 1024).max(rss_warm_kib / 10)
}

impl ChurnReport {
    pub fn rss_bound_kib(&self) -> u64 {
        self.rss_warm_kib + rss_margin_kib(self.rss_warm_kib)
    }

    /// What failed, one line each (empty: the run passed).
    pub fn failures(&self, rate: u32) -> Vec<String> {
        let mut out = Vec::new();
        if self.requests_sent == 0 {
            out.push("no request was sent to the unchanged Service".into());
        }
        if self.requests_failed > 0 {
            out.push(format!(
                "{} of {} requests to the unchanged Service failed",
                self.requests_failed, self.requests_sent
            ));
        }
        if self.rate_achieved < f64::from(rate) * 0.9 {
            out.push(format!(
                "only {:.0} changes/s achieved of {rate}",
                self.rate_achieved
            ));
        }
        if self.rss_end_kib > self.rss_bound_kib() {
            out.push(format!(
                "agent RSS grew: {} KiB after the churn, bound {} KiB (warm-up {} KiB + margin)",
                self.rss_end_kib,
                self.rss_bound_kib(),
                self.rss_warm_kib
            ));
        }
        if !self.verify_ok {
            out.push(format!("switchboard verify failed:\n{}", self.verify_text));
        }
        out
    }

    pub fn render(&self) -> String {
        let mib = |k: u64| k as f64 / 1024.0;
        let mut s = format!(
            "churn: {} changes over {:.1} s at {:.0} changes/s ({} Services churned)\n\
             traffic to the unchanged Service: {} requests, {} failed\n\
             agent RSS: start {:.1} MiB, after warm-up {:.1} MiB, peak {:.1} MiB, end {:.1} MiB (bound {:.1} MiB)\n\
             converged {:.2} s after the churn stopped\n\
             switchboard verify: {}\n",
            self.changes,
            self.churn_s,
            self.rate_achieved,
            self.services,
            self.requests_sent,
            self.requests_failed,
            mib(self.rss_start_kib),
            mib(self.rss_warm_kib),
            mib(self.rss_peak_kib),
            mib(self.rss_end_kib),
            mib(self.rss_bound_kib()),
            self.converged_after_s,
            if self.verify_ok { "match" } else { "DIFFERENCES" },
        );
        if !self.rss_curve.is_empty() {
            let points: Vec<String> = self
                .rss_curve
                .iter()
                .map(|(t, kib)| format!("{t:.0} s {:.1}", mib(*kib)))
                .collect();
            s.push_str(&format!(
                "agent RSS over the churn (MiB): {}\n",
                points.join(", ")
            ));
        }
        if !self.fault_phases.is_empty() {
            s.push_str(&format!(
                "API server faults: {} ({} reads answered 500/429)\n",
                self.fault_phases.join(", "),
                self.faults_injected
            ));
        }
        s
    }
}

/// One churned Service as the API server last had it.
#[derive(Clone, Copy)]
struct Churned {
    port: u16,
    generation: u32,
}

fn churn_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 97, (i / 250) as u8, (i % 250 + 1) as u8)
}

/// Two endpoint addresses of Service `i` at `generation` (no pod answers
/// there: nobody sends traffic to churned Services).
fn churn_endpoints(i: usize, generation: u32) -> [Ipv4Addr; 2] {
    let g = (generation % 200) as u8;
    [
        Ipv4Addr::new(10, 250, (i / 250) as u8, (i % 250) as u8),
        Ipv4Addr::new(10, 251 + (i / 250 / 200) as u8, g, (i % 250) as u8),
    ]
}

fn service(name: &str, ip: &str, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "churn"},
        "spec": {
            "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
            "ports": [{"name": "http", "protocol": "TCP", "port": port, "targetPort": 8080}]
        }
    })
}

fn slice(service: &str, addresses: &[String]) -> Value {
    let endpoints: Vec<Value> = addresses
        .iter()
        .map(|a| {
            json!({
                "addresses": [a],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": NODE_NAME
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-x1"), "namespace": "churn",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "endpoints": endpoints
    })
}

fn node() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE_NAME},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}
    })
}

fn apply_churned(api: &FakeApiServer, i: usize, state: Churned) -> Result<()> {
    let name = format!("churn-{i}");
    api.apply(service(&name, &churn_ip(i).to_string(), state.port))?;
    let addrs: Vec<String> = churn_endpoints(i, state.generation)
        .iter()
        .map(ToString::to_string)
        .collect();
    api.apply(slice(&name, &addrs))?;
    Ok(())
}

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))
}

/// Whether the maps hold every churned Service as the API server last had
/// it, and the unchanged one.
fn converged(frontends: &[Frontend], churned: &[Churned]) -> bool {
    let stable: Vec<String> = {
        let mut v: Vec<String> = PODS
            .iter()
            .map(|i| format!("{}:8080", pod_ip(*i)))
            .collect();
        v.sort();
        v
    };
    let find = |ip: &str, port: u16| {
        frontends
            .iter()
            .find(|f| f.address == ip && f.port == port && f.protocol == "TCP")
            .map(Frontend::backend_addrs)
    };
    if find(CLUSTER_IP, 80) != Some(stable) || frontends.len() != churned.len() + 1 {
        return false;
    }
    churned.iter().enumerate().all(|(i, c)| {
        let mut want: Vec<String> = churn_endpoints(i, c.generation)
            .iter()
            .map(|a| format!("{a}:8080"))
            .collect();
        want.sort();
        find(&churn_ip(i).to_string(), c.port) == Some(want)
    })
}

/// Polls `switchboard services` until the maps hold the final state.
fn wait_converged(
    sb: &Sandbox,
    switchboard: &Path,
    churned: &[Churned],
    timeout: Duration,
) -> Result<()> {
    let end = Instant::now() + timeout;
    loop {
        let last = match sb.services(switchboard) {
            Ok(frontends) if converged(&frontends, churned) => return Ok(()),
            Ok(frontends) => format!("{} frontends", frontends.len()),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > end {
            bail!("the maps did not reach the API server's final state within {timeout:?} (last: {last})");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The fault phases of `--faults`, in order: (name, faults, cut watches).
fn fault_phases() -> Vec<(&'static str, Faults, bool)> {
    vec![
        (
            "500 for 30% of reads",
            Faults {
                fail_fraction: 0.3,
                ..Faults::default()
            },
            false,
        ),
        (
            "429 Retry-After 1 s",
            Faults {
                throttle_next: u64::MAX,
                retry_after: Duration::from_secs(1),
                ..Faults::default()
            },
            false,
        ),
        (
            "answers 1.5 s late",
            Faults {
                delay: Duration::from_millis(1500),
                ..Faults::default()
            },
            false,
        ),
        ("watches cut mid-event every 0.5 s", Faults::default(), true),
        (
            "silent watches",
            Faults {
                silent_watches: true,
                ..Faults::default()
            },
            false,
        ),
    ]
}

/// How long each fault phase lasts, and the clean gap after it.
const FAULT_PHASE: Duration = Duration::from_secs(6);
const FAULT_GAP: Duration = Duration::from_secs(6);
/// `--watch-timeout` under `--faults`: a silent watch is restarted after
/// 6.25 s.
const FAULT_WATCH_TIMEOUT: &str = "5";

pub fn run(opts: &ChurnOptions) -> Result<ChurnReport> {
    let mut sb = Sandbox::for_test()?;
    let result = run_in(&mut sb, opts);
    if let Err(e) = &result {
        eprintln!(
            "--- agent log (tail) ---\n{}",
            tail(&sb.read_log("agent"), 60)
        );
        eprintln!("churn run failed: {e:#}");
    }
    sb.cleanup()?;
    result
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn run_in(sb: &mut Sandbox, opts: &ChurnOptions) -> Result<ChurnReport> {
    sb.start_pods(&opts.sb_echo)?;
    let api = FakeApiServer::start_in_netns(Some(&sb.node_ns()), "127.0.0.1:0")?;
    api.apply(node())?;
    let stable_ips: Vec<String> = PODS.iter().map(|i| pod_ip(*i)).collect();
    api.apply(service("stable", CLUSTER_IP, 80))?;
    api.apply(slice("stable", &stable_ips))?;
    let mut churned = vec![
        Churned {
            port: 80,
            generation: 0
        };
        opts.services
    ];
    for (i, c) in churned.iter().enumerate() {
        apply_churned(&api, i, *c)?;
    }
    let kubeconfig = sb.dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let kc = kubeconfig.to_string_lossy().into_owned();
    let mut agent_args = vec!["--kubeconfig", kc.as_str(), "--node-name", NODE_NAME];
    if opts.faults {
        agent_args.extend(["--watch-timeout", FAULT_WATCH_TIMEOUT]);
    }
    sb.start_agent_from(&opts.switchboard, "cluster", &agent_args)?;
    sb.wait_services(
        &opts.switchboard,
        Duration::from_secs(120),
        "the initial sync",
        |f| converged(f, &churned),
    )?;
    let pid = sb.agent_pid().context("the agent's pid")?;
    let mut report = ChurnReport {
        services: opts.services,
        rss_start_kib: rss_kib(pid)?,
        ..ChurnReport::default()
    };

    let stop_traffic = AtomicBool::new(false);
    let sent = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let peak = AtomicU64::new(report.rss_start_kib);
    let curve = std::sync::Mutex::new(Vec::new());
    let churn_started = Instant::now();
    let sb_ref: &Sandbox = sb;
    let target = format!("{CLUSTER_IP}:80");
    let converged_after = std::thread::scope(|scope| -> Result<f64> {
        scope.spawn(|| {
            while !stop_traffic.load(Ordering::Relaxed) {
                match sb_ref.client(
                    &opts.sb_echo,
                    &["--tcp", &target, "--count", "50", "--timeout-ms", "1000"],
                ) {
                    Ok(run) => {
                        sent.fetch_add(run.attempts.len() as u64, Ordering::Relaxed);
                        failed.fetch_add(run.failures() as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        eprintln!("traffic client: {e:#}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        scope.spawn(|| {
            let mut next_point = Duration::ZERO;
            while !stop_traffic.load(Ordering::Relaxed) {
                if let Ok(kib) = rss_kib(pid) {
                    peak.fetch_max(kib, Ordering::Relaxed);
                    let at = churn_started.elapsed();
                    if at >= next_point {
                        next_point += CURVE_EVERY;
                        if let Ok(mut c) = curve.lock() {
                            c.push((at.as_secs_f64(), kib));
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let outcome = churn(&api, opts, &mut churned, pid, &mut report);
        let converge = outcome.and_then(|()| {
            let stopped = Instant::now();
            wait_converged(sb_ref, &opts.switchboard, &churned, Duration::from_secs(60))
                .map(|()| stopped.elapsed().as_secs_f64())
        });
        // A second of traffic on the converged maps, then stop.
        std::thread::sleep(Duration::from_secs(1));
        stop_traffic.store(true, Ordering::Relaxed);
        converge
    })?;
    report.converged_after_s = converged_after;
    report.requests_sent = sent.load(Ordering::Relaxed);
    report.requests_failed = failed.load(Ordering::Relaxed);
    // The end figure once the agent is idle again.
    std::thread::sleep(Duration::from_secs(1));
    report.rss_end_kib = rss_kib(pid)?;
    report.rss_peak_kib = peak.load(Ordering::Relaxed).max(report.rss_end_kib);
    report.rss_curve = curve.into_inner().unwrap_or_default();
    report
        .rss_curve
        .push((churn_started.elapsed().as_secs_f64(), report.rss_end_kib));
    let (ok, text) = verify(sb, &opts.switchboard)?;
    report.verify_ok = ok;
    report.verify_text = text;
    report.faults_injected = api.faults_injected();
    Ok(report)
}

/// Runs the warm-up and the churn at the set rate; notes the RSS after
/// the warm-up, and the faults of `--faults`.
fn churn(
    api: &FakeApiServer,
    opts: &ChurnOptions,
    churned: &mut [Churned],
    pid: u32,
    report: &mut ChurnReport,
) -> Result<()> {
    const TICK: Duration = Duration::from_millis(10);
    let started = Instant::now();
    let warm_until = started + opts.warmup;
    let end = warm_until + opts.churn;
    let mut warm_noted = false;
    let mut next = 0usize;
    let mut changes = 0u64;
    let phases = fault_phases();
    let mut phase: Option<usize> = None;
    let mut last_cut = Instant::now();
    while Instant::now() < end {
        let now = Instant::now();
        if !warm_noted && now >= warm_until {
            report.rss_warm_kib = rss_kib(pid)?;
            warm_noted = true;
        }
        if opts.faults && now >= warm_until {
            let cycle = FAULT_PHASE + FAULT_GAP;
            let into = now - warm_until;
            let index = (into.as_secs_f64() / cycle.as_secs_f64()) as usize % phases.len();
            let active = into.as_secs_f64() % cycle.as_secs_f64() < FAULT_PHASE.as_secs_f64();
            let want = active.then_some(index);
            if want != phase {
                match want {
                    Some(i) => {
                        api.set_faults(phases[i].1.clone());
                        api.drop_watches();
                        report.fault_phases.push(phases[i].0.to_owned());
                    }
                    None => api.clear_faults(),
                }
                phase = want;
            }
            if let Some(i) = phase {
                if phases[i].2 && last_cut.elapsed() >= Duration::from_millis(500) {
                    api.cut_watches_mid_event();
                    last_cut = Instant::now();
                }
            }
        }
        // Catch up with the rate since the start (a late tick makes up).
        let due = (f64::from(opts.rate) * started.elapsed().as_secs_f64()) as u64;
        while changes < due {
            let i = next % churned.len();
            let c = &mut churned[i];
            let name = format!("churn-{i}");
            if changes % 4 == 3 {
                c.port = if c.port == 80 { 81 } else { 80 };
                api.apply(service(&name, &churn_ip(i).to_string(), c.port))?;
            } else {
                c.generation += 1;
                let addrs: Vec<String> = churn_endpoints(i, c.generation)
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                api.apply(slice(&name, &addrs))?;
            }
            changes += 1;
            next += 1;
        }
        let spent = started.elapsed();
        let ticks = (spent.as_nanos() / TICK.as_nanos()) as u32 + 1;
        if let Some(wait) = (TICK * ticks).checked_sub(spent) {
            std::thread::sleep(wait);
        }
    }
    api.clear_faults();
    let elapsed = started.elapsed().as_secs_f64();
    report.changes = changes;
    report.churn_s = elapsed;
    report.rate_achieved = changes as f64 / elapsed;
    if !warm_noted {
        report.rss_warm_kib = rss_kib(pid)?;
    }
    Ok(())
}

/// `switchboard verify` in the node namespace: (passed, output).
pub fn verify(sb: &Sandbox, switchboard: &Path) -> Result<(bool, String)> {
    let bin = switchboard.to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb.exec_status(&sb.node_ns(), &[&bin, "verify", "--pin-root", &pin])?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match out.status.code() {
        Some(0) => Ok((true, text)),
        Some(1) => Ok((false, text)),
        _ => bail!("switchboard verify: {}: {text}", out.status),
    }
}
