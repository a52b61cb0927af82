//! Private network namespaces for the kernel fixture tests, and the node the
//! uplink fixtures run on, for either address family.
//!
//! A test body runs on a thread of its own that first moves into a namespace
//! of its own ([`proxy_testkit::netns`], here in forms that panic as a test
//! does); the `ip` commands it spawns inherit it. Nothing here touches the
//! namespace the tests were started in.
use std::{
    fmt::Display,
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use proxy_testkit::netns;

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

/// An address family, as the fixtures need it: how `ip` is told, how a
/// node's uplink forwards, how a translated frame's checksums are judged.
pub trait Family: Copy + Into<IpAddr> + Display + Send + Sync + 'static {
    /// `ip`'s family option.
    const IP: &'static str;
    /// Options `ip addr add` needs for an address usable at once.
    const ADDR_OPTIONS: &'static [&'static str];
    /// The sysctl that lets `bpf_fib_lookup` answer for packets arriving on
    /// `dev` (a device of the test's own namespace).
    fn forwarding_sysctl(dev: &str) -> String;
    /// Whether `output`'s checksums hold; `input` is the frame it came from
    /// (a UDP checksum of 0 may stay 0).
    fn checksums_valid(output: &[u8], input: &[u8]) -> bool;
}

impl Family for Ipv4Addr {
    const IP: &'static str = "-4";
    const ADDR_OPTIONS: &'static [&'static str] = &[];

    fn forwarding_sysctl(dev: &str) -> String {
        format!("/proc/sys/net/ipv4/conf/{dev}/forwarding")
    }

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
    const IP: &'static str = "-6";
    const ADDR_OPTIONS: &'static [&'static str] = &["nodad"];

    fn forwarding_sysctl(_dev: &str) -> String {
        // IPv6 forwarding is per namespace ("all"), not per device.
        "/proc/sys/net/ipv6/conf/all/forwarding".to_owned()
    }

    fn checksums_valid(output: &[u8], input: &[u8]) -> bool {
        use proxy_testkit::packet6::{checksums_valid6, parse6, PROTO_UDP};
        let zero_ok = parse6(input).is_some_and(|p| {
            p.proto == PROTO_UDP && input.get(p.l4_off + 6..p.l4_off + 8) == Some(&[0, 0][..])
        });
        checksums_valid6(output, zero_ok)
    }
}

/// The node the uplink fixtures run on, in a namespace of its own:
///
/// ```text
/// up0  (veth, `uplink_mac`) `addr`/`prefix_len`, forwarding on   <- the uplink
///      `neighbours` (permanent)
///      `routes` with a gateway: via it on up0
/// pod0 (veth)  `routes` without a gateway: pods on this node
/// ```
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

impl<A: Family> NodeSpec<A> {
    /// Builds the node in the calling thread's (private) namespace.
    fn build(&self) -> Node {
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
        ]);
        ip(&[
            "link", "add", "pod0", "type", "veth", "peer", "name", "pod0p",
        ]);
        for dev in ["up0", "up0p", "pod0", "pod0p"] {
            ip(&["link", "set", dev, "up"]);
        }
        let addr = format!("{}/{}", self.addr, self.prefix_len);
        let mut add = vec![A::IP, "addr", "add", &addr, "dev", "up0"];
        add.extend_from_slice(A::ADDR_OPTIONS);
        ip(&add);
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
            ]);
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
                ]),
                None => ip(&[A::IP, "route", "add", prefix, "dev", "pod0"]),
            }
        }
        // bpf_fib_lookup answers only for an ingress interface that forwards.
        // This is the test's own namespace: nothing else is changed.
        fs::write(A::forwarding_sysctl("up0"), "1").expect("enable forwarding on up0");
        Node {
            uplink: ifindex("up0"),
        }
    }

    /// Runs `body` in a new network namespace holding the node.
    pub fn run<T: Send>(&self, body: impl FnOnce(&Node) -> T + Send) -> T {
        in_new_netns(|| body(&self.build()))
    }
}
