//! The floor for benchmarks: a tc classifier and an XDP program that do
//! nothing but return. `cargo xtask bench` runs them through
//! BPF_PROG_TEST_RUN next to switchboard's programs, so "switchboard ÷ empty"
//! is measured on the same hook, the same frame and the same run.
//!
//! - `sb_empty_tc` returns `TC_ACT_OK` (the packet goes on: "a program that
//!   only forwards" in the forwarding benchmark);
//! - `sb_empty_xdp` returns `XDP_PASS` (used as the live-frame generator too:
//!   with BPF_F_TEST_XDP_LIVE_FRAMES every XDP_PASS frame enters the stack of
//!   the interface named in the context, like a received packet).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{xdp_action, TC_ACT_OK},
    macros::{classifier, xdp},
    programs::{TcContext, XdpContext},
};

#[classifier]
pub fn sb_empty_tc(_ctx: TcContext) -> i32 {
    TC_ACT_OK as i32
}

#[xdp]
pub fn sb_empty_xdp(_ctx: XdpContext) -> u32 {
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
