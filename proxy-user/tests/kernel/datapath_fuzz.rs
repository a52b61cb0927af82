//! Random and mutated frames through every tc and XDP program with
//! BPF_PROG_TEST_RUN, against properties rather than expected frames:
//!
//! - the program never fails: the test run succeeds and the verdict is one
//!   the program may return (never `XDP_ABORTED`, never an unknown tc action);
//! - a frame that is not ours (no address of a frontend, a backend or the
//!   node in it, outer or quoted) comes out unchanged and passes;
//! - a frame that came in with valid checksums and was changed leaves with
//!   valid checksums (a frame with bad checksums is never "repaired" into a
//!   valid one either way: only frames valid on input are judged).
//!
//! Frames are built from Services' and flows' shapes (SYNs, replies, ICMP
//! errors quoting a flow, fragments, IP options; for IPv6 extension headers,
//! fragment headers and ICMPv6 errors and neighbour discovery), from random
//! addresses, and from random bytes, then mutated (bytes flipped, cut
//! short). ICMPv6 informational messages (neighbour discovery) must also
//! pass the uplink programs untouched, and IPv6 fragments the XDP program
//! (IPv6 to a frontend is translated there, as IPv4 is). The maps
//! keep their state from frame to frame, so replies meet real flows. The
//! programs run in a network namespace of their own (the uplink programs'
//! route lookups see only its loopback). Needs root.
use std::{
    cell::RefCell,
    net::{Ipv4Addr, Ipv6Addr},
};

use crate::support::{
    capacities, netns::in_new_netns, require_root, v6::Maps6, Hook, Loaded, TC_ACT_OK,
    TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC, XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX,
};
use proptest::{
    prelude::*,
    test_runner::{Config, TestCaseError, TestRunner},
};
use proxy_common::programs;
use proxy_testkit::packet::{
    checksums_valid, icmp_checksums_valid, icmp_error_checksums_valid, icmp_frame, PacketSpec,
    ETH_HLEN,
};
use proxy_testkit::packet6::{checksums_valid6, icmp6_frame, parse6, Packet6};
use proxy_user::model::{Frontend, FrontendKind, Protocol};

const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 99);
const LB_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 60, 10);
const PODS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 244, 1, 2),
    Ipv4Addr::new(10, 244, 2, 2),
    Ipv4Addr::new(10, 244, 3, 2),
];
const CLIENTS: [Ipv4Addr; 2] = [
    Ipv4Addr::new(10, 244, 100, 2),
    Ipv4Addr::new(192, 168, 50, 100),
];
const NODE_PORT: u16 = 30080;
/// Frontend ports; TCP and UDP on each.
const PORTS: [u16; 2] = [80, 53];
const POD_PORT: u16 = 8080;

/// Every address that makes a frame ours: frontends, backends and the node.
fn ours(addr: Ipv4Addr) -> bool {
    [NODE, VIP, EMPTY_VIP, LB_IP].contains(&addr) || PODS.contains(&addr)
}

const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
const EMPTY_VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x99);
const STICKY_VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x20);
const PODS6: [Ipv6Addr; 3] = [
    Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0x244, 2, 0, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0x244, 3, 0, 0, 0, 0, 2),
];
const CLIENTS6: [Ipv6Addr; 2] = [
    Ipv6Addr::new(0xfd00, 0x244, 0x100, 0, 0, 0, 0, 2),
    Ipv6Addr::new(0xfd00, 0x244, 0x100, 0, 0, 0, 0, 3),
];

/// The IPv6 addresses that make a frame ours: frontends, backends (the
/// first client is also a backend: hairpin) and the hairpin address.
fn ours6(addr: Ipv6Addr) -> bool {
    [
        VIP6,
        EMPTY_VIP6,
        STICKY_VIP6,
        CLIENTS6[0],
        Ipv6Addr::from(proxy_common::hairpin::ADDR6),
    ]
    .contains(&addr)
        || PODS6.contains(&addr)
}

