//! `switchboard status`: one screen on the agent, what is attached, how
//! full the maps are, the last sync, and what is wrong.
use std::{fmt::Write as _, path::Path};

use proxy_common::{names, programs};
use serde::Serialize;

use super::{
    agent_process, hooks, read_stats,
    table::{human_duration, Table},
    AgentProcess, Common, Done, MapFill, Output,
};
use crate::{
    dataplane::attach::pods::UplinkXdp,
    dataplane::flows::quiet_pods::{self, QuietPods},
    dataplane::load::caps,
    dataplane::pins::format,
    dataplane::pins::memory::{self, MapMemory},
    dataplane::pins::Pins,
    observe::status::AgentStatus,
};

/// Maps whose running full loses Services (the LRU ones evict instead).
const NOT_LRU: [&str; 3] = [names::FRONTENDS, names::BACKENDS, names::REVNAT];
/// A non-LRU map this full is a problem.
const FULL_PERCENT: f64 = 90.0;

/// Everything `status` shows.
#[derive(Debug, Serialize)]
pub struct StatusReport {
    pub pin_root: String,
    pub agent: AgentProcess,
    /// The agent's status file, if one was ever written for this pin root.
    pub status: Option<AgentStatus>,
    pub uptime_s: Option<u64>,
    pub last_sync_age_s: Option<u64>,
    pub interfaces: Vec<InterfaceRow>,
    pub pinned_links: Vec<hooks::LinkPin>,
    /// `None` when no maps are pinned.
    pub maps: Option<Vec<MapFill>>,
    /// Why the maps could not be read, when the kernel refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maps_unreadable: Option<String>,
    /// Every pinned map's kernel memory (`None` when no maps are pinned or
    /// it could not be read).
    pub map_memory: Option<Vec<MapMemory>>,
    /// Why the maps' kernel memory could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub map_memory_unreadable: Option<String>,
    /// Why the programs on the interfaces could not be read, when the
    /// kernel refused: their state is then unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub programs_unreadable: Option<String>,
    /// The pin root's format and the pins this version does not use.
    pub layout: format::Layout,
    pub problems: Vec<String>,
}

/// One interface the agent attached to, or should have.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InterfaceRow {
    pub name: String,
    pub index: u32,
    /// `pod` or `uplink`.
    pub role: String,
    /// The hooks it should carry, e.g. `tcx ingress sb_from_pod`.
    pub expected: Vec<String>,
    /// What is attached there now.
    pub attached: String,
    /// Expected hooks that are not attached.
    pub missing: Vec<String>,
    /// The interface is no longer in this namespace.
    pub gone: bool,
    /// Its programs could not be read (see `programs_unreadable`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unknown: bool,
    /// For an uplink: the XDP mode the agent chose for it, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xdp: Option<UplinkXdp>,
    /// For a pod interface: the classes of protocol (`tcp`, `other`) its
    /// pod has no tc-translated flow of, whose packets into it `sb_to_pod`
    /// passes unread ([`crate::dataplane::flows::quiet_pods`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quiet: Vec<String>,
}

pub fn run(common: &Common) -> anyhow::Result<Done> {
    let report = gather(&common.pin_root)?;
    let failed = !report.problems.is_empty();
    let text = match common.output {
        Output::Json => super::to_json(&report)?,
        Output::Table => render(&report),
    };
    Ok(Done { text, failed })
}

