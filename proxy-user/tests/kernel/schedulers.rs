//! The per-node schedulers through BPF_PROG_TEST_RUN: round-robin's strict
//! order, least-connection's preference for the idle backend, and the
//! open-flow counts (`SB_LC_V1`) rising when a flow opens and falling at
//! its FIN or RST, when the collector removes it, and when a full table
//! refuses it. Needs root (CAP_BPF).
use std::{collections::BTreeMap, net::Ipv4Addr};

use aya::maps::{HashMap, MapData};
use proxy_common::{names, programs, CtKey};
use proxy_testkit::packet::PacketSpec;
use proxy_user::{
    dataplane::{
        flows::expiry::{self, Timeouts},
        flows::open_counts::{self, Tally},
    },
    model::{Frontend, FrontendKind, LbAlgorithm, Protocol},
};

use crate::support::{capacities, cluster_ip, frontend, Loaded, TC_ACT_OK, TC_ACT_SHOT};

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 30);
const PODS: [Ipv4Addr; 3] = [
    Ipv4Addr::new(10, 244, 1, 2),
    Ipv4Addr::new(10, 244, 2, 2),
    Ipv4Addr::new(10, 244, 3, 2),
];
/// Source ports of the fixtures (above the ephemeral range).
const PORT0: u16 = 61000;

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const FIN_ACK: u8 = 0x11;
const RST: u8 = 0x04;

fn service(algorithm: LbAlgorithm, pods: usize) -> Frontend {
    let backends: Vec<(Ipv4Addr, u16)> = PODS[..pods].iter().map(|p| (*p, 8080)).collect();
    Frontend {
        algorithm: Some(algorithm),
        ..cluster_ip(VIP, 80, Protocol::Tcp, "sched", &backends)
    }
}

fn loaded(frontends: Vec<Frontend>, conntrack: u32) -> Loaded {
    Loaded::new(capacities(conntrack), frontends)
}

/// A segment from the client's port `port` to the frontend with `flags`
/// through `sb_from_pod`: the verdict and the backend it went to.
fn send(fx: &mut Loaded, port: u16, flags: u8) -> (u32, Option<usize>) {
    let spec = PacketSpec {
        tcp_flags: flags,
        ..PacketSpec::tcp(CLIENT, port, VIP, 80)
    };
    let (verdict, out) = fx.tc(programs::TC_FROM_POD, &spec.build(), None);
    let dst = out
        .get(30..34)
        .map(|d| Ipv4Addr::new(d[0], d[1], d[2], d[3]));
    (verdict, dst.and_then(|d| PODS.iter().position(|p| *p == d)))
}

/// A new connection from `port`: the backend it was given.
fn open(fx: &mut Loaded, port: u16) -> usize {
    let (verdict, backend) = send(fx, port, SYN);
    assert_eq!(verdict, TC_ACT_OK, "SYN from {port}");
    backend.expect("the SYN goes to a backend")
}

/// The loaded object's open-flow counts, by backend address.
fn counts(fx: &Loaded) -> BTreeMap<usize, u64> {
    let map: HashMap<&MapData, u32, u64> =
        HashMap::try_from(fx.ebpf.map(names::OPEN_FLOWS).expect("the count map")).expect("typed");
    let store = fx.syncer.store();
    let mut out = BTreeMap::new();
    for (id, n) in map.iter().filter_map(Result::ok) {
        let backend = store
            .backends
            .get(&id, 0)
            .expect("a counted backend exists");
        let ip = Ipv4Addr::from(u32::from_be(backend.addr_be));
        let index = PODS.iter().position(|p| *p == ip).expect("a known pod");
        out.insert(index, n);
    }
    out
}

fn total(fx: &Loaded) -> u64 {
    counts(fx).values().sum()
}

#[test]
fn round_robin_gives_new_flows_the_backends_in_strict_turn() {
    let mut fx = loaded(vec![service(LbAlgorithm::RoundRobin, 3)], 4096);
    let order: Vec<usize> = (0..12).map(|i| open(&mut fx, PORT0 + i)).collect();
    let first = order[0];
    for (i, backend) in order.iter().enumerate() {
        assert_eq!(order[i % 3], *backend, "turn {i}: {order:?}");
    }
    let mut distinct = order[..3].to_vec();
    distinct.sort_unstable();
    assert_eq!(distinct, [0, 1, 2], "{order:?}");
    // A tracked flow's packets take no turn.
    let (_, again) = send(&mut fx, PORT0, ACK);
    assert_eq!(again, Some(first));
    assert_eq!(open(&mut fx, PORT0 + 100), order[12 % 3]);
    // Round-robin counts no flows.
    assert_eq!(total(&fx), 0);
    assert_eq!(
        fx.service_row("sched").algorithm,
        LbAlgorithm::RoundRobin,
        "the CLI reads the algorithm back"
    );
}

