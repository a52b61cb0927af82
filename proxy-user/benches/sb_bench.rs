//! switchboard's in-process benchmarks (`harness = false`). `cargo xtask bench`
//! builds this with `cargo bench --no-run` and runs the executable as root,
//! inside the sandbox's node namespace where a mode needs interfaces.
//!
//! ```text
//! sb_bench perpacket [--quick]                    per-packet cost, BPF_PROG_TEST_RUN
//! sb_bench sync [--quick]                         control plane: model + map sync
//! sb_bench fwd --ingress IF --pod IF:NS:IP ...    forwarding pps with XDP live frames
//! sb_bench ... --out FILE                          JSON to FILE instead of stdout
//! ```
//!
//! Every figure printed is measured in this run; nothing is estimated. What
//! cannot be measured yet (XDP data path: switchboard has no XDP program) is
//! reported as `null` with a note.
//!
//! ## How per-packet cost is measured, and why the ping-pong
//! `BPF_PROG_TEST_RUN` with `repeat` runs the program `repeat` times on the
//! *same* skb and reports the average time per run (`bpf_test_timer`:
//! time spent ÷ repetitions, in ns). A DNAT program rewrites that skb on the
//! first run, so from the second run on it would see the backend address and
//! measure the pass-through path instead. So the "existing flow" cases use two
//! Services that name each other as backend (A = 10.96.0.10:80 → B's address,
//! B = 10.96.0.11:80 → A's address) with both flows already tracked: every
//! repetition is a full frontend lookup, conntrack hit and rewrite with checksum
//! updates, alternately to B and to A. The global `forwarded`/`reversed`
//! counters are checked to grow by exactly `repeat`, so this is proven, not
//! assumed.
//!
//! A *new* flow cannot be repeated (the first run creates the conntrack entry),
//! so new flows are measured with `repeat = 1` on a fresh source port per call,
//! and reported as the median of many calls next to the same single-shot
//! measurement of the existing flow and of the empty program: single-shot
//! figures carry the kernel timer's own overhead (two clock reads), so compare
//! them only with each other.
use std::{
    collections::BTreeMap,
    fs,
    net::Ipv4Addr,
    os::fd::AsFd as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, ensure, Context as _, Result};
use aya::{
    maps::{HashMap as AyaHashMap, IterableMap as _, Map, MapData},
    programs::{
        tc::{NlOptions, TcAttachOptions},
        LinkOrder, SchedClassifier, TcAttachType, TestRun as _, TestRunAttrs, TestRunOptions, Xdp,
    },
    Ebpf, EbpfLoader,
};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use proxy_common::{ct_dir, programs, proto, CtEntry, CtKey};
use proxy_user::{
    ebpf::{self, Capacities},
    maps::{MapStore as _, PinnedMaps},
    model::{self, BackendAddr, DesiredState, Frontend, FrontendAddr, Protocol, ServicePortName},
    packet::PacketSpec,
    sync::{frontend_key, Syncer},
};
use serde_json::{json, Value};

/// The benchmark floor: proxy-ebpf's `sb-empty` bin (empty tc and XDP programs).
static EMPTY_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sb-empty"));

const TC_ACT_OK: u32 = 0;
const TC_ACT_UNSPEC: u32 = u32::MAX;

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
const VIP_A: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const VIP_B: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
const VIP_SELF: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 12);
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const CLIENT_PORT: u16 = 40000;
/// Frame size of every per-packet case: 14 + 20 + 20 + 20 bytes, the size of a
/// TCP SYN with the usual 20 bytes of options (what BRIEF.md's floor used).
const FRAME_PAYLOAD: usize = 20;

struct Args {
    mode: String,
    quick: bool,
    out: Option<PathBuf>,
    rest: Vec<String>,
}

fn parse_args() -> Result<Args> {
    // `cargo bench` passes `--bench`; ignore it.
    let raw: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mut mode = None;
    let mut quick = false;
    let mut out = None;
    let mut rest = Vec::new();
    let mut it = raw.into_iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--out" => {
                out = Some(PathBuf::from(
                    it.next().ok_or_else(|| anyhow!("--out needs a path"))?,
                ))
            }
            "perpacket" | "sync" | "fwd" if mode.is_none() => mode = Some(arg),
            _ => rest.push(arg),
        }
    }
    // A bare `cargo bench` (or `cargo test --benches`): say how to run it,
    // measure nothing, and do not fail the workspace command.
    Ok(Args {
        mode: mode.unwrap_or_default(),
        quick,
        out,
        rest,
    })
}

fn main() -> Result<()> {
    let args = parse_args()?;
    if args.mode.is_empty() {
        eprintln!(
            "sb_bench: nothing measured. Usage: sb_bench (perpacket | sync | fwd ...) [--quick] [--out FILE], as root; `cargo xtask bench` runs all of them"
        );
        return Ok(());
    }
    ensure!(
        unsafe { libc::geteuid() } == 0,
        "sb_bench loads eBPF programs: run it as root (`cargo xtask bench` does)"
    );
    ensure!(
        !EMPTY_OBJECT.is_empty(),
        "this build has no eBPF objects (bpf-linker was missing): run `cargo xtask setup` and rebuild"
    );
    let result = match args.mode.as_str() {
        "perpacket" => perpacket(args.quick)?,
        "sync" => sync_bench(args.quick)?,
        "fwd" => fwd(&args.rest)?,
        other => bail!("unknown mode {other}"),
    };
    let text = serde_json::to_string_pretty(&result)?;
    match args.out {
        Some(path) => {
            fs::write(&path, text).with_context(|| format!("write {}", path.display()))?
        }
        None => println!("{text}"),
    }
    Ok(())
}

