//! What both packet layers (tc and XDP) know about a packet: the header
//! layout, the flow a TCP or UDP packet belongs to, why a packet is left
//! alone, and incremental checksum arithmetic.

pub mod ctx;
pub mod v6;

use proxy_common::{proto, Addr6Be, CtKeyOf};

pub const ETH_HLEN: usize = 14;
pub const ETH_P_IP_BE: u16 = 0x0800u16.to_be();
pub const IPV4_MIN_HLEN: usize = 20;
pub const IP_CSUM_OFF: usize = ETH_HLEN + 10;
/// Where the TCP/UDP header of an IPv4 packet starts at the latest: after
/// a header with 40 bytes of options. An offset read back from working
/// memory is checked against it, which bounds it for the verifier.
pub const MAX_L4_OFF: usize = ETH_HLEN + 60;
/// More-fragments flag and fragment offset, host order.
pub const IP_FRAG_MASK: u16 = 0x3fff;
/// The fragment offset alone (host order): non-zero in every fragment but
/// the first.
pub const IP_OFFSET_MASK: u16 = 0x1fff;
pub const TCP_HLEN: usize = 20;
pub const UDP_HLEN: usize = 8;
pub const TCP_CSUM_OFF: usize = 16;
pub const UDP_CSUM_OFF: usize = 6;
pub const TCP_FLAG_FIN: u8 = 0x01;
pub const TCP_FLAG_SYN: u8 = 0x02;
pub const TCP_FLAG_RST: u8 = 0x04;
pub const TCP_FLAG_ACK: u8 = 0x10;

/// The fixed part of an IPv4 header, as laid out on the wire.
#[repr(C)]
pub struct Ipv4Hdr {
    pub version_ihl: u8,
    pub tos: u8,
    pub tot_len_be: u16,
    pub id_be: u16,
    pub frag_off_be: u16,
    pub ttl: u8,
    pub proto: u8,
    pub csum_be: u16,
    pub saddr_be: u32,
    pub daddr_be: u32,
}

/// The addresses and ports of one TCP or UDP packet of either family
/// (`A`: `u32` for IPv4, [`Addr6Be`] for IPv6; [`Flow`], [`Flow6`]). For a
/// later IPv6 fragment: its addresses, protocol and identification; for
/// ICMPv6: its addresses, and `l4_off` where the ICMPv6 header starts.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FlowOf<A> {
    pub saddr_be: A,
    pub daddr_be: A,
    /// IPv6: the fragment header's identification (with `first_fragment`,
    /// and in a later fragment); IPv4: the header's 16-bit identification.
    pub frag_id_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// TCP flags byte (0 for UDP).
    pub tcp_flags: u8,
    /// The first fragment of a fragmented datagram (offset 0, more
    /// fragments set): its later fragments follow its translation
    /// ([`crate::frag`]).
    pub first_fragment: bool,
    /// Offset of the TCP/UDP (or ICMPv6) header from the start of the
    /// frame, after any IPv4 options or IPv6 extension headers.
    pub l4_off: usize,
}

/// An IPv4 packet's flow.
pub type Flow = FlowOf<u32>;
/// An IPv6 packet's flow.
pub type Flow6 = FlowOf<Addr6Be>;

impl<A: Words> FlowOf<A> {
    /// A TCP SYN without ACK opens a new connection; a UDP datagram has no
    /// connection to keep. Both must reach a backend that is still live.
    #[inline(always)]
    pub fn needs_live_backend(&self) -> bool {
        self.proto == proto::UDP || self.opens_connection()
    }

    /// A TCP SYN without ACK: a client opening a connection.
    #[inline(always)]
    pub fn opens_connection(&self) -> bool {
        self.proto == proto::TCP && self.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) == TCP_FLAG_SYN
    }

    /// A TCP SYN-ACK: a server accepting a connection.
    #[inline(always)]
    pub fn accepts_connection(&self) -> bool {
        let both = TCP_FLAG_SYN | TCP_FLAG_ACK;
        self.proto == proto::TCP && self.tcp_flags & both == both
    }

    /// A TCP FIN or RST: the connection is ending.
    #[inline(always)]
    pub fn ends_connection(&self) -> bool {
        self.proto == proto::TCP && self.tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST) != 0
    }

    #[inline(always)]
    pub fn l4_off(&self) -> usize {
        self.l4_off
    }

    /// Writes the flow's connection-tracking key of direction `dir` to
    /// `key` (which may be scratch memory: no copy on the stack).
    #[inline(always)]
    pub fn ct_key_into(&self, dir: u8, key: &mut CtKeyOf<A>) {
        set(&mut key.saddr_be, &self.saddr_be);
        set(&mut key.daddr_be, &self.daddr_be);
        set_ct_tail(key, self.sport_be, self.dport_be, self.proto, dir);
    }
}

