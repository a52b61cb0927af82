//! `switchboard agent`: load and pin the programs, attach them to pod
//! interfaces as they appear, and keep the maps in step with the source.
mod heal;
mod links;
mod preload;
pub mod syncloop;
pub mod uplinks;

use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Context as _};
use futures::{FutureExt as _, StreamExt as _};
use netlink_sys::{AsyncSocket as _, SocketAddr};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::watch,
};
use tracing::{debug, error, info, warn};

use crate::model::cidr::IpCidr;
use crate::{
    agent::links::{netlink_groups, node_ipv4s, rescan, Links},
    agent::preload::Preload,
    agent::syncloop::{unix_now, NodePortAddresses, SyncLoop},
    agent::uplinks::Uplinks,
    dataplane::attach::{Attacher, TcMode},
    dataplane::conntrack,
    dataplane::ebpf,
    dataplane::growth,
    dataplane::kmem,
    dataplane::maps::PinnedMaps,
    dataplane::migrate,
    dataplane::pinroot,
    dataplane::resize,
    dataplane::socketlb,
    dataplane::uplink::{self, XdpMode},
    model::{self, Model},
    node::health::{self, ProxyHealth},
    node::healthcheck::{self, HealthServers},
    node::lock,
    node::memory,
    node::metrics::{self, SyncObserver},
    node::status::{self, AgentStatus},
    node::verify,
    source::{self, cluster, dir, FeedRx},
    sync::store::Capacities,
    sync::Syncer,
};

/// Where the agent learns Services and EndpointSlices from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A directory of YAML manifests (standalone mode).
    Dir(PathBuf),
    /// The Kubernetes API server.
    Cluster,
}

impl std::str::FromStr for Source {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("dir", path)) if !path.is_empty() => Ok(Self::Dir(PathBuf::from(path))),
            None if s == "cluster" => Ok(Self::Cluster),
            _ => Err(format!(
                "unknown source {s:?}: expected dir:PATH or cluster"
            )),
        }
    }
}

pub struct AgentConfig {
    /// The connection-tracking timeouts (`--conntrack-*`).
    pub conntrack_timeouts: crate::dataplane::conntrack::Timeouts,
    pub source: Source,
    pub pin_root: PathBuf,
    pub capacities: Capacities,
    /// `--max-endpoints-per-service`.
    pub max_endpoints_per_service: u16,
    /// For the cluster source: a kubeconfig file instead of inference.
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (NodePort addresses, `Local` policies, topology).
    pub node_name: String,
    /// Our `service.kubernetes.io/service-proxy-name`; Services naming another
    /// proxy are skipped.
    pub proxy_name: Option<String>,
    /// The cgroup the socket-layer programs attach to; `None` turns the socket
    /// layer off (and removes what an earlier agent attached).
    pub socket_lb_cgroup: Option<PathBuf>,
    /// Whose sockets the socket layer balances.
    pub socket_lb_scope: socketlb::SocketScope,
    /// How the tc programs attach to pod interfaces.
    pub tc_mode: TcMode,
    /// `--repair-interval`: how often drift is looked for (zero: never
    /// repaired).
    pub repair_interval: Duration,
    /// `--uplink`: the interfaces traffic from outside arrives on (empty:
    /// found from the node's addresses or the default route).
    pub uplinks: Vec<String>,
    /// How the uplink program runs.
    pub xdp_mode: XdpMode,
    /// `--lb-algorithm`: for Services without the annotation.
    pub lb_algorithm: model::LbAlgorithm,
    /// `--nodeport-mode`: source NAT or direct server return.
    pub nodeport_mode: crate::dataplane::uplink::NodePortMode,
    /// `--nodeport-addresses`: NodePorts on the interface addresses in these
    /// blocks instead of the Node's addresses.
    pub nodeport_addresses: Vec<IpCidr>,
    /// `--healthz-bind-address`: `/healthz` and `/livez` (`None`: off).
    pub healthz_bind: Option<std::net::SocketAddr>,
    /// `--metrics-bind-address`: Prometheus `/metrics` (`None`: off).
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// `--watch-timeout`: how long each watch lasts, and so when a silent
    /// one is restarted.
    pub watch_timing: cluster::WatchTiming,
}

/// Logged once the programs have taken over, after the first sync (tests
/// and scripts wait for it).
pub const READY: &str = "ready: the programs took over";

/// How often interfaces are listed again in case a netlink event was missed.
const RESCAN: Duration = Duration::from_secs(2);

