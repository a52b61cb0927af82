//! Keeping the agent's memory use close to what it holds.
//!
//! The agent's working set is long-lived (the model and the sync's
//! bookkeeping), but a start or a relist passes the whole cluster through
//! short-lived allocations (decoded list pages, parsed manifests), interleaved
//! with the objects that stay. glibc's malloc handles that badly at scale: a
//! 100k-Service directory took 35 s to read, most of it consolidating free
//! chunks, and 11 s with mimalloc, which the `switchboard` binary uses as its
//! global allocator (`main.rs`). [`trim`] hands what a large sync freed back
//! to the kernel.

/// Returns memory freed since the last trim to the kernel. Costs a walk over
/// the allocator's pages: call it after a sync that replaced many objects,
/// not after every change.
pub fn trim() {
    // SAFETY: mi_collect only releases pages the allocator holds free; no
    // pointer the program owns is affected. Without mimalloc as the global
    // allocator (tests, benches) it releases mimalloc's own, empty, heaps.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
