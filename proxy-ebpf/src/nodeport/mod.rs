//! North-south: what happens to a packet that arrives on an uplink from
//! outside the node, for both families ([`UplinkFamily`]). Shared by the XDP
//! programs and their tc twins (`--xdp-mode off`); [`classify`] decides
//! ([`Out`]) and writes the new addresses and ports to the family's working
//! memory ([`Up`]), and each program applies them with its own tools.
//!
//! - To a frontend (NodePort on a node address, LoadBalancer IP, external
//!   IP; a ClusterIP routed to the node works the same way):
//!   - a backend on this node gets DNAT only, and the kernel delivers the
//!     packet; the pod's reply is reversed by the tc program on the uplink's
//!     egress (one connection-tracking lookup, as for pod clients);
//!   - a backend on another node (the route to it leaves through an uplink,
//!     or through an overlay device such as flannel's VXLAN: the agent puts
//!     both in the uplink maps) gets DNAT plus SNAT to that interface's
//!     address and a port of
//!     [`snat`], so its reply comes back here; or, for a frontend that
//!     returns flows directly (`--nodeport-mode dsr`), DNAT only and the
//!     frontend carried in an option ([`dsr`]), its reply leaving the
//!     backend's node straight to the client;
//! - A packet another node returned directly to a backend here (the
//!   option on a packet to an address that is no frontend) is tracked under
//!   its frontend and delivered unchanged ([`dsr::arrived`]);
//!   - under `externalTrafficPolicy: Local` only this node's endpoints are
//!     used (the [`scope::EXTERNAL`] slots), never with SNAT: the pod sees the
//!     client's address. Without local endpoints the packet is dropped, as
//!     kube-proxy does.
//! - A reply to a source-NATed flow (destination port in [`snat`]'s range,
//!   tracked) gets both translations reversed and goes back out.
//! - A new flow to a frontend whose algorithm is Maglev or source hash picks
//!   from the service's Maglev table (`SB_MAGLEV_V1`, both families) by the
//!   family's flow or client hash, so every node picks the same backend for
//!   the same flow (client); other frontends pick at random, with session
//!   affinity. Tracked flows keep their backend.
//! - To a frontend without any endpoint: the program answers as the pod
//!   path does ([`crate::reject`]); `externalTrafficPolicy: Local` without a
//!   local endpoint drops. An uplink without an address of the flow's
//!   family drops flows to remote backends it would source-NAT
//!   (`no_route`).
//!
//! The IPv6 programs are their own (`sb_xdp_uplink6`, `sb_from_uplink6`),
//! tail-called on ethertype 0x86DD before the IPv4 parser, so the IPv4
//! programs' frames stay what they were.

pub(crate) mod dsr;
mod uplink;

pub(crate) use uplink::{cached_route, fib_lookup, is_overlay, names_egress, Up, UplinkFamily};

use core::ffi::c_void;

use aya_ebpf::bindings::BPF_NOEXIST;
use aya_ebpf::helpers::bpf_get_prandom_u32;
use proxy_common::{ct_dir, ct_flags, frontend_flags, scope, snat, stat, FrontendSlot};

use crate::{
    ct::track::{continued_entry, forward_entry, stale_reply, track, tracked, Source},
    ct::{self, NotTracked},
    family::set_backend,
    lb::{
        choose_backend, counts_flows, frontend_key, lookup_frontend, maglev_backend, sched, SlotKey,
    },
    maps::{count, count_denied, count_service},
    packet::{set, set_ct_tail, Skip},
    trace,
};

/// What [`classify`] decided (the addresses and ports are in [`Up`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Out {
    /// To a backend on this node: only the destination changes; the kernel
    /// delivers the packet.
    Local,
    /// To a backend on another node: both sides change; the packet goes out
    /// again.
    Remote,
    /// The reply of a `Remote` flow: both sides change back; the packet goes
    /// out again.
    Reply,
    /// To a backend on another node that answers the client itself
    /// ([`dsr`]): only the destination changes, the frontend (in `u.dsr_*`)
    /// goes with the packet in an option, and the packet goes out again.
    Direct,
    /// Balanced to a backend here by another node ([`dsr`]): tracked, and
    /// delivered unchanged.
    Arrived,
}

