//! Packet fixtures through BPF_PROG_TEST_RUN for fragments and ICMP errors on
//! the tc pod path: the exact output frames, checksums included. Needs root.
//!
//! - A fragmented UDP datagram to the ClusterIP: its first fragment is
//!   DNATed like any packet, its later fragments (same IP id) get the same
//!   destination address; the fragments of the reply get the frontend as
//!   their source. A later fragment nothing is known about passes untouched
//!   and is counted.
//! - ICMP errors about translated flows (fragmentation needed, port
//!   unreachable, time exceeded) get their quoted header translated back, and
//!   the outer address where it is the backend's; errors about other flows
//!   and ICMP echo pass untouched.
use std::net::Ipv4Addr;

use crate::support::{capacities, cluster_ip, Case, Hook, Loaded, TC_ACT_OK, TC_ACT_UNSPEC};
use proxy_common::programs;
use proxy_testkit::packet::{
    checksum, checksums_valid, icmp_error_checksums_valid, icmp_frame, PacketSpec, ETH_HLEN,
};
use proxy_user::model::Protocol;

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
/// The node's address on the client's link (a router on the path).
const NODE: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 1);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const POD1: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);

const ICMP_DEST_UNREACH: u8 = 3;
const ICMP_PORT_UNREACH: u8 = 3;
const ICMP_FRAG_NEEDED: u8 = 4;
const ICMP_TIME_EXCEEDED: u8 = 11;

/// VIP:80/TCP → POD1:8080 and VIP:53/UDP → POD1:5353.
fn fixture() -> Loaded {
    Loaded::new(
        capacities(4096),
        vec![
            cluster_ip(VIP, 80, Protocol::Tcp, "web", &[(POD1, 8080)]),
            cluster_ip(VIP, 53, Protocol::Udp, "dns", &[(POD1, 5353)]),
        ],
    )
}

/// The IPv4 header checksum of a frame (fragments have no checksummable
/// L4 segment of their own).
fn ip_checksum_valid(frame: &[u8]) -> bool {
    let ihl = usize::from(frame[ETH_HLEN] & 0x0f) * 4;
    checksum(&frame[ETH_HLEN..ETH_HLEN + ihl], 0) == 0
}

/// The datagram the fragments of `frames` carry, reassembled: whether its L4
/// checksum is valid with the addresses of the first fragment.
fn reassembled_checksum_valid(frames: &[Vec<u8>]) -> bool {
    let mut payload = Vec::new();
    for frame in frames {
        let ihl = usize::from(frame[ETH_HLEN] & 0x0f) * 4;
        payload.extend_from_slice(&frame[ETH_HLEN + ihl..]);
    }
    let first = &frames[0];
    let mut whole = first[..ETH_HLEN + 20].to_vec();
    whole[ETH_HLEN] = 0x45;
    whole[ETH_HLEN + 2..ETH_HLEN + 4].copy_from_slice(&((20 + payload.len()) as u16).to_be_bytes());
    whole[ETH_HLEN + 6..ETH_HLEN + 8].copy_from_slice(&[0, 0]);
    whole[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&[0, 0]);
    let csum = checksum(&whole[ETH_HLEN..ETH_HLEN + 20], 0);
    whole[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&csum.to_be_bytes());
    whole.extend_from_slice(&payload);
    checksums_valid(&whole)
}

fn big_udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16, id: u16) -> PacketSpec {
    PacketSpec {
        payload: (0..3000u32).map(|i| (i * 7 % 251) as u8).collect(),
        frag_off: 0,
        ip_id: id,
        ..PacketSpec::udp(src, sport, dst, dport)
    }
}

