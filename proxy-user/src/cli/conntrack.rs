//! `switchboard conntrack list|flush [--service NAME] [--family ipv4|ipv6]`:
//! the connection-tracking maps of both address families (`SB_CT_V5`,
//! `SB_CT6_V1`), both directions, named by Service.
use std::{collections::HashMap, net::SocketAddr, path::Path};

use proxy_common::{ct_dir, ct_flags};
use serde::Serialize;

use super::{table::Table, Common, Done, Output};
use crate::{
    dataplane::flows::expiry::{self as gc, Entry as _, Key},
    dataplane::{maps::PinnedMaps, pins::Pins},
    sync::encode::revnat_name,
    sync::store::MapStore as _,
};

/// `--family`: one address family's flows only.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Ipv4,
    Ipv6,
}

/// Whether `--family` (absent: both) takes in family `name` (`Key::FAMILY`).
fn wanted(filter: Option<Family>, name: &str) -> bool {
    match filter {
        None => true,
        Some(Family::Ipv4) => name == "ipv4",
        Some(Family::Ipv6) => name == "ipv6",
    }
}

#[derive(clap::Subcommand)]
pub enum Action {
    /// List the entries: both directions of every flow, with its Service,
    /// age, flags and source-NAT fields.
    List {
        /// Only this Service: `namespace/name` (every port), `namespace/name:port`,
        /// or a service id.
        #[arg(long)]
        service: Option<String>,
        /// Only this address family's flows (default: both).
        #[arg(long, value_enum)]
        family: Option<Family>,
        #[command(flatten)]
        common: Common,
    },
    /// Remove entries (all, or one Service's) and say how many went. Open
    /// connections then pick a backend anew on their next packet.
    Flush {
        /// Only this Service: `namespace/name` (every port), `namespace/name:port`,
        /// or a service id.
        #[arg(long)]
        service: Option<String>,
        /// Only this address family's entries (default: both).
        #[arg(long, value_enum)]
        family: Option<Family>,
        #[command(flatten)]
        common: Common,
    },
}

/// One entry as `list` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CtRow {
    /// `ipv4` or `ipv6`.
    pub family: &'static str,
    /// `forward` (client → frontend, keyed as the client sent it) or
    /// `reply` (backend → client, keyed as the backend sent it).
    pub direction: &'static str,
    pub protocol: &'static str,
    /// `address:port`; an IPv6 address in brackets (`[fd00::1]:80`).
    pub source: String,
    pub destination: String,
    /// Forward: the backend the destination becomes; reply: the frontend
    /// the source becomes.
    pub nat: String,
    /// With source NAT: forward, the node address the source becomes;
    /// reply, the client the destination is restored to.
    pub snat: Option<String>,
    pub service: String,
    pub service_id: u32,
    pub backend_id: u32,
    pub flags: Vec<&'static str>,
    pub age_s: f64,
    /// The flow's phase, from both of its entries (`syn-sent`,
    /// `established`, `half-closed`, `closed`, `udp`, `udp-stream`), or
    /// `orphan` (its other entry is missing).
    pub state: &'static str,
    /// Seconds until the agent's collector removes the flow (0: due at its
    /// next pass), by the agent's `--conntrack-*` timeouts.
    pub expires_in_s: f64,
}

/// What `flush` did.
#[derive(Debug, Serialize)]
struct Flushed {
    removed: usize,
    service: Option<String>,
}

pub fn run(action: Action) -> anyhow::Result<Done> {
    match action {
        Action::List {
            service,
            family,
            common,
        } => list(&common, service.as_deref(), family),
        Action::Flush {
            service,
            family,
            common,
        } => flush(&common, service.as_deref(), family),
    }
}

