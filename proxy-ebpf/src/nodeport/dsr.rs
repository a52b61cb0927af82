//! Direct server return (`--nodeport-mode dsr`): a flow from outside
//! to a backend on another node keeps the client as its source, and the
//! backend's node answers the client itself, with the frontend as the
//! source of the replies. The frontend travels with the packets in an IPv4
//! option, or an IPv6 destination options header right after the fixed
//! header ([`proxy_common::dsr`]); this kernel has no IPIP or Geneve, and
//! an option costs 8 (24) bytes where a tunnel costs 20 (40) or more.
//!
//! - The node that balances the flow ([`new_direct_flow`]) tracks it with
//!   [`ct_flags::DSR_BALANCED`] (it will see only the client's packets),
//!   rewrites the destination to the backend and puts the option after the
//!   fixed header of every packet it forwards ([`carry_xdp`], [`carry_tc`]),
//!   so the backend's node can track the whole flow from the packets it
//!   gets, and lose nothing on a restart of either agent.
//! - The backend's node ([`arrived`]) tracks the flow as if it had been
//!   balanced here: the forward entry keyed by the frontend the option
//!   names, the reply entry by the backend. The packet goes on to the pod
//!   unchanged (an unknown option is skipped by the receiver), and the
//!   pod's replies get the frontend as their source on the uplink's egress
//!   (`sb_to_pod`, one lookup), as a local NodePort backend's do.
//! - A packet the option would make larger than the route's MTU is
//!   answered with an ICMP "fragmentation needed" from the frontend,
//!   quoting the packet as the client sent it, so the client's path MTU to
//!   the frontend leaves room for the option ([`crate::reject::tc_too_big`]).
//!   A GSO packet is resegmented by the kernel to fit instead.
use aya_ebpf::{
    bindings::bpf_adj_room_mode::BPF_ADJ_ROOM_NET,
    helpers::{bpf_skb_adjust_room, bpf_xdp_adjust_head, bpf_xdp_adjust_meta},
    programs::{TcContext, XdpContext},
};
use proxy_common::{dsr, stat, Addr6Be, DsrOpt4, DsrOpt6};

use super::{NotTranslated, Out, Up, UplinkFamily};
use crate::{
    ct::track::{noted, track, Source},
    packet::{
        csum_replace2,
        ctx::{ptr_at, LoadBytes, PacketCtx},
        set,
        v6::{load, IP6_L4_OFF, IPV6_HLEN, NEXTHDR_DEST},
        Ipv4Hdr, Skip, ETH_HLEN, IPV4_MIN_HLEN, IP_CSUM_OFF,
    },
    rewrite::RewriteFailed,
};
use proxy_common::ct_flags;

/// Where the option goes: right after the fixed IPv4 header.
const OPT_OFF: usize = ETH_HLEN + IPV4_MIN_HLEN;
const OPT_LEN: usize = dsr::OPT4_LEN as usize;
/// The IPv6 destination options header, right after the fixed header.
const HDR6_LEN: usize = dsr::HDR6_LEN as usize;
/// Offsets of the IPv6 payload length and next header.
const IP6_PAYLOAD_LEN_OFF: usize = ETH_HLEN + 4;
const IP6_NEXT_OFF: usize = ETH_HLEN + 6;
/// Where the moves of [`carry_xdp`] and [`carry6_xdp`] start: the
/// ethertype (the MAC addresses are the route's, written after).
const MOVE_FROM: usize = 12;

/// Reads the frontend an IPv4 packet's first option names, when it is the
/// direct-server-return option, into `u.dsr_addr_be` / `u.dsr_port_be`
/// (port 0: none). Only a packet with options pays more than a compare.
#[inline(always)]
pub(crate) fn read_option<C: PacketCtx>(ctx: &C, u: &mut Up<u32>) {
    u.dsr_port_be = 0;
    if u.s.flow.l4_off < OPT_OFF + OPT_LEN {
        return;
    }
    let Ok(at) = ptr_at::<DsrOpt4>(ctx, OPT_OFF) else {
        return;
    };
    // SAFETY: `ptr_at` checked the option lies inside the packet; a read
    // that does not assume alignment.
    let opt = unsafe { core::ptr::read_unaligned(at) };
    if opt.kind == dsr::OPT4_TYPE && opt.len == dsr::OPT4_LEN && opt.port_be != 0 {
        u.dsr_addr_be = opt.addr_be;
        u.dsr_port_be = opt.port_be;
    }
}