fn progress(msg: &str) {
    eprintln!("sb_bench: {msg}");
}

// ---------------------------------------------------------------------------
// Helpers shared by the modes
// ---------------------------------------------------------------------------

fn frontend(ip: Ipv4Addr, port: u16, name: &str, backends: Vec<BackendAddr>) -> Frontend {
    Frontend::cluster_ip(
        FrontendAddr {
            ip,
            port,
            protocol: Protocol::Tcp,
        },
        ServicePortName {
            namespace: "bench".into(),
            name: name.into(),
            port: String::new(),
        },
        backends,
    )
}

fn nth_ip(base: Ipv4Addr, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + n)
}

fn tc<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing"))?
        .try_into()
        .map_err(|e| anyhow!("{name} is not a tc program: {e}"))
}

fn xdp<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing"))?
        .try_into()
        .map_err(|e| anyhow!("{name} is not an XDP program: {e}"))
}

fn load_empty() -> Result<Ebpf> {
    let mut ebpf = EbpfLoader::new()
        .load(EMPTY_OBJECT)
        .context("loading sb-empty")?;
    tc(&mut ebpf, "sb_empty_tc")?
        .load()
        .context("loading sb_empty_tc")?;
    xdp(&mut ebpf, "sb_empty_xdp")?
        .load()
        .context("loading sb_empty_xdp")?;
    xdp(&mut ebpf, "sb_sink_xdp")?
        .load()
        .context("loading sb_sink_xdp")?;
    xdp(&mut ebpf, "sb_gen_xdp")?
        .load()
        .context("loading sb_gen_xdp")?;
    Ok(ebpf)
}

/// One `repeat` run: (return value, kernel-reported ns per repetition).
fn run_repeat(prog: &SchedClassifier, frame: &[u8], repeat: u32) -> Result<(u32, f64)> {
    let mut out = vec![0u8; frame.len() + 256];
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::default()
        })
        .context("BPF_PROG_TEST_RUN")?;
    Ok((r.return_value, r.duration.as_nanos() as f64))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn stat(maps: &PinnedMaps, name: &str) -> u64 {
    maps.global_stats()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v)
}

// ---------------------------------------------------------------------------
// perpacket
// ---------------------------------------------------------------------------

struct PerPacket {
    ebpf: Ebpf,
    syncer: Syncer<PinnedMaps>,
    conntrack: AyaHashMap<MapData, CtKey, CtEntry>,
}

fn frame_tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, flags: u8) -> Vec<u8> {
    let spec = PacketSpec {
        payload: vec![0u8; FRAME_PAYLOAD],
        tcp_flags: flags,
        ..PacketSpec::tcp(src, sport, dst, dport)
    };
    spec.build()
}

/// Desired state: the ping-pong pair A ⇄ B (A with `target_backends` backends:
/// B's address first, then dummies), a self-loop service (diagnostic) and
/// `services - 3` filler services with one backend each.
fn perpacket_state(services: u32, target_backends: u32) -> DesiredState {
    let mut a_backends = vec![BackendAddr {
        ip: VIP_B,
        port: 80,
    }];
    for j in 1..target_backends {
        a_backends.push(BackendAddr {
            ip: nth_ip(Ipv4Addr::new(10, 210, 0, 0), j),
            port: 8080,
        });
    }
    let mut frontends = vec![
        frontend(VIP_A, 80, "a", a_backends),
        frontend(
            VIP_B,
            80,
            "b",
            vec![BackendAddr {
                ip: VIP_A,
                port: 80,
            }],
        ),
        // Diagnostic: a service whose only backend is itself, so the rewrite
        // helpers are skipped (old == new): lookups and conntrack without the
        // packet rewrite.
        frontend(
            VIP_SELF,
            80,
            "self",
            vec![BackendAddr {
                ip: VIP_SELF,
                port: 80,
            }],
        ),
    ];
    for i in 0..services.saturating_sub(3) {
        frontends.push(frontend(
            nth_ip(Ipv4Addr::new(10, 100, 0, 0), i),
            80,
            &format!("fill-{i}"),
            vec![BackendAddr {
                ip: nth_ip(Ipv4Addr::new(10, 200, 0, 0), i),
                port: 8080,
            }],
        ));
    }
    DesiredState {
        frontends: frontends.into_iter().map(|f| (f.addr, f)).collect(),
    }
}

