//! The writer's merge of the audit indexes' old blocks into segments (redb only): the rows of
//! a complete segment of `IndexMerge::blocks` blocks move from their blocks' buckets to one
//! merged bucket per key prefix or source number (`tables::MERGED`), a bounded number per
//! write transaction, in (low 32 bits, audit index) order, so that the merged buckets grow at
//! their tail like the blocks do and a lookup of an old entry reads one bucket per segment.
//!
//! Invariant: a row is in exactly one place: its block's bucket, or its segment's merged
//! bucket once (`IndexMerge`'s mark for the index) says it is merged; the move and the mark
//! are written in one transaction.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use redb::{ReadableTable, Table};

use super::StoreError;
use super::tables::{IndexMerge, MergeMark, audit_key_block_start, merged_bucket, merged_range};

/// The value of an index row (`()` for `AUDIT_KEYS`, the position for `AUDIT_SOURCES`),
/// owned so a row can be held while the table is written.
pub trait IndexRow: redb::Value + Sized + 'static {
    type Owned: Copy + Ord;
    fn owned(v: Self::SelfType<'_>) -> Self::Owned;
    fn insert(
        t: &mut Table<'_, (u64, u64), Self>,
        key: (u64, u64),
        v: Self::Owned,
    ) -> Result<(), StoreError>;
}

impl IndexRow for () {
    type Owned = ();
    fn owned(_: ()) {}
    fn insert(t: &mut Table<'_, (u64, u64), ()>, key: (u64, u64), _: ()) -> Result<(), StoreError> {
        t.insert(key, ()).map_err(StoreError::redb)?;
        Ok(())
    }
}

impl IndexRow for (u64, u64) {
    type Owned = (u64, u64);
    fn owned(v: (u64, u64)) -> (u64, u64) {
        v
    }
    fn insert(
        t: &mut Table<'_, (u64, u64), (u64, u64)>,
        key: (u64, u64),
        v: (u64, u64),
    ) -> Result<(), StoreError> {
        t.insert(key, v).map_err(StoreError::redb)?;
        Ok(())
    }
}

/// The segments a merge may take: those from `first` (the one the oldest kept entry lies
/// in) below `complete` (every entry of which has been appended).
#[derive(Debug, Clone, Copy)]
pub struct Mergeable {
    pub first: u64,
    pub complete: u64,
}

impl Mergeable {
    /// The segments of `merge` a log of the entries `first..next` may merge.
    pub fn of(merge: &IndexMerge, first: u64, next: u64) -> Mergeable {
        Mergeable {
            first: first / merge.segment_entries(),
            complete: next / merge.segment_entries(),
        }
    }
}

/// Moves up to `budget` numbered rows of `table` from their blocks to their segment's merged
/// bucket, from `mark` on; advances `mark`. How many moved.
pub fn merge_rows<V: IndexRow>(
    table: &mut Table<'_, (u64, u64), V>,
    mark: &mut MergeMark,
    blocks_per_segment: u64,
    span: Mergeable,
    budget: u64,
) -> Result<u64, StoreError> {
    let r = StoreError::redb;
    if mark.segment < span.first {
        // Retention removed everything before: nothing of those segments is left anywhere.
        *mark = MergeMark {
            segment: span.first,
            next: (0, 0),
        };
    }
    let mut moved = 0;
    let mut rows: Vec<(u64, u64, V::Owned)> = Vec::new();
    while moved < budget && mark.segment < span.complete {
        let segment = mark.segment;
        let blocks = segment * blocks_per_segment..(segment + 1) * blocks_per_segment;
        let (low0, index0) = mark.next;
        let from = |block: u64| (audit_key_block_start(block) | low0, index0);
        let to = |block: u64| (audit_key_block_start(block) | 0xFFFF_FFFF, u64::MAX);
        let want = usize::try_from(budget - moved).unwrap_or(usize::MAX);
        // The `want` smallest (low, index) across the segment's blocks: each block's rows
        // are in that order already, so a merge of their ranges reads only what moves.
        rows.clear();
        let mut taken = vec![None::<(u64, u64)>; blocks.clone().count()];
        {
            let mut ranges = Vec::with_capacity(taken.len());
            let mut heap = BinaryHeap::new();
            // Block `i`'s next row onto the heap, keyed (low 32 bits, index).
            let next = |ranges: &mut Vec<redb::Range<'_, (u64, u64), V>>,
                        i: usize,
                        heap: &mut BinaryHeap<_>|
             -> Result<(), StoreError> {
                if let Some(row) = ranges[i].next() {
                    let (k, v) = row.map_err(r)?;
                    let (bucket, index) = k.value();
                    heap.push(Reverse((
                        bucket & 0xFFFF_FFFF,
                        index,
                        i,
                        V::owned(v.value()),
                    )));
                }
                Ok(())
            };
            for (i, block) in blocks.clone().enumerate() {
                ranges.push(table.range(from(block)..=to(block)).map_err(r)?);
                next(&mut ranges, i, &mut heap)?;
            }
            while rows.len() < want {
                let Some(Reverse((low, index, i, v))) = heap.pop() else {
                    break;
                };
                rows.push((low, index, v));
                taken[i] = Some((low, index));
                next(&mut ranges, i, &mut heap)?;
            }
        }
        let Some(&(low, index, _)) = rows.last() else {
            // Nothing left in the segment's blocks: it is merged.
            *mark = MergeMark {
                segment: segment + 1,
                next: (0, 0),
            };
            continue;
        };
        for &(low, index, v) in &rows {
            // Lows come from 32-bit fields of the bucket.
            V::insert(table, (merged_bucket(segment, low as u32), index), v)?;
        }
        for (block, last) in blocks.zip(&taken) {
            if let Some((low, index)) = *last {
                let last = (audit_key_block_start(block) | low, index);
                table
                    .retain_in(from(block)..=last, |_, _| false)
                    .map_err(r)?;
            }
        }
        mark.next = (low, index.saturating_add(1));
        moved += rows.len() as u64;
    }
    Ok(moved)
}

/// Removes the merged rows of segments `segments` (retention: every entry of theirs is gone).
pub fn remove_segments<V: IndexRow>(
    table: &mut Table<'_, (u64, u64), V>,
    segments: std::ops::Range<u64>,
) -> Result<(), StoreError> {
    if segments.is_empty() {
        return Ok(());
    }
    let b = merged_range(&segments);
    table
        .retain_in((b.start, 0)..(b.end, 0), |_, _| false)
        .map_err(StoreError::redb)?;
    Ok(())
}