/// The IPv6 frontends, written straight into the IPv6 maps (service ids
/// above the IPv4 ones, backend ids far from theirs).
fn frontends6(maps: &mut Maps6) {
    let mut id = 40;
    let mut backend = 900;
    for proto in [6u8, 17] {
        for port in PORTS {
            let mut next = |count: usize, pods: &[Ipv6Addr]| {
                let list: Vec<_> = pods
                    .iter()
                    .take(count)
                    .map(|&ip| {
                        backend += 1;
                        (backend, ip, POD_PORT)
                    })
                    .collect();
                id += 1;
                (id, list)
            };
            let (sid, list) = next(3, &PODS6);
            maps.frontend(VIP6, port, proto, sid, None, &list);
            let (sid, _) = next(0, &[]);
            maps.frontend(EMPTY_VIP6, port, proto, sid, None, &[]);
            let (sid, list) = next(2, &[PODS6[0], CLIENTS6[0]]);
            maps.frontend(STICKY_VIP6, port, proto, sid, Some(60), &list);
        }
    }
}

fn service(
    ip: Ipv4Addr,
    port: u16,
    protocol: Protocol,
    name: &str,
    kind: FrontendKind,
    backends: &[Ipv4Addr],
) -> Frontend {
    let backends: Vec<_> = backends.iter().map(|&ip| (ip, POD_PORT)).collect();
    let mut frontend = crate::support::frontend(kind, ip, port, protocol, name, &backends);
    frontend.service.namespace = "fuzz".into();
    frontend
}

fn frontends() -> Vec<Frontend> {
    let mut all = Vec::new();
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        for port in PORTS {
            all.push(service(
                VIP,
                port,
                protocol,
                "web",
                FrontendKind::ClusterIp,
                &PODS,
            ));
            all.push(service(
                EMPTY_VIP,
                port,
                protocol,
                "empty",
                FrontendKind::ClusterIp,
                &[],
            ));
            all.push(service(
                LB_IP,
                port,
                protocol,
                "lb",
                FrontendKind::LoadBalancer,
                &PODS[..2],
            ));
        }
        all.push(service(
            NODE,
            NODE_PORT,
            protocol,
            "np",
            FrontendKind::NodePort,
            &PODS,
        ));
    }
    all
}

/// The programs under test, loaded once and fed frame after frame.
fn load() -> Loaded {
    let mut loaded = Loaded::new(capacities(8192), frontends());
    frontends6(&mut loaded.maps6);
    // The namespace's loopback stands in for the uplink.
    loaded.set_uplink(1, NODE);
    loaded
}

const FROM_POD: Hook = Hook::Tc(programs::TC_FROM_POD);
const TO_POD: Hook = Hook::Tc(programs::TC_TO_POD);
const FROM_UPLINK: Hook = Hook::UplinkTc(programs::TC_FROM_UPLINK);

/// A frame and the program it goes to.
#[derive(Clone)]
struct Input {
    hook: Hook,
    frame: Vec<u8>,
}

impl std::fmt::Debug for Input {
    /// The hook and the frame in hex, one line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} ", self.hook)?;
        self.frame
            .iter()
            .try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

fn any_addr() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        3 => proptest::sample::select(vec![NODE, VIP, EMPTY_VIP, LB_IP, PODS[0], PODS[1], PODS[2], CLIENTS[0], CLIENTS[1]]),
        1 => any::<u32>().prop_map(Ipv4Addr::from),
    ]
}

fn any_port() -> impl Strategy<Value = u16> {
    prop_oneof![
        3 => proptest::sample::select(vec![80u16, 53, NODE_PORT, POD_PORT, 40000]),
        1 => any::<u16>(),
    ]
}

/// A TCP, UDP or other-protocol packet between random (often our) addresses.
fn l4_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        any_addr(),
        any_addr(),
        any_port(),
        any_port(),
        prop_oneof![4 => Just(6u8), 4 => Just(17u8), 1 => any::<u8>()],
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..64),
        prop_oneof![4 => Just(0u8), 1 => 1..4u8],
        prop_oneof![4 => Just(0x4000u16), 1 => Just(0x2000u16), 1 => 1..0x2000u16, 1 => any::<u16>()],
    )
        .prop_map(|(src, dst, sport, dport, proto, tcp_flags, payload, ip_option_words, frag_off)| {
            PacketSpec {
                proto,
                payload,
                ip_option_words,
                frag_off,
                tcp_flags,
                ..PacketSpec::tcp(src, sport, dst, dport)
            }
            .build()
        })
}

