//! Direct server return (`--nodeport-mode dsr`): a flow to a backend on
//! another node leaves with the client's source and the frontend in an
//! option (IPv4) or a destination options header (IPv6); a flow returned
//! directly to a backend here is tracked and its replies leave from the
//! frontend; a packet without room for the option is answered.
use super::{frontend, routed, uplinked, Uplinked, GATEWAY_MAC, NODE4, NODE_PORT, POD_PORT};
use crate::support::{
    family::ct_key, netns::RunNode as _, Loaded, Uplink as Prog, TC_ACT_OK, TC_ACT_REDIRECT,
    XDP_PASS, XDP_TX,
};
use proxy_common::{ct_dir, ct_flags, ct_state, uplink_flags};
use proxy_testkit::{node::Node, Frame};
use proxy_user::model::{Frontend, FrontendKind, Protocol};

crate::both_families!(
    a_remote_flow_is_returned_directly_with_the_frontend_in_an_option,
    a_flow_returned_directly_arrives_tracked_and_its_replies_leave_from_the_frontend,
    the_option_is_ignored_where_direct_return_is_off,
    a_packet_too_large_for_the_option_is_answered,
);

/// Loads the programs on `node` with direct server return on: frontends
/// outside the cluster return flows directly, and the uplink accepts the
/// option.
fn returning_directly<F: Uplinked>(node: &Node, frontends: Vec<Frontend>) -> Loaded {
    let mut fx = uplinked::<F>(node, Vec::new());
    fx.syncer.set_direct_return(true);
    fx.set_uplink_flags(node.uplink, NODE4, uplink_flags::DSR_ACCEPT);
    let report = fx.program(frontends);
    assert!(report.failed.is_empty(), "{report:?}");
    fx
}

fn dsr_node_port<F: Uplinked>(protocol: Protocol) -> Frontend {
    frontend(
        FrontendKind::NodePort,
        F::NODE,
        NODE_PORT,
        protocol,
        "dsr",
        &[F::POD_REMOTE],
    )
}

/// The packet `spec` as a flow returned directly leaves this node: to the
/// remote backend, the frontend in the option, routed to the gateway
/// (`xdp`: MAC addresses of the route; tc: the kernel resolves them).
fn carried<F: Uplinked>(spec: &F::Packet, xdp: bool) -> Vec<u8> {
    let frame = F::with_dsr(&spec.to(F::POD_REMOTE, POD_PORT), F::NODE, NODE_PORT);
    match xdp {
        true => routed::<F>(frame, GATEWAY_MAC),
        false => F::with_ttl(frame, 63),
    }
}

fn a_remote_flow_is_returned_directly_with_the_frontend_in_an_option<F: Uplinked>() {
    F::THIS_NODE.run(|node| {
        for (prog, sent) in [(Prog::Xdp, XDP_TX), (Prog::Tc, TC_ACT_REDIRECT)] {
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                let mut fx = returning_directly::<F>(node, vec![dsr_node_port::<F>(protocol)]);
                let sport = 40000;
                let request =
                    F::from_client(F::packet(protocol, F::CLIENT, sport, F::NODE, NODE_PORT));
                let (verdict, out) = fx.run(prog, &request.build());
                let case = format!("{prog:?} {protocol:?}");
                assert_eq!(verdict, sent, "{case}");
                assert_eq!(
                    out,
                    carried::<F>(&request, prog == Prog::Xdp),
                    "{case}: the client's source kept, the frontend carried"
                );
                assert!(F::checksums_valid(&out, &request.build()), "{case}");
                assert_eq!(fx.stat("ext_remote"), 1, "{case}");

                // Both entries, without source NAT; the reply entry only
                // pairs them (the replies bypass this node).
                let key = ct_key(
                    F::CLIENT,
                    sport,
                    F::NODE,
                    NODE_PORT,
                    protocol,
                    ct_dir::FORWARD,
                );
                let fwd = F::ct(&fx, &key).expect("forward entry");
                assert_eq!(fwd.flags & ct_flags::SNAT, 0, "{case}: {fwd:?}");
                assert_ne!(fwd.flags & ct_flags::DSR_BALANCED, 0, "{case}: {fwd:?}");
                assert_eq!(
                    (fwd.nat_addr_be, fwd.nat_port_be),
                    (F::POD_REMOTE.be(), POD_PORT.to_be()),
                    "{case}"
                );
                assert_eq!(F::ct_len(&fx), 2, "{case}");

                // The next packet keeps its backend and carries the option.
                let mut next = request.flags(0x10);
                next.set_payload(b"GET /".to_vec());
                let (verdict, out) = fx.run(prog, &next.build());
                assert_eq!(
                    (verdict, out),
                    (sent, carried::<F>(&next, prog == Prog::Xdp)),
                    "{case}: next packet"
                );
                assert_eq!(F::ct_len(&fx), 2, "{case}");
            }
        }
    });
}

