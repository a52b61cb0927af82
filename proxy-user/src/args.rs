//! The agent's flags, an optional YAML config file with the same settings
//! (`--config`, as kube-proxy has), and the [`AgentConfig`] they make.
use std::{collections::BTreeMap, ffi::OsString, path::PathBuf, time::Duration};

use anyhow::Context as _;

use crate::{
    agent::{AgentConfig, Source},
    dataplane::attach::pods::TcMode,
    dataplane::attach::socket_layer::SocketScope,
    dataplane::attach::uplink::{NodePortMode, XdpMode},
    dataplane::flows::expiry::Timeouts,
    dataplane::pins::format::DEFAULT_PIN_ROOT,
    model::cidr::IpCidr,
    model::LbAlgorithm,
    sync::store::Capacities,
};

/// `switchboard agent`'s flags.
#[derive(Clone, Debug, clap::Args)]
pub struct AgentArgs {
    /// A YAML file of settings (`kind: SwitchboardConfiguration`): each key is
    /// a flag's name in camelCase (`pinRoot`, `xdpMode`, `uplink: [eth0]`).
    /// Flags given on the command line win over the file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Remove everything an agent attached and pinned under the pin root,
    /// then exit (kube-proxy's `--cleanup`; same as `switchboard cleanup`).
    #[arg(long)]
    pub cleanup: bool,
    /// `dir:PATH` (a directory of YAML manifests, followed as it changes)
    /// or `cluster` (the Kubernetes API server).
    #[arg(long, default_value = "cluster")]
    pub source: Source,
    /// Where the maps are pinned: a directory on a bpffs that outlives the
    /// agent (a plain directory is refused).
    #[arg(long, default_value = DEFAULT_PIN_ROOT, env = "SWITCHBOARD_PIN_ROOT")]
    pub pin_root: PathBuf,
    /// Capacity of the frontend map (one entry per service port plus one per backend).
    #[arg(long, default_value_t = Capacities::default().frontends, value_parser = capacity)]
    pub max_frontend_entries: u32,
    /// Capacity of the backend map.
    #[arg(long, default_value_t = Capacities::default().backends, value_parser = capacity)]
    pub max_backends: u32,
    /// Capacity of the connection-tracking map (two entries per flow;
    /// allocated per entry, so an idle table costs 16 bytes an entry). When
    /// it is full a new flow's packet is dropped and counted (`ct_full`);
    /// tracked flows are never evicted for new ones. Also the most the
    /// socket layer's translation tables grow to.
    #[arg(long, default_value_t = Capacities::default().conntrack, value_parser = capacity)]
    pub max_conntrack: u32,
    /// The size the LRU flow tables start at (the socket layer's
    /// translations, session affinity, fragments; both families), at
    /// least 512 per CPU. The kernel preallocates an LRU table whole, so
    /// each starts this small and the agent grows it online (a restart in
    /// place, same pid, no entry lost; twice the size or more) when it is
    /// half full, up to its maximum (`--max-conntrack` for the socket
    /// layer's).
    #[arg(long, default_value_t = Capacities::default().flow_start, value_parser = capacity)]
    pub flow_table_start_entries: u32,
    /// How long an idle established TCP connection stays tracked
    /// (kube-proxy's flag). Durations as kube-proxy writes them: `24h0m0s`,
    /// `90m`, `30s`; `0` (kube-proxy: leave the kernel's setting) takes the
    /// default.
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_duration)]
    pub conntrack_tcp_timeout_established: Duration,
    /// How long an idle half-closed TCP connection (FIN seen one way) stays
    /// tracked (kube-proxy's flag).
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub conntrack_tcp_timeout_close_wait: Duration,
    /// How long a closed TCP connection (FIN both ways, or RST) stays
    /// tracked after its last packet. Source-NATed flows from outside keep
    /// their port at least 65 s after the close (the backend's TIME_WAIT).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub conntrack_tcp_timeout_closed: Duration,
    /// How long a TCP connection whose SYN was never answered stays tracked.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub conntrack_tcp_timeout_syn: Duration,
    /// How long an idle UDP flow that saw no reply stays tracked
    /// (kube-proxy's flag; the kernel's default).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub conntrack_udp_timeout: Duration,
    /// How long an idle UDP flow that saw replies stays tracked (kube-proxy's
    /// flag; the kernel's default).
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_duration)]
    pub conntrack_udp_timeout_stream: Duration,
    /// Number of service ports (service ids).
    #[arg(long, default_value_t = Capacities::default().services, value_parser = capacity)]
    pub max_services: u32,
    /// The most endpoints one service port gets (up to 16380, what the data
    /// path and a Maglev table can index). A Service port with more is
    /// programmed with the first ones in address order, and reported.
    #[arg(long, default_value_t = proxy_common::capacity::DEFAULT_BACKENDS_PER_SERVICE,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(proxy_common::capacity::MAX_BACKENDS_PER_SERVICE)))]
    pub max_endpoints_per_service: u16,
    /// Kubeconfig for `--source cluster` (default: in-cluster service
    /// account, then KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (default: $NODE_NAME, then the hostname).
    /// `--hostname-override` is kube-proxy's name for it.
    #[arg(long, env = "NODE_NAME", visible_alias = "hostname-override")]
    pub node_name: Option<String>,
    /// Serve Services labelled `service.kubernetes.io/service-proxy-name`
    /// with this value (Services naming any other proxy are skipped).
    #[arg(long)]
    pub proxy_name: Option<String>,
    /// Balance at the socket layer (cgroup connect/sendmsg/recvmsg/
    /// getpeername hooks): clients in the node's network namespace reach
    /// ClusterIPs, and balanced flows need no per-packet NAT.
    /// `--socket-lb=false` turns it off and detaches what is attached.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub socket_lb: bool,
    /// Keep the socket layer to the node's own network namespace: a pod's
    /// connects and sends reach the frontend unchanged, and the tc program
    /// on the pod's interface balances its packets. Set it under a service
    /// mesh whose sidecar takes a pod's outbound connections and routes by
    /// their original destination (Istio, Linkerd): the sidecar then sees
    /// the ClusterIP, not a pod address.
    #[arg(
        long,
        env = "SOCKET_LB_HOST_NAMESPACE_ONLY",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub socket_lb_host_namespace_only: bool,
    /// The cgroup the socket layer attaches to (default: the host's cgroup2
    /// mount, found in /proc/self/mountinfo). Every process in it and below
    /// is balanced.
    #[arg(long)]
    pub cgroup_root: Option<PathBuf>,
    /// How often the agent compares what it owns outside itself (the
    /// maps it writes, the pins under the pin root) with what it wants
    /// there, and writes back what drifted; programs missing from an
    /// interface or the cgroup are found at once from netlink events and at
    /// the 2 s rescan. `0` turns every repair off (drift is then only
    /// reported, by `verify`, `status` and `doctor`). Stretched when one
    /// check takes long, so that checking costs at most 5% of a core.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    pub repair_interval: Duration,
    /// How the tc programs attach to pod interfaces: TCX links (Linux
    /// 6.6+, pinned under the pin root), netlink clsact filters, or TCX
    /// where the kernel has it.
    #[arg(long, value_enum, default_value_t = TcMode::Auto)]
    pub tc_attach: TcMode,
    /// An interface traffic from outside the node arrives on (repeat for
    /// several). Default: the interfaces holding the Node's InternalIP or
    /// ExternalIP, else the default route's interface. NodePorts,
    /// LoadBalancer IPs and external IPs are served there. Followed while
    /// the agent runs: an interface named here that does not exist yet is
    /// waited for (with a warning) and attached when it appears.
    #[arg(long = "uplink", value_name = "IFACE")]
    pub uplinks: Vec<String>,
    /// How the uplink program runs: `auto` (per uplink: native XDP on a
    /// physical NIC whose driver takes it, tc only on a veth, another
    /// virtual device or a driver without native XDP; the choice and its
    /// reason are logged and shown by `switchboard status`), `native` (in the
    /// driver; falls back to generic where the driver has no XDP; on a veth
    /// only if its peer runs XDP or GRO and senders write complete
    /// checksums), `generic` (the kernel's generic XDP hook), or `off` (a tc
    /// ingress program instead).
    #[arg(long, value_enum, default_value_t = XdpMode::Auto)]
    pub xdp_mode: XdpMode,
    /// How new flows pick a backend when the Service has no
    /// `switchboard.io/lb-algorithm` annotation: `random`; for flows from
    /// outside the node `maglev` (consistent hashing of the 5-tuple: every
    /// node picks alike) or `source-hash` (by client address); for every
    /// new flow, per node, `round-robin` (in turn) or `least-conn` (the
    /// less loaded of two random backends by open flows).
    #[arg(long, value_enum, default_value_t = LbAlgorithm::Random)]
    pub lb_algorithm: LbAlgorithm,
    /// How flows from outside reach a backend on another node: `snat`
    /// (source NAT to this node; replies come back through it, as under
    /// kube-proxy) or `dsr` (direct server return: the client's address is
    /// kept and the backend's node answers the client itself, one hop
    /// less; every node must run `dsr`).
    #[arg(long, value_enum, default_value_t = NodePortMode::Snat)]
    pub nodeport_mode: NodePortMode,
    /// Serve NodePorts on this node's interface addresses within these
    /// CIDRs of either family (comma-separated or repeated), as kube-proxy's
    /// flag does.
    /// Default: the Node's InternalIP and ExternalIP.
    #[arg(long, value_name = "CIDR", value_delimiter = ',')]
    pub nodeport_addresses: Vec<IpCidr>,
    /// Serve `/healthz` and `/livez` here, as kube-proxy does on 10256
    /// (empty: off). IPv6 in brackets: `[::]:10256` serves both families.
    #[arg(long, value_name = "IP:PORT", default_value = "0.0.0.0:10256", value_parser = parse_bind)]
    pub healthz_bind_address: Bind,
    /// Serve Prometheus `/metrics` here, as kube-proxy does on 10249
    /// (empty: off).
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:10249", value_parser = parse_bind)]
    pub metrics_bind_address: Bind,
    /// Seconds each watch of the API server lasts (`timeoutSeconds`); the
    /// server then ends it and it is resumed. A watch that sends nothing,
    /// no event and no bookmark, for this long and a quarter more is
    /// taken for dead and restarted.
    #[arg(long, value_name = "SECONDS", default_value_t = 290, value_parser = clap::value_parser!(u64).range(1..))]
    pub watch_timeout: u64,
}

