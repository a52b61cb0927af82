//! The two-node sandbox: two nodes on a LAN, two pods per node, and clients
//! outside the nodes, for NodePort, LoadBalancer and external-IP traffic
//! (tests, the demo and the benchmark).
//!
//! ```text
//!                       <tag>-lan: bridge <tag>br (no address)
//!        ┌──────────────┬──────────────┬──────────────┬──────────────┐
//!     <tag>la        <tag>lb        <tag>c1        <tag>c2      (bridge ports)
//!        │              │              │              │
//!     <tag>ua        <tag>ub         eth0           eth0
//!  192.168.50.1/24 192.168.50.2/24 .50.100/24     .50.101/24
//!   <tag>-na        <tag>-nb        <tag>-c1       <tag>-c2
//!   (node-a)        (node-b)        client 1       client 2
//!    │<tag>a1 ── eth0 <tag>-pa1 10.244.1.2 (podA1)
//!    │<tag>a2 ── eth0 <tag>-pa2 10.244.1.3 (podA2)
//!                    │<tag>b1 ── eth0 <tag>-pb1 10.244.2.2 (podB1)
//!                    │<tag>b2 ── eth0 <tag>-pb2 10.244.2.3 (podB2)
//! ```
//!
//! - Dual-stack: every address above has an IPv6 twin (all `nodad`, and
//!   duplicate address detection is off in every namespace): the LAN is
//!   `fd00:50::/64` (node A `::1`, node B `::2`, clients `::100`, `::101`),
//!   node `<1|2>`'s pods are `fd00:10:244:<1|2>::<n+1>` (/128s, gateway
//!   `fd00:10:244:<1|2>::1` on each pod veth as for IPv4), each node routes
//!   the other's `fd00:10:244:<1|2>::/64` via the other's IPv6 LAN address,
//!   clients route `fd00:10:244::/48` like the IPv4 pod range, and nodes
//!   forward IPv6 too. The bridge does not snoop multicast (neighbour
//!   discovery floods like ARP). The Node manifests name only the IPv4
//!   address unless a test writes [`manifests::node_yaml_dual_stack`].
//! - Nodes: `ip_forward=1`, `rp_filter=0` and `send_redirects=0` (a node
//!   forwarding a client's packet back onto the LAN must not redirect the
//!   client to the other node) on every interface. Each routes the other
//!   node's pod range (`10.244.<1|2>.0/24`) via the other node's LAN address
//!   (over the overlay on [`Lan::K3sLike`]).
//! - Pods (kind-like and XDP-ready LANs): `eth0` holds the pod address as a
//!   /32; the pod routes its node's gateway (`10.244.<1|2>.1`) on-link and
//!   uses it as default route. The
//!   node-side veth holds that gateway as a /32 (the same address on each pod
//!   veth of the node) and a /32 link route to the pod. So two pods of one
//!   node share a /24 without sharing a link.
//! - Clients: `eth0` on the LAN, `accept_redirects=0`; route the pod range
//!   `10.244.0.0/16` via node A, and the Service addresses [`LB_IP`] and
//!   [`EXTERNAL_IP`] (as /32s) via node A until
//!   [`TwoNodeSandbox::route_services_via`] says otherwise.
//! - The LAN is one of three kinds ([`Lan`]). By default ([`Lan::KindLike`])
//!   it is what a kind cluster gives a node: a veth uplink on a bridge, pods
//!   and clients sending with checksum offload on (partial checksums), no XDP
//!   program and no GRO on the uplinks' peers. Two places finish checksums in
//!   software before the receiver sees them, as a NIC on a wire would: the
//!   clients' bridge ports (`<tag>c1`, `<tag>c2`) and the node-side pod veths
//!   (tx checksum offload off there), so a translation that leaves a wrong
//!   checksum makes the receiver drop the packet instead of trusting it.
//!   [`Lan::XdpReady`] (tests about native XDP, the benchmark) is set up for
//!   native XDP on the veth uplinks: GRO (hence NAPI) on the bridge-side ends
//!   of the uplinks (`<tag>la`, `<tag>lb`: XDP_TX on an uplink lands there)
//!   with an `XDP_PASS` program that wakes them, GRO on the pods' `eth0` (an
//!   XDP redirect from the uplink into a pod veth lands there), and every
//!   sender writing complete checksums (offload off), as frames off a wire
//!   carry them.
//! - [`Lan::K3sLike`] keeps that LAN and its senders but builds each node's
//!   pod network as k3s's flannel (VXLAN backend) does ([`flannel`]):
//!
//!   ```text
//!   node A (<tag>-na)                                      node B: the same with
//!    <tag>ua 192.168.50.1 ── LAN ── 192.168.50.2 <tag>ub   s=2, o=1, letter b
//!     ├─ <tag>fa  vxlan id 1 local 192.168.50.1 dev <tag>ua dstport 8472
//!     │           nolearning, MTU 1450, 10.244.1.0/32 (flannel.1)
//!     ├─ <tag>va  the same over IPv6 (local fd00:50::1), MTU 1430,
//!     │           fd00:10:244:1::/128 (flannel-v6.1)
//!     └─ <tag>ka  bridge, 10.244.1.1/24, fd00:10:244:1::1/64, MTU 1450 (cni0)
//!         ├─ <tag>a1 (port, no address) ── eth0 10.244.1.2/24 (podA1)
//!         └─ <tag>a2 (port, no address) ── eth0 10.244.1.3/24 (podA2)
//!   ```
//!
//!   Pods hold `10.244.<s>.<n+1>/24` and `fd00:10:244:<s>::<n+1>/64`, MTU
//!   1450, default routes via the bridge's addresses; pods of one node talk
//!   over the bridge without the node routing. Each node routes the other's
//!   pod range `10.244.<o>.0/24 via 10.244.<o>.0 dev <tag>f<x> onlink` with
//!   a permanent neighbour entry for `10.244.<o>.0` (the other VXLAN
//!   device's fixed MAC, [`Node::vxlan_mac`]) and a forwarding entry sending
//!   that MAC to the other node's LAN address; IPv6 likewise over the IPv6
//!   VXLAN device (`fd00:10:244:<o>::/64 via fd00:10:244:<o>::`), whose MTU
//!   is 1430 (IPv6 packets over 1430 bytes from a pod to the other node get
//!   a packet too big, as on a dual-stack flannel cluster). Nothing routes
//!   pods via the other node's LAN address. Clients still route the pod
//!   range via node A (which forwards over the overlay).
//! - Each node has its own bpffs pin root `/run/switchboard-test/<tag>/<na|nb>/bpf`
//!   and its own cgroup (`<cgroup2>/switchboard-test-<tag>-<na|nb>`, bound at
//!   `/run/switchboard-test/<tag>/<na|nb>/cgroup`), and runs its own agent
//!   ([`TwoNodeSandbox::start_agent`]) over one shared manifest directory,
//!   which holds a Node manifest per node ([`manifests`]).
//!
//! Cleanup (explicit or on drop, also after a failed setup) kills the
//! processes, deletes the namespaces (the lan namespace takes the bridge and
//! every veth with it, a node namespace its pod bridge and VXLAN devices), removes the cgroups, unmounts the pin roots and
//! removes the directories. `purge_tag` and `cleanup_stale` know the
//! namespaces, mounts, cgroups and agent status files of this layout too.

