//! The cgroup socket hooks' entry points ([`crate::socklb`] holds what
//! they share): `connect4/6` and `sendmsg4/6` balance a socket,
//! `recvmsg4/6` and `getpeername4/6` show the frontend again, and
//! `sock_release` forgets a closing socket.
use crate::socklb::conn_frontend;
use crate::socklb::counted_tcp;
use crate::socklb::finish;
use crate::socklb::netns_cookie;
use crate::socklb::our_proto;
use crate::socklb::pick;
use crate::socklb::read_addr4;
use crate::socklb::read_addr6;
use crate::socklb::remember_conn;
use crate::socklb::remember_reverse;
use crate::socklb::socket_cookie;
use crate::socklb::source_verdict;
use crate::socklb::v4_mapped;
use crate::socklb::write_addr4;
use crate::socklb::write_addr6;
use crate::socklb::write_mapped;
use crate::socklb::Picked;
use crate::socklb::Refuse;
use crate::socklb::SockAddr;
use crate::socklb::SockFamily;
use crate::socklb::Verdict;
use crate::socklb::ALLOW;
use crate::socklb::{AF_INET, AF_INET6};
use crate::{
    family::Family,
    lb::{backend_is_live, counts_flows, frontend_key, lookup_frontend, sched},
    maps::{config, count},
    trace,
};
use aya_ebpf::{
    bindings::bpf_sock,
    helpers::bpf_get_socket_cookie,
    programs::{SockAddrContext, SockContext},
    EbpfContext as _,
};
use proxy_common::{proto, sock_dir, stat, Addr6Be, FrontendSlot};

/// One socket call's work, over whichever family's maps its address
/// belongs to; `write` puts an address back in the form the hook saw
/// (IPv4, IPv6, or IPv4-mapped IPv6). [`hook4`] and [`hook6`] read the
/// address and choose the family, so each call is written once.
pub(crate) trait SockCall {
    fn call<A: SockFamily + Family>(
        ctx: &SockAddrContext,
        at: &SockAddr<A>,
        write: impl FnOnce(&SockAddrContext, A, u16),
    ) -> i32;
}

/// A call that balances the socket ([`Connect`], [`Sendmsg`]): its verdict,
/// which [`finish`] carries out.
pub(crate) trait Balance {
    fn verdict<A: SockFamily + Family>(ctx: &SockAddrContext, dst: &SockAddr<A>) -> Verdict<A>;
}

impl<B: Balance> SockCall for B {
    #[inline(always)]
    fn call<A: SockFamily + Family>(
        ctx: &SockAddrContext,
        at: &SockAddr<A>,
        write: impl FnOnce(&SockAddrContext, A, u16),
    ) -> i32 {
        if host_namespace_only() && netns_cookie(ctx) != config().host_netns_cookie {
            return ALLOW;
        }
        finish(ctx, B::verdict(ctx, at), write)
    }
}

/// The switch of [`host_namespace_only`]
/// (`proxy_common::names::HOST_NAMESPACE_ONLY`): a global in a data section
/// of its own, which the loader makes a one-entry array map the agent
/// writes.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".data.sb_hostns")]
static mut SB_HOSTNS: u64 = 0;

/// Whether the socket layer balances only the node's own sockets
/// (`--socket-lb-host-namespace-only`): a pod's connects and sends then go
/// out to the frontend unchanged, where a service mesh's sidecar redirect
/// sees the ClusterIP, and the tc program on the pod's interface balances
/// the packets.
#[inline(always)]
fn host_namespace_only() -> bool {
    // SAFETY: a global of the program's object, always there; only the
    // agent writes it (through its map), a whole aligned word at a time.
    // Volatile: the compiler must not assume its initial value.
    unsafe { core::ptr::read_volatile(&raw const SB_HOSTNS) != 0 }
}

/// An IPv4 hook: call `C` over the IPv4 maps.
#[inline(always)]
pub(crate) fn hook4<C: SockCall>(ctx: &SockAddrContext) -> i32 {
    match read_addr4(ctx) {
        Some(at) => C::call(ctx, &at, write_addr4),
        None => ALLOW,
    }
}

