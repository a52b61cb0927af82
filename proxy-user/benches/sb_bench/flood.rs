//! `flood`: a fixed-duration UDP flood from one CPU, for the north-south
//! forwarding rate (`cargo xtask bench` runs it in an external client's
//! namespace of the two-node sandbox and counts what reaches the pods).
//!
//! ```text
//! sb_bench flood --dst IP:PORT [--dst ...] [--secs S] [--cpu C] [--flows N]
//!                [--batch B] [--payload BYTES]
//! ```
//!
//! `N` unconnected UDP sockets (one source port each, so `N` flows per
//! destination), pinned to CPU `C`, send with `sendmmsg` in batches of `B`
//! datagrams, round-robin over the sockets and destinations, until `S`
//! seconds have passed. Unconnected sockets ignore the ICMP errors a pod
//! without listener sends back. Prints what was sent and when.
use std::{
    net::{SocketAddrV4, UdpSocket},
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, ensure, Result};
use serde_json::{json, Value};

use crate::common::pin_to_cpu;

fn sockaddr(dst: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: dst.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(dst.ip().octets()),
        },
        sin_zero: [0; 8],
    }
}

pub(crate) fn flood(rest: &[String]) -> Result<Value> {
    let mut dsts: Vec<SocketAddrV4> = Vec::new();
    let mut secs = 3.0f64;
    let mut cpu = 1usize;
    let mut flows = 4usize;
    let mut batch = 64usize;
    let mut payload = 18usize; // 14 + 20 + 8 + 18 = 60-byte frames
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        let mut val = || it.next().ok_or_else(|| anyhow!("{arg} needs a value"));
        match arg.as_str() {
            "--dst" => dsts.push(val()?.parse()?),
            "--secs" => secs = val()?.parse()?,
            "--cpu" => cpu = val()?.parse()?,
            "--flows" => flows = val()?.parse()?,
            "--batch" => batch = val()?.parse()?,
            "--payload" => payload = val()?.parse()?,
            other => bail!("flood: unknown argument {other}"),
        }
    }
    ensure!(!dsts.is_empty(), "flood needs --dst IP:PORT");
    ensure!(
        flows > 0 && batch > 0,
        "--flows and --batch must be positive"
    );
    pin_to_cpu(cpu)?;

    let sockets: Vec<UdpSocket> = (0..flows)
        .map(|_| UdpSocket::bind("0.0.0.0:0"))
        .collect::<std::io::Result<_>>()?;
    let data = vec![0x5au8; payload];
    // One batch per (socket, destination): the headers point at `data` and
    // at that destination.
    let addrs: Vec<libc::sockaddr_in> = dsts.iter().map(|d| sockaddr(*d)).collect();
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut batches: Vec<Vec<libc::mmsghdr>> = addrs
        .iter()
        .map(|a| {
            (0..batch)
                .map(|_| {
                    // SAFETY: all-zero is a valid mmsghdr; the pointers set
                    // below stay valid while `addrs`, `iov` and `data` live.
                    let mut m: libc::mmsghdr = unsafe { std::mem::zeroed() };
                    m.msg_hdr.msg_name = a as *const libc::sockaddr_in as *mut libc::c_void;
                    m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
                    m.msg_hdr.msg_iov = &mut iov;
                    m.msg_hdr.msg_iovlen = 1;
                    m
                })
                .collect()
        })
        .collect();

    let duration = Duration::from_secs_f64(secs);
    let mut sent: u64 = 0;
    let mut errors: u64 = 0;
    let mut calls: u64 = 0;
    let started = Instant::now();
    'outer: loop {
        for s in &sockets {
            for b in batches.iter_mut() {
                // SAFETY: `b` holds `batch` initialised headers (see above).
                let n = unsafe { libc::sendmmsg(s.as_raw_fd(), b.as_mut_ptr(), b.len() as u32, 0) };
                calls += 1;
                if n < 0 {
                    errors += 1;
                } else {
                    sent += n as u64;
                }
            }
            if calls.is_multiple_of(16) && started.elapsed() >= duration {
                break 'outer;
            }
        }
        if started.elapsed() >= duration {
            break;
        }
    }
    let wall = started.elapsed().as_secs_f64();
    drop(batches);
    Ok(json!({
        "kind": "flood",
        "sent": sent,
        "send_errors": errors,
        "sendmmsg_calls": calls,
        "wall_s": wall,
        "sent_pps": sent as f64 / wall,
        "cpu": cpu,
        "flows": flows,
        "batch": batch,
        "frame_bytes": 14 + 20 + 8 + payload,
        "destinations": dsts.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
    }))
}
