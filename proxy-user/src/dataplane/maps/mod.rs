//! Typed handles on switchboard's maps, either taken from a freshly loaded
//! object (the agent) or opened from their pins through
//! [`Pins`] (the CLI, whether or not an agent runs).
//!
//! [`MapStore`] (the sync's, in `sync/store.rs`) is the narrow set of writes
//! the sync engine needs; the sync logic is unit-tested against an in-memory
//! store and runs against [`PinnedMaps`] for real.

pub mod batch;
pub mod frontend_filter;
pub mod readback;
use std::os::fd::AsFd as _;
use std::path::Path;

use tracing::warn;

use crate::dataplane::{
    flows::generation::CtGeneration,
    maps::frontend_filter::FrontendFilter,
    pins::{MapsError, Pins},
};
use crate::model::cidr::IpCidr;
use crate::model::IpFamily;
use crate::sync::encode::{
    source_range_block4, source_range_block6, source_range_key4, source_range_key6, AnyBackend,
    AnyFrontendKey, AnyRevNat,
};
use crate::sync::store::{Dump, MapStore, WriteError};
use aya::{
    maps::{
        lpm_trie::{Key as LpmKey, LpmTrie},
        Array, HashMap, IterableMap as _, MapData, MapError, PerCpuArray,
    },
    Ebpf,
};
use proxy_common::{
    names, stat, Backend, Backend6, Config, CtEntry, CtEntry6, CtKey, CtKey6, FragEntry, FragKey,
    FrontendKey, FrontendKey6, FrontendSlot, MaglevTable, RevNat, RevNat6, SockEntry, SockEntry6,
    SockKey, SockKey6, SrcRange4, SrcRange6, SvcStats, Uplink,
};