fn gather(pin_root: &Path) -> anyhow::Result<StatusReport> {
    let status = crate::observe::status::read(pin_root);
    let agent = agent_process(pin_root, status.as_ref());
    let net = super::block_on(async {
        let mut handle = hooks::connect()?;
        hooks::inspect(&mut handle).await
    })??;
    let (maps, maps_unreadable) = match super::open_maps(pin_root) {
        Ok(maps) => (Some(maps), None),
        Err(error) => (None, maps_unreadable(&error)),
    };
    let fills = maps.as_ref().map(|m| read_stats(m).maps);
    let (map_memory, map_memory_unreadable) =
        match maps.as_ref().map(|_| memory::map_memory(pin_root)) {
            None => (None, None),
            Some(Ok(memory)) => (Some(memory), None),
            Some(Err(error)) => (None, Some(format!("{:#}", anyhow::Error::from(error)))),
        };
    let mut interfaces = if maps.is_some() || status.is_some() {
        interface_rows(status.as_ref(), &net.interfaces)
    } else {
        Vec::new()
    };
    if net.programs_unreadable.is_some() {
        mark_unknown(&mut interfaces);
    }
    read_quiet(&mut interfaces, pin_root);
    let now = super::now_unix_s();
    let mut report = StatusReport {
        pin_root: pin_root.display().to_string(),
        uptime_s: status
            .as_ref()
            .filter(|s| s.started_unix_s > 0 && agent.alive)
            .map(|s| now.saturating_sub(s.started_unix_s)),
        last_sync_age_s: status
            .as_ref()
            .filter(|s| s.last_sync_unix_s > 0)
            .map(|s| now.saturating_sub(s.last_sync_unix_s)),
        pinned_links: hooks::pinned_links(pin_root),
        agent,
        status,
        interfaces,
        maps: fills,
        maps_unreadable,
        map_memory,
        map_memory_unreadable,
        programs_unreadable: net.programs_unreadable,
        layout: format::layout(pin_root),
        problems: Vec::new(),
    };
    report.problems = problems(&report);
    Ok(report)
}

/// What to say when the maps could not be opened because the kernel
/// refused (EPERM or EACCES); `None` for any other cause (not pinned).
pub fn maps_unreadable(error: &crate::dataplane::pins::MapsError) -> Option<String> {
    caps::permission_denied(error)
        .then(|| "cannot read the pinned maps: permission denied (need CAP_BPF or root)".to_owned())
}

/// The programs of `rows` are unknown (the kernel would not tell them):
/// nothing is reported missing.
pub fn mark_unknown(rows: &mut [InterfaceRow]) {
    for row in rows.iter_mut().filter(|r| !r.gone) {
        row.missing.clear();
        row.unknown = true;
        row.attached = format!("(unknown: {})", hooks::CANNOT_INSPECT);
    }
}

/// The expected hooks of a pod interface.
fn pod_hooks() -> Vec<String> {
    vec![
        format!("tcx ingress {}", programs::TC_FROM_POD),
        format!("tcx egress {}", programs::TC_TO_POD),
    ]
}

/// The interfaces the agent says it attached to, and every pod interface
/// of this namespace, each with what it should carry and what it carries.
pub fn interface_rows(
    status: Option<&AgentStatus>,
    actual: &[hooks::IfaceHooks],
) -> Vec<InterfaceRow> {
    let listed = status.map(|s| s.interfaces.as_slice()).unwrap_or_default();
    let mut rows: Vec<InterfaceRow> = listed
        .iter()
        .map(|i| {
            let now = actual
                .iter()
                .find(|a| a.index == i.index && a.name == i.name);
            InterfaceRow {
                xdp: i.xdp.clone(),
                ..row(&i.name, i.index, &i.role, i.hooks.clone(), now)
            }
        })
        .collect();
    let uplink = |index: u32| {
        listed
            .iter()
            .any(|i| i.index == index && i.role == "uplink")
    };
    for iface in actual.iter().filter(|a| a.pod && !uplink(a.index)) {
        if rows.iter().any(|r| r.index == iface.index) {
            continue;
        }
        rows.push(row(
            &iface.name,
            iface.index,
            "pod",
            pod_hooks(),
            Some(iface),
        ));
    }
    rows.sort_by(|a, b| (a.role != "uplink", &a.name).cmp(&(b.role != "uplink", &b.name)));
    rows
}

fn row(
    name: &str,
    index: u32,
    role: &str,
    expected: Vec<String>,
    now: Option<&hooks::IfaceHooks>,
) -> InterfaceRow {
    let missing = match now {
        Some(iface) => expected
            .iter()
            .filter(|h| !hook_present(iface, h))
            .cloned()
            .collect(),
        None => Vec::new(),
    };
    InterfaceRow {
        name: name.to_owned(),
        index,
        role: role.to_owned(),
        attached: now.map_or_else(|| "(interface gone)".to_owned(), hooks::IfaceHooks::summary),
        expected,
        missing,
        gone: now.is_none(),
        unknown: false,
        xdp: None,
        quiet: Vec::new(),
    }
}

