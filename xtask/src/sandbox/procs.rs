//! The processes a sandbox starts (pod servers, agents): started inside a
//! namespace with their output in a log file, stopped with SIGTERM then
//! SIGKILL. Shared by the one-node [`super::Sandbox`] and the two-node
//! [`super::two_node::TwoNodeSandbox`].
use std::fs;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::sys::{die_with_parent, signal};
use crate::util::show;

/// Started processes, each with a label (`agent`, `pod1`, ...).
pub(super) type Children = Vec<(String, Child)>;

/// `ip netns exec <ns> <cmd...>`, dying with us.
pub(super) fn netns_command(ns: &str, cmd: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).args(cmd);
    die_with_parent(&mut c);
    c
}

/// Starts `cmd` with stdin closed and stdout and stderr appended to `log`,
/// and records it under `label`. Returns its pid.
pub(super) fn spawn_logged(
    children: &mut Children,
    label: &str,
    mut cmd: Command,
    log: &Path,
) -> Result<u32> {
    let file = fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone().context("duplicate the log file")?)
        .stderr(file);
    let child = cmd
        .spawn()
        .with_context(|| format!("could not start `{}`", show(&cmd)))?;
    let pid = child.id();
    children.push((label.to_string(), child));
    Ok(pid)
}

/// Whether the process labelled `label` is still running.
pub(super) fn is_running(children: &mut Children, label: &str) -> bool {
    children
        .iter_mut()
        .find(|(l, _)| l == label)
        .map(|(_, child)| matches!(child.try_wait(), Ok(None)))
        .unwrap_or(false)
}

/// Stops the process labelled `label` with SIGTERM (SIGKILL after 5 s) and
/// forgets it; returns its exit status.
pub(super) fn stop(children: &mut Children, label: &str) -> Result<ExitStatus> {
    let idx = children
        .iter()
        .position(|(l, _)| l == label)
        .ok_or_else(|| anyhow!("no {label} was started"))?;
    let (_, mut child) = children.remove(idx);
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
    let _ = child.wait();
    bail!("{label} did not exit within 5 s of SIGTERM (killed)");
}

/// The pid of the process labelled `label`.
pub(super) fn pid(children: &Children, label: &str) -> Option<u32> {
    children
        .iter()
        .find(|(l, _)| l == label)
        .map(|(_, c)| c.id())
}

/// Kills the process labelled `label` with SIGKILL (no chance to clean up,
/// as a crash or the OOM killer would) and forgets it.
pub(super) fn kill(children: &mut Children, label: &str) -> Result<ExitStatus> {
    let idx = children
        .iter()
        .position(|(l, _)| l == label)
        .ok_or_else(|| anyhow!("no {label} was started"))?;
    let (_, mut child) = children.remove(idx);
    let _ = child.kill();
    child
        .wait()
        .with_context(|| format!("waiting for the killed {label}"))
}

/// SIGTERM to every process still running (so agents can exit cleanly),
/// SIGKILL to those still there after 3 s; forgets them all.
pub(super) fn terminate_all(children: &mut Children) {
    for (_, child) in children.iter_mut() {
        if let Ok(None) = child.try_wait() {
            signal(child.id() as i32, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    for (label, child) in children.iter_mut() {
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
    children.clear();
}