/// A map the loaded object should hold is not in it, or not of its layout.
#[derive(Debug, thiserror::Error)]
pub enum TakeError {
    #[error("map {name} is missing from the loaded object")]
    Missing { name: &'static str },
    #[error("map {name} of the loaded object has an unexpected type or layout")]
    Layout {
        name: &'static str,
        source: MapError,
    },
    #[error("filling the frontend bitmap from the frontends already programmed")]
    Filter(#[source] WriteError),
}

/// Takes map `name` out of the loaded object as the typed map `M`.
pub fn take_map<M: TryFrom<aya::maps::Map, Error = MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<M, TakeError> {
    let map = ebpf.take_map(name).ok_or(TakeError::Missing { name })?;
    M::try_from(map).map_err(|source| TakeError::Layout { name, source })
}

pub struct PinnedMaps {
    pub frontends: HashMap<MapData, FrontendKey, FrontendSlot>,
    pub backends: HashMap<MapData, u32, Backend>,
    pub frontends6: HashMap<MapData, FrontendKey6, FrontendSlot>,
    pub backends6: HashMap<MapData, u32, Backend6>,
    pub revnat6: HashMap<MapData, u32, RevNat6>,
    pub conntrack: HashMap<MapData, CtKey, CtEntry>,
    pub revnat: HashMap<MapData, u32, RevNat>,
    pub service_stats: PerCpuArray<MapData, SvcStats>,
    pub stats: PerCpuArray<MapData, u64>,
    pub sockets: HashMap<MapData, SockKey, SockEntry>,
    pub config: Array<MapData, Config>,
    pub uplinks: HashMap<MapData, u32, Uplink>,
    pub maglev: HashMap<MapData, u32, MaglevTable>,
    pub fragments: HashMap<MapData, FragKey, FragEntry>,
    /// IPv6 connection tracking (`SB_CT6_V1`), the twin of `conntrack`.
    pub conntrack6: HashMap<MapData, CtKey6, CtEntry6>,
    /// IPv6 socket-layer translations (`SB_SOCK6_V1`), the twin of `sockets`.
    pub sockets6: HashMap<MapData, SockKey6, SockEntry6>,
    /// `loadBalancerSourceRanges` blocks (`SB_SRC_RANGE_V1`, `SB_SRC_RANGE6_V1`).
    pub source_ranges: LpmTrie<MapData, SrcRange4, u8>,
    pub source_ranges6: LpmTrie<MapData, SrcRange6, u8>,
    /// Packets denied by them, per service id (`SB_SVC_DENIED_V1`).
    pub service_denied: PerCpuArray<MapData, u64>,
    /// Puts held by [`MapStore::hold_puts`] until [`MapStore::flush`].
    held: Option<Held>,
    /// The pod path's frontend bitmap, kept with the frontend map by the
    /// writers (the agent, its tests); `None` for the CLI, which writes no
    /// frontend.
    frontend_filter: Option<FrontendFilter>,
    /// The connection-tracking table's generation, moved on after a purge
    /// removed entries.
    ct_gen: CtGeneration,
}

/// The IPv6 maps [`PinnedMaps`] holds, in the order `open` opens them.
pub const IPV6_MAPS: [&str; 5] = [
    names::FRONTENDS6,
    names::BACKENDS6,
    names::REVNAT6,
    names::CONNTRACK6,
    names::SOCKETS6,
];

/// Puts waiting to be written in batches, per family (a frontend and
/// everything it names are of one family).
#[derive(Default)]
struct Held {
    v4: HeldFamily<FrontendKey, Backend, RevNat>,
    v6: HeldFamily<FrontendKey6, Backend6, RevNat6>,
    /// Entries handed to the writer by [`HeldFamily::spill`].
    spilled: usize,
    /// Started at the first spill.
    writer: Option<SpillWriter>,
}

/// One family's frontend, backend and reverse-NAT maps, and their names.
type FamilyMaps<'a> = (
    (&'a MapData, &'a MapData, &'a MapData),
    (&'static str, &'static str, &'static str),
);

/// A batch of spilled puts, written on the writer's thread.
type SpillJob = Box<dyn FnOnce() -> Result<usize, WriteError> + Send>;

/// Writes what [`HeldFamily::spill`] lets go on a thread of its own while
/// the sync goes on computing the next puts: a start at 100k Services
/// spends about as long in the kernel writing entries as computing them,
/// and on two cores the two now overlap. At most one batch waits while one
/// is written (a few MiB). The first error stops the writing (later batches
/// are dropped unwritten) and is what [`finish`](Self::finish) returns: the
/// caller then believes the maps and writes one entry at a time, as after
/// any failed batch.
struct SpillWriter {
    jobs: Option<std::sync::mpsc::SyncSender<SpillJob>>,
    thread: Option<std::thread::JoinHandle<Result<usize, WriteError>>>,
}

impl SpillWriter {
    fn start() -> Result<SpillWriter, WriteError> {
        let (jobs, pending) = std::sync::mpsc::sync_channel::<SpillJob>(1);
        let thread = std::thread::Builder::new()
            .name("sb-map-writer".into())
            .spawn(move || {
                let mut outcome = Ok(0);
                for job in pending {
                    if let Ok(written) = &mut outcome {
                        match job() {
                            Ok(n) => *written += n,
                            Err(error) => outcome = Err(error),
                        }
                    }
                }
                outcome
            })
            .map_err(|error| spill_error("a map writer thread", error))?;
        Ok(SpillWriter {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    fn write(&mut self, job: SpillJob) {
        if let Some(jobs) = &self.jobs {
            // Fails only if the thread is gone (a panic): `finish` says so.
            let _ = jobs.send(job);
        }
    }

    /// Waits for every batch handed over; how many entries they held.
    fn finish(&mut self) -> Result<usize, WriteError> {
        self.jobs = None;
        match self.thread.take().map(std::thread::JoinHandle::join) {
            None => Ok(0),
            Some(Ok(outcome)) => outcome,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for SpillWriter {
    /// Never leaves writes running past the maps' owner.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The puts of `v`, leaving room for as many again (what the next spill
/// likely holds: no growing from nothing).
fn take_again<T>(v: &mut Vec<T>) -> Vec<T> {
    let capacity = v.len();
    std::mem::replace(v, Vec::with_capacity(capacity))
}

/// A failure to set up a spill (a thread, a duplicated map descriptor).
fn spill_error(what: &'static str, io_error: std::io::Error) -> WriteError {
    WriteError::Other {
        map: what,
        source: MapError::SyscallError(aya::sys::SyscallError {
            call: "spill",
            io_error,
        }),
    }
}

/// One family's held puts, in the order that keeps every lookup whole: what
/// slots name (reverse NAT, backends), then the slots (and the external
/// sets' slot 0), then the internal slot 0 that announces each frontend.
struct HeldFamily<K, B, R> {
    revnat: Vec<(u32, R)>,
    backends: Vec<(u32, B)>,
    slots: Vec<(K, FrontendSlot)>,
    heads: Vec<(K, FrontendSlot)>,
}

impl<K, B, R> Default for HeldFamily<K, B, R> {
    fn default() -> Self {
        Self {
            revnat: Vec::new(),
            backends: Vec::new(),
            slots: Vec::new(),
            heads: Vec::new(),
        }
    }
}

impl<K: bytemuck::Pod, B: bytemuck::Pod, R: bytemuck::Pod> HeldFamily<K, B, R> {
    fn frontend(&mut self, announces: bool, key: K, value: FrontendSlot) {
        match announces {
            true => self.heads.push((key, value)),
            false => self.slots.push((key, value)),
        }
    }

    /// Writes everything held, in order; returns how many entries.
    fn flush(&self, (maps, names): FamilyMaps<'_>) -> Result<usize, WriteError> {
        let (frontends, _, _) = maps;
        let (fe_name, _, _) = names;
        let hidden = self.write_hidden(maps, names)?;
        batch_put(fe_name, frontends, &self.heads)?;
        Ok(hidden + self.heads.len())
    }

    /// Hands what no lookup reaches before a slot 0 names it (reverse
    /// NAT, backends, then the slots) to `writer` once [`SPILL_AT`] entries
    /// are held, and lets it go: a start at 100k Services then never holds
    /// its two million puts at once. Slot 0s are written by the flush,
    /// after the writer is done. Returns how many entries were handed over.
    fn spill(
        &mut self,
        (maps, names): FamilyMaps<'_>,
        writer: &mut Option<SpillWriter>,
    ) -> Result<usize, WriteError>
    where
        K: Send + 'static,
        B: Send + 'static,
        R: Send + 'static,
    {
        if self.revnat.len() + self.backends.len() + self.slots.len() < SPILL_AT {
            return Ok(0);
        }
        let (frontends, backends, revnat) = maps;
        let (fe_name, be_name, rn_name) = names;
        // The writer's own descriptors: it outlives no borrow of the maps.
        let fd = |map: &MapData, name: &'static str| {
            map.fd()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| spill_error(name, e))
        };
        let fds = (
            fd(frontends, fe_name)?,
            fd(backends, be_name)?,
            fd(revnat, rn_name)?,
        );
        let writer = match writer {
            Some(writer) => writer,
            None => writer.insert(SpillWriter::start()?),
        };
        let revnat_puts = take_again(&mut self.revnat);
        let backend_puts = take_again(&mut self.backends);
        let slot_puts = take_again(&mut self.slots);
        let handed = revnat_puts.len() + backend_puts.len() + slot_puts.len();
        writer.write(Box::new(move || {
            let (fe_fd, be_fd, rn_fd) = fds;
            batch_put_fd(rn_name, rn_fd.as_fd(), &revnat_puts)?;
            batch_put_fd(be_name, be_fd.as_fd(), &backend_puts)?;
            batch_put_fd(fe_name, fe_fd.as_fd(), &slot_puts)?;
            Ok(handed)
        }));
        Ok(handed)
    }

    fn write_hidden(
        &self,
        (frontends, backends, revnat): (&MapData, &MapData, &MapData),
        (fe_name, be_name, rn_name): (&'static str, &'static str, &'static str),
    ) -> Result<usize, WriteError> {
        batch_put(rn_name, revnat, &self.revnat)?;
        batch_put(be_name, backends, &self.backends)?;
        batch_put(fe_name, frontends, &self.slots)?;
        Ok(self.revnat.len() + self.backends.len() + self.slots.len())
    }
}

/// Held puts of one family that are written before more are held
/// ([`HeldFamily::spill`]): a few MiB.
const SPILL_AT: usize = 1 << 16;

macro_rules! typed {
    ($name:expr, $map:expr) => {
        $map.try_into().map_err(|source| TakeError::Layout {
            name: $name,
            source,
        })?
    };
}

impl PinnedMaps {
    /// The IPv4 frontend, backend and reverse-NAT maps, for held puts.
    fn maps4(&self) -> FamilyMaps<'_> {
        (
            (self.frontends.map(), self.backends.map(), self.revnat.map()),
            (names::FRONTENDS, names::BACKENDS, names::REVNAT),
        )
    }

    /// [`maps4`](Self::maps4) for IPv6.
    fn maps6(&self) -> FamilyMaps<'_> {
        (
            (
                self.frontends6.map(),
                self.backends6.map(),
                self.revnat6.map(),
            ),
            (names::FRONTENDS6, names::BACKENDS6, names::REVNAT6),
        )
    }

    /// Opens the maps pinned under `pin_root`, every one of them (the agent
    /// and its tests: a missing IPv6 map is [`MapsError::NotPinned`]).
    pub fn open(pin_root: &Path) -> Result<Self, MapsError> {
        let mut maps = Self::open_for_cli(pin_root)?;
        let filter = Pins::new(pin_root).frontend_filter()?;
        maps.frontend_filter = Some(FrontendFilter::new(filter, maps.frontend_heads()).map_err(
            |source| MapsError::Filter {
                pin_root: pin_root.to_owned(),
                source: Box::new(source),
            },
        )?);
        Ok(maps)
    }

    /// Opens the maps pinned under `pin_root` for the CLI: every map and
    /// the conntrack generation (`conntrack flush` moves it on, so the data
    /// path's flow caches let go of the flows it removed), without the
    /// frontend bitmap, which only the agent's writes keep.
    pub fn open_for_cli(pin_root: &Path) -> Result<Self, MapsError> {
        let pins = Pins::new(pin_root);
        Ok(Self {
            frontends: pins.frontends()?,
            backends: pins.backends()?,
            frontends6: pins.frontends6()?,
            backends6: pins.backends6()?,
            revnat6: pins.revnat6()?,
            conntrack: pins.conntrack()?,
            revnat: pins.revnat()?,
            service_stats: pins.service_stats()?,
            stats: pins.stats()?,
            sockets: pins.sockets()?,
            config: pins.config()?,
            uplinks: pins.uplinks()?,
            maglev: pins.maglev()?,
            fragments: pins.fragments()?,
            conntrack6: pins.conntrack6()?,
            sockets6: pins.sockets6()?,
            source_ranges: pins.source_ranges()?,
            source_ranges6: pins.source_ranges6()?,
            service_denied: pins.service_denied()?,
            held: None,
            frontend_filter: None,
            ct_gen: CtGeneration::new(pins.ct_gen()?),
        })
    }

    /// The connection-tracking table's generation as it is now; `None` if
    /// the read fails.
    pub fn ct_generation(&self) -> Option<u64> {
        self.ct_gen.read().ok()
    }

    /// After a purge removed `removed` conntrack entries: the table's
    /// generation moves on, so no flow cache answers for them
    /// ([`crate::dataplane::flows::generation`]).
    fn conntrack_removed(&mut self, removed: usize) {
        if removed > 0 {
            self.conntrack_changed();
        }
    }

    /// After conntrack entries were written or removed other than through
    /// the purges (which call this themselves): the table's generation
    /// moves on, so the data path's flow caches answer from the table
    /// again ([`crate::dataplane::flows::generation`]).
    pub fn conntrack_changed(&mut self) {
        if let Err(error) = self.ct_gen.advance() {
            warn!(%error, "moving the connection-tracking generation on failed; flows removed or rewritten may be translated as before for up to a second more");
        }
    }

    /// Takes the maps out of a loaded object.
    pub fn take(ebpf: &mut Ebpf) -> Result<Self, TakeError> {
        let mut take = |name: &'static str| ebpf.take_map(name).ok_or(TakeError::Missing { name });
        Self {
            frontends: typed!(names::FRONTENDS, take(names::FRONTENDS)?),
            backends: typed!(names::BACKENDS, take(names::BACKENDS)?),
            frontends6: typed!(names::FRONTENDS6, take(names::FRONTENDS6)?),
            backends6: typed!(names::BACKENDS6, take(names::BACKENDS6)?),
            revnat6: typed!(names::REVNAT6, take(names::REVNAT6)?),
            conntrack: typed!(names::CONNTRACK, take(names::CONNTRACK)?),
            revnat: typed!(names::REVNAT, take(names::REVNAT)?),
            service_stats: typed!(names::SERVICE_STATS, take(names::SERVICE_STATS)?),
            stats: typed!(names::GLOBAL_STATS, take(names::GLOBAL_STATS)?),
            sockets: typed!(names::SOCKETS, take(names::SOCKETS)?),
            config: typed!(names::CONFIG, take(names::CONFIG)?),
            uplinks: typed!(names::UPLINKS, take(names::UPLINKS)?),
            maglev: typed!(names::MAGLEV, take(names::MAGLEV)?),
            fragments: typed!(names::FRAGMENTS, take(names::FRAGMENTS)?),
            conntrack6: typed!(names::CONNTRACK6, take(names::CONNTRACK6)?),
            sockets6: typed!(names::SOCKETS6, take(names::SOCKETS6)?),
            source_ranges: typed!(names::SOURCE_RANGES, take(names::SOURCE_RANGES)?),
            source_ranges6: typed!(names::SOURCE_RANGES6, take(names::SOURCE_RANGES6)?),
            service_denied: typed!(names::SERVICE_DENIED, take(names::SERVICE_DENIED)?),
            held: None,
            frontend_filter: None,
            ct_gen: CtGeneration::new(typed!(names::CT_GEN, take(names::CT_GEN)?)),
        }
        .with_filter(typed!(
            names::FRONTEND_FILTER,
            take(names::FRONTEND_FILTER)?
        ))
    }

    /// Takes the frontend bitmap over, filled for the frontends already
    /// programmed.
    fn with_filter(mut self, filter: Array<MapData, u64>) -> Result<Self, TakeError> {
        self.frontend_filter =
            Some(FrontendFilter::new(filter, self.frontend_heads()).map_err(TakeError::Filter)?);
        Ok(self)
    }

    /// The slot-0 keys of the frontends the maps hold, both families.
    fn frontend_heads(&self) -> Vec<AnyFrontendKey> {
        let v4 = self
            .frontends
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.slot == 0)
            .map(AnyFrontendKey::V4);
        let v6 = self
            .frontends6
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.slot == 0)
            .map(AnyFrontendKey::V6);
        v4.chain(v6).collect()
    }

    /// Whether the frontend maps hold `key` (a key that does not read
    /// back counts as absent).
    fn holds_frontend(&self, key: AnyFrontendKey) -> bool {
        match key {
            AnyFrontendKey::V4(key) => self.frontends.get(&key, 0).is_ok(),
            AnyFrontendKey::V6(key) => self.frontends6.get(&key, 0).is_ok(),
        }
    }

    /// Writes the data path's configuration (before anything is attached).
    pub fn set_config(&mut self, config: Config) -> Result<(), WriteError> {
        self.config
            .set(0, config, 0)
            .map_err(|source| WriteError::Other {
                map: names::CONFIG,
                source,
            })
    }

    /// The data path's configuration as the map holds it now.
    pub fn config(&self) -> Result<Config, aya::maps::MapError> {
        self.config.get(&0, 0)
    }

    /// Makes the uplink map hold exactly `uplinks` (interface index →
    /// address and flags): new ones are written before old ones are deleted.
    pub fn set_uplinks(&mut self, uplinks: &[(u32, Uplink)]) -> Result<(), WriteError> {
        for (index, value) in uplinks {
            self.uplinks
                .insert(index, value, 0)
                .map_err(|source| WriteError::Other {
                    map: names::UPLINKS,
                    source,
                })?;
        }
        let stale: Vec<u32> = self
            .uplinks
            .keys()
            .filter_map(Result::ok)
            .filter(|k| uplinks.iter().all(|(index, _)| index != k))
            .collect();
        for index in stale {
            self.uplinks
                .remove(&index)
                .map_err(|source| WriteError::Other {
                    map: names::UPLINKS,
                    source,
                })?;
        }
        Ok(())
    }

    /// The uplink map's entries (interface index → address and flags).
    pub fn uplink_entries(&self) -> Vec<(u32, Uplink)> {
        self.uplinks.iter().filter_map(Result::ok).collect()
    }

    /// Writes one uplink map entry.
    pub fn put_uplink(&mut self, index: u32, value: Uplink) -> Result<(), WriteError> {
        self.uplinks
            .insert(index, value, 0)
            .map_err(|e| write_error(names::UPLINKS, e))
    }

    /// Deletes one uplink map entry (absent is fine).
    pub fn delete_uplink(&mut self, index: u32) -> Result<(), WriteError> {
        delete_result(names::UPLINKS, self.uplinks.remove(&index))
    }

    /// The frontend bitmap's map, where the maps keep one (the agent's and
    /// its tests').
    pub fn frontend_filter_map(&self) -> Option<&MapData> {
        self.frontend_filter.as_ref().map(FrontendFilter::map)
    }

    /// Number of socket-layer entries.
    pub fn sockets_len(&self) -> usize {
        self.sockets.keys().filter(Result::is_ok).count()
    }

    /// Per-service counters summed over CPUs (zero when absent).
    pub fn service_stats(&self, service_id: u32) -> SvcStats {
        let mut total = SvcStats::default();
        if let Ok(per_cpu) = self.service_stats.get(&service_id, 0) {
            for s in per_cpu.iter() {
                total.packets += s.packets;
                total.bytes += s.bytes;
                total.new_flows += s.new_flows;
                total.drops_no_backend += s.drops_no_backend;
            }
        }
        total
    }

    /// Global counters summed over CPUs, by name.
    pub fn global_stats(&self) -> Vec<(&'static str, u64)> {
        stat::NAMES
            .iter()
            .enumerate()
            // Index 0 is never counted.
            .filter(|(index, _)| *index as u32 != stat::UNUSED)
            .map(|(index, name)| {
                let total = self
                    .stats
                    .get(&(index as u32), 0)
                    .map(|per_cpu| per_cpu.iter().sum())
                    .unwrap_or(0);
                (*name, total)
            })
            .collect()
    }

    /// Every `loadBalancerSourceRanges` block in the tries, by service id.
    pub fn source_range_blocks(&self) -> Vec<(u32, IpCidr)> {
        let v4 = self
            .source_ranges
            .keys()
            .filter_map(Result::ok)
            .filter_map(|k| source_range_block4(k.prefix_len(), &k.data()));
        let v6 = self
            .source_ranges6
            .keys()
            .filter_map(Result::ok)
            .filter_map(|k| source_range_block6(k.prefix_len(), &k.data()));
        v4.chain(v6).collect()
    }

    /// Packets denied by `loadBalancerSourceRanges`, by service id (ids
    /// with none left out), summed over CPUs.
    pub fn denied_by_service(&self) -> std::collections::BTreeMap<u32, u64> {
        self.service_denied
            .iter()
            .enumerate()
            .filter_map(|(id, per_cpu)| {
                let total: u64 = per_cpu.ok()?.iter().sum();
                (total > 0).then_some((id as u32, total))
            })
            .collect()
    }

    /// Number of connection-tracking entries (both directions).
    pub fn conntrack_len(&self) -> usize {
        self.conntrack.keys().filter(Result::is_ok).count()
    }

    /// Number of IPv6 connection-tracking entries (both directions).
    pub fn conntrack6_len(&self) -> usize {
        self.conntrack6.keys().filter(Result::is_ok).count()
    }

    /// Number of IPv6 socket-layer entries.
    pub fn sockets6_len(&self) -> usize {
        self.sockets6.keys().filter(Result::is_ok).count()
    }
}

/// Removes every entry of `map` that `doomed` selects; returns the keys
/// removed. Generic over the key and value types: the IPv4 and IPv6 maps
/// (and any other hash map) share it.
pub fn purge<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    doomed: &dyn Fn(&K, &V) -> bool,
) -> Vec<K> {
    let victims: Vec<K> = map
        .iter()
        .filter_map(Result::ok)
        .filter(|(key, entry)| doomed(key, entry))
        .map(|(key, _)| key)
        .collect();
    victims
        .into_iter()
        .filter(|key| map.remove(key).is_ok())
        .collect()
}

/// `E2BIG` is what a hash map insert returns when the map is full.
fn write_error(map: &'static str, source: MapError) -> WriteError {
    if let MapError::SyscallError(syscall) = &source {
        if syscall.io_error.raw_os_error() == Some(libc::E2BIG) {
            return WriteError::Full { map };
        }
    }
    WriteError::Other { map, source }
}

/// Writes `entries` with batched system calls; `E2BIG` is a full map.
fn batch_put<K: bytemuck::Pod, V: bytemuck::Pod>(
    map: &'static str,
    data: &MapData,
    entries: &[(K, V)],
) -> Result<(), WriteError> {
    batch_put_fd(map, data.fd().as_fd(), entries)
}

/// [`batch_put`] into the map behind `fd`.
fn batch_put_fd<K: bytemuck::Pod, V: bytemuck::Pod>(
    map: &'static str,
    fd: std::os::fd::BorrowedFd<'_>,
    entries: &[(K, V)],
) -> Result<(), WriteError> {
    batch::update_fd(fd, entries).map_err(|e| {
        if e.error.raw_os_error() == Some(libc::E2BIG) {
            return WriteError::Full { map };
        }
        WriteError::Other {
            map,
            source: MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_update_batch",
                io_error: e.error,
            }),
        }
    })
}

/// Deleting a key that is already gone is not an error for the sync engine.
fn delete_result(map: &'static str, result: Result<(), MapError>) -> Result<(), WriteError> {
    match result {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(source) => Err(WriteError::Other { map, source }),
    }
}

/// Inserts one entry; a full map is [`WriteError::Full`].
fn insert<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    name: &'static str,
    key: K,
    value: V,
) -> Result<(), WriteError> {
    map.insert(key, value, 0).map_err(|e| write_error(name, e))
}

/// Every entry of `map`: in batches (a few system calls for the whole
/// map: the agent's drift check reads these maps every few seconds), or
/// one entry at a time where the kernel refuses batches.
fn entries<K: aya::Pod + bytemuck::Pod, V: aya::Pod + bytemuck::Pod>(
    map: &HashMap<MapData, K, V>,
) -> Vec<(K, V)> {
    use aya::maps::IterableMap as _;
    match crate::dataplane::maps::batch::lookup_all(map.map()) {
        Ok(entries) => entries,
        Err(_) => map.iter().filter_map(Result::ok).collect(),
    }
}

impl MapStore for PinnedMaps {
    fn put_frontend(&mut self, key: AnyFrontendKey, value: FrontendSlot) -> Result<(), WriteError> {
        // The bit before the frontend: the data path never finds a
        // frontend its bitmap hides. Counted once, when its slot 0 is new
        // (held puts go into maps the sync found empty of them).
        if self.frontend_filter.is_some()
            && key.slot() == 0
            && (self.held.is_some() || !self.holds_frontend(key))
        {
            if let Some(filter) = &mut self.frontend_filter {
                filter.add(key)?;
            }
        }
        if let Some(mut held) = self.held.take() {
            let announces = key.slot() == 0 && key.scope() == proxy_common::scope::INTERNAL;
            let spilled = match key {
                AnyFrontendKey::V4(key) => {
                    held.v4.frontend(announces, key, value);
                    held.v4.spill(self.maps4(), &mut held.writer)
                }
                AnyFrontendKey::V6(key) => {
                    held.v6.frontend(announces, key, value);
                    held.v6.spill(self.maps6(), &mut held.writer)
                }
            };
            // Kept on a failure too: the flush reports it again.
            held.spilled += *spilled.as_ref().unwrap_or(&0);
            self.held = Some(held);
            return spilled.map(|_| ());
        }
        match key {
            AnyFrontendKey::V4(key) => insert(&mut self.frontends, names::FRONTENDS, key, value),
            AnyFrontendKey::V6(key) => insert(&mut self.frontends6, names::FRONTENDS6, key, value),
        }
    }
    fn delete_frontend(&mut self, key: AnyFrontendKey) -> Result<(), WriteError> {
        let (name, deleted) = match key {
            AnyFrontendKey::V4(key) => (names::FRONTENDS, self.frontends.remove(&key)),
            AnyFrontendKey::V6(key) => (names::FRONTENDS6, self.frontends6.remove(&key)),
        };
        // Only a key the maps held was counted.
        let existed = deleted.is_ok();
        delete_result(name, deleted)?;
        match &mut self.frontend_filter {
            Some(filter) if existed => filter.remove(key),
            _ => Ok(()),
        }
    }
    fn put_backend(&mut self, id: u32, value: AnyBackend) -> Result<(), WriteError> {
        match (&mut self.held, value) {
            (Some(held), AnyBackend::V4(value)) => held.v4.backends.push((id, value)),
            (Some(held), AnyBackend::V6(value)) => held.v6.backends.push((id, value)),
            (None, AnyBackend::V4(value)) => {
                return insert(&mut self.backends, names::BACKENDS, id, value)
            }
            (None, AnyBackend::V6(value)) => {
                return insert(&mut self.backends6, names::BACKENDS6, id, value)
            }
        }
        Ok(())
    }
    fn delete_backend(&mut self, id: u32, family: IpFamily) -> Result<(), WriteError> {
        match family {
            IpFamily::V4 => delete_result(names::BACKENDS, self.backends.remove(&id)),
            IpFamily::V6 => delete_result(names::BACKENDS6, self.backends6.remove(&id)),
        }
    }
    fn put_revnat(&mut self, service_id: u32, value: AnyRevNat) -> Result<(), WriteError> {
        match (&mut self.held, value) {
            (Some(held), AnyRevNat::V4(value)) => held.v4.revnat.push((service_id, value)),
            (Some(held), AnyRevNat::V6(value)) => held.v6.revnat.push((service_id, value)),
            (None, AnyRevNat::V4(value)) => {
                return insert(&mut self.revnat, names::REVNAT, service_id, value)
            }
            (None, AnyRevNat::V6(value)) => {
                return insert(&mut self.revnat6, names::REVNAT6, service_id, value)
            }
        }
        Ok(())
    }
    fn delete_revnat(&mut self, service_id: u32, family: IpFamily) -> Result<(), WriteError> {
        match family {
            IpFamily::V4 => delete_result(names::REVNAT, self.revnat.remove(&service_id)),
            IpFamily::V6 => delete_result(names::REVNAT6, self.revnat6.remove(&service_id)),
        }
    }
    fn put_maglev(&mut self, service_id: u32, table: &MaglevTable) -> Result<(), WriteError> {
        self.maglev
            .insert(service_id, table, 0)
            .map_err(|e| write_error(names::MAGLEV, e))
    }
    fn delete_maglev(&mut self, service_id: u32) -> Result<(), WriteError> {
        delete_result(names::MAGLEV, self.maglev.remove(&service_id))
    }
    fn maglev(&self, service_id: u32, into: &mut MaglevTable) -> std::io::Result<bool> {
        batch::lookup_into(self.maglev.map(), &service_id, into)
    }
    fn maglev_ids(&self, after: Option<u32>, max: usize) -> std::io::Result<Vec<u32>> {
        let mut ids = Vec::new();
        let mut at = after;
        while ids.len() < max {
            match batch::next_key(self.maglev.map(), at.as_ref())? {
                Some(id) => {
                    ids.push(id);
                    at = Some(id);
                }
                None => break,
            }
        }
        Ok(ids)
    }
    fn put_source_range(&mut self, service_id: u32, block: IpCidr) -> Result<(), WriteError> {
        if let Some((len, data)) = source_range_key4(service_id, &block) {
            return self
                .source_ranges
                .insert(&LpmKey::new(len, data), 1, 0)
                .map_err(|e| write_error(names::SOURCE_RANGES, e));
        }
        match source_range_key6(service_id, &block) {
            Some((len, data)) => self
                .source_ranges6
                .insert(&LpmKey::new(len, data), 1, 0)
                .map_err(|e| write_error(names::SOURCE_RANGES6, e)),
            None => Ok(()),
        }
    }
    fn delete_source_range(&mut self, service_id: u32, block: IpCidr) -> Result<(), WriteError> {
        if let Some((len, data)) = source_range_key4(service_id, &block) {
            return delete_result(
                names::SOURCE_RANGES,
                self.source_ranges.remove(&LpmKey::new(len, data)),
            );
        }
        match source_range_key6(service_id, &block) {
            Some((len, data)) => delete_result(
                names::SOURCE_RANGES6,
                self.source_ranges6.remove(&LpmKey::new(len, data)),
            ),
            None => Ok(()),
        }
    }
    fn purge_conntrack(&mut self, doomed: &dyn Fn(&CtKey, &CtEntry) -> bool) -> usize {
        let removed = purge(&mut self.conntrack, doomed).len();
        self.conntrack_removed(removed);
        removed
    }
    fn purge_sockets(&mut self, doomed: &dyn Fn(&SockKey, &SockEntry) -> bool) -> Vec<SockKey> {
        purge(&mut self.sockets, doomed)
    }
    fn purge_conntrack6(&mut self, doomed: &dyn Fn(&CtKey6, &CtEntry6) -> bool) -> usize {
        let removed = purge(&mut self.conntrack6, doomed).len();
        self.conntrack_removed(removed);
        removed
    }
    fn purge_sockets6(&mut self, doomed: &dyn Fn(&SockKey6, &SockEntry6) -> bool) -> Vec<SockKey6> {
        purge(&mut self.sockets6, doomed)
    }
    fn hold_puts(&mut self) {
        self.held.get_or_insert_with(Held::default);
        if let Some(filter) = &mut self.frontend_filter {
            filter.hold();
        }
    }
    fn flush(&mut self) -> Result<usize, WriteError> {
        // The bits before the slot 0s that need them (the spills write no
        // slot 0).
        if let Some(filter) = &mut self.frontend_filter {
            filter.release()?;
        }
        let Some(mut held) = self.held.take() else {
            return Ok(0);
        };
        // Every spilled entry is in before the rest and the slot 0s.
        if let Some(writer) = &mut held.writer {
            writer.finish()?;
        }
        let v4 = held.v4.flush(self.maps4())?;
        let v6 = held.v6.flush(self.maps6())?;
        Ok(held.spilled + v4 + v6)
    }
    fn dump(&self) -> Dump {
        Dump {
            frontends: entries(&self.frontends)
                .into_iter()
                .map(|(k, v)| (AnyFrontendKey::V4(k), v))
                .chain(
                    entries(&self.frontends6)
                        .into_iter()
                        .map(|(k, v)| (AnyFrontendKey::V6(k), v)),
                )
                .collect(),
            backends: entries(&self.backends)
                .into_iter()
                .map(|(id, b)| (id, AnyBackend::V4(b)))
                .chain(
                    entries(&self.backends6)
                        .into_iter()
                        .map(|(id, b)| (id, AnyBackend::V6(b))),
                )
                .collect(),
            revnat: entries(&self.revnat)
                .into_iter()
                .map(|(id, r)| (id, AnyRevNat::V4(r)))
                .chain(
                    entries(&self.revnat6)
                        .into_iter()
                        .map(|(id, r)| (id, AnyRevNat::V6(r))),
                )
                .collect(),
            source_ranges: self.source_range_blocks(),
        }
    }
}
