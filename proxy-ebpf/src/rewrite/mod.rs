//! Rewrite and checksum of a translated TCP/UDP packet on the tc path, for
//! both families ([`rewrite`]): the address and port of one side stored
//! directly where they lie in the linear data (through the store helper
//! elsewhere), the IPv4 header checksum computed, and the L4 checksum
//! updated in place as the skb's `ip_summed` says (full or partial), or
//! through the kernel's helper where a program cannot ([`l4`]). What
//! the families do differently is [`Header`] (IPv4 here, IPv6 in [`v6`]).
//! Also here: the counters of a rewritten packet.
pub mod l4;
pub mod v6;

use crate::{
    maps::{count, count_service},
    packet::{
        csum_replace4, ctx::ptr_at, set, FlowOf, Skip, Words, ETH_HLEN, IP_CSUM_OFF, TCP_CSUM_OFF,
        UDP_CSUM_OFF,
    },
};
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use proxy_common::{proto, stat};
/// Which side of the packet a rewrite touches.
#[derive(Clone, Copy)]
pub(crate) enum Side {
    Source,
    Destination,
}

/// A rewrite helper failed half-way; the packet must not go on.
pub(crate) struct RewriteFailed;

/// Counts a rewritten packet of either family: a forwarded one for its
/// service, a reversed one globally.
#[inline(always)]
pub(crate) fn count_rewritten(ctx: &TcContext, side: Side, service_id: u32) {
    match side {
        Side::Destination => {
            let len = u64::from(ctx.len());
            count_service(service_id, |s| {
                s.packets += 1;
                s.bytes += len;
            });
            count(stat::FORWARDED);
        }
        Side::Source => count(stat::REVERSED),
    }
}

/// An address family's header, as a rewrite sees it.
pub(crate) trait Header: Words {
    /// Where the source and the destination address lie in the frame.
    const SADDR_OFF: usize;
    const DADDR_OFF: usize;
    /// Whether two addresses differ.
    fn differs(&self, other: &Self) -> bool;
    /// Stores `new` over the address `old` at `off`, with the header
    /// checksum the family has.
    fn store_addr(ctx: &TcContext, off: usize, old: &Self, new: &Self)
        -> Result<(), RewriteFailed>;
    /// The one's-complement difference of the address changing from `old`
    /// to `new`, as the pseudo-header sees it.
    fn pseudo_diff(old: &Self, new: &Self) -> u64;
    /// Updates the L4 checksum at `csum_off` for the pseudo-header address
    /// change from `old` to `new` through the helper (`l4_flags`: the UDP
    /// flags).
    fn l4_csum_addr(
        ctx: &TcContext,
        csum_off: usize,
        old: &Self,
        new: &Self,
        l4_flags: u64,
    ) -> Result<(), RewriteFailed>;
}

impl Header for u32 {
    const SADDR_OFF: usize = ETH_HLEN + 12;
    const DADDR_OFF: usize = ETH_HLEN + 16;
    #[inline(always)]
    fn differs(&self, other: &u32) -> bool {
        self != other
    }
    #[inline(always)]
    fn store_addr(ctx: &TcContext, off: usize, old: &u32, new: &u32) -> Result<(), RewriteFailed> {
        let csum = ptr_at::<u16>(ctx, IP_CSUM_OFF).map_err(|_| RewriteFailed)?;
        let addr = ptr_at::<u32>(ctx, off).map_err(|_| RewriteFailed)?;
        // SAFETY: `ptr_at` checked both fields lie inside the linear packet
        // data, which this program may store into (the verifier unclones
        // the skb on entry).
        unsafe {
            *csum = csum_replace4(*csum, *old, *new);
            *addr = *new;
        }
        Ok(())
    }
    #[inline(always)]
    fn pseudo_diff(old: &u32, new: &u32) -> u64 {
        u64::from(!*old) + u64::from(*new)
    }
    #[inline(always)]
    fn l4_csum_addr(
        ctx: &TcContext,
        csum_off: usize,
        old: &u32,
        new: &u32,
        l4_flags: u64,
    ) -> Result<(), RewriteFailed> {
        let flags = u64::from(BPF_F_PSEUDO_HDR) | l4_flags | 4;
        ctx.l4_csum_replace(csum_off, u64::from(*old), u64::from(*new), flags)
            .map_err(|_| RewriteFailed)
    }
}

