//! `switchboard services`: what the pinned maps say, read straight from them,
//! whether or not an agent is running.
use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use proxy_common::{Frontend as FrontendValue, FrontendKey};
use serde::Serialize;

use crate::{
    maps::{MapsError, PinnedMaps},
    sync::{backend_addr, frontend_addr, revnat_name},
};

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ServiceRow {
    /// `namespace/name:port` as the agent recorded it.
    pub service: String,
    pub id: u32,
    pub address: String,
    pub port: u16,
    pub protocol: String,
    pub backends: Vec<BackendRow>,
    /// Slots that name a backend id absent from the backend map (should be 0).
    pub missing_backends: usize,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub drops_no_backend: u64,
}

#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct BackendRow {
    pub id: u32,
    pub address: String,
    pub port: u16,
}

/// Reads every frontend with its backends and counters from the maps.
pub fn read_services(maps: &PinnedMaps) -> Vec<ServiceRow> {
    let entries: BTreeMap<(u32, u16, u8, u16), (FrontendKey, FrontendValue)> = maps
        .frontends
        .iter()
        .filter_map(Result::ok)
        .map(|(k, v)| {
            (
                (
                    u32::from_be(k.addr_be),
                    u16::from_be(k.port_be),
                    k.proto,
                    k.slot,
                ),
                (k, v),
            )
        })
        .collect();
    let mut rows = Vec::new();
    for ((_, _, _, slot), (key, head)) in &entries {
        if *slot != 0 {
            continue;
        }
        let Some(addr) = frontend_addr(key) else {
            continue;
        };
        let mut backends = Vec::new();
        let mut missing = 0;
        for slot in 1..=head.backend_count {
            let slot_key = FrontendKey { slot, ..*key };
            let backend = maps.frontends.get(&slot_key, 0).ok().and_then(|v| {
                maps.backends
                    .get(&v.backend_id, 0)
                    .ok()
                    .map(|b| (v.backend_id, b))
            });
            match backend {
                Some((id, b)) => {
                    let b = backend_addr(&b);
                    backends.push(BackendRow {
                        id,
                        address: b.ip.to_string(),
                        port: b.port,
                    });
                }
                None => missing += 1,
            }
        }
        let service = maps
            .revnat
            .get(&head.service_id, 0)
            .map(|r| revnat_name(&r))
            .unwrap_or_default();
        let stats = maps.service_stats(head.service_id);
        rows.push(ServiceRow {
            service,
            id: head.service_id,
            address: addr.ip.to_string(),
            port: addr.port,
            protocol: addr.protocol.to_string(),
            backends,
            missing_backends: missing,
            packets: stats.packets,
            bytes: stats.bytes,
            new_flows: stats.new_flows,
            drops_no_backend: stats.drops_no_backend,
        });
    }
    rows
}

/// The table `switchboard services` prints.
pub fn render_table(rows: &[ServiceRow]) -> String {
    let mut out = String::new();
    let frontends: Vec<String> = rows
        .iter()
        .map(|r| format!("{}:{}/{}", r.address, r.port, r.protocol))
        .collect();
    let fe_width = frontends
        .iter()
        .map(String::len)
        .max()
        .unwrap_or(0)
        .max("FRONTEND".len());
    let svc_width = rows
        .iter()
        .map(|r| r.service.len())
        .max()
        .unwrap_or(0)
        .max("SERVICE".len());
    let _ = writeln!(
        out,
        "{:<svc_width$}  {:>4}  {:<fe_width$}  {:>8}  {:>8}  {:>7}  BACKENDS",
        "SERVICE", "ID", "FRONTEND", "PACKETS", "FLOWS", "DROPS"
    );
    for (row, frontend) in rows.iter().zip(&frontends) {
        let backends = if row.backends.is_empty() {
            "(none: packets are dropped)".to_owned()
        } else {
            row.backends
                .iter()
                .map(|b| format!("{}:{}", b.address, b.port))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let _ = writeln!(
            out,
            "{:<svc_width$}  {:>4}  {:<fe_width$}  {:>8}  {:>8}  {:>7}  {}",
            row.service,
            row.id,
            frontend,
            row.packets,
            row.new_flows,
            row.drops_no_backend,
            backends
        );
        if row.missing_backends > 0 {
            let _ = writeln!(
                out,
                "  warning: {} slot(s) name a missing backend",
                row.missing_backends
            );
        }
    }
    if rows.is_empty() {
        let _ = writeln!(out, "(no frontends programmed)");
    }
    out
}

/// Runs `switchboard services`.
pub fn services(pin_root: &Path, json: bool) -> anyhow::Result<String> {
    let maps = match PinnedMaps::open(pin_root) {
        Ok(maps) => maps,
        Err(error @ MapsError::NotPinned { .. }) => {
            return Err(anyhow::Error::from(error)
                .context(format!("no switchboard maps under {}", pin_root.display())))
        }
        Err(error) => return Err(error.into()),
    };
    let rows = read_services(&maps);
    if json {
        Ok(serde_json::to_string_pretty(&rows)? + "\n")
    } else {
        Ok(render_table(&rows))
    }
}
