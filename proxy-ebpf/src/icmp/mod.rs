//! ICMP errors about translated flows, on the tc pod path.
//!
//! An ICMP error (destination unreachable, fragmentation needed included;
//! time exceeded; parameter problem) quotes the IPv4 header and at least the
//! first 8 bytes of the L4 header of the packet it is about, as that packet
//! was when the error was raised: translated. The client's (or the
//! backend's) kernel matches the quote against its socket, so the quote is
//! translated back, the way netfilter's NAT does it:
//!
//! - `sb_to_pod` (`ct_dir::REPLY`): an error going to a client about a packet
//!   it sent to a frontend, quoted as (client → backend). The reply entry of
//!   the flow, keyed (backend → client), names the frontend: the quoted
//!   destination address and port become the frontend's, and the outer source
//!   too when it is the backend itself (a router or the node keeps its own).
//!   This is what makes path-MTU discovery work through a Service: the node
//!   (or a router) answers a too-big DF packet to the backend with
//!   "fragmentation needed", which the client's socket, connected to the
//!   frontend, would otherwise never see.
//! - `sb_from_pod` (`ct_dir::FORWARD`): an error a client sends about a reply
//!   it got from the frontend, quoted as (frontend → client). The forward
//!   entry, keyed (client → frontend), names the backend: the quoted source
//!   becomes the backend, and the outer destination (the frontend) too.
//!
//! Checksums: the quoted IPv4 header's, the quoted L4 checksum where the
//! quote holds it (UDP's lies in the first 8 bytes; TCP's at offset 16 only
//! when more than 8 bytes are quoted, as Linux does, else it is left), the
//! ICMP checksum over the whole message, and the outer IPv4 header's when its
//! address changes. Every write is a helper store.

pub mod v6;

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use proxy_common::{ct_dir, ct_flags, proto, stat, CtKey};

use crate::{
    maps::{count, SB_CT_V5},
    packet::ctx::ensure_linear,
    packet::ctx::ptr_at,
    packet::{
        csum_replace2, csum_replace4, Ipv4Hdr, Skip, ETH_HLEN, IPV4_MIN_HLEN, IP_CSUM_OFF,
        IP_FRAG_MASK, IP_OFFSET_MASK, TCP_CSUM_OFF, UDP_CSUM_OFF,
    },
    skb::drop_counted,
};

const ICMP_HLEN: usize = 8;
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETER_PROB: u8 = 12;
/// The quoted L4 bytes every ICMP error carries (RFC 792).
const QUOTED_L4: usize = 8;

