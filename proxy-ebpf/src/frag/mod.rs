//! Fragmented datagrams on the tc pod path (`sb_from_pod`, `sb_to_pod`),
//! both families ([`remember`], [`later`]), and from outside
//! ([`uplink`]).
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
//! The uplink's tc programs do the same for datagrams from outside, both
//! families ([`uplink`]).
//!
//! Not covered: hairpin flows (their first fragment is source-NATed as well).

pub mod uplink;

use aya_ebpf::{bindings::TC_ACT_OK, helpers::bpf_ktime_get_ns, programs::TcContext};
use proxy_common::{ct_dir, frag, proto, stat, FragEntryOf};

use crate::{
    family::{Family, Work},
    maps::{count, count_service},
    packet::ctx::later_fragment4,
    packet::{set, Skip},
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
        Skip::Icmp => crate::icmp::translate(ctx, w, dir),
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
    record(w, dir, service_id, &A::ZERO);
}

/// Writes the fragment entry of `w.flow`'s datagram under direction `dir`:
/// `w.backend` and the new source `src` (zero: unchanged).
#[inline(always)]
fn record<A: Family>(w: &mut Work<A>, dir: u8, service_id: u32, src: &A) {
    A::frag_key(&w.flow, dir, &mut w.frag_key);
    let e = &mut w.frag_entry;
    set(&mut e.addr_be, &w.backend.addr_be);
    e.port_be = w.backend.port_be;
    e.dir = dir;
    e._pad = 0;
    e.service_id = service_id;
    set(&mut e.src_addr_be, src);
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
    let Some(entry) = translation(w) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the LRU map, valid for this program run; the
    // fields are copied out at once.
    let service_id = unsafe {
        set(&mut w.backend.addr_be, &(*entry).addr_be);
        (*entry).service_id
    };
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

/// The translation the first fragment of `w.frag_key`'s datagram left, if
/// there is one younger than [`frag::TIMEOUT_NS`] (else counted as
/// `frag_unknown`).
#[inline(always)]
fn translation<A: Family>(w: &Work<A>) -> Option<*const FragEntryOf<A>> {
    let Some(entry) = A::frags().get_ptr(&w.frag_key) else {
        return unknown(w);
    };
    // SAFETY: a value of the LRU map, valid for this program run; a read.
    let created_ns = unsafe { (*entry).created_ns };
    // SAFETY: a helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.wrapping_sub(created_ns) > frag::TIMEOUT_NS {
        return unknown(w);
    }
    Some(entry)
}

/// A later fragment of no translation remembered: counted, traced, passed.
#[inline(always)]
fn unknown<A: Family>(w: &Work<A>) -> Option<*const FragEntryOf<A>> {
    count(stat::FRAG_UNKNOWN);
    crate::trace::passed(crate::trace::layer::TC, stat::FRAG_UNKNOWN, &w.flow);
    None
}
