//! What the tc pod path knows about an IPv6 packet: the header layout, the
//! extension-header walk, the flow a TCP or UDP packet belongs to, and the
//! checksum arithmetic over 128-bit addresses.
//!
//! A plain TCP or UDP packet (no extension header, headers in the linear
//! data) is read in place. Anything else takes the walk, which reads through
//! `bpf_skb_load_bytes` (`TcContext::load`): the offsets it computes are
//! variable, and a helper read needs no packet
//! pointer arithmetic the verifier would have to follow, nor a linear area.
use core::{
    ffi::c_void,
    mem::{size_of, MaybeUninit},
};

use proxy_common::{proto, Addr6Be};

use crate::packet::{
    ctx::{ptr_at, LoadBytes, PacketCtx},
    Flow6, Kind, Skip, ETH_HLEN, TCP_HLEN, UDP_HLEN,
};

pub const ETH_P_IPV6_BE: u16 = 0x86ddu16.to_be();
pub const IPV6_HLEN: usize = 40;
/// Offsets (from the start of the frame) of the IPv6 header's fields.
pub const IP6_SADDR_OFF: usize = ETH_HLEN + 8;
pub const IP6_DADDR_OFF: usize = ETH_HLEN + 24;
/// Offset of the hop limit from the start of the frame.
pub const IP6_HOP_LIMIT_OFF: usize = ETH_HLEN + 7;
/// Where the next header starts when there are no extension headers.
pub const IP6_L4_OFF: usize = ETH_HLEN + IPV6_HLEN;

/// Extension headers the walk steps over ([`MAX_EXT_HEADERS`] at most).
pub const NEXTHDR_HOP: u8 = 0;
pub const NEXTHDR_ROUTING: u8 = 43;
pub const NEXTHDR_FRAGMENT: u8 = 44;
pub const NEXTHDR_DEST: u8 = 60;
/// More extension headers than this: not ours (passed untouched).
pub const MAX_EXT_HEADERS: usize = 4;
/// Fragment offset (host order, in 8-byte units, shifted by 3) and the
/// more-fragments bit of the fragment header's second word.
const FRAG_OFFSET_MASK: u16 = 0xfff8;
const FRAG_MORE: u16 = 0x0001;

/// Reads a `T` at `off` through the load helper: `Malformed` when the packet
/// is shorter.
#[inline(always)]
pub fn load<T>(ctx: &impl LoadBytes, off: usize) -> Result<T, Skip> {
    let mut value = MaybeUninit::<T>::uninit();
    // SAFETY: the helper writes exactly `size_of::<T>()` bytes to `value`.
    let ret = unsafe {
        ctx.load_raw(
            off as u32,
            value.as_mut_ptr() as *mut c_void,
            size_of::<T>() as u32,
        )
    };
    if ret == 0 {
        // SAFETY: fully written by the helper; every `T` used here is plain
        // data valid for any bytes.
        Ok(unsafe { value.assume_init() })
    } else {
        Err(Skip::Malformed)
    }
}

/// Copies `size_of::<T>()` bytes at `off` into `dst` (which may be map
/// memory): `Malformed` when the packet is shorter.
#[inline(always)]
pub fn load_into<T>(ctx: &impl LoadBytes, off: usize, dst: &mut T) -> Result<(), Skip> {
    // SAFETY: the helper writes exactly `size_of::<T>()` bytes to `dst`,
    // which is that large. Every `T` used here is plain data valid for any
    // bytes.
    let ret = unsafe {
        ctx.load_raw(
            off as u32,
            dst as *mut T as *mut c_void,
            size_of::<T>() as u32,
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(Skip::Malformed)
    }
}

/// Word-by-word address comparison (a slice comparison would call `bcmp`).
#[inline(always)]
pub fn eq6(a: &Addr6Be, b: &Addr6Be) -> bool {
    a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]
}

/// The common case, read in place without a helper call: TCP or UDP right
/// after the fixed header (no extension header), both headers inside the
/// directly readable data. Whether it was that case (then `flow` holds the
/// packet); anything else is left to the walk of [`parse6`], which decides
/// it (and reads what is not linear).
#[inline(always)]
fn parse6_plain<C: PacketCtx>(ctx: &C, flow: &mut Flow6) -> bool {
    let Ok(ip) = ptr_at::<[u32; 10]>(ctx, ETH_HLEN) else {
        return false;
    };
    // SAFETY: `ptr_at` checked the 40-byte header lies inside the packet.
    let (word0, word1) = unsafe { ((*ip)[0], (*ip)[1]) };
    let next = (u32::from_be(word1) >> 8) as u8;
    let l4_min = match next {
        proto::TCP => TCP_HLEN,
        proto::UDP => UDP_HLEN,
        _ => return false,
    };
    if u32::from_be(word0) >> 28 != 6 || ((u32::from_be(word1) >> 16) as usize) < l4_min {
        return false;
    }
    let (Ok(_whole), Ok(ports)) = (
        ptr_at::<[u8; UDP_HLEN]>(ctx, IP6_L4_OFF + l4_min - UDP_HLEN),
        ptr_at::<[u16; 2]>(ctx, IP6_L4_OFF),
    ) else {
        return false;
    };
    let tcp_flags = if next == proto::TCP {
        match ptr_at::<u8>(ctx, IP6_L4_OFF + 13) {
            // SAFETY: `ptr_at` checked the byte lies inside the packet.
            Ok(flags) => unsafe { *flags },
            Err(_) => return false,
        }
    } else {
        0
    };
    // SAFETY: `ptr_at` checked the header and both ports lie inside the
    // packet; reads.
    unsafe {
        flow.saddr_be = [(*ip)[2], (*ip)[3], (*ip)[4], (*ip)[5]];
        flow.daddr_be = [(*ip)[6], (*ip)[7], (*ip)[8], (*ip)[9]];
        flow.sport_be = (*ports)[0];
        flow.dport_be = (*ports)[1];
    }
    flow.frag_id_be = 0;
    flow.proto = next;
    flow.tcp_flags = tcp_flags;
    flow.first_fragment = false;
    flow.l4_off = IP6_L4_OFF;
    true
}

