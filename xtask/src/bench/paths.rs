//! The end-to-end paths: which sandbox each runs in, where its clients
//! run (a pod or the host, inside the cgroup the socket layer hooks or
//! not) and where they send (the pods, a Service, one Service per pod, or
//! the address all pods share); the keys results.json gives their rows.

use std::process::{Command, Stdio};

use anyhow::Result;

use super::workload;
use crate::sandbox::{self, Sandbox};

/// Where a benchmark client runs: which namespace, and whether it is a member
/// of the sandbox's cgroup (the one the agent's socket layer is attached to).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    /// The client namespace (a pod), outside the cgroup: Service traffic is
    /// translated per packet (switchboard's tc programs, or the NAT rules).
    Pod,
    /// The second client namespace ([`Sandbox::add_second_client`]: a pod
    /// of its own, on its own pod interface), outside the cgroup.
    SecondPod,
    /// The client namespace, inside the cgroup: the socket layer picks the
    /// backend at `connect()`.
    PodInCgroup,
    /// The node namespace (the host), inside the cgroup.
    HostInCgroup,
    /// The node namespace, outside the cgroup.
    Host,
}

impl Client {
    pub fn ns(self, sb: &Sandbox) -> String {
        match self {
            Client::Pod | Client::PodInCgroup => sb.client_ns(),
            Client::SecondPod => sb.second_client_ns(),
            Client::Host | Client::HostInCgroup => sb.node_ns(),
        }
    }

    pub fn in_cgroup(self) -> bool {
        matches!(self, Client::PodInCgroup | Client::HostInCgroup)
    }

    /// `cmd` run as this client (stdin closed, stdout and stderr piped).
    pub fn command(self, sb: &Sandbox, cmd: &[&str]) -> Result<Command> {
        let ns = self.ns(sb);
        let mut c = if self.in_cgroup() {
            sb.command_in_cgroup(&ns, cmd)?
        } else {
            sb.command(&ns, cmd)
        };
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Ok(c)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Client::Pod => "client namespace, outside the sandbox's cgroup",
            Client::SecondPod => {
                "a second client namespace (a pod of its own), outside the sandbox's cgroup"
            }
            Client::PodInCgroup => "client namespace, inside the sandbox's cgroup",
            Client::HostInCgroup => "node namespace, inside the sandbox's cgroup",
            Client::Host => "node namespace, outside the sandbox's cgroup",
        }
    }
}

/// Where the clients send to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Each client to its own pod (pod1, pod2, pod3), on the pods' ports.
    Pods,
    /// Every client to the target Service's ClusterIP and ports.
    Service,
    /// Client `i` to the Service whose one endpoint is pod `i`: the spread
    /// of the direct rows, through a Service.
    PinnedServices,
    /// Every client to the address all pods share
    /// ([`Sandbox::add_spread_address`]), on the pods' ports: each
    /// connection lands on one pod by the node's multipath route, as a
    /// balancer spreads them, with no Service.
    Spread,
}

impl Target {
    /// One destination address per client: the pods, or the Service for each.
    pub fn hosts(self) -> Vec<String> {
        (1..=CLIENTS)
            .map(|i| match self {
                Target::Pods => sandbox::pod_ip(i),
                Target::Service => workload::TARGET_IP.to_string(),
                Target::PinnedServices => workload::pinned_ip(i).to_string(),
                Target::Spread => SPREAD_IP.to_string(),
            })
            .collect()
    }

    /// The ports the clients send to.
    pub fn ports(self) -> Ports {
        match self {
            Target::Pods | Target::Spread => Ports {
                http: workload::POD_HTTP_PORT,
                udp: workload::POD_UDP_PORT,
                bulk: workload::POD_BULK_PORT,
                light: workload::POD_LIGHT_PORT,
            },
            Target::Service | Target::PinnedServices => Ports {
                http: workload::HTTP_PORT,
                udp: workload::UDP_PORT,
                bulk: workload::BULK_PORT,
                light: workload::LIGHT_PORT,
            },
        }
    }

