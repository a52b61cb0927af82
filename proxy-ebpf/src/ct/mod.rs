//! Connection-tracking writes shared by the tc and XDP programs: a new
//! flow's two entries (both or neither), and what each packet of a tracked
//! flow notes in the entry of its direction.
//!
//! The table (`SB_CT_V5`) is a hash allocated per entry, not an LRU: a
//! live flow is never evicted to make room, and the agent removes expired
//! flows (see `proxy-user/src/dataplane/flows/expiry.rs`). When it is full a new flow cannot be
//! tracked; its packet is dropped and counted (`stat::CT_FULL`), as Cilium
//! does, and the client's retransmission gets through once the agent made
//! room. Packets of tracked flows are not affected.
//!
//! A spoofed SYN flood must not lock real clients out, so a full table makes
//! room itself when it can: the data path remembers its recent new flows
//! (`SB_CT_NEW_V2`, a ring all CPUs share), and a flow that does not fit
//! removes the oldest remembered flow that is not established (TCP without
//! the client's ACK of the SYN-ACK, [`ct_state::ACKED`]; UDP without a
//! reply) and takes its place. An established flow is never removed for a new one.

pub mod cache;
pub mod track;

use aya_ebpf::{
    bindings::BPF_ANY,
    helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns},
};
use proxy_common::{
    ct_flags, ct_state, new_flows, proto, CtEntryOf, CtKeyOf, KeyPair, CT_REFRESH_NS,
};

use crate::{
    family::Family,
    lb::sched,
    maps::SB_CLOCK_V1,
    packet::{FlowOf, Words, TCP_FLAG_ACK, TCP_FLAG_FIN, TCP_FLAG_RST, TCP_FLAG_SYN},
};

/// The entry of `key`, looked up where the key lies (working memory, a map
/// value): the map API copies a key passed by value to the stack first,
/// 16 or 40 bytes more per packet.
#[inline(always)]
pub(crate) fn entry<A: Family>(key: &CtKeyOf<A>) -> Option<*mut CtEntryOf<A>> {
    A::conntrack().get_ptr_mut(key)
}

/// `E2BIG`: what a hash map's update returns when it holds as many entries
/// as it may.
const E2BIG: i32 = 7;

/// Removes the entry of `key`, if present; a removal moves the generation
/// of the key's flow-cache slot on ([`cache`]). Whether it was there.
#[inline(always)]
pub(crate) fn remove<A: Family>(key: &CtKeyOf<A>) -> bool {
    let removed = A::conntrack().remove(key).is_ok();
    if removed {
        cache::invalidate(key);
    }
    removed
}

/// Why a new flow's entry was not written.
pub(crate) enum NotTracked {
    /// The table is full: the packet is dropped (`stat::CT_FULL`).
    Full,
    /// Another failure (`stat::CT_INSERT_FAILED`): the packet goes on.
    Failed,
}

/// CLOCK_MONOTONIC, which the agent reads too, at the kernel tick's
/// resolution (`bpf_ktime_get_coarse_ns`: no clock-source read; it lags
/// CLOCK_MONOTONIC by at most a tick, 1-10 ms, which no timeout of seconds
/// notices). The coarse clock moves only at a tick, so each CPU keeps the
/// value it read with the tick count it was read at (`bpf_jiffies64`, which
/// the verifier turns into one load): within a tick a packet pays no helper
/// call for the time.
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: helpers without preconditions (Linux 5.5+ and 5.11+).
    let jiffies = unsafe { bpf_jiffies64() };
    let Some(clock) = SB_CLOCK_V1.get_ptr_mut(0) else {
        // SAFETY: as above.
        return unsafe { bpf_ktime_get_coarse_ns() };
    };
    // SAFETY: this CPU's slot of a per-CPU array, valid for the program
    // run; nothing else on this CPU writes it meanwhile.
    unsafe {
        if (*clock).jiffies != jiffies {
            let ns = bpf_ktime_get_coarse_ns();
            // The tick count moves a moment before the coarse clock: a
            // value that has not moved yet is used, not kept for the tick.
            if ns != (*clock).ns {
                (*clock).jiffies = jiffies;
            }
            (*clock).ns = ns;
        }
        (*clock).ns
    }
}

/// Writes one entry of either family's table (`flags`: `BPF_ANY`,
/// `BPF_NOEXIST`).
#[inline(always)]
pub(crate) fn insert<E: Entry>(key: &E::Key, entry: &E, flags: u64) -> Result<(), NotTracked> {
    match E::insert(key, entry, flags) {
        Ok(()) => Ok(()),
        Err(errno) if errno == -E2BIG => Err(NotTracked::Full),
        Err(_) => Err(NotTracked::Failed),
    }
}