/// A map capacity (`--max-*`): at least one entry. The kernel refuses a map
/// of none, and that error would name the map rather than the flag.
fn capacity(text: &str) -> Result<u32, String> {
    match text.parse::<u32>() {
        Ok(0) => Err("a map needs room for at least one entry".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{text:?} is not a number of entries: {e}")),
    }
}

/// A listen address, or none (the empty string turns the server off).
#[derive(Clone, Copy, Debug)]
pub struct Bind(pub Option<std::net::SocketAddr>);

fn parse_bind(s: &str) -> Result<Bind, std::net::AddrParseError> {
    if s.is_empty() {
        return Ok(Bind(None));
    }
    s.parse().map(|a| Bind(Some(a)))
}

/// A duration as kube-proxy's flags take it (Go's `time.ParseDuration`,
/// without signs): numbers with units `h`, `m`, `s`, `ms`, e.g. `24h0m0s`,
/// `1h30m`, `1.5s`; a bare `0` is zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration (e.g. 24h0m0s, 90m, 30s)");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0.0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return Err(bad()),
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

impl AgentArgs {
    /// The connection-tracking timeouts; a zero takes the default.
    fn conntrack_timeouts(&self) -> Timeouts {
        let d = Timeouts::default();
        let or = |v: Duration, default: Duration| if v.is_zero() { default } else { v };
        Timeouts {
            tcp_established: or(self.conntrack_tcp_timeout_established, d.tcp_established),
            tcp_close_wait: or(self.conntrack_tcp_timeout_close_wait, d.tcp_close_wait),
            tcp_closed: or(self.conntrack_tcp_timeout_closed, d.tcp_closed),
            tcp_syn: or(self.conntrack_tcp_timeout_syn, d.tcp_syn),
            udp: or(self.conntrack_udp_timeout, d.udp),
            udp_stream: or(self.conntrack_udp_timeout_stream, d.udp_stream),
        }
    }

    /// The agent's settings: defaults filled from the host (the node name
    /// from the hostname, the cgroup root from /proc/self/mountinfo).
    pub fn into_config(self) -> anyhow::Result<AgentConfig> {
        let conntrack_timeouts = self.conntrack_timeouts();
        let socket_lb_cgroup = match (self.socket_lb, self.cgroup_root) {
            (false, _) => None,
            (true, Some(root)) => Some(root),
            (true, None) => Some(
                crate::dataplane::attach::socket_layer::find_cgroup_root()
                    .context("finding the cgroup root for the socket layer")?,
            ),
        };
        let node_name = match self.node_name {
            Some(name) => name,
            None => nix::unistd::gethostname()
                .context("reading the hostname for --node-name")?
                .to_string_lossy()
                .into_owned(),
        };
        Ok(AgentConfig {
            conntrack_timeouts,
            source: self.source,
            pin_root: self.pin_root,
            capacities: Capacities {
                frontends: self.max_frontend_entries,
                backends: self.max_backends,
                conntrack: self.max_conntrack,
                services: self.max_services,
                flow_start: self.flow_table_start_entries,
            },
            max_endpoints_per_service: self.max_endpoints_per_service,
            kubeconfig: self.kubeconfig,
            node_name,
            proxy_name: self.proxy_name,
            socket_lb_cgroup,
            socket_lb_scope: match self.socket_lb_host_namespace_only {
                true => SocketScope::HostNamespace,
                false => SocketScope::Everywhere,
            },
            tc_mode: self.tc_attach,
            repair_interval: self.repair_interval,
            uplinks: self.uplinks,
            xdp_mode: self.xdp_mode,
            lb_algorithm: self.lb_algorithm,
            nodeport_mode: self.nodeport_mode,
            nodeport_addresses: self.nodeport_addresses,
            healthz_bind: self.healthz_bind_address.0,
            metrics_bind: self.metrics_bind_address.0,
            watch_timing: crate::source::cluster::WatchTiming {
                watch_timeout: std::time::Duration::from_secs(self.watch_timeout),
            },
        })
    }
}

/// The `kind` a config file must have.
pub const CONFIG_KIND: &str = "SwitchboardConfiguration";

/// The largest config file read (the settings are a few kilobytes; a file
/// beyond this is refused before it is read whole).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path} is larger than {limit} bytes (the most switchboard reads); is it the right file?")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("reading the config file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid YAML")]
    Yaml {
        path: PathBuf,
        source: Box<serde_saphyr::Error>,
    },
    #[error("config file {path}: kind is {found:?}, expected {CONFIG_KIND}")]
    Kind { path: PathBuf, found: String },
    #[error("config file {path}: unknown setting {key:?} (settings are the agent's flags in camelCase, e.g. pinRoot)")]
    UnknownKey { path: PathBuf, key: String },
    #[error("config file {path}: {key} must be a string, number, boolean or a list of them")]
    BadValue { path: PathBuf, key: String },
    #[error("config file {path}: {key} cannot be set in a file")]
    NotInFile { path: PathBuf, key: String },
}

