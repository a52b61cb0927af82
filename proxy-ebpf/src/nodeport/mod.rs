//! North-south: what happens to a packet that arrives on an uplink from
//! outside the node. Shared by the XDP program and its tc twin
//! (`--xdp-mode off`); each applies the [`Translation`] with its own tools.
//!
//! - To a frontend (NodePort on a node address, LoadBalancer IP, external
//!   IP; a ClusterIP routed to the node works the same way):
//!   - a backend on this node gets DNAT only, and the kernel delivers the
//!     packet; the pod's reply is reversed by the tc program on the uplink's
//!     egress (one connection-tracking lookup, as for pod clients);
//!   - a backend on another node (the route to it leaves through an uplink)
//!     gets DNAT plus SNAT to that uplink's address and a port of
//!     [`snat`], so its reply comes back here;
//!   - under `externalTrafficPolicy: Local` only this node's endpoints are
//!     used (the [`scope::EXTERNAL`] slots), never with SNAT: the pod sees the
//!     client's address. Without local endpoints the packet is dropped, as
//!     kube-proxy does.
//! - A reply to a source-NATed flow (destination port in [`snat`]'s range,
//!   tracked) gets both translations reversed and goes back out.

pub mod v6;

use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, BPF_NOEXIST},
    helpers::{bpf_fib_lookup, bpf_get_prandom_u32},
};
use proxy_common::{
    ct_dir, ct_flags, frontend_flags,
    hash::{flow_hash, source_hash},
    scope, snat, stat, AffinityKey, Backend, CtEntry, CtKey, FrontendKey, FrontendSlot,
};

use crate::{
    ct::track::{track, tracked, Source},
    ct::{self, NotTracked},
    family::Family,
    lb::{choose_backend, frontend_key, lookup_frontend, maglev_backend},
    maps::{
        count, count_denied, count_service, source_allowed4, SB_AFFINITY_V1, SB_CT_V5, SB_UPLINK_V1,
    },
    packet::{Flow, Skip},
};

const AF_INET: u8 = 2;
/// `bpf_fib_lookup` results that name the egress interface.
const FIB_SUCCESS: i64 = 0;
const FIB_NO_NEIGH: i64 = 7;

/// What to do with a packet from outside that is ours.
#[derive(Clone, Copy)]
pub enum Translation {
    /// To a backend on this node: the destination becomes the backend; the
    /// kernel delivers the packet.
    Local { backend: Backend, service_id: u32 },
    /// To a backend on another node: destination the backend, source this
    /// node's uplink address and a port of ours; the packet goes out again.
    Remote {
        backend: Backend,
        snat_addr_be: u32,
        snat_port_be: u16,
        service_id: u32,
    },
    /// The reply of a `Remote` flow: the source becomes the frontend again and
    /// the destination the client; the packet goes out again.
    Reply {
        src_addr_be: u32,
        src_port_be: u16,
        dst_addr_be: u32,
        dst_port_be: u16,
    },
}

/// Why a packet from outside is not translated.
pub enum NotTranslated {
    /// Not ours (or malformed, or a fragment): it continues untouched.
    Pass(Skip),
    /// Ours, but it cannot be delivered: drop it, counting this counter.
    Drop(u32),
    /// To a frontend without any endpoint: answer with an ICMP port
    /// unreachable, as kube-proxy rejects ([`crate::reject`]).
    Reject,
    /// Its source is outside the frontend's `loadBalancerSourceRanges`:
    /// drop it silently, as kube-proxy's firewall does (already counted per
    /// service, in `SB_SVC_DENIED_V1`).
    Denied,
}