fn list(common: &Common, service: Option<&str>, family: Option<Family>) -> anyhow::Result<Done> {
    let maps = super::open_maps(&common.pin_root)?;
    let names = service_names(&maps, &common.pin_root);
    let timeouts = crate::observe::status::read(&common.pin_root)
        .map(|s| s.conntrack_timeouts)
        .unwrap_or_default();
    let now = super::monotonic_ns();
    let mut rows = Vec::new();
    if wanted(family, "ipv4") {
        let table = maps.conntrack.iter().filter_map(Result::ok).collect();
        rows.extend(rows_of(&table, service, &names, now, &timeouts));
    }
    if wanted(family, "ipv6") {
        let table = maps.conntrack6.iter().filter_map(Result::ok).collect();
        rows.extend(rows_of(&table, service, &names, now, &timeouts));
    }
    sort(&mut rows);
    let text = match common.output {
        Output::Json => super::to_json(&rows)?,
        Output::Table => render(&rows),
    };
    Ok(Done::ok(text))
}

/// The rows of one family's table: every entry `--service` selects, each
/// with its flow's phase and expiry.
pub fn rows_of<K: Key>(
    table: &HashMap<K, K::Entry>,
    service: Option<&str>,
    names: &HashMap<u32, String>,
    now_ns: u64,
    timeouts: &gc::Timeouts,
) -> Vec<CtRow> {
    let mut rows = Vec::new();
    for flow in gc::flows(table) {
        let get = |k: &K| {
            table
                .get(k)
                .filter(|e| selected(service, e.service_id(), names))
        };
        let (forward, reply) = gc::entries(&flow, |k| get(k).copied());
        let verdict = gc::verdict(
            &gc::Flow {
                protocol: flow.proto(),
                forward: forward.as_ref(),
                reply: reply.as_ref(),
            },
            timeouts,
        );
        for key in flow.keys() {
            if let (Some(entry), Some(verdict)) = (get(&key), verdict) {
                rows.push(row(&key, entry, names, now_ns, verdict));
            }
        }
    }
    rows
}

/// By Service, then family (a dual-stack Service's IPv4 flows next to its
/// IPv6 ones), then source and destination.
fn sort(rows: &mut [CtRow]) {
    rows.sort_by(|a, b| {
        (&a.service, a.family, &a.source, &a.destination).cmp(&(
            &b.service,
            b.family,
            &b.source,
            &b.destination,
        ))
    });
}

fn flush(common: &Common, service: Option<&str>, family: Option<Family>) -> anyhow::Result<Done> {
    let mut maps = super::open_maps(&common.pin_root)?;
    let names = service_names(&maps, &common.pin_root);
    let mut removed = 0;
    if wanted(family, "ipv4") {
        removed += maps.purge_conntrack(&|_, e| selected(service, e.service_id, &names));
    }
    if wanted(family, "ipv6") {
        removed += maps.purge_conntrack6(&|_, e| selected(service, e.service_id, &names));
    }
    let report = Flushed {
        removed,
        service: service.map(str::to_owned),
    };
    let text = match common.output {
        Output::Json => super::to_json(&report)?,
        Output::Table => match service {
            Some(s) => format!("removed {removed} connection-tracking entries of {s}\n"),
            None => format!("removed {removed} connection-tracking entries\n"),
        },
    };
    Ok(Done::ok(text))
}

/// Service names by id, from both families' reverse-NAT maps (ids are
/// shared; the IPv6 map is read from its pin, and skipped when absent).
fn service_names(maps: &PinnedMaps, pin_root: &Path) -> HashMap<u32, String> {
    let mut names: HashMap<u32, String> = maps
        .revnat
        .iter()
        .filter_map(Result::ok)
        .map(|(id, r)| (id, revnat_name(&r)))
        .collect();
    if let Ok(revnat6) = Pins::new(pin_root).revnat6() {
        for (id, r) in revnat6.iter().filter_map(Result::ok) {
            names.entry(id).or_insert_with(|| name_of(&r.name));
        }
    }
    names
}

