//! Point lookups for `explain`: the audit entries of one key, a source's marks and whether a
//! position is still in the dedup window, read through a `Snapshot`.

use std::ops::ControlFlow;

use super::StoreError;
use super::index_merge::{self, IndexRow};
use super::read::{AuditEntry, Snapshot};
use super::tables::*;
use crate::decide::{Seen, SourceMarks};
use crate::model::{Digest, Position};

/// What the store knows now about one position of a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PositionState {
    /// The source's high-water mark and evicted floor.
    pub marks: SourceMarks,
    /// The window's entry for the position (digest and effect offset), if still in the window.
    pub seen: Option<Seen>,
}

fn pos((epoch, sequence): (u64, u64)) -> Position {
    Position { epoch, sequence }
}

impl Snapshot {
    /// Every audit entry with `key`, oldest first: one read of the key index (`AUDIT_KEYS`)
    /// per merged segment of the log and per block of its unmerged segments
    /// (`store::index_merge`; PostgreSQL from its schema version 5: one range of an index of
    /// the table by key prefix), then the candidates' entries. A store of schema version 1 (a
    /// file no writer of this version has opened yet) has no index: its log is scanned.
    pub fn audit_with_key(&self, key: &[u8; 32]) -> Result<Vec<AuditEntry>, StoreError> {
        let meta = self.meta()?;
        let mut found = Vec::new();
        if meta.schema_version < 2 {
            self.scan_audit::<StoreError>(0, |e| {
                if e.record.key.as_ref() == Some(key) {
                    found.push(e);
                }
                Ok(ControlFlow::Continue(()))
            })?;
            return Ok(found);
        }
        let first = meta.audit_anchor.map_or(0, |(i, _)| i + 1);
        if meta.next_audit <= first {
            return Ok(found);
        }
        let blocks = first / AUDIT_KEY_BLOCK..=(meta.next_audit - 1) / AUDIT_KEY_BLOCK;
        let bucket = |block: u64| audit_key_bucket(block * AUDIT_KEY_BLOCK, key);
        let wanted = |index: u64, record: &AuditRecord| {
            (first..meta.next_audit).contains(&index) && record.key.as_ref() == Some(key)
        };
        if let Some(pg) = self.pg() {
            let candidates = if pg.indexed_across_blocks()? {
                pg.audit_with_key_prefix(audit_key_prefix(key), first..meta.next_audit)?
            } else {
                let buckets: Vec<u64> = blocks.map(bucket).collect();
                pg.audit_in_buckets(&buckets)?
            };
            for (index, record) in candidates {
                if wanted(index, &record) {
                    found.push(AuditEntry { index, record });
                }
            }
            return Ok(found);
        }
        let prefix = audit_key_prefix(key);
        self.guard(|txn| {
            let merge = INDEX_MERGE.read(txn)?.unwrap_or_default();
            let keys = txn.open_table(AUDIT_KEYS)?;
            let packed = open_packed(txn, AUDIT_KEYS_PACKED)?;
            let audit = AUDIT.open(txn)?;
            let mut indices = Vec::new();
            let read = |b: u64, indices: &mut Vec<u64>| -> Result<(), StoreError> {
                for row in keys.range((b, 0)..=(b, u64::MAX))? {
                    indices.push(row?.0.value().1);
                }
                Ok(())
            };
            for segment in merge.segment_of(*blocks.start())..=merge.segment_of(*blocks.end()) {
                let (merged, unmerged) = merge.keys.reads(segment);
                if merged {
                    let rows =
                        index_merge::merged_rows_of(packed.as_ref(), &keys, segment, prefix)?;
                    indices.extend(rows.into_iter().map(|(index, ())| index));
                }
                if unmerged {
                    for block in merge.blocks_of(segment) {
                        if blocks.contains(&block) {
                            read(bucket(block), &mut indices)?;
                        }
                    }
                }
            }
            // A segment being merged has rows of one prefix in both places.
            indices.sort_unstable();
            for index in indices {
                if let Some(record) = audit.get(index)?
                    && wanted(index, &record)
                {
                    found.push(AuditEntry { index, record });
                }
            }
            Ok::<_, StoreError>(())
        })?;
        Ok(found)
    }

