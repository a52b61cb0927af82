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
//!
//! A spoofed SYN flood must not lock real clients out, so a full table makes
//! room itself when it can: each CPU remembers its recent new flows
//! (`SB_CT_NEW_V1`, a ring), and a flow that does not fit removes the oldest
//! remembered flow that is not established (TCP without the client's ACK of
//! the SYN-ACK, [`ct_state::ACKED`]; UDP without a reply) and takes its
//! place. An established flow is never removed for a new one.
use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
use proxy_common::{
    ct_flags, ct_state, new_flows, proto, Addr6Be, CtEntry, CtEntry6, CtKey, CtKey6, CtPair, CtPair6,
    CT_REFRESH_NS,
};

use crate::{
    maps::{SB_CT6_NEW_V1, SB_CT6_V1, SB_CT_NEW_V1, SB_CT_V5},
    packet::{Flow, TCP_FLAG_ACK, TCP_FLAG_FIN, TCP_FLAG_RST, TCP_FLAG_SYN},
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
/// whose replies would not be translated. A full table first makes room
/// ([`make_room`]); the flow is remembered as a new one.
#[inline(always)]
pub(crate) fn insert_pair(
    fwd_key: &CtKey,
    fwd: &CtEntry,
    reply_key: &CtKey,
    reply: &CtEntry,
) -> Result<(), NotTracked> {
    let result = match insert_both(fwd_key, fwd, reply_key, reply) {
        Err(NotTracked::Full) if make_room() => insert_both(fwd_key, fwd, reply_key, reply),
        other => other,
    };
    if result.is_ok() {
        remember(fwd_key, reply_key);
    }
    result
}

#[inline(always)]
fn insert_both(fwd_key: &CtKey, fwd: &CtEntry, reply_key: &CtKey, reply: &CtEntry) -> Result<(), NotTracked> {
    insert(fwd_key, fwd, 0)?;
    if let Err(why) = insert(reply_key, reply, 0) {
        // Best effort: should it fail, the agent's collector removes the
        // orphan.
        let _ = SB_CT_V5.remove(fwd_key);
        return Err(why);
    }
    Ok(())
}

/// Remembers a new IPv4 flow in this CPU's ring, over its oldest one.
#[inline(always)]
pub(crate) fn remember(fwd_key: &CtKey, reply_key: &CtKey) {
    let Some(ring) = SB_CT_NEW_V1.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's own value of a per-CPU array, valid for the program
    // run; nothing else runs on this CPU meanwhile. The index is masked into
    // the array.
    unsafe {
        let slot = ((*ring).next & (new_flows::SLOTS - 1)) as usize;
        if let Some(pair) = (*ring).pairs.get_mut(slot) {
            pair.forward = *fwd_key;
            pair.reply = *reply_key;
        }
        (*ring).next = (*ring).next.wrapping_add(1);
    }
}

/// Makes room in a full IPv4 table: examines up to [`new_flows::TRIES`] of
/// this CPU's remembered flows, oldest first, and removes the first that is
/// not established ([`established`]). Whether one was removed. The keys are
/// used where the ring holds them (no copy on the stack).
#[inline(always)]
pub(crate) fn make_room() -> bool {
    let Some(ring) = SB_CT_NEW_V1.get_ptr_mut(0) else {
        return false;
    };
    for _ in 0..new_flows::TRIES {
        // SAFETY: as in `remember`: this CPU's own ring, index masked; the
        // pair stays valid for the program run.
        let pair: &mut CtPair = unsafe {
            let slot = ((*ring).evict & (new_flows::SLOTS - 1)) as usize;
            (*ring).evict = (*ring).evict.wrapping_add(1);
            match (*ring).pairs.get_mut(slot) {
                Some(pair) => pair,
                None => continue,
            }
        };
        let protocol = pair.forward.proto;
        if protocol == 0 {
            continue;
        }
        // SAFETY: values of the conntrack map, read at once.
        let forward = unsafe { SB_CT_V5.get(&pair.forward) }.map(|e| (e.flags, e.state));
        let reply = unsafe { SB_CT_V5.get(&pair.reply) }.map(|e| e.state);
        let evict = match (forward, reply) {
            (Some((flags, state)), Some(reply)) => !established(protocol, flags, state, reply),
            _ => false,
        };
        if evict {
            let _ = SB_CT_V5.remove(&pair.forward);
            let _ = SB_CT_V5.remove(&pair.reply);
        }
        // Examined once: an empty slot from now on.
        pair.forward.proto = 0;
        if evict {
            return true;
        }
    }
    false
}

/// Whether a flow is established, from its forward entry's flags and both
/// entries' state: TCP once the client acknowledged the SYN-ACK (or, for an
/// entry of an agent that did not record it, once answered), UDP once
/// answered. A closing flow counts as established: it was, and a
/// source-NATed one holds its port until the backend forgot it.
#[inline(always)]
pub(crate) fn established(protocol: u8, flags: u8, forward: u8, reply: u8) -> bool {
    if flags & ct_flags::CLOSING != 0 {
        return true;
    }
    if reply & ct_state::REPLIED == 0 {
        return false;
    }
    protocol != proto::TCP || flags & ct_flags::HANDSHAKE == 0 || forward & ct_state::ACKED != 0
}

/// The state bits a packet brings to the entry of its direction.
#[inline(always)]
fn state_bits(protocol: u8, tcp_flags: u8, reply: bool) -> u8 {
    let mut bits = if reply { ct_state::REPLIED } else { 0 };
    if protocol == proto::TCP {
        if tcp_flags & TCP_FLAG_FIN != 0 {
            bits |= ct_state::FIN;
        }
        if tcp_flags & TCP_FLAG_RST != 0 {
            bits |= ct_state::RST;
        }
        if !reply && tcp_flags & (TCP_FLAG_ACK | TCP_FLAG_SYN) == TCP_FLAG_ACK {
            bits |= ct_state::ACKED;
        }
    }
    bits
}

/// Notes a packet of a tracked flow in `entry`, the entry of the packet's
/// direction (`reply`: the reply entry): the state bits it brings
/// ([`ct_state`]), and the time, written at most every [`CT_REFRESH_NS`]
/// unless the state changed. Per packet this is one clock read and, mostly,
/// no write.
#[inline(always)]
pub(crate) fn seen(entry: *mut CtEntry, flow: &Flow, reply: bool) {
    let bits = state_bits(flow.proto, flow.tcp_flags, reply);
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
    let first = match insert6(fwd_key, entry, 0) {
        Err(NotTracked::Full) if make_room6() => insert6(fwd_key, entry, 0),
        other => other,
    };
    first?;
    entry.nat_addr_be = *reply_nat.0;
    entry.nat_port_be = reply_nat.1;
    entry.snat_addr_be = *reply_snat.0;
    entry.snat_port_be = reply_snat.1;
    let second = match insert6(reply_key, entry, 0) {
        Err(NotTracked::Full) if make_room6() => insert6(reply_key, entry, 0),
        other => other,
    };
    if let Err(why) = second {
        // Best effort, as in `insert_pair`.
        let _ = SB_CT6_V1.remove(fwd_key);
        return Err(why);
    }
    remember6(fwd_key, reply_key);
    Ok(())
}

/// [`remember`] for an IPv6 flow.
#[inline(always)]
pub(crate) fn remember6(fwd_key: &CtKey6, reply_key: &CtKey6) {
    let Some(ring) = SB_CT6_NEW_V1.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: as in `remember`: this CPU's own ring, index masked.
    unsafe {
        let slot = ((*ring).next & (new_flows::SLOTS6 - 1)) as usize;
        if let Some(pair) = (*ring).pairs.get_mut(slot) {
            pair.forward = *fwd_key;
            pair.reply = *reply_key;
        }
        (*ring).next = (*ring).next.wrapping_add(1);
    }
}

/// [`make_room`] for the IPv6 table.
#[inline(always)]
pub(crate) fn make_room6() -> bool {
    let Some(ring) = SB_CT6_NEW_V1.get_ptr_mut(0) else {
        return false;
    };
    for _ in 0..new_flows::TRIES {
        // SAFETY: as in `remember`: this CPU's own ring, index masked; the
        // pair stays valid for the program run.
        let pair: &mut CtPair6 = unsafe {
            let slot = ((*ring).evict & (new_flows::SLOTS6 - 1)) as usize;
            (*ring).evict = (*ring).evict.wrapping_add(1);
            match (*ring).pairs.get_mut(slot) {
                Some(pair) => pair,
                None => continue,
            }
        };
        let protocol = pair.forward.proto;
        if protocol == 0 {
            continue;
        }
        // SAFETY: values of the conntrack map, read at once.
        let forward = unsafe { SB_CT6_V1.get(&pair.forward) }.map(|e| (e.flags, e.state));
        let reply = unsafe { SB_CT6_V1.get(&pair.reply) }.map(|e| e.state);
        let evict = match (forward, reply) {
            (Some((flags, state)), Some(reply)) => !established(protocol, flags, state, reply),
            _ => false,
        };
        if evict {
            let _ = SB_CT6_V1.remove(&pair.forward);
            let _ = SB_CT6_V1.remove(&pair.reply);
        }
        pair.forward.proto = 0;
        if evict {
            return true;
        }
    }
    false
}

/// [`seen`] for an IPv6 flow's entry.
#[inline(always)]
pub(crate) fn seen6(entry: *mut CtEntry6, flow: &Flow6, reply: bool) {
    let bits = state_bits(flow.proto, flow.tcp_flags, reply);
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
