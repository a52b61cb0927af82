//! What ICMP and ICMPv6 errors do differently ([`IcmpFamily`]), IPv4 and
//! IPv6 side by side, and the parse of an error and its quote, written
//! once over it ([`quote_of`]).
use aya_ebpf::programs::TcContext;
use proxy_common::{proto, Addr6Be};

use crate::{
    family::Family,
    packet::v6::{csum_replace16, load, IPV6_HLEN},
    packet::{
        csum_replace4, FlowOf, Ipv4Hdr, Skip, ETH_HLEN, IPV4_MIN_HLEN, IP_FRAG_MASK,
        IP_OFFSET_MASK, TCP_CSUM_OFF, UDP_CSUM_OFF,
    },
};

/// ICMP (ICMPv6) header: type, code, checksum, 4 bytes of the type's own.
pub(crate) const ICMP_HLEN: usize = 8;
/// IPv4 error types translated: destination unreachable (fragmentation
/// needed included), time exceeded, parameter problem.
const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_TIME_EXCEEDED: u8 = 11;
const ICMP_PARAMETER_PROB: u8 = 12;
/// ICMPv6 error types are 1 to 4 (RFC 4443): destination unreachable,
/// packet too big, time exceeded, parameter problem.
const ICMPV6_ERROR_MAX: u8 = 4;
/// Where the IPv4 header checksum lies in the header.
const IP_CSUM_AT: usize = 10;

/// An address family's ICMP errors: which types are errors, how the outer
/// and the quoted header are read, and the family's checksum rules (an
/// IPv4 header has its own checksum, also in the quote; the ICMPv6
/// checksum covers the outer pseudo-header instead). The addresses lie
/// where [`crate::rewrite::Header`] says, in the outer and in the quoted
/// header alike.
pub(crate) trait IcmpFamily: Family {
    /// Whether the ICMP checksum covers the outer addresses (ICMPv6's
    /// pseudo-header).
    const PSEUDO_HEADER: bool;
    /// Where the header's own checksum lies in it (IPv4), if it has one.
    const HEADER_CSUM_AT: Option<usize>;
    /// Whether an ICMP message of `icmp_type` is an error this translates.
    fn is_error(icmp_type: u8) -> bool;
    /// The outer header of an ICMP message (its addresses, and `l4_off`
    /// where the ICMP header starts, into `flow`): IPv4 reads it here (the
    /// parser stopped at the protocol), unfragmented; IPv6's parser left
    /// it there already (an ICMPv6 message in fragments is not ours).
    fn outer(ctx: &TcContext, flow: &mut FlowOf<Self>) -> Result<(), Skip>;
    /// The quoted header at `off`, when it is followed by TCP or UDP (a
    /// whole packet or the first fragment).
    fn quoted(ctx: &TcContext, off: usize) -> Result<Inner, Skip>;
    /// A checksum after an address changed from `old` to `new`.
    fn csum_addr(csum: u16, old: &Self, new: &Self) -> u16;
}

/// The quoted header, as read.
#[derive(Clone, Copy)]
pub(crate) struct Inner {
    /// Where the quoted TCP or UDP header starts.
    pub l4: usize,
    pub proto: u8,
    /// The quoted header's checksum (IPv4; 0 for IPv6).
    pub csum_be: u16,
}

/// The IPv4 header at `off`: its fixed part and its length.
#[inline(always)]
fn header4(ctx: &TcContext, off: usize) -> Result<(Ipv4Hdr, usize), Skip> {
    let ip: Ipv4Hdr = load(ctx, off).map_err(|_| Skip::NotOurs)?;
    let ihl = usize::from(ip.version_ihl & 0x0f) * 4;
    if ip.version_ihl >> 4 != 4 || ihl < IPV4_MIN_HLEN {
        return Err(Skip::NotOurs);
    }
    Ok((ip, ihl))
}

impl IcmpFamily for u32 {
    const PSEUDO_HEADER: bool = false;
    const HEADER_CSUM_AT: Option<usize> = Some(IP_CSUM_AT);
    #[inline(always)]
    fn is_error(icmp_type: u8) -> bool {
        matches!(
            icmp_type,
            ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROB
        )
    }
    #[inline(always)]
    fn outer(ctx: &TcContext, flow: &mut FlowOf<u32>) -> Result<(), Skip> {
        let (ip, ihl) = header4(ctx, ETH_HLEN)?;
        if u16::from_be(ip.frag_off_be) & IP_FRAG_MASK != 0 {
            return Err(Skip::NotOurs);
        }
        flow.saddr_be = ip.saddr_be;
        flow.daddr_be = ip.daddr_be;
        flow.l4_off = ETH_HLEN + ihl;
        Ok(())
    }
    #[inline(always)]
    fn quoted(ctx: &TcContext, off: usize) -> Result<Inner, Skip> {
        let (ip, ihl) = header4(ctx, off)?;
        if (ip.proto != proto::TCP && ip.proto != proto::UDP)
            || u16::from_be(ip.frag_off_be) & IP_OFFSET_MASK != 0
        {
            return Err(Skip::NotOurs);
        }
        Ok(Inner {
            l4: off + ihl,
            proto: ip.proto,
            csum_be: ip.csum_be,
        })
    }
    #[inline(always)]
    fn csum_addr(csum: u16, old: &u32, new: &u32) -> u16 {
        csum_replace4(csum, *old, *new)
    }
}