/// Writes both entries of a new flow, or neither: a forward entry whose
/// reply entry did not fit is removed again, so the table holds no flow
/// whose replies would not be translated. A full table first makes room
/// ([`with_room`]); the flow is remembered as a new one.
///
/// `entry` is the forward entry; the reply entry is the same with
/// `reply_nat` (address, port) in place of the backend and `reply_snat` in
/// place of the source NAT, written over it (one entry in memory, not two:
/// the IPv6 ones live in scratch memory).
#[inline(always)]
pub(crate) fn insert_pair<A: Family>(
    fwd_key: &CtKeyOf<A>,
    reply_key: &CtKeyOf<A>,
    entry: &mut CtEntryOf<A>,
    reply_nat: (A, u16),
    reply_snat: (A, u16),
) -> Result<(), NotTracked> {
    // Counted before the entry exists, so a removal racing the insert
    // never takes off a flow not yet added.
    let counted = entry.flags & ct_flags::COUNTED != 0;
    let backend_id = entry.backend_id;
    if counted {
        sched::flow_opened(backend_id);
    }
    let result = insert_both(fwd_key, reply_key, entry, reply_nat, reply_snat);
    if counted && result.is_err() {
        sched::flow_closed(backend_id);
    }
    result
}

/// [`insert_pair`]'s inserts; the reply entry is never counted.
#[inline(always)]
fn insert_both<A: Family>(
    fwd_key: &CtKeyOf<A>,
    reply_key: &CtKeyOf<A>,
    entry: &mut CtEntryOf<A>,
    reply_nat: (A, u16),
    reply_snat: (A, u16),
) -> Result<(), NotTracked> {
    with_room::<CtKeyOf<A>>(|| insert(fwd_key, entry, 0))?;
    (entry.nat_addr_be, entry.nat_port_be) = reply_nat;
    (entry.snat_addr_be, entry.snat_port_be) = reply_snat;
    entry.flags &= !ct_flags::COUNTED;
    if let Err(why) = with_room::<CtKeyOf<A>>(|| insert(reply_key, entry, 0)) {
        // Best effort: should it fail, the agent's collector removes the
        // orphan (the caller takes the flow off the count).
        remove::<A>(fwd_key);
        return Err(why);
    }
    remember(fwd_key, reply_key);
    Ok(())
}

/// One family's connection-tracking table and the shared memory of its new
/// flows: what [`remember`] and [`make_room`] need, so each is written once
/// for both families.
pub(crate) trait Table: Copy {
    /// The next slot of the ring to write (`evict == false`) or to examine
    /// (`evict == true`; none when every remembered flow was examined), its
    /// cursor moved on. The index is masked into the ring.
    fn take_slot(evict: bool) -> Option<*mut KeyPair<Self>>;
    fn proto(&self) -> u8;
    fn clear(&mut self);
    /// Whether `pair` is one flow's two keys (not a slot read while another
    /// CPU wrote it), both entries are in the table, and the flow is not
    /// established ([`established`]).
    fn evictable(pair: &KeyPair<Self>) -> bool;
    fn remove(&self);
    /// Takes the flow of this (forward) key off its backend's open flows,
    /// if it is counted there ([`Entry::uncount`]).
    fn uncount(&self);
}

/// One family's connection-tracking entry: how it is written to its table,
/// and where the fields are that packets update in place, so [`insert`],
/// [`seen`] and [`mark_closing`] are written once for both families.
pub(crate) trait Entry: Sized {
    type Key: Table;
    /// The table's update, its error as the map returns it.
    fn insert(key: &Self::Key, entry: &Self, flags: u64) -> Result<(), i32>;
    /// The fields packets update: state, flags, last seen, created.
    ///
    /// # Safety
    /// `entry` is a value pointer the table's lookup returned, valid for
    /// this program run.
    unsafe fn fields(entry: *mut Self) -> Fields;
    /// Takes the flow off its backend's open flows if this entry counts it
    /// ([`ct_flags::COUNTED`]), clearing the bit: of several CPUs ending one
    /// flow at once, one takes it off.
    ///
    /// # Safety
    /// As for [`Entry::fields`].
    unsafe fn uncount(entry: *mut Self);
}

/// Pointers to the fields of an entry that packets update in place.
pub(crate) struct Fields {
    state: *mut u8,
    flags: *mut u8,
    last_seen_ns: *mut u64,
    created_ns: *mut u64,
}

