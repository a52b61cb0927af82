//! Default map capacities. The agent may override them at load time.
/// Frontend map entries: one per service port plus one per backend slot.
pub const FRONTENDS: u32 = 65_536;
pub const BACKENDS: u32 = 65_536;
/// Connection-tracking entries (two per flow). Not LRU: a full table
/// refuses new flows rather than evicting live ones. Allocated per entry:
/// an empty table costs its bucket array only (16 bytes an entry).
pub const CONNTRACK: u32 = 524_288;
/// Socket-layer translations: two per balanced UDP socket and service, one
/// per connected socket (LRU: the oldest go first).
pub const SOCKETS: u32 = 262_144;
/// Session-affinity entries (one per client address and service port).
pub const AFFINITY: u32 = 65_536;
/// Service ids are indices into the per-service counters and the reverse-NAT
/// map, so this bounds the number of service ports (`--max-services`). Ids
/// are 1..=SERVICES (0 is never used), so the per-service counter array
/// has SERVICES + 1 entries.
pub const SERVICES: u32 = 16_384;
/// Uplink interfaces per node.
pub const UPLINKS: u32 = 64;
/// Fragmented datagrams in flight whose translation is remembered (LRU).
pub const FRAGMENTS: u32 = 8_192;
/// The size the LRU flow tables (socket layer, affinity, fragments, both
/// families) start at (`--flow-table-start-entries`): an LRU map is
/// preallocated, every entry it may hold paid for at once, so each starts
/// this small and the agent grows it online when it is half full, up to
/// its maximum.
pub const FLOW_TABLE_START: u32 = 4_096;
/// Entries of one Maglev table: a prime (Maglev needs one), about 100×
/// the backends a Service usually has, so each backend's share is even
/// to within about 1%.
pub const MAGLEV_TABLE: u32 = 16_381;
/// The most backends one service port can have: the data path picks a
/// slot in `1..=min(backend_count, this)` (slots are `u16`), and a Maglev
/// table needs more entries than backends ([`MAGLEV_TABLE`] − 1).
/// `--max-endpoints-per-service` may be set up to this.
pub const MAX_BACKENDS_PER_SERVICE: u16 = (MAGLEV_TABLE - 1) as u16;
/// A weighted set (`switchboard.io/weights`) repeats each backend in
/// proportion to its weight in at most `max(this, 4 × its backends)` slots
/// (and never more than [`MAX_BACKENDS_PER_SERVICE`] with its drained
/// ones): each backend's share is then right to within one slot in 1,024.
pub const WEIGHTED_SLOTS: u16 = 1_024;
/// `--max-endpoints-per-service` by default.
pub const DEFAULT_BACKENDS_PER_SERVICE: u16 = 4_096;
/// `loadBalancerSourceRanges` blocks per family, all restricted
/// frontends together. The tries are allocated per entry
/// (`BPF_F_NO_PREALLOC`), so an unused capacity costs nothing.
pub const SOURCE_RANGES: u32 = 65_536;
