//! The floor for benchmarks: a tc classifier and an XDP program that do
//! nothing but return. `cargo xtask bench` runs them through
//! BPF_PROG_TEST_RUN next to switchboard's programs, so "switchboard ÷ empty"
//! is measured on the same hook, the same frame and the same run.
//!
//! - `sb_empty_tc` returns `TC_ACT_OK` (the packet goes on: "a program that
//!   only forwards" in the forwarding benchmark);
//! - `sb_empty_xdp` returns `XDP_PASS` (used as the live-frame generator too:
//!   with BPF_F_TEST_XDP_LIVE_FRAMES every XDP_PASS frame enters the stack of
//!   the interface named in the context, like a received packet);
//! - `sb_sink_xdp` drops everything but ARP: the receiving end of the forwarding
//!   benchmark (attached to a pod's eth0 it throws the forwarded frames away
//!   at the cheapest point, so the pod's own stack does not add noise).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_OK},
    macros::{classifier, map, xdp},
    maps::{Array, PerCpuArray},
    programs::{TcContext, XdpContext},
};

/// Length of the generated frame (Ethernet + IPv4 + UDP + 18 bytes).
pub const GEN_FRAME_LEN: usize = 60;

/// The frame `sb_gen_xdp` writes into every generated packet.
#[map]
static SB_GEN_FRAME: Array<[u8; 64]> = Array::with_max_entries(1, 0);

/// Frames the sink received (per CPU; summed by the benchmark).
#[map]
static SB_SINK_COUNT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[classifier]
pub fn sb_empty_tc(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}

#[xdp]
pub fn sb_empty_xdp(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[xdp]
pub fn sb_sink_xdp(ctx: XdpContext) -> u32 {
    // ARP passes, so the node can resolve the pod's address; everything else
    // is counted and dropped.
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + 14 <= end {
        // SAFETY: bytes 12..14 lie inside the frame (checked above); read
        // without assuming alignment.
        let ethertype = unsafe { core::ptr::read_unaligned((data + 12) as *const u16) };
        if ethertype == 0x0806u16.to_be() {
            return xdp_action::XDP_PASS;
        }
    }
    if let Some(count) = SB_SINK_COUNT.get_ptr_mut(0) {
        // SAFETY: this CPU's own slot of a per-CPU array, valid for the
        // program run; nothing else runs on this CPU meanwhile.
        unsafe { *count += 1 };
    }
    xdp_action::XDP_DROP
}

/// The forwarding benchmark's packet generator (run with
/// BPF_F_TEST_XDP_LIVE_FRAMES). Live-frame mode recycles its pages without
/// restoring their bytes, and a forwarded frame comes back with the next hop's
/// MAC, a lower TTL and (through switchboard) a rewritten destination; so the
/// generator writes the template frame from `SB_GEN_FRAME` into every packet
/// before passing it to the stack.
#[xdp]
pub fn sb_gen_xdp(ctx: XdpContext) -> u32 {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + GEN_FRAME_LEN > end {
        return xdp_action::XDP_ABORTED;
    }
    let Some(template) = SB_GEN_FRAME.get(0) else {
        return xdp_action::XDP_ABORTED;
    };
    // SAFETY: the frame holds GEN_FRAME_LEN bytes (checked above) and the
    // template 64; a map value and packet data never overlap.
    unsafe {
        core::ptr::copy_nonoverlapping(template.as_ptr(), data as *mut u8, GEN_FRAME_LEN);
    }
    xdp_action::XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
