//! The address family the family-generic programs are written over: IPv4
//! (`u32`) and IPv6 ([`Addr6Be`]). A function generic over [`Family`] is
//! monomorphised and inlined once per family, so each program is what a
//! hand-written twin would be, written once.
//!
//! [`Family`] gathers what differs: the maps of the family (connection
//! tracking and its ring of new flows, affinity; frontends and backends
//! through [`crate::lb::FamilyAddr`]), how its addresses compare, its
//! source ranges, its bit of the frontend bitmap, the hairpin address, and
//! the family's working memory ([`Work`]).
//!
//! A program's keys and entries live in [`Work`], a per-CPU array entry of
//! the family (`SB_SCRATCH4_V1`, `SB_SCRATCH6_V1`), not on the stack: the
//! IPv6 ones do not fit in the 512 bytes a BPF call chain has, and the
//! IPv4 ones follow the same code. Recent kernels' verifiers inline the
//! per-CPU array lookup (6.18 does: a few instructions, no helper call).
use aya_ebpf::{
    btf_maps::{HashMap, LruHashMap, PerCpuArray},
    macros::btf_map,
};
use proxy_common::{
    capacity, hairpin, Addr6Be, AffinityEntry, AffinityKeyOf, BackendOf, CtEntryOf, CtKeyOf,
    FragEntryOf, FragKey, FragKey6, FrontendSlot, KeyPair,
};

use crate::{
    lb::FamilyAddr,
    maps::{
        source_allowed4, source_allowed6, AFFINITY_ENTRIES, SB_AFFINITY6_V1, SB_AFFINITY_V1,
        SB_CT6_NEW_V2, SB_CT6_V1, SB_CT_NEW_V2, SB_CT_V5, SB_FRAG6_V1, SB_FRAG_V1,
    },
    newflows::slot_of,
    packet::{set, v6::eq6, FlowOf},
    prefilter::{maybe_frontend4, maybe_frontend6, maybe_frontend_port4, maybe_frontend_port6},
    rewrite::Header,
    trace::TraceAddr,
};

/// A family's connection-tracking table.
pub(crate) type CtMap<A> = HashMap<
    CtKeyOf<A>,
    CtEntryOf<A>,
    { capacity::CONNTRACK as usize },
    { crate::maps::NO_PREALLOC },
>;
/// A family's fragment-tracking map.
pub(crate) type FragMap<A> =
    LruHashMap<<A as Family>::FragKey, FragEntryOf<A>, { capacity::FRAGMENTS as usize }>;
/// A family's session-affinity map.
pub(crate) type AffinityMap<A> = LruHashMap<AffinityKeyOf<A>, AffinityEntry, AFFINITY_ENTRIES>;

/// An address family: see the module's documentation.
pub(crate) trait Family: FamilyAddr + Header + TraceAddr + 'static {
    /// The unspecified address (an entry without source NAT).
    const ZERO: Self;
    /// The address a pod reaching itself through a Service is given as
    /// its client ([`crate::hairpin`]).
    const HAIRPIN: Self;
    /// The family's fragment-tracking key, and the quote of an ICMP error
    /// being built ([`crate::reject`]: the header and 8 bytes after it).
    type FragKey;
    type Quote;
    /// Address equality (word by word for IPv6: a slice comparison would
    /// call `bcmp`).
    fn same(&self, other: &Self) -> bool;
    fn conntrack() -> &'static CtMap<Self>;
    /// The next slot of the family's ring of new flows to write (`evict ==
    /// false`) or to examine (`evict == true`; none when every remembered
    /// flow was examined), its cursor moved on ([`slot_of`]).
    fn take_slot(evict: bool) -> Option<*mut KeyPair<CtKeyOf<Self>>>;
    fn affinity() -> &'static AffinityMap<Self>;
    /// The family's fragment-tracking map ([`crate::frag`]).
    fn frags() -> &'static FragMap<Self>;
    /// Writes the fragment key of `flow`'s datagram in direction `dir`.
    fn frag_key(flow: &FlowOf<Self>, dir: u8, key: &mut Self::FragKey);
    /// Whether the frontend of slot 0 `svc` lets `client` in
    /// (`loadBalancerSourceRanges`).
    fn source_allowed(svc: &FrontendSlot, client: &Self) -> bool;
    /// False only if no frontend has the address (the frontend bitmap,
    /// [`crate::prefilter`]).
    fn maybe_frontend(addr: &Self) -> bool;
    /// False only if no frontend has the address with that port and
    /// protocol.
    fn maybe_frontend_port(addr: &Self, port_be: u16, proto: u8) -> bool;
    /// This CPU's working memory of the family.
    fn work() -> Option<&'static mut Work<Self>>;
    /// The family's per-CPU cache of established flows (`crate::ct::cache`).
    fn flow_cache() -> &'static crate::maps::FlowCache<Self>;
}