pub mod flannel;
mod links;
pub mod manifests;

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::cgroup::TestCgroup;
use super::core::{AgentRef, NetnsCore, PodSpec};
use super::netns::{attach_xdp_pass, disable_tx_checksum, enable_gro, HttpResponse};
use super::roles::NODE_ROLES;
use super::sys::ip;
use super::{next_test_tag, ClientRun, Frontend, POD_TCP_PORT, POD_UDP_PORT};
use manifests::{node_file, node_yaml, EntryPoint, ExternalService, Policy};

/// Node A's LAN address (its `InternalIP`).
pub const NODE_A_IP: &str = "192.168.50.1";
/// Node B's LAN address (its `InternalIP`).
pub const NODE_B_IP: &str = "192.168.50.2";
/// Prefix length of the LAN.
pub const LAN_PREFIX_LEN: u8 = 24;
/// Addresses of the external clients on the LAN.
pub const CLIENT_IPS: [&str; 2] = ["192.168.50.100", "192.168.50.101"];
/// The LoadBalancer ingress IP of `ext/web-lb`.
pub const LB_IP: &str = "203.0.113.10";
/// The external IP of `ext/web-ext`.
pub const EXTERNAL_IP: &str = "198.51.100.10";
/// Every pod address (both nodes' pod ranges).
pub const POD_RANGE: &str = "10.244.0.0/16";
/// Node A's IPv6 LAN address (its IPv6 `InternalIP` in
/// [`manifests::node_yaml_dual_stack`]).
pub const NODE_A_IP6: &str = "fd00:50::1";
/// Node B's IPv6 LAN address.
pub const NODE_B_IP6: &str = "fd00:50::2";
/// Prefix length of the LAN's IPv6 range (`fd00:50::/64`).
pub const LAN_PREFIX_LEN6: u8 = 64;
/// IPv6 addresses of the external clients on the LAN.
pub const CLIENT_IP6S: [&str; 2] = ["fd00:50::100", "fd00:50::101"];
/// Every pod's IPv6 address (both nodes' IPv6 pod ranges).
pub const POD_RANGE6: &str = "fd00:10:244::/48";
/// Pods per node.
pub const PODS_PER_NODE: u8 = 2;

/// What the LAN and its senders look like (see the module documentation).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Lan {
    /// As on kind: veth uplinks on a bridge, senders with checksum offload
    /// on, nothing set up for XDP on the uplinks' peers. What the agent's
    /// defaults must serve.
    #[default]
    KindLike,
    /// Set up for native XDP on the veth uplinks: GRO and an `XDP_PASS`
    /// program on the uplinks' peers, GRO on the pods' `eth0`, every sender
    /// writing complete checksums.
    XdpReady,
    /// As on k3s with flannel's VXLAN backend: the kind-like LAN and
    /// senders, but each node's pods on a bridge holding their gateway
    /// (MTU 1450), and the other node's pods behind VXLAN devices (see
    /// [`flannel`]).
    K3sLike,
}

/// One of the two nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Node {
    A,
    B,
}

impl Node {
    pub const ALL: [Node; 2] = [Node::A, Node::B];

