//! Encoding between the model's types and the map types of `proxy-common`:
//! frontend keys, backends, reverse-NAT names and slot 0's flags. The sync
//! writes with these; the CLI reads with them.
//!
//! Each address family has its own frontend, backend and reverse-NAT maps
//! (`SB_FE_V1`/`SB_FE6_V1`, ...). [`AnyFrontendKey`], [`AnyBackend`] and
//! [`AnyRevNat`] hold an entry of either family, so the sync and the CLI
//! handle a frontend the same way whatever its family, and the map store
//! picks the map from the variant.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proxy_common::{
    addr6_be, addr6_octets, frontend_flags, proto, scope, Addr6Be, Backend, Backend6, FrontendKey,
    FrontendKey6, RevNat, RevNat6, SrcRange4, SrcRange6, REVNAT_NAME_LEN, SRC_RANGE_ID_BITS,
};

use crate::model::cidr::IpCidr;

use crate::model::{
    BackendAddr, Frontend, FrontendAddr, FrontendKind, IpFamily, LbAlgorithm, Protocol,
};

/// A frontend map key of either family: the IPv4 map's or the IPv6 map's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AnyFrontendKey {
    V4(FrontendKey),
    V6(FrontendKey6),
}

impl AnyFrontendKey {
    pub fn family(&self) -> IpFamily {
        match self {
            AnyFrontendKey::V4(_) => IpFamily::V4,
            AnyFrontendKey::V6(_) => IpFamily::V6,
        }
    }

    /// [`scope`]: the internal or the external backend set.
    pub fn scope(&self) -> u8 {
        match self {
            AnyFrontendKey::V4(k) => k.scope,
            AnyFrontendKey::V6(k) => k.scope,
        }
    }

    pub fn slot(&self) -> u16 {
        match self {
            AnyFrontendKey::V4(k) => k.slot,
            AnyFrontendKey::V6(k) => k.slot,
        }
    }

    /// The frontend's address.
    pub fn ip(&self) -> IpAddr {
        match self {
            AnyFrontendKey::V4(k) => IpAddr::V4(ipv4(k.addr_be)),
            AnyFrontendKey::V6(k) => IpAddr::V6(ipv6(k.addr_be)),
        }
    }

    /// The port, host order.
    pub fn port(&self) -> u16 {
        u16::from_be(match self {
            AnyFrontendKey::V4(k) => k.port_be,
            AnyFrontendKey::V6(k) => k.port_be,
        })
    }

    /// IP protocol number ([`proto`]).
    pub fn proto(&self) -> u8 {
        match self {
            AnyFrontendKey::V4(k) => k.proto,
            AnyFrontendKey::V6(k) => k.proto,
        }
    }

    /// The key of `slot` of the same frontend's set `scope`.
    pub fn at(self, scope: u8, slot: u16) -> AnyFrontendKey {
        match self {
            AnyFrontendKey::V4(k) => AnyFrontendKey::V4(FrontendKey { scope, slot, ..k }),
            AnyFrontendKey::V6(k) => AnyFrontendKey::V6(FrontendKey6 { scope, slot, ..k }),
        }
    }
}

impl From<FrontendKey> for AnyFrontendKey {
    fn from(key: FrontendKey) -> Self {
        AnyFrontendKey::V4(key)
    }
}

impl From<FrontendKey6> for AnyFrontendKey {
    fn from(key: FrontendKey6) -> Self {
        AnyFrontendKey::V6(key)
    }
}

impl From<Backend> for AnyBackend {
    fn from(backend: Backend) -> Self {
        AnyBackend::V4(backend)
    }
}

impl From<Backend6> for AnyBackend {
    fn from(backend: Backend6) -> Self {
        AnyBackend::V6(backend)
    }
}

/// A backend map value of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnyBackend {
    V4(Backend),
    V6(Backend6),
}

impl AnyBackend {
    pub fn family(&self) -> IpFamily {
        match self {
            AnyBackend::V4(_) => IpFamily::V4,
            AnyBackend::V6(_) => IpFamily::V6,
        }
    }

    /// IP protocol number ([`proto`]).
    pub fn proto(&self) -> u8 {
        match self {
            AnyBackend::V4(b) => b.proto,
            AnyBackend::V6(b) => b.proto,
        }
    }
}

/// A reverse-NAT map value of either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnyRevNat {
    V4(RevNat),
    V6(RevNat6),
}

impl AnyRevNat {
    pub fn family(&self) -> IpFamily {
        match self {
            AnyRevNat::V4(_) => IpFamily::V4,
            AnyRevNat::V6(_) => IpFamily::V6,
        }
    }
}

