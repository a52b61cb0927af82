//! The agent's last phase, once the programs took over: it serves until
//! told to stop, following the source, the interfaces, the repair tick and
//! `switchboard verify`'s questions, one at a time.
use std::{path::Path, time::Duration};

use anyhow::{bail, Context as _};
use futures::{FutureExt as _, StreamExt as _};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};
use tracing::{error, info};

use crate::{
    agent::attach::DataPath,
    agent::config::AgentConfig,
    agent::heal::Healer,
    agent::links::{node_ipv4s, Links},
    agent::listen::Netlink,
    agent::load::has_ipv6_service,
    agent::lock::LockedPinRoot,
    agent::syncloop::SyncLoop,
    dataplane::maps::PinnedMaps,
    observe::health::Serving,
    observe::trace::hub as trace,
    observe::verify,
    source::FeedRx,
    sync::store::Ipv6Tables,
};

/// How often interfaces are listed again in case a netlink event was missed.
const RESCAN: Duration = Duration::from_secs(2);

/// Everything the agent serves with. Fields drop in order, the lock last.
pub(super) struct Serve<'a> {
    pub config: &'a AgentConfig,
    pub feed: FeedRx,
    pub sync: SyncLoop<'a, PinnedMaps>,
    pub datapath: DataPath,
    pub netlink: Netlink,
    /// The server of `/healthz` and `/livez`, kept to the end.
    pub _healthz: Option<Serving>,
    pub locked: LockedPinRoot,
}

/// What the loop does after a batch of changes.
#[derive(PartialEq, Eq)]
enum Next {
    Serve,
    /// Start again in place, to grow the IPv6 flow tables.
    Restart,
}

impl Serve<'_> {
    /// Serves until SIGTERM or SIGINT, then leaves the programs attached
    /// and the maps pinned: traffic keeps flowing until the next agent
    /// adopts them. Fails when the source stops (what is programmed stays
    /// in place); returns only if exec fails when the first IPv6 Service
    /// restarts the agent in place.
    pub(super) async fn run(mut self) -> anyhow::Result<()> {
        let mut terminate =
            signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
        let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
        let mut tick = tokio::time::interval(RESCAN);
        let mut healer = Healer::new(
            self.config.repair_interval,
            &self.config.pin_root,
            self.datapath.config,
        );
        healer.record_pins();
        let mut links = Links {
            handle: &self.netlink.handle,
            attacher: &mut self.datapath.attacher,
            uplinks: &mut self.datapath.uplinks,
            ebpf: &mut self.datapath.ebpf,
        };
        let (_verify_socket, mut verify_requests) =
            serve_verify(&self.config.pin_root, self.datapath.traces)?;
        let sync = &mut self.sync;
        loop {
            tokio::select! {
                changed = self.feed.changed() => {
                    if changed.is_err() {
                        error!("the source stopped; what is programmed stays in place");
                        bail!("source stopped");
                    }
                    let ipv6 = self.datapath.ipv6;
                    if on_changes(&mut self.feed, sync, &mut links, ipv6).await == Next::Restart {
                        drop(self.locked);
                        return Err(restart_in_place());
                    }
                }
                Some(_) = self.netlink.events.next() => {
                    // One pass for a burst of events (a pod or an uplink
                    // coming up sends several).
                    while let Some(Some(_)) = self.netlink.events.next().now_or_never() {}
                    links.follow(sync).await;
                    healer.programs(&mut links, sync).await;
                }
                _ = tick.tick() => {
                    links.follow(sync).await;
                    healer.programs(&mut links, sync).await;
                    healer.check(&mut links, sync);
                }
                Some(request) = verify_requests.recv() => {
                    let uplinks = uplink_findings(&links, sync);
                    // The client may have given up; nothing to do then.
                    let _ = request.reply.send(sync.verify(uplinks));
                }
                _ = terminate.recv() => break,
                _ = interrupt.recv() => break,
            }
        }
        info!("agent stopping; programs and maps stay in place");
        drop(self.locked);
        Ok(())
    }
}

/// Opens the socket `switchboard verify` asks on, next to the status
/// file; the loop answers between syncs, and streams `switchboard trace`
/// from `traces`.
fn serve_verify(
    pin_root: &Path,
    traces: trace::Handle,
) -> anyhow::Result<(verify::SocketGuard, mpsc::Receiver<verify::Request>)> {
    verify::serve(pin_root, traces)
        .with_context(|| format!("listening on {}", verify::socket_path(pin_root).display()))
}

/// Syncs the source's changes since the last batch. The Node's addresses
/// name the uplinks and their source-NAT addresses: a change to them is
/// followed at once. The node's first IPv6 Service, while the IPv6 flow
/// tables are small ([`Ipv6Tables::Idle`]), is programmed (it answers with
/// the small tables meanwhile) and then asks for a restart that grows them.
async fn on_changes(
    feed: &mut FeedRx,
    sync: &mut SyncLoop<'_, PinnedMaps>,
    links: &mut Links<'_>,
    ipv6: Ipv6Tables,
) -> Next {
    let node_addrs = node_ipv4s(sync.source_node.as_ref());
    let changes = feed.take();
    let first_ipv6 = ipv6 == Ipv6Tables::Idle && has_ipv6_service(&changes);
    sync.on_changes(changes);
    if first_ipv6 {
        info!("the first IPv6 Service appeared: restarting in place to grow the IPv6 flow tables online");
        return Next::Restart;
    }
    if node_ipv4s(sync.source_node.as_ref()) != node_addrs {
        links.follow(sync).await;
    }
    Next::Serve
}

/// Replaces this process with a fresh start of the same binary and
/// arguments (same pid: a supervisor sees no exit). The start is the
/// ordinary one: it adopts the pinned maps, finds the IPv6 Service in its
/// first view, and resizes the IPv6 flow tables online
/// ([`crate::dataplane::pins::resize`]) while the attached programs keep
/// forwarding. Every descriptor this process holds is close-on-exec (the
/// lock, the maps, the sockets), so nothing of this run stays. Returns only
/// when the exec failed.
fn restart_in_place() -> anyhow::Error {
    use std::os::unix::process::CommandExt as _;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "switchboard".into());
    let error = std::process::Command::new("/proc/self/exe")
        .arg0(arg0)
        .args(args)
        .exec();
    anyhow::Error::from(error).context("restarting the agent in place to grow the IPv6 tables")
}

/// `switchboard verify`'s findings about the uplink maps: the entries that
/// differ from what this agent wrote, compared as the drift repair does.
fn uplink_findings(links: &Links<'_>, sync: &SyncLoop<'_, PinnedMaps>) -> Vec<String> {
    match links.uplinks.maps_drift(links.ebpf, sync.syncer.store()) {
        Ok(drift) => drift.map(|d| d.findings()).unwrap_or_default(),
        Err(error) => {
            let error = anyhow::Error::from(error);
            vec![format!("the uplink maps could not be read: {error:#}")]
        }
    }
}
