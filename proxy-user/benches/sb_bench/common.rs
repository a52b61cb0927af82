//! Helpers shared by the modes: the empty programs, BPF_PROG_TEST_RUN
//! wrappers, statistics, namespaces and CPUs.
use std::{
    fs,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::{anyhow, ensure, Context as _, Result};
use aya::{
    programs::{ProgramError, SchedClassifier, TestRun as _, TestRunOptions, Xdp},
    sys::SyscallError,
    Ebpf, EbpfLoader,
};
use proxy_user::{
    dataplane::maps::PinnedMaps,
    model::{BackendAddr, Frontend, FrontendAddr, Protocol, ServicePortName},
};

/// The benchmark floor: proxy-ebpf's `sb-empty` bin (empty tc and XDP programs).
pub(crate) static EMPTY_OBJECT: &[u8] = proxy_object::EMPTY;

pub(crate) const TC_ACT_OK: u32 = 0;
pub(crate) const TC_ACT_UNSPEC: u32 = u32::MAX;

pub(crate) const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
pub(crate) const VIP_A: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
pub(crate) const VIP_B: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 11);
pub(crate) const VIP_SELF: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 12);
pub(crate) const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
pub(crate) const CLIENT_PORT: u16 = 40000;
/// Frame size of every per-packet case: 14 + 20 + 20 + 20 bytes, the size of a
/// TCP SYN with the usual 20 bytes of options (what BRIEF.md's floor used).
pub(crate) const FRAME_PAYLOAD: usize = 20;

pub(crate) fn frontend(
    ip: impl Into<std::net::IpAddr>,
    port: u16,
    name: &str,
    backends: Vec<BackendAddr>,
) -> Frontend {
    Frontend::cluster_ip(
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
        backends,
    )
}

/// Why the kernel will not run XDP live frames (`BPF_F_TEST_XDP_LIVE_FRAMES`),
/// when `err`, from a live-frame test run, is that refusal: EPERM from a
/// kernel built to forbid the flag (as the 6.18.44 of these machines is), or
/// EOPNOTSUPP/ENOTSUPP from one that lacks the test run for XDP. Any other
/// error is the bench's own and is `None`, so it still fails the run.
pub(crate) fn live_frames_refused(err: &anyhow::Error) -> Option<String> {
    /// The kernel's internal ENOTSUPP, which the syscall returns as is.
    const ENOTSUPP: i32 = 524;
    let io_error = err.chain().find_map(|e| match e.downcast_ref() {
        Some(ProgramError::SyscallError(SyscallError { io_error, .. })) => Some(io_error),
        _ => None,
    })?;
    let why = match io_error.raw_os_error()? {
        libc::EPERM => "refuses",
        libc::EOPNOTSUPP | ENOTSUPP => "does not support",
        _ => return None,
    };
    Some(format!(
        "not measured: this kernel {why} BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES ({io_error}), the only sender here that needs no userspace"
    ))
}

/// The output of a live-frame mode (`kind`) that could not measure: no
/// rows, and `why` where the report looks for it.
pub(crate) fn live_frames_unavailable(kind: &str, why: &str) -> serde_json::Value {
    crate::progress(&format!("{kind}: {why}"));
    serde_json::json!({"kind": kind, "meta": {}, "rows": [], "not_measured": why})
}

pub(crate) fn nth_ip(base: Ipv4Addr, n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(base) + n)
}

pub(crate) fn tc<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing"))?
        .try_into()
        .map_err(|e| anyhow!("{name} is not a tc program: {e}"))
}

pub(crate) fn xdp<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing"))?
        .try_into()
        .map_err(|e| anyhow!("{name} is not an XDP program: {e}"))
}

pub(crate) fn load_empty() -> Result<Ebpf> {
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
pub(crate) fn run_repeat(prog: &SchedClassifier, frame: &[u8], repeat: u32) -> Result<(u32, f64)> {
    let mut out = vec![0u8; frame.len() + 256];
    let started = Instant::now();
    let r = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat,
            ..TestRunOptions::default()
        })
        .context("BPF_PROG_TEST_RUN")?;
    Ok((
        r.return_value,
        ns_per_run(r.duration, started.elapsed(), repeat),
    ))
}

/// Repetitions below this are timed by the kernel alone: the call's own
/// cost (microseconds) would weigh in the wall clock's figure.
const REFINE_FROM: u32 = 10_000;

/// Nanoseconds per repetition of one repeated test run, to a fraction of a
/// nanosecond. The kernel reports whole nanoseconds rounded down
/// (`kernel`: 17 stands for anything from 17.0 to 17.99), too coarse for a
/// ratio next to its target (17 ÷ 14 is 1.13 to 1.28). The wall clock
/// around the call (`wall`) over `repeat` runs places the figure inside
/// that nanosecond: the call's fixed cost, a few microseconds, adds well
/// under 0.01 ns per repetition at these counts. A wall figure past the
/// kernel's nanosecond means the thread waited during the call (the
/// kernel's timer leaves such waits out); then the middle of the
/// nanosecond stands.
pub(crate) fn ns_per_run(kernel: Duration, wall: Duration, repeat: u32) -> f64 {
    let floor = kernel.as_nanos() as f64;
    if repeat < REFINE_FROM {
        return floor;
    }
    let per_run = wall.as_nanos() as f64 / f64::from(repeat);
    if (floor..floor + 1.0).contains(&per_run) {
        per_run
    } else {
        floor + 0.5
    }
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

pub(crate) fn stat(maps: &PinnedMaps, name: &str) -> u64 {
    maps.global_stats()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v)
}

/// `struct xdp_md` (the context BPF_PROG_TEST_RUN takes for XDP programs).
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct XdpMd {
    pub(crate) data: u32,
    pub(crate) data_end: u32,
    pub(crate) data_meta: u32,
    pub(crate) ingress_ifindex: u32,
    pub(crate) rx_queue_index: u32,
    pub(crate) egress_ifindex: u32,
}

/// The namespace helpers the modes share with the tests.
pub(crate) use proxy_testkit::netns::{ifindex, in_netns, in_new_netns, ip, mac_text};

/// The MAC address of interface `name` in the calling thread's namespace.
pub(crate) fn mac(name: &str) -> Result<[u8; 6]> {
    let text = fs::read_to_string(format!("/sys/class/net/{name}/address"))?;
    let bytes: Vec<u8> = text
        .trim()
        .split(':')
        .map(|h| u8::from_str_radix(h, 16))
        .collect::<Result<_, _>>()?;
    bytes.try_into().map_err(|_| anyhow!("bad MAC {text}"))
}

pub(crate) fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside
    // it; sched_setaffinity(0, ..) affects the calling thread only.
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
