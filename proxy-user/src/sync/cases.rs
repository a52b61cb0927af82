//! The sync's cases: one file each in `sync/cases/`, desired frontends in,
//! the map writes and the maps out (`util/txtar.rs` runs them;
//! `docs/testing.md` says how to add one). The maps are the in-memory store
//! (`sync/memstore.rs`); entries show as `sync/maptext.rs` writes them.
//!
//! A case is a comment saying what it shows, then sections in order, each
//! an action or an expectation about the action before it:
//!
//! - `-- flags --`: agent flags the sync reads, one a line:
//!   `--max-frontend-entries N`, `--max-backends N`, `--max-services N`
//!   (before the first sync only), `--lb-algorithm NAME`,
//!   `--nodeport-mode snat|dsr`;
//! - `-- desired --`: a sync to this desired state, one frontend a line as
//!   the model's cases show them (`Frontend`'s display);
//!   `-- desired (only ADDR, ADDR changed) --` tells the sync that only
//!   those frontends changed, as the model's delta does;
//! - `-- restart --`: the agent stops; a new one adopts the maps (the write
//!   log starts anew, and `-- writes --` shows what adoption wrote);
//! - `-- other node --`: a second agent, with empty maps of its own;
//! - `-- edit maps --`: entries put or deleted behind the agent's back, one
//!   a line: `put ENTRY` as `-- maps --` shows entries, `delete KEY` as
//!   `-- writes --` shows deletions (connection-tracking and socket entries
//!   are what the data path would have written);
//! - `-- fault --`: `frontend map full at N entries`;
//! - `-- report --`: what the last sync reported;
//! - `-- writes --`: every map write of the last sync or restart, in order;
//! - `-- maps --`: every entry of every map.
use std::collections::BTreeSet;
use std::net::SocketAddr;

use clap::ValueEnum as _;
use proxy_common::{CtEntry, CtEntry6, CtKey, CtKey6, SockEntry, SockEntry6, SockKey, SockKey6};

use super::*;
use crate::model::{Frontend, FrontendKind, ServicePortName, SourceRanges, TopologyMode};
use crate::sync::encode::addr4_be;
use crate::sync::maptext::{frontend_addr, Edit};
use crate::sync::memstore::{k, MemStore};
use crate::util::txtar::{self, Archive, At, Produced};

#[test]
fn cases() {
    txtar::run_dir("src/sync/cases", run);
}

/// One agent's state across a case's sections.
struct Agent {
    caps: Capacities,
    defaults: FrontendDefaults,
    syncer: Syncer<MemStore>,
    report: Option<SyncReport>,
    synced: bool,
}

impl Agent {
    fn start(&mut self, store: MemStore) {
        self.syncer = Syncer::adopt(store, self.caps);
        self.syncer.set_default_algorithm(self.defaults.algorithm);
        self.syncer.set_direct_return(self.defaults.direct_return);
    }
}

