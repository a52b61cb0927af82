//! glibc's malloc: the agent's settings ([`tune`], why in `util::heap`)
//! and what it holds, for probes that say where the memory goes.

/// The allocator's own view of the heap (all arenas), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MallocStats {
    /// Obtained from the system for the arenas (not counting large blocks
    /// mapped on their own).
    pub arena: usize,
    /// Large blocks mapped on their own.
    pub mapped: usize,
    /// Handed out to the program and not freed.
    pub in_use: usize,
    /// Free inside the arenas (kept for reuse, resident unless trimmed).
    pub free: usize,
}

impl MallocStats {
    /// Now, when the allocator is glibc's.
    pub fn now() -> Option<MallocStats> {
        #[cfg(target_env = "gnu")]
        {
            // SAFETY: mallinfo2 only reads the allocator's counters.
            let info = unsafe { libc::mallinfo2() };
            Some(MallocStats {
                arena: info.arena,
                mapped: info.hblkhd,
                in_use: info.uordblks,
                free: info.fordblks,
            })
        }
        #[cfg(not(target_env = "gnu"))]
        None
    }
}

/// `bytes` in MiB.
pub fn mib(bytes: usize) -> f64 {
    bytes as f64 / 1_048_576.0
}

/// Call once, before the runtime starts its threads.
pub fn tune() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes allocator tuning; it is called before
        // any other thread exists, and both values are in range (M_MXFAST 0
        // turns fast bins off; M_ARENA_MAX takes any positive count).
        let (fast, arenas) = unsafe {
            (
                libc::mallopt(libc::M_MXFAST, 0),
                libc::mallopt(libc::M_ARENA_MAX, 1),
            )
        };
        if fast != 1 || arenas != 1 {
            tracing::debug!(
                fast,
                arenas,
                "glibc refused a malloc setting; it stays at its default"
            );
        }
    }
}
