//! End to end: every path of [`PATHS`] over four sandboxes (direct,
//! switchboard, iptables, nftables), measured in interleaved rounds at each
//! Services count, then (at the largest) in paired phases ([`paired`]) and,
//! in a full run, with the kernel's BPF run-time statistics on
//! ([`progtime`]).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;

use super::agent::{start_agent, wait_synced, write_manifests};
use super::clients::{self, Bulk, Udp, Wrk};
use super::fmt::fmt_opt;
use super::paths::{E2ePath, Setup, Target, Workload, PATHS, SPREAD_IP};
use super::plan::Plan;
use super::profile::{CpuUse, Profile};
use super::progress::{note, progress};
use super::results::{
    self, ConnMedians, Datapath, E2eMedians, E2eRow, Growth, Paired, PathInfo, ProgTimeRow,
    Programming, UdpMedians,
};
use super::stats::median_by;
use super::{kubeproxy, paired, progtime, workload};
use crate::sandbox::{self, Sandbox};
use crate::util::run_capture;

/// What [`run`] measured.
pub struct E2e {
    pub paths: Vec<PathInfo>,
    pub rows: Vec<E2eRow>,
    pub programming: Vec<Programming>,
    /// [`program_time`] of each switchboard path and size.
    pub prog_time: Vec<ProgTimeRow>,
    /// [`paired::run`] at the largest size (none when not run).
    pub paired: Option<Paired>,
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
pub fn run(plan: &Plan, sb_http: &Path, switchboard: &Path, dir: &Path) -> Result<E2e> {
    progress(&format!(
        "end to end: four sandboxes (direct, switchboard, iptables, nftables) with three sb-http pods each; {} paths",
        PATHS.len()
    ));
    let mut sbs = Sandboxes::new(sb_http)?;
    let max = *plan.e2e_sizes.iter().max().unwrap_or(&1);
    let mut out = E2e {
        paths: PATHS.iter().map(path_info).collect(),
        rows: Vec::new(),
        programming: Vec::new(),
        prog_time: Vec::new(),
        paired: None,
    };
    for &n in &plan.e2e_sizes {
        let programmed = sbs.program(n, max, switchboard, plan.quick, dir)?;
        if n == max {
            out.programming = programmed.programming();
        }
        let runs = rounds(&sbs, plan, n, sb_http, switchboard)?;
        if n == max {
            out.paired = paired::run(plan, n, |path| sbs.of(path))?;
        }
        if !plan.quick {
            progress(&format!(
                "end to end at {n} Services: switchboard's programs per connection (BPF run-time statistics)"
            ));
            for path in PATHS.iter().filter(|p| p.setup == Setup::Switchboard) {
                if plan.measures(path.key) {
                    out.prog_time.push(program_time(&sbs.sw, path, n, plan)?);
                }
            }
        }
        for (path, r) in PATHS.iter().zip(&runs) {
            out.rows.push(row(path, n, r, &programmed));
        }
    }
    sbs.cleanup()?;
    Ok(out)
}

/// The four sandboxes, alive at once, three sb-http pods in each.
struct Sandboxes {
    direct: Sandbox,
    sw: Sandbox,
    ipt: Sandbox,
    nft: Sandbox,
    /// Whether `sw`'s agent runs (it starts at the first size).
    agent_started: bool,
}

/// The seconds each setup took to program one size.
struct Programmed {
    services: u32,
    agent_s: f64,
    iptables_s: f64,
    nftables_s: f64,
}

impl Programmed {
    /// The programming rows of the report (the largest size's).
    fn programming(&self) -> Vec<Programming> {
        [
            (RuleSet::Iptables.load_command(), self.iptables_s),
            (RuleSet::Nftables.load_command(), self.nftables_s),
            (
                "switchboard agent (YAML written → maps synced)",
                self.agent_s,
            ),
        ]
        .into_iter()
        .map(|(tool, seconds)| Programming {
            tool: tool.into(),
            services: self.services.into(),
            seconds,
        })
        .collect()
    }
}

impl Sandboxes {
    fn new(sb_http: &Path) -> Result<Sandboxes> {
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
        Ok(Sandboxes {
            direct,
            sw,
            ipt,
            nft,
            agent_started: false,
        })
    }

