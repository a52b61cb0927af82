//! Finding the uplinks and their addresses in this namespace's interfaces
//! (see the module documentation of [`super`]).
use std::{
    collections::HashMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use futures::TryStreamExt as _;
use netlink_packet_route::{
    address::{AddressAttribute, AddressHeaderFlags, AddressScope},
    link::{LinkAttribute, LinkInfo},
    route::{RouteAttribute, RouteMessage},
};

use super::{Role, Uplink, UplinkError};

/// Link kinds of overlay devices ([`Role::Overlay`]): the tunnels CNI
/// plugins reach other nodes' pods through.
pub const OVERLAY_KINDS: &[&str] = &[
    "vxlan",
    "geneve",
    "wireguard",
    "ipip",
    "sit",
    "gre",
    "ip6tnl",
    "ip6gre",
];

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

    fn uplink(&self, index: u32, node_addrs: &[Ipv4Addr]) -> Uplink {
        Uplink {
            name: self.name_of(index).unwrap_or_default().to_owned(),
            index,
            addr: self.snat_addr(index, node_addrs),
            addr6: self.addrs6.get(&index).and_then(|a| a.first()).copied(),
            kind: self.kinds.get(&index).cloned(),
            role: Role::Uplink,
        }
    }

    /// The overlay devices: interfaces of an [`OVERLAY_KINDS`] kind with an
    /// address of either family, by index.
    fn overlays(&self) -> Vec<u32> {
        let mut overlays: Vec<u32> = self
            .kinds
            .iter()
            .filter(|(_, kind)| OVERLAY_KINDS.contains(&kind.as_str()))
            .map(|(index, _)| *index)
            .filter(|index| self.addrs.contains_key(index) || self.addrs6.contains_key(index))
            .collect();
        overlays.sort_unstable();
        overlays
    }

    /// The interfaces holding one of `node_addrs`, by index.
    fn holding(&self, node_addrs: &[Ipv4Addr]) -> Vec<u32> {
        let mut holding: Vec<u32> = self
            .addrs
            .iter()
            .filter(|(_, addrs)| addrs.iter().any(|a| node_addrs.contains(a)))
            .map(|(index, _)| *index)
            .collect();
        holding.sort_unstable();
        holding
    }
}

/// The uplinks found, and the named ones (`--uplink`) that do not exist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    pub uplinks: Vec<Uplink>,
    /// `--uplink` names no interface has (yet).
    pub missing: Vec<String>,
}

/// Chooses the uplinks among `interfaces` ([`select_uplinks`]), then adds
/// the overlay devices that are not uplinks already.
fn select(
    interfaces: &Interfaces,
    names: &[String],
    node_addrs: &[Ipv4Addr],
    default_oif: Option<u32>,
) -> Resolved {
    let mut resolved = select_uplinks(interfaces, names, node_addrs, default_oif);
    for index in interfaces.overlays() {
        if resolved.uplinks.iter().all(|u| u.index != index) {
            let overlay = Uplink {
                role: Role::Overlay,
                ..interfaces.uplink(index, node_addrs)
            };
            resolved.uplinks.push(overlay);
        }
    }
    resolved
}