    /// The Node name the agent gets as `--node-name` (`node-a`, `node-b`).
    pub fn name(self) -> &'static str {
        match self {
            Node::A => "node-a",
            Node::B => "node-b",
        }
    }
    /// `a` or `b`.
    pub fn letter(self) -> char {
        match self {
            Node::A => 'a',
            Node::B => 'b',
        }
    }
    /// LAN address.
    pub fn ip(self) -> &'static str {
        match self {
            Node::A => NODE_A_IP,
            Node::B => NODE_B_IP,
        }
    }
    /// IPv6 LAN address.
    pub fn ip6(self) -> &'static str {
        match self {
            Node::A => NODE_A_IP6,
            Node::B => NODE_B_IP6,
        }
    }
    /// Third octet of the node's pod range.
    fn subnet(self) -> u8 {
        match self {
            Node::A => 1,
            Node::B => 2,
        }
    }
    /// The node's pod range, `10.244.<1|2>.0/24`.
    pub fn pod_cidr(self) -> String {
        format!("10.244.{}.0/24", self.subnet())
    }
    /// The pods' gateway, `10.244.<1|2>.1` (on each of the node's pod veths).
    pub fn gateway(self) -> String {
        format!("10.244.{}.1", self.subnet())
    }
    /// The node's IPv6 pod range, `fd00:10:244:<1|2>::/64`.
    pub fn pod_cidr6(self) -> String {
        format!("fd00:10:244:{}::/64", self.subnet())
    }
    /// The pods' IPv6 gateway, `fd00:10:244:<1|2>::1`.
    pub fn gateway6(self) -> String {
        format!("fd00:10:244:{}::1", self.subnet())
    }
    pub fn other(self) -> Node {
        match self {
            Node::A => Node::B,
            Node::B => Node::A,
        }
    }
    /// The node's pods.
    pub fn pods(self) -> Vec<Pod> {
        (1..=PODS_PER_NODE).map(|n| Pod::new(self, n)).collect()
    }
    /// Namespace role (`na`, `nb`).
    fn role(self) -> &'static str {
        match self {
            Node::A => NODE_ROLES[0],
            Node::B => NODE_ROLES[1],
        }
    }
    fn index(self) -> usize {
        match self {
            Node::A => 0,
            Node::B => 1,
        }
    }
}

/// Pod `n` (1-based) of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pod {
    pub node: Node,
    pub n: u8,
}

impl Pod {
    pub fn new(node: Node, n: u8) -> Pod {
        assert!((1..=PODS_PER_NODE).contains(&n), "pod {n} out of range");
        Pod { node, n }
    }
    /// Every pod of both nodes.
    pub fn all() -> Vec<Pod> {
        Node::ALL.iter().flat_map(|n| n.pods()).collect()
    }
    /// The name it answers with: `podA1`, `podA2`, `podB1`, `podB2`.
    pub fn name(self) -> String {
        format!("pod{}{}", self.node.letter().to_ascii_uppercase(), self.n)
    }
    /// `10.244.<1|2>.<n+1>`.
    pub fn ip(self) -> String {
        format!("10.244.{}.{}", self.node.subnet(), self.n + 1)
    }
    /// `fd00:10:244:<1|2>::<n+1>`.
    pub fn ip6(self) -> String {
        format!("fd00:10:244:{}::{}", self.node.subnet(), self.n + 1)
    }
    /// `a1`, `b2`, ...: the suffix of its namespace and node-side veth.
    fn id(self) -> String {
        format!("{}{}", self.node.letter(), self.n)
    }
}

/// One of the external clients on the LAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Client {
    /// 192.168.50.100
    One,
    /// 192.168.50.101
    Two,
}

impl Client {
    pub const ALL: [Client; 2] = [Client::One, Client::Two];

    pub fn ip(self) -> &'static str {
        CLIENT_IPS[self.index()]
    }
    /// `fd00:50::100`, `fd00:50::101`.
    pub fn ip6(self) -> &'static str {
        CLIENT_IP6S[self.index()]
    }
    fn index(self) -> usize {
        match self {
            Client::One => 0,
            Client::Two => 1,
        }
    }
    /// `c1`, `c2`: namespace role and bridge port suffix.
    fn id(self) -> String {
        format!("c{}", self.index() + 1)
    }
}

/// The two-node sandbox. See the module documentation for the layout.
/// The two-node sandbox, on the [`NetnsCore`] (which it dereferences to:
/// `tag`, `dir`, `exec`, `command`, `spawn`, `client_in`, logs, `cleanup`,
/// ...).
pub struct TwoNodeSandbox {
    /// Declared first: dropped (cleaned up) before the XDP links below.
    core: NetnsCore,
    /// What the LAN looks like.
    pub lan: Lan,
    /// The XDP_PASS links on the LAN-side uplink ends (see
    /// `netns::attach_xdp_pass`); dropped with the sandbox.
    xdp_links: Vec<std::os::fd::OwnedFd>,
}

super::core::built_on_core!(TwoNodeSandbox);

impl TwoNodeSandbox {
    /// A kind-like sandbox with a test tag unique to this process and call
    /// (`sbt<pid>-<n>`); also removes sandboxes left by dead test processes.
    pub fn for_test() -> Result<TwoNodeSandbox> {
        TwoNodeSandbox::for_test_on(Lan::KindLike)
    }

    /// [`Self::for_test`] on the LAN `lan`.
    pub fn for_test_on(lan: Lan) -> Result<TwoNodeSandbox> {
        TwoNodeSandbox::new_on(&next_test_tag(), lan)
    }