/// The config file's contents.
/// (Unknown keys land in `settings` and are checked against the flags.)
#[derive(Debug, serde::Deserialize)]
struct ConfigFile {
    #[serde(rename = "apiVersion", default)]
    _api_version: Option<String>,
    kind: String,
    #[serde(flatten)]
    settings: BTreeMap<String, serde_json::Value>,
}

/// Inserts the settings of the `--config` file named in `argv` (after the
/// `agent` subcommand) as flags, before the command line's own, leaving out
/// those the command line sets: the command line wins, lists included.
/// `long_flags` are the agent's long flag names.
pub fn merge_config_file(
    argv: Vec<OsString>,
    long_flags: &[String],
) -> Result<Vec<OsString>, ConfigError> {
    let Some(agent_at) = argv.iter().position(|a| a == "agent") else {
        return Ok(argv);
    };
    let Some(path) = config_path(&argv[agent_at + 1..]) else {
        return Ok(argv);
    };
    let text = read_limited(&path, MAX_CONFIG_BYTES)?;
    let from_file = config_flags(&path, &text, long_flags)?;
    let given: Vec<String> = argv[agent_at + 1..]
        .iter()
        .filter_map(|a| a.to_str())
        .filter_map(|a| a.strip_prefix("--"))
        .map(|a| a.split('=').next().unwrap_or(a).to_owned())
        .collect();
    let mut merged: Vec<OsString> = argv[..=agent_at].to_vec();
    for (flag, value) in from_file {
        if !given.contains(&flag) {
            merged.push(format!("--{flag}={value}").into());
        }
    }
    merged.extend_from_slice(&argv[agent_at + 1..]);
    Ok(merged)
}

