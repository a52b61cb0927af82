//! North-south: an external client to a NodePort of node A in the two-node
//! sandbox (`sandbox::two_node`), with local backends (node A's two pods)
//! and with remote backends (node B's two pods), through switchboard's XDP
//! program, through its tc programs only (`--xdp-mode off`), and through
//! kube-proxy-style iptables NodePort rules built for the same Services;
//! next to a direct path to the same pods (no Service, the limit).
//!
//! The sandboxes are [`Lan::XdpReady`] (the uplinks' peers wake for XDP_TX,
//! senders write complete checksums), so the native XDP path can be
//! measured on veth at all; all three alike, so the paths stay comparable.
//!
//! Three two-node sandboxes live at once, so the measurements can be
//! interleaved and no setup touches another (iptables NAT rules switch on
//! conntrack hooks in their namespace; switchboard's pinned programs stay on
//! the uplink when its agent stops):
//! - `sbbnd`: nothing on the nodes (direct);
//! - `sbbns`: switchboard's agent on node A, restarted with `--xdp-mode
//!   native` (local backends: XDP_PASS), `generic` (remote backends:
//!   XDP_TX; native XDP_TX between veths loses about half the frames in this
//!   sandbox, so the remote XDP path runs in generic mode) or `off` (tc only);
//!   the mode on the uplink is checked with `ip link` after every restart;
//! - `sbbni`: kube-proxy's iptables NodePort layout in node A's namespace, no
//!   agent.
//!
//! Every pod runs `sb-http serve` (HTTP on 8080, UDP echo on 5353; nothing
//! listens on UDP 9, where the flood goes: the pods count those datagrams as
//! `NoPorts`). Measured per path, in interleaved rounds (medians):
//! - new TCP connections/s: two wrk in parallel (`-t 1 -c 11`, `Connection:
//!   close`) from external client 1 to the NodePort (direct: from client 2,
//!   one wrk per pod, so no pod sees one client tuple both translated and
//!   direct within TIME_WAIT);
//! - forwarding rate: `sb_bench flood` (sendmmsg, 4 flows, 60-byte frames)
//!   pinned to one CPU in the client's namespace for a fixed time; what
//!   reached the backend pods is read from their `/proc/net/snmp` (Udp
//!   InDatagrams + NoPorts + InErrors) before and after. All of it (sender,
//!   bridge, node A, node B, pods) runs on the sender's CPU: veth hands
//!   packets on within the sending CPU's softirq.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;

use super::clients::{run_wrk, wrk_args, Wrk};
use super::plan::Plan;
use super::progress::{note, progress};
use super::results::{
    Flood, NorthSouth, NsDatapath, NsMedians, NsMeta, NsPathInfo, NsRound, NsRow,
};
use super::stats::median_by;
use crate::sandbox::find_at;
use crate::sandbox::two_node::{Client as Ext, Lan, Node, Pod, TwoNodeSandbox, NODE_A_IP};
use crate::util::{run_capture, show};

/// Sandbox tags (direct, switchboard, iptables).
pub const TAGS: [&str; 3] = ["sbbnd", "sbbns", "sbbni"];
const POD_HTTP_PORT: u16 = 8080;
const POD_ECHO_PORT: u16 = 5353;
/// Nothing listens here in the pods: flood datagrams end as `NoPorts`.
const POD_FLOOD_PORT: u16 = 9;
const NAMESPACE: &str = "bench";
/// The CPU the flood sender is pinned to.
const FLOOD_CPU: usize = 1;
const FLOOD_FLOWS: &str = "4";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backends {
    Local,
    Remote,
}

