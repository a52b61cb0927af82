//! IPv6 addresses in map form.

/// An IPv6 address as the maps hold it: four words, each in network byte
/// order (the address's 16 bytes in order), as `bpf_sock_addr::user_ip6` and
/// the IPv6 header hold it.
pub type Addr6Be = [u32; 4];

/// The map form of an IPv6 address given as its 16 bytes.
#[inline(always)]
pub const fn addr6_be(octets: [u8; 16]) -> Addr6Be {
    let o = octets;
    [
        u32::from_ne_bytes([o[0], o[1], o[2], o[3]]),
        u32::from_ne_bytes([o[4], o[5], o[6], o[7]]),
        u32::from_ne_bytes([o[8], o[9], o[10], o[11]]),
        u32::from_ne_bytes([o[12], o[13], o[14], o[15]]),
    ]
}

/// The 16 bytes of an IPv6 address in map form.
#[inline(always)]
pub const fn addr6_octets(addr: Addr6Be) -> [u8; 16] {
    let [a, b, c, d] = [
        addr[0].to_ne_bytes(),
        addr[1].to_ne_bytes(),
        addr[2].to_ne_bytes(),
        addr[3].to_ne_bytes(),
    ];
    [
        a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3], c[0], c[1], c[2], c[3], d[0], d[1], d[2],
        d[3],
    ]
}