/// Why a packet from outside is not translated.
pub enum NotTranslated {
    /// Not ours (or malformed, or a fragment): it continues untouched.
    Pass(Skip),
    /// Ours, but it cannot be delivered: drop it, counting this counter.
    Drop(u32),
    /// To a frontend without any endpoint (its service id in
    /// `u.service_id`): answer as kube-proxy rejects ([`crate::reject`]);
    /// the program that answers counts it for the service.
    Reject,
    /// Its source is outside the frontend's `loadBalancerSourceRanges`:
    /// drop it silently, as kube-proxy's firewall does (already counted per
    /// service, in `SB_SVC_DENIED_V1`).
    Denied,
}

/// Decides what happens to the TCP/UDP packet in `u.s.flow` that arrived
/// on uplink `ingress`; the new addresses and ports go to `u`. `ctx` is the
/// program's context, for the route lookup; `LAYER` the program's
/// (`trace::layer`), which the trace's events of new flows name.
#[inline(always)]
pub fn classify<A: UplinkFamily, const LAYER: u8>(
    ctx: *mut c_void,
    ingress: u32,
    u: &mut Up<A>,
) -> Result<Out, NotTranslated> {
    let flow = &u.s.flow;
    if u.dsr_port_be != 0
        && !A::maybe_frontend_port(&flow.daddr_be, flow.dport_be, flow.proto)
        && uplink::accepts_dsr(ingress)
    {
        return dsr::arrived(u);
    }
    if snat_reply::<A, LAYER>(u)? {
        return Ok(Out::Reply);
    }
    let flow = &u.s.flow;
    // Everything else of ours goes to a frontend: two bits of the frontend
    // bitmap (the address's, and the address, port and protocol's) tell
    // the rest apart without a hash lookup: forwarded traffic, and the
    // node's own traffic to its addresses, which its NodePorts share.
    if !A::maybe_frontend_port(&flow.daddr_be, flow.dport_be, flow.proto) {
        return Err(NotTranslated::Pass(Skip::NotOurs));
    }
    // A packet of an existing flow: one connection-tracking lookup, no
    // frontend (as on the pod path: the entry is trusted as conntrack is
    // under kube-proxy; the agent removes a deleted Service's entries).
    u.s.flow.ct_key_into(ct_dir::FORWARD, &mut u.s.key);
    if let Some(service_id) = continued_entry(&mut u.s) {
        u.service_id = service_id;
        return Ok(from_tracked(u));
    }
    let flow = &u.s.flow;
    u.s.fe = frontend_key(flow.daddr_be, flow.dport_be, flow.proto);
    let Some(svc) = lookup_frontend(&u.s.fe) else {
        return Err(NotTranslated::Pass(Skip::NotOurs));
    };
    // Named by what follows: drops, rejects, new flows.
    u.service_id = svc.service_id;
    if !A::source_allowed(&svc, &u.s.flow.saddr_be) {
        count_denied(svc.service_id);
        return Err(NotTranslated::Denied);
    }
    let cluster = svc;
    let (svc, local_only) = backend_set(u, svc);
    if svc.backend_count == 0 {
        // kube-proxy rejects only when the Service has no endpoint at all;
        // `externalTrafficPolicy: Local` without a local one drops.
        if cluster.backend_count == 0 && crate::reject::rejects(&cluster) {
            u.service_id = cluster.service_id;
            return Err(NotTranslated::Reject);
        }
        count_service(svc.service_id, |s| s.drops_no_backend += 1);
        return Err(NotTranslated::Drop(stat::DROP_NO_BACKEND));
    }
    u.service_id = svc.service_id;
    if tracked(&mut u.s, svc.service_id) {
        return Ok(from_tracked(u));
    }
    let Some(id) = pick_backend(u, &svc) else {
        return Err(NotTranslated::Drop(stat::DROP_INCONSISTENT));
    };
    if !local_only {
        match remote_uplink(ctx, ingress, u) {
            Route::Local => {}
            // Returned directly, the flow needs no address of the uplink.
            Route::Remote | Route::NoAddress if svc.flags & frontend_flags::DIRECT_RETURN != 0 => {
                let out = dsr::new_direct_flow(u, id, svc.service_id, counts_flows(&svc));
                return out.inspect(|_| trace::new_flow(LAYER, &u.s.flow, &u.s.backend, &svc));
            }
            Route::Remote => {
                let out = new_remote_flow(u, id, svc.service_id, counts_flows(&svc));
                return out.inspect(|_| trace::new_flow(LAYER, &u.s.flow, &u.s.backend, &svc));
            }
            Route::NoAddress => return Err(NotTranslated::Drop(stat::NO_ROUTE)),
        }
    }
    if track(
        &mut u.s,
        id,
        svc.service_id,
        Source::Client,
        counts_flows(&svc),
    )
    .is_err()
    {
        // The table is full: the client retransmits.
        return Err(NotTranslated::Drop(stat::CT_FULL));
    }
    set_local(u);
    trace::new_flow(LAYER, &u.s.flow, &u.s.backend, &svc);
    Ok(Out::Local)
}

