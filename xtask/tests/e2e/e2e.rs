//! Netns end-to-end tests with real sockets (root only).
//!
//! Each test builds its own sandbox (`sbt<pid>-<n>`: node, client and three pod
//! namespaces), starts `sb-echo` pods and, for most tests, the `switchboard`
//! agent on the node with the demo manifests, then drives traffic from the
//! client namespace to the ClusterIP 10.96.0.10.
//!
//! The binaries come from `cargo xtask test`, which builds them and passes
//! SWITCHBOARD_BIN and SB_ECHO_BIN. Without those the tests fail (never pass
//! silently).

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use xtask::sandbox::{
    find, list_netns, pod_ip, pod_name, Attempt, ClientRun, Frontend, Sandbox, CLIENT_IP,
    CLUSTER_IP, PIN_BASE, PODS, POD_TCP_PORT, POD_UDP_PORT,
};
use xtask::testenv::{
    demo_sandbox_with, endpointslice_yaml, pod_saw_ips, require_root, sb_echo, switchboard,
    write_manifest,
};

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Sandbox + pods + agent with the demo manifests, programmed (3 backends on
/// both ports).
fn demo_sandbox() -> Sandbox {
    demo_sandbox_with(&[])
}

fn client(sb: &Sandbox, args: &[&str]) -> ClientRun {
    sb.client(&sb_echo(), args)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// The sandbox itself, without the agent: the client reaches each pod's own
/// address over TCP and UDP, and cleanup leaves nothing behind.
#[test]
fn sandbox_pods_reachable_directly_and_cleaned_up() {
    require_root();
    let echo = sb_echo();
    let mut sb = Sandbox::for_test().expect("create sandbox");
    let tag = sb.tag.clone();
    sb.start_pods(&echo).expect("start pods");
    for i in 1..=PODS {
        for (proto, port) in [("--tcp", POD_TCP_PORT), ("--udp", POD_UDP_PORT)] {
            let addr = format!("{}:{port}", pod_ip(i));
            let run = client(&sb, &[proto, &addr, "--count", "3"]);
            assert!(run.all_ok(), "{proto} {addr}: {}", run.raw);
            assert_eq!(run.names(), vec![pod_name(i); 3], "{}", run.raw);
            assert_eq!(run.client_saw(), vec![addr.clone()], "{}", run.raw);
            assert_eq!(
                pod_saw_ips(&run),
                BTreeSet::from([CLIENT_IP.to_string()]),
                "{}",
                run.raw
            );
        }
    }
    // Nothing routes the ClusterIP without the agent.
    let run = client(
        &sb,
        &["--tcp", &format!("{CLUSTER_IP}:80"), "--timeout-ms", "300"],
    );
    assert_eq!(run.failures(), 1, "{}", run.raw);

    let pin_dir = sb.pin_dir.clone();
    assert!(xtask::sandbox::is_mountpoint(&pin_dir));
    sb.cleanup().expect("cleanup");
    let left: Vec<String> = list_netns()
        .unwrap()
        .into_iter()
        .filter(|ns| ns.starts_with(&format!("{tag}-")))
        .collect();
    assert!(left.is_empty(), "namespaces left: {left:?}");
    assert!(!xtask::sandbox::is_mountpoint(&pin_dir));
    assert!(!Path::new(PIN_BASE).join(&tag).exists());
}

/// All three pods are reached over TCP and UDP through the ClusterIP; the
/// client sees the ClusterIP as its peer and the pods see the client's own
/// address (no SNAT).
#[test]
fn clusterip_reaches_all_pods_over_tcp_and_udp() {
    let sb = demo_sandbox();
    for (proto, port) in [("--tcp", 80), ("--udp", 53)] {
        let addr = format!("{CLUSTER_IP}:{port}");
        let run = client(&sb, &[proto, &addr, "--count", "60"]);
        assert!(run.all_ok(), "{proto} {addr} had failures:\n{}", run.raw);
        let spread = run.spread();
        for i in 1..=PODS {
            assert!(
                spread.get(&pod_name(i)).copied().unwrap_or(0) > 0,
                "{proto} {addr}: pod{i} never answered in 60 tries: {spread:?}"
            );
        }
        assert_eq!(
            run.client_saw(),
            vec![addr.clone()],
            "client saw other peers"
        );
        assert_eq!(
            pod_saw_ips(&run),
            BTreeSet::from([CLIENT_IP.to_string()]),
            "pods saw other peers"
        );
    }
}

/// Removing an endpoint from the EndpointSlice stops new connections to it
/// within 1 s, while the other pods keep answering.
#[test]
fn removed_endpoint_gets_no_new_connections_within_1s() {
    let sb = demo_sandbox();
    let addr = format!("{CLUSTER_IP}:80");
    let t0 = now_ms();
    write_manifest(&sb, "endpointslice.yaml", &endpointslice_yaml(&[1, 2]));
    let run = client(
        &sb,
        &[
            "--tcp",
            &addr,
            "--duration-ms",
            "2500",
            "--interval-ms",
            "5",
        ],
    );
    assert!(
        run.all_ok(),
        "connections failed while an endpoint was removed:\n{}",
        run.raw
    );
    let last_pod3 = run
        .attempts
        .iter()
        .filter(|a| a.name() == Some("pod3"))
        .map(|a| a.start_ms() as i128 - t0 as i128)
        .max();
    eprintln!(
        "{} connections; last one to pod3 started at {last_pod3:?} ms after the write",
        run.attempts.len()
    );
    let late: Vec<&Attempt> = run
        .attempts
        .iter()
        .filter(|a| a.start_ms() >= t0 + 1000)
        .collect();
    assert!(
        late.len() >= 60,
        "only {} connections after 1 s:\n{}",
        late.len(),
        run.raw
    );
    let late_names: BTreeSet<&str> = late.iter().filter_map(|a| a.name()).collect();
    assert!(
        !late_names.contains("pod3"),
        "pod3 still got new connections more than 1 s after its removal:\n{}",
        run.raw
    );
    assert_eq!(
        late_names,
        BTreeSet::from(["pod1", "pod2"]),
        "the remaining pods should both answer"
    );
    let services = sb.services(&switchboard()).unwrap();
    let http = find(&services, "demo/echo:http").expect("demo/echo:http");
    assert_eq!(
        http.backend_addrs(),
        vec!["10.244.1.2:8080", "10.244.2.2:8080"]
    );
}

/// Deleting the Service file stops forwarding within ~1 s.
#[test]
fn deleted_service_stops_forwarding() {
    let mut sb = demo_sandbox();
    let addr = format!("{CLUSTER_IP}:80");
    let before = client(&sb, &["--tcp", &addr, "--count", "3"]);
    assert!(before.all_ok(), "{}", before.raw);

    let t0 = now_ms();
    fs::remove_file(sb.manifest_dir().join("service.yaml")).unwrap();
    let run = client(
        &sb,
        &[
            "--tcp",
            &addr,
            "--duration-ms",
            "2000",
            "--interval-ms",
            "20",
            "--timeout-ms",
            "200",
        ],
    );
    let late: Vec<&Attempt> = run
        .attempts
        .iter()
        .filter(|a| a.start_ms() >= t0 + 1000)
        .collect();
    let last_ok = run
        .attempts
        .iter()
        .filter(|a| a.name().is_some())
        .map(|a| a.start_ms() as i128 - t0 as i128)
        .max();
    eprintln!(
        "{} attempts; last answered one started at {last_ok:?} ms after the delete",
        run.attempts.len()
    );
    assert!(late.len() >= 3, "too few attempts after 1 s:\n{}", run.raw);
    assert!(
        late.iter().all(|a| matches!(a, Attempt::Err { .. })),
        "connections to {addr} still answered more than 1 s after the Service was deleted:\n{}",
        run.raw
    );
    let udp = client(
        &sb,
        &[
            "--udp",
            &format!("{CLUSTER_IP}:53"),
            "--count",
            "3",
            "--timeout-ms",
            "300",
        ],
    );
    assert_eq!(udp.failures(), 3, "UDP still answered:\n{}", udp.raw);
    sb.wait_services(
        &switchboard(),
        Duration::from_secs(2),
        "no demo/echo frontends",
        |f| !f.iter().any(|fe| fe.service.starts_with("demo/echo:")),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// A long-lived TCP connection (a line every 100 ms) gets every reply while
/// another Service is added.
#[test]
fn long_lived_connection_survives_unrelated_change() {
    let mut sb = demo_sandbox();
    let sw = switchboard();
    let hold = sb
        .client_spawn(
            &sb_echo(),
            &["--tcp", &format!("{CLUSTER_IP}:80"), "--hold", "3"],
        )
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    write_manifest(
        &sb,
        "other.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: other\n  namespace: demo\n\
         spec:\n  clusterIP: 10.96.0.11\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n\
         ---\n\
         apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
         metadata:\n  name: other-x1\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: other\n\
         endpoints:\n- addresses:\n  - 10.244.1.2\n  conditions:\n    ready: true\n\
         ports:\n- name: http\n  port: 8080\n  protocol: TCP\n",
    );
    let result = sb.wait_services(&sw, Duration::from_secs(2), "demo/other:http", |f| {
        find(f, "demo/other:http").is_some_and(|fe| fe.backends.len() == 1)
    });
    let out = hold.wait_with_output().unwrap();
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    if let Err(e) = result {
        panic!("{e:#}");
    }
    assert!(
        out.status.success(),
        "the long-lived connection lost replies: {raw}"
    );
    let replies: u32 = raw
        .split_whitespace()
        .find_map(|w| w.strip_prefix("replies="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(replies >= 20, "only {replies} replies in 3 s: {raw}");
    // The new Service works too.
    let run = client(&sb, &["--tcp", "10.96.0.11:80", "--count", "3"]);
    assert!(run.all_ok(), "{}", run.raw);
    assert_eq!(run.names(), vec!["pod1"; 3]);
}

/// `switchboard services -o json` matches the manifests, also after the agent
/// has stopped (it reads the pinned maps).
#[test]
fn services_json_matches_manifests() {
    let mut sb = demo_sandbox();
    let sw = switchboard();
    let check = |frontends: &[Frontend]| {
        let mut names: Vec<&str> = frontends.iter().map(|f| f.service.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            vec!["demo/echo:dns", "demo/echo:http"],
            "{frontends:#?}"
        );
        let http = find(frontends, "demo/echo:http").unwrap();
        assert_eq!(
            (http.address.as_str(), http.port, http.protocol.as_str()),
            (CLUSTER_IP, 80, "TCP")
        );
        assert_eq!(
            http.backend_addrs(),
            (1..=PODS)
                .map(|i| format!("{}:{POD_TCP_PORT}", pod_ip(i)))
                .collect::<Vec<_>>()
        );
        let dns = find(frontends, "demo/echo:dns").unwrap();
        assert_eq!(
            (dns.address.as_str(), dns.port, dns.protocol.as_str()),
            (CLUSTER_IP, 53, "UDP")
        );
        assert_eq!(
            dns.backend_addrs(),
            (1..=PODS)
                .map(|i| format!("{}:{POD_UDP_PORT}", pod_ip(i)))
                .collect::<Vec<_>>()
        );
    };
    check(&sb.services(&sw).unwrap());

    let table = sb.services_raw(&sw, false).unwrap();
    for needle in ["demo/echo:http", "demo/echo:dns", CLUSTER_IP, "10.244.3.2"] {
        assert!(table.contains(needle), "table lacks {needle}:\n{table}");
    }

    sb.stop_agent().expect("stop agent");
    check(
        &sb.services(&sw)
            .expect("`services` should read the pinned maps with the agent stopped"),
    );
}

/// The tc programs attach as pinned TCX links by default; a restarted agent
/// takes the links over, `--tc-attach netlink` replaces them with clsact
/// filters (and drops the links), and going back to TCX removes the filters:
/// at every step each pod interface carries exactly one copy of the programs
/// and the ClusterIP answers with the Service as the peer.
#[test]
fn tc_attach_modes_replace_each_other_across_restarts() {
    let mut sb = demo_sandbox();
    let sw = switchboard();
    let links = sb.pin_dir.join("links");
    let tcx_pins = || -> usize {
        fs::read_dir(&links)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("tcx_"))
                    .count()
            })
            .unwrap_or(0)
    };
    let netlink_filters = |sb: &Sandbox| -> usize {
        let out = sb
            .exec(
                &sb.node_ns(),
                &["tc", "filter", "show", "dev", &sb.pod_if(1), "ingress"],
            )
            .expect("tc filter show");
        // One line per filter, which names the program (twice).
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|line| line.contains("sb_from_pod"))
            .count()
    };
    let answers = |sb: &Sandbox, step: &str| {
        let run = client(sb, &["--tcp", &format!("{CLUSTER_IP}:80"), "--count", "6"]);
        assert!(run.all_ok(), "{step}: {}", run.raw);
        assert_eq!(run.client_saw(), vec![format!("{CLUSTER_IP}:80")], "{step}");
    };
    // Client and three pods, two programs each.
    let interfaces = PODS + 1;
    assert_eq!(tcx_pins(), 2 * interfaces, "default attach is TCX");
    assert_eq!(netlink_filters(&sb), 0);
    answers(&sb, "tcx");

    sb.stop_agent().expect("stop agent");
    answers(&sb, "agent stopped: the pinned links keep forwarding");
    sb.start_agent_with(&sw, &["--tc-attach", "netlink"])
        .expect("restart with netlink");
    wait_until(&sb, "netlink filters replace the TCX links", || {
        tcx_pins() == 0 && netlink_filters(&sb) == 1
    });
    answers(&sb, "netlink");

    sb.stop_agent().expect("stop agent");
    sb.start_agent(&sw).expect("restart with TCX");
    wait_until(&sb, "TCX links replace the netlink filters", || {
        tcx_pins() == 2 * interfaces && netlink_filters(&sb) == 0
    });
    answers(&sb, "tcx again");
}

fn wait_until(sb: &Sandbox, what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 5 s\n{}",
            sb.agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
