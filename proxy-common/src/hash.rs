//! Flow hashes shared by the kernel programs and the agent.
//!
//! Every node behind an ECMP router must pick the same backend for the same
//! packet, so these functions are part of the wire contract between nodes:
//! an agent (or kernel program) with a different hash would send the same
//! flow elsewhere. The golden values in the tests pin them; changing them is a
//! breaking change that needs a new map or config version.
//!
//! The mixing is MurmurHash3's (x86, 32-bit): a fixed number of 32-bit words,
//! each folded in with multiplies and rotates, then the `fmix32` finalizer.
//! Straight-line code, wrapping arithmetic on `u32` only, no tables and no
//! loops, so the eBPF verifier accepts it without any bound to prove.
//!
//! # Byte order
//! The arguments are hashed as the integer values passed in, no conversion.
//! Pass the `_be` fields exactly as they sit in the packet or map (network
//! byte order in memory, for example `u32::from_ne_bytes(addr.octets())` and
//! `port.to_be()` on the user side). Every node switchboard runs on is
//! little-endian (x86_64, aarch64, bpfel), so every node then computes the
//! same value; a big-endian node would not.

/// Seed of [`flow_hash`]. Part of the contract between nodes: do not change.
const FLOW_SEED: u32 = 0x5b0a_7d01;
/// Seed of [`source_hash`]; differs from [`FLOW_SEED`] so that a source hash
/// is not mistaken for a flow hash of the same input.
const SOURCE_SEED: u32 = 0x2c9e_41f3;

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

/// Folds one 32-bit word into the running state (MurmurHash3 body step).
#[inline(always)]
const fn mix(h: u32, k: u32) -> u32 {
    let k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    (h ^ k)
        .rotate_left(13)
        .wrapping_mul(5)
        .wrapping_add(0xe654_6b64)
}