/// Runs the agent. The start is ordered so that one that fails leaves the
/// data path as it was: pin-root check, lock, capacity check, the source's
/// first complete view, loading (maps created or adopted, nothing written;
/// it runs while the source reads, and is undone if the source fails or
/// its first view sizes the maps otherwise), the first sync, and only then
/// the programs take over (tail calls, pod interfaces, uplinks, socket
/// layer). `object` is the compiled programs
/// (the binary embeds them from `proxy-object`).
pub async fn run(config: AgentConfig, object: &'static [u8]) -> anyhow::Result<()> {
    // Before the lock: a refused pin root leaves no lock file behind.
    ebpf::check_pin_root(&config.pin_root)?;
    // A newer version's pin root is refused before anything is touched.
    let format = pinroot::check_format(&config.pin_root)?;
    let lock = lock::acquire(&config.pin_root)?;
    // On a pin root with nothing pinned yet, a start that fails takes away
    // what it pinned.
    let mut first_start = FirstStart::new(&config.pin_root);
    // /healthz and /livez answer from here on, while the source lists: the
    // start counts as a queued change (see `health`).
    let proxy_health = ProxyHealth::new(health::HEALTH_TIMEOUT);
    let _healthz = config
        .healthz_bind
        .map(|addr| proxy_health.serve(addr))
        .transpose()?;
    let observer = SyncObserver::new(std::time::SystemTime::now());
    let (mut connection, handle, mut link_events) =
        rtnetlink::new_connection().context("opening a netlink socket")?;
    connection
        .socket_mut()
        .socket_mut()
        .bind(&SocketAddr::new(0, netlink_groups(&config.uplinks)))
        .context("subscribing to link, address and route events")?;
    tokio::spawn(connection);
    // Named uplinks that exist now; the others are waited for (see
    // `uplinks`).
    let named_uplinks = match config.uplinks.is_empty() {
        true => Vec::new(),
        false => {
            uplink::resolve(&handle, &config.uplinks, &[])
                .await
                .context("finding the uplinks (--uplink)")?
                .uplinks
        }
    };
    // The flow tables that grow are sized by what they hold: one half full
    // or more grows now (`growth`).
    let (flows, grown) = growth::plan(&config.pin_root, &config.capacities);
    for g in &grown {
        info!(map = g.map, from = g.from, to = g.to, entries = g.entries, "{}", growth::GROWING);
    }
    // Loading needs nothing from the source: it runs meanwhile.
    let preload = Preload::start(object, &config.pin_root, config.capacities, flows);
    let before_source = memory::heap();
    let mut feed = match open_source(&config).await {
        Ok(feed) => feed,
        Err(error) => {
            // The pin root as it was before the load.
            if let Some(preload) = preload {
                preload.abandon();
            }
            return Err(error);
        }
    };
    // What reading it freed (file text, list pages, the parse's own
    // allocations on every core) goes back to the kernel before the first
    // sync adds the model, the desired state and the map mirror: otherwise
    // it stays resident beside them and makes the start's peak.
    memory::trim();
    let source_read = memory::heap();
    info!(
        heap_before_mib = before_source.live_mib(),
        heap_mib = source_read.live_mib(),
        heap_peak_mib = source_read.peak_mib(),
        "the source's first view is read"
    );
    tokio::spawn(mark_queued(feed.publishes(), proxy_health.clone()));
    let initial = feed.take();
    let capacities = config.capacities;
    let (loaded, resize) = match preload.and_then(Preload::finish) {
        Some(loaded) => {
            // Loaded with these capacities and no pinned map of another size.
            let resize = resize::Resize::prepare(&config.pin_root, &[])
                .context("preparing to resize the pinned maps")?;
            (loaded.context("loading the eBPF programs")?, resize)
        }
        None => {
            let mismatches = ebpf::capacity_mismatches(&config.pin_root, &capacities, &flows);
            for mismatch in &mismatches {
                info!(map = mismatch.map, "{mismatch}: resizing online");
            }
            let resize = resize::Resize::prepare(&config.pin_root, &mismatches)
                .context("preparing to resize the pinned maps")?;
            let ebpf = ebpf::load(object, &config.pin_root, &capacities, &flows, resize.maps())
                .context("loading the eBPF programs")?;
            (ebpf, resize)
        }
    };
    let ebpf::Loaded {
        mut ebpf,
        checksums,
    } = loaded;
    // The object is parsed and loaded; it is read again only by a restart.
    let released = memory::release(object);
    debug!(
        mib = released as f64 / 1_048_576.0,
        "the embedded eBPF object's pages handed back"
    );
    if pinroot::stamp(&config.pin_root).context("recording the pin root's format")? {
        info!(
            format = pinroot::FORMAT,
            previous = ?format,
            "pin root format recorded"
        );
    }
    if !resize.maps().is_empty() {
        let copied = resize
            .copy(true)
            .context("copying the maps being resized")?;
        info!(?copied, "resized maps filled from the pinned ones");
    }
    let mut maps = PinnedMaps::take(&mut ebpf).context("opening the maps")?;
    // An agent of an earlier layout ran: its flows come over (again after
    // the programs were replaced, for the flows it tracked meanwhile).
    for early in migrate::copy_flows(&config.pin_root, &mut maps) {
        match early {
            Ok(early) => info!(
                pin = early.pin,
                copied = early.copied,
                "flows copied from an earlier layout"
            ),
            Err(error) => {
                let error = format!("{:#}", anyhow::Error::from(error));
                warn!(%error, "an earlier layout's pin was left alone");
            }
        }
    }
    let datapath_config =
        socketlb::datapath_config().context("reading the node's network namespace")?;
    maps.set_config(datapath_config)
        .context("writing the data-path configuration")?;
    let mut syncer = Syncer::adopt(maps, capacities);
    syncer.set_default_algorithm(config.lb_algorithm);
    syncer.set_direct_return(config.nodeport_mode == crate::dataplane::uplink::NodePortMode::Dsr);
    info!(
        pin_root = %config.pin_root.display(),
        lock = %lock.path().display(),
        adopted = syncer.programmed().count(),
        "maps loaded"
    );
    let gc_metrics = conntrack::GcMetrics::default();
    let mut sync = SyncLoop {
        syncer,
        model: {
            let mut model = Model::new(None, config.proxy_name.clone());
            model.set_max_endpoints_per_port(config.max_endpoints_per_service);
            model
        },
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
            ..status_template(&config)
        },
        proxy_health,
        observer,
        churned: 0,
    };
    sync.nodeports.refresh(&handle).await;
    info!(
        objects = initial.len(),
        heap_mib = memory::heap().live_mib(),
        "first view of the source"
    );
    sync.on_changes(initial);

    // The maps hold the source's view: the programs may take over.
    ebpf::install_tail_calls(&mut ebpf).context("installing the tail-call program")?;
    let mut attacher = Attacher::new(config.tc_mode, &config.pin_root);
    // Named uplinks are no pod interfaces, even when they are veths.
    attacher.set_uplinks(named_uplinks.iter().map(|u| u.index).collect());
    rescan(&handle, &mut attacher, &mut ebpf).await;
    let mut uplinks = Uplinks::new(
        config.uplinks.clone(),
        config.xdp_mode,
        config.tc_mode,
        config.nodeport_mode,
        &config.pin_root,
    );
    let started = uplinks
        .refresh(
            &handle,
            &node_ipv4s(sync.source_node.as_ref()),
            &mut ebpf,
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
    rescan(&handle, &mut attacher, &mut ebpf).await;
    attacher.start_marking();
    match &config.socket_lb_cgroup {
        Some(cgroup) => {
            socketlb::attach(&mut ebpf, cgroup, &config.pin_root, config.socket_lb_scope)
                .context("attaching the socket layer (--socket-lb=false turns it off)")?
        }
        None => {
            socketlb::detach(&config.pin_root).context("detaching the socket layer")?;
        }
    }
    if !resize.maps().is_empty() {
        // What the old programs created between the first copy and the swap.
        let late = resize
            .copy(false)
            .context("copying what changed during the resize")?;
        info!(?late, "entries created during the resize copied");
        resize.finish().context("pinning the resized maps")?;
    }
    // After any resize: what the pins hold now is what the programs use.
    log_map_memory(&config.pin_root);
    // /metrics reads the maps through pins of its own, at each scrape.
    let _metrics = config
        .metrics_bind
        .map(|addr| {
            let limits = growth::limits(&capacities);
            metrics::serve(addr, sync.observer.metrics(), &gc_metrics, &config.pin_root, limits)
        })
        .transpose()?;
    sync.set_interfaces(attacher.interfaces(), &uplinks.statuses());
    for migrated in migrate::finish(&config.pin_root, sync.syncer.store_mut()) {
        match migrated {
            Ok(m) => info!(
                pin = m.pin,
                copied = m.copied,
                "earlier layout migrated and unpinned"
            ),
            Err(error) => {
                let error = format!("{:#}", anyhow::Error::from(error));
                warn!(%error, "an earlier layout's pin was left alone");
            }
        }
    }
    // After any resize: the collector opens the pin the programs use.
    let open_flows = crate::dataplane::openflows::LeastConnMaps::take(&mut ebpf)
        .context("least-connection's maps")?;
    conntrack::spawn(
        &config.pin_root,
        config.conntrack_timeouts,
        gc_metrics,
        open_flows,
        attacher.quiet_candidates(),
    )
    .context("starting the connection-tracking collector")?;

    // `switchboard trace` streams from the verify socket (below).
    let traces = crate::node::trace::hub::TraceMaps::take(&mut ebpf).context("the trace's maps")?;
    let traces = crate::node::trace::hub::spawn(traces, &config.pin_root)
        .context("starting the trace's reader")?;
    first_start.succeeded();
    info!(
        interfaces = attacher.attached(),
        uplinks = uplinks.indices().len(),
        "{READY}"
    );
    let mut terminate = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut tick = tokio::time::interval(RESCAN);
    let mut healer = heal::Healer::new(config.repair_interval, &config.pin_root, datapath_config);
    healer.record_pins();
    let mut links = Links {
        handle: &handle,
        attacher: &mut attacher,
        uplinks: &mut uplinks,
        ebpf: &mut ebpf,
    };
    // `switchboard verify` asks on a socket next to the status file; the
    // loop answers between syncs.
    let (_verify_socket, mut verify_requests) = verify::serve(&config.pin_root, traces)
        .with_context(|| {
            format!(
                "listening on {}",
                verify::socket_path(&config.pin_root).display()
            )
        })?;
    let mut growth_due = growth::watch(&config.pin_root, &capacities)
        .context("starting the flow tables' occupancy check")?;
    loop {
        tokio::select! {
            changed = feed.changed() => {
                if changed.is_err() {
                    error!("the source stopped; what is programmed stays in place");
                    bail!("source stopped");
                }
                let node_addrs = node_ipv4s(sync.source_node.as_ref());
                sync.on_changes(feed.take());
                // The Node's addresses name the uplinks and their
                // source-NAT addresses: a change is followed at once.
                if node_ipv4s(sync.source_node.as_ref()) != node_addrs {
                    links.follow(&mut sync).await;
                }
            }
            Some(_) = link_events.next() => {
                // One pass for a burst of events (a pod or an uplink
                // coming up sends several).
                while let Some(Some(_)) = link_events.next().now_or_never() {}
                links.follow(&mut sync).await;
                healer.programs(&mut links, &mut sync).await;
            }
            _ = tick.tick() => {
                links.follow(&mut sync).await;
                healer.programs(&mut links, &mut sync).await;
                healer.check(&mut sync);
            }
            Some(due) = growth_due.recv() => {
                // The restart's start grows it online (`growth::plan`).
                info!(map = due.map, size = due.size, max = due.max, entries = due.entries, "{}", growth::DUE);
                drop(lock);
                return Err(restart_in_place());
            }
            Some(request) = verify_requests.recv() => {
                // The client may have given up; nothing to do then.
                let _ = request.reply.send(sync.verify());
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    // Programs stay attached and maps stay pinned: traffic keeps flowing until
    // the next agent adopts them.
    info!("agent stopping; programs and maps stay in place");
    drop(lock);
    Ok(())
}

/// Logs the pinned maps' kernel memory (the benchmark reads this line).
fn log_map_memory(pin_root: &std::path::Path) {
    match kmem::map_memory(pin_root) {
        Ok(maps) => {
            let (kernel, kernel6) = kmem::totals(&maps);
            info!(
                maps_kernel_mib = kernel as f64 / 1_048_576.0,
                ipv6_maps_kernel_mib = kernel6 as f64 / 1_048_576.0,
                "{MAP_MEMORY}"
            );
        }
        Err(error) => {
            let error = format!("{:#}", anyhow::Error::from(error));
            warn!(%error, "the maps' kernel memory could not be read");
        }
    }
}

/// The log line with the maps' kernel memory.
pub const MAP_MEMORY: &str = "the maps' kernel memory";

/// Replaces this process with a fresh start of the same binary and
/// arguments (same pid: a supervisor sees no exit). The start is the
/// ordinary one: it adopts the pinned maps, finds the flow table that is
/// half full ([`growth::plan`]), and grows it online
/// ([`crate::dataplane::resize`]) while the attached programs keep
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
    anyhow::Error::from(error).context("restarting the agent in place to grow a flow table")
}

/// The first start on a pin root (nothing of switchboard's pinned there):
/// if it fails, dropping this removes every pin it made (maps, links, the
/// format stamp) and the status file, so that the pin root is as it was.
/// A start on a pin root with pins leaves them: the data path they hold
/// keeps forwarding.
struct FirstStart {
    pin_root: PathBuf,
    /// Whether the pin root was empty and the start has not yet succeeded.
    armed: bool,
    /// Whether the status file was there before (then it stays).
    had_status: bool,
}

impl FirstStart {
    fn new(pin_root: &std::path::Path) -> Self {
        let ours = |dir: &std::path::Path, all: bool| {
            std::fs::read_dir(dir).map_or(0, |entries| {
                entries
                    .flatten()
                    .filter(|e| all || e.file_name().to_string_lossy().starts_with("SB_"))
                    .count()
            })
        };
        Self {
            pin_root: pin_root.to_owned(),
            armed: ours(pin_root, false) == 0 && ours(&pin_root.join("links"), true) == 0,
            had_status: status::status_path(pin_root).exists(),
        }
    }

    fn succeeded(&mut self) {
        self.armed = false;
    }
}

impl Drop for FirstStart {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let removed = remove_pins(&self.pin_root);
        if !self.had_status {
            let _ = std::fs::remove_file(status::status_path(&self.pin_root));
        }
        if removed > 0 {
            warn!(removed, pin_root = %self.pin_root.display(), "the first start on this pin root failed: the pins it made are removed");
        }
    }
}

/// Removes the link pins (detaching their programs), the `links`
/// directory and every `SB_` pin under `pin_root`; returns how many pins
/// went. Failures are logged: this runs on the way out of a failed start.
fn remove_pins(pin_root: &std::path::Path) -> usize {
    let mut removed = 0;
    let mut remove = |path: &std::path::Path| match std::fs::remove_file(path) {
        Ok(()) => removed += 1,
        Err(error) => warn!(pin = %path.display(), %error, "could not remove a pin"),
    };
    let links = pin_root.join("links");
    for entry in std::fs::read_dir(&links).into_iter().flatten().flatten() {
        remove(&entry.path());
    }
    for entry in std::fs::read_dir(pin_root).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with("SB_") {
            remove(&entry.path());
        }
    }
    let _ = std::fs::remove_dir(&links);
    removed
}