/// Fills in the quiet classes of each pod interface from the pinned marks
/// (left empty when they cannot be read).
fn read_quiet(rows: &mut [InterfaceRow], pin_root: &Path) {
    let Ok(quiet) = QuietPods::open(Pins::new(pin_root)) else {
        return;
    };
    for row in rows.iter_mut().filter(|r| r.role == "pod" && !r.gone) {
        row.quiet = quiet_pods::CLASSES
            .into_iter()
            .filter(|class| quiet.is_quiet(row.index, *class).unwrap_or(false))
            .map(|class| quiet_pods::class_name(class).to_owned())
            .collect();
    }
}

/// Whether a hook named as the status file names them (`tcx ingress
/// sb_from_pod`, `tc egress sb_to_pod`, `xdp native sb_xdp_uplink`) is
/// attached; TCX and netlink count alike (the agent falls back between them).
pub fn hook_present(iface: &hooks::IfaceHooks, hook: &str) -> bool {
    let words: Vec<&str> = hook.split_whitespace().collect();
    match words.as_slice() {
        ["xdp", _, program] => iface.has_xdp(program),
        ["tcx" | "tc", "ingress", program] => iface.has_tc(program, true),
        ["tcx" | "tc", "egress", program] => iface.has_tc(program, false),
        _ => true,
    }
}

fn problems(report: &StatusReport) -> Vec<String> {
    let mut found = Vec::new();
    match (&report.status, report.agent.alive) {
        (_, true) => {}
        (None, false) => found.push(format!(
            "no agent runs for pin root {} (no lock held, no status file): start `switchboard agent`",
            report.pin_root
        )),
        (Some(_), false) => found.push(format!(
            "the agent (pid {}) is not running: the programs keep forwarding with the pinned maps, but nothing follows Service changes; start it again",
            report.agent.pid.unwrap_or(0)
        )),
    }
    if let Some(why) = &report.programs_unreadable {
        found.push(format!(
            "{why}: the programs on the interfaces are not checked; run `switchboard status` as root"
        ));
    }
    match (&report.maps, &report.maps_unreadable) {
        (Some(_), _) => {}
        (None, Some(why)) => found.push(format!("{why}: run `switchboard status` as root")),
        (None, None) => found.push(format!(
            "no switchboard maps are pinned under {}",
            report.pin_root
        )),
    }
    for p in format::problems(&report.layout, std::path::Path::new(&report.pin_root)) {
        found.push(format!("{}: {}", p.what, p.fix));
    }
    for m in report.maps.iter().flatten() {
        let percent = fill_percent(m);
        if NOT_LRU.contains(&m.map) && percent >= FULL_PERCENT {
            found.push(format!(
                "map {} is {percent:.0}% full ({} of {}): raise its capacity (agent --max-* flags)",
                m.map, m.entries, m.capacity
            ));
        }
        if (m.map == names::CONNTRACK || m.map == names::CONNTRACK6) && percent >= FULL_PERCENT {
            found.push(format!(
                "map {} is {percent:.0}% full ({} of {}): when full, new flows are dropped (counter ct_full) until the agent expires old ones; raise --max-conntrack or shorten the --conntrack-* timeouts",
                m.map, m.entries, m.capacity
            ));
        }
    }
    for row in report.interfaces.iter().filter(|r| !r.missing.is_empty()) {
        found.push(format!(
            "{} ({}): not attached: {}",
            row.name,
            row.role,
            row.missing.join(", ")
        ));
    }
    if let Some(cgroup) = report
        .status
        .as_ref()
        .and_then(|s| s.socket_lb_cgroup.as_ref())
    {
        let missing = hooks::socket_layer_unattached(&report.pinned_links);
        if !missing.is_empty() {
            found.push(format!(
                "socket layer (cgroup {cgroup}): not attached: {}; the agent attaches them again within a few seconds (unless it runs with --repair-interval 0)",
                missing.join(", ")
            ));
        }
    }
    if let Some(status) = &report.status {
        for u in &status.unprogrammed {
            found.push(format!(
                "not programmed: {} {}: {}",
                u.service, u.frontend, u.reason
            ));
        }
        for w in &status.warnings {
            found.push(format!("input: {w}"));
        }
    }
    found
}

