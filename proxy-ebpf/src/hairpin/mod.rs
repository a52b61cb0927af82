//! Hairpin: a pod that reaches its own Service and is given itself as the
//! backend. After DNAT alone the packet would go from the pod to the pod's
//! own address, and the pod's kernel would see a packet from itself (a SYN
//! "from itself" that it answers to itself, over its loopback, bypassing
//! us). So the source is rewritten too, to the family's hairpin address
//! ([`Family::HAIRPIN`]: 169.254.42.1, or `fd53:6221::1` for IPv6; the
//! client port is kept), as kube-proxy's masquerade and Cilium's loopback
//! address do.
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
//! Connection tracking (`ct::track::track` with `Source::Hairpin`) uses
//! the source-NAT encoding of the north-south path
//! ([`ct_flags::SNAT`]): the forward entry names the backend and, as the
//! source the packet gets, `169.254.42.1:p`; the reply entry, keyed
//! `pod:8080 → 169.254.42.1:p`, names the frontend and, as the address the
//! destination is restored to, the pod's `pod:p`. So `ct::track::tracked`
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

use aya_ebpf::{bindings::TC_ACT_SHOT, programs::TcContext};
use proxy_common::{ct_dir, ct_flags, stat};

use crate::{
    ct::track::{copy_entry, forward_entry, stale_reply},
    family::{Family, Work},
    maps::{count, count_service},
    packet::{FlowOf, Skip},
    rewrite::Side,
};

/// Whether the backend in `w.backend`, chosen for `w.flow` from a pod, is
/// that pod itself.
#[inline(always)]
pub fn is_hairpin<A: Family>(w: &Work<A>) -> bool {
    w.backend.addr_be.same(&w.flow.saddr_be)
}

/// A request of a hairpin flow: destination the backend (the pod itself,
/// `w.backend`), source the hairpin address, back into the pod.
#[inline(always)]
pub fn forward<A: Family>(ctx: &TcContext, w: &mut Work<A>, service_id: u32) -> i32 {
    let src = (A::HAIRPIN, w.flow.sport_be);
    let dst = (w.backend.addr_be, w.backend.port_be);
    let action = send_back(ctx, &mut w.flow, src, dst);
    if action != TC_ACT_SHOT {
        let len = u64::from(ctx.len());
        count_service(service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
        count(stat::FORWARDED);
    }
    action
}

/// A packet a pod sends to the hairpin address: the reply of a tracked
/// hairpin flow gets the frontend as its source and the pod as its
/// destination again, and goes back into the pod. Anything else to the
/// hairpin address is not ours (and goes where the node's routing sends it).
#[inline(always)]
pub fn reply<A: Family>(ctx: &TcContext, w: &mut Work<A>) -> Result<i32, Skip> {
    if !w.flow.daddr_be.same(&A::HAIRPIN) {
        return Err(Skip::NotOurs);
    }
    w.flow.ct_key_into(ct_dir::REPLY, &mut w.key);
    let Some(entry_ptr) = crate::ct::entry(&w.key) else {
        return Err(Skip::NotOurs);
    };
    // The reply entry names the frontend (the new source) and the pod's
    // own address and port (the new destination).
    copy_entry(entry_ptr, &mut w.entry);
    let Work {
        flow, key2, entry, ..
    } = w;
    if entry.flags & ct_flags::SNAT == 0 {
        return Err(Skip::NotOurs);
    }
    if stale_reply(flow, entry.flags, &w.key) {
        return Err(Skip::NotOurs);
    }
    crate::ct::note(entry_ptr, flow, true, || {
        // The forward entry: (pod:p → frontend).
        let pod = (&entry.snat_addr_be, entry.snat_port_be);
        forward_entry(flow, pod, (&entry.nat_addr_be, entry.nat_port_be), key2)
    });
    let action = send_back(
        ctx,
        flow,
        (entry.nat_addr_be, entry.nat_port_be),
        (entry.snat_addr_be, entry.snat_port_be),
    );
    if action != TC_ACT_SHOT {
        count(stat::REVERSED);
    }
    Ok(action)
}

/// Rewrites both ends of the packet, swaps the Ethernet addresses and
/// redirects the packet to the egress of the interface it came from, i.e.
/// back into the pod.
#[inline(always)]
fn send_back<A: Family>(
    ctx: &TcContext,
    flow: &mut FlowOf<A>,
    src: (A, u16),
    dst: (A, u16),
) -> i32 {
    if crate::rewrite::rewrite(ctx, flow, Side::Destination, &dst.0, dst.1).is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    (flow.daddr_be, flow.dport_be) = dst;
    if crate::rewrite::rewrite(ctx, flow, Side::Source, &src.0, src.1).is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    crate::skb::send_back_out(ctx)
}
