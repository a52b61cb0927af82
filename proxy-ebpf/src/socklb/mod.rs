//! The socket layer: cgroup hooks that balance a socket once, when it connects
//! (or, for unconnected UDP, when it sends), so its packets need no per-packet
//! NAT at all. `recvmsg` and `getpeername` show the frontend again.
//!
//! Both families share the logic, generic over the address type ([`SockFamily`]:
//! `u32` for IPv4, [`Addr6Be`] for IPv6); only reading and writing the hook's
//! address differ. An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a
//! dual-stack `AF_INET6` socket uses to reach an IPv4 Service) is balanced
//! through the IPv4 maps and written back mapped: `::ffff:backend`.
//!
//! A connected UDP socket, the node's or a pod's, is balanced once, at
//! `connect()`, and recorded in the socket map by its cookie: when its
//! backend leaves, the agent finds it through sock_diag, in the node's
//! namespace or in a pod's, and destroys it, so a long-lived DNS socket is
//! never pinned to a departed backend. An agent that cannot enter the pods'
//! namespaces (no CAP_SYS_ADMIN) leaves a pod's connected UDP sockets to the
//! tc layer, which checks the backend on every datagram (the switch is
//! `crate::programs::sock`'s).
use aya_ebpf::btf_maps::{LruHashMap, SkStorage};
use aya_ebpf::{
    bindings::bpf_sock_addr,
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    programs::SockAddrContext,
    EbpfContext as _,
};
use proxy_common::{
    capacity, frontend_flags, proto, sock_dir, stat, Addr6Be, FrontendSlot, SockAffinityKey,
    SockConnOf, SockEntryOf, SockKey, SockKey6,
};

mod conn;
pub(crate) use conn::{conn_frontend, counted_tcp, remember_conn};

use crate::{
    lb::{choose_backend, FamilyAddr, SlotKey},
    maps::{
        config, count, count_denied, count_service, SB_SOCK6_V1, SB_SOCK_AFFINITY_V1,
        SB_SOCK_CONN6_V2, SB_SOCK_CONN_V2, SB_SOCK_V1,
    },
};

/// Return values of cgroup `sock_addr` programs.
pub(crate) const ALLOW: i32 = 1;
pub(crate) const REJECT: i32 = 0;
pub(crate) const ECONNREFUSED: i32 = 111;

/// `AF_INET` and `AF_INET6`, as `bpf_sock::family` reports them.
pub(crate) const AF_INET: u32 = 2;
pub(crate) const AF_INET6: u32 = 10;

/// The third word of an IPv4-mapped IPv6 address (`::ffff:0:0/96`), in
/// network byte order.
pub(crate) const V4_MAPPED_WORD2: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The destination (connect, sendmsg) or peer (recvmsg, getpeername) address
/// of a socket call, as the hook sees it.
#[derive(Clone, Copy)]
pub(crate) struct SockAddr<A> {
    pub(crate) addr_be: A,
    pub(crate) port_be: u16,
    pub(crate) proto: u8,
}

/// A balanced destination: the backend and the service it was picked for (and,
/// as a socket-map value, an address with the ids it stands for).
#[derive(Clone, Copy)]
pub(crate) struct Picked<A> {
    pub(crate) addr_be: A,
    pub(crate) port_be: u16,
    pub(crate) backend_id: u32,
    pub(crate) service_id: u32,
}

impl<A: Copy> Picked<A> {
    /// This pick naming `addr_be:port_be` (the frontend, in a reverse entry).
    #[inline(always)]
    fn naming(&self, addr_be: A, port_be: u16) -> Self {
        Self {
            addr_be,
            port_be,
            ..*self
        }
    }
}