fn fill_percent(m: &MapFill) -> f64 {
    if m.capacity == 0 {
        0.0
    } else {
        m.entries as f64 * 100.0 / f64::from(m.capacity)
    }
}

pub fn render(report: &StatusReport) -> String {
    let mut out = String::new();
    render_agent(&mut out, report);
    let _ = writeln!(out, "\nINTERFACES");
    if report.interfaces.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let mut t = Table::new(&["NAME", "IFINDEX", "ROLE", "STATE", "QUIET", "ATTACHED"])
            .indent(2)
            .right(1);
        for r in &report.interfaces {
            let state = if r.gone {
                "gone".to_owned()
            } else if r.unknown {
                "unknown".to_owned()
            } else if r.missing.is_empty() {
                "ok".to_owned()
            } else {
                format!("MISSING {}", r.missing.join(", "))
            };
            let quiet = match (r.role.as_str(), r.quiet.is_empty()) {
                ("pod", true) => "-".to_owned(),
                _ => r.quiet.join(","),
            };
            t.push(vec![
                r.name.clone(),
                r.index.to_string(),
                r.role.clone(),
                state,
                quiet,
                r.attached.clone(),
            ]);
        }
        out.push_str(&t.render());
        for r in &report.interfaces {
            if let Some(xdp) = &r.xdp {
                let _ = writeln!(out, "  {} xdp: {} ({})", r.name, xdp.mode, xdp.reason);
            }
        }
    }
    let socket_hooks: Vec<&str> = report
        .pinned_links
        .iter()
        .filter(|l| l.kind == "cgroup")
        .map(|l| l.name.strip_prefix("sb_sock_").unwrap_or(&l.name))
        .collect();
    let _ = writeln!(
        out,
        "  pinned links: {} ({} socket-layer{})",
        report.pinned_links.len(),
        socket_hooks.len(),
        if socket_hooks.is_empty() {
            String::new()
        } else {
            format!(": {}", socket_hooks.join(" "))
        }
    );
    render_maps(&mut out, report);
    let _ = writeln!(out, "\nPROBLEMS ({})", report.problems.len());
    if report.problems.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for p in &report.problems {
        let _ = writeln!(out, "  - {p}");
    }
    out
}

fn render_agent(out: &mut String, report: &StatusReport) {
    let agent = &report.agent;
    let state = match (agent.alive, agent.pid) {
        (true, Some(pid)) => format!("running (pid {pid})"),
        (false, Some(pid)) => format!("NOT RUNNING (last pid {pid})"),
        _ => "NOT RUNNING (never ran with this pin root)".to_owned(),
    };
    let mut t = Table::new(&["", ""]);
    t.push(vec!["Agent:".into(), state]);
    if let Some(s) = &report.status {
        let or_dash = |v: &str| {
            if v.is_empty() {
                "-".to_owned()
            } else {
                v.to_owned()
            }
        };
        t.push(vec!["Version:".into(), or_dash(&s.version)]);
        t.push(vec![
            "Uptime:".into(),
            report
                .uptime_s
                .map_or("-".into(), |u| human_duration(u as f64)),
        ]);
        t.push(vec!["Source:".into(), or_dash(&s.source)]);
        t.push(vec!["Node:".into(), or_dash(&s.node_name)]);
        t.push(vec![
            "Proxy name:".into(),
            s.proxy_name.clone().unwrap_or_else(|| "-".into()),
        ]);
        t.push(vec!["LB algorithm:".into(), or_dash(&s.lb_algorithm)]);
        let nodeport_mode = match s.nodeport_mode.as_str() {
            "" => "snat",
            mode => mode,
        };
        t.push(vec!["NodePort mode:".into(), nodeport_mode.into()]);
        let checksums = match s.l4_checksums.as_str() {
            "" => crate::dataplane::load::ip_summed::HELPER_DESCRIPTION,
            how => how,
        };
        t.push(vec!["L4 checksums:".into(), checksums.into()]);
        let sync = match report.last_sync_age_s {
            Some(age) => format!(
                "{} ago, took {:.1} ms; {} frontends desired, {} not programmed",
                human_duration(age as f64),
                s.last_sync_us as f64 / 1e3,
                s.frontends_desired,
                s.unprogrammed.len()
            ),
            None => "-".into(),
        };
        t.push(vec!["Last sync:".into(), sync]);
        t.push(vec![
            "Repairs:".into(),
            repairs_line(&s.repairs, super::now_unix_s()),
        ]);
        t.push(vec![
            "Socket LB:".into(),
            s.socket_lb_cgroup
                .clone()
                .map_or("off".into(), |c| format!("cgroup {c}")),
        ]);
        t.push(vec!["Healthz:".into(), or_dash(&s.healthz_bind)]);
        t.push(vec!["Metrics:".into(), or_dash(&s.metrics_bind)]);
    }
    t.push(vec!["Pin root:".into(), report.pin_root.clone()]);
    // The header row is empty: skip it.
    for line in t.render().lines().skip(1) {
        let _ = writeln!(out, "{line}");
    }
}

