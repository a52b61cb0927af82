//! `switchboard services`: what the pinned maps say, read straight from them,
//! whether or not an agent is running.
use std::{fmt::Write as _, path::Path};

use crate::dataplane::{
    maps::readback::{read_services, ServiceRow},
    pins::MapsError,
};
use crate::model::LbAlgorithm;

/// `address:port`, an IPv6 address in brackets (`[fd00::1]:80`), as
/// Kubernetes prints them.
pub fn host_port(address: &str, port: u16) -> String {
    match address.contains(':') {
        true => format!("[{address}]:{port}"),
        false => format!("{address}:{port}"),
    }
}

/// A backend as the table lists it: `address:port`, with its weight in a
/// weighted set (`(weight 3)`, `(drained)` for weight 0).
pub fn backend_cell(b: &crate::dataplane::maps::readback::BackendRow) -> String {
    let at = host_port(&b.address, b.port);
    match b.weight {
        None => at,
        Some(0) => format!("{at} (drained)"),
        Some(w) => format!("{at} (weight {w})"),
    }
}

/// Marks the rows of Services the agent holds at their last good version
/// (the Service's own newest version, or one of its slices', cannot be
/// used), with the problems, from the agent's status file.
pub fn mark_held(rows: &mut [ServiceRow], status: &crate::observe::status::AgentStatus) {
    for row in rows {
        let service = row
            .service
            .split_once(':')
            .map_or(row.service.as_str(), |(s, _)| s);
        for r in status
            .rejected
            .iter()
            .filter(|r| r.held && r.service.as_deref() == Some(service))
        {
            row.held = true;
            for p in &r.problems {
                let text = format!("{} {}: {p}", r.kind, r.object);
                if !row.problems.contains(&text) {
                    row.problems.push(text);
                }
            }
        }
    }
}

/// Notes on a row's attributes, e.g. `local endpoints only, ClientIP affinity 10800s`.
fn attributes(row: &ServiceRow) -> String {
    let mut notes = Vec::new();
    if row.local_only {
        notes.push(if row.kind == "ClusterIP" {
            "internalTrafficPolicy Local: this node's endpoints only".to_owned()
        } else {
            // Pod traffic gets every endpoint (kube-proxy's short-circuit);
            // traffic from outside gets the local set.
            let local = row.external_backends.as_deref().unwrap_or_default();
            if local.is_empty() {
                "externalTrafficPolicy Local: no local endpoint, traffic from outside is dropped"
                    .to_owned()
            } else {
                let list: Vec<String> = local.iter().map(backend_cell).collect();
                format!(
                    "externalTrafficPolicy Local: from outside -> {}",
                    list.join(", ")
                )
            }
        });
    }
    if let Some(blocks) = &row.source_ranges {
        notes.push(match blocks.is_empty() {
            true => "loadBalancerSourceRanges: no source allowed".to_owned(),
            false => format!("loadBalancerSourceRanges: {}", blocks.join(" ")),
        });
        if row.drops_source_range > 0 {
            notes.push(format!("{} packets denied", row.drops_source_range));
        }
    }
    if row.terminating_fallback {
        notes.push("terminating fallback".to_owned());
    }
    if let Some(timeout) = row.affinity_timeout_s {
        notes.push(format!("ClientIP affinity {timeout}s"));
    }
    if row.algorithm != LbAlgorithm::Random {
        notes.push(format!("lb-algorithm {}", row.algorithm.as_str()));
    }
    notes.join(", ")
}

