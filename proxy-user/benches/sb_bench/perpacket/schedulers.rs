//! The per-node schedulers in `perpacket`: a new flow's cost under each
//! algorithm next to `random`, and the balance each reaches over 10k new
//! flows of mixed lengths, run through the kernel program, against IPVS
//! `lc`'s ideal (always the least loaded backend, computed here).
use std::net::Ipv4Addr;

use anyhow::{ensure, Result};
use aya::programs::{TestRun as _, TestRunOptions};
use proxy_common::programs;
use proxy_user::model::{BackendAddr, DesiredState, Frontend, LbAlgorithm};
use serde_json::{json, Value};

use super::{frame_tcp, measure_single, PerPacket};
use crate::common::*;

/// The algorithms measured, `random` first (the reference).
const ALGORITHMS: [LbAlgorithm; 3] = [
    LbAlgorithm::Random,
    LbAlgorithm::RoundRobin,
    LbAlgorithm::LeastConn,
];

/// `desired` with the frontend at `vip` picking by `algorithm`; `weighted`:
/// its first backend weighs 3 (`switchboard.io/weights`), the others 1.
fn with_algorithm(
    desired: &DesiredState,
    vip: Ipv4Addr,
    algorithm: LbAlgorithm,
    weighted: bool,
) -> DesiredState {
    let mut out = desired.clone();
    for f in out.frontends.values_mut() {
        if f.addr.ip == vip {
            f.algorithm = Some(algorithm);
            if let (true, Some(first)) = (weighted, f.backends.first()) {
                f.weights = vec![(*first, 3)].into();
            }
        }
    }
    out
}

/// The new-flow cases: each algorithm, then `random` over a weighted set
/// (the pick is the same slot lookup over a longer slot table).
const CASES: [(&str, LbAlgorithm, bool); 4] = [
    ("random", LbAlgorithm::Random, false),
    ("round-robin", LbAlgorithm::RoundRobin, false),
    ("least-conn", LbAlgorithm::LeastConn, false),
    ("weighted random", LbAlgorithm::Random, true),
];

/// Rounds of [`new_flow_costs`]: the algorithms take turns, so none is
/// always measured first (on colder caches).
const ROUNDS: u32 = 5;

/// The single-shot cost of a new flow to ping-pong frontend A under each
/// algorithm (fresh source ports from `next_sport` on): the median of
/// [`ROUNDS`] interleaved rounds' medians, and their spread (min, max).
/// Then A is `desired` again.
pub(super) fn new_flow_costs(
    pp: &mut PerPacket,
    desired: &DesiredState,
    singles: u32,
    next_sport: &mut u32,
) -> Result<Value> {
    let mut medians: Vec<Vec<f64>> = vec![Vec::new(); CASES.len()];
    for _ in 0..ROUNDS {
        for (i, (_, algorithm, weighted)) in CASES.into_iter().enumerate() {
            pp.apply(&with_algorithm(desired, VIP_A, algorithm, weighted))?;
            let frames: Vec<Vec<u8>> = (0..singles.div_ceil(ROUNDS))
                .map(|_| {
                    *next_sport += 1;
                    let src = nth_ip(Ipv4Addr::new(10, 244, 200, 0), *next_sport / 60_000);
                    frame_tcp(src, 1024 + (*next_sport % 60_000) as u16, VIP_A, 80, 0x02)
                })
                .collect();
            medians[i].push(measure_single(
                tc(&mut pp.ebpf, programs::TC_FROM_POD)?,
                frames.into_iter(),
                TC_ACT_OK,
            )?);
        }
    }
    pp.apply(desired)?;
    let mut out = serde_json::Map::new();
    for ((name, _, _), mut m) in CASES.into_iter().zip(medians) {
        let (lo, hi) = (
            m.iter().copied().fold(f64::INFINITY, f64::min),
            m.iter().copied().fold(0.0, f64::max),
        );
        out.insert(
            name.into(),
            json!({"ns": median(&mut m), "min": lo, "max": hi}),
        );
    }
    Ok(Value::Object(out))
}

const BALANCE_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 50, 1);
const BALANCE_BACKENDS: u32 = 10;
const BALANCE_FLOWS: u32 = 10_000;
/// Samples before this many flows opened are not counted (the long flows
/// have not piled up yet).
const WARMUP: u32 = 2_000;

/// A small deterministic generator (xorshift64), so every algorithm sees
/// the same flows.
struct Lengths(u64);

impl Lengths {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// A flow's length in steps (one new flow per step): 80% short
    /// (1..=20), 20% long (200..=2000).
    fn length(&mut self) -> u32 {
        let r = self.next();
        if r % 100 < 80 {
            1 + (r >> 8) as u32 % 20
        } else {
            200 + (r >> 8) as u32 % 1801
        }
    }
}

