//! What is really attached in the current network namespace: the TCX
//! programs, netlink clsact filters and XDP programs of every interface, the
//! links pinned under `<pin root>/links`, and the routes and addresses
//! `explain` classifies a source with. Read through netlink and the bpf(2)
//! program queries; nothing here changes anything.
use std::{
    collections::HashMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use aya::programs::{ProgramError, SchedClassifier, TcAttachType};
use futures::{StreamExt as _, TryStreamExt as _};
use netlink_packet_route::{
    address::AddressAttribute,
    link::{LinkAttribute, LinkMessage, LinkXdp, XdpAttached},
    route::{RouteAddress, RouteAttribute},
    tc::{TcAttribute, TcHandle, TcMessage, TcOption},
    RouteNetlinkMessage,
};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use rtnetlink::packet_utils::nla::Nla as _;
use serde::Serialize;

use crate::dataplane::attach::{linkinfo, pods};

/// clsact's ingress and egress parents (`TC_H_CLSACT` with
/// `TC_H_MIN_INGRESS` / `TC_H_MIN_EGRESS`).
const CLSACT_INGRESS: u32 = 0xFFFF_FFF2;
const CLSACT_EGRESS: u32 = 0xFFFF_FFF3;
/// `TCA_BPF_NAME` inside a `bpf` filter's options.
const TCA_BPF_NAME: u16 = 7;

/// The programs on one interface of this namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IfaceHooks {
    pub name: String,
    pub index: u32,
    /// A veth whose peer is in another namespace (what the agent treats as
    /// a pod interface).
    pub pod: bool,
    /// TCX programs on ingress / egress, by program name.
    pub tcx_ingress: Vec<String>,
    pub tcx_egress: Vec<String>,
    /// Netlink clsact `bpf` filters on ingress / egress, by filter name.
    pub tc_ingress: Vec<String>,
    pub tc_egress: Vec<String>,
    /// The XDP program and its mode (`native`, `generic`, ...), if any.
    pub xdp: Option<(String, String)>,
}

impl IfaceHooks {
    /// Whether `program` runs on this interface's ingress (or egress), as
    /// TCX or as a netlink filter.
    pub fn has_tc(&self, program: &str, ingress: bool) -> bool {
        let (tcx, tc) = if ingress {
            (&self.tcx_ingress, &self.tc_ingress)
        } else {
            (&self.tcx_egress, &self.tc_egress)
        };
        tcx.iter().chain(tc).any(|p| same_program(p, program))
    }

    /// Whether XDP `program` is attached.
    pub fn has_xdp(&self, program: &str) -> bool {
        self.xdp
            .as_ref()
            .is_some_and(|(p, _)| same_program(p, program))
    }

    /// `tc ingress sb_from_pod, tcx egress sb_to_pod, xdp native sb_xdp_uplink`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        for (hook, names) in [
            ("tcx ingress", &self.tcx_ingress),
            ("tcx egress", &self.tcx_egress),
            ("tc ingress", &self.tc_ingress),
            ("tc egress", &self.tc_egress),
        ] {
            parts.extend(names.iter().map(|n| format!("{hook} {n}")));
        }
        if let Some((program, mode)) = &self.xdp {
            parts.push(format!("xdp {mode} {program}"));
        }
        if parts.is_empty() {
            "(nothing)".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// The kernel keeps 15 bytes of a program's name (`BPF_OBJ_NAME_LEN`).
pub fn same_program(seen: &str, wanted: &str) -> bool {
    let cut = |s: &str| s.chars().take(15).collect::<String>();
    cut(seen) == cut(wanted)
}

/// A route of the main table: destination block and output interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route4 {
    pub dst: Ipv4Addr,
    pub prefix: u8,
    pub oif: u32,
}

/// What `status` and `doctor` say when the kernel refuses to list programs.
pub const CANNOT_INSPECT: &str = "cannot inspect: permission denied (need CAP_SYS_ADMIN or root)";

/// The interfaces, routes and addresses of this namespace.
#[derive(Clone, Debug, Default)]
pub struct NetView {
    /// Set when the kernel refused (EPERM) to list the programs or to open
    /// one by id (CAP_SYS_ADMIN; a pod's CAP_BPF, CAP_NET_ADMIN and
    /// CAP_PERFMON are not enough): the programs of `interfaces` are then
    /// unknown, not absent.
    pub programs_unreadable: Option<String>,
    pub interfaces: Vec<IfaceHooks>,
    pub routes: Vec<Route4>,
    /// This namespace's IPv4 addresses.
    pub addresses: Vec<Ipv4Addr>,
}

