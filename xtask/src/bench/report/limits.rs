//! "What limits them", after the Goals table, from this run's figures: how
//! the per-packet cost splits, whether a conn/s target is reachable at all
//! below the direct (no load balancer) limit, and what the paired phases
//! take apart.

use std::fmt::Write as _;

use crate::bench::fmt::size_label;
use crate::bench::paths::{
    DIRECT, DIRECT_SPREAD, DIRECT_SW, IPTABLES, NFTABLES, SW_SOCK_PINNED, SW_SOCK_POD, SW_TC,
};
use crate::bench::results::{Paired, PerPacket, Results};
use crate::bench::stats::range;

/// The whole list.
pub fn section(results: &Results) -> String {
    let mut out = String::from("\nWhat limits them, from this run's figures:\n\n");
    if let Some(pp) = &results.perpacket {
        per_packet(&mut out, pp);
    }
    conn(&mut out, results);
    if let Some(paired) = results.paired() {
        out.push_str(&paired_lines(paired));
    }
    out
}

/// Where an existing flow's and a reply's nanoseconds go, at the largest
/// size.
fn per_packet(out: &mut String, pp: &PerPacket) {
    let (_, largest) = pp.smallest_largest();
    let (Some(row), Some(empty)) = (pp.at(largest, 1), pp.empty_tc_ns) else {
        return;
    };
    let ns = |v: Option<f64>| v.unwrap_or(f64::NAN);
    let (hit, plain, miss, reply, first_reply) = (
        ns(row.from_pod_service_existing_ns),
        ns(row.from_pod_service_existing_no_rewrite_ns),
        ns(row.from_pod_non_service_ns),
        ns(row.to_pod_reply_ns),
        ns(row.to_pod_first_reply_ns),
    );
    let _ = writeln!(
        out,
        "- per packet ({} Services): the empty program is {empty:.1} ns; a header read and one bit of the frontend bitmap (no parse) bring a non-service packet to {miss:.1} ns; the parse, this CPU's flow cache (one slot read and compared: no hash-table lookup, no frontend lookup) and the counters bring an established flow's packet to {plain:.1} ns ({:.2} × empty) before any byte is written; the rewrite (the address, the port and both checksums stored directly, the L4 one updated in place as the skb's `ip_summed` says, read through the kfunc `bpf_cast_to_kern_ctx`) adds {:.1} ns. A reply from the cache is {reply:.1} ns; the first reply (the SYN-ACK), which takes the table (jhash of the 16-byte key, the bucket walk, the compare), {first_reply:.1} ns: that lookup is the difference.",
        size_label(largest),
        plain / empty,
        hit - plain,
    );
}

/// The conn/s targets against the direct limit at the largest size.
fn conn(out: &mut String, results: &Results) {
    let at = results.e2e_sizes().last().copied();
    let label = at.map(size_label).unwrap_or_default();
    let Some(direct) = results.conn(DIRECT, at) else {
        return;
    };
    for (other, name, factor) in [(IPTABLES, "iptables", 3.0), (NFTABLES, "nftables", 1.2)] {
        if let Some(base) = results.conn(other, at) {
            let need = base * factor;
            let _ = writeln!(
                out,
                "- {factor} × {name} at {label} Services would be {need:.0} conn/s: {:.2} × the direct limit ({direct:.0} conn/s, no load balancer at all){}.",
                need / direct,
                if need > direct {
                    format!(
                        ", so no load balancer can reach it on this machine; the ratio is bounded by direct ÷ {name} = {:.2}",
                        direct / base
                    )
                } else {
                    String::new()
                }
            );
        }
    }
    let rounds = results
        .e2e_row(DIRECT, at)
        .map(|r| r.m.conn_per_s_rounds.as_slice())
        .unwrap_or_default();
    if let Some((lo, hi)) = range(rounds) {
        let _ = writeln!(
            out,
            "- ÷ direct: the direct limit itself moved between {lo:.0} and {hi:.0} conn/s over the rounds ({:.0} % of its median), which is as large as the 5 % the target allows.",
            (hi - lo) / direct * 100.0
        );
    }
    socket_gap(out, results, at, direct);
}

/// Where the socket layer's gap to the direct limit lies, from the rows that
/// take it apart: the same client on a switchboard node with no Service
/// (control), the socket layer with one pod per client (as direct), and
/// direct traffic spread over the pods per connection (as a balancer).
fn socket_gap(out: &mut String, results: &Results, at: Option<u64>, direct: f64) {
    let c = |key| results.conn(key, at);
    if let Some(inside) = c(DIRECT_SW) {
        let _ = writeln!(
            out,
            "- being on a switchboard node: the same pod client sending to the pods' own addresses inside switchboard's sandbox (agent, tc programs, socket hooks, no Service) makes {inside:.0} conn/s, {:.2} × direct.",
            inside / direct
        );
        if let Some(pinned) = c(SW_SOCK_PINNED) {
            let _ = writeln!(
                out,
                "- the socket layer's own work per connect (frontend lookup, backend pick, the socket's storage): with each client held to one pod as in that row, socket-LB makes {pinned:.0} conn/s, {:.2} × that row.",
                pinned / inside
            );
        }
    }
    if let (Some(spread), Some(sock)) = (c(DIRECT_SPREAD), c(SW_SOCK_POD)) {
        let _ = writeln!(
            out,
            "- spreading: with no balancer at all, each client's connections spread over the three pods by the node's multipath route make {spread:.0} conn/s, {:.2} × direct (each client then wakes three servers rather than one on two cores); the socket layer spreading the same way is {:.2} × that.",
            spread / direct,
            sock / spread
        );
    }
}

/// What the paired phases take apart: the socket layer's own work (held to
/// one pod per client, against the same client with no Service in the same
/// sandbox), what spreading costs (the socket layer spreading, against it
/// held to one pod), and tc against the socket layer.
fn paired_lines(paired: &Paired) -> String {
    let line = |num: &str, den: &str, what: &str| {
        paired.ratio(num, den).map(|p| {
            format!(
                "- {what}: {:.3} (paired, quartiles {:.3}–{:.3}).\n",
                p.median, p.q1, p.q3
            )
        })
    };
    [
        line(SW_SOCK_PINNED, DIRECT_SW, "the socket layer's own work per connection, each client held to one pod, ÷ the same client sending to the pods' own addresses in switchboard's sandbox (no Service; the same programs attached)"),
        line(SW_SOCK_POD, SW_SOCK_PINNED, "spreading: the socket layer spreading each client's connections over the three pods ÷ the socket layer holding each client to one pod (the same programs, the same work per connection; each client then wakes three servers rather than one on two cores, which the direct spread pays too)"),
        line(DIRECT_SPREAD, DIRECT, "spreading with no balancer: the multipath route spreading each client's connections over the three pods ÷ each client sending to its own pod, both in the direct sandbox (the counterpart of the line above)"),
        line(SW_TC, SW_SOCK_POD, "tc ÷ the socket layer (the same spread; tc's programs run per packet, with the connection-tracking inserts and lookups of each connection)"),
    ]
    .into_iter()
    .flatten()
    .collect()
}
