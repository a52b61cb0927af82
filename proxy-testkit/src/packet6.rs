//! Building and checking Ethernet/IPv6/TCP/UDP/ICMPv6 frames: the IPv6
//! twins of [`crate::packet`]'s builders, extension headers and fragments
//! included, with checksums computed here over the IPv6 pseudo-header
//! (RFC 8200 8.1), independently of the kernel.
use std::net::Ipv6Addr;

pub const ETH_P_IPV6: u16 = 0x86dd;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;
pub const NEXTHDR_HOP: u8 = 0;
pub const NEXTHDR_ROUTING: u8 = 43;
pub const NEXTHDR_FRAGMENT: u8 = 44;
pub const NEXTHDR_DEST: u8 = 60;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_RST: u8 = 0x04;

pub const POD_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
pub const NODE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// An IPv6 TCP or UDP frame: what the fixtures vary.
#[derive(Clone, Debug)]
pub struct Packet6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    pub tcp_flags: u8,
    pub seq: u32,
    pub ack: u32,
    pub window: u16,
    pub payload: Vec<u8>,
    /// Extension headers before the L4 header (hop-by-hop, routing,
    /// destination options), each 8 bytes of padding options.
    pub ext: Vec<u8>,
    /// Send a UDP checksum of 0.
    pub udp_zero_checksum: bool,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
}

impl Packet6 {
    pub fn tcp(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Self {
        Self {
            src,
            dst,
            sport,
            dport,
            proto: PROTO_TCP,
            tcp_flags: TCP_SYN,
            seq: 0x1000_0000,
            ack: 0,
            window: 64240,
            payload: Vec::new(),
            ext: Vec::new(),
            udp_zero_checksum: false,
            src_mac: POD_MAC,
            dst_mac: NODE_MAC,
        }
    }

    pub fn udp(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16) -> Self {
        Self {
            proto: PROTO_UDP,
            tcp_flags: 0,
            payload: b"switchboard-v6".to_vec(),
            ..Self::tcp(src, sport, dst, dport)
        }
    }

    /// The TCP or UDP header and payload, with its checksum.
    pub fn l4(&self) -> Vec<u8> {
        let mut l4 = Vec::new();
        l4.extend_from_slice(&self.sport.to_be_bytes());
        l4.extend_from_slice(&self.dport.to_be_bytes());
        if self.proto == PROTO_TCP {
            l4.extend_from_slice(&self.seq.to_be_bytes());
            l4.extend_from_slice(&self.ack.to_be_bytes());
            l4.push(5 << 4);
            l4.push(self.tcp_flags);
            l4.extend_from_slice(&self.window.to_be_bytes());
            l4.extend_from_slice(&[0, 0, 0, 0]);
        } else {
            let len = (8 + self.payload.len()) as u16;
            l4.extend_from_slice(&len.to_be_bytes());
            l4.extend_from_slice(&[0, 0]);
        }
        l4.extend_from_slice(&self.payload);
        let csum_off = if self.proto == PROTO_TCP { 16 } else { 6 };
        if !(self.proto == PROTO_UDP && self.udp_zero_checksum) {
            let mut c = l4_checksum(self.src, self.dst, self.proto, &l4);
            if self.proto == PROTO_UDP && c == 0 {
                c = 0xffff;
            }
            l4[csum_off..csum_off + 2].copy_from_slice(&c.to_be_bytes());
        }
        l4
    }

    pub fn build(&self) -> Vec<u8> {
        let (next, ext) = ext_chain(&self.ext, self.proto);
        frame(
            self.src_mac,
            self.dst_mac,
            self.src,
            self.dst,
            next,
            &[ext, self.l4()].concat(),
        )
    }

    /// The datagram cut into fragments of `chunk` bytes of L4 data (a
    /// multiple of 8), all with identification `id`.
    pub fn fragments(&self, chunk: usize, id: u32) -> Vec<Vec<u8>> {
        assert_eq!(chunk % 8, 0);
        let l4 = self.l4();
        let pieces: Vec<&[u8]> = l4.chunks(chunk).collect();
        pieces
            .iter()
            .enumerate()
            .map(|(i, piece)| {
                let offset = (i * chunk / 8) as u16;
                let more = i + 1 < pieces.len();
                let mut body = vec![self.proto, 0];
                body.extend_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
                body.extend_from_slice(&id.to_be_bytes());
                body.extend_from_slice(piece);
                frame(
                    self.src_mac,
                    self.dst_mac,
                    self.src,
                    self.dst,
                    NEXTHDR_FRAGMENT,
                    &body,
                )
            })
            .collect()
    }
}

/// Extension headers `types` (8 bytes each: next header, length 0, a PadN
/// option of 4 bytes) in front of protocol `last`: the first next-header
/// value and the bytes.
pub fn ext_chain(types: &[u8], last: u8) -> (u8, Vec<u8>) {
    let mut bytes = Vec::new();
    for (i, _) in types.iter().enumerate() {
        let next = types.get(i + 1).copied().unwrap_or(last);
        bytes.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
    }
    (types.first().copied().unwrap_or(last), bytes)
}

/// An Ethernet + IPv6 frame around `payload` (extension headers included),
/// hop limit 64.
pub fn frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    f.push(next);
    f.push(64);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(payload);
    f
}