/// Opens a netlink connection on the current runtime.
pub fn connect() -> anyhow::Result<rtnetlink::Handle> {
    let (connection, handle, _) = rtnetlink::new_connection()
        .map_err(|e| anyhow::anyhow!("opening a netlink socket: {e}"))?;
    tokio::spawn(connection);
    Ok(handle)
}

/// Reads the interfaces (with their programs), routes and addresses.
pub async fn inspect(handle: &mut rtnetlink::Handle) -> anyhow::Result<NetView> {
    let mut denied = None;
    let names = program_names().unwrap_or_else(|error| {
        denied = Some(error);
        HashMap::new()
    });
    let mut links = handle.link().get().execute();
    let mut interfaces = Vec::new();
    while let Some(link) = links.try_next().await? {
        let (hooks, refused) = iface_hooks(&link, &names);
        interfaces.push(hooks);
        denied = denied.or(refused);
    }
    for iface in &mut interfaces {
        iface.tc_ingress = filter_names(handle, iface.index, CLSACT_INGRESS).await;
        iface.tc_egress = filter_names(handle, iface.index, CLSACT_EGRESS).await;
    }
    Ok(NetView {
        programs_unreadable: denied.as_ref().and_then(unreadable),
        interfaces,
        routes: routes(handle).await?,
        addresses: addresses(handle).await?,
    })
}

/// What to say of a failure to read the programs: [`CANNOT_INSPECT`] when
/// the kernel refused (EPERM or EACCES, anywhere in its causes), `None`
/// for anything else (a program unloaded while we looked).
pub fn unreadable(error: &ProgramError) -> Option<String> {
    crate::dataplane::load::caps::permission_denied(error).then(|| CANNOT_INSPECT.to_owned())
}

/// Program id → name, for every loaded program; fails only when the
/// kernel refuses to list them (a program that goes away meanwhile is
/// skipped).
pub fn program_names() -> Result<HashMap<u32, String>, ProgramError> {
    let mut names = HashMap::new();
    for info in aya::programs::loaded_programs() {
        match info {
            Ok(info) => {
                names.insert(info.id(), info.name_as_str().unwrap_or("?").to_owned());
            }
            Err(error) if unreadable(&error).is_some() => return Err(error),
            Err(_) => {}
        }
    }
    Ok(names)
}

/// The hooks of `link`, and the error when the kernel refused to tell its
/// TCX programs.
fn iface_hooks(
    link: &LinkMessage,
    names: &HashMap<u32, String>,
) -> (IfaceHooks, Option<ProgramError>) {
    let name = link
        .attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::IfName(n) => Some(n.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let mut denied = None;
    let mut tcx = |hook| match SchedClassifier::query_tcx(&name, hook) {
        Ok((_, programs)) => programs
            .iter()
            .map(|p| p.name_as_str().unwrap_or("?").to_owned())
            .collect(),
        Err(error) => {
            if unreadable(&error).is_some() {
                denied = Some(error);
            }
            Vec::new()
        }
    };
    let hooks = IfaceHooks {
        tcx_ingress: tcx(TcAttachType::Ingress),
        tcx_egress: tcx(TcAttachType::Egress),
        pod: pods::pod_interface(link).is_some(),
        xdp: xdp_program(link, names),
        index: link.header.index,
        name,
        tc_ingress: Vec::new(),
        tc_egress: Vec::new(),
    };
    (hooks, denied)
}

/// The XDP program of a link and its mode, from `IFLA_XDP`.
fn xdp_program(link: &LinkMessage, names: &HashMap<u32, String>) -> Option<(String, String)> {
    let xdp = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Xdp(x) => Some(x),
        _ => None,
    })?;
    let mut mode = None;
    let mut id = None;
    for attr in xdp {
        match attr {
            LinkXdp::Attached(XdpAttached::Driver) => mode = Some("native"),
            LinkXdp::Attached(XdpAttached::SocketBuffer) => mode = Some("generic"),
            LinkXdp::Attached(XdpAttached::Hardware) => mode = Some("offload"),
            LinkXdp::Attached(XdpAttached::Multiple) => mode = Some("multiple"),
            LinkXdp::ProgId(p) => id = Some(*p),
            _ => {}
        }
    }
    let id = id.filter(|id| *id != 0)?;
    let name = names
        .get(&id)
        .cloned()
        .unwrap_or_else(|| format!("id {id}"));
    Some((name, mode.unwrap_or("?").to_owned()))
}