/// The table `switchboard services` prints.
pub fn render_table(rows: &[ServiceRow]) -> String {
    let header = [
        "SERVICE", "STATE", "ID", "KIND", "FRONTEND", "PACKETS", "FLOWS", "DROPS", "BACKENDS",
    ];
    let mut table: Vec<[String; 9]> = vec![header.map(str::to_owned)];
    for row in rows {
        let backends = if row.backends.is_empty() {
            "(none: packets are dropped)".to_owned()
        } else {
            row.backends
                .iter()
                .map(backend_cell)
                .collect::<Vec<_>>()
                .join(", ")
        };
        table.push([
            row.service.clone(),
            if row.held { "held" } else { "ok" }.to_owned(),
            row.id.to_string(),
            row.kind.to_owned(),
            format!("{}/{}", host_port(&row.address, row.port), row.protocol),
            row.packets.to_string(),
            row.new_flows.to_string(),
            row.drops_no_backend.to_string(),
            backends,
        ]);
    }
    let mut widths = [0usize; 9];
    for line in &table {
        for (width, cell) in widths.iter_mut().zip(line) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    for (index, line) in table.iter().enumerate() {
        let mut text = String::new();
        for (column, cell) in line.iter().enumerate() {
            let width = widths[column];
            if column == line.len() - 1 {
                text.push_str(cell);
            } else if (2..=2).contains(&column) || (5..=7).contains(&column) {
                let _ = write!(text, "{cell:>width$}  ");
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
        if let Some(row) = index.checked_sub(1).and_then(|i| rows.get(i)) {
            let notes = attributes(row);
            if !notes.is_empty() {
                let _ = writeln!(out, "    {notes}");
            }
            if row.held {
                let _ = writeln!(
                    out,
                    "    held at its last good version (a newer version cannot be used):"
                );
                for p in &row.problems {
                    let _ = writeln!(out, "      {p}");
                }
            }
            if row.missing_backends > 0 {
                let _ = writeln!(
                    out,
                    "    warning: {} slot(s) name a missing backend",
                    row.missing_backends
                );
            }
        }
    }
    if rows.is_empty() {
        let _ = writeln!(out, "(no frontends programmed)");
    }
    out
}

/// What the agent could not program, and whether it is running (`alive`:
/// see [`super::agent_process`]).
pub fn render_status(status: &crate::observe::status::AgentStatus, alive: bool) -> String {
    let mut out = String::new();
    if !alive {
        let _ = writeln!(
            out,
            "\nThe agent (pid {}) is not running: the maps above keep forwarding, but nothing follows changes.",
            status.pid
        );
    }
    if !status.unprogrammed.is_empty() {
        let _ = writeln!(out, "\nNOT PROGRAMMED ({}):", status.unprogrammed.len());
        for u in &status.unprogrammed {
            let _ = writeln!(out, "  {}  {}  {}", u.service, u.frontend, u.reason);
        }
    }
    if !status.warnings.is_empty() {
        let _ = writeln!(out, "\nPROBLEMS ({}):", status.warnings.len());
        for w in &status.warnings {
            let _ = writeln!(out, "  {w}");
        }
    }
    out
}

/// Runs `switchboard services`.
pub fn services(pin_root: &Path, json: bool) -> anyhow::Result<String> {
    let maps = match super::open_maps(pin_root) {
        Ok(maps) => maps,
        Err(error @ MapsError::NotPinned { .. }) => {
            return Err(anyhow::Error::from(error)
                .context(format!("no switchboard maps under {}", pin_root.display())))
        }
        Err(error) => return Err(error.into()),
    };
    let mut rows = read_services(&maps);
    let status = crate::observe::status::read(pin_root);
    if let Some(status) = &status {
        mark_held(&mut rows, status);
    }
    if json {
        return Ok(serde_json::to_string_pretty(&rows)? + "\n");
    }
    let mut text = render_table(&rows);
    if let Some(status) = &status {
        let alive = super::agent_process(pin_root, Some(status)).alive;
        text.push_str(&render_status(status, alive));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::maps::readback::BackendRow;

    #[test]
    fn weighted_backends_show_their_weight_and_drained_ones_say_so() {
        let mut r = row("demo/web:http", 3);
        for (b, w) in r.backends.iter_mut().zip([3, 1, 0]) {
            b.weight = Some(w);
        }
        let table = render_table(&[r]);
        assert!(
            table.contains(
                "10.244.1.2:8080 (weight 3), 10.244.2.2:8080 (weight 1), 10.244.3.2:8080 (drained)"
            ),
            "{table}"
        );
        let plain = render_table(&[row("demo/web:http", 2)]);
        assert!(
            plain.contains("10.244.1.2:8080, 10.244.2.2:8080"),
            "{plain}"
        );
    }

    fn row(service: &str, backends: usize) -> ServiceRow {
        let backends = (0..backends)
            .map(|i| BackendRow {
                id: i as u32 + 1,
                address: format!("10.244.{}.2", i + 1),
                port: 8080,
                weight: None,
            })
            .collect();
        ServiceRow {
            id: 7,
            packets: 12,
            bytes: 900,
            new_flows: 3,
            ..ServiceRow::for_test(service, "10.96.0.10", 80, backends)
        }
    }

    #[test]
    fn table_lists_frontend_backends_and_counters() {
        let text = render_table(&[row("demo/echo:http", 2)]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("SERVICE"));
        assert!(lines[1].contains("demo/echo:http"));
        assert!(lines[1].contains("10.96.0.10:80/TCP"));
        assert!(lines[1].contains("10.244.1.2:8080, 10.244.2.2:8080"));
        assert!(lines[1].contains("12"));
    }

    #[test]
    fn table_says_what_happens_without_endpoints_and_shows_attributes() {
        let mut r = row("demo/empty", 0);
        r.affinity_timeout_s = Some(10800);
        r.local_only = true;
        r.algorithm = LbAlgorithm::LeastConn;
        let text = render_table(&[r]);
        assert!(text.contains("(none: packets are dropped)"));
        assert!(text.contains("lb-algorithm least-conn"), "{text}");
        assert!(text.contains("this node's endpoints only"));
        let mut lb = row("demo/lb", 1);
        lb.kind = "LoadBalancer";
        lb.local_only = true;
        assert!(render_table(&[lb]).contains("externalTrafficPolicy Local: no local endpoint"));
        let mut lb = row("demo/lb", 2);
        lb.kind = "LoadBalancer";
        lb.local_only = true;
        lb.external_backends = Some(vec![BackendRow {
            id: 1,
            address: "10.244.1.2".to_owned(),
            port: 8080,
            weight: None,
        }]);
        assert!(render_table(&[lb]).contains("from outside -> 10.244.1.2:8080"));
        assert!(text.contains("ClientIP affinity 10800s"));
        assert!(render_table(&[]).contains("no frontends programmed"));
    }

    /// A Service held at its last good version is marked in the
    /// table (STATE `held`, the problem under its row) and in JSON; the
    /// agent's problems (files that do not parse among them) follow the table.
    #[test]
    fn held_services_are_marked_and_problems_listed() {
        use crate::observe::status::{AgentStatus, RejectedObject};
        let status = AgentStatus {
            pid: 1,
            warnings: vec![
                "Service default/web: spec.ports[0].port: 70000 is not a valid port; keeping the last good version".into(),
                "file /etc/sb/bad.yaml: document 1: syntax error: x; keeping this file's last good objects".into(),
            ],
            rejected: vec![
                RejectedObject {
                    kind: "Service".into(),
                    object: "default/web".into(),
                    service: Some("default/web".into()),
                    held: true,
                    problems: vec!["spec.ports[0].port: 70000 is not a valid port".into()],
                },
                RejectedObject {
                    kind: "Service".into(),
                    object: "default/new".into(),
                    service: Some("default/new".into()),
                    held: false,
                    problems: vec!["spec.clusterIP: missing".into()],
                },
            ],
            ..AgentStatus::default()
        };
        let mut rows = vec![row("default/web:http", 1), row("default/other", 1)];
        mark_held(&mut rows, &status);
        assert!(rows[0].held && !rows[1].held);
        assert_eq!(
            rows[0].problems,
            ["Service default/web: spec.ports[0].port: 70000 is not a valid port"]
        );
        let text = render_table(&rows);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("SERVICE") && lines[0].contains(" STATE "),
            "{text}"
        );
        assert!(
            lines[1].starts_with("default/web:http") && lines[1].contains(" held "),
            "{text}"
        );
        assert!(lines[2].contains("held at its last good version"), "{text}");
        assert!(
            lines[3].contains("Service default/web: spec.ports[0].port: 70000 is not a valid port"),
            "{text}"
        );
        assert!(
            lines[4].starts_with("default/other") && lines[4].contains(" ok "),
            "{text}"
        );
        let problems = render_status(&status, true);
        assert!(problems.contains("PROBLEMS (2):"), "{problems}");
        assert!(
            problems.contains("file /etc/sb/bad.yaml: document 1: syntax error"),
            "{problems}"
        );
        let json: serde_json::Value = serde_json::to_value(&rows).expect("json");
        assert_eq!(json[0]["held"], true);
        assert_eq!(
            json[0]["problems"][0],
            "Service default/web: spec.ports[0].port: 70000 is not a valid port"
        );
        assert_eq!(json[1]["held"], false);
    }

    #[test]
    fn rows_of_both_families_with_ipv6_bracketed() {
        use crate::dataplane::maps::readback::rows;
        use crate::model::Protocol;
        use crate::sync::store::MapStore as _;
        use crate::sync::tests::{caps, fe, fe6, state, MemStore};
        use proxy_common::SvcStats;
        let mut syncer = crate::sync::Syncer::adopt(MemStore::default(), caps());
        let web4 = fe([10, 96, 0, 10], 80, Protocol::Tcp, "web", &[(1, 8080)]);
        let web6 = fe6(0x10, 80, Protocol::Tcp, "web", &[(1, 8080), (2, 8080)]);
        syncer.apply(&state(vec![web6, web4]));
        let rows = rows(&syncer.store().dump(), |_| SvcStats::default(), |_| 0);
        let fronts: Vec<(&str, usize)> = rows
            .iter()
            .map(|r| (r.address.as_str(), r.backends.len()))
            .collect();
        assert_eq!(
            fronts,
            [("10.96.0.10", 1), ("fd00:96::10", 2)],
            "IPv4 first, each with its own backends"
        );
        assert_eq!(rows[1].service, "default/web");
        assert_eq!(rows[1].missing_backends, 0);
        let text = render_table(&rows);
        assert!(text.contains("[fd00:96::10]:80/TCP"), "{text}");
        assert!(
            text.contains("[fd00:244::1]:8080, [fd00:244::2]:8080"),
            "{text}"
        );
        assert!(text.contains("10.96.0.10:80/TCP"), "{text}");
        assert!(text.contains("10.244.0.1:8080"), "{text}");
    }
}
