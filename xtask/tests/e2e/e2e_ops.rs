//! The operator commands against real agents in netns sandboxes (root
//! only): `status`, `explain`, `conntrack`, `doctor` (one test per cause:
//! no endpoints, a selector matching no Pod, the agent not running, rules
//! missing) and `cleanup` (with and without `--kube-proxy`). Every command
//! runs inside the sandbox's node namespace (`ip netns exec`); iptables and
//! nft run only there.
//!
//! The binaries come from SWITCHBOARD_BIN and SB_ECHO_BIN (`cargo xtask test`).
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use proxy_testkit::netns::{self, in_netns};
use serde_json::{json, Value};
use xtask::fake_apiserver::FakeApiServer;
use xtask::sandbox::two_node::manifests::{ExternalService, Policy, Proto};
use xtask::sandbox::two_node::{Client, Node, Pod};
use xtask::sandbox::{pod_ip, Attempt, Sandbox, TwoNodeSandbox, CLIENT_IP, CLUSTER_IP};
use xtask::testenv::{
    demo_sandbox_with, require_root, sb_echo, switchboard, two_node_with_agents, write_manifest,
};

/// `switchboard <args> --pin-root <pin> [extra]` in `ns`, whatever its exit status.
fn sw_in(exec: impl Fn(&[&str]) -> Output, pin: &Path, args: &[&str]) -> Output {
    let bin = switchboard().to_string_lossy().into_owned();
    let pin = pin.to_string_lossy().into_owned();
    let mut cmd = vec![bin.as_str()];
    cmd.extend_from_slice(args);
    cmd.extend(["--pin-root", pin.as_str()]);
    exec(&cmd)
}

/// `switchboard <args>` in the sandbox's node namespace.
fn sw(sb: &Sandbox, args: &[&str]) -> Output {
    let node = sb.node_ns();
    sw_in(
        |cmd| sb.exec_status(&node, cmd).expect("run switchboard"),
        &sb.pin_dir,
        args,
    )
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `switchboard <args> -o json` and parses stdout.
fn sw_json(sb: &Sandbox, args: &[&str]) -> (Value, Output) {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = sw(sb, &all);
    let value = serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| {
        panic!(
            "switchboard {args:?}: not JSON ({e}): {}\nstderr: {}\n--- agent log ---\n{}",
            stdout(&out),
            String::from_utf8_lossy(&out.stderr),
            sb.agent_log()
        )
    });
    (value, out)
}

