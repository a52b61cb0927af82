//! A connection-tracking entry and its key, of either family, as the
//! collector, the CLI and the least-connection and quiet-mark housekeeping
//! read them ([`Entry`], [`Key`]).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proxy_common::{addr6_octets, Addr6Be, CtEntry, CtEntry6, CtKey, CtKey6};

/// The fields of a connection-tracking entry the collector and the CLI
/// read, whatever the address family ([`CtEntry`], [`CtEntry6`]).
pub trait Entry: Copy + std::fmt::Debug {
    /// The family's address in map form (`u32` or [`Addr6Be`]).
    type Addr: Copy + Eq;
    fn state(&self) -> u8;
    fn flags(&self) -> u8;
    fn created_ns(&self) -> u64;
    fn last_seen_ns(&self) -> u64;
    fn service_id(&self) -> u32;
    fn backend_id(&self) -> u32;
    /// Forward: the backend's address and port; reply: the frontend's.
    fn nat(&self) -> (Self::Addr, u16);
    /// With [`ct_flags::SNAT`]: the other end of the source NAT.
    fn snat(&self) -> (Self::Addr, u16);
}

/// A connection-tracking key of either family ([`CtKey`], [`CtKey6`]);
/// ports are in network byte order.
pub trait Key: Copy + Eq + std::hash::Hash + std::fmt::Debug {
    type Addr: Copy + Eq;
    type Entry: Entry<Addr = Self::Addr>;
    /// `"ipv4"` or `"ipv6"` (metrics labels, the CLI's `family`).
    const FAMILY: &'static str;
    fn new(src: (Self::Addr, u16), dst: (Self::Addr, u16), proto: u8, dir: u8) -> Self;
    fn src(&self) -> (Self::Addr, u16);
    fn dst(&self) -> (Self::Addr, u16);
    fn proto(&self) -> u8;
    fn dir(&self) -> u8;
    /// An address in map form as an [`IpAddr`].
    fn ip(addr: Self::Addr) -> IpAddr;
}

macro_rules! ct_entry {
    ($entry:ty, $addr:ty) => {
        impl Entry for $entry {
            type Addr = $addr;
            fn state(&self) -> u8 {
                self.state
            }
            fn flags(&self) -> u8 {
                self.flags
            }
            fn created_ns(&self) -> u64 {
                self.created_ns
            }
            fn last_seen_ns(&self) -> u64 {
                self.last_seen_ns
            }
            fn service_id(&self) -> u32 {
                self.service_id
            }
            fn backend_id(&self) -> u32 {
                self.backend_id
            }
            fn nat(&self) -> ($addr, u16) {
                (self.nat_addr_be, self.nat_port_be)
            }
            fn snat(&self) -> ($addr, u16) {
                (self.snat_addr_be, self.snat_port_be)
            }
        }
    };
}

macro_rules! ct_key {
    ($key:ty, $entry:ty, $addr:ty, $family:literal, $ip:expr) => {
        impl Key for $key {
            type Addr = $addr;
            type Entry = $entry;
            const FAMILY: &'static str = $family;
            fn new(src: ($addr, u16), dst: ($addr, u16), proto: u8, dir: u8) -> Self {
                Self {
                    saddr_be: src.0,
                    daddr_be: dst.0,
                    sport_be: src.1,
                    dport_be: dst.1,
                    proto,
                    dir,
                    _pad: [0; 2],
                }
            }
            fn src(&self) -> ($addr, u16) {
                (self.saddr_be, self.sport_be)
            }
            fn dst(&self) -> ($addr, u16) {
                (self.daddr_be, self.dport_be)
            }
            fn proto(&self) -> u8 {
                self.proto
            }
            fn dir(&self) -> u8 {
                self.dir
            }
            fn ip(addr: $addr) -> IpAddr {
                let ip: fn($addr) -> IpAddr = $ip;
                ip(addr)
            }
        }
    };
}

ct_entry!(CtEntry, u32);
ct_entry!(CtEntry6, Addr6Be);
ct_key!(CtKey, CtEntry, u32, "ipv4", |a| IpAddr::V4(Ipv4Addr::from(
    a.to_ne_bytes()
)));
ct_key!(CtKey6, CtEntry6, Addr6Be, "ipv6", |a| IpAddr::V6(
    Ipv6Addr::from(addr6_octets(a))
));
