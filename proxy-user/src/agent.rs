//! `switchboard agent`: load and pin the programs, attach them to pod
//! interfaces as they appear, and keep the maps in step with the source.
//!
//! [`run`] is the start, phase by phase, each in a file of its own: `lock`,
//! `listen`, `load` (while `firstview` reads the source), `firstsync`,
//! `attach`, then `serve` until the agent is told to stop.
mod attach;
mod config;
mod firstsync;
mod firstview;
mod heal;
mod links;
mod listen;
mod load;
mod lock;
mod preload;
mod serve;
pub mod syncloop;
pub mod uplinks;

use tracing::info;

pub use crate::agent::config::{AgentConfig, Source};
use crate::agent::{load::Load, serve::Serve};

/// Logged once the programs have taken over, after the first sync (tests
/// and scripts wait for it).
pub const READY: &str = "ready: the programs took over";

/// Runs the agent, phase by phase. The start is ordered so that one that
/// fails leaves the data path as it was:
/// 1. lock: the pin root checked (one refused is left untouched) and
///    locked;
/// 2. listen: `/healthz` answers and netlink events are followed;
/// 3. load and first view: the object loads (maps created or adopted,
///    nothing written) while the source reads its first complete view;
///    the load is undone if the source fails, and done again if that view
///    sizes the maps otherwise;
/// 4. first sync: the maps get the source's view;
/// 5. attach: only then do the programs take over (tail calls, pod
///    interfaces, uplinks, socket layer);
/// 6. serve, until told to stop.
///
/// A first start on a pin root that fails takes away what it pinned.
/// `object` is the compiled programs (the binary embeds them from
/// `proxy-object`).
pub async fn run(config: AgentConfig, object: &'static [u8]) -> anyhow::Result<()> {
    let mut locked = lock::lock_pin_root(&config.pin_root)?;
    let listening = listen::listen(&config).await?;
    let load = Load::start(object, &config);
    let view = match firstview::read(&config, &listening.health).await {
        Ok(view) => view,
        Err(error) => return Err(load.abandon(error)),
    };
    let (loaded, syncer) = load.finish(object, &config, &locked, &view.changes)?;
    let mut sync = firstsync::sync_loop(
        &config,
        syncer,
        loaded.checksums,
        listening.health,
        listening.observer,
    );
    firstsync::first_sync(&mut sync, &listening.netlink.handle, view.changes).await;
    let datapath = attach::take_over(
        &config,
        loaded,
        &mut sync,
        &listening.netlink.handle,
        &listening.named_uplinks,
    )
    .await?;
    locked.start_succeeded();
    info!(
        interfaces = datapath.attacher.attached(),
        uplinks = datapath.uplinks.indices().len(),
        "{READY}"
    );
    Serve {
        config: &config,
        feed: view.feed,
        sync,
        datapath,
        netlink: listening.netlink,
        _healthz: listening.healthz,
        locked,
    }
    .run()
    .await
}
