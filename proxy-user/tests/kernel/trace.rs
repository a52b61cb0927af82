//! The live trace through BPF_PROG_TEST_RUN: with an event kind switched on
//! (`SB_TRACE_ON_V1`), the programs write its events to the ring buffer
//! (`SB_TRACE_V1`) with the right fields, for both families; with the
//! switch clear they write nothing; a full ring buffer counts what it lost
//! (`SB_TRACE_LOST_V1`) and the packets are forwarded all the same. Needs
//! root (CAP_BPF).
use std::net::{Ipv4Addr, Ipv6Addr};

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use proxy_common::trace::{kind, layer, verdict, RING_BYTES};
use proxy_common::{addr6_be, names, programs, stat, TraceEvent};
use proxy_testkit::packet::PacketSpec;
use proxy_testkit::packet6::{Packet6, PROTO_TCP};
use proxy_user::model::{FrontendKind, Protocol};

use crate::support::{be32, capacities, frontend, Loaded, TC_ACT_OK, TC_ACT_REDIRECT};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const EMPTY_VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 99);
const POD1: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0x100, 0, 0, 0, 0, 2);
const VIP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, 0x10);
const POD6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 1, 0, 0, 0, 0, 2);
const SVC6: u32 = 40;

struct Traced {
    fx: Loaded,
    events: RingBuf<MapData>,
    switch: Array<MapData, u64>,
    lost: PerCpuArray<MapData, u64>,
}

impl Traced {
    fn new() -> Traced {
        let mut fx = Loaded::new(
            capacities(4096),
            vec![
                frontend(
                    FrontendKind::ClusterIp,
                    VIP,
                    80,
                    Protocol::Tcp,
                    "web",
                    &[(POD1, 8080)],
                ),
                frontend(
                    FrontendKind::ClusterIp,
                    EMPTY_VIP,
                    80,
                    Protocol::Tcp,
                    "empty",
                    &[],
                ),
            ],
        );
        fx.maps6
            .frontend(VIP6, 80, PROTO_TCP, SVC6, None, &[(941, POD6, 8080)]);
        let mut take = |name| fx.ebpf.take_map(name).expect(name);
        let events = RingBuf::try_from(take(names::TRACE_EVENTS)).expect("ring buffer");
        let switch = Array::try_from(take(names::TRACE_ON)).expect("switch");
        let lost = PerCpuArray::try_from(take(names::TRACE_LOST)).expect("lost counter");
        Traced {
            fx,
            events,
            switch,
            lost,
        }
    }

    fn switch(&mut self, mask: u64) {
        self.switch.set(0, mask, 0).expect("set the switch");
    }

    /// Every event written since the last call.
    fn drain(&mut self) -> Vec<TraceEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.events.next() {
            out.push(bytemuck::pod_read_unaligned(
                &item[..size_of::<TraceEvent>()],
            ));
        }
        out
    }

    fn lost(&self) -> u64 {
        self.lost.get(&0, 0).expect("lost").iter().sum()
    }
}

fn v4(addr: Ipv4Addr) -> [u32; 4] {
    [be32(addr), 0, 0, 0]
}

#[test]
fn a_new_flow_is_traced_with_client_frontend_backend_and_layer_only_while_switched_on() {
    crate::support::require_root();
    let mut t = Traced::new();
    // Off: the flow is translated, nothing is written.
    let (verdict, _) =
        t.fx.run_from_pod(&PacketSpec::tcp(CLIENT, 40000, VIP, 80).build());
    assert_eq!(verdict, TC_ACT_OK);
    assert!(t.drain().is_empty(), "an event while the switch is off");

    t.switch(1 << kind::NEW_FLOW);
    let (verdict, _) =
        t.fx.run_from_pod(&PacketSpec::tcp(CLIENT, 40001, VIP, 80).build());
    assert_eq!(verdict, TC_ACT_OK);
    // An established flow's packet is no new flow.
    let mut ack = PacketSpec::tcp(CLIENT, 40001, VIP, 80);
    ack.tcp_flags = 0x10;
    t.fx.run_from_pod(&ack.build());
    let events = t.drain();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = events[0];
    assert_eq!(
        (e.kind, e.layer, e.family, e.proto),
        (kind::NEW_FLOW, layer::TC, 4, 6)
    );
    assert_eq!(e.client_addr_be, v4(CLIENT));
    assert_eq!(u16::from_be(e.client_port_be), 40001);
    assert_eq!(e.frontend_addr_be, v4(VIP));
    assert_eq!(u16::from_be(e.frontend_port_be), 80);
    assert_eq!(e.backend_addr_be, v4(POD1));
    assert_eq!(u16::from_be(e.backend_port_be), 8080);
    assert_ne!(e.service_id, 0);
    assert_ne!(e.ts_ns, 0);

    // Drops are not switched on: a reject writes nothing.
    let (verdict, _) =
        t.fx.run_from_pod(&PacketSpec::tcp(CLIENT, 40002, EMPTY_VIP, 80).build());
    assert_eq!(verdict, TC_ACT_REDIRECT);
    assert!(t.drain().is_empty());

    t.switch(0);
    t.fx.run_from_pod(&PacketSpec::tcp(CLIENT, 40003, VIP, 80).build());
    assert!(t.drain().is_empty(), "an event after the switch went off");
}

