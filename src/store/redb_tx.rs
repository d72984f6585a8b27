//! The redb backend of `Tx`: the open tables of one redb write transaction, each typed by
//! its record (`tables::Records`), so no caller passes a table's name or decodes bytes itself.

use std::collections::HashSet;
use std::ops::{Range, RangeInclusive};

use redb::{ReadableTable, ReadableTableMetadata, Table, WriteTransaction};

use super::StoreError;
use super::guard::Leak;
use super::index_merge::{self, Mergeable};
use super::tables::*;
use super::tx::{Tx, Visit, WindowKey};

/// The tables of one redb write transaction.
pub struct RedbTx<'t> {
    meta: Table<'t, &'static str, &'static [u8]>,
    source_ids: Table<'t, (&'static str, &'static str), u64>,
    sources: Writable<'t, u64, SourceRecord>,
    window: Writable<'t, (u64, u64, u64), WindowEntry>,
    window_recent: Writable<'t, (u64, u64, u64), WindowEntry>,
    window_gone: Table<'t, (u64, u64, u64), ()>,
    effects: Writable<'t, u64, EffectRecord>,
    audit: Writable<'t, u64, AuditRecord>,
    audit_keys: Table<'t, (u64, u64), ()>,
    audit_sources: Table<'t, (u64, u64), (u64, u64)>,
    audit_keys_packed: Table<'t, (u64, u64), &'static [u8]>,
    audit_sources_packed: Table<'t, (u64, u64), &'static [u8]>,
    quarantine: Writable<'t, u64, QuarantineRecord>,
    quarantine_fp: Table<'t, &'static [u8; 32], u64>,
    quarantine_fp_by_id: Table<'t, u64, &'static [u8; 32]>,
    sink_cursors: Writable<'t, &'static str, SinkRecord>,
    sink_parked: Writable<'t, (&'static str, u64), ParkedRecord>,
    sink_ledger: Writable<'t, (&'static str, u64), LedgerRecord>,
    /// Reused encoding buffer (one allocation per batch, not per record).
    buf: Vec<u8>,
    /// `WINDOW_RECENT`'s size that moves it into `WINDOW`.
    merge_at: u64,
    /// Blocks per merged segment of the audit indexes, if this transaction writes the first
    /// `INDEX_MERGE` record.
    segment_blocks: u64,
    /// The sources whose new window entries this transaction writes straight into `WINDOW`
    /// (at most `direct_cap`; see `put_window`).
    direct: Vec<u64>,
    direct_cap: usize,
    /// The sources this transaction put a window entry of through `WINDOW_RECENT`.
    via_recent: HashSet<u64>,
    /// The audit index rows of the entries this transaction appended, not yet inserted:
    /// `flush_index_rows` inserts them in key order (before anything reads or removes index
    /// rows, and at `merge_indexes`, which every writer's `finish` calls).
    pending_keys: Vec<(u64, u64)>,
    pending_sources: Vec<SourceRow>,
    /// The offset and digest of the last effect this transaction wrote: a window entry for
    /// it leaves the digest to the effect record (`WindowEntry`).
    last_effect: Option<(u64, [u8; 32])>,
    /// `Meta::window_start` as this transaction has moved it (`evict_window`): an entry of
    /// an effect below it is not in the window.
    window_start: u64,
    /// `Meta::window_purged`: the entries of the effects in `window_purged..window_start`
    /// are still in the window's tables, deleted at the next merge.
    window_purged: u64,
    /// How many entries `WINDOW_RECENT` and `WINDOW_GONE` hold (their lengths at open,
    /// kept as they change, so a put reads neither length).
    recent_len: u64,
    gone_len: u64,
}

/// How many sources' new window entries one transaction writes straight into `WINDOW`
/// rather than into `WINDOW_RECENT` (from each one's second entry in the transaction on, or
/// its first when the batch names it more than once: `several_window_entries`, `put_window`): each costs
/// one copied page at that source's end of the window per commit,
/// and saves its entries the later move (an insert each). A batch of a few dozen sources
/// sends all but one entry per source straight in; one of a thousand sources with an entry
/// each sends all through the small table, as before; a commit copies at most this many of
/// the window's leaf pages for it.
pub const DIRECT_SOURCES: usize = 64;

impl<'t> RedbTx<'t> {
    /// Inserts the pending audit index rows, each index's in key order: a transaction's
    /// rows land in few leaves of the current block, and in order each leaf is visited once.
    fn flush_index_rows(&mut self) -> Result<(), StoreError> {
        self.pending_keys.sort_unstable();
        for row in self.pending_keys.drain(..) {
            self.audit_keys.insert(row, ()).map_err(redb)?;
        }
        let mut sources = std::mem::take(&mut self.pending_sources);
        sources.sort_unstable();
        for row in sources.drain(..) {
            self.index_audit_source(row)?;
        }
        self.pending_sources = sources;
        Ok(())
    }

