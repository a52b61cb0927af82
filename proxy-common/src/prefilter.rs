//! The pod path's first tests, before any hash lookup: most packets a pod
//! sends or receives are not a Service's, and each such packet should cost
//! little more than an empty program.
//!
//! - [`frontends`]: a bitmap over the addresses of every frontend, both
//!   families, one bit per hash bucket, and in the same bitmap over their
//!   (address, port, protocol). A clear bit proves the destination is no
//!   frontend; a set bit sends the packet on to the lookups (a collision
//!   only costs those lookups). The pod path tests the address before it
//!   parses the ports; the uplink, where the node's own traffic goes to
//!   frontend addresses (the node's, for its NodePorts), tests the port too.
//!   The agent sets a frontend's two bits before it is written and clears
//!   each after the last frontend that hashes to it is removed.
//! - [`quiet`]: the pod interfaces whose pod has no flow translated by the
//!   tc layer, per class of protocol (TCP, the rest), so nothing of that
//!   class arriving there can be the reply of one. The data path counts the
//!   flows it tracks from each interface and class (a generation); the
//!   agent reads the generation, finds no flow of the pod's addresses in the
//!   connection-tracking tables, and writes a mark naming the interface and
//!   that generation. A mark holds only while the generation is the one it
//!   names, so a flow tracked after the agent's read voids it at once, and
//!   a pod that stops making flows gets its mark again at a later pass. A
//!   slot holds the interface index it speaks for, so two interfaces
//!   sharing a slot never borrow each other's mark.

/// The frontend address bitmap ([`super::names::FRONTEND_FILTER`]).
pub mod frontends {
    use crate::Addr6Be;

    /// The fewest 64-bit words a bitmap has: 2^20 bits, 128 KiB.
    pub const MIN_WORDS: u32 = 1 << 14;
    /// The most: 2^28 bits, 32 MiB (a frontend map of 2^23 entries).
    pub const MAX_WORDS: u32 = 1 << 22;
    /// Bits per entry of the frontend map the bitmap is sized for. A
    /// frontend sets two bits (its address's and its port's) and holds at
    /// least one entry, so at most one bit in 16 is set, fewer the more
    /// backend slots frontends have: a packet to a destination that is no
    /// frontend takes the lookups at most one time in 16 (at 100k Services
    /// in a map of 2^18 entries, one in 40).
    pub const BITS_PER_ENTRY: u32 = 32;

    /// The size of the bitmap for a frontend map of `entries`, in 64-bit
    /// words: a power of two from [`MIN_WORDS`] to [`MAX_WORDS`].
    pub const fn words_for(entries: u32) -> u32 {
        let bits = (entries as u64).next_power_of_two() * BITS_PER_ENTRY as u64;
        let words = bits / 64;
        if words < MIN_WORDS as u64 {
            MIN_WORDS
        } else if words > MAX_WORDS as u64 {
            MAX_WORDS
        } else {
            words as u32
        }
    }

    /// How far a 32-bit hash is shifted right to index a bitmap of `words`
    /// (a power of two, as [`words_for`] makes them): 32 less the bits of
    /// a bit's index. An earlier agent's bitmap of [`MIN_WORDS`] used 12.
    pub const fn shift_for(words: u32) -> u32 {
        32 - 6 - words.trailing_zeros()
    }

    /// Fibonacci hashing's multiplier: 2^32 divided by the golden ratio,
    /// made odd.
    const GOLDEN: u32 = 0x9e37_79b1;

    /// The bit an IPv4 address (network order, as the packet holds it)
    /// hashes to in a bitmap indexed with `shift` ([`shift_for`]): the top
    /// bits of the address in host order times [`GOLDEN`] (Fibonacci
    /// hashing). Consecutive addresses, as a Service range has, land as far
    /// apart as the bitmap allows; one multiply is the whole cost on the
    /// path of every packet a pod sends (MurmurHash3's finalizer, used
    /// before, was two multiplies and three shifts in a row, about 3 ns).
    #[inline(always)]
    pub const fn bit4(addr_be: u32, shift: u32) -> u32 {
        u32::from_be(addr_be).wrapping_mul(GOLDEN) >> shift
    }

    /// The bit an IPv6 address hashes to: its four words folded.
    #[inline(always)]
    pub const fn bit6(addr_be: &Addr6Be, shift: u32) -> u32 {
        bit4(addr_be[0] ^ addr_be[1] ^ addr_be[2] ^ addr_be[3], shift)
    }

    /// The bit an (address, port, protocol) hashes to, from the address's
    /// own bit ([`bit4`], [`bit6`]): the port and protocol spread by a
    /// multiply of their own (independent of the address's, so the two
    /// run side by side), folded into the address's bit, hashed again.
    #[inline(always)]
    pub const fn port_bit(addr_bit: u32, port_be: u16, proto: u8, shift: u32) -> u32 {
        let salt = (((u16::from_be(port_be) as u32) << 8) | proto as u32).wrapping_mul(0x85eb_ca6b);
        (addr_bit ^ salt).wrapping_mul(GOLDEN) >> shift
    }

    /// The word of the bitmap that holds `bit`, and the bit's mask in it.
    #[inline(always)]
    pub const fn word_and_mask(bit: u32) -> (u32, u64) {
        (bit >> 6, 1u64 << (bit & 63))
    }
}

/// The quiet pod interfaces ([`super::names::QUIET_PODS`], written by the
/// agent) and their generations ([`super::names::QUIET_GENS`], counted by the
/// data path), indexed alike.
pub mod quiet {
    /// Slots per class, one per interface index modulo this.
    pub const SLOTS: u32 = 16_384;
    /// TCP flows.
    pub const TCP: u32 = 0;
    /// Every other protocol's flows (UDP, SCTP).
    pub const OTHER: u32 = 1;
    /// Entries in each of the two arrays.
    pub const ENTRIES: u32 = 2 * SLOTS;

