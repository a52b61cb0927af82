//! `switchboard doctor`: the four causes every kube-proxy troubleshooting
//! guide lists for "my Service does not answer", each checked and, when it
//! applies, explained with what to do:
//!
//! 1. a Service without endpoints (from the maps);
//! 2. a selector that matches no Pod (asked of the API server; a `dir:`
//!    source knows no Pods, so the check is skipped there);
//! 3. the proxy not running (the agent lock, else the status file's pid);
//! 4. rules missing: programs not attached where they should be, maps that
//!    differ from the model rebuilt from the agent's source, and (with an
//!    agent running) the agent's own comparison of the maps with its desired
//!    state (`switchboard verify`);
//!
//! and kube-proxy's leftovers, which would handle Service traffic before or
//! instead of switchboard.
use std::{collections::BTreeSet, fmt::Write as _, path::PathBuf};

use serde::Serialize;

use super::{
    agent_process, desired, hooks, kube_proxy, read_services, status::interface_rows, Common, Done,
    Output, ServiceRow,
};
use crate::{dataplane::pins::format, observe::status::AgentStatus};

/// At most this many Services get a Pod lookup (one list call each).
const MAX_SELECTOR_LOOKUPS: usize = 50;

/// How a check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Ok,
    Problem,
    Skipped,
}

/// One check and what it found.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub state: State,
    /// One line: what was looked at, or why it was skipped.
    pub detail: String,
    pub findings: Vec<Finding>,
}

/// Something wrong, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub what: String,
    pub fix: String,
}

impl Check {
    fn new(name: &'static str, detail: impl Into<String>, findings: Vec<Finding>) -> Self {
        Self {
            name,
            state: if findings.is_empty() {
                State::Ok
            } else {
                State::Problem
            },
            detail: detail.into(),
            findings,
        }
    }

    fn skipped(name: &'static str, why: impl Into<String>) -> Self {
        Self {
            name,
            state: State::Skipped,
            detail: why.into(),
            findings: Vec::new(),
        }
    }
}

pub fn run(common: &Common, kubeconfig: Option<PathBuf>) -> anyhow::Result<Done> {
    let checks = super::block_on(checks(common, kubeconfig))??;
    let failed = checks.iter().any(|c| c.state == State::Problem);
    let text = match common.output {
        Output::Json => super::to_json(&checks)?,
        Output::Table => render(&checks),
    };
    Ok(Done { text, failed })
}

async fn checks(common: &Common, kubeconfig: Option<PathBuf>) -> anyhow::Result<Vec<Check>> {
    let pin_root = &common.pin_root;
    let status = crate::observe::status::read(pin_root);
    let (maps, maps_unreadable) = match super::open_maps(pin_root) {
        Ok(maps) => (Some(maps), None),
        Err(error) => (None, super::status::maps_unreadable(&error)),
    };
    let rows = maps.as_ref().map(read_services);
    let mut handle = hooks::connect()?;
    let net = hooks::inspect(&mut handle).await?;
    let mut checks = vec![agent_check(pin_root, status.as_ref())];
    checks.push(pin_root_check(
        pin_root,
        &format::layout(pin_root),
        maps_unreadable,
    ));
    checks.push(endpoints_check(rows.as_deref()));
    let source = Source::open(status.as_ref(), kubeconfig.as_ref()).await;
    checks.push(selector_check(&source, rows.as_deref()).await);
    checks.push(attach_check(
        status.as_ref(),
        maps.is_some(),
        &net,
        &hooks::pinned_links(pin_root),
    ));
    checks.push(maps_check(&source, status.as_ref(), rows.as_deref()));
    checks.push(verify_check(pin_root, status.as_ref()));
    let names: Vec<String> = net.interfaces.iter().map(|i| i.name.clone()).collect();
    checks.push(kube_proxy_check(&kube_proxy::find(&names)));
    Ok(checks)
}

