//! The uplink's forwarding rate in Mpps with no userspace sender in the way
//! (`sb_bench xdpfwd`, see `proxy-user/benches/sb_bench/xdpfwd.rs`): the
//! kube-proxy rule sets its baselines run under are written here, in
//! kube-proxy's own layouts ([`super::kubeproxy`]), for the bench's two
//! NodePort Services.
use std::{fs, net::Ipv4Addr, path::Path};

use anyhow::Result;

use super::kubeproxy::{nodeport_iptables, nodeport_nftables, NodePortSvc};
use super::results::XdpFwd;

/// The bench's NodePorts (as `sb_bench xdpfwd` programs them): UDP 30090
/// to a pod on another node (masqueraded), UDP 30091 to a pod on this one.
fn services() -> Vec<NodePortSvc> {
    [
        (
            "remote",
            Ipv4Addr::new(10, 96, 9, 1),
            30090,
            "10.244.2.2",
            true,
        ),
        (
            "local",
            Ipv4Addr::new(10, 96, 9, 2),
            30091,
            "10.244.1.2",
            false,
        ),
    ]
    .into_iter()
    .map(
        |(name, cluster_ip, node_port, pod, masquerade)| NodePortSvc {
            id: format!("bench/xdpfwd-{name}:udp"),
            proto: "udp",
            cluster_ip,
            port: 9,
            node_port,
            endpoints: vec![(pod.to_string(), 8080)],
            masquerade,
        },
    )
    .collect()
}

/// Runs `sb_bench xdpfwd` with both rule sets; its figures.
pub fn run(sb_bench: &Path, quick: bool, dir: &Path) -> Result<XdpFwd> {
    let ipt = dir.join("xdpfwd-iptables.rules");
    let nft = dir.join("xdpfwd-nftables.nft");
    fs::write(&ipt, nodeport_iptables(&services()))?;
    fs::write(&nft, nodeport_nftables(&services()))?;
    let (ipt, nft) = (ipt.to_string_lossy(), nft.to_string_lossy());
    let mut args = vec!["xdpfwd", "--iptables", &ipt, "--nftables", &nft];
    if quick {
        args.push("--quick");
    }
    super::run_json(sb_bench, &args, &dir.join("xdpfwd.json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule sets as `iptables-restore` and `nft -f` took them in a run
    /// (golden files: a change to the layouts shows here first).
    #[test]
    fn rules_are_the_loaded_ones() {
        let golden_ipt = include_str!("testdata/xdpfwd-iptables.rules");
        let golden_nft = include_str!("testdata/xdpfwd-nftables.nft");
        assert_eq!(nodeport_iptables(&services()), golden_ipt);
        assert_eq!(nodeport_nftables(&services()), golden_nft);
    }

    #[test]
    fn rules_name_the_bench_nodeports() {
        let ipt = nodeport_iptables(&services());
        assert!(ipt.contains("--dport 30090 -j KUBE-EXT-"));
        assert!(ipt.contains("-j DNAT --to-destination 10.244.2.2:8080"));
        assert_eq!(
            ipt.matches("external destinations\" -j KUBE-MARK-MASQ")
                .count(),
            1
        );
        let nft = nodeport_nftables(&services());
        assert!(nft.contains("udp . 30090 : goto external-"));
        assert!(nft.contains("dnat to 10.244.1.2:8080"));
        assert_eq!(nft.matches("jump mark-for-masquerade\n\t\tgoto").count(), 1);
    }
}
