//! Connection tracking's garbage collector: the agent removes flows that
//! have expired by their protocol state, instead of letting an LRU table
//! evict whatever was used least recently (an idle database connection
//! lost to a burst of short ones).
//!
//! Each address family has its table: `SB_CT_V5` (IPv4, [`CtKey`]) and
//! `SB_CT6_V1` (IPv6, [`CtKey6`]), with the same fields and meaning; the
//! logic below is written once over the [`Key`] and [`Entry`] traits.
//!
//! Each table is a plain hash (allocated per entry). Each flow has two entries,
//! forward and reply; the data path stamps each with the last time a packet
//! of its direction passed (at most once a second) and the TCP state it saw
//! in that direction ([`ct_state`]). A flow expires as a whole: its phase
//! comes from the union of both entries' state and its age from the newer of
//! their time stamps. An entry whose partner is missing (an orphan) goes once
//! it has been idle for [`ORPHAN_GRACE`].
//!
//! | phase | when | timeout (flag) |
//! |---|---|---|
//! | `syn-sent` | TCP, no reply seen | 60 s (`--conntrack-tcp-timeout-syn`) |
//! | `established` | TCP, answered, no FIN | 24 h (`--conntrack-tcp-timeout-established`) |
//! | `half-closed` | TCP, FIN one way | 1 h (`--conntrack-tcp-timeout-close-wait`) |
//! | `closed` | TCP, FIN both ways or RST | 10 s (`--conntrack-tcp-timeout-closed`) |
//! | `udp` | UDP, no reply seen | 30 s (`--conntrack-udp-timeout`) |
//! | `udp-stream` | UDP, replies seen | 120 s (`--conntrack-udp-timeout-stream`) |
//!
//! A closed flow that was source-NATed stays at least
//! [`snat::REUSE_AFTER_NS`] after its close, so its port is not given to a
//! new flow while the backend may still hold the old one in TIME_WAIT.
//!
//! The collector runs on a thread of its own with its own map handles. It
//! walks both tables with batched lookups, and waits between passes from 1 s
//! (the fuller table over 75% full) to 30 s (both nearly empty); a new
//! `ct_full` count (a flow refused because a table was full; the counter is
//! shared by both families) starts a pass within a second. However full the
//! tables, it waits at least [`PACE`] times as long as its last pass took, so
//! its cost stays bounded (5% of a core) while a flood fills them.

use std::{
    collections::HashMap as StdHashMap,
    path::Path,
    sync::atomic::AtomicU64,
    time::{Duration, Instant},
};

use aya::maps::{HashMap, IterableMap as _, MapData, PerCpuArray};
use prometheus_client::{
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};
use proxy_common::{ct_dir, ct_flags, ct_state, names, proto, snat, stat, CtEntry, CtKey, CtKey6};

pub use crate::dataplane::flows::entry::{Entry, Key};
pub use crate::util::clock::monotonic_ns;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::dataplane::{
    flows::generation::CtGeneration,
    flows::open_counts::{self, LeastConnMaps, OpenFlowMetrics, Tally},
    flows::quiet_pods::{self, Candidates, LiveClients, Look, QuietPods},
    pins::{MapsError, Pins},
};

/// How long an entry whose partner is missing may stay idle.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(10);

/// The longest wait between passes (a nearly empty table).
pub const MAX_INTERVAL: Duration = Duration::from_secs(30);
/// The shortest (a table over [`BUSY_FILL`] full).
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Above this fill the collector runs every [`MIN_INTERVAL`].
pub const BUSY_FILL: f64 = 0.75;
/// A pass is followed by a wait of at least this many times its length, so
/// the collector takes at most 1/(1 + PACE) of a core however large and
/// full the tables are (a full table of 512k entries takes a few hundred
/// milliseconds to walk). The data path does not need it faster: a full
/// table makes room among unestablished flows itself (`proxy-ebpf/src/ct/mod.rs`).
pub const PACE: u32 = 19;

/// How long each phase of a flow lasts without traffic. The defaults are
/// kube-proxy's (`--conntrack-tcp-timeout-established` 24 h,
/// `--conntrack-tcp-timeout-close-wait` 1 h) and the kernel's
/// (`nf_conntrack_udp_timeout` 30 s, `_stream` 120 s, `tcp_timeout_syn_sent`
/// 120 s shortened to a minute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    pub tcp_established: Duration,
    pub tcp_close_wait: Duration,
    pub tcp_closed: Duration,
    pub tcp_syn: Duration,
    pub udp: Duration,
    pub udp_stream: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            tcp_established: Duration::from_secs(24 * 3600),
            tcp_close_wait: Duration::from_secs(3600),
            tcp_closed: Duration::from_secs(10),
            tcp_syn: Duration::from_secs(60),
            udp: Duration::from_secs(30),
            udp_stream: Duration::from_secs(120),
        }
    }
}

/// Where a flow is, from what both of its entries saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    SynSent,
    /// TCP, the backend answered, but the client has not acknowledged the
    /// SYN-ACK: a handshake in progress, or a spoofed SYN.
    SynRecv,
    Established,
    HalfClosed,
    Closed,
    Udp,
    UdpStream,
}

impl Phase {
    /// The name `switchboard conntrack list` shows.
    pub fn name(self) -> &'static str {
        match self {
            Phase::SynSent => "syn-sent",
            Phase::SynRecv => "syn-recv",
            Phase::Established => "established",
            Phase::HalfClosed => "half-closed",
            Phase::Closed => "closed",
            Phase::Udp => "udp",
            Phase::UdpStream => "udp-stream",
        }
    }

    /// How long the phase lasts without traffic.
    pub fn timeout(self, t: &Timeouts) -> Duration {
        match self {
            Phase::SynSent | Phase::SynRecv => t.tcp_syn,
            Phase::Established => t.tcp_established,
            Phase::HalfClosed => t.tcp_close_wait,
            Phase::Closed => t.tcp_closed,
            Phase::Udp => t.udp,
            Phase::UdpStream => t.udp_stream,
        }
    }
}

/// The phase of a flow of protocol `protocol` whose entries carry `flags`
/// ([`ct_flags`], both entries') and whose forward entry saw `forward` and
/// reply entry saw `reply` ([`ct_state`] bits). A TCP flow is established
/// once the client acknowledged the backend's SYN-ACK ([`ct_state::ACKED`]).
pub fn phase(protocol: u8, flags: u8, forward: u8, reply: u8) -> Phase {
    if flags & ct_flags::DSR_BALANCED != 0 {
        return balanced_phase(protocol, forward);
    }
    let both = forward | reply;
    if protocol != proto::TCP {
        return match reply & ct_state::REPLIED {
            0 => Phase::Udp,
            _ => Phase::UdpStream,
        };
    }
    if both & ct_state::RST != 0 {
        Phase::Closed
    } else if reply & ct_state::REPLIED == 0 {
        Phase::SynSent
    } else if forward & reply & ct_state::FIN != 0 {
        Phase::Closed
    } else if both & ct_state::FIN != 0 {
        Phase::HalfClosed
    } else if forward & ct_state::ACKED == 0 {
        Phase::SynRecv
    } else {
        Phase::Established
    }
}

