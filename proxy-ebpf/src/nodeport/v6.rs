//! North-south for IPv6: what happens to an IPv6 packet that arrives on an
//! uplink from outside the node, the rules of [`crate::nodeport`] over the
//! IPv6 maps. `sb_xdp_uplink` and `sb_from_uplink` dispatch here on
//! ethertype 0x86DD, once, before their IPv4 parser, by a tail call into
//! `sb_xdp_uplink6` ([`crate::programs::uplink_xdp6`]) and `sb_from_uplink6` ([`crate::programs::uplink_tc6`]):
//! the IPv4 programs' frames stay what they were.
//!
//! - To an IPv6 frontend (NodePort on a node address, LoadBalancer IP,
//!   external IP in `SB_FE6_V1`): a backend on this node gets DNAT only,
//!   tracked in `SB_CT6_V1` as the pod path tracks it, so the local backend's
//!   reply is reversed by `sb_to_pod6` on the uplink's egress; a backend on
//!   another node gets DNAT plus SNAT to that uplink's IPv6 address
//!   (`SB_UPLINK6_V1`) and a port of [`snat`], and goes out again.
//!   `externalTrafficPolicy: Local` uses the [`scope::EXTERNAL`] set and never
//!   SNAT. An uplink without an IPv6 address drops flows to remote IPv6
//!   backends (`no_route`).
//! - A reply to a source-NATed flow gets both translations reversed and goes
//!   back out.
//! - An ICMPv6 error about a source-NATed flow is translated back and sent
//!   on to the client (tc; XDP hands ICMPv6 to tc untouched).
//! - A new flow to a frontend whose algorithm is Maglev or source hash picks
//!   from the service's Maglev table (`SB_MAGLEV_V1`, shared with IPv4) with
//!   [`flow_hash6`] / [`source_hash6`], so every node picks the same backend
//!   for the same flow (client); other frontends pick at random, with
//!   session affinity. Tracked flows keep their backend.
//! - To a frontend without any endpoint: tc answers as the pod path does
//!   ([`crate::reject::v6`]: a TCP RST, or an ICMPv6 port unreachable for UDP)
//!   out of the uplink; XDP hands such packets to tc untouched.
//!   `externalTrafficPolicy: Local` without a local endpoint drops.
//! - Other ICMPv6 (neighbour discovery included) and fragments pass untouched.
//!
//! Keys, entries and the route-lookup parameters live in per-CPU scratch
//! memory ([`Up6`]), as on the IPv6 pod path.
use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, BPF_NOEXIST},
    btf_maps::PerCpuArray,
    helpers::{bpf_fib_lookup, bpf_get_prandom_u32},
    macros::btf_map,
};
use proxy_common::{
    ct_dir, ct_flags, frontend_flags,
    hash::{flow_hash6, source_hash6},
    scope, snat, stat, Addr6Be, CtKey6, FrontendKey6, FrontendSlot,
};

use crate::{
    ct::track::{track, tracked, Source},
    ct::{self, NotTracked},
    family::Scratch6,
    lb::{choose_backend, frontend_key, lookup_frontend, maglev_backend},
    maps::SB_AFFINITY6_V1,
    maps::{count, count_denied, count_service, source_allowed6, SB_CT6_V1, SB_UPLINK6_V1},
    nodeport::NotTranslated,
    packet::v6::eq6,
    packet::Skip,
};

const AF_INET6: u8 = 10;
/// `bpf_fib_lookup` results that name the egress interface.
pub(crate) const FIB_SUCCESS: i64 = 0;
pub(crate) const FIB_NO_NEIGH: i64 = 7;
/// Offset of the hop limit from the start of the frame.
pub const IP6_HOP_LIMIT_OFF: usize = crate::packet::ETH_HLEN + 7;

/// What [`classify6`] decided (the addresses and ports are in [`Up6`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Out6 {
    /// To a backend on this node: only the destination changes; the kernel
    /// delivers the packet.
    Local,
    /// To a backend on another node: both sides change; the packet goes out
    /// again.
    Remote,
    /// The reply of a `Remote` flow: both sides change back; the packet goes
    /// out again.
    Reply,
}

