//! The agent's sync loop: changes from the source into the incremental
//! model, the frontends the model says changed into the maps, and the
//! status file, health and metrics kept up to date.
//!
//! One change costs what it touches: the model recomputes the Services the
//! changed objects belong to, and the sync compares only the frontends whose
//! desired state changed (plus any that failed before). The loop runs in the
//! agent's main future, which the runtime drives on the thread that called
//! `block_on` (see `main.rs`), not on a worker: the source watches, `/healthz`,
//! `/metrics` and the healthCheckNodePort servers run on the workers and are
//! never held up by a sync.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime};

use tracing::{error, info, warn};

use crate::{
    dataplane::attach::uplink,
    dataplane::{attach::pod_netns, flows::udp_sockets},
    model::cidr::IpCidr,
    model::{self, FrontendAddr, Model, ModelDelta, NodeInfo, ObjectKind},
    observe::health::ProxyHealth,
    observe::healthcheck::HealthServers,
    observe::metrics::{SliceSynced, SyncObserver},
    observe::status::{self, AgentStatus, RejectedObject, UnprogrammedService},
    observe::verify,
    source::Changes,
    sync::store::MapStore,
    sync::{SyncReport, Syncer, Unprogrammed},
    util::heap,
};

/// The heap (see [`heap::heap`]) when a batch of changes arrived, and once
/// the model's inputs held them (the batch dropped).
#[derive(Clone, Copy)]
struct HeapBefore {
    changes: heap::Heap,
    inputs: heap::Heap,
}

impl HeapBefore {
    fn now() -> HeapBefore {
        let heap = heap::heap();
        HeapBefore {
            changes: heap,
            inputs: heap,
        }
    }
}

/// The heap at each step of one sync, logged with it: where the bytes go.
struct HeapSteps {
    before: HeapBefore,
    /// After the model's update (its desired state).
    model: heap::Heap,
    /// After the maps were written (the sync's mirror of them).
    synced: heap::Heap,
}

pub struct SyncLoop<'a, S: MapStore> {
    pub syncer: Syncer<S>,
    pub model: Model,
    pub pin_root: &'a Path,
    /// Logged once when they appear, not again on every sync.
    pub last_failed: Vec<Unprogrammed>,
    /// The socket layer's cgroup, when it is on: connected UDP sockets whose
    /// backend left are closed, the node's and those of the namespaces of
    /// the processes in it (pods).
    pub socket_cgroup: Option<PathBuf>,
    /// The healthCheckNodePort servers (tasks on the agent's runtime).
    pub health: HealthServers,
    /// Frontends with a healthCheckNodePort: a change to one of them (or a
    /// new one) updates the servers; other changes leave them alone.
    pub health_frontends: BTreeSet<FrontendAddr>,
    /// `--nodeport-addresses` and the addresses it selects from.
    pub nodeports: NodePortAddresses,
    /// This node as the source last said (before `--nodeport-addresses`).
    pub source_node: Option<NodeInfo>,
    /// The status file's fields that do not come from the sync.
    pub status: AgentStatus,
    /// `/healthz` and `/livez`: changes queued and synced, node eligibility.
    pub proxy_health: ProxyHealth,
    /// `/metrics`: sync duration, programming latency, last sync.
    pub observer: SyncObserver,
    /// Services recomputed since memory was last trimmed.
    pub churned: usize,
}

/// Free memory is handed back to the kernel once this many Services have
/// been recomputed (a start, a relist, a burst); see [`heap::trim`].
const TRIM_AFTER_SERVICES: usize = 1000;

/// Where NodePorts are served under `--nodeport-addresses`.
pub struct NodePortAddresses {
    pub node_name: String,
    pub cidrs: Vec<IpCidr>,
    /// This namespace's interface addresses (both families), as last listed.
    pub local: Vec<std::net::IpAddr>,
}

