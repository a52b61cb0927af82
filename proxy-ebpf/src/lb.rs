//! Backend selection shared by the tc and the socket layers: the frontend's
//! slot 0, a random slot, session affinity, and whether a backend is live.
use aya_ebpf::{
    btf_maps::LruHashMap,
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
};
use proxy_common::{capacity, frontend_flags, scope, stat, AffinityEntry, Backend, FrontendSlot, FrontendKey};

use crate::maps::{count, AFFINITY_ENTRIES, SB_BE_V1, SB_FE_V1, SB_MAGLEV_V1};

/// The slot-0 key of a frontend's internal backend set.
#[inline(always)]
pub fn frontend_key(addr_be: u32, port_be: u16, proto: u8) -> FrontendKey {
    FrontendKey {
        addr_be,
        port_be,
        proto,
        scope: scope::INTERNAL,
        slot: 0,
        _pad1: [0; 2],
    }
}

/// The frontend's slot-0 entry, copied out (the agent may rewrite it while we
/// run), if the address is a frontend.
#[inline(always)]
pub fn lookup_frontend(key: &FrontendKey) -> Option<FrontendSlot> {
    // SAFETY: the value is copied out at once; a concurrent update by the agent
    // can at worst give a value from before or after it, never freed memory
    // (hash map values live until the RCU grace period ends).
    unsafe { SB_FE_V1.get(key) }.copied()
}

/// Whether `backend_id` still names the backend at `addr_be:port_be` (it has
/// not left every service, and its id was not reused for another address).
#[inline(always)]
pub fn backend_is_live(backend_id: u32, addr_be: u32, port_be: u16) -> bool {
    // SAFETY: fields are read at once from an RCU-protected value.
    match unsafe { SB_BE_V1.get(&backend_id) } {
        Some(live) => live.addr_be == addr_be && live.port_be == port_be,
        None => false,
    }
}

/// The backend for a new flow: the client's affinity backend when the
/// frontend has `sessionAffinity: ClientIP` and it is still valid, else one
/// picked at random (and remembered for affinity). `affinity` and its key say
/// who "the client" is: a client address (tc) or a network namespace (sockets).
#[inline(always)]
pub fn choose_backend<K>(
    key: FrontendKey,
    svc: &FrontendSlot,
    affinity: &LruHashMap<K, AffinityEntry, AFFINITY_ENTRIES>,
    affinity_key: &K,
) -> Option<(u32, Backend)> {
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
    if affinity.insert(affinity_key, &entry, 0).is_err() {
        count(stat::CT_INSERT_FAILED);
    }
    Some((id, backend))
}

/// The backend entry `hash` selects in the frontend's Maglev table, if it
/// has one and the entry names a backend.
#[inline(always)]
pub fn maglev_backend(service_id: u32, hash: u32) -> Option<(u32, Backend)> {
    let table = SB_MAGLEV_V1.get_ptr(&service_id)?;
    let index = (hash % capacity::MAGLEV_TABLE) as usize;
    // LLVM knows the remainder is in range and would drop the bounds check
    // the verifier needs; a volatile read hides what it knows.
    // SAFETY: reading a local.
    let index = unsafe { core::ptr::read_volatile(&index) };
    // SAFETY: a value of the map, valid for this program run; `get` checks
    // the index against the array's length.
    let backend_id = *unsafe { (*table).backend_ids.get(index) }?;
    // SAFETY: copied out at once.
    let backend = unsafe { SB_BE_V1.get(&backend_id) }.copied()?;
    Some((backend_id, backend))
}

/// The client's remembered backend, if it has not timed out and its slot
/// still names it (a backend that left the service is never reused).
#[inline(always)]
fn affinity_backend<K>(
    mut key: FrontendKey,
    svc: &FrontendSlot,
    affinity: &LruHashMap<K, AffinityEntry, AFFINITY_ENTRIES>,
    affinity_key: &K,
    now: u64,
) -> Option<(u32, Backend, u16)> {
    // SAFETY: the fields are copied out at once.
    let entry = unsafe { affinity.get(affinity_key) }?;
    let (backend_id, slot, last_used_ns) = (entry.backend_id, entry.slot, entry.last_used_ns);
    let timeout_ns = u64::from(svc.affinity_timeout_s) * 1_000_000_000;
    if now.wrapping_sub(last_used_ns) > timeout_ns || slot == 0 || slot > svc.backend_count {
        return None;
    }
    key.slot = slot;
    if lookup_frontend(&key)?.backend_id != backend_id {
        return None;
    }
    // SAFETY: copied out at once.
    let backend = unsafe { SB_BE_V1.get(&backend_id) }.copied()?;
    Some((backend_id, backend, slot))
}

/// Picks a backend at random among the frontend's slots `1..=backend_count`.
#[inline(always)]
fn pick_backend(mut key: FrontendKey, svc: &FrontendSlot) -> Option<(u32, Backend, u16)> {
    let count = u32::from(svc.backend_count).min(u32::from(capacity::MAX_BACKENDS_PER_SERVICE));
    if count == 0 {
        return None;
    }
    // SAFETY: a helper without preconditions.
    let random = unsafe { bpf_get_prandom_u32() };
    key.slot = (random % count) as u16 + 1;
    let backend_id = lookup_frontend(&key)?.backend_id;
    // SAFETY: copied out at once.
    let backend = unsafe { SB_BE_V1.get(&backend_id) }.copied()?;
    Some((backend_id, backend, key.slot))
}