    pub fn open(txn: &'t WriteTransaction) -> Result<RedbTx<'t>, StoreError> {
        // Each table is a `Leak` until the `RedbTx` (itself held in one) owns it: a redb
        // panic must not run their destructors (see `guard`).
        let open = |e| StoreError::redb(e);
        let meta = Leak::new(txn.open_table(META_TABLE).map_err(open)?);
        let source_ids = Leak::new(txn.open_table(SOURCE_IDS).map_err(open)?);
        let sources = Leak::new(SOURCES.open_mut(txn)?);
        let window = Leak::new(WINDOW.open_mut(txn)?);
        let window_recent = Leak::new(WINDOW_RECENT.open_mut(txn)?);
        let window_gone = Leak::new(txn.open_table(WINDOW_GONE).map_err(open)?);
        let effects = Leak::new(EFFECTS.open_mut(txn)?);
        let audit = Leak::new(AUDIT.open_mut(txn)?);
        let audit_keys = Leak::new(txn.open_table(AUDIT_KEYS).map_err(open)?);
        let audit_sources = Leak::new(txn.open_table(AUDIT_SOURCES).map_err(open)?);
        let audit_keys_packed = Leak::new(txn.open_table(AUDIT_KEYS_PACKED).map_err(open)?);
        let audit_sources_packed = Leak::new(txn.open_table(AUDIT_SOURCES_PACKED).map_err(open)?);
        let quarantine = Leak::new(QUARANTINE.open_mut(txn)?);
        let quarantine_fp = Leak::new(txn.open_table(QUARANTINE_FP).map_err(open)?);
        let quarantine_fp_by_id = Leak::new(txn.open_table(QUARANTINE_FP_BY_ID).map_err(open)?);
        let sink_cursors = Leak::new(SINK_CURSORS.open_mut(txn)?);
        let sink_parked = Leak::new(SINK_PARKED.open_mut(txn)?);
        let sink_ledger = Leak::new(SINK_LEDGER.open_mut(txn)?);
        // A store being created has no meta record yet.
        let (window_start, window_purged) = META.get(&*meta)?.map_or((0, 0), |m| {
            (m.window_start, m.window_purged.min(m.window_start))
        });
        let recent_len = window_recent.len().map_err(redb)?;
        let gone_len = window_gone.len().map_err(redb)?;
        Ok(RedbTx {
            meta: meta.into_inner(),
            source_ids: source_ids.into_inner(),
            sources: sources.into_inner(),
            window: window.into_inner(),
            window_recent: window_recent.into_inner(),
            window_gone: window_gone.into_inner(),
            effects: effects.into_inner(),
            audit: audit.into_inner(),
            audit_keys: audit_keys.into_inner(),
            audit_sources: audit_sources.into_inner(),
            audit_keys_packed: audit_keys_packed.into_inner(),
            audit_sources_packed: audit_sources_packed.into_inner(),
            quarantine: quarantine.into_inner(),
            quarantine_fp: quarantine_fp.into_inner(),
            quarantine_fp_by_id: quarantine_fp_by_id.into_inner(),
            sink_cursors: sink_cursors.into_inner(),
            sink_parked: sink_parked.into_inner(),
            sink_ledger: sink_ledger.into_inner(),
            buf: Vec::with_capacity(1024),
            merge_at: WINDOW_MERGE_AT,
            segment_blocks: SEGMENT_BLOCKS,
            direct: Vec::new(),
            direct_cap: DIRECT_SOURCES,
            via_recent: HashSet::new(),
            pending_keys: Vec::new(),
            pending_sources: Vec::new(),
            last_effect: None,
            window_start,
            window_purged,
            recent_len,
            gone_len,
        })
    }

    /// Moves `WINDOW_RECENT` into `WINDOW` once it holds `n` entries instead of
    /// `WINDOW_MERGE_AT` (`StoreOptions::window_merge_at`).
    pub fn merging_at(mut self, n: u64) -> Self {
        self.merge_at = n.max(1);
        self
    }

    /// Writes the new window entries of at most `n` sources straight into `WINDOW` instead
    /// of `DIRECT_SOURCES` (`StoreOptions::window_direct_sources`).
    pub fn direct_sources(mut self, n: usize) -> Self {
        self.direct_cap = n;
        self
    }

    /// Merges the audit indexes in segments of `n` blocks instead of `SEGMENT_BLOCKS`, if the
    /// store has no `INDEX_MERGE` record yet (`StoreOptions::index_segment_blocks`).
    pub fn segments_of(mut self, n: u64) -> Self {
        self.segment_blocks = n.max(1);
        self
    }

    fn index_merge(&self) -> Result<IndexMerge, StoreError> {
        Ok(INDEX_MERGE
            .get(&self.meta)?
            .unwrap_or_else(|| IndexMerge::with_blocks(self.segment_blocks)))
    }
}

impl RedbTx<'_> {
    /// `entry` with its digest (its own or its effect's).
    fn resolve(&self, key: WindowKey, entry: WindowEntry) -> Result<WindowRecord, StoreError> {
        entry.resolve(key, |offset| {
            self.effects.digest_or_audited(&self.audit, offset)
        })
    }

    /// Whether `key`'s entry in `WINDOW` has been removed (`WINDOW_GONE`).
    fn gone(&self, key: WindowKey) -> Result<bool, StoreError> {
        Ok(self.window_gone.get(key).map_err(redb)?.is_some())
    }

    /// Whether `entry` is in the window: an entry of an evicted effect is not.
    fn live(&self, entry: &WindowEntry) -> bool {
        in_window(entry, self.window_start)
    }

    /// The sequences of the entries of `table` in `span` (one source's epoch) still in the
    /// window, in order.
    fn live_sequences(
        &self,
        table: &Writable<'_, WindowKey, WindowEntry>,
        span: RangeInclusive<WindowKey>,
    ) -> Result<Vec<u64>, StoreError> {
        let mut out = Vec::new();
        for item in table.range(span)? {
            let (k, entry) = item?;
            if self.live(&entry) {
                out.push(k.value().2);
            }
        }
        Ok(out)
    }

    /// Merges once the two small tables, or the effects evicted since the last merge, number
    /// `merge_at`. Not their sum: a full window evicts one entry per new one, and counting
    /// both would merge twice as often, each merge writing every source's newest and
    /// oldest window pages again.
    fn merge_if_due(&mut self) -> Result<(), StoreError> {
        let evicted = self.window_start - self.window_purged;
        if (self.recent_len + self.gone_len).max(evicted) >= self.merge_at {
            self.merge_recent()?;
        }
        Ok(())
    }

    /// Deletes `WINDOW_GONE`'s positions and the entries of the effects evicted since the
    /// last merge from `WINDOW`, then moves every entry of `WINDOW_RECENT` still in the
    /// window into it, each in key order. In that order: a position removed and put again
    /// keeps its new entry.
    fn merge_recent(&mut self) -> Result<(), StoreError> {
        let mut gone: Vec<WindowKey> = Vec::new();
        for item in ReadableTable::iter(&self.window_gone).map_err(redb)? {
            gone.push(item.map_err(redb)?.0.value());
        }
        self.window_gone.retain(|_, _| false).map_err(redb)?;
        for k in &gone {
            self.window.remove(k).map_err(redb)?;
        }
        self.purge_evicted(false)?;
        let mut moved: Vec<(WindowKey, Vec<u8>)> = Vec::new();
        for item in ReadableTable::iter(&*self.window_recent).map_err(redb)? {
            let (k, v) = item.map_err(redb)?;
            let k = k.value();
            if self.live(&WINDOW_RECENT.decode(&k, v.value())?) {
                moved.push((k, v.value().to_vec()));
            }
        }
        self.window_recent.retain(|_, _| false).map_err(redb)?;
        for (k, v) in &moved {
            self.window.insert(k, v.as_slice()).map_err(redb)?;
        }
        self.recent_len = 0;
        self.gone_len = 0;
        Ok(())
    }