/// The phase of a flow this node returned directly
/// ([`ct_flags::DSR_BALANCED`]): the backend's node answers the client, so
/// only the client's packets (`forward`) pass here. TCP is established once
/// the client acknowledged the SYN-ACK, and closed at its FIN or RST (its
/// ACKs of the server's last data keep it alive until they stop); UDP is a
/// stream, since its replies are never seen.
fn balanced_phase(protocol: u8, forward: u8) -> Phase {
    if protocol != proto::TCP {
        Phase::UdpStream
    } else if forward & (ct_state::FIN | ct_state::RST) != 0 {
        Phase::Closed
    } else if forward & ct_state::ACKED != 0 {
        Phase::Established
    } else {
        Phase::SynSent
    }
}

/// One flow as the collector judges it: its entries, either may be missing.
#[derive(Clone, Copy, Debug)]
pub struct Flow<'a, E = CtEntry> {
    pub protocol: u8,
    pub forward: Option<&'a E>,
    pub reply: Option<&'a E>,
}

/// Why a flow expires, and when (CLOCK_MONOTONIC nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `None`: an orphan (one entry without its partner).
    pub phase: Option<Phase>,
    pub expires_ns: u64,
}

/// When `flow` expires: its newest time stamp plus its phase's timeout (an
/// orphan's: [`ORPHAN_GRACE`]); a closed source-NATed flow not before its
/// port may be reused. `None` when the flow has no entry at all.
pub fn verdict<E: Entry>(flow: &Flow<E>, t: &Timeouts) -> Option<Verdict> {
    let entries = [flow.forward, flow.reply];
    let last_seen = entries.iter().flatten().map(|e| e.last_seen_ns()).max()?;
    let (Some(forward), Some(reply)) = (flow.forward, flow.reply) else {
        return Some(Verdict {
            phase: None,
            expires_ns: last_seen.saturating_add(nanos(ORPHAN_GRACE)),
        });
    };
    let flags = forward.flags() | reply.flags();
    let phase = phase(flow.protocol, flags, forward.state(), reply.state());
    let mut expires_ns = last_seen.saturating_add(nanos(phase.timeout(t)));
    if flags & ct_flags::SNAT != 0 && flags & ct_flags::CLOSING != 0 {
        // `created_ns` is the close time once CLOSING is set.
        let closed_ns = forward.created_ns().max(reply.created_ns());
        expires_ns = expires_ns.max(closed_ns.saturating_add(snat::REUSE_AFTER_NS));
    }
    Some(Verdict {
        phase: Some(phase),
        expires_ns,
    })
}

/// Whether `flow` has expired at `now_ns` (CLOCK_MONOTONIC).
pub fn expired<E: Entry>(flow: &Flow<E>, now_ns: u64, t: &Timeouts) -> bool {
    verdict(flow, t).is_none_or(|v| now_ns >= v.expires_ns)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The key of the other entry of the flow `key` and `entry` belong to
/// (the data path's encoding: a source-NATed flow's reply comes back to the
/// node's, or the hairpin, address and port). The same for both families.
pub fn partner_key<K: Key>(key: &K, entry: &K::Entry) -> K {
    let snat = entry.flags() & ct_flags::SNAT != 0;
    if key.dir() == ct_dir::REPLY {
        let src = match snat {
            true => entry.snat(),
            false => key.dst(),
        };
        K::new(src, entry.nat(), key.proto(), ct_dir::FORWARD)
    } else {
        let dst = match snat {
            true => entry.snat(),
            false => key.src(),
        };
        K::new(entry.nat(), dst, key.proto(), ct_dir::REPLY)
    }
}

/// A flow's keys as found in a table: its forward and reply entry, or one
/// orphan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlowKeys<K = CtKey> {
    Pair { forward: K, reply: K },
    Orphan(K),
}

impl<K: Key> FlowKeys<K> {
    pub fn keys(&self) -> impl Iterator<Item = K> {
        let (a, b) = match *self {
            FlowKeys::Pair { forward, reply } => (forward, Some(reply)),
            FlowKeys::Orphan(key) => (key, None),
        };
        std::iter::once(a).chain(b)
    }

    /// The flow's protocol.
    pub fn proto(&self) -> u8 {
        match self {
            FlowKeys::Pair { forward, .. } => forward.proto(),
            FlowKeys::Orphan(key) => key.proto(),
        }
    }
}

/// The flows of `table`, each once: a pair when both entries name each
/// other, else each entry as an orphan.
pub fn flows<K: Key>(table: &StdHashMap<K, K::Entry>) -> Vec<FlowKeys<K>> {
    let mut out = Vec::new();
    for (key, entry) in table {
        let other = partner_key(key, entry);
        let paired = table
            .get(&other)
            .is_some_and(|p| partner_key(&other, p) == *key);
        match (paired, key.dir() == ct_dir::FORWARD) {
            (true, true) => out.push(FlowKeys::Pair {
                forward: *key,
                reply: other,
            }),
            // Listed from its forward side.
            (true, false) => {}
            (false, _) => out.push(FlowKeys::Orphan(*key)),
        }
    }
    out
}

/// The flow `keys` names, its entries read from `get`: (forward, reply).
pub fn entries<K: Key>(
    keys: &FlowKeys<K>,
    get: impl Fn(&K) -> Option<K::Entry>,
) -> (Option<K::Entry>, Option<K::Entry>) {
    match *keys {
        FlowKeys::Pair { forward, reply } => (get(&forward), get(&reply)),
        FlowKeys::Orphan(key) if key.dir() == ct_dir::FORWARD => (get(&key), None),
        FlowKeys::Orphan(key) => (None, get(&key)),
    }
}

/// Whether the flow `keys` names, its entries read from `get`, has expired.
fn judge<K: Key>(
    keys: &FlowKeys<K>,
    get: impl Fn(&K) -> Option<K::Entry>,
    now_ns: u64,
    t: &Timeouts,
) -> bool {
    let (forward, reply) = entries(keys, get);
    let flow = Flow {
        protocol: keys.proto(),
        forward: forward.as_ref(),
        reply: reply.as_ref(),
    };
    expired(&flow, now_ns, t)
}

