//! The agent with `--source cluster`, unmodified, against the fake API server
//! (real HTTP: list + watch, resourceVersions, bookmarks, 410 Gone), in a
//! netns sandbox with real traffic. Root only; run by `cargo xtask test`.
//!
//! The fake server's listening socket lives in the sandbox's node namespace,
//! where the agent runs, so the agent reaches it at 127.0.0.1.
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use xtask::fake_apiserver::{FakeApiServer, Faults, Kind};
use xtask::sandbox::{find, pod_ip, Frontend, Sandbox, CLUSTER_IP};
use xtask::testenv::{sb_echo, switchboard};

const NODE_NAME: &str = "node-a";
const NODE_IP: &str = "10.244.100.1";
const NODE_PORT: u16 = 30080;

fn node() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE_NAME, "labels": {"topology.kubernetes.io/zone": "z1"}},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]}
    })
}

fn service() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "echo", "namespace": "demo"},
        "spec": {
            "type": "NodePort",
            "clusterIP": CLUSTER_IP, "clusterIPs": [CLUSTER_IP],
            "selector": {"app": "echo"},
            "ports": [
                {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": NODE_PORT},
                {"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353, "nodePort": NODE_PORT}
            ]
        }
    })
}

fn slice(pods: &[usize]) -> Value {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|i| {
            json!({
                "addresses": [pod_ip(*i)],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": NODE_NAME,
                "targetRef": {"kind": "Pod", "namespace": "demo", "name": format!("pod{i}")}
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "echo-abc12", "namespace": "demo",
                     "labels": {"kubernetes.io/service-name": "echo"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "protocol": "TCP", "port": 8080},
                  {"name": "dns", "protocol": "UDP", "port": 5353}],
        "endpoints": endpoints
    })
}

struct Cluster {
    sb: Sandbox,
    api: FakeApiServer,
    /// Extra agent flags, kept for a restart.
    agent_args: Vec<String>,
}

impl Cluster {
    /// Sandbox with pods, the fake API server in the node namespace holding
    /// this node, and the agent watching it.
    fn start(pods: &[usize]) -> Cluster {
        Cluster::start_with(pods, &[])
    }

    /// [`start`](Self::start) with extra agent flags.
    fn start_with(pods: &[usize], agent_args: &[&str]) -> Cluster {
        Cluster::start_serving(pods, agent_args, &[])
    }

    /// [`start_with`](Self::start_with), the API server holding `extra`
    /// objects too when the agent starts.
    fn start_serving(pods: &[usize], agent_args: &[&str], extra: &[Value]) -> Cluster {
        xtask::testenv::require_root();
        let mut sb = Sandbox::for_test().expect("sandbox");
        sb.start_pods(&sb_echo()).expect("pods");
        let api = FakeApiServer::start_in_netns(Some(&sb.node_ns()), "127.0.0.1:0")
            .expect("fake API server");
        api.apply(node()).expect("node");
        api.apply(service()).expect("service");
        api.apply(slice(pods)).expect("slice");
        for obj in extra {
            api.apply(obj).expect("extra object");
        }
        let kubeconfig = sb.dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let mut cluster = Cluster {
            sb,
            api,
            agent_args: agent_args.iter().map(|a| a.to_string()).collect(),
        };
        cluster.start_agent(&kubeconfig);
        cluster
    }

    /// The agent with the sandbox's own cgroup for the socket layer (never
    /// the host's cgroup root).
    fn start_agent(&mut self, kubeconfig: &std::path::Path) {
        let kc = kubeconfig.to_string_lossy().into_owned();
        let mut args = vec!["--kubeconfig", &kc, "--node-name", NODE_NAME];
        args.extend(self.agent_args.iter().map(String::as_str));
        self.sb
            .start_agent_from(&switchboard(), "cluster", &args)
            .expect("agent");
    }

    fn wait(&mut self, what: &str, pred: impl Fn(&[Frontend]) -> bool) -> Duration {
        let started = Instant::now();
        match self
            .sb
            .wait_services(&switchboard(), Duration::from_secs(10), what, pred)
        {
            Ok(_) => started.elapsed(),
            Err(e) => panic!("{e:#}\n--- agent log ---\n{}", self.sb.read_log("agent")),
        }
    }