/// An IPv6 hook: call `C` over the IPv6 maps, or, for an IPv4-mapped
/// address (a dual-stack socket's IPv4 peer), over the IPv4 maps with the
/// answer written back mapped.
#[inline(always)]
pub(crate) fn hook6<C: SockCall>(ctx: &SockAddrContext) -> i32 {
    let Some(at) = read_addr6(ctx) else {
        return ALLOW;
    };
    match v4_mapped(&at.addr_be) {
        Some(addr_be) => {
            let at = SockAddr {
                addr_be,
                port_be: at.port_be,
                proto: at.proto,
            };
            C::call(ctx, &at, write_mapped)
        }
        None => C::call(ctx, &at, write_addr6),
    }
}

/// The frontend `dst` names, if any: most sockets connect to no frontend,
/// and the frontend bitmap tells them apart with one array read before the
/// hash lookup.
#[inline(always)]
fn frontend_at<A: SockFamily + Family>(dst: &SockAddr<A>) -> Option<(A::Key, FrontendSlot)> {
    if !A::maybe_frontend_port(&dst.addr_be, dst.port_be, dst.proto) {
        return None;
    }
    let key = frontend_key(dst.addr_be, dst.port_be, dst.proto);
    lookup_frontend(&key).map(|svc| (key, svc))
}

/// The switch of [`pod_udp_at_connect`] (`proxy_common::names::POD_UDP_AT_CONNECT`):
/// a global in a data section of its own, which the loader makes a
/// one-entry array map the agent writes.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".data.sb_pod_udp")]
static mut SB_POD_UDP: u64 = 0;

/// Whether a connected UDP socket outside the node's namespace (a pod's) is
/// balanced at `connect()`: only when the agent can close it in that
/// namespace once its backend leaves.
#[inline(always)]
fn pod_udp_at_connect() -> bool {
    // SAFETY: a global of the program's object, always there; only the
    // agent writes it (through its map), a whole aligned word at a time.
    // Volatile: the compiler must not assume its initial value.
    unsafe { core::ptr::read_volatile(&raw const SB_POD_UDP) != 0 }
}

/// `connect()`: a TCP or UDP socket (of the node, or of a pod when the agent
/// can close it there: [`pod_udp_at_connect`]) to a frontend is connected to
/// a backend instead.
pub(crate) struct Connect;

impl Balance for Connect {
    #[inline(always)]
    fn verdict<A: SockFamily + Family>(ctx: &SockAddrContext, dst: &SockAddr<A>) -> Verdict<A> {
        let Some((key, svc)) = frontend_at(dst) else {
            return Verdict::Pass;
        };
        if dst.proto == proto::UDP
            && !pod_udp_at_connect()
            && netns_cookie(ctx) != config().host_netns_cookie
        {
            return Verdict::Pass;
        }
        if let Some(verdict) = source_verdict(ctx, &svc) {
            return verdict;
        }
        let picked = match pick(ctx, key, &svc) {
            Ok(picked) => picked,
            Err(why) => return refused(dst, &svc, why),
        };
        // A TCP socket keeps its frontend itself, and whether it counts on its
        // backend; a connected UDP socket in the socket map, where the agent
        // finds it (by its cookie, in whichever network namespace it lives)
        // when its backend leaves. The cookie is read only where it is used: a
        // socket's first read generates it.
        let counts = counts_flows(&svc);
        let tcp_kept = dst.proto == proto::TCP && remember_conn(ctx, dst, &picked, counts);
        if !tcp_kept {
            remember_reverse(socket_cookie(ctx), dst, &picked);
        }
        // A connected socket is one of its backend's open flows; a TCP socket
        // only when its storage says so, by which `release` knows to take it
        // off (the kernel had no memory for it: not counted).
        if counts && (tcp_kept || dst.proto != proto::TCP) {
            sched::socket_opened(socket_cookie(ctx), picked.backend_id);
        }
        count(stat::SOCK_CONNECT);
        trace_new(dst, &svc, &picked);
        Verdict::To(picked)
    }
}

