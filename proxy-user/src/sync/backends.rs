//! The backends the sync has written: each one's id, address, protocol and
//! how many slots name it, found by address (to share an entry between
//! frontends) and by id (to read a slot back).
//!
//! At 100k Services × 10 endpoints this is a million entries, so each is
//! held once, in its family's compact form: an IPv4 backend takes 16 bytes
//! in a dense vector, and the two indexes over it hold 4-byte positions
//! (two hash maps keyed both ways, with 16-byte addresses, took over 120
//! MiB for the same million).
use std::hash::{BuildHasher, Hash};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hashbrown::{DefaultHashBuilder, HashTable};

use crate::model::{BackendAddr, IpFamily, Protocol};

/// An address family's address, as a table holds it.
trait Address: Copy + Eq + Hash {
    fn ip(self) -> IpAddr;
}

impl Address for Ipv4Addr {
    fn ip(self) -> IpAddr {
        IpAddr::V4(self)
    }
}

impl Address for Ipv6Addr {
    fn ip(self) -> IpAddr {
        IpAddr::V6(self)
    }
}

/// One backend entry of the maps.
#[derive(Clone, Copy, Debug)]
struct Entry<A> {
    id: u32,
    /// Slots naming it (at least 1 while it is held).
    refs: u32,
    ip: A,
    port: u16,
    protocol: Protocol,
}

impl<A: Address> Entry<A> {
    fn key(&self) -> (A, u16, Protocol) {
        (self.ip, self.port, self.protocol)
    }

    fn backend(&self) -> (BackendAddr, Protocol) {
        let addr = BackendAddr {
            ip: self.ip.ip(),
            port: self.port,
        };
        (addr, self.protocol)
    }
}

/// One family's backends: the entries, dense, and two indexes of
/// positions in them.
struct Table<A> {
    entries: Vec<Entry<A>>,
    by_key: HashTable<u32>,
    by_id: HashTable<u32>,
    hasher: DefaultHashBuilder,
}

impl<A: Address> Default for Table<A> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            by_key: HashTable::new(),
            by_id: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
        }
    }
}

impl<A: Address> Table<A> {
    fn find(&self, key: (A, u16, Protocol)) -> Option<usize> {
        let hash = self.hasher.hash_one(key);
        self.by_key
            .find(hash, |&i| self.entries[i as usize].key() == key)
            .map(|&i| i as usize)
    }

    fn find_id(&self, id: u32) -> Option<usize> {
        let hash = self.hasher.hash_one(id);
        self.by_id
            .find(hash, |&i| self.entries[i as usize].id == id)
            .map(|&i| i as usize)
    }

    fn insert(&mut self, entry: Entry<A>) {
        let Ok(position) = u32::try_from(self.entries.len()) else {
            // More than 4 billion backends cannot be in a map.
            return;
        };
        self.entries.push(entry);
        let (entries, hasher) = (&self.entries, &self.hasher);
        self.by_key
            .insert_unique(hasher.hash_one(entry.key()), position, |&i| {
                hasher.hash_one(entries[i as usize].key())
            });
        self.by_id
            .insert_unique(hasher.hash_one(entry.id), position, |&i| {
                hasher.hash_one(entries[i as usize].id)
            });
    }

    fn id_of(&self, key: (A, u16, Protocol)) -> Option<u32> {
        self.find(key).map(|i| self.entries[i].id)
    }

    fn acquire(&mut self, key: (A, u16, Protocol)) -> Option<u32> {
        let i = self.find(key)?;
        let entry = &mut self.entries[i];
        entry.refs += 1;
        Some(entry.id)
    }

    fn hold(&mut self, id: u32, (ip, port, protocol): (A, u16, Protocol)) {
        match self.find_id(id) {
            Some(i) => self.entries[i].refs += 1,
            None => self.insert(Entry {
                id,
                refs: 1,
                ip,
                port,
                protocol,
            }),
        }
    }

