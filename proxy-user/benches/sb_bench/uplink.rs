//! `uplink`: per-packet cost of the north-south programs (`sb_xdp_uplink`,
//! XDP, and its tc twin `sb_from_uplink`) through BPF_PROG_TEST_RUN, next to
//! the empty XDP and tc programs on the same frames and context.
//!
//! Whether a backend is local or behind another node is a route lookup
//! (`bpf_fib_lookup`), so the whole mode runs on a thread of its own that
//! first moves into a private network namespace (`unshare(CLONE_NEWNET)`
//! changes the calling thread only; the `ip` commands it spawns inherit it)
//! and builds there the node the uplink fixtures build
//! (`proxy-testkit/src/node.rs`), with these addresses and routes:
//!
//! ```text
//! up0  (veth) 192.168.50.1/24, forwarding on              <- the uplink
//!      neighbours 192.168.50.2 (gateway to node B) and .100 (the client)
//!      route 10.244.2.0/24 via 192.168.50.2               (remote pods)
//! pod0 (veth) routes 10.244.1.0/24 and 192.168.60.10/32   (local)
//! ```
//!
//! The namespace goes away with the thread; nothing outside it is touched.
//!
//! Cases (TCP frames of 74 bytes, as in `perpacket`):
//! - **existing local flow** (DNAT → `XDP_PASS`), with `repeat`: a NodePort
//!   (192.168.50.1:30080) whose backend is a LoadBalancer address
//!   (192.168.60.10:30081, routed to `pod0`: local), whose backend is the
//!   NodePort again. Both flows are created first by the data path itself; then
//!   every repetition is a frontend hit, a conntrack hit and a DNAT (addresses,
//!   port and checksums), alternately NodePort → LB address and back. The
//!   `ext_local` counter is checked to grow by exactly `repeat` per round.
//! - **not ours** (a TCP packet to the node's port 22), with `repeat`.
//! - **existing remote flow** (DNAT + SNAT + `bpf_fib_lookup` + MAC rewrite →
//!   `XDP_TX`), and its **reply**: the translated frame is no longer a packet
//!   the program would translate again, so it cannot be repeated; these are
//!   `repeat = 1` runs of the same (tracked) flow, the median of many. A
//!   single run carries the kernel timer's own overhead (two clock reads), so
//!   they are reported raw next to the empty program's single runs, and
//!   corrected by that overhead (single empty − repeated empty), which the
//!   local case checks (its corrected single run against its repeated cost).
//! - the tc twin `sb_from_uplink` with the same frames, next to the empty tc
//!   program with the same `__sk_buff` context.
use std::time::Instant;

use anyhow::{bail, ensure, Context as _, Result};
use aya::{
    programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp},
    Ebpf,
};
use proxy_common::programs;
use proxy_testkit::{node::NodeSpec, packet::PacketSpec};
use proxy_user::{
    dataplane::load::object,
    dataplane::maps::PinnedMaps,
    model::{
        BackendAddr, DesiredState, Frontend, FrontendAddr, FrontendKind, Protocol, ServicePortName,
    },
    sync::store::Capacities,
    sync::Syncer,
};
use serde_json::{json, Value};
use std::net::Ipv4Addr;

use crate::common::*;
use crate::progress;

pub(crate) const XDP_PASS: u32 = 2;
pub(crate) const XDP_TX: u32 = 3;
/// TC_ACT_REDIRECT: `bpf_redirect_neigh` accepted the packet.
const TC_ACT_REDIRECT: u32 = 7;

pub(crate) const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
pub(crate) const UPLINK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x50, 0x01];
pub(crate) const GATEWAY: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
pub(crate) const GATEWAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub(crate) const EXT_CLIENT: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 100);
pub(crate) const EXT_CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
/// A LoadBalancer address routed to `pod0` (a local destination).
pub(crate) const LB_LOCAL: Ipv4Addr = Ipv4Addr::new(192, 168, 60, 10);
/// A pod on another node (routed via GATEWAY on the uplink).
pub(crate) const POD_REMOTE: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
const NP_PINGPONG: u16 = 30080;
const LB_PINGPONG: u16 = 30081;
const NP_REMOTE: u16 = 30082;
pub(crate) const POD_PORT: u16 = 8080;

