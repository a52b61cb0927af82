//! Paired conn/s: the goals' connection-rate ratios measured in many short
//! phases, each path next to its limit in time.
//!
//! A round of the end-to-end table measures every path with UDP and a bulk
//! stream in between, so the paths of one round lie minutes apart, and on
//! these machines the rate of the same path moves 6–12 % from one round to
//! the next: a median of five rounds still cannot tell 0.97 from 0.93. Here
//! the paths the conn/s goals compare run back to back in short wrk phases
//! (no UDP, no stream between them), in a rotated order per repetition; each
//! repetition gives each path's ratio to the direct spread of the same
//! repetition, and the report takes the median of those ratios with their
//! quartiles. Drift slower than one repetition (about ten seconds) cancels
//! in each ratio; what is left shows in the quartiles.

use anyhow::Result;
use serde_json::{json, Value};

use super::{median, note, prepare, progress, urls, wrk, E2ePath, Plan, PATHS};
use super::{DIRECT_SPREAD, DIRECT_SW, SW_SOCK_PINNED, SW_SOCK_POD, SW_TC};
use crate::sandbox::Sandbox;

/// The paths compared, the limit first: direct traffic spread over the
/// pods, the socket layer and tc; and the pair that holds each client to
/// one pod (the same pods reached with no Service in switchboard's sandbox,
/// and the socket layer held the same way), which tells what spreading
/// costs from what the socket layer costs.
pub(super) const PAIRED: [&str; 5] = [DIRECT_SPREAD, SW_SOCK_POD, SW_TC, DIRECT_SW, SW_SOCK_PINNED];

/// Seconds of one measured wrk phase.
const PHASE_SECS: u32 = 2;

/// How many repetitions a plan runs (none in a quick run).
pub(super) fn repetitions(plan: &Plan) -> usize {
    if plan.quick {
        0
    } else {
        plan.paired_reps
    }
}

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
    let reps = repetitions(plan);
    if reps == 0 || paths.first().map(|p| p.key) != Some(DIRECT_SPREAD) {
        return Ok(Value::Null);
    }
    // One warm-up phase per path (neighbours, the servers' threads).
    for path in &paths {
        let sb = sandbox(path);
        prepare(sb, path)?;
        wrk(sb, path.client, &urls(path), 1)?;
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::with_capacity(reps); paths.len()];
    for rep in 0..reps {
        progress(&format!(
            "end to end at {n} Services, paired conn/s {}/{reps}",
            rep + 1
        ));
        for k in 0..paths.len() {
            let i = (k + rep) % paths.len();
            let path = paths[i];
            let sb = sandbox(path);
            prepare(sb, path)?;
            let w = wrk(sb, path.client, &urls(path), PHASE_SECS)?;
            rates[i].push(w.rps);
        }
        let line: Vec<String> = paths
            .iter()
            .zip(&rates)
            .map(|(p, r)| format!("{} {:.0}", p.key, r[rep]))
            .collect();
        note(&line.join(", "));
    }
    Ok(summarize(n, &paths, &rates))
}

/// Each path's rates, its ratios to the limit (`rates[0]`) repetition by
/// repetition, and their median and quartiles.
fn summarize(n: u32, paths: &[&E2ePath], rates: &[Vec<f64>]) -> Value {
    let limit = &rates[0];
    let rows: Vec<Value> = paths
        .iter()
        .zip(rates)
        .map(|(path, r)| {
            let ratios: Vec<f64> = r.iter().zip(limit).map(|(a, b)| a / b).collect();
            let (q1, q3) = quartiles(&ratios);
            json!({
                "path": path.key,
                "label": path.label,
                "conn_per_s_reps": r,
                "conn_per_s": median(r.clone()),
                "ratio_reps": ratios,
                "ratio": median(ratios.clone()),
                "ratio_q1": q1,
                "ratio_q3": q3,
            })
        })
        .collect();
    json!({"services": n, "phase_secs": PHASE_SECS, "repetitions": limit.len(), "limit": DIRECT_SPREAD, "paths": rows})
}

/// `num ÷ den` repetition by repetition, from a [`run`]'s result: its
/// median, first and third quartiles and the number of repetitions (`None`
/// when either path was not measured).
pub(super) fn ratio(paired: &Value, num: &str, den: &str) -> Option<Paired> {
    let rates = |key: &str| -> Option<Vec<f64>> {
        let row = paired["paths"]
            .as_array()?
            .iter()
            .find(|r| r["path"] == key)?;
        row["conn_per_s_reps"]
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
        "\n### Paired conn/s ({} Services)\n\nThe paths the conn/s goals compare, back to back in {} s wrk phases (the same three clients and connections as above; no UDP or stream between them), {} repetitions in a rotated order. Each repetition's rate of a path is divided by the direct spread's rate of the same repetition; the goals take the median of these ratios, with their first and third quartiles, because a drift of the machine between the rounds above (minutes apart) moves a ratio of medians by as much as the targets' margins.\n\n| path | conn/s (median) | ÷ direct spread, paired: median | quartiles |\n|---|---|---|---|\n",
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

    #[test]
    fn ratios_pair_each_repetition_with_its_own_limit() {
        let paths: Vec<&E2ePath> = [DIRECT_SPREAD, SW_SOCK_POD]
            .iter()
            .filter_map(|k| PATHS.iter().find(|p| p.key == *k))
            .collect();
        // The machine runs at half speed in the second repetition: its
        // ratio is still 0.9, as every repetition's.
        let rates = vec![
            vec![20000.0, 10000.0, 20000.0],
            vec![18000.0, 9000.0, 18000.0],
        ];
        let v = summarize(10_000, &paths, &rates);
        let sock = &v["paths"][1];
        assert_eq!(sock["path"], SW_SOCK_POD);
        assert!((sock["ratio"].as_f64().unwrap() - 0.9).abs() < 1e-9);
        assert!((sock["ratio_q1"].as_f64().unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(v["paths"][0]["ratio"], 1.0);
        assert_eq!(v["repetitions"], 3);
    }

    #[test]
    fn quartiles_by_nearest_rank() {
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0, 5.0]), (2.0, 4.0));
        assert!(quartiles(&[]).0.is_nan());
    }
}
