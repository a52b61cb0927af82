//! Hairpin: a pod that reaches its own Service and is given itself as the
//! backend. After DNAT alone the packet would go from the pod to the pod's
//! own address, and the pod's kernel would see a packet from itself (a SYN
//! "from itself" that it answers to itself, over its loopback, bypassing
//! us). So the source is rewritten too, to [`hairpin::ADDR_BE`]
//! (169.254.42.1; the client port is kept), as kube-proxy's masquerade and
//! Cilium's loopback address do.
//!
//! Both directions are handled in `sb_from_pod` on the pod's veth and sent
//! straight back into the same pod (`bpf_redirect` to the veth's egress,
//! Ethernet addresses swapped), never through the node's routing:
//! - request `pod:p → VIP:80` becomes `169.254.42.1:p → pod:8080`;
//! - the pod answers `pod:8080 → 169.254.42.1:p`; 169.254.42.1 is not on the
//!   pod's link, so the answer leaves through the pod's default route, i.e.
//!   the same veth, where `sb_from_pod` sees it first and turns it into
//!   `VIP:80 → pod:p`.
//!
//! Pods need no configuration (only the usual default route via the node),
//! and the node needs no route, neighbour or rp_filter exception for the
//! hairpin address.
//!
//! Connection tracking uses the source-NAT encoding of the north-south path
//! ([`ct_flags::SNAT`]): the forward entry names the backend and, as the
//! source the packet gets, `169.254.42.1:p`; the reply entry, keyed
//! `pod:8080 → 169.254.42.1:p`, names the frontend and, as the address the
//! destination is restored to, the pod's `pod:p`. So `ct::track::tracked_entry`
//! finds the reply entry of a hairpin flow to mark it closing, as for any
//! other source-NATed flow.
//!
//! Limit: the hairpin address stands for every local client, so two hairpin
//! flows of one pod from the same source port to the same backend port
//! (through two Services) would collide; the kernel only reuses a source port
//! towards different destinations, so this needs two Services sharing a
//! backend port and a port reused across them.
//!
//! Limit: a hairpinned first fragment is sent on, but its later fragments are
//! not translated (the fragment path records one-sided DNAT only); a pod
//! reaching itself with UDP datagrams above the MTU loses them.

pub mod v6;

use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};
use proxy_common::{ct_dir, ct_flags, hairpin, stat, Backend, CtEntry, CtKey};

use crate::{
    ct::track::tracked,
    ct::track::TableFull,
    maps::{count, count_service, SB_CT_V5},
    packet::{Flow, Skip},
    rewrite::rewrite_with_helpers,
    rewrite::Rewrite,
    rewrite::Side,
};

/// Whether `backend`, chosen for `flow` from a pod, is that pod itself.
#[inline(always)]
pub fn is_hairpin(flow: &Flow, backend: &Backend) -> bool {
    backend.addr_be == flow.saddr_be
}

/// The reply key of a hairpin flow: the backend (the pod) answering the
/// hairpin address.
#[inline(always)]
fn reply_key(flow: &Flow, backend: &Backend) -> CtKey {
    CtKey {
        saddr_be: backend.addr_be,
        daddr_be: hairpin::ADDR_BE,
        sport_be: backend.port_be,
        dport_be: flow.sport_be,
        proto: flow.proto,
        dir: ct_dir::REPLY,
        _pad: [0; 2],
    }
}

/// Records both directions of a new hairpin flow (see the module's
/// documentation), as [`crate::ct::track::track`] does.
#[inline(always)]
pub fn track(
    fwd: &CtKey,
    flow: &Flow,
    backend_id: u32,
    backend: &Backend,
    service_id: u32,
) -> Result<(), TableFull> {
    let now = crate::ct::now_ns();
    let forward = CtEntry {
        backend_id,
        service_id,
        nat_addr_be: backend.addr_be,
        nat_port_be: backend.port_be,
        flags: ct_flags::SNAT | ct_flags::HANDSHAKE,
        state: 0,
        snat_addr_be: hairpin::ADDR_BE,
        snat_port_be: flow.sport_be,
        _pad2: [0; 2],
        created_ns: now,
        last_seen_ns: now,
    };
    let reply = CtEntry {
        nat_addr_be: flow.daddr_be,
        nat_port_be: flow.dport_be,
        snat_addr_be: flow.saddr_be,
        snat_port_be: flow.sport_be,
        ..forward
    };
    tracked(
        crate::ct::insert_pair(fwd, &forward, &reply_key(flow, backend), &reply),
        service_id,
    )
}

