//! The network-namespace sandbox used by `cargo xtask demo` and the e2e tests.
//!
//! One sandbox is a "node" namespace with a veth to a "client" namespace and to
//! three "pod" namespaces:
//!
//! ```text
//!   <tag>-cli  eth0 10.244.100.2/24 ── <tag>c   10.244.100.1/24 ┐
//!   <tag>-p1   eth0 10.244.1.2/24   ── <tag>p1  10.244.1.1/24   ├ <tag>-node (ip_forward=1)
//!   <tag>-p2   eth0 10.244.2.2/24   ── <tag>p2  10.244.2.1/24   │  agent runs here
//!   <tag>-p3   eth0 10.244.3.2/24   ── <tag>p3  10.244.3.1/24   ┘
//! ```
//!
//! Every link is dual-stack: beside `10.244.<n>.2/24` each namespace has
//! `fd00:10:244:<n>::2/64` (the node `fd00:10:244:<n>::1/64`), with an IPv6
//! default route to the node, which forwards both families. Addresses are
//! added without duplicate address detection, so they work at once.
//!
//! Everything is created inside namespaces the sandbox owns; nothing touches
//! the root namespace's interfaces, routes or firewall. The BPF pin root is a
//! bpffs mounted at `/run/switchboard-test/<tag>/bpf` in the root *mount*
//! namespace, because `ip netns exec` gives each command its own `/sys`, and
//! the agent and the CLI (two separate `ip netns exec`s) must see the same pins.
//!
//! Cleanup (explicit `cleanup()` or `Drop`) kills the processes the sandbox
//! started and any other process left in its namespaces, deletes the
//! namespaces (which deletes their veths), unmounts the pin root and removes
//! the directories. `Sandbox::new` first removes leftovers of the same tag, and
//! `cleanup_stale` removes test sandboxes (`sbt<pid>-<n>`) whose process died.

mod cgroup;
mod cleanup;
mod core;
mod netns;
mod output;
mod procs;
mod roles;
mod sys;
pub mod two_node;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};

pub use self::core::{client_run, AgentRef, NetnsCore, PodSpec};
pub use cgroup::TestCgroup;
pub use cleanup::{cleanup_stale, purge_tag, status_file};
pub use netns::{
    disable_tx_checksum, enable_gro, gro_enabled, http_get, in_netns, tx_checksum_enabled,
    HttpResponse,
};
pub use output::{find, find_at, Attempt, Backend, ClientRun, Frontend};
pub use sys::is_mountpoint;
pub use sys::list_netns;
pub use two_node::{Lan, TwoNodeSandbox};

use crate::util::show;
use sys::ip;

/// The ClusterIP of the demo Service (`manifests/demo/service.yaml`).
pub const CLUSTER_IP: &str = "10.96.0.10";
/// Number of pods in a sandbox.
pub const PODS: usize = 3;
/// Port the pods' TCP server listens on.
pub const POD_TCP_PORT: u16 = 8080;
/// Port the pods' UDP server listens on.
pub const POD_UDP_PORT: u16 = 5353;
/// Address of the client namespace.
pub const CLIENT_IP: &str = "10.244.100.2";
/// Where pin roots of sandboxes are mounted.
pub const PIN_BASE: &str = "/run/switchboard-test";
/// What the agent logs once its programs took over (proxy-user's
/// `agent::READY`).
pub const AGENT_READY: &str = "ready: the programs took over";
/// Tag of the demo sandbox (fixed, so a re-run cleans up an interrupted one).
pub const DEMO_TAG: &str = "sbx";

/// Address of pod `i` (1-based).
pub fn pod_ip(i: usize) -> String {
    format!("10.244.{i}.2")
}

/// IPv6 address of pod `i` (1-based).
pub fn pod_ip6(i: usize) -> String {
    format!("fd00:10:244:{i}::2")
}

/// The subnet of [`Sandbox::add_second_client`]'s link (10.244.101.0/24).
const SECOND_CLIENT_SUBNET: usize = 101;

/// IPv6 address of the client namespace.
pub const CLIENT_IP6: &str = "fd00:10:244:100::2";

/// The node's IPv6 address on the link of subnet `n` (a pod's index, or 100
/// for the client).
pub fn node_ip6(n: usize) -> String {
    format!("fd00:10:244:{n}::1")
}