    /// The key index's rows (bucket, audit index) of blocks `blocks`, in order (a store of
    /// schema version 2 on: the caller checks).
    pub fn audit_key_rows(
        &self,
        blocks: std::ops::Range<u64>,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        let (lo, hi) = (
            audit_key_block_start(blocks.start),
            audit_key_block_start(blocks.end),
        );
        if let Some(pg) = self.pg() {
            return pg.audit_key_rows(lo, hi);
        }
        self.guard(|txn| {
            let keys = txn.open_table(AUDIT_KEYS)?;
            let mut rows = Vec::new();
            for row in keys.range((lo, 0)..(hi, 0))? {
                let k = row?.0.value();
                rows.push(k);
            }
            Ok(rows)
        })
    }

    /// The first row of the key index outside blocks `blocks` (whose entries no longer
    /// exist, or never did), if any.
    pub fn audit_key_row_outside(
        &self,
        blocks: std::ops::RangeInclusive<u64>,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        let (lo, hi) = (
            audit_key_block_start(*blocks.start()),
            audit_key_block_start(blocks.end() + 1),
        );
        if let Some(pg) = self.pg() {
            return pg.audit_key_row_outside(lo, hi);
        }
        self.guard(|txn| {
            let keys = txn.open_table(AUDIT_KEYS)?;
            if let Some(row) = keys.range(..(lo, 0))?.next() {
                return Ok(Some(row?.0.value()));
            }
            if let Some(row) = keys.range((hi, 0)..)?.next() {
                return Ok(Some(row?.0.value()));
            }
            Ok(None)
        })
    }

