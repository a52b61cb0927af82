//! Netns end-to-end tests of hostNetwork pods (root only): a backend that is
//! a node itself (an EndpointSlice whose endpoint is node B's own address,
//! served by a process in node B's namespace, as node-exporter or an
//! ingress controller with `hostNetwork: true` is), and clients in a node's
//! namespace. Two-node kind-like sandbox (`xtask::sandbox::two_node`), an
//! agent on each node with the default flags.
//!
//! What kube-proxy does, and is asserted here:
//! - a NodePort through node A to the backend on node B is source-NATed to
//!   node A, so the backend sees 192.168.50.1;
//! - a NodePort through node B, whose own address is the backend, is
//!   delivered to node B's socket with the client's address;
//! - a ClusterIP reaches the host backend from a pod (the tc layer) and from
//!   either node's own namespace (the socket layer), the backend's node
//!   included.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use xtask::sandbox::two_node::manifests::{ExternalService, Policy, NODEPORT_TCP, NODEPORT_UDP};
use xtask::sandbox::two_node::{Client, Node, Pod, CLIENT_IPS};
use xtask::sandbox::{client_run, ClientRun, PodSpec, TwoNodeSandbox, POD_TCP_PORT, POD_UDP_PORT};
use xtask::testenv::{pod_saw_ips, sb_echo, switchboard, two_node_sandbox};

/// The hostNetwork backend's name (`sb-echo --name`).
const HOST_B: &str = "hostB";
/// `ext/web`'s ClusterIP and ports.
const CLUSTER_TCP: &str = "10.96.0.20:80";
const CLUSTER_UDP: &str = "10.96.0.20:53";

/// `ext/web`'s EndpointSlice with node B's own address as its one endpoint.
fn host_endpoint_slice() -> String {
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
         metadata:\n  name: web-1\n  namespace: ext\n  labels:\n    kubernetes.io/service-name: web\n\
         endpoints:\n- addresses:\n  - {ip}\n  conditions:\n    ready: true\n  nodeName: {node}\n\
         ports:\n- name: http\n  port: {POD_TCP_PORT}\n  protocol: TCP\n- name: dns\n  port: {POD_UDP_PORT}\n  protocol: UDP\n",
        ip = Node::B.ip(),
        node = Node::B.name()
    )
}

/// The sandbox with `ext/web` (NodePort, `Cluster`) backed by a server in
/// node B's namespace, and both agents running.
fn host_backed() -> TwoNodeSandbox {
    let mut sb = two_node_sandbox();
    let echo = sb_echo();
    let server = PodSpec {
        ns: sb.node_ns(Node::B),
        name: HOST_B.to_owned(),
        targets: vec![
            ("--tcp", format!("{}:{POD_TCP_PORT}", Node::B.ip())),
            ("--udp", format!("{}:{POD_UDP_PORT}", Node::B.ip())),
        ],
    };
    let from = sb.client_ns(Client::One);
    xtask::sandbox::NetnsCore::start_pods(&mut sb, &echo, &[server], &from)
        .expect("start the hostNetwork server on node B");
    sb.write_nodes().expect("write the Node manifests");
    let service = ExternalService::NodePort;
    sb.write_manifest(&service.service_file(), &service.yaml(Policy::Cluster))
        .expect("write the Service");
    sb.write_manifest(&service.slice_file(), &host_endpoint_slice())
        .expect("write the EndpointSlice");
    let sw = switchboard();
    for node in Node::ALL {
        sb.start_agent(node, &sw, &[])
            .unwrap_or_else(|e| panic!("start the agent of {}: {e:#}", node.name()));
    }
    sb
}

/// Retries `run` until every attempt succeeds (the agents program their
/// maps a moment after they start) or 10 s pass; returns the last run.
fn until_ok(mut run: impl FnMut() -> ClientRun) -> ClientRun {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = run();
        if got.all_ok() || Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `sb-echo client <args>` in `node`'s namespace as a member of its cgroup
/// (a hostNetwork client, balanced by the socket layer).
fn host_client(sb: &TwoNodeSandbox, node: Node, args: &[&str]) -> ClientRun {
    let echo = sb_echo().to_string_lossy().into_owned();
    let ns = sb.node_ns(node);
    let mut cmd = vec![echo.as_str(), "client"];
    cmd.extend_from_slice(args);
    let mut c = sb.command(&ns, &cmd);
    sb.cgroup(node)
        .expect("node cgroup")
        .join_on_exec(&mut c)
        .expect("join the node's cgroup");
    let out = c.output().expect("run sb-echo client");
    client_run(&out, &ns, args).unwrap_or_else(|e| panic!("{e:#}"))
}

fn only_host_b(run: &ClientRun, what: &str) {
    assert!(run.all_ok(), "{what}: {}", run.raw);
    assert_eq!(
        run.names().into_iter().collect::<BTreeSet<_>>(),
        BTreeSet::from([HOST_B.to_owned()]),
        "{what}: {}",
        run.raw
    );
}

/// NodePorts from outside to a hostNetwork backend, through the other node
/// (source-NATed) and through the backend's own node (the client's address
/// kept), over TCP and UDP.
#[test]
fn a_nodeport_reaches_a_host_network_backend_through_either_node() {
    let sb = host_backed();
    let echo = sb_echo();
    for (via, peer) in [(Node::A, Node::A.ip()), (Node::B, CLIENT_IPS[0])] {
        for (flag, port) in [("--tcp", NODEPORT_TCP), ("--udp", NODEPORT_UDP)] {
            let addr = format!("{}:{port}", via.ip());
            let run = until_ok(|| {
                sb.client(&echo, Client::One, &[flag, &addr, "--count", "5"])
                    .unwrap_or_else(|e| panic!("{e:#}"))
            });
            let what = format!("{flag} {addr} through {}", via.name());
            only_host_b(&run, &what);
            assert_eq!(
                pod_saw_ips(&run),
                BTreeSet::from([peer.to_owned()]),
                "{what}: {}",
                run.raw
            );
        }
    }
}

/// The ClusterIP of a hostNetwork backend from a pod on the other node (tc
/// layer), and from both nodes' own namespaces (socket layer: hostNetwork
/// clients), the backend's node included.
#[test]
fn a_cluster_ip_reaches_a_host_network_backend_from_pods_and_hosts() {
    let sb = host_backed();
    let echo = sb_echo();
    let pod = sb.pod_ns(Pod::new(Node::A, 1));
    for (flag, addr) in [("--tcp", CLUSTER_TCP), ("--udp", CLUSTER_UDP)] {
        let run = until_ok(|| {
            sb.client_in(&echo, &pod, &[flag, addr, "--count", "5"])
                .unwrap_or_else(|e| panic!("{e:#}"))
        });
        only_host_b(&run, &format!("{flag} {addr} from podA1"));
        for node in Node::ALL {
            let run = until_ok(|| host_client(&sb, node, &[flag, addr, "--count", "5"]));
            only_host_b(&run, &format!("{flag} {addr} from {}'s host", node.name()));
            assert_eq!(run.client_saw(), vec![addr.to_owned()], "{}", run.raw);
        }
    }
}
