//! The socket layer: cgroup hooks that balance a socket once, when it connects
//! (or, for unconnected UDP, when it sends), so its packets need no per-packet
//! NAT at all. `recvmsg` and `getpeername` show the frontend again.
//!
//! Connected UDP sockets outside the node's own network namespace are left to
//! the tc layer, which checks the backend on every datagram: a pod's
//! long-lived DNS socket is never pinned to a departed backend. In the node's
//! namespace the agent destroys connected UDP sockets whose backend left.
use aya_ebpf::{
    bindings::{bpf_sock, bpf_sock_addr},
    helpers::{bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval},
    programs::{SockAddrContext, SockContext},
    EbpfContext as _,
};
use proxy_common::{
    proto, sock_dir, stat, FrontendSlot, FrontendKey, SockAffinityKey, SockEntry, SockKey,
};

use crate::{
    lb::{backend_is_live, choose_backend, frontend_key, lookup_frontend},
    maps::{config, count, count_service, SB_SOCK_AFFINITY_V1, SB_SOCK_V1},
};

/// Return values of cgroup `sock_addr` programs.
const ALLOW: i32 = 1;
const REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;

/// The destination (connect, sendmsg) or peer (recvmsg, getpeername) address
/// of a socket call, as the hook sees it.
struct SockAddr {
    addr_be: u32,
    port_be: u16,
    proto: u8,
}

/// A balanced destination: the backend and the service it was picked for.
struct Picked {
    addr_be: u32,
    port_be: u16,
    backend_id: u32,
    service_id: u32,
}

impl Picked {
    /// A socket-map entry naming `addr_be:port_be` for this pick.
    #[inline(always)]
    fn entry(&self, addr_be: u32, port_be: u16) -> SockEntry {
        SockEntry {
            addr_be,
            port_be,
            _pad: [0; 2],
            backend_id: self.backend_id,
            service_id: self.service_id,
        }
    }
}

/// Why a connect or send to a frontend cannot go ahead.
enum Refuse {
    /// The frontend has no endpoints.
    NoBackend,
    /// A slot or backend was missing mid-update.
    Inconsistent,
}

#[inline(always)]
fn read_addr(ctx: &SockAddrContext) -> Option<SockAddr> {
    let sa: *const bpf_sock_addr = ctx.sock_addr;
    // SAFETY: the kernel hands every sock_addr program a valid context; these
    // fields are readable in all four hooks (the verifier checks each access).
    let (addr_be, port, protocol) = unsafe { ((*sa).user_ip4, (*sa).user_port, (*sa).protocol) };
    let proto = match protocol {
        6 => proto::TCP,
        17 => proto::UDP,
        _ => return None,
    };
    // `user_port` holds the port in network byte order in its low 16 bits.
    Some(SockAddr {
        addr_be,
        port_be: port as u16,
        proto,
    })
}

#[inline(always)]
fn write_addr(ctx: &SockAddrContext, addr_be: u32, port_be: u16) {
    let sa: *mut bpf_sock_addr = ctx.sock_addr;
    // SAFETY: `user_ip4` and `user_port` are writable in all four hooks with a
    // 4-byte store, which is what these are.
    unsafe {
        (*sa).user_ip4 = addr_be;
        (*sa).user_port = u32::from(port_be);
    }
}

#[inline(always)]
fn socket_cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: the helper accepts a sock_addr context.
    unsafe { bpf_get_socket_cookie(ctx.as_ptr()) }
}

#[inline(always)]
fn netns_cookie(ctx: &SockAddrContext) -> u64 {
    // SAFETY: the helper accepts a sock_addr context (kernel 5.7+).
    unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }
}

/// Refuses the call with `ECONNREFUSED`, as a kube-proxy reject does.
#[inline(always)]
fn refuse(why: Refuse) -> i32 {
    count(match why {
        Refuse::NoBackend => stat::SOCK_NO_BACKEND,
        Refuse::Inconsistent => stat::DROP_INCONSISTENT,
    });
    // SAFETY: allowed in connect and sendmsg hooks; sets the errno the caller
    // sees instead of the default EPERM. Its result only says whether the
    // value was accepted, and EPERM is an acceptable fallback.
    let _ = unsafe { bpf_set_retval(-ECONNREFUSED) };
    REJECT
}

/// A new backend for this socket, honouring affinity per network namespace.
#[inline(always)]
fn pick(ctx: &SockAddrContext, key: FrontendKey, svc: &FrontendSlot) -> Result<Picked, Refuse> {
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
    Ok(Picked {
        addr_be: backend.addr_be,
        port_be: backend.port_be,
        backend_id,
        service_id: svc.service_id,
    })
}

/// Records which frontend a backend stands for on this socket, so `recvmsg`
/// and `getpeername` can show the frontend.
#[inline(always)]
fn remember_reverse(cookie: u64, dst: &SockAddr, picked: &Picked) {
    let key = SockKey {
        cookie,
        addr_be: picked.addr_be,
        port_be: picked.port_be,
        proto: dst.proto,
        dir: sock_dir::REVERSE,
    };
    if SB_SOCK_V1
        .insert(&key, &picked.entry(dst.addr_be, dst.port_be), 0)
        .is_err()
    {
        count(stat::CT_INSERT_FAILED);
    }
}

