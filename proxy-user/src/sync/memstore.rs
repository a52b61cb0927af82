//! An in-memory stand-in for the kernel maps, for the sync engine's tests,
//! and its contents and writes as text (`sync/maptext.rs`).
use std::collections::BTreeMap;

use proxy_common::{
    CtEntry, CtEntry6, CtKey, CtKey6, FrontendSlot, MaglevTable, SockEntry, SockEntry6, SockKey,
    SockKey6,
};

use crate::{
    model::cidr::IpCidr,
    model::{BackendAddr, IpFamily},
    sync::encode::{backend_addr, AnyBackend, AnyFrontendKey, AnyRevNat},
    sync::maptext::{self, Flow, Socket},
    sync::store::{Dump, MapStore, WriteError},
};

/// An in-memory stand-in for the kernel maps, counting writes.
#[derive(Default)]
pub(crate) struct MemStore {
    /// Both families' frontend maps (the key says which).
    pub(crate) frontends: BTreeMap<FeKey, FrontendSlot>,
    /// Every write in order, as text: `put ENTRY` or `delete KEY`.
    pub(crate) log: Vec<String>,
    /// Maglev tables by service id.
    pub(crate) maglev: BTreeMap<u32, Vec<u32>>,
    /// Both families' backend maps, by (family, id): an id may be in both,
    /// as in the kernel, and adoption must notice.
    pub(crate) backends: BTreeMap<(IpFamily, u32), AnyBackend>,
    pub(crate) revnat: BTreeMap<(IpFamily, u32), AnyRevNat>,
    /// `loadBalancerSourceRanges` blocks, both families.
    pub(crate) source_ranges: std::collections::BTreeSet<(u32, IpCidr)>,
    pub(crate) conntrack: Vec<(CtKey, CtEntry)>,
    pub(crate) sockets: Vec<(SockKey, SockEntry)>,
    pub(crate) conntrack6: Vec<(CtKey6, CtEntry6)>,
    pub(crate) sockets6: Vec<(SockKey6, SockEntry6)>,
    pub(crate) writes: usize,
    pub(crate) frontend_limit: Option<usize>,
    /// Every write after this many fails, as if the agent had stopped there.
    pub(crate) stop_after: Option<usize>,
}

/// A frontend key as an ordered tuple: (family, address words, port, proto,
/// scope, slot). The IPv4 address is the first word, the rest zero.
pub(crate) type FeKey = (IpFamily, [u32; 4], u16, u8, u8, u16);

pub(crate) fn k(key: &AnyFrontendKey) -> FeKey {
    match key {
        AnyFrontendKey::V4(key) => (
            IpFamily::V4,
            [key.addr_be, 0, 0, 0],
            key.port_be,
            key.proto,
            key.scope,
            key.slot,
        ),
        AnyFrontendKey::V6(key) => (
            IpFamily::V6,
            key.addr_be,
            key.port_be,
            key.proto,
            key.scope,
            key.slot,
        ),
    }
}

fn unk(&(family, addr_be, port_be, proto, scope, slot): &FeKey) -> AnyFrontendKey {
    match family {
        IpFamily::V4 => AnyFrontendKey::V4(proxy_common::FrontendKey {
            addr_be: addr_be[0],
            port_be,
            proto,
            scope,
            slot,
            ..Default::default()
        }),
        IpFamily::V6 => AnyFrontendKey::V6(proxy_common::FrontendKey6 {
            addr_be,
            port_be,
            proto,
            scope,
            slot,
            ..Default::default()
        }),
    }
}

impl MemStore {
    /// Counts one write to `map`, or refuses it once the store has stopped.
    fn write(&mut self, map: &'static str) -> Result<(), WriteError> {
        if self.stop_after.is_some_and(|stop| self.writes >= stop) {
            return Err(WriteError::Other {
                map,
                source: aya::maps::MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_update_elem",
                    io_error: std::io::Error::from_raw_os_error(libc::EIO),
                }),
            });
        }
        self.writes += 1;
        Ok(())
    }
}