    /// The entry of interface `ifindex` for `class` ([`TCP`], [`OTHER`]).
    #[inline(always)]
    pub const fn index(ifindex: u32, class: u32) -> u32 {
        (class & 1) * SLOTS + (ifindex & (SLOTS - 1))
    }

    /// The class a new flow of protocol `proto` counts in.
    #[inline(always)]
    pub const fn class_of_flow(proto: u8) -> u32 {
        match proto {
            crate::proto::TCP => TCP,
            _ => OTHER,
        }
    }

    /// The class whose mark lets a packet of IP protocol `proto` into a pod
    /// unread; `None` for a protocol that may carry either class (an ICMP
    /// error quotes a flow of any protocol), which needs both marks.
    #[inline(always)]
    pub const fn class_of_packet(proto: u8) -> Option<u32> {
        match proto {
            crate::proto::TCP => Some(TCP),
            crate::proto::UDP => Some(OTHER),
            _ => None,
        }
    }

    /// A quiet mark: interface `ifindex` had no flow of its class when the
    /// generation was `gen`. All zero: no mark (no interface has index 0).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    #[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
    pub struct QuietMark {
        pub ifindex: u32,
        pub _pad: u32,
        pub gen: u64,
    }

    impl QuietMark {
        /// Whether this mark speaks for `ifindex` at generation `gen`.
        #[inline(always)]
        pub const fn holds(&self, ifindex: u32, gen: u64) -> bool {
            self.ifindex == ifindex && self.gen == gen
        }
    }
}

#[cfg(test)]
mod tests {
    use super::frontends::*;

    #[test]
    fn bits_stay_inside_the_bitmap_and_spread() {
        let shift = shift_for(MIN_WORDS);
        let mut seen = [0u8; (MIN_WORDS as usize) * 8];
        for i in 0..50_000u32 {
            // ClusterIPs of one /16: neighbours must not share a bit.
            let addr_be = u32::from_ne_bytes([10, 96, (i >> 8) as u8, i as u8]);
            let bit = bit4(addr_be, shift);
            let (word, mask) = word_and_mask(bit);
            assert!(word < MIN_WORDS);
            assert_eq!(mask.count_ones(), 1);
            seen[(bit / 8) as usize] |= 1 << (bit % 8);
        }
        let set: u32 = seen.iter().map(|b| b.count_ones()).sum();
        // 50k addresses in 2^20 bits: well under 5% collide.
        assert!(set > 48_000, "{set} distinct bits of 50000 addresses");
    }

    #[test]
    fn port_bits_stay_inside_and_spread_over_ports_of_one_address() {
        let shift = shift_for(MIN_WORDS);
        let addr_bit = bit4(u32::from_ne_bytes([192, 168, 50, 1]), shift);
        let mut seen = [0u8; (MIN_WORDS as usize) * 8];
        for port in 30000..32768u16 {
            for proto in [6u8, 17] {
                let bit = port_bit(addr_bit, port.to_be(), proto, shift);
                assert!(word_and_mask(bit).0 < MIN_WORDS);
                seen[(bit / 8) as usize] |= 1 << (bit % 8);
            }
        }
        let distinct: u32 = seen.iter().map(|b| b.count_ones()).sum();
        // The NodePort range of one node address, both protocols: 5536
        // keys, nearly all on bits of their own.
        assert!(distinct > 5_400, "{distinct} distinct bits");
    }

    #[test]
    fn the_bitmap_grows_with_the_frontend_map_and_every_bit_stays_inside() {
        assert_eq!(words_for(1024), MIN_WORDS);
        assert_eq!(shift_for(MIN_WORDS), 12);
        // 32 bits per entry, rounded up to a power of two.
        assert_eq!(words_for(65_536), 1 << 15);
        assert_eq!(words_for(200_000), 1 << 17);
        assert_eq!(words_for(u32::MAX), MAX_WORDS);
        for words in [MIN_WORDS, 1 << 17, MAX_WORDS] {
            let shift = shift_for(words);
            for addr in [0u32, 1, 0x0a60_0001, u32::MAX] {
                let (word, _) = word_and_mask(bit4(addr, shift));
                assert!(word < words);
                let (word, _) = word_and_mask(port_bit(bit4(addr, shift), 80, 6, shift));
                assert!(word < words);
            }
        }
    }

    #[test]
    fn at_100k_services_few_destinations_that_are_no_frontend_pass_the_address_test() {
        // 110k frontend addresses with one port each, in the bitmap for a
        // frontend map of 2^18 entries (the 100k bench's): the share of
        // other addresses whose bit is set is what pays the lookups.
        let words = words_for(1 << 18);
        let shift = shift_for(words);
        extern crate std;
        let mut bitmap = std::vec![0u64; words as usize];
        let mut set = |bit: u32| {
            let (word, mask) = word_and_mask(bit);
            bitmap[word as usize] |= mask;
        };
        for i in 0..110_000u32 {
            let addr_bit = bit4((0x0a60_0000 + i).to_be(), shift);
            set(addr_bit);
            set(port_bit(addr_bit, 80u16.to_be(), 6, shift));
        }
        let false_positives = (0..100_000u32)
            .filter(|i| {
                let (word, mask) = word_and_mask(bit4((0xc0a8_0000 + i).to_be(), shift));
                bitmap[word as usize] & mask != 0
            })
            .count();
        assert!(false_positives < 4_000, "{false_positives} of 100000");
    }
}
