//! Map key and value types shared by the kernel programs (`proxy-ebpf`) and the
//! userspace agent (`proxy-user`).
//!
//! Rules every type here follows:
//! - `#[repr(C)]`, every padding byte spelled out as a `_pad` field, so the
//!   layout is the same on both sides and `bytemuck::Pod` is sound;
//! - no `bool`, enum or `Option` inside a map type: flags and protocol numbers
//!   are plain integers;
//! - a field in network byte order says so with a `_be` suffix, everything else
//!   is host order;
//! - a compile-time size assertion per type, so a change that moves a field
//!   fails the build instead of corrupting a map.
//!
//! The layout follows the idea of Cilium's `lb4_*` maps: a frontend map keyed by
//! (address, port, protocol, backend slot) whose slot 0 describes the service
//! and whose slots 1..=count name backends by id; backends in their own map; a
//! connection-tracking map the agent garbage-collects; a reverse-NAT map by service id; per-CPU
//! counters per service. The socket layer (cgroup hooks) adds an LRU map of
//! per-socket translations and one of per-network-namespace affinity.
#![no_std]

pub mod hash;

use core::mem::size_of;

/// Map names. They are also the file names under the pin root.
/// The `_v1` suffix is the layout version: a layout change gets a new name so an
/// agent never reads a pinned map written with another layout.
pub mod names {
    pub const FRONTENDS: &str = "SB_FE_V1";
    pub const BACKENDS: &str = "SB_BE_V1";
    /// V3: the entry carries the address the packet is rewritten to in both
    /// directions (`nat_addr_be`), so a reply needs no reverse-NAT lookup.
    /// V4: entries of flows from outside the node to a backend on another
    /// node also carry the source NAT (`snat_addr_be`, `snat_port_be`).
    /// V5: a plain (preallocated, non-LRU) hash the agent garbage-collects;
    /// entries carry `last_seen_ns` and per-direction TCP state
    /// (`ct_state`), so a live flow is never evicted for a new one.
    pub const CONNTRACK: &str = "SB_CT_V5";
    /// The V4 table (LRU, no state), which an agent upgrading from one copies
    /// into [`CONNTRACK`] once and then unpins.
    pub const CONNTRACK_V4: &str = "SB_CT_V4";
    pub const REVNAT: &str = "SB_RNAT_V1";
    pub const SERVICE_STATS: &str = "SB_SVC_STATS_V1";
    /// V3: counters of the uplink (north-south) programs added.
    /// V4: `rejected` added; `frag_translated`, `frag_unknown` and
    /// `icmp_error_translated` added.
    /// V5: `ct_full` added.
    pub const GLOBAL_STATS: &str = "SB_STATS_V5";
    pub const AFFINITY: &str = "SB_AFFINITY_V1";
    /// Socket layer: per-socket translations ([`super::SockKey`]).
    pub const SOCKETS: &str = "SB_SOCK_V1";
    /// Socket layer: session affinity per network namespace.
    pub const SOCK_AFFINITY: &str = "SB_SOCK_AFFINITY_V1";
    /// One [`super::Config`] entry the agent writes at start-up.
    pub const CONFIG: &str = "SB_CONFIG_V1";
    /// The tc layer's tail calls: slot [`super::tail::REWRITE`] holds
    /// `sb_rewrite`. Pinned, so the slot stays filled while no agent runs.
    pub const TAIL_CALLS: &str = "SB_TAIL_V1";
    /// The tc pod path's IPv6 programs, tail-called by `sb_from_pod` and
    /// `sb_to_pod` for ethertype 0x86DD (slots [`super::tail::FROM_POD6`],
    /// [`super::tail::TO_POD6`]). Pinned like [`TAIL_CALLS`], so the IPv6
    /// programs stay reachable while no agent runs (an agent killed or
    /// restarting loses no IPv6 Service traffic), and a new agent's load
    /// puts its own IPv6 programs in for the programs still attached.
    pub const TAIL_CALLS6: &str = "SB_TAIL6_V1";
    /// The node's uplinks by interface index ([`super::Uplink`]): where
    /// traffic from outside arrives, and the address flows to a backend on
    /// another node are source-NATed to.
    pub const UPLINKS: &str = "SB_UPLINK_V1";
    /// The node's uplinks by interface index, their IPv6 address
    /// ([`super::Uplink6`]; all-zero when the uplink has none): flows from
    /// outside to an IPv6 backend on another node are source-NATed to it.
    pub const UPLINKS6: &str = "SB_UPLINK6_V1";
    /// The XDP uplink program's IPv6 twin, tail-called by `sb_xdp_uplink`
    /// for ethertype 0x86DD (slot [`super::tail::XDP_UPLINK6`]). Pinned, as
    /// [`TAIL_CALLS6`], so the XDP program keeps its IPv6 twin while no agent
    /// runs.
    pub const XDP_TAIL_CALLS6: &str = "SB_XDP_TAIL6_V1";
    /// Maglev lookup tables by service id ([`super::MaglevTable`]), for
    /// frontends whose traffic from outside picks by consistent hashing.
    pub const MAGLEV: &str = "SB_MAGLEV_V1";
    /// tc pod path: the translation of a fragmented datagram, by its first
    /// fragment's (source, destination, IP id, protocol), so its later
    /// fragments (no ports in them) get the same address ([`super::FragKey`]).
    pub const FRAGMENTS: &str = "SB_FRAG_V1";
    /// The IPv6 twins of the address-bearing maps. Each family has its own
    /// maps, as Cilium's `lb4_*`/`lb6_*`: an IPv4 key stays 12 bytes instead
    /// of 36, the IPv4 maps and their pins are exactly what they were before
    /// IPv6 existed (an upgrade keeps every IPv4 flow), and a program looks in
    /// one family's map only. Service ids and backend ids come from one id
    /// space shared by both families, so the per-service counters, the
    /// Maglev tables and the socket-layer affinity (all keyed by id) are
    /// shared maps.
    pub const FRONTENDS6: &str = "SB_FE6_V1";
    pub const BACKENDS6: &str = "SB_BE6_V1";
    pub const CONNTRACK6: &str = "SB_CT6_V1";
    pub const REVNAT6: &str = "SB_RNAT6_V1";
    pub const AFFINITY6: &str = "SB_AFFINITY6_V1";
    pub const SOCKETS6: &str = "SB_SOCK6_V1";
    pub const FRAGMENTS6: &str = "SB_FRAG6_V1";
    /// `loadBalancerSourceRanges`: the allowed client blocks of each
    /// restricted frontend, a longest-prefix-match trie keyed by service id
    /// and client address ([`super::SrcRange4`]). Looked up only for a
    /// frontend whose slot 0 has [`super::frontend_flags::SOURCE_RANGES`].
    pub const SOURCE_RANGES: &str = "SB_SRC_RANGE_V1";
    /// The IPv6 twin of [`SOURCE_RANGES`] ([`super::SrcRange6`]).
    pub const SOURCE_RANGES6: &str = "SB_SRC_RANGE6_V1";
    /// Per-CPU count, per service id, of packets dropped because their
    /// source is outside the frontend's `loadBalancerSourceRanges` (a map of
    /// its own, so [`SERVICE_STATS`] keeps its layout across upgrades).
    pub const SERVICE_DENIED: &str = "SB_SVC_DENIED_V1";
    /// Every map, in the order the CLI reports them.
    pub const ALL: [&str; 27] = [
        FRONTENDS,
        BACKENDS,
        CONNTRACK,
        REVNAT,
        SERVICE_STATS,
        GLOBAL_STATS,
        AFFINITY,
        SOCKETS,
        SOCK_AFFINITY,
        CONFIG,
        TAIL_CALLS,
        UPLINKS,
        MAGLEV,
        FRAGMENTS,
        FRONTENDS6,
        BACKENDS6,
        CONNTRACK6,
        REVNAT6,
        AFFINITY6,
        SOCKETS6,
        FRAGMENTS6,
        TAIL_CALLS6,
        UPLINKS6,
        XDP_TAIL_CALLS6,
        SOURCE_RANGES,
        SOURCE_RANGES6,
        SERVICE_DENIED,
    ];
}

