//! Keeping the agent's memory use close to what it holds, with glibc's malloc.
//!
//! The agent's working set is long-lived (the model and the sync's
//! bookkeeping), but a start or a relist passes the whole cluster through
//! short-lived allocations (parsed manifests, decoded list pages) on several
//! threads, interleaved with the objects that stay. Left at its defaults,
//! glibc's malloc handles that badly at scale:
//!
//! - its fast bins are consolidated whenever a larger block is asked for, and
//!   with millions of small live objects in between, a 100k-Service manifest
//!   directory took 35 s to read, most of it in that consolidation (14 s
//!   without fast bins, 11 s with mimalloc, which however keeps 24 MiB more
//!   resident at 1k Services);
//! - it keeps one arena per thread that ever allocated, and what was freed
//!   stays resident.
//!
//! [`tune`] turns fast bins off and caps the arenas; [`trim`] hands what a
//! large sync freed back to the kernel. Both are glibc's; elsewhere they do
//! nothing.

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
                libc::mallopt(libc::M_ARENA_MAX, 2),
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

/// Returns free memory at the top of the heaps and free pages inside them
/// to the kernel. Costs a walk over the free lists (about a millisecond per
/// hundred MiB): call it after a sync that replaced many objects, not after
/// every change.
pub fn trim() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim only releases memory the allocator holds free;
        // no pointer the program owns is affected.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}
