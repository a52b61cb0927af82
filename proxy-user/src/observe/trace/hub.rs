//! The agent's side of the trace: one task reads the ring buffer, fans the
//! events out to the connected clients, and keeps the kernel's switch at
//! the union of what they ask for (see the parent module).
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use proxy_common::{names, TraceEvent};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::{Event, Filter, FilterSpec, Record};
use crate::dataplane::maps::{take_map, TakeError};
use crate::dataplane::pins::Pins;
use crate::sync::encode::revnat_name;

/// How many lines a client's queue holds; what does not fit is counted
/// and reported to the client.
const QUEUE: usize = 4096;
/// How often the kernel's lost-event count is read and reported.
const TICK: Duration = Duration::from_millis(250);
/// How long a Service name is remembered for its id.
const NAMES_FOR: Duration = Duration::from_secs(5);
/// The most clients at once.
const MAX_CLIENTS: usize = 64;
/// The most events read from the ring buffer before they are handed out:
/// under a flood the ring refills as fast as it is read, and the hub's
/// memory stays this batch and the clients' queues.
const BATCH: usize = 512;

/// The loaded object's trace maps, which are not pinned.
pub struct TraceMaps {
    pub events: RingBuf<MapData>,
    pub switch: Array<MapData, u64>,
    pub lost: PerCpuArray<MapData, u64>,
}

impl TraceMaps {
    /// Takes the three maps out of the loaded object.
    pub fn take(ebpf: &mut aya::Ebpf) -> Result<Self, TakeError> {
        Ok(Self {
            events: take_map(ebpf, names::TRACE_EVENTS)?,
            switch: take_map(ebpf, names::TRACE_ON)?,
            lost: take_map(ebpf, names::TRACE_LOST)?,
        })
    }
}

/// The switch and the lost-event counter.
struct Controls {
    switch: Array<MapData, u64>,
    lost: PerCpuArray<MapData, u64>,
}

impl Controls {
    /// Sets the switch; `false` (logged) if the kernel refused.
    fn set_switch(&mut self, mask: u64) -> bool {
        match self.switch.set(0, mask, 0) {
            Ok(()) => true,
            Err(error) => {
                warn!(%error, mask, "trace: setting the switch failed");
                false
            }
        }
    }

    /// Events lost so far, summed over CPUs.
    fn lost(&self) -> u64 {
        self.lost
            .get(&0, 0)
            .map(|per_cpu| per_cpu.iter().sum())
            .unwrap_or(0)
    }
}

/// Where the socket hands clients to the hub.
#[derive(Clone)]
pub struct Handle {
    joins: mpsc::Sender<Join>,
}

struct Join {
    spec: FilterSpec,
    read: OwnedReadHalf,
    write: OwnedWriteHalf,
}

impl Handle {
    /// Hands a connection whose request line was `trace` and `spec` (JSON)
    /// to the hub; a request it cannot read is answered with an error.
    pub async fn join(&self, spec: &str, read: OwnedReadHalf, mut write: OwnedWriteHalf) {
        let spec = match serde_json::from_str::<FilterSpec>(spec.trim()) {
            Ok(spec) if spec.is_valid() => spec,
            Ok(spec) => return refuse(&mut write, &spec.error()).await,
            Err(error) => return refuse(&mut write, &format!("bad filter: {error}")).await,
        };
        let _ = self.joins.send(Join { spec, read, write }).await;
    }
}

impl FilterSpec {
    fn is_valid(&self) -> bool {
        Filter::try_from(self).is_ok()
    }

    fn error(&self) -> String {
        Filter::try_from(self).err().unwrap_or_default()
    }
}

async fn refuse(write: &mut OwnedWriteHalf, error: &str) {
    let record = Record::Error {
        error: error.to_owned(),
    };
    if let Ok(line) = serde_json::to_string(&record) {
        let _ = write.write_all(format!("{line}\n").as_bytes()).await;
    }
    let _ = write.shutdown().await;
}

/// Starts the hub on the agent's runtime.
pub fn spawn(maps: TraceMaps, pin_root: &Path) -> std::io::Result<Handle> {
    let (tx, joins) = mpsc::channel(8);
    let hub = Hub::new(maps, pin_root)?;
    tokio::spawn(hub.run(joins));
    Ok(Handle { joins: tx })
}

