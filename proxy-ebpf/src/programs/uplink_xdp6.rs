//! `sb_xdp_uplink6`: the IPv6 north-south path at the driver, tail-called
//! by `sb_xdp_uplink` for ethertype 0x86DD. It parses with the pod path's
//! extension-header walk (through `bpf_xdp_load_bytes`), decides with
//! [`classify6`] and writes the translation with `bpf_xdp_store_bytes` and
//! incremental checksums over the pseudo-header (IPv6 has no header
//! checksum). A packet to a local backend goes up the stack (`XDP_PASS`);
//! one to a backend on another node, and its replies, leave at once through
//! the route's interface with the hop limit decremented. When the route
//! lookup cannot give the next hop's address or the hop limit would expire,
//! the packet goes on untranslated to the uplink's tc program
//! (`xdp_to_tc`), which translates it again from the same
//! connection-tracking entry. A packet to a frontend without endpoints goes
//! to tc untouched too, which answers it ([`crate::reject::v6`]). Fragments and
//! ICMPv6 (neighbour discovery included) pass untouched.
use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    bindings::{xdp_action, BPF_FIB_LKUP_RET_SUCCESS},
    helpers::{bpf_redirect, bpf_xdp_store_bytes},
    programs::XdpContext,
};
use proxy_common::{proto, stat, Addr6Be};

use crate::{
    maps::{count, count_service},
    nodeport::NotTranslated,
    nodeport::{classify, fib_lookup, Out, Up, UplinkFamily},
    packet::v6::IP6_HOP_LIMIT_OFF,
    packet::v6::{csum_replace16, load, parse6, Kind6, IP6_DADDR_OFF, IP6_SADDR_OFF},
    packet::{csum_replace2, Skip, TCP_CSUM_OFF, UDP_CSUM_OFF},
};

/// A store into the frame failed half-way: the frame must not go on.
struct StoreFailed;

/// `sb_xdp_uplink6`.
#[inline(always)]
pub fn uplink6(ctx: &XdpContext) -> u32 {
    let Some(u) = Addr6Be::up() else {
        return xdp_action::XDP_PASS;
    };
    match try_uplink6(ctx, u) {
        Ok(action) => action,
        Err(skip) => crate::programs::uplink_xdp::pass(skip),
    }
}

#[inline(always)]
fn try_uplink6(ctx: &XdpContext, u: &mut Up<Addr6Be>) -> Result<u32, Skip> {
    match parse6(ctx, &mut u.s.flow)? {
        Kind6::Flow => {}
        // To tc, as IPv4 fragments go.
        Kind6::Later => return Err(Skip::Fragment),
        // Neighbour discovery, echo and errors: never disturbed.
        Kind6::Icmp => return Err(Skip::Icmp),
    }
    if u.s.flow.first_fragment {
        return Err(Skip::Fragment);
    }
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
            // The answer is built by the uplink's tc program
            // (`crate::reject::v6`), which sees the packet untouched.
            count(stat::XDP_TO_TC);
            return Ok(xdp_action::XDP_PASS);
        }
    };
    if out == Out::Local {
        if rewrite(ctx, u).is_err() {
            count(stat::DROP_REWRITE_FAILED);
            return Ok(xdp_action::XDP_DROP);
        }
        count_forward(ctx, u.service_id, stat::EXT_LOCAL);
        return Ok(xdp_action::XDP_PASS);
    }
    let counter = if out == Out::Remote {
        stat::EXT_REMOTE
    } else {
        stat::EXT_REPLY
    };
    send_out(ctx, ingress, u, counter)
}

