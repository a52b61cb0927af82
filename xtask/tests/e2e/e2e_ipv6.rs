//! Netns end-to-end tests of dual-stack Services (root only).
//!
//! The sandbox is dual-stack (every pod, the client and the node have an
//! IPv6 address beside their IPv4 one). A `RequireDualStack` Service with one
//! cluster IP of each family and one EndpointSlice per family is reached over
//! both families, TCP and UDP, from a pod (through tc, and through the socket
//! layer) and from the node's own namespace (the socket layer), and every
//! client sees the Service address as its peer.

use std::collections::BTreeSet;
use std::time::Duration;

use xtask::sandbox::{
    disable_tx_checksum, find_at, node_ip6, pod_ip, pod_ip6, pod_name, Attempt, ClientRun,
    Frontend, Sandbox, CLIENT_IP, CLIENT_IP6, PODS,
};
use xtask::testenv::{
    bpftool_json, pod_saw_ips, require_root, sb_echo, status_line, switchboard, write_manifest,
};

const CLUSTER_IP4: &str = "10.96.0.20";
const CLUSTER_IP6: &str = "fd00:96::20";

/// The Service as the API server stores a dual-stack one.
const SERVICE: &str = "apiVersion: v1
kind: Service
metadata:
  name: dual
  namespace: demo
spec:
  type: ClusterIP
  clusterIP: 10.96.0.20
  clusterIPs:
  - 10.96.0.20
  - fd00:96::20
  ipFamilies:
  - IPv4
  - IPv6
  ipFamilyPolicy: RequireDualStack
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
  - name: dns
    port: 53
    protocol: UDP
    targetPort: 5353
";

/// One EndpointSlice of `dual` with every pod, in `family` (`IPv4`/`IPv6`).
fn slice(family: &str) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: {family}\n\
         metadata:\n  name: dual-{}\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: dual\n\
         endpoints:\n",
        family.to_lowercase()
    );
    for i in 1..=PODS {
        let addr = if family == "IPv6" {
            pod_ip6(i)
        } else {
            pod_ip(i)
        };
        s.push_str(&format!(
            "- addresses:\n  - {addr}\n  conditions:\n    ready: true\n  targetRef:\n    kind: Pod\n    name: {}\n    namespace: demo\n",
            pod_name(i)
        ));
    }
    s.push_str(
        "ports:\n- name: http\n  port: 8080\n  protocol: TCP\n- name: dns\n  port: 5353\n  protocol: UDP\n",
    );
    s
}

/// A sandbox with the pods answering and the agent serving `dual`.
fn dual_stack_sandbox() -> Sandbox {
    require_root();
    let mut sb = Sandbox::for_test().expect("create sandbox");
    write_manifest(&sb, "dual-service.yaml", SERVICE);
    write_manifest(&sb, "dual-slice-v4.yaml", &slice("IPv4"));
    write_manifest(&sb, "dual-slice-v6.yaml", &slice("IPv6"));
    sb.start_pods(&sb_echo()).expect("start pods");
    sb.start_agent(&switchboard()).expect("start agent");
    let programmed = |f: &[Frontend]| {
        [CLUSTER_IP4, CLUSTER_IP6].iter().all(|ip| {
            [(80, "TCP"), (53, "UDP")].iter().all(|(port, proto)| {
                find_at(f, ip, *port, proto).is_some_and(|fe| fe.backends.len() == PODS)
            })
        })
    };
    if let Err(e) = sb.wait_services(
        &switchboard(),
        Duration::from_secs(10),
        "demo/dual on both families with 3 backends",
        programmed,
    ) {
        panic!("{e:#}\nagent log:\n{}", sb.agent_log());
    }
    sb
}

fn all_pods() -> BTreeSet<String> {
    (1..=PODS).map(pod_name).collect()
}