/// An ICMP error (or echo) from a random sender quoting a packet of a flow.
fn icmp_frame_about_a_flow() -> impl Strategy<Value = Vec<u8>> {
    (
        any_addr(),
        any_addr(),
        l4_frame(),
        prop_oneof![
            Just((3u8, 4u8)),
            Just((3, 3)),
            Just((11, 0)),
            Just((8, 0)),
            (any::<u8>(), any::<u8>())
        ],
        0..40usize,
    )
        .prop_map(|(src, dst, quoted, (icmp_type, code), cut)| {
            let inner = &quoted[ETH_HLEN..];
            let keep = inner.len().saturating_sub(cut).max(1);
            icmp_frame(src, dst, icmp_type, code, 1400, &inner[..keep])
        })
}

fn any_addr6() -> impl Strategy<Value = Ipv6Addr> {
    prop_oneof![
        3 => proptest::sample::select(vec![
            VIP6, EMPTY_VIP6, STICKY_VIP6, PODS6[0], PODS6[1], PODS6[2], CLIENTS6[0], CLIENTS6[1],
            Ipv6Addr::from(proxy_common::hairpin::ADDR6),
        ]),
        1 => any::<u128>().prop_map(Ipv6Addr::from),
    ]
}

/// An IPv6 TCP, UDP or other-protocol packet between random (often our)
/// addresses, with or without extension headers, whole or a fragment.
fn l4_frame6() -> impl Strategy<Value = Vec<u8>> {
    (
        (any_addr6(), any_addr6(), any_port(), any_port()),
        prop_oneof![4 => Just(6u8), 4 => Just(17u8), 1 => any::<u8>()],
        any::<u8>(),
        proptest::collection::vec(any::<u8>(), 0..64),
        prop_oneof![
            4 => Just(Vec::new()),
            1 => proptest::collection::vec(prop_oneof![Just(0u8), Just(43), Just(60), Just(51), any::<u8>()], 1..6),
        ],
        proptest::option::weighted(0.2, (0..4usize, any::<u32>())),
        any::<bool>(),
    )
        .prop_map(|((src, dst, sport, dport), proto, tcp_flags, payload, ext, fragment, udp_zero_checksum)| {
            let spec = Packet6 {
                proto,
                tcp_flags,
                payload,
                ext,
                udp_zero_checksum: udp_zero_checksum && proto == 17,
                ..Packet6::tcp(src, sport, dst, dport)
            };
            match fragment {
                Some((index, id)) => {
                    let mut pieces = spec.fragments(16, id);
                    let at = index % pieces.len();
                    pieces.swap_remove(at)
                }
                None => spec.build(),
            }
        })
}

/// An ICMPv6 error, informational message or neighbour discovery message
/// from a random sender quoting a packet of a flow.
fn icmp6_frame_about_a_flow() -> impl Strategy<Value = Vec<u8>> {
    (
        any_addr6(),
        any_addr6(),
        l4_frame6(),
        prop_oneof![
            Just((1u8, 4u8)),
            Just((2, 0)),
            Just((3, 0)),
            Just((4, 0)),
            Just((128, 0)),
            Just((135, 0)),
            Just((136, 0)),
            (any::<u8>(), any::<u8>())
        ],
        0..40usize,
    )
        .prop_map(|(src, dst, quoted, (icmp_type, code), cut)| {
            let inner = &quoted[ETH_HLEN..];
            let keep = inner.len().saturating_sub(cut).max(1);
            icmp6_frame(src, dst, icmp_type, code, 1280, &inner[..keep])
        })
}

/// Something that is not IPv4 at all, or random bytes claiming to be.
fn other_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![
            Just(0x0806u16),
            Just(0x86dd),
            Just(0x8100),
            Just(0x0800),
            any::<u16>()
        ],
        proptest::collection::vec(any::<u8>(), 40..120),
    )
        .prop_map(|(ethertype, body)| {
            let mut frame = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
            frame.extend_from_slice(&ethertype.to_be_bytes());
            frame.extend_from_slice(&body);
            frame
        })
}

