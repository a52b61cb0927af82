use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "switchboard build, demo and test tasks")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what is missing: apt tools, rust-src for nightly, bpf-linker.
    Setup,
    /// Release build of `switchboard` and `sb-echo`.
    Build,
    /// setup + a build of switchboard and sb-echo (the `demo` profile) + a
    /// netns sandbox: client → ClusterIP → three pods.
    Demo,
    /// setup + build + every test (unit, fixtures, netns e2e) + clippy. Needs root.
    Test,
    /// Check the docs: every relative link in README.md and docs/ reaches a
    /// file and heading, and the quoted benchmark figures match
    /// docs/benchmarks/latest.json (also a unit test under `cargo xtask test`).
    Docs {
        /// First write the README's headline figures again from
        /// docs/benchmarks/latest.json (after a benchmark run).
        #[arg(long)]
        write: bool,
    },
    /// Benchmarks against kube-proxy-style iptables/nftables and a direct
    /// path; writes xtask/results/<timestamp>/report.md. Needs root.
    Bench {
        /// Fewer sizes and shorter runs (under two minutes; the CI smoke test).
        #[arg(long)]
        quick: bool,
        /// Write the report here instead of xtask/results/<timestamp>/.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// Measure nothing: write report.md and the plots again from the
        /// results.json in this folder (after a change to the report).
        #[arg(long, conflicts_with_all = ["quick", "out"])]
        report_only: Option<std::path::PathBuf>,
    },
    /// Release build, then a container image of `switchboard` as an OCI image
    /// layout (no container engine needed); push it with skopeo.
    Image {
        /// The layout's directory (default: target/oci/switchboard).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// NAME:TAG (default: switchboard:<version>).
        #[arg(long)]
        tag: Option<String>,
    },
    /// Long runs against the fake API server, with traffic: churn (Service
    /// and EndpointSlice changes at --rate while a client in a pod
    /// namespace uses a Service that does not change); with --faults, a
    /// second run cycling API server faults through the churn. Prints
    /// changes/s, requests sent/failed, agent RSS, convergence and
    /// `switchboard verify`; exits 1 when a check fails. Needs root.
    Soak {
        /// Seconds of measured churn (after the warm-up).
        #[arg(long, default_value_t = 60)]
        duration: u64,
        /// Seconds of churn before the RSS figure the end is held to.
        #[arg(long, default_value_t = 10)]
        warmup: u64,
        /// Service and EndpointSlice changes per second.
        #[arg(long, default_value_t = 1000)]
        rate: u32,
        /// Services that change.
        #[arg(long, default_value_t = 1000)]
        services: usize,
        /// Also run the churn with API server faults cycling through it.
        #[arg(long)]
        faults: bool,
        /// Frames the data-path fuzz feeds each program mix, and (÷ 100)
        /// cases of the model and sync property tests; 0 skips them.
        #[arg(long, default_value_t = 1_000_000)]
        fuzz_cases: u64,
        /// Seconds of each spoofed SYN flood (through a ClusterIP from a pod,
        /// and from outside at a NodePort), with the checks of the
        /// `e2e_conntrack` flood tests; 0 skips them.
        #[arg(long, default_value_t = 120)]
        flood_secs: u64,
    },
    /// Remove test sandboxes (namespaces, pin mounts) left by dead processes,
    /// and the demo sandbox.
    CleanupStale,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Setup => xtask::setup::run(),
        Cmd::Build => xtask::build::run().map(|_| ()),
        Cmd::Demo => xtask::demo::run(),
        Cmd::Test => xtask::testcmd::run(),
        Cmd::Docs { write } => xtask::docs::run(write),
        Cmd::CleanupStale => {
            xtask::sandbox::cleanup_stale()?;
            xtask::sandbox::purge_tag(xtask::sandbox::DEMO_TAG)
        }
        #[cfg(not(feature = "harness"))]
        Cmd::Bench { .. } | Cmd::Image { .. } | Cmd::Soak { .. } => with_harness(),
        #[cfg(feature = "harness")]
        Cmd::Bench {
            report_only: Some(dir),
            ..
        } => xtask::bench::report_again(&dir),
        #[cfg(feature = "harness")]
        Cmd::Bench { quick, out, .. } => xtask::bench::run(xtask::bench::Options { quick, out }),
        #[cfg(feature = "harness")]
        Cmd::Image { out, tag } => xtask::image::run(out, tag),
        #[cfg(feature = "harness")]
        Cmd::Soak {
            duration,
            warmup,
            rate,
            services,
            faults,
            fuzz_cases,
            flood_secs,
        } => {
            properties(fuzz_cases)?;
            floods(flood_secs)?;
            soak(duration, warmup, rate, services, faults)
        }
    }
}