/// Name of pod `i` (1-based), as it answers.
pub fn pod_name(i: usize) -> String {
    format!("pod{i}")
}

/// The one-node sandbox, on the [`NetnsCore`] (which it dereferences to:
/// `tag`, `dir`, `exec`, `command`, `spawn`, logs, `cleanup`, ...).
pub struct Sandbox {
    core: NetnsCore,
    /// The bpffs mount used as the agent's `--pin-root`.
    pub pin_dir: PathBuf,
}

self::core::built_on_core!(Sandbox);

/// The one node's agent: label `agent` in the node namespace.
pub const AGENT: &str = "agent";

/// The IPv6 half of one node–peer link: `fd00:10:244:<subnet>::1/64` on the
/// node's side, `::2/64` on the peer's with a default route to the node.
fn add_ipv6(node: &str, host_if: &str, peer_ns: &str, subnet: usize) -> Result<()> {
    let host = format!("{}/64", node_ip6(subnet));
    let peer = format!("fd00:10:244:{subnet}::2/64");
    ip(&[
        "-n", node, "-6", "addr", "add", &host, "dev", host_if, "nodad",
    ])?;
    ip(&[
        "-n", peer_ns, "-6", "addr", "add", &peer, "dev", "eth0", "nodad",
    ])?;
    ip(&[
        "-n",
        peer_ns,
        "-6",
        "route",
        "add",
        "default",
        "via",
        &node_ip6(subnet),
    ])?;
    Ok(())
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A test tag unique to this process and call, `sbt<pid>-<n>` (shared by the
/// one-node and the two-node sandbox). The first call also removes
/// sandboxes left by test processes that died.
pub(crate) fn next_test_tag() -> String {
    static STALE: std::sync::Once = std::sync::Once::new();
    STALE.call_once(|| {
        if let Err(e) = cleanup_stale() {
            eprintln!("sandbox: cleaning stale sandboxes: {e:#}");
        }
    });
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    format!("sbt{}-{n}", std::process::id())
}

impl Sandbox {
    /// A sandbox with a tag unique to this process and call: `sbt<pid>-<n>`.
    /// Also removes sandboxes left by test processes that died.
    pub fn for_test() -> Result<Sandbox> {
        Sandbox::new(&next_test_tag())
    }

    /// Creates the sandbox `tag`, first removing leftovers with the same tag.
    pub fn new(tag: &str) -> Result<Sandbox> {
        // Host-side interface names are `<tag>c` and `<tag>p<i>`: IFNAMSIZ is 16.
        let core = NetnsCore::new(tag)?;
        let pin_dir = core.run_dir().join("bpf");
        let mut sb = Sandbox { core, pin_dir };
        // On error, Drop cleans up whatever was created so far.
        sb.setup()?;
        Ok(sb)
    }

    pub fn node_ns(&self) -> String {
        format!("{}-node", self.tag)
    }
    pub fn client_ns(&self) -> String {
        format!("{}-cli", self.tag)
    }
    pub fn pod_ns(&self, i: usize) -> String {
        format!("{}-p{i}", self.tag)
    }
    /// Host-side (node namespace) interface of the client.
    pub fn client_if(&self) -> String {
        format!("{}c", self.tag)
    }
    /// Host-side (node namespace) interface of pod `i`.
    pub fn pod_if(&self, i: usize) -> String {
        format!("{}p{i}", self.tag)
    }
    /// The sandbox's cgroup, the agent's socket layer attaches to
    /// (`--cgroup-root`) and that clients join with
    /// [`Sandbox::client_in_cgroup`].
    pub fn cgroup(&self) -> Option<&TestCgroup> {
        self.core.node_cgroup(0)
    }

    /// The node's agent, for the core.
    fn agent(&self) -> AgentRef {
        AgentRef {
            label: AGENT.to_string(),
            ns: self.node_ns(),
            node: 0,
        }
    }

    fn setup(&mut self) -> Result<()> {
        let mut all = vec![self.node_ns(), self.client_ns()];
        all.extend((1..=PODS).map(|i| self.pod_ns(i)));
        for ns in &all {
            self.core.add_netns(ns)?;
        }
        let node = self.node_ns();
        self.exec(
            &node,
            &[
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/ipv4/ip_forward && echo 1 > /proc/sys/net/ipv6/conf/all/forwarding",
            ],
        )?;

        let mut links = vec![(self.client_ns(), self.client_if(), 100usize)];
        links.extend((1..=PODS).map(|i| (self.pod_ns(i), self.pod_if(i), i)));
        for (peer_ns, host_if, subnet) in links {
            self.link(&peer_ns, &host_if, subnet)?;
        }

        let run_dir = self.core.run_dir();
        let tag = self.tag.clone();
        self.core.add_node(&run_dir, &tag)?;
        Ok(())
    }

    /// A second client namespace (`<tag>-c2`, 10.244.101.2, host-side
    /// interface `<tag>c2`), for a pod client whose traffic must not share
    /// the first client's pod interface (the benchmark's tc row: its
    /// translated flows would make the first client's pod not quiet). Added
    /// before the agent starts, it is one more pod interface to it.
    pub fn add_second_client(&mut self) -> Result<()> {
        let ns = self.second_client_ns();
        self.core.add_netns(&ns)?;
        self.link(&ns, &format!("{}c2", self.tag), SECOND_CLIENT_SUBNET)
    }

    /// The namespace [`Sandbox::add_second_client`] adds.
    pub fn second_client_ns(&self) -> String {
        format!("{}-c2", self.tag)
    }

    /// A veth from the node namespace (`host_if`, 10.244.`subnet`.1 and
    /// fd00:10:244:`subnet`::1) to `eth0` in `peer_ns` (.2 and ::2, the
    /// node its default route).
    fn link(&self, peer_ns: &str, host_if: &str, subnet: usize) -> Result<()> {
        let node = self.node_ns();
        let host_addr = format!("10.244.{subnet}.1");
        let peer_addr = format!("10.244.{subnet}.2");
        // Created directly inside the node namespace, peer directly in its
        // own namespace: nothing ever appears in the root namespace.
        ip(&[
            "-n", &node, "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns",
            peer_ns,
        ])?;
        let host_cidr = format!("{host_addr}/24");
        ip(&["-n", &node, "addr", "add", &host_cidr, "dev", host_if])?;
        ip(&["-n", &node, "link", "set", host_if, "up"])?;
        let peer_cidr = format!("{peer_addr}/24");
        ip(&["-n", peer_ns, "addr", "add", &peer_cidr, "dev", "eth0"])?;
        ip(&["-n", peer_ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", peer_ns, "route", "add", "default", "via", &host_addr])?;
        add_ipv6(&node, host_if, peer_ns, subnet)
    }

    /// Gives every pod `addr` as well (on its loopback) and routes `addr`
    /// from the node over all pods at once: one multipath route whose
    /// next hop is chosen per flow by a hash of addresses and ports
    /// (`fib_multipath_hash_policy` 1, set in the node namespace only). Each
    /// connection to `addr` lands on one pod, as a balancer spreads them,
    /// with no address translated and no connection tracked.
    pub fn add_spread_address(&self, addr: &str) -> Result<()> {
        let node = self.node_ns();
        self.exec(
            &node,
            &[
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/ipv4/fib_multipath_hash_policy",
            ],
        )?;
        let host = format!("{addr}/32");
        let mut route = vec![
            "-n".to_string(),
            node,
            "route".into(),
            "add".into(),
            host.clone(),
        ];
        for i in 1..=PODS {
            ip(&["-n", &self.pod_ns(i), "addr", "add", &host, "dev", "lo"])?;
            route.extend(["nexthop", "via", &pod_ip(i), "dev", &self.pod_if(i)].map(String::from));
        }
        ip(&route.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Starts `sb-echo` as pod1..pod3 (TCP 8080, UDP 5353) and waits until
    /// each answers on its own address (TCP, both families: the sandbox is
    /// dual-stack), from the client namespace.
    pub fn start_pods(&mut self, sb_echo: &Path) -> Result<()> {
        let pods: Vec<PodSpec> = (1..=PODS)
            .map(|i| PodSpec {
                ns: self.pod_ns(i),
                name: pod_name(i),
                targets: vec![
                    ("--tcp", format!("{}:{POD_TCP_PORT}", pod_ip(i))),
                    ("--tcp", format!("[{}]:{POD_TCP_PORT}", pod_ip6(i))),
                ],
            })
            .collect();
        let client = self.client_ns();
        self.core.start_pods(sb_echo, &pods, &client)
    }

    /// Copies every file of `src` into the sandbox's manifest directory.
    pub fn copy_manifests(&self, src: &Path) -> Result<()> {
        for entry in fs::read_dir(src).with_context(|| format!("read {}", src.display()))? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                fs::copy(entry.path(), self.manifest_dir().join(entry.file_name()))?;
            }
        }
        Ok(())
    }

    /// Starts `switchboard agent --source dir:<manifest dir> --pin-root <pin
    /// dir> --cgroup-root <the sandbox's cgroup>` in the node namespace with
    /// RUST_LOG=info, logging to `agent.log`.
    pub fn start_agent(&mut self, switchboard: &Path) -> Result<u32> {
        self.start_agent_with(switchboard, &[])
    }

    /// `start_agent` with extra agent arguments (e.g. `--socket-lb=false`).
    pub fn start_agent_with(&mut self, switchboard: &Path, extra: &[&str]) -> Result<u32> {
        let source = format!("dir:{}", self.manifest_dir().display());
        self.start_agent_from(switchboard, &source, extra)
    }

    /// `start_agent_with` from another `--source` (e.g. `cluster`, with
    /// `--kubeconfig` among `extra`).
    pub fn start_agent_from(
        &mut self,
        switchboard: &Path,
        source: &str,
        extra: &[&str],
    ) -> Result<u32> {
        let agent = self.agent();
        self.core.start_agent(&agent, switchboard, source, extra)
    }

    /// Stops the agent with SIGTERM (SIGKILL after 5 s); returns its exit status.
    pub fn stop_agent(&mut self) -> Result<std::process::ExitStatus> {
        self.core.stop(AGENT)
    }

    /// The running agent's pid.
    pub fn agent_pid(&self) -> Option<u32> {
        self.core.pid(AGENT)
    }

    /// Kills the agent with SIGKILL; returns its exit status.
    pub fn kill_agent(&mut self) -> Result<std::process::ExitStatus> {
        self.core.kill(AGENT)
    }

    /// Whether the agent process is still running.
    pub fn agent_running(&mut self) -> bool {
        self.core.running(AGENT)
    }

    /// Whether the agent (any process started with the label `agent`) has
    /// logged that its programs took over.
    pub fn agent_ready(&self) -> bool {
        self.core.agent_ready(AGENT)
    }

    /// The agent's log so far (empty if it was not started).
    pub fn agent_log(&self) -> String {
        self.read_log(AGENT)
    }

    /// `switchboard services --pin-root <pin dir> [-o json]` in the node
    /// namespace; returns stdout.
    pub fn services_raw(&self, switchboard: &Path, json: bool) -> Result<String> {
        self.core.services_raw(&self.agent(), switchboard, json)
    }

    /// `switchboard services -o json`, parsed.
    pub fn services(&self, switchboard: &Path) -> Result<Vec<Frontend>> {
        self.core.services(&self.agent(), switchboard)
    }

    /// Polls `switchboard services -o json` until `pred` holds; on timeout the
    /// error carries the last output and the agent log.
    pub fn wait_services(
        &mut self,
        switchboard: &Path,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&[Frontend]) -> bool,
    ) -> Result<Vec<Frontend>> {
        let agent = self.agent();
        self.core
            .wait_services(&agent, switchboard, timeout, what, pred)
    }

    /// Runs `sb-echo client <args>` in the client namespace and parses its
    /// lines. Does not fail when attempts fail: inspect the result.
    pub fn client(&self, sb_echo: &Path, args: &[&str]) -> Result<ClientRun> {
        self.core.client_in(sb_echo, &self.client_ns(), args)
    }

    /// Runs `sb-echo client <args>` in namespace `ns` as a member of the
    /// sandbox's cgroup (so the socket layer balances it) and parses its
    /// output. `ns` is the node's namespace for a host client.
    pub fn client_in_cgroup(&self, sb_echo: &Path, ns: &str, args: &[&str]) -> Result<ClientRun> {
        let child = self.client_in_cgroup_spawn(sb_echo, ns, args)?;
        let out = child
            .wait_with_output()
            .context("wait for sb-echo client")?;
        client_run(&out, ns, args)
    }

    /// `client_in_cgroup` without waiting (stdout and stderr piped).
    pub fn client_in_cgroup_spawn(&self, sb_echo: &Path, ns: &str, args: &[&str]) -> Result<Child> {
        let bin = sb_echo.to_string_lossy().into_owned();
        let mut cmd = vec![bin.as_str(), "client"];
        cmd.extend_from_slice(args);
        let mut c = self.command_in_cgroup(ns, &cmd)?;
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn()
            .with_context(|| format!("could not start `{}`", show(&c)))
    }

    /// `ip netns exec <ns> <cmd...>` run as a member of the sandbox's cgroup,
    /// so the agent's socket layer balances it (`ns` is the node's namespace
    /// for a host client).
    pub fn command_in_cgroup(&self, ns: &str, cmd: &[&str]) -> Result<Command> {
        let cgroup = self
            .cgroup()
            .ok_or_else(|| anyhow!("sandbox has no cgroup"))?;
        let mut c = self.command(ns, cmd);
        cgroup.join_on_exec(&mut c)?;
        Ok(c)
    }

    /// Starts `sb-echo client <args>` in the client namespace without waiting
    /// (stdout piped); parse with `ClientRun::parse` after `wait_with_output`.
    pub fn client_spawn(&self, sb_echo: &Path, args: &[&str]) -> Result<Child> {
        let bin = sb_echo.to_string_lossy().into_owned();
        let mut cmd = vec![bin.as_str(), "client"];
        cmd.extend_from_slice(args);
        let mut c = self.command(&self.client_ns(), &cmd);
        c.stdin(Stdio::null()).stdout(Stdio::piped());
        c.spawn()
            .with_context(|| format!("could not start `{}`", show(&c)))
    }
}

#[cfg(test)]
mod tests {
    use super::cleanup::{status_file_tag, test_tag_of, test_tag_pid};
    use super::roles::is_role;
    use super::*;

    #[test]
    fn tags_and_roles() {
        assert_eq!(test_tag_pid("sbt123-4"), Some(123));
        assert_eq!(test_tag_pid("sbx"), None);
        assert_eq!(test_tag_pid("sbt123"), None);
        assert_eq!(test_tag_of("sbt123-4-node").as_deref(), Some("sbt123-4"));
        assert_eq!(test_tag_of("sbt123-4-p3").as_deref(), Some("sbt123-4"));
        assert_eq!(test_tag_of("sbt123-4-other"), None);
        assert_eq!(test_tag_of("sbx-node"), None);
        assert!(is_role("p12") && !is_role("p") && !is_role("px"));
    }

    #[test]
    fn longest_test_tag_fits_interface_names() {
        // pid_max is at most 2^22 = 4194304 (7 digits).
        let tag = "sbt4194304-99";
        assert!(tag.len() + 2 <= 15);
    }

    #[test]
    fn status_file_matches_the_agent() {
        let path = status_file(&Path::new(PIN_BASE).join("sbt12-0").join("bpf"));
        assert_eq!(
            path,
            Path::new("/run/switchboard/status/_run_switchboard-test_sbt12-0_bpf.json")
        );
        let name = path.file_name().unwrap().to_str().unwrap();
        assert_eq!(status_file_tag(name), Some("sbt12-0"));
        assert_eq!(status_file_tag("_run_switchboard-test_sbx_bpf.json"), None);
        assert_eq!(status_file_tag("_sys_fs_bpf_switchboard.json"), None);
    }

    #[test]
    fn parse_client_lines() {
        let run = ClientRun::parse(
            "ok 17 pod1 10.244.100.2:4000 10.96.0.10:80\nerr 18 connect: Connection refused (os error 111)\n",
        )
        .unwrap();
        assert_eq!(run.attempts.len(), 2);
        assert_eq!(run.names(), vec!["pod1".to_string()]);
        assert_eq!(run.failures(), 1);
        assert_eq!(run.client_saw(), vec!["10.96.0.10:80".to_string()]);
        assert!(!run.all_ok());
        match &run.attempts[1] {
            Attempt::Err { start_ms, message } => {
                assert_eq!(*start_ms, 18);
                assert!(message.starts_with("connect:"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parse_services_json() {
        let raw = r#"[{"service":"demo/echo:http","id":1,"address":"10.96.0.10","port":80,"protocol":"TCP","backends":[{"id":3,"address":"10.244.1.2","port":8080}]}]"#;
        let f: Vec<Frontend> = serde_json::from_str(raw).unwrap();
        assert_eq!(
            find(&f, "demo/echo:http").unwrap().backend_addrs(),
            vec!["10.244.1.2:8080"]
        );
    }
}