/// Names of the `bpf` filters under clsact parent `parent` of interface
/// `index` (none when the interface has no clsact qdisc).
async fn filter_names(handle: &mut rtnetlink::Handle, index: u32, parent: u32) -> Vec<String> {
    let mut message = TcMessage::with_index(index as i32);
    message.header.parent = TcHandle::from(parent);
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetTrafficFilter(message));
    request.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let Ok(mut responses) = handle.request(request) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    while let Some(response) = responses.next().await {
        if let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewTrafficFilter(filter)) =
            response.payload
        {
            names.extend(bpf_filter_name(&filter));
        }
    }
    names.sort();
    names.dedup();
    names
}

/// The name of a `bpf` filter (`TCA_BPF_NAME` inside its options).
fn bpf_filter_name(filter: &TcMessage) -> Option<String> {
    let is_bpf = filter
        .attributes
        .iter()
        .any(|a| matches!(a, TcAttribute::Kind(k) if k == "bpf"));
    if !is_bpf {
        return None;
    }
    filter.attributes.iter().find_map(|a| match a {
        TcAttribute::Options(options) => options.iter().find_map(|o| match o {
            TcOption::Other(nla) => {
                let mut nested = vec![0u8; nla.value_len()];
                nla.emit_value(&mut nested);
                nested_string(&nested, TCA_BPF_NAME)
            }
            _ => None,
        }),
        _ => None,
    })
}

/// The NUL-terminated string attribute `kind` among the netlink attributes
/// in `bytes` (length u16, type u16, value, padded to 4 bytes).
pub fn nested_string(bytes: &[u8], kind: u16) -> Option<String> {
    let mut rest = bytes;
    while rest.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
        let nla_type = u16::from_ne_bytes([rest[2], rest[3]]) & 0x3fff;
        if len < 4 || len > rest.len() {
            return None;
        }
        if nla_type == kind {
            let value = &rest[4..len];
            let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
            return Some(String::from_utf8_lossy(&value[..end]).into_owned());
        }
        let step = (len + 3) & !3;
        rest = rest.get(step..).unwrap_or_default();
    }
    None
}

/// The IPv4 routes of the main table.
async fn routes(handle: &rtnetlink::Handle) -> anyhow::Result<Vec<Route4>> {
    let mut found = Vec::new();
    let mut routes = handle
        .route()
        .get(rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute();
    while let Some(route) = routes.try_next().await? {
        let mut dst = Ipv4Addr::UNSPECIFIED;
        let mut oif = None;
        for attr in &route.attributes {
            match attr {
                RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = *a,
                RouteAttribute::Oif(i) => oif = Some(*i),
                _ => {}
            }
        }
        if let Some(oif) = oif {
            found.push(Route4 {
                dst,
                prefix: route.header.destination_prefix_length,
                oif,
            });
        }
    }
    Ok(found)
}

async fn addresses(handle: &rtnetlink::Handle) -> anyhow::Result<Vec<Ipv4Addr>> {
    let mut found = Vec::new();
    let mut addrs = handle.address().get().execute();
    while let Some(msg) = addrs.try_next().await? {
        for attr in &msg.attributes {
            if let AddressAttribute::Local(std::net::IpAddr::V4(a))
            | AddressAttribute::Address(std::net::IpAddr::V4(a)) = attr
            {
                if !found.contains(a) {
                    found.push(*a);
                }
            }
        }
    }
    Ok(found)
}

/// The route a packet to `addr` takes: longest prefix first.
pub fn route_to(routes: &[Route4], addr: Ipv4Addr) -> Option<Route4> {
    routes
        .iter()
        .filter(|r| {
            let mask = if r.prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(r.prefix.min(32)))
            };
            u32::from(addr) & mask == u32::from(r.dst) & mask
        })
        .max_by_key(|r| r.prefix)
        .copied()
}

/// One file under `<pin root>/links`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LinkPin {
    pub name: String,
    #[serde(skip)]
    pub path: PathBuf,
    /// `tcx`, `xdp`, `cgroup` or `other`.
    pub kind: &'static str,
    /// The interface index a `tcx_`/`xdp_` pin names.
    pub index: Option<u32>,
    /// The pin holds a link attached to nothing any more (detached with
    /// `bpftool link detach`, say): the program no longer runs.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub detached: bool,
}

/// The pinned links of `pin_root` (none when the directory is missing).
pub fn pinned_links(pin_root: &Path) -> Vec<LinkPin> {
    let Ok(entries) = std::fs::read_dir(pin_root.join("links")) else {
        return Vec::new();
    };
    let mut pins: Vec<LinkPin> = entries
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (kind, index) = classify_pin(&name);
            // A pin that cannot be read (permissions) is taken as attached:
            // nothing is known to be wrong with it.
            let detached =
                kind != "other" && linkinfo::link_target(&e.path()).is_ok_and(|t| t.detached());
            LinkPin {
                path: e.path(),
                name,
                kind,
                index,
                detached,
            }
        })
        .collect();
    pins.sort_by(|a, b| a.name.cmp(&b.name));
    pins
}

