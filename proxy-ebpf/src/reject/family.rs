//! What the families' answers do differently ([`RejectFamily`]), IPv4 and
//! IPv6 side by side: the header an answer carries, the ICMP types and
//! codes, what is quoted, and which packets may be answered at all.
use proxy_common::{proto, Addr6Be};

use crate::{
    family::Family,
    packet::{
        ctx::LoadBytes,
        v6::{is_unicast, load, IP6_L4_OFF},
        FlowOf, ETH_HLEN, IPV4_MIN_HLEN, IP_OFFSET_MASK,
    },
    rewrite::Header,
};

use super::{fold, sum_words, Answer, AnswerCtx};

/// The answer's TTL (hop limit).
const TTL: u8 = 64;

/// An address family's answers ([`crate::reject`]): see the module's
/// documentation for what each family sends.
pub(crate) trait RejectFamily: Family {
    /// Where the answer's L4 header starts: after a header without options
    /// or extension headers, the only kind answered.
    const L4_OFF: usize;
    /// The family's ICMP: its protocol number, and whether its checksum
    /// covers the pseudo-header (ICMPv6).
    const ICMP_PROTO: u8;
    const ICMP_PSEUDO_HEADER: bool;
    /// Type and code of a port unreachable, and of a "too big".
    const UNREACHABLE: (u8, u8);
    const TOO_BIG: (u8, u8);
    /// What a "too big" quotes beyond the header and 8 bytes: IPv6 quotes 16
    /// (a first fragment's fragment header, then the UDP header).
    const TOO_BIG_MORE: usize;
    /// Whether TCP is answered with a RST (IPv6) rather than with the
    /// port unreachable (IPv4, as kube-proxy's REJECT rules answer).
    const TCP_RST: bool;
    /// Whether `flow` may be answered with `answer`: a header of the size
    /// the answer quotes, and a source that is one host.
    fn answerable(flow: &FlowOf<Self>, answer: Answer) -> bool;
    /// Whether the quote, as loaded, may be answered.
    fn quotable(quote: &Self::Quote) -> bool;
    /// The one's-complement sum of the quote's words, and of an address's.
    fn quote_sum(quote: &Self::Quote) -> u64;
    fn addr_sum(addr: &Self) -> u64;
    /// Bytes of options an ICMP answer carries before its ICMP header when
    /// it is written over a packet whose checksum is partial
    /// ([`super::shielded_checksum`]); 0: the family's answers go
    /// unshielded.
    const SHIELD_OPT_LEN: usize;
    /// Sets the quoted header's identification to `id` (bytes in network
    /// order), its header checksum kept valid (the answer's shield; IPv6
    /// headers have no such field and are never shielded).
    fn set_quoted_id(quote: &mut Self::Quote, id: [u8; 2]);
    /// The type of service an answer quoting `quote` carries.
    fn tos(quote: &Self::Quote) -> u8;
    /// The length of the packet's L4 segment, as its header says.
    fn l4_len(ctx: &impl LoadBytes) -> Result<u32, ()>;
    /// Writes the answer's IP header from `src` to `dst`, carrying
    /// `payload_len` bytes of protocol `next` with type of service `tos`,
    /// and `opt_len` bytes of options (end of the option list, zeros;
    /// IPv4 only: IPv6 passes 0).
    fn put_header<C: AnswerCtx>(
        ctx: &C,
        src: &Self,
        dst: &Self,
        payload: (usize, u8),
        tos: u8,
        opt_len: usize,
    ) -> Result<(), ()>;
}