/// Each frontend family has only its own family's pods as backends.
#[test]
fn a_dual_stack_service_gets_one_frontend_per_family_with_that_familys_pods() {
    let mut sb = dual_stack_sandbox();
    let frontends = sb.services(&switchboard()).expect("services");
    for (ip, pods) in [
        (
            CLUSTER_IP4,
            (1..=PODS)
                .map(|i| format!("{}:8080", pod_ip(i)))
                .collect::<Vec<_>>(),
        ),
        (
            CLUSTER_IP6,
            (1..=PODS).map(|i| format!("{}:8080", pod_ip6(i))).collect(),
        ),
    ] {
        let fe = find_at(&frontends, ip, 80, "TCP").expect("frontend");
        assert_eq!(fe.backend_addrs(), pods, "{ip}: {fe:#?}");
    }
    sb.cleanup().expect("cleanup");
}

/// Both families, TCP and UDP, from a pod outside the socket layer's cgroup
/// (the tc programs translate), from a pod inside it and from the node's own
/// namespace (the socket layer balances): every request is answered, the
/// requests spread over every pod, and the client's peer is the Service
/// address of the family it used.
#[test]
fn a_dual_stack_service_answers_over_both_families_from_pods_and_the_host() {
    let mut sb = dual_stack_sandbox();
    let echo = sb_echo();
    let cases = [
        (
            "IPv4",
            format!("{CLUSTER_IP4}:80"),
            format!("{CLUSTER_IP4}:53"),
        ),
        (
            "IPv6",
            format!("[{CLUSTER_IP6}]:80"),
            format!("[{CLUSTER_IP6}]:53"),
        ),
    ];
    for (family, http, dns) in &cases {
        for (proto, addr) in [("--tcp", http), ("--udp", dns)] {
            for who in ["pod (tc)", "pod (socket layer)", "host"] {
                let args = [
                    proto,
                    addr.as_str(),
                    "--count",
                    "30",
                    "--timeout-ms",
                    "1000",
                ];
                let run = match who {
                    "pod (tc)" => sb.client(&echo, &args),
                    "pod (socket layer)" => sb.client_in_cgroup(&echo, &sb.client_ns(), &args),
                    _ => sb.client_in_cgroup(&echo, &sb.node_ns(), &args),
                }
                .unwrap_or_else(|e| panic!("{family} {proto} from {who}: {e:#}"));
                let what = format!("{family} {proto} from {who}");
                assert!(
                    run.all_ok(),
                    "{what}: {}\nagent log:\n{}",
                    run.raw,
                    sb.agent_log()
                );
                let reached: BTreeSet<String> = run.names().into_iter().collect();
                assert_eq!(reached, all_pods(), "{what} spread: {}", run.raw);
                assert_eq!(
                    run.client_saw(),
                    vec![addr.clone()],
                    "{what}: peer is the Service"
                );
                let saw = pod_saw_ips(&run);
                let expected: BTreeSet<String> = match (who, *family) {
                    ("host", "IPv4") => (1..=PODS).map(|i| format!("10.244.{i}.1")).collect(),
                    ("host", _) => (1..=PODS).map(node_ip6).collect(),
                    (_, "IPv4") => BTreeSet::from([CLIENT_IP.to_string()]),
                    _ => BTreeSet::from([CLIENT_IP6.to_string()]),
                };
                assert!(
                    !saw.is_empty() && saw.is_subset(&expected),
                    "{what}: pods saw the client as {saw:?}, expected within {expected:?}"
                );
            }
        }
    }
    sb.cleanup().expect("cleanup");
}

/// The tc programs update a translated packet's L4 checksum in place, as
/// its `ip_summed` says: a local socket's segment over a veth carries only
/// the pseudo-header sum, which a port change must not touch. Here the
/// node finishes every checksum in software before a pod gets the packet
/// (no checksum offload on the node's ends of the pods' and the client's
/// veths, as a NIC finishes it before the wire), so the receivers check
/// each one: a seed updated wrongly loses connections and datagrams, both
/// ways (the replies are finished on the client's veth), in both families.
#[test]
fn translated_packets_keep_right_checksums_when_the_node_finishes_them() {
    let mut sb = dual_stack_sandbox();
    let (checksums, status) = status_line(&sb.pin_dir, "L4 checksums:");
    assert!(
        checksums.is_some_and(|c| c.contains("in place")),
        "this kernel (6.2+, with BTF) should run the in-place update: status:\n{status}"
    );
    let node = sb.node_ns();
    for ifname in (1..=PODS).map(|i| sb.pod_if(i)).chain([sb.client_if()]) {
        disable_tx_checksum(&node, &ifname).unwrap_or_else(|e| panic!("{e:#}"));
    }
    let echo = sb_echo();
    for ip in [CLUSTER_IP4.to_string(), format!("[{CLUSTER_IP6}]")] {
        for (proto, port) in [("--tcp", 80), ("--udp", 53)] {
            let addr = format!("{ip}:{port}");
            let args = [proto, &addr, "--count", "30", "--timeout-ms", "1000"];
            let run = sb
                .client(&echo, &args)
                .unwrap_or_else(|e| panic!("{proto} {addr}: {e:#}"));
            assert!(run.all_ok(), "{proto} {addr} had failures:\n{}", run.raw);
            let reached: BTreeSet<String> = run.names().into_iter().collect();
            assert_eq!(reached, all_pods(), "{proto} {addr} spread: {}", run.raw);
        }
    }
    sb.cleanup().expect("cleanup");
}