    /// The sandbox `path` runs in.
    fn of(&self, path: &E2ePath) -> &Sandbox {
        match path.setup {
            Setup::Direct => &self.direct,
            Setup::Switchboard => &self.sw,
            Setup::Iptables => &self.ipt,
            Setup::Nftables => &self.nft,
        }
    }

    /// Programs `n` Services into switchboard (its agent follows its
    /// manifest directory; started at the first size with room for `max`),
    /// iptables and nftables; the time each took. A full run keeps the
    /// head of the largest size's rule files in `dir`.
    fn program(
        &mut self,
        n: u32,
        max: u32,
        switchboard: &Path,
        quick: bool,
        dir: &Path,
    ) -> Result<Programmed> {
        progress(&format!(
            "end to end at {n} Services: programming switchboard, iptables, nftables"
        ));
        let skip = self.sw.agent_log().len();
        let t0 = Instant::now();
        let frontends = write_manifests(
            &self.sw,
            &workload::e2e_services(n, &workload::pod_ips()),
            workload::Style::Block,
        )?;
        if !self.agent_started {
            start_agent(&mut self.sw, switchboard, max)?;
            self.agent_started = true;
        }
        let synced = wait_synced(&mut self.sw, frontends, skip, Duration::from_secs(300))?;
        let agent_s = (synced - t0).as_secs_f64();
        note(&format!("switchboard agent: {frontends} frontends programmed {agent_s:.2} s after the manifests were written"));
        let mut seconds = [0.0; 2];
        for (k, (set, sb)) in [
            (RuleSet::Iptables, &self.ipt),
            (RuleSet::Nftables, &self.nft),
        ]
        .into_iter()
        .enumerate()
        {
            let services = workload::e2e_services(n, &workload::pod_ips());
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
            seconds[k] = secs;
            if n == max && !quick {
                let head: String = text.lines().take(80).collect::<Vec<_>>().join("\n");
                fs::write(
                    dir.join(format!("{}-rules-head.txt", set.name())),
                    head + "\n",
                )?;
            }
        }
        Ok(Programmed {
            services: n,
            agent_s,
            iptables_s: seconds[0],
            nftables_s: seconds[1],
        })
    }

    /// Stops the agent and removes the four sandboxes.
    fn cleanup(self) -> Result<()> {
        let Sandboxes {
            direct,
            mut sw,
            ipt,
            nft,
            agent_started,
        } = self;
        if agent_started {
            sw.stop_agent()?;
        }
        let mut errors = Vec::new();
        for mut sb in [direct, sw, ipt, nft] {
            if let Err(e) = sb.cleanup() {
                errors.push(format!("{e:#}"));
            }
        }
        ensure!(errors.is_empty(), "cleanup: {}", errors.join("; "));
        Ok(())
    }
}

/// Every path the plan measures, in [`Plan::rounds_at`] interleaved
/// rounds at `n` Services, a different path first in each round: each
/// path's measurements, in [`PATHS`]' order.
fn rounds(
    sbs: &Sandboxes,
    plan: &Plan,
    n: u32,
    sb_http: &Path,
    switchboard: &Path,
) -> Result<Vec<Vec<Measurement>>> {
    let mut runs: Vec<Vec<Measurement>> = PATHS.iter().map(|_| Vec::new()).collect();
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
            let sb = sbs.of(path);
            path.prepare(sb)?;
            let read = || sb_counters(sb, switchboard);
            let counters = (path.setup == Setup::Switchboard).then_some(&read as CounterRead);
            runs[i].push(measure(sb, path, sb_http, plan, counters)?);
        }
    }
    Ok(runs)
}

/// `path`'s row at `n` Services, from its rounds.
fn row(path: &E2ePath, n: u32, r: &[Measurement], programmed: &Programmed) -> E2eRow {
    let m = medians(r);
    note(&format!(
        "{} at {n} Services: median {} conn/s over {} rounds {:.0?}",
        path.label,
        fmt_opt(m.conn_per_s, 0),
        r.len(),
        m.conn_per_s_rounds
    ));
    E2eRow {
        path: path.key.into(),
        label: Some(path.label.into()),
        services: Some(n.into()),
        m,
        program_s: match path.setup {
            Setup::Direct => None,
            Setup::Switchboard => Some(programmed.agent_s),
            Setup::Iptables => Some(programmed.iptables_s),
            Setup::Nftables => Some(programmed.nftables_s),
        },
    }
}