impl MapStore for MemStore {
    fn put_frontend(&mut self, key: AnyFrontendKey, value: FrontendSlot) -> Result<(), WriteError> {
        if let Some(limit) = self.frontend_limit {
            if self.frontends.len() >= limit && !self.frontends.contains_key(&k(&key)) {
                return Err(WriteError::Full { map: "frontends" });
            }
        }
        self.write("frontends")?;
        self.log
            .push(format!("put {}", maptext::frontend(&key, &value)));
        self.frontends.insert(k(&key), value);
        Ok(())
    }
    fn delete_frontend(&mut self, key: AnyFrontendKey) -> Result<(), WriteError> {
        self.write("frontends")?;
        self.log
            .push(format!("delete {}", maptext::frontend_key(&key)));
        self.frontends.remove(&k(&key));
        Ok(())
    }
    fn put_backend(&mut self, id: u32, value: AnyBackend) -> Result<(), WriteError> {
        self.write("backends")?;
        self.log
            .push(format!("put {}", maptext::backend(id, &value)));
        self.backends.insert((value.family(), id), value);
        Ok(())
    }
    fn delete_backend(&mut self, id: u32, family: IpFamily) -> Result<(), WriteError> {
        self.write("backends")?;
        self.log
            .push(format!("delete {}", maptext::by_id("backend", id, family)));
        self.backends.remove(&(family, id));
        Ok(())
    }
    fn put_revnat(&mut self, id: u32, value: AnyRevNat) -> Result<(), WriteError> {
        self.write("revnat")?;
        self.log
            .push(format!("put {}", maptext::revnat(id, &value)));
        self.revnat.insert((value.family(), id), value);
        Ok(())
    }
    fn delete_revnat(&mut self, id: u32, family: IpFamily) -> Result<(), WriteError> {
        self.write("revnat")?;
        self.log
            .push(format!("delete {}", maptext::by_id("revnat", id, family)));
        self.revnat.remove(&(family, id));
        Ok(())
    }
    fn put_maglev(&mut self, id: u32, table: &MaglevTable) -> Result<(), WriteError> {
        self.write("maglev")?;
        self.log
            .push(format!("put {}", self.maglev_text(id, &table.backend_ids)));
        self.maglev.insert(id, table.backend_ids.to_vec());
        Ok(())
    }
    fn delete_maglev(&mut self, id: u32) -> Result<(), WriteError> {
        self.write("maglev")?;
        self.log.push(format!("delete maglev {id}"));
        self.maglev.remove(&id);
        Ok(())
    }
    fn maglev(&self, id: u32, into: &mut MaglevTable) -> std::io::Result<bool> {
        let Some(table) = self.maglev.get(&id) else {
            return Ok(false);
        };
        into.backend_ids.copy_from_slice(table);
        Ok(true)
    }
    fn maglev_ids(&self, after: Option<u32>, max: usize) -> std::io::Result<Vec<u32>> {
        let from = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        Ok(self
            .maglev
            .range((from, std::ops::Bound::Unbounded))
            .map(|(id, _)| *id)
            .take(max)
            .collect())
    }
    fn put_source_range(&mut self, id: u32, block: IpCidr) -> Result<(), WriteError> {
        self.write("source_range")?;
        self.log.push(format!("put {}", maptext::range(id, &block)));
        self.source_ranges.insert((id, block));
        Ok(())
    }
    fn delete_source_range(&mut self, id: u32, block: IpCidr) -> Result<(), WriteError> {
        self.write("source_range")?;
        self.log
            .push(format!("delete {}", maptext::range(id, &block)));
        self.source_ranges.remove(&(id, block));
        Ok(())
    }
    fn purge_conntrack(&mut self, doomed: &dyn Fn(&CtKey, &CtEntry) -> bool) -> usize {
        let before = self.conntrack.len();
        self.conntrack.retain(|(key, entry)| !doomed(key, entry));
        before - self.conntrack.len()
    }
    fn purge_sockets(&mut self, doomed: &dyn Fn(&SockKey, &SockEntry) -> bool) -> Vec<SockKey> {
        let (gone, kept) = self
            .sockets
            .drain(..)
            .partition(|(key, entry)| doomed(key, entry));
        self.sockets = kept;
        gone.into_iter().map(|(key, _)| key).collect::<Vec<_>>()
    }
    fn purge_conntrack6(&mut self, doomed: &dyn Fn(&CtKey6, &CtEntry6) -> bool) -> usize {
        let before = self.conntrack6.len();
        self.conntrack6.retain(|(key, entry)| !doomed(key, entry));
        before - self.conntrack6.len()
    }
    fn purge_sockets6(&mut self, doomed: &dyn Fn(&SockKey6, &SockEntry6) -> bool) -> Vec<SockKey6> {
        let (gone, kept) = self
            .sockets6
            .drain(..)
            .partition(|(key, entry)| doomed(key, entry));
        self.sockets6 = kept;
        gone.into_iter().map(|(key, _)| key).collect::<Vec<_>>()
    }
    fn dump(&self) -> Dump {
        Dump {
            frontends: self
                .frontends
                .iter()
                .map(|(key, v)| (unk(key), *v))
                .collect(),
            backends: self.backends.iter().map(|(&(_, id), v)| (id, *v)).collect(),
            revnat: self.revnat.iter().map(|(&(_, id), v)| (id, *v)).collect(),
            source_ranges: self.source_ranges.iter().copied().collect(),
        }
    }
}