/// The agent's source, opened once for the checks that need it.
enum Source {
    /// No status file, or a source this CLI does not know.
    None(String),
    Dir(Result<desired::Inputs, String>),
    Cluster(Result<(kube::Client, desired::Inputs), String>),
}

impl Source {
    async fn open(status: Option<&AgentStatus>, kubeconfig: Option<&PathBuf>) -> Self {
        let Some(status) = status else {
            return Self::None("no status file: the agent's source is unknown".into());
        };
        match desired::source_kind(status) {
            desired::SourceKind::Dir(dir) => {
                Self::Dir(desired::read_dir(&dir, &status.node_name).map_err(|e| format!("{e:#}")))
            }
            desired::SourceKind::Cluster => Self::Cluster(Self::cluster(status, kubeconfig).await),
            desired::SourceKind::Unknown(s) => Self::None(format!("unknown source {s:?}")),
        }
    }

    async fn cluster(
        status: &AgentStatus,
        kubeconfig: Option<&PathBuf>,
    ) -> Result<(kube::Client, desired::Inputs), String> {
        let client = desired::client(kubeconfig, status)
            .await
            .map_err(|e| format!("{e:#}"))?;
        let inputs = desired::list_cluster(&client, &status.node_name)
            .await
            .map_err(|e| format!("listing from the API server: {e:#}"))?;
        Ok((client, inputs))
    }

    fn inputs(&self) -> Result<&desired::Inputs, String> {
        match self {
            Self::None(why) => Err(why.clone()),
            Self::Dir(r) => r.as_ref().map_err(Clone::clone),
            Self::Cluster(r) => r.as_ref().map(|(_, i)| i).map_err(Clone::clone),
        }
    }
}

fn agent_check(pin_root: &std::path::Path, status: Option<&AgentStatus>) -> Check {
    let agent = agent_process(pin_root, status);
    let name = "agent running";
    match (agent.alive, agent.pid) {
        (true, Some(pid)) => Check::new(name, format!("pid {pid} ({})", agent.evidence), Vec::new()),
        (false, Some(pid)) => Check::new(
            name,
            format!("pid {pid} (status file) is gone"),
            vec![Finding {
                what: format!("the agent (pid {pid}) is not running: what is programmed keeps forwarding, but no Service or endpoint change reaches the maps"),
                fix: "start it again (DaemonSet: `kubectl -n kube-system rollout status ds/switchboard` and its logs; standalone: `switchboard agent --source ...`)".into(),
            }],
        ),
        _ => Check::new(
            name,
            "no lock holder and no status file",
            vec![Finding {
                what: format!("no agent has run with pin root {}", pin_root.display()),
                fix: "start `switchboard agent` (or pass the --pin-root it uses)".into(),
            }],
        ),
    }
}

/// Services whose frontends have no backend (traffic is rejected), and
/// `externalTrafficPolicy: Local` frontends with none on this node.
pub fn endpoints_check(rows: Option<&[ServiceRow]>) -> Check {
    let name = "Services have endpoints";
    let Some(rows) = rows else {
        return Check::skipped(name, "no maps pinned");
    };
    let mut findings = Vec::new();
    let mut seen = BTreeSet::new();
    for r in rows.iter().filter(|r| r.backends.is_empty()) {
        if seen.insert(r.service.clone()) {
            let (ns, svc) = split_service(&r.service);
            findings.push(Finding {
                what: format!("{} ({}/{}) has no endpoints: connections are refused", r.service, super::services::host_port(&r.address, r.port), r.protocol),
                fix: format!("`kubectl -n {ns} get endpointslices -l kubernetes.io/service-name={svc}`: are its Pods running and ready (readiness probe), and does its targetPort match their port?"),
            });
        }
    }
    for r in rows.iter().filter(|r| {
        !r.backends.is_empty() && r.external_backends.as_ref().is_some_and(Vec::is_empty)
    }) {
        findings.push(Finding {
            what: format!("{} ({}/{}): externalTrafficPolicy Local and no endpoint on this node: traffic from outside is dropped here", r.service, super::services::host_port(&r.address, r.port), r.protocol),
            fix: "send outside traffic only to nodes that run an endpoint (the load balancer's health check on healthCheckNodePort does that), or use externalTrafficPolicy: Cluster".into(),
        });
    }
    Check::new(name, format!("{} frontends", rows.len()), findings)
}

