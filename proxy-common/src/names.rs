//! Map names. They are also the file names under the pin root.
//! The `_v1` suffix is the layout version: a layout change gets a new name so an
//! agent never reads a pinned map written with another layout.
pub const FRONTENDS: &str = "SB_FE_V1";
pub const BACKENDS: &str = "SB_BE_V1";
/// A plain (preallocated, non-LRU) hash the agent garbage-collects. Each
/// entry carries the address the packet is rewritten to in its direction
/// (`nat_addr_be`, so a reply needs no reverse-NAT lookup), the source NAT
/// of a flow from outside the node to a backend on another node
/// (`snat_addr_be`, `snat_port_be`), `last_seen_ns` and its direction's TCP
/// state (`ct_state`), so a live flow is never evicted for a new one.
pub const CONNTRACK: &str = "SB_CT_V5";
pub const REVNAT: &str = "SB_RNAT_V1";
pub const SERVICE_STATS: &str = "SB_SVC_STATS_V1";
/// The data path's per-CPU counters, indexed by [`super::stat`].
pub const GLOBAL_STATS: &str = "SB_STATS_V5";
pub const AFFINITY: &str = "SB_AFFINITY_V1";
/// Socket layer: per-socket translations ([`super::SockKey`]).
pub const SOCKETS: &str = "SB_SOCK_V1";
/// Socket layer: session affinity per network namespace.
pub const SOCK_AFFINITY: &str = "SB_SOCK_AFFINITY_V1";
/// One [`super::Config`] entry the agent writes at start-up.
pub const CONFIG: &str = "SB_CONFIG_V1";
/// The tc uplink program's IPv6 twin, tail-called by `sb_from_uplink` for
/// ethertype 0x86DD (slot [`super::tail::FROM_UPLINK6`]). Pinned, so the
/// IPv6 program stays reachable while no agent runs (an agent killed or
/// restarting loses no IPv6 traffic from outside), and a new agent's load
/// puts its own IPv6 program in for the program still attached.
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
/// of 36, and a program looks in one family's map only. Service ids and backend ids come from one id
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
/// The pod path's bitmap of frontend addresses, both families
/// ([`super::prefilter::frontends`]): a clear bit proves a destination is
/// no frontend before any hash lookup.
/// Sized with the frontend map, indexed as `SB_FE_FILTER_SHIFT` says, its
/// bits chosen by Fibonacci hashing.
pub const FRONTEND_FILTER: &str = "SB_FE_FILTER_V3";
/// The global that tells the programs how to index the frontend bitmap
/// (`prefilter::frontends::shift_for` its size), set when the object is
/// loaded: the bitmap is sized with the frontend map.
pub const FRONTEND_FILTER_SHIFT: &str = "SB_FE_FILTER_SHIFT";
/// The global that tells the XDP program whether the kernel lets it call
/// `bpf_xdp_adjust_meta` (1) or not (0), set when the object is loaded from
/// a probe of the running kernel.
pub const XDP_META: &str = "SB_XDP_META";
/// The pod interfaces whose pod has no flow translated by the tc layer, per
/// class of protocol ([`super::prefilter::quiet::QuietMark`]; written by the
/// agent): `sb_to_pod` passes their packets of that class without a
/// connection-tracking lookup while the mark's generation is current.
pub const QUIET_PODS: &str = "SB_QUIET_V2";
/// The generation of each pod interface and class (`u64`, indexed as
/// [`QUIET_PODS`]): the data path adds one with an atomic add after it
/// tracks a flow from that interface, voiding the mark of an older one.
pub const QUIET_GENS: &str = "SB_QUIET_GEN_V1";
/// The connection-tracking table's generation (one `u64`): moved on by
/// [`super::CT_GEN_AGENT_STEP`] after the agent removed entries (the
/// programs void only the flow-cache slot of the key they write); the data
/// path's per-CPU flow caches answer only for the generation they were
/// filled at.
pub const CT_GEN: &str = "SB_CT_GEN_V1";
/// Socket layer: the socket-local storage of a TCP socket connected to a
/// backend ([`super::SockConn`]), freed with the socket.
pub const SOCK_CONNS: &str = "SB_SOCK_CONN_V2";
/// The IPv6 twin of [`SOCK_CONNS`] ([`super::SockConn6`]).
pub const SOCK_CONNS6: &str = "SB_SOCK_CONN6_V2";
/// Round-robin: each service id's turn counter (`u64`, an array by
/// service id), advanced with an atomic add by every new flow of a
/// round-robin frontend. Not pinned: a new agent starts the turns over.
pub const ROUND_ROBIN: &str = "SB_RR_V1";
/// Least-connection: each backend id's open flows (`u64`, a hash by
/// backend id; an entry is made by the first flow counted). Not pinned:
/// the counts follow from connection tracking and the socket map, and the
/// agent rebuilds them from those at start and checks them periodically.
pub const OPEN_FLOWS: &str = "SB_LC_V1";
/// Least-connection, socket layer: the backend id each socket connected
/// to a least-connection frontend counts on (`u32`), by socket cookie
/// (`u64`), an LRU hash. `sock_release` takes the socket off. Not pinned,
/// as [`OPEN_FLOWS`].
pub const OPEN_SOCKETS: &str = "SB_LC_SOCK_V1";
/// The live trace's ring buffer ([`super::TraceEvent`]). Not pinned,
/// as the two below: the agent that loaded the programs reads it.
pub const TRACE_EVENTS: &str = "SB_TRACE_V1";
/// The trace's switch: one `u64`, bit `1 << kind` per event kind
/// ([`super::trace::kind`]), written only by the agent. A global of the
/// programs in a data section of its own, which the loader makes a
/// one-entry array map named as the section (the kernel keeps the first 15
/// characters: `.data.sb_trace_`).
pub const TRACE_ON: &str = ".data.sb_trace_on";
/// Whether a pod's connected UDP socket is balanced at `connect()` (1) or
/// left to the tc layer (0): a global in a data section of its own (the
/// kernel keeps `.data.sb_pod_ud`), set by the agent before it attaches the
/// socket layer, when it can close such a socket in the pod's namespace.
pub const POD_UDP_AT_CONNECT: &str = ".data.sb_pod_udp";
/// Whether the socket layer balances only the node's own sockets (1), a
/// pod's being left to the tc layer, or every socket in its cgroup (0): a
/// global in a data section of its own (`.data.sb_hostns`, within the
/// kernel's 15 characters), set by the agent before it attaches the socket
/// layer (`--socket-lb-host-namespace-only`).
pub const HOST_NAMESPACE_ONLY: &str = ".data.sb_hostns";
/// Per-CPU count of events the ring buffer had no room for.
pub const TRACE_LOST: &str = "SB_TRACE_LOST_V1";
/// Every map, in the order the CLI reports them.
pub const ALL: [&str; 32] = [
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
    FRONTEND_FILTER,
    QUIET_PODS,
    QUIET_GENS,
    CT_GEN,
    SOCK_CONNS,
    SOCK_CONNS6,
];
