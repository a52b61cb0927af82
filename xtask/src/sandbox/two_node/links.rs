//! Link changes inside a two-node sandbox, for the tests of an agent that
//! follows them: a node's uplink deleted and created again (a new interface
//! index), its IPv4 address taken away and given back, and an agent that
//! finds its uplink itself (no `--uplink`). Everything happens inside the
//! sandbox's own namespaces.
use std::path::Path;

use anyhow::{Context, Result};

use super::{Lan, Node, TwoNodeSandbox, LAN_PREFIX_LEN};
use crate::sandbox::netns::{attach_xdp_pass, disable_tx_checksum, enable_gro};
use crate::sandbox::sys::ip;

impl TwoNodeSandbox {
    /// Deletes the node's uplink (its peer, a bridge port, goes with it).
    pub fn delete_uplink(&self, node: Node) -> Result<()> {
        ip(&["-n", &self.node_ns(node), "link", "del", &self.uplink(node)])
            .with_context(|| format!("deleting the uplink of {}", node.name()))
    }

    /// Creates the node's uplink again as the setup did (addresses, bridge
    /// port, on [`Lan::K3sLike`] the VXLAN devices, routes to the other
    /// node's pods, and on [`Lan::XdpReady`] GRO
    /// and an `XDP_PASS` program on its peer): a new interface index.
    pub fn recreate_uplink(&mut self, node: Node) -> Result<()> {
        self.create_uplink(node)?;
        if self.bridged_pods() {
            // The VXLAN devices went with their uplink.
            self.create_overlay(node)?;
        }
        self.route_other_pods(node)?;
        self.node_sysctls_everywhere(node)?;
        if self.lan == Lan::XdpReady {
            enable_gro(&self.lan_ns(), &self.uplink_peer(node))?;
            let link = attach_xdp_pass(&self.lan_ns(), &self.uplink_peer(node))?;
            self.xdp_links.push(link);
            disable_tx_checksum(&self.node_ns(node), &self.uplink(node))?;
        }
        Ok(())
    }

    /// Takes `address` (IPv4, on the LAN's /24) off the node's uplink.
    pub fn del_uplink_addr(&self, node: Node, address: &str) -> Result<()> {
        self.uplink_addr(node, "del", address)
    }

    /// Puts `address` (IPv4, on the LAN's /24) on the node's uplink, and the
    /// routes to the other node's pods back (the kernel may have dropped
    /// them with the last address of their gateway's subnet).
    pub fn add_uplink_addr(&self, node: Node, address: &str) -> Result<()> {
        self.uplink_addr(node, "add", address)?;
        self.route_other_pods(node)
    }

    /// `ip addr add|del` of `address` on the node's uplink.
    fn uplink_addr(&self, node: Node, verb: &str, address: &str) -> Result<()> {
        let addr = format!("{address}/{LAN_PREFIX_LEN}");
        let (ns, dev) = (self.node_ns(node), self.uplink(node));
        ip(&["-n", &ns, "addr", verb, &addr, "dev", &dev])
    }

    /// The node's uplink's interface index.
    pub fn uplink_index(&self, node: Node) -> Result<u32> {
        let path = format!("/sys/class/net/{}/ifindex", self.uplink(node));
        let out = self.exec(&self.node_ns(node), &["cat", &path])?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .with_context(|| format!("the ifindex of {}", self.uplink(node)))
    }

    /// As [`Self::start_agent`], without `--uplink`: the agent finds its
    /// uplink from the Node's address (or the default route).
    pub fn start_agent_finding_uplink(
        &mut self,
        node: Node,
        switchboard: &Path,
        extra: &[&str],
    ) -> Result<u32> {
        let source = format!("dir:{}", self.manifest_dir().display());
        let mut args = vec!["--node-name", node.name()];
        args.extend_from_slice(extra);
        let agent = self.agent(node);
        self.core.start_agent(&agent, switchboard, &source, &args)
    }
}
