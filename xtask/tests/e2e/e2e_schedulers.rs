//! The per-node schedulers with real connections (root only): one backend
//! holds 20 long-lived connections, and new short connections from the
//! client go mostly to the other backends under `least-conn`, and to every
//! backend in turn under `round-robin`; once the long ones closed, the
//! spread evens out.
use std::process::Child;
use std::time::Duration;

use xtask::sandbox::{find, pod_name, Sandbox, CLUSTER_IP, PODS};
use xtask::testenv::{demo_sandbox_with, endpointslice_yaml, sb_echo, switchboard, write_manifest};

/// Long-lived connections held on pod1.
const HELD: usize = 20;
/// How long each is held, seconds: long enough for the short connections.
const HOLD_S: &str = "8";
/// Short connections per round.
const SHORT: usize = 30;
/// Short connections of the round after the long ones closed, when every
/// backend holds nothing: least-connection's two choices then tie, and a
/// pod's share is binomial (n = 90, p = 1/3: 30 ± 4.5), so a pod with
/// fewer than 15 is a count not taken off, not chance (3.4 standard
/// deviations; with 30 connections and 4 as the bound, one run in about a
/// hundred failed by chance).
const IDLE: usize = 90;

/// The Service's backends become pods `pods`, and the test waits until the
/// agent programmed them.
fn set_backends(sb: &mut Sandbox, pods: &[usize]) {
    write_manifest(sb, "endpointslice.yaml", &endpointslice_yaml(pods));
    let want = pods.len();
    if let Err(e) = sb.wait_services(
        &switchboard(),
        Duration::from_secs(5),
        "demo/echo:http with the new backends",
        |f| find(f, "demo/echo:http").is_some_and(|fe| fe.backends.len() == want),
    ) {
        panic!("{e:#}");
    }
}

/// [`HELD`] connections to the ClusterIP, all on pod1 (the only backend
/// while they open), then all three pods are backends again.
fn hold_on_pod1(sb: &mut Sandbox) -> Vec<Child> {
    set_backends(sb, &[1]);
    let addr = format!("{CLUSTER_IP}:80");
    let held: Vec<Child> = (0..HELD)
        .map(|_| {
            sb.client_spawn(&sb_echo(), &["--tcp", &addr, "--hold", HOLD_S])
                .unwrap_or_else(|e| panic!("{e:#}"))
        })
        .collect();
    // Every holder has connected (each answers within milliseconds).
    std::thread::sleep(Duration::from_millis(1500));
    set_backends(sb, &[1, 2, 3]);
    held
}

/// `count` short connections, one after the other: replies per pod.
fn short_round(sb: &Sandbox, count: usize) -> Vec<usize> {
    let addr = format!("{CLUSTER_IP}:80");
    let run = sb
        .client(&sb_echo(), &["--tcp", &addr, "--count", &count.to_string()])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(run.all_ok(), "short connections failed:\n{}", run.raw);
    let spread = run.spread();
    (1..=PODS)
        .map(|i| spread.get(&pod_name(i)).copied().unwrap_or(0))
        .collect()
}

fn wait_all(held: Vec<Child>) {
    for child in held {
        let out = child.wait_with_output().expect("a holder ends");
        assert!(
            out.status.success(),
            "a long-lived connection lost replies: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

#[test]
fn least_conn_sends_new_connections_away_from_the_busy_backend() {
    let mut sb = demo_sandbox_with(&["--lb-algorithm", "least-conn"]);
    let held = hold_on_pod1(&mut sb);
    let busy = short_round(&sb, SHORT);
    eprintln!("least-conn, pod1 holding {HELD}: {busy:?}");
    // Two distinct backends are compared per new flow: pod1 (20 open
    // flows) loses to either other pod every time.
    assert!(busy[0] <= 2, "pod1 got {} of {SHORT}: {busy:?}", busy[0]);
    assert!(busy[1] > 0 && busy[2] > 0, "{busy:?}");
    wait_all(held);
    let idle = short_round(&sb, IDLE);
    eprintln!("least-conn, after the long connections closed: {idle:?}");
    assert!(
        idle.iter().all(|n| *n >= 15),
        "uneven after the close: {idle:?}"
    );
}

#[test]
fn round_robin_sends_new_connections_to_every_backend_in_turn() {
    let mut sb = demo_sandbox_with(&["--lb-algorithm", "round-robin"]);
    let held = hold_on_pod1(&mut sb);
    let busy = short_round(&sb, SHORT);
    eprintln!("round-robin, pod1 holding {HELD}: {busy:?}");
    // Strict turns on the node: ten each, whatever pod1 holds.
    assert_eq!(busy, vec![SHORT / PODS; PODS], "{busy:?}");
    wait_all(held);
    let after = short_round(&sb, SHORT);
    assert_eq!(after, vec![SHORT / PODS; PODS], "{after:?}");
}

/// Weights from the EndpointSlice's `switchboard.io/weights`, with real
/// connections: 3:1 with pod3 drained gives pod1 about three quarters of
/// 200 new connections (125..=175; equal weights would give it 100, eight
/// standard deviations away) and pod3 none.
#[test]
fn weights_from_the_endpointslice_split_new_connections_3_to_1() {
    let mut sb = demo_sandbox_with(&[]);
    let slice = endpointslice_yaml(&[1, 2, 3]).replacen(
        "  labels:\n",
        &format!(
            "  annotations:\n    switchboard.io/weights: \"{}=3,{}=1,{}=0\"\n  labels:\n",
            xtask::sandbox::pod_ip(1),
            xtask::sandbox::pod_ip(2),
            xtask::sandbox::pod_ip(3)
        ),
        1,
    );
    write_manifest(&sb, "endpointslice.yaml", &slice);
    if let Err(e) = sb.wait_services(
        &switchboard(),
        Duration::from_secs(5),
        "demo/echo:http with its weights",
        |f| {
            find(f, "demo/echo:http").is_some_and(|fe| {
                let weights: Vec<Option<u16>> = fe.backends.iter().map(|b| b.weight).collect();
                weights.contains(&Some(3)) && weights.contains(&Some(0))
            })
        },
    ) {
        panic!("{e:#}");
    }
    let addr = format!("{CLUSTER_IP}:80");
    let run = sb
        .client(&sb_echo(), &["--tcp", &addr, "--count", "200"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(run.all_ok(), "connections failed:\n{}", run.raw);
    let spread = run.spread();
    let got: Vec<usize> = (1..=PODS)
        .map(|i| spread.get(&pod_name(i)).copied().unwrap_or(0))
        .collect();
    eprintln!("weights 3:1:0 over 200 connections: {got:?}");
    assert!((125..=175).contains(&got[0]), "{got:?}");
    assert_eq!(got[0] + got[1], 200, "{got:?}");
    assert_eq!(got[2], 0, "the drained pod got new connections: {got:?}");
}