#[test]
fn an_ipv6_new_flow_is_traced_with_its_16_byte_addresses() {
    crate::support::require_root();
    let mut t = Traced::new();
    t.switch(kind::ALL);
    let (verdict, _) =
        t.fx.run_from_pod(&Packet6::tcp(CLIENT6, 40010, VIP6, 80).build());
    assert_eq!(verdict, TC_ACT_OK);
    let events = t.drain();
    assert_eq!(events.len(), 1, "{events:?}");
    let e = events[0];
    assert_eq!((e.kind, e.family, e.layer), (kind::NEW_FLOW, 6, layer::TC));
    assert_eq!(e.client_addr_be, addr6_be(CLIENT6.octets()));
    assert_eq!(e.frontend_addr_be, addr6_be(VIP6.octets()));
    assert_eq!(e.backend_addr_be, addr6_be(POD6.octets()));
    assert_eq!(e.service_id, SVC6);
}

#[test]
fn drops_are_traced_with_their_reason_and_verdict() {
    crate::support::require_root();
    let mut t = Traced::new();
    t.switch(1 << kind::DROP);
    // No endpoint: answered (kube-proxy's REJECT).
    let (v, _) =
        t.fx.run_from_pod(&PacketSpec::tcp(CLIENT, 40020, EMPTY_VIP, 80).build());
    assert_eq!(v, TC_ACT_REDIRECT);
    // Cut short inside the TCP header: malformed, passed untouched.
    let mut cut = PacketSpec::tcp(CLIENT, 40021, VIP, 80).build();
    cut.truncate(14 + 20 + 10);
    t.fx.run_from_pod(&cut);
    // A new flow is not switched on.
    t.fx.run_from_pod(&PacketSpec::tcp(CLIENT, 40022, VIP, 80).build());
    let events = t.drain();
    assert_eq!(events.len(), 2, "{events:?}");
    let (rejected, malformed) = (events[0], events[1]);
    assert_eq!(rejected.kind, kind::DROP);
    assert_eq!(u32::from(rejected.reason), stat::REJECTED);
    assert_eq!(rejected.verdict, verdict::ANSWERED);
    assert_eq!(rejected.client_addr_be, v4(CLIENT));
    assert_eq!(rejected.frontend_addr_be, v4(EMPTY_VIP));
    assert_ne!(rejected.service_id, 0);
    assert_eq!(u32::from(malformed.reason), stat::MALFORMED);
    assert_eq!(malformed.verdict, verdict::PASSED);
    assert_eq!(malformed.family, 0);
}

#[test]
fn a_full_ring_buffer_counts_what_it_lost_and_forwarding_goes_on() {
    crate::support::require_root();
    let mut t = Traced::new();
    t.switch(1 << kind::DROP);
    // Each event takes 88 bytes with its header: more than fit.
    let n = RING_BYTES as usize / 88 + 500;
    let reject = PacketSpec::tcp(CLIENT, 40030, EMPTY_VIP, 80).build();
    for _ in 0..n {
        let (v, _) = t.fx.run_from_pod(&reject);
        assert_eq!(v, TC_ACT_REDIRECT);
    }
    let lost = t.lost();
    let written = t.drain().len() as u64;
    assert!(lost >= 500, "lost {lost}");
    assert_eq!(written + lost, n as u64);
    // Room again once read.
    t.fx.run_from_pod(&reject);
    assert_eq!(t.drain().len(), 1);
}

#[test]
fn a_flood_of_a_million_traced_drops_is_counted_lost_and_other_flows_go_on() {
    use aya::programs::{SchedClassifier, TestRun as _, TestRunOptions};
    crate::support::require_root();
    let mut t = Traced::new();
    t.switch(kind::ALL);
    // One malformed packet (cut inside its TCP header), a million times in
    // one test run: each is counted, traced, and passed untouched.
    let mut cut = PacketSpec::tcp(CLIENT, 40040, VIP, 80).build();
    cut.truncate(14 + 20 + 10);
    const FLOOD: u32 = 1_000_000;
    let malformed_before = t.fx.stat("malformed");
    let tc: &mut SchedClassifier =
        crate::support::loaded_program(&mut t.fx.ebpf, programs::TC_FROM_POD);
    let mut out = vec![0u8; cut.len() + 64];
    tc.test_run(TestRunOptions {
        data_in: Some(&cut),
        data_out: Some(&mut out),
        repeat: FLOOD,
        ..TestRunOptions::default()
    })
    .expect("BPF_PROG_TEST_RUN");
    assert_eq!(t.fx.stat("malformed") - malformed_before, u64::from(FLOOD));
    let written = t.drain().len() as u64;
    let lost = t.lost();
    assert!(written <= u64::from(RING_BYTES) / 88, "written {written}");
    assert_eq!(
        written + lost,
        u64::from(FLOOD),
        "written {written}, lost {lost}"
    );
    // Another flow is still translated (and traced) during the flood's
    // aftermath.
    let (v, _) =
        t.fx.run_from_pod(&PacketSpec::tcp(CLIENT, 40041, VIP, 80).build());
    assert_eq!(v, TC_ACT_OK);
    let events = t.drain();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, kind::NEW_FLOW);
}
