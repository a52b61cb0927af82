//! Connection tracking of an IPv6 flow (keys and entries in the per-CPU
//! scratch, [`Scratch6`]), the rules of [`super::track`].
use crate::{
    ct::track::TableFull,
    lb::backend_is_live,
    maps::{count, SB_CT6_V1},
    packet::v6::{Flow6, Scratch6},
};
use proxy_common::{ct_dir, ct_flags, stat, Backend6, CtEntry6, CtKey6};
/// The forward entry of `s.key`, its backend copied to `s.backend` and the
/// fields the callers decide on copied out.
struct Tracked6 {
    entry_ptr: *mut CtEntry6,
    service_id: u32,
    flags: u8,
    backend_id: u32,
}

#[inline(always)]
fn lookup6(s: &mut Scratch6) -> Option<Tracked6> {
    let entry_ptr = SB_CT6_V1.get_ptr_mut(s.key)?;
    // SAFETY: a value of the conntrack map, valid for this program run; the
    // fields are copied out.
    unsafe {
        s.backend.addr_be = (*entry_ptr).nat_addr_be;
        s.backend.port_be = (*entry_ptr).nat_port_be;
        Some(Tracked6 {
            entry_ptr,
            service_id: (*entry_ptr).service_id,
            flags: (*entry_ptr).flags,
            backend_id: (*entry_ptr).backend_id,
        })
    }
}

/// Whether the flow of `s.key` (forward) is tracked and keeps its backend,
/// as [`crate::ct::track::tracked_backend`] decides it for IPv4 (same service, not
/// a SYN on a closed flow, a live backend for new connections and UDP);
/// then `s.backend` holds it.
#[inline(always)]
pub(crate) fn tracked_backend6(s: &mut Scratch6, service_id: u32) -> bool {
    let Some(Tracked6 {
        entry_ptr,
        service_id: entry_service,
        flags,
        backend_id,
    }) = lookup6(s)
    else {
        return false;
    };
    let flow = &s.flow;
    if entry_service != service_id {
        return false;
    }
    if flow.opens_connection() && flags & ct_flags::CLOSING != 0 {
        return false;
    }
    crate::ct::note(entry_ptr, flow, false, || {
        reply_entry6(&mut s.key2, flow, &s.backend, entry_ptr, flags)
    });
    if !flow.needs_live_backend()
        || backend_is_live(backend_id, s.backend.addr_be, s.backend.port_be)
    {
        return true;
    }
    count(stat::CT_RESELECTED);
    false
}

/// The reply entry of the tracked flow of `flow` whose forward entry is
/// `entry_ptr` and backend `backend` (its key built in `key`): replies of a
/// source-NATed flow come back to the address and port its source became.
#[inline(always)]
fn reply_entry6(
    key: &mut CtKey6,
    flow: &Flow6,
    backend: &Backend6,
    entry_ptr: *mut CtEntry6,
    flags: u8,
) -> Option<*mut CtEntry6> {
    if flags & ct_flags::SNAT != 0 {
        // SAFETY: a value of the conntrack map, valid for this program run;
        // copied out.
        unsafe {
            key.daddr_be = (*entry_ptr).snat_addr_be;
            key.dport_be = (*entry_ptr).snat_port_be;
        }
    } else {
        key.daddr_be = flow.saddr_be;
        key.dport_be = flow.sport_be;
    }
    key.saddr_be = backend.addr_be;
    key.sport_be = backend.port_be;
    key.proto = flow.proto;
    key.dir = ct_dir::REPLY;
    key._pad = [0; 2];
    SB_CT6_V1.get_ptr_mut(*key)
}

/// [`crate::ct::track::continued_entry`] for IPv6: the packet of `s.key`
/// (forward) continues a tracked flow, found with one lookup and no
/// frontend. Then `s.backend` holds its backend, and its service id is
/// returned.
#[inline(always)]
pub(crate) fn continued_entry6(s: &mut Scratch6) -> Option<u32> {
    if s.flow.opens_connection() {
        return None;
    }
    let Tracked6 {
        entry_ptr,
        service_id,
        flags,
        backend_id,
    } = lookup6(s)?;
    if s.flow.needs_live_backend()
        && !backend_is_live(backend_id, s.backend.addr_be, s.backend.port_be)
    {
        return None;
    }
    let flow = &s.flow;
    crate::ct::note(entry_ptr, flow, false, || {
        reply_entry6(&mut s.key2, flow, &s.backend, entry_ptr, flags)
    });
    Some(service_id)
}

/// Records both directions of a new IPv6 flow (`s.key` forward, the backend
/// in `s.backend`), as [`crate::ct::track::track`].
#[inline(always)]
pub(crate) fn track6(s: &mut Scratch6, backend_id: u32, service_id: u32) -> Result<(), TableFull> {
    let now = crate::ct::now_ns();
    let e = &mut s.entry;
    e.backend_id = backend_id;
    e.service_id = service_id;
    e.nat_addr_be = s.backend.addr_be;
    e.nat_port_be = s.backend.port_be;
    e.flags = ct_flags::HANDSHAKE;
    e.state = 0;
    e.snat_addr_be = [0; 4];
    e.snat_port_be = 0;
    e._pad2 = [0; 2];
    e.created_ns = now;
    e.last_seen_ns = now;
    let k = &mut s.key2;
    k.saddr_be = s.backend.addr_be;
    k.daddr_be = s.flow.saddr_be;
    k.sport_be = s.backend.port_be;
    k.dport_be = s.flow.sport_be;
    k.proto = s.flow.proto;
    k.dir = ct_dir::REPLY;
    k._pad = [0; 2];
    crate::ct::track::tracked(
        crate::ct::insert_pair6(
            &s.key,
            &s.key2,
            &mut s.entry,
            (&s.flow.daddr_be, s.flow.dport_be),
            (&[0; 4], 0),
        ),
        service_id,
    )
}
