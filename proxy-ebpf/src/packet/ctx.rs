//! A program's packet, tc or XDP, through one small trait ([`PacketCtx`]):
//! its data and end, bounds-checked pointers into it, the bytes a helper
//! loads ([`LoadBytes`], the IPv6 walk's reads), and the one IPv4 parser of
//! the tc and XDP programs ([`parse_ipv4`]).
use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    helpers::{bpf_skb_load_bytes, bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    programs::{TcContext, XdpContext},
};
use proxy_common::proto;

use crate::packet::{
    Flow, Ipv4Hdr, Skip, ETH_HLEN, IPV4_MIN_HLEN, IP_FRAG_MASK, IP_OFFSET_MASK, TCP_HLEN, UDP_HLEN,
};

/// The packet of a tc or an XDP program, and what each makes of the
/// packets the parser finds.
pub(crate) trait PacketCtx {
    fn data(&self) -> usize;
    fn data_end(&self) -> usize;
    /// Makes sure the first `len` bytes can be read directly: tc pulls a
    /// non-linear skb's bytes in; an XDP frame is all directly readable (a
    /// short one fails the bounds check of [`ptr_at`]).
    fn ensure(&self, len: usize) -> Result<(), Skip>;
    /// What an ICMP packet is: tc translates errors about its flows back
    /// (`Skip::Icmp`); XDP hands ICMP to tc untouched (`Skip::NotOurs`).
    const ICMP: Skip;
    /// Whether a first fragment is parsed (tc: its later fragments follow
    /// its translation) or skipped like the others (XDP leaves fragments to
    /// tc).
    const FIRST_FRAGMENT: bool;
}

impl PacketCtx for TcContext {
    #[inline(always)]
    fn data(&self) -> usize {
        TcContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        TcContext::data_end(self)
    }
    #[inline(always)]
    fn ensure(&self, len: usize) -> Result<(), Skip> {
        ensure_linear(self, len)
    }
    const ICMP: Skip = Skip::Icmp;
    const FIRST_FRAGMENT: bool = true;
}

impl PacketCtx for XdpContext {
    #[inline(always)]
    fn data(&self) -> usize {
        XdpContext::data(self)
    }
    #[inline(always)]
    fn data_end(&self) -> usize {
        XdpContext::data_end(self)
    }
    #[inline(always)]
    fn ensure(&self, _len: usize) -> Result<(), Skip> {
        Ok(())
    }
    const ICMP: Skip = Skip::NotOurs;
    const FIRST_FRAGMENT: bool = false;
}

/// Makes sure the first `len` bytes of the frame are in the linear area,
/// pulling them in if the packet is long enough but not linear.
#[inline(always)]
pub(crate) fn ensure_linear(ctx: &TcContext, len: usize) -> Result<(), Skip> {
    if ctx.data() + len <= ctx.data_end() {
        return Ok(());
    }
    if (ctx.len() as usize) < len {
        return Err(Skip::Malformed);
    }
    ctx.pull_data(len as u32).map_err(|_| Skip::Malformed)?;
    if ctx.data() + len <= ctx.data_end() {
        Ok(())
    } else {
        Err(Skip::Malformed)
    }
}

/// A bounds-checked pointer into the packet data (the linear area of an
/// skb, an XDP frame).
#[inline(always)]
pub(crate) fn ptr_at<T>(ctx: &impl PacketCtx, off: usize) -> Result<*mut T, Skip> {
    let start = ctx.data();
    if start + off + size_of::<T>() > ctx.data_end() {
        return Err(Skip::Malformed);
    }
    Ok((start + off) as *mut T)
}