    /// Deletes from `WINDOW` (and from `WINDOW_RECENT` too if `recent`; a merge drops those
    /// itself) the entries of the effects in `window_purged..window_start`, found by their
    /// effects' positions, in key order, and moves `window_purged` up. An entry of the
    /// position that names a later effect still in the window stays. A run of a source's
    /// consecutive sequences (all of a source's evicted positions, on a steady feed) goes in
    /// one ranged delete, which visits each leaf once instead of descending per entry; the
    /// range holds no other position.
    fn purge_evicted(&mut self, recent: bool) -> Result<(), StoreError> {
        if self.window_purged >= self.window_start {
            return Ok(());
        }
        let mut keys: Vec<(WindowKey, u64)> = Vec::new();
        for head in self
            .effects
            .heads::<EffectHead>(self.window_purged..self.window_start)?
        {
            let (offset, h) = head?;
            keys.push(((h.source_no, h.epoch, h.sequence), offset));
        }
        keys.sort_unstable();
        if recent && self.recent_len > 0 {
            for &(k, offset) in &keys {
                if self
                    .window_recent
                    .get(k)?
                    .is_some_and(|e| e.effect_offset == offset)
                {
                    self.window_recent.remove(k).map_err(redb)?;
                    self.recent_len -= 1;
                }
            }
        }
        let start = self.window_start;
        let mut damaged = None;
        for run in keys.chunk_by(|(a, _), (b, _)| (a.0, a.1) == (b.0, b.1) && b.2 - a.2 <= 1) {
            let (first, last) = (run[0].0, run[run.len() - 1].0);
            // Only an entry still in the window stays (one of an evicted effect, this run's or
            // an earlier one's, does not); an entry that does not decode stays, and the purge
            // fails naming it, as a read of it would.
            self.window
                .retain_in(first..=last, |k, v| match WINDOW.decode(&k, v) {
                    Ok(entry) => in_window(&entry, start),
                    Err(e) => {
                        damaged.get_or_insert(e);
                        true
                    }
                })
                .map_err(redb)?;
        }
        if let Some(e) = damaged {
            return Err(e.into());
        }
        self.window_purged = self.window_start;
        Ok(())
    }
}

/// Whether `entry` is in a window that starts at effect `start`: an entry of an evicted
/// effect is not.
fn in_window(entry: &WindowEntry, start: u64) -> bool {
    entry.effect_offset >= start
}

/// The sequences of the keys of `table` in `span` (one source's epoch), in order.
fn sequences<V: redb::Value + 'static>(
    table: &impl ReadableTable<WindowKey, V>,
    span: RangeInclusive<WindowKey>,
) -> Result<Vec<u64>, StoreError> {
    let mut out = Vec::new();
    for item in table.range(span).map_err(redb)? {
        out.push(item.map_err(redb)?.0.value().2);
    }
    Ok(out)
}

fn redb(e: impl Into<redb::Error>) -> StoreError {
    StoreError::redb(e)
}

/// Calls `f` with each entry until it breaks.
fn visit<T>(
    entries: impl Iterator<Item = Result<(u64, T), StoreError>>,
    f: &mut dyn FnMut(u64, T) -> Result<Visit, StoreError>,
) -> Result<(), StoreError> {
    for entry in entries {
        let (k, v) = entry?;
        if f(k, v)?.is_break() {
            break;
        }
    }
    Ok(())
}

