//! The agent's configuration: what `switchboard agent`'s flags and
//! `--config` file come to (`args.rs` builds it).
use std::{path::PathBuf, time::Duration};

use crate::{
    dataplane::attach::pods::TcMode,
    dataplane::attach::socket_layer,
    dataplane::attach::uplink::XdpMode,
    model::{self, cidr::IpCidr},
    source::cluster,
    sync::store::Capacities,
};

/// Where the agent learns Services and EndpointSlices from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A directory of YAML manifests (standalone mode).
    Dir(PathBuf),
    /// The Kubernetes API server.
    Cluster,
}

impl std::str::FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("dir", path)) if !path.is_empty() => Ok(Self::Dir(PathBuf::from(path))),
            None if s == "cluster" => Ok(Self::Cluster),
            _ => Err(format!(
                "unknown source {s:?}: expected dir:PATH or cluster"
            )),
        }
    }
}

pub struct AgentConfig {
    /// The connection-tracking timeouts (`--conntrack-*`).
    pub conntrack_timeouts: crate::dataplane::flows::expiry::Timeouts,
    pub source: Source,
    pub pin_root: PathBuf,
    pub capacities: Capacities,
    /// `--max-endpoints-per-service`.
    pub max_endpoints_per_service: u16,
    /// For the cluster source: a kubeconfig file instead of inference.
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (NodePort addresses, `Local` policies, topology).
    pub node_name: String,
    /// Our `service.kubernetes.io/service-proxy-name`; Services naming another
    /// proxy are skipped.
    pub proxy_name: Option<String>,
    /// The cgroup the socket-layer programs attach to; `None` turns the socket
    /// layer off (and removes what an earlier agent attached).
    pub socket_lb_cgroup: Option<PathBuf>,
    /// Whose sockets the socket layer balances.
    pub socket_lb_scope: socket_layer::SocketScope,
    /// How the tc programs attach to pod interfaces.
    pub tc_mode: TcMode,
    /// `--repair-interval`: how often drift is looked for (zero: never
    /// repaired).
    pub repair_interval: Duration,
    /// `--uplink`: the interfaces traffic from outside arrives on (empty:
    /// found from the node's addresses or the default route).
    pub uplinks: Vec<String>,
    /// How the uplink program runs.
    pub xdp_mode: XdpMode,
    /// `--lb-algorithm`: for Services without the annotation.
    pub lb_algorithm: model::LbAlgorithm,
    /// `--nodeport-mode`: source NAT or direct server return.
    pub nodeport_mode: crate::dataplane::attach::uplink::NodePortMode,
    /// `--nodeport-addresses`: NodePorts on the interface addresses in these
    /// blocks instead of the Node's addresses.
    pub nodeport_addresses: Vec<IpCidr>,
    /// `--healthz-bind-address`: `/healthz` and `/livez` (`None`: off).
    pub healthz_bind: Option<std::net::SocketAddr>,
    /// `--metrics-bind-address`: Prometheus `/metrics` (`None`: off).
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// `--watch-timeout`: how long each watch lasts, and so when a silent
    /// one is restarted.
    pub watch_timing: cluster::WatchTiming,
}
