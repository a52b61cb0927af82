//! The CLI's output when its reader goes away (`switchboard ... | head -1`):
//! the command ends quietly with its own exit status, never a panic (exit
//! 101, "failed printing to stdout: Broken pipe"). Needs no privileges: the
//! commands run against a pin root that does not exist.
use std::io::Read as _;
use std::process::{Command, Stdio};

fn switchboard() -> Command {
    Command::new(env!("CARGO_BIN_EXE_switchboard"))
}

/// Runs `args` with stdout a pipe whose read end is closed before the
/// command writes; returns the exit code and stderr.
fn with_reader_gone(args: &[&str]) -> (Option<i32>, String) {
    let pin_root = std::env::temp_dir().join(format!("sb-no-pin-root-{}", std::process::id()));
    let mut child = switchboard()
        .args(args)
        .arg("--pin-root")
        .arg(&pin_root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start switchboard");
    // The reader leaves at once: every write of the child meets EPIPE.
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    let status = child.wait().expect("wait");
    (status.code(), stderr)
}

#[test]
fn a_closed_pipe_ends_the_output_without_a_panic() {
    // `status` lists a problem (no agent, no maps): exit 1 whether or not
    // its output was read.
    for (args, want) in [(&["status"][..], 1), (&["status", "-o", "json"][..], 1)] {
        let (code, stderr) = with_reader_gone(args);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(!stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        assert_eq!(code, Some(want), "{args:?}: {stderr}");
    }
}

/// `switchboard version` names the release and the git revision the binary
/// was built from, as `--version` does.
#[test]
fn version_names_the_release_and_the_revision() {
    let out = switchboard()
        .arg("version")
        .output()
        .expect("run switchboard");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!("switchboard {} (git ", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&want), "{text:?}");
    let revision = text.trim().trim_start_matches(&want).trim_end_matches(')');
    assert!(!revision.is_empty(), "{text:?}");
    let flag = switchboard()
        .arg("--version")
        .output()
        .expect("run switchboard");
    assert_eq!(String::from_utf8_lossy(&flag.stdout), text);
}
