//! The maps as the sync sees them: the writes it makes ([`MapStore`]), what
//! it reads back ([`Dump`]), how a write fails ([`WriteError`]), and how many
//! entries each map holds ([`Capacities`]). The data plane implements the
//! store on the pinned maps; the sync's tests use an in-memory one.
use aya::maps::MapError;
use proxy_common::{
    capacity, CtEntry, CtEntry6, CtKey, CtKey6, FrontendSlot, MaglevTable, SockEntry, SockEntry6,
    SockKey, SockKey6,
};

use crate::{
    model::{cidr::IpCidr, IpFamily},
    sync::encode::{AnyBackend, AnyFrontendKey, AnyRevNat},
};

/// How many entries each map holds. A pinned map of another size is resized
/// by the agent at start (the data plane's `resize`).
#[derive(Clone, Copy, Debug)]
pub struct Capacities {
    pub frontends: u32,
    pub backends: u32,
    pub conntrack: u32,
    pub services: u32,
    /// How big the IPv6 flow tables are (conntrack, socket layer, affinity,
    /// fragments): the node's IPv6 Services decide it (see the agent).
    pub ipv6: Ipv6Tables,
}

/// The size of a node's IPv6 flow tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipv6Tables {
    /// Sized like their IPv4 twins: the node has IPv6 Services (or had
    /// them: tables with live entries are never shrunk).
    Full,
    /// [`capacity::IPV6_IDLE`] entries each: the node has no IPv6 Service.
    Idle,
}

impl Capacities {
    /// The per-service counter array is indexed by service id, and ids are
    /// `1..=services` (0 means none): one entry more than `services`.
    pub fn service_stats_entries(&self) -> u32 {
        self.services.saturating_add(1)
    }

    /// The frontend bitmap's 64-bit words, sized with the frontend map
    /// (`proxy_common::prefilter::frontends::words_for`).
    pub fn frontend_filter_words(&self) -> u32 {
        proxy_common::prefilter::frontends::words_for(self.frontends)
    }
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            frontends: capacity::FRONTENDS,
            backends: capacity::BACKENDS,
            conntrack: capacity::CONNTRACK,
            services: capacity::SERVICES,
            ipv6: Ipv6Tables::Full,
        }
    }
}

/// A map write failed. `Full` is told apart so the caller can report the
/// service that did not fit and carry on with the rest.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("map {map} is full")]
    Full { map: &'static str },
    #[error("writing map {map}")]
    Other { map: &'static str, source: MapError },
}

/// The writes and reads the sync engine performs.
///
/// Frontends, backends and reverse-NAT entries go to their family's map: the
/// variant of the key or value picks it (a backend id or service id lives in
/// one family's map, so its deletion names the family). Maglev tables are
/// shared by both families (by service id).
pub trait MapStore {
    fn put_frontend(&mut self, key: AnyFrontendKey, value: FrontendSlot) -> Result<(), WriteError>;
    fn delete_frontend(&mut self, key: AnyFrontendKey) -> Result<(), WriteError>;
    fn put_backend(&mut self, id: u32, value: AnyBackend) -> Result<(), WriteError>;
    fn delete_backend(&mut self, id: u32, family: IpFamily) -> Result<(), WriteError>;
    fn put_revnat(&mut self, service_id: u32, value: AnyRevNat) -> Result<(), WriteError>;
    fn delete_revnat(&mut self, service_id: u32, family: IpFamily) -> Result<(), WriteError>;
    /// Writes service `service_id`'s Maglev table.
    fn put_maglev(&mut self, service_id: u32, table: &MaglevTable) -> Result<(), WriteError>;
    /// Removes service `service_id`'s Maglev table (absent is fine).
    fn delete_maglev(&mut self, service_id: u32) -> Result<(), WriteError>;
    /// Reads service `service_id`'s Maglev table into `into`; `Ok(false)`
    /// when there is none.
    fn maglev(&self, service_id: u32, into: &mut MaglevTable) -> std::io::Result<bool>;
    /// The service ids of up to `max` Maglev tables after `after` in the
    /// map's own order (from the first when `after` is `None` or gone):
    /// fewer than `max` once the last is reached. A walk that goes on
    /// from where the last call stopped visits every table.
    fn maglev_ids(&self, after: Option<u32>, max: usize) -> std::io::Result<Vec<u32>>;
    /// Allows the client block `block` to reach service `service_id`
    /// (`loadBalancerSourceRanges`; the block's family picks the map).
    fn put_source_range(&mut self, service_id: u32, block: IpCidr) -> Result<(), WriteError>;
    /// Removes a block [`put_source_range`](Self::put_source_range) wrote
    /// (absent is fine).
    fn delete_source_range(&mut self, service_id: u32, block: IpCidr) -> Result<(), WriteError>;
    /// Removes every connection-tracking entry `doomed` selects; returns how many.
    fn purge_conntrack(&mut self, doomed: &dyn Fn(&CtKey, &CtEntry) -> bool) -> usize;
    /// Removes every socket-layer entry `doomed` selects; returns their keys.
    fn purge_sockets(&mut self, doomed: &dyn Fn(&SockKey, &SockEntry) -> bool) -> Vec<SockKey>;
    /// [`purge_conntrack`](Self::purge_conntrack) for the IPv6 table.
    /// The sync calls it for removed IPv6 service ports and departed IPv6
    /// UDP backends. Default: nothing to purge (a store without the table).
    fn purge_conntrack6(&mut self, doomed: &dyn Fn(&CtKey6, &CtEntry6) -> bool) -> usize {
        let _ = doomed;
        0
    }
    /// [`purge_sockets`](Self::purge_sockets) for the IPv6 socket table.
    fn purge_sockets6(&mut self, doomed: &dyn Fn(&SockKey6, &SockEntry6) -> bool) -> Vec<SockKey6> {
        let _ = doomed;
        Vec::new()
    }
    /// Everything in the frontend, backend and reverse-NAT maps of both
    /// families, for adopting what an earlier agent programmed.
    fn dump(&self) -> Dump;
    /// From here until [`flush`](Self::flush), frontend, backend and
    /// reverse-NAT puts may be held and written together. Only for a sync
    /// that deletes nothing (the first one into empty maps): the flush
    /// writes every held put before any slot 0, so no lookup meets a slot
    /// or a backend that is not there yet, but deletes are not held.
    fn hold_puts(&mut self) {}
    /// Writes the held puts; returns how many. After an error the maps hold
    /// an unknown part of them (the caller reloads its view from the maps).
    fn flush(&mut self) -> Result<usize, WriteError> {
        Ok(0)
    }
}

/// A copy of the frontend, backend and reverse-NAT maps, both families.
#[derive(Clone, Debug, Default)]
pub struct Dump {
    pub frontends: Vec<(AnyFrontendKey, FrontendSlot)>,
    pub backends: Vec<(u32, AnyBackend)>,
    pub revnat: Vec<(u32, AnyRevNat)>,
    /// `loadBalancerSourceRanges` blocks by service id, both families.
    pub source_ranges: Vec<(u32, IpCidr)>,
}