/// The backend index a new flow goes to: through the kernel program (an
/// algorithm) or the ideal least-connection choice (`None`).
fn balance_run(pp: &mut PerPacket, algorithm: Option<LbAlgorithm>) -> Result<Value> {
    let backends: Vec<Ipv4Addr> = (1..=BALANCE_BACKENDS)
        .map(|i| nth_ip(Ipv4Addr::new(10, 211, 0, 0), i))
        .collect();
    let lengths: Vec<u32> = {
        let mut g = Lengths(0x9e37_79b9_7f4a_7c15);
        (0..BALANCE_FLOWS).map(|_| g.length()).collect()
    };
    let mut active = vec![0u32; backends.len()];
    // (end step, client port index, backend index) of each open flow.
    let mut open: Vec<(u32, u32, usize)> = Vec::new();
    let mut ratios = Vec::new();
    let mut worst: f64 = 0.0;
    for step in 0..BALANCE_FLOWS {
        let (ending, still): (Vec<_>, Vec<_>) = open.into_iter().partition(|f| f.0 <= step);
        open = still;
        for (_, i, backend) in ending {
            active[backend] -= 1;
            if algorithm.is_some() {
                let (verdict, _) = run_once(pp, &flow_frame(i, 0x04))?;
                ensure!(
                    verdict == TC_ACT_OK,
                    "the RST of flow {i}: verdict {verdict:#x}"
                );
            }
        }
        let backend = match algorithm {
            Some(_) => {
                let (verdict, out) = run_once(pp, &flow_frame(step, 0x02))?;
                ensure!(
                    verdict == TC_ACT_OK,
                    "the SYN of flow {step}: verdict {verdict:#x}"
                );
                let dst = Ipv4Addr::new(out[30], out[31], out[32], out[33]);
                backends
                    .iter()
                    .position(|b| *b == dst)
                    .ok_or_else(|| anyhow::anyhow!("flow {step} went to {dst}"))?
            }
            None => (0..active.len()).min_by_key(|i| active[*i]).unwrap_or(0),
        };
        active[backend] += 1;
        open.push((step + lengths[step as usize], step, backend));
        if step >= WARMUP {
            let total: u32 = active.iter().sum();
            let mean = f64::from(total) / active.len() as f64;
            let max = f64::from(*active.iter().max().unwrap_or(&0));
            ratios.push(max / mean);
            worst = worst.max(max / mean);
        }
    }
    // The open flows end, so the next run starts from zero counts.
    if algorithm.is_some() {
        for (_, i, _) in open {
            run_once(pp, &flow_frame(i, 0x04))?;
        }
    }
    let mean_ratio = ratios.iter().sum::<f64>() / ratios.len().max(1) as f64;
    Ok(json!({
        "algorithm": algorithm.map_or("ideal lc (IPVS)", LbAlgorithm::as_str),
        "max_over_mean_avg": mean_ratio,
        "max_over_mean_worst": worst,
    }))
}

/// A segment of balance flow `i` (its own client address and port) with
/// TCP `flags`.
fn flow_frame(i: u32, flags: u8) -> Vec<u8> {
    let src = nth_ip(Ipv4Addr::new(10, 244, 210, 0), 1 + i / 50_000);
    frame_tcp(src, 1024 + (i % 50_000) as u16, BALANCE_VIP, 80, flags)
}

/// One run of `sb_from_pod` on `frame`: its verdict and output frame.
fn run_once(pp: &mut PerPacket, frame: &[u8]) -> Result<(u32, Vec<u8>)> {
    let prog = tc(&mut pp.ebpf, programs::TC_FROM_POD)?;
    let mut out = vec![0u8; frame.len() + 256];
    let r = prog.test_run(TestRunOptions {
        data_in: Some(frame),
        data_out: Some(&mut out),
        repeat: 1,
        ..TestRunOptions::default()
    })?;
    Ok((r.return_value, out))
}

/// The balance over [`BALANCE_FLOWS`] new flows of mixed lengths to one
/// frontend of [`BALANCE_BACKENDS`] backends, per algorithm and for the
/// ideal least-connection choice: the maximum over the mean of the
/// backends' active flows, averaged over every new flow after the warm-up
/// (and its worst).
pub(super) fn balance(pp: &mut PerPacket) -> Result<Value> {
    let backends: Vec<BackendAddr> = (1..=BALANCE_BACKENDS)
        .map(|i| BackendAddr {
            ip: nth_ip(Ipv4Addr::new(10, 211, 0, 0), i).into(),
            port: 8080,
        })
        .collect();
    let mut rows = vec![balance_run(pp, None)?];
    for algorithm in ALGORITHMS {
        let f: Frontend = Frontend {
            algorithm: Some(algorithm),
            ..frontend(BALANCE_VIP, 80, "balance", backends.clone())
        };
        pp.apply(&DesiredState {
            frontends: [(f.addr, f)].into_iter().collect(),
        })?;
        rows.push(balance_run(pp, Some(algorithm))?);
    }
    Ok(json!({
        "backends": BALANCE_BACKENDS,
        "flows": BALANCE_FLOWS,
        "warmup_flows": WARMUP,
        "lengths": "80% 1-20 new flows long, 20% 200-2000",
        "rows": rows,
    }))
}
