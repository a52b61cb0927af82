//! `cargo xtask build`: release build of `switchboard` (with the eBPF object
//! embedded from proxy-object, built by proxy-object/build.rs) and of the
//! `sb-echo` pod server.

use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};

use crate::util::{cargo, release_bin, repo_root, run_inherit, show};

pub struct Binaries {
    pub switchboard: PathBuf,
    pub sb_echo: PathBuf,
}

/// Builds `switchboard` as an "upgrade": the `revision-1` feature gives its
/// pod programs other instructions (see proxy-ebpf's `PROGRAM_REVISION`), so
/// the lifecycle test can swap running programs for changed ones. Copied to
/// `target/release/switchboard-upgrade`. The packages and features are those
/// of `cargo test --workspace` (the test build), so only proxy-object and the
/// binary are built for it: the agent's library is shared. Run it after the
/// test build; it puts the ordinary binary back in `target/release` when it
/// is done (cargo only links it there again).
pub fn upgrade_variant() -> Result<PathBuf> {
    build_switchboard(&["--features", "switchboard/revision-1"])?;
    let dest = release_bin("switchboard-upgrade");
    std::fs::copy(release_bin("switchboard"), &dest)
        .with_context(|| format!("copying the upgrade build to {}", dest.display()))?;
    println!("build: {}", dest.display());
    build_switchboard(&[])?;
    Ok(dest)
}

/// `cargo build` of the switchboard binary with the test build's packages.
fn build_switchboard(extra: &[&str]) -> Result<()> {
    let mut cmd = cargo();
    cmd.current_dir(repo_root())
        .args([
            "build",
            "--release",
            "--workspace",
            "--exclude",
            "proxy-ebpf",
            "--bin",
            "switchboard",
        ])
        .args(extra);
    println!("build: {}", show(&cmd));
    run_inherit(&mut cmd)
}

/// After the test build and the variant: the ordinary binaries, and a check
/// that the upgrade variant is not one of them (`target/release/switchboard` must be
/// the ordinary build again).
pub fn test_binaries(upgrade: &std::path::Path) -> Result<Binaries> {
    let bins = Binaries {
        switchboard: release_bin("switchboard"),
        sb_echo: release_bin("sb-echo"),
    };
    for bin in [&bins.switchboard, &bins.sb_echo] {
        if !bin.exists() {
            bail!("build: expected {} after the test build", bin.display());
        }
    }
    let read = |path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("reading {}", path.display()))
    };
    if read(&bins.switchboard)? == read(upgrade)? {
        bail!(
            "build: {} is the upgrade variant, not the ordinary build",
            bins.switchboard.display()
        );
    }
    Ok(bins)
}

pub fn run() -> Result<Binaries> {
    println!("build: cargo build --release -p switchboard -p xtask --bins");
    run_inherit(cargo().current_dir(repo_root()).args([
        "build",
        "--release",
        "-p",
        "switchboard",
        "-p",
        "xtask",
        "--bins",
    ]))?;
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
