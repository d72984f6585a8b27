//! `Tx` on PostgreSQL: one transaction (opened and committed by `PgStore`) under the
//! schema's advisory lock. Point reads are cached for the batch (valid: no other member
//! writes while the lock is held); writes are kept in memory and sent as one array statement
//! per table (`flush`), queued on the connection and pipelined in front of the next range
//! scan of that table or the COMMIT. A batch's BEGIN, lock, meta rows, relay cursors and
//! prefetch share one round trip; a batch so costs about half a dozen round trips whatever
//! its size.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hash;
use std::ops::{Range, RangeInclusive};

use super::conn::{Conn, Param};
use super::schema::Sql;
use crate::store::StoreError;
use crate::store::tables::*;
use crate::store::tx::{Tx, Visit, WindowKey};

/// Rows a range scan fetches in its first round trip (eviction and pruning usually stop at
/// the first row or two), doubled for each further one up to `SCAN_CHUNK`.
const SCAN_FIRST: i64 = 8;
/// Rows a range scan fetches per round trip at most.
const SCAN_CHUNK: i64 = 512;

/// `u64` <-> `bigint`, bit for bit.
pub(super) fn db(x: u64) -> i64 {
    x as i64
}
pub(super) fn un(x: i64) -> u64 {
    x as u64
}
/// A range bound: offsets, indices and ids stay below 2^63, so an open end is `i64::MAX`.
pub(super) fn bound(x: u64) -> i64 {
    i64::try_from(x).unwrap_or(i64::MAX)
}

/// `prefetch`'s parameters: the positions' agencies, source ids, epochs and sequences.
fn prefetch_params<'p>(
    positions: &[(&'p str, &'p str, u64, u64)],
) -> (Vec<&'p str>, Vec<&'p str>, Vec<i64>, Vec<i64>) {
    let mut a = Vec::with_capacity(positions.len());
    let mut s = Vec::with_capacity(positions.len());
    let mut e = Vec::with_capacity(positions.len());
    let mut q = Vec::with_capacity(positions.len());
    for (agency, source_id, epoch, sequence) in positions {
        a.push(*agency);
        s.push(*source_id);
        e.push(db(*epoch));
        q.push(db(*sequence));
    }
    (a, s, e, q)
}

/// The lowest position the cursors of `stream` still need (`Tx::lowest_cursor`), from rows of
/// (name, cursor, lowest parked offset at or above the floor).
fn lowest_needed(rows: &[(String, SinkRecord, Option<u64>)], stream: Stream) -> Option<u64> {
    let mut low: Option<u64> = None;
    for (_, rec, first_parked) in rows {
        // A cursor of a stream this build does not know holds both logs.
        if rec.stream().is_some_and(|s| s != stream) {
            continue;
        }
        let needed = first_parked.map_or(rec.next, |p| p.min(rec.next));
        low = Some(low.map_or(needed, |l| l.min(needed)));
    }
    low
}

/// What a chunked scan calls with each row's key and record bytes.
type RowVisitor<'f> = dyn FnMut(u64, &[u8]) -> Result<Visit, StoreError> + 'f;

/// A point table's rows as this transaction sees them: what was read (or found absent) and
/// what was written, with the keys to send at the next flush.
struct Point<K, R> {
    known: HashMap<K, Option<R>>,
    dirty: HashSet<K>,
}

impl<K: Hash + Eq + Clone, R: Clone> Point<K, R> {
    fn new() -> Self {
        Point {
            known: HashMap::new(),
            dirty: HashSet::new(),
        }
    }

    fn get(
        &mut self,
        key: &K,
        load: impl FnOnce() -> Result<Option<R>, StoreError>,
    ) -> Result<Option<R>, StoreError> {
        if let Some(v) = self.known.get(key) {
            return Ok(v.clone());
        }
        let v = load()?;
        self.known.insert(key.clone(), v.clone());
        Ok(v)
    }

    fn set(&mut self, key: K, value: Option<R>) {
        self.dirty.insert(key.clone());
        self.known.insert(key, value);
    }

    /// The written rows since the last flush: (upserts, deletes).
    fn take_dirty(&mut self) -> (Vec<(K, R)>, Vec<K>) {
        let mut up = Vec::new();
        let mut del = Vec::new();
        for k in self.dirty.drain() {
            match self.known.get(&k) {
                Some(Some(r)) => up.push((k, r.clone())),
                _ => del.push(k),
            }
        }
        (up, del)
    }
}