/// `ns/name:port` → (`ns`, `name`).
fn split_service(service: &str) -> (&str, &str) {
    let without_port = service.split(':').next().unwrap_or(service);
    without_port
        .split_once('/')
        .unwrap_or(("default", without_port))
}

/// For each Service without endpoints that has a selector: how many Pods
/// it matches (none, or none ready).
async fn selector_check(source: &Source, rows: Option<&[ServiceRow]>) -> Check {
    let name = "selectors match Pods";
    let (client, inputs) = match source {
        Source::Dir(_) => return Check::skipped(
            name,
            "standalone mode (dir: source) knows no Pods: EndpointSlices come from the manifests",
        ),
        Source::None(why) => return Check::skipped(name, why.clone()),
        Source::Cluster(Err(e)) => {
            return Check::skipped(name, format!("API server not reachable: {e}"))
        }
        Source::Cluster(Ok((client, inputs))) => (client, inputs),
    };
    let empty: BTreeSet<(String, String)> = rows
        .unwrap_or_default()
        .iter()
        .filter(|r| r.backends.is_empty())
        .map(|r| {
            let (ns, svc) = split_service(&r.service);
            (ns.to_owned(), svc.to_owned())
        })
        .collect();
    let mut findings = Vec::new();
    let mut looked = 0;
    for svc in &inputs.services {
        let ns = svc.metadata.namespace.clone().unwrap_or_default();
        let svc_name = svc.metadata.name.clone().unwrap_or_default();
        let Some(selector) = svc
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .filter(|s| !s.is_empty())
        else {
            continue;
        };
        if !empty.contains(&(ns.clone(), svc_name.clone())) || looked >= MAX_SELECTOR_LOOKUPS {
            continue;
        }
        looked += 1;
        let shown: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let shown = shown.join(",");
        match desired::matching_pods(client, &ns, &selector).await {
            Ok((0, _)) => findings.push(Finding {
                what: format!("Service {ns}/{svc_name}: selector {shown} matches no Pod in namespace {ns}"),
                fix: format!("compare with the Pods' labels (`kubectl -n {ns} get pods --show-labels`) and fix the selector or the labels"),
            }),
            Ok((total, 0)) => findings.push(Finding {
                what: format!("Service {ns}/{svc_name}: selector {shown} matches {total} Pod(s), none ready"),
                fix: format!("`kubectl -n {ns} describe pods -l {shown}`: readiness probe, crash loop, or not scheduled"),
            }),
            Ok(_) => {}
            Err(e) => findings.push(Finding {
                what: format!("Service {ns}/{svc_name}: listing its Pods failed: {e:#}"),
                fix: "check that the kubeconfig may list pods (RBAC)".into(),
            }),
        }
    }
    Check::new(
        name,
        format!("{looked} Service(s) without endpoints looked up"),
        findings,
    )
}

/// The pin root: its format against this binary's, pins of other
/// layouts, stale resize pins, and whether its maps can be read at all.
fn pin_root_check(
    pin_root: &std::path::Path,
    layout: &format::Layout,
    maps_unreadable: Option<String>,
) -> Check {
    let name = "pin root layout";
    let mut findings: Vec<Finding> = format::problems(layout, pin_root)
        .into_iter()
        .map(|p| Finding {
            what: p.what,
            fix: p.fix,
        })
        .collect();
    if let Some(why) = maps_unreadable {
        findings.push(Finding {
            what: why,
            fix: "run `switchboard doctor` as root".into(),
        });
    }
    let detail = match layout.format {
        Some(format) => format!("format {format} (this binary: {})", format::FORMAT),
        None => format!("no format stamp (this binary: format {})", format::FORMAT),
    };
    Check::new(name, detail, findings)
}