/// Program names (the symbols the loader looks up).
pub mod programs {
    /// tc ingress on the host side of a pod's veth: packets leaving the pod.
    pub const TC_FROM_POD: &str = "sb_from_pod";
    /// tc egress on the host side of a pod's veth: packets going into the pod.
    pub const TC_TO_POD: &str = "sb_to_pod";
    /// cgroup `connect4`: TCP and connected UDP sockets get a backend at connect.
    pub const SOCK_CONNECT4: &str = "sb_sock_connect4";
    /// cgroup `sendmsg4`: every unconnected UDP datagram to a frontend.
    pub const SOCK_SENDMSG4: &str = "sb_sock_sendmsg4";
    /// cgroup `recvmsg4`: UDP replies show the frontend as their source.
    pub const SOCK_RECVMSG4: &str = "sb_sock_recvmsg4";
    /// cgroup `getpeername4`: a balanced socket's peer is the frontend.
    pub const SOCK_GETPEERNAME4: &str = "sb_sock_getpeername4";
    /// cgroup `connect6`: [`SOCK_CONNECT4`] for IPv6 sockets (an IPv4-mapped
    /// destination is balanced through the IPv4 maps).
    pub const SOCK_CONNECT6: &str = "sb_sock_connect6";
    /// cgroup `sendmsg6`: [`SOCK_SENDMSG4`] for IPv6 sockets.
    pub const SOCK_SENDMSG6: &str = "sb_sock_sendmsg6";
    /// cgroup `recvmsg6`: [`SOCK_RECVMSG4`] for IPv6 sockets.
    pub const SOCK_RECVMSG6: &str = "sb_sock_recvmsg6";
    /// cgroup `getpeername6`: [`SOCK_GETPEERNAME4`] for IPv6 sockets.
    pub const SOCK_GETPEERNAME6: &str = "sb_sock_getpeername6";
    /// tc, tail-called by both tc programs: writes the rewrite they decided on.
    pub const TC_REWRITE: &str = "sb_rewrite";
    /// tc, tail-called by `sb_from_pod` for IPv6 packets (its own program: the
    /// IPv6 path's stack does not fit next to the IPv4 path's).
    pub const TC_FROM_POD6: &str = "sb_from_pod6";
    /// tc, tail-called by `sb_to_pod` for IPv6 packets.
    pub const TC_TO_POD6: &str = "sb_to_pod6";
    /// XDP, tail-called by `sb_xdp_uplink` for IPv6 packets.
    pub const XDP_UPLINK6: &str = "sb_xdp_uplink6";
    /// tc, tail-called by `sb_from_uplink` for IPv6 packets.
    pub const TC_FROM_UPLINK6: &str = "sb_from_uplink6";
    /// cgroup `sock_release`: a closing socket's entry in the socket map goes.
    pub const SOCK_RELEASE: &str = "sb_sock_release";
    /// XDP on each uplink: traffic from outside the node to NodePorts,
    /// LoadBalancer IPs and external IPs, and the replies of flows it
    /// source-NATed to a backend on another node.
    pub const XDP_UPLINK: &str = "sb_xdp_uplink";
    /// tc ingress on each uplink: the same as [`XDP_UPLINK`], for
    /// `--xdp-mode off`.
    pub const TC_FROM_UPLINK: &str = "sb_from_uplink";
    /// tc egress on each uplink: a local backend's replies to a client outside
    /// the node get the frontend as their source again (the same program as
    /// [`TC_TO_POD`]: one reverse-NAT lookup).
    pub const TC_TO_UPLINK: &str = TC_TO_POD;
    /// The socket-layer `sock_addr` programs, in the order they are attached
    /// (the reverse hooks before the forward ones, so a socket balanced by a
    /// new program always finds its way back).
    pub const SOCKET_LB: [&str; 8] = [
        SOCK_GETPEERNAME4,
        SOCK_RECVMSG4,
        SOCK_GETPEERNAME6,
        SOCK_RECVMSG6,
        SOCK_SENDMSG4,
        SOCK_CONNECT4,
        SOCK_SENDMSG6,
        SOCK_CONNECT6,
    ];
}

