//! switchboard's kernel programs.
//!
//! Two tc (clsact) programs on the host side of every pod veth:
//! - `sb_from_pod` (ingress: packets the pod sends): a packet to a Service
//!   frontend gets a backend (from connection tracking, or picked at random among
//!   the frontend's slots) and its destination rewritten to that backend;
//! - `sb_to_pod` (egress: packets delivered to the pod): a reply from a backend
//!   of a tracked flow gets its source rewritten back to the frontend, so the
//!   client sees the Service address as its peer.
//!
//! Everything that is not ours passes untouched (`TC_ACT_UNSPEC`, so programs
//! after us still run). Truncated packets and fragments are counted and passed;
//! they are never rewritten. A frontend without backends drops and counts.
#![no_std]
#![no_main]

use core::mem::size_of;

use aya_ebpf::{
    bindings::{BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, TC_ACT_OK, TC_ACT_SHOT, TC_ACT_UNSPEC},
    btf_maps::{HashMap, LruHashMap, PerCpuArray},
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns},
    macros::{btf_map, classifier},
    programs::TcContext,
};
use proxy_common::{
    capacity, ct_dir, frontend_flags, proto, stat, AffinityEntry, AffinityKey, Backend, CtEntry,
    CtKey, Frontend, FrontendKey, RevNat, SvcStats,
};

// Map sizes here are defaults; the agent sets the real capacities at load time.
#[btf_map]
static SB_FE_V1: HashMap<FrontendKey, Frontend, { capacity::FRONTENDS as usize }> = HashMap::new();
#[btf_map]
static SB_BE_V1: HashMap<u32, Backend, { capacity::BACKENDS as usize }> = HashMap::new();
#[btf_map]
static SB_CT_V2: LruHashMap<CtKey, CtEntry, { capacity::CONNTRACK as usize }> = LruHashMap::new();
#[btf_map]
static SB_RNAT_V1: HashMap<u32, RevNat, { capacity::SERVICES as usize }> = HashMap::new();
#[btf_map]
static SB_SVC_STATS_V1: PerCpuArray<SvcStats, { capacity::SERVICES as usize }> = PerCpuArray::new();
#[btf_map]
static SB_AFFINITY_V1: LruHashMap<AffinityKey, AffinityEntry, { capacity::AFFINITY as usize }> =
    LruHashMap::new();
#[btf_map]
static SB_STATS_V1: PerCpuArray<u64, { stat::COUNT as usize }> = PerCpuArray::new();

const ETH_HLEN: usize = 14;
const ETH_P_IP_BE: u16 = 0x0800u16.to_be();
const IPV4_MIN_HLEN: usize = 20;
const IP_CSUM_OFF: usize = ETH_HLEN + 10;
const IP_SADDR_OFF: usize = ETH_HLEN + 12;
const IP_DADDR_OFF: usize = ETH_HLEN + 16;
/// More-fragments flag and fragment offset, host order.
const IP_FRAG_MASK: u16 = 0x3fff;
const TCP_HLEN: usize = 20;
const UDP_HLEN: usize = 8;
const TCP_CSUM_OFF: usize = 16;
const UDP_CSUM_OFF: usize = 6;

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

const TCP_FLAG_SYN: u8 = 0x02;
const TCP_FLAG_ACK: u8 = 0x10;

impl Flow {
    /// A TCP SYN without ACK opens a new connection; a UDP datagram has no
    /// connection to keep. Both must reach a backend that is still live.
    #[inline(always)]
    fn needs_live_backend(&self) -> bool {
        self.proto == proto::UDP || self.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK) == TCP_FLAG_SYN
    }
}

