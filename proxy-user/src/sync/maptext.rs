//! Map entries as text, one a line, as the sync's case files (`sync/cases/`)
//! show the maps and the in-memory store logs its writes; read back for the
//! entries a case puts into the maps behind the agent's back.
//!
//! ```text
//! frontend 10.96.0.10:80/TCP slot 0: service 1, count 2, ClusterIP
//! frontend 10.96.0.10:80/TCP slot 1: service 1, backend 1
//! frontend 192.168.1.10:30080/TCP external slot 0: service 2, count 1, NodePort, local-only
//! backend 1: 10.244.0.1:8080/TCP
//! revnat 1: 10.96.0.10:80/TCP default/web
//! range 3: 10.0.0.0/8
//! maglev 3: 16381 entries (backend 1: 5461, backend 2: 5460, backend 3: 5460), by address 5d6f0a1c2b3e4f70
//! conntrack IPv4 UDP: service 1, backend 2
//! socket 7 reverse UDP 10.244.0.2:53: service 1, backend 2
//! ```
//!
//! A slot shows every field of [`FrontendSlot`] that is set (slot 0 always
//! its count and kind); a connection-tracking or socket entry shows what
//! the sync reads of it. Deletions name the key (`frontend … slot 3`,
//! `backend 2 (IPv4)`, `range 3: 10.0.0.0/8`).
use std::net::{IpAddr, SocketAddr};

use proxy_common::{frontend_flags as ff, scope, sock_dir, FrontendSlot};

use crate::model::cidr::IpCidr;
use crate::model::{BackendAddr, FrontendAddr, IpFamily, Protocol};
use crate::sync::encode::{
    backend_addr, backend_value, ipv4, ipv6, proto_number, protocol_from_number, revnat_name,
    revnat_value, scoped_key, AnyBackend, AnyFrontendKey, AnyRevNat,
};

/// `10.96.0.10:80/TCP`, or `…/proto 132` for a protocol not ours.
fn addr_proto(ip: IpAddr, port: u16, number: u8) -> String {
    let at = SocketAddr::new(ip, port);
    match protocol_from_number(number) {
        Some(p) => format!("{at}/{p}"),
        None => format!("{at}/proto {number}"),
    }
}

pub(crate) fn frontend_key(key: &AnyFrontendKey) -> String {
    let set = match key.scope() {
        scope::INTERNAL => String::new(),
        scope::EXTERNAL => "external ".into(),
        other => format!("scope {other} "),
    };
    format!(
        "frontend {} {set}slot {}",
        addr_proto(key.ip(), key.port(), key.proto()),
        key.slot()
    )
}

/// The names of the flag bits, kind first.
fn flag_words(flags: u16) -> Vec<String> {
    let mut words = vec![match flags & ff::KIND_MASK {
        ff::KIND_NODE_PORT => "NodePort",
        ff::KIND_LOAD_BALANCER => "LoadBalancer",
        ff::KIND_EXTERNAL_IP => "ExternalIP",
        _ => "ClusterIP",
    }
    .to_string()];
    // The affinity bit shows with its timeout.
    let mut known = ff::KIND_MASK | ff::AFFINITY_CLIENT_IP;
    for (bit, word) in FLAG_WORDS {
        known |= bit;
        if flags & bit != 0 {
            words.push(word.to_string());
        }
    }
    for (mask, values) in [(ff::ALGO_MASK, &ALGORITHMS), (ff::PICK_MASK, &PICKS)] {
        known |= mask;
        match values.iter().find(|(v, _)| *v == flags & mask) {
            Some((_, "")) => {}
            Some((_, word)) => words.push(word.to_string()),
            None => words.push(format!("flags {:#x}", flags & mask)),
        }
    }
    if flags & !known != 0 {
        words.push(format!("flags {:#x}", flags & !known));
    }
    words
}

