//! Rejecting, as kube-proxy does: a TCP or UDP packet to a frontend without
//! endpoints is answered with an ICMP port unreachable (type 3, code 3) from
//! the frontend address the client used, so a TCP connect fails at once with
//! "connection refused" and a connected UDP socket gets `ECONNREFUSED`,
//! instead of waiting for a timeout.
//!
//! The packet itself becomes the answer: its first bytes are copied to the
//! stack, the packet is cut (or grown) to [`FRAME_LEN`] bytes and rewritten as
//!
//! ```text
//! Ethernet  addresses swapped
//! IPv4      20 bytes: src = the frontend, dst = the client, TTL 64,
//!           id 0, no DF, protocol ICMP (1), fresh checksum
//! ICMP      type 3 code 3, checksum, 4 unused bytes
//! quoted    the original IPv4 header (20 bytes) + the first 8 bytes of
//!           its TCP/UDP header (RFC 792): ports, and the TCP sequence
//!           number the client's kernel checks the error against
//! ```
//!
//! and sent back out of the interface it came in on: tc redirects it to that
//! interface's egress (for a pod veth's ingress that delivers it into the
//! pod), XDP transmits it (`XDP_TX`).
//!
//! What is never answered (dropped and counted as `drop_no_backend`, as before):
//! - packets with IPv4 options: RFC 792 asks to quote the whole header with
//!   its options; a fixed 20-byte quote keeps the copy a constant-size stack
//!   buffer the verifier accepts, and no client sends options to a Service;
//! - non-first fragments (they carry no ports; the parsers pass every fragment
//!   today, this guards against that changing), and anything that is not TCP
//!   or UDP: an ICMP error never answers an ICMP packet, so two rejecting
//!   nodes cannot ping-pong;
//! - sources that are not one host (0.0.0.0, multicast, limited broadcast;
//!   RFC 1122 3.2.2);
//! - `internalTrafficPolicy: Local` ClusterIP frontends without endpoints:
//!   kube-proxy drops traffic to those ("no local endpoints"), and the data
//!   path cannot tell that from "no endpoints at all" (then kube-proxy would
//!   reject). `externalTrafficPolicy: Local` without local endpoints from
//!   outside is decided in [`crate::nodeport`] and also drops.
//!
//! Not rate limited (the kernel's own `icmp_ratelimit` does not apply to us):
//! the answer goes only to the packet's source, is at most 28 bytes longer
//! than the smallest packet that triggers it, and a pod can only reach itself.
//!
//! A skb that arrives `CHECKSUM_PARTIAL` (from a veth) keeps that state: the
//! answer goes straight back into the veth, whose receiver trusts it as
//! checked; nothing on that path finishes the (stale) partial checksum.
use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_SHOT},
    helpers::{bpf_redirect, bpf_skb_change_tail, bpf_skb_load_bytes, bpf_xdp_adjust_tail},
    programs::{TcContext, XdpContext},
};
use proxy_common::{frontend_flags, stat, Frontend};

use crate::{
    maps::count,
    packet::{Flow, ETH_HLEN, IPV4_MIN_HLEN},
};

/// The original IPv4 header plus 8 bytes of its payload.
const QUOTE_LEN: usize = IPV4_MIN_HLEN + 8;
/// ICMP header: type, code, checksum, 4 unused bytes.
const ICMP_HLEN: usize = 8;
/// The whole answer, Ethernet header included.
pub const FRAME_LEN: usize = ETH_HLEN + IPV4_MIN_HLEN + ICMP_HLEN + QUOTE_LEN;
const ICMP_OFF: usize = ETH_HLEN + IPV4_MIN_HLEN;
const QUOTE_OFF: usize = ICMP_OFF + ICMP_HLEN;

const PROTO_ICMP: u8 = 1;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_PORT_UNREACH: u8 = 3;
/// Fragment offset (host order), without the flags.
const IP_OFFSET_MASK: u16 = 0x1fff;

/// Whether a frontend whose backend set is empty is answered with an ICMP
/// error (`true`) or dropped: everything but an `internalTrafficPolicy:
/// Local` ClusterIP frontend (see the module's documentation).
#[inline(always)]
pub fn rejects(svc: &Frontend) -> bool {
    let kind = svc.flags & frontend_flags::KIND_MASK;
    !(svc.flags & frontend_flags::LOCAL_ONLY != 0 && kind == frontend_flags::KIND_CLUSTER_IP)
}

/// `sb_from_pod`: a packet to frontend `svc`, whose backend set is empty,
/// is rejected ([`tc_reject`]) or dropped ([`rejects`]).
#[inline(always)]
pub fn from_pod(ctx: &TcContext, flow: &Flow, svc: &Frontend) -> i32 {
    if rejects(svc) {
        tc_reject(ctx, flow)
    } else {
        tc_drop()
    }
}

/// `sb_from_pod` / `sb_from_uplink`: answers `flow` (to a frontend without
/// endpoints) with an ICMP port unreachable sent back out of the interface it
/// came in on (`TC_ACT_REDIRECT`), or drops it when it must not be answered or
/// the packet cannot be reshaped. The per-service counter is the caller's.
#[inline(always)]
pub fn tc_reject(ctx: &TcContext, flow: &Flow) -> i32 {
    if !answerable(flow) {
        return tc_drop();
    }
    let skb = ctx.skb.skb;
    let mut eth = [0u8; 12];
    let mut quote = [0u8; QUOTE_LEN];
    // SAFETY: the helpers copy constant lengths into stack buffers of exactly
    // that size; `skb` is this program's context.
    let loaded = unsafe {
        bpf_skb_load_bytes(skb as *const _, 0, eth.as_mut_ptr() as *mut _, 12) == 0
            && bpf_skb_load_bytes(
                skb as *const _,
                ETH_HLEN as u32,
                quote.as_mut_ptr() as *mut _,
                QUOTE_LEN as u32,
            ) == 0
    };
    if !loaded || is_later_fragment(&quote) {
        return tc_drop();
    }
    let frame = build(&eth, &quote);
    // SAFETY: resizing helper on our own context; no packet pointer is used
    // after it.
    if unsafe { bpf_skb_change_tail(skb, FRAME_LEN as u32, 0) } != 0 {
        return tc_drop();
    }
    if ctx.store(0, &frame, 0).is_err() {
        return tc_drop();
    }
    count(stat::REJECTED);
    // SAFETY: reads of our context, then a helper without memory arguments.
    unsafe { bpf_redirect((*skb).ifindex, 0) as i32 }
}

