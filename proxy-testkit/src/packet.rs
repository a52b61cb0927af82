//! Building and checking Ethernet/IPv4/TCP/UDP frames: the fixtures the
//! data-path tests and benchmarks feed through `BPF_PROG_TEST_RUN`, with
//! checksums computed here independently of the kernel.
use std::net::Ipv4Addr;

pub const ETH_HLEN: usize = 14;

/// A TCP or UDP packet to build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PacketSpec {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
    /// 6 (TCP) or 17 (UDP); anything else gets no L4 header.
    pub proto: u8,
    pub payload: Vec<u8>,
    /// IPv4 options as they go in the header, first (a multiple of 4
    /// bytes), such as switchboard's direct-server-return option.
    pub ip_options: Vec<u8>,
    /// Extra IPv4 header words (options) after `ip_options`, each 4 bytes
    /// of NOP (0x01).
    pub ip_option_words: u8,
    /// Raw IPv4 flags+fragment offset field (host order).
    pub frag_off: u16,
    /// UDP only: send with checksum 0 ("no checksum").
    pub udp_zero_checksum: bool,
    /// TCP flags byte (SYN = 0x02).
    pub tcp_flags: u8,
    /// IPv4 identification field.
    pub ip_id: u16,
}

impl PacketSpec {
    pub fn tcp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        Self {
            src,
            dst,
            sport,
            dport,
            proto: 6,
            payload: Vec::new(),
            ip_options: Vec::new(),
            ip_option_words: 0,
            frag_off: 0x4000, // DF
            udp_zero_checksum: false,
            tcp_flags: 0x02,
            ip_id: 0x1234,
        }
    }

    pub fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        Self {
            proto: 17,
            payload: b"query".to_vec(),
            ..Self::tcp(src, sport, dst, dport)
        }
    }

    /// The whole frame with valid IPv4 and L4 checksums.
    pub fn build(&self) -> Vec<u8> {
        self.frame(self.frag_off, &self.segment())
    }

    /// The datagram as IPv4 fragments, each carrying at most `chunk` bytes of
    /// it (rounded down to a multiple of 8): the first with the L4 header, all
    /// with this spec's IP id, more-fragments set on all but the last, and
    /// valid IPv4 checksums. The L4 checksum covers the whole datagram.
    pub fn fragments(&self, chunk: usize) -> Vec<Vec<u8>> {
        let chunk = (chunk / 8).max(1) * 8;
        let segment = self.segment();
        let pieces: Vec<&[u8]> = segment.chunks(chunk).collect();
        pieces
            .iter()
            .enumerate()
            .map(|(i, piece)| {
                let more = if i + 1 < pieces.len() { 0x2000 } else { 0 };
                self.frame(more | ((i * chunk / 8) as u16), piece)
            })
            .collect()
    }

    /// Ethernet + IPv4 header (with `frag_off`) + `data` as the IP payload.
    fn frame(&self, frag_off: u16, data: &[u8]) -> Vec<u8> {
        let ihl = 20 + self.ip_options.len() + 4 * usize::from(self.ip_option_words);
        let total = ihl + data.len();
        let mut frame = Vec::with_capacity(ETH_HLEN + total);
        frame.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x02]); // dst MAC
        frame.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]); // src MAC
        frame.extend_from_slice(&0x0800u16.to_be_bytes());
        let mut ip = vec![0u8; ihl];
        ip[0] = 0x40 | (ihl / 4) as u8;
        ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&self.ip_id.to_be_bytes());
        ip[6..8].copy_from_slice(&frag_off.to_be_bytes());
        ip[8] = 64;
        ip[9] = self.proto;
        ip[12..16].copy_from_slice(&self.src.octets());
        ip[16..20].copy_from_slice(&self.dst.octets());
        let nops = 20 + self.ip_options.len();
        ip[20..nops].copy_from_slice(&self.ip_options);
        for byte in &mut ip[nops..] {
            *byte = 0x01;
        }
        let csum = checksum(&ip, 0);
        ip[10..12].copy_from_slice(&csum.to_be_bytes());
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(data);
        frame
    }

    /// The L4 header and payload, with the L4 checksum.
    fn segment(&self) -> Vec<u8> {
        let l4 = match self.proto {
            6 => tcp_header(self),
            17 => udp_header(self),
            _ => Vec::new(),
        };
        let mut segment = l4;
        segment.extend_from_slice(&self.payload);
        let csum_at = match self.proto {
            6 => Some(16),
            17 if !self.udp_zero_checksum => Some(6),
            _ => None,
        };
        if let Some(at) = csum_at {
            let mut csum = checksum(&segment, pseudo_header_sum(self, segment.len()));
            if self.proto == 17 && csum == 0 {
                csum = 0xffff;
            }
            segment[at..at + 2].copy_from_slice(&csum.to_be_bytes());
        }
        segment
    }
}

