//! Rejecting, as kube-proxy does, both families written once ([`answer`]);
//! what the families do differently is [`RejectFamily`] (IPv4 and IPv6 side
//! by side in [`family`]), what the tc and XDP packets do differently
//! [`AnswerCtx`]. A TCP or UDP packet to a frontend without endpoints is
//! answered from the frontend address the client used, so a TCP connect
//! fails at once with "connection refused" and a connected UDP socket gets
//! `ECONNREFUSED`, instead of waiting for a timeout:
//!
//! - IPv4: TCP and UDP with an ICMP port unreachable (type 3, code 3);
//! - IPv6: TCP with a RST (RFC 9293 3.10.7.1: to a segment without ACK,
//!   `seq 0, ack = its seq + its length`, RST+ACK; to one with ACK,
//!   `seq = its ack`, RST), UDP with an ICMPv6 port unreachable (type 1,
//!   code 4; RFC 4443 3.1).
//!
//! The uplink's tc program also answers a packet to a frontend whose flows
//! are returned directly ([`crate::nodeport::dsr`]), and that the option
//! would make too large for the route's MTU, with a "too big" naming the
//! room the option leaves ([`tc_too_big`]): IPv4 "fragmentation needed"
//! (type 3 code 4, RFC 1191), IPv6 "packet too big" (type 2 code 0, RFC
//! 4443 3.2).
//!
//! The packet itself becomes the answer: its Ethernet addresses and the
//! quote (the IP header and the first 8 bytes of its TCP/UDP header, RFC
//! 792 and 4443: ports, and the TCP sequence number the client's kernel
//! checks the error against; an IPv6 "too big" quotes 16, so a first
//! fragment's UDP header is in) are read into the family's working memory,
//! the packet is cut or grown to the answer's length, and the answer is
//! written over it:
//!
//! ```text
//! Ethernet  addresses swapped
//! IP        src = the frontend, dst = the client, TTL (hop limit) 64;
//!           IPv4: 20 bytes, the original TOS, id 0, no DF, checksum;
//!           IPv6: traffic class and flow label 0
//! ICMP      type, code, checksum (ICMPv6's over the pseudo-header too),
//!           4 bytes: unused, or the MTU of a "too big"
//! quoted    the quote
//! ```
//!
//! (or the IPv6 header and a 20-byte RST), with helper stores, and sent back
//! out of the interface it came in on: tc redirects it to that interface's
//! egress (for a pod veth's ingress that delivers it into the pod), XDP
//! transmits it (`XDP_TX`; IPv6 is answered by tc).
//!
//! What is never answered (dropped and counted as `drop_no_backend`, or
//! `drop_rewrite_failed` for a "too big"):
//! - packets with IPv4 options or IPv6 extension headers (a "too big" may
//!   have a fragment header): RFC 792 asks to quote the whole header; a
//!   fixed-size quote keeps the copy constant-size for the verifier, and no
//!   client sends options to a Service;
//! - non-first fragments (they carry no ports; the parsers pass them by),
//!   IPv6 first fragments but to a "too big", TCP RSTs where a RST would
//!   answer, and anything that is not TCP or UDP: an ICMP error never
//!   answers an ICMP packet, so two rejecting nodes cannot ping-pong;
//! - sources that are not one host (IPv4 0.0.0.0, multicast, limited
//!   broadcast, RFC 1122 3.2.2; IPv6 `::`, multicast);
//! - `internalTrafficPolicy: Local` ClusterIP frontends without endpoints:
//!   kube-proxy drops traffic to those ("no local endpoints"), and the data
//!   path cannot tell that from "no endpoints at all" (then kube-proxy would
//!   reject). `externalTrafficPolicy: Local` without local endpoints from
//!   outside is decided in [`crate::nodeport`] and also drops.
//!
//! Not rate limited (the kernel's own `icmp_ratelimit` does not apply to us):
//! the answer goes only to the packet's source, is at most a few dozen bytes
//! longer than the smallest packet that triggers it, and a pod can only reach
//! itself.
//!
//! A skb that arrives `CHECKSUM_PARTIAL` (from a veth or a virtio NIC) keeps
//! that state, and a program cannot clear it. Where nothing finishes the
//! checksum, the receiver trusts the answer as checked; where something does
//! (a device without checksum offload, or a NIC that offloads it), the
//! kernel's store would spoil an ICMP answer laid out as above, so an ICMP
//! answer over such a packet is laid out to make that store change nothing
//! ([`Shield`]); a RST over one carries the pseudo-header's sum where its
//! checksum goes, as the kernel's own partial checksums do, so the store
//! finishes it.

