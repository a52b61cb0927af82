//! A slice's endpoints, held compact.
//!
//! An agent at 100k Services × 10 endpoints holds a million endpoints for
//! the model. As [`EndpointInfo`]s (a 24-byte address that may be text, a
//! node name, hints, three conditions) they took 56 bytes each; here an
//! endpoint takes 16: an IPv4 address inline, the conditions in one byte,
//! and indexes into the slice's tables of the other parts (node names once
//! per slice; IPv6 addresses, addresses kept as text and hints in a table
//! of their own that most slices do without).
//!
//! [`Endpoints`] is built from [`EndpointInfo`]s (what the decoders and the
//! tests write) and read back as [`Endpoint`] views, whose fields say what
//! [`EndpointInfo`]'s say.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use super::slice_endpoint::{EndpointInfo, Hints, RawAddress};

/// One endpoint: 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Packed {
    /// [`Kind::V4`]: the address (big-endian bits); [`Kind::V6`] and
    /// [`Kind::Other`]: its position in the slice's table of that kind.
    addr: u32,
    /// 1 + the position of the node name in the slice's table; 0: none.
    node: u32,
    /// 1 + the position of the hints in the slice's table; 0: none.
    hints: u32,
    /// How many addresses the endpoint lists, saturating (the API server
    /// accepts at most 100).
    count: u16,
    kind: Kind,
    /// `ready`, `serving`, `terminating`: two bits each ([`cond`]).
    conds: u8,
}

const _: () = assert!(std::mem::size_of::<Packed>() == 16);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    None,
    V4,
    V6,
    Other,
}

/// Two bits for an `Option<bool>`: 0 absent, 1 false, 2 true.
fn cond(value: Option<bool>, shift: u8) -> u8 {
    let bits = match value {
        None => 0,
        Some(false) => 1,
        Some(true) => 2,
    };
    bits << shift
}

fn uncond(conds: u8, shift: u8) -> Option<bool> {
    match (conds >> shift) & 3 {
        1 => Some(false),
        2 => Some(true),
        _ => None,
    }
}

/// A position in a table, 1-based (0 stands for none).
fn one_based(len: usize) -> u32 {
    u32::try_from(len + 1).unwrap_or(u32::MAX)
}

/// A slice's endpoints, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Endpoints {
    packed: Box<[Packed]>,
    /// The node names the endpoints name, each once.
    nodes: Box<[Arc<str>]>,
    /// `None` when every table in it is empty (an IPv4 slice without
    /// hints): 8 bytes per slice rather than 48.
    rare: Option<Box<Rare>>,
}

/// The tables most slices leave empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Rare {
    v6: Box<[Ipv6Addr]>,
    /// Addresses not written as they print, kept as written.
    other: Box<[Box<str>]>,
    hints: Box<[Hints]>,
}

/// One endpoint as the model reads it: [`EndpointInfo`]'s fields, borrowed
/// from the slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint<'a> {
    pub address: Option<Address<'a>>,
    pub address_count: u32,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub node_name: Option<&'a Arc<str>>,
    pub hints: Option<&'a Hints>,
}

/// An endpoint's address as [`RawAddress`] says it, borrowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Address<'a> {
    V4(Ipv4Addr),
    V6(Ipv6Addr),
    Other(&'a str),
}

impl Address<'_> {
    /// The address, of either family, accepting surrounding whitespace.
    pub fn ip(&self) -> Option<std::net::IpAddr> {
        self.owned().ip()
    }

    pub fn owned(&self) -> RawAddress {
        match *self {
            Address::V4(ip) => RawAddress::V4(ip),
            Address::V6(ip) => RawAddress::V6(ip),
            Address::Other(s) => RawAddress::Other(s.into()),
        }
    }
}

impl std::fmt::Display for Address<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::V4(ip) => ip.fmt(f),
            Address::V6(ip) => ip.fmt(f),
            Address::Other(s) => f.write_str(s),
        }
    }
}

