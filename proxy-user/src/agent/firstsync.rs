//! The start's first sync: the sync loop built around the syncer, and the
//! source's first view written into the maps. The programs attached by an
//! earlier agent keep forwarding meanwhile; new ones take over only after
//! this (see `attach`), so they never read maps without the source's view.
use tracing::info;

use crate::{
    agent::config::{AgentConfig, Source},
    agent::syncloop::{unix_now, NodePortAddresses, SyncLoop},
    dataplane::{load::ip_summed, maps::PinnedMaps},
    model::Model,
    observe::health::ProxyHealth,
    observe::healthcheck::{self, HealthServers},
    observe::metrics::SyncObserver,
    observe::status::{self, AgentStatus},
    source::Changes,
    sync::Syncer,
    util::heap,
};

/// The sync loop around `syncer`, reporting to `health` and `observer`;
/// `checksums` is how the loaded programs update L4 checksums (the status
/// file says).
pub(super) fn sync_loop(
    config: &AgentConfig,
    syncer: Syncer<PinnedMaps>,
    checksums: ip_summed::Access,
    proxy_health: ProxyHealth,
    observer: SyncObserver,
) -> SyncLoop<'_, PinnedMaps> {
    let mut model = Model::new(None, config.proxy_name.clone());
    model.set_max_endpoints_per_port(config.max_endpoints_per_service);
    SyncLoop {
        syncer,
        model,
        pin_root: &config.pin_root,
        last_failed: Vec::new(),
        socket_cgroup: config.socket_lb_cgroup.clone(),
        health: HealthServers::new(&healthcheck::DEFAULT_BINDS),
        health_frontends: Default::default(),
        nodeports: NodePortAddresses {
            node_name: config.node_name.clone(),
            cidrs: config.nodeport_addresses.clone(),
            local: Vec::new(),
        },
        source_node: None,
        status: AgentStatus {
            l4_checksums: checksums.describe(),
            ..status_template(config)
        },
        proxy_health,
        observer,
        churned: 0,
    }
}

/// Writes the source's first view (`changes`) into the maps, with the
/// addresses `--nodeport-addresses` selects from listed first.
pub(super) async fn first_sync(
    sync: &mut SyncLoop<'_, PinnedMaps>,
    netlink: &rtnetlink::Handle,
    changes: Changes,
) {
    sync.nodeports.refresh(netlink).await;
    info!(
        objects = changes.len(),
        heap_mib = heap::heap().live_mib(),
        "first view of the source"
    );
    sync.on_changes(changes);
}

/// What the status file says of this agent whatever the sync does.
fn status_template(config: &AgentConfig) -> AgentStatus {
    let bind = |b: Option<std::net::SocketAddr>| b.map(|a| a.to_string()).unwrap_or_default();
    AgentStatus {
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_unix_s: unix_now(),
        source: match &config.source {
            Source::Dir(dir) => format!("dir:{}", dir.display()),
            Source::Cluster => "cluster".to_owned(),
        },
        kubeconfig: config.kubeconfig.as_ref().map(|p| p.display().to_string()),
        node_name: config.node_name.clone(),
        proxy_name: config.proxy_name.clone(),
        lb_algorithm: value_name(&config.lb_algorithm),
        nodeport_mode: value_name(&config.nodeport_mode),
        max_endpoints_per_service: Some(config.max_endpoints_per_service),
        socket_lb_cgroup: config
            .socket_lb_cgroup
            .as_ref()
            .map(|p| p.display().to_string()),
        healthz_bind: bind(config.healthz_bind),
        metrics_bind: bind(config.metrics_bind),
        conntrack_timeouts: config.conntrack_timeouts,
        repairs: status::Repairs {
            enabled: !config.repair_interval.is_zero(),
            ..status::Repairs::default()
        },
        ..AgentStatus::default()
    }
}

/// A flag value as it is spelled on the command line.
fn value_name(value: &impl clap::ValueEnum) -> String {
    value
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}
