//! Packet fixtures on the tc pod path through BPF_PROG_TEST_RUN, for both
//! address families: each case feeds a frame to `sb_from_pod` or
//! `sb_to_pod` and checks the verdict and the exact output frame, the way
//! Katran's tests do; translated frames must also carry valid checksums,
//! computed here (over the IPv6 pseudo-header for IPv6). Needs root
//! (CAP_BPF).
//!
//! A scenario the two families share is written once, generic over
//! [`Pods`] (the family's addresses), and run for each
//! ([`both_families!`](crate::both_families): tests `x::ipv4`, `x::ipv6`);
//! the frontends it needs are programmed through the agent's model. What
//! only one family has (IPv4 options and ARP, IPv6 extension headers and
//! neighbour discovery, the IPv6 answers of a frontend without endpoints)
//! stays single-family; the IPv6-only fixtures write the IPv6 maps directly
//! with fixed service and backend ids ([`fixture6`]).
//!
//! - `parsing`: what the programs translate and what they leave alone
//!   (headers, malformed frames, fragments), with the counters it leaves;
//! - `flows`: conntrack and balancing: replies, closing connections,
//!   affinity, spreading, draining, a full table, hairpin;
//! - `answers`: what a frontend without endpoints answers, ICMP errors
//!   about translated flows.
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::support::{capacities, cluster_ip, family::TestFamily, v6::Maps6, Loaded};
use proxy_testkit::packet6::{PROTO_TCP, PROTO_UDP};
use proxy_user::dataplane::load::ip_summed::Access;
use proxy_user::model::{Frontend, Protocol};

mod answers;
mod flows;
mod parsing;

/// The addresses of the pod-path fixtures, per family.
pub trait Pods: TestFamily {
    /// A pod of this node, the client.
    const CLIENT: Self;
    /// The ClusterIP of `web` (TCP 80) and `dns` (UDP 53).
    const VIP: Self;
    /// The ClusterIP of `empty`, without endpoints.
    const EMPTY_VIP: Self;
    const POD1: Self;
    const POD2: Self;
    const POD3: Self;
    /// Another client pod, the `n`th.
    fn other_client(n: u8) -> Self;
}

const CLIENT4: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
const VIP4: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const POD1_4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);

impl Pods for Ipv4Addr {
    const CLIENT: Self = CLIENT4;
    const VIP: Self = VIP4;
    const EMPTY_VIP: Self = Ipv4Addr::new(10, 96, 0, 99);
    const POD1: Self = POD1_4;
    const POD2: Self = Ipv4Addr::new(10, 244, 2, 2);
    const POD3: Self = Ipv4Addr::new(10, 244, 3, 2);
    fn other_client(n: u8) -> Self {
        Ipv4Addr::new(10, 244, 200, n)
    }
}

const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0x100, 0, 0, 0, 0, 2);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
const AFFINITY_VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x20);
const EMPTY_VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x99);
const POD1_6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 2);
const POD2_6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 2);
/// A router on the pods' way out (the source of ICMPv6 errors).
const ROUTER6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0xff, 0, 0, 0, 0, 1);

impl Pods for Ipv6Addr {
    const CLIENT: Self = CLIENT6;
    const VIP: Self = VIP6;
    const EMPTY_VIP: Self = EMPTY_VIP6;
    const POD1: Self = POD1_6;
    const POD2: Self = POD2_6;
    const POD3: Self = Ipv6Addr::new(0xfd00, 0x244, 3, 0, 0, 0, 0, 2);
    fn other_client(n: u8) -> Self {
        Ipv6Addr::new(0xfd00, 0x244, 0x200, 0, 0, 0, 0, u16::from(n))
    }
}

/// One backend per frontend, so every rewrite is predictable (`web`: TCP 80
/// to POD1:8080, `dns`: UDP 53 to POD1:5353), plus `empty`, a frontend
/// without endpoints.
fn single_backend<F: Pods>() -> Loaded {
    single_backend_as::<F>(&Access::detect())
}

/// [`single_backend`] with the checksum state read as `access` says.
fn single_backend_as<F: Pods>(access: &Access) -> Loaded {
    let frontends = vec![
        cluster_ip(F::VIP, 80, Protocol::Tcp, "web", &[(F::POD1, 8080)]),
        cluster_ip(F::VIP, 53, Protocol::Udp, "dns", &[(F::POD1, 5353)]),
        cluster_ip(F::EMPTY_VIP, 80, Protocol::Tcp, "empty", &[]),
    ];
    Loaded::new_as(capacities(4096), frontends, access)
}

fn loaded(frontends: Vec<Frontend>) -> Loaded {
    Loaded::new(capacities(4096), frontends)
}

/// Service ids of the IPv6 frontends [`fixture6`] writes.
const SVC_WEB: u32 = 10;
const SVC_DNS: u32 = 11;
const SVC_EMPTY_TCP: u32 = 12;
const SVC_EMPTY_UDP: u32 = 13;
const SVC_STICKY: u32 = 14;
const SVC_SELF: u32 = 15;

/// The IPv6-only fixtures' frontends, written to the IPv6 maps directly:
/// one backend per frontend (as [`single_backend`], backend ids 901 and
/// 902), two frontends without endpoints (TCP and UDP), one with affinity
/// over two backends, and one whose backend is the client pod itself
/// (hairpin).
fn fixture6() -> Loaded {
    let mut fx = Loaded::new(capacities(4096), Vec::new());
    write_fixture6(&mut fx.maps6);
    fx
}

fn write_fixture6(maps: &mut Maps6) {
    maps.frontend(VIP6, 80, PROTO_TCP, SVC_WEB, None, &[(901, POD1_6, 8080)]);
    maps.frontend(VIP6, 53, PROTO_UDP, SVC_DNS, None, &[(902, POD1_6, 5353)]);
    maps.frontend(EMPTY_VIP6, 80, PROTO_TCP, SVC_EMPTY_TCP, None, &[]);
    maps.frontend(EMPTY_VIP6, 53, PROTO_UDP, SVC_EMPTY_UDP, None, &[]);
    maps.frontend(
        AFFINITY_VIP6,
        80,
        PROTO_TCP,
        SVC_STICKY,
        Some(600),
        &[(903, POD1_6, 8080), (904, POD2_6, 8080)],
    );
    maps.frontend(
        VIP6,
        9090,
        PROTO_TCP,
        SVC_SELF,
        None,
        &[(905, CLIENT6, 9191)],
    );
}
