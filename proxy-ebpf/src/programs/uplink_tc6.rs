//! `sb_from_uplink6`: tc ingress on each uplink for IPv6, tail-called by
//! `sb_from_uplink` ([`crate::nodeport`] decides): DNAT/SNAT, replies,
//! ICMPv6 errors about source-NATed flows, and answers for frontends without
//! endpoints ([`crate::reject::v6`]).
use crate::nodeport::{classify, fib_lookup, Out, Up, UplinkFamily, FIB_NO_NEIGH, FIB_SUCCESS};
use crate::packet::v6::IP6_HOP_LIMIT_OFF;
use crate::{
    maps::{count, count_service, SB_CT6_V1},
    nodeport::NotTranslated,
    packet::v6::{
        csum_replace16, eq6, load, load_into, parse6, Kind6, IP6_DADDR_OFF, IP6_SADDR_OFF,
        IPV6_HLEN,
    },
    packet::{csum_replace2, set, Skip, TCP_CSUM_OFF, UDP_CSUM_OFF},
    rewrite::rewrite,
    rewrite::Side,
    skb::drop_counted,
};
use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    helpers::bpf_redirect_neigh,
    programs::TcContext,
};
use core::ffi::c_void;
use proxy_common::{ct_dir, ct_flags, proto, snat, stat, Addr6Be};
// ---- tc: `sb_from_uplink6` ----

/// `sb_from_uplink6`: an IPv6 packet from outside the node (`--xdp-mode
/// off`, and what XDP handed on), rewritten with helper stores.
#[inline(always)]
pub fn from_uplink6(ctx: &TcContext) -> i32 {
    let Some(u) = Addr6Be::up() else {
        return crate::skb::pass(Skip::NotOurs);
    };
    match try_from_uplink6(ctx, u) {
        Ok(action) => action,
        Err(skip) => crate::skb::pass(skip),
    }
}

