//! What a fixture written once for both address families asks of a family:
//! its frame builder ([`proxy_testkit::Frame`]: [`PacketSpec`] or
//! [`Packet6`]), its header's TTL or hop limit, its conntrack keys and
//! entries. Implemented on the address types, so a fixture
//! generic over `F: TestFamily` takes its addresses as `F` (each module
//! names its own in a trait of its own, e.g. the uplink node's).
//!
//! [`both_families!`] runs a generic fixture once per family, as Cilium's
//! bpf tests share one scenario body: `both_families!(x)` next to
//! `fn x<F: TestFamily>()` gives the tests `x::ipv4` and `x::ipv6`.
use std::fmt::Debug;
use std::hash::Hash;
use std::net::{Ipv4Addr, Ipv6Addr};

use proxy_common::{addr6_be, proto, Addr6Be, CtEntryOf, CtKeyOf};
use proxy_testkit::packet::{self, PacketSpec, ETH_HLEN};
use proxy_testkit::packet6::Packet6;
use proxy_testkit::Frame;
use proxy_user::model::Protocol;

use super::{netns, Loaded};

/// Runs the generic fixtures named once per address family: for each
/// `x`, a module `x` with the tests `ipv4` and `ipv6` calling `x::<F>()`.
#[macro_export]
macro_rules! both_families {
    ($($scenario:ident),+ $(,)?) => {$(
        mod $scenario {
            #[test]
            fn ipv4() {
                super::$scenario::<std::net::Ipv4Addr>()
            }
            #[test]
            fn ipv6() {
                super::$scenario::<std::net::Ipv6Addr>()
            }
        }
    )+};
}

/// An address family as a fixture written once for both uses it.
pub trait TestFamily: netns::Family + Ord + Hash + Debug {
    /// The family's frame builder.
    type Packet: Frame<Addr = Self>;
    /// An address as the maps hold it (network byte order).
    type Be: Copy + Eq + Debug + Default;
    /// The length of the IP header of a frame without options or extension
    /// headers.
    const IP_HLEN: usize;

    /// The address as the maps hold it.
    fn be(self) -> Self::Be;

    /// A TCP SYN or a UDP datagram from `src:sport` to `dst:dport`.
    fn packet(protocol: Protocol, src: Self, sport: u16, dst: Self, dport: u16) -> Self::Packet {
        match protocol {
            Protocol::Tcp => Self::Packet::tcp(src, sport, dst, dport),
            Protocol::Udp => Self::Packet::udp(src, sport, dst, dport),
        }
    }

    /// `frame` with TTL (hop limit) `ttl`, the header checksum (IPv4)
    /// computed from scratch.
    fn with_ttl(frame: Vec<u8>, ttl: u8) -> Vec<u8>;
    /// The TTL (hop limit) of `frame`.
    fn ttl_of(frame: &[u8]) -> u8;

    /// The conntrack entry under `key`, read from the loaded maps.
    fn ct(fx: &Loaded, key: &CtKeyOf<Self::Be>) -> Option<CtEntryOf<Self::Be>>;
    /// How many conntrack entries of this family there are.
    fn ct_len(fx: &Loaded) -> usize;
}

/// The conntrack key of a flow of either family.
pub fn ct_key<F: TestFamily>(
    src: F,
    sport: u16,
    dst: F,
    dport: u16,
    protocol: Protocol,
    dir: u8,
) -> CtKeyOf<F::Be> {
    CtKeyOf {
        saddr_be: src.be(),
        daddr_be: dst.be(),
        sport_be: sport.to_be(),
        dport_be: dport.to_be(),
        proto: protocol_number(protocol),
        dir,
        _pad: [0; 2],
    }
}

/// The IP protocol number of `protocol`.
pub fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => proto::TCP,
        Protocol::Udp => proto::UDP,
    }
}

/// `frame` with new destination and source MAC addresses.
pub fn with_macs(mut frame: Vec<u8>, dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    frame[0..6].copy_from_slice(&dst);
    frame[6..12].copy_from_slice(&src);
    frame
}

impl TestFamily for Ipv4Addr {
    type Packet = PacketSpec;
    type Be = u32;
    const IP_HLEN: usize = 20;

    fn be(self) -> u32 {
        u32::from_ne_bytes(self.octets())
    }

    fn with_ttl(mut frame: Vec<u8>, ttl: u8) -> Vec<u8> {
        let ihl = usize::from(frame[ETH_HLEN] & 0x0f) * 4;
        frame[ETH_HLEN + 8] = ttl;
        frame[ETH_HLEN + 10..ETH_HLEN + 12].fill(0);
        let csum = packet::checksum(&frame[ETH_HLEN..ETH_HLEN + ihl], 0);
        frame[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&csum.to_be_bytes());
        frame
    }

    fn ttl_of(frame: &[u8]) -> u8 {
        frame[ETH_HLEN + 8]
    }

    fn ct(fx: &Loaded, key: &CtKeyOf<u32>) -> Option<CtEntryOf<u32>> {
        fx.ct(key)
    }

    fn ct_len(fx: &Loaded) -> usize {
        fx.syncer.store().conntrack_len()
    }
}

impl TestFamily for Ipv6Addr {
    type Packet = Packet6;
    type Be = Addr6Be;
    const IP_HLEN: usize = 40;

    fn be(self) -> Addr6Be {
        addr6_be(self.octets())
    }

    fn with_ttl(mut frame: Vec<u8>, ttl: u8) -> Vec<u8> {
        frame[ETH_HLEN + 7] = ttl;
        frame
    }

    fn ttl_of(frame: &[u8]) -> u8 {
        frame[ETH_HLEN + 7]
    }

    fn ct(fx: &Loaded, key: &CtKeyOf<Addr6Be>) -> Option<CtEntryOf<Addr6Be>> {
        fx.maps6.ct(key)
    }

    fn ct_len(fx: &Loaded) -> usize {
        fx.syncer.store().conntrack6_len()
    }
}
