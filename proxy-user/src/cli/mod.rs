//! The operator CLI: `services`, `verify`, `stats`, `status`, `explain`, `trace`, `conntrack`,
//! `doctor` and `cleanup`. Each reads the pinned maps (and the agent's
//! status file, the network namespace it runs in, the source) directly, so
//! it works whether or not an agent runs; `verify` and `trace` alone ask
//! the running agent (only it knows its desired state; only it reads the
//! trace's ring buffer).
//!
//! Exit status of `status`, `doctor`, `verify` and `explain`: 0 when all is well (for
//! `explain`: the flow reaches a backend), 1 when a problem is listed (the
//! flow is dropped, rejected or not handled), or when the command itself
//! failed; clap's usage errors exit 2.
use std::{
    io::{self, Write},
    path::{Path, PathBuf},
};

mod agent_proc;
mod cleanup;
mod conntrack;
mod desired;
mod doctor;
mod explain;
pub(crate) mod hooks;
mod kube_proxy;
mod services;
mod stats;
pub(crate) mod status;
mod table;
mod trace;
mod verify;

pub use agent_proc::{agent_process, AgentProcess};
pub use cleanup::{cleanup, CleanupReport};
pub use services::{render_status, render_table, services};
pub use stats::{render_stats, stats};

use crate::dataplane::maps::readback::{
    read_services, read_stats, BackendRow, MapFill, ServiceRow,
};
use crate::dataplane::pins::format::DEFAULT_PIN_ROOT;

