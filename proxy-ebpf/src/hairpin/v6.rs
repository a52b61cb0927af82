//! Hairpin for IPv6, as [`crate::hairpin`] for IPv4: a pod given itself as
//! the backend of an IPv6 frontend is reached from [`hairpin::ADDR6_BE`]
//! (`fd53:6221::1`, the client port kept), both directions handled in
//! `sb_from_pod` and redirected straight back into the pod:
//! - request `pod:p → VIP:80` becomes `fd53:6221::1:p → pod:8080`;
//! - the answer `pod:8080 → fd53:6221::1:p` leaves the pod by its default
//!   route, the same veth, and becomes `VIP:80 → pod:p`.
//!
//! Connection tracking uses the source-NAT encoding, as for IPv4. The same
//! limits apply (two hairpin flows from one source port through two Services
//! sharing a backend port collide; later fragments are not translated).
use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};
use proxy_common::{ct_dir, ct_flags, hairpin, stat, Addr6Be};

use crate::{
    ct::track::tracked,
    ct::track::TableFull,
    maps::{count, count_service, SB_CT6_V1},
    packet::v6::{eq6, Flow6, Scratch6},
    packet::Skip,
    rewrite::v6::rewrite6,
    rewrite::Side,
};

/// Whether the backend chosen for `flow` from a pod is that pod itself.
#[inline(always)]
pub fn is_hairpin(flow: &Flow6, backend_addr_be: &Addr6Be) -> bool {
    eq6(backend_addr_be, &flow.saddr_be)
}

/// Records both directions of a new hairpin flow (`s.key` forward, the pod
/// in `s.backend`).
#[inline(always)]
pub fn track(s: &mut Scratch6, backend_id: u32, service_id: u32) -> Result<(), TableFull> {
    let now = crate::ct::now_ns();
    let e = &mut s.entry;
    e.backend_id = backend_id;
    e.service_id = service_id;
    e.nat_addr_be = s.backend.addr_be;
    e.nat_port_be = s.backend.port_be;
    e.flags = ct_flags::SNAT | ct_flags::HANDSHAKE;
    e.state = 0;
    e.snat_addr_be = hairpin::ADDR6_BE;
    e.snat_port_be = s.flow.sport_be;
    e._pad2 = [0; 2];
    e.created_ns = now;
    e.last_seen_ns = now;
    let k = &mut s.key2;
    k.saddr_be = s.backend.addr_be;
    k.daddr_be = hairpin::ADDR6_BE;
    k.sport_be = s.backend.port_be;
    k.dport_be = s.flow.sport_be;
    k.proto = s.flow.proto;
    k.dir = ct_dir::REPLY;
    k._pad = [0; 2];
    tracked(
        crate::ct::insert_pair6(
            &s.key,
            &s.key2,
            &mut s.entry,
            (&s.flow.daddr_be, s.flow.dport_be),
            (&s.flow.saddr_be, s.flow.sport_be),
        ),
        service_id,
    )
}

/// A request of a hairpin flow: destination the pod itself (`s.backend`),
/// source the hairpin address, back into the pod.
#[inline(always)]
pub fn forward(ctx: &TcContext, s: &mut Scratch6, service_id: u32) -> Result<i32, Skip> {
    // The source: the hairpin address, the client's port.
    s.entry.snat_addr_be = hairpin::ADDR6_BE;
    s.entry.snat_port_be = s.flow.sport_be;
    let action = send_back(ctx, s);
    if action != TC_ACT_SHOT {
        let len = u64::from(ctx.len());
        count_service(service_id, |st| {
            st.packets += 1;
            st.bytes += len;
        });
        count(stat::FORWARDED);
    }
    Ok(action)
}

/// A packet a pod sends to the hairpin address: the reply of a tracked
/// hairpin flow goes back into the pod from the frontend. Anything else is
/// not ours.
#[inline(always)]
pub fn reply(ctx: &TcContext, s: &mut Scratch6) -> Result<i32, Skip> {
    if !eq6(&s.flow.daddr_be, &hairpin::ADDR6_BE) {
        return Err(Skip::NotOurs);
    }
    s.flow.ct_key_into(ct_dir::REPLY, &mut s.key);
    let Some(entry_ptr) = SB_CT6_V1.get_ptr_mut(s.key) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the conntrack map, valid for this program run;
    // copied out into scratch memory. The reply entry names the frontend
    // (the new source) and the pod's own address and port (the new
    // destination).
    let flags = unsafe {
        s.entry.snat_addr_be = (*entry_ptr).nat_addr_be;
        s.entry.snat_port_be = (*entry_ptr).nat_port_be;
        s.backend.addr_be = (*entry_ptr).snat_addr_be;
        s.backend.port_be = (*entry_ptr).snat_port_be;
        (*entry_ptr).flags
    };
    if flags & ct_flags::SNAT == 0 {
        return Err(Skip::NotOurs);
    }
    let flow = &s.flow;
    if flow.accepts_connection() && flags & ct_flags::CLOSING != 0 {
        if SB_CT6_V1.remove(s.key).is_ok() {
            count(stat::CT_STALE);
        }
        return Err(Skip::NotOurs);
    }
    crate::ct::note(entry_ptr, flow, true, || {
        // The forward entry: (pod:p → frontend).
        let k = &mut s.key2;
        k.saddr_be = s.backend.addr_be;
        k.daddr_be = s.entry.snat_addr_be;
        k.sport_be = s.backend.port_be;
        k.dport_be = s.entry.snat_port_be;
        k.proto = flow.proto;
        k.dir = ct_dir::FORWARD;
        k._pad = [0; 2];
        SB_CT6_V1.get_ptr_mut(s.key2)
    });
    let action = send_back(ctx, s);
    if action != TC_ACT_SHOT {
        count(stat::REVERSED);
    }
    Ok(action)
}

/// Rewrites both ends of the packet (destination `s.backend`, source
/// `s.entry.snat_*`), swaps the Ethernet addresses and redirects it to the
/// egress of the interface it came from (into the pod).
#[inline(always)]
fn send_back(ctx: &TcContext, s: &mut Scratch6) -> i32 {
    if rewrite6(
        ctx,
        &s.flow,
        Side::Destination,
        &s.backend.addr_be,
        s.backend.port_be,
    )
    .is_err()
    {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    s.flow.daddr_be = s.backend.addr_be;
    s.flow.dport_be = s.backend.port_be;
    if rewrite6(
        ctx,
        &s.flow,
        Side::Source,
        &s.entry.snat_addr_be,
        s.entry.snat_port_be,
    )
    .is_err()
    {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    crate::skb::send_back_out(ctx)
}
