//! The connection-tracking table's generation (`SB_CT_GEN_V1`, one `u64`).
//! The data path's per-CPU flow caches hold the generation they were
//! filled at and answer only while it still holds
//! (`proxy-ebpf/src/ct/cache.rs`). The agent moves it on after it removes
//! entries (a pass of the collector that removed any, a purge), by
//! [`CT_GEN_AGENT_STEP`] with a read and a write: only the agent writes it.
//! The data path voids only the slot of a key whose entry it removes or
//! replaces (a generation per slot index, its own map).
//!
//! A generation that is not moved on (the write failed) costs at most one
//! refresh interval (`CT_REFRESH_NS`): a slot stands for its entry only
//! until the entry's last-seen time is due again, and a removed entry is
//! never cached again.
use aya::maps::{Array, MapData, MapError};
use proxy_common::CT_GEN_AGENT_STEP;

/// The generation's map, as the agent writes it.
pub struct CtGeneration(Array<MapData, u64>);

impl CtGeneration {
    pub fn new(map: Array<MapData, u64>) -> Self {
        Self(map)
    }

    /// Moves the generation on after the agent removed entries.
    pub fn advance(&mut self) -> Result<(), MapError> {
        let now = self.0.get(&0, 0)?;
        self.0.set(0, now.wrapping_add(CT_GEN_AGENT_STEP), 0)
    }

    /// The generation as it is now (the kernel tests read it).
    pub fn read(&self) -> Result<u64, MapError> {
        self.0.get(&0, 0)
    }
}