const FLAG_WORDS: [(u16, &str); 6] = [
    (ff::LOCAL_ONLY, "local-only"),
    (ff::TERMINATING_FALLBACK, "terminating-fallback"),
    (ff::SOURCE_RANGES, "source-ranges"),
    (ff::SOURCE_RANGES_NODE, "node-allowed"),
    (ff::DIRECT_RETURN, "direct-return"),
    (ff::WEIGHTED, "weighted"),
];
const ALGORITHMS: [(u16, &str); 3] = [
    (ff::ALGO_RANDOM, ""),
    (ff::ALGO_MAGLEV, "maglev"),
    (ff::ALGO_SOURCE_HASH, "source-hash"),
];
const PICKS: [(u16, &str); 3] = [
    (0, ""),
    (ff::PICK_ROUND_ROBIN, "round-robin"),
    (ff::PICK_LEAST_CONN, "least-conn"),
];

pub(crate) fn frontend(key: &AnyFrontendKey, slot: &FrontendSlot) -> String {
    let head = key.slot() == 0;
    let mut fields = vec![format!("service {}", slot.service_id)];
    if head || slot.backend_count != 0 {
        fields.push(format!("count {}", slot.backend_count));
    }
    if !head || slot.backend_id != 0 {
        fields.push(format!("backend {}", slot.backend_id));
    }
    if head || slot.flags != 0 {
        fields.extend(flag_words(slot.flags));
    }
    if slot.flags & ff::AFFINITY_CLIENT_IP != 0 {
        fields.push(format!("affinity {}s", slot.affinity_timeout_s));
    } else if slot.affinity_timeout_s != 0 {
        fields.push(format!("timeout {}s", slot.affinity_timeout_s));
    }
    format!("{}: {}", frontend_key(key), fields.join(", "))
}

pub(crate) fn backend(id: u32, backend: &AnyBackend) -> String {
    let addr = backend_addr(backend);
    let flags = match backend {
        AnyBackend::V4(b) => b.flags,
        AnyBackend::V6(b) => b.flags,
    };
    let mut line = format!(
        "backend {id}: {}",
        addr_proto(addr.ip, addr.port, backend.proto())
    );
    if flags != 0 {
        line += &format!(", flags {flags:#x}");
    }
    line
}

pub(crate) fn revnat(id: u32, rnat: &AnyRevNat) -> String {
    let (ip, port_be, number) = match rnat {
        AnyRevNat::V4(r) => (IpAddr::V4(ipv4(r.addr_be)), r.port_be, r.proto),
        AnyRevNat::V6(r) => (IpAddr::V6(ipv6(r.addr_be)), r.port_be, r.proto),
    };
    format!(
        "revnat {id}: {} {}",
        addr_proto(ip, u16::from_be(port_be), number),
        revnat_name(rnat)
    )
}

/// A deleted backend or reverse-NAT entry: `backend 2 (IPv6)`.
pub(crate) fn by_id(what: &str, id: u32, family: IpFamily) -> String {
    format!("{what} {id} ({family})")
}

pub(crate) fn range(id: u32, block: &IpCidr) -> String {
    format!("range {id}: {block}")
}

/// A Maglev table: its size, how many entries name each backend id, and a
/// digest of the backend addresses entry by entry (`address_of` the id), so
/// two nodes that filled the table alike by address show the same digest
/// whatever their ids.
pub(crate) fn maglev(id: u32, table: &[u32], address_of: impl Fn(u32) -> String) -> String {
    let mut counts = std::collections::BTreeMap::<u32, usize>::new();
    // FNV-1a over the addresses, one per entry.
    let mut digest: u64 = 0xcbf2_9ce4_8422_2325;
    for &backend in table {
        *counts.entry(backend).or_default() += 1;
        for byte in address_of(backend).bytes().chain([b'\n']) {
            digest = (digest ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }
    let counts: Vec<String> = counts
        .iter()
        .map(|(b, n)| format!("backend {b}: {n}"))
        .collect();
    format!(
        "maglev {id}: {} entries ({}), by address {digest:016x}",
        table.len(),
        counts.join(", ")
    )
}

/// What the sync reads of a connection-tracking entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Flow {
    pub(crate) family: IpFamily,
    pub(crate) proto: u8,
    pub(crate) service_id: u32,
    pub(crate) backend_id: u32,
}

pub(crate) fn flow(f: &Flow) -> String {
    format!(
        "conntrack {} {}: service {}, backend {}",
        f.family,
        proto_name(f.proto),
        f.service_id,
        f.backend_id
    )
}

/// What the sync reads of a socket-layer entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Socket {
    pub(crate) cookie: u64,
    pub(crate) dir: u8,
    pub(crate) proto: u8,
    pub(crate) addr: BackendAddr,
    pub(crate) service_id: u32,
    pub(crate) backend_id: u32,
}

