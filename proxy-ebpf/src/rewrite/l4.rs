//! The L4 checksum of a rewritten packet, updated in place where the skb's
//! checksum state allows, else through `bpf_l4_csum_replace`.
//!
//! What the update must do depends on `ip_summed`, which only the kernel's
//! `struct sk_buff` holds ([`proxy_common::ip_summed`] says how the programs
//! read it):
//! - `CHECKSUM_NONE` or `CHECKSUM_UNNECESSARY`: the field is a complete
//!   checksum; every changed word (address and port) goes into it
//!   ([`Update::Full`]);
//! - `CHECKSUM_PARTIAL` (a local socket's segment over a veth): the field
//!   holds the pseudo-header sum the device or the kernel finishes over the
//!   segment; only an address change goes into it, a port change is summed
//!   when the segment is ([`Update::Seed`]);
//! - `CHECKSUM_COMPLETE`: `skb->csum` must follow the pseudo-header change
//!   too, and a program cannot write it: the helper ([`Update::Helper`]), as
//!   for every packet when the loader could not patch in the kfunc.
//!
//! Either way a UDP checksum of zero (none) stays zero, and a computed zero
//! is sent as 0xffff, as the helper does with `BPF_F_MARK_MANGLED_0`.
use aya_ebpf::programs::TcContext;
use proxy_common::ip_summed::{summed, CALL_MARKER, LOAD_MARKER, SUMMED_UNKNOWN};

/// Where `ip_summed` lies in the byte the patched load reads (its lowest
/// bit), or `SUMMED_UNKNOWN`: read-only data, set by the loader
/// (`proxy_common::ip_summed::SUMMED_SHIFT`).
#[unsafe(no_mangle)]
pub static SB_SKB_SUMMED_SHIFT: u32 = SUMMED_UNKNOWN;

/// How a rewrite updates the L4 checksum of the packet at hand.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Update {
    /// A complete checksum: address and port changes, in place.
    Full,
    /// A partial checksum's pseudo-header seed: the address change alone,
    /// in place.
    Seed,
    /// Through the kernel's helper.
    Helper,
}

/// How this packet's L4 checksum is to be updated, from its `ip_summed`.
#[inline(always)]
pub(crate) fn update(ctx: &TcContext) -> Update {
    // SAFETY: a read of the program's read-only data; volatile so the
    // compiler keeps the load (the verifier reads the loaded value as a
    // constant and prunes the branch not taken).
    let shift = unsafe { core::ptr::read_volatile(&SB_SKB_SUMMED_SHIFT) };
    if shift > 6 {
        return Update::Helper;
    }
    let byte: u64;
    // SAFETY: with a known shift the loader patched the marker call into
    // `bpf_cast_to_kern_ctx` (r1: this program's context; r0: the same
    // skb as the kernel's `struct sk_buff`, trusted) and the marker load
    // into a read of the byte holding `ip_summed` (the verifier checks it
    // against the kernel's BTF). r1-r5 are a call's scratch registers.
    unsafe {
        core::arch::asm!(
            "call {call}",
            "r0 = *(u8 *)(r0 + {load})",
            call = const CALL_MARKER,
            load = const LOAD_MARKER,
            inout("r1") ctx.skb.skb => _,
            lateout("r0") byte,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
            options(nostack),
        );
    }
    match ((byte >> shift) & 3) as u8 {
        summed::NONE | summed::UNNECESSARY => Update::Full,
        summed::PARTIAL => Update::Seed,
        _ => Update::Helper,
    }
}

/// A one's-complement sum folded to 16 bits.
#[inline(always)]
fn fold(mut sum: u64) -> u16 {
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// The checksum field `field` after words whose one's-complement
/// difference is `diff` changed (the changes `how` covers; never
/// [`Update::Helper`]). `udp`: zero means no checksum.
#[inline(always)]
pub(crate) fn updated(field: u16, diff: u64, how: Update, udp: bool) -> u16 {
    if udp && field == 0 {
        return 0;
    }
    let new = match how {
        Update::Seed => fold(u64::from(field) + diff),
        _ => !fold(u64::from(!field) + diff),
    };
    match udp && new == 0 {
        true => 0xffff,
        false => new,
    }
}

/// The one's-complement difference of a 16-bit field changing.
#[inline(always)]
pub(crate) fn diff16(old: u16, new: u16) -> u64 {
    u64::from(!old) + u64::from(new)
}
