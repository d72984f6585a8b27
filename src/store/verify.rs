//! `verify`: recompute the audit hash chain from its anchor and check the record's invariants,
//! streaming through the logs (point lookups for cross-references); re-decode every stored
//! payload and compare it with what its audit entry recorded.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::ControlFlow;

use super::engine::{fingerprint_decided, fingerprint_malformed};
use super::tables::{
    AUDIT_KEY_BLOCK, AuditRecord, IndexMerge, MERGED, MergeMark, SourceRow, Stream, UNNUMBERED,
    audit_key_block_start, audit_key_bucket, audit_source_bucket, audit_source_ranges,
    block_bucket, merged_range,
};
use super::{Snapshot, StoreError};
use crate::key::sha256;
use crate::model::{Outcome, hex};
use crate::wire::{self, DecodeError, FeedContract};

/// What `verify` checked, or the first violation it found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub audit_entries: u64,
    pub effects: u64,
    /// Quarantine records checked (all still kept).
    pub quarantined: u64,
    pub counts: crate::model::OutcomeCounts,
    /// Where the retained record starts: the first audit index checked, the first effect
    /// offset and quarantine id still kept (earlier ones were removed by retention).
    pub audit_from: u64,
    pub effects_from: u64,
    pub quarantine_from: u64,
    /// Each relay sink: what its ledger accounts for below its cursor, and its parked events
    /// checked against their effects.
    pub sinks: Vec<SinkReport>,
    /// Audit entries found under their key in the key index (`AUDIT_KEYS`); `None` for a
    /// store of schema version 1, which has none yet.
    pub key_index: Option<u64>,
    /// Audit entries found under their source and position in the source index
    /// (`AUDIT_SOURCES`); `None` for a store of schema version 1 or 2, which has none yet.
    pub source_index: Option<u64>,
    /// The first broken entry, in words; `None` when everything holds.
    pub violation: Option<String>,
}

/// What `verify` proved of one relay sink.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SinkReport {
    pub name: String,
    /// The log it delivers (its cursor counts positions of that log).
    pub stream: super::tables::Stream,
    /// Its cursor: every offset below it is accounted for by `accounting`.
    pub next: u64,
    pub accounting: super::ledger::Accounting,
    /// Parked events whose stored copy matches the event rebuilt from their effect.
    pub parked_checked: u64,
    /// Parked events whose effect retention removed before this version kept them: their
    /// copy cannot be checked (and `relay retry` does not send it).
    pub parked_unprovable: u64,
}

/// What the audit scan carries from entry to entry.
struct Scan {
    marks: super::tables::RetentionMarks,
    audit_from: u64,
    /// (the key's first eight bytes, audit index) per applied entry, to prove no key is
    /// applied twice (`first_key_applied_twice`): 16 bytes per entry, where a set of the
    /// whole keys took ~80 (1.6 GB of RSS at 20M entries).
    applied_keys: Vec<(u64, u64)>,
    /// Quarantine ids whose record is gone, with the first entry that named them: each must
    /// be released or discarded by a later entry.
    unresolved: BTreeMap<u64, u64>,
}

/// One of the audit log's indexes as `verify` checks it, unit by unit (a block, or a merged
/// segment: `Unit`) as the scan reaches each: the unit's rows must be exactly the rows its
/// entries need, one per entry (ignoring rows of entries retention removed from the first
/// unit), and no row may lie where a lookup would not read it.
trait BlockIndex {
    /// A stored row.
    type Row: Copy + Ord;
    /// What an entry's row must hold, beside the entry's index.
    type Want;
    /// What entry `index` needs of the index, if anything.
    fn want(
        &mut self,
        snap: &Snapshot,
        index: u64,
        record: &AuditRecord,
    ) -> Result<Option<Self::Want>, StoreError>;
    /// How far this index is merged (redb).
    fn mark(merge: &IndexMerge) -> MergeMark;
    /// The rows of `unit`, merged ones under their block's bucket (`tables::block_bucket`),
    /// and the first row on the wrong side of the mark of the segment being merged, as stored.
    fn rows(snap: &Snapshot, unit: &Unit) -> Result<UnitRows<Self::Row>, StoreError>;
    /// A row outside blocks `blocks`, if any (PostgreSQL: the index is never merged).
    fn outside(
        snap: &Snapshot,
        blocks: std::ops::Range<u64>,
    ) -> Result<Option<Self::Row>, StoreError>;
    /// A row of a redb index where a lookup would not read it: outside the log's blocks
    /// and segments, in a block of a merged segment, or merged beyond its mark.
    fn outside_merged(
        snap: &Snapshot,
        blocks: std::ops::Range<u64>,
        merge: &IndexMerge,
    ) -> Result<Option<Self::Row>, StoreError>;
    /// The audit index a row names.
    fn index_of(row: &Self::Row) -> u64;
    fn fits(want: &Self::Want, row: &Self::Row) -> bool;
    /// The violations, in words.
    fn missing(index: u64) -> String;
    fn extra(row: Self::Row) -> String;
}

/// A unit's rows as a check compares them, and the first one stored on the wrong side of
/// its segment's merge mark (as stored).
type UnitRows<R> = (Vec<R>, Option<R>);

/// What `verify` reads of an index at once: one block, or the blocks of a segment a lookup
/// reads merged (and, for the segment being merged, also block by block).
#[derive(Debug, Clone)]
struct Unit {
    blocks: std::ops::Range<u64>,
    /// The merged segment whose bucket rows are read.
    merged: Option<u64>,
    /// Whether the blocks' numbered rows are read too.
    in_blocks: bool,
    /// Of the segment being merged, where its merged rows end: (low 32 bits, index).
    next: Option<(u64, u64)>,
}

impl Unit {
    /// Whether a numbered row (`bucket`, `index`) is where the mark says: merged rows below
    /// `next`, rows in blocks from it.
    fn placed(&self, bucket: u64, index: u64) -> bool {
        match self.next {
            Some(next) => ((bucket & 0xFFFF_FFFF, index) < next) == (bucket & MERGED != 0),
            None => true,
        }
    }

