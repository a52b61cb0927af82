//! Connection tracking of a flow on the tc and XDP paths, for both
//! families: the tracked backend of a flow (with its state noted and a
//! closing flow marked), and the two entries a new flow writes. Everything
//! works in the family's [`Work`]: the packet's key in `w.key`, the entry
//! found or written in `w.entry`, the other direction's key in `w.key2`.
use crate::{
    ct::{cache, Entry as _},
    family::{Family, Work},
    lb::backend_is_live,
    maps::{count, count_service},
    packet::{set, set_ct_tail, FlowOf},
};
use proxy_common::{ct_dir, ct_flags, stat, CtEntryOf, CtKeyOf};

/// Looks up `w.key` and copies its entry to `w.entry`; the map's own
/// entry is returned, for the notes of this packet.
#[inline(always)]
fn lookup<A: Family>(w: &mut Work<A>) -> Option<*mut CtEntryOf<A>> {
    let entry_ptr = super::entry(&w.key)?;
    copy_entry(entry_ptr, &mut w.entry);
    Some(entry_ptr)
}

/// Copies the conntrack entry at `entry_ptr` to `to` (working memory).
/// A plain assignment between two pointers that may overlap becomes a
/// call to `memmove`, a byte loop on BPF; these two never overlap, so the
/// copy is a few loads and stores.
#[inline(always)]
pub(crate) fn copy_entry<A: Family>(entry_ptr: *const CtEntryOf<A>, to: &mut CtEntryOf<A>) {
    // SAFETY: `entry_ptr` is a value of the conntrack map, valid for this
    // program run; `to` is in the per-CPU working memory, another map:
    // they do not overlap.
    unsafe { core::ptr::copy_nonoverlapping(entry_ptr, to, 1) };
}

/// Whether the backend in `w.entry` is still live (for a flow that needs
/// one: a new connection, or UDP).
#[inline(always)]
fn backend_live<A: Family>(w: &Work<A>) -> bool {
    let e = &w.entry;
    !w.flow.needs_live_backend() || backend_is_live(e.backend_id, e.nat_addr_be, e.nat_port_be)
}

/// Notes the packet in its forward entry `entry_ptr` (copied in
/// `w.entry`); a FIN or RST also marks the reply entry closing.
#[inline(always)]
fn note_forward<A: Family>(w: &mut Work<A>, entry_ptr: *mut CtEntryOf<A>) {
    let Work {
        flow, entry, key2, ..
    } = w;
    crate::ct::note(entry_ptr, flow, false, || {
        reply_key_of(flow, entry, key2);
        super::entry(key2)
    });
}

/// The backend an existing flow was given, if the flow of `w.key`
/// (forward) is tracked and belongs to this service: then `w.entry` holds
/// its entry. An established TCP connection keeps its backend even after
/// the endpoint left the service (it drains, as under kube-proxy). A new
/// connection or a UDP datagram whose tracked backend has gone (or whose id
/// now names another address) gets a new one, counted: a deleted pod never
/// black-holes a reused port or a long-lived UDP "flow" such as DNS.
///
/// A SYN on the ports of a connection that has closed starts a new flow; a
/// FIN or RST marks both entries of the flow as closing.
#[inline(always)]
pub(crate) fn tracked<A: Family>(w: &mut Work<A>, service_id: u32) -> bool {
    let Some(entry_ptr) = lookup(w) else {
        return false;
    };
    let closed = w.flow.opens_connection() && w.entry.flags & ct_flags::CLOSING != 0;
    if w.entry.service_id != service_id || closed {
        ends(entry_ptr);
        return false;
    }
    note_forward(w, entry_ptr);
    if backend_live(w) {
        return true;
    }
    ends(entry_ptr);
    count(stat::CT_RESELECTED);
    false
}

/// The tracked flow of forward entry `entry_ptr` ends: a new flow's entries
/// replace its own, so it leaves its backend's open flows if it counts
/// there (a closed flow has left them already).
#[inline(always)]
fn ends<A: Family>(entry_ptr: *mut CtEntryOf<A>) {
    // SAFETY: a value the conntrack lookup just returned, valid for this
    // program run.
    unsafe { CtEntryOf::<A>::uncount(entry_ptr) };
}

