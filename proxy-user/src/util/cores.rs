//! Work spread over the cores.

/// `work` applied to `items` in chunks, one per core (a chunk of fewer than
/// `per_thread_min` items is not worth a thread: all on this one then),
/// the results in the items' order. A panic in a chunk is re-raised here.
pub fn chunks_on_cores<T, U, F>(items: &[T], per_thread_min: usize, work: F) -> Vec<U>
where
    T: Sync,
    U: Send,
    F: Fn(&[T]) -> Vec<U> + Sync,
{
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let threads = cores.min(items.len() / per_thread_min.max(1)).max(1);
    if threads == 1 {
        return work(items);
    }
    let per_thread = items.len().div_ceil(threads);
    let work = &work;
    std::thread::scope(|scope| {
        let running: Vec<_> = items
            .chunks(per_thread)
            .map(|chunk| scope.spawn(move || work(chunk)))
            .collect();
        running
            .into_iter()
            .flat_map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_order_whatever_the_split() {
        let items: Vec<u32> = (0..1000).collect();
        let doubled = |chunk: &[u32]| chunk.iter().map(|i| i * 2).collect::<Vec<_>>();
        for min in [1, 10, 400, 2000] {
            let out = chunks_on_cores(&items, min, doubled);
            assert_eq!(
                out,
                items.iter().map(|i| i * 2).collect::<Vec<_>>(),
                "{min}"
            );
        }
        assert!(chunks_on_cores(&[] as &[u32], 1, doubled).is_empty());
    }
}