    /// The unit block `block` lies in, for index `I` merged as far as `merge` says.
    fn of<I: BlockIndex>(merge: Option<&IndexMerge>, block: u64) -> Unit {
        let plain = Unit {
            blocks: block..block + 1,
            merged: None,
            in_blocks: true,
            next: None,
        };
        let Some(m) = merge else {
            return plain;
        };
        let segment = m.segment_of(block);
        let mark = I::mark(m);
        match mark.reads(segment) {
            (true, in_blocks) => Unit {
                blocks: m.blocks_of(segment),
                merged: Some(segment),
                in_blocks,
                next: in_blocks.then_some(mark.next),
            },
            (false, _) => plain,
        }
    }
}

/// The bucket ranges a lookup of a redb index reads for the log's blocks `blocks`: the blocks
/// of segments not wholly merged, and the merged buckets of those merged at all.
fn legal_ranges(
    blocks: &std::ops::Range<u64>,
    merge: &IndexMerge,
    mark: MergeMark,
) -> [std::ops::Range<u64>; 2] {
    let (first, last) = (blocks.start, blocks.end - 1);
    let in_blocks = first.max(mark.segment.saturating_mul(merge.blocks))..last + 1;
    let merged = merge.segment_of(first)..merge.segment_of(last).min(mark.segment) + 1;
    [
        audit_key_block_start(in_blocks.start)
            ..audit_key_block_start(in_blocks.end.max(in_blocks.start)),
        merged_range(&(merged.start..merged.end.max(merged.start))),
    ]
}

/// The key index (`AUDIT_KEYS`): a row (bucket, index) for each entry with a key.
struct KeyIndex;

impl BlockIndex for KeyIndex {
    type Row = (u64, u64);
    /// The bucket.
    type Want = u64;
    fn want(
        &mut self,
        _: &Snapshot,
        index: u64,
        r: &AuditRecord,
    ) -> Result<Option<u64>, StoreError> {
        Ok(r.key.as_ref().map(|key| audit_key_bucket(index, key)))
    }
    fn mark(merge: &IndexMerge) -> MergeMark {
        merge.keys
    }
    fn rows(snap: &Snapshot, unit: &Unit) -> Result<UnitRows<(u64, u64)>, StoreError> {
        let mut stored = match unit.merged {
            Some(segment) => snap.audit_key_rows_merged(segment)?,
            None => Vec::new(),
        };
        if unit.in_blocks {
            stored.extend(snap.audit_key_rows(unit.blocks.clone())?);
        }
        let misplaced = stored.iter().copied().find(|&(b, i)| !unit.placed(b, i));
        let rows = stored
            .into_iter()
            .map(|(bucket, index)| (block_bucket(bucket, index), index))
            .collect();
        Ok((rows, misplaced))
    }
    fn outside(
        snap: &Snapshot,
        blocks: std::ops::Range<u64>,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        snap.audit_key_row_outside(blocks.start..=blocks.end - 1)
    }
    fn outside_merged(
        snap: &Snapshot,
        blocks: std::ops::Range<u64>,
        merge: &IndexMerge,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        let legal = legal_ranges(&blocks, merge, merge.keys);
        match snap.audit_key_row_outside_ranges(&legal)? {
            Some(row) => Ok(Some(row)),
            None => snap.packed_key_row_outside(legal[1].clone()),
        }
    }
    fn index_of(row: &(u64, u64)) -> u64 {
        row.1
    }
    fn fits(bucket: &u64, row: &(u64, u64)) -> bool {
        row.0 == *bucket
    }
    fn missing(index: u64) -> String {
        format!("audit entry {index}: missing from the key index (explain would not find it)")
    }
    fn extra((bucket, index): (u64, u64)) -> String {
        format!(
            "the key index has a row for audit entry {index} under bucket {bucket:#x}, which is \
             not that entry's (the entry is missing, or its key gives another bucket)"
        )
    }
}

/// The source index (`AUDIT_SOURCES`): a row for each entry with a source and a position,
/// under the block's bucket of that source's number or the block's unnumbered bucket (a
/// lookup reads both), holding the entry's position.
#[derive(Default)]
struct SourceIndex {
    /// Source numbers by name, as read.
    numbers: std::collections::HashMap<(String, String), Option<u64>>,
}

impl BlockIndex for SourceIndex {
    type Row = SourceRow;
    /// The buckets its row may have, and its position.
    type Want = ([u64; 2], (u64, u64));
    fn want(
        &mut self,
        snap: &Snapshot,
        index: u64,
        r: &AuditRecord,
    ) -> Result<Option<Self::Want>, StoreError> {
        let (Some(agency), Some(source_id), Some(epoch), Some(sequence)) =
            (&r.agency, &r.source_id, r.epoch, r.sequence)
        else {
            return Ok(None);
        };
        let name = (agency.clone(), source_id.clone());
        let no = match self.numbers.get(&name) {
            Some(no) => *no,
            None => {
                let no = snap.source_number(agency, source_id)?;
                self.numbers.insert(name, no);
                no
            }
        };
        let buckets = [
            audit_source_bucket(index, no),
            audit_source_bucket(index, None),
        ];
        Ok(Some((buckets, (epoch, sequence))))
    }
    fn mark(merge: &IndexMerge) -> MergeMark {
        merge.sources
    }
    fn rows(snap: &Snapshot, unit: &Unit) -> Result<UnitRows<SourceRow>, StoreError> {
        let mut stored = match unit.merged {
            Some(segment) => snap.audit_source_rows_merged(segment)?,
            None => Vec::new(),
        };
        // Unnumbered rows stay in their blocks; numbered ones too until merged.
        stored.extend(
            snap.audit_source_rows(unit.blocks.clone())?
                .into_iter()
                .filter(|((bucket, _), _)| unit.in_blocks || bucket & UNNUMBERED != 0),
        );
        let misplaced = stored
            .iter()
            .copied()
            .find(|&((b, i), _)| b & UNNUMBERED == 0 && !unit.placed(b, i));
        let rows = stored
            .into_iter()
            .map(|((bucket, index), position)| ((block_bucket(bucket, index), index), position))
            .collect();
        Ok((rows, misplaced))
    }
    fn outside(
        snap: &Snapshot,
        blocks: std::ops::Range<u64>,
    ) -> Result<Option<SourceRow>, StoreError> {
        snap.audit_source_row_outside(blocks)
    }
    fn outside_merged(
        snap: &Snapshot,
        blocks: std::ops::Range<u64>,
        merge: &IndexMerge,
    ) -> Result<Option<SourceRow>, StoreError> {
        let [numbered, merged] = legal_ranges(&blocks, merge, merge.sources);
        let [_, unnumbered] = audit_source_ranges(&blocks);
        match snap.audit_source_row_outside_ranges(&[numbered, merged.clone(), unnumbered])? {
            Some(row) => Ok(Some(row)),
            None => snap.packed_source_row_outside(merged),
        }
    }
    fn index_of(row: &SourceRow) -> u64 {
        row.0.1
    }
    fn fits((buckets, position): &Self::Want, row: &SourceRow) -> bool {
        buckets.contains(&row.0.0) && row.1 == *position
    }
    fn missing(index: u64) -> String {
        format!(
            "audit entry {index}: missing from the source index (gaps --source would not count \
             it)"
        )
    }
    fn extra(((bucket, index), (epoch, sequence)): SourceRow) -> String {
        format!(
            "the source index has a row for audit entry {index} under bucket {bucket:#x} at \
             epoch {epoch} sequence {sequence}, which is not that entry's (the entry is \
             missing, names another source or position, or is there twice)"
        )
    }
}

