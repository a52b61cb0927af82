//! Rewrite and checksum of a translated IPv4 packet on the tc path: the
//! rewrite `sb_from_pod`/`sb_to_pod` decide on ([`Rewrite`]), stored directly
//! ([`store_in_place`]); the helper stores of the programs that do not store
//! directly (the uplink's tc program, the hairpin's second side); the L4
//! checksum update through the kernel's helper; and `sb_rewrite`, the
//! previous release's tail-called program, kept for upgrades.
pub mod v6;

use crate::packet::ctx::ptr_at;
use crate::{
    maps::{count, count_service},
    packet::{
        csum_replace4, Flow, ETH_HLEN, IPV4_MIN_HLEN, IP_CSUM_OFF, MAX_L4_OFF, TCP_CSUM_OFF,
        UDP_CSUM_OFF,
    },
};
use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use proxy_common::{proto, stat};
/// Which side of the packet a rewrite touches.
#[derive(Clone, Copy)]
pub(crate) enum Side {
    Source,
    Destination,
}

/// A rewrite helper failed half-way; the packet must not go on.
pub(crate) struct RewriteFailed;

/// A rewrite decided by `sb_from_pod` or `sb_to_pod`, carried to `sb_rewrite`
/// in the skb's control buffer.
pub(crate) struct Rewrite {
    pub(crate) side: Side,
    pub(crate) new_addr_be: u32,
    pub(crate) new_port_be: u16,
    /// For the per-service counters (forward direction).
    pub(crate) service_id: u32,
    pub(crate) l4_off: usize,
    pub(crate) proto: u8,
}

/// Where the control buffer words go: cb[0] the new address, cb[1] the new
/// port, cb[2] the service id, cb[3] `l4_off | proto << 8 | side << 16`.
pub(crate) const SIDE_BIT: u32 = 1 << 16;

impl Rewrite {
    #[inline(always)]
    fn load(ctx: &TcContext) -> Rewrite {
        let skb = ctx.skb.skb;
        // SAFETY: reads of the program's scratch space in `__sk_buff`.
        let cb = unsafe { (*skb).cb };
        Rewrite {
            side: if cb[3] & SIDE_BIT != 0 {
                Side::Destination
            } else {
                Side::Source
            },
            new_addr_be: cb[0],
            new_port_be: cb[1] as u16,
            service_id: cb[2],
            l4_off: (cb[3] & 0xff) as usize,
            proto: (cb[3] >> 8) as u8,
        }
    }
}

/// Counts a rewritten packet of either family: a forwarded one for its
/// service, a reversed one globally.
#[inline(always)]
pub(crate) fn count_rewritten(ctx: &TcContext, side: Side, service_id: u32) {
    match side {
        Side::Destination => {
            let len = u64::from(ctx.len());
            count_service(service_id, |s| {
                s.packets += 1;
                s.bytes += len;
            });
            count(stat::FORWARDED);
        }
        Side::Source => count(stat::REVERSED),
    }
}

