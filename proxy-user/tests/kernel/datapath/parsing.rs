//! What the pod programs translate and what they leave alone: one table of
//! requests, replies and frames that are not ours per family (the shared
//! cases written once, each family's own headers added), with the counters
//! it leaves; IPv6 fragments; the IPv6 body run without tail calls.
use std::net::{Ipv4Addr, Ipv6Addr};

use super::{fixture6, single_backend_as, Pods};
use crate::support::{
    family::ct_key, hex, translated_checksums, truncated, Case, Hook, Loaded, TC_ACT_OK,
    TC_ACT_REDIRECT, TC_ACT_UNSPEC,
};
use proxy_common::{ct_dir, ct_state, programs};
use proxy_testkit::packet::PacketSpec;
use proxy_testkit::packet6::{
    checksums_valid6, icmp6_frame, Packet6, NEXTHDR_DEST, NEXTHDR_HOP, NEXTHDR_ROUTING,
};
use proxy_testkit::Frame;
use proxy_user::dataplane::load::ip_summed::Access;
use proxy_user::model::Protocol;
use proxy_user::sync::store::MapStore as _;

/// What one family adds to the shared table: its own headers and malformed
/// frames, and the counters only it keeps.
trait Headers: Pods {
    fn own_cases() -> Vec<Case>;
    fn check_own_counters(fx: &Loaded);
}

/// The fixtures with each L4 checksum update in place, from the skb's
/// `ip_summed` (read through the kfunc this kernel has).
fn requests_replies_and_packets_that_are_not_ours<F: Headers>() {
    let access = Access::detect();
    assert!(
        matches!(access, Access::Kfunc(_)),
        "this kernel (6.2+, with BTF) should give the programs ip_summed: {access:?}"
    );
    requests_replies_and_not_ours::<F>(&access);
}

/// The same fixtures, the same packets out, with every L4 checksum update
/// through `bpf_l4_csum_replace`, as on a kernel without the kfunc.
fn requests_replies_and_packets_that_are_not_ours_through_the_checksum_helper<F: Headers>() {
    requests_replies_and_not_ours::<F>(&Access::Helper);
}

crate::both_families!(
    requests_replies_and_packets_that_are_not_ours,
    requests_replies_and_packets_that_are_not_ours_through_the_checksum_helper,
);

/// A case of `sb_from_pod` (`from_pod`) or `sb_to_pod`.
fn case(name: &str, from_pod: bool, input: Vec<u8>, verdict: u32, output: Vec<u8>) -> Case {
    Case {
        name: name.into(),
        hook: Hook::Tc(match from_pod {
            true => programs::TC_FROM_POD,
            false => programs::TC_TO_POD,
        }),
        input,
        verdict,
        output,
    }
}

/// A case whose frame must pass untouched.
fn untouched(name: &str, from_pod: bool, frame: Vec<u8>) -> Case {
    case(name, from_pod, frame.clone(), TC_ACT_UNSPEC, frame)
}

