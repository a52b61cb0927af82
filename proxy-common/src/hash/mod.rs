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
pub const fn fmix32(h: u32) -> u32 {
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
mod tests;
