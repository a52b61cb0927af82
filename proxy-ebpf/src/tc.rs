//! The tc layer: DNAT of packets a pod sends to a frontend, and the reverse of
//! it on the replies, with connection tracking in between.
//!
//! Per packet of an existing flow this is one frontend lookup, one
//! connection-tracking lookup, and at most four helper calls: one store of
//! both addresses with the IPv4 checksum computed here, one of the port, and
//! two L4 checksum updates (the kernel must do those: only it knows whether
//! the skb carries a full checksum or a partial one to be finished by the
//! device, `CHECKSUM_PARTIAL`). A reply is one lookup: its connection-tracking
//! entry carries the frontend address.
use core::mem::size_of;

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, TC_ACT_OK, TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::bpf_ktime_get_ns,
    programs::TcContext,
};
use proxy_common::{ct_dir, ct_flags, proto, stat, AffinityKey, Backend, CtEntry, CtKey};

use crate::{
    lb::{backend_is_live, choose_backend, frontend_key, lookup_frontend},
    maps::{count, count_service, SB_AFFINITY_V1, SB_CT_V3},
};

const ETH_HLEN: usize = 14;
const ETH_P_IP_BE: u16 = 0x0800u16.to_be();
const IPV4_MIN_HLEN: usize = 20;
const IP_CSUM_OFF: usize = ETH_HLEN + 10;
/// More-fragments flag and fragment offset, host order.
const IP_FRAG_MASK: u16 = 0x3fff;
const TCP_HLEN: usize = 20;
const UDP_HLEN: usize = 8;
const TCP_CSUM_OFF: usize = 16;
const UDP_CSUM_OFF: usize = 6;
const TCP_FLAG_FIN: u8 = 0x01;
const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_RST: u8 = 0x04;
const TCP_FLAG_ACK: u8 = 0x10;

/// The fixed part of an IPv4 header, as laid out on the wire.
#[repr(C)]
struct Ipv4Hdr {
    version_ihl: u8,
    tos: u8,
    tot_len_be: u16,
    id_be: u16,
    frag_off_be: u16,
    ttl: u8,
    proto: u8,
    csum_be: u16,
    saddr_be: u32,
    daddr_be: u32,
}

/// The addresses and ports of one TCP or UDP packet.
struct Flow {
    saddr_be: u32,
    daddr_be: u32,
    sport_be: u16,
    dport_be: u16,
    proto: u8,
    /// TCP flags byte (0 for UDP).
    tcp_flags: u8,
    /// Offset of the TCP/UDP header from the start of the frame.
    l4_off: usize,
}

impl Flow {
    /// A TCP SYN without ACK opens a new connection; a UDP datagram has no
    /// connection to keep. Both must reach a backend that is still live.
    #[inline(always)]
    fn needs_live_backend(&self) -> bool {
        self.proto == proto::UDP || self.opens_connection()
    }

    /// A TCP SYN without ACK: a client opening a connection.
    #[inline(always)]
    fn opens_connection(&self) -> bool {
        self.proto == proto::TCP && self.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) == TCP_FLAG_SYN
    }

    /// A TCP SYN-ACK: a server accepting a connection.
    #[inline(always)]
    fn accepts_connection(&self) -> bool {
        let both = TCP_FLAG_SYN | TCP_FLAG_ACK;
        self.proto == proto::TCP && self.tcp_flags & both == both
    }

    /// A TCP FIN or RST: the connection is ending.
    #[inline(always)]
    fn ends_connection(&self) -> bool {
        self.proto == proto::TCP && self.tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST) != 0
    }

    #[inline(always)]
    fn ct_key(&self, dir: u8) -> CtKey {
        CtKey {
            saddr_be: self.saddr_be,
            daddr_be: self.daddr_be,
            sport_be: self.sport_be,
            dport_be: self.dport_be,
            proto: self.proto,
            dir,
            _pad: [0; 2],
        }
    }
}

/// Why a packet is not rewritten. Each maps to one explicit action.
pub enum Skip {
    /// Not IPv4 TCP/UDP, or not a frontend / tracked reply.
    NotOurs,
    /// Shorter than the headers it announces.
    Malformed,
    /// An IPv4 fragment: no ports to look up in it.
    Fragment,
}

/// Which side of the packet a rewrite touches.
#[derive(Clone, Copy)]
enum Side {
    Source,
    Destination,
}

/// A rewrite helper failed half-way; the packet must not go on.
struct RewriteFailed;

/// Lets a packet we leave alone continue untouched, counting only the odd
/// ones: counting every packet of the node would cost each a map update.
#[inline(always)]
pub fn pass(skip: Skip) -> i32 {
    match skip {
        Skip::NotOurs => {}
        Skip::Malformed => count(stat::MALFORMED),
        Skip::Fragment => count(stat::FRAGMENT),
    }
    TC_ACT_UNSPEC
}

/// Drops a packet, counting why.
#[inline(always)]
fn drop_counted(stat_index: u32) -> Result<i32, Skip> {
    count(stat_index);
    Ok(TC_ACT_SHOT as i32)
}

