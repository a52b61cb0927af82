//! What the sandbox's tools print, parsed: `switchboard services -o json`
//! and `sb-echo client` lines.
use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;

/// One `switchboard services -o json` entry.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Frontend {
    pub service: String,
    #[serde(default)]
    pub id: u64,
    pub address: String,
    pub port: u16,
    pub protocol: String,
    /// ClusterIP, NodePort, LoadBalancer or ExternalIP (empty from an agent
    /// that does not say).
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub backends: Vec<Backend>,
    /// Under `externalTrafficPolicy: Local`: the backends traffic from
    /// outside the node gets (this node's endpoints).
    #[serde(default)]
    pub external_backends: Option<Vec<Backend>>,
    /// `loadBalancerSourceRanges` in force (`None`: open to every source).
    #[serde(default)]
    pub source_ranges: Option<Vec<String>>,
    /// Packets dropped by them.
    #[serde(default)]
    pub drops_source_range: u64,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct Backend {
    #[serde(default)]
    pub id: u64,
    pub address: String,
    pub port: u16,
    /// Its weight in a weighted set (`switchboard.io/weights`; 0: drained).
    #[serde(default)]
    pub weight: Option<u16>,
}

impl Frontend {
    /// Backends as sorted `address:port` strings.
    pub fn backend_addrs(&self) -> Vec<String> {
        addrs(&self.backends)
    }

    /// [`external_backends`](Self::external_backends) as sorted
    /// `address:port` strings.
    pub fn external_backend_addrs(&self) -> Option<Vec<String>> {
        self.external_backends.as_deref().map(addrs)
    }
}

/// `backends` as sorted `address:port` strings.
fn addrs(backends: &[Backend]) -> Vec<String> {
    let mut v: Vec<String> = backends
        .iter()
        .map(|b| format!("{}:{}", b.address, b.port))
        .collect();
    v.sort();
    v
}

/// Finds the frontend for `service` (e.g. `demo/echo:http`).
pub fn find<'a>(frontends: &'a [Frontend], service: &str) -> Option<&'a Frontend> {
    frontends.iter().find(|f| f.service == service)
}

/// Finds the frontend at `address:port` for `protocol` (`TCP` or `UDP`).
pub fn find_at<'a>(
    frontends: &'a [Frontend],
    address: &str,
    port: u16,
    protocol: &str,
) -> Option<&'a Frontend> {
    frontends
        .iter()
        .find(|f| f.address == address && f.port == port && f.protocol == protocol)
}

/// One attempt of `sb-echo client`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    Ok {
        start_ms: u128,
        /// Which pod answered.
        name: String,
        /// The peer address the pod saw (the client's address).
        pod_saw: String,
        /// The peer address the client saw (should be the ClusterIP).
        client_saw: String,
    },
    Err {
        start_ms: u128,
        message: String,
    },
}

impl Attempt {
    pub fn start_ms(&self) -> u128 {
        match self {
            Attempt::Ok { start_ms, .. } | Attempt::Err { start_ms, .. } => *start_ms,
        }
    }
    pub fn name(&self) -> Option<&str> {
        match self {
            Attempt::Ok { name, .. } => Some(name),
            Attempt::Err { .. } => None,
        }
    }
}

/// Parsed output of one `sb-echo client` run.
#[derive(Debug, Clone)]
pub struct ClientRun {
    pub attempts: Vec<Attempt>,
    pub raw: String,
}

impl ClientRun {
    pub fn parse(raw: &str) -> Result<ClientRun> {
        let mut attempts = Vec::new();
        for line in raw.lines().filter(|l| !l.trim().is_empty()) {
            let mut parts = line.splitn(3, ' ');
            let kind = parts.next().unwrap_or_default();
            let start_ms: u128 = parts
                .next()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| anyhow!("bad client line {line:?}"))?;
            let rest = parts.next().unwrap_or_default();
            attempts.push(match kind {
                "ok" => {
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    if f.len() < 3 {
                        bail!("bad client line {line:?}");
                    }
                    Attempt::Ok {
                        start_ms,
                        name: f[0].to_string(),
                        pod_saw: f[1].to_string(),
                        client_saw: f[2].to_string(),
                    }
                }
                "err" => Attempt::Err {
                    start_ms,
                    message: rest.to_string(),
                },
                _ => bail!("bad client line {line:?}"),
            });
        }
        Ok(ClientRun {
            attempts,
            raw: raw.to_string(),
        })
    }

    pub fn all_ok(&self) -> bool {
        !self.attempts.is_empty()
            && self
                .attempts
                .iter()
                .all(|a| matches!(a, Attempt::Ok { .. }))
    }

    pub fn failures(&self) -> usize {
        self.attempts
            .iter()
            .filter(|a| matches!(a, Attempt::Err { .. }))
            .count()
    }

    /// Names of the pods that answered, in order.
    pub fn names(&self) -> Vec<String> {
        self.attempts
            .iter()
            .filter_map(|a| a.name().map(str::to_string))
            .collect()
    }

    /// How many answers each pod gave.
    pub fn spread(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for n in self.names() {
            *m.entry(n).or_insert(0) += 1;
        }
        m
    }

    /// Distinct peer addresses the client saw.
    pub fn client_saw(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .attempts
            .iter()
            .filter_map(|a| match a {
                Attempt::Ok { client_saw, .. } => Some(client_saw.clone()),
                Attempt::Err { .. } => None,
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }
}
