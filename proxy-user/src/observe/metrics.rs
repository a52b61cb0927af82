//! Prometheus `/metrics` on `--metrics-bind-address` (default
//! `127.0.0.1:10249`, kube-proxy's port), in the OpenMetrics text format.
//!
//! | switchboard | kube-proxy counterpart |
//! |---|---|
//! | `switchboard_sync_duration_seconds` (histogram) | `kubeproxy_sync_proxy_rules_duration_seconds` |
//! | `switchboard_network_programming_duration_seconds` (histogram) | `kubeproxy_network_programming_duration_seconds` |
//! | `switchboard_event_to_map_duration_seconds` (histogram) | none |
//! | `switchboard_sync_last_timestamp_seconds` (gauge, unix seconds) | `kubeproxy_sync_proxy_rules_last_timestamp_seconds` |
//! | `switchboard_sync_unprogrammed_frontends` (gauge) | none (kube-proxy counts failed restores: `kubeproxy_sync_proxy_rules_iptables_restore_failures_total`) |
//! | `switchboard_map_entries{map}`, `switchboard_map_capacity{map}` (gauges) | none: iptables chains have no capacity (`kubeproxy_sync_proxy_rules_iptables_total` counts rules) |
//! | `switchboard_map_memory_bytes{map}` (gauge: the kernel's `memlock` of each pinned map, read once when the agent starts serving, after any resize) | none |
//! | `switchboard_service_packets_total`, `_bytes_total`, `_flows_total`, `_drops_total`, `_source_range_drops_total` `{service,frontend}` (counters) | none: the per-rule packet and byte counters `iptables -L -v` shows |
//! | `switchboard_datapath_events_total{counter}` (counters) | none: the data path's own counters (`switchboard stats`) |
//! | `switchboard_conntrack_gc_deleted_total`, `switchboard_conntrack_fill_ratio` (gauge), `switchboard_conntrack_gc_duration_seconds` (histogram), each `{family}` (`ipv4`: `SB_CT_V5`, `ipv6`: `SB_CT6_V1`) | none: the kernel's conntrack expires entries itself (`conntrack -S` counts) |
//!
//! * Sync duration: from a snapshot's arrival to the end of its map writes.
//! * Event to map: from the source recording one Service or EndpointSlice
//!   event (a watch event decoded, a file read) to the end of the map writes
//!   of the sync that applied it; the first view is not timed.
//! * Network programming latency, as kube-proxy measures it: the EndpointSlice
//!   controller stamps a slice with `endpoints.kubernetes.io/last-change-trigger-time`
//!   (RFC 3339) when the change that produced it happened (a pod turned
//!   ready, say). When a sync has programmed a slice whose trigger time is
//!   newer than the last one seen for that slice, `now - trigger` is observed
//!   once. Triggers from before the agent started are skipped: those changes
//!   were programmed by someone else, or waited for the agent to start.
//! * `service` is `namespace/name:port` and `frontend` is `address:port/PROTO`
//!   (one series per frontend: ClusterIP, NodePort, LoadBalancer and external
//!   IPs of one Service port each have their own). Drops are packets dropped
//!   because the Service had no backend.
//! * Map fill and the data path's counters are read from the pinned maps at
//!   scrape time, through handles of the metrics server's own. Counting a
//!   hash map's entries walks it (one syscall per entry): a scrape of a full
//!   connection-tracking map costs a fraction of a second, run on a blocking
//!   thread.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use crate::dataplane::flows::expiry::GcMetrics;
use crate::dataplane::pins::memory::{self, MapMemory, MapMemoryError};
use crate::dataplane::{maps::PinnedMaps, pins::MapsError};
use crate::observe::health::{bind, BindError, Serving};
use crate::observe::healthcheck::http_response;

pub use crate::model::input::TRIGGER_TIME_ANNOTATION;
use crate::model::ObjectKey;

