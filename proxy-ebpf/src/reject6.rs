//! Rejecting IPv6 (stub).
use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};
use proxy_common::{stat, FrontendSlot};

use crate::{maps::count, packet6::Scratch6};

#[inline(always)]
pub fn from_pod(_ctx: &TcContext, _s: &mut Scratch6, _svc: &FrontendSlot) -> i32 {
    count(stat::DROP_NO_BACKEND);
    TC_ACT_SHOT as i32
}
