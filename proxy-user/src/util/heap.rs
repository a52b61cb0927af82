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
//! [`tune`] turns fast bins off and keeps one arena for every thread; [`trim`] hands what a
//! large sync freed back to the kernel. Both are glibc's; elsewhere they do
//! nothing. One arena rather than two (start rows at 10k and 100k
//! Services, both sources, quiet machine): RSS at 10k 50.0 → 47.9 MiB from
//! the cluster source (whose programs now load on a thread of their own
//! while the first view is read, a second arena's fragments), 46.9 → 46.3
//! from YAML, at 100k 282 → 279 (peaks 297 → 293); the threads share the
//! arena's lock, so the start at 100k is slower, 3.58 → 3.81 s (YAML) and
//! 4.33 → 4.74 s (cluster). [`Counting`] counts the bytes the program holds on the heap, so
//! the agent can say where its memory goes ([`heap`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::thread::LocalKey;

pub use crate::util::malloc::tune;

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

/// Asks the kernel to reclaim the whole pages of `bytes` now (they are
/// read from the file again if they are ever touched). For data read once
/// at the start, such as the eBPF object the binary embeds (6.7 MiB, all
/// resident after the load parsed it): it stays in the binary's file, not in
/// the agent's RSS. Content is kept whatever the memory is
/// (`MADV_PAGEOUT` reclaims, never discards); pages mapped by another
/// process too, or a kernel before 5.4, leave the RSS as it was. Returns
/// the bytes asked for.
pub fn release(bytes: &[u8]) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    let start = (bytes.as_ptr() as usize).next_multiple_of(page);
    let end = (bytes.as_ptr() as usize + bytes.len()) / page * page;
    if end <= start {
        return 0;
    }
    // SAFETY: [start, end) lies within `bytes`, memory this process has
    // mapped; MADV_PAGEOUT only reclaims pages (their content stays
    // readable) and changes nothing the program can observe.
    let done =
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT) };
    if done != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "the kernel did not reclaim the pages asked for"
        );
        return 0;
    }
    end - start
}

/// The heap as [`Counting`] sees it: bytes the program asked for and has
/// not freed (what it holds, without the allocator's own overhead and free
/// lists), and the most it held at once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Heap {
    pub live: usize,
    pub peak: usize,
    /// Blocks held (allocations not freed): each costs the allocator a
    /// header and rounding beyond its bytes (glibc: 8 to 23 bytes).
    pub blocks: usize,
}

impl Heap {
    pub fn live_mib(self) -> f64 {
        self.live as f64 / 1_048_576.0
    }
    pub fn peak_mib(self) -> f64 {
        self.peak as f64 / 1_048_576.0
    }
}

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
static BLOCKS: AtomicIsize = AtomicIsize::new(0);

/// How far one thread's own count may run before it is added to the
/// shared one: the shared counters are touched once per this many bytes
/// allocated or freed, not at every allocation (a counter every thread
/// writes at every allocation made the parse threads wait on each other).
const FLUSH_BYTES: isize = 64 * 1024;

thread_local! {
    /// This thread's bytes allocated minus freed, not yet added to [`LIVE`].
    static PENDING: Cell<isize> = const { Cell::new(0) };
    /// This thread's blocks allocated minus freed, not yet added to [`BLOCKS`].
    static PENDING_BLOCKS: Cell<isize> = const { Cell::new(0) };
}

/// How far one thread's block count may run before it is added to the
/// shared one.
const FLUSH_BLOCKS: isize = 1024;

/// Adds `delta` to this thread's `pending` count; returns what is due to
/// the shared counter (the whole count once it reaches `flush_at`, else 0).
/// After this thread's locals are gone (its exit), `delta` is due directly.
fn pend(pending: &'static LocalKey<Cell<isize>>, delta: isize, flush_at: isize) -> isize {
    pending
        .try_with(|pending| {
            let now = pending.get() + delta;
            if now.abs() < flush_at {
                pending.set(now);
                return 0;
            }
            pending.set(0);
            now
        })
        .unwrap_or(delta)
}

fn count_block(delta: isize) {
    let flush = pend(&PENDING_BLOCKS, delta, FLUSH_BLOCKS);
    if flush != 0 {
        BLOCKS.fetch_add(flush, Ordering::Relaxed);
    }
}

/// The system allocator, counting the bytes held: each thread counts on
/// its own and adds to the shared counters every [`FLUSH_BYTES`], so
/// [`heap`] is exact to within that much per thread. The `switchboard`
/// binary installs it as its global allocator; elsewhere [`heap`] reads zeros.
pub struct Counting;

fn count(delta: isize) {
    let flush = pend(&PENDING, delta, FLUSH_BYTES);
    if flush != 0 {
        let now = LIVE.fetch_add(flush, Ordering::Relaxed) + flush;
        if flush > 0 {
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
    }
}

fn grew(by: usize) {
    count(isize::try_from(by).unwrap_or(isize::MAX));
}

fn shrank(by: usize) {
    count(-isize::try_from(by).unwrap_or(isize::MAX));
}

// SAFETY: every call is passed to `System` unchanged; the counters only
// record the sizes of what it returned and was given back.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees for `layout` are System's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
            count_block(1);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
            count_block(1);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (so from System) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
        count_block(-1);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and `new_size` is the caller's to vouch for.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

/// What [`Counting`] has seen so far (zeros when it is not the global
/// allocator), with this thread's own count added.
pub fn heap() -> Heap {
    let pending = PENDING.try_with(Cell::get).unwrap_or(0);
    let live = LIVE.load(Ordering::Relaxed) + pending;
    let peak = PEAK.load(Ordering::Relaxed).max(live);
    let blocks = BLOCKS.load(Ordering::Relaxed) + PENDING_BLOCKS.try_with(Cell::get).unwrap_or(0);
    Heap {
        live: usize::try_from(live).unwrap_or(0),
        peak: usize::try_from(peak).unwrap_or(0),
        blocks: usize::try_from(blocks).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only this test counts (the tests do not run with [`Counting`]
    /// installed), so the shared counters move only with it.
    #[test]
    fn threads_count_on_their_own_and_add_up_every_flush() {
        let start = heap();
        std::thread::spawn(move || {
            grew(1000);
            assert_eq!(
                heap().live,
                start.live + 1000,
                "this thread sees its own count"
            );
        })
        .join()
        .expect("thread");
        assert_eq!(heap().live, start.live, "not added yet (under a flush)");
        std::thread::spawn(move || {
            grew(1000);
            grew(FLUSH_BYTES as usize);
        })
        .join()
        .expect("thread");
        let big = start.live + 1000 + FLUSH_BYTES as usize;
        assert_eq!(heap().live, big, "added at the flush");
        assert!(heap().peak >= big);
        std::thread::spawn(|| shrank(FLUSH_BYTES as usize))
            .join()
            .expect("thread");
        assert_eq!(heap().live, start.live + 1000, "freed at the next flush");
        assert!(heap().peak >= big, "the peak stays");
    }
}