/// A packet a pod sends: DNAT to a backend if it is for a frontend.
#[inline(always)]
pub fn try_from_pod(ctx: &TcContext) -> Result<i32, Skip> {
    let flow = parse(ctx)?;
    let fe_key = frontend_key(flow.daddr_be, flow.dport_be, flow.proto);
    let Some(svc) = lookup_frontend(&fe_key) else {
        return Err(Skip::NotOurs);
    };
    if svc.backend_count == 0 {
        count_service(svc.service_id, |s| s.drops_no_backend += 1);
        return drop_counted(stat::DROP_NO_BACKEND);
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
            track(&ct_key, &flow, id, &backend, svc.service_id);
            backend
        }
    };

    if rewrite(
        ctx,
        &flow,
        Side::Destination,
        backend.addr_be,
        backend.port_be,
    )
    .is_err()
    {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    let len = u64::from(ctx.len());
    count_service(svc.service_id, |s| {
        s.packets += 1;
        s.bytes += len;
    });
    count(stat::FORWARDED);
    Ok(TC_ACT_OK as i32)
}

/// A packet going into a pod: a reply of a tracked flow gets the frontend as
/// its source again.
#[inline(always)]
pub fn try_to_pod(ctx: &TcContext) -> Result<i32, Skip> {
    let flow = parse(ctx)?;
    let key = flow.ct_key(ct_dir::REPLY);
    let Some(entry_ptr) = SB_CT_V3.get_ptr_mut(&key) else {
        return Err(Skip::NotOurs);
    };
    // SAFETY: a value of the LRU map, valid for this program run; copied out.
    let entry = unsafe { *entry_ptr };
    let (nat_addr_be, nat_port_be) = (entry.nat_addr_be, entry.nat_port_be);
    if flow.accepts_connection() && entry.flags & ct_flags::CLOSING != 0 {
        // The flow this entry was made for has closed and its ports were
        // reused by a connection that did not go through the frontend.
        if SB_CT_V3.remove(&key).is_ok() {
            count(stat::CT_STALE);
        }
        return Err(Skip::NotOurs);
    }
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
        if let Some(forward_ptr) = SB_CT_V3.get_ptr_mut(&forward) {
            mark_closing(forward_ptr);
        }
    }
    if rewrite(ctx, &flow, Side::Source, nat_addr_be, nat_port_be).is_err() {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    count(stat::REVERSED);
    Ok(TC_ACT_OK as i32)
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
fn tracked_backend(key: &CtKey, flow: &Flow, service_id: u32) -> Option<Backend> {
    let entry_ptr = SB_CT_V3.get_ptr_mut(key)?;
    // SAFETY: a value of the LRU map, valid for this program run; copied out.
    let entry = unsafe { *entry_ptr };
    let tracked = Backend {
        addr_be: entry.nat_addr_be,
        port_be: entry.nat_port_be,
        proto: flow.proto,
        flags: 0,
    };
    if entry.service_id != service_id {
        return None;
    }
    if flow.opens_connection() && entry.flags & ct_flags::CLOSING != 0 {
        return None;
    }
    if flow.ends_connection() {
        mark_closing(entry_ptr);
        if let Some(reply_ptr) = SB_CT_V3.get_ptr_mut(reply_key(flow, &tracked)) {
            mark_closing(reply_ptr);
        }
    }
    if !flow.needs_live_backend()
        || backend_is_live(entry.backend_id, tracked.addr_be, tracked.port_be)
    {
        return Some(tracked);
    }
    count(stat::CT_RESELECTED);
    None
}

/// Marks a connection-tracking entry as belonging to a closing connection.
#[inline(always)]
fn mark_closing(entry: *mut CtEntry) {
    // SAFETY: a value pointer the map lookup just returned, valid for this
    // program run; the only concurrent writes set the same bit.
    unsafe { (*entry).flags |= ct_flags::CLOSING };
}

/// The key a backend's replies to this flow are looked up with.
#[inline(always)]
fn reply_key(flow: &Flow, backend: &Backend) -> CtKey {
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

/// Records both directions of a new flow: the forward entry names the backend,
/// the reply entry the frontend the reply must come from. A failed insert is
/// counted; the packet is still forwarded (the next packet picks again).
#[inline(always)]
fn track(fwd: &CtKey, flow: &Flow, backend_id: u32, backend: &Backend, service_id: u32) {
    // SAFETY: a helper without preconditions.
    let created_ns = unsafe { bpf_ktime_get_ns() };
    let forward = CtEntry {
        backend_id,
        service_id,
        nat_addr_be: backend.addr_be,
        nat_port_be: backend.port_be,
        flags: 0,
        _pad: 0,
        created_ns,
    };
    let reply = CtEntry {
        nat_addr_be: flow.daddr_be,
        nat_port_be: flow.dport_be,
        ..forward
    };
    let inserted = SB_CT_V3.insert(fwd, &forward, 0).is_ok()
        && SB_CT_V3.insert(reply_key(flow, backend), &reply, 0).is_ok();
    if inserted {
        count_service(service_id, |s| s.new_flows += 1);
    } else {
        count(stat::CT_INSERT_FAILED);
    }
}

/// Makes sure the first `len` bytes of the frame are in the linear area,
/// pulling them in if the packet is long enough but not linear.
#[inline(always)]
fn ensure_linear(ctx: &TcContext, len: usize) -> Result<(), Skip> {
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
fn ptr_at<T>(ctx: &TcContext, off: usize) -> Result<*const T, Skip> {
    let start = ctx.data();
    if start + off + size_of::<T>() > ctx.data_end() {
        return Err(Skip::Malformed);
    }
    Ok((start + off) as *const T)
}

#[inline(always)]
fn parse(ctx: &TcContext) -> Result<Flow, Skip> {
    if (ctx.len() as usize) < ETH_HLEN + 2 {
        return Err(Skip::NotOurs);
    }
    ensure_linear(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the two bytes lie inside the packet.
    let ethertype = unsafe { *ptr_at::<u16>(ctx, 12)? };
    if ethertype != ETH_P_IP_BE {
        return Err(Skip::NotOurs);
    }
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
        _ => return Err(Skip::NotOurs),
    };
    if version_ihl >> 4 != 4 {
        return Err(Skip::Malformed);
    }
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    if ihl < IPV4_MIN_HLEN {
        return Err(Skip::Malformed);
    }
    if u16::from_be(frag_off_be) & IP_FRAG_MASK != 0 {
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
    })
}

/// The IPv4 header checksum after a 32-bit field changed from `old` to `new`
/// (RFC 1624, eqn. 3). All values as they are in the packet: one's-complement
/// sums do not depend on byte order as long as every word uses the same.
#[inline(always)]
fn csum_replace4(csum: u16, old: u32, new: u32) -> u16 {
    let mut sum = u32::from(!csum);
    sum += (!old >> 16) + (!old & 0xffff);
    sum += (new >> 16) + (new & 0xffff);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// Rewrites one address and port of the packet.
///
/// Every write goes through a helper, never a direct packet store: a program
/// that stores into the packet directly makes the verifier unclone every
/// cloned skb it sees on entry, which would copy the headers of every TCP
/// segment a pod sends (TCP transmits clones), ours or not. The helpers make
/// only the packets we rewrite writable.
///
/// The IPv4 header checksum is computed here and written in the same store as
/// both addresses (bytes 10..20 of the header: one helper call for the whole
/// L3 change); the TCP/UDP checksum goes through the kernel's helper, which
/// updates the pseudo-header sum of a `CHECKSUM_PARTIAL` skb correctly. A UDP
/// checksum of zero ("none") stays zero.
#[inline(always)]
fn rewrite(
    ctx: &TcContext,
    flow: &Flow,
    side: Side,
    new_addr_be: u32,
    new_port_be: u16,
) -> Result<(), RewriteFailed> {
    let (old_addr_be, old_port_be, port_off) = match side {
        Side::Source => (flow.saddr_be, flow.sport_be, flow.l4_off),
        Side::Destination => (flow.daddr_be, flow.dport_be, flow.l4_off + 2),
    };
    let (csum_off, l4_flags) = if flow.proto == proto::TCP {
        (flow.l4_off + TCP_CSUM_OFF, 0)
    } else {
        (flow.l4_off + UDP_CSUM_OFF, u64::from(BPF_F_MARK_MANGLED_0))
    };
    if old_addr_be != new_addr_be {
        let csum_ptr = ptr_at::<u16>(ctx, IP_CSUM_OFF).map_err(|_| RewriteFailed)?;
        // SAFETY: `ptr_at` checked the field lies inside the packet; a read.
        let old_csum = unsafe { *csum_ptr };
        let (saddr_be, daddr_be) = match side {
            Side::Source => (new_addr_be, flow.daddr_be),
            Side::Destination => (flow.saddr_be, new_addr_be),
        };
        let csum = csum_replace4(old_csum, old_addr_be, new_addr_be).to_ne_bytes();
        let (s, d) = (saddr_be.to_ne_bytes(), daddr_be.to_ne_bytes());
        let l3: [u8; 10] = [
            csum[0], csum[1], s[0], s[1], s[2], s[3], d[0], d[1], d[2], d[3],
        ];
        ctx.store(IP_CSUM_OFF, &l3, 0).map_err(|_| RewriteFailed)?;
        ctx.l4_csum_replace(
            csum_off,
            u64::from(old_addr_be),
            u64::from(new_addr_be),
            u64::from(BPF_F_PSEUDO_HDR) | l4_flags | 4,
        )
        .map_err(|_| RewriteFailed)?;
    }
    if old_port_be != new_port_be {
        ctx.store(port_off, &new_port_be, 0)
            .map_err(|_| RewriteFailed)?;
        ctx.l4_csum_replace(
            csum_off,
            u64::from(old_port_be),
            u64::from(new_port_be),
            l4_flags | 2,
        )
        .map_err(|_| RewriteFailed)?;
    }
    Ok(())
}
