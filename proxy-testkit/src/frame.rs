//! [`Frame`]: the TCP/UDP frame builder of either family
//! ([`PacketSpec`], [`Packet6`]) as a test written once for both families
//! uses it, with the readers of the frames it gets back.
use std::fmt::{Debug, Display};
use std::hash::Hash;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::packet::{PacketSpec, ETH_HLEN};
use crate::packet6::{self, Packet6};

/// A TCP or UDP packet to build, of the family whose addresses are `Addr`.
pub trait Frame: Clone + Debug {
    type Addr: Copy + Eq + Ord + Hash + Debug + Display;

    /// A TCP SYN.
    fn tcp(src: Self::Addr, sport: u16, dst: Self::Addr, dport: u16) -> Self;
    /// A UDP datagram with a short payload.
    fn udp(src: Self::Addr, sport: u16, dst: Self::Addr, dport: u16) -> Self;
    /// The whole frame, every checksum valid.
    fn build(&self) -> Vec<u8>;

    fn src(&self) -> (Self::Addr, u16);
    fn dst(&self) -> (Self::Addr, u16);
    fn set_src(&mut self, addr: Self::Addr, port: u16);
    fn set_dst(&mut self, addr: Self::Addr, port: u16);
    fn set_tcp_flags(&mut self, flags: u8);
    fn set_payload(&mut self, payload: Vec<u8>);
    /// UDP only: send with checksum 0 ("no checksum").
    fn set_udp_zero_checksum(&mut self);

    /// A copy with destination `addr:port`.
    fn to(&self, addr: Self::Addr, port: u16) -> Self {
        let mut p = self.clone();
        p.set_dst(addr, port);
        p
    }

    /// A copy with source `addr:port`.
    fn from(&self, addr: Self::Addr, port: u16) -> Self {
        let mut p = self.clone();
        p.set_src(addr, port);
        p
    }

    /// A copy with TCP flags `flags`.
    fn flags(&self, flags: u8) -> Self {
        let mut p = self.clone();
        p.set_tcp_flags(flags);
        p
    }

    /// The source address and port of a built TCP/UDP frame of this family.
    fn src_of(frame: &[u8]) -> (Self::Addr, u16);
    /// The destination address and port of a built TCP/UDP frame.
    fn dst_of(frame: &[u8]) -> (Self::Addr, u16);
}

/// Where the L4 header of an IPv4 frame starts.
fn l4_off4(frame: &[u8]) -> usize {
    ETH_HLEN + usize::from(frame[ETH_HLEN] & 0x0f) * 4
}

impl Frame for PacketSpec {
    type Addr = Ipv4Addr;

    fn tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        PacketSpec::tcp(src, sport, dst, dport)
    }
    fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        PacketSpec::udp(src, sport, dst, dport)
    }
    fn build(&self) -> Vec<u8> {
        PacketSpec::build(self)
    }
    fn src(&self) -> (Ipv4Addr, u16) {
        (self.src, self.sport)
    }
    fn dst(&self) -> (Ipv4Addr, u16) {
        (self.dst, self.dport)
    }
    fn set_src(&mut self, addr: Ipv4Addr, port: u16) {
        self.src = addr;
        self.sport = port;
    }
    fn set_dst(&mut self, addr: Ipv4Addr, port: u16) {
        self.dst = addr;
        self.dport = port;
    }
    fn set_tcp_flags(&mut self, flags: u8) {
        self.tcp_flags = flags;
    }
    fn set_payload(&mut self, payload: Vec<u8>) {
        self.payload = payload;
    }
    fn set_udp_zero_checksum(&mut self) {
        self.udp_zero_checksum = true;
    }
    fn src_of(frame: &[u8]) -> (Ipv4Addr, u16) {
        let (ip, l4) = (&frame[ETH_HLEN..], l4_off4(frame));
        (
            Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]),
            u16::from_be_bytes([frame[l4], frame[l4 + 1]]),
        )
    }
    fn dst_of(frame: &[u8]) -> (Ipv4Addr, u16) {
        let (ip, l4) = (&frame[ETH_HLEN..], l4_off4(frame));
        (
            Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
            u16::from_be_bytes([frame[l4 + 2], frame[l4 + 3]]),
        )
    }
}

impl Frame for Packet6 {
    type Addr = Ipv6Addr;

    fn tcp(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Self {
        Packet6::tcp(src, sport, dst, dport)
    }
    fn udp(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Self {
        Packet6::udp(src, sport, dst, dport)
    }
    fn build(&self) -> Vec<u8> {
        Packet6::build(self)
    }
    fn src(&self) -> (Ipv6Addr, u16) {
        (self.src, self.sport)
    }
    fn dst(&self) -> (Ipv6Addr, u16) {
        (self.dst, self.dport)
    }
    fn set_src(&mut self, addr: Ipv6Addr, port: u16) {
        self.src = addr;
        self.sport = port;
    }
    fn set_dst(&mut self, addr: Ipv6Addr, port: u16) {
        self.dst = addr;
        self.dport = port;
    }
    fn set_tcp_flags(&mut self, flags: u8) {
        self.tcp_flags = flags;
    }
    fn set_payload(&mut self, payload: Vec<u8>) {
        self.payload = payload;
    }
    fn set_udp_zero_checksum(&mut self) {
        self.udp_zero_checksum = true;
    }
    /// Walks the extension headers ([`packet6::parse6`]).
    fn src_of(frame: &[u8]) -> (Ipv6Addr, u16) {
        let p = packet6::parse6(frame).expect("an IPv6 frame");
        let l4 = p.l4_off;
        (p.src, u16::from_be_bytes([frame[l4], frame[l4 + 1]]))
    }
    fn dst_of(frame: &[u8]) -> (Ipv6Addr, u16) {
        let p = packet6::parse6(frame).expect("an IPv6 frame");
        let l4 = p.l4_off;
        (p.dst, u16::from_be_bytes([frame[l4 + 2], frame[l4 + 3]]))
    }
}
