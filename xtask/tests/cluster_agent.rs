//! The agent with `--source cluster`, unmodified, against the fake API server
//! (real HTTP: list + watch, resourceVersions, bookmarks, 410 Gone), in a
//! netns sandbox with real traffic. Root only; run by `cargo xtask test`.
//!
//! The fake server's listening socket lives in the sandbox's node namespace,
//! where the agent runs, so the agent reaches it at 127.0.0.1.
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use xtask::fake_apiserver::{FakeApiServer, Kind};
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
}

impl Cluster {
    /// Sandbox with pods, the fake API server in the node namespace holding
    /// this node, and the agent watching it.
    fn start(pods: &[usize]) -> Cluster {
        xtask::testenv::require_root();
        let mut sb = Sandbox::for_test().expect("sandbox");
        sb.start_pods(&sb_echo()).expect("pods");
        let api = FakeApiServer::start_in_netns(Some(&sb.node_ns()), "127.0.0.1:0")
            .expect("fake API server");
        api.apply(node()).expect("node");
        api.apply(service()).expect("service");
        api.apply(slice(pods)).expect("slice");
        let kubeconfig = sb.dir.join("kubeconfig");
        api.write_kubeconfig(&kubeconfig).expect("kubeconfig");
        let mut cluster = Cluster { sb, api };
        cluster.start_agent(&kubeconfig);
        cluster
    }

    fn start_agent(&mut self, kubeconfig: &std::path::Path) {
        let bin = switchboard().to_string_lossy().into_owned();
        let pin = self.sb.pin_dir.to_string_lossy().into_owned();
        let kc = kubeconfig.to_string_lossy().into_owned();
        let node = self.sb.node_ns();
        self.sb
            .spawn(
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
                    NODE_NAME,
                    "--pin-root",
                    &pin,
                ],
            )
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
    assert_eq!(c.tcp_names(15), vec!["pod1", "pod2", "pod3"]);
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
    let log = c.sb.read_log("agent");
    assert!(
        log.contains("adopted=4"),
        "agent log does not show adoption:\n{log}"
    );
    c.sb.cleanup().expect("cleanup");
}