/// The IPv6 uplink path's working memory: the pod path's, plus the route
/// lookup's parameters and the translation decided.
#[repr(C)]
pub struct Up6 {
    pub s: Scratch6,
    pub fib: FibParams,
    /// The packet's new source and destination.
    pub to_saddr_be: Addr6Be,
    pub to_daddr_be: Addr6Be,
    /// The new source and destination ports, as in the packet.
    pub to_ports_be: [u16; 2],
    pub service_id: u32,
    /// The uplink address a new flow to a remote backend is source-NATed to.
    pub snat_addr_be: Addr6Be,
}

/// Not pinned: each loaded object has its own, used within one program run.
#[btf_map]
pub static SB_UP6TMP_V1: PerCpuArray<Up6, 1> = PerCpuArray::new();

/// This CPU's scratch memory for the IPv6 uplink path.
#[inline(always)]
pub fn scratch_up6() -> Option<&'static mut Up6> {
    let ptr = SB_UP6TMP_V1.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of a per-CPU array, valid for the program run;
    // no other program of ours runs on this CPU meanwhile.
    Some(unsafe { &mut *ptr })
}

/// Decides what happens to the IPv6 TCP/UDP packet in `u.s.flow` that
/// arrived on uplink `ingress`; the new addresses and ports go to `u`.
/// `ctx` is the program's context, for the route lookup.
#[inline(always)]
pub fn classify6(ctx: *mut c_void, ingress: u32, u: &mut Up6) -> Result<Out6, NotTranslated> {
    if snat_reply6(u)? {
        return Ok(Out6::Reply);
    }
    let flow = &u.s.flow;
    u.s.fe = frontend_key(flow.daddr_be, flow.dport_be, flow.proto);
    let Some(svc) = lookup_frontend(&u.s.fe) else {
        return Err(NotTranslated::Pass(Skip::NotOurs));
    };
    if !source_allowed6(&svc, &u.s.flow.saddr_be) {
        count_denied(svc.service_id);
        return Err(NotTranslated::Denied);
    }
    let cluster = svc;
    let (svc, local_only) = backend_set6(u, svc);
    if svc.backend_count == 0 {
        // As IPv4: rejected only when the Service has no endpoint at all;
        // `externalTrafficPolicy: Local` without a local one drops. The
        // per-service counter of a rejected packet is counted where it is
        // answered (tc; XDP hands it on), so it counts once.
        if cluster.backend_count == 0 && crate::reject::rejects(&cluster) {
            u.service_id = cluster.service_id;
            return Err(NotTranslated::Reject);
        }
        count_service(svc.service_id, |s| s.drops_no_backend += 1);
        return Err(NotTranslated::Drop(stat::DROP_NO_BACKEND));
    }
    u.service_id = svc.service_id;
    u.s.flow.ct_key_into(ct_dir::FORWARD, &mut u.s.key);
    if tracked(&mut u.s, svc.service_id) {
        return from_tracked6(u);
    }
    let Some(id) = pick_backend6(u, &svc) else {
        return Err(NotTranslated::Drop(stat::DROP_INCONSISTENT));
    };
    if !local_only {
        match remote_uplink6(ctx, ingress, u) {
            Route::Local => {}
            Route::Remote => return new_remote_flow6(u, id, svc.service_id),
            Route::NoAddress => return Err(NotTranslated::Drop(stat::NO_ROUTE)),
        }
    }
    if track(&mut u.s, id, svc.service_id, Source::Client).is_err() {
        // The table is full: the client retransmits.
        return Err(NotTranslated::Drop(stat::CT_FULL));
    }
    set_local(u);
    Ok(Out6::Local)
}