/// Checks index `I` against the audit log as the scan visits its entries.
struct IndexCheck<I: BlockIndex> {
    index: I,
    /// The store has the index (its schema version is new enough).
    present: bool,
    audit_from: u64,
    /// How far a redb store's indexes are merged; `None` on PostgreSQL.
    merge: Option<IndexMerge>,
    /// The unit the scan is in, and (index, want) of its entries so far, in index order.
    unit: Unit,
    /// The last block the scan was in.
    block: u64,
    want: Vec<(u64, I::Want)>,
    checked: u64,
}

impl<I: BlockIndex> IndexCheck<I> {
    fn new(index: I, present: bool, audit_from: u64, merge: Option<IndexMerge>) -> IndexCheck<I> {
        let block = audit_from / AUDIT_KEY_BLOCK;
        IndexCheck {
            index,
            present,
            audit_from,
            unit: Unit::of::<I>(merge.as_ref(), block),
            merge,
            block,
            want: Vec::new(),
            checked: 0,
        }
    }

    /// Notes entry `index`; checks the block before it once the scan leaves it.
    fn visit(
        &mut self,
        snap: &Snapshot,
        index: u64,
        record: &AuditRecord,
    ) -> Result<Option<String>, StoreError> {
        if !self.present {
            return Ok(None);
        }
        let block = index / AUDIT_KEY_BLOCK;
        let mut problem = None;
        if !self.unit.blocks.contains(&block) {
            problem = self.finish_block(snap)?;
            self.unit = Unit::of::<I>(self.merge.as_ref(), block);
        }
        self.block = block;
        if let Some(w) = self.index.want(snap, index, record)? {
            self.want.push((index, w));
        }
        Ok(problem)
    }

    /// Compares the current block's rows with what its entries need.
    fn finish_block(&mut self, snap: &Snapshot) -> Result<Option<String>, StoreError> {
        let (mut have, misplaced) = I::rows(snap, &self.unit)?;
        if let Some(row) = misplaced {
            self.want.clear();
            return Ok(Some(I::extra(row)));
        }
        // Rows of entries retention removed, in the block or segment it cut into only.
        if self
            .unit
            .blocks
            .contains(&(self.audit_from / AUDIT_KEY_BLOCK))
        {
            have.retain(|row| I::index_of(row) >= self.audit_from);
        }
        have.sort_unstable_by_key(|row| (I::index_of(row), *row));
        let mut have_it = have.iter().peekable();
        let mut problem = None;
        for (index, want) in &self.want {
            match have_it.next_if(|row| I::index_of(row) == *index) {
                Some(row) if I::fits(want, row) => {}
                Some(&row) => problem = Some(I::extra(row)),
                None => {
                    problem = Some(match have_it.peek() {
                        // A row of an index below: no entry of this block needs it.
                        Some(&&row) if I::index_of(&row) < *index => I::extra(row),
                        _ => I::missing(*index),
                    })
                }
            }
            if problem.is_some() {
                break;
            }
        }
        if problem.is_none()
            && let Some(&row) = have_it.next()
        {
            problem = Some(I::extra(row));
        }
        self.checked += self.want.len() as u64;
        self.want.clear();
        Ok(problem)
    }

    /// Checks the last block, and that no row lies outside the log's blocks.
    fn finish(&mut self, snap: &Snapshot) -> Result<Option<String>, StoreError> {
        if !self.present {
            return Ok(None);
        }
        if let Some(p) = self.finish_block(snap)? {
            return Ok(Some(p));
        }
        let blocks = self.audit_from / AUDIT_KEY_BLOCK..self.block + 1;
        Ok(match &self.merge {
            Some(merge) => I::outside_merged(snap, blocks, merge)?,
            None => I::outside(snap, blocks)?,
        }
        .map(I::extra))
    }
}

/// Checks, in order:
/// - the chain: contiguous indices from the anchor, each `prev_hash` the previous `hash`, each
///   stored `hash` recomputed (an entry that stores none reads with the hash of its content,
///   so an edit of it breaks the next link, or the chain head), the last one the stored
///   chain head;
/// - each `applied`/`applied_late` entry has its effect record (same key, pointing back), and no
///   key is applied twice;
/// - each `duplicate` refers to an earlier applied entry with the same key and digest;
/// - each `conflict`/`stale`/`malformed` entry has its quarantine record, or a later
///   `released`/`discarded` entry took it out;
/// - each `released` entry has its effect record marked `released`;
/// - each effect record has its applied audit entry, with the same key, source and position,
///   and its stored payload decodes under `contract` to that entry's key and digest;
/// - each quarantine record has the audit entry that quarantined it, with the same outcome,
///   key, reason and topic; a conflicting or stale one's payload decodes to that entry's key
///   and digest; a malformed one's payload matches the fingerprint stored beside it (its
///   audit entry records no digest; the fingerprint table is not hash-chained).
///
/// What retention removed (audit entries before the anchor, effects and quarantine records
/// below their floors) is not required; references into it are accepted as pruned. A record
/// whose audit entry was pruned must still decode to the key it holds (and a quarantined one
/// match its fingerprint); a retained `duplicate` entry still proves its effect's digest.
///
/// `contract` must be the feed contract `run` decodes with: digests depend on it.
///
/// Memory: one 32-byte key per applied entry (to prove no key is applied twice).
pub fn verify(snap: &Snapshot, contract: &FeedContract) -> Result<VerifyReport, StoreError> {
    verify_reporting(snap, contract, &mut |_| {})
}

