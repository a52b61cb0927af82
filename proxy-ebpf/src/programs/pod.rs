//! The tc layer on the pod veth, both families: DNAT of packets a pod sends
//! to a frontend, and the reverse of it on the replies, with connection
//! tracking in between. One generic body ([`from_pod`], [`to_pod`]) serves
//! IPv4 and IPv6 in the same two programs (`sb_from_pod`, `sb_to_pod`);
//! what the families still do their own way (parsing, fragments, ICMP
//! errors, reject) is [`PodFamily`].
//!
//! Per packet:
//! - one a pod sends that is not for a frontend: its destination read from
//!   the header as it lies and one bit of the frontend bitmap
//!   ([`crate::prefilter`]); no parse, no working memory, no hash lookup
//!   ([`screen`]);
//! - one of an existing flow: the bitmap, then (an established TCP
//!   segment) this CPU's flow cache, one slot of a per-CPU array
//!   ([`crate::ct::cache`]), else one connection-tracking lookup whose
//!   entry carries the backend (and fills the slot); then the rewrite
//!   ([`crate::rewrite::rewrite`]: the address, port and IPv4 header
//!   checksum stored directly, the L4 checksum updated in place from the
//!   skb's `ip_summed`). No frontend lookup, no tail call;
//! - a reply: the flow cache, else one connection-tracking lookup, whose
//!   entry carries the frontend; then the same rewrite;
//! - anything delivered to a pod without translated flows of its class (a
//!   pod whose connections the socket layer balanced, or whose only tc flows
//!   are UDP, as DNS): its protocol byte and two array reads (the agent's
//!   mark and the data path's generation), no parse.
//!
//! A new flow (a SYN, a first datagram) looks up the frontend, checks its
//! source ranges, picks a backend and tracks both directions.
//!
//! Storing directly makes the verifier start both programs with
//! `bpf_skb_pull_data(skb, 0)`, which copies the headers of an skb whose
//! header is shared. A segment of a local TCP socket is a clone whose header
//! is its own (TCP releases the header of the copy it keeps), so the
//! common case costs one helper call and no copy; measured, that is cheaper
//! than a tail call into a storing program and than helper stores.
//!
//! IPv6 is told apart by its ethertype before the IPv4 parser runs, and the
//! one program carries both bodies (their keys and entries live in per-CPU
//! working memory, so both fit one stack): no tail call for IPv6, which
//! saves it 2-7 ns per packet of an existing flow. The IPv4 path pays one
//! compare.
//!
//! IPv6 has no header checksum; the TCP/UDP checksum covers the addresses
//! through the pseudo-header ([`crate::rewrite::v6`]).
use crate::{
    ct::{
        cache,
        track::{continued, forward_entry, stale_reply, track, tracked, Source},
    },
    family::{set_backend, Family, Work},
    lb::{choose_backend, counts_flows, frontend_key, lookup_frontend},
    maps::{count, count_denied, count_service},
    packet::{
        ctx::{parse_ipv4, ptr_at},
        set,
        v6::parse6,
        Ipv4Hdr, Kind, Skip, ETH_HLEN, IP_OFFSET_MASK,
    },
    packet::{v6::ETH_P_IPV6_BE, ETH_P_IP_BE},
    prefilter::{note_flow, quiet},
    rewrite::{count_rewritten, Side},
    skb::{drop_counted, ethertype},
    trace::{self, layer},
};
use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    programs::TcContext,
};
use proxy_common::{ct_dir, proto, stat, Addr6Be, FrontendSlot};

/// What the families of the pod path still do their own way.
pub(crate) trait PodFamily: Family {
    /// Where the IP protocol (IPv4) or the first next header (IPv6) lies
    /// in the network header.
    const PROTO_OFFSET: usize;
    /// Parses the packet into `w.flow`. `Ok(None)`: a TCP or UDP packet
    /// (whole, or the first fragment) to go on with; `Ok(Some(action))`: a
    /// packet handled on its own path (a later fragment, an ICMP error
    /// about a translated flow); `Err`: not ours, as the skip says. `dir`
    /// is the direction of the program: `ct_dir::FORWARD` from the pod,
    /// `ct_dir::REPLY` to it.
    fn parse(ctx: &TcContext, w: &mut Work<Self>, dir: u8) -> Result<Option<i32>, Skip>;
    /// The destination address of a packet that is no later fragment,
    /// where the linear data holds it. `None` leaves the decision to the
    /// parse (which pulls in what is not linear): a later fragment of a
    /// datagram that is not ours is still counted (`frag_unknown`).
    fn destination(ctx: &TcContext) -> Option<Self>;
    /// A packet to frontend `svc`, whose backend set is empty: rejected or
    /// dropped ([`crate::reject`]).
    fn reject(ctx: &TcContext, w: &mut Work<Self>, svc: &FrontendSlot) -> i32;
}

