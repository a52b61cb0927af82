//! `sb_xdp_uplink`: the north-south path at the driver, before the kernel
//! allocates anything for the packet. It parses, asks [`crate::nodeport::classify`]
//! and writes the translation directly with incremental checksums (XDP has no
//! checksum helpers; a frame at this point carries complete checksums).
//! Packets to a local backend go up the stack (`XDP_PASS`); packets to a
//! backend on another node, and their replies, leave again at once through the
//! route's interface (`XDP_TX` on the same uplink, else a redirect), with the
//! TTL decremented as a router does. When the route lookup cannot give the
//! next hop's address (no neighbour entry yet) or the TTL would expire, the
//! packet goes on untranslated to the uplink's tc program (`xdp_to_tc`), and
//! fragments always do.
use crate::maps::SB_XDP_TAIL6_V1;
use crate::packet::ctx::{parse_ipv4, ptr_at};
use core::ffi::c_void;
use proxy_common::tail;

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, xdp_action, BPF_FIB_LKUP_RET_SUCCESS},
    helpers::bpf_redirect,
    programs::XdpContext,
};
use proxy_common::{proto, stat};

use crate::{
    maps::{count, count_service},
    nodeport::{classify, fib_lookup, NotTranslated, Out, UplinkFamily},
    packet::v6::ETH_P_IPV6_BE,
    packet::{
        csum_replace2, csum_replace4, Flow, Ipv4Hdr, Skip, ETH_HLEN, ETH_P_IP_BE, TCP_CSUM_OFF,
        UDP_CSUM_OFF,
    },
};

/// Lets a packet we leave alone continue, counting only the odd ones.
#[inline(always)]
pub fn pass(skip: Skip) -> u32 {
    match skip {
        Skip::NotOurs | Skip::Icmp => {}
        Skip::Malformed => count(stat::MALFORMED),
        Skip::Fragment => count(stat::FRAGMENT),
    }
    xdp_action::XDP_PASS
}

#[inline(always)]
pub fn try_uplink(ctx: &XdpContext) -> Result<u32, Skip> {
    // The family is decided once, here: IPv4 goes on as it always did, IPv6
    // is a program of its own ([`crate::programs::uplink_xdp6`]).
    // SAFETY: `ptr_at` checked the two bytes lie inside the frame.
    let ethertype = unsafe { *ptr_at::<u16>(ctx, 12).map_err(|_| Skip::NotOurs)? };
    if ethertype != ETH_P_IP_BE {
        if ethertype == ETH_P_IPV6_BE {
            return Ok(crate::programs::uplink_xdp::hand_over_xdp6(ctx));
        }
        return Err(Skip::NotOurs);
    }
    let Some(u) = u32::up() else {
        return Err(Skip::NotOurs);
    };
    let flow = parse_ipv4(ctx)?;
    u.s.flow = flow;
    // SAFETY: `ctx.ctx` is the kernel's `xdp_md` for this run; a read.
    let ingress = unsafe { (*ctx.ctx).ingress_ifindex };
    let out = match classify(ctx.ctx as *mut c_void, ingress, u) {
        Ok(out) => out,
        Err(NotTranslated::Pass(skip)) => return Err(skip),
        Err(NotTranslated::Drop(counter)) => {
            count(counter);
            return Ok(xdp_action::XDP_DROP);
        }
        Err(NotTranslated::Denied) => return Ok(xdp_action::XDP_DROP),
        Err(NotTranslated::Reject) => {
            count_service(u.service_id, |s| s.drops_no_backend += 1);
            return Ok(crate::reject::xdp_reject(ctx, &flow));
        }
    };
    let to = Endpoints {
        saddr_be: u.to_saddr_be,
        sport_be: u.to_ports_be[0],
        daddr_be: u.to_daddr_be,
        dport_be: u.to_ports_be[1],
    };
    match out {
        Out::Local => {
            rewrite(ctx, &flow, &to)?;
            count_forward(ctx, u.service_id, stat::EXT_LOCAL);
            Ok(xdp_action::XDP_PASS)
        }
        Out::Remote => send_out(ctx, ingress, &flow, &to, u.service_id, stat::EXT_REMOTE),
        Out::Reply => send_out(ctx, ingress, &flow, &to, 0, stat::EXT_REPLY),
    }
}

/// Both addresses and ports a packet is rewritten to.
struct Endpoints {
    saddr_be: u32,
    sport_be: u16,
    daddr_be: u32,
    dport_be: u16,
}

#[inline(always)]
fn count_forward(ctx: &XdpContext, service_id: u32, counter: u32) {
    let len = (ctx.data_end() - ctx.data()) as u64;
    count_service(service_id, |s| {
        s.packets += 1;
        s.bytes += len;
    });
    count(counter);
}