/// What to do about a program not attached.
const REATTACH_FIX: &str = "the agent attaches it again within a few seconds (unless it runs with --repair-interval 0); if it stays missing, the agent's log says what is in the way (restart the agent, after `switchboard cleanup` if another tool replaced its programs)";

/// Pod interfaces and uplinks without the programs they should carry, and
/// socket-layer programs not on the agent's cgroup (`pins`: the pinned
/// links), as `status` and the agent's repair see them.
fn attach_check(
    status: Option<&AgentStatus>,
    maps: bool,
    net: &hooks::NetView,
    pins: &[hooks::LinkPin],
) -> Check {
    let name = "programs attached";
    if status.is_none() && !maps {
        return Check::skipped(name, "no agent has run here");
    }
    if let Some(why) = &net.programs_unreadable {
        // The kernel would not tell which programs run where: nothing is
        // known to be missing, and a restart would not help.
        return Check::new(
            name,
            why.clone(),
            vec![Finding {
                what: format!("{why}: the programs on the interfaces are not checked"),
                fix: "run `switchboard doctor` as root (listing the kernel's programs needs CAP_SYS_ADMIN)".into(),
            }],
        );
    }
    let rows = interface_rows(status, &net.interfaces);
    let mut findings: Vec<Finding> = rows
        .iter()
        .filter(|r| !r.missing.is_empty())
        .map(|r| Finding {
            what: format!(
                "{} ({}, ifindex {}): {} not attached (attached: {})",
                r.name,
                r.role,
                r.index,
                r.missing.join(", "),
                r.attached
            ),
            fix: REATTACH_FIX.into(),
        })
        .collect();
    if let Some(cgroup) = status.and_then(|s| s.socket_lb_cgroup.as_ref()) {
        let missing = hooks::socket_layer_unattached(pins);
        if !missing.is_empty() {
            findings.push(Finding {
                what: format!(
                    "socket layer (cgroup {cgroup}): {} not attached",
                    missing.join(", ")
                ),
                fix: REATTACH_FIX.into(),
            });
        }
    }
    Check::new(
        name,
        format!(
            "{} interface(s) checked",
            rows.iter().filter(|r| !r.gone).count()
        ),
        findings,
    )
}

/// The maps against the model rebuilt from the source.
fn maps_check(source: &Source, status: Option<&AgentStatus>, rows: Option<&[ServiceRow]>) -> Check {
    let name = "maps match the source";
    let (Some(status), Some(rows)) = (status, rows) else {
        return Check::skipped(name, "needs the status file and the pinned maps");
    };
    let inputs = match source.inputs() {
        Ok(inputs) => inputs,
        Err(why) => return Check::skipped(name, why),
    };
    let desired = desired::build(inputs, status);
    let mut findings: Vec<Finding> = desired::compare(&desired, rows, &status.unprogrammed)
        .into_iter()
        .map(|m| match held_problems(status, &m.service) {
            // The agent keeps the last good version of this Service (or of
            // one of its slices) on purpose: not a fault of the maps.
            Some(problems) => Finding {
                what: format!(
                    "{} of {} is held at its last good version (goes to {}): the source's newest version cannot be used: {problems}",
                    m.frontend,
                    m.service,
                    list(&m.in_maps)
                ),
                fix: "fix the object; the agent keeps the last good version until then (an agent restarted meanwhile has no earlier version and drops it)".into(),
            },
            None => Finding {
            what: match m.problem {
                "missing" => format!("{} of {} is not in the maps (should go to {})", m.frontend, m.service, list(&m.in_source)),
                "stale" => format!("{} ({}) is in the maps but not in the source (goes to {})", m.frontend, m.service, list(&m.in_maps)),
                _ => format!("{} of {}: the maps send to {}, the source asks for {}", m.frontend, m.service, list(&m.in_maps), list(&m.in_source)),
            },
            fix: "restart the agent: it rebuilds the maps from the source at start-up (if this persists, its log says why)".into(),
            },
        })
        .collect();
    for u in &status.unprogrammed {
        findings.push(Finding {
            what: format!(
                "{} {} was not programmed: {}",
                u.service, u.frontend, u.reason
            ),
            fix: "raise the map capacities (agent --max-* flags) or fix the Service".into(),
        });
    }
    for note in &inputs.notes {
        findings.push(Finding {
            what: note.clone(),
            fix: "fix the manifest: the agent keeps the file's last good objects".into(),
        });
    }
    Check::new(
        name,
        format!(
            "{} frontends in the source, {} in the maps",
            desired.frontends.len(),
            rows.len()
        ),
        findings,
    )
}