#[inline(always)]
fn count_forward(ctx: &XdpContext, service_id: u32, counter: u32) {
    if service_id != 0 {
        let len = (ctx.data_end() - ctx.data()) as u64;
        count_service(service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
    }
    count(counter);
}

/// Copies `size_of::<T>()` bytes of `src` (stack or map memory) into the
/// frame at `off`.
#[inline(always)]
fn store<T>(ctx: &XdpContext, off: usize, src: &T) -> Result<(), StoreFailed> {
    // SAFETY: the helper reads exactly `size_of::<T>()` bytes of `src`, and
    // bounds-checks the frame itself; `ctx.ctx` is this program's context.
    let ret = unsafe {
        bpf_xdp_store_bytes(
            ctx.ctx,
            off as u32,
            src as *const T as *mut c_void,
            size_of::<T>() as u32,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(StoreFailed)
    }
}

/// Writes the translation in `u` over the packet's addresses and ports and
/// updates the L4 checksum incrementally (the pseudo-header's addresses and
/// the ports). A UDP checksum of zero stays zero; a computed zero is sent as
/// 0xffff. The checksum is read and computed before anything is written, so
/// a failed read leaves the frame as it was.
#[inline(always)]
fn rewrite(ctx: &XdpContext, u: &Up<Addr6Be>) -> Result<(), StoreFailed> {
    let flow = &u.s.flow;
    let l4_off = flow.l4_off();
    let csum_off = if flow.proto == proto::TCP {
        l4_off + TCP_CSUM_OFF
    } else {
        l4_off + UDP_CSUM_OFF
    };
    let old: u16 = load(ctx, csum_off).map_err(|_| StoreFailed)?;
    let [sport_be, dport_be] = u.to_ports_be;
    if flow.proto == proto::TCP || old != 0 {
        let mut csum = csum_replace16(old, &flow.saddr_be, &u.to_saddr_be);
        csum = csum_replace16(csum, &flow.daddr_be, &u.to_daddr_be);
        csum = csum_replace2(csum, flow.sport_be, sport_be);
        csum = csum_replace2(csum, flow.dport_be, dport_be);
        if flow.proto == proto::UDP && csum == 0 {
            csum = 0xffff;
        }
        store(ctx, csum_off, &csum)?;
    }
    store::<Addr6Be>(ctx, IP6_SADDR_OFF, &u.to_saddr_be)?;
    store::<Addr6Be>(ctx, IP6_DADDR_OFF, &u.to_daddr_be)?;
    store::<[u16; 2]>(ctx, l4_off, &u.to_ports_be)
}

/// Rewrites a packet that leaves the node again and sends it straight back
/// out: the route lookup (first, on the translated addresses) gives the
/// interface and both MAC addresses; the hop limit goes down by one. When
/// the lookup cannot finish or the hop limit would expire, the packet goes
/// on untranslated to tc.
#[inline(always)]
fn send_out(
    ctx: &XdpContext,
    ingress: u32,
    u: &mut Up<Addr6Be>,
    counter: u32,
) -> Result<u32, Skip> {
    let (src, dst) = (u.to_saddr_be, u.to_daddr_be);
    Addr6Be::fib_params(&mut u.fib, ingress, u.s.flow.proto, &src, &dst);
    let rc = fib_lookup(ctx.ctx as *mut c_void, &mut u.fib);
    let hop_limit: u8 = load(ctx, IP6_HOP_LIMIT_OFF)?;
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) || hop_limit <= 1 {
        count(stat::XDP_TO_TC);
        return Ok(xdp_action::XDP_PASS);
    }
    let written = rewrite(ctx, u)
        .and_then(|()| store(ctx, IP6_HOP_LIMIT_OFF, &(hop_limit - 1)))
        .and_then(|()| store(ctx, 0, &u.fib.dmac))
        .and_then(|()| store(ctx, 6, &u.fib.smac));
    if written.is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return Ok(xdp_action::XDP_DROP);
    }
    count_forward(ctx, u.service_id, counter);
    if u.fib.ifindex == ingress {
        return Ok(xdp_action::XDP_TX);
    }
    // SAFETY: a helper without memory arguments.
    Ok(unsafe { bpf_redirect(u.fib.ifindex, 0) as u32 })
}
