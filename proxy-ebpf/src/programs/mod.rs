//! The entry points per attach point, each a `try_*` that returns an action
//! or why the packet is left alone, called by `main.rs`'s program functions:
//! the pod veth (`pod`, both families), the uplink's tc ingress (`uplink_tc`,
//! `uplink_tc6`), the uplink's XDP (`uplink_xdp`, both families) and the
//! cgroup socket hooks (`sock`).
pub mod pod;
pub mod sock;
pub mod uplink_tc;
pub mod uplink_tc6;
pub mod uplink_xdp;