fn run(archive: &Archive) -> Result<Vec<Produced>, String> {
    let mut agent = Agent {
        caps: Capacities::default(),
        defaults: FrontendDefaults::default(),
        syncer: Syncer::adopt(MemStore::default(), Capacities::default()),
        report: None,
        synced: false,
    };
    let mut produced = Vec::new();
    for (i, section) in archive.sections.iter().enumerate() {
        let at = format!("section {} (`{}`)", i + 1, section.name);
        let lines = || section.body.lines().filter(|l| !l.trim().is_empty());
        let name = section.name.as_str();
        let expect = |text: String| Produced {
            at: At::Section(i),
            name: name.to_string(),
            text,
        };
        match name {
            "flags" => {
                for line in lines() {
                    flag(&mut agent, line).map_err(|e| format!("{at}: {e}"))?;
                }
            }
            "restart" | "other node" => {
                let store = match name {
                    "restart" => std::mem::take(&mut agent.syncer.store),
                    _ => MemStore::default(),
                };
                agent.start(MemStore {
                    writes: 0,
                    log: Vec::new(),
                    ..store
                });
                agent.report = None;
            }
            "edit maps" => {
                for line in lines() {
                    let edit = Edit::parse(line).map_err(|e| format!("{at}: {e}"))?;
                    apply_edit(agent.syncer.store_mut(), edit);
                }
            }
            "fault" => {
                let limit = lines()
                    .map(|l| {
                        l.strip_prefix("frontend map full at ")
                            .and_then(|l| l.strip_suffix(" entries"))
                            .and_then(|n| n.parse().ok())
                            .ok_or_else(|| format!("{at}: {l:?}: frontend map full at N entries"))
                    })
                    .collect::<Result<Vec<usize>, String>>()?;
                agent.syncer.store_mut().frontend_limit = limit.last().copied();
            }
            "report" => {
                let report = agent
                    .report
                    .as_ref()
                    .ok_or_else(|| format!("{at}: no sync before it"))?;
                produced.push(expect(report_text(report)));
            }
            "writes" => produced.push(expect(
                agent
                    .syncer
                    .store()
                    .log
                    .iter()
                    .map(|l| format!("{l}\n"))
                    .collect(),
            )),
            "maps" => produced.push(expect(agent.syncer.store().text())),
            _ => {
                let only = changed(name).map_err(|e| format!("{at}: {e}"))?;
                let desired = DesiredState {
                    frontends: lines()
                        .map(|l| frontend(l).map(|f| (f.addr, f)))
                        .collect::<Result<_, _>>()
                        .map_err(|e| format!("{at}: {e}"))?,
                };
                agent.syncer.store_mut().log.clear();
                agent.report = Some(match only {
                    None => agent.syncer.apply(&desired),
                    Some(only) => agent.syncer.apply_changed(&desired, &only),
                });
                agent.synced = true;
            }
        }
    }
    Ok(produced)
}

/// `desired` or `desired (only A, B changed)`: the frontends named, if any.
fn changed(name: &str) -> Result<Option<BTreeSet<FrontendAddr>>, String> {
    if name == "desired" {
        return Ok(None);
    }
    let list = name
        .strip_prefix("desired (only ")
        .and_then(|n| n.strip_suffix(" changed)"))
        .ok_or_else(|| format!("unknown section {name:?}"))?;
    list.split(", ")
        .map(frontend_addr)
        .collect::<Result<_, _>>()
        .map(Some)
}

fn flag(agent: &mut Agent, line: &str) -> Result<(), String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let capacity = |n: &str| n.parse::<u32>().map_err(|e| format!("{line}: {e}"));
    match words[..] {
        [name @ ("--max-frontend-entries" | "--max-backends" | "--max-services"), n] => {
            if agent.synced {
                return Err(format!("{name} before the first sync only"));
            }
            let n = capacity(n)?;
            match name {
                "--max-frontend-entries" => agent.caps.frontends = n,
                "--max-backends" => agent.caps.backends = n,
                _ => agent.caps.services = n,
            }
            agent.start(MemStore::default());
        }
        ["--lb-algorithm", name] => {
            agent.defaults.algorithm = LbAlgorithm::from_str(name, false)?;
            agent.syncer.set_default_algorithm(agent.defaults.algorithm);
        }
        ["--nodeport-mode", mode @ ("snat" | "dsr")] => {
            agent.defaults.direct_return = mode == "dsr";
            agent.syncer.set_direct_return(agent.defaults.direct_return);
        }
        _ => return Err(format!("{line:?} is not a flag the sync reads")),
    }
    Ok(())
}

