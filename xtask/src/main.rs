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
    /// setup + build + a netns sandbox: client → ClusterIP → three pods.
    Demo,
    /// setup + build + every test (unit, fixtures, netns e2e) + clippy. Needs root.
    Test,
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
        Cmd::Bench {
            report_only: Some(dir),
            ..
        } => xtask::bench::report_again(&dir),
        Cmd::Bench { quick, out, .. } => xtask::bench::run(xtask::bench::Options { quick, out }),
        Cmd::Image { out, tag } => xtask::image::run(out, tag),
        Cmd::CleanupStale => {
            xtask::sandbox::cleanup_stale()?;
            xtask::sandbox::purge_tag(xtask::sandbox::DEMO_TAG)
        }
    }
}
