//! `sb_xdp_uplink` (IPv4) and `sb_xdp_uplink6` (IPv6, tail-called for
//! ethertype 0x86DD): the north-south path at the driver, before the kernel
//! allocates anything for the packet. One body for both families: it
//! parses, asks [`crate::nodeport::classify`] and writes the translation
//! with incremental checksums (XDP has no checksum helpers; a frame at this
//! point carries complete checksums); what the families write differently
//! is [`XdpFamily`].
//!
//! Packets to a local backend go up the stack (`XDP_PASS`); packets to a
//! backend on another node, and their replies, leave again at once through
//! the route's interface (`XDP_TX` on the same uplink, else a redirect),
//! with the TTL (hop limit) decremented as a router does. When the route
//! lookup cannot give the next hop's address (no neighbour entry yet) or
//! the TTL would expire, or the route leaves through an overlay device
//! (a tunnel, which takes no XDP frames), the packet goes on untranslated
//! to the uplink's tc
//! program (`xdp_to_tc`), which translates it again from the same
//! connection-tracking entry and lets the kernel resolve the neighbour (a
//! packet the stack got translated would carry the node's own address as
//! its source, and be dropped as a martian). Fragments and ICMP (IPv6
//! neighbour discovery included) always go on to tc untouched.
//!
//! Both families write the frame directly. IPv6 falls back to
//! `bpf_xdp_load_bytes`/`bpf_xdp_store_bytes` for a field past the frame's
//! linear part (its TCP/UDP header lies after a variable run of extension
//! headers, which the parser walks with the load helper).
use core::ffi::c_void;

use aya_ebpf::{
    bindings::{xdp_action, BPF_FIB_LKUP_RET_SUCCESS},
    helpers::bpf_redirect,
    programs::XdpContext,
};
use proxy_common::{proto, stat, tail, Addr6Be};

use crate::{
    maps::{count, count_service, SB_XDP_TAIL6_V1},
    nodeport::{cached_route, classify, dsr, is_overlay, NotTranslated, Out, Up, UplinkFamily},
    packet::{
        csum_replace2, csum_replace4,
        ctx::{parse_ipv4, ptr_at, xdp_store},
        set,
        v6::{
            csum_replace16, load, parse6, ETH_P_IPV6_BE, IP6_DADDR_OFF, IP6_HOP_LIMIT_OFF,
            IP6_SADDR_OFF,
        },
        Ipv4Hdr, Kind, Skip, Words, ETH_HLEN, ETH_P_IP_BE, MAX_L4_OFF, TCP_CSUM_OFF, UDP_CSUM_OFF,
    },
    trace::{self, layer},
};

/// A write into the frame failed: the frame must not go on.
pub(crate) struct StoreFailed;

/// What the families of the XDP uplink path do their own way.
pub(crate) trait XdpFamily: UplinkFamily {
    /// Parses the frame into `u.s.flow`: a whole TCP or UDP packet. A
    /// fragment (`Skip::Fragment`) or ICMP (`Skip::Icmp`) goes on to tc.
    fn parse(ctx: &XdpContext, u: &mut Up<Self>) -> Result<(), Skip>;
    /// A packet to a frontend without endpoints (service `u.service_id`).
    fn reject(ctx: &XdpContext, u: &mut Up<Self>) -> u32;
    /// Writes `u.to_*` over the packet's addresses and ports, with their
    /// checksums. A UDP checksum of zero ("none") stays zero; a computed
    /// zero is sent as 0xffff.
    fn write_translation(ctx: &XdpContext, u: &Up<Self>) -> Result<(), StoreFailed>;
    /// The packet's TTL (hop limit).
    fn hop_limit(ctx: &XdpContext) -> Result<u8, Skip>;
    /// Writes the TTL `hop_limit` (above 1) one lower, with the IPv4
    /// header checksum.
    fn decrement_hop_limit(ctx: &XdpContext, hop_limit: u8) -> Result<(), StoreFailed>;
    /// Direct server return: puts the option in
    /// ([`crate::nodeport::dsr`]).
    fn carry(ctx: &XdpContext, u: &Up<Self>) -> Result<(), StoreFailed>;
}

