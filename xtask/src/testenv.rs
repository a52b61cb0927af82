//! What the root-only integration tests (`xtask/tests/*.rs`) need from their
//! environment: the binaries `cargo xtask test` built, and root.
use std::path::PathBuf;

/// A binary named by environment variable `var`. Panics with the command to
/// run when it is unset or missing: these tests never pass silently.
fn bin(var: &str) -> PathBuf {
    let path = std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run the end-to-end tests with `cargo xtask test` (as root), which builds the binaries and sets it")
    });
    let path = PathBuf::from(path);
    assert!(
        path.exists(),
        "{var}={} does not exist: run `cargo xtask test`",
        path.display()
    );
    path
}

/// `SWITCHBOARD_BIN`: the agent and CLI.
pub fn switchboard() -> PathBuf {
    bin("SWITCHBOARD_BIN")
}

/// `SB_ECHO_BIN`: the pod server and client.
pub fn sb_echo() -> PathBuf {
    bin("SB_ECHO_BIN")
}

pub fn require_root() {
    assert!(
        crate::util::is_root(),
        "the netns end-to-end tests need root: run `cargo xtask test` as root"
    );
}