    fn backends(
        frontends: &[Frontend],
        address: &str,
        port: u16,
        protocol: &str,
    ) -> Option<Vec<String>> {
        frontends
            .iter()
            .find(|f| f.address == address && f.port == port && f.protocol == protocol)
            .map(Frontend::backend_addrs)
    }

    /// Names of the pods that answered `count` new TCP connections to the ClusterIP.
    fn tcp_names(&self, count: usize) -> Vec<String> {
        let run = self
            .sb
            .client(
                &sb_echo(),
                &[
                    "--tcp",
                    &format!("{CLUSTER_IP}:80"),
                    "--count",
                    &count.to_string(),
                    "--timeout-ms",
                    "500",
                ],
            )
            .expect("client");
        assert!(run.all_ok(), "some connections failed");
        let mut names = run.names();
        names.sort();
        names.dedup();
        names
    }
}

fn pod_backends(pods: &[usize], port: u16) -> Vec<String> {
    let mut v: Vec<String> = pods
        .iter()
        .map(|i| format!("{}:{port}", pod_ip(*i)))
        .collect();
    v.sort();
    v
}

#[test]
fn startup_sync_then_updates_and_deletes_follow_the_api_server() {
    let mut c = Cluster::start(&[1, 2, 3]);
    let took = c.wait("ClusterIP and NodePort frontends with 3 backends", |f| {
        Cluster::backends(f, CLUSTER_IP, 80, "TCP") == Some(pod_backends(&[1, 2, 3], 8080))
            && Cluster::backends(f, NODE_IP, NODE_PORT, "TCP")
                == Some(pod_backends(&[1, 2, 3], 8080))
            && Cluster::backends(f, CLUSTER_IP, 53, "UDP") == Some(pod_backends(&[1, 2, 3], 5353))
    });
    eprintln!("start-up sync visible after {took:?}");
    let frontends = c.sb.services(&switchboard()).expect("services");
    assert!(
        find(&frontends, "demo/echo:http").is_some(),
        "{frontends:#?}"
    );
    assert_eq!(c.tcp_names(30), vec!["pod1", "pod2", "pod3"]);

    // Scale down through the API: the maps and the traffic follow.
    c.api.apply(slice(&[1, 3])).expect("update slice");
    let took = c.wait("two backends after the update", |f| {
        Cluster::backends(f, CLUSTER_IP, 80, "TCP") == Some(pod_backends(&[1, 3], 8080))
    });
    eprintln!("EndpointSlice update visible after {took:?}");
    assert!(took < Duration::from_secs(2), "update took {took:?}");
    assert_eq!(c.tcp_names(30), vec!["pod1", "pod3"]);

    // Delete the Service: every frontend of it goes.
    c.api
        .delete(Kind::Service, "demo", "echo")
        .expect("service existed");
    let took = c.wait("no frontends after the delete", |f| f.is_empty());
    eprintln!("Service delete visible after {took:?}");
    c.sb.cleanup().expect("cleanup");
}

#[test]
fn relists_after_410_and_keeps_forwarding_while_the_api_server_is_away() {
    let mut c = Cluster::start(&[1, 2]);
    c.wait("initial sync", |f| {
        Cluster::backends(f, CLUSTER_IP, 80, "TCP") == Some(pod_backends(&[1, 2], 8080))
    });
    let lists_before = c.api.lists(Kind::EndpointSlice);

    // The API server goes away: what is programmed keeps forwarding.
    c.api.stop();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        c.tcp_names(20),
        vec!["pod1", "pod2"],
        "forwarding must not depend on the API server"
    );

    // It comes back with its history gone: the watch resumes from an expired
    // resourceVersion, gets 410 Gone and must relist to see the new state.
    c.api.apply(slice(&[1, 2, 3])).expect("update while away");
    c.api.compact();
    c.api.start_again().expect("restart");
    let took = c.wait("the change made while the server was away", |f| {
        Cluster::backends(f, CLUSTER_IP, 80, "TCP") == Some(pod_backends(&[1, 2, 3], 8080))
    });
    eprintln!("caught up {took:?} after the API server came back");
    assert!(
        c.api.lists(Kind::EndpointSlice) > lists_before,
        "the agent must have relisted EndpointSlices"
    );

    // A dropped watch connection alone: the agent re-watches and sees later events.
    c.api.drop_watches();
    c.api.apply(slice(&[3])).expect("update after drop");
    c.wait("the change after a dropped watch", |f| {
        Cluster::backends(f, CLUSTER_IP, 80, "TCP") == Some(pod_backends(&[3], 8080))
    });
    assert_eq!(c.tcp_names(10), vec!["pod3"]);
    c.sb.cleanup().expect("cleanup");
}

