//! The tc layer: DNAT of packets a pod sends to a frontend, and the reverse of
//! it on the replies, with connection tracking in between.
//!
//! Per packet:
//! - one a pod sends that is not for a frontend: the parse and one bit of
//!   the frontend bitmap ([`crate::prefilter`]), no hash lookup;
//! - one of an existing flow: the bitmap, one connection-tracking lookup
//!   whose entry carries the backend, then the rewrite
//!   ([`crate::rewrite::store_in_place`]: the address, port and IPv4
//!   checksum stored directly, the L4 checksum through the kernel's helper).
//!   No frontend lookup, no tail call;
//! - a reply: one connection-tracking lookup, whose entry carries the
//!   frontend, then the same rewrite;
//! - anything delivered to a pod without translated flows (a pod whose
//!   connections the socket layer balanced): one array read, no parse.
//!
//! A new flow (a SYN, a first datagram) looks up the frontend, checks its
//! source ranges, picks a backend and tracks both directions.
//!
//! Storing directly makes the verifier start both programs with
//! `bpf_skb_pull_data(skb, 0)`, which copies the headers of an skb whose
//! header is shared. A segment of a local TCP socket is a clone whose header
//! is its own (TCP releases the header of the copy it keeps), so the
//! common case costs one helper call and no copy; measured, that is cheaper
//! than the tail call into a storing program these programs used before
//! (`sb_rewrite`, kept one release for upgrades) and than helper stores.
//!
//! IPv6 is told apart by its ethertype before the IPv4 parser runs and
//! handed to its own programs ([`super::pod6`]); the IPv4 path pays one
//! compare for it.
use crate::ct::track::continued_entry;
use crate::ct::track::track;
use crate::ct::track::tracked_backend;
use crate::packet::ctx::parse_ipv4;
use crate::packet::Flow;
use crate::prefilter::{maybe_frontend4, quiet, unquiet};
use crate::rewrite::count_rewritten;
use crate::rewrite::Rewrite;
use crate::rewrite::Side;
use crate::skb::drop_counted;
use crate::skb::ethertype;
use crate::{
    lb::{choose_backend, frontend_key, lookup_frontend},
    maps::{count, count_denied, count_service, source_allowed4, SB_AFFINITY_V1, SB_CT_V5},
    packet::v6::ETH_P_IPV6_BE,
    packet::{Skip, ETH_P_IP_BE},
};
use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use proxy_common::{ct_dir, ct_flags, stat, tail, AffinityKey, Backend, CtKey};
/// A packet a pod sends: DNAT to a backend if it is for a frontend.
#[inline(always)]
pub fn try_from_pod(ctx: &TcContext) -> Result<i32, Skip> {
    // The family is decided once, here: IPv4 goes on as it always did.
    let ethertype = ethertype(ctx)?;
    if ethertype != ETH_P_IP_BE {
        if ethertype == ETH_P_IPV6_BE {
            return Ok(crate::skb::hand_over6(ctx, tail::FROM_POD6));
        }
        return Err(Skip::NotOurs);
    }
    let flow = match parse_ipv4(ctx) {
        Ok(flow) => flow,
        // Later fragments and ICMP errors of translated flows.
        Err(skip) => return crate::frag::unparsed(ctx, skip, ct_dir::FORWARD),
    };
    if !maybe_frontend4(flow.daddr_be) {
        // A pod's reply to a hairpin flow goes to the hairpin address.
        return crate::hairpin::reply(ctx, &flow);
    }
    let ct_key = flow.ct_key(ct_dir::FORWARD);
    if let Some(entry) = continued_entry(&ct_key, &flow) {
        let backend = Backend {
            addr_be: entry.nat_addr_be,
            port_be: entry.nat_port_be,
            proto: flow.proto,
            flags: 0,
        };
        return Ok(forward(ctx, &flow, &backend, entry.service_id));
    }
    new_flow(ctx, &flow, &ct_key)
}