/// What every command takes: the pin root and the output format.
#[derive(clap::Args, Clone, Debug)]
pub struct Common {
    /// Where the agent pinned its maps.
    #[arg(long, default_value = DEFAULT_PIN_ROOT, env = "SWITCHBOARD_PIN_ROOT")]
    pub pin_root: PathBuf,
    /// `table` for people, `json` for scripts.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// The subcommands that read (or clean up) what an agent programmed.
#[derive(clap::Subcommand)]
pub enum Command {
    /// Print every frontend and its backends from the pinned maps.
    Services {
        #[command(flatten)]
        common: Common,
    },
    /// Ask the running agent whether the pinned maps hold exactly its
    /// desired state (the frontends and backends it is syncing), compared
    /// between two syncs. Lists each difference per frontend: missing,
    /// extra, wrong backends or slot-0 attributes, slots naming absent
    /// backends, orphaned slots, backends and reverse-NAT entries. Exits 0
    /// when they match, 1 when not (or when no agent answers).
    Verify {
        #[command(flatten)]
        common: Common,
    },
    /// Print the data path's counters (summed over CPUs) and map fill levels.
    Stats {
        #[command(flatten)]
        common: Common,
    },
    /// One screen on the node: the agent (running? version, source, node,
    /// uptime), the interfaces and their programs (what the agent says it
    /// attached against what is attached in this network namespace), map
    /// fill, the last sync, and problems. Exits 1 when a problem is listed.
    Status {
        #[command(flatten)]
        common: Common,
    },
    /// Explain what happens to a flow to IP:PORT/PROTO: which frontend
    /// matches, which backend the flow gets and why (conntrack, session
    /// affinity, Maglev or source hash computed as the kernel does, or a
    /// random pick), the traffic policy in force, or why nothing matches.
    /// Exits 0 when the flow reaches a backend, 1 when it does not.
    Explain {
        /// The destination: `10.96.0.10:80/TCP`, `[fd00::10]:80/TCP` (`/TCP`
        /// when left out; `UDP` too; case does not matter).
        #[arg(value_name = "IP:PORT/PROTO", value_parser = explain::parse_target)]
        target: explain::Target,
        /// The client: `IP[:PORT]` or `[IPv6]:PORT`, of the destination's
        /// family (the port is needed to name a conntrack
        /// entry or a Maglev pick). It counts as internal (a pod or this
        /// node) when it is an address of this network namespace or the
        /// route to it leaves through a pod interface (a veth whose peer is
        /// in another namespace, and not one of the agent's uplinks); any
        /// other source reaches the node through an uplink and counts as external (externalTrafficPolicy and the
        /// Service's algorithm apply). Without --from: a pod of this node.
        #[arg(long, value_name = "IP[:PORT]", value_parser = explain::parse_source)]
        from: Option<(std::net::IpAddr, Option<u16>)>,
        /// Overrides the rule above: `internal` (from a pod or this node) or
        /// `external` (arrived on an uplink).
        #[arg(long, value_enum)]
        scope: Option<explain::Scope>,
        #[command(flatten)]
        common: Common,
    },
    /// Stream what the data path does, live, from the running agent: each
    /// drop with its reason, each new flow with its backend, layer and
    /// algorithm, each reverse-translation miss. Filters select by
    /// Service, frontend, client, backend, protocol and event type. Events
    /// are switched on in the kernel only while a trace runs; lost events
    /// (a full ring buffer, a slow reader) are counted in the stream.
    Trace {
        #[command(flatten)]
        args: trace::TraceArgs,
        #[command(flatten)]
        common: Common,
    },
    /// List or flush connection-tracking entries.
    Conntrack {
        #[command(subcommand)]
        action: conntrack::Action,
    },
    /// Check the usual causes of "my Service does not answer": a Service
    /// without endpoints, a selector that matches no Pod, the agent not
    /// running, rules missing (programs not attached, maps that differ from
    /// what the source asks for), and kube-proxy leftovers. Each finding
    /// says what to do. Exits 1 when something is wrong.
    Doctor {
        /// Kubeconfig for the Pod and Service lookups (default: the one the
        /// agent was given, then in-cluster / KUBECONFIG / ~/.kube/config).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// Detach everything switchboard attached in this network namespace and
    /// cgroup (pinned TCX, XDP and cgroup links; netlink clsact filters and
    /// XDP programs of switchboard's), unpin every map, remove the pin
    /// directory and the status file. Refuses while an agent runs.
    Cleanup {
        /// Also remove kube-proxy's leftovers in this network namespace: its
        /// `KUBE-*` iptables chains (filter, nat, mangle; the jumps to them
        /// from the built-in chains first) and its nftables tables (`ip
        /// kube-proxy`, `ip6 kube-proxy`).
        #[arg(long)]
        kube_proxy: bool,
        /// Clean up even while an agent holds the pin root (it keeps
        /// running with nothing attached until it restarts).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        common: Common,
    },
}

/// How a command prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Opens the pinned maps for a CLI command
/// ([`PinnedMaps::open_for_cli`](crate::dataplane::maps::PinnedMaps::open_for_cli)).
pub fn open_maps(
    pin_root: &std::path::Path,
) -> Result<crate::dataplane::maps::PinnedMaps, crate::dataplane::pins::MapsError> {
    crate::dataplane::maps::PinnedMaps::open_for_cli(pin_root)
}

/// What a command printed, and whether it found something wrong.
pub struct Done {
    pub text: String,
    pub failed: bool,
}

impl Done {
    fn ok(text: String) -> Self {
        Self {
            text,
            failed: false,
        }
    }
}

/// Runs one of the CLI's subcommands, printing to stdout; exits 1 when the
/// command found a problem (see the module documentation).
pub fn run(command: Command) -> anyhow::Result<()> {
    let done = match command {
        Command::Services { common } => {
            Done::ok(services(&common.pin_root, common.output == Output::Json)?)
        }
        Command::Verify { common } => verify::run(&common)?,
        Command::Stats { common } => {
            Done::ok(stats(&common.pin_root, common.output == Output::Json)?)
        }
        Command::Status { common } => status::run(&common)?,
        Command::Explain {
            target,
            from,
            scope,
            common,
        } => explain::run(&common, target, from, scope)?,
        Command::Trace { args, common } => trace::run(&common, &args)?,
        Command::Conntrack { action } => conntrack::run(action)?,
        Command::Doctor { kubeconfig, common } => doctor::run(&common, kubeconfig)?,
        Command::Cleanup {
            kube_proxy,
            force,
            common,
        } => cleanup::run(&common, kube_proxy, force)?,
    };
    print_out(&done.text)?;
    if done.failed {
        std::process::exit(1);
    }
    Ok(())
}

/// `switchboard agent --cleanup` (kube-proxy's flag): what `switchboard
/// cleanup` does for switchboard's own state, printed as a table.
pub fn cleanup_for_agent_flag(pin_root: &Path) -> anyhow::Result<()> {
    let report = cleanup(pin_root, false, false)?;
    print_out(&cleanup::render(&report))?;
    Ok(())
}

/// Prints a command's output on stdout. A reader that went away (`| head
/// -1`: EPIPE) ends the output as if it had all been read: the command's
/// own verdict (its exit status) stands, and nothing panics.
pub fn print_out(text: &str) -> io::Result<()> {
    write_out(&mut io::stdout().lock(), text)
}

/// [`print_out`] to any writer.
fn write_out(out: &mut impl Write, text: &str) -> io::Result<()> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Runs `future` on a small runtime of its own (netlink, the Kubernetes
/// client).
fn block_on<F: std::future::Future>(future: F) -> anyhow::Result<F::Output> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("starting the async runtime: {e}"))?;
    Ok(runtime.block_on(future))
}

/// Seconds since the epoch.
fn now_unix_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

use crate::dataplane::flows::expiry::monotonic_ns;

fn to_json<T: serde::Serialize>(value: &T) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(value)? + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe whose reader took `room` bytes and left.
    struct ClosedAfter {
        room: usize,
        taken: Vec<u8>,
    }

    impl Write for ClosedAfter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::Error::from(io::ErrorKind::BrokenPipe));
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            self.taken.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_reader_that_left_ends_the_output_quietly() {
        let mut pipe = ClosedAfter {
            room: 6,
            taken: Vec::new(),
        };
        write_out(&mut pipe, "line 1\nline 2\n").expect("EPIPE is a normal end");
        assert_eq!(pipe.taken, b"line 1\n"[..6]);
        let mut full = ClosedAfter {
            room: usize::MAX,
            taken: Vec::new(),
        };
        write_out(&mut full, "all\n").expect("write");
        assert_eq!(full.taken, b"all\n");
    }

    /// Any other write error still fails the command.
    #[test]
    fn other_write_errors_are_errors() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let err = write_out(&mut Full, "x").expect_err("ENOSPC");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    }
}