/// The OpenMetrics text format's content type.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("opening the pinned maps for /metrics")]
    Maps(#[from] MapsError),
    #[error("reading the maps' kernel memory for /metrics")]
    Kmem(#[from] MapMemoryError),
}

/// The metrics the sync loop records. Clones share the same series.
#[derive(Clone, Debug)]
pub struct SyncMetrics {
    sync_duration: Histogram,
    programming_latency: Histogram,
    event_to_map: Histogram,
    last_sync: Gauge<f64, AtomicU64>,
    unprogrammed: Gauge,
    /// Drift repaired, by what was repaired (`programs`, `maps`, ...).
    repairs: prometheus_client::metrics::family::Family<
        [(&'static str, &'static str); 1],
        prometheus_client::metrics::counter::Counter,
    >,
    /// How long the last look at the maps and pins took.
    drift_check: Gauge<f64, AtomicU64>,
}

impl Default for SyncMetrics {
    fn default() -> SyncMetrics {
        SyncMetrics {
            // 1 ms to 16 s (kube-proxy's buckets, one more at the top).
            sync_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            // 1 ms to 5 min: the controller's stamp, the watch, the sync;
            // typically well under a second. 1-2-5 steps, so that 0.1 s (the
            // benchmark's "maps at most 100 ms behind") is a bound.
            programming_latency: Histogram::new([
                0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0,
                60.0, 120.0, 300.0,
            ]),
            // 0.1 ms to 10 s, 1-2-5 steps: an event normally reaches the
            // maps in well under a millisecond.
            event_to_map: Histogram::new([
                0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
                2.0, 5.0, 10.0,
            ]),
            last_sync: Gauge::default(),
            unprogrammed: Gauge::default(),
            repairs: Default::default(),
            drift_check: Gauge::default(),
        }
    }
}

impl SyncMetrics {
    /// Registers the series (under their full names) in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "switchboard_sync_duration_seconds",
            "Time from a change's arrival to the end of its map writes",
            self.sync_duration.clone(),
        );
        registry.register(
            "switchboard_network_programming_duration_seconds",
            "Time from an EndpointSlice's last-change-trigger-time to the end of the sync that programmed it",
            self.programming_latency.clone(),
        );
        registry.register(
            "switchboard_event_to_map_duration_seconds",
            "Time from the source recording a Service or EndpointSlice event (after the first view) to the end of the map writes of the sync that applied it",
            self.event_to_map.clone(),
        );
        registry.register(
            "switchboard_sync_last_timestamp_seconds",
            "When the last sync finished (unix seconds)",
            self.last_sync.clone(),
        );
        registry.register(
            "switchboard_repairs",
            "Drift the agent found and repaired in what it owns outside itself, by kind (programs, socket-layer, pins, maps, maglev, uplink-maps, config)",
            self.repairs.clone(),
        );
        registry.register(
            "switchboard_drift_check_seconds",
            "How long the agent's last comparison of the maps and pins with what it wants there took",
            self.drift_check.clone(),
        );
        registry.register(
            "switchboard_sync_unprogrammed_frontends",
            "Frontends the last sync could not program (a full map, ...); everything else is programmed",
            self.unprogrammed.clone(),
        );
    }
}

impl SyncMetrics {
    /// Counts one repair of `kind`.
    pub fn repaired(&self, kind: &'static str) {
        self.repairs.get_or_create(&[("kind", kind)]).inc();
    }

    /// Records how long a look at the maps and pins took.
    pub fn drift_checked(&self, took: Duration) {
        self.drift_check.set(took.as_secs_f64());
    }
}

/// What the sync loop reports after each sync: the durations, and the
/// programming latency of the EndpointSlices it programmed.
pub struct SyncObserver {
    metrics: SyncMetrics,
    latency: ProgrammingLatency,
}

impl SyncObserver {
    /// Skips trigger times from before `started` (the agent's start).
    pub fn new(started: SystemTime) -> SyncObserver {
        SyncObserver {
            metrics: SyncMetrics::default(),
            latency: ProgrammingLatency::new(started),
        }
    }

    /// The series, to serve.
    pub fn metrics(&self) -> &SyncMetrics {
        &self.metrics
    }

