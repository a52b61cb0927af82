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
        Cmd::CleanupStale => {
            xtask::sandbox::cleanup_stale()?;
            xtask::sandbox::purge_tag(xtask::sandbox::DEMO_TAG)
        }
    }
}
