//! `cargo xtask build`: release build of `switchboard` (with the embedded eBPF
//! object, built by proxy-user/build.rs) and of the `sb-echo` pod server.

use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};

use crate::util::{cargo, release_bin, repo_root, run_inherit};

pub struct Binaries {
    pub switchboard: PathBuf,
    pub sb_echo: PathBuf,
}

/// Builds `switchboard` as an "upgrade": `SB_PROGRAM_REVISION=1` gives its
/// pod programs other instructions (see proxy-ebpf's `PROGRAM_REVISION`),
/// so the lifecycle test can swap running programs for changed ones. Copied
/// to `target/release/switchboard-upgrade`; run it before [`run`], which
/// builds the ordinary binary again (same packages, so only proxy-user is
/// rebuilt; each revision keeps its own compiled eBPF programs).
pub fn upgrade_variant() -> Result<PathBuf> {
    // xtask is selected for the same feature unification as the ordinary
    // build (the dependencies are then shared), but only the agent is built.
    println!(
        "build: SB_PROGRAM_REVISION=1 cargo build --release -p proxy-user -p xtask --bin switchboard"
    );
    run_inherit(
        cargo()
            .current_dir(repo_root())
            .env("SB_PROGRAM_REVISION", "1")
            .args([
                "build",
                "--release",
                "-p",
                "proxy-user",
                "-p",
                "xtask",
                "--bin",
                "switchboard",
            ]),
    )?;
    let dest = release_bin("switchboard-upgrade");
    std::fs::copy(release_bin("switchboard"), &dest)
        .with_context(|| format!("copying the upgrade build to {}", dest.display()))?;
    println!("build: {}", dest.display());
    Ok(dest)
}

pub fn run() -> Result<Binaries> {
    println!("build: cargo build --release -p proxy-user -p xtask --bins");
    run_inherit(
        cargo()
            .current_dir(repo_root())
            .env_remove("SB_PROGRAM_REVISION")
            .args([
                "build",
                "--release",
                "-p",
                "proxy-user",
                "-p",
                "xtask",
                "--bins",
            ]),
    )?;
    let bins = Binaries {
        switchboard: release_bin("switchboard"),
        sb_echo: release_bin("sb-echo"),
    };
    for bin in [&bins.switchboard, &bins.sb_echo] {
        if !bin.exists() {
            bail!("build: expected {} after the build", bin.display());
        }
        println!("build: {}", bin.display());
    }
    Ok(bins)
}
