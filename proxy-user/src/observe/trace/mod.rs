//! `switchboard trace`: the live stream of the data path's events
//! (`proxy_common::trace`), from the agent to any number of clients.
//!
//! The agent alone reads the ring buffer and owns the switch ([`hub`]). A
//! client connects to the agent's socket (the `verify` socket, mode 0600:
//! [`crate::observe::verify::socket_path`]), sends one line, `trace` and its
//! [`FilterSpec`] as JSON, and then reads [`Record`]s, one JSON object a
//! line, until it closes the connection. The agent switches on in the
//! kernel the union of its clients' event kinds and switches off what no
//! client asks for as soon as one leaves: a closed connection (a client
//! that exits, or is killed) is a client gone.
//!
//! Events are filtered in the agent ([`Filter`]); each client's queue is
//! bounded, and what did not fit is counted and reported to that client,
//! as are the events the kernel could not write (a full ring buffer).
pub mod hub;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use proxy_common::trace::{kind, layer, reason, verdict};
use proxy_common::{frontend_flags as ff, TraceEvent};
use serde::{Deserialize, Serialize};

use crate::model::cidr::IpCidr;

/// The request line's first word.
pub const REQUEST: &str = "trace";

/// What a client asks for, as it sends it (strings, parsed by the agent
/// into a [`Filter`]; every field optional).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterSpec {
    /// Event kinds (`drop`, `new-flow`, `revnat-miss`); empty: all.
    #[serde(default)]
    pub types: Vec<String>,
    /// `namespace/name` (every port of the Service) or
    /// `namespace/name:port`.
    pub service: Option<String>,
    /// `IP` or `IP:PORT` (`[IPv6]:PORT`).
    pub frontend: Option<String>,
    /// `IP` or a CIDR block.
    pub client: Option<String>,
    /// `IP` or `IP:PORT`.
    pub backend: Option<String>,
    /// `tcp` or `udp`.
    pub protocol: Option<String>,
}

/// An address filter: one address, or one address and port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddrMatch {
    Ip(IpAddr),
    Socket(SocketAddr),
}

impl AddrMatch {
    fn matches(&self, at: Option<SocketAddr>) -> bool {
        match (self, at) {
            (_, None) => false,
            (AddrMatch::Ip(ip), Some(at)) => at.ip() == *ip,
            (AddrMatch::Socket(want), Some(at)) => at == *want,
        }
    }
}

impl FromStr for AddrMatch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(at) = s.parse::<SocketAddr>() {
            return Ok(AddrMatch::Socket(at));
        }
        s.parse::<IpAddr>()
            .map(AddrMatch::Ip)
            .map_err(|_| format!("{s:?} is neither an IP address nor IP:PORT"))
    }
}

/// A client's filter, parsed: an event passes when it matches every field
/// given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Filter {
    /// Bit `1 << kind` per kind asked for.
    pub kinds: u64,
    pub service: Option<String>,
    pub frontend: Option<AddrMatch>,
    pub client: Option<IpCidr>,
    pub backend: Option<AddrMatch>,
    pub protocol: Option<u8>,
}

impl TryFrom<&FilterSpec> for Filter {
    type Error = String;
    fn try_from(spec: &FilterSpec) -> Result<Self, String> {
        let mut kinds = 0;
        for name in &spec.types {
            let Some(k) = kind::NAMES.iter().position(|n| n == name) else {
                return Err(format!(
                    "unknown event type {name:?} (one of {})",
                    kind::NAMES.join(", ")
                ));
            };
            kinds |= 1u64 << k;
        }
        let client = match &spec.client {
            None => None,
            Some(c) => Some(match c.parse::<IpAddr>() {
                Ok(ip) => IpCidr::new(ip, if ip.is_ipv4() { 32 } else { 128 })
                    .ok_or_else(|| format!("bad client {c:?}"))?,
                Err(_) => c
                    .parse::<IpCidr>()
                    .map_err(|_| format!("client {c:?} is neither an IP address nor a CIDR"))?,
            }),
        };
        let protocol = match spec.protocol.as_deref() {
            None => None,
            Some("tcp" | "TCP") => Some(proxy_common::proto::TCP),
            Some("udp" | "UDP") => Some(proxy_common::proto::UDP),
            Some(other) => return Err(format!("protocol {other:?} is neither tcp nor udp")),
        };
        Ok(Filter {
            kinds: if kinds == 0 { kind::ALL } else { kinds },
            service: spec.service.clone(),
            frontend: spec.frontend.as_deref().map(str::parse).transpose()?,
            client,
            backend: spec.backend.as_deref().map(str::parse).transpose()?,
            protocol,
        })
    }
}

impl Filter {
    /// Whether `event` passes.
    pub fn matches(&self, event: &Event) -> bool {
        let kind_bit = kind::NAMES
            .iter()
            .position(|n| *n == event.kind)
            .map_or(0, |k| 1u64 << k);
        self.kinds & kind_bit != 0
            && self.service.as_deref().is_none_or(|want| {
                event.service.as_deref().is_some_and(|name| {
                    name == want || name.strip_prefix(want).is_some_and(|r| r.starts_with(':'))
                })
            })
            && self.frontend.is_none_or(|f| f.matches(event.frontend))
            && self
                .client
                .is_none_or(|c| event.client.is_some_and(|at| c.contains(at.ip())))
            && self.backend.is_none_or(|b| b.matches(event.backend))
            && self.protocol.is_none_or(|p| event.protocol_number == p)
    }
}