/// IPv6: as [`read_option`], from a destination options header right
/// after the fixed header holding the option alone.
#[inline(always)]
pub(crate) fn read_option6<C: PacketCtx + LoadBytes>(ctx: &C, u: &mut Up<Addr6Be>) {
    u.dsr_port_be = 0;
    let Ok(next) = ptr_at::<u8>(ctx, IP6_NEXT_OFF) else {
        return;
    };
    // SAFETY: `ptr_at` checked the byte lies inside the packet; a read.
    if unsafe { *next } != NEXTHDR_DEST {
        return;
    }
    let Ok(hdr) = load::<DsrOpt6>(ctx, IP6_L4_OFF) else {
        return;
    };
    if hdr.hdr_ext_len == dsr::HDR6_EXT_LEN
        && hdr.opt_type == dsr::OPT6_TYPE
        && hdr.opt_len == dsr::OPT6_DATA_LEN
        && hdr.port_be != 0
    {
        set(&mut u.dsr_addr_be, &hdr.addr_be);
        u.dsr_port_be = hdr.port_be;
    }
}

/// A packet another node balanced to a backend here, the frontend in
/// `u.dsr_*`: tracked (a new flow) or noted (a tracked one) under the
/// frontend, so the backend's replies leave with it as their source. The
/// packet itself is delivered unchanged.
#[inline(always)]
pub(crate) fn arrived<A: UplinkFamily>(u: &mut Up<A>) -> Result<Out, NotTranslated> {
    // The flow as its client sent it: to the frontend, the packet's
    // destination being the backend.
    let flow = &mut u.s.flow;
    set(&mut u.s.backend.addr_be, &flow.daddr_be);
    u.s.backend.port_be = flow.dport_be;
    set(&mut flow.daddr_be, &u.dsr_addr_be);
    flow.dport_be = u.dsr_port_be;
    flow.ct_key_into(proxy_common::ct_dir::FORWARD, &mut u.s.key);
    // A SYN (re)starts the flow: a port reused after a close gets fresh
    // entries, a retransmitted SYN the same ones again.
    if !u.s.flow.opens_connection() && noted(&mut u.s) {
        return Ok(Out::Arrived);
    }
    // The balancing node counts the flow for its service; this node does
    // not know the service (the option names the frontend only).
    match track(&mut u.s, 0, 0, Source::Arrived, false) {
        Ok(()) => Ok(Out::Arrived),
        Err(_) => Err(NotTranslated::Drop(stat::CT_FULL)),
    }
}

/// The metadata XDP puts before a packet whose arrival it tracked, so the
/// uplink's tc program, which sees the packet next, does not track it
/// again (nor count it twice).
const TRACKED_MARK: u32 = u32::from_be_bytes(*b"sbDR");

/// Whether this kernel lets XDP programs call `bpf_xdp_adjust_meta` (1) or
/// not (0; some hardened kernels refuse the helper to XDP): read-only data,
/// set by the loader from a probe (`proxy_common::names::XDP_META`). The
/// verifier reads it as a constant, so without it the call is dead code it
/// never checks.
#[unsafe(no_mangle)]
pub static SB_XDP_META: u32 = 1;

/// Whether XDP can mark the packets whose arrival it tracks
/// ([`SB_XDP_META`]). When it cannot, it leaves every packet that carries
/// the option to tc, which then is the only layer to track arrivals.
#[inline(always)]
pub(crate) fn xdp_marks() -> bool {
    // SAFETY: a read of the program's read-only data; volatile so the
    // compiler keeps the load the verifier reads as a constant.
    unsafe { core::ptr::read_volatile(&SB_XDP_META) != 0 }
}

