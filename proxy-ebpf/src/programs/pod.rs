//! The tc layer: DNAT of packets a pod sends to a frontend, and the reverse of
//! it on the replies, with connection tracking in between.
//!
//! Per packet of an existing flow this is one frontend lookup and one
//! connection-tracking lookup in `sb_from_pod`, then a tail call into
//! `sb_rewrite`, which stores the address, the port and the IPv4 checksum
//! directly and makes at most two L4 checksum helper calls (the kernel must do
//! those: only it knows whether the skb carries a full checksum or a partial
//! one to be finished by the device, `CHECKSUM_PARTIAL`). A reply is one
//! lookup: its connection-tracking entry carries the frontend address. Should
//! the tail call fail, the programs rewrite with helper stores themselves.
//!
//! IPv6 is told apart by its ethertype before the IPv4 parser runs and
//! handed to its own programs ([`super::pod6`]); the IPv4 path pays one
//! compare for it.
use crate::ct::track::track;
use crate::ct::track::tracked_backend;
use crate::packet::ctx::parse_ipv4;
use crate::rewrite::count_rewritten;
use crate::rewrite::hand_over;
use crate::rewrite::rewrite_with_helpers;
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
use proxy_common::{ct_dir, ct_flags, stat, tail, AffinityKey, CtKey};
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
    let fe_key = frontend_key(flow.daddr_be, flow.dport_be, flow.proto);
    let Some(svc) = lookup_frontend(&fe_key) else {
        // A pod's reply to a hairpin flow goes to the hairpin address.
        return crate::hairpin::reply(ctx, &flow);
    };
    if !source_allowed4(&svc, flow.saddr_be) {
        count_denied(svc.service_id);
        return Ok(TC_ACT_SHOT);
    }
    if svc.backend_count == 0 {
        count_service(svc.service_id, |s| s.drops_no_backend += 1);
        return Ok(crate::reject::from_pod(ctx, &flow, &svc));
    }

    let ct_key = flow.ct_key(ct_dir::FORWARD);
    let backend = match tracked_backend(&ct_key, &flow, svc.service_id) {
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
            let outcome = if crate::hairpin::is_hairpin(&flow, &backend) {
                crate::hairpin::track(&ct_key, &flow, id, &backend, svc.service_id)
            } else {
                track(&ct_key, &flow, id, &backend, svc.service_id)
            };
            if outcome.is_err() {
                // The table is full: the client retransmits.
                return drop_counted(stat::CT_FULL);
            }
            backend
        }
    };
    if crate::hairpin::is_hairpin(&flow, &backend) {
        return crate::hairpin::forward(ctx, &flow, &backend, svc.service_id);
    }

    let todo = Rewrite {
        side: Side::Destination,
        new_addr_be: backend.addr_be,
        new_port_be: backend.port_be,
        service_id: svc.service_id,
        l4_off: flow.l4_off,
        proto: flow.proto,
    };
    if flow.first_fragment {
        crate::frag::remember(ctx, &flow, &todo);
    }
    hand_over(ctx, &todo);
    // The tail call did not happen: rewrite here, with helpers.
    if rewrite_with_helpers(ctx, &flow, &todo).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count_rewritten(ctx, todo.side, todo.service_id);
    Ok(TC_ACT_OK)
}

/// A packet going into a pod: a reply of a tracked flow gets the frontend as
/// its source again.
#[inline(always)]
pub fn try_to_pod(ctx: &TcContext) -> Result<i32, Skip> {
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
    if flow.first_fragment {
        crate::frag::remember(ctx, &flow, &todo);
    }
    hand_over(ctx, &todo);
    // The tail call did not happen: rewrite here, with helpers.
    if rewrite_with_helpers(ctx, &flow, &todo).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count_rewritten(ctx, todo.side, todo.service_id);
    Ok(TC_ACT_OK)
}