    /// A sync that took `elapsed`, programmed `slices` (all the source's)
    /// and left `unprogrammed` frontends out, finished at `now`.
    pub fn synced(
        &mut self,
        elapsed: Duration,
        slices: &[SliceSynced],
        arrivals: &[Instant],
        unprogrammed: usize,
        now: SystemTime,
    ) {
        self.metrics.sync_duration.observe(elapsed.as_secs_f64());
        let written = Instant::now();
        for arrived in arrivals {
            let latency = written.saturating_duration_since(*arrived);
            self.metrics.event_to_map.observe(latency.as_secs_f64());
        }
        for latency in self.latency.after_sync(slices, now) {
            self.metrics
                .programming_latency
                .observe(latency.as_secs_f64());
        }
        let unix = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        self.metrics.last_sync.set(unix);
        self.metrics
            .unprogrammed
            .set(i64::try_from(unprogrammed).unwrap_or(i64::MAX));
    }
}

/// An EndpointSlice a sync programmed: its trigger time, or its deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceSynced {
    pub key: ObjectKey,
    /// `None`: the slice was deleted.
    pub trigger: Option<Option<SystemTime>>,
}

/// The last trigger time seen per EndpointSlice, to observe each change once.
#[derive(Debug)]
pub struct ProgrammingLatency {
    started: SystemTime,
    /// The newest trigger time observed per slice.
    seen: HashMap<ObjectKey, SystemTime>,
}

impl ProgrammingLatency {
    pub fn new(started: SystemTime) -> ProgrammingLatency {
        ProgrammingLatency {
            started,
            seen: HashMap::new(),
        }
    }

    /// The latencies to observe now that a sync has programmed the changed
    /// `slices` at `now`: one per slice whose trigger time is newer than the
    /// last seen for it and not older than the agent. Deleted slices are
    /// forgotten. A trigger in the future (clock skew) counts as zero.
    pub fn after_sync(&mut self, slices: &[SliceSynced], now: SystemTime) -> Vec<Duration> {
        let mut latencies = Vec::new();
        for slice in slices {
            let Some(trigger) = slice.trigger else {
                self.seen.remove(&slice.key);
                continue;
            };
            let last = self.seen.get(&slice.key).copied();
            if let Some(t) =
                trigger.filter(|t| *t >= self.started && last.is_none_or(|last| *t > last))
            {
                latencies.push(now.duration_since(t).unwrap_or(Duration::ZERO));
                self.seen.insert(slice.key.clone(), t);
            }
        }
        latencies
    }
}

/// One Service frontend's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrontendCounters {
    /// `namespace/name:port`.
    pub service: String,
    /// `address:port/PROTO`.
    pub frontend: String,
    pub packets: u64,
    pub bytes: u64,
    pub flows: u64,
    pub drops: u64,
    /// Packets dropped by `loadBalancerSourceRanges`.
    pub denied: u64,
}

/// What the maps say at one scrape.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapReading {
    /// Map name, entries, capacity.
    pub fill: Vec<(String, u64, u64)>,
    /// The data path's counters by name.
    pub counters: Vec<(String, u64)>,
    pub frontends: Vec<FrontendCounters>,
}

/// Reads the maps at scrape time (a trait so tests can feed a fake).
pub trait ReadMaps: Send + Sync + 'static {
    fn read(&self) -> MapReading;
}

impl ReadMaps for PinnedMaps {
    fn read(&self) -> MapReading {
        let stats = crate::dataplane::maps::readback::read_stats(self);
        let services = crate::dataplane::maps::readback::read_services(self);
        MapReading {
            fill: stats
                .maps
                .iter()
                .map(|m| (m.map.to_string(), m.entries as u64, u64::from(m.capacity)))
                .collect(),
            counters: stats
                .counters
                .iter()
                .map(|(name, value)| (name.to_string(), *value))
                .collect(),
            frontends: services
                .into_iter()
                .map(|row| FrontendCounters {
                    frontend: format!("{}:{}/{}", row.address, row.port, row.protocol),
                    service: row.service,
                    packets: row.packets,
                    bytes: row.bytes,
                    flows: row.new_flows,
                    drops: row.drops_no_backend,
                    denied: row.drops_source_range,
                })
                .collect(),
        }
    }
}