    /// Calls `f(epoch, sequence)` for every entry of the audit log that names source
    /// (`agency`, `source_id`) and a position, in no particular order: one read of the source
    /// index (`AUDIT_SOURCES`) per merged segment and per block of the unmerged ones
    /// (`store::index_merge`; PostgreSQL from its schema version 5: ranges of an
    /// index of the table by source number), and of the unnumbered buckets (whose entries are
    /// read to check their names); nothing is held but the rows of one read. `false`, having
    /// called nothing, for a store of schema version 1 or 2 (a file no writer of this version
    /// has opened yet), which has no source index: the caller scans the log.
    pub fn visit_positions_of(
        &self,
        agency: &str,
        source_id: &str,
        f: &mut dyn FnMut(u64, u64),
    ) -> Result<bool, StoreError> {
        let meta = self.meta()?;
        if meta.schema_version < 3 {
            return Ok(false);
        }
        let first = meta.audit_anchor.map_or(0, |(i, _)| i + 1);
        if meta.next_audit <= first {
            return Ok(true);
        }
        let blocks = first / AUDIT_KEY_BLOCK..(meta.next_audit - 1) / AUDIT_KEY_BLOCK + 1;
        let kept = first..meta.next_audit;
        let [_, unnumbered] = audit_source_ranges(&blocks);
        let named = |r: &AuditRecord| {
            r.agency.as_deref() == Some(agency) && r.source_id.as_deref() == Some(source_id)
        };
        if let Some(pg) = self.pg() {
            match pg.source_no(agency, source_id)? {
                Some(no) if pg.indexed_across_blocks()? => {
                    pg.visit_positions_of_source(no, kept.clone(), &mut |epoch, sequence| {
                        f(epoch, sequence)
                    })?;
                }
                Some(no) => {
                    let buckets: Vec<u64> = blocks
                        .clone()
                        .map(|b| audit_source_bucket(b * AUDIT_KEY_BLOCK, Some(no)))
                        .filter(|b| *b & UNNUMBERED == 0)
                        .collect();
                    pg.visit_source_positions(&buckets, &mut |index, epoch, sequence| {
                        if kept.contains(&index) {
                            f(epoch, sequence);
                        }
                    })?;
                }
                None => {}
            }
            for ((_, index), (epoch, sequence)) in pg.audit_source_rows(&[unnumbered])? {
                if kept.contains(&index)
                    && let Some(e) = self.audit_entry(index)?
                    && named(&e.record)
                {
                    f(epoch, sequence);
                }
            }
            return Ok(true);
        }
        self.guard(|txn| {
            let rows = txn.open_table(AUDIT_SOURCES)?;
            let no = txn.open_table(SOURCE_IDS)?.get((agency, source_id))?;
            // A number too large for a bucket: all its rows are unnumbered.
            let numbered = no.and_then(|n| u32::try_from(n.value()).ok());
            if let Some(no) = numbered {
                let merge = INDEX_MERGE.read(txn)?.unwrap_or_default();
                let packed = open_packed(txn, AUDIT_SOURCES_PACKED)?;
                let read = |b: u64, f: &mut dyn FnMut(u64, u64)| -> Result<(), StoreError> {
                    for row in rows.range((b, 0)..=(b, u64::MAX))? {
                        let (k, v) = row?;
                        if kept.contains(&k.value().1) {
                            let (epoch, sequence) = v.value();
                            f(epoch, sequence);
                        }
                    }
                    Ok(())
                };
                let last = blocks.end - 1;
                for segment in merge.segment_of(blocks.start)..=merge.segment_of(last) {
                    let (merged, unmerged) = merge.sources.reads(segment);
                    if merged {
                        let merged =
                            index_merge::merged_rows_of(packed.as_ref(), &rows, segment, no)?;
                        for (index, (epoch, sequence)) in merged {
                            if kept.contains(&index) {
                                f(epoch, sequence);
                            }
                        }
                    }
                    if unmerged {
                        for block in merge.blocks_of(segment) {
                            if blocks.contains(&block) {
                                read(
                                    audit_source_bucket(
                                        block * AUDIT_KEY_BLOCK,
                                        Some(u64::from(no)),
                                    ),
                                    &mut *f,
                                )?;
                            }
                        }
                    }
                }
            }
            let mut audit = None;
            for row in rows.range((unnumbered.start, 0)..(unnumbered.end, 0))? {
                let (k, v) = row?;
                let index = k.value().1;
                if !kept.contains(&index) {
                    continue;
                }
                let audit = match &mut audit {
                    Some(a) => a,
                    None => audit.insert(AUDIT.open(txn)?),
                };
                if audit.get(index)?.is_some_and(|r| named(&r)) {
                    let (epoch, sequence) = v.value();
                    f(epoch, sequence);
                }
            }
            Ok::<_, StoreError>(())
        })?;
        Ok(true)
    }

    /// The number of source (`agency`, `source_id`), if it has one.
    pub fn source_number(&self, agency: &str, source_id: &str) -> Result<Option<u64>, StoreError> {
        if let Some(pg) = self.pg() {
            return pg.source_no(agency, source_id);
        }
        self.guard(|txn| {
            let ids = txn.open_table(SOURCE_IDS)?;
            Ok(ids.get((agency, source_id))?.map(|n| n.value()))
        })
    }

    /// The source index's rows of blocks `blocks`, numbered buckets then unnumbered, each in
    /// order (a store of schema version 3 on: the caller checks).
    pub fn audit_source_rows(
        &self,
        blocks: std::ops::Range<u64>,
    ) -> Result<Vec<SourceRow>, StoreError> {
        let ranges = audit_source_ranges(&blocks);
        let mut out = Vec::new();
        if let Some(pg) = self.pg() {
            return pg.audit_source_rows(&ranges);
        }
        self.guard(|txn| {
            let rows = txn.open_table(AUDIT_SOURCES)?;
            for r in &ranges {
                for row in rows.range((r.start, 0)..(r.end, 0))? {
                    let (k, v) = row?;
                    out.push((k.value(), v.value()));
                }
            }
            Ok(out)
        })
    }

