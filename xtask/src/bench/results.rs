//! The run's results as `results.json` holds them: one typed struct per
//! part, written by the run and read back by the report (and by
//! `cargo xtask bench --report-only`, from the file of an earlier run).
//!
//! Every figure a run may leave out (a part not run, a path not measured,
//! a field an older run did not write) is an `Option` or an empty list;
//! `serde_json` writes a figure that is not a number (NaN, ∞) as `null`,
//! so such figures are `Option` too. The parts `sb_bench` writes
//! (per packet, sync, forwarding, one change, the uplink, XDP forwarding)
//! keep what the report does not read in `rest`, so nothing of them is
//! lost on the way into `results.json`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::paths::Workload;
use super::stats::{median, quartiles};

/// The fields of an `sb_bench` output the report does not read.
type Rest = Map<String, Value>;

/// Everything one run measured (`results.json`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Results {
    pub meta: Meta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub perpacket: Option<PerPacket>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncOut>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fwd: Option<Fwd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2e_paths: Option<Vec<PathInfo>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2e: Option<Vec<E2eRow>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub programming: Option<Vec<Programming>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2e_program_time: Option<Vec<ProgTimeRow>>,
    /// The paired phases ([`super::paired`]); `null` when the run had none.
    #[serde(default)]
    pub e2e_paired: Option<Paired>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<Scale>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub northsouth: Option<NorthSouth>,
    /// The agent's memory, in runs from before the scale part.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rss: Vec<LegacyRss>,
}

impl Results {
    pub fn e2e(&self) -> &[E2eRow] {
        self.e2e.as_deref().unwrap_or_default()
    }

    pub fn paired(&self) -> Option<&Paired> {
        self.e2e_paired.as_ref()
    }

    /// The row of `path` at `services` Services (any size: `None`).
    pub fn e2e_row(&self, path: &str, services: Option<u64>) -> Option<&E2eRow> {
        self.e2e()
            .iter()
            .find(|r| r.path == path && (services.is_none() || r.services == services))
    }

    /// The median conn/s of `path` at `services` Services.
    pub fn conn(&self, path: &str, services: Option<u64>) -> Option<f64> {
        self.e2e_row(path, services).and_then(|r| r.m.conn_per_s)
    }

    /// The median conn/s of `path` under `workload` at `services` Services.
    pub fn conn_of(&self, workload: Workload, path: &str, services: Option<u64>) -> Option<f64> {
        let row = self.e2e_row(path, services)?;
        match workload {
            Workload::Default => row.m.conn_per_s,
            Workload::Light => row.m.light.as_ref()?.conn_per_s,
        }
    }

    /// The Services counts of the end-to-end rows, smallest first.
    pub fn e2e_sizes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.e2e().iter().filter_map(|r| r.services).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The end-to-end paths, in the run's order: `(key, label)`. From
    /// `e2e_paths` when the run wrote it, else from the rows.
    pub fn e2e_paths(&self) -> Vec<(String, String)> {
        let listed = self.e2e_paths.as_deref().unwrap_or_default();
        let mut paths: Vec<(String, String)> = Vec::new();
        let all = listed
            .iter()
            .map(|p| (&p.path, Some(&p.label)))
            .chain(self.e2e().iter().map(|r| (&r.path, r.label.as_ref())));
        for (key, label) in all {
            if paths.iter().all(|(k, _)| k != key) {
                paths.push((key.clone(), label.unwrap_or(key).clone()));
            }
        }
        paths
    }
}

/// The label of `key` among `paths` (the key itself when it has none).
pub fn label_of<'a>(paths: &'a [(String, String)], key: &'a str) -> &'a str {
    paths
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, l)| l.as_str())
        .unwrap_or(key)
}