#[test]
fn a_restarted_agent_adopts_the_maps_and_established_connections_survive() {
    let mut c = Cluster::start(&[1, 2, 3]);
    c.wait("initial sync", |f| {
        Cluster::backends(f, CLUSTER_IP, 80, "TCP") == Some(pod_backends(&[1, 2, 3], 8080))
    });
    let ids_before: Vec<u64> =
        c.sb.services(&switchboard())
            .expect("services")
            .iter()
            .map(|f| f.id)
            .collect();
    // A connection held across the restart must get every reply.
    let hold =
        c.sb.client_spawn(
            &sb_echo(),
            &["--tcp", &format!("{CLUSTER_IP}:80"), "--hold", "4"],
        )
        .expect("long-lived client");
    std::thread::sleep(Duration::from_millis(500));
    let status = c.sb.stop_agent().expect("stop agent");
    assert!(status.success(), "agent exit status {status:?}");
    // No agent: programs and maps stay; new connections still work.
    assert_eq!(c.tcp_names(40), vec!["pod1", "pod2", "pod3"]);
    let kubeconfig = c.sb.dir.join("kubeconfig");
    c.start_agent(&kubeconfig);
    std::thread::sleep(Duration::from_millis(1500));
    let out = hold.wait_with_output().expect("hold client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the held connection lost replies:\n{text}\n--- agent log ---\n{}",
        c.sb.read_log("agent")
    );
    let ids_after: Vec<u64> =
        c.sb.services(&switchboard())
            .expect("services")
            .iter()
            .map(|f| f.id)
            .collect();
    assert_eq!(
        ids_before, ids_after,
        "the restarted agent adopts the pinned services (same ids)"
    );
    // The held connection may end before the new agent has loaded its
    // programs (its verifier pass takes longer than the hold's rest).
    c.wait_log("adopted=4", Duration::from_secs(20));
    c.sb.cleanup().expect("cleanup");
}

// ---- API server faults ----
//
// Each fault test: the agent is synced to two pods; the fault starts and
// the open watches are dropped, so the agent has to come back through the
// fault; a change (a third pod) is made during the fault. Traffic to the
// Service keeps flowing to what is programmed, the log names what the
// agent waits for, and once the fault clears the change is programmed, a
// later change too, and `switchboard verify` passes.

impl Cluster {
    /// `switchboard verify` (exit status, stdout).
    fn verify(&self) -> (bool, String) {
        let pin = self.sb.pin_dir.to_string_lossy().into_owned();
        let bin = switchboard().to_string_lossy().into_owned();
        let out = self
            .sb
            .exec_status(&self.sb.node_ns(), &[&bin, "verify", "--pin-root", &pin])
            .expect("switchboard verify");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// Waits until the agent's log contains `needle`.
    fn wait_log(&self, needle: &str, timeout: Duration) {
        xtask::testenv::wait_agent_log(&self.sb, needle, timeout);
    }

    fn synced_to(&mut self, pods: &[usize], what: &str) -> Duration {
        let want = pod_backends(pods, 8080);
        self.wait(what, move |f| {
            Cluster::backends(f, CLUSTER_IP, 80, "TCP") == Some(want.clone())
        })
    }

    fn programmed(&self) -> Option<Vec<String>> {
        let frontends = self.sb.services(&switchboard()).expect("services");
        Cluster::backends(&frontends, CLUSTER_IP, 80, "TCP")
    }
}

/// How the fault in a scenario shows.
struct Fault<'a> {
    /// Starts it (the watches are dropped right after).
    start: &'a dyn Fn(&FakeApiServer),
    /// The agent cannot get a change through while it lasts.
    blocks: bool,
    /// What the agent's log says while it lasts.
    log: &'a str,
}

