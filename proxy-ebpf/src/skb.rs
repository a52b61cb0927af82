//! Access to a tc program's packet (`TcContext`): bounds-checked pointers into
//! the linear data (pulling it in when needed), the ethertype, the IPv4
//! parser of the tc programs, the verdicts a tc program returns for packets
//! it leaves alone or drops (counted), and the tail call that hands an IPv6
//! packet to its program.
use crate::maps::SB_TAIL6_V1;
use crate::{
    maps::count,
    packet::{
        Flow, Ipv4Hdr, Skip, ETH_HLEN, IPV4_MIN_HLEN, IP_FRAG_MASK, IP_OFFSET_MASK, TCP_HLEN,
        UDP_HLEN,
    },
};
use aya_ebpf::{
    bindings::{TC_ACT_SHOT, TC_ACT_UNSPEC},
    programs::TcContext,
};
use core::mem::size_of;
use proxy_common::{proto, stat};

/// Lets a packet we leave alone continue untouched, counting only the odd
/// ones: counting every packet of the node would cost each a map update.
#[inline(always)]
pub fn pass(skip: Skip) -> i32 {
    match skip {
        Skip::NotOurs | Skip::Icmp => {}
        Skip::Malformed => count(stat::MALFORMED),
        Skip::Fragment => count(stat::FRAGMENT),
    }
    TC_ACT_UNSPEC
}

/// Drops a packet, counting why.
#[inline(always)]
pub(crate) fn drop_counted(stat_index: u32) -> Result<i32, Skip> {
    count(stat_index);
    Ok(TC_ACT_SHOT)
}

/// Makes sure the first `len` bytes of the frame are in the linear area,
/// pulling them in if the packet is long enough but not linear.
#[inline(always)]
pub(crate) fn ensure_linear(ctx: &TcContext, len: usize) -> Result<(), Skip> {
    if ctx.data() + len <= ctx.data_end() {
        return Ok(());
    }
    if (ctx.len() as usize) < len {
        return Err(Skip::Malformed);
    }
    ctx.pull_data(len as u32).map_err(|_| Skip::Malformed)?;
    if ctx.data() + len <= ctx.data_end() {
        Ok(())
    } else {
        Err(Skip::Malformed)
    }
}

/// A bounds-checked pointer into the linear packet data.
#[inline(always)]
pub(crate) fn ptr_at<T>(ctx: &TcContext, off: usize) -> Result<*const T, Skip> {
    let start = ctx.data();
    if start + off + size_of::<T>() > ctx.data_end() {
        return Err(Skip::Malformed);
    }
    Ok((start + off) as *const T)
}

/// The frame's ethertype (network order), read from the linear area.
#[inline(always)]
pub(crate) fn ethertype(ctx: &TcContext) -> Result<u16, Skip> {
    if (ctx.len() as usize) < ETH_HLEN + 2 {
        return Err(Skip::NotOurs);
    }
    ensure_linear(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the two bytes lie inside the packet.
    Ok(unsafe { *ptr_at::<u16>(ctx, 12)? })
}

/// An IPv4 TCP/UDP packet's flow (the caller checked the ethertype);
/// anything else is skipped.
#[inline(always)]
pub(crate) fn parse_ipv4(ctx: &TcContext) -> Result<Flow, Skip> {
    ensure_linear(ctx, ETH_HLEN + IPV4_MIN_HLEN)?;
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the whole fixed header lies inside the packet.
    let (version_ihl, ip_proto, frag_off_be, tot_len_be, saddr_be, daddr_be) = unsafe {
        (
            (*ip).version_ihl,
            (*ip).proto,
            (*ip).frag_off_be,
            (*ip).tot_len_be,
            (*ip).saddr_be,
            (*ip).daddr_be,
        )
    };
    let l4_min = match ip_proto {
        proto::TCP => TCP_HLEN,
        proto::UDP => UDP_HLEN,
        proto::ICMP => return Err(Skip::Icmp),
        _ => return Err(Skip::NotOurs),
    };
    if version_ihl >> 4 != 4 {
        return Err(Skip::Malformed);
    }
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    if ihl < IPV4_MIN_HLEN {
        return Err(Skip::Malformed);
    }
    let frag = u16::from_be(frag_off_be) & IP_FRAG_MASK;
    if frag & IP_OFFSET_MASK != 0 {
        // No ports in it: it follows its first fragment ([`crate::frag`]).
        return Err(Skip::Fragment);
    }
    if usize::from(u16::from_be(tot_len_be)) < ihl + l4_min {
        return Err(Skip::Malformed);
    }
    let l4_off = ETH_HLEN + ihl;
    ensure_linear(ctx, l4_off + l4_min)?;
    let ports = ptr_at::<[u16; 2]>(ctx, l4_off)?;
    // SAFETY: `ptr_at` checked both ports lie inside the packet.
    let (sport_be, dport_be) = unsafe { ((*ports)[0], (*ports)[1]) };
    let tcp_flags = if ip_proto == proto::TCP {
        // SAFETY: `ptr_at` checked the byte lies inside the packet.
        unsafe { *ptr_at::<u8>(ctx, l4_off + 13)? }
    } else {
        0
    };
    Ok(Flow {
        saddr_be,
        daddr_be,
        sport_be,
        dport_be,
        proto: ip_proto,
        tcp_flags,
        l4_off,
        first_fragment: frag != 0,
    })
}

/// Tail-calls the IPv6 program `slot` (`tail::FROM_POD6`, `tail::TO_POD6`).
/// Returns only if the call failed (the agent has not filled the array
/// yet): the packet passes untouched, counted.
#[inline(always)]
pub fn hand_over6(ctx: &TcContext, slot: u32) -> i32 {
    // SAFETY: a tail call with our own context and program array; on success
    // it does not return.
    unsafe { SB_TAIL6_V1.tail_call(ctx, slot) };
    count(stat::TAIL_CALL_MISSED);
    TC_ACT_UNSPEC
}