/// An address family of the socket layer: its frontend and backend maps
/// ([`FamilyAddr`]), its socket map (the LRU of UDP sockets' translations)
/// and its socket-local storage (TCP sockets' frontends).
pub(crate) trait SockFamily: FamilyAddr + crate::trace::TraceAddr + 'static {
    /// The socket map's key.
    type SockKey: 'static;
    /// The socket-local storage of the TCP sockets it connects.
    fn conns() -> &'static SkStorage<SockConnOf<Self>>;
    /// The socket map.
    fn sockets() -> &'static SocketMap<Self::SockKey, Self>;
    /// The socket map's key of one socket (`cookie`), one address it sends
    /// to or hears from, and the direction ([`sock_dir`]).
    fn sock_key(cookie: u64, at: &SockAddr<Self>, dir: u8) -> Self::SockKey;

    #[inline(always)]
    fn sock_get(cookie: u64, at: &SockAddr<Self>, dir: u8) -> Option<Picked<Self>> {
        // SAFETY: the fields are copied out at once.
        let entry = unsafe { Self::sockets().get(Self::sock_key(cookie, at, dir)) }.copied()?;
        Some(Picked {
            addr_be: entry.addr_be,
            port_be: entry.port_be,
            backend_id: entry.backend_id,
            service_id: entry.service_id,
        })
    }

    /// Inserts (or replaces) an entry; `false` if the map refused.
    #[inline(always)]
    fn sock_insert(cookie: u64, at: &SockAddr<Self>, dir: u8, value: &Picked<Self>) -> bool {
        let entry = SockEntryOf {
            addr_be: value.addr_be,
            port_be: value.port_be,
            _pad: [0; 2],
            backend_id: value.backend_id,
            service_id: value.service_id,
        };
        Self::sockets()
            .insert(Self::sock_key(cookie, at, dir), entry, 0)
            .is_ok()
    }

    /// Removes an entry; `false` if there was none.
    #[inline(always)]
    fn sock_remove(cookie: u64, at: &SockAddr<Self>, dir: u8) -> bool {
        Self::sockets()
            .remove(Self::sock_key(cookie, at, dir))
            .is_ok()
    }
}

/// The socket map of family `A`, keyed by `K`.
pub(crate) type SocketMap<K, A> = LruHashMap<K, SockEntryOf<A>, { capacity::SOCKETS as usize }>;

impl SockFamily for u32 {
    type SockKey = SockKey;

    #[inline(always)]
    fn conns() -> &'static SkStorage<SockConnOf<u32>> {
        &SB_SOCK_CONN_V2
    }

    #[inline(always)]
    fn sockets() -> &'static SocketMap<SockKey, u32> {
        &SB_SOCK_V1
    }

    #[inline(always)]
    fn sock_key(cookie: u64, at: &SockAddr<u32>, dir: u8) -> SockKey {
        SockKey {
            cookie,
            addr_be: at.addr_be,
            port_be: at.port_be,
            proto: at.proto,
            dir,
        }
    }
}

impl SockFamily for Addr6Be {
    type SockKey = SockKey6;

    #[inline(always)]
    fn conns() -> &'static SkStorage<SockConnOf<Addr6Be>> {
        &SB_SOCK_CONN6_V2
    }

    #[inline(always)]
    fn sockets() -> &'static SocketMap<SockKey6, Addr6Be> {
        &SB_SOCK6_V1
    }

    #[inline(always)]
    fn sock_key(cookie: u64, at: &SockAddr<Addr6Be>, dir: u8) -> SockKey6 {
        SockKey6 {
            cookie,
            addr_be: at.addr_be,
            port_be: at.port_be,
            proto: at.proto,
            dir,
            _pad: [0; 4],
        }
    }
}

/// Why a connect or send to a frontend cannot go ahead.
pub(crate) enum Refuse {
    /// The frontend has no endpoints.
    NoBackend,
    /// A slot or backend was missing mid-update.
    Inconsistent,
    /// The node may not reach this frontend (`loadBalancerSourceRanges`).
    Denied,
}

/// What `loadBalancerSourceRanges` says about a socket of this hook.
pub(crate) enum Sources {
    /// The frontend is open to every source, or to the node.
    Open,
    /// A pod's socket to a restricted frontend: left untranslated, so the
    /// tc program on the pod's interface, which sees the packet's source
    /// address, decides.
    LeaveToTc,
    /// A socket of the node to a frontend whose blocks hold no node address.
    Denied,
}

