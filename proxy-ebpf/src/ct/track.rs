//! Connection tracking of an IPv4 flow on the tc and XDP paths: the tracked
//! backend of a flow (with its state noted and a closing flow marked), and
//! the two entries a new flow writes.
use crate::{
    lb::backend_is_live,
    maps::{count, count_service, SB_CT_V5},
    packet::Flow,
};
use proxy_common::{ct_dir, ct_flags, stat, Backend, CtEntry, CtKey};
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

/// The entry of a packet that continues a tracked flow, found with one
/// lookup and no frontend: a TCP segment past the SYN, or a UDP datagram
/// whose backend is still live. A SYN, a flow not tracked, or a UDP flow
/// whose backend left returns `None`, and the packet takes the new-flow
/// path (frontend, source ranges, a live backend). The entry is trusted as
/// conntrack is under kube-proxy: the agent removes the entries of a
/// Service that is deleted (and of a UDP backend that leaves).
#[inline(always)]
pub(crate) fn continued_entry(key: &CtKey, flow: &Flow) -> Option<CtEntry> {
    if flow.opens_connection() {
        return None;
    }
    let entry_ptr = SB_CT_V5.get_ptr_mut(key)?;
    // SAFETY: a value of the conntrack map, valid for this program run; copied out.
    let entry = unsafe { *entry_ptr };
    if flow.needs_live_backend()
        && !backend_is_live(entry.backend_id, entry.nat_addr_be, entry.nat_port_be)
    {
        return None;
    }
    crate::ct::note(entry_ptr, flow, false, || {
        SB_CT_V5.get_ptr_mut(reply_key_of(flow, &entry))
    });
    Some(entry)
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
    crate::ct::note(entry_ptr, flow, false, || {
        SB_CT_V5.get_ptr_mut(reply_key_of(flow, &entry))
    });
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
pub(crate) fn reply_key_of(flow: &Flow, forward: &CtEntry) -> CtKey {
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
