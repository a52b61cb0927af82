//! The start's attach phase: the maps hold the source's view, so the
//! programs take over, in an order that never has a program read what is
//! not there yet: the tail calls, the pod interfaces, the uplinks and the
//! socket layer; then any resize is finished (the new maps pinned once the
//! entries written meanwhile are copied), and the services that read the
//! maps (`/metrics`, the connection-tracking collector, the trace) start.
use std::path::Path;

use anyhow::Context as _;
use aya::Ebpf;
use proxy_common::Config;
use tracing::{info, warn};

use crate::{
    agent::config::AgentConfig,
    agent::links::{node_ipv4s, rescan},
    agent::load::Loaded,
    agent::syncloop::SyncLoop,
    agent::uplinks::Uplinks,
    dataplane::attach::pods::Attacher,
    dataplane::attach::uplink::Uplink,
    dataplane::{
        attach::socket_layer, flows::expiry, flows::open_counts, load::object, maps::PinnedMaps,
        pins::memory, pins::resize,
    },
    observe::health::Serving,
    observe::metrics,
    observe::trace::hub as trace,
    sync::store::Ipv6Tables,
};

/// The data path as the agent keeps it once the programs took over.
pub(super) struct DataPath {
    pub ebpf: Ebpf,
    /// The pod interfaces the tc programs are attached to.
    pub attacher: Attacher,
    pub uplinks: Uplinks,
    /// The data-path configuration the maps hold (drift repair puts it
    /// back).
    pub config: Config,
    /// How big the IPv6 flow tables are (the first IPv6 Service grows them).
    pub ipv6: Ipv6Tables,
    /// The live trace's reader, for the verify socket.
    pub traces: trace::Handle,
    /// The server of `/metrics` (`None` without `--metrics-bind-address`);
    /// it answers for as long as this is held.
    pub _metrics: Option<Serving>,
}

/// The log line with the maps' kernel memory.
pub const MAP_MEMORY: &str = "the maps' kernel memory";

/// The programs take over from `loaded`, in the module doc's order (a
/// failure ends the start: a first start's pins are then removed, see
/// `lock`). `netlink` lists the interfaces; `named_uplinks` are
/// the `--uplink` interfaces found at the start.
pub(super) async fn take_over(
    config: &AgentConfig,
    loaded: Loaded,
    sync: &mut SyncLoop<'_, PinnedMaps>,
    netlink: &rtnetlink::Handle,
    named_uplinks: &[Uplink],
) -> anyhow::Result<DataPath> {
    let Loaded {
        mut ebpf,
        resize,
        capacities,
        datapath_config,
        ..
    } = loaded;
    object::install_tail_calls(&mut ebpf).context("installing the tail-call program")?;
    let (attacher, uplinks) =
        attach_interfaces(config, &mut ebpf, sync, netlink, named_uplinks).await?;
    attach_socket_layer(config, &mut ebpf)?;
    finish_resize(resize)?;
    // After any resize: what the pins hold now is what the programs use.
    log_map_memory(&config.pin_root, capacities.ipv6);
    let gc_metrics = expiry::GcMetrics::default();
    // /metrics reads the maps through pins of its own, at each scrape.
    let metrics = config
        .metrics_bind
        .map(|addr| metrics::serve(addr, sync.observer.metrics(), &gc_metrics, &config.pin_root))
        .transpose()?;
    sync.set_interfaces(attacher.interfaces(), &uplinks.statuses());
    // After any resize: the collector opens the pin the programs use.
    let open_flows =
        open_counts::LeastConnMaps::take(&mut ebpf).context("least-connection's maps")?;
    expiry::spawn(
        &config.pin_root,
        config.conntrack_timeouts,
        gc_metrics,
        open_flows,
        attacher.quiet_candidates(),
    )
    .context("starting the connection-tracking collector")?;
    // `switchboard trace` streams from the verify socket (see `serve`).
    let traces = trace::TraceMaps::take(&mut ebpf).context("the trace's maps")?;
    let traces = trace::spawn(traces, &config.pin_root).context("starting the trace's reader")?;
    Ok(DataPath {
        ebpf,
        attacher,
        uplinks,
        config: datapath_config,
        ipv6: capacities.ipv6,
        traces,
        _metrics: metrics,
    })
}