/// Rewrites one side (address and port) of the TCP/UDP packet of `flow`
/// to `new_addr_be:new_port_be`, and its checksums: the IPv4 header's in
/// place, the L4 one as [`l4`] says (in place unless the skb carries a
/// `CHECKSUM_COMPLETE` sum or the kfunc is missing).
#[inline(always)]
pub(crate) fn rewrite<A: Header>(
    ctx: &TcContext,
    flow: &FlowOf<A>,
    side: Side,
    new_addr_be: &A,
    new_port_be: u16,
) -> Result<(), RewriteFailed> {
    // Before any packet pointer is taken: a call.
    let how = l4::update(ctx);
    // The bound tells the verifier how far the offset (read back from
    // working memory, or past IPv6 extension headers) can reach.
    let l4_off = flow.l4_off;
    if l4_off > MAX_DIRECT_OFF {
        return Err(RewriteFailed);
    }
    let (addr_off, old_addr_be, old_port_be, port_off) = match side {
        Side::Source => (A::SADDR_OFF, &flow.saddr_be, flow.sport_be, l4_off),
        Side::Destination => (A::DADDR_OFF, &flow.daddr_be, flow.dport_be, l4_off + 2),
    };
    let udp = flow.proto != proto::TCP;
    let csum_off = match udp {
        false => l4_off + TCP_CSUM_OFF,
        true => l4_off + UDP_CSUM_OFF,
    };
    let new_addr = old_addr_be.differs(new_addr_be);
    let new_port = old_port_be != new_port_be;
    if new_addr {
        A::store_addr(ctx, addr_off, old_addr_be, new_addr_be)?;
    }
    if new_port {
        store(ctx, port_off, &new_port_be)?;
    }
    let field = match how {
        l4::Update::Helper => Err(Skip::Malformed),
        _ => ptr_at::<u16>(ctx, csum_off),
    };
    let Ok(field) = field else {
        // The helper pulls in a field beyond the linear data.
        return l4_csum_helper(
            ctx,
            csum_off,
            udp,
            (new_addr, old_addr_be, new_addr_be),
            (new_port, old_port_be, new_port_be),
        );
    };
    let mut diff = 0;
    if new_addr {
        diff += A::pseudo_diff(old_addr_be, new_addr_be);
    }
    if new_port && how == l4::Update::Full {
        diff += l4::diff16(old_port_be, new_port_be);
    }
    // SAFETY: `ptr_at` checked the field lies inside the linear packet
    // data, which this program may store into; no helper ran since.
    unsafe { *field = l4::updated(*field, diff, how, udp) };
    Ok(())
}

/// [`rewrite`]'s L4 checksum through the kernel's helper, which knows the
/// skb's checksum state: one call per changed field (`(changed, old, new)`).
#[inline(always)]
fn l4_csum_helper<A: Header>(
    ctx: &TcContext,
    csum_off: usize,
    udp: bool,
    (new_addr, old_addr_be, new_addr_be): (bool, &A, &A),
    (new_port, old_port_be, new_port_be): (bool, u16, u16),
) -> Result<(), RewriteFailed> {
    let l4_flags = match udp {
        true => u64::from(BPF_F_MARK_MANGLED_0),
        false => 0,
    };
    if new_addr {
        A::l4_csum_addr(ctx, csum_off, old_addr_be, new_addr_be, l4_flags)?;
    }
    if new_port {
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

/// The furthest offset [`store`] writes directly: past the fixed header and
/// the options or extension headers of common sizes.
const MAX_DIRECT_OFF: usize = 512;

/// Writes `value` at `off`: directly where the bytes are in the linear
/// area (the verifier made the header private on entry), else through the
/// store helper (the IPv6 walk reads beyond the linear area).
#[inline(always)]
pub(crate) fn store<T: Words>(ctx: &TcContext, off: usize, value: &T) -> Result<(), RewriteFailed> {
    // The bound tells the verifier how far a variable offset can reach.
    let direct = match off <= MAX_DIRECT_OFF {
        true => ptr_at::<T>(ctx, off),
        false => Err(Skip::Malformed),
    };
    match direct {
        Ok(at) => {
            // SAFETY: `ptr_at` checked the field lies inside the linear
            // packet data, which this program may store into; no helper
            // that moves packet data ran since the check.
            unsafe { set(&mut *at, value) };
            Ok(())
        }
        Err(_) => ctx.store(off, value, 0).map_err(|_| RewriteFailed),
    }
}
