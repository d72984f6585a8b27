//! The backend-neutral store API the write path is written against: one open write
//! transaction's logical tables. `engine::Writer` decides a batch (through `decide::decide`,
//! the only place outcomes are decided) and maintains the window, the marks, the logs and
//! the chain over any `Tx`; a backend (redb in `redb_tx.rs`) only stores and finds records.
//!
//! Every method works inside the one transaction the backend opened for the batch; nothing
//! is visible to others until the backend commits it, and nothing is acknowledged before.

use std::ops::{ControlFlow, Range, RangeInclusive};

use super::StoreError;
use super::tables::{
    AuditHead, AuditRecord, Counters, EffectHead, EffectRecord, LedgerRecord, Meta, ParkedRecord,
    QuarantineRecord, RetentionMarks, SinkRecord, SourceRecord, SourceRow, Stream, UpstreamLosses,
    WindowRecord,
};

/// A window entry's key: (source number, epoch, sequence).
pub type WindowKey = (u64, u64, u64);

/// What a visitor of a log range answers: go on, or stop here.
pub type Visit = ControlFlow<()>;

/// One write transaction's tables, as records. Reads see the transaction's own writes.
pub trait Tx {
    /// A hint before a batch is decided: the (agency, source_id, epoch, sequence) it will
    /// look up, so a backend can fetch their sources and window entries at once.
    fn prefetch(&mut self, _positions: &[(&str, &str, u64, u64)]) -> Result<(), StoreError> {
        Ok(())
    }

    /// A hint before a batch is decided: the batch names source `source_no` more than once,
    /// so this transaction will most likely put several window entries of it (redb writes
    /// them all where it writes a source's later ones, `redb_tx::DIRECT_SOURCES`).
    fn several_window_entries(&mut self, _source_no: u64) {}

    /// The meta record (counters of every log, chain head, window start).
    fn meta(&mut self) -> Result<Meta, StoreError>;
    /// Audit entries per outcome since creation; `None` in a database from before them.
    fn counters(&mut self) -> Result<Option<Counters>, StoreError>;
    /// Retention's marks; `None` until retention first pruned.
    fn retention_marks(&mut self) -> Result<Option<RetentionMarks>, StoreError>;
    fn put_meta(&mut self, meta: &Meta) -> Result<(), StoreError>;
    fn put_counters(&mut self, counters: &Counters) -> Result<(), StoreError>;
    fn put_retention_marks(&mut self, marks: &RetentionMarks) -> Result<(), StoreError>;
    /// The record of losses upstream (`store::upstream`); `None` until the first.
    fn upstream_losses(&mut self) -> Result<Option<UpstreamLosses>, StoreError>;
    fn put_upstream_losses(&mut self, record: &UpstreamLosses) -> Result<(), StoreError>;

    /// The number of source (agency, source_id), if it has one.
    fn source_no(&mut self, agency: &str, source_id: &str) -> Result<Option<u64>, StoreError>;
    fn put_source_no(&mut self, agency: &str, source_id: &str, no: u64) -> Result<(), StoreError>;
    fn source(&mut self, no: u64) -> Result<Option<SourceRecord>, StoreError>;
    fn put_source(&mut self, no: u64, record: &SourceRecord) -> Result<(), StoreError>;

    fn window(&mut self, key: WindowKey) -> Result<Option<WindowRecord>, StoreError>;
    fn put_window(&mut self, key: WindowKey, record: &WindowRecord) -> Result<(), StoreError>;
    /// Removes and returns the entry.
    fn remove_window(&mut self, key: WindowKey) -> Result<Option<WindowRecord>, StoreError>;
    /// Eviction of effect `offset`, at position `key`, from the window: the entry of `key`
    /// leaves the window if it names that effect (an entry a later effect of the position
    /// holds, a released message's, stays). Called for each effect from `Meta::window_start`
    /// on, in order. Reads no digest; redb reads nothing at all (an entry of an effect below
    /// the window's start is out of the window, and deleted at a later merge).
    fn evict_window(&mut self, key: WindowKey, offset: u64) -> Result<(), StoreError>;
    /// The sequences of source `no`'s `epoch` within `seqs` that the window holds, as
    /// sorted, disjoint, non-adjacent inclusive ranges: one read of the key range (redb: its
    /// keys only; PostgreSQL: the ranges themselves), never a point read per sequence.
    fn window_present(
        &mut self,
        no: u64,
        epoch: u64,
        seqs: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, u64)>, StoreError>;

