//! Connection tracking with state, through BPF_PROG_TEST_RUN: what the tc
//! programs record per direction (last-seen time, TCP state), how rarely
//! they write it, and what a full table does. Needs root (CAP_BPF).
use std::net::Ipv4Addr;

use crate::support::{cluster_ip, run_on_cpu, Loaded, TC_ACT_OK, TC_ACT_SHOT, TC_ACT_UNSPEC};
use proxy_common::{ct_dir, ct_flags, ct_state, programs, proto, CtEntry, CtKey, CT_REFRESH_NS};
use proxy_testkit::packet::PacketSpec;
use proxy_user::{
    dataplane::flows::expiry::{self, Phase, Timeouts},
    model::Protocol,
    sync::store::Capacities,
};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const POD1: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);

/// The data path stamps entries with CLOCK_MONOTONIC at tick resolution
/// (`bpf_ktime_get_coarse_ns`), which lags the precise clock by up to a
/// tick (10 ms at HZ=100).
const TICK_NS: u64 = 10_000_000;

const SYN: u8 = 0x02;
const SYN_ACK: u8 = 0x12;
const ACK: u8 = 0x10;
const FIN_ACK: u8 = 0x11;
const RST: u8 = 0x04;

/// TCP 80 → POD1:8080 and UDP 53 → POD1:5353, with a conntrack table of
/// `conntrack` entries.
fn fixture(conntrack: u32) -> Loaded {
    let caps = Capacities {
        frontends: 64,
        backends: 64,
        conntrack,
        services: 64,
        ..Capacities::default()
    };
    let frontends = vec![
        cluster_ip(VIP, 80, Protocol::Tcp, "svc80", &[(POD1, 8080)]),
        cluster_ip(VIP, 53, Protocol::Udp, "svc53", &[(POD1, 5353)]),
    ];
    Loaded::new(caps, frontends)
}

/// The flows of these tests, on the one harness.
trait Flows {
    /// A packet of the flow from CLIENT:`sport`: `Request` through
    /// `sb_from_pod`, `Reply` (from the backend) through `sb_to_pod`; the
    /// verdict.
    fn send(&mut self, step: Step, protocol: u8, sport: u16) -> u32;
    /// The flow's forward and reply entries.
    fn pair(&self, protocol: u8, sport: u16) -> (Option<CtEntry>, Option<CtEntry>);
}

impl Flows for Loaded {
    fn send(&mut self, step: Step, protocol: u8, sport: u16) -> u32 {
        let (dport, backend_port) = match protocol {
            proto::TCP => (80, 8080),
            _ => (53, 5353),
        };
        let packet = |src, sp, dst, dp, flags| {
            let spec = match protocol {
                proto::TCP => PacketSpec {
                    tcp_flags: flags,
                    ..PacketSpec::tcp(src, sp, dst, dp)
                },
                _ => PacketSpec::udp(src, sp, dst, dp),
            };
            spec.build()
        };
        match step {
            Step::Request(flags) => {
                let frame = packet(CLIENT, sport, VIP, dport, flags);
                self.run(programs::TC_FROM_POD, &frame).0
            }
            Step::Reply(flags) => {
                let frame = packet(POD1, backend_port, CLIENT, sport, flags);
                self.run(programs::TC_TO_POD, &frame).0
            }
        }
    }