fn fault_scenario(c: &mut Cluster, fault: Fault<'_>) {
    c.synced_to(&[1, 2], "initial sync");
    (fault.start)(&c.api);
    c.api.drop_watches();
    c.api
        .apply(slice(&[1, 2, 3]))
        .expect("change during the fault");
    std::thread::sleep(Duration::from_millis(1500));
    if fault.blocks {
        assert_eq!(
            c.programmed(),
            Some(pod_backends(&[1, 2], 8080)),
            "the maps keep the last state during the fault"
        );
        assert_eq!(
            c.tcp_names(20),
            vec!["pod1", "pod2"],
            "traffic keeps flowing during the fault"
        );
    } else {
        let names = c.tcp_names(20);
        assert!(!names.is_empty(), "traffic keeps flowing during the fault");
    }
    c.wait_log(fault.log, Duration::from_secs(10));

    c.api.clear_faults();
    let took = c.synced_to(&[1, 2, 3], "the change made during the fault");
    eprintln!("change made during the fault programmed {took:?} after it cleared");
    assert_eq!(c.tcp_names(30), vec!["pod1", "pod2", "pod3"]);
    c.api.apply(slice(&[3])).expect("change after the fault");
    c.synced_to(&[3], "the change after the fault");
    assert_eq!(c.tcp_names(10), vec!["pod3"]);
    let (ok, text) = c.verify();
    assert!(ok, "switchboard verify after the fault:\n{text}");
    c.sb.cleanup().expect("cleanup");
}

#[test]
fn http_500s_keep_the_maps_and_the_agent_converges_once_they_stop() {
    let mut c = Cluster::start(&[1, 2]);
    fault_scenario(
        &mut c,
        Fault {
            start: &|api| {
                api.set_faults(Faults {
                    fail_next: u64::MAX,
                    ..Faults::default()
                })
            },
            blocks: true,
            log: "endpointslices watch failing: watch answered HTTP 500 InternalError",
        },
    );
}

#[test]
fn throttling_with_retry_after_keeps_the_maps_and_the_agent_converges() {
    let mut c = Cluster::start(&[1, 2]);
    fault_scenario(
        &mut c,
        Fault {
            start: &|api| {
                api.set_faults(Faults {
                    throttle_next: u64::MAX,
                    retry_after: Duration::from_secs(1),
                    ..Faults::default()
                })
            },
            blocks: true,
            log: "endpointslices watch failing: watch answered HTTP 429 TooManyRequests",
        },
    );
}

#[test]
fn slow_answers_are_waited_for_and_answers_slower_than_the_read_timeout_are_retried() {
    // Watches last 2 s; a read with no byte for 3 s has failed.
    let mut c = Cluster::start_with(&[1, 2], &["--watch-timeout", "2"]);
    c.synced_to(&[1, 2], "initial sync");
    // Slow but within the read timeout: the change gets through while the
    // fault lasts.
    c.api.set_faults(Faults {
        delay: Duration::from_millis(1000),
        ..Faults::default()
    });
    c.api.drop_watches();
    let started = Instant::now();
    c.api.apply(slice(&[1, 2, 4])).expect("change");
    assert_eq!(c.tcp_names(10).len(), 2, "traffic keeps flowing");
    c.synced_to(&[1, 2, 4], "a change through slow answers");
    let took = started.elapsed();
    eprintln!("change through 1 s answers programmed after {took:?}");
    assert!(
        took >= Duration::from_millis(1000),
        "the delay was in effect ({took:?})"
    );
    c.api.clear_faults();
    c.api.apply(slice(&[1, 2])).expect("back to two pods");
    // Slower than the read timeout: every attempt fails until it clears.
    fault_scenario(
        &mut c,
        Fault {
            start: &|api| {
                api.set_faults(Faults {
                    delay: Duration::from_secs(5),
                    ..Faults::default()
                })
            },
            blocks: true,
            log: "watch failing: watch request timed out",
        },
    );
}