/// Opens the source and waits for its first complete view. A source that
/// cannot be read (a bad kubeconfig, a missing directory) fails here, before
/// anything is loaded.
async fn open_source(config: &AgentConfig) -> anyhow::Result<FeedRx> {
    let (tx, mut rx) = source::feed();
    match &config.source {
        Source::Dir(dir) => dir::watch_dir(dir.clone(), config.node_name.clone(), tx)
            .await
            .with_context(|| format!("watching {}", dir.display()))?,
        Source::Cluster => {
            let client =
                cluster::client_with(config.kubeconfig.as_ref(), Some(config.watch_timing.idle()))
                    .await
                    .context("connecting to the Kubernetes API")?;
            info!(node = %config.node_name, "watching the Kubernetes API");
            cluster::watch_cluster(
                client,
                config.node_name.clone(),
                config.proxy_name.clone(),
                config.watch_timing,
                tx,
            );
        }
    }
    // The first view is published once complete (every watch has listed;
    // the directory has been read); until then, what is pinned keeps
    // forwarding untouched.
    rx.changed()
        .await
        .context("the source stopped before its first complete view")?;
    Ok(rx)
}

/// Marks every publish of the source as a queued change, as kube-proxy's
/// event handlers do, apart from the loop that syncs it: a loop that hangs
/// leaves the change queued and `/healthz` turns unhealthy.
async fn mark_queued(mut publishes: watch::Receiver<u64>, health: ProxyHealth) {
    while publishes.changed().await.is_ok() {
        let seq = *publishes.borrow_and_update();
        health.queued_change(seq);
    }
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
        flow_table_max: growth::limits(&config.capacities)
            .into_iter()
            .map(|(map, max)| (map.to_owned(), max))
            .collect(),
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
