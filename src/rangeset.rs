//! A set of `u64` kept as sorted, disjoint, non-adjacent inclusive ranges: memory grows with
//! the number of holes, not of members (`gaps` holds one per source and epoch). Std only.

use std::collections::BTreeMap;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RangeSet {
    /// start -> end (inclusive); no two ranges overlap or touch.
    ranges: BTreeMap<u64, u64>,
    members: u64,
}

impl RangeSet {
    #[cfg(test)]
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Adds `x`, merging it with the ranges it touches.
    pub fn insert(&mut self, x: u64) {
        let below = self.ranges.range(..=x).next_back().map(|(s, e)| (*s, *e));
        if below.is_some_and(|(_, end)| end >= x) {
            return;
        }
        self.members += 1;
        let above = x
            .checked_add(1)
            .and_then(|next| self.ranges.get(&next).map(|e| (next, *e)));
        match (below, above) {
            (Some((start, end)), Some((next, next_end))) if end + 1 == x => {
                self.ranges.remove(&next);
                self.ranges.insert(start, next_end);
            }
            (Some((start, end)), _) if end + 1 == x => {
                self.ranges.insert(start, x);
            }
            (_, Some((next, next_end))) => {
                self.ranges.remove(&next);
                self.ranges.insert(x, next_end);
            }
            _ => {
                self.ranges.insert(x, x);
            }
        }
    }

    #[cfg(test)]
    pub fn contains(&self, x: u64) -> bool {
        self.ranges
            .range(..=x)
            .next_back()
            .is_some_and(|(_, end)| *end >= x)
    }

    /// How many distinct numbers were inserted.
    pub fn len(&self) -> u64 {
        self.members
    }

    pub fn min(&self) -> Option<u64> {
        self.ranges.keys().next().copied()
    }

    pub fn max(&self) -> Option<u64> {
        self.ranges.values().next_back().copied()
    }

    /// The member ranges, ascending, as inclusive `(start, end)`.
    #[cfg(test)]
    pub fn ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(s, e)| (*s, *e))
    }

    /// The holes between `min` and `max`, ascending, as inclusive `(from, to)`.
    pub fn gaps(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges
            .iter()
            .zip(self.ranges.iter().skip(1))
            .map(|((_, end), (next, _))| (end + 1, next - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(xs: impl IntoIterator<Item = u64>) -> RangeSet {
        let mut s = RangeSet::new();
        for x in xs {
            s.insert(x);
        }
        s
    }

    #[test]
    fn holes_between_seen_sequences_are_the_gaps() {
        let s = set((1..=5).chain([9]).chain(12..=20));
        assert_eq!(s.gaps().collect::<Vec<_>>(), [(6, 8), (10, 11)]);
        assert_eq!(s.ranges().collect::<Vec<_>>(), [(1, 5), (9, 9), (12, 20)]);
        assert_eq!((s.min(), s.max(), s.len()), (Some(1), Some(20), 15));
    }

    #[test]
    fn inserts_in_any_order_merge_into_the_same_ranges() {
        let fwd = set([1, 2, 3, 5, 6, 8]);
        let back = set([8, 6, 5, 3, 2, 1, 3, 6]);
        assert_eq!(fwd, back);
        assert_eq!(fwd.ranges().collect::<Vec<_>>(), [(1, 3), (5, 6), (8, 8)]);
        let mut filled = fwd.clone();
        filled.insert(4);
        filled.insert(7);
        assert_eq!(filled.ranges().collect::<Vec<_>>(), [(1, 8)]);
        assert_eq!(filled.gaps().count(), 0);
        assert_eq!(filled.len(), 8);
    }

    #[test]
    fn extremes_do_not_overflow() {
        let s = set([u64::MAX, 0, u64::MAX - 1, 1]);
        assert_eq!(
            s.ranges().collect::<Vec<_>>(),
            [(0, 1), (u64::MAX - 1, u64::MAX)]
        );
        assert_eq!(s.gaps().collect::<Vec<_>>(), [(2, u64::MAX - 2)]);
        assert!(s.contains(u64::MAX) && !s.contains(2));
    }

    #[test]
    fn matches_a_naive_set_on_pseudo_random_inserts() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut naive = std::collections::BTreeSet::new();
        let mut s = RangeSet::new();
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = x % 3000;
            naive.insert(v);
            s.insert(v);
        }
        assert_eq!(s.len(), naive.len() as u64);
        assert!((0..3000).all(|v| s.contains(v) == naive.contains(&v)));
        let mut covered: u64 = 0;
        for (a, b) in s.ranges() {
            covered += b - a + 1;
        }
        assert_eq!(covered, s.len());
    }
}
