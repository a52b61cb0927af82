//! The tc pod path for IPv6 (`sb_from_pod` / `sb_to_pod` dispatch here on
//! ethertype 0x86DD, once, before the IPv4 parser): DNAT of packets a pod
//! sends to an IPv6 frontend, the reverse on the replies, with connection
//! tracking in `SB_CT6_V1`, the same rules as [`super::pod`] for IPv4.
//!
//! The IPv6 path is a program of its own (`sb_from_pod6`, `sb_to_pod6`),
//! tail-called through `SB_TAIL6_V1`: the IPv4 path's stack frame (320
//! bytes) and the IPv6 path's do not fit in one program's 512 bytes, nor in
//! one call chain. So the IPv4 path's code and frame are what they were,
//! plus one compare. Its keys and entries live in per-CPU scratch memory
//! ([`crate::packet::v6::Scratch6`]).
//!
//! IPv6 has no header checksum; the TCP/UDP checksum covers the addresses
//! through the pseudo-header. A rewrite stores the new address (16 bytes)
//! and port directly where they lie in the linear data (with
//! `bpf_skb_store_bytes` elsewhere) and updates the L4 checksum with
//! `bpf_l4_csum_replace`: the address as a one's-complement difference
//! (size 0, `BPF_F_PSEUDO_HDR`, and `BPF_F_IPV6` so a `CHECKSUM_COMPLETE`
//! skb's sum is left alone: the address change and the checksum change
//! cancel in it), the port as a 2-byte change. UDP uses
//! `BPF_F_MARK_MANGLED_0`: a computed 0 is sent as 0xffff, and a zero
//! checksum (invalid in IPv6 except for tunnels, RFC 6935) stays zero.
//!
//! Per packet, as IPv4: the frontend bitmap first ([`crate::prefilter`]),
//! then for an existing flow one connection-tracking lookup and no frontend
//! lookup; a plain TCP or UDP packet is parsed in place. `sb_to_pod` checks
//! the quiet mark before it tells the families apart.
use crate::ct::track6::continued_entry6;
use crate::ct::track6::track6;
use crate::ct::track6::tracked_backend6;
use crate::prefilter::{maybe_frontend6, unquiet};
use crate::rewrite::count_rewritten;
use crate::rewrite::v6::rewrite6;
use crate::{
    lb::{choose_backend, frontend_key, lookup_frontend},
    maps::SB_AFFINITY6_V1,
    maps::{count, count_denied, count_service, source_allowed6, SB_CT6_V1, SB_SCRATCH6_V1},
    packet::v6::{parse6, Kind6, Scratch6},
    packet::Skip,
    rewrite::Side,
    skb::drop_counted,
};
use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use proxy_common::{ct_dir, ct_flags, stat};
/// `sb_from_pod6`: a packet a pod sends, IPv6.
#[inline(always)]
pub fn from_pod6(ctx: &TcContext) -> i32 {
    let Some(s) = scratch() else {
        return crate::skb::pass(Skip::NotOurs);
    };
    match try_from_pod6(ctx, s) {
        Ok(action) => action,
        Err(skip) => crate::skb::pass(skip),
    }
}

