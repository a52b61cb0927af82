//! The maps, shared by the tc and the socket-layer programs, and the counters.
//!
//! Sizes here are defaults; the agent sets the real capacities at load time.
use aya_ebpf::{
    btf_maps::{
        lpm_trie::Key as LpmKey, Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray,
        SkStorage,
    },
    macros::btf_map,
};
use proxy_common::{
    capacity, prefilter, stat, Addr6Be, AffinityEntry, AffinityKey, AffinityKey6, Backend,
    Backend6, Config, CtEntry, CtEntry6, CtKey, CtKey6, CtKeyOf, FragEntry, FragEntry6, FragKey,
    FragKey6, FrontendKey, FrontendKey6, FrontendSlot, MaglevTable, NewFlows, NewFlows6, RevNat,
    RevNat6, SockAffinityKey, SockConn, SockConn6, SockEntry, SockEntry6, SockKey, SockKey6,
    SrcRange4, SrcRange6, SvcStats, Uplink, Uplink6, SRC_RANGE_ID_BITS,
};

/// Capacity type parameter shared by both affinity maps, so one selection
/// function serves both.
pub const AFFINITY_ENTRIES: usize = capacity::AFFINITY as usize;

#[btf_map]
pub static SB_FE_V1: HashMap<FrontendKey, FrontendSlot, { capacity::FRONTENDS as usize }> =
    HashMap::new();
#[btf_map]
pub static SB_BE_V1: HashMap<u32, Backend, { capacity::BACKENDS as usize }> = HashMap::new();
/// Preallocated and not LRU: live flows are never evicted; the agent
/// removes expired ones ([`crate::ct`]).
#[btf_map]
pub static SB_CT_V5: HashMap<CtKey, CtEntry, { capacity::CONNTRACK as usize }> = HashMap::new();
/// Read by the CLI only; kept here so it is created and pinned with the rest.
#[btf_map]
pub static SB_RNAT_V1: HashMap<u32, RevNat, { capacity::SERVICES as usize }> = HashMap::new();
#[btf_map]
pub static SB_SVC_STATS_V1: PerCpuArray<SvcStats, { capacity::SERVICES as usize + 1 }> =
    PerCpuArray::new();
#[btf_map]
pub static SB_AFFINITY_V1: LruHashMap<AffinityKey, AffinityEntry, AFFINITY_ENTRIES> =
    LruHashMap::new();
#[btf_map]
pub static SB_SOCK_AFFINITY_V1: LruHashMap<SockAffinityKey, AffinityEntry, AFFINITY_ENTRIES> =
    LruHashMap::new();
#[btf_map]
pub static SB_SOCK_V1: LruHashMap<SockKey, SockEntry, { capacity::SOCKETS as usize }> =
    LruHashMap::new();
/// The frontend of each TCP socket the socket layer connected to a backend,
/// stored with the socket and freed with it (no table to fill): what
/// `getpeername()` shows; and whether the socket counts on its backend.
#[btf_map]
pub static SB_SOCK_CONN_V2: SkStorage<SockConn> = SkStorage::new();
/// [`SB_SOCK_CONN_V2`] of IPv6 sockets.
#[btf_map]
pub static SB_SOCK_CONN6_V2: SkStorage<SockConn6> = SkStorage::new();
#[btf_map]
pub static SB_CONFIG_V1: Array<Config, 1> = Array::new();
/// The IPv6 tc uplink program (`proxy_common::tail::FROM_UPLINK6`).
#[btf_map]
pub static SB_TAIL6_V1: ProgramArray<1> = ProgramArray::new();
/// The IPv6 XDP uplink program (`proxy_common::tail::XDP_UPLINK6`): a
/// program array holds programs of one type only.
#[btf_map]
pub static SB_XDP_TAIL6_V1: ProgramArray<1> = ProgramArray::new();
/// Allocated per entry (`BPF_F_NO_PREALLOC`): a table is 64 KiB and only
/// Services with a hashing algorithm have one.
#[btf_map]
pub static SB_MAGLEV_V1: HashMap<u32, MaglevTable, { capacity::SERVICES as usize }, NO_PREALLOC> =
    HashMap::new();
const NO_PREALLOC: usize = aya_ebpf::bindings::BPF_F_NO_PREALLOC as usize;
#[btf_map]
pub static SB_UPLINK_V1: HashMap<u32, Uplink, { capacity::UPLINKS as usize }> = HashMap::new();
/// The tc pod path's fragmented datagrams ([`crate::frag`]).
#[btf_map]
pub static SB_FRAG_V1: LruHashMap<FragKey, FragEntry, { capacity::FRAGMENTS as usize }> =
    LruHashMap::new();

// IPv6: the same maps with IPv6 keys and values (see `proxy_common::names`).
// Ids are shared with the IPv4 maps; the counters, Maglev tables, socket
// affinity, configuration and tail calls above serve both families.
#[btf_map]
pub static SB_FE6_V1: HashMap<FrontendKey6, FrontendSlot, { capacity::FRONTENDS as usize }> =
    HashMap::new();