impl PerPacket {
    fn new(caps: Capacities) -> Result<Self> {
        let mut ebpf = ebpf::load_unpinned(&caps).context("loading switchboard's object")?;
        let maps = PinnedMaps::take(&mut ebpf)?;
        let fd = maps
            .conntrack
            .map()
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .context("dup conntrack fd")?;
        let conntrack: AyaHashMap<MapData, CtKey, CtEntry> =
            Map::from_map_data(MapData::from_fd(fd)?)?.try_into()?;
        let syncer = Syncer::adopt(maps, caps);
        Ok(Self {
            ebpf,
            syncer,
            conntrack,
        })
    }

    fn apply(&mut self, desired: &DesiredState) -> Result<Duration> {
        let started = Instant::now();
        let report = self.syncer.apply(desired);
        let took = started.elapsed();
        ensure!(
            report.failed.is_empty(),
            "sync failed: {:?}",
            report.failed.first()
        );
        Ok(took)
    }

    fn ids(&self, vip: Ipv4Addr, backend: Ipv4Addr, backend_port: u16) -> Result<(u32, u32)> {
        let dump = self.syncer.store().dump();
        let key = frontend_key(
            &FrontendAddr {
                ip: vip,
                port: 80,
                protocol: Protocol::Tcp,
            },
            0,
        );
        let service_id = dump
            .frontends
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.service_id)
            .ok_or_else(|| anyhow!("frontend {vip} missing"))?;
        let want = (u32::from_ne_bytes(backend.octets()), backend_port.to_be());
        let backend_id = dump
            .backends
            .iter()
            .find(|(_, b)| (b.addr_be, b.port_be) == want)
            .map(|(id, _)| *id)
            .ok_or_else(|| anyhow!("backend {backend} missing"))?;
        Ok((service_id, backend_id))
    }

    /// Tracks the two ping-pong flows (client → A picked B, client → B picked
    /// A), both directions, as the data path itself would have.
    fn seed_pingpong(&mut self) -> Result<()> {
        let (svc_a, be_b) = self.ids(VIP_A, VIP_B, 80)?;
        let (svc_b, be_a) = self.ids(VIP_B, VIP_A, 80)?;
        let addr = |ip: Ipv4Addr| u32::from_ne_bytes(ip.octets());
        for (vip, other, service_id, backend_id) in
            [(VIP_A, VIP_B, svc_a, be_b), (VIP_B, VIP_A, svc_b, be_a)]
        {
            let entry = CtEntry {
                backend_id,
                service_id,
                nat_addr_be: addr(other),
                nat_port_be: 80u16.to_be(),
                ..CtEntry::default()
            };
            // The reply entry carries the frontend the reply must come from.
            let reply_entry = CtEntry {
                nat_addr_be: addr(vip),
                ..entry
            };
            let fwd = CtKey {
                saddr_be: addr(CLIENT),
                daddr_be: addr(vip),
                sport_be: CLIENT_PORT.to_be(),
                dport_be: 80u16.to_be(),
                proto: proto::TCP,
                dir: ct_dir::FORWARD,
                _pad: [0; 2],
            };
            let reply = CtKey {
                saddr_be: addr(other),
                daddr_be: addr(CLIENT),
                sport_be: 80u16.to_be(),
                dport_be: CLIENT_PORT.to_be(),
                proto: proto::TCP,
                dir: ct_dir::REPLY,
                _pad: [0; 2],
            };
            self.conntrack.insert(fwd, entry, 0)?;
            self.conntrack.insert(reply, reply_entry, 0)?;
        }
        Ok(())
    }
}

/// Runs `frame` through `prog` `rounds` times with `repeat`; checks the verdict
/// and (if given) that the global counter `counter` grew by exactly
/// `rounds × repeat`. Returns the median ns per packet.
fn measure_repeat(
    pp: &mut PerPacket,
    program: &str,
    frame: &[u8],
    verdict: u32,
    counter: Option<&str>,
    repeat: u32,
    rounds: usize,
) -> Result<f64> {
    let before = counter.map(|c| stat(pp.syncer.store(), c));
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let prog = tc(&mut pp.ebpf, program)?;
        let (ret, ns) = run_repeat(prog, frame, repeat)?;
        ensure!(
            ret == verdict,
            "{program}: verdict {ret:#x}, expected {verdict:#x}"
        );
        samples.push(ns);
    }
    if let (Some(c), Some(before)) = (counter, before) {
        let grew = stat(pp.syncer.store(), c) - before;
        ensure!(
            grew == repeat as u64 * rounds as u64,
            "{program}: counter {c} grew by {grew}, expected {} — the measured path is not the one intended",
            repeat as u64 * rounds as u64
        );
    }
    Ok(median(&mut samples))
}

/// Median kernel-timed ns of `repeat = 1` runs, one frame per call.
fn measure_single(
    prog: &SchedClassifier,
    frames: impl Iterator<Item = Vec<u8>>,
    verdict: u32,
) -> Result<f64> {
    let mut samples = Vec::new();
    for frame in frames {
        let (ret, ns) = run_repeat(prog, &frame, 1)?;
        ensure!(
            ret == verdict,
            "single-shot verdict {ret:#x}, expected {verdict:#x}"
        );
        samples.push(ns);
    }
    Ok(median(&mut samples))
}