/// An ICMPv6 message (type, code, the 4-byte field, body) in a frame, with
/// its checksum.
pub fn icmp6_frame(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    icmp_type: u8,
    code: u8,
    rest: u32,
    body: &[u8],
) -> Vec<u8> {
    icmp6_frame_macs(POD_MAC, NODE_MAC, src, dst, icmp_type, code, rest, body)
}

/// [`icmp6_frame`] with the given Ethernet addresses.
#[allow(clippy::too_many_arguments)]
pub fn icmp6_frame_macs(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    icmp_type: u8,
    code: u8,
    rest: u32,
    body: &[u8],
) -> Vec<u8> {
    let mut msg = vec![icmp_type, code, 0, 0];
    msg.extend_from_slice(&rest.to_be_bytes());
    msg.extend_from_slice(body);
    let c = l4_checksum(src, dst, PROTO_ICMPV6, &msg);
    msg[2..4].copy_from_slice(&c.to_be_bytes());
    frame(src_mac, dst_mac, src, dst, PROTO_ICMPV6, &msg)
}

/// The Internet checksum of the IPv6 pseudo-header and `data` (the upper-
/// layer packet with its checksum field as it is): 0 when `data` carries a
/// valid checksum.
pub fn l4_checksum(src: Ipv6Addr, dst: Ipv6Addr, next: u8, data: &[u8]) -> u16 {
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&src.octets());
    pseudo.extend_from_slice(&dst.octets());
    pseudo.extend_from_slice(&(data.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, next]);
    pseudo.extend_from_slice(data);
    if pseudo.len() % 2 == 1 {
        pseudo.push(0);
    }
    let mut sum: u32 = pseudo
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A parsed IPv6 frame, as far as the checks need.
pub struct Parsed6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    /// The upper-layer protocol and where its header starts.
    pub proto: u8,
    pub l4_off: usize,
    /// Fragment header: (offset in 8-byte units, more fragments).
    pub fragment: Option<(u16, bool)>,
}

/// Parses an Ethernet + IPv6 frame (extension headers walked), if it is one.
pub fn parse6(frame: &[u8]) -> Option<Parsed6> {
    if frame.len() < 54 || frame[12..14] != ETH_P_IPV6.to_be_bytes() || frame[14] >> 4 != 6 {
        return None;
    }
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[22..38]).ok()?);
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[38..54]).ok()?);
    let mut next = frame[20];
    let mut off = 54;
    let mut fragment = None;
    for _ in 0..8 {
        match next {
            NEXTHDR_HOP | NEXTHDR_ROUTING | NEXTHDR_DEST => {
                let len = (usize::from(*frame.get(off + 1)?) + 1) * 8;
                next = *frame.get(off)?;
                off += len;
            }
            NEXTHDR_FRAGMENT => {
                let word = u16::from_be_bytes([*frame.get(off + 2)?, *frame.get(off + 3)?]);
                fragment = Some((word >> 3, word & 1 != 0));
                next = *frame.get(off)?;
                off += 8;
            }
            _ => break,
        }
    }
    Some(Parsed6 {
        src,
        dst,
        proto: next,
        l4_off: off,
        fragment,
    })
}

/// Whether an IPv6 frame's TCP, UDP or ICMPv6 checksum is valid (computed
/// here, independently of the programs). Frames that are not IPv6, are cut
/// short, or are fragments (their checksum covers the whole datagram) have
/// nothing to judge: `true`. A UDP checksum of 0 counts as valid only when
/// `zero_ok`.
pub fn checksums_valid6(frame: &[u8], zero_ok: bool) -> bool {
    let Some(p) = parse6(frame) else { return true };
    if p.fragment.is_some() || !matches!(p.proto, PROTO_TCP | PROTO_UDP | PROTO_ICMPV6) {
        return true;
    }
    let payload_len = usize::from(u16::from_be_bytes([frame[18], frame[19]]));
    let end = 54 + payload_len;
    if end > frame.len() || p.l4_off > end {
        return true;
    }
    let data = &frame[p.l4_off..end];
    if p.proto == PROTO_UDP && data.len() >= 8 && data[6..8] == [0, 0] {
        return zero_ok;
    }
    l4_checksum(p.src, p.dst, p.proto, data) == 0
}