/// Default map capacities. The agent may override them at load time.
pub mod capacity {
    /// Frontend map entries: one per service port plus one per backend slot.
    pub const FRONTENDS: u32 = 65_536;
    pub const BACKENDS: u32 = 65_536;
    /// Connection-tracking entries (two per flow). Preallocated: a full
    /// table refuses new flows rather than evicting live ones.
    pub const CONNTRACK: u32 = 524_288;
    /// Socket-layer translations: two per balanced UDP socket and service, one
    /// per connected socket (LRU: the oldest go first).
    pub const SOCKETS: u32 = 262_144;
    /// Session-affinity entries (one per client address and service port).
    pub const AFFINITY: u32 = 65_536;
    /// Service ids are indices into the per-service counters and the reverse-NAT
    /// map, so this bounds the number of service ports (`--max-services`). Ids
    /// are 1..=SERVICES (0 is never used), so the per-service counter array
    /// has SERVICES + 1 entries.
    pub const SERVICES: u32 = 16_384;
    /// Uplink interfaces per node.
    pub const UPLINKS: u32 = 64;
    /// Fragmented datagrams in flight whose translation is remembered (LRU).
    pub const FRAGMENTS: u32 = 8_192;
    /// Entries of one Maglev table: a prime (Maglev needs one), about 100×
    /// the backends a Service usually has, so each backend's share is even
    /// to within about 1%.
    pub const MAGLEV_TABLE: u32 = 16_381;
    /// The most backends one service port can have: the data path picks a
    /// slot in `1..=min(backend_count, this)` (slots are `u16`), and a Maglev
    /// table needs more entries than backends ([`MAGLEV_TABLE`] − 1).
    /// `--max-endpoints-per-service` may be set up to this.
    pub const MAX_BACKENDS_PER_SERVICE: u16 = (MAGLEV_TABLE - 1) as u16;
    /// `--max-endpoints-per-service` by default.
    pub const DEFAULT_BACKENDS_PER_SERVICE: u16 = 4_096;
    /// `loadBalancerSourceRanges` blocks per family, all restricted
    /// frontends together. The tries are allocated per entry
    /// (`BPF_F_NO_PREALLOC`), so an unused capacity costs nothing.
    pub const SOURCE_RANGES: u32 = 65_536;
}

/// Slots of the tail-call program array.
pub mod tail {
    /// `sb_rewrite`.
    pub const REWRITE: u32 = 0;
    /// `sb_from_pod6`, in [`super::names::TAIL_CALLS6`].
    pub const FROM_POD6: u32 = 0;
    /// `sb_to_pod6`, in [`super::names::TAIL_CALLS6`].
    pub const TO_POD6: u32 = 1;
    /// `sb_from_uplink6`, in [`super::names::TAIL_CALLS6`].
    pub const FROM_UPLINK6: u32 = 2;
    /// `sb_xdp_uplink6`, in [`super::names::XDP_TAIL_CALLS6`].
    pub const XDP_UPLINK6: u32 = 0;
}

/// Source ports flows from outside to a backend on another node are
/// source-NATed to: two blocks outside Linux's default ephemeral range
/// (32768–60999), so the node's own connections never pick them, and outside
/// the NodePort range (30000–32767): 1024–29999 and 61000–65535, 33512 ports
/// per backend address and port.
pub mod snat {
    pub const LOW_MIN: u16 = 1_024;
    pub const LOW_MAX: u16 = 29_999;
    pub const HIGH_MIN: u16 = 61_000;
    pub const HIGH_MAX: u16 = 65_535;
    /// How many ports the two blocks hold.
    pub const PORTS: u32 = (LOW_MAX - LOW_MIN) as u32 + 1 + (HIGH_MAX - HIGH_MIN) as u32 + 1;
    /// Ports tried for a new flow before it is dropped (and counted).
    pub const ATTEMPTS: u32 = 8;
    /// Ports tried are this far apart (a prime that does not divide the
    /// number of ports), so a run of taken ports does not fail every attempt.
    pub const STRIDE: u32 = 1_031;
    /// A closed TCP flow's port is given to a new flow this long after the
    /// close: past the backend's TIME_WAIT (60 s in Linux), so its kernel
    /// never meets a new connection on a 4-tuple it still remembers. The
    /// ports thus sustain about 33512 / 65 s = 515 new connections per second
    /// to one backend address and port. The agent's garbage collector keeps a
    /// closed source-NATed flow at least this long, and frees a UDP flow's
    /// port when the flow times out.
    pub const REUSE_AFTER_NS: u64 = 65_000_000_000;