    /// Creates the kind-like sandbox `tag` (at most 13 characters: interface
    /// names are `<tag>` plus two), first removing leftovers with the same tag.
    pub fn new(tag: &str) -> Result<TwoNodeSandbox> {
        TwoNodeSandbox::new_on(tag, Lan::KindLike)
    }

    /// [`Self::new`] on the LAN `lan`.
    pub fn new_on(tag: &str, lan: Lan) -> Result<TwoNodeSandbox> {
        let mut sb = TwoNodeSandbox {
            core: NetnsCore::new(tag)?,
            lan,
            xdp_links: Vec::new(),
        };
        // On error, Drop removes whatever was created so far.
        sb.setup()
            .with_context(|| format!("setting up the two-node sandbox {tag}"))?;
        Ok(sb)
    }

    // --- names -----------------------------------------------------------

    /// The LAN namespace (holds the bridge).
    pub fn lan_ns(&self) -> String {
        format!("{}-lan", self.tag)
    }
    /// `<tag>-na`, `<tag>-nb`.
    pub fn node_ns(&self, node: Node) -> String {
        format!("{}-{}", self.tag, node.role())
    }
    /// `<tag>-pa1` ... `<tag>-pb2`.
    pub fn pod_ns(&self, pod: Pod) -> String {
        format!("{}-p{}", self.tag, pod.id())
    }
    /// `<tag>-c1`, `<tag>-c2`.
    pub fn client_ns(&self, client: Client) -> String {
        format!("{}-{}", self.tag, client.id())
    }
    /// Makes `client` send every TCP segment in an skb of its own (no GSO,
    /// `gso_max_segs 1`), as a sender without segmentation offload does:
    /// each full-sized segment then meets whatever answers it on its own.
    pub fn one_segment_per_skb(&self, client: Client) -> Result<()> {
        let ns = self.client_ns(client);
        let cmd = ["ip", "link", "set", "dev", "eth0", "gso_max_segs", "1"];
        self.exec(&ns, &cmd).map(|_| ())
    }
    /// Makes `client` forget the path MTUs it learned, both families.
    pub fn forget_path_mtus(&self, client: Client) -> Result<()> {
        let ns = self.client_ns(client);
        self.exec(&ns, &["ip", "route", "flush", "cache"])?;
        self.exec(&ns, &["ip", "-6", "route", "flush", "cache"])
            .map(|_| ())
    }
    /// The bridge in the LAN namespace, `<tag>br`.
    pub fn bridge(&self) -> String {
        format!("{}br", self.tag)
    }
    /// The node's uplink (in the node namespace), `<tag>ua` / `<tag>ub`: what
    /// the agent gets as `--uplink`.
    pub fn uplink(&self, node: Node) -> String {
        format!("{}u{}", self.tag, node.letter())
    }
    /// The uplink's peer, a bridge port in the LAN namespace, `<tag>la` / `<tag>lb`.
    pub fn uplink_peer(&self, node: Node) -> String {
        format!("{}l{}", self.tag, node.letter())
    }
    /// The pod's veth in its node's namespace, `<tag>a1` ... `<tag>b2`.
    pub fn pod_if(&self, pod: Pod) -> String {
        format!("{}{}", self.tag, pod.id())
    }
    /// The client's bridge port in the LAN namespace, `<tag>c1` / `<tag>c2`.
    pub fn client_port(&self, client: Client) -> String {
        format!("{}{}", self.tag, client.id())
    }
    /// `/run/switchboard-test/<tag>/<na|nb>`.
    fn node_run_dir(&self, node: Node) -> PathBuf {
        self.run_dir().join(node.role())
    }
    /// The node's bpffs pin root (its agent's `--pin-root`).
    pub fn pin_dir(&self, node: Node) -> PathBuf {
        self.node_run_dir(node).join("bpf")
    }
    /// The node's cgroup, bind-mounted where the agent sees it (its
    /// `--cgroup-root`).
    pub fn cgroup(&self, node: Node) -> Option<&TestCgroup> {
        self.core.node_cgroup(node.index())
    }
    /// The process label of `node`'s agent (its log is `read_log(label)`).
    pub fn agent_label(node: Node) -> String {
        format!("agent-{}", node.letter())
    }
    /// The node's agent, for the core.
    fn agent(&self, node: Node) -> AgentRef {
        AgentRef {
            label: Self::agent_label(node),
            ns: self.node_ns(node),
            node: node.index(),
        }
    }

    // --- setup -----------------------------------------------------------

    fn setup(&mut self) -> Result<()> {
        self.create_namespaces()?;
        self.create_lan()?;
        for node in Node::ALL {
            self.create_uplink(node)?;
            self.create_pods_and_routes(node)?;
            self.node_sysctls_everywhere(node)?;
        }
        for client in Client::ALL {
            self.create_client(client)?;
        }
        match self.lan {
            Lan::KindLike | Lan::K3sLike => self.finish_checksums_before_receivers()?,
            Lan::XdpReady => self.enable_napi()?,
        }
        for node in Node::ALL {
            self.create_node_state(node)?;
        }
        Ok(())
    }

    /// The node's pods and the routes to the other node's: routed veths and
    /// routes via the other node's LAN address, or on [`Lan::K3sLike`] a
    /// bridge and an overlay.
    fn create_pods_and_routes(&self, node: Node) -> Result<()> {
        if self.bridged_pods() {
            return self.create_bridged_pods(node);
        }
        for pod in node.pods() {
            self.create_pod_link(pod)?;
        }
        self.route_other_pods(node)
    }

