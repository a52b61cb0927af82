//! Backend selection shared by the tc and the socket layers: the frontend's
//! slot 0, a random slot, session affinity, and whether a backend is live.
//!
//! Generic over the address family: an address type ([`FamilyAddr`]: `u32`
//! for IPv4, [`Addr6Be`] for IPv6) names its frontend key and backend maps, and
//! every function is monomorphised and inlined, so the IPv4 path compiles to
//! what it did before IPv6 existed. The socket layer and the tc and XDP
//! programs of both families use the same functions.

pub mod sched;

use aya_ebpf::{
    btf_maps::LruHashMap,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
};
use proxy_common::{
    capacity, frontend_flags, scope, stat, Addr6Be, AffinityEntry, Backend, Backend6, BackendOf,
    FrontendKey, FrontendKey6, FrontendSlot,
};

use crate::maps::{
    count, AFFINITY_ENTRIES, SB_BE6_V1, SB_BE_V1, SB_FE6_V1, SB_FE_V1, SB_MAGLEV_V1,
};

/// A frontend key of one family: its slot can be set and it can be looked up
/// in that family's frontend map; its backends live in that family's backend
/// map.
pub trait SlotKey: Copy {
    /// The family's address type.
    type Addr: Copy;
    fn slot(&self) -> u16;
    fn set_slot(&mut self, slot: u16);
    /// Moves the key to the backend set of `scope` ([`proxy_common::scope`]).
    fn set_scope(&mut self, scope: u8);
    /// A backend's address and port.
    fn backend_addr(backend: &BackendOf<Self::Addr>) -> (Self::Addr, u16);
    /// The frontend map's entry for this key, copied out.
    fn lookup(&self) -> Option<FrontendSlot>;
    /// The backend map's entry for `backend_id`, copied out.
    fn backend(backend_id: u32) -> Option<BackendOf<Self::Addr>>;
}

/// An address of one family, in map form.
pub trait FamilyAddr: Copy + PartialEq {
    type Key: SlotKey<Addr = Self>;
    /// The slot-0 key of the internal backend set of `self:port_be/proto`.
    fn frontend_key(self, port_be: u16, proto: u8) -> Self::Key;
    /// The address and port of backend `backend_id`, if it exists.
    fn backend_at(backend_id: u32) -> Option<(Self, u16)>;
}

impl SlotKey for FrontendKey {
    type Addr = u32;
    #[inline(always)]
    fn slot(&self) -> u16 {
        self.slot
    }
    #[inline(always)]
    fn set_slot(&mut self, slot: u16) {
        self.slot = slot;
    }
    #[inline(always)]
    fn set_scope(&mut self, scope: u8) {
        self.scope = scope;
    }
    #[inline(always)]
    fn backend_addr(backend: &Backend) -> (u32, u16) {
        (backend.addr_be, backend.port_be)
    }
    #[inline(always)]
    fn lookup(&self) -> Option<FrontendSlot> {
        // SAFETY: the value is copied out at once; a concurrent update by the
        // agent can at worst give a value from before or after it, never freed
        // memory (hash map values live until the RCU grace period ends).
        unsafe { SB_FE_V1.get(self) }.copied()
    }
    #[inline(always)]
    fn backend(backend_id: u32) -> Option<Backend> {
        // SAFETY: copied out at once (as in `lookup`).
        unsafe { SB_BE_V1.get(backend_id) }.copied()
    }
}

impl SlotKey for FrontendKey6 {
    type Addr = Addr6Be;
    #[inline(always)]
    fn slot(&self) -> u16 {
        self.slot
    }
    #[inline(always)]
    fn set_slot(&mut self, slot: u16) {
        self.slot = slot;
    }
    #[inline(always)]
    fn set_scope(&mut self, scope: u8) {
        self.scope = scope;
    }
    #[inline(always)]
    fn backend_addr(backend: &Backend6) -> (Addr6Be, u16) {
        (backend.addr_be, backend.port_be)
    }
    #[inline(always)]
    fn lookup(&self) -> Option<FrontendSlot> {
        // SAFETY: as for `FrontendKey`.
        unsafe { SB_FE6_V1.get(self) }.copied()
    }
    #[inline(always)]
    fn backend(backend_id: u32) -> Option<Backend6> {
        // SAFETY: as for `FrontendKey`.
        unsafe { SB_BE6_V1.get(backend_id) }.copied()
    }
}

