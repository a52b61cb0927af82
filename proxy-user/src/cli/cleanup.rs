//! `switchboard cleanup`: takes switchboard out of this network namespace
//! and cgroup. A pinned BPF link is released (and its program detached)
//! when its last reference goes: the agent keeps none after pinning, so
//! removing the pins detaches the TCX, XDP and cgroup links. Netlink clsact
//! filters and netlink XDP attachments of switchboard's programs (older
//! agents, `--tc-attach netlink`) are removed by name. Then every map is
//! unpinned and the pin directory and status file go.
use std::{
    fmt::Write as _,
    fs, io,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::programs::{tc, TcAttachType};
use netlink_packet_route::link::{LinkAttribute, LinkXdp};
use proxy_common::{names, programs};
use serde::Serialize;

use super::{agent_process, hooks, kube_proxy, Common, Done, Output};

/// The tc programs switchboard attaches, by hook.
const TC_PROGRAMS: [(&str, TcAttachType); 3] = [
    (programs::TC_FROM_POD, TcAttachType::Ingress),
    (programs::TC_FROM_UPLINK, TcAttachType::Ingress),
    (programs::TC_TO_POD, TcAttachType::Egress),
];
/// How long released links may take to leave their hooks.
const SETTLE: Duration = Duration::from_secs(3);
/// `XDP_FLAGS_SKB_MODE` / `XDP_FLAGS_DRV_MODE`.
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error("an agent (pid {pid}) manages pin root {}: stop it first, or pass --force", .pin_root.display())]
    AgentRunning { pid: u32, pin_root: PathBuf },
    #[error("listing the interfaces of this network namespace")]
    Netlink(#[source] anyhow::Error),
}

/// What `cleanup` did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CleanupReport {
    pub pin_root: String,
    /// Link pins removed (`tcx_4_sb_from_pod`, `xdp_2_native`, `sb_sock_connect4`).
    pub links_unpinned: Vec<String>,
    /// `iface ingress sb_from_pod`.
    pub filters_removed: Vec<String>,
    /// Interfaces whose netlink XDP program was detached.
    pub xdp_detached: Vec<String>,
    pub maps_unpinned: Vec<String>,
    pub pin_dir_removed: bool,
    /// Why the pin directory stays, when it does.
    pub pin_dir_note: Option<String>,
    pub status_file_removed: bool,
    pub kube_proxy: Option<kube_proxy::Removed>,
    /// switchboard programs still attached afterwards (`iface: hooks`).
    pub still_attached: Vec<String>,
    pub errors: Vec<String>,
}

pub fn run(common: &Common, kube_proxy: bool, force: bool) -> anyhow::Result<Done> {
    let report = cleanup(&common.pin_root, kube_proxy, force)?;
    let failed = !report.still_attached.is_empty() || !report.errors.is_empty();
    let text = match common.output {
        Output::Json => super::to_json(&report)?,
        Output::Table => render(&report),
    };
    Ok(Done { text, failed })
}

/// Removes everything switchboard attached and pinned for `pin_root` in
/// this network namespace and cgroup; with `kube_proxy`, kube-proxy's
/// chains and tables too. Refuses while an agent runs, unless `force`.
pub fn cleanup(pin_root: &Path, kube_proxy: bool, force: bool) -> anyhow::Result<CleanupReport> {
    let status = crate::observe::status::read(pin_root);
    let agent = agent_process(pin_root, status.as_ref());
    if let (true, Some(pid), false) = (agent.alive, agent.pid, force) {
        return Err(CleanupError::AgentRunning {
            pid,
            pin_root: pin_root.to_owned(),
        }
        .into());
    }
    let mut report = CleanupReport {
        pin_root: pin_root.display().to_string(),
        ..CleanupReport::default()
    };
    unpin_links(pin_root, &mut report);
    super::block_on(detach_netlink(&mut report, kube_proxy))?.map_err(CleanupError::Netlink)?;
    unpin_maps(pin_root, &mut report);
    match fs::remove_file(crate::observe::status::status_path(pin_root)) {
        Ok(()) => report.status_file_removed = true,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => report.errors.push(format!("removing the status file: {e}")),
    }
    // The lock file and the verify socket a killed agent left, unless an
    // agent (--force) still holds the lock.
    if crate::observe::lock::holder(pin_root).is_none() {
        for (what, path) in [
            ("the lock file", crate::observe::lock::lock_path(pin_root)),
            (
                "the verify socket",
                crate::observe::verify::socket_path(pin_root),
            ),
        ] {
            match fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => report.errors.push(format!("removing {what}: {e}")),
            }
        }
    }
    if kube_proxy {
        report.kube_proxy = Some(kube_proxy::remove());
    }
    Ok(report)
}