/// The socket-layer programs that do not run on the agent's cgroup, from
/// its pinned links: a program without a pin, or whose pinned link was
/// detached (`status`, `doctor` and the agent's repair read them alike).
pub fn socket_layer_unattached(pins: &[LinkPin]) -> Vec<String> {
    crate::dataplane::attach::socket_layer::all_programs()
        .filter_map(|program| match pins.iter().find(|l| l.name == program) {
            None => Some(program.to_owned()),
            Some(pin) if pin.detached => Some(format!("{program} (detached, pin kept)")),
            Some(_) => None,
        })
        .collect()
}

/// `tcx_<index>_<program>`, `xdp_<index>_<mode>`, or a socket-layer program.
fn classify_pin(name: &str) -> (&'static str, Option<u32>) {
    let index_after = |prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|rest| rest.split('_').next())
            .and_then(|i| i.parse().ok())
    };
    if let Some(index) = index_after("tcx_") {
        ("tcx", Some(index))
    } else if let Some(index) = index_after("xdp_") {
        ("xdp", Some(index))
    } else if name.starts_with("sb_sock_") {
        ("cgroup", None)
    } else {
        ("other", None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_classified_by_their_names() {
        assert_eq!(classify_pin("tcx_12_sb_from_pod"), ("tcx", Some(12)));
        assert_eq!(classify_pin("xdp_3_native"), ("xdp", Some(3)));
        assert_eq!(classify_pin("sb_sock_connect4"), ("cgroup", None));
        assert_eq!(classify_pin("sb_sock_getpeername6"), ("cgroup", None));
        assert_eq!(classify_pin("junk"), ("other", None));
    }

    #[test]
    fn longest_prefix_wins() {
        let routes = [
            Route4 {
                dst: Ipv4Addr::UNSPECIFIED,
                prefix: 0,
                oif: 1,
            },
            Route4 {
                dst: Ipv4Addr::new(10, 244, 1, 0),
                prefix: 24,
                oif: 5,
            },
            Route4 {
                dst: Ipv4Addr::new(10, 244, 1, 7),
                prefix: 32,
                oif: 9,
            },
        ];
        assert_eq!(
            route_to(&routes, Ipv4Addr::new(10, 244, 1, 2)).map(|r| r.oif),
            Some(5)
        );
        assert_eq!(
            route_to(&routes, Ipv4Addr::new(10, 244, 1, 7)).map(|r| r.oif),
            Some(9)
        );
        assert_eq!(
            route_to(&routes, Ipv4Addr::new(192, 0, 2, 1)).map(|r| r.oif),
            Some(1)
        );
        assert_eq!(route_to(&routes[1..], Ipv4Addr::new(192, 0, 2, 1)), None);
    }

    #[test]
    fn the_bpf_filter_name_is_found_among_nested_attributes() {
        // TCA_BPF_FD (6, u32) then TCA_BPF_NAME (7, "sb_to_pod\0", padded).
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&8u16.to_ne_bytes());
        bytes.extend_from_slice(&6u16.to_ne_bytes());
        bytes.extend_from_slice(&5u32.to_ne_bytes());
        let name = b"sb_to_pod\0";
        bytes.extend_from_slice(&((4 + name.len()) as u16).to_ne_bytes());
        bytes.extend_from_slice(&7u16.to_ne_bytes());
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(&[0, 0]);
        assert_eq!(nested_string(&bytes, 7).as_deref(), Some("sb_to_pod"));
        assert_eq!(nested_string(&bytes, 11), None);
        assert_eq!(nested_string(&bytes[..3], 7), None);
    }

    /// Without CAP_SYS_ADMIN the kernel refuses to list programs
    /// (EPERM); that is told apart by errno from a program that vanished.
    #[test]
    fn a_refused_listing_reads_as_cannot_inspect() {
        let refused = |errno| {
            ProgramError::SyscallError(aya::sys::SyscallError {
                call: "bpf_prog_get_next_id",
                io_error: std::io::Error::from_raw_os_error(errno),
            })
        };
        assert_eq!(
            unreadable(&refused(libc::EPERM)).as_deref(),
            Some(CANNOT_INSPECT)
        );
        assert_eq!(unreadable(&refused(libc::ENOENT)), None);
        assert!(CANNOT_INSPECT.contains("need CAP_SYS_ADMIN or root"));
    }

    #[test]
    fn program_names_compare_as_the_kernel_cuts_them() {
        assert!(same_program("sb_sock_connect", "sb_sock_connect4"));
        assert!(!same_program("sb_to_pod", "sb_from_pod"));
    }
}
