//! The tc layer: DNAT of packets a pod sends to a frontend, and the reverse of
//! it on the replies, with connection tracking in between.
//!
//! Per packet of an existing flow this is one frontend lookup and one
//! connection-tracking lookup in `sb_from_pod`, then a tail call into
//! `sb_rewrite`, which stores the address, the port and the IPv4 checksum
//! directly and makes at most two L4 checksum helper calls (the kernel must do
//! those: only it knows whether the skb carries a full checksum or a partial
//! one to be finished by the device, `CHECKSUM_PARTIAL`). A reply is one
//! lookup: its connection-tracking entry carries the frontend address. Should
//! the tail call fail, the programs rewrite with helper stores themselves.
//!
//! IPv6 is told apart by its ethertype before the IPv4 parser runs and
//! handed to its own programs ([`crate::tc6`]); the IPv4 path pays one
//! compare for it.
use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, TC_ACT_OK, TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::{bpf_fib_lookup, bpf_redirect_neigh},
    programs::TcContext,
};
use proxy_common::{ct_dir, ct_flags, proto, stat, tail, AffinityKey, Backend, CtEntry, CtKey};

use crate::{
    lb::{backend_is_live, choose_backend, frontend_key, lookup_frontend},
    maps::{
        count, count_denied, count_service, source_allowed4, SB_AFFINITY_V1, SB_CT_V5, SB_TAIL_V1,
    },
    nodeport::{self, NotTranslated, Translation},
    packet::{
        csum_replace4, Flow, Ipv4Hdr, Skip, ETH_HLEN, ETH_P_IP_BE, IPV4_MIN_HLEN, IP_CSUM_OFF,
        IP_FRAG_MASK, IP_OFFSET_MASK, TCP_CSUM_OFF, TCP_HLEN, UDP_CSUM_OFF, UDP_HLEN,
    },
    packet6::ETH_P_IPV6_BE,
};

/// Which side of the packet a rewrite touches.
#[derive(Clone, Copy)]
pub(crate) enum Side {
    Source,
    Destination,
}

/// A rewrite helper failed half-way; the packet must not go on.
pub(crate) struct RewriteFailed;

/// Lets a packet we leave alone continue untouched, counting only the odd
/// ones: counting every packet of the node would cost each a map update.
#[inline(always)]
pub fn pass(skip: Skip) -> i32 {
    match skip {
        Skip::NotOurs | Skip::Icmp => {}
        Skip::Malformed => count(stat::MALFORMED),
        Skip::Fragment => count(stat::FRAGMENT),
    }
    TC_ACT_UNSPEC
}

/// Drops a packet, counting why.
#[inline(always)]
pub(crate) fn drop_counted(stat_index: u32) -> Result<i32, Skip> {
    count(stat_index);
    Ok(TC_ACT_SHOT)
}

/// A packet a pod sends: DNAT to a backend if it is for a frontend.
#[inline(always)]
pub fn try_from_pod(ctx: &TcContext) -> Result<i32, Skip> {
    // The family is decided once, here: IPv4 goes on as it always did.
    let ethertype = ethertype(ctx)?;
    if ethertype != ETH_P_IP_BE {
        if ethertype == ETH_P_IPV6_BE {
            return Ok(crate::tc6::hand_over6(ctx, tail::FROM_POD6));
        }
        return Err(Skip::NotOurs);
    }
    let flow = match parse_ipv4(ctx) {
        Ok(flow) => flow,
        // Later fragments and ICMP errors of translated flows.
        Err(skip) => return crate::frag::unparsed(ctx, skip, ct_dir::FORWARD),
    };
    let fe_key = frontend_key(flow.daddr_be, flow.dport_be, flow.proto);
    let Some(svc) = lookup_frontend(&fe_key) else {
        // A pod's reply to a hairpin flow goes to the hairpin address.
        return crate::hairpin::reply(ctx, &flow);
    };
    if !source_allowed4(&svc, flow.saddr_be) {
        count_denied(svc.service_id);
        return Ok(TC_ACT_SHOT);
    }
    if svc.backend_count == 0 {
        count_service(svc.service_id, |s| s.drops_no_backend += 1);
        return Ok(crate::reject::from_pod(ctx, &flow, &svc));
    }

    let ct_key = flow.ct_key(ct_dir::FORWARD);
    let backend = match tracked_backend(&ct_key, &flow, svc.service_id) {
        Some(backend) => backend,
        None => {
            let affinity_key = AffinityKey {
                client_addr_be: flow.saddr_be,
                service_id: svc.service_id,
            };
            let Some((id, backend)) = choose_backend(fe_key, &svc, &SB_AFFINITY_V1, &affinity_key)
            else {
                return drop_counted(stat::DROP_INCONSISTENT);
            };
            let outcome = if crate::hairpin::is_hairpin(&flow, &backend) {
                crate::hairpin::track(&ct_key, &flow, id, &backend, svc.service_id)
            } else {
                track(&ct_key, &flow, id, &backend, svc.service_id)
            };
            if outcome.is_err() {
                // The table is full: the client retransmits.
                return drop_counted(stat::CT_FULL);
            }
            backend
        }
    };
    if crate::hairpin::is_hairpin(&flow, &backend) {
        return crate::hairpin::forward(ctx, &flow, &backend, svc.service_id);
    }

    let todo = Rewrite {
        side: Side::Destination,
        new_addr_be: backend.addr_be,
        new_port_be: backend.port_be,
        service_id: svc.service_id,
        l4_off: flow.l4_off,
        proto: flow.proto,
    };
    if flow.first_fragment {
        crate::frag::remember(ctx, &flow, &todo);
    }
    hand_over(ctx, &todo);
    // The tail call did not happen: rewrite here, with helpers.
    if rewrite_with_helpers(ctx, &flow, &todo).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count_rewritten(ctx, &todo);
    Ok(TC_ACT_OK)
}

