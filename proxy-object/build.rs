//! Builds the eBPF objects from `proxy-ebpf` for the BPF target and leaves
//! them in OUT_DIR, where `src/lib.rs` embeds them.
//!
//! Without bpf-linker (or with AYA_BUILD_SKIP=1) an empty object is written
//! instead, so `cargo check` and clippy work on a machine that cannot build
//! eBPF; such a binary says so when it tries to load the programs.
//!
//! The inner build is the one aya-build runs (the nightly's cargo for the
//! BPF target, `-Z build-std=core`, BTF), but quiet: nothing is printed when
//! it succeeds without a diagnostic, its compiler warnings come out as
//! cargo warnings, and a failure shows its whole output. With
//! SB_EBPF_DENY_WARNINGS=1 (`cargo xtask test`) a warning fails the build.
use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{anyhow, bail, Context as _};
use cargo_metadata::{diagnostic::DiagnosticLevel, Message};

fn main() -> anyhow::Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?);
    let object = out_dir.join("switchboard");
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo:rerun-if-env-changed=PATH");
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
        return Ok(());
    }
    println!("cargo:rerun-if-env-changed=SB_EBPF_DENY_WARNINGS");
    let manifest_dir = env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?;
    let ebpf_dir = PathBuf::from(manifest_dir).join("../proxy-ebpf");
    build_ebpf(&ebpf_dir, &out_dir)
}

/// Builds proxy-ebpf's binaries for the BPF target and copies them into
/// `out_dir`.
fn build_ebpf(ebpf_dir: &Path, out_dir: &Path) -> anyhow::Result<()> {
    // proxy-ebpf is a build-dependency, so its library's changes rerun this
    // script; its binaries' changes need this.
    println!("cargo:rerun-if-changed={}", ebpf_dir.display());
    let target = match env::var("CARGO_CFG_TARGET_ENDIAN")
        .context("CARGO_CFG_TARGET_ENDIAN not set")?
        .as_str()
    {
        "little" => "bpfel-unknown-none",
        "big" => "bpfeb-unknown-none",
        other => bail!("unsupported endianness {other}"),
    };
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    let arch = if arch.starts_with("riscv64") {
        "riscv64".to_owned()
    } else {
        arch
    };
    let deny_warnings = env::var("SB_EBPF_DENY_WARNINGS").is_ok_and(|v| v == "1");
    let mut flags = vec![
        format!("--cfg=bpf_target_arch=\"{arch}\""),
        "-Cdebuginfo=2".into(),
        "-Clink-arg=--btf".into(),
    ];
    if deny_warnings {
        flags.push("-Dwarnings".into());
    }
    let mut cmd = Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "build", "--package", "proxy-ebpf", "--bins"])
        .args(["--message-format=json", "--release", "--target", target, "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(out_dir.join(ebpf_target_dir()))
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        // proxy-ebpf reads it (see PROGRAM_REVISION there).
        .env("SB_PROGRAM_REVISION", program_revision())
        // The outer build's compiler is the stable one.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    let output = cmd
        .output()
        .with_context(|| format!("running {cmd:?} (is rustup installed? `cargo xtask setup`)"))?;
    let mut executables = Vec::new();
    let mut diagnostics = Vec::new();
    let mut warned = false;
    for message in Message::parse_stream(output.stdout.as_slice()) {
        match message.context("reading the eBPF build's messages")? {
            Message::CompilerArtifact(artifact) => {
                if let Some(executable) = artifact.executable {
                    executables.push((artifact.target.name, executable.into_std_path_buf()));
                }
            }
            Message::CompilerMessage(message) => {
                warned |= message.message.level == DiagnosticLevel::Warning;
                diagnostics.extend(message.message.rendered);
            }
            _ => {}
        }
    }
    if !output.status.success() {
        bail!(
            "building the eBPF programs failed ({}):\n{}\n{}",
            output.status,
            diagnostics.join("\n"),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    if warned {
        for line in diagnostics.iter().flat_map(|d| d.lines()) {
            println!("cargo:warning={line}");
        }
    }
    for (name, executable) in executables {
        let dest = out_dir.join(&name);
        fs::copy(&executable, &dest)
            .with_context(|| format!("copying {} to {}", executable.display(), dest.display()))?;
    }
    Ok(())
}

/// The pod programs' revision: 1 with the `revision-1` feature (`cargo
/// xtask test`'s upgrade variant), else 0.
fn program_revision() -> &'static str {
    match env::var_os("CARGO_FEATURE_REVISION_1") {
        Some(_) => "1",
        None => "0",
    }
}

/// The inner build's target directory, one per program revision: `cargo
/// xtask test` builds the upgrade variant beside the ordinary build, and each
/// keeps its compiled programs instead of rebuilding them every time the
/// other was built last.
fn ebpf_target_dir() -> String {
    format!("ebpf-target-rev{}", program_revision())
}

fn which_bpf_linker() -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join("bpf-linker"))
        .find(|candidate| candidate.is_file())
}
