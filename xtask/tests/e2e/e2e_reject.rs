//! Netns end-to-end tests of two kube-proxy behaviours (root only), each in
//! its own one-node sandbox (`sbt<pid>-<n>`) with `sb-echo` pods and the
//! agent on two Services:
//!
//! - `demo/echo` (ClusterIP 10.96.0.10: TCP 80 → 8080, UDP 53 → 5353) whose
//!   only endpoint is pod1;
//! - `demo/empty` (ClusterIP 10.96.0.20, same ports) without endpoints.
//!
//! Reject: a client of `demo/empty` is refused at once (an ICMP port
//! unreachable from the ClusterIP, or the socket layer's `ECONNREFUSED`):
//! a TCP connect fails with "Connection refused" in well under a second, a
//! connected UDP socket gets `ECONNREFUSED` on its next receive; nobody waits
//! for a timeout.
//!
//! Hairpin: pod1 reaching its own Service (it is the only backend) gets its
//! answers over TCP and UDP, and its server sees the peer 169.254.42.1 (the
//! hairpin address), not itself.
//!
//! The binaries come from `cargo xtask test` (SWITCHBOARD_BIN, SB_ECHO_BIN).
use std::time::{Duration, Instant};

use xtask::sandbox::{find, pod_ip, pod_name, Attempt, ClientRun, Sandbox, CLUSTER_IP, PODS};
use xtask::testenv::{require_root, sb_echo, switchboard, write_manifest};

const EMPTY_IP: &str = "10.96.0.20";
const HAIRPIN: &str = "169.254.42.1";
/// "At once": an ICMP error round trip inside one machine takes
/// microseconds; a dropped SYN would take the whole client timeout (3 s).
const AT_ONCE: Duration = Duration::from_millis(500);

fn service(name: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: demo\n\
         spec:\n  clusterIP: {ip}\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n\
         \x20 - name: dns\n    port: 53\n    protocol: UDP\n    targetPort: 5353\n"
    )
}

fn slice(name: &str, pods: &[usize]) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
         metadata:\n  name: {name}-abc12\n  namespace: demo\n  labels:\n    kubernetes.io/service-name: {name}\n\
         ports:\n- name: http\n  port: 8080\n  protocol: TCP\n- name: dns\n  port: 5353\n  protocol: UDP\n"
    );
    if pods.is_empty() {
        s.push_str("endpoints: []\n");
    } else {
        s.push_str("endpoints:\n");
    }
    for &i in pods {
        s.push_str(&format!(
            "- addresses:\n  - {}\n  conditions:\n    ready: true\n  targetRef:\n    kind: Pod\n    name: {}\n    namespace: demo\n",
            pod_ip(i),
            pod_name(i)
        ));
    }
    s
}