/// XDP: marks the packet as tracked ([`TRACKED_MARK`], four bytes of
/// metadata). A driver without metadata support refuses: then tc tracks
/// the packet again, which notes the same state twice and counts it twice.
#[inline(always)]
pub(crate) fn mark_tracked(ctx: &XdpContext) {
    // The verifier sees this branch as constant and never checks the call
    // where the kernel has no such helper for XDP.
    if !xdp_marks() {
        return;
    }
    // SAFETY: a resizing helper on our own context; pointers are taken
    // anew after it.
    if unsafe { bpf_xdp_adjust_meta(ctx.ctx, -4) } != 0 {
        return;
    }
    let (meta, data) = (ctx.metadata(), ctx.data());
    if meta + 4 > data {
        return;
    }
    // SAFETY: the check above: the four metadata bytes lie before the
    // packet, in memory the program may write.
    unsafe { core::ptr::write_unaligned(meta as *mut u32, TRACKED_MARK) };
}

/// tc: whether XDP tracked this packet's arrival already ([`mark_tracked`]).
#[inline(always)]
pub(crate) fn tracked_by_xdp(ctx: &TcContext) -> bool {
    // SAFETY: reads of our context.
    let (meta, data) = unsafe { ((*ctx.skb.skb).data_meta as usize, ctx.data()) };
    if meta + 4 > data {
        return false;
    }
    // SAFETY: the check above: four metadata bytes lie before the packet.
    unsafe { core::ptr::read_unaligned(meta as *const u32) == TRACKED_MARK }
}

/// Records a new flow to backend `backend_id` on another node (in
/// `u.s.backend`, forward key in `u.s.key`) for direct server return.
#[inline(always)]
pub(crate) fn new_direct_flow<A: UplinkFamily>(
    u: &mut Up<A>,
    backend_id: u32,
    service_id: u32,
    counted: bool,
) -> Result<Out, NotTranslated> {
    if track(&mut u.s, backend_id, service_id, Source::Direct, counted).is_err() {
        // The table is full: the client retransmits.
        return Err(NotTranslated::Drop(stat::CT_FULL));
    }
    Ok(set_direct(u))
}

/// The translation of a flow returned directly (backend in `u.s.backend`):
/// the destination only, and the frontend (the packet's destination now)
/// to carry.
#[inline(always)]
pub(crate) fn set_direct<A: UplinkFamily>(u: &mut Up<A>) -> Out {
    super::set_local(u);
    set(&mut u.dsr_addr_be, &u.s.flow.daddr_be);
    u.dsr_port_be = u.s.flow.dport_be;
    Out::Direct
}

/// Whether the tracked flow entry in `u.s.entry` is returned directly.
#[inline(always)]
pub(crate) fn is_direct<A: UplinkFamily>(u: &Up<A>) -> bool {
    u.s.entry.flags & ct_flags::DSR_BALANCED != 0
}

/// The option's bytes, as 16-bit words in packet order, for the checksum.
#[inline(always)]
fn option_words(addr_be: u32, port_be: u16) -> [u16; 4] {
    let a = addr_be.to_ne_bytes();
    [
        u16::from_ne_bytes([dsr::OPT4_TYPE, dsr::OPT4_LEN]),
        port_be,
        u16::from_ne_bytes([a[0], a[1]]),
        u16::from_ne_bytes([a[2], a[3]]),
    ]
}