/// `3, last 12s ago (maps: 10.96.0.10:53/UDP slot 0: missing); checked 2s ago`.
pub fn repairs_line(r: &crate::observe::status::Repairs, now: u64) -> String {
    if !r.enabled {
        return "off (--repair-interval 0): drift is reported, not repaired".into();
    }
    let ago = |t: u64| human_duration(now.saturating_sub(t) as f64);
    let last = match &r.last {
        Some(l) => format!(", last {} ago ({}: {})", ago(l.unix_s), l.kind, l.what),
        None => String::new(),
    };
    let checked = match r.last_check_unix_s {
        0 => String::new(),
        t => format!("; maps and pins checked {} ago", ago(t)),
    };
    format!("{}{last}{checked}", r.count)
}

fn render_maps(out: &mut String, report: &StatusReport) {
    let _ = writeln!(out, "\nMAPS");
    let Some(maps) = &report.maps else {
        let _ = writeln!(out, "  (not pinned)");
        return;
    };
    let mut t = Table::new(&["MAP", "ENTRIES", "CAPACITY", "FULL"])
        .indent(2)
        .right(1)
        .right(2)
        .right(3);
    for m in maps {
        t.push(vec![
            m.map.to_owned(),
            m.entries.to_string(),
            m.capacity.to_string(),
            format!("{:.1}%", fill_percent(m)),
        ]);
    }
    out.push_str(&t.render());
    render_memory(
        out,
        report.map_memory.as_deref(),
        report.map_memory_unreadable.as_deref(),
        report.status.as_ref().map(|s| &s.flow_table_max),
    );
}