    fn put_effect(&mut self, offset: u64, record: &EffectRecord) -> Result<(), StoreError>;
    /// Visits the heads of the effects in `range`, lowest offset first, until `f` breaks.
    fn scan_effect_heads(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, EffectHead) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError>;
    fn remove_effects(&mut self, range: RangeInclusive<u64>) -> Result<(), StoreError>;

    fn audit(&mut self, index: u64) -> Result<Option<AuditRecord>, StoreError>;
    /// Appends the entry, its row in the key index (`AUDIT_KEYS`) if it has a key, and its row
    /// in the source index (`AUDIT_SOURCES`) if it has a source and a position; `source_no`
    /// is that source's number (`None`: it has none). redb inserts the index rows at the
    /// transaction's next `merge_indexes` or `remove_audit`, in key order: a writer calls
    /// `merge_indexes` (`Writer::finish`) before it commits.
    fn put_audit(
        &mut self,
        index: u64,
        record: &AuditRecord,
        source_no: Option<u64>,
    ) -> Result<(), StoreError>;
    /// Adds the entry at `index` with `key` to the key index alone: the schema upgrade's
    /// step for entries written before the index existed.
    fn index_audit_key(&mut self, index: u64, key: &[u8; 32]) -> Result<(), StoreError>;
    /// Adds a row (`audit_source_row`) to the source index alone: the schema upgrade's step
    /// for entries written before the index existed.
    fn index_audit_source(&mut self, row: SourceRow) -> Result<(), StoreError>;
    /// Moves up to `budget` rows of each audit index from the blocks of complete, old
    /// segments to their merged buckets (`store::index_merge`; redb only: a PostgreSQL
    /// lookup reads one index range already); how many moved. `meta` is the log's extent.
    fn merge_indexes(&mut self, _meta: &Meta, _budget: u64) -> Result<u64, StoreError> {
        Ok(0)
    }
    /// Visits the entries in `range`, lowest index first, until `f` breaks.
    fn scan_audit(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, AuditRecord) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError>;
    /// `scan_audit` decoding only each entry's head.
    fn scan_audit_heads(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, AuditHead) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError>;
    /// Removes the entries in `range`, the oldest the log holds (retention removes from the
    /// front only), and the key index's blocks that end within it (removed in slices smaller
    /// than a block, a block goes with the slice that takes its last entry).
    fn remove_audit(&mut self, range: RangeInclusive<u64>) -> Result<(), StoreError>;