pub(crate) fn socket(s: &Socket) -> String {
    let dir = match s.dir {
        sock_dir::FORWARD => "forward".to_string(),
        sock_dir::REVERSE => "reverse".to_string(),
        other => format!("dir {other}"),
    };
    format!(
        "socket {} {dir} {} {}: service {}, backend {}",
        s.cookie,
        proto_name(s.proto),
        s.addr,
        s.service_id,
        s.backend_id
    )
}

fn proto_name(number: u8) -> String {
    protocol_from_number(number).map_or_else(|| format!("proto {number}"), |p| p.to_string())
}

/// An entry a case writes into the maps, or deletes, behind the agent's back.
#[derive(Clone, Debug)]
pub(crate) enum Edit {
    Frontend(AnyFrontendKey, Option<FrontendSlot>),
    Backend(u32, IpFamily, Option<AnyBackend>),
    RevNat(u32, IpFamily, Option<AnyRevNat>),
    Range(u32, IpCidr, bool),
    Flow(Flow),
    Socket(Socket),
}

fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))
}

fn protocol(text: &str) -> Result<Protocol, String> {
    match text {
        "TCP" => Ok(Protocol::Tcp),
        "UDP" => Ok(Protocol::Udp),
        other => Err(format!("{other:?} is not TCP or UDP")),
    }
}

/// `10.96.0.10:80/TCP`.
pub(crate) fn frontend_addr(text: &str) -> Result<FrontendAddr, String> {
    let (at, proto) = text
        .rsplit_once('/')
        .ok_or_else(|| format!("{text:?} is not address:port/PROTOCOL"))?;
    let at: SocketAddr = at
        .parse()
        .map_err(|_| format!("{at:?} is not address:port"))?;
    Ok(FrontendAddr {
        ip: at.ip(),
        port: at.port(),
        protocol: protocol(proto)?,
    })
}

fn family(text: &str) -> Result<IpFamily, String> {
    match text {
        "(IPv4)" | "IPv4" => Ok(IpFamily::V4),
        "(IPv6)" | "IPv6" => Ok(IpFamily::V6),
        other => Err(format!("{other:?} is not IPv4 or IPv6")),
    }
}

/// `service 1, backend 2`: the ids of a flow or socket.
fn ids(text: &str) -> Result<(u32, u32), String> {
    let (mut service, mut backend) = (None, None);
    for field in text.split(", ") {
        match field.split_once(' ') {
            Some(("service", n)) => service = Some(number(n)?),
            Some(("backend", n)) => backend = Some(number(n)?),
            _ => return Err(format!("{field:?}: service N or backend N")),
        }
    }
    Ok((
        service.ok_or("no service id")?,
        backend.ok_or("no backend id")?,
    ))
}