#[test]
fn watches_cut_mid_event_are_resumed_and_every_change_arrives() {
    let mut c = Cluster::start(&[1, 2]);
    c.synced_to(&[1, 2], "initial sync");
    let watches_before = c.api.watches(Kind::EndpointSlice);
    // Cut every watch in the middle of a line, again and again, while the
    // slice changes; traffic flows all along.
    let started = Instant::now();
    let mut step = 0usize;
    let mut failed = 0;
    while started.elapsed() < Duration::from_secs(3) {
        c.api.cut_watches_mid_event();
        let pods: &[usize] = if step.is_multiple_of(2) {
            &[1, 2, 3]
        } else {
            &[1, 2]
        };
        c.api.apply(slice(pods)).expect("change between cuts");
        step += 1;
        let run =
            c.sb.client(
                &sb_echo(),
                &[
                    "--tcp",
                    &format!("{CLUSTER_IP}:80"),
                    "--count",
                    "5",
                    "--timeout-ms",
                    "500",
                ],
            )
            .expect("client");
        failed += run.failures();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(failed, 0, "connections failed while watches were cut");
    // Each cut fails the watch; the watcher re-watches after its backoff
    // (reset by the next event), so cuts closer together than the backoff
    // are taken together.
    assert!(
        c.api.watches(Kind::EndpointSlice) > watches_before,
        "the agent re-watched after the cuts"
    );
    c.wait_log(
        "endpointslices watch failing: watch: ",
        Duration::from_secs(5),
    );
    c.api.apply(slice(&[3])).expect("change after the cuts");
    c.synced_to(&[3], "the change after the cuts");
    assert_eq!(c.tcp_names(10), vec!["pod3"]);
    let (ok, text) = c.verify();
    assert!(ok, "switchboard verify after the cuts:\n{text}");
    c.sb.cleanup().expect("cleanup");
}

#[test]
fn a_silent_watch_is_restarted_after_its_timeout_and_a_quarter() {
    // Watches last 2 s: one silent for 3 s is dead.
    let mut c = Cluster::start_with(&[1, 2], &["--watch-timeout", "2"]);
    fault_scenario(
        &mut c,
        Fault {
            start: &|api| {
                api.set_faults(Faults {
                    silent_watches: true,
                    ..Faults::default()
                })
            },
            blocks: true,
            log: "endpointslices watch silent: no event or bookmark for 3s; restarting it",
        },
    );
}

#[test]
fn verify_reports_a_damaged_map_per_frontend() {
    // Repairs off: the damage stays for verify to find.
    let mut c = Cluster::start_with(&[1, 2], &["--repair-interval", "0"]);
    c.synced_to(&[1, 2], "initial sync");
    let (ok, text) = c.verify();
    assert!(ok, "{text}");
    assert!(
        text.contains("The maps match the agent's desired state."),
        "{text}"
    );
    // Damage the maps behind the agent's back: slot 0 of the ClusterIP
    // frontend claims a third backend whose slot does not exist.
    // The frontend map's pin name (proxy_common::names::FRONTENDS).
    let pin = c.sb.pin_dir.join("SB_FE_V1").to_string_lossy().into_owned();
    let dump =
        c.sb.exec(
            &c.sb.node_ns(),
            &["bpftool", "-j", "map", "dump", "pinned", &pin],
        )
        .expect("bpftool map dump");
    let entries: Vec<Value> = serde_json::from_slice(&dump.stdout).expect("bpftool json");
    let head = entries
        .iter()
        .find(|e| {
            let k = &e["formatted"]["key"];
            k["slot"] == 0 && k["scope"] == 0 && k["port_be"] == 80u16.to_be() && k["proto"] == 6
        })
        .expect("slot 0 of the ClusterIP frontend");
    let mut key: Vec<String> = hex_bytes(&head["key"]);
    let mut value: Vec<String> = hex_bytes(&head["value"]);
    assert_eq!(key.len(), 12, "{head}");
    // backend_count (u16 after backend_id and service_id): 2 → 3.
    value[8] = "0x03".into();
    let mut args = vec!["bpftool", "map", "update", "pinned", pin.as_str(), "key"];
    let key_refs: Vec<&str> = key.iter_mut().map(|s| s.as_str()).collect();
    args.extend(key_refs);
    args.push("value");
    args.extend(value.iter().map(String::as_str));
    c.sb.exec(&c.sb.node_ns(), &args)
        .expect("bpftool map update");
    let (ok, text) = c.verify();
    eprintln!("{text}");
    assert!(!ok, "verify must fail on a damaged map:\n{text}");
    assert!(
        text.contains("10.96.0.10:80/TCP")
            && text.contains("dangling-slot")
            && text.contains("slot 3 of 3 is absent"),
        "{text}"
    );
    c.sb.cleanup().expect("cleanup");
}

/// bpftool's `["0x0a", ...]` byte list.
fn hex_bytes(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|b| b.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The problems `switchboard services` lists, once one contains `needle`.
fn wait_problem(c: &Cluster, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let table = c.sb.services_raw(&switchboard(), false).expect("services");
        let problems = table
            .split_once("PROBLEMS (")
            .map(|(_, p)| p.to_owned())
            .unwrap_or_default();
        if problems.contains(needle) {
            return problems;
        }
        assert!(
            Instant::now() < deadline,
            "no problem naming {needle:?}:\n{table}\n--- agent log ---\n{}",
            c.sb.read_log("agent")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An object the agent cannot read (a field of the wrong type, as
/// a broken controller or a schema skew might send) costs only itself. In
/// the first list page, the good Service is programmed and answers, the bad
/// Service and EndpointSlice are reported by name with the field at fault;
/// a bad version arriving by watch keeps the last good one (the Service
/// keeps answering from it), and a good version clears the problem.
#[test]
fn an_object_that_cannot_be_read_is_reported_by_name_and_the_rest_is_programmed() {
    let broken_service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "broken", "namespace": "demo"},
        "spec": {"clusterIP": "10.96.0.99", "clusterIPs": ["10.96.0.99"],
                 "ports": [{"name": "http", "protocol": "TCP", "port": "eighty"}]}
    });
    // A second slice of the echo Service, with pod 3: were it read, pod 3
    // would be a backend.
    let mut broken_slice = slice(&[3]);
    broken_slice["metadata"]["name"] = json!("echo-broken");
    broken_slice["endpoints"][0]["conditions"]["ready"] = json!("yes");
    let mut c = Cluster::start_serving(&[1, 2], &[], &[broken_service, broken_slice]);
    c.wait("ClusterIP with the good slice's 2 backends", |f| {
        Cluster::backends(f, CLUSTER_IP, 80, "TCP") == Some(pod_backends(&[1, 2], 8080))
    });
    assert_eq!(c.tcp_names(20), ["pod1", "pod2"]);
    let problems = wait_problem(&c, "Service demo/broken");
    assert!(
        problems.contains(
            "Service demo/broken: spec.ports[0].port: invalid type: string \"eighty\", expected i32; not used until a version that can be read arrives"
        ),
        "{problems}"
    );
    assert!(
        problems.contains(
            "EndpointSlice demo/echo-broken: endpoints[0].conditions.ready: invalid type: string \"yes\", expected a boolean; not used"
        ),
        "{problems}"
    );
    let frontends = c.sb.services(&switchboard()).expect("services");
    assert!(
        !frontends.iter().any(|f| f.address == "10.96.0.99"),
        "the broken Service has no frontend"
    );

    // By watch: a bad version of the good slice keeps its last good one.
    let mut bad = slice(&[1]);
    bad["endpoints"][0]["addresses"] = json!("10.244.0.1");
    c.api.apply(bad).expect("bad slice");
    let problems = wait_problem(&c, "EndpointSlice demo/echo-abc12");
    assert!(
        problems.contains(
            "EndpointSlice demo/echo-abc12: endpoints[0].addresses: invalid type: string \"10.244.0.1\", expected a sequence of strings; keeping the last version that could be read"
        ),
        "{problems}"
    );
    assert_eq!(
        c.tcp_names(20),
        ["pod1", "pod2"],
        "the last good version is kept"
    );

    // Good versions of both: used, and the problems are gone.
    c.api.apply(slice(&[2])).expect("slice");
    let mut fixed = slice(&[3]);
    fixed["metadata"]["name"] = json!("echo-broken");
    c.api.apply(fixed).expect("fixed slice");
    c.wait("ClusterIP with pods 2 and 3", |f| {
        Cluster::backends(f, CLUSTER_IP, 80, "TCP") == Some(pod_backends(&[2, 3], 8080))
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let table = c.sb.services_raw(&switchboard(), false).expect("services");
        if !table.contains("echo-abc12") && !table.contains("echo-broken") {
            assert!(table.contains("Service demo/broken"), "{table}");
            break;
        }
        assert!(Instant::now() < deadline, "problems linger:\n{table}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(c.tcp_names(20), ["pod2", "pod3"]);
    c.sb.cleanup().expect("cleanup");
}
