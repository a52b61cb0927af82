//! Rejecting, as kube-proxy does: a TCP or UDP packet to a frontend without
//! endpoints is answered with an ICMP port unreachable (type 3, code 3) from
//! the frontend address the client used, so a TCP connect fails at once with
//! "connection refused" and a connected UDP socket gets `ECONNREFUSED`,
//! instead of waiting for a timeout.
//!
//! The packet itself becomes the answer: its first 42 bytes (Ethernet
//! header, IPv4 header, 8 bytes of payload) are kept (tc: copied into the one
//! stack buffer the answer is built in; XDP: left in place in the frame), the
//! packet is cut (or grown) to [`FRAME_LEN`] bytes and rewritten as
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

pub mod v6;

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_SHOT},
    helpers::{bpf_redirect, bpf_skb_change_tail, bpf_skb_load_bytes, bpf_xdp_adjust_tail},
    programs::{TcContext, XdpContext},
};
use proxy_common::{frontend_flags, stat, FrontendSlot};

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
/// The bytes of the original frame the answer is made of: its Ethernet
/// header and the quote.
const ORIGINAL_LEN: usize = ETH_HLEN + QUOTE_LEN;
const ICMP_OFF: usize = ETH_HLEN + IPV4_MIN_HLEN;
const QUOTE_OFF: usize = ICMP_OFF + ICMP_HLEN;

const PROTO_ICMP: u8 = 1;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_PORT_UNREACH: u8 = 3;
const ICMP_FRAG_NEEDED: u8 = 4;
/// Fragment offset (host order), without the flags.
const IP_OFFSET_MASK: u16 = 0x1fff;

/// Whether a frontend whose backend set is empty is answered with an ICMP
/// error (`true`) or dropped: everything but an `internalTrafficPolicy:
/// Local` ClusterIP frontend (see the module's documentation).
#[inline(always)]
pub fn rejects(svc: &FrontendSlot) -> bool {
    let kind = svc.flags & frontend_flags::KIND_MASK;
    !(svc.flags & frontend_flags::LOCAL_ONLY != 0 && kind == frontend_flags::KIND_CLUSTER_IP)
}

/// `sb_from_pod`: a packet to frontend `svc`, whose backend set is empty,
/// is rejected ([`tc_reject`]) or dropped ([`rejects`]).
#[inline(always)]
pub fn from_pod(ctx: &TcContext, flow: &Flow, svc: &FrontendSlot) -> i32 {
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
    tc_answer(ctx, flow, Answer::PortUnreachable)
}

/// `sb_from_uplink`: answers `flow`, to a frontend whose flows are
/// returned directly and too large for the route's MTU once the option is
/// in ([`crate::nodeport::dsr`]), with an ICMP "fragmentation needed"
/// naming `mtu` (the room the option leaves), from the frontend, as
/// [`tc_reject`] answers. A packet that cannot be answered is dropped
/// (`drop_rewrite_failed`).
#[inline(always)]
pub fn tc_too_big(ctx: &TcContext, flow: &Flow, mtu: u16) -> i32 {
    tc_answer(ctx, flow, Answer::FragmentationNeeded(mtu))
}

/// What the client is told (RFC 792; RFC 1191 for the MTU).
#[derive(Clone, Copy)]
enum Answer {
    /// Type 3 code 3: the frontend has no endpoint.
    PortUnreachable,
    /// Type 3 code 4, with the next hop's MTU.
    FragmentationNeeded(u16),
}

impl Answer {
    /// The ICMP code, and the header's last four bytes.
    #[inline(always)]
    fn code_and_rest(self) -> (u8, [u8; 4]) {
        match self {
            Answer::PortUnreachable => (ICMP_PORT_UNREACH, [0; 4]),
            Answer::FragmentationNeeded(mtu) => {
                let [hi, lo] = mtu.to_be_bytes();
                (ICMP_FRAG_NEEDED, [0, 0, hi, lo])
            }
        }
    }

    /// Counts a packet that is not answered.
    #[inline(always)]
    fn unanswered(self) -> u32 {
        match self {
            Answer::PortUnreachable => stat::DROP_NO_BACKEND,
            Answer::FragmentationNeeded(_) => stat::DROP_REWRITE_FAILED,
        }
    }
}

#[inline(always)]
fn tc_answer(ctx: &TcContext, flow: &Flow, answer: Answer) -> i32 {
    let unanswered = || {
        count(answer.unanswered());
        TC_ACT_SHOT
    };
    if !answerable(flow) {
        return unanswered();
    }
    let skb = ctx.skb.skb;
    // One buffer (stack space is scarce): the original first bytes go in
    // first and are turned into the answer in place ([`build_in_place`]).
    let mut frame = [0u8; FRAME_LEN];
    // SAFETY: the helper copies a constant length into a stack buffer at
    // least that large; `skb` is this program's context.
    let loaded = unsafe {
        bpf_skb_load_bytes(
            skb as *const _,
            0,
            frame.as_mut_ptr() as *mut _,
            ORIGINAL_LEN as u32,
        ) == 0
    };
    if !loaded || is_later_fragment(&frame) {
        return unanswered();
    }
    build_in_place(&mut frame, answer);
    // SAFETY: resizing helper on our own context; no packet pointer is used
    // after it.
    if unsafe { bpf_skb_change_tail(skb, FRAME_LEN as u32, 0) } != 0 {
        return unanswered();
    }
    if ctx.store(0, &frame, 0).is_err() {
        return unanswered();
    }
    count(stat::REJECTED);
    // SAFETY: a read of our context, then a helper without memory arguments.
    unsafe { bpf_redirect((*skb).ifindex, 0) as i32 }
}