    /// The first row of the source index outside blocks `blocks`, if any.
    pub fn audit_source_row_outside(
        &self,
        blocks: std::ops::Range<u64>,
    ) -> Result<Option<SourceRow>, StoreError> {
        let ranges = audit_source_ranges(&blocks);
        if let Some(pg) = self.pg() {
            return pg.audit_source_row_outside(&ranges);
        }
        let [n, u] = ranges;
        self.guard(|txn| {
            let rows = txn.open_table(AUDIT_SOURCES)?;
            // Below, between and above the two ranges.
            let gaps = [(0, n.start), (n.end, u.start), (u.end, u64::MAX)];
            for (lo, hi) in gaps {
                if let Some(row) = rows.range((lo, 0)..(hi, 0))?.next() {
                    let (k, v) = row?;
                    return Ok(Some((k.value(), v.value())));
                }
            }
            // A bucket of u64::MAX itself (not a bucket this build writes).
            if let Some(row) = rows.range((u64::MAX, 0)..)?.next() {
                let (k, v) = row?;
                return Ok(Some((k.value(), v.value())));
            }
            Ok(None)
        })
    }

    /// The marks of source (`agency`, `source_id`) and the window entry of `position`; `None`
    /// if the source never had a message applied.
    pub fn position_state(
        &self,
        agency: &str,
        source_id: &str,
        position: Position,
    ) -> Result<Option<PositionState>, StoreError> {
        let key = |no| (no, position.epoch, position.sequence);
        let found = match self.pg() {
            Some(pg) => match pg.source_no(agency, source_id)? {
                Some(no) => Some((no, pg.get(SOURCES, no)?, pg.window(key(no))?)),
                None => None,
            },
            None => self.guard(|txn| {
                let ids = txn.open_table(SOURCE_IDS)?;
                let Some(no) = ids.get((agency, source_id))? else {
                    return Ok(None);
                };
                let no = no.value();
                // The newest entries are in `WINDOW_RECENT` (absent from an older file).
                let recent = match WINDOW_RECENT.open_if_present(txn)? {
                    Some(t) => t.get(key(no))?,
                    None => None,
                };
                let window = match recent {
                    Some(w) => Some(w),
                    None => match WINDOW.open(txn)?.get(key(no))? {
                        Some(w) if !window_gone(txn, key(no))? => Some(w),
                        _ => None,
                    },
                };
                // An entry of an evicted effect is no longer in the window (`Meta::window_purged`).
                let start = META.read(txn)?.map_or(0, |m| m.window_start);
                let window = window.filter(|w| w.effect_offset >= start);
                let (effects, audit) = (EFFECTS.open(txn)?, AUDIT.open(txn)?);
                let window = window
                    .map(|w| w.resolve(key(no), |offset| effects.digest_or_audited(&audit, offset)))
                    .transpose()?;
                Ok::<_, StoreError>(Some((no, SOURCES.open(txn)?.get(no)?, window)))
            })?,
        };
        let Some((no, record, window)) = found else {
            return Ok(None);
        };
        let record = record.ok_or_else(|| SOURCES.missing(&no, "missing (named in source_ids)"))?;
        Ok(Some(PositionState {
            marks: SourceMarks {
                high_water: pos(record.high_water),
                evicted_floor: record.evicted_floor.map(pos),
            },
            seen: window.map(|w| Seen {
                digest: Digest::from_bytes(w.digest),
                effect_offset: w.effect_offset,
            }),
        }))
    }
}

/// A packed index table open in a read transaction.
type PackedTable = redb::ReadOnlyTable<(u64, u64), &'static [u8]>;

/// A packed index table of a read transaction; `None` in a file no writer of schema version
/// 5 has opened.
fn open_packed(
    txn: &redb::ReadTransaction,
    def: redb::TableDefinition<'static, (u64, u64), &'static [u8]>,
) -> Result<Option<PackedTable>, StoreError> {
    match txn.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(StoreError::redb(e)),
    }
}

/// A row of a redb index: (bucket, audit index) and its value.
type OwnedRow<V> = ((u64, u64), <V as IndexRow>::Owned);