impl Backends {
    fn pods(self) -> Vec<Pod> {
        match self {
            Backends::Local => Node::A.pods(),
            Backends::Remote => Node::B.pods(),
        }
    }
    fn service(self) -> &'static str {
        match self {
            Backends::Local => "np-local",
            Backends::Remote => "np-remote",
        }
    }
    fn cluster_ip(self) -> Ipv4Addr {
        match self {
            Backends::Local => Ipv4Addr::new(10, 96, 1, 10),
            Backends::Remote => Ipv4Addr::new(10, 96, 1, 11),
        }
    }
    fn http_node_port(self) -> u16 {
        match self {
            Backends::Local => 30080,
            Backends::Remote => 30081,
        }
    }
    fn udp_node_port(self) -> u16 {
        match self {
            Backends::Local => 30090,
            Backends::Remote => 30091,
        }
    }
    fn describe(self) -> &'static str {
        match self {
            Backends::Local => "node A's pods (local)",
            Backends::Remote => "node B's pods (remote)",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    Direct,
    /// switchboard with this `--xdp-mode`.
    Switchboard(&'static str),
    Iptables,
}

struct NsPath {
    key: &'static str,
    label: &'static str,
    via: Via,
    backends: Backends,
}

/// Keys of the north-south rows (the report looks them up).
pub const NS_DIRECT_LOCAL: &str = "ns_direct_local";
pub const NS_DIRECT_REMOTE: &str = "ns_direct_remote";
pub const NS_XDP_LOCAL: &str = "ns_xdp_local";
pub const NS_XDP_REMOTE: &str = "ns_xdp_remote";
pub const NS_TC_LOCAL: &str = "ns_tc_local";
pub const NS_TC_REMOTE: &str = "ns_tc_remote";
pub const NS_IPT_LOCAL: &str = "ns_iptables_local";
pub const NS_IPT_REMOTE: &str = "ns_iptables_remote";

const NS_PATHS: [NsPath; 8] = [
    NsPath {
        key: NS_DIRECT_LOCAL,
        label: "direct to node A's pods (no Service)",
        via: Via::Direct,
        backends: Backends::Local,
    },
    NsPath {
        key: NS_DIRECT_REMOTE,
        label: "direct to node B's pods via node A (no Service)",
        via: Via::Direct,
        backends: Backends::Remote,
    },
    NsPath {
        key: NS_XDP_LOCAL,
        label: "switchboard XDP (native), local backends",
        via: Via::Switchboard("native"),
        backends: Backends::Local,
    },
    NsPath {
        key: NS_XDP_REMOTE,
        label: "switchboard XDP (generic), remote backends",
        via: Via::Switchboard("generic"),
        backends: Backends::Remote,
    },
    NsPath {
        key: NS_TC_LOCAL,
        label: "switchboard tc only, local backends",
        via: Via::Switchboard("off"),
        backends: Backends::Local,
    },
    NsPath {
        key: NS_TC_REMOTE,
        label: "switchboard tc only, remote backends",
        via: Via::Switchboard("off"),
        backends: Backends::Remote,
    },
    NsPath {
        key: NS_IPT_LOCAL,
        label: "iptables NodePort (kube-proxy layout), local backends",
        via: Via::Iptables,
        backends: Backends::Local,
    },
    NsPath {
        key: NS_IPT_REMOTE,
        label: "iptables NodePort (kube-proxy layout), remote backends",
        via: Via::Iptables,
        backends: Backends::Remote,
    },
];

/// Progress steps this part prints (for the run's step count).
pub fn steps(plan: &Plan) -> usize {
    3 + NS_PATHS.len() * plan.rounds
}

// ---------------------------------------------------------------------------
// Manifests and rules
// ---------------------------------------------------------------------------

/// The Service (NodePort, `externalTrafficPolicy: Cluster`) and its
/// EndpointSlice, for switchboard's `dir:` source.
fn manifest(b: Backends) -> String {
    let mut s = format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\n\
         spec:\n  type: NodePort\n  clusterIP: {ip}\n  selector:\n    app: {name}\n  externalTrafficPolicy: Cluster\n  ports:\n\
         \x20 - name: http\n    protocol: TCP\n    port: 80\n    targetPort: {POD_HTTP_PORT}\n    nodePort: {np}\n\
         \x20 - name: flood\n    protocol: UDP\n    port: 9\n    targetPort: {POD_FLOOD_PORT}\n    nodePort: {up}\n",
        name = b.service(),
        ip = b.cluster_ip(),
        np = b.http_node_port(),
        up = b.udp_node_port(),
    );
    let _ = write!(
        s,
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\n\
         metadata:\n  name: {name}-1\n  namespace: {NAMESPACE}\n  labels:\n    kubernetes.io/service-name: {name}\nendpoints:\n",
        name = b.service()
    );
    for pod in b.pods() {
        let _ = write!(
            s,
            "- addresses:\n  - {}\n  conditions:\n    ready: true\n  nodeName: {}\n",
            pod.ip(),
            pod.node.name()
        );
    }
    let _ = write!(
        s,
        "ports:\n- name: http\n  port: {POD_HTTP_PORT}\n  protocol: TCP\n- name: flood\n  port: {POD_FLOOD_PORT}\n  protocol: UDP\n"
    );
    s
}