/// A packet going into a pod: a reply of a tracked flow gets the frontend as
/// its source again.
#[inline(always)]
pub fn try_to_pod(ctx: &TcContext) -> Result<i32, Skip> {
    // The family is decided once, here: IPv4 goes on as it always did.
    let ethertype = ethertype(ctx)?;
    if ethertype != ETH_P_IP_BE {
        if ethertype == ETH_P_IPV6_BE {
            return Ok(crate::tc6::hand_over6(ctx, tail::TO_POD6));
        }
        return Err(Skip::NotOurs);
    }
    let flow = match parse_ipv4(ctx) {
        Ok(flow) => flow,
        // Later fragments and ICMP errors of translated flows.
        Err(skip) => return crate::frag::unparsed(ctx, skip, ct_dir::REPLY),
    };
    let key = flow.ct_key(ct_dir::REPLY);
    let Some(entry_ptr) = SB_CT_V5.get_ptr_mut(key) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the conntrack map, valid for this program run; copied out.
    let entry = unsafe { *entry_ptr };
    let (nat_addr_be, nat_port_be) = (entry.nat_addr_be, entry.nat_port_be);
    if flow.accepts_connection() && entry.flags & ct_flags::CLOSING != 0 {
        // The flow this entry was made for has closed and its ports were
        // reused by a connection that did not go through the frontend.
        if SB_CT_V5.remove(key).is_ok() {
            count(stat::CT_STALE);
        }
        return Err(Skip::NotOurs);
    }
    crate::ct::seen(entry_ptr, &flow, true);
    if flow.ends_connection() {
        mark_closing(entry_ptr);
        let forward = CtKey {
            saddr_be: flow.daddr_be,
            daddr_be: nat_addr_be,
            sport_be: flow.dport_be,
            dport_be: nat_port_be,
            proto: flow.proto,
            dir: ct_dir::FORWARD,
            _pad: [0; 2],
        };
        if let Some(forward_ptr) = SB_CT_V5.get_ptr_mut(forward) {
            mark_closing(forward_ptr);
        }
    }
    let todo = Rewrite {
        side: Side::Source,
        new_addr_be: nat_addr_be,
        new_port_be: nat_port_be,
        service_id: entry.service_id,
        l4_off: flow.l4_off,
        proto: flow.proto,
    };
    if flow.first_fragment {
        crate::frag::remember(ctx, &flow, &todo);
    }
    hand_over(ctx, &todo);
    // The tail call did not happen: rewrite here, with helpers.
    if rewrite_with_helpers(ctx, &flow, &todo).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count_rewritten(ctx, &todo);
    Ok(TC_ACT_OK)
}