pub struct PgTx<'c> {
    conn: &'c Conn,
    sql: &'c Sql,
    meta: HashMap<String, Vec<u8>>,
    meta_dirty: HashSet<&'static str>,
    source_ids: HashMap<(String, String), Option<u64>>,
    new_source_ids: Vec<(String, String, u64)>,
    sources: Point<u64, SourceRecord>,
    window: Point<WindowKey, WindowRecord>,
    quarantine: Point<u64, QuarantineRecord>,
    fp: Point<[u8; 32], u64>,
    fp_by_id: Point<u64, [u8; 32]>,
    /// Appended, not yet sent (offsets above every stored one).
    new_effects: Vec<(i64, Vec<u8>)>,
    new_audit: BTreeMap<u64, AuditRecord>,
    /// Key index rows of entries written before the index (the schema upgrade), not yet sent.
    new_audit_keys: Vec<(i64, i64)>,
    /// Source index rows (`audit_source_row`) of `new_audit`'s entries, and of entries
    /// written before the index (the schema upgrade), not yet sent.
    new_audit_sources: Vec<SourceRow>,
    /// The relay's cursors with each sink's lowest parked offset, read once per transaction
    /// (dropped when this transaction writes a cursor or a parked event).
    cursors: Option<Vec<(String, SinkRecord, Option<u64>)>>,
    /// The batch's positions were fetched with the meta rows (`begin_batch`).
    prefetched: bool,
}

/// A deferred statement's parameter.
fn param<T: tokio_postgres::types::ToSql + Sync + Send + 'static>(v: T) -> Param {
    Box::new(v)
}

fn decode_col<K: KeyText, R: Record>(
    records: Records<K, R>,
    key: &K::SelfType<'_>,
    bytes: &[u8],
) -> Result<R, StoreError> {
    Ok(records.decode(key, bytes)?)
}

/// The content digest the effect at `offset` holds (or its applying audit entry recorded,
/// `effect_digest_or_audited`): a window entry copied from a redb file may leave its digest
/// there (`WindowEntry::resolve`).
fn effect_digest(conn: &Conn, sql: &Sql, offset: u64) -> Result<Option<[u8; 32]>, StoreError> {
    match conn.query(&sql.effect, &[&db(offset)])?.first() {
        Some(r) => effect_digest_or_audited(offset, r.get::<_, &[u8]>(0), |index| {
            conn.query(&sql.audit, &[&db(index)])?
                .first()
                .map(|a| Ok(AUDIT.decode(&index, a.get::<_, &[u8]>(0))?))
                .transpose()
        }),
        None => Ok(None),
    }
}

