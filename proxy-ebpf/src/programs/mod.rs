//! The entry points per attach point, each a `try_*` that returns an action
//! or why the packet is left alone, called by `main.rs`'s program functions:
//! the pod veth (`pod`), the uplink's tc ingress (`uplink_tc`) and XDP
//! (`uplink_xdp`), each one body for both families, and the cgroup socket
//! hooks (`sock`).
pub mod pod;
pub mod sock;
pub mod uplink_tc;
pub mod uplink_xdp;
