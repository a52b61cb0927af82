//! Paired conn/s: the goals' connection-rate ratios measured in many short
//! phases, each path next to its limit in time.
//!
//! A round of the end-to-end table measures every path with UDP and a bulk
//! stream in between, so the paths of one round lie minutes apart, and on
//! these machines the rate of the same path moves 6–12 % from one round to
//! the next: a median of five rounds still cannot tell 0.97 from 0.93. Here
//! each path the conn/s goals compare runs in a short wrk phase between two
//! phases of the limit (the direct spread), in a rotated order per
//! repetition, with no UDP or stream in between: its rate is divided by the
//! mean of the two limit phases around it, and the report takes the median
//! of those ratios with their quartiles. Drift slower than three phases
//! cancels in each ratio; what is left shows in the quartiles.
//!
//! The limit runs between every two paths, not once per repetition: the
//! paths compared here but the limit live in switchboard's sandbox, and
//! running them back to back loaded its pods four phases in five against
//! the direct sandbox's one, which moved the socket layer's ratio by 2 %
//! (0.938 against 0.961 measured one to one at 60643ae). Alternating keeps
//! both sandboxes busy half of the time.

use anyhow::Result;
use serde_json::{json, Value};

use super::{median, note, prepare, progress, urls, wrk, E2ePath, Plan, PATHS};
use super::{DIRECT, DIRECT_SPREAD, DIRECT_SW, SW_SOCK_PINNED, SW_SOCK_POD, SW_TC};
use crate::sandbox::Sandbox;

/// The paths compared, the limit first: direct traffic spread over the
/// pods, the socket layer and tc; and the pair that holds each client to
/// one pod (the same pods reached with no Service in switchboard's sandbox,
/// and the socket layer held the same way), which tells what spreading
/// costs from what the socket layer costs; and direct traffic held the same
/// way with no balancer at all, which tells what spreading costs there.
pub(super) const PAIRED: [&str; 6] = [
    DIRECT_SPREAD,
    SW_SOCK_POD,
    SW_TC,
    DIRECT_SW,
    SW_SOCK_PINNED,
    DIRECT,
];

/// Seconds of one measured wrk phase.
const PHASE_SECS: u32 = 2;

/// Runs the repetitions at `n` Services; `sandbox` gives each path's
/// sandbox. Paths the plan leaves out are left out here too; without the
/// limit nothing is measured.
pub(super) fn run<'a>(
    plan: &Plan,
    n: u32,
    sandbox: impl Fn(&E2ePath) -> &'a Sandbox,
) -> Result<Value> {
    let paths: Vec<&E2ePath> = PAIRED
        .iter()
        .filter(|key| plan.measures(key))
        .filter_map(|key| PATHS.iter().find(|p| p.key == *key))
        .collect();
    let reps = plan.paired_reps;
    if reps == 0 || paths.first().map(|p| p.key) != Some(DIRECT_SPREAD) {
        return Ok(Value::Null);
    }
    // One warm-up phase per path (neighbours, the servers' threads).
    for path in &paths {
        let sb = sandbox(path);
        prepare(sb, path)?;
        wrk(sb, path.client, &urls(path), 1)?;
    }
    let (limit, others) = (paths[0], &paths[1..]);
    let phase = |path: &E2ePath| -> Result<f64> {
        let sb = sandbox(path);
        prepare(sb, path)?;
        Ok(wrk(sb, path.client, &urls(path), PHASE_SECS)?.rps)
    };
    // Per path: its rate and the mean of the limit phases around it.
    let mut rates: Vec<Vec<f64>> = vec![Vec::with_capacity(reps); paths.len()];
    let mut refs: Vec<Vec<f64>> = vec![Vec::with_capacity(reps); paths.len()];
    for rep in 0..reps {
        progress(&format!(
            "end to end at {n} Services, paired conn/s {}/{reps}",
            rep + 1
        ));
        let mut before = phase(limit)?;
        rates[0].push(before);
        refs[0].push(before);
        let mut line = vec![format!("{} {before:.0}", limit.key)];
        for k in 0..others.len() {
            let i = 1 + (k + rep) % others.len();
            let rate = phase(paths[i])?;
            let after = phase(limit)?;
            rates[i].push(rate);
            refs[i].push((before + after) / 2.0);
            line.push(format!(
                "{} {rate:.0}, {} {after:.0}",
                paths[i].key, limit.key
            ));
            before = after;
        }
        note(&line.join(", "));
    }
    Ok(summarize(n, &paths, &rates, &refs))
}

/// Each path's rates, its ratios to the limit phases around it
/// (`refs`) repetition by repetition, and their median and quartiles.
fn summarize(n: u32, paths: &[&E2ePath], rates: &[Vec<f64>], refs: &[Vec<f64>]) -> Value {
    let rows: Vec<Value> = paths
        .iter()
        .zip(rates.iter().zip(refs))
        .map(|(path, (r, around))| {
            let ratios: Vec<f64> = r.iter().zip(around).map(|(a, b)| a / b).collect();
            let (q1, q3) = quartiles(&ratios);
            json!({
                "path": path.key,
                "label": path.label,
                "conn_per_s_reps": r,
                "limit_reps": around,
                "conn_per_s": median(r.clone()),
                "ratio_reps": ratios,
                "ratio": median(ratios.clone()),
                "ratio_q1": q1,
                "ratio_q3": q3,
            })
        })
        .collect();
    json!({"services": n, "phase_secs": PHASE_SECS, "repetitions": rates[0].len(), "limit": DIRECT_SPREAD, "paths": rows})
}