/// Encodes a fresh [`MapReading`] at every scrape.
struct MapsCollector(Arc<dyn ReadMaps>);

impl fmt::Debug for MapsCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MapsCollector")
    }
}

impl Collector for MapsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let reading = self.0.read();
        let fill = |f: fn(&(String, u64, u64)) -> u64| {
            reading
                .fill
                .iter()
                .map(move |m| (vec![("map", m.0.clone())], f(m)))
        };
        gauges(
            &mut encoder,
            "switchboard_map_entries",
            "Entries in each map (read at scrape time).",
            fill(|m| m.1),
        )?;
        gauges(
            &mut encoder,
            "switchboard_map_capacity",
            "Capacity (max_entries) of each map.",
            fill(|m| m.2),
        )?;
        let per_frontend = |f: fn(&FrontendCounters) -> u64| {
            reading.frontends.iter().map(move |fe| {
                let labels = vec![
                    ("service", fe.service.clone()),
                    ("frontend", fe.frontend.clone()),
                ];
                (labels, f(fe))
            })
        };
        counters(
            &mut encoder,
            "switchboard_service_packets",
            "Packets to each Service frontend.",
            per_frontend(|fe| fe.packets),
        )?;
        counters(
            &mut encoder,
            "switchboard_service_bytes",
            "Bytes to each Service frontend.",
            per_frontend(|fe| fe.bytes),
        )?;
        counters(
            &mut encoder,
            "switchboard_service_flows",
            "New flows balanced for each Service frontend.",
            per_frontend(|fe| fe.flows),
        )?;
        counters(
            &mut encoder,
            "switchboard_service_drops",
            "Packets to each Service frontend dropped because it had no backend.",
            per_frontend(|fe| fe.drops),
        )?;
        counters(
            &mut encoder,
            "switchboard_service_source_range_drops",
            "Packets to each LoadBalancer frontend dropped because their source is outside its loadBalancerSourceRanges.",
            per_frontend(|fe| fe.denied),
        )?;
        counters(
            &mut encoder,
            "switchboard_datapath_events",
            "The data path's counters, by name (see `switchboard stats`).",
            reading
                .counters
                .iter()
                .map(|(name, value)| (vec![("counter", name.clone())], *value)),
        )
    }
}

/// The maps' kernel memory: fixed while an agent runs (see [`memory`]).
#[derive(Debug)]
struct MemoryCollector(Vec<MapMemory>);

impl Collector for MemoryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        gauges(
            &mut encoder,
            "switchboard_map_memory_bytes",
            "Kernel memory of each pinned map (memlock; a preallocated map counts every entry it can hold).",
            self.0
                .iter()
                .map(|m| (vec![("map", m.map.clone())], m.bytes)),
        )
    }
}

type Labels = Vec<(&'static str, String)>;

/// One gauge family with a sample per label set.
fn gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (Labels, u64)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One counter family (`_total` is appended) with a sample per label set.
fn counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl Iterator<Item = (Labels, u64)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in samples {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Everything `/metrics` serves: the sync loop's series and the maps.
pub fn registry(metrics: &SyncMetrics, maps: Arc<dyn ReadMaps>) -> Registry {
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    registry.register_collector(Box::new(MapsCollector(maps)));
    registry
}

/// The registry in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, registry) {
        // Only a writer error, and a String never fails.
        warn!(%error, "encoding the metrics failed");
    }
    text
}