fn unpin_links(pin_root: &Path, report: &mut CleanupReport) {
    for pin in hooks::pinned_links(pin_root) {
        match fs::remove_file(&pin.path) {
            Ok(()) => report.links_unpinned.push(pin.name),
            Err(e) => report
                .errors
                .push(format!("unpinning {}: {e}", pin.path.display())),
        }
    }
    let dir = pin_root.join("links");
    if let Err(e) = fs::remove_dir(&dir) {
        if e.kind() != io::ErrorKind::NotFound {
            report
                .errors
                .push(format!("removing {}: {e}", dir.display()));
        }
    }
}

/// Whether `name` is one of switchboard's tc or XDP programs.
fn ours(name: &str) -> bool {
    TC_PROGRAMS
        .iter()
        .map(|(p, _)| *p)
        .chain([programs::XDP_UPLINK])
        .any(|p| hooks::same_program(name, p))
}

/// Removes netlink filters and XDP programs of ours, waits for released
/// links to go, and records what is still attached. With `kube_proxy`,
/// also deletes IPVS mode's `kube-ipvs0` interface.
async fn detach_netlink(report: &mut CleanupReport, kube_proxy: bool) -> anyhow::Result<()> {
    let mut handle = hooks::connect()?;
    let net = hooks::inspect(&mut handle).await?;
    for iface in &net.interfaces {
        for (program, hook) in TC_PROGRAMS {
            let ingress = matches!(hook, TcAttachType::Ingress);
            let filters = if ingress {
                &iface.tc_ingress
            } else {
                &iface.tc_egress
            };
            if !filters.iter().any(|f| hooks::same_program(f, program)) {
                continue;
            }
            let dir = if ingress { "ingress" } else { "egress" };
            match tc::qdisc_detach_program(&iface.name, hook, program) {
                Ok(()) => report
                    .filters_removed
                    .push(format!("{} {dir} {program}", iface.name)),
                Err(e) => report.errors.push(format!(
                    "removing filter {program} from {}: {e}",
                    iface.name
                )),
            }
        }
        if kube_proxy && iface.name == kube_proxy::IPVS_INTERFACE {
            if let Err(e) = handle.link().del(iface.index).execute().await {
                report.errors.push(format!("deleting {}: {e}", iface.name));
            }
        }
    }
    let deadline = Instant::now() + SETTLE;
    loop {
        let net = hooks::inspect(&mut handle).await?;
        let left = leftovers(&net.interfaces);
        if left.is_empty() || Instant::now() > deadline {
            detach_xdp(&handle, &net.interfaces, report).await;
            let net = hooks::inspect(&mut handle).await?;
            report.still_attached = leftovers(&net.interfaces);
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `iface: hooks` of every interface that still carries a program of ours.
fn leftovers(interfaces: &[hooks::IfaceHooks]) -> Vec<String> {
    interfaces
        .iter()
        .filter(|i| {
            i.tcx_ingress
                .iter()
                .chain(&i.tcx_egress)
                .chain(&i.tc_ingress)
                .chain(&i.tc_egress)
                .any(|p| ours(p))
                || i.xdp.as_ref().is_some_and(|(p, _)| ours(p))
        })
        .map(|i| format!("{}: {}", i.name, i.summary()))
        .collect()
}

/// Detaches XDP programs of ours attached through netlink (a link's XDP
/// went with its pin; this one is the only kind left).
async fn detach_xdp(
    handle: &rtnetlink::Handle,
    interfaces: &[hooks::IfaceHooks],
    report: &mut CleanupReport,
) {
    for iface in interfaces {
        let Some((program, mode)) = &iface.xdp else {
            continue;
        };
        if !ours(program) {
            continue;
        }
        let flags = if mode == "generic" {
            XDP_FLAGS_SKB_MODE
        } else {
            XDP_FLAGS_DRV_MODE
        };
        let message = rtnetlink::LinkUnspec::new_with_index(iface.index)
            .append_extra_attribute(LinkAttribute::Xdp(vec![
                LinkXdp::Fd(-1),
                LinkXdp::Flags(flags),
            ]))
            .build();
        match handle.link().set(message).execute().await {
            Ok(()) => report.xdp_detached.push(iface.name.clone()),
            Err(e) => report
                .errors
                .push(format!("detaching XDP {program} from {}: {e}", iface.name)),
        }
    }
}

/// Unpins switchboard's maps and the format stamp (nothing else under the
/// pin root is touched) and removes the directory when it is empty and not a mount point.
fn unpin_maps(pin_root: &Path, report: &mut CleanupReport) {
    let Ok(entries) = fs::read_dir(pin_root) else {
        report.pin_dir_note = Some("no pin directory".into());
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(names::ALL.contains(&name.as_str()) || name.starts_with("SB_")) {
            continue;
        }
        match fs::remove_file(entry.path()) {
            // The format stamp is no map.
            Ok(()) if crate::dataplane::pins::format::is_stamp(&name) => {}
            Ok(()) => report.maps_unpinned.push(name),
            Err(e) => report
                .errors
                .push(format!("unpinning {}: {e}", entry.path().display())),
        }
    }
    report.maps_unpinned.sort();
    match fs::remove_dir(pin_root) {
        Ok(()) => report.pin_dir_removed = true,
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            report.pin_dir_note = Some("a bpffs mount point: left mounted, empty".into());
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
            report.pin_dir_note =
                Some("holds files that are not switchboard's: left in place".into());
        }
        Err(e) => report
            .errors
            .push(format!("removing {}: {e}", pin_root.display())),
    }
}

pub fn render(r: &CleanupReport) -> String {
    let mut out = String::new();
    let list = |v: &[String]| {
        if v.is_empty() {
            "none".to_owned()
        } else {
            v.join(", ")
        }
    };
    let _ = writeln!(out, "Pin root:          {}", r.pin_root);
    let _ = writeln!(
        out,
        "Links unpinned:    {} ({})",
        r.links_unpinned.len(),
        list(&r.links_unpinned)
    );
    let _ = writeln!(out, "Filters removed:   {}", list(&r.filters_removed));
    let _ = writeln!(out, "XDP detached:      {}", list(&r.xdp_detached));
    let _ = writeln!(out, "Maps unpinned:     {}", r.maps_unpinned.len());
    let dir = match (r.pin_dir_removed, &r.pin_dir_note) {
        (true, _) => "removed".to_owned(),
        (false, Some(note)) => note.clone(),
        (false, None) => "kept".to_owned(),
    };
    let _ = writeln!(out, "Pin directory:     {dir}");
    let _ = writeln!(
        out,
        "Status file:       {}",
        if r.status_file_removed {
            "removed"
        } else {
            "none"
        }
    );
    if let Some(k) = &r.kube_proxy {
        let _ = writeln!(out, "kube-proxy chains: {}", list(&k.iptables_chains));
        let _ = writeln!(out, "kube-proxy nft:    {}", list(&k.nft_tables));
        for e in &k.errors {
            let _ = writeln!(out, "  error: {e}");
        }
    }
    let _ = writeln!(out, "Still attached:    {}", list(&r.still_attached));
    for e in &r.errors {
        let _ = writeln!(out, "error: {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_switchboard_programs_count_as_leftovers() {
        let mut a = hooks::IfaceHooks {
            name: "veth1".into(),
            tcx_ingress: vec!["cilium_x".into()],
            ..Default::default()
        };
        assert!(leftovers(std::slice::from_ref(&a)).is_empty());
        a.xdp = Some(("sb_xdp_uplink".into(), "native".into()));
        assert_eq!(
            leftovers(&[a]),
            ["veth1: tcx ingress cilium_x, xdp native sb_xdp_uplink"]
        );
    }

    #[test]
    fn the_report_reads_as_a_list() {
        let r = CleanupReport {
            pin_root: "/run/x/bpf".into(),
            links_unpinned: vec!["tcx_4_sb_from_pod".into()],
            maps_unpinned: vec!["SB_FE_V1".into()],
            pin_dir_note: Some("a bpffs mount point: left mounted, empty".into()),
            ..CleanupReport::default()
        };
        let text = render(&r);
        assert!(
            text.contains("Links unpinned:    1 (tcx_4_sb_from_pod)"),
            "{text}"
        );
        assert!(
            text.contains("Pin directory:     a bpffs mount point"),
            "{text}"
        );
        assert!(text.contains("Still attached:    none"), "{text}");
    }
}