/// `sb_xdp_uplink`: the family is decided once, here.
#[inline(always)]
pub fn try_uplink(ctx: &XdpContext) -> Result<u32, Skip> {
    // SAFETY: `ptr_at` checked the two bytes lie inside the frame.
    let ethertype = unsafe { *ptr_at::<u16>(ctx, 12).map_err(|_| Skip::NotOurs)? };
    if ethertype != ETH_P_IP_BE {
        if ethertype == ETH_P_IPV6_BE {
            return Ok(hand_over_xdp6(ctx));
        }
        return Err(Skip::NotOurs);
    }
    uplink::<u32>(ctx)
}

/// Lets a packet we leave alone continue, counting only the odd ones.
#[inline(always)]
pub fn pass(skip: Skip) -> u32 {
    match skip {
        Skip::NotOurs | Skip::Icmp => {}
        Skip::Malformed => {
            count(stat::MALFORMED);
            trace::malformed(layer::XDP);
        }
        Skip::Fragment => count(stat::FRAGMENT),
    }
    xdp_action::XDP_PASS
}

/// A packet from outside, either family.
#[inline(always)]
pub fn uplink<A: XdpFamily>(ctx: &XdpContext) -> Result<u32, Skip> {
    let Some(u) = A::up() else {
        return Err(Skip::NotOurs);
    };
    A::parse(ctx, u)?;
    A::read_dsr_option(ctx, u);
    // A kernel that refuses XDP its metadata leaves tc no way to tell which
    // arrivals XDP tracked: tc takes every packet with the option. The
    // constant comes first, so where the kernel has the helper the verifier
    // drops the whole test.
    if !dsr::xdp_marks() && u.dsr_port_be != 0 {
        return Err(Skip::NotOurs);
    }
    // SAFETY: `ctx.ctx` is the kernel's `xdp_md` for this run; a read.
    let ingress = unsafe { (*ctx.ctx).ingress_ifindex };
    let out = match classify::<A, { layer::XDP }>(ctx.ctx as *mut c_void, ingress, u) {
        Ok(out) => out,
        Err(NotTranslated::Pass(skip)) => return Err(skip),
        Err(NotTranslated::Drop(counter)) => {
            count(counter);
            trace::dropped(layer::XDP, counter, &u.s.flow, u.service_id);
            return Ok(xdp_action::XDP_DROP);
        }
        Err(NotTranslated::Denied) => {
            trace::denied(layer::XDP, &u.s.flow, u.service_id);
            return Ok(xdp_action::XDP_DROP);
        }
        Err(NotTranslated::Reject) => return Ok(A::reject(ctx, u)),
    };
    let counter = match out {
        Out::Local => {
            if A::write_translation(ctx, u).is_err() {
                count(stat::DROP_REWRITE_FAILED);
                return Ok(xdp_action::XDP_DROP);
            }
            count_forward(ctx, u.service_id, stat::EXT_LOCAL);
            return Ok(xdp_action::XDP_PASS);
        }
        Out::Arrived => {
            count(stat::EXT_LOCAL);
            dsr::mark_tracked(ctx);
            return Ok(xdp_action::XDP_PASS);
        }
        Out::Remote | Out::Direct => stat::EXT_REMOTE,
        Out::Reply => stat::EXT_REPLY,
    };
    send_out(ctx, ingress, u, out == Out::Direct, counter)
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

/// Rewrites a packet that leaves the node again and sends it straight back
/// out: the route (first, on the translated addresses, from this CPU's
/// cache or `bpf_fib_lookup`: [`cached_route`]) gives the
/// interface and both MAC addresses; the TTL goes down by one. A packet
/// returned `direct`ly gets the option with the frontend. When the lookup
/// cannot finish, the packet would not fit the route's MTU with the option,
/// the route leaves through an overlay device (which takes no XDP frames),
/// or the TTL would expire, the packet goes on untranslated to tc (see the
/// module's documentation).
#[inline(always)]
fn send_out<A: XdpFamily>(
    ctx: &XdpContext,
    ingress: u32,
    u: &mut Up<A>,
    direct: bool,
    counter: u32,
) -> Result<u32, Skip> {
    let proto = u.s.flow.proto;
    let (rc, mtu) = cached_route(ctx.ctx as *mut c_void, ingress, u, proto);
    let hop_limit = A::hop_limit(ctx)?;
    let too_big = direct && A::grown_len(ctx)? > mtu;
    // The ingress is an uplink, never an overlay: only another interface
    // costs the lookup.
    let unsendable = rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS)
        || (u.fib.ifindex != ingress && is_overlay(u.fib.ifindex));
    if unsendable || hop_limit <= 1 || too_big {
        count(stat::XDP_TO_TC);
        return Ok(xdp_action::XDP_PASS);
    }
    let written = A::write_translation(ctx, u)
        .and_then(|()| if direct { A::carry(ctx, u) } else { Ok(()) })
        .and_then(|()| A::decrement_hop_limit(ctx, hop_limit))
        .and_then(|()| set_macs(ctx, &u.fib.dmac, &u.fib.smac));
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

/// The next hop's and our MAC addresses, as the route lookup gave them.
#[inline(always)]
fn set_macs(ctx: &XdpContext, dmac: &[u8; 6], smac: &[u8; 6]) -> Result<(), StoreFailed> {
    let (to_dmac, to_smac) = match (ptr_at::<[u8; 6]>(ctx, 0), ptr_at::<[u8; 6]>(ctx, 6)) {
        (Ok(d), Ok(s)) => (d, s),
        _ => return Err(StoreFailed),
    };
    // SAFETY: `ptr_at` checked both MAC addresses lie inside the frame,
    // which an XDP program may write.
    unsafe {
        *to_dmac = *dmac;
        *to_smac = *smac;
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

/// The L4 checksum after the rewrite of `u`, from `old` (all the
/// addresses and ports of the family's flow, `replace` for its addresses;
/// a source that stays, as under DNAT only, costs one compare), or `None`
/// for a UDP packet without checksum.
#[inline(always)]
fn l4_checksum<A: XdpFamily>(
    u: &Up<A>,
    old: u16,
    replace: impl Fn(u16, &A, &A) -> u16,
) -> Option<u16> {
    let flow = &u.s.flow;
    if flow.proto != proto::TCP && old == 0 {
        return None;
    }
    let [sport_be, dport_be] = u.to_ports_be;
    let mut csum = replace(old, &flow.daddr_be, &u.to_daddr_be);
    csum = csum_replace2(csum, flow.dport_be, dport_be);
    if !source_stays(u) {
        csum = replace(csum, &flow.saddr_be, &u.to_saddr_be);
        csum = csum_replace2(csum, flow.sport_be, sport_be);
    }
    if flow.proto == proto::UDP && csum == 0 {
        csum = 0xffff;
    }
    Some(csum)
}

/// Whether the rewrite of `u` leaves the source as it is (DNAT only: a
/// local backend, or a flow returned directly).
#[inline(always)]
fn source_stays<A: XdpFamily>(u: &Up<A>) -> bool {
    let flow = &u.s.flow;
    flow.saddr_be.same(&u.to_saddr_be) && flow.sport_be == u.to_ports_be[0]
}

/// Where the L4 checksum of `proto` lies, from the L4 header.
#[inline(always)]
fn csum_off(proto: u8) -> usize {
    if proto == proto::TCP {
        TCP_CSUM_OFF
    } else {
        UDP_CSUM_OFF
    }
}

impl XdpFamily for u32 {
    #[inline(always)]
    fn parse(ctx: &XdpContext, u: &mut Up<u32>) -> Result<(), Skip> {
        u.s.flow = parse_ipv4(ctx)?;
        Ok(())
    }
    #[inline(always)]
    fn reject(ctx: &XdpContext, u: &mut Up<u32>) -> u32 {
        // Answered here: counted and traced here.
        count_service(u.service_id, |s| s.drops_no_backend += 1);
        trace::rejected(layer::XDP, &u.s.flow, u.service_id);
        crate::reject::xdp_reject(ctx, &mut u.s)
    }
    #[inline(always)]
    fn write_translation(ctx: &XdpContext, u: &Up<u32>) -> Result<(), StoreFailed> {
        let flow = &u.s.flow;
        if flow.l4_off > MAX_L4_OFF {
            return Err(StoreFailed);
        }
        let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN).map_err(|_| StoreFailed)?;
        let ports = ptr_at::<[u16; 2]>(ctx, flow.l4_off).map_err(|_| StoreFailed)?;
        let csum_off = flow.l4_off + csum_off(flow.proto);
        let l4_csum = ptr_at::<u16>(ctx, csum_off).map_err(|_| StoreFailed)?;
        // SAFETY: `ptr_at` checked every field lies inside the frame, which
        // an XDP program may write; no helper that moves the frame runs in
        // between.
        unsafe {
            let mut ip_csum = csum_replace4((*ip).csum_be, flow.daddr_be, u.to_daddr_be);
            if flow.saddr_be != u.to_saddr_be {
                ip_csum = csum_replace4(ip_csum, flow.saddr_be, u.to_saddr_be);
                (*ip).saddr_be = u.to_saddr_be;
            }
            (*ip).csum_be = ip_csum;
            (*ip).daddr_be = u.to_daddr_be;
            if let Some(csum) = l4_checksum(u, *l4_csum, |c, old, new| csum_replace4(c, *old, *new))
            {
                *l4_csum = csum;
            }
            *ports = u.to_ports_be;
        }
        Ok(())
    }
    #[inline(always)]
    fn hop_limit(ctx: &XdpContext) -> Result<u8, Skip> {
        let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
        // SAFETY: `ptr_at` checked the header lies inside the frame; a read.
        Ok(unsafe { (*ip).ttl })
    }
    #[inline(always)]
    fn decrement_hop_limit(ctx: &XdpContext, ttl: u8) -> Result<(), StoreFailed> {
        let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN).map_err(|_| StoreFailed)?;
        // SAFETY: `ptr_at` checked the header lies inside the frame.
        unsafe {
            // The 16-bit word the TTL shares with the protocol, as in memory.
            let old = u16::from_ne_bytes([ttl, (*ip).proto]);
            let new = u16::from_ne_bytes([ttl - 1, (*ip).proto]);
            (*ip).csum_be = csum_replace2((*ip).csum_be, old, new);
            (*ip).ttl = ttl - 1;
        }
        Ok(())
    }
    #[inline(always)]
    fn carry(ctx: &XdpContext, u: &Up<u32>) -> Result<(), StoreFailed> {
        dsr::carry_xdp(ctx, u).map_err(|_| StoreFailed)
    }
}

impl XdpFamily for Addr6Be {
    #[inline(always)]
    fn parse(ctx: &XdpContext, u: &mut Up<Addr6Be>) -> Result<(), Skip> {
        match parse6(ctx, &mut u.s.flow)? {
            Kind::Flow if u.s.flow.first_fragment => Err(Skip::Fragment),
            Kind::Flow => Ok(()),
            // To tc, as IPv4 fragments go.
            Kind::Later => Err(Skip::Fragment),
            // Neighbour discovery, echo and errors: never disturbed.
            Kind::Icmp => Err(Skip::Icmp),
        }
    }
    #[inline(always)]
    fn reject(_ctx: &XdpContext, _u: &mut Up<Addr6Be>) -> u32 {
        // The answer is built by the uplink's tc program
        // (`crate::reject`), which sees the packet untouched, counts and
        // traces it.
        count(stat::XDP_TO_TC);
        xdp_action::XDP_PASS
    }
    /// The checksum is read and computed before anything is written, so a
    /// failed read leaves the frame as it was.
    #[inline(always)]
    fn write_translation(ctx: &XdpContext, u: &Up<Addr6Be>) -> Result<(), StoreFailed> {
        let flow = &u.s.flow;
        let l4_off = flow.l4_off();
        let csum_off = l4_off + csum_off(flow.proto);
        let old: u16 = read(ctx, csum_off).map_err(|_| StoreFailed)?;
        if let Some(csum) = l4_checksum(u, old, csum_replace16) {
            write(ctx, csum_off, &csum)?;
        }
        if !source_stays(u) {
            write::<Addr6Be>(ctx, IP6_SADDR_OFF, &u.to_saddr_be)?;
        }
        write::<Addr6Be>(ctx, IP6_DADDR_OFF, &u.to_daddr_be)?;
        write::<[u16; 2]>(ctx, l4_off, &u.to_ports_be)
    }
    #[inline(always)]
    fn hop_limit(ctx: &XdpContext) -> Result<u8, Skip> {
        read(ctx, IP6_HOP_LIMIT_OFF)
    }
    #[inline(always)]
    fn decrement_hop_limit(ctx: &XdpContext, hop_limit: u8) -> Result<(), StoreFailed> {
        let Ok(at) = ptr_at::<u8>(ctx, IP6_HOP_LIMIT_OFF) else {
            return store(ctx, IP6_HOP_LIMIT_OFF, &(hop_limit - 1));
        };
        // SAFETY: `ptr_at` checked the byte lies inside the frame, which an
        // XDP program may write.
        unsafe { *at = hop_limit - 1 };
        Ok(())
    }
    #[inline(always)]
    fn carry(ctx: &XdpContext, u: &Up<Addr6Be>) -> Result<(), StoreFailed> {
        dsr::carry6_xdp(ctx, u).map_err(|_| StoreFailed)
    }
}

/// The furthest offset [`read`] and [`write`] reach directly: past the
/// fixed header and extension headers of common sizes.
const MAX_DIRECT_OFF: usize = MAX_L4_OFF + 32;

/// Reads a `T` at `off`: directly where the frame's linear part holds it
/// (a header without extension headers always is), else through the load
/// helper (a frame whose headers run into its fragments).
#[inline(always)]
fn read<T: Copy>(ctx: &XdpContext, off: usize) -> Result<T, Skip> {
    // The bound tells the verifier how far a variable offset can reach.
    if off <= MAX_DIRECT_OFF {
        if let Ok(at) = ptr_at::<T>(ctx, off) {
            // SAFETY: `ptr_at` checked the field lies inside the frame; a
            // read that does not assume alignment.
            return Ok(unsafe { core::ptr::read_unaligned(at) });
        }
    }
    load(ctx, off)
}

/// Writes `value` at `off`: directly where the frame's linear part holds
/// it, else through the store helper (see [`read`]).
#[inline(always)]
fn write<T: Words>(ctx: &XdpContext, off: usize, value: &T) -> Result<(), StoreFailed> {
    if off <= MAX_DIRECT_OFF {
        if let Ok(at) = ptr_at::<T>(ctx, off) {
            // SAFETY: `ptr_at` checked the field lies inside the frame,
            // which an XDP program may write; no helper that moves the
            // frame runs between the check and the write.
            unsafe { set(&mut *at, value) };
            return Ok(());
        }
    }
    store(ctx, off, value)
}

/// [`xdp_store`], its refusal as [`StoreFailed`].
#[inline(always)]
fn store<T>(ctx: &XdpContext, off: usize, src: &T) -> Result<(), StoreFailed> {
    match xdp_store(ctx, off, src) {
        true => Ok(()),
        false => Err(StoreFailed),
    }
}