#[inline(always)]
fn try_from_uplink6(ctx: &TcContext, u: &mut Up<Addr6Be>) -> Result<i32, Skip> {
    match parse6(ctx, &mut u.s.flow)? {
        Kind6::Flow => {}
        // Not translated on the uplink yet: they pass untouched.
        Kind6::Later => return Err(Skip::Fragment),
        // Errors about source-NATed flows are translated; neighbour
        // discovery, echo and every other ICMPv6 message pass untouched.
        Kind6::Icmp => return icmp_error_snat6(ctx, u),
    }
    if u.s.flow.first_fragment {
        return Err(Skip::Fragment);
    }
    // SAFETY: `ctx.skb.skb` is the kernel's `__sk_buff` for this run; a read.
    let ingress = unsafe { (*ctx.skb.skb).ingress_ifindex };
    let out = match classify(ctx.skb.skb as *mut c_void, ingress, u) {
        Ok(out) => out,
        Err(NotTranslated::Pass(skip)) => return Err(skip),
        Err(NotTranslated::Drop(counter)) => return drop_counted(counter),
        Err(NotTranslated::Denied) => return Ok(TC_ACT_SHOT),
        Err(NotTranslated::Reject) => {
            count_service(u.service_id, |s| s.drops_no_backend += 1);
            return Ok(crate::reject::v6::answer(ctx, &mut u.s));
        }
    };
    let leaves = out != Out::Local;
    if leaves && load::<u8>(ctx, IP6_HOP_LIMIT_OFF)? <= 1 {
        return drop_counted(stat::TTL_EXCEEDED);
    }
    let flow = &u.s.flow;
    if rewrite(
        ctx,
        flow,
        Side::Destination,
        &u.to_daddr_be,
        u.to_ports_be[1],
    )
    .is_err()
    {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    if leaves && rewrite(ctx, flow, Side::Source, &u.to_saddr_be, u.to_ports_be[0]).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    let counter = match out {
        Out::Local => stat::EXT_LOCAL,
        Out::Remote => stat::EXT_REMOTE,
        Out::Reply => stat::EXT_REPLY,
    };
    if u.service_id != 0 {
        let len = u64::from(ctx.len());
        count_service(u.service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
    }
    count(counter);
    if leaves {
        return send_out6(ctx, ingress, u);
    }
    Ok(TC_ACT_OK)
}

/// Sends a translated packet that leaves the node again out of the route's
/// interface, the kernel resolving the next hop, with the hop limit down by
/// one (IPv6 has no header checksum).
#[inline(always)]
fn send_out6(ctx: &TcContext, ingress: u32, u: &mut Up<Addr6Be>) -> Result<i32, Skip> {
    let (src, dst) = (u.to_saddr_be, u.to_daddr_be);
    Addr6Be::fib_params(&mut u.fib, ingress, u.s.flow.proto, &src, &dst);
    let rc = fib_lookup(ctx.skb.skb as *mut c_void, &mut u.fib);
    if rc != FIB_SUCCESS && rc != FIB_NO_NEIGH {
        return drop_counted(stat::NO_ROUTE);
    }
    let hop_limit = load::<u8>(ctx, IP6_HOP_LIMIT_OFF)?;
    if ctx
        .store(IP6_HOP_LIMIT_OFF, &hop_limit.wrapping_sub(1), 0)
        .is_err()
    {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    // SAFETY: no memory is passed (the kernel looks the neighbour up).
    let action = unsafe { bpf_redirect_neigh(u.fib.ifindex, core::ptr::null_mut(), 0, 0) };
    Ok(action as i32)
}

const ICMP6_HLEN: usize = 8;
/// ICMPv6 error types (RFC 4443): destination unreachable, packet too big,
/// time exceeded, parameter problem.
const ICMPV6_ERROR_MAX: u8 = 4;

/// An ICMPv6 error about a flow source-NATed to another node (a "packet too
/// big" from a router on the way to the backend, an unreachable from the
/// backend's node), as IPv4's `icmp::translate_snat`: it is addressed
/// to the uplink's address and quotes the packet as it left, (uplink address,
/// SNAT port → backend). The flow's reply entry names the client and the
/// frontend: the quote becomes (client → frontend), the outer destination the
/// client, the outer source the frontend when it was the backend itself (a
/// router keeps its own), and the error goes on to the client. The quoted
/// TCP/UDP checksum (where the quote holds it; a UDP 0 stays 0) and the
/// ICMPv6 checksum follow. Anything else passes untouched.
#[inline(always)]
fn icmp_error_snat6(ctx: &TcContext, u: &mut Up<Addr6Be>) -> Result<i32, Skip> {
    let icmp_off = u.s.flow.l4_off();
    let head: [u8; 4] = load(ctx, icmp_off).map_err(|_| Skip::Icmp)?;
    if head[0] == 0 || head[0] > ICMPV6_ERROR_MAX {
        return Err(Skip::Icmp);
    }
    let icmp_csum_be = u16::from_ne_bytes([head[2], head[3]]);
    // The quoted header: IPv6, then TCP or UDP directly.
    let inner_off = icmp_off + ICMP6_HLEN;
    let word1: [u32; 2] = load(ctx, inner_off).map_err(|_| Skip::Icmp)?;
    let inner_proto = (u32::from_be(word1[1]) >> 8) as u8;
    if u32::from_be(word1[0]) >> 28 != 6 || (inner_proto != proto::TCP && inner_proto != proto::UDP)
    {
        return Err(Skip::Icmp);
    }
    let inner_l4 = inner_off + IPV6_HLEN;
    let ports: [u16; 2] = load(ctx, inner_l4).map_err(|_| Skip::Icmp)?;
    let (snat_port_be, backend_port_be) = (ports[0], ports[1]);
    if !snat::is_snat_port(u16::from_be(snat_port_be)) {
        return Err(Skip::Icmp);
    }
    // The reply entry: (backend → uplink address, SNAT port).
    let k = &mut u.s.key2;
    load_into(ctx, inner_off + 24, &mut k.saddr_be).map_err(|_| Skip::Icmp)?;
    load_into(ctx, inner_off + 8, &mut k.daddr_be).map_err(|_| Skip::Icmp)?;
    k.sport_be = backend_port_be;
    k.dport_be = snat_port_be;
    k.proto = inner_proto;
    k.dir = ct_dir::REPLY;
    k._pad = [0; 2];
    if !eq6(&u.s.flow.daddr_be, &u.s.key2.daddr_be) {
        // Not addressed to the address the quote comes from.
        return Err(Skip::Icmp);
    }
    let Some(entry) = SB_CT6_V1.get_ptr(u.s.key2) else {
        return Err(Skip::Icmp);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; the
    // fields are copied out at once.
    let flags = unsafe {
        set(&mut u.to_saddr_be, &(*entry).nat_addr_be);
        set(&mut u.to_daddr_be, &(*entry).snat_addr_be);
        u.to_ports_be = [(*entry).nat_port_be, (*entry).snat_port_be];
        (*entry).flags
    };
    if flags & ct_flags::SNAT == 0 {
        return Err(Skip::Icmp);
    }
    let [frontend_port_be, client_port_be] = u.to_ports_be;
    // Old → new: quoted source (uplink → client), quoted destination
    // (backend → frontend), and their ports.
    let (uplink_addr, backend_addr) = (&u.s.key2.daddr_be, &u.s.key2.saddr_be);
    let (client, frontend) = (&u.to_daddr_be, &u.to_saddr_be);
    let l4_csum_off = if inner_proto == proto::UDP {
        inner_l4 + UDP_CSUM_OFF
    } else {
        inner_l4 + TCP_CSUM_OFF
    };
    let quoted_csum = match load::<u16>(ctx, l4_csum_off) {
        Ok(old) if inner_proto == proto::TCP || old != 0 => {
            let mut new = csum_replace16(old, uplink_addr, client);
            new = csum_replace16(new, backend_addr, frontend);
            new = csum_replace2(new, snat_port_be, client_port_be);
            new = csum_replace2(new, backend_port_be, frontend_port_be);
            if inner_proto == proto::UDP && new == 0 {
                new = 0xffff;
            }
            Some((old, new))
        }
        _ => None,
    };
    let mut icmp_csum = csum_replace16(icmp_csum_be, uplink_addr, client);
    icmp_csum = csum_replace16(icmp_csum, backend_addr, frontend);
    icmp_csum = csum_replace2(icmp_csum, snat_port_be, client_port_be);
    icmp_csum = csum_replace2(icmp_csum, backend_port_be, frontend_port_be);
    if let Some((old, new)) = quoted_csum {
        icmp_csum = csum_replace2(icmp_csum, old, new);
    }
    // The outer header, in the pseudo-header: the destination (the uplink
    // address) becomes the client; the source too when it is the backend.
    icmp_csum = csum_replace16(icmp_csum, &u.s.flow.daddr_be, client);
    let source_changes = eq6(&u.s.flow.saddr_be, backend_addr);
    if source_changes {
        icmp_csum = csum_replace16(icmp_csum, backend_addr, frontend);
    }
    if load::<u8>(ctx, IP6_HOP_LIMIT_OFF)? <= 1 {
        return drop_counted(stat::TTL_EXCEEDED);
    }
    // Every read is done: the stores below move packet data.
    let quoted_ports = [client_port_be, frontend_port_be];
    let stored = ctx.store(inner_off + 8, client, 0).is_ok()
        && ctx.store(inner_off + 24, frontend, 0).is_ok()
        && ctx.store(inner_l4, &quoted_ports, 0).is_ok()
        && quoted_csum.is_none_or(|(_, new)| ctx.store(l4_csum_off, &new, 0).is_ok())
        && ctx.store(icmp_off + 2, &icmp_csum, 0).is_ok()
        && ctx.store(IP6_DADDR_OFF, client, 0).is_ok()
        && (!source_changes || ctx.store(IP6_SADDR_OFF, frontend, 0).is_ok());
    if !stored {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count(stat::ICMP_ERROR_TRANSLATED);
    // SAFETY: `ctx.skb.skb` is the kernel's `__sk_buff` for this run; a read.
    let ingress = unsafe { (*ctx.skb.skb).ingress_ifindex };
    send_out6(ctx, ingress, u)
}