/// Every map's capacity and kernel memory, and the totals (or why there
/// are none); for the flow tables that grow, the most each may hold
/// (`grows_to`, from the agent's status file).
fn render_memory(
    out: &mut String,
    memory: Option<&[MapMemory]>,
    unreadable: Option<&str>,
    grows_to: Option<&std::collections::BTreeMap<String, u32>>,
) {
    let _ = writeln!(out, "\nKERNEL MEMORY OF THE MAPS");
    let Some(memory) = memory else {
        let _ = writeln!(out, "  ({})", unreadable.unwrap_or("not pinned"));
        return;
    };
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / 1_048_576.0);
    let mut t = Table::new(&["MAP", "CAPACITY", "GROWS TO", "MEMORY"])
        .indent(2)
        .right(1)
        .right(2)
        .right(3);
    for m in memory {
        let max = grows_to
            .and_then(|g| g.get(&m.map))
            .map(u32::to_string)
            .unwrap_or_default();
        t.push(vec![
            m.map.clone(),
            m.max_entries.to_string(),
            max,
            mib(m.bytes),
        ]);
    }
    let (total, ipv6) = memory::totals(memory);
    t.push(vec![
        "total".into(),
        String::new(),
        String::new(),
        mib(total),
    ]);
    t.push(vec![
        "of which IPv6 maps".into(),
        String::new(),
        String::new(),
        mib(ipv6),
    ]);
    out.push_str(&t.render());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::attach::pods::AttachedInterface;

    fn iface(name: &str, index: u32, pod: bool) -> hooks::IfaceHooks {
        hooks::IfaceHooks {
            name: name.into(),
            index,
            pod,
            ..Default::default()
        }
    }

    #[test]
    fn a_pod_veth_without_programs_is_missing_both_and_an_uplink_its_xdp() {
        let mut p1 = iface("p1", 4, true);
        p1.tcx_ingress = vec!["sb_from_pod".into()];
        p1.tcx_egress = vec!["sb_to_pod".into()];
        let p2 = iface("p2", 5, true);
        let mut up = iface("eth0", 2, false);
        up.tc_ingress = vec!["sb_from_uplink".into()];
        up.tc_egress = vec!["sb_to_pod".into()];
        let status = AgentStatus {
            interfaces: vec![AttachedInterface {
                name: "eth0".into(),
                index: 2,
                role: "uplink".into(),
                hooks: vec![
                    "tc ingress sb_from_uplink".into(),
                    "tc egress sb_to_pod".into(),
                    "xdp native sb_xdp_uplink".into(),
                ],
                xdp: Some(UplinkXdp {
                    mode: "native".into(),
                    reason: "auto: native XDP in the driver".into(),
                }),
            }],
            ..AgentStatus::default()
        };
        let rows = interface_rows(Some(&status), &[p1, p2, up, iface("lo", 1, false)]);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["eth0", "p1", "p2"]);
        assert_eq!(rows[0].missing, ["xdp native sb_xdp_uplink"]);
        assert_eq!(
            rows[0].xdp.as_ref().map(|x| x.mode.as_str()),
            Some("native")
        );
        assert!(rows[1].xdp.is_none());
        let report = StatusReport {
            pin_root: "/p".into(),
            agent: AgentProcess {
                pid: None,
                alive: false,
                evidence: "none",
            },
            status: None,
            uptime_s: None,
            last_sync_age_s: None,
            interfaces: rows.clone(),
            pinned_links: Vec::new(),
            maps: None,
            maps_unreadable: None,
            map_memory: None,
            map_memory_unreadable: None,
            programs_unreadable: None,
            layout: format::Layout::default(),
            problems: Vec::new(),
        };
        let text = render(&report);
        assert!(
            text.contains("eth0 xdp: native (auto: native XDP in the driver)"),
            "{text}"
        );
        assert!(rows[1].missing.is_empty());
        assert_eq!(rows[2].missing.len(), 2);
    }

    #[test]
    fn kernel_memory_lists_every_map_with_the_totals() {
        let m = |map: &str, max_entries, bytes| MapMemory {
            map: map.into(),
            max_entries,
            bytes,
        };
        let maps = [
            m(names::CONNTRACK, 262_144, 3 * 1_048_576),
            m(names::CONNTRACK6, 262_144, 5 * 1_048_576),
            m(names::SOCKETS, 4096, 0),
        ];
        let grows_to = [(names::SOCKETS.to_owned(), 524_288)].into_iter().collect();
        let mut out = String::new();
        render_memory(&mut out, Some(&maps), None, Some(&grows_to));
        let line = |start: &str| out.lines().find(|l| l.trim_start().starts_with(start));
        assert!(
            line(names::CONNTRACK6).is_some_and(|l| l.contains("5.0 MiB")),
            "{out}"
        );
        let words = |start: &str| {
            line(start).map_or(Vec::new(), |l| {
                l.split_whitespace().map(str::to_owned).collect::<Vec<_>>()
            })
        };
        assert_eq!(
            words(names::SOCKETS),
            [names::SOCKETS, "4096", "524288", "0.0", "MiB"],
            "a growing table says how far it grows:\n{out}"
        );
        assert_eq!(words(names::CONNTRACK)[2], "3.0", "{out}");
        assert!(
            line("total").is_some_and(|l| l.contains("8.0 MiB")),
            "{out}"
        );
        assert!(
            line("of which IPv6").is_some_and(|l| l.contains("5.0 MiB")),
            "{out}"
        );
        let mut out = String::new();
        render_memory(&mut out, None, Some("permission denied"), None);
        assert!(out.contains("(permission denied)"), "{out}");
    }

    #[test]
    fn the_table_names_the_problems() {
        let report = StatusReport {
            pin_root: "/sys/fs/bpf/switchboard".into(),
            agent: AgentProcess {
                pid: Some(42),
                alive: false,
                evidence: "status file",
            },
            status: Some(AgentStatus {
                pid: 42,
                source: "dir:/m".into(),
                ..AgentStatus::default()
            }),
            uptime_s: None,
            last_sync_age_s: Some(3),
            interfaces: Vec::new(),
            pinned_links: Vec::new(),
            maps: Some(vec![MapFill {
                map: names::FRONTENDS,
                entries: 95,
                capacity: 100,
            }]),
            maps_unreadable: None,
            map_memory: None,
            map_memory_unreadable: None,
            programs_unreadable: None,
            layout: format::Layout::default(),
            problems: Vec::new(),
        };
        let problems = problems(&report);
        assert!(
            problems[0].contains("pid 42) is not running"),
            "{problems:?}"
        );
        assert!(problems[1].contains("95% full"), "{problems:?}");
        let report = StatusReport { problems, ..report };
        let text = render(&report);
        assert!(text.contains("NOT RUNNING (last pid 42)"), "{text}");
        assert!(text.contains("Source:         dir:/m"), "{text}");
        assert!(text.contains("PROBLEMS (2)"), "{text}");
    }

    /// With a pod's capabilities (no CAP_SYS_ADMIN) the kernel
    /// refuses to list programs. The interfaces are unknown, not MISSING,
    /// and nothing advises a restart.
    #[test]
    fn a_refused_program_listing_reads_as_cannot_inspect() {
        let refused = aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_prog_get_next_id",
            io_error: std::io::Error::from_raw_os_error(libc::EPERM),
        });
        // What the refused listing leaves: a pod veth and an uplink with no
        // program names.
        let status = AgentStatus {
            pid: 42,
            interfaces: vec![AttachedInterface {
                name: "eth0".into(),
                index: 2,
                role: "uplink".into(),
                hooks: vec!["xdp native sb_xdp_uplink".into()],
                xdp: None,
            }],
            ..AgentStatus::default()
        };
        let mut rows = interface_rows(
            Some(&status),
            &[iface("p1", 4, true), iface("eth0", 2, false)],
        );
        assert!(
            rows.iter().all(|r| !r.missing.is_empty()),
            "as it was: every interface missing"
        );
        mark_unknown(&mut rows);
        let report = StatusReport {
            pin_root: "/sys/fs/bpf/switchboard".into(),
            agent: AgentProcess {
                pid: Some(42),
                alive: true,
                evidence: "lock",
            },
            status: Some(status),
            uptime_s: None,
            last_sync_age_s: None,
            interfaces: rows,
            pinned_links: Vec::new(),
            maps: Some(Vec::new()),
            maps_unreadable: None,
            map_memory: None,
            map_memory_unreadable: None,
            programs_unreadable: hooks::unreadable(&refused),
            layout: format::Layout::default(),
            problems: Vec::new(),
        };
        let found = problems(&report);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("cannot inspect: permission denied (need CAP_SYS_ADMIN or root)"),
            "{found:?}"
        );
        assert!(!found[0].contains("restart"), "{found:?}");
        let text = render(&StatusReport {
            problems: found,
            ..report
        });
        assert!(!text.contains("MISSING"), "{text}");
        assert!(text.contains("unknown"), "{text}");
        // Unprivileged: the maps cannot be opened either.
        let denied = crate::dataplane::pins::MapsError::Open {
            name: names::FRONTENDS,
            path: "/sys/fs/bpf/switchboard/SB_FE_V1".into(),
            source: Box::new(aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                call: "BPF_OBJ_GET",
                io_error: std::io::Error::from_raw_os_error(libc::EACCES),
            })),
        };
        let why = maps_unreadable(&denied).expect("a permission error");
        assert!(why.contains("permission denied"), "{why}");
        let absent = crate::dataplane::pins::MapsError::NotPinned {
            name: names::FRONTENDS,
            path: "/x/SB_FE_V1".into(),
        };
        assert_eq!(maps_unreadable(&absent), None);
    }

    /// Pins of another layout and stale resize pins are problems.
    #[test]
    fn pins_of_another_layout_are_problems() {
        let report = StatusReport {
            pin_root: "/sys/fs/bpf/switchboard".into(),
            agent: AgentProcess {
                pid: Some(42),
                alive: true,
                evidence: "lock",
            },
            status: Some(AgentStatus::default()),
            uptime_s: None,
            last_sync_age_s: None,
            interfaces: Vec::new(),
            pinned_links: Vec::new(),
            maps: Some(Vec::new()),
            maps_unreadable: None,
            map_memory: None,
            map_memory_unreadable: None,
            programs_unreadable: None,
            layout: format::Layout {
                format: Some(format::FORMAT),
                maps_pinned: true,
                unknown: vec!["SB_CT_V2".into(), "SB_STATS_V1".into()],
                staging: vec!["SB_CT_V5_resize".into()],
                ..format::Layout::default()
            },
            problems: Vec::new(),
        };
        let found = problems(&report);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("SB_CT_V2, SB_STATS_V1"), "{found:?}");
        assert!(found[1].contains("SB_CT_V5_resize"), "{found:?}");
    }

    /// An agent of this version attaches the IPv6 socket hooks too: a pin
    /// root holding only the IPv4 ones (an older agent's) is a problem, and
    /// the pinned hooks are listed by name.
    #[test]
    fn missing_socket_layer_links_are_a_problem_and_the_hooks_are_listed() {
        let pin = |name: &str| hooks::LinkPin {
            name: name.into(),
            path: std::path::PathBuf::from("/sys/fs/bpf/switchboard/links").join(name),
            kind: "cgroup",
            index: None,
            detached: false,
        };
        let v4_only: Vec<hooks::LinkPin> = [
            programs::SOCK_CONNECT4,
            programs::SOCK_SENDMSG4,
            programs::SOCK_RECVMSG4,
            programs::SOCK_GETPEERNAME4,
            programs::SOCK_RELEASE,
        ]
        .into_iter()
        .map(pin)
        .collect();
        let report = StatusReport {
            pin_root: "/sys/fs/bpf/switchboard".into(),
            agent: AgentProcess {
                pid: Some(42),
                alive: true,
                evidence: "lock",
            },
            status: Some(AgentStatus {
                pid: 42,
                socket_lb_cgroup: Some("/sys/fs/cgroup".into()),
                ..AgentStatus::default()
            }),
            uptime_s: None,
            last_sync_age_s: None,
            interfaces: Vec::new(),
            pinned_links: v4_only,
            maps: Some(Vec::new()),
            maps_unreadable: None,
            map_memory: None,
            map_memory_unreadable: None,
            programs_unreadable: None,
            layout: format::Layout::default(),
            problems: Vec::new(),
        };
        let found = problems(&report);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("not attached: sb_sock_getpeername6, sb_sock_recvmsg6, sb_sock_sendmsg6, sb_sock_connect6"),
            "{found:?}"
        );
        let all: Vec<hooks::LinkPin> = crate::dataplane::attach::socket_layer::all_programs()
            .map(pin)
            .collect();
        let mut report = StatusReport {
            pinned_links: all,
            ..report
        };
        assert!(problems(&report).is_empty(), "{:?}", problems(&report));
        // A link detached behind its pin runs no more: as good as missing.
        report.pinned_links[0].detached = true;
        let found = problems(&report);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains(&format!(
                "not attached: {} (detached, pin kept)",
                report.pinned_links[0].name
            )),
            "{found:?}"
        );
        report.pinned_links[0].detached = false;
        let text = render(&report);
        assert!(text.contains("pinned links: 9 (9 socket-layer: "), "{text}");
        assert!(text.contains("connect6"), "{text}");
        let report = StatusReport {
            status: Some(AgentStatus::default()),
            pinned_links: Vec::new(),
            ..report
        };
        assert!(
            problems(&report).is_empty(),
            "socket layer off: nothing missing"
        );
    }
}
