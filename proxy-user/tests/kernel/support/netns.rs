//! Private network namespaces for the kernel fixture tests, and the node the
//! uplink fixtures run on ([`proxy_testkit::node`]), for either address
//! family.
//!
//! A test body runs on a thread of its own that first moves into a namespace
//! of its own ([`proxy_testkit::netns`], here in forms that panic as a test
//! does); the `ip` commands it spawns inherit it. Nothing here touches the
//! namespace the tests were started in.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proxy_testkit::{
    netns,
    node::{Node, NodeFamily, NodeSpec},
};

/// Runs `ip args…` in the calling thread's namespace; panics with its error
/// output.
pub fn ip(args: &[&str]) {
    netns::ip(args).unwrap_or_else(|e| panic!("{e:#}"));
}

/// The index of interface `name` in the calling thread's namespace.
pub fn ifindex(name: &str) -> u32 {
    netns::ifindex(name).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Runs `body` on a thread of its own inside a new network namespace
/// ([`netns::in_new_netns`]); panics if it could not, or with the body's
/// panic message. Threads the body leaves behind stay in that namespace
/// until they end.
pub fn in_new_netns<T: Send>(body: impl FnOnce() -> T + Send) -> T {
    super::require_root();
    netns::in_new_netns(|| Ok(body())).unwrap_or_else(|e| panic!("{e:#}"))
}

/// An address family as the uplink fixtures need it: the node's
/// ([`NodeFamily`]), and how a translated frame's checksums are judged.
pub trait Family: NodeFamily + Into<IpAddr> + Send + Sync + 'static {
    /// Whether `output`'s checksums hold; `input` is the frame it came from
    /// (a UDP checksum of 0 may stay 0).
    fn checksums_valid(output: &[u8], input: &[u8]) -> bool;
}

impl Family for Ipv4Addr {
    fn checksums_valid(output: &[u8], _input: &[u8]) -> bool {
        use proxy_testkit::packet::{checksums_valid, icmp_checksums_valid, ETH_HLEN};
        // An ICMP message has no pseudo-header in its checksum.
        match output.get(ETH_HLEN + 9) {
            Some(1) => icmp_checksums_valid(output),
            _ => checksums_valid(output),
        }
    }
}

impl Family for Ipv6Addr {
    fn checksums_valid(output: &[u8], input: &[u8]) -> bool {
        use proxy_testkit::packet6::{checksums_valid6, parse6, PROTO_UDP};
        let zero_ok = parse6(input).is_some_and(|p| {
            p.proto == PROTO_UDP && input.get(p.l4_off + 6..p.l4_off + 8) == Some(&[0, 0][..])
        });
        checksums_valid6(output, zero_ok)
    }
}

/// A fixture body run on a [`NodeSpec`]'s node.
pub trait RunNode {
    /// Runs `body` in a new network namespace holding the node.
    fn run<T: Send>(&self, body: impl FnOnce(&Node) -> T + Send) -> T;
}

impl<A: NodeFamily + Sync> RunNode for NodeSpec<A> {
    fn run<T: Send>(&self, body: impl FnOnce(&Node) -> T + Send) -> T {
        in_new_netns(|| body(&self.build().unwrap_or_else(|e| panic!("{e:#}"))))
    }
}
