//! Work done in-process inside one of the sandbox's network namespaces: a
//! short-lived thread enters the namespace (`setns` changes only the calling
//! thread, see [`proxy_testkit::netns::in_netns`]), does its job and ends.
//! Used where no command-line tool exists on these machines (there is no
//! `ethtool`) or where a tool would be overkill (a one-request HTTP client).
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use proxy_testkit::netns::ifindex;
pub use proxy_testkit::netns::in_netns;

/// `SIOCETHTOOL` from `<linux/sockios.h>`.
const SIOCETHTOOL: libc::c_ulong = 0x8946;
/// `ETHTOOL_GGRO` / `ETHTOOL_SGRO` from `<linux/ethtool.h>`.
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;
/// `ETHTOOL_GTXCSUM` / `ETHTOOL_STXCSUM`.
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_STXCSUM: u32 = 0x17;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ifreq` with the `ifr_data` member of its union (the union is 24
/// bytes on 64-bit Linux).
#[repr(C)]
struct IfreqData {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

/// One ethtool get/set-value ioctl on `ifname` in the calling thread's
/// namespace; returns the value the kernel left in `data`.
fn ethtool_value(ifname: &str, cmd: u32, data: u32) -> Result<u32> {
    if ifname.len() >= libc::IFNAMSIZ {
        bail!("interface name {ifname:?} too long");
    }
    let mut value = EthtoolValue { cmd, data };
    let mut req = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: (&mut value as *mut EthtoolValue).cast(),
        _pad: [0; 16],
    };
    for (dst, src) in req.name.iter_mut().zip(ifname.bytes()) {
        *dst = src as libc::c_char;
    }
    // SAFETY: a plain datagram socket, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket(AF_INET, SOCK_DGRAM)");
    }
    // SAFETY: `req` is a valid ifreq whose data points at `value`; both
    // outlive the call.
    let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut req as *mut IfreqData) };
    let err = std::io::Error::last_os_error();
    // SAFETY: fd was opened above.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(err).with_context(|| format!("SIOCETHTOOL cmd {cmd:#x} on {ifname}"));
    }
    Ok(value.data)
}

/// Turns GRO on for `ifname` in namespace `ns` (`ethtool -K IF gro on`) and
/// reads it back. On a veth, GRO enables NAPI, which the receiving end of an
/// XDP_TX or XDP redirect into the veth needs.
pub fn enable_gro(ns: &str, ifname: &str) -> Result<()> {
    let on = in_netns(ns, || {
        ethtool_value(ifname, ETHTOOL_SGRO, 1)?;
        ethtool_value(ifname, ETHTOOL_GGRO, 0)
    })
    .with_context(|| format!("enable GRO on {ifname} in {ns}"))?;
    if on != 1 {
        bail!("GRO on {ifname} in {ns} reads back as off after ETHTOOL_SGRO");
    }
    Ok(())
}

/// Turns transmit checksum offload off for `ifname` in namespace `ns`
/// (`ethtool -K IF tx off`), so its sender's kernel writes complete TCP/UDP
/// checksums, as every frame on a wire carries them. Over a veth, offload
/// would leave the packet's checksum field holding only the pseudo-header
/// sum, which the receiving side finishes from the skb's metadata; an XDP
/// program on a router's uplink never sees such a frame from a real NIC, and
/// the frame it sends back out (XDP_TX) has no metadata to finish it with.
pub fn disable_tx_checksum(ns: &str, ifname: &str) -> Result<()> {
    let on = in_netns(ns, || {
        ethtool_value(ifname, ETHTOOL_STXCSUM, 0)?;
        ethtool_value(ifname, ETHTOOL_GTXCSUM, 0)
    })
    .with_context(|| format!("turn tx checksum offload off on {ifname} in {ns}"))?;
    if on != 0 {
        bail!("tx checksum offload on {ifname} in {ns} reads back as on after ETHTOOL_STXCSUM");
    }
    Ok(())
}

/// Attaches a two-instruction XDP program that passes every frame
/// (`r0 = XDP_PASS; exit`) to `ifname` in namespace `ns`, natively, and
/// returns the BPF link that holds it (it goes when the fd is closed or the
/// interface is deleted).
///
/// Why: a veth delivers the frames an XDP program on its peer sends back with
/// `XDP_TX` into its own ring, but schedules its NAPI to take them out only
/// when it has an XDP program itself; with GRO alone they wait for the next
/// ordinary packet to come along. A real NIC has no such peer. The LAN-side
/// ends of the uplinks carry this program so that XDP_TX frames reach the
/// wire at once.
pub fn attach_xdp_pass(ns: &str, ifname: &str) -> Result<std::os::fd::OwnedFd> {
    in_netns(ns, || {
        let index = ifindex(ifname)?;
        let prog = load_xdp_pass()?;
        create_xdp_link(&prog, index)
    })
    .with_context(|| format!("attach an XDP_PASS program to {ifname} in {ns}"))
}

/// `bpf(2)` with an attribute buffer; a new fd on success.
fn bpf_fd(cmd: libc::c_long, attr: &mut [u8; 128]) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: `attr` is a zero-padded `union bpf_attr` of the size passed,
    // alive for the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("bpf command {cmd}"));
    }
    // SAFETY: the kernel just returned this fd to us; nobody else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

fn load_xdp_pass() -> Result<std::os::fd::OwnedFd> {
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_TYPE_XDP: u32 = 6;
    const BPF_XDP: u32 = 37;
    const XDP_PASS: i32 = 2;
    // struct bpf_insn { u8 code; u8 dst:4, src:4; s16 off; s32 imm; }
    let mut insns = [0u8; 16];
    insns[0] = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K: r0 = imm
    insns[4..8].copy_from_slice(&XDP_PASS.to_ne_bytes());
    insns[8] = 0x95; // BPF_JMP | BPF_EXIT
    let license = b"GPL\0";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_XDP.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..56].copy_from_slice(b"sbt_pass");
    attr[68..72].copy_from_slice(&BPF_XDP.to_ne_bytes());
    bpf_fd(BPF_PROG_LOAD, &mut attr)
}

fn create_xdp_link(prog: &std::os::fd::OwnedFd, ifindex: u32) -> Result<std::os::fd::OwnedFd> {
    use std::os::fd::AsRawFd;
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_XDP: u32 = 37;
    const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    attr[8..12].copy_from_slice(&BPF_XDP.to_ne_bytes());
    attr[12..16].copy_from_slice(&XDP_FLAGS_DRV_MODE.to_ne_bytes());
    bpf_fd(BPF_LINK_CREATE, &mut attr)
}

/// Whether transmit checksum offload is on for `ifname` in namespace `ns`.
pub fn tx_checksum_enabled(ns: &str, ifname: &str) -> Result<bool> {
    in_netns(ns, || ethtool_value(ifname, ETHTOOL_GTXCSUM, 0))
        .map(|v| v != 0)
        .with_context(|| format!("read tx checksum offload of {ifname} in {ns}"))
}

/// Whether GRO is on for `ifname` in namespace `ns`.
pub fn gro_enabled(ns: &str, ifname: &str) -> Result<bool> {
    in_netns(ns, || ethtool_value(ifname, ETHTOOL_GGRO, 0))
        .map(|v| v != 0)
        .with_context(|| format!("read GRO of {ifname} in {ns}"))
}

/// The status and body of an HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

/// `GET <path>` to `addr` over HTTP/1.1 from namespace `ns`, with
/// `Connection: close`; `timeout` bounds the connect and every read.
pub fn http_get(ns: &str, addr: SocketAddr, path: &str, timeout: Duration) -> Result<HttpResponse> {
    in_netns(ns, || {
        let mut stream = TcpStream::connect_timeout(&addr, timeout)
            .with_context(|| format!("connect to {addr}"))?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )
        .with_context(|| format!("send the request to {addr}"))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .with_context(|| format!("read the response from {addr}"))?;
        parse_response(&String::from_utf8_lossy(&raw))
    })
    .with_context(|| format!("GET http://{addr}{path} from {ns}"))
}

/// Splits a (non-chunked) HTTP/1.x response into status and body.
fn parse_response(raw: &str) -> Result<HttpResponse> {
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("response without an end of headers: {raw:?}"))?;
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    Ok(HttpResponse {
        status,
        body: body.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_response() {
        let r = parse_response(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\r\n{\"localEndpoints\": 0}",
        )
        .unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.body, "{\"localEndpoints\": 0}");
        assert!(parse_response("garbage").is_err());
    }

    #[test]
    fn ifreq_has_the_kernel_size() {
        assert_eq!(std::mem::size_of::<IfreqData>(), 40);
    }
}