pub(crate) mod family;

use core::mem::size_of;

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_SHOT},
    helpers::{bpf_redirect, bpf_skb_change_tail, bpf_xdp_adjust_tail},
    programs::{TcContext, XdpContext},
};
use proxy_common::{frontend_flags, proto, stat, FrontendSlot};

pub(crate) use family::RejectFamily;

use crate::{
    family::Work,
    maps::count,
    packet::{
        ctx::{xdp_store, LoadBytes},
        v6::{load, load_into},
        FlowOf, ETH_HLEN, TCP_FLAG_ACK, TCP_FLAG_FIN, TCP_FLAG_RST, TCP_FLAG_SYN, TCP_HLEN,
    },
};

/// ICMP (ICMPv6) header: type, code, checksum, 4 bytes.
const ICMP_HLEN: usize = 8;

/// Whether a frontend whose backend set is empty is answered (`true`) or
/// its packets dropped: everything but an `internalTrafficPolicy: Local`
/// ClusterIP frontend (see the module's documentation).
#[inline(always)]
pub fn rejects(svc: &FrontendSlot) -> bool {
    let kind = svc.flags & frontend_flags::KIND_MASK;
    !(svc.flags & frontend_flags::LOCAL_ONLY != 0 && kind == frontend_flags::KIND_CLUSTER_IP)
}

/// What the client is told.
#[derive(Clone, Copy)]
pub(crate) enum Answer {
    /// The frontend has no endpoint: port unreachable (or a RST).
    Unreachable,
    /// Too big for the route, with the MTU left.
    TooBig(u16),
}

impl Answer {
    /// Counts a packet that is not answered.
    #[inline(always)]
    fn unanswered(self) -> u32 {
        match self {
            Answer::Unreachable => stat::DROP_NO_BACKEND,
            Answer::TooBig(_) => stat::DROP_REWRITE_FAILED,
        }
    }
}

/// `sb_from_pod`: a packet (`w.flow`) to frontend `svc`, whose backend set
/// is empty, is rejected ([`tc_reject`]) or dropped ([`rejects`]).
#[inline(always)]
pub fn from_pod<A: RejectFamily>(ctx: &TcContext, w: &mut Work<A>, svc: &FrontendSlot) -> i32 {
    if !rejects(svc) {
        count(stat::DROP_NO_BACKEND);
        return TC_ACT_SHOT;
    }
    tc_reject(ctx, w)
}

/// `sb_from_pod` / `sb_from_uplink`: answers `w.flow` (to a frontend
/// without endpoints) and sends the answer back out of the interface it
/// came in on (`TC_ACT_REDIRECT`), or drops it when it must not be answered
/// or the packet cannot be reshaped. The per-service counter is the
/// caller's.
#[inline(always)]
pub fn tc_reject<A: RejectFamily>(ctx: &TcContext, w: &mut Work<A>) -> i32 {
    answer(ctx, w, Answer::Unreachable)
}