fn requests_replies_and_not_ours<F: Headers>(access: &Access) {
    let mut fx = single_backend_as::<F>(access);
    let (client, vip, pod1) = (F::CLIENT, F::VIP, F::POD1);
    let syn = F::Packet::tcp(client, 40000, vip, 80);
    let syn_ack = F::Packet::tcp(pod1, 8080, client, 40000).flags(0x12);
    let udp = F::Packet::udp(client, 40001, vip, 53);
    let udp_reply = F::Packet::udp(pod1, 5353, client, 40001);
    let mut udp_zero = F::Packet::udp(client, 40002, vip, 53);
    udp_zero.set_udp_zero_checksum();
    let other_host = F::Packet::tcp(client, 40006, F::POD2, 8080);
    let other_port = F::Packet::tcp(client, 40007, vip, 443);
    // Claims more bytes than it has: the TCP header is cut short.
    let cut_tcp = truncated(syn.build(), 14 + F::IP_HLEN + 10);
    // Before any request: a reply of nothing tracked.
    let stray_reply = F::Packet::tcp(pod1, 8080, client, 49999);

    let mut cases = vec![
        case(
            "TCP SYN to the ClusterIP is DNATed to the backend",
            true,
            syn.build(),
            TC_ACT_OK,
            syn.to(pod1, 8080).build(),
        ),
        case(
            "the backend's SYN-ACK is reversed to the frontend",
            false,
            syn_ack.build(),
            TC_ACT_OK,
            syn_ack.from(vip, 80).build(),
        ),
        case(
            "UDP to the ClusterIP is DNATed with its checksum fixed",
            true,
            udp.build(),
            TC_ACT_OK,
            udp.to(pod1, 5353).build(),
        ),
        case(
            "the UDP reply is reversed",
            false,
            udp_reply.build(),
            TC_ACT_OK,
            udp_reply.from(vip, 53).build(),
        ),
        case(
            "UDP without checksum keeps checksum 0",
            true,
            udp_zero.build(),
            TC_ACT_OK,
            udp_zero.to(pod1, 5353).build(),
        ),
        untouched(
            "traffic to a pod address is not ours",
            true,
            other_host.build(),
        ),
        untouched(
            "a port the Service does not have is not ours",
            true,
            other_port.build(),
        ),
        untouched("truncated TCP header: untouched", true, cut_tcp),
        untouched(
            "a reply of no tracked flow is not ours",
            false,
            stray_reply.build(),
        ),
    ];
    cases.extend(F::own_cases());
    fx.run_table(&cases, translated_checksums::<F>);

    // The flow's two entries.
    let fwd = F::ct(
        &fx,
        &ct_key(client, 40000, vip, 80, Protocol::Tcp, ct_dir::FORWARD),
    )
    .expect("forward entry");
    let web = fx.service_row("web");
    let pod1_id = fx
        .syncer
        .store()
        .dump()
        .backends
        .iter()
        .find(|(_, b)| {
            let addr = proxy_user::sync::encode::backend_addr(b);
            addr.ip == pod1.into() && addr.port == 8080
        })
        .map(|(id, _)| *id)
        .expect("POD1:8080 among the backends");
    assert_eq!((fwd.backend_id, fwd.service_id), (pod1_id, web.id));
    assert_eq!(fwd.nat_addr_be, pod1.be());
    let reply = F::ct(
        &fx,
        &ct_key(pod1, 8080, client, 40000, Protocol::Tcp, ct_dir::REPLY),
    )
    .expect("reply entry");
    assert_eq!(reply.nat_addr_be, vip.be());
    assert_eq!(u16::from_be(reply.nat_port_be), 80);
    assert_ne!(reply.state & ct_state::REPLIED, 0);

    assert_eq!(fx.stat("forwarded"), 5);
    assert_eq!(fx.stat("reversed"), 2);
    assert_eq!(fx.stat("malformed"), 3, "the three truncated frames");
    assert_eq!(fx.stat("drop_no_backend"), 0);
    assert_eq!(
        (web.packets, web.new_flows, web.drops_no_backend),
        (2, 2, 0)
    );
    let dns = fx.service_row("dns");
    assert_eq!(
        (dns.packets, dns.new_flows, dns.drops_no_backend),
        (3, 3, 0)
    );
    F::check_own_counters(&fx);
}

impl Headers for Ipv4Addr {
    fn own_cases() -> Vec<Case> {
        let (client, vip, pod1) = (Self::CLIENT, Self::VIP, Self::POD1);
        let options = PacketSpec {
            ip_option_words: 3,
            ..PacketSpec::tcp(client, 40003, vip, 80)
        };
        let first_fragment = PacketSpec {
            frag_off: 0x2000,
            ..PacketSpec::udp(client, 40004, vip, 53)
        };
        // Another datagram's (its id differs): nothing known about it.
        let later_fragment = PacketSpec {
            frag_off: 0x0010,
            ip_id: 0x9999,
            ..PacketSpec::udp(client, 40005, vip, 53)
        };
        let icmp = PacketSpec {
            proto: 1,
            payload: vec![8, 0, 0xf7, 0xff, 0, 0, 0, 0],
            ..PacketSpec::tcp(client, 0, vip, 0)
        };
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
        arp.extend_from_slice(&[0u8; 28]);
        let mut ipv6 = PacketSpec::tcp(client, 40008, vip, 80).build();
        ipv6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        // (A frame cut inside the IPv4 header cannot be fed: BPF_PROG_TEST_RUN
        // itself rejects IPv4 frames shorter than 20 bytes of IP header.)
        let mut bad_ihl = PacketSpec::tcp(client, 40009, vip, 80).build();
        bad_ihl[14] = 0x43;
        let mut short_total = PacketSpec::tcp(client, 40010, vip, 80).build();
        short_total[16..18].copy_from_slice(&24u16.to_be_bytes());
        let to_empty = PacketSpec::tcp(client, 40011, Self::EMPTY_VIP, 80).build();
        vec![
            case(
                "IPv4 options: ports found after the options, header checksum fixed",
                true,
                options.build(),
                TC_ACT_OK,
                options.to(pod1, 8080).build(),
            ),
            case(
                "first fragment is DNATed like a whole datagram",
                true,
                first_fragment.build(),
                TC_ACT_OK,
                first_fragment.to(pod1, 5353).build(),
            ),
            untouched(
                "a later fragment of an unknown datagram is passed untouched",
                true,
                later_fragment.build(),
            ),
            untouched("ICMP to the ClusterIP is not ours", true, icmp.build()),
            untouched("ARP passes", true, arp),
            untouched("IPv6 passes", true, ipv6),
            untouched("IHL below 5 passes untouched", true, bad_ihl),
            untouched(
                "total length shorter than the headers passes untouched",
                true,
                short_total,
            ),
            // kube-proxy's REJECT: more in datapath_reject.rs.
            case(
                "a frontend without endpoints answers with ICMP port unreachable",
                true,
                to_empty.clone(),
                TC_ACT_REDIRECT,
                proxy_testkit::packet::icmp_port_unreachable(&to_empty),
            ),
        ]
    }

