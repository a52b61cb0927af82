//! Encoding between the model's types and the map types of `proxy-common`:
//! frontend keys, backends, reverse-NAT names and slot 0's flags. The sync
//! writes with these; the CLI reads with them.
use std::net::Ipv4Addr;

use proxy_common::{frontend_flags, proto, scope, Backend, FrontendKey, RevNat, REVNAT_NAME_LEN};

use crate::model::{BackendAddr, Frontend, FrontendAddr, FrontendKind, LbAlgorithm, Protocol};

/// The key of `slot` of a frontend's internal backend set.
pub fn frontend_key(addr: &FrontendAddr, slot: u16) -> FrontendKey {
    scoped_key(addr, scope::INTERNAL, slot)
}

/// The key of `slot` of a frontend's backend set `scope` ([`scope`]).
pub fn scoped_key(addr: &FrontendAddr, scope: u8, slot: u16) -> FrontendKey {
    FrontendKey {
        addr_be: u32::from_ne_bytes(addr.ip.octets()),
        port_be: addr.port.to_be(),
        proto: proto_number(addr.protocol),
        scope,
        slot,
        _pad1: [0; 2],
    }
}

pub fn proto_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => proto::TCP,
        Protocol::Udp => proto::UDP,
    }
}

pub fn protocol_from_number(number: u8) -> Option<Protocol> {
    match number {
        proto::TCP => Some(Protocol::Tcp),
        proto::UDP => Some(Protocol::Udp),
        _ => None,
    }
}

/// The frontend a key names (slot ignored), if its protocol is one of ours.
pub fn frontend_addr(key: &FrontendKey) -> Option<FrontendAddr> {
    Some(FrontendAddr {
        ip: Ipv4Addr::from(key.addr_be.to_ne_bytes()),
        port: u16::from_be(key.port_be),
        protocol: protocol_from_number(key.proto)?,
    })
}

pub fn backend_addr(backend: &Backend) -> BackendAddr {
    BackendAddr {
        ip: Ipv4Addr::from(backend.addr_be.to_ne_bytes()),
        port: u16::from_be(backend.port_be),
    }
}

pub fn revnat_name(rnat: &RevNat) -> String {
    let end = rnat
        .name
        .iter()
        .position(|b| *b == 0)
        .unwrap_or(rnat.name.len());
    String::from_utf8_lossy(&rnat.name[..end]).into_owned()
}

pub fn revnat_value(addr: &FrontendAddr, name: &str) -> RevNat {
    let mut value = RevNat {
        addr_be: u32::from_ne_bytes(addr.ip.octets()),
        port_be: addr.port.to_be(),
        proto: proto_number(addr.protocol),
        ..RevNat::default()
    };
    // Cut on a character boundary so the CLI never shows a broken character.
    let mut len = name.len().min(REVNAT_NAME_LEN - 1);
    while !name.is_char_boundary(len) {
        len -= 1;
    }
    value.name[..len].copy_from_slice(&name.as_bytes()[..len]);
    value
}

/// The flags and affinity timeout slot 0 records for `frontend`.
pub fn slot_zero_attributes(frontend: &Frontend, default_algorithm: LbAlgorithm) -> (u16, u32) {
    let algorithm = match frontend.algorithm.unwrap_or(default_algorithm) {
        LbAlgorithm::Random => frontend_flags::ALGO_RANDOM,
        LbAlgorithm::Maglev => frontend_flags::ALGO_MAGLEV,
        LbAlgorithm::SourceHash => frontend_flags::ALGO_SOURCE_HASH,
    };
    let mut flags = algorithm
        | match frontend.kind {
        FrontendKind::ClusterIp => frontend_flags::KIND_CLUSTER_IP,
        FrontendKind::NodePort => frontend_flags::KIND_NODE_PORT,
        FrontendKind::LoadBalancer => frontend_flags::KIND_LOAD_BALANCER,
        FrontendKind::ExternalIp => frontend_flags::KIND_EXTERNAL_IP,
    };
    if frontend.local_only {
        flags |= frontend_flags::LOCAL_ONLY;
    }
    if frontend.terminating_fallback {
        flags |= frontend_flags::TERMINATING_FALLBACK;
    }
    let timeout = match frontend.affinity_timeout_s {
        Some(timeout) => {
            flags |= frontend_flags::AFFINITY_CLIENT_IP;
            timeout
        }
        None => 0,
    };
    (flags, timeout)
}