/// `sb_from_uplink`: answers `w.flow`, to a frontend whose flows are
/// returned directly and too large for the route's MTU once the option is
/// in ([`crate::nodeport::dsr`]), with a "too big" naming `mtu` (the room
/// the option leaves), from the frontend, as [`tc_reject`] answers. A
/// packet that cannot be answered is dropped (`drop_rewrite_failed`).
#[inline(always)]
pub fn tc_too_big<A: RejectFamily>(ctx: &TcContext, w: &mut Work<A>, mtu: u16) -> i32 {
    answer(ctx, w, Answer::TooBig(mtu))
}

/// `sb_xdp_uplink`: the same as [`tc_reject`], answered with `XDP_TX`.
#[inline(always)]
pub fn xdp_reject<A: RejectFamily>(ctx: &XdpContext, w: &mut Work<A>) -> u32 {
    answer(ctx, w, Answer::Unreachable)
}

/// The packet of a tc or an XDP program, as an answer is written over it.
pub(crate) trait AnswerCtx: LoadBytes {
    /// The program's verdict.
    type Action;
    const DROP: Self::Action;
    /// Cuts or grows the packet to `len` bytes (the bytes before the
    /// shorter of both lengths stay).
    fn resize(&self, len: usize) -> Result<(), ()>;
    /// Writes `value` at `off` (through a helper: no packet pointer).
    fn put<T>(&self, off: usize, value: &T) -> Result<(), ()>;
    /// Sends the packet back out of the interface it came in on.
    fn send_back(&self) -> Self::Action;
    /// Whether the packet's L4 checksum is partial, left to be finished
    /// ([`Shield`]); `false` where that cannot be known (XDP,
    /// or a kernel without `bpf_cast_to_kern_ctx`).
    fn partial_checksum(&self) -> bool;
}

impl AnswerCtx for TcContext {
    type Action = i32;
    const DROP: i32 = TC_ACT_SHOT;
    #[inline(always)]
    fn resize(&self, len: usize) -> Result<(), ()> {
        // SAFETY: resizing helper on our own context; no packet pointer is
        // held.
        match unsafe { bpf_skb_change_tail(self.skb.skb, len as u32, 0) } {
            0 => Ok(()),
            _ => Err(()),
        }
    }
    #[inline(always)]
    fn put<T>(&self, off: usize, value: &T) -> Result<(), ()> {
        self.store(off, value, 0).map_err(|_| ())
    }
    #[inline(always)]
    fn send_back(&self) -> i32 {
        // SAFETY: a read of our context, then a helper without memory
        // arguments.
        unsafe { bpf_redirect((*self.skb.skb).ifindex, 0) as i32 }
    }
    #[inline(always)]
    fn partial_checksum(&self) -> bool {
        crate::rewrite::l4::update(self) == crate::rewrite::l4::Update::Seed
    }
}

impl AnswerCtx for XdpContext {
    type Action = u32;
    const DROP: u32 = xdp_action::XDP_DROP;
    #[inline(always)]
    fn resize(&self, len: usize) -> Result<(), ()> {
        let delta = len as i32 - (self.data_end() - self.data()) as i32;
        // SAFETY: resizing helper on our own context; no packet pointer is
        // held. Growing keeps the bytes before the old end; shrinking those
        // before the new one.
        match unsafe { bpf_xdp_adjust_tail(self.ctx, delta) } {
            0 => Ok(()),
            _ => Err(()),
        }
    }
    #[inline(always)]
    fn put<T>(&self, off: usize, value: &T) -> Result<(), ()> {
        match xdp_store(self, off, value) {
            true => Ok(()),
            false => Err(()),
        }
    }
    #[inline(always)]
    fn send_back(&self) -> u32 {
        xdp_action::XDP_TX
    }
    #[inline(always)]
    fn partial_checksum(&self) -> bool {
        false
    }
}