/// `sb_to_pod6`: a packet going into a pod, IPv6.
#[inline(always)]
pub fn to_pod6(ctx: &TcContext) -> i32 {
    let Some(s) = scratch() else {
        return crate::skb::pass(Skip::NotOurs);
    };
    match try_to_pod6(ctx, s) {
        Ok(action) => action,
        Err(skip) => crate::skb::pass(skip),
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
        Kind6::Later => return crate::frag::v6::later(ctx, s, ct_dir::FORWARD),
        Kind6::Icmp => return crate::icmp::v6::translate(ctx, s, ct_dir::FORWARD),
    }
    if !maybe_frontend6(&s.flow.daddr_be) {
        // No frontend has this address: only a hairpin reply can be ours.
        return crate::hairpin::v6::reply(ctx, s);
    }
    // A packet of an existing flow: one lookup, no frontend.
    s.flow.ct_key_into(ct_dir::FORWARD, &mut s.key);
    if let Some(service_id) = continued_entry6(s) {
        return forward6(ctx, s, service_id);
    }
    let flow = &s.flow;
    s.fe = frontend_key(flow.daddr_be, flow.dport_be, flow.proto);
    let Some(svc) = lookup_frontend(&s.fe) else {
        // A pod's reply to a hairpin flow goes to the hairpin address.
        return crate::hairpin::v6::reply(ctx, s);
    };
    if !source_allowed6(&svc, &s.flow.saddr_be) {
        count_denied(svc.service_id);
        return Ok(TC_ACT_SHOT);
    }
    if svc.backend_count == 0 {
        count_service(svc.service_id, |st| st.drops_no_backend += 1);
        return Ok(crate::reject::v6::from_pod(ctx, s, &svc));
    }
    if !tracked_backend6(s, svc.service_id) {
        s.aff.client_addr_be = s.flow.saddr_be;
        s.aff.service_id = svc.service_id;
        let Some((id, backend)) = choose_backend(s.fe, &svc, &SB_AFFINITY6_V1, &s.aff) else {
            return drop_counted(stat::DROP_INCONSISTENT);
        };
        s.backend = backend;
        let outcome = if crate::hairpin::v6::is_hairpin(&s.flow, &s.backend.addr_be) {
            crate::hairpin::v6::track(s, id, svc.service_id)
        } else {
            track6(s, id, svc.service_id)
        };
        if outcome.is_err() {
            // The table is full: the client retransmits.
            return drop_counted(stat::CT_FULL);
        }
        // Replies of this flow will come to this pod's interface (after
        // the insert, as in `pod`).
        unquiet(ctx);
    }
    forward6(ctx, s, svc.service_id)
}

/// A packet of a tracked flow to its backend (in `s.backend`): DNAT, or
/// the hairpin's rewrite of both addresses.
#[inline(always)]
fn forward6(ctx: &TcContext, s: &mut Scratch6, service_id: u32) -> Result<i32, Skip> {
    if crate::hairpin::v6::is_hairpin(&s.flow, &s.backend.addr_be) {
        return crate::hairpin::v6::forward(ctx, s, service_id);
    }
    let port_be = s.backend.port_be;
    if s.flow.first_fragment {
        crate::frag::v6::remember(s, Side::Destination, service_id);
    }
    if rewrite6(ctx, &s.flow, Side::Destination, &s.backend.addr_be, port_be).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count_rewritten(ctx, Side::Destination, service_id);
    Ok(TC_ACT_OK)
}

/// A packet going into a pod, IPv6: a reply of a tracked flow gets the
/// frontend as its source again.
#[inline(always)]
fn try_to_pod6(ctx: &TcContext, s: &mut Scratch6) -> Result<i32, Skip> {
    match parse6(ctx, &mut s.flow)? {
        Kind6::Flow => {}
        Kind6::Later => return crate::frag::v6::later(ctx, s, ct_dir::REPLY),
        Kind6::Icmp => return crate::icmp::v6::translate(ctx, s, ct_dir::REPLY),
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
    crate::ct::note(entry_ptr, flow, true, || {
        let k = &mut s.key2;
        k.saddr_be = flow.daddr_be;
        k.daddr_be = s.backend.addr_be;
        k.sport_be = flow.dport_be;
        k.dport_be = s.backend.port_be;
        k.proto = flow.proto;
        k.dir = ct_dir::FORWARD;
        k._pad = [0; 2];
        SB_CT6_V1.get_ptr_mut(s.key2)
    });
    let port_be = s.backend.port_be;
    if s.flow.first_fragment {
        crate::frag::v6::remember(s, Side::Source, service_id);
    }
    if rewrite6(ctx, &s.flow, Side::Source, &s.backend.addr_be, port_be).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count_rewritten(ctx, Side::Source, service_id);
    Ok(TC_ACT_OK)
}
