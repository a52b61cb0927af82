//! Every goal of the report, in one place: the target tables, how each
//! goal's figure is computed from the run's results, and its verdict. The
//! report's Goals table is [`all`], in this order: per packet, north-south
//! (the uplink programs and the forwarding rate), new connections per
//! second (the default workload, then the light one), the control plane,
//! the control plane at scale.

use super::fmt::{fmt_opt, raw, size_label};
use super::paths::{
    Workload, DIRECT, DIRECT_HOST, DIRECT_SPREAD, DIRECT_SW, IPTABLES, NFTABLES, SW_SOCK_HOST,
    SW_SOCK_PINNED, SW_SOCK_POD, SW_TC,
};
use super::results::{
    label_of, Case, CaseV6, NorthSouth, PerPacket, PerPacketRow, Results, Scale, StartRow, SyncOut,
    XdpFwd,
};

/// One row of the report's Goals table.
pub struct Goal {
    pub what: String,
    pub goal: String,
    pub measured: String,
    pub met: Option<bool>,
}

/// A goal's verdict as the table writes it.
pub fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "**met**",
        Some(false) => "**not met**",
        None => "not measured",
    }
}

/// The control plane's targets at scale: `(Services, bound)`, and the
/// sizes and rates they are measured at.
pub mod targets {
    /// One EndpointSlice change → maps, p99 (ms).
    pub const CHANGE_P99_MS: [(u32, f64); 2] = [(10_000, 5.0), (100_000, 20.0)];
    /// Agent start → maps synced (s), from either source.
    pub const SYNCED_S: [(u32, f64); 1] = [(100_000, 5.0)];
    /// Agent RSS after the initial sync (MiB), from either source.
    pub const RSS_MIB: [(u32, f64); 2] = [(10_000, 48.0), (100_000, 300.0)];
    /// Agent peak RSS (VmHWM) through the initial sync (MiB): the peak counts too.
    pub const PEAK_RSS_MIB: [(u32, f64); 1] = [(100_000, 300.0)];
    /// Services of the file change → new backend answering measurement.
    pub const FILE_CHANGE_SERVICES: u32 = 10_000;
    /// File change → new backend answering, median (ms).
    pub const FILE_CHANGE_MS: f64 = 20.0;
    /// Services the churn runs at.
    pub const CHURN_SERVICES: u32 = 10_000;
    /// How far behind the maps may be during churn (s): a bucket bound of
    /// `switchboard_network_programming_duration_seconds`.
    pub const CHURN_BEHIND_S: f64 = 0.1;
    /// Changes per second of the cluster source's event → map write
    /// measurement.
    pub const EVENT_RATE: u32 = 1000;
    /// Cluster source: a watch event → its map write, p99 (ms).
    pub const EVENT_P99_MS: f64 = 20.0;

    /// The bound for `services` in `table`, if it has one.
    pub fn at(table: &[(u32, f64)], services: u64) -> Option<f64> {
        table
            .iter()
            .find(|(n, _)| u64::from(*n) == services)
            .map(|(_, bound)| *bound)
    }
}

/// Every goal, from the run's results.
pub fn all(results: &Results) -> Vec<Goal> {
    let none = PerPacket::default();
    let pp = results.perpacket.as_ref().unwrap_or(&none);
    let mut goals = per_packet(pp);
    match &results.northsouth {
        None => goals.push(Goal {
            what: "switchboard ÷ empty XDP program".into(),
            goal: "≤ 3".into(),
            measured: format!(
                "not measured in this run (empty XDP: {} ns)",
                fmt_opt(pp.empty_xdp_ns, 1)
            ),
            met: None,
        }),
        Some(ns) => goals.extend(north_south(ns)),
    }
    goals.extend(conn(results));
    goals.extend(sync(results.sync.as_ref()));
    if let Some(scale) = &results.scale {
        goals.extend(scale_goals(scale));
    }
    goals
}

/// A figure of the per-packet rows: IPv4 at the largest size (one
/// backend), IPv6 at the largest size up to it, or the empty tc program.
#[derive(Clone, Copy)]
enum Ns {
    V4(Case),
    V6(CaseV6),
    EmptyTc,
}