/// Attaches the tc programs to the pod interfaces and the uplink programs
/// to the uplinks, then starts the quiet marks. An uplink is never marked
/// as a pod interface: the named ones are set aside before the first scan,
/// and a second scan forgets those found after it. Fails when an uplink
/// cannot be set up.
async fn attach_interfaces(
    config: &AgentConfig,
    ebpf: &mut Ebpf,
    sync: &mut SyncLoop<'_, PinnedMaps>,
    netlink: &rtnetlink::Handle,
    named_uplinks: &[Uplink],
) -> anyhow::Result<(Attacher, Uplinks)> {
    let mut attacher = Attacher::new(config.tc_mode, &config.pin_root);
    // Named uplinks are no pod interfaces, even when they are veths.
    attacher.set_uplinks(named_uplinks.iter().map(|u| u.index).collect());
    rescan(netlink, &mut attacher, ebpf).await;
    let mut uplinks = Uplinks::new(
        config.uplinks.clone(),
        config.xdp_mode,
        config.tc_mode,
        config.nodeport_mode,
        &config.pin_root,
    );
    let started = uplinks
        .refresh(
            netlink,
            &node_ipv4s(sync.source_node.as_ref()),
            ebpf,
            sync.syncer.store_mut(),
        )
        .await
        .context("setting up the uplinks")?;
    if let Some(failure) = started.failures.into_iter().next() {
        return Err(anyhow::Error::from(failure).context("setting up the uplinks"));
    }
    attacher.set_uplinks(uplinks.indices());
    // An uplink found just now is no pod interface (a veth uplink looks
    // like one): the attacher forgets it before the quiet marks.
    rescan(netlink, &mut attacher, ebpf).await;
    attacher.start_marking();
    Ok((attacher, uplinks))
}

/// Attaches the socket-layer programs to `--socket-lb`'s cgroup, or, with
/// the socket layer off, detaches what an earlier agent attached.
fn attach_socket_layer(config: &AgentConfig, ebpf: &mut Ebpf) -> anyhow::Result<()> {
    match &config.socket_lb_cgroup {
        Some(cgroup) => {
            socket_layer::attach(ebpf, cgroup, &config.pin_root, config.socket_lb_scope)
                .context("attaching the socket layer (--socket-lb=false turns it off)")?
        }
        None => {
            socket_layer::detach(&config.pin_root).context("detaching the socket layer")?;
        }
    }
    Ok(())
}

/// Finishes a resize under way: what the old programs created between the
/// first copy and the swap is copied, then the new maps are pinned.
fn finish_resize(resize: resize::Resize) -> anyhow::Result<()> {
    if resize.maps().is_empty() {
        return Ok(());
    }
    let late = resize
        .copy(false)
        .context("copying what changed during the resize")?;
    info!(?late, "entries created during the resize copied");
    resize.finish().context("pinning the resized maps")
}

/// Logs the pinned maps' kernel memory (the benchmark reads this line).
fn log_map_memory(pin_root: &Path, ipv6: Ipv6Tables) {
    match memory::map_memory(pin_root) {
        Ok(maps) => {
            let (kernel, kernel6) = memory::totals(&maps);
            info!(
                maps_kernel_mib = kernel as f64 / 1_048_576.0,
                ipv6_maps_kernel_mib = kernel6 as f64 / 1_048_576.0,
                ipv6_flow_tables = ?ipv6,
                "{MAP_MEMORY}"
            );
        }
        Err(error) => {
            let error = format!("{:#}", anyhow::Error::from(error));
            warn!(%error, "the maps' kernel memory could not be read");
        }
    }
}