impl Tx for RedbTx<'_> {
    /// Its first window entry of the transaction goes straight into `WINDOW` too (while
    /// fewer than `direct_cap` sources do), so the commit copies one page for the source
    /// (its page of `WINDOW`) instead of two (that one and one of `WINDOW_RECENT`).
    fn several_window_entries(&mut self, source_no: u64) {
        if self.direct.len() < self.direct_cap && !self.direct.contains(&source_no) {
            self.direct.push(source_no);
        }
    }

    fn meta(&mut self) -> Result<Meta, StoreError> {
        META.get(&self.meta)?
            .ok_or_else(|| META.missing("missing").into())
    }

    fn counters(&mut self) -> Result<Option<Counters>, StoreError> {
        COUNTS.get(&self.meta)
    }

    fn retention_marks(&mut self) -> Result<Option<RetentionMarks>, StoreError> {
        RETENTION.get(&self.meta)
    }

    fn put_meta(&mut self, meta: &Meta) -> Result<(), StoreError> {
        // The purge mark is this transaction's (a caller holds the meta it read at its start).
        let meta = Meta {
            window_purged: self.window_purged.min(meta.window_start),
            ..meta.clone()
        };
        META.put(&mut self.meta, &meta, &mut self.buf)
    }

    fn put_counters(&mut self, counters: &Counters) -> Result<(), StoreError> {
        COUNTS.put(&mut self.meta, counters, &mut self.buf)
    }

    fn put_retention_marks(&mut self, marks: &RetentionMarks) -> Result<(), StoreError> {
        RETENTION.put(&mut self.meta, marks, &mut self.buf)
    }

    fn upstream_losses(&mut self) -> Result<Option<UpstreamLosses>, StoreError> {
        UPSTREAM.get(&self.meta)
    }

    fn put_upstream_losses(&mut self, record: &UpstreamLosses) -> Result<(), StoreError> {
        UPSTREAM.put(&mut self.meta, record, &mut self.buf)
    }

    fn source_no(&mut self, agency: &str, source_id: &str) -> Result<Option<u64>, StoreError> {
        Ok(self
            .source_ids
            .get((agency, source_id))
            .map_err(redb)?
            .map(|g| g.value()))
    }

    fn put_source_no(&mut self, agency: &str, source_id: &str, no: u64) -> Result<(), StoreError> {
        self.source_ids
            .insert((agency, source_id), no)
            .map_err(redb)?;
        Ok(())
    }

    fn source(&mut self, no: u64) -> Result<Option<SourceRecord>, StoreError> {
        self.sources.get(no)
    }

    fn put_source(&mut self, no: u64, record: &SourceRecord) -> Result<(), StoreError> {
        self.sources.put(no, record, &mut self.buf)?;
        Ok(())
    }

    fn window(&mut self, key: WindowKey) -> Result<Option<WindowRecord>, StoreError> {
        let entry = match self.window_recent.get(key)? {
            Some(w) => Some(w),
            None => match self.window.get(key)? {
                Some(w) if !self.gone(key)? => Some(w),
                _ => None,
            },
        };
        entry
            .filter(|w| self.live(w))
            .map(|w| self.resolve(key, w))
            .transpose()
    }

    fn put_window(&mut self, key: WindowKey, record: &WindowRecord) -> Result<(), StoreError> {
        // A source's first entry in the transaction goes through `WINDOW_RECENT`: one entry
        // does not pay for copying the source's page of `WINDOW`. From its second on, while
        // fewer than `direct_cap` sources do, they go straight into `WINDOW`.
        let source = key.0;
        let entry = WindowEntry {
            effect_offset: record.effect_offset,
            digest: match self.last_effect {
                Some(last) if last == (record.effect_offset, record.digest) => None,
                _ => Some(record.digest),
            },
        };
        let direct = self.direct.contains(&source)
            || (self.direct.len() < self.direct_cap && self.via_recent.contains(&source) && {
                self.direct.push(source);
                true
            });
        if !direct {
            self.via_recent.insert(source);
            if !self.window_recent.put(key, &entry, &mut self.buf)? {
                self.recent_len += 1;
            }
            return self.merge_if_due();
        }
        // A position removed from `WINDOW` but not yet deleted there (a released conflict's
        // replacement) is in `WINDOW_GONE`: the new entry takes its place, so the position
        // leaves `WINDOW_GONE`, or the next merge would delete it. Never in `WINDOW_RECENT`:
        // `remove_window` takes it out of there before a position is put again.
        self.window.put(key, &entry, &mut self.buf)?;
        if self.gone_len > 0 && self.window_gone.remove(key).map_err(redb)?.is_some() {
            self.gone_len -= 1;
        }
        Ok(())
    }

    fn remove_window(&mut self, key: WindowKey) -> Result<Option<WindowRecord>, StoreError> {
        if let Some(w) = self.window_recent.take(key)? {
            self.recent_len -= 1;
            return Some(w)
                .filter(|w| self.live(w))
                .map(|w| self.resolve(key, w))
                .transpose();
        }
        match self.window.get(key)? {
            Some(w) if self.live(&w) && !self.gone(key)? => {
                let w = self.resolve(key, w)?;
                if self.window_gone.insert(key, ()).map_err(redb)?.is_none() {
                    self.gone_len += 1;
                }
                self.merge_if_due()?;
                Ok(Some(w))
            }
            _ => Ok(None),
        }
    }

    fn evict_window(&mut self, _key: WindowKey, offset: u64) -> Result<(), StoreError> {
        // Nothing is read or written: moving the start takes the entry out of the window
        // (`live`), and the merge deletes it, found from the effect's position.
        self.window_start = self.window_start.max(offset.saturating_add(1));
        self.merge_if_due()
    }

    fn window_present(
        &mut self,
        no: u64,
        epoch: u64,
        seqs: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        let span = (no, epoch, *seqs.start())..=(no, epoch, *seqs.end());
        // `WINDOW` less `WINDOW_GONE`, then `WINDOW_RECENT`, each less the entries of
        // evicted effects: three sorted runs, the last disjoint from the first's remainder.
        let old = self.live_sequences(&self.window, span.clone())?;
        let gone = sequences(&self.window_gone, span.clone())?;
        let new = self.live_sequences(&self.window_recent, span)?;
        let mut g = gone.into_iter().peekable();
        let kept = old.into_iter().filter(|q| {
            while g.next_if(|x| x < q).is_some() {}
            g.peek() != Some(q)
        });
        let mut out = Vec::new();
        let mut new = new.into_iter().peekable();
        for q in kept {
            while let Some(n) = new.next_if(|n| *n < q) {
                super::tx::push_present(&mut out, n);
            }
            super::tx::push_present(&mut out, q);
        }
        for n in new {
            super::tx::push_present(&mut out, n);
        }
        Ok(out)
    }

    fn put_effect(&mut self, offset: u64, record: &EffectRecord) -> Result<(), StoreError> {
        self.effects.put(offset, record, &mut self.buf)?;
        self.last_effect = record.digest.map(|d| (offset, d));
        Ok(())
    }

    fn scan_effect_heads(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, EffectHead) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        visit(self.effects.heads(range)?, f)
    }

    fn remove_effects(&mut self, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        // The purge finds an evicted effect's entry from the effect: first, while it is here.
        if *range.end() >= self.window_purged {
            self.purge_evicted(true)?;
        }
        self.effects.retain_in(range, |_, _| false).map_err(redb)?;
        Ok(())
    }

    fn audit(&mut self, index: u64) -> Result<Option<AuditRecord>, StoreError> {
        self.audit.get(index)
    }

    fn put_audit(
        &mut self,
        index: u64,
        record: &AuditRecord,
        source_no: Option<u64>,
    ) -> Result<(), StoreError> {
        self.audit.put(index, record, &mut self.buf)?;
        if let Some(key) = &record.key {
            self.pending_keys
                .push((audit_key_bucket(index, key), index));
        }
        if let Some(row) = audit_source_row(index, record, source_no) {
            self.pending_sources.push(row);
        }
        Ok(())
    }

    fn index_audit_source(&mut self, row: SourceRow) -> Result<(), StoreError> {
        self.audit_sources.insert(row.0, row.1).map_err(redb)?;
        Ok(())
    }

    fn index_audit_key(&mut self, index: u64, key: &[u8; 32]) -> Result<(), StoreError> {
        self.audit_keys
            .insert((audit_key_bucket(index, key), index), ())
            .map_err(redb)?;
        Ok(())
    }

    fn merge_indexes(&mut self, meta: &Meta, budget: u64) -> Result<u64, StoreError> {
        self.flush_index_rows()?;
        let stored = INDEX_MERGE.get(&self.meta)?;
        let mut merge = stored.unwrap_or_else(|| IndexMerge::with_blocks(self.segment_blocks));
        let first = meta.audit_anchor.map_or(0, |(i, _)| i + 1);
        let span = Mergeable::of(&merge, first, meta.next_audit);
        let k = merge.blocks;
        let moved = index_merge::merge_rows(
            &mut self.audit_keys,
            &mut self.audit_keys_packed,
            &mut merge.keys,
            k,
            span,
            budget,
        )? + index_merge::merge_rows(
            &mut self.audit_sources,
            &mut self.audit_sources_packed,
            &mut merge.sources,
            k,
            span,
            budget,
        )?;
        if stored != Some(merge) {
            INDEX_MERGE.put(&mut self.meta, &merge, &mut self.buf)?;
        }
        Ok(moved)
    }

    fn scan_audit(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, AuditRecord) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        visit(self.audit.range(range)?.map(by_offset), f)
    }

    fn scan_audit_heads(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, AuditHead) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        visit(self.audit.heads(range)?, f)
    }

    fn remove_audit(&mut self, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        self.flush_index_rows()?;
        // The first entry kept may leave its `prev_hash` to the last one removed: it is read
        // (with that hash) while that one is here, and stored again holding its hashes.
        let first_kept = range.end().saturating_add(1);
        if let Some(kept) = self.audit.get(first_kept)? {
            self.audit.put(first_kept, &kept, &mut self.buf)?;
        }
        // From the block `range` starts in: the entries before it are gone already.
        let blocks = whole_blocks(&(block_floor(*range.start())..=*range.end()));
        // Every merged segment that ends within: from 0, which also takes what retention by
        // a build before the merge (still running when this one upgraded the file) left.
        let n = self.index_merge()?.segment_entries();
        let segments = 0..(range.end().saturating_add(1) / n);
        index_merge::remove_segments(
            &mut self.audit_keys,
            &mut self.audit_keys_packed,
            segments.clone(),
        )?;
        index_merge::remove_segments(
            &mut self.audit_sources,
            &mut self.audit_sources_packed,
            segments,
        )?;
        self.audit.retain_in(range, |_, _| false).map_err(redb)?;
        if !blocks.is_empty() {
            let (lo, hi) = (
                audit_key_block_start(blocks.start),
                audit_key_block_start(blocks.end),
            );
            self.audit_keys
                .retain_in((lo, 0)..(hi, 0), |_, ()| false)
                .map_err(redb)?;
            for r in audit_source_ranges(&blocks) {
                self.audit_sources
                    .retain_in((r.start, 0)..(r.end, 0), |_, _| false)
                    .map_err(redb)?;
            }
        }
        Ok(())
    }

    fn quarantined(&mut self, id: u64) -> Result<Option<QuarantineRecord>, StoreError> {
        self.quarantine.get(id)
    }

    fn put_quarantined(&mut self, id: u64, record: &QuarantineRecord) -> Result<(), StoreError> {
        self.quarantine.put(id, record, &mut self.buf)?;
        Ok(())
    }

    fn remove_quarantined(&mut self, id: u64) -> Result<(), StoreError> {
        self.quarantine.remove(id).map_err(redb)?;
        Ok(())
    }

    fn quarantine_len(&mut self) -> Result<u64, StoreError> {
        self.quarantine.len().map_err(redb)
    }

    fn scan_quarantine(
        &mut self,
        from: u64,
        f: &mut dyn FnMut(u64, QuarantineRecord) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        visit(self.quarantine.range(from..)?.map(by_offset), f)
    }

    fn fingerprint_owner(&mut self, fp: &[u8; 32]) -> Result<Option<u64>, StoreError> {
        Ok(self.quarantine_fp.get(fp).map_err(redb)?.map(|g| g.value()))
    }

    fn put_fingerprint(&mut self, fp: &[u8; 32], id: u64) -> Result<(), StoreError> {
        self.quarantine_fp.insert(fp, id).map_err(redb)?;
        self.quarantine_fp_by_id.insert(id, fp).map_err(redb)?;
        Ok(())
    }

    fn forget_fingerprint(&mut self, id: u64) -> Result<(), StoreError> {
        let fp = self
            .quarantine_fp_by_id
            .remove(id)
            .map_err(redb)?
            .map(|g| *g.value());
        if let Some(fp) = fp
            && self.fingerprint_owner(&fp)? == Some(id)
        {
            self.quarantine_fp.remove(&fp).map_err(redb)?;
        }
        Ok(())
    }

    fn lowest_cursor(&mut self, stream: Stream, floor: u64) -> Result<Option<u64>, StoreError> {
        super::relay::lowest_needed(&self.sink_cursors, &self.sink_parked, stream, floor)
    }

    fn ledger(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, LedgerRecord)>, StoreError> {
        let (lo, hi) = range.into_inner();
        self.sink_ledger
            .range((name, lo)..=(name, hi))?
            .map(|entry| entry.map(|(k, record)| (k.value().1, record)))
            .collect()
    }

    fn put_ledger(
        &mut self,
        name: &str,
        seq: u64,
        record: &LedgerRecord,
    ) -> Result<(), StoreError> {
        self.sink_ledger.put((name, seq), record, &mut self.buf)?;
        Ok(())
    }

    fn remove_ledger(&mut self, name: &str, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        let (lo, hi) = range.into_inner();
        self.sink_ledger
            .retain_in((name, lo)..=(name, hi), |_, _| false)
            .map_err(redb)
    }

    fn sink_cursor(&mut self, name: &str) -> Result<Option<SinkRecord>, StoreError> {
        self.sink_cursors.get(name)
    }

    fn put_sink_cursor(&mut self, name: &str, record: &SinkRecord) -> Result<(), StoreError> {
        self.sink_cursors.put(name, record, &mut self.buf)?;
        Ok(())
    }

    fn remove_sink_cursor(&mut self, name: &str) -> Result<Option<SinkRecord>, StoreError> {
        self.sink_cursors.take(name)
    }

    fn parked(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, ParkedRecord)>, StoreError> {
        let (lo, hi) = range.into_inner();
        self.sink_parked
            .range((name, lo)..=(name, hi))?
            .map(|entry| entry.map(|(k, record)| (k.value().1, record)))
            .collect()
    }

    fn put_parked(
        &mut self,
        name: &str,
        offset: u64,
        record: &ParkedRecord,
    ) -> Result<bool, StoreError> {
        let was = self
            .sink_parked
            .put((name, offset), record, &mut self.buf)?;
        Ok(!was)
    }

    fn remove_parked(&mut self, name: &str, range: RangeInclusive<u64>) -> Result<u64, StoreError> {
        let (lo, hi) = range.into_inner();
        let mut removed = 0;
        self.sink_parked
            .retain_in((name, lo)..=(name, hi), |_, _| {
                removed += 1;
                false
            })
            .map_err(redb)?;
        Ok(removed)
    }
}