/// A program's working memory for one packet of family `A` (see the
/// module's documentation), valid for one program run: no other program
/// of ours runs on this CPU meanwhile (tc and XDP programs run with bottom
/// halves off, and none calls another that uses it).
#[repr(C)]
pub struct Work<A: Family> {
    pub flow: FlowOf<A>,
    /// The packet's connection-tracking key.
    pub key: CtKeyOf<A>,
    /// The other direction's key.
    pub key2: CtKeyOf<A>,
    pub entry: CtEntryOf<A>,
    pub fe: A::Key,
    pub aff: AffinityKeyOf<A>,
    pub backend: BackendOf<A>,
    pub frag_key: A::FragKey,
    pub frag_entry: FragEntryOf<A>,
    /// The quote of an ICMP error being built ([`crate::reject`]): the IP
    /// header and 8 bytes of the TCP/UDP header, as in the packet.
    pub quote: A::Quote,
    /// What the flow cache's lookup read for the fill that may follow it.
    pub ct: CacheTicket,
}

/// What a flow cache's lookup (`crate::ct::cache::hit`) reads for the fill
/// that may follow the table's answer: the two generations, read before
/// the table is looked up, and the key's slot.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CacheTicket {
    /// The connection-tracking table's generation.
    pub gen: u64,
    /// The slot's index.
    pub slot: u32,
    /// The slot index's own generation (its low half).
    pub slot_gen: u32,
}

/// Copies a backend field by field (see [`set`]).
#[inline(always)]
pub(crate) fn set_backend<A: Family>(dst: &mut BackendOf<A>, src: &BackendOf<A>) {
    set(&mut dst.addr_be, &src.addr_be);
    dst.port_be = src.port_be;
    dst.proto = src.proto;
    dst.flags = src.flags;
}

/// Not pinned: each loaded object has its own, used within one program run.
#[btf_map]
pub static SB_SCRATCH4_V1: PerCpuArray<Work<u32>, 1> = PerCpuArray::new();
#[btf_map]
pub static SB_SCRATCH6_V1: PerCpuArray<Work<Addr6Be>, 1> = PerCpuArray::new();

