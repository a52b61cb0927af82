//! `sb_from_uplink`: tc ingress on each uplink, north-south traffic for IPv4
//! (the same decisions as `sb_xdp_uplink`, [`crate::nodeport`]): all the work
//! with `--xdp-mode off`, and with XDP the packets XDP hands on (no neighbour
//! entry yet, TTL 1, fragments, ICMP errors). IPv6 is tail-called into
//! `sb_from_uplink6` ([`super::uplink_tc6`]).
use crate::packet::ctx::parse_ipv4;
use crate::packet::ctx::ptr_at;
use crate::rewrite::rewrite;
use crate::rewrite::RewriteFailed;
use crate::rewrite::Side;
use crate::skb::drop_counted;
use crate::skb::ipv4_or_hand_over6;
use crate::{
    maps::{count, count_service},
    nodeport::{self, NotTranslated, Out, UplinkFamily, FIB_NO_NEIGH, FIB_SUCCESS},
    packet::{Flow, Ipv4Hdr, Skip, ETH_HLEN, IP_CSUM_OFF},
};
use aya_ebpf::{
    bindings::bpf_fib_lookup as FibParams,
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    helpers::bpf_redirect_neigh,
    programs::TcContext,
};
use core::ffi::c_void;
use proxy_common::{proto, stat, tail};
/// `sb_from_uplink` (`--xdp-mode off`): a packet from outside the node, as
/// the XDP program would treat it ([`nodeport::classify`]), rewritten with
/// helper stores; the kernel's stack then delivers or forwards it.
#[inline(always)]
pub fn try_from_uplink(ctx: &TcContext) -> Result<i32, Skip> {
    // SAFETY: `ctx.skb.skb` is the kernel's `__sk_buff` for this run; a read.
    let ingress = unsafe { (*ctx.skb.skb).ingress_ifindex };
    // The family is decided once, here: IPv6 is a program of its own
    // ([`super::uplink_tc6`]).
    if let Some(missed) = ipv4_or_hand_over6(ctx, tail::FROM_UPLINK6)? {
        return Ok(missed);
    }
    let flow = match parse_ipv4(ctx) {
        Ok(flow) => flow,
        Err(Skip::Fragment) => return later_fragment_from_uplink(ctx, ingress),
        Err(Skip::Icmp) => return icmp_error_from_uplink(ctx, ingress),
        Err(skip) => return Err(skip),
    };
    let Some(u) = u32::up() else {
        return Err(Skip::NotOurs);
    };
    u.s.flow = flow;
    let out = match nodeport::classify(ctx.skb.skb as *mut c_void, ingress, u) {
        Ok(out) => out,
        Err(NotTranslated::Pass(skip)) => return Err(skip),
        Err(NotTranslated::Drop(counter)) => return drop_counted(counter),
        Err(NotTranslated::Denied) => return Ok(TC_ACT_SHOT),
        Err(NotTranslated::Reject) => {
            count_service(u.service_id, |s| s.drops_no_backend += 1);
            return Ok(crate::reject::tc_reject(ctx, &flow));
        }
    };
    let dst = (u.to_daddr_be, u.to_ports_be[1]);
    let src = (u.to_saddr_be, u.to_ports_be[0]);
    let service_id = u.service_id;
    let (src, counter) = match out {
        Out::Local => (None, stat::EXT_LOCAL),
        Out::Remote => (Some(src), stat::EXT_REMOTE),
        Out::Reply => (Some(src), stat::EXT_REPLY),
    };
    let leaves = src.is_some();
    if leaves && ttl(ctx)? <= 1 {
        return drop_counted(stat::TTL_EXCEEDED);
    }
    let mut now = flow;
    if rewrite_side(ctx, &mut now, Side::Destination, dst).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    if let Some(src) = src {
        if rewrite_side(ctx, &mut now, Side::Source, src).is_err() {
            return drop_counted(stat::DROP_REWRITE_FAILED);
        }
    }
    if service_id != 0 {
        let len = u64::from(ctx.len());
        count_service(service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
    }
    count(counter);
    if flow.first_fragment {
        let src_be = if leaves { now.saddr_be } else { 0 };
        crate::frag::remember_uplink(ctx, &flow, now.daddr_be, src_be, service_id);
    }
    if leaves {
        return send_out(ctx, ingress, &now);
    }
    Ok(TC_ACT_OK)
}

/// Rewrites one side of the packet `now` describes, and `now` with it.
#[inline(always)]
pub(crate) fn rewrite_side(
    ctx: &TcContext,
    now: &mut Flow,
    side: Side,
    (addr_be, port_be): (u32, u16),
) -> Result<(), RewriteFailed> {
    rewrite(ctx, now, side, &addr_be, port_be)?;
    match side {
        Side::Source => (now.saddr_be, now.sport_be) = (addr_be, port_be),
        Side::Destination => (now.daddr_be, now.dport_be) = (addr_be, port_be),
    }
    Ok(())
}

/// An ICMP error about a flow source-NATed to another node: translated back
/// ([`crate::icmp::translate_snat`]) and sent on to the client.
#[inline(always)]
pub(crate) fn icmp_error_from_uplink(ctx: &TcContext, ingress: u32) -> Result<i32, Skip> {
    let outer = crate::icmp::translate_snat(ctx)?;
    if ttl(ctx)? <= 1 {
        return drop_counted(stat::TTL_EXCEEDED);
    }
    let now = Flow {
        saddr_be: outer.saddr_be,
        daddr_be: outer.daddr_be,
        frag_id_be: 0,
        sport_be: 0,
        dport_be: 0,
        proto: proto::ICMP,
        tcp_flags: 0,
        l4_off: 0,
        first_fragment: false,
    };
    send_out(ctx, ingress, &now)
}

/// A later fragment from outside: translated as its first fragment was, and
/// sent out the same way when it leaves the node again.
#[inline(always)]
pub(crate) fn later_fragment_from_uplink(ctx: &TcContext, ingress: u32) -> Result<i32, Skip> {
    match crate::frag::later_uplink(ctx) {
        Ok((now, true)) => {
            if ttl(ctx)? <= 1 {
                return drop_counted(stat::TTL_EXCEEDED);
            }
            send_out(ctx, ingress, &now)
        }
        Ok((_, false)) => Ok(TC_ACT_OK),
        Err(verdict) => verdict,
    }
}

/// The TTL of the packet.
#[inline(always)]
pub(crate) fn ttl(ctx: &TcContext) -> Result<u8, Skip> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the header lies inside the packet; a read.
    Ok(unsafe { (*ip).ttl })
}

