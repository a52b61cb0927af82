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

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Deserialize;

use crate::util::{run_capture, show};

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
/// Tag of the demo sandbox (fixed, so a re-run cleans up an interrupted one).
pub const DEMO_TAG: &str = "sbx";

/// Address of pod `i` (1-based).
pub fn pod_ip(i: usize) -> String {
    format!("10.244.{i}.2")
}

/// Name of pod `i` (1-based), as it answers.
pub fn pod_name(i: usize) -> String {
    format!("pod{i}")
}

pub struct Sandbox {
    pub tag: String,
    /// Temporary directory for logs and manifests.
    pub dir: PathBuf,
    /// The bpffs mount used as the agent's `--pin-root`.
    pub pin_dir: PathBuf,
    namespaces: Vec<String>,
    children: Vec<(String, Child)>,
    agent_log: Option<PathBuf>,
    mounted: bool,
    cleaned: bool,
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

impl Sandbox {
    /// A sandbox with a tag unique to this process and call: `sbt<pid>-<n>`.
    /// Also removes sandboxes left by test processes that died.
    pub fn for_test() -> Result<Sandbox> {
        static STALE: std::sync::Once = std::sync::Once::new();
        STALE.call_once(|| {
            if let Err(e) = cleanup_stale() {
                eprintln!("sandbox: cleaning stale sandboxes: {e:#}");
            }
        });
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        Sandbox::new(&format!("sbt{}-{n}", std::process::id()))
    }