    pub fn describe(self) -> String {
        let Ports {
            http,
            udp,
            bulk,
            light,
        } = self.ports();
        match self {
            Target::Pods => format!(
                "pod1, pod2, pod3: one client each ({}–{}, ports {http}, {udp}, light {light}); the stream to pod1:{bulk}",
                sandbox::pod_ip(1),
                sandbox::pod_ip(CLIENTS)
            ),
            Target::Service => format!(
                "the Service {}: all clients (ports {http}, {udp}, light {light}); the stream to :{bulk}",
                workload::TARGET_IP
            ),
            Target::Spread => format!(
                "{SPREAD_IP}, an address of all three pods: every client, each connection to one pod by the node's multipath route (port {http}, light {light}; no UDP, which the pods answer from their own addresses); the stream to one of them"
            ),
            Target::PinnedServices => format!(
                "{}–{}: one Service per client, each with one pod as its endpoint (ports {http}, {udp}, light {light}); the stream to the first",
                workload::pinned_ip(1),
                workload::pinned_ip(CLIENTS)
            ),
        }
    }
}

/// The ports of a target: HTTP (the default workload's wrk), UDP, the
/// stream, and the light workload's server.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub http: u16,
    pub udp: u16,
    pub bulk: u16,
    pub light: u16,
}

/// The server the conn/s clients connect to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// `sb-http serve --http`: 16 threads blocked in accept, each serving
    /// the connection it took (a thread woken per connection).
    Default,
    /// `sb-http serve --light`: one thread, four system calls per
    /// connection.
    Light,
}

/// Which of the four sandboxes a path runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    Direct,
    Switchboard,
    Iptables,
    Nftables,
}

impl Setup {
    pub const fn tag(self) -> &'static str {
        match self {
            Setup::Direct => "sbbdir",
            Setup::Switchboard => "sbbsw",
            Setup::Iptables => "sbbipt",
            Setup::Nftables => "sbbnft",
        }
    }
}

/// One end-to-end path: a sandbox, where its clients run and where they send.
pub struct E2ePath {
    /// The `path` of its rows in results.json.
    pub key: &'static str,
    pub label: &'static str,
    pub setup: Setup,
    pub client: Client,
    pub target: Target,
    /// What spreads the connections over the pods.
    pub balancer: &'static str,
    /// The client namespace's ephemeral ports while this path is measured
    /// (`net.ipv4.ip_local_port_range`), when not the default.
    pub local_ports: Option<&'static str>,
}

/// Keys of the end-to-end paths in results.json (the report looks them up).
pub const DIRECT: &str = "direct";
pub const DIRECT_HOST: &str = "direct_host";
pub const DIRECT_SPREAD: &str = "direct_spread";
pub const DIRECT_SW: &str = "direct_switchboard";
pub const DIRECT_SW_TC: &str = "direct_switchboard_tc";
pub const SW_TC: &str = "switchboard";
pub const SW_SOCK_POD: &str = "socketlb_pod";
pub const SW_SOCK_PINNED: &str = "socketlb_pod_pinned";
pub const SW_SOCK_HOST: &str = "socketlb_host";
pub const IPTABLES: &str = "iptables";
pub const NFTABLES: &str = "nftables";

/// The ephemeral port range of every pod client (each row's client sets it
/// before its measurement), one size for all, so that a client port comes
/// round again as often in every row: the server's TIME_WAIT sockets are met
/// as often, and connect() searches a range as large. The tc row's client is
/// a pod of its own ([`Client::SecondPod`]), so no two rows of one sandbox
/// reach a pod from the same address once through DNAT and once directly
/// (which a pod's TIME_WAIT socket refuses by PAWS until a SYN retransmit).
const POD_LOCAL_PORTS: &str = "47000 60999";

const SOCKET_LB: &str = "switchboard's socket layer (cgroup connect4/sendmsg4/recvmsg4/getpeername4): the backend is chosen once per connect(), packets carry pod addresses and tc leaves them alone";