    /// One reference fewer on the entry at `i`; its backend when none is left.
    fn release_at(&mut self, i: usize) -> Option<(BackendAddr, Protocol)> {
        let entry = &mut self.entries[i];
        entry.refs = entry.refs.saturating_sub(1);
        (entry.refs == 0).then(|| entry.backend())
    }

    /// Removes the entry at `position`; the last entry moves into its place.
    fn remove_at(&mut self, position: usize) {
        let gone = self.entries[position];
        self.unindex(gone, position, None);
        let last = self.entries.len() - 1;
        if position != last {
            let moved = self.entries[last];
            self.unindex(moved, last, Some(position));
        }
        self.entries.swap_remove(position);
    }

    /// Drops `entry`'s index entries pointing at `from`, or points them at
    /// `to`.
    fn unindex(&mut self, entry: Entry<A>, from: usize, to: Option<usize>) {
        let from = from as u32;
        for (table, hash) in [
            (&mut self.by_key, self.hasher.hash_one(entry.key())),
            (&mut self.by_id, self.hasher.hash_one(entry.id)),
        ] {
            if let Ok(found) = table.find_entry(hash, |&i| i == from) {
                match to {
                    Some(to) => *found.into_mut() = to as u32,
                    None => {
                        found.remove();
                    }
                }
            }
        }
    }
}

/// Both families' backends. An id names one entry in one family (the
/// sync's allocator hands out ids for both).
#[derive(Default)]
pub(super) struct Backends {
    v4: Table<Ipv4Addr>,
    v6: Table<Ipv6Addr>,
    /// No id above this was ever held: the allocator's next id is most
    /// often past it, and then free without a lookup in either table.
    highest: u32,
}

impl Backends {
    pub(super) fn clear(&mut self) {
        *self = Self::default();
    }

    /// Entries held in `family`'s map.
    pub(super) fn len(&self, family: IpFamily) -> usize {
        match family {
            IpFamily::V4 => self.v4.entries.len(),
            IpFamily::V6 => self.v6.entries.len(),
        }
    }

    /// The id of the entry for `backend`, if there is one.
    pub(super) fn id_of(&self, backend: BackendAddr, protocol: Protocol) -> Option<u32> {
        match backend.ip {
            IpAddr::V4(ip) => self.v4.id_of((ip, backend.port, protocol)),
            IpAddr::V6(ip) => self.v6.id_of((ip, backend.port, protocol)),
        }
    }

    /// The backend an id names.
    pub(super) fn get(&self, id: u32) -> Option<(BackendAddr, Protocol)> {
        let v4 = self.v4.find_id(id).map(|i| self.v4.entries[i].backend());
        v4.or_else(|| self.v6.find_id(id).map(|i| self.v6.entries[i].backend()))
    }

    pub(super) fn contains_id(&self, id: u32) -> bool {
        id <= self.highest && (self.v4.find_id(id).is_some() || self.v6.find_id(id).is_some())
    }

    /// The largest id held.
    pub(super) fn max_id(&self) -> Option<u32> {
        let v4 = self.v4.entries.iter().map(|e| e.id);
        v4.chain(self.v6.entries.iter().map(|e| e.id)).max()
    }

    /// One more slot names `backend`: its id, if it has an entry.
    pub(super) fn acquire(&mut self, backend: BackendAddr, protocol: Protocol) -> Option<u32> {
        match backend.ip {
            IpAddr::V4(ip) => self.v4.acquire((ip, backend.port, protocol)),
            IpAddr::V6(ip) => self.v6.acquire((ip, backend.port, protocol)),
        }
    }