/// Traces a socket given a backend: a new flow.
#[inline(always)]
fn trace_new<A: SockFamily>(dst: &SockAddr<A>, svc: &FrontendSlot, picked: &Picked<A>) {
    let backend = Ok((&picked.addr_be, picked.port_be));
    trace::socket(dst.proto, (&dst.addr_be, dst.port_be), svc, backend);
}

/// Traces a socket call [`pick`] refused, and refuses it.
#[inline(always)]
fn refused<A: SockFamily>(dst: &SockAddr<A>, svc: &FrontendSlot, why: Refuse) -> Verdict<A> {
    let reason = match why {
        Refuse::NoBackend => stat::SOCK_NO_BACKEND,
        Refuse::Inconsistent => stat::DROP_INCONSISTENT,
        Refuse::Denied => u32::from(proxy_common::trace::reason::SOURCE_DENIED),
    };
    trace::socket(dst.proto, (&dst.addr_be, dst.port_be), svc, Err(reason));
    Verdict::Refuse(why)
}

/// `sendmsg()` with an address (unconnected UDP): every datagram to a frontend
/// goes to the backend this socket was given for it, as long as that backend
/// is live; then the socket gets a new one. The kernel hands a datagram of an
/// `AF_INET6` socket to an IPv4-mapped address to the IPv4 path (and
/// `sendmsg4`) before `sendmsg6` runs; should one reach `sendmsg6` all the
/// same, it goes through the IPv4 maps ([`hook6`]).
pub(crate) struct Sendmsg;

impl Balance for Sendmsg {
    #[inline(always)]
    fn verdict<A: SockFamily + Family>(ctx: &SockAddrContext, dst: &SockAddr<A>) -> Verdict<A> {
        if dst.proto != proto::UDP {
            return Verdict::Pass;
        }
        let Some((key, svc)) = frontend_at(dst) else {
            return Verdict::Pass;
        };
        if let Some(verdict) = source_verdict(ctx, &svc) {
            return verdict;
        }
        let cookie = socket_cookie(ctx);
        let picked = match kept_backend(cookie, dst, &svc) {
            Some(kept) => kept,
            None => match pick(ctx, key, &svc) {
                Ok(picked) => {
                    remember_forward(cookie, dst, &picked);
                    remember_reverse(cookie, dst, &picked);
                    trace_new(dst, &svc, &picked);
                    picked
                }
                Err(why) => return refused(dst, &svc, why),
            },
        };
        count(stat::SOCK_SENDMSG);
        Verdict::To(picked)
    }
}

/// The backend this socket already sends the frontend's datagrams to, if it is
/// still live and still this service's.
#[inline(always)]
fn kept_backend<A: SockFamily>(
    cookie: u64,
    dst: &SockAddr<A>,
    svc: &FrontendSlot,
) -> Option<Picked<A>> {
    let entry = A::sock_get(cookie, dst, sock_dir::FORWARD)?;
    if entry.service_id == svc.service_id
        && svc.backend_count > 0
        && backend_is_live(entry.backend_id, entry.addr_be, entry.port_be)
    {
        return Some(entry);
    }
    count(stat::SOCK_RESELECTED);
    None
}

#[inline(always)]
fn remember_forward<A: SockFamily>(cookie: u64, dst: &SockAddr<A>, picked: &Picked<A>) {
    if !A::sock_insert(cookie, dst, sock_dir::FORWARD, picked) {
        count(stat::CT_INSERT_FAILED);
    }
}

/// `recvmsg()` (UDP) and `getpeername()`: the frontend a backend this socket
/// was balanced to stands for.
#[inline(always)]
fn frontend_of<A: SockFamily>(ctx: &SockAddrContext, peer: &SockAddr<A>) -> Option<(A, u16)> {
    let stored = match peer.proto {
        proto::TCP => conn_frontend(ctx, peer),
        _ => None,
    };
    // The socket map: UDP, and a TCP socket whose storage the kernel had no
    // memory for (`remember_reverse` at connect).
    let frontend = match stored {
        Some(frontend) => frontend,
        None => A::sock_get(socket_cookie(ctx), peer, sock_dir::REVERSE)
            .map(|entry| (entry.addr_be, entry.port_be))?,
    };
    count(stat::SOCK_REVERSED);
    Some(frontend)
}

