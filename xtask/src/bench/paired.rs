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

use super::clients::wrk;
use super::paths::{
    E2ePath, DIRECT, DIRECT_SPREAD, DIRECT_SW, PATHS, SW_SOCK_PINNED, SW_SOCK_POD, SW_TC,
};
use super::plan::Plan;
use super::progress::{note, progress};
use super::results::{Paired, PairedPath};
use super::stats::{median, quartiles};
use crate::sandbox::Sandbox;

/// The paths compared, the limit first: direct traffic spread over the
/// pods, the socket layer and tc; and the pair that holds each client to
/// one pod (the same pods reached with no Service in switchboard's sandbox,
/// and the socket layer held the same way), which tells what spreading
/// costs from what the socket layer costs; and direct traffic held the same
/// way with no balancer at all, which tells what spreading costs there.
const PAIRED: [&str; 6] = [
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
pub fn run<'a>(
    plan: &Plan,
    n: u32,
    sandbox: impl Fn(&E2ePath) -> &'a Sandbox,
) -> Result<Option<Paired>> {
    let paths: Vec<&E2ePath> = PAIRED
        .iter()
        .filter(|key| plan.measures(key))
        .filter_map(|key| PATHS.iter().find(|p| p.key == *key))
        .collect();
    let reps = plan.paired_reps;
    if reps == 0 || paths.first().map(|p| p.key) != Some(DIRECT_SPREAD) {
        return Ok(None);
    }
    // One warm-up phase per path (neighbours, the servers' threads).
    for path in &paths {
        let sb = sandbox(path);
        path.prepare(sb)?;
        wrk(sb, path.client, &path.urls(), 1)?;
    }
    let (limit, others) = (paths[0], &paths[1..]);
    let phase = |path: &E2ePath| -> Result<f64> {
        let sb = sandbox(path);
        path.prepare(sb)?;
        Ok(wrk(sb, path.client, &path.urls(), PHASE_SECS)?.rps)
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
    Ok(Some(summarize(n, &paths, &rates, &refs)))
}

/// Each path's rates, its ratios to the limit phases around it
/// (`refs`) repetition by repetition, and their median and quartiles.
fn summarize(n: u32, paths: &[&E2ePath], rates: &[Vec<f64>], refs: &[Vec<f64>]) -> Paired {
    let rows = paths
        .iter()
        .zip(rates.iter().zip(refs))
        .map(|(path, (r, around))| {
            let ratios: Vec<f64> = r.iter().zip(around).map(|(a, b)| a / b).collect();
            let (q1, q3) = quartiles(&ratios);
            let finite = |x: f64| x.is_finite().then_some(x);
            PairedPath {
                path: path.key.into(),
                label: path.label.into(),
                conn_per_s_reps: r.clone(),
                limit_reps: around.clone(),
                conn_per_s: finite(median(r.clone())),
                ratio: finite(median(ratios.clone())),
                ratio_reps: ratios,
                ratio_q1: finite(q1),
                ratio_q3: finite(q3),
            }
        })
        .collect();
    Paired {
        services: n.into(),
        phase_secs: PHASE_SECS.into(),
        repetitions: rates[0].len(),
        limit: DIRECT_SPREAD.into(),
        paths: rows,
    }
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
        let sock = &v.paths[1];
        assert_eq!(sock.path, SW_SOCK_POD);
        assert!((sock.ratio.unwrap() - 0.9).abs() < 1e-9);
        assert!((sock.ratio_q1.unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(v.paths[0].ratio, Some(1.0));
        assert_eq!(v.repetitions, 3);
    }

    #[test]
    fn two_paths_compare_through_their_own_limits() {
        let paths = paths(&[DIRECT_SPREAD, SW_SOCK_POD, SW_TC]);
        // tc ran while the limit was at 10000, the socket layer at 20000:
        // each against its own limit, the socket layer is 1.2 × tc.
        let rates = vec![vec![20000.0], vec![18000.0], vec![7500.0]];
        let refs = vec![vec![20000.0], vec![20000.0], vec![10000.0]];
        let v = summarize(10_000, &paths, &rates, &refs);
        let r = v.ratio(SW_SOCK_POD, SW_TC).expect("both measured");
        assert!((r.median - 1.2).abs() < 1e-9);
        assert_eq!(r.repetitions, 1);
        assert!(v.ratio(SW_SOCK_POD, DIRECT_SW).is_none());
    }
}