fn perpacket(quick: bool) -> Result<Value> {
    let sizes: &[u32] = if quick {
        &[1, 10_000]
    } else {
        &[1, 1_000, 10_000, 100_000]
    };
    let backend_counts: &[u32] = &[1, 1000];
    let repeat: u32 = if quick { 200_000 } else { 2_000_000 };
    let rounds = if quick { 3 } else { 5 };
    let singles: u32 = if quick { 500 } else { 3000 };
    let max = *sizes.iter().max().unwrap_or(&1);
    // Fixed capacities for every size, as an agent has: only the number of
    // entries changes between rows.
    let caps = Capacities {
        frontends: (2 * max + 4096).next_power_of_two(),
        backends: (max + 4096).next_power_of_two(),
        conntrack: 262_144,
        services: (max + 1024).next_power_of_two(),
    };

    let mut empty = load_empty()?;
    let syn = frame_tcp(CLIENT, CLIENT_PORT, VIP_A, 80, 0x02);
    let empty_repeat = {
        let prog = tc(&mut empty, "sb_empty_tc")?;
        let mut v = Vec::new();
        for _ in 0..rounds {
            let (ret, ns) = run_repeat(prog, &syn, repeat)?;
            ensure!(ret == TC_ACT_OK, "empty tc verdict {ret}");
            v.push(ns);
        }
        median(&mut v)
    };
    let empty_single = measure_single(
        tc(&mut empty, "sb_empty_tc")?,
        (0..singles).map(|i| frame_tcp(CLIENT, 20000 + i as u16, VIP_A, 80, 0x02)),
        TC_ACT_OK,
    )?;
    // XDP floor: the empty XDP program on the same frame (switchboard has no
    // XDP program yet, so there is nothing to put next to it).
    let empty_xdp = {
        let prog = xdp(&mut empty, "sb_empty_xdp")?;
        let mut v = Vec::new();
        for _ in 0..rounds {
            let mut out = vec![0u8; syn.len() + 256];
            let r = prog.test_run(TestRunOptions {
                data_in: Some(&syn),
                data_out: Some(&mut out),
                repeat,
                ..TestRunOptions::default()
            })?;
            ensure!(r.return_value == 2, "empty xdp verdict {}", r.return_value);
            v.push(r.duration.as_nanos() as f64);
        }
        median(&mut v)
    };
    progress(&format!(
        "perpacket: empty tc {empty_repeat:.1} ns, empty XDP {empty_xdp:.1} ns (repeat {repeat})"
    ));

    let mut pp = PerPacket::new(caps)?;
    let mut rows = Vec::new();
    let mut next_sport: u32 = 1024;
    for &services in sizes {
        for &backends in backend_counts {
            let desired = perpacket_state(services, backends);
            let sync_time = pp.apply(&desired)?;
            pp.seed_pingpong()?;
            let existing = frame_tcp(CLIENT, CLIENT_PORT, VIP_A, 80, 0x10);
            let reply = frame_tcp(VIP_B, 80, CLIENT, CLIENT_PORT, 0x12);
            let non_service = frame_tcp(CLIENT, CLIENT_PORT, POD, 8080, 0x10);
            let to_pod_other = frame_tcp(POD, 8080, CLIENT, 50000, 0x10);

            let hit = measure_repeat(
                &mut pp,
                programs::TC_FROM_POD,
                &existing,
                TC_ACT_OK,
                Some("forwarded"),
                repeat,
                rounds,
            )?;
            let self_frame = frame_tcp(CLIENT, CLIENT_PORT, VIP_SELF, 80, 0x10);
            let no_rewrite = measure_repeat(
                &mut pp,
                programs::TC_FROM_POD,
                &self_frame,
                TC_ACT_OK,
                Some("forwarded"),
                repeat,
                rounds,
            )?;
            let pass = measure_repeat(
                &mut pp,
                programs::TC_FROM_POD,
                &non_service,
                TC_ACT_UNSPEC,
                // Not counted: packets that are not ours cost no map update.
                None,
                repeat,
                rounds,
            )?;
            let rev = measure_repeat(
                &mut pp,
                programs::TC_TO_POD,
                &reply,
                TC_ACT_OK,
                Some("reversed"),
                repeat,
                rounds,
            )?;
            let to_pod_pass = measure_repeat(
                &mut pp,
                programs::TC_TO_POD,
                &to_pod_other,
                TC_ACT_UNSPEC,
                // Not counted: packets that are not ours cost no map update.
                None,
                repeat,
                rounds,
            )?;

            // Single-shot: new flows (fresh source port per call; the source
            // address moves on every 60k calls so no flow is ever reused), and
            // the existing flow measured the same way for comparison.
            let new_before = pp
                .syncer
                .store()
                .service_stats(pp.ids(VIP_A, VIP_B, 80)?.0)
                .new_flows;
            let frames: Vec<Vec<u8>> = (0..singles)
                .map(|_| {
                    next_sport += 1;
                    let src = nth_ip(Ipv4Addr::new(10, 244, 200, 0), next_sport / 60_000);
                    frame_tcp(src, 1024 + (next_sport % 60_000) as u16, VIP_A, 80, 0x02)
                })
                .collect();
            let new_flow = measure_single(
                tc(&mut pp.ebpf, programs::TC_FROM_POD)?,
                frames.into_iter(),
                TC_ACT_OK,
            )?;
            let new_after = pp
                .syncer
                .store()
                .service_stats(pp.ids(VIP_A, VIP_B, 80)?.0)
                .new_flows;
            ensure!(
                new_after - new_before == u64::from(singles),
                "new-flow case created {} flows, expected {singles}",
                new_after - new_before
            );
            let hit_single = measure_single(
                tc(&mut pp.ebpf, programs::TC_FROM_POD)?,
                (0..singles).map(|_| existing.clone()),
                TC_ACT_OK,
            )?;
            progress(&format!(
                "perpacket: {services} services, {backends} backends/target: from_pod hit {hit:.1} ns (no rewrite {no_rewrite:.1}), non-service {pass:.1} ns, to_pod reply {rev:.1} ns, to_pod other {to_pod_pass:.1} ns; single-shot new {new_flow:.1} / hit {hit_single:.1} / empty {empty_single:.1} ns"
            ));
            rows.push(json!({
                "services": desired.frontends.len(),
                "services_nominal": services,
                "target_backends": backends,
                "sync_ms": sync_time.as_secs_f64() * 1e3,
                "from_pod_service_existing_ns": hit,
                "from_pod_service_existing_no_rewrite_ns": no_rewrite,
                "from_pod_non_service_ns": pass,
                "to_pod_reply_ns": rev,
                "to_pod_non_service_ns": to_pod_pass,
                "single_shot": {
                    "from_pod_service_new_ns": new_flow,
                    "from_pod_service_existing_ns": hit_single,
                    "empty_tc_ns": empty_single,
                },
            }));
        }
    }
    Ok(json!({
        "kind": "perpacket",
        "repeat": repeat,
        "rounds": rounds,
        "single_shot_samples": singles,
        "frame_bytes": syn.len(),
        "capacities": {"frontends": caps.frontends, "backends": caps.backends, "conntrack": caps.conntrack, "services": caps.services},
        "empty_tc_ns": empty_repeat,
        "empty_xdp_ns": empty_xdp,
        "xdp_switchboard_ns": Value::Null,
        "xdp_note": "switchboard has no XDP program yet (NodePort via XDP is not implemented); only the empty XDP floor is measured",
        "rows": rows,
    }))
}

