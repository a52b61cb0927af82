//! ICMPv6 errors (stub).
use aya_ebpf::programs::TcContext;

use crate::{packet::Skip, packet6::Scratch6};

#[inline(always)]
pub fn translate(_ctx: &TcContext, _s: &mut Scratch6, _dir: u8) -> Result<i32, Skip> {
    Err(Skip::NotOurs)
}
