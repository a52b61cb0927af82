//! The uplink's forwarding rate in Mpps with no userspace sender in the way
//! (`sb_bench xdpfwd`, see `proxy-user/benches/sb_bench/xdpfwd.rs`): the
//! kube-proxy rule sets its baselines run under are written here, in
//! kube-proxy's own layouts ([`super::kubeproxy`]), for the bench's two
//! NodePort Services.
use std::{fmt::Write as _, fs, net::Ipv4Addr, path::Path};

use anyhow::Result;
use serde_json::Value;

use super::goals::{f, fmt_opt, Goal};
use super::kubeproxy::{nodeport_iptables, nodeport_nftables, NodePortSvc};

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

/// Runs `sb_bench xdpfwd` with both rule sets; its JSON.
pub(super) fn run(sb_bench: &Path, quick: bool, dir: &Path) -> Result<Value> {
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

/// The median Mpps of row `key` of `sb_bench xdpfwd`'s output `x`.
fn mpps(x: &Value, key: &str) -> Option<f64> {
    x["rows"]
        .as_array()?
        .iter()
        .find(|r| r["key"] == key)
        .and_then(|r| f(&r["mpps"]))
}

/// The targets of the forwarding rate: NodePort to a remote backend ≥ 3 ×
/// iptables, ≥ 2 × nftables and ≥ 0.5 × the reflector; direct server
/// return at least as fast as source NAT; a frame not ours ≥ 0.9 × the
/// empty pass program (IPv4, 1024 flows).
pub(super) fn goals(x: &Value) -> Vec<Goal> {
    [
        (
            "remote_many",
            "iptables_remote_many",
            "NodePort to a remote backend, switchboard XDP ÷ kube-proxy iptables",
            3.0,
        ),
        (
            "remote_many",
            "nftables_remote_many",
            "NodePort to a remote backend, switchboard XDP ÷ kube-proxy nftables",
            2.0,
        ),
        (
            "remote_many",
            "reflector",
            "NodePort to a remote backend, switchboard XDP ÷ the empty XDP_TX reflector",
            0.5,
        ),
        (
            "dsr_remote_many",
            "remote_many",
            "NodePort to a remote backend, direct server return ÷ source NAT",
            1.0,
        ),
        (
            "not_ours",
            "pass",
            "a frame not ours, switchboard XDP ÷ the empty XDP_PASS program",
            0.9,
        ),
    ]
    .into_iter()
    .map(|(a, b, what, target)| {
        let (x_a, x_b) = (mpps(x, a), mpps(x, b));
        let r = x_a.zip(x_b).map(|(a, b)| a / b);
        let measured = match x["not_measured"].as_str() {
            Some(why) => why.to_string(),
            None => format!(
                "{} ({} ÷ {} Mpps)",
                fmt_opt(r, 2),
                fmt_opt(x_a, 2),
                fmt_opt(x_b, 2)
            ),
        };
        Goal {
            what: format!("forwarding on one core (XDP live frames, 1024 flows), {what}"),
            goal: format!("≥ {target}"),
            measured,
            met: r.map(|r| r >= target),
        }
    })
    .collect()
}

/// The report's table of every row, with its range over the rounds.
pub(super) fn section(x: &Value) -> String {
    let Some(rows) = x["rows"].as_array() else {
        return String::new();
    };
    let meta = &x["meta"];
    let mut md = String::from(
        "\n### North-south forwarding rate, no userspace sender (XDP live frames)\n\n",
    );
    if let Some(why) = x["not_measured"].as_str() {
        let _ = writeln!(md, "{why}.");
        return md;
    }
    let _ = writeln!(
        md,
        "{}. {} frames per run, {} interleaved rounds, median (min–max) in Mpps, one core (CPU {}). The node is `sb_bench uplink`'s (veth uplink, a pod veth, a gateway to another node's pods) in a private namespace; each kube-proxy rule set in a namespace of its own.\n",
        meta["generator"].as_str().unwrap_or(""),
        meta["frames_per_run"],
        meta["rounds"],
        meta["cpu"]
    );
    md.push_str("| path | family | flows | Mpps | range |\n|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {}–{} |",
            r["label"].as_str().unwrap_or(""),
            r["family"].as_str().unwrap_or(""),
            r["flows"],
            fmt_opt(f(&r["mpps"]), 2),
            fmt_opt(f(&r["mpps_min"]), 2),
            fmt_opt(f(&r["mpps_max"]), 2),
        );
    }
    md
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

    /// A kernel that refuses live frames leaves every forwarding goal not
    /// measured, saying why, rather than not met; the report's section
    /// says why too, and measured rows still give their ratios.
    #[test]
    fn a_kernel_without_live_frames_leaves_the_goals_not_measured() {
        let why =
            "not measured: this kernel refuses BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES";
        let refused =
            serde_json::json!({"kind": "xdpfwd", "meta": {}, "rows": [], "not_measured": why});
        let not_measured = goals(&refused);
        assert!(!not_measured.is_empty());
        for g in &not_measured {
            assert_eq!(g.met, None, "{}", g.what);
            assert_eq!(g.measured, why);
        }
        assert!(section(&refused).contains(why));

        let row = |key: &str, mpps: f64| serde_json::json!({"key": key, "mpps": mpps});
        let measured = serde_json::json!({"rows": [row("remote_many", 3.0), row("iptables_remote_many", 0.5)]});
        let first = &goals(&measured)[0];
        assert_eq!(first.met, Some(true));
        assert!(first.measured.starts_with("6.00"), "{}", first.measured);
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
