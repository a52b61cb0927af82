//! Weighted backend sets (`switchboard.io/weights`): each backend's share of
//! the set's slots, and the slot layout the data path picks from.
//!
//! New flows pick a slot in `1..=count` (at random, in turn, or the less
//! loaded of two), so a backend repeated in proportion to its weight gets
//! that share of new flows at no cost per packet: the pick is the same one
//! lookup as without weights. The table is bounded
//! ([`capacity::WEIGHTED_SLOTS`]): weights whose sum is larger are scaled
//! down, each live backend keeping at least one slot. Drained backends
//! (weight 0) get a slot past the count, which no new flow picks, so their
//! backend entries stay for the flows they have (and a restarted agent
//! finds them). Maglev and source hash use the same shares to weight their
//! table's population ([`super::maglev::table_weighted`]).

use proxy_common::capacity;

/// A weighted set's slots, slot 1 first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The index (into the set) of each slot's backend: the table, then the
    /// drained backends.
    pub slots: Vec<usize>,
    /// Each slot's share (0 for a drained backend's).
    pub shares: Vec<u16>,
    /// Slots new flows pick from (the table's length).
    pub picked: usize,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Each backend's share of the slots for `weights` (one per backend of the
/// set, in its order), or `None` when the weights are all equal and none
/// is 0: the set is then laid out as an unweighted one.
///
/// Shares are the weights divided by their greatest common divisor. When
/// their sum is above the bound `B = max(WEIGHTED_SLOTS, 4 × live
/// backends)` (at most [`capacity::MAX_BACKENDS_PER_SERVICE`] with the
/// drained ones), each live backend gets `1 + ⌊w × (B − live) / sum⌋`:
/// at least one slot, at most `B` in all, each share within one slot of
/// exact.
pub fn shares(weights: &[u16]) -> Option<Vec<u16>> {
    let live: Vec<u64> = weights
        .iter()
        .filter(|w| **w > 0)
        .map(|w| u64::from(*w))
        .collect();
    let drained = weights.len() - live.len();
    if drained == 0 && live.windows(2).all(|w| w[0] == w[1]) {
        return None;
    }
    let divisor = live.iter().copied().fold(0, gcd).max(1);
    let mut reduced: Vec<u64> = weights.iter().map(|w| u64::from(*w) / divisor).collect();
    let sum: u64 = reduced.iter().sum();
    let n = live.len() as u64;
    let cap = u64::from(capacity::MAX_BACKENDS_PER_SERVICE).saturating_sub(drained as u64);
    let bound = (4 * n)
        .max(u64::from(capacity::WEIGHTED_SLOTS))
        .min(cap)
        .max(n);
    if sum > bound {
        for w in reduced.iter_mut().filter(|w| **w > 0) {
            *w = 1 + *w * (bound - n) / sum;
        }
        let divisor = reduced.iter().copied().fold(0, gcd).max(1);
        for w in &mut reduced {
            *w /= divisor;
        }
    }
    let shares: Vec<u16> = reduced
        .iter()
        .map(|w| u16::try_from(*w).unwrap_or(u16::MAX))
        .collect();
    if drained == 0 && shares.windows(2).all(|w| w[0] == w[1]) {
        return None;
    }
    Some(shares)
}

/// The slot layout of a `least-conn` set whose backends have `weights`:
/// each live backend in one slot (its share recorded there), the drained
/// after them. Least-connection draws its two candidates uniformly among
/// the backends and weighs them by comparing open flows ÷ share; drawing
/// from a repeated table as well would count a heavy backend twice (it
/// would often be both candidates and win unopposed).
pub fn layout_once(weights: &[u16]) -> Option<Layout> {
    let shares = shares(weights)?;
    let live = (0..shares.len()).filter(|i| shares[*i] > 0);
    let drained = (0..shares.len()).filter(|i| shares[*i] == 0);
    let slots: Vec<usize> = live.chain(drained).collect();
    let picked = shares.iter().filter(|s| **s > 0).count();
    Some(Layout {
        shares: slots.iter().map(|i| shares[*i]).collect(),
        slots,
        picked,
    })
}