impl FamilyAddr for u32 {
    type Key = FrontendKey;
    #[inline(always)]
    fn frontend_key(self, port_be: u16, proto: u8) -> FrontendKey {
        FrontendKey {
            addr_be: self,
            port_be,
            proto,
            scope: scope::INTERNAL,
            slot: 0,
            _pad1: [0; 2],
        }
    }
    #[inline(always)]
    fn backend_at(backend_id: u32) -> Option<(u32, u16)> {
        // SAFETY: fields are read at once from an RCU-protected value.
        unsafe { SB_BE_V1.get(backend_id) }.map(|b| (b.addr_be, b.port_be))
    }
}

impl FamilyAddr for Addr6Be {
    type Key = FrontendKey6;
    #[inline(always)]
    fn frontend_key(self, port_be: u16, proto: u8) -> FrontendKey6 {
        FrontendKey6 {
            addr_be: self,
            port_be,
            proto,
            scope: scope::INTERNAL,
            slot: 0,
            _pad1: [0; 2],
        }
    }
    #[inline(always)]
    fn backend_at(backend_id: u32) -> Option<(Addr6Be, u16)> {
        // SAFETY: fields are read at once from an RCU-protected value.
        unsafe { SB_BE6_V1.get(backend_id) }.map(|b| (b.addr_be, b.port_be))
    }
}

/// The slot-0 key of a frontend's internal backend set.
#[inline(always)]
pub fn frontend_key<A: FamilyAddr>(addr_be: A, port_be: u16, proto: u8) -> A::Key {
    addr_be.frontend_key(port_be, proto)
}

/// The frontend's slot-0 entry, copied out (the agent may rewrite it while we
/// run), if the address is a frontend.
#[inline(always)]
pub fn lookup_frontend<K: SlotKey>(key: &K) -> Option<FrontendSlot> {
    key.lookup()
}

/// Whether `backend_id` still names the backend at `addr_be:port_be` (it has
/// not left every service, and its id was not reused for another address).
#[inline(always)]
pub fn backend_is_live<A: FamilyAddr>(backend_id: u32, addr_be: A, port_be: u16) -> bool {
    match A::backend_at(backend_id) {
        Some((addr, port)) => addr == addr_be && port == port_be,
        None => false,
    }
}

/// The backend for a new flow: the client's affinity backend when the
/// frontend has `sessionAffinity: ClientIP` and it is still valid, else one
/// picked at random (and remembered for affinity). `affinity` and its key say
/// who "the client" is: a client address (tc) or a network namespace (sockets).
#[inline(always)]
pub fn choose_backend<F: SlotKey, K>(
    key: F,
    svc: &FrontendSlot,
    affinity: &LruHashMap<K, AffinityEntry, AFFINITY_ENTRIES>,
    affinity_key: &K,
) -> Option<(u32, BackendOf<F::Addr>)> {
    if svc.flags & frontend_flags::AFFINITY_CLIENT_IP == 0 {
        return pick_backend(key, svc).map(|(id, backend, _)| (id, backend));
    }
    // SAFETY: a helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let (id, backend, slot) = match affinity_backend(key, svc, affinity, affinity_key, now) {
        Some(found) => {
            count(stat::AFFINITY_HIT);
            found
        }
        None => pick_backend(key, svc)?,
    };
    let entry = AffinityEntry {
        backend_id: id,
        slot,
        _pad: [0; 2],
        last_used_ns: now,
    };
    // LRU: an insert evicts rather than fails; a failure only costs affinity.
    if affinity.insert(affinity_key, entry, 0).is_err() {
        count(stat::CT_INSERT_FAILED);
    }
    Some((id, backend))
}

