//! Stamps the binary with the git revision it was built from
//! (`SB_GIT_REVISION`, shown by `switchboard version`): `git describe`'s
//! short commit, with `-dirty` for a tree with uncommitted changes, or
//! `unknown` outside a git checkout (a source archive).
use std::process::Command;

fn main() {
    let revision = Command::new("git")
        .args([
            "describe",
            "--always",
            "--dirty",
            "--abbrev=12",
            "--exclude=*",
        ])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SB_GIT_REVISION={revision}");
    // A new commit (or a checkout) changes HEAD or the ref it names.
    for path in ["../.git/HEAD", "../.git/refs/heads", "../.git/index"] {
        println!("cargo:rerun-if-changed={path}");
    }
}