    fn check_own_counters(fx: &Loaded) {
        // Fragments: the first is translated, the unknown later one counted
        // (more in datapath_frag.rs).
        assert_eq!(fx.stat("fragment"), 0);
        assert_eq!(fx.stat("frag_unknown"), 1);
        assert_eq!(fx.stat("rejected"), 1);
        assert_eq!(fx.service_row("empty").drops_no_backend, 1);
        let stats = proxy_user::dataplane::maps::readback::read_stats(fx.syncer.store());
        assert_eq!(stats.counters["forwarded"], 5);
        let fe = &stats.maps[0];
        // web and dns: slot 0 + one backend each; empty: slot 0 only.
        assert_eq!((fe.map, fe.entries, fe.capacity), ("SB_FE_V1", 5, 1024));
        let ct = stats
            .maps
            .iter()
            .find(|m| m.map == proxy_common::names::CONNTRACK)
            .expect("conntrack row");
        assert_eq!(ct.entries, 10, "two CT entries per new flow: {stats:?}");
    }
}

impl Headers for Ipv6Addr {
    fn own_cases() -> Vec<Case> {
        let (client, vip, pod1) = (Self::CLIENT, Self::VIP, Self::POD1);
        let ext = Packet6 {
            ext: vec![NEXTHDR_HOP, NEXTHDR_DEST],
            ..Packet6::tcp(client, 40003, vip, 80)
        };
        let four_ext = Packet6 {
            ext: vec![NEXTHDR_HOP, NEXTHDR_DEST, NEXTHDR_ROUTING, NEXTHDR_DEST],
            ..Packet6::udp(client, 40004, vip, 53)
        };
        let five_ext = Packet6 {
            ext: vec![
                NEXTHDR_HOP,
                NEXTHDR_DEST,
                NEXTHDR_ROUTING,
                NEXTHDR_DEST,
                NEXTHDR_DEST,
            ],
            ..Packet6::tcp(client, 40005, vip, 80)
        };
        // Authentication header (51) before TCP: not ours.
        let mut ah = Packet6::tcp(client, 40012, vip, 80).build();
        ah[20] = 51;
        let cut_ext = truncated(
            Packet6 {
                ext: vec![NEXTHDR_HOP],
                ..Packet6::tcp(client, 40010, vip, 80)
            }
            .build(),
            14 + 40 + 4,
        );
        // Payload length shorter than the TCP header it is followed by.
        let mut short_payload = Packet6::tcp(client, 40011, vip, 80).build();
        short_payload[18..20].copy_from_slice(&12u16.to_be_bytes());
        // Neighbour solicitation and advertisement for the frontend address,
        // router solicitation, echo request to it.
        let ns = icmp6_frame(client, vip, 135, 0, 0, &vip.octets());
        let na = icmp6_frame(pod1, client, 136, 0, 0x6000_0000, &pod1.octets());
        let rs = icmp6_frame(client, vip, 133, 0, 0, &[]);
        let echo = icmp6_frame(client, vip, 128, 0, 0x0001_0001, b"ping");
        let echo_reply = icmp6_frame(pod1, client, 129, 0, 0x0001_0001, b"ping");
        vec![
            case(
                "hop-by-hop and destination options before TCP: still translated",
                true,
                ext.build(),
                TC_ACT_OK,
                ext.to(pod1, 8080).build(),
            ),
            case(
                "four extension headers (the bound) before UDP: translated",
                true,
                four_ext.build(),
                TC_ACT_OK,
                four_ext.to(pod1, 5353).build(),
            ),
            untouched(
                "five extension headers: more than the bound, untouched",
                true,
                five_ext.build(),
            ),
            untouched("an authentication header: untouched", true, ah),
            untouched("truncated extension header: untouched", true, cut_ext),
            untouched(
                "payload length shorter than the TCP header: untouched",
                true,
                short_payload,
            ),
            untouched(
                "neighbour solicitation for the frontend: untouched",
                true,
                ns,
            ),
            untouched("neighbour advertisement into the pod: untouched", false, na),
            untouched("router solicitation: untouched", true, rs),
            untouched("echo request to the frontend: untouched", true, echo),
            untouched("echo reply into the pod: untouched", false, echo_reply),
        ]
    }