impl NodePortAddresses {
    /// Lists the interface addresses again; true if they changed.
    pub async fn refresh(&mut self, handle: &rtnetlink::Handle) -> bool {
        if self.cidrs.is_empty() {
            return false;
        }
        match uplink::local_addresses(handle).await {
            Ok(local) if local != self.local => {
                self.local = local;
                true
            }
            Ok(_) => false,
            Err(error) => {
                warn!(error = %anyhow::Error::from(error), "listing addresses for --nodeport-addresses failed");
                false
            }
        }
    }

    /// The node the model sees: with `--nodeport-addresses`, its addresses
    /// are the interface addresses within the blocks.
    pub fn apply(&self, node: Option<&NodeInfo>) -> Option<NodeInfo> {
        if self.cidrs.is_empty() {
            return node.cloned();
        }
        let mut node = node.cloned().unwrap_or_else(|| NodeInfo {
            name: self.node_name.clone(),
            ..NodeInfo::default()
        });
        node.addresses = self
            .local
            .iter()
            .copied()
            .filter(|a| self.cidrs.iter().any(|c| c.contains(*a)))
            .collect();
        Some(node)
    }
}

impl<S: MapStore> SyncLoop<'_, S> {
    /// Records the attached interfaces; the status file is rewritten when
    /// they changed (no sync: the maps do not depend on them).
    pub fn set_interfaces(
        &mut self,
        pods: Vec<crate::dataplane::attach::pods::AttachedInterface>,
        uplinks: &[crate::dataplane::attach::pods::AttachedInterface],
    ) {
        let interfaces: Vec<_> = uplinks.iter().cloned().chain(pods).collect();
        if interfaces != self.status.interfaces {
            self.status.interfaces = interfaces;
            self.write_status();
        }
    }

    /// Compares the maps with the model's desired state (`switchboard
    /// verify`): the frontends, backends and reverse-NAT entries
    /// ([`verify::compare`]), every Maglev table as the drift repair
    /// compares them, and the uplink maps (`uplinks`: what differs there,
    /// as the repair found it). Called from the loop between syncs, so the
    /// maps and the model describe the same moment.
    pub fn verify(&mut self, uplinks: Vec<String>) -> verify::Verification {
        let started = Instant::now();
        let unprogrammed: verify::Unprogrammed = self
            .syncer
            .unprogrammed()
            .map(|u| (u.frontend, u.reason.clone()))
            .collect();
        let dump = self.syncer.store().dump();
        let mut verification = verify::compare(
            self.model.desired(),
            self.syncer.defaults(),
            &dump,
            &unprogrammed,
        );
        let desired = self.model.desired();
        for (frontend, detail) in self.syncer.maglev_problems() {
            verification.problems.push(verify::Problem {
                frontend: frontend.map(|f| f.to_string()).unwrap_or_default(),
                service: frontend
                    .and_then(|f| desired.frontends.get(&f))
                    .map(|f| f.service.to_string())
                    .unwrap_or_default(),
                kind: verify::ProblemKind::WrongMaglev,
                detail,
            });
        }
        verification
            .problems
            .extend(uplinks.into_iter().map(|detail| verify::Problem {
                frontend: String::new(),
                service: String::new(),
                kind: verify::ProblemKind::WrongUplink,
                detail,
            }));
        verification.problems.sort();
        info!(
            frontends = verification.frontends_desired,
            problems = verification.problems.len(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "verify: maps compared with the desired state"
        );
        verification
    }

    /// Records a repair of `kind` (`what`: what was wrong) in the status
    /// file and the metrics; the caller has logged it.
    pub fn repaired(&mut self, kind: &'static str, what: String) {
        let repairs = &mut self.status.repairs;
        repairs.count += 1;
        repairs.last = Some(status::Repair {
            unix_s: unix_now(),
            kind: kind.to_owned(),
            what,
        });
        self.observer.metrics().repaired(kind);
        self.write_status();
    }

    /// Records a look at the maps and pins that took `took`.
    pub fn drift_checked(&mut self, took: std::time::Duration) {
        self.observer.metrics().drift_checked(took);
        self.status.repairs.last_check_unix_s = unix_now();
        self.write_status();
    }

    /// Syncs with no change from the source: after a repair that needs
    /// every frontend compared again, the sync does that.
    pub fn sync_again(&mut self) {
        self.sync(&[], &[], None, HeapBefore::now());
    }

    /// Writes the status file the CLI reads.
    fn write_status(&mut self) {
        self.status.updated_unix_s = unix_now();
        if let Err(error) = status::write(self.pin_root, &self.status) {
            warn!(%error, path = %status::status_path(self.pin_root).display(), "writing the status file failed");
        }
    }

    /// Syncs again when `--nodeport-addresses` selects other addresses now.
    pub async fn on_addresses(&mut self, handle: &rtnetlink::Handle) {
        if self.nodeports.refresh(handle).await {
            let node = self.nodeports.apply(self.source_node.as_ref());
            info!(addresses = ?node.as_ref().map(|n| &n.addresses), "node addresses changed");
            self.proxy_health.queued();
            self.model.set_node(node);
            self.sync(&[], &[], None, HeapBefore::now());
        }
    }

    /// Applies what the source published and syncs what it changed.
    pub fn on_changes(&mut self, changes: Changes) {
        let at_changes = heap::heap();
        let mut slices = Vec::with_capacity(changes.slices.len());
        if let Some(node) = changes.node {
            self.proxy_health
                .set_node_eligible(!node.as_ref().is_some_and(|n| n.deleting));
            self.model.set_node(self.nodeports.apply(node.as_ref()));
            self.source_node = node;
        }
        if let Some(problems) = changes.problems {
            self.model.set_source_problems(problems);
        }
        for (key, info) in changes.services {
            self.model.set_service(key, info);
        }
        for (key, info) in changes.slices {
            slices.push(SliceSynced {
                key: key.clone(),
                trigger: info.as_ref().map(|s| s.trigger_time),
            });
            self.model.set_slice(key, info);
        }
        // The batch's maps went with their loops above.
        let seq = changes.seq;
        let before = HeapBefore {
            changes: at_changes,
            inputs: heap::heap(),
        };
        self.sync(&slices, &changes.arrivals, Some(seq), before);
    }

    /// Recomputes the model and writes what changed; `seq`: the source's
    /// publish this covers (for `/healthz`); `arrivals`: when its events
    /// were recorded.
    fn sync(
        &mut self,
        slices: &[SliceSynced],
        arrivals: &[Instant],
        seq: Option<u64>,
        before: HeapBefore,
    ) {
        let started = Instant::now();
        let delta = self.model.update();
        let model_time = started.elapsed();
        let model_heap = heap::heap();
        for warning in &delta.warnings_added {
            warn!(object = %warning.object, problem = %warning.problem, "input problem");
        }
        self.update_health_servers(&delta);
        let report = self
            .syncer
            .apply_changed(self.model.desired(), &delta.frontends);
        let heap = HeapSteps {
            before,
            model: model_heap,
            synced: heap::heap(),
        };
        self.log(&delta, &report, started, model_time, heap);
        if let Some(cgroup) = &self.socket_cgroup {
            if !report.udp_sockets_left.is_empty() {
                close_departed_udp_sockets(&report.udp_sockets_left, cgroup);
            }
        }
        self.observer.synced(
            started.elapsed(),
            slices,
            arrivals,
            report.failed.len(),
            SystemTime::now(),
        );
        match seq {
            Some(seq) => self.proxy_health.updated_change(seq),
            None => self.proxy_health.updated(),
        }
        self.record_status(&report, started);
        self.last_failed = report.failed;
        self.churned += delta.services;
        if self.churned >= TRIM_AFTER_SERVICES {
            self.churned = 0;
            heap::trim();
        }
    }

    /// The healthCheckNodePort servers follow the frontends that have one.
    fn update_health_servers(&mut self, delta: &ModelDelta) {
        let desired = self.model.desired();
        let mut touched = false;
        for addr in &delta.frontends {
            let has = desired
                .frontends
                .get(addr)
                .is_some_and(|f| f.health_check_node_port.is_some());
            if has {
                self.health_frontends.insert(*addr);
                touched = true;
            } else if self.health_frontends.remove(addr) {
                touched = true;
            }
        }
        if touched {
            self.health.update(desired);
        }
    }

    fn log(
        &self,
        delta: &ModelDelta,
        report: &SyncReport,
        started: Instant,
        model_time: std::time::Duration,
        heap: HeapSteps,
    ) {
        for failed in report
            .failed
            .iter()
            .filter(|f| !self.last_failed.contains(f))
        {
            error!(
                service = %failed.service,
                frontend = %failed.frontend,
                reason = %failed.reason,
                "service not programmed; everything else is"
            );
        }
        if report.added + report.updated + report.removed > 0 || !report.failed.is_empty() {
            info!(
                frontends = self.model.desired().frontends.len(),
                services_recomputed = delta.services,
                added = report.added,
                updated = report.updated,
                removed = report.removed,
                failed = report.failed.len(),
                writes = report.writes,
                conntrack_purged = report.conntrack_purged,
                model_ms = model_time.as_secs_f64() * 1e3,
                elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
                heap_changes_mib = heap.before.changes.live_mib(),
                heap_inputs_mib = heap.before.inputs.live_mib(),
                heap_model_mib = heap.model.live_mib(),
                heap_synced_mib = heap.synced.live_mib(),
                heap_peak_mib = heap.synced.peak_mib(),
                heap_blocks = heap.synced.blocks,
                "maps synced"
            );
        }
    }

    fn record_status(&mut self, report: &SyncReport, started: Instant) {
        self.status.last_sync_unix_s = unix_now();
        self.status.last_sync_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.status.frontends_desired = self.model.desired().frontends.len();
        self.status.unprogrammed = report
            .failed
            .iter()
            .map(|f| UnprogrammedService {
                service: f.service.clone(),
                frontend: f.frontend.to_string(),
                reason: f.reason.clone(),
            })
            .collect();
        self.status.warnings = self.model.warnings().map(ToString::to_string).collect();
        self.status.rejected = self
            .model
            .rejections()
            .map(|(kind, key, r)| RejectedObject {
                kind: kind.as_str().to_owned(),
                object: key.to_string(),
                service: match kind {
                    ObjectKind::Service => Some(key.to_string()),
                    ObjectKind::EndpointSlice => r.service.as_ref().map(ToString::to_string),
                },
                held: r.held,
                problems: r.problems.clone(),
            })
            .collect();
        self.write_status();
    }
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Closes the connected UDP sockets whose backend left, the node's and the
/// pods' (those in the namespaces of the processes in `cgroup`; see
/// [`udp_sockets`]); a failure is logged, the sync itself stands.
fn close_departed_udp_sockets(left: &[(u64, model::BackendAddr)], cgroup: &Path) {
    let doomed = left.iter().copied().collect();
    match udp_sockets::close_udp_sockets(&doomed, || pod_netns::of_cgroup(cgroup)) {
        Ok(closed) => {
            if closed.closed > 0 {
                info!(
                    closed = closed.closed,
                    "closed connected UDP sockets whose backend left"
                );
            }
            for (cookie, error) in closed.refused {
                warn!(
                    cookie,
                    ?error,
                    "the kernel refused to close a UDP socket whose backend left"
                );
            }
            if closed.unfound > 0 {
                warn!(
                    unfound = closed.unfound,
                    "connected UDP sockets whose backend left were found in no namespace searched (closed meanwhile, or a pod's the agent cannot see without the host's PID namespace)"
                );
            }
        }
        Err(error) => warn!(
            error = %anyhow::Error::from(error),
            "could not close UDP sockets whose backend left; they stay pinned to it until they close"
        ),
    }
}
