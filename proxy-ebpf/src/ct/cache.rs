//! Each CPU's cache of established TCP flows, in front of the
//! connection-tracking table. A segment of a flow this CPU passed recently
//! finds its translation in one slot of a per-CPU array, picked by one
//! multiply over the key's words and checked word by word, instead of the
//! kernel's hash table: the table's lookup (jhash over the 16- or 40-byte
//! key, the bucket walk, `memcmp`) is about a quarter of an existing
//! flow's cost on these machines, more than any other part.
//!
//! The cache must never translate a packet the table would not, nor keep
//! back from the table what the table must see:
//! - every removal or replacement of an entry moves a generation on, after
//!   the write: the data path's, that of the key's slot index
//!   ([`SB_FLOW_SLOT_GEN_V1`], one per index, shared by all CPUs); the
//!   agent's, the table's ([`SB_CT_GEN_V1`]). A slot holds both as read
//!   before the table lookup that filled it, and is void once either
//!   moved. The data path's is per index because a client reusing its
//!   ports replaces a closed flow's entries with every new connection: one
//!   generation for the table would void every CPU's whole cache that often
//!   (`docs/datapath.md`);
//! - only TCP segments without SYN, FIN or RST are answered by it: a SYN or
//!   SYN-ACK opens a flow or finds a stale one, a FIN or RST starts the
//!   close, and UDP re-checks its backend per datagram; all of them take
//!   the table. The table's answer to a SYN-ACK (checked against a stale
//!   flow first) fills the reply's slot, so the server's next segment finds
//!   it;
//! - a segment that would add a state bit to its entry (the client's first
//!   ACK, the first reply) takes the table, which records it;
//! - the entry's last-seen time: a slot stands for the entry only until
//!   that time is due to be refreshed ([`CT_REFRESH_NS`] after it, counted
//!   in kernel ticks: one load, no clock read); then the table refreshes
//!   it, as the table path would, so the agent sees the same times.
//!
//! What the table writes in place (state, flags, times) the cache does not
//! hold, except the state it checks against; the translation (address,
//! port, service) of an entry never changes in place.
use aya_ebpf::helpers::bpf_jiffies64;
use proxy_common::{ct_flags, proto, CtEntryOf, CtKeyOf, CT_REFRESH_NS};

use crate::{
    family::{CacheTicket, Family, Work},
    maps::{FLOW_SLOTS, SB_CT_GEN_V1, SB_FLOW_SLOT_GEN_V1},
    packet::{set, FlowOf, TCP_FLAG_FIN, TCP_FLAG_RST, TCP_FLAG_SYN},
};

/// The index's width: [`FLOW_SLOTS`] is two to this power.
const SLOT_BITS: u32 = FLOW_SLOTS.trailing_zeros();
/// Fibonacci hashing's multiplier (2^32 divided by the golden ratio).
const GOLDEN: u32 = 0x9e37_79b1;
/// The longest kernel tick: Linux on x86-64 and arm64 ticks at least 100
/// times a second (`CONFIG_HZ` 100, 250, 300 or 1000). A slot's time is
/// counted in ticks of this length, so on a faster tick it ends sooner,
/// never later.
const LONGEST_TICK_NS: u64 = 10_000_000;
/// What the working memory's generation holds for a segment the cache
/// does not take, or when the generation's map has no entry (which cannot
/// happen): no slot holds it, and none is filled with it.
pub(crate) const NO_GENERATION: u64 = u64::MAX;

/// Moves the generation of `key`'s slot index on, after the data path
/// removed or replaced the key's entry: that index's slot, on every CPU, is
/// void if it was filled before.
#[inline(always)]
pub(crate) fn invalidate<A: Family>(key: &CtKeyOf<A>) {
    if let Some(gen) = SB_FLOW_SLOT_GEN_V1.get_ptr_mut(index(key)) {
        // SAFETY: a value of an array map, valid for the program run and
        // 8-aligned; one atomic add that does not fetch (`BPF_ATOMIC |
        // BPF_ADD`: nothing needs the old value), so other CPUs' adds are
        // not lost.
        unsafe {
            core::arch::asm!(
                "lock *(u64 *)({at} + 0) += {one}",
                at = in(reg) gen,
                one = in(reg) 1u64,
                options(nostack),
            );
        }
    }
}

/// Whether a segment may be answered by the cache.
#[inline(always)]
fn answerable<A: Family>(flow: &FlowOf<A>) -> bool {
    flow.proto == proto::TCP && flow.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST) == 0
}

/// Whether the table's answer to a segment may fill its slot: the
/// segments the cache answers, and a SYN-ACK (which the table answers, and
/// which the reply path checks against a stale flow first), so the
/// reply's next segment finds its slot filled.
#[inline(always)]
fn fills<A: Family>(flow: &FlowOf<A>) -> bool {
    answerable(flow)
        || flow.accepts_connection() && flow.tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST) == 0
}

