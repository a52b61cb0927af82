//! Netns end-to-end tests of the socket layer (root only).
//!
//! The agent attaches its cgroup hooks to a cgroup the sandbox created (never
//! the host's root cgroup); clients that should be balanced at the socket
//! join it before entering a namespace. A "host client" runs in the node's
//! namespace (like a node process or a hostNetwork pod): nothing but the
//! socket layer can balance it. A "pod client" runs in the client namespace,
//! whose veth also carries the tc programs, so both layers see its flows.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::time::{Duration, Instant};

use serde_json::Value;
use xtask::sandbox::{pod_name, Attempt, ClientRun, Sandbox, CLIENT_IP, PODS};
use xtask::testenv::{
    counters, demo_sandbox_with, endpointslice_yaml, pod_saw_ips, sb_echo, switchboard,
    wait_agent_log, write_manifest,
};

const HTTP: &str = "10.96.0.10:80";
const DNS: &str = "10.96.0.10:53";

fn in_cgroup(sb: &Sandbox, ns: &str, args: &[&str]) -> ClientRun {
    sb.client_in_cgroup(&sb_echo(), ns, args)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

fn counter(values: &BTreeMap<String, u64>, name: &str) -> u64 {
    *values
        .get(name)
        .unwrap_or_else(|| panic!("counter {name} missing in {values:?}"))
}

fn all_pods() -> BTreeSet<String> {
    (1..=PODS).map(pod_name).collect()
}

/// A host client and a pod client reach the ClusterIP over TCP and UDP through
/// the socket layer, spread over every pod, and see the Service address as
/// their peer (getpeername for TCP, recvmsg's source for UDP). The tc layer
/// does not translate those flows a second time, and still serves a client
/// outside the cgroup.
#[test]
fn host_and_pod_clients_reach_the_cluster_ip_through_the_socket_layer() {
    let sb = demo_sandbox_with(&[]);
    let before = counters(&sb.pin_dir);
    for (who, ns) in [("host", sb.node_ns()), ("pod", sb.client_ns())] {
        for (proto, addr) in [("--tcp", HTTP), ("--udp", DNS)] {
            let run = in_cgroup(&sb, &ns, &[proto, addr, "--count", "30"]);
            assert!(run.all_ok(), "{who} {proto}: {}", run.raw);
            let reached: BTreeSet<String> = run.names().into_iter().collect();
            assert_eq!(reached, all_pods(), "{who} {proto} spread: {}", run.raw);
            assert_eq!(run.client_saw(), vec![addr.to_string()], "{who} {proto}");
            let saw = pod_saw_ips(&run);
            if who == "pod" {
                assert_eq!(saw, BTreeSet::from([CLIENT_IP.to_string()]), "{}", run.raw);
            } else {
                // The node's own address on each pod's link.
                let node_addrs: BTreeSet<String> =
                    (1..=PODS).map(|i| format!("10.244.{i}.1")).collect();
                assert!(saw.is_subset(&node_addrs), "host client seen as {saw:?}");
            }
        }
    }
    let after = counters(&sb.pin_dir);
    let grew = |name: &str| counter(&after, name) - counter(&before, name);
    assert_eq!(
        grew("sock_connect"),
        60,
        "one per TCP connection: {after:?}"
    );
    assert_eq!(grew("sock_sendmsg"), 60, "one per UDP datagram: {after:?}");
    assert!(
        grew("sock_reversed") >= 120,
        "getpeername/recvmsg: {after:?}"
    );
    // A balanced TCP socket keeps its frontend in its own storage (which
    // answered getpeername above): it never had a socket-map entry to
    // remove when it closed, and the UDP sockets were unconnected.
    assert_eq!(grew("sock_released"), 0, "sock_release: {after:?}");
    assert_eq!(
        grew("forwarded"),
        0,
        "tc translated a socket-balanced flow: {after:?}"
    );
    assert_eq!(
        grew("reversed"),
        0,
        "tc reversed a socket-balanced flow: {after:?}"
    );

    // Outside the cgroup, the same pod namespace is served by tc.
    let run = sb
        .client(&sb_echo(), &["--tcp", HTTP, "--count", "10"])
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(run.all_ok(), "{}", run.raw);
    assert_eq!(run.client_saw(), vec![HTTP.to_string()]);
    let tc = counters(&sb.pin_dir);
    assert!(
        counter(&tc, "forwarded") > counter(&after, "forwarded"),
        "{tc:?}"
    );
    assert_eq!(
        counter(&tc, "sock_connect"),
        counter(&after, "sock_connect")
    );
}

/// Unconnected UDP: every datagram of one socket goes to the same backend.
/// `sessionAffinity: ClientIP`: every new connection of one client (its
/// network namespace) goes to the same backend.
#[test]
fn socket_layer_keeps_a_udp_socket_on_one_backend_and_honours_affinity() {
    let sb = demo_sandbox_with(&[]);
    let node = sb.node_ns();
    let shared = in_cgroup(
        &sb,
        &node,
        &["--udp", DNS, "--count", "20", "--udp-mode", "shared"],
    );
    assert!(shared.all_ok(), "{}", shared.raw);
    assert_eq!(
        shared.spread().len(),
        1,
        "one socket, one backend: {}",
        shared.raw
    );
    assert_eq!(shared.client_saw(), vec![DNS.to_string()]);

    // Without affinity, new connections spread.
    let spread = in_cgroup(&sb, &node, &["--tcp", HTTP, "--count", "30"]);
    assert_eq!(spread.spread().len(), PODS, "{}", spread.raw);

    let service = fs::read_to_string(sb.manifest_dir().join("service.yaml")).unwrap();
    let with_affinity = service.replace(
        "sessionAffinity: None",
        "sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: 60",
    );
    assert_ne!(
        service, with_affinity,
        "the demo Service names its affinity"
    );
    write_manifest(&sb, "service.yaml", &with_affinity);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = sb.services_raw(&switchboard(), true).unwrap();
        if text.contains("\"affinity_timeout_s\": 60") {
            break;
        }
        assert!(Instant::now() < deadline, "affinity not programmed: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    for (who, ns) in [("host", sb.node_ns()), ("pod", sb.client_ns())] {
        let run = in_cgroup(&sb, &ns, &["--tcp", HTTP, "--count", "20"]);
        assert!(run.all_ok(), "{}", run.raw);
        assert_eq!(run.spread().len(), 1, "{who}: affinity broken: {}", run.raw);
    }
}

/// A connected UDP socket (a resolver's) of the node and of a pod is
/// balanced at `connect()`; when its backend is deleted, the agent closes it
/// (the pod's in the pod's namespace), and the client's next socket reaches
/// a live backend within a second.
#[test]
fn connected_udp_clients_of_the_node_and_of_pods_move_to_a_live_backend_within_a_second() {
    let sb = demo_sandbox_with(&[]);
    let closed_line = "closed connected UDP sockets whose backend left";
    for (round, (who, ns)) in [("host", sb.node_ns()), ("pod", sb.client_ns())]
        .into_iter()
        .enumerate()
    {
        // The first pod alone: the client's socket is connected to it.
        write_manifest(&sb, "endpointslice.yaml", &endpointslice_yaml(&[1]));
        wait_only_on(&sb, 1);
        let child = sb
            .client_in_cgroup_spawn(
                &sb_echo(),
                &ns,
                &[
                    "--udp",
                    DNS,
                    "--udp-mode",
                    "connected",
                    "--duration-ms",
                    "3000",
                    "--interval-ms",
                    "20",
                    "--timeout-ms",
                    "200",
                ],
            )
            .expect("start the connected UDP client");
        std::thread::sleep(Duration::from_millis(700));
        // Its backend leaves; the second pod is the live one.
        let removed_at = now_ms();
        write_manifest(&sb, "endpointslice.yaml", &endpointslice_yaml(&[2]));
        let out = child.wait_with_output().expect("client output");
        let run = ClientRun::parse(&String::from_utf8_lossy(&out.stdout)).unwrap();
        let before: Vec<&Attempt> = run
            .attempts
            .iter()
            .filter(|a| a.start_ms() < removed_at)
            .collect();
        assert!(!before.is_empty(), "{who}: {}", run.raw);
        assert!(
            before
                .iter()
                .all(|a| a.name() == Some(pod_name(1).as_str())),
            "{who}: failures or another backend before the change: {}",
            run.raw
        );
        // After a second, every attempt is answered by the live pod.
        let late: Vec<&Attempt> = run
            .attempts
            .iter()
            .filter(|a| a.start_ms() > removed_at + 1000)
            .collect();
        assert!(!late.is_empty(), "{who}: {}", run.raw);
        assert!(
            late.iter().all(|a| a.name() == Some(pod_name(2).as_str())),
            "{who}: still not on the live backend 1 s after the change: {}",
            run.raw
        );
        // The socket layer balanced it and the agent closed it (the tc
        // layer would have moved the pod's datagrams without a close).
        let closes = sb.agent_log().matches(closed_line).count();
        assert!(
            closes > round,
            "{who}: the agent closed {closes} time(s) in {} rounds:\n{}",
            round + 1,
            sb.agent_log()
        );
    }
}

/// Waits until new connections reach only pod `pod` (its slice programmed).
fn wait_only_on(sb: &Sandbox, pod: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let run = in_cgroup(sb, &sb.node_ns(), &["--tcp", HTTP, "--count", "6"]);
        if run.all_ok() && run.names().iter().all(|n| *n == pod_name(pod)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not only on pod {pod}: {}",
            run.raw
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `--socket-lb=false`: nothing balances a host client, and an earlier agent's
/// socket layer is detached.
#[test]
fn socket_lb_false_detaches_the_socket_layer() {
    let mut sb = demo_sandbox_with(&[]);
    let node = sb.node_ns();
    let run = in_cgroup(&sb, &node, &["--tcp", HTTP, "--count", "3"]);
    assert!(run.all_ok(), "{}", run.raw);
    sb.stop_agent().expect("stop agent");
    // The pinned links outlive the agent: host clients are still balanced.
    let run = in_cgroup(&sb, &node, &["--tcp", HTTP, "--count", "3"]);
    assert!(run.all_ok(), "after the agent stopped: {}", run.raw);
    sb.start_agent_with(&switchboard(), &["--socket-lb=false"])
        .expect("restart agent");
    let deadline = Instant::now() + Duration::from_secs(5);
    while sb.pin_dir.join("links").join("sb_sock_connect4").exists() {
        assert!(
            Instant::now() < deadline,
            "links still pinned: {}",
            sb.agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let run = in_cgroup(
        &sb,
        &node,
        &["--tcp", HTTP, "--count", "1", "--timeout-ms", "300"],
    );
    assert_eq!(
        run.failures(),
        1,
        "a host client was balanced with the socket layer off: {}",
        run.raw
    );
}

/// The attach types of switchboard's programs on the sandbox's cgroup
/// (`bpftool -j cgroup show`).
fn attached_hooks(sb: &Sandbox) -> Vec<String> {
    let cgroup = sb
        .cgroup()
        .expect("a test cgroup")
        .bound
        .to_string_lossy()
        .into_owned();
    let out = sb
        .exec(&sb.node_ns(), &["bpftool", "-j", "cgroup", "show", &cgroup])
        .expect("bpftool cgroup show");
    let progs: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Array(Vec::new()));
    let mut hooks: Vec<String> = progs
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.starts_with("sb_sock")))
        .filter_map(|p| p["attach_type"].as_str().map(str::to_string))
        .collect();
    hooks.sort();
    hooks
}

/// The agent attaches the socket hooks of both families (and sock_release)
/// to its cgroup, `switchboard status` names them, a restarted agent
/// replaces them (one program per hook), and `--socket-lb=false` detaches
/// every one of them.
#[test]
fn both_families_socket_hooks_are_attached_listed_and_detached() {
    let mut sb = demo_sandbox_with(&[]);
    let hooks = attached_hooks(&sb);
    // bpftool names attach types either briefly (`connect6`) or as libbpf
    // does (`cgroup_inet6_connect`).
    for (short, long) in [
        ("connect4", "cgroup_inet4_connect"),
        ("connect6", "cgroup_inet6_connect"),
        ("sendmsg4", "cgroup_udp4_sendmsg"),
        ("sendmsg6", "cgroup_udp6_sendmsg"),
        ("recvmsg4", "cgroup_udp4_recvmsg"),
        ("recvmsg6", "cgroup_udp6_recvmsg"),
        ("getpeername4", "cgroup_inet4_getpeername"),
        ("getpeername6", "cgroup_inet6_getpeername"),
        ("sock_release", "cgroup_inet_sock_release"),
    ] {
        assert!(
            hooks.iter().any(|h| h == short || h == long),
            "{short} not attached: {hooks:?}"
        );
    }
    assert_eq!(hooks.len(), 9, "{hooks:?}");
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = sb.pin_dir.to_string_lossy().into_owned();
    let out = sb
        .exec_status(&sb.node_ns(), &[&bin, "status", "--pin-root", &pin])
        .expect("switchboard status");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(9 socket-layer: "), "{text}");
    for hook in ["connect6", "sendmsg6", "recvmsg6", "getpeername6"] {
        assert!(text.contains(hook), "status does not list {hook}: {text}");
    }
    assert!(!text.contains("socket layer (cgroup"), "{text}");
    let first = hooks;

    // A restarted (or upgraded) agent replaces every pinned link: still one
    // program per hook.
    sb.stop_agent().expect("stop agent");
    assert_eq!(
        attached_hooks(&sb),
        first,
        "the pinned links outlive the agent"
    );
    sb.start_agent_with(&switchboard(), &[])
        .expect("restart agent");
    wait_agent_log(&sb, xtask::sandbox::AGENT_READY, Duration::from_secs(10));
    assert!(
        sb.agent_log().contains("socket-layer balancing attached"),
        "{}",
        sb.agent_log()
    );
    assert_eq!(attached_hooks(&sb), first, "after a restart");

    sb.stop_agent().expect("stop agent");
    sb.start_agent_with(&switchboard(), &["--socket-lb=false"])
        .expect("restart agent");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !attached_hooks(&sb).is_empty() {
        assert!(
            Instant::now() < deadline,
            "still attached: {:?}\n{}",
            attached_hooks(&sb),
            sb.agent_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// A service mesh's sidecar, as Istio and Linkerd set it up: an init
/// container's rule in the pod redirects every outbound TCP connection to a
/// local proxy, which reads the connection's original destination
/// (`SO_ORIGINAL_DST`) to route it, then connects to a pod itself. With the
/// socket layer everywhere, `connect()` inside the pod already swapped the
/// ClusterIP for a pod address, so the sidecar never sees the Service; with
/// `--socket-lb-host-namespace-only` it reads the ClusterIP, its own
/// connection to a pod address works, and the tc layer leaves it alone.
#[test]
fn a_mesh_sidecar_reads_the_cluster_ip_with_the_socket_layer_kept_to_the_host() {
    let mut sb = demo_sandbox_with(&[]);
    let pod = sb.client_ns();
    // The init container's rule; the sidecar's own connections carry its
    // mark and are let through.
    sb.exec(
        &pod,
        &[
            "iptables",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-p",
            "tcp",
            "!",
            "-d",
            "127.0.0.0/8",
            "-m",
            "mark",
            "!",
            "--mark",
            SIDECAR_MARK_STR,
            "-j",
            "REDIRECT",
            "--to-ports",
            "15001",
        ],
    )
    .expect("the sidecar's redirect rule in the pod");
    let upstream: std::net::SocketAddr = format!("{}:{}", xtask::sandbox::pod_ip(1), 8080)
        .parse()
        .expect("pod address");
    let sidecar = Sidecar::start(&pod, upstream);

    let run = in_cgroup(&sb, &pod, &["--tcp", HTTP, "--count", "3"]);
    assert!(run.all_ok(), "through the sidecar: {}", run.raw);
    let seen = sidecar.take_seen();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(
        seen.iter().all(|d| d != HTTP),
        "with the socket layer in the pod the sidecar sees a pod address: {seen:?}"
    );

    sb.stop_agent().expect("stop agent");
    sb.start_agent_with(&switchboard(), &["--socket-lb-host-namespace-only=true"])
        .expect("restart agent with the mesh flag");
    wait_agent_log(&sb, "scope=HostNamespace", Duration::from_secs(10));
    let run = in_cgroup(&sb, &pod, &["--tcp", HTTP, "--count", "3"]);
    assert!(run.all_ok(), "through the sidecar: {}", run.raw);
    assert_eq!(
        run.names(),
        vec![pod_name(1); 3],
        "the sidecar's own connection reaches the pod it chose"
    );
    assert_eq!(sidecar.take_seen(), vec![HTTP.to_string(); 3]);
    // The node's own sockets are still balanced at the socket layer.
    let host = in_cgroup(&sb, &sb.node_ns(), &["--tcp", HTTP, "--count", "3"]);
    assert!(host.all_ok(), "host client: {}", host.raw);
}

/// The mark of the sidecar's own connections, which its redirect rule
/// lets through (as Istio exempts its proxy's).
const SIDECAR_MARK: u32 = 1337;
const SIDECAR_MARK_STR: &str = "1337";

/// A sidecar proxy listening on 127.0.0.1:15001 in a pod's namespace: for
/// each connection it records the original destination and relays the bytes
/// to `upstream` over a connection of its own (marked [`SIDECAR_MARK`]).
struct Sidecar {
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Sidecar {
    fn start(ns: &str, upstream: std::net::SocketAddr) -> Sidecar {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let listener = xtask::sandbox::in_netns(ns, || {
            std::net::TcpListener::bind("127.0.0.1:15001").map_err(anyhow::Error::from)
        })
        .expect("the sidecar's listener in the pod");
        let ns = ns.to_owned();
        let record = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (record, ns) = (record.clone(), ns.clone());
                std::thread::spawn(move || {
                    if let Some(dst) = original_dst(&conn) {
                        record.lock().expect("sidecar record").push(dst);
                    }
                    let _ = relay(conn, &ns, upstream);
                });
            }
        });
        Sidecar { seen }
    }

    fn take_seen(&self) -> Vec<String> {
        std::mem::take(&mut *self.seen.lock().expect("sidecar record"))
    }
}

/// `SO_ORIGINAL_DST` of a redirected IPv4 connection.
fn original_dst(conn: &std::net::TcpStream) -> Option<String> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: an all-zero sockaddr_in is valid.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `addr` and `len` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&raw mut addr).cast(),
            &mut len,
        )
    };
    (rc == 0).then(|| {
        let ip = std::net::Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
        format!("{ip}:{}", u16::from_be(addr.sin_port))
    })
}

