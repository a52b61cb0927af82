//! The node's uplinks: the interfaces traffic from outside the node arrives
//! on. Each gets
//! - XDP `sb_xdp_uplink` where it helps (see [`resolve_xdp_mode`]: by
//!   default native on a physical NIC that takes it, none on a veth or
//!   another virtual device), or as `--xdp-mode` says;
//! - tc ingress `sb_from_uplink`, its twin: with XDP it sees only what XDP
//!   let through (what is not ours, and the packets XDP could not send out
//!   itself because the next hop's neighbour entry is missing; it sends those
//!   with `bpf_redirect_neigh`); without XDP it does all the work;
//! - tc egress `sb_to_pod`, which gives a local backend's replies to clients
//!   outside the node the frontend's address again.
//!
//! The uplinks are `--uplink` when given; otherwise the interfaces that hold
//! one of the node's addresses (the Node's InternalIP and ExternalIP), else
//! the interface of the default route. Each uplink's IPv4 address goes into
//! the uplink map: flows to a backend on another node are source-NATed to it.
//! Its first global IPv6 address (not link-local, not tentative, failed or
//! deprecated) goes into the IPv6 uplink map for IPv6 flows; an uplink
//! without one is written with the all-zero address, and the data path then
//! drops IPv6 flows to backends on other nodes (counted as `no_route`).
//!
//! Links are pinned under `<pin root>/links` like the pod interfaces' ones,
//! so they outlive the agent; a new agent swaps its program into a pinned XDP
//! link atomically (`bpf_link_update`).
use std::{
    collections::HashMap,
    fs, io,
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, MapError},
    programs::{
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
        ProgramError, TcAttachType, Xdp, XdpMode as AyaXdpMode,
    },
    Ebpf,
};
use futures::TryStreamExt as _;
use netlink_packet_route::{
    address::{AddressAttribute, AddressHeaderFlags, AddressScope},
    link::{LinkAttribute, LinkInfo},
    route::{RouteAttribute, RouteMessage},
};
use proxy_common::{addr6_be, names, programs, Uplink6};
use tracing::{debug, info};

use crate::dataplane::attach::{self, AttachError, Attached, Hook, PodInterface, TcMode};

/// How the uplink program runs (`--xdp-mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpMode {
    /// Per uplink, what works there (see [`resolve_xdp_mode`]): native XDP on
    /// a physical NIC whose driver takes it, tc only elsewhere (veth, other
    /// virtual devices, drivers without native XDP).
    Auto,
    /// In the driver, before the kernel allocates the packet (veth included).
    Native,
    /// In the kernel's generic hook, for drivers without XDP support.
    Generic,
    /// No XDP: the same logic as a tc ingress program.
    Off,
}

/// The hook an uplink's XDP program ends up in, [`XdpMode`] resolved for
/// that uplink (`Off`: no XDP program, tc only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpHook {
    Native,
    Generic,
    Off,
}

impl XdpHook {
    pub const ALL: [XdpHook; 3] = [XdpHook::Native, XdpHook::Generic, XdpHook::Off];

    /// `native`, `generic` or `off`, as `--xdp-mode` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            XdpHook::Native => "native",
            XdpHook::Generic => "generic",
            XdpHook::Off => "off",
        }
    }
}

impl std::fmt::Display for XdpHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`resolve_xdp_mode`] needs to know of an uplink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkFacts<'a> {
    /// The link's kind (`IFLA_INFO_KIND`: `veth`, `bridge`, `vxlan`, `bond`,
    /// ...); `None` for a physical NIC (its driver has no rtnetlink link type).
    pub kind: Option<&'a str>,
    /// A native XDP attach was tried on it and refused.
    pub native_refused: bool,
}

/// [`resolve_xdp_mode`]'s answer for one uplink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpChoice {
    pub hook: XdpHook,
    /// Why, for the log and `switchboard status`.
    pub reason: String,
    /// What an operator should hear about an explicit mode that is likely to
    /// lose or corrupt traffic here (logged as a warning).
    pub warning: Option<String>,
}

