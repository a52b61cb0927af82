//! Frontends and backends: the frontend map's key and slots, backends, Maglev tables, reverse NAT, session affinity and `loadBalancerSourceRanges`.

use crate::{capacity, Addr6Be};

/// [`FrontendKey::scope`]: which backend set a key's slots hold.
pub mod scope {
    /// Traffic from this node (its pods and the host), and from outside when
    /// the frontend has no external set.
    pub const INTERNAL: u8 = 0;
    /// Traffic from outside the node to a NodePort, LoadBalancer or external
    /// IP frontend under `externalTrafficPolicy: Local`: this node's endpoints
    /// only. Present exactly when the internal slot 0 has
    /// [`super::frontend_flags::LOCAL_ONLY`] and an external kind.
    pub const EXTERNAL: u8 = 1;
}

/// IP protocol numbers as they appear in the IPv4 header.
pub mod proto {
    pub const ICMP: u8 = 1;
    pub const ICMPV6: u8 = 58;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
}

/// Key of the frontend map.
///
/// Slot 0 is the service entry (its value carries the backend count and the
/// service id); slots `1..=count` carry one backend id each.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FrontendKey {
    pub addr_be: u32,
    pub port_be: u16,
    /// IP protocol number ([`proto`]).
    pub proto: u8,
    /// [`scope`]: the internal or the external backend set.
    pub scope: u8,
    pub slot: u16,
    pub _pad1: [u8; 2],
}

/// Value of the frontend map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FrontendSlot {
    /// Slot > 0: the backend id in this slot. Slot 0: 0.
    pub backend_id: u32,
    /// The same in every slot of one frontend; indexes [`SvcStats`] and the
    /// reverse-NAT map.
    pub service_id: u32,
    /// Slot 0: how many slots follow that new flows pick from (0 = no
    /// endpoints: drop and count). Slot > 0 of a [`frontend_flags::WEIGHTED`]
    /// set: the backend's share of the set's slots (its weight, scaled), 0
    /// for a drained backend (weight 0), whose slot lies past the count;
    /// otherwise 0.
    pub backend_count: u16,
    /// [`frontend_flags`].
    pub flags: u16,
    /// `sessionAffinity: ClientIP` timeout in seconds (with the
    /// `AFFINITY_CLIENT_IP` flag).
    pub affinity_timeout_s: u32,
}