/// An IPv4 TCP/UDP packet's flow (the caller checked the ethertype);
/// anything else is skipped: the one IPv4 parser of the tc and XDP programs.
#[inline(always)]
pub(crate) fn parse_ipv4<C: PacketCtx>(ctx: &C) -> Result<Flow, Skip> {
    ctx.ensure(ETH_HLEN + IPV4_MIN_HLEN)?;
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the whole fixed header lies inside the packet.
    let (version_ihl, ip_proto, frag_off_be, tot_len_be, saddr_be, daddr_be, id_be) = unsafe {
        (
            (*ip).version_ihl,
            (*ip).proto,
            (*ip).frag_off_be,
            (*ip).tot_len_be,
            (*ip).saddr_be,
            (*ip).daddr_be,
            (*ip).id_be,
        )
    };
    let l4_min = match ip_proto {
        proto::TCP => TCP_HLEN,
        proto::UDP => UDP_HLEN,
        proto::ICMP => return Err(C::ICMP),
        _ => return Err(Skip::NotOurs),
    };
    if version_ihl >> 4 != 4 {
        return Err(Skip::Malformed);
    }
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    if ihl < IPV4_MIN_HLEN {
        return Err(Skip::Malformed);
    }
    let frag = u16::from_be(frag_off_be) & IP_FRAG_MASK;
    // A later fragment has no ports: it follows its first ([`crate::frag`]);
    // where first fragments are not translated, every fragment is skipped.
    let skipped = if C::FIRST_FRAGMENT {
        IP_OFFSET_MASK
    } else {
        IP_FRAG_MASK
    };
    if frag & skipped != 0 {
        return Err(Skip::Fragment);
    }
    if usize::from(u16::from_be(tot_len_be)) < ihl + l4_min {
        return Err(Skip::Malformed);
    }
    let l4_off = ETH_HLEN + ihl;
    ctx.ensure(l4_off + l4_min)?;
    let ports = ptr_at::<[u16; 2]>(ctx, l4_off)?;
    // SAFETY: `ptr_at` checked both ports lie inside the packet.
    let (sport_be, dport_be) = unsafe { ((*ports)[0], (*ports)[1]) };
    let tcp_flags = if ip_proto == proto::TCP {
        // SAFETY: `ptr_at` checked the byte lies inside the packet.
        unsafe { *ptr_at::<u8>(ctx, l4_off + 13)? }
    } else {
        0
    };
    Ok(Flow {
        saddr_be,
        daddr_be,
        frag_id_be: u32::from(id_be),
        sport_be,
        dport_be,
        proto: ip_proto,
        tcp_flags,
        l4_off,
        first_fragment: frag != 0,
    })
}

/// The flow of a later fragment of an IPv4 TCP or UDP datagram, which
/// [`parse_ipv4`] skipped (`Skip::Fragment`; it made the fixed header
/// linear): its addresses, protocol and identification, no ports.
#[inline(always)]
pub(crate) fn later_fragment4<C: PacketCtx>(ctx: &C, flow: &mut Flow) -> Result<(), Skip> {
    let ip = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN)?;
    // SAFETY: `ptr_at` checked the whole fixed header lies inside the packet.
    unsafe {
        flow.saddr_be = (*ip).saddr_be;
        flow.daddr_be = (*ip).daddr_be;
        flow.frag_id_be = u32::from((*ip).id_be);
        flow.proto = (*ip).proto;
    }
    flow.sport_be = 0;
    flow.dport_be = 0;
    flow.tcp_flags = 0;
    flow.first_fragment = false;
    flow.l4_off = 0;
    Ok(())
}

/// A program context whose packet bytes the IPv6 parser reads through a
/// helper: `bpf_skb_load_bytes` (tc) or `bpf_xdp_load_bytes` (XDP), so the
/// uplink's XDP program shares the walk with the tc programs.
pub trait LoadBytes {
    /// Copies `len` bytes at `off` to `dst`; 0 on success.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes.
    unsafe fn load_raw(&self, off: u32, dst: *mut c_void, len: u32) -> i64;
}

impl LoadBytes for TcContext {
    #[inline(always)]
    unsafe fn load_raw(&self, off: u32, dst: *mut c_void, len: u32) -> i64 {
        // SAFETY: the caller passes a `dst` valid for `len` bytes;
        // `self.skb.skb` is this program's context.
        unsafe { bpf_skb_load_bytes(self.skb.skb as *const c_void, off, dst, len) }
    }
}

/// Copies `size_of::<T>()` bytes of `src` (stack or map memory) into the
/// XDP frame at `off` through the store helper, which bounds-checks the
/// frame itself (and reaches past the linear part of a multi-buffer
/// frame); `false` if it refused.
#[inline(always)]
pub(crate) fn xdp_store<T>(ctx: &XdpContext, off: usize, src: &T) -> bool {
    // SAFETY: the helper reads exactly `size_of::<T>()` bytes of `src` (it
    // never writes them); `ctx.ctx` is this program's context.
    let ret = unsafe {
        bpf_xdp_store_bytes(
            ctx.ctx,
            off as u32,
            src as *const T as *mut c_void,
            size_of::<T>() as u32,
        )
    };
    ret == 0
}

impl LoadBytes for XdpContext {
    #[inline(always)]
    unsafe fn load_raw(&self, off: u32, dst: *mut c_void, len: u32) -> i64 {
        // SAFETY: the caller passes a `dst` valid for `len` bytes;
        // `self.ctx` is this program's context.
        unsafe { bpf_xdp_load_bytes(self.ctx, off, dst, len) }
    }
}