#[inline(always)]
fn tc_drop() -> i32 {
    count(stat::DROP_NO_BACKEND);
    TC_ACT_SHOT as i32
}

/// `sb_xdp_uplink`: the same as [`tc_reject`], answered with `XDP_TX`.
#[inline(always)]
pub fn xdp_reject(ctx: &XdpContext, flow: &Flow) -> u32 {
    if !answerable(flow) {
        return xdp_drop();
    }
    let start = ctx.data();
    if start + ETH_HLEN + QUOTE_LEN > ctx.data_end() {
        return xdp_drop();
    }
    // SAFETY: the check above covers both copies; unaligned reads of bytes.
    let (eth, quote) = unsafe {
        (
            *(start as *const [u8; 12]),
            *((start + ETH_HLEN) as *const [u8; QUOTE_LEN]),
        )
    };
    if is_later_fragment(&quote) {
        return xdp_drop();
    }
    let frame = build(&eth, &quote);
    let delta = FRAME_LEN as i32 - (ctx.data_end() - ctx.data()) as i32;
    // SAFETY: resizing helper on our own context; pointers are taken anew.
    if unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
        return xdp_drop();
    }
    let start = ctx.data();
    if start + FRAME_LEN > ctx.data_end() {
        return xdp_drop();
    }
    // SAFETY: the check above covers the whole frame; XDP may write it.
    unsafe { *(start as *mut [u8; FRAME_LEN]) = frame };
    count(stat::REJECTED);
    xdp_action::XDP_TX
}

#[inline(always)]
fn xdp_drop() -> u32 {
    count(stat::DROP_NO_BACKEND);
    xdp_action::XDP_DROP
}

/// Whether the packet may be answered at all: a fixed 20-byte header (the
/// quote is constant-size) and a source that is a single host.
#[inline(always)]
fn answerable(flow: &Flow) -> bool {
    let first = (flow.saddr_be.to_ne_bytes())[0];
    flow.l4_off == ETH_HLEN + IPV4_MIN_HLEN
        && flow.saddr_be != 0
        && flow.saddr_be != u32::MAX
        && !(224..240).contains(&first)
}

/// A fragment other than the first (its bytes after the header are not the
/// L4 header).
#[inline(always)]
fn is_later_fragment(quote: &[u8; QUOTE_LEN]) -> bool {
    u16::from_be_bytes([quote[6], quote[7]]) & IP_OFFSET_MASK != 0
}

/// The answer, from the original frame's two MAC addresses and its quote.
#[inline(always)]
fn build(eth: &[u8; 12], quote: &[u8; QUOTE_LEN]) -> [u8; FRAME_LEN] {
    let mut f = [0u8; FRAME_LEN];
    // Ethernet: destination = the original source and the reverse.
    let mut i = 0;
    while i < 6 {
        f[i] = eth[6 + i];
        f[6 + i] = eth[i];
        i += 1;
    }
    f[12] = 0x08;
    f[13] = 0x00;
    // IPv4.
    let total = (IPV4_MIN_HLEN + ICMP_HLEN + QUOTE_LEN) as u16;
    let ip = ETH_HLEN;
    f[ip] = 0x45;
    f[ip + 1] = quote[1]; // the original TOS
    f[ip + 2] = (total >> 8) as u8;
    f[ip + 3] = total as u8;
    f[ip + 8] = 64;
    f[ip + 9] = PROTO_ICMP;
    // Source: the address the client sent to; destination: the client.
    let mut j = 0;
    while j < 4 {
        f[ip + 12 + j] = quote[16 + j];
        f[ip + 16 + j] = quote[12 + j];
        j += 1;
    }
    let csum = checksum::<ETH_HLEN, IPV4_MIN_HLEN>(&f);
    f[ip + 10] = csum[0];
    f[ip + 11] = csum[1];
    // ICMP, then the quote; the checksum covers both.
    f[ICMP_OFF] = ICMP_DEST_UNREACH;
    f[ICMP_OFF + 1] = ICMP_PORT_UNREACH;
    let mut k = 0;
    while k < QUOTE_LEN {
        f[QUOTE_OFF + k] = quote[k];
        k += 1;
    }
    let csum = checksum::<ICMP_OFF, { ICMP_HLEN + QUOTE_LEN }>(&f);
    f[ICMP_OFF + 2] = csum[0];
    f[ICMP_OFF + 3] = csum[1];
    f
}

/// The Internet checksum of `N` (even) bytes of `f` from `OFF`, as the two
/// bytes to store (summing native-order words and storing native order gives
/// the right bytes on either byte order).
#[inline(always)]
fn checksum<const OFF: usize, const N: usize>(f: &[u8; FRAME_LEN]) -> [u8; 2] {
    let mut sum = 0u32;
    let mut i = 0;
    while i < N {
        sum += u32::from(u16::from_ne_bytes([f[OFF + i], f[OFF + i + 1]]));
        i += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_ne_bytes()
}
