//! The ring of a family's recent new flows (`proxy_common::new_flows`), which
//! all CPUs share: where the next new flow is written, and which one is
//! examined next when a full connection-tracking table needs room
//! ([`crate::ct::make_room`]).
use proxy_common::{KeyPair, NewFlowsOf};

/// The slot of `ring` the chosen cursor names (masked), the cursor moved on.
/// An examining cursor the writing one lapped restarts at the oldest flow
/// still remembered.
///
/// # Safety
/// `ring` is the value of an array map, valid for the program run. Other
/// CPUs may write it meanwhile (see `proxy_common::new_flows`).
#[inline(always)]
pub(crate) unsafe fn slot_of<K, const N: usize>(
    ring: *mut NewFlowsOf<K, N>,
    evict: bool,
) -> Option<*mut KeyPair<K>> {
    // SAFETY: the caller's guarantee; a racing cursor write loses or repeats
    // a slot, which the ring tolerates; `get_mut` bounds the masked index.
    unsafe {
        let index = if evict {
            let next = (*ring).next;
            let mut at = (*ring).evict;
            let waiting = next.wrapping_sub(at);
            if waiting == 0 {
                return None;
            }
            if waiting > N as u32 {
                at = next.wrapping_sub(N as u32);
            }
            (*ring).evict = at.wrapping_add(1);
            at
        } else {
            let at = (*ring).next;
            (*ring).next = at.wrapping_add(1);
            at
        };
        (*ring)
            .pairs
            .get_mut(index as usize & (N - 1))
            .map(|pair| pair as *mut KeyPair<K>)
    }
}
