//! Removing what sandboxes leave behind: stale test sandboxes whose process
//! died, and everything of one tag.
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};

use super::roles::{is_role, NODE_ROLES};
use super::sys::{delete_netns, list_netns, mounts_below, remove_dir_if_exists, umount};
use super::{cgroup, PIN_BASE};

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
/// (`_run_switchboard-test_sbt<pid>-<n>_bpf.json` → `sbt<pid>-<n>`, and for
/// the per-node pin roots of a two-node sandbox
/// `_run_switchboard-test_sbt<pid>-<n>_na_bpf.json` → `sbt<pid>-<n>`).
pub(super) fn status_file_tag(name: &str) -> Option<&str> {
    let prefix = format!("{}_", PIN_BASE.replace('/', "_"));
    let middle = name.strip_prefix(&prefix)?.strip_suffix("_bpf.json")?;
    let (tag, role) = match middle.split_once('_') {
        Some((tag, role)) => (tag, Some(role)),
        None => (middle, None),
    };
    if role.is_some_and(|r| !NODE_ROLES.contains(&r)) {
        return None;
    }
    test_tag_pid(tag).map(|_| tag)
}

/// `sbt<pid>-<n>` → pid.
pub(super) fn test_tag_pid(tag: &str) -> Option<u32> {
    let rest = tag.strip_prefix("sbt")?;
    let (pid, n) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    pid.parse().ok()
}

/// `sbt<pid>-<n>-<role>` → `sbt<pid>-<n>` if role is one a sandbox creates.
pub(super) fn test_tag_of(ns: &str) -> Option<String> {
    let (tag, role) = ns.rsplit_once('-')?;
    test_tag_pid(tag)?;
    is_role(role).then(|| tag.to_string())
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
    // Every pin root and cgroup bind below the tag's directory (one sandbox
    // has `bpf` and `cgroup`, a two-node one `na/bpf`, `na/cgroup`, ...);
    // several rounds for mounts stacked on the same point.
    for _ in 0..8 {
        let mounts = mounts_below(&tag_dir);
        if mounts.is_empty() {
            break;
        }
        let mut failed = false;
        for mount in mounts {
            println!("sandbox: unmounting leftover {}", mount.display());
            if let Err(e) = umount(&mount) {
                errors.push(format!("{e:#}"));
                failed = true;
            }
        }
        if failed {
            break;
        }
    }
    if let Err(e) = cgroup::purge(tag, &tag_dir.join("cgroup")) {
        errors.push(format!("{e:#}"));
    }
    if let Err(e) = remove_dir_if_exists(&tag_dir) {
        errors.push(format!("{e:#}"));
    }
    remove_status_file(&tag_dir.join("bpf"));
    for role in NODE_ROLES {
        remove_status_file(&tag_dir.join(role).join("bpf"));
    }
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

/// Removes the agent's status and lock files for `pin_dir`, if any (never
/// the directory, which other agents on the machine may use).
pub(super) fn remove_status_file(pin_dir: &Path) {
    let status = status_file(pin_dir);
    let _ = fs::remove_file(status.with_extension("lock"));
    let _ = fs::remove_file(status);
}