    fn pair(&self, protocol: u8, sport: u16) -> (Option<CtEntry>, Option<CtEntry>) {
        (
            self.ct(&forward_key(protocol, sport)),
            self.ct(&reply_key(protocol, sport)),
        )
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Request(u8),
    Reply(u8),
}

fn forward_key(protocol: u8, sport: u16) -> CtKey {
    let dport: u16 = if protocol == proto::TCP { 80 } else { 53 };
    CtKey {
        saddr_be: u32::from_ne_bytes(CLIENT.octets()),
        daddr_be: u32::from_ne_bytes(VIP.octets()),
        sport_be: sport.to_be(),
        dport_be: dport.to_be(),
        proto: protocol,
        dir: ct_dir::FORWARD,
        _pad: [0; 2],
    }
}

fn reply_key(protocol: u8, sport: u16) -> CtKey {
    let bport: u16 = if protocol == proto::TCP { 8080 } else { 5353 };
    CtKey {
        saddr_be: u32::from_ne_bytes(POD1.octets()),
        daddr_be: u32::from_ne_bytes(CLIENT.octets()),
        sport_be: bport.to_be(),
        dport_be: sport.to_be(),
        proto: protocol,
        dir: ct_dir::REPLY,
        _pad: [0; 2],
    }
}

#[test]
fn entries_follow_the_connection_state_in_both_directions() {
    use Step::*;
    struct Case {
        name: &'static str,
        protocol: u8,
        steps: &'static [Step],
        forward_state: u8,
        reply_state: u8,
        closing: bool,
        phase: Phase,
    }
    let cases = [
        Case {
            name: "a SYN alone: tracked, never answered",
            protocol: proto::TCP,
            steps: &[Request(SYN)],
            forward_state: 0,
            reply_state: 0,
            closing: false,
            phase: Phase::SynSent,
        },
        Case {
            name: "SYN, SYN-ACK: answered, not yet acknowledged (a spoofed SYN stays here)",
            protocol: proto::TCP,
            steps: &[Request(SYN), Reply(SYN_ACK)],
            forward_state: 0,
            reply_state: ct_state::REPLIED,
            closing: false,
            phase: Phase::SynRecv,
        },
        Case {
            name: "SYN, SYN-ACK, ACK: established",
            protocol: proto::TCP,
            steps: &[Request(SYN), Reply(SYN_ACK), Request(ACK)],
            forward_state: ct_state::ACKED,
            reply_state: ct_state::REPLIED,
            closing: false,
            phase: Phase::Established,
        },
        Case {
            name: "the client's FIN alone: half-closed",
            protocol: proto::TCP,
            steps: &[Request(SYN), Reply(SYN_ACK), Request(FIN_ACK), Reply(ACK)],
            forward_state: ct_state::FIN | ct_state::ACKED,
            reply_state: ct_state::REPLIED,
            closing: true,
            phase: Phase::HalfClosed,
        },
        Case {
            name: "FIN both ways: closed",
            protocol: proto::TCP,
            steps: &[
                Request(SYN),
                Reply(SYN_ACK),
                Request(FIN_ACK),
                Reply(FIN_ACK),
                Request(ACK),
            ],
            forward_state: ct_state::FIN | ct_state::ACKED,
            reply_state: ct_state::REPLIED | ct_state::FIN,
            closing: true,
            phase: Phase::Closed,
        },
        Case {
            name: "the backend resets: closed",
            protocol: proto::TCP,
            steps: &[Request(SYN), Reply(SYN_ACK), Request(ACK), Reply(RST)],
            forward_state: ct_state::ACKED,
            reply_state: ct_state::REPLIED | ct_state::RST,
            closing: true,
            phase: Phase::Closed,
        },
        Case {
            name: "the client resets an unanswered SYN: closed",
            protocol: proto::TCP,
            steps: &[Request(SYN), Request(RST)],
            forward_state: ct_state::RST,
            reply_state: 0,
            closing: true,
            phase: Phase::Closed,
        },
        Case {
            name: "a UDP datagram without reply",
            protocol: proto::UDP,
            steps: &[Request(0), Request(0)],
            forward_state: 0,
            reply_state: 0,
            closing: false,
            phase: Phase::Udp,
        },
        Case {
            name: "a UDP exchange: a stream",
            protocol: proto::UDP,
            steps: &[Request(0), Reply(0)],
            forward_state: 0,
            reply_state: ct_state::REPLIED,
            closing: false,
            phase: Phase::UdpStream,
        },
    ];
    let mut fx = fixture(1024);
    for (i, case) in cases.iter().enumerate() {
        let sport = 40000 + i as u16;
        let before = expiry::monotonic_ns() - TICK_NS;
        for step in case.steps {
            assert_eq!(
                fx.send(*step, case.protocol, sport),
                TC_ACT_OK,
                "{}: {step:?}",
                case.name
            );
        }
        let after = expiry::monotonic_ns();
        let (Some(f), Some(r)) = fx.pair(case.protocol, sport) else {
            panic!(
                "{}: both entries are there: {:?}",
                case.name,
                fx.pair(case.protocol, sport)
            );
        };
        assert_eq!(
            (f.state, r.state),
            (case.forward_state, case.reply_state),
            "{}",
            case.name
        );
        for e in [&f, &r] {
            assert_eq!(
                e.flags & ct_flags::CLOSING != 0,
                case.closing,
                "{}: {e:?}",
                case.name
            );
            assert!(
                (before..=after).contains(&e.last_seen_ns),
                "{}: last seen {} is the kernel's CLOCK_MONOTONIC, to a tick ({before}..={after})",
                case.name,
                e.last_seen_ns
            );
        }
        assert_eq!(
            expiry::phase(case.protocol, f.flags | r.flags, f.state, r.state),
            case.phase,
            "{}",
            case.name
        );
    }
    assert_eq!(fx.stat("ct_full"), 0);
}

#[test]
fn last_seen_is_written_at_most_once_a_second_unless_the_state_changes() {
    let mut fx = fixture(1024);
    let sport = 45000;
    assert_eq!(fx.send(Step::Request(SYN), proto::TCP, sport), TC_ACT_OK);
    assert_eq!(fx.send(Step::Reply(SYN_ACK), proto::TCP, sport), TC_ACT_OK);
    // The client's first ACK changes the forward entry's state (ACKED),
    // so it writes the time; the baseline is taken after it.
    assert_eq!(fx.send(Step::Request(ACK), proto::TCP, sport), TC_ACT_OK);
    let (Some(f0), Some(r0)) = fx.pair(proto::TCP, sport) else {
        panic!("tracked");
    };
    // Within the second: no write.
    for _ in 0..5 {
        assert_eq!(fx.send(Step::Request(ACK), proto::TCP, sport), TC_ACT_OK);
        assert_eq!(fx.send(Step::Reply(ACK), proto::TCP, sport), TC_ACT_OK);
    }
    let (Some(f1), Some(r1)) = fx.pair(proto::TCP, sport) else {
        panic!("tracked");
    };
    assert_eq!(
        (f1.last_seen_ns, r1.last_seen_ns),
        (f0.last_seen_ns, r0.last_seen_ns)
    );

    // Age the forward entry by two seconds: the next request refreshes it,
    // and only it (each direction writes its own entry).
    let aged = CtEntry {
        last_seen_ns: f1.last_seen_ns - 2 * CT_REFRESH_NS,
        ..f1
    };
    let key = forward_key(proto::TCP, sport);
    fx.syncer
        .store_mut()
        .conntrack
        .insert(key, aged, 0)
        .expect("age the entry");
    // A write from here moves the table's generation on, as every write of
    // the agent does: this CPU's flow cache stood for the entry as it was
    // (two seconds later in earnest, its slot's time would have run out).
    fx.syncer.store_mut().conntrack_changed();
    let before = expiry::monotonic_ns() - TICK_NS;
    assert_eq!(fx.send(Step::Request(ACK), proto::TCP, sport), TC_ACT_OK);
    let (Some(f2), Some(r2)) = fx.pair(proto::TCP, sport) else {
        panic!("tracked");
    };
    assert!(f2.last_seen_ns >= before, "refreshed: {f2:?}");
    assert_eq!(r2.last_seen_ns, r1.last_seen_ns);

    // A state change is written at once, time stamp with it.
    let aged = CtEntry {
        last_seen_ns: r2.last_seen_ns - CT_REFRESH_NS / 2,
        ..r2
    };
    let key = reply_key(proto::TCP, sport);
    fx.syncer
        .store_mut()
        .conntrack
        .insert(key, aged, 0)
        .expect("age the entry");
    let before = expiry::monotonic_ns() - TICK_NS;
    assert_eq!(fx.send(Step::Reply(FIN_ACK), proto::TCP, sport), TC_ACT_OK);
    let (_, Some(r3)) = fx.pair(proto::TCP, sport) else {
        panic!("tracked");
    };
    assert_eq!(r3.state, ct_state::REPLIED | ct_state::FIN);
    assert!(r3.last_seen_ns >= before, "{r3:?}");
}

/// A full table refuses new flows (dropped, counted) and leaves no half of
/// them behind; tracked flows go on as before; once the collector removed
/// closed flows, the refused client's retransmission gets through.
#[test]
fn a_full_table_refuses_new_flows_and_keeps_tracked_ones() {
    const CAPACITY: u32 = 16;
    let mut fx = fixture(CAPACITY);
    // The long-lived connection.
    let idle = 30000;
    assert_eq!(fx.send(Step::Request(SYN), proto::TCP, idle), TC_ACT_OK);
    assert_eq!(fx.send(Step::Reply(SYN_ACK), proto::TCP, idle), TC_ACT_OK);
    assert_eq!(fx.send(Step::Request(ACK), proto::TCP, idle), TC_ACT_OK);
    // Short connections until the table is full; they close (established
    // flows, even closing ones, never give way to a new flow).
    // One flow is two entries: the idle one and seven short ones fill it.
    let short: Vec<u16> = (31000..31000 + CAPACITY as u16 / 2 - 1).collect();
    for &sport in &short {
        for step in [
            Step::Request(SYN),
            Step::Reply(SYN_ACK),
            Step::Request(FIN_ACK),
            Step::Reply(FIN_ACK),
        ] {
            assert_eq!(
                fx.send(step, proto::TCP, sport),
                TC_ACT_OK,
                "{sport} {step:?}"
            );
        }
    }
    assert_eq!(fx.ct_entries(), CAPACITY as usize);
    assert_eq!(fx.stat("ct_full"), 0);

    // Full: a new flow's SYN and a new UDP flow are dropped and counted,
    // and nothing of them stays.
    let refused = 32000;
    assert_eq!(
        fx.send(Step::Request(SYN), proto::TCP, refused),
        TC_ACT_SHOT
    );
    assert_eq!(fx.send(Step::Request(0), proto::UDP, refused), TC_ACT_SHOT);
    assert_eq!(fx.stat("ct_full"), 2);
    assert_eq!(fx.pair(proto::TCP, refused), (None, None));
    assert_eq!(fx.ct_entries(), CAPACITY as usize);

    // The tracked connection goes on both ways.
    assert_eq!(fx.send(Step::Request(ACK), proto::TCP, idle), TC_ACT_OK);
    assert_eq!(fx.send(Step::Reply(ACK), proto::TCP, idle), TC_ACT_OK);
    assert_eq!(fx.stat("ct_full"), 2);

    // The collector, a minute on: the closed flows go, the idle one stays.
    let timeouts = Timeouts::default();
    let later = expiry::monotonic_ns() + 60 * 1_000_000_000;
    let pass =
        expiry::collect(&mut fx.syncer.store_mut().conntrack, later, &timeouts).expect("collect");
    assert_eq!(pass.entries, CAPACITY as usize);
    assert_eq!(pass.deleted, 2 * short.len());
    assert!(matches!(fx.pair(proto::TCP, idle), (Some(_), Some(_))));
    // The retransmitted SYN is tracked now.
    assert_eq!(fx.send(Step::Request(SYN), proto::TCP, refused), TC_ACT_OK);
    assert!(matches!(fx.pair(proto::TCP, refused), (Some(_), Some(_))));
    assert_eq!(fx.stat("ct_full"), 2);
}

/// A table full of flows that never completed their handshake (a spoofed
/// SYN flood: SYNs the backend answers, never acknowledged) or UDP flows
/// never answered gives way to new flows, oldest first; an established
/// connection, and one that completed its handshake during the flood, is
/// never removed. Nothing is counted as `ct_full`. The flood runs on one
/// CPU and the real client on another, which created no flow to give way:
/// room is made among the flood's all the same.
#[test]
fn unestablished_flows_give_way_to_new_ones_and_established_flows_never_do() {
    const CAPACITY: u32 = 16;
    run_on_cpu(0);
    let mut fx = fixture(CAPACITY);
    let idle = 30000;
    for step in [Step::Request(SYN), Step::Reply(SYN_ACK), Step::Request(ACK)] {
        assert_eq!(fx.send(step, proto::TCP, idle), TC_ACT_OK);
    }
    // Spoofed SYNs fill the table: answered by the backend, never ACKed.
    let spoofed: Vec<u16> = (31000..31000 + CAPACITY as u16 / 2 - 1).collect();
    for &sport in &spoofed {
        assert_eq!(fx.send(Step::Request(SYN), proto::TCP, sport), TC_ACT_OK);
        assert_eq!(fx.send(Step::Reply(SYN_ACK), proto::TCP, sport), TC_ACT_OK);
    }
    assert_eq!(fx.ct_entries(), CAPACITY as usize);

    // The flood goes on: every new SYN takes the place of an older
    // half-open flow; a real client among them completes its handshake.
    let real = 33000;
    for i in 0..40u16 {
        assert_eq!(
            fx.send(Step::Request(SYN), proto::TCP, 32000 + i),
            TC_ACT_OK,
            "flood SYN {i}"
        );
        if i == 5 {
            run_on_cpu(1);
            assert_eq!(
                fx.send(Step::Request(SYN), proto::TCP, real),
                TC_ACT_OK,
                "the real client's SYN"
            );
            assert_eq!(fx.send(Step::Reply(SYN_ACK), proto::TCP, real), TC_ACT_OK);
            assert_eq!(fx.send(Step::Request(ACK), proto::TCP, real), TC_ACT_OK);
            run_on_cpu(0);
        }
        assert_eq!(fx.ct_entries(), CAPACITY as usize);
    }
    assert_eq!(fx.stat("ct_full"), 0, "room was made every time");
    for sport in [idle, real] {
        let (Some(f), Some(_)) = fx.pair(proto::TCP, sport) else {
            panic!("established flow {sport} was removed");
        };
        assert_ne!(f.state & ct_state::ACKED, 0);
        assert_eq!(fx.send(Step::Request(ACK), proto::TCP, sport), TC_ACT_OK);
    }
    for &sport in &spoofed {
        assert_eq!(
            fx.pair(proto::TCP, sport),
            (None, None),
            "the oldest half-open flows went first"
        );
    }

    // UDP: a flow never answered gives way; an answered one does not.
    let answered = 34000;
    assert_eq!(fx.send(Step::Request(0), proto::UDP, answered), TC_ACT_OK);
    assert_eq!(fx.send(Step::Reply(0), proto::UDP, answered), TC_ACT_OK);
    for i in 0..20u16 {
        assert_eq!(
            fx.send(Step::Request(0), proto::UDP, 35000 + i),
            TC_ACT_OK,
            "UDP flow {i}"
        );
    }
    assert!(
        matches!(fx.pair(proto::UDP, answered), (Some(_), Some(_))),
        "the answered UDP flow stays"
    );
    assert_eq!(fx.stat("ct_full"), 0);

    // Only established flows left: a new flow is refused and counted.
    let established: Vec<u16> = (36000..36000 + CAPACITY as u16).collect();
    let mut admitted = 0;
    for &sport in &established {
        if fx.send(Step::Request(SYN), proto::TCP, sport) != TC_ACT_OK {
            break;
        }
        assert_eq!(fx.send(Step::Reply(SYN_ACK), proto::TCP, sport), TC_ACT_OK);
        assert_eq!(fx.send(Step::Request(ACK), proto::TCP, sport), TC_ACT_OK);
        admitted += 1;
    }
    assert!(
        admitted > 0 && admitted < established.len(),
        "admitted {admitted}"
    );
    assert!(
        fx.stat("ct_full") >= 1,
        "a table of established flows refuses"
    );
    for sport in [idle, real] {
        assert!(
            matches!(fx.pair(proto::TCP, sport), (Some(_), Some(_))),
            "{sport} survived"
        );
    }
}

/// Each CPU's flow cache answers an established flow's segments without
/// the table (`proxy-ebpf/src/ct/cache.rs`); once the agent removed the
/// flow (its Service deleted, the Service's address still a frontend of
/// another port), neither direction is translated any more, though the
/// cached slots' time has not run out: the purge moved the table's
/// generation on.
#[test]
fn a_flow_the_agent_removed_is_not_translated_from_a_cache() {
    use Step::*;
    run_on_cpu(0);
    let mut loaded = fixture(1024);
    let sport = 41000;
    let handshake = [Request(SYN), Reply(SYN_ACK), Request(ACK)];
    for step in handshake {
        assert_eq!(loaded.send(step, proto::TCP, sport), TC_ACT_OK, "{step:?}");
    }
    // Established: these segments are answered from this CPU's cache.
    let request = PacketSpec {
        tcp_flags: ACK,
        ..PacketSpec::tcp(CLIENT, sport, VIP, 80)
    }
    .build();
    let reply = PacketSpec {
        tcp_flags: ACK,
        ..PacketSpec::tcp(POD1, 8080, CLIENT, sport)
    }
    .build();
    let gen_before = loaded.ct_generation();
    for _ in 0..3 {
        let (verdict, out) = loaded.run(programs::TC_FROM_POD, &request);
        assert_eq!((verdict, dst(&out)), (TC_ACT_OK, POD1), "a request, cached");
        let (verdict, out) = loaded.run(programs::TC_TO_POD, &reply);
        assert_eq!((verdict, src(&out)), (TC_ACT_OK, VIP), "a reply, cached");
    }
    assert_eq!(
        loaded.ct_generation(),
        gen_before,
        "packets of a tracked flow leave the generation alone"
    );
    // The TCP Service goes; the UDP one keeps VIP a frontend address.
    loaded.program(vec![cluster_ip(
        VIP,
        53,
        Protocol::Udp,
        "svc53",
        &[(POD1, 5353)],
    )]);
    assert_eq!(loaded.pair(proto::TCP, sport), (None, None), "purged");
    assert!(loaded.ct_generation() > gen_before, "the purge moved it on");
    let (verdict, out) = loaded.run(programs::TC_FROM_POD, &request);
    assert_eq!(
        (verdict, dst(&out)),
        (TC_ACT_UNSPEC, VIP),
        "a request after the purge passes untranslated"
    );
    let (verdict, out) = loaded.run(programs::TC_TO_POD, &reply);
    assert_eq!(
        (verdict, src(&out)),
        (TC_ACT_UNSPEC, POD1),
        "a reply after the purge passes untranslated"
    );
}

/// The IPv4 destination of a frame.
fn dst(frame: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(frame[30], frame[31], frame[32], frame[33])
}

/// The IPv4 source of a frame.
fn src(frame: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(frame[26], frame[27], frame[28], frame[29])
}

/// A client reuses its port for a new connection after the backend of the
/// old one left the Service (its established flow kept draining, so its
/// entries are still there): the SYN finds the old flow's backend gone,
/// is balanced to a live one, and its entry is written over the old flow's
/// (the data path voids the key's slot of the flow caches, not every slot:
/// the table's generation stays); the segments after it go to the new
/// backend, not to the one this CPU's flow cache held.
#[test]
fn a_reused_tuple_goes_to_its_new_backend_not_to_a_cached_one() {
    use Step::*;
    const POD2: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 2);
    run_on_cpu(0);
    let mut loaded = fixture(1024);
    let sport = 42000;
    for step in [Request(SYN), Reply(SYN_ACK), Request(ACK)] {
        assert_eq!(loaded.send(step, proto::TCP, sport), TC_ACT_OK, "{step:?}");
    }
    let request = |flags| {
        PacketSpec {
            tcp_flags: flags,
            ..PacketSpec::tcp(CLIENT, sport, VIP, 80)
        }
        .build()
    };
    for _ in 0..3 {
        let (verdict, out) = loaded.run(programs::TC_FROM_POD, &request(ACK));
        assert_eq!((verdict, dst(&out)), (TC_ACT_OK, POD1), "cached, to POD1");
    }
    // POD1 leaves the Service; its TCP flow is left to drain.
    loaded.program(vec![
        cluster_ip(VIP, 80, Protocol::Tcp, "svc80", &[(POD2, 8080)]),
        cluster_ip(VIP, 53, Protocol::Udp, "svc53", &[(POD1, 5353)]),
    ]);
    let gen = loaded.ct_generation();
    assert!(
        loaded.pair(proto::TCP, sport).0.is_some(),
        "the drained flow is kept"
    );
    let (verdict, out) = loaded.run(programs::TC_FROM_POD, &request(SYN));
    assert_eq!((verdict, dst(&out)), (TC_ACT_OK, POD2), "the new SYN");
    assert_eq!(
        loaded.ct_generation(),
        gen,
        "the entry written over the old one voids its own slot, not the table's generation"
    );
    for _ in 0..3 {
        let (verdict, out) = loaded.run(programs::TC_FROM_POD, &request(ACK));
        assert_eq!(
            (verdict, dst(&out)),
            (TC_ACT_OK, POD2),
            "the new connection's segments"
        );
    }
}

