//! Rejecting IPv6, as [`crate::reject`] does for IPv4: a packet to an IPv6
//! frontend without endpoints is answered from the frontend address the
//! client used, so the client fails at once instead of waiting for a
//! timeout:
//!
//! - TCP with a RST (RFC 9293 3.10.7.1: to a segment without ACK, `seq 0,
//!   ack = its seq + its length`, RST+ACK; to one with ACK, `seq = its ack`,
//!   RST), so a connect fails with "connection refused";
//! - UDP with an ICMPv6 destination unreachable, port unreachable (type 1,
//!   code 4; RFC 4443 3.1) quoting the IPv6 header and the first 8 bytes of
//!   the UDP header, so a connected socket gets `ECONNREFUSED`.
//!
//! The packet is cut or grown to the answer's length and its fields are
//! overwritten with helper stores (Ethernet addresses swapped, a fresh IPv6
//! header with hop limit 64 from the frontend to the client, the answer);
//! the checksum is computed here over the IPv6 pseudo-header. It is then
//! redirected back out of the interface it came in on. Fields are summed as
//! native-order 32-bit words of the packet's bytes and the folded sum stored
//! in native order, which gives the right bytes on either byte order.
//!
//! Never answered (dropped and counted `drop_no_backend`, as for IPv4):
//! packets with extension headers (the fixed-size quote would cut them, and
//! no client sends them to a Service), fragments, RSTs, sources that are not
//! one host (`::`, multicast), and `internalTrafficPolicy: Local` ClusterIP
//! frontends ([`crate::reject::rejects`]).
use aya_ebpf::{
    bindings::TC_ACT_SHOT,
    helpers::{bpf_redirect, bpf_skb_change_tail},
    programs::TcContext,
};
use proxy_common::{proto, stat, Addr6Be, FrontendSlot};

use crate::{
    family::Scratch6,
    maps::count,
    packet::v6::{is_unicast, load, load_into, IP6_DADDR_OFF, IP6_L4_OFF, IP6_SADDR_OFF},
    packet::Flow6,
    packet::{ETH_HLEN, TCP_FLAG_ACK, TCP_FLAG_FIN, TCP_FLAG_RST, TCP_FLAG_SYN, TCP_HLEN},
};

/// ICMPv6 header: type, code, checksum, 4 unused bytes.
const ICMP6_HLEN: usize = 8;
/// The quote: the IPv6 header and 8 bytes of the UDP header.
const QUOTE_LEN: usize = 40 + 8;
/// What a packet-too-big answer quotes beyond [`QUOTE_LEN`].
const MORE_LEN: usize = 8;
/// The ICMPv6 answer, Ethernet header included.
pub const UNREACH_LEN: usize = IP6_L4_OFF + ICMP6_HLEN + QUOTE_LEN;
/// The RST answer, Ethernet header included.
pub const RST_LEN: usize = IP6_L4_OFF + TCP_HLEN;
const ICMPV6_DEST_UNREACH: u8 = 1;
const ICMPV6_PORT_UNREACH: u8 = 4;
const ICMPV6_PKT_TOOBIG: u8 = 2;

/// `sb_from_pod`: a packet to IPv6 frontend `svc`, whose backend set is
/// empty, is answered or dropped.
#[inline(always)]
pub fn from_pod(ctx: &TcContext, s: &mut Scratch6, svc: &FrontendSlot) -> i32 {
    if !crate::reject::rejects(svc) {
        return drop();
    }
    answer(ctx, s)
}

/// `sb_from_pod` / `sb_from_uplink6`: answers the packet in `s.flow` (to a
/// frontend without endpoints, which rejects) with a RST or an ICMPv6 port
/// unreachable sent back out of the interface it came in on
/// (`TC_ACT_REDIRECT`), or drops it when it must not be answered or cannot
/// be reshaped. The per-service counter is the caller's.
#[inline(always)]
pub fn answer(ctx: &TcContext, s: &mut Scratch6) -> i32 {
    let flow = &s.flow;
    if flow.l4_off() != IP6_L4_OFF
        || flow.first_fragment
        || !is_unicast(&flow.saddr_be)
        || (flow.proto == proto::TCP && flow.tcp_flags & TCP_FLAG_RST != 0)
    {
        return drop();
    }
    let answered = if flow.proto == proto::TCP {
        rst(ctx, flow)
    } else {
        icmp_error(ctx, s, ICMPV6_DEST_UNREACH, ICMPV6_PORT_UNREACH, 0, false)
    };
    if answered.is_err() {
        return drop();
    }
    count(stat::REJECTED);
    // SAFETY: a read of our context, then a helper without memory arguments.
    unsafe { bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32 }
}

