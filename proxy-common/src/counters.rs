//! Counters: the global per-CPU counters and the per-service ones.

/// Indices of the global per-CPU counter array (value: `u64`).
pub mod stat {
    /// Packets that are not ours are not counted: that would cost every packet
    /// of the node a map update. Index 0 is left unused on purpose, so a
    /// zeroed index never counts anything.
    pub const UNUSED: u32 = 0;
    /// Too short for the headers they announce; passed untouched.
    pub const MALFORMED: u32 = 1;
    /// IPv4 fragments the uplink programs see; never rewritten there, passed
    /// untouched (the tc pod path translates fragments: `frag_*`).
    pub const FRAGMENT: u32 = 2;
    /// Frontend packets dropped because no backend was available.
    pub const DROP_NO_BACKEND: u32 = 3;
    /// A slot or backend entry was missing mid-update; packet dropped.
    pub const DROP_INCONSISTENT: u32 = 4;
    /// A connection-tracking, session-affinity or socket-map insert failed
    /// for another reason than a full connection-tracking table (which is
    /// [`CT_FULL`]): the LRU maps never fill, so a kernel-side failure.
    pub const CT_INSERT_FAILED: u32 = 5;
    /// Rewriting the packet failed in a helper; packet dropped.
    pub const DROP_REWRITE_FAILED: u32 = 6;
    /// Requests rewritten to a backend.
    pub const FORWARDED: u32 = 7;
    /// Replies rewritten back to the frontend address.
    pub const REVERSED: u32 = 8;
    /// A tracked flow whose backend had gone was given a new backend.
    pub const CT_RESELECTED: u32 = 9;
    /// A new flow went to the client's affinity backend.
    pub const AFFINITY_HIT: u32 = 10;
    /// Socket layer: a `connect()` to a frontend was given a backend.
    pub const SOCK_CONNECT: u32 = 11;
    /// Socket layer: an unconnected UDP datagram to a frontend was sent to a
    /// backend.
    pub const SOCK_SENDMSG: u32 = 12;
    /// Socket layer: `recvmsg`/`getpeername` showed the frontend for a backend.
    pub const SOCK_REVERSED: u32 = 13;
    /// Socket layer: a connect or send to a frontend without backends was
    /// refused (`ECONNREFUSED`).
    pub const SOCK_NO_BACKEND: u32 = 14;
    /// Socket layer: a UDP socket's backend had gone; it was given a new one.
    pub const SOCK_RESELECTED: u32 = 15;
    /// Socket layer: a balanced socket closed and its entry was removed.
    pub const SOCK_RELEASED: u32 = 16;
    /// A SYN-ACK met the reply entry of a closed connection: the entry was
    /// dropped and the packet passed untouched (its ports were reused by a
    /// connection that is not a Service's).
    pub const CT_STALE: u32 = 17;
    /// The tail call into the rewrite program failed (the program array was
    /// not filled yet); the packet was rewritten with the slower helper path.
    pub const TAIL_CALL_MISSED: u32 = 18;
    /// Uplink: a packet from outside to a frontend was rewritten to a backend
    /// on this node.
    pub const EXT_LOCAL: u32 = 19;
    /// Uplink: a packet from outside was rewritten to a backend on another
    /// node, its source NATed to this node, and sent out again.
    pub const EXT_REMOTE: u32 = 20;
    /// Uplink: a reply of a source-NATed flow was rewritten back and sent to
    /// the client.
    pub const EXT_REPLY: u32 = 21;
    /// Uplink: no source port was free for a new flow to a remote backend;
    /// dropped.
    pub const SNAT_EXHAUSTED: u32 = 22;
    /// Uplink (XDP): the route lookup could not give the next hop's address
    /// (no neighbour entry yet) for a flow to another node, or the TTL would
    /// expire; the packet went on untranslated to the uplink's tc program,
    /// which sends it with the kernel resolving the neighbour (or drops an
    /// expiring one, `ttl_exceeded`).
    pub const XDP_TO_TC: u32 = 23;
    /// A packet to a frontend without endpoints was answered with an ICMP
    /// port unreachable from the frontend address (kube-proxy's REJECT), sent
    /// back out of the interface it came in on. Packets that may not be
    /// answered are dropped and count as `DROP_NO_BACKEND`.
    pub const REJECTED: u32 = 24;
    /// tc pod path: a later fragment (no ports) of a datagram whose first
    /// fragment was translated got the same address rewrite.
    pub const FRAG_TRANSLATED: u32 = 25;
    /// tc pod path: a later fragment with no translation remembered (not a
    /// Service's datagram, or it arrived before its first fragment); passed
    /// untouched.
    pub const FRAG_UNKNOWN: u32 = 26;
    /// tc pod path: an ICMP error about a translated flow had its quoted
    /// header (and, where it names the backend, its outer address) translated.
    pub const ICMP_ERROR_TRANSLATED: u32 = 27;
    /// Uplink (tc): a packet to send back out (to a backend on another node,
    /// or a reply to the client) had a TTL of 1; dropped.
    pub const TTL_EXCEEDED: u32 = 28;
    /// Uplink (tc): no route to send a packet back out on; dropped.
    pub const NO_ROUTE: u32 = 29;
    /// The connection-tracking table was full: a new flow could not be
    /// tracked and its packet was dropped (as Cilium does; the client's
    /// retransmission gets through once the agent's garbage collector made
    /// room). Flows already tracked are not affected.
    pub const CT_FULL: u32 = 30;
    pub const COUNT: u32 = 31;
    /// Names, by index, for the CLI and metrics.
    pub const NAMES: [&str; COUNT as usize] = [
        "unused",
        "malformed",
        "fragment",
        "drop_no_backend",
        "drop_inconsistent",
        "ct_insert_failed",
        "drop_rewrite_failed",
        "forwarded",
        "reversed",
        "ct_reselected",
        "affinity_hit",
        "sock_connect",
        "sock_sendmsg",
        "sock_reversed",
        "sock_no_backend",
        "sock_reselected",
        "sock_released",
        "ct_stale",
        "tail_call_missed",
        "ext_local",
        "ext_remote",
        "ext_reply",
        "snat_exhausted",
        "xdp_to_tc",
        "rejected",
        "frag_translated",
        "frag_unknown",
        "icmp_error_translated",
        "ttl_exceeded",
        "no_route",
        "ct_full",
    ];
}

/// Per-CPU counters per service id.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct SvcStats {
    /// Packets to the frontend that were rewritten to a backend.
    pub packets: u64,
    pub bytes: u64,
    /// New flows: connection-tracking entries created (tc), sockets connected
    /// and UDP sockets given a backend (socket layer).
    pub new_flows: u64,
    /// Packets dropped because the frontend had no backends.
    pub drops_no_backend: u64,
}