/// The per-packet targets at the largest size: `(what, numerator,
/// denominator, at most)`; `{at}` is the size.
const PER_PACKET: [(&str, Ns, Ns, f64); 8] = [
    (
        "sb_from_pod existing flow ÷ empty tc program ({at} Services)",
        Ns::V4(|r| r.from_pod_service_existing_ns),
        Ns::EmptyTc,
        2.5,
    ),
    (
        "sb_to_pod reply ÷ empty tc program ({at} Services)",
        Ns::V4(|r| r.to_pod_reply_ns),
        Ns::EmptyTc,
        2.5,
    ),
    (
        "IPv6 ÷ IPv4, sb_from_pod existing flow",
        Ns::V6(|r| r.from_pod_service_existing_ns),
        Ns::V4(|r| r.from_pod_service_existing_ns),
        1.2,
    ),
    (
        "IPv6 ÷ IPv4, sb_to_pod reply",
        Ns::V6(|r| r.to_pod_reply_ns),
        Ns::V4(|r| r.to_pod_reply_ns),
        1.2,
    ),
    (
        "not ours: sb_from_pod, a packet to no frontend, ÷ empty tc program",
        Ns::V4(|r| r.from_pod_non_service_ns),
        Ns::EmptyTc,
        1.3,
    ),
    (
        "not ours, IPv6: sb_from_pod, an IPv6 packet to no frontend, ÷ empty tc program",
        Ns::V6(|r| r.from_pod_non_service_ns),
        Ns::EmptyTc,
        1.3,
    ),
    (
        "a socket-balanced flow's packet on the pod veth, leaving the pod (sb_from_pod: to a pod address) ÷ empty tc program",
        Ns::V4(|r| r.from_pod_non_service_ns),
        Ns::EmptyTc,
        1.2,
    ),
    (
        "a socket-balanced flow's packet on the pod veth, into the pod (sb_to_pod: a quiet pod) ÷ empty tc program",
        Ns::V4(|r| r.to_pod_quiet_ns),
        Ns::EmptyTc,
        1.2,
    ),
];

/// The per-packet cost flat from the smallest size to the largest (at
/// most 1.1 ×), then [`PER_PACKET`].
fn per_packet(pp: &PerPacket) -> Vec<Goal> {
    let (smallest, largest) = pp.smallest_largest();
    let existing = |r: &PerPacketRow| r.from_pod_service_existing_ns;
    let hit_small = pp.ns(smallest, existing);
    let hit_large = pp.ns(largest, existing);
    let flat = hit_small.zip(hit_large).map(|(a, b)| b / a);
    let mut goals = vec![Goal {
        what: format!(
            "per-packet cost, {} ÷ {} Services (sb_from_pod, existing flow)",
            size_label(largest),
            size_label(smallest)
        ),
        goal: "≤ 1.1".into(),
        measured: format!(
            "{} ({} ns ÷ {} ns)",
            fmt_opt(flat, 2),
            fmt_opt(hit_large, 1),
            fmt_opt(hit_small, 1)
        ),
        met: flat.map(|r| r <= 1.1),
    }];
    let value = |side: Ns| match side {
        Ns::V4(case) => pp.ns(largest, case),
        Ns::V6(case) => pp.v6_ns(largest, case),
        Ns::EmptyTc => pp.empty_tc_ns,
    };
    let at = size_label(largest);
    for (what, num, den, target) in PER_PACKET {
        let (num, den) = (value(num), value(den));
        let r = num.zip(den).map(|(a, b)| a / b);
        goals.push(Goal {
            what: what.replace("{at}", &at),
            goal: format!("≤ {target}"),
            measured: format!(
                "{} ({} ns ÷ {} ns)",
                fmt_opt(r, 2),
                fmt_opt(num, 1),
                fmt_opt(den, 1)
            ),
            met: r.map(|r| r <= target),
        });
    }
    goals
}