/// A permanent neighbour entry: `addr` at `lladdr` on `dev`.
pub(crate) fn neighbour(addr: std::net::IpAddr, lladdr: [u8; 6], dev: &str) -> Result<()> {
    let (addr, lladdr) = (addr.to_string(), mac_text(lladdr));
    ip(&[
        "neigh",
        "add",
        &addr,
        "lladdr",
        &lladdr,
        "dev",
        dev,
        "nud",
        "permanent",
    ])
}

/// The node of the module documentation.
const THIS_NODE: NodeSpec<Ipv4Addr> = NodeSpec {
    uplink_mac: UPLINK_MAC,
    addr: NODE,
    prefix_len: 24,
    neighbours: &[(GATEWAY, GATEWAY_MAC), (EXT_CLIENT, EXT_CLIENT_MAC)],
    routes: &[
        ("10.244.2.0/24", Some(GATEWAY)),
        ("10.244.1.0/24", None),
        // LB_LOCAL
        ("192.168.60.10/32", None),
    ],
};

/// Builds the node in the calling thread's (private) namespace; returns the
/// uplink's ifindex.
pub(crate) fn build_node() -> Result<u32> {
    Ok(THIS_NODE.build()?.uplink)
}

/// Programs `frontends` and makes `uplink` (with the node's address) the
/// uplink.
pub(crate) fn program_node(
    syncer: &mut Syncer<PinnedMaps>,
    frontends: Vec<Frontend>,
    uplink: u32,
) -> Result<()> {
    let report = syncer.apply(&DesiredState {
        frontends: frontends.into_iter().map(|f| (f.addr, f)).collect(),
    });
    ensure!(report.failed.is_empty(), "sync failed: {report:?}");
    syncer
        .store_mut()
        .set_uplinks(&[(
            uplink,
            proxy_common::Uplink::new(u32::from_ne_bytes(NODE.octets()), 0),
        )])
        .context("writing the uplink map")
}

pub(crate) fn fe(
    kind: FrontendKind,
    ip: Ipv4Addr,
    port: u16,
    name: &str,
    backend: (Ipv4Addr, u16),
) -> Frontend {
    Frontend {
        kind,
        ..Frontend::cluster_ip(
            FrontendAddr {
                ip: ip.into(),
                port,
                protocol: Protocol::Tcp,
            },
            ServicePortName {
                namespace: "bench".into(),
                name: name.into(),
                port: "".into(),
            },
            vec![BackendAddr {
                ip: backend.0.into(),
                port: backend.1,
            }],
        )
    }
}

fn frame(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Vec<u8> {
    let mut f = PacketSpec {
        payload: vec![0u8; FRAME_PAYLOAD],
        tcp_flags: 0x10,
        ..PacketSpec::tcp(src, sport, dst, dport)
    }
    .build();
    f[0..6].copy_from_slice(&UPLINK_MAC);
    f[6..12].copy_from_slice(&EXT_CLIENT_MAC);
    f
}

/// struct xdp_md with the uplink as ingress interface.
pub(crate) fn xdp_ctx(uplink: u32, len: usize) -> Vec<u8> {
    [0, len as u32, 0, uplink, 0, 0]
        .iter()
        .flat_map(|w: &u32| w.to_ne_bytes())
        .collect()
}

/// The head of struct __sk_buff up to `ifindex`: ingress_ifindex (byte 36)
/// and ifindex (byte 40) are the uplink; the kernel zero-fills the rest.
fn skb_ctx(uplink: u32) -> Vec<u8> {
    let mut ctx = vec![0u8; 44];
    ctx[36..40].copy_from_slice(&uplink.to_ne_bytes());
    ctx[40..44].copy_from_slice(&uplink.to_ne_bytes());
    ctx
}

/// One run: (verdict, ns per repetition as [`ns_per_run`] takes it, output frame).
fn run_xdp(prog: &Xdp, frame: &[u8], uplink: u32, repeat: u32) -> Result<(u32, f64, Vec<u8>)> {
    let ctx = xdp_ctx(uplink, frame.len());
    let mut out = vec![0u8; frame.len() + 256];
    let started = Instant::now();
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            repeat,
            ..TestRunOptions::default()
        })
        .context("BPF_PROG_TEST_RUN (XDP)")?;
    out.truncate(r.data_size_out as usize);
    Ok((
        r.return_value,
        ns_per_run(r.duration, started.elapsed(), repeat),
        out,
    ))
}

