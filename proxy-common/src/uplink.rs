//! North-south: source NAT ports, the hairpin address and the uplinks' addresses.

use crate::Addr6Be;

/// Source ports flows from outside to a backend on another node are
/// source-NATed to: two blocks outside Linux's default ephemeral range
/// (32768–60999), so the node's own connections never pick them, and outside
/// the NodePort range (30000–32767): 1024–29999 and 61000–65535, 33512 ports
/// per backend address and port.
pub mod snat {
    pub const LOW_MIN: u16 = 1_024;
    pub const LOW_MAX: u16 = 29_999;
    pub const HIGH_MIN: u16 = 61_000;
    pub const HIGH_MAX: u16 = 65_535;
    /// How many ports the two blocks hold.
    pub const PORTS: u32 = (LOW_MAX - LOW_MIN) as u32 + 1 + (HIGH_MAX - HIGH_MIN) as u32 + 1;
    /// Ports tried for a new flow before it is dropped (and counted).
    pub const ATTEMPTS: u32 = 8;
    /// Ports tried are this far apart (a prime that does not divide the
    /// number of ports), so a run of taken ports does not fail every attempt.
    pub const STRIDE: u32 = 1_031;
    /// A closed TCP flow's port is given to a new flow this long after the
    /// close: past the backend's TIME_WAIT (60 s in Linux), so its kernel
    /// never meets a new connection on a 4-tuple it still remembers. The
    /// ports thus sustain about 33512 / 65 s = 515 new connections per second
    /// to one backend address and port. The agent's garbage collector keeps a
    /// closed source-NATed flow at least this long, and frees a UDP flow's
    /// port when the flow times out.
    pub const REUSE_AFTER_NS: u64 = 65_000_000_000;

    /// The `index`-th SNAT port (`index < PORTS`).
    #[inline(always)]
    pub const fn port(index: u32) -> u16 {
        let low = (LOW_MAX - LOW_MIN) as u32 + 1;
        if index < low {
            LOW_MIN + index as u16
        } else {
            HIGH_MIN + (index - low) as u16
        }
    }

    /// Whether `port` (host order) is one flows are source-NATed to.
    #[inline(always)]
    pub const fn is_snat_port(port: u16) -> bool {
        (port >= LOW_MIN && port <= LOW_MAX) || port >= HIGH_MIN
    }
}

/// Hairpin: a pod that reaches a Service and is given itself as the backend
/// gets the packet with this source address (and its own source port), so its
/// kernel does not see a packet from itself; kube-proxy masquerades such
/// traffic to the node, Cilium uses a loopback address the same way. An
/// IPv4 link-local address (169.254.42.1) that no pod or node uses; pods need
/// no route for it (their replies go to their default gateway, the node,
/// where `sb_from_pod` reverses them and sends them straight back in).
pub mod hairpin {
    /// 169.254.42.1, in network byte order (as in the packet).
    pub const ADDR_BE: u32 = u32::from_ne_bytes(ADDR);
    pub const ADDR: [u8; 4] = [169, 254, 42, 1];
    /// The IPv6 hairpin source: `fd53:6221::1`, a unique-local address no
    /// cluster hands out (as 169.254.42.1 is for IPv4).
    pub const ADDR6: [u8; 16] = [0xfd, 0x53, 0x62, 0x21, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    pub const ADDR6_BE: crate::Addr6Be = crate::addr6_be(ADDR6);
}

/// Value of the uplink map (key: interface index, `u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Uplink {
    /// The interface's IPv4 address: flows from outside to a backend on
    /// another node leave with it as their source.
    pub addr_be: u32,
    /// [`uplink_flags`].
    pub flags: u8,
    pub _pad: [u8; 3],
}

impl Uplink {
    /// The entry of an uplink with IPv4 address `addr_be` (network order)
    /// and [`uplink_flags`] `flags`.
    pub const fn new(addr_be: u32, flags: u8) -> Self {
        Self {
            addr_be,
            flags,
            _pad: [0; 3],
        }
    }
}

/// Bits of [`Uplink::flags`].
pub mod uplink_flags {
    /// The node runs `--nodeport-mode dsr`: a packet arriving on this
    /// uplink with the frontend in a direct-server-return option
    /// ([`crate::dsr`]) is tracked so its backend's replies leave with that
    /// frontend as their source. Without it the option is ignored, so a
    /// host outside cannot choose the source of a pod's replies on a node
    /// that does not use the mode.
    pub const DSR_ACCEPT: u8 = 1 << 0;
    /// An overlay device (VXLAN, WireGuard, an IP tunnel) to other nodes'
    /// pods rather than an uplink: flows from outside whose route leaves
    /// through it are source-NATed to its address, as through an uplink,
    /// but XDP never redirects into it (tunnel devices take no XDP
    /// frames): such a packet goes on to the tc program, which sends it
    /// with `bpf_redirect_neigh`.
    pub const OVERLAY: u8 = 1 << 1;
}

/// Direct server return: the IPv4 option (and the IPv6 destination
/// options header, [`DsrOpt6`]) that carries a flow's frontend
/// from the node that balanced it to its backend's node, right after the
/// fixed IPv4 header of every packet of the flow that node forwards
/// (type, length, port, address: 8 bytes, so the header stays a multiple
/// of four). Its type has the copy bit set (fragments carry it too), class
/// 0, number 26; a receiver that does not know it skips it (RFC 1122
/// 3.2.1.8), so the backend's kernel delivers the packet unchanged.
pub mod dsr {
    /// The option's type byte.
    pub const OPT4_TYPE: u8 = 0x80 | 26;
    /// The option's length, its type and length bytes included.
    pub const OPT4_LEN: u8 = 8;
    /// The largest IPv4 header length (in 32-bit words) the option still
    /// fits in.
    pub const MAX_IHL_BEFORE: u8 = 15 - OPT4_LEN / 4;
    /// IPv6: the option's type in a destination options header right after
    /// the fixed header: 0x1e, an experimental type (RFC 4727) whose top
    /// bits say "skip if unknown, does not change en route", so the
    /// backend's kernel delivers the packet unchanged.
    pub const OPT6_TYPE: u8 = 0x1e;
    /// The option's data: port, two reserved bytes, address.
    pub const OPT6_DATA_LEN: u8 = 20;
    /// The whole destination options header, in bytes.
    pub const HDR6_LEN: u8 = 24;
    /// Its length field: 8-byte units beyond the first.
    pub const HDR6_EXT_LEN: u8 = HDR6_LEN / 8 - 1;
}

/// The IPv6 destination options header carrying the direct-server-return
/// option ([`dsr`]), as it lies in the packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsrOpt6 {
    /// The header that follows (the packet's TCP or UDP).
    pub next_hdr: u8,
    /// [`dsr::HDR6_EXT_LEN`].
    pub hdr_ext_len: u8,
    pub opt_type: u8,
    pub opt_len: u8,
    /// The frontend's port and address.
    pub port_be: u16,
    pub _reserved: [u8; 2],
    pub addr_be: Addr6Be,
}

/// The direct-server-return option as it lies in the packet ([`dsr`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DsrOpt4 {
    pub kind: u8,
    pub len: u8,
    /// The frontend's port and address.
    pub port_be: u16,
    pub addr_be: u32,
}

/// Value of the IPv6 uplink map (key: interface index, `u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct Uplink6 {
    /// The interface's global IPv6 address (all-zero: none, and flows to
    /// IPv6 backends on other nodes are dropped): flows from outside to an
    /// IPv6 backend on another node leave with it as their source.
    pub addr_be: Addr6Be,
}
