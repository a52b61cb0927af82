//! Fragmented datagrams from outside, on the uplink's tc programs
//! (`sb_from_uplink`, `sb_from_uplink6`), both families: as on the pod path
//! ([`super`]), but an entry (direction `frag::UPLINK`) may carry a new
//! source too (a flow to a backend on another node, or its reply), and
//! then the later fragments leave the node the way their first one did.
//! The XDP program hands every fragment on to tc.
use aya_ebpf::programs::TcContext;
use proxy_common::{frag, stat};

use super::{record, translation};
use crate::{
    family::Family,
    maps::{count, count_service},
    nodeport::Up,
    packet::{set, Skip},
    skb::drop_counted,
};

/// Remembers what the first fragment `u.s.flow` was rewritten to:
/// `u.to_daddr_be`, and `u.to_saddr_be` when it `leaves` the node.
#[inline(always)]
pub fn remember<A: Family>(u: &mut Up<A>, leaves: bool) {
    set(&mut u.s.backend.addr_be, &u.to_daddr_be);
    u.s.backend.port_be = u.to_ports_be[1];
    let src = if leaves { &u.to_saddr_be } else { &A::ZERO };
    record(&mut u.s, frag::UPLINK, u.service_id, src);
}

/// A later fragment from outside (`u.s.flow`: its addresses, protocol and
/// identification): the addresses its first fragment was given, stored
/// with the IPv4 header checksum, and left in `u.to_saddr_be` and
/// `u.to_daddr_be`. `Ok(true)`: its source changed, so it must leave the
/// node as its first fragment did. `Err`: the packet's verdict now (not
/// ours, or dropped).
#[inline(always)]
pub fn later<A: Family>(ctx: &TcContext, u: &mut Up<A>) -> Result<bool, Result<i32, Skip>> {
    A::frag_key(&u.s.flow, frag::UPLINK, &mut u.s.frag_key);
    let Some(entry) = translation(&u.s) else {
        return Err(Err(Skip::NotOurs));
    };
    // SAFETY: a value of the LRU map, valid for this program run; the
    // fields are copied out at once.
    let service_id = unsafe {
        set(&mut u.to_daddr_be, &(*entry).addr_be);
        set(&mut u.to_saddr_be, &(*entry).src_addr_be);
        (*entry).service_id
    };
    let leaves = !u.to_saddr_be.same(&A::ZERO);
    let flow = &u.s.flow;
    let stored = A::store_addr(ctx, A::DADDR_OFF, &flow.daddr_be, &u.to_daddr_be).is_ok()
        && (!leaves || A::store_addr(ctx, A::SADDR_OFF, &flow.saddr_be, &u.to_saddr_be).is_ok());
    if !stored {
        return Err(drop_counted(stat::DROP_REWRITE_FAILED));
    }
    if service_id != 0 {
        let len = u64::from(ctx.len());
        count_service(service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
    }
    count(stat::FRAG_TRANSLATED);
    Ok(leaves)
}