/// The number of audit entries `verify` reads: its progress total.
pub fn entries_to_verify(snap: &Snapshot) -> Result<u64, StoreError> {
    let meta = snap.meta()?;
    let from = meta.audit_anchor.map_or(0, |(index, _)| index + 1);
    Ok(meta.next_audit.saturating_sub(from))
}

/// `verify`, calling `progress(n)` as each `n` more audit entries are checked.
pub fn verify_reporting(
    snap: &Snapshot,
    contract: &FeedContract,
    progress: &mut dyn FnMut(u64),
) -> Result<VerifyReport, StoreError> {
    // Admission limits may have been lowered since a record was admitted: not damage.
    let contract = &contract.for_stored();
    let meta = snap.meta()?;
    let (mut expected, mut prev) = match meta.audit_anchor {
        Some((index, hash)) => (index + 1, hash),
        None => (0, [0u8; 32]),
    };
    let marks = snap.retention_marks()?;
    let mut report = VerifyReport {
        audit_from: expected,
        effects_from: marks.effects_floor,
        quarantine_from: marks.quarantine_floor,
        ..VerifyReport::default()
    };
    let mut scan = Scan {
        marks,
        audit_from: expected,
        applied_keys: Vec::new(),
        unresolved: BTreeMap::new(),
    };
    let merge = snap.index_merge()?;
    let mut keys = IndexCheck::new(KeyIndex, meta.schema_version >= 2, expected, merge);
    let mut sources = IndexCheck::new(
        SourceIndex::default(),
        meta.schema_version >= 3,
        expected,
        merge,
    );
    let mut fail = None;
    let scanned = snap.scan_audit::<StoreError>(expected, |e| {
        let at = |what: String| Some(format!("audit entry {}: {what}", e.index));
        let problem =
            if e.index != expected {
                at(format!(
                    "expected index {expected} (an entry is missing or out of place)"
                ))
            } else if e.record.prev_hash != prev {
                let (whose, hint) = if e.index > report.audit_from {
                    // An entry that stores no hash (record version 3) reads with the hash of its
                    // content, so an edit of it shows here, at the next entry's link, or at the
                    // next that holds its prev_hash (record version 4).
                    (
                        format!("entry {}'s hash", e.index - 1),
                        format!(
                            " ({} was edited, or this prev_hash)",
                            edited(snap, e.index, report.audit_from)?
                        ),
                    )
                } else if report.audit_from == 0 {
                    ("the start of the log".to_string(), String::new())
                } else {
                    ("the retention anchor's hash".to_string(), String::new())
                };
                at(format!(
                    "prev_hash {} does not match {whose} {}{hint}",
                    hex(&e.record.prev_hash),
                    hex(&prev)
                ))
            } else if (e.index.is_multiple_of(super::stored::AUDIT_CHECKPOINT)
                || e.index == report.audit_from)
                && !snap.audit_holds_prev_hash(e.index)?
            {
                // Every writer stores it there: without it, the link into it is not checked.
                at("leaves its prev_hash to the entry before it at a checkpoint or the first entry \
                kept, where every writer stores it (edited)"
                .into())
            } else if !e.hash_is_valid() {
                at("its hash does not match its content (edited)".into())
            } else if let Some(p) = check_entry(snap, &e, &mut scan, contract)? {
                at(p)
            } else if let Some(p) = keys.visit(snap, e.index, &e.record)? {
                Some(p)
            } else {
                sources.visit(snap, e.index, &e.record)?
            };
        if problem.is_some() {
            fail = problem;
            return Ok(ControlFlow::Break(()));
        }
        if let Some(o) = e.outcome() {
            report.counts.add(o);
        }
        report.audit_entries += 1;
        if report.audit_entries.is_multiple_of(1024) {
            progress(1024);
        }
        prev = e.record.hash;
        expected += 1;
        Ok(ControlFlow::Continue(()))
    });
    // An entry that does not decode (damaged, or leaving its `prev_hash` to an entry that is
    // missing) is the first problem the scan met.
    match scanned {
        Err(StoreError::Record(r)) if r.table == super::tables::AUDIT.name() && fail.is_none() => {
            fail = Some(format!("audit entry {}: {}", r.key, r.why));
        }
        other => other?,
    }
    // The first entry that applied a key a second time is the first problem the scan would
    // have met (it stops at a problem, and only entries before it, or it, were noted).
    if let Some((index, key)) = first_key_applied_twice(snap, &mut scan.applied_keys)? {
        fail = Some(format!(
            "audit entry {index}: key {} applied a second time",
            hex(&key)
        ));
    }
    if fail.is_none()
        && expected == meta.next_audit
        && expected > report.audit_from
        && prev != meta.chain_head
    {
        fail = Some(format!(
            "audit entry {}: its hash {} is not the database's chain head {} ({} was edited, \
             or the chain head)",
            expected - 1,
            hex(&prev),
            hex(&meta.chain_head),
            edited(snap, expected, report.audit_from)?
        ));
    }
    if fail.is_none() && (prev != meta.chain_head || expected != meta.next_audit) {
        fail = Some(format!(
            "the audit log ends at index {} with hash {}, but the database's chain head is index {} \
             with hash {} (entries were removed from the end)",
            expected.saturating_sub(1),
            hex(&prev),
            meta.next_audit.saturating_sub(1),
            hex(&meta.chain_head)
        ));
    }
    if fail.is_none() {
        fail = keys.finish(snap)?;
        report.key_index = keys.present.then_some(keys.checked);
    }
    if fail.is_none() {
        fail = sources.finish(snap)?;
        report.source_index = sources.present.then_some(sources.checked);
    }
    let first_unresolved = scan
        .unresolved
        .iter()
        .map(|(q, i)| (*q, *i))
        .min_by_key(|p| p.1);
    if fail.is_none()
        && let Some((q, index)) = first_unresolved
    {
        {
            let outcome = snap
                .audit_entry(index)?
                .and_then(|e| e.outcome())
                .map_or("quarantining", Outcome::as_str);
            fail = Some(format!(
                "audit entry {index}: {outcome} without its quarantine record #{q} (deleted, and no released or discarded entry records taking it out)"
            ));
        }
    }
    if fail.is_none() {
        fail = marks_out_of_bounds(&meta, &marks);
    }
    if fail.is_none() {
        // Offsets run without a gap from the retention floor to the end: an effect can only
        // leave the log by retention, from the front.
        let mut expected_offset = marks.effects_floor;
        // agency -> source_id -> high-water mark, looked up without building a key.
        let mut high_water: HashMap<String, HashMap<String, (u64, u64)>> = HashMap::new();
        for s in snap.sources()? {
            high_water
                .entry(s.agency)
                .or_default()
                .insert(s.source_id, s.high_water);
        }
        snap.scan_effects::<StoreError>(marks.effects_floor, |eff| {
            if eff.offset != expected_offset {
                fail = Some(format!(
                    "effect {expected_offset} is missing (the log jumps to {}; retention only \
                     removes effects below its floor {})",
                    eff.offset, marks.effects_floor
                ));
                return Ok(ControlFlow::Break(()));
            }
            expected_offset += 1;
            report.effects += 1;
            let r = &eff.record;
            let mark = high_water
                .get(r.agency.as_str())
                .and_then(|ids| ids.get(r.source_id.as_str()));
            let problem = if let Some(p) = mark_problem(r, mark) {
                Some(p)
            } else if r.audit_index < scan.audit_from {
                // The applying entry was pruned: the payload must still be the message the
                // record names, and have the digest it holds (record version 3, or 4 under
                // `digest_ignore`; one of version 4 that reads its digest from its payload, or
                // of version 2, has its digest proven only by a retained `duplicate`).
                content_problem(
                    &r.payload,
                    contract,
                    Some(r.key),
                    r.digest,
                    "the effect record holds (its audit entry was pruned)",
                )
            } else {
                match snap.audit_entry(r.audit_index)? {
                    Some(a)
                        if a.outcome().is_some_and(Outcome::applies)
                            && a.record.effect_offset == Some(eff.offset)
                            && (a.outcome() == Some(Outcome::Released)) == r.released =>
                    {
                        effect_content(&eff, &a, contract)
                    }
                    _ => Some(format!(
                        "its audit entry {} is missing or does not record applying it",
                        r.audit_index
                    )),
                }
            };
            if let Some(p) = problem {
                fail = Some(format!("effect {}: {p}", eff.offset));
                return Ok(ControlFlow::Break(()));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        if fail.is_none() && expected_offset != meta.next_effect {
            fail = Some(format!(
                "the effect log ends before offset {} but the database has issued offsets up to {} \
                 (effects were removed from the end)",
                expected_offset,
                meta.next_effect.saturating_sub(1)
            ));
        }
    }
    if fail.is_none() {
        snap.scan_quarantine::<StoreError>(marks.quarantine_floor, |q| {
            report.quarantined += 1;
            fail = quarantine_problem(snap, &q, scan.audit_from, contract)?
                .map(|p| format!("quarantine #{}: {p}", q.id));
            Ok(if fail.is_some() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            })
        })?;
    }
    if fail.is_none() {
        for (name, rec) in snap.sink_cursors()? {
            match sink_problem(snap, &name, &rec, &scan)? {
                Ok(r) => report.sinks.push(r),
                Err(p) => {
                    fail = Some(format!("sink {name}: {p}"));
                    break;
                }
            }
        }
    }
    report.violation = fail;
    Ok(report)
}

/// The first eight bytes of a key, as a number.
fn key_prefix(key: &[u8; 32]) -> u64 {
    let mut b = [0; 8];
    b.copy_from_slice(&key[..8]);
    u64::from_be_bytes(b)
}

/// The lowest audit index among `applied` ((key prefix, index) of each applied entry) whose
/// key an entry of a lower index applied already, with that key. Sorted, entries sharing a
/// prefix lie together; only theirs are read back to compare whole keys (two different
/// SHA-256 keys share eight bytes once in ~1.8 * 10^19 pairs: at 20M entries' 2 * 10^14
/// pairs, about once in 90,000 such logs).
fn first_key_applied_twice(
    snap: &Snapshot,
    applied: &mut [(u64, u64)],
) -> Result<Option<(u64, [u8; 32])>, StoreError> {
    applied.sort_unstable();
    let mut first: Option<(u64, [u8; 32])> = None;
    for run in applied.chunk_by(|a, b| a.0 == b.0).filter(|r| r.len() > 1) {
        // In index order: the first entry holding a key applied it; any later one, again.
        let mut seen: Vec<[u8; 32]> = Vec::new();
        for &(_, index) in run {
            let Some(key) = snap.audit_entry(index)?.and_then(|e| e.record.key) else {
                continue;
            };
            if seen.contains(&key) {
                if first.is_none_or(|(i, _)| index < i) {
                    first = Some((index, key));
                }
                break;
            }
            seen.push(key);
        }
    }
    Ok(first)
}

/// One relay sink: its ledger accounts for every offset below its cursor, each action that
/// passed offsets over has its audit entry, retention kept what the sink still needs, and
/// each parked event's stored copy is the event its effect makes.
fn sink_problem(
    snap: &Snapshot,
    name: &str,
    rec: &super::tables::SinkRecord,
    scan: &Scan,
) -> Result<Result<SinkReport, String>, StoreError> {
    let acc = match snap.sink_accounting(name, rec)? {
        Ok(a) => a,
        Err(p) => return Ok(Err(p)),
    };
    let old = acc.legacy || acc.unrecorded;
    let mut cited = HashSet::new();
    for &(kind, from, to, audit_index) in &acc.passed_over {
        let Some(index) = audit_index else { continue };
        if !cited.insert(index) {
            return Ok(Err(format!(
                "two of its ledger entries cite audit entry {index} for what they pass over"
            )));
        }
        if index < scan.audit_from {
            continue;
        }
        let entry = snap.audit_entry(index)?;
        if !action_records(entry.as_ref(), name, kind, from, to) {
            return Ok(Err(format!(
                "its ledger says offsets {} were {} by the action of audit entry {index}, which \
                 does not record that",
                super::ledger::range_text(from, to),
                kind.as_str()
            )));
        }
    }
    let Some(stream) = rec.stream() else {
        return Ok(Err(format!(
            "its cursor delivers a log of stream code {}, which this version does not know",
            rec.stream
        )));
    };
    let floor = match stream {
        Stream::Effects => scan.marks.effects_floor,
        Stream::Audit => scan.audit_from,
    };
    if rec.next < floor {
        return Ok(Err(format!(
            "retention removed {} up to {floor} but its cursor is at {}: {} it had not \
             delivered are gone",
            stream.entries(),
            rec.next,
            stream.entries()
        )));
    }
    let mut report = SinkReport {
        name: name.to_string(),
        stream,
        next: rec.next,
        accounting: acc,
        ..SinkReport::default()
    };
    for p in snap.sink_parked(Some(name))? {
        let at = |what: String| {
            Ok(Err(format!(
                "event parked at {} {}: {what}",
                stream.position(),
                p.offset
            )))
        };
        if p.offset < floor {
            if old {
                report.parked_unprovable += 1;
                continue;
            }
            return at(format!(
                "retention removed its {}, which it keeps while an event is parked",
                stream.entries()
            ));
        }
        let problem = match stream {
            Stream::Effects => {
                let Some(eff) = snap.effect(p.offset)? else {
                    return at("its effect is not in the log".into());
                };
                parked_content(&p.record, &eff)
            }
            Stream::Audit => {
                let Some(entry) = snap.audit_entry(p.offset)? else {
                    return at("its audit entry is not in the log".into());
                };
                parked_audit_content(&p.record, &entry)
            }
        };
        if let Some(problem) = problem {
            return at(problem);
        }
        report.parked_checked += 1;
    }
    Ok(Ok(report))
}

/// Whether audit entry `entry` records the action that passed over `from..to` of sink `name`
/// as `kind`: a `relay` entry of that sink, of that action, whose range holds them. (A later
/// rewind into the range cuts the ledger's entry back, so it may end before the action's.)
fn action_records(
    entry: Option<&super::AuditEntry>,
    name: &str,
    kind: super::tables::LedgerKind,
    from: u64,
    to: u64,
) -> bool {
    use super::tables::LedgerKind;
    let Some(a) = entry else { return false };
    let r = &a.record;
    if a.outcome() != Some(Outcome::Relay) || r.topic != name {
        return false;
    }
    // "... from offset A to B ...": the range the action moved the cursor over.
    let range = |reason: &str| {
        let rest = reason.split_once(" from offset ")?.1;
        let (a, rest) = rest.split_once(" to ")?;
        let b: String = rest.chars().take_while(char::is_ascii_digit).collect();
        Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?))
    };
    match kind {
        LedgerKind::Skipped | LedgerKind::Adopted => {
            let prefix = if kind == LedgerKind::Skipped {
                format!("relay skip of sink {name} from offset ")
            } else {
                format!("relay sink {name}: cursor taken from the sink's own store")
            };
            r.reason.starts_with(&prefix)
                && range(&r.reason).is_some_and(|(a, b)| a <= from && to <= b)
                && r.effect_offset.is_some_and(|end| to <= end)
        }
        LedgerKind::Discarded => {
            r.reason.starts_with("relay discard of event ") && r.effect_offset == Some(from)
        }
        _ => false,
    }
}

