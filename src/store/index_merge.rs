//! The writer's merge of the audit indexes' old blocks into segments (redb only): the rows of
//! a complete segment of `IndexMerge::blocks` blocks move from their blocks' buckets to one
//! merged bucket per key prefix or source number (`tables::MERGED`), a bounded number per
//! write transaction, in (low 32 bits, audit index) order, so that the merged buckets grow at
//! their tail like the blocks do and a lookup of an old entry reads one bucket per segment.
//!
//! Merged rows are stored packed (schema version 5 on): a run of up to `PACK_ROWS` rows of
//! one group (a source number; the top 12 bits of a key prefix, `KEY_GROUP_SHIFT`) is one
//! value of `AUDIT_KEYS_PACKED` / `AUDIT_SOURCES_PACKED` under (the group's merged bucket, the
//! audit index of its first row), its rows delta-encoded (`pack`): a few bytes a row instead
//! of a B-tree row of 16 or 32 bytes, and one insert per run instead of one per row. A row
//! reads back as the merged row it stands for, (`merged_bucket(segment, low)`, index), so
//! lookups and `verify` see the same rows as before; they also read merged rows stored one
//! by one in the row tables (a file of schema version 4 that no writer has upgraded yet).
//!
//! Invariant: a row is in exactly one place: its block's bucket, or its segment's merged
//! form (one packed run) once `IndexMerge`'s mark for the index says it is merged; the move
//! and the mark are written in one transaction.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use redb::{ReadableTable, Table, WriteTransaction};
use serde::{Serialize, de::DeserializeOwned};

use super::StoreError;
use super::tables::{
    AUDIT_KEYS, AUDIT_KEYS_PACKED, AUDIT_SOURCES, AUDIT_SOURCES_PACKED, IndexMerge, MERGED,
    MergeMark, RecordError, UNNUMBERED, audit_key_block_start, merged_bucket, merged_range,
};

/// The low 32 bits of a key prefix above this many bits name its packed group: 4,096 groups
/// a segment, about 64 rows each in a segment of 262,144 entries.
pub const KEY_GROUP_SHIFT: u32 = 20;
/// Rows per packed run at most (a source's rows of a segment may be all of it).
pub const PACK_ROWS: usize = 1024;
/// First byte of a packed run.
const PACK_V1: u8 = 1;

/// A merged row: (low 32 bits of its bucket, audit index, value).
pub type Merged<O> = (u32, u64, O);
/// A row as stored in an index table: ((bucket, audit index), value).
pub type Row<O> = ((u64, u64), O);

/// The value of an index row (`()` for `AUDIT_KEYS`, the position for `AUDIT_SOURCES`),
/// owned so a row can be held while the table is written.
pub trait IndexRow: redb::Value + Sized + 'static {
    type Owned: Copy + Ord + std::fmt::Debug;
    /// A value as packed after the one before it (`pack`).
    type Delta: Serialize + DeserializeOwned;
    /// The packed table of the index, and its name.
    const PACKED: redb::TableDefinition<'static, (u64, u64), &'static [u8]>;
    const PACKED_NAME: &'static str;
    /// What a packed run starts from.
    const ZERO: Self::Owned;
    /// The packed group of a row with these low 32 bits.
    fn group(low: u32) -> u32;
    fn delta(v: Self::Owned, prev: Self::Owned) -> Self::Delta;
    fn undelta(d: Self::Delta, prev: Self::Owned) -> Self::Owned;
    fn owned(v: Self::SelfType<'_>) -> Self::Owned;
    fn insert(
        t: &mut Table<'_, (u64, u64), Self>,
        key: (u64, u64),
        v: Self::Owned,
    ) -> Result<(), StoreError>;
}

impl IndexRow for () {
    type Owned = ();
    type Delta = ();
    const PACKED: redb::TableDefinition<'static, (u64, u64), &'static [u8]> = AUDIT_KEYS_PACKED;
    const PACKED_NAME: &'static str = "audit_keys_packed";
    const ZERO: () = ();
    fn group(low: u32) -> u32 {
        low >> KEY_GROUP_SHIFT
    }
    fn delta(_: (), _: ()) {}
    fn undelta(_: (), _: ()) {}
    fn owned(_: ()) {}
    fn insert(t: &mut Table<'_, (u64, u64), ()>, key: (u64, u64), _: ()) -> Result<(), StoreError> {
        t.insert(key, ()).map_err(StoreError::redb)?;
        Ok(())
    }
}

