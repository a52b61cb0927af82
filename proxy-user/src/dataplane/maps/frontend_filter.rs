//! The agent's side of the pod path's first tests (see
//! `proxy_common::prefilter`): the frontend address bitmap, kept equal to
//! the frontends the maps hold. The quiet marks of pod interfaces are
//! [`crate::dataplane::flows::quiet_pods`]'s.
use std::collections::HashMap;

use aya::maps::{Array, IterableMap as _, MapData, MapError};
use proxy_common::{names, prefilter};

use crate::sync::encode::AnyFrontendKey;
use crate::sync::store::WriteError;

/// The frontend bitmap and what it counts: how many frontend keys (slot 0
/// of each address, port, protocol and scope) each bit stands for.
///
/// The keys themselves are not kept here: the frontend maps hold them. The
/// writer (the map store) counts a key when it puts a slot 0 the maps do not
/// hold yet ([`Self::add`]), and uncounts it once the maps deleted it
/// ([`Self::remove`]). A key counted twice (a failed batch written again)
/// only keeps its bits set after it is gone, which lets a few more packets
/// through to the lookup; a frontend never lacks its bits.
pub struct FrontendFilter {
    map: Array<MapData, u64>,
    /// How a hash indexes it (`prefilter::frontends::shift_for` its size).
    shift: u32,
    /// The bitmap as written.
    words: Vec<u64>,
    /// How many counted keys hash to each set bit.
    counts: HashMap<u32, u32>,
    /// While puts are held ([`Self::hold`]): the words that gained a bit
    /// and are not yet written.
    held: Option<Vec<u32>>,
    /// A release failed: the kernel's bitmap may lack bits, and the next
    /// write rewrites every word.
    stale: bool,
}

/// The bits a frontend key sets in a bitmap indexed with `shift`: its
/// address's and its (address, port, protocol)'s.
fn bits_of(key: &AnyFrontendKey, shift: u32) -> [u32; 2] {
    let (addr_bit, port_be, proto) = match key {
        AnyFrontendKey::V4(k) => (
            prefilter::frontends::bit4(k.addr_be, shift),
            k.port_be,
            k.proto,
        ),
        AnyFrontendKey::V6(k) => (
            prefilter::frontends::bit6(&k.addr_be, shift),
            k.port_be,
            k.proto,
        ),
    };
    [
        addr_bit,
        prefilter::frontends::port_bit(addr_bit, port_be, proto, shift),
    ]
}

/// The key that stands for a frontend: its slot 0.
fn head(key: AnyFrontendKey) -> AnyFrontendKey {
    match key {
        AnyFrontendKey::V4(mut k) => {
            k.slot = 0;
            AnyFrontendKey::V4(k)
        }
        AnyFrontendKey::V6(mut k) => {
            k.slot = 0;
            AnyFrontendKey::V6(k)
        }
    }
}

fn write_error(source: MapError) -> WriteError {
    WriteError::Other {
        map: names::FRONTEND_FILTER,
        source,
    }
}

impl FrontendFilter {
    /// Takes the bitmap over, rewritten for the frontends the maps already
    /// hold (`existing`): whatever an earlier agent left, or nothing when
    /// the map is new (an upgrade, a resize), it is whole before any
    /// program of ours reads it. Indexed for its size, as the programs
    /// loaded with it are.
    pub fn new(
        map: Array<MapData, u64>,
        existing: impl IntoIterator<Item = AnyFrontendKey>,
    ) -> Result<Self, WriteError> {
        let words = map.len();
        let mut filter = Self {
            map,
            shift: prefilter::frontends::shift_for(words),
            words: vec![0; words as usize],
            counts: HashMap::new(),
            held: None,
            stale: false,
        };
        for key in existing {
            filter.count(key);
        }
        // Every word (a stale bit would let an address that is no
        // frontend through), in a few system calls: at 100k Services the
        // bitmap has 2^17 words.
        filter.write_all()?;
        Ok(filter)
    }

    /// From now on the words a new frontend sets are written by
    /// [`Self::release`], together, rather than one system call each (the
    /// frontends they stand for are held as well: see the map store's
    /// `hold_puts`).
    pub fn hold(&mut self) {
        self.held.get_or_insert_with(Vec::new);
    }

    /// Writes the words held since [`Self::hold`], before any frontend held
    /// with them is written; writes go one at a time again. After a
    /// failure, the next write rewrites every word.
    pub fn release(&mut self) -> Result<(), WriteError> {
        let Some(mut held) = self.held.take() else {
            return Ok(());
        };
        held.sort_unstable();
        held.dedup();
        let written = self.write_words(&held);
        self.stale = written.is_err();
        written
    }