/// One event as clients see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Wall-clock time, seconds since the Unix epoch.
    pub time: f64,
    /// `drop`, `new-flow` or `revnat-miss`.
    pub kind: String,
    /// `socket`, `tc` or `xdp`.
    pub layer: String,
    /// 4 or 6 (0: the packet could not be read).
    pub family: u8,
    pub protocol: String,
    #[serde(skip)]
    pub protocol_number: u8,
    /// The packet's source (absent at the socket layer, whose socket has
    /// no address yet, and for a malformed packet).
    pub client: Option<SocketAddr>,
    pub frontend: Option<SocketAddr>,
    pub backend: Option<SocketAddr>,
    /// `namespace/name:port` of the frontend's Service.
    pub service: Option<String>,
    pub service_id: u32,
    /// New flows: how the backend was picked.
    pub algorithm: Option<String>,
    /// Drops: why (a counter's name of `switchboard stats`).
    pub reason: Option<String>,
    /// Drops: `dropped`, `passed` or `answered`.
    pub verdict: Option<String>,
}

/// A line of the stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "kebab-case")]
pub enum Record {
    Event(Box<Event>),
    /// Events lost since the last such record: `kernel`, the ring buffer
    /// was full (every client misses them); `reader`, this client's queue
    /// was full.
    Lost {
        kernel: u64,
        reader: u64,
    },
    /// The request was refused.
    Error {
        error: String,
    },
}

fn address(family: u8, addr_be: [u32; 4], port_be: u16) -> Option<SocketAddr> {
    let ip = match family {
        4 => IpAddr::V4(Ipv4Addr::from(u32::from_be(addr_be[0]))),
        6 => IpAddr::V6(Ipv6Addr::from(proxy_common::addr6_octets(addr_be))),
        _ => return None,
    };
    (!ip.is_unspecified() || port_be != 0).then(|| SocketAddr::new(ip, u16::from_be(port_be)))
}

/// The algorithm slot 0's flags name.
pub fn algorithm(flags: u16) -> &'static str {
    match (flags & ff::PICK_MASK, flags & ff::ALGO_MASK) {
        (ff::PICK_ROUND_ROBIN, _) => "round-robin",
        (ff::PICK_LEAST_CONN, _) => "least-connection",
        (_, ff::ALGO_MAGLEV) => "maglev",
        (_, ff::ALGO_SOURCE_HASH) => "source-hash",
        _ => "random",
    }
}

fn name_of(names: &[&'static str], index: u8) -> String {
    names
        .get(usize::from(index))
        .unwrap_or(&"unknown")
        .to_string()
}

impl Event {
    /// Decodes a kernel event; `time` is its wall-clock time and `service`
    /// the name of its service id.
    pub fn decode(raw: &TraceEvent, time: f64, service: Option<String>) -> Event {
        let at = |addr, port| address(raw.family, addr, port);
        let is_drop = raw.kind == kind::DROP;
        Event {
            time,
            kind: name_of(&kind::NAMES, raw.kind),
            layer: name_of(&layer::NAMES, raw.layer),
            family: raw.family,
            protocol: match raw.proto {
                proxy_common::proto::TCP => "tcp".to_owned(),
                proxy_common::proto::UDP => "udp".to_owned(),
                0 => String::new(),
                other => other.to_string(),
            },
            protocol_number: raw.proto,
            client: at(raw.client_addr_be, raw.client_port_be),
            frontend: at(raw.frontend_addr_be, raw.frontend_port_be),
            backend: at(raw.backend_addr_be, raw.backend_port_be),
            service,
            service_id: raw.service_id,
            algorithm: (raw.kind == kind::NEW_FLOW).then(|| algorithm(raw.frontend_flags).into()),
            reason: is_drop.then(|| reason::name(raw.reason).to_owned()),
            verdict: is_drop.then(|| name_of(&verdict::NAMES, raw.verdict)),
        }
    }

    /// One line for people.
    pub fn render(&self) -> String {
        let show = |at: &Option<SocketAddr>| at.map_or("-".to_owned(), |a| a.to_string());
        let secs = self.time.rem_euclid(86_400.0);
        let mut line = format!(
            "{:02}:{:02}:{:09.6} {:<11} {:<6} {:<3} {} -> {}",
            (secs / 3600.0) as u64,
            ((secs % 3600.0) / 60.0) as u64,
            secs % 60.0,
            self.kind,
            self.layer,
            self.protocol,
            show(&self.client),
            show(&self.frontend),
        );
        if let Some(service) = &self.service {
            line.push_str(&format!(" ({service})"));
        }
        if let Some(backend) = &self.backend {
            line.push_str(&format!(" => {backend}"));
        }
        if let Some(algorithm) = &self.algorithm {
            line.push_str(&format!(" [{algorithm}]"));
        }
        if let (Some(reason), Some(verdict)) = (&self.reason, &self.verdict) {
            line.push_str(&format!(" {verdict}: {reason}"));
        }
        line
    }
}

#[cfg(test)]
mod tests;
