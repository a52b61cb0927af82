//! Fragmented IPv6 datagrams on the tc pod path, as [`crate::frag`] does for
//! IPv4: the first fragment (fragment header with offset 0 and
//! more-fragments set) carries the ports and is translated like a whole
//! datagram; its translation is remembered in `SB_FRAG6_V1` under (source,
//! destination, the fragment header's 32-bit identification, protocol,
//! direction) as the packet carried them. A later fragment gets the same
//! address, nothing else: there is no IPv6 header checksum, and the port
//! and the L4 checksum live in the first fragment only.
//!
//! A later fragment without a (young enough) entry passes untouched, counted
//! `frag_unknown`. Not covered, as for IPv4: hairpin flows.
use aya_ebpf::{bindings::TC_ACT_OK, helpers::bpf_ktime_get_ns, programs::TcContext};
use proxy_common::{ct_dir, frag, stat};

use crate::{
    family::Scratch6,
    maps::{count, count_service, SB_FRAG6_V1},
    packet::v6::{IP6_DADDR_OFF, IP6_SADDR_OFF},
    packet::{set, Skip},
    rewrite::Side,
    skb::drop_counted,
};

/// Remembers the translation of a first fragment (`s.flow`, rewritten to
/// `s.backend`'s address and port) for its later fragments. A failed insert
/// is counted; the first fragment is still translated.
#[inline(always)]
pub fn remember(s: &mut Scratch6, side: Side, service_id: u32) {
    let dir = match side {
        Side::Destination => ct_dir::FORWARD,
        Side::Source => ct_dir::REPLY,
    };
    let k = &mut s.frag_key;
    k.saddr_be = s.flow.saddr_be;
    k.daddr_be = s.flow.daddr_be;
    k.id_be = s.flow.frag_id_be;
    k.proto = s.flow.proto;
    k.dir = dir;
    k._pad = [0; 2];
    let e = &mut s.frag_entry;
    e.addr_be = s.backend.addr_be;
    e.port_be = s.backend.port_be;
    e.dir = dir;
    e._pad = 0;
    e.service_id = service_id;
    e.src_addr_be = [0; 4];
    // SAFETY: a helper without preconditions.
    e.created_ns = unsafe { bpf_ktime_get_ns() };
    if SB_FRAG6_V1.insert(s.frag_key, s.frag_entry, 0).is_err() {
        count(stat::CT_INSERT_FAILED);
    }
}

/// A fragment other than the first (`s.flow` as `parse6` left it): the
/// address its first fragment was given (the destination in `sb_from_pod`,
/// `ct_dir::FORWARD`; the source in `sb_to_pod`, `ct_dir::REPLY`), in one
/// helper store.
#[inline(always)]
pub fn later(ctx: &TcContext, s: &mut Scratch6, dir: u8) -> Result<i32, Skip> {
    let k = &mut s.frag_key;
    k.saddr_be = s.flow.saddr_be;
    k.daddr_be = s.flow.daddr_be;
    k.id_be = s.flow.frag_id_be;
    k.proto = s.flow.proto;
    k.dir = dir;
    k._pad = [0; 2];
    let Some(entry) = SB_FRAG6_V1.get_ptr(s.frag_key) else {
        count(stat::FRAG_UNKNOWN);
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the LRU map, valid for this program run; the
    // fields are copied out at once.
    let (created_ns, service_id) = unsafe {
        set(&mut s.backend.addr_be, &(*entry).addr_be);
        ((*entry).created_ns, (*entry).service_id)
    };
    // SAFETY: a helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if now.wrapping_sub(created_ns) > frag::TIMEOUT_NS {
        count(stat::FRAG_UNKNOWN);
        return Err(Skip::NotOurs);
    }
    let forward = dir == ct_dir::FORWARD;
    let off = if forward {
        IP6_DADDR_OFF
    } else {
        IP6_SADDR_OFF
    };
    if ctx.store(off, &s.backend.addr_be, 0).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    if forward {
        let len = u64::from(ctx.len());
        count_service(service_id, |st| {
            st.packets += 1;
            st.bytes += len;
        });
    }
    count(stat::FRAG_TRANSLATED);
    Ok(TC_ACT_OK)
}