/// Chooses the uplinks proper: `names` if given (each that exists; the
/// others are missing), else the interfaces holding one of `node_addrs`,
/// else `default_oif` (the default route's interface).
fn select_uplinks(
    interfaces: &Interfaces,
    names: &[String],
    node_addrs: &[Ipv4Addr],
    default_oif: Option<u32>,
) -> Resolved {
    let mut resolved = Resolved::default();
    if !names.is_empty() {
        for name in names {
            match interfaces.by_name.get(name) {
                Some(&index) if resolved.uplinks.iter().all(|u| u.index != index) => {
                    resolved.uplinks.push(interfaces.uplink(index, node_addrs));
                }
                Some(_) => {}
                None => resolved.missing.push(name.clone()),
            }
        }
        return resolved;
    }
    let mut holding = interfaces.holding(node_addrs);
    if holding.is_empty() {
        holding.extend(default_oif.filter(|i| interfaces.name_of(*i).is_some()));
    }
    resolved.uplinks = holding
        .into_iter()
        .map(|index| interfaces.uplink(index, node_addrs))
        .collect();
    resolved
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
/// `node_addrs`, else the default route's interface. Only netlink failures
/// are errors: a named interface that does not exist is listed as missing,
/// and none found is an empty list.
pub async fn resolve(
    handle: &rtnetlink::Handle,
    names: &[String],
    node_addrs: &[Ipv4Addr],
) -> Result<Resolved, UplinkError> {
    let interfaces = Interfaces::list(handle).await?;
    let default_oif = match names.is_empty() && interfaces.holding(node_addrs).is_empty() {
        true => default_route_interface(handle).await?,
        false => None,
    };
    Ok(select(&interfaces, names, node_addrs, default_oif))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().expect("address")
    }

    /// eth0 (2) with 192.168.50.1 and a global IPv6 address, veth1 (3, a
    /// veth) with 10.0.0.1, lo-less.
    fn interfaces() -> Interfaces {
        Interfaces {
            by_name: HashMap::from([("eth0".to_owned(), 2), ("veth1".to_owned(), 3)]),
            kinds: HashMap::from([(3, "veth".to_owned())]),
            addrs: HashMap::from([
                (2, vec![ip("192.168.50.9"), ip("192.168.50.1")]),
                (3, vec![ip("10.0.0.1")]),
            ]),
            addrs6: HashMap::from([(2, vec!["fd00:50::1".parse().expect("address")])]),
        }
    }

    fn names(resolved: &Resolved) -> Vec<(&str, u32)> {
        resolved
            .uplinks
            .iter()
            .map(|u| (u.name.as_str(), u.index))
            .collect()
    }

    #[test]
    fn named_uplinks_that_do_not_exist_are_missing_not_errors() {
        let named = ["eth9".to_owned(), "veth1".to_owned(), "veth1".to_owned()];
        let got = select(&interfaces(), &named, &[], None);
        assert_eq!(names(&got), [("veth1", 3)]);
        assert_eq!(got.missing, ["eth9"]);
        assert_eq!(got.uplinks[0].kind.as_deref(), Some("veth"));
        assert_eq!(got.uplinks[0].addr, Some(ip("10.0.0.1")));
    }

    #[test]
    fn the_node_address_picks_the_uplink_and_its_snat_address() {
        let got = select(&interfaces(), &[], &[ip("192.168.50.1")], Some(3));
        assert_eq!(names(&got), [("eth0", 2)]);
        assert_eq!(got.uplinks[0].addr, Some(ip("192.168.50.1")));
        assert!(got.uplinks[0].addr6.is_some());
        assert!(got.missing.is_empty());
    }

    #[test]
    fn without_the_node_address_the_default_route_interface_serves() {
        let got = select(&interfaces(), &[], &[ip("192.168.50.7")], Some(3));
        assert_eq!(names(&got), [("veth1", 3)]);
        // A default route through an interface that is not listed (gone
        // meanwhile) gives none.
        assert!(select(&interfaces(), &[], &[], Some(42)).uplinks.is_empty());
        assert!(select(&interfaces(), &[], &[], None).uplinks.is_empty());
    }

    /// [`interfaces`] plus flannel's overlay (4, vxlan, 10.244.1.0 and
    /// fd00:10:244:1::) and a vxlan without an address (5).
    fn with_overlay() -> Interfaces {
        let mut ifs = interfaces();
        ifs.by_name.insert("flannel.1".to_owned(), 4);
        ifs.by_name.insert("vxlan.idle".to_owned(), 5);
        ifs.kinds.insert(4, "vxlan".to_owned());
        ifs.kinds.insert(5, "vxlan".to_owned());
        ifs.addrs.insert(4, vec![ip("10.244.1.0")]);
        ifs.addrs6
            .insert(4, vec!["fd00:10:244:1::".parse().expect("address")]);
        ifs
    }

    #[test]
    fn overlays_with_an_address_join_the_uplinks_whatever_names_them() {
        let overlay = |got: &Resolved| {
            got.uplinks
                .iter()
                .filter(|u| u.role == Role::Overlay)
                .map(|u| (u.name.clone(), u.index, u.addr))
                .collect::<Vec<_>>()
        };
        let want = [("flannel.1".to_owned(), 4, Some(ip("10.244.1.0")))];
        let found = select(&with_overlay(), &[], &[ip("192.168.50.1")], None);
        assert_eq!(names(&found), [("eth0", 2), ("flannel.1", 4)]);
        assert_eq!(overlay(&found), want);
        assert_eq!(found.uplinks[0].role, Role::Uplink);
        let named = select(&with_overlay(), &["eth0".to_owned()], &[], None);
        assert_eq!(overlay(&named), want);
        assert!(named.uplinks[1].addr6.is_some());
        // Named as an uplink, an overlay device is one (listed once).
        let both = select(&with_overlay(), &["flannel.1".to_owned()], &[], None);
        assert_eq!(names(&both), [("flannel.1", 4)]);
        assert_eq!(both.uplinks[0].role, Role::Uplink);
    }

    #[test]
    fn a_named_uplink_without_ipv4_is_kept_without_an_address() {
        let mut ifs = interfaces();
        ifs.addrs.remove(&2);
        let got = select(&ifs, &["eth0".to_owned()], &[], None);
        assert_eq!(got.uplinks[0].addr, None);
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
