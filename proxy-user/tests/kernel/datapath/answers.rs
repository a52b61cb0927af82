//! What the pod programs answer themselves (IPv6; the IPv4 answers are
//! `datapath_reject`'s and `parsing`'s): a frontend without endpoints
//! answers TCP with a RST and UDP with ICMPv6 port unreachable, and ICMPv6
//! errors about translated flows are translated back.
use super::{
    fixture6, CLIENT6, EMPTY_VIP6, POD1_6, POD2_6, ROUTER6, SVC_EMPTY_TCP, SVC_EMPTY_UDP, VIP6,
};
use crate::support::{
    translated_checksums, Case, Hook, TC_ACT_OK, TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC,
};
use proxy_common::programs;
use proxy_testkit::packet6::{
    icmp6_frame, icmp6_frame_macs, Packet6, NEXTHDR_DEST, NODE_MAC, POD_MAC, TCP_ACK, TCP_RST,
    TCP_SYN,
};
use std::net::Ipv6Addr;

#[test]
fn an_ipv6_frontend_without_endpoints_answers_tcp_with_rst_and_udp_with_port_unreachable() {
    let mut fx = fixture6();
    let syn = Packet6::tcp(CLIENT6, 40100, EMPTY_VIP6, 80);
    let rst_ack = Packet6 {
        tcp_flags: TCP_RST | TCP_ACK,
        seq: 0,
        ack: syn.seq + 1,
        window: 0,
        src_mac: NODE_MAC,
        dst_mac: POD_MAC,
        ..Packet6::tcp(EMPTY_VIP6, 80, CLIENT6, 40100)
    };
    // A segment with ACK and 10 bytes: the RST takes its acknowledgement
    // number as sequence number.
    let data = Packet6 {
        tcp_flags: TCP_ACK | 0x08,
        ack: 0x5555_0000,
        payload: vec![7; 10],
        ..Packet6::tcp(CLIENT6, 40101, EMPTY_VIP6, 80)
    };
    let rst = Packet6 {
        tcp_flags: TCP_RST,
        seq: 0x5555_0000,
        ack: 0,
        window: 0,
        src_mac: NODE_MAC,
        dst_mac: POD_MAC,
        ..Packet6::tcp(EMPTY_VIP6, 80, CLIENT6, 40101)
    };
    let fin = Packet6 {
        tcp_flags: 0x01,
        payload: vec![1; 3],
        ..Packet6::tcp(CLIENT6, 40102, EMPTY_VIP6, 80)
    };
    let fin_rst = Packet6 {
        tcp_flags: TCP_RST | TCP_ACK,
        seq: 0,
        ack: fin.seq + 3 + 1,
        window: 0,
        src_mac: NODE_MAC,
        dst_mac: POD_MAC,
        ..Packet6::tcp(EMPTY_VIP6, 80, CLIENT6, 40102)
    };
    let udp = Packet6::udp(CLIENT6, 40103, EMPTY_VIP6, 53);
    let udp_frame = udp.build();
    let unreachable = icmp6_frame_macs(
        NODE_MAC,
        POD_MAC,
        EMPTY_VIP6,
        CLIENT6,
        1,
        4,
        0,
        &udp_frame[14..14 + 48],
    );
    let with_ext = Packet6 {
        ext: vec![NEXTHDR_DEST],
        ..Packet6::tcp(CLIENT6, 40104, EMPTY_VIP6, 80)
    };
    let a_rst = Packet6 {
        tcp_flags: TCP_RST,
        ..Packet6::tcp(CLIENT6, 40105, EMPTY_VIP6, 80)
    };
    let multicast_src = Packet6::udp(
        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
        40106,
        EMPTY_VIP6,
        53,
    );

    let cases = vec![
        Case {
            name: "SYN to an empty IPv6 frontend: RST+ACK from the frontend".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: syn.build(),
            verdict: TC_ACT_REDIRECT,
            output: rst_ack.build(),
        },
        Case {
            name: "a segment with ACK and data: RST with its acknowledgement number".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: data.build(),
            verdict: TC_ACT_REDIRECT,
            output: rst.build(),
        },
        Case {
            name: "FIN with data: acknowledged data and FIN".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: fin.build(),
            verdict: TC_ACT_REDIRECT,
            output: fin_rst.build(),
        },
        Case {
            name: "UDP to an empty IPv6 frontend: ICMPv6 port unreachable quoting it".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: udp_frame.clone(),
            verdict: TC_ACT_REDIRECT,
            output: unreachable,
        },
        Case {
            name: "extension headers: dropped, not answered".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: with_ext.build(),
            verdict: TC_ACT_SHOT,
            output: with_ext.build(),
        },
        Case {
            name: "a RST is never answered".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: a_rst.build(),
            verdict: TC_ACT_SHOT,
            output: a_rst.build(),
        },
        Case {
            name: "a multicast source is never answered".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: multicast_src.build(),
            verdict: TC_ACT_SHOT,
            output: multicast_src.build(),
        },
    ];
    fx.run_table(&cases, translated_checksums::<Ipv6Addr>);
    assert_eq!(fx.stat("rejected"), 4);
    assert_eq!(fx.stat("drop_no_backend"), 3);
    assert_eq!(fx.service_packets(SVC_EMPTY_TCP), (0, 0, 5));
    assert_eq!(fx.service_packets(SVC_EMPTY_UDP), (0, 0, 2));
}