/// With two backends both are the two choices: least-connection is exact.
#[test]
fn least_conn_prefers_the_idle_backend_and_counts_follow_open_and_close() {
    let mut fx = loaded(vec![service(LbAlgorithm::LeastConn, 2)], 4096);
    let mut given = Vec::new();
    for i in 0..6 {
        given.push(open(&mut fx, PORT0 + i));
        assert_eq!(total(&fx), i as u64 + 1, "a count per open flow");
    }
    assert_eq!(
        counts(&fx),
        [(0, 3), (1, 3)].into_iter().collect(),
        "{given:?}"
    );
    // Backend 0's three flows end: two with a FIN, one with an RST.
    let on_zero: Vec<u16> = (0..6u16).filter(|i| given[*i as usize] == 0).collect();
    let closes = [FIN_ACK, FIN_ACK, RST];
    for (i, close) in on_zero.iter().zip(closes) {
        assert_eq!(send(&mut fx, PORT0 + i, close).0, TC_ACT_OK);
    }
    assert_eq!(counts(&fx), [(0, 0), (1, 3)].into_iter().collect());
    // A second FIN takes nothing more off.
    send(&mut fx, PORT0 + on_zero[0], FIN_ACK);
    assert_eq!(counts(&fx)[&0], 0);
    // The idle backend gets every new flow until it is as loaded.
    for i in 10..13 {
        assert_eq!(open(&mut fx, PORT0 + i), 0, "new flow {i}");
    }
    assert_eq!(counts(&fx), [(0, 3), (1, 3)].into_iter().collect());
}

#[test]
fn least_conn_counts_fall_when_the_collector_removes_an_expired_flow() {
    let mut fx = loaded(vec![service(LbAlgorithm::LeastConn, 2)], 4096);
    for i in 0..4 {
        open(&mut fx, PORT0 + i);
    }
    // One flow closes by FIN (the data path takes it off), the others
    // expire unanswered.
    send(&mut fx, PORT0, FIN_ACK);
    assert_eq!(total(&fx), 3);
    let later = expiry::monotonic_ns() + 120 * 1_000_000_000;
    let mut tally = Tally::default();
    let pass = expiry::collect_tallied(
        &mut fx.syncer.store_mut().conntrack,
        later,
        &Timeouts::default(),
        &mut tally,
    )
    .expect("collect");
    assert_eq!(pass.deleted, 8);
    assert_eq!(tally.removed.values().sum::<u64>(), 3, "{tally:?}");
    assert!(tally.open.is_empty(), "{tally:?}");
    let mut map: HashMap<&mut MapData, u32, u64> =
        HashMap::try_from(fx.ebpf.map_mut(names::OPEN_FLOWS).expect("the count map"))
            .expect("typed");
    let settled =
        open_counts::settle(&mut map, &tally, &mut Some(BTreeMap::new())).expect("settle");
    assert_eq!(settled, open_counts::Settled::default());
    assert_eq!(total(&fx), 0);
}

#[test]
fn least_conn_counts_survive_a_full_table_and_a_departed_backend() {
    // Two flows fit (two entries each).
    let mut fx = loaded(vec![service(LbAlgorithm::LeastConn, 2)], 4);
    open(&mut fx, PORT0);
    open(&mut fx, PORT0 + 1);
    // Both answered and acknowledged: established, so nothing gives way.
    for i in 0..2 {
        let backend = PODS[counts_backend(&fx, PORT0 + i)];
        let reply = PacketSpec {
            tcp_flags: SYN | ACK,
            ..PacketSpec::tcp(backend, 8080, CLIENT, PORT0 + i)
        };
        fx.tc(programs::TC_TO_POD, &reply.build(), None);
        send(&mut fx, PORT0 + i, ACK);
    }
    let (verdict, _) = send(&mut fx, PORT0 + 2, SYN);
    assert_eq!(verdict, TC_ACT_SHOT, "the table is full");
    assert_eq!(total(&fx), 2, "a refused flow is not counted");
    // The pods leave; their connections drain and still close as counted.
    let report = fx.program(vec![service(LbAlgorithm::LeastConn, 0)]);
    assert!(report.failed.is_empty(), "{report:?}");
    send(&mut fx, PORT0, RST);
    send(&mut fx, PORT0 + 1, FIN_ACK);
    let map: HashMap<&MapData, u32, u64> =
        HashMap::try_from(fx.ebpf.map(names::OPEN_FLOWS).expect("the count map")).expect("typed");
    let left: u64 = map.iter().filter_map(Result::ok).map(|(_, n)| n).sum();
    assert_eq!(left, 0);
}