impl Endpoints {
    pub fn len(&self) -> usize {
        self.packed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packed.is_empty()
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = Endpoint<'_>> + '_ {
        self.packed.iter().map(|p| self.view(p))
    }

    pub fn get(&self, i: usize) -> Option<Endpoint<'_>> {
        self.packed.get(i).map(|p| self.view(p))
    }

    fn view(&self, p: &Packed) -> Endpoint<'_> {
        let at = p.addr as usize;
        let rare = self.rare.as_deref();
        let address = match p.kind {
            Kind::None => None,
            Kind::V4 => Some(Address::V4(Ipv4Addr::from(p.addr))),
            Kind::V6 => rare.and_then(|r| r.v6.get(at)).copied().map(Address::V6),
            Kind::Other => rare
                .and_then(|r| r.other.get(at))
                .map(|s| Address::Other(s)),
        };
        let nth = |i: u32| (i as usize).checked_sub(1);
        Endpoint {
            address,
            address_count: u32::from(p.count),
            ready: uncond(p.conds, 0),
            serving: uncond(p.conds, 2),
            terminating: uncond(p.conds, 4),
            node_name: nth(p.node).and_then(|i| self.nodes.get(i)),
            hints: nth(p.hints).and_then(|i| rare?.hints.get(i)),
        }
    }

    /// Puts every string through `share` (node names and hints; see
    /// [`super::SliceInfo::share`]).
    pub(super) fn share(&mut self, share: &mut impl FnMut(&mut Arc<str>)) {
        self.nodes.iter_mut().for_each(&mut *share);
        let hints = self.rare.as_deref_mut().map(|r| &mut r.hints[..]);
        for hints in hints.into_iter().flatten() {
            hints
                .for_nodes
                .iter_mut()
                .chain(hints.for_zones.iter_mut())
                .for_each(&mut *share);
        }
    }
}

/// Builds the tables while the endpoints come.
#[derive(Default)]
struct Builder {
    packed: Vec<Packed>,
    v6: Vec<Ipv6Addr>,
    other: Vec<Box<str>>,
    nodes: Vec<Arc<str>>,
    /// Node name → its position, once the table is too long to search.
    node_index: std::collections::HashMap<Arc<str>, u32>,
    hints: Vec<Hints>,
}

/// Node tables up to this long are searched; longer ones get an index.
const SEARCH_NODES: usize = 8;

impl Builder {
    fn node(&mut self, name: Arc<str>) -> u32 {
        if let Some(at) = self.node_index.get(&name) {
            return *at;
        }
        if self.nodes.len() <= SEARCH_NODES {
            if let Some(i) = self.nodes.iter().position(|n| *n == name) {
                return one_based(i);
            }
        }
        let at = one_based(self.nodes.len());
        self.nodes.push(Arc::clone(&name));
        if self.nodes.len() > SEARCH_NODES {
            if self.node_index.is_empty() {
                for (i, n) in self.nodes.iter().enumerate() {
                    self.node_index.insert(Arc::clone(n), one_based(i));
                }
            } else {
                self.node_index.insert(name, at);
            }
        }
        at
    }

    fn push(&mut self, ep: EndpointInfo) {
        let position = |len: usize| u32::try_from(len).unwrap_or(u32::MAX);
        let (kind, addr) = match ep.address {
            None => (Kind::None, 0),
            Some(RawAddress::V4(ip)) => (Kind::V4, u32::from(ip)),
            Some(RawAddress::V6(ip)) => {
                self.v6.push(ip);
                (Kind::V6, position(self.v6.len() - 1))
            }
            Some(RawAddress::Other(text)) => {
                self.other.push(text);
                (Kind::Other, position(self.other.len() - 1))
            }
        };
        let node = ep.node_name.map_or(0, |n| self.node(n));
        let hints = match ep.hints {
            Some(h) => {
                self.hints.push(*h);
                one_based(self.hints.len() - 1)
            }
            None => 0,
        };
        self.packed.push(Packed {
            addr,
            node,
            hints,
            count: u16::try_from(ep.address_count).unwrap_or(u16::MAX),
            kind,
            conds: cond(ep.ready, 0) | cond(ep.serving, 2) | cond(ep.terminating, 4),
        });
    }

