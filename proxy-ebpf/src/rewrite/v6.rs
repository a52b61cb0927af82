//! Rewrite and checksum of a translated IPv6 packet on the tc path (direct
//! stores where the bytes are linear, helper stores elsewhere: the IPv6
//! header has no checksum, the L4 checksum takes one difference over the
//! 16-byte address and the port).
use crate::{
    packet::ctx::ptr_at,
    packet::v6::{addr_diff, eq6, Flow6, IP6_DADDR_OFF, IP6_SADDR_OFF},
    packet::{set, Skip, Words},
    packet::{TCP_CSUM_OFF, UDP_CSUM_OFF},
    rewrite::RewriteFailed,
    rewrite::Side,
};
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR},
    programs::TcContext,
};
use proxy_common::{proto, Addr6Be};
/// `BPF_F_IPV6` (Linux 6.16+): the checksummed packet is IPv6. Older kernels
/// refuse the flag; the rewrite then retries without it.
pub(crate) const BPF_F_IPV6: u64 = 1 << 7;

/// Rewrites one side (address and port) of an IPv6 TCP/UDP packet ([`store`]),
/// and its L4 checksum through the kernel's helper.
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
        store(ctx, addr_off, new_addr_be)?;
        l4_csum_diff(ctx, csum_off, diff, l4_flags)?;
    }
    if old_port_be != new_port_be {
        store(ctx, port_off, &new_port_be)?;
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

/// The furthest offset [`store`] writes directly: past the fixed header
/// and [`crate::packet::v6::MAX_EXT_HEADERS`] extension headers of common
/// sizes.
const MAX_DIRECT_OFF: usize = 512;

/// Writes `value` at `off`: directly where the bytes are in the linear
/// area (the verifier made the header private on entry), else through the
/// store helper (the walk of `parse6` reads beyond the linear area).
#[inline(always)]
fn store<T: Words>(ctx: &TcContext, off: usize, value: &T) -> Result<(), RewriteFailed> {
    // The bound tells the verifier how far a variable offset (the port's,
    // after the extension headers) can reach.
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