/// Bits of [`FrontendSlot::flags`] (slot 0): what the model decided about the
/// frontend. The data path applies `AFFINITY_CLIENT_IP`; the others are
/// recorded for the CLI and `bpftool` (see README).
pub mod frontend_flags {
    /// `sessionAffinity: ClientIP` (timeout in `affinity_timeout_s`).
    pub const AFFINITY_CLIENT_IP: u16 = 1 << 0;
    /// The governing traffic policy is `Local`. On a ClusterIP frontend
    /// (`internalTrafficPolicy`) the slots hold only this node's endpoints. On
    /// NodePort, LoadBalancer and external-IP frontends (`externalTrafficPolicy`)
    /// the slots hold every endpoint, which is what traffic from this node's pods
    /// gets; traffic from outside gets the local set, under [`super::scope::EXTERNAL`],
    /// and is never source-NATed (the pod sees the client's address).
    pub const LOCAL_ONLY: u16 = 1 << 1;
    /// No endpoint was ready: these are serving, terminating ones.
    pub const TERMINATING_FALLBACK: u16 = 1 << 2;
    /// How traffic from outside the node picks a backend, in bits 3..=4
    /// (traffic from this node picks at random, or by [`PICK_MASK`]).
    pub const ALGO_SHIFT: u16 = 3;
    pub const ALGO_MASK: u16 = 0b11 << ALGO_SHIFT;
    pub const ALGO_RANDOM: u16 = 0 << ALGO_SHIFT;
    /// Maglev over the 5-tuple (a table in `SB_MAGLEV_V1` by service id).
    pub const ALGO_MAGLEV: u16 = 1 << ALGO_SHIFT;
    /// The same table, indexed by a hash of the client address.
    pub const ALGO_SOURCE_HASH: u16 = 2 << ALGO_SHIFT;
    /// How every new flow picks a backend on this node (its own traffic and
    /// traffic from outside), in bits 10..=11, with [`ALGO_RANDOM`] in bits
    /// 3..=4: a data path that predates these bits picks at random. Both
    /// choose per node, not consistently across nodes.
    pub const PICK_SHIFT: u16 = 10;
    pub const PICK_MASK: u16 = 0b11 << PICK_SHIFT;
    /// Slot `turn % backend_count + 1`, the turn an atomic add on the
    /// service's cursor in `SB_RR_V1` hands out: strict order per node,
    /// across CPUs (IPVS `rr`).
    pub const PICK_ROUND_ROBIN: u16 = 1 << PICK_SHIFT;
    /// The less loaded of two random slots by the backends' open flows in
    /// `SB_LC_V1` (power of two choices; IPVS `lc` without the scan). The
    /// flows of such a frontend count ([`crate::ct_flags::COUNTED`]).
    pub const PICK_LEAST_CONN: u16 = 2 << PICK_SHIFT;
    /// Frontend kind, in bits 8..=9.
    pub const KIND_SHIFT: u16 = 8;
    pub const KIND_MASK: u16 = 0b11 << KIND_SHIFT;
    pub const KIND_CLUSTER_IP: u16 = 0 << KIND_SHIFT;
    pub const KIND_NODE_PORT: u16 = 1 << KIND_SHIFT;
    pub const KIND_LOAD_BALANCER: u16 = 2 << KIND_SHIFT;
    pub const KIND_EXTERNAL_IP: u16 = 3 << KIND_SHIFT;
    /// `loadBalancerSourceRanges` applies: a packet to this frontend is
    /// forwarded only when its source matches one of the frontend's blocks
    /// in `SB_SRC_RANGE_V1` / `SB_SRC_RANGE6_V1` (none: every source is
    /// denied). Without the bit no source lookup is made.
    pub const SOURCE_RANGES: u16 = 1 << 5;
    /// With [`SOURCE_RANGES`]: one of the blocks holds a node address, so
    /// the node's own sockets may reach the frontend (kube-proxy allows the
    /// node, and the load-balancer IPs as sources, in that case). The
    /// socket layer, which sees no source address at `connect()`, reads it
    /// for sockets of the node's network namespace.
    pub const SOURCE_RANGES_NODE: u16 = 1 << 6;
    /// Direct server return (`--nodeport-mode dsr`) on a NodePort,
    /// LoadBalancer or external-IP frontend: a flow from outside to a
    /// backend on another node keeps its client as source, carries the
    /// frontend to that node in an IPv4 option or an IPv6 destination
    /// option ([`crate::dsr`]), and the
    /// backend's node sends the replies to the client itself.
    pub const DIRECT_RETURN: u16 = 1 << 7;
    /// The set's backends have unequal weights (`switchboard.io/weights`):
    /// slots `1..=backend_count` repeat each backend in proportion to its
    /// weight, interleaved (a least-connection set holds each backend once),
    /// and each such slot's `backend_count` holds the backend's share
    /// (least-connection compares open flows ÷ share). The
    /// slots of drained backends (weight 0) follow, past the count, so new
    /// flows never pick them but their backend entries stay for the flows
    /// they have. Set on each weighted set's slot 0 (internal, external).
    pub const WEIGHTED: u16 = 1 << 12;

    /// Whether a slot 0 with these flags announces an external (local-only)
    /// set under [`super::scope::EXTERNAL`]: `externalTrafficPolicy: Local`
    /// on a NodePort, LoadBalancer or external-IP frontend.
    #[inline(always)]
    pub const fn has_external_set(flags: u16) -> bool {
        flags & LOCAL_ONLY != 0 && flags & KIND_MASK != KIND_CLUSTER_IP
    }
}