/// The uplink program's cases held to 3 × an empty XDP program: `(case
/// the row's name starts with, how the goal names it)`.
const UPLINK_CASES: [(&str, &str); 3] = [
    (
        "existing local flow",
        "existing local flow, DNAT → XDP_PASS",
    ),
    (
        "existing remote flow",
        "existing remote flow, DNAT+SNAT+fib → XDP_TX (single runs, timer corrected)",
    ),
    ("not ours", "not ours → XDP_PASS"),
];

/// The north-south targets: the XDP program ≤ 3 × an empty XDP program per
/// packet, and the forwarding rate's ([`forwarding`]).
fn north_south(ns: &NorthSouth) -> Vec<Goal> {
    let mut goals = Vec::new();
    for (case, label) in UPLINK_CASES {
        let row = ns.uplink_case("sb_xdp_uplink", case);
        let ratio = row.and_then(|r| r.ratio);
        goals.push(Goal {
            what: format!("sb_xdp_uplink ÷ empty XDP program ({label})"),
            goal: "≤ 3".into(),
            measured: format!(
                "{} ({} ns ÷ {} ns)",
                fmt_opt(ratio, 2),
                fmt_opt(row.and_then(|r| r.ns), 1),
                fmt_opt(row.and_then(|r| r.empty_ns), 1)
            ),
            met: ratio.map(|r| r <= 3.0),
        });
    }
    // The forwarding rate without a userspace sender in the way (the
    // end-to-end flood's figures stay in the section, not among the goals:
    // there the sender shares the core).
    goals.extend(forwarding(&ns.xdpfwd));
    goals
}

/// The targets of the forwarding rate (IPv4, 1024 flows): `(row, row it is
/// divided by, what, at least)`.
const FORWARDING: [(&str, &str, &str, f64); 5] = [
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
];