/// A new flow's backend, written to `u.s.backend`: by the frontend's
/// hashing algorithm (Maglev over the flow's hash, or over the client's)
/// when it has one and its table is there, else at random (with session
/// affinity). Returns the backend id.
#[inline(always)]
fn pick_backend<A: UplinkFamily>(u: &mut Up<A>, svc: &FrontendSlot) -> Option<u32> {
    let flow = &u.s.flow;
    let hash = match svc.flags & frontend_flags::ALGO_MASK {
        frontend_flags::ALGO_MAGLEV => Some(A::flow_hash(flow)),
        frontend_flags::ALGO_SOURCE_HASH => Some(A::source_hash(&flow.saddr_be)),
        _ => None,
    };
    if let Some(hash) = hash {
        if let Some((id, backend)) = maglev_backend::<A::Key>(svc.service_id, hash) {
            set_backend(&mut u.s.backend, &backend);
            return Some(id);
        }
    }
    set(&mut u.s.aff.client_addr_be, &u.s.flow.saddr_be);
    u.s.aff.service_id = svc.service_id;
    let (id, backend) = choose_backend(u.s.fe, svc, A::affinity(), &u.s.aff)?;
    set_backend(&mut u.s.backend, &backend);
    Some(id)
}

/// The translation of a flow to a local backend (in `u.s.backend`).
#[inline(always)]
pub(super) fn set_local<A: UplinkFamily>(u: &mut Up<A>) {
    set(&mut u.to_saddr_be, &u.s.flow.saddr_be);
    set(&mut u.to_daddr_be, &u.s.backend.addr_be);
    u.to_ports_be = [u.s.flow.sport_be, u.s.backend.port_be];
}

/// The backend set traffic from outside gets: the external (local-only) one
/// under `externalTrafficPolicy: Local` (then `u.s.fe` becomes its key),
/// else the frontend's own. Returns its slot-0 entry and whether it is
/// local-only. A local-only set whose entry is missing (mid-update) counts
/// as empty.
#[inline(always)]
fn backend_set<A: UplinkFamily>(u: &mut Up<A>, svc: FrontendSlot) -> (FrontendSlot, bool) {
    if !frontend_flags::has_external_set(svc.flags) {
        return (svc, false);
    }
    u.s.fe.set_scope(scope::EXTERNAL);
    let ext = lookup_frontend(&u.s.fe).unwrap_or(FrontendSlot {
        backend_count: 0,
        ..svc
    });
    (ext, true)
}

/// A tracked flow (its forward entry in `u.s.entry`) keeps its translation.
#[inline(always)]
fn from_tracked<A: UplinkFamily>(u: &mut Up<A>) -> Out {
    let e = &u.s.entry;
    set(&mut u.s.backend.addr_be, &e.nat_addr_be);
    u.s.backend.port_be = e.nat_port_be;
    if dsr::is_direct(u) {
        return dsr::set_direct(u);
    }
    if e.flags & ct_flags::SNAT == 0 {
        set_local(u);
        return Out::Local;
    }
    set(&mut u.to_saddr_be, &e.snat_addr_be);
    set(&mut u.to_daddr_be, &e.nat_addr_be);
    u.to_ports_be = [e.snat_port_be, e.nat_port_be];
    Out::Remote
}

