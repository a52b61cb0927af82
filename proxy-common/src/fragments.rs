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

/// Value of the fragment maps of either family ([`FragEntry`],
/// [`FragEntry6`]): what the datagram's first fragment was rewritten to.
/// Later fragments get `addr_be` (as destination for `FORWARD`, as source
/// for `REPLY`; for [`frag::UPLINK`] as destination, and `src_addr_be` as
/// source when it is not 0); the port lives only in the first fragment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FragEntryOf<A> {
    pub addr_be: A,
    pub port_be: u16,
    /// [`ct_dir`], as in the key.
    pub dir: u8,
    pub _pad: u8,
    pub service_id: u32,
    /// [`frag::UPLINK`] entries of flows whose source is rewritten too (to a
    /// backend on another node, and their replies): the new source. 0
    /// otherwise.
    pub src_addr_be: A,
    /// `bpf_ktime_get_ns()` of the first fragment; entries older than
    /// [`frag::TIMEOUT_NS`] are not used (the IP id may have been reused).
    pub created_ns: u64,
}

/// An IPv4 datagram's fragment entry.
pub type FragEntry = FragEntryOf<u32>;
/// An IPv6 datagram's fragment entry.
pub type FragEntry6 = FragEntryOf<Addr6Be>;

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
