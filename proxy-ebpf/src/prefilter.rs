//! The first tests before any hash lookup (see `proxy_common::prefilter`):
//! whether a destination (an address, or an address, port and protocol)
//! may be a frontend, and whether a pod interface may receive replies of
//! translated flows.
use aya_ebpf::programs::TcContext;
use proxy_common::{prefilter, Addr6Be};

use crate::maps::{SB_FE_FILTER_SHIFT, SB_FE_FILTER_V3, SB_QUIET_GEN_V1, SB_QUIET_V2};

/// How a hash indexes the bitmap, as the loader set it for its size.
#[inline(always)]
fn shift() -> u32 {
    // SAFETY: a global of the program's object, always there and aligned;
    // read-only once loaded. Volatile: the compiler must not fold in the
    // value the object was built with.
    unsafe { core::ptr::read_volatile(&SB_FE_FILTER_SHIFT) }
}

/// Whether `bit` of the frontend bitmap is set. An array lookup, which the
/// verifier inlines: no hash, no helper call.
#[inline(always)]
fn frontend_bit(bit: u32) -> bool {
    let (word, mask) = prefilter::frontends::word_and_mask(bit);
    match SB_FE_FILTER_V3.get(word) {
        Some(bits) => bits & mask != 0,
        // Out of range cannot happen (the word is below the size); should it,
        // the lookups decide.
        None => true,
    }
}

/// False only if no frontend has the IPv4 address `addr_be`.
#[inline(always)]
pub(crate) fn maybe_frontend4(addr_be: u32) -> bool {
    frontend_bit(prefilter::frontends::bit4(addr_be, shift()))
}

/// False only if no frontend has the IPv6 address `addr_be`.
#[inline(always)]
pub(crate) fn maybe_frontend6(addr_be: &Addr6Be) -> bool {
    frontend_bit(prefilter::frontends::bit6(addr_be, shift()))
}

/// False only if no frontend has the IPv4 address `addr_be` with port
/// `port_be` and protocol `proto` (both bits of the bitmap are tested).
#[inline(always)]
pub(crate) fn maybe_frontend_port4(addr_be: u32, port_be: u16, proto: u8) -> bool {
    let shift = shift();
    let addr_bit = prefilter::frontends::bit4(addr_be, shift);
    frontend_bit(addr_bit)
        && frontend_bit(prefilter::frontends::port_bit(
            addr_bit, port_be, proto, shift,
        ))
}

/// As [`maybe_frontend_port4`], for IPv6.
#[inline(always)]
pub(crate) fn maybe_frontend_port6(addr_be: &Addr6Be, port_be: u16, proto: u8) -> bool {
    let shift = shift();
    let addr_bit = prefilter::frontends::bit6(addr_be, shift);
    frontend_bit(addr_bit)
        && frontend_bit(prefilter::frontends::port_bit(
            addr_bit, port_be, proto, shift,
        ))
}

/// The interface a tc program runs on.
#[inline(always)]
fn ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: a read of our own context.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// Whether the pod behind this interface has no flow the tc layer
/// translated that a packet of IP protocol `proto` could belong to, so it
/// is the reply of none: the mark of its class (of both, for a protocol
/// that may quote either) names this interface and the current generation.
#[inline(always)]
pub(crate) fn quiet(ctx: &TcContext, proto: u8) -> bool {
    let ifindex = ifindex(ctx);
    match prefilter::quiet::class_of_packet(proto) {
        Some(class) => quiet_in(ifindex, class),
        None => {
            quiet_in(ifindex, prefilter::quiet::TCP) && quiet_in(ifindex, prefilter::quiet::OTHER)
        }
    }
}

/// Whether `ifindex` holds a current mark for `class`.
#[inline(always)]
fn quiet_in(ifindex: u32, class: u32) -> bool {
    let index = prefilter::quiet::index(ifindex, class);
    match (SB_QUIET_V2.get(index), SB_QUIET_GEN_V1.get(index)) {
        (Some(mark), Some(gen)) => mark.holds(ifindex, *gen),
        _ => false,
    }
}

/// A flow of protocol `proto` from this interface's pod was just tracked:
/// its class's generation moves on, voiding any mark the agent made from
/// an earlier look at the tables. After the insert, so an agent that reads
/// the generation before its look either finds the flow or sees the new
/// generation.
#[inline(always)]
pub(crate) fn note_flow(ctx: &TcContext, proto: u8) {
    let index = prefilter::quiet::index(ifindex(ctx), prefilter::quiet::class_of_flow(proto));
    if let Some(gen) = SB_QUIET_GEN_V1.get_ptr_mut(index) {
        // SAFETY: a value of an array map, valid for the program run and
        // 8-aligned; the add is atomic, so no CPU's count is lost.
        unsafe { crate::lb::sched::fetch_add(gen, 1) };
    }
}