/// The first packet of a flow to a frontend (or one whose tracked backend
/// cannot go on): the frontend, its source ranges, a backend, both
/// directions tracked.
#[inline(always)]
fn new_flow(ctx: &TcContext, flow: &Flow, ct_key: &CtKey) -> Result<i32, Skip> {
    let fe_key = frontend_key(flow.daddr_be, flow.dport_be, flow.proto);
    let Some(svc) = lookup_frontend(&fe_key) else {
        // A bitmap collision, or the hairpin address itself.
        return crate::hairpin::reply(ctx, flow);
    };
    if !source_allowed4(&svc, flow.saddr_be) {
        count_denied(svc.service_id);
        return Ok(TC_ACT_SHOT);
    }
    if svc.backend_count == 0 {
        count_service(svc.service_id, |s| s.drops_no_backend += 1);
        return Ok(crate::reject::from_pod(ctx, flow, &svc));
    }
    let backend = match tracked_backend(ct_key, flow, svc.service_id) {
        Some(backend) => backend,
        None => {
            let affinity_key = AffinityKey {
                client_addr_be: flow.saddr_be,
                service_id: svc.service_id,
            };
            let Some((id, backend)) = choose_backend(fe_key, &svc, &SB_AFFINITY_V1, &affinity_key)
            else {
                return drop_counted(stat::DROP_INCONSISTENT);
            };
            let outcome = if crate::hairpin::is_hairpin(flow, &backend) {
                crate::hairpin::track(ct_key, flow, id, &backend, svc.service_id)
            } else {
                track(ct_key, flow, id, &backend, svc.service_id)
            };
            if outcome.is_err() {
                // The table is full: the client retransmits.
                return drop_counted(stat::CT_FULL);
            }
            // Replies of this flow will come to this pod's interface. After
            // the insert: an agent that marks the interface meanwhile then
            // finds the flow in the table.
            unquiet(ctx);
            backend
        }
    };
    Ok(forward(ctx, flow, &backend, svc.service_id))
}

/// A packet of a tracked flow to its backend: DNAT, or the hairpin's
/// rewrite of both addresses.
#[inline(always)]
fn forward(ctx: &TcContext, flow: &Flow, backend: &Backend, service_id: u32) -> i32 {
    if crate::hairpin::is_hairpin(flow, backend) {
        return match crate::hairpin::forward(ctx, flow, backend, service_id) {
            Ok(action) => action,
            Err(skip) => crate::skb::pass(skip),
        };
    }
    let todo = Rewrite {
        side: Side::Destination,
        new_addr_be: backend.addr_be,
        new_port_be: backend.port_be,
        service_id,
        l4_off: flow.l4_off,
        proto: flow.proto,
    };
    rewrite(ctx, flow, &todo)
}

/// Writes a decided rewrite (remembered first for the later fragments of a
/// first fragment) and counts it; a failed rewrite drops the packet.
#[inline(always)]
fn rewrite(ctx: &TcContext, flow: &Flow, todo: &Rewrite) -> i32 {
    if flow.first_fragment {
        crate::frag::remember(ctx, flow, todo);
    }
    if crate::rewrite::store_in_place(ctx, todo).is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    count_rewritten(ctx, todo.side, todo.service_id);
    TC_ACT_OK
}

/// A packet going into a pod: a reply of a tracked flow gets the frontend as
/// its source again.
#[inline(always)]
pub fn try_to_pod(ctx: &TcContext) -> Result<i32, Skip> {
    // A pod without translated flows receives no reply of one, of either
    // family: its connections were balanced by the socket layer, or it
    // made none through a Service.
    if quiet(ctx) {
        return Err(Skip::NotOurs);
    }
    // The family is decided once, here: IPv4 goes on as it always did.
    let ethertype = ethertype(ctx)?;
    if ethertype != ETH_P_IP_BE {
        if ethertype == ETH_P_IPV6_BE {
            return Ok(crate::skb::hand_over6(ctx, tail::TO_POD6));
        }
        return Err(Skip::NotOurs);
    }
    let flow = match parse_ipv4(ctx) {
        Ok(flow) => flow,
        // Later fragments and ICMP errors of translated flows.
        Err(skip) => return crate::frag::unparsed(ctx, skip, ct_dir::REPLY),
    };
    let key = flow.ct_key(ct_dir::REPLY);
    let Some(entry_ptr) = SB_CT_V5.get_ptr_mut(key) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; copied out.
    let entry = unsafe { *entry_ptr };
    let (nat_addr_be, nat_port_be) = (entry.nat_addr_be, entry.nat_port_be);
    if flow.accepts_connection() && entry.flags & ct_flags::CLOSING != 0 {
        // The flow this entry was made for has closed and its ports were
        // reused by a connection that did not go through the frontend.
        if SB_CT_V5.remove(key).is_ok() {
            count(stat::CT_STALE);
        }
        return Err(Skip::NotOurs);
    }
    crate::ct::note(entry_ptr, &flow, true, || {
        let forward = CtKey {
            saddr_be: flow.daddr_be,
            daddr_be: nat_addr_be,
            sport_be: flow.dport_be,
            dport_be: nat_port_be,
            proto: flow.proto,
            dir: ct_dir::FORWARD,
            _pad: [0; 2],
        };
        SB_CT_V5.get_ptr_mut(forward)
    });
    let todo = Rewrite {
        side: Side::Source,
        new_addr_be: nat_addr_be,
        new_port_be: nat_port_be,
        service_id: entry.service_id,
        l4_off: flow.l4_off,
        proto: flow.proto,
    };
    Ok(rewrite(ctx, &flow, &todo))
}