/// A parked record against the effect it was made of; `Some(problem)` if its copy differs.
fn parked_content(p: &super::tables::ParkedRecord, eff: &super::Effect) -> Option<String> {
    use crate::relay::envelope::{EffectView, envelope, event_id, source_of};
    let r = &eff.record;
    if p.id != event_id(&r.key, r.released, &r.payload)
        || p.key != r.key
        || p.agency != r.agency
        || p.source_id != r.source_id
        || p.topic != r.topic
    {
        return Some(format!(
            "its id, key, source or topic differs from effect {}'s ({})",
            eff.offset,
            cause(false)
        ));
    }
    let Some(source) = source_of(&p.event) else {
        return Some(format!(
            "its stored event is not the envelope of an event ({})",
            cause(false)
        ));
    };
    (envelope(&source, &EffectView::of(eff.offset, r)) != p.event).then(|| {
        format!(
            "its stored event differs from the event effect {} makes ({}); `relay retry` \
             sends the event rebuilt from the effect, never the stored copy",
            eff.offset,
            cause(false)
        )
    })
}

/// A parked record of an audit sink against the audit entry it was made of; `Some(problem)`
/// if its copy differs.
fn parked_audit_content(
    p: &super::tables::ParkedRecord,
    entry: &super::AuditEntry,
) -> Option<String> {
    let Some(source) = crate::relay::envelope::source_of(&p.event) else {
        return Some(format!(
            "its stored event is not the envelope of an event ({})",
            cause(false)
        ));
    };
    let ev = crate::relay::Event::of_audit(&source, entry);
    let same = ev.id == p.id
        && ev.key == p.key
        && ev.agency == p.agency
        && ev.source_id == p.source_id
        && ev.topic == p.topic
        && ev.json == p.event;
    (!same).then(|| {
        format!(
            "its stored event differs from the event audit entry {} makes ({}); `relay retry` \
             sends the event rebuilt from the entry, never the stored copy",
            entry.index,
            cause(false)
        )
    })
}