#[btf_map]
pub static SB_BE6_V1: HashMap<u32, Backend6, { capacity::BACKENDS as usize }> = HashMap::new();
#[btf_map]
pub static SB_CT6_V1: HashMap<CtKey6, CtEntry6, { capacity::CONNTRACK as usize }> = HashMap::new();
#[btf_map]
pub static SB_RNAT6_V1: HashMap<u32, RevNat6, { capacity::SERVICES as usize }> = HashMap::new();
#[btf_map]
pub static SB_AFFINITY6_V1: LruHashMap<AffinityKey6, AffinityEntry, AFFINITY_ENTRIES> =
    LruHashMap::new();
#[btf_map]
pub static SB_SOCK6_V1: LruHashMap<SockKey6, SockEntry6, { capacity::SOCKETS as usize }> =
    LruHashMap::new();
#[btf_map]
pub static SB_UPLINK6_V1: HashMap<u32, Uplink6, { capacity::UPLINKS as usize }> = HashMap::new();
#[btf_map]
pub static SB_FRAG6_V1: LruHashMap<FragKey6, FragEntry6, { capacity::FRAGMENTS as usize }> =
    LruHashMap::new();

/// The recent new IPv4 flows of all CPUs ([`crate::ct::make_room`], over
/// [`crate::ct::Table`]). Not pinned: a new agent starts with an empty memory.
#[btf_map]
pub static SB_CT_NEW_V2: Array<NewFlows, 1> = Array::new();
/// [`SB_CT_NEW_V2`] for IPv6 flows.
#[btf_map]
pub static SB_CT6_NEW_V2: Array<NewFlows6, 1> = Array::new();

/// `loadBalancerSourceRanges`, by service id and client block (see
/// [`source_allowed4`]).
#[btf_map]
pub static SB_SRC_RANGE_V1: LpmTrie<SrcRange4, u8, { capacity::SOURCE_RANGES as usize }> =
    LpmTrie::new();
#[btf_map]
pub static SB_SRC_RANGE6_V1: LpmTrie<SrcRange6, u8, { capacity::SOURCE_RANGES as usize }> =
    LpmTrie::new();
/// Packets denied by `loadBalancerSourceRanges`, per service id.
#[btf_map]
pub static SB_SVC_DENIED_V1: PerCpuArray<u64, { capacity::SERVICES as usize + 1 }> =
    PerCpuArray::new();

/// Round-robin turns by service id ([`crate::lb::sched`]). Not pinned.
#[btf_map]
pub static SB_RR_V1: Array<u64, { capacity::SERVICES as usize + 1 }> = Array::new();
/// Open flows by backend id, of least-connection frontends
/// ([`crate::lb::sched`]). Not pinned; an entry is allocated by the first
/// flow counted.
#[btf_map]
pub static SB_LC_V1: HashMap<u32, u64, { capacity::BACKENDS as usize }, NO_PREALLOC> =
    HashMap::new();

/// The backend id each socket of a least-connection frontend counts on, by
/// socket cookie ([`crate::lb::sched`]). Not pinned.
#[btf_map]
pub static SB_LC_SOCK_V1: LruHashMap<u64, u32, { capacity::SOCKETS as usize }> = LruHashMap::new();

/// The frontend bitmap; the agent sizes it with the frontend map
/// (`prefilter::frontends::words_for`) and sets [`SB_FE_FILTER_SHIFT`] to
/// match.
#[btf_map]
pub static SB_FE_FILTER_V3: Array<u64, { prefilter::frontends::MIN_WORDS as usize }> = Array::new();
/// How a hash indexes [`SB_FE_FILTER_V3`] (`prefilter::frontends::shift_for`
/// its size): read-only data, set by the loader.
#[unsafe(no_mangle)]
pub static SB_FE_FILTER_SHIFT: u32 =
    prefilter::frontends::shift_for(prefilter::frontends::MIN_WORDS);
#[btf_map]
pub static SB_QUIET_V2: Array<prefilter::quiet::QuietMark, { prefilter::quiet::ENTRIES as usize }> =
    Array::new();
#[btf_map]
pub static SB_QUIET_GEN_V1: Array<u64, { prefilter::quiet::ENTRIES as usize }> = Array::new();

/// Each CPU's cache of established flows (`crate::ct::cache`): slots per
/// CPU and family, a power of two.
pub const FLOW_SLOTS: u32 = 1024;
const _: () = assert!(FLOW_SLOTS.is_power_of_two());

/// One cached flow direction (`crate::ct::cache`): the key it answers, the
/// translation, the entry's state when it was filled, the tick until which
/// it stands for the entry, and the two generations then (the table's and
/// its slot's). Not shared with the agent and never pinned (each loaded
/// object starts empty); the IPv6 slot ends in 4 bytes of padding the
/// compiler adds.
#[repr(C)]
pub struct FlowSlot<A> {
    pub gen: u64,
    /// `bpf_jiffies64` before which the slot answers: until the entry's
    /// last-seen time is due to be refreshed.
    pub until_jiffies: u64,
    pub key: CtKeyOf<A>,
    pub nat_addr_be: A,
    pub nat_port_be: u16,
    pub state: u8,
    pub _pad: u8,
    pub service_id: u32,
    /// The low half of [`SB_FLOW_SLOT_GEN_V1`] at this slot's index when
    /// it was filled: it wraps only after 2^32 replacements hashed to one
    /// slot, far more than fit in the slot's life (`until_jiffies`).
    pub slot_gen: u32,
}
const _: () = assert!(core::mem::size_of::<FlowSlot<u32>>() == 48);
const _: () = assert!(core::mem::size_of::<FlowSlot<Addr6Be>>() == 88);

