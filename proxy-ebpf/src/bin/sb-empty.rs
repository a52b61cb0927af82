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
//!   at the cheapest point, so the pod's own stack does not add noise);
//! - `sb_gen_tail_xdp` is the uplink forwarding benchmark's generator: it
//!   writes a template frame (with a source port of its own per frame, for
//!   many flows) and tail-calls the program under test (`SB_GEN_TARGET`:
//!   switchboard's `sb_xdp_uplink`, or one of the two below), whose verdict
//!   the live-frame run then carries out;
//! - `sb_reflect_xdp` swaps the MAC addresses and returns `XDP_TX`: the
//!   least work a program that sends frames back out can do (the limit).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_OK},
    macros::{classifier, map, xdp},
    maps::{Array, PerCpuArray, ProgramArray},
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

/// Length of the uplink generator's frames (either family: Ethernet, IPv6
/// and UDP are 62 bytes; the rest is payload).
pub const GEN_TAIL_FRAME_LEN: usize = 96;

/// The uplink generator's template frame.
#[map]
static SB_GEN_TAIL_FRAME: Array<[u8; GEN_TAIL_FRAME_LEN]> = Array::with_max_entries(1, 0);

/// The uplink generator's settings: [flows (source ports, from the
/// template's), 1 for an IPv6 frame (else IPv4), unused].
#[map]
static SB_GEN_TAIL_CONF: Array<[u32; 3]> = Array::with_max_entries(1, 0);

/// Frames generated so far (per CPU): picks the next source port.
#[map]
static SB_GEN_TAIL_SEQ: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Slot 0: the program under test.
#[map]
static SB_GEN_TARGET: ProgramArray = ProgramArray::with_max_entries(1, 0);

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

/// The uplink forwarding benchmark's generator (live frames): the template
/// frame, its source port moved on by one per frame over `flows` ports (the
/// UDP checksum updated with it), then the program under test.
#[xdp]
pub fn sb_gen_tail_xdp(ctx: XdpContext) -> u32 {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + GEN_TAIL_FRAME_LEN > end {
        return xdp_action::XDP_ABORTED;
    }
    let (Some(template), Some(conf)) = (SB_GEN_TAIL_FRAME.get(0), SB_GEN_TAIL_CONF.get(0)) else {
        return xdp_action::XDP_ABORTED;
    };
    let [flows, ipv6, _] = *conf;
    if flows == 0 {
        return xdp_action::XDP_ABORTED;
    }
    let Some(seq) = SB_GEN_TAIL_SEQ.get_ptr_mut(0) else {
        return xdp_action::XDP_ABORTED;
    };
    // SAFETY: this CPU's own slot of a per-CPU array, valid for the program
    // run; nothing else runs on this CPU meanwhile.
    let n = unsafe {
        let n = *seq;
        *seq = n.wrapping_add(1);
        n
    };
    // SAFETY: the frame holds GEN_TAIL_FRAME_LEN bytes (checked above), as
    // does the template; a map value and packet data never overlap.
    unsafe {
        core::ptr::copy_nonoverlapping(template.as_ptr(), data as *mut u8, GEN_TAIL_FRAME_LEN);
    }
    let step = (n % flows) as u16;
    // Constant offsets (UDP right after the fixed header): the source port
    // and the checksum.
    match ipv6 {
        0 => next_port(data, 34, 40, step),
        _ => next_port(data, 54, 60, step),
    }
    // SAFETY: a tail call with our own context; on success it does not return.
    unsafe { SB_GEN_TARGET.tail_call(&ctx, 0) };
    xdp_action::XDP_ABORTED
}

/// Moves the UDP source port at `data + port_off` on by `step`, with the
/// checksum at `data + csum_off` (RFC 1624; a computed 0 is sent as
/// 0xffff).
#[inline(always)]
fn next_port(data: usize, port_off: usize, csum_off: usize, step: u16) {
    // SAFETY: both offsets are constants below GEN_TAIL_FRAME_LEN - 2, and
    // the caller checked the frame holds GEN_TAIL_FRAME_LEN bytes.
    unsafe {
        let port = (data + port_off) as *mut u16;
        let csum = (data + csum_off) as *mut u16;
        let old = core::ptr::read_unaligned(port);
        let new = u16::from_be(old).wrapping_add(step).to_be();
        core::ptr::write_unaligned(port, new);
        let mut sum =
            u32::from(!core::ptr::read_unaligned(csum)) + u32::from(!old) + u32::from(new);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        let folded = !(sum as u16);
        core::ptr::write_unaligned(csum, if folded == 0 { 0xffff } else { folded });
    }
}

/// The reflector: the MAC addresses swapped, sent back out.
#[xdp]
pub fn sb_reflect_xdp(ctx: XdpContext) -> u32 {
    let (data, end) = (ctx.data(), ctx.data_end());
    if data + 12 > end {
        return xdp_action::XDP_ABORTED;
    }
    // SAFETY: bytes 0..12 lie inside the frame (checked above).
    unsafe {
        let macs = data as *mut [u8; 6];
        let (dst, src) = (
            core::ptr::read_unaligned(macs),
            core::ptr::read_unaligned(macs.add(1)),
        );
        core::ptr::write_unaligned(macs, src);
        core::ptr::write_unaligned(macs.add(1), dst);
    }
    xdp_action::XDP_TX
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
