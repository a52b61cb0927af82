//! The start's second phase: what the agent answers and follows from its
//! start on, before the source has said anything: `/healthz` and `/livez`,
//! the sync's metrics, and this namespace's netlink events.
use anyhow::Context as _;
use netlink_sys::{AsyncSocket as _, SocketAddr};

use crate::{
    agent::config::AgentConfig,
    agent::links::netlink_groups,
    dataplane::attach::uplink::{self, Uplink},
    observe::health::{self, ProxyHealth, Serving},
    observe::metrics::SyncObserver,
};

/// The link, address and route events the agent subscribed to.
pub(super) type LinkEvents = futures::channel::mpsc::UnboundedReceiver<(
    rtnetlink::packet_core::NetlinkMessage<rtnetlink::packet_route::RouteNetlinkMessage>,
    SocketAddr,
)>;

/// What answers and listens from the start.
pub(super) struct Listening {
    /// `/healthz` and `/livez`: the start counts as a queued change (see
    /// `health`) until the first sync.
    pub health: ProxyHealth,
    /// The server of `/healthz` and `/livez` (`None` without
    /// `--healthz-bind-address`); it answers for as long as this is held.
    pub healthz: Option<Serving>,
    /// The sync's metrics, counted from this start.
    pub observer: SyncObserver,
    pub netlink: Netlink,
    /// The uplinks `--uplink` names that exist now; the others are waited
    /// for (see `uplinks`).
    pub named_uplinks: Vec<Uplink>,
}

/// The netlink connection: requests, and the events subscribed to.
pub(super) struct Netlink {
    pub handle: rtnetlink::Handle,
    pub events: LinkEvents,
}

/// Starts answering `/healthz` and `/livez` (while the source lists) and
/// following netlink events, and finds the named uplinks.
pub(super) async fn listen(config: &AgentConfig) -> anyhow::Result<Listening> {
    let health = ProxyHealth::new(health::HEALTH_TIMEOUT);
    let healthz = config
        .healthz_bind
        .map(|addr| health.serve(addr))
        .transpose()?;
    let observer = SyncObserver::new(std::time::SystemTime::now());
    let netlink = subscribe(&config.uplinks)?;
    let named_uplinks = match config.uplinks.is_empty() {
        true => Vec::new(),
        false => {
            uplink::resolve(&netlink.handle, &config.uplinks, &[])
                .await
                .context("finding the uplinks (--uplink)")?
                .uplinks
        }
    };
    Ok(Listening {
        health,
        healthz,
        observer,
        netlink,
        named_uplinks,
    })
}

/// Opens the netlink connection, subscribed to the groups the agent
/// follows (see [`netlink_groups`]), and runs it on the runtime.
fn subscribe(named_uplinks: &[String]) -> anyhow::Result<Netlink> {
    let (mut connection, handle, events) =
        rtnetlink::new_connection().context("opening a netlink socket")?;
    connection
        .socket_mut()
        .socket_mut()
        .bind(&SocketAddr::new(0, netlink_groups(named_uplinks)))
        .context("subscribing to link, address and route events")?;
    tokio::spawn(connection);
    Ok(Netlink { handle, events })
}