/// Parses an IPv6 frame (the caller checked the ethertype) into `flow`: the
/// fixed header, then at most [`MAX_EXT_HEADERS`] hop-by-hop, routing,
/// destination options and fragment headers, then TCP or UDP, a later
/// fragment, or ICMPv6. Anything else (more extension headers, AH, ESP, no
/// next header, other protocols) is not ours; a packet shorter than what it
/// announces is malformed.
#[inline(always)]
pub fn parse6<C: LoadBytes + PacketCtx>(ctx: &C, flow: &mut Flow6) -> Result<Kind, Skip> {
    if parse6_plain(ctx, flow) {
        return Ok(Kind::Flow);
    }
    let word1: [u32; 2] = load(ctx, ETH_HLEN)?;
    if u32::from_be(word1[0]) >> 28 != 6 {
        return Err(Skip::NotOurs);
    }
    let payload_len = (u32::from_be(word1[1]) >> 16) as usize;
    let mut next = (u32::from_be(word1[1]) >> 8) as u8;
    load_into(ctx, IP6_SADDR_OFF, &mut flow.saddr_be)?;
    load_into(ctx, IP6_DADDR_OFF, &mut flow.daddr_be)?;
    flow.first_fragment = false;
    flow.frag_id_be = 0;
    flow.sport_be = 0;
    flow.dport_be = 0;
    flow.tcp_flags = 0;
    let mut off = IP6_L4_OFF;
    let mut i = 0;
    while i < MAX_EXT_HEADERS + 1 {
        match next {
            proto::TCP | proto::UDP | proto::ICMPV6 => break,
            NEXTHDR_HOP | NEXTHDR_ROUTING | NEXTHDR_DEST | NEXTHDR_FRAGMENT => {}
            _ => return Err(Skip::NotOurs),
        }
        if i == MAX_EXT_HEADERS {
            return Err(Skip::NotOurs);
        }
        let ext: [u8; 8] = load(ctx, off)?;
        if next == NEXTHDR_FRAGMENT {
            let frag = u16::from_be_bytes([ext[2], ext[3]]);
            let id_be = u32::from_ne_bytes([ext[4], ext[5], ext[6], ext[7]]);
            if frag & FRAG_OFFSET_MASK != 0 {
                if ext[0] != proto::TCP && ext[0] != proto::UDP {
                    return Err(Skip::NotOurs);
                }
                flow.proto = ext[0];
                flow.frag_id_be = id_be;
                return Ok(Kind::Later);
            }
            if frag & FRAG_MORE != 0 {
                flow.first_fragment = true;
                flow.frag_id_be = id_be;
            }
            off += 8;
        } else {
            off += (usize::from(ext[1]) + 1) * 8;
        }
        next = ext[0];
        i += 1;
    }
    flow.proto = next;
    flow.l4_off = off;
    if next == proto::ICMPV6 {
        if flow.first_fragment {
            // An ICMPv6 message cut in fragments: nothing we translate.
            return Err(Skip::NotOurs);
        }
        return Ok(Kind::Icmp);
    }
    let l4_min = if next == proto::TCP {
        TCP_HLEN
    } else {
        UDP_HLEN
    };
    if payload_len + IP6_L4_OFF < off + l4_min {
        return Err(Skip::Malformed);
    }
    // The whole fixed L4 header must be there, as for IPv4.
    let _: u32 = load(ctx, off + l4_min - 4)?;
    let ports: [u16; 2] = load(ctx, off)?;
    flow.sport_be = ports[0];
    flow.dport_be = ports[1];
    if next == proto::TCP {
        flow.tcp_flags = load::<u8>(ctx, off + 13)?;
    }
    Ok(Kind::Flow)
}

/// One's-complement sum (unfolded, 32 bits) of the change from `old` to
/// `new`: what `bpf_l4_csum_replace` adds for a changed 16-byte field when
/// given size 0 (as `bpf_csum_diff` would compute it, without the helper).
#[inline(always)]
pub fn addr_diff(old: &Addr6Be, new: &Addr6Be) -> u32 {
    let mut sum: u64 = 0;
    let mut i = 0;
    while i < 4 {
        sum += u64::from(!old[i]) + u64::from(new[i]);
        i += 1;
    }
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum as u32
}

/// A checksum after a 16-byte field changed from `old` to `new`.
#[inline(always)]
pub fn csum_replace16(csum: u16, old: &Addr6Be, new: &Addr6Be) -> u16 {
    let mut c = csum;
    let mut i = 0;
    while i < 4 {
        c = crate::packet::csum_replace4(c, old[i], new[i]);
        i += 1;
    }
    c
}

/// Whether an IPv6 address is one host that may be answered: not the
/// unspecified address, not multicast (RFC 4443 2.4 (e)).
#[inline(always)]
pub fn is_unicast(addr: &Addr6Be) -> bool {
    let first = addr[0].to_ne_bytes()[0];
    first != 0xff && (addr[0] | addr[1] | addr[2] | addr[3]) != 0
}
