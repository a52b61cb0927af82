//! The agent's uplinks, kept in step with the interfaces: found at start
//! and again after every link, address or route event (and on the rescan
//! tick), the way start-up finds them ([`uplink::resolve`]). What changed is
//! applied: new uplinks get their programs (XDP mode chosen and logged as at
//! start), uplinks that went away lose theirs and their link pins, and the
//! uplink maps (the IPv4 and IPv6 addresses flows to other nodes are
//! source-NATed to) are rewritten when an uplink or one of those addresses
//! changed.
//!
//! A named uplink (`--uplink`) that does not exist is waited for, with a
//! warning, rather than failing the agent: at start (an interface created a
//! little after the agent) and later (an interface deleted and created
//! again, with a new index).
use std::{
    collections::HashSet,
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use proxy_common::Uplink6;
use tracing::{debug, info, warn};

use crate::dataplane::{
    attach::pods::{self, AttachedInterface, TcMode},
    attach::uplink::{
        self, LinkFacts, NodePortMode, Role, Uplink, UplinkError, XdpChoice, XdpHook, XdpMode,
    },
    maps::PinnedMaps,
};

#[derive(Debug, thiserror::Error)]
pub enum UplinksError {
    #[error("finding the uplinks")]
    Resolve(#[source] Box<UplinkError>),
    #[error("writing the uplink map")]
    Map4(#[source] Box<crate::sync::store::WriteError>),
    #[error("writing the IPv6 uplink map")]
    Map6(#[source] Box<UplinkError>),
    #[error("attaching the uplink programs to {iface}")]
    Attach {
        iface: String,
        #[source]
        source: Box<UplinkError>,
    },
    #[error("detaching the uplink programs from {iface}")]
    Detach {
        iface: String,
        #[source]
        source: Box<UplinkError>,
    },
}

/// What a new resolution asks of the current uplinks. An uplink is the same
/// one while its name and index are (a re-created interface is a new one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Found now, without programs yet.
    pub attach: Vec<Uplink>,
    /// With programs, and no uplink any more (or gone).
    pub detach: Vec<Uplink>,
    /// Kept, with another IPv4 or IPv6 source-NAT address.
    pub readdressed: Vec<Uplink>,
    /// The uplink maps must be written again (an uplink or an address
    /// changed since they were last written).
    pub rewrite_maps: bool,
}

fn same(a: &Uplink, b: &Uplink) -> bool {
    a.index == b.index && a.name == b.name
}

/// What the uplink maps hold for `uplinks`, in a comparable order.
fn map_view(uplinks: &[Uplink]) -> Vec<(u32, Option<Ipv4Addr>, Option<Ipv6Addr>)> {
    let mut view: Vec<_> = uplinks.iter().map(|u| (u.index, u.addr, u.addr6)).collect();
    view.sort_unstable();
    view
}

/// Compares the uplinks with programs (`active`) and what the maps hold
/// (`written`, `None` before the first write) with a new resolution.
pub fn plan(active: &[Uplink], written: Option<&[Uplink]>, wanted: &[Uplink]) -> Plan {
    let attach = wanted
        .iter()
        .filter(|w| !active.iter().any(|a| same(a, w)))
        .cloned()
        .collect();
    let detach = active
        .iter()
        .filter(|a| !wanted.iter().any(|w| same(a, w)))
        .cloned()
        .collect();
    let readdressed = wanted
        .iter()
        .filter(|w| {
            active
                .iter()
                .any(|a| same(a, w) && (a.addr, a.addr6) != (w.addr, w.addr6))
        })
        .cloned()
        .collect();
    let rewrite_maps = written.is_none_or(|written| map_view(written) != map_view(wanted));
    Plan {
        attach,
        detach,
        readdressed,
        rewrite_maps,
    }
}

/// One uplink map's entries that differ from what the agent wrote, and
/// the writes that mend them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapDrift<V> {
    pub put: Vec<(u32, V)>,
    pub delete: Vec<u32>,
    /// What was wrong, one line per entry.
    pub findings: Vec<String>,
}

impl<V> MapDrift<V> {
    pub fn is_empty(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Uplink map `map` as it holds `actual` against what the agent wrote,
/// `expected` (both by interface index; `show` prints a value). Pure.
pub fn map_drift<V: Copy + PartialEq>(
    map: &str,
    expected: &[(u32, V)],
    actual: &[(u32, V)],
    show: impl Fn(&V) -> String,
) -> MapDrift<V> {
    let mut drift = MapDrift {
        put: Vec::new(),
        delete: Vec::new(),
        findings: Vec::new(),
    };
    for (index, want) in expected {
        let what = match actual.iter().find(|(i, _)| i == index) {
            Some((_, held)) if held == want => continue,
            Some((_, held)) => format!("holds {}, expected {}", show(held), show(want)),
            None => format!("missing (expected {})", show(want)),
        };
        drift.put.push((*index, *want));
        drift
            .findings
            .push(format!("{map} ifindex {index}: {what}"));
    }
    for (index, held) in actual {
        if expected.iter().all(|(i, _)| i != index) {
            drift.delete.push(*index);
            drift.findings.push(format!(
                "{map} ifindex {index}: left over (holds {}; the agent has no uplink there)",
                show(held)
            ));
        }
    }
    drift
}

fn show4(v: &proxy_common::Uplink) -> String {
    format!(
        "{} flags {:#04x}",
        Ipv4Addr::from(v.addr_be.to_ne_bytes()),
        v.flags
    )
}

fn show6(v: &Uplink6) -> String {
    crate::sync::encode::ipv6(v.addr_be).to_string()
}

/// Both uplink maps' drift.
pub struct UplinkMapsDrift {
    pub v4: MapDrift<proxy_common::Uplink>,
    pub v6: MapDrift<Uplink6>,
}

impl UplinkMapsDrift {
    /// What was wrong, both maps.
    pub fn findings(&self) -> Vec<String> {
        self.v4
            .findings
            .iter()
            .chain(&self.v6.findings)
            .cloned()
            .collect()
    }
}

/// What one [`Uplinks::refresh`] did.
#[derive(Debug, Default)]
pub struct Refreshed {
    /// The set of uplinks with programs, or their status rows, changed.
    pub changed: bool,
    /// Uplinks whose programs could not be attached (the first failure
    /// of each; tried again at every refresh, later failures logged at
    /// debug level) or detached.
    pub failures: Vec<UplinksError>,
}

/// The uplinks with programs on them, and what is needed to find them again.
pub struct Uplinks {
    /// `--uplink` (empty: found from the node's addresses).
    names: Vec<String>,
    xdp_mode: XdpMode,
    tc_mode: TcMode,
    nodeport_mode: NodePortMode,
    /// `<pin root>/links`.
    link_dir: PathBuf,
    /// With programs on them, each with its status row.
    active: Vec<(Uplink, AttachedInterface)>,
    /// What the uplink maps hold (`None`: not yet written by this agent).
    written: Option<Vec<Uplink>>,
    /// Named uplinks found missing (warned about once until they appear).
    missing: Vec<String>,
    /// Whether the automatic search found none (warned about once).
    none_found: bool,
    /// Interfaces whose attach failed (warned about once until it works).
    failed: HashSet<u32>,
}

impl Uplinks {
    pub fn new(
        names: Vec<String>,
        xdp_mode: XdpMode,
        tc_mode: TcMode,
        nodeport_mode: NodePortMode,
        pin_root: &Path,
    ) -> Self {
        Self {
            names,
            xdp_mode,
            tc_mode,
            nodeport_mode,
            link_dir: pin_root.join("links"),
            active: Vec::new(),
            written: None,
            missing: Vec::new(),
            none_found: false,
            failed: HashSet::new(),
        }
    }

    /// The interface indices of the uplinks with programs.
    pub fn indices(&self) -> Vec<u32> {
        self.active.iter().map(|(u, _)| u.index).collect()
    }

    /// The uplinks' rows of the status file.
    pub fn statuses(&self) -> Vec<AttachedInterface> {
        self.active.iter().map(|(_, s)| s.clone()).collect()
    }

    /// Finds the uplinks again (`node_addrs`: the Node's IPv4 addresses)
    /// and applies what changed: the maps first (new entries before stale
    /// ones go), then the programs off the uplinks that went, then onto the
    /// new ones. An error means nothing of the change was applied; the
    /// failures of single uplinks are in [`Refreshed::failures`].
    pub async fn refresh(
        &mut self,
        handle: &rtnetlink::Handle,
        node_addrs: &[Ipv4Addr],
        ebpf: &mut aya::Ebpf,
        maps: &mut PinnedMaps,
    ) -> Result<Refreshed, UplinksError> {
        let resolved = uplink::resolve(handle, &self.names, node_addrs)
            .await
            .map_err(|e| UplinksError::Resolve(Box::new(e)))?;
        self.note_missing(&resolved);
        let active: Vec<Uplink> = self.active.iter().map(|(u, _)| u.clone()).collect();
        let plan = plan(&active, self.written.as_deref(), &resolved.uplinks);
        if plan.rewrite_maps {
            self.write_maps(ebpf, maps, &resolved.uplinks)?;
        }
        let mut refreshed = Refreshed::default();
        for up in &plan.detach {
            self.detach(up, &mut refreshed);
        }
        for up in plan.readdressed {
            self.readdress(up);
        }
        for up in plan.attach {
            self.attach(ebpf, up, &mut refreshed);
        }
        self.failed
            .retain(|i| resolved.uplinks.iter().any(|u| u.index == *i));
        Ok(refreshed)
    }

    /// Attaches the programs of uplink `index` again (they were found
    /// missing from it); `false` if it is no uplink with programs.
    pub fn reattach(&mut self, ebpf: &mut aya::Ebpf, index: u32) -> Result<bool, UplinksError> {
        let Some(entry) = self.active.iter_mut().find(|(u, _)| u.index == index) else {
            return Ok(false);
        };
        let up = entry.0.clone();
        entry.1 = attach_uplink(ebpf, &up, self.xdp_mode, self.tc_mode, &self.link_dir).map_err(
            |source| UplinksError::Attach {
                iface: up.name.clone(),
                source: Box::new(source),
            },
        )?;
        Ok(true)
    }

    /// What the uplink maps hold that differs from what this agent last
    /// wrote there (`None` before its first write).
    pub fn maps_drift(
        &self,
        ebpf: &aya::Ebpf,
        maps: &PinnedMaps,
    ) -> Result<Option<UplinkMapsDrift>, UplinksError> {
        let Some(written) = &self.written else {
            return Ok(None);
        };
        let v4 = map_drift(
            proxy_common::names::UPLINKS,
            &uplink::map_entries4(written, self.nodeport_mode),
            &maps.uplink_entries(),
            show4,
        );
        let actual6 = uplink::uplinks6(ebpf).map_err(|e| UplinksError::Map6(Box::new(e)))?;
        let v6 = map_drift(
            proxy_common::names::UPLINKS6,
            &uplink::map_entries6(written),
            &actual6,
            show6,
        );
        Ok(Some(UplinkMapsDrift { v4, v6 }))
    }

    /// Writes back the uplink map entries that differ from what this agent
    /// wrote (new and changed ones before left-over ones go); returns what
    /// was wrong (empty when nothing was).
    pub fn heal_maps(
        &mut self,
        ebpf: &mut aya::Ebpf,
        maps: &mut PinnedMaps,
    ) -> Result<Vec<String>, UplinksError> {
        let Some(drift) = self.maps_drift(ebpf, maps)? else {
            return Ok(Vec::new());
        };
        let map6 = |e| UplinksError::Map6(Box::new(e));
        for (index, value) in &drift.v4.put {
            maps.put_uplink(*index, *value)
                .map_err(|e| UplinksError::Map4(Box::new(e)))?;
        }
        for (index, value) in &drift.v6.put {
            uplink::put_uplink6(ebpf, *index, *value).map_err(map6)?;
        }
        for index in &drift.v4.delete {
            maps.delete_uplink(*index)
                .map_err(|e| UplinksError::Map4(Box::new(e)))?;
        }
        for index in &drift.v6.delete {
            uplink::delete_uplink6(ebpf, *index).map_err(map6)?;
        }
        Ok(drift.findings())
    }

    /// Logs named uplinks that went missing or came back, and an automatic
    /// search that found none (or found one again).
    fn note_missing(&mut self, resolved: &uplink::Resolved) {
        for name in &resolved.missing {
            if !self.missing.contains(name) {
                warn!(iface = %name, "uplink (--uplink) does not exist: waiting for it; traffic from outside arriving there is not balanced until it appears");
            }
        }
        for name in &self.missing {
            if !resolved.missing.contains(name) {
                info!(iface = %name, "uplink (--uplink) appeared");
            }
        }
        self.missing.clone_from(&resolved.missing);
        let none = self.names.is_empty() && resolved.uplinks.is_empty();
        match (none, self.none_found) {
            (true, false) => warn!("no uplink found (no --uplink, no node address on an interface, no default route): traffic from outside the node is not balanced until one appears"),
            (false, true) => info!("an uplink was found"),
            _ => {}
        }
        self.none_found = none;
    }

    fn write_maps(
        &mut self,
        ebpf: &mut aya::Ebpf,
        maps: &mut PinnedMaps,
        uplinks: &[Uplink],
    ) -> Result<(), UplinksError> {
        maps.set_uplinks(&uplink::map_entries4(uplinks, self.nodeport_mode))
            .map_err(|e| UplinksError::Map4(Box::new(e)))?;
        uplink::set_uplinks6(ebpf, uplinks).map_err(|e| UplinksError::Map6(Box::new(e)))?;
        for up in uplinks
            .iter()
            .filter(|u| u.addr.is_none() && u.role == Role::Uplink)
        {
            warn!(iface = %up.name, "uplink has no IPv4 address: IPv4 flows to backends on other nodes are dropped until it has one");
        }
        self.written = Some(uplinks.to_vec());
        Ok(())
    }

    fn detach(&mut self, up: &Uplink, refreshed: &mut Refreshed) {
        match uplink::detach(up, &self.link_dir) {
            Ok(()) => {
                info!(iface = %up.name, index = up.index, "no uplink any more (or gone): its programs are off");
                self.active.retain(|(a, _)| !same(a, up));
                refreshed.changed = true;
            }
            Err(source) => refreshed.failures.push(UplinksError::Detach {
                iface: up.name.clone(),
                source: Box::new(source),
            }),
        }
    }

    fn readdress(&mut self, up: Uplink) {
        let Some((kept, _)) = self.active.iter_mut().find(|(a, _)| same(a, &up)) else {
            return;
        };
        info!(
            iface = %up.name,
            from = ?kept.addr,
            to = ?up.addr,
            from6 = ?kept.addr6,
            to6 = ?up.addr6,
            "uplink source-NAT address changed"
        );
        *kept = up;
    }

    fn attach(&mut self, ebpf: &mut aya::Ebpf, up: Uplink, refreshed: &mut Refreshed) {
        match attach_uplink(ebpf, &up, self.xdp_mode, self.tc_mode, &self.link_dir) {
            Ok(status) => {
                self.failed.remove(&up.index);
                self.active.push((up, status));
                refreshed.changed = true;
            }
            Err(source) => {
                let error = UplinksError::Attach {
                    iface: up.name.clone(),
                    source: Box::new(source),
                };
                match self.failed.insert(up.index) {
                    true => refreshed.failures.push(error),
                    false => {
                        debug!(iface = %up.name, error = %anyhow::Error::from(error), "attaching the uplink failed again")
                    }
                }
            }
        }
    }
}

/// Attaches the uplink programs to `up` in the XDP mode
/// [`uplink::resolve_xdp_mode`] picks for it (native refused by the driver:
/// picked again knowing that), and logs the choice with its reason.
fn attach_uplink(
    ebpf: &mut aya::Ebpf,
    up: &Uplink,
    xdp_mode: XdpMode,
    tc_mode: TcMode,
    link_dir: &Path,
) -> Result<AttachedInterface, UplinkError> {
    let mut facts = LinkFacts {
        kind: up.kind.as_deref(),
        native_refused: false,
    };
    let mut choice = match up.role {
        Role::Uplink => uplink::resolve_xdp_mode(xdp_mode, &facts),
        Role::Overlay => XdpChoice {
            hook: XdpHook::Off,
            reason: "overlay: tc only (tunnel devices take no XDP)".to_owned(),
            warning: None,
        },
    };
    let tc = match uplink::attach(ebpf, up, choice.hook, tc_mode, link_dir) {
        Ok(tc) => tc,
        Err(error @ UplinkError::Xdp { .. }) if choice.hook == XdpHook::Native => {
            facts.native_refused = true;
            choice = uplink::resolve_xdp_mode(xdp_mode, &facts);
            let error = anyhow::Error::from(error);
            match xdp_mode {
                XdpMode::Native => {
                    warn!(iface = %up.name, error = %error, "native XDP failed; using {} XDP", choice.hook)
                }
                _ => {
                    info!(iface = %up.name, error = %error, "native XDP refused; using {}", choice.hook)
                }
            }
            uplink::attach(ebpf, up, choice.hook, tc_mode, link_dir)?
        }
        Err(error) => return Err(error),
    };
    if let Some(warning) = &choice.warning {
        warn!(iface = %up.name, xdp = %choice.hook, "{warning}");
    }
    info!(iface = %up.name, role = up.role.as_str(), kind = %up.kind.as_deref().unwrap_or("physical"), xdp = %choice.hook, reason = %choice.reason, "uplink XDP mode");
    Ok(uplink_status(up, tc, &choice))
}

/// An uplink as the status file lists it.
fn uplink_status(up: &Uplink, tc: pods::Attached, xdp: &XdpChoice) -> AttachedInterface {
    let mut hooks = pods::hook_names(tc, &uplink::TC_HOOKS);
    if xdp.hook != XdpHook::Off {
        hooks.push(format!(
            "xdp {} {}",
            xdp.hook,
            proxy_common::programs::XDP_UPLINK
        ));
    }
    AttachedInterface {
        name: up.name.clone(),
        index: up.index,
        role: up.role.as_str().to_owned(),
        hooks,
        xdp: Some(pods::UplinkXdp {
            mode: xdp.hook.to_string(),
            reason: xdp.reason.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::slice::from_ref;

    fn up(name: &str, index: u32, addr: Option<&str>, addr6: Option<&str>) -> Uplink {
        Uplink {
            name: name.to_owned(),
            index,
            addr: addr.map(|a| a.parse().expect("address")),
            addr6: addr6.map(|a| a.parse().expect("address")),
            kind: Some("veth".to_owned()),
            role: uplink::Role::Uplink,
        }
    }

    fn names(uplinks: &[Uplink]) -> Vec<(&str, u32)> {
        uplinks.iter().map(|u| (u.name.as_str(), u.index)).collect()
    }

    #[test]
    fn the_first_resolution_attaches_everything_and_writes_the_maps() {
        let wanted = [up("eth0", 2, Some("192.168.50.1"), None)];
        let got = plan(&[], None, &wanted);
        assert_eq!(names(&got.attach), [("eth0", 2)]);
        assert!(got.detach.is_empty() && got.readdressed.is_empty());
        assert!(got.rewrite_maps);
        // None found at first: the maps are still written (emptied of what
        // an earlier agent left).
        assert!(plan(&[], None, &[]).rewrite_maps);
    }

    #[test]
    fn an_unchanged_resolution_does_nothing() {
        let now = [
            up("eth0", 2, Some("192.168.50.1"), Some("fd00:50::1")),
            up("eth1", 3, None, None),
        ];
        let got = plan(&now, Some(&now), &now);
        assert_eq!(got, Plan::default());
        // The order the kernel lists them in does not matter.
        let swapped = [now[1].clone(), now[0].clone()];
        assert_eq!(plan(&now, Some(&now), &swapped), Plan::default());
    }

    #[test]
    fn a_new_and_a_gone_uplink_are_attached_and_detached() {
        let eth0 = up("eth0", 2, Some("192.168.50.1"), None);
        let eth1 = up("eth1", 3, Some("10.0.0.1"), None);
        let got = plan(from_ref(&eth0), Some(from_ref(&eth0)), from_ref(&eth1));
        assert_eq!(names(&got.attach), [("eth1", 3)]);
        assert_eq!(names(&got.detach), [("eth0", 2)]);
        assert!(got.rewrite_maps);
        // Gone with nothing new: detached, and the maps lose its entry.
        let got = plan(from_ref(&eth0), Some(from_ref(&eth0)), &[]);
        assert_eq!(names(&got.detach), [("eth0", 2)]);
        assert!(got.attach.is_empty() && got.rewrite_maps);
    }

    #[test]
    fn a_recreated_interface_is_a_new_uplink() {
        let old = up("eth0", 2, Some("192.168.50.1"), None);
        let new = up("eth0", 7, Some("192.168.50.1"), None);
        let got = plan(from_ref(&old), Some(from_ref(&old)), from_ref(&new));
        assert_eq!(names(&got.attach), [("eth0", 7)]);
        assert_eq!(names(&got.detach), [("eth0", 2)]);
        assert!(got.readdressed.is_empty() && got.rewrite_maps);
    }

    #[test]
    fn an_address_change_rewrites_the_maps_only() {
        let old = up("eth0", 2, Some("192.168.50.1"), Some("fd00:50::1"));
        for new in [
            up("eth0", 2, Some("192.168.50.3"), Some("fd00:50::1")),
            up("eth0", 2, Some("192.168.50.1"), Some("fd00:50::3")),
            up("eth0", 2, None, Some("fd00:50::1")),
            up("eth0", 2, Some("192.168.50.1"), None),
        ] {
            let got = plan(from_ref(&old), Some(from_ref(&old)), from_ref(&new));
            assert!(got.attach.is_empty() && got.detach.is_empty(), "{new:?}");
            assert_eq!(got.readdressed, from_ref(&new), "{new:?}");
            assert!(got.rewrite_maps, "{new:?}");
        }
    }

    /// What an uplink map holds against what the agent wrote: an entry
    /// deleted or changed is written back, one for an index the agent has
    /// no uplink at is deleted, and entries that agree cost nothing.
    #[test]
    fn uplink_map_entries_that_differ_are_mended_one_by_one() {
        let a = proxy_common::Uplink::new(u32::from_ne_bytes([192, 168, 50, 1]), 0);
        let b = proxy_common::Uplink::new(u32::from_ne_bytes([10, 0, 0, 1]), 0);
        let odd = proxy_common::Uplink::new(u32::from_ne_bytes([10, 0, 0, 9]), 1);
        let expected = [(2, a), (3, b)];
        let clean = map_drift("SB_UPLINK_V1", &expected, &[(3, b), (2, a)], show4);
        assert!(clean.is_empty() && clean.put.is_empty() && clean.delete.is_empty());
        let drift = map_drift("SB_UPLINK_V1", &expected, &[(3, odd), (7, a)], show4);
        assert_eq!(drift.put, [(2, a), (3, b)]);
        assert_eq!(drift.delete, [7]);
        assert_eq!(
            drift.findings,
            [
                "SB_UPLINK_V1 ifindex 2: missing (expected 192.168.50.1 flags 0x00)",
                "SB_UPLINK_V1 ifindex 3: holds 10.0.0.9 flags 0x01, expected 10.0.0.1 flags 0x00",
                "SB_UPLINK_V1 ifindex 7: left over (holds 192.168.50.1 flags 0x00; the agent has no uplink there)",
            ]
        );
        let up6 = Uplink6 {
            addr_be: proxy_common::addr6_be(
                "fd00:50::1".parse::<Ipv6Addr>().expect("address").octets(),
            ),
        };
        let drift6 = map_drift("SB_UPLINK6_V1", &[(2, up6)], &[], show6);
        assert_eq!(
            drift6.findings,
            ["SB_UPLINK6_V1 ifindex 2: missing (expected fd00:50::1)"]
        );
        // What the agent writes for an uplink is what it expects back.
        let eth0 = up("eth0", 2, Some("192.168.50.1"), Some("fd00:50::1"));
        assert_eq!(uplink::map_entries6(from_ref(&eth0)), [(2, up6)]);
        assert_eq!(
            uplink::map_entries4(from_ref(&eth0), NodePortMode::Snat),
            [(2, a)]
        );
    }

    #[test]
    fn a_failed_attach_is_planned_again_without_rewriting_the_maps() {
        let eth0 = up("eth0", 2, Some("192.168.50.1"), None);
        // The maps were written with it, its attach failed: not active.
        let got = plan(&[], Some(from_ref(&eth0)), from_ref(&eth0));
        assert_eq!(names(&got.attach), [("eth0", 2)]);
        assert!(!got.rewrite_maps);
    }
}
