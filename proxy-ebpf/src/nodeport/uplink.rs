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
        FlowOf,
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
}

/// The route lookup of `params` (filled by [`UplinkFamily::fib_params`])
/// from this program's context `ctx`: the kernel's result code.
#[inline(always)]
pub(crate) fn fib_lookup(ctx: *mut c_void, params: &mut FibParams) -> i64 {
    // SAFETY: `params` is a valid, initialised `bpf_fib_lookup` of the size
    // passed; `ctx` is this program's own context.
    unsafe { bpf_fib_lookup(ctx, params, size_of::<FibParams>() as i32, 0) }
}