impl IndexRow for (u64, u64) {
    type Owned = (u64, u64);
    /// Epoch and sequence, each as the wrapping difference from the row before.
    type Delta = (i64, i64);
    const PACKED: redb::TableDefinition<'static, (u64, u64), &'static [u8]> = AUDIT_SOURCES_PACKED;
    const PACKED_NAME: &'static str = "audit_sources_packed";
    const ZERO: (u64, u64) = (0, 0);
    fn group(low: u32) -> u32 {
        low
    }
    fn delta(v: (u64, u64), prev: (u64, u64)) -> (i64, i64) {
        (
            v.0.wrapping_sub(prev.0) as i64,
            v.1.wrapping_sub(prev.1) as i64,
        )
    }
    fn undelta(d: (i64, i64), prev: (u64, u64)) -> (u64, u64) {
        (
            prev.0.wrapping_add(d.0 as u64),
            prev.1.wrapping_add(d.1 as u64),
        )
    }
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
    packed: &mut Table<'_, (u64, u64), &'static [u8]>,
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
    let mut rows: Vec<Merged<V::Owned>> = Vec::new();
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
                // Lows come from 32-bit fields of the bucket.
                rows.push((low as u32, index, v));
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
        put_packed::<V>(packed, segment, &rows)?;
        for (block, last) in blocks.zip(&taken) {
            if let Some((low, index)) = *last {
                let last = (audit_key_block_start(block) | low, index);
                table
                    .retain_in(from(block)..=last, |_, _| false)
                    .map_err(r)?;
            }
        }
        mark.next = (u64::from(low), index.saturating_add(1));
        moved += rows.len() as u64;
    }
    Ok(moved)
}

/// Removes the merged rows of segments `segments` (retention: every entry of theirs is gone),
/// packed and one by one.
pub fn remove_segments<V: IndexRow>(
    table: &mut Table<'_, (u64, u64), V>,
    packed: &mut Table<'_, (u64, u64), &'static [u8]>,
    segments: std::ops::Range<u64>,
) -> Result<(), StoreError> {
    if segments.is_empty() {
        return Ok(());
    }
    let b = merged_range(&segments);
    table
        .retain_in((b.start, 0)..(b.end, 0), |_, _| false)
        .map_err(StoreError::redb)?;
    packed
        .retain_in((b.start, 0)..(b.end, 0), |_, _| false)
        .map_err(StoreError::redb)?;
    Ok(())
}

/// Inserts `rows` (of segment `segment`, in (low, index) order) as packed runs: one per group,
/// of at most `PACK_ROWS` rows.
fn put_packed<V: IndexRow>(
    packed: &mut Table<'_, (u64, u64), &'static [u8]>,
    segment: u64,
    rows: &[Merged<V::Owned>],
) -> Result<(), StoreError> {
    let mut buf = Vec::new();
    let mut rest = rows;
    while let Some(&(low, first, _)) = rest.first() {
        let group = V::group(low);
        let n = rest
            .iter()
            .take(PACK_ROWS)
            .take_while(|r| V::group(r.0) == group)
            .count();
        pack::<V>(&rest[..n], &mut buf);
        packed
            .insert((merged_bucket(segment, group), first), buf.as_slice())
            .map_err(StoreError::redb)?;
        rest = &rest[n..];
    }
    Ok(())
}

/// Encodes `rows` (of one group, in (low, index) order) as a packed run into `out`: the
/// version byte, then each row as its difference from the one before (postcard varints).
pub fn pack<V: IndexRow>(rows: &[Merged<V::Owned>], out: &mut Vec<u8>) {
    let mut deltas = Vec::with_capacity(rows.len());
    let (mut low, mut index, mut value) = (0u32, 0u64, V::ZERO);
    for &(l, i, v) in rows {
        deltas.push((
            l.wrapping_sub(low),
            i.wrapping_sub(index) as i64,
            V::delta(v, value),
        ));
        (low, index, value) = (l, i, v);
    }
    out.clear();
    out.push(PACK_V1);
    // postcard only fails on unsupported serde features (none used).
    *out = match postcard::to_extend(&deltas, std::mem::take(out)) {
        Ok(v) => v,
        Err(e) => unreachable!("postcard cannot encode a packed run: {e}"),
    };
}

