//! `cargo xtask test`: the one command that runs every test (`.ci/run` calls
//! it). setup → `cargo fmt --check` → build (the upgrade variant, the
//! binaries, the test binaries) → the tests, several jobs at a time (see
//! `testrun`) → clippy, on the host (xtask also without its `harness`
//! feature) and for the BPF target → the ten longest jobs and a closing
//! `test: N passed, M failed` line.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::util::{cargo, repo_root, run_inherit, show};

/// Test jobs at a time: the end-to-end tests mostly wait, so three share
/// two cores well (`SB_TEST_LANES` overrides).
const LANES: usize = 3;

pub fn run() -> Result<()> {
    if !crate::util::is_root() {
        bail!(
            "test: must run as root: the end-to-end tests create network namespaces, \
             mount bpffs and load eBPF programs (try `sudo -E cargo xtask test`)"
        );
    }
    let mut steps = Steps::default();
    steps.time("setup", crate::setup::run)?;
    // A warning in the eBPF crate fails every build below (proxy-object's
    // build script reads it; each build sees the same value, so the eBPF
    // object is not rebuilt between them).
    std::env::set_var("SB_EBPF_DENY_WARNINGS", "1");
    println!("test: cargo fmt --all --check");
    let fmt = steps.time("fmt --check", || {
        run_inherit(
            cargo()
                .current_dir(repo_root())
                .args(["fmt", "--all", "--check"]),
        )
    });
    if let Err(e) = crate::sandbox::cleanup_stale() {
        eprintln!("test: cleaning stale sandboxes: {e:#}");
    }

    // One build of everything: the agent's library, its unit tests, the
    // test binaries and the binaries the tests run (switchboard, sb-echo),
    // side by side; then the upgrade variant, which rebuilds the binary only.
    let mut cmd = cargo();
    cmd.current_dir(repo_root()).args([
        "test",
        "--release",
        "--workspace",
        "--exclude",
        "proxy-ebpf",
        "--no-run",
    ]);
    let binaries = steps.time("build: tests and binaries", || crate::testrun::build(cmd))?;
    let upgrade = steps.time("build: upgrade variant", crate::build::upgrade_variant)?;
    let bins = crate::build::test_binaries(&upgrade)?;
    let lanes = std::env::var("SB_TEST_LANES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LANES);
    let summary = steps.time("tests", || {
        crate::testrun::run(
            &binaries,
            lanes,
            &[
                ("SWITCHBOARD_BIN", &bins.switchboard),
                ("SB_ECHO_BIN", &bins.sb_echo),
                ("SWITCHBOARD_UPGRADE_BIN", &upgrade),
            ],
        )
    })?;
    let counts = &summary.counts;

    // --release reuses the build scripts' output (the eBPF object) and the
    // proc macros of the release build: minutes less on 2 cores.
    println!("test: cargo clippy --release --workspace --all-targets -- -D warnings");
    let clippy = steps.time("clippy", || {
        run_inherit(cargo().current_dir(repo_root()).args([
            "clippy",
            "--release",
            "--workspace",
            "--exclude",
            "proxy-ebpf",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))
    });
    if let Err(e) = &clippy {
        println!("test: clippy failed: {e:#}");
    }
    // xtask as the `cargo xtask` alias builds it: the code behind
    // `not(feature = "harness")` and the imports it leaves unused.
    let mut light = cargo();
    light.current_dir(repo_root()).args([
        "clippy",
        "--release",
        "-p",
        "xtask",
        "--no-default-features",
        "--lib",
        "--bins",
        "--",
        "-D",
        "warnings",
    ]);
    println!("test: {}", show(&light));
    let light_clippy = steps.time("clippy: xtask without harness", || run_inherit(&mut light));
    if let Err(e) = &light_clippy {
        println!("test: clippy on xtask without harness failed: {e:#}");
    }
    let bpf_clippy = steps.time("clippy: BPF target", clippy_bpf);
    if let Err(e) = &bpf_clippy {
        println!("test: clippy on the BPF target failed: {e:#}");
    }
    if let Err(e) = &fmt {
        println!("test: the tree is not formatted (run `cargo fmt --all`): {e:#}");
    }
    let leftovers: Vec<String> = crate::sandbox::list_netns()
        .unwrap_or_default()
        .into_iter()
        .filter(|ns| ns.starts_with("sbt") || ns.starts_with("sbx-"))
        .collect();
    if !leftovers.is_empty() {
        println!(
            "test: WARNING: namespaces left behind: {}",
            leftovers.join(" ")
        );
    }

    println!(
        "test: {} passed, {} failed{}",
        counts.passed,
        counts.failed,
        if counts.ignored > 0 {
            format!(", {} skipped", counts.ignored)
        } else {
            String::new()
        }
    );
    println!(
        "test: the tests took {:.0} s of wall time; the ten longest jobs:",
        summary.wall.as_secs_f64()
    );
    for (name, took) in summary.durations.iter().take(10) {
        println!("test:   {:>6.1} s  {name}", took.as_secs_f64());
    }
    steps.print();
    if !summary.failed_jobs.is_empty() {
        bail!("failed: {}", summary.failed_jobs.join(", "));
    }
    clippy?;
    light_clippy?;
    bpf_clippy?;
    fmt?;
    Ok(())
}

/// How long each step of the run took, printed at the end.
#[derive(Default)]
struct Steps(Vec<(&'static str, Duration)>);

impl Steps {
    fn time<T>(&mut self, name: &'static str, step: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = step();
        self.0.push((name, start.elapsed()));
        out
    }

    fn print(&self) {
        let total: Duration = self.0.iter().map(|(_, took)| *took).sum();
        println!("test: the steps took {:.0} s:", total.as_secs_f64());
        for (name, took) in &self.0 {
            println!("test:   {:>6.1} s  {name}", took.as_secs_f64());
        }
    }
}

/// Clippy on the kernel programs, for the BPF target they are built for,
/// under the same workspace lints (the nightly's clippy: the eBPF build uses
/// the nightly's compiler).
fn clippy_bpf() -> Result<()> {
    let arch = std::env::consts::ARCH;
    let mut cmd = std::process::Command::new("rustup");
    cmd.current_dir(repo_root())
        .args([
            "run",
            "nightly",
            "cargo",
            "clippy",
            "--package",
            "proxy-ebpf",
            "--bins",
        ])
        .args([
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(repo_root().join("target/bpf-clippy"))
        .args(["--", "-D", "warnings"])
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{arch}\""),
        )
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER");
    println!("test: {}", show(&cmd));
    run_inherit(&mut cmd)
}