/// The table's answer to a SYN-ACK fills the reply's slot of this CPU's
/// flow cache, so the server's next segment needs no table lookup: with
/// the reply entry taken out behind the caches' back (no generation moved,
/// which the agent never does), that segment is still translated, from
/// the slot alone. Once the table's generation moves, as after any removal
/// by the agent, it is not.
#[test]
fn a_syn_ack_fills_the_reply_slot_for_the_servers_next_segment() {
    use Step::*;
    run_on_cpu(0);
    let mut loaded = fixture(1024);
    let sport = 43000;
    for step in [Request(SYN), Reply(SYN_ACK)] {
        assert_eq!(loaded.send(step, proto::TCP, sport), TC_ACT_OK, "{step:?}");
    }
    loaded
        .syncer
        .store_mut()
        .conntrack
        .remove(&reply_key(proto::TCP, sport))
        .expect("take the reply entry out");
    let reply = PacketSpec {
        tcp_flags: ACK,
        ..PacketSpec::tcp(POD1, 8080, CLIENT, sport)
    }
    .build();
    let (verdict, out) = loaded.run(programs::TC_TO_POD, &reply);
    assert_eq!(
        (verdict, src(&out)),
        (TC_ACT_OK, VIP),
        "the server's segment after the SYN-ACK, from the slot"
    );
    loaded.syncer.store_mut().conntrack_changed();
    let (verdict, out) = loaded.run(programs::TC_TO_POD, &reply);
    assert_eq!(
        (verdict, src(&out)),
        (TC_ACT_UNSPEC, POD1),
        "the same segment once the table's generation moved"
    );
}