#[test]
fn fragments_of_a_request_and_of_its_reply_follow_their_first_fragment() {
    let mut fx = fixture();
    let request = big_udp(CLIENT, 40000, VIP, 53, 0x4242);
    let request_out = PacketSpec {
        dst: POD1,
        dport: 5353,
        ..request.clone()
    };
    let reply = big_udp(POD1, 5353, CLIENT, 40000, 0x5151);
    let reply_out = PacketSpec {
        src: VIP,
        sport: 53,
        ..reply.clone()
    };
    let (request_in, request_want) = (request.fragments(1480), request_out.fragments(1480));
    let (reply_in, reply_want) = (reply.fragments(1480), reply_out.fragments(1480));
    assert_eq!(request_in.len(), 3, "first, middle and last fragment");

    let mut cases = Vec::new();
    for (i, role) in ["first", "middle", "last"].iter().enumerate() {
        cases.push(Case {
            name: format!("request: the {role} fragment gets the backend's address"),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: request_in[i].clone(),
            verdict: TC_ACT_OK,
            output: request_want[i].clone(),
        });
    }
    for (i, role) in ["first", "middle", "last"].iter().enumerate() {
        cases.push(Case {
            name: format!("reply: the {role} fragment gets the frontend as its source"),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: reply_in[i].clone(),
            verdict: TC_ACT_OK,
            output: reply_want[i].clone(),
        });
    }
    // Not a Service's datagram, or one whose first fragment has not been
    // seen: untouched, counted.
    let unknown = big_udp(CLIENT, 40001, VIP, 53, 0x7777).fragments(1480);
    cases.push(Case {
        name: "a later fragment of an unknown datagram passes untouched".into(),
        hook: Hook::Tc(programs::TC_FROM_POD),
        input: unknown[1].clone(),
        verdict: TC_ACT_UNSPEC,
        output: unknown[1].clone(),
    });
    // The reply's fragment id is known to sb_to_pod only.
    cases.push(Case {
        name: "a reply fragment seen by sb_from_pod is not translated there".into(),
        hook: Hook::Tc(programs::TC_FROM_POD),
        input: reply_in[2].clone(),
        verdict: TC_ACT_UNSPEC,
        output: reply_in[2].clone(),
    });
    fx.run_table(&cases, |_, _, frame| ip_checksum_valid(frame));

    // Each fragment's IP checksum was checked; the datagrams they make up
    // carry valid UDP checksums too.
    assert!(reassembled_checksum_valid(&request_want));
    assert!(reassembled_checksum_valid(&reply_want));
    assert!(checksums_valid(&request_out.build()));

    assert_eq!(fx.stat("frag_translated"), 4);
    assert_eq!(fx.stat("frag_unknown"), 2);
    assert_eq!(fx.stat("forwarded"), 1);
    assert_eq!(fx.stat("reversed"), 1);
    let rows = proxy_user::dataplane::maps::readback::read_services(fx.syncer.store());
    let dns = rows
        .iter()
        .find(|r| r.service == "test/dns")
        .expect("dns row");
    assert_eq!(
        (dns.packets, dns.new_flows),
        (3, 1),
        "every request fragment counted"
    );
    let stats = proxy_user::dataplane::maps::readback::read_stats(fx.syncer.store());
    let frags = stats
        .maps
        .iter()
        .find(|m| m.map == "SB_FRAG_V1")
        .expect("fragment map reported");
    assert_eq!(frags.entries, 2, "one entry per direction: {stats:?}");
}

#[test]
fn a_first_fragment_to_something_else_is_not_remembered() {
    let mut fx = fixture();
    let other = big_udp(CLIENT, 40002, POD2, 5353, 0x1111).fragments(1480);
    for frame in &other {
        assert_eq!(
            fx.tc(programs::TC_FROM_POD, frame, None),
            (TC_ACT_UNSPEC, frame.clone())
        );
    }
    assert_eq!(fx.stat("frag_unknown"), 2);
    assert_eq!(fx.stat("frag_translated"), 0);
}

/// The first `len` bytes of `spec`'s IPv4 packet: what an ICMP error quotes.
fn quote(spec: &PacketSpec, len: usize) -> Vec<u8> {
    spec.build()[ETH_HLEN..ETH_HLEN + len].to_vec()
}