/// Translates an ICMP error about a translated flow; anything else ICMP
/// passes untouched.
#[inline(always)]
pub fn translate(ctx: &TcContext, dir: u8) -> Result<i32, Skip> {
    let q = parse_error(ctx)?;
    let Quoted {
        icmp_off,
        icmp_csum_be,
        outer_csum_be,
        outer_saddr_be,
        outer_daddr_be,
        inner_off,
        inner_l4,
        inner_proto,
        inner_csum_be,
        inner_saddr_be,
        inner_daddr_be,
        inner_sport_be,
        inner_dport_be,
    } = q;

    // The flow: the quote is a packet of it as translated, so the entry of
    // the opposite direction, keyed by the quote reversed, names what the
    // translated side was.
    let key = CtKey {
        saddr_be: inner_daddr_be,
        daddr_be: inner_saddr_be,
        sport_be: inner_dport_be,
        dport_be: inner_sport_be,
        proto: inner_proto,
        dir,
        _pad: [0; 2],
    };
    // SAFETY: the value is copied out at once.
    let Some(entry) = unsafe { SB_CT_V5.get(key) }.copied() else {
        return Err(Skip::NotOurs);
    };
    if entry.flags & ct_flags::SNAT != 0 {
        // Flows from outside the node, source-NATed: not the pod path's.
        return Err(Skip::NotOurs);
    }
    let (new_addr_be, new_port_be) = (entry.nat_addr_be, entry.nat_port_be);
    let reply = dir == ct_dir::REPLY;
    // REPLY: the quoted destination (the backend) becomes the frontend.
    // FORWARD: the quoted source (the frontend) becomes the backend.
    let (old_addr_be, old_port_be, port_off) = if reply {
        (inner_daddr_be, inner_dport_be, inner_l4 + 2)
    } else {
        (inner_saddr_be, inner_sport_be, inner_l4)
    };

    // The quoted L4 checksum, where the quote holds it.
    let (l4_csum_off, quoted_csum) = quoted_l4_csum(ctx, &q)?;
    let l4_csum = quoted_csum.map(|old| {
        let new = csum_replace4(old, old_addr_be, new_addr_be);
        (
            old,
            l4_csum_fixup(inner_proto, csum_replace2(new, old_port_be, new_port_be)),
        )
    });

    let new_inner_csum_be = csum_replace4(inner_csum_be, old_addr_be, new_addr_be);
    let mut icmp_csum = csum_replace4(icmp_csum_be, old_addr_be, new_addr_be);
    icmp_csum = csum_replace2(icmp_csum, inner_csum_be, new_inner_csum_be);
    icmp_csum = csum_replace2(icmp_csum, old_port_be, new_port_be);
    if let Some((old, new)) = l4_csum {
        icmp_csum = csum_replace2(icmp_csum, old, new);
    }

    // Every read is done: the stores below move packet data.
    let (s, d) = if reply {
        (inner_saddr_be.to_ne_bytes(), new_addr_be.to_ne_bytes())
    } else {
        (new_addr_be.to_ne_bytes(), inner_daddr_be.to_ne_bytes())
    };
    let c = new_inner_csum_be.to_ne_bytes();
    let inner_l3: [u8; 10] = [c[0], c[1], s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3]];
    let stored = ctx.store(inner_off + 10, &inner_l3, 0).is_ok()
        && ctx.store(port_off, &new_port_be, 0).is_ok()
        && l4_csum.is_none_or(|(_, new)| ctx.store(l4_csum_off, &new, 0).is_ok())
        && ctx.store(icmp_off + 2, &icmp_csum, 0).is_ok();
    if !stored {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }

    // The outer header: the error's source when it is the backend itself
    // (REPLY), its destination, the frontend the reply came from (FORWARD).
    let (outer_old_be, outer_saddr_new, outer_daddr_new) = if reply {
        (outer_saddr_be, new_addr_be, outer_daddr_be)
    } else {
        (outer_daddr_be, outer_saddr_be, new_addr_be)
    };
    if outer_old_be == old_addr_be {
        let c = csum_replace4(outer_csum_be, old_addr_be, new_addr_be).to_ne_bytes();
        let (s, d) = (outer_saddr_new.to_ne_bytes(), outer_daddr_new.to_ne_bytes());
        let l3: [u8; 10] = [c[0], c[1], s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3]];
        if ctx.store(IP_CSUM_OFF, &l3, 0).is_err() {
            return drop_counted(stat::DROP_REWRITE_FAILED);
        }
    }
    count(stat::ICMP_ERROR_TRANSLATED);
    Ok(TC_ACT_OK)
}

/// Where an ICMP error about a source-NATed flow from outside now goes:
/// its outer source and destination after [`translate_snat`].
pub struct Outer {
    pub saddr_be: u32,
    pub daddr_be: u32,
}