/// Flips a few bytes and may cut the frame short (never inside the IPv4
/// header's first 20 bytes, or the IPv6 header's 40: the test run itself
/// refuses such frames).
fn mutated(frame: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = frame.len();
    let ip_header = if is_ipv6(&frame) { 40 } else { 20 };
    (
        proptest::collection::vec((0..len, any::<u8>()), 0..4),
        proptest::option::weighted(0.2, (ETH_HLEN + ip_header).min(len)..=len),
    )
        .prop_map(move |(flips, cut)| {
            let mut frame = frame.clone();
            for (at, byte) in flips {
                frame[at] ^= byte;
            }
            if let Some(cut) = cut {
                frame.truncate(cut);
            }
            frame
        })
}

fn input() -> impl Strategy<Value = Input> {
    let frame = prop_oneof![
        6 => l4_frame(),
        2 => icmp_frame_about_a_flow(),
        4 => l4_frame6(),
        2 => icmp6_frame_about_a_flow(),
        1 => other_frame(),
    ];
    let frame = prop_oneof![
        2 => frame.clone(),
        1 => frame.prop_flat_map(mutated),
    ];
    let hook = proptest::sample::select(vec![FROM_POD, TO_POD, FROM_UPLINK, Hook::UplinkXdp]);
    (hook, frame).prop_map(|(hook, frame)| Input { hook, frame })
}

/// Whether a frame names one of our addresses, IPv4 or IPv6 (outer, or
/// quoted in an ICMP error).
fn names_ours(frame: &[u8]) -> bool {
    addresses(frame).is_some_and(|addrs| addrs.into_iter().any(ours))
        || addresses6(frame).is_some_and(|addrs| addrs.into_iter().any(ours6))
}

/// The IPv6 addresses a frame names: the outer pair, and for ICMPv6 (after
/// the extension headers) the quoted pair too. `None` for a frame that is
/// not IPv6.
fn addresses6(frame: &[u8]) -> Option<Vec<Ipv6Addr>> {
    let parsed = parse6(frame)?;
    let mut all = vec![parsed.src, parsed.dst];
    if parsed.proto == 58 {
        let quoted = parsed.l4_off + 8;
        for at in [quoted + 8, quoted + 24] {
            if let Some(bytes) = frame.get(at..at + 16) {
                all.push(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?));
            }
        }
    }
    Some(all)
}

fn is_ipv6(frame: &[u8]) -> bool {
    frame.get(12..14) == Some(&[0x86, 0xdd])
}

/// The IPv4 addresses a frame names: the outer pair, and for ICMP the
/// quoted pair too. `None` for a frame that is not IPv4.
fn addresses(frame: &[u8]) -> Option<Vec<Ipv4Addr>> {
    let ethertype = frame.get(12..14)?;
    if ethertype != [0x08, 0x00] {
        return None;
    }
    let ip = frame.get(ETH_HLEN..)?;
    let pair = |header: &[u8]| -> Option<[Ipv4Addr; 2]> {
        let src: [u8; 4] = header.get(12..16)?.try_into().ok()?;
        let dst: [u8; 4] = header.get(16..20)?.try_into().ok()?;
        Some([Ipv4Addr::from(src), Ipv4Addr::from(dst)])
    };
    let mut all = pair(ip)?.to_vec();
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip.get(9) == Some(&1) {
        if let Some(quoted) = ip.get(ihl + 8..).and_then(pair) {
            all.extend(quoted);
        }
    }
    Some(all)
}

/// Whether every checksum of `frame` that can be checked is valid: the IPv4
/// header's; the TCP or UDP checksum of an unfragmented datagram; the ICMP
/// message's (and for an error the quoted header's).
fn checksums_hold(frame: &[u8]) -> bool {
    if is_ipv6(frame) {
        // TCP, UDP (a zero checksum may stay zero) or ICMPv6 over the
        // pseudo-header; fragments have nothing to judge.
        return checksums_valid6(frame, true);
    }
    if frame.get(12..14) != Some(&[0x08, 0x00]) {
        return true;
    }
    let Some(ip) = frame.get(ETH_HLEN..ETH_HLEN + 20) else {
        return false;
    };
    let fragmented = u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff != 0;
    match ip[9] {
        6 | 17 if !fragmented => checksums_valid(frame),
        1 if !fragmented => match frame.get(ETH_HLEN + usize::from(ip[0] & 0x0f) * 4) {
            Some(3 | 4 | 5 | 11 | 12) => icmp_error_checksums_valid(frame),
            _ => icmp_checksums_valid(frame),
        },
        _ => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            frame
                .get(ETH_HLEN..ETH_HLEN + ihl)
                .is_some_and(|header| proxy_testkit::packet::checksum(header, 0) == 0)
        }
    }
}

