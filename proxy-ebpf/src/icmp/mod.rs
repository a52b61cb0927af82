//! ICMP and ICMPv6 errors about translated flows, both families, written
//! once ([`translate`], [`translate_snat`]); what the families do their own
//! way is [`IcmpFamily`] (IPv4 and IPv6 side by side in [`family`]).
//!
//! An error (IPv4: destination unreachable, fragmentation needed included;
//! time exceeded; parameter problem. IPv6: types 1 to 4, destination
//! unreachable, packet too big, time exceeded, parameter problem) quotes
//! the IP header and at least the first 8 bytes of the L4 header of the
//! packet it is about, as that packet was when the error was raised:
//! translated. The client's (or the backend's) kernel matches the quote
//! against its socket, so the quote is translated back, the way
//! netfilter's NAT does it:
//!
//! - `sb_to_pod` (`ct_dir::REPLY`): an error going to a client about a packet
//!   it sent to a frontend, quoted as (client → backend). The reply entry of
//!   the flow, keyed (backend → client), names the frontend: the quoted
//!   destination address and port become the frontend's, and the outer source
//!   too when it is the backend itself (a router or the node keeps its own).
//!   This is what makes path-MTU discovery work through a Service: the node
//!   (or a router) answers a too-big packet to the backend with
//!   "fragmentation needed" ("packet too big"), which the client's socket,
//!   connected to the frontend, would otherwise never see.
//! - `sb_from_pod` (`ct_dir::FORWARD`): an error a client sends about a reply
//!   it got from the frontend, quoted as (frontend → client). The forward
//!   entry, keyed (client → frontend), names the backend: the quoted source
//!   becomes the backend, and the outer destination (the frontend) too.
//! - `sb_from_uplink` (both families, [`translate_snat`]): an error about a
//!   flow this node source-NATed to a backend on another node goes back to
//!   the client translated.
//!
//! Checksums: the quoted L4 checksum where the quote holds it (UDP's lies in
//! the first 8 bytes; TCP's at offset 16 only when more than 8 bytes are
//! quoted, as Linux does, else it is left), the ICMP checksum over the whole
//! message, and the family's own: IPv4's quoted header checksum (inside the
//! ICMP checksum) and outer header checksum when its address changes;
//! ICMPv6's checksum also covers the outer addresses (the pseudo-header).
//! The quote is written with helper stores, the outer addresses as a
//! rewrite writes them ([`crate::rewrite::Header`]).
//!
//! Not translated (passed untouched): informational messages (echo, ICMPv6
//! neighbour discovery), IPv4 errors that are fragments, errors whose quote
//! is a later fragment (or, IPv6, has extension headers before TCP/UDP),
//! and errors about source-NATed flows on the pod path (hairpin).

pub(crate) mod family;

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use proxy_common::{ct_dir, ct_flags, snat, stat};

pub(crate) use family::IcmpFamily;
use family::{l4_csum_off, quote_of, quoted_csum};

use crate::{
    family::Work,
    maps::count,
    nodeport::Up,
    packet::v6::load_into,
    packet::{csum_replace2, set, set_ct_tail, Skip, ETH_HLEN},
    rewrite::Header,
    skb::drop_counted,
};

/// Where the source and the destination address lie in a header of the
/// family (the outer one, or the quoted one).
#[inline(always)]
fn saddr_at<A: Header>() -> usize {
    A::SADDR_OFF - ETH_HLEN
}
#[inline(always)]
fn daddr_at<A: Header>() -> usize {
    A::DADDR_OFF - ETH_HLEN
}

