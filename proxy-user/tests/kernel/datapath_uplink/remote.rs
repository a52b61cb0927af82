//! A backend on another node: DNAT and SNAT to the uplink's address, sent
//! straight back out (XDP: `XDP_TX` with the route's MAC addresses; tc:
//! `bpf_redirect_neigh`, the TTL down by one), and its reply; what XDP
//! leaves to the tc twin (TTL 1, no neighbour entry, overlays, ICMP); ICMP
//! errors about such flows; SNAT ports.
use std::net::{Ipv4Addr, Ipv6Addr};

use super::{
    dst_of, from_client6, frontend, node_port, routed, snat_port, src_of, standard6, uplinked,
    uplinked6, with_hop_limit, Uplinked, CLIENT6, CLIENT_MAC, GATEWAY6, GATEWAY_MAC, NODE6,
    NODE_PORT, POD_LOCAL6, POD_PORT, POD_REMOTE6, REMOTE_PORT, UPLINK_MAC,
};
use crate::support::{
    be32,
    family::{ct_key, TestFamily},
    netns::{self, RunNode as _},
    rewritten, Loaded, Uplink as Prog, TC_ACT_REDIRECT, TC_ACT_SHOT, TC_ACT_UNSPEC, XDP_DROP,
    XDP_PASS, XDP_TX,
};
use proxy_common::{ct_dir, ct_flags, snat, uplink_flags, CtEntry, CtKey, CtKeyOf};
use proxy_testkit::packet::{icmp_error_checksums_valid, icmp_frame, PacketSpec, ETH_HLEN};
use proxy_testkit::packet6::{checksums_valid6, icmp6_frame_macs, Packet6, PROTO_TCP, PROTO_UDP};
use proxy_testkit::Frame;
use proxy_user::model::{FrontendKind, Protocol};

type V4 = Ipv4Addr;
type V6 = Ipv6Addr;

crate::both_families!(
    a_remote_backend_gets_dnat_and_snat_and_its_reply_goes_back_out,
    xdp_leaves_a_remote_flow_without_next_hop_neighbour_to_the_tc_twin,
    xdp_leaves_a_remote_flow_with_ttl_1_to_the_tc_twin,
);

/// The forward conntrack key of the client's flow from `sport` to the
/// NodePort.
fn forward_key<F: Uplinked>(protocol: Protocol, sport: u16) -> CtKeyOf<F::Be> {
    ct_key(
        F::CLIENT,
        sport,
        F::NODE,
        NODE_PORT,
        protocol,
        ct_dir::FORWARD,
    )
}

/// The reply conntrack key of POD_REMOTE's answers to `snat_port`.
fn reply_key<F: Uplinked>(protocol: Protocol, snat_port: u16) -> CtKeyOf<F::Be> {
    ct_key(
        F::POD_REMOTE,
        POD_PORT,
        F::NODE,
        snat_port,
        protocol,
        ct_dir::REPLY,
    )
}

/// `frame` as `prog` sends it out: XDP routes it (TTL one less, the MAC
/// addresses of `next_hop_mac`'s route), tc lowers the TTL and leaves the
/// MAC addresses to the neighbour lookup.
fn sent_out<F: Uplinked>(prog: Prog, frame: Vec<u8>, next_hop_mac: [u8; 6]) -> Vec<u8> {
    match prog {
        Prog::Xdp => routed::<F>(frame, next_hop_mac),
        Prog::Tc => F::with_ttl(frame, 63),
    }
}

/// The verdict of a packet `prog` sends back out.
fn sent(prog: Prog) -> u32 {
    match prog {
        Prog::Xdp => XDP_TX,
        Prog::Tc => TC_ACT_REDIRECT,
    }
}

