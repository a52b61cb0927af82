//! The tc pod path for IPv6 (`sb_from_pod` / `sb_to_pod` dispatch here on
//! ethertype 0x86DD, once, before the IPv4 parser): DNAT of packets a pod
//! sends to an IPv6 frontend, the reverse on the replies, with connection
//! tracking in `SB_CT6_V1`, the same rules as [`crate::tc`] for IPv4.
//!
//! The IPv6 path is a program of its own (`sb_from_pod6`, `sb_to_pod6`),
//! tail-called through `SB_TAIL6_V1`: the IPv4 path's stack frame (320
//! bytes) and the IPv6 path's do not fit in one program's 512 bytes, nor in
//! one call chain. So the IPv4 path's code and frame are what they were,
//! plus one compare. Its keys and entries live in per-CPU scratch memory
//! ([`crate::packet6::Scratch6`]).
//!
//! IPv6 has no header checksum; the TCP/UDP checksum covers the addresses
//! through the pseudo-header. A rewrite stores the new address (16 bytes)
//! and port with `bpf_skb_store_bytes` and updates the L4 checksum with
//! `bpf_l4_csum_replace`: the address as a one's-complement difference
//! (size 0, `BPF_F_PSEUDO_HDR`, and `BPF_F_IPV6` so a `CHECKSUM_COMPLETE`
//! skb's sum is left alone: the address change and the checksum change
//! cancel in it), the port as a 2-byte change. UDP uses
//! `BPF_F_MARK_MANGLED_0`: a computed 0 is sent as 0xffff, and a zero
//! checksum (invalid in IPv6 except for tunnels, RFC 6935) stays zero. No
//! direct stores and no tail call: these programs see every packet of the
//! node and never store directly (see `tc::rewrite_in_place`).
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, TC_ACT_OK, TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use proxy_common::{ct_dir, ct_flags, proto, stat, Addr6Be};

use crate::{
    lb6::{backend_is_live6, choose_backend6, frontend_key6, lookup_frontend6},
    maps::{
        count, count_denied, count_service, source_allowed6, SB_CT6_V1, SB_SCRATCH6_V1, SB_TAIL6_V1,
    },
    packet::{Skip, TCP_CSUM_OFF, UDP_CSUM_OFF},
    packet6::{addr_diff, eq6, parse6, Flow6, Kind6, Scratch6, IP6_DADDR_OFF, IP6_SADDR_OFF},
    tc::{drop_counted, RewriteFailed, Side, TableFull},
};

/// `BPF_F_IPV6` (Linux 6.16+): the checksummed packet is IPv6. Older kernels
/// refuse the flag; the rewrite then retries without it.
const BPF_F_IPV6: u64 = 1 << 7;

/// Tail-calls the IPv6 program `slot` (`tail::FROM_POD6`, `tail::TO_POD6`).
/// Returns only if the call failed (the agent has not filled the array
/// yet): the packet passes untouched, counted.
#[inline(always)]
pub fn hand_over6(ctx: &TcContext, slot: u32) -> i32 {
    // SAFETY: a tail call with our own context and program array; on success
    // it does not return.
    unsafe { SB_TAIL6_V1.tail_call(ctx, slot) };
    count(stat::TAIL_CALL_MISSED);
    TC_ACT_UNSPEC
}

/// `sb_from_pod6`: a packet a pod sends, IPv6.
#[inline(always)]
pub fn from_pod6(ctx: &TcContext) -> i32 {
    let Some(s) = scratch() else {
        return crate::tc::pass(Skip::NotOurs);
    };
    match try_from_pod6(ctx, s) {
        Ok(action) => action,
        Err(skip) => crate::tc::pass(skip),
    }
}

/// `sb_to_pod6`: a packet going into a pod, IPv6.
#[inline(always)]
pub fn to_pod6(ctx: &TcContext) -> i32 {
    let Some(s) = scratch() else {
        return crate::tc::pass(Skip::NotOurs);
    };
    match try_to_pod6(ctx, s) {
        Ok(action) => action,
        Err(skip) => crate::tc::pass(skip),
    }
}