/// Every end-to-end path, in the order of the first round.
pub const PATHS: [E2ePath; 11] = [
    E2ePath {
        key: DIRECT,
        label: "direct (pod client)",
        setup: Setup::Direct,
        client: Client::Pod,
        target: Target::Pods,
        balancer: "none (no Service): the limit for pod clients",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: DIRECT_SPREAD,
        label: "direct, spread (pod client)",
        setup: Setup::Direct,
        client: Client::Pod,
        target: Target::Spread,
        balancer: "none (no Service, no NAT): the node's multipath route spreads each client's connections over the three pods by a hash of their ports, as a balancer does; the fair limit for the Service paths",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: DIRECT_HOST,
        label: "direct (host client)",
        setup: Setup::Direct,
        client: Client::Host,
        target: Target::Pods,
        balancer: "none (no Service): the limit for host clients",
        local_ports: None,
    },
    E2ePath {
        key: DIRECT_SW,
        label: "direct in switchboard's sandbox (pod client)",
        setup: Setup::Switchboard,
        client: Client::PodInCgroup,
        target: Target::Pods,
        balancer: "none (no Service), through everything switchboard adds to a node: its agent running, its tc programs on the veths and its socket hooks on the client's cgroup; the limit the socket layer can reach",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: DIRECT_SW_TC,
        label: "direct in switchboard's sandbox, outside its cgroup (pod client)",
        setup: Setup::Switchboard,
        client: Client::Pod,
        target: Target::Pods,
        balancer: "none (no Service), through switchboard's agent and its tc programs on the veths but not its socket hooks: with the row above, what the hooks cost apart from the rest",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: SW_TC,
        label: "switchboard (tc, pod client)",
        setup: Setup::Switchboard,
        client: Client::SecondPod,
        target: Target::Service,
        balancer: "switchboard's tc programs on the node's veths (per-packet DNAT and connection tracking)",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: SW_SOCK_POD,
        label: "switchboard socket-LB (pod client)",
        setup: Setup::Switchboard,
        client: Client::PodInCgroup,
        target: Target::Service,
        balancer: SOCKET_LB,
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: SW_SOCK_PINNED,
        label: "switchboard socket-LB, one pod per client",
        setup: Setup::Switchboard,
        client: Client::PodInCgroup,
        target: Target::PinnedServices,
        balancer: "switchboard's socket layer, each client to a Service of one backend (its own pod), as in the direct rows: the socket layer's cost apart from spreading each client over three pods",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: SW_SOCK_HOST,
        label: "switchboard socket-LB (host client)",
        setup: Setup::Switchboard,
        client: Client::HostInCgroup,
        target: Target::Service,
        balancer: SOCKET_LB,
        local_ports: None,
    },
    E2ePath {
        key: IPTABLES,
        label: "iptables",
        setup: Setup::Iptables,
        client: Client::Pod,
        target: Target::Service,
        balancer: "kube-proxy-style iptables NAT rules in the node namespace (conntrack)",
        local_ports: Some(POD_LOCAL_PORTS),
    },
    E2ePath {
        key: NFTABLES,
        label: "nftables",
        setup: Setup::Nftables,
        client: Client::Pod,
        target: Target::Service,
        balancer: "kube-proxy-style nftables NAT rules in the node namespace (conntrack)",
        local_ports: Some(POD_LOCAL_PORTS),
    },
];

/// The address all pods of the direct sandbox share ([`Target::Spread`]).
pub const SPREAD_IP: &str = "10.244.200.1";

/// Clients run in parallel per measurement (wrk and UDP): one per pod.
pub const CLIENTS: usize = sandbox::PODS;

impl E2ePath {
    /// Readies the client before a measurement: its own ephemeral port
    /// range, and no conntrack entries of earlier connections in the NAT
    /// rows.
    pub fn prepare(&self, sb: &Sandbox) -> Result<()> {
        if matches!(self.setup, Setup::Iptables | Setup::Nftables) {
            // Forget earlier connections (conntrack is per namespace).
            let _ = sb.exec_status(&sb.node_ns(), &["conntrack", "-F"]);
        }
        if let Some(range) = self.local_ports {
            let ns = self.client.ns(sb);
            sb.exec(
                &ns,
                &[
                    "sysctl",
                    "-qw",
                    &format!("net.ipv4.ip_local_port_range={range}"),
                ],
            )?;
        }
        Ok(())
    }

    /// The wrk targets of `workload`: one URL per client.
    pub fn urls(&self, workload: Workload) -> Vec<String> {
        let ports = self.target.ports();
        let port = match workload {
            Workload::Default => ports.http,
            Workload::Light => ports.light,
        };
        self.target
            .hosts()
            .iter()
            .map(|h| format!("http://{h}:{port}/"))
            .collect()
    }
}
