//! Fragmented datagrams on the tc pod path (`sb_from_pod`, `sb_to_pod`).
//!
//! Only the first fragment of a datagram (more-fragments set, offset 0)
//! carries the ports, so only it can be looked up as a flow. It is translated
//! like an unfragmented packet: the L4 checksum of a fragmented datagram
//! covers the whole datagram, and the incremental update for the changed
//! address (pseudo-header) and port is right for it all the same. Its
//! translation is remembered in `SB_FRAG_V1` under (source, destination, IP
//! id, protocol, direction) as the packet carried them; the later fragments,
//! which have the same four, get the same address (and the IPv4 checksum),
//! nothing else: the port lives in the first fragment only.
//!
//! A later fragment without an entry (not a Service's datagram, or one that
//! overtook its first fragment: Linux senders send the first one first) is
//! passed untouched and counted as `frag_unknown`. Entries are not removed
//! when the last fragment passes (fragments may be reordered); the LRU map
//! evicts them, and one older than [`frag::TIMEOUT_NS`] is not used, so a
//! reused IP id does not pick up an old translation.
//!
//! The uplink's tc program (`sb_from_uplink`) does the same for datagrams
//! from outside ([`remember_uplink`], [`later_uplink`]); its entries may
//! carry a new source too (flows to a backend on another node, and their
//! replies), and their later fragments leave the way their first one did.
//! The XDP program passes every fragment on to it.
//!
//! Not covered: hairpin flows (their first fragment is source-NATed as well).

pub mod v6;

use aya_ebpf::{bindings::TC_ACT_OK, helpers::bpf_ktime_get_ns, programs::TcContext};
use proxy_common::{ct_dir, frag, stat, FragEntry, FragKey};

use crate::{
    maps::{count, count_service, SB_FRAG_V1},
    packet::ctx::ptr_at,
    packet::{csum_replace4, Flow, Ipv4Hdr, Skip, ETH_HLEN, IP_CSUM_OFF},
    rewrite::Rewrite,
    rewrite::Side,
    skb::drop_counted,
};

/// A packet `parse` did not make a flow of: a later fragment follows its
/// first fragment's translation, an ICMP error about a translated flow is
/// translated too ([`crate::icmp`]); anything else passes as `skip`
/// says. `dir` is `ct_dir::FORWARD` in `sb_from_pod`, `ct_dir::REPLY` in
/// `sb_to_pod`.
#[inline(always)]
pub fn unparsed(ctx: &TcContext, skip: Skip, dir: u8) -> Result<i32, Skip> {
    match skip {
        Skip::Fragment => later(ctx, dir),
        Skip::Icmp => crate::icmp::translate(ctx, dir),
        skip => Err(skip),
    }
}

/// Remembers the translation of a first fragment for its later fragments.
/// A failed insert is counted; the first fragment is still translated.
#[inline(always)]
pub fn remember(ctx: &TcContext, flow: &Flow, todo: &Rewrite) {
    let Ok(id_ptr) = ptr_at::<u16>(ctx, ETH_HLEN + 4) else {
        return;
    };
    // SAFETY: `ptr_at` checked the field lies inside the packet; a read.
    let id_be = unsafe { *id_ptr };
    let dir = match todo.side {
        Side::Destination => ct_dir::FORWARD,
        Side::Source => ct_dir::REPLY,
    };
    let key = FragKey {
        saddr_be: flow.saddr_be,
        daddr_be: flow.daddr_be,
        id_be,
        proto: flow.proto,
        dir,
    };
    let entry = FragEntry {
        addr_be: todo.new_addr_be,
        port_be: todo.new_port_be,
        dir,
        _pad: 0,
        service_id: todo.service_id,
        src_addr_be: 0,
        // SAFETY: a helper without preconditions.
        created_ns: unsafe { bpf_ktime_get_ns() },
    };
    if SB_FRAG_V1.insert(key, entry, 0).is_err() {
        count(stat::CT_INSERT_FAILED);
    }
}

/// Remembers what a first fragment from outside was rewritten to: its new
/// destination, and its new source when that changed (`src_addr_be`, else 0).
#[inline(always)]
pub fn remember_uplink(
    ctx: &TcContext,
    flow: &Flow,
    dst_addr_be: u32,
    src_addr_be: u32,
    service_id: u32,
) {
    let Ok(id_ptr) = ptr_at::<u16>(ctx, ETH_HLEN + 4) else {
        return;
    };
    // SAFETY: `ptr_at` checked the field lies inside the packet; a read.
    let id_be = unsafe { *id_ptr };
    let key = FragKey {
        saddr_be: flow.saddr_be,
        daddr_be: flow.daddr_be,
        id_be,
        proto: flow.proto,
        dir: frag::UPLINK,
    };
    let entry = FragEntry {
        addr_be: dst_addr_be,
        port_be: 0,
        dir: frag::UPLINK,
        _pad: 0,
        service_id,
        src_addr_be,
        // SAFETY: a helper without preconditions.
        created_ns: unsafe { bpf_ktime_get_ns() },
    };
    if SB_FRAG_V1.insert(key, entry, 0).is_err() {
        count(stat::CT_INSERT_FAILED);
    }
}

