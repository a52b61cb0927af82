//! Fragmented datagrams on the tc pod path (`sb_from_pod`, `sb_to_pod`),
//! both families ([`remember`], [`later`]).
//!
//! Only the first fragment of a datagram (IPv4: more-fragments set, offset
//! 0; IPv6: a fragment header with offset 0 and more-fragments set) carries
//! the ports, so only it can be looked up as a flow. It is translated like
//! an unfragmented packet: the L4 checksum of a fragmented datagram covers
//! the whole datagram, and the incremental update for the changed address
//! (pseudo-header) and port is right for it all the same. Its translation is
//! remembered in the family's map (`SB_FRAG_V1`, `SB_FRAG6_V1`) under
//! (source, destination, identification, protocol, direction) as the packet
//! carried them; the later fragments, which have the same, get the same
//! address (and the IPv4 header checksum), nothing else: the port and the
//! L4 checksum live in the first fragment only.
//!
//! A later fragment without an entry (not a Service's datagram, or one that
//! overtook its first fragment: Linux senders send the first one first) is
//! passed untouched and counted as `frag_unknown`. Entries are not removed
//! when the last fragment passes (fragments may be reordered); the LRU map
//! evicts them, and one older than [`frag::TIMEOUT_NS`] is not used, so a
//! reused IP id does not pick up an old translation.
//!
//! The uplink's IPv4 tc program (`sb_from_uplink`) does the same for
//! datagrams from outside ([`remember_uplink`], [`later_uplink`]); its
//! entries may carry a new source too (flows to a backend on another node,
//! and their replies), and their later fragments leave the way their first
//! one did. The XDP program passes every fragment on to it. IPv6 fragments
//! from outside are not translated yet: they pass untouched.
//!
//! Not covered: hairpin flows (their first fragment is source-NATed as well).

use aya_ebpf::{bindings::TC_ACT_OK, helpers::bpf_ktime_get_ns, programs::TcContext};
use proxy_common::{ct_dir, frag, proto, stat, FragEntry, FragKey};

use crate::{
    family::{Family, Work},
    maps::{count, count_service, SB_FRAG_V1},
    packet::ctx::{later_fragment4, ptr_at},
    packet::{csum_replace4, set, Flow, Ipv4Hdr, Skip, ETH_HLEN, IP_CSUM_OFF},
    rewrite::Side,
    skb::drop_counted,
};

/// An IPv4 packet `parse_ipv4` did not make a flow of (`skip`), in a pod
/// program of direction `dir`: a later fragment follows its first
/// fragment's translation ([`later`]), an ICMP error about a translated
/// flow is translated too ([`crate::icmp`]); anything else passes as
/// `skip` says.
#[inline(always)]
pub fn unparsed(ctx: &TcContext, w: &mut Work<u32>, skip: Skip, dir: u8) -> Result<i32, Skip> {
    match skip {
        Skip::Fragment => {
            later_fragment4(ctx, &mut w.flow)?;
            if w.flow.proto != proto::TCP && w.flow.proto != proto::UDP {
                return Err(Skip::NotOurs);
            }
            later(ctx, w, dir)
        }
        Skip::Icmp => crate::icmp::translate(ctx, dir),
        skip => Err(skip),
    }
}

/// Remembers the translation of a first fragment (`w.flow`, whose `side`
/// became `w.backend`'s address and port) for its later fragments. A
/// failed insert is counted; the first fragment is still translated.
#[inline(always)]
pub fn remember<A: Family>(w: &mut Work<A>, side: Side, service_id: u32) {
    let dir = match side {
        Side::Destination => ct_dir::FORWARD,
        Side::Source => ct_dir::REPLY,
    };
    A::frag_key(&w.flow, dir, &mut w.frag_key);
    let e = &mut w.frag_entry;
    set(&mut e.addr_be, &w.backend.addr_be);
    e.port_be = w.backend.port_be;
    e.dir = dir;
    e._pad = 0;
    e.service_id = service_id;
    set(&mut e.src_addr_be, &A::ZERO);
    // SAFETY: a helper without preconditions.
    e.created_ns = unsafe { bpf_ktime_get_ns() };
    // By reference: a copy of the entry on the stack would be a copy more.
    let (key, entry) = (&w.frag_key, &w.frag_entry);
    if A::frags().insert(key, entry, 0).is_err() {
        count(stat::CT_INSERT_FAILED);
    }
}

/// A fragment other than the first (`w.flow`: its addresses, protocol and
/// identification): the address its first fragment was given (the
/// destination in `sb_from_pod`, `ct_dir::FORWARD`; the source in
/// `sb_to_pod`, `ct_dir::REPLY`), with the IPv4 header checksum.
#[inline(always)]
pub fn later<A: Family>(ctx: &TcContext, w: &mut Work<A>, dir: u8) -> Result<i32, Skip> {
    A::frag_key(&w.flow, dir, &mut w.frag_key);
    let Some(entry) = A::frags().get_ptr(&w.frag_key) else {
        count(stat::FRAG_UNKNOWN);
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the LRU map, valid for this program run; the
    // fields are copied out at once.
    let (created_ns, service_id) = unsafe {
        set(&mut w.backend.addr_be, &(*entry).addr_be);
        ((*entry).created_ns, (*entry).service_id)
    };
    // SAFETY: a helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.wrapping_sub(created_ns) > frag::TIMEOUT_NS {
        count(stat::FRAG_UNKNOWN);
        return Err(Skip::NotOurs);
    }
    let forward = dir == ct_dir::FORWARD;
    let (off, old) = if forward {
        (A::DADDR_OFF, &w.flow.daddr_be)
    } else {
        (A::SADDR_OFF, &w.flow.saddr_be)
    };
    if A::store_addr(ctx, off, old, &w.backend.addr_be).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    if forward {
        let len = u64::from(ctx.len());
        count_service(service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
    }
    count(stat::FRAG_TRANSLATED);
    Ok(TC_ACT_OK)
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
