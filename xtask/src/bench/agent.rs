//! The agent in a sandbox: the manifests it reads, the capacity flags
//! that fit them, starting it, and waiting for its sync of a given size.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::workload;
use crate::sandbox::Sandbox;

/// Services per manifest file the benchmark writes.
pub const MANIFESTS_PER_FILE: usize = 1000;

/// Writes the manifests of `services` into the sandbox's manifest directory
/// (replacing what is there); returns their number of frontends.
pub fn write_manifests(
    sb: &Sandbox,
    services: &[workload::Svc],
    style: workload::Style,
) -> Result<usize> {
    let dir = sb.manifest_dir();
    for entry in fs::read_dir(&dir)? {
        fs::remove_file(entry?.path())?;
    }
    // Write into a hidden staging name first (the dir source ignores hidden
    // files), then rename, so the agent never reads a half-written file.
    for (name, text) in workload::manifest_files(services, MANIFESTS_PER_FILE, style) {
        let staging = dir.join(format!(".{name}"));
        fs::write(&staging, text)?;
        fs::rename(&staging, dir.join(&name))?;
    }
    Ok(workload::frontends(services))
}

/// Agent capacity flags large enough for `services` × 10 endpoints.
pub fn agent_caps(services: u32) -> Vec<String> {
    let entries = (u64::from(services) * 11 + 4096)
        .next_power_of_two()
        .max(65_536);
    let backends = (u64::from(services) * 10 + 4096)
        .next_power_of_two()
        .max(65_536);
    let ids = (u64::from(services) + 1024).next_power_of_two().max(16_384);
    vec![
        "--max-frontend-entries".into(),
        entries.to_string(),
        "--max-backends".into(),
        backends.to_string(),
        "--max-services".into(),
        ids.to_string(),
    ]
}

pub fn start_agent(sb: &mut Sandbox, switchboard: &Path, max_services: u32) -> Result<u32> {
    // The sandbox's own agent command: its socket layer goes on the
    // sandbox's cgroup, never on the host's cgroup root (the agent's default).
    let caps = agent_caps(max_services);
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    sb.start_agent_with(switchboard, &caps)
}

/// Waits until the agent's log has a `maps synced` line with `frontends=N`
/// after `skip` bytes of log; returns when it appeared.
pub fn wait_synced(
    sb: &mut Sandbox,
    frontends: usize,
    skip: usize,
    timeout: Duration,
) -> Result<Instant> {
    let want = format!("frontends={frontends} ");
    let deadline = Instant::now() + timeout;
    loop {
        let log = sb.agent_log();
        let fresh = log.get(skip..).unwrap_or_default();
        if fresh
            .lines()
            .any(|l| l.contains("maps synced") && l.contains(&want))
        {
            return Ok(Instant::now());
        }
        if !sb.agent_running() {
            bail!("the agent exited:\n{log}");
        }
        if Instant::now() > deadline {
            bail!(
                "the agent did not sync {frontends} frontends within {timeout:?}:\n{}",
                tail(&log, 30)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
