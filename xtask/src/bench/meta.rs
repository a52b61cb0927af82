//! The run's header: the machine, the kernel, the tools and the commit.

use std::fs;
use std::process::Command;

use super::results::Meta;
use crate::util::repo_root;

/// A command's first output (stdout, else stderr), trimmed; empty when it
/// cannot run.
fn capture(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if s.is_empty() {
                s = String::from_utf8_lossy(&o.stderr).trim().to_string();
            }
            s
        })
        .unwrap_or_default()
}

/// This machine and tree, for a run started at `stamp`.
pub fn read(stamp: &str, quick: bool) -> Meta {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let cpus = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mem_kb: u64 = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let root = repo_root();
    let root = root.to_string_lossy();
    let commit = capture("git", &["-C", &root, "rev-parse", "--short=12", "HEAD"]);
    let dirty = !capture(
        "git",
        &["-C", &root, "status", "--porcelain", "--untracked-files=no"],
    )
    .is_empty();
    Meta {
        timestamp: stamp.to_owned(),
        mode: if quick { "quick" } else { "full" }.to_owned(),
        cpu,
        cpus: cpus as u64,
        memory_gib: mem_kb as f64 / 1024.0 / 1024.0,
        kernel: capture("uname", &["-r"]),
        commit,
        dirty,
        iptables: capture("iptables", &["--version"]),
        nft: capture("nft", &["--version"]),
        wrk: capture("wrk", &["--version"])
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
        switchboard_binary: None,
    }
}