/// `sb_from_uplink` (`--xdp-mode off`): a packet from outside the node, as
/// the XDP program would treat it ([`nodeport::classify`]), rewritten with
/// helper stores; the kernel's stack then delivers or forwards it.
#[inline(always)]
pub fn try_from_uplink(ctx: &TcContext) -> Result<i32, Skip> {
    // SAFETY: `ctx.skb.skb` is the kernel's `__sk_buff` for this run; a read.
    let ingress = unsafe { (*ctx.skb.skb).ingress_ifindex };
    // The family is decided once, here: IPv4 goes on as it always did, IPv6
    // is a program of its own ([`crate::nodeport6`]).
    let ethertype = ethertype(ctx)?;
    if ethertype != ETH_P_IP_BE {
        if ethertype == ETH_P_IPV6_BE {
            return Ok(crate::tc6::hand_over6(ctx, tail::FROM_UPLINK6));
        }
        return Err(Skip::NotOurs);
    }
    let flow = match parse_ipv4(ctx) {
        Ok(flow) => flow,
        Err(Skip::Fragment) => return later_fragment_from_uplink(ctx, ingress),
        Err(Skip::Icmp) => return icmp_error_from_uplink(ctx, ingress),
        Err(skip) => return Err(skip),
    };
    let translation = match nodeport::classify(ctx.skb.skb as *mut c_void, ingress, &flow) {
        Ok(translation) => translation,
        Err(NotTranslated::Pass(skip)) => return Err(skip),
        Err(NotTranslated::Drop(counter)) => return drop_counted(counter),
        Err(NotTranslated::Denied) => return Ok(TC_ACT_SHOT),
        Err(NotTranslated::Reject) => return Ok(crate::reject::tc_reject(ctx, &flow)),
    };
    let (src, dst, service_id, counter) = match translation {
        Translation::Local {
            backend,
            service_id,
        } => (
            None,
            (backend.addr_be, backend.port_be),
            service_id,
            stat::EXT_LOCAL,
        ),
        Translation::Remote {
            backend,
            snat_addr_be,
            snat_port_be,
            service_id,
        } => (
            Some((snat_addr_be, snat_port_be)),
            (backend.addr_be, backend.port_be),
            service_id,
            stat::EXT_REMOTE,
        ),
        Translation::Reply {
            src_addr_be,
            src_port_be,
            dst_addr_be,
            dst_port_be,
        } => (
            Some((src_addr_be, src_port_be)),
            (dst_addr_be, dst_port_be),
            0,
            stat::EXT_REPLY,
        ),
    };
    let leaves = src.is_some();
    if leaves && ttl(ctx)? <= 1 {
        return drop_counted(stat::TTL_EXCEEDED);
    }
    let mut now = flow;
    if rewrite_side(ctx, &mut now, Side::Destination, dst, service_id).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    if let Some(src) = src {
        if rewrite_side(ctx, &mut now, Side::Source, src, service_id).is_err() {
            return drop_counted(stat::DROP_REWRITE_FAILED);
        }
    }
    if service_id != 0 {
        let len = u64::from(ctx.len());
        count_service(service_id, |s| {
            s.packets += 1;
            s.bytes += len;
        });
    }
    count(counter);
    if flow.first_fragment {
        let src_be = if leaves { now.saddr_be } else { 0 };
        crate::frag::remember_uplink(ctx, &flow, now.daddr_be, src_be, service_id);
    }
    if leaves {
        return send_out(ctx, ingress, &now);
    }
    Ok(TC_ACT_OK)
}

/// Rewrites one side of the packet `now` describes (helper stores), and
/// `now` with it.
#[inline(always)]
fn rewrite_side(
    ctx: &TcContext,
    now: &mut Flow,
    side: Side,
    (addr_be, port_be): (u32, u16),
    service_id: u32,
) -> Result<(), RewriteFailed> {
    let todo = Rewrite {
        side,
        new_addr_be: addr_be,
        new_port_be: port_be,
        service_id,
        l4_off: now.l4_off,
        proto: now.proto,
    };
    rewrite_with_helpers(ctx, now, &todo)?;
    match side {
        Side::Source => (now.saddr_be, now.sport_be) = (addr_be, port_be),
        Side::Destination => (now.daddr_be, now.dport_be) = (addr_be, port_be),
    }
    Ok(())
}