fn verdict_allowed(hook: Hook, verdict: u32) -> bool {
    match hook {
        Hook::UplinkXdp => [XDP_DROP, XDP_PASS, XDP_TX, XDP_REDIRECT].contains(&verdict),
        _ => [TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT, TC_ACT_UNSPEC].contains(&verdict),
    }
}

fn passes(hook: Hook, verdict: u32) -> bool {
    match hook {
        Hook::UplinkXdp => verdict == XDP_PASS,
        _ => verdict == TC_ACT_UNSPEC || verdict == TC_ACT_OK,
    }
}

/// Whether BPF_PROG_TEST_RUN takes the frame at all: it refuses an IPv4 or
/// IPv6 frame too short for the fixed IP header before any program runs.
fn test_run_takes(frame: &[u8]) -> bool {
    let ip_header = match frame.get(12..14) {
        Some([0x08, 0x00]) => 20,
        Some([0x86, 0xdd]) => 40,
        _ => 0,
    };
    frame.len() >= ETH_HLEN + ip_header
}

fn check(programs: &mut Loaded, input: &Input) -> Result<(), TestCaseError> {
    prop_assume!(test_run_takes(&input.frame));
    let (verdict, output) = programs
        .try_run(input.hook, &input.frame)
        .map_err(|error| TestCaseError::fail(format!("BPF_PROG_TEST_RUN failed: {error}")))?;
    prop_assert!(verdict_allowed(input.hook, verdict), "verdict {verdict:#x}");
    let not_ours = !names_ours(&input.frame);
    if is_ipv6(&input.frame)
        && matches!(input.hook, FROM_UPLINK | Hook::UplinkXdp)
        && parse6(&input.frame).is_some_and(|p| {
            let informational =
                p.proto == 58 && input.frame.get(p.l4_off).is_some_and(|&t| t >= 128);
            let fragment = p.fragment.is_some_and(|(offset, more)| offset != 0 || more);
            informational || (fragment && input.hook == Hook::UplinkXdp)
        })
    {
        // ICMPv6 informational messages (neighbour discovery above all)
        // pass the uplink programs untouched, ours or not (errors about
        // source-NATed flows are translated), and fragments pass the XDP
        // program untouched: it hands them on to tc, which translates them
        // as it does IPv4 ones. An atomic fragment, offset 0 without more
        // fragments, is a whole datagram (RFC 6946).
        prop_assert!(
            passes(input.hook, verdict),
            "ICMPv6 informational or a fragment on the uplink got verdict {verdict:#x}"
        );
        prop_assert_eq!(
            &output,
            &input.frame,
            "ICMPv6 informational or a fragment on the uplink was changed"
        );
    }
    if not_ours {
        prop_assert!(
            passes(input.hook, verdict),
            "a frame not ours got verdict {verdict:#x}"
        );
        prop_assert_eq!(&output, &input.frame, "a frame not ours was changed");
    }
    if output != input.frame && checksums_hold(&input.frame) {
        prop_assert!(
            checksums_hold(&output),
            "rewritten with invalid checksums: {output:02x?}"
        );
    }
    Ok(())
}

#[test]
fn random_and_mutated_frames_never_fail_never_touch_others_and_keep_checksums() {
    require_root();
    let cases: u32 = std::env::var("SB_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let outcome = in_new_netns(|| {
        let programs = RefCell::new(load());
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&input(), |input| check(&mut programs.borrow_mut(), &input))
            .map_err(|failure| failure.to_string())
    });
    if let Err(failure) = outcome {
        panic!("{failure}");
    }
}
