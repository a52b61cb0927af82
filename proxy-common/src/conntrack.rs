//! Connection tracking: keys, entries (and the layouts older agents pinned), flags and state, and the ring of recent new flows.

use crate::Addr6Be;

/// Direction marker in [`CtKey::dir`].
pub mod ct_dir {
    /// Client → service, keyed as the client sent it (daddr = frontend).
    pub const FORWARD: u8 = 0;
    /// Backend → client, keyed as the backend sent it (saddr = backend).
    pub const REPLY: u8 = 1;
}

/// Bits of [`CtEntry::flags`].
pub mod ct_flags {
    /// The flow came from outside the node and goes to a backend on another
    /// node: its source is rewritten too (`snat_addr_be:snat_port_be`), and
    /// the reply entry is keyed by that address.
    pub const SNAT: u8 = 1 << 1;
    /// A FIN or RST of this TCP connection was seen. Packets of the closing
    /// connection are still translated, but a SYN-ACK is not: the addresses
    /// and ports now belong to a new connection, which may not be a Service's
    /// (a client that reuses its port to reach the pod directly). A new SYN
    /// through the frontend starts a new flow.
    pub const CLOSING: u8 = 1 << 0;
    // Bit 2 is unused.
    /// Direct server return, on the node that balanced the flow: the
    /// backend's node answers the client itself, so this node sees only
    /// the client's packets (the reply entry exists only so the flow has
    /// its two entries). The flow's phase comes from the forward direction
    /// alone: TCP established once the client acknowledged the SYN-ACK,
    /// closed at the client's FIN or RST.
    pub const DSR_BALANCED: u8 = 1 << 3;
    /// Direct server return, on the backend's node: the flow arrived with
    /// the frontend in an option ([`crate::dsr`]); the replies leave from
    /// here with the frontend as their source.
    pub const DSR_ARRIVED: u8 = 1 << 4;
    /// Forward entries of a flow of a least-connection frontend: the flow
    /// is one of its backend's open flows (`SB_LC_V1`). Whoever ends the
    /// flow first clears the bit with an atomic AND and, when it was the
    /// one to clear it, takes the flow off the count: the data path at the
    /// first FIN or RST, or when it removes the flow to make room; the
    /// agent's collector when it removes the entry.
    pub const COUNTED: u8 = 1 << 5;
}

/// Bits of [`CtEntry::state`]: what was seen in the direction of the entry
/// that holds them (each direction's packets write only their own entry, so
/// two CPUs never write one byte for different reasons). The agent's garbage
/// collector reads a flow's two entries together (the union of their bits).
pub mod ct_state {
    /// Reply entries: a packet of the reply direction passed (TCP: the
    /// SYN-ACK, the connection was answered; UDP: a reply, the flow is a
    /// stream).
    pub const REPLIED: u8 = 1 << 0;
    /// A TCP FIN was seen in this direction.
    pub const FIN: u8 = 1 << 1;
    /// A TCP RST was seen in this direction.
    pub const RST: u8 = 1 << 2;
    /// Forward entries: the client sent a TCP segment with ACK and without
    /// SYN, which completes the handshake (a spoofed SYN never does).
    pub const ACKED: u8 = 1 << 3;
}

/// The data path's memory of recently created flows, one ring shared by all
/// CPUs: when the connection-tracking table is full, the oldest of them that
/// is not established (TCP without the client's ACK, UDP without a reply)
/// gives way to the new flow, as the kernel's conntrack drops an unassured
/// entry. An established flow is never removed to make room.
///
/// The ring is shared, not per CPU, so a CPU that created no flow lately (a
/// real client's, while a flood runs on another) still finds the flood's
/// flows to remove. Its cursors are written without atomics: two CPUs may
/// write one slot or examine one slot at once. The first loses one flow from
/// the ring (it then only expires), the second examines a flow twice; a slot
/// read while it is written (the newest, or one the writer lapped) is caught
/// by checking that both keys are one flow's before anything is removed.
pub mod new_flows {
    /// Flows remembered (IPv4); a power of two.
    pub const SLOTS: u32 = 4096;
    /// Flows remembered (IPv6; its keys are larger).
    pub const SLOTS6: u32 = 2048;
    /// Remembered flows examined for one removal.
    pub const TRIES: u32 = 4;
    /// Removals one new flow may make: another CPU may take the room one
    /// removal made before this one's insert does.
    pub const ROUNDS: u32 = 3;
}

