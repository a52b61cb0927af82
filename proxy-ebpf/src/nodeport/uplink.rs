//! What the north-south path needs to know of an address family beyond
//! [`Family`]: its route-lookup parameters, its uplinks' addresses, its
//! flow hashes, and its working memory ([`Up`]).
use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    bindings::bpf_fib_lookup as FibParams, btf_maps::PerCpuArray, helpers::bpf_fib_lookup,
    macros::btf_map,
};
use proxy_common::{
    hash::{flow_hash, flow_hash6, source_hash, source_hash6},
    uplink_flags, Addr6Be,
};

use crate::{
    family::{Family, Work},
    maps::{SB_UPLINK6_V1, SB_UPLINK_V1},
    packet::{
        ctx::{LoadBytes, PacketCtx},
        set, FlowOf, Skip,
    },
};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
/// `bpf_fib_lookup` results that name the egress interface.
pub(crate) const FIB_SUCCESS: i64 = 0;
pub(crate) const FIB_NO_NEIGH: i64 = 7;
/// The packet (its `tot_len`) is larger than the route's MTU, given in
/// `mtu_result`.
pub(crate) const FIB_FRAG_NEEDED: i64 = 8;

/// Whether a `bpf_fib_lookup` result names the route's egress interface
/// (in `ifindex`): found, found without a neighbour entry, or found for a
/// packet larger than its MTU. A tc program's lookup without `tot_len`
/// measures the packet itself against the egress device after the route
/// is found, so a full-sized packet (a client's first fragment, say)
/// headed into an overlay 50 bytes narrower still names that overlay; a
/// tunnel then fragments the packet it carries.
#[inline(always)]
pub(crate) fn names_egress(rc: i64) -> bool {
    rc == FIB_SUCCESS || rc == FIB_NO_NEIGH || rc == FIB_FRAG_NEEDED
}

/// The uplink path's working memory: the pod path's, plus the route
/// lookup's parameters and the translation decided. A per-CPU array entry
/// of the family (`SB_UP4TMP_V1`, `SB_UP6TMP_V1`), as [`Work`].
#[repr(C)]
pub struct Up<A: Family> {
    pub s: Work<A>,
    pub fib: FibParams,
    /// The packet's new source and destination.
    pub to_saddr_be: A,
    pub to_daddr_be: A,
    /// The new source and destination ports, as in the packet.
    pub to_ports_be: [u16; 2],
    /// The flow's service (0 for a reply).
    pub service_id: u32,
    /// The uplink address a new flow to a remote backend is source-NATed to.
    pub snat_addr_be: A,
    /// Direct server return ([`super::dsr`]): the frontend the packet's
    /// option names (arriving), or the one it will carry (leaving). Port 0:
    /// none.
    pub dsr_addr_be: A,
    pub dsr_port_be: u16,
}

/// Not pinned: each loaded object has its own, used within one program run.
#[btf_map]
pub static SB_UP4TMP_V1: PerCpuArray<Up<u32>, 1> = PerCpuArray::new();
#[btf_map]
pub static SB_UP6TMP_V1: PerCpuArray<Up<Addr6Be>, 1> = PerCpuArray::new();

/// A route the XDP program looked up for packets leaving again to
/// `dst_be` (arriving on `ingress`): the egress interface, the MAC
/// addresses to write and the route's MTU, as of `stamp_ns`.
#[repr(C)]
pub struct RouteSlot<A> {
    pub dst_be: A,
    pub ingress: u32,
    pub ifindex: u32,
    pub dmac: [u8; 6],
    pub smac: [u8; 6],
    pub mtu: u16,
    pub _pad: [u8; 2],
    pub stamp_ns: u64,
}

/// Slots per CPU and family (a power of two): direct-mapped by destination.
const ROUTE_SLOTS: u32 = 256;
/// How long a remembered route is used: a changed route or neighbour is
/// followed within this time.
pub(crate) const ROUTE_TTL_NS: u64 = 50_000_000;

/// Not pinned: each loaded object has its own, a cache per CPU.
#[btf_map]
pub static SB_ROUTE4TMP_V1: PerCpuArray<RouteSlot<u32>, { ROUTE_SLOTS as usize }> =
    PerCpuArray::new();
#[btf_map]
pub static SB_ROUTE6TMP_V1: PerCpuArray<RouteSlot<Addr6Be>, { ROUTE_SLOTS as usize }> =
    PerCpuArray::new();