/// The table the collector works on (a trait so the logic is tested on an
/// in-memory table).
pub trait CtTable<K: Key = CtKey> {
    /// Every entry.
    fn read_all(&self) -> std::io::Result<Vec<(K, K::Entry)>>;
    /// One entry as it is now.
    fn get(&self, key: &K) -> Option<K::Entry>;
    /// Removes one entry; whether it was there.
    fn remove(&mut self, key: &K) -> bool;
}

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Entries in the table when the pass read it.
    pub entries: usize,
    /// Entries removed.
    pub deleted: usize,
}

/// One collection at `now_ns`: reads the table, and removes every expired
/// flow (both entries) and idle orphan. Each flow is judged again from its
/// entries as they are right before removal, so a packet that arrived
/// during the pass saves it.
pub fn collect<K: Key>(
    table: &mut impl CtTable<K>,
    now_ns: u64,
    t: &Timeouts,
) -> std::io::Result<Pass> {
    collect_tallied(table, now_ns, t, &mut Tally::default())
}

/// What a pass tells of each entry it read: removed, or kept.
pub trait Observer {
    fn note<K: Key>(&mut self, key: &K, entry: &K::Entry, removed: bool);
}

impl Observer for Tally {
    fn note<K: Key>(&mut self, key: &K, entry: &K::Entry, removed: bool) {
        Tally::note(self, key, entry, removed);
    }
}

impl Observer for LiveClients {
    fn note<K: Key>(&mut self, key: &K, _: &K::Entry, removed: bool) {
        LiveClients::note(self, key, removed);
    }
}

impl<A: Observer, B: Observer> Observer for (&mut A, &mut B) {
    fn note<K: Key>(&mut self, key: &K, entry: &K::Entry, removed: bool) {
        self.0.note(key, entry, removed);
        self.1.note(key, entry, removed);
    }
}

/// [`collect`], telling `tally` of every entry it read: least-connection
/// notes the counted flows ([`ct_flags::COUNTED`]) removed and kept
/// ([`crate::dataplane::flows::open_counts`]), the quiet marks the clients of kept
/// ones ([`crate::dataplane::flows::quiet_pods`]).
pub fn collect_tallied<K: Key>(
    table: &mut impl CtTable<K>,
    now_ns: u64,
    t: &Timeouts,
    tally: &mut impl Observer,
) -> std::io::Result<Pass> {
    let all: StdHashMap<K, K::Entry> = table.read_all()?.into_iter().collect();
    let mut pass = Pass {
        entries: all.len(),
        deleted: 0,
    };
    for flow in flows(&all) {
        let expired = judge(&flow, |k| all.get(k).copied(), now_ns, t)
            && judge(&flow, |k| table.get(k), now_ns, t);
        for key in flow.keys() {
            let removed = expired && table.remove(&key);
            pass.deleted += usize::from(removed);
            if let Some(entry) = all.get(&key) {
                tally.note(&key, entry, removed);
            }
        }
    }
    Ok(pass)
}

/// How long to wait after a pass that found the table `fill` full (0..=1):
/// [`MIN_INTERVAL`] above [`BUSY_FILL`], growing linearly to
/// [`MAX_INTERVAL`] for an empty table.
pub fn interval(fill: f64) -> Duration {
    // NaN (no capacity read) counts as full.
    if fill.is_nan() || fill >= BUSY_FILL {
        return MIN_INTERVAL;
    }
    let idle = 1.0 - fill.max(0.0) / BUSY_FILL;
    let span = MAX_INTERVAL.saturating_sub(MIN_INTERVAL).as_secs_f64();
    MIN_INTERVAL + Duration::from_secs_f64(span * idle)
}

/// A family label: `[("family", "ipv4")]` or `[("family", "ipv6")]`.
type FamilyLabel = [(&'static str, &'static str); 1];