/// MurmurHash3's finalizer: every input bit affects every output bit.
#[inline(always)]
const fn fmix32(h: u32) -> u32 {
    let h = (h ^ (h >> 16)).wrapping_mul(0x85eb_ca6b);
    let h = (h ^ (h >> 13)).wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// Hash of three 32-bit words under `seed` (MurmurHash3 of 12 bytes).
///
/// The building block for hashes of fixed-size keys; different seeds give
/// hashes that behave as independent functions of the same words.
#[inline(always)]
pub const fn hash_3words(a: u32, b: u32, c: u32, seed: u32) -> u32 {
    let h = mix(mix(mix(seed, a), b), c);
    fmix32(h ^ 12)
}

/// Hash of an IPv4 5-tuple, for choosing a backend (Maglev slot) per flow.
///
/// All arguments are taken as the integer values passed in: the `_be` values
/// are network byte order in memory, exactly as read from the packet (see the
/// module documentation). The ports are hashed as one word and the protocol in
/// its own, so swapping source and destination gives a different hash.
#[inline(always)]
pub const fn flow_hash(saddr_be: u32, daddr_be: u32, sport_be: u16, dport_be: u16, proto: u8) -> u32 {
    let ports = ((sport_be as u32) << 16) | dport_be as u32;
    let h = mix(mix(mix(mix(FLOW_SEED, saddr_be), daddr_be), ports), proto as u32);
    fmix32(h ^ 13)
}

/// Hash of a source address alone, for source-hash scheduling (IPVS `sh`):
/// every connection from one client goes to the same backend.
///
/// `saddr_be` is network byte order in memory, as read from the packet.
#[inline(always)]
pub const fn source_hash(saddr_be: u32) -> u32 {
    fmix32(mix(SOURCE_SEED, saddr_be) ^ 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: u8 = 6;
    const UDP: u8 = 17;

    /// 10.0.0.1 and 10.96.0.10 as they sit in memory on a little-endian host.
    const SADDR: u32 = u32::from_ne_bytes([10, 0, 0, 1]);
    const DADDR: u32 = u32::from_ne_bytes([10, 96, 0, 10]);

    /// Pearson's chi-square statistic of `n` hashes spread over `buckets`.
    fn chi_square(buckets: usize, hashes: impl Iterator<Item = u32>, slot: impl Fn(u32) -> usize) -> f64 {
        let mut counts = [0u32; 256];
        let mut n = 0u32;
        for h in hashes {
            counts[slot(h)] += 1;
            n += 1;
        }
        let expected = f64::from(n) / buckets as f64;
        counts[..buckets]
            .iter()
            .map(|&c| {
                let d = f64::from(c) - expected;
                d * d / expected
            })
            .sum()
    }

    /// A loose upper bound for chi-square with `buckets - 1` degrees of
    /// freedom: mean plus six standard deviations. A uniform hash passes it
    /// with near certainty; a biased one (e.g. a constant bit) fails by far.
    fn chi_bound(buckets: usize) -> f64 {
        let dof = (buckets - 1) as f64;
        dof + 6.0 * (2.0 * dof).sqrt()
    }

    /// One way of putting hashes into buckets: name, bucket count, bucket of.
    type Bucketing = (&'static str, usize, fn(u32) -> usize);

    /// Checks low bits, high bits and a prime modulus (how a Maglev table is
    /// indexed).
    fn assert_uniform(name: &str, hashes: impl Iterator<Item = u32> + Clone) {
        let checks: [Bucketing; 3] = [
            ("low 6 bits", 64, |h| (h & 63) as usize),
            ("high 6 bits", 64, |h| (h >> 26) as usize),
            ("mod 251", 251, |h| (h % 251) as usize),
        ];
        for (what, buckets, slot) in checks {
            let chi = chi_square(buckets, hashes.clone(), slot);
            assert!(chi < chi_bound(buckets), "{name}, {what}: chi-square {chi:.1} >= {:.1}", chi_bound(buckets));
        }
    }

    #[test]
    fn flow_hash_uniform_over_sequential_source_ports() {
        let hashes = (0u16..=u16::MAX).map(|p| flow_hash(SADDR, DADDR, p.to_be(), 80u16.to_be(), TCP));
        assert_uniform("source ports", hashes);
    }

    #[test]
    fn flow_hash_uniform_over_sequential_destination_ports() {
        let hashes = (0u16..=u16::MAX).map(|p| flow_hash(SADDR, DADDR, 40000u16.to_be(), p.to_be(), UDP));
        assert_uniform("destination ports", hashes);
    }

    #[test]
    fn flow_hash_uniform_over_sequential_source_addresses() {
        // 10.1.0.0 .. 10.1.255.255, one client port.
        let hashes = (0u32..65536).map(|i| {
            let saddr = (0x0a01_0000 | i).to_be();
            flow_hash(saddr, DADDR, 33000u16.to_be(), 443u16.to_be(), TCP)
        });
        assert_uniform("source addresses", hashes);
    }

    #[test]
    fn source_hash_uniform_over_sequential_addresses() {
        let hashes = (0u32..65536).map(|i| source_hash((0xc0a8_0000 | i).to_be()));
        assert_uniform("source_hash", hashes);
    }

    #[test]
    fn flow_hash_changes_with_every_bit_of_every_field() {
        let base = flow_hash(SADDR, DADDR, 1234, 80, TCP);
        let mut total_flipped = 0u32;
        let mut cases = 0u32;
        for bit in 0..32 {
            let variants = [
                flow_hash(SADDR ^ (1 << bit), DADDR, 1234, 80, TCP),
                flow_hash(SADDR, DADDR ^ (1 << bit), 1234, 80, TCP),
            ];
            for v in variants {
                assert_ne!(v, base, "address bit {bit}");
                total_flipped += (v ^ base).count_ones();
                cases += 1;
            }
        }
        for bit in 0..16 {
            for v in [
                flow_hash(SADDR, DADDR, 1234 ^ (1 << bit), 80, TCP),
                flow_hash(SADDR, DADDR, 1234, 80 ^ (1 << bit), TCP),
            ] {
                assert_ne!(v, base, "port bit {bit}");
                total_flipped += (v ^ base).count_ones();
                cases += 1;
            }
        }
        for bit in 0..8 {
            let v = flow_hash(SADDR, DADDR, 1234, 80, TCP ^ (1 << bit));
            assert_ne!(v, base, "protocol bit {bit}");
            total_flipped += (v ^ base).count_ones();
            cases += 1;
        }
        // Avalanche: one input bit flips about half of the 32 output bits.
        let mean = f64::from(total_flipped) / f64::from(cases);
        assert!((14.0..18.0).contains(&mean), "mean output bits flipped {mean}");
    }

    #[test]
    fn flow_hash_is_direction_sensitive() {
        assert_ne!(flow_hash(SADDR, DADDR, 1234, 80, TCP), flow_hash(DADDR, SADDR, 80, 1234, TCP));
        assert_ne!(flow_hash(SADDR, DADDR, 1234, 80, TCP), flow_hash(SADDR, DADDR, 80, 1234, TCP));
        assert_ne!(flow_hash(SADDR, DADDR, 1234, 80, TCP), flow_hash(DADDR, SADDR, 1234, 80, TCP));
    }

    #[test]
    fn source_hash_differs_per_address_and_from_flow_hash() {
        assert_ne!(source_hash(SADDR), source_hash(DADDR));
        assert_ne!(source_hash(0), flow_hash(0, 0, 0, 0, 0));
        for bit in 0..32 {
            assert_ne!(source_hash(SADDR ^ (1 << bit)), source_hash(SADDR), "bit {bit}");
        }
    }

    /// The mixing is MurmurHash3 x86_32: check it against the reference
    /// implementation's published vectors for inputs of one word.
    #[test]
    fn mixing_matches_reference_murmur3() {
        let murmur3_one_word = |word: u32, seed: u32| fmix32(mix(seed, word) ^ 4);
        assert_eq!(murmur3_one_word(0, 0), 0x2362_f9de);
        // "test": the bytes 74 65 73 74 read as a little-endian word.
        assert_eq!(murmur3_one_word(u32::from_le_bytes(*b"test"), 0), 0xba6b_d213);
        assert_eq!(murmur3_one_word(u32::from_le_bytes(*b"test"), 0x9747_b28c), 0x704b_81dc);
    }

    /// Golden values: if this fails the hash changed, and nodes running an
    /// older agent or kernel program would send the same flow elsewhere.
    #[test]
    fn golden_values() {
        assert_eq!(flow_hash(0, 0, 0, 0, 0), GOLDEN[0]);
        assert_eq!(flow_hash(SADDR, DADDR, 40000u16.to_be(), 80u16.to_be(), TCP), GOLDEN[1]);
        assert_eq!(flow_hash(SADDR, DADDR, 40000u16.to_be(), 53u16.to_be(), UDP), GOLDEN[2]);
        assert_eq!(flow_hash(u32::MAX, u32::MAX, u16::MAX, u16::MAX, u8::MAX), GOLDEN[3]);
        assert_eq!(source_hash(0), GOLDEN[4]);
        assert_eq!(source_hash(SADDR), GOLDEN[5]);
        assert_eq!(hash_3words(0, 0, 0, 0), GOLDEN[6]);
        assert_eq!(hash_3words(1, 2, 3, 0xdead_beef), GOLDEN[7]);
    }

    /// Computed independently with a Python transcription of the functions.
    const GOLDEN: [u32; 8] = [
        0xbf40_76f3,
        0x0743_e03f,
        0xbc66_2890,
        0xf829_e380,
        0x4efc_20e8,
        0x9779_37ad,
        0xd941_144b,
        0x1932_b0a1,
    ];
}