/// An ICMP error about a flow source-NATed to another node: translated back
/// ([`crate::icmp_error::translate_snat`]) and sent on to the client.
#[inline(always)]
fn icmp_error_from_uplink(ctx: &TcContext, ingress: u32) -> Result<i32, Skip> {
    let outer = crate::icmp_error::translate_snat(ctx)?;
    if ttl(ctx)? <= 1 {
        return drop_counted(stat::TTL_EXCEEDED);
    }
    let now = Flow {
        saddr_be: outer.saddr_be,
        daddr_be: outer.daddr_be,
        sport_be: 0,
        dport_be: 0,
        proto: proto::ICMP,
        tcp_flags: 0,
        l4_off: 0,
        first_fragment: false,
    };
    send_out(ctx, ingress, &now)
}

/// A later fragment from outside: translated as its first fragment was, and
/// sent out the same way when it leaves the node again.
#[inline(always)]
fn later_fragment_from_uplink(ctx: &TcContext, ingress: u32) -> Result<i32, Skip> {
    match crate::frag::later_uplink(ctx) {
        Ok((now, true)) => {
            if ttl(ctx)? <= 1 {
                return drop_counted(stat::TTL_EXCEEDED);
            }
            send_out(ctx, ingress, &now)
        }
        Ok((_, false)) => Ok(TC_ACT_OK),
        Err(verdict) => verdict,
    }
}

/// The TTL of the packet.
#[inline(always)]
fn ttl(ctx: &TcContext) -> Result<u8, Skip> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the header lies inside the packet; a read.
    Ok(unsafe { (*ip).ttl })
}

/// Sends a translated packet that leaves the node again (to a backend on
/// another node, or a reply to the client) straight out of the route's
/// interface, the kernel resolving the next hop (`bpf_redirect_neigh`), with
/// the TTL down by one. Handing it to the stack instead would not work: it
/// carries the node's own address as its source and would be dropped as a
/// martian.
#[inline(always)]
fn send_out(ctx: &TcContext, ingress: u32, flow: &Flow) -> Result<i32, Skip> {
    let mut params = nodeport::fib_params(ingress, flow.proto, flow.saddr_be, flow.daddr_be);
    // SAFETY: `params` is a valid, initialised `bpf_fib_lookup` of the size
    // passed; the context is this program's own.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb as *mut c_void,
            &mut params,
            size_of::<aya_ebpf::bindings::bpf_fib_lookup>() as i32,
            0,
        )
    };
    if rc != FIB_SUCCESS && rc != FIB_NO_NEIGH {
        return drop_counted(stat::NO_ROUTE);
    }
    if decrement_ttl(ctx).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    // SAFETY: no memory is passed (the kernel looks the neighbour up).
    let action = unsafe { bpf_redirect_neigh(params.ifindex, core::ptr::null_mut(), 0, 0) };
    Ok(action as i32)
}

/// The TTL down by one, through helpers (the IPv4 checksum with it).
#[inline(always)]
fn decrement_ttl(ctx: &TcContext) -> Result<(), RewriteFailed> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN).map_err(|_| RewriteFailed)?;
    // SAFETY: `ptr_at` checked the header lies inside the packet; reads.
    let (ttl, proto) = unsafe { ((*ip).ttl, (*ip).proto) };
    let old = u16::from_ne_bytes([ttl, proto]);
    let new = u16::from_ne_bytes([ttl.wrapping_sub(1), proto]);
    ctx.l3_csum_replace(IP_CSUM_OFF, u64::from(old), u64::from(new), 2)
        .map_err(|_| RewriteFailed)?;
    ctx.store(ETH_HLEN + 8, &ttl.wrapping_sub(1), 0)
        .map_err(|_| RewriteFailed)
}

/// `bpf_fib_lookup` results that name the egress interface.
const FIB_SUCCESS: i64 = 0;
const FIB_NO_NEIGH: i64 = 7;

/// A rewrite decided by `sb_from_pod` or `sb_to_pod`, carried to `sb_rewrite`
/// in the skb's control buffer.
pub(crate) struct Rewrite {
    pub(crate) side: Side,
    pub(crate) new_addr_be: u32,
    pub(crate) new_port_be: u16,
    /// For the per-service counters (forward direction).
    pub(crate) service_id: u32,
    pub(crate) l4_off: usize,
    pub(crate) proto: u8,
}

/// Where the control buffer words go: cb[0] the new address, cb[1] the new
/// port, cb[2] the service id, cb[3] `l4_off | proto << 8 | side << 16`.
const SIDE_BIT: u32 = 1 << 16;