/// This CPU's scratch memory.
#[inline(always)]
fn scratch() -> Option<&'static mut Scratch6> {
    let ptr = SB_SCRATCH6_V1.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU array, valid for the program run;
    // no other program runs on this CPU meanwhile (tc programs are not
    // preempted by another tc program on the same CPU).
    Some(unsafe { &mut *ptr })
}

/// A packet a pod sends, IPv6: DNAT to a backend if it is for a frontend.
#[inline(always)]
fn try_from_pod6(ctx: &TcContext, s: &mut Scratch6) -> Result<i32, Skip> {
    match parse6(ctx, &mut s.flow)? {
        Kind6::Flow => {}
        Kind6::Later => return crate::frag6::later(ctx, s, ct_dir::FORWARD),
        Kind6::Icmp => return crate::icmp6::translate(ctx, s, ct_dir::FORWARD),
    }
    let flow = &s.flow;
    frontend_key6(&mut s.fe, &flow.daddr_be, flow.dport_be, flow.proto);
    let Some(svc) = lookup_frontend6(&s.fe) else {
        // A pod's reply to a hairpin flow goes to the hairpin address.
        return crate::hairpin6::reply(ctx, s);
    };
    if !source_allowed6(&svc, &s.flow.saddr_be) {
        count_denied(svc.service_id);
        return Ok(TC_ACT_SHOT);
    }
    if svc.backend_count == 0 {
        count_service(svc.service_id, |st| st.drops_no_backend += 1);
        return Ok(crate::reject6::from_pod(ctx, s, &svc));
    }
    flow.ct_key_into(ct_dir::FORWARD, &mut s.key);
    if !tracked_backend6(s, svc.service_id) {
        s.aff.client_addr_be = s.flow.saddr_be;
        s.aff.service_id = svc.service_id;
        let Some(id) = choose_backend6(&mut s.fe, &svc, &s.aff, &mut s.backend) else {
            return drop_counted(stat::DROP_INCONSISTENT);
        };
        let outcome = if crate::hairpin6::is_hairpin(&s.flow, &s.backend.addr_be) {
            crate::hairpin6::track(s, id, svc.service_id)
        } else {
            track6(s, id, svc.service_id)
        };
        if outcome.is_err() {
            // The table is full: the client retransmits.
            return drop_counted(stat::CT_FULL);
        }
    }
    if crate::hairpin6::is_hairpin(&s.flow, &s.backend.addr_be) {
        return crate::hairpin6::forward(ctx, s, svc.service_id);
    }
    let port_be = s.backend.port_be;
    if s.flow.first_fragment {
        crate::frag6::remember(s, Side::Destination, svc.service_id);
    }
    if rewrite6(ctx, &s.flow, Side::Destination, &s.backend.addr_be, port_be).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count_rewritten6(ctx, Side::Destination, svc.service_id);
    Ok(TC_ACT_OK)
}