impl<A: Family> Entry for CtEntryOf<A> {
    type Key = CtKeyOf<A>;
    /// An entry that may be written over another (`BPF_ANY`: a reused
    /// tuple) moves the generation of the key's flow-cache slot on after
    /// the write, as a removal does: a flow cache may hold the old one
    /// ([`cache`]). Whether there was one is not asked: under a client
    /// reusing its ports nearly every new flow replaces a closed one, and
    /// asking (`BPF_NOEXIST` first, then the write) cost a second update
    /// of the table per entry, where voiding a slot that held nothing of
    /// this key costs an atomic add.
    #[inline(always)]
    fn insert(key: &CtKeyOf<A>, entry: &Self, flags: u64) -> Result<(), i32> {
        let written = A::conntrack().insert(key, entry, flags);
        if flags == u64::from(BPF_ANY) && written.is_ok() {
            cache::invalidate(key);
        }
        written
    }
    #[inline(always)]
    unsafe fn fields(entry: *mut Self) -> Fields {
        // SAFETY: the caller's guarantee: `entry` is valid; only field
        // addresses are taken.
        unsafe {
            Fields {
                state: core::ptr::addr_of_mut!((*entry).state),
                flags: core::ptr::addr_of_mut!((*entry).flags),
                last_seen_ns: core::ptr::addr_of_mut!((*entry).last_seen_ns),
                created_ns: core::ptr::addr_of_mut!((*entry).created_ns),
            }
        }
    }
    #[inline(always)]
    unsafe fn uncount(entry: *mut Self) {
        // SAFETY: the caller's guarantee; the flags byte's 8-byte word lies
        // inside the entry (it starts at the 8-aligned `nat_addr_be` of an
        // IPv4 entry, at `nat_port_be` of an IPv6 one).
        unsafe {
            if sched::take_counted(entry.cast::<u8>(), core::mem::offset_of!(Self, flags)) {
                sched::flow_closed((*entry).backend_id);
            }
        }
    }
}

impl<A: Family> Table for CtKeyOf<A> {
    #[inline(always)]
    fn take_slot(evict: bool) -> Option<*mut KeyPair<Self>> {
        A::take_slot(evict)
    }
    #[inline(always)]
    fn proto(&self) -> u8 {
        self.proto
    }
    #[inline(always)]
    fn clear(&mut self) {
        self.proto = 0;
    }
    #[inline(always)]
    fn evictable(pair: &KeyPair<Self>) -> bool {
        let (fwd_key, reply_key) = (&pair.forward, &pair.reply);
        let table = A::conntrack();
        // SAFETY: values of the conntrack map, read at once.
        let (Some(fwd), Some(reply)) = (unsafe { table.get(fwd_key) }, unsafe {
            table.get(reply_key)
        }) else {
            return false;
        };
        // The reply comes from the backend the forward entry names, to the
        // client or to the address its source became.
        let from_backend =
            reply_key.saddr_be.same(&fwd.nat_addr_be) && reply_key.sport_be == fwd.nat_port_be;
        let to_client = (reply_key.daddr_be.same(&fwd_key.saddr_be)
            && reply_key.dport_be == fwd_key.sport_be)
            || (reply.snat_addr_be.same(&fwd_key.saddr_be)
                && reply.snat_port_be == fwd_key.sport_be);
        from_backend && to_client && !established(fwd_key.proto, fwd.flags, fwd.state, reply.state)
    }
    #[inline(always)]
    fn remove(&self) {
        // Already gone is as good as removed.
        remove::<A>(self);
    }
    #[inline(always)]
    fn uncount(&self) {
        if let Some(entry) = A::conntrack().get_ptr_mut(self) {
            // SAFETY: a value the lookup just returned.
            unsafe { CtEntryOf::<A>::uncount(entry) };
        }
    }
}

/// Remembers a new flow in the ring, over its oldest one.
#[inline(always)]
pub(crate) fn remember<K: Table>(fwd_key: &K, reply_key: &K) {
    if let Some(pair) = K::take_slot(false) {
        // SAFETY: a slot of the ring, valid for the program run; another
        // CPU writing it too is caught by `Table::evictable`. The keys are
        // in working memory or on the stack, never in the ring: the copies
        // do not overlap (a plain assignment would call `memmove`, a byte
        // loop on BPF).
        unsafe {
            core::ptr::copy_nonoverlapping(fwd_key, core::ptr::addr_of_mut!((*pair).forward), 1);
            core::ptr::copy_nonoverlapping(reply_key, core::ptr::addr_of_mut!((*pair).reply), 1);
        }
    }
}

