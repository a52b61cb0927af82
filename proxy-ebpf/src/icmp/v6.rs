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
//! Not translated (passed untouched): ICMPv6 informational messages
//! (echo, neighbour discovery: types 128 and up), errors whose quote has
//! extension headers before TCP/UDP or is a later fragment, and errors
//! about source-NATed flows (hairpin).
use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use proxy_common::{ct_dir, ct_flags, proto, stat};

use crate::{
    family::Scratch6,
    maps::{count, SB_CT6_V1},
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
    let icmp_off = s.flow.l4_off();
    let head: [u8; 4] = load(ctx, icmp_off).map_err(|_| Skip::NotOurs)?;
    let icmp_type = head[0];
    if icmp_type == 0 || icmp_type > ICMPV6_ERROR_MAX {
        return Err(Skip::NotOurs);
    }
    let icmp_csum_be = u16::from_ne_bytes([head[2], head[3]]);

    // The quoted header: IPv6, then TCP or UDP directly.
    let inner_off = icmp_off + ICMP6_HLEN;
    let word1: [u32; 2] = load(ctx, inner_off).map_err(|_| Skip::NotOurs)?;
    let inner_proto = (u32::from_be(word1[1]) >> 8) as u8;
    if u32::from_be(word1[0]) >> 28 != 6 || (inner_proto != proto::TCP && inner_proto != proto::UDP)
    {
        return Err(Skip::NotOurs);
    }
    let inner_l4 = inner_off + IPV6_HLEN;
    // The flow: the quote is a packet of it as translated, so the entry of
    // the opposite direction, keyed by the quote reversed, names what the
    // translated side was.
    let k = &mut s.key;
    load_into(ctx, inner_off + 24, &mut k.saddr_be).map_err(|_| Skip::NotOurs)?;
    load_into(ctx, inner_off + 8, &mut k.daddr_be).map_err(|_| Skip::NotOurs)?;
    let ports: [u16; 2] = load(ctx, inner_l4).map_err(|_| Skip::NotOurs)?;
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

    // The quoted L4 checksum, where the quote holds it.
    let l4_csum_off = if inner_proto == proto::UDP {
        inner_l4 + UDP_CSUM_OFF
    } else {
        inner_l4 + TCP_CSUM_OFF
    };
    let quoted_csum = match load::<u16>(ctx, l4_csum_off) {
        Ok(old) if inner_proto == proto::TCP || old != 0 => {
            let mut new = csum_replace16(old, old_addr, new_addr);
            new = csum_replace2(new, old_port_be, new_port_be);
            if inner_proto == proto::UDP && new == 0 {
                new = 0xffff;
            }
            Some((old, new))
        }
        _ => None,
    };

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