fn run_tc(
    prog: &SchedClassifier,
    frame: &[u8],
    uplink: u32,
    repeat: u32,
) -> Result<(u32, f64, Vec<u8>)> {
    let ctx = skb_ctx(uplink);
    let mut out = vec![0u8; frame.len() + 256];
    let started = Instant::now();
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            repeat,
            ..TestRunOptions::default()
        })
        .context("BPF_PROG_TEST_RUN (tc)")?;
    out.truncate(r.data_size_out as usize);
    Ok((
        r.return_value,
        ns_per_run(r.duration, started.elapsed(), repeat),
        out,
    ))
}

#[derive(Clone, Copy)]
enum Hook {
    Xdp,
    Tc,
}

struct Bench {
    ebpf: Ebpf,
    empty: Ebpf,
    syncer: Syncer<PinnedMaps>,
    uplink: u32,
    repeat: u32,
    rounds: usize,
    singles: u32,
}

impl Bench {
    fn run(
        &mut self,
        hook: Hook,
        empty: bool,
        frame: &[u8],
        repeat: u32,
    ) -> Result<(u32, f64, Vec<u8>)> {
        let uplink = self.uplink;
        match (hook, empty) {
            (Hook::Xdp, false) => run_xdp(
                xdp(&mut self.ebpf, programs::XDP_UPLINK)?,
                frame,
                uplink,
                repeat,
            ),
            (Hook::Xdp, true) => {
                run_xdp(xdp(&mut self.empty, "sb_empty_xdp")?, frame, uplink, repeat)
            }
            (Hook::Tc, false) => run_tc(
                tc(&mut self.ebpf, programs::TC_FROM_UPLINK)?,
                frame,
                uplink,
                repeat,
            ),
            (Hook::Tc, true) => run_tc(tc(&mut self.empty, "sb_empty_tc")?, frame, uplink, repeat),
        }
    }

    /// Median ns per packet over `rounds` runs of `repeat`; checks the verdict
    /// and that `counter` (if any) grew by exactly rounds × repeat.
    fn repeated(
        &mut self,
        hook: Hook,
        empty: bool,
        frame: &[u8],
        verdict: u32,
        counter: Option<&str>,
    ) -> Result<f64> {
        let before = counter.map(|c| stat(self.syncer.store(), c));
        let mut v = Vec::new();
        for _ in 0..self.rounds {
            let (ret, ns, _) = self.run(hook, empty, frame, self.repeat)?;
            ensure!(ret == verdict, "verdict {ret}, expected {verdict}");
            v.push(ns);
        }
        if let (Some(c), Some(before)) = (counter, before) {
            let grew = stat(self.syncer.store(), c) - before;
            let want = u64::from(self.repeat) * self.rounds as u64;
            ensure!(grew == want, "counter {c} grew by {grew}, expected {want}: the measured path is not the one intended");
        }
        Ok(median(&mut v))
    }

    /// Median kernel ns of `singles` runs with `repeat = 1` of `frame` (a
    /// fresh copy each time); checks the verdict and the counter.
    fn single(
        &mut self,
        hook: Hook,
        empty: bool,
        frame: &[u8],
        verdict: u32,
        counter: Option<&str>,
    ) -> Result<f64> {
        let before = counter.map(|c| stat(self.syncer.store(), c));
        let mut v = Vec::new();
        for _ in 0..self.singles {
            let (ret, ns, _) = self.run(hook, empty, frame, 1)?;
            ensure!(ret == verdict, "verdict {ret}, expected {verdict}");
            v.push(ns);
        }
        if let (Some(c), Some(before)) = (counter, before) {
            let grew = stat(self.syncer.store(), c) - before;
            ensure!(
                grew == u64::from(self.singles),
                "counter {c} grew by {grew}, expected {}",
                self.singles
            );
        }
        Ok(median(&mut v))
    }
}

pub(crate) fn uplink(quick: bool) -> Result<Value> {
    in_new_netns(move || measure(quick))
}