/// The key as 32-bit words, for the index and the compare.
#[inline(always)]
fn word<A: Family>(key: &CtKeyOf<A>, i: usize) -> u32 {
    // SAFETY: `i` is below the key's size in words (callers loop to
    // `words`); the key is 4-aligned plain data.
    unsafe { *(key as *const CtKeyOf<A>).cast::<u32>().add(i) }
}

/// How many 32-bit words a family's key has.
#[inline(always)]
const fn words<A: Family>() -> usize {
    core::mem::size_of::<CtKeyOf<A>>() / 4
}

/// The slot a key hashes to: its words folded, one multiply.
#[inline(always)]
fn index<A: Family>(key: &CtKeyOf<A>) -> u32 {
    let mut folded = 0u32;
    for i in 0..words::<A>() {
        folded ^= word(key, i);
    }
    folded.wrapping_mul(GOLDEN) >> (32 - SLOT_BITS)
}

/// The service of the flow direction of `w.key` (already written) if this
/// CPU's cache holds it; then `w.backend` holds the address and port the
/// packet is translated to. Either way `w.ct` holds what [`fill`] takes:
/// the table's generation and the slot index's, read before the table is
/// looked up, and the key's slot.
/// `reply`: the packet goes to the client (the state bit a reply brings).
#[inline(always)]
pub(crate) fn hit<A: Family>(w: &mut Work<A>, reply: bool) -> Option<u32> {
    w.ct.gen = NO_GENERATION;
    if !fills(&w.flow) {
        return None;
    }
    w.ct.slot = index(&w.key);
    let Some(slot_gen) = SB_FLOW_SLOT_GEN_V1.get(w.ct.slot) else {
        // Cannot happen (the index is below the size): nothing is cached.
        return None;
    };
    w.ct.slot_gen = *slot_gen as u32;
    w.ct.gen = SB_CT_GEN_V1.get(0).copied().unwrap_or(NO_GENERATION);
    if !answerable(&w.flow) {
        // A SYN-ACK: the table answers, its answer fills the slot.
        return None;
    }
    let slot = A::flow_cache().get_ptr(w.ct.slot)?;
    // SAFETY: this CPU's slot of a per-CPU array, valid for the program
    // run; only this CPU's programs write it, and not meanwhile.
    let slot = unsafe { &*slot };
    for i in 0..words::<A>() {
        if word(&slot.key, i) != word(&w.key, i) {
            return None;
        }
    }
    let bits = super::state_bits(w.flow.proto, w.flow.tcp_flags, reply);
    // SAFETY: a helper without preconditions (Linux 5.5+); the verifier
    // makes it one load.
    let jiffies = unsafe { bpf_jiffies64() };
    if slot.gen != w.ct.gen
        || slot.slot_gen != w.ct.slot_gen
        || slot.state | bits != slot.state
        || jiffies >= slot.until_jiffies
    {
        return None;
    }
    set(&mut w.backend.addr_be, &slot.nat_addr_be);
    w.backend.port_be = slot.nat_port_be;
    Some(slot.service_id)
}

/// Caches, in the slot [`hit`] found for `key` (`ticket`: that slot, and
/// the generations read before the table lookup), the entry at
/// `entry_ptr`, which the table answered for `key` and which this packet
/// (`flow`) was just noted in at `now_ns`.
/// A closing flow, and an entry whose last-seen time is due to be
/// refreshed, are left to the table.
#[inline(always)]
pub(crate) fn fill<A: Family>(
    key: &CtKeyOf<A>,
    entry_ptr: *const CtEntryOf<A>,
    flow: &FlowOf<A>,
    ticket: CacheTicket,
    now_ns: u64,
) {
    if ticket.gen == NO_GENERATION || !fills(flow) {
        return;
    }
    // SAFETY: a value of the conntrack map, valid for this program run.
    let entry = unsafe { &*entry_ptr };
    if entry.flags & ct_flags::CLOSING != 0 {
        return;
    }
    let due_ns = entry.last_seen_ns.wrapping_add(CT_REFRESH_NS);
    let left_ns = due_ns.wrapping_sub(now_ns);
    if left_ns as i64 <= 0 {
        return;
    }
    let Some(slot) = A::flow_cache().get_ptr_mut(ticket.slot) else {
        return;
    };
    // SAFETY: this CPU's slot of a per-CPU array (as in `hit`); it does
    // not overlap the entry, a value of another map.
    let slot = unsafe { &mut *slot };
    let to = (&mut slot.key as *mut CtKeyOf<A>).cast::<u32>();
    for i in 0..words::<A>() {
        // SAFETY: `i` is below the key's size in words; the slot's key is
        // 4-aligned plain data.
        unsafe { *to.add(i) = word(key, i) };
    }
    set(&mut slot.nat_addr_be, &entry.nat_addr_be);
    slot.nat_port_be = entry.nat_port_be;
    slot.state = entry.state;
    slot.service_id = entry.service_id;
    // SAFETY: as in `hit`.
    slot.until_jiffies = unsafe { bpf_jiffies64() } + left_ns / LONGEST_TICK_NS;
    slot.gen = ticket.gen;
    slot.slot_gen = ticket.slot_gen;
}