/// The problems of the held objects of `service` (`ns/name` or
/// `ns/name:port`), if the agent holds it at its last good version.
fn held_problems(status: &AgentStatus, service: &str) -> Option<String> {
    let base = service.split_once(':').map_or(service, |(s, _)| s);
    let problems: Vec<String> = status
        .rejected
        .iter()
        .filter(|r| r.held && r.service.as_deref() == Some(base))
        .flat_map(|r| {
            r.problems
                .iter()
                .map(move |p| format!("{} {}: {p}", r.kind, r.object))
        })
        .collect();
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// The running agent's own comparison of the maps with its desired state
/// (`switchboard verify`).
fn verify_check(pin_root: &std::path::Path, status: Option<&AgentStatus>) -> Check {
    let name = "maps match the agent's desired state";
    if !agent_process(pin_root, status).alive {
        return Check::skipped(name, "no agent running");
    }
    match crate::observe::verify::ask(pin_root) {
        Ok(v) => {
            let findings = v
                .problems
                .iter()
                .map(|p| Finding {
                    what: format!("{} {} {}: {}", p.kind.as_str(), p.frontend, p.service, p.detail).replace("  ", " "),
                    fix: "`switchboard verify` lists every difference; the agent's log says why a write failed (restarting it rewrites the maps)".into(),
                })
                .collect();
            Check::new(name, format!("{} frontends desired, {} in the maps", v.frontends_desired, v.frontends_in_maps), findings)
        }
        Err(e) => Check::new(
            name,
            "the agent did not answer",
            vec![Finding {
                what: format!("{:#}", anyhow::Error::from(e)),
                fix: "an agent older than `switchboard verify` has no socket; otherwise its sync loop may be stuck (see its log and /healthz)".into(),
            }],
        ),
    }
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "(nothing)".into()
    } else {
        v.join(", ")
    }
}

fn kube_proxy_check(found: &kube_proxy::Leftovers) -> Check {
    let mut findings = Vec::new();
    let fix = "remove them with `switchboard cleanup --kube-proxy` (after kube-proxy itself is gone), or `kube-proxy --cleanup`";
    if !found.iptables_chains.is_empty() {
        findings.push(Finding {
            what: format!(
                "kube-proxy iptables chains: {}",
                found.iptables_chains.join(", ")
            ),
            fix: fix.into(),
        });
    }
    if !found.nft_tables.is_empty() {
        findings.push(Finding {
            what: format!(
                "kube-proxy nftables tables: {}",
                found.nft_tables.join(", ")
            ),
            fix: fix.into(),
        });
    }
    if found.ipvs_interface {
        findings.push(Finding {
            what: format!(
                "interface {} (kube-proxy's IPVS mode) exists",
                kube_proxy::IPVS_INTERFACE
            ),
            fix: fix.into(),
        });
    }
    let detail = match found.checked.is_empty() {
        true => "kube-ipvs0 only: no iptables-save or nft here (run on the host for the rest)"
            .to_owned(),
        false => format!("{}, kube-ipvs0", found.checked.join(", ")),
    };
    Check::new("no kube-proxy leftovers", detail, findings)
}