/// Serves `/metrics` on `addr` (`--metrics-bind-address`), reading the maps
/// pinned under `pin_root` at each scrape. Must be called inside a tokio
/// runtime.
pub fn serve(
    addr: SocketAddr,
    metrics: &SyncMetrics,
    conntrack: &GcMetrics,
    pin_root: &Path,
) -> Result<Serving, MetricsError> {
    const FLAG: &str = "--metrics-bind-address";
    let maps = PinnedMaps::open(pin_root)?;
    let mut registry = registry(metrics, Arc::new(maps));
    registry.register_collector(Box::new(MemoryCollector(memory::map_memory(pin_root)?)));
    conntrack.register(&mut registry);
    let registry = Arc::new(registry);
    let listener = bind(addr, FLAG)?;
    let handler = move |request: Request<Incoming>| {
        let registry = Arc::clone(&registry);
        async move { respond(request.uri().path(), registry).await }
    };
    let serving = Serving::spawn(listener, "metrics", handler).map_err(|source| BindError {
        addr,
        flag: FLAG,
        source,
    })?;
    info!(addr = %serving.local_addr, "serving /metrics");
    Ok(serving)
}

async fn respond(path: &str, registry: Arc<Registry>) -> Response<Full<Bytes>> {
    if path != "/metrics" {
        return http_response(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "404 page not found\n",
        );
    }
    // Reading the maps walks them with syscalls: off the async workers.
    match tokio::task::spawn_blocking(move || encode(&registry)).await {
        Ok(text) => http_response(StatusCode::OK, CONTENT_TYPE, text),
        Err(error) => {
            warn!(%error, "a /metrics scrape failed");
            http_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                "scrape failed\n",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Interner, SliceInfo};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::chrono::DateTime;
    use std::collections::BTreeMap;

    struct FakeMaps(MapReading);

    impl ReadMaps for FakeMaps {
        fn read(&self) -> MapReading {
            self.0.clone()
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    fn rfc3339(t: SystemTime) -> String {
        DateTime::<k8s_openapi::chrono::Utc>::from(t).to_rfc3339()
    }

    /// A slice as a sync reports it, its trigger time read as the source
    /// reads it.
    fn slice(name: &str, trigger: Option<&str>) -> SliceSynced {
        let k8s = EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("demo".to_owned()),
                annotations: trigger
                    .map(|t| BTreeMap::from([(TRIGGER_TIME_ANNOTATION.to_owned(), t.to_owned())])),
                ..ObjectMeta::default()
            },
            ..EndpointSlice::default()
        };
        let info = SliceInfo::from_k8s(&k8s, &mut Interner::default());
        SliceSynced {
            key: info.key,
            trigger: Some(info.trigger_time),
        }
    }

    fn deleted(name: &str) -> SliceSynced {
        SliceSynced {
            key: ObjectKey::new("demo", name),
            trigger: None,
        }
    }

    #[test]
    fn programming_latency_counts_each_new_trigger_once_and_skips_old_ones() {
        let mut latency = ProgrammingLatency::new(at(100));
        let before_start = slice("a", Some(&rfc3339(at(50))));
        let fresh = slice("b", Some(&rfc3339(at(110))));
        let untagged = slice("c", None);
        let garbage = slice("d", Some("yesterday"));
        let slices = [before_start, fresh, untagged, garbage];
        assert_eq!(
            latency.after_sync(&slices, at(112)),
            [Duration::from_secs(2)],
            "only the trigger after the start"
        );
        assert!(
            latency.after_sync(&slices, at(120)).is_empty(),
            "the same trigger is not observed twice"
        );
        let newer = slice("b", Some(&rfc3339(at(130))));
        assert_eq!(
            latency.after_sync(std::slice::from_ref(&newer), at(130)),
            [Duration::ZERO]
        );
        // Deleted and written again: observed again.
        assert!(latency.after_sync(&[deleted("b")], at(140)).is_empty());
        assert_eq!(
            latency.after_sync(&[newer], at(141)),
            [Duration::from_secs(11)]
        );
        // A trigger ahead of the clock counts as zero.
        let ahead = slice("e", Some(&rfc3339(at(500))));
        assert_eq!(latency.after_sync(&[ahead], at(200)), [Duration::ZERO]);
    }

    fn reading() -> MapReading {
        MapReading {
            fill: vec![
                ("SB_FE_V1".to_owned(), 8, 65536),
                ("SB_CT_V1".to_owned(), 4, 262144),
            ],
            counters: vec![("forwarded".to_owned(), 42), ("malformed".to_owned(), 0)],
            frontends: vec![FrontendCounters {
                service: "demo/echo:http".to_owned(),
                frontend: "10.96.0.10:80/TCP".to_owned(),
                packets: 12,
                bytes: 900,
                flows: 3,
                drops: 1,
                denied: 7,
            }],
        }
    }

    #[test]
    fn rendering_has_every_series_with_its_labels() {
        let mut observer = SyncObserver::new(at(0));
        let arrived = Instant::now();
        observer.synced(
            Duration::from_millis(3),
            &[slice("b", Some(&rfc3339(at(10))))],
            &[arrived, arrived],
            2,
            at(11),
        );
        let registry = registry(observer.metrics(), Arc::new(FakeMaps(reading())));
        let text = encode(&registry);
        for line in [
            "# TYPE switchboard_sync_duration_seconds histogram",
            "switchboard_sync_duration_seconds_count 1",
            "switchboard_sync_duration_seconds_sum 0.003",
            "switchboard_sync_duration_seconds_bucket{le=\"0.004\"} 1",
            "switchboard_network_programming_duration_seconds_count 1",
            "switchboard_network_programming_duration_seconds_sum 1.0",
            "switchboard_event_to_map_duration_seconds_count 2",
            "switchboard_sync_last_timestamp_seconds 1700000011.0",
            "switchboard_sync_unprogrammed_frontends 2",
            "# TYPE switchboard_map_entries gauge",
            "switchboard_map_entries{map=\"SB_FE_V1\"} 8",
            "switchboard_map_capacity{map=\"SB_CT_V1\"} 262144",
            "# TYPE switchboard_service_packets counter",
            "switchboard_service_packets_total{service=\"demo/echo:http\",frontend=\"10.96.0.10:80/TCP\"} 12",
            "switchboard_service_bytes_total{service=\"demo/echo:http\",frontend=\"10.96.0.10:80/TCP\"} 900",
            "switchboard_service_flows_total{service=\"demo/echo:http\",frontend=\"10.96.0.10:80/TCP\"} 3",
            "switchboard_service_drops_total{service=\"demo/echo:http\",frontend=\"10.96.0.10:80/TCP\"} 1",
            "switchboard_service_source_range_drops_total{service=\"demo/echo:http\",frontend=\"10.96.0.10:80/TCP\"} 7",
            "switchboard_datapath_events_total{counter=\"forwarded\"} 42",
            "switchboard_datapath_events_total{counter=\"malformed\"} 0",
            "# EOF",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
    }

    #[test]
    fn each_scrape_reads_the_maps_again() {
        use std::sync::Mutex;
        struct Counting(Mutex<u64>);
        impl ReadMaps for Counting {
            fn read(&self) -> MapReading {
                let mut n = self.0.lock().expect("lock");
                *n += 1;
                MapReading {
                    counters: vec![("forwarded".to_owned(), *n)],
                    ..MapReading::default()
                }
            }
        }
        let registry = registry(&SyncMetrics::default(), Arc::new(Counting(Mutex::new(0))));
        assert!(encode(&registry)
            .contains("switchboard_datapath_events_total{counter=\"forwarded\"} 1\n"));
        assert!(encode(&registry)
            .contains("switchboard_datapath_events_total{counter=\"forwarded\"} 2\n"));
    }

    #[tokio::test]
    async fn only_metrics_is_served() {
        let registry = Arc::new(registry(
            &SyncMetrics::default(),
            Arc::new(FakeMaps(reading())),
        ));
        let ok = respond("/metrics", Arc::clone(&registry)).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()["content-type"], CONTENT_TYPE);
        assert_eq!(
            respond("/healthz", registry).await.status(),
            StatusCode::NOT_FOUND
        );
    }
}
