//! One endpoint of an EndpointSlice as the model reads it, before it is
//! packed ([`super::packed`]): its first address as written, its
//! conditions, its node and its topology hints.
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

/// An endpoint's address as written: parsed when it is written as the
/// address prints (the common case: 4 or 16 bytes), else kept as text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawAddress {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    Other(Box<str>),
}

impl RawAddress {
    pub(crate) fn new(s: &str) -> RawAddress {
        match s.parse::<IpAddr>() {
            // Only when it prints back as written, so Display shows the text
            // the user wrote (a warning names it as found). An IPv4 address
            // parses only in that form (no leading zeros, no spaces).
            Ok(IpAddr::V4(ip)) => RawAddress::V4(ip),
            Ok(IpAddr::V6(ip)) if ip.to_string() == s => RawAddress::V6(ip),
            _ => RawAddress::Other(s.into()),
        }
    }

    /// The address, of either family, accepting surrounding whitespace.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            RawAddress::V4(ip) => Some(IpAddr::V4(*ip)),
            RawAddress::V6(ip) => Some(IpAddr::V6(*ip)),
            RawAddress::Other(s) => s.trim().parse().ok(),
        }
    }
}

impl fmt::Display for RawAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawAddress::V4(ip) => ip.fmt(f),
            RawAddress::V6(ip) => ip.fmt(f),
            RawAddress::Other(s) => f.write_str(s),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointInfo {
    /// The first of `addresses` (the only one kube-proxy uses); `None` when
    /// the list is empty.
    pub address: Option<RawAddress>,
    /// How many addresses the endpoint lists in all.
    pub address_count: u32,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub node_name: Option<Arc<str>>,
    /// `hints`, when present (rare: boxed to keep the common endpoint small).
    pub hints: Option<Box<Hints>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    pub for_nodes: Box<[Arc<str>]>,
    pub for_zones: Box<[Arc<str>]>,
}
