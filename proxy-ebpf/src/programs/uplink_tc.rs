//! `sb_from_uplink` (IPv4) and `sb_from_uplink6` (IPv6, tail-called for
//! ethertype 0x86DD): tc ingress on each uplink, north-south traffic (the
//! same decisions as `sb_xdp_uplink`, [`crate::nodeport`]): all the work
//! with `--xdp-mode off`, and with XDP the packets XDP hands on (no
//! neighbour entry yet, TTL 1, fragments, ICMP errors). One body for both
//! families ([`from_uplink`]); what they do their own way is
//! [`UplinkTcFamily`].
//!
//! Packets to a local backend go up the stack translated; packets to a
//! backend on another node, and their replies, leave again straight out of
//! the route's interface ([`send_out`]). Fragments of a datagram follow its
//! first fragment's translation ([`crate::frag::uplink`]); ICMP errors
//! about flows source-NATed to another node go back to the client
//! translated.
use crate::{
    icmp::IcmpFamily,
    maps::{count, count_service},
    nodeport::{cached_route, classify, NotTranslated, Out, Up, UplinkFamily},
    nodeport::{dsr, names_egress},
    packet::{
        ctx::{later_fragment4, parse_ipv4, ptr_at},
        v6::{load, parse6, IP6_HOP_LIMIT_OFF},
        Ipv4Hdr, Kind, Skip, ETH_HLEN, IP_CSUM_OFF,
    },
    reject::RejectFamily,
    rewrite::{rewrite, Header, RewriteFailed, Side},
    skb::{drop_counted, ipv4_or_hand_over6},
    trace::{self, layer},
};
use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    helpers::bpf_redirect_neigh,
    programs::TcContext,
};
use core::ffi::c_void;
use proxy_common::{proto, stat, tail, Addr6Be};

/// What the families of the uplink's tc program do their own way.
pub(crate) trait UplinkTcFamily: UplinkFamily + Header + IcmpFamily + RejectFamily {
    /// Parses the packet into `u.s.flow`. A later fragment is one of a TCP
    /// or UDP datagram.
    fn parse(ctx: &TcContext, u: &mut Up<Self>) -> Result<Kind, Skip>;
    /// The packet's TTL (hop limit).
    fn hop_limit(ctx: &TcContext) -> Result<u8, Skip>;
    /// Writes the TTL one lower, with the IPv4 header checksum.
    fn decrement_hop_limit(ctx: &TcContext) -> Result<(), RewriteFailed>;
    /// Direct server return ([`crate::nodeport::dsr`]): the option put
    /// in, and the answer to a packet the option would make larger than
    /// the route's `mtu` (naming the room the option leaves).
    fn carry(ctx: &TcContext, u: &Up<Self>) -> Result<(), RewriteFailed>;
    fn too_big(ctx: &TcContext, u: &mut Up<Self>, mtu: u16) -> i32;
}