/// Connects to `upstream` from namespace `ns` with the sidecar's mark and
/// copies both ways until either side closes.
fn relay(
    conn: std::net::TcpStream,
    ns: &str,
    upstream: std::net::SocketAddr,
) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd as _;
    let up = xtask::sandbox::in_netns(ns, || {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
        let mark = SIDECAR_MARK;
        // SAFETY: a u32 option value of its own size.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MARK,
                (&raw const mark).cast(),
                std::mem::size_of::<u32>() as libc::socklen_t,
            )
        };
        anyhow::ensure!(rc == 0, "SO_MARK: {}", std::io::Error::last_os_error());
        socket.connect_timeout(&upstream.into(), Duration::from_secs(2))?;
        Ok(std::net::TcpStream::from(socket))
    })?;
    let (mut up_read, mut conn_write) = (up.try_clone()?, conn.try_clone()?);
    let back = std::thread::spawn(move || {
        let _ = std::io::copy(&mut up_read, &mut conn_write);
        let _ = conn_write.shutdown(std::net::Shutdown::Both);
    });
    let (mut conn_read, mut up_write) = (conn, up);
    let _ = std::io::copy(&mut conn_read, &mut up_write);
    let _ = up_write.shutdown(std::net::Shutdown::Both);
    let _ = back.join();
    Ok(())
}
