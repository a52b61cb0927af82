//! The data plane: everything that talks to the kernel, one room per concern.
//!
//! | module | holds |
//! |---|---|
//! | [`load`] | loading the eBPF object: the kernel's BTF facts it needs, permissions |
//! | [`pins`] | the one way to open a pinned map, the pin root's format, resizing, kernel memory |
//! | [`maps`] | typed handles on the maps (the sync's `MapStore`), batched writes, reading them back |
//! | [`attach`] | attaching the programs: pod interfaces, uplinks, the cgroup socket hooks |
//! | [`flows`] | connection-tracking housekeeping: expiry, least-connection counts, quiet pods, closing UDP sockets |
pub mod attach;
pub mod flows;
pub mod load;
pub mod maps;
pub mod pins;
