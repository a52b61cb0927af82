//! Small helpers for running commands and locating the workspace.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{bail, Context, Result};

/// The workspace root (the parent of `xtask/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// The cargo target directory (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                repo_root().join(dir)
            }
        }
        None => repo_root().join("target"),
    }
}

/// Path of a release binary built by `cargo xtask build`.
pub fn release_bin(name: &str) -> PathBuf {
    target_dir().join("release").join(name)
}

/// The cargo to use for nested invocations (the one that runs us, if known).
pub fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    // `cargo run` gave this process xtask's package variables. Build
    // scripts that watch them (ring's does: CARGO_PKG_NAME,
    // CARGO_MANIFEST_DIR, ...) would see them change between a build from a
    // shell and one from here, run again and rebuild everything above them.
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(is_cargo_run_variable) {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// The variables `cargo run` sets for the program it runs.
fn is_cargo_run_variable(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || matches!(
            key,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
        )
}

/// Whether we run with effective uid 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Finds an executable in PATH, also looking in the sbin directories (which a
/// non-login root shell may lack from PATH).
pub fn which(cmd: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let extra = [
        "/usr/local/sbin",
        "/usr/sbin",
        "/sbin",
        "/usr/local/bin",
        "/usr/bin",
        "/bin",
    ];
    std::env::split_paths(&path)
        .chain(extra.iter().map(PathBuf::from))
        .map(|dir| dir.join(cmd))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Renders a command for messages.
pub fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&arg.to_string_lossy());
    }
    s
}

/// Runs a command with inherited stdio; fails if it exits non-zero.
pub fn run_inherit(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{}`", show(cmd)))?;
    if !status.success() {
        bail!("`{}` failed: {status}", show(cmd));
    }
    Ok(())
}

/// Runs a command capturing its output; fails (with stderr in the message) if
/// it exits non-zero.
pub fn run_capture(cmd: &mut Command) -> Result<Output> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{}`", show(cmd)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}{}",
            show(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(out)
}

/// Convenience: build a command from a program and arguments.
pub fn cmd<I, S>(program: &str, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut c = Command::new(program);
    c.args(args);
    c
}

#[cfg(feature = "harness")]
/// `t` as RFC 3339 in UTC, with the seconds `precision` asks for.
pub fn rfc3339(t: std::time::SystemTime, precision: k8s_openapi::chrono::SecondsFormat) -> String {
    use k8s_openapi::chrono::DateTime;
    let since = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    DateTime::from_timestamp(secs, since.subsec_nanos())
        .unwrap_or_default()
        .to_rfc3339_opts(precision, true)
}