/// XDP sends the packet out of the uplink it came in on; the tc twin
/// rewrites both directions and sends the packet straight out with
/// `bpf_redirect_neigh` (the kernel's stack would drop a packet that
/// arrives on the uplink with the node's own address as its source).
fn a_remote_backend_gets_dnat_and_snat_and_its_reply_goes_back_out<F: Uplinked>() {
    let (client, node, remote) = (F::CLIENT, F::NODE, F::POD_REMOTE);
    F::THIS_NODE.run(|node_ns| {
        for prog in Prog::BOTH {
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                let case = format!("{prog:?} {protocol:?}");
                let mut fx = uplinked::<F>(node_ns, vec![node_port(protocol, "remote", &[remote])]);
                let sport = 40000;
                let request = F::from_client(F::packet(protocol, client, sport, node, NODE_PORT));
                let (verdict, out) = fx.run(prog, &request.build());
                assert_eq!(verdict, sent(prog), "{case}");
                let (snat_addr, snat_port) = src_of::<F>(&out);
                assert_eq!(snat_addr, node, "{case}: source NATed to the uplink");
                assert!(
                    snat::is_snat_port(snat_port),
                    "{case}: SNAT port {snat_port}"
                );
                let left = |p: &F::Packet| p.from(node, snat_port).to(remote, POD_PORT).build();
                assert_eq!(
                    out,
                    sent_out::<F>(prog, left(&request), GATEWAY_MAC),
                    "{case}: forwarded frame"
                );
                assert!(F::checksums_valid(&out, &request.build()), "{case}");
                assert_eq!(F::ttl_of(&out), 63, "{case}: TTL decremented");
                assert_eq!(fx.stat("ext_remote"), 1, "{case}");
                assert_eq!(fx.stat("ext_local"), 0, "{case}");

                // Connection tracking: the forward entry and the reply entry.
                let fwd = F::ct(&fx, &forward_key::<F>(protocol, sport)).expect("forward entry");
                assert_ne!(fwd.flags & ct_flags::SNAT, 0, "{case}: {fwd:?}");
                assert_eq!(
                    (
                        fwd.nat_addr_be,
                        fwd.nat_port_be,
                        fwd.snat_addr_be,
                        fwd.snat_port_be
                    ),
                    (remote.be(), POD_PORT.to_be(), node.be(), snat_port.to_be()),
                    "{case}: {fwd:?}"
                );
                let rev = F::ct(&fx, &reply_key::<F>(protocol, snat_port)).expect("reply entry");
                assert_ne!(rev.flags & ct_flags::SNAT, 0, "{case}: {rev:?}");
                assert_eq!(
                    (
                        rev.nat_addr_be,
                        rev.nat_port_be,
                        rev.snat_addr_be,
                        rev.snat_port_be
                    ),
                    (node.be(), NODE_PORT.to_be(), client.be(), sport.to_be()),
                    "{case}: {rev:?}"
                );
                assert_eq!(F::ct_len(&fx), 2, "{case}");

                // The next packet of the flow keeps its SNAT port.
                let mut next = request.flags(0x10);
                next.set_payload(match protocol {
                    Protocol::Tcp => b"GET /".to_vec(),
                    Protocol::Udp => b"again".to_vec(),
                });
                let (verdict, out) = fx.run(prog, &next.build());
                assert_eq!(verdict, sent(prog), "{case}");
                assert_eq!(
                    out,
                    sent_out::<F>(prog, left(&next), GATEWAY_MAC),
                    "{case}: second packet, same SNAT port"
                );
                assert_eq!(fx.stat("ext_remote"), 2, "{case}");
                assert_eq!(F::ct_len(&fx), 2, "{case}: no new entries");

                // The backend's reply goes back to the client from the NodePort.
                let reply = F::packet(protocol, remote, POD_PORT, node, snat_port).flags(0x12);
                let (verdict, out) = fx.run(prog, &reply.build());
                assert_eq!(verdict, sent(prog), "{case}: reply");
                assert_eq!(
                    out,
                    sent_out::<F>(
                        prog,
                        reply.from(node, NODE_PORT).to(client, sport).build(),
                        CLIENT_MAC
                    ),
                    "{case}: reply frame"
                );
                assert!(F::checksums_valid(&out, &reply.build()), "{case}");
                assert_eq!(fx.stat("ext_reply"), 1, "{case}");

                // To the SNAT port, but not from the flow's backend: not ours.
                let stranger = F::packet(protocol, remote, 9999, node, snat_port);
                assert_eq!(
                    fx.run(prog, &stranger.build()),
                    (prog.untouched(), stranger.build()),
                    "{case}: SNAT port from another source port"
                );
                assert_eq!(fx.stat("ext_reply"), 1, "{case}");
                assert_eq!(fx.stat("xdp_to_tc"), 0, "{case}");
            }
        }
    });
}

