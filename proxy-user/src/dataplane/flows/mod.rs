//! What the agent does with the flows the data path tracks: the
//! connection-tracking entry as userspace reads it ([`entry`]), expiry of
//! flows by protocol state ([`expiry`]) and the table's generation the flow
//! caches check ([`generation`]), least-connection's open-flow counts
//! ([`open_counts`]), the quiet marks of pod interfaces ([`quiet_pods`]), and
//! closing connected UDP sockets whose backend left ([`udp_sockets`]).
pub mod entry;
pub mod expiry;
pub mod generation;
pub mod open_counts;
pub mod quiet_pods;
pub mod udp_sockets;