fn apply_edit(store: &mut MemStore, edit: Edit) {
    match edit {
        Edit::Frontend(key, Some(slot)) => {
            store.frontends.insert(k(&key), slot);
        }
        Edit::Frontend(key, None) => {
            store.frontends.remove(&k(&key));
        }
        Edit::Backend(id, family, backend) => match backend {
            Some(b) => store.backends.insert((family, id), b).map(drop),
            None => store.backends.remove(&(family, id)).map(drop),
        }
        .unwrap_or_default(),
        Edit::RevNat(id, family, rnat) => match rnat {
            Some(r) => store.revnat.insert((family, id), r).map(drop),
            None => store.revnat.remove(&(family, id)).map(drop),
        }
        .unwrap_or_default(),
        Edit::Range(id, block, true) => {
            store.source_ranges.insert((id, block));
        }
        Edit::Range(id, block, false) => {
            store.source_ranges.remove(&(id, block));
        }
        Edit::Flow(f) => match f.family {
            IpFamily::V4 => store.conntrack.push((
                CtKey {
                    proto: f.proto,
                    ..CtKey::default()
                },
                CtEntry {
                    service_id: f.service_id,
                    backend_id: f.backend_id,
                    ..CtEntry::default()
                },
            )),
            IpFamily::V6 => store.conntrack6.push((
                CtKey6 {
                    proto: f.proto,
                    ..CtKey6::default()
                },
                CtEntry6 {
                    service_id: f.service_id,
                    backend_id: f.backend_id,
                    ..CtEntry6::default()
                },
            )),
        },
        Edit::Socket(s) => match s.addr.ip {
            IpAddr::V4(ip) => store.sockets.push((
                SockKey {
                    cookie: s.cookie,
                    addr_be: addr4_be(ip),
                    port_be: s.addr.port.to_be(),
                    proto: s.proto,
                    dir: s.dir,
                },
                SockEntry {
                    service_id: s.service_id,
                    backend_id: s.backend_id,
                    ..SockEntry::default()
                },
            )),
            IpAddr::V6(ip) => store.sockets6.push((
                SockKey6 {
                    cookie: s.cookie,
                    addr_be: proxy_common::addr6_be(ip.octets()),
                    port_be: s.addr.port.to_be(),
                    proto: s.proto,
                    dir: s.dir,
                    ..SockKey6::default()
                },
                SockEntry6 {
                    service_id: s.service_id,
                    backend_id: s.backend_id,
                    ..SockEntry6::default()
                },
            )),
        },
    }
}

fn report_text(r: &SyncReport) -> String {
    let mut out = format!(
        "added {}, updated {}, removed {}, unchanged {}, writes {}\n",
        r.added, r.updated, r.removed, r.unchanged, r.writes
    );
    if r.conntrack_purged > 0 {
        out += &format!("conntrack entries purged: {}\n", r.conntrack_purged);
    }
    if r.sockets_purged > 0 {
        out += &format!("socket entries purged: {}\n", r.sockets_purged);
    }
    for (cookie, backend) in &r.udp_sockets_left {
        out += &format!("UDP socket to close: cookie {cookie}, backend {backend}\n");
    }
    for u in &r.failed {
        out += &format!(
            "not programmed: {} {}: {}\n",
            u.frontend, u.service, u.reason
        );
    }
    out
}

fn backend_list(text: &str) -> Result<Vec<BackendAddr>, String> {
    if text == "(none)" {
        return Ok(Vec::new());
    }
    text.split(", ")
        .map(|b| {
            b.parse::<SocketAddr>()
                .map(|at| BackendAddr {
                    ip: at.ip(),
                    port: at.port(),
                })
                .map_err(|_| format!("{b:?}: not address:port"))
        })
        .collect()
}