/// The rows of the packed run stored under `key` in `table`: checked to be non-empty, of the
/// key's group, in (low, index) order, the first at the key's index.
pub fn unpack<V: IndexRow>(
    table: &'static str,
    key: (u64, u64),
    bytes: &[u8],
) -> Result<Vec<Merged<V::Owned>>, RecordError> {
    let err = |why: &str| RecordError {
        table,
        key: format!("({:#x}, {})", key.0, key.1),
        why: why.to_string(),
    };
    let body = match bytes.split_first() {
        Some((&PACK_V1, body)) => body,
        Some((v, _)) => return Err(err(&format!("unknown packed run version {v}"))),
        None => return Err(err("empty")),
    };
    let (deltas, rest): (Vec<(u32, i64, V::Delta)>, _) =
        postcard::take_from_bytes(body).map_err(|e| err(&e.to_string()))?;
    if !rest.is_empty() {
        return Err(err("bytes after its last row"));
    }
    let mut rows = Vec::with_capacity(deltas.len());
    let (mut low, mut index, mut value) = (0u32, 0u64, V::ZERO);
    for (dl, di, dv) in deltas {
        low = low
            .checked_add(dl)
            .ok_or_else(|| err("rows out of order"))?;
        index = index.wrapping_add(di as u64);
        value = V::undelta(dv, value);
        rows.push((low, index, value));
    }
    let group = key.0 as u32;
    if key.0 & (MERGED | UNNUMBERED) != MERGED {
        return Err(err("not under a merged bucket"));
    }
    if rows.first().map(|r| r.1) != Some(key.1) {
        return Err(err("its first row is not the audit index its key names"));
    }
    if rows.iter().any(|r| V::group(r.0) != group) {
        return Err(err("a row of another group than its key's"));
    }
    if rows
        .windows(2)
        .any(|w| (w[0].0, w[0].1) >= (w[1].0, w[1].1))
    {
        return Err(err("rows out of order"));
    }
    Ok(rows)
}

/// The segment of a merged bucket.
pub fn segment_of_bucket(bucket: u64) -> u64 {
    (bucket & !MERGED) >> 32
}

