//! Backend selection for IPv6 frontends on the tc pod path: the same rules
//! as [`crate::lb`] (slot 0, a random slot, `sessionAffinity: ClientIP`,
//! liveness by id and address) over the IPv6 maps. Service and backend ids
//! share one id space with IPv4; a backend id names an entry of exactly one
//! of `SB_BE_V1` and `SB_BE6_V1`. Keys are passed in (scratch memory, see
//! [`crate::packet::v6::Scratch6`]), not built on the stack.
use aya_ebpf::helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns};
use proxy_common::{
    capacity, frontend_flags, scope, stat, Addr6Be, AffinityEntry, AffinityKey6, Backend6,
    FrontendKey6, FrontendSlot,
};

use crate::{
    maps::{count, SB_AFFINITY6_V1, SB_BE6_V1, SB_FE6_V1, SB_MAGLEV_V1},
    packet::v6::eq6,
};

/// Makes `key` the slot-0 key of an IPv6 frontend's internal backend set.
#[inline(always)]
pub fn frontend_key6(key: &mut FrontendKey6, addr_be: &Addr6Be, port_be: u16, proto: u8) {
    key.addr_be = *addr_be;
    key.port_be = port_be;
    key.proto = proto;
    key.scope = scope::INTERNAL;
    key.slot = 0;
    key._pad1 = [0; 2];
}

/// The frontend's slot entry, copied out, if there is one.
#[inline(always)]
pub fn lookup_frontend6(key: &FrontendKey6) -> Option<FrontendSlot> {
    // SAFETY: copied out at once (see `lb::lookup_frontend`).
    unsafe { SB_FE6_V1.get(key) }.copied()
}

/// Whether `backend_id` still names the IPv6 backend at `addr_be:port_be`.
#[inline(always)]
pub fn backend_is_live6(backend_id: u32, addr_be: &Addr6Be, port_be: u16) -> bool {
    // SAFETY: fields are read at once from an RCU-protected value.
    match unsafe { SB_BE6_V1.get(backend_id) } {
        Some(live) => eq6(&live.addr_be, addr_be) && live.port_be == port_be,
        None => false,
    }
}

/// Copies backend `backend_id` into `out`, if it exists.
#[inline(always)]
fn backend6(backend_id: u32, out: &mut Backend6) -> Option<()> {
    // SAFETY: read at once from an RCU-protected value.
    let live = unsafe { SB_BE6_V1.get(backend_id) }?;
    out.addr_be = live.addr_be;
    out.port_be = live.port_be;
    out.proto = live.proto;
    out.flags = live.flags;
    Some(())
}

/// The backend Maglev table entry `hash % MAGLEV_TABLE` of service
/// `service_id` names, written to `out`; the IPv6 twin of
/// [`crate::lb::maglev_backend`]. The table (`SB_MAGLEV_V1`, shared by both
/// families, by service id) holds backend ids; an IPv6 frontend's ids name
/// entries of `SB_BE6_V1`. `None` when the service has no table, or the
/// entry names no IPv6 backend (mid-update): the caller picks at random.
/// Returns the backend id.
#[inline(always)]
pub fn maglev_backend6(service_id: u32, hash: u32, out: &mut Backend6) -> Option<u32> {
    let table = SB_MAGLEV_V1.get_ptr(service_id)?;
    let index = (hash % capacity::MAGLEV_TABLE) as usize;
    // As in `lb::maglev_backend`: hide the known range from LLVM so the
    // bounds check the verifier needs stays.
    // SAFETY: reading a local.
    let index = unsafe { core::ptr::read_volatile(&index) };
    // SAFETY: a value of the map, valid for this program run; `get` checks
    // the index against the array's length.
    let backend_id = *unsafe { (*table).backend_ids.get(index) }?;
    backend6(backend_id, out)?;
    Some(backend_id)
}

/// The backend for a new IPv6 flow from a pod, written to `out`: the
/// client's affinity backend when the frontend has `sessionAffinity:
/// ClientIP` and it is still valid, else one at random (remembered for
/// affinity). `key` is the frontend's slot-0 key; its slot is changed.
/// Returns the backend id.
#[inline(always)]
pub fn choose_backend6(
    key: &mut FrontendKey6,
    svc: &FrontendSlot,
    affinity_key: &AffinityKey6,
    out: &mut Backend6,
) -> Option<u32> {
    if svc.flags & frontend_flags::AFFINITY_CLIENT_IP == 0 {
        return pick_backend6(key, svc, out).map(|(id, _)| id);
    }
    // SAFETY: a helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let (id, slot) = match affinity_backend6(key, svc, affinity_key, now, out) {
        Some(found) => {
            count(stat::AFFINITY_HIT);
            found
        }
        None => pick_backend6(key, svc, out)?,
    };
    let entry = AffinityEntry {
        backend_id: id,
        slot,
        _pad: [0; 2],
        last_used_ns: now,
    };
    // LRU: an insert evicts rather than fails; a failure only costs affinity.
    if SB_AFFINITY6_V1.insert(affinity_key, entry, 0).is_err() {
        count(stat::CT_INSERT_FAILED);
    }
    Some(id)
}

/// The client's remembered backend, if it has not timed out and its slot
/// still names it.
#[inline(always)]
fn affinity_backend6(
    key: &mut FrontendKey6,
    svc: &FrontendSlot,
    affinity_key: &AffinityKey6,
    now: u64,
    out: &mut Backend6,
) -> Option<(u32, u16)> {
    // SAFETY: the fields are copied out at once.
    let entry = unsafe { SB_AFFINITY6_V1.get(affinity_key) }?;
    let (backend_id, slot, last_used_ns) = (entry.backend_id, entry.slot, entry.last_used_ns);
    let timeout_ns = u64::from(svc.affinity_timeout_s) * 1_000_000_000;
    if now.wrapping_sub(last_used_ns) > timeout_ns || slot == 0 || slot > svc.backend_count {
        return None;
    }
    key.slot = slot;
    if lookup_frontend6(key)?.backend_id != backend_id {
        return None;
    }
    backend6(backend_id, out)?;
    Some((backend_id, slot))
}

/// Picks a backend at random among the frontend's slots `1..=backend_count`.
#[inline(always)]
fn pick_backend6(
    key: &mut FrontendKey6,
    svc: &FrontendSlot,
    out: &mut Backend6,
) -> Option<(u32, u16)> {
    let count = u32::from(svc.backend_count).min(u32::from(capacity::MAX_BACKENDS_PER_SERVICE));
    if count == 0 {
        return None;
    }
    // SAFETY: a helper without preconditions.
    let random = unsafe { bpf_get_prandom_u32() };
    key.slot = (random % count) as u16 + 1;
    let backend_id = lookup_frontend6(key)?.backend_id;
    backend6(backend_id, out)?;
    Some((backend_id, key.slot))
}
