//! Finding pod interfaces and attaching the tc programs to them.
//!
//! A pod interface is a veth in the agent's namespace whose peer lives in
//! another namespace (the kernel reports the peer's namespace id on such links).
//!
//! Both programs are attached with TCX (Linux 6.6+) as BPF links pinned under
//! the pin root, or, where TCX is missing, as netlink clsact filters. Either
//! outlives the agent, so traffic keeps flowing while it restarts. A new agent
//! swaps its programs into the pinned TCX links atomically (`bpf_link_update`:
//! no packet sees neither program, none sees both), or replaces the filters
//! the old one left.
use std::{
    collections::{HashMap, HashSet},
    fs, io,
    path::{Path, PathBuf},
};

use aya::programs::{
    links::{FdLink, PinnedLink},
    tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcError},
    LinkOrder, ProgramError, SchedClassifier, TcAttachType,
};
use aya::Ebpf;
use futures::TryStreamExt as _;
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use proxy_common::programs;

use crate::dataplane::flows::quiet_pods::{pod_routes, Candidates, QuietPods};
use crate::dataplane::pins::Pins;
use tracing::{debug, info, warn};

/// One interface with switchboard's programs on it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttachedInterface {
    pub name: String,
    pub index: u32,
    /// `pod` (a veth to a pod) or `uplink` (traffic from outside the node).
    pub role: String,
    /// The hooks, e.g. `tcx ingress`, `tcx egress`, `xdp native`.
    pub hooks: Vec<String>,
    /// For an uplink: where its XDP program runs, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xdp: Option<UplinkXdp>,
}

/// The XDP mode an uplink got (`--xdp-mode` resolved for it).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UplinkXdp {
    /// `native`, `generic` or `off` (tc only).
    pub mode: String,
    /// Why, e.g. `auto: veth uplink: tc only (...)`.
    pub reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("netlink: {0}")]
    Netlink(#[from] rtnetlink::Error),
    #[error("netlink socket")]
    Socket(#[source] std::io::Error),
    #[error("adding the clsact qdisc to {iface}")]
    Qdisc { iface: String, source: TcError },
    #[error("attaching {program} to {iface}")]
    Attach {
        iface: String,
        program: &'static str,
        source: ProgramError,
    },
    #[error("program {0} is missing from the loaded object")]
    MissingProgram(&'static str),
    #[error("the TCX attach of {program} on {iface} gave no BPF link")]
    NotALink {
        iface: String,
        program: &'static str,
        source: aya::programs::links::LinkError,
    },
    #[error("pinning the TCX link of {program} on {iface} at {path}")]
    Pin {
        iface: String,
        program: &'static str,
        path: PathBuf,
        source: aya::pin::PinError,
    },
    #[error("replacing the unusable pinned TCX link {path}")]
    Unpin { path: PathBuf, source: io::Error },
    #[error("creating the link directory {path}")]
    LinkDir { path: PathBuf, source: io::Error },
}

/// How the tc programs are attached (`--tc-attach`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TcMode {
    /// TCX where the kernel has it (6.6+), netlink clsact otherwise.
    Auto,
    /// TCX only (fails on older kernels).
    Tcx,
    /// Netlink clsact filters only.
    Netlink,
}

/// What an interface was attached with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    Tcx,
    Netlink,
}

/// A veth whose peer is in another namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInterface {
    pub name: String,
    pub index: u32,
}

/// Whether a link is a veth with its peer in another namespace.
pub fn pod_interface(link: &LinkMessage) -> Option<PodInterface> {
    let mut name = None;
    let mut is_veth = false;
    let mut peer_elsewhere = false;
    for attr in &link.attributes {
        match attr {
            LinkAttribute::IfName(n) => name = Some(n.clone()),
            LinkAttribute::LinkNetNsId(_) => peer_elsewhere = true,
            LinkAttribute::LinkInfo(infos) => {
                is_veth = infos
                    .iter()
                    .any(|info| matches!(info, LinkInfo::Kind(InfoKind::Veth)));
            }
            _ => {}
        }
    }
    match (name, is_veth && peer_elsewhere) {
        (Some(name), true) => Some(PodInterface {
            name,
            index: link.header.index,
        }),
        _ => None,
    }
}