impl Rewrite {
    #[inline(always)]
    fn store(&self, ctx: &TcContext) {
        let side = match self.side {
            Side::Source => 0,
            Side::Destination => SIDE_BIT,
        };
        let skb = ctx.skb.skb;
        // SAFETY: `cb` is the program's own scratch space in `__sk_buff`,
        // writable by tc programs and kept across a tail call.
        unsafe {
            (*skb).cb[0] = self.new_addr_be;
            (*skb).cb[1] = u32::from(self.new_port_be);
            (*skb).cb[2] = self.service_id;
            (*skb).cb[3] = (self.l4_off as u32) | u32::from(self.proto) << 8 | side;
        }
    }

    #[inline(always)]
    fn load(ctx: &TcContext) -> Rewrite {
        let skb = ctx.skb.skb;
        // SAFETY: reads of the program's scratch space in `__sk_buff`.
        let cb = unsafe { (*skb).cb };
        Rewrite {
            side: if cb[3] & SIDE_BIT != 0 {
                Side::Destination
            } else {
                Side::Source
            },
            new_addr_be: cb[0],
            new_port_be: cb[1] as u16,
            service_id: cb[2],
            l4_off: (cb[3] & 0xff) as usize,
            proto: (cb[3] >> 8) as u8,
        }
    }
}

/// Tail-calls `sb_rewrite` with the rewrite in the control buffer. Returns only
/// if the call failed (the agent has not filled the program array yet).
#[inline(always)]
fn hand_over(ctx: &TcContext, todo: &Rewrite) {
    todo.store(ctx);
    // SAFETY: a tail call with our own context and program array; on success
    // it does not return.
    unsafe { SB_TAIL_V1.tail_call(ctx, tail::REWRITE) };
    count(stat::TAIL_CALL_MISSED);
}

/// Counts a rewritten packet.
#[inline(always)]
pub(crate) fn count_rewritten(ctx: &TcContext, todo: &Rewrite) {
    match todo.side {
        Side::Destination => {
            let len = u64::from(ctx.len());
            count_service(todo.service_id, |s| {
                s.packets += 1;
                s.bytes += len;
            });
            count(stat::FORWARDED);
        }
        Side::Source => count(stat::REVERSED),
    }
}