#[test]
fn icmp_errors_about_translated_flows_are_translated_back() {
    let mut fx = fixture();
    // A TCP connection with a full-sized segment, and a UDP flow.
    let tcp_syn = PacketSpec::tcp(CLIENT, 45000, VIP, 80);
    let tcp_data = PacketSpec {
        tcp_flags: 0x18,
        payload: vec![0x61; 1400],
        ..tcp_syn.clone()
    };
    let udp = PacketSpec::udp(CLIENT, 45001, VIP, 53);
    assert_eq!(
        fx.tc(programs::TC_FROM_POD, &tcp_syn.build(), None).0,
        TC_ACT_OK
    );
    assert_eq!(
        fx.tc(programs::TC_FROM_POD, &udp.build(), None).0,
        TC_ACT_OK
    );
    // The packets as the backend's side of the node saw them.
    let to_backend = |p: &PacketSpec, port| PacketSpec {
        dst: POD1,
        dport: port,
        ..p.clone()
    };
    let tcp_seen = to_backend(&tcp_data, 8080);
    let udp_seen = to_backend(&udp, 5353);
    let mtu = 1280u32;
    // Linux quotes up to 576 bytes of the whole error: 548 of the packet.
    let long = 548;
    let short = 28;

    let mut cases = vec![
        Case {
            name: "frag-needed from the node about a TCP segment: quote back to the frontend, TCP checksum (quoted) fixed".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp_frame(NODE, CLIENT, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, mtu, &quote(&tcp_seen, long)),
            verdict: TC_ACT_OK,
            output: icmp_frame(NODE, CLIENT, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, mtu, &quote(&tcp_data, long)),
        },
        Case {
            name: "frag-needed from the backend about a TCP segment, 8 bytes quoted: outer source too".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp_frame(POD1, CLIENT, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, mtu, &quote(&tcp_seen, short)),
            verdict: TC_ACT_OK,
            output: icmp_frame(VIP, CLIENT, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, mtu, &quote(&tcp_data, short)),
        },
        Case {
            name: "frag-needed from a router about a UDP datagram: quoted UDP checksum fixed".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp_frame(NODE, CLIENT, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, mtu, &quote(&udp_seen, short)),
            verdict: TC_ACT_OK,
            output: icmp_frame(NODE, CLIENT, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, mtu, &quote(&udp, short)),
        },
        Case {
            name: "port unreachable from the backend about a UDP datagram".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp_frame(POD1, CLIENT, ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, 0, &quote(&udp_seen, short)),
            verdict: TC_ACT_OK,
            output: icmp_frame(VIP, CLIENT, ICMP_DEST_UNREACH, ICMP_PORT_UNREACH, 0, &quote(&udp, short)),
        },
        Case {
            name: "time exceeded from a router about a UDP datagram".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp_frame(NODE, CLIENT, ICMP_TIME_EXCEEDED, 0, 0, &quote(&udp_seen, short)),
            verdict: TC_ACT_OK,
            output: icmp_frame(NODE, CLIENT, ICMP_TIME_EXCEEDED, 0, 0, &quote(&udp, short)),
        },
    ];
    // The client answers a reply (from the frontend) with an error: the
    // quote's source and the outer destination become the backend.
    let reply_seen = PacketSpec::udp(VIP, 53, CLIENT, 45001);
    let reply_sent = PacketSpec::udp(POD1, 5353, CLIENT, 45001);
    cases.push(Case {
        name: "port unreachable from the client about a reply: to the backend".into(),
        hook: Hook::Tc(programs::TC_FROM_POD),
        input: icmp_frame(
            CLIENT,
            VIP,
            ICMP_DEST_UNREACH,
            ICMP_PORT_UNREACH,
            0,
            &quote(&reply_seen, short),
        ),
        verdict: TC_ACT_OK,
        output: icmp_frame(
            CLIENT,
            POD1,
            ICMP_DEST_UNREACH,
            ICMP_PORT_UNREACH,
            0,
            &quote(&reply_sent, short),
        ),
    });
    // Left alone.
    let untracked = PacketSpec::tcp(CLIENT, 46000, POD2, 8080);
    let untracked_error = icmp_frame(
        NODE,
        CLIENT,
        ICMP_DEST_UNREACH,
        ICMP_FRAG_NEEDED,
        mtu,
        &quote(&untracked, short),
    );
    cases.push(Case {
        name: "an error about an untracked flow passes untouched".into(),
        hook: Hook::Tc(programs::TC_TO_POD),
        input: untracked_error.clone(),
        verdict: TC_ACT_UNSPEC,
        output: untracked_error,
    });
    // The client's own packet quoted the way sb_to_pod would not see it
    // (about the frontend itself, untranslated): not a reply key.
    let about_frontend = icmp_frame(
        NODE,
        CLIENT,
        ICMP_DEST_UNREACH,
        ICMP_FRAG_NEEDED,
        mtu,
        &quote(&udp, short),
    );
    cases.push(Case {
        name: "an error quoting the frontend itself passes untouched".into(),
        hook: Hook::Tc(programs::TC_TO_POD),
        input: about_frontend.clone(),
        verdict: TC_ACT_UNSPEC,
        output: about_frontend,
    });
    let echo_request = icmp_frame(CLIENT, VIP, 8, 0, 0x0001_0001, b"ping-payload");
    let echo_reply = icmp_frame(POD1, CLIENT, 0, 0, 0x0001_0001, b"ping-payload");
    cases.push(Case {
        name: "ICMP echo request to the ClusterIP passes untouched".into(),
        hook: Hook::Tc(programs::TC_FROM_POD),
        input: echo_request.clone(),
        verdict: TC_ACT_UNSPEC,
        output: echo_request,
    });
    cases.push(Case {
        name: "ICMP echo reply passes untouched".into(),
        hook: Hook::Tc(programs::TC_TO_POD),
        input: echo_reply.clone(),
        verdict: TC_ACT_UNSPEC,
        output: echo_reply,
    });
    fx.run_table(&cases, |_, _, frame| {
        if frame[ETH_HLEN + 9] == 1 && frame[ETH_HLEN + 20] != 0 && frame[ETH_HLEN + 20] != 8 {
            icmp_error_checksums_valid(frame)
        } else {
            ip_checksum_valid(frame)
        }
    });
    // The long TCP quote holds the whole TCP header: its checksum is that of
    // the segment the client sent.
    let (_, out) = fx.tc(
        programs::TC_TO_POD,
        &icmp_frame(
            NODE,
            CLIENT,
            ICMP_DEST_UNREACH,
            ICMP_FRAG_NEEDED,
            mtu,
            &quote(&tcp_seen, long),
        ),
        None,
    );
    let quoted_tcp_csum = &out[ETH_HLEN + 20 + 8 + 20 + 16..][..2];
    assert_eq!(
        quoted_tcp_csum,
        &tcp_data.build()[ETH_HLEN + 20 + 16..][..2]
    );
    assert_eq!(fx.stat("icmp_error_translated"), 7);
}