    /// The `index`-th SNAT port (`index < PORTS`).
    #[inline(always)]
    pub const fn port(index: u32) -> u16 {
        let low = (LOW_MAX - LOW_MIN) as u32 + 1;
        if index < low {
            LOW_MIN + index as u16
        } else {
            HIGH_MIN + (index - low) as u16
        }
    }

    /// Whether `port` (host order) is one flows are source-NATed to.
    #[inline(always)]
    pub const fn is_snat_port(port: u16) -> bool {
        (port >= LOW_MIN && port <= LOW_MAX) || port >= HIGH_MIN
    }
}

/// Hairpin: a pod that reaches a Service and is given itself as the backend
/// gets the packet with this source address (and its own source port), so its
/// kernel does not see a packet from itself; kube-proxy masquerades such
/// traffic to the node, Cilium uses a loopback address the same way. An
/// IPv4 link-local address (169.254.42.1) that no pod or node uses; pods need
/// no route for it (their replies go to their default gateway, the node,
/// where `sb_from_pod` reverses them and sends them straight back in).
pub mod hairpin {
    /// 169.254.42.1, in network byte order (as in the packet).
    pub const ADDR_BE: u32 = u32::from_ne_bytes(ADDR);
    pub const ADDR: [u8; 4] = [169, 254, 42, 1];
    /// The IPv6 hairpin source: `fd53:6221::1`, a unique-local address no
    /// cluster hands out (as 169.254.42.1 is for IPv4).
    pub const ADDR6: [u8; 16] = [0xfd, 0x53, 0x62, 0x21, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    pub const ADDR6_BE: super::Addr6Be = super::addr6_be(ADDR6);
}

/// An IPv6 address as the maps hold it: four words, each in network byte
/// order (the address's 16 bytes in order), as `bpf_sock_addr::user_ip6` and
/// the IPv6 header hold it.
pub type Addr6Be = [u32; 4];

/// The map form of an IPv6 address given as its 16 bytes.
#[inline(always)]
pub const fn addr6_be(octets: [u8; 16]) -> Addr6Be {
    let o = octets;
    [
        u32::from_ne_bytes([o[0], o[1], o[2], o[3]]),
        u32::from_ne_bytes([o[4], o[5], o[6], o[7]]),
        u32::from_ne_bytes([o[8], o[9], o[10], o[11]]),
        u32::from_ne_bytes([o[12], o[13], o[14], o[15]]),
    ]
}

/// The 16 bytes of an IPv6 address in map form.
#[inline(always)]
pub const fn addr6_octets(addr: Addr6Be) -> [u8; 16] {
    let [a, b, c, d] = [
        addr[0].to_ne_bytes(),
        addr[1].to_ne_bytes(),
        addr[2].to_ne_bytes(),
        addr[3].to_ne_bytes(),
    ];
    [
        a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1], d[2],
        d[3],
    ]
}

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
    /// Slot 0: how many slots follow (0 = no endpoints: drop and count).
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
    /// (traffic from this node always picks at random).
    pub const ALGO_SHIFT: u16 = 3;
    pub const ALGO_MASK: u16 = 0b11 << ALGO_SHIFT;
    pub const ALGO_RANDOM: u16 = 0 << ALGO_SHIFT;
    /// Maglev over the 5-tuple (a table in `SB_MAGLEV_V1` by service id).
    pub const ALGO_MAGLEV: u16 = 1 << ALGO_SHIFT;
    /// The same table, indexed by a hash of the client address.
    pub const ALGO_SOURCE_HASH: u16 = 2 << ALGO_SHIFT;
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

    /// Whether a slot 0 with these flags announces an external (local-only)
    /// set under [`super::scope::EXTERNAL`]: `externalTrafficPolicy: Local`
    /// on a NodePort, LoadBalancer or external-IP frontend.
    #[inline(always)]
    pub const fn has_external_set(flags: u16) -> bool {
        flags & LOCAL_ONLY != 0 && flags & KIND_MASK != KIND_CLUSTER_IP
    }
}

/// Value of the backend map (key: backend id, `u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Backend {
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    pub flags: u8,
}

/// Direction marker in [`CtKey::dir`].
pub mod ct_dir {
    /// Client → service, keyed as the client sent it (daddr = frontend).
    pub const FORWARD: u8 = 0;
    /// Backend → client, keyed as the backend sent it (saddr = backend).
    pub const REPLY: u8 = 1;
}

/// Bits of [`CtEntry::flags`].
pub mod ct_flags {
    /// The flow came from outside the node and goes to a backend on another
    /// node: its source is rewritten too (`snat_addr_be:snat_port_be`), and
    /// the reply entry is keyed by that address.
    pub const SNAT: u8 = 1 << 1;
    /// A FIN or RST of this TCP connection was seen. Packets of the closing
    /// connection are still translated, but a SYN-ACK is not: the addresses
    /// and ports now belong to a new connection, which may not be a Service's
    /// (a client that reuses its port to reach the pod directly). A new SYN
    /// through the frontend starts a new flow.
    pub const CLOSING: u8 = 1 << 0;
    /// Written by a data path that records [`super::ct_state::ACKED`]: the
    /// TCP flow counts as established only once the client acknowledged
    /// the backend's SYN-ACK (as the kernel's conntrack does), not when the
    /// SYN-ACK passed. Entries an older agent created lack it and keep the
    /// older rule (answered = established), so an upgrade does not shorten
    /// the life of a connection it did not see open.
    pub const HANDSHAKE: u8 = 1 << 2;
}