impl<'c> PgTx<'c> {
    /// Inside an open transaction that holds the schema's lock: reads the meta rows.
    pub fn begin(conn: &'c Conn, sql: &'c Sql) -> Result<PgTx<'c>, StoreError> {
        let rows = conn.query(&sql.meta_all, &[])?;
        let mut tx = PgTx::empty(conn, sql);
        tx.absorb_meta(rows);
        Ok(tx)
    }

    /// `begin` for a batch: the meta rows, the relay's cursors and the batch's positions
    /// (`Tx::prefetch`) in one round trip, behind the deferred BEGIN and lock.
    pub fn begin_batch(
        conn: &'c Conn,
        sql: &'c Sql,
        positions: &[(&str, &str, u64, u64)],
    ) -> Result<PgTx<'c>, StoreError> {
        let (a, s, e, q) = prefetch_params(positions);
        let mut rows = conn
            .queries(&[
                (&sql.meta_all, &[]),
                (&sql.cursors_needed, &[&0i64]),
                (&sql.prefetch, &[&a, &s, &e, &q]),
            ])?
            .into_iter();
        let mut tx = PgTx::empty(conn, sql);
        tx.absorb_meta(rows.next().unwrap_or_default());
        tx.absorb_cursors(rows.next().unwrap_or_default())?;
        tx.absorb_prefetch(rows.next().unwrap_or_default())?;
        tx.prefetched = true;
        Ok(tx)
    }

    fn empty(conn: &'c Conn, sql: &'c Sql) -> PgTx<'c> {
        PgTx {
            conn,
            sql,
            meta: HashMap::new(),
            meta_dirty: HashSet::new(),
            source_ids: HashMap::new(),
            new_source_ids: Vec::new(),
            sources: Point::new(),
            window: Point::new(),
            quarantine: Point::new(),
            fp: Point::new(),
            fp_by_id: Point::new(),
            new_effects: Vec::new(),
            new_audit: BTreeMap::new(),
            new_audit_keys: Vec::new(),
            new_audit_sources: Vec::new(),
            cursors: None,
            prefetched: false,
        }
    }

    fn absorb_meta(&mut self, rows: Vec<tokio_postgres::Row>) {
        for row in rows {
            self.meta
                .insert(row.get::<_, String>(0), row.get::<_, Vec<u8>>(1));
        }
    }

    /// Rows of `cursors_needed`: each sink's name, cursor and lowest parked offset (at or
    /// above the floor asked for).
    fn absorb_cursors(&mut self, rows: Vec<tokio_postgres::Row>) -> Result<(), StoreError> {
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let name: String = row.get(0);
            let rec = decode_col(SINK_CURSORS, &name.as_str(), row.get::<_, &[u8]>(1))?;
            let parked = row.get::<_, Option<i64>>(2).map(un);
            out.push((name, rec, parked));
        }
        self.cursors = Some(out);
        Ok(())
    }

    /// Rows of `prefetch`: each position's source number and record and window entry.
    fn absorb_prefetch(&mut self, rows: Vec<tokio_postgres::Row>) -> Result<(), StoreError> {
        for row in rows {
            let agency: String = row.get(0);
            let source_id: String = row.get(1);
            let no: Option<i64> = row.get(2);
            let ids_key = (agency, source_id);
            match no {
                None => {
                    self.source_ids.entry(ids_key).or_insert(None);
                }
                Some(no) => {
                    let no = un(no);
                    self.source_ids.entry(ids_key).or_insert(Some(no));
                    if let std::collections::hash_map::Entry::Vacant(v) =
                        self.sources.known.entry(no)
                    {
                        let rec: Option<Vec<u8>> = row.get(3);
                        let rec = rec.map(|b| decode_col(SOURCES, &no, &b)).transpose()?;
                        v.insert(rec);
                    }
                    let wkey = (no, un(row.get(4)), un(row.get(5)));
                    if let std::collections::hash_map::Entry::Vacant(v) =
                        self.window.known.entry(wkey)
                    {
                        let rec: Option<Vec<u8>> = row.get(6);
                        let rec = rec.map(|b| decode_col(WINDOW, &wkey, &b)).transpose()?;
                        let (conn, sql) = (self.conn, self.sql);
                        let rec = rec
                            .map(|w| w.resolve(wkey, |o| effect_digest(conn, sql, o)))
                            .transpose()?;
                        v.insert(rec);
                    }
                }
            }
        }
        Ok(())
    }

    fn meta_record<T: Record>(&self, entry: MetaEntry<T>) -> Result<Option<T>, StoreError> {
        self.meta
            .get(entry.key())
            .map(|b| Ok(entry.decode(b)?))
            .transpose()
    }

    fn set_meta<T: Record>(&mut self, entry: MetaEntry<T>, record: &T) {
        self.meta
            .insert(entry.key().to_string(), entry.encode(record));
        self.meta_dirty.insert(entry.key());
    }

    fn flush_effects(&mut self) -> Result<(), StoreError> {
        if self.new_effects.is_empty() {
            return Ok(());
        }
        let (k, v): (Vec<i64>, Vec<Vec<u8>>) =
            std::mem::take(&mut self.new_effects).into_iter().unzip();
        self.conn.note_appended();
        self.conn
            .defer(&self.sql.effects_insert, vec![param(k), param(v)])
    }

    fn flush_audit(&mut self) -> Result<(), StoreError> {
        if self.new_audit.is_empty()
            && self.new_audit_keys.is_empty()
            && self.new_audit_sources.is_empty()
        {
            return Ok(());
        }
        // The entries and their index rows in one statement.
        let (mut buckets, mut indices): (Vec<i64>, Vec<i64>) =
            std::mem::take(&mut self.new_audit_keys).into_iter().unzip();
        let sources = std::mem::take(&mut self.new_audit_sources);
        let mut columns: [Vec<i64>; 4] = Default::default();
        for ((bucket, index), (epoch, sequence)) in sources {
            for (c, v) in columns.iter_mut().zip([bucket, index, epoch, sequence]) {
                c.push(db(v));
            }
        }
        let [s_buckets, s_indices, s_epochs, s_sequences] = columns;
        let mut k = Vec::with_capacity(self.new_audit.len());
        let mut v = Vec::with_capacity(self.new_audit.len());
        for (i, r) in std::mem::take(&mut self.new_audit) {
            if let Some(key) = &r.key {
                buckets.push(db(audit_key_bucket(i, key)));
                indices.push(db(i));
            }
            k.push(db(i));
            v.push(AUDIT.encode(&r));
        }
        if !k.is_empty() {
            self.conn.note_appended();
        }
        self.conn.defer(
            &self.sql.audit_insert,
            vec![
                param(k),
                param(v),
                param(buckets),
                param(indices),
                param(s_buckets),
                param(s_indices),
                param(s_epochs),
                param(s_sequences),
            ],
        )
    }

    fn flush_quarantine(&mut self) -> Result<(), StoreError> {
        let (up, del) = self.quarantine.take_dirty();
        if !del.is_empty() {
            let ids: Vec<i64> = del.into_iter().map(db).collect();
            self.conn
                .defer(&self.sql.quarantine_delete, vec![param(ids)])?;
        }
        if !up.is_empty() {
            let (k, v): (Vec<i64>, Vec<Vec<u8>>) = up
                .into_iter()
                .map(|(id, r)| (db(id), QUARANTINE.encode(&r)))
                .unzip();
            self.conn
                .defer(&self.sql.quarantine_upsert, vec![param(k), param(v)])?;
        }
        Ok(())
    }

    /// Queues every write still in memory on the connection; the transaction is then ready
    /// to commit (the COMMIT sends them).
    pub fn flush(&mut self) -> Result<(), StoreError> {
        if !self.new_source_ids.is_empty() {
            let mut a = Vec::new();
            let mut s = Vec::new();
            let mut n = Vec::new();
            for (agency, source_id, no) in std::mem::take(&mut self.new_source_ids) {
                a.push(agency);
                s.push(source_id);
                n.push(db(no));
            }
            self.conn.defer(
                &self.sql.source_ids_insert,
                vec![param(a), param(s), param(n)],
            )?;
        }
        let (up, _) = self.sources.take_dirty();
        if !up.is_empty() {
            let (k, v): (Vec<i64>, Vec<Vec<u8>>) = up
                .into_iter()
                .map(|(no, r)| (db(no), SOURCES.encode(&r)))
                .unzip();
            self.conn
                .defer(&self.sql.sources_upsert, vec![param(k), param(v)])?;
        }
        let (up, del) = self.window.take_dirty();
        if !del.is_empty() {
            let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
            for (no, e, s) in del {
                a.push(db(no));
                b.push(db(e));
                c.push(db(s));
            }
            self.conn
                .defer(&self.sql.window_delete, vec![param(a), param(b), param(c)])?;
        }
        if !up.is_empty() {
            let (mut a, mut b, mut c, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for ((no, e, s), r) in up {
                a.push(db(no));
                b.push(db(e));
                c.push(db(s));
                // Always with the digest here: this store's window is read in one query per
                // batch (`prefetch`), which would need a join to read it from the effect.
                d.push(WINDOW.encode(&WindowEntry {
                    effect_offset: r.effect_offset,
                    digest: Some(r.digest),
                }));
            }
            self.conn.defer(
                &self.sql.window_upsert,
                vec![param(a), param(b), param(c), param(d)],
            )?;
        }
        self.flush_effects()?;
        self.flush_audit()?;
        self.flush_quarantine()?;
        let (up, del) = self.fp.take_dirty();
        if !del.is_empty() {
            let fps: Vec<Vec<u8>> = del.iter().map(|f| f.to_vec()).collect();
            self.conn.defer(&self.sql.fp_delete, vec![param(fps)])?;
        }
        if !up.is_empty() {
            let (k, v): (Vec<Vec<u8>>, Vec<i64>) =
                up.into_iter().map(|(fp, id)| (fp.to_vec(), db(id))).unzip();
            self.conn
                .defer(&self.sql.fp_upsert, vec![param(k), param(v)])?;
        }
        let (up, del) = self.fp_by_id.take_dirty();
        if !del.is_empty() {
            let ids: Vec<i64> = del.into_iter().map(db).collect();
            self.conn
                .defer(&self.sql.fp_by_id_delete, vec![param(ids)])?;
        }
        if !up.is_empty() {
            let (k, v): (Vec<i64>, Vec<Vec<u8>>) =
                up.into_iter().map(|(id, fp)| (db(id), fp.to_vec())).unzip();
            self.conn
                .defer(&self.sql.fp_by_id_upsert, vec![param(k), param(v)])?;
        }
        if !self.meta_dirty.is_empty() {
            let mut names = Vec::new();
            let mut records = Vec::new();
            for name in self.meta_dirty.drain() {
                if let Some(r) = self.meta.get(name) {
                    names.push(name.to_string());
                    records.push(r.clone());
                }
            }
            self.conn
                .defer(&self.sql.meta_upsert, vec![param(names), param(records)])?;
        }
        Ok(())
    }

    /// Scans `sql` (params: from, to, limit) in chunks, lowest key first, until `f` breaks.
    fn scan_chunks(
        &self,
        sql: &str,
        range: Range<u64>,
        f: &mut RowVisitor<'_>,
    ) -> Result<(), StoreError> {
        let mut from = range.start;
        let to = bound(range.end);
        let mut chunk = SCAN_FIRST;
        loop {
            let rows = self.conn.query(sql, &[&bound(from), &to, &chunk])?;
            let n = rows.len();
            for row in rows {
                let k = un(row.get::<_, i64>(0));
                let bytes: &[u8] = row.get(1);
                if f(k, bytes)?.is_break() {
                    return Ok(());
                }
                from = k + 1;
            }
            if i64::try_from(n).unwrap_or(i64::MAX) < chunk {
                return Ok(());
            }
            chunk = (chunk * 2).min(SCAN_CHUNK);
        }
    }
}