fn measure(quick: bool) -> Result<Value> {
    let uplink = build_node()?;
    let caps = Capacities {
        frontends: 1024,
        backends: 1024,
        conntrack: 4096,
        services: 64,
        ..Capacities::default()
    };
    let mut ebpf = object::load_unpinned(proxy_object::SWITCHBOARD, &caps)
        .context("loading switchboard's object")?;
    let maps = PinnedMaps::take(&mut ebpf)?;
    let mut syncer = Syncer::adopt(maps, caps);
    let frontends = vec![
        fe(
            FrontendKind::NodePort,
            NODE,
            NP_PINGPONG,
            "np-pingpong",
            (LB_LOCAL, LB_PINGPONG),
        ),
        fe(
            FrontendKind::LoadBalancer,
            LB_LOCAL,
            LB_PINGPONG,
            "lb-pingpong",
            (NODE, NP_PINGPONG),
        ),
        fe(
            FrontendKind::NodePort,
            NODE,
            NP_REMOTE,
            "np-remote",
            (POD_REMOTE, POD_PORT),
        ),
    ];
    program_node(&mut syncer, frontends, uplink)?;
    let mut b = Bench {
        ebpf,
        empty: load_empty()?,
        syncer,
        uplink,
        repeat: if quick { 200_000 } else { 2_000_000 },
        rounds: if quick { 3 } else { 5 },
        singles: if quick { 1000 } else { 5000 },
    };

    let local = frame(EXT_CLIENT, 40000, NODE, NP_PINGPONG);
    let not_ours = frame(EXT_CLIENT, 40001, NODE, 22);
    let remote = frame(EXT_CLIENT, 40002, NODE, NP_REMOTE);

    // The data path creates the flows: NodePort → LB address, then the LB
    // address (what the first run wrote) → NodePort, then the remote flow.
    let (ret, _, hop) = b.run(Hook::Xdp, false, &local, 1)?;
    ensure!(ret == XDP_PASS, "local new flow: verdict {ret}");
    ensure!(
        hop[30..34] == LB_LOCAL.octets(),
        "local new flow not DNATed to {LB_LOCAL}"
    );
    let (ret, _, back) = b.run(Hook::Xdp, false, &hop, 1)?;
    ensure!(
        ret == XDP_PASS && back[30..34] == NODE.octets(),
        "ping-pong back: verdict {ret}"
    );
    let (ret, _, out) = b.run(Hook::Xdp, false, &remote, 1)?;
    ensure!(
        ret == XDP_TX,
        "remote new flow: verdict {ret} (is the fib lookup failing?)"
    );
    ensure!(
        out[30..34] == POD_REMOTE.octets() && out[26..30] == NODE.octets(),
        "remote flow not DNAT+SNATed"
    );
    ensure!(
        out[0..6] == GATEWAY_MAC,
        "remote flow not sent to the gateway's MAC"
    );
    let snat_port = u16::from_be_bytes([out[34], out[35]]);
    let reply = frame(POD_REMOTE, POD_PORT, NODE, snat_port);
    let flows = b.syncer.store().conntrack_len();

    progress("uplink: empty XDP and tc programs, repeated and single runs");
    let empty_xdp = b.repeated(Hook::Xdp, true, &local, XDP_PASS, None)?;
    let empty_xdp_single = b.single(Hook::Xdp, true, &local, XDP_PASS, None)?;
    let empty_tc = b.repeated(Hook::Tc, true, &local, 0, None)?;
    let empty_tc_single = b.single(Hook::Tc, true, &local, 0, None)?;

    progress("uplink: sb_xdp_uplink");
    let xdp_local = b.repeated(Hook::Xdp, false, &local, XDP_PASS, Some("ext_local"))?;
    let xdp_not_ours = b.repeated(Hook::Xdp, false, &not_ours, XDP_PASS, None)?;
    let xdp_local_single = b.single(Hook::Xdp, false, &local, XDP_PASS, Some("ext_local"))?;
    let xdp_remote_single = b.single(Hook::Xdp, false, &remote, XDP_TX, Some("ext_remote"))?;
    let xdp_reply_single = b.single(Hook::Xdp, false, &reply, XDP_TX, Some("ext_reply"))?;

    progress("uplink: sb_from_uplink (tc twin)");
    let tc_local = b.repeated(Hook::Tc, false, &local, 0, Some("ext_local"))?;
    let tc_not_ours = b.repeated(Hook::Tc, false, &not_ours, u32::MAX, None)?;
    let tc_local_single = b.single(Hook::Tc, false, &local, 0, Some("ext_local"))?;
    let tc_remote_single = b.single(
        Hook::Tc,
        false,
        &remote,
        TC_ACT_REDIRECT,
        Some("ext_remote"),
    )?;
    ensure!(
        b.syncer.store().conntrack_len() == flows,
        "the measured runs created flows ({} → {}): not existing flows",
        flows,
        b.syncer.store().conntrack_len()
    );

    let xdp_overhead = empty_xdp_single - empty_xdp;
    let tc_overhead = empty_tc_single - empty_tc;
    let corrected = |single: f64, overhead: f64| single - overhead;
    let r = |a: f64, e: f64| a / e;
    let summary = format!(
        "uplink: empty XDP {empty_xdp:.1} ns; sb_xdp_uplink local {xdp_local:.1} ns ({:.2}x), not ours {xdp_not_ours:.1} ns ({:.2}x), remote ~{:.1} ns ({:.2}x, single runs corrected by {xdp_overhead:.1} ns), reply ~{:.1} ns; empty tc {empty_tc:.1} ns; sb_from_uplink local {tc_local:.1} ns ({:.2}x), not ours {tc_not_ours:.1} ns, remote ~{:.1} ns",
        r(xdp_local, empty_xdp),
        r(xdp_not_ours, empty_xdp),
        corrected(xdp_remote_single, xdp_overhead),
        r(corrected(xdp_remote_single, xdp_overhead), empty_xdp),
        corrected(xdp_reply_single, xdp_overhead),
        r(tc_local, empty_tc),
        corrected(tc_remote_single, tc_overhead),
    );
    progress(&summary);
    if !(xdp_local > 0.0 && empty_xdp > 0.0) {
        bail!("no timing from the kernel");
    }
    let case = |name: &str,
                prog: &str,
                ns: f64,
                empty: f64,
                how: &str,
                verdict: &str,
                raw: Option<f64>| {
        json!({
            "case": name, "program": prog, "ns": ns, "empty_ns": empty,
            "ratio": ns / empty, "how": how, "verdict": verdict, "single_raw_ns": raw,
        })
    };
    let rows = vec![
        case(
            "existing local flow (DNAT)",
            programs::XDP_UPLINK,
            xdp_local,
            empty_xdp,
            "repeat",
            "XDP_PASS",
            None,
        ),
        case(
            "existing remote flow (DNAT+SNAT, fib lookup)",
            programs::XDP_UPLINK,
            corrected(xdp_remote_single, xdp_overhead),
            empty_xdp,
            "single runs, corrected",
            "XDP_TX",
            Some(xdp_remote_single),
        ),
        case(
            "remote flow's reply",
            programs::XDP_UPLINK,
            corrected(xdp_reply_single, xdp_overhead),
            empty_xdp,
            "single runs, corrected",
            "XDP_TX",
            Some(xdp_reply_single),
        ),
        case(
            "not ours (TCP to the node's port 22)",
            programs::XDP_UPLINK,
            xdp_not_ours,
            empty_xdp,
            "repeat",
            "XDP_PASS",
            None,
        ),
        case(
            "existing local flow (DNAT)",
            programs::TC_FROM_UPLINK,
            tc_local,
            empty_tc,
            "repeat",
            "TC_ACT_OK",
            None,
        ),
        case(
            "existing remote flow (DNAT+SNAT, redirect_neigh)",
            programs::TC_FROM_UPLINK,
            corrected(tc_remote_single, tc_overhead),
            empty_tc,
            "single runs, corrected",
            "TC_ACT_REDIRECT",
            Some(tc_remote_single),
        ),
        case(
            "not ours (TCP to the node's port 22)",
            programs::TC_FROM_UPLINK,
            tc_not_ours,
            empty_tc,
            "repeat",
            "TC_ACT_UNSPEC",
            None,
        ),
    ];
    Ok(json!({
        "kind": "uplink",
        "repeat": b.repeat,
        "rounds": b.rounds,
        "single_shot_samples": b.singles,
        "frame_bytes": local.len(),
        "empty_xdp_ns": empty_xdp,
        "empty_xdp_single_ns": empty_xdp_single,
        "empty_tc_ns": empty_tc,
        "empty_tc_single_ns": empty_tc_single,
        "timer_overhead_xdp_ns": xdp_overhead,
        "timer_overhead_tc_ns": tc_overhead,
        "check_local_single_corrected_xdp_ns": corrected(xdp_local_single, xdp_overhead),
        "check_local_single_corrected_tc_ns": corrected(tc_local_single, tc_overhead),
        "rows": rows,
        "method": "BPF_PROG_TEST_RUN in a private network namespace with a veth uplink (neighbours and routes so bpf_fib_lookup succeeds); repeated cases: median of rounds of `repeat` runs (a NodePort whose backend is a local LoadBalancer address whose backend is the NodePort, so every repetition is a conntrack hit and a DNAT, checked by the ext_local counter); remote cases: median of single runs of one tracked flow, minus the timer overhead (single empty run − repeated empty run)",
    }))
}