/// No neighbour entry for the next hop: XDP cannot fill in the MAC
/// addresses, so the packet goes on untranslated; the tc twin translates it
/// from the same connection-tracking entry (the same SNAT port) and lets the
/// kernel resolve the neighbour (`bpf_redirect_neigh`).
fn xdp_leaves_a_remote_flow_without_next_hop_neighbour_to_the_tc_twin<F: Uplinked>() {
    let (client, node, unresolved) = (F::CLIENT, F::NODE, F::POD_UNRESOLVED);
    F::THIS_NODE.run(|node_ns| {
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let mut fx = uplinked::<F>(
                node_ns,
                vec![node_port(protocol, "unresolved", &[unresolved])],
            );
            let request = F::from_client(F::packet(protocol, client, 40000, node, NODE_PORT));
            let (verdict, out) = fx.run(Prog::Xdp, &request.build());
            assert_eq!(verdict, XDP_PASS, "{protocol:?}");
            assert_eq!(out, request.build(), "{protocol:?}: passed untranslated");
            assert_eq!(fx.stat("xdp_to_tc"), 1);
            assert_eq!(fx.stat("ext_remote"), 0);
            let fwd = F::ct(&fx, &forward_key::<F>(protocol, 40000)).expect("XDP tracked the flow");
            let snat_port = u16::from_be(fwd.snat_port_be);

            let (verdict, out) = fx.run(Prog::Tc, &request.build());
            assert_eq!(verdict, TC_ACT_REDIRECT, "{protocol:?}");
            assert_eq!(
                out,
                F::with_ttl(
                    request
                        .from(node, snat_port)
                        .to(unresolved, POD_PORT)
                        .build(),
                    63
                ),
                "{protocol:?}: the tc twin uses XDP's translation"
            );
            assert!(F::checksums_valid(&out, &request.build()));
            assert_eq!(fx.stat("ext_remote"), 1);
        }
    });
}

/// A flow to another node with a TTL (hop limit) of 1 is not sent out by
/// XDP: it goes on untranslated to the tc twin, which drops it (counted).
fn xdp_leaves_a_remote_flow_with_ttl_1_to_the_tc_twin<F: Uplinked>() {
    F::THIS_NODE.run(|node_ns| {
        let mut fx = uplinked::<F>(
            node_ns,
            vec![node_port(Protocol::Tcp, "remote", &[F::POD_REMOTE])],
        );
        let request = F::from_client(F::Packet::tcp(F::CLIENT, 40000, F::NODE, NODE_PORT));
        let dying = F::with_ttl(request.build(), 1);
        for round in 1..=3 {
            let (verdict, out) = fx.run(Prog::Xdp, &dying);
            assert_eq!(verdict, XDP_PASS, "TTL 1 must not be sent out");
            assert_eq!(out, dying, "passed untranslated");
            assert_eq!(fx.stat("xdp_to_tc"), round);
        }
        let (verdict, _) = fx.run(Prog::Tc, &dying);
        assert_eq!(verdict, TC_ACT_SHOT);
        assert_eq!(fx.stat("ttl_exceeded"), 1);
        // The same flow with a live TTL is sent out.
        let (verdict, out) = fx.run(Prog::Xdp, &request.build());
        assert_eq!(verdict, XDP_TX);
        assert_eq!(F::ttl_of(&out), 63);
        assert_eq!(fx.stat("xdp_to_tc"), 3);
    });
}

// ---------------------------------------------------------------------------
// IPv4 only: SNAT ports, overlays, ICMP errors, the route cache.