/// Writes `to` over the packet's addresses and ports, updating the IPv4 and
/// the L4 checksums incrementally. A UDP checksum of zero ("none") stays zero;
/// a computed zero is sent as 0xffff (RFC 768).
#[inline(always)]
fn rewrite(ctx: &XdpContext, flow: &Flow, to: &Endpoints) -> Result<(), Skip> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    let ports = ptr_at::<[u16; 2]>(ctx, flow.l4_off)?;
    let csum_off = if flow.proto == proto::TCP {
        flow.l4_off + TCP_CSUM_OFF
    } else {
        flow.l4_off + UDP_CSUM_OFF
    };
    let l4_csum = ptr_at::<u16>(ctx, csum_off)?;
    // SAFETY: `ptr_at` checked every field lies inside the frame, which an XDP
    // program may write; no helper that moves the frame runs in between.
    unsafe {
        let mut ip_csum = (*ip).csum_be;
        ip_csum = csum_replace4(ip_csum, flow.saddr_be, to.saddr_be);
        ip_csum = csum_replace4(ip_csum, flow.daddr_be, to.daddr_be);
        (*ip).csum_be = ip_csum;
        (*ip).saddr_be = to.saddr_be;
        (*ip).daddr_be = to.daddr_be;

        let old = *l4_csum;
        if flow.proto == proto::TCP || old != 0 {
            let mut csum = csum_replace4(old, flow.saddr_be, to.saddr_be);
            csum = csum_replace4(csum, flow.daddr_be, to.daddr_be);
            csum = csum_replace2(csum, flow.sport_be, to.sport_be);
            csum = csum_replace2(csum, flow.dport_be, to.dport_be);
            if flow.proto == proto::UDP && csum == 0 {
                csum = 0xffff;
            }
            *l4_csum = csum;
        }
        (*ports)[0] = to.sport_be;
        (*ports)[1] = to.dport_be;
    }
    Ok(())
}

/// Rewrites a packet to `to` and sends it straight back out: the route
/// lookup (done first, on the translated addresses) gives the interface and
/// both MAC addresses; the TTL goes down by one. When the lookup cannot
/// finish (no neighbour entry yet) or the TTL would expire, the packet goes on
/// untranslated to the uplink's tc program, which translates it again from
/// the same connection-tracking entry and lets the kernel resolve the
/// neighbour (a packet the stack got translated would carry the node's own
/// address as its source, and be dropped as a martian).
#[inline(always)]
fn send_out(
    ctx: &XdpContext,
    ingress: u32,
    flow: &Flow,
    to: &Endpoints,
    service_id: u32,
    counter: u32,
) -> Result<u32, Skip> {
    // SAFETY: `bpf_fib_lookup` is plain data; all-zero is a valid value.
    let mut params: FibParams = unsafe { core::mem::zeroed() };
    u32::fib_params(&mut params, ingress, flow.proto, &to.saddr_be, &to.daddr_be);
    let rc = fib_lookup(ctx.ctx as *mut c_void, &mut params);
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) || ttl(ctx)? <= 1 {
        count(stat::XDP_TO_TC);
        return Ok(xdp_action::XDP_PASS);
    }
    rewrite(ctx, flow, to)?;
    decrement_ttl(ctx)?;
    let (dmac, smac) = (ptr_at::<[u8; 6]>(ctx, 0)?, ptr_at::<[u8; 6]>(ctx, 6)?);
    // SAFETY: `ptr_at` checked both MAC addresses lie inside the frame.
    unsafe {
        *dmac = params.dmac;
        *smac = params.smac;
    }
    if service_id != 0 {
        count_forward(ctx, service_id, counter);
    } else {
        count(counter);
    }
    if params.ifindex == ingress {
        return Ok(xdp_action::XDP_TX);
    }
    // SAFETY: a helper without memory arguments.
    Ok(unsafe { bpf_redirect(params.ifindex, 0) as u32 })
}

/// The packet's TTL.
#[inline(always)]
fn ttl(ctx: &XdpContext) -> Result<u8, Skip> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the header lies inside the frame; a read.
    Ok(unsafe { (*ip).ttl })
}

/// Decrements the TTL, updating the IPv4 checksum. Fails (without writing)
/// when the TTL would reach zero.
#[inline(always)]
fn decrement_ttl(ctx: &XdpContext) -> Result<(), Skip> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the header lies inside the frame.
    unsafe {
        let ttl = (*ip).ttl;
        if ttl <= 1 {
            return Err(Skip::NotOurs);
        }
        // The 16-bit word the TTL shares with the protocol, as in memory.
        let old = u16::from_ne_bytes([ttl, (*ip).proto]);
        let new = u16::from_ne_bytes([ttl - 1, (*ip).proto]);
        (*ip).csum_be = csum_replace2((*ip).csum_be, old, new);
        (*ip).ttl = ttl - 1;
    }
    Ok(())
}

/// Tail-calls `sb_xdp_uplink6`. Returns only if the call failed (the agent
/// has not filled the array yet): the packet passes untouched, counted.
#[inline(always)]
pub fn hand_over_xdp6(ctx: &XdpContext) -> u32 {
    // SAFETY: a tail call with our own context and program array; on success
    // it does not return.
    unsafe { SB_XDP_TAIL6_V1.tail_call(ctx, tail::XDP_UPLINK6) };
    count(stat::TAIL_CALL_MISSED);
    xdp_action::XDP_PASS
}
