//! ICMPv6 errors about translated flows, on the tc pod path, as
//! [`crate::icmp`] does for IPv4. An ICMPv6 error (destination
//! unreachable, packet too big, time exceeded, parameter problem: types 1 to
//! 4) quotes the packet it is about as it was when the error was raised:
//! translated. The receiver matches the quote against its socket, so the
//! quote is translated back:
//!
//! - `sb_to_pod` (`ct_dir::REPLY`): an error going to a client about a packet
//!   it sent to a frontend, quoted as (client → backend). The flow's reply
//!   entry, keyed (backend → client), names the frontend: the quoted
//!   destination address and port become the frontend's, and the outer
//!   source too when it is the backend itself (a router keeps its own). This
//!   is what makes path-MTU discovery work through an IPv6 Service: a
//!   "packet too big" (type 2) about the backend's address would otherwise
//!   never reach the client's socket, connected to the frontend.
//! - `sb_from_pod` (`ct_dir::FORWARD`): an error a client sends about a reply
//!   it got from the frontend, quoted as (frontend → client). The forward
//!   entry, keyed (client → frontend), names the backend: the quoted source
//!   becomes the backend, and the outer destination (the frontend) too.
//!
//! Checksums: the quoted TCP/UDP checksum where the quote holds it (UDP's is
//! in the first 8 bytes, TCP's at offset 16 only when more is quoted; a UDP
//! checksum of 0 stays 0), and the ICMPv6 checksum, which covers the whole
//! message and the outer pseudo-header. Every write is a helper store.
//!
//! The uplink's tc program translates errors about flows it source-NATed to
//! another node the same way ([`translate_snat`]).
//!
//! Not translated (passed untouched): ICMPv6 informational messages
//! (echo, neighbour discovery: types 128 and up), errors whose quote has
//! extension headers before TCP/UDP or is a later fragment, and errors
//! about source-NATed flows (hairpin).
use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use proxy_common::{ct_dir, ct_flags, proto, snat, stat, Addr6Be};

use crate::{
    family::Scratch6,
    maps::{count, SB_CT6_V1},
    nodeport::Up,
    packet::v6::{csum_replace16, eq6, load, load_into, IP6_DADDR_OFF, IP6_SADDR_OFF, IPV6_HLEN},
    packet::{csum_replace2, set, Skip, TCP_CSUM_OFF, UDP_CSUM_OFF},
    skb::drop_counted,
};

const ICMP6_HLEN: usize = 8;
/// Error types (RFC 4443): destination unreachable, packet too big, time
/// exceeded, parameter problem.
const ICMPV6_ERROR_MAX: u8 = 4;

