//! The node the uplink fixture tests and the `uplink` and `xdpfwd`
//! benchmarks run on, for either address family, built with `ip` in the
//! calling thread's namespace: a private one ([`netns::in_new_netns`]), never
//! the namespace the tests or benchmarks were started in.
//!
//! ```text
//! up0  (veth, `uplink_mac`) `addr`/`prefix_len`, forwarding on   <- the uplink
//!      `neighbours` (permanent)
//!      `routes` with a gateway: via it on up0
//! pod0 (veth)  `routes` without a gateway: pods on this node
//! ```
use std::{
    fmt::Display,
    fs,
    net::{Ipv4Addr, Ipv6Addr},
};

use anyhow::{Context as _, Result};

use crate::netns::{self, ip};

/// An address family as the node needs it: how `ip` is told, how the
/// uplink forwards.
pub trait NodeFamily: Copy + Display {
    /// `ip`'s family option.
    const IP: &'static str;
    /// Options `ip addr add` needs for an address usable at once.
    const ADDR_OPTIONS: &'static [&'static str];
    /// The sysctl that lets `bpf_fib_lookup` answer for packets arriving on
    /// `dev` (a device of the node's own namespace).
    fn forwarding_sysctl(dev: &str) -> String;
}

impl NodeFamily for Ipv4Addr {
    const IP: &'static str = "-4";
    const ADDR_OPTIONS: &'static [&'static str] = &[];

    fn forwarding_sysctl(dev: &str) -> String {
        format!("/proc/sys/net/ipv4/conf/{dev}/forwarding")
    }
}

impl NodeFamily for Ipv6Addr {
    const IP: &'static str = "-6";
    const ADDR_OPTIONS: &'static [&'static str] = &["nodad"];

    fn forwarding_sysctl(_dev: &str) -> String {
        // IPv6 forwarding is per namespace ("all"), not per device.
        "/proc/sys/net/ipv6/conf/all/forwarding".to_owned()
    }
}

/// What the node is made of (see the module documentation).
pub struct NodeSpec<A: 'static> {
    pub uplink_mac: [u8; 6],
    pub addr: A,
    pub prefix_len: u8,
    pub neighbours: &'static [(A, [u8; 6])],
    /// (destination prefix, gateway on the uplink or `None` for `pod0`).
    pub routes: &'static [(&'static str, Option<A>)],
}

/// A [`NodeSpec`] built: the uplink's interface index.
pub struct Node {
    pub uplink: u32,
}

impl<A: NodeFamily> NodeSpec<A> {
    /// Builds the node in the calling thread's namespace, which must be a
    /// private one.
    pub fn build(&self) -> Result<Node> {
        ip(&[
            "link",
            "add",
            "up0",
            "address",
            &netns::mac_text(self.uplink_mac),
            "type",
            "veth",
            "peer",
            "name",
            "up0p",
        ])?;
        ip(&[
            "link", "add", "pod0", "type", "veth", "peer", "name", "pod0p",
        ])?;
        for dev in ["up0", "up0p", "pod0", "pod0p"] {
            ip(&["link", "set", dev, "up"])?;
        }
        let addr = format!("{}/{}", self.addr, self.prefix_len);
        let mut add = vec![A::IP, "addr", "add", &addr, "dev", "up0"];
        add.extend_from_slice(A::ADDR_OPTIONS);
        ip(&add)?;
        for (addr, lladdr) in self.neighbours {
            ip(&[
                A::IP,
                "neigh",
                "add",
                &addr.to_string(),
                "lladdr",
                &netns::mac_text(*lladdr),
                "dev",
                "up0",
                "nud",
                "permanent",
            ])?;
        }
        for (prefix, gateway) in self.routes {
            match gateway {
                Some(gw) => ip(&[
                    A::IP,
                    "route",
                    "add",
                    prefix,
                    "via",
                    &gw.to_string(),
                    "dev",
                    "up0",
                ])?,
                None => ip(&[A::IP, "route", "add", prefix, "dev", "pod0"])?,
            }
        }
        // bpf_fib_lookup answers only for an ingress interface that forwards.
        // This is the node's own namespace: nothing else is changed.
        let sysctl = A::forwarding_sysctl("up0");
        fs::write(&sysctl, "1").with_context(|| format!("enable forwarding: {sysctl}"))?;
        Ok(Node {
            uplink: netns::ifindex("up0")?,
        })
    }
}
