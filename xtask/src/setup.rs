//! `cargo xtask setup`: install what building and testing need, idempotently.
//!
//! Every step first checks whether its tool is already there and says so; it
//! only installs what is missing.

use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::util::{is_root, run_capture, run_inherit, which};

/// Pinned bpf-linker: builds against rustc's own LLVM (see BRIEF.md).
pub const BPF_LINKER_VERSION: &str = "0.10.4";

/// (command that must exist, Debian package that provides it)
const APT_TOOLS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("bpftool", "bpftool"),
    ("iptables", "iptables"),
    ("nft", "nftables"),
    ("conntrack", "conntrack"),
    ("wrk", "wrk"),
];

pub fn run() -> Result<()> {
    apt_packages()?;
    components()?;
    bpf_linker()?;
    println!("setup: done");
    Ok(())
}

fn apt_packages() -> Result<()> {
    let mut missing = Vec::new();
    for (tool, package) in APT_TOOLS {
        match which(tool) {
            Some(path) => println!("setup: {tool} present ({})", path.display()),
            None => {
                println!("setup: {tool} missing (package {package})");
                missing.push(*package);
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "setup: need root to install {} (run as root, or `apt-get install {}`)",
            missing.join(" "),
            missing.join(" ")
        );
    }
    println!("setup: apt-get update");
    run_inherit(
        Command::new("apt-get")
            .args(["update", "-q"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    println!("setup: installing {}", missing.join(" "));
    run_inherit(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    for (tool, package) in APT_TOOLS {
        if which(tool).is_none() {
            bail!("setup: {tool} still missing after installing {package}");
        }
    }
    Ok(())
}

/// The toolchain components the build and the checks use: the nightly's
/// rust-src (the eBPF build's `-Z build-std=core`) and clippy (clippy on the
/// BPF target), the stable toolchain's rustfmt and clippy.
const COMPONENTS: [(&str, &str); 4] = [
    ("nightly", "rust-src"),
    ("nightly", "clippy"),
    ("stable", "rustfmt"),
    ("stable", "clippy"),
];

fn components() -> Result<()> {
    for (toolchain, component) in COMPONENTS {
        ensure_component(toolchain, component)?;
    }
    Ok(())
}

fn ensure_component(toolchain: &str, component: &str) -> Result<()> {
    let out = run_capture(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        toolchain,
        "--installed",
    ]))
    .with_context(|| {
        format!("setup: is the {toolchain} toolchain installed? (`rustup toolchain list`)")
    })?;
    let installed = String::from_utf8_lossy(&out.stdout);
    if installed.lines().any(|l| l.trim().starts_with(component)) {
        println!("setup: {component} for {toolchain} present");
        return Ok(());
    }
    println!("setup: installing {component} for {toolchain} (rustup component add {component} --toolchain {toolchain})");
    run_inherit(Command::new("rustup").args([
        "component",
        "add",
        component,
        "--toolchain",
        toolchain,
    ]))
}

fn bpf_linker() -> Result<()> {
    let current = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match current {
        Some(v) if v.split_whitespace().nth(1) == Some(BPF_LINKER_VERSION) => {
            println!("setup: bpf-linker {BPF_LINKER_VERSION} present");
            return Ok(());
        }
        Some(v) => println!("setup: found `{v}`, want {BPF_LINKER_VERSION}"),
        None => println!("setup: bpf-linker missing"),
    }
    println!(
        "setup: installing bpf-linker {BPF_LINKER_VERSION} \
         (cargo install bpf-linker --version {BPF_LINKER_VERSION} --locked, \
         without debug info; takes a few minutes)"
    );
    run_inherit(
        crate::util::cargo()
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--force",
            ])
            // Its release profile asks for full debug info, which lengthens
            // the build and serves only a debugger on the linker itself.
            .env("CARGO_PROFILE_RELEASE_DEBUG", "false"),
    )
}