impl Family for u32 {
    const ZERO: u32 = 0;
    const HAIRPIN: u32 = hairpin::ADDR_BE;
    type FragKey = FragKey;
    type Quote = [u32; 7];
    #[inline(always)]
    fn frags() -> &'static FragMap<u32> {
        &SB_FRAG_V1
    }
    #[inline(always)]
    fn frag_key(flow: &FlowOf<u32>, dir: u8, key: &mut FragKey) {
        key.saddr_be = flow.saddr_be;
        key.daddr_be = flow.daddr_be;
        key.id_be = flow.frag_id_be as u16;
        key.proto = flow.proto;
        key.dir = dir;
    }
    #[inline(always)]
    fn same(&self, other: &u32) -> bool {
        self == other
    }
    #[inline(always)]
    fn conntrack() -> &'static CtMap<u32> {
        &SB_CT_V5
    }
    #[inline(always)]
    fn take_slot(evict: bool) -> Option<*mut KeyPair<CtKeyOf<u32>>> {
        let ring = SB_CT_NEW_V2.get_ptr_mut(0)?;
        // SAFETY: the map's one value, valid for the program run.
        unsafe { slot_of(ring, evict) }
    }
    #[inline(always)]
    fn affinity() -> &'static AffinityMap<u32> {
        &SB_AFFINITY_V1
    }
    #[inline(always)]
    fn source_allowed(svc: &FrontendSlot, client: &u32) -> bool {
        source_allowed4(svc, *client)
    }
    #[inline(always)]
    fn maybe_frontend(addr: &u32) -> bool {
        maybe_frontend4(*addr)
    }
    #[inline(always)]
    fn maybe_frontend_port(addr: &u32, port_be: u16, proto: u8) -> bool {
        maybe_frontend_port4(*addr, port_be, proto)
    }
    #[inline(always)]
    fn work() -> Option<&'static mut Work<u32>> {
        let ptr = SB_SCRATCH4_V1.get_ptr_mut(0)?;
        // SAFETY: this CPU's slot of a per-CPU array, valid for the program
        // run, and used by one program run at a time (see `Work`).
        Some(unsafe { &mut *ptr })
    }
    #[inline(always)]
    fn flow_cache() -> &'static crate::maps::FlowCache<u32> {
        &crate::maps::SB_FLOW_CACHE4_V1
    }
}

impl Family for Addr6Be {
    const ZERO: Addr6Be = [0; 4];
    const HAIRPIN: Addr6Be = hairpin::ADDR6_BE;
    type FragKey = FragKey6;
    type Quote = [u32; 12];
    #[inline(always)]
    fn frags() -> &'static FragMap<Addr6Be> {
        &SB_FRAG6_V1
    }
    #[inline(always)]
    fn frag_key(flow: &FlowOf<Addr6Be>, dir: u8, key: &mut FragKey6) {
        set(&mut key.saddr_be, &flow.saddr_be);
        set(&mut key.daddr_be, &flow.daddr_be);
        key.id_be = flow.frag_id_be;
        key.proto = flow.proto;
        key.dir = dir;
        key._pad = [0; 2];
    }
    #[inline(always)]
    fn same(&self, other: &Addr6Be) -> bool {
        eq6(self, other)
    }
    #[inline(always)]
    fn conntrack() -> &'static CtMap<Addr6Be> {
        &SB_CT6_V1
    }
    #[inline(always)]
    fn take_slot(evict: bool) -> Option<*mut KeyPair<CtKeyOf<Addr6Be>>> {
        let ring = SB_CT6_NEW_V2.get_ptr_mut(0)?;
        // SAFETY: as for IPv4.
        unsafe { slot_of(ring, evict) }
    }
    #[inline(always)]
    fn affinity() -> &'static AffinityMap<Addr6Be> {
        &SB_AFFINITY6_V1
    }
    #[inline(always)]
    fn source_allowed(svc: &FrontendSlot, client: &Addr6Be) -> bool {
        source_allowed6(svc, client)
    }
    #[inline(always)]
    fn maybe_frontend(addr: &Addr6Be) -> bool {
        maybe_frontend6(addr)
    }
    #[inline(always)]
    fn maybe_frontend_port(addr: &Addr6Be, port_be: u16, proto: u8) -> bool {
        maybe_frontend_port6(addr, port_be, proto)
    }
    #[inline(always)]
    fn work() -> Option<&'static mut Work<Addr6Be>> {
        let ptr = SB_SCRATCH6_V1.get_ptr_mut(0)?;
        // SAFETY: as for IPv4.
        Some(unsafe { &mut *ptr })
    }
    #[inline(always)]
    fn flow_cache() -> &'static crate::maps::FlowCache<Addr6Be> {
        &crate::maps::SB_FLOW_CACHE6_V1
    }
}
