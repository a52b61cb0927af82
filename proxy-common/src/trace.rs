//! The live trace of the data path (`switchboard trace`): the events the
//! programs write to a BPF ring buffer, and the switch that turns each kind
//! on.
//!
//! - [`TraceEvent`]: one event, both families (16-byte addresses and a
//!   family field), written to the ring buffer `SB_TRACE_V1`
//!   ([`RING_BYTES`] bytes: bounded, so a flood loses events instead of
//!   slowing the data path; each reserve that fails is counted in the
//!   per-CPU `SB_TRACE_LOST_V1`).
//! - The switch: one `u64` whose bit `1 << kind` turns [`kind`] on, a
//!   global of the programs in the data section `.data.sb_trace_on`, which
//!   the loader makes a one-entry array map of that name
//!   ([`crate::names::TRACE_ON`]). Only the agent writes it (the union of
//!   its connected `trace` clients' kinds); a program reads it (one load)
//!   only where an event would be emitted (a new flow, a drop), never on an
//!   established flow's packet. None of the three maps is pinned: they live
//!   with the agent's loaded object.

/// The event kinds; bit `1 << kind` of the switch turns one on.
pub mod kind {
    /// A packet of ours that was dropped, answered (rejected) or passed
    /// untranslated; [`super::TraceEvent::reason`] says why.
    pub const DROP: u8 = 0;
    /// A new flow was given a backend (the socket layer: a socket).
    pub const NEW_FLOW: u8 = 1;
    /// A packet to an address and port a reverse translation would own (the
    /// uplink's source-NAT port range) found no tracked flow.
    pub const REVNAT_MISS: u8 = 2;
    pub const COUNT: u8 = 3;
    /// Names, by kind, for the CLI.
    pub const NAMES: [&str; COUNT as usize] = ["drop", "new-flow", "revnat-miss"];
    /// Every kind's bit.
    pub const ALL: u64 = (1 << COUNT) - 1;
}

/// Where the event was decided.
pub mod layer {
    /// The cgroup socket hooks (connect, sendmsg).
    pub const SOCKET: u8 = 1;
    /// The tc programs (pod veths and, with `--xdp-mode off` or for what XDP
    /// hands on, uplinks).
    pub const TC: u8 = 2;
    /// The XDP program on the uplinks.
    pub const XDP: u8 = 3;
    /// Names, by layer (index 0: unknown).
    pub const NAMES: [&str; 4] = ["unknown", "socket", "tc", "xdp"];
}

/// What happened to the packet (or the socket call) of a [`kind::DROP`]
/// event.
pub mod verdict {
    pub const DROPPED: u8 = 0;
    /// Passed on untouched (malformed, a fragment of no known datagram).
    pub const PASSED: u8 = 1;
    /// Answered instead of forwarded (ICMP unreachable, TCP reset,
    /// `ECONNREFUSED` at the socket layer): kube-proxy's REJECT.
    pub const ANSWERED: u8 = 2;
    pub const NAMES: [&str; 3] = ["dropped", "passed", "answered"];
}

/// Why: the reasons of [`kind::DROP`] events are the indices of the global
/// counters that count them ([`crate::stat`]: `drop_no_backend`,
/// `ct_full`, `snat_exhausted`, `malformed`, `frag_unknown`, `no_route`,
/// ...), so an event and its counter share a name, plus the ones below,
/// which have no global counter.
pub mod reason {
    /// The client is outside the frontend's `loadBalancerSourceRanges`
    /// (counted per Service in `SB_SVC_DENIED_V1`).
    pub const SOURCE_DENIED: u8 = 64;
    /// The name of a reason.
    pub fn name(reason: u8) -> &'static str {
        match reason {
            SOURCE_DENIED => "source_denied",
            r if (r as u32) < crate::stat::COUNT => crate::stat::NAMES[r as usize],
            _ => "unknown",
        }
    }
}

/// `SB_TRACE_V1`'s size in bytes (a power of two, a multiple of the page
/// size): about 2,900 events of 88 bytes with their ring-buffer header.
pub const RING_BYTES: u32 = 256 * 1024;

/// One event of the trace (see the module's documentation). Addresses are
/// network order, in the first word for IPv4 (the other three zero); an
/// address the layer does not know (the client of a socket-layer event,
/// the backend of a drop) is all-zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct TraceEvent {
    /// `bpf_ktime_get_ns` (monotonic, boot-based) when it was emitted.
    pub ts_ns: u64,
    pub client_addr_be: [u32; 4],
    pub frontend_addr_be: [u32; 4],
    pub backend_addr_be: [u32; 4],
    /// The Service port's id (`SB_RNAT_V1`'s key), 0 if none was found.
    pub service_id: u32,
    /// The frontend's slot-0 flags (`frontend_flags`: kind, algorithm).
    pub frontend_flags: u16,
    pub client_port_be: u16,
    pub frontend_port_be: u16,
    pub backend_port_be: u16,
    /// [`kind`].
    pub kind: u8,
    /// [`reason`] (drops).
    pub reason: u8,
    /// [`layer`].
    pub layer: u8,
    /// 4, 6, or 0 when the packet could not be read (malformed).
    pub family: u8,
    /// IP protocol number (6 TCP, 17 UDP), 0 if unknown.
    pub proto: u8,
    /// [`verdict`] (drops).
    pub verdict: u8,
    pub _pad: [u8; 6],
}
