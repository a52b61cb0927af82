//! The netns sandbox core both the one-node [`super::Sandbox`] and the
//! two-node [`super::TwoNodeSandbox`] are built on: the tag and its
//! directories, the namespaces, the processes started in them (pods,
//! agents, clients), each node's pin root and cgroup, the agent's
//! `services` view, and the cleanup of all of it (also on drop, and after a
//! failed setup). What differs between the two (the links, addresses and
//! routes, and the names) stays in each.
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::cgroup::TestCgroup;
use super::cleanup::{purge_tag, remove_status_file};
use super::procs::{self, Children};
use super::sys::{delete_netns, ip, mount_bpffs, remove_dir_if_exists, umount};
use super::{ClientRun, Frontend, AGENT_READY, PIN_BASE, POD_TCP_PORT, POD_UDP_PORT};
use crate::util::{run_capture, show};

/// Makes sandbox type `$t` (with a field `core`) dereference to its
/// [`NetnsCore`].
macro_rules! built_on_core {
    ($t:ty) => {
        impl std::ops::Deref for $t {
            type Target = $crate::sandbox::NetnsCore;
            fn deref(&self) -> &$crate::sandbox::NetnsCore {
                &self.core
            }
        }

        impl std::ops::DerefMut for $t {
            fn deref_mut(&mut self) -> &mut $crate::sandbox::NetnsCore {
                &mut self.core
            }
        }
    };
}
pub(super) use built_on_core;

