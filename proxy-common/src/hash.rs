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
/// Seed of [`flow_hash6`]. Part of the contract between nodes: do not change.
/// Differs from [`FLOW_SEED`] so that the two families' hashes are independent
/// functions even where their words coincide.
const FLOW6_SEED: u32 = 0x7f4a_9c36;
/// Seed of [`source_hash6`]. Part of the contract between nodes: do not change.
const SOURCE6_SEED: u32 = 0x3b1d_e5a9;

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
pub const fn flow_hash(
    saddr_be: u32,
    daddr_be: u32,
    sport_be: u16,
    dport_be: u16,
    proto: u8,
) -> u32 {
    let ports = ((sport_be as u32) << 16) | dport_be as u32;
    let h = mix(
        mix(mix(mix(FLOW_SEED, saddr_be), daddr_be), ports),
        proto as u32,
    );
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

/// Hash of an IPv6 5-tuple, for choosing a backend (Maglev slot) per flow:
/// the IPv6 twin of [`flow_hash`].
///
/// The addresses are [`crate::Addr6Be`]s as they sit in the packet or map
/// (four words, each network byte order in memory: `addr6_be(octets)` on the
/// user side); the ports are the `_be` values as read from the packet. Ten
/// words are hashed: the source address's four, the destination's four, the
/// ports as one word (source in the high half) and the protocol. The length
/// folded into the finalizer is 40 bytes and the seed is not the IPv4 one, so
/// an IPv6 tuple never hashes like an IPv4 tuple that shares words with it
/// (an IPv4-mapped address, say). Swapping source and destination gives a
/// different hash, as for IPv4.
#[inline(always)]
pub const fn flow_hash6(
    saddr_be: &[u32; 4],
    daddr_be: &[u32; 4],
    sport_be: u16,
    dport_be: u16,
    proto: u8,
) -> u32 {
    let ports = ((sport_be as u32) << 16) | dport_be as u32;
    let mut h = mix(
        mix(mix(mix(FLOW6_SEED, saddr_be[0]), saddr_be[1]), saddr_be[2]),
        saddr_be[3],
    );
    h = mix(
        mix(mix(mix(h, daddr_be[0]), daddr_be[1]), daddr_be[2]),
        daddr_be[3],
    );
    h = mix(mix(h, ports), proto as u32);
    fmix32(h ^ 40)
}

/// Hash of an IPv6 source address alone, for source-hash scheduling: the
/// IPv6 twin of [`source_hash`]. `saddr_be` is an [`crate::Addr6Be`] as it
/// sits in the packet. All 128 bits count: clients that differ only in
/// their interface identifier (the low 64 bits) get independent hashes.
#[inline(always)]
pub const fn source_hash6(saddr_be: &[u32; 4]) -> u32 {
    let h = mix(
        mix(
            mix(mix(SOURCE6_SEED, saddr_be[0]), saddr_be[1]),
            saddr_be[2],
        ),
        saddr_be[3],
    );
    fmix32(h ^ 16)
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
    fn chi_square(
        buckets: usize,
        hashes: impl Iterator<Item = u32>,
        slot: impl Fn(u32) -> usize,
    ) -> f64 {
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
            assert!(
                chi < chi_bound(buckets),
                "{name}, {what}: chi-square {chi:.1} >= {:.1}",
                chi_bound(buckets)
            );
        }
    }

    #[test]
    fn flow_hash_uniform_over_sequential_source_ports() {
        let hashes =
            (0u16..=u16::MAX).map(|p| flow_hash(SADDR, DADDR, p.to_be(), 80u16.to_be(), TCP));
        assert_uniform("source ports", hashes);
    }

    #[test]
    fn flow_hash_uniform_over_sequential_destination_ports() {
        let hashes =
            (0u16..=u16::MAX).map(|p| flow_hash(SADDR, DADDR, 40000u16.to_be(), p.to_be(), UDP));
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
        assert!(
            (14.0..18.0).contains(&mean),
            "mean output bits flipped {mean}"
        );
    }

    #[test]
    fn flow_hash_is_direction_sensitive() {
        assert_ne!(
            flow_hash(SADDR, DADDR, 1234, 80, TCP),
            flow_hash(DADDR, SADDR, 80, 1234, TCP)
        );
        assert_ne!(
            flow_hash(SADDR, DADDR, 1234, 80, TCP),
            flow_hash(SADDR, DADDR, 80, 1234, TCP)
        );
        assert_ne!(
            flow_hash(SADDR, DADDR, 1234, 80, TCP),
            flow_hash(DADDR, SADDR, 1234, 80, TCP)
        );
    }

    #[test]
    fn source_hash_differs_per_address_and_from_flow_hash() {
        assert_ne!(source_hash(SADDR), source_hash(DADDR));
        assert_ne!(source_hash(0), flow_hash(0, 0, 0, 0, 0));
        for bit in 0..32 {
            assert_ne!(
                source_hash(SADDR ^ (1 << bit)),
                source_hash(SADDR),
                "bit {bit}"
            );
        }
    }

    /// The mixing is MurmurHash3 x86_32: check it against the reference
    /// implementation's published vectors for inputs of one word.
    #[test]
    fn mixing_matches_reference_murmur3() {
        let murmur3_one_word = |word: u32, seed: u32| fmix32(mix(seed, word) ^ 4);
        assert_eq!(murmur3_one_word(0, 0), 0x2362_f9de);
        // "test": the bytes 74 65 73 74 read as a little-endian word.
        assert_eq!(
            murmur3_one_word(u32::from_le_bytes(*b"test"), 0),
            0xba6b_d213
        );
        assert_eq!(
            murmur3_one_word(u32::from_le_bytes(*b"test"), 0x9747_b28c),
            0x704b_81dc
        );
    }

    /// Golden values: if this fails the hash changed, and nodes running an
    /// older agent or kernel program would send the same flow elsewhere.
    #[test]
    fn golden_values() {
        assert_eq!(flow_hash(0, 0, 0, 0, 0), GOLDEN[0]);
        assert_eq!(
            flow_hash(SADDR, DADDR, 40000u16.to_be(), 80u16.to_be(), TCP),
            GOLDEN[1]
        );
        assert_eq!(
            flow_hash(SADDR, DADDR, 40000u16.to_be(), 53u16.to_be(), UDP),
            GOLDEN[2]
        );
        assert_eq!(
            flow_hash(u32::MAX, u32::MAX, u16::MAX, u16::MAX, u8::MAX),
            GOLDEN[3]
        );
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

    /// fd00:50::100 and fd00:50::1 as `Addr6Be`s (each word network order in
    /// memory).
    const SADDR6: [u32; 4] =
        crate::addr6_be([0xfd, 0, 0, 0x50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
    const DADDR6: [u32; 4] =
        crate::addr6_be([0xfd, 0, 0, 0x50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);

    #[test]
    fn flow_hash6_uniform_over_sequential_source_ports() {
        let hashes =
            (0u16..=u16::MAX).map(|p| flow_hash6(&SADDR6, &DADDR6, p.to_be(), 80u16.to_be(), TCP));
        assert_uniform("IPv6 source ports", hashes);
    }

    #[test]
    fn flow_hash6_uniform_over_sequential_interface_identifiers() {
        // fd00:50::1:0 .. fd00:50::1:ffff, one client port.
        let hashes = (0u32..65536).map(|i| {
            let mut saddr = SADDR6;
            saddr[3] = (0x0001_0000 | i).to_be();
            flow_hash6(&saddr, &DADDR6, 33000u16.to_be(), 443u16.to_be(), TCP)
        });
        assert_uniform("IPv6 source addresses", hashes);
    }

    #[test]
    fn source_hash6_uniform_over_sequential_addresses_and_prefixes() {
        let low = (0u32..65536).map(|i| {
            let mut a = SADDR6;
            a[3] = i.to_be();
            source_hash6(&a)
        });
        assert_uniform("source_hash6, low word", low);
        // Clients in different /64s with the same interface identifier.
        let prefixes = (0u32..65536).map(|i| {
            let mut a = SADDR6;
            a[1] = i.to_be();
            source_hash6(&a)
        });
        assert_uniform("source_hash6, prefix", prefixes);
    }

    #[test]
    fn flow_hash6_changes_with_every_bit_of_every_field() {
        let base = flow_hash6(&SADDR6, &DADDR6, 1234, 80, TCP);
        let mut total_flipped = 0u32;
        let mut cases = 0u32;
        let mut check = |v: u32, what: &str| {
            assert_ne!(v, base, "{what}");
            total_flipped += (v ^ base).count_ones();
            cases += 1;
        };
        for word in 0..4 {
            for bit in 0..32 {
                let mut s = SADDR6;
                s[word] ^= 1 << bit;
                check(flow_hash6(&s, &DADDR6, 1234, 80, TCP), "source address bit");
                let mut d = DADDR6;
                d[word] ^= 1 << bit;
                check(
                    flow_hash6(&SADDR6, &d, 1234, 80, TCP),
                    "destination address bit",
                );
            }
        }
        for bit in 0..16 {
            check(
                flow_hash6(&SADDR6, &DADDR6, 1234 ^ (1 << bit), 80, TCP),
                "source port bit",
            );
            check(
                flow_hash6(&SADDR6, &DADDR6, 1234, 80 ^ (1 << bit), TCP),
                "destination port bit",
            );
        }
        for bit in 0..8 {
            check(
                flow_hash6(&SADDR6, &DADDR6, 1234, 80, TCP ^ (1 << bit)),
                "protocol bit",
            );
        }
        let mean = f64::from(total_flipped) / f64::from(cases);
        assert!(
            (14.0..18.0).contains(&mean),
            "mean output bits flipped {mean}"
        );
    }

    #[test]
    fn flow_hash6_is_direction_sensitive() {
        let fwd = flow_hash6(&SADDR6, &DADDR6, 1234, 80, TCP);
        assert_ne!(fwd, flow_hash6(&DADDR6, &SADDR6, 80, 1234, TCP));
        assert_ne!(fwd, flow_hash6(&SADDR6, &DADDR6, 80, 1234, TCP));
        assert_ne!(fwd, flow_hash6(&DADDR6, &SADDR6, 1234, 80, TCP));
    }

    /// The IPv6 hashes are not the IPv4 ones on a wider input: an IPv4-mapped
    /// address (::ffff:a.b.c.d), or any address whose words repeat an IPv4
    /// tuple's, hashes differently from that IPv4 tuple, and the source hashes
    /// of the two families differ for the "same" client.
    #[test]
    fn ipv6_hashes_are_a_separate_domain_from_the_ipv4_ones() {
        let mapped = |v4: u32| [0, 0, 0xffffu32.to_be(), v4];
        let v4 = flow_hash(SADDR, DADDR, 40000u16.to_be(), 80u16.to_be(), TCP);
        let v6 = flow_hash6(
            &mapped(SADDR),
            &mapped(DADDR),
            40000u16.to_be(),
            80u16.to_be(),
            TCP,
        );
        assert_ne!(v4, v6);
        assert_ne!(source_hash(SADDR), source_hash6(&mapped(SADDR)));
        assert_ne!(source_hash6(&[0; 4]), flow_hash6(&[0; 4], &[0; 4], 0, 0, 0));
        assert_ne!(source_hash6(&[0; 4]), source_hash(0));
        assert_ne!(
            flow_hash6(&[0; 4], &[0; 4], 0, 0, 0),
            flow_hash(0, 0, 0, 0, 0)
        );
        // Over many tuples the two agree on a Maglev slot no more often than
        // independent hashes do (1 in 16381; allow a generous margin).
        let same_slot = (0u16..20000)
            .filter(|&p| {
                let a = flow_hash(SADDR, DADDR, p.to_be(), 80u16.to_be(), TCP);
                let b = flow_hash6(
                    &mapped(SADDR),
                    &mapped(DADDR),
                    p.to_be(),
                    80u16.to_be(),
                    TCP,
                );
                a % 16381 == b % 16381
            })
            .count();
        assert!(
            same_slot < 10,
            "{same_slot} of 20000 tuples share a slot across families"
        );
    }

    #[test]
    fn source_hash6_depends_on_every_address_bit_only() {
        let base = source_hash6(&SADDR6);
        for word in 0..4 {
            for bit in 0..32 {
                let mut a = SADDR6;
                a[word] ^= 1 << bit;
                assert_ne!(source_hash6(&a), base, "word {word} bit {bit}");
            }
        }
        assert_ne!(source_hash6(&SADDR6), source_hash6(&DADDR6));
    }

    /// Golden values of the IPv6 hashes, as [`golden_values`] for IPv4.
    #[test]
    fn golden_values6() {
        assert_eq!(flow_hash6(&[0; 4], &[0; 4], 0, 0, 0), GOLDEN6[0]);
        assert_eq!(
            flow_hash6(&SADDR6, &DADDR6, 40000u16.to_be(), 80u16.to_be(), TCP),
            GOLDEN6[1]
        );
        assert_eq!(
            flow_hash6(&SADDR6, &DADDR6, 40000u16.to_be(), 53u16.to_be(), UDP),
            GOLDEN6[2]
        );
        assert_eq!(
            flow_hash6(&[u32::MAX; 4], &[u32::MAX; 4], u16::MAX, u16::MAX, u8::MAX),
            GOLDEN6[3]
        );
        assert_eq!(source_hash6(&[0; 4]), GOLDEN6[4]);
        assert_eq!(source_hash6(&SADDR6), GOLDEN6[5]);
    }

    /// Computed independently with a Python transcription of the functions.
    const GOLDEN6: [u32; 6] = [
        0xf2b5_3a4a,
        0xf2a5_b77f,
        0xd512_e28b,
        0x0eb9_f813,
        0x28ea_3dd6,
        0xe123_57ad,
    ];
}