#[test]
fn many_remote_flows_get_distinct_snat_ports() {
    V4::THIS_NODE.run(|node| {
        let mut fx = uplinked::<V4>(
            node,
            vec![frontend(
                FrontendKind::NodePort,
                V4::NODE,
                NODE_PORT,
                Protocol::Tcp,
                "remote",
                &[V4::POD_REMOTE],
            )],
        );
        let mut ports = std::collections::BTreeSet::new();
        for sport in 0..200u16 {
            let (verdict, out) = fx.run(
                Prog::Xdp,
                &PacketSpec::tcp(V4::CLIENT, 20000 + sport, V4::NODE, NODE_PORT).build(),
            );
            assert_eq!(verdict, XDP_TX);
            assert_eq!(src_of::<V4>(&out).0, V4::NODE);
            ports.insert(src_of::<V4>(&out).1);
        }
        assert_eq!(ports.len(), 200, "two flows share a SNAT port");
        assert!(ports.iter().all(|p| snat::is_snat_port(*p)));
        assert_eq!(fx.stat("ext_remote"), 200);
        assert_eq!(fx.stat("snat_exhausted"), 0);
    });
}

/// The overlay device of [`a_backend_behind_an_overlay_is_source_nated_to_it`]:
/// flannel's shape, a VXLAN over `up0` with its own address, routing
/// another node's pods (10.244.4.0/24) through it.
const OVERLAY_ADDR: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 0);

const POD_OVERLAY: Ipv4Addr = Ipv4Addr::new(10, 244, 4, 2);

/// Adds the overlay `ovl0` to the test namespace; returns its index.
fn add_overlay() -> u32 {
    for command in [
        "link add ovl0 type vxlan id 1 local 192.168.50.1 dstport 8472",
        "link set ovl0 address 02:00:00:00:f1:01 mtu 1450 up",
        "addr add 10.244.1.0/32 dev ovl0",
        "neigh add 10.244.4.0 lladdr 02:00:00:00:f1:04 dev ovl0 nud permanent",
        "route add 10.244.4.0/24 via 10.244.4.0 dev ovl0 onlink",
    ] {
        netns::ip(&command.split_whitespace().collect::<Vec<_>>());
    }
    netns::ifindex("ovl0")
}