/// Writes the ports, protocol and direction of a connection-tracking key
/// (and clears its padding) as two 32-bit stores. The lookup reads the key
/// in 32-bit words (the copy to the stack, the map's hash); a load that
/// spans several narrower stores still in flight cannot be forwarded from
/// them and waits until they reach the cache, which cost an existing
/// flow's packet about 5 ns when the tail was written field by field.
#[inline(always)]
pub fn set_ct_tail<A>(key: &mut CtKeyOf<A>, sport_be: u16, dport_be: u16, proto: u8, dir: u8) {
    let [s0, s1] = sport_be.to_ne_bytes();
    let [d0, d1] = dport_be.to_ne_bytes();
    let ports = u32::from_ne_bytes([s0, s1, d0, d1]);
    let rest = u32::from_ne_bytes([proto, dir, 0, 0]);
    let tail = core::ptr::addr_of_mut!(key.sport_be).cast::<u32>();
    // SAFETY: `CtKeyOf` is `repr(C)`: `sport_be`, `dport_be`, `proto`,
    // `dir` and `_pad` are its last 8 bytes, starting 4-aligned for both
    // families (checked below), so both words are in bounds and aligned.
    unsafe {
        tail.write(ports);
        tail.add(1).write(rest);
    }
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(align_of::<CtKeyOf<u32>>() >= 4 && align_of::<CtKeyOf<Addr6Be>>() >= 4);
    assert!(offset_of!(CtKeyOf<u32>, sport_be) % 4 == 0);
    assert!(offset_of!(CtKeyOf<u32>, sport_be) + 8 == size_of::<CtKeyOf<u32>>());
    assert!(offset_of!(CtKeyOf<Addr6Be>, sport_be) % 4 == 0);
    assert!(offset_of!(CtKeyOf<Addr6Be>, sport_be) + 8 == size_of::<CtKeyOf<Addr6Be>>());
    assert!(offset_of!(CtKeyOf<u32>, dport_be) == offset_of!(CtKeyOf<u32>, sport_be) + 2);
    assert!(offset_of!(CtKeyOf<u32>, proto) == offset_of!(CtKeyOf<u32>, sport_be) + 4);
    assert!(offset_of!(CtKeyOf<u32>, dir) == offset_of!(CtKeyOf<u32>, sport_be) + 5);
};

/// A value copied as loads and stores of its words ([`set`]).
pub trait Words: Copy {
    fn set_from(&mut self, src: &Self);
}

impl Words for u16 {
    #[inline(always)]
    fn set_from(&mut self, src: &u16) {
        *self = *src;
    }
}

impl Words for u32 {
    #[inline(always)]
    fn set_from(&mut self, src: &u32) {
        *self = *src;
    }
}

impl Words for [u16; 2] {
    #[inline(always)]
    fn set_from(&mut self, src: &[u16; 2]) {
        self[0] = src[0];
        self[1] = src[1];
    }
}

impl Words for Addr6Be {
    #[inline(always)]
    fn set_from(&mut self, src: &Addr6Be) {
        self[0] = src[0];
        self[1] = src[1];
        self[2] = src[2];
        self[3] = src[3];
    }
}

/// `*dst = *src`, word by word. A plain assignment of an IPv6 address (16
/// bytes) becomes a `memcpy`, and LLVM turns a chain of them between places
/// it cannot tell apart (map values, the packet, working memory) into a
/// call to `memmove`, a byte loop on BPF. Word loads and stores stay what
/// they are.
#[inline(always)]
pub fn set<T: Words>(dst: &mut T, src: &T) {
    dst.set_from(src);
}

/// Why a packet is not rewritten. Each maps to one explicit action.
pub enum Skip {
    /// Not IPv4 TCP/UDP, or not a frontend / tracked reply.
    NotOurs,
    /// Shorter than the headers it announces.
    Malformed,
    /// An IPv4 fragment: no ports to look up in it (the tc pod path: a
    /// fragment other than the first).
    Fragment,
    /// ICMP (the tc pod path looks at errors about translated flows).
    Icmp,
}

/// What a parser found, beyond "not ours" (the details are in the flow it
/// filled).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// TCP or UDP, whole or the first fragment.
    Flow,
    /// A later fragment of a TCP or UDP datagram: addresses, protocol and
    /// identification, no ports.
    Later,
    /// An ICMP (ICMPv6) message, not fragmented.
    Icmp,
}

/// A checksum after a 32-bit field changed from `old` to `new` (RFC 1624,
/// eqn. 3). All values as they are in the packet: one's-complement sums do
/// not depend on byte order as long as every word uses the same.
#[inline(always)]
pub fn csum_replace4(csum: u16, old: u32, new: u32) -> u16 {
    let mut sum = u32::from(!csum);
    sum += (!old >> 16) + (!old & 0xffff);
    sum += (new >> 16) + (new & 0xffff);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// The same for a 16-bit field.
#[inline(always)]
pub fn csum_replace2(csum: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!csum);
    sum += u32::from(!old);
    sum += u32::from(new);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