/// The merged rows with low 32 bits `low` of segment `segment`, (audit index, value) in index
/// order: from the packed runs of its group in `packed` (absent: a file no writer of schema 5
/// has opened) and from the row table `rows` (a file of schema 4 not yet upgraded).
pub fn merged_rows_of<V: IndexRow>(
    packed: Option<&impl ReadableTable<(u64, u64), &'static [u8]>>,
    rows: &impl ReadableTable<(u64, u64), V>,
    segment: u64,
    low: u32,
) -> Result<Vec<(u64, V::Owned)>, StoreError> {
    let bucket = merged_bucket(segment, low);
    let mut out = Vec::new();
    for row in rows.range((bucket, 0)..=(bucket, u64::MAX))? {
        let (k, v) = row?;
        out.push((k.value().1, V::owned(v.value())));
    }
    if let Some(packed) = packed {
        let group = merged_bucket(segment, V::group(low));
        for run in packed.range((group, 0)..=(group, u64::MAX))? {
            let (k, v) = run?;
            let rows = unpack::<V>(V::PACKED_NAME, k.value(), v.value())?;
            out.extend(
                rows.into_iter()
                    .filter(|r| r.0 == low)
                    .map(|(_, index, v)| (index, v)),
            );
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// Every merged row of segments `segments` as the row it stands for, ((merged bucket, audit
/// index), value), in that order: packed (`packed` absent: none) and one by one.
pub fn merged_rows_in<V: IndexRow>(
    packed: Option<&impl ReadableTable<(u64, u64), &'static [u8]>>,
    rows: &impl ReadableTable<(u64, u64), V>,
    segments: std::ops::Range<u64>,
) -> Result<Vec<Row<V::Owned>>, StoreError> {
    let b = merged_range(&segments);
    let mut out = Vec::new();
    for row in rows.range((b.start, 0)..(b.end, 0))? {
        let (k, v) = row?;
        out.push((k.value(), V::owned(v.value())));
    }
    if let Some(packed) = packed {
        for_each_packed::<V>(packed, segments, &mut |k, v| {
            out.push((k, v));
            Ok(())
        })?;
    }
    out.sort_unstable();
    Ok(out)
}

/// Calls `f` with every packed row of segments `segments`, as the merged row it stands for,
/// one run after the other.
pub fn for_each_packed<V: IndexRow>(
    packed: &impl ReadableTable<(u64, u64), &'static [u8]>,
    segments: std::ops::Range<u64>,
    f: &mut dyn FnMut((u64, u64), V::Owned) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let b = merged_range(&segments);
    for run in packed.range((b.start, 0)..(b.end, 0))? {
        let (k, v) = run?;
        let segment = segment_of_bucket(k.value().0);
        for (low, index, v) in unpack::<V>(V::PACKED_NAME, k.value(), v.value())? {
            f((merged_bucket(segment, low), index), v)?;
        }
    }
    Ok(())
}

/// The first row (as the merged row it stands for) of the first packed run of `packed`
/// outside the merged buckets `legal`: a run no lookup reads.
pub fn packed_outside<V: IndexRow>(
    packed: &impl ReadableTable<(u64, u64), &'static [u8]>,
    legal: std::ops::Range<u64>,
) -> Result<Option<Row<V::Owned>>, StoreError> {
    let mut before = packed.range(..(legal.start, 0))?;
    let mut after = packed.range((legal.end.max(legal.start), 0)..)?;
    let Some(run) = before.next().or_else(|| after.next()) else {
        return Ok(None);
    };
    let (k, v) = run?;
    let segment = segment_of_bucket(k.value().0);
    let rows = unpack::<V>(V::PACKED_NAME, k.value(), v.value())?;
    Ok(rows
        .first()
        .map(|&(low, index, v)| ((merged_bucket(segment, low), index), v)))
}

/// Moves the merged rows stored one by one in `V`'s row table `rows` (schema version 4) into
/// packed runs; how many moved. In the writer's transaction, before any `RedbTx` opens.
pub fn repack<V: IndexRow>(
    txn: &WriteTransaction,
    rows: redb::TableDefinition<'static, (u64, u64), V>,
) -> Result<u64, StoreError> {
    let mut table = txn.open_table(rows)?;
    let mut packed = txn.open_table(V::PACKED)?;
    let mut moved = 0;
    loop {
        // A chunk of one segment's rows, in (low, index) order.
        let mut chunk: Vec<Merged<V::Owned>> = Vec::new();
        let mut segment = None;
        let mut last = None;
        for row in table.range((MERGED, 0)..(UNNUMBERED, 0))? {
            let (k, v) = row?;
            let (bucket, index) = k.value();
            let s = segment_of_bucket(bucket);
            if *segment.get_or_insert(s) != s || chunk.len() >= 65_536 {
                break;
            }
            chunk.push((bucket as u32, index, V::owned(v.value())));
            last = Some((bucket, index));
        }
        let (Some(segment), Some(last)) = (segment, last) else {
            return Ok(moved);
        };
        put_packed::<V>(&mut packed, segment, &chunk)?;
        table
            .retain_in((MERGED, 0)..=last, |_, _| false)
            .map_err(StoreError::redb)?;
        moved += chunk.len() as u64;
    }
}

/// Both indexes' merged rows into packed runs (`repack`); how many moved.
pub fn repack_both(txn: &WriteTransaction) -> Result<u64, StoreError> {
    Ok(repack(txn, AUDIT_KEYS)? + repack(txn, AUDIT_SOURCES)?)
}

/// The reverse of `repack`: every packed run back into merged rows one by one, as schema
/// version 4 stored them (for the tests of the upgrade and of `verify`).
pub fn unpack_all<V: IndexRow>(
    txn: &WriteTransaction,
    rows: redb::TableDefinition<'static, (u64, u64), V>,
) -> Result<u64, StoreError> {
    let mut table = txn.open_table(rows)?;
    let mut packed = txn.open_table(V::PACKED)?;
    let mut all = Vec::new();
    for run in packed.iter()? {
        let (k, v) = run?;
        let segment = segment_of_bucket(k.value().0);
        for (low, index, v) in unpack::<V>(V::PACKED_NAME, k.value(), v.value())? {
            all.push(((merged_bucket(segment, low), index), v));
        }
    }
    packed.retain(|_, _| false).map_err(StoreError::redb)?;
    for &(k, v) in &all {
        V::insert(&mut table, k, v)?;
    }
    Ok(all.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tables::ALL_SEGMENTS;

    #[test]
    fn a_packed_run_reads_back_row_for_row_and_damage_is_named() {
        let rows: Vec<Merged<(u64, u64)>> = vec![
            (7, 4_096, (1, 10)),
            (7, 5_000, (1, 11)),
            (7, 5_001, (2, 1)),
            (7, 9_000, (1, u64::MAX)),
        ];
        let mut buf = Vec::new();
        pack::<(u64, u64)>(&rows, &mut buf);
        let key = (merged_bucket(1, 7), 4_096);
        assert!(buf.len() < 4 * 8, "{} bytes for four rows", buf.len());
        assert_eq!(
            unpack::<(u64, u64)>("t", key, &buf).unwrap(),
            rows,
            "every field as written, including a position going back (a new epoch)"
        );
        // Keys: rows of one group, in (low, index) order, indices in any order.
        let keys: Vec<Merged<()>> = vec![
            (0x0010_0001, 9, ()),
            (0x0010_0001, 12, ()),
            (0x001F_FFFF, 3, ()),
        ];
        pack::<()>(&keys, &mut buf);
        let kkey = (merged_bucket(0, 1), 9);
        assert_eq!(unpack::<()>("t", kkey, &buf).unwrap(), keys);
        // Under another group's bucket, another first index, a block's bucket, cut short,
        // another version: each refused, naming the run.
        for (key, bytes, why) in [
            ((merged_bucket(0, 2), 9), buf.clone(), "another group"),
            ((merged_bucket(0, 1), 10), buf.clone(), "first row"),
            ((1 << 32 | 1, 9), buf.clone(), "merged bucket"),
            (kkey, buf[..buf.len() - 1].to_vec(), "end of buffer"),
            (kkey, [&[9u8][..], &buf[1..]].concat(), "version 9"),
        ] {
            let e = unpack::<()>("audit_keys_packed", key, &bytes).unwrap_err();
            assert!(
                e.to_string().contains("audit_keys_packed") && e.to_string().contains(why),
                "{e}"
            );
        }
    }

    #[test]
    fn merged_rows_are_packed_one_run_per_group_of_at_most_pack_rows() {
        let db = redb::Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut packed = txn.open_table(AUDIT_SOURCES_PACKED).unwrap();
            let mut rows: Vec<Merged<(u64, u64)>> = (0..PACK_ROWS as u64 + 5)
                .map(|i| (3, 100 + i, (1, i)))
                .collect();
            rows.push((4, 50, (1, 1)));
            put_packed::<(u64, u64)>(&mut packed, 2, &rows).unwrap();
            let keys: Vec<(u64, u64)> = packed
                .iter()
                .unwrap()
                .map(|r| r.unwrap().0.value())
                .collect();
            assert_eq!(
                keys,
                [
                    (merged_bucket(2, 3), 100),
                    (merged_bucket(2, 3), 100 + PACK_ROWS as u64),
                    (merged_bucket(2, 4), 50)
                ]
            );
            let rows_table = txn.open_table(AUDIT_SOURCES).unwrap();
            let of3 = merged_rows_of(Some(&packed), &rows_table, 2, 3).unwrap();
            assert_eq!(of3.len(), PACK_ROWS + 5);
            assert_eq!(
                of3[PACK_ROWS + 4],
                (100 + PACK_ROWS as u64 + 4, (1, PACK_ROWS as u64 + 4))
            );
            assert!(
                merged_rows_of(Some(&packed), &rows_table, 1, 3)
                    .unwrap()
                    .is_empty()
            );
            let all = merged_rows_in(Some(&packed), &rows_table, ALL_SEGMENTS).unwrap();
            assert_eq!(all.len(), PACK_ROWS + 6);
            assert_eq!(all[0], ((merged_bucket(2, 3), 100), (1, 0)));
        }
        txn.commit().unwrap();
    }
}