struct Client {
    filter: Filter,
    lines: mpsc::Sender<Arc<str>>,
    /// Events this client's queue had no room for, not reported yet.
    missed: u64,
    /// Kernel losses not reported to this client yet.
    kernel_lost: u64,
}

struct Hub {
    maps: Controls,
    events: AsyncFd<RingBuf<MapData>>,
    switch: u64,
    clients: BTreeMap<u64, Client>,
    next_id: u64,
    lost_seen: u64,
    /// Events read from the ring buffer, not handed out yet (at most
    /// [`BATCH`]; kept to reuse its allocation).
    batch: Vec<TraceEvent>,
    names: Names,
    /// Wall-clock time minus the monotonic clock the kernel stamps with.
    epoch_offset_ns: i128,
}

impl Hub {
    fn new(maps: TraceMaps, pin_root: &Path) -> std::io::Result<Hub> {
        let TraceMaps {
            events,
            switch,
            lost,
        } = maps;
        let mut maps = Controls { switch, lost };
        maps.set_switch(0);
        let lost_seen = maps.lost();
        Ok(Hub {
            // SAFETY: the ring buffer owns its map's file descriptor, which
            // stays open and unreplaced while the `AsyncFd` holds it.
            events: unsafe {
                AsyncFd::register_with_interest(events, tokio::io::Interest::READABLE)?
            },
            maps,
            switch: 0,
            clients: BTreeMap::new(),
            next_id: 0,
            lost_seen,
            batch: Vec::with_capacity(BATCH),
            names: Names::new(pin_root),
            epoch_offset_ns: epoch_offset_ns(),
        })
    }

    async fn run(mut self, mut joins: mpsc::Receiver<Join>) {
        let (leave_tx, mut leaves) = mpsc::unbounded_channel::<u64>();
        let mut tick = tokio::time::interval(TICK);
        loop {
            tokio::select! {
                join = joins.recv() => match join {
                    Some(join) => self.add(join, leave_tx.clone()),
                    None => break,
                },
                Some(id) = leaves.recv() => {
                    if self.clients.remove(&id).is_some() {
                        info!(client = id, clients = self.clients.len(), "trace: a client left");
                    }
                    self.update_switch();
                }
                ready = self.events.readable_mut() => {
                    let Ok(mut guard) = ready else {
                        warn!("trace: the ring buffer cannot be polled; tracing stops");
                        break;
                    };
                    let mut batch = std::mem::take(&mut self.batch);
                    let ring = guard.get_inner_mut();
                    while batch.len() < BATCH {
                        let Some(item) = ring.next() else {
                            // Drained: wait for the kernel's next wake-up.
                            guard.clear_ready();
                            break;
                        };
                        if let Ok(event) = bytemuck::try_pod_read_unaligned::<TraceEvent>(
                            &item[..item.len().min(size_of::<TraceEvent>())],
                        ) {
                            batch.push(event);
                        }
                    }
                    // A full batch leaves the ring marked readable: the
                    // next turn of the loop reads on, after the other arms
                    // had their chance.
                    for event in batch.drain(..) {
                        self.dispatch(&event);
                    }
                    self.batch = batch;
                }
                _ = tick.tick() => self.report_lost(),
            }
        }
        self.clients.clear();
        self.update_switch();
    }

    fn add(&mut self, join: Join, leave: mpsc::UnboundedSender<u64>) {
        let Join {
            spec,
            read,
            mut write,
        } = join;
        if self.clients.len() >= MAX_CLIENTS {
            tokio::spawn(async move {
                refuse(
                    &mut write,
                    &format!("at most {MAX_CLIENTS} trace clients at once"),
                )
                .await;
            });
            return;
        }
        let Ok(filter) = Filter::try_from(&spec) else {
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        let (lines, rx) = mpsc::channel(QUEUE);
        tokio::spawn(serve_client(id, read, write, rx, leave));
        self.clients.insert(
            id,
            Client {
                filter,
                lines,
                missed: 0,
                kernel_lost: 0,
            },
        );
        info!(
            client = id,
            clients = self.clients.len(),
            ?spec,
            "trace: a client joined"
        );
        self.update_switch();
    }

    /// Sets the kernel's switch to the union of the clients' kinds.
    fn update_switch(&mut self) {
        let want = self.clients.values().fold(0, |m, c| m | c.filter.kinds);
        if want != self.switch && self.maps.set_switch(want) {
            debug!(switch = want, "trace: switch set");
            self.switch = want;
        }
    }

    fn dispatch(&mut self, raw: &TraceEvent) {
        if self.clients.is_empty() {
            return;
        }
        let service = self.names.get(raw.service_id);
        let time = (i128::from(raw.ts_ns) + self.epoch_offset_ns) as f64 / 1e9;
        let event = Event::decode(raw, time, service);
        let mut line: Option<Arc<str>> = None;
        let mut gone = Vec::new();
        for (id, client) in &mut self.clients {
            if !client.filter.matches(&event) {
                continue;
            }
            let line = line
                .get_or_insert_with(|| {
                    let json = serde_json::to_string(&Record::Event(Box::new(event.clone())))
                        .unwrap_or_default();
                    Arc::from(format!("{json}\n"))
                })
                .clone();
            match client.lines.try_send(line) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => client.missed += 1,
                Err(mpsc::error::TrySendError::Closed(_)) => gone.push(*id),
            }
        }
        if !gone.is_empty() {
            for id in gone {
                self.clients.remove(&id);
            }
            self.update_switch();
        }
    }