/// The socket layer sees no source address at `connect()` (the kernel picks
/// it later), so a restricted frontend is judged by the socket's network
/// namespace: the node's sockets by whether a block holds a node address (as
/// kube-proxy decides for traffic from the node), a pod's by tc.
#[inline(always)]
pub(crate) fn sources(ctx: &SockAddrContext, svc: &FrontendSlot) -> Sources {
    if svc.flags & frontend_flags::SOURCE_RANGES == 0 {
        return Sources::Open;
    }
    if netns_cookie(ctx) != config().host_netns_cookie {
        return Sources::LeaveToTc;
    }
    if svc.flags & frontend_flags::SOURCE_RANGES_NODE != 0 {
        Sources::Open
    } else {
        Sources::Denied
    }
}

/// [`sources`] as the hook's verdict: `None` to go on balancing.
#[inline(always)]
pub(crate) fn source_verdict<A>(ctx: &SockAddrContext, svc: &FrontendSlot) -> Option<Verdict<A>> {
    match sources(ctx, svc) {
        Sources::Open => None,
        Sources::LeaveToTc => Some(Verdict::Pass),
        Sources::Denied => {
            count_denied(svc.service_id);
            Some(Verdict::Refuse(Refuse::Denied))
        }
    }
}

/// What a connect or send hook does with the call.
pub(crate) enum Verdict<A> {
    /// Not a frontend (or not ours to balance): unchanged.
    Pass,
    /// To this backend instead.
    To(Picked<A>),
    Refuse(Refuse),
}

/// TCP and UDP; other protocols are not ours.
#[inline(always)]
pub(crate) fn our_proto(protocol: u32) -> Option<u8> {
    match protocol {
        6 => Some(proto::TCP),
        17 => Some(proto::UDP),
        _ => None,
    }
}

#[inline(always)]
pub(crate) fn read_addr4(ctx: &SockAddrContext) -> Option<SockAddr<u32>> {
    let sa: *const bpf_sock_addr = ctx.sock_addr;
    // SAFETY: the kernel hands every sock_addr program a valid context; these
    // fields are readable in all four IPv4 hooks (the verifier checks each
    // access).
    let (addr_be, port, protocol) = unsafe { ((*sa).user_ip4, (*sa).user_port, (*sa).protocol) };
    // `user_port` holds the port in network byte order in its low 16 bits.
    Some(SockAddr {
        addr_be,
        port_be: port as u16,
        proto: our_proto(protocol)?,
    })
}

#[inline(always)]
pub(crate) fn write_addr4(ctx: &SockAddrContext, addr_be: u32, port_be: u16) {
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    // SAFETY: `user_ip4` and `user_port` are writable in all four IPv4 hooks
    // with a 4-byte store, which is what these are.
    unsafe {
        (*sa).user_ip4 = addr_be;
        (*sa).user_port = u32::from(port_be);
    }
}

#[inline(always)]
pub(crate) fn read_addr6(ctx: &SockAddrContext) -> Option<SockAddr<Addr6Be>> {
    let sa: *const bpf_sock_addr = ctx.sock_addr;
    // SAFETY: as in `read_addr4`, for the four IPv6 hooks. Each word of
    // `user_ip6` is read with its own 4-byte load at a constant offset from
    // the context (volatile, so LLVM neither merges nor splits them).
    let (addr_be, port, protocol) = unsafe {
        let ip = core::ptr::addr_of!((*sa).user_ip6).cast::<u32>();
        (
            [
                core::ptr::read_volatile(ip),
                core::ptr::read_volatile(ip.add(1)),
                core::ptr::read_volatile(ip.add(2)),
                core::ptr::read_volatile(ip.add(3)),
            ],
            (*sa).user_port,
            (*sa).protocol,
        )
    };
    Some(SockAddr {
        addr_be,
        port_be: port as u16,
        proto: our_proto(protocol)?,
    })
}

#[inline(always)]
pub(crate) fn write_addr6(ctx: &SockAddrContext, addr_be: Addr6Be, port_be: u16) {
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    // SAFETY: `user_ip6` and `user_port` are writable in all four IPv6 hooks
    // with 4-byte stores, which is what these are (volatile: one store per
    // word, never merged).
    unsafe {
        let ip = core::ptr::addr_of_mut!((*sa).user_ip6).cast::<u32>();
        core::ptr::write_volatile(ip, addr_be[0]);
        core::ptr::write_volatile(ip.add(1), addr_be[1]);
        core::ptr::write_volatile(ip.add(2), addr_be[2]);
        core::ptr::write_volatile(ip.add(3), addr_be[3]);
        (*sa).user_port = u32::from(port_be);
    }
}

