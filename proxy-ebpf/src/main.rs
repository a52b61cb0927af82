//! switchboard's kernel programs.
//!
//! - tc (clsact or TCX) on the host side of every pod veth ([`programs::pod`]):
//!   `sb_from_pod` (ingress: packets the pod sends) rewrites a packet to a
//!   Service frontend to a backend; `sb_to_pod` (egress: packets delivered to
//!   the pod) rewrites the backend's replies back to the frontend. A packet
//!   that is not for a frontend is told apart by one bit of a bitmap
//!   ([`prefilter`]), a packet into a pod without translated flows by one
//!   mark, both before any hash lookup; a packet of an existing flow costs
//!   one connection-tracking lookup and a direct store of the rewrite.
//!   IPv6 packets (ethertype 0x86DD, told apart once, before the IPv4
//!   parser) take the same body over the IPv6 maps, in the same program.
//! - XDP on each uplink ([`programs::uplink_xdp`], deciding with [`nodeport`]):
//!   `sb_xdp_uplink` serves NodePorts, LoadBalancer IPs and external IPs to
//!   clients outside the node, source-NATing flows to backends on other nodes
//!   and sending them (and their replies) straight back out; `sb_from_uplink`
//!   is its tc twin: all the work with `--xdp-mode off`, and with XDP the
//!   packets XDP hands on (no neighbour entry yet, TTL 1, fragments, ICMP).
//!   The uplink's tc egress carries `sb_to_pod`, which reverses a local
//!   backend's replies.
//! - cgroup socket hooks ([`programs::sock`], over [`socklb`]): `connect4`, `sendmsg4`, `recvmsg4` and
//!   `getpeername4` (and their IPv6 twins `connect6`, `sendmsg6`, `recvmsg6`
//!   and `getpeername6`) balance a socket once, when it connects or sends, so
//!   its packets need no NAT; this is what serves clients in the node's own
//!   network namespace. `sock_release` forgets a closing socket.
//!
//! Both layers pick backends the same way ([`lb`]) from the same maps
//! ([`maps`]). A flow balanced by the socket layer carries a backend address,
//! which is no frontend, so the tc layer never translates it a second time.
//!
//! Everything that is not ours passes untouched (`TC_ACT_UNSPEC`, so programs
//! after us still run; socket calls are allowed unchanged). Truncated packets
//! are counted and passed; they are never rewritten. The later fragments of a
//! translated datagram follow its first ([`frag`]) and ICMP errors about
//! translated flows are translated back ([`icmp`]), on the pod path and in
//! the uplink's tc programs (XDP hands both on to tc); IPv6 uplink packets
//! take the same paths in `sb_xdp_uplink6` and `sb_from_uplink6`
//! ([`programs::uplink_xdp`], [`programs::uplink_tc`]). A frontend without backends is
//! answered with an ICMP port unreachable ([`reject`], tc and XDP) or refuses
//! with `ECONNREFUSED` (sockets). A pod given itself as the backend is reached
//! from the hairpin address ([`hairpin`]).
//!
//! One body serves both families: a function generic over the address
//! ([`family::Family`]: `u32` for IPv4, `Addr6Be` for IPv6) is compiled
//! once per family, its keys and entries in the family's per-CPU working
//! memory ([`family::Work`]). What the families still do their own way
//! (parsing, header writes, ICMP and ICMPv6, reject answers) is a trait
//! method or a `v6` module beside its IPv4 part.
//!
//! The modules read bottom-up, without an import cycle (`cargo xtask test`
//! checks it): [`packet`] (headers, the parsed flow, checksums),
//! [`maps`] and [`newflows`]; [`skb`] (a tc program's packet access and
//! verdicts), [`prefilter`], [`lb`] and [`rewrite`]; [`family`]; the
//! concerns [`ct`], [`frag`], [`icmp`], [`reject`], [`hairpin`],
//! [`nodeport`] and [`socklb`]; and on top [`programs`], one entry file per
//! attach point, whose `try_*` functions the program functions below call.
#![no_std]
#![no_main]
// The atomic operations of `lb::sched` (inline BPF assembly).
#![feature(asm_experimental_arch)]

mod ct;
mod family;
mod frag;
mod hairpin;
mod icmp;
mod lb;
mod maps;
mod newflows;
mod nodeport;
mod packet;
mod prefilter;
mod programs;
mod reject;
mod rewrite;
mod skb;
mod socklb;
mod trace;

use aya_ebpf::{
    macros::{cgroup_sock, cgroup_sock_addr, classifier, xdp},
    programs::{SockAddrContext, SockContext, TcContext, XdpContext},
};

/// `SB_PROGRAM_REVISION` at build time (0 when unset; proxy-object's build
/// sets it from its `revision-1` feature). A build with another
/// revision has pod programs whose instructions differ (one extra guard that
/// no real packet meets: an skb is never 4 GiB) and whose behaviour does not:
/// the lifecycle test upgrades the agent to such a build under traffic to
/// prove that a changed program is swapped in without a lost packet.
const PROGRAM_REVISION: u32 = parse_revision(option_env!("SB_PROGRAM_REVISION"));