/// The text of `path`, refused when longer than `limit` bytes: at most
/// `limit + 1` bytes are read, whatever the file (a pipe or a device
/// has no size to check beforehand).
fn read_limited(path: &std::path::Path, limit: u64) -> Result<String, ConfigError> {
    use std::io::Read as _;
    let read_error = |source| ConfigError::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > limit {
        return Err(ConfigError::TooLarge {
            path: path.to_owned(),
            limit,
        });
    }
    String::from_utf8(bytes)
        .map_err(|e| read_error(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// `--config FILE` or `--config=FILE` among the agent's arguments.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let arg = arg.to_str()?;
        if arg == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    None
}

/// The file's settings as `(flag, value)` pairs, a list giving one pair per
/// item.
fn config_flags(
    path: &std::path::Path,
    text: &str,
    long_flags: &[String],
) -> Result<Vec<(String, String)>, ConfigError> {
    let file: ConfigFile = serde_saphyr::from_str(text).map_err(|source| ConfigError::Yaml {
        path: path.to_owned(),
        source: Box::new(source),
    })?;
    if file.kind != CONFIG_KIND {
        return Err(ConfigError::Kind {
            path: path.to_owned(),
            found: file.kind,
        });
    }
    let mut flags = Vec::new();
    for (key, value) in file.settings {
        let flag = kebab(&key);
        if flag == "config" || flag == "cleanup" {
            return Err(ConfigError::NotInFile {
                path: path.to_owned(),
                key,
            });
        }
        if !long_flags.contains(&flag) {
            return Err(ConfigError::UnknownKey {
                path: path.to_owned(),
                key,
            });
        }
        let bad = || ConfigError::BadValue {
            path: path.to_owned(),
            key: key.clone(),
        };
        match value {
            serde_json::Value::Array(items) => {
                for item in items {
                    flags.push((flag.clone(), scalar(&item).ok_or_else(bad)?));
                }
            }
            other => flags.push((flag, scalar(&other).ok_or_else(bad)?)),
        }
    }
    Ok(flags)
}

fn scalar(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `pinRoot` → `pin-root`.
fn kebab(key: &str) -> String {
    let mut out = String::new();
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('-');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> Vec<String> {
        ["pin-root", "xdp-mode", "uplink", "node-name", "socket-lb"]
            .map(String::from)
            .to_vec()
    }

    fn argv(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    fn with_file(text: &str, args: &[&str]) -> Result<Vec<OsString>, ConfigError> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = std::env::temp_dir().join(format!("sb-config-{}-{n}.yaml", std::process::id()));
        std::fs::write(&path, text).expect("write");
        let mut all = vec!["switchboard", "agent", "--config"];
        let p = path.display().to_string();
        all.push(&p);
        all.extend_from_slice(args);
        let out = merge_config_file(argv(&all), &flags());
        let _ = std::fs::remove_file(&path);
        out
    }

    #[test]
    fn file_settings_become_flags_and_the_command_line_wins() {
        let text = "apiVersion: switchboard.io/v1alpha1\nkind: SwitchboardConfiguration\npinRoot: /sys/fs/bpf/x\nxdpMode: generic\nuplink: [eth0, eth1]\nsocketLb: false\n";
        let out = with_file(text, &["--xdp-mode", "off", "--uplink=eth9"]).expect("merge");
        let out: Vec<&str> = out.iter().filter_map(|a| a.to_str()).collect();
        assert_eq!(&out[..2], &["switchboard", "agent"]);
        assert!(out.contains(&"--pin-root=/sys/fs/bpf/x"));
        assert!(out.contains(&"--socket-lb=false"));
        assert!(
            !out.contains(&"--xdp-mode=generic"),
            "the command line's --xdp-mode wins: {out:?}"
        );
        assert!(
            !out.iter().any(|a| a.starts_with("--uplink=eth0")),
            "a list on the command line replaces the file's: {out:?}"
        );
        assert!(out.ends_with(&["--xdp-mode", "off", "--uplink=eth9"]));
    }

    #[test]
    fn unknown_keys_kinds_and_values_are_refused_by_name() {
        let err = with_file("kind: SwitchboardConfiguration\npinRot: /x\n", &[]).expect_err("typo");
        assert!(
            matches!(err, ConfigError::UnknownKey { ref key, .. } if key == "pinRot"),
            "{err}"
        );
        let err = with_file("kind: KubeProxyConfiguration\n", &[]).expect_err("kind");
        assert!(matches!(err, ConfigError::Kind { .. }), "{err}");
        let err = with_file("kind: SwitchboardConfiguration\nnodeName: {a: 1}\n", &[])
            .expect_err("map value");
        assert!(matches!(err, ConfigError::BadValue { .. }), "{err}");
        let err =
            with_file("kind: SwitchboardConfiguration\ncleanup: true\n", &[]).expect_err("cleanup");
        assert!(matches!(err, ConfigError::NotInFile { .. }), "{err}");
    }

    #[test]
    fn durations_parse_as_kube_proxy_writes_them() {
        let cases = [
            ("24h0m0s", Some(86_400.0)),
            ("24h", Some(86_400.0)),
            ("1h30m", Some(5_400.0)),
            ("90m", Some(5_400.0)),
            ("30s", Some(30.0)),
            ("1.5s", Some(1.5)),
            ("250ms", Some(0.25)),
            ("0", Some(0.0)),
            ("0s", Some(0.0)),
            ("", None),
            ("10", None),
            ("10d", None),
            ("-5s", None),
            ("h", None),
        ];
        for (text, want) in cases {
            let got = parse_duration(text).ok().map(|d| d.as_secs_f64());
            assert_eq!(got, want, "{text:?}");
        }
    }

    #[test]
    fn bind_addresses_take_either_family() {
        let v6: std::net::SocketAddr = "[::]:10256".parse().expect("addr");
        assert_eq!(parse_bind("[::]:10256").expect("[::]").0, Some(v6));
        assert_eq!(
            parse_bind("[::1]:10249").expect("[::1]").0,
            Some("[::1]:10249".parse().expect("addr"))
        );
        assert_eq!(
            parse_bind("0.0.0.0:10256").expect("v4").0,
            Some("0.0.0.0:10256".parse().expect("addr"))
        );
        assert_eq!(parse_bind("").expect("off").0, None);
        // An IPv6 address needs its brackets before the port.
        assert!(parse_bind("::1:10256").is_err());
    }

    #[test]
    fn xdp_mode_is_auto_by_default_and_in_the_file() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            agent: AgentArgs,
        }
        let parse = |args: &[&str]| Cli::try_parse_from(args).map(|c| c.agent.xdp_mode);
        assert_eq!(parse(&["x"]).expect("defaults"), XdpMode::Auto);
        assert_eq!(
            parse(&["x", "--xdp-mode", "auto"]).expect("auto"),
            XdpMode::Auto
        );
        assert_eq!(
            parse(&["x", "--xdp-mode", "native"]).expect("native"),
            XdpMode::Native
        );
        let out = with_file("kind: SwitchboardConfiguration\nxdpMode: auto\n", &[]).expect("merge");
        assert!(out.iter().any(|a| a == "--xdp-mode=auto"), "{out:?}");
    }

    /// A zero capacity is refused when the flags are read (on
    /// the command line or from the file), naming the flag.
    #[test]
    fn zero_capacities_are_refused_naming_the_flag() {
        use clap::{CommandFactory as _, Parser as _};
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            agent: AgentArgs,
        }
        for flag in [
            "--max-conntrack",
            "--max-services",
            "--max-frontend-entries",
            "--max-backends",
            "--flow-table-start-entries",
        ] {
            let err = Cli::try_parse_from(["x", flag, "0"])
                .err()
                .unwrap_or_else(|| panic!("{flag} 0 must be refused"));
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ValueValidation,
                "{flag}"
            );
            let text = err.to_string();
            assert!(text.contains(flag), "the error names {flag}: {text}");
            assert!(text.contains("at least one entry"), "{text}");
            assert!(Cli::try_parse_from(["x", flag, "1"]).is_ok(), "{flag} 1");
        }
        let caps = Cli::try_parse_from(["x"]).expect("defaults").agent;
        assert_eq!(caps.max_conntrack, Capacities::default().conntrack);
        // From the file: the setting becomes the flag, refused alike.
        let long: Vec<String> = Cli::command()
            .get_arguments()
            .filter_map(|a| a.get_long())
            .map(str::to_owned)
            .collect();
        let path = std::env::temp_dir().join(format!("sb-config-zero-{}.yaml", std::process::id()));
        std::fs::write(&path, "kind: SwitchboardConfiguration\nmaxConntrack: 0\n").expect("write");
        let p = path.display().to_string();
        let merged =
            merge_config_file(argv(&["x", "agent", "--config", &p]), &long).expect("merge");
        let _ = std::fs::remove_file(&path);
        let args: Vec<OsString> = merged.into_iter().filter(|a| a != "agent").collect();
        let err = Cli::try_parse_from(args)
            .err()
            .expect("maxConntrack: 0 in the file must be refused");
        assert!(err.to_string().contains("--max-conntrack"), "{err}");
    }

    /// A config file above the limit is refused before it is read
    /// whole, naming the file and the limit.
    #[test]
    fn a_config_file_above_the_limit_is_refused_by_name() {
        let path = std::env::temp_dir().join(format!("sb-config-big-{}.yaml", std::process::id()));
        let mut text = String::from("kind: SwitchboardConfiguration\nuplink:\n");
        while (text.len() as u64) <= MAX_CONFIG_BYTES {
            text.push_str("- eth0\n");
        }
        std::fs::write(&path, &text).expect("write");
        let p = path.display().to_string();
        let err = merge_config_file(argv(&["switchboard", "agent", "--config", &p]), &flags())
            .expect_err("too large");
        let _ = std::fs::remove_file(&path);
        assert!(
            matches!(err, ConfigError::TooLarge { ref path, limit } if *path == std::path::Path::new(&p) && limit == MAX_CONFIG_BYTES),
            "{err}"
        );
        let shown = err.to_string();
        assert!(
            shown.contains(&p) && shown.contains("1048576 bytes"),
            "{shown}"
        );
        // Just under the limit is read (and judged on its contents).
        assert_eq!(
            read_limited(std::path::Path::new("/dev/null"), 4).expect("empty"),
            ""
        );
        let small =
            std::env::temp_dir().join(format!("sb-config-small-{}.yaml", std::process::id()));
        std::fs::write(&small, "abcd").expect("write");
        assert_eq!(read_limited(&small, 4).expect("at the limit"), "abcd");
        assert!(matches!(
            read_limited(&small, 3),
            Err(ConfigError::TooLarge { .. })
        ));
        let _ = std::fs::remove_file(&small);
    }

    #[test]
    fn without_config_the_arguments_are_unchanged() {
        let args = argv(&["switchboard", "agent", "--xdp-mode", "off"]);
        assert_eq!(
            merge_config_file(args.clone(), &flags()).expect("merge"),
            args
        );
        let args = argv(&["switchboard", "services"]);
        assert_eq!(
            merge_config_file(args.clone(), &flags()).expect("merge"),
            args
        );
    }
}