fn slot_fields(text: &str) -> Result<FrontendSlot, String> {
    let mut slot = FrontendSlot::default();
    for field in text.split(", ") {
        let kind = [
            (ff::KIND_CLUSTER_IP, "ClusterIP"),
            (ff::KIND_NODE_PORT, "NodePort"),
            (ff::KIND_LOAD_BALANCER, "LoadBalancer"),
            (ff::KIND_EXTERNAL_IP, "ExternalIP"),
        ];
        let word = FLAG_WORDS
            .iter()
            .chain(ALGORITHMS.iter())
            .chain(PICKS.iter())
            .chain(kind.iter())
            .find(|(_, w)| *w == field && !w.is_empty());
        if let Some((bit, _)) = word {
            slot.flags |= bit;
            continue;
        }
        let seconds = |n: &str| number(n.strip_suffix('s').unwrap_or("?"));
        match field.split_once(' ') {
            Some(("service", n)) => slot.service_id = number(n)?,
            Some(("count", n)) => slot.backend_count = number(n)?,
            Some(("backend", n)) => slot.backend_id = number(n)?,
            Some(("affinity", n)) => {
                slot.flags |= ff::AFFINITY_CLIENT_IP;
                slot.affinity_timeout_s = seconds(n)?;
            }
            Some(("timeout", n)) => slot.affinity_timeout_s = seconds(n)?,
            Some(("flags", n)) => {
                slot.flags |= u16::from_str_radix(n.trim_start_matches("0x"), 16)
                    .map_err(|_| format!("flags {n:?}: not hexadecimal"))?
            }
            _ => return Err(format!("{field:?} is not a field of a frontend slot")),
        }
    }
    Ok(slot)
}

