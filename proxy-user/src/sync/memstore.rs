//! An in-memory stand-in for the kernel maps, for the sync engine's tests.
use std::collections::BTreeMap;

use proxy_common::{Backend, CtEntry, CtKey, FrontendKey, FrontendSlot, MaglevTable, RevNat, SockEntry, SockKey};

use crate::{
    encode::{backend_addr, frontend_key},
    maps::{Dump, MapStore, WriteError},
    model::{BackendAddr, FrontendAddr},
};

/// An in-memory stand-in for the kernel maps, counting writes.
#[derive(Default)]
pub(crate) struct MemStore {
    pub(crate) frontends: BTreeMap<(u32, u16, u8, u8, u16), FrontendSlot>,
    /// Frontend writes in order (`put`/`delete` and the key).
    pub(crate) log: Vec<String>,
    /// Maglev tables by service id.
    pub(crate) maglev: BTreeMap<u32, Vec<u32>>,
    pub(crate) backends: BTreeMap<u32, Backend>,
    pub(crate) revnat: BTreeMap<u32, RevNat>,
    pub(crate) conntrack: Vec<(CtKey, CtEntry)>,
    pub(crate) sockets: Vec<(SockKey, SockEntry)>,
    pub(crate) writes: usize,
    pub(crate) frontend_limit: Option<usize>,
    /// Every write after this many fails, as if the agent had stopped there.
    pub(crate) stop_after: Option<usize>,
}

pub(crate) fn k(key: &FrontendKey) -> (u32, u16, u8, u8, u16) {
    (key.addr_be, key.port_be, key.proto, key.scope, key.slot)
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
    fn put_frontend(
        &mut self,
        key: FrontendKey,
        value: FrontendSlot,
    ) -> Result<(), WriteError> {
        if let Some(limit) = self.frontend_limit {
            if self.frontends.len() >= limit && !self.frontends.contains_key(&k(&key)) {
                return Err(WriteError::Full { map: "frontends" });
            }
        }
        self.write("frontends")?;
        self.log.push(format!("put {:?}", k(&key)));
        self.frontends.insert(k(&key), value);
        Ok(())
    }
    fn delete_frontend(&mut self, key: FrontendKey) -> Result<(), WriteError> {
        self.write("frontends")?;
        self.log.push(format!("delete {:?}", k(&key)));
        self.frontends.remove(&k(&key));
        Ok(())
    }
    fn put_backend(&mut self, id: u32, value: Backend) -> Result<(), WriteError> {
        self.write("backends")?;
        self.backends.insert(id, value);
        Ok(())
    }
    fn delete_backend(&mut self, id: u32) -> Result<(), WriteError> {
        self.write("backends")?;
        self.backends.remove(&id);
        Ok(())
    }
    fn put_revnat(&mut self, id: u32, value: RevNat) -> Result<(), WriteError> {
        self.write("revnat")?;
        self.revnat.insert(id, value);
        Ok(())
    }
    fn delete_revnat(&mut self, id: u32) -> Result<(), WriteError> {
        self.write("revnat")?;
        self.revnat.remove(&id);
        Ok(())
    }
    fn put_maglev(&mut self, id: u32, table: &MaglevTable) -> Result<(), WriteError> {
        self.write("maglev")?;
        self.maglev.insert(id, table.backend_ids.to_vec());
        Ok(())
    }
    fn delete_maglev(&mut self, id: u32) -> Result<(), WriteError> {
        self.write("maglev")?;
        self.maglev.remove(&id);
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
    fn dump(&self) -> Dump {
        Dump {
            frontends: self
                .frontends
                .iter()
                .map(|(&(addr_be, port_be, proto, scope, slot), v)| {
                    (
                        FrontendKey {
                            addr_be,
                            port_be,
                            proto,
                            scope,
                            slot,
                            ..FrontendKey::default()
                        },
                        *v,
                    )
                })
                .collect(),
            backends: self.backends.iter().map(|(k, v)| (*k, *v)).collect(),
            revnat: self.revnat.iter().map(|(k, v)| (*k, *v)).collect(),
        }
    }
}

impl MemStore {
    /// The backends the data path would choose from, per frontend.
    pub(crate) fn view(&self, addr: &FrontendAddr) -> Option<Vec<BackendAddr>> {
        let head = self.frontends.get(&k(&frontend_key(addr, 0)))?;
        let mut out = Vec::new();
        for slot in 1..=head.backend_count {
            let v = self.frontends.get(&k(&frontend_key(addr, slot)))?;
            out.push(backend_addr(self.backends.get(&v.backend_id)?));
        }
        out.sort();
        Some(out)
    }
}