/// Both keys of one tracked flow, as [`NewFlowsOf`] remembers it
/// (`forward.proto == 0`: an empty or used slot).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyPair<K> {
    pub forward: K,
    pub reply: K,
}

/// The ring of recent new flows of one family ([`new_flows`]). Each cursor
/// has a cache line of its own: every CPU writes `next`, and only a CPU
/// making room writes `evict`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NewFlowsOf<K, const N: usize> {
    /// Where the next new flow is written (wrapping).
    pub next: u32,
    pub _pad_next: [u8; 60],
    /// The next slot examined when room is needed (wrapping).
    pub evict: u32,
    pub _pad_evict: [u8; 60],
    pub pairs: [KeyPair<K>; N],
}

/// The ring of recent IPv4 flows.
pub type NewFlows = NewFlowsOf<CtKey, { new_flows::SLOTS as usize }>;
/// The ring of recent IPv6 flows (fewer slots: its keys are larger).
pub type NewFlows6 = NewFlowsOf<CtKey6, { new_flows::SLOTS6 as usize }>;

/// The data path writes an entry's `last_seen_ns` at most this often (the
/// garbage collector's timeouts are seconds to a day, so a second of
/// imprecision costs nothing, and most packets then write nothing).
pub const CT_REFRESH_NS: u64 = 1_000_000_000;

/// What the agent adds to the table's generation (`names::CT_GEN`) after it
/// removes entries. Only the agent writes it (the data path moves a
/// generation per flow-cache slot instead), so a read and a write suffice.
pub const CT_GEN_AGENT_STEP: u64 = 1;

/// Key of the connection-tracking map of either family (`A`: `u32` for
/// IPv4, [`Addr6Be`] for IPv6; [`CtKey`], [`CtKey6`]). Addresses and ports
/// are as they appear in the packet the entry is looked up with.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKeyOf<A> {
    pub saddr_be: A,
    pub daddr_be: A,
    pub sport_be: u16,
    pub dport_be: u16,
    pub proto: u8,
    /// [`ct_dir`].
    pub dir: u8,
    pub _pad: [u8; 2],
}

/// The IPv4 connection-tracking key.
pub type CtKey = CtKeyOf<u32>;
/// The IPv6 connection-tracking key.
pub type CtKey6 = CtKeyOf<Addr6Be>;

/// Value of the connection-tracking map (a hash allocated per entry, not
/// LRU: the agent removes expired flows, see
/// `proxy-user/src/dataplane/flows/expiry.rs`).
///
/// Each entry carries the address and port its direction is rewritten to:
/// a forward entry the backend's, a reply entry the frontend's. So an
/// established TCP connection keeps reaching its backend after the endpoint
/// leaves the Service (connection draining, as kube-proxy's conntrack does),
/// and a reply is translated with this one lookup. New TCP connections and UDP
/// datagrams only use an entry whose backend is still in the backend map at
/// the same address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtEntryOf<A> {
    /// Forward entries: the backend the flow was given.
    pub backend_id: u32,
    /// Both directions: the service the flow belongs to.
    pub service_id: u32,
    /// Forward entries: the backend's address and port. Reply entries: the
    /// frontend's, which the reply's source becomes.
    pub nat_addr_be: A,
    pub nat_port_be: u16,
    /// [`ct_flags`].
    pub flags: u8,
    /// [`ct_state`]: what this entry's direction has seen.
    pub state: u8,
    /// With [`ct_flags::SNAT`]: forward entries, the node address and port
    /// the source becomes; reply entries, the client address and port the
    /// destination is restored to. Zero otherwise.
    pub snat_addr_be: A,
    pub snat_port_be: u16,
    pub _pad2: [u8; 2],
    /// CLOCK_MONOTONIC (`bpf_ktime_get_coarse_ns()`) when the entry was
    /// created, and again when its TCP connection started closing
    /// ([`ct_flags::CLOSING`]).
    pub created_ns: u64,
    /// CLOCK_MONOTONIC (`bpf_ktime_get_coarse_ns()`, tick resolution) of
    /// the last packet of this direction, written at most every
    /// [`CT_REFRESH_NS`] (and at every state change).
    pub last_seen_ns: u64,
}

/// The IPv4 connection-tracking entry.
pub type CtEntry = CtEntryOf<u32>;
/// The IPv6 connection-tracking entry.
pub type CtEntry6 = CtEntryOf<Addr6Be>;