/// The service of the tracked flow the packet of `w.key` (forward)
/// continues, found with one lookup and no frontend (for an established
/// TCP segment, in this CPU's flow cache first: [`cache`]): a TCP segment
/// past the SYN, or a UDP datagram whose backend is still live. Then `w.backend`
/// holds its backend's address and port (only they are copied out: this is
/// every packet's path). A SYN, a flow not tracked, or a UDP flow whose
/// backend left takes the new-flow path (frontend, source ranges, a live
/// backend). The entry is trusted as conntrack is under kube-proxy: the
/// agent removes the entries of a Service that is deleted (and of a UDP
/// backend that leaves).
#[inline(always)]
pub(crate) fn continued<A: Family>(w: &mut Work<A>) -> Option<u32> {
    if w.flow.opens_connection() {
        return None;
    }
    if let Some(service_id) = cache::hit(w, false) {
        return Some(service_id);
    }
    let entry_ptr = super::entry(&w.key)?;
    // SAFETY: a value of the conntrack map, valid for this program run;
    // read in place, the reference unused once the note below writes.
    let (backend_id, service_id) = unsafe {
        let entry = &*entry_ptr;
        set(&mut w.backend.addr_be, &entry.nat_addr_be);
        w.backend.port_be = entry.nat_port_be;
        (entry.backend_id, entry.service_id)
    };
    if w.flow.needs_live_backend()
        && !backend_is_live(backend_id, w.backend.addr_be, w.backend.port_be)
    {
        return None;
    }
    let Work {
        flow,
        key,
        key2,
        ct,
        ..
    } = w;
    let now_ns = crate::ct::note(entry_ptr, flow, false, || {
        // SAFETY: as above; a new reference after the note's writes.
        reply_key_of(flow, unsafe { &*entry_ptr }, key2);
        super::entry(key2)
    });
    cache::fill(key, entry_ptr, flow, *ct, now_ns);
    Some(service_id)
}

/// Whether the flow of `w.key` (forward) is tracked: then the packet is
/// noted in its entry (copied to `w.entry`), with no check of its backend
/// (a flow whose balancing node chose the backend, [`Source::Arrived`]).
#[inline(always)]
pub(crate) fn noted<A: Family>(w: &mut Work<A>) -> bool {
    let Some(entry_ptr) = lookup(w) else {
        return false;
    };
    note_forward(w, entry_ptr);
    true
}

/// As [`continued`], with the whole forward entry copied to `w.entry`: the
/// uplink's one lookup for a packet of an existing flow from outside (it
/// needs the entry's source NAT too), before any frontend lookup.
#[inline(always)]
pub(crate) fn continued_entry<A: Family>(w: &mut Work<A>) -> Option<u32> {
    if w.flow.opens_connection() {
        return None;
    }
    let entry_ptr = lookup(w)?;
    if !backend_live(w) {
        return None;
    }
    note_forward(w, entry_ptr);
    Some(w.entry.service_id)
}

/// Writes to `key` the reply key of a tracked flow from its forward entry:
/// replies of a source-NATed flow come back to the node's address and port.
#[inline(always)]
pub(crate) fn reply_key_of<A: Family>(
    flow: &FlowOf<A>,
    forward: &CtEntryOf<A>,
    key: &mut CtKeyOf<A>,
) {
    let dport_be = if forward.flags & ct_flags::SNAT != 0 {
        set(&mut key.daddr_be, &forward.snat_addr_be);
        forward.snat_port_be
    } else {
        set(&mut key.daddr_be, &flow.saddr_be);
        flow.sport_be
    };
    set(&mut key.saddr_be, &forward.nat_addr_be);
    set_ct_tail(
        key,
        forward.nat_port_be,
        dport_be,
        flow.proto,
        ct_dir::REPLY,
    );
}

/// Whether the reply `flow` found under `key` (its entry's `flags`) is a
/// server accepting a connection on ports whose flow has closed: then they
/// were reused by a connection that did not go through us, and the stale
/// entry is removed (counted `ct_stale`).
#[inline(always)]
pub(crate) fn stale_reply<A: Family>(flow: &FlowOf<A>, flags: u8, key: &CtKeyOf<A>) -> bool {
    if !flow.accepts_connection() || flags & ct_flags::CLOSING == 0 {
        return false;
    }
    if super::remove::<A>(key) {
        count(stat::CT_STALE);
    }
    true
}