impl UplinkTcFamily for u32 {
    #[inline(always)]
    fn parse(ctx: &TcContext, u: &mut Up<u32>) -> Result<Kind, Skip> {
        match parse_ipv4(ctx) {
            Ok(flow) => {
                u.s.flow = flow;
                Ok(Kind::Flow)
            }
            Err(Skip::Fragment) => {
                later_fragment4(ctx, &mut u.s.flow)?;
                match u.s.flow.proto {
                    proto::TCP | proto::UDP => Ok(Kind::Later),
                    _ => Err(Skip::NotOurs),
                }
            }
            Err(Skip::Icmp) => Ok(Kind::Icmp),
            Err(skip) => Err(skip),
        }
    }
    #[inline(always)]
    fn hop_limit(ctx: &TcContext) -> Result<u8, Skip> {
        let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
        // SAFETY: `ptr_at` checked the header lies inside the packet; a read.
        Ok(unsafe { (*ip).ttl })
    }
    #[inline(always)]
    fn decrement_hop_limit(ctx: &TcContext) -> Result<(), RewriteFailed> {
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
    #[inline(always)]
    fn carry(ctx: &TcContext, u: &Up<u32>) -> Result<(), RewriteFailed> {
        dsr::carry_tc(ctx, u)
    }
    #[inline(always)]
    fn too_big(ctx: &TcContext, u: &mut Up<u32>, mtu: u16) -> i32 {
        let room = mtu.saturating_sub(u16::from(proxy_common::dsr::OPT4_LEN));
        crate::reject::tc_too_big(ctx, &mut u.s, room)
    }
}

impl UplinkTcFamily for Addr6Be {
    #[inline(always)]
    fn parse(ctx: &TcContext, u: &mut Up<Addr6Be>) -> Result<Kind, Skip> {
        parse6(ctx, &mut u.s.flow)
    }
    #[inline(always)]
    fn hop_limit(ctx: &TcContext) -> Result<u8, Skip> {
        load::<u8>(ctx, IP6_HOP_LIMIT_OFF)
    }
    /// IPv6 has no header checksum.
    #[inline(always)]
    fn decrement_hop_limit(ctx: &TcContext) -> Result<(), RewriteFailed> {
        let hop_limit = load::<u8>(ctx, IP6_HOP_LIMIT_OFF).map_err(|_| RewriteFailed)?;
        ctx.store(IP6_HOP_LIMIT_OFF, &hop_limit.wrapping_sub(1), 0)
            .map_err(|_| RewriteFailed)
    }
    #[inline(always)]
    fn carry(ctx: &TcContext, u: &Up<Addr6Be>) -> Result<(), RewriteFailed> {
        dsr::carry6_tc(ctx, u)
    }
    #[inline(always)]
    fn too_big(ctx: &TcContext, u: &mut Up<Addr6Be>, mtu: u16) -> i32 {
        let room = mtu.saturating_sub(u16::from(proxy_common::dsr::HDR6_LEN));
        crate::reject::tc_too_big(ctx, &mut u.s, room)
    }
}

/// `sb_from_uplink`: the family is decided once, here; IPv6 goes to its
/// own program.
#[inline(always)]
pub fn try_from_uplink(ctx: &TcContext) -> Result<i32, Skip> {
    if let Some(missed) = ipv4_or_hand_over6(ctx, tail::FROM_UPLINK6)? {
        return Ok(missed);
    }
    from_uplink::<u32>(ctx)
}

/// A packet from outside the node, either family, as the XDP program
/// would treat it ([`classify`]), rewritten with the tc layer's stores; the
/// kernel's stack then delivers it, or it leaves again ([`send_out`]).
#[inline(always)]
pub fn from_uplink<A: UplinkTcFamily>(ctx: &TcContext) -> Result<i32, Skip> {
    let Some(u) = A::up() else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: `ctx.skb.skb` is the kernel's `__sk_buff` for this run; a read.
    let ingress = unsafe { (*ctx.skb.skb).ingress_ifindex };
    match A::parse(ctx, u)? {
        Kind::Flow => {
            A::read_dsr_option(ctx, u);
            // Tracked by XDP already: a packet to a pod like any other.
            if u.dsr_port_be != 0 && dsr::tracked_by_xdp(ctx) {
                u.dsr_port_be = 0;
            }
        }
        Kind::Later => return later_fragment(ctx, ingress, u),
        Kind::Icmp => return icmp_error(ctx, ingress, u),
    }
    let out = match classify::<A, { layer::TC }>(ctx.skb.skb as *mut c_void, ingress, u) {
        Ok(out) => out,
        Err(NotTranslated::Pass(skip)) => return Err(skip),
        Err(NotTranslated::Drop(counter)) => {
            trace::dropped(layer::TC, counter, &u.s.flow, u.service_id);
            return drop_counted(counter);
        }
        Err(NotTranslated::Denied) => {
            trace::denied(layer::TC, &u.s.flow, u.service_id);
            return Ok(TC_ACT_SHOT);
        }
        Err(NotTranslated::Reject) => {
            trace::rejected(layer::TC, &u.s.flow, u.service_id);
            count_service(u.service_id, |s| s.drops_no_backend += 1);
            return Ok(crate::reject::tc_reject(ctx, &mut u.s));
        }
    };
    if out == Out::Arrived {
        count(stat::EXT_LOCAL);
        return Ok(TC_ACT_OK);
    }
    let leaves = out != Out::Local;
    if leaves {
        if A::hop_limit(ctx)? <= 1 {
            return drop_counted(stat::TTL_EXCEEDED);
        }
        if let Some(verdict) = route(ctx, ingress, u, u.s.flow.proto, out == Out::Direct)? {
            return Ok(verdict);
        }
    }
    if write_translation(ctx, u, out).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    if u.service_id != 0 {
        let len = u64::from(ctx.len());
        count_service(u.service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
    }
    count(match out {
        Out::Local | Out::Arrived => stat::EXT_LOCAL,
        Out::Remote | Out::Direct => stat::EXT_REMOTE,
        Out::Reply => stat::EXT_REPLY,
    });
    if u.s.flow.first_fragment {
        crate::frag::uplink::remember(u, leaves);
    }
    if leaves {
        return send_out(ctx, u);
    }
    Ok(TC_ACT_OK)
}

/// Writes the destination `classify` chose; the source too when the
/// packet leaves the node source-NATed (or as a reply), the option with
/// the frontend when it is returned directly.
#[inline(always)]
fn write_translation<A: UplinkTcFamily>(
    ctx: &TcContext,
    u: &Up<A>,
    out: Out,
) -> Result<(), RewriteFailed> {
    let [sport_be, dport_be] = u.to_ports_be;
    rewrite(ctx, &u.s.flow, Side::Destination, &u.to_daddr_be, dport_be)?;
    match out {
        Out::Remote | Out::Reply => rewrite(ctx, &u.s.flow, Side::Source, &u.to_saddr_be, sport_be),
        Out::Direct => A::carry(ctx, u),
        Out::Local | Out::Arrived => Ok(()),
    }
}

/// A later fragment from outside: translated as its first fragment was,
/// and sent out the same way when it leaves the node again.
#[inline(always)]
fn later_fragment<A: UplinkTcFamily>(
    ctx: &TcContext,
    ingress: u32,
    u: &mut Up<A>,
) -> Result<i32, Skip> {
    match crate::frag::uplink::later(ctx, u) {
        Ok(true) => {
            if A::hop_limit(ctx)? <= 1 {
                return drop_counted(stat::TTL_EXCEEDED);
            }
            routed_out(ctx, ingress, u, u.s.flow.proto)
        }
        Ok(false) => Ok(TC_ACT_OK),
        Err(verdict) => verdict,
    }
}

/// An ICMP error about a flow source-NATed to another node: translated back
/// and sent on to the client.
#[inline(always)]
fn icmp_error<A: UplinkTcFamily>(
    ctx: &TcContext,
    ingress: u32,
    u: &mut Up<A>,
) -> Result<i32, Skip> {
    // The new outer addresses, for the route, in `u.to_saddr_be`,
    // `u.to_daddr_be`.
    crate::icmp::translate_snat(ctx, u)?;
    if A::hop_limit(ctx)? <= 1 {
        return drop_counted(stat::TTL_EXCEEDED);
    }
    routed_out(ctx, ingress, u, A::ICMP_PROTO)
}

/// Routes a packet that leaves the node again, from `u.to_saddr_be` to
/// `u.to_daddr_be`, before it is rewritten (through the route cache the
/// XDP program uses too, [`cached_route`]): `None` when the route's
/// interface is in `u.fib`, else the verdict (no route: dropped; too large
/// for the route's MTU with the option of a `direct` packet: answered).
#[inline(always)]
fn route<A: UplinkTcFamily>(
    ctx: &TcContext,
    ingress: u32,
    u: &mut Up<A>,
    l4_proto: u8,
    direct: bool,
) -> Result<Option<i32>, Skip> {
    let (rc, mtu) = cached_route(ctx.skb.skb as *mut c_void, ingress, u, l4_proto);
    // A GSO packet is resegmented by the kernel to fit.
    if direct && !dsr::is_gso(ctx) && A::grown_len(ctx)? > mtu {
        return Ok(Some(A::too_big(ctx, u, mtu)));
    }
    if !names_egress(rc) {
        trace::dropped(layer::TC, stat::NO_ROUTE, &u.s.flow, u.service_id);
        return drop_counted(stat::NO_ROUTE).map(Some);
    }
    Ok(None)
}

/// Routes ([`route`]) and sends out a translated packet.
#[inline(always)]
fn routed_out<A: UplinkTcFamily>(
    ctx: &TcContext,
    ingress: u32,
    u: &mut Up<A>,
    l4_proto: u8,
) -> Result<i32, Skip> {
    if let Some(verdict) = route(ctx, ingress, u, l4_proto, false)? {
        return Ok(verdict);
    }
    send_out(ctx, u)
}

/// Sends a translated packet that leaves the node again (to a backend on
/// another node, a reply to the client, an ICMP error), routed
/// ([`route`]), straight out of the route's interface, the kernel
/// resolving the next hop (`bpf_redirect_neigh`), with the TTL (hop limit)
/// down by one. Handing it to the stack instead would not work: it carries
/// the node's own address as its source and would be dropped as a martian.
#[inline(always)]
fn send_out<A: UplinkTcFamily>(ctx: &TcContext, u: &mut Up<A>) -> Result<i32, Skip> {
    if A::decrement_hop_limit(ctx).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    // SAFETY: no memory is passed (the kernel looks the neighbour up).
    let action = unsafe { bpf_redirect_neigh(u.fib.ifindex, core::ptr::null_mut(), 0, 0) };
    Ok(action as i32)
}