/// An address family on the uplink path (see the module's documentation).
pub(crate) trait UplinkFamily: Family {
    /// This CPU's uplink working memory of the family.
    fn up() -> Option<&'static mut Up<Self>>;
    /// Writes route-lookup parameters for a packet `src → dst` arriving
    /// on `ifindex` to `params`.
    fn fib_params(params: &mut FibParams, ifindex: u32, proto: u8, src: &Self, dst: &Self);
    /// The family's address of uplink `ifindex` (zero when it has none),
    /// or `None` when `ifindex` is no uplink.
    fn uplink_addr(ifindex: u32) -> Option<Self>;
    /// The flow's hash for Maglev (the same on every node).
    fn flow_hash(flow: &FlowOf<Self>) -> u32;
    /// The client's hash for source hashing.
    fn source_hash(addr: &Self) -> u32;
    /// Reads the frontend a direct-server-return option names into
    /// `u.dsr_*` (port 0 when there is none).
    fn read_dsr_option<C: PacketCtx + LoadBytes>(ctx: &C, u: &mut Up<Self>);
    /// Direct server return: the packet's length with the option, as the
    /// route's MTU is compared with ([`super::dsr::grown_len`],
    /// [`super::dsr::grown_len6`]).
    fn grown_len<C: PacketCtx>(ctx: &C) -> Result<u16, Skip>;
    /// This CPU's route slot for destination `dst` ([`cached_route`]).
    fn route_slot(dst: &Self) -> Option<&'static mut RouteSlot<Self>>;
}

/// The slot of a destination whose words fold to `folded`.
#[inline(always)]
fn slot_index(folded: u32) -> u32 {
    folded.wrapping_mul(0x9e37_79b1) >> 24 & (ROUTE_SLOTS - 1)
}

/// The route for a packet leaving again from `u.to_saddr_be` to
/// `u.to_daddr_be` (protocol `proto`, arrived on `ingress`), into `u.fib`
/// (egress interface, MAC addresses): the lookup's result code, and the
/// route's MTU. A route looked up on this CPU less than [`ROUTE_TTL_NS`]
/// ago for the same destination and ingress is used as it was, with no
/// lookup; else two lookups fill the slot: one asking for more than any
/// MTU (which answers with the route's MTU), then the route itself. The
/// cache is keyed by destination, not source: a node routing by source
/// (policy rules on the source address) gets the route of the first
/// source it saw for a destination, for up to that long.
#[inline(always)]
pub(crate) fn cached_route<A: UplinkFamily>(
    ctx: *mut c_void,
    ingress: u32,
    u: &mut Up<A>,
    proto: u8,
) -> (i64, u16) {
    let now = crate::ct::now_ns();
    let slot = A::route_slot(&u.to_daddr_be);
    if let Some(s) = slot.as_deref() {
        if s.ingress == ingress
            && s.dst_be.same(&u.to_daddr_be)
            && now.wrapping_sub(s.stamp_ns) < ROUTE_TTL_NS
        {
            u.fib.ifindex = s.ifindex;
            copy_mac(&mut u.fib.dmac, &s.dmac);
            copy_mac(&mut u.fib.smac, &s.smac);
            return (FIB_SUCCESS, s.mtu);
        }
    }
    A::fib_params(&mut u.fib, ingress, proto, &u.to_saddr_be, &u.to_daddr_be);
    u.fib.__bindgen_anon_1.tot_len = u16::MAX;
    let mtu = match fib_lookup(ctx, &mut u.fib) {
        // SAFETY: the lookup wrote the route's MTU over the length asked.
        FIB_FRAG_NEEDED => unsafe { u.fib.__bindgen_anon_1.mtu_result },
        _ => u16::MAX,
    };
    A::fib_params(&mut u.fib, ingress, proto, &u.to_saddr_be, &u.to_daddr_be);
    let rc = fib_lookup(ctx, &mut u.fib);
    if let (FIB_SUCCESS, Some(s)) = (rc, slot) {
        set(&mut s.dst_be, &u.to_daddr_be);
        s.ingress = ingress;
        s.ifindex = u.fib.ifindex;
        copy_mac(&mut s.dmac, &u.fib.dmac);
        copy_mac(&mut s.smac, &u.fib.smac);
        s.mtu = mtu;
        s.stamp_ns = now;
    }
    (rc, mtu)
}

/// Copies a MAC address. A plain assignment between these places becomes
/// a call to `memmove`, a byte loop on BPF; they never overlap, so the
/// copy is two loads and two stores.
#[inline(always)]
fn copy_mac(to: &mut [u8; 6], from: &[u8; 6]) {
    // SAFETY: two distinct 6-byte arrays (a route slot of a per-CPU map and
    // the uplink's working memory, another map): they do not overlap.
    unsafe { core::ptr::copy_nonoverlapping(from, to, 1) };
}

/// Whether uplink `ifindex` accepts direct-server-return options of
/// either family ([`uplink_flags::DSR_ACCEPT`] in its IPv4 entry, which
/// every uplink has).
#[inline(always)]
pub(crate) fn accepts_dsr(ifindex: u32) -> bool {
    // SAFETY: the value is copied out at once.
    unsafe { SB_UPLINK_V1.get(ifindex) }
        .is_some_and(|uplink| uplink.flags & uplink_flags::DSR_ACCEPT != 0)
}

/// Whether interface `ifindex` is an overlay device
/// ([`uplink_flags::OVERLAY`]): XDP cannot send into it.
#[inline(always)]
pub(crate) fn is_overlay(ifindex: u32) -> bool {
    // SAFETY: the value is copied out at once.
    unsafe { SB_UPLINK_V1.get(ifindex) }
        .is_some_and(|uplink| uplink.flags & uplink_flags::OVERLAY != 0)
}