/// Lists the pod interfaces of the current network namespace.
pub async fn pod_interfaces(handle: &rtnetlink::Handle) -> Result<Vec<PodInterface>, AttachError> {
    let mut links = handle.link().get().execute();
    let mut found = Vec::new();
    while let Some(link) = links.try_next().await? {
        if let Some(pod) = pod_interface(&link) {
            found.push(pod);
        }
    }
    Ok(found)
}

/// Keeps track of which interfaces carry our programs.
pub struct Attacher {
    /// Interface name → index it had when we attached (a veth re-created
    /// under the same name gets a new index and is attached again), and how.
    attached: HashMap<String, (u32, Attached)>,
    mode: TcMode,
    /// Where TCX links are pinned (`<pin root>/links`).
    link_dir: PathBuf,
    /// Uplink interface indices: not pod interfaces, and their link pins
    /// (attached by [`crate::dataplane::attach::uplink`]) are not ours to forget.
    uplinks: Vec<u32>,
    /// The quiet marks of pod interfaces (`None` if the map could not be
    /// opened: every reply is then looked up, as before the marks).
    quiet: Option<QuietPods>,
    /// Whether the interfaces found at start have been told apart
    /// ([`start_marking`](Self::start_marking)); interfaces that appear
    /// later are new, and marked quiet before their first attach.
    settled: bool,
    /// The interfaces seen before that: they may carry an earlier agent's
    /// programs and flows, and are never marked as new.
    found_at_start: HashSet<u32>,
    /// The pod interfaces the collector may mark quiet, with their routes.
    candidates: Candidates,
}

impl Attacher {
    pub fn new(mode: TcMode, pin_root: &Path) -> Self {
        let quiet = match QuietPods::open(Pins::new(pin_root)) {
            Ok(quiet) => Some(quiet),
            Err(error) => {
                warn!(error = %anyhow::Error::from(error), "no quiet marks: every packet into a pod is looked up");
                None
            }
        };
        Self {
            attached: HashMap::new(),
            mode,
            link_dir: pin_root.join("links"),
            uplinks: Vec::new(),
            quiet,
            settled: false,
            found_at_start: HashSet::new(),
            candidates: Candidates::default(),
        }
    }

    /// From now on, an interface that appears is new: marked quiet before
    /// its first attach. Those found before may carry an earlier agent's
    /// programs and flows; the collector marks them after a look at the
    /// tables ([`crate::dataplane::flows::quiet_pods`]). Call it once the uplinks are
    /// known: an uplink is never quiet.
    pub fn start_marking(&mut self) {
        self.settled = true;
    }

    /// The pod interfaces with programs on them, by index.
    pub fn pod_indices(&self) -> Vec<u32> {
        self.attached
            .values()
            .map(|(index, _)| *index)
            .filter(|index| !self.uplinks.contains(index))
            .collect()
    }

    /// The pod interfaces the connection-tracking collector may mark quiet
    /// (shared: [`follow_routes`](Self::follow_routes) keeps it current).
    pub fn quiet_candidates(&self) -> Candidates {
        self.candidates.clone()
    }

    /// Reads the routes of the pod interfaces with programs on them: the
    /// addresses the collector looks for among the clients of flows. A
    /// failure leaves the last ones (a route of a pod changes only with its
    /// interface).
    pub async fn follow_routes(&self, handle: &rtnetlink::Handle) {
        if self.quiet.is_none() {
            return;
        }
        match pod_routes(handle, &self.pod_indices()).await {
            Ok(pods) => self.candidates.set(pods),
            Err(error) => {
                warn!(%error, "listing the routes of pod interfaces failed; quiet marks wait for the next rescan")
            }
        }
    }

    /// Names the uplinks, which [`reconcile`](Self::reconcile) leaves alone.
    pub fn set_uplinks(&mut self, indices: Vec<u32>) {
        self.uplinks = indices;
    }