/// The slot layout of a set whose backends have `weights` (in the set's
/// order), or `None` when they are all equal and none is 0 ([`shares`]).
///
/// A backend's copies are spread over the table, not bunched: copy `k` of
/// a backend with share `s` sits at the place `(k + ½) / s` orders it
/// among all copies (ties by the set's order), so round-robin takes
/// backends in an interleaved turn (3:1 gives `a a b a`, not `a a a b`).
pub fn layout(weights: &[u16]) -> Option<Layout> {
    let shares = shares(weights)?;
    let mut copies: Vec<(u64, u64, usize)> = Vec::new();
    for (index, share) in shares.iter().enumerate() {
        let share = u64::from(*share);
        copies.extend((0..share).map(|k| (2 * k + 1, share, index)));
    }
    // (2k + 1) / (2 s) compared without division.
    copies.sort_by(|a, b| (a.0 * b.1).cmp(&(b.0 * a.1)).then(a.2.cmp(&b.2)));
    let picked = copies.len();
    let mut slots: Vec<usize> = copies.iter().map(|c| c.2).collect();
    let mut slot_shares: Vec<u16> = copies.iter().map(|c| shares[c.2]).collect();
    for (index, _) in shares.iter().enumerate().filter(|(_, s)| **s == 0) {
        slots.push(index);
        slot_shares.push(0);
    }
    Some(Layout {
        slots,
        shares: slot_shares,
        picked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(layout: &Layout, n: usize) -> Vec<usize> {
        let mut counts = vec![0; n];
        for index in &layout.slots[..layout.picked] {
            counts[*index] += 1;
        }
        counts
    }

    #[test]
    fn least_conn_sets_hold_each_backend_once_with_its_share() {
        let l = layout_once(&[0, 3, 1]).expect("weighted");
        assert_eq!(l.slots, vec![1, 2, 0]);
        assert_eq!(l.shares, vec![3, 1, 0]);
        assert_eq!(l.picked, 2);
        assert_eq!(layout_once(&[2, 2]), None);
    }

    #[test]
    fn equal_weights_are_no_weights() {
        assert_eq!(layout(&[1, 1, 1]), None);
        assert_eq!(layout(&[7, 7]), None);
        assert_eq!(layout(&[]), None);
        // Equal after scaling down is still equal.
        assert_eq!(shares(&[65_535, 65_535]), None);
    }

    #[test]
    fn shares_follow_the_weights_reduced() {
        assert_eq!(shares(&[3, 1]), Some(vec![3, 1]));
        assert_eq!(shares(&[30, 10, 20]), Some(vec![3, 1, 2]));
        assert_eq!(shares(&[2, 0, 2]), Some(vec![1, 0, 1]));
        assert_eq!(shares(&[0, 0]), Some(vec![0, 0]));
    }

    #[test]
    fn copies_are_interleaved_and_drained_backends_come_last() {
        let l = layout(&[3, 0, 1]).expect("weighted");
        assert_eq!(l.picked, 4);
        assert_eq!(l.slots, vec![0, 0, 2, 0, 1]);
        assert_eq!(l.shares, vec![3, 3, 1, 3, 0]);
        assert_eq!(counts(&l, 3), vec![3, 0, 1]);
    }

    #[test]
    fn a_table_stays_within_its_bound_and_near_the_weights() {
        // 4 backends, weights summing far above the bound.
        let weights = [65_535, 40_000, 1, 1000];
        let l = layout(&weights).expect("weighted");
        let bound = usize::from(capacity::WEIGHTED_SLOTS);
        assert!(l.picked <= bound, "{} slots", l.picked);
        let sum: f64 = weights.iter().map(|w| f64::from(*w)).sum();
        for (i, c) in counts(&l, 4).iter().enumerate() {
            assert!(*c >= 1, "every live backend keeps a slot");
            let want = f64::from(weights[i]) / sum;
            let got = *c as f64 / l.picked as f64;
            assert!(
                (want - got).abs() <= 2.0 / bound as f64,
                "backend {i}: {got} vs {want}"
            );
        }
        // Many backends: 4 slots per backend at most.
        let many: Vec<u16> = (1..=2000).map(|i| (i % 7 + 1) as u16).collect();
        let l = layout(&many).expect("weighted");
        assert!(l.picked <= 4 * 2000);
        assert!(counts(&l, 2000).iter().all(|c| *c >= 1));
        // Never more than a service port's slots, drained ones included.
        let most: Vec<u16> = (0..usize::from(capacity::MAX_BACKENDS_PER_SERVICE))
            .map(|i| if i == 0 { 0 } else { (i % 3 + 1) as u16 })
            .collect();
        let l = layout(&most).expect("weighted");
        assert!(l.slots.len() <= usize::from(capacity::MAX_BACKENDS_PER_SERVICE));
    }
}
