//! The k3s-like pod network of the two-node sandbox ([`Lan::K3sLike`]), as
//! flannel's VXLAN backend builds it on each node: the pods on a Linux
//! bridge (flannel's `cni0`) that holds their gateway, and the other node's
//! pods behind a VXLAN device per family (`flannel.1`, `flannel-v6.1`) with
//! a static route, neighbour entry and forwarding entry for the other node,
//! instead of a route via the other node's LAN address.
//!
//! Every name here is inside a node or pod namespace: deleting the
//! namespaces removes the bridges and VXLAN devices (and their sockets).
use anyhow::Result;

use super::{Lan, Node, Pod, TwoNodeSandbox};
use crate::sandbox::sys::ip;

/// The pods' MTU (and the IPv4 VXLAN device's), as flannel sets it: the
/// uplink's 1500 less VXLAN over IPv4 (50 bytes).
pub const OVERLAY_MTU: u16 = 1450;
/// The IPv6 VXLAN device's MTU: the uplink's 1500 less VXLAN over IPv6 (70
/// bytes), what the kernel gives `flannel-v6.1`. The pods keep 1450, so an
/// IPv6 packet of more than 1430 bytes from a pod to the other node gets a
/// packet too big, as on a dual-stack flannel cluster.
pub const OVERLAY_MTU6: u16 = 1430;
/// flannel's VXLAN network identifier.
pub const VXLAN_ID: &str = "1";
/// flannel's VXLAN UDP port (the Linux default, not IANA's 4789).
pub const VXLAN_PORT: &str = "8472";

impl Node {
    /// The node's IPv4 overlay address, `10.244.<1|2>.0` (on its VXLAN
    /// device as a /32, as flannel puts it on `flannel.1`).
    pub fn overlay_ip(self) -> String {
        format!("10.244.{}.0", self.subnet())
    }
    /// The node's IPv6 overlay address, `fd00:10:244:<1|2>::` (a /128 on
    /// its IPv6 VXLAN device).
    pub fn overlay_ip6(self) -> String {
        format!("fd00:10:244:{}::", self.subnet())
    }
    /// The fixed MAC of the node's IPv4 VXLAN device (flannel publishes it
    /// in the Node's annotations; here it is a constant).
    pub fn vxlan_mac(self) -> String {
        format!("02:00:0a:f4:{:02x}:00", self.subnet())
    }
    /// The fixed MAC of the node's IPv6 VXLAN device.
    pub fn vxlan6_mac(self) -> String {
        format!("02:00:0a:f6:{:02x}:00", self.subnet())
    }
}

impl TwoNodeSandbox {
    /// The node's pod bridge (flannel's `cni0`), `<tag>ka` / `<tag>kb`.
    pub fn pod_bridge(&self, node: Node) -> String {
        format!("{}k{}", self.tag, node.letter())
    }
    /// The node's IPv4 VXLAN device (flannel's `flannel.1`), `<tag>fa` /
    /// `<tag>fb`.
    pub fn vxlan(&self, node: Node) -> String {
        format!("{}f{}", self.tag, node.letter())
    }
    /// The node's IPv6 VXLAN device (flannel's `flannel-v6.1`), `<tag>va` /
    /// `<tag>vb`.
    pub fn vxlan6(&self, node: Node) -> String {
        format!("{}v{}", self.tag, node.letter())
    }

    /// [`Lan::K3sLike`]: the node's bridge, its pods on it, and the overlay
    /// to the other node.
    pub(super) fn create_bridged_pods(&self, node: Node) -> Result<()> {
        self.create_pod_bridge(node)?;
        for pod in node.pods() {
            self.create_bridged_pod(pod)?;
        }
        self.create_overlay(node)
    }

    /// The bridge, holding the pods' gateways (`10.244.<s>.1/24`,
    /// `fd00:10:244:<s>::1/64`), MTU 1450; no STP, no multicast snooping.
    fn create_pod_bridge(&self, node: Node) -> Result<()> {
        let (ns, br) = (self.node_ns(node), self.pod_bridge(node));
        let mtu = OVERLAY_MTU.to_string();
        ip(&[
            "-n",
            &ns,
            "link",
            "add",
            &br,
            "mtu",
            &mtu,
            "type",
            "bridge",
            "stp_state",
            "0",
            "mcast_snooping",
            "0",
        ])?;
        let gateway = format!("{}/24", node.gateway());
        ip(&["-n", &ns, "addr", "add", &gateway, "dev", &br])?;
        let gateway6 = format!("{}/64", node.gateway6());
        ip(&[
            "-n", &ns, "-6", "addr", "add", &gateway6, "dev", &br, "nodad",
        ])?;
        ip(&["-n", &ns, "link", "set", &br, "up"])
    }