    /// Attaches to every pod interface not yet attached; forgets interfaces
    /// that are gone. Errors on one interface are logged and do not stop
    /// the others.
    pub fn reconcile(&mut self, ebpf: &mut Ebpf, interfaces: &[PodInterface]) {
        let uplinks = self.uplinks.clone();
        let interfaces: Vec<PodInterface> = interfaces
            .iter()
            .filter(|i| !uplinks.contains(&i.index))
            .cloned()
            .collect();
        let interfaces = interfaces.as_slice();
        if !self.settled {
            self.found_at_start
                .extend(interfaces.iter().map(|i| i.index));
        }
        let quiet = &mut self.quiet;
        self.attached.retain(|name, (index, _)| {
            let kept = interfaces
                .iter()
                .any(|i| &i.name == name && i.index == *index);
            if let (false, Some(quiet)) = (kept, quiet.as_mut()) {
                // Best effort: a mark of a gone interface matches nothing.
                let _ = quiet.unmark(*index);
            }
            kept
        });
        self.forget_gone_links(interfaces);
        for iface in interfaces {
            if self.attached.get(&iface.name).map(|(index, _)| *index) == Some(iface.index) {
                continue;
            }
            let new = self.settled && !self.found_at_start.contains(&iface.index);
            if let (true, Some(quiet)) = (new, self.quiet.as_mut()) {
                // New since the start: no flow of its pod can be tracked
                // before our programs are on it.
                if let Err(error) = quiet.mark_unattached(iface.index) {
                    warn!(iface = %iface.name, %error, "marking a new pod interface quiet failed");
                }
            }
            match attach(ebpf, iface, self.mode, &self.link_dir) {
                Ok(how) => {
                    info!(iface = %iface.name, mode = ?how, "programs attached");
                    self.attached.insert(iface.name.clone(), (iface.index, how));
                }
                Err(error) => {
                    warn!(iface = %iface.name, error = %anyhow::Error::from(error), "attach failed; will retry")
                }
            }
        }
    }

    /// Attaches the programs of pod interface `index` again (they were
    /// found missing from it), replacing what is left of ours there.
    pub fn reattach(&mut self, ebpf: &mut Ebpf, index: u32) -> Result<(), AttachError> {
        let Some((name, _)) = self
            .attached
            .iter()
            .find(|(_, (i, _))| *i == index)
            .map(|(name, (i, how))| (name.clone(), (*i, *how)))
        else {
            return Ok(());
        };
        let iface = PodInterface {
            name: name.clone(),
            index,
        };
        let how = attach(ebpf, &iface, self.mode, &self.link_dir)?;
        self.attached.insert(name, (index, how));
        Ok(())
    }

    pub fn attached(&self) -> usize {
        self.attached.len()
    }

