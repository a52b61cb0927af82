//! What the families' answers do differently ([`RejectFamily`]), IPv4 and
//! IPv6 side by side: the header an answer carries, the ICMP types and
//! codes, what is quoted, and which packets may be answered at all.
use proxy_common::{proto, Addr6Be};

use crate::{
    family::Family,
    packet::{
        ctx::LoadBytes,
        v6::{is_unicast, load, IP6_L4_OFF, NEXTHDR_DEST},
        FlowOf, ETH_HLEN, IPV4_MIN_HLEN, IP_OFFSET_MASK,
    },
    rewrite::Header,
};

use super::{fold, sum_words, Answer, AnswerCtx, Shield};

/// The answer's TTL (hop limit).
const TTL: u8 = 64;

/// An IPv6 option type a receiver skips without a word (RFC 4727's
/// experimental type 0x1e: the top bits 00), the shield's.
const SKIPPED_OPTION: u8 = 0x1e;

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
    /// Bytes of options (IPv4) or of the destination options header (IPv6)
    /// an ICMP answer carries before its ICMP header when it is written
    /// over a packet whose checksum is partial ([`Shield`]).
    const SHIELD_OPT_LEN: usize;
    /// The shield of an ICMP answer to a packet of protocol `proto_nr`,
    /// quoting `quote` (which it may change): `sum` is the sum of the ICMP
    /// message's words but the quote and the checksum (its pseudo-header's
    /// included), `pseudo` the pseudo-header's alone; `rest` is the ICMP
    /// header's second word, whose unused bits it may fill.
    fn shield(
        proto_nr: u8,
        quote: &mut Self::Quote,
        sum: u64,
        pseudo: u64,
        rest: &mut u32,
    ) -> Shield;
    /// The type of service an answer quoting `quote` carries.
    fn tos(quote: &Self::Quote) -> u8;
    /// The length of the packet's L4 segment, as its header says.
    fn l4_len(ctx: &impl LoadBytes) -> Result<u32, ()>;
    /// Writes the answer's IP header from `src` to `dst`, carrying
    /// `payload_len` bytes of protocol `next` with type of service `tos`,
    /// and a shield's options or destination options header, if any.
    fn put_header<C: AnswerCtx>(
        ctx: &C,
        src: &Self,
        dst: &Self,
        payload: (usize, u8),
        tos: u8,
        opts: Option<&[u32; 2]>,
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
    /// 4 bytes of options (end of list, zeros): the store's sum is the ICMP
    /// message's own, all ones when its checksum is valid, so the store
    /// writes 0xffff. For TCP it lands on the quoted identification, set to
    /// 0xffff (the quoted header's checksum kept valid; no receiver matches
    /// the identification); for UDP on the ICMP checksum, made 0xffff
    /// through the 16 unused bits beside it.
    #[inline(always)]
    fn shield(
        proto_nr: u8,
        quote: &mut [u32; 7],
        sum: u64,
        _pseudo: u64,
        rest: &mut u32,
    ) -> Shield {
        const ALL_ONES: [u8; 2] = [0xff, 0xff];
        if proto_nr == proto::TCP {
            set_quoted_id(quote, ALL_ONES);
        }
        let checksum = fold(sum_words(quote) + sum);
        if proto_nr != proto::UDP {
            return Shield {
                opts: [0; 2],
                checksum,
            };
        }
        // Unused bits that make the sum all ones without the checksum.
        let fill = checksum.to_ne_bytes();
        let r = rest.to_ne_bytes();
        *rest = u32::from_ne_bytes([fill[0], fill[1], r[2], r[3]]);
        Shield {
            opts: [0; 2],
            checksum: u16::from_ne_bytes(ALL_ONES),
        }
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
        opts: Option<&[u32; 2]>,
    ) -> Result<(), ()> {
        let opt_len = if opts.is_some() {
            Self::SHIELD_OPT_LEN
        } else {
            0
        };
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
        match opts {
            // The first word: the options.
            Some(opts) => ctx.put(ETH_HLEN + IPV4_MIN_HLEN, &opts[0]),
            None => Ok(()),
        }
    }
}

/// Sets an IPv4 quote's identification to `id` (bytes in network order),
/// its header checksum kept valid.
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

impl RejectFamily for Addr6Be {
    const L4_OFF: usize = IP6_L4_OFF;
    const ICMP_PROTO: u8 = proto::ICMPV6;
    const ICMP_PSEUDO_HEADER: bool = true;
    const UNREACHABLE: (u8, u8) = (1, 4);
    const TOO_BIG: (u8, u8) = (2, 0);
    const TOO_BIG_MORE: usize = 8;
    const TCP_RST: bool = true;
    const SHIELD_OPT_LEN: usize = 8;
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
    /// An 8-byte destination options header holding one option a receiver
    /// skips (type 0x1e, RFC 4727's experimental type; 4 bytes of data): the
    /// store's sum is that header's plus the ICMPv6 message's, whose valid
    /// checksum makes the latter the pseudo-header's complement. For TCP the
    /// store lands on the quoted header's first 16 bits (version, traffic
    /// class); for UDP on the option's last 16 bits, which hold 0xffff. The
    /// option's first 16 bits make the header's sum what leaves the store
    /// writing exactly that.
    #[inline(always)]
    fn shield(
        proto_nr: u8,
        quote: &mut [u32; 12],
        sum: u64,
        pseudo: u64,
        _rest: &mut u32,
    ) -> Shield {
        let checksum = fold(sum_words(quote) + sum);
        let first = u32::from_ne_bytes([proto::ICMPV6, 0, SKIPPED_OPTION, 4]);
        let (target, stored) = match proto_nr {
            proto::TCP => {
                let q = quote[0].to_ne_bytes();
                let landed = u16::from_ne_bytes([q[0], q[1]]);
                (!fold(u64::from(!landed) + pseudo), 0)
            }
            _ => (!fold(pseudo), 0xffff),
        };
        let free = !fold(u64::from(target) + u64::from(fold(u64::from(first) + u64::from(stored))));
        let (f, s) = (free.to_ne_bytes(), u16::to_ne_bytes(stored));
        Shield {
            opts: [first, u32::from_ne_bytes([f[0], f[1], s[0], s[1]])],
            checksum,
        }
    }
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
        opts: Option<&[u32; 2]>,
    ) -> Result<(), ()> {
        let (payload_len, next) = match opts {
            Some(_) => (payload_len + Self::SHIELD_OPT_LEN, NEXTHDR_DEST),
            None => (payload_len, next),
        };
        let fixed: [u32; 2] = [
            (0x6000_0000u32 | u32::from(tos) << 20).to_be(),
            ((payload_len as u32) << 16 | u32::from(next) << 8 | u32::from(TTL)).to_be(),
        ];
        ctx.put(ETH_HLEN, &fixed)?;
        ctx.put(Self::SADDR_OFF, src)?;
        ctx.put(Self::DADDR_OFF, dst)?;
        match opts {
            Some(opts) => ctx.put(Self::L4_OFF, opts),
            None => Ok(()),
        }
    }
}
