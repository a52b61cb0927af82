//! The golden values that pin the flow hashes (see the parent module).
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
    let hashes = (0u16..=u16::MAX).map(|p| flow_hash(SADDR, DADDR, p.to_be(), 80u16.to_be(), TCP));
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
const SADDR6: [u32; 4] = crate::addr6_be([0xfd, 0, 0, 0x50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
const DADDR6: [u32; 4] = crate::addr6_be([0xfd, 0, 0, 0x50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);

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