const fn parse_revision(text: Option<&str>) -> u32 {
    let Some(text) = text else { return 0 };
    let bytes = text.as_bytes();
    let mut value: u32 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let digit = bytes[i].wrapping_sub(b'0');
        if digit > 9 {
            return 0;
        }
        value = value.wrapping_mul(10).wrapping_add(digit as u32);
        i += 1;
    }
    value
}

/// True only in a build with a revision, and then for no real packet.
#[inline(always)]
#[allow(
    clippy::absurd_extreme_comparisons,
    reason = "always false in a build without a revision, by design"
)]
fn revision_guard(len: u32) -> bool {
    PROGRAM_REVISION != 0 && len > u32::MAX - PROGRAM_REVISION
}

#[classifier]
#[inline(always)]
pub fn sb_from_pod(ctx: TcContext) -> i32 {
    if revision_guard(ctx.len()) {
        return skb::pass(packet::Skip::NotOurs);
    }
    match programs::pod::try_from_pod(&ctx) {
        Ok(action) => action,
        Err(skip) => skb::pass(skip),
    }
}

#[classifier]
#[inline(always)]
pub fn sb_to_pod(ctx: TcContext) -> i32 {
    if revision_guard(ctx.len()) {
        return skb::pass(packet::Skip::NotOurs);
    }
    match programs::pod::try_to_pod(&ctx) {
        Ok(action) => action,
        Err(skip) => skb::pass(skip),
    }
}

/// XDP on each uplink: traffic from outside the node ([`nodeport`]).
#[xdp]
#[inline(always)]
pub fn sb_xdp_uplink(ctx: XdpContext) -> u32 {
    match programs::uplink_xdp::try_uplink(&ctx) {
        Ok(action) => action,
        Err(skip) => programs::uplink_xdp::pass(skip),
    }
}

/// Tail-called by `sb_xdp_uplink` for IPv6 packets ([`programs::uplink_xdp`]).
#[xdp]
#[inline(always)]
pub fn sb_xdp_uplink6(ctx: XdpContext) -> u32 {
    match programs::uplink_xdp::uplink::<proxy_common::Addr6Be>(&ctx) {
        Ok(action) => action,
        Err(skip) => programs::uplink_xdp::pass(skip),
    }
}

/// Tail-called by `sb_from_uplink` for IPv6 packets ([`programs::uplink_tc`]).
#[classifier]
#[inline(always)]
pub fn sb_from_uplink6(ctx: TcContext) -> i32 {
    match programs::uplink_tc::from_uplink::<proxy_common::Addr6Be>(&ctx) {
        Ok(action) => action,
        Err(skip) => skb::pass(skip),
    }
}

/// tc ingress on each uplink when XDP is off: the same as `sb_xdp_uplink`.
#[classifier]
#[inline(always)]
pub fn sb_from_uplink(ctx: TcContext) -> i32 {
    match programs::uplink_tc::try_from_uplink(&ctx) {
        Ok(action) => action,
        Err(skip) => skb::pass(skip),
    }
}

#[cgroup_sock_addr(connect4)]
#[inline(always)]
pub fn sb_sock_connect4(ctx: SockAddrContext) -> i32 {
    programs::sock::hook4::<programs::sock::Connect>(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
#[inline(always)]
pub fn sb_sock_sendmsg4(ctx: SockAddrContext) -> i32 {
    programs::sock::hook4::<programs::sock::Sendmsg>(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
#[inline(always)]
pub fn sb_sock_recvmsg4(ctx: SockAddrContext) -> i32 {
    programs::sock::hook4::<programs::sock::RestorePeer>(&ctx)
}

#[cgroup_sock_addr(getpeername4)]
#[inline(always)]
pub fn sb_sock_getpeername4(ctx: SockAddrContext) -> i32 {
    programs::sock::hook4::<programs::sock::RestorePeer>(&ctx)
}

#[cgroup_sock_addr(connect6)]
#[inline(always)]
pub fn sb_sock_connect6(ctx: SockAddrContext) -> i32 {
    programs::sock::hook6::<programs::sock::Connect>(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
#[inline(always)]
pub fn sb_sock_sendmsg6(ctx: SockAddrContext) -> i32 {
    programs::sock::hook6::<programs::sock::Sendmsg>(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
#[inline(always)]
pub fn sb_sock_recvmsg6(ctx: SockAddrContext) -> i32 {
    programs::sock::hook6::<programs::sock::RestorePeer>(&ctx)
}

#[cgroup_sock_addr(getpeername6)]
#[inline(always)]
pub fn sb_sock_getpeername6(ctx: SockAddrContext) -> i32 {
    programs::sock::hook6::<programs::sock::RestorePeer>(&ctx)
}

#[cgroup_sock(sock_release)]
#[inline(always)]
pub fn sb_sock_release(ctx: SockContext) -> i32 {
    programs::sock::release(&ctx)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
