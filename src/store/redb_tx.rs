//! The redb backend of `Tx`: the open tables of one redb write transaction, each typed by
//! its record (`tables::Typed`), so no caller passes a table's name or decodes bytes itself.

use std::ops::{Range, RangeInclusive};

use redb::{ReadableTable, ReadableTableMetadata, Table, WriteTransaction};

use super::StoreError;
use super::guard::Leak;
use super::tables::*;
use super::tx::{Tx, Visit, WindowKey};

/// The tables of one redb write transaction.
pub struct RedbTx<'t> {
    meta: Table<'t, &'static str, &'static [u8]>,
    source_ids: Table<'t, (&'static str, &'static str), u64>,
    sources: Table<'t, u64, &'static [u8]>,
    window: Table<'t, (u64, u64, u64), &'static [u8]>,
    effects: Table<'t, u64, &'static [u8]>,
    audit: Table<'t, u64, &'static [u8]>,
    quarantine: Table<'t, u64, &'static [u8]>,
    quarantine_fp: Table<'t, &'static [u8; 32], u64>,
    quarantine_fp_by_id: Table<'t, u64, &'static [u8; 32]>,
    sink_cursors: Table<'t, &'static str, &'static [u8]>,
    sink_parked: Table<'t, (&'static str, u64), &'static [u8]>,
    /// Reused encoding buffer (one allocation per batch, not per record).
    buf: Vec<u8>,
}

impl<'t> RedbTx<'t> {
    pub fn open(txn: &'t WriteTransaction) -> Result<RedbTx<'t>, StoreError> {
        // Each table is a `Leak` until the `RedbTx` (itself held in one) owns it: a redb
        // panic must not run their destructors (see `guard`).
        let open = |e| StoreError::redb(e);
        let meta = Leak::new(txn.open_table(META).map_err(open)?);
        let source_ids = Leak::new(txn.open_table(SOURCE_IDS).map_err(open)?);
        let sources = Leak::new(txn.open_table(SOURCES).map_err(open)?);
        let window = Leak::new(txn.open_table(WINDOW).map_err(open)?);
        let effects = Leak::new(txn.open_table(EFFECTS).map_err(open)?);
        let audit = Leak::new(txn.open_table(AUDIT).map_err(open)?);
        let quarantine = Leak::new(txn.open_table(QUARANTINE).map_err(open)?);
        let quarantine_fp = Leak::new(txn.open_table(QUARANTINE_FP).map_err(open)?);
        let quarantine_fp_by_id = Leak::new(txn.open_table(QUARANTINE_FP_BY_ID).map_err(open)?);
        let sink_cursors = Leak::new(txn.open_table(SINK_CURSORS).map_err(open)?);
        let sink_parked = Leak::new(txn.open_table(SINK_PARKED).map_err(open)?);
        Ok(RedbTx {
            meta: meta.into_inner(),
            source_ids: source_ids.into_inner(),
            sources: sources.into_inner(),
            window: window.into_inner(),
            effects: effects.into_inner(),
            audit: audit.into_inner(),
            quarantine: quarantine.into_inner(),
            quarantine_fp: quarantine_fp.into_inner(),
            quarantine_fp_by_id: quarantine_fp_by_id.into_inner(),
            sink_cursors: sink_cursors.into_inner(),
            sink_parked: sink_parked.into_inner(),
            buf: Vec::with_capacity(1024),
        })
    }
}

fn redb(e: impl Into<redb::Error>) -> StoreError {
    StoreError::redb(e)
}

/// Gets and decodes the record at `key` of a table whose values are records.
fn get<K, R>(
    t: &impl ReadableTable<K, &'static [u8]>,
    table: &'static str,
    key: K::SelfType<'_>,
    shown: impl std::fmt::Display,
) -> Result<Option<R>, StoreError>
where
    K: redb::Key + 'static,
    R: serde::de::DeserializeOwned,
{
    match t.get(key).map_err(redb)? {
        Some(g) => Ok(Some(decode(table, shown, g.value())?)),
        None => Ok(None),
    }
}

impl Tx for RedbTx<'_> {
    fn meta(&mut self) -> Result<Meta, StoreError> {
        get(&self.meta, "meta", META_KEY, META_KEY)?.ok_or_else(|| {
            StoreError::Record(RecordError {
                table: "meta",
                key: META_KEY.into(),
                why: "missing".into(),
            })
        })
    }

    fn counters(&mut self) -> Result<Option<Counters>, StoreError> {
        get(&self.meta, "meta", COUNTS_KEY, COUNTS_KEY)
    }

    fn retention_marks(&mut self) -> Result<Option<RetentionMarks>, StoreError> {
        get(&self.meta, "meta", RETENTION_KEY, RETENTION_KEY)
    }

    fn put_meta(&mut self, meta: &Meta) -> Result<(), StoreError> {
        self.meta
            .insert(META_KEY, encode_into(meta, &mut self.buf))
            .map_err(redb)?;
        Ok(())
    }

    fn put_counters(&mut self, counters: &Counters) -> Result<(), StoreError> {
        self.meta
            .insert(COUNTS_KEY, encode_into(counters, &mut self.buf))
            .map_err(redb)?;
        Ok(())
    }

