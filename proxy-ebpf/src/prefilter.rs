//! The first tests before any hash lookup (see `proxy_common::prefilter`):
//! whether a destination (an address, or an address, port and protocol)
//! may be a frontend, and whether a pod interface may receive replies of
//! translated flows.
use aya_ebpf::programs::TcContext;
use proxy_common::{prefilter, Addr6Be};

use crate::maps::{SB_FE_FILTER_V1, SB_QUIET_V1};

/// Whether `bit` of the frontend bitmap is set. An array lookup, which the
/// verifier inlines: no hash, no helper call.
#[inline(always)]
fn frontend_bit(bit: u32) -> bool {
    let (word, mask) = prefilter::frontends::word_and_mask(bit);
    match SB_FE_FILTER_V1.get(word) {
        Some(bits) => bits & mask != 0,
        // Out of range cannot happen (the word is below the size); should it,
        // the lookups decide.
        None => true,
    }
}

/// False only if no frontend has the IPv4 address `addr_be`.
#[inline(always)]
pub(crate) fn maybe_frontend4(addr_be: u32) -> bool {
    frontend_bit(prefilter::frontends::bit4(addr_be))
}

/// False only if no frontend has the IPv6 address `addr_be`.
#[inline(always)]
pub(crate) fn maybe_frontend6(addr_be: &Addr6Be) -> bool {
    frontend_bit(prefilter::frontends::bit6(addr_be))
}

/// False only if no frontend has the IPv4 address `addr_be` with port
/// `port_be` and protocol `proto` (both bits of the bitmap are tested).
#[inline(always)]
pub(crate) fn maybe_frontend_port4(addr_be: u32, port_be: u16, proto: u8) -> bool {
    let addr_bit = prefilter::frontends::bit4(addr_be);
    frontend_bit(addr_bit) && frontend_bit(prefilter::frontends::port_bit(addr_bit, port_be, proto))
}

/// As [`maybe_frontend_port4`], for IPv6.
#[inline(always)]
pub(crate) fn maybe_frontend_port6(addr_be: &Addr6Be, port_be: u16, proto: u8) -> bool {
    let addr_bit = prefilter::frontends::bit6(addr_be);
    frontend_bit(addr_bit) && frontend_bit(prefilter::frontends::port_bit(addr_bit, port_be, proto))
}

/// The interface a tc program runs on.
#[inline(always)]
fn ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: a read of our own context.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// Whether the pod behind this interface has no flow the tc layer
/// translated, so nothing arriving for it is the reply of one.
#[inline(always)]
pub(crate) fn quiet(ctx: &TcContext) -> bool {
    let ifindex = ifindex(ctx);
    SB_QUIET_V1
        .get(prefilter::quiet::slot(ifindex))
        .is_some_and(|marked| *marked == ifindex)
}

/// Takes this interface's quiet mark away: its pod is about to get a
/// translated flow. Written only when set, so the cache line stays shared.
#[inline(always)]
pub(crate) fn unquiet(ctx: &TcContext) {
    let ifindex = ifindex(ctx);
    if let Some(marked) = SB_QUIET_V1.get_ptr_mut(prefilter::quiet::slot(ifindex)) {
        // SAFETY: a value of an array map, valid for the program run; a
        // racing write of the same zero is as good as ours.
        unsafe {
            if *marked == ifindex {
                *marked = 0;
            }
        }
    }
}