/// An IPv4-only Service (the node's only one at the start).
const SERVICE4: &str = "apiVersion: v1
kind: Service
metadata:
  name: only4
  namespace: demo
spec:
  type: ClusterIP
  clusterIP: 10.96.0.21
  clusterIPs:
  - 10.96.0.21
  ipFamilies:
  - IPv4
  ipFamilyPolicy: SingleStack
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: 8080
";
const CLUSTER_IP_ONLY4: &str = "10.96.0.21";

/// [`slice`]'s IPv4 slice, for `only4`.
fn slice_only4() -> String {
    slice("IPv4")
        .replace("name: dual-ipv4", "name: only4-ipv4")
        .replace("service-name: dual", "service-name: only4")
}

/// The capacity of the map pinned as `map` under `pin_dir`.
fn max_entries(pin_dir: &std::path::Path, map: &str) -> u64 {
    let pin = pin_dir.join(map);
    bpftool_json(&["map", "show", "pinned", &pin.to_string_lossy()])["max_entries"]
        .as_u64()
        .unwrap_or_else(|| panic!("max_entries of {map}"))
}

/// The agent loads the eBPF object while the source reads its first view:
/// the pins and the flags size every map, so a first view with an IPv6
/// Service keeps that load (no second load, no resize), and each IPv6 flow
/// table is sized like its IPv4 twin.
#[test]
fn a_first_view_with_an_ipv6_service_keeps_the_early_load() {
    let mut sb = dual_stack_sandbox();
    let log = sb.agent_log();
    assert!(
        log.contains("the eBPF object was loaded while the source read its first view"),
        "the early load was kept:\n{log}"
    );
    assert!(!log.contains("resizing online"), "no resize:\n{log}");
    let max_entries = |map: &str| max_entries(&sb.pin_dir, map);
    for (v6, v4) in [
        ("SB_CT6_V1", "SB_CT_V5"),
        ("SB_SOCK6_V1", "SB_SOCK_V1"),
        ("SB_AFFINITY6_V1", "SB_AFFINITY_V1"),
        ("SB_FRAG6_V1", "SB_FRAG_V1"),
    ] {
        assert_eq!(max_entries(v6), max_entries(v4), "{v6} sized like {v4}");
    }
    let run = sb
        .client(
            &sb_echo(),
            &["--tcp", &format!("[{CLUSTER_IP6}]:80"), "--count", "9"],
        )
        .expect("client");
    assert!(run.all_ok(), "the Service answers over IPv6:\n{}", run.raw);
    sb.cleanup().expect("cleanup");
}

