//! Attaching the programs: the tc programs on pod interfaces ([`pods`]),
//! tc and XDP on uplinks and overlay devices ([`uplink`]), the cgroup socket
//! hooks ([`socket_layer`]) and the pods' network namespaces the socket layer
//! serves ([`pod_netns`]); what a pinned link is attached to
//! ([`linkinfo`]).
pub mod linkinfo;
pub mod pod_netns;
pub mod pods;
pub mod socket_layer;
pub mod uplink;