/// Value of the backend maps of either family (key: backend id, `u32`;
/// [`Backend`], [`Backend6`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendOf<A> {
    pub addr_be: A,
    pub port_be: u16,
    pub proto: u8,
    pub flags: u8,
}

/// An IPv4 backend.
pub type Backend = BackendOf<u32>;
/// An IPv6 backend (ids are shared with [`Backend`]'s: an id names a
/// backend in exactly one of the two maps).
pub type Backend6 = BackendOf<Addr6Be>;

/// Value of the Maglev map (key: service id, `u32`): the backend id of each
/// table entry. A flow from outside uses entry `hash % MAGLEV_TABLE`; the
/// table is computed from the backends' addresses, so every node fills it
/// alike (with its own ids).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct MaglevTable {
    pub backend_ids: [u32; capacity::MAGLEV_TABLE as usize],
}

/// Value of the reverse-NAT map (key: service id, `u32`): the frontend of a
/// service id and the service port's name, for the CLI and `bpftool` (the data
/// path restores addresses from connection tracking and the socket map).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct RevNat {
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    pub _pad: u8,
    /// `namespace/name:port`, NUL-padded, cut at [`REVNAT_NAME_LEN`] bytes.
    /// Not read by the data path.
    pub name: [u8; REVNAT_NAME_LEN],
}

pub const REVNAT_NAME_LEN: usize = 56;

impl Default for RevNat {
    fn default() -> Self {
        Self {
            addr_be: 0,
            port_be: 0,
            proto: 0,
            _pad: 0,
            name: [0; REVNAT_NAME_LEN],
        }
    }
}

/// Key of the session-affinity LRU maps of either family: one client of
/// one service port ([`AffinityKey`], [`AffinityKey6`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AffinityKeyOf<A> {
    pub client_addr_be: A,
    pub service_id: u32,
}

/// The IPv4 affinity key.
pub type AffinityKey = AffinityKeyOf<u32>;
/// The IPv6 affinity key.
pub type AffinityKey6 = AffinityKeyOf<Addr6Be>;

/// Value of the session-affinity LRU map: the backend the client's last new
/// flow got, and when. The data path uses it only while the slot still names
/// that backend and `affinity_timeout_s` has not passed since `last_used_ns`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct AffinityEntry {
    pub backend_id: u32,
    pub slot: u16,
    pub _pad: [u8; 2],
    /// `bpf_ktime_get_ns()` of the client's last new flow to this service.
    pub last_used_ns: u64,
}

/// The data of an IPv4 `loadBalancerSourceRanges` trie key (after the
/// 32-bit prefix length): a block of client addresses of one frontend. The
/// prefix length is 32 (the whole service id) plus the block's length, so a
/// lookup only ever matches blocks of its own frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SrcRange4 {
    /// The frontend's service id, big-endian: the trie compares bytes from
    /// the first, so the id is matched before any address bit.
    pub service_id_be: u32,
    pub addr_be: u32,
}

/// [`SrcRange4`] for IPv6 blocks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SrcRange6 {
    pub service_id_be: u32,
    pub addr_be: Addr6Be,
}

/// The prefix bits of a trie key that hold the service id.
pub const SRC_RANGE_ID_BITS: u32 = 32;

/// [`FrontendKey`] for an IPv6 frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FrontendKey6 {
    pub addr_be: Addr6Be,
    pub port_be: u16,
    pub proto: u8,
    pub scope: u8,
    pub slot: u16,
    pub _pad1: [u8; 2],
}

/// [`RevNat`] of an IPv6 frontend (by the same service ids).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct RevNat6 {
    pub addr_be: Addr6Be,
    pub port_be: u16,
    pub proto: u8,
    pub _pad: u8,
    pub name: [u8; REVNAT_NAME_LEN],
}

impl Default for RevNat6 {
    fn default() -> Self {
        Self {
            addr_be: [0; 4],
            port_be: 0,
            proto: 0,
            _pad: 0,
            name: [0; REVNAT_NAME_LEN],
        }
    }
}