/// A new flow's backend, written to `u.s.backend`, as IPv4's
/// `nodeport::pick_backend`: by the frontend's hashing algorithm (Maglev over
/// the 5-tuple with [`flow_hash6`], or over the client address with
/// [`source_hash6`]) when it has one and its table is there, else at random
/// (with session affinity). Returns the backend id.
#[inline(always)]
fn pick_backend6(u: &mut Up6, svc: &FrontendSlot) -> Option<u32> {
    let flow = &u.s.flow;
    let hash = match svc.flags & frontend_flags::ALGO_MASK {
        frontend_flags::ALGO_MAGLEV => Some(flow_hash6(
            &flow.saddr_be,
            &flow.daddr_be,
            flow.sport_be,
            flow.dport_be,
            flow.proto,
        )),
        frontend_flags::ALGO_SOURCE_HASH => Some(source_hash6(&flow.saddr_be)),
        _ => None,
    };
    if let Some(hash) = hash {
        if let Some((id, backend)) = maglev_backend::<FrontendKey6>(svc.service_id, hash) {
            u.s.backend = backend;
            return Some(id);
        }
    }
    u.s.aff.client_addr_be = u.s.flow.saddr_be;
    u.s.aff.service_id = svc.service_id;
    let (id, backend) = choose_backend(u.s.fe, svc, &SB_AFFINITY6_V1, &u.s.aff)?;
    u.s.backend = backend;
    Some(id)
}

/// The translation of a flow to a local backend (in `u.s.backend`).
#[inline(always)]
fn set_local(u: &mut Up6) {
    u.to_saddr_be = u.s.flow.saddr_be;
    u.to_daddr_be = u.s.backend.addr_be;
    u.to_ports_be = [u.s.flow.sport_be, u.s.backend.port_be];
}

/// The backend set traffic from outside gets: the external (local-only) one
/// under `externalTrafficPolicy: Local` (then `u.s.fe` becomes its key),
/// else the frontend's own. A local-only set whose entry is missing
/// (mid-update) counts as empty.
#[inline(always)]
fn backend_set6(u: &mut Up6, svc: FrontendSlot) -> (FrontendSlot, bool) {
    if !frontend_flags::has_external_set(svc.flags) {
        return (svc, false);
    }
    u.s.fe.scope = scope::EXTERNAL;
    let ext = lookup_frontend(&u.s.fe).unwrap_or(FrontendSlot {
        backend_count: 0,
        ..svc
    });
    (ext, true)
}

/// A tracked flow (forward entry under `u.s.key`, backend in `u.s.backend`)
/// keeps its translation, with its source NAT if it has one.
#[inline(always)]
fn from_tracked6(u: &mut Up6) -> Result<Out6, NotTranslated> {
    let e = &u.s.entry;
    u.s.backend.addr_be = e.nat_addr_be;
    u.s.backend.port_be = e.nat_port_be;
    if e.flags & ct_flags::SNAT == 0 {
        set_local(u);
        return Ok(Out6::Local);
    }
    u.to_saddr_be = e.snat_addr_be;
    u.to_daddr_be = e.nat_addr_be;
    u.to_ports_be = [e.snat_port_be, e.nat_port_be];
    Ok(Out6::Remote)
}

