//! Keeping the agent in step with this namespace's interfaces: which
//! netlink events it follows, and what it does after each (and on the
//! rescan tick): uplinks first, then pod interfaces, the status file and
//! the `--nodeport-addresses` candidates.
use tracing::warn;

use crate::{
    agent::{syncloop::SyncLoop, uplinks::Uplinks},
    dataplane::attach::pods::{self, Attacher},
    dataplane::maps::PinnedMaps,
    model::NodeInfo,
};

/// The netlink groups the agent follows: links (pod interfaces, uplinks),
/// qdiscs and filters (programs taken off), IPv4 and IPv6 addresses (uplink addresses, `--nodeport-addresses`), and,
/// when the uplinks are found without `--uplink`, IPv4 routes (the default
/// route may name the uplink).
pub(super) fn netlink_groups(named_uplinks: &[String]) -> u32 {
    use rtnetlink::constants::{
        RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_IPV6_IFADDR, RTMGRP_LINK, RTMGRP_TC,
    };
    let routes = match named_uplinks.is_empty() {
        true => RTMGRP_IPV4_ROUTE,
        false => 0,
    };
    // The tc group: a qdisc or filter deleted behind the agent is
    // repaired at once (see `heal`).
    RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_TC | routes
}

/// The Node's IPv4 addresses (they name the uplinks when `--uplink` is not
/// given).
pub(super) fn node_ipv4s(node: Option<&NodeInfo>) -> Vec<std::net::Ipv4Addr> {
    node.map(|n| {
        n.addresses
            .iter()
            .filter_map(|a| match a {
                std::net::IpAddr::V4(a) => Some(*a),
                std::net::IpAddr::V6(_) => None,
            })
            .collect()
    })
    .unwrap_or_default()
}

/// What the agent keeps in step with the interfaces.
pub(super) struct Links<'a> {
    pub handle: &'a rtnetlink::Handle,
    pub attacher: &'a mut Attacher,
    pub uplinks: &'a mut Uplinks,
    pub ebpf: &'a mut aya::Ebpf,
}

impl Links<'_> {
    /// After a link, address or route event, and on the rescan tick: the
    /// uplinks first (an interface that became one is no pod interface),
    /// then the pod interfaces, the status file, and the addresses
    /// `--nodeport-addresses` selects from. Failures are logged; the next
    /// tick tries again.
    pub(super) async fn follow(&mut self, sync: &mut SyncLoop<'_, PinnedMaps>) {
        let node_addrs = node_ipv4s(sync.source_node.as_ref());
        let maps = sync.syncer.store_mut();
        match self
            .uplinks
            .refresh(self.handle, &node_addrs, self.ebpf, maps)
            .await
        {
            Ok(refreshed) => {
                for failure in refreshed.failures {
                    let error = anyhow::Error::from(failure);
                    warn!(error = %format!("{error:#}"), "an uplink change was not applied; trying again at the next rescan");
                }
                if refreshed.changed {
                    self.attacher.set_uplinks(self.uplinks.indices());
                }
            }
            Err(failure) => {
                let error = anyhow::Error::from(failure);
                warn!(error = %format!("{error:#}"), "following the uplinks failed; trying again at the next rescan");
            }
        }
        rescan(self.handle, self.attacher, self.ebpf).await;
        sync.set_interfaces(self.attacher.interfaces(), &self.uplinks.statuses());
        sync.on_addresses(self.handle).await;
    }
}

pub(super) async fn rescan(
    handle: &rtnetlink::Handle,
    attacher: &mut Attacher,
    ebpf: &mut aya::Ebpf,
) {
    match pods::pod_interfaces(handle).await {
        Ok(interfaces) => attacher.reconcile(ebpf, &interfaces),
        Err(error) => warn!(error = %anyhow::Error::from(error), "listing interfaces failed"),
    }
    attacher.follow_routes(handle).await;
}