/// A family's flow cache: one array of slots per CPU.
pub type FlowCache<A> = PerCpuArray<FlowSlot<A>, { FLOW_SLOTS as usize }>;

#[btf_map]
pub static SB_FLOW_CACHE4_V1: FlowCache<u32> = PerCpuArray::new();
#[btf_map]
pub static SB_FLOW_CACHE6_V1: FlowCache<Addr6Be> = PerCpuArray::new();

/// The connection-tracking table's generation: moved on by the agent after
/// it removed entries (`proxy_common::conntrack::CT_GEN_AGENT_STEP`); what
/// the flow caches hold is void once it moved (`crate::ct::cache`).
#[btf_map]
pub static SB_CT_GEN_V1: Array<u64, 1> = Array::new();

/// The generation of each flow-cache slot index, shared by all CPUs and
/// both families: the data path adds one (atomically) after it removes or
/// replaces the entry of a key that hashes to the index, which voids that
/// index's slot on every CPU and no other (`crate::ct::cache`). Not pinned:
/// only this object's caches hold its values.
#[btf_map]
pub static SB_FLOW_SLOT_GEN_V1: Array<u64, { FLOW_SLOTS as usize }> = Array::new();

#[btf_map]
pub static SB_STATS_V5: PerCpuArray<u64, { stat::COUNT as usize }> = PerCpuArray::new();

/// Adds one to a global counter.
#[inline(always)]
pub fn count(index: u32) {
    if let Some(counter) = SB_STATS_V5.get_ptr_mut(index) {
        // SAFETY: the pointer is this CPU's slot of a per-CPU array entry that
        // the lookup just returned; nothing else writes it while we run here.
        unsafe { *counter += 1 };
    }
}

/// Updates one service's counters.
#[inline(always)]
pub fn count_service(service_id: u32, update: impl FnOnce(&mut SvcStats)) {
    if let Some(stats) = SB_SVC_STATS_V1.get_ptr_mut(service_id) {
        // SAFETY: as in `count`: this CPU's own slot, valid for the program run.
        update(unsafe { &mut *stats });
    }
}

/// The agent's configuration (zeroed until the agent writes it).
#[inline(always)]
pub fn config() -> Config {
    SB_CONFIG_V1.get(0).copied().unwrap_or_default()
}

/// Each CPU's last read of the coarse clock and the tick it was read at
/// (`crate::ct::now_ns`). Not pinned: a new program starts with a fresh one.
#[btf_map]
pub static SB_CLOCK_V1: PerCpuArray<CpuClock, 1> = PerCpuArray::new();

/// One CPU's cached clock.
#[repr(C)]
pub struct CpuClock {
    pub jiffies: u64,
    pub ns: u64,
}

/// Whether the frontend of slot 0 `svc` lets an IPv4 client in: always,
/// unless its Service restricts sources (`loadBalancerSourceRanges`), and
/// then only a client inside one of its blocks. A frontend without the flag
/// costs one bit test, no lookup.
#[inline(always)]
pub fn source_allowed4(svc: &proxy_common::FrontendSlot, client_be: u32) -> bool {
    if svc.flags & proxy_common::frontend_flags::SOURCE_RANGES == 0 {
        return true;
    }
    let key = LpmKey::new(
        SRC_RANGE_ID_BITS + 32,
        SrcRange4 {
            service_id_be: svc.service_id.to_be(),
            addr_be: client_be,
        },
    );
    SB_SRC_RANGE_V1.get(&key).is_some()
}

/// [`source_allowed4`] for an IPv6 client.
#[inline(always)]
pub fn source_allowed6(
    svc: &proxy_common::FrontendSlot,
    client_be: &proxy_common::Addr6Be,
) -> bool {
    if svc.flags & proxy_common::frontend_flags::SOURCE_RANGES == 0 {
        return true;
    }
    let key = LpmKey::new(
        SRC_RANGE_ID_BITS + 128,
        SrcRange6 {
            service_id_be: svc.service_id.to_be(),
            addr_be: *client_be,
        },
    );
    SB_SRC_RANGE6_V1.get(&key).is_some()
}

/// Counts a packet of service `service_id` denied by its source ranges.
#[inline(always)]
pub fn count_denied(service_id: u32) {
    if let Some(counter) = SB_SVC_DENIED_V1.get_ptr_mut(service_id) {
        // SAFETY: as in `count`: this CPU's own slot, valid for the program run.
        unsafe { *counter += 1 };
    }
}