/// A reply to a flow this node source-NATed: only packets to a port of the
/// SNAT range are looked up. `Ok(true)`: `u` holds the reversed addresses.
#[inline(always)]
fn snat_reply6(u: &mut Up6) -> Result<bool, NotTranslated> {
    if !snat::is_snat_port(u16::from_be(u.s.flow.dport_be)) {
        return Ok(false);
    }
    u.s.flow.ct_key_into(ct_dir::REPLY, &mut u.s.key2);
    let Some(entry_ptr) = SB_CT6_V1.get_ptr_mut(u.s.key2) else {
        return Ok(false);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; the
    // fields are copied out.
    let (flags, nat_port_be, snat_port_be) = unsafe {
        u.to_saddr_be = (*entry_ptr).nat_addr_be;
        u.to_daddr_be = (*entry_ptr).snat_addr_be;
        (
            (*entry_ptr).flags,
            (*entry_ptr).nat_port_be,
            (*entry_ptr).snat_port_be,
        )
    };
    if flags & ct_flags::SNAT == 0 {
        return Ok(false);
    }
    let flow = &u.s.flow;
    if flow.accepts_connection() && flags & ct_flags::CLOSING != 0 {
        // The flow has closed; nothing of ours answers on this port now.
        if SB_CT6_V1.remove(u.s.key2).is_ok() {
            count(stat::CT_STALE);
        }
        return Err(NotTranslated::Pass(Skip::NotOurs));
    }
    crate::ct::note(entry_ptr, flow, true, || {
        let k = &mut u.s.key;
        k.saddr_be = u.to_daddr_be;
        k.daddr_be = u.to_saddr_be;
        k.sport_be = snat_port_be;
        k.dport_be = nat_port_be;
        k.proto = flow.proto;
        k.dir = ct_dir::FORWARD;
        k._pad = [0; 2];
        SB_CT6_V1.get_ptr_mut(u.s.key)
    });
    u.to_ports_be = [nat_port_be, snat_port_be];
    u.service_id = 0;
    Ok(true)
}

/// Where the route to a new flow's backend leaves.
enum Route {
    /// Not through an uplink: the backend is on this node.
    Local,
    /// Through an uplink with an IPv6 address (now in `u.snat_addr_be`).
    Remote,
    /// Through an uplink without an IPv6 address.
    NoAddress,
}

/// Whether the route to the backend in `u.s.backend` leaves through an
/// uplink (the backend is on another node).
#[inline(always)]
fn remote_uplink6(ctx: *mut c_void, ingress: u32, u: &mut Up6) -> Route {
    let (src, dst) = (u.s.flow.saddr_be, u.s.backend.addr_be);
    fib_params6(&mut u.fib, ingress, u.s.flow.proto, &src, &dst);
    // SAFETY: `u.fib` is a valid, initialised `bpf_fib_lookup` of the size
    // passed; `ctx` is this program's own context.
    let rc = unsafe { bpf_fib_lookup(ctx, &mut u.fib, size_of::<FibParams>() as i32, 0) };
    if rc != FIB_SUCCESS && rc != FIB_NO_NEIGH {
        return Route::Local;
    }
    // SAFETY: the value is copied out at once.
    match unsafe { SB_UPLINK6_V1.get(u.fib.ifindex) } {
        None => Route::Local,
        Some(uplink) if eq6(&uplink.addr_be, &[0; 4]) => Route::NoAddress,
        Some(uplink) => {
            u.snat_addr_be = uplink.addr_be;
            Route::Remote
        }
    }
}

/// Route-lookup parameters for an IPv6 packet arriving on `ifindex`.
#[inline(always)]
pub fn fib_params6(
    params: &mut FibParams,
    ifindex: u32,
    proto: u8,
    saddr_be: &Addr6Be,
    daddr_be: &Addr6Be,
) {
    // SAFETY: `bpf_fib_lookup` is plain data; all-zero is a valid value.
    *params = unsafe { core::mem::zeroed() };
    params.family = AF_INET6;
    params.l4_protocol = proto;
    params.ifindex = ifindex;
    params.__bindgen_anon_3.ipv6_src = *saddr_be;
    params.__bindgen_anon_4.ipv6_dst = *daddr_be;
}

/// As [`crate::nodeport`]'s `claim_port`, for IPv6: takes the SNAT port the
/// key in `u.s.key2` names for the new flow whose reply entry is `u.s.entry`.
#[inline(always)]
fn claim_port6(u: &Up6, now: u64) -> Result<bool, NotTracked> {
    match ct::insert(&u.s.key2, &u.s.entry, u64::from(BPF_NOEXIST)) {
        Ok(()) => return Ok(true),
        Err(NotTracked::Full) => return Err(NotTracked::Full),
        Err(NotTracked::Failed) => {}
    }
    let Some(held) = SB_CT6_V1.get_ptr(u.s.key2) else {
        return Ok(false);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; read once.
    let (flags, closed_ns) = unsafe { ((*held).flags, (*held).created_ns) };
    if flags & ct_flags::CLOSING == 0 || now.wrapping_sub(closed_ns) < snat::REUSE_AFTER_NS {
        return Ok(false);
    }
    if SB_CT6_V1.insert(u.s.key2, u.s.entry, 0).is_err() {
        return Ok(false);
    }
    let Some(now_held) = SB_CT6_V1.get_ptr(u.s.key2) else {
        return Ok(false);
    };
    // SAFETY: as above; read once.
    Ok(unsafe {
        eq6(&(*now_held).snat_addr_be, &u.s.entry.snat_addr_be)
            && (*now_held).snat_port_be == u.s.entry.snat_port_be
            && eq6(&(*now_held).nat_addr_be, &u.s.entry.nat_addr_be)
    })
}

/// Records a new flow to a backend on another node (in `u.s.backend`,
/// forward key in `u.s.key`) with a free port of the SNAT range, as IPv4
/// does: the reply entry first, where no flow holds that port yet.
#[inline(always)]
fn new_remote_flow6(u: &mut Up6, backend_id: u32, service_id: u32) -> Result<Out6, NotTranslated> {
    // SAFETY: a helper without preconditions.
    let start = unsafe { bpf_get_prandom_u32() };
    let created_ns = ct::now_ns();
    for attempt in 0..snat::ATTEMPTS {
        let step = start.wrapping_add(attempt.wrapping_mul(snat::STRIDE));
        let port_be = snat::port(step % snat::PORTS).to_be();
        let e = &mut u.s.entry;
        e.backend_id = backend_id;
        e.service_id = service_id;
        e.nat_addr_be = u.s.flow.daddr_be;
        e.nat_port_be = u.s.flow.dport_be;
        e.flags = ct_flags::SNAT | ct_flags::HANDSHAKE;
        e.state = 0;
        e.snat_addr_be = u.s.flow.saddr_be;
        e.snat_port_be = u.s.flow.sport_be;
        e._pad2 = [0; 2];
        e.created_ns = created_ns;
        e.last_seen_ns = created_ns;
        let k = &mut u.s.key2;
        k.saddr_be = u.s.backend.addr_be;
        k.daddr_be = u.snat_addr_be;
        k.sport_be = u.s.backend.port_be;
        k.dport_be = port_be;
        k.proto = u.s.flow.proto;
        k.dir = ct_dir::REPLY;
        k._pad = [0; 2];
        match claim_port6(u, created_ns) {
            Ok(true) => {}
            Ok(false) => continue,
            // Full: the next port is tried once a flow that is not
            // established made room.
            Err(_) if ct::make_room::<CtKey6>() => continue,
            // The client retransmits once the agent made room.
            Err(_) => return Err(NotTranslated::Drop(stat::CT_FULL)),
        }
        let e = &mut u.s.entry;
        e.nat_addr_be = u.s.backend.addr_be;
        e.nat_port_be = u.s.backend.port_be;
        e.snat_addr_be = u.snat_addr_be;
        e.snat_port_be = port_be;
        match ct::with_room::<CtKey6>(|| ct::insert(&u.s.key, &u.s.entry, 0)) {
            Ok(()) => {
                count_service(service_id, |s| s.new_flows += 1);
                ct::remember(&u.s.key, &u.s.key2);
            }
            Err(NotTracked::Failed) => count(stat::CT_INSERT_FAILED),
            Err(NotTracked::Full) => {
                // Give the port back: no half-tracked flow.
                let _ = SB_CT6_V1.remove(u.s.key2);
                return Err(NotTranslated::Drop(stat::CT_FULL));
            }
        }
        u.to_saddr_be = u.snat_addr_be;
        u.to_daddr_be = u.s.backend.addr_be;
        u.to_ports_be = [port_be, u.s.backend.port_be];
        return Ok(Out6::Remote);
    }
    Err(NotTranslated::Drop(stat::SNAT_EXHAUSTED))
}