/// [`FORWARDING`]'s goals; all not measured, saying why, on a kernel that
/// refuses live frames.
fn forwarding(x: &XdpFwd) -> Vec<Goal> {
    FORWARDING
        .into_iter()
        .map(|(a, b, what, target)| {
            let (x_a, x_b) = (x.mpps(a), x.mpps(b));
            let r = x_a.zip(x_b).map(|(a, b)| a / b);
            let measured = match &x.not_measured {
                Some(why) => why.clone(),
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

/// New TCP connections/s at the largest size: `(path, path it is divided
/// by, at least, informative only)`. Against direct traffic spread over
/// the pods as a balancer spreads it (the fair limit), and against each
/// client held to one pod (the pinned direct row, and the socket layer
/// held the same way).
const CONN: [(&str, &str, f64, bool); 14] = [
    (SW_SOCK_POD, DIRECT_SPREAD, 0.97, false),
    (SW_SOCK_POD, DIRECT, 0.97, true),
    (SW_SOCK_PINNED, DIRECT, 0.97, true),
    (SW_SOCK_PINNED, DIRECT_SW, 0.97, true),
    (SW_SOCK_POD, SW_TC, 1.0, false),
    (SW_SOCK_POD, IPTABLES, 3.0, false),
    (SW_SOCK_POD, NFTABLES, 1.2, false),
    (DIRECT_SW, DIRECT, 0.97, true),
    (DIRECT_SPREAD, DIRECT, 0.97, true),
    (SW_SOCK_HOST, DIRECT_HOST, 0.95, true),
    (SW_TC, DIRECT_SPREAD, 0.95, false),
    (SW_TC, DIRECT, 0.95, true),
    (SW_TC, IPTABLES, 3.0, false),
    (SW_TC, NFTABLES, 1.2, false),
];

/// New TCP connections/s of the light workload at the largest size:
/// `(path, path it is divided by, at least)`: the socket layer with one
/// backend per client against each client sending to its own pod, the
/// socket layer and tc against the same pods reached by the multipath
/// route, and a node with switchboard installed but no Service in the way
/// against the direct limit (being installed costs nothing a light
/// workload notices).
const LIGHT: [(&str, &str, f64); 4] = [
    (SW_SOCK_PINNED, DIRECT, 0.97),
    (SW_SOCK_POD, DIRECT_SPREAD, 0.98),
    (SW_TC, DIRECT_SPREAD, 0.97),
    (DIRECT_SW, DIRECT, 0.98),
];

/// [`CONN`]'s goals, then [`LIGHT`]'s.
fn conn(results: &Results) -> Vec<Goal> {
    let default = CONN.into_iter().map(|(num, den, goal, informative)| {
        conn_goal(results, Workload::Default, (num, den), goal, informative)
    });
    let light = LIGHT
        .into_iter()
        .map(|(num, den, goal)| conn_goal(results, Workload::Light, (num, den), goal, false));
    default.chain(light).collect()
}

/// `num ÷ den` of `workload` at the largest size, at least `goal`: the
/// ratio from the paired phases where they measured both paths (the
/// rounds' medians beside it), else from the rounds.
fn conn_goal(
    results: &Results,
    workload: Workload,
    (num, den): (&str, &str),
    goal: f64,
    informative: bool,
) -> Goal {
    let e2e_max = results.e2e_sizes().last().copied();
    let paths = results.e2e_paths();
    let at = e2e_max.map(size_label).unwrap_or_default();
    let (a, b) = (
        results.conn_of(workload, num, e2e_max),
        results.conn_of(workload, den, e2e_max),
    );
    let rounds = a.zip(b).map(|(a, b)| a / b);
    let rounds_text = format!(
        "{} ({} ÷ {})",
        fmt_opt(rounds, 2),
        fmt_opt(a, 0),
        fmt_opt(b, 0)
    );
    let paired = results
        .paired()
        .and_then(|p| p.ratio_of(workload, num, den));
    let unmeasured =
        workload == Workload::Light && results.e2e().iter().all(|r| r.m.light.is_none());
    let (r, measured) = match paired {
        _ if unmeasured => (None, "not measured in this run".to_owned()),
        Some(p) => (
            Some(p.median),
            format!(
                "{:.3} paired (quartiles {:.3}–{:.3}, {} repetitions); rounds' medians {rounds_text}",
                p.median, p.q1, p.q3, p.repetitions
            ),
        ),
        None => (rounds, rounds_text),
    };
    let workload = match workload {
        Workload::Default => "",
        Workload::Light => ", light workload",
    };
    Goal {
        what: format!(
            "new TCP connections/s at {at} Services{workload}, {} ÷ {}",
            label_of(&paths, num),
            label_of(&paths, den)
        ),
        goal: if informative {
            format!("≥ {goal} (informative)")
        } else {
            format!("≥ {goal}")
        },
        measured,
        met: r.map(|r| r >= goal),
    }
}

/// The largest size programmed into the maps in under half a second.
fn sync(sync: Option<&SyncOut>) -> Option<Goal> {
    let run = sync?.runs.iter().max_by_key(|r| r.services.unwrap_or(0))?;
    let apply = run.apply_ms.map(|ms| ms / 1000.0);
    Some(Goal {
        what: format!(
            "program {} Services × {} endpoints (Syncer::apply into kernel maps)",
            size_label(run.services.unwrap_or(0)),
            raw(run.endpoints_per_service)
        ),
        goal: "< 0.5 s".into(),
        measured: format!(
            "{} s (+ {} s to build the model)",
            fmt_opt(apply, 3),
            fmt_opt(run.model_ms.map(|m| m / 1000.0), 3)
        ),
        met: apply.map(|s| s < 0.5),
    })
}

/// The control plane's targets at scale ([`targets`]): every target, with
/// "not measured" where this run did not measure it (a quick run has no
/// 100k start).
fn scale_goals(scale: &Scale) -> Vec<Goal> {
    let mut goals = Vec::new();
    let change = scale
        .change
        .as_ref()
        .map(|c| c.runs.as_slice())
        .unwrap_or_default();
    for (n, bound) in targets::CHANGE_P99_MS {
        let run = change.iter().find(|r| r.services == Some(u64::from(n)));
        let p99 = run.and_then(|r| r.total.p99_ms);
        goals.push(Goal {
            what: format!(
                "one EndpointSlice change → maps at {} Services × 10, p99 (incremental model)",
                size_label(n.into())
            ),
            goal: format!("< {bound} ms"),
            measured: match run {
                Some(r) => format!(
                    "{} ms (p50 {} ms)",
                    fmt_opt(p99, 2),
                    fmt_opt(r.total.p50_ms, 2)
                ),
                None => "not measured in this run".into(),
            },
            met: p99.map(|v| v < bound),
        });
    }
    // The start rows' sources, each as the goals name it: `(source, YAML
    // style, label)`.
    const SOURCES: [(&str, Option<&str>, &str); 3] = [
        ("yaml", Some("block"), "block-style YAML"),
        ("yaml", Some("flow"), "flow-style YAML"),
        ("cluster", None, "the cluster source"),
    ];
    for (source, style, label) in SOURCES {
        let row = |n: u32| {
            scale.start.iter().find(|r| {
                r.source == source && r.yaml_style.as_deref() == style && r.services == u64::from(n)
            })
        };
        for (n, bound) in targets::SYNCED_S {
            let v = row(n).map(|r| r.startup_to_synced_s);
            goals.push(Goal {
                what: format!(
                    "agent start → maps synced, {} Services × 10 from {label}",
                    size_label(n.into())
                ),
                goal: format!("< {bound} s"),
                measured: v.map_or("not measured in this run".into(), |v| format!("{v:.2} s")),
                met: v.map(|v| v < bound),
            });
        }
        let rss: fn(&StartRow) -> f64 = |r| r.rss_mib;
        let peak: fn(&StartRow) -> f64 = |r| r.peak_rss_mib;
        for (table, field, what) in [
            (&targets::RSS_MIB[..], rss, "agent RSS"),
            (&targets::PEAK_RSS_MIB[..], peak, "agent peak RSS"),
        ] {
            for &(n, bound) in table {
                let v = row(n).map(field);
                goals.push(Goal {
                    what: format!(
                        "{what}, {} Services × 10 from {label}",
                        size_label(n.into())
                    ),
                    goal: format!("< {bound} MiB"),
                    measured: v
                        .map_or("not measured in this run".into(), |v| format!("{v:.1} MiB")),
                    met: v.map(|v| v < bound),
                });
            }
        }
    }
    let n = targets::FILE_CHANGE_SERVICES;
    let change = scale
        .start
        .iter()
        .find(|r| r.source == "yaml" && r.services == u64::from(n) && r.file_change.is_some())
        .and_then(|r| r.file_change.as_ref());
    let median = change.map(|c| c.median_ms as f64);
    goals.push(Goal {
        what: format!(
            "file change → new backend answering, {} Services × 10, directory source, median",
            size_label(n.into())
        ),
        goal: format!("< {} ms", targets::FILE_CHANGE_MS),
        measured: match change {
            Some(c) => format!(
                "{} ms (max {} ms, {} changes)",
                fmt_opt(median, 0),
                fmt_opt(Some(c.max_ms as f64), 0),
                c.rounds_ms.len()
            ),
            None => "not measured in this run".into(),
        },
        met: median.map(|v| v < targets::FILE_CHANGE_MS),
    });
    goals
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kernel that refuses live frames leaves every forwarding goal not
    /// measured, saying why, rather than not met; measured rows still give
    /// their ratios.
    #[test]
    fn a_kernel_without_live_frames_leaves_the_goals_not_measured() {
        let why =
            "not measured: this kernel refuses BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES";
        let refused: XdpFwd = serde_json::from_value(
            serde_json::json!({"kind": "xdpfwd", "meta": {}, "rows": [], "not_measured": why}),
        )
        .expect("xdpfwd json");
        let not_measured = forwarding(&refused);
        assert!(!not_measured.is_empty());
        for g in &not_measured {
            assert_eq!(g.met, None, "{}", g.what);
            assert_eq!(g.measured, why);
        }

        let row = |key: &str, mpps: f64| serde_json::json!({"key": key, "mpps": mpps});
        let measured: XdpFwd = serde_json::from_value(
            serde_json::json!({"rows": [row("remote_many", 3.0), row("iptables_remote_many", 0.5)]}),
        )
        .expect("xdpfwd json");
        let first = &forwarding(&measured)[0];
        assert_eq!(first.met, Some(true));
        assert!(first.measured.starts_with("6.00"), "{}", first.measured);
    }

    /// A conn/s goal takes the paired phases' ratio where they measured
    /// both paths, the rounds' medians beside it, and the rounds' ratio
    /// where they did not.
    #[test]
    fn conn_goals_prefer_the_paired_ratio() {
        let row = |path: &str, conn: f64| {
            serde_json::json!({"path": path, "label": path, "services": 10000,
                               "m": {"conn_per_s": conn}, "program_s": null})
        };
        let paired = |path: &str, ratios: &[f64]| {
            serde_json::json!({"path": path, "label": path, "conn_per_s_reps": ratios,
                               "limit_reps": ratios, "conn_per_s": 1.0, "ratio_reps": ratios,
                               "ratio": 1.0, "ratio_q1": 1.0, "ratio_q3": 1.0})
        };
        let results: Results = serde_json::from_value(serde_json::json!({
            "meta": crate::bench::results::Meta::default(),
            "e2e": [row(DIRECT_SPREAD, 20000.0), row(SW_SOCK_POD, 18000.0), row(SW_TC, 19800.0)],
            "e2e_paired": {"services": 10000, "phase_secs": 2, "repetitions": 3,
                           "limit": DIRECT_SPREAD,
                           "paths": [paired(DIRECT_SPREAD, &[1.0, 1.0, 1.0]),
                                     paired(SW_SOCK_POD, &[0.99, 0.98, 0.97])]},
        }))
        .expect("results json");
        let goals = conn(&results);
        let sock = &goals[0];
        assert_eq!(
            sock.what,
            "new TCP connections/s at 10k Services, socketlb_pod ÷ direct_spread"
        );
        assert_eq!(
            sock.measured,
            "0.980 paired (quartiles 0.980–0.990, 3 repetitions); rounds' medians 0.90 (18000 ÷ 20000)"
        );
        assert_eq!(sock.met, Some(true));
        let tc = goals
            .iter()
            .find(|g| g.what.ends_with("switchboard ÷ direct_spread"))
            .expect("tc ÷ spread");
        assert_eq!(tc.measured, "0.99 (19800 ÷ 20000)");
        assert_eq!(tc.met, Some(true));
        // A run without the light workload leaves its goals not measured.
        let light: Vec<&Goal> = goals
            .iter()
            .filter(|g| g.what.contains(", light workload, "))
            .collect();
        assert_eq!(light.len(), LIGHT.len());
        for g in light {
            assert_eq!(g.measured, "not measured in this run");
            assert_eq!(g.met, None);
        }
    }

    /// The light workload's goals read the light phase of the rows, and
    /// hold the socket layer to 0.98 × the spread.
    #[test]
    fn light_goals_read_the_light_phase() {
        let row = |path: &str, conn: f64, light: f64| {
            serde_json::json!({"path": path, "label": path, "services": 10000, "program_s": null,
                "m": {"conn_per_s": conn, "light": {"conn_per_s": light, "p50_us": null,
                      "p99_us": null, "errors": 0, "busy_us_per_conn": null,
                      "conn_per_s_rounds": [light], "conn_per_s_clients_rounds": []}}})
        };
        let results: Results = serde_json::from_value(serde_json::json!({
            "meta": crate::bench::results::Meta::default(),
            "e2e": [row(DIRECT_SPREAD, 20000.0, 40000.0), row(SW_SOCK_POD, 20000.0, 38800.0)],
        }))
        .expect("results json");
        let goals = conn(&results);
        let sock = goals
            .iter()
            .find(|g| {
                g.what
                    .ends_with("light workload, socketlb_pod ÷ direct_spread")
            })
            .expect("the light socket-layer goal");
        assert_eq!(sock.goal, "≥ 0.98");
        assert_eq!(sock.measured, "0.97 (38800 ÷ 40000)");
        assert_eq!(sock.met, Some(false));
    }
}
