//! switchboard's in-process benchmarks (`harness = false`). `cargo xtask bench`
//! builds this with `cargo bench --no-run` and runs the executable as root,
//! inside the sandbox's node namespace where a mode needs interfaces.
//!
//! ```text
//! sb_bench perpacket [--quick]                    per-packet cost, BPF_PROG_TEST_RUN
//! sb_bench sync [--quick]                         control plane: model + map sync
//! sb_bench change [--quick]                       one EndpointSlice change → maps (incremental model), 1k–100k Services
//! sb_bench fwd --ingress IF --pod IF:NS:IP ...    forwarding pps with XDP live frames
//! sb_bench uplink [--quick]                       per-packet cost of the uplink (north-south) programs
//! sb_bench xdpfwd [--quick] [--iptables F] [--nftables F]  uplink forwarding Mpps with XDP live frames
//! sb_bench flood --dst IP:PORT ... [--secs S]     UDP flood from one CPU (north-south forwarding)
//! sb_bench ... --out FILE                          JSON to FILE instead of stdout
//! ```
//!
//! Every figure printed is measured in this run; nothing is estimated.
//!
//! Modules: `perpacket` (tc per-packet cost), `sync` (control plane),
//! `change` (one change through the incremental model), `fwd`
//! (tc forwarding rate with XDP live frames), `uplink` (per-packet cost of
//! the north-south XDP and tc programs), `xdpfwd` (the uplink's forwarding
//! rate in Mpps, XDP live frames), `flood` (the UDP sender of the
//! north-south forwarding rate), `common` (helpers they share).
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
// The crate root is this file (Cargo.toml names it), so the modules under
// sb_bench/ are named by path.
#[path = "sb_bench/change.rs"]
mod change;
#[path = "sb_bench/common.rs"]
mod common;
#[path = "sb_bench/flood.rs"]
mod flood;
#[path = "sb_bench/fwd.rs"]
mod fwd;
#[path = "sb_bench/perpacket.rs"]
mod perpacket;
#[path = "sb_bench/sync.rs"]
mod sync;
#[path = "sb_bench/uplink.rs"]
mod uplink;
#[path = "sb_bench/xdpfwd.rs"]
mod xdpfwd;

use std::{fs, path::PathBuf};

use anyhow::{anyhow, bail, ensure, Context as _, Result};

use common::EMPTY_OBJECT;

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
            "perpacket" | "sync" | "change" | "fwd" | "uplink" | "xdpfwd" | "flood"
                if mode.is_none() =>
            {
                mode = Some(arg)
            }
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
            "sb_bench: nothing measured. Usage: sb_bench (perpacket | sync | change | fwd ... | uplink | xdpfwd ... | flood ...) [--quick] [--out FILE], as root; `cargo xtask bench` runs all of them"
        );
        return Ok(());
    }
    ensure!(
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() } == 0,
        "sb_bench loads eBPF programs: run it as root (`cargo xtask bench` does)"
    );
    ensure!(
        !EMPTY_OBJECT.is_empty(),
        "this build has no eBPF objects (bpf-linker was missing): run `cargo xtask setup` and rebuild"
    );
    let result = match args.mode.as_str() {
        "perpacket" => perpacket::perpacket(args.quick)?,
        "sync" => sync::sync_bench(args.quick)?,
        "change" => change::change_bench(args.quick)?,
        "fwd" => fwd::fwd(&args.rest)?,
        "uplink" => uplink::uplink(args.quick)?,
        "xdpfwd" => xdpfwd::xdpfwd(args.quick, &args.rest)?,
        "flood" => flood::flood(&args.rest)?,
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

pub(crate) fn progress(msg: &str) {
    eprintln!("sb_bench: {msg}");
}
