//! Repairing what lies outside the agent: its programs on the interfaces
//! it manages and on the socket layer's cgroup, the maps' pins under the
//! pin root, the data path's configuration, and the entries of the maps it
//! writes. Someone with `tc`, `bpftool` or `rm` (or a bug elsewhere) may
//! take them away while the agent runs; it puts them back and says so.
//!
//! - Programs are looked at after every netlink event the agent follows
//!   (links, addresses, and the tc group: a qdisc or filter deleted) and
//!   at the 2 s rescan, with the same reading of the kernel `switchboard
//!   status` makes ([`hooks::inspect`], [`status::interface_rows`]), so
//!   the two tell the same story. An interface missing a program is
//!   attached again (a TCX link whose pin went, a netlink filter or the
//!   clsact qdisc deleted, an XDP link detached).
//! - The socket layer's links are looked at with the interfaces: a link
//!   whose pin was removed, or that was detached from the cgroup while its
//!   pin stayed (the link then names no cgroup), is attached again, the new
//!   link pinned over the old one.
//! - The maps, pins and configuration are looked at every
//!   `--repair-interval` (5 s), stretched to twenty times what the last
//!   look took (at most 5% of a core). The map entries are compared with
//!   what the sync remembers writing ([`crate::sync::heal`]): only the
//!   entries that differ are written, service and backend ids are kept, and
//!   connection tracking is left alone. The Maglev tables are compared a
//!   bounded share per look, going on where the last look stopped
//!   ([`crate::sync::heal::maglev`]); the uplink maps against what the agent
//!   last wrote for its uplinks.
//!
//! What the agent does not own is never removed: another program on the
//! same hook (an interface's, or the socket layer's cgroup's) is only named
//! in the log, and a pin holding another map is left where it is.
//!
//! Every repair is logged at warn level with what was wrong, counted in
//! `switchboard_repairs{kind}`, and recorded in the status file
//! (`switchboard status`: `Repairs:`).
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proxy_common::Config;
use tracing::{debug, info, warn};

use crate::{
    agent::{links::Links, syncloop::SyncLoop},
    cli::{hooks, status},
    dataplane::attach::pods::AttachedInterface,
    dataplane::attach::{linkinfo, socket_layer},
    dataplane::maps::PinnedMaps,
    observe::status::AgentStatus,
    sync::heal::{maglev, Finding},
    util::heap,
};

/// A comparison of at least this many entries (both sides) hands its
/// memory back to the kernel once done.
const TRIM_AFTER_ENTRIES: usize = 500_000;

/// A look at the maps may cost this fraction of the time between looks.
const CHECK_BUDGET: u32 = 20;
/// Findings logged one by one per repair (the rest are counted).
const FINDINGS_LOGGED: usize = 20;

/// An interface the agent manages that lacks some of its programs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramDrift {
    pub name: String,
    pub index: u32,
    /// `pod` or `uplink`.
    pub role: String,
    /// The hooks that are not attached, as the status file names them.
    pub missing: Vec<String>,
    /// What is attached there now.
    pub attached: String,
    /// Programs on the interface that are not switchboard's.
    pub foreign: Vec<String>,
}

/// The interfaces in `listed` (the agent's own, from its status) that miss
/// a program, from what the kernel says is attached (`actual`). Pure: the
/// same rows `switchboard status` shows as MISSING.
pub fn program_drift(
    listed: &[AttachedInterface],
    actual: &[hooks::IfaceHooks],
) -> Vec<ProgramDrift> {
    let status = AgentStatus {
        interfaces: listed.to_vec(),
        ..AgentStatus::default()
    };
    status::interface_rows(Some(&status), actual)
        .into_iter()
        .filter(|row| !row.gone && !row.missing.is_empty())
        .filter(|row| listed.iter().any(|l| l.index == row.index))
        .map(|row| ProgramDrift {
            foreign: actual
                .iter()
                .find(|a| a.index == row.index)
                .map(foreign_programs)
                .unwrap_or_default(),
            name: row.name,
            index: row.index,
            role: row.role,
            missing: row.missing,
            attached: row.attached,
        })
        .collect()
}