/// Why a packet is not rewritten. Each maps to one explicit action.
enum Skip {
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

#[classifier]
pub fn sb_from_pod(ctx: TcContext) -> i32 {
    match try_from_pod(&ctx) {
        Ok(action) => action,
        Err(skip) => pass(skip),
    }
}

#[classifier]
pub fn sb_to_pod(ctx: TcContext) -> i32 {
    match try_to_pod(&ctx) {
        Ok(action) => action,
        Err(skip) => pass(skip),
    }
}

/// Counts why a packet was left alone and lets it continue untouched.
#[inline(always)]
fn pass(skip: Skip) -> i32 {
    count(match skip {
        Skip::NotOurs => stat::PASS_NOT_OURS,
        Skip::Malformed => stat::MALFORMED,
        Skip::Fragment => stat::FRAGMENT,
    });
    TC_ACT_UNSPEC
}

/// Drops a packet, counting why.
#[inline(always)]
fn drop_counted(stat_index: u32) -> Result<i32, Skip> {
    count(stat_index);
    Ok(TC_ACT_SHOT as i32)
}

#[inline(always)]
fn try_from_pod(ctx: &TcContext) -> Result<i32, Skip> {
    let flow = parse(ctx)?;
    let fe_key = FrontendKey {
        addr_be: flow.daddr_be,
        port_be: flow.dport_be,
        proto: flow.proto,
        _pad0: 0,
        slot: 0,
        _pad1: [0; 2],
    };
    // Copy the slot-0 entry out: the agent may rewrite it while we run.
    let svc = match unsafe { SB_FE_V1.get(&fe_key) } {
        Some(svc) => *svc,
        None => return Err(Skip::NotOurs),
    };
    if svc.backend_count == 0 {
        count_service(svc.service_id, |s| s.drops_no_backend += 1);
        return drop_counted(stat::DROP_NO_BACKEND);
    }

    let ct_key = CtKey {
        saddr_be: flow.saddr_be,
        daddr_be: flow.daddr_be,
        sport_be: flow.sport_be,
        dport_be: flow.dport_be,
        proto: flow.proto,
        dir: ct_dir::FORWARD,
        _pad: [0; 2],
    };
    let backend = match tracked_backend(&ct_key, &flow, svc.service_id) {
        Some(backend) => backend,
        None => {
            let Some((id, backend)) = choose_backend(fe_key, &svc, flow.saddr_be) else {
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
        flow.daddr_be,
        backend.addr_be,
        flow.dport_be,
        backend.port_be,
    )
    .is_err()
    {
        return drop_counted(stat::DROP_REWRITE_FAILED);
    }
    let len = ctx.len() as u64;
    count_service(svc.service_id, |s| {
        s.packets += 1;
        s.bytes += len;
    });
    count(stat::FORWARDED);
    Ok(TC_ACT_OK as i32)
}

#[inline(always)]
fn try_to_pod(ctx: &TcContext) -> Result<i32, Skip> {
    let flow = parse(ctx)?;
    let key = CtKey {
        saddr_be: flow.saddr_be,
        daddr_be: flow.daddr_be,
        sport_be: flow.sport_be,
        dport_be: flow.dport_be,
        proto: flow.proto,
        dir: ct_dir::REPLY,
        _pad: [0; 2],
    };
    let service_id = match unsafe { SB_CT_V2.get(&key) } {
        Some(entry) => entry.service_id,
        None => return Err(Skip::NotOurs),
    };
    // The service is gone: its flows are no longer ours to translate.
    let (rnat_addr_be, rnat_port_be) = match unsafe { SB_RNAT_V1.get(&service_id) } {
        Some(rnat) => (rnat.addr_be, rnat.port_be),
        None => return Err(Skip::NotOurs),
    };
    if rewrite(
        ctx,
        &flow,
        Side::Source,
        flow.saddr_be,
        rnat_addr_be,
        flow.sport_be,
        rnat_port_be,
    )
    .is_err()
    {
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
#[inline(always)]
fn tracked_backend(key: &CtKey, flow: &Flow, service_id: u32) -> Option<Backend> {
    let entry = unsafe { SB_CT_V2.get(key) }?;
    let (backend_id, entry_service) = (entry.backend_id, entry.service_id);
    let tracked = Backend {
        addr_be: entry.backend_addr_be,
        port_be: entry.backend_port_be,
        proto: flow.proto,
        flags: 0,
    };
    if entry_service != service_id {
        return None;
    }
    if !flow.needs_live_backend() {
        return Some(tracked);
    }
    match unsafe { SB_BE_V1.get(&backend_id) } {
        Some(live) if live.addr_be == tracked.addr_be && live.port_be == tracked.port_be => {
            Some(tracked)
        }
        _ => {
            count(stat::CT_RESELECTED);
            None
        }
    }
}

/// The backend for a new flow: the client's affinity backend when the
/// frontend has `sessionAffinity: ClientIP` and it is still valid, else one
/// picked at random (and remembered for affinity).
#[inline(always)]
fn choose_backend(key: FrontendKey, svc: &Frontend, client_be: u32) -> Option<(u32, Backend)> {
    if svc.flags & frontend_flags::AFFINITY_CLIENT_IP == 0 {
        return pick_backend(key, svc).map(|(id, backend, _)| (id, backend));
    }
    let affinity_key = AffinityKey {
        client_addr_be: client_be,
        service_id: svc.service_id,
    };
    let now = unsafe { bpf_ktime_get_ns() };
    let (id, backend, slot) = match affinity_backend(key, svc, &affinity_key, now) {
        Some(found) => {
            count(stat::AFFINITY_HIT);
            found
        }
        None => pick_backend(key, svc)?,
    };
    let entry = AffinityEntry {
        backend_id: id,
        slot,
        _pad: [0; 2],
        last_used_ns: now,
    };
    // LRU: an insert evicts rather than fails; a failure only costs affinity.
    if SB_AFFINITY_V1.insert(&affinity_key, &entry, 0).is_err() {
        count(stat::CT_INSERT_FAILED);
    }
    Some((id, backend))
}

/// The client's remembered backend, if it has not timed out and its slot
/// still names it (a backend that left the service is never reused).
#[inline(always)]
fn affinity_backend(
    mut key: FrontendKey,
    svc: &Frontend,
    affinity_key: &AffinityKey,
    now: u64,
) -> Option<(u32, Backend, u16)> {
    let entry = unsafe { SB_AFFINITY_V1.get(affinity_key) }?;
    let (backend_id, slot, last_used_ns) = (entry.backend_id, entry.slot, entry.last_used_ns);
    let timeout_ns = u64::from(svc.affinity_timeout_s) * 1_000_000_000;
    if now.wrapping_sub(last_used_ns) > timeout_ns || slot == 0 || slot > svc.backend_count {
        return None;
    }
    key.slot = slot;
    if unsafe { SB_FE_V1.get(&key) }?.backend_id != backend_id {
        return None;
    }
    let backend = unsafe { SB_BE_V1.get(&backend_id) }?;
    Some((backend_id, *backend, slot))
}

/// Picks a backend at random among the frontend's slots `1..=backend_count`.
#[inline(always)]
fn pick_backend(mut key: FrontendKey, svc: &Frontend) -> Option<(u32, Backend, u16)> {
    let count = u32::from(svc.backend_count).min(u32::from(capacity::MAX_BACKENDS_PER_SERVICE));
    let random = unsafe { bpf_get_prandom_u32() };
    key.slot = (random % count) as u16 + 1;
    let backend_id = unsafe { SB_FE_V1.get(&key) }?.backend_id;
    let backend = unsafe { SB_BE_V1.get(&backend_id) }?;
    Some((backend_id, *backend, key.slot))
}

/// Records both directions of a new flow. A failed insert is counted; the
/// packet is still forwarded (the next packet of the flow picks again).
#[inline(always)]
fn track(fwd: &CtKey, flow: &Flow, backend_id: u32, backend: &Backend, service_id: u32) {
    let entry = CtEntry {
        backend_id,
        service_id,
        backend_addr_be: backend.addr_be,
        backend_port_be: backend.port_be,
        _pad: [0; 2],
        created_ns: unsafe { bpf_ktime_get_ns() },
    };
    let reply = CtKey {
        saddr_be: backend.addr_be,
        daddr_be: flow.saddr_be,
        sport_be: backend.port_be,
        dport_be: flow.sport_be,
        proto: flow.proto,
        dir: ct_dir::REPLY,
        _pad: [0; 2],
    };
    let inserted =
        SB_CT_V2.insert(fwd, &entry, 0).is_ok() && SB_CT_V2.insert(&reply, &entry, 0).is_ok();
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
    let ethertype = unsafe { *ptr_at::<u16>(ctx, 12)? };
    if ethertype != ETH_P_IP_BE {
        return Err(Skip::NotOurs);
    }
    ensure_linear(ctx, ETH_HLEN + IPV4_MIN_HLEN)?;
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
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
    let (sport_be, dport_be) = unsafe { ((*ports)[0], (*ports)[1]) };
    let tcp_flags = if ip_proto == proto::TCP {
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

/// Rewrites one address and port of the packet, fixing the IPv4 header checksum
/// and the TCP/UDP checksum (pseudo-header included). A UDP checksum of zero
/// ("none") stays zero.
#[inline(always)]
fn rewrite(
    ctx: &TcContext,
    flow: &Flow,
    side: Side,
    old_addr_be: u32,
    new_addr_be: u32,
    old_port_be: u16,
    new_port_be: u16,
) -> Result<(), i64> {
    let (csum_off, l4_flags) = if flow.proto == proto::TCP {
        (flow.l4_off + TCP_CSUM_OFF, 0)
    } else {
        (flow.l4_off + UDP_CSUM_OFF, u64::from(BPF_F_MARK_MANGLED_0))
    };
    let (addr_off, port_off) = match side {
        Side::Source => (IP_SADDR_OFF, flow.l4_off),
        Side::Destination => (IP_DADDR_OFF, flow.l4_off + 2),
    };
    if old_addr_be != new_addr_be {
        ctx.l4_csum_replace(
            csum_off,
            u64::from(old_addr_be),
            u64::from(new_addr_be),
            u64::from(BPF_F_PSEUDO_HDR) | l4_flags | 4,
        )?;
        ctx.l3_csum_replace(
            IP_CSUM_OFF,
            u64::from(old_addr_be),
            u64::from(new_addr_be),
            4,
        )?;
        ctx.store(addr_off, &new_addr_be, 0)?;
    }
    if old_port_be != new_port_be {
        ctx.l4_csum_replace(
            csum_off,
            u64::from(old_port_be),
            u64::from(new_port_be),
            l4_flags | 2,
        )?;
        ctx.store(port_off, &new_port_be, 0)?;
    }
    Ok(())
}

#[inline(always)]
fn count(index: u32) {
    if let Some(counter) = SB_STATS_V1.get_ptr_mut(index) {
        // Per-CPU slot: no other writer while we run on this CPU.
        unsafe { *counter += 1 };
    }
}

#[inline(always)]
fn count_service(service_id: u32, update: impl FnOnce(&mut SvcStats)) {
    if let Some(stats) = SB_SVC_STATS_V1.get_ptr_mut(service_id) {
        update(unsafe { &mut *stats });
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
