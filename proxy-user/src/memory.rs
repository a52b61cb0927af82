//! Keeping the agent's resident memory close to what it holds.
//!
//! The agent's working set is small and long-lived (the model and the sync's
//! bookkeeping), but a start or a relist passes the whole cluster through
//! short-lived allocations (decoded list pages, parsed manifests) on several
//! threads. glibc's allocator keeps what was freed: in one arena per thread
//! that ever allocated, and inside the heap wherever a live allocation sits
//! above the freed space. Left alone, an agent at 10k Services stays at the
//! peak of its start for the rest of its life.
//!
//! Two things bring it back: fewer arenas ([`limit_arenas`], at start) and
//! handing free pages back to the kernel after a large sync ([`trim`]). Both
//! are glibc's; elsewhere they do nothing.

/// Caps glibc's arenas (one per thread by default, up to 8 per core): the
/// runtime's two workers, the main thread (which runs the sync) and the
/// occasional blocking thread share two instead of fragmenting one each.
pub fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only changes allocator tuning; it is called before
        // any other thread exists, and M_ARENA_MAX takes any positive value.
        let accepted = unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
        if accepted != 1 {
            tracing::debug!("glibc refused M_ARENA_MAX; arenas stay at their default");
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