fn a_flow_returned_directly_arrives_tracked_and_its_replies_leave_from_the_frontend<F: Uplinked>() {
    let (client, pod, balancer) = (F::CLIENT, F::POD_LOCAL, F::BALANCER);
    F::THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            for protocol in [Protocol::Tcp, Protocol::Udp] {
                let case = format!("{prog:?} {protocol:?}");
                let mut fx = returning_directly::<F>(node, Vec::new());
                let sport = 40000;
                let sent = F::from_client(F::packet(protocol, client, sport, pod, POD_PORT));
                let arriving = F::with_dsr(&sent, balancer, NODE_PORT);
                let (verdict, out) = fx.run(prog, &arriving);
                assert_eq!(
                    (verdict, out),
                    (prog.delivered(), arriving.clone()),
                    "{case}: delivered unchanged"
                );
                let fwd_key = ct_key(
                    client,
                    sport,
                    balancer,
                    NODE_PORT,
                    protocol,
                    ct_dir::FORWARD,
                );
                if !prog.tracks_dsr_arrivals() {
                    assert_eq!(fx.stat("ext_local"), 0, "{case}: left to tc");
                    assert!(F::ct(&fx, &fwd_key).is_none(), "{case}: left to tc");
                    continue;
                }
                assert_eq!(fx.stat("ext_local"), 1, "{case}");
                let fwd = F::ct(&fx, &fwd_key).expect("forward entry, by the frontend");
                assert_ne!(fwd.flags & ct_flags::DSR_ARRIVED, 0, "{case}: {fwd:?}");
                assert_eq!(
                    (fwd.nat_addr_be, fwd.nat_port_be),
                    (pod.be(), POD_PORT.to_be()),
                    "{case}"
                );

                // The pod's reply leaves the uplink from the frontend.
                let reply = F::packet(protocol, pod, POD_PORT, client, sport).flags(0x12);
                let (verdict, out) = fx.run_egress(&reply.build());
                assert_eq!(verdict, TC_ACT_OK, "{case}: reply");
                assert_eq!(
                    out,
                    reply.from(balancer, NODE_PORT).build(),
                    "{case}: reply from the frontend"
                );
                assert!(F::checksums_valid(&out, &reply.build()), "{case}");

                // The next packet is noted, not tracked anew.
                let next = F::with_dsr(&sent.flags(0x10), balancer, NODE_PORT);
                let (verdict, _) = fx.run(prog, &next);
                assert_eq!(verdict, prog.delivered(), "{case}");
                assert_eq!(F::ct_len(&fx), 2, "{case}");
                if protocol == Protocol::Tcp {
                    let fwd = F::ct(&fx, &fwd_key).expect("forward entry");
                    assert_ne!(fwd.state & ct_state::ACKED, 0, "{case}: the ACK noted");
                }
            }
        }
    });
}

fn the_option_is_ignored_where_direct_return_is_off<F: Uplinked>() {
    F::THIS_NODE.run(|node| {
        for prog in Prog::BOTH {
            let mut fx = uplinked::<F>(node, Vec::new());
            let sent = F::from_client(F::Packet::tcp(F::CLIENT, 40000, F::POD_LOCAL, POD_PORT));
            let arriving = F::with_dsr(&sent, F::BALANCER, NODE_PORT);
            let (verdict, out) = fx.run(prog, &arriving);
            assert_eq!(
                (verdict, out),
                (prog.untouched(), arriving),
                "{prog:?}: not ours"
            );
            assert_eq!(F::ct_len(&fx), 0, "{prog:?}");
        }
    });
}

/// A packet of the route's MTU has no room for the option: XDP leaves it
/// to tc, which answers from the frontend (IPv4: fragmentation needed;
/// IPv6: packet too big), naming the room the option leaves.
fn a_packet_too_large_for_the_option_is_answered<F: Uplinked>() {
    F::THIS_NODE.run(|node| {
        let mut fx = returning_directly::<F>(node, vec![dsr_node_port::<F>(Protocol::Udp)]);
        let mut big = F::from_client(F::Packet::udp(F::CLIENT, 40000, F::NODE, NODE_PORT));
        big.set_payload(vec![0x5a; 1500 - F::IP_HLEN - 8]);
        let frame = big.build();

        // XDP leaves it to tc, untouched.
        assert_eq!(fx.run(Prog::Xdp, &frame), (XDP_PASS, frame.clone()));
        assert_eq!(fx.stat("xdp_to_tc"), 1);

        let (verdict, out) = fx.run(Prog::Tc, &frame);
        assert_eq!(verdict, TC_ACT_REDIRECT);
        assert_eq!(out, F::too_big_for_the_option(&frame));
        assert!(F::checksums_valid(&out, &out));
        assert_eq!(fx.stat("rejected"), 1);
        assert_eq!(fx.stat("ext_remote"), 0);

        // One that fits goes through.
        big.set_payload(vec![0x5a; 1500 - F::IP_HLEN - 8 - F::OPTION_LEN]);
        let (verdict, out) = fx.run(Prog::Tc, &big.build());
        assert_eq!((verdict, out), (TC_ACT_REDIRECT, carried::<F>(&big, false)));
    });
}