/// `connect()`: a TCP socket (or a connected UDP socket of the node) to a
/// frontend is connected to a backend instead.
#[inline(always)]
pub fn connect4(ctx: &SockAddrContext) -> i32 {
    let Some(dst) = read_addr(ctx) else {
        return ALLOW;
    };
    let key = frontend_key(dst.addr_be, dst.port_be, dst.proto);
    let Some(svc) = lookup_frontend(&key) else {
        return ALLOW;
    };
    if dst.proto == proto::UDP && netns_cookie(ctx) != config().host_netns_cookie {
        return ALLOW;
    }
    let picked = match pick(ctx, key, &svc) {
        Ok(picked) => picked,
        Err(why) => return refuse(why),
    };
    remember_reverse(socket_cookie(ctx), &dst, &picked);
    write_addr(ctx, picked.addr_be, picked.port_be);
    count(stat::SOCK_CONNECT);
    ALLOW
}

/// `sendmsg()` with an address (unconnected UDP): every datagram to a frontend
/// goes to the backend this socket was given for it, as long as that backend
/// is live; then the socket gets a new one.
#[inline(always)]
pub fn sendmsg4(ctx: &SockAddrContext) -> i32 {
    let Some(dst) = read_addr(ctx) else {
        return ALLOW;
    };
    if dst.proto != proto::UDP {
        return ALLOW;
    }
    let key = frontend_key(dst.addr_be, dst.port_be, dst.proto);
    let Some(svc) = lookup_frontend(&key) else {
        return ALLOW;
    };
    let cookie = socket_cookie(ctx);
    let forward_key = SockKey {
        cookie,
        addr_be: dst.addr_be,
        port_be: dst.port_be,
        proto: dst.proto,
        dir: sock_dir::FORWARD,
    };
    let picked = match kept_backend(&forward_key, &svc) {
        Some(kept) => kept,
        None => match pick(ctx, key, &svc) {
            Ok(picked) => {
                remember_forward(&forward_key, &picked);
                remember_reverse(cookie, &dst, &picked);
                picked
            }
            Err(why) => return refuse(why),
        },
    };
    write_addr(ctx, picked.addr_be, picked.port_be);
    count(stat::SOCK_SENDMSG);
    ALLOW
}

/// The backend this socket already sends the frontend's datagrams to, if it is
/// still live and still this service's.
#[inline(always)]
fn kept_backend(forward_key: &SockKey, svc: &FrontendSlot) -> Option<Picked> {
    // SAFETY: the fields are copied out at once.
    let entry = unsafe { SB_SOCK_V1.get(forward_key) }.copied()?;
    if entry.service_id == svc.service_id
        && svc.backend_count > 0
        && backend_is_live(entry.backend_id, entry.addr_be, entry.port_be)
    {
        return Some(Picked {
            addr_be: entry.addr_be,
            port_be: entry.port_be,
            backend_id: entry.backend_id,
            service_id: entry.service_id,
        });
    }
    count(stat::SOCK_RESELECTED);
    None
}

#[inline(always)]
fn remember_forward(forward_key: &SockKey, picked: &Picked) {
    let entry = picked.entry(picked.addr_be, picked.port_be);
    if SB_SOCK_V1.insert(forward_key, &entry, 0).is_err() {
        count(stat::CT_INSERT_FAILED);
    }
}

/// `recvmsg()` (UDP) and `getpeername()`: a backend this socket was balanced
/// to shows as the frontend. Both hooks must always allow.
#[inline(always)]
pub fn restore_peer(ctx: &SockAddrContext) -> i32 {
    let Some(peer) = read_addr(ctx) else {
        return ALLOW;
    };
    let key = SockKey {
        cookie: socket_cookie(ctx),
        addr_be: peer.addr_be,
        port_be: peer.port_be,
        proto: peer.proto,
        dir: sock_dir::REVERSE,
    };
    // SAFETY: the fields are copied out at once.
    if let Some(entry) = unsafe { SB_SOCK_V1.get(&key) }.copied() {
        write_addr(ctx, entry.addr_be, entry.port_be);
        count(stat::SOCK_REVERSED);
    }
    ALLOW
}

/// `AF_INET`, as `bpf_sock::family` reports it.
const AF_INET: u32 = 2;

/// A socket closes: the entry that maps its backend back to the frontend
/// goes, so the socket map holds live sockets rather than waiting for the LRU
/// to push out dead ones (a node opening thousands of connections a second
/// would otherwise keep it full). An unconnected UDP socket's per-frontend
/// entries cannot be found from here; the LRU ages them out.
#[inline(always)]
pub fn release(ctx: &SockContext) -> i32 {
    let sk: *const bpf_sock = ctx.sock;
    // SAFETY: the kernel hands a valid `bpf_sock`; these fields are readable
    // in `sock_release` (the verifier checks each access).
    let (family, protocol, dst_ip4, dst_port_be) =
        unsafe { ((*sk).family, (*sk).protocol, (*sk).dst_ip4, (*sk).dst_port) };
    let proto = match protocol {
        6 => proto::TCP,
        17 => proto::UDP,
        _ => return ALLOW,
    };
    if family != AF_INET || dst_ip4 == 0 {
        return ALLOW;
    }
    let key = SockKey {
        // SAFETY: the helper accepts a `sock_release` context (Linux 5.10+).
        cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        addr_be: dst_ip4,
        port_be: dst_port_be,
        proto,
        dir: sock_dir::REVERSE,
    };
    // Most closing sockets were never balanced: a missing key is the rule,
    // and there is nothing else to do about it.
    if SB_SOCK_V1.remove(&key).is_ok() {
        count(stat::SOCK_RELEASED);
    }
    ALLOW
}