/// The machine, the tools and the commit.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Meta {
    pub timestamp: String,
    /// `full` or `quick`.
    pub mode: String,
    pub cpu: String,
    pub cpus: u64,
    pub memory_gib: f64,
    pub kernel: String,
    pub commit: String,
    pub dirty: bool,
    pub iptables: String,
    pub nft: String,
    pub wrk: String,
    /// `SB_BENCH_SWITCHBOARD`: another build's agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switchboard_binary: Option<String>,
}

// ---------------------------------------------------------------------------
// Per packet (`sb_bench perpacket`)
// ---------------------------------------------------------------------------

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct PerPacket {
    pub frame_bytes: Option<u64>,
    pub repeat: Option<u64>,
    pub rounds: Option<u64>,
    pub empty_tc_ns: Option<f64>,
    pub empty_xdp_ns: Option<f64>,
    #[serde(default)]
    pub xdp_note: Option<String>,
    #[serde(default)]
    pub rows: Vec<PerPacketRow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<PerPacketV6>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_balance: Option<SchedulerBalance>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// One case's figure of a per-packet row (IPv4).
pub type Case = fn(&PerPacketRow) -> Option<f64>;
/// One case's figure of an IPv6 per-packet row.
pub type CaseV6 = fn(&PerPacketV6Row) -> Option<f64>;

impl PerPacket {
    /// The Services counts of the rows, in their order (repeats next to
    /// each other once).
    pub fn sizes(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .rows
            .iter()
            .filter_map(|r| r.services_nominal)
            .collect();
        v.dedup();
        v
    }

    /// The smallest and the largest Services count (1 without rows).
    pub fn smallest_largest(&self) -> (u64, u64) {
        let sizes = self.sizes();
        (
            sizes.first().copied().unwrap_or(1),
            sizes.last().copied().unwrap_or(1),
        )
    }

    /// The row at `nominal` Services whose target has `backends` backends.
    pub fn at(&self, nominal: u64, backends: u64) -> Option<&PerPacketRow> {
        self.rows
            .iter()
            .find(|r| r.services_nominal == Some(nominal) && r.target_backends == Some(backends))
    }

    /// `case` at `nominal` Services, one backend.
    pub fn ns(&self, nominal: u64, case: Case) -> Option<f64> {
        self.at(nominal, 1).and_then(case)
    }

    /// `case` of the IPv6 row at the largest size up to `largest`.
    pub fn v6_ns(&self, largest: u64, case: CaseV6) -> Option<f64> {
        self.ipv6
            .as_ref()?
            .rows
            .iter()
            .filter(|r| r.services_nominal.is_some_and(|n| n <= largest))
            .max_by_key(|r| r.services_nominal)
            .and_then(case)
    }
}

/// One Services count and target size: each case's nanoseconds.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct PerPacketRow {
    pub services_nominal: Option<u64>,
    pub target_backends: Option<u64>,
    pub from_pod_service_existing_ns: Option<f64>,
    #[serde(default)]
    pub from_pod_service_existing_no_rewrite_ns: Option<f64>,
    #[serde(default)]
    pub from_pod_service_existing_source_ranges_ns: Option<f64>,
    pub from_pod_non_service_ns: Option<f64>,
    pub to_pod_reply_ns: Option<f64>,
    #[serde(default)]
    pub to_pod_first_reply_ns: Option<f64>,
    pub to_pod_non_service_ns: Option<f64>,
    #[serde(default)]
    pub to_pod_quiet_ns: Option<f64>,
    #[serde(default)]
    pub single_shot: SingleShot,
    #[serde(default)]
    pub tracing_on: TracingOn,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SingleShot {
    pub from_pod_service_new_ns: Option<f64>,
    pub from_pod_service_existing_ns: Option<f64>,
    pub empty_tc_ns: Option<f64>,
    /// A new flow's cost under each scheduling algorithm, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_pod_service_new_by_algorithm_ns: Option<BTreeMap<String, Spread>>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// A median with its range over rounds.
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize)]
pub struct Spread {
    pub ns: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TracingOn {
    pub from_pod_service_existing_ns: Option<f64>,
    pub single_shot_from_pod_service_new_ns: Option<f64>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct PerPacketV6 {
    pub frame_bytes: Option<u64>,
    #[serde(default)]
    pub rows: Vec<PerPacketV6Row>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct PerPacketV6Row {
    pub services_nominal: Option<u64>,
    pub from_pod_service_existing_ns: Option<f64>,
    pub from_pod_non_service_ns: Option<f64>,
    pub to_pod_reply_ns: Option<f64>,
    #[serde(default)]
    pub to_pod_first_reply_ns: Option<f64>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// The schedulers' balance over mixed-length flows.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SchedulerBalance {
    pub flows: Option<u64>,
    pub backends: Option<u64>,
    pub warmup_flows: Option<u64>,
    pub lengths: Option<String>,
    #[serde(default)]
    pub rows: Option<Vec<BalanceRow>>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct BalanceRow {
    pub algorithm: Option<String>,
    pub max_over_mean_avg: Option<f64>,
    pub max_over_mean_worst: Option<f64>,
    #[serde(flatten)]
    pub rest: Rest,
}

// ---------------------------------------------------------------------------
// Control plane (`sb_bench sync`, `sb_bench change`)
// ---------------------------------------------------------------------------

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SyncOut {
    #[serde(default)]
    pub runs: Vec<SyncRun>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// Services × endpoints into the maps, the whole model at once.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SyncRun {
    pub services: Option<u64>,
    pub endpoints_per_service: Option<u64>,
    pub model_ms: Option<f64>,
    pub apply_ms: Option<f64>,
    pub noop_apply_ms: Option<f64>,
    pub map_writes: Option<u64>,
    /// One change, the whole model rebuilt (before the incremental model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_slice_change: Option<SliceChange>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SliceChange {
    #[serde(default)]
    pub total: Timing,
    #[serde(default)]
    pub model: Timing,
    #[serde(default)]
    pub apply: Timing,
    pub writes_per_change_median: Option<f64>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// Percentiles of repeated timings, in ms.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Timing {
    pub samples: Option<u64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ChangeOut {
    #[serde(default)]
    pub runs: Vec<ChangeRun>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// One change through the incremental model, at one size.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ChangeRun {
    pub services: Option<u64>,
    #[serde(default)]
    pub total: Timing,
    #[serde(default)]
    pub convert: Timing,
    #[serde(default)]
    pub model: Timing,
    #[serde(default)]
    pub apply: Timing,
    pub writes_per_change_median: Option<f64>,
    pub setup_s: Option<f64>,
    pub initial_model_s: Option<f64>,
    pub initial_apply_s: Option<f64>,
    #[serde(flatten)]
    pub rest: Rest,
}

// ---------------------------------------------------------------------------
// Forwarding rate (`sb_bench fwd`)
// ---------------------------------------------------------------------------

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Fwd {
    #[serde(default)]
    pub meta: FwdMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<String>,
    #[serde(default)]
    pub rows: Vec<FwdRow>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FwdMeta {
    pub cpu: Option<u64>,
    pub generator: Option<String>,
    pub frame_bytes: Option<u64>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct FwdRow {
    pub path: Option<String>,
    pub setup: Option<String>,
    pub mpps: Option<f64>,
    pub ns_per_packet: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reached_pods: Option<u64>,
    pub frames: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(flatten)]
    pub rest: Rest,
}

// ---------------------------------------------------------------------------
// End to end
// ---------------------------------------------------------------------------

/// One end-to-end path as the run describes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PathInfo {
    pub path: String,
    pub label: String,
    pub sandbox: String,
    pub client: String,
    pub target: String,
    pub balancer: String,
    /// The client's ephemeral port range, when the run set one.
    pub client_local_ports: Option<String>,
}

/// One path at one Services count: the medians over the rounds.
#[derive(Debug, Serialize, Deserialize)]
pub struct E2eRow {
    pub path: String,
    pub label: Option<String>,
    pub services: Option<u64>,
    pub m: E2eMedians,
    /// The time to program this size with the path's setup (none: direct).
    pub program_s: Option<f64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct E2eMedians {
    pub conn_per_s: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    #[serde(default)]
    pub errors: u64,
    #[serde(default)]
    pub udp: UdpMedians,
    #[serde(default)]
    pub bulk: Bulk,
    /// conn/s of each round.
    #[serde(default)]
    pub conn_per_s_rounds: Vec<f64>,
    /// conn/s of each wrk client, round by round.
    #[serde(default)]
    pub conn_per_s_clients_rounds: Vec<Vec<f64>>,
    /// On switchboard's paths: its counters' growth over each phase.
    #[serde(default)]
    pub datapath_rounds: Vec<Datapath>,
    /// The machine's busy CPU per connection during wrk (µs), median.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_us_per_conn: Option<f64>,
    /// The same clients against the light server (runs before it: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub light: Option<ConnMedians>,
}

/// One workload's wrk phase of a path over the rounds.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ConnMedians {
    pub conn_per_s: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub errors: u64,
    /// The machine's busy CPU per connection (µs), median.
    pub busy_us_per_conn: Option<f64>,
    pub conn_per_s_rounds: Vec<f64>,
    pub conn_per_s_clients_rounds: Vec<Vec<f64>>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct UdpMedians {
    pub rate: Option<f64>,
    /// None on the spread path, which measures no UDP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Bulk {
    pub gbit_s: Option<f64>,
}

/// switchboard's counters' growth over the wrk, UDP, stream and light
/// phases.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Datapath {
    pub http: Growth,
    pub udp: Growth,
    pub bulk: Growth,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub light: Option<Growth>,
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Growth {
    pub tc_forwarded: u64,
    pub sock_connect: u64,
    pub sock_sendmsg: u64,
}

/// The time to program the largest size with one tool.
#[derive(Debug, Serialize, Deserialize)]
pub struct Programming {
    pub tool: String,
    pub services: u64,
    pub seconds: f64,
}

/// switchboard's programs per connection on one path ([`super::progtime`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct ProgTimeRow {
    pub path: String,
    pub label: String,
    pub services: u64,
    pub conn_per_s: f64,
    pub time: ProgTime,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ProgTime {
    pub connections: u64,
    /// By program name.
    pub programs: BTreeMap<String, ProgramCost>,
    pub programs_ns_per_conn: f64,
    pub busy_ns_per_conn: f64,
    pub share: f64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ProgramCost {
    pub runs_per_conn: f64,
    pub ns_per_run: f64,
    pub ns_per_conn: f64,
}

/// The paired conn/s phases at the largest size.
#[derive(Debug, Serialize, Deserialize)]
pub struct Paired {
    pub services: u64,
    pub phase_secs: u64,
    pub repetitions: usize,
    /// The key of the limit every phase is divided by.
    pub limit: String,
    pub paths: Vec<PairedPath>,
    /// The same phases against the light server, in the same repetitions
    /// (runs before it: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub light: Vec<PairedPath>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PairedPath {
    pub path: String,
    pub label: String,
    pub conn_per_s_reps: Vec<f64>,
    /// The mean of the limit phases around each repetition's phase.
    #[serde(default)]
    pub limit_reps: Vec<f64>,
    pub conn_per_s: Option<f64>,
    pub ratio_reps: Vec<f64>,
    pub ratio: Option<f64>,
    pub ratio_q1: Option<f64>,
    pub ratio_q3: Option<f64>,
}

/// A ratio of two paths over the paired repetitions.
pub struct PairedRatio {
    pub median: f64,
    pub q1: f64,
    pub q3: f64,
    pub repetitions: usize,
}

impl Paired {
    /// The phases of `workload`.
    pub fn paths(&self, workload: Workload) -> &[PairedPath] {
        match workload {
            Workload::Default => &self.paths,
            Workload::Light => &self.light,
        }
    }

    /// `num ÷ den` of the default workload ([`Paired::ratio_of`]).
    pub fn ratio(&self, num: &str, den: &str) -> Option<PairedRatio> {
        self.ratio_of(Workload::Default, num, den)
    }

    /// `num ÷ den` of `workload`, repetition by repetition (each path's
    /// ratio to the limit phases around it, so two paths measured at
    /// different moments of a repetition are each compared at their own):
    /// its median, first and third quartiles and the number of repetitions
    /// (`None` when either path was not measured).
    pub fn ratio_of(&self, workload: Workload, num: &str, den: &str) -> Option<PairedRatio> {
        let reps = |key: &str| {
            self.paths(workload)
                .iter()
                .find(|p| p.path == key)
                .map(|p| &p.ratio_reps)
        };
        let (a, b) = (reps(num)?, reps(den)?);
        let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
        if ratios.is_empty() {
            return None;
        }
        let (q1, q3) = quartiles(&ratios);
        Some(PairedRatio {
            median: median(ratios.clone()),
            q1,
            q3,
            repetitions: ratios.len(),
        })
    }
}

// ---------------------------------------------------------------------------
// Control plane at scale
// ---------------------------------------------------------------------------

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Scale {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<ChangeOut>,
    #[serde(default)]
    pub start: Vec<StartRow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub churn: Option<Churn>,
}

/// A real agent's start, from one source at one size.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StartRow {
    /// `yaml` or `cluster`.
    pub source: String,
    pub services: u64,
    pub endpoints_per_service: u32,
    pub frontends: usize,
    pub rss_mib: f64,
    pub peak_rss_mib: f64,
    pub startup_to_synced_s: f64,
    #[serde(default)]
    pub heap: Heap,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_by_mapping: Option<RssByMapping>,
    #[serde(default)]
    pub phases: StartPhases,
    #[serde(default)]
    pub maps_kernel_mib: Option<f64>,
    #[serde(default)]
    pub ipv6_maps_kernel_mib: Option<f64>,
    /// YAML: the style the manifests are written in (`block` or `flow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yaml_style: Option<String>,
    /// YAML: the manifests' size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_mib: Option<f64>,
    /// Cluster: the objects the API server holds, and when it was up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_objects: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_load_s: Option<f64>,
    /// Cluster: watch event → map write at a fixed rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_to_map: Option<ChurnRate>,
    /// YAML: file change → new backend answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_change: Option<FileChange>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_after_churn_mib: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_after_churn_mib: Option<f64>,
}

/// The agent's heap at each step of its start (MiB), from its log.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Heap {
    pub before_source_mib: Option<f64>,
    pub source_read_mib: Option<f64>,
    pub source_read_peak_mib: Option<f64>,
    pub maps_loaded_mib: Option<f64>,
    pub changes_mib: Option<f64>,
    pub inputs_mib: Option<f64>,
    pub model_mib: Option<f64>,
    pub synced_mib: Option<f64>,
    pub peak_mib: Option<f64>,
    pub blocks: Option<f64>,
}

/// The agent's RSS by mapping (MiB), from `/proc/<pid>/smaps`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RssByMapping {
    pub binary_mib: f64,
    pub libraries_mib: f64,
    pub main_heap_mib: f64,
    pub anonymous_mib: f64,
    pub anonymous_mappings: u32,
    pub main_stack_mib: f64,
    pub threads: u64,
}

/// Where the start went (s), from the agent's log.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StartPhases {
    pub source_s: Option<f64>,
    pub load_s: Option<f64>,
    pub sync_s: Option<f64>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FileChange {
    pub services: usize,
    pub rounds_ms: Vec<u64>,
    pub median_ms: u64,
    pub max_ms: u64,
    pub failed_connections: usize,
}

/// Churn: the rates tried, the one sustained and the maps afterwards.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Churn {
    pub services: usize,
    pub behind_s: f64,
    pub achieved_min: f64,
    pub rates: Vec<ChurnRate>,
    pub sustained_per_s: Option<u32>,
    pub final_check: FinalCheck,
}

/// One rate of changes: what the bench issued and the agent observed.
/// Bounds are the histograms' bucket bounds (`None`: nothing observed, or
/// the `+Inf` bucket).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ChurnRate {
    pub rate: u32,
    pub seconds: f64,
    pub changes: u64,
    pub achieved_per_s: Option<f64>,
    pub driver_max_late_ms: f64,
    pub observed: f64,
    pub over_behind: f64,
    pub p50_le_s: Option<f64>,
    pub p99_le_s: Option<f64>,
    pub max_le_s: Option<f64>,
    /// `[bound, count]` pairs, `"+Inf"` for the last bound.
    pub buckets: Vec<Value>,
    /// The watch events the agent timed (runs before this figure: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<f64>,
    pub event_p50_le_s: Option<f64>,
    pub event_p99_le_s: Option<f64>,
    pub event_max_le_s: Option<f64>,
    pub event_buckets: Vec<Value>,
    pub passed: bool,
    pub why: String,
}

/// The churned Services in the pinned maps after the last change.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct FinalCheck {
    pub services: usize,
    pub mismatched: usize,
    pub example: Option<String>,
}

/// The agent's memory, as runs before the scale part wrote it.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct LegacyRss {
    pub services: Option<u64>,
    pub rss_mib: Option<f64>,
    pub peak_rss_mib: Option<f64>,
    pub startup_to_synced_s: Option<f64>,
    pub manifest_mib: Option<f64>,
    #[serde(flatten)]
    pub rest: Rest,
}