/// `sb_rewrite`: writes a rewrite handed over in the control buffer.
///
/// `sb_from_pod` and `sb_to_pod` now store directly themselves (see
/// [`store_in_place`]); this program stays for one release as the bridge of
/// an upgrade: the previous release's pod programs, still attached until
/// the new agent replaces them, tail-call it, and the new agent's load puts
/// this one in their slot.
#[inline(always)]
pub fn rewrite_in_place(ctx: &TcContext) -> i32 {
    let todo = Rewrite::load(ctx);
    if todo.l4_off < ETH_HLEN + IPV4_MIN_HLEN
        || todo.l4_off > MAX_L4_OFF
        || (todo.proto != proto::TCP && todo.proto != proto::UDP)
    {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    if store_in_place(ctx, &todo).is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    count_rewritten(ctx, todo.side, todo.service_id);
    TC_ACT_OK
}

/// The address, port and IPv4 checksum stored directly, then the L4 checksum
/// through the kernel's helper ([`l4_checksum`]).
#[inline(always)]
pub(crate) fn store_in_place(ctx: &TcContext, todo: &Rewrite) -> Result<(), RewriteFailed> {
    // The bound tells the verifier how far the offset (read back from
    // working memory) can reach: past a header with the most options.
    if todo.l4_off > MAX_L4_OFF {
        return Err(RewriteFailed);
    }
    let (addr_off, port_off) = match todo.side {
        Side::Source => (ETH_HLEN + 12, todo.l4_off),
        Side::Destination => (ETH_HLEN + 16, todo.l4_off + 2),
    };
    let csum_ptr = ptr_at::<u16>(ctx, IP_CSUM_OFF).map_err(|_| RewriteFailed)?;
    let addr_ptr = ptr_at::<u32>(ctx, addr_off).map_err(|_| RewriteFailed)?;
    let port_ptr = ptr_at::<u16>(ctx, port_off).map_err(|_| RewriteFailed)?;
    // SAFETY: `ptr_at` checked each field lies inside the linear packet data;
    // this program may store there (the verifier unclones the skb on entry).
    // No helper that moves packet data runs before the last store.
    let (old_addr_be, old_port_be) = unsafe {
        let old = (*addr_ptr, *port_ptr);
        *csum_ptr = csum_replace4(*csum_ptr, old.0, todo.new_addr_be);
        *addr_ptr = todo.new_addr_be;
        *port_ptr = todo.new_port_be;
        old
    };
    l4_checksum(ctx, todo, old_addr_be, old_port_be)
}

/// The same rewrite with every write through a helper, for a program that
/// does not store directly (`sb_from_uplink`) and for the hairpin's rewrite. Both
/// addresses and the IPv4 checksum (computed here) go in one 10-byte store.
#[inline(always)]
pub(crate) fn rewrite_with_helpers(
    ctx: &TcContext,
    flow: &Flow,
    todo: &Rewrite,
) -> Result<(), RewriteFailed> {
    let (old_addr_be, old_port_be, port_off) = match todo.side {
        Side::Source => (flow.saddr_be, flow.sport_be, flow.l4_off),
        Side::Destination => (flow.daddr_be, flow.dport_be, flow.l4_off + 2),
    };
    if old_addr_be != todo.new_addr_be {
        let csum_ptr = ptr_at::<u16>(ctx, IP_CSUM_OFF).map_err(|_| RewriteFailed)?;
        // SAFETY: `ptr_at` checked the field lies inside the packet; a read.
        let old_csum = unsafe { *csum_ptr };
        let (saddr_be, daddr_be) = match todo.side {
            Side::Source => (todo.new_addr_be, flow.daddr_be),
            Side::Destination => (flow.saddr_be, todo.new_addr_be),
        };
        let csum = csum_replace4(old_csum, old_addr_be, todo.new_addr_be).to_ne_bytes();
        let (s, d) = (saddr_be.to_ne_bytes(), daddr_be.to_ne_bytes());
        let l3: [u8; 10] = [
            csum[0], csum[1], s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3],
        ];
        ctx.store(IP_CSUM_OFF, &l3, 0).map_err(|_| RewriteFailed)?;
    }
    if old_port_be != todo.new_port_be {
        ctx.store(port_off, &todo.new_port_be, 0)
            .map_err(|_| RewriteFailed)?;
    }
    l4_checksum(ctx, todo, old_addr_be, old_port_be)
}

/// Updates the TCP/UDP checksum for a rewrite from `old_addr_be:old_port_be`.
/// Through the kernel's helper, which alone knows whether the skb carries a
/// full checksum or a partial one for the device to finish
/// (`CHECKSUM_PARTIAL`: only the address, part of the pseudo-header, may
/// change it then). A UDP checksum of zero ("none") stays zero.
#[inline(always)]
pub(crate) fn l4_checksum(
    ctx: &TcContext,
    todo: &Rewrite,
    old_addr_be: u32,
    old_port_be: u16,
) -> Result<(), RewriteFailed> {
    let (csum_off, l4_flags) = if todo.proto == proto::TCP {
        (todo.l4_off + TCP_CSUM_OFF, 0)
    } else {
        (todo.l4_off + UDP_CSUM_OFF, u64::from(BPF_F_MARK_MANGLED_0))
    };
    if old_addr_be != todo.new_addr_be {
        ctx.l4_csum_replace(
            csum_off,
            u64::from(old_addr_be),
            u64::from(todo.new_addr_be),
            u64::from(BPF_F_PSEUDO_HDR) | l4_flags | 4,
        )
        .map_err(|_| RewriteFailed)?;
    }
    if old_port_be != todo.new_port_be {
        ctx.l4_csum_replace(
            csum_off,
            u64::from(old_port_be),
            u64::from(todo.new_port_be),
            l4_flags | 2,
        )
        .map_err(|_| RewriteFailed)?;
    }
    Ok(())
}
