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
    E2ePath, Workload, DIRECT, DIRECT_SPREAD, DIRECT_SW, DIRECT_SW_TC, PATHS, SW_SOCK_PINNED,
    SW_SOCK_POD, SW_TC,
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
/// costs from what the socket layer costs; the same pods reached from outside
/// the hooked cgroup, which tells what the socket hooks cost from what the
/// tc programs and the agent cost; and direct traffic held the same way with
/// no balancer at all, which tells what spreading costs there.
const PAIRED: [&str; 7] = [
    DIRECT_SPREAD,
    SW_SOCK_POD,
    SW_TC,
    DIRECT_SW,
    DIRECT_SW_TC,
    SW_SOCK_PINNED,
    DIRECT,
];

/// Seconds of one measured wrk phase.
const PHASE_SECS: u32 = 2;

/// Runs the repetitions at `n` Services; `sandbox` gives each path's
/// sandbox. Each repetition runs the phases of both workloads, the default
/// one's and then the light one's, so both see the same drift. Paths the
/// plan leaves out are left out here too; without the limit nothing is
/// measured.
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
    // One warm-up phase per path and workload (neighbours, the servers'
    // threads).
    for workload in WORKLOADS {
        for path in &paths {
            let sb = sandbox(path);
            path.prepare(sb)?;
            wrk(sb, path.client, &path.urls(workload), 1)?;
        }
    }
    let phase = |path: &E2ePath, workload: Workload| -> Result<f64> {
        let sb = sandbox(path);
        path.prepare(sb)?;
        Ok(wrk(sb, path.client, &path.urls(workload), PHASE_SECS)?.rps)
    };
    let mut phases = WORKLOADS.map(|_| Phases::new(paths.len(), reps));
    for rep in 0..reps {
        progress(&format!(
            "end to end at {n} Services, paired conn/s {}/{reps}",
            rep + 1
        ));
        for (workload, set) in WORKLOADS.into_iter().zip(&mut phases) {
            let line = set.repetition(rep, &paths, |path| phase(path, workload))?;
            match workload {
                Workload::Default => note(&line),
                Workload::Light => note(&format!("light: {line}")),
            }
        }
    }
    let [default, light] = phases;
    Ok(Some(Paired {
        services: n.into(),
        phase_secs: PHASE_SECS.into(),
        repetitions: reps,
        limit: DIRECT_SPREAD.into(),
        paths: summarize(&paths, &default),
        light: summarize(&paths, &light),
    }))
}

/// The workloads of the paired phases, in the order each repetition runs
/// them.
const WORKLOADS: [Workload; 2] = [Workload::Default, Workload::Light];

/// One workload's phases: per path, its rate in each repetition and the
/// mean of the limit phases around it.
struct Phases {
    rates: Vec<Vec<f64>>,
    refs: Vec<Vec<f64>>,
}

impl Phases {
    fn new(paths: usize, reps: usize) -> Phases {
        Phases {
            rates: vec![Vec::with_capacity(reps); paths],
            refs: vec![Vec::with_capacity(reps); paths],
        }
    }

    /// Repetition `rep`: the limit (`paths[0]`), then every other path in
    /// an order rotated by `rep`, each followed by the limit again;
    /// `phase` measures one. Returns the repetition's rates as a line.
    fn repetition(
        &mut self,
        rep: usize,
        paths: &[&E2ePath],
        mut phase: impl FnMut(&E2ePath) -> Result<f64>,
    ) -> Result<String> {
        let (limit, others) = (paths[0], &paths[1..]);
        let mut before = phase(limit)?;
        self.rates[0].push(before);
        self.refs[0].push(before);
        let mut line = vec![format!("{} {before:.0}", limit.key)];
        for k in 0..others.len() {
            let i = 1 + (k + rep) % others.len();
            let rate = phase(paths[i])?;
            let after = phase(limit)?;
            self.rates[i].push(rate);
            self.refs[i].push((before + after) / 2.0);
            line.push(format!(
                "{} {rate:.0}, {} {after:.0}",
                paths[i].key, limit.key
            ));
            before = after;
        }
        Ok(line.join(", "))
    }
}

/// Each path's rates, its ratios to the limit phases around it
/// repetition by repetition, and their median and quartiles.
fn summarize(paths: &[&E2ePath], phases: &Phases) -> Vec<PairedPath> {
    paths
        .iter()
        .zip(phases.rates.iter().zip(&phases.refs))
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
        .collect()
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
        let v = summarize(&paths, &Phases { rates, refs });
        let sock = &v[1];
        assert_eq!(sock.path, SW_SOCK_POD);
        assert!((sock.ratio.unwrap() - 0.9).abs() < 1e-9);
        assert!((sock.ratio_q1.unwrap() - 0.9).abs() < 1e-9);
        assert_eq!(v[0].ratio, Some(1.0));
    }

    #[test]
    fn two_paths_compare_through_their_own_limits() {
        let paths = paths(&[DIRECT_SPREAD, SW_SOCK_POD, SW_TC]);
        // tc ran while the limit was at 10000, the socket layer at 20000:
        // each against its own limit, the socket layer is 1.2 × tc.
        let rates = vec![vec![20000.0], vec![18000.0], vec![7500.0]];
        let refs = vec![vec![20000.0], vec![20000.0], vec![10000.0]];
        let v = Paired {
            services: 10_000,
            phase_secs: 2,
            repetitions: 1,
            limit: DIRECT_SPREAD.into(),
            paths: Vec::new(),
            light: summarize(&paths, &Phases { rates, refs }),
        };
        let r = v
            .ratio_of(Workload::Light, SW_SOCK_POD, SW_TC)
            .expect("both measured");
        assert!((r.median - 1.2).abs() < 1e-9);
        assert_eq!(r.repetitions, 1);
        assert!(
            v.ratio(SW_SOCK_POD, SW_TC).is_none(),
            "not in the default workload's phases"
        );
        assert!(v
            .ratio_of(Workload::Light, SW_SOCK_POD, DIRECT_SW)
            .is_none());
    }

    /// A repetition runs the limit between every two paths, in an order
    /// rotated by the repetition, and divides each path's rate by the mean
    /// of the limit phases on either side.
    #[test]
    fn a_repetition_alternates_with_the_limit() {
        let paths = paths(&[DIRECT_SPREAD, SW_SOCK_POD, SW_TC]);
        let mut set = Phases::new(paths.len(), 2);
        let mut order = Vec::new();
        let mut limit = 10000.0;
        for rep in 0..2 {
            set.repetition(rep, &paths, |p| {
                order.push(p.key);
                Ok(if p.key == DIRECT_SPREAD {
                    limit += 1000.0;
                    limit
                } else {
                    9000.0
                })
            })
            .expect("phases");
        }
        assert_eq!(
            order,
            [
                DIRECT_SPREAD,
                SW_SOCK_POD,
                DIRECT_SPREAD,
                SW_TC,
                DIRECT_SPREAD,
                DIRECT_SPREAD,
                SW_TC,
                DIRECT_SPREAD,
                SW_SOCK_POD,
                DIRECT_SPREAD,
            ]
        );
        // The socket layer ran between the limit at 11000 and 12000 first.
        assert_eq!(set.refs[1], [11500.0, 15500.0]);
        assert_eq!(set.rates[0], [11000.0, 14000.0]);
    }
}
