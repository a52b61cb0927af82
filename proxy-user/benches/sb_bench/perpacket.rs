//! `perpacket`: per-packet cost of the tc programs through
//! BPF_PROG_TEST_RUN (see the crate documentation for the ping-pong).
use std::{
    net::{IpAddr, Ipv4Addr},
    os::fd::AsFd as _,
    time::{Duration, Instant},
};

use anyhow::{anyhow, ensure, Context as _, Result};
use aya::{
    maps::{Array, HashMap as AyaHashMap, IterableMap as _, Map, MapData},
    programs::{SchedClassifier, TestRun as _, TestRunOptions},
    Ebpf,
};
use proxy_common::{ct_dir, names, programs, proto, CtEntry, CtKey};
use proxy_testkit::packet::PacketSpec;
use proxy_user::{
    dataplane::flows::quiet_pods::QuietPods,
    dataplane::load::object,
    dataplane::maps::PinnedMaps,
    model::cidr::IpCidr,
    model::{BackendAddr, DesiredState, FrontendAddr, Protocol, SourceRanges},
    sync::encode::frontend_key,
    sync::store::Capacities,
    sync::store::MapStore as _,
    sync::Syncer,
};
use serde_json::{json, Value};

use crate::common::*;
use crate::progress;

#[path = "perpacket/schedulers.rs"]
mod schedulers;
#[path = "perpacket/v6.rs"]
mod v6;

// ---------------------------------------------------------------------------
// perpacket
// ---------------------------------------------------------------------------

pub(crate) struct PerPacket {
    ebpf: Ebpf,
    syncer: Syncer<PinnedMaps>,
    conntrack: AyaHashMap<MapData, CtKey, CtEntry>,
}

pub(crate) fn frame_tcp(
    src: Ipv4Addr,
    sport: u16,
    dst: Ipv4Addr,
    dport: u16,
    flags: u8,
) -> Vec<u8> {
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
pub(crate) fn perpacket_state(services: u32, target_backends: u32) -> DesiredState {
    let mut a_backends = vec![BackendAddr {
        ip: VIP_B.into(),
        port: 80,
    }];
    for j in 1..target_backends {
        a_backends.push(BackendAddr {
            ip: nth_ip(Ipv4Addr::new(10, 210, 0, 0), j).into(),
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
                ip: VIP_A.into(),
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
                ip: VIP_SELF.into(),
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
                ip: nth_ip(Ipv4Addr::new(10, 200, 0, 0), i).into(),
                port: 8080,
            }],
        ));
    }
    DesiredState {
        frontends: frontends.into_iter().map(|f| (f.addr, f)).collect(),
    }
}

/// The interface of a test run's skb: the loopback.
const LOOPBACK_IFINDEX: u32 = 1;

impl PerPacket {
    /// Marks interface `ifindex` quiet (`on`) or takes the mark away.
    fn set_quiet(&mut self, ifindex: u32, on: bool) -> Result<()> {
        // The generations, through a handle of their own (the marks borrow
        // the object mutably).
        let gens: Array<&MapData, u64> = Array::try_from(
            self.ebpf
                .map(names::QUIET_GENS)
                .context("the quiet generations")?,
        )?;
        let fd = gens.map().fd().as_fd().try_clone_to_owned()?;
        let gens = Array::try_from(Map::from_map_data(MapData::from_fd(fd)?)?)?;
        let marks = self
            .ebpf
            .map_mut(names::QUIET_PODS)
            .context("the quiet marks")?;
        let mut quiet = QuietPods::new(Array::try_from(marks)?, gens);
        match on {
            true => quiet.mark_unattached(ifindex)?,
            false => quiet.unmark(ifindex)?,
        }
        Ok(())
    }