pub fn render(checks: &[Check]) -> String {
    let mut t = super::table::Table::new(&["CHECK", "RESULT", "DETAIL"]);
    for c in checks {
        let result = match c.state {
            State::Ok => "ok".to_owned(),
            State::Skipped => "skipped".to_owned(),
            State::Problem => format!("{} PROBLEM(S)", c.findings.len()),
        };
        t.push(vec![c.name.to_owned(), result, c.detail.clone()]);
    }
    let mut out = t.render();
    let problems: Vec<(&str, &Finding)> = checks
        .iter()
        .flat_map(|c| c.findings.iter().map(move |f| (c.name, f)))
        .collect();
    if problems.is_empty() {
        out.push_str("\nNo problem found.\n");
        return out;
    }
    let _ = writeln!(out, "\nPROBLEMS ({})", problems.len());
    for (check, f) in problems {
        let _ = writeln!(out, "- [{check}] {}", f.what);
        let _ = writeln!(out, "    fix: {}", f.fix);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(service: &str, backends: usize) -> ServiceRow {
        let backends = (0..backends)
            .map(|i| super::super::BackendRow {
                id: i as u32,
                address: "10.244.1.2".into(),
                port: 8080,
                weight: None,
            })
            .collect();
        ServiceRow::for_test(service, "10.96.0.20", 80, backends)
    }

    #[test]
    fn a_service_without_endpoints_is_named_once_with_what_to_do() {
        let c = endpoints_check(Some(&[
            row("demo/empty:http", 0),
            row("demo/empty:http", 0),
            row("demo/echo:http", 1),
        ]));
        assert_eq!(c.state, State::Problem);
        assert_eq!(c.findings.len(), 1);
        assert!(c.findings[0]
            .what
            .contains("demo/empty:http (10.96.0.20:80/TCP) has no endpoints"));
        assert!(c.findings[0]
            .fix
            .contains("-n demo get endpointslices -l kubernetes.io/service-name=empty"));
        assert_eq!(endpoints_check(None).state, State::Skipped);
    }

    #[test]
    fn kube_proxy_leftovers_are_problems_and_the_table_lists_fixes() {
        let c = kube_proxy_check(&kube_proxy::Leftovers {
            iptables_chains: vec!["iptables-save nat: KUBE-SERVICES".into()],
            nft_tables: vec!["ip kube-proxy".into()],
            ipvs_interface: false,
            checked: vec!["iptables-save".into(), "nft".into()],
        });
        assert_eq!(c.findings.len(), 2);
        assert_eq!(c.detail, "iptables-save, nft, kube-ipvs0");
        let none = kube_proxy_check(&kube_proxy::Leftovers::default());
        assert!(
            none.detail.contains("no iptables-save or nft here"),
            "{}",
            none.detail
        );
        let text = render(&[c, endpoints_check(Some(&[]))]);
        assert!(
            text.contains("no kube-proxy leftovers  2 PROBLEM(S)"),
            "{text}"
        );
        assert!(
            text.contains("- [no kube-proxy leftovers] kube-proxy nftables tables: ip kube-proxy"),
            "{text}"
        );
        assert!(
            text.contains("fix: remove them with `switchboard cleanup --kube-proxy`"),
            "{text}"
        );
        assert!(render(&[endpoints_check(Some(&[]))]).contains("No problem found."));
    }

    /// A Service held at its last good version differs from the
    /// source on purpose; doctor says so instead of advising a restart.
    #[test]
    fn a_held_service_is_named_with_its_problem() {
        let status = AgentStatus {
            rejected: vec![crate::observe::status::RejectedObject {
                kind: "EndpointSlice".into(),
                object: "demo/echo-1".into(),
                service: Some("demo/echo".into()),
                held: true,
                problems: vec!["addressType: missing".into()],
            }],
            ..AgentStatus::default()
        };
        assert_eq!(
            held_problems(&status, "demo/echo:http").as_deref(),
            Some("EndpointSlice demo/echo-1: addressType: missing")
        );
        assert_eq!(held_problems(&status, "demo/other:http"), None);
    }

    /// Without CAP_SYS_ADMIN, doctor says it cannot inspect
    /// instead of listing every interface as missing and advising a restart.
    #[test]
    fn a_refused_program_listing_is_no_missing_program() {
        let refused = aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_prog_get_fd_by_id",
            io_error: std::io::Error::from_raw_os_error(libc::EPERM),
        });
        let net = hooks::NetView {
            programs_unreadable: hooks::unreadable(&refused),
            interfaces: vec![hooks::IfaceHooks {
                name: "p1".into(),
                index: 4,
                pod: true,
                ..Default::default()
            }],
            ..Default::default()
        };
        let c = attach_check(Some(&AgentStatus::default()), true, &net, &[]);
        assert_eq!(c.findings.len(), 1, "{c:?}");
        assert!(
            c.findings[0].what.starts_with(hooks::CANNOT_INSPECT),
            "{c:?}"
        );
        assert!(!c.findings[0].fix.contains("restart"), "{c:?}");
        let text = render(&[c]);
        assert!(!text.contains("not attached"), "{text}");
        // With the listing allowed, the same interface is missing its programs.
        let net = hooks::NetView {
            programs_unreadable: None,
            ..net
        };
        let c = attach_check(Some(&AgentStatus::default()), true, &net, &[]);
        assert!(c.findings[0].what.contains("not attached"), "{c:?}");
    }

    /// The socket layer as `status` and the repair see it: a program
    /// without a pin, or whose pinned link was detached, is not attached.
    #[test]
    fn socket_layer_programs_not_attached_are_doctor_findings() {
        let status = AgentStatus {
            socket_lb_cgroup: Some("/sys/fs/cgroup".into()),
            ..AgentStatus::default()
        };
        let mut pins: Vec<hooks::LinkPin> = crate::dataplane::attach::socket_layer::all_programs()
            .map(|name| hooks::LinkPin {
                name: name.into(),
                path: std::path::PathBuf::from("/p/links").join(name),
                kind: "cgroup",
                index: None,
                detached: false,
            })
            .collect();
        let net = hooks::NetView::default();
        assert_eq!(
            attach_check(Some(&status), true, &net, &pins).state,
            State::Ok
        );
        pins[0].detached = true;
        pins.pop();
        let c = attach_check(Some(&status), true, &net, &pins);
        assert_eq!(c.findings.len(), 1, "{c:?}");
        assert!(
            c.findings[0]
                .what
                .contains(&format!("{} (detached, pin kept)", pins[0].name)),
            "{c:?}"
        );
        assert!(c.findings[0].what.contains("sb_sock_release"), "{c:?}");
        // The socket layer off: nothing to look for.
        let c = attach_check(Some(&AgentStatus::default()), true, &net, &pins);
        assert_eq!(c.state, State::Ok);
    }

    #[test]
    fn a_newer_pin_root_and_stale_pins_are_doctor_findings() {
        let layout = format::Layout {
            format: Some(format::FORMAT + 1),
            maps_pinned: true,
            staging: vec!["SB_FE_V1_resize".into()],
            ..format::Layout::default()
        };
        let c = pin_root_check(std::path::Path::new("/p"), &layout, None);
        assert_eq!(c.state, State::Problem);
        assert_eq!(c.findings.len(), 2, "{c:?}");
        assert!(
            c.findings[0]
                .fix
                .contains("switchboard cleanup --pin-root /p"),
            "{c:?}"
        );
        assert!(c.findings[1].what.contains("SB_FE_V1_resize"), "{c:?}");
        let ok = format::Layout {
            format: Some(format::FORMAT),
            maps_pinned: true,
            ..format::Layout::default()
        };
        assert_eq!(
            pin_root_check(std::path::Path::new("/p"), &ok, None).state,
            State::Ok
        );
    }

    #[test]
    fn services_split_into_namespace_and_name() {
        assert_eq!(split_service("demo/echo:http"), ("demo", "echo"));
        assert_eq!(split_service("demo/echo"), ("demo", "echo"));
    }
}