/// The backend entry `hash` selects in the frontend's Maglev table, if it
/// has one and the entry names a backend of the key's family. The table
/// (`SB_MAGLEV_V1`, by service id) is shared by both families; an IPv6
/// frontend's ids name entries of `SB_BE6_V1`, so an id that names no backend
/// of the family (mid-update) gives `None` and the caller picks at random.
#[inline(always)]
pub fn maglev_backend<F: SlotKey>(service_id: u32, hash: u32) -> Option<(u32, BackendOf<F::Addr>)> {
    let table = SB_MAGLEV_V1.get_ptr(service_id)?;
    let index = (hash % capacity::MAGLEV_TABLE) as usize;
    // LLVM knows the remainder is in range and would drop the bounds check
    // the verifier needs; a volatile read hides what it knows.
    // SAFETY: reading a local.
    let index = unsafe { core::ptr::read_volatile(&index) };
    // SAFETY: a value of the map, valid for this program run; `get` checks
    // the index against the array's length.
    let backend_id = *unsafe { (*table).backend_ids.get(index) }?;
    let backend = F::backend(backend_id)?;
    Some((backend_id, backend))
}

/// The client's remembered backend, if it has not timed out and its slot
/// still names it (a backend that left the service is never reused).
#[inline(always)]
fn affinity_backend<F: SlotKey, K>(
    mut key: F,
    svc: &FrontendSlot,
    affinity: &LruHashMap<K, AffinityEntry, AFFINITY_ENTRIES>,
    affinity_key: &K,
    now: u64,
) -> Option<(u32, BackendOf<F::Addr>, u16)> {
    // SAFETY: the fields are copied out at once.
    let entry = unsafe { affinity.get(affinity_key) }?;
    let (backend_id, slot, last_used_ns) = (entry.backend_id, entry.slot, entry.last_used_ns);
    let timeout_ns = u64::from(svc.affinity_timeout_s) * 1_000_000_000;
    if now.wrapping_sub(last_used_ns) > timeout_ns || slot == 0 || slot > svc.backend_count {
        return None;
    }
    key.set_slot(slot);
    if key.lookup()?.backend_id != backend_id {
        return None;
    }
    let backend = F::backend(backend_id)?;
    Some((backend_id, backend, slot))
}

/// Picks a backend among the frontend's slots `1..=backend_count`: at
/// random, or by the frontend's per-node scheduler ([`sched`]).
#[inline(always)]
fn pick_backend<F: SlotKey>(
    mut key: F,
    svc: &FrontendSlot,
) -> Option<(u32, BackendOf<F::Addr>, u16)> {
    let count = u32::from(svc.backend_count).min(u32::from(capacity::MAX_BACKENDS_PER_SERVICE));
    if count == 0 {
        return None;
    }
    let slot = match svc.flags & frontend_flags::PICK_MASK {
        frontend_flags::PICK_ROUND_ROBIN => match sched::round_robin(svc.service_id, count) {
            Some(turn) => turn as u16 + 1,
            None => random_slot(count),
        },
        frontend_flags::PICK_LEAST_CONN => sched::least_conn(key, count)?,
        _ => random_slot(count),
    };
    key.set_slot(slot);
    let backend_id = key.lookup()?.backend_id;
    let backend = F::backend(backend_id)?;
    Some((backend_id, backend, key.slot()))
}

/// A slot in `1..=count` at random (`count > 0`).
#[inline(always)]
fn random_slot(count: u32) -> u16 {
    // SAFETY: a helper without preconditions.
    let random = unsafe { bpf_get_prandom_u32() };
    (random % count) as u16 + 1
}

/// Whether the flows of frontend `svc` count among their backends' open
/// flows ([`proxy_common::ct_flags::COUNTED`]).
#[inline(always)]
pub fn counts_flows(svc: &FrontendSlot) -> bool {
    svc.flags & frontend_flags::PICK_MASK == frontend_flags::PICK_LEAST_CONN
}