#[inline(always)]
fn tc_drop() -> i32 {
    count(stat::DROP_NO_BACKEND);
    TC_ACT_SHOT
}

/// `sb_xdp_uplink`: the same as [`tc_reject`], answered with `XDP_TX`. The
/// frame is resized first and rewritten in place: the original first bytes
/// stay where they are, and nothing but the frame holds them.
#[inline(always)]
pub fn xdp_reject(ctx: &XdpContext, flow: &Flow) -> u32 {
    if !answerable(flow) {
        return xdp_drop();
    }
    let start = ctx.data();
    if start + ORIGINAL_LEN > ctx.data_end() {
        return xdp_drop();
    }
    // SAFETY: the check above covers the original bytes; a read.
    if is_later_fragment(unsafe { &*(start as *const [u8; FRAME_LEN]) }) {
        return xdp_drop();
    }
    let delta = FRAME_LEN as i32 - (ctx.data_end() - ctx.data()) as i32;
    // SAFETY: resizing helper on our own context; pointers are taken anew.
    // Growing keeps the bytes before the old end; shrinking those before the
    // new one.
    if unsafe { bpf_xdp_adjust_tail(ctx.ctx, delta) } != 0 {
        return xdp_drop();
    }
    let start = ctx.data();
    if start + FRAME_LEN > ctx.data_end() {
        return xdp_drop();
    }
    // SAFETY: the check above covers the whole frame; XDP may write it.
    build_in_place(
        unsafe { &mut *(start as *mut [u8; FRAME_LEN]) },
        Answer::PortUnreachable,
    );
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
/// L4 header). `f` starts with the original frame.
#[inline(always)]
fn is_later_fragment(f: &[u8; FRAME_LEN]) -> bool {
    u16::from_be_bytes([f[ETH_HLEN + 6], f[ETH_HLEN + 7]]) & IP_OFFSET_MASK != 0
}

/// Turns `f`, whose first [`ORIGINAL_LEN`] bytes are the original frame's,
/// into the answer. Each step reads only bytes no earlier step overwrote:
/// the quote is copied out of the way first (bytes 14..42 to 42..70), the
/// Ethernet addresses are swapped in place, the IPv4 header is built from
/// the quote, and the ICMP header (34..42) goes over what was left of the
/// original.
#[inline(always)]
fn build_in_place(f: &mut [u8; FRAME_LEN], answer: Answer) {
    let mut k = 0;
    while k < QUOTE_LEN {
        f[QUOTE_OFF + k] = f[ETH_HLEN + k];
        k += 1;
    }
    // Ethernet: destination = the original source and the reverse.
    let mut i = 0;
    while i < 6 {
        f.swap(i, 6 + i);
        i += 1;
    }
    f[12] = 0x08;
    f[13] = 0x00;
    // IPv4.
    let total = (IPV4_MIN_HLEN + ICMP_HLEN + QUOTE_LEN) as u16;
    let ip = ETH_HLEN;
    f[ip] = 0x45;
    f[ip + 1] = f[QUOTE_OFF + 1]; // the original TOS
    f[ip + 2] = (total >> 8) as u8;
    f[ip + 3] = total as u8;
    let mut z = 4;
    while z < 12 {
        f[ip + z] = 0; // id, flags + fragment offset, TTL, protocol, checksum
        z += 1;
    }
    f[ip + 8] = 64;
    f[ip + 9] = PROTO_ICMP;
    // Source: the address the client sent to; destination: the client.
    let mut j = 0;
    while j < 4 {
        f[ip + 12 + j] = f[QUOTE_OFF + 16 + j];
        f[ip + 16 + j] = f[QUOTE_OFF + 12 + j];
        j += 1;
    }
    let csum = checksum::<ETH_HLEN, IPV4_MIN_HLEN>(f);
    f[ip + 10] = csum[0];
    f[ip + 11] = csum[1];
    // ICMP (type, code, checksum, 4 bytes: unused, or the next hop's
    // MTU); its checksum covers the quote too.
    let (code, rest) = answer.code_and_rest();
    f[ICMP_OFF] = ICMP_DEST_UNREACH;
    f[ICMP_OFF + 1] = code;
    f[ICMP_OFF + 2] = 0;
    f[ICMP_OFF + 3] = 0;
    let mut u = 0;
    while u < rest.len() {
        f[ICMP_OFF + 4 + u] = rest[u];
        u += 1;
    }
    let csum = checksum::<ICMP_OFF, { ICMP_HLEN + QUOTE_LEN }>(f);
    f[ICMP_OFF + 2] = csum[0];
    f[ICMP_OFF + 3] = csum[1];
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