/// Bits of [`CtEntry::state`]: what was seen in the direction of the entry
/// that holds them (each direction's packets write only their own entry, so
/// two CPUs never write one byte for different reasons). The agent's garbage
/// collector reads a flow's two entries together (the union of their bits).
pub mod ct_state {
    /// Reply entries: a packet of the reply direction passed (TCP: the
    /// SYN-ACK, the connection was answered; UDP: a reply, the flow is a
    /// stream).
    pub const REPLIED: u8 = 1 << 0;
    /// A TCP FIN was seen in this direction.
    pub const FIN: u8 = 1 << 1;
    /// A TCP RST was seen in this direction.
    pub const RST: u8 = 1 << 2;
    /// Forward entries: the client sent a TCP segment with ACK and without
    /// SYN, which completes the handshake (a spoofed SYN never does).
    pub const ACKED: u8 = 1 << 3;
}

/// The data path's memory of recently created flows, one ring shared by all
/// CPUs: when the connection-tracking table is full, the oldest of them that
/// is not established (TCP without the client's ACK, UDP without a reply)
/// gives way to the new flow, as the kernel's conntrack drops an unassured
/// entry. An established flow is never removed to make room.
///
/// The ring is shared, not per CPU, so a CPU that created no flow lately (a
/// real client's, while a flood runs on another) still finds the flood's
/// flows to remove. Its cursors are written without atomics: two CPUs may
/// write one slot or examine one slot at once. The first loses one flow from
/// the ring (it then only expires), the second examines a flow twice; a slot
/// read while it is written (the newest, or one the writer lapped) is caught
/// by checking that both keys are one flow's before anything is removed.
pub mod new_flows {
    /// Flows remembered (IPv4); a power of two.
    pub const SLOTS: u32 = 4096;
    /// Flows remembered (IPv6; its keys are larger).
    pub const SLOTS6: u32 = 2048;
    /// Remembered flows examined for one removal.
    pub const TRIES: u32 = 4;
    /// Removals one new flow may make: another CPU may take the room one
    /// removal made before this one's insert does.
    pub const ROUNDS: u32 = 3;
}

/// Both keys of one tracked flow, as [`NewFlowsOf`] remembers it
/// (`forward.proto == 0`: an empty or used slot).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyPair<K> {
    pub forward: K,
    pub reply: K,
}

/// The ring of recent new flows of one family ([`new_flows`]). Each cursor
/// has a cache line of its own: every CPU writes `next`, and only a CPU
/// making room writes `evict`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NewFlowsOf<K, const N: usize> {
    /// Where the next new flow is written (wrapping).
    pub next: u32,
    pub _pad_next: [u8; 60],
    /// The next slot examined when room is needed (wrapping).
    pub evict: u32,
    pub _pad_evict: [u8; 60],
    pub pairs: [KeyPair<K>; N],
}

/// The ring of recent IPv4 flows.
pub type NewFlows = NewFlowsOf<CtKey, { new_flows::SLOTS as usize }>;
/// The ring of recent IPv6 flows (fewer slots: its keys are larger).
pub type NewFlows6 = NewFlowsOf<CtKey6, { new_flows::SLOTS6 as usize }>;

/// The data path writes an entry's `last_seen_ns` at most this often (the
/// garbage collector's timeouts are seconds to a day, so a second of
/// imprecision costs nothing, and most packets then write nothing).
pub const CT_REFRESH_NS: u64 = 1_000_000_000;

/// Key of the connection-tracking map. Addresses and ports are as they
/// appear in the packet the entry is looked up with.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct CtKey {
    pub saddr_be: u32,
    pub daddr_be: u32,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// [`ct_dir`].
    pub dir: u8,
    pub _pad: [u8; 2],
}

/// Value of the connection-tracking map (a preallocated hash, not LRU: the
/// agent removes expired flows, see `proxy-user/src/dataplane/conntrack.rs`).
///
/// Each entry carries the address and port its direction is rewritten to:
/// a forward entry the backend's, a reply entry the frontend's. So an
/// established TCP connection keeps reaching its backend after the endpoint
/// leaves the Service (connection draining, as kube-proxy's conntrack does),
/// and a reply is translated with this one lookup. New TCP connections and UDP
/// datagrams only use an entry whose backend is still in the backend map at
/// the same address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct CtEntry {
    /// Forward entries: the backend the flow was given.
    pub backend_id: u32,
    /// Both directions: the service the flow belongs to.
    pub service_id: u32,
    /// Forward entries: the backend's address and port. Reply entries: the
    /// frontend's, which the reply's source becomes.
    pub nat_addr_be: u32,
    pub nat_port_be: u16,
    /// [`ct_flags`].
    pub flags: u8,
    /// [`ct_state`]: what this entry's direction has seen.
    pub state: u8,
    /// With [`ct_flags::SNAT`]: forward entries, the node address and port
    /// the source becomes; reply entries, the client address and port the
    /// destination is restored to. Zero otherwise.
    pub snat_addr_be: u32,
    pub snat_port_be: u16,
    pub _pad2: [u8; 2],
    /// CLOCK_MONOTONIC (`bpf_ktime_get_coarse_ns()`) when the entry was
    /// created, and again when its TCP connection started closing
    /// ([`ct_flags::CLOSING`]).
    pub created_ns: u64,
    /// CLOCK_MONOTONIC (`bpf_ktime_get_coarse_ns()`, tick resolution) of
    /// the last packet of this direction, written at most every
    /// [`CT_REFRESH_NS`] (and at every state change).
    pub last_seen_ns: u64,
}