/// How the report describes `p`.
fn path_info(p: &E2ePath) -> PathInfo {
    PathInfo {
        path: p.key.into(),
        label: p.label.into(),
        sandbox: p.setup.tag().into(),
        client: p.client.describe().into(),
        target: p.target.describe(),
        balancer: p.balancer.into(),
        client_local_ports: p.local_ports.map(Into::into),
    }
}

/// A path's figures over its rounds: medians, and every round's conn/s.
fn medians(r: &[Measurement]) -> E2eMedians {
    let light = conn_medians(r, |m| &m.light);
    E2eMedians {
        conn_per_s: median_by(r, |m| Some(m.conn.wrk.rps)),
        p50_us: median_by(r, |m| Some(m.conn.wrk.p50_us)),
        p99_us: median_by(r, |m| Some(m.conn.wrk.p99_us)),
        errors: r.iter().map(|m| m.conn.wrk.errors).sum(),
        udp: UdpMedians {
            rate: median_by(r, |m| m.udp.map(|u| u.rate)),
            p50_us: median_by(r, |m| m.udp.map(|u| u.p50_us)),
            p99_us: median_by(r, |m| m.udp.map(|u| u.p99_us)),
        },
        bulk: results::Bulk {
            gbit_s: median_by(r, |m| Some(m.bulk.gbit_s)),
        },
        conn_per_s_rounds: r.iter().map(|m| m.conn.wrk.rps).collect(),
        conn_per_s_clients_rounds: r.iter().map(|m| m.conn.wrk.per_client.clone()).collect(),
        datapath_rounds: r.iter().filter_map(|m| m.datapath).collect(),
        busy_us_per_conn: median_by(r, |m| Some(m.conn.busy_us_per_conn())),
        light: (!r.is_empty()).then_some(light),
    }
}

/// The medians of one workload's wrk phase over the rounds.
fn conn_medians(r: &[Measurement], phase: fn(&Measurement) -> &ConnPhase) -> ConnMedians {
    ConnMedians {
        conn_per_s: median_by(r, |m| Some(phase(m).wrk.rps)),
        p50_us: median_by(r, |m| Some(phase(m).wrk.p50_us)),
        p99_us: median_by(r, |m| Some(phase(m).wrk.p99_us)),
        errors: r.iter().map(|m| phase(m).wrk.errors).sum(),
        busy_us_per_conn: median_by(r, |m| Some(phase(m).busy_us_per_conn())),
        conn_per_s_rounds: r.iter().map(|m| phase(m).wrk.rps).collect(),
        conn_per_s_clients_rounds: r.iter().map(|m| phase(m).wrk.per_client.clone()).collect(),
    }
}

/// Three sb-http pods in `sb`, each answering UDP from the client.
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
                "--light",
                &workload::POD_LIGHT_PORT.to_string(),
            ],
        )?;
    }
    // Each pod answers UDP on its own address from the client.
    for ip in workload::pod_ips() {
        let addr = format!("{ip}:{}", workload::POD_UDP_PORT);
        wait_udp(sb, sb_http, &addr)?;
    }
    Ok(())
}

