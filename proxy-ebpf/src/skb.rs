//! Access to a tc program's packet (`TcContext`): bounds-checked pointers into
//! the linear data (pulling it in when needed), the ethertype, the IPv4
//! parser of the tc programs, the verdicts a tc program returns for packets
//! it leaves alone or drops (counted), and the tail call that hands an IPv6
//! packet to its program.
use crate::maps::SB_TAIL6_V1;
use crate::packet::ctx::{ensure_linear, ptr_at};
use crate::{
    maps::count,
    packet::{v6::ETH_P_IPV6_BE, Skip, ETH_HLEN, ETH_P_IP_BE},
};
use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::{bpf_redirect, bpf_skb_load_bytes},
    programs::TcContext,
};
use proxy_common::stat;

/// Lets a packet we leave alone continue untouched, counting only the odd
/// ones: counting every packet of the node would cost each a map update.
#[inline(always)]
pub fn pass(skip: Skip) -> i32 {
    match skip {
        Skip::NotOurs | Skip::Icmp => {}
        Skip::Malformed => {
            count(stat::MALFORMED);
            crate::trace::malformed(crate::trace::layer::TC);
        }
        Skip::Fragment => count(stat::FRAGMENT),
    }
    TC_ACT_UNSPEC
}

/// Drops a packet, counting why.
#[inline(always)]
pub(crate) fn drop_counted(stat_index: u32) -> Result<i32, Skip> {
    count(stat_index);
    Ok(TC_ACT_SHOT)
}

/// The frame's ethertype (network order), read from the linear area.
#[inline(always)]
pub(crate) fn ethertype(ctx: &TcContext) -> Result<u16, Skip> {
    if (ctx.len() as usize) < ETH_HLEN + 2 {
        return Err(Skip::NotOurs);
    }
    ensure_linear(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the two bytes lie inside the packet.
    Ok(unsafe { *ptr_at::<u16>(ctx, 12)? })
}

/// Decides the family of a tc program's packet, once: `Ok(None)` for
/// IPv4, which the caller goes on with; IPv6 is tail-called into the
/// program `slot6` (`tail::FROM_UPLINK6`), and
/// `Ok(Some(action))` returned only when that call failed; anything else is
/// not ours.
#[inline(always)]
pub(crate) fn ipv4_or_hand_over6(ctx: &TcContext, slot6: u32) -> Result<Option<i32>, Skip> {
    match ethertype(ctx)? {
        ETH_P_IP_BE => Ok(None),
        ETH_P_IPV6_BE => Ok(Some(hand_over6(ctx, slot6))),
        _ => Err(Skip::NotOurs),
    }
}

/// Tail-calls the IPv6 program `slot` (`tail::FROM_UPLINK6`).
/// Returns only if the call failed (the agent has not filled the array
/// yet): the packet passes untouched, counted.
#[inline(always)]
pub(crate) fn hand_over6(ctx: &TcContext, slot: u32) -> i32 {
    // SAFETY: a tail call with our own context and program array; on success
    // it does not return.
    unsafe { SB_TAIL6_V1.tail_call(ctx, slot) };
    count(stat::TAIL_CALL_MISSED);
    TC_ACT_UNSPEC
}

/// Sends a rewritten packet back out of the interface it came in on, its
/// MAC addresses swapped (the hairpin of either family); a failed helper
/// drops it, counted.
#[inline(always)]
pub(crate) fn send_back_out(ctx: &TcContext) -> i32 {
    let mut macs = [0u8; 12];
    // SAFETY: copies a constant 12 bytes into a stack buffer of that size.
    let loaded =
        unsafe { bpf_skb_load_bytes(ctx.skb.skb as *const _, 0, macs.as_mut_ptr() as *mut _, 12) };
    if loaded != 0 {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    let mut swapped = [0u8; 12];
    let mut i = 0;
    while i < 6 {
        swapped[i] = macs[6 + i];
        swapped[6 + i] = macs[i];
        i += 1;
    }
    if ctx.store(0, &swapped, 0).is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    // SAFETY: a read of our context, then a helper without memory arguments.
    unsafe { bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32 }
}