/// The programs on `iface` that are not switchboard's, with their hook.
fn foreign_programs(iface: &hooks::IfaceHooks) -> Vec<String> {
    let ours = |name: &str| name.starts_with("sb_");
    let mut found = Vec::new();
    for (hook, names) in [
        ("tcx ingress", &iface.tcx_ingress),
        ("tcx egress", &iface.tcx_egress),
        ("tc ingress", &iface.tc_ingress),
        ("tc egress", &iface.tc_egress),
    ] {
        found.extend(
            names
                .iter()
                .filter(|n| !ours(n))
                .map(|n| format!("{hook} {n}")),
        );
    }
    if let Some((name, mode)) = iface.xdp.as_ref().filter(|(n, _)| !ours(n)) {
        found.push(format!("xdp {mode} {name}"));
    }
    found
}

/// What the agent keeps in repair, and when it looks next.
pub(super) struct Healer {
    /// `--repair-interval` (zero: no repairs).
    interval: Duration,
    next_check: Instant,
    pin_root: PathBuf,
    /// Each map pin and the id of the map the data path uses.
    map_pins: Vec<(PathBuf, u32)>,
    /// The data path's configuration, as written at start.
    config: Config,
    /// What was already said about things not ours (said once).
    noted: HashSet<String>,
}

impl Healer {
    pub(super) fn new(interval: Duration, pin_root: &Path, config: Config) -> Healer {
        Healer {
            interval,
            next_check: Instant::now() + interval,
            pin_root: pin_root.to_owned(),
            map_pins: Vec::new(),
            config,
            noted: HashSet::new(),
        }
    }

    fn enabled(&self) -> bool {
        !self.interval.is_zero()
    }

