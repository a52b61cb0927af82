//! The IPv6 header as a rewrite sees it ([`super::Header`]): no header
//! checksum; the L4 checksum takes the address change as one
//! one's-complement difference over the 16 bytes.
use crate::{
    packet::v6::{addr_diff, eq6, IP6_DADDR_OFF, IP6_SADDR_OFF},
    rewrite::{store, Header, RewriteFailed},
};
use aya_ebpf::{bindings::BPF_F_PSEUDO_HDR, programs::TcContext};
use proxy_common::Addr6Be;

/// `BPF_F_IPV6` (Linux 6.16+): the checksummed packet is IPv6. Older kernels
/// refuse the flag; the rewrite then retries without it.
const BPF_F_IPV6: u64 = 1 << 7;

impl Header for Addr6Be {
    const SADDR_OFF: usize = IP6_SADDR_OFF;
    const DADDR_OFF: usize = IP6_DADDR_OFF;
    #[inline(always)]
    fn differs(&self, other: &Addr6Be) -> bool {
        !eq6(self, other)
    }
    #[inline(always)]
    fn store_addr(
        ctx: &TcContext,
        off: usize,
        _old: &Addr6Be,
        new: &Addr6Be,
    ) -> Result<(), RewriteFailed> {
        store(ctx, off, new)
    }
    #[inline(always)]
    fn pseudo_diff(old: &Addr6Be, new: &Addr6Be) -> u64 {
        u64::from(addr_diff(old, new))
    }
    /// The difference as `bpf_l4_csum_replace` takes it with size 0 and
    /// `BPF_F_PSEUDO_HDR`; `BPF_F_IPV6` leaves a `CHECKSUM_COMPLETE` skb's
    /// sum alone (the address change and the checksum change cancel in it).
    #[inline(always)]
    fn l4_csum_addr(
        ctx: &TcContext,
        csum_off: usize,
        old: &Addr6Be,
        new: &Addr6Be,
        l4_flags: u64,
    ) -> Result<(), RewriteFailed> {
        l4_csum_diff(ctx, csum_off, addr_diff(old, new), l4_flags)
    }
}

/// Adds the one's-complement difference `diff` of a pseudo-header address
/// change to the L4 checksum at `csum_off`.
#[inline(always)]
fn l4_csum_diff(
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