    /// Creates the sandbox `tag`, first removing leftovers with the same tag.
    pub fn new(tag: &str) -> Result<Sandbox> {
        // Host-side interface names are `<tag>c` and `<tag>p<i>`: IFNAMSIZ is 16.
        if tag.len() + 2 > 15 {
            bail!("sandbox tag {tag:?} too long for interface names");
        }
        if !crate::util::is_root() {
            bail!("the netns sandbox needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF)");
        }
        purge_tag(tag)?;
        let mut sb = Sandbox {
            tag: tag.to_string(),
            dir: std::env::temp_dir().join(format!("switchboard-{tag}")),
            pin_dir: Path::new(PIN_BASE).join(tag).join("bpf"),
            namespaces: Vec::new(),
            children: Vec::new(),
            agent_log: None,
            mounted: false,
            cleaned: false,
        };
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
    /// Directory for manifests handed to the agent (`--source dir:`).
    pub fn manifest_dir(&self) -> PathBuf {
        self.dir.join("manifests")
    }

    fn setup(&mut self) -> Result<()> {
        fs::create_dir_all(self.manifest_dir())
            .with_context(|| format!("create {}", self.dir.display()))?;

        let mut all = vec![self.node_ns(), self.client_ns()];
        all.extend((1..=PODS).map(|i| self.pod_ns(i)));
        for ns in &all {
            ip(&["netns", "add", ns])?;
            self.namespaces.push(ns.clone());
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        let node = self.node_ns();
        self.exec(
            &node,
            &["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"],
        )?;

        let mut links = vec![(self.client_ns(), self.client_if(), 100usize)];
        links.extend((1..=PODS).map(|i| (self.pod_ns(i), self.pod_if(i), i)));
        for (peer_ns, host_if, subnet) in links {
            let host_addr = format!("10.244.{subnet}.1");
            let peer_addr = format!("10.244.{subnet}.2");
            // Created directly inside the node namespace, peer directly in its
            // own namespace: nothing ever appears in the root namespace.
            ip(&[
                "-n", &node, "link", "add", &host_if, "type", "veth", "peer", "name", "eth0",
                "netns", &peer_ns,
            ])?;
            ip(&[
                "-n",
                &node,
                "addr",
                "add",
                &format!("{host_addr}/24"),
                "dev",
                &host_if,
            ])?;
            ip(&["-n", &node, "link", "set", &host_if, "up"])?;
            ip(&[
                "-n",
                &peer_ns,
                "addr",
                "add",
                &format!("{peer_addr}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &peer_ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &peer_ns, "route", "add", "default", "via", &host_addr])?;
        }

        fs::create_dir_all(&self.pin_dir)
            .with_context(|| format!("create {}", self.pin_dir.display()))?;
        mount_bpffs(&self.pin_dir)?;
        self.mounted = true;
        Ok(())
    }

    /// Runs `cmd` inside namespace `ns`, waits, and returns its output; fails
    /// if it exits non-zero.
    pub fn exec(&self, ns: &str, cmd: &[&str]) -> Result<Output> {
        run_capture(&mut self.command(ns, cmd))
    }

    /// Runs `cmd` in `ns` and returns its output whatever the exit status.
    pub fn exec_status(&self, ns: &str, cmd: &[&str]) -> Result<Output> {
        let mut c = self.command(ns, cmd);
        c.stdin(Stdio::null())
            .output()
            .with_context(|| format!("could not start `{}`", show(&c)))
    }

    /// `ip netns exec <ns> <cmd...>`, dying with us.
    pub fn command(&self, ns: &str, cmd: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).args(cmd);
        die_with_parent(&mut c);
        c
    }

    /// Starts `cmd` in `ns` in the background; stdout and stderr go to
    /// `<dir>/<label>.log`. The sandbox kills it on cleanup.
    pub fn spawn(&mut self, label: &str, ns: &str, cmd: &[&str]) -> Result<u32> {
        self.spawn_env(label, ns, cmd, &[])
    }

    fn spawn_env(
        &mut self,
        label: &str,
        ns: &str,
        cmd: &[&str],
        env: &[(&str, &str)],
    ) -> Result<u32> {
        let log_path = self.log_path(label);
        let log = fs::File::create(&log_path)
            .with_context(|| format!("create {}", log_path.display()))?;
        let mut c = self.command(ns, cmd);
        c.stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .envs(env.iter().copied());
        let child = c
            .spawn()
            .with_context(|| format!("could not start `{}`", show(&c)))?;
        let pid = child.id();
        self.children.push((label.to_string(), child));
        Ok(pid)
    }

    pub fn log_path(&self, label: &str) -> PathBuf {
        self.dir.join(format!("{label}.log"))
    }

    /// Starts `sb-echo` as pod1..pod3 (TCP 8080, UDP 5353) and waits until
    /// each answers on its own address, from the client namespace.
    pub fn start_pods(&mut self, sb_echo: &Path) -> Result<()> {
        let bin = sb_echo.to_string_lossy().into_owned();
        for i in 1..=PODS {
            let (ns, name) = (self.pod_ns(i), pod_name(i));
            self.spawn(
                &name,
                &ns,
                &[
                    &bin,
                    "--name",
                    &name,
                    "--tcp",
                    &POD_TCP_PORT.to_string(),
                    "--udp",
                    &POD_UDP_PORT.to_string(),
                ],
            )?;
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for i in 1..=PODS {
            let addr = format!("{}:{POD_TCP_PORT}", pod_ip(i));
            loop {
                let run = self.client(sb_echo, &["--tcp", &addr, "--timeout-ms", "300"])?;
                if run.all_ok() && run.names() == vec![pod_name(i)] {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "pod{i} does not answer on {addr} from the client: {}\npod log:\n{}",
                        run.raw,
                        self.read_log(&pod_name(i))
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
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
    /// dir>` in the node namespace with RUST_LOG=info, logging to `agent.log`.
    pub fn start_agent(&mut self, switchboard: &Path) -> Result<u32> {
        let bin = switchboard.to_string_lossy().into_owned();
        let source = format!("dir:{}", self.manifest_dir().display());
        let pin = self.pin_dir.to_string_lossy().into_owned();
        let node = self.node_ns();
        let rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
        let pid = self.spawn_env(
            "agent",
            &node,
            &[&bin, "agent", "--source", &source, "--pin-root", &pin],
            &[("RUST_LOG", &rust_log)],
        )?;
        self.agent_log = Some(self.log_path("agent"));
        Ok(pid)
    }

    /// Stops the agent with SIGTERM (SIGKILL after 5 s); returns its exit status.
    pub fn stop_agent(&mut self) -> Result<std::process::ExitStatus> {
        let idx = self
            .children
            .iter()
            .position(|(label, _)| label == "agent")
            .ok_or_else(|| anyhow!("no agent was started"))?;
        let (_, mut child) = self.children.remove(idx);
        if let Ok(Some(status)) = child.try_wait() {
            return Ok(status);
        }
        signal(child.id() as i32, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill()?;
        bail!("agent did not exit within 5 s of SIGTERM (killed)");
    }

    /// Whether the agent process is still running.
    pub fn agent_running(&mut self) -> bool {
        self.children
            .iter_mut()
            .find(|(label, _)| label == "agent")
            .map(|(_, child)| matches!(child.try_wait(), Ok(None)))
            .unwrap_or(false)
    }

    /// The agent's log so far (empty if it was not started).
    pub fn agent_log(&self) -> String {
        self.read_log("agent")
    }

    pub fn read_log(&self, label: &str) -> String {
        fs::read_to_string(self.log_path(label)).unwrap_or_default()
    }

    /// `switchboard services --pin-root <pin dir> [-o json]` in the node
    /// namespace; returns stdout.
    pub fn services_raw(&self, switchboard: &Path, json: bool) -> Result<String> {
        let bin = switchboard.to_string_lossy().into_owned();
        let pin = self.pin_dir.to_string_lossy().into_owned();
        let mut args = vec![bin.as_str(), "services", "--pin-root", &pin];
        if json {
            args.extend(["-o", "json"]);
        }
        let out = self.exec(&self.node_ns(), &args)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `switchboard services -o json`, parsed.
    pub fn services(&self, switchboard: &Path) -> Result<Vec<Frontend>> {
        let raw = self.services_raw(switchboard, true)?;
        serde_json::from_str(&raw)
            .with_context(|| format!("parse `switchboard services -o json` output: {raw}"))
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
        let deadline = Instant::now() + timeout;
        let mut last;
        loop {
            match self.services(switchboard) {
                Ok(frontends) if pred(&frontends) => return Ok(frontends),
                Ok(frontends) => last = format!("{frontends:#?}"),
                Err(e) => last = format!("{e:#}"),
            }
            if Instant::now() > deadline || (self.agent_log.is_some() && !self.agent_running()) {
                let state = if self.agent_running() {
                    "agent running"
                } else {
                    "agent NOT running"
                };
                bail!(
                    "timed out after {timeout:?} waiting for {what} ({state}); last `services -o json`: {last}\n\
                     --- agent log ---\n{}--- end agent log ---",
                    self.agent_log()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `sb-echo client <args>` in the client namespace and parses its
    /// lines. Does not fail when attempts fail: inspect the result.
    pub fn client(&self, sb_echo: &Path, args: &[&str]) -> Result<ClientRun> {
        let bin = sb_echo.to_string_lossy().into_owned();
        let mut cmd = vec![bin.as_str(), "client"];
        cmd.extend_from_slice(args);
        let out = self.exec_status(&self.client_ns(), &cmd)?;
        let raw = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.code() == Some(2) || out.status.code().is_none() {
            bail!(
                "sb-echo client {args:?} failed: {} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        ClientRun::parse(&raw)
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

    /// Kills started processes, deletes the namespaces, unmounts the pin root
    /// and removes the directories. Idempotent; Drop calls it too.
    pub fn cleanup(&mut self) -> Result<()> {
        if self.cleaned {
            return Ok(());
        }
        self.cleaned = true;
        let mut errors = Vec::new();
        // SIGTERM first so the agent can exit cleanly, then SIGKILL.
        for (_, child) in &mut self.children {
            if let Ok(None) = child.try_wait() {
                signal(child.id() as i32, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        for (label, child) in &mut self.children {
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        eprintln!("sandbox: {label} did not exit on SIGTERM, killing it");
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                }
            }
        }
        self.children.clear();
        for ns in self.namespaces.drain(..) {
            if let Err(e) = delete_netns(&ns) {
                errors.push(format!("{e:#}"));
            }
        }
        if self.mounted {
            if let Err(e) = umount(&self.pin_dir) {
                errors.push(format!("{e:#}"));
            }
            self.mounted = false;
        }
        let tag_dir = Path::new(PIN_BASE).join(&self.tag);
        if let Err(e) = remove_dir_if_exists(&tag_dir) {
            errors.push(format!("{e:#}"));
        }
        remove_status_file(&self.pin_dir);
        // Only succeeds when no other sandbox uses it.
        let _ = fs::remove_dir(PIN_BASE);
        if std::env::var_os("SB_KEEP_LOGS").is_none() {
            let _ = fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("sandbox: logs kept in {}", self.dir.display());
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(anyhow!(
                "sandbox {} cleanup: {}",
                self.tag,
                errors.join("; ")
            ))
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.cleaned && self.agent_log.is_some() {
            eprintln!(
                "--- agent log of sandbox {} ---\n{}--- end agent log ---",
                self.tag,
                self.agent_log()
            );
        }
        if let Err(e) = self.cleanup() {
            eprintln!("{e:#}");
        }
    }
}

/// One `switchboard services -o json` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Frontend {
    pub service: String,
    #[serde(default)]
    pub id: u64,
    pub address: String,
    pub port: u16,
    pub protocol: String,
    #[serde(default)]
    pub backends: Vec<Backend>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Backend {
    #[serde(default)]
    pub id: u64,
    pub address: String,
    pub port: u16,
}

impl Frontend {
    /// Backends as sorted `address:port` strings.
    pub fn backend_addrs(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .backends
            .iter()
            .map(|b| format!("{}:{}", b.address, b.port))
            .collect();
        v.sort();
        v
    }
}

/// Finds the frontend for `service` (e.g. `demo/echo:http`).
pub fn find<'a>(frontends: &'a [Frontend], service: &str) -> Option<&'a Frontend> {
    frontends.iter().find(|f| f.service == service)
}

/// One attempt of `sb-echo client`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Ok {
        start_ms: u128,
        /// Which pod answered.
        name: String,
        /// The peer address the pod saw (the client's address).
        pod_saw: String,
        /// The peer address the client saw (should be the ClusterIP).
        client_saw: String,
    },
    Err {
        start_ms: u128,
        message: String,
    },
}

impl Attempt {
    pub fn start_ms(&self) -> u128 {
        match self {
            Attempt::Ok { start_ms, .. } | Attempt::Err { start_ms, .. } => *start_ms,
        }
    }
    pub fn name(&self) -> Option<&str> {
        match self {
            Attempt::Ok { name, .. } => Some(name),
            Attempt::Err { .. } => None,
        }
    }
}

/// Parsed output of one `sb-echo client` run.
#[derive(Debug, Clone)]
pub struct ClientRun {
    pub attempts: Vec<Attempt>,
    pub raw: String,
}

impl ClientRun {
    pub fn parse(raw: &str) -> Result<ClientRun> {
        let mut attempts = Vec::new();
        for line in raw.lines().filter(|l| !l.trim().is_empty()) {
            let mut parts = line.splitn(3, ' ');
            let kind = parts.next().unwrap_or_default();
            let start_ms: u128 = parts
                .next()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| anyhow!("bad client line {line:?}"))?;
            let rest = parts.next().unwrap_or_default();
            attempts.push(match kind {
                "ok" => {
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    if f.len() < 3 {
                        bail!("bad client line {line:?}");
                    }
                    Attempt::Ok {
                        start_ms,
                        name: f[0].to_string(),
                        pod_saw: f[1].to_string(),
                        client_saw: f[2].to_string(),
                    }
                }
                "err" => Attempt::Err {
                    start_ms,
                    message: rest.to_string(),
                },
                _ => bail!("bad client line {line:?}"),
            });
        }
        Ok(ClientRun {
            attempts,
            raw: raw.to_string(),
        })
    }

    pub fn all_ok(&self) -> bool {
        !self.attempts.is_empty()
            && self
                .attempts
                .iter()
                .all(|a| matches!(a, Attempt::Ok { .. }))
    }

    pub fn failures(&self) -> usize {
        self.attempts
            .iter()
            .filter(|a| matches!(a, Attempt::Err { .. }))
            .count()
    }

    /// Names of the pods that answered, in order.
    pub fn names(&self) -> Vec<String> {
        self.attempts
            .iter()
            .filter_map(|a| a.name().map(str::to_string))
            .collect()
    }

    /// How many answers each pod gave.
    pub fn spread(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for n in self.names() {
            *m.entry(n).or_insert(0) += 1;
        }
        m
    }

    /// Distinct peer addresses the client saw.
    pub fn client_saw(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .attempts
            .iter()
            .filter_map(|a| match a {
                Attempt::Ok { client_saw, .. } => Some(client_saw.clone()),
                Attempt::Err { .. } => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// Removes test sandboxes (`sbt<pid>-<n>-*` namespaces and pin mounts) whose
/// process is gone. Sandboxes of live processes are left alone.
pub fn cleanup_stale() -> Result<()> {
    let mut tags: Vec<String> = Vec::new();
    for ns in list_netns()? {
        if let Some(tag) = test_tag_of(&ns) {
            tags.push(tag);
        }
    }
    if let Ok(entries) = fs::read_dir(PIN_BASE) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if test_tag_pid(&name).is_some() {
                tags.push(name);
            }
        }
    }
    // Agent status files of test sandboxes (named after their pin roots).
    if let Ok(entries) = fs::read_dir(STATUS_DIR) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(tag) = status_file_tag(&name) {
                tags.push(tag.to_string());
            }
        }
    }
    tags.sort();
    tags.dedup();
    for tag in tags {
        let pid = test_tag_pid(&tag).expect("filtered above");
        if !Path::new(&format!("/proc/{pid}")).exists() {
            println!("sandbox: removing stale sandbox {tag} (process {pid} is gone)");
            purge_tag(&tag)?;
        }
    }
    Ok(())
}

/// The test tag of an agent status file name
/// (`_run_switchboard-test_sbt<pid>-<n>_bpf.json` → `sbt<pid>-<n>`).
fn status_file_tag(name: &str) -> Option<&str> {
    let prefix = format!("{}_", PIN_BASE.replace('/', "_"));
    let tag = name.strip_prefix(&prefix)?.strip_suffix("_bpf.json")?;
    test_tag_pid(tag).map(|_| tag)
}

/// `sbt<pid>-<n>` → pid.
fn test_tag_pid(tag: &str) -> Option<u32> {
    let rest = tag.strip_prefix("sbt")?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// `sbt<pid>-<n>-<role>` → `sbt<pid>-<n>` if role is one a sandbox creates.
fn test_tag_of(ns: &str) -> Option<String> {
    let (tag, role) = ns.rsplit_once('-')?;
    test_tag_pid(tag)?;
    is_role(role).then(|| tag.to_string())
}

fn is_role(role: &str) -> bool {
    role == "node"
        || role == "cli"
        || role
            .strip_prefix('p')
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
}

/// Removes everything a sandbox with this tag may have left: its namespaces
/// (and the processes in them), its pin mount and directories.
/// Best effort: carries on past errors and reports them all at the end.
pub fn purge_tag(tag: &str) -> Result<()> {
    let mut errors = Vec::new();
    for ns in list_netns()? {
        if let Some((t, role)) = ns.rsplit_once('-') {
            if t == tag && is_role(role) {
                println!("sandbox: removing leftover namespace {ns}");
                if let Err(e) = delete_netns(&ns) {
                    errors.push(format!("{e:#}"));
                }
            }
        }
    }
    let tag_dir = Path::new(PIN_BASE).join(tag);
    let pin_dir = tag_dir.join("bpf");
    for _ in 0..8 {
        if !is_mountpoint(&pin_dir) {
            break;
        }
        println!("sandbox: unmounting leftover {}", pin_dir.display());
        if let Err(e) = umount(&pin_dir) {
            errors.push(format!("{e:#}"));
            break;
        }
    }
    if let Err(e) = remove_dir_if_exists(&tag_dir) {
        errors.push(format!("{e:#}"));
    }
    remove_status_file(&pin_dir);
    let _ = fs::remove_dir(PIN_BASE);
    let _ = fs::remove_dir_all(std::env::temp_dir().join(format!("switchboard-{tag}")));
    if errors.is_empty() {
        Ok(())
    } else {
        Err(anyhow!("removing sandbox {tag}: {}", errors.join("; ")))
    }
}

/// Where the agent writes its status files (proxy-user's `status::STATUS_DIR`).
const STATUS_DIR: &str = "/run/switchboard/status";

/// The agent's status file for `pin_dir` (proxy-user's `status::status_path`:
/// `/run/switchboard/status/<pin root with / as _>.json`).
pub fn status_file(pin_dir: &Path) -> PathBuf {
    let name: String = pin_dir
        .to_string_lossy()
        .chars()
        .map(|c| if c == '/' { '_' } else { c })
        .collect();
    Path::new(STATUS_DIR).join(format!("{name}.json"))
}

/// Removes the agent's status file for `pin_dir`, if any (never the directory,
/// which other agents on the machine may use).
fn remove_status_file(pin_dir: &Path) {
    let _ = fs::remove_file(status_file(pin_dir));
}

/// Names from `ip netns list`.
pub fn list_netns() -> Result<Vec<String>> {
    let out = run_capture(Command::new("ip").args(["netns", "list"]))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}

/// Kills every process in `ns`, then deletes it (its veths go with it).
fn delete_netns(ns: &str) -> Result<()> {
    for _ in 0..3 {
        let out = Command::new("ip").args(["netns", "pids", ns]).output();
        let pids: Vec<i32> = match out {
            Ok(o) => String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect(),
            Err(_) => Vec::new(),
        };
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            signal(pid, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Err(e) = run_capture(Command::new("ip").args(["netns", "delete", ns])) {
        // Someone else (a signal handler, a parallel cleanup) may have won.
        if list_netns()?.iter().any(|n| n == ns) {
            return Err(e.context(format!("delete namespace {ns}")));
        }
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<()> {
    run_capture(Command::new("ip").args(args)).map(|_| ())
}

fn signal(pid: i32, sig: libc::c_int) {
    if pid > 0 {
        // SAFETY: kill(2) with a positive pid of a process we started or that
        // runs inside one of our namespaces.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// Children get SIGKILL if the thread that started them dies, so a crashed
/// test or demo leaves no servers or agents running.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: only calls async-signal-safe prctl between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            Ok(())
        });
    }
}

fn cstr(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| anyhow!("path with NUL byte"))
}

fn mount_bpffs(dir: &Path) -> Result<()> {
    let target = cstr(dir)?;
    let fstype = CString::new("bpf").expect("no NUL");
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "mount -t bpf bpf {}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn umount(dir: &Path) -> Result<()> {
    let target = cstr(dir)?;
    // SAFETY: valid NUL-terminated path.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) && err.raw_os_error() != Some(libc::ENOENT) {
            bail!("umount {}: {err}", dir.display());
        }
    }
    Ok(())
}

/// Whether `dir` is a mount point (per /proc/self/mounts).
pub fn is_mountpoint(dir: &Path) -> bool {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let want = dir.to_string_lossy();
    mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .any(|m| m == want)
}

fn remove_dir_if_exists(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    if is_mountpoint(dir) || is_mountpoint(&dir.join("bpf")) {
        bail!("{} still has a mount, not removing it", dir.display());
    }
    fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))
}

#[cfg(test)]
mod tests {
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