impl MemStore {
    /// A Maglev table as text, its ids resolved to the addresses this
    /// store's backend maps hold.
    fn maglev_text(&self, id: u32, table: &[u32]) -> String {
        maptext::maglev(id, table, |backend| {
            [IpFamily::V4, IpFamily::V6]
                .iter()
                .find_map(|f| self.backends.get(&(*f, backend)))
                .map_or_else(
                    || format!("missing {backend}"),
                    |b| backend_addr(b).to_string(),
                )
        })
    }

    /// Every map, one entry a line (`sync/maptext.rs`): frontends in
    /// address order, then backends, reverse-NAT entries, Maglev tables and
    /// source ranges by id, then the flows and sockets as they were put.
    pub(crate) fn text(&self) -> String {
        let mut frontends: Vec<(AnyFrontendKey, &FrontendSlot)> = self
            .frontends
            .iter()
            .map(|(key, v)| (unk(key), v))
            .collect();
        frontends
            .sort_by_key(|(key, _)| (key.ip(), key.port(), key.proto(), key.scope(), key.slot()));
        let mut lines: Vec<String> = frontends
            .iter()
            .map(|(key, slot)| maptext::frontend(key, slot))
            .collect();
        let mut backends: Vec<_> = self.backends.iter().collect();
        backends.sort_by_key(|((family, id), _)| (*id, *family));
        lines.extend(backends.iter().map(|((_, id), b)| maptext::backend(*id, b)));
        let mut revnat: Vec<_> = self.revnat.iter().collect();
        revnat.sort_by_key(|((family, id), _)| (*id, *family));
        lines.extend(revnat.iter().map(|((_, id), r)| maptext::revnat(*id, r)));
        lines.extend(self.maglev.iter().map(|(id, t)| self.maglev_text(*id, t)));
        lines.extend(
            self.source_ranges
                .iter()
                .map(|(id, b)| maptext::range(*id, b)),
        );
        lines.extend(self.conntrack.iter().map(|(key, entry)| {
            maptext::flow(&Flow {
                family: IpFamily::V4,
                proto: key.proto,
                service_id: entry.service_id,
                backend_id: entry.backend_id,
            })
        }));
        lines.extend(self.conntrack6.iter().map(|(key, entry)| {
            maptext::flow(&Flow {
                family: IpFamily::V6,
                proto: key.proto,
                service_id: entry.service_id,
                backend_id: entry.backend_id,
            })
        }));
        lines.extend(self.sockets.iter().map(|(key, entry)| {
            maptext::socket(&Socket {
                cookie: key.cookie,
                dir: key.dir,
                proto: key.proto,
                addr: BackendAddr {
                    ip: crate::sync::encode::ipv4(key.addr_be).into(),
                    port: u16::from_be(key.port_be),
                },
                service_id: entry.service_id,
                backend_id: entry.backend_id,
            })
        }));
        lines.extend(self.sockets6.iter().map(|(key, entry)| {
            maptext::socket(&Socket {
                cookie: key.cookie,
                dir: key.dir,
                proto: key.proto,
                addr: BackendAddr {
                    ip: crate::sync::encode::ipv6(key.addr_be).into(),
                    port: u16::from_be(key.port_be),
                },
                service_id: entry.service_id,
                backend_id: entry.backend_id,
            })
        }));
        lines.iter().map(|l| format!("{l}\n")).collect()
    }
}