/// bench, image and soak: the same command in an xtask built with the
/// `harness` feature, which the `cargo xtask` alias leaves out (see
/// Cargo.toml). Replaces this process, so Ctrl-C and the exit status are
/// the other one's.
#[cfg(not(feature = "harness"))]
fn with_harness() -> Result<()> {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = xtask::util::cargo();
    cmd.current_dir(xtask::util::repo_root())
        .args([
            "run",
            "--quiet",
            "--package",
            "xtask",
            "--features",
            "harness",
            "--",
        ])
        .args(std::env::args_os().skip(1));
    let err = cmd.exec();
    Err(anyhow::Error::new(err).context(format!("could not start `{}`", xtask::util::show(&cmd))))
}

/// The fuzz and the property tests at soak length.
#[cfg(feature = "harness")]
fn properties(fuzz_cases: u64) -> Result<()> {
    if fuzz_cases == 0 {
        return Ok(());
    }
    let proptest_cases = (fuzz_cases / 100).max(1);
    println!("== fuzz ({fuzz_cases} frames) and property tests ({proptest_cases} cases) ==");
    let status = xtask::util::cargo()
        .current_dir(xtask::util::repo_root())
        .args([
            "test",
            "--release",
            "-p",
            "proxy-user",
            "--lib",
            "--test",
            "kernel",
            "--",
        ])
        .args([
            "properties",
            "random_and_mutated_frames",
            "--test-threads=1",
        ])
        .env("SB_FUZZ_CASES", fuzz_cases.to_string())
        .env("PROPTEST_CASES", proptest_cases.to_string())
        .status()?;
    if !status.success() {
        anyhow::bail!("soak: the fuzz or a property test failed");
    }
    Ok(())
}

/// The flood tests of `e2e_conntrack` at soak length.
#[cfg(feature = "harness")]
fn floods(secs: u64) -> Result<()> {
    if secs == 0 {
        return Ok(());
    }
    let bins = xtask::build::run()?;
    println!("== spoofed SYN floods of {secs} s ==");
    let status = xtask::util::cargo()
        .current_dir(xtask::util::repo_root())
        .args(["test", "--release", "-p", "xtask", "--test", "e2e", "--"])
        .args(["spoofed_syn_flood", "--test-threads=1", "--nocapture"])
        .env("SB_FLOOD_SECS", secs.to_string())
        .env("SWITCHBOARD_BIN", &bins.switchboard)
        .env("SB_ECHO_BIN", &bins.sb_echo)
        .status()?;
    if !status.success() {
        anyhow::bail!("soak: a flood test failed");
    }
    Ok(())
}

#[cfg(feature = "harness")]
fn soak(duration: u64, warmup: u64, rate: u32, services: usize, faults: bool) -> Result<()> {
    let bins = xtask::build::run()?;
    let mut failed = false;
    let runs: &[bool] = if faults { &[false, true] } else { &[false] };
    for &with_faults in runs {
        let opts = xtask::soak::ChurnOptions {
            warmup: std::time::Duration::from_secs(warmup),
            churn: std::time::Duration::from_secs(duration),
            rate,
            services,
            faults: with_faults,
            switchboard: bins.switchboard.clone(),
            sb_echo: bins.sb_echo.clone(),
        };
        let title = if with_faults {
            "churn with API server faults"
        } else {
            "churn"
        };
        println!("== {title}: {duration} s at {rate} changes/s, {services} Services ==");
        let report = xtask::soak::run(&opts)?;
        print!("{}", report.render());
        let failures = report.failures(rate);
        for f in &failures {
            println!("FAILED: {f}");
        }
        failed |= !failures.is_empty();
    }
    if failed {
        anyhow::bail!("soak failed");
    }
    println!("soak passed");
    Ok(())
}