/// A frontend as `Frontend`'s display writes it: `ADDR KIND SERVICE ->
/// BACKENDS[; from outside -> BACKENDS][ [ATTRIBUTES]]`. It must display
/// back as written, so a line means exactly what it says.
fn frontend(line: &str) -> Result<Frontend, String> {
    let bad = |e: String| format!("{line:?}: {e}");
    let (main, extras) = match line.strip_suffix(']').and_then(|l| l.rsplit_once(" [")) {
        Some((main, extras)) => (main, Some(extras)),
        None => (line, None),
    };
    let (head, sets) = main
        .split_once(" -> ")
        .ok_or_else(|| bad("ADDR KIND SERVICE -> BACKENDS".into()))?;
    let [addr, kind, service] = head.split(' ').collect::<Vec<_>>()[..] else {
        return Err(bad("ADDR KIND SERVICE -> BACKENDS".into()));
    };
    let kind = [
        FrontendKind::ClusterIp,
        FrontendKind::NodePort,
        FrontendKind::LoadBalancer,
        FrontendKind::ExternalIp,
    ]
    .into_iter()
    .find(|k| k.as_str() == kind)
    .ok_or_else(|| bad(format!("{kind:?} is not a frontend kind")))?;
    let (namespace, name) = service
        .split_once('/')
        .ok_or_else(|| bad(format!("{service:?}: not namespace/name[:port]")))?;
    let (name, port) = name.split_once(':').unwrap_or((name, ""));
    let (internal, external) = match sets.split_once("; from outside -> ") {
        Some((internal, external)) => (internal, Some(external)),
        None => (sets, None),
    };
    let mut f = Frontend::cluster_ip(
        frontend_addr(addr).map_err(bad)?,
        ServicePortName {
            namespace: namespace.into(),
            name: name.into(),
            port: port.into(),
        },
        backend_list(internal).map_err(bad)?,
    );
    f.kind = kind;
    f.external_backends = external.map(backend_list).transpose().map_err(bad)?;
    for extra in extras.into_iter().flat_map(|e| e.split(", ")) {
        attribute(&mut f, extra).map_err(bad)?;
    }
    if f.to_string() != line {
        return Err(bad(format!("reads as {f}")));
    }
    Ok(f)
}

/// One of the bracketed attributes of a frontend line.
fn attribute(f: &mut Frontend, extra: &str) -> Result<(), String> {
    let number = |n: &str| n.parse::<u32>().map_err(|_| format!("{n:?}: not a number"));
    match extra.split_once(' ').unwrap_or((extra, "")) {
        ("local-only", "") => f.local_only = true,
        ("terminating", "fallback") => f.terminating_fallback = true,
        ("terminating", "fallback from outside") => f.external_terminating_fallback = true,
        ("affinity", t) => f.affinity_timeout_s = Some(number(t.trim_end_matches('s'))?),
        ("healthCheckNodePort", p) => {
            f.health_check_node_port = Some(p.parse().map_err(|_| format!("{p:?}: not a port"))?)
        }
        ("topology", "same-node") => f.topology = Some(TopologyMode::SameNode),
        ("topology", "same-zone") => f.topology = Some(TopologyMode::SameZone),
        ("lb-algorithm", name) => f.algorithm = Some(LbAlgorithm::from_str(name, false)?),
        ("weights", list) => {
            f.weights = list
                .split(' ')
                .map(|w| {
                    let (b, w) = w
                        .split_once('=')
                        .ok_or(format!("{w:?}: not backend=weight"))?;
                    let b = backend_list(b)?.pop().ok_or("no backend")?;
                    Ok((b, w.parse().map_err(|_| format!("{w:?}: not a weight"))?))
                })
                .collect::<Result<Vec<_>, String>>()?
                .into()
        }
        ("from", blocks) => {
            let (blocks, allows_node) = match blocks.strip_suffix(" (node allowed)") {
                Some(blocks) => (blocks, true),
                None => (blocks, false),
            };
            let blocks: Vec<IpCidr> = match blocks {
                "no source" => Vec::new(),
                _ => blocks
                    .split(' ')
                    .map(|b| b.parse().map_err(|_| format!("{b:?}: not a CIDR")))
                    .collect::<Result<_, _>>()?,
            };
            f.source_ranges = Some(SourceRanges {
                blocks: blocks.into(),
                allows_node,
            });
        }
        _ => return Err(format!("{extra:?} is not an attribute of a frontend")),
    }
    Ok(())
}