// ---------------------------------------------------------------------------
// sync: model + map writes at scale
// ---------------------------------------------------------------------------

/// `count` Services (ClusterIP 10.100.0.0 + i, port 80 → 8080) each with one
/// EndpointSlice of `endpoints` ready endpoints, as k8s-openapi objects (what
/// both sources hand to the model).
pub fn k8s_objects(count: u32, endpoints: u32) -> Result<(Vec<Service>, Vec<EndpointSlice>)> {
    let mut services = Vec::with_capacity(count as usize);
    let mut slices = Vec::with_capacity(count as usize);
    for i in 0..count {
        let ip = nth_ip(Ipv4Addr::new(10, 100, 0, 0), i).to_string();
        services.push(serde_json::from_value::<Service>(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i}"), "namespace": "bench"},
            "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
                     "selector": {"app": format!("svc-{i}")}}
        }))?);
        let eps: Vec<Value> = (0..endpoints)
            .map(|j| {
                json!({"addresses": [nth_ip(Ipv4Addr::new(10, 128, 0, 0), i * endpoints + j).to_string()],
                       "conditions": {"ready": true, "serving": true, "terminating": false}})
            })
            .collect();
        slices.push(serde_json::from_value::<EndpointSlice>(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": format!("svc-{i}-abcde"), "namespace": "bench",
                         "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
            "endpoints": eps,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }))?);
    }
    Ok((services, slices))
}

fn stats_ms(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    json!({
        "p50_ms": percentile(&v, 0.50),
        "p99_ms": percentile(&v, 0.99),
        "max_ms": v.last().copied().unwrap_or(f64::NAN),
        "samples": v.len(),
    })
}