/// Sends a translated packet that leaves the node again (to a backend on
/// another node, or a reply to the client) straight out of the route's
/// interface, the kernel resolving the next hop (`bpf_redirect_neigh`), with
/// the TTL down by one. Handing it to the stack instead would not work: it
/// carries the node's own address as its source and would be dropped as a
/// martian.
#[inline(always)]
pub(crate) fn send_out(ctx: &TcContext, ingress: u32, flow: &Flow) -> Result<i32, Skip> {
    // SAFETY: `bpf_fib_lookup` is plain data; all-zero is a valid value.
    let mut params: FibParams = unsafe { core::mem::zeroed() };
    u32::fib_params(
        &mut params,
        ingress,
        flow.proto,
        &flow.saddr_be,
        &flow.daddr_be,
    );
    let rc = nodeport::fib_lookup(ctx.skb.skb as *mut c_void, &mut params);
    if rc != FIB_SUCCESS && rc != FIB_NO_NEIGH {
        return drop_counted(stat::NO_ROUTE);
    }
    if decrement_ttl(ctx).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    // SAFETY: no memory is passed (the kernel looks the neighbour up).
    let action = unsafe { bpf_redirect_neigh(params.ifindex, core::ptr::null_mut(), 0, 0) };
    Ok(action as i32)
}

/// The TTL down by one, through helpers (the IPv4 checksum with it).
#[inline(always)]
pub(crate) fn decrement_ttl(ctx: &TcContext) -> Result<(), RewriteFailed> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN).map_err(|_| RewriteFailed)?;
    // SAFETY: `ptr_at` checked the header lies inside the packet; reads.
    let (ttl, proto) = unsafe { ((*ip).ttl, (*ip).proto) };
    let old = u16::from_ne_bytes([ttl, proto]);
    let new = u16::from_ne_bytes([ttl.wrapping_sub(1), proto]);
    ctx.l3_csum_replace(IP_CSUM_OFF, u64::from(old), u64::from(new), 2)
        .map_err(|_| RewriteFailed)?;
    ctx.store(ETH_HLEN + 8, &ttl.wrapping_sub(1), 0)
        .map_err(|_| RewriteFailed)
}
