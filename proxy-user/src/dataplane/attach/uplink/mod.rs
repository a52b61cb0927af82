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
//! Overlay devices (a VXLAN or WireGuard device, an IP tunnel: the way
//! flannel, Calico in its tunnel modes and others reach other nodes' pods)
//! are found by their link kind, whatever `--uplink` says, and get the same
//! tc programs and map entries with [`Role::Overlay`]: a flow from outside
//! whose backend is reached through one is source-NATed to the overlay's
//! address (as kube-proxy's masquerade picks it), and the backend's reply,
//! which comes back through the overlay, is translated there. They get no
//! XDP program, and XDP on an uplink hands flows routed into them to tc.
//!
//! Links are pinned under `<pin root>/links` like the pod interfaces' ones,
//! so they outlive the agent; a new agent swaps its program into a pinned XDP
//! link atomically (`bpf_link_update`).
mod resolve;
mod xdpmode;

use std::{
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
use proxy_common::{addr6_be, names, programs, Uplink6};
use tracing::{debug, info};

use crate::dataplane::attach::pods::{self, AttachError, Attached, Hook, PodInterface, TcMode};
pub use resolve::{local_addresses, resolve, Resolved, OVERLAY_KINDS};
pub use xdpmode::{resolve_xdp_mode, LinkFacts, XdpChoice, XdpHook, XdpMode};

#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    #[error("netlink: {0}")]
    Netlink(#[from] rtnetlink::Error),
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

/// What an interface that gets the uplink programs is to the node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Role {
    /// Traffic from outside the node arrives here (`--uplink`, or found
    /// from the node's addresses).
    #[default]
    Uplink,
    /// A tunnel to other nodes' pods (flannel's `flannel.1`, Calico's
    /// `tunl0` or `vxlan.calico`, a WireGuard device): found by its link
    /// kind ([`OVERLAY_KINDS`]). Flows from outside to a backend
    /// behind it are source-NATed to its address, so the backend's replies
    /// come back through it, where `sb_from_uplink` translates them back.
    /// tc programs only: tunnel devices take no XDP.
    Overlay,
}

impl Role {
    /// `uplink` or `overlay`, as `switchboard status` lists it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Uplink => "uplink",
            Role::Overlay => "overlay",
        }
    }
}

/// One uplink: its interface and the address flows are source-NATed to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uplink {
    pub name: String,
    pub index: u32,
    /// The IPv4 address IPv4 flows are source-NATed to, if it has one
    /// (written as all-zero otherwise: the data path then drops IPv4 flows
    /// to backends on other nodes, as for IPv6).
    pub addr: Option<Ipv4Addr>,
    /// The IPv6 address IPv6 flows are source-NATed to, if it has one.
    pub addr6: Option<Ipv6Addr>,
    /// Its link kind (`veth`, `bridge`, ...; `None`: a physical NIC), see
    /// [`LinkFacts::kind`].
    pub kind: Option<String>,
    /// An uplink proper, or an overlay device.
    pub role: Role,
}

/// How flows from outside reach a backend on another node
/// (`--nodeport-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum NodePortMode {
    /// Source NAT to the uplink's address: the replies come back through
    /// this node, which translates them back (kube-proxy's way).
    #[default]
    Snat,
    /// Direct server return: the client stays the source, the frontend
    /// travels to the backend's node in an IPv4 option (an IPv6
    /// destination option), and that node answers the client itself. Every
    /// node must run it: a node accepts the option only in this mode.
    Dsr,
}

/// The IPv4 uplink map's entries for `uplinks` (interface index → IPv4
/// address, all-zero for an uplink without one; flags by `mode`).
pub fn map_entries4(uplinks: &[Uplink], mode: NodePortMode) -> Vec<(u32, proxy_common::Uplink)> {
    let flags = match mode {
        NodePortMode::Snat => 0,
        NodePortMode::Dsr => proxy_common::uplink_flags::DSR_ACCEPT,
    };
    uplinks
        .iter()
        .map(|u| {
            let addr = u.addr.unwrap_or(Ipv4Addr::UNSPECIFIED);
            let addr_be = u32::from_ne_bytes(addr.octets());
            let role = match u.role {
                Role::Uplink => 0,
                Role::Overlay => proxy_common::uplink_flags::OVERLAY,
            };
            (u.index, proxy_common::Uplink::new(addr_be, flags | role))
        })
        .collect()
}