/// A reverse-NAT name: its bytes up to the first NUL.
fn name_of(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

/// Whether `--service` selects service `id`: its id, its full name
/// (`ns/name:port`), or its Service (`ns/name`, every port).
pub fn selected(filter: Option<&str>, id: u32, names: &HashMap<u32, String>) -> bool {
    let Some(filter) = filter else {
        return true;
    };
    if filter.parse::<u32>() == Ok(id) {
        return true;
    }
    names.get(&id).is_some_and(|name| {
        name == filter
            || name
                .strip_prefix(filter)
                .is_some_and(|rest| rest.starts_with(':'))
    })
}

/// `address:port` of either family (`10.0.0.1:80`, `[fd00::1]:80`).
fn endpoint<K: Key>((addr, port_be): (K::Addr, u16)) -> String {
    SocketAddr::new(K::ip(addr), u16::from_be(port_be)).to_string()
}

pub fn row<K: Key>(
    key: &K,
    entry: &K::Entry,
    names: &HashMap<u32, String>,
    now_ns: u64,
    verdict: gc::Verdict,
) -> CtRow {
    let mut flags = Vec::new();
    if entry.flags() & ct_flags::CLOSING != 0 {
        flags.push("closing");
    }
    if entry.flags() & ct_flags::SNAT != 0 {
        flags.push("snat");
    }
    CtRow {
        family: K::FAMILY,
        direction: if key.dir() == ct_dir::REPLY {
            "reply"
        } else {
            "forward"
        },
        protocol: match key.proto() {
            proxy_common::proto::UDP => "UDP",
            proxy_common::proto::TCP => "TCP",
            _ => "?",
        },
        source: endpoint::<K>(key.src()),
        destination: endpoint::<K>(key.dst()),
        nat: endpoint::<K>(entry.nat()),
        snat: (entry.flags() & ct_flags::SNAT != 0).then(|| endpoint::<K>(entry.snat())),
        service: names
            .get(&entry.service_id())
            .cloned()
            .unwrap_or_else(|| "?".into()),
        service_id: entry.service_id(),
        backend_id: entry.backend_id(),
        flags,
        age_s: now_ns.saturating_sub(entry.created_ns()) as f64 / 1e9,
        state: verdict.phase.map_or("orphan", gc::Phase::name),
        expires_in_s: verdict.expires_ns.saturating_sub(now_ns) as f64 / 1e9,
    }
}

pub fn render(rows: &[CtRow]) -> String {
    let mut t = Table::new(&[
        "SERVICE",
        "PROTO",
        "DIR",
        "SOURCE",
        "DESTINATION",
        "NAT TO",
        "SNAT",
        "FLAGS",
        "AGE",
        "STATE",
        "EXPIRES IN",
    ])
    .right(8)
    .right(10);
    for r in rows {
        t.push(vec![
            r.service.clone(),
            r.protocol.to_owned(),
            r.direction.to_owned(),
            r.source.clone(),
            r.destination.clone(),
            r.nat.clone(),
            r.snat.clone().unwrap_or_else(|| "-".into()),
            if r.flags.is_empty() {
                "-".into()
            } else {
                r.flags.join(",")
            },
            super::table::human_duration(r.age_s),
            r.state.to_owned(),
            super::table::human_duration(r.expires_in_s),
        ]);
    }
    let mut out = t.render();
    out.push_str(&format!("{} entries\n", rows.len()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxy_common::{CtEntry, CtKey};

    #[test]
    fn service_filters_take_a_service_a_port_or_an_id() {
        let names: HashMap<u32, String> = [
            (1, "demo/echo:http".to_owned()),
            (2, "demo/echo:dns".to_owned()),
            (3, "demo/echoes".to_owned()),
        ]
        .into_iter()
        .collect();
        assert!(selected(None, 9, &names));
        assert!(selected(Some("demo/echo"), 1, &names));
        assert!(selected(Some("demo/echo"), 2, &names));
        assert!(!selected(Some("demo/echo"), 3, &names));
        assert!(selected(Some("demo/echo:dns"), 2, &names));
        assert!(!selected(Some("demo/echo:dns"), 1, &names));
        assert!(selected(Some("3"), 3, &names));
    }

    #[test]
    fn rows_show_both_directions_with_snat_and_age() {
        let names: HashMap<u32, String> = [(4, "ext/web:http".to_owned())].into_iter().collect();
        let key = CtKey {
            saddr_be: u32::from_ne_bytes([10, 244, 2, 2]),
            daddr_be: u32::from_ne_bytes([192, 168, 1, 5]),
            sport_be: 8080u16.to_be(),
            dport_be: 1500u16.to_be(),
            proto: proxy_common::proto::TCP,
            dir: ct_dir::REPLY,
            _pad: [0; 2],
        };
        let entry = CtEntry {
            service_id: 4,
            backend_id: 2,
            nat_addr_be: u32::from_ne_bytes([203, 0, 113, 10]),
            nat_port_be: 80u16.to_be(),
            flags: ct_flags::SNAT | ct_flags::CLOSING,
            snat_addr_be: u32::from_ne_bytes([192, 0, 2, 9]),
            snat_port_be: 40000u16.to_be(),
            created_ns: 1_000_000_000,
            ..CtEntry::default()
        };
        let verdict = gc::Verdict {
            phase: Some(gc::Phase::Closed),
            expires_ns: 76_000_000_000,
        };
        let r = row(&key, &entry, &names, 66_000_000_000, verdict);
        assert_eq!(r.direction, "reply");
        assert_eq!(r.nat, "203.0.113.10:80");
        assert_eq!(r.snat.as_deref(), Some("192.0.2.9:40000"));
        assert_eq!(r.flags, ["closing", "snat"]);
        let text = render(&[r]);
        assert!(text.contains("ext/web:http"), "{text}");
        assert!(text.contains("1m05s"), "{text}");
        assert!(text.contains("closed"), "{text}");
        assert!(text.contains("10s"), "{text}");
        assert!(text.ends_with("1 entries\n"), "{text}");
    }

    fn addr6(text: &str) -> proxy_common::Addr6Be {
        let ip: std::net::Ipv6Addr = text.parse().expect("an IPv6 address");
        proxy_common::addr6_be(ip.octets())
    }

    /// One established IPv6 flow (client → [fd00:96::10]:80 → backend) and
    /// one IPv4 flow of the same dual-stack Service (id 7).
    fn dual_stack() -> (
        HashMap<CtKey, CtEntry>,
        HashMap<proxy_common::CtKey6, proxy_common::CtEntry6>,
    ) {
        use proxy_common::{ct_state, proto, CtEntry6, CtKey6};
        let s = 1_000_000_000;
        let (client, vip, pod) = (addr6("fd00::2"), addr6("fd00:96::10"), addr6("fd00:244::5"));
        let v6 = [
            (
                CtKey6 {
                    saddr_be: client,
                    daddr_be: vip,
                    sport_be: 40000u16.to_be(),
                    dport_be: 80u16.to_be(),
                    proto: proto::TCP,
                    dir: ct_dir::FORWARD,
                    _pad: [0; 2],
                },
                CtEntry6 {
                    service_id: 7,
                    backend_id: 3,
                    nat_addr_be: pod,
                    nat_port_be: 8080u16.to_be(),
                    created_ns: 10 * s,
                    last_seen_ns: 20 * s,
                    // The client acknowledged the SYN-ACK.
                    state: ct_state::ACKED,
                    ..CtEntry6::default()
                },
            ),
            (
                CtKey6 {
                    saddr_be: pod,
                    daddr_be: client,
                    sport_be: 8080u16.to_be(),
                    dport_be: 40000u16.to_be(),
                    proto: proto::TCP,
                    dir: ct_dir::REPLY,
                    _pad: [0; 2],
                },
                CtEntry6 {
                    service_id: 7,
                    backend_id: 3,
                    nat_addr_be: vip,
                    nat_port_be: 80u16.to_be(),
                    state: ct_state::REPLIED,
                    created_ns: 10 * s,
                    last_seen_ns: 20 * s,
                    ..CtEntry6::default()
                },
            ),
        ];
        let v4 = [(
            CtKey {
                saddr_be: u32::from_ne_bytes([10, 0, 0, 2]),
                daddr_be: u32::from_ne_bytes([10, 96, 0, 10]),
                sport_be: 40000u16.to_be(),
                dport_be: 80u16.to_be(),
                proto: proto::TCP,
                dir: ct_dir::FORWARD,
                _pad: [0; 2],
            },
            CtEntry {
                service_id: 7,
                nat_addr_be: u32::from_ne_bytes([10, 244, 1, 5]),
                nat_port_be: 8080u16.to_be(),
                created_ns: 10 * s,
                last_seen_ns: 20 * s,
                ..CtEntry::default()
            },
        )];
        (v4.into_iter().collect(), v6.into_iter().collect())
    }

    #[test]
    fn ipv6_flows_are_listed_next_to_ipv4_ones_with_bracketed_addresses() {
        let names: HashMap<u32, String> = [(7, "demo/dual:http".to_owned())].into_iter().collect();
        let (v4, v6) = dual_stack();
        let t = gc::Timeouts::default();
        let now = 30_000_000_000;
        let mut rows = rows_of(&v4, None, &names, now, &t);
        rows.extend(rows_of(&v6, None, &names, now, &t));
        sort(&mut rows);
        let shown: Vec<(&str, &str, &str, &str, &str)> = rows
            .iter()
            .map(|r| {
                (
                    r.family,
                    r.direction,
                    r.source.as_str(),
                    r.destination.as_str(),
                    r.nat.as_str(),
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                (
                    "ipv4",
                    "forward",
                    "10.0.0.2:40000",
                    "10.96.0.10:80",
                    "10.244.1.5:8080"
                ),
                // By source as text, as for IPv4 rows.
                (
                    "ipv6",
                    "reply",
                    "[fd00:244::5]:8080",
                    "[fd00::2]:40000",
                    "[fd00:96::10]:80"
                ),
                (
                    "ipv6",
                    "forward",
                    "[fd00::2]:40000",
                    "[fd00:96::10]:80",
                    "[fd00:244::5]:8080"
                ),
            ]
        );
        // The IPv6 pair is one established flow; the lone IPv4 entry an orphan.
        assert_eq!(rows[1].state, "established");
        assert_eq!(rows[2].state, "established");
        assert_eq!(rows[0].state, "orphan");
        assert!(rows.iter().all(|r| r.service == "demo/dual:http"));
        let text = render(&rows);
        assert!(text.contains("[fd00:96::10]:80"), "{text}");
        assert!(text.ends_with("3 entries\n"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&crate::cli::to_json(&rows).expect("json")).expect("parse");
        assert_eq!(json[2]["family"], "ipv6");
        assert_eq!(json[2]["destination"], "[fd00:96::10]:80");
        // --service applies to IPv6 flows as to IPv4 ones.
        assert!(rows_of(&v6, Some("demo/other"), &names, now, &t).is_empty());
        assert_eq!(rows_of(&v6, Some("demo/dual"), &names, now, &t).len(), 2);
    }

    #[test]
    fn the_family_filter_picks_one_family_or_both() {
        assert!(wanted(None, "ipv4") && wanted(None, "ipv6"));
        assert!(wanted(Some(Family::Ipv6), "ipv6") && !wanted(Some(Family::Ipv6), "ipv4"));
        assert!(wanted(Some(Family::Ipv4), "ipv4") && !wanted(Some(Family::Ipv4), "ipv6"));
        assert_eq!(name_of(b"demo/dual:http\0\0"), "demo/dual:http");
    }
}