/// Answers `w.flow` with `answer` (counted `rejected`) and sends it back, or
/// drops the packet, counted.
#[inline(always)]
fn answer<A: RejectFamily, C: AnswerCtx>(ctx: &C, w: &mut Work<A>, answer: Answer) -> C::Action {
    let flow = &w.flow;
    let rst = A::TCP_RST && matches!(answer, Answer::Unreachable) && flow.proto == proto::TCP;
    let answered = A::answerable(flow, answer)
        && !(rst && flow.tcp_flags & TCP_FLAG_RST != 0)
        && match rst {
            true => tcp_rst(ctx, flow).is_ok(),
            false => icmp_error(ctx, w, answer).is_ok(),
        };
    if !answered {
        count(answer.unanswered());
        return C::DROP;
    }
    count(stat::REJECTED);
    ctx.send_back()
}

/// The ICMP error answering the packet (`w.flow`; the quote goes through
/// `w.quote`).
#[inline(always)]
fn icmp_error<A: RejectFamily, C: AnswerCtx>(
    ctx: &C,
    w: &mut Work<A>,
    answer: Answer,
) -> Result<(), ()> {
    load_into(ctx, ETH_HLEN, &mut w.quote).map_err(|_| ())?;
    if !A::quotable(&w.quote) {
        return Err(());
    }
    let ((icmp_type, code), rest, more_len) = match answer {
        Answer::Unreachable => (A::UNREACHABLE, 0, 0),
        Answer::TooBig(mtu) => (A::TOO_BIG, u32::from(mtu).to_be(), A::TOO_BIG_MORE),
    };
    let quote_len = size_of::<A::Quote>();
    let more: [u32; 2] = match more_len {
        0 => [0; 2],
        _ => load(ctx, ETH_HLEN + quote_len).map_err(|_| ())?,
    };
    let icmp_len = ICMP_HLEN + quote_len + more_len;
    let (src, dst) = (&w.flow.daddr_be, &w.flow.saddr_be);
    let head = u32::from_ne_bytes([icmp_type, code, 0, 0]);
    let mut rest = rest;
    let words = sum_words(&[head, rest, more[0], more[1]]);
    let pseudo = if A::ICMP_PSEUDO_HEADER {
        pseudo_sum(src, dst, icmp_len, A::ICMP_PROTO)
    } else {
        0
    };
    let shield = ctx.partial_checksum().then(|| {
        let sum = words + pseudo;
        A::shield(w.flow.proto, &mut w.quote, sum, pseudo, &mut rest)
    });
    let (c, opt_len) = match &shield {
        Some(shield) => (shield.checksum, A::SHIELD_OPT_LEN),
        None => (fold(A::quote_sum(&w.quote) + words + pseudo), 0),
    };
    let c = c.to_ne_bytes();
    let icmp: [u32; 2] = [u32::from_ne_bytes([icmp_type, code, c[0], c[1]]), rest];
    let macs = swapped_macs(ctx)?;
    let l4_off = A::L4_OFF + opt_len;
    ctx.resize(l4_off + icmp_len)?;
    ctx.put(0, &macs)?;
    let payload = (icmp_len, A::ICMP_PROTO);
    let opts = shield.as_ref().map(|s| &s.opts);
    A::put_header(ctx, src, dst, payload, A::tos(&w.quote), opts)?;
    ctx.put(l4_off, &icmp)?;
    ctx.put(l4_off + ICMP_HLEN, &w.quote)?;
    if more_len != 0 {
        ctx.put(l4_off + ICMP_HLEN + quote_len, &more)?;
    }
    Ok(())
}

