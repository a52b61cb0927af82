//! The north-south section: an external client to a NodePort in the
//! two-node sandbox (conn/s and a one-core flood through XDP, tc only and
//! iptables, next to the pods reached directly), the uplink's forwarding
//! rate with no userspace sender, and the uplink programs per packet.

use std::fmt::Write as _;

use crate::bench::fmt::{fmt_opt, raw};
use crate::bench::northsouth::{
    NS_DIRECT_LOCAL, NS_DIRECT_REMOTE, NS_IPT_LOCAL, NS_IPT_REMOTE, NS_TC_LOCAL, NS_TC_REMOTE,
    NS_XDP_LOCAL, NS_XDP_REMOTE,
};
use crate::bench::results::{NorthSouth, NsMedians, XdpFwd};

pub fn section(ns: &NorthSouth) -> String {
    let meta = &ns.meta;
    let pp = &ns.perpacket;
    let mut md =
        String::from("\n## North-south: external client → NodePort (two-node sandbox)\n\n");
    md.push_str("The two-node sandbox (`xtask/src/sandbox/two_node.rs`): a LAN bridge, node A 192.168.50.1 and node B .2, two pods per node, external clients .100 and .101. Two NodePort Services on node A (`externalTrafficPolicy: Cluster`): `bench/np-local` (TCP 30080 → 8080, UDP 30090 → 9) with node A's two pods, `bench/np-remote` (30081, 30091) with node B's two pods, so node A DNATs to a local backend, or DNATs and SNATs to a backend on node B. Three sandboxes live at once (direct; switchboard's agent on node A, restarted per `--xdp-mode`, the mode checked on the uplink with `ip link`; kube-proxy-style iptables NodePort rules in node A's namespace, no agent), and the paths are measured in interleaved rounds (medians). Every pod runs `sb-http`.\n\n");
    md.push_str("**Remote backends go through XDP in generic mode**: native XDP_TX from a veth reaches its peer only when the peer has an XDP program (the bridge ports of this sandbox have none), so the remote XDP path runs with `--xdp-mode generic` (an skb is allocated before the program runs, then XDP_TX goes out through the stack's transmit path); local backends (XDP_PASS) use native XDP. Everything is veth: no NIC, no driver XDP.\n\n");
    if let Some(paths) = &ns.paths {
        md.push_str("| path | backends | client | through |\n|---|---|---|---|\n");
        for p in paths {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                p.label, p.backends, p.client, p.via
            );
        }
        md.push('\n');
    }
    let _ = writeln!(
        md,
        "New TCP connections/s: two wrk in parallel (`-t 1 -c 11`, `Connection: close`, {} s), both to the NodePort (direct: one to each pod's own address, from the other client, so no pod sees a client tuple both translated and direct). Forwarding rate: `sb_bench flood` (sendmmsg, {} UDP flows, 60-byte frames, {} s) pinned to CPU {} in the client's namespace; what reached the backend pods is read from their `/proc/net/snmp` (Udp InDatagrams + NoPorts + InErrors; nothing listens on UDP 9). On veths the whole path (the sender's syscalls, the bridge, node A, node B for remote, the pods' receive) runs in the sending CPU's softirq, so the rate is one core's for the sender and the forwarding together.\n",
        raw(meta.wrk_secs),
        raw(meta.flood_flows),
        raw(meta.flood_secs),
        raw(meta.flood_cpu)
    );
    md.push_str("| path | conn/s | p50 | p99 | errors | Mpps at the pods (one core) | Mpps sent |\n|---|---|---|---|---|---|---|\n");
    for key in [
        NS_DIRECT_LOCAL,
        NS_XDP_LOCAL,
        NS_TC_LOCAL,
        NS_IPT_LOCAL,
        NS_DIRECT_REMOTE,
        NS_XDP_REMOTE,
        NS_TC_REMOTE,
        NS_IPT_REMOTE,
    ] {
        let Some(r) = ns.row(key) else { continue };
        let m = &r.m;
        let _ = writeln!(
            md,
            "| {} | {} | {} µs | {} µs | {} | {} | {} |",
            r.label,
            fmt_opt(m.conn_per_s, 0),
            fmt_opt(m.p50_us, 0),
            fmt_opt(m.p99_us, 0),
            m.errors,
            fmt_opt(m.flood_mpps, 3),
            fmt_opt(m.flood_sent_mpps, 3),
        );
    }
    md.push_str("\nRatios (same run):\n\n| | conn/s | Mpps |\n|---|---|---|\n");
    let ratio = |a: &str, b: &str, field: fn(&NsMedians) -> Option<f64>| {
        ns.m(a, field).zip(ns.m(b, field)).map(|(a, b)| a / b)
    };
    for (a, b, name) in [
        (NS_XDP_LOCAL, NS_IPT_LOCAL, "XDP ÷ iptables, local backends"),
        (
            NS_XDP_REMOTE,
            NS_IPT_REMOTE,
            "XDP ÷ iptables, remote backends",
        ),
        (
            NS_TC_LOCAL,
            NS_IPT_LOCAL,
            "tc only ÷ iptables, local backends",
        ),
        (
            NS_TC_REMOTE,
            NS_IPT_REMOTE,
            "tc only ÷ iptables, remote backends",
        ),
        (NS_XDP_LOCAL, NS_TC_LOCAL, "XDP ÷ tc only, local backends"),
        (
            NS_XDP_REMOTE,
            NS_TC_REMOTE,
            "XDP ÷ tc only, remote backends",
        ),
        (
            NS_XDP_LOCAL,
            NS_DIRECT_LOCAL,
            "XDP ÷ direct, local backends",
        ),
        (
            NS_XDP_REMOTE,
            NS_DIRECT_REMOTE,
            "XDP ÷ direct, remote backends",
        ),
    ] {
        let _ = writeln!(
            md,
            "| {name} | {} | {} |",
            fmt_opt(ratio(a, b, |m| m.conn_per_s), 2),
            fmt_opt(ratio(a, b, |m| m.flood_mpps), 2)
        );
    }
    // What limits the forwarding target.
    let (x, i, d) = (
        ns.m(NS_XDP_REMOTE, |m| m.flood_mpps),
        ns.m(NS_IPT_REMOTE, |m| m.flood_mpps),
        ns.m(NS_DIRECT_REMOTE, |m| m.flood_mpps),
    );
    if let (Some(x), Some(i), Some(d)) = (x, i, d) {
        let _ = writeln!(
            md,
            "\nWhat limits the forwarding ratio, from these figures: per packet the core spends {:.0} ns through XDP, {:.0} ns through iptables and {:.0} ns on the direct path (plain forwarding, no Service), all including the sender's own sendmmsg and the veth/bridge hops, which are the same on every path. The part that differs between XDP and iptables is {:.0} ns per packet; the shared part (≈ the direct path) is {:.0} ns. Even a load balancer that cost nothing could reach at most {:.2} × iptables on this setup (iptables ÷ direct time), so the 2 × target is {}. Generic XDP on the remote path also allocates the skb before the program runs and transmits XDP_TX through the stack, which native XDP on a NIC would not.",
            1e3 / x,
            1e3 / i,
            1e3 / d,
            1e3 / i - 1e3 / x,
            1e3 / d,
            (1e3 / i) / (1e3 / d),
            if (1e3 / i) / (1e3 / d) < 2.0 { "out of reach with the sender on the same core" } else { "reachable in principle" }
        );
    }
    md.push_str(&xdpfwd(&ns.xdpfwd));
    // Per packet.
    let _ = writeln!(
        md,
        "\n### North-south per packet (BPF_PROG_TEST_RUN)\n\n{}.\n\nEmpty XDP {} ns, empty tc {} ns (repeat {}); single runs carry the kernel timer's own cost ({} ns for XDP, {} ns for tc: single empty run − repeated empty run), which the single-run rows subtract (check: the local flow's corrected single run is {} ns against {} ns repeated).\n\n| program | case | verdict | ns | ÷ empty | measured by |\n|---|---|---|---|---|---|",
        pp.method.as_deref().unwrap_or(""),
        fmt_opt(pp.empty_xdp_ns, 1),
        fmt_opt(pp.empty_tc_ns, 1),
        raw(pp.repeat),
        fmt_opt(pp.timer_overhead_xdp_ns, 1),
        fmt_opt(pp.timer_overhead_tc_ns, 1),
        fmt_opt(pp.check_local_single_corrected_xdp_ns, 1),
        fmt_opt(ns.uplink_case("sb_xdp_uplink", "existing local flow").and_then(|r| r.ns), 1),
    );
    for r in &pp.rows {
        let _ = writeln!(
            md,
            "| `{}` | {} | {} | {} | {} | {} |",
            r.program,
            r.case,
            r.verdict.as_deref().unwrap_or(""),
            fmt_opt(r.ns, 1),
            fmt_opt(r.ratio, 2),
            r.how.as_deref().unwrap_or(""),
        );
    }
    let _ = writeln!(
        md,
        "\n<details><summary>iptables NodePort rules loaded into node A (iptables-restore)</summary>\n\n```\n{}```\n</details>\n",
        meta.iptables_rules.as_deref().unwrap_or("")
    );
    md
}