impl Edit {
    /// `put ENTRY` (an entry as the maps show it) or `delete KEY` (as the
    /// write log shows it).
    pub(crate) fn parse(line: &str) -> Result<Edit, String> {
        let bad = |e: String| format!("{line:?}: {e}");
        let (put, entry) = if let Some(entry) = line.strip_prefix("put ") {
            (true, entry)
        } else if let Some(entry) = line.strip_prefix("delete ") {
            (false, entry)
        } else {
            return Err(bad("not `put ENTRY` or `delete KEY`".into()));
        };
        let (kind, rest) = entry.split_once(' ').unwrap_or((entry, ""));
        let (key, value) = match rest.split_once(": ") {
            Some((key, value)) => (key, Some(value)),
            None => (rest, None),
        };
        if put == value.is_none() && kind != "range" {
            return Err(bad("a put gives the value, a delete only the key".into()));
        }
        let words: Vec<&str> = key.split_whitespace().collect();
        match (kind, &words[..]) {
            ("frontend", [addr, rest @ ..]) => {
                let (scope, slot) = match rest {
                    ["slot", n] => (scope::INTERNAL, n),
                    ["external", "slot", n] => (scope::EXTERNAL, n),
                    _ => return Err(bad("frontend ADDR [external] slot N".into())),
                };
                let addr = frontend_addr(addr).map_err(bad)?;
                let key = scoped_key(&addr, scope, number(slot).map_err(bad)?);
                let slot = value.map(slot_fields).transpose().map_err(bad)?;
                Ok(Edit::Frontend(key, slot))
            }
            ("backend", [id]) | ("revnat", [id]) => {
                let id = number(id).map_err(bad)?;
                let Some(value) = value else {
                    return Err(bad("delete backend|revnat ID (IPv4|IPv6)".into()));
                };
                let (at, name) = value.split_once(' ').unwrap_or((value, ""));
                let addr = frontend_addr(at).map_err(bad)?;
                let family = addr.family();
                Ok(if kind == "backend" {
                    let backend = BackendAddr {
                        ip: addr.ip,
                        port: addr.port,
                    };
                    Edit::Backend(id, family, Some(backend_value(backend, addr.protocol)))
                } else {
                    Edit::RevNat(id, family, Some(revnat_value(&addr, name)))
                })
            }
            ("backend", [id, fam]) | ("revnat", [id, fam]) => {
                let id = number(id).map_err(bad)?;
                let family = family(fam).map_err(bad)?;
                Ok(if kind == "backend" {
                    Edit::Backend(id, family, None)
                } else {
                    Edit::RevNat(id, family, None)
                })
            }
            ("range", [id]) => {
                let block = value.ok_or_else(|| bad("range ID: CIDR".into()))?;
                let block = block
                    .parse()
                    .map_err(|_| bad(format!("{block:?} is not a CIDR")))?;
                Ok(Edit::Range(number(id).map_err(bad)?, block, put))
            }
            ("conntrack", [fam, proto]) if put => {
                let (service_id, backend_id) = ids(value.unwrap_or_default()).map_err(bad)?;
                Ok(Edit::Flow(Flow {
                    family: family(fam).map_err(bad)?,
                    proto: proto_number(protocol(proto).map_err(bad)?),
                    service_id,
                    backend_id,
                }))
            }
            ("socket", [cookie, dir, proto, addr]) if put => {
                let (service_id, backend_id) = ids(value.unwrap_or_default()).map_err(bad)?;
                let dir = match *dir {
                    "forward" => sock_dir::FORWARD,
                    "reverse" => sock_dir::REVERSE,
                    other => return Err(bad(format!("{other:?}: forward or reverse"))),
                };
                let addr: SocketAddr = addr.parse().map_err(|_| bad("an address:port".into()))?;
                Ok(Edit::Socket(Socket {
                    cookie: number(cookie).map_err(bad)?,
                    dir,
                    proto: proto_number(protocol(proto).map_err(bad)?),
                    addr: BackendAddr {
                        ip: addr.ip(),
                        port: addr.port(),
                    },
                    service_id,
                    backend_id,
                }))
            }
            _ => Err(bad(format!(
                "not an entry this file format writes (see {})",
                file!()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line a case may put reads back into an entry that shows as
    /// the same line.
    #[test]
    fn entries_read_back_as_written() {
        for line in [
            "frontend 10.96.0.10:80/TCP slot 0: service 1, count 2, ClusterIP",
            "frontend 10.96.0.10:80/TCP slot 1: service 1, backend 1",
            "frontend [fd00::1]:53/UDP external slot 0: service 2, count 1, NodePort, local-only, maglev, affinity 60s",
            "frontend 10.96.0.10:80/TCP slot 2: service 1, count 3, backend 4",
            "frontend 10.96.0.10:80/TCP slot 0: service 1, count 0, LoadBalancer, source-ranges, node-allowed, least-conn, timeout 5s",
            "backend 1: 10.244.0.1:8080/TCP",
            "backend 9: [fd00:244::1]:53/UDP",
            "revnat 3: 10.96.0.10:80/TCP default/web:http",
            "range 3: 10.0.0.0/8",
            "conntrack IPv6 UDP: service 1, backend 2",
            "socket 7 reverse UDP 10.244.0.2:53: service 1, backend 2",
        ] {
            let shown = match Edit::parse(&format!("put {line}")) {
                Ok(Edit::Frontend(key, Some(slot))) => frontend(&key, &slot),
                Ok(Edit::Backend(id, _, Some(b))) => backend(id, &b),
                Ok(Edit::RevNat(id, _, Some(r))) => revnat(id, &r),
                Ok(Edit::Range(id, block, true)) => range(id, &block),
                Ok(Edit::Flow(f)) => flow(&f),
                Ok(Edit::Socket(s)) => socket(&s),
                other => panic!("{line}: {other:?}"),
            };
            assert_eq!(shown, line);
        }
        for line in [
            "delete frontend 10.96.0.10:80/TCP external slot 3",
            "delete backend 2 (IPv6)",
            "delete revnat 2 (IPv4)",
            "delete range 3: 10.0.0.0/8",
        ] {
            assert!(Edit::parse(line).is_ok(), "{line}");
        }
        assert!(Edit::parse("put backend 2 (IPv6)").is_err());
        assert!(Edit::parse("delete frontend 10.96.0.10:80/TCP slot 0: service 1").is_err());
    }

    #[test]
    fn a_maglev_digest_follows_addresses_not_ids() {
        let a = maglev(1, &[1, 2, 1], |id| format!("addr{id}"));
        let b = maglev(1, &[5, 6, 5], |id| format!("addr{}", id - 4));
        let digest = |s: &str| s.rsplit(' ').next().map(str::to_string);
        assert_eq!(digest(&a), digest(&b));
        assert!(a.starts_with("maglev 1: 3 entries (backend 1: 2, backend 2: 1)"));
        let c = maglev(1, &[2, 1, 1], |id| format!("addr{id}"));
        assert_ne!(digest(&a), digest(&c));
    }
}