/// The forward entry of a tracked flow seen from its reply: the entry of
/// `src → dst` in the protocol of `flow`, its key built in `key`.
#[inline(always)]
pub(crate) fn forward_entry<A: Family>(
    flow: &FlowOf<A>,
    src: (&A, u16),
    dst: (&A, u16),
    key: &mut CtKeyOf<A>,
) -> Option<*mut CtEntryOf<A>> {
    set(&mut key.saddr_be, src.0);
    set(&mut key.daddr_be, dst.0);
    set_ct_tail(key, src.1, dst.1, flow.proto, ct_dir::FORWARD);
    super::entry(key)
}

/// The table was full: a new flow was not tracked, and its packet must be
/// dropped (counted `stat::CT_FULL` by the caller).
pub(crate) struct TableFull;

/// Whose source a new flow's packets get, and who sees its replies.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The client's own (DNAT only).
    Client,
    /// The hairpin address, the client's port ([`crate::hairpin`]).
    Hairpin,
    /// The client's own, to a backend on another node that answers the
    /// client itself: this node sees no reply ([`ct_flags::DSR_BALANCED`]).
    Direct,
    /// The client's own, balanced by another node to a backend here
    /// ([`ct_flags::DSR_ARRIVED`]; `w.flow` names the frontend).
    Arrived,
}

impl Source {
    /// The flags of the new flow's entries.
    #[inline(always)]
    fn flags(self) -> u8 {
        match self {
            Source::Client => 0,
            Source::Hairpin => ct_flags::SNAT,
            Source::Direct => ct_flags::DSR_BALANCED,
            Source::Arrived => ct_flags::DSR_ARRIVED,
        }
    }
}

/// Records both directions of a new flow of `w.flow` (`w.key` forward) to
/// the backend in `w.backend`: the forward entry names the backend, the
/// reply entry the frontend the reply must come from (and, for a hairpin
/// flow, the client the destination is restored to). A full table is the
/// caller's to act on ([`TableFull`]: drop); any other failed insert is
/// counted and the packet still forwarded (the next packet picks again).
/// `counted`: the flow is one of its backend's open flows
/// ([`ct_flags::COUNTED`], least-connection frontends).
#[inline(always)]
pub(crate) fn track<A: Family>(
    w: &mut Work<A>,
    backend_id: u32,
    service_id: u32,
    source: Source,
    counted: bool,
) -> Result<(), TableFull> {
    let now = crate::ct::now_ns();
    let flow = &w.flow;
    let (snat, reply_to, reply_snat) = match source {
        Source::Client | Source::Direct | Source::Arrived => {
            ((A::ZERO, 0), (flow.saddr_be, flow.sport_be), (A::ZERO, 0))
        }
        Source::Hairpin => (
            (A::HAIRPIN, flow.sport_be),
            (A::HAIRPIN, flow.sport_be),
            (flow.saddr_be, flow.sport_be),
        ),
    };
    let e = &mut w.entry;
    e.backend_id = backend_id;
    e.service_id = service_id;
    set(&mut e.nat_addr_be, &w.backend.addr_be);
    e.nat_port_be = w.backend.port_be;
    e.flags = source.flags() | if counted { ct_flags::COUNTED } else { 0 };
    e.state = 0;
    (e.snat_addr_be, e.snat_port_be) = snat;
    e._pad2 = [0; 2];
    e.created_ns = now;
    e.last_seen_ns = now;
    let k = &mut w.key2;
    set(&mut k.saddr_be, &w.backend.addr_be);
    let (reply_addr_be, reply_port_be) = reply_to;
    set(&mut k.daddr_be, &reply_addr_be);
    set_ct_tail(
        k,
        w.backend.port_be,
        reply_port_be,
        flow.proto,
        ct_dir::REPLY,
    );
    tracked_outcome(
        crate::ct::insert_pair(
            &w.key,
            &w.key2,
            &mut w.entry,
            (flow.daddr_be, flow.dport_be),
            reply_snat,
        ),
        service_id,
    )
}

/// Counts the outcome of a new flow's inserts.
#[inline(always)]
pub(crate) fn tracked_outcome(
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