/// Value of `SB_CT_V2`, a connection-tracking table of an earlier version
/// (key: [`CtKey`]): the same entry for both directions of a flow, naming
/// its backend. The agent reads it only to carry flows over to [`CtEntry`]
/// on an upgrade (`proxy-user/src/dataplane/migrate.rs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct CtEntryV2 {
    pub backend_id: u32,
    pub service_id: u32,
    pub backend_addr_be: u32,
    pub backend_port_be: u16,
    pub _pad: [u8; 2],
    pub created_ns: u64,
}

/// Value of `SB_CT_V4` ([`names::CONNTRACK_V4`]), the connection-tracking
/// table of an earlier version (key: [`CtKey`]): [`CtEntry`] without TCP
/// state or last-seen time. Read only to carry flows over on an upgrade.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct CtEntryV4 {
    pub backend_id: u32,
    pub service_id: u32,
    pub nat_addr_be: u32,
    pub nat_port_be: u16,
    /// [`ct_flags`].
    pub flags: u8,
    pub _pad: u8,
    pub snat_addr_be: u32,
    pub snat_port_be: u16,
    pub _pad2: [u8; 2],
    pub created_ns: u64,
}

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

/// Key of the fragment map: one fragmented datagram, as the packets the
/// entry is looked up with carry it (before the rewrite).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FragKey {
    pub saddr_be: u32,
    pub daddr_be: u32,
    /// The IPv4 identification field.
    pub id_be: u16,
    pub proto: u8,
    /// [`ct_dir`]: `FORWARD` for `sb_from_pod` (destination rewritten),
    /// `REPLY` for `sb_to_pod` (source rewritten).
    pub dir: u8,
}

/// Value of the fragment map: what the datagram's first fragment was
/// rewritten to. Later fragments get `addr_be` (as destination for `FORWARD`,
/// as source for `REPLY`; for [`frag::UPLINK`] as destination, and
/// `src_addr_be` as source when it is not 0); the port lives only in the
/// first fragment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FragEntry {
    pub addr_be: u32,
    pub port_be: u16,
    /// [`ct_dir`], as in the key.
    pub dir: u8,
    pub _pad: u8,
    pub service_id: u32,
    /// [`frag::UPLINK`] entries of flows whose source is rewritten too (to a
    /// backend on another node, and their replies): the new source. 0
    /// otherwise.
    pub src_addr_be: u32,
    /// `bpf_ktime_get_ns()` of the first fragment; entries older than
    /// [`frag::TIMEOUT_NS`] are not used (the IP id may have been reused).
    pub created_ns: u64,
}

/// Fragment tracking.
pub mod frag {
    /// How long a first fragment's translation serves later fragments:
    /// Linux's default reassembly timeout (`ipfrag_time`, 30 s).
    pub const TIMEOUT_NS: u64 = 30_000_000_000;
    /// [`super::FragKey::dir`] of datagrams the uplink tc program translated
    /// (the destination always, the source when `src_addr_be` is set).
    pub const UPLINK: u8 = 2;
}

/// Value of the uplink map (key: interface index, `u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Uplink {
    /// The interface's IPv4 address: flows from outside to a backend on
    /// another node leave with it as their source.
    pub addr_be: u32,
    pub _pad: [u8; 4],
}

/// Value of the IPv6 uplink map (key: interface index, `u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Uplink6 {
    /// The interface's global IPv6 address (all-zero: none, and flows to
    /// IPv6 backends on other nodes are dropped): flows from outside to an
    /// IPv6 backend on another node leave with it as their source.
    pub addr_be: Addr6Be,
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

/// Key of the session-affinity LRU map: one client of one service port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct AffinityKey {
    pub client_addr_be: u32,
    pub service_id: u32,
}

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

/// Direction marker in [`SockKey::dir`].
pub mod sock_dir {
    /// Keyed by the frontend a socket sent to; the value names its backend.
    pub const FORWARD: u8 = 0;
    /// Keyed by the backend a socket talks to; the value names the frontend.
    pub const REVERSE: u8 = 1;
}

/// Key of the socket-layer LRU map: one socket (its cookie) and one address
/// it sends to or hears from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SockKey {
    /// `bpf_get_socket_cookie()`: unique per socket for the boot.
    pub cookie: u64,
    pub addr_be: u32,
    pub port_be: u16,
    pub proto: u8,
    /// [`sock_dir`].
    pub dir: u8,
}

/// Value of the socket-layer LRU map: where the socket's datagrams to the key's
/// frontend go (`FORWARD`), or which frontend the key's backend stands for
/// (`REVERSE`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SockEntry {
    pub addr_be: u32,
    pub port_be: u16,
    pub _pad: [u8; 2],
    /// `FORWARD`: the backend id, checked against the backend map on every
    /// datagram so a departed backend is never used again.
    pub backend_id: u32,
    pub service_id: u32,
}

/// Key of the socket-layer session-affinity map: the socket layer sees no
/// client address at connect time, so a client is its network namespace (a
/// pod, or the host).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SockAffinityKey {
    /// `bpf_get_netns_cookie()` of the socket's namespace.
    pub netns_cookie: u64,
    pub service_id: u32,
    pub _pad: [u8; 4],
}

/// The single entry (key 0) of the config array, written by the agent before
/// it attaches anything.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Config {
    /// Network-namespace cookie of the node (the agent's namespace). Connected
    /// UDP sockets there are balanced at connect time; elsewhere (pods) the tc
    /// layer balances them per datagram, so a departed backend is left at once.
    pub host_netns_cookie: u64,
}