impl UplinkFamily for u32 {
    #[inline(always)]
    fn up() -> Option<&'static mut Up<u32>> {
        let ptr = SB_UP4TMP_V1.get_ptr_mut(0)?;
        // SAFETY: this CPU's slot of a per-CPU array, valid for the program
        // run; no other program of ours runs on this CPU meanwhile.
        Some(unsafe { &mut *ptr })
    }
    #[inline(always)]
    fn fib_params(params: &mut FibParams, ifindex: u32, proto: u8, src: &u32, dst: &u32) {
        // SAFETY: `bpf_fib_lookup` is plain data; all-zero is a valid value.
        *params = unsafe { core::mem::zeroed() };
        params.family = AF_INET;
        params.l4_protocol = proto;
        params.ifindex = ifindex;
        params.__bindgen_anon_3.ipv4_src = *src;
        params.__bindgen_anon_4.ipv4_dst = *dst;
    }
    #[inline(always)]
    fn uplink_addr(ifindex: u32) -> Option<u32> {
        // SAFETY: the value is copied out at once.
        unsafe { SB_UPLINK_V1.get(ifindex) }.map(|uplink| uplink.addr_be)
    }
    #[inline(always)]
    fn flow_hash(flow: &FlowOf<u32>) -> u32 {
        flow_hash(
            flow.saddr_be,
            flow.daddr_be,
            flow.sport_be,
            flow.dport_be,
            flow.proto,
        )
    }
    #[inline(always)]
    fn source_hash(addr: &u32) -> u32 {
        source_hash(*addr)
    }
    #[inline(always)]
    fn read_dsr_option<C: PacketCtx + LoadBytes>(ctx: &C, u: &mut Up<u32>) {
        super::dsr::read_option(ctx, u);
    }
    #[inline(always)]
    fn grown_len<C: PacketCtx>(ctx: &C) -> Result<u16, Skip> {
        super::dsr::grown_len(ctx)
    }
    #[inline(always)]
    fn route_slot(dst: &u32) -> Option<&'static mut RouteSlot<u32>> {
        let ptr = SB_ROUTE4TMP_V1.get_ptr_mut(slot_index(*dst))?;
        // SAFETY: this CPU's slot of a per-CPU array, valid for the program
        // run; no other program of ours runs on this CPU meanwhile.
        Some(unsafe { &mut *ptr })
    }
}

impl UplinkFamily for Addr6Be {
    #[inline(always)]
    fn up() -> Option<&'static mut Up<Addr6Be>> {
        let ptr = SB_UP6TMP_V1.get_ptr_mut(0)?;
        // SAFETY: as for IPv4.
        Some(unsafe { &mut *ptr })
    }
    #[inline(always)]
    fn fib_params(params: &mut FibParams, ifindex: u32, proto: u8, src: &Addr6Be, dst: &Addr6Be) {
        // SAFETY: `bpf_fib_lookup` is plain data; all-zero is a valid value.
        *params = unsafe { core::mem::zeroed() };
        params.family = AF_INET6;
        params.l4_protocol = proto;
        params.ifindex = ifindex;
        params.__bindgen_anon_3.ipv6_src = *src;
        params.__bindgen_anon_4.ipv6_dst = *dst;
    }
    #[inline(always)]
    fn uplink_addr(ifindex: u32) -> Option<Addr6Be> {
        // SAFETY: the value is copied out at once.
        unsafe { SB_UPLINK6_V1.get(ifindex) }.map(|uplink| uplink.addr_be)
    }
    #[inline(always)]
    fn flow_hash(flow: &FlowOf<Addr6Be>) -> u32 {
        flow_hash6(
            &flow.saddr_be,
            &flow.daddr_be,
            flow.sport_be,
            flow.dport_be,
            flow.proto,
        )
    }
    #[inline(always)]
    fn source_hash(addr: &Addr6Be) -> u32 {
        source_hash6(addr)
    }
    #[inline(always)]
    fn read_dsr_option<C: PacketCtx + LoadBytes>(ctx: &C, u: &mut Up<Addr6Be>) {
        super::dsr::read_option6(ctx, u);
    }
    #[inline(always)]
    fn grown_len<C: PacketCtx>(ctx: &C) -> Result<u16, Skip> {
        super::dsr::grown_len6(ctx)
    }
    #[inline(always)]
    fn route_slot(dst: &Addr6Be) -> Option<&'static mut RouteSlot<Addr6Be>> {
        let folded = dst[0] ^ dst[1] ^ dst[2] ^ dst[3];
        let ptr = SB_ROUTE6TMP_V1.get_ptr_mut(slot_index(folded))?;
        // SAFETY: as for IPv4.
        Some(unsafe { &mut *ptr })
    }
}

/// The route lookup of `params` (filled by [`UplinkFamily::fib_params`])
/// from this program's context `ctx`: the kernel's result code.
#[inline(always)]
pub(crate) fn fib_lookup(ctx: *mut c_void, params: &mut FibParams) -> i64 {
    // SAFETY: `params` is a valid, initialised `bpf_fib_lookup` of the size
    // passed; `ctx` is this program's own context.
    unsafe { bpf_fib_lookup(ctx, params, size_of::<FibParams>() as i32, 0) }
}
