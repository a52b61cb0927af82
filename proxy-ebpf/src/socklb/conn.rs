//! A TCP socket's own storage (socket-local storage, which the kernel frees
//! with the socket): what the socket layer connected it to, which
//! `getpeername` shows, and whether it counts on its backend, which
//! `sock_release` acts on.
use aya_ebpf::{
    btf_maps::SkStorage,
    helpers::bpf_sk_storage_get,
    programs::{SockAddrContext, SockContext},
    EbpfContext as _,
};
use proxy_common::{sock_conn_flags, SockConnOf};

use super::{Picked, SockAddr, SockFamily, AF_INET, AF_INET6};
use crate::maps::{SB_SOCK_CONN6_V2, SB_SOCK_CONN_V2};

/// Records in the connecting TCP socket's own storage (created here) the
/// frontend it asked for, so `getpeername` can show it, and whether it
/// `counted` on its backend, so `sock_release` knows whether to take it off;
/// `false` if the kernel had no memory for it (then the socket map takes
/// the frontend, `super::remember_reverse`).
#[inline(always)]
pub(crate) fn remember_conn<A: SockFamily>(
    ctx: &SockAddrContext,
    dst: &SockAddr<A>,
    picked: &Picked<A>,
    counted: bool,
) -> bool {
    // SAFETY: the context's socket is the one connecting, which the helper
    // takes; it returns this socket's storage (created zeroed when missing)
    // or null.
    let conn = unsafe { A::conns().get_or_insert_ptr_mut(ctx, None) };
    if conn.is_null() {
        return false;
    }
    let flags = if counted { sock_conn_flags::COUNTED } else { 0 };
    // SAFETY: non-null: this socket's storage, valid for the program run;
    // the socket's own `connect()` holds the socket lock, so no other hook
    // of this socket writes it meanwhile.
    unsafe {
        (*conn).target.backend_addr_be = picked.addr_be;
        (*conn).target.backend_port_be = picked.port_be;
        (*conn).target.frontend_addr_be = dst.addr_be;
        (*conn).target.frontend_port_be = dst.port_be;
        (*conn).target.service_id = picked.service_id;
        (*conn).flags = flags;
    }
    true
}

/// The frontend a TCP socket connected to `peer` (a backend) asked for, from
/// the socket's own storage ([`remember_conn`]).
#[inline(always)]
pub(crate) fn conn_frontend<A: SockFamily>(
    ctx: &SockAddrContext,
    peer: &SockAddr<A>,
) -> Option<(A, u16)> {
    // SAFETY: as in `remember_conn`, without creating the storage.
    let conn = unsafe { A::conns().get_ptr_mut(ctx) };
    if conn.is_null() {
        return None;
    }
    // SAFETY: non-null: this socket's storage, valid for the program run;
    // the fields are copied out.
    let (backend_addr_be, backend_port_be, frontend_addr_be, frontend_port_be) = unsafe {
        (
            (*conn).target.backend_addr_be,
            (*conn).target.backend_port_be,
            (*conn).target.frontend_addr_be,
            (*conn).target.frontend_port_be,
        )
    };
    (backend_addr_be == peer.addr_be && backend_port_be == peer.port_be)
        .then_some((frontend_addr_be, frontend_port_be))
}

/// Whether a closing TCP socket of `family` counts on a backend in
/// least-connection's socket map: its storage says so ([`remember_conn`]),
/// that of the IPv4 map or (an `AF_INET6` socket) of either map, since a
/// dual-stack socket connected to an IPv4-mapped address was balanced
/// through the IPv4 maps. Every other socket (one the socket layer did not
/// connect, or connected to a frontend of another algorithm: nearly all)
/// closes without the cookie and the lookup of a key that is not there
/// (about 0.5 µs per close under load, measured with the kernel's run-time
/// statistics).
#[inline(always)]
pub(crate) fn counted_tcp(ctx: &SockContext, family: u32) -> bool {
    match family {
        AF_INET => counted_in(ctx, &SB_SOCK_CONN_V2),
        AF_INET6 => counted_in(ctx, &SB_SOCK_CONN6_V2) || counted_in(ctx, &SB_SOCK_CONN_V2),
        _ => false,
    }
}

/// Whether the closing socket holds storage of `map` marked counted. A
/// socket without any storage is answered from one pointer of the socket.
#[inline(always)]
fn counted_in<A>(ctx: &SockContext, map: &'static SkStorage<SockConnOf<A>>) -> bool {
    // SAFETY: `sock_release`'s context is the socket the helper takes
    // (`bpf_sk_storage_get` for cgroup socket programs, Linux 5.10+); the map
    // pointer is the map's definition, as aya's own calls pass it; no value
    // and no create flag, so the helper only looks.
    let conn = unsafe {
        bpf_sk_storage_get(
            core::ptr::from_ref(map).cast_mut().cast(),
            ctx.as_ptr(),
            core::ptr::null_mut(),
            0,
        )
    }
    .cast::<SockConnOf<A>>();
    // SAFETY: non-null: this socket's storage of `map`, valid for the
    // program run; one field read.
    !conn.is_null() && unsafe { (*conn).flags } & sock_conn_flags::COUNTED != 0
}