/// The IPv4 header's first word (version, IHL, TOS) and total length with
/// the option added, and the header checksum over both and the option:
/// `(word0, tot_len_be, csum)`. `None` when the header has no room left for
/// the option.
#[inline(always)]
fn grown_header(ip: &Ipv4Hdr, u: &Up<u32>) -> Option<(u16, u16, u16)> {
    let ihl = ip.version_ihl & 0x0f;
    if ihl > dsr::MAX_IHL_BEFORE {
        return None;
    }
    let old_word0 = u16::from_ne_bytes([ip.version_ihl, ip.tos]);
    let new_word0 = u16::from_ne_bytes([ip.version_ihl + dsr::OPT4_LEN / 4, ip.tos]);
    let tot_len_be = (u16::from_be(ip.tot_len_be).wrapping_add(OPT_LEN as u16)).to_be();
    let mut csum = csum_replace2(ip.csum_be, old_word0, new_word0);
    csum = csum_replace2(csum, ip.tot_len_be, tot_len_be);
    let words = option_words(u.dsr_addr_be, u.dsr_port_be);
    let mut i = 0;
    while i < words.len() {
        csum = csum_replace2(csum, 0, words[i]);
        i += 1;
    }
    Some((new_word0, tot_len_be, csum))
}

/// XDP: puts the option of `u` after the fixed IPv4 header. The frame
/// grows at its head: the ethertype and the fixed IPv4 header move 8 bytes
/// to the front (the MAC addresses are not moved: the caller writes the
/// route's), then the header gets its new length and checksum. Every
/// pointer is taken anew after the resize.
#[inline(always)]
pub(crate) fn carry_xdp(ctx: &XdpContext, u: &Up<u32>) -> Result<(), RewriteFailed> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN).map_err(|_| RewriteFailed)?;
    // SAFETY: `ptr_at` checked the fixed header lies inside the frame; read.
    let Some((word0, tot_len_be, csum)) = grown_header(unsafe { &*ip }, u) else {
        return Err(RewriteFailed);
    };
    // SAFETY: a resizing helper on our own context; no packet pointer taken
    // before it is used after it.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(OPT_LEN as i32)) } != 0 {
        return Err(RewriteFailed);
    }
    let base = moved_headers::<{ OPT_OFF + OPT_LEN }>(ctx, OPT_LEN)?;
    let words = base as *mut u16;
    let opt = option_words(u.dsr_addr_be, u.dsr_port_be);
    let mut j = 0;
    while j < opt.len() {
        // SAFETY: the option's words are the checked head's last four.
        unsafe { core::ptr::write_volatile(words.add(OPT_OFF / 2 + j), opt[j]) };
        j += 1;
    }
    // SAFETY: as above: the header's first, second and sixth words.
    unsafe {
        core::ptr::write_volatile(words.add(ETH_HLEN / 2), word0);
        core::ptr::write_volatile(words.add(ETH_HLEN / 2 + 1), tot_len_be);
        core::ptr::write_volatile(words.add(IP_CSUM_OFF / 2), csum);
    }
    Ok(())
}

/// After the frame grew by `grown` bytes at its head: moves the ethertype
/// and the fixed IP header (up to `END - grown`) to the front, where they
/// belong, leaving `grown` bytes after them. The frame's first `END` bytes
/// (checked to be there), from where they start now.
#[inline(always)]
fn moved_headers<const END: usize>(
    ctx: &XdpContext,
    grown: usize,
) -> Result<*mut u8, RewriteFailed> {
    let frame = ptr_at::<[u8; END]>(ctx, 0).map_err(|_| RewriteFailed)?;
    let base = frame as *mut u8;
    let moved = END - grown - MOVE_FROM;
    // SAFETY: every byte read or written lies inside the checked `END`
    // bytes; the moves go in rising order, each read `grown` bytes ahead of
    // the last write. `moved` is 22 (IPv4) or 42 (IPv6): 2 more than a
    // multiple of 4.
    unsafe {
        move_down::<u32>(base, MOVE_FROM, MOVE_FROM + grown, moved - 2);
        let last = MOVE_FROM + moved - 2;
        move_down::<u16>(base, last, last + grown, 2);
    }
    Ok(base)
}