/// Translates an ICMPv6 error about a translated flow (`s.flow` as `parse6`
/// left it: the outer addresses, the ICMPv6 header at `l4_off`); anything
/// else passes untouched.
#[inline(always)]
pub fn translate(ctx: &TcContext, s: &mut Scratch6, dir: u8) -> Result<i32, Skip> {
    let Quote6 {
        icmp_off,
        icmp_csum_be,
        inner_off,
        inner_l4,
        inner_proto,
        ports,
    } = quote_of(ctx, s.flow.l4_off())?;
    // The flow: the quote is a packet of it as translated, so the entry of
    // the opposite direction, keyed by the quote reversed, names what the
    // translated side was.
    let k = &mut s.key;
    load_into(ctx, inner_off + 24, &mut k.saddr_be).map_err(|_| Skip::NotOurs)?;
    load_into(ctx, inner_off + 8, &mut k.daddr_be).map_err(|_| Skip::NotOurs)?;
    let (inner_sport_be, inner_dport_be) = (ports[0], ports[1]);
    k.sport_be = inner_dport_be;
    k.dport_be = inner_sport_be;
    k.proto = inner_proto;
    k.dir = dir;
    k._pad = [0; 2];
    let Some(entry) = SB_CT6_V1.get_ptr(s.key) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; the
    // fields are copied out at once.
    let flags = unsafe {
        set(&mut s.backend.addr_be, &(*entry).nat_addr_be);
        s.backend.port_be = (*entry).nat_port_be;
        (*entry).flags
    };
    if flags & ct_flags::SNAT != 0 {
        return Err(Skip::NotOurs);
    }
    let reply = dir == ct_dir::REPLY;
    let new_port_be = s.backend.port_be;
    // REPLY: the quoted destination (the backend) becomes the frontend.
    // FORWARD: the quoted source (the frontend) becomes the backend.
    let (old_addr, old_port_be, addr_off, port_off) = if reply {
        (
            &s.key.saddr_be,
            inner_dport_be,
            inner_off + 24,
            inner_l4 + 2,
        )
    } else {
        (&s.key.daddr_be, inner_sport_be, inner_off + 8, inner_l4)
    };
    let new_addr = &s.backend.addr_be;

    let l4_csum_off = l4_csum_off(inner_proto, inner_l4);
    let quoted_csum = quoted_csum(ctx, inner_proto, l4_csum_off, |old| {
        csum_replace2(
            csum_replace16(old, old_addr, new_addr),
            old_port_be,
            new_port_be,
        )
    });
    let mut icmp_csum = csum_replace16(icmp_csum_be, old_addr, new_addr);
    icmp_csum = csum_replace2(icmp_csum, old_port_be, new_port_be);
    if let Some((old, new)) = quoted_csum {
        icmp_csum = csum_replace2(icmp_csum, old, new);
    }
    // The outer header (the pseudo-header of the ICMPv6 checksum): the
    // error's source when it is the backend itself (REPLY); its destination,
    // the frontend the reply came from (FORWARD).
    let (outer, outer_off) = if reply {
        (&s.flow.saddr_be, IP6_SADDR_OFF)
    } else {
        (&s.flow.daddr_be, IP6_DADDR_OFF)
    };
    let outer_changes = eq6(outer, old_addr);
    if outer_changes {
        icmp_csum = csum_replace16(icmp_csum, old_addr, new_addr);
    }

    // Every read is done: the stores below move packet data.
    let stored = ctx.store(addr_off, new_addr, 0).is_ok()
        && ctx.store(port_off, &new_port_be, 0).is_ok()
        && quoted_csum.is_none_or(|(_, new)| ctx.store(l4_csum_off, &new, 0).is_ok())
        && ctx.store(icmp_off + 2, &icmp_csum, 0).is_ok()
        && (!outer_changes || ctx.store(outer_off, new_addr, 0).is_ok());
    if !stored {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count(stat::ICMP_ERROR_TRANSLATED);
    Ok(TC_ACT_OK)
}

/// An ICMPv6 error and the start of the packet it quotes, as parsed.
struct Quote6 {
    icmp_off: usize,
    icmp_csum_be: u16,
    /// The quoted IPv6 header, and the TCP or UDP header right after it.
    inner_off: usize,
    inner_l4: usize,
    inner_proto: u8,
    /// The quoted ports, as in the packet.
    ports: [u16; 2],
}

/// The ICMPv6 message at `icmp_off`, if it is an error quoting an IPv6
/// header followed directly by TCP or UDP.
#[inline(always)]
fn quote_of(ctx: &TcContext, icmp_off: usize) -> Result<Quote6, Skip> {
    let head: [u8; 4] = load(ctx, icmp_off).map_err(|_| Skip::NotOurs)?;
    if head[0] == 0 || head[0] > ICMPV6_ERROR_MAX {
        return Err(Skip::NotOurs);
    }
    let inner_off = icmp_off + ICMP6_HLEN;
    let word1: [u32; 2] = load(ctx, inner_off).map_err(|_| Skip::NotOurs)?;
    let inner_proto = (u32::from_be(word1[1]) >> 8) as u8;
    if u32::from_be(word1[0]) >> 28 != 6 || (inner_proto != proto::TCP && inner_proto != proto::UDP)
    {
        return Err(Skip::NotOurs);
    }
    let inner_l4 = inner_off + IPV6_HLEN;
    let ports: [u16; 2] = load(ctx, inner_l4).map_err(|_| Skip::NotOurs)?;
    Ok(Quote6 {
        icmp_off,
        icmp_csum_be: u16::from_ne_bytes([head[2], head[3]]),
        inner_off,
        inner_l4,
        inner_proto,
        ports,
    })
}

/// Where the quoted TCP or UDP checksum lies.
#[inline(always)]
fn l4_csum_off(inner_proto: u8, inner_l4: usize) -> usize {
    match inner_proto {
        proto::UDP => inner_l4 + UDP_CSUM_OFF,
        _ => inner_l4 + TCP_CSUM_OFF,
    }
}

/// The quoted TCP/UDP checksum at `off` (old, new: `update` of the old),
/// where the quote holds it; a UDP checksum of 0 ("none") stays 0 and a
/// computed 0 is written 0xffff.
#[inline(always)]
fn quoted_csum(
    ctx: &TcContext,
    inner_proto: u8,
    off: usize,
    update: impl FnOnce(u16) -> u16,
) -> Option<(u16, u16)> {
    match load::<u16>(ctx, off) {
        Ok(old) if inner_proto == proto::TCP || old != 0 => {
            let new = update(old);
            match inner_proto == proto::UDP && new == 0 {
                true => Some((old, 0xffff)),
                false => Some((old, new)),
            }
        }
        _ => None,
    }
}

/// The uplink (`sb_from_uplink6`): an ICMPv6 error about a flow source-NATed
/// to a backend on another node (a "packet too big" from a router on the
/// way, an unreachable from the backend's node), as IPv4's
/// [`crate::icmp::translate_snat`]. It is addressed to the uplink's address
/// and quotes the packet as it left, (uplink address, SNAT port → backend).
/// The flow's reply entry names the client and the frontend: the quote
/// becomes (client → frontend), the outer destination the client, the outer
/// source the frontend when it was the backend itself (a router keeps its
/// own). Leaves the new outer addresses (for the route lookup: the
/// frontend as source either way) in `u.to_saddr_be`, `u.to_daddr_be`.
#[inline(always)]
pub fn translate_snat(ctx: &TcContext, u: &mut Up<Addr6Be>) -> Result<(), Skip> {
    let q = quote_of(ctx, u.s.flow.l4_off())?;
    let (inner_off, inner_l4, inner_proto) = (q.inner_off, q.inner_l4, q.inner_proto);
    let [snat_port_be, backend_port_be] = q.ports;
    if !snat::is_snat_port(u16::from_be(snat_port_be)) {
        return Err(Skip::NotOurs);
    }
    // The reply entry: (backend → uplink address, SNAT port).
    let k = &mut u.s.key2;
    load_into(ctx, inner_off + 24, &mut k.saddr_be).map_err(|_| Skip::NotOurs)?;
    load_into(ctx, inner_off + 8, &mut k.daddr_be).map_err(|_| Skip::NotOurs)?;
    k.sport_be = backend_port_be;
    k.dport_be = snat_port_be;
    k.proto = inner_proto;
    k.dir = ct_dir::REPLY;
    k._pad = [0; 2];
    if !eq6(&u.s.flow.daddr_be, &u.s.key2.daddr_be) {
        // Not addressed to the address the quote comes from.
        return Err(Skip::NotOurs);
    }
    let Some(entry) = SB_CT6_V1.get_ptr(u.s.key2) else {
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
    let translated = |mut sum: u16| {
        sum = csum_replace16(sum, uplink_addr, client);
        sum = csum_replace16(sum, backend_addr, frontend);
        sum = csum_replace2(sum, snat_port_be, client_port_be);
        csum_replace2(sum, backend_port_be, frontend_port_be)
    };
    let l4_csum_off = l4_csum_off(inner_proto, inner_l4);
    let quoted_csum = quoted_csum(ctx, inner_proto, l4_csum_off, translated);
    let mut icmp_csum = translated(q.icmp_csum_be);
    if let Some((old, new)) = quoted_csum {
        icmp_csum = csum_replace2(icmp_csum, old, new);
    }
    // The outer header, in the pseudo-header: the destination (the uplink
    // address) becomes the client; the source too when it is the backend.
    icmp_csum = csum_replace16(icmp_csum, &u.s.flow.daddr_be, client);
    let source_changes = eq6(&u.s.flow.saddr_be, backend_addr);
    if source_changes {
        icmp_csum = csum_replace16(icmp_csum, backend_addr, frontend);
    }
    // Every read is done: the stores below move packet data.
    let quoted_ports = [client_port_be, frontend_port_be];
    let stored = ctx.store(inner_off + 8, client, 0).is_ok()
        && ctx.store(inner_off + 24, frontend, 0).is_ok()
        && ctx.store(inner_l4, &quoted_ports, 0).is_ok()
        && quoted_csum.is_none_or(|(_, new)| ctx.store(l4_csum_off, &new, 0).is_ok())
        && ctx.store(q.icmp_off + 2, &icmp_csum, 0).is_ok()
        && ctx.store(IP6_DADDR_OFF, client, 0).is_ok()
        && (!source_changes || ctx.store(IP6_SADDR_OFF, frontend, 0).is_ok());
    if !stored {
        return Err(Skip::Malformed);
    }
    count(stat::ICMP_ERROR_TRANSLATED);
    Ok(())
}