/// An entry of a `u64`-keyed table as (key, record).
fn by_offset<R>(entry: Entry<'_, u64, R>) -> Result<(u64, R), StoreError> {
    entry.map(|(k, record)| (k.value(), record))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset: u64) -> WindowRecord {
        WindowRecord {
            digest: [offset as u8; 32],
            effect_offset: offset,
        }
    }

    /// A window entry of the effect just written leaves the digest to it (in either window
    /// table, across the move), and reads back with it; any other entry keeps its own.
    #[test]
    fn a_window_entry_of_the_effect_just_written_leaves_its_digest_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("w.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut tx = RedbTx::open(&txn).unwrap().merging_at(4).direct_sources(0);
            let effect = |offset: u64, digest: Option<[u8; 32]>| EffectRecord {
                source_no: 1,
                sequence: offset,
                digest,
                ..EffectRecord::default()
            };
            let stored = |tx: &RedbTx<'_>, q: u64| {
                tx.window_recent
                    .get((1, 1, q))
                    .unwrap()
                    .or_else(|| tx.window.get((1, 1, q)).unwrap())
                    .unwrap()
            };
            for q in [1, 2] {
                tx.put_effect(q, &effect(q, Some([q as u8; 32]))).unwrap();
                tx.put_window((1, 1, q), &entry(q)).unwrap();
                assert_eq!(stored(&tx, q).digest, None, "{q}");
                assert_eq!(tx.window((1, 1, q)).unwrap(), Some(entry(q)));
            }
            // Another digest than the effect's, an effect without one (an older record), and
            // an entry of an earlier effect (eviction's put-back): each keeps its own.
            tx.put_effect(3, &effect(3, Some([9; 32]))).unwrap();
            tx.put_window((1, 1, 3), &entry(3)).unwrap();
            tx.put_effect(4, &effect(4, None)).unwrap();
            tx.put_window((1, 1, 4), &entry(4)).unwrap();
            tx.put_window((1, 1, 5), &entry(1)).unwrap();
            for (q, offset) in [(3, 3), (4, 4), (5, 1)] {
                assert_eq!(stored(&tx, q).digest, Some([offset as u8; 32]), "{q}");
                assert_eq!(tx.window((1, 1, q)).unwrap(), Some(entry(offset)));
            }
            // The first four moved into WINDOW at the fourth: still read with the effect's
            // digest, and a removal returns it too.
            assert_eq!(tx.window_recent.len().unwrap(), 1);
            assert_eq!(tx.window.len().unwrap(), 4);
            assert_eq!(tx.remove_window((1, 1, 1)).unwrap(), Some(entry(1)));
            assert_eq!(tx.window((1, 1, 2)).unwrap(), Some(entry(2)));
            // An entry whose effect is gone (damage): an error, not a guess.
            tx.effects.remove(2).unwrap();
            let err = tx.window((1, 1, 2)).unwrap_err().to_string();
            assert!(err.contains("effect 2"), "{err}");
        }
        drop(txn);
    }

    /// Eviction moves the window's start and reads or writes no window table: an entry of
    /// an effect below the start is out of the window at once, in either table, and the
    /// merge deletes it, found from its effect; an entry a later effect of the position holds
    /// (a released message's) stays. Retention's removal of effects deletes their entries
    /// first, and the meta record carries the purge mark.
    #[test]
    fn eviction_takes_entries_out_at_once_and_the_merge_deletes_them() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("w.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut tx = RedbTx::open(&txn)
                .unwrap()
                .merging_at(100)
                .direct_sources(0);
            let effect = |offset: u64, q: u64| EffectRecord {
                source_no: 1,
                epoch: 1,
                sequence: q,
                digest: Some([offset as u8; 32]),
                ..EffectRecord::default()
            };
            let write = |tx: &mut RedbTx<'_>, offset: u64, q: u64| {
                tx.put_effect(offset, &effect(offset, q)).unwrap();
                tx.put_window((1, 1, q), &entry(offset)).unwrap();
            };
            let stored = |tx: &RedbTx<'_>| -> Vec<u64> {
                let keys = |t: &Writable<'_, WindowKey, WindowEntry>| -> Vec<u64> {
                    t.all().unwrap().map(|e| e.unwrap().0.value().2).collect()
                };
                let mut all = keys(&tx.window);
                all.extend(keys(&tx.window_recent));
                all
            };
            for q in 0..5 {
                write(&mut tx, q, q);
            }
            tx.merge_recent().unwrap();
            // A release replaces position 2's entry with effect 5's (through WINDOW_RECENT);
            // effect 6 stays recent.
            assert_eq!(tx.remove_window((1, 1, 2)).unwrap(), Some(entry(2)));
            write(&mut tx, 5, 2);
            write(&mut tx, 6, 6);
            for offset in 0..3 {
                tx.evict_window((1, 1, offset), offset).unwrap();
            }
            assert_eq!(tx.window((1, 1, 0)).unwrap(), None);
            assert_eq!(tx.window((1, 1, 1)).unwrap(), None);
            assert_eq!(tx.window((1, 1, 2)).unwrap(), Some(entry(5)));
            assert_eq!(tx.window((1, 1, 3)).unwrap(), Some(entry(3)));
            assert_eq!(tx.window_present(1, 1, 0..=9).unwrap(), [(2, 4), (6, 6)]);
            assert_eq!(stored(&tx), [0, 1, 2, 3, 4, 2, 6], "nothing deleted yet");
            tx.merge_recent().unwrap();
            assert_eq!(stored(&tx), [2, 3, 4, 6]);
            assert_eq!(tx.window_purged, 3);
            assert_eq!(tx.window((1, 1, 2)).unwrap(), Some(entry(5)));
            assert_eq!(tx.window_present(1, 1, 0..=9).unwrap(), [(2, 4), (6, 6)]);

            // Everything evicted, effect 7's entry while still recent.
            write(&mut tx, 7, 7);
            for (offset, q) in [(3, 3), (4, 4), (5, 2), (6, 6), (7, 7)] {
                tx.evict_window((1, 1, q), offset).unwrap();
            }
            assert_eq!(tx.window_present(1, 1, 0..=9).unwrap(), []);
            for q in 0..=7 {
                assert_eq!(tx.window((1, 1, q)).unwrap(), None, "{q}");
            }
            // Retention removes the effects: their entries go first, from both tables.
            tx.remove_effects(0..=7).unwrap();
            assert_eq!(stored(&tx), Vec::<u64>::new());
            assert_eq!(tx.window_purged, 8);
            assert_eq!(tx.recent_len, 0);
            // A merge drops a recent entry of an evicted effect without moving it.
            write(&mut tx, 8, 8);
            write(&mut tx, 9, 9);
            tx.evict_window((1, 1, 8), 8).unwrap();
            tx.merge_recent().unwrap();
            assert_eq!(stored(&tx), [9]);
            tx.put_meta(&Meta {
                window_start: 9,
                ..Meta::new(0)
            })
            .unwrap();
        }
        txn.commit().unwrap();
        let txn = db.begin_write().unwrap();
        let tx = RedbTx::open(&txn).unwrap();
        assert_eq!((tx.window_start, tx.window_purged), (9, 9));
        // A caller's meta read before a purge does not move the mark back, nor past its start.
        let mut tx = tx;
        tx.window_purged = 5;
        tx.put_meta(&Meta {
            window_start: 9,
            window_purged: 0,
            ..Meta::new(0)
        })
        .unwrap();
        assert_eq!(META.get(&tx.meta).unwrap().unwrap().window_purged, 5);
        drop(tx);
        drop(txn);
    }

    /// The merge deletes a source's evicted positions a run of consecutive sequences at a
    /// time, and keeps an entry inside a run that a later effect of its position holds; it
    /// is due when the small tables or the evicted effects alone reach the mark, not their sum.
    #[test]
    fn the_merge_deletes_evicted_runs_and_keeps_a_replaced_entry_inside_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("w.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut tx = RedbTx::open(&txn).unwrap().merging_at(4).direct_sources(0);
            let write = |tx: &mut RedbTx<'_>, offset: u64, source: u64, q: u64| {
                let effect = EffectRecord {
                    source_no: source,
                    epoch: 1,
                    sequence: q,
                    digest: Some([offset as u8; 32]),
                    ..EffectRecord::default()
                };
                tx.put_effect(offset, &effect).unwrap();
                tx.put_window((source, 1, q), &entry(offset)).unwrap();
            };
            let stored = |tx: &RedbTx<'_>| -> Vec<(u64, u64, u64)> {
                let mut all: Vec<_> = [&tx.window, &tx.window_recent]
                    .iter()
                    .flat_map(|t| {
                        t.all()
                            .unwrap()
                            .map(|e| {
                                let (k, v) = e.unwrap();
                                let (s, _, q) = k.value();
                                (s, q, v.effect_offset)
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                all.sort_unstable();
                all
            };
            // Source 1 positions 1, 2 and 3, source 2 position 1: the fourth entry merges;
            // source 1 position 5 stays recent.
            for (offset, source, q) in [(0, 1, 1), (1, 2, 1), (2, 1, 2), (3, 1, 3), (4, 1, 5)] {
                write(&mut tx, offset, source, q);
            }
            assert_eq!((tx.window.len().unwrap(), tx.recent_len), (4, 1));
            // A release replaces position 2 with effect 5, and a merge puts the replacement
            // in WINDOW, where the purge below meets it inside a run of evicted positions.
            assert_eq!(tx.remove_window((1, 1, 2)).unwrap(), Some(entry(2)));
            write(&mut tx, 5, 1, 2);
            tx.merge_recent().unwrap();
            assert_eq!(
                stored(&tx),
                [(1, 1, 0), (1, 2, 5), (1, 3, 3), (1, 5, 4), (2, 1, 1)]
            );
            // Three in the small tables and three evicted: not due (the sum would be 6).
            for (offset, q) in [(6, 1), (7, 2), (8, 3)] {
                write(&mut tx, offset, 3, q);
            }
            for (offset, key) in [(0, (1, 1, 1)), (1, (2, 1, 1)), (2, (1, 1, 2))] {
                tx.evict_window(key, offset).unwrap();
            }
            assert_eq!((tx.window_purged, tx.recent_len), (0, 3));
            // The fourth evicted effect is due: source 1's run 1..=3 loses 1 and 3 but keeps
            // 2 (effect 5's, still in the window), source 2's run loses its one position, and
            // source 3's entries move in.
            tx.evict_window((1, 1, 3), 3).unwrap();
            assert_eq!((tx.window_purged, tx.recent_len, tx.gone_len), (4, 0, 0));
            assert_eq!(
                stored(&tx),
                [(1, 2, 5), (1, 5, 4), (3, 1, 6), (3, 2, 7), (3, 3, 8)]
            );
            assert_eq!(tx.window((1, 1, 2)).unwrap(), Some(entry(5)));
            assert_eq!(tx.window_present(1, 1, 0..=9).unwrap(), [(2, 2), (5, 5)]);
        }
        drop(txn);
    }

    /// Entries in both window tables read as one: lookups, removals and the present ranges
    /// `upstream` confirms gaps with, before and after the move into `WINDOW`.
    #[test]
    fn the_two_window_tables_read_as_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("w.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut tx = RedbTx::open(&txn).unwrap().merging_at(5).direct_sources(0);
            let present = |tx: &mut RedbTx<'_>| tx.window_present(1, 1, 0..=10).unwrap();
            // The fifth entry moves all five into WINDOW; 9 and another source's stay recent.
            for q in [1, 3, 5, 7, 2] {
                tx.put_window((1, 1, q), &entry(q)).unwrap();
            }
            tx.put_window((1, 1, 9), &entry(9)).unwrap();
            tx.put_window((2, 1, 4), &entry(40)).unwrap();
            assert_eq!(tx.window.len().unwrap(), 5);
            assert_eq!(tx.window_recent.len().unwrap(), 2);
            for q in [1, 2, 3, 5, 7, 9] {
                assert_eq!(tx.window((1, 1, q)).unwrap(), Some(entry(q)), "{q}");
            }
            assert_eq!(tx.window((1, 1, 4)).unwrap(), None);
            assert_eq!(present(&mut tx), [(1, 3), (5, 5), (7, 7), (9, 9)]);
            assert_eq!(tx.window_present(1, 1, 4..=4).unwrap(), []);

            // A removal finds the entry in either table, once: from WINDOW_RECENT it is
            // deleted, in WINDOW it is marked gone until the next move.
            assert_eq!(tx.remove_window((1, 1, 3)).unwrap(), Some(entry(3)));
            assert_eq!(tx.remove_window((1, 1, 3)).unwrap(), None);
            assert_eq!(tx.remove_window((1, 1, 9)).unwrap(), Some(entry(9)));
            assert_eq!(tx.remove_window((1, 1, 9)).unwrap(), None);
            assert_eq!(tx.window.len().unwrap(), 5);
            assert_eq!(tx.window_gone.len().unwrap(), 1);
            assert_eq!(tx.window((1, 1, 3)).unwrap(), None);
            assert_eq!(present(&mut tx), [(1, 2), (5, 5), (7, 7)]);

            // Put back after a removal (eviction's and a release's path): the new entry is
            // read at once, and survives the move (which deletes the gone position first).
            tx.put_window((1, 1, 3), &entry(33)).unwrap();
            assert_eq!(tx.window((1, 1, 3)).unwrap(), Some(entry(33)));
            assert_eq!(present(&mut tx), [(1, 3), (5, 5), (7, 7)]);
            tx.put_window((1, 1, 8), &entry(8)).unwrap();
            tx.put_window((1, 1, 10), &entry(10)).unwrap();
            assert_eq!(tx.window_gone.len().unwrap(), 0);
            assert_eq!(tx.window_recent.len().unwrap(), 0);
            assert_eq!(tx.window.len().unwrap(), 8);
            assert_eq!(tx.window((1, 1, 3)).unwrap(), Some(entry(33)));
            assert_eq!(tx.window((2, 1, 4)).unwrap(), Some(entry(40)));
            assert_eq!(present(&mut tx), [(1, 3), (5, 5), (7, 8), (10, 10)]);
        }
        txn.commit().unwrap();
    }

    /// A source the batch names more than once (`Tx::several_window_entries`) has its first
    /// entry of the transaction written straight into `WINDOW` too; other sources, and
    /// sources past `direct_cap`, start through `WINDOW_RECENT` as before.
    #[test]
    fn a_source_the_batch_names_twice_skips_the_small_window_table_from_its_first_entry() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("w.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut tx = RedbTx::open(&txn).unwrap().direct_sources(2);
            // Hints for sources 1 (twice), 3 and 4, none for 2: 1 and 3 take the cap of two.
            for no in [1, 1, 3, 4] {
                tx.several_window_entries(no);
            }
            for k in [(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 1)] {
                tx.put_window(k, &entry(k.0 * 10 + k.2)).unwrap();
            }
            assert_eq!(
                tx.window.len().unwrap(),
                2,
                "sources 1's and 3's first entries went straight in"
            );
            assert_eq!(tx.window_recent.len().unwrap(), 2);
            for k in [(1, 1, 2), (3, 1, 2), (4, 1, 2)] {
                tx.put_window(k, &entry(k.0 * 10 + k.2)).unwrap();
            }
            assert_eq!(tx.window.len().unwrap(), 4);
            assert_eq!(
                tx.window_recent.len().unwrap(),
                3,
                "source 4 is past the cap"
            );
            for k in [
                (1, 1, 1),
                (1, 1, 2),
                (2, 1, 1),
                (3, 1, 1),
                (4, 1, 1),
                (4, 1, 2),
            ] {
                assert_eq!(tx.window(k).unwrap(), Some(entry(k.0 * 10 + k.2)), "{k:?}");
            }
        }
        txn.commit().unwrap();
    }

    /// A source's second and later entries of a transaction go straight into `WINDOW` (for
    /// at most `direct_cap` sources), the rest through `WINDOW_RECENT`; both read as one, and
    /// a position removed and put again keeps its new entry across the move, wherever each
    /// of the two writes went.
    #[test]
    fn a_sources_later_entries_of_a_transaction_skip_the_small_window_table() {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::create(dir.path().join("w.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut tx = RedbTx::open(&txn).unwrap().merging_at(6).direct_sources(1);
            // Each source's first entry through WINDOW_RECENT; source 1's second straight
            // into WINDOW; source 2's second through WINDOW_RECENT (one direct source only).
            for k in [(1, 1, 1), (2, 1, 1), (1, 1, 2), (2, 1, 2)] {
                tx.put_window(k, &entry(k.0 * 10 + k.2)).unwrap();
            }
            assert_eq!(tx.window.len().unwrap(), 1);
            assert_eq!(tx.window_recent.len().unwrap(), 3);
            for k in [(1, 1, 1), (1, 1, 2), (2, 1, 1), (2, 1, 2)] {
                assert_eq!(tx.window(k).unwrap(), Some(entry(k.0 * 10 + k.2)), "{k:?}");
            }
            assert_eq!(tx.window_present(1, 1, 0..=5).unwrap(), [(1, 2)]);
            // A release's replacement: removed (marked gone in WINDOW), then put again
            // straight into WINDOW, which takes it out of WINDOW_GONE.
            assert_eq!(tx.remove_window((1, 1, 2)).unwrap(), Some(entry(12)));
            assert_eq!(tx.window_gone.len().unwrap(), 1);
            assert_eq!(tx.window((1, 1, 2)).unwrap(), None);
            tx.put_window((1, 1, 2), &entry(99)).unwrap();
            assert_eq!(tx.window_gone.len().unwrap(), 0);
            assert_eq!(tx.window((1, 1, 2)).unwrap(), Some(entry(99)));
            // Removed from WINDOW_RECENT, put again straight into WINDOW.
            assert_eq!(tx.remove_window((1, 1, 1)).unwrap(), Some(entry(11)));
            tx.put_window((1, 1, 1), &entry(98)).unwrap();
            assert_eq!(tx.window.len().unwrap(), 2);
            assert_eq!(tx.window_present(1, 1, 0..=5).unwrap(), [(1, 2)]);
            // Removed again; the move (six pending entries) deletes it from WINDOW.
            assert_eq!(tx.remove_window((1, 1, 2)).unwrap(), Some(entry(99)));
            for q in 3..=5 {
                tx.put_window((2, 1, q), &entry(20 + q)).unwrap();
            }
            assert_eq!(
                (
                    tx.window_gone.len().unwrap(),
                    tx.window_recent.len().unwrap()
                ),
                (0, 0),
                "moved"
            );
            assert_eq!(tx.window((1, 1, 2)).unwrap(), None);
            assert_eq!(tx.window((1, 1, 1)).unwrap(), Some(entry(98)));
            assert_eq!(tx.window.len().unwrap(), 6);
            assert_eq!(tx.window_present(2, 1, 0..=9).unwrap(), [(1, 5)]);
        }
        txn.commit().unwrap();
        // The next transaction counts again: source 2's second entry goes straight in.
        let txn = db.begin_write().unwrap();
        {
            let mut tx = RedbTx::open(&txn).unwrap().direct_sources(1);
            for k in [(2, 1, 6), (2, 1, 7), (1, 1, 3), (1, 1, 4)] {
                tx.put_window(k, &entry(k.0 * 10 + k.2)).unwrap();
            }
            assert_eq!(tx.window.len().unwrap(), 7);
            assert_eq!(tx.window_recent.len().unwrap(), 3);
            assert_eq!(tx.window_present(2, 1, 0..=9).unwrap(), [(1, 7)]);
        }
        txn.commit().unwrap();
    }
}