// ---------------------------------------------------------------------------
// North-south
// ---------------------------------------------------------------------------

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct NorthSouth {
    #[serde(default)]
    pub perpacket: UplinkPerPacket,
    #[serde(default)]
    pub xdpfwd: XdpFwd,
    #[serde(default)]
    pub paths: Option<Vec<NsPathInfo>>,
    #[serde(default)]
    pub rows: Vec<NsRow>,
    #[serde(default)]
    pub meta: NsMeta,
}

impl NorthSouth {
    /// The row of north-south path `key`.
    pub fn row(&self, key: &str) -> Option<&NsRow> {
        self.rows.iter().find(|r| r.path == key)
    }

    /// `field` of the medians of path `key`.
    pub fn m(&self, key: &str, field: fn(&NsMedians) -> Option<f64>) -> Option<f64> {
        self.row(key).and_then(|r| field(&r.m))
    }

    /// The per-packet row of `program` whose case starts with `case`.
    pub fn uplink_case(&self, program: &str, case: &str) -> Option<&UplinkRow> {
        self.perpacket
            .rows
            .iter()
            .find(|r| r.program == program && r.case.starts_with(case))
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct NsMeta {
    pub flood_cpu: Option<u64>,
    pub flood_flows: Option<u64>,
    pub flood_secs: Option<u64>,
    pub wrk_secs: Option<u64>,
    pub rounds: Option<u64>,
    pub iptables_rules: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct NsPathInfo {
    pub path: String,
    pub label: String,
    pub backends: String,
    pub via: String,
    pub client: String,
}

/// One north-south path: the medians over the rounds, and every round.
#[derive(Debug, Serialize, Deserialize)]
pub struct NsRow {
    pub path: String,
    pub label: String,
    /// `local` or `remote`.
    pub backends: String,
    pub m: NsMedians,
    #[serde(default)]
    pub rounds: Vec<NsRound>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct NsMedians {
    pub conn_per_s: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    #[serde(default)]
    pub errors: u64,
    pub flood_mpps: Option<f64>,
    pub flood_sent_mpps: Option<f64>,
    #[serde(default)]
    pub conn_per_s_rounds: Vec<f64>,
    #[serde(default)]
    pub flood_mpps_rounds: Vec<Option<f64>>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct NsRound {
    pub conn_per_s: f64,
    pub conn_per_s_clients: Vec<f64>,
    pub p50_us: f64,
    pub p99_us: f64,
    pub requests: u64,
    pub errors: u64,
    pub flood: Flood,
    /// On switchboard's paths: its counter's growth over each phase.
    pub datapath: Option<NsDatapath>,
}

/// The flood's datagrams, sent and counted at the pods.
#[derive(Debug, Serialize, Deserialize)]
pub struct Flood {
    pub mpps: Option<f64>,
    pub sent: u64,
    pub arrived: u64,
    pub arrived_per_pod: Vec<u64>,
    pub sent_mpps: Option<f64>,
    pub wall_s: Option<f64>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct NsDatapath {
    pub counter: String,
    pub during_wrk: u64,
    pub during_flood: u64,
}

/// `sb_bench uplink`: the uplink programs per packet.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct UplinkPerPacket {
    pub method: Option<String>,
    pub empty_xdp_ns: Option<f64>,
    pub empty_tc_ns: Option<f64>,
    pub repeat: Option<u64>,
    pub timer_overhead_xdp_ns: Option<f64>,
    pub timer_overhead_tc_ns: Option<f64>,
    pub check_local_single_corrected_xdp_ns: Option<f64>,
    #[serde(default)]
    pub rows: Vec<UplinkRow>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct UplinkRow {
    pub program: String,
    pub case: String,
    pub verdict: Option<String>,
    pub ns: Option<f64>,
    pub ratio: Option<f64>,
    pub empty_ns: Option<f64>,
    pub how: Option<String>,
    #[serde(flatten)]
    pub rest: Rest,
}

/// `sb_bench xdpfwd`: the uplink's forwarding rate, XDP live frames.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct XdpFwd {
    #[serde(default)]
    pub meta: XdpFwdMeta,
    /// `None` in runs from before this measurement.
    #[serde(default)]
    pub rows: Option<Vec<XdpFwdRow>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<String>,
    #[serde(flatten)]
    pub rest: Rest,
}

impl XdpFwd {
    /// The median Mpps of row `key`.
    pub fn mpps(&self, key: &str) -> Option<f64> {
        self.rows
            .as_ref()?
            .iter()
            .find(|r| r.key == key)
            .and_then(|r| r.mpps)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct XdpFwdMeta {
    pub generator: Option<String>,
    pub frames_per_run: Option<u64>,
    pub rounds: Option<u64>,
    pub cpu: Option<u64>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct XdpFwdRow {
    pub key: String,
    pub label: Option<String>,
    pub family: Option<String>,
    pub flows: Option<u64>,
    pub mpps: Option<f64>,
    pub mpps_min: Option<f64>,
    pub mpps_max: Option<f64>,
    #[serde(flatten)]
    pub rest: Rest,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `v` without the fields that are `null` (a field the types write as
    /// `null` where the run left it out says the same).
    fn without_nulls(v: Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.into_iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k, without_nulls(v)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.into_iter().map(without_nulls).collect()),
            v => v,
        }
    }

    /// The committed latest run's results.json reads into the types, and
    /// every field of it survives the way back out.
    #[test]
    fn the_latest_run_reads_and_keeps_every_field() {
        let path = crate::util::repo_root().join("xtask/results/latest/results.json");
        let text = std::fs::read_to_string(&path).expect("the committed latest run");
        let results: Results = serde_json::from_str(&text).expect("typed");
        let back = serde_json::to_value(&results).expect("serialize");
        let original: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(without_nulls(back), without_nulls(original));
    }
}