impl PodFamily for u32 {
    const PROTO_OFFSET: usize = 9;
    #[inline(always)]
    fn destination(ctx: &TcContext) -> Option<u32> {
        let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN).ok()?;
        // SAFETY: `ptr_at` checked the fixed header lies inside the packet;
        // reads.
        let (frag_off_be, daddr_be) = unsafe { ((*ip).frag_off_be, (*ip).daddr_be) };
        (u16::from_be(frag_off_be) & IP_OFFSET_MASK == 0).then_some(daddr_be)
    }
    #[inline(always)]
    fn parse(ctx: &TcContext, w: &mut Work<u32>, dir: u8) -> Result<Option<i32>, Skip> {
        match parse_ipv4(ctx) {
            Ok(flow) => {
                w.flow = flow;
                Ok(None)
            }
            // Later fragments and ICMP errors of translated flows.
            Err(skip) => crate::frag::unparsed(ctx, w, skip, dir).map(Some),
        }
    }
    #[inline(always)]
    fn reject(ctx: &TcContext, w: &mut Work<u32>, svc: &FrontendSlot) -> i32 {
        crate::reject::from_pod(ctx, w, svc)
    }
}

impl PodFamily for Addr6Be {
    const PROTO_OFFSET: usize = 6;
    #[inline(always)]
    fn destination(ctx: &TcContext) -> Option<Addr6Be> {
        let ip = ptr_at::<[u32; 10]>(ctx, ETH_HLEN).ok()?;
        // SAFETY: `ptr_at` checked the fixed header lies inside the packet;
        // reads, word by word.
        let ip = unsafe { &*ip };
        // TCP or UDP right after the fixed header: no fragment header.
        let next = (u32::from_be(ip[1]) >> 8) as u8;
        (next == proto::TCP || next == proto::UDP).then_some([ip[6], ip[7], ip[8], ip[9]])
    }
    #[inline(always)]
    fn parse(ctx: &TcContext, w: &mut Work<Addr6Be>, dir: u8) -> Result<Option<i32>, Skip> {
        match parse6(ctx, &mut w.flow)? {
            Kind::Flow => Ok(None),
            Kind::Later => crate::frag::later(ctx, w, dir).map(Some),
            Kind::Icmp => crate::icmp::translate(ctx, w, dir).map(Some),
        }
    }
    #[inline(always)]
    fn reject(ctx: &TcContext, w: &mut Work<Addr6Be>, svc: &FrontendSlot) -> i32 {
        crate::reject::from_pod(ctx, w, svc)
    }
}

/// `sb_from_pod`: the family is decided once, here, and a packet to no
/// frontend of either family passes from its header ([`screen`]).
#[inline(always)]
pub fn try_from_pod(ctx: &TcContext) -> Result<i32, Skip> {
    match ethertype(ctx)? {
        ETH_P_IP_BE => {
            let frontend = screen::<u32>(ctx)?;
            from_pod::<u32>(ctx, frontend)
        }
        ETH_P_IPV6_BE => {
            let frontend = screen::<Addr6Be>(ctx)?;
            from_pod::<Addr6Be>(ctx, frontend)
        }
        _ => Err(Skip::NotOurs),
    }
}

/// Every packet of ours from a pod goes to a frontend or to the hairpin
/// address: a new or continued flow, a later fragment of one, an ICMP error
/// about a reply from a frontend. So a destination that is neither is told
/// apart from the header as it lies, before the parse, working memory or
/// any lookup (one bit of the frontend bitmap): `Err(NotOurs)`. `Ok(true)`:
/// the destination may be a frontend (the bitmap's bit is set), and the
/// parse need not ask again; `Ok(false)`: the hairpin address, or a
/// destination the header does not show (a later fragment).
#[inline(always)]
fn screen<A: PodFamily>(ctx: &TcContext) -> Result<bool, Skip> {
    match A::destination(ctx) {
        Some(daddr) if A::maybe_frontend(&daddr) => Ok(true),
        Some(daddr) if !daddr.same(&A::HAIRPIN) => Err(Skip::NotOurs),
        _ => Ok(false),
    }
}