    /// Routes the other node's pod ranges via its LAN addresses, over the
    /// node's uplink (replacing routes it had); on [`Lan::K3sLike`] over the
    /// overlay instead.
    fn route_other_pods(&self, node: Node) -> Result<()> {
        if self.bridged_pods() {
            return self.route_over_overlay(node);
        }
        let other = node.other();
        ip(&[
            "-n",
            &self.node_ns(node),
            "route",
            "replace",
            &other.pod_cidr(),
            "via",
            other.ip(),
            "dev",
            &self.uplink(node),
        ])?;
        ip(&[
            "-n",
            &self.node_ns(node),
            "-6",
            "route",
            "replace",
            &other.pod_cidr6(),
            "via",
            other.ip6(),
            "dev",
            &self.uplink(node),
        ])
    }

    fn all_namespaces(&self) -> Vec<String> {
        let mut all = vec![self.lan_ns()];
        all.extend(Node::ALL.iter().map(|&n| self.node_ns(n)));
        all.extend(Pod::all().into_iter().map(|p| self.pod_ns(p)));
        all.extend(Client::ALL.iter().map(|&c| self.client_ns(c)));
        all
    }

    fn create_namespaces(&mut self) -> Result<()> {
        for ns in self.all_namespaces() {
            self.core.add_netns(&ns)?;
            // Before any interface exists: no duplicate address detection,
            // so every IPv6 address (link-local ones too) is usable at once.
            self.sh(
                &ns,
                "for k in all default; do echo 0 > /proc/sys/net/ipv6/conf/$k/accept_dad; done",
            )?;
        }
        for node in Node::ALL {
            // Before any interface exists, so new ones inherit `default`.
            self.sh(
                &self.node_ns(node),
                "echo 1 > /proc/sys/net/ipv4/ip_forward; \
                 echo 1 > /proc/sys/net/ipv6/conf/all/forwarding; \
                 for k in all default; do \
                   echo 0 > /proc/sys/net/ipv4/conf/$k/rp_filter; \
                   echo 0 > /proc/sys/net/ipv4/conf/$k/send_redirects; \
                 done",
            )?;
        }
        for client in Client::ALL {
            self.sh(
                &self.client_ns(client),
                "for k in all default; do \
                   echo 0 > /proc/sys/net/ipv4/conf/$k/accept_redirects; \
                   echo 0 > /proc/sys/net/ipv6/conf/$k/accept_redirects; \
                 done",
            )?;
        }
        Ok(())
    }

    /// `rp_filter=0`, `send_redirects=0` on every interface of the node
    /// (also those that existed before `default` was set).
    fn node_sysctls_everywhere(&self, node: Node) -> Result<()> {
        self.sh(
            &self.node_ns(node),
            "for d in /proc/sys/net/ipv4/conf/*; do \
               echo 0 > $d/rp_filter; echo 0 > $d/send_redirects; \
             done",
        )
    }

    fn create_lan(&self) -> Result<()> {
        let (lan, br) = (self.lan_ns(), self.bridge());
        ip(&[
            "-n",
            &lan,
            "link",
            "add",
            &br,
            "type",
            "bridge",
            "stp_state",
            "0",
            // Neighbour discovery is multicast: flood it like ARP.
            "mcast_snooping",
            "0",
        ])?;
        ip(&["-n", &lan, "link", "set", &br, "up"])
    }

    /// Adds `port` (in the LAN namespace) to the bridge and brings it up.
    fn bridge_port_up(&self, port: &str) -> Result<()> {
        let lan = self.lan_ns();
        ip(&["-n", &lan, "link", "set", port, "master", &self.bridge()])?;
        ip(&["-n", &lan, "link", "set", port, "up"])
    }

    fn create_uplink(&self, node: Node) -> Result<()> {
        let (ns, uplink, peer) = (
            self.node_ns(node),
            self.uplink(node),
            self.uplink_peer(node),
        );
        // Created inside the node namespace with the peer directly in the
        // LAN namespace: nothing ever appears in the root namespace.
        ip(&[
            "-n",
            &ns,
            "link",
            "add",
            &uplink,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
            "netns",
            &self.lan_ns(),
        ])?;
        let addr = format!("{}/{LAN_PREFIX_LEN}", node.ip());
        ip(&["-n", &ns, "addr", "add", &addr, "dev", &uplink])?;
        let addr6 = format!("{}/{LAN_PREFIX_LEN6}", node.ip6());
        ip(&[
            "-n", &ns, "-6", "addr", "add", &addr6, "dev", &uplink, "nodad",
        ])?;
        ip(&["-n", &ns, "link", "set", &uplink, "up"])?;
        self.bridge_port_up(&peer)
    }