    /// Remembers the map pins under the pin root and their maps (after
    /// any resize: these are the maps the programs use).
    pub(super) fn record_pins(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.pin_root) else {
            return;
        };
        self.map_pins = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("SB_"))
            .filter_map(|e| {
                let map = aya::maps::MapData::from_pin(e.path()).ok()?;
                Some((e.path(), map.info().ok()?.id()))
            })
            .collect();
        debug!(pins = self.map_pins.len(), "map pins recorded for repair");
    }

    /// Attaches again the programs found missing from an interface the
    /// agent manages, or from the socket layer's cgroup.
    pub(super) async fn programs(
        &mut self,
        links: &mut Links<'_>,
        sync: &mut SyncLoop<'_, PinnedMaps>,
    ) {
        if !self.enabled() {
            return;
        }
        let mut handle = links.handle.clone();
        let net = match hooks::inspect(&mut handle).await {
            Ok(net) if net.programs_unreadable.is_none() => net,
            Ok(_) => return,
            Err(error) => {
                debug!(error = %format!("{error:#}"), "reading the interfaces' programs failed; looking again at the next rescan");
                return;
            }
        };
        let drifts = program_drift(&sync.status.interfaces, &net.interfaces);
        for drift in &drifts {
            self.reattach(links, sync, drift);
        }
        if !drifts.is_empty() {
            sync.set_interfaces(links.attacher.interfaces(), &links.uplinks.statuses());
        }
        self.socket_layer(links.ebpf, sync);
    }

    fn reattach(
        &mut self,
        links: &mut Links<'_>,
        sync: &mut SyncLoop<'_, PinnedMaps>,
        drift: &ProgramDrift,
    ) {
        let missing = drift.missing.join(", ");
        if !drift.foreign.is_empty() {
            // Never removed: named, in case it is what took our place.
            info!(iface = %drift.name, foreign = %drift.foreign.join(", "), "programs that are not switchboard's share this interface's hooks; left alone");
        }
        warn!(iface = %drift.name, index = drift.index, role = %drift.role, %missing, attached = %drift.attached, "drift: programs missing from an interface the agent manages; attaching them again");
        let result = match drift.role.as_str() {
            "uplink" => links
                .uplinks
                .reattach(links.ebpf, drift.index)
                .map(|_| ())
                .map_err(anyhow::Error::from),
            _ => links
                .attacher
                .reattach(links.ebpf, drift.index)
                .map_err(anyhow::Error::from),
        };
        match result {
            Ok(()) => sync.repaired(
                "programs",
                format!("{} ({}): {missing} not attached", drift.name, drift.role),
            ),
            Err(error) => {
                warn!(iface = %drift.name, error = %format!("{error:#}"), foreign = %drift.foreign.join(", "), "attaching the missing programs again failed (something else in the way?); trying again at the next rescan")
            }
        }
    }

    /// The socket layer's links: one pin each under `<pin root>/links`,
    /// each attached to the cgroup (as `status` and `doctor` check them);
    /// any missing or detached, all are attached again (the new links go
    /// on before the old ones are let go).
    fn socket_layer(&mut self, ebpf: &mut aya::Ebpf, sync: &mut SyncLoop<'_, PinnedMaps>) {
        let Some(cgroup) = sync.socket_cgroup.clone() else {
            return;
        };
        let unattached = hooks::socket_layer_unattached(&hooks::pinned_links(&self.pin_root));
        if unattached.is_empty() {
            return;
        }
        self.note_foreign_socket_programs(&cgroup);
        let missing = unattached.join(", ");
        warn!(cgroup = %cgroup.display(), %missing, "drift: socket-layer programs not attached (a link's pin removed, or a link detached from the cgroup); attaching the socket layer again");
        match socket_layer::attach_links(ebpf, &cgroup, &self.pin_root) {
            Ok(()) => sync.repaired(
                "socket-layer",
                format!("cgroup {}: {missing} not attached", cgroup.display()),
            ),
            Err(error) => {
                warn!(error = %format!("{:#}", anyhow::Error::from(error)), "attaching the socket layer again failed; trying again at the next rescan")
            }
        }
    }

    /// Names, once each, the programs that are not switchboard's on the
    /// socket layer's cgroup hooks: they are left alone (cgroup hooks run
    /// several programs, so none is in the way of ours).
    fn note_foreign_socket_programs(&mut self, cgroup: &Path) {
        let Ok(names) = hooks::program_names() else {
            return;
        };
        for program in socket_layer::all_programs() {
            let Some(attach_type) = socket_layer::attach_type(program) else {
                continue;
            };
            let ids = match linkinfo::cgroup_programs(cgroup, attach_type) {
                Ok(ids) => ids,
                Err(error) => {
                    debug!(hook = program, %error, "listing the programs on a socket-layer hook failed");
                    continue;
                }
            };
            let foreign = ids
                .iter()
                .map(|id| names.get(id).cloned().unwrap_or_else(|| format!("id {id}")))
                .filter(|name| !name.starts_with("sb_"));
            for name in foreign {
                if self
                    .noted
                    .insert(format!("{} {program} {name}", cgroup.display()))
                {
                    info!(cgroup = %cgroup.display(), hook = program, foreign = %name, "a program that is not switchboard's runs on a socket-layer hook of the agent's cgroup; left alone");
                }
            }
        }
    }

    /// When due: the map pins, the configuration, the map entries, a share
    /// of the Maglev tables and the uplink maps.
    pub(super) fn check(&mut self, links: &mut Links<'_>, sync: &mut SyncLoop<'_, PinnedMaps>) {
        if !self.enabled() || Instant::now() < self.next_check {
            return;
        }
        let started = Instant::now();
        self.pins(sync);
        self.config(sync);
        self.entries(sync);
        self.maglev(sync);
        self.uplink_maps(links, sync);
        let took = started.elapsed();
        self.next_check = Instant::now() + self.interval.max(took * CHECK_BUDGET);
        sync.drift_checked(took);
    }

    /// A map pin removed is pinned again from the map the programs use; a
    /// pin holding another map is not ours to replace (said once).
    fn pins(&mut self, sync: &mut SyncLoop<'_, PinnedMaps>) {
        for (path, id) in &self.map_pins {
            match aya::maps::MapData::from_pin(path) {
                Ok(map) => {
                    let now = map.info().map(|i| i.id()).ok();
                    let key = path.display().to_string();
                    if now.is_some_and(|now| now != *id) && self.noted.insert(key) {
                        warn!(pin = %path.display(), "a pin of the agent's holds another map now; left alone (the programs keep using the agent's map, which `switchboard` commands reading this pin do not see)");
                    }
                }
                Err(_) if !path.exists() => {
                    warn!(pin = %path.display(), "drift: a map pin was removed; pinning the map again");
                    let pinned = aya::maps::MapData::from_id(*id)
                        .map_err(anyhow::Error::from)
                        .and_then(|map| map.pin(path).map_err(anyhow::Error::from));
                    match pinned {
                        Ok(()) => sync.repaired("pins", format!("{}: removed", path.display())),
                        Err(error) => {
                            warn!(pin = %path.display(), error = %format!("{error:#}"), "pinning the map again failed")
                        }
                    }
                }
                Err(error) => debug!(pin = %path.display(), %error, "a map pin could not be read"),
            }
        }
    }

    fn config(&mut self, sync: &mut SyncLoop<'_, PinnedMaps>) {
        let maps = sync.syncer.store_mut();
        match maps.config() {
            Ok(config) if config == self.config => {}
            Ok(config) => {
                warn!(holds = ?config, wanted = ?self.config, "drift: the data path's configuration changed; writing it again");
                match maps.set_config(self.config) {
                    Ok(()) => sync.repaired("config", format!("held {config:?}")),
                    Err(error) => warn!(%error, "writing the configuration again failed"),
                }
            }
            Err(error) => debug!(%error, "the configuration could not be read"),
        }
    }

    /// The frontend, backend, reverse-NAT and source-range entries against
    /// what the sync wrote.
    fn entries(&mut self, sync: &mut SyncLoop<'_, PinnedMaps>) {
        let report = sync.syncer.heal(sync.model.desired());
        // Both sides of the comparison were built whole and dropped: at
        // 100k Services that is about 100 MiB the allocator would keep as
        // the agent's RSS until the next check.
        if report.entries >= TRIM_AFTER_ENTRIES {
            heap::trim();
        }
        if report.clean {
            return;
        }
        for finding in report.findings.iter().take(FINDINGS_LOGGED) {
            warn!(map = finding.map, what = %finding.what, "drift: a map entry differs from what the agent wrote; written back");
        }
        warn!(
            findings = report.findings.len(),
            not_logged = report.findings.len().saturating_sub(FINDINGS_LOGGED),
            writes = report.writes,
            failed = ?report.failed,
            entries_compared = report.entries,
            "drift: map entries repaired"
        );
        let what = summary(&report.findings).unwrap_or_else(|| "entries compared again".to_owned());
        sync.repaired("maps", what);
        // A reverse-NAT value not known here, or a failed write: the sync
        // compares every frontend now.
        sync.sync_again();
    }

    /// The next share of the Maglev tables against what they must hold.
    fn maglev(&mut self, sync: &mut SyncLoop<'_, PinnedMaps>) {
        let report = sync.syncer.heal_maglev(maglev::PER_CHECK);
        if let Some(failed) = &report.failed {
            warn!(%failed, "the Maglev check could not read or write a table; trying again at its next look");
        }
        let Some(what) = summary(&report.findings) else {
            return;
        };
        for finding in report.findings.iter().take(FINDINGS_LOGGED) {
            warn!(map = finding.map, what = %finding.what, "drift: a Maglev table differs from what the agent wrote; written back (same backend ids)");
        }
        warn!(
            findings = report.findings.len(),
            writes = report.writes,
            tables_compared = report.entries,
            "drift: Maglev tables repaired"
        );
        sync.repaired("maglev", what);
    }

    /// The uplink maps against what the agent last wrote for its uplinks.
    fn uplink_maps(&mut self, links: &mut Links<'_>, sync: &mut SyncLoop<'_, PinnedMaps>) {
        let maps = sync.syncer.store_mut();
        let findings = match links.uplinks.heal_maps(links.ebpf, maps) {
            Ok(findings) => findings,
            Err(error) => {
                warn!(error = %format!("{:#}", anyhow::Error::from(error)), "checking or writing back the uplink maps failed; trying again at the next look");
                return;
            }
        };
        for what in &findings {
            warn!(%what, "drift: an uplink map entry differs from what the agent wrote; written back");
        }
        let findings: Vec<Finding> = findings
            .into_iter()
            .map(|what| Finding {
                map: "uplinks",
                what,
            })
            .collect();
        if let Some(what) = summary(&findings) {
            sync.repaired("uplink-maps", what);
        }
    }
}

/// One line for the status file: the first finding, and how many more.
fn summary(findings: &[Finding]) -> Option<String> {
    let first = findings.first()?;
    Some(match findings.len() {
        1 => format!("{}: {}", first.map, first.what),
        n => format!("{}: {} (and {} more)", first.map, first.what, n - 1),
    })
}

#[cfg(test)]
mod tests;
