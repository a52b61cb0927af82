//! The sandbox's own cgroup for the socket layer.
//!
//! The agent's cgroup hooks go on a cgroup the sandbox creates under the
//! host's cgroup2 mount (never on the root cgroup: a bug there would break
//! every connection on the machine). `ip netns exec` remounts `/sys`, which
//! hides the cgroup2 mount inside the namespace, so the cgroup is also
//! bind-mounted under the sandbox's `/run` directory, where the agent (inside
//! a namespace) and the test (outside) both see it. Clients join it before
//! they enter a namespace.
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use super::sys::{bind_mount, is_mountpoint, signal, umount};
use crate::util::run_capture;

/// Prefix of the cgroups sandboxes create, so leftovers can be found.
const PREFIX: &str = "switchboard-test-";

/// The host's cgroup2 mount point, as `findmnt` reports it.
pub fn cgroup2_mount() -> Result<PathBuf> {
    let out = run_capture(Command::new("findmnt").args(["-n", "-t", "cgroup2", "-o", "TARGET"]))
        .context("finding the cgroup2 mount (findmnt -t cgroup2)")?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("no cgroup2 file system is mounted"))
}

/// A cgroup created for one sandbox, and its bind mount.
pub struct TestCgroup {
    /// Where the cgroup lives in the cgroup2 hierarchy.
    pub real: PathBuf,
    /// The bind mount (what the agent gets as `--cgroup-root`).
    pub bound: PathBuf,
}

impl TestCgroup {
    /// Creates `<cgroup2>/switchboard-test-<tag>` and binds it to `bound`.
    pub fn create(tag: &str, bound: &Path) -> Result<TestCgroup> {
        let real = cgroup2_mount()?.join(format!("{PREFIX}{tag}"));
        fs::create_dir_all(&real).with_context(|| format!("create cgroup {}", real.display()))?;
        fs::create_dir_all(bound).with_context(|| format!("create {}", bound.display()))?;
        bind_mount(&real, bound)?;
        Ok(TestCgroup {
            real,
            bound: bound.to_owned(),
        })
    }

    /// The file a process writes its pid to in order to join.
    pub fn procs_file(&self) -> PathBuf {
        self.real.join("cgroup.procs")
    }

    /// Makes `cmd` join this cgroup between fork and exec: before an `ip
    /// netns exec` it wraps remounts /sys, so the command runs under the
    /// socket layer attached here.
    pub fn join_on_exec(&self, cmd: &mut Command) -> Result<()> {
        use std::os::unix::process::CommandExt as _;
        let procs = std::ffi::CString::new(self.procs_file().as_os_str().as_encoded_bytes())
            .map_err(|_| anyhow!("cgroup path with NUL byte"))?;
        // SAFETY: between fork and exec only open/write/close, which are
        // async-signal-safe; the path was prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }

    /// Kills what is left in the cgroup, unmounts the bind and removes both.
    pub fn remove(&self) -> Result<()> {
        if is_mountpoint(&self.bound) {
            umount(&self.bound)?;
        }
        let _ = fs::remove_dir(&self.bound);
        remove_cgroup(&self.real)
    }
}

/// Kills every process in the cgroup `dir`, then removes it.
fn remove_cgroup(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for _ in 0..50 {
        let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = procs
            .lines()
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        for pid in &pids {
            signal(*pid, libc::SIGKILL);
        }
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            // EBUSY while the killed processes exit.
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    bail!(
        "cgroup {} still busy after killing its processes",
        dir.display()
    )
}

/// Removes the cgroups a sandbox with this tag may have left: its own
/// (`switchboard-test-<tag>`) and those of its nodes
/// (`switchboard-test-<tag>-<role>`, the two-node sandbox's).
pub fn purge(tag: &str, bound: &Path) -> Result<()> {
    if is_mountpoint(bound) {
        umount(bound)?;
    }
    let Ok(root) = cgroup2_mount() else {
        return Ok(());
    };
    remove_cgroup(&root.join(format!("{PREFIX}{tag}")))?;
    let node_prefix = format!("{PREFIX}{tag}-");
    let mut errors = Vec::new();
    for entry in fs::read_dir(&root).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_node = name
            .strip_prefix(&node_prefix)
            .is_some_and(super::roles::is_role);
        if is_node {
            if let Err(e) = remove_cgroup(&entry.path()) {
                errors.push(format!("{e:#}"));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("{}", errors.join("; "))
    }
}