/// The uplink (`sb_from_uplink`): an ICMP error about a flow this node
/// source-NATed to a backend on another node, arriving for this node's
/// address and quoting the packet as it left (node:port → backend). Its reply
/// entry, keyed by the quote reversed, names the frontend and the client: the
/// quote becomes (client → frontend), the outer destination the client, and
/// the outer source the frontend when the backend itself sent the error (a
/// router keeps its own). So path-MTU discovery works for a client outside
/// talking to a NodePort whose backend is on another node. Returns the outer
/// addresses, for sending the error on to the client.
#[inline(always)]
pub fn translate_snat(ctx: &TcContext) -> Result<Outer, Skip> {
    let q = parse_error(ctx)?;
    let Quoted {
        icmp_off,
        icmp_csum_be,
        outer_csum_be,
        outer_saddr_be,
        outer_daddr_be,
        inner_off,
        inner_l4,
        inner_proto,
        inner_csum_be,
        inner_saddr_be,
        inner_daddr_be,
        inner_sport_be,
        inner_dport_be,
    } = q;
    let key = CtKey {
        saddr_be: inner_daddr_be,
        daddr_be: inner_saddr_be,
        sport_be: inner_dport_be,
        dport_be: inner_sport_be,
        proto: inner_proto,
        dir: ct_dir::REPLY,
        _pad: [0; 2],
    };
    // SAFETY: the value is copied out at once.
    let Some(entry) = unsafe { SB_CT_V5.get(key) }.copied() else {
        return Err(Skip::NotOurs);
    };
    if entry.flags & ct_flags::SNAT == 0 || outer_daddr_be != inner_saddr_be {
        return Err(Skip::NotOurs);
    }
    // The quote: (node:port → backend) becomes (client → frontend).
    let (client_be, client_port_be) = (entry.snat_addr_be, entry.snat_port_be);
    let (frontend_be, frontend_port_be) = (entry.nat_addr_be, entry.nat_port_be);

    let (l4_csum_off, quoted_csum) = quoted_l4_csum(ctx, &q)?;
    let l4_csum = quoted_csum.map(|old| {
        let mut new = csum_replace4(old, inner_saddr_be, client_be);
        new = csum_replace4(new, inner_daddr_be, frontend_be);
        new = csum_replace2(new, inner_sport_be, client_port_be);
        (
            old,
            l4_csum_fixup(
                inner_proto,
                csum_replace2(new, inner_dport_be, frontend_port_be),
            ),
        )
    });
    let mut new_inner_csum_be = csum_replace4(inner_csum_be, inner_saddr_be, client_be);
    new_inner_csum_be = csum_replace4(new_inner_csum_be, inner_daddr_be, frontend_be);
    let mut icmp_csum = csum_replace4(icmp_csum_be, inner_saddr_be, client_be);
    icmp_csum = csum_replace4(icmp_csum, inner_daddr_be, frontend_be);
    icmp_csum = csum_replace2(icmp_csum, inner_csum_be, new_inner_csum_be);
    icmp_csum = csum_replace2(icmp_csum, inner_sport_be, client_port_be);
    icmp_csum = csum_replace2(icmp_csum, inner_dport_be, frontend_port_be);
    if let Some((old, new)) = l4_csum {
        icmp_csum = csum_replace2(icmp_csum, old, new);
    }

    // Every read is done: the stores below move packet data.
    let (s, d, c) = (
        client_be.to_ne_bytes(),
        frontend_be.to_ne_bytes(),
        new_inner_csum_be.to_ne_bytes(),
    );
    let inner_l3: [u8; 10] = [c[0], c[1], s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3]];
    let quoted_ports = [client_port_be, frontend_port_be];
    let stored = ctx.store(inner_off + 10, &inner_l3, 0).is_ok()
        && ctx.store(inner_l4, &quoted_ports, 0).is_ok()
        && l4_csum.is_none_or(|(_, new)| ctx.store(l4_csum_off, &new, 0).is_ok())
        && ctx.store(icmp_off + 2, &icmp_csum, 0).is_ok();
    if !stored {
        return Err(Skip::Malformed);
    }
    // The outer header: to the client; from the frontend when the backend
    // itself sent the error.
    let outer_saddr_new = if outer_saddr_be == inner_daddr_be {
        frontend_be
    } else {
        outer_saddr_be
    };
    let mut c = csum_replace4(outer_csum_be, outer_daddr_be, client_be);
    c = csum_replace4(c, outer_saddr_be, outer_saddr_new);
    let (c, s, d) = (
        c.to_ne_bytes(),
        outer_saddr_new.to_ne_bytes(),
        client_be.to_ne_bytes(),
    );
    let l3: [u8; 10] = [c[0], c[1], s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3]];
    if ctx.store(IP_CSUM_OFF, &l3, 0).is_err() {
        return Err(Skip::Malformed);
    }
    count(stat::ICMP_ERROR_TRANSLATED);
    Ok(Outer {
        saddr_be: outer_saddr_new,
        daddr_be: client_be,
    })
}

/// An ICMP error and the packet it quotes, as parsed.
#[derive(Clone, Copy)]
struct Quoted {
    icmp_off: usize,
    icmp_csum_be: u16,
    outer_csum_be: u16,
    outer_saddr_be: u32,
    outer_daddr_be: u32,
    inner_off: usize,
    inner_l4: usize,
    inner_proto: u8,
    inner_csum_be: u16,
    inner_saddr_be: u32,
    inner_daddr_be: u32,
    inner_sport_be: u16,
    inner_dport_be: u16,
}