    /// The pod interfaces with programs on them, for the status file.
    pub fn interfaces(&self) -> Vec<AttachedInterface> {
        let mut out: Vec<_> = self
            .attached
            .iter()
            .map(|(name, (index, how))| AttachedInterface {
                name: name.clone(),
                index: *index,
                role: "pod".to_owned(),
                hooks: hook_names(*how, &POD_HOOKS),
                xdp: None,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Removes the pins of TCX links whose interface is gone (the kernel has
    /// already detached them; the pin would only hold a dead link).
    fn forget_gone_links(&self, interfaces: &[PodInterface]) {
        let Ok(entries) = fs::read_dir(&self.link_dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(index) = name.to_str().and_then(tcx_pin_index) else {
                continue;
            };
            if interfaces.iter().all(|i| i.index != index) && !self.uplinks.contains(&index) {
                match fs::remove_file(entry.path()) {
                    Ok(()) => {
                        debug!(pin = %entry.path().display(), "removed the link pin of a gone interface")
                    }
                    Err(error) => {
                        warn!(pin = %entry.path().display(), %error, "removing a stale link pin failed")
                    }
                }
            }
        }
    }
}

/// How `hooks` attached with `how` read in the status file, e.g.
/// `tcx ingress sb_from_pod`.
pub fn hook_names(how: Attached, hooks: &[Hook]) -> Vec<String> {
    let kind = match how {
        Attached::Tcx => "tcx",
        Attached::Netlink => "tc",
    };
    hooks
        .iter()
        .map(|(program, hook)| {
            let dir = match hook {
                TcAttachType::Ingress => "ingress",
                TcAttachType::Egress => "egress",
                TcAttachType::Custom(_) => "custom",
            };
            format!("{kind} {dir} {program}")
        })
        .collect()
}

/// Pin name of the TCX link of `program` on interface `index` (bpffs names
/// may not contain dots).
pub fn tcx_pin_name(index: u32, program: &str) -> String {
    format!("tcx_{index}_{program}")
}

/// The interface index a TCX pin name carries.
fn tcx_pin_index(name: &str) -> Option<u32> {
    name.strip_prefix("tcx_")?.split('_').next()?.parse().ok()
}

/// A tc program and the hook it goes on.
pub type Hook = (&'static str, TcAttachType);

/// The programs of a pod interface.
pub const POD_HOOKS: [Hook; 2] = [
    (programs::TC_FROM_POD, TcAttachType::Ingress),
    (programs::TC_TO_POD, TcAttachType::Egress),
];

/// Attaches both pod programs to `iface` as `mode` says, replacing what an
/// earlier agent left.
pub fn attach(
    ebpf: &mut Ebpf,
    iface: &PodInterface,
    mode: TcMode,
    link_dir: &Path,
) -> Result<Attached, AttachError> {
    attach_hooks(ebpf, iface, mode, link_dir, &POD_HOOKS)
}

/// Attaches `hooks` to `iface` as `mode` says, replacing what an earlier
/// agent left on those hooks.
pub fn attach_hooks(
    ebpf: &mut Ebpf,
    iface: &PodInterface,
    mode: TcMode,
    link_dir: &Path,
    hooks: &[Hook],
) -> Result<Attached, AttachError> {
    if mode != TcMode::Netlink {
        match attach_tcx(ebpf, iface, link_dir, hooks) {
            Ok(()) => {
                // A filter an earlier (netlink) agent left would run after
                // ours and see only translated packets; remove it anyway.
                remove_netlink_filters(&iface.name, hooks);
                return Ok(Attached::Tcx);
            }
            Err(error) if mode == TcMode::Auto => {
                debug!(iface = %iface.name, error = %anyhow::Error::from(error), "TCX attach failed; using netlink clsact")
            }
            Err(error) => return Err(error),
        }
    }
    // The filters first, then the TCX links: the hooks are never empty.
    attach_netlink(ebpf, &iface.name, hooks)?;
    remove_tcx_pins(iface.index, link_dir, hooks);
    Ok(Attached::Netlink)
}

/// Removes `hooks` from `iface` whichever way an earlier agent attached
/// them (TCX pins and netlink filters).
pub fn detach_hooks(iface: &PodInterface, link_dir: &Path, hooks: &[Hook]) {
    remove_tcx_pins(iface.index, link_dir, hooks);
    remove_netlink_filters(&iface.name, hooks);
}

/// Removes the TCX links an earlier agent pinned for interface `index`.
fn remove_tcx_pins(index: u32, link_dir: &Path, hooks: &[Hook]) {
    for (name, _) in hooks {
        let path = link_dir.join(tcx_pin_name(index, name));
        if fs::remove_file(&path).is_ok() {
            debug!(pin = %path.display(), "removed an earlier TCX link");
        }
    }
}

fn program<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
    iface: &str,
) -> Result<&'a mut SchedClassifier, AttachError> {
    ebpf.program_mut(name)
        .ok_or(AttachError::MissingProgram(name))?
        .try_into()
        .map_err(|source| AttachError::Attach {
            iface: iface.to_owned(),
            program: name,
            source,
        })
}

/// TCX: swap our program into the pinned link of an earlier agent, or attach
/// a new link and pin it.
fn attach_tcx(
    ebpf: &mut Ebpf,
    iface: &PodInterface,
    link_dir: &Path,
    hooks: &[Hook],
) -> Result<(), AttachError> {
    crate::util::fsmode::ensure_dir(
        link_dir,
        crate::util::fsmode::PIN_DIR_MODE,
        crate::util::fsmode::Existing::Set,
    )
    .map_err(|source| AttachError::LinkDir {
        path: link_dir.to_owned(),
        source,
    })?;
    for &(name, hook) in hooks {
        let attach_error = |source| AttachError::Attach {
            iface: iface.name.clone(),
            program: name,
            source,
        };
        let path = link_dir.join(tcx_pin_name(iface.index, name));
        let prog = program(ebpf, name, &iface.name)?;
        if let Some(existing) = pinned_tc_link(&path) {
            match prog.attach_to_link(existing) {
                Ok(link_id) => {
                    // The pin holds the link; our handle may go.
                    let link = prog.take_link(link_id).map_err(attach_error)?;
                    drop(link);
                    continue;
                }
                Err(error) => {
                    debug!(pin = %path.display(), %error, "pinned TCX link unusable; attaching anew");
                    fs::remove_file(&path).map_err(|source| AttachError::Unpin {
                        path: path.clone(),
                        source,
                    })?;
                }
            }
        }
        let link_id = prog
            .attach_with_options(
                &iface.name,
                hook,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(attach_error)?;
        let link = prog.take_link(link_id).map_err(attach_error)?;
        let link = FdLink::try_from(link).map_err(|source| AttachError::NotALink {
            iface: iface.name.clone(),
            program: name,
            source,
        })?;
        let pinned = link.pin(&path).map_err(|source| AttachError::Pin {
            iface: iface.name.clone(),
            program: name,
            path: path.clone(),
            source,
        })?;
        drop(pinned);
    }
    Ok(())
}

/// The TCX link pinned at `path`, if there is one.
fn pinned_tc_link(path: &Path) -> Option<SchedClassifierLink> {
    let pinned = PinnedLink::from_pin(path).ok()?;
    SchedClassifierLink::try_from(FdLink::from(pinned)).ok()
}

/// Removes our netlink filters of `hooks` from `iface`, if any.
fn remove_netlink_filters(iface: &str, hooks: &[Hook]) {
    for &(name, hook) in hooks {
        if tc::qdisc_detach_program(iface, hook, name).is_ok() {
            debug!(iface, program = name, "removed an earlier netlink filter");
        }
    }
}

/// Priority of switchboard's netlink filters: fixed, so a new agent finds an
/// earlier agent's filter and replaces its program in place.
pub const NETLINK_PRIORITY: u16 = 1;
/// Handle of switchboard's netlink filters (with [`NETLINK_PRIORITY`]).
pub const NETLINK_HANDLE: tc::TcHandle = tc::TcHandle::new(0, 1);

/// Netlink clsact: the programs as filters at a fixed priority and handle.
/// Where an earlier agent's filter sits there, its program is replaced in
/// place (`RTM_NEWTFILTER` without `NLM_F_CREATE`): no packet meets the hook
/// empty, none sees both programs.
fn attach_netlink(ebpf: &mut Ebpf, iface: &str, hooks: &[Hook]) -> Result<(), AttachError> {
    match tc::qdisc_add_clsact(iface) {
        Ok(()) => {}
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
        Err(source) => {
            return Err(AttachError::Qdisc {
                iface: iface.to_owned(),
                source,
            })
        }
    }
    for &(name, hook) in hooks {
        let attach_error = |source| AttachError::Attach {
            iface: iface.to_owned(),
            program: name,
            source,
        };
        let program = program(ebpf, name, iface)?;
        let link_id = match earlier_filter(iface, hook) {
            Some(earlier) => match program.attach_to_link(earlier) {
                Ok(link_id) => {
                    debug!(iface, program = name, "replaced an earlier filter in place");
                    link_id
                }
                Err(error) => {
                    debug!(iface, program = name, %error, "no earlier filter to replace");
                    attach_new_filter(program, iface, hook).map_err(attach_error)?
                }
            },
            None => attach_new_filter(program, iface, hook).map_err(attach_error)?,
        };
        // Own the link and let it go without detaching: the filter stays when
        // the agent exits, so traffic survives a restart.
        let link = program.take_link(link_id).map_err(attach_error)?;
        std::mem::forget(link);
    }
    Ok(())
}

/// A handle on the filter an earlier agent left at our priority and handle
/// (whether one is there shows when replacing it).
fn earlier_filter(iface: &str, hook: TcAttachType) -> Option<SchedClassifierLink> {
    SchedClassifierLink::attached(iface, hook, NETLINK_PRIORITY, NETLINK_HANDLE, None).ok()
}

fn attach_new_filter(
    program: &mut SchedClassifier,
    iface: &str,
    hook: TcAttachType,
) -> Result<tc::SchedClassifierLinkId, ProgramError> {
    program.attach_with_options(
        iface,
        hook,
        TcAttachOptions::Netlink(NlOptions {
            priority: NETLINK_PRIORITY,
            handle: NETLINK_HANDLE,
            classid: None,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcx_pin_names_carry_the_interface_index_and_no_dot() {
        let name = tcx_pin_name(42, programs::TC_FROM_POD);
        assert_eq!(name, "tcx_42_sb_from_pod");
        assert!(!name.contains('.'), "bpffs refuses dotted names");
        assert_eq!(tcx_pin_index(&name), Some(42));
        assert_eq!(tcx_pin_index("sb_sock_connect4"), None);
        assert_eq!(tcx_pin_index("tcx_x_sb_to_pod"), None);
    }
}
