//! System calls and commands the sandbox is built from: namespaces, signals,
//! mounts.
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::util::run_capture;

/// Kills every process in `ns`, then deletes it (its veths go with it).
pub(super) fn delete_netns(ns: &str) -> Result<()> {
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

pub(super) fn ip(args: &[&str]) -> Result<()> {
    run_capture(Command::new("ip").args(args)).map(|_| ())
}

pub(super) fn signal(pid: i32, sig: libc::c_int) {
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
pub(super) fn die_with_parent(cmd: &mut Command) {
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

pub(super) fn cstr(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| anyhow!("path with NUL byte"))
}

pub(super) fn mount_bpffs(dir: &Path) -> Result<()> {
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

pub(super) fn bind_mount(source: &Path, target: &Path) -> Result<()> {
    let (src, dst) = (cstr(source)?, cstr(target)?);
    // SAFETY: valid NUL-terminated paths; a bind mount takes no type or data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "mount --bind {} {}: {}",
            source.display(),
            target.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

pub(super) fn umount(dir: &Path) -> Result<()> {
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

/// Mount points at or below `dir` (per /proc/self/mounts), deepest first, so
/// they can be unmounted in that order.
pub(super) fn mounts_below(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    let top = dir.to_string_lossy();
    let below = format!("{}/", top.trim_end_matches('/'));
    let mut found: Vec<std::path::PathBuf> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| *m == top || m.starts_with(&below))
        .map(std::path::PathBuf::from)
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

pub(super) fn remove_dir_if_exists(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    // Never recurse into a mounted bpffs or cgroup bind.
    if let Some(mount) = mounts_below(dir).first() {
        bail!(
            "{} still has a mount ({}), not removing it",
            dir.display(),
            mount.display()
        );
    }
    fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))
}

/// Names from `ip netns list`.
pub fn list_netns() -> Result<Vec<String>> {
    let out = run_capture(Command::new("ip").args(["netns", "list"]))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect())
}
