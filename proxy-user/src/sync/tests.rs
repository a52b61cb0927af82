//! The sync engine's test helpers (the other tests build their frontends
//! with them), and what its cases (`sync/cases/`, run by `sync/cases.rs`)
//! do not cover: where surviving backends keep their slots, and the
//! counter array sized for `--max-services`.
pub(crate) use super::memstore::{k, MemStore};
use super::*;
use crate::model::{Frontend, Protocol, ServicePortName};
use std::net::{Ipv4Addr, Ipv6Addr};

pub(crate) fn fe(
    ip: [u8; 4],
    port: u16,
    protocol: Protocol,
    name: &str,
    backends: &[(u8, u16)],
) -> Frontend {
    Frontend::cluster_ip(
        FrontendAddr {
            ip: IpAddr::from(ip),
            port,
            protocol,
        },
        ServicePortName {
            namespace: "default".into(),
            name: name.into(),
            port: "".into(),
        },
        backends
            .iter()
            .map(|(last, port)| BackendAddr {
                ip: Ipv4Addr::new(10, 244, 0, *last).into(),
                port: *port,
            })
            .collect(),
    )
}

pub(crate) fn state(frontends: Vec<Frontend>) -> DesiredState {
    DesiredState {
        frontends: frontends.into_iter().map(|f| (f.addr, f)).collect(),
    }
}

pub(crate) fn caps() -> Capacities {
    Capacities::default()
}

/// A frontend of IPv6 addresses: `fd00:96::<host>` to `fd00:244::<last>`.
pub(crate) fn fe6(
    host: u16,
    port: u16,
    protocol: Protocol,
    name: &str,
    backends: &[(u16, u16)],
) -> Frontend {
    Frontend::cluster_ip(
        FrontendAddr {
            ip: Ipv6Addr::new(0xfd00, 0x96, 0, 0, 0, 0, 0, host).into(),
            port,
            protocol,
        },
        ServicePortName {
            namespace: "default".into(),
            name: name.into(),
            port: "".into(),
        },
        backends
            .iter()
            .map(|(last, port)| BackendAddr {
                ip: Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, *last).into(),
                port: *port,
            })
            .collect(),
    )
}

#[test]
fn place_keeps_survivors_in_their_slots() {
    assert_eq!(place(&[1, 2, 3], &[1, 3]), vec![1, 3]);
    assert_eq!(place(&[1, 2, 3], &[1, 3, 4]), vec![1, 4, 3]);
    assert_eq!(place(&[1, 2, 3], &[3]), vec![3]);
    assert_eq!(place(&[], &[5, 6]), vec![5, 6]);
    assert_eq!(place(&[1, 2], &[1, 2, 7]), vec![1, 2, 7]);
    assert_eq!(place(&[1, 2, 3, 4], &[4, 1]), vec![1, 4]);
    // Adopted from a stopped move: backend 1 in slots 1 and 2.
    assert_eq!(place(&[1, 1], &[1]), vec![1]);
    assert_eq!(place(&[2, 1, 1], &[1, 3]), vec![3, 1]);
}

/// `--max-services N` gives service ids `1..=N` (`sync/cases/max-services.txtar`);
/// the per-service counter array is indexed by id, so it has N + 1 entries.
#[test]
fn the_counter_array_has_an_entry_per_service_id_and_one_for_none() {
    let small = Capacities {
        services: 3,
        ..Capacities::default()
    };
    assert_eq!(small.service_stats_entries(), 4);
}