fn wait_udp(sb: &Sandbox, sb_http: &Path, addr: &str) -> Result<()> {
    #[derive(Deserialize)]
    struct Answered {
        requests: u64,
    }
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
        let answered = serde_json::from_slice::<Answered>(&out.stdout).map_or(0, |a| a.requests);
        if answered > 0 {
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

/// One path measured once: wrk, the UDP clients (none on the spread path),
/// the stream and wrk against the light server; on switchboard's paths,
/// its counters' growth.
struct Measurement {
    conn: ConnPhase,
    udp: Option<Udp>,
    bulk: Bulk,
    light: ConnPhase,
    datapath: Option<Datapath>,
}

/// One wrk phase: what wrk saw, the machine's CPU over it, and
/// switchboard's counters' growth.
struct ConnPhase {
    wrk: Wrk,
    cpu: CpuUse,
    growth: Option<Growth>,
}

impl ConnPhase {
    /// The machine's busy CPU per connection (µs).
    fn busy_us_per_conn(&self) -> f64 {
        self.cpu.busy_secs() * 1e6 / self.wrk.requests.max(1) as f64
    }
}

/// switchboard's counters, read between the phases of a measurement.
type CounterRead<'a> = &'a dyn Fn() -> Result<Counters>;

/// One wrk phase of `path` against `workload`'s server (after a warm-up
/// second in a full run), its CPU and, with `counters`, its counters'
/// growth, checked against the path's label ([`check_datapath`]).
fn conn_phase(
    sb: &Sandbox,
    path: &E2ePath,
    workload: Workload,
    plan: &Plan,
    counters: Option<CounterRead>,
) -> Result<ConnPhase> {
    let urls = path.urls(workload);
    if !plan.quick {
        clients::wrk(sb, path.client, &urls, 1)?; // warm-up (neighbours, caches, conntrack)
    }
    let c0 = counters.map(|read| read()).transpose()?;
    let agent = (path.setup == Setup::Switchboard)
        .then(|| sb.agent_pid())
        .flatten();
    let cpu0 = CpuUse::read(agent)?;
    let key = match workload {
        Workload::Default => path.key.to_owned(),
        Workload::Light => format!("{}-light", path.key),
    };
    let profile = Profile::start(&key, plan.wrk_secs)?;
    let wrk = clients::wrk(sb, path.client, &urls, plan.wrk_secs)?;
    let cpu = CpuUse::read(agent)?.since(&cpu0);
    profile.finish()?;
    let c1 = counters.map(|read| read()).transpose()?;
    let growth = c0.zip(c1).map(|(c0, c1)| c1.since(&c0));
    if let Some(growth) = &growth {
        check_datapath(path, growth, wrk.requests)?;
    }
    Ok(ConnPhase { wrk, cpu, growth })
}

/// Everything measured over one path at one size: three wrk clients, three
/// UDP clients, one TCP stream (to the first address), three wrk clients
/// against the light server. With `counters`, the growth of switchboard's
/// counters over each phase goes into `datapath`, and each wrk phase is
/// checked against the path's label ([`check_datapath`]).
fn measure(
    sb: &Sandbox,
    path: &E2ePath,
    sb_http: &Path,
    plan: &Plan,
    counters: Option<CounterRead>,
) -> Result<Measurement> {
    let snap = || counters.map(|read| read()).transpose();
    let bin = sb_http.to_string_lossy().into_owned();
    let hosts = path.target.hosts();
    let ports = path.target.ports();
    let w = conn_phase(sb, path, Workload::Default, plan, counters)?;
    let c1 = snap()?;
    // The pods' UDP echo answers from its own address, not from the shared
    // one a spread client sent to: no UDP there.
    let udp = match path.target {
        Target::Spread => None,
        _ => {
            let addrs: Vec<String> = hosts.iter().map(|h| format!("{h}:{}", ports.udp)).collect();
            Some(clients::udp(sb, path.client, &bin, &addrs, plan.udp_ms)?)
        }
    };
    let c2 = snap()?;
    let bulk_addr = format!("{}:{}", hosts[0], ports.bulk);
    let bulk = clients::bulk(sb, path.client, &bin, &bulk_addr, plan.bulk_ms)?;
    let c3 = snap()?;
    let light = conn_phase(sb, path, Workload::Light, plan, counters)?;
    let datapath = match (w.growth, c1, c2, c3) {
        (Some(http), Some(c1), Some(c2), Some(c3)) => Some(Datapath {
            http,
            udp: c2.since(&c1),
            bulk: c3.since(&c2),
            light: light.growth,
        }),
        _ => None,
    };
    let clients = |w: &Wrk| -> String {
        w.per_client
            .iter()
            .map(|r| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    note(&format!(
        "{:.0} conn/s ({}; p50 {:.0} us, p99 {:.0} us, {} errors; CPU {}, {:.0} us busy per connection); UDP {:.0} req/s (p99 {} us); one TCP stream {:.2} Gbit/s",
        w.wrk.rps,
        clients(&w.wrk),
        w.wrk.p50_us,
        w.wrk.p99_us,
        w.wrk.errors,
        w.cpu.describe(),
        w.busy_us_per_conn(),
        udp.map_or(0.0, |u| u.rate),
        fmt_opt(udp.map(|u| u.p99_us), 0),
        bulk.gbit_s
    ));
    note(&format!(
        "light: {:.0} conn/s ({}; p50 {:.0} us, p99 {:.0} us, {} errors; CPU {}, {:.0} us busy per connection)",
        light.wrk.rps,
        clients(&light.wrk),
        light.wrk.p50_us,
        light.wrk.p99_us,
        light.wrk.errors,
        light.cpu.describe(),
        light.busy_us_per_conn(),
    ));
    Ok(Measurement {
        conn: w,
        udp,
        bulk,
        light,
        datapath,
    })
}

/// switchboard's global data-path counters, the ones a row's check reads.
#[derive(Debug, Default, Deserialize)]
struct Counters {
    #[serde(default)]
    forwarded: u64,
    #[serde(default)]
    sock_connect: u64,
    #[serde(default)]
    sock_sendmsg: u64,
}

impl Counters {
    /// How much the counters grew since `before`.
    fn since(&self, before: &Counters) -> Growth {
        Growth {
            tc_forwarded: self.forwarded.saturating_sub(before.forwarded),
            sock_connect: self.sock_connect.saturating_sub(before.sock_connect),
            sock_sendmsg: self.sock_sendmsg.saturating_sub(before.sock_sendmsg),
        }
    }
}

/// switchboard's global data-path counters (`switchboard stats -o json`).
fn sb_counters(sb: &Sandbox, switchboard: &Path) -> Result<Counters> {
    #[derive(Deserialize)]
    struct Stats {
        counters: Counters,
    }
    let bin = switchboard.to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb.exec(
        &sb.node_ns(),
        &[&bin, "stats", "--pin-root", &pin, "-o", "json"],
    )?;
    let stats: Stats =
        serde_json::from_slice(&out.stdout).context("`switchboard stats -o json`")?;
    Ok(stats.counters)
}

/// Checks, from the counters' growth over the wrk phase, that a switchboard
/// row measured the data path it is labelled with: the socket layer gave
/// every connection its backend and tc rewrote nothing, or the reverse.
fn check_datapath(path: &E2ePath, http: &Growth, requests: u64) -> Result<()> {
    let forwarded = http.tc_forwarded;
    let connects = http.sock_connect;
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

/// One wrk phase of `path` with the kernel's BPF run-time statistics on:
/// switchboard's programs' time per connection ([`progtime`]).
fn program_time(sb: &Sandbox, path: &E2ePath, n: u32, plan: &Plan) -> Result<ProgTimeRow> {
    path.prepare(sb)?;
    let stats = progtime::Stats::enable()?;
    let before = progtime::snapshot()?;
    let cpu0 = CpuUse::read(None)?;
    let w = clients::wrk(
        sb,
        path.client,
        &path.urls(Workload::Default),
        plan.wrk_secs,
    )?;
    let cpu = CpuUse::read(None)?.since(&cpu0);
    let after = progtime::snapshot()?;
    drop(stats);
    let time = progtime::per_connection(&before, &after, w.requests, cpu.busy_secs());
    note(&format!(
        "{}: {:.0} conn/s with the statistics on; switchboard's programs {:.2} us per connection of {:.1} us busy CPU ({:.1} %)",
        path.label,
        w.rps,
        time.programs_ns_per_conn / 1000.0,
        time.busy_ns_per_conn / 1000.0,
        time.share * 100.0
    ));
    Ok(ProgTimeRow {
        path: path.key.into(),
        label: path.label.into(),
        services: n.into(),
        conn_per_s: w.rps,
        time,
    })
}

/// The kube-proxy-style rule sets the NAT rows run under.
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