/// The findings of doctor check `name`.
fn findings(doctor: &Value, name: &str) -> Vec<String> {
    doctor
        .as_array()
        .expect("a list of checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name:?} in {doctor:#}"))["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["what"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn check_state(doctor: &Value, name: &str) -> String {
    doctor
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .map(|c| c["state"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// Polls `f` for up to 10 s.
fn eventually(what: &str, mut f: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match f() {
            Ok(()) => return,
            Err(last) if Instant::now() > deadline => {
                panic!("timed out waiting for {what}: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The demo sandbox once the agent has attached everywhere (it programs
/// the maps before it attaches to the pod veths).
fn settled_demo() -> Sandbox {
    let sb = demo_sandbox_with(&[]);
    eventually("`switchboard status` to exit 0", || {
        let out = sw(&sb, &["status"]);
        out.status.success().then_some(()).ok_or(stdout(&out))
    });
    sb
}

#[test]
fn status_shows_agent_interfaces_and_maps_and_fails_once_the_agent_stops() {
    let mut sb = settled_demo();
    let out = sw(&sb, &["status"]);
    let text = stdout(&out);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "status of a healthy sandbox must exit 0:\n{text}"
    );
    assert!(text.contains("running (pid"), "{text}");
    assert!(
        text.contains(&sb.pod_if(1)) && text.contains("SB_FE_V1"),
        "{text}"
    );
    let (json, _) = sw_json(&sb, &["status"]);
    assert_eq!(json["agent"]["alive"], true, "{json:#}");
    let pods: Vec<&Value> = json["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .filter(|i| i["role"] == "pod")
        .collect();
    assert!(
        pods.len() >= 3,
        "the three pod veths (and the client's): {json:#}"
    );
    for i in &pods {
        assert_eq!(i["missing"], json!([]), "{i:#}");
    }
    assert_eq!(json["problems"], json!([]), "{json:#}");

    sb.stop_agent().expect("stop the agent");
    let out = sw(&sb, &["status"]);
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "status must fail without an agent:\n{text}"
    );
    assert!(
        text.contains("NOT RUNNING") && text.contains("is not running"),
        "{text}"
    );
}

#[test]
fn doctor_names_a_service_without_endpoints() {
    let mut sb = settled_demo();
    write_manifest(
        &sb,
        "empty.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: empty\n  namespace: demo\nspec:\n  clusterIP: 10.96.0.20\n  selector:\n    app: nothing\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n",
    );
    sb.wait_services(
        &switchboard(),
        Duration::from_secs(10),
        "demo/empty:http",
        |f| f.iter().any(|fe| fe.service == "demo/empty:http"),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    let (doctor, out) = sw_json(&sb, &["doctor"]);
    assert_eq!(out.status.code(), Some(1), "{doctor:#}");
    let found = findings(&doctor, "Services have endpoints");
    assert_eq!(found.len(), 1, "{doctor:#}");
    assert!(
        found[0].contains("demo/empty:http (10.96.0.20:80/TCP) has no endpoints"),
        "{found:?}"
    );
    // Everything else is fine; the selector check is skipped in standalone mode.
    assert_eq!(check_state(&doctor, "agent running"), "ok");
    assert_eq!(
        check_state(&doctor, "maps match the source"),
        "ok",
        "{doctor:#}"
    );
    assert_eq!(check_state(&doctor, "selectors match Pods"), "skipped");
    let text = stdout(&sw(&sb, &["doctor"]));
    eprintln!("{text}");
    assert!(
        text.contains(
            "fix: `kubectl -n demo get endpointslices -l kubernetes.io/service-name=empty`"
        ),
        "{text}"
    );
    // explain says why: rejected, no endpoints.
    let (e, out) = sw_json(&sb, &["explain", "10.96.0.20:80/TCP"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(e["verdict"], "rejected", "{e:#}");
}

#[test]
fn doctor_names_a_selector_that_matches_no_pod() {
    require_root();
    let mut sb = Sandbox::for_test().expect("sandbox");
    sb.start_pods(&sb_echo()).expect("pods");
    let api =
        FakeApiServer::start_in_netns(Some(&sb.node_ns()), "127.0.0.1:0").expect("fake API server");
    api.apply(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.244.100.1"}]}}),
    )
    .expect("node");
    for (name, ip, app) in [
        ("echo", CLUSTER_IP, "echo"),
        ("lonely", "10.96.0.30", "nothing"),
    ] {
        api.apply(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "demo"},
            "spec": {"clusterIP": ip, "clusterIPs": [ip], "selector": {"app": app},
                     "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}]}}))
            .expect("service");
    }
    let endpoints: Vec<Value> = (1..=3)
        .map(|i| json!({"addresses": [pod_ip(i)], "conditions": {"ready": true}, "nodeName": "node-a"}))
        .collect();
    api.apply(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "echo-1", "namespace": "demo", "labels": {"kubernetes.io/service-name": "echo"}},
        "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
        "endpoints": endpoints}))
        .expect("slice");
    for i in 1..=3 {
        api.apply(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod{i}"), "namespace": "demo", "labels": {"app": "echo"}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "echo", "image": "sb-echo"}]},
            "status": {"phase": "Running", "podIP": pod_ip(i),
                       "conditions": [{"type": "Ready", "status": "True"}]}}))
            .expect("pod");
    }
    let kubeconfig = sb.dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let (bin, pin, kc, node) = (
        switchboard().to_string_lossy().into_owned(),
        sb.pin_dir.to_string_lossy().into_owned(),
        kubeconfig.to_string_lossy().into_owned(),
        sb.node_ns(),
    );
    sb.spawn(
        "agent",
        &node,
        &[
            &bin,
            "agent",
            "--source",
            "cluster",
            "--kubeconfig",
            &kc,
            "--node-name",
            "node-a",
            "--pin-root",
            &pin,
            "--socket-lb=false",
        ],
    )
    .expect("agent");
    sb.wait_services(
        &switchboard(),
        Duration::from_secs(15),
        "both Services programmed",
        |f| {
            f.iter().any(|fe| fe.service == "demo/lonely:http")
                && f.iter()
                    .any(|fe| fe.service == "demo/echo:http" && fe.backends.len() == 3)
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", sb.read_log("agent")));
    // The agent's status is written after its first sync; poll until the
    // selector check runs against the API server.
    let mut last = Value::Null;
    eventually("doctor's selector check", || {
        let (doctor, _) = sw_json(&sb, &["doctor", "--kubeconfig", &kc]);
        last = doctor.clone();
        (check_state(&doctor, "selectors match Pods") == "problem")
            .then_some(())
            .ok_or(format!("{doctor:#}"))
    });
    let found = findings(&last, "selectors match Pods");
    assert_eq!(
        found,
        ["Service demo/lonely: selector app=nothing matches no Pod in namespace demo"],
        "{last:#}"
    );
    assert_eq!(
        check_state(&last, "maps match the source"),
        "ok",
        "{last:#}"
    );
    eprintln!("{}", stdout(&sw(&sb, &["doctor", "--kubeconfig", &kc])));
    sb.cleanup().expect("cleanup");
}

#[test]
fn doctor_names_a_stopped_agent() {
    let mut sb = settled_demo();
    let (doctor, out) = sw_json(&sb, &["doctor"]);
    assert!(
        out.status.success(),
        "doctor on a healthy sandbox must exit 0: {doctor:#}"
    );
    let pid = sb.agent_pid().expect("agent pid");
    sb.stop_agent().expect("stop the agent");
    let (doctor, out) = sw_json(&sb, &["doctor"]);
    assert_eq!(out.status.code(), Some(1), "{doctor:#}");
    let found = findings(&doctor, "agent running");
    assert_eq!(found.len(), 1, "{doctor:#}");
    assert!(
        found[0].contains(&format!("the agent (pid {pid}) is not running")),
        "{found:?}"
    );
}

#[test]
fn doctor_names_a_missing_program_and_a_missing_map_entry() {
    // Repairs off: the damage stays for doctor to find (`e2e_heal` has the
    // agent repair it).
    let sb = demo_sandbox_with(&["--repair-interval", "0"]);
    eventually("`switchboard status` to exit 0", || {
        let out = sw(&sb, &["status"]);
        out.status.success().then_some(()).ok_or(stdout(&out))
    });
    let index =
        in_netns(&sb.node_ns(), || netns::ifindex(&sb.pod_if(1))).expect("the pod veth's index");
    let pin = sb
        .pin_dir
        .join("links")
        .join(format!("tcx_{index}_sb_from_pod"));
    assert!(pin.exists(), "no TCX pin {}", pin.display());
    // Unpinning releases the link: the program leaves the veth.
    std::fs::remove_file(&pin).expect("unpin");
    // The UDP frontend's slot 0 (10.96.0.10:53/UDP, internal, slot 0) goes.
    let key = [
        "0a", "60", "00", "0a", "00", "35", "11", "00", "00", "00", "00", "00",
    ];
    let map = sb.pin_dir.join("SB_FE_V1").to_string_lossy().into_owned();
    let mut cmd = vec![
        "bpftool",
        "map",
        "delete",
        "pinned",
        map.as_str(),
        "key",
        "hex",
    ];
    cmd.extend(key);
    sb.exec(&sb.node_ns(), &cmd)
        .expect("delete the frontend entry");
    let mut last = Value::Null;
    eventually("the missing program", || {
        let (doctor, _) = sw_json(&sb, &["doctor"]);
        last = doctor.clone();
        let found = findings(&doctor, "programs attached");
        found
            .iter()
            .any(|f| f.contains(&sb.pod_if(1)))
            .then_some(())
            .ok_or(format!("{doctor:#}"))
    });
    let attached = findings(&last, "programs attached");
    assert_eq!(attached.len(), 1, "{last:#}");
    assert!(
        attached[0].contains("tcx ingress sb_from_pod not attached"),
        "{attached:?}"
    );
    let maps = findings(&last, "maps match the source");
    assert_eq!(maps.len(), 1, "{last:#}");
    assert!(
        maps[0].contains("10.96.0.10:53/UDP of demo/echo:dns is not in the maps"),
        "{maps:?}"
    );
    // The agent's own comparison: the frontend is missing, and what its
    // slot 0 announced (its slots, backends, reverse-NAT entry) is left
    // without a frontend.
    let verify = findings(&last, "maps match the agent's desired state");
    assert!(
        verify
            .iter()
            .any(|f| f.starts_with("missing 10.96.0.10:53/UDP demo/echo:dns: not in the maps")),
        "{verify:#?}"
    );
    assert!(
        verify
            .iter()
            .any(|f| f.starts_with("orphaned-slot 10.96.0.10:53/UDP")),
        "{verify:#?}"
    );
    let text = stdout(&sw(&sb, &["doctor"]));
    eprintln!("{text}");
    assert!(
        text.contains(&format!("PROBLEMS ({})", 2 + verify.len())),
        "{text}"
    );
}

#[test]
fn conntrack_lists_both_directions_and_flushes_one_service_then_all() {
    let sb = settled_demo();
    for (proto, port) in [("--tcp", 80), ("--udp", 53)] {
        let run = sb
            .client(
                &sb_echo(),
                &[proto, &format!("{CLUSTER_IP}:{port}"), "--count", "3"],
            )
            .expect("client");
        assert!(run.all_ok(), "{}", run.raw);
    }
    let (rows, _) = sw_json(&sb, &["conntrack", "list", "--service", "demo/echo:http"]);
    let rows = rows.as_array().expect("rows").clone();
    assert!(rows.len() >= 6, "3 TCP flows, both directions: {rows:#?}");
    assert!(rows.iter().all(|r| r["service"] == "demo/echo:http"));
    let forward: Vec<&Value> = rows
        .iter()
        .filter(|r| r["direction"] == "forward")
        .collect();
    assert!(forward.iter().all(|r| r["source"]
        .as_str()
        .unwrap_or_default()
        .starts_with(CLIENT_IP)
        && r["destination"] == format!("{CLUSTER_IP}:80")));
    assert!(rows
        .iter()
        .any(|r| r["direction"] == "reply" && r["nat"] == format!("{CLUSTER_IP}:80")));
    eprintln!("{}", stdout(&sw(&sb, &["conntrack", "list"])));

    let (flushed, _) = sw_json(&sb, &["conntrack", "flush", "--service", "demo/echo:dns"]);
    assert!(flushed["removed"].as_u64().unwrap_or(0) >= 6, "{flushed:#}");
    let (dns, _) = sw_json(&sb, &["conntrack", "list", "--service", "demo/echo:dns"]);
    assert_eq!(dns, json!([]));
    let (http, _) = sw_json(&sb, &["conntrack", "list", "--service", "demo/echo:http"]);
    assert_eq!(
        http.as_array().map(Vec::len),
        Some(rows.len()),
        "other Services' entries stay"
    );
    let text = stdout(&sw(&sb, &["conntrack", "flush"]));
    assert_eq!(
        text.trim(),
        format!("removed {} connection-tracking entries", rows.len())
    );
    let (all, _) = sw_json(&sb, &["conntrack", "list"]);
    assert_eq!(all, json!([]));
}

#[test]
fn explain_names_no_match_reasons_and_the_random_set() {
    let sb = settled_demo();
    let out = sw(
        &sb,
        &[
            "explain",
            "10.96.0.10:80/TCP",
            "--from",
            "10.244.100.2:40000",
        ],
    );
    let text = stdout(&out);
    eprintln!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("Service:   demo/echo:http (ClusterIP"),
        "{text}"
    );
    assert!(text.contains("is routed via pod interface"), "{text}");
    assert!(
        text.contains("picks one of the 3 backends at random"),
        "{text}"
    );
    for (target, reason) in [
        ("10.96.0.99:80/TCP", "no frontend at 10.96.0.99"),
        (
            "10.96.0.10:81/TCP",
            "not on port 81/TCP (it serves 53/UDP, 80/TCP)",
        ),
        (
            "10.96.0.10:53/TCP",
            "another protocol only (53/UDP, 80/TCP), not TCP",
        ),
    ] {
        let (e, out) = sw_json(&sb, &["explain", target]);
        assert_eq!(out.status.code(), Some(1), "{e:#}");
        assert_eq!(e["verdict"], "not_handled");
        assert!(
            e["reasons"][0]
                .as_str()
                .unwrap_or_default()
                .contains(reason),
            "{target}: {e:#}"
        );
    }
}

/// The pod whose address is `ip` (`10.x.y.z:port` accepted).
fn pod_of(addr: &str) -> Option<Pod> {
    let ip = addr.split(':').next()?;
    Pod::all().into_iter().find(|p| p.ip() == ip)
}

/// `explain` through node A names, for a new flow from client 1, the pod
/// that then answers it: Maglev (5-tuple) on the LoadBalancer IP, source
/// hash (annotation) on the external IP.
#[test]
fn explain_names_the_maglev_and_source_hash_backend_the_kernel_picks() {
    let pods = Pod::all();
    let mut sb = two_node_with_agents(Policy::Cluster, &pods, &["--lb-algorithm", "maglev"]);
    let hashed = ExternalService::ExternalIp;
    let yaml = hashed.yaml(Policy::Cluster).replacen(
        "metadata:\n",
        "metadata:\n  annotations:\n    switchboard.io/lb-algorithm: source-hash\n",
        1,
    );
    sb.write_manifest(&hashed.service_file(), &yaml)
        .expect("annotate");
    sb.route_services_via(Client::One, Node::A)
        .expect("route via A");
    let explain = |sb: &TwoNodeSandbox, target: &str, sport: u16| -> Value {
        let from = format!("{}:{sport}", Client::One.ip());
        let out = sw_in(
            |cmd| sb.exec(&sb.node_ns(Node::A), cmd).expect("explain"),
            &sb.pin_dir(Node::A),
            &["explain", target, "--from", &from, "-o", "json"],
        );
        serde_json::from_str(&stdout(&out)).expect("explain JSON")
    };
    let lb = ExternalService::LoadBalancer.entry_points(Node::A);
    let ext = hashed.entry_points(Node::A);
    let lb_tcp = lb
        .iter()
        .find(|e| e.proto == Proto::Tcp)
        .expect("LB TCP entry");
    let ext_tcp = ext
        .iter()
        .find(|e| e.proto == Proto::Tcp)
        .expect("external IP TCP entry");
    let ext_target = format!("{}/TCP", ext_tcp.addr());
    eventually("the source-hash annotation in the maps", || {
        let e = explain(&sb, &ext_target, 45000);
        e["reasons"]
            .to_string()
            .contains("source hash")
            .then_some(())
            .ok_or(format!("{e:#}"))
    });
    let mut seen = std::collections::BTreeSet::new();
    // Source ports above the ephemeral range (32768-60999), which no earlier
    // connection of the test can hold.
    for (entry, first_port) in [(lb_tcp, 63000u16), (ext_tcp, 64000)] {
        for sport in first_port..first_port + 8 {
            let target = format!("{}/TCP", entry.addr());
            let e = explain(&sb, &target, sport);
            assert_eq!(e["scope"], "external", "{e:#}");
            let named = e["backend"]
                .as_str()
                .and_then(pod_of)
                .unwrap_or_else(|| panic!("{e:#}"));
            let run = sb
                .client(
                    &sb_echo(),
                    Client::One,
                    &[
                        "--tcp",
                        &entry.addr(),
                        "--count",
                        "1",
                        "--sport",
                        &sport.to_string(),
                        "--timeout-ms",
                        "1000",
                    ],
                )
                .expect("client");
            let Some(Attempt::Ok { name, .. }) = run.attempts.first() else {
                panic!(
                    "no answer from {target} port {sport}: {}\n{}",
                    run.raw,
                    sb.agent_log(Node::A)
                );
            };
            assert_eq!(
                name,
                &named.name(),
                "{target} from port {sport}: explain said {named:?}: {e:#}"
            );
            seen.insert((entry.address.clone(), name.clone()));
        }
    }
    eprintln!("explain matched the kernel's pick for 16 flows: {seen:?}");
    assert!(
        seen.iter().filter(|(a, _)| *a == lb_tcp.address).count() > 1,
        "Maglev spread flows: {seen:?}"
    );
    sb.cleanup().expect("cleanup");
}

#[test]
fn cleanup_refuses_while_the_agent_runs_then_leaves_nothing_attached() {
    let mut sb = settled_demo();
    let out = sw(&sb, &["cleanup"]);
    let pid = sb.agent_pid().expect("pid");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("pid {pid}")),
        "{out:?}"
    );
    sb.stop_agent().expect("stop the agent");
    // Still forwarding without the agent (pinned programs and maps).
    let run = sb
        .client(
            &sb_echo(),
            &["--tcp", &format!("{CLUSTER_IP}:80"), "--timeout-ms", "500"],
        )
        .expect("client");
    assert!(run.all_ok(), "{}", run.raw);
    let text = stdout(&sw(&sb, &["cleanup"]));
    eprintln!("{text}");
    assert!(text.contains("Still attached:    none"), "{text}");
    // bpffs shows `maps.debug` and `progs.debug` at a mount's root itself.
    let left: Vec<_> = std::fs::read_dir(&sb.pin_dir)
        .expect("pin dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".debug"))
        .collect();
    assert!(left.is_empty(), "pin dir not empty: {left:?}");
    assert!(
        !xtask::sandbox::status_file(&sb.pin_dir).exists(),
        "status file left"
    );
    assert!(
        !xtask::sandbox::status_file(&sb.pin_dir)
            .with_extension("lock")
            .exists(),
        "lock file left"
    );
    let cgroup = sb
        .cgroup()
        .expect("cgroup")
        .bound
        .to_string_lossy()
        .into_owned();
    let progs = sb
        .exec(&sb.node_ns(), &["bpftool", "cgroup", "show", &cgroup])
        .expect("bpftool cgroup");
    assert!(!stdout(&progs).contains("sb_sock"), "{}", stdout(&progs));
    for iface in [sb.pod_if(1), sb.pod_if(2), sb.pod_if(3), sb.client_if()] {
        for dir in ["ingress", "egress"] {
            let f = sb
                .exec(&sb.node_ns(), &["tc", "filter", "show", "dev", &iface, dir])
                .map(|o| stdout(&o))
                .unwrap_or_default();
            assert!(!f.contains("sb_"), "{iface} {dir}: {f}");
        }
    }
    // Nothing translates the ClusterIP any more.
    let run = sb
        .client(
            &sb_echo(),
            &["--tcp", &format!("{CLUSTER_IP}:80"), "--timeout-ms", "300"],
        )
        .expect("client");
    assert_eq!(
        run.failures(),
        1,
        "the ClusterIP still answers after cleanup: {}",
        run.raw
    );
}

#[test]
fn cleanup_kube_proxy_removes_its_chains_and_tables_in_the_node_netns_only() {
    require_root();
    let sb = Sandbox::for_test().expect("sandbox");
    let node = sb.node_ns();
    for cmd in [
        &["iptables", "-t", "nat", "-N", "KUBE-SERVICES"][..],
        &[
            "iptables",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-j",
            "KUBE-SERVICES",
        ],
        &["iptables", "-t", "filter", "-N", "KUBE-FIREWALL"],
        &[
            "iptables",
            "-t",
            "filter",
            "-A",
            "INPUT",
            "-j",
            "KUBE-FIREWALL",
        ],
        &["iptables", "-t", "nat", "-N", "KEEP-ME"],
        &["nft", "add", "table", "ip", "kube-proxy"],
    ] {
        sb.exec(&node, cmd)
            .expect("create kube-proxy leftovers in the node netns");
    }
    let (doctor, _) = sw_json(&sb, &["doctor"]);
    let found = findings(&doctor, "no kube-proxy leftovers");
    assert_eq!(found.len(), 2, "{doctor:#}");
    assert!(
        found[0].contains("KUBE-SERVICES") && found[0].contains("KUBE-FIREWALL"),
        "{found:?}"
    );
    let out = sw(&sb, &["cleanup", "--kube-proxy"]);
    eprintln!("{}", stdout(&out));
    let save = stdout(&sb.exec(&node, &["iptables-save"]).expect("iptables-save"));
    assert!(!save.contains("KUBE-"), "{save}");
    assert!(save.contains(":KEEP-ME"), "other chains stay: {save}");
    let tables = stdout(&sb.exec(&node, &["nft", "list", "tables"]).expect("nft"));
    assert!(!tables.contains("kube-proxy"), "{tables}");
    let (doctor, _) = sw_json(&sb, &["doctor"]);
    assert_eq!(
        check_state(&doctor, "no kube-proxy leftovers"),
        "ok",
        "{doctor:#}"
    );
}

/// Creates a small hash map pinned at `path` (what a dead agent's resize or
/// another version's layout leaves behind).
fn pin_a_map(path: &Path) {
    let out = std::process::Command::new("bpftool")
        .args(["map", "create"])
        .arg(path)
        .args([
            "type",
            "hash",
            "key",
            "4",
            "value",
            "4",
            "entries",
            "16",
            "name",
            "sb_leftover",
        ])
        .output()
        .expect("run bpftool");
    assert!(
        out.status.success(),
        "bpftool map create: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A start killed during a resize leaves `_resize` pins, and another
/// version leaves pins this version does not use. `status` and `doctor`
/// name them; the next start (which resizes nothing) removes the staging
/// pin and leaves the other for the operator.
#[test]
fn stale_resize_pins_and_other_layouts_are_reported_and_the_next_start_removes_the_staging_pin() {
    let mut sb = settled_demo();
    sb.stop_agent().expect("stop the agent");
    let staging = sb.pin_dir.join("SB_FE_V1_resize");
    let old_layout = sb.pin_dir.join("SB_CT_V3");
    pin_a_map(&staging);
    pin_a_map(&old_layout);

    let out = sw(&sb, &["status"]);
    let text = stdout(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("staging pins of a resize that did not finish: SB_FE_V1_resize"),
        "{text}"
    );
    assert!(
        text.contains("pins this version does not use (another version's layout): SB_CT_V3"),
        "{text}"
    );
    let (doctor, _) = sw_json(&sb, &["doctor"]);
    let found = findings(&doctor, "pin root layout");
    assert_eq!(found.len(), 2, "{doctor:#}");
    assert!(
        found.iter().any(|f| f.contains("SB_FE_V1_resize")),
        "{found:?}"
    );

    sb.start_agent(&switchboard())
        .expect("start the agent again");
    eventually("the agent to remove the staging pin", || {
        (!staging.exists()).then_some(()).ok_or(sb.agent_log())
    });
    assert!(
        sb.agent_log()
            .contains("removed the staging pin of an interrupted resize"),
        "{}",
        sb.agent_log()
    );
    assert!(
        old_layout.exists(),
        "another layout's pin is left for the operator"
    );
    let out = sw(&sb, &["status"]);
    assert!(!stdout(&out).contains("_resize"), "{}", stdout(&out));
    std::fs::remove_file(&old_layout).expect("remove the old layout's pin");
    eventually("`switchboard status` to exit 0", || {
        let out = sw(&sb, &["status"]);
        out.status.success().then_some(()).ok_or(stdout(&out))
    });
    sb.cleanup().expect("cleanup");
}

/// With the agent pod's capabilities (CAP_BPF, CAP_NET_ADMIN,
/// CAP_PERFMON; no CAP_SYS_ADMIN, as `kubectl exec` gives) the kernel
/// refuses to list programs: `status` and `doctor` say they cannot
/// inspect, instead of calling every interface MISSING and advising a
/// restart.
#[test]
fn status_and_doctor_without_cap_sys_admin_say_they_cannot_inspect() {
    let mut sb = settled_demo();
    let without_sys_admin = |cmd: &[&str]| {
        let mut all = vec![
            "setpriv",
            "--inh-caps=-all",
            "--bounding-set=-sys_admin",
            "--",
        ];
        all.extend_from_slice(cmd);
        sb.exec_status(&sb.node_ns(), &all)
            .expect("run switchboard")
    };
    let out = sw_in(without_sys_admin, &sb.pin_dir, &["status"]);
    let text = stdout(&out);
    assert!(
        text.contains("cannot inspect: permission denied (need CAP_SYS_ADMIN or root)"),
        "{text}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("MISSING"), "{text}");
    assert!(!text.contains("restart the agent"), "{text}");
    let out = sw_in(without_sys_admin, &sb.pin_dir, &["doctor", "-o", "json"]);
    let doctor: Value =
        serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)));
    let found = findings(&doctor, "programs attached");
    assert_eq!(found.len(), 1, "{doctor:#}");
    assert!(
        found[0].starts_with("cannot inspect: permission denied"),
        "{found:?}"
    );
    // As root, all is well.
    let out = sw(&sb, &["status"]);
    assert!(out.status.success(), "{}", stdout(&out));
    sb.cleanup().expect("cleanup");
}
