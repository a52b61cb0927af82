//! The benchmark's clients and what they report: wrk (new TCP connections
//! per second, `Connection: close`, and latency), `sb-http udp`
//! (request/response rate) and `sb-http bulk` (one TCP stream), each run
//! as several processes in parallel where a row has several clients.

use std::process::{Command, Output};

use anyhow::{anyhow, ensure, Context, Result};
use serde::Deserialize;

use super::paths::Client;
use super::stats::median;
use crate::sandbox::Sandbox;
use crate::util::{run_capture, show};

/// wrk's figures: requests (= connections, with `Connection: close`) per
/// second and latency percentiles in microseconds.
#[derive(Debug, Default)]
pub struct Wrk {
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub requests: u64,
    pub errors: u64,
    /// Connections/s of each client (several wrk run in parallel).
    pub per_client: Vec<f64>,
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

pub fn parse_wrk(text: &str) -> Result<Wrk> {
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
pub const WRK_CONNECTIONS: &str = "11";
/// UDP flows per client (sockets doing request/response in lockstep).
const UDP_FLOWS: &str = "3";

/// Starts every command, then waits for all of them; fails if one failed.
pub fn run_parallel(cmds: Vec<Command>) -> Result<Vec<Output>> {
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

/// wrk's arguments for one client of `url`: one thread, [`WRK_CONNECTIONS`]
/// connections, `Connection: close`, `--latency`, for `secs` seconds.
pub fn wrk_args(url: &str, secs: u32) -> Vec<String> {
    [
        "wrk",
        "-t",
        "1",
        "-c",
        WRK_CONNECTIONS,
        "-d",
        &format!("{secs}s"),
        "--latency",
        "-H",
        "Connection: close",
        url,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Runs the wrk commands in parallel and sums them: connections/s,
/// requests and errors summed; p50 the median of the clients' p50s, p99 the
/// largest of their p99s.
pub fn run_wrk(cmds: Vec<Command>) -> Result<Wrk> {
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

/// One wrk per URL as `client`, in parallel ([`run_wrk`]).
pub fn wrk(sb: &Sandbox, client: Client, urls: &[String], secs: u32) -> Result<Wrk> {
    let cmds = urls
        .iter()
        .map(|url| {
            let args = wrk_args(url, secs);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            client.command(sb, &args)
        })
        .collect::<Result<Vec<_>>>()?;
    run_wrk(cmds)
}

/// What one `sb-http udp` reports.
#[derive(Debug, Deserialize)]
struct UdpClient {
    requests: u64,
    rate: f64,
    p50_us: f64,
    p99_us: f64,
}

/// The UDP clients of one measurement together.
#[derive(Debug, Clone, Copy)]
pub struct Udp {
    pub rate: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// One `sb-http udp` per address, in parallel, [`UDP_FLOWS`] flows each:
/// rates summed, p50 the median of the clients' p50s,
/// p99 the largest of their p99s.
pub fn udp(sb: &Sandbox, client: Client, sb_http: &str, addrs: &[String], ms: u32) -> Result<Udp> {
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
        let run: UdpClient = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "sb-http udp output: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })?;
        ensure!(run.requests > 0, "no UDP answer from {addr}: {run:?}");
        runs.push(run);
    }
    Ok(Udp {
        rate: runs.iter().map(|r| r.rate).sum(),
        p50_us: median(runs.iter().map(|r| r.p50_us).collect()),
        p99_us: runs.iter().map(|r| r.p99_us).fold(0.0, f64::max),
    })
}

/// What `sb-http bulk` reports: one TCP stream's rate.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct Bulk {
    pub gbit_s: f64,
}

/// One `sb-http bulk` stream to `addr` as `client`, for `ms`.
pub fn bulk(sb: &Sandbox, client: Client, sb_http: &str, addr: &str, ms: u32) -> Result<Bulk> {
    let ms = ms.to_string();
    let out = run_capture(
        &mut client.command(sb, &[sb_http, "bulk", "--addr", addr, "--duration-ms", &ms])?,
    )?;
    serde_json::from_slice(&out.stdout).context("sb-http bulk output")
}