/// Decides what happens to a packet that arrived on uplink `ingress`.
/// `ctx` is the program's context (`xdp_md` or `__sk_buff`), for the route
/// lookup.
#[inline(always)]
pub fn classify(ctx: *mut c_void, ingress: u32, flow: &Flow) -> Result<Translation, NotTranslated> {
    if let Some(reply) = snat_reply(flow)? {
        return Ok(reply);
    }
    let fe_key = frontend_key(flow.daddr_be, flow.dport_be, flow.proto);
    let Some(svc) = lookup_frontend(&fe_key) else {
        return Err(NotTranslated::Pass(Skip::NotOurs));
    };
    if !source_allowed4(&svc, flow.saddr_be) {
        count_denied(svc.service_id);
        return Err(NotTranslated::Denied);
    }
    let cluster = svc;
    let (key, svc, local_only) = backend_set(fe_key, svc);
    if svc.backend_count == 0 {
        count_service(svc.service_id, |s| s.drops_no_backend += 1);
        // kube-proxy rejects only when the Service has no endpoint at all;
        // `externalTrafficPolicy: Local` without a local one drops.
        if cluster.backend_count == 0 && crate::reject::rejects(&cluster) {
            return Err(NotTranslated::Reject);
        }
        return Err(NotTranslated::Drop(stat::DROP_NO_BACKEND));
    }
    let Some(w) = u32::work() else {
        return Err(NotTranslated::Pass(Skip::NotOurs));
    };
    w.flow = *flow;
    flow.ct_key_into(ct_dir::FORWARD, &mut w.key);
    if tracked(w, svc.service_id) {
        return Ok(from_tracked(&w.entry, flow));
    }
    let Some((id, backend)) = pick_backend(key, &svc, flow) else {
        return Err(NotTranslated::Drop(stat::DROP_INCONSISTENT));
    };
    if !local_only {
        if let Some(snat_addr_be) = remote_uplink_addr(ctx, ingress, flow, &backend) {
            return new_remote_flow(&w.key, flow, id, &backend, svc.service_id, snat_addr_be);
        }
    }
    w.backend = backend;
    if track(w, id, svc.service_id, Source::Client).is_err() {
        // The table is full: the client retransmits.
        return Err(NotTranslated::Drop(stat::CT_FULL));
    }
    Ok(Translation::Local {
        backend,
        service_id: svc.service_id,
    })
}

/// A new flow's backend: by the frontend's hashing algorithm (Maglev over
/// the 5-tuple, or over the client address) when it has one and its table
/// is there, else at random (with session affinity).
#[inline(always)]
fn pick_backend(key: FrontendKey, svc: &FrontendSlot, flow: &Flow) -> Option<(u32, Backend)> {
    let hashed = match svc.flags & frontend_flags::ALGO_MASK {
        frontend_flags::ALGO_MAGLEV => Some(flow_hash(
            flow.saddr_be,
            flow.daddr_be,
            flow.sport_be,
            flow.dport_be,
            flow.proto,
        )),
        frontend_flags::ALGO_SOURCE_HASH => Some(source_hash(flow.saddr_be)),
        _ => None,
    };
    if let Some(found) = hashed.and_then(|hash| maglev_backend::<FrontendKey>(svc.service_id, hash))
    {
        return Some(found);
    }
    let affinity_key = AffinityKey {
        client_addr_be: flow.saddr_be,
        service_id: svc.service_id,
    };
    choose_backend(key, svc, &SB_AFFINITY_V1, &affinity_key)
}

/// The backend set traffic from outside gets: the external (local-only) one
/// under `externalTrafficPolicy: Local`, else the frontend's own. Returns its
/// slot-0 key, its slot-0 entry and whether it is local-only. A local-only
/// set whose entry is missing (mid-update) counts as empty.
#[inline(always)]
fn backend_set(key: FrontendKey, svc: FrontendSlot) -> (FrontendKey, FrontendSlot, bool) {
    if !frontend_flags::has_external_set(svc.flags) {
        return (key, svc, false);
    }
    let ext_key = FrontendKey {
        scope: scope::EXTERNAL,
        ..key
    };
    let ext = lookup_frontend(&ext_key).unwrap_or(FrontendSlot {
        backend_count: 0,
        ..svc
    });
    (ext_key, ext, true)
}

/// A tracked flow keeps its translation.
#[inline(always)]
fn from_tracked(entry: &CtEntry, flow: &Flow) -> Translation {
    let backend = Backend {
        addr_be: entry.nat_addr_be,
        port_be: entry.nat_port_be,
        proto: flow.proto,
        flags: 0,
    };
    if entry.flags & ct_flags::SNAT != 0 {
        Translation::Remote {
            backend,
            snat_addr_be: entry.snat_addr_be,
            snat_port_be: entry.snat_port_be,
            service_id: entry.service_id,
        }
    } else {
        Translation::Local {
            backend,
            service_id: entry.service_id,
        }
    }
}