    fn check_own_counters(_: &Loaded) {}
}

#[test]
fn ipv6_fragments_follow_their_first_fragment() {
    let mut fx = fixture6();
    let (client, vip, pod1) = (super::CLIENT6, super::VIP6, super::POD1_6);
    let datagram = Packet6 {
        payload: (0..100u8).collect(),
        ..Packet6::udp(client, 45000, vip, 53)
    };
    let translated = datagram.to(pod1, 5353);
    let id = 0x1234_5678;
    let inputs = datagram.fragments(48, id);
    let expected = translated.fragments(48, id);
    assert_eq!(inputs.len(), 3);
    for (i, (input, want)) in inputs.iter().zip(&expected).enumerate() {
        let (verdict, out) = fx.run(programs::TC_FROM_POD, input);
        assert_eq!((verdict, hex(&out)), (TC_ACT_OK, hex(want)), "fragment {i}");
    }
    assert_eq!(fx.stat("frag_translated"), 2);
    // The reassembled datagram's checksum is valid for the backend.
    let whole = translated.build();
    assert!(checksums_valid6(&whole, false));

    // The reply, fragmented too, is reversed fragment by fragment.
    let reply = Packet6 {
        payload: (0..100u8).rev().collect(),
        ..Packet6::udp(pod1, 5353, client, 45000)
    };
    let reversed = reply.from(vip, 53);
    for (i, (input, want)) in reply
        .fragments(48, 7)
        .iter()
        .zip(&reversed.fragments(48, 7))
        .enumerate()
    {
        let (verdict, out) = fx.run(programs::TC_TO_POD, input);
        assert_eq!(
            (verdict, hex(&out)),
            (TC_ACT_OK, hex(want)),
            "reply fragment {i}"
        );
    }
    assert_eq!(fx.stat("frag_translated"), 4);

    // A later fragment of a datagram nobody translated: untouched.
    let other = Packet6 {
        payload: vec![1; 100],
        ..Packet6::udp(client, 45001, super::POD2_6, 53)
    };
    let later = other.fragments(48, 99).remove(1);
    assert_eq!(
        fx.run(programs::TC_FROM_POD, &later),
        (TC_ACT_UNSPEC, later.clone())
    );
    assert_eq!(fx.stat("frag_unknown"), 1);
}

#[test]
fn the_pod_programs_translate_ipv6_themselves_without_a_tail_call() {
    let mut fx = fixture6();
    let (client, vip, pod1) = (super::CLIENT6, super::VIP6, super::POD1_6);
    // The uplink program goes in with its IPv6 tail call, which is then
    // taken out again.
    let _: &mut aya::programs::SchedClassifier =
        crate::support::loaded_program(&mut fx.ebpf, programs::TC_FROM_UPLINK);
    let map = fx
        .ebpf
        .take_map(proxy_common::names::TAIL_CALLS6)
        .expect("IPv6 tail-call array");
    let mut tail: aya::maps::ProgramArray<_> =
        aya::maps::ProgramArray::try_from(map).expect("program array");
    tail.clear_index(&proxy_common::tail::FROM_UPLINK6)
        .expect("clear the slot");
    // sb_from_pod and sb_to_pod run the IPv6 body themselves: an empty
    // tail-call array costs them nothing.
    let syn = Packet6::tcp(client, 50000, vip, 80);
    let (verdict, out) = fx.run(programs::TC_FROM_POD, &syn.build());
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(out, syn.to(pod1, 8080).build());
    let reply = Packet6 {
        tcp_flags: 0x12,
        ack: syn.seq + 1,
        ..Packet6::tcp(pod1, 8080, client, 50000)
    };
    let (verdict, out) = fx.run(programs::TC_TO_POD, &reply.build());
    assert_eq!(verdict, TC_ACT_OK);
    assert_eq!(out, reply.from(vip, 80).build());
    assert_eq!(fx.stat("tail_call_missed"), 0);
}

#[test]
fn a_frame_with_the_ipv6_ethertype_and_an_ipv4_header_passes_untouched() {
    // An IPv6 frontend with the same service id space does not disturb a
    // frame that is not ours.
    let mut fx = fixture6();
    let mut fake = Packet6::tcp(super::CLIENT6, 48000, super::VIP6, 80).build();
    fake[14] = 0x45;
    assert_eq!(
        fx.run(programs::TC_FROM_POD, &fake),
        (TC_ACT_UNSPEC, fake.clone())
    );
}