    fn finish(self) -> Endpoints {
        let rare = Rare {
            v6: self.v6.into(),
            other: self.other.into(),
            hints: self.hints.into(),
        };
        Endpoints {
            packed: self.packed.into(),
            nodes: self.nodes.into(),
            rare: (rare != Rare::default()).then(|| Box::new(rare)),
        }
    }
}

impl FromIterator<EndpointInfo> for Endpoints {
    fn from_iter<I: IntoIterator<Item = EndpointInfo>>(iter: I) -> Self {
        let iter = iter.into_iter();
        let mut builder = Builder {
            packed: Vec::with_capacity(iter.size_hint().0),
            ..Builder::default()
        };
        iter.for_each(|ep| builder.push(ep));
        builder.finish()
    }
}

impl From<Vec<EndpointInfo>> for Endpoints {
    fn from(endpoints: Vec<EndpointInfo>) -> Self {
        endpoints.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(address: Option<RawAddress>, node: Option<&str>) -> EndpointInfo {
        EndpointInfo {
            address,
            address_count: 1,
            ready: Some(true),
            serving: None,
            terminating: Some(false),
            node_name: node.map(Arc::from),
            hints: None,
        }
    }

    #[test]
    fn endpoints_read_back_as_written() {
        let v6: Ipv6Addr = "fd00::1".parse().unwrap();
        let hinted = EndpointInfo {
            address_count: 3,
            ready: None,
            serving: Some(false),
            terminating: Some(true),
            hints: Some(Box::new(Hints {
                for_nodes: Box::new([Arc::from("node-b")]),
                for_zones: Box::new([Arc::from("zone-a")]),
            })),
            ..info(Some(RawAddress::V4(Ipv4Addr::new(10, 0, 0, 9))), None)
        };
        let written = vec![
            info(
                Some(RawAddress::V4(Ipv4Addr::new(10, 0, 0, 1))),
                Some("node-a"),
            ),
            info(Some(RawAddress::V6(v6)), Some("node-b")),
            info(Some(RawAddress::Other(" 10.0.0.2".into())), Some("node-a")),
            info(None, None),
            hinted,
        ];
        let packed: Endpoints = written.clone().into();
        assert_eq!(packed.len(), written.len());
        for (read, w) in packed.iter().zip(&written) {
            assert_eq!(read.address.map(|a| a.owned()), w.address);
            assert_eq!(read.address_count, w.address_count);
            assert_eq!(
                (read.ready, read.serving, read.terminating),
                (w.ready, w.serving, w.terminating)
            );
            assert_eq!(read.node_name, w.node_name.as_ref());
            assert_eq!(read.hints, w.hints.as_deref());
        }
        assert_eq!(packed.nodes.len(), 2, "each node name once per slice");
        let plain: Endpoints = vec![written[0].clone()].into();
        assert!(
            plain.rare.is_none(),
            "an IPv4 slice without hints has no rare table"
        );
        let other = packed.get(2).and_then(|e| e.address).expect("address");
        assert_eq!(other.to_string(), " 10.0.0.2", "shown as written");
        assert_eq!(other.ip(), Some("10.0.0.2".parse().unwrap()));
    }

    #[test]
    fn many_node_names_are_each_kept_once() {
        let written: Vec<EndpointInfo> = (0..40)
            .map(|i| {
                info(
                    Some(RawAddress::V4(Ipv4Addr::new(10, 0, 0, i))),
                    Some(&format!("node-{}", i % 20)),
                )
            })
            .collect();
        let packed: Endpoints = written.clone().into();
        assert_eq!(packed.nodes.len(), 20);
        for (read, w) in packed.iter().zip(&written) {
            assert_eq!(read.node_name, w.node_name.as_ref());
        }
    }
}