/// Moves `len` bytes at `base + from` to `base + to` (`to < from`), `T`
/// at a time in rising order, so a region that overlaps its destination
/// is read before it is overwritten. The volatile accesses keep the copy
/// loads and stores of `T` (a plain copy of overlapping memory becomes
/// `memmove`, a byte loop on BPF).
///
/// # Safety
/// Both ranges lie inside memory the caller may read and write. They need
/// not be aligned for `T`: the program reads and writes the frame at any
/// offset (the verifier enforces no alignment on packet memory on this
/// architecture, as for the IPv4 header's fields at offset 14).
#[inline(always)]
unsafe fn move_down<T: Copy>(base: *mut u8, to: usize, from: usize, len: usize) {
    let step = core::mem::size_of::<T>();
    let mut i = 0;
    while i < len / step {
        // SAFETY: the caller's guarantee.
        unsafe {
            let w = core::ptr::read_volatile(base.add(from + i * step) as *const T);
            core::ptr::write_volatile(base.add(to + i * step) as *mut T, w);
        }
        i += 1;
    }
}

/// tc: the same as [`carry_xdp`], the room made by the kernel after the
/// fixed IPv4 header (`BPF_ADJ_ROOM_NET`; a GSO packet's segment size
/// shrinks by as much, so its segments still fit the MTU).
#[inline(always)]
pub(crate) fn carry_tc(ctx: &TcContext, u: &Up<u32>) -> Result<(), RewriteFailed> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN).map_err(|_| RewriteFailed)?;
    // SAFETY: `ptr_at` checked the fixed header lies inside the packet; read.
    let Some((word0, tot_len_be, csum)) = grown_header(unsafe { &*ip }, u) else {
        return Err(RewriteFailed);
    };
    // SAFETY: a resizing helper on our own context; no packet pointer taken
    // before it is used after it.
    let grown = unsafe { bpf_skb_adjust_room(ctx.skb.skb, OPT_LEN as i32, BPF_ADJ_ROOM_NET, 0) };
    if grown != 0 {
        return Err(RewriteFailed);
    }
    let opt = DsrOpt4 {
        kind: dsr::OPT4_TYPE,
        len: dsr::OPT4_LEN,
        port_be: u.dsr_port_be,
        addr_be: u.dsr_addr_be,
    };
    let head = [word0, tot_len_be];
    ctx.store(OPT_OFF, &opt, 0).map_err(|_| RewriteFailed)?;
    ctx.store(ETH_HLEN, &head, 0).map_err(|_| RewriteFailed)?;
    ctx.store(IP_CSUM_OFF, &csum, 0).map_err(|_| RewriteFailed)
}

/// IPv6, XDP: puts the destination options header with the option of `u`
/// after the fixed header, as [`carry_xdp`] puts the IPv4 option: the
/// ethertype and fixed header move 24 bytes to the front, the header's
/// next header becomes 60 (destination options, whose own next header is
/// the packet's TCP or UDP) and its payload length grows by 24. The L4
/// checksum does not change: its pseudo-header counts the L4 length.
#[inline(always)]
pub(crate) fn carry6_xdp(ctx: &XdpContext, u: &Up<Addr6Be>) -> Result<(), RewriteFailed> {
    // SAFETY: a resizing helper on our own context; no packet pointer taken
    // before it is used after it.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(HDR6_LEN as i32)) } != 0 {
        return Err(RewriteFailed);
    }
    let base = moved_headers::<{ IP6_L4_OFF + HDR6_LEN }>(ctx, HDR6_LEN)?;
    // SAFETY: the fields and the header's 24 bytes lie inside the checked
    // head; as in `moved_headers`, no alignment is assumed.
    unsafe {
        let next_at = base.add(IP6_NEXT_OFF);
        let len_at = base.add(IP6_PAYLOAD_LEN_OFF) as *mut u16;
        let next = core::ptr::read_volatile(next_at);
        let len_be = core::ptr::read_volatile(len_at);
        let words = header6_words(next, u);
        let hdr = base.add(IP6_L4_OFF) as *mut u32;
        let mut j = 0;
        while j < words.len() {
            core::ptr::write_volatile(hdr.add(j), words[j]);
            j += 1;
        }
        core::ptr::write_volatile(len_at, grown_be(len_be, HDR6_LEN));
        core::ptr::write_volatile(next_at, NEXTHDR_DEST);
    }
    Ok(())
}