/// Parses an ICMP error (destination unreachable, time exceeded, parameter
/// problem) that quotes an unfragmented-or-first TCP or UDP packet; anything
/// else is not ours.
#[inline(always)]
fn parse_error(ctx: &TcContext) -> Result<Quoted, Skip> {
    // `parse` made sure the fixed outer header is in the linear area.
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the whole fixed header lies inside the packet.
    let (version_ihl, frag_off_be, outer_csum_be, outer_saddr_be, outer_daddr_be) = unsafe {
        (
            (*ip).version_ihl,
            (*ip).frag_off_be,
            (*ip).csum_be,
            (*ip).saddr_be,
            (*ip).daddr_be,
        )
    };
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    if version_ihl >> 4 != 4 || ihl < IPV4_MIN_HLEN || u16::from_be(frag_off_be) & IP_FRAG_MASK != 0
    {
        return Err(Skip::NotOurs);
    }
    let icmp_off = ETH_HLEN + ihl;
    if (ctx.len() as usize) < icmp_off + ICMP_HLEN {
        return Err(Skip::NotOurs);
    }
    ensure_linear(ctx, icmp_off + ICMP_HLEN)?;
    let icmp = ptr_at::<[u8; 4]>(ctx, icmp_off)?;
    // SAFETY: `ptr_at` checked the four bytes lie inside the packet.
    let (icmp_type, icmp_csum_be) =
        unsafe { ((*icmp)[0], u16::from_ne_bytes([(*icmp)[2], (*icmp)[3]])) };
    if !matches!(
        icmp_type,
        ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROB
    ) {
        return Err(Skip::NotOurs);
    }

    // The quoted header.
    let inner_off = icmp_off + ICMP_HLEN;
    ensure_linear(ctx, inner_off + IPV4_MIN_HLEN)?;
    let inner = ptr_at::<Ipv4Hdr>(ctx, inner_off)?;
    // SAFETY: `ptr_at` checked the whole fixed header lies inside the packet.
    let (inner_vihl, inner_proto, inner_frag_be, inner_csum_be, inner_saddr_be, inner_daddr_be) = unsafe {
        (
            (*inner).version_ihl,
            (*inner).proto,
            (*inner).frag_off_be,
            (*inner).csum_be,
            (*inner).saddr_be,
            (*inner).daddr_be,
        )
    };
    let inner_ihl = usize::from(inner_vihl & 0x0f) * 4;
    if inner_vihl >> 4 != 4
        || inner_ihl < IPV4_MIN_HLEN
        || (inner_proto != proto::TCP && inner_proto != proto::UDP)
        || u16::from_be(inner_frag_be) & IP_OFFSET_MASK != 0
    {
        return Err(Skip::NotOurs);
    }
    let inner_l4 = inner_off + inner_ihl;
    ensure_linear(ctx, inner_l4 + QUOTED_L4)?;
    let ports = ptr_at::<[u16; 2]>(ctx, inner_l4)?;
    // SAFETY: `ptr_at` checked both ports lie inside the packet.
    let (inner_sport_be, inner_dport_be) = unsafe { ((*ports)[0], (*ports)[1]) };
    Ok(Quoted {
        icmp_off,
        icmp_csum_be,
        outer_csum_be,
        outer_saddr_be,
        outer_daddr_be,
        inner_off,
        inner_l4,
        inner_proto,
        inner_csum_be,
        inner_saddr_be,
        inner_daddr_be,
        inner_sport_be,
        inner_dport_be,
    })
}

/// Where the quoted L4 checksum lies, and its value when the quote holds it
/// and it is to be updated (UDP's lies in the first 8 bytes; TCP's at offset
/// 16 only when more is quoted; a UDP checksum of zero, "none", stays zero).
#[inline(always)]
fn quoted_l4_csum(ctx: &TcContext, q: &Quoted) -> Result<(usize, Option<u16>), Skip> {
    let off = if q.inner_proto == proto::UDP {
        q.inner_l4 + UDP_CSUM_OFF
    } else {
        q.inner_l4 + TCP_CSUM_OFF
    };
    if (ctx.len() as usize) < off + 2 {
        return Ok((off, None));
    }
    ensure_linear(ctx, off + 2)?;
    let csum_ptr = ptr_at::<u16>(ctx, off)?;
    // SAFETY: `ptr_at` checked the field lies inside the packet; a read.
    let old = unsafe { *csum_ptr };
    let updated = q.inner_proto == proto::TCP || old != 0;
    Ok((off, updated.then_some(old)))
}

/// A computed UDP checksum of zero is sent as 0xffff (zero means "none").
#[inline(always)]
fn l4_csum_fixup(inner_proto: u8, csum: u16) -> u16 {
    if inner_proto == proto::UDP && csum == 0 {
        0xffff
    } else {
        csum
    }
}
