//! The `switchboard` binary: agent and CLI.
// The agent handles every failure: no unwrap, expect or panic outside tests.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]
use anyhow::Context as _;
use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use proxy_user::{agent, args::AgentArgs, cli};
use tracing_subscriber::EnvFilter;

/// The release and the git revision the binary was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("SB_GIT_REVISION"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "switchboard",
    version = VERSION,
    about = "eBPF Service load balancer (kube-proxy replacement)"
)]
struct Cli {
    /// Log verbosity as kube-proxy counts it: 0-1 info, 2-3 debug, 4 and up
    /// trace (RUST_LOG, when set, wins).
    #[arg(short = 'v', long = "v", global = true, value_name = "LEVEL")]
    verbosity: Option<u8>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load the programs, attach them to pod interfaces and keep the maps in
    /// step with the Services and EndpointSlices of the source.
    Agent(Box<AgentArgs>),
    /// Print the release and the git revision of this binary.
    Version,
    #[command(flatten)]
    Ops(cli::Command),
}

/// Counts the bytes held on the heap, for the agent's memory accounting.
#[global_allocator]
static ALLOC: proxy_user::util::heap::Counting = proxy_user::util::heap::Counting;

fn main() -> anyhow::Result<()> {
    let cli = parse()?;
    init_logging(cli.verbosity)?;
    match cli.command {
        Command::Agent(args) if args.cleanup => {
            let pin_root = args.pin_root.clone();
            cli::cleanup_for_agent_flag(&pin_root)
        }
        Command::Agent(args) => {
            let config = args.into_config()?;
            proxy_user::util::heap::tune();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            // A permission error names the capabilities this process lacks.
            runtime
                .block_on(agent::run(config, proxy_object::SWITCHBOARD))
                .map_err(proxy_user::dataplane::load::caps::name_missing)
        }
        Command::Version => {
            println!("switchboard {VERSION}");
            Ok(())
        }
        Command::Ops(command) => cli::run(command),
    }
}

/// Parses the command line, with `agent --config FILE`'s settings merged in.
fn parse() -> anyhow::Result<Cli> {
    let command = Cli::command();
    let agent_flags: Vec<String> = command
        .find_subcommand("agent")
        .map(|agent| {
            agent
                .get_arguments()
                .filter_map(|a| a.get_long())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let argv = proxy_user::args::merge_config_file(std::env::args_os().collect(), &agent_flags)?;
    let matches = command.get_matches_from(argv);
    Cli::from_arg_matches(&matches).map_err(|e| e.exit())
}

fn init_logging(verbosity: Option<u8>) -> anyhow::Result<()> {
    let default = match verbosity.unwrap_or(0) {
        0..=1 => "info",
        2..=3 => "debug",
        _ => "trace",
    };
    // netlink-packet-route warns about every attribute newer than itself.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(default))
        .add_directive("netlink_packet_route=error".parse()?);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    Ok(())
}