/// `sb_rewrite`: writes the rewrite `sb_from_pod` or `sb_to_pod` decided on.
///
/// It is a program of its own because it stores into the packet directly: the
/// verifier makes such a program unclone a cloned skb on entry (copying its
/// headers), and every TCP segment a pod sends is a clone. Here that happens
/// only to packets we rewrite, which need a private copy anyway; the two
/// programs that see every packet never store directly (only through helpers).
#[inline(always)]
pub fn rewrite_in_place(ctx: &TcContext) -> i32 {
    let todo = Rewrite::load(ctx);
    if todo.l4_off < ETH_HLEN + IPV4_MIN_HLEN
        || todo.l4_off > ETH_HLEN + 60
        || (todo.proto != proto::TCP && todo.proto != proto::UDP)
    {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    if store_in_place(ctx, &todo).is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    count_rewritten(ctx, &todo);
    TC_ACT_OK
}

/// The address, port and IPv4 checksum stored directly, then the L4 checksum
/// through the kernel's helper ([`l4_checksum`]).
#[inline(always)]
fn store_in_place(ctx: &TcContext, todo: &Rewrite) -> Result<(), RewriteFailed> {
    let (addr_off, port_off) = match todo.side {
        Side::Source => (ETH_HLEN + 12, todo.l4_off),
        Side::Destination => (ETH_HLEN + 16, todo.l4_off + 2),
    };
    let csum_ptr = ptr_at::<u16>(ctx, IP_CSUM_OFF).map_err(|_| RewriteFailed)? as *mut u16;
    let addr_ptr = ptr_at::<u32>(ctx, addr_off).map_err(|_| RewriteFailed)? as *mut u32;
    let port_ptr = ptr_at::<u16>(ctx, port_off).map_err(|_| RewriteFailed)? as *mut u16;
    // SAFETY: `ptr_at` checked each field lies inside the linear packet data;
    // this program may store there (the verifier unclones the skb on entry).
    // No helper that moves packet data runs before the last store.
    let (old_addr_be, old_port_be) = unsafe {
        let old = (*addr_ptr, *port_ptr);
        *csum_ptr = csum_replace4(*csum_ptr, old.0, todo.new_addr_be);
        *addr_ptr = todo.new_addr_be;
        *port_ptr = todo.new_port_be;
        old
    };
    l4_checksum(ctx, todo, old_addr_be, old_port_be)
}

/// The backend an existing flow was given, if the flow is tracked and belongs
/// to this service. An established TCP connection keeps its backend even after
/// the endpoint left the service (it drains, as under kube-proxy). A new
/// connection or a UDP datagram whose tracked backend has gone (or whose id now
/// names another address) gets a new one, counted: a deleted pod never
/// black-holes a reused port or a long-lived UDP "flow" such as DNS.
///
/// A SYN on the ports of a connection that has closed starts a new flow; a
/// FIN or RST marks both entries of the flow as closing.
#[inline(always)]
pub(crate) fn tracked_backend(key: &CtKey, flow: &Flow, service_id: u32) -> Option<Backend> {
    tracked_entry(key, flow, service_id).map(|entry| Backend {
        addr_be: entry.nat_addr_be,
        port_be: entry.nat_port_be,
        proto: flow.proto,
        flags: 0,
    })
}

/// [`tracked_backend`]'s entry, whole (the uplink layer also needs its
/// source NAT).
#[inline(always)]
pub(crate) fn tracked_entry(key: &CtKey, flow: &Flow, service_id: u32) -> Option<CtEntry> {
    let entry_ptr = SB_CT_V5.get_ptr_mut(key)?;
    // SAFETY: a value of the conntrack map, valid for this program run; copied out.
    let entry = unsafe { *entry_ptr };
    if entry.service_id != service_id {
        return None;
    }
    if flow.opens_connection() && entry.flags & ct_flags::CLOSING != 0 {
        return None;
    }
    crate::ct::seen(entry_ptr, flow, false);
    if flow.ends_connection() {
        mark_closing(entry_ptr);
        if let Some(reply_ptr) = SB_CT_V5.get_ptr_mut(reply_key_of(flow, &entry)) {
            mark_closing(reply_ptr);
        }
    }
    if !flow.needs_live_backend()
        || backend_is_live(entry.backend_id, entry.nat_addr_be, entry.nat_port_be)
    {
        return Some(entry);
    }
    count(stat::CT_RESELECTED);
    None
}

/// The reply key of a tracked flow from its forward entry: replies of a
/// source-NATed flow come back to the node's address and port.
#[inline(always)]
fn reply_key_of(flow: &Flow, forward: &CtEntry) -> CtKey {
    let (daddr_be, dport_be) = if forward.flags & ct_flags::SNAT != 0 {
        (forward.snat_addr_be, forward.snat_port_be)
    } else {
        (flow.saddr_be, flow.sport_be)
    };
    CtKey {
        saddr_be: forward.nat_addr_be,
        daddr_be,
        sport_be: forward.nat_port_be,
        dport_be,
        proto: flow.proto,
        dir: ct_dir::REPLY,
        _pad: [0; 2],
    }
}

/// Marks a connection-tracking entry as belonging to a closing connection.
#[inline(always)]
pub(crate) fn mark_closing(entry: *mut CtEntry) {
    // SAFETY: a value pointer the map lookup just returned, valid for this
    // program run; the only concurrent writes set the same bit (or the same
    // kind of time stamp, which only dates the close).
    unsafe {
        if (*entry).flags & ct_flags::CLOSING == 0 {
            (*entry).flags |= ct_flags::CLOSING;
            (*entry).created_ns = crate::ct::now_ns();
        }
    }
}

/// The key a backend's replies to this flow are looked up with.
#[inline(always)]
pub(crate) fn reply_key(flow: &Flow, backend: &Backend) -> CtKey {
    CtKey {
        saddr_be: backend.addr_be,
        daddr_be: flow.saddr_be,
        sport_be: backend.port_be,
        dport_be: flow.sport_be,
        proto: flow.proto,
        dir: ct_dir::REPLY,
        _pad: [0; 2],
    }
}

/// The table was full: a new flow was not tracked, and its packet must be
/// dropped (counted `stat::CT_FULL` by the caller).
pub(crate) struct TableFull;

/// Records both directions of a new flow: the forward entry names the backend,
/// the reply entry the frontend the reply must come from. A full table is
/// the caller's to act on ([`TableFull`]: drop); any other failed insert is
/// counted and the packet still forwarded (the next packet picks again).
#[inline(always)]
pub(crate) fn track(
    fwd: &CtKey,
    flow: &Flow,
    backend_id: u32,
    backend: &Backend,
    service_id: u32,
) -> Result<(), TableFull> {
    let now = crate::ct::now_ns();
    let forward = CtEntry {
        backend_id,
        service_id,
        nat_addr_be: backend.addr_be,
        nat_port_be: backend.port_be,
        flags: ct_flags::HANDSHAKE,
        state: 0,
        snat_addr_be: 0,
        snat_port_be: 0,
        _pad2: [0; 2],
        created_ns: now,
        last_seen_ns: now,
    };
    let reply = CtEntry {
        nat_addr_be: flow.daddr_be,
        nat_port_be: flow.dport_be,
        ..forward
    };
    tracked(
        crate::ct::insert_pair(fwd, &forward, &reply_key(flow, backend), &reply),
        service_id,
    )
}

/// Counts the outcome of a new flow's inserts.
#[inline(always)]
pub(crate) fn tracked(
    result: Result<(), crate::ct::NotTracked>,
    service_id: u32,
) -> Result<(), TableFull> {
    match result {
        Ok(()) => {
            count_service(service_id, |s| s.new_flows += 1);
            Ok(())
        }
        Err(crate::ct::NotTracked::Failed) => {
            count(stat::CT_INSERT_FAILED);
            Ok(())
        }
        Err(crate::ct::NotTracked::Full) => Err(TableFull),
    }
}

/// Makes sure the first `len` bytes of the frame are in the linear area,
/// pulling them in if the packet is long enough but not linear.
#[inline(always)]
pub(crate) fn ensure_linear(ctx: &TcContext, len: usize) -> Result<(), Skip> {
    if ctx.data() + len <= ctx.data_end() {
        return Ok(());
    }
    if (ctx.len() as usize) < len {
        return Err(Skip::Malformed);
    }
    ctx.pull_data(len as u32).map_err(|_| Skip::Malformed)?;
    if ctx.data() + len <= ctx.data_end() {
        Ok(())
    } else {
        Err(Skip::Malformed)
    }
}

/// A bounds-checked pointer into the linear packet data.
#[inline(always)]
pub(crate) fn ptr_at<T>(ctx: &TcContext, off: usize) -> Result<*const T, Skip> {
    let start = ctx.data();
    if start + off + size_of::<T>() > ctx.data_end() {
        return Err(Skip::Malformed);
    }
    Ok((start + off) as *const T)
}

/// The frame's ethertype (network order), read from the linear area.
#[inline(always)]
pub(crate) fn ethertype(ctx: &TcContext) -> Result<u16, Skip> {
    if (ctx.len() as usize) < ETH_HLEN + 2 {
        return Err(Skip::NotOurs);
    }
    ensure_linear(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the two bytes lie inside the packet.
    Ok(unsafe { *ptr_at::<u16>(ctx, 12)? })
}

/// An IPv4 TCP/UDP packet's flow (the caller checked the ethertype);
/// anything else is skipped.
#[inline(always)]
pub(crate) fn parse_ipv4(ctx: &TcContext) -> Result<Flow, Skip> {
    ensure_linear(ctx, ETH_HLEN + IPV4_MIN_HLEN)?;
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the whole fixed header lies inside the packet.
    let (version_ihl, ip_proto, frag_off_be, tot_len_be, saddr_be, daddr_be) = unsafe {
        (
            (*ip).version_ihl,
            (*ip).proto,
            (*ip).frag_off_be,
            (*ip).tot_len_be,
            (*ip).saddr_be,
            (*ip).daddr_be,
        )
    };
    let l4_min = match ip_proto {
        proto::TCP => TCP_HLEN,
        proto::UDP => UDP_HLEN,
        proto::ICMP => return Err(Skip::Icmp),
        _ => return Err(Skip::NotOurs),
    };
    if version_ihl >> 4 != 4 {
        return Err(Skip::Malformed);
    }
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    if ihl < IPV4_MIN_HLEN {
        return Err(Skip::Malformed);
    }
    let frag = u16::from_be(frag_off_be) & IP_FRAG_MASK;
    if frag & IP_OFFSET_MASK != 0 {
        // No ports in it: it follows its first fragment ([`crate::frag`]).
        return Err(Skip::Fragment);
    }
    if usize::from(u16::from_be(tot_len_be)) < ihl + l4_min {
        return Err(Skip::Malformed);
    }
    let l4_off = ETH_HLEN + ihl;
    ensure_linear(ctx, l4_off + l4_min)?;
    let ports = ptr_at::<[u16; 2]>(ctx, l4_off)?;
    // SAFETY: `ptr_at` checked both ports lie inside the packet.
    let (sport_be, dport_be) = unsafe { ((*ports)[0], (*ports)[1]) };
    let tcp_flags = if ip_proto == proto::TCP {
        // SAFETY: `ptr_at` checked the byte lies inside the packet.
        unsafe { *ptr_at::<u8>(ctx, l4_off + 13)? }
    } else {
        0
    };
    Ok(Flow {
        saddr_be,
        daddr_be,
        sport_be,
        dport_be,
        proto: ip_proto,
        tcp_flags,
        l4_off,
        first_fragment: frag != 0,
    })
}

/// The fallback when the tail call into `sb_rewrite` fails: the same
/// rewrite, with every write through a helper (a direct store would make the
/// verifier unclone every cloned skb this program sees, ours or not). Both
/// addresses and the IPv4 checksum (computed here) go in one 10-byte store.
#[inline(always)]
pub(crate) fn rewrite_with_helpers(
    ctx: &TcContext,
    flow: &Flow,
    todo: &Rewrite,
) -> Result<(), RewriteFailed> {
    let (old_addr_be, old_port_be, port_off) = match todo.side {
        Side::Source => (flow.saddr_be, flow.sport_be, flow.l4_off),
        Side::Destination => (flow.daddr_be, flow.dport_be, flow.l4_off + 2),
    };
    if old_addr_be != todo.new_addr_be {
        let csum_ptr = ptr_at::<u16>(ctx, IP_CSUM_OFF).map_err(|_| RewriteFailed)?;
        // SAFETY: `ptr_at` checked the field lies inside the packet; a read.
        let old_csum = unsafe { *csum_ptr };
        let (saddr_be, daddr_be) = match todo.side {
            Side::Source => (todo.new_addr_be, flow.daddr_be),
            Side::Destination => (flow.saddr_be, todo.new_addr_be),
        };
        let csum = csum_replace4(old_csum, old_addr_be, todo.new_addr_be).to_ne_bytes();
        let (s, d) = (saddr_be.to_ne_bytes(), daddr_be.to_ne_bytes());
        let l3: [u8; 10] = [
            csum[0], csum[1], s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3],
        ];
        ctx.store(IP_CSUM_OFF, &l3, 0).map_err(|_| RewriteFailed)?;
    }
    if old_port_be != todo.new_port_be {
        ctx.store(port_off, &todo.new_port_be, 0)
            .map_err(|_| RewriteFailed)?;
    }
    l4_checksum(ctx, todo, old_addr_be, old_port_be)
}

/// Updates the TCP/UDP checksum for a rewrite from `old_addr_be:old_port_be`.
/// Through the kernel's helper, which alone knows whether the skb carries a
/// full checksum or a partial one for the device to finish
/// (`CHECKSUM_PARTIAL`: only the address, part of the pseudo-header, may
/// change it then). A UDP checksum of zero ("none") stays zero.
#[inline(always)]
fn l4_checksum(
    ctx: &TcContext,
    todo: &Rewrite,
    old_addr_be: u32,
    old_port_be: u16,
) -> Result<(), RewriteFailed> {
    let (csum_off, l4_flags) = if todo.proto == proto::TCP {
        (todo.l4_off + TCP_CSUM_OFF, 0)
    } else {
        (todo.l4_off + UDP_CSUM_OFF, u64::from(BPF_F_MARK_MANGLED_0))
    };
    if old_addr_be != todo.new_addr_be {
        ctx.l4_csum_replace(
            csum_off,
            u64::from(old_addr_be),
            u64::from(todo.new_addr_be),
            u64::from(BPF_F_PSEUDO_HDR) | l4_flags | 4,
        )
        .map_err(|_| RewriteFailed)?;
    }
    if old_port_be != todo.new_port_be {
        ctx.l4_csum_replace(
            csum_off,
            u64::from(old_port_be),
            u64::from(todo.new_port_be),
            l4_flags | 2,
        )
        .map_err(|_| RewriteFailed)?;
    }
    Ok(())
}