/// Per-CPU counters per service id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SvcStats {
    /// Packets to the frontend that were rewritten to a backend.
    pub packets: u64,
    pub bytes: u64,
    /// New flows: connection-tracking entries created (tc), sockets connected
    /// and UDP sockets given a backend (socket layer).
    pub new_flows: u64,
    /// Packets dropped because the frontend had no backends.
    pub drops_no_backend: u64,
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

/// Indices of the global per-CPU counter array (value: `u64`).
pub mod stat {
    /// Packets that are not ours are not counted: that would cost every packet
    /// of the node a map update. Index 0 is left unused on purpose, so a
    /// zeroed index never counts anything.
    pub const UNUSED: u32 = 0;
    /// Too short for the headers they announce; passed untouched.
    pub const MALFORMED: u32 = 1;
    /// IPv4 fragments the uplink programs see; never rewritten there, passed
    /// untouched (the tc pod path translates fragments: `frag_*`).
    pub const FRAGMENT: u32 = 2;
    /// Frontend packets dropped because no backend was available.
    pub const DROP_NO_BACKEND: u32 = 3;
    /// A slot or backend entry was missing mid-update; packet dropped.
    pub const DROP_INCONSISTENT: u32 = 4;
    /// A connection-tracking, session-affinity or socket-map insert failed
    /// for another reason than a full connection-tracking table (which is
    /// [`CT_FULL`]): the LRU maps never fill, so a kernel-side failure.
    pub const CT_INSERT_FAILED: u32 = 5;
    /// Rewriting the packet failed in a helper; packet dropped.
    pub const DROP_REWRITE_FAILED: u32 = 6;
    /// Requests rewritten to a backend.
    pub const FORWARDED: u32 = 7;
    /// Replies rewritten back to the frontend address.
    pub const REVERSED: u32 = 8;
    /// A tracked flow whose backend had gone was given a new backend.
    pub const CT_RESELECTED: u32 = 9;
    /// A new flow went to the client's affinity backend.
    pub const AFFINITY_HIT: u32 = 10;
    /// Socket layer: a `connect()` to a frontend was given a backend.
    pub const SOCK_CONNECT: u32 = 11;
    /// Socket layer: an unconnected UDP datagram to a frontend was sent to a
    /// backend.
    pub const SOCK_SENDMSG: u32 = 12;
    /// Socket layer: `recvmsg`/`getpeername` showed the frontend for a backend.
    pub const SOCK_REVERSED: u32 = 13;
    /// Socket layer: a connect or send to a frontend without backends was
    /// refused (`ECONNREFUSED`).
    pub const SOCK_NO_BACKEND: u32 = 14;
    /// Socket layer: a UDP socket's backend had gone; it was given a new one.
    pub const SOCK_RESELECTED: u32 = 15;
    /// Socket layer: a balanced socket closed and its entry was removed.
    pub const SOCK_RELEASED: u32 = 16;
    /// A SYN-ACK met the reply entry of a closed connection: the entry was
    /// dropped and the packet passed untouched (its ports were reused by a
    /// connection that is not a Service's).
    pub const CT_STALE: u32 = 17;
    /// The tail call into the rewrite program failed (the program array was
    /// not filled yet); the packet was rewritten with the slower helper path.
    pub const TAIL_CALL_MISSED: u32 = 18;
    /// Uplink: a packet from outside to a frontend was rewritten to a backend
    /// on this node.
    pub const EXT_LOCAL: u32 = 19;
    /// Uplink: a packet from outside was rewritten to a backend on another
    /// node, its source NATed to this node, and sent out again.
    pub const EXT_REMOTE: u32 = 20;
    /// Uplink: a reply of a source-NATed flow was rewritten back and sent to
    /// the client.
    pub const EXT_REPLY: u32 = 21;
    /// Uplink: no source port was free for a new flow to a remote backend;
    /// dropped.
    pub const SNAT_EXHAUSTED: u32 = 22;
    /// Uplink (XDP): the route lookup could not give the next hop's address
    /// (no neighbour entry yet) for a flow to another node, or the TTL would
    /// expire; the packet went on untranslated to the uplink's tc program,
    /// which sends it with the kernel resolving the neighbour (or drops an
    /// expiring one, `ttl_exceeded`).
    pub const XDP_TO_TC: u32 = 23;
    /// A packet to a frontend without endpoints was answered with an ICMP
    /// port unreachable from the frontend address (kube-proxy's REJECT), sent
    /// back out of the interface it came in on. Packets that may not be
    /// answered are dropped and count as `DROP_NO_BACKEND`.
    pub const REJECTED: u32 = 24;
    /// tc pod path: a later fragment (no ports) of a datagram whose first
    /// fragment was translated got the same address rewrite.
    pub const FRAG_TRANSLATED: u32 = 25;
    /// tc pod path: a later fragment with no translation remembered (not a
    /// Service's datagram, or it arrived before its first fragment); passed
    /// untouched.
    pub const FRAG_UNKNOWN: u32 = 26;
    /// tc pod path: an ICMP error about a translated flow had its quoted
    /// header (and, where it names the backend, its outer address) translated.
    pub const ICMP_ERROR_TRANSLATED: u32 = 27;
    /// Uplink (tc): a packet to send back out (to a backend on another node,
    /// or a reply to the client) had a TTL of 1; dropped.
    pub const TTL_EXCEEDED: u32 = 28;
    /// Uplink (tc): no route to send a packet back out on; dropped.
    pub const NO_ROUTE: u32 = 29;
    /// The connection-tracking table was full: a new flow could not be
    /// tracked and its packet was dropped (as Cilium does; the client's
    /// retransmission gets through once the agent's garbage collector made
    /// room). Flows already tracked are not affected.
    pub const CT_FULL: u32 = 30;
    pub const COUNT: u32 = 31;
    /// Names, by index, for the CLI and metrics.
    pub const NAMES: [&str; COUNT as usize] = [
        "unused",
        "malformed",
        "fragment",
        "drop_no_backend",
        "drop_inconsistent",
        "ct_insert_failed",
        "drop_rewrite_failed",
        "forwarded",
        "reversed",
        "ct_reselected",
        "affinity_hit",
        "sock_connect",
        "sock_sendmsg",
        "sock_reversed",
        "sock_no_backend",
        "sock_reselected",
        "sock_released",
        "ct_stale",
        "tail_call_missed",
        "ext_local",
        "ext_remote",
        "ext_reply",
        "snat_exhausted",
        "xdp_to_tc",
        "rejected",
        "frag_translated",
        "frag_unknown",
        "icmp_error_translated",
        "ttl_exceeded",
        "no_route",
        "ct_full",
    ];
}

