//! Packet fixtures for the uplink (north-south) programs through
//! BPF_PROG_TEST_RUN, for both address families: `sb_xdp_uplink` (XDP) and
//! its tc twin `sb_from_uplink` (which run their IPv6 bodies for ethertype
//! 0x86DD), and `sb_to_pod` on the uplink's egress. Each case feeds a frame
//! as if it arrived on an uplink and checks the verdict and the exact output
//! frame (checksums included, compared with a frame built from scratch, the
//! IPv6 checksum computed independently over the pseudo-header), the way
//! Katran's tests do. Needs root.
//!
//! Whether a backend is local or on another node is decided by a route lookup
//! (`bpf_fib_lookup`), so every test runs on a thread of its own that first
//! moves into a private network namespace (`unshare(CLONE_NEWNET)` affects the
//! calling thread only, and the `ip` commands it spawns inherit it). There it
//! builds a node ([`Uplinked::THIS_NODE`]), for IPv4:
//!
//! ```text
//! up0  (veth, 02:00:00:00:50:01) 192.168.50.1/24, forwarding on   <- the uplink
//!      neighbours 192.168.50.2 (gateway to other nodes) and 192.168.50.100 (client)
//!      route 10.244.2.0/24 via 192.168.50.2   (POD_REMOTE: another node)
//!      route 10.244.3.0/24 via 192.168.50.3   (a gateway without neighbour entry)
//! pod0 (veth)  route 10.244.1.0/24            (POD_LOCAL: a pod on this node)
//! ```
//!
//! and for IPv6 (the uplink also keeps its IPv4 address 192.168.50.1):
//!
//! ```text
//! up0  (veth, 02:00:00:00:50:01) fd00:50::1/64, forwarding on   <- the uplink
//!      neighbours fd00:50::2 (gateway to other nodes) and fd00:50::100 (client)
//!      route fd00:244:2::/64 via fd00:50::2   (POD_REMOTE: another node)
//!      route fd00:244:3::/64 via fd00:50::3   (a gateway without neighbour entry)
//! pod0 (veth)  route fd00:244:1::/64          (POD_LOCAL: a pod on this node)
//! ```
//!
//! The namespace goes away with the thread (every `ip` child is waited for).
//! Nothing here touches the namespace the tests were started in.
//!
//! A scenario the two families share is written once, generic over
//! [`Uplinked`], with its frontends programmed through the agent's model,
//! and run for each ([`both_families!`](crate::both_families): tests
//! `x::ipv4`, `x::ipv6`). What only one family has stays single-family; the
//! IPv6-only fixtures write the IPv6 maps directly with fixed service and
//! backend ids ([`standard6`]).
//!
//! - `local`: a backend on this node (DNAT only), `externalTrafficPolicy:
//!   Local`, `loadBalancerSourceRanges`, Maglev and source hashing;
//! - `remote`: a backend on another node (DNAT and SNAT, sent back out),
//!   what XDP leaves to tc, overlays, ICMP errors, SNAT ports;
//! - `dsr`: direct server return;
//! - `edges`: what is not ours, fragments, a frontend without endpoints.
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::support::{
    family::{with_macs, TestFamily},
    v6::Fe6,
    Loaded,
};
use proxy_common::frontend_flags;
use proxy_testkit::node::{Node, NodeSpec};
use proxy_testkit::packet6::{Packet6, PROTO_TCP, PROTO_UDP};
use proxy_testkit::Frame;
use proxy_user::model::{BackendAddr, Frontend, FrontendKind, Protocol};

mod dsr;
mod edges;
mod local;
mod remote;

const UPLINK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x50, 0x01];
const GATEWAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x64];
const NODE_PORT: u16 = 30080;
const POD_PORT: u16 = 8080;
/// The uplink's IPv4 address (the IPv6 fixtures' node keeps it too).
const NODE4: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);

/// The uplink node of one family: its addresses and how its uplink is
/// made.
pub trait Uplinked: TestFamily {
    /// The node's address on its uplink `up0`.
    const NODE: Self;
    /// The next hop to the other nodes' pods.
    const GATEWAY: Self;
    /// A client outside the node, on the uplink's subnet.
    const CLIENT: Self;
    /// A pod on this node (routed through `pod0`, not an uplink).
    const POD_LOCAL: Self;
    /// A pod on another node (routed through the uplink, via GATEWAY).
    const POD_REMOTE: Self;
    /// A pod on another node whose gateway has no neighbour entry.
    const POD_UNRESOLVED: Self;
    /// A pod of this node acting as an in-cluster client.
    const POD_CLIENT: Self;
    const LB_IP: Self;
    const EXTERNAL_IP: Self;
    /// The frontend's node of a flow returned directly (another node, whose
    /// NodePort this node's backend answers for).
    const BALANCER: Self;
    /// The node: see the module documentation.
    const THIS_NODE: NodeSpec<Self>;