    fn put_retention_marks(&mut self, marks: &RetentionMarks) -> Result<(), StoreError> {
        self.meta
            .insert(RETENTION_KEY, encode_into(marks, &mut self.buf))
            .map_err(redb)?;
        Ok(())
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
        get(&self.sources, "sources", no, no)
    }

    fn put_source(&mut self, no: u64, record: &SourceRecord) -> Result<(), StoreError> {
        self.sources
            .insert(no, encode_into(record, &mut self.buf))
            .map_err(redb)?;
        Ok(())
    }

    fn window(&mut self, key: WindowKey) -> Result<Option<WindowRecord>, StoreError> {
        get(&self.window, "window", key, format_args!("{key:?}"))
    }

    fn put_window(&mut self, key: WindowKey, record: &WindowRecord) -> Result<(), StoreError> {
        self.window
            .insert(key, encode_into(record, &mut self.buf))
            .map_err(redb)?;
        Ok(())
    }

    fn remove_window(&mut self, key: WindowKey) -> Result<Option<WindowRecord>, StoreError> {
        let removed = self.window.remove(key).map_err(redb)?;
        match removed {
            Some(g) => Ok(Some(decode("window", format_args!("{key:?}"), g.value())?)),
            None => Ok(None),
        }
    }

    fn put_effect(&mut self, offset: u64, record: &EffectRecord) -> Result<(), StoreError> {
        self.effects
            .insert(offset, encode_into(record, &mut self.buf))
            .map_err(redb)?;
        Ok(())
    }

    fn scan_effect_heads(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, EffectHead) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        for item in self.effects.range(range).map_err(redb)? {
            let (k, v) = item.map_err(redb)?;
            let head = decode_effect_head(k.value(), v.value())?;
            if f(k.value(), head)?.is_break() {
                break;
            }
        }
        Ok(())
    }

    fn remove_effects(&mut self, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        self.effects.retain_in(range, |_, _| false).map_err(redb)?;
        Ok(())
    }

    fn audit(&mut self, index: u64) -> Result<Option<AuditRecord>, StoreError> {
        get(&self.audit, "audit", index, index)
    }

    fn put_audit(&mut self, index: u64, record: &AuditRecord) -> Result<(), StoreError> {
        self.audit
            .insert(index, encode_into(record, &mut self.buf))
            .map_err(redb)?;
        Ok(())
    }

    fn scan_audit(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, AuditRecord) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        for item in self.audit.range(range).map_err(redb)? {
            let (k, v) = item.map_err(redb)?;
            let rec = decode("audit", k.value(), v.value())?;
            if f(k.value(), rec)?.is_break() {
                break;
            }
        }
        Ok(())
    }

    fn scan_audit_heads(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, AuditHead) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        for item in self.audit.range(range).map_err(redb)? {
            let (k, v) = item.map_err(redb)?;
            let head = decode_head::<AuditHead>("audit", k.value(), v.value())?;
            if f(k.value(), head)?.is_break() {
                break;
            }
        }
        Ok(())
    }

    fn remove_audit(&mut self, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        self.audit.retain_in(range, |_, _| false).map_err(redb)?;
        Ok(())
    }

    fn quarantined(&mut self, id: u64) -> Result<Option<QuarantineRecord>, StoreError> {
        get(&self.quarantine, "quarantine", id, id)
    }

    fn put_quarantined(&mut self, id: u64, record: &QuarantineRecord) -> Result<(), StoreError> {
        self.quarantine
            .insert(id, encode_into(record, &mut self.buf))
            .map_err(redb)?;
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
        for item in self.quarantine.range(from..).map_err(redb)? {
            let (k, v) = item.map_err(redb)?;
            let rec = decode("quarantine", k.value(), v.value())?;
            if f(k.value(), rec)?.is_break() {
                break;
            }
        }
        Ok(())
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

    fn lowest_cursor(&mut self) -> Result<Option<u64>, StoreError> {
        super::relay::lowest_cursor(&self.sink_cursors)
    }

    fn sink_cursor(&mut self, name: &str) -> Result<Option<SinkRecord>, StoreError> {
        get(&self.sink_cursors, "sink_cursors", name, name)
    }

    fn put_sink_cursor(&mut self, name: &str, record: &SinkRecord) -> Result<(), StoreError> {
        self.sink_cursors
            .insert(name, encode_into(record, &mut self.buf))
            .map_err(redb)?;
        Ok(())
    }

    fn remove_sink_cursor(&mut self, name: &str) -> Result<Option<SinkRecord>, StoreError> {
        let removed = self.sink_cursors.remove(name).map_err(redb)?;
        match removed {
            Some(g) => Ok(Some(decode("sink_cursors", name, g.value())?)),
            None => Ok(None),
        }
    }

    fn parked(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, ParkedRecord)>, StoreError> {
        let mut out = Vec::new();
        let (lo, hi) = range.into_inner();
        for item in self
            .sink_parked
            .range((name, lo)..=(name, hi))
            .map_err(redb)?
        {
            let (k, v) = item.map_err(redb)?;
            let offset = k.value().1;
            out.push((offset, decode("sink_parked", offset, v.value())?));
        }
        Ok(out)
    }

    fn put_parked(
        &mut self,
        name: &str,
        offset: u64,
        record: &ParkedRecord,
    ) -> Result<bool, StoreError> {
        let was = self
            .sink_parked
            .insert((name, offset), encode_into(record, &mut self.buf))
            .map_err(redb)?;
        Ok(was.is_none())
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