    fn new(caps: Capacities) -> Result<Self> {
        let mut ebpf = object::load_unpinned(proxy_object::SWITCHBOARD, &caps)
            .context("loading switchboard's object")?;
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

    /// Sets the live trace's switch (`names::TRACE_ON`), as a `trace`
    /// client makes the agent do.
    fn set_trace(&mut self, mask: u64) -> Result<()> {
        let map = self.ebpf.map_mut(names::TRACE_ON).context("trace switch")?;
        Array::<_, u64>::try_from(map)?.set(0, mask, 0)?;
        Ok(())
    }

    /// Reads (and frees) every trace event written; returns how many.
    fn drain_trace(&mut self) -> Result<usize> {
        let map = self
            .ebpf
            .map_mut(names::TRACE_EVENTS)
            .context("trace ring")?;
        let mut ring = aya::maps::RingBuf::try_from(map)?;
        let mut n = 0;
        while ring.next().is_some() {
            n += 1;
        }
        Ok(n)
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

    fn ids(
        &self,
        vip: impl Into<IpAddr>,
        backend: impl Into<IpAddr>,
        backend_port: u16,
    ) -> Result<(u32, u32)> {
        let (vip, backend) = (vip.into(), backend.into());
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
        let want = proxy_user::model::BackendAddr {
            ip: backend,
            port: backend_port,
        };
        let backend_id = dump
            .backends
            .iter()
            .find(|(_, b)| proxy_user::sync::encode::backend_addr(b) == want)
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

/// `desired` with the ping-pong frontend A restricted by
/// `loadBalancerSourceRanges` to 16 blocks, one of them the client's /32:
/// every packet to A then makes one trie lookup.
fn with_source_ranges(desired: &DesiredState) -> Result<DesiredState> {
    let mut restricted = desired.clone();
    let addr = FrontendAddr {
        ip: VIP_A.into(),
        port: 80,
        protocol: Protocol::Tcp,
    };
    let a = restricted
        .frontends
        .get_mut(&addr)
        .ok_or_else(|| anyhow!("frontend A missing"))?;
    let mut blocks: Vec<IpCidr> = (0..15u8)
        .filter_map(|i| IpCidr::new(Ipv4Addr::new(172, 16 + i, 0, 0).into(), 16))
        .collect();
    blocks.extend(IpCidr::new(CLIENT.into(), 32));
    blocks.sort();
    a.source_ranges = Some(SourceRanges {
        blocks: blocks.into(),
        allows_node: false,
    });
    Ok(restricted)
}

/// Runs `frame` through `prog` `rounds` times with `repeat`; checks the verdict
/// and (if given) that the global counter `counter` grew by exactly
/// `rounds × repeat`. Returns the median ns per packet.
pub(crate) fn measure_repeat(
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
pub(crate) fn measure_single(
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

/// `n` TCP SYNs of flows never seen (a fresh source port per frame; the
/// source address moves on every 60k so no flow is ever reused).
fn new_flow_frames(next_sport: &mut u32, n: u32) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            *next_sport += 1;
            let src = nth_ip(Ipv4Addr::new(10, 244, 200, 0), *next_sport / 60_000);
            frame_tcp(src, 1024 + (*next_sport % 60_000) as u16, VIP_A, 80, 0x02)
        })
        .collect()
}

pub(crate) fn perpacket(quick: bool) -> Result<Value> {
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
    // Service and backend ids are one space for both families: room for
    // the IPv6 rows' fillers too.
    let ids = max + max.min(v6::MAX_FILLERS6);
    let caps = Capacities {
        frontends: (2 * max + 4096).next_power_of_two(),
        backends: (ids + 4096).next_power_of_two(),
        conntrack: 262_144,
        services: (ids + 1024).next_power_of_two(),
        ..Capacities::default()
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
            let started = Instant::now();
            let r = prog.test_run(TestRunOptions {
                data_in: Some(&syn),
                data_out: Some(&mut out),
                repeat,
                ..TestRunOptions::default()
            })?;
            ensure!(r.return_value == 2, "empty xdp verdict {}", r.return_value);
            v.push(ns_per_run(r.duration, started.elapsed(), repeat));
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
            // A reply of the established flow (an ACK), and its first reply
            // (the SYN-ACK), which no flow cache answers.
            let reply = frame_tcp(VIP_B, 80, CLIENT, CLIENT_PORT, 0x10);
            let first_reply = frame_tcp(VIP_B, 80, CLIENT, CLIENT_PORT, 0x12);
            let non_service = frame_tcp(CLIENT, CLIENT_PORT, POD, 8080, 0x10);
            let to_pod_other = frame_tcp(POD, 8080, CLIENT, 50000, 0x10);

            // The existing flow's packet, repeated (also with the trace on).
            let measure_hit = |pp: &mut PerPacket| {
                measure_repeat(
                    pp,
                    programs::TC_FROM_POD,
                    &existing,
                    TC_ACT_OK,
                    Some("forwarded"),
                    repeat,
                    rounds,
                )
            };
            let hit = measure_hit(&mut pp)?;
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
            let rev_first = measure_repeat(
                &mut pp,
                programs::TC_TO_POD,
                &first_reply,
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
            // A packet into a pod whose connections the socket layer
            // balanced: its interface is marked quiet (the test run's skb is
            // on the loopback, interface 1), so no lookup at all.
            pp.set_quiet(LOOPBACK_IFINDEX, true)?;
            let to_pod_quiet = measure_repeat(
                &mut pp,
                programs::TC_TO_POD,
                &to_pod_other,
                TC_ACT_UNSPEC,
                None,
                repeat,
                rounds,
            );
            pp.set_quiet(LOOPBACK_IFINDEX, false)?;
            let to_pod_quiet = to_pod_quiet?;

            // Single-shot: new flows (fresh source port per call; the source
            // address moves on every 60k calls so no flow is ever reused), and
            // the existing flow measured the same way for comparison.
            let new_before = pp
                .syncer
                .store()
                .service_stats(pp.ids(VIP_A, VIP_B, 80)?.0)
                .new_flows;
            let frames = new_flow_frames(&mut next_sport, singles);
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
            // The same under each per-node scheduler, next to random.
            let by_algorithm =
                schedulers::new_flow_costs(&mut pp, &desired, singles, &mut next_sport)?;
            progress(&format!(
                "perpacket: {services} services, {backends} backends/target: single-shot new flow by algorithm {by_algorithm}"
            ));
            let hit_single = measure_single(
                tc(&mut pp.ebpf, programs::TC_FROM_POD)?,
                (0..singles).map(|_| existing.clone()),
                TC_ACT_OK,
            )?;
            // Tracing on (every event type): an existing flow's packet never
            // reads the switch; a new flow writes its event (the ring buffer
            // drained first, and sized for the samples).
            pp.set_trace(proxy_common::trace::kind::ALL)?;
            let hit_traced = measure_hit(&mut pp);
            let traced = singles.min(2000);
            let new_traced = pp.drain_trace().and_then(|_| {
                measure_single(
                    tc(&mut pp.ebpf, programs::TC_FROM_POD)?,
                    new_flow_frames(&mut next_sport, traced).into_iter(),
                    TC_ACT_OK,
                )
            });
            let events = pp.drain_trace();
            pp.set_trace(0)?;
            let (hit_traced, new_traced, events) = (hit_traced?, new_traced?, events?);
            ensure!(
                events == traced as usize,
                "traced new flows wrote {events} events, expected {traced}"
            );
            progress(&format!(
                "perpacket: {services} services, {backends} backends/target: tracing on: from_pod hit {hit_traced:.1} ns, single-shot new {new_traced:.1} ns"
            ));
            // The same existing flow once A is restricted by source ranges
            // (one trie lookup per packet); then A is open again.
            pp.apply(&with_source_ranges(&desired)?)?;
            let hit_ranged = measure_repeat(
                &mut pp,
                programs::TC_FROM_POD,
                &existing,
                TC_ACT_OK,
                Some("forwarded"),
                repeat,
                rounds,
            )?;
            pp.apply(&desired)?;
            progress(&format!(
                "perpacket: {services} services, {backends} backends/target: from_pod hit {hit:.1} ns (no rewrite {no_rewrite:.1}, with 16 source ranges {hit_ranged:.1}), non-service {pass:.1} ns, to_pod reply {rev:.1} ns, to_pod other {to_pod_pass:.1} ns, into a quiet pod {to_pod_quiet:.1} ns; single-shot new {new_flow:.1} / hit {hit_single:.1} / empty {empty_single:.1} ns"
            ));
            rows.push(json!({
                "services": desired.frontends.len(),
                "services_nominal": services,
                "target_backends": backends,
                "sync_ms": sync_time.as_secs_f64() * 1e3,
                "from_pod_service_existing_ns": hit,
                "from_pod_service_existing_no_rewrite_ns": no_rewrite,
                "from_pod_service_existing_source_ranges_ns": hit_ranged,
                "from_pod_non_service_ns": pass,
                "to_pod_reply_ns": rev,
                "to_pod_first_reply_ns": rev_first,
                "to_pod_non_service_ns": to_pod_pass,
                "to_pod_quiet_ns": to_pod_quiet,
                "tracing_on": {
                    "from_pod_service_existing_ns": hit_traced,
                    "single_shot_from_pod_service_new_ns": new_traced,
                },
                "single_shot": {
                    "from_pod_service_new_ns": new_flow,
                    "from_pod_service_new_by_algorithm_ns": by_algorithm,
                    "from_pod_service_existing_ns": hit_single,
                    "empty_tc_ns": empty_single,
                },
            }));
        }
    }
    let ipv6 = v6::measure(&mut pp, sizes, repeat, rounds, empty_repeat)?;
    // Last: it replaces every frontend with its own.
    let balance = schedulers::balance(&mut pp)?;
    progress(&format!("perpacket: scheduler balance {balance}"));
    Ok(json!({
        "kind": "perpacket",
        "ipv6": ipv6,
        "scheduler_balance": balance,
        "repeat": repeat,
        "rounds": rounds,
        "single_shot_samples": singles,
        "frame_bytes": syn.len(),
        "capacities": {"frontends": caps.frontends, "backends": caps.backends, "conntrack": caps.conntrack, "services": caps.services},
        "empty_tc_ns": empty_repeat,
        "empty_xdp_ns": empty_xdp,
        "xdp_switchboard_ns": Value::Null,
        "xdp_note": "switchboard's XDP program (sb_xdp_uplink) is measured by the `uplink` mode; here only the empty XDP floor",
        "rows": rows,
    }))
}