/// An ICMP message frame from `src` to `dst`: type, code, the 4 bytes after
/// the checksum (`rest`: the next-hop MTU in its low 16 bits for
/// "fragmentation needed"), then `quoted` (for an error: the IPv4 header and
/// the first bytes of the packet it is about), with valid checksums.
pub fn icmp_frame(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    icmp_type: u8,
    code: u8,
    rest: u32,
    quoted: &[u8],
) -> Vec<u8> {
    let mut message = vec![icmp_type, code, 0, 0];
    message.extend_from_slice(&rest.to_be_bytes());
    message.extend_from_slice(quoted);
    let csum = checksum(&message, 0);
    message[2..4].copy_from_slice(&csum.to_be_bytes());
    PacketSpec {
        proto: 1,
        payload: message,
        frag_off: 0,
        ..PacketSpec::tcp(src, 0, dst, 0)
    }
    .build()
}

/// Whether an ICMP error frame's checksums are valid: the outer IPv4
/// header's, the ICMP message's and the quoted IPv4 header's.
pub fn icmp_error_checksums_valid(frame: &[u8]) -> bool {
    let Some(ip) = frame.get(ETH_HLEN..) else {
        return false;
    };
    let ihl = usize::from(ip.first().copied().unwrap_or(0) & 0x0f) * 4;
    let total = ip
        .get(2..4)
        .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
    let (Some(header), Some(message)) = (ip.get(..ihl), ip.get(ihl..total)) else {
        return false;
    };
    let Some(quoted) = message.get(8..) else {
        return false;
    };
    let inner_ihl = usize::from(quoted.first().copied().unwrap_or(0) & 0x0f) * 4;
    let Some(inner) = quoted.get(..inner_ihl) else {
        return false;
    };
    checksum(header, 0) == 0 && checksum(message, 0) == 0 && checksum(inner, 0) == 0
}

fn tcp_header(spec: &PacketSpec) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0..2].copy_from_slice(&spec.sport.to_be_bytes());
    h[2..4].copy_from_slice(&spec.dport.to_be_bytes());
    h[4..8].copy_from_slice(&1000u32.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = spec.tcp_flags;
    h[14..16].copy_from_slice(&64240u16.to_be_bytes());
    h
}

fn udp_header(spec: &PacketSpec) -> Vec<u8> {
    let mut h = vec![0u8; 8];
    h[0..2].copy_from_slice(&spec.sport.to_be_bytes());
    h[2..4].copy_from_slice(&spec.dport.to_be_bytes());
    h[4..6].copy_from_slice(&((8 + spec.payload.len()) as u16).to_be_bytes());
    h
}

fn pseudo_header_sum(spec: &PacketSpec, l4_len: usize) -> u32 {
    let mut sum = 0u32;
    for addr in [spec.src, spec.dst] {
        let o = addr.octets();
        sum += u32::from(u16::from_be_bytes([o[0], o[1]]));
        sum += u32::from(u16::from_be_bytes([o[2], o[3]]));
    }
    sum + u32::from(spec.proto) + l4_len as u32
}