/// A backend behind an overlay device (another node's pod, reached through
/// flannel's VXLAN rather than an uplink) is on another node: its flow is
/// source-NATed to the overlay's address (as kube-proxy's masquerade picks
/// it), so the pod's reply comes back through the overlay and is translated
/// there. XDP cannot send into a tunnel: it hands the packet to the tc twin,
/// which redirects it through the overlay.
#[test]
fn a_backend_behind_an_overlay_is_source_nated_to_it() {
    V4::THIS_NODE.run(|node| {
        let overlay = add_overlay();
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let mut fx = uplinked::<V4>(
                node,
                vec![frontend(
                    FrontendKind::NodePort,
                    V4::NODE,
                    NODE_PORT,
                    protocol,
                    "overlay",
                    &[POD_OVERLAY],
                )],
            );
            fx.syncer
                .store_mut()
                .set_uplinks(&[
                    (node.uplink, proxy_common::Uplink::new(be32(V4::NODE), 0)),
                    (
                        overlay,
                        proxy_common::Uplink::new(be32(OVERLAY_ADDR), uplink_flags::OVERLAY),
                    ),
                ])
                .expect("write the uplink map");
            // A small packet, and a full-sized one (1500 bytes, a client's
            // first fragment, say), larger than the overlay's MTU: the
            // route still names the overlay, which fragments what it carries.
            let l4_header = if protocol == Protocol::Tcp { 20 } else { 8 };
            for (n, (sport, payload)) in [(40000, 0), (40001, 1500 - 20 - l4_header)]
                .into_iter()
                .enumerate()
            {
                let mut request = V4::packet(protocol, V4::CLIENT, sport, V4::NODE, NODE_PORT);
                request.payload = vec![0x5a; payload];
                let what = format!("{protocol:?}, {payload}-byte payload");
                let (verdict, out) = fx.run(Prog::Xdp, &request.build());
                assert_eq!(verdict, XDP_PASS, "{what}: XDP hands it to tc");
                assert_eq!(out, request.build(), "{what}: passed untranslated");
                assert_eq!(fx.stat("xdp_to_tc"), n as u64 + 1, "{what}");

                let (verdict, out) = fx.run(Prog::Tc, &request.build());
                assert_eq!(verdict, TC_ACT_REDIRECT, "{what}");
                let (src, snat_port) = src_of::<V4>(&out);
                assert_eq!(src, OVERLAY_ADDR, "{what}: the overlay's address");
                assert!(snat::is_snat_port(snat_port), "{what}: {snat_port}");
                let left = rewritten(&request, |p| {
                    p.src = OVERLAY_ADDR;
                    p.sport = snat_port;
                    p.dst = POD_OVERLAY;
                    p.dport = POD_PORT;
                });
                assert_eq!(out, V4::with_ttl(left, 63), "{what}");
                assert!(proxy_testkit::packet::checksums_valid(&out), "{what}");

                let reply = V4::packet(protocol, POD_OVERLAY, POD_PORT, OVERLAY_ADDR, snat_port);
                let (verdict, out) = fx.run(Prog::Tc, &reply.build());
                assert_eq!(verdict, TC_ACT_REDIRECT, "{what}: the reply goes out");
                let back = rewritten(&reply, |p| {
                    p.src = V4::NODE;
                    p.sport = NODE_PORT;
                    p.dst = V4::CLIENT;
                    p.dport = sport;
                });
                assert_eq!(out, V4::with_ttl(back, 63), "{what}");
                assert_eq!(fx.stat("ext_remote"), n as u64 + 1, "{what}");
                assert_eq!(fx.stat("ext_reply"), n as u64 + 1, "{what}");
            }
        }
    });
}

/// An ICMP "fragmentation needed" the remote backend sends about a packet of
/// a source-NATed flow (quoting it as it left: node:port → pod) reaches the
/// client as an error from the frontend about the client's own packet
/// (client → frontend), every checksum valid, sent straight back out.
#[test]
fn icmp_errors_about_a_remote_flow_reach_the_client_translated() {
    V4::THIS_NODE.run(|node| {
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            let mut fx = uplinked::<V4>(
                node,
                vec![frontend(
                    FrontendKind::NodePort,
                    V4::NODE,
                    NODE_PORT,
                    protocol,
                    "remote",
                    &[V4::POD_REMOTE],
                )],
            );
            let sport = 40000;
            let request = V4::packet(protocol, V4::CLIENT, sport, V4::NODE, NODE_PORT);
            let (verdict, out) = fx.run(Prog::Xdp, &request.build());
            assert_eq!(verdict, XDP_TX, "{protocol:?}");
            let (_, snat_port) = src_of::<V4>(&out);
            let left = rewritten(&request, |p| {
                p.src = V4::NODE;
                p.sport = snat_port;
                p.dst = V4::POD_REMOTE;
                p.dport = POD_PORT;
            });
            // Type 3 code 4 with next-hop MTU 1400 in the low 16 bits.
            let error = icmp_frame(
                V4::POD_REMOTE,
                V4::NODE,
                3,
                4,
                1400,
                &left[ETH_HLEN..ETH_HLEN + 28],
            );
            assert!(icmp_error_checksums_valid(&error));
            let (verdict, out) = fx.run(Prog::Tc, &error);
            assert_eq!(verdict, TC_ACT_REDIRECT, "{protocol:?}");
            let original = request.build();
            let expected = V4::with_ttl(
                icmp_frame(
                    V4::NODE,
                    V4::CLIENT,
                    3,
                    4,
                    1400,
                    &original[ETH_HLEN..ETH_HLEN + 28],
                ),
                63,
            );
            assert_eq!(
                out, expected,
                "{protocol:?}: the error as the client must see it"
            );
            assert!(icmp_error_checksums_valid(&out));
            assert_eq!(fx.stat("icmp_error_translated"), 1);

            // An error quoting a flow nobody source-NATed passes untouched.
            let stranger = rewritten(&request, |p| {
                p.src = V4::NODE;
                p.sport = 61999;
                p.dst = V4::POD_REMOTE;
                p.dport = POD_PORT;
            });
            let error = icmp_frame(
                V4::POD_REMOTE,
                V4::NODE,
                3,
                4,
                1400,
                &stranger[ETH_HLEN..ETH_HLEN + 28],
            );
            let (verdict, out) = fx.run(Prog::Tc, &error);
            assert_eq!((verdict, out), (TC_ACT_UNSPEC, error));
            assert_eq!(fx.stat("icmp_error_translated"), 1);

            // The same error from a router on the way: the router stays the
            // outer source; the rest is translated as above.
            let error = icmp_frame(
                V4::GATEWAY,
                V4::NODE,
                3,
                4,
                1400,
                &left[ETH_HLEN..ETH_HLEN + 28],
            );
            let (verdict, out) = fx.run(Prog::Tc, &error);
            assert_eq!(verdict, TC_ACT_REDIRECT, "{protocol:?}: from a router");
            let expected = V4::with_ttl(
                icmp_frame(
                    V4::GATEWAY,
                    V4::CLIENT,
                    3,
                    4,
                    1400,
                    &original[ETH_HLEN..ETH_HLEN + 28],
                ),
                63,
            );
            assert_eq!(
                out, expected,
                "{protocol:?}: the router's error, translated"
            );
            assert!(icmp_error_checksums_valid(&out));
            assert_eq!(fx.stat("icmp_error_translated"), 2);
        }
    });
}