// ---- IPv6 (names::FRONTENDS6 and the rest) ----
// Each type mirrors its IPv4 twin field for field, with `Addr6Be` for every
// address; values without an address (FrontendSlot, AffinityEntry, SvcStats,
// MaglevTable, SockAffinityKey) are shared by both families.

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

/// [`Backend`] with an IPv6 address (ids are shared with [`Backend`]'s:
/// an id names a backend in exactly one of the two maps).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Backend6 {
    pub addr_be: Addr6Be,
    pub port_be: u16,
    pub proto: u8,
    pub flags: u8,
}

/// [`CtKey`] of an IPv6 flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct CtKey6 {
    pub saddr_be: Addr6Be,
    pub daddr_be: Addr6Be,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    pub dir: u8,
    pub _pad: [u8; 2],
}

/// [`CtEntry`] of an IPv6 flow: the same fields, the same meaning.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct CtEntry6 {
    pub backend_id: u32,
    pub service_id: u32,
    pub nat_addr_be: Addr6Be,
    pub nat_port_be: u16,
    pub flags: u8,
    pub state: u8,
    pub snat_addr_be: Addr6Be,
    pub snat_port_be: u16,
    pub _pad2: [u8; 2],
    pub created_ns: u64,
    pub last_seen_ns: u64,
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

/// [`AffinityKey`] of an IPv6 client.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct AffinityKey6 {
    pub client_addr_be: Addr6Be,
    pub service_id: u32,
}

/// [`SockKey`] of an IPv6 socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SockKey6 {
    pub cookie: u64,
    pub addr_be: Addr6Be,
    pub port_be: u16,
    pub proto: u8,
    pub dir: u8,
    pub _pad: [u8; 4],
}

/// [`SockEntry`] of an IPv6 socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SockEntry6 {
    pub addr_be: Addr6Be,
    pub port_be: u16,
    pub _pad: [u8; 2],
    pub backend_id: u32,
    pub service_id: u32,
}

/// [`FragKey`] of an IPv6 datagram: the fragment header's 32-bit
/// identification.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FragKey6 {
    pub saddr_be: Addr6Be,
    pub daddr_be: Addr6Be,
    pub id_be: u32,
    pub proto: u8,
    pub dir: u8,
    pub _pad: [u8; 2],
}

/// [`FragEntry`] of an IPv6 datagram.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FragEntry6 {
    pub addr_be: Addr6Be,
    pub port_be: u16,
    pub dir: u8,
    pub _pad: u8,
    pub service_id: u32,
    pub src_addr_be: Addr6Be,
    pub created_ns: u64,
}

/// `aya::Pod` for the map types: each `#[repr(C)]`, without implicit
/// padding (the size assertions that follow check it), valid for any bit
/// pattern.
#[cfg(feature = "user")]
mod aya_pod {
    use super::*;

    macro_rules! aya_pod {
        ($($t:ty),* $(,)?) => {$(
            // SAFETY: `#[repr(C)]`, no implicit padding (asserted below),
            // valid for any bit pattern.
            unsafe impl aya::Pod for $t {}
        )*};
    }

    aya_pod!(
        FrontendKey,
        FrontendSlot,
        Backend,
        CtKey,
        CtEntry,
        CtEntryV2,
        CtEntryV4,
        RevNat,
        SvcStats,
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
        SrcRange4,
        SrcRange6,
    );
}

const _: () = assert!(size_of::<FrontendKey>() == 12);
const _: () = assert!(size_of::<FrontendSlot>() == 16);
const _: () = assert!(size_of::<Backend>() == 8);
const _: () = assert!(size_of::<CtKey>() == 16);
const _: () = assert!(size_of::<CtEntry>() == 40);
const _: () = assert!(size_of::<CtEntryV2>() == 24);
const _: () = assert!(size_of::<CtEntryV4>() == 32);
const _: () = assert!(size_of::<RevNat>() == 64);
const _: () = assert!(size_of::<SvcStats>() == 32);
const _: () = assert!(size_of::<AffinityKey>() == 8);
const _: () = assert!(size_of::<AffinityEntry>() == 16);
const _: () = assert!(size_of::<SockKey>() == 16);
const _: () = assert!(size_of::<SockEntry>() == 16);
const _: () = assert!(size_of::<SockAffinityKey>() == 16);
const _: () = assert!(size_of::<Config>() == 8);
const _: () = assert!(size_of::<Uplink>() == 8);
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
    use super::*;
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