/// `sb_to_pod`: the family is decided once, here; a pod without translated
/// flows of the packet's class receives no reply of one (its connections
/// were balanced by the socket layer, or it made none through a Service).
#[inline(always)]
pub fn try_to_pod(ctx: &TcContext) -> Result<i32, Skip> {
    match ethertype(ctx)? {
        ETH_P_IP_BE => screened_to_pod::<u32>(ctx),
        ETH_P_IPV6_BE => screened_to_pod::<Addr6Be>(ctx),
        _ => Err(Skip::NotOurs),
    }
}

/// [`to_pod`] past the quiet mark of the packet's class, read from its
/// protocol field as it lies (one the linear data does not show counts as
/// any protocol: both classes must be quiet).
#[inline(always)]
fn screened_to_pod<A: PodFamily>(ctx: &TcContext) -> Result<i32, Skip> {
    let proto = match ptr_at::<u8>(ctx, ETH_HLEN + A::PROTO_OFFSET) {
        // SAFETY: `ptr_at` checked the byte lies inside the packet; a read.
        Ok(at) => unsafe { *at },
        Err(_) => 0,
    };
    if quiet(ctx, proto) {
        return Err(Skip::NotOurs);
    }
    Ok(to_pod::<A>(ctx))
}

/// A packet a pod sends, past the [`screen`] (`frontend`: its answer):
/// DNAT to a backend if it is for a frontend.
#[inline(always)]
fn from_pod<A: PodFamily>(ctx: &TcContext, frontend: bool) -> Result<i32, Skip> {
    let Some(w) = A::work() else {
        return Err(Skip::NotOurs);
    };
    if let Some(action) = A::parse(ctx, w, ct_dir::FORWARD)? {
        return Ok(action);
    }
    if !frontend && !A::maybe_frontend(&w.flow.daddr_be) {
        // A pod's reply to a hairpin flow goes to the hairpin address.
        return crate::hairpin::reply(ctx, w);
    }
    // A packet of an existing flow: one lookup, no frontend.
    w.flow.ct_key_into(ct_dir::FORWARD, &mut w.key);
    if let Some(service_id) = continued(w) {
        return Ok(forward(ctx, w, service_id));
    }
    new_flow(ctx, w)
}

/// The first packet of a flow to a frontend (or one whose tracked backend
/// cannot go on): the frontend, its source ranges, a backend, both
/// directions tracked.
#[inline(always)]
fn new_flow<A: PodFamily>(ctx: &TcContext, w: &mut Work<A>) -> Result<i32, Skip> {
    w.fe = frontend_key(w.flow.daddr_be, w.flow.dport_be, w.flow.proto);
    let Some(svc) = lookup_frontend(&w.fe) else {
        // A bitmap collision, or the hairpin address itself.
        return crate::hairpin::reply(ctx, w);
    };
    if !A::source_allowed(&svc, &w.flow.saddr_be) {
        count_denied(svc.service_id);
        trace::denied(layer::TC, &w.flow, svc.service_id);
        return Ok(TC_ACT_SHOT);
    }
    if svc.backend_count == 0 {
        count_service(svc.service_id, |s| s.drops_no_backend += 1);
        trace::no_backend(layer::TC, &w.flow, &svc, crate::reject::rejects(&svc));
        return Ok(A::reject(ctx, w, &svc));
    }
    if tracked(w, svc.service_id) {
        set(&mut w.backend.addr_be, &w.entry.nat_addr_be);
        w.backend.port_be = w.entry.nat_port_be;
    } else {
        set(&mut w.aff.client_addr_be, &w.flow.saddr_be);
        w.aff.service_id = svc.service_id;
        let Some((id, backend)) = choose_backend(w.fe, &svc, A::affinity(), &w.aff) else {
            trace::dropped(layer::TC, stat::DROP_INCONSISTENT, &w.flow, svc.service_id);
            return drop_counted(stat::DROP_INCONSISTENT);
        };
        set_backend(&mut w.backend, &backend);
        let source = match crate::hairpin::is_hairpin(w) {
            true => Source::Hairpin,
            false => Source::Client,
        };
        if track(w, id, svc.service_id, source, counts_flows(&svc)).is_err() {
            // The table is full: the client retransmits.
            trace::dropped(layer::TC, stat::CT_FULL, &w.flow, svc.service_id);
            return drop_counted(stat::CT_FULL);
        }
        // Replies of this flow will come to this pod's interface: any
        // quiet mark of its class is void from here (after the insert, see
        // `note_flow`).
        note_flow(ctx, w.flow.proto);
        trace::new_flow(layer::TC, &w.flow, &w.backend, &svc);
    }
    Ok(forward(ctx, w, svc.service_id))
}