/// The IPv4 address inside an IPv4-mapped IPv6 address.
#[inline(always)]
pub(crate) fn v4_mapped(addr_be: &Addr6Be) -> Option<u32> {
    (addr_be[0] == 0 && addr_be[1] == 0 && addr_be[2] == V4_MAPPED_WORD2).then_some(addr_be[3])
}

#[inline(always)]
pub(crate) fn write_mapped(ctx: &SockAddrContext, addr_be: u32, port_be: u16) {
    write_addr6(ctx, [0, 0, V4_MAPPED_WORD2, addr_be], port_be);
}

#[inline(always)]
pub(crate) fn socket_cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: the helper accepts a sock_addr context.
    unsafe { bpf_get_socket_cookie(ctx.as_ptr()) }
}

#[inline(always)]
pub(crate) fn netns_cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: the helper accepts a sock_addr context (kernel 5.7+).
    unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }
}

/// Refuses the call with `ECONNREFUSED`, as a kube-proxy reject does.
#[inline(always)]
pub(crate) fn refuse(why: Refuse) -> i32 {
    match why {
        Refuse::NoBackend => count(stat::SOCK_NO_BACKEND),
        Refuse::Inconsistent => count(stat::DROP_INCONSISTENT),
        // Counted per service where decided; the caller sees EPERM, as
        // from a firewall on the node's own output.
        Refuse::Denied => return REJECT,
    }
    // SAFETY: allowed in connect and sendmsg hooks; sets the errno the caller
    // sees instead of the default EPERM. Its result only says whether the
    // value was accepted, and EPERM is an acceptable fallback.
    let _ = unsafe { bpf_set_retval(-ECONNREFUSED) };
    REJECT
}

/// The hook's return value for `verdict`, writing the backend with `write`.
#[inline(always)]
pub(crate) fn finish<A>(
    ctx: &SockAddrContext,
    verdict: Verdict<A>,
    write: impl FnOnce(&SockAddrContext, A, u16),
) -> i32 {
    match verdict {
        Verdict::Pass => ALLOW,
        Verdict::To(picked) => {
            write(ctx, picked.addr_be, picked.port_be);
            ALLOW
        }
        Verdict::Refuse(why) => refuse(why),
    }
}

/// A new backend for this socket, honouring affinity per network namespace.
#[inline(always)]
pub(crate) fn pick<A: SockFamily>(
    ctx: &SockAddrContext,
    key: A::Key,
    svc: &FrontendSlot,
) -> Result<Picked<A>, Refuse> {
    if svc.backend_count == 0 {
        count_service(svc.service_id, |s| s.drops_no_backend += 1);
        return Err(Refuse::NoBackend);
    }
    let affinity_key = SockAffinityKey {
        netns_cookie: netns_cookie(ctx),
        service_id: svc.service_id,
        _pad: [0; 4],
    };
    let (backend_id, backend) = choose_backend(key, svc, &SB_SOCK_AFFINITY_V1, &affinity_key)
        .ok_or(Refuse::Inconsistent)?;
    count_service(svc.service_id, |s| s.new_flows += 1);
    let (addr_be, port_be) = A::Key::backend_addr(&backend);
    Ok(Picked {
        addr_be,
        port_be,
        backend_id,
        service_id: svc.service_id,
    })
}

/// Records which frontend a backend stands for on this socket, so `recvmsg`
/// and `getpeername` can show the frontend.
#[inline(always)]
pub(crate) fn remember_reverse<A: SockFamily>(cookie: u64, dst: &SockAddr<A>, picked: &Picked<A>) {
    let backend = SockAddr {
        addr_be: picked.addr_be,
        port_be: picked.port_be,
        proto: dst.proto,
    };
    let value = picked.naming(dst.addr_be, dst.port_be);
    if !A::sock_insert(cookie, &backend, sock_dir::REVERSE, &value) {
        count(stat::CT_INSERT_FAILED);
    }
}