impl Tx for PgTx<'_> {
    fn prefetch(&mut self, positions: &[(&str, &str, u64, u64)]) -> Result<(), StoreError> {
        // `begin_batch` fetched these very positions already.
        if std::mem::take(&mut self.prefetched) || positions.is_empty() {
            return Ok(());
        }
        let (a, s, e, q) = prefetch_params(positions);
        let rows = self.conn.query(&self.sql.prefetch, &[&a, &s, &e, &q])?;
        self.absorb_prefetch(rows)
    }

    fn meta(&mut self) -> Result<Meta, StoreError> {
        self.meta_record(META)?
            .ok_or_else(|| META.missing("missing").into())
    }

    fn counters(&mut self) -> Result<Option<Counters>, StoreError> {
        self.meta_record(COUNTS)
    }

    fn retention_marks(&mut self) -> Result<Option<RetentionMarks>, StoreError> {
        self.meta_record(RETENTION)
    }

    fn put_meta(&mut self, meta: &Meta) -> Result<(), StoreError> {
        // Evicted entries are deleted at once here (`evict_window`).
        let meta = Meta {
            window_purged: meta.window_start,
            ..meta.clone()
        };
        self.set_meta(META, &meta);
        Ok(())
    }

    fn put_counters(&mut self, counters: &Counters) -> Result<(), StoreError> {
        self.set_meta(COUNTS, counters);
        Ok(())
    }

    fn put_retention_marks(&mut self, marks: &RetentionMarks) -> Result<(), StoreError> {
        self.set_meta(RETENTION, marks);
        Ok(())
    }

    fn upstream_losses(&mut self) -> Result<Option<UpstreamLosses>, StoreError> {
        self.meta_record(UPSTREAM)
    }

    fn put_upstream_losses(&mut self, record: &UpstreamLosses) -> Result<(), StoreError> {
        self.set_meta(UPSTREAM, record);
        Ok(())
    }

    fn source_no(&mut self, agency: &str, source_id: &str) -> Result<Option<u64>, StoreError> {
        let key = (agency.to_string(), source_id.to_string());
        if let Some(v) = self.source_ids.get(&key) {
            return Ok(*v);
        }
        let v = self
            .conn
            .query(&self.sql.source_no, &[&agency, &source_id])?
            .first()
            .map(|r| un(r.get(0)));
        self.source_ids.insert(key, v);
        Ok(v)
    }

    fn put_source_no(&mut self, agency: &str, source_id: &str, no: u64) -> Result<(), StoreError> {
        self.source_ids
            .insert((agency.to_string(), source_id.to_string()), Some(no));
        self.new_source_ids
            .push((agency.to_string(), source_id.to_string(), no));
        Ok(())
    }

    fn source(&mut self, no: u64) -> Result<Option<SourceRecord>, StoreError> {
        let (conn, sql) = (self.conn, self.sql);
        self.sources.get(&no, || {
            conn.query(&sql.source, &[&db(no)])?
                .first()
                .map(|r| decode_col(SOURCES, &no, r.get::<_, &[u8]>(0)))
                .transpose()
        })
    }

    fn put_source(&mut self, no: u64, record: &SourceRecord) -> Result<(), StoreError> {
        self.sources.set(no, Some(record.clone()));
        Ok(())
    }

    fn window(&mut self, key: WindowKey) -> Result<Option<WindowRecord>, StoreError> {
        let (conn, sql) = (self.conn, self.sql);
        self.window.get(&key, || {
            conn.query(&sql.window, &[&db(key.0), &db(key.1), &db(key.2)])?
                .first()
                .map(|r| decode_col(WINDOW, &key, r.get::<_, &[u8]>(0)))
                .transpose()?
                .map(|w| w.resolve(key, |o| effect_digest(conn, sql, o)))
                .transpose()
        })
    }

    fn put_window(&mut self, key: WindowKey, record: &WindowRecord) -> Result<(), StoreError> {
        self.window.set(key, Some(*record));
        Ok(())
    }

    fn remove_window(&mut self, key: WindowKey) -> Result<Option<WindowRecord>, StoreError> {
        let was = self.window(key)?;
        if was.is_some() {
            self.window.set(key, None);
        }
        Ok(was)
    }

    fn evict_window(&mut self, key: WindowKey, offset: u64) -> Result<(), StoreError> {
        if let Some(w) = self.window(key)?
            && w.effect_offset == offset
        {
            self.window.set(key, None);
        }
        Ok(())
    }

    fn window_present(
        &mut self,
        no: u64,
        epoch: u64,
        seqs: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        self.flush()?;
        let (from, to) = (*seqs.start(), *seqs.end());
        // Sequences are stored bit for bit as bigint: the upper half of u64 is negative, so a
        // range across 2^63 is read as two, each in order.
        const HALF: u64 = 1 << 63;
        let parts = if from < HALF && to >= HALF {
            vec![(from, HALF - 1), (HALF, to)]
        } else {
            vec![(from, to)]
        };
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (a, b) in parts {
            let rows = self.conn.query(
                &self.sql.window_present,
                &[&db(no), &db(epoch), &db(a), &db(b)],
            )?;
            for row in rows {
                let (start, end) = (un(row.get::<_, i64>(0)), un(row.get::<_, i64>(1)));
                match out.last_mut() {
                    Some(last) if last.1.checked_add(1) == Some(start) => last.1 = end,
                    _ => out.push((start, end)),
                }
            }
        }
        Ok(out)
    }

    fn put_effect(&mut self, offset: u64, record: &EffectRecord) -> Result<(), StoreError> {
        self.new_effects.push((db(offset), EFFECTS.encode(record)));
        Ok(())
    }

    fn scan_effect_heads(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, EffectHead) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        self.flush_effects()?;
        self.scan_chunks(&self.sql.effect_heads, range, &mut |k, bytes| {
            f(k, EFFECTS.head(k, bytes)?)
        })
    }

    fn remove_effects(&mut self, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        self.flush_effects()?;
        self.conn.defer(
            &self.sql.effects_delete_range,
            vec![param(bound(*range.start())), param(bound(*range.end()))],
        )
    }

    fn audit(&mut self, index: u64) -> Result<Option<AuditRecord>, StoreError> {
        if let Some(r) = self.new_audit.get(&index) {
            return Ok(Some(r.clone()));
        }
        self.conn
            .query(&self.sql.audit, &[&db(index)])?
            .first()
            .map(|r| decode_col(AUDIT, &index, r.get::<_, &[u8]>(0)))
            .transpose()
    }

    fn put_audit(
        &mut self,
        index: u64,
        record: &AuditRecord,
        source_no: Option<u64>,
    ) -> Result<(), StoreError> {
        if let Some(row) = audit_source_row(index, record, source_no) {
            self.new_audit_sources.push(row);
        }
        // Readers here take each entry alone: it holds its `prev_hash`.
        crate::store::stored::keep_prev_hash();
        self.new_audit.insert(index, record.clone());
        Ok(())
    }

    fn index_audit_source(&mut self, row: SourceRow) -> Result<(), StoreError> {
        self.new_audit_sources.push(row);
        Ok(())
    }

    fn index_audit_key(&mut self, index: u64, key: &[u8; 32]) -> Result<(), StoreError> {
        self.new_audit_keys
            .push((db(audit_key_bucket(index, key)), db(index)));
        Ok(())
    }

    fn scan_audit(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, AuditRecord) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        self.flush_audit()?;
        self.scan_chunks(&self.sql.audit_range, range, &mut |k, bytes| {
            f(k, decode_col(AUDIT, &k, bytes)?)
        })
    }

    fn scan_audit_heads(
        &mut self,
        range: Range<u64>,
        f: &mut dyn FnMut(u64, AuditHead) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        self.flush_audit()?;
        self.scan_chunks(&self.sql.audit_heads, range, &mut |k, bytes| {
            f(k, AUDIT.head(k, bytes)?)
        })
    }

    fn remove_audit(&mut self, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        self.flush_audit()?;
        // From the block `range` starts in: the entries before it are gone already.
        let blocks = whole_blocks(&(block_floor(*range.start())..=*range.end()));
        self.conn.defer(
            &self.sql.audit_delete_range,
            vec![param(bound(*range.start())), param(bound(*range.end()))],
        )?;
        if blocks.is_empty() {
            return Ok(());
        }
        let [numbered, unnumbered] = audit_source_ranges(&blocks);
        self.conn.defer(
            &self.sql.audit_index_delete_blocks,
            vec![
                param(db(audit_key_block_start(blocks.start))),
                param(db(audit_key_block_start(blocks.end))),
                param(db(numbered.start)),
                param(db(numbered.end)),
                param(db(unnumbered.start)),
                param(db(unnumbered.end)),
            ],
        )
    }

    fn quarantined(&mut self, id: u64) -> Result<Option<QuarantineRecord>, StoreError> {
        let (conn, sql) = (self.conn, self.sql);
        self.quarantine.get(&id, || {
            conn.query(&sql.quarantine, &[&db(id)])?
                .first()
                .map(|r| decode_col(QUARANTINE, &id, r.get::<_, &[u8]>(0)))
                .transpose()
        })
    }

    fn put_quarantined(&mut self, id: u64, record: &QuarantineRecord) -> Result<(), StoreError> {
        self.quarantine.set(id, Some(record.clone()));
        Ok(())
    }

    fn remove_quarantined(&mut self, id: u64) -> Result<(), StoreError> {
        self.quarantine.set(id, None);
        Ok(())
    }

    fn quarantine_len(&mut self) -> Result<u64, StoreError> {
        self.flush_quarantine()?;
        let rows = self.conn.query(&self.sql.quarantine_len, &[])?;
        Ok(rows.first().map_or(0, |r| un(r.get(0))))
    }

    fn scan_quarantine(
        &mut self,
        from: u64,
        f: &mut dyn FnMut(u64, QuarantineRecord) -> Result<Visit, StoreError>,
    ) -> Result<(), StoreError> {
        self.flush_quarantine()?;
        let mut from = from;
        loop {
            let rows = self
                .conn
                .query(&self.sql.quarantine_range, &[&bound(from), &SCAN_CHUNK])?;
            let n = rows.len();
            for row in rows {
                let id = un(row.get::<_, i64>(0));
                let rec = decode_col(QUARANTINE, &id, row.get::<_, &[u8]>(1))?;
                if f(id, rec)?.is_break() {
                    return Ok(());
                }
                from = id + 1;
            }
            if i64::try_from(n).unwrap_or(i64::MAX) < SCAN_CHUNK {
                return Ok(());
            }
        }
    }

    fn fingerprint_owner(&mut self, fp: &[u8; 32]) -> Result<Option<u64>, StoreError> {
        let (conn, sql) = (self.conn, self.sql);
        self.fp.get(fp, || {
            Ok(conn
                .query(&sql.fp_owner, &[&fp.as_slice()])?
                .first()
                .map(|r| un(r.get(0))))
        })
    }

    fn put_fingerprint(&mut self, fp: &[u8; 32], id: u64) -> Result<(), StoreError> {
        self.fp.set(*fp, Some(id));
        self.fp_by_id.set(id, Some(*fp));
        Ok(())
    }

    fn forget_fingerprint(&mut self, id: u64) -> Result<(), StoreError> {
        let (conn, sql) = (self.conn, self.sql);
        let fp = self.fp_by_id.get(&id, || {
            conn.query(&sql.fp_by_id, &[&db(id)])?
                .first()
                .map(|r| {
                    <[u8; 32]>::try_from(r.get::<_, &[u8]>(0)).map_err(|_| {
                        StoreError::Record(RecordError {
                            table: "quarantine_fp_by_id",
                            key: id.to_string(),
                            why: "not a 32-byte fingerprint".into(),
                        })
                    })
                })
                .transpose()
        })?;
        if fp.is_some() {
            self.fp_by_id.set(id, None);
        }
        if let Some(fp) = fp
            && self.fingerprint_owner(&fp)? == Some(id)
        {
            self.fp.set(fp, None);
        }
        Ok(())
    }

    fn lowest_cursor(&mut self, stream: Stream, floor: u64) -> Result<Option<u64>, StoreError> {
        // Read once per transaction, each sink's lowest parked offset of all: the floors of
        // both logs are answered from the same rows.
        if self.cursors.is_none() {
            let rows = self.conn.query(&self.sql.cursors_needed, &[&0i64])?;
            self.absorb_cursors(rows)?;
        }
        let cached = self.cursors.as_deref().unwrap_or_default();
        // An event parked below the floor (by a version before parked events held retention)
        // holds nothing: then ask for the lowest at or above the floor.
        let below = cached.iter().any(|(_, rec, parked)| {
            rec.stream().is_none_or(|s| s == stream) && parked.is_some_and(|p| p < floor)
        });
        if !below {
            return Ok(lowest_needed(cached, stream));
        }
        let mut rows = Vec::new();
        for row in self.conn.query(&self.sql.cursors_needed, &[&db(floor)])? {
            let name: String = row.get(0);
            let rec = decode_col(SINK_CURSORS, &name.as_str(), row.get::<_, &[u8]>(1))?;
            rows.push((name, rec, row.get::<_, Option<i64>>(2).map(un)));
        }
        Ok(lowest_needed(&rows, stream))
    }

    fn ledger(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, LedgerRecord)>, StoreError> {
        let (lo, hi) = (bound(*range.start()), bound(*range.end()));
        let mut out = Vec::new();
        for row in self
            .conn
            .query(&self.sql.ledger_range, &[&name, &lo, &hi])?
        {
            let seq = un(row.get(0));
            out.push((
                seq,
                decode_col(SINK_LEDGER, &(name, seq), row.get::<_, &[u8]>(1))?,
            ));
        }
        Ok(out)
    }

    fn put_ledger(
        &mut self,
        name: &str,
        seq: u64,
        record: &LedgerRecord,
    ) -> Result<(), StoreError> {
        self.conn.execute(
            &self.sql.ledger_upsert,
            &[&name, &db(seq), &SINK_LEDGER.encode(record)],
        )?;
        Ok(())
    }

    fn remove_ledger(&mut self, name: &str, range: RangeInclusive<u64>) -> Result<(), StoreError> {
        let (lo, hi) = (bound(*range.start()), bound(*range.end()));
        self.conn
            .execute(&self.sql.ledger_delete_range, &[&name, &lo, &hi])?;
        Ok(())
    }

    fn sink_cursor(&mut self, name: &str) -> Result<Option<SinkRecord>, StoreError> {
        let rows = self.conn.query(&self.sql.cursor, &[&name])?;
        rows.first()
            .map(|row| decode_col(SINK_CURSORS, &name, row.get::<_, &[u8]>(0)))
            .transpose()
    }

    fn put_sink_cursor(&mut self, name: &str, record: &SinkRecord) -> Result<(), StoreError> {
        self.cursors = None;
        self.conn.execute(
            &self.sql.cursor_upsert,
            &[&name, &SINK_CURSORS.encode(record)],
        )?;
        Ok(())
    }

    fn remove_sink_cursor(&mut self, name: &str) -> Result<Option<SinkRecord>, StoreError> {
        self.cursors = None;
        let rows = self.conn.query(&self.sql.cursor_delete, &[&name])?;
        rows.first()
            .map(|row| decode_col(SINK_CURSORS, &name, row.get::<_, &[u8]>(0)))
            .transpose()
    }

    fn parked(
        &mut self,
        name: &str,
        range: RangeInclusive<u64>,
    ) -> Result<Vec<(u64, ParkedRecord)>, StoreError> {
        let (lo, hi) = (bound(*range.start()), bound(*range.end()));
        let mut out = Vec::new();
        for row in self
            .conn
            .query(&self.sql.parked_range, &[&name, &lo, &hi])?
        {
            let offset = un(row.get(0));
            out.push((
                offset,
                decode_col(SINK_PARKED, &(name, offset), row.get::<_, &[u8]>(1))?,
            ));
        }
        Ok(out)
    }

    fn put_parked(
        &mut self,
        name: &str,
        offset: u64,
        record: &ParkedRecord,
    ) -> Result<bool, StoreError> {
        self.cursors = None;
        let rows = self.conn.query(
            &self.sql.parked_upsert,
            &[&name, &db(offset), &SINK_PARKED.encode(record)],
        )?;
        Ok(rows.first().is_some_and(|r| r.get::<_, bool>(0)))
    }

    fn remove_parked(&mut self, name: &str, range: RangeInclusive<u64>) -> Result<u64, StoreError> {
        self.cursors = None;
        let (lo, hi) = (bound(*range.start()), bound(*range.end()));
        self.conn
            .execute(&self.sql.parked_delete_range, &[&name, &lo, &hi])
    }

    /// Takes the sink's session-level advisory lock on this connection's session the first
    /// time, and relies on it after: a session lock lasts as long as the session, and this
    /// transaction commits on that same session or not at all. A new connection (after a
    /// lost one) takes it again, or finds that another member's relay took over.
    fn claim_sink(&mut self, name: &str) -> Result<(), StoreError> {
        if self.conn.holds_sink(name) {
            return Ok(());
        }
        let rows = self.conn.query(&self.sql.sink_lock, &[&name])?;
        if rows.first().is_some_and(|r| r.get::<_, bool>(0)) {
            self.conn.took_sink(name);
            Ok(())
        } else {
            Err(StoreError::SinkBusy {
                path: self.conn.target().into(),
                sink: name.to_string(),
                by: super::super::SINK_BUSY_BY.into(),
            })
        }
    }

    fn sink_idle(&mut self, name: &str) -> Result<(), StoreError> {
        if self.conn.holds_sink(name) {
            return Ok(());
        }
        let rows = self.conn.query(&self.sql.sink_xact_lock, &[&name])?;
        if rows.first().is_some_and(|r| r.get::<_, bool>(0)) {
            Ok(())
        } else {
            Err(StoreError::SinkBusy {
                path: self.conn.target().into(),
                sink: name.to_string(),
                by: super::super::SINK_BUSY_BY.into(),
            })
        }
    }
}