fn duration_histogram() -> Histogram {
    // 1 ms to 16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The collector's series on `/metrics`, one per address family (label
/// `family`: `ipv4`, `ipv6`). Clones share them.
#[derive(Clone, Debug)]
pub struct GcMetrics {
    deleted: Family<FamilyLabel, Counter>,
    fill: Family<FamilyLabel, Gauge<f64, AtomicU64>>,
    duration: Family<FamilyLabel, Histogram, fn() -> Histogram>,
    /// Least-connection's counts, reconciled after each pass.
    open_flows: OpenFlowMetrics,
}

impl Default for GcMetrics {
    fn default() -> Self {
        Self {
            deleted: Family::default(),
            fill: Family::default(),
            duration: Family::new_with_constructor(duration_histogram),
            open_flows: OpenFlowMetrics::default(),
        }
    }
}

impl GcMetrics {
    pub fn register(&self, registry: &mut Registry) {
        self.open_flows.register(registry);
        registry.register(
            "switchboard_conntrack_gc_deleted",
            "Connection-tracking entries the agent's collector removed (expired flows and orphans), by address family",
            self.deleted.clone(),
        );
        registry.register(
            "switchboard_conntrack_fill_ratio",
            "How full each family's connection-tracking table was at the collector's last pass (0 to 1)",
            self.fill.clone(),
        );
        registry.register(
            "switchboard_conntrack_gc_duration_seconds",
            "How long one pass of the connection-tracking collector over one family's table took",
            self.duration.clone(),
        );
    }

    fn observe(&self, family: &'static str, pass: &Pass, capacity: u32, took: Duration) {
        let label = [("family", family)];
        self.deleted
            .get_or_create(&label)
            .inc_by(pass.deleted as u64);
        self.fill
            .get_or_create(&label)
            .set(fill(pass.entries, capacity));
        self.duration
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }
}

fn fill(entries: usize, capacity: u32) -> f64 {
    match capacity {
        0 => 1.0,
        c => entries as f64 / f64::from(c),
    }
}

/// The wait after a pass over both families' tables, each `Some(fill)` or
/// `None` (not read): the fuller table sets the pace, and a table that
/// could not be read is tried again soon.
pub fn next_interval(fills: &[Option<f64>]) -> Duration {
    let mut fullest = 0.0_f64;
    for fill in fills {
        match fill {
            Some(f) if !f.is_nan() => fullest = fullest.max(*f),
            _ => return MIN_INTERVAL,
        }
    }
    interval(fullest)
}

/// [`next_interval`] after a pass over both tables that took `took`: at
/// least [`PACE`] times as long.
pub fn next_interval_after(fills: &[Option<f64>], took: Duration) -> Duration {
    next_interval(fills).max(took.saturating_mul(PACE))
}

#[derive(Debug, thiserror::Error)]
pub enum GcError {
    #[error(transparent)]
    Pin(#[from] MapsError),
    #[error("starting the collector thread")]
    Spawn(#[source] std::io::Error),
}

/// The kernel's tables, of either family.
impl<K, E> CtTable<K> for HashMap<MapData, K, E>
where
    K: Key<Entry = E> + aya::Pod + bytemuck::Pod,
    E: Entry + aya::Pod + bytemuck::Pod,
{
    fn read_all(&self) -> std::io::Result<Vec<(K, E)>> {
        crate::dataplane::maps::batch::lookup_all(self.map())
    }
    fn get(&self, key: &K) -> Option<E> {
        HashMap::get(self, key, 0).ok()
    }
    fn remove(&mut self, key: &K) -> bool {
        HashMap::remove(self, key).is_ok()
    }
}

/// One family's table as the collector holds it, and the table's
/// generation it moves on after a pass that removed entries
/// ([`crate::dataplane::flows::generation`]).
struct Tracked<K: Key> {
    table: HashMap<MapData, K, K::Entry>,
    capacity: u32,
    gen: CtGeneration,
}

impl<K> Tracked<K>
where
    K: Key + aya::Pod + bytemuck::Pod,
    K::Entry: aya::Pod + bytemuck::Pod,
{
    /// The table `name` as `pins` opened it, with its capacity.
    fn new(
        pins: Pins,
        name: &'static str,
        table: Result<HashMap<MapData, K, K::Entry>, MapsError>,
    ) -> Result<Self, GcError> {
        let table = table?;
        let capacity = pins.capacity(name, table.map())?;
        let gen = CtGeneration::new(pins.ct_gen()?);
        Ok(Self {
            table,
            capacity,
            gen,
        })
    }

    /// One pass; how full the table was (`None`: it could not be read).
    /// Every entry read is told to `tally`.
    fn pass(
        &mut self,
        timeouts: &Timeouts,
        metrics: &GcMetrics,
        tally: &mut impl Observer,
    ) -> Option<f64> {
        let started = Instant::now();
        match collect_tallied(&mut self.table, monotonic_ns(), timeouts, tally) {
            Ok(pass) => {
                let took = started.elapsed();
                metrics.observe(K::FAMILY, &pass, self.capacity, took);
                debug!(
                    family = K::FAMILY,
                    entries = pass.entries,
                    deleted = pass.deleted,
                    ?took,
                    "conntrack collected"
                );
                if pass.deleted > 0 {
                    if let Err(error) = self.gen.advance() {
                        warn!(family = K::FAMILY, %error, "moving the connection-tracking generation on failed; the removed flows may be translated for up to a second more");
                    }
                }
                Some(fill(pass.entries, self.capacity))
            }
            Err(error) => {
                warn!(family = K::FAMILY, %error, "reading the connection-tracking table failed; trying again");
                None
            }
        }
    }
}

/// Starts the collector on a thread of its own, on the maps pinned under
/// `pin_root` (open them after any resize has finished: the pin is what
/// the programs use): the IPv4 table (`SB_CT_V5`) and the IPv6 one
/// (`SB_CT6_V1`), both created by the loader. It runs until the process
/// exits. After each pass it settles least-connection's counts
/// (`open_flows`: the loaded object's `SB_LC_V1` and `SB_LC_SOCK_V1`,
/// which are not pinned), and marks quiet the pod interfaces among
/// `candidates` whose pods no kept flow has as its client
/// ([`crate::dataplane::flows::quiet_pods`]).
pub fn spawn(
    pin_root: &Path,
    timeouts: Timeouts,
    metrics: GcMetrics,
    open_flows: LeastConnMaps,
    candidates: Candidates,
) -> Result<(), GcError> {
    let pins = Pins::new(pin_root);
    let v4 = Tracked::new(pins, names::CONNTRACK, pins.conntrack())?;
    let v6 = Tracked::new(pins, names::CONNTRACK6, pins.conntrack6())?;
    let stats = pins.stats()?;
    let quiet = QuietPods::open(pins)?;
    let marks = QuietCollector { quiet, candidates };
    std::thread::Builder::new()
        .name("conntrack-gc".into())
        .spawn(move || run((v4, v6), open_flows, marks, &stats, &timeouts, &metrics))
        .map_err(GcError::Spawn)?;
    Ok(())
}

/// The collector's part in the quiet marks.
struct QuietCollector {
    quiet: QuietPods,
    candidates: Candidates,
}

impl QuietCollector {
    /// Before a pass: the candidates' generations.
    fn look(&self) -> Look {
        Look::new(&self.quiet, self.candidates.get())
    }

    /// After a pass that read both tables whole.
    fn settle(&mut self, look: &Look, live: &LiveClients) {
        match quiet_pods::settle(&mut self.quiet, look, live) {
            Ok(0) => {}
            Ok(marked) => debug!(marked, "pod interfaces marked quiet"),
            Err(error) => {
                warn!(%error, "writing a quiet mark failed; that pod's packets stay looked up")
            }
        }
    }
}

/// The sum over CPUs of the `ct_full` counter.
fn ct_full(stats: &PerCpuArray<MapData, u64>) -> u64 {
    stats
        .get(&stat::CT_FULL, 0)
        .map(|per_cpu| per_cpu.iter().sum())
        .unwrap_or(0)
}

fn run(
    (mut v4, mut v6): (Tracked<CtKey>, Tracked<CtKey6>),
    mut open_flows: LeastConnMaps,
    mut marks: QuietCollector,
    stats: &PerCpuArray<MapData, u64>,
    timeouts: &Timeouts,
    metrics: &GcMetrics,
) {
    let mut refused = ct_full(stats);
    let mut last_drift = None;
    loop {
        let started = Instant::now();
        let (mut tally, mut tally6) = (Tally::default(), Tally::default());
        // Generations first: a flow tracked after this read voids the
        // marks made from it.
        let look = marks.look();
        let mut live = LiveClients::default();
        let fills = [
            v4.pass(timeouts, metrics, &mut (&mut tally, &mut live)),
            v6.pass(timeouts, metrics, &mut (&mut tally6, &mut live)),
        ];
        if fills.iter().all(Option::is_some) {
            marks.settle(&look, &live);
        }
        // Settled only over a whole view: a table not read would look like
        // drift.
        let sockets: Result<Vec<u32>, _> = open_flows
            .sockets
            .iter()
            .map(|entry| entry.map(|(_, id)| id))
            .collect();
        if let (true, Ok(sockets)) = (fills.iter().all(Option::is_some), sockets) {
            tally.merge(tally6);
            tally.note_sockets(sockets);
            match open_counts::settle(&mut open_flows.counts, &tally, &mut last_drift) {
                Ok(settled) => metrics.open_flows.observe(&settled),
                Err(error) => warn!(%error, "reading least-connection's open-flow counts failed"),
            }
        }
        let took = started.elapsed();
        let wait = next_interval_after(&fills, took);
        // Sleep in steps, ending early when a table refused a flow (the
        // counter is shared by both families), but never before the pace
        // allows another pass.
        let earliest = Instant::now() + took.saturating_mul(PACE);
        let until = Instant::now() + wait;
        while Instant::now() < until {
            std::thread::sleep(MIN_INTERVAL.min(until.saturating_duration_since(Instant::now())));
            let now_refused = ct_full(stats);
            if now_refused != refused && Instant::now() >= earliest {
                refused = now_refused;
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use proxy_common::{Addr6Be, CtEntry6};

    const S: u64 = 1_000_000_000;

    fn t() -> Timeouts {
        Timeouts::default()
    }

    fn entry(state: u8, flags: u8, last_seen_s: u64) -> CtEntry {
        CtEntry {
            state,
            flags,
            last_seen_ns: last_seen_s * S,
            created_ns: S,
            ..CtEntry::default()
        }
    }

    #[test]
    fn phases_follow_both_directions() {
        use ct_state::*;
        let cases = [
            (proto::TCP, 0, 0, Phase::SynSent),
            // A SYN answered but never acknowledged: a spoofed source.
            (proto::TCP, 0, REPLIED, Phase::SynRecv),
            (proto::TCP, ACKED, REPLIED, Phase::Established),
            (proto::TCP, ACKED | FIN, REPLIED, Phase::HalfClosed),
            (proto::TCP, FIN, REPLIED, Phase::HalfClosed),
            (proto::TCP, 0, REPLIED | FIN, Phase::HalfClosed),
            (proto::TCP, FIN, REPLIED | FIN, Phase::Closed),
            (proto::TCP, RST, REPLIED, Phase::Closed),
            (proto::TCP, 0, REPLIED | RST, Phase::Closed),
            (proto::TCP, RST, 0, Phase::Closed),
            // A FIN without any answer is still a connection never set up.
            (proto::TCP, FIN, 0, Phase::SynSent),
            (proto::UDP, 0, 0, Phase::Udp),
            (proto::UDP, 0, REPLIED, Phase::UdpStream),
        ];
        for (protocol, forward, reply, want) in cases {
            assert_eq!(
                phase(protocol, 0, forward, reply),
                want,
                "{protocol} {forward:#b} {reply:#b}"
            );
        }
    }

    /// A flow this node returned directly never sees a reply: the client's
    /// packets alone decide (its ACK establishes; its FIN or RST closes).
    #[test]
    fn directly_returned_flows_are_judged_by_the_client_alone() {
        use ct_state::*;
        let flags = ct_flags::DSR_BALANCED;
        for (protocol, forward, want) in [
            (proto::TCP, 0, Phase::SynSent),
            (proto::TCP, ACKED, Phase::Established),
            (proto::TCP, ACKED | FIN, Phase::Closed),
            (proto::TCP, RST, Phase::Closed),
            (proto::UDP, 0, Phase::UdpStream),
        ] {
            assert_eq!(
                phase(protocol, flags, forward, 0),
                want,
                "{protocol} {forward:#b}"
            );
        }
        // The backend's node sees both directions: the usual rules.
        let arrived = ct_flags::DSR_ARRIVED;
        assert_eq!(phase(proto::TCP, arrived, ACKED, 0), Phase::SynSent);
        assert_eq!(
            phase(proto::TCP, arrived, ACKED, REPLIED),
            Phase::Established
        );
    }

    #[test]
    fn expiry_uses_the_newer_time_stamp_and_the_phase_timeout() {
        use ct_state::*;
        let t = t();
        /// (proto, forward, reply, now in seconds, expired?)
        type Case = (u8, Option<CtEntry>, Option<CtEntry>, u64, bool);
        let cases: &[Case] = &[
            // An idle established connection lasts a day from its newest packet.
            (
                proto::TCP,
                Some(entry(ACKED, 0, 100)),
                Some(entry(REPLIED, 0, 200)),
                200 + 86_399,
                false,
            ),
            (
                proto::TCP,
                Some(entry(ACKED, 0, 100)),
                Some(entry(REPLIED, 0, 200)),
                200 + 86_400,
                true,
            ),
            // Either side's packet keeps it.
            (
                proto::TCP,
                Some(entry(ACKED, 0, 90_000)),
                Some(entry(REPLIED, 0, 200)),
                90_000 + 100,
                false,
            ),
            // Closed: seconds.
            (
                proto::TCP,
                Some(entry(FIN, 0, 100)),
                Some(entry(REPLIED | FIN, 0, 100)),
                109,
                false,
            ),
            (
                proto::TCP,
                Some(entry(FIN, 0, 100)),
                Some(entry(REPLIED | FIN, 0, 100)),
                110,
                true,
            ),
            (
                proto::TCP,
                Some(entry(RST, 0, 100)),
                Some(entry(REPLIED, 0, 95)),
                110,
                true,
            ),
            // Half-closed: an hour.
            (
                proto::TCP,
                Some(entry(FIN, 0, 100)),
                Some(entry(REPLIED, 0, 100)),
                100 + 3_599,
                false,
            ),
            (
                proto::TCP,
                Some(entry(FIN, 0, 100)),
                Some(entry(REPLIED, 0, 100)),
                100 + 3_600,
                true,
            ),
            // Never answered: a minute.
            (
                proto::TCP,
                Some(entry(0, 0, 100)),
                Some(entry(0, 0, 100)),
                159,
                false,
            ),
            (
                proto::TCP,
                Some(entry(0, 0, 100)),
                Some(entry(0, 0, 100)),
                160,
                true,
            ),
            // UDP: 30 s one way, 120 s once answered.
            (
                proto::UDP,
                Some(entry(0, 0, 100)),
                Some(entry(0, 0, 100)),
                130,
                true,
            ),
            (
                proto::UDP,
                Some(entry(0, 0, 100)),
                Some(entry(REPLIED, 0, 100)),
                130,
                false,
            ),
            (
                proto::UDP,
                Some(entry(0, 0, 100)),
                Some(entry(REPLIED, 0, 100)),
                220,
                true,
            ),
            // Orphans go after ten idle seconds, whatever their state.
            (proto::TCP, Some(entry(0, 0, 100)), None, 109, false),
            (proto::TCP, Some(entry(0, 0, 100)), None, 110, true),
            (proto::TCP, None, Some(entry(REPLIED, 0, 100)), 110, true),
            (proto::TCP, None, None, 0, true),
        ];
        for (i, (protocol, forward, reply, now_s, want)) in cases.iter().enumerate() {
            let flow = Flow {
                protocol: *protocol,
                forward: forward.as_ref(),
                reply: reply.as_ref(),
            };
            assert_eq!(
                expired(&flow, now_s * S, &t),
                *want,
                "case {i}: {flow:?} at {now_s}s"
            );
        }
    }

    #[test]
    fn a_closed_source_nated_flow_keeps_its_port_past_time_wait() {
        use ct_state::*;
        let closed_at = 100;
        let mut f = entry(FIN, ct_flags::SNAT | ct_flags::CLOSING, closed_at);
        let mut r = entry(REPLIED | FIN, ct_flags::SNAT | ct_flags::CLOSING, closed_at);
        f.created_ns = closed_at * S;
        r.created_ns = closed_at * S;
        let flow = Flow {
            protocol: proto::TCP,
            forward: Some(&f),
            reply: Some(&r),
        };
        let reuse_s = snat::REUSE_AFTER_NS / S;
        assert!(!expired(&flow, (closed_at + 11) * S, &t()));
        assert!(!expired(&flow, (closed_at + reuse_s - 1) * S, &t()));
        assert!(expired(&flow, (closed_at + reuse_s) * S, &t()));
    }

    fn key(dir: u8, s: [u8; 4], sport: u16, d: [u8; 4], dport: u16) -> CtKey {
        CtKey {
            saddr_be: u32::from_ne_bytes(s),
            daddr_be: u32::from_ne_bytes(d),
            sport_be: sport.to_be(),
            dport_be: dport.to_be(),
            proto: proto::TCP,
            dir,
            _pad: [0; 2],
        }
    }

    const CLIENT: [u8; 4] = [10, 0, 0, 2];
    const FRONTEND: [u8; 4] = [10, 96, 0, 10];
    const BACKEND: [u8; 4] = [10, 0, 1, 5];
    const NODE: [u8; 4] = [192, 0, 2, 1];

    /// The three encodings the data path writes (`tc::track`,
    /// `hairpin::track`, `nodeport::new_remote_flow`).
    fn pairs() -> Vec<((CtKey, CtEntry), (CtKey, CtEntry))> {
        let plain = (
            (
                key(ct_dir::FORWARD, CLIENT, 40000, FRONTEND, 80),
                CtEntry {
                    nat_addr_be: u32::from_ne_bytes(BACKEND),
                    nat_port_be: 8080u16.to_be(),
                    ..entry(ct_state::ACKED, 0, 100)
                },
            ),
            (
                key(ct_dir::REPLY, BACKEND, 8080, CLIENT, 40000),
                CtEntry {
                    nat_addr_be: u32::from_ne_bytes(FRONTEND),
                    nat_port_be: 80u16.to_be(),
                    ..entry(ct_state::REPLIED, 0, 100)
                },
            ),
        );
        let hairpin_addr = proxy_common::hairpin::ADDR;
        let hairpin = (
            (
                key(ct_dir::FORWARD, BACKEND, 40000, FRONTEND, 80),
                CtEntry {
                    nat_addr_be: u32::from_ne_bytes(BACKEND),
                    nat_port_be: 8080u16.to_be(),
                    snat_addr_be: proxy_common::hairpin::ADDR_BE,
                    snat_port_be: 40000u16.to_be(),
                    ..entry(ct_state::ACKED, ct_flags::SNAT, 100)
                },
            ),
            (
                key(ct_dir::REPLY, BACKEND, 8080, hairpin_addr, 40000),
                CtEntry {
                    nat_addr_be: u32::from_ne_bytes(FRONTEND),
                    nat_port_be: 80u16.to_be(),
                    snat_addr_be: u32::from_ne_bytes(BACKEND),
                    snat_port_be: 40000u16.to_be(),
                    ..entry(ct_state::REPLIED, ct_flags::SNAT, 100)
                },
            ),
        );
        let remote = (
            (
                key(ct_dir::FORWARD, CLIENT, 40000, NODE, 30080),
                CtEntry {
                    nat_addr_be: u32::from_ne_bytes(BACKEND),
                    nat_port_be: 8080u16.to_be(),
                    snat_addr_be: u32::from_ne_bytes(NODE),
                    snat_port_be: 1500u16.to_be(),
                    ..entry(ct_state::ACKED, ct_flags::SNAT, 100)
                },
            ),
            (
                key(ct_dir::REPLY, BACKEND, 8080, NODE, 1500),
                CtEntry {
                    nat_addr_be: u32::from_ne_bytes(NODE),
                    nat_port_be: 30080u16.to_be(),
                    snat_addr_be: u32::from_ne_bytes(CLIENT),
                    snat_port_be: 40000u16.to_be(),
                    ..entry(ct_state::REPLIED, ct_flags::SNAT, 100)
                },
            ),
        );
        vec![plain, hairpin, remote]
    }

    #[test]
    fn partners_are_found_in_every_encoding() {
        for ((fk, fe), (rk, re)) in pairs() {
            assert_eq!(partner_key(&fk, &fe), rk, "{fk:?}");
            assert_eq!(partner_key(&rk, &re), fk, "{rk:?}");
        }
    }

    /// An in-memory table of either family.
    struct Memory<K: Key = CtKey>(StdHashMap<K, K::Entry>);

    impl<K: Key> Default for Memory<K> {
        fn default() -> Self {
            Self(StdHashMap::new())
        }
    }

    impl<K: Key> CtTable<K> for Memory<K> {
        fn read_all(&self) -> std::io::Result<Vec<(K, K::Entry)>> {
            Ok(self.0.iter().map(|(k, v)| (*k, *v)).collect())
        }
        fn get(&self, key: &K) -> Option<K::Entry> {
            self.0.get(key).copied()
        }
        fn remove(&mut self, key: &K) -> bool {
            self.0.remove(key).is_some()
        }
    }

    #[test]
    fn a_pass_removes_expired_pairs_together_and_idle_orphans() {
        let mut table = Memory::default();
        let all = pairs();
        // Plain: established, its reply seen recently: stays.
        let (plain_f, mut plain_r) = all[0];
        plain_r.1.last_seen_ns = 86_000 * S;
        // Hairpin: closed long ago: both go.
        let (mut hp_f, mut hp_r) = all[1];
        hp_f.1.state |= ct_state::FIN;
        hp_r.1.state |= ct_state::FIN;
        // Remote: its forward entry is gone: the reply is an orphan.
        let (_, remote_r) = all[2];
        // A reply entry whose forward key now holds another flow (a new SYN
        // on the ports of a closed one, to another backend): an orphan too.
        let stale_r = (
            key(ct_dir::REPLY, [10, 0, 1, 6], 8080, CLIENT, 40000),
            CtEntry {
                nat_addr_be: u32::from_ne_bytes(FRONTEND),
                nat_port_be: 80u16.to_be(),
                ..entry(ct_state::REPLIED, 0, 100)
            },
        );
        for (k, v) in [plain_f, plain_r, hp_f, hp_r, remote_r, stale_r] {
            table.0.insert(k, v);
        }
        let pass = collect(&mut table, 86_100 * S, &t()).expect("pass");
        assert_eq!(
            pass,
            Pass {
                entries: 6,
                deleted: 4
            }
        );
        let left: Vec<CtKey> = {
            let mut v: Vec<_> = table.0.keys().copied().collect();
            v.sort_by_key(|k| k.dir);
            v
        };
        assert_eq!(left, vec![plain_f.0, plain_r.0]);
    }

    #[test]
    fn a_packet_during_the_pass_saves_the_flow() {
        /// A table whose entries are refreshed right after it was read.
        struct Refreshed(Memory<CtKey>, u64);
        impl CtTable for Refreshed {
            fn read_all(&self) -> std::io::Result<Vec<(CtKey, CtEntry)>> {
                self.0.read_all()
            }
            fn get(&self, key: &CtKey) -> Option<CtEntry> {
                self.0.get(key).map(|e| CtEntry {
                    last_seen_ns: self.1,
                    ..e
                })
            }
            fn remove(&mut self, key: &CtKey) -> bool {
                self.0.remove(key)
            }
        }
        let (f, r) = pairs()[0];
        let now = 200_000 * S;
        let mut table = Refreshed(Memory([f, r].into_iter().collect()), now);
        let pass = collect(&mut table, now, &t()).expect("pass");
        assert_eq!(pass.deleted, 0);
        assert_eq!(table.0 .0.len(), 2);
    }

    // ---- IPv6: the same logic over CtKey6/CtEntry6 ----

    fn v6(last: u16) -> Addr6Be {
        proxy_common::addr6_be([
            0xfd,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            (last >> 8) as u8,
            last as u8,
        ])
    }

    fn key6(dir: u8, s: Addr6Be, sport: u16, d: Addr6Be, dport: u16) -> CtKey6 {
        CtKey6 {
            saddr_be: s,
            daddr_be: d,
            sport_be: sport.to_be(),
            dport_be: dport.to_be(),
            proto: proto::TCP,
            dir,
            _pad: [0; 2],
        }
    }

    fn entry6(state: u8, flags: u8, last_seen_s: u64) -> CtEntry6 {
        CtEntry6 {
            state,
            flags,
            last_seen_ns: last_seen_s * S,
            created_ns: S,
            ..CtEntry6::default()
        }
    }

    /// The IPv6 twins of [`pairs`]: plain, hairpin (through
    /// `hairpin::ADDR6`), and a remote client source-NATed to the node.
    fn pairs6() -> Vec<((CtKey6, CtEntry6), (CtKey6, CtEntry6))> {
        let (client, frontend, backend, node) = (v6(2), v6(0x9610), v6(0x0105), v6(0x0201));
        let plain = (
            (
                key6(ct_dir::FORWARD, client, 40000, frontend, 80),
                CtEntry6 {
                    nat_addr_be: backend,
                    nat_port_be: 8080u16.to_be(),
                    ..entry6(ct_state::ACKED, 0, 100)
                },
            ),
            (
                key6(ct_dir::REPLY, backend, 8080, client, 40000),
                CtEntry6 {
                    nat_addr_be: frontend,
                    nat_port_be: 80u16.to_be(),
                    ..entry6(ct_state::REPLIED, 0, 100)
                },
            ),
        );
        let hairpin = (
            (
                key6(ct_dir::FORWARD, backend, 40000, frontend, 80),
                CtEntry6 {
                    nat_addr_be: backend,
                    nat_port_be: 8080u16.to_be(),
                    snat_addr_be: proxy_common::hairpin::ADDR6_BE,
                    snat_port_be: 40000u16.to_be(),
                    ..entry6(ct_state::ACKED, ct_flags::SNAT, 100)
                },
            ),
            (
                key6(
                    ct_dir::REPLY,
                    backend,
                    8080,
                    proxy_common::hairpin::ADDR6_BE,
                    40000,
                ),
                CtEntry6 {
                    nat_addr_be: frontend,
                    nat_port_be: 80u16.to_be(),
                    snat_addr_be: backend,
                    snat_port_be: 40000u16.to_be(),
                    ..entry6(ct_state::REPLIED, ct_flags::SNAT, 100)
                },
            ),
        );
        let remote = (
            (
                key6(ct_dir::FORWARD, client, 40000, node, 30080),
                CtEntry6 {
                    nat_addr_be: backend,
                    nat_port_be: 8080u16.to_be(),
                    snat_addr_be: node,
                    snat_port_be: 1500u16.to_be(),
                    ..entry6(ct_state::ACKED, ct_flags::SNAT, 100)
                },
            ),
            (
                key6(ct_dir::REPLY, backend, 8080, node, 1500),
                CtEntry6 {
                    nat_addr_be: node,
                    nat_port_be: 30080u16.to_be(),
                    snat_addr_be: client,
                    snat_port_be: 40000u16.to_be(),
                    ..entry6(ct_state::REPLIED, ct_flags::SNAT, 100)
                },
            ),
        );
        vec![plain, hairpin, remote]
    }

    #[test]
    fn ipv6_partners_are_found_in_every_encoding() {
        for ((fk, fe), (rk, re)) in pairs6() {
            assert_eq!(partner_key(&fk, &fe), rk, "{fk:?}");
            assert_eq!(partner_key(&rk, &re), fk, "{rk:?}");
        }
        // Only the last word differs: a partner built from the wrong word
        // order would not be found.
        let ((fk, fe), _) = pairs6()[0];
        assert_eq!(
            CtKey6::ip(partner_key(&fk, &fe).saddr_be).to_string(),
            "fd00::105"
        );
    }

    #[test]
    fn an_ipv6_pass_removes_expired_pairs_together_and_keeps_live_ones() {
        let mut table = Memory::<CtKey6>::default();
        let all = pairs6();
        // Plain: established, its reply seen recently: stays.
        let (plain_f, mut plain_r) = all[0];
        plain_r.1.last_seen_ns = 86_000 * S;
        // Hairpin: closed long ago: both go.
        let (mut hp_f, mut hp_r) = all[1];
        hp_f.1.state |= ct_state::FIN;
        hp_r.1.state |= ct_state::FIN;
        // Remote: only its reply entry is left: an idle orphan, goes.
        let (_, remote_r) = all[2];
        for (k, v) in [plain_f, plain_r, hp_f, hp_r, remote_r] {
            table.0.insert(k, v);
        }
        let flows = flows(&table.0);
        assert_eq!(flows.len(), 3, "{flows:?}");
        assert!(flows.contains(&FlowKeys::Pair {
            forward: hp_f.0,
            reply: hp_r.0
        }));
        let pass = collect(&mut table, 86_100 * S, &t()).expect("pass");
        assert_eq!(
            pass,
            Pass {
                entries: 5,
                deleted: 3
            }
        );
        let mut left: Vec<CtKey6> = table.0.keys().copied().collect();
        left.sort_by_key(|k| k.dir);
        assert_eq!(left, vec![plain_f.0, plain_r.0]);
        // A day after the last packet the established pair goes too, both
        // entries in one pass.
        let pass = collect(&mut table, (86_000 + 86_400) * S, &t()).expect("pass");
        assert_eq!(
            pass,
            Pass {
                entries: 2,
                deleted: 2
            }
        );
        assert!(table.0.is_empty());
    }

    #[test]
    fn a_closed_source_nated_ipv6_flow_keeps_its_port_past_time_wait() {
        let ((fk, mut fe), (rk, mut re)) = pairs6()[2];
        let closed_at = 100;
        for e in [&mut fe, &mut re] {
            e.state |= ct_state::FIN;
            e.flags |= ct_flags::CLOSING;
            e.created_ns = closed_at * S;
            e.last_seen_ns = closed_at * S;
        }
        let reuse_s = snat::REUSE_AFTER_NS / S;
        let mut table = Memory::<CtKey6>([(fk, fe), (rk, re)].into_iter().collect());
        // Past the closed timeout, before the port may be reused: kept.
        let pass = collect(&mut table, (closed_at + reuse_s - 1) * S, &t()).expect("pass");
        assert_eq!(pass.deleted, 0);
        let pass = collect(&mut table, (closed_at + reuse_s) * S, &t()).expect("pass");
        assert_eq!(pass.deleted, 2);
        // Without source NAT the same flow goes after the closed timeout.
        let ((fk, mut fe), (rk, mut re)) = pairs6()[0];
        for e in [&mut fe, &mut re] {
            e.state |= ct_state::FIN;
            e.flags |= ct_flags::CLOSING;
            e.last_seen_ns = closed_at * S;
        }
        let mut table = Memory::<CtKey6>([(fk, fe), (rk, re)].into_iter().collect());
        let pass = collect(&mut table, (closed_at + 10) * S, &t()).expect("pass");
        assert_eq!(pass.deleted, 2);
    }

    #[test]
    fn the_fuller_table_sets_the_pace() {
        assert_eq!(next_interval(&[Some(0.0), Some(0.0)]), MAX_INTERVAL);
        assert_eq!(next_interval(&[Some(0.0), Some(0.8)]), MIN_INTERVAL);
        assert_eq!(next_interval(&[Some(0.8), Some(0.0)]), MIN_INTERVAL);
        assert_eq!(next_interval(&[Some(0.1), Some(0.5)]), interval(0.5));
        // A table that could not be read is tried again soon.
        assert_eq!(next_interval(&[Some(0.0), None]), MIN_INTERVAL);
        assert_eq!(next_interval(&[Some(f64::NAN), Some(0.0)]), MIN_INTERVAL);
    }

    #[test]
    fn a_slow_pass_spaces_the_next_one() {
        let full = [Some(1.0), Some(0.0)];
        // A quick pass over a full table: every second.
        assert_eq!(
            next_interval_after(&full, Duration::from_millis(10)),
            MIN_INTERVAL
        );
        // A pass of 300 ms: the collector takes at most 5% of a core.
        let wait = next_interval_after(&full, Duration::from_millis(300));
        assert_eq!(wait, Duration::from_millis(300) * PACE);
        assert!(
            Duration::from_millis(300).as_secs_f64()
                / (wait + Duration::from_millis(300)).as_secs_f64()
                <= 0.05
        );
        // A nearly empty table waits for its own reason, however quick.
        assert_eq!(
            next_interval_after(&[Some(0.0), Some(0.0)], Duration::from_millis(300)),
            MAX_INTERVAL
        );
    }

    #[test]
    fn collector_metrics_are_labelled_by_family() {
        let metrics = GcMetrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics.observe(
            "ipv4",
            &Pass {
                entries: 10,
                deleted: 4,
            },
            100,
            Duration::from_millis(3),
        );
        metrics.observe(
            "ipv6",
            &Pass {
                entries: 50,
                deleted: 1,
            },
            100,
            Duration::from_millis(3),
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        for line in [
            "switchboard_conntrack_gc_deleted_total{family=\"ipv4\"} 4",
            "switchboard_conntrack_gc_deleted_total{family=\"ipv6\"} 1",
            "switchboard_conntrack_fill_ratio{family=\"ipv4\"} 0.1",
            "switchboard_conntrack_fill_ratio{family=\"ipv6\"} 0.5",
            "switchboard_conntrack_gc_duration_seconds_count{family=\"ipv6\"} 1",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in:\n{text}"
            );
        }
    }

    #[test]
    fn the_interval_shrinks_as_the_table_fills() {
        let cases = [
            (0.0, MAX_INTERVAL),
            (0.75, MIN_INTERVAL),
            (0.9, MIN_INTERVAL),
            (1.0, MIN_INTERVAL),
            (f64::NAN, MIN_INTERVAL),
        ];
        for (fill, want) in cases {
            assert_eq!(interval(fill), want, "{fill}");
        }
        assert!(interval(0.2) > interval(0.5));
        assert!(interval(0.5) > MIN_INTERVAL && interval(0.5) < MAX_INTERVAL);
    }

    #[test]
    fn the_monotonic_clock_is_the_kernels() {
        // bpf_ktime_get_ns is CLOCK_MONOTONIC: it starts at boot, so it is
        // far below the wall clock's nanoseconds since 1970 and moves on.
        let a = monotonic_ns();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos() as u64;
        assert!(a > 0 && a < wall / 2, "{a}");
        std::thread::sleep(Duration::from_millis(2));
        assert!(monotonic_ns() >= a + 2_000_000);
    }
}