/// `bpf_ktime_get_ns()`'s clock (CLOCK_MONOTONIC), in ns.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Every SNAT port of node → V4::POD_REMOTE:POD_PORT held by a flow of another
/// client with `flags`, stamped `stamp_ns`.
fn hold_every_snat_port(fx: &mut Loaded, flags: u8, stamp_ns: u64) {
    let conntrack = &mut fx.syncer.store_mut().conntrack;
    for port in (0..snat::PORTS).map(snat::port) {
        let key = CtKey {
            saddr_be: u32::from_ne_bytes(V4::POD_REMOTE.octets()),
            daddr_be: u32::from_ne_bytes(V4::NODE.octets()),
            sport_be: POD_PORT.to_be(),
            dport_be: port.to_be(),
            proto: 6,
            dir: ct_dir::REPLY,
            _pad: [0; 2],
        };
        let entry = CtEntry {
            backend_id: 1,
            service_id: 1,
            nat_addr_be: u32::from_ne_bytes(V4::NODE.octets()),
            nat_port_be: NODE_PORT.to_be(),
            flags,
            snat_addr_be: u32::from_ne_bytes([192, 168, 50, 101]),
            snat_port_be: port.to_be(),
            created_ns: stamp_ns,
            ..CtEntry::default()
        };
        conntrack
            .insert(key, entry, 0)
            .expect("seed a conntrack entry");
    }
}