/// The pod path: translates an ICMP error about a translated flow (`w.flow`
/// as the family's parser left it); anything else passes untouched. `dir`
/// is the program's direction (see the module's documentation).
#[inline(always)]
pub fn translate<A: IcmpFamily>(ctx: &TcContext, w: &mut Work<A>, dir: u8) -> Result<i32, Skip> {
    let q = quote_of(ctx, &mut w.flow)?;
    let (inner_off, inner) = (q.inner_off, q.inner);
    let [inner_sport_be, inner_dport_be] = q.ports;
    // The flow: the quote is a packet of it as translated, so the entry of
    // the opposite direction, keyed by the quote reversed, names what the
    // translated side was.
    let k = &mut w.key;
    load_into(ctx, inner_off + daddr_at::<A>(), &mut k.saddr_be).map_err(|_| Skip::NotOurs)?;
    load_into(ctx, inner_off + saddr_at::<A>(), &mut k.daddr_be).map_err(|_| Skip::NotOurs)?;
    set_ct_tail(k, inner_dport_be, inner_sport_be, inner.proto, dir);
    let Some(entry) = crate::ct::entry(&w.key) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; the
    // fields are copied out at once.
    let flags = unsafe {
        set(&mut w.backend.addr_be, &(*entry).nat_addr_be);
        w.backend.port_be = (*entry).nat_port_be;
        (*entry).flags
    };
    if flags & ct_flags::SNAT != 0 {
        // Flows from outside the node, source-NATed: not the pod path's.
        return Err(Skip::NotOurs);
    }
    let reply = dir == ct_dir::REPLY;
    let new_port_be = w.backend.port_be;
    // REPLY: the quoted destination (the backend) becomes the frontend.
    // FORWARD: the quoted source (the frontend) becomes the backend.
    let (old_addr, old_port_be, addr_at, port_off) = if reply {
        (
            &w.key.saddr_be,
            inner_dport_be,
            daddr_at::<A>(),
            inner.l4 + 2,
        )
    } else {
        (&w.key.daddr_be, inner_sport_be, saddr_at::<A>(), inner.l4)
    };
    let new_addr = &w.backend.addr_be;

    let l4_csum = quoted_csum(ctx, &inner, |old| {
        csum_replace2(
            A::csum_addr(old, old_addr, new_addr),
            old_port_be,
            new_port_be,
        )
    });
    let header_csum = A::HEADER_CSUM_AT.map(|at| {
        (
            inner_off + at,
            A::csum_addr(inner.csum_be, old_addr, new_addr),
        )
    });
    let mut icmp_csum = A::csum_addr(q.icmp_csum_be, old_addr, new_addr);
    if let Some((_, new)) = header_csum {
        icmp_csum = csum_replace2(icmp_csum, inner.csum_be, new);
    }
    icmp_csum = csum_replace2(icmp_csum, old_port_be, new_port_be);
    if let Some((old, new)) = l4_csum {
        icmp_csum = csum_replace2(icmp_csum, old, new);
    }
    // The outer header: the error's source when it is the backend itself
    // (REPLY), its destination, the frontend the reply came from (FORWARD).
    let (outer, outer_off) = if reply {
        (&w.flow.saddr_be, A::SADDR_OFF)
    } else {
        (&w.flow.daddr_be, A::DADDR_OFF)
    };
    let outer_changes = outer.same(old_addr);
    if A::PSEUDO_HEADER && outer_changes {
        icmp_csum = A::csum_addr(icmp_csum, old_addr, new_addr);
    }

    // Every read is done: the stores below move packet data.
    let stored = ctx.store(inner_off + addr_at, new_addr, 0).is_ok()
        && header_csum.is_none_or(|(off, new)| ctx.store(off, &new, 0).is_ok())
        && ctx.store(port_off, &new_port_be, 0).is_ok()
        && l4_csum.is_none_or(|(_, new)| ctx.store(l4_csum_off(&inner), &new, 0).is_ok())
        && ctx.store(q.icmp_off + 2, &icmp_csum, 0).is_ok()
        && (!outer_changes || A::store_addr(ctx, outer_off, outer, new_addr).is_ok());
    if !stored {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count(stat::ICMP_ERROR_TRANSLATED);
    Ok(TC_ACT_OK)
}

/// The uplink (`sb_from_uplink`, `sb_from_uplink6`): an ICMP error about a
/// flow this node source-NATed to a backend on another node (a "too big"
/// from a router on the way, an unreachable from the backend's node),
/// addressed to the uplink's address and quoting the packet as it left,
/// (uplink address, SNAT port → backend). The flow's reply entry, keyed by
/// the quote reversed, names the client and the frontend: the quote
/// becomes (client → frontend), the outer destination the client, and the
/// outer source the frontend when the backend itself sent the error (a
/// router keeps its own). So path-MTU discovery works for a client outside
/// talking to a NodePort whose backend is on another node. Leaves the
/// addresses the error is routed with in `u.to_saddr_be` (the frontend,
/// whoever sent it: the route a reply of the flow takes) and
/// `u.to_daddr_be` (the client).
#[inline(always)]
pub fn translate_snat<A: IcmpFamily>(ctx: &TcContext, u: &mut Up<A>) -> Result<(), Skip> {
    let q = quote_of(ctx, &mut u.s.flow)?;
    let (inner_off, inner) = (q.inner_off, q.inner);
    let [snat_port_be, backend_port_be] = q.ports;
    if !snat::is_snat_port(u16::from_be(snat_port_be)) {
        return Err(Skip::NotOurs);
    }
    // The reply entry: (backend → uplink address, SNAT port).
    let k = &mut u.s.key2;
    load_into(ctx, inner_off + daddr_at::<A>(), &mut k.saddr_be).map_err(|_| Skip::NotOurs)?;
    load_into(ctx, inner_off + saddr_at::<A>(), &mut k.daddr_be).map_err(|_| Skip::NotOurs)?;
    set_ct_tail(k, backend_port_be, snat_port_be, inner.proto, ct_dir::REPLY);
    if !u.s.flow.daddr_be.same(&u.s.key2.daddr_be) {
        // Not addressed to the address the quote comes from.
        return Err(Skip::NotOurs);
    }
    let Some(entry) = crate::ct::entry(&u.s.key2) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; the
    // fields are copied out at once.
    let flags = unsafe {
        set(&mut u.to_saddr_be, &(*entry).nat_addr_be);
        set(&mut u.to_daddr_be, &(*entry).snat_addr_be);
        u.to_ports_be = [(*entry).nat_port_be, (*entry).snat_port_be];
        (*entry).flags
    };
    if flags & ct_flags::SNAT == 0 {
        return Err(Skip::NotOurs);
    }
    let [frontend_port_be, client_port_be] = u.to_ports_be;
    // Old → new: quoted source (uplink → client), quoted destination
    // (backend → frontend), and their ports.
    let (uplink_addr, backend_addr) = (&u.s.key2.daddr_be, &u.s.key2.saddr_be);
    let (client, frontend) = (&u.to_daddr_be, &u.to_saddr_be);
    let addresses = |sum: u16| {
        A::csum_addr(
            A::csum_addr(sum, uplink_addr, client),
            backend_addr,
            frontend,
        )
    };
    let translated = |sum: u16| {
        let sum = csum_replace2(addresses(sum), snat_port_be, client_port_be);
        csum_replace2(sum, backend_port_be, frontend_port_be)
    };
    let l4_csum = quoted_csum(ctx, &inner, translated);
    let header_csum = A::HEADER_CSUM_AT.map(|at| (inner_off + at, addresses(inner.csum_be)));
    let mut icmp_csum = translated(q.icmp_csum_be);
    if let Some((_, new)) = header_csum {
        icmp_csum = csum_replace2(icmp_csum, inner.csum_be, new);
    }
    if let Some((old, new)) = l4_csum {
        icmp_csum = csum_replace2(icmp_csum, old, new);
    }
    // The outer header: the destination (the uplink address) becomes the
    // client; the source the frontend when it is the backend.
    let source_changes = u.s.flow.saddr_be.same(backend_addr);
    if A::PSEUDO_HEADER {
        icmp_csum = A::csum_addr(icmp_csum, &u.s.flow.daddr_be, client);
        if source_changes {
            icmp_csum = A::csum_addr(icmp_csum, backend_addr, frontend);
        }
    }
    // Every read is done: the stores below move packet data.
    let quoted_ports = [client_port_be, frontend_port_be];
    let stored = ctx.store(inner_off + saddr_at::<A>(), client, 0).is_ok()
        && ctx.store(inner_off + daddr_at::<A>(), frontend, 0).is_ok()
        && header_csum.is_none_or(|(off, new)| ctx.store(off, &new, 0).is_ok())
        && ctx.store(inner.l4, &quoted_ports, 0).is_ok()
        && l4_csum.is_none_or(|(_, new)| ctx.store(l4_csum_off(&inner), &new, 0).is_ok())
        && ctx.store(q.icmp_off + 2, &icmp_csum, 0).is_ok()
        && A::store_addr(ctx, A::DADDR_OFF, &u.s.flow.daddr_be, client).is_ok()
        && (!source_changes
            || A::store_addr(ctx, A::SADDR_OFF, &u.s.flow.saddr_be, frontend).is_ok());
    if !stored {
        return Err(Skip::Malformed);
    }
    count(stat::ICMP_ERROR_TRANSLATED);
    Ok(())
}