/// What to suspect when a stored payload disagrees with its audit entry.
fn cause(contract_may_differ: bool) -> &'static str {
    if contract_may_differ {
        "the record was damaged or edited, or `run` uses another feed contract than this \
         one: pass its --config"
    } else {
        "the record was damaged or edited"
    }
}

/// Decodes a stored payload under `contract` and compares it with the key (and, when one was
/// recorded, the digest) that `recorded_by` holds; `Some(problem)` if it differs.
fn content_problem(
    payload: &[u8],
    contract: &FeedContract,
    key: Option<[u8; 32]>,
    digest: Option<[u8; 32]>,
    recorded_by: &str,
) -> Option<String> {
    let m = match wire::decode(payload, contract) {
        Ok(m) => m,
        Err(e) => {
            return Some(format!(
                "stored payload does not decode: {e} ({})",
                cause(e.depends_on_contract())
            ));
        }
    };
    if Some(*m.key().as_bytes()) != key {
        return Some(format!(
            "stored payload decodes to key {} ({}/{} epoch {} sequence {}), not the key {} \
             recorded ({})",
            m.key(),
            m.source.agency(),
            m.source.source_id(),
            m.position.epoch,
            m.position.sequence,
            recorded_by,
            cause(true)
        ));
    }
    match digest {
        Some(d) if d != *m.digest.as_bytes() => Some(format!(
            "content differs from what {recorded_by} recorded (digest {} under this feed \
             contract, {} recorded): {}",
            short(m.digest.as_bytes()),
            short(&d),
            cause(true)
        )),
        _ => None,
    }
}

