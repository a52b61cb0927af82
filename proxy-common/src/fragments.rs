//! Fragments: what the first fragment of a translated datagram leaves for its later ones.

use crate::Addr6Be;

/// Key of the fragment map: one fragmented datagram, as the packets the
/// entry is looked up with carry it (before the rewrite).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FragKey {
    pub saddr_be: u32,
    pub daddr_be: u32,
    /// The IPv4 identification field.
    pub id_be: u16,
    pub proto: u8,
    /// [`ct_dir`]: `FORWARD` for `sb_from_pod` (destination rewritten),
    /// `REPLY` for `sb_to_pod` (source rewritten).
    pub dir: u8,
}

/// Value of the fragment map: what the datagram's first fragment was
/// rewritten to. Later fragments get `addr_be` (as destination for `FORWARD`,
/// as source for `REPLY`; for [`frag::UPLINK`] as destination, and
/// `src_addr_be` as source when it is not 0); the port lives only in the
/// first fragment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FragEntry {
    pub addr_be: u32,
    pub port_be: u16,
    /// [`ct_dir`], as in the key.
    pub dir: u8,
    pub _pad: u8,
    pub service_id: u32,
    /// [`frag::UPLINK`] entries of flows whose source is rewritten too (to a
    /// backend on another node, and their replies): the new source. 0
    /// otherwise.
    pub src_addr_be: u32,
    /// `bpf_ktime_get_ns()` of the first fragment; entries older than
    /// [`frag::TIMEOUT_NS`] are not used (the IP id may have been reused).
    pub created_ns: u64,
}

/// Fragment tracking.
pub mod frag {
    /// How long a first fragment's translation serves later fragments:
    /// Linux's default reassembly timeout (`ipfrag_time`, 30 s).
    pub const TIMEOUT_NS: u64 = 30_000_000_000;
    /// [`super::FragKey::dir`] of datagrams the uplink tc program translated
    /// (the destination always, the source when `src_addr_be` is set).
    pub const UPLINK: u8 = 2;
}

/// [`FragKey`] of an IPv6 datagram: the fragment header's 32-bit
/// identification.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FragKey6 {
    pub saddr_be: Addr6Be,
    pub daddr_be: Addr6Be,
    pub id_be: u32,
    pub proto: u8,
    pub dir: u8,
    pub _pad: [u8; 2],
}

/// [`FragEntry`] of an IPv6 datagram.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(bytemuck::Pod, bytemuck::Zeroable))]
pub struct FragEntry6 {
    pub addr_be: Addr6Be,
    pub port_be: u16,
    pub dir: u8,
    pub _pad: u8,
    pub service_id: u32,
    pub src_addr_be: Addr6Be,
    pub created_ns: u64,
}