    /// Reports the kernel's new losses and each client's own to it.
    fn report_lost(&mut self) {
        self.names.expire();
        if self.clients.is_empty() {
            self.lost_seen = self.maps.lost();
            return;
        }
        let lost = self.maps.lost();
        let new = lost.saturating_sub(self.lost_seen);
        self.lost_seen = lost;
        for client in self.clients.values_mut() {
            client.kernel_lost += new;
            if client.kernel_lost == 0 && client.missed == 0 {
                continue;
            }
            let record = Record::Lost {
                kernel: client.kernel_lost,
                reader: client.missed,
            };
            let Ok(json) = serde_json::to_string(&record) else {
                continue;
            };
            if client
                .lines
                .try_send(Arc::from(format!("{json}\n")))
                .is_ok()
            {
                client.kernel_lost = 0;
                client.missed = 0;
            }
        }
    }
}

/// Writes a client's lines until it leaves (its connection closes, or a
/// write fails), then tells the hub.
async fn serve_client(
    id: u64,
    mut read: OwnedReadHalf,
    mut write: OwnedWriteHalf,
    mut lines: mpsc::Receiver<Arc<str>>,
    leave: mpsc::UnboundedSender<u64>,
) {
    let mut scratch = [0u8; 64];
    loop {
        tokio::select! {
            line = lines.recv() => {
                let Some(line) = line else { break };
                if write.write_all(line.as_bytes()).await.is_err() {
                    break;
                }
            }
            // A client sends nothing after its request: the end of its
            // stream (or an error) is the client gone.
            read = read.read(&mut scratch) => {
                if matches!(read, Ok(0) | Err(_)) {
                    break;
                }
            }
        }
    }
    let _ = leave.send(id);
}

/// Service names by id, from the pinned reverse-NAT maps, remembered for
/// [`NAMES_FOR`].
struct Names {
    pin_root: PathBuf,
    known: HashMap<u32, Option<String>>,
    since: std::time::Instant,
}

impl Names {
    fn new(pin_root: &Path) -> Names {
        Names {
            pin_root: pin_root.to_owned(),
            known: HashMap::new(),
            since: std::time::Instant::now(),
        }
    }

    fn expire(&mut self) {
        if self.since.elapsed() > NAMES_FOR {
            self.known.clear();
            self.since = std::time::Instant::now();
        }
    }

    fn get(&mut self, id: u32) -> Option<String> {
        if id == 0 {
            return None;
        }
        if let Some(known) = self.known.get(&id) {
            return known.clone();
        }
        let pins = Pins::new(&self.pin_root);
        let name = pins
            .revnat()
            .ok()
            .and_then(|m| m.get(&id, 0).ok())
            .map(|r| revnat_name(&r))
            .or_else(|| {
                pins.revnat6()
                    .ok()
                    .and_then(|m| m.get(&id, 0).ok())
                    .map(|r| revnat_name(&r))
            });
        if self.known.len() < 65_536 {
            self.known.insert(id, name.clone());
        }
        name
    }
}

/// The wall clock minus the monotonic clock (`bpf_ktime_get_ns`), in
/// nanoseconds.
fn epoch_offset_ns() -> i128 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec; CLOCK_MONOTONIC always
    // exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let mono = i128::from(now.tv_sec) * 1_000_000_000 + i128::from(now.tv_nsec);
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    wall - mono
}