    /// Makes `up0` the node's uplink with address NODE (and, for IPv6,
    /// NODE4 too).
    fn set_uplink(fx: &mut Loaded, node: &Node);

    /// The packet `p` as it arrives from the client: its Ethernet addresses
    /// the client's and the uplink's (IPv4's builder has fixed ones).
    fn from_client(p: Self::Packet) -> Self::Packet;

    /// The packet `p` with the direct-server-return option (header)
    /// naming frontend `addr:port`, built.
    fn with_dsr(p: &Self::Packet, addr: Self, port: u16) -> Vec<u8>;

    /// What the uplink answers a packet too large to carry the option with
    /// (IPv4: fragmentation needed; IPv6: packet too big), from the
    /// frontend.
    fn too_big_for_the_option(frame: &[u8]) -> Vec<u8>;

    /// How many bytes the option (header) adds to a packet.
    const OPTION_LEN: usize;
}

impl Uplinked for Ipv4Addr {
    const NODE: Self = NODE4;
    const GATEWAY: Self = Ipv4Addr::new(192, 168, 50, 2);
    const CLIENT: Self = Ipv4Addr::new(192, 168, 50, 100);
    const POD_LOCAL: Self = Ipv4Addr::new(10, 244, 1, 2);
    const POD_REMOTE: Self = Ipv4Addr::new(10, 244, 2, 2);
    const POD_UNRESOLVED: Self = Ipv4Addr::new(10, 244, 3, 2);
    const POD_CLIENT: Self = Ipv4Addr::new(10, 244, 1, 50);
    const LB_IP: Self = Ipv4Addr::new(192, 168, 60, 10);
    const EXTERNAL_IP: Self = Ipv4Addr::new(192, 168, 70, 10);
    const BALANCER: Self = Ipv4Addr::new(192, 168, 50, 9);
    const THIS_NODE: NodeSpec<Self> = NodeSpec {
        uplink_mac: UPLINK_MAC,
        addr: NODE4,
        prefix_len: 24,
        neighbours: &[
            (Ipv4Addr::new(192, 168, 50, 2), GATEWAY_MAC),
            (Ipv4Addr::new(192, 168, 50, 100), CLIENT_MAC),
        ],
        routes: &[
            ("10.244.2.0/24", Some(Ipv4Addr::new(192, 168, 50, 2))),
            ("10.244.3.0/24", Some(Ipv4Addr::new(192, 168, 50, 3))),
            ("10.244.1.0/24", None),
        ],
    };

    const OPTION_LEN: usize = proxy_common::dsr::OPT4_LEN as usize;

    fn set_uplink(fx: &mut Loaded, node: &Node) {
        fx.set_uplink(node.uplink, NODE4);
    }

    fn from_client(p: Self::Packet) -> Self::Packet {
        p
    }

    fn with_dsr(p: &Self::Packet, addr: Self, port: u16) -> Vec<u8> {
        let mut opt = vec![proxy_common::dsr::OPT4_TYPE, proxy_common::dsr::OPT4_LEN];
        opt.extend_from_slice(&port.to_be_bytes());
        opt.extend_from_slice(&addr.octets());
        crate::support::rewritten(p, |p| p.ip_options = opt)
    }

    fn too_big_for_the_option(frame: &[u8]) -> Vec<u8> {
        proxy_testkit::packet::icmp_fragmentation_needed(frame, 1500 - 8)
    }
}

const NODE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 1);
const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 2);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 0x100);
const POD_LOCAL6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 2);
const POD_LOCAL6_2: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 3);
const POD_REMOTE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 2);
const POD_UNRESOLVED6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 3, 0, 0, 0, 0, 2);
const LB_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x60, 0, 0, 0, 0, 0, 0x10);