    /// Rewrites every word if a release failed.
    fn refresh(&mut self) -> Result<(), WriteError> {
        if self.stale {
            self.write_all()?;
            self.stale = false;
        }
        Ok(())
    }

    /// Writes every word of the bitmap.
    fn write_all(&mut self) -> Result<(), WriteError> {
        let all: Vec<u32> = (0..self.words.len() as u32).collect();
        self.write_words(&all)
    }

    /// Writes `indices` (each a word of the bitmap) in batches; if the
    /// kernel refuses a batch, one at a time.
    fn write_words(&mut self, indices: &[u32]) -> Result<(), WriteError> {
        let entries: Vec<(u32, u64)> = indices
            .iter()
            .map(|&index| (index, self.words[index as usize]))
            .collect();
        if crate::dataplane::maps::batch::update(self.map.map(), &entries).is_ok() {
            return Ok(());
        }
        for &index in indices {
            self.write(index)?;
        }
        Ok(())
    }

    /// Counts `key`'s frontend; the words of its bits that were clear
    /// before.
    fn count(&mut self, key: AnyFrontendKey) -> Vec<u32> {
        let key = head(key);
        let mut changed = Vec::new();
        for bit in bits_of(&key, self.shift) {
            let count = self.counts.entry(bit).or_insert(0);
            *count += 1;
            let (word, mask) = prefilter::frontends::word_and_mask(bit);
            self.words[word as usize] |= mask;
            if *count == 1 {
                changed.push(word);
            }
        }
        changed
    }

    /// Before the slot 0 of a frontend the maps do not hold yet is written:
    /// its bits are set.
    pub fn add(&mut self, key: AnyFrontendKey) -> Result<(), WriteError> {
        let changed = self.count(key);
        if let Some(held) = &mut self.held {
            held.extend(changed);
            return Ok(());
        }
        self.refresh()?;
        for word in changed {
            self.write(word)?;
        }
        Ok(())
    }

    /// After the maps deleted a frontend key they held: if it was a slot
    /// 0, each of its bits is cleared once no frontend left hashes to it.
    pub fn remove(&mut self, key: AnyFrontendKey) -> Result<(), WriteError> {
        if key != head(key) {
            // Only slot 0 stands for the frontend.
            return Ok(());
        }
        self.refresh()?;
        for bit in bits_of(&key, self.shift) {
            let Some(count) = self.counts.get_mut(&bit) else {
                continue;
            };
            *count -= 1;
            if *count > 0 {
                continue;
            }
            self.counts.remove(&bit);
            let (word, mask) = prefilter::frontends::word_and_mask(bit);
            self.words[word as usize] &= !mask;
            self.write(word)?;
        }
        Ok(())
    }

    /// The bitmap's map (for a second handle, as the tests that write
    /// frontends directly take).
    pub fn map(&self) -> &MapData {
        self.map.map()
    }

    fn write(&mut self, word: u32) -> Result<(), WriteError> {
        self.map
            .set(word, self.words[word as usize], 0)
            .map_err(write_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proxy_common::{scope, FrontendKey};

    const SHIFT: u32 = prefilter::frontends::shift_for(prefilter::frontends::MIN_WORDS);

    fn key(addr: [u8; 4], port: u16, slot: u16) -> AnyFrontendKey {
        AnyFrontendKey::V4(FrontendKey {
            addr_be: u32::from_ne_bytes(addr),
            port_be: port.to_be(),
            proto: 6,
            scope: scope::INTERNAL,
            slot,
            _pad1: [0; 2],
        })
    }

    #[test]
    fn the_head_stands_for_every_slot() {
        assert_eq!(head(key([10, 96, 0, 1], 80, 3)), key([10, 96, 0, 1], 80, 0));
        // One address: one address bit; its ports have bits of their own.
        let [a80, p80] = bits_of(&key([10, 96, 0, 1], 80, 3), SHIFT);
        let [a443, p443] = bits_of(&key([10, 96, 0, 1], 443, 0), SHIFT);
        assert_eq!(a80, a443);
        assert_ne!(p80, p443);
        assert_eq!(
            bits_of(&key([10, 96, 0, 1], 80, 3), SHIFT),
            bits_of(&key([10, 96, 0, 1], 80, 0), SHIFT)
        );
    }
}
