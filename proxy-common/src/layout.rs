//! The layout checks: `aya::Pod` for every map type (with the `user` feature), a size assertion per type, and offset tests.

use core::mem::size_of;

use crate::*;

/// `aya::Pod` for the map types: each `#[repr(C)]`, without implicit
/// padding (the size assertions that follow check it), valid for any bit
/// pattern.
#[cfg(feature = "user")]
mod aya_pod {
    use crate::*;

    macro_rules! aya_pod {
        ($($t:ty),* $(,)?) => {$(
            // SAFETY: `#[repr(C)]`, no implicit padding (asserted below),
            // valid for any bit pattern.
            unsafe impl aya::Pod for $t {}
        )*};
    }

    /// `bytemuck::Pod` for the instances of the family-generic types (the
    /// derive does not take generic types): the same promise.
    macro_rules! bytemuck_pod {
        ($($t:ty),* $(,)?) => {$(
            // SAFETY: `#[repr(C)]`, no implicit padding (asserted below),
            // valid for any bit pattern, all zeroes included.
            unsafe impl bytemuck::Zeroable for $t {}
            // SAFETY: as above.
            unsafe impl bytemuck::Pod for $t {}
        )*};
    }

    bytemuck_pod!(
        Backend,
        Backend6,
        CtKey,
        CtKey6,
        CtEntry,
        CtEntry6,
        AffinityKey,
        AffinityKey6,
        FragEntry,
        FragEntry6,
        SockConn,
        SockConn6,
        SockEntry,
        SockEntry6,
    );

    aya_pod!(
        FrontendKey,
        FrontendSlot,
        Backend,
        CtKey,
        CtEntry,
        RevNat,
        SvcStats,
        TraceEvent,
        AffinityKey,
        AffinityEntry,
        SockKey,
        SockEntry,
        SockAffinityKey,
        Config,
        Uplink,
        Uplink6,
        MaglevTable,
        FragKey,
        FragEntry,
        FrontendKey6,
        Backend6,
        CtKey6,
        CtEntry6,
        RevNat6,
        AffinityKey6,
        SockKey6,
        SockEntry6,
        FragKey6,
        FragEntry6,
        SockConn,
        SockConn6,
        SrcRange4,
        SrcRange6,
        prefilter::quiet::QuietMark,
    );
}

const _: () = assert!(size_of::<FrontendKey>() == 12);
const _: () = assert!(size_of::<prefilter::quiet::QuietMark>() == 16);
const _: () = assert!(size_of::<FrontendSlot>() == 16);
const _: () = assert!(size_of::<Backend>() == 8);
const _: () = assert!(size_of::<CtKey>() == 16);
const _: () = assert!(size_of::<CtEntry>() == 40);
const _: () = assert!(size_of::<RevNat>() == 64);
const _: () = assert!(size_of::<SvcStats>() == 32);
const _: () = assert!(size_of::<TraceEvent>() == 80);
const _: () = assert!(size_of::<AffinityKey>() == 8);
const _: () = assert!(size_of::<AffinityEntry>() == 16);
const _: () = assert!(size_of::<SockKey>() == 16);
const _: () = assert!(size_of::<SockEntry>() == 16);
const _: () = assert!(size_of::<SockAffinityKey>() == 16);
const _: () = assert!(size_of::<SockConn>() == 20);
const _: () = assert!(size_of::<SockConn6>() == 44);
const _: () = assert!(size_of::<Config>() == 8);
const _: () = assert!(size_of::<Uplink>() == 8);
const _: () = assert!(size_of::<DsrOpt4>() == dsr::OPT4_LEN as usize);
const _: () = assert!(size_of::<DsrOpt6>() == dsr::HDR6_LEN as usize);
const _: () = assert!(size_of::<Uplink6>() == 16);
const _: () = assert!(size_of::<FragKey>() == 12);
const _: () = assert!(size_of::<FragEntry>() == 24);
const _: () = assert!(size_of::<FrontendKey6>() == 24);
const _: () = assert!(size_of::<Backend6>() == 20);
const _: () = assert!(size_of::<CtKey6>() == 40);
const _: () = assert!(size_of::<CtEntry6>() == 64);
const _: () = assert!(size_of::<RevNat6>() == 76);
const _: () = assert!(size_of::<AffinityKey6>() == 20);
const _: () = assert!(size_of::<SockKey6>() == 32);
const _: () = assert!(size_of::<SockEntry6>() == 28);
const _: () = assert!(size_of::<FragKey6>() == 40);
const _: () = assert!(size_of::<FragEntry6>() == 48);
const _: () = assert!(size_of::<KeyPair<CtKey>>() == 32);
const _: () = assert!(size_of::<KeyPair<CtKey6>>() == 80);
const _: () = assert!(size_of::<NewFlows>() == 128 + 32 * new_flows::SLOTS as usize);
const _: () = assert!(size_of::<NewFlows6>() == 128 + 80 * new_flows::SLOTS6 as usize);
// An array map's value may be at most KMALLOC_MAX_SIZE (4 MiB with 4 KiB pages).
const _: () = assert!(size_of::<NewFlows>() <= 4 << 20 && size_of::<NewFlows6>() <= 4 << 20);
const _: () = assert!(new_flows::SLOTS.is_power_of_two() && new_flows::SLOTS6.is_power_of_two());
const _: () = assert!(size_of::<SrcRange4>() == 8);
const _: () = assert!(size_of::<SrcRange6>() == 20);
const _: () = assert!(size_of::<MaglevTable>() == 4 * capacity::MAGLEV_TABLE as usize);