/// IPv6, tc: the same as [`carry6_xdp`], the room made by the kernel after
/// the fixed header (`BPF_ADJ_ROOM_NET`), as [`carry_tc`].
#[inline(always)]
pub(crate) fn carry6_tc(ctx: &TcContext, u: &Up<Addr6Be>) -> Result<(), RewriteFailed> {
    let next: u8 = load(ctx, IP6_NEXT_OFF).map_err(|_| RewriteFailed)?;
    let len_be: u16 = load(ctx, IP6_PAYLOAD_LEN_OFF).map_err(|_| RewriteFailed)?;
    // SAFETY: a resizing helper on our own context; no packet pointer is
    // held across it.
    let grown = unsafe { bpf_skb_adjust_room(ctx.skb.skb, HDR6_LEN as i32, BPF_ADJ_ROOM_NET, 0) };
    if grown != 0 {
        return Err(RewriteFailed);
    }
    let hdr = DsrOpt6 {
        next_hdr: next,
        hdr_ext_len: dsr::HDR6_EXT_LEN,
        opt_type: dsr::OPT6_TYPE,
        opt_len: dsr::OPT6_DATA_LEN,
        port_be: u.dsr_port_be,
        _reserved: [0; 2],
        addr_be: u.dsr_addr_be,
    };
    ctx.store(IP6_L4_OFF, &hdr, 0).map_err(|_| RewriteFailed)?;
    ctx.store(IP6_PAYLOAD_LEN_OFF, &grown_be(len_be, HDR6_LEN), 0)
        .map_err(|_| RewriteFailed)?;
    ctx.store(IP6_NEXT_OFF, &NEXTHDR_DEST, 0)
        .map_err(|_| RewriteFailed)
}

/// The destination options header carrying `u`'s frontend, before the
/// header `next`, as 32-bit words in packet order.
#[inline(always)]
fn header6_words(next: u8, u: &Up<Addr6Be>) -> [u32; 6] {
    let [p0, p1] = u.dsr_port_be.to_ne_bytes();
    let a = &u.dsr_addr_be;
    [
        u32::from_ne_bytes([next, dsr::HDR6_EXT_LEN, dsr::OPT6_TYPE, dsr::OPT6_DATA_LEN]),
        u32::from_ne_bytes([p0, p1, 0, 0]),
        a[0],
        a[1],
        a[2],
        a[3],
    ]
}

/// A length field (network order) grown by `by`.
#[inline(always)]
fn grown_be(len_be: u16, by: usize) -> u16 {
    u16::from_be(len_be).saturating_add(by as u16).to_be()
}

/// Whether the skb is a GSO packet (the kernel resegments it to fit the
/// MTU with the option: its length is not checked).
#[inline(always)]
pub(crate) fn is_gso(ctx: &TcContext) -> bool {
    // SAFETY: a read of our context.
    unsafe { (*ctx.skb.skb).gso_segs > 1 }
}

/// The IPv4 total length of the packet at `ctx` with the option.
#[inline(always)]
pub(crate) fn grown_len<C: PacketCtx>(ctx: &C) -> Result<u16, Skip> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the fixed header lies inside the packet; read.
    let tot_len = u16::from_be(unsafe { (*ip).tot_len_be });
    Ok(tot_len.saturating_add(OPT_LEN as u16))
}

/// The IPv6 length (fixed header included, as the route lookup's MTU
/// check counts it) of the packet at `ctx` with the destination options
/// header.
#[inline(always)]
pub(crate) fn grown_len6<C: PacketCtx>(ctx: &C) -> Result<u16, Skip> {
    let len = ptr_at::<u16>(ctx, IP6_PAYLOAD_LEN_OFF)?;
    // SAFETY: `ptr_at` checked the field lies inside the packet; read.
    let payload = u16::from_be(unsafe { core::ptr::read_unaligned(len) });
    Ok(payload.saturating_add((IPV6_HLEN + HDR6_LEN) as u16))
}