/// Why tc alone serves a veth uplink best.
const VETH_REASON: &str = "veth uplink: tc only (native XDP loses the frames it sends back out \
     with XDP_TX unless the veth's peer runs an XDP program or GRO, and frames from local \
     senders with checksum offload carry partial checksums the XDP program cannot update; \
     generic XDP would only copy every packet before the same work)";

/// Link kinds whose frames come off a wire, so complete checksums, and whose
/// drivers may run XDP natively: a physical NIC (no kind) and a bond of them.
fn wire_kind(kind: Option<&str>) -> bool {
    matches!(kind, None | Some("bond"))
}

/// Decides where an uplink's XDP program runs for `requested`:
///
/// - `auto` on a veth: tc only (see [`VETH_REASON`]; kind nodes are
///   containers with veth uplinks);
/// - `auto` on another virtual device (bridge, vxlan, macvlan, tun, ...):
///   tc only. Most have no native XDP, and their frames may come from local
///   senders with partial checksums, which the XDP program (incremental
///   updates of a complete checksum) would rewrite wrongly, in generic mode
///   too; the tc program updates through the kernel's helpers, which handle
///   `CHECKSUM_PARTIAL`. Generic XDP would add nothing over tc but a copy;
/// - `auto` on a physical NIC or a bond: native; if the driver refuses it,
///   tc only (again: generic XDP runs after the kernel allocated the packet,
///   as tc does, and linearises it first);
/// - `native`, `generic`, `off`: as asked. Native on a veth is allowed (the
///   operator may have given the peer an XDP program) with a warning, as is
///   XDP on any other virtual device; native refused by the driver falls
///   back to generic.
pub fn resolve_xdp_mode(requested: XdpMode, facts: &LinkFacts<'_>) -> XdpChoice {
    let kind = facts.kind;
    let choice = |hook, reason: String| XdpChoice {
        hook,
        reason,
        warning: None,
    };
    match requested {
        XdpMode::Auto => match kind {
            Some("veth") => choice(XdpHook::Off, format!("auto: {VETH_REASON}")),
            Some(other) if !wire_kind(kind) => choice(
                XdpHook::Off,
                format!(
                    "auto: virtual uplink ({other}): tc only (no native XDP here, and frames from \
                     local senders may carry partial checksums that only tc's helpers update right)"
                ),
            ),
            _ if facts.native_refused => choice(
                XdpHook::Off,
                "auto: the driver refused native XDP: tc only (generic XDP adds nothing over tc)"
                    .to_owned(),
            ),
            _ => choice(XdpHook::Native, "auto: native XDP in the driver".to_owned()),
        },
        XdpMode::Native | XdpMode::Generic => {
            let (hook, reason) = match requested {
                XdpMode::Native if facts.native_refused => (
                    XdpHook::Generic,
                    "--xdp-mode native refused by the driver: generic XDP".to_owned(),
                ),
                XdpMode::Native => (XdpHook::Native, "--xdp-mode native".to_owned()),
                _ => (XdpHook::Generic, "--xdp-mode generic".to_owned()),
            };
            let warning = match kind {
                Some("veth") if hook == XdpHook::Native => Some(
                    "native XDP on a veth uplink: frames sent back out with XDP_TX (to backends on \
                     other nodes, and their replies) are lost unless the veth's peer runs an XDP \
                     program or has GRO on, and frames from local senders with checksum offload \
                     carry partial checksums the XDP program rewrites wrongly. Unless the peer is \
                     set up for it and senders write complete checksums, use --xdp-mode auto \
                     (tc only on veth) or off"
                        .to_owned(),
                ),
                Some(other) if !wire_kind(kind) => Some(format!(
                    "{hook} XDP on a virtual uplink ({other}): frames from local senders with \
                     checksum offload carry partial checksums the XDP program rewrites wrongly; \
                     use --xdp-mode auto (tc only here) or off unless every sender writes \
                     complete checksums"
                )),
                _ => None,
            };
            XdpChoice {
                hook,
                reason,
                warning,
            }
        }
        XdpMode::Off => choice(XdpHook::Off, "--xdp-mode off".to_owned()),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    #[error("netlink: {0}")]
    Netlink(#[from] rtnetlink::Error),
    #[error("uplink {0} does not exist")]
    NoSuchInterface(String),
    #[error("uplink {0} has no IPv4 address to source-NAT to")]
    NoAddress(String),
    #[error("no uplink given (--uplink), none of the node's addresses is on an interface, and there is no default route")]
    NotFound,
    #[error(transparent)]
    Tc(Box<AttachError>),
    #[error("attaching {program} (XDP, {mode}) to {iface}")]
    Xdp {
        iface: String,
        program: &'static str,
        mode: XdpHook,
        source: Box<ProgramError>,
    },
    #[error("the XDP attach on {iface} gave no BPF link")]
    XdpNotALink {
        iface: String,
        source: aya::programs::links::LinkError,
    },
    #[error("pinning the XDP link of {iface} at {path}")]
    Pin {
        iface: String,
        path: PathBuf,
        source: aya::pin::PinError,
    },
    #[error("removing the XDP link pin {path}")]
    Unpin { path: PathBuf, source: io::Error },
    #[error("creating the link directory {path}")]
    LinkDir { path: PathBuf, source: io::Error },
    #[error("the loaded object has no map {0}")]
    MissingMap(&'static str),
    #[error("writing the IPv6 uplink map")]
    Map6(#[source] MapError),
}

/// One uplink: its interface and the address flows are source-NATed to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uplink {
    pub name: String,
    pub index: u32,
    pub addr: Ipv4Addr,
    /// The IPv6 address IPv6 flows are source-NATed to, if it has one.
    pub addr6: Option<Ipv6Addr>,
    /// Its link kind (`veth`, `bridge`, ...; `None`: a physical NIC), see
    /// [`LinkFacts::kind`].
    pub kind: Option<String>,
}

/// What the interfaces of this namespace hold.
struct Interfaces {
    /// Name → index.
    by_name: HashMap<String, u32>,
    /// Index → link kind (`IFLA_INFO_KIND`), for those that have one.
    kinds: HashMap<u32, String>,
    /// Index → IPv4 addresses, in the kernel's order.
    addrs: HashMap<u32, Vec<Ipv4Addr>>,
    /// Index → global IPv6 addresses fit to source-NAT to, in the kernel's
    /// order.
    addrs6: HashMap<u32, Vec<Ipv6Addr>>,
}

impl Interfaces {
    async fn list(handle: &rtnetlink::Handle) -> Result<Self, UplinkError> {
        let mut by_name = HashMap::new();
        let mut kinds = HashMap::new();
        let mut links = handle.link().get().execute();
        while let Some(link) = links.try_next().await? {
            for attr in &link.attributes {
                match attr {
                    LinkAttribute::IfName(name) => {
                        by_name.insert(name.clone(), link.header.index);
                    }
                    LinkAttribute::LinkInfo(infos) => {
                        if let Some(kind) = link_kind(infos) {
                            kinds.insert(link.header.index, kind);
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut addrs: HashMap<u32, Vec<Ipv4Addr>> = HashMap::new();
        let mut addrs6: HashMap<u32, Vec<Ipv6Addr>> = HashMap::new();
        let mut list = handle.address().get().execute();
        while let Some(msg) = list.try_next().await? {
            for attr in &msg.attributes {
                match attr {
                    AddressAttribute::Address(std::net::IpAddr::V4(ip)) => {
                        addrs.entry(msg.header.index).or_default().push(*ip);
                    }
                    AddressAttribute::Address(std::net::IpAddr::V6(ip))
                        if snat_fit6(ip, msg.header.scope, msg.header.flags) =>
                    {
                        addrs6.entry(msg.header.index).or_default().push(*ip);
                    }
                    _ => {}
                }
            }
        }
        Ok(Self {
            by_name,
            kinds,
            addrs,
            addrs6,
        })
    }

    fn name_of(&self, index: u32) -> Option<&str> {
        self.by_name
            .iter()
            .find(|(_, i)| **i == index)
            .map(|(n, _)| n.as_str())
    }

    /// `index`'s address to source-NAT to: the first that is a node address,
    /// else its first.
    fn snat_addr(&self, index: u32, node_addrs: &[Ipv4Addr]) -> Option<Ipv4Addr> {
        let addrs = self.addrs.get(&index)?;
        addrs
            .iter()
            .find(|a| node_addrs.contains(a))
            .or_else(|| addrs.first())
            .copied()
    }

    fn uplink(&self, index: u32, node_addrs: &[Ipv4Addr]) -> Result<Uplink, UplinkError> {
        let name = self.name_of(index).unwrap_or_default().to_owned();
        let addr = self
            .snat_addr(index, node_addrs)
            .ok_or_else(|| UplinkError::NoAddress(name.clone()))?;
        let addr6 = self.addrs6.get(&index).and_then(|a| a.first()).copied();
        Ok(Uplink {
            name,
            index,
            addr,
            addr6,
            kind: self.kinds.get(&index).cloned(),
        })
    }
}

/// The kind of a link from its `IFLA_LINKINFO` (`veth`, `bridge`, ...).
fn link_kind(infos: &[LinkInfo]) -> Option<String> {
    infos.iter().find_map(|info| match info {
        LinkInfo::Kind(kind) => Some(kind.to_string()),
        _ => None,
    })
}

/// Whether an IPv6 address of an interface may be the source of flows
/// source-NATed to another node: global scope, not loopback, link-local or
/// multicast, and usable now (not tentative, failed or deprecated).
fn snat_fit6(addr: &Ipv6Addr, scope: AddressScope, flags: AddressHeaderFlags) -> bool {
    let unusable = AddressHeaderFlags::Tentative
        | AddressHeaderFlags::Dadfailed
        | AddressHeaderFlags::Deprecated;
    scope == AddressScope::Universe
        && !addr.is_loopback()
        && !addr.is_multicast()
        && !addr.is_unspecified()
        && !addr.is_unicast_link_local()
        && !flags.intersects(unusable)
}

/// Makes the IPv6 uplink map of `ebpf` hold exactly `uplinks` (interface
/// index → IPv6 address, all-zero for an uplink without one): new entries
/// are written before stale ones are deleted.
pub fn set_uplinks6(ebpf: &mut Ebpf, uplinks: &[Uplink]) -> Result<(), UplinkError> {
    let map = ebpf
        .map_mut(names::UPLINKS6)
        .ok_or(UplinkError::MissingMap(names::UPLINKS6))?;
    let mut map: BpfHashMap<&mut MapData, u32, Uplink6> =
        BpfHashMap::try_from(map).map_err(UplinkError::Map6)?;
    for up in uplinks {
        let value = Uplink6 {
            addr_be: up.addr6.map(|a| addr6_be(a.octets())).unwrap_or([0; 4]),
        };
        map.insert(up.index, value, 0).map_err(UplinkError::Map6)?;
        match up.addr6 {
            Some(addr) => debug!(iface = %up.name, %addr, "uplink IPv6 address"),
            None => {
                info!(iface = %up.name, "uplink has no global IPv6 address: IPv6 flows to backends on other nodes are dropped")
            }
        }
    }
    let stale: Vec<u32> = map
        .keys()
        .filter_map(Result::ok)
        .filter(|k| uplinks.iter().all(|u| u.index != *k))
        .collect();
    for index in stale {
        map.remove(&index).map_err(UplinkError::Map6)?;
    }
    Ok(())
}

/// Every address of this namespace's interfaces, of both families, loopback
/// and IPv6 link-local excluded (the candidates for `--nodeport-addresses`).
pub async fn local_addresses(
    handle: &rtnetlink::Handle,
) -> Result<Vec<std::net::IpAddr>, UplinkError> {
    let mut all = Vec::new();
    let mut list = handle.address().get().execute();
    while let Some(msg) = list.try_next().await? {
        for attr in &msg.attributes {
            if let AddressAttribute::Address(ip) = attr {
                all.push(*ip);
            }
        }
    }
    all.retain(|a| match a {
        std::net::IpAddr::V4(a) => !a.is_loopback(),
        // fe80::/10 needs a zone to be reached: no NodePort there.
        std::net::IpAddr::V6(a) => !a.is_loopback() && (a.segments()[0] & 0xffc0) != 0xfe80,
    });
    all.sort_unstable();
    all.dedup();
    Ok(all)
}

/// Finds the uplinks: `names` if given, else the interfaces holding one of
/// `node_addrs`, else the default route's interface.
pub async fn resolve(
    handle: &rtnetlink::Handle,
    names: &[String],
    node_addrs: &[Ipv4Addr],
) -> Result<Vec<Uplink>, UplinkError> {
    let interfaces = Interfaces::list(handle).await?;
    if !names.is_empty() {
        return names
            .iter()
            .map(|name| {
                let index = *interfaces
                    .by_name
                    .get(name)
                    .ok_or_else(|| UplinkError::NoSuchInterface(name.clone()))?;
                interfaces.uplink(index, node_addrs)
            })
            .collect();
    }
    let mut holding: Vec<u32> = interfaces
        .addrs
        .iter()
        .filter(|(_, addrs)| addrs.iter().any(|a| node_addrs.contains(a)))
        .map(|(index, _)| *index)
        .collect();
    holding.sort_unstable();
    if holding.is_empty() {
        holding.extend(default_route_interface(handle).await?);
    }
    if holding.is_empty() {
        return Err(UplinkError::NotFound);
    }
    holding
        .into_iter()
        .map(|index| interfaces.uplink(index, node_addrs))
        .collect()
}

/// The output interface of the main table's IPv4 default route.
async fn default_route_interface(handle: &rtnetlink::Handle) -> Result<Option<u32>, UplinkError> {
    let mut routes = handle
        .route()
        .get(rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute();
    while let Some(route) = routes.try_next().await? {
        if route.header.destination_prefix_length == 0 {
            if let Some(index) = output_interface(&route) {
                return Ok(Some(index));
            }
        }
    }
    Ok(None)
}

fn output_interface(route: &RouteMessage) -> Option<u32> {
    route.attributes.iter().find_map(|attr| match attr {
        RouteAttribute::Oif(index) => Some(*index),
        _ => None,
    })
}

/// The tc hooks of an uplink (in every mode: see the module doc).
pub const TC_HOOKS: [Hook; 2] = [
    (programs::TC_FROM_UPLINK, TcAttachType::Ingress),
    (programs::TC_TO_UPLINK, TcAttachType::Egress),
];

/// Attaches the uplink programs to `uplink` as `mode` says, replacing what
/// an earlier agent left, and removing what the other modes attach.
pub fn attach(
    ebpf: &mut Ebpf,
    uplink: &Uplink,
    mode: XdpHook,
    tc_mode: TcMode,
    link_dir: &Path,
) -> Result<Attached, UplinkError> {
    let iface = PodInterface {
        name: uplink.name.clone(),
        index: uplink.index,
    };
    // A pod program an earlier agent may have put here before it knew this
    // was an uplink (a veth uplink looks like a pod interface).
    attach::detach_hooks(
        &iface,
        link_dir,
        &[(programs::TC_FROM_POD, TcAttachType::Ingress)],
    );
    for other in XdpHook::ALL {
        if other != mode {
            remove_xdp_pin(&xdp_pin(link_dir, uplink.index, other))?;
        }
    }
    // tc first: from then on every packet XDP lets through is handled.
    let tc = attach::attach_hooks(ebpf, &iface, tc_mode, link_dir, &TC_HOOKS)
        .map_err(|e| UplinkError::Tc(Box::new(e)))?;
    if mode != XdpHook::Off {
        attach_xdp(ebpf, uplink, mode, link_dir)?;
    }
    info!(iface = %uplink.name, address = %uplink.addr, xdp = %mode, "uplink programs attached");
    Ok(tc)
}

/// Where the XDP link of uplink `index` in `mode` is pinned (the mode is
/// part of the name: a pinned link keeps the mode it was created with).
fn xdp_pin(link_dir: &Path, index: u32, mode: XdpHook) -> PathBuf {
    link_dir.join(format!("xdp_{index}_{mode}"))
}

fn remove_xdp_pin(path: &Path) -> Result<(), UplinkError> {
    match fs::remove_file(path) {
        Ok(()) => {
            debug!(pin = %path.display(), "removed an earlier XDP link");
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(UplinkError::Unpin {
            path: path.to_owned(),
            source,
        }),
    }
}

/// XDP: swap our program into the pinned link of an earlier agent, or attach
/// a new link and pin it.
fn attach_xdp(
    ebpf: &mut Ebpf,
    uplink: &Uplink,
    mode: XdpHook,
    link_dir: &Path,
) -> Result<(), UplinkError> {
    let name = programs::XDP_UPLINK;
    let xdp_error = |source| UplinkError::Xdp {
        iface: uplink.name.clone(),
        program: name,
        mode,
        source: Box::new(source),
    };
    crate::util::fsmode::ensure_dir(
        link_dir,
        crate::util::fsmode::PIN_DIR_MODE,
        crate::util::fsmode::Existing::Set,
    )
    .map_err(|source| UplinkError::LinkDir {
        path: link_dir.to_owned(),
        source,
    })?;
    let path = xdp_pin(link_dir, uplink.index, mode);
    let prog: &mut Xdp = crate::dataplane::ebpf::typed(ebpf, name).map_err(|e| match e {
        crate::dataplane::ebpf::LoadError::Program { source, .. } => xdp_error(source),
        _ => xdp_error(ProgramError::NotLoaded),
    })?;
    if let Some(existing) = pinned_xdp_link(&path) {
        match prog.attach_to_link(existing) {
            Ok(link_id) => {
                // The pin holds the link; our handle may go.
                drop(prog.take_link(link_id).map_err(xdp_error)?);
                return Ok(());
            }
            Err(error) => {
                debug!(pin = %path.display(), %error, "pinned XDP link unusable; attaching anew");
                remove_xdp_pin(&path)?;
            }
        }
    }
    let aya_mode = match mode {
        XdpHook::Generic => AyaXdpMode::Skb,
        XdpHook::Native | XdpHook::Off => AyaXdpMode::Driver,
    };
    let link_id = attach_when_free(prog, uplink.index, aya_mode).map_err(xdp_error)?;
    let link = prog.take_link(link_id).map_err(xdp_error)?;
    let link = FdLink::try_from(link).map_err(|source| UplinkError::XdpNotALink {
        iface: uplink.name.clone(),
        source,
    })?;
    drop(link.pin(&path).map_err(|source| UplinkError::Pin {
        iface: uplink.name.clone(),
        path: path.clone(),
        source,
    })?);
    Ok(())
}

/// How long an XDP attach waits for a link of another mode to go.
const OTHER_MODE_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Attaches, retrying while the interface is busy: a link of the other mode
/// whose pin was just removed is released by the kernel asynchronously, and
/// native and generic XDP cannot be attached to one interface at once.
fn attach_when_free(
    prog: &mut Xdp,
    index: u32,
    mode: AyaXdpMode,
) -> Result<aya::programs::xdp::XdpLinkId, ProgramError> {
    let deadline = std::time::Instant::now() + OTHER_MODE_GRACE;
    loop {
        match prog.attach_to_if_index(index, mode) {
            Err(ProgramError::SyscallError(e))
                if matches!(e.io_error.raw_os_error(), Some(libc::EBUSY | libc::EEXIST))
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// The XDP link pinned at `path`, if there is one.
fn pinned_xdp_link(path: &Path) -> Option<XdpLink> {
    let pinned = PinnedLink::from_pin(path).ok()?;
    XdpLink::try_from(FdLink::from(pinned)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdp_modes_resolve_per_uplink() {
        /// Asked, link kind, native refused → hook, start of the reason,
        /// whether a warning is given.
        type Case = (
            XdpMode,
            Option<&'static str>,
            bool,
            XdpHook,
            &'static str,
            bool,
        );
        use XdpHook::{Generic as G, Native as N, Off as O};
        use XdpMode::{Auto, Generic, Native, Off};
        let table: &[Case] = &[
            (Auto, Some("veth"), false, O, "auto: veth uplink", false),
            (
                Auto,
                Some("bridge"),
                false,
                O,
                "auto: virtual uplink (bridge)",
                false,
            ),
            (
                Auto,
                Some("vxlan"),
                false,
                O,
                "auto: virtual uplink (vxlan)",
                false,
            ),
            (
                Auto,
                Some("macvlan"),
                false,
                O,
                "auto: virtual uplink (macvlan)",
                false,
            ),
            (Auto, None, false, N, "auto: native", false),
            (Auto, Some("bond"), false, N, "auto: native", false),
            (
                Auto,
                None,
                true,
                O,
                "auto: the driver refused native XDP",
                false,
            ),
            (
                Auto,
                Some("bond"),
                true,
                O,
                "auto: the driver refused native XDP",
                false,
            ),
            (Native, Some("veth"), false, N, "--xdp-mode native", true),
            (
                Native,
                Some("bridge"),
                true,
                G,
                "--xdp-mode native refused",
                true,
            ),
            (Native, None, false, N, "--xdp-mode native", false),
            (Native, None, true, G, "--xdp-mode native refused", false),
            (Generic, None, false, G, "--xdp-mode generic", false),
            (Generic, Some("veth"), false, G, "--xdp-mode generic", true),
            (Generic, Some("vxlan"), false, G, "--xdp-mode generic", true),
            (Off, Some("veth"), false, O, "--xdp-mode off", false),
            (Off, None, false, O, "--xdp-mode off", false),
        ];
        for &(asked, kind, native_refused, hook, reason, warned) in table {
            let facts = LinkFacts {
                kind,
                native_refused,
            };
            let got = resolve_xdp_mode(asked, &facts);
            let case = format!("{asked:?} on {kind:?} (native refused: {native_refused})");
            assert_eq!(got.hook, hook, "{case}: {got:?}");
            assert!(got.reason.starts_with(reason), "{case}: {got:?}");
            assert_eq!(got.warning.is_some(), warned, "{case}: {got:?}");
        }
    }

    #[test]
    fn the_veth_warning_names_the_problem_and_the_fix() {
        let facts = LinkFacts {
            kind: Some("veth"),
            native_refused: false,
        };
        let warning = resolve_xdp_mode(XdpMode::Native, &facts)
            .warning
            .expect("a warning");
        for words in ["XDP_TX", "peer", "partial checksums", "--xdp-mode auto"] {
            assert!(warning.contains(words), "{words:?} missing: {warning}");
        }
        let reason = resolve_xdp_mode(XdpMode::Auto, &facts).reason;
        for words in ["tc only", "XDP_TX", "partial checksums", "generic"] {
            assert!(reason.contains(words), "{words:?} missing: {reason}");
        }
    }

    #[test]
    fn only_global_usable_ipv6_addresses_are_snat_sources() {
        let global: Ipv6Addr = "2001:db8::1".parse().expect("address");
        let ula: Ipv6Addr = "fd00:50::1".parse().expect("address");
        let link_local: Ipv6Addr = "fe80::1".parse().expect("address");
        let none = AddressHeaderFlags::empty();
        assert!(snat_fit6(&global, AddressScope::Universe, none));
        assert!(snat_fit6(
            &ula,
            AddressScope::Universe,
            AddressHeaderFlags::Permanent
        ));
        assert!(!snat_fit6(&link_local, AddressScope::Link, none));
        assert!(!snat_fit6(&link_local, AddressScope::Universe, none));
        assert!(!snat_fit6(&Ipv6Addr::LOCALHOST, AddressScope::Host, none));
        assert!(!snat_fit6(
            &global,
            AddressScope::Universe,
            AddressHeaderFlags::Tentative
        ));
        assert!(!snat_fit6(
            &global,
            AddressScope::Universe,
            AddressHeaderFlags::Deprecated
        ));
        assert!(!snat_fit6(
            &global,
            AddressScope::Universe,
            AddressHeaderFlags::Dadfailed
        ));
    }
}