/// A reply to a flow this node source-NATed: only packets to a port of the
/// SNAT range are looked up. `Ok(true)`: `u` holds the reversed addresses.
#[inline(always)]
fn snat_reply<A: UplinkFamily, const LAYER: u8>(u: &mut Up<A>) -> Result<bool, NotTranslated> {
    if !snat::is_snat_port(u16::from_be(u.s.flow.dport_be)) {
        return Ok(false);
    }
    u.s.flow.ct_key_into(ct_dir::REPLY, &mut u.s.key2);
    let Some(entry_ptr) = crate::ct::entry(&u.s.key2) else {
        trace::revnat_miss(LAYER, &u.s.flow);
        return Ok(false);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; the
    // fields are copied out.
    let (flags, nat_port_be, snat_port_be) = unsafe {
        set(&mut u.to_saddr_be, &(*entry_ptr).nat_addr_be);
        set(&mut u.to_daddr_be, &(*entry_ptr).snat_addr_be);
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
    if stale_reply(flow, flags, &u.s.key2) {
        return Err(NotTranslated::Pass(Skip::NotOurs));
    }
    crate::ct::note(entry_ptr, flow, true, || {
        let client = (&u.to_daddr_be, snat_port_be);
        forward_entry(flow, client, (&u.to_saddr_be, nat_port_be), &mut u.s.key)
    });
    u.to_ports_be = [nat_port_be, snat_port_be];
    u.service_id = 0;
    Ok(true)
}

/// Where the route to a new flow's backend leaves.
enum Route {
    /// Not through an uplink or overlay: the backend is on this node.
    Local,
    /// Through an uplink or overlay with an address of the family (now in
    /// `u.snat_addr_be`).
    Remote,
    /// Through an uplink or overlay without an address of the family.
    NoAddress,
}

/// Whether the route to the backend in `u.s.backend` leaves through an
/// uplink or an overlay device (the backend is on another node). A backend
/// reached through any other interface (a pod veth, a bridge of pods) is
/// local.
#[inline(always)]
fn remote_uplink<A: UplinkFamily>(ctx: *mut c_void, ingress: u32, u: &mut Up<A>) -> Route {
    let (src, dst) = (&u.s.flow.saddr_be, &u.s.backend.addr_be);
    A::fib_params(&mut u.fib, ingress, u.s.flow.proto, src, dst);
    let rc = fib_lookup(ctx, &mut u.fib);
    if !names_egress(rc) {
        return Route::Local;
    }
    match A::uplink_addr(u.fib.ifindex) {
        None => Route::Local,
        Some(addr) if addr.same(&A::ZERO) => Route::NoAddress,
        Some(addr) => {
            u.snat_addr_be = addr;
            Route::Remote
        }
    }
}

/// Takes the SNAT port the key in `u.s.key2` names for the new flow whose
/// reply entry is `u.s.entry`: free (no entry), or held by a TCP flow that
/// closed more than [`snat::REUSE_AFTER_NS`] ago. Taking a closed flow's
/// port overwrites its entry and reads it back: when two CPUs take the same
/// port at the same instant (the BPF target has no compare-and-exchange
/// here), only the one whose client the entry names keeps it, and the other
/// tries its next port. A full table ends the search
/// ([`NotTracked::Full`]); a taken port is `Ok(false)`.
#[inline(always)]
fn claim_port<A: UplinkFamily>(u: &Up<A>, now: u64) -> Result<bool, NotTracked> {
    let table = A::conntrack();
    match ct::insert(&u.s.key2, &u.s.entry, u64::from(BPF_NOEXIST)) {
        Ok(()) => return Ok(true),
        Err(NotTracked::Full) => return Err(NotTracked::Full),
        Err(NotTracked::Failed) => {}
    }
    let Some(held) = table.get_ptr(u.s.key2) else {
        return Ok(false);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; read once.
    let (flags, closed_ns) = unsafe { ((*held).flags, (*held).created_ns) };
    if flags & ct_flags::CLOSING == 0 || now.wrapping_sub(closed_ns) < snat::REUSE_AFTER_NS {
        return Ok(false);
    }
    if table.insert(u.s.key2, u.s.entry, 0).is_err() {
        return Ok(false);
    }
    let Some(now_held) = table.get_ptr(u.s.key2) else {
        return Ok(false);
    };
    let mine = &u.s.entry;
    // SAFETY: as above; read once.
    Ok(unsafe {
        (*now_held).snat_addr_be.same(&mine.snat_addr_be)
            && (*now_held).snat_port_be == mine.snat_port_be
            && (*now_held).nat_addr_be.same(&mine.nat_addr_be)
    })
}

/// Records a new flow to a backend on another node (in `u.s.backend`,
/// forward key in `u.s.key`) with a free port of the SNAT range: the reply
/// entry is inserted first and only where no flow holds that port yet, so
/// two flows never share one. `counted`: as for [`track`].
#[inline(always)]
fn new_remote_flow<A: UplinkFamily>(
    u: &mut Up<A>,
    backend_id: u32,
    service_id: u32,
    counted: bool,
) -> Result<Out, NotTranslated> {
    // SAFETY: a helper without preconditions.
    let start = unsafe { bpf_get_prandom_u32() };
    let created_ns = ct::now_ns();
    for attempt in 0..snat::ATTEMPTS {
        let step = start.wrapping_add(attempt.wrapping_mul(snat::STRIDE));
        let port_be = snat::port(step % snat::PORTS).to_be();
        let e = &mut u.s.entry;
        e.backend_id = backend_id;
        e.service_id = service_id;
        set(&mut e.nat_addr_be, &u.s.flow.daddr_be);
        e.nat_port_be = u.s.flow.dport_be;
        e.flags = ct_flags::SNAT;
        e.state = 0;
        set(&mut e.snat_addr_be, &u.s.flow.saddr_be);
        e.snat_port_be = u.s.flow.sport_be;
        e._pad2 = [0; 2];
        e.created_ns = created_ns;
        e.last_seen_ns = created_ns;
        let k = &mut u.s.key2;
        set(&mut k.saddr_be, &u.s.backend.addr_be);
        set(&mut k.daddr_be, &u.snat_addr_be);
        set_ct_tail(
            k,
            u.s.backend.port_be,
            port_be,
            u.s.flow.proto,
            ct_dir::REPLY,
        );
        match claim_port(u, created_ns) {
            Ok(true) => {}
            Ok(false) => continue,
            // Full: the next port is tried once a flow that is not
            // established made room.
            Err(_) if ct::make_room::<proxy_common::CtKeyOf<A>>() => continue,
            // The client retransmits once the agent made room.
            Err(_) => return Err(NotTranslated::Drop(stat::CT_FULL)),
        }
        let e = &mut u.s.entry;
        set(&mut e.nat_addr_be, &u.s.backend.addr_be);
        e.nat_port_be = u.s.backend.port_be;
        set(&mut e.snat_addr_be, &u.snat_addr_be);
        e.snat_port_be = port_be;
        if counted {
            // Counted before the entry exists, as in `ct::insert_pair`.
            e.flags |= ct_flags::COUNTED;
            sched::flow_opened(backend_id);
        }
        let (fwd, reply) = (&u.s.key, &u.s.key2);
        let inserted = ct::with_room::<proxy_common::CtKeyOf<A>>(|| ct::insert(fwd, &u.s.entry, 0));
        if counted && inserted.is_err() {
            sched::flow_closed(backend_id);
        }
        match inserted {
            Ok(()) => {
                count_service(service_id, |s| s.new_flows += 1);
                ct::remember(fwd, reply);
            }
            Err(NotTracked::Failed) => count(stat::CT_INSERT_FAILED),
            Err(NotTracked::Full) => {
                // Give the port back: no half-tracked flow.
                ct::remove::<A>(reply);
                return Err(NotTranslated::Drop(stat::CT_FULL));
            }
        }
        set(&mut u.to_saddr_be, &u.snat_addr_be);
        set(&mut u.to_daddr_be, &u.s.backend.addr_be);
        u.to_ports_be = [port_be, u.s.backend.port_be];
        return Ok(Out::Remote);
    }
    Err(NotTranslated::Drop(stat::SNAT_EXHAUSTED))
}
