//! What one run measures: the parts (`SB_BENCH_ONLY`), the Services
//! counts, rounds, phase lengths and paths, from `--quick` and the
//! environment.

use anyhow::{anyhow, ensure, Context, Result};

use super::paths::PATHS;

/// A part of the benchmark that runs alone (`SB_BENCH_ONLY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// `e2e`: the end-to-end rows.
    E2e,
    /// `north-south`.
    NorthSouth,
    /// `scale`: the control plane at scale.
    Scale,
    /// `start`: only the agent start and memory rows of `scale`.
    Start,
}

impl Part {
    /// The name `SB_BENCH_ONLY` takes, which also names the run's folder.
    pub fn name(self) -> &'static str {
        match self {
            Part::E2e => "e2e",
            Part::NorthSouth => "north-south",
            Part::Scale => "scale",
            Part::Start => "start",
        }
    }
}

/// `SB_BENCH_ONLY=north-south` (or `scale`, or `e2e`) runs only that part
/// (and the report); `start` only the agent start and memory rows of
/// `scale`; unset, everything runs.
pub fn only() -> Result<Option<Part>> {
    match std::env::var("SB_BENCH_ONLY") {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => [Part::E2e, Part::NorthSouth, Part::Scale, Part::Start]
            .into_iter()
            .find(|p| p.name() == v)
            .map(Some)
            .ok_or_else(|| {
                anyhow!(
                    "SB_BENCH_ONLY={v}: the parts that run alone are e2e, north-south, scale and start"
                )
            }),
        Err(_) => Ok(None),
    }
}

/// What one run measures; `--quick` shrinks it to stay short.
pub struct Plan {
    pub quick: bool,
    pub e2e_sizes: Vec<u32>,
    /// Services counts of the agent start and memory rows (`scale`).
    pub scale_sizes: Vec<u32>,
    pub wrk_secs: u32,
    pub udp_ms: u32,
    pub bulk_ms: u32,
    pub fwd_frames: u32,
    /// Interleaved rounds per size (the report takes the median).
    pub rounds: usize,
    /// Rounds at the largest size, whose rows the goals quote: one round
    /// moves 6–12 % on these machines, so a median of three cannot tell
    /// 0.97 from 0.93.
    pub rounds_at_max: usize,
    /// The end-to-end paths measured (their keys); all when `None`.
    pub paths: Option<Vec<String>>,
    /// Repetitions of the paired conn/s phases at the largest size
    /// ([`paired`]; none in a quick run unless `SB_BENCH_PAIRED` asks).
    pub paired_reps: usize,
}

/// Services counts, comma separated, from the environment variable `name`
/// (`None` when unset).
fn sizes_from_env(name: &str) -> Result<Option<Vec<u32>>> {
    let Ok(v) = std::env::var(name) else {
        return Ok(None);
    };
    let sizes: Vec<u32> = v
        .split(',')
        .map(|n| n.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("{name}={v}: Services counts, comma separated"))?;
    ensure!(!sizes.is_empty(), "{name} is empty");
    Ok(Some(sizes))
}

impl Plan {
    pub fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                quick,
                e2e_sizes: vec![1, 1000],
                scale_sizes: vec![1000, 10_000],
                wrk_secs: 2,
                udp_ms: 1000,
                bulk_ms: 1000,
                fwd_frames: 1_000_000,
                rounds: 1,
                rounds_at_max: 1,
                paths: None,
                paired_reps: 0,
            }
        } else {
            Plan {
                quick,
                e2e_sizes: vec![1, 1000, 10_000],
                scale_sizes: vec![1000, 10_000, 100_000],
                wrk_secs: 5,
                udp_ms: 2000,
                bulk_ms: 2000,
                fwd_frames: 5_000_000,
                rounds: 3,
                rounds_at_max: 5,
                paths: None,
                paired_reps: 15,
            }
        }
    }
}

impl Plan {
    /// The end-to-end sizes, rounds and paths from `SB_BENCH_E2E_SIZES`
    /// (comma separated Services counts; `SB_BENCH_SCALE_SIZES` the same
    /// for the agent start and memory rows), `SB_BENCH_ROUNDS` and
    /// `SB_BENCH_PATHS` (comma separated path keys), when set: a run that
    /// looks at a few paths at one size closely.
    pub fn overridden(mut self) -> Result<Plan> {
        if let Some(sizes) = sizes_from_env("SB_BENCH_E2E_SIZES")? {
            self.e2e_sizes = sizes;
        }
        if let Some(sizes) = sizes_from_env("SB_BENCH_SCALE_SIZES")? {
            self.scale_sizes = sizes;
        }
        if let Ok(v) = std::env::var("SB_BENCH_ROUNDS") {
            self.rounds = v
                .parse()
                .with_context(|| format!("SB_BENCH_ROUNDS={v}: a number of rounds"))?;
            ensure!(self.rounds > 0, "SB_BENCH_ROUNDS must be at least 1");
            self.rounds_at_max = self.rounds;
        }
        if let Ok(v) = std::env::var("SB_BENCH_PAIRED") {
            self.paired_reps = v
                .parse()
                .with_context(|| format!("SB_BENCH_PAIRED={v}: a number of repetitions"))?;
        }
        if let Ok(v) = std::env::var("SB_BENCH_PATHS") {
            let keys: Vec<String> = v.split(',').map(|k| k.trim().to_string()).collect();
            for key in &keys {
                ensure!(
                    PATHS.iter().any(|p| p.key == key),
                    "SB_BENCH_PATHS: no end-to-end path {key} (the paths: {})",
                    PATHS.iter().map(|p| p.key).collect::<Vec<_>>().join(", ")
                );
            }
            self.paths = Some(keys);
        }
        Ok(self)
    }

    /// Interleaved rounds at `n` Services.
    pub fn rounds_at(&self, n: u32) -> usize {
        if self.e2e_sizes.iter().max() == Some(&n) {
            self.rounds_at_max
        } else {
            self.rounds
        }
    }

    /// Progress steps of the end-to-end part: per size, the programming,
    /// every path in every round and (full runs) the programs' time.
    pub fn e2e_steps(&self) -> usize {
        self.e2e_sizes
            .iter()
            .map(|&n| 1 + PATHS.len() * self.rounds_at(n) + usize::from(!self.quick))
            .sum::<usize>()
            + self.paired_reps
    }

    /// Whether the end-to-end path `key` is measured in this run.
    pub fn measures(&self, key: &str) -> bool {
        self.paths
            .as_ref()
            .is_none_or(|keys| keys.iter().any(|k| k == key))
    }
}