impl IcmpFamily for Addr6Be {
    const PSEUDO_HEADER: bool = true;
    const HEADER_CSUM_AT: Option<usize> = None;
    /// Informational messages (echo, neighbour discovery: 128 and up) are
    /// never translated.
    #[inline(always)]
    fn is_error(icmp_type: u8) -> bool {
        icmp_type != 0 && icmp_type <= ICMPV6_ERROR_MAX
    }
    #[inline(always)]
    fn outer(_ctx: &TcContext, _flow: &mut FlowOf<Addr6Be>) -> Result<(), Skip> {
        Ok(())
    }
    /// A quote with extension headers before TCP/UDP is not translated.
    #[inline(always)]
    fn quoted(ctx: &TcContext, off: usize) -> Result<Inner, Skip> {
        let word1: [u32; 2] = load(ctx, off).map_err(|_| Skip::NotOurs)?;
        let next = (u32::from_be(word1[1]) >> 8) as u8;
        if u32::from_be(word1[0]) >> 28 != 6 || (next != proto::TCP && next != proto::UDP) {
            return Err(Skip::NotOurs);
        }
        Ok(Inner {
            l4: off + IPV6_HLEN,
            proto: next,
            csum_be: 0,
        })
    }
    #[inline(always)]
    fn csum_addr(csum: u16, old: &Addr6Be, new: &Addr6Be) -> u16 {
        csum_replace16(csum, old, new)
    }
}

/// An ICMP error and the start of the packet it quotes, as parsed.
#[derive(Clone, Copy)]
pub(crate) struct Quote {
    pub icmp_off: usize,
    pub icmp_csum_be: u16,
    /// The quoted header.
    pub inner_off: usize,
    pub inner: Inner,
    /// The quoted ports, as in the packet.
    pub ports: [u16; 2],
}

/// The ICMP message of the packet (outer addresses into `flow`), if it
/// is an error quoting a TCP or UDP packet that is no later fragment;
/// anything else is not ours.
#[inline(always)]
pub(crate) fn quote_of<A: IcmpFamily>(
    ctx: &TcContext,
    flow: &mut FlowOf<A>,
) -> Result<Quote, Skip> {
    A::outer(ctx, flow)?;
    let icmp_off = flow.l4_off;
    let head: [u8; 4] = load(ctx, icmp_off).map_err(|_| Skip::NotOurs)?;
    if !A::is_error(head[0]) {
        return Err(Skip::NotOurs);
    }
    let inner_off = icmp_off + ICMP_HLEN;
    let inner = A::quoted(ctx, inner_off)?;
    let ports: [u16; 2] = load(ctx, inner.l4).map_err(|_| Skip::NotOurs)?;
    Ok(Quote {
        icmp_off,
        icmp_csum_be: u16::from_ne_bytes([head[2], head[3]]),
        inner_off,
        inner,
        ports,
    })
}

/// Where the quoted TCP or UDP checksum lies.
#[inline(always)]
pub(crate) fn l4_csum_off(inner: &Inner) -> usize {
    match inner.proto {
        proto::UDP => inner.l4 + UDP_CSUM_OFF,
        _ => inner.l4 + TCP_CSUM_OFF,
    }
}

/// The quoted TCP/UDP checksum (old, new: `update` of the old), where the
/// quote holds it (UDP's lies in the first 8 bytes; TCP's at offset 16
/// only when more is quoted, as Linux does, else it is left). A UDP
/// checksum of 0 ("none") stays 0 and a computed 0 is written 0xffff.
#[inline(always)]
pub(crate) fn quoted_csum(
    ctx: &TcContext,
    inner: &Inner,
    update: impl FnOnce(u16) -> u16,
) -> Option<(u16, u16)> {
    match load::<u16>(ctx, l4_csum_off(inner)) {
        Ok(old) if inner.proto == proto::TCP || old != 0 => {
            let new = update(old);
            match inner.proto == proto::UDP && new == 0 {
                true => Some((old, 0xffff)),
                false => Some((old, new)),
            }
        }
        _ => None,
    }
}