/// kube-proxy's iptables layout (`pkg/proxy/iptables/proxier.go`) for the two
/// NodePort Services, as node A's kube-proxy would write it: `PREROUTING` →
/// `KUBE-SERVICES` (ClusterIP rules, then `--dst-type LOCAL` →
/// `KUBE-NODEPORTS`) → `KUBE-EXT-<hash>` → `KUBE-SVC-<hash>` → `KUBE-SEP-<hash>`
/// (`statistic --mode random`, DNAT). Remote backends are masqueraded
/// (`KUBE-MARK-MASQ` in `KUBE-EXT`, `MASQUERADE --random-fully` in
/// `KUBE-POSTROUTING`), as switchboard SNATs them; local backends keep the
/// client's address, as switchboard does (kube-proxy would masquerade them too
/// under `Cluster`; leaving that out makes the baseline cheaper, not dearer).
pub fn iptables_rules() -> String {
    super::kubeproxy::nodeport_iptables(&nodeport_services())
}

/// The two NodePort Services as kube-proxy sees them: each port with its
/// cluster IP, node port and endpoints; remote backends masqueraded.
fn nodeport_services() -> Vec<super::kubeproxy::NodePortSvc> {
    let mut out = Vec::new();
    for b in [Backends::Local, Backends::Remote] {
        for (port_name, proto, port, target, node_port) in [
            ("http", "tcp", 80u16, POD_HTTP_PORT, b.http_node_port()),
            ("flood", "udp", 9u16, POD_FLOOD_PORT, b.udp_node_port()),
        ] {
            out.push(super::kubeproxy::NodePortSvc {
                id: format!("{NAMESPACE}/{}:{port_name}", b.service()),
                proto,
                cluster_ip: b.cluster_ip(),
                port,
                node_port,
                endpoints: b.pods().iter().map(|p| (p.ip(), target)).collect(),
                masquerade: b == Backends::Remote,
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Sandboxes
// ---------------------------------------------------------------------------

struct Sandboxes {
    direct: TwoNodeSandbox,
    sw: TwoNodeSandbox,
    ipt: TwoNodeSandbox,
    /// The `--xdp-mode` of the running agent in `sw`.
    agent_mode: Option<&'static str>,
}

fn start_http_pods(sb: &mut TwoNodeSandbox, sb_http: &Path) -> Result<()> {
    let bin = sb_http.to_string_lossy().into_owned();
    for pod in Pod::all() {
        let (ns, name) = (sb.pod_ns(pod), pod.name());
        sb.spawn(
            &name,
            &ns,
            &[
                &bin,
                "serve",
                "--name",
                &name,
                "--http",
                &POD_HTTP_PORT.to_string(),
                "--udp",
                &POD_ECHO_PORT.to_string(),
            ],
        )?;
    }
    // Each pod answers HTTP at its own address from both clients (straight
    // through the nodes).
    for pod in Pod::all() {
        let addr = format!("{}:{POD_HTTP_PORT}", pod.ip()).parse()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        for client in Ext::ALL {
            loop {
                match sb.http_get(client, addr, "/", Duration::from_millis(500)) {
                    Ok(r) if r.status == 200 => break,
                    other => {
                        if Instant::now() > deadline {
                            bail!(
                                "{} does not answer HTTP at {addr} from {client:?}: {other:?}",
                                pod.name()
                            );
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        }
    }
    Ok(())
}

/// The XDP mode `ip link` shows on node A's uplink: `native`, `generic` or
/// `off`.
fn uplink_xdp_mode(sb: &TwoNodeSandbox) -> Result<&'static str> {
    let out = sb.exec(
        &sb.node_ns(Node::A),
        &["ip", "-o", "link", "show", "dev", &sb.uplink(Node::A)],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = text.split_whitespace().collect();
    Ok(if words.contains(&"xdpgeneric") {
        "generic"
    } else if words.contains(&"xdp") || words.contains(&"xdpdrv") {
        "native"
    } else {
        "off"
    })
}

/// Removes every pinned XDP link (`xdp_<ifindex>_<mode>`) under `dir`.
fn remove_xdp_pins(dir: &Path) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            remove_xdp_pins(&path)?;
        } else if entry.file_name().to_string_lossy().starts_with("xdp_") {
            fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
        }
    }
    Ok(())
}

impl Sandboxes {
    fn new(sb_http: &Path) -> Result<Sandboxes> {
        let mut direct = TwoNodeSandbox::new_on(TAGS[0], Lan::XdpReady)?;
        start_http_pods(&mut direct, sb_http)?;
        let mut sw = TwoNodeSandbox::new_on(TAGS[1], Lan::XdpReady)?;
        start_http_pods(&mut sw, sb_http)?;
        sw.write_nodes()?;
        for b in [Backends::Local, Backends::Remote] {
            sw.write_manifest(&format!("{}.yaml", b.service()), &manifest(b))?;
        }
        let mut ipt = TwoNodeSandbox::new_on(TAGS[2], Lan::XdpReady)?;
        start_http_pods(&mut ipt, sb_http)?;
        let rules = iptables_rules();
        let file = ipt.dir.join("nodeport.rules");
        fs::write(&file, &rules)?;
        let f = file.to_string_lossy().into_owned();
        let t0 = Instant::now();
        run_capture(&mut ipt.command(
            &ipt.node_ns(Node::A),
            &["sh", "-c", "exec iptables-restore < \"$0\"", &f],
        ))?;
        note(&format!(
            "iptables-restore of the NodePort rules into node A's namespace: {:.2} s, {} lines",
            t0.elapsed().as_secs_f64(),
            rules.lines().count()
        ));
        Ok(Sandboxes {
            direct,
            sw,
            ipt,
            agent_mode: None,
        })
    }

    /// (Re)starts node A's agent with `--xdp-mode mode` unless it runs so;
    /// waits for both Services and the uplink programs, and checks the mode
    /// `ip link` shows.
    fn agent(&mut self, switchboard: &Path, mode: &'static str) -> Result<()> {
        if self.agent_mode == Some(mode) {
            return Ok(());
        }
        if self.agent_mode.is_some() {
            self.sw.stop_agent(Node::A)?;
            // The stopped agent's XDP link stays pinned (so traffic survives a
            // restart). A restart in another mode was seen to leave the native
            // link attached, so the bench removes the pinned XDP links itself
            // and checks the uplink is clear before the next agent starts.
            remove_xdp_pins(&self.sw.pin_dir(Node::A))?;
            let shown = uplink_xdp_mode(&self.sw)?;
            ensure!(
                shown == "off",
                "node A's uplink still has XDP ({shown}) after its pinned links were removed"
            );
        }
        self.agent_mode = None;
        self.sw
            .start_agent(Node::A, switchboard, &["--xdp-mode", mode])?;
        let want = |b: Backends, port: u16, proto: &str, pod_port: u16| {
            let mut v: Vec<String> = b
                .pods()
                .iter()
                .map(|p| format!("{}:{pod_port}", p.ip()))
                .collect();
            v.sort();
            (port, proto.to_string(), v)
        };
        let wanted = [
            want(
                Backends::Local,
                Backends::Local.http_node_port(),
                "TCP",
                POD_HTTP_PORT,
            ),
            want(
                Backends::Local,
                Backends::Local.udp_node_port(),
                "UDP",
                POD_FLOOD_PORT,
            ),
            want(
                Backends::Remote,
                Backends::Remote.http_node_port(),
                "TCP",
                POD_HTTP_PORT,
            ),
            want(
                Backends::Remote,
                Backends::Remote.udp_node_port(),
                "UDP",
                POD_FLOOD_PORT,
            ),
        ];
        self.sw.wait_services(
            Node::A,
            switchboard,
            Duration::from_secs(20),
            "the two NodePort Services on node A",
            |f| {
                wanted.iter().all(|(port, proto, backends)| {
                    find_at(f, NODE_A_IP, *port, proto)
                        .is_some_and(|fe| &fe.backend_addrs() == backends)
                })
            },
        )?;
        self.sw
            .wait_uplink_attached(Node::A, Duration::from_secs(20))?;
        let shown = uplink_xdp_mode(&self.sw)?;
        ensure!(
            shown == mode,
            "agent started with --xdp-mode {mode}, but the uplink shows XDP {shown}"
        );
        self.agent_mode = Some(mode);
        Ok(())
    }

    fn cleanup(mut self) -> Result<()> {
        if self.agent_mode.is_some() {
            let _ = self.sw.stop_agent(Node::A);
        }
        let mut errors = Vec::new();
        for mut sb in [self.direct, self.sw, self.ipt] {
            if let Err(e) = sb.cleanup() {
                errors.push(format!("{e:#}"));
            }
        }
        ensure!(errors.is_empty(), "cleanup: {}", errors.join("; "));
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Measurements
// ---------------------------------------------------------------------------

/// Udp InDatagrams + NoPorts + InErrors of the pod (`/proc/net/snmp` in its
/// namespace).
fn pod_udp_in(sb: &TwoNodeSandbox, pod: Pod) -> Result<u64> {
    let out = sb.exec(&sb.pod_ns(pod), &["cat", "/proc/net/snmp"])?;
    let text = String::from_utf8_lossy(&out.stdout);
    let udp: Vec<&str> = text.lines().filter(|l| l.starts_with("Udp:")).collect();
    ensure!(
        udp.len() >= 2,
        "no Udp lines in /proc/net/snmp of {}",
        pod.name()
    );
    let names: Vec<&str> = udp[0].split_whitespace().collect();
    let values: Vec<&str> = udp[1].split_whitespace().collect();
    let get = |k: &str| -> u64 {
        names
            .iter()
            .position(|n| *n == k)
            .and_then(|i| values.get(i))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Ok(get("InDatagrams") + get("NoPorts") + get("InErrors"))
}

/// switchboard's global counters on node A (`switchboard stats -o json`),
/// by name.
fn counters(sb: &TwoNodeSandbox, switchboard: &Path) -> Result<BTreeMap<String, u64>> {
    #[derive(Deserialize)]
    struct Stats {
        counters: BTreeMap<String, u64>,
    }
    let bin = switchboard.to_string_lossy().into_owned();
    let pin = sb.pin_dir(Node::A).to_string_lossy().into_owned();
    let out = sb.exec(
        &sb.node_ns(Node::A),
        &[&bin, "stats", "--pin-root", &pin, "-o", "json"],
    )?;
    let stats: Stats =
        serde_json::from_slice(&out.stdout).context("`switchboard stats -o json`")?;
    Ok(stats.counters)
}

fn grew(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, key: &str) -> u64 {
    let at = |c: &BTreeMap<String, u64>| c.get(key).copied().unwrap_or(0);
    at(after).saturating_sub(at(before))
}

fn wrk_all(sb: &TwoNodeSandbox, ns: &str, urls: &[String], secs: u32) -> Result<Wrk> {
    let cmds = urls
        .iter()
        .map(|url| {
            let args = wrk_args(url, secs);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut c = sb.command(ns, &args);
            c.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c
        })
        .collect();
    run_wrk(cmds)
}

fn measure(
    sbs: &mut Sandboxes,
    path: &NsPath,
    plan: &Plan,
    switchboard: &Path,
    sb_bench: &Path,
) -> Result<NsRound> {
    if let Via::Switchboard(mode) = path.via {
        sbs.agent(switchboard, mode)?;
    }
    let sb = match path.via {
        Via::Direct => &sbs.direct,
        Via::Switchboard(_) => &sbs.sw,
        Via::Iptables => &sbs.ipt,
    };
    if path.via == Via::Iptables {
        // Forget earlier connections (conntrack is per namespace).
        let _ = run_capture(&mut sb.command(&sb.node_ns(Node::A), &["conntrack", "-F"]));
    }
    let pods = path.backends.pods();
    let (client, urls, flood_dsts): (Ext, Vec<String>, Vec<String>) = match path.via {
        Via::Direct => (
            Ext::Two,
            pods.iter()
                .map(|p| format!("http://{}:{POD_HTTP_PORT}/", p.ip()))
                .collect(),
            pods.iter()
                .map(|p| format!("{}:{POD_FLOOD_PORT}", p.ip()))
                .collect(),
        ),
        _ => (
            Ext::One,
            pods.iter()
                .map(|_| format!("http://{NODE_A_IP}:{}/", path.backends.http_node_port()))
                .collect(),
            vec![format!("{NODE_A_IP}:{}", path.backends.udp_node_port())],
        ),
    };
    let ns = sb.client_ns(client);
    let is_sw = matches!(path.via, Via::Switchboard(_));
    let snap = || -> Result<Option<BTreeMap<String, u64>>> {
        if is_sw {
            counters(sb, switchboard).map(Some)
        } else {
            Ok(None)
        }
    };

    if !plan.quick {
        wrk_all(sb, &ns, &urls, 1)?; // warm-up (neighbours, caches)
    }
    let c0 = snap()?;
    let w = wrk_all(sb, &ns, &urls, plan.wrk_secs)?;
    let c1 = snap()?;

    // Forwarding rate: the flood, counted at the backend pods.
    let before: Vec<u64> = pods
        .iter()
        .map(|p| pod_udp_in(sb, *p))
        .collect::<Result<_>>()?;
    let bench = sb_bench.to_string_lossy().into_owned();
    let secs = if plan.quick { "2" } else { "5" };
    let cpu = FLOOD_CPU.to_string();
    let mut args: Vec<&str> = vec![
        &bench,
        "flood",
        "--secs",
        secs,
        "--cpu",
        &cpu,
        "--flows",
        FLOOD_FLOWS,
    ];
    for d in &flood_dsts {
        args.extend(["--dst", d.as_str()]);
    }
    let t_flood = Instant::now();
    let mut c = sb.command(&ns, &args);
    c.stdin(Stdio::null());
    let out = run_capture(&mut c).with_context(|| format!("`{}`", show(&c)))?;
    let flood_took = t_flood.elapsed().as_secs_f64();
    #[derive(Deserialize)]
    struct FloodOut {
        #[serde(default)]
        sent: u64,
        wall_s: Option<f64>,
    }
    let flood: FloodOut = serde_json::from_slice(&out.stdout).context("sb_bench flood output")?;
    std::thread::sleep(Duration::from_millis(300));
    let after: Vec<u64> = pods
        .iter()
        .map(|p| pod_udp_in(sb, *p))
        .collect::<Result<_>>()?;
    let c2 = snap()?;
    let arrived: u64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    let per_pod: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    let sent = flood.sent;
    let wall = flood.wall_s.unwrap_or(f64::NAN);
    let mpps = arrived as f64 / wall / 1e6;
    ensure!(
        arrived > 0,
        "{}: no flood datagram reached the pods ({sent} sent)",
        path.label
    );

    // On switchboard's paths, its counters must show it translated the traffic.
    let datapath = match (c0, c1, c2) {
        (Some(c0), Some(c1), Some(c2)) => {
            let key = match path.backends {
                Backends::Local => "ext_local",
                Backends::Remote => "ext_remote",
            };
            let http = grew(&c0, &c1, key);
            let udp = grew(&c1, &c2, key);
            ensure!(
                http >= w.requests && udp >= arrived,
                "{}: switchboard counted {http} {key} packets for {} HTTP requests and {udp} for {arrived} flood datagrams: the traffic did not go through it",
                path.label,
                w.requests
            );
            Some(NsDatapath {
                counter: key.into(),
                during_wrk: http,
                during_flood: udp,
            })
        }
        _ => None,
    };
    note(&format!(
        "{:.0} conn/s ({}; p50 {:.0} us, p99 {:.0} us, {} errors); flood {:.3} Mpps reached the pods ({arrived} of {sent} sent in {wall:.2} s, {per_pod:?} per pod; the flood command took {:.1} s)",
        w.rps,
        w.per_client.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(" + "),
        w.p50_us,
        w.p99_us,
        w.errors,
        mpps,
        flood_took
    ));
    let finite = |x: f64| x.is_finite().then_some(x);
    Ok(NsRound {
        conn_per_s: w.rps,
        conn_per_s_clients: w.per_client,
        p50_us: w.p50_us,
        p99_us: w.p99_us,
        requests: w.requests,
        errors: w.errors,
        flood: Flood {
            mpps: finite(mpps),
            sent,
            arrived,
            arrived_per_pod: per_pod,
            sent_mpps: finite(sent as f64 / wall / 1e6),
            wall_s: finite(wall),
        },
        datapath,
    })
}

/// Runs the north-south part: the per-packet cost of the uplink programs
/// (`sb_bench uplink`), then every path of [`NS_PATHS`] in interleaved rounds.
pub fn run(
    plan: &Plan,
    sb_http: &Path,
    switchboard: &Path,
    sb_bench: &Path,
    dir: &Path,
) -> Result<NorthSouth> {
    progress("north-south per-packet cost: BPF_PROG_TEST_RUN of sb_xdp_uplink / sb_from_uplink next to the empty XDP and tc programs");
    let quick: &[&str] = if plan.quick { &["--quick"] } else { &[] };
    let perpacket = super::run_json(
        sb_bench,
        &[&["uplink"], quick].concat(),
        &dir.join("uplink.json"),
    )?;

    progress("north-south forwarding rate on one core: XDP live frames through sb_xdp_uplink, the empty reflector and pass programs, and kube-proxy's iptables and nftables NodePort rules");
    let xdpfwd = super::xdpfwd::run(sb_bench, plan.quick, dir)?;

    progress("north-south end to end: three two-node sandboxes (direct, switchboard, iptables NodePort rules) with sb-http in every pod");
    let mut sbs = Sandboxes::new(sb_http)?;
    let result = rounds(&mut sbs, plan, switchboard, sb_bench);
    let cleaned = sbs.cleanup();
    let rows = result?;
    cleaned?;
    let paths = NS_PATHS
        .iter()
        .map(|p| NsPathInfo {
            path: p.key.into(),
            label: p.label.into(),
            backends: p.backends.describe().into(),
            via: match p.via {
                Via::Direct => {
                    "none: the pods' own addresses, routed through node A (the limit)".to_string()
                }
                Via::Switchboard("off") => {
                    "switchboard, --xdp-mode off: sb_from_uplink (tc) on node A's uplink"
                        .to_string()
                }
                Via::Switchboard(m) => {
                    format!("switchboard, --xdp-mode {m}: sb_xdp_uplink on node A's uplink")
                }
                Via::Iptables => {
                    "kube-proxy-style iptables NodePort rules in node A's namespace (conntrack)"
                        .to_string()
                }
            },
            client: match p.via {
                Via::Direct => "external client 2 (192.168.50.101)",
                _ => "external client 1 (192.168.50.100)",
            }
            .into(),
        })
        .collect();
    Ok(NorthSouth {
        perpacket,
        xdpfwd,
        paths: Some(paths),
        rows,
        meta: NsMeta {
            flood_cpu: Some(FLOOD_CPU as u64),
            flood_flows: FLOOD_FLOWS.parse().ok(),
            flood_secs: Some(if plan.quick { 2 } else { 5 }),
            wrk_secs: Some(plan.wrk_secs.into()),
            rounds: Some(plan.rounds as u64),
            iptables_rules: Some(iptables_rules()),
        },
    })
}

fn rounds(
    sbs: &mut Sandboxes,
    plan: &Plan,
    switchboard: &Path,
    sb_bench: &Path,
) -> Result<Vec<NsRow>> {
    let mut runs: Vec<Vec<NsRound>> = NS_PATHS.iter().map(|_| Vec::new()).collect();
    for round in 0..plan.rounds {
        // Rotate the start by two paths a round, so switchboard's modes stay
        // grouped (fewer agent restarts) while the order changes.
        for k in 0..NS_PATHS.len() {
            let i = (k + 2 * round) % NS_PATHS.len();
            let path = &NS_PATHS[i];
            progress(&format!(
                "north-south, round {}/{}: {}",
                round + 1,
                plan.rounds,
                path.label
            ));
            runs[i].push(measure(sbs, path, plan, switchboard, sb_bench)?);
        }
    }
    Ok(NS_PATHS
        .iter()
        .zip(runs)
        .map(|(p, r)| NsRow {
            path: p.key.into(),
            label: p.label.into(),
            backends: match p.backends {
                Backends::Local => "local",
                Backends::Remote => "remote",
            }
            .into(),
            m: NsMedians {
                conn_per_s: median_by(&r, |m| Some(m.conn_per_s)),
                p50_us: median_by(&r, |m| Some(m.p50_us)),
                p99_us: median_by(&r, |m| Some(m.p99_us)),
                errors: r.iter().map(|m| m.errors).sum(),
                flood_mpps: median_by(&r, |m| m.flood.mpps),
                flood_sent_mpps: median_by(&r, |m| m.flood.sent_mpps),
                conn_per_s_rounds: r.iter().map(|m| m.conn_per_s).collect(),
                flood_mpps_rounds: r.iter().map(|m| m.flood.mpps).collect(),
            },
            rounds: r,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iptables_nodeport_layout() {
        let r = iptables_rules();
        assert!(r.contains("-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"));
        assert!(r.contains("--dport 30081 -j KUBE-EXT-"));
        assert!(r.contains("-j DNAT --to-destination 10.244.2.3:8080"));
        assert!(r.contains("-j DNAT --to-destination 10.244.1.2:9"));
        // Only the remote Service's two ports are masqueraded in KUBE-EXT.
        assert_eq!(
            r.matches("external destinations\" -j KUBE-MARK-MASQ")
                .count(),
            2
        );
        assert_eq!(r.matches("COMMIT").count(), 2);
    }

    #[test]
    fn manifests_parse() {
        for b in [Backends::Local, Backends::Remote] {
            let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&manifest(b)).unwrap();
            assert_eq!(docs.len(), 2);
            assert_eq!(
                docs[0]["spec"]["ports"][1]["nodePort"].as_u64(),
                Some(u64::from(b.udp_node_port()))
            );
            assert_eq!(
                docs[1]["endpoints"][1]["nodeName"].as_str(),
                Some(b.pods()[1].node.name())
            );
        }
    }
}