impl Uplinked for Ipv6Addr {
    const NODE: Self = NODE6;
    const GATEWAY: Self = GATEWAY6;
    const CLIENT: Self = CLIENT6;
    const POD_LOCAL: Self = POD_LOCAL6;
    const POD_REMOTE: Self = POD_REMOTE6;
    const POD_UNRESOLVED: Self = POD_UNRESOLVED6;
    const POD_CLIENT: Self = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 0x50);
    const LB_IP: Self = LB_IP6;
    const EXTERNAL_IP: Self = Ipv6Addr::new(0xfd00, 0x70, 0, 0, 0, 0, 0, 0x10);
    const BALANCER: Self = Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 9);
    const THIS_NODE: NodeSpec<Self> = NodeSpec {
        uplink_mac: UPLINK_MAC,
        addr: NODE6,
        prefix_len: 64,
        neighbours: &[(GATEWAY6, GATEWAY_MAC), (CLIENT6, CLIENT_MAC)],
        routes: &[
            ("fd00:244:2::/64", Some(GATEWAY6)),
            (
                "fd00:244:3::/64",
                Some(Ipv6Addr::new(0xfd00, 0x50, 0, 0, 0, 0, 0, 3)),
            ),
            ("fd00:244:1::/64", None),
        ],
    };

    const OPTION_LEN: usize = proxy_common::dsr::HDR6_LEN as usize;

    fn set_uplink(fx: &mut Loaded, node: &Node) {
        fx.set_uplink(node.uplink, NODE4);
        fx.set_uplink6(node.uplink, Some(NODE6));
    }

    fn from_client(p: Packet6) -> Packet6 {
        Packet6 {
            src_mac: CLIENT_MAC,
            dst_mac: UPLINK_MAC,
            ..p
        }
    }

    fn with_dsr(p: &Packet6, addr: Self, port: u16) -> Vec<u8> {
        with_dsr_header(p.build(), addr, port)
    }

    fn too_big_for_the_option(frame: &[u8]) -> Vec<u8> {
        let mtu = 1500 - u32::from(proxy_common::dsr::HDR6_LEN);
        proxy_testkit::packet6::icmp6_frame_macs(
            UPLINK_MAC,
            CLIENT_MAC,
            NODE6,
            CLIENT6,
            2,
            0,
            mtu,
            &frame[14..14 + 56],
        )
    }
}

/// `frame` (no extension headers) with the destination options header
/// naming frontend `addr:port` after its fixed header.
fn with_dsr_header(frame: Vec<u8>, addr: Ipv6Addr, port: u16) -> Vec<u8> {
    use proxy_common::dsr;
    let mut hdr = vec![
        frame[20],
        dsr::HDR6_EXT_LEN,
        dsr::OPT6_TYPE,
        dsr::OPT6_DATA_LEN,
    ];
    hdr.extend_from_slice(&port.to_be_bytes());
    hdr.extend_from_slice(&[0, 0]);
    hdr.extend_from_slice(&addr.octets());
    let mut out = frame[..54].to_vec();
    out[20] = proxy_testkit::packet6::NEXTHDR_DEST;
    let len = u16::from_be_bytes([out[18], out[19]]) + u16::from(dsr::HDR6_LEN);
    out[18..20].copy_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&hdr);
    out.extend_from_slice(&frame[54..]);
    out
}

// ---------------------------------------------------------------------------
// Frontends and the loaded programs.

/// A frontend of `test/name` balancing over `backends`, each on POD_PORT.
fn frontend<F: Uplinked>(
    kind: FrontendKind,
    ip: F,
    port: u16,
    protocol: Protocol,
    name: &str,
    backends: &[F],
) -> Frontend {
    let backends: Vec<_> = backends.iter().map(|&ip| (ip, POD_PORT)).collect();
    crate::support::frontend(kind, ip, port, protocol, name, &backends)
}

/// A NodePort of `protocol` on NODE to `backends`.
fn node_port<F: Uplinked>(protocol: Protocol, name: &str, backends: &[F]) -> Frontend {
    frontend(
        FrontendKind::NodePort,
        F::NODE,
        NODE_PORT,
        protocol,
        name,
        backends,
    )
}

/// `externalTrafficPolicy: Local` with `external` as this node's endpoints.
fn local_policy<F: Uplinked>(mut fe: Frontend, external: &[F]) -> Frontend {
    fe.local_only = true;
    fe.external_backends = Some(
        external
            .iter()
            .map(|ip| BackendAddr {
                ip: (*ip).into(),
                port: POD_PORT,
            })
            .collect(),
    );
    fe
}

/// Loads the programs (in the calling thread's namespace) with room for
/// every SNAT port of one backend, programs `frontends` and makes `up0` the
/// node's uplink with address NODE.
fn uplinked<F: Uplinked>(node: &Node, frontends: Vec<Frontend>) -> Loaded {
    let mut fx = Loaded::on_uplink(node, NODE4, frontends);
    F::set_uplink(&mut fx, node);
    fx
}