/// A node that starts with no IPv6 Service holds little for IPv6: its
/// IPv6 conntrack table is allocated per entry (its buckets only while
/// empty), its IPv6 LRU flow tables start small like their IPv4 twins.
/// When the first IPv6 Service appears it is served by the tables as they
/// are, at once: no restart, no resize, and IPv4 traffic flows throughout
/// without a single failed connection.
#[test]
fn the_first_ipv6_service_is_served_by_the_tables_as_they_are() {
    require_root();
    let mut sb = Sandbox::for_test().expect("create sandbox");
    write_manifest(&sb, "only4-service.yaml", SERVICE4);
    write_manifest(&sb, "only4-slice.yaml", &slice_only4());
    sb.start_pods(&sb_echo()).expect("start pods");
    sb.start_agent(&switchboard()).expect("start agent");
    sb.wait_services(
        &switchboard(),
        Duration::from_secs(10),
        "demo/only4 with every pod",
        |f: &[Frontend]| {
            find_at(f, CLUSTER_IP_ONLY4, 80, "TCP").is_some_and(|fe| fe.backends.len() == PODS)
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\nagent log:\n{}", sb.agent_log()));
    let pid = sb.agent_pid().expect("the agent runs");
    let pin_dir = sb.pin_dir.clone();
    let max_entries = |map: &str| max_entries(&pin_dir, map);
    let ct4 = max_entries("SB_CT_V5");
    assert_eq!(max_entries("SB_CT6_V1"), ct4, "sized like its IPv4 twin");
    let ct6_bytes = bpftool_json(&[
        "map",
        "show",
        "pinned",
        &pin_dir.join("SB_CT6_V1").to_string_lossy(),
    ])["bytes_memlock"]
        .as_u64()
        .expect("bytes_memlock");
    assert!(
        ct6_bytes < 20 * ct4,
        "the empty IPv6 conntrack table holds its buckets only: {ct6_bytes} bytes"
    );
    for (v6, v4) in [
        ("SB_SOCK6_V1", "SB_SOCK_V1"),
        ("SB_AFFINITY6_V1", "SB_AFFINITY_V1"),
        ("SB_FRAG6_V1", "SB_FRAG_V1"),
    ] {
        let size = max_entries(v6);
        assert_eq!(size, max_entries(v4), "{v6} sized like {v4}");
        assert!(size * 16 <= ct4, "{v6} starts small: {size}");
    }

    // IPv4 traffic throughout: a new connection every 10 ms.
    let run_ms = 12_000;
    let v4 = sb
        .client_spawn(
            &sb_echo(),
            &[
                "--tcp",
                &format!("{CLUSTER_IP_ONLY4}:80"),
                "--duration-ms",
                &run_ms.to_string(),
                "--interval-ms",
                "10",
                "--timeout-ms",
                "2000",
            ],
        )
        .expect("start the IPv4 client");
    std::thread::sleep(Duration::from_millis(1000));

    // The first IPv6 Service.
    write_manifest(&sb, "dual-service.yaml", SERVICE);
    write_manifest(&sb, "dual-slice-v4.yaml", &slice("IPv4"));
    write_manifest(&sb, "dual-slice-v6.yaml", &slice("IPv6"));
    let programmed = |f: &[Frontend]| {
        find_at(f, CLUSTER_IP6, 80, "TCP").is_some_and(|fe| fe.backends.len() == PODS)
    };
    sb.wait_services(
        &switchboard(),
        Duration::from_secs(10),
        "demo/dual over IPv6",
        programmed,
    )
    .unwrap_or_else(|e| panic!("{e:#}\nagent log:\n{}", sb.agent_log()));
    let v6 = sb
        .client(
            &sb_echo(),
            &[
                "--tcp",
                &format!("[{CLUSTER_IP6}]:80"),
                "--count",
                "20",
                "--timeout-ms",
                "1000",
            ],
        )
        .expect("IPv6 client");
    assert!(v6.all_ok(), "the IPv6 Service answers: {}", v6.raw);

    let out = v4.wait_with_output().expect("the IPv4 client");
    let run = ClientRun::parse(&String::from_utf8_lossy(&out.stdout)).expect("client output");
    let failed: Vec<_> = run
        .attempts
        .iter()
        .filter(|a| matches!(a, Attempt::Err { .. }))
        .collect();
    assert!(
        run.attempts.len() > 200,
        "the IPv4 client ran throughout: {} attempts",
        run.attempts.len()
    );
    assert!(
        failed.is_empty(),
        "IPv4 connections failed when the IPv6 Service came: {failed:?}\nagent log:\n{}",
        sb.agent_log()
    );
    assert_eq!(sb.agent_pid(), Some(pid), "the same agent");
    let log = sb.agent_log();
    assert_eq!(
        log.matches(xtask::sandbox::AGENT_READY).count(),
        1,
        "no restart:\n{log}"
    );
    assert!(!log.contains("resizing online"), "no resize:\n{log}");
    sb.cleanup().expect("cleanup");
}