fn sync_bench(quick: bool) -> Result<Value> {
    let endpoints = 10;
    let sizes: &[u32] = if quick { &[10_000] } else { &[1_000, 10_000] };
    let changes = if quick { 30 } else { 200 };
    let mut runs = Vec::new();
    for &count in sizes {
        let (services, mut slices) = k8s_objects(count, endpoints)?;
        let started = Instant::now();
        let (desired, warnings) = model::build(&services, &slices);
        let model_time = started.elapsed();
        ensure!(
            warnings.is_empty(),
            "model warnings: {:?}",
            warnings.first()
        );
        ensure!(
            desired.frontends.len() == count as usize,
            "model built {} frontends",
            desired.frontends.len()
        );

        let entries = count * (endpoints + 1);
        let caps = Capacities {
            frontends: (entries + 4096).next_power_of_two(),
            backends: (count * endpoints + 4096).next_power_of_two(),
            conntrack: 262_144,
            services: (count + 1024).next_power_of_two(),
        };
        let mut ebpf = ebpf::load_unpinned(&caps)?;
        let maps = PinnedMaps::take(&mut ebpf)?;
        let mut syncer = Syncer::adopt(maps, caps);
        let started = Instant::now();
        let report = syncer.apply(&desired);
        let apply_time = started.elapsed();
        ensure!(
            report.failed.is_empty(),
            "sync failed: {:?}",
            report.failed.first()
        );
        ensure!(report.added == count as usize, "added {}", report.added);
        let writes = report.writes;
        let started = Instant::now();
        let noop = syncer.apply(&desired);
        let noop_time = started.elapsed();
        ensure!(noop.writes == 0, "no-op apply wrote {}", noop.writes);
        progress(&format!(
            "sync: {count} services x {endpoints} endpoints: model {:.1} ms, apply {:.1} ms ({writes} map writes), no-op apply {:.1} ms",
            model_time.as_secs_f64() * 1e3,
            apply_time.as_secs_f64() * 1e3,
            noop_time.as_secs_f64() * 1e3
        ));

        // One EndpointSlice changes (one endpoint replaced): what the agent does
        // per change today — rebuild the model from every object, then apply.
        let mut model_ms = Vec::new();
        let mut apply_ms = Vec::new();
        let mut total_ms = Vec::new();
        let mut change_writes = Vec::new();
        for k in 0..changes {
            let idx = ((k as u64 * 7919) % u64::from(count)) as usize;
            let new_ip = nth_ip(Ipv4Addr::new(10, 160, 0, 0), k).to_string();
            slices[idx].endpoints[0].addresses = vec![new_ip];
            let t0 = Instant::now();
            let (desired, _) = model::build(&services, &slices);
            let t1 = Instant::now();
            let report = syncer.apply(&desired);
            let t2 = Instant::now();
            ensure!(
                report.updated == 1 && report.failed.is_empty(),
                "change {k}: {report:?}"
            );
            model_ms.push((t1 - t0).as_secs_f64() * 1e3);
            apply_ms.push((t2 - t1).as_secs_f64() * 1e3);
            total_ms.push((t2 - t0).as_secs_f64() * 1e3);
            change_writes.push(report.writes as f64);
        }
        let change = json!({
            "total": stats_ms(total_ms),
            "model": stats_ms(model_ms),
            "apply": stats_ms(apply_ms),
            "writes_per_change_median": median(&mut change_writes),
        });
        progress(&format!(
            "sync: one EndpointSlice change at {count} services: {change}"
        ));
        runs.push(json!({
            "services": count,
            "endpoints_per_service": endpoints,
            "model_ms": model_time.as_secs_f64() * 1e3,
            "apply_ms": apply_time.as_secs_f64() * 1e3,
            "map_writes": writes,
            "noop_apply_ms": noop_time.as_secs_f64() * 1e3,
            "one_slice_change": change,
        }));
        drop(syncer);
        drop(ebpf);
    }
    Ok(json!({"kind": "sync", "runs": runs}))
}

// ---------------------------------------------------------------------------
// fwd: packets per second through the tc path, generated by the kernel
// ---------------------------------------------------------------------------

/// `struct xdp_md` (the context BPF_PROG_TEST_RUN takes for XDP programs).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct XdpMd {
    data: u32,
    data_end: u32,
    data_meta: u32,
    ingress_ifindex: u32,
    rx_queue_index: u32,
    egress_ifindex: u32,
}

struct PodIf {
    /// Host-side interface (node namespace).
    host_if: String,
    /// Pod namespace (the sink goes on its eth0).
    ns: String,
    ip: Ipv4Addr,
}

fn ifindex(name: &str) -> Result<u32> {
    let c = std::ffi::CString::new(name)?;
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    ensure!(idx != 0, "no interface {name} in this namespace");
    Ok(idx)
}

fn sink_total(map: &aya::maps::PerCpuArray<MapData, u64>) -> Result<u64> {
    Ok(map.get(&0, 0)?.iter().sum())
}

fn mac(name: &str) -> Result<[u8; 6]> {
    let text = fs::read_to_string(format!("/sys/class/net/{name}/address"))?;
    let bytes: Vec<u8> = text
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()?;
    bytes.try_into().map_err(|_| anyhow!("bad MAC {text}"))
}

/// Runs `f` with this thread in network namespace `ns` (`/run/netns/<ns>`).
fn in_netns<T>(ns: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    use nix::sched::{setns, CloneFlags};
    let home = fs::File::open("/proc/thread-self/ns/net")?;
    let target =
        fs::File::open(format!("/run/netns/{ns}")).with_context(|| format!("open netns {ns}"))?;
    setns(target.as_fd(), CloneFlags::CLONE_NEWNET).context("setns into pod")?;
    let result = f();
    setns(home.as_fd(), CloneFlags::CLONE_NEWNET).context("setns back")?;
    result
}