    /// One slot names `backend` under `id`: a new entry with one reference,
    /// or one more reference on the entry `id` already has (adopting maps
    /// where several slots name it).
    pub(super) fn hold(&mut self, id: u32, backend: BackendAddr, protocol: Protocol) {
        self.highest = self.highest.max(id);
        match backend.ip {
            IpAddr::V4(ip) => self.v4.hold(id, (ip, backend.port, protocol)),
            IpAddr::V6(ip) => self.v6.hold(id, (ip, backend.port, protocol)),
        }
    }

    /// One slot fewer names `id`. Returns the backend when no slot names it
    /// any more: the caller deletes its map entry, then
    /// [`remove`](Self::remove)s it.
    pub(super) fn release(&mut self, id: u32) -> Option<(BackendAddr, Protocol)> {
        match self.v4.find_id(id) {
            Some(i) => self.v4.release_at(i),
            None => {
                let i = self.v6.find_id(id)?;
                self.v6.release_at(i)
            }
        }
    }

    /// Every entry held: id, backend and protocol (both families).
    pub(super) fn all(&self) -> impl Iterator<Item = (u32, BackendAddr, Protocol)> + '_ {
        let v4 = self.v4.entries.iter().map(|e| {
            let (b, p) = e.backend();
            (e.id, b, p)
        });
        v4.chain(self.v6.entries.iter().map(|e| {
            let (b, p) = e.backend();
            (e.id, b, p)
        }))
    }

    /// Forgets the entry of `id`.
    pub(super) fn remove(&mut self, id: u32) {
        if let Some(i) = self.v4.find_id(id) {
            self.v4.remove_at(i);
        } else if let Some(i) = self.v6.find_id(id) {
            self.v6.remove_at(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(last: u8, port: u16) -> BackendAddr {
        BackendAddr {
            ip: IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)),
            port,
        }
    }

    fn v6(last: u16, port: u16) -> BackendAddr {
        BackendAddr {
            ip: IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, last)),
            port,
        }
    }

    #[test]
    fn found_by_address_and_by_id_until_the_last_reference_goes() {
        let mut b = Backends::default();
        b.hold(7, v4(1, 80), Protocol::Tcp);
        b.hold(9, v6(1, 80), Protocol::Tcp);
        assert_eq!(b.acquire(v4(1, 80), Protocol::Tcp), Some(7));
        assert_eq!(
            b.acquire(v4(1, 80), Protocol::Udp),
            None,
            "protocol is part of the key"
        );
        assert_eq!(
            b.acquire(v4(1, 81), Protocol::Tcp),
            None,
            "port is part of the key"
        );
        assert_eq!(b.get(9), Some((v6(1, 80), Protocol::Tcp)));
        assert_eq!((b.len(IpFamily::V4), b.len(IpFamily::V6)), (1, 1));

        assert_eq!(b.release(7), None, "one slot still names it");
        assert_eq!(b.release(7), Some((v4(1, 80), Protocol::Tcp)));
        b.remove(7);
        assert_eq!(b.get(7), None);
        assert_eq!(b.id_of(v4(1, 80), Protocol::Tcp), None);
        assert_eq!(b.id_of(v6(1, 80), Protocol::Tcp), Some(9));
        assert_eq!(b.max_id(), Some(9));
    }

    #[test]
    fn removing_from_the_middle_keeps_every_other_entry_reachable() {
        let mut b = Backends::default();
        for i in 0..200u8 {
            b.hold(u32::from(i) + 1, v4(i, 80), Protocol::Tcp);
        }
        for i in (0..200u8).step_by(3) {
            assert!(b.release(u32::from(i) + 1).is_some());
            b.remove(u32::from(i) + 1);
        }
        for i in 0..200u8 {
            let id = u32::from(i) + 1;
            let kept = i % 3 != 0;
            assert_eq!(b.contains_id(id), kept, "id {id}");
            assert_eq!(b.id_of(v4(i, 80), Protocol::Tcp), kept.then_some(id));
            assert_eq!(b.get(id).is_some(), kept);
        }
        assert_eq!(b.len(IpFamily::V4), 200 - 67);
    }
}
