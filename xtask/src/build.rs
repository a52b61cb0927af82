//! `cargo xtask build`: release build of `switchboard` (with the embedded eBPF
//! object, built by proxy-user/build.rs) and of the `sb-echo` pod server.

use std::path::PathBuf;

use anyhow::{bail, Result};

use crate::util::{cargo, release_bin, repo_root, run_inherit};

pub struct Binaries {
    pub switchboard: PathBuf,
    pub sb_echo: PathBuf,
}

pub fn run() -> Result<Binaries> {
    println!("build: cargo build --release -p proxy-user -p xtask --bins");
    run_inherit(cargo().current_dir(repo_root()).args([
        "build",
        "--release",
        "-p",
        "proxy-user",
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