/// A packet going into a pod, IPv6: a reply of a tracked flow gets the
/// frontend as its source again.
#[inline(always)]
fn try_to_pod6(ctx: &TcContext, s: &mut Scratch6) -> Result<i32, Skip> {
    match parse6(ctx, &mut s.flow)? {
        Kind6::Flow => {}
        Kind6::Later => return crate::frag6::later(ctx, s, ct_dir::REPLY),
        Kind6::Icmp => return crate::icmp6::translate(ctx, s, ct_dir::REPLY),
    }
    s.flow.ct_key_into(ct_dir::REPLY, &mut s.key);
    let Some(entry_ptr) = SB_CT6_V1.get_ptr_mut(s.key) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; the
    // fields are copied out (the address into scratch memory).
    let (flags, service_id) = unsafe {
        s.backend.addr_be = (*entry_ptr).nat_addr_be;
        s.backend.port_be = (*entry_ptr).nat_port_be;
        ((*entry_ptr).flags, (*entry_ptr).service_id)
    };
    let flow = &s.flow;
    if flow.accepts_connection() && flags & ct_flags::CLOSING != 0 {
        // As IPv4: the ports were reused by a connection that is not ours.
        if SB_CT6_V1.remove(s.key).is_ok() {
            count(stat::CT_STALE);
        }
        return Err(Skip::NotOurs);
    }
    crate::ct::seen6(entry_ptr, flow, true);
    if flow.ends_connection() {
        crate::ct::mark_closing6(entry_ptr);
        let k = &mut s.key2;
        k.saddr_be = flow.daddr_be;
        k.daddr_be = s.backend.addr_be;
        k.sport_be = flow.dport_be;
        k.dport_be = s.backend.port_be;
        k.proto = flow.proto;
        k.dir = ct_dir::FORWARD;
        k._pad = [0; 2];
        if let Some(forward_ptr) = SB_CT6_V1.get_ptr_mut(s.key2) {
            crate::ct::mark_closing6(forward_ptr);
        }
    }
    let port_be = s.backend.port_be;
    if s.flow.first_fragment {
        crate::frag6::remember(s, Side::Source, service_id);
    }
    if rewrite6(ctx, &s.flow, Side::Source, &s.backend.addr_be, port_be).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count_rewritten6(ctx, Side::Source, service_id);
    Ok(TC_ACT_OK)
}

/// Counts a rewritten packet (the counters IPv4 uses).
#[inline(always)]
pub(crate) fn count_rewritten6(ctx: &TcContext, side: Side, service_id: u32) {
    match side {
        Side::Destination => {
            let len = u64::from(ctx.len());
            count_service(service_id, |st| {
                st.packets += 1;
                st.bytes += len;
            });
            count(stat::FORWARDED);
        }
        Side::Source => count(stat::REVERSED),
    }
}

/// Whether the flow of `s.key` (forward) is tracked and keeps its backend,
/// as [`crate::tc::tracked_backend`] decides it for IPv4 (same service, not
/// a SYN on a closed flow, a live backend for new connections and UDP);
/// then `s.backend` holds it.
#[inline(always)]
pub(crate) fn tracked_backend6(s: &mut Scratch6, service_id: u32) -> bool {
    let Some(entry_ptr) = SB_CT6_V1.get_ptr_mut(s.key) else {
        return false;
    };
    // SAFETY: a value of the conntrack map, valid for this program run; the
    // fields are copied out.
    let (entry_service, flags, backend_id) = unsafe {
        s.backend.addr_be = (*entry_ptr).nat_addr_be;
        s.backend.port_be = (*entry_ptr).nat_port_be;
        (
            (*entry_ptr).service_id,
            (*entry_ptr).flags,
            (*entry_ptr).backend_id,
        )
    };
    let flow = &s.flow;
    if entry_service != service_id {
        return false;
    }
    if flow.opens_connection() && flags & ct_flags::CLOSING != 0 {
        return false;
    }
    crate::ct::seen6(entry_ptr, flow, false);
    if flow.ends_connection() {
        crate::ct::mark_closing6(entry_ptr);
        let k = &mut s.key2;
        if flags & ct_flags::SNAT != 0 {
            // SAFETY: as above; copied out.
            unsafe {
                k.daddr_be = (*entry_ptr).snat_addr_be;
                k.dport_be = (*entry_ptr).snat_port_be;
            }
        } else {
            k.daddr_be = flow.saddr_be;
            k.dport_be = flow.sport_be;
        }
        k.saddr_be = s.backend.addr_be;
        k.sport_be = s.backend.port_be;
        k.proto = flow.proto;
        k.dir = ct_dir::REPLY;
        k._pad = [0; 2];
        if let Some(reply_ptr) = SB_CT6_V1.get_ptr_mut(s.key2) {
            crate::ct::mark_closing6(reply_ptr);
        }
    }
    if !flow.needs_live_backend()
        || backend_is_live6(backend_id, &s.backend.addr_be, s.backend.port_be)
    {
        return true;
    }
    count(stat::CT_RESELECTED);
    false
}