/// A new flow to a remote backend takes a SNAT port held by a closed TCP
/// flow only once the close is older than the backend's TIME_WAIT; a port of
/// an open flow, or of one that closed just now, is never taken (the flow is
/// dropped and counted when every port is held).
#[test]
fn snat_ports_of_closed_flows_are_reused_only_after_time_wait() {
    V4::THIS_NODE.run(|node| {
        let mut fx = uplinked::<V4>(
            node,
            vec![frontend(
                FrontendKind::NodePort,
                V4::NODE,
                NODE_PORT,
                Protocol::Tcp,
                "remote",
                &[V4::POD_REMOTE],
            )],
        );
        let now = monotonic_ns();
        assert!(
            now > 2 * snat::REUSE_AFTER_NS,
            "the machine has been up long enough"
        );
        let syn = |sport| PacketSpec::tcp(V4::CLIENT, sport, V4::NODE, NODE_PORT).build();

        hold_every_snat_port(&mut fx, ct_flags::SNAT | ct_flags::CLOSING, now);
        let (verdict, _) = fx.run(Prog::Xdp, &syn(40000));
        assert_eq!(
            verdict, XDP_DROP,
            "closed just now: still in TIME_WAIT at the backend"
        );
        assert_eq!(fx.stat("snat_exhausted"), 1);

        hold_every_snat_port(&mut fx, ct_flags::SNAT, now - 2 * snat::REUSE_AFTER_NS);
        let (verdict, _) = fx.run(Prog::Xdp, &syn(40001));
        assert_eq!(
            verdict, XDP_DROP,
            "open flows keep their ports, however old"
        );
        assert_eq!(fx.stat("snat_exhausted"), 2);

        hold_every_snat_port(
            &mut fx,
            ct_flags::SNAT | ct_flags::CLOSING,
            now - 2 * snat::REUSE_AFTER_NS,
        );
        let (verdict, out) = fx.run(Prog::Xdp, &syn(40002));
        assert_eq!(verdict, XDP_TX, "a port closed long ago is taken");
        let (_, port) = src_of::<V4>(&out);
        let entry = fx
            .ct(&reply_key::<V4>(Protocol::Tcp, port))
            .expect("reply entry");
        assert_eq!(
            (
                entry.snat_addr_be,
                u16::from_be(entry.snat_port_be),
                entry.flags
            ),
            (
                u32::from_ne_bytes(V4::CLIENT.octets()),
                40002,
                ct_flags::SNAT
            ),
            "the entry now names the new client, open"
        );
        assert_eq!(fx.stat("snat_exhausted"), 2);
    });
}

/// The XDP program remembers a route for 50 ms per CPU: a neighbour that
/// changes its MAC address is followed once that time has passed (on one
/// CPU, so the runs share a cache: within the time, the remembered address
/// is still used).
#[test]
fn a_changed_next_hop_is_followed_within_the_route_cache_time() {
    V4::THIS_NODE.run(|node| {
        crate::support::run_on_cpu(0);
        let fe = frontend(
            FrontendKind::NodePort,
            V4::NODE,
            NODE_PORT,
            Protocol::Udp,
            "remote",
            &[V4::POD_REMOTE],
        );
        let mut fx = uplinked::<V4>(node, vec![fe]);
        let request = PacketSpec::udp(V4::CLIENT, 40000, V4::NODE, NODE_PORT).build();
        let (verdict, out) = fx.run(Prog::Xdp, &request);
        assert_eq!((verdict, &out[0..6]), (XDP_TX, &GATEWAY_MAC[..]));
        let moved = [0x02, 0, 0, 0, 0, 0x22];
        crate::support::netns::ip(&[
            "neigh",
            "replace",
            &V4::GATEWAY.to_string(),
            "lladdr",
            &proxy_testkit::netns::mac_text(moved),
            "dev",
            "up0",
        ]);
        let (_, out) = fx.run(Prog::Xdp, &request);
        assert_eq!(&out[0..6], &GATEWAY_MAC[..], "remembered");
        std::thread::sleep(std::time::Duration::from_millis(120));
        let (verdict, out) = fx.run(Prog::Xdp, &request);
        assert_eq!(
            (verdict, &out[0..6]),
            (XDP_TX, &moved[..]),
            "the new MAC address after the cache time"
        );
    });
}

// ---------------------------------------------------------------------------
// IPv6 only: an uplink without an IPv6 address, ICMPv6 errors.

#[test]
fn remote_ipv6_backend_without_an_uplink_ipv6_address_is_dropped_and_counted() {
    V6::THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked6(node, None);
            standard6(&mut fx);
            let input = from_client6(Packet6::tcp(CLIENT6, 45000, NODE6, REMOTE_PORT)).build();
            let (verdict, _) = fx.run(prog, &input);
            assert_eq!(verdict, prog.dropped(), "{prog:?}");
            assert_eq!(fx.stat("no_route"), 1, "{prog:?}");
            // Local backends are still served.
            let input = from_client6(Packet6::tcp(CLIENT6, 45001, NODE6, NODE_PORT)).build();
            let (verdict, out) = fx.run(prog, &input);
            assert_eq!(verdict, prog.delivered());
            assert_eq!(dst_of::<V6>(&out), (POD_LOCAL6, POD_PORT));
            let entry = fx
                .uplink6_entry(node.uplink)
                .expect("the uplink's IPv6 entry");
            assert_eq!(entry.addr_be, [0; 4], "written without an address");
        }
    });
}

