//! The per-node schedulers ([`proxy_common::frontend_flags::PICK_MASK`]):
//! round-robin over a service's slots, and least-connection by the open
//! flows of each backend, with the atomic operations they need.
//!
//! The BPF target's Rust has no atomic read-modify-write types, and for
//! the object's CPU version (`generic`, v1) LLVM refuses to use the value
//! an atomic add returns. The kernel has the fetching forms (BPF_FETCH,
//! Linux 5.12+) whatever the object's version, so they are written as one
//! instruction of inline assembly each.
use core::arch::asm;

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_get_prandom_u32};
use proxy_common::{ct_flags, stat};

use crate::maps::{count, SB_LC_SOCK_V1, SB_LC_V1, SB_RR_V1};

use super::SlotKey;

/// `EEXIST`: a `BPF_NOEXIST` insert found the key there.
const EEXIST: i32 = 17;

/// An atomic read-modify-write of the `u64` at `at` with `value`, returning
/// what it held: one `BPF_ATOMIC | BPF_FETCH` instruction (inline assembly:
/// LLVM refuses the value of an atomic for BPF CPU v1).
macro_rules! atomic_fetch {
    ($(#[$doc:meta])* $name:ident, $insn:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `at` points into a map value valid for this program run, 8-aligned.
        #[inline(always)]
        pub(crate) unsafe fn $name(at: *mut u64, value: u64) -> u64 {
            let mut old = value;
            // SAFETY: the caller's guarantee; one fetching atomic instruction.
            unsafe {
                asm!(
                    concat!("{old} = ", $insn, "((u64 *)({at} + 0), {old})"),
                    at = in(reg) at,
                    old = inout(reg) old,
                    options(nostack),
                );
            }
            old
        }
    };
}

atomic_fetch!(
    /// Adds `value` to the `u64` at `at` atomically, returning what it held.
    fetch_add,
    "atomic_fetch_add"
);
atomic_fetch!(
    /// ANDs `value` into the `u64` at `at` atomically, returning what it held.
    fetch_and,
    "atomic_fetch_and"
);

/// The next turn of service `service_id`'s round-robin cursor, in
/// `0..count` (`count > 0`): each new flow on any CPU of the node gets the
/// next one. None when the service id is outside the cursor array.
#[inline(always)]
pub fn round_robin(service_id: u32, count: u32) -> Option<u32> {
    let cursor = SB_RR_V1.get_ptr_mut(service_id)?;
    // SAFETY: an array value, 8-aligned, valid for the program run.
    let turn = unsafe { fetch_add(cursor, 1) };
    Some((turn % u64::from(count)) as u32)
}

/// A count read as the data path may see it for a moment: a decrement
/// that found nothing to take (see [`flow_closed`]) undoes itself, and
/// meanwhile the value reads as none.
#[inline(always)]
fn open_flows(backend_id: u32) -> u64 {
    // SAFETY: copied out at once.
    match unsafe { SB_LC_V1.get(backend_id) } {
        Some(&n) if n <= i64::MAX as u64 => n,
        _ => 0,
    }
}

/// Two slots at random (distinct when there are two), the less loaded
/// one's slot `1..=count` (the first on a tie). Load is open flows ÷ the
/// slot's share in a weighted set ([`proxy_common::frontend_flags::WEIGHTED`]:
/// a backend of weight 3 carries three times the flows of one of weight 1
/// before it counts as busier), compared by cross-multiplying; an
/// unweighted slot's share is 0 and counts as 1. A weighted
/// least-connection set holds each backend in one slot, so the two are
/// drawn uniformly and the weight acts only here.
#[inline(always)]
pub fn least_conn<F: SlotKey>(mut key: F, count: u32) -> Option<u16> {
    // SAFETY: a helper without preconditions.
    let random = unsafe { bpf_get_prandom_u32() };
    let first = (random & 0xffff) % count;
    let mut second = (random >> 16) % count;
    if second == first {
        second = (first + 1) % count;
    }
    let (first, second) = (first as u16 + 1, second as u16 + 1);
    key.set_slot(first);
    let first_slot = key.lookup()?;
    key.set_slot(second);
    let Some(second_slot) = key.lookup() else {
        return Some(first);
    };
    let share = |slot: &proxy_common::FrontendSlot| u64::from(slot.backend_count.max(1));
    // Below 2^32 flows, so the products fit.
    let flows =
        |slot: &proxy_common::FrontendSlot| open_flows(slot.backend_id).min(u64::from(u32::MAX));
    // second / share(second) < first / share(first), without division.
    if flows(&second_slot) * share(&first_slot) < flows(&first_slot) * share(&second_slot) {
        return Some(second);
    }
    Some(first)
}

/// A counted flow to `backend_id` opened.
#[inline(always)]
pub fn flow_opened(backend_id: u32) {
    let counter = match SB_LC_V1.get_ptr_mut(backend_id) {
        Some(counter) => counter,
        None => {
            // The backend's first counted flow: make its entry, unless
            // another CPU just did (then its entry, and its count, stay).
            match SB_LC_V1.insert(backend_id, 0, u64::from(BPF_NOEXIST)) {
                Err(errno) if errno != -EEXIST => count(stat::CT_INSERT_FAILED),
                _ => {}
            }
            let Some(counter) = SB_LC_V1.get_ptr_mut(backend_id) else {
                return;
            };
            counter
        }
    };
    // SAFETY: a hash value, 8-aligned, valid for the program run (it may
    // have been removed meanwhile; the add then lands in freed-later memory
    // the map still owns until the RCU grace period).
    unsafe { fetch_add(counter, 1) };
}

/// A counted flow to `backend_id` ended. The count never stays below
/// zero: a decrement that found none (the count was rebuilt, or the flow
/// was counted by an earlier map) is undone.
#[inline(always)]
pub fn flow_closed(backend_id: u32) {
    let Some(counter) = SB_LC_V1.get_ptr_mut(backend_id) else {
        return;
    };
    // SAFETY: as in `flow_opened`.
    unsafe {
        let before = fetch_add(counter, u64::MAX);
        if before == 0 || before > i64::MAX as u64 {
            fetch_add(counter, 1);
        }
    }
}

/// A socket (`cookie`) connected to `backend_id` of a least-connection
/// frontend: counted like a flow until [`socket_closed`]. A socket that
/// connects again leaves its earlier backend first.
#[inline(always)]
pub fn socket_opened(cookie: u64, backend_id: u32) {
    socket_closed(cookie);
    flow_opened(backend_id);
    if SB_LC_SOCK_V1.insert(cookie, backend_id, 0).is_err() {
        // Not remembered, so never taken off: not counted either.
        flow_closed(backend_id);
        count(stat::CT_INSERT_FAILED);
    }
}

/// A socket closes (or connects again): if it counts on a backend, it is
/// taken off. Only the call that removes its entry takes it off.
#[inline(always)]
pub fn socket_closed(cookie: u64) {
    // SAFETY: copied out at once.
    let Some(backend_id) = (unsafe { SB_LC_SOCK_V1.get(cookie) }).copied() else {
        return;
    };
    if SB_LC_SOCK_V1.remove(cookie).is_ok() {
        flow_closed(backend_id);
    }
}

/// Clears [`ct_flags::COUNTED`] in the flags byte `flags_offset` bytes
/// into a conntrack entry with one atomic AND on the aligned 8-byte word
/// that holds it; whether this call cleared it (then the caller takes the
/// flow off the count). The offset is a constant, so the word's offset and
/// the bit are too (the verifier allows no arithmetic on the pointer's
/// bits).
///
/// # Safety
/// `entry` is a conntrack map value (8-aligned, valid for the program run)
/// and `flags_offset` its flags byte's offset; the aligned word around it
/// lies inside the value.
#[inline(always)]
pub unsafe fn take_counted(entry: *mut u8, flags_offset: usize) -> bool {
    // SAFETY: the caller's guarantee; a plain read first, so flows that
    // were never counted (every flow of the other algorithms) pay no
    // atomic.
    unsafe {
        if *entry.add(flags_offset) & ct_flags::COUNTED == 0 {
            return false;
        }
        let word = entry.add(flags_offset & !7).cast::<u64>();
        let bit = u64::from(ct_flags::COUNTED) << ((flags_offset & 7) * 8);
        fetch_and(word, !bit) & bit != 0
    }
}