/// A request of a hairpin flow: destination the backend (the pod itself),
/// source the hairpin address, back into the pod.
#[inline(always)]
pub fn forward(
    ctx: &TcContext,
    flow: &Flow,
    backend: &Backend,
    service_id: u32,
) -> Result<i32, Skip> {
    let action = send_back(
        ctx,
        flow,
        (hairpin::ADDR_BE, flow.sport_be),
        (backend.addr_be, backend.port_be),
        service_id,
    );
    if action != TC_ACT_SHOT {
        let len = u64::from(ctx.len());
        count_service(service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
        count(stat::FORWARDED);
    }
    Ok(action)
}

/// A packet a pod sends to the hairpin address: the reply of a tracked
/// hairpin flow gets the frontend as its source and the pod as its
/// destination again, and goes back into the pod. Anything else to the
/// hairpin address is not ours (and goes where the node's routing sends it).
#[inline(always)]
pub fn reply(ctx: &TcContext, flow: &Flow) -> Result<i32, Skip> {
    if flow.daddr_be != hairpin::ADDR_BE {
        return Err(Skip::NotOurs);
    }
    let key = flow.ct_key(ct_dir::REPLY);
    let Some(entry_ptr) = SB_CT_V5.get_ptr_mut(key) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; copied out.
    let entry = unsafe { *entry_ptr };
    if entry.flags & ct_flags::SNAT == 0 {
        return Err(Skip::NotOurs);
    }
    if flow.accepts_connection() && entry.flags & ct_flags::CLOSING != 0 {
        // The flow has closed; nothing of ours answers on these ports now.
        if SB_CT_V5.remove(key).is_ok() {
            count(stat::CT_STALE);
        }
        return Err(Skip::NotOurs);
    }
    crate::ct::note(entry_ptr, flow, true, || {
        let forward = CtKey {
            saddr_be: entry.snat_addr_be,
            daddr_be: entry.nat_addr_be,
            sport_be: entry.snat_port_be,
            dport_be: entry.nat_port_be,
            proto: flow.proto,
            dir: ct_dir::FORWARD,
            _pad: [0; 2],
        };
        SB_CT_V5.get_ptr_mut(forward)
    });
    let action = send_back(
        ctx,
        flow,
        (entry.nat_addr_be, entry.nat_port_be),
        (entry.snat_addr_be, entry.snat_port_be),
        entry.service_id,
    );
    if action != TC_ACT_SHOT {
        count(stat::REVERSED);
    }
    Ok(action)
}

/// Rewrites both ends of the packet (helper stores: `sb_from_pod` never
/// writes packets directly), swaps the Ethernet addresses and redirects the
/// packet to the egress of the interface it came from, i.e. back into the pod.
#[inline(always)]
fn send_back(
    ctx: &TcContext,
    flow: &Flow,
    src: (u32, u16),
    dst: (u32, u16),
    service_id: u32,
) -> i32 {
    let mut todo = Rewrite {
        side: Side::Destination,
        new_addr_be: dst.0,
        new_port_be: dst.1,
        service_id,
        l4_off: flow.l4_off,
        proto: flow.proto,
    };
    if rewrite_with_helpers(ctx, flow, &todo).is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    let mut now = *flow;
    now.daddr_be = dst.0;
    now.dport_be = dst.1;
    todo.side = Side::Source;
    todo.new_addr_be = src.0;
    todo.new_port_be = src.1;
    if rewrite_with_helpers(ctx, &now, &todo).is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    crate::skb::send_back_out(ctx)
}