/// `num ÷ den` repetition by repetition, from a [`run`]'s result (each
/// path's ratio to the limit phases around it, so two paths measured at
/// different moments of a repetition are each compared at their own): its
/// median, first and third quartiles and the number of repetitions (`None`
/// when either path was not measured).
pub(super) fn ratio(paired: &Value, num: &str, den: &str) -> Option<Paired> {
    let rates = |key: &str| -> Option<Vec<f64>> {
        let row = paired["paths"]
            .as_array()?
            .iter()
            .find(|r| r["path"] == key)?;
        row["ratio_reps"]
            .as_array()
            .map(|v| v.iter().filter_map(Value::as_f64).collect())
    };
    let (a, b) = (rates(num)?, rates(den)?);
    let ratios: Vec<f64> = a.iter().zip(&b).map(|(a, b)| a / b).collect();
    if ratios.is_empty() {
        return None;
    }
    let (q1, q3) = quartiles(&ratios);
    Some(Paired {
        median: median(ratios.clone()),
        q1,
        q3,
        repetitions: ratios.len(),
    })
}

/// A ratio of two paths over the paired repetitions.
pub(super) struct Paired {
    pub median: f64,
    pub q1: f64,
    pub q3: f64,
    pub repetitions: usize,
}

/// The report's section: each path's median rate and its ratio to the
/// limit with the quartiles (empty when the run had no paired phases).
pub(super) fn report_md(paired: &Value) -> String {
    let Some(rows) = paired["paths"].as_array() else {
        return String::new();
    };
    let mut md = format!(
        "\n### Paired conn/s ({} Services)\n\nEach path the conn/s goals compare, in a {} s wrk phase between two phases of the direct spread (the same three clients and connections as above; no UDP or stream in between), {} repetitions in a rotated order. A path's rate is divided by the mean of the two direct-spread phases around it; the goals take the median of these ratios, with their first and third quartiles, because a drift of the machine between the rounds above (minutes apart) moves a ratio of medians by as much as the targets' margins. The direct spread runs between every two paths so that its sandbox and switchboard's are each busy half of the time.\n\n| path | conn/s (median) | ÷ direct spread, paired: median | quartiles |\n|---|---|---|---|\n",
        paired["services"], paired["phase_secs"], paired["repetitions"]
    );
    for row in rows {
        let f = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
        md.push_str(&format!(
            "| {} | {:.0} | {:.3} | {:.3}–{:.3} |\n",
            row["label"].as_str().unwrap_or(""),
            f("conn_per_s"),
            f("ratio"),
            f("ratio_q1"),
            f("ratio_q3")
        ));
    }
    md
}

/// What the paired phases take apart, for the report's "what limits
/// them": the socket layer's own work (held to one pod per client, against
/// the same client with no Service in the same sandbox), what spreading
/// costs (the socket layer spreading, against it held to one pod), and tc
/// against the socket layer. Empty without paired phases.
pub(super) fn limits_md(paired: &Value) -> String {
    let line = |num: &str, den: &str, what: &str| {
        ratio(paired, num, den).map(|p| {
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

/// The first and third quartiles (nearest rank).
fn quartiles(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
    (at(0.25), at(0.75))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(keys: &[&str]) -> Vec<&'static E2ePath> {
        keys.iter()
            .filter_map(|k| PATHS.iter().find(|p| p.key == *k))
            .collect()
    }

    #[test]
    fn each_phase_is_divided_by_the_limit_around_it() {
        let paths = paths(&[DIRECT_SPREAD, SW_SOCK_POD]);
        // The machine runs at half speed in the second repetition: that
        // repetition's ratio is still 0.9, as every other's.
        let rates = vec![
            vec![20000.0, 10000.0, 20000.0],
            vec![18000.0, 9000.0, 17100.0],
        ];
        let refs = vec![rates[0].clone(), vec![20000.0, 10000.0, 19000.0]];
        let v = summarize(10_000, &paths, &rates, &refs);
        let sock = &v["paths"][1];
        assert_eq!(sock["path"], SW_SOCK_POD);
        assert!((sock["ratio"].as_f64().unwrap() - 0.9).abs() < 1e-9);
        assert!((sock["ratio_q1"].as_f64().unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(v["paths"][0]["ratio"], 1.0);
        assert_eq!(v["repetitions"], 3);
    }

    #[test]
    fn two_paths_compare_through_their_own_limits() {
        let paths = paths(&[DIRECT_SPREAD, SW_SOCK_POD, SW_TC]);
        // tc ran while the limit was at 10000, the socket layer at 20000:
        // each against its own limit, the socket layer is 1.2 × tc.
        let rates = vec![vec![20000.0], vec![18000.0], vec![7500.0]];
        let refs = vec![vec![20000.0], vec![20000.0], vec![10000.0]];
        let v = summarize(10_000, &paths, &rates, &refs);
        let r = ratio(&v, SW_SOCK_POD, SW_TC).expect("both measured");
        assert!((r.median - 1.2).abs() < 1e-9);
        assert_eq!(r.repetitions, 1);
        assert!(ratio(&v, SW_SOCK_POD, DIRECT_SW).is_none());
    }

    #[test]
    fn quartiles_by_nearest_rank() {
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0, 5.0]), (2.0, 4.0));
        assert!(quartiles(&[]).0.is_nan());
    }
}
