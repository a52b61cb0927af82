//! Building large B-tree maps whole, without one large transient block.

use std::collections::BTreeMap;

/// The most bytes of entries gathered at once.
///
/// glibc's malloc serves a block this large or larger from a mapping of its
/// own, and when such a block is freed it raises the size below which it
/// serves blocks from its heaps, and the free space it keeps at their top,
/// to that block's size (its dynamic mmap threshold). One transient vector
/// of all 100k keys (5 MiB) left the agent's heaps holding 10 MiB more
/// than what it used, for good.
const CHUNK_BYTES: usize = 512 * 1024;

/// Moves `items` into `map`: each chunk of them built into a map whole
/// (full nodes; one insert at a time leaves the nodes of an ordered run
/// half empty), then appended (merged, again into full nodes). An item whose
/// key `map` has, or an earlier item of its chunk had, goes to `merge`.
pub fn extend_whole<K: Ord, V>(
    map: &mut BTreeMap<K, V>,
    items: impl IntoIterator<Item = (K, V)>,
    mut merge: impl FnMut(&K, &mut V, V),
) {
    let per_chunk = (CHUNK_BYTES / std::mem::size_of::<(K, V)>().max(1)).max(1);
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        let mut chunk: Vec<(K, V)> = Vec::with_capacity(per_chunk);
        for (key, value) in items.by_ref().take(per_chunk) {
            match map.get_mut(&key) {
                Some(old) => merge(&key, old, value),
                None => chunk.push((key, value)),
            }
        }
        // Stable: equal keys stay in the order they came.
        chunk.sort_by(|a, b| a.0.cmp(&b.0));
        let mut unique: Vec<(K, V)> = Vec::with_capacity(chunk.len());
        for (key, value) in chunk {
            match unique.last_mut() {
                Some((last, old)) if *last == key => merge(last, old, value),
                _ => unique.push((key, value)),
            }
        }
        let mut part: BTreeMap<K, V> = unique.into_iter().collect();
        map.append(&mut part);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_moved_in_and_repeated_keys_merged() {
        let mut map: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        map.insert(5, vec![0]);
        // More than a chunk, keys out of order and repeated.
        let items = (0..200_000u32).rev().map(|i| (i % 70_000, vec![i]));
        extend_whole(&mut map, items, |_, old, new| old.extend(new));
        assert_eq!(map.len(), 70_000);
        assert_eq!(map[&5], [0, 140_005, 70_005, 5]);
        assert_eq!(map[&69_999], [139_999, 69_999]);
        assert!(map.keys().copied().eq(0..70_000));
    }
}
