//! Connection tracking of an IPv6 flow (keys and entries in the per-CPU
//! scratch, [`Scratch6`]), the rules of [`super::track`].
use crate::{
    ct::track::TableFull,
    lb::backend_is_live,
    maps::{count, SB_CT6_V1},
    packet::v6::Scratch6,
};
use proxy_common::{ct_dir, ct_flags, stat};
/// Whether the flow of `s.key` (forward) is tracked and keeps its backend,
/// as [`crate::ct::track::tracked_backend`] decides it for IPv4 (same service, not
/// a SYN on a closed flow, a live backend for new connections and UDP);
/// then `s.backend` holds it.
#[inline(always)]
pub(crate) fn tracked_backend6(s: &mut Scratch6, service_id: u32) -> bool {
    let Some(entry_ptr) = SB_CT6_V1.get_ptr_mut(s.key) else {
        return false;
    };
    // SAFETY: a value of the conntrack map, valid for this program run; the
    // fields are copied out.
    let (entry_service, flags, backend_id) = unsafe {
        s.backend.addr_be = (*entry_ptr).nat_addr_be;
        s.backend.port_be = (*entry_ptr).nat_port_be;
        (
            (*entry_ptr).service_id,
            (*entry_ptr).flags,
            (*entry_ptr).backend_id,
        )
    };
    let flow = &s.flow;
    if entry_service != service_id {
        return false;
    }
    if flow.opens_connection() && flags & ct_flags::CLOSING != 0 {
        return false;
    }
    crate::ct::note(entry_ptr, flow, false, || {
        let k = &mut s.key2;
        if flags & ct_flags::SNAT != 0 {
            // SAFETY: as above; copied out.
            unsafe {
                k.daddr_be = (*entry_ptr).snat_addr_be;
                k.dport_be = (*entry_ptr).snat_port_be;
            }
        } else {
            k.daddr_be = flow.saddr_be;
            k.dport_be = flow.sport_be;
        }
        k.saddr_be = s.backend.addr_be;
        k.sport_be = s.backend.port_be;
        k.proto = flow.proto;
        k.dir = ct_dir::REPLY;
        k._pad = [0; 2];
        SB_CT6_V1.get_ptr_mut(s.key2)
    });
    if !flow.needs_live_backend()
        || backend_is_live(backend_id, s.backend.addr_be, s.backend.port_be)
    {
        return true;
    }
    count(stat::CT_RESELECTED);
    false
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