/// A packet of a tracked flow to its backend (`w.backend`): DNAT, or the
/// hairpin's rewrite of both addresses.
#[inline(always)]
fn forward<A: PodFamily>(ctx: &TcContext, w: &mut Work<A>, service_id: u32) -> i32 {
    if crate::hairpin::is_hairpin(w) {
        return crate::hairpin::forward(ctx, w, service_id);
    }
    rewrite(ctx, w, Side::Destination, service_id)
}

/// Writes a decided rewrite of `side` to `w.backend` (remembered first for
/// the later fragments of a first fragment) and counts it; a failed
/// rewrite drops the packet.
#[inline(always)]
fn rewrite<A: PodFamily>(ctx: &TcContext, w: &mut Work<A>, side: Side, service_id: u32) -> i32 {
    if w.flow.first_fragment {
        crate::frag::remember(w, side, service_id);
    }
    if crate::rewrite::rewrite(ctx, &w.flow, side, &w.backend.addr_be, w.backend.port_be).is_err() {
        count(stat::DROP_REWRITE_FAILED);
        return TC_ACT_SHOT;
    }
    count_rewritten(ctx, side, service_id);
    TC_ACT_OK
}

/// A packet going into a pod: a reply of a tracked flow gets the frontend as
/// its source again; anything else passes as its skip says. The action
/// is decided here rather than returned as a `Result`: the compiler packs a
/// `Result` into one register with the action's bits unset on the error
/// paths, and where such a path holds a pointer in that register the
/// verifier refuses the packing's shift.
#[inline(always)]
pub fn to_pod<A: PodFamily>(ctx: &TcContext) -> i32 {
    match reply::<A>(ctx) {
        Ok(action) => action,
        Err(skip) => crate::skb::pass(skip),
    }
}

/// [`to_pod`]'s reply path.
#[inline(always)]
fn reply<A: PodFamily>(ctx: &TcContext) -> Result<i32, Skip> {
    let Some(w) = A::work() else {
        return Err(Skip::NotOurs);
    };
    if let Some(action) = A::parse(ctx, w, ct_dir::REPLY)? {
        return Ok(action);
    }
    w.flow.ct_key_into(ct_dir::REPLY, &mut w.key);
    if let Some(service_id) = cache::hit(w, true) {
        return Ok(rewrite(ctx, w, Side::Source, service_id));
    }
    let Some(entry_ptr) = crate::ct::entry(&w.key) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the conntrack map, valid for this program run;
    // the fields are copied out.
    let (flags, service_id) = unsafe {
        set(&mut w.backend.addr_be, &(*entry_ptr).nat_addr_be);
        w.backend.port_be = (*entry_ptr).nat_port_be;
        ((*entry_ptr).flags, (*entry_ptr).service_id)
    };
    if stale_reply(&w.flow, flags, &w.key) {
        return Err(Skip::NotOurs);
    }
    let Work {
        flow,
        key,
        key2,
        backend,
        ct,
        ..
    } = w;
    let now_ns = crate::ct::note(entry_ptr, flow, true, || {
        let client = (&flow.daddr_be, flow.dport_be);
        forward_entry(flow, client, (&backend.addr_be, backend.port_be), key2)
    });
    cache::fill(key, entry_ptr, flow, *ct, now_ns);
    Ok(rewrite(ctx, w, Side::Source, service_id))
}