/// A frame's bytes after the Ethernet header, with hop limit `hop_limit`:
/// what an ICMPv6 error quotes.
fn quote_of(p: &Packet6, hop_limit: u8) -> Vec<u8> {
    with_hop_limit(p.build(), hop_limit)[14..].to_vec()
}

#[test]
fn icmpv6_errors_about_a_remote_flow_reach_the_client_translated() {
    V6::THIS_NODE.run(|node| {
        let mut fx = uplinked6(node, Some(NODE6));
        standard6(&mut fx);
        for (i, proto) in [PROTO_TCP, PROTO_UDP].into_iter().enumerate() {
            let sport = 48000 + i as u16;
            let mk = |src, sp, dst, dp| match proto {
                PROTO_TCP => Packet6::tcp(src, sp, dst, dp),
                _ => Packet6::udp(src, sp, dst, dp),
            };
            let client_sent = from_client6(mk(CLIENT6, sport, NODE6, REMOTE_PORT));
            let (verdict, _) = fx.run(Prog::Tc, &client_sent.build());
            assert_eq!(verdict, TC_ACT_REDIRECT);
            let port = snat_port(&fx, proto, sport, REMOTE_PORT);
            let as_sent = mk(NODE6, port, POD_REMOTE6, POD_PORT);
            // A router on the way (the gateway) says "packet too big"; the
            // backend itself says "port unreachable".
            for (from, icmp_type, code, rest) in
                [(GATEWAY6, 2u8, 0u8, 1280u32), (POD_REMOTE6, 1, 4, 0)]
            {
                let error = icmp6_frame_macs(
                    GATEWAY_MAC,
                    UPLINK_MAC,
                    from,
                    NODE6,
                    icmp_type,
                    code,
                    rest,
                    &quote_of(&as_sent, 63),
                );
                let xdp_before = fx.stat("icmp_error_translated");
                let (verdict, out) = fx.run(Prog::Xdp, &error);
                assert_eq!(
                    (verdict, &out),
                    (XDP_PASS, &error),
                    "XDP hands ICMPv6 to tc untouched"
                );
                assert_eq!(fx.stat("icmp_error_translated"), xdp_before);
                let (verdict, out) = fx.run(Prog::Tc, &error);
                assert_eq!(verdict, TC_ACT_REDIRECT, "proto {proto} type {icmp_type}");
                let outer_src = if from == POD_REMOTE6 { NODE6 } else { from };
                let want = with_hop_limit(
                    icmp6_frame_macs(
                        GATEWAY_MAC,
                        UPLINK_MAC,
                        outer_src,
                        CLIENT6,
                        icmp_type,
                        code,
                        rest,
                        &quote_of(&client_sent, 63),
                    ),
                    63,
                );
                assert_eq!(out, want, "proto {proto} type {icmp_type}: translated back");
                assert!(checksums_valid6(&out, false));
                assert_eq!(fx.stat("icmp_error_translated"), xdp_before + 1);
            }
        }
        // An error about a flow we do not know passes untouched.
        let unknown = mk_unknown_error();
        let (verdict, out) = fx.run(Prog::Tc, &unknown);
        assert_eq!((verdict, out), (TC_ACT_UNSPEC, unknown));
    });
}

fn mk_unknown_error() -> Vec<u8> {
    let as_sent = Packet6::tcp(NODE6, 2000, POD_REMOTE6, POD_PORT);
    icmp6_frame_macs(
        GATEWAY_MAC,
        UPLINK_MAC,
        GATEWAY6,
        NODE6,
        2,
        0,
        1280,
        &quote_of(&as_sent, 63),
    )
}
