//! `cargo xtask build`: release build of `switchboard` (with the eBPF object
//! embedded from proxy-object, built by proxy-object/build.rs) and of the
//! `sb-echo` pod server; the demo's and the benchmark's builds.

use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};

use crate::util::{cargo, release_bin, repo_root, run_inherit, show, target_dir};

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

/// `cargo xtask build` (and image, soak): the release `switchboard` and
/// `sb-echo`, nothing else.
pub fn run() -> Result<Binaries> {
    build("release", &["switchboard", "sb-echo"], false)
}

/// The demo's binaries, `switchboard` and `sb-echo`, in the `demo` profile
/// (see the workspace's Cargo.toml): built in a fraction of the release
/// build's time.
pub fn demo() -> Result<Binaries> {
    build("demo", &["switchboard", "sb-echo"], false)
}

/// The benchmark's binaries: the release build's and its pod servers
/// `sb-http` and `sb-apiserver`.
pub fn bench() -> Result<Binaries> {
    build(
        "release",
        &["switchboard", "sb-echo", "sb-http", "sb-apiserver"],
        true,
    )
}

/// `cargo build --profile PROFILE` of `bins` (of switchboard and xtask) and
/// nothing else, xtask without its `harness` feature unless `harness`; the
/// paths of switchboard and sb-echo.
fn build(profile: &str, bins: &[&str], harness: bool) -> Result<Binaries> {
    let mut args = vec![
        "build",
        "--profile",
        profile,
        "-p",
        "switchboard",
        "-p",
        "xtask",
    ];
    args.extend(bins.iter().flat_map(|bin| ["--bin", bin]));
    if !harness {
        args.push("--no-default-features");
    }
    println!("build: cargo {}", args.join(" "));
    let mut cmd = cargo();
    cmd.current_dir(repo_root()).args(&args);
    run_inherit(&mut cmd)?;
    let dir = target_dir().join(profile);
    for bin in bins {
        let path = dir.join(bin);
        if !path.exists() {
            bail!("build: expected {} after the build", path.display());
        }
        println!("build: {}", path.display());
    }
    Ok(Binaries {
        switchboard: dir.join("switchboard"),
        sb_echo: dir.join("sb-echo"),
    })
}