    fn quarantined(&mut self, id: u64) -> Result<Option<QuarantineRecord>, StoreError>;
    fn put_quarantined(&mut self, id: u64, record: &QuarantineRecord) -> Result<(), StoreError>;
    fn remove_quarantined(&mut self, id: u64) -> Result<(), StoreError>;
    /// How many messages the quarantine holds.
    fn quarantine_len(&mut self) -> Result<u64, StoreError>;
    /// Visits the quarantine from id `from` up, lowest first, until `f` breaks.
    fn scan_quarantine(
        &mut self,
        from: u64,
        f: &mut dyn FnMut(u64, QuarantineRecord) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError>;
    /// The quarantine id that holds fingerprint `fp`.
    fn fingerprint_owner(&mut self, fp: &[u8; 32]) -> Result<Option<u64>, StoreError>;
    /// Records that quarantine `id` holds fingerprint `fp` (both directions).
    fn put_fingerprint(&mut self, fp: &[u8; 32], id: u64) -> Result<(), StoreError>;
    /// Forgets quarantine `id`'s fingerprint; the fingerprint's own entry only if it still
    /// names `id` (a later record may have taken it).
    fn forget_fingerprint(&mut self, id: u64) -> Result<(), StoreError>;

    /// The lowest offset a relay sink still needs, if any sink has a cursor: its cursor, or
    /// an event it parked below it at or above `floor` (retention's effects floor: an event
    /// parked below it, by a version before parked events held retention, holds nothing).
    /// Retention keeps every effect from there on.
    fn lowest_cursor(&mut self, stream: Stream, floor: u64) -> Result<Option<u64>, StoreError>;

    /// The relay's cursor of sink `name`.
    fn sink_cursor(&mut self, name: &str) -> Result<Option<SinkRecord>, StoreError>;
    fn put_sink_cursor(&mut self, name: &str, record: &SinkRecord) -> Result<(), StoreError>;
    /// Removes and returns the cursor.
    fn remove_sink_cursor(&mut self, name: &str) -> Result<Option<SinkRecord>, StoreError>;
    /// Sink `name`'s parked events at offsets in `range`, lowest first.
    fn parked(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, ParkedRecord)>, StoreError>;
    /// Parks (or re-parks) an event; whether it was not parked before.
    fn put_parked(
        &mut self,
        name: &str,
        offset: u64,
        record: &ParkedRecord,
    ) -> Result<bool, StoreError>;
    /// Removes sink `name`'s parked events at offsets in `range`; how many there were.
    fn remove_parked(&mut self, name: &str, range: RangeInclusive<u64>) -> Result<u64, StoreError>;

    /// Sink `name`'s ledger entries numbered in `range`, lowest first.
    fn ledger(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, LedgerRecord)>, StoreError>;
    fn put_ledger(&mut self, name: &str, seq: u64, record: &LedgerRecord)
    -> Result<(), StoreError>;
    /// Removes sink `name`'s ledger entries numbered in `range`.
    fn remove_ledger(&mut self, name: &str, range: RangeInclusive<u64>) -> Result<(), StoreError>;

    /// Before a deliverer's write to sink `name`'s cursor: makes sure this process is the
    /// sink's one deliverer, or `SinkBusy`. Redb: the relay holds the sink's byte lock on
    /// the file for as long as it runs, so there is nothing to check here.
    fn claim_sink(&mut self, _name: &str) -> Result<(), StoreError> {
        Ok(())
    }
    /// Before an operator removes sink `name`: `SinkBusy` while a deliverer holds it. Redb:
    /// the command takes the sink's byte lock itself.
    fn sink_idle(&mut self, _name: &str) -> Result<(), StoreError> {
        Ok(())
    }
}

/// A borrowed transaction is one too: `Writer` can work on `&mut dyn Tx` (the relay's and
/// operators' writes, which run once per action, not per message).
impl<T: Tx + ?Sized> Tx for &mut T {
    fn prefetch(&mut self, positions: &[(&str, &str, u64, u64)]) -> Result<(), StoreError> {
        (**self).prefetch(positions)
    }
    fn several_window_entries(&mut self, source_no: u64) {
        (**self).several_window_entries(source_no)
    }
    fn scan_effect_heads(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, EffectHead) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        (**self).scan_effect_heads(range, f)
    }
    fn scan_audit(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, AuditRecord) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        (**self).scan_audit(range, f)
    }
    fn scan_audit_heads(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, AuditHead) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        (**self).scan_audit_heads(range, f)
    }
    fn scan_quarantine(
        &mut self,
        from: u64,
        f: &mut dyn FnMut(u64, QuarantineRecord) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        (**self).scan_quarantine(from, f)
    }
    fn parked(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, ParkedRecord)>, StoreError> {
        (**self).parked(name, range)
    }
    fn put_parked(
        &mut self,
        name: &str,
        offset: u64,
        record: &ParkedRecord,
    ) -> Result<bool, StoreError> {
        (**self).put_parked(name, offset, record)
    }
    fn meta(&mut self) -> Result<Meta, StoreError> {
        (**self).meta()
    }
    fn counters(&mut self) -> Result<Option<Counters>, StoreError> {
        (**self).counters()
    }
    fn retention_marks(&mut self) -> Result<Option<RetentionMarks>, StoreError> {
        (**self).retention_marks()
    }
    fn put_meta(&mut self, meta: &Meta) -> Result<(), StoreError> {
        (**self).put_meta(meta)
    }
    fn put_counters(&mut self, counters: &Counters) -> Result<(), StoreError> {
        (**self).put_counters(counters)
    }
    fn put_retention_marks(&mut self, marks: &RetentionMarks) -> Result<(), StoreError> {
        (**self).put_retention_marks(marks)
    }
    fn upstream_losses(&mut self) -> Result<Option<UpstreamLosses>, StoreError> {
        (**self).upstream_losses()
    }
    fn put_upstream_losses(&mut self, record: &UpstreamLosses) -> Result<(), StoreError> {
        (**self).put_upstream_losses(record)
    }
    fn source_no(&mut self, agency: &str, source_id: &str) -> Result<Option<u64>, StoreError> {
        (**self).source_no(agency, source_id)
    }
    fn window_present(
        &mut self,
        no: u64,
        epoch: u64,
        seqs: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        (**self).window_present(no, epoch, seqs)
    }
    fn put_source_no(&mut self, agency: &str, source_id: &str, no: u64) -> Result<(), StoreError> {
        (**self).put_source_no(agency, source_id, no)
    }
    fn source(&mut self, no: u64) -> Result<Option<SourceRecord>, StoreError> {
        (**self).source(no)
    }
    fn put_source(&mut self, no: u64, record: &SourceRecord) -> Result<(), StoreError> {
        (**self).put_source(no, record)
    }
    fn window(&mut self, key: WindowKey) -> Result<Option<WindowRecord>, StoreError> {
        (**self).window(key)
    }
    fn put_window(&mut self, key: WindowKey, record: &WindowRecord) -> Result<(), StoreError> {
        (**self).put_window(key, record)
    }
    fn remove_window(&mut self, key: WindowKey) -> Result<Option<WindowRecord>, StoreError> {
        (**self).remove_window(key)
    }
    fn evict_window(&mut self, key: WindowKey, offset: u64) -> Result<(), StoreError> {
        (**self).evict_window(key, offset)
    }
    fn put_effect(&mut self, offset: u64, record: &EffectRecord) -> Result<(), StoreError> {
        (**self).put_effect(offset, record)
    }
    fn remove_effects(&mut self, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        (**self).remove_effects(range)
    }
    fn audit(&mut self, index: u64) -> Result<Option<AuditRecord>, StoreError> {
        (**self).audit(index)
    }
    fn put_audit(
        &mut self,
        index: u64,
        record: &AuditRecord,
        source_no: Option<u64>,
    ) -> Result<(), StoreError> {
        (**self).put_audit(index, record, source_no)
    }
    fn index_audit_key(&mut self, index: u64, key: &[u8; 32]) -> Result<(), StoreError> {
        (**self).index_audit_key(index, key)
    }
    fn index_audit_source(&mut self, row: SourceRow) -> Result<(), StoreError> {
        (**self).index_audit_source(row)
    }
    fn merge_indexes(&mut self, meta: &Meta, budget: u64) -> Result<u64, StoreError> {
        (**self).merge_indexes(meta, budget)
    }
    fn remove_audit(&mut self, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        (**self).remove_audit(range)
    }
    fn quarantined(&mut self, id: u64) -> Result<Option<QuarantineRecord>, StoreError> {
        (**self).quarantined(id)
    }
    fn put_quarantined(&mut self, id: u64, record: &QuarantineRecord) -> Result<(), StoreError> {
        (**self).put_quarantined(id, record)
    }
    fn remove_quarantined(&mut self, id: u64) -> Result<(), StoreError> {
        (**self).remove_quarantined(id)
    }
    fn quarantine_len(&mut self) -> Result<u64, StoreError> {
        (**self).quarantine_len()
    }
    fn fingerprint_owner(&mut self, fp: &[u8; 32]) -> Result<Option<u64>, StoreError> {
        (**self).fingerprint_owner(fp)
    }
    fn put_fingerprint(&mut self, fp: &[u8; 32], id: u64) -> Result<(), StoreError> {
        (**self).put_fingerprint(fp, id)
    }
    fn forget_fingerprint(&mut self, id: u64) -> Result<(), StoreError> {
        (**self).forget_fingerprint(id)
    }
    fn lowest_cursor(&mut self, stream: Stream, floor: u64) -> Result<Option<u64>, StoreError> {
        (**self).lowest_cursor(stream, floor)
    }
    fn ledger(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, LedgerRecord)>, StoreError> {
        (**self).ledger(name, range)
    }
    fn put_ledger(
        &mut self,
        name: &str,
        seq: u64,
        record: &LedgerRecord,
    ) -> Result<(), StoreError> {
        (**self).put_ledger(name, seq, record)
    }
    fn remove_ledger(&mut self, name: &str, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        (**self).remove_ledger(name, range)
    }
    fn sink_cursor(&mut self, name: &str) -> Result<Option<SinkRecord>, StoreError> {
        (**self).sink_cursor(name)
    }
    fn put_sink_cursor(&mut self, name: &str, record: &SinkRecord) -> Result<(), StoreError> {
        (**self).put_sink_cursor(name, record)
    }
    fn remove_sink_cursor(&mut self, name: &str) -> Result<Option<SinkRecord>, StoreError> {
        (**self).remove_sink_cursor(name)
    }
    fn remove_parked(&mut self, name: &str, range: RangeInclusive<u64>) -> Result<u64, StoreError> {
        (**self).remove_parked(name, range)
    }
    fn claim_sink(&mut self, name: &str) -> Result<(), StoreError> {
        (**self).claim_sink(name)
    }
    fn sink_idle(&mut self, name: &str) -> Result<(), StoreError> {
        (**self).sink_idle(name)
    }
}

/// Appends sequence `q` (at or above every one before it) to the sorted ranges `out`,
/// extending the last range when `q` touches it.
pub fn push_present(out: &mut Vec<(u64, u64)>, q: u64) {
    match out.last_mut() {
        Some((_, end)) if *end >= q => {}
        Some((_, end)) if *end + 1 == q => *end = q,
        _ => out.push((q, q)),
    }
}