#[inline(always)]
fn drop() -> i32 {
    count(stat::DROP_NO_BACKEND);
    TC_ACT_SHOT
}

/// `sb_from_uplink6`: answers the packet in `s.flow`, to a frontend whose
/// flows are returned directly and too large for the route's MTU once the
/// destination options header is in ([`crate::nodeport::dsr`]), with an
/// ICMPv6 packet too big (type 2, code 0; RFC 4443 3.2) naming `mtu` (the
/// room the header leaves), from the frontend, quoting the IPv6 header and
/// the next 16 bytes: the TCP/UDP header's first 8, or the fragment header
/// and the UDP header of a first fragment (the client's kernel finds its
/// socket, and lowers the path MTU, from either). A packet with other
/// extension headers, or from a source that is not one host, is dropped
/// (`drop_rewrite_failed`).
#[inline(always)]
pub fn too_big(ctx: &TcContext, s: &mut Scratch6, mtu: u16) -> i32 {
    let l4_off = s.flow.l4_off();
    let quotable = l4_off == IP6_L4_OFF || (s.flow.first_fragment && l4_off == IP6_L4_OFF + 8);
    if !quotable || !is_unicast(&s.flow.saddr_be) {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    let rest = u32::from(mtu).to_be();
    if icmp_error(ctx, s, ICMPV6_PKT_TOOBIG, 0, rest, true).is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    count(stat::REJECTED);
    // SAFETY: a read of our context, then a helper without memory arguments.
    unsafe { bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32 }
}

/// The packet's Ethernet addresses, swapped.
#[inline(always)]
fn swapped_macs(ctx: &TcContext) -> Result<[u8; 12], ()> {
    let macs: [u8; 12] = load(ctx, 0).map_err(|_| ())?;
    let mut out = [0u8; 12];
    let mut i = 0;
    while i < 6 {
        out[i] = macs[6 + i];
        out[6 + i] = macs[i];
        i += 1;
    }
    Ok(out)
}

/// Resizes the packet to `len` bytes and writes the Ethernet addresses and
/// an IPv6 header from `src` to `dst` carrying `payload_len` bytes of
/// protocol `next`.
#[inline(always)]
fn answer_header(
    ctx: &TcContext,
    macs: &[u8; 12],
    len: usize,
    payload_len: usize,
    next: u8,
    src: &Addr6Be,
    dst: &Addr6Be,
) -> Result<(), ()> {
    // SAFETY: resizing helper on our own context; no packet pointer is held.
    if unsafe { bpf_skb_change_tail(ctx.skb.skb, len as u32, 0) } != 0 {
        return Err(());
    }
    let fixed: [u32; 2] = [
        0x6000_0000u32.to_be(),
        ((payload_len as u32) << 16 | u32::from(next) << 8 | 64).to_be(),
    ];
    ctx.store(0, macs, 0).map_err(|_| ())?;
    ctx.store(ETH_HLEN, &fixed, 0).map_err(|_| ())?;
    ctx.store(IP6_SADDR_OFF, src, 0).map_err(|_| ())?;
    ctx.store(IP6_DADDR_OFF, dst, 0).map_err(|_| ())
}

/// The one's-complement sum of an address's words, as in the packet.
#[inline(always)]
fn sum_addr(a: &Addr6Be) -> u64 {
    u64::from(a[0]) + u64::from(a[1]) + u64::from(a[2]) + u64::from(a[3])
}

/// The checksum field for a sum of native-order words (pseudo-header
/// included).
#[inline(always)]
fn fold(sum: u64) -> u16 {
    let mut s = (sum & 0xffff_ffff) + (sum >> 32);
    s = (s & 0xffff_ffff) + (s >> 32);
    let mut t = (s & 0xffff) + (s >> 16);
    t = (t & 0xffff) + (t >> 16);
    !(t as u16)
}

/// The pseudo-header's sum for an answer from `src` to `dst`.
#[inline(always)]
fn pseudo_sum(src: &Addr6Be, dst: &Addr6Be, len: usize, next: u8) -> u64 {
    sum_addr(src)
        + sum_addr(dst)
        + u64::from((len as u32).to_be())
        + u64::from(u32::from(next).to_be())
}

/// The RST answering a TCP segment (no extension headers).
#[inline(always)]
fn rst(ctx: &TcContext, flow: &Flow6) -> Result<(), ()> {
    let payload_len = u32::from(u16::from_be(
        load::<u16>(ctx, ETH_HLEN + 4).map_err(|_| ())?,
    ));
    let tcp: [u32; 4] = load(ctx, IP6_L4_OFF).map_err(|_| ())?;
    let seq = u32::from_be(tcp[1]);
    let ack = u32::from_be(tcp[2]);
    let doff = (u32::from_be(tcp[3]) >> 28) * 4;
    let flags = flow.tcp_flags;
    let mut seg_len = payload_len.saturating_sub(doff);
    if flags & TCP_FLAG_SYN != 0 {
        seg_len += 1;
    }
    if flags & TCP_FLAG_FIN != 0 {
        seg_len += 1;
    }
    let (new_seq, new_ack, new_flags) = if flags & TCP_FLAG_ACK != 0 {
        (ack, 0, TCP_FLAG_RST)
    } else {
        (0, seq.wrapping_add(seg_len), TCP_FLAG_RST | TCP_FLAG_ACK)
    };
    // Ports swapped: the frontend's port answers the client's.
    let ports = u32::from(flow.dport_be) | u32::from(flow.sport_be) << 16;
    let ports = if cfg!(target_endian = "little") {
        ports
    } else {
        ports.rotate_left(16)
    };
    let mut hdr: [u32; 5] = [
        ports,
        new_seq.to_be(),
        new_ack.to_be(),
        (5u32 << 28 | u32::from(new_flags) << 16).to_be(),
        0,
    ];
    let mut sum = pseudo_sum(&flow.daddr_be, &flow.saddr_be, TCP_HLEN, proto::TCP);
    let mut i = 0;
    while i < 5 {
        sum += u64::from(hdr[i]);
        i += 1;
    }
    // The checksum is bytes 16..18: the first half of the last word, as in
    // memory.
    let c = fold(sum).to_ne_bytes();
    hdr[4] = u32::from_ne_bytes([c[0], c[1], 0, 0]);
    let macs = swapped_macs(ctx)?;
    answer_header(
        ctx,
        &macs,
        RST_LEN,
        TCP_HLEN,
        proto::TCP,
        &flow.daddr_be,
        &flow.saddr_be,
    )?;
    ctx.store(IP6_L4_OFF, &hdr, 0).map_err(|_| ())
}

/// The ICMPv6 error of `icmp_type` and `code` (its last four header bytes
/// `rest`, as in the packet) answering the packet, quoting its IPv6 header
/// and 8 bytes after it, or 16 (`longer`).
#[inline(always)]
fn icmp_error(
    ctx: &TcContext,
    s: &mut Scratch6,
    icmp_type: u8,
    code: u8,
    rest: u32,
    longer: bool,
) -> Result<(), ()> {
    load_into(ctx, ETH_HLEN, &mut s.quote).map_err(|_| ())?;
    let more: [u32; 2] = match longer {
        true => load(ctx, ETH_HLEN + QUOTE_LEN).map_err(|_| ())?,
        false => [0; 2],
    };
    let more_len = if longer { MORE_LEN } else { 0 };
    let icmp_len = ICMP6_HLEN + QUOTE_LEN + more_len;
    let mut sum = pseudo_sum(&s.flow.daddr_be, &s.flow.saddr_be, icmp_len, proto::ICMPV6);
    let mut i = 0;
    while i < 12 {
        sum += u64::from(s.quote[i]);
        i += 1;
    }
    let head = u32::from_ne_bytes([icmp_type, code, 0, 0]);
    sum += u64::from(head) + u64::from(rest) + u64::from(more[0]) + u64::from(more[1]);
    let c = fold(sum).to_ne_bytes();
    let icmp: [u32; 2] = [u32::from_ne_bytes([icmp_type, code, c[0], c[1]]), rest];
    let macs = swapped_macs(ctx)?;
    answer_header(
        ctx,
        &macs,
        UNREACH_LEN + more_len,
        icmp_len,
        proto::ICMPV6,
        &s.flow.daddr_be,
        &s.flow.saddr_be,
    )?;
    ctx.store(IP6_L4_OFF, &icmp, 0).map_err(|_| ())?;
    ctx.store(IP6_L4_OFF + ICMP6_HLEN, &s.quote, 0)
        .map_err(|_| ())?;
    if longer {
        ctx.store(IP6_L4_OFF + ICMP6_HLEN + QUOTE_LEN, &more, 0)
            .map_err(|_| ())?;
    }
    Ok(())
}