fn pin_to_cpu(cpu: usize) -> Result<()> {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        ensure!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Every tc hook the agent would use in this setup: ingress and egress of the
/// client's veth and of every pod's veth.
fn hooks(ingress: &str, pods: &[PodIf]) -> Vec<(String, TcAttachType)> {
    std::iter::once(ingress.to_string())
        .chain(pods.iter().map(|p| p.host_if.clone()))
        .flat_map(|iface| {
            [
                (iface.clone(), TcAttachType::Ingress),
                (iface, TcAttachType::Egress),
            ]
        })
        .collect()
}

fn netlink() -> TcAttachOptions {
    TcAttachOptions::Netlink(NlOptions::default())
}

/// `fwd --ingress IF --pod HOSTIF:NS:IP [--pod ...] [--count N] [--cpu C]`
///
/// Generates UDP frames from the client (10.244.100.2) with BPF_PROG_TEST_RUN
/// in live-frame mode (`BPF_F_TEST_XDP_LIVE_FRAMES`): the empty XDP program
/// returns XDP_PASS, so every frame enters the node's stack on `--ingress` as a
/// received packet — through tc ingress, routing, forwarding, tc egress on the
/// pod's veth — and is dropped by an XDP sink on the pod's eth0. All of it runs
/// on one CPU inside the syscall (softirqs run at `local_bh_enable` after each
/// batch), so frames ÷ wall time is the one-core forwarding rate. Three setups
/// on the same path: nothing attached (plain kernel forwarding), the empty tc
/// program on the same hooks (a program that only forwards), and switchboard
/// (ClusterIP frames DNATed to a pod; one flow, so conntrack hits).
fn fwd(rest: &[String]) -> Result<Value> {
    let mut ingress = None;
    let mut pods = Vec::new();
    let mut count: u32 = 5_000_000;
    let mut cpu = 1usize;
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        let mut val = || it.next().ok_or_else(|| anyhow!("{arg} needs a value"));
        match arg.as_str() {
            "--ingress" => ingress = Some(val()?.clone()),
            "--pod" => {
                let v = val()?;
                let parts: Vec<&str> = v.split(':').collect();
                ensure!(parts.len() == 3, "--pod HOSTIF:NS:IP, got {v}");
                pods.push(PodIf {
                    host_if: parts[0].into(),
                    ns: parts[1].into(),
                    ip: parts[2].parse()?,
                });
            }
            "--count" => count = val()?.parse()?,
            "--cpu" => cpu = val()?.parse()?,
            other => bail!("fwd: unknown argument {other}"),
        }
    }
    let ingress = ingress.ok_or_else(|| anyhow!("fwd needs --ingress IF"))?;
    ensure!(!pods.is_empty(), "fwd needs at least one --pod");
    pin_to_cpu(cpu)?;

    let mut empty = load_empty()?;
    // Sinks on every pod's eth0 (native XDP on veth).
    let mut sink_links = Vec::new();
    for pod in &pods {
        let prog = xdp(&mut empty, "sb_sink_xdp")?;
        let link = in_netns(&pod.ns, || {
            prog.attach("eth0", aya::programs::XdpMode::Driver)
                .with_context(|| format!("attach XDP sink in {}", pod.ns))
        })?;
        sink_links.push(link);
    }

    let mut template_map: aya::maps::Array<MapData, [u8; 64]> = empty
        .take_map("SB_GEN_FRAME")
        .ok_or_else(|| anyhow!("SB_GEN_FRAME missing"))?
        .try_into()?;
    let sink_count: aya::maps::PerCpuArray<MapData, u64> = empty
        .take_map("SB_SINK_COUNT")
        .ok_or_else(|| anyhow!("SB_SINK_COUNT missing"))?
        .try_into()?;
    let in_idx = ifindex(&ingress)?;
    let in_mac = mac(&ingress)?;
    let udp_frame = |dst: Ipv4Addr, dport: u16| -> Vec<u8> {
        let mut spec = PacketSpec::udp(CLIENT, 41000, dst, dport);
        spec.payload = vec![0u8; 18]; // 14 + 20 + 8 + 18 = 60 bytes, a minimal frame
        let mut frame = spec.build();
        frame[0..6].copy_from_slice(&in_mac);
        frame
    };
    let vip = VIP_A;
    let vip_port = 9;
    let pod_port = 9;

    let mut rows = Vec::new();
    // The agent attaches with netlink (cls_bpf on a clsact qdisc); the TCX
    // rows (bpf_link, kernel >= 6.6) show what that choice costs.
    for (setup, tcx) in [
        ("kernel forwarding, no program", false),
        (
            "empty tc program (only forwards), netlink clsact as the agent attaches",
            false,
        ),
        (
            "switchboard tc (ClusterIP DNAT), netlink clsact as the agent attaches",
            false,
        ),
        ("empty tc program (only forwards), TCX link", true),
        ("switchboard tc (ClusterIP DNAT), TCX link", true),
    ] {
        let attach_opts = || {
            if tcx {
                TcAttachOptions::TcxOrder(LinkOrder::default())
            } else {
                netlink()
            }
        };
        let mut sb: Option<(Ebpf, Syncer<PinnedMaps>)> = None;
        let mut empty_links = Vec::new();
        let frame;
        match setup {
            s if s.starts_with("kernel") => frame = udp_frame(pods[0].ip, pod_port),
            s if s.starts_with("empty") => {
                // The same hooks switchboard uses, attached the way the agent
                // attaches (netlink clsact filters).
                let prog = tc(&mut empty, "sb_empty_tc")?;
                for (iface, hook) in hooks(&ingress, &pods) {
                    let _ = aya::programs::tc::qdisc_add_clsact(&iface);
                    empty_links.push(prog.attach_with_options(&iface, hook, attach_opts())?);
                }
                frame = udp_frame(pods[0].ip, pod_port);
            }
            _ => {
                let caps = Capacities::default();
                let mut ebpf = ebpf::load_unpinned(&caps)?;
                let maps = PinnedMaps::take(&mut ebpf)?;
                let mut syncer = Syncer::adopt(maps, caps);
                let mut f = frontend(
                    vip,
                    vip_port,
                    "fwd",
                    pods.iter()
                        .map(|p| BackendAddr {
                            ip: p.ip,
                            port: pod_port,
                        })
                        .collect(),
                );
                f.addr.protocol = Protocol::Udp;
                let report = syncer.apply(&DesiredState {
                    frontends: [(f.addr, f)].into_iter().collect(),
                });
                ensure!(report.failed.is_empty(), "{report:?}");
                // As the agent does: both programs on every veth (netlink
                // clsact filters); dropping the object detaches them.
                for (iface, hook) in hooks(&ingress, &pods) {
                    let name = match hook {
                        TcAttachType::Ingress => programs::TC_FROM_POD,
                        _ => programs::TC_TO_POD,
                    };
                    let _ = aya::programs::tc::qdisc_add_clsact(&iface);
                    tc(&mut ebpf, name)?.attach_with_options(&iface, hook, attach_opts())?;
                }
                sb = Some((ebpf, syncer));
                frame = udp_frame(vip, vip_port);
            }
        }

        let mut template = [0u8; 64];
        template[..frame.len()].copy_from_slice(&frame);
        template_map
            .set(0, template, 0)
            .context("writing the generator's frame")?;
        let fwd_before = sb.as_ref().map(|(_, s)| stat(s.store(), "forwarded"));
        let mut md = XdpMd {
            ingress_ifindex: in_idx,
            ..XdpMd::default()
        };
        md.data_end = frame.len() as u32;
        let ctx: &[u8] = unsafe {
            std::slice::from_raw_parts(
                (&md as *const XdpMd).cast::<u8>(),
                std::mem::size_of::<XdpMd>(),
            )
        };
        let gen = xdp(&mut empty, "sb_gen_xdp")?;
        // Warm-up (neighbour entries, caches), then the measured run.
        gen.test_run(TestRunOptions {
            data_in: Some(&frame),
            ctx_in: Some(ctx),
            repeat: 10_000,
            attrs: TestRunAttrs::new().xdp_live_frames(64),
            ..TestRunOptions::default()
        })
        .context("XDP live-frame run (warm-up)")?;
        let sink_mid = sink_total(&sink_count)?;
        let started = Instant::now();
        let r = gen
            .test_run(TestRunOptions {
                data_in: Some(&frame),
                ctx_in: Some(ctx),
                repeat: count,
                attrs: TestRunAttrs::new().xdp_live_frames(64),
                ..TestRunOptions::default()
            })
            .context("XDP live-frame run")?;
        let wall = started.elapsed();
        let delivered = sink_total(&sink_count)? - sink_mid;
        let forwarded = sb
            .as_ref()
            .map(|(_, s)| stat(s.store(), "forwarded") - fwd_before.unwrap_or(0));
        let mpps = delivered as f64 / wall.as_secs_f64() / 1e6;
        progress(&format!(
            "fwd: {setup}: {count} frames in {:.3} s, {delivered} reached the pods' sinks, {mpps:.3} Mpps",
            wall.as_secs_f64(),
        ));
        ensure!(
            delivered as f64 >= 0.99 * f64::from(count),
            "fwd: only {delivered} of {count} frames reached the pods ({setup}): the path drops, so a rate would mean nothing"
        );
        rows.push(json!({
            "path": "tc",
            "setup": setup,
            "attach": if setup.starts_with("kernel") { "none" } else if tcx { "tcx" } else { "netlink" },
            "frames": count,
            "wall_s": wall.as_secs_f64(),
            "kernel_ns_per_frame": r.duration.as_nanos() as f64,
            "reached_pods": delivered,
            "switchboard_forwarded_counter": forwarded,
            "mpps": mpps,
            "ns_per_packet": if delivered > 0 { wall.as_nanos() as f64 / delivered as f64 } else { f64::NAN },
        }));

        let prog = tc(&mut empty, "sb_empty_tc")?;
        for link in empty_links {
            prog.detach(link)?;
        }
        drop(sb);
    }
    drop(sink_links);
    rows.push(json!({
        "path": "xdp",
        "setup": "switchboard XDP NodePort",
        "mpps": Value::Null,
        "note": "not implemented yet: switchboard has no XDP program",
    }));
    let mut meta = BTreeMap::new();
    meta.insert("cpu", json!(cpu));
    meta.insert("frame_bytes", json!(60));
    meta.insert("generator", json!("BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES (batch 64): sb_gen_xdp writes a 60-byte UDP frame and returns XDP_PASS, so it enters the node's stack on the client veth; sb_sink_xdp on each pod's eth0 counts and drops"));
    Ok(json!({"kind": "fwd", "meta": meta, "rows": rows}))
}