/// The Internet checksum (RFC 1071) of `data`, starting from `initial`.
pub fn checksum(data: &[u8], initial: u32) -> u16 {
    let mut sum = initial;
    for chunk in data.chunks(2) {
        let word = match chunk {
            [a, b] => u16::from_be_bytes([*a, *b]),
            [a] => u16::from_be_bytes([*a, 0]),
            _ => 0,
        };
        sum += u32::from(word);
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Whether the IPv4 header checksum and the TCP/UDP checksum of `frame` are
/// valid (a UDP checksum of 0 means "none" and is valid).
pub fn checksums_valid(frame: &[u8]) -> bool {
    let Some(ip) = frame.get(ETH_HLEN..) else {
        return false;
    };
    let Some(&version_ihl) = ip.first() else {
        return false;
    };
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    let (Some(header), Some(&proto)) = (ip.get(..ihl), ip.get(9)) else {
        return false;
    };
    if checksum(header, 0) != 0 {
        return false;
    }
    let total = ip
        .get(2..4)
        .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
    let Some(segment) = ip.get(ihl..total) else {
        return false;
    };
    if proto == 17 && segment.get(6..8) == Some(&[0, 0]) {
        return true;
    }
    let mut sum = 0u32;
    for pair in ip[12..20].chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    sum += u32::from(proto) + segment.len() as u32;
    checksum(segment, sum) == 0
}

/// The ICMP port unreachable (type 3, code 3) a frontend without endpoints
/// answers `frame` (an Ethernet + IPv4 TCP/UDP frame without IP options)
/// with, built from scratch: Ethernet addresses swapped; IPv4 from the
/// address the client sent to, to the client, TTL 64, id 0, no flags, the
/// original TOS; then the ICMP header and the original IPv4 header with the
/// first 8 bytes of its payload (RFC 792). Checksums computed here.
pub fn icmp_port_unreachable(frame: &[u8]) -> Vec<u8> {
    icmp_answer(frame, 3, 0)
}

/// The ICMP "fragmentation needed" (type 3, code 4, next-hop `mtu`) a
/// program answers `frame` with, built as [`icmp_port_unreachable`] is.
pub fn icmp_fragmentation_needed(frame: &[u8], mtu: u16) -> Vec<u8> {
    icmp_answer(frame, 4, mtu)
}

/// A destination-unreachable answer of `code` to `frame` from its
/// destination, with `mtu` in the header's last two bytes.
fn icmp_answer(frame: &[u8], code: u8, mtu: u16) -> Vec<u8> {
    let quote = &frame[ETH_HLEN..ETH_HLEN + 28];
    let mut out = Vec::with_capacity(ETH_HLEN + 56);
    out.extend_from_slice(&frame[6..12]);
    out.extend_from_slice(&frame[0..6]);
    out.extend_from_slice(&0x0800u16.to_be_bytes());
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[1] = quote[1];
    ip[2..4].copy_from_slice(&56u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 1;
    ip[12..16].copy_from_slice(&quote[16..20]);
    ip[16..20].copy_from_slice(&quote[12..16]);
    let csum = checksum(&ip, 0);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    out.extend_from_slice(&ip);
    let [mtu_hi, mtu_lo] = mtu.to_be_bytes();
    let mut icmp = vec![3u8, code, 0, 0, 0, 0, mtu_hi, mtu_lo];
    icmp.extend_from_slice(quote);
    let csum = checksum(&icmp, 0);
    icmp[2..4].copy_from_slice(&csum.to_be_bytes());
    out.extend_from_slice(&icmp);
    out
}

/// Whether `frame` is an IPv4 ICMP message whose IPv4 header checksum and
/// ICMP checksum are both valid.
pub fn icmp_checksums_valid(frame: &[u8]) -> bool {
    let Some(ip) = frame.get(ETH_HLEN..) else {
        return false;
    };
    let ihl = usize::from(ip.first().map_or(0, |b| b & 0x0f)) * 4;
    let total = ip
        .get(2..4)
        .map_or(0, |b| usize::from(u16::from_be_bytes([b[0], b[1]])));
    match (ip.get(..ihl), ip.get(9), ip.get(ihl..total)) {
        (Some(header), Some(1), Some(icmp)) if ihl >= 20 => {
            checksum(header, 0) == 0 && checksum(icmp, 0) == 0
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 244, 100, 2);
    const B: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

    #[test]
    fn built_frames_have_valid_checksums() {
        assert!(checksums_valid(&PacketSpec::tcp(A, 40000, B, 80).build()));
        assert!(checksums_valid(&PacketSpec::udp(A, 40000, B, 53).build()));
        let options = PacketSpec {
            ip_option_words: 2,
            ..PacketSpec::tcp(A, 1, B, 2)
        };
        assert!(checksums_valid(&options.build()));
    }

    #[test]
    fn a_flipped_bit_is_caught() {
        let mut frame = PacketSpec::tcp(A, 40000, B, 80).build();
        frame[ETH_HLEN + 16] ^= 1;
        assert!(!checksums_valid(&frame));
        let mut frame = PacketSpec::udp(A, 40000, B, 53).build();
        let last = frame.len() - 1;
        frame[last] ^= 0x10;
        assert!(!checksums_valid(&frame));
    }

    #[test]
    fn checksum_matches_the_rfc_1071_example() {
        // RFC 1071 section 3: the sum of these words is 0xddf2 (before complement).
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(&data, 0), !0xddf2);
    }
}