/// Sandbox, pods, both Services and the agent (with `agent_args`), programmed.
fn sandbox(agent_args: &[&str]) -> Sandbox {
    require_root();
    let (sw, echo) = (switchboard(), sb_echo());
    let mut sb = Sandbox::for_test().expect("create sandbox");
    write_manifest(
        &sb,
        "echo.yaml",
        &format!(
            "{}---\n{}",
            service("echo", CLUSTER_IP),
            slice("echo", &[1])
        ),
    );
    write_manifest(
        &sb,
        "empty.yaml",
        &format!("{}---\n{}", service("empty", EMPTY_IP), slice("empty", &[])),
    );
    sb.start_pods(&echo).expect("start pods");
    sb.start_agent_with(&sw, agent_args).expect("start agent");
    if let Err(e) = sb.wait_services(
        &sw,
        Duration::from_secs(10),
        "demo/echo (pod1) and demo/empty (no endpoints) on both ports",
        |f| {
            ["demo/echo:http", "demo/echo:dns"]
                .iter()
                .all(|s| find(f, s).is_some_and(|fe| fe.backends.len() == 1))
                && ["demo/empty:http", "demo/empty:dns"]
                    .iter()
                    .all(|s| find(f, s).is_some_and(|fe| fe.backends.is_empty()))
        },
    ) {
        panic!("{e:#}");
    }
    // The maps are filled before the programs are attached to the veths:
    // wait for every attachment, or a first packet may pass untranslated.
    let mut ifaces = vec![sb.client_if()];
    ifaces.extend((1..=PODS).map(|i| sb.pod_if(i)));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ifaces.iter().all(|i| {
        sb.agent_log()
            .contains(&format!("programs attached iface={i} "))
    }) {
        assert!(
            Instant::now() < deadline,
            "programs not attached to {ifaces:?}:\n{}",
            sb.agent_log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    sb
}

fn parse(sb: &Sandbox, out: std::process::Output, what: &str) -> ClientRun {
    let raw = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.code() == Some(2) || out.status.code().is_none() {
        panic!(
            "{what}: sb-echo client failed: {} {}\n--- agent log ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            sb.agent_log()
        );
    }
    ClientRun::parse(&raw).unwrap_or_else(|e| panic!("{what}: {e:#}"))
}

/// `sb-echo client <args>` in namespace `ns` (outside the sandbox's cgroup:
/// the tc layer serves it), timed.
fn client_in(sb: &Sandbox, ns: &str, args: &[&str], what: &str) -> (ClientRun, Duration) {
    let bin = sb_echo().to_string_lossy().into_owned();
    let mut cmd = vec![bin.as_str(), "client"];
    cmd.extend_from_slice(args);
    let began = Instant::now();
    let out = sb
        .exec_status(ns, &cmd)
        .unwrap_or_else(|e| panic!("{what}: {e:#}"));
    (parse(sb, out, what), began.elapsed())
}

/// `switchboard stats` counter `name`.
fn counter(sb: &Sandbox, name: &str) -> u64 {
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb
        .exec(&sb.node_ns(), &[&bin, "stats", "--pin-root", &pin])
        .expect("switchboard stats");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some(name)).then(|| words.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no counter {name} in:\n{text}"))
}

/// Every attempt failed with "Connection refused", and the whole run (with
/// `attempts` attempts) took less than `AT_ONCE` per attempt; `agent_log`
/// tells what the agent said when not.
pub(crate) fn assert_refused(
    run: &ClientRun,
    took: Duration,
    attempts: u32,
    what: &str,
    agent_log: impl Fn() -> String,
) {
    assert_eq!(run.attempts.len(), attempts as usize, "{what}: {}", run.raw);
    for a in &run.attempts {
        match a {
            Attempt::Err { message, .. } if message.contains("Connection refused") => {}
            other => panic!(
                "{what}: want \"Connection refused\", got {other:?}\n{}\n--- agent log ---\n{}",
                run.raw,
                agent_log()
            ),
        }
    }
    assert!(
        took < AT_ONCE * attempts,
        "{what}: {attempts} refused attempts took {took:?} (a timeout, not a reject?)\n{}",
        run.raw
    );
    eprintln!("{what}: {attempts} attempts refused in {took:?}");
}

fn empty_tcp() -> String {
    format!("{EMPTY_IP}:80")
}

fn empty_udp() -> String {
    format!("{EMPTY_IP}:53")
}

/// The tc path (socket layer off): clients in the client namespace and in a
/// pod are refused at once over TCP and connected UDP, by an ICMP port
/// unreachable the data path sends back through their own veth.
#[test]
fn a_service_without_endpoints_refuses_at_once_on_the_tc_path() {
    let mut sb = sandbox(&["--socket-lb=false"]);
    let before = counter(&sb, "rejected");
    let tcp = empty_tcp();
    let udp = empty_udp();
    for ns in [sb.client_ns(), sb.pod_ns(2)] {
        let (run, took) = client_in(
            &sb,
            &ns,
            &["--tcp", &tcp, "--count", "3", "--timeout-ms", "3000"],
            "TCP connect",
        );
        assert_refused(
            &run,
            took,
            3,
            &format!("{ns}: TCP connect to {tcp}"),
            || sb.agent_log(),
        );
        // One connected socket: the first send provokes the ICMP error, the
        // next receive reports it (then sb-echo opens a new socket).
        let (run, took) = client_in(
            &sb,
            &ns,
            &[
                "--udp",
                &udp,
                "--udp-mode",
                "connected",
                "--count",
                "3",
                "--timeout-ms",
                "3000",
            ],
            "UDP",
        );
        assert_refused(
            &run,
            took,
            3,
            &format!("{ns}: connected UDP to {udp}"),
            || sb.agent_log(),
        );
    }
    let rejected = counter(&sb, "rejected") - before;
    assert!(rejected >= 12, "rejected rose by {rejected}, want ≥ 12");
    sb.cleanup().expect("cleanup");
}

/// With the socket layer on: a host client in the sandbox's cgroup is
/// refused by the socket layer at connect; a client outside it (the client
/// namespace), in the same run, by the tc layer's ICMP. Both at once.
#[test]
fn a_service_without_endpoints_refuses_at_once_with_the_socket_layer_on() {
    let mut sb = sandbox(&[]);
    let echo = sb_echo();
    let tcp = empty_tcp();
    let udp = empty_udp();
    let tcp_args = [
        "--tcp",
        tcp.as_str(),
        "--count",
        "3",
        "--timeout-ms",
        "3000",
    ];
    let udp_args = [
        "--udp",
        udp.as_str(),
        "--udp-mode",
        "connected",
        "--count",
        "3",
        "--timeout-ms",
        "3000",
    ];
    for (args, what) in [
        (&tcp_args[..], "TCP connect"),
        (&udp_args[..], "connected UDP"),
    ] {
        let sock_before = counter(&sb, "sock_no_backend");
        let began = Instant::now();
        // A host client: the socket layer balances its TCP and connected UDP
        // sockets at connect.
        let run = sb
            .client_in_cgroup(&echo, &sb.node_ns(), args)
            .unwrap_or_else(|e| panic!("{e:#}"));
        assert_refused(
            &run,
            began.elapsed(),
            3,
            &format!("{what} in the cgroup"),
            || sb.agent_log(),
        );
        assert!(
            counter(&sb, "sock_no_backend") > sock_before,
            "{what}: the socket layer refused"
        );

        let rejected_before = counter(&sb, "rejected");
        let (run, took) = client_in(&sb, &sb.client_ns(), args, what);
        assert_refused(&run, took, 3, &format!("{what} outside the cgroup"), || {
            sb.agent_log()
        });
        assert!(
            counter(&sb, "rejected") > rejected_before,
            "{what}: tc rejected"
        );
    }
    sb.cleanup().expect("cleanup");
}

/// pod1 reaches its own Service (pod1 is the only backend) over TCP and UDP;
/// its server sees the hairpin address as the peer, the client the
/// ClusterIP.
#[test]
fn a_pod_reaches_itself_through_its_service_via_the_hairpin_address() {
    let mut sb = sandbox(&["--socket-lb=false"]);
    let pod1 = sb.pod_ns(1);
    for (addr, extra) in [
        (format!("{CLUSTER_IP}:80"), vec![]),
        (format!("{CLUSTER_IP}:53"), vec![]),
        (format!("{CLUSTER_IP}:53"), vec!["--udp-mode", "connected"]),
    ] {
        let flag = if addr.ends_with(":80") {
            "--tcp"
        } else {
            "--udp"
        };
        let mut args = vec![flag, addr.as_str(), "--count", "5", "--timeout-ms", "2000"];
        args.extend(extra.iter().copied());
        let what = format!("pod1 → {addr} {extra:?}");
        let (run, _) = client_in(&sb, &pod1, &args, &what);
        assert_eq!(run.attempts.len(), 5, "{what}: {}", run.raw);
        for a in &run.attempts {
            match a {
                Attempt::Ok {
                    name,
                    pod_saw,
                    client_saw,
                    ..
                } => {
                    assert_eq!(name, "pod1", "{what}: {}", run.raw);
                    assert_eq!(
                        pod_saw.split(':').next(),
                        Some(HAIRPIN),
                        "{what}: the server must see the hairpin address: {}",
                        run.raw
                    );
                    assert_eq!(client_saw, &addr, "{what}: {}", run.raw);
                }
                Attempt::Err { .. } => panic!(
                    "{what}: failed:\n{}\n--- agent log ---\n{}",
                    run.raw,
                    sb.agent_log()
                ),
            }
        }
    }
    // Another pod of the same Service still sees pod1 with its own address.
    let (run, _) = client_in(
        &sb,
        &sb.pod_ns(2),
        &["--tcp", &format!("{CLUSTER_IP}:80"), "--count", "2"],
        "pod2 → the Service",
    );
    assert!(
        run.attempts.iter().all(|a| matches!(
            a,
            Attempt::Ok { pod_saw, .. } if pod_saw.starts_with(&format!("{}:", pod_ip(2)))
        )),
        "{}",
        run.raw
    );
    sb.cleanup().expect("cleanup");
}