/// Records both directions of a new IPv6 flow (`s.key` forward, the backend
/// in `s.backend`), as [`crate::tc::track`].
#[inline(always)]
pub(crate) fn track6(s: &mut Scratch6, backend_id: u32, service_id: u32) -> Result<(), TableFull> {
    let now = crate::ct::now_ns();
    let e = &mut s.entry;
    e.backend_id = backend_id;
    e.service_id = service_id;
    e.nat_addr_be = s.backend.addr_be;
    e.nat_port_be = s.backend.port_be;
    e.flags = ct_flags::HANDSHAKE;
    e.state = 0;
    e.snat_addr_be = [0; 4];
    e.snat_port_be = 0;
    e._pad2 = [0; 2];
    e.created_ns = now;
    e.last_seen_ns = now;
    let k = &mut s.key2;
    k.saddr_be = s.backend.addr_be;
    k.daddr_be = s.flow.saddr_be;
    k.sport_be = s.backend.port_be;
    k.dport_be = s.flow.sport_be;
    k.proto = s.flow.proto;
    k.dir = ct_dir::REPLY;
    k._pad = [0; 2];
    crate::tc::tracked(
        crate::ct::insert_pair6(
            &s.key,
            &s.key2,
            &mut s.entry,
            (&s.flow.daddr_be, s.flow.dport_be),
            (&[0; 4], 0),
        ),
        service_id,
    )
}

/// Rewrites one side (address and port) of an IPv6 TCP/UDP packet with
/// helper stores, and its L4 checksum through the kernel's helper.
#[inline(always)]
pub(crate) fn rewrite6(
    ctx: &TcContext,
    flow: &Flow6,
    side: Side,
    new_addr_be: &Addr6Be,
    new_port_be: u16,
) -> Result<(), RewriteFailed> {
    let l4_off = flow.l4_off();
    let (addr_off, old_addr_be, old_port_be, port_off) = match side {
        Side::Source => (IP6_SADDR_OFF, &flow.saddr_be, flow.sport_be, l4_off),
        Side::Destination => (IP6_DADDR_OFF, &flow.daddr_be, flow.dport_be, l4_off + 2),
    };
    let (csum_off, l4_flags) = if flow.proto == proto::TCP {
        (l4_off + TCP_CSUM_OFF, 0)
    } else {
        (l4_off + UDP_CSUM_OFF, u64::from(BPF_F_MARK_MANGLED_0))
    };
    if !eq6(old_addr_be, new_addr_be) {
        let diff = addr_diff(old_addr_be, new_addr_be);
        ctx.store(addr_off, new_addr_be, 0)
            .map_err(|_| RewriteFailed)?;
        l4_csum_diff(ctx, csum_off, diff, l4_flags)?;
    }
    if old_port_be != new_port_be {
        ctx.store(port_off, &new_port_be, 0)
            .map_err(|_| RewriteFailed)?;
        ctx.l4_csum_replace(
            csum_off,
            u64::from(old_port_be),
            u64::from(new_port_be),
            l4_flags | 2,
        )
        .map_err(|_| RewriteFailed)?;
    }
    Ok(())
}

/// Adds the one's-complement difference `diff` of a pseudo-header address
/// change to the L4 checksum at `csum_off`.
#[inline(always)]
pub(crate) fn l4_csum_diff(
    ctx: &TcContext,
    csum_off: usize,
    diff: u32,
    l4_flags: u64,
) -> Result<(), RewriteFailed> {
    let flags = u64::from(BPF_F_PSEUDO_HDR) | l4_flags;
    if ctx
        .l4_csum_replace(csum_off, 0, u64::from(diff), flags | BPF_F_IPV6)
        .is_ok()
    {
        return Ok(());
    }
    // A kernel before 6.16 does not know `BPF_F_IPV6`.
    ctx.l4_csum_replace(csum_off, 0, u64::from(diff), flags)
        .map_err(|_| RewriteFailed)
}
