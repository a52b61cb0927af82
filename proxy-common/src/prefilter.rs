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

    /// 64-bit words in the bitmap: 2^20 bits, 128 KiB. At 100k frontend
    /// addresses about one bit in ten is set.
    pub const WORDS: u32 = 16_384;

    /// The bit an IPv4 address (network order, as the packet holds it)
    /// hashes to: the top 20 bits of MurmurHash3's 32-bit finalizer
    /// ([`crate::hash::fmix32`]), which
    /// spreads neighbouring addresses (a Service range) over the bitmap.
    #[inline(always)]
    pub const fn bit4(addr_be: u32) -> u32 {
        crate::hash::fmix32(addr_be) >> 12
    }

    /// The bit an IPv6 address hashes to: its four words folded.
    #[inline(always)]
    pub const fn bit6(addr_be: &Addr6Be) -> u32 {
        bit4(addr_be[0] ^ addr_be[1] ^ addr_be[2] ^ addr_be[3])
    }

    /// The bit an (address, port, protocol) hashes to, from the address's
    /// own bit ([`bit4`], [`bit6`]): a second round of the finalizer over
    /// it and the port and protocol.
    #[inline(always)]
    pub const fn port_bit(addr_bit: u32, port_be: u16, proto: u8) -> u32 {
        let salt = ((port_be as u32) << 8) | proto as u32;
        crate::hash::fmix32(addr_bit ^ crate::hash::fmix32(salt ^ 0x9e37_79b9)) >> 12
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
        let mut seen = [0u8; (WORDS as usize) * 8];
        for i in 0..50_000u32 {
            // ClusterIPs of one /16: neighbours must not share a bit.
            let addr_be = u32::from_ne_bytes([10, 96, (i >> 8) as u8, i as u8]);
            let bit = bit4(addr_be);
            let (word, mask) = word_and_mask(bit);
            assert!(word < WORDS);
            assert_eq!(mask.count_ones(), 1);
            seen[(bit / 8) as usize] |= 1 << (bit % 8);
        }
        let set: u32 = seen.iter().map(|b| b.count_ones()).sum();
        // 50k addresses in 2^20 bits: well under 5% collide.
        assert!(set > 48_000, "{set} distinct bits of 50000 addresses");
    }

    #[test]
    fn port_bits_stay_inside_and_spread_over_ports_of_one_address() {
        let addr_bit = bit4(u32::from_ne_bytes([192, 168, 50, 1]));
        let mut seen = [0u8; (WORDS as usize) * 8];
        for port in 30000..32768u16 {
            for proto in [6u8, 17] {
                let bit = port_bit(addr_bit, port.to_be(), proto);
                assert!(word_and_mask(bit).0 < WORDS);
                seen[(bit / 8) as usize] |= 1 << (bit % 8);
            }
        }
        let distinct: u32 = seen.iter().map(|b| b.count_ones()).sum();
        // The NodePort range of one node address, both protocols: 5536
        // keys, nearly all on bits of their own.
        assert!(distinct > 5_400, "{distinct} distinct bits");
    }
}