/// The backend index the forward entry of the flow from `port` names.
fn counts_backend(fx: &Loaded, port: u16) -> usize {
    let key = CtKey {
        saddr_be: u32::from(CLIENT).to_be(),
        daddr_be: u32::from(VIP).to_be(),
        sport_be: port.to_be(),
        dport_be: 80u16.to_be(),
        proto: 6,
        dir: 0,
        _pad: [0; 2],
    };
    let entry = fx.ct(&key).expect("tracked");
    let ip = Ipv4Addr::from(u32::from_be(entry.nat_addr_be));
    PODS.iter().position(|p| *p == ip).expect("a known pod")
}

/// NodePort traffic from outside is not needed here: every path picks
/// through the same selection; one kind other than ClusterIP shows the
/// flags reach a NodePort frontend's slot 0 too.
#[test]
fn the_algorithm_reaches_every_frontend_kind() {
    let node_port = Frontend {
        algorithm: Some(LbAlgorithm::LeastConn),
        ..frontend(
            FrontendKind::NodePort,
            Ipv4Addr::new(10, 0, 0, 1),
            30080,
            Protocol::Tcp,
            "np",
            &[(PODS[0], 8080)],
        )
    };
    let fx = loaded(vec![node_port], 64);
    assert_eq!(fx.service_row("np").algorithm, LbAlgorithm::LeastConn);
}

/// `service` with weights (`switchboard.io/weights`) per pod index.
fn weighted(algorithm: LbAlgorithm, weights: &[u16]) -> Frontend {
    let mut fe = service(algorithm, weights.len());
    fe.weights = weights
        .iter()
        .enumerate()
        .filter(|(_, w)| **w != 1)
        .map(|(i, w)| {
            let backend = proxy_user::model::BackendAddr {
                ip: PODS[i].into(),
                port: 8080,
            };
            (backend, *w)
        })
        .collect();
    fe
}

/// New flows per backend over `n` connections from fresh ports.
fn spread(fx: &mut Loaded, first: u16, n: u16) -> [usize; 3] {
    let mut got = [0; 3];
    for i in 0..n {
        got[open(fx, first + i)] += 1;
    }
    got
}

/// Weights 3:1 (and a drained third backend) through every per-node
/// pick: round-robin exactly, random within a tolerance that equal
/// weights (200 each of 400) could not meet, least-connection keeping
/// open flows ÷ weight level. The drained backend gets nothing.
#[test]
fn weights_spread_new_flows_in_proportion_and_weight_zero_gets_none() {
    let mut fx = loaded(vec![weighted(LbAlgorithm::RoundRobin, &[3, 1, 0])], 4096);
    assert_eq!(spread(&mut fx, PORT0, 400), [300, 100, 0], "round-robin");
    let row = fx.service_row("sched");
    let weights: Vec<Option<u16>> = row.backends.iter().map(|b| b.weight).collect();
    assert_eq!(
        weights,
        [Some(3), Some(1), Some(0)],
        "the CLI reads the weights back"
    );

    let mut fx = loaded(vec![weighted(LbAlgorithm::Random, &[3, 1, 0])], 4096);
    let got = spread(&mut fx, PORT0, 400);
    // Binomial(400, 3/4): mean 300, sd 8.7; equal weights would give 200.
    assert!((260..=340).contains(&got[0]), "random: {got:?}");
    assert_eq!(got[2], 0, "random: {got:?}");

    let mut fx = loaded(vec![weighted(LbAlgorithm::LeastConn, &[3, 1, 0])], 4096);
    for i in 0..40 {
        open(&mut fx, PORT0 + i);
        let c = counts(&fx);
        let (a, b) = (
            c.get(&0).copied().unwrap_or(0),
            c.get(&1).copied().unwrap_or(0),
        );
        // Power of two choices keeps a ÷ 3 and b ÷ 1 within a flow or two.
        assert!(a.abs_diff(3 * b) <= 6, "least-conn after {}: {c:?}", i + 1);
        assert_eq!(c.get(&2).copied().unwrap_or(0), 0, "least-conn: {c:?}");
    }
}

/// Draining a backend (weight 0) keeps its open flows on it and gives it
/// no new one; weighing it again brings it back.
#[test]
fn a_drained_backend_keeps_its_flows_and_gets_no_new_ones() {
    let mut fx = loaded(vec![service(LbAlgorithm::RoundRobin, 3)], 4096);
    let order: Vec<usize> = (0..3).map(|i| open(&mut fx, PORT0 + i)).collect();
    let on_zero = PORT0
        + order
            .iter()
            .position(|b| *b == 0)
            .expect("pod 0 had a turn") as u16;
    let report = fx.program(vec![weighted(LbAlgorithm::RoundRobin, &[0, 1, 1])]);
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(
        send(&mut fx, on_zero, ACK),
        (TC_ACT_OK, Some(0)),
        "the open flow stays"
    );
    assert_eq!(spread(&mut fx, PORT0 + 10, 40), [0, 20, 20]);
    let report = fx.program(vec![service(LbAlgorithm::RoundRobin, 3)]);
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(spread(&mut fx, PORT0 + 100, 30), [10, 10, 10]);
}