impl RejectFamily for u32 {
    const L4_OFF: usize = ETH_HLEN + IPV4_MIN_HLEN;
    const ICMP_PROTO: u8 = proto::ICMP;
    const ICMP_PSEUDO_HEADER: bool = false;
    const UNREACHABLE: (u8, u8) = (3, 3);
    const TOO_BIG: (u8, u8) = (3, 4);
    const TOO_BIG_MORE: usize = 0;
    const TCP_RST: bool = false;
    const SHIELD_OPT_LEN: usize = 4;
    /// A fixed 20-byte header: RFC 792 asks to quote options too, and a
    /// fixed quote keeps the copy constant-size. Not 0.0.0.0, multicast or
    /// the limited broadcast (RFC 1122 3.2.2).
    #[inline(always)]
    fn answerable(flow: &FlowOf<u32>, _answer: Answer) -> bool {
        let first = flow.saddr_be.to_ne_bytes()[0];
        flow.l4_off == Self::L4_OFF
            && flow.saddr_be != 0
            && flow.saddr_be != u32::MAX
            && !(224..240).contains(&first)
    }
    /// A later fragment's bytes after the header are not the L4 header.
    #[inline(always)]
    fn quotable(quote: &[u32; 7]) -> bool {
        let b = quote[1].to_ne_bytes();
        u16::from_be_bytes([b[2], b[3]]) & IP_OFFSET_MASK == 0
    }
    #[inline(always)]
    fn quote_sum(quote: &[u32; 7]) -> u64 {
        sum_words(quote)
    }
    #[inline(always)]
    fn addr_sum(addr: &u32) -> u64 {
        u64::from(*addr)
    }
    #[inline(always)]
    fn set_quoted_id(quote: &mut [u32; 7], id: [u8; 2]) {
        let b = quote[1].to_ne_bytes();
        quote[1] = u32::from_ne_bytes([id[0], id[1], b[2], b[3]]);
        let c = quote[2].to_ne_bytes();
        quote[2] = u32::from_ne_bytes([c[0], c[1], 0, 0]);
        let header = [quote[0], quote[1], quote[2], quote[3], quote[4]];
        let sum = fold(sum_words(&header)).to_ne_bytes();
        quote[2] = u32::from_ne_bytes([c[0], c[1], sum[0], sum[1]]);
    }
    /// The original's.
    #[inline(always)]
    fn tos(quote: &[u32; 7]) -> u8 {
        quote[0].to_ne_bytes()[1]
    }
    #[inline(always)]
    fn l4_len(ctx: &impl LoadBytes) -> Result<u32, ()> {
        let total = load::<u16>(ctx, ETH_HLEN + 2).map_err(|_| ())?;
        Ok(u32::from(u16::from_be(total)).saturating_sub(IPV4_MIN_HLEN as u32))
    }
    /// Identification 0, no DF, and a fresh header checksum.
    #[inline(always)]
    fn put_header<C: AnswerCtx>(
        ctx: &C,
        src: &u32,
        dst: &u32,
        (payload_len, next): (usize, u8),
        tos: u8,
        opt_len: usize,
    ) -> Result<(), ()> {
        let hlen = IPV4_MIN_HLEN + opt_len;
        let [len_hi, len_lo] = ((hlen + payload_len) as u16).to_be_bytes();
        let version_ihl = 0x40 | (hlen / 4) as u8;
        let mut hdr: [u32; 5] = [
            u32::from_ne_bytes([version_ihl, tos, len_hi, len_lo]),
            0,
            u32::from_ne_bytes([TTL, next, 0, 0]),
            *src,
            *dst,
        ];
        let c = fold(sum_words(&hdr)).to_ne_bytes();
        hdr[2] = u32::from_ne_bytes([TTL, next, c[0], c[1]]);
        ctx.put(ETH_HLEN, &hdr)?;
        if opt_len != 0 {
            // End of the option list, and padding: no word of it adds to
            // a sum.
            ctx.put(ETH_HLEN + IPV4_MIN_HLEN, &0u32)?;
        }
        Ok(())
    }
}

impl RejectFamily for Addr6Be {
    const L4_OFF: usize = IP6_L4_OFF;
    const ICMP_PROTO: u8 = proto::ICMPV6;
    const ICMP_PSEUDO_HEADER: bool = true;
    const UNREACHABLE: (u8, u8) = (1, 4);
    const TOO_BIG: (u8, u8) = (2, 0);
    const TOO_BIG_MORE: usize = 8;
    const TCP_RST: bool = true;
    const SHIELD_OPT_LEN: usize = 0;
    /// No extension headers (the fixed-size quote would cut them): a port
    /// unreachable answers no fragment, a "too big" also the first fragment
    /// (its fragment header quoted). Not `::` nor multicast (RFC 4443 2.4
    /// (e)).
    #[inline(always)]
    fn answerable(flow: &FlowOf<Addr6Be>, answer: Answer) -> bool {
        let quoted = match answer {
            Answer::Unreachable => flow.l4_off == Self::L4_OFF && !flow.first_fragment,
            Answer::TooBig(_) => {
                flow.l4_off == Self::L4_OFF
                    || (flow.first_fragment && flow.l4_off == Self::L4_OFF + 8)
            }
        };
        quoted && is_unicast(&flow.saddr_be)
    }
    #[inline(always)]
    fn quotable(_quote: &[u32; 12]) -> bool {
        true
    }
    #[inline(always)]
    fn quote_sum(quote: &[u32; 12]) -> u64 {
        sum_words(quote)
    }
    #[inline(always)]
    fn addr_sum(addr: &Addr6Be) -> u64 {
        sum_words(addr)
    }
    /// Never called ([`Self::SHIELD_OPT_LEN`] is 0).
    #[inline(always)]
    fn set_quoted_id(_quote: &mut [u32; 12], _id: [u8; 2]) {}
    /// Traffic class 0.
    #[inline(always)]
    fn tos(_quote: &[u32; 12]) -> u8 {
        0
    }
    #[inline(always)]
    fn l4_len(ctx: &impl LoadBytes) -> Result<u32, ()> {
        let payload_len = load::<u16>(ctx, ETH_HLEN + 4).map_err(|_| ())?;
        Ok(u32::from(u16::from_be(payload_len)))
    }
    /// Flow label 0.
    #[inline(always)]
    fn put_header<C: AnswerCtx>(
        ctx: &C,
        src: &Addr6Be,
        dst: &Addr6Be,
        (payload_len, next): (usize, u8),
        tos: u8,
        _opt_len: usize,
    ) -> Result<(), ()> {
        let fixed: [u32; 2] = [
            (0x6000_0000u32 | u32::from(tos) << 20).to_be(),
            ((payload_len as u32) << 16 | u32::from(next) << 8 | u32::from(TTL)).to_be(),
        ];
        ctx.put(ETH_HLEN, &fixed)?;
        ctx.put(Self::SADDR_OFF, src)?;
        ctx.put(Self::DADDR_OFF, dst)
    }
}