/// What an ICMP answer written over a packet whose checksum is partial
/// carries, so that the kernel's finishing store changes nothing: the
/// packet (`CHECKSUM_PARTIAL`: a TCP or UDP packet from a veth or a virtio
/// NIC, its checksum left to be finished) hands the answer the kernel's note
/// to finish it, which a program cannot clear. A device without checksum
/// offload that sends the answer on (or a NIC that offloads it) sums the
/// bytes from where the packet's L4 header began (right after the fixed
/// header) to the end, and stores the result 16 (TCP) or 6 (UDP) bytes
/// further on. On the answer as it is otherwise laid out that store lands
/// on the quoted header and spoils the answer, which the client then
/// ignores: a "fragmentation needed" lost that way stalled a client's
/// upload for good. So a shielded answer puts options (IPv4: 4 bytes, end
/// of list) or a destination options header (IPv6: 8 bytes) before its ICMP
/// header, and the store's sum becomes that header's plus the ICMP
/// message's; the family chooses the words the store reads and lands on so
/// it writes what is already there ([`RejectFamily::shield`]). A NIC may
/// store 0 where the kernel stores 0xffff: the same in one's complement.
pub(crate) struct Shield {
    /// The options (IPv4: the first word) or destination options header.
    pub(crate) opts: [u32; 2],
    /// The ICMP checksum.
    pub(crate) checksum: u16,
}

/// The RST answering a TCP segment (no options, no extension headers).
#[inline(always)]
fn tcp_rst<A: RejectFamily, C: AnswerCtx>(ctx: &C, flow: &FlowOf<A>) -> Result<(), ()> {
    let l4_len = A::l4_len(ctx)?;
    let tcp: [u32; 4] = load(ctx, A::L4_OFF).map_err(|_| ())?;
    let seq = u32::from_be(tcp[1]);
    let ack = u32::from_be(tcp[2]);
    let doff = (u32::from_be(tcp[3]) >> 28) * 4;
    let flags = flow.tcp_flags;
    let mut seg_len = l4_len.saturating_sub(doff);
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
    let (src, dst) = (&flow.daddr_be, &flow.saddr_be);
    let pseudo = pseudo_sum(src, dst, TCP_HLEN, proto::TCP);
    // Over a partial checksum the RST inherits the note to finish it (see
    // `Shield`), which lands on its own checksum: the field then holds the
    // pseudo-header's sum, as the kernel's own partial segments' does.
    let c = match ctx.partial_checksum() {
        true => !fold(pseudo),
        false => fold(pseudo + sum_words(&hdr)),
    };
    // The checksum is bytes 16..18: the first half of the last word, as in
    // memory.
    let c = c.to_ne_bytes();
    hdr[4] = u32::from_ne_bytes([c[0], c[1], 0, 0]);
    let macs = swapped_macs(ctx)?;
    ctx.resize(A::L4_OFF + TCP_HLEN)?;
    ctx.put(0, &macs)?;
    A::put_header(ctx, src, dst, (TCP_HLEN, proto::TCP), 0, None)?;
    ctx.put(A::L4_OFF, &hdr)
}

/// The packet's Ethernet addresses, swapped.
#[inline(always)]
fn swapped_macs(ctx: &impl LoadBytes) -> Result<[u8; 12], ()> {
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

/// The one's-complement sum (unfolded) of words as they are in the packet.
#[inline(always)]
fn sum_words<const N: usize>(words: &[u32; N]) -> u64 {
    let mut sum = 0u64;
    let mut i = 0;
    while i < N {
        sum += u64::from(words[i]);
        i += 1;
    }
    sum
}

/// The pseudo-header's sum for an answer from `src` to `dst` carrying `len`
/// bytes of protocol `next` (the same words' sum in either family).
#[inline(always)]
fn pseudo_sum<A: RejectFamily>(src: &A, dst: &A, len: usize, next: u8) -> u64 {
    A::addr_sum(src)
        + A::addr_sum(dst)
        + u64::from((len as u32).to_be())
        + u64::from(u32::from(next).to_be())
}

/// The checksum field for a sum of native-order words: folded and
/// complemented, stored in native order, which gives the right bytes on
/// either byte order.
#[inline(always)]
fn fold(sum: u64) -> u16 {
    let mut s = (sum & 0xffff_ffff) + (sum >> 32);
    s = (s & 0xffff_ffff) + (s >> 32);
    let mut t = (s & 0xffff) + (s >> 16);
    t = (t & 0xffff) + (t >> 16);
    !(t as u16)
}
