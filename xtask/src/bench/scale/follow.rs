//! File change → new backend answering, for an agent with the
//! directory source at [`targets::FILE_CHANGE_SERVICES`]: the manifest file
//! holding the target Service is replaced atomically (written under a hidden
//! name, renamed into place) with the target's endpoints moved to another
//! pod, while `sb-echo client` makes back-to-back TCP connections to the
//! Service from the client namespace. The time is from the rename to the
//! first connection of the final stretch that the new pod answers (the
//! client's own millisecond stamps, so the client's start does not blur it).

use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _, Result};

use super::super::agent::MANIFESTS_PER_FILE;
use super::super::goals::targets;
use super::super::results::FileChange;
use super::super::workload::{self, pod_ips};
use crate::sandbox::{self, Attempt, ClientRun, Sandbox};

/// Measured changes (after one warm-up change that is not counted).
pub const ROUNDS: usize = 7;

/// How long the client keeps connecting around each change.
const CLIENT_MS: u64 = 1500;

/// When the change is made after the client's start.
const CHANGE_AFTER: Duration = Duration::from_millis(300);

fn unix_ms() -> Result<u128> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())
}

/// The manifest file (as `write_manifests` names them) holding the target
/// Service, rendered with the target's endpoints set to `pod` alone.
fn target_file(services: &[workload::Svc], pod: std::net::Ipv4Addr) -> Result<(String, String)> {
    let Some(at) = services.iter().position(|s| s.name == "target") else {
        bail!("no target Service in the workload");
    };
    let mut changed = services.to_vec();
    changed[at].endpoints = vec![pod];
    let per_file = MANIFESTS_PER_FILE;
    workload::manifest_files(&changed, per_file, workload::Style::Block)
        .into_iter()
        .nth(at / per_file)
        .context("the target's manifest file")
}

/// The first attempt (at or after `since_ms`) of the final stretch that
/// `pod` answered, if the run ends with one.
fn followed_at(run: &ClientRun, pod: &str, since_ms: u128) -> Option<u128> {
    let after: Vec<&Attempt> = run
        .attempts
        .iter()
        .filter(|a| a.start_ms() >= since_ms)
        .collect();
    let stretch = after
        .iter()
        .rev()
        .take_while(|a| a.name() == Some(pod))
        .count();
    if stretch == 0 {
        return None;
    }
    Some(after[after.len() - stretch].start_ms())
}

/// One change to `pod` (the `index`-th pod); returns ms from the rename to
/// the new backend answering, and the connections that failed.
fn one_change(
    sb: &Sandbox,
    sb_echo: &Path,
    services: &[workload::Svc],
    index: usize,
) -> Result<(u128, usize)> {
    let pods = pod_ips();
    let (name, text) = target_file(services, pods[index])?;
    let pod = sandbox::pod_name(index + 1);
    let dir = sb.manifest_dir();
    let staging = dir.join(format!(".{name}"));
    fs::write(&staging, text)?;
    let service = format!("{}:{}", workload::TARGET_IP, workload::HTTP_PORT);
    let client_ms = CLIENT_MS.to_string();
    let child = sb.client_spawn(
        sb_echo,
        &[
            "--tcp",
            &service,
            "--duration-ms",
            &client_ms,
            "--timeout-ms",
            "500",
        ],
    )?;
    std::thread::sleep(CHANGE_AFTER);
    let changed_ms = unix_ms()?;
    fs::rename(&staging, dir.join(&name))?;
    let out = child.wait_with_output().context("sb-echo client")?;
    let run = ClientRun::parse(&String::from_utf8_lossy(&out.stdout))?;
    let failed = run
        .attempts
        .iter()
        .filter(|a| matches!(a, Attempt::Err { .. }))
        .count();
    let Some(at) = followed_at(&run, &pod, changed_ms) else {
        bail!(
            "{pod} did not take over the target Service within {CLIENT_MS} ms of the change:\n{}\n--- agent log ---\n{}",
            run.raw,
            sb.agent_log()
        );
    };
    Ok((at.saturating_sub(changed_ms), failed))
}

/// Starts the pods and measures [`ROUNDS`] changes, alternating between
/// pod1 and pod2 (a warm-up change to pod3 first).
pub fn run(sb: &mut Sandbox, sb_echo: &Path, services: &[workload::Svc]) -> Result<FileChange> {
    sb.start_pods(sb_echo)?;
    one_change(sb, sb_echo, services, 2)?;
    let mut ms = Vec::new();
    let mut failed = 0;
    for round in 0..ROUNDS {
        let (took, f) = one_change(sb, sb_echo, services, round % 2)?;
        ms.push(u64::try_from(took).unwrap_or(u64::MAX));
        failed += f;
    }
    let mut sorted = ms.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    let max = sorted[sorted.len() - 1];
    Ok(FileChange {
        services: targets::FILE_CHANGE_SERVICES as usize,
        rounds_ms: ms,
        median_ms: median,
        max_ms: max,
        failed_connections: failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(answers: &[(u128, Option<&str>)]) -> ClientRun {
        let attempts = answers
            .iter()
            .map(|&(start_ms, name)| match name {
                Some(name) => Attempt::Ok {
                    start_ms,
                    name: name.into(),
                    pod_saw: String::new(),
                    client_saw: String::new(),
                },
                None => Attempt::Err {
                    start_ms,
                    message: "refused".into(),
                },
            })
            .collect();
        ClientRun {
            attempts,
            raw: String::new(),
        }
    }

    #[test]
    fn followed_at_is_the_start_of_the_final_stretch_of_the_new_pod() {
        let r = run(&[
            (90, Some("pod2")),
            (100, Some("pod1")),
            (103, Some("pod2")),
            (104, Some("pod1")),
            (105, Some("pod2")),
            (106, Some("pod2")),
        ]);
        assert_eq!(followed_at(&r, "pod2", 100), Some(105));
        assert_eq!(followed_at(&r, "pod1", 100), None, "pod1 does not end it");
        let failing = run(&[(100, Some("pod1")), (101, None)]);
        assert_eq!(followed_at(&failing, "pod1", 100), None);
        assert_eq!(
            followed_at(&r, "pod2", 107),
            None,
            "nothing after the change"
        );
    }
}
