//! Builds the eBPF object from `proxy-ebpf` for the BPF target and leaves it in
//! OUT_DIR, where `src/ebpf.rs` embeds it.
//!
//! Without bpf-linker (or with AYA_BUILD_SKIP=1) an empty object is written
//! instead, so `cargo check` and clippy work on a machine that cannot build
//! eBPF; such a binary says so when it tries to load the programs.
use std::{env, fs, path::PathBuf};

use anyhow::{anyhow, Context as _};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?);
    let object = out_dir.join("switchboard");
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo:rerun-if-env-changed=PATH");
    // proxy-ebpf reads it (see PROGRAM_REVISION there); the inner cargo
    // rebuilds the object when it changes.
    println!("cargo:rerun-if-env-changed=SB_PROGRAM_REVISION");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let linker = which_bpf_linker();
    if linker.is_none() {
        // Watch where bpf-linker would appear: cargo treats a missing file as
        // changed, so once `cargo xtask setup` installs it the stub is rebuilt
        // into the real object instead of staying cached.
        if let Some(home) = env::var_os("CARGO_HOME").or_else(|| {
            env::var_os("HOME").map(|h| {
                let mut p = PathBuf::from(h);
                p.push(".cargo");
                p.into_os_string()
            })
        }) {
            println!(
                "cargo:rerun-if-changed={}",
                PathBuf::from(home).join("bin/bpf-linker").display()
            );
        }
    }
    if skip || linker.is_none() {
        println!(
            "cargo:warning=bpf-linker not found or AYA_BUILD_SKIP set: building without the eBPF object (run `cargo xtask setup`)"
        );
        fs::write(&object, b"").context("writing the empty eBPF stub")?;
        // The benchmarks' floor object (proxy-ebpf's `sb-empty` bin).
        fs::write(out_dir.join("sb-empty"), b"").context("writing the empty sb-empty stub")?;
        println!("cargo:rustc-cfg=switchboard_no_ebpf");
        println!("cargo::rustc-check-cfg=cfg(switchboard_no_ebpf)");
        return Ok(());
    }
    println!("cargo::rustc-check-cfg=cfg(switchboard_no_ebpf)");
    let manifest_dir = env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    let ebpf_dir = PathBuf::from(manifest_dir).join("../proxy-ebpf");
    let ebpf_dir = ebpf_dir
        .to_str()
        .ok_or_else(|| anyhow!("non-UTF-8 path {}", ebpf_dir.display()))?;
    aya_build::build_ebpf(
        [Package {
            name: "proxy-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        Toolchain::default(),
    )
}

fn which_bpf_linker() -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join("bpf-linker"))
        .find(|candidate| candidate.is_file())
}