/// The lines of `sb-echo client <args>` run in `ns`, parsed; an error
/// when the client itself failed (exit status 2 or a signal), not when
/// attempts did.
pub fn client_run(out: &Output, ns: &str, args: &[&str]) -> Result<ClientRun> {
    if out.status.code() == Some(2) || out.status.code().is_none() {
        bail!(
            "sb-echo client {args:?} in {ns} failed: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    ClientRun::parse(&String::from_utf8_lossy(&out.stdout))
}

/// One node's agent state: its bpffs pin root and its test cgroup.
struct NodeState {
    pin_dir: PathBuf,
    cgroup: Option<TestCgroup>,
}

/// A pod server to start with [`NetnsCore::start_pods`]: `sb-echo` named
/// `name` in namespace `ns`, and the (`sb-echo client` flag, address)
/// pairs it must answer on before the sandbox is ready.
pub struct PodSpec {
    pub ns: String,
    pub name: String,
    pub targets: Vec<(&'static str, String)>,
}

/// An agent of the sandbox: its process label, namespace and node.
pub struct AgentRef {
    pub label: String,
    pub ns: String,
    pub node: usize,
}

pub struct NetnsCore {
    pub tag: String,
    /// Temporary directory for logs and manifests.
    pub dir: PathBuf,
    namespaces: Vec<String>,
    children: Children,
    nodes: Vec<NodeState>,
    /// Labels of the agents started with [`NetnsCore::start_agent`].
    agents: Vec<String>,
    cleaned: bool,
}

impl NetnsCore {
    /// The core of sandbox `tag` (at most 13 characters: interface names
    /// are the tag plus two), with its manifest directory; first removes
    /// leftovers with the same tag. Nothing else exists yet.
    pub fn new(tag: &str) -> Result<NetnsCore> {
        if tag.len() + 2 > 15 {
            bail!("sandbox tag {tag:?} too long for interface names");
        }
        if !crate::util::is_root() {
            bail!("the netns sandbox needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN, CAP_BPF)");
        }
        purge_tag(tag)?;
        let core = NetnsCore {
            tag: tag.to_string(),
            dir: std::env::temp_dir().join(format!("switchboard-{tag}")),
            namespaces: Vec::new(),
            children: Vec::new(),
            nodes: Vec::new(),
            agents: Vec::new(),
            cleaned: false,
        };
        fs::create_dir_all(core.manifest_dir())
            .with_context(|| format!("create {}", core.dir.display()))?;
        Ok(core)
    }

    /// Directory for manifests handed to the agents (`--source dir:`).
    pub fn manifest_dir(&self) -> PathBuf {
        self.dir.join("manifests")
    }

    pub fn log_path(&self, label: &str) -> PathBuf {
        self.dir.join(format!("{label}.log"))
    }

    /// The log of the process started with `label` so far (empty if none).
    pub fn read_log(&self, label: &str) -> String {
        fs::read_to_string(self.log_path(label)).unwrap_or_default()
    }

    /// `/run/switchboard-test/<tag>`, where pin roots and cgroups are bound.
    pub fn run_dir(&self) -> PathBuf {
        Path::new(PIN_BASE).join(&self.tag)
    }

    // --- namespaces and nodes ---------------------------------------------

    /// Creates namespace `ns` (deleted on cleanup) with `lo` up.
    pub fn add_netns(&mut self, ns: &str) -> Result<()> {
        ip(&["netns", "add", ns])?;
        self.namespaces.push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"])
    }

    /// Runs the shell script `script` in `ns` (sysctls and the like).
    pub fn sh(&self, ns: &str, script: &str) -> Result<()> {
        self.exec(ns, &["sh", "-c", script])
            .map(|_| ())
            .with_context(|| format!("sysctls in {ns}"))
    }

    /// A node's agent state under `run_dir`: a bpffs mounted at
    /// `<run_dir>/bpf` and the cgroup `cgroup_name`, bound at
    /// `<run_dir>/cgroup`. Returns the node's index.
    pub fn add_node(&mut self, run_dir: &Path, cgroup_name: &str) -> Result<usize> {
        let pin_dir = run_dir.join("bpf");
        fs::create_dir_all(&pin_dir).with_context(|| format!("create {}", pin_dir.display()))?;
        mount_bpffs(&pin_dir)?;
        self.nodes.push(NodeState {
            pin_dir,
            cgroup: None,
        });
        let cgroup = TestCgroup::create(cgroup_name, &run_dir.join("cgroup"))?;
        let index = self.nodes.len() - 1;
        self.nodes[index].cgroup = Some(cgroup);
        Ok(index)
    }

    /// Node `node`'s bpffs pin root (its agent's `--pin-root`).
    pub fn node_pin_dir(&self, node: usize) -> Option<&Path> {
        self.nodes.get(node).map(|n| n.pin_dir.as_path())
    }

    /// Node `node`'s cgroup, bound where its agent sees it.
    pub fn node_cgroup(&self, node: usize) -> Option<&TestCgroup> {
        self.nodes.get(node)?.cgroup.as_ref()
    }

    // --- processes ----------------------------------------------------------

    /// `ip netns exec <ns> <cmd...>`, dying with us.
    pub fn command(&self, ns: &str, cmd: &[&str]) -> Command {
        procs::netns_command(ns, cmd)
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

    /// Starts `cmd` in `ns` in the background; stdout and stderr go to
    /// `<dir>/<label>.log`. Cleanup kills it.
    pub fn spawn(&mut self, label: &str, ns: &str, cmd: &[&str]) -> Result<u32> {
        self.spawn_env(label, ns, cmd, &[])
    }

    /// [`NetnsCore::spawn`] with `env` added to the environment.
    pub fn spawn_env(
        &mut self,
        label: &str,
        ns: &str,
        cmd: &[&str],
        env: &[(&str, &str)],
    ) -> Result<u32> {
        let mut c = self.command(ns, cmd);
        c.envs(env.iter().copied());
        let log = self.log_path(label);
        procs::spawn_logged(&mut self.children, label, c, &log)
    }

    /// Whether the process started with `label` is still running.
    pub fn running(&mut self, label: &str) -> bool {
        procs::is_running(&mut self.children, label)
    }

    /// Stops the process `label` with SIGTERM (SIGKILL after 5 s); returns
    /// its exit status.
    pub fn stop(&mut self, label: &str) -> Result<ExitStatus> {
        procs::stop(&mut self.children, label)
    }

    /// Kills the process `label` with SIGKILL; returns its exit status.
    pub fn kill(&mut self, label: &str) -> Result<ExitStatus> {
        procs::kill(&mut self.children, label)
    }

    /// The pid of the running process `label`.
    pub fn pid(&self, label: &str) -> Option<u32> {
        procs::pid(&self.children, label)
    }

    /// Runs `sb-echo client <args>` in namespace `ns` and parses its lines.
    /// Failed attempts are not an error: inspect the result.
    pub fn client_in(&self, sb_echo: &Path, ns: &str, args: &[&str]) -> Result<ClientRun> {
        let bin = sb_echo.to_string_lossy().into_owned();
        let mut cmd = vec![bin.as_str(), "client"];
        cmd.extend_from_slice(args);
        client_run(&self.exec_status(ns, &cmd)?, ns, args)
    }

    /// Starts `sb-echo` for every pod of `pods` (TCP 8080, UDP 5353) and
    /// waits until each answers on each of its targets from namespace
    /// `from` (5 s a pod).
    pub fn start_pods(&mut self, sb_echo: &Path, pods: &[PodSpec], from: &str) -> Result<()> {
        let bin = sb_echo.to_string_lossy().into_owned();
        let (tcp, udp) = (POD_TCP_PORT.to_string(), POD_UDP_PORT.to_string());
        for pod in pods {
            self.spawn(
                &pod.name,
                &pod.ns,
                &[&bin, "--name", &pod.name, "--tcp", &tcp, "--udp", &udp],
            )?;
        }
        for pod in pods {
            let deadline = Instant::now() + Duration::from_secs(5);
            for (flag, addr) in &pod.targets {
                loop {
                    let run =
                        self.client_in(sb_echo, from, &[flag, addr, "--timeout-ms", "300"])?;
                    if run.all_ok() && run.names() == vec![pod.name.clone()] {
                        break;
                    }
                    if Instant::now() > deadline {
                        bail!(
                            "{} does not answer {flag} {addr} from {from}: {}\npod log:\n{}",
                            pod.name,
                            run.raw,
                            self.read_log(&pod.name)
                        );
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        Ok(())
    }

    // --- agents -------------------------------------------------------------

    /// Starts `switchboard agent --source <source> --pin-root <node's pin
    /// root> --cgroup-root <node's cgroup> <extra...>` as `agent` with
    /// RUST_LOG=info (or the caller's RUST_LOG), logging to `<label>.log`.
    pub fn start_agent(
        &mut self,
        agent: &AgentRef,
        switchboard: &Path,
        source: &str,
        extra: &[&str],
    ) -> Result<u32> {
        let bin = switchboard.to_string_lossy().into_owned();
        let node = self
            .nodes
            .get(agent.node)
            .ok_or_else(|| anyhow!("{}: no such node in the sandbox", agent.label))?;
        let pin = node.pin_dir.to_string_lossy().into_owned();
        // Never the host's cgroup root: always the node's own test cgroup.
        let cgroup = node
            .cgroup
            .as_ref()
            .ok_or_else(|| anyhow!("{}: the sandbox has no cgroup", agent.label))?
            .bound
            .to_string_lossy()
            .into_owned();
        let rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
        let mut args = vec![
            bin.as_str(),
            "agent",
            "--source",
            source,
            "--pin-root",
            &pin,
            "--cgroup-root",
            &cgroup,
        ];
        args.extend_from_slice(extra);
        let pid = self.spawn_env(&agent.label, &agent.ns, &args, &[("RUST_LOG", &rust_log)])?;
        if !self.agents.contains(&agent.label) {
            self.agents.push(agent.label.clone());
        }
        Ok(pid)
    }

    /// Whether the agent `label` has logged that its programs took over (it
    /// syncs before it attaches, so services can show before traffic is
    /// served); true when no process `label` was ever started.
    pub fn agent_ready(&self, label: &str) -> bool {
        !self.log_path(label).exists() || self.read_log(label).contains(AGENT_READY)
    }

    /// `switchboard services --pin-root <node's pin root> [-o json]` in the
    /// agent's namespace; returns stdout.
    pub fn services_raw(&self, agent: &AgentRef, switchboard: &Path, json: bool) -> Result<String> {
        let bin = switchboard.to_string_lossy().into_owned();
        let pin = self
            .node_pin_dir(agent.node)
            .ok_or_else(|| anyhow!("{}: no such node in the sandbox", agent.label))?
            .to_string_lossy()
            .into_owned();
        let mut args = vec![bin.as_str(), "services", "--pin-root", &pin];
        if json {
            args.extend(["-o", "json"]);
        }
        let out = self.exec(&agent.ns, &args)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `switchboard services -o json`, parsed.
    pub fn services(&self, agent: &AgentRef, switchboard: &Path) -> Result<Vec<Frontend>> {
        let raw = self.services_raw(agent, switchboard, true)?;
        serde_json::from_str(&raw).with_context(|| {
            format!(
                "parse `switchboard services -o json` of {}: {raw}",
                agent.label
            )
        })
    }

    /// Polls `switchboard services -o json` until `pred` holds and the agent
    /// is ready; on timeout (or when an agent started here has exited) the
    /// error carries the last output and the agent log.
    pub fn wait_services(
        &mut self,
        agent: &AgentRef,
        switchboard: &Path,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&[Frontend]) -> bool,
    ) -> Result<Vec<Frontend>> {
        let deadline = Instant::now() + timeout;
        let started = self.agents.contains(&agent.label);
        let mut last;
        loop {
            match self.services(agent, switchboard) {
                Ok(frontends) if pred(&frontends) && self.agent_ready(&agent.label) => {
                    return Ok(frontends)
                }
                Ok(frontends) => last = format!("{frontends:#?}"),
                Err(e) => last = format!("{e:#}"),
            }
            let running = self.running(&agent.label);
            if Instant::now() > deadline || (started && !running) {
                let state = if running {
                    "agent running"
                } else {
                    "agent NOT running"
                };
                bail!(
                    "{}: timed out after {timeout:?} waiting for {what} ({state}); last `services -o json`: {last}\n\
                     --- {} log ---\n{}--- end agent log ---",
                    agent.label,
                    agent.label,
                    self.read_log(&agent.label)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // --- cleanup ------------------------------------------------------------

    /// Kills the processes (SIGTERM first, so an agent can exit cleanly),
    /// deletes the namespaces (and with them their links), removes the
    /// cgroups, unmounts the pin roots, removes the directories and the
    /// agents' status files. Idempotent; Drop calls it.
    pub fn cleanup(&mut self) -> Result<()> {
        if self.cleaned {
            return Ok(());
        }
        self.cleaned = true;
        let mut errors = Vec::new();
        procs::terminate_all(&mut self.children);
        for ns in self.namespaces.drain(..).rev() {
            if let Err(e) = delete_netns(&ns) {
                errors.push(format!("{e:#}"));
            }
        }
        for cgroup in self.nodes.iter_mut().filter_map(|n| n.cgroup.take()) {
            if let Err(e) = cgroup.remove() {
                errors.push(format!("{e:#}"));
            }
        }
        for node in &self.nodes {
            if let Err(e) = umount(&node.pin_dir) {
                errors.push(format!("{e:#}"));
            }
        }
        if let Err(e) = remove_dir_if_exists(&self.run_dir()) {
            errors.push(format!("{e:#}"));
        }
        for node in self.nodes.drain(..) {
            remove_status_file(&node.pin_dir);
        }
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

impl Drop for NetnsCore {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.cleaned {
            for label in &self.agents {
                eprintln!(
                    "--- {label} log of sandbox {} ---\n{}--- end agent log ---",
                    self.tag,
                    self.read_log(label)
                );
            }
        }
        if let Err(e) = self.cleanup() {
            eprintln!("{e:#}");
        }
    }
}