/// The map form of an IPv4 address (network order in memory).
pub fn addr4_be(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

pub fn ipv4(addr_be: u32) -> Ipv4Addr {
    Ipv4Addr::from(addr_be.to_ne_bytes())
}

pub fn ipv6(addr_be: Addr6Be) -> Ipv6Addr {
    Ipv6Addr::from(addr6_octets(addr_be))
}

/// The key of `slot` of a frontend's internal backend set.
pub fn frontend_key(addr: &FrontendAddr, slot: u16) -> AnyFrontendKey {
    scoped_key(addr, scope::INTERNAL, slot)
}

/// The key of `slot` of a frontend's backend set `scope` ([`scope`]), in the
/// map of the frontend's family.
pub fn scoped_key(addr: &FrontendAddr, scope: u8, slot: u16) -> AnyFrontendKey {
    let port_be = addr.port.to_be();
    let proto = proto_number(addr.protocol);
    match addr.ip {
        IpAddr::V4(ip) => AnyFrontendKey::V4(FrontendKey {
            addr_be: addr4_be(ip),
            port_be,
            proto,
            scope,
            slot,
            _pad1: [0; 2],
        }),
        IpAddr::V6(ip) => AnyFrontendKey::V6(FrontendKey6 {
            addr_be: addr6_be(ip.octets()),
            port_be,
            proto,
            scope,
            slot,
            _pad1: [0; 2],
        }),
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

/// A frontend map key of either family ([`frontend_addr`]).
pub trait FrontendKeyLike {
    /// The frontend the key names (slot ignored), if its protocol is one of ours.
    fn frontend_addr(&self) -> Option<FrontendAddr>;
}

impl FrontendKeyLike for FrontendKey {
    fn frontend_addr(&self) -> Option<FrontendAddr> {
        Some(FrontendAddr {
            ip: IpAddr::V4(ipv4(self.addr_be)),
            port: u16::from_be(self.port_be),
            protocol: protocol_from_number(self.proto)?,
        })
    }
}

impl FrontendKeyLike for FrontendKey6 {
    fn frontend_addr(&self) -> Option<FrontendAddr> {
        Some(FrontendAddr {
            ip: IpAddr::V6(ipv6(self.addr_be)),
            port: u16::from_be(self.port_be),
            protocol: protocol_from_number(self.proto)?,
        })
    }
}

impl FrontendKeyLike for AnyFrontendKey {
    fn frontend_addr(&self) -> Option<FrontendAddr> {
        match self {
            AnyFrontendKey::V4(k) => k.frontend_addr(),
            AnyFrontendKey::V6(k) => k.frontend_addr(),
        }
    }
}

/// The frontend a key of either family names (slot ignored), if its
/// protocol is one of ours.
pub fn frontend_addr(key: &impl FrontendKeyLike) -> Option<FrontendAddr> {
    key.frontend_addr()
}

/// A backend map value of either family ([`backend_addr`]).
pub trait BackendLike {
    fn backend_addr(&self) -> BackendAddr;
}

impl BackendLike for Backend {
    fn backend_addr(&self) -> BackendAddr {
        BackendAddr {
            ip: IpAddr::V4(ipv4(self.addr_be)),
            port: u16::from_be(self.port_be),
        }
    }
}

impl BackendLike for Backend6 {
    fn backend_addr(&self) -> BackendAddr {
        BackendAddr {
            ip: IpAddr::V6(ipv6(self.addr_be)),
            port: u16::from_be(self.port_be),
        }
    }
}

impl BackendLike for AnyBackend {
    fn backend_addr(&self) -> BackendAddr {
        match self {
            AnyBackend::V4(b) => b.backend_addr(),
            AnyBackend::V6(b) => b.backend_addr(),
        }
    }
}

pub fn backend_addr(backend: &impl BackendLike) -> BackendAddr {
    backend.backend_addr()
}

/// The backend map value for `backend` (of its family's map).
pub fn backend_value(backend: BackendAddr, protocol: Protocol) -> AnyBackend {
    let port_be = backend.port.to_be();
    let proto = proto_number(protocol);
    match backend.ip {
        IpAddr::V4(ip) => AnyBackend::V4(Backend {
            addr_be: addr4_be(ip),
            port_be,
            proto,
            flags: 0,
        }),
        IpAddr::V6(ip) => AnyBackend::V6(Backend6 {
            addr_be: addr6_be(ip.octets()),
            port_be,
            proto,
            flags: 0,
        }),
    }
}

/// A reverse-NAT value of either family ([`revnat_name`]).
pub trait RevNatLike {
    /// The NUL-padded `namespace/name:port`.
    fn name_bytes(&self) -> &[u8; REVNAT_NAME_LEN];
}

impl RevNatLike for RevNat {
    fn name_bytes(&self) -> &[u8; REVNAT_NAME_LEN] {
        &self.name
    }
}

impl RevNatLike for RevNat6 {
    fn name_bytes(&self) -> &[u8; REVNAT_NAME_LEN] {
        &self.name
    }
}

impl RevNatLike for AnyRevNat {
    fn name_bytes(&self) -> &[u8; REVNAT_NAME_LEN] {
        match self {
            AnyRevNat::V4(r) => &r.name,
            AnyRevNat::V6(r) => &r.name,
        }
    }
}

pub fn revnat_name(rnat: &impl RevNatLike) -> String {
    let name = rnat.name_bytes();
    let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

/// The reverse-NAT value of a frontend (of its family's map).
pub fn revnat_value(addr: &FrontendAddr, name: &str) -> AnyRevNat {
    // Cut on a character boundary so the CLI never shows a broken character.
    let mut len = name.len().min(REVNAT_NAME_LEN - 1);
    while !name.is_char_boundary(len) {
        len -= 1;
    }
    let mut padded = [0u8; REVNAT_NAME_LEN];
    padded[..len].copy_from_slice(&name.as_bytes()[..len]);
    let port_be = addr.port.to_be();
    let proto = proto_number(addr.protocol);
    match addr.ip {
        IpAddr::V4(ip) => AnyRevNat::V4(RevNat {
            addr_be: addr4_be(ip),
            port_be,
            proto,
            name: padded,
            ..RevNat::default()
        }),
        IpAddr::V6(ip) => AnyRevNat::V6(RevNat6 {
            addr_be: addr6_be(ip.octets()),
            port_be,
            proto,
            name: padded,
            ..RevNat6::default()
        }),
    }
}

/// What the agent's flags decide for every frontend: the algorithm of
/// Services that name none (`--lb-algorithm`), and whether flows from
/// outside to backends on other nodes are returned directly
/// (`--nodeport-mode dsr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrontendDefaults {
    pub algorithm: LbAlgorithm,
    pub direct_return: bool,
}

/// The flags and affinity timeout slot 0 records for `frontend`.
pub fn slot_zero_attributes(frontend: &Frontend, defaults: FrontendDefaults) -> (u16, u32) {
    let algorithm = match frontend.algorithm.unwrap_or(defaults.algorithm) {
        LbAlgorithm::Random => frontend_flags::ALGO_RANDOM,
        LbAlgorithm::Maglev => frontend_flags::ALGO_MAGLEV,
        LbAlgorithm::SourceHash => frontend_flags::ALGO_SOURCE_HASH,
        // Bits 3..=4 stay ALGO_RANDOM: an older data path picks at random.
        LbAlgorithm::RoundRobin => frontend_flags::PICK_ROUND_ROBIN,
        LbAlgorithm::LeastConn => frontend_flags::PICK_LEAST_CONN,
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
    if defaults.direct_return && frontend.kind != FrontendKind::ClusterIp {
        flags |= frontend_flags::DIRECT_RETURN;
    }
    if let Some(ranges) = &frontend.source_ranges {
        flags |= frontend_flags::SOURCE_RANGES;
        if ranges.allows_node {
            flags |= frontend_flags::SOURCE_RANGES_NODE;
        }
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

/// The trie key (prefix length, data) of `block` of service `service_id`
/// in its family's `loadBalancerSourceRanges` map: the prefix covers the
/// whole service id, then the block's bits.
pub fn source_range_key4(service_id: u32, block: &IpCidr) -> Option<(u32, SrcRange4)> {
    let IpAddr::V4(network) = block.network() else {
        return None;
    };
    Some((
        SRC_RANGE_ID_BITS + u32::from(block.prefix_len()),
        SrcRange4 {
            service_id_be: service_id.to_be(),
            addr_be: u32::from_ne_bytes(network.octets()),
        },
    ))
}

/// [`source_range_key4`] for an IPv6 block.
pub fn source_range_key6(service_id: u32, block: &IpCidr) -> Option<(u32, SrcRange6)> {
    let IpAddr::V6(network) = block.network() else {
        return None;
    };
    Some((
        SRC_RANGE_ID_BITS + u32::from(block.prefix_len()),
        SrcRange6 {
            service_id_be: service_id.to_be(),
            addr_be: addr6_be(network.octets()),
        },
    ))
}

/// The service id and block an IPv4 trie key holds (`None`: a prefix
/// shorter than the service id, which the sync never writes).
pub fn source_range_block4(prefix_len: u32, data: &SrcRange4) -> Option<(u32, IpCidr)> {
    let bits = u8::try_from(prefix_len.checked_sub(SRC_RANGE_ID_BITS)?).ok()?;
    let block = IpCidr::new(IpAddr::V4(ipv4(data.addr_be)), bits)?;
    Some((u32::from_be(data.service_id_be), block))
}

/// [`source_range_block4`] for an IPv6 trie key.
pub fn source_range_block6(prefix_len: u32, data: &SrcRange6) -> Option<(u32, IpCidr)> {
    let bits = u8::try_from(prefix_len.checked_sub(SRC_RANGE_ID_BITS)?).ok()?;
    let block = IpCidr::new(IpAddr::V6(ipv6(data.addr_be)), bits)?;
    Some((u32::from_be(data.service_id_be), block))
}