/// `recvmsg()` and `getpeername()`: a backend shows as its frontend. Both
/// hooks must always allow.
pub(crate) struct RestorePeer;

impl SockCall for RestorePeer {
    #[inline(always)]
    fn call<A: SockFamily + Family>(
        ctx: &SockAddrContext,
        at: &SockAddr<A>,
        write: impl FnOnce(&SockAddrContext, A, u16),
    ) -> i32 {
        if let Some((addr_be, port_be)) = frontend_of(ctx, at) {
            write(ctx, addr_be, port_be);
        }
        ALLOW
    }
}

/// A UDP socket closes: the entry that maps its backend back to the
/// frontend goes, so the socket map holds live sockets rather than waiting
/// for the LRU to push out dead ones. A TCP socket's frontend is in its own
/// storage, which the kernel frees with it (a TCP socket a release from
/// before that storage connected has its entry in the socket map, which the
/// LRU ages out); a
/// TCP socket only leaves least-connection's count, if its storage says it
/// counted on a backend ([`sched::socket_closed`]): every other TCP socket
/// returns after a storage check, without the cookie and the map lookup
/// ([`counted_tcp`]). An unconnected UDP socket's
/// per-frontend entries cannot be found from here; the LRU ages them out
/// too. An `AF_INET6` socket connected to an IPv4-mapped address has its
/// entry in the IPv4 map.
#[inline(always)]
pub fn release(ctx: &SockContext) -> i32 {
    let sk: *const bpf_sock = ctx.sock;
    // SAFETY: the kernel hands a valid `bpf_sock`; these fields are readable
    // in `sock_release` (the verifier checks each access).
    let (family, protocol, port_be) = unsafe { ((*sk).family, (*sk).protocol, (*sk).dst_port) };
    let Some(proto) = our_proto(protocol) else {
        return ALLOW;
    };
    if proto == proto::TCP {
        // Least-connection: a TCP socket that counted on a backend leaves
        // it; its own storage says whether it did.
        if counted_tcp(ctx, family) {
            // SAFETY: the helper accepts a `sock_release` context (Linux 5.10+).
            sched::socket_closed(unsafe { bpf_get_socket_cookie(ctx.as_ptr()) });
        }
        return ALLOW;
    }
    let removed = match family {
        AF_INET => {
            // SAFETY: as above.
            let addr_be = unsafe { (*sk).dst_ip4 };
            addr_be != 0 && forget(ctx, addr_be, port_be, proto)
        }
        AF_INET6 => {
            // SAFETY: as above; each word of `dst_ip6` with its own 4-byte
            // load at a constant offset.
            let addr_be: Addr6Be = unsafe {
                let ip = core::ptr::addr_of!((*sk).dst_ip6).cast::<u32>();
                [
                    core::ptr::read_volatile(ip),
                    core::ptr::read_volatile(ip.add(1)),
                    core::ptr::read_volatile(ip.add(2)),
                    core::ptr::read_volatile(ip.add(3)),
                ]
            };
            match v4_mapped(&addr_be) {
                Some(v4) => v4 != 0 && forget(ctx, v4, port_be, proto),
                None => addr_be != [0; 4] && forget(ctx, addr_be, port_be, proto),
            }
        }
        _ => false,
    };
    if removed {
        count(stat::SOCK_RELEASED);
    }
    ALLOW
}

/// Removes the closing socket's reverse entry for the backend `addr_be:port_be`,
/// and takes it off least-connection's counts if it was on them.
/// Most closing sockets were never balanced: a missing key is the rule, and
/// there is nothing else to do about it.
#[inline(always)]
fn forget<A: SockFamily>(ctx: &SockContext, addr_be: A, port_be: u16, proto: u8) -> bool {
    // SAFETY: the helper accepts a `sock_release` context (Linux 5.10+).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // Least-connection: a socket that counted on a backend leaves it (one
    // lookup, a miss for every other socket).
    sched::socket_closed(cookie);
    let at = SockAddr {
        addr_be,
        port_be,
        proto,
    };
    A::sock_remove(cookie, &at, sock_dir::REVERSE)
}