/// Runs `insert`; while the table is full and room can be made
/// ([`make_room`]), runs it again, [`new_flows::ROUNDS`] times at most (the
/// room one removal made may go to another CPU's new flow first).
#[inline(always)]
pub(crate) fn with_room<K: Table>(
    mut insert: impl FnMut() -> Result<(), NotTracked>,
) -> Result<(), NotTracked> {
    let mut result = insert();
    for _ in 0..new_flows::ROUNDS {
        match result {
            Err(NotTracked::Full) if make_room::<K>() => result = insert(),
            _ => break,
        }
    }
    result
}

/// Makes room in a full table: examines up to [`new_flows::TRIES`] of the
/// remembered flows, oldest first, and removes the first that is not
/// established ([`Table::evictable`]). Whether one was removed. The keys are
/// used where the ring holds them (no copy on the stack).
#[inline(always)]
pub(crate) fn make_room<K: Table>() -> bool {
    for _ in 0..new_flows::TRIES {
        let Some(pair) = K::take_slot(true) else {
            return false;
        };
        // SAFETY: a slot of the ring, valid for the program run.
        let pair = unsafe { &mut *pair };
        if pair.forward.proto() == 0 {
            continue;
        }
        let evict = K::evictable(pair);
        if evict {
            pair.forward.uncount();
            pair.reply.remove();
            pair.forward.remove();
        }
        // Examined once: an empty slot from now on.
        pair.forward.clear();
        if evict {
            return true;
        }
    }
    false
}

/// Whether a flow is established, from its forward entry's flags and both
/// entries' state: TCP once the client acknowledged the SYN-ACK (as the
/// kernel's conntrack does, not when the SYN-ACK passed), UDP once
/// answered. A closing flow counts as established: it was, and a
/// source-NATed one holds its port until the backend forgot it.
#[inline(always)]
pub(crate) fn established(protocol: u8, flags: u8, forward: u8, reply: u8) -> bool {
    if flags & ct_flags::CLOSING != 0 {
        return true;
    }
    if flags & ct_flags::DSR_BALANCED != 0 {
        // No reply passes here: the client's ACK of the SYN-ACK shows the
        // backend answered. A UDP flow shows nothing, and may give way.
        return protocol == proto::TCP && forward & ct_state::ACKED != 0;
    }
    if reply & ct_state::REPLIED == 0 {
        return false;
    }
    protocol != proto::TCP || forward & ct_state::ACKED != 0
}

/// The state bits a packet brings to the entry of its direction.
#[inline(always)]
pub(crate) fn state_bits(protocol: u8, tcp_flags: u8, reply: bool) -> u8 {
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
/// no write. The time it read is returned (for the flow cache's slot).
#[inline(always)]
pub(crate) fn seen<E: Entry, A: Words>(entry: *mut E, flow: &FlowOf<A>, reply: bool) -> u64 {
    let bits = state_bits(flow.proto, flow.tcp_flags, reply);
    let now = now_ns();
    // SAFETY: a value pointer the map lookup just returned, valid for this
    // program run. Only packets of this entry's direction write its state
    // byte (and they only add bits); a racing time stamp is as good as ours.
    unsafe {
        let f = E::fields(entry);
        let state = *f.state;
        if state | bits != state {
            *f.state = state | bits;
            *f.last_seen_ns = now;
        } else if now.wrapping_sub(*f.last_seen_ns) >= CT_REFRESH_NS {
            *f.last_seen_ns = now;
        }
    }
    now
}

/// A packet of a tracked flow noted in the entry of its direction
/// ([`seen`]); a FIN or an RST marks that entry and the flow's other one
/// closing, the other looked up (`other`) only then. The time [`seen`]
/// read is returned.
#[inline(always)]
pub(crate) fn note<E: Entry, A: Words>(
    entry: *mut E,
    flow: &FlowOf<A>,
    reply: bool,
    other: impl FnOnce() -> Option<*mut E>,
) -> u64 {
    let now = seen(entry, flow, reply);
    if flow.ends_connection() {
        mark_closing(entry);
        if let Some(other) = other() {
            mark_closing(other);
        }
    }
    now
}

/// Marks a connection-tracking entry of either family as belonging to a
/// closing connection.
#[inline(always)]
pub(crate) fn mark_closing<E: Entry>(entry: *mut E) {
    // SAFETY: a value pointer the map lookup just returned, valid for this
    // program run; the only concurrent writes set the same bit (or the same
    // kind of time stamp, which only dates the close).
    unsafe {
        // The flow leaves its backend's open flows at its first FIN or RST
        // (IPVS counts a closing connection as inactive). Before the plain
        // write of the flags below, which then reads the bit cleared and
        // cannot write it back.
        E::uncount(entry);
        let f = E::fields(entry);
        if *f.flags & ct_flags::CLOSING == 0 {
            *f.flags |= ct_flags::CLOSING;
            *f.created_ns = now_ns();
        }
    }
}