/// The first 8 bytes of a digest in hex, enough to tell two apart in a message.
fn short(d: &[u8; 32]) -> String {
    hex(&d[..8])
}

/// An effect against its source's high-water mark: the writer looks a position up in the
/// window only at or below the mark, so an effect above it would not be found and a replay
/// of it would be applied.
fn mark_problem(r: &super::tables::EffectRecord, mark: Option<&(u64, u64)>) -> Option<String> {
    match mark {
        None => Some(format!(
            "its source {}/{} has no record",
            r.agency, r.source_id
        )),
        Some(m) if (r.epoch, r.sequence) > *m => Some(format!(
            "its position (epoch {} sequence {}) lies above its source's high-water mark \
             (epoch {} sequence {}): a replay of it would not be found in the window",
            r.epoch, r.sequence, m.0, m.1
        )),
        Some(_) => None,
    }
}

/// An effect against the (retained) audit entry that applied it: the fields `dump-effects`
/// shows, then the payload's key and digest.
fn effect_content(
    eff: &super::Effect,
    a: &super::AuditEntry,
    contract: &FeedContract,
) -> Option<String> {
    let (r, ar) = (&eff.record, &a.record);
    let same_fields = ar.key == Some(r.key)
        && ar.agency.as_deref() == Some(r.agency.as_str())
        && ar.source_id.as_deref() == Some(r.source_id.as_str())
        && ar.epoch == Some(r.epoch)
        && ar.sequence == Some(r.sequence);
    if !same_fields {
        return Some(format!(
            "its key, source or position differs from what audit entry {} recorded ({})",
            a.index,
            cause(false)
        ));
    }
    // The payload first: an effect that reads its digest from its payload (record version
    // 4) differs in both when its payload was edited, and the payload is what changed.
    if let Some(problem) = content_problem(
        &r.payload,
        contract,
        ar.key,
        ar.digest,
        &format!("audit entry {}", a.index),
    ) {
        return Some(problem);
    }
    // The digest the window compares replays with (record version 3 on).
    if r.digest.is_some() && r.digest != ar.digest {
        return Some(format!(
            "its digest differs from what audit entry {} recorded ({})",
            a.index,
            cause(false)
        ));
    }
    None
}

/// One kept quarantine record against the audit entry that quarantined it (when retained)
/// and the fingerprint stored beside it.
fn quarantine_problem(
    snap: &Snapshot,
    q: &super::QuarantineEntry,
    audit_from: u64,
    contract: &FeedContract,
) -> Result<Option<String>, StoreError> {
    let r = &q.record;
    let Some(outcome) = q.outcome() else {
        return Ok(Some(format!("unknown outcome code {}", r.outcome)));
    };
    let audit = if r.audit_index < audit_from {
        None
    } else {
        match snap.audit_entry(r.audit_index)? {
            Some(a) => Some(a),
            None => {
                return Ok(Some(format!(
                    "its audit entry {} does not exist",
                    r.audit_index
                )));
            }
        }
    };
    if let Some(a) = &audit {
        let ar = &a.record;
        if a.outcome() != Some(outcome)
            || ar.quarantine_id != Some(q.id)
            || ar.key != r.key
            || ar.reason != r.reason
            || ar.topic != r.topic
        {
            return Ok(Some(format!(
                "its outcome, key, reason or topic differs from what audit entry {} recorded ({})",
                a.index,
                cause(false)
            )));
        }
    }
    let stored_fp = snap.quarantine_fingerprint(q.id)?;
    let fp_differs = |fp: [u8; 32]| stored_fp.is_some_and(|s| s != fp);
    Ok(match outcome {
        Outcome::Conflict | Outcome::Stale => match &audit {
            Some(a) => content_problem(
                &r.payload,
                contract,
                a.record.key,
                a.record.digest,
                &format!("audit entry {}", a.index),
            ),
            None => content_problem(
                &r.payload,
                contract,
                r.key,
                None,
                "the quarantine record holds (its audit entry was pruned)",
            )
            .or_else(|| {
                // Decodes (checked above): its digest must give the stored fingerprint.
                let m = wire::decode(&r.payload, contract).ok()?;
                fp_differs(fingerprint_decided(
                    r.outcome,
                    m.key().as_bytes(),
                    m.digest.as_bytes(),
                ))
                .then(|| {
                    format!(
                        "content differs from the fingerprint taken when it was quarantined \
                         (its audit entry was pruned): {}",
                        cause(true)
                    )
                })
            }),
        },
        Outcome::Malformed => {
            // The audit entry records no digest of a malformed message, but its reason names
            // an oversized payload's size, limit and SHA-256 (only `limit` bytes are kept).
            let reason = audit.as_ref().map_or(&r.reason, |a| &a.record.reason);
            let whole = match DecodeError::parse_too_large(reason) {
                Some((size, limit, _)) if r.payload.len() != limit.min(size) => {
                    return Ok(Some(format!(
                        "keeps {} bytes of an oversized payload, but its reason says the first \
                         {limit} were kept ({})",
                        r.payload.len(),
                        cause(false)
                    )));
                }
                Some((_, _, whole)) => whole,
                None => sha256(&[&r.payload]),
            };
            fp_differs(fingerprint_malformed(&whole)).then(|| {
                format!(
                    "stored payload differs from the fingerprint taken when it was quarantined \
                     ({})",
                    cause(false)
                )
            })
        }
        other => Some(format!("{other} is not a quarantine outcome")),
    })
}

