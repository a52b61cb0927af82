//! The `switchboard` binary: agent and CLI.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use proxy_user::{
    agent::{self, AgentConfig, Source},
    attach::TcMode,
    cidr::Ipv4Cidr,
    cli,
    ebpf::Capacities,
    model::LbAlgorithm,
    uplink::XdpMode,
};
use tracing_subscriber::EnvFilter;

use proxy_user::cli::DEFAULT_PIN_ROOT;

#[derive(Parser)]
#[command(
    name = "switchboard",
    version,
    about = "eBPF Service load balancer (kube-proxy replacement)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load the programs, attach them to pod interfaces and keep the maps in
    /// step with the Services and EndpointSlices of the source.
    Agent {
        /// `dir:PATH` (a directory of YAML manifests, followed as it changes)
        /// or `cluster` (the Kubernetes API server).
        #[arg(long, default_value = "cluster")]
        source: Source,
        /// Where the maps are pinned (bpffs is mounted there if missing).
        #[arg(long, default_value = DEFAULT_PIN_ROOT, env = "SWITCHBOARD_PIN_ROOT")]
        pin_root: PathBuf,
        /// Capacity of the frontend map (one entry per service port plus one per backend).
        #[arg(long, default_value_t = Capacities::default().frontends)]
        max_frontend_entries: u32,
        /// Capacity of the backend map.
        #[arg(long, default_value_t = Capacities::default().backends)]
        max_backends: u32,
        /// Capacity of the connection-tracking map (two entries per flow).
        #[arg(long, default_value_t = Capacities::default().conntrack)]
        max_conntrack: u32,
        /// Number of service ports (service ids).
        #[arg(long, default_value_t = Capacities::default().services)]
        max_services: u32,
        /// Kubeconfig for `--source cluster` (default: in-cluster service
        /// account, then KUBECONFIG, then ~/.kube/config).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// This node's name (default: $NODE_NAME, then the hostname).
        #[arg(long, env = "NODE_NAME")]
        node_name: Option<String>,
        /// Serve Services labelled `service.kubernetes.io/service-proxy-name`
        /// with this value (Services naming any other proxy are skipped).
        #[arg(long)]
        proxy_name: Option<String>,
        /// Balance at the socket layer (cgroup connect/sendmsg/recvmsg/
        /// getpeername hooks): clients in the node's network namespace reach
        /// ClusterIPs, and balanced flows need no per-packet NAT.
        /// `--socket-lb=false` turns it off and detaches what is attached.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        socket_lb: bool,
        /// The cgroup the socket layer attaches to (default: the host's cgroup2
        /// mount, found in /proc/self/mountinfo). Every process in it and below
        /// is balanced.
        #[arg(long)]
        cgroup_root: Option<PathBuf>,
        /// How the tc programs attach to pod interfaces: TCX links (Linux
        /// 6.6+, pinned under the pin root), netlink clsact filters, or TCX
        /// where the kernel has it.
        #[arg(long, value_enum, default_value_t = TcMode::Auto)]
        tc_attach: TcMode,
        /// An interface traffic from outside the node arrives on (repeat for
        /// several). Default: the interfaces holding the Node's InternalIP or
        /// ExternalIP, else the default route's interface. NodePorts,
        /// LoadBalancer IPs and external IPs are served there.
        #[arg(long = "uplink", value_name = "IFACE")]
        uplinks: Vec<String>,
        /// How the uplink program runs: `native` (in the driver; veth
        /// included; falls back to generic where the driver has no XDP),
        /// `generic` (the kernel's generic XDP hook), or `off` (a tc ingress
        /// program instead).
        #[arg(long, value_enum, default_value_t = XdpMode::Native)]
        xdp_mode: XdpMode,
        /// How new flows from outside the node pick a backend when the Service
        /// has no `switchboard.io/lb-algorithm` annotation: `random`, `maglev`
        /// (consistent hashing of the 5-tuple: every node picks alike) or
        /// `source-hash` (by client address).
        #[arg(long, value_enum, default_value_t = LbAlgorithm::Random)]
        lb_algorithm: LbAlgorithm,
        /// Serve NodePorts on this node's interface addresses within these
        /// CIDRs (comma-separated or repeated), as kube-proxy's flag does.
        /// Default: the Node's InternalIP and ExternalIP.
        #[arg(long, value_name = "CIDR", value_delimiter = ',')]
        nodeport_addresses: Vec<Ipv4Cidr>,
        /// Serve `/healthz` and `/livez` here, as kube-proxy does on 10256
        /// (empty: off).
        #[arg(long, value_name = "IP:PORT", default_value = "0.0.0.0:10256", value_parser = parse_bind)]
        healthz_bind_address: Bind,
        /// Serve Prometheus `/metrics` here, as kube-proxy does on 10249
        /// (empty: off).
        #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:10249", value_parser = parse_bind)]
        metrics_bind_address: Bind,
    },
    #[command(flatten)]
    Ops(cli::Command),
}

/// A listen address, or none (the empty string turns the server off).
#[derive(Clone, Copy, Debug)]
struct Bind(Option<std::net::SocketAddr>);

fn parse_bind(s: &str) -> Result<Bind, std::net::AddrParseError> {
    if s.is_empty() {
        return Ok(Bind(None));
    }
    s.parse().map(|a| Bind(Some(a)))
}

fn main() -> anyhow::Result<()> {
    // netlink-packet-route warns about every attribute newer than itself.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        .add_directive("netlink_packet_route=error".parse()?);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Agent {
            source,
            pin_root,
            max_frontend_entries,
            max_backends,
            max_conntrack,
            max_services,
            kubeconfig,
            node_name,
            proxy_name,
            socket_lb,
            cgroup_root,
            tc_attach,
            uplinks,
            xdp_mode,
            lb_algorithm,
            nodeport_addresses,
            healthz_bind_address,
            metrics_bind_address,
        } => {
            let socket_lb_cgroup = match (socket_lb, cgroup_root) {
                (false, _) => None,
                (true, Some(root)) => Some(root),
                (true, None) => Some(
                    proxy_user::socketlb::find_cgroup_root()
                        .context("finding the cgroup root for the socket layer")?,
                ),
            };
            let node_name = match node_name {
                Some(name) => name,
                None => nix::unistd::gethostname()
                    .context("reading the hostname for --node-name")?
                    .to_string_lossy()
                    .into_owned(),
            };
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(agent::run(AgentConfig {
                source,
                pin_root,
                capacities: Capacities {
                    frontends: max_frontend_entries,
                    backends: max_backends,
                    conntrack: max_conntrack,
                    services: max_services,
                },
                kubeconfig,
                node_name,
                proxy_name,
                socket_lb_cgroup,
                tc_mode: tc_attach,
                uplinks,
                xdp_mode,
                lb_algorithm,
                nodeport_addresses,
                healthz_bind: healthz_bind_address.0,
                metrics_bind: metrics_bind_address.0,
            }))
        }
        Command::Ops(command) => cli::run(command),
    }
}