    /// A pod on its node's bridge: the node-side veth a bridge port without
    /// an address, the pod's `eth0` with `10.244.<s>.<n+1>/24` and
    /// `fd00:10:244:<s>::<n+1>/64` and default routes via the gateways;
    /// both ends at MTU 1450.
    fn create_bridged_pod(&self, pod: Pod) -> Result<()> {
        let (node_ns, pod_ns, host_if) =
            (self.node_ns(pod.node), self.pod_ns(pod), self.pod_if(pod));
        let mtu = OVERLAY_MTU.to_string();
        ip(&[
            "-n", &node_ns, "link", "add", &host_if, "mtu", &mtu, "type", "veth", "peer", "name",
            "eth0", "mtu", &mtu, "netns", &pod_ns,
        ])?;
        let br = self.pod_bridge(pod.node);
        ip(&["-n", &node_ns, "link", "set", &host_if, "master", &br])?;
        ip(&["-n", &node_ns, "link", "set", &host_if, "up"])?;
        let addr = format!("{}/24", pod.ip());
        ip(&["-n", &pod_ns, "addr", "add", &addr, "dev", "eth0"])?;
        let addr6 = format!("{}/64", pod.ip6());
        ip(&[
            "-n", &pod_ns, "-6", "addr", "add", &addr6, "dev", "eth0", "nodad",
        ])?;
        ip(&["-n", &pod_ns, "link", "set", "eth0", "up"])?;
        let gateway = pod.node.gateway();
        ip(&["-n", &pod_ns, "route", "add", "default", "via", &gateway])?;
        let gateway6 = pod.node.gateway6();
        ip(&[
            "-n", &pod_ns, "-6", "route", "add", "default", "via", &gateway6,
        ])
    }

    /// The node's VXLAN devices (one per family), then the routes to the
    /// other node's pods over them.
    pub(super) fn create_overlay(&self, node: Node) -> Result<()> {
        let ns = self.node_ns(node);
        let (v4, v6) = (self.vxlan(node), self.vxlan6(node));
        self.create_vxlan(node, &v4, &node.vxlan_mac(), node.ip(), OVERLAY_MTU)?;
        let addr = format!("{}/32", node.overlay_ip());
        ip(&["-n", &ns, "addr", "add", &addr, "dev", &v4])?;
        ip(&["-n", &ns, "link", "set", &v4, "up"])?;
        self.create_vxlan(node, &v6, &node.vxlan6_mac(), node.ip6(), OVERLAY_MTU6)?;
        let addr6 = format!("{}/128", node.overlay_ip6());
        ip(&["-n", &ns, "-6", "addr", "add", &addr6, "dev", &v6, "nodad"])?;
        ip(&["-n", &ns, "link", "set", &v6, "up"])?;
        self.route_over_overlay(node)
    }

    /// `ip link add <name> address <mac> mtu <mtu> type vxlan id 1 local
    /// <local> dev <uplink> dstport 8472 nolearning`.
    fn create_vxlan(&self, node: Node, name: &str, mac: &str, local: &str, mtu: u16) -> Result<()> {
        let mtu = mtu.to_string();
        ip(&[
            "-n",
            &self.node_ns(node),
            "link",
            "add",
            name,
            "address",
            mac,
            "mtu",
            &mtu,
            "type",
            "vxlan",
            "id",
            VXLAN_ID,
            "local",
            local,
            "dev",
            &self.uplink(node),
            "dstport",
            VXLAN_PORT,
            "nolearning",
        ])
    }

    /// What flannel writes for the other node, per family: a route to its
    /// pod range via its overlay address (on-link over the VXLAN device), a
    /// permanent neighbour entry giving that address the other VXLAN
    /// device's MAC, and a forwarding entry sending that MAC to the other
    /// node's LAN address. Idempotent (replaces what exists).
    pub(super) fn route_over_overlay(&self, node: Node) -> Result<()> {
        let other = node.other();
        let families = [
            (
                "-4",
                self.vxlan(node),
                other.pod_cidr(),
                other.overlay_ip(),
                other.vxlan_mac(),
                other.ip(),
            ),
            (
                "-6",
                self.vxlan6(node),
                other.pod_cidr6(),
                other.overlay_ip6(),
                other.vxlan6_mac(),
                other.ip6(),
            ),
        ];
        let ns = self.node_ns(node);
        for (family, dev, cidr, via, mac, lan_ip) in families {
            ip(&[
                "-n", &ns, family, "route", "replace", &cidr, "via", &via, "dev", &dev, "onlink",
            ])?;
            ip(&[
                "-n",
                &ns,
                family,
                "neigh",
                "replace",
                &via,
                "lladdr",
                &mac,
                "dev",
                &dev,
                "nud",
                "permanent",
            ])?;
            self.exec(
                &ns,
                &["bridge", "fdb", "replace", &mac, "dev", &dev, "dst", lan_ip],
            )?;
        }
        Ok(())
    }

    /// Whether the sandbox's pods sit on bridges behind an overlay.
    pub fn bridged_pods(&self) -> bool {
        self.lan == Lan::K3sLike
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlay_addresses_and_macs() {
        assert_eq!(Node::A.overlay_ip(), "10.244.1.0");
        assert_eq!(Node::B.overlay_ip6(), "fd00:10:244:2::");
        assert_eq!(Node::A.vxlan_mac(), "02:00:0a:f4:01:00");
        assert_eq!(Node::B.vxlan6_mac(), "02:00:0a:f6:02:00");
        assert_ne!(Node::A.vxlan_mac(), Node::A.vxlan6_mac());
    }
}