/// A later fragment from outside: the addresses its first fragment was
/// given, with the IPv4 checksum. Returns the addresses it now carries and
/// whether its source changed (then it must leave the node the way the first
/// fragment did), or `Err` when it is not one of ours.
#[inline(always)]
pub fn later_uplink(ctx: &TcContext) -> Result<(Flow, bool), Result<i32, Skip>> {
    let (header, entry) = translation_of(ctx, frag::UPLINK).map_err(Err)?;
    let Header {
        id_be: _,
        proto,
        csum_be,
        saddr_be,
        daddr_be,
    } = header;
    let new_saddr_be = if entry.src_addr_be != 0 {
        entry.src_addr_be
    } else {
        saddr_be
    };
    let mut csum = csum_replace4(csum_be, daddr_be, entry.addr_be);
    csum = csum_replace4(csum, saddr_be, new_saddr_be);
    let csum = csum.to_ne_bytes();
    let (s, d) = (new_saddr_be.to_ne_bytes(), entry.addr_be.to_ne_bytes());
    let l3: [u8; 10] = [
        csum[0], csum[1], s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3],
    ];
    if ctx.store(IP_CSUM_OFF, &l3, 0).is_err() {
        return Err(drop_counted(stat::DROP_REWRITE_FAILED));
    }
    if entry.service_id != 0 {
        let len = u64::from(ctx.len());
        count_service(entry.service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
    }
    count(stat::FRAG_TRANSLATED);
    let now_flow = Flow {
        saddr_be: new_saddr_be,
        daddr_be: entry.addr_be,
        frag_id_be: 0,
        sport_be: 0,
        dport_be: 0,
        proto,
        tcp_flags: 0,
        l4_off: 0,
        first_fragment: false,
    };
    Ok((now_flow, entry.src_addr_be != 0))
}

/// A fragment other than the first: the address its first fragment was
/// given, with the IPv4 checksum, in one helper store (the later fragment
/// may lie outside the linear data a direct store reaches).
#[inline(always)]
fn later(ctx: &TcContext, dir: u8) -> Result<i32, Skip> {
    let (header, entry) = translation_of(ctx, dir)?;
    let Header {
        csum_be,
        saddr_be,
        daddr_be,
        ..
    } = header;
    let forward = dir == ct_dir::FORWARD;
    let (new_saddr_be, new_daddr_be, old_be) = if forward {
        (saddr_be, entry.addr_be, daddr_be)
    } else {
        (entry.addr_be, daddr_be, saddr_be)
    };
    let csum = csum_replace4(csum_be, old_be, entry.addr_be).to_ne_bytes();
    let (s, d) = (new_saddr_be.to_ne_bytes(), new_daddr_be.to_ne_bytes());
    let l3: [u8; 10] = [
        csum[0], csum[1], s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3],
    ];
    if ctx.store(IP_CSUM_OFF, &l3, 0).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    if forward {
        let len = u64::from(ctx.len());
        count_service(entry.service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
    }
    count(stat::FRAG_TRANSLATED);
    Ok(TC_ACT_OK)
}

/// The fields of a fragment's IPv4 header its translation needs.
struct Header {
    id_be: u16,
    proto: u8,
    csum_be: u16,
    saddr_be: u32,
    daddr_be: u32,
}

/// A later fragment's header and the translation its first fragment left
/// under `dir`, if there is one younger than [`frag::TIMEOUT_NS`] (counted as
/// `frag_unknown` otherwise).
#[inline(always)]
fn translation_of(ctx: &TcContext, dir: u8) -> Result<(Header, FragEntry), Skip> {
    // `parse` made sure the fixed IPv4 header is in the linear area.
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the whole fixed header lies inside the packet.
    let header = unsafe {
        Header {
            id_be: (*ip).id_be,
            proto: (*ip).proto,
            csum_be: (*ip).csum_be,
            saddr_be: (*ip).saddr_be,
            daddr_be: (*ip).daddr_be,
        }
    };
    let key = FragKey {
        saddr_be: header.saddr_be,
        daddr_be: header.daddr_be,
        id_be: header.id_be,
        proto: header.proto,
        dir,
    };
    // SAFETY: the value is copied out at once.
    let Some(entry) = unsafe { SB_FRAG_V1.get(key) }.copied() else {
        count(stat::FRAG_UNKNOWN);
        return Err(Skip::NotOurs);
    };
    // SAFETY: a helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.wrapping_sub(entry.created_ns) > frag::TIMEOUT_NS {
        count(stat::FRAG_UNKNOWN);
        return Err(Skip::NotOurs);
    }
    Ok((header, entry))
}