#[cfg(test)]
mod tests {
    use crate::*;
    use core::mem::{align_of, offset_of};

    #[test]
    fn frontend_key_layout_is_packed_without_holes() {
        assert_eq!(offset_of!(FrontendKey, addr_be), 0);
        assert_eq!(offset_of!(FrontendKey, port_be), 4);
        assert_eq!(offset_of!(FrontendKey, proto), 6);
        assert_eq!(offset_of!(FrontendKey, scope), 7);
        assert_eq!(offset_of!(FrontendKey, slot), 8);
        assert_eq!(align_of::<FrontendKey>(), 4);
    }

    #[test]
    fn ct_key_layout_matches_kernel_side_expectation() {
        assert_eq!(offset_of!(CtKey, saddr_be), 0);
        assert_eq!(offset_of!(CtKey, daddr_be), 4);
        assert_eq!(offset_of!(CtKey, sport_be), 8);
        assert_eq!(offset_of!(CtKey, dport_be), 10);
        assert_eq!(offset_of!(CtKey, proto), 12);
        assert_eq!(offset_of!(CtKey, dir), 13);
    }

    #[test]
    fn ct_entry_layout_has_no_holes() {
        assert_eq!(offset_of!(CtEntry, backend_id), 0);
        assert_eq!(offset_of!(CtEntry, service_id), 4);
        assert_eq!(offset_of!(CtEntry, nat_addr_be), 8);
        assert_eq!(offset_of!(CtEntry, nat_port_be), 12);
        assert_eq!(offset_of!(CtEntry, flags), 14);
        assert_eq!(offset_of!(CtEntry, state), 15);
        assert_eq!(offset_of!(CtEntry, snat_addr_be), 16);
        assert_eq!(offset_of!(CtEntry, snat_port_be), 20);
        assert_eq!(offset_of!(CtEntry, created_ns), 24);
        assert_eq!(offset_of!(CtEntry, last_seen_ns), 32);
        assert_eq!(align_of::<CtEntry>(), 8);
    }

    #[test]
    fn ipv6_types_have_no_holes() {
        assert_eq!(offset_of!(CtKey6, sport_be), 32);
        assert_eq!(offset_of!(CtKey6, dir), 37);
        assert_eq!(offset_of!(CtEntry6, nat_port_be), 24);
        assert_eq!(offset_of!(CtEntry6, snat_addr_be), 28);
        assert_eq!(offset_of!(CtEntry6, created_ns), 48);
        assert_eq!(offset_of!(SockKey6, port_be), 24);
        assert_eq!(offset_of!(FrontendKey6, slot), 20);
        assert_eq!(offset_of!(FragEntry6, created_ns), 40);
    }

    #[test]
    fn ipv6_addresses_keep_their_byte_order() {
        let octets = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34];
        let be = addr6_be(octets);
        let mut bytes = [0u8; 16];
        for (i, word) in be.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        assert_eq!(bytes, octets);
        assert_eq!(addr6_octets(be), octets);
        assert_eq!(addr6_octets(hairpin::ADDR6_BE), hairpin::ADDR6);
    }

    #[test]
    fn snat_ports_cover_both_blocks_and_nothing_else() {
        assert_eq!(snat::port(0), 1_024);
        assert_eq!(snat::port(28_975), 29_999);
        assert_eq!(snat::port(28_976), 61_000);
        assert_eq!(snat::port(snat::PORTS - 1), 65_535);
        assert_eq!(snat::PORTS, 33_512);
        for port in [1_023, 22, 30_000, 30_080, 32_767, 32_768, 60_999] {
            assert!(!snat::is_snat_port(port), "{port}");
        }
        for index in [0, 1, 28_975, 28_976, snat::PORTS - 1] {
            assert!(snat::is_snat_port(snat::port(index)));
        }
        assert_ne!(snat::PORTS % snat::STRIDE, 0);
    }

    #[test]
    fn stat_names_cover_every_counter() {
        assert_eq!(stat::NAMES.len() as u32, stat::COUNT);
        assert_eq!(stat::NAMES[stat::FORWARDED as usize], "forwarded");
    }

    #[cfg(feature = "user")]
    #[test]
    fn pod_roundtrip_keeps_network_byte_order_fields() {
        let key = FrontendKey {
            addr_be: u32::from_ne_bytes([10, 96, 0, 10]),
            port_be: 80u16.to_be(),
            proto: proto::TCP,
            slot: 3,
            ..Default::default()
        };
        let bytes = bytemuck::bytes_of(&key);
        assert_eq!(&bytes[0..4], &[10, 96, 0, 10]);
        assert_eq!(&bytes[4..6], &[0, 80]);
        assert_eq!(bytes[6], 6);
        let back: FrontendKey = bytemuck::pod_read_unaligned(bytes);
        assert_eq!(back, key);
    }
}