/// A reply to a flow this node source-NATed: only packets to a port of the
/// SNAT range are looked up.
#[inline(always)]
fn snat_reply(flow: &Flow) -> Result<Option<Translation>, NotTranslated> {
    if !snat::is_snat_port(u16::from_be(flow.dport_be)) {
        return Ok(None);
    }
    let key = flow.ct_key(ct_dir::REPLY);
    let Some(entry_ptr) = SB_CT_V5.get_ptr_mut(key) else {
        return Ok(None);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; copied out.
    let entry = unsafe { *entry_ptr };
    if entry.flags & ct_flags::SNAT == 0 {
        return Ok(None);
    }
    if flow.accepts_connection() && entry.flags & ct_flags::CLOSING != 0 {
        // The flow has closed; nothing of ours answers on this port now.
        if SB_CT_V5.remove(key).is_ok() {
            count(stat::CT_STALE);
        }
        return Err(NotTranslated::Pass(Skip::NotOurs));
    }
    crate::ct::note(entry_ptr, flow, true, || {
        let forward = CtKey {
            saddr_be: entry.snat_addr_be,
            daddr_be: entry.nat_addr_be,
            sport_be: entry.snat_port_be,
            dport_be: entry.nat_port_be,
            proto: flow.proto,
            dir: ct_dir::FORWARD,
            _pad: [0; 2],
        };
        SB_CT_V5.get_ptr_mut(forward)
    });
    Ok(Some(Translation::Reply {
        src_addr_be: entry.nat_addr_be,
        src_port_be: entry.nat_port_be,
        dst_addr_be: entry.snat_addr_be,
        dst_port_be: entry.snat_port_be,
    }))
}

/// The address of the uplink the route to `backend` leaves through, if it
/// leaves through one (the backend is on another node). A backend reached
/// through any other interface (a pod veth) is local.
#[inline(always)]
fn remote_uplink_addr(
    ctx: *mut c_void,
    ingress: u32,
    flow: &Flow,
    backend: &Backend,
) -> Option<u32> {
    let mut params = fib_params(ingress, flow.proto, flow.saddr_be, backend.addr_be);
    // SAFETY: `params` is a valid, initialised `bpf_fib_lookup` of the size
    // passed; `ctx` is this program's own context.
    let rc = unsafe { bpf_fib_lookup(ctx, &mut params, size_of::<FibParams>() as i32, 0) };
    if rc != FIB_SUCCESS && rc != FIB_NO_NEIGH {
        return None;
    }
    // SAFETY: the value is copied out at once.
    unsafe { SB_UPLINK_V1.get(params.ifindex) }.map(|uplink| uplink.addr_be)
}

/// Takes the SNAT port `reply_key` names for a new flow: free (no entry), or
/// held by a TCP flow that closed more than [`snat::REUSE_AFTER_NS`] ago.
/// Taking a closed flow's port overwrites its entry and reads it back: when
/// two CPUs take the same port at the same instant (the BPF target has no
/// compare-and-exchange here), only the one whose client the entry names
/// keeps it, and the other tries its next port. A full table ends the
/// search ([`NotTracked::Full`]); a taken port is `Ok(false)`.
#[inline(always)]
fn claim_port(reply_key: &CtKey, reply: &CtEntry, now: u64) -> Result<bool, NotTracked> {
    match ct::insert(reply_key, reply, u64::from(BPF_NOEXIST)) {
        Ok(()) => return Ok(true),
        Err(NotTracked::Full) => return Err(NotTracked::Full),
        Err(NotTracked::Failed) => {}
    }
    let Some(held) = SB_CT_V5.get_ptr(reply_key) else {
        return Ok(false);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; read once.
    let (flags, closed_ns) = unsafe { ((*held).flags, (*held).created_ns) };
    if flags & ct_flags::CLOSING == 0 || now.wrapping_sub(closed_ns) < snat::REUSE_AFTER_NS {
        return Ok(false);
    }
    if SB_CT_V5.insert(reply_key, reply, 0).is_err() {
        return Ok(false);
    }
    // SAFETY: the value is copied out at once.
    Ok(match unsafe { SB_CT_V5.get(reply_key) } {
        Some(now_held) => {
            now_held.snat_addr_be == reply.snat_addr_be
                && now_held.snat_port_be == reply.snat_port_be
                && now_held.nat_addr_be == reply.nat_addr_be
        }
        None => false,
    })
}

/// Route-lookup parameters for an IPv4 packet arriving on `ifindex`.
#[inline(always)]
pub fn fib_params(ifindex: u32, proto: u8, saddr_be: u32, daddr_be: u32) -> FibParams {
    // SAFETY: `bpf_fib_lookup` is plain data; all-zero is a valid value.
    let mut params: FibParams = unsafe { core::mem::zeroed() };
    params.family = AF_INET;
    params.l4_protocol = proto;
    params.ifindex = ifindex;
    params.__bindgen_anon_3.ipv4_src = saddr_be;
    params.__bindgen_anon_4.ipv4_dst = daddr_be;
    params
}

/// Records a new flow to a backend on another node, with a free port of
/// the SNAT range: the reply entry is inserted first and only where no flow
/// holds that port yet, so two flows never share one.
#[inline(always)]
fn new_remote_flow(
    fwd: &CtKey,
    flow: &Flow,
    backend_id: u32,
    backend: &Backend,
    service_id: u32,
    snat_addr_be: u32,
) -> Result<Translation, NotTranslated> {
    // SAFETY: a helper without preconditions.
    let start = unsafe { bpf_get_prandom_u32() };
    let created_ns = ct::now_ns();
    let reply = CtEntry {
        backend_id,
        service_id,
        nat_addr_be: flow.daddr_be,
        nat_port_be: flow.dport_be,
        flags: ct_flags::SNAT | ct_flags::HANDSHAKE,
        state: 0,
        snat_addr_be: flow.saddr_be,
        snat_port_be: flow.sport_be,
        _pad2: [0; 2],
        created_ns,
        last_seen_ns: created_ns,
    };
    for attempt in 0..snat::ATTEMPTS {
        let step = start.wrapping_add(attempt.wrapping_mul(snat::STRIDE));
        let port = snat::port(step % snat::PORTS);
        let reply_key = CtKey {
            saddr_be: backend.addr_be,
            daddr_be: snat_addr_be,
            sport_be: backend.port_be,
            dport_be: port.to_be(),
            proto: flow.proto,
            dir: ct_dir::REPLY,
            _pad: [0; 2],
        };
        match claim_port(&reply_key, &reply, created_ns) {
            Ok(true) => {}
            Ok(false) => continue,
            // Full: the next port is tried once a flow that is not
            // established made room.
            Err(_) if ct::make_room::<CtKey>() => continue,
            // The client retransmits once the agent made room.
            Err(_) => return Err(NotTranslated::Drop(stat::CT_FULL)),
        }
        let forward = CtEntry {
            nat_addr_be: backend.addr_be,
            nat_port_be: backend.port_be,
            snat_addr_be,
            snat_port_be: port.to_be(),
            ..reply
        };
        match ct::with_room::<CtKey>(|| ct::insert(fwd, &forward, 0)) {
            Ok(()) => {
                count_service(service_id, |s| s.new_flows += 1);
                ct::remember(fwd, &reply_key);
            }
            Err(NotTracked::Failed) => count(stat::CT_INSERT_FAILED),
            Err(NotTracked::Full) => {
                // Give the port back: no half-tracked flow.
                let _ = SB_CT_V5.remove(reply_key);
                return Err(NotTranslated::Drop(stat::CT_FULL));
            }
        }
        return Ok(Translation::Remote {
            backend: *backend,
            snat_addr_be,
            snat_port_be: port.to_be(),
            service_id,
        });
    }
    Err(NotTranslated::Drop(stat::SNAT_EXHAUSTED))
}