/// The IPv6 payload of a frame (what an ICMPv6 error quotes), cut at `len`.
fn quote(frame: &[u8], len: usize) -> Vec<u8> {
    frame[14..].iter().take(len).copied().collect()
}

#[test]
fn icmpv6_errors_about_translated_flows_are_translated_back() {
    let mut fx = fixture6();
    let syn = Packet6::tcp(CLIENT6, 40200, VIP6, 80);
    let (verdict, dnat) = fx.run(programs::TC_FROM_POD, &syn.build());
    assert_eq!(verdict, TC_ACT_OK);
    let udp = Packet6 {
        payload: vec![9; 1200],
        ..Packet6::udp(CLIENT6, 40201, VIP6, 53)
    };
    let (verdict, udp_dnat) = fx.run(programs::TC_FROM_POD, &udp.build());
    assert_eq!(verdict, TC_ACT_OK);
    let syn_ack = Packet6 {
        tcp_flags: TCP_SYN | TCP_ACK,
        ..Packet6::tcp(POD1_6, 8080, CLIENT6, 40200)
    };
    let (verdict, reply) = fx.run(programs::TC_TO_POD, &syn_ack.build());
    assert_eq!(verdict, TC_ACT_OK);
    let unknown = Packet6::tcp(CLIENT6, 40299, POD2_6, 8080).build();

    let cases = vec![
        Case {
            name: "packet too big from a router about the DNATed SYN: quote back to the frontend (PMTU)".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp6_frame(ROUTER6, CLIENT6, 2, 0, 1280, &quote(&dnat, 1000)),
            verdict: TC_ACT_OK,
            output: icmp6_frame(ROUTER6, CLIENT6, 2, 0, 1280, &quote(&syn.build(), 1000)),
        },
        Case {
            name: "packet too big about a UDP datagram, quote cut short of the payload".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp6_frame(ROUTER6, CLIENT6, 2, 0, 1280, &quote(&udp_dnat, 1232)),
            verdict: TC_ACT_OK,
            output: icmp6_frame(ROUTER6, CLIENT6, 2, 0, 1280, &quote(&udp.build(), 1232)),
        },
        Case {
            name: "port unreachable from the backend itself: the outer source becomes the frontend".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp6_frame(POD1_6, CLIENT6, 1, 4, 0, &quote(&dnat, 1000)),
            verdict: TC_ACT_OK,
            output: icmp6_frame(VIP6, CLIENT6, 1, 4, 0, &quote(&syn.build(), 1000)),
        },
        Case {
            name: "time exceeded quoting only 8 bytes of TCP: ports translated, no TCP checksum to fix".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp6_frame(ROUTER6, CLIENT6, 3, 0, 0, &quote(&dnat, 48)),
            verdict: TC_ACT_OK,
            output: icmp6_frame(ROUTER6, CLIENT6, 3, 0, 0, &quote(&syn.build(), 48)),
        },
        Case {
            name: "the client's error about the frontend's reply goes to the backend".into(),
            hook: Hook::Tc(programs::TC_FROM_POD),
            input: icmp6_frame(CLIENT6, VIP6, 1, 4, 0, &quote(&reply, 1000)),
            verdict: TC_ACT_OK,
            output: icmp6_frame(CLIENT6, POD1_6, 1, 4, 0, &quote(&syn_ack.build(), 1000)),
        },
        Case {
            name: "an error about a flow that is not ours: untouched".into(),
            hook: Hook::Tc(programs::TC_TO_POD),
            input: icmp6_frame(ROUTER6, CLIENT6, 2, 0, 1280, &quote(&unknown, 1000)),
            verdict: TC_ACT_UNSPEC,
            output: icmp6_frame(ROUTER6, CLIENT6, 2, 0, 1280, &quote(&unknown, 1000)),
        },
    ];
    fx.run_table(&cases, translated_checksums::<Ipv6Addr>);
    assert_eq!(fx.stat("icmp_error_translated"), 5);
    assert_eq!(fx.stat("tail_call_missed"), 0);
}