/// What a router sends on: TTL one less, MACs of the next hop.
fn routed<F: TestFamily>(frame: Vec<u8>, next_hop_mac: [u8; 6]) -> Vec<u8> {
    let ttl = F::ttl_of(&frame);
    with_macs(F::with_ttl(frame, ttl - 1), next_hop_mac, UPLINK_MAC)
}

fn src_of<F: TestFamily>(frame: &[u8]) -> (F, u16) {
    F::Packet::src_of(frame)
}

fn dst_of<F: TestFamily>(frame: &[u8]) -> (F, u16) {
    F::Packet::dst_of(frame)
}

// ---------------------------------------------------------------------------
// The IPv6-only fixtures' maps.

const REMOTE_PORT: u16 = 30081;
const UNRESOLVED_PORT: u16 = 30082;
const EMPTY_LOCAL_PORT: u16 = 30083;

/// Loads the programs with no frontend and makes `up0` the uplink, with
/// IPv6 address `addr` (none: all-zero).
fn uplinked6(node: &Node, addr: Option<Ipv6Addr>) -> Loaded {
    let mut fx = Loaded::on_uplink(node, NODE4, Vec::new());
    fx.set_uplink6(node.uplink, addr);
    fx
}

/// The IPv6-only fixtures' frontends, written to the IPv6 maps directly:
/// the usual NodePort (TCP and UDP) to one local backend, a NodePort to a
/// remote backend, one to a backend behind an unresolved gateway, an
/// `externalTrafficPolicy: Local` LoadBalancer IP and a Local NodePort
/// without local endpoints.
fn standard6(fx: &mut Loaded) {
    let np = frontend_flags::KIND_NODE_PORT;
    let mut write = |port, proto, service_id, kind, backends: &[(u32, Ipv6Addr)], local| {
        fx.maps6.write(&Fe6 {
            addr: if port == 80 { LB_IP6 } else { NODE6 },
            port,
            proto,
            service_id,
            kind,
            backend_port: POD_PORT,
            backends,
            local,
        })
    };
    write(NODE_PORT, PROTO_TCP, 1, np, &[(101, POD_LOCAL6)], None);
    write(NODE_PORT, PROTO_UDP, 2, np, &[(102, POD_LOCAL6)], None);
    write(REMOTE_PORT, PROTO_TCP, 3, np, &[(103, POD_REMOTE6)], None);
    write(REMOTE_PORT, PROTO_UDP, 4, np, &[(104, POD_REMOTE6)], None);
    write(
        UNRESOLVED_PORT,
        PROTO_TCP,
        5,
        np,
        &[(105, POD_UNRESOLVED6)],
        None,
    );
    write(
        80,
        PROTO_TCP,
        6,
        frontend_flags::KIND_LOAD_BALANCER,
        &[(106, POD_REMOTE6), (107, POD_LOCAL6_2)],
        Some(&[(107, POD_LOCAL6_2)]),
    );
    write(
        EMPTY_LOCAL_PORT,
        PROTO_TCP,
        7,
        np,
        &[(108, POD_REMOTE6)],
        Some(&[]),
    );
}

/// The forward entry of the client's flow from `sport` to NODE6's `dport`.
fn client_entry(fx: &Loaded, proto: u8, sport: u16, dport: u16) -> proxy_common::CtEntry6 {
    fx.maps6
        .ct(&crate::support::v6::ct_key6(
            CLIENT6,
            sport,
            NODE6,
            dport,
            proto,
            proxy_common::ct_dir::FORWARD,
        ))
        .expect("forward entry")
}

/// The SNAT port a remote flow got (from its forward entry).
fn snat_port(fx: &Loaded, proto: u8, sport: u16, dport: u16) -> u16 {
    let fwd = client_entry(fx, proto, sport, dport);
    assert_ne!(
        fwd.flags & proxy_common::ct_flags::SNAT,
        0,
        "a source-NATed flow"
    );
    assert_eq!(fwd.snat_addr_be, proxy_common::addr6_be(NODE6.octets()));
    u16::from_be(fwd.snat_port_be)
}

/// An IPv6 packet from the client (its MAC address to the uplink's).
fn from_client6(p: Packet6) -> Packet6 {
    <Ipv6Addr as Uplinked>::from_client(p)
}

/// `frame` with hop limit `hop_limit`.
fn with_hop_limit(frame: Vec<u8>, hop_limit: u8) -> Vec<u8> {
    Ipv6Addr::with_ttl(frame, hop_limit)
}