/// Retention's marks must lie inside what was ever written, and never inside the window.
fn marks_out_of_bounds(
    meta: &super::tables::Meta,
    marks: &super::tables::RetentionMarks,
) -> Option<String> {
    if marks.effects_floor > meta.window_start {
        return Some(format!(
            "the effects retention floor {} lies inside the dedup window (which starts at {}): \
             retention never prunes the window",
            marks.effects_floor, meta.window_start
        ));
    }
    if meta.window_purged > meta.window_start {
        return Some(format!(
            "the window's purge mark {} is past its start {}: entries of effects still in the \
             window would count as deleted",
            meta.window_purged, meta.window_start
        ));
    }
    if marks.effects_floor > meta.window_purged {
        return Some(format!(
            "the effects retention floor {} is past the window's purge mark {}: the window \
             entries of the effects between were never deleted",
            marks.effects_floor, meta.window_purged
        ));
    }
    if marks.quarantine_floor > meta.next_quarantine {
        return Some(format!(
            "the quarantine retention floor {} is beyond the last quarantine id issued ({})",
            marks.quarantine_floor, meta.next_quarantine
        ));
    }
    match meta.audit_anchor {
        Some((i, _)) if i >= meta.next_audit => Some(format!(
            "the audit anchor {i} is beyond the last audit entry issued ({})",
            meta.next_audit
        )),
        _ => None,
    }
}

/// Which entries an edit that breaks the link into entry `index` can be in (`from`: the
/// first entry kept): "entry N", or "an entry from N to M" where entries leave their
/// `prev_hash` to the entry before them (`Snapshot::audit_link_span`).
fn edited(snap: &Snapshot, index: u64, from: u64) -> Result<String, StoreError> {
    let last = index - 1;
    let first = snap.audit_link_span(index)?.max(from);
    Ok(if first >= last {
        format!("entry {last}")
    } else {
        format!("an entry from {first} to {last}")
    })
}

/// The invariants of one (hash-valid) entry; `Some(problem)` if broken.
fn check_entry(
    snap: &Snapshot,
    e: &super::AuditEntry,
    scan: &mut Scan,
    contract: &FeedContract,
) -> Result<Option<String>, StoreError> {
    let Some(outcome) = e.outcome() else {
        return Ok(Some(format!("unknown outcome code {}", e.record.outcome)));
    };
    let effects_floor = scan.marks.effects_floor;
    let pruned_effect = |offset: u64| offset < effects_floor;
    Ok(match outcome {
        Outcome::Applied | Outcome::AppliedLate | Outcome::Released => {
            let Some(offset) = e.record.effect_offset else {
                return Ok(Some(format!("{outcome} without an effect offset")));
            };
            let Some(key) = e.record.key else {
                return Ok(Some(format!("{outcome} without a key")));
            };
            let released = outcome == Outcome::Released;
            // An operator's release re-applies a key on purpose; the feed never does. Checked
            // once the scan ends (`first_key_applied_twice`).
            if !released {
                scan.applied_keys.push((key_prefix(&key), e.index));
            }
            if released && let Some(problem) = resolves(e, scan) {
                return Ok(Some(problem));
            }
            match snap.effect(offset)? {
                None if pruned_effect(offset) => None,
                None => Some(format!("{outcome} but effect {offset} does not exist")),
                Some(eff) if eff.record.key != key || eff.record.audit_index != e.index => Some(
                    format!("{outcome} but effect {offset} records another key or audit entry"),
                ),
                Some(eff) if eff.record.released != released => Some(format!(
                    "{outcome} but effect {offset} has released={}",
                    eff.record.released
                )),
                Some(_) => None,
            }
        }
        Outcome::Duplicate => {
            let Some(offset) = e.record.effect_offset else {
                return Ok(Some("duplicate without the effect it duplicates".into()));
            };
            match snap.effect(offset)? {
                None if pruned_effect(offset) => None,
                None => Some(format!(
                    "duplicate of effect {offset}, which does not exist"
                )),
                // The applied entry itself was pruned: the effect still names the same key,
                // and this entry's digest is the one its content had when it was decided.
                Some(eff) if eff.record.audit_index < scan.audit_from => {
                    if Some(eff.record.key) != e.record.key {
                        Some(format!(
                            "duplicate of effect {offset}, which records another key"
                        ))
                    } else {
                        content_problem(
                            &eff.record.payload,
                            contract,
                            e.record.key,
                            e.record.digest,
                            "this duplicate entry",
                        )
                        .map(|p| format!("duplicate of effect {offset}, whose {p}"))
                    }
                }
                Some(eff) => match snap.audit_entry(eff.record.audit_index)? {
                    Some(a)
                        if a.index < e.index
                            && a.outcome().is_some_and(Outcome::applies)
                            && a.record.key == e.record.key
                            && a.record.digest == e.record.digest =>
                    {
                        None
                    }
                    _ => Some(format!(
                        "duplicate of effect {offset} is not backed by an earlier applied entry with the same key and digest"
                    )),
                },
            }
        }
        Outcome::Conflict | Outcome::Stale | Outcome::Malformed => match e.record.quarantine_id {
            None => Some(format!("{outcome} without a quarantine id")),
            Some(q) if q < scan.marks.quarantine_floor => None,
            Some(q) if snap.quarantined(q)?.is_some() => None,
            Some(q) => {
                scan.unresolved.entry(q).or_insert(e.index);
                None
            }
        },
        Outcome::Discarded => resolves(e, scan),
        // An operator's relay action changes no effect or quarantine record; it must name
        // the sink it acted on.
        Outcome::Relay if e.record.topic.is_empty() => {
            Some("relay action without the sink it acted on".into())
        }
        Outcome::Relay => None,
    })
}

/// A `released`/`discarded` entry takes its quarantine record out: from then on its absence
/// is accounted for.
fn resolves(e: &super::AuditEntry, scan: &mut Scan) -> Option<String> {
    let Some(q) = e.record.quarantine_id else {
        return Some(format!(
            "{} without a quarantine id",
            e.outcome().map_or("?", Outcome::as_str)
        ));
    };
    scan.unresolved.remove(&q);
    None
}