    fn create_pod_link(&self, pod: Pod) -> Result<()> {
        let (node_ns, pod_ns, host_if) =
            (self.node_ns(pod.node), self.pod_ns(pod), self.pod_if(pod));
        let gateway = pod.node.gateway();
        let pod_ip = pod.ip();
        ip(&[
            "-n", &node_ns, "link", "add", &host_if, "type", "veth", "peer", "name", "eth0",
            "netns", &pod_ns,
        ])?;
        ip(&[
            "-n",
            &node_ns,
            "addr",
            "add",
            &format!("{gateway}/32"),
            "dev",
            &host_if,
        ])?;
        ip(&["-n", &node_ns, "link", "set", &host_if, "up"])?;
        ip(&[
            "-n",
            &node_ns,
            "route",
            "add",
            &format!("{pod_ip}/32"),
            "dev",
            &host_if,
            "scope",
            "link",
            "src",
            &gateway,
        ])?;
        ip(&[
            "-n",
            &pod_ns,
            "addr",
            "add",
            &format!("{pod_ip}/32"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &pod_ns, "link", "set", "eth0", "up"])?;
        ip(&[
            "-n", &pod_ns, "route", "add", &gateway, "dev", "eth0", "scope", "link",
        ])?;
        ip(&[
            "-n", &pod_ns, "route", "add", "default", "via", &gateway, "dev", "eth0",
        ])?;
        self.add_pod_ipv6(pod)
    }

    /// The IPv6 twin of the pod link: the pod's address as a /128 on its
    /// `eth0`, the node's IPv6 gateway as a /128 on the node-side veth, a
    /// /128 route to the pod there, and the pod's default route via the
    /// gateway (on-link).
    fn add_pod_ipv6(&self, pod: Pod) -> Result<()> {
        let (node_ns, pod_ns, host_if) =
            (self.node_ns(pod.node), self.pod_ns(pod), self.pod_if(pod));
        let gateway = pod.node.gateway6();
        let pod_ip = pod.ip6();
        ip(&[
            "-n",
            &node_ns,
            "-6",
            "addr",
            "add",
            &format!("{gateway}/128"),
            "dev",
            &host_if,
            "nodad",
        ])?;
        ip(&[
            "-n",
            &node_ns,
            "-6",
            "route",
            "add",
            &format!("{pod_ip}/128"),
            "dev",
            &host_if,
            "src",
            &gateway,
        ])?;
        ip(&[
            "-n",
            &pod_ns,
            "-6",
            "addr",
            "add",
            &format!("{pod_ip}/128"),
            "dev",
            "eth0",
            "nodad",
        ])?;
        ip(&["-n", &pod_ns, "-6", "route", "add", &gateway, "dev", "eth0"])?;
        ip(&[
            "-n", &pod_ns, "-6", "route", "add", "default", "via", &gateway, "dev", "eth0",
        ])
    }

    fn create_client(&self, client: Client) -> Result<()> {
        let (ns, port) = (self.client_ns(client), self.client_port(client));
        ip(&[
            "-n",
            &ns,
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &self.lan_ns(),
        ])?;
        let addr = format!("{}/{LAN_PREFIX_LEN}", client.ip());
        ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
        let addr6 = format!("{}/{LAN_PREFIX_LEN6}", client.ip6());
        ip(&[
            "-n", &ns, "-6", "addr", "add", &addr6, "dev", "eth0", "nodad",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        self.bridge_port_up(&port)?;
        self.route_pods_via(client, Node::A)?;
        self.route_services_via(client, Node::A)
    }

    /// [`Lan::KindLike`]: checksums are finished in software where frames
    /// leave the LAN for a client and where a node hands them to a pod (tx
    /// checksum offload off on the clients' bridge ports and the node-side
    /// pod veths), as a NIC would before the wire. Senders keep offload on;
    /// a receiver then checks every checksum instead of trusting a partial
    /// one, so a translation that rewrote one wrongly shows as a loss.
    fn finish_checksums_before_receivers(&self) -> Result<()> {
        for client in Client::ALL {
            disable_tx_checksum(&self.lan_ns(), &self.client_port(client))?;
        }
        for pod in Pod::all() {
            disable_tx_checksum(&self.node_ns(pod.node), &self.pod_if(pod))?;
        }
        Ok(())
    }

    /// [`Lan::XdpReady`]: GRO (hence NAPI) where XDP sends packets into a
    /// veth: the bridge-side ends of the uplinks (XDP_TX on an uplink) and the
    /// pods' `eth0` (XDP redirect from an uplink into a pod veth); complete
    /// checksums from every sender.
    fn enable_napi(&mut self) -> Result<()> {
        for node in Node::ALL {
            enable_gro(&self.lan_ns(), &self.uplink_peer(node))?;
            let link = attach_xdp_pass(&self.lan_ns(), &self.uplink_peer(node))?;
            self.xdp_links.push(link);
        }
        for pod in Pod::all() {
            enable_gro(&self.pod_ns(pod), "eth0")?;
        }
        // The LAN stands for a wire: whatever crosses it carries complete
        // checksums (see `disable_tx_checksum`). Pods' packets cross it too,
        // forwarded by their node.
        for pod in Pod::all() {
            disable_tx_checksum(&self.pod_ns(pod), "eth0")?;
        }
        for client in Client::ALL {
            disable_tx_checksum(&self.client_ns(client), "eth0")?;
        }
        for node in Node::ALL {
            disable_tx_checksum(&self.node_ns(node), &self.uplink(node))?;
        }
        Ok(())
    }

    /// The node's pin root (a bpffs) and cgroup.
    fn create_node_state(&mut self, node: Node) -> Result<()> {
        let run_dir = self.node_run_dir(node);
        let name = format!("{}-{}", self.tag, node.role());
        let index = self.core.add_node(&run_dir, &name)?;
        if index != node.index() {
            bail!("{} set up as node {index}", node.name());
        }
        Ok(())
    }

    // --- routes ------------------------------------------------------------

    /// Makes `client` send to the LoadBalancer IP and the external IP via
    /// `node` (replacing the routes it had).
    pub fn route_services_via(&self, client: Client, node: Node) -> Result<()> {
        let ns = self.client_ns(client);
        for service_ip in [LB_IP, EXTERNAL_IP] {
            ip(&[
                "-n",
                &ns,
                "route",
                "replace",
                &format!("{service_ip}/32"),
                "via",
                node.ip(),
                "dev",
                "eth0",
            ])?;
        }
        Ok(())
    }

    /// Makes `client` reach the pod ranges (10.244.0.0/16 and
    /// fd00:10:244::/48) via `node`.
    pub fn route_pods_via(&self, client: Client, node: Node) -> Result<()> {
        ip(&[
            "-n",
            &self.client_ns(client),
            "route",
            "replace",
            POD_RANGE,
            "via",
            node.ip(),
            "dev",
            "eth0",
        ])?;
        ip(&[
            "-n",
            &self.client_ns(client),
            "-6",
            "route",
            "replace",
            POD_RANGE6,
            "via",
            node.ip6(),
            "dev",
            "eth0",
        ])
    }

    // --- clients ----------------------------------------------------------

    /// `sb-echo client <args>` from an external client.
    pub fn client(&self, sb_echo: &Path, from: Client, args: &[&str]) -> Result<ClientRun> {
        self.client_in(sb_echo, &self.client_ns(from), args)
    }

    /// `count` attempts from `from` to `entry` (`sb-echo client`, each
    /// attempt with `timeout_ms`).
    pub fn hit(
        &self,
        sb_echo: &Path,
        from: Client,
        entry: &EntryPoint,
        count: u32,
        timeout_ms: u64,
    ) -> Result<ClientRun> {
        self.client(
            sb_echo,
            from,
            &[
                entry.proto.client_flag(),
                &entry.addr(),
                "--count",
                &count.to_string(),
                "--timeout-ms",
                &timeout_ms.to_string(),
            ],
        )
    }

    /// HTTP GET `http://<addr><path>` from an external client.
    pub fn http_get(
        &self,
        from: Client,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<HttpResponse> {
        super::netns::http_get(&self.client_ns(from), addr, path, timeout)
    }

    // --- pods ----------------------------------------------------------------

    /// Starts `sb-echo` in every pod (named `podA1` ... `podB2`, TCP 8080,
    /// UDP 5353) and waits until each answers client 1 at its own address
    /// over TCP and UDP (straight through the nodes, no agent involved).
    pub fn start_pods(&mut self, sb_echo: &Path) -> Result<()> {
        let pods: Vec<PodSpec> = Pod::all()
            .into_iter()
            .map(|pod| PodSpec {
                ns: self.pod_ns(pod),
                name: pod.name(),
                targets: vec![
                    ("--tcp", format!("{}:{POD_TCP_PORT}", pod.ip())),
                    ("--udp", format!("{}:{POD_UDP_PORT}", pod.ip())),
                    ("--tcp", format!("[{}]:{POD_TCP_PORT}", pod.ip6())),
                    ("--udp", format!("[{}]:{POD_UDP_PORT}", pod.ip6())),
                ],
            })
            .collect();
        let client = self.client_ns(Client::One);
        self.core.start_pods(sb_echo, &pods, &client)
    }

    // --- manifests -------------------------------------------------------------

    /// Writes `contents` as `name` into the manifest directory atomically
    /// (written elsewhere, then renamed in).
    pub fn write_manifest(&self, name: &str, contents: &str) -> Result<()> {
        let tmp = self.dir.join(format!(".{name}.tmp"));
        fs::write(&tmp, contents).with_context(|| format!("write {}", tmp.display()))?;
        let dest = self.manifest_dir().join(name);
        fs::rename(&tmp, &dest).with_context(|| format!("rename into {}", dest.display()))
    }

    /// Writes the Node manifests of both nodes.
    pub fn write_nodes(&self) -> Result<()> {
        for node in Node::ALL {
            self.write_manifest(&node_file(node), &node_yaml(node))?;
        }
        Ok(())
    }

    /// Writes `service` under `policy` with `endpoints` as its EndpointSlice.
    pub fn write_service(
        &self,
        service: ExternalService,
        policy: Policy,
        endpoints: &[Pod],
    ) -> Result<()> {
        self.write_manifest(&service.service_file(), &service.yaml(policy))?;
        self.write_manifest(
            &service.slice_file(),
            &service.endpointslice_yaml(endpoints),
        )
    }

    /// Writes every [`ExternalService`] under `policy`, all with `endpoints`.
    pub fn write_services(&self, policy: Policy, endpoints: &[Pod]) -> Result<()> {
        for service in ExternalService::ALL {
            self.write_service(service, policy, endpoints)?;
        }
        Ok(())
    }

    // --- agents ------------------------------------------------------------------

    /// Starts `switchboard agent --source dir:<manifests> --pin-root <node's
    /// pin root> --cgroup-root <node's cgroup> --node-name node-a|node-b
    /// --uplink <node's uplink> <extra...>` in the node namespace with
    /// RUST_LOG=info (or the caller's RUST_LOG), logging to `agent-a.log` /
    /// `agent-b.log`.
    pub fn start_agent(&mut self, node: Node, switchboard: &Path, extra: &[&str]) -> Result<u32> {
        let source = format!("dir:{}", self.manifest_dir().display());
        let uplink = self.uplink(node);
        let mut args = vec!["--node-name", node.name(), "--uplink", &uplink];
        args.extend_from_slice(extra);
        let agent = self.agent(node);
        self.core.start_agent(&agent, switchboard, &source, &args)
    }

    /// Stops the node's agent with SIGTERM (SIGKILL after 5 s).
    pub fn stop_agent(&mut self, node: Node) -> Result<ExitStatus> {
        self.core.stop(&Self::agent_label(node))
    }

    /// The pid of the node's running agent.
    pub fn agent_pid(&self, node: Node) -> Option<u32> {
        self.core.pid(&Self::agent_label(node))
    }

    /// Whether the node's agent is running.
    pub fn agent_running(&mut self, node: Node) -> bool {
        self.core.running(&Self::agent_label(node))
    }

    /// The node's agent log so far.
    pub fn agent_log(&self, node: Node) -> String {
        self.read_log(&Self::agent_label(node))
    }

    /// `switchboard services -o json --pin-root <node's pin root>` in the
    /// node namespace, parsed.
    pub fn services(&self, node: Node, switchboard: &Path) -> Result<Vec<Frontend>> {
        self.core.services(&self.agent(node), switchboard)
    }

    /// Polls the node's `switchboard services -o json` until `pred` holds;
    /// on timeout (or when the agent has exited) the error carries the last
    /// output and the agent log.
    pub fn wait_services(
        &mut self,
        node: Node,
        switchboard: &Path,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&[Frontend]) -> bool,
    ) -> Result<Vec<Frontend>> {
        let agent = self.agent(node);
        self.core
            .wait_services(&agent, switchboard, timeout, what, pred)
    }

    /// What `bpftool net show dev <uplink>` lists as attached to the node's
    /// uplink (XDP and tc/TCX lines), empty before the agent attaches.
    pub fn uplink_attachments(&self, node: Node) -> Result<Vec<String>> {
        let uplink = self.uplink(node);
        let out = self
            .exec(
                &self.node_ns(node),
                &["bpftool", "net", "show", "dev", &uplink],
            )
            .context("bpftool net show (is bpftool installed? `cargo xtask setup` installs it)")?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with(&format!("{uplink}(")))
            .map(str::to_string)
            .collect())
    }

    /// Whether the node's uplink carries the agent's programs: `bpftool net`
    /// lists one (XDP, netlink tc), or the agent logged `uplink programs
    /// attached ... iface=<uplink>` (bpftool before 7.3 does not list TCX
    /// links, which is how `--xdp-mode off` attaches).
    pub fn uplink_attached(&self, node: Node) -> bool {
        let iface = format!("iface={}", self.uplink(node));
        let logged = self
            .agent_log(node)
            .lines()
            .any(|l| l.contains("uplink programs attached") && l.contains(&iface));
        logged || self.uplink_attachments(node).is_ok_and(|l| !l.is_empty())
    }

    /// Waits until [`Self::uplink_attached`] (the agent attaches the uplink
    /// programs after its first map sync); on timeout the error carries the
    /// agent log.
    pub fn wait_uplink_attached(&mut self, node: Node, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.uplink_attached(node) {
                return Ok(());
            }
            let running = self.agent_running(node);
            if Instant::now() > deadline || !running {
                let state = if running {
                    "agent running"
                } else {
                    "agent NOT running"
                };
                bail!(
                    "{}: no program on uplink {} after {timeout:?} ({state}); bpftool: {:?}\n\
                     --- agent log of {} ---\n{}--- end agent log ---",
                    node.name(),
                    self.uplink(node),
                    self.uplink_attachments(node),
                    node.name(),
                    self.agent_log(node)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::cleanup::{status_file_tag, test_tag_of};
    use super::super::roles::is_role;
    use super::super::status_file;
    use super::super::PIN_BASE;
    use super::*;

    #[test]
    fn names_and_addresses() {
        let names: Vec<String> = Pod::all().iter().map(|p| p.name()).collect();
        assert_eq!(names, ["podA1", "podA2", "podB1", "podB2"]);
        let ips: Vec<String> = Pod::all().iter().map(|p| p.ip()).collect();
        assert_eq!(
            ips,
            ["10.244.1.2", "10.244.1.3", "10.244.2.2", "10.244.2.3"]
        );
        assert_eq!(Node::B.gateway(), "10.244.2.1");
        assert_eq!(Client::Two.ip(), "192.168.50.101");
    }

    #[test]
    fn namespaces_are_found_by_the_stale_cleanup() {
        for role in ["lan", "na", "nb", "pa1", "pb2", "c1", "c2"] {
            assert!(is_role(role), "{role}");
            let ns = format!("sbt4194304-99-{role}");
            assert_eq!(test_tag_of(&ns).as_deref(), Some("sbt4194304-99"), "{ns}");
        }
        assert!(!is_role("pc1") && !is_role("c") && !is_role("nc"));
    }

    #[test]
    fn node_status_files_are_found_by_the_stale_cleanup() {
        for node in Node::ALL {
            let pin = Path::new(PIN_BASE)
                .join("sbt12-0")
                .join(node.role())
                .join("bpf");
            let file = status_file(&pin);
            let name = file.file_name().unwrap().to_str().unwrap();
            assert_eq!(status_file_tag(name), Some("sbt12-0"), "{name}");
        }
        assert_eq!(
            status_file_tag("_run_switchboard-test_sbt12-0_xx_bpf.json"),
            None
        );
    }
}