/// The report's table of every row, with its range over the rounds.
fn xdpfwd(x: &XdpFwd) -> String {
    let Some(rows) = &x.rows else {
        return String::new();
    };
    let meta = &x.meta;
    let mut md = String::from(
        "\n### North-south forwarding rate, no userspace sender (XDP live frames)\n\n",
    );
    if let Some(why) = &x.not_measured {
        let _ = writeln!(md, "{why}.");
        return md;
    }
    let _ = writeln!(
        md,
        "{}. {} frames per run, {} interleaved rounds, median (min–max) in Mpps, one core (CPU {}). The node is `sb_bench uplink`'s (veth uplink, a pod veth, a gateway to another node's pods) in a private namespace; each kube-proxy rule set in a namespace of its own.\n",
        meta.generator.as_deref().unwrap_or(""),
        raw(meta.frames_per_run),
        raw(meta.rounds),
        raw(meta.cpu)
    );
    md.push_str("| path | family | flows | Mpps | range |\n|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {}–{} |",
            r.label.as_deref().unwrap_or(""),
            r.family.as_deref().unwrap_or(""),
            raw(r.flows),
            fmt_opt(r.mpps, 2),
            fmt_opt(r.mpps_min, 2),
            fmt_opt(r.mpps_max, 2),
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel that refuses live frames leaves the section saying why.
    #[test]
    fn a_kernel_without_live_frames_says_why() {
        let why =
            "not measured: this kernel refuses BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES";
        let refused: XdpFwd = serde_json::from_value(
            serde_json::json!({"kind": "xdpfwd", "meta": {}, "rows": [], "not_measured": why}),
        )
        .expect("xdpfwd json");
        assert!(xdpfwd(&refused).contains(why));
    }
}
