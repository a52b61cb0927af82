//! Map key and value types shared by the kernel programs (`proxy-ebpf`) and the
//! userspace agent (`proxy-user`).
//!
//! Rules every type here follows:
//! - `#[repr(C)]`, every padding byte spelled out as a `_pad` field, so the
//!   layout is the same on both sides and `bytemuck::Pod` is sound;
//! - no `bool`, enum or `Option` inside a map type: flags and protocol numbers
//!   are plain integers;
//! - a field in network byte order says so with a `_be` suffix, everything else
//!   is host order;
//! - a compile-time size assertion per type, so a change that moves a field
//!   fails the build instead of corrupting a map.
//!
//! The layout follows the idea of Cilium's `lb4_*` maps: a frontend map keyed by
//! (address, port, protocol, backend slot) whose slot 0 describes the service
//! and whose slots 1..=count name backends by id; backends in their own map; a
//! connection-tracking map the agent garbage-collects; a reverse-NAT map by service id; per-CPU
//! counters per service. The socket layer (cgroup hooks) adds an LRU map of
//! per-socket translations and one of per-network-namespace affinity.
//!
//! The types with an address are generic over it (`CtKeyOf<A>`, `CtEntryOf<A>`,
//! `BackendOf<A>`, `AffinityKeyOf<A>`, `FragEntryOf<A>`; `A` is `u32` or
//! [`Addr6Be`]), so the kernel's family-generic code writes each field once;
//! the family names (`CtKey`, `CtKey6`, ...) are aliases of their instances.
//! The other IPv6 types mirror their IPv4 twins field for field; values
//! without an address (`FrontendSlot`, `AffinityEntry`, `SvcStats`,
//! `MaglevTable`, `SockAffinityKey`) serve both families.
//!
//! The modules follow the concerns: the names and programs the agent pins
//! and attaches ([`names`], [`programs`], [`tail`]), [`capacity`], addresses,
//! frontends and backends, connection tracking, fragments, the socket layer,
//! the uplink (source NAT, hairpin), the counters, and the layout checks.
//! Every type is re-exported here.
#![no_std]

pub mod capacity;
pub mod hash;
pub mod ip_summed;
pub mod names;
pub mod prefilter;
pub mod programs;
pub mod tail;
pub mod trace;

mod addr;
mod conntrack;
mod counters;
mod fragments;
mod frontend;
mod layout;
mod socket;
mod uplink;

pub use addr::*;
pub use conntrack::*;
pub use counters::*;
pub use fragments::*;
pub use frontend::*;
pub use socket::*;
pub use trace::TraceEvent;
pub use uplink::*;