/// The IPv6 uplink map's entries for `uplinks` (interface index → IPv6
/// address, all-zero for an uplink without one).
pub fn map_entries6(uplinks: &[Uplink]) -> Vec<(u32, Uplink6)> {
    uplinks
        .iter()
        .map(|up| {
            let addr_be = up.addr6.map(|a| addr6_be(a.octets())).unwrap_or([0; 4]);
            (up.index, Uplink6 { addr_be })
        })
        .collect()
}

/// The IPv6 uplink map of `ebpf`, to write.
fn uplinks6_mut(ebpf: &mut Ebpf) -> Result<BpfHashMap<&mut MapData, u32, Uplink6>, UplinkError> {
    let map = ebpf
        .map_mut(names::UPLINKS6)
        .ok_or(UplinkError::MissingMap(names::UPLINKS6))?;
    BpfHashMap::try_from(map).map_err(UplinkError::Map6)
}

/// The IPv6 uplink map's entries as it holds them now.
pub fn uplinks6(ebpf: &Ebpf) -> Result<Vec<(u32, Uplink6)>, UplinkError> {
    let map = ebpf
        .map(names::UPLINKS6)
        .ok_or(UplinkError::MissingMap(names::UPLINKS6))?;
    let map: BpfHashMap<&MapData, u32, Uplink6> =
        BpfHashMap::try_from(map).map_err(UplinkError::Map6)?;
    Ok(map.iter().filter_map(Result::ok).collect())
}

/// Writes one IPv6 uplink map entry.
pub fn put_uplink6(ebpf: &mut Ebpf, index: u32, value: Uplink6) -> Result<(), UplinkError> {
    uplinks6_mut(ebpf)?
        .insert(index, value, 0)
        .map_err(UplinkError::Map6)
}

/// Deletes one IPv6 uplink map entry (absent is fine).
pub fn delete_uplink6(ebpf: &mut Ebpf, index: u32) -> Result<(), UplinkError> {
    match uplinks6_mut(ebpf)?.remove(&index) {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(error) => Err(UplinkError::Map6(error)),
    }
}

/// Makes the IPv6 uplink map of `ebpf` hold exactly `uplinks` (interface
/// index → IPv6 address, all-zero for an uplink without one): new entries
/// are written before stale ones are deleted.
pub fn set_uplinks6(ebpf: &mut Ebpf, uplinks: &[Uplink]) -> Result<(), UplinkError> {
    let mut map = uplinks6_mut(ebpf)?;
    for (up, (index, value)) in uplinks.iter().zip(map_entries6(uplinks)) {
        map.insert(index, value, 0).map_err(UplinkError::Map6)?;
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
    pods::detach_hooks(
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
    let tc = pods::attach_hooks(ebpf, &iface, tc_mode, link_dir, &TC_HOOKS)
        .map_err(|e| UplinkError::Tc(Box::new(e)))?;
    if mode != XdpHook::Off {
        attach_xdp(ebpf, uplink, mode, link_dir)?;
    }
    let address = uplink
        .addr
        .map_or_else(|| "none".to_owned(), |a| a.to_string());
    info!(iface = %uplink.name, %address, xdp = %mode, "uplink programs attached");
    Ok(tc)
}

/// Takes the uplink programs off `uplink` (an interface that is no uplink
/// any more, or is gone): its TCX link pins and netlink filters, and its XDP
/// link pins of every mode. The pins of a gone interface only held dead
/// links; removing them is the cleanup.
pub fn detach(uplink: &Uplink, link_dir: &Path) -> Result<(), UplinkError> {
    let iface = PodInterface {
        name: uplink.name.clone(),
        index: uplink.index,
    };
    pods::detach_hooks(&iface, link_dir, &TC_HOOKS);
    for mode in XdpHook::ALL {
        remove_xdp_pin(&xdp_pin(link_dir, uplink.index, mode))?;
    }
    info!(iface = %uplink.name, index = uplink.index, "uplink programs detached");
    Ok(())
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
    let prog: &mut Xdp =
        crate::dataplane::load::object::typed(ebpf, name).map_err(|e| match e {
            crate::dataplane::load::object::LoadError::Program { source, .. } => xdp_error(source),
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
