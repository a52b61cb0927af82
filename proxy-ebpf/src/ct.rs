//! Connection-tracking writes shared by the tc and XDP programs: a new
//! flow's two entries (both or neither), and what each packet of a tracked
//! flow notes in the entry of its direction.
//!
//! The table (`SB_CT_V5`) is a preallocated hash, not an LRU: a live flow is
//! never evicted to make room, and the agent removes expired flows (see
//! `proxy-user/src/conntrack.rs`). When it is full a new flow cannot be
//! tracked; its packet is dropped and counted (`stat::CT_FULL`), as Cilium
//! does, and the client's retransmission gets through once the agent made
//! room. Packets of tracked flows are not affected.
use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
use proxy_common::{ct_flags, ct_state, proto, Addr6Be, CtEntry, CtEntry6, CtKey, CtKey6, CT_REFRESH_NS};

use crate::{
    maps::{SB_CT6_V1, SB_CT_V5},
    packet::{Flow, TCP_FLAG_FIN, TCP_FLAG_RST},
    packet6::Flow6,
};

/// `E2BIG`: what a preallocated hash map's update returns when it has no
/// free element left.
const E2BIG: i32 = 7;

/// Why a new flow's entry was not written.
pub(crate) enum NotTracked {
    /// The table is full: the packet is dropped (`stat::CT_FULL`).
    Full,
    /// Another failure (`stat::CT_INSERT_FAILED`): the packet goes on.
    Failed,
}

/// CLOCK_MONOTONIC, which the agent reads too, at the kernel tick's
/// resolution (`bpf_ktime_get_coarse_ns`: no clock-source read, cheaper per
/// packet; it lags CLOCK_MONOTONIC by at most a tick, 1-10 ms, which no
/// timeout of seconds notices).
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: a helper without preconditions (Linux 5.11+).
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// Writes one entry (`flags`: `BPF_ANY`, `BPF_NOEXIST`).
#[inline(always)]
pub(crate) fn insert(key: &CtKey, entry: &CtEntry, flags: u64) -> Result<(), NotTracked> {
    match SB_CT_V5.insert(key, entry, flags) {
        Ok(()) => Ok(()),
        Err(errno) if errno == -E2BIG => Err(NotTracked::Full),
        Err(_) => Err(NotTracked::Failed),
    }
}

/// Writes both entries of a new flow, or neither: a forward entry whose
/// reply entry did not fit is removed again, so the table holds no flow
/// whose replies would not be translated.
#[inline(always)]
pub(crate) fn insert_pair(
    fwd_key: &CtKey,
    fwd: &CtEntry,
    reply_key: &CtKey,
    reply: &CtEntry,
) -> Result<(), NotTracked> {
    insert(fwd_key, fwd, 0)?;
    if let Err(why) = insert(reply_key, reply, 0) {
        // Best effort: should it fail, the agent's collector removes the
        // orphan.
        let _ = SB_CT_V5.remove(fwd_key);
        return Err(why);
    }
    Ok(())
}

/// Notes a packet of a tracked flow in `entry`, the entry of the packet's
/// direction (`reply`: the reply entry): the state bits it brings
/// ([`ct_state`]), and the time, written at most every [`CT_REFRESH_NS`]
/// unless the state changed. Per packet this is one clock read and, mostly,
/// no write.
#[inline(always)]
pub(crate) fn seen(entry: *mut CtEntry, flow: &Flow, reply: bool) {
    let mut bits = if reply { ct_state::REPLIED } else { 0 };
    if flow.proto == proto::TCP {
        if flow.tcp_flags & TCP_FLAG_FIN != 0 {
            bits |= ct_state::FIN;
        }
        if flow.tcp_flags & TCP_FLAG_RST != 0 {
            bits |= ct_state::RST;
        }
    }
    let now = now_ns();
    // SAFETY: a value pointer the map lookup just returned, valid for this
    // program run. Only packets of this entry's direction write its state
    // byte (and they only add bits); a racing time stamp is as good as ours.
    unsafe {
        let state = (*entry).state;
        if state | bits != state {
            (*entry).state = state | bits;
            (*entry).last_seen_ns = now;
        } else if now.wrapping_sub((*entry).last_seen_ns) >= CT_REFRESH_NS {
            (*entry).last_seen_ns = now;
        }
    }
}

// ---- IPv6: the same writes on `SB_CT6_V1` ----

/// [`insert`] for an IPv6 flow.
#[inline(always)]
pub(crate) fn insert6(key: &CtKey6, entry: &CtEntry6, flags: u64) -> Result<(), NotTracked> {
    match SB_CT6_V1.insert(key, entry, flags) {
        Ok(()) => Ok(()),
        Err(errno) if errno == -E2BIG => Err(NotTracked::Full),
        Err(_) => Err(NotTracked::Failed),
    }
}

/// [`insert_pair`] for an IPv6 flow. The reply entry is the forward one with
/// `reply_nat` (address, port) in place of the backend and `reply_snat` in
/// place of the source NAT: one entry on the stack, not two.
#[inline(always)]
pub(crate) fn insert_pair6(
    fwd_key: &CtKey6,
    reply_key: &CtKey6,
    entry: &mut CtEntry6,
    reply_nat: (&Addr6Be, u16),
    reply_snat: (&Addr6Be, u16),
) -> Result<(), NotTracked> {
    insert6(fwd_key, entry, 0)?;
    entry.nat_addr_be = *reply_nat.0;
    entry.nat_port_be = reply_nat.1;
    entry.snat_addr_be = *reply_snat.0;
    entry.snat_port_be = reply_snat.1;
    if let Err(why) = insert6(reply_key, entry, 0) {
        // Best effort, as in `insert_pair`.
        let _ = SB_CT6_V1.remove(fwd_key);
        return Err(why);
    }
    Ok(())
}

/// [`seen`] for an IPv6 flow's entry.
#[inline(always)]
pub(crate) fn seen6(entry: *mut CtEntry6, flow: &Flow6, reply: bool) {
    let mut bits = if reply { ct_state::REPLIED } else { 0 };
    if flow.proto == proto::TCP {
        if flow.tcp_flags & TCP_FLAG_FIN != 0 {
            bits |= ct_state::FIN;
        }
        if flow.tcp_flags & TCP_FLAG_RST != 0 {
            bits |= ct_state::RST;
        }
    }
    let now = now_ns();
    // SAFETY: as in `seen`: a value pointer the lookup just returned; only
    // this direction's packets add state bits.
    unsafe {
        let state = (*entry).state;
        if state | bits != state {
            (*entry).state = state | bits;
            (*entry).last_seen_ns = now;
        } else if now.wrapping_sub((*entry).last_seen_ns) >= CT_REFRESH_NS {
            (*entry).last_seen_ns = now;
        }
    }
}

/// [`crate::tc::mark_closing`] for an IPv6 entry.
#[inline(always)]
pub(crate) fn mark_closing6(entry: *mut CtEntry6) {
    // SAFETY: as in `tc::mark_closing`.
    unsafe {
        if (*entry).flags & ct_flags::CLOSING == 0 {
            (*entry).flags |= ct_flags::CLOSING;
            (*entry).created_ns = now_ns();
        }
    }
}