/// The first row of a redb index whose bucket lies in none of `legal` (sorted, disjoint).
fn first_outside<V: IndexRow>(
    table: &redb::ReadOnlyTable<(u64, u64), V>,
    legal: &[std::ops::Range<u64>],
) -> Result<Option<OwnedRow<V>>, StoreError> {
    let mut lo = 0;
    let first = |range: redb::Range<'_, (u64, u64), V>| -> Result<_, StoreError> {
        match range.into_iter().next() {
            Some(row) => {
                let (k, v) = row?;
                Ok(Some((k.value(), V::owned(v.value()))))
            }
            None => Ok(None),
        }
    };
    for r in legal.iter().filter(|r| !r.is_empty()) {
        if lo < r.start
            && let Some(row) = first(table.range((lo, 0)..(r.start, 0))?)?
        {
            return Ok(Some(row));
        }
        lo = lo.max(r.end);
    }
    first(table.range((lo, 0)..)?)
}

impl Snapshot {
    /// How far the audit indexes are merged (`store::index_merge`); `None` on PostgreSQL,
    /// which never merges them.
    pub fn index_merge(&self) -> Result<Option<IndexMerge>, StoreError> {
        if self.pg().is_some() {
            return Ok(None);
        }
        self.guard(|txn| Ok(Some(INDEX_MERGE.read(txn)?.unwrap_or_default())))
    }

    /// The key index's merged rows of segment `segment` (redb), packed or not, in order.
    pub fn audit_key_rows_merged(&self, segment: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        self.guard(|txn| {
            let keys = txn.open_table(AUDIT_KEYS)?;
            let packed = open_packed(txn, AUDIT_KEYS_PACKED)?;
            let rows = index_merge::merged_rows_in(packed.as_ref(), &keys, segment..segment + 1)?;
            Ok(rows.into_iter().map(|(k, ())| k).collect())
        })
    }

    /// The source index's merged rows of segment `segment` (redb), packed or not, in order.
    pub fn audit_source_rows_merged(&self, segment: u64) -> Result<Vec<SourceRow>, StoreError> {
        self.guard(|txn| {
            let sources = txn.open_table(AUDIT_SOURCES)?;
            let packed = open_packed(txn, AUDIT_SOURCES_PACKED)?;
            index_merge::merged_rows_in(packed.as_ref(), &sources, segment..segment + 1)
        })
    }

    /// The first row of a packed run of the key index outside the merged buckets `legal`
    /// (redb): a run no lookup reads.
    pub fn packed_key_row_outside(
        &self,
        legal: std::ops::Range<u64>,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        self.guard(|txn| match open_packed(txn, AUDIT_KEYS_PACKED)? {
            Some(t) => Ok(index_merge::packed_outside::<()>(&t, legal)?.map(|(k, ())| k)),
            None => Ok(None),
        })
    }

    /// The same for the source index.
    pub fn packed_source_row_outside(
        &self,
        legal: std::ops::Range<u64>,
    ) -> Result<Option<SourceRow>, StoreError> {
        self.guard(|txn| match open_packed(txn, AUDIT_SOURCES_PACKED)? {
            Some(t) => index_merge::packed_outside::<(u64, u64)>(&t, legal),
            None => Ok(None),
        })
    }

    /// The first row of the key index (redb) whose bucket is in none of `legal`.
    pub fn audit_key_row_outside_ranges(
        &self,
        legal: &[std::ops::Range<u64>],
    ) -> Result<Option<(u64, u64)>, StoreError> {
        self.guard(|txn| {
            let keys = txn.open_table(AUDIT_KEYS)?;
            Ok(first_outside(&keys, legal)?.map(|(k, ())| k))
        })
    }

    /// The first row of the source index (redb) whose bucket is in none of `legal`.
    pub fn audit_source_row_outside_ranges(
        &self,
        legal: &[std::ops::Range<u64>],
    ) -> Result<Option<SourceRow>, StoreError> {
        self.guard(|txn| {
            let sources = txn.open_table(AUDIT_SOURCES)?;
            first_outside(&sources, legal)
        })
    }
}
