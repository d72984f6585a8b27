//! Read views on PostgreSQL: one REPEATABLE READ, READ ONLY transaction, so a view sees one
//! commit of the group (like a redb read transaction) while members go on committing.

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

use super::conn::Conn;
use super::tx::{bound, db, un};
use super::{PgConfig, PgStore};
use crate::store::StoreError;
use crate::store::tables::*;

/// Source index buckets one statement reads (~4 rows each with 1,000 sources; at most 4,096
/// each, one source alone): the rows held at once stay bounded.
const BUCKETS_PER_READ: usize = 64;

/// Source index rows one statement reads at most (`visit_positions_of_source`): ~20,000 for
/// one of 1,000 sources at 20M entries, read in a few statements, never all held at once.
const SOURCE_ROWS_PER_READ: i64 = 8192;

/// Rows a scan fetches per round trip.
const CHUNK: i64 = 512;

pub struct PgView {
    /// Taken out only by `drop`, to go back to `pool`.
    conn: Option<Conn>,
    /// Where the connection goes when the view ends (a `Reader`'s views), if anywhere.
    pool: Option<Arc<ViewPool>>,
    schema: String,
    /// Rows read ahead by `get`: a reader that looks records up one by one in key order
    /// (`verify` following the audit log to its effects) costs one round trip per `CHUNK`
    /// rows, not one per row. The view is one snapshot, so what it read stays true.
    ahead: std::cell::RefCell<ReadAhead>,
    /// Whether this view's transaction plans its reads as index probes (`probe_by_index`).
    probing: std::cell::Cell<bool>,
}

/// Rows read ahead, per table: every row with a key in one of `covered` is in `rows`.
#[derive(Default)]
struct ReadAhead {
    rows: std::collections::HashMap<(&'static str, u64), Vec<u8>>,
    covered: Vec<(&'static str, u64, u64)>,
}

/// Rows kept read ahead at most (then forgotten and read again as needed).
const AHEAD_MAX: usize = 16 * 1024;

impl PgStore {
    /// A consistent view of the latest commit, on a connection of its own.
    pub fn view(&self) -> Result<PgView, StoreError> {
        PgView::open(&self.cfg)
    }
}

/// Idle connections of ended views, for the next view of the same `Reader`: a relay or a
/// `--follow` takes a view every few milliseconds, and a new session costs a TCP handshake,
/// authentication and a backend process each time.
#[derive(Default)]
pub struct ViewPool {
    idle: Mutex<Vec<Conn>>,
}

/// Idle connections a pool keeps at most.
const POOL_MAX: usize = 4;

impl ViewPool {
    fn take(&self) -> Option<Conn> {
        self.idle.lock().ok()?.pop()
    }

    fn give(&self, conn: Conn) {
        if let Ok(mut idle) = self.idle.lock()
            && idle.len() < POOL_MAX
        {
            idle.push(conn);
        }
    }
}

/// Starts the view's transaction; its snapshot is taken by the first statement: now.
fn begin_view(conn: &Conn) -> Result<(), StoreError> {
    conn.batch("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
    conn.query("SELECT 1", &[])?;
    Ok(())
}

impl PgView {
    pub fn open(cfg: &PgConfig) -> Result<PgView, StoreError> {
        let conn = Conn::connect(cfg)?;
        begin_view(&conn)?;
        Ok(PgView::on(conn, None, cfg))
    }

    /// A view on an idle connection of `pool` if one still works, else on a new one; the
    /// connection goes back to `pool` when the view ends.
    pub fn pooled(cfg: &PgConfig, pool: &Arc<ViewPool>) -> Result<PgView, StoreError> {
        while let Some(conn) = pool.take() {
            if !conn.is_closed() && begin_view(&conn).is_ok() {
                return Ok(PgView::on(conn, Some(pool.clone()), cfg));
            }
        }
        let conn = Conn::connect(cfg)?;
        begin_view(&conn)?;
        Ok(PgView::on(conn, Some(pool.clone()), cfg))
    }

    fn on(conn: Conn, pool: Option<Arc<ViewPool>>, cfg: &PgConfig) -> PgView {
        PgView {
            conn: Some(conn),
            pool,
            schema: cfg.schema.clone(),
            ahead: std::cell::RefCell::new(ReadAhead::default()),
            probing: std::cell::Cell::new(false),
        }
    }

    fn conn(&self) -> &Conn {
        match &self.conn {
            Some(c) => c,
            None => unreachable!("a view's connection is taken only when the view is dropped"),
        }
    }

    /// The record of `records` at `key`. Reads the next `CHUNK` rows of the table along with
    /// it (see `ahead`).
    pub fn get<R: Record>(
        &self,
        records: Records<u64, R>,
        key: u64,
    ) -> Result<Option<R>, StoreError> {
        let (table, keycol) = (records.pg_table(), records.pg_key());
        let known = |a: &ReadAhead| {
            a.covered
                .iter()
                .any(|(t, lo, hi)| *t == table && (*lo..=*hi).contains(&key))
        };
        if !known(&self.ahead.borrow()) {
            let sql = format!(
                "SELECT {keycol}, record FROM {}.{table} WHERE {keycol} >= $1 ORDER BY {keycol} LIMIT $2",
                self.schema
            );
            let rows = self.conn().query(&sql, &[&bound(key), &CHUNK])?;
            let mut a = self.ahead.borrow_mut();
            if a.rows.len() + rows.len() > AHEAD_MAX || a.covered.len() >= 1024 {
                *a = ReadAhead::default();
            }
            let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= CHUNK;
            let mut hi = key;
            for row in &rows {
                let k = un(row.get::<_, i64>(0));
                hi = hi.max(k);
                a.rows.insert((table, k), row.get::<_, Vec<u8>>(1));
            }
            // A short read saw the table's end: nothing above `key` is missing from it.
            a.covered
                .push((table, key, if full { hi } else { u64::MAX }));
        }
        let a = self.ahead.borrow();
        a.rows
            .get(&(table, key))
            .map(|bytes| Ok(records.decode(&key, bytes)?))
            .transpose()
    }

    pub fn meta_row<R: Record>(&self, entry: MetaEntry<R>) -> Result<Option<R>, StoreError> {
        let sql = format!("SELECT record FROM {}.meta WHERE name = $1", self.schema);
        self.conn()
            .query(&sql, &[&entry.key()])?
            .first()
            .map(|r| Ok(entry.decode(r.get::<_, &[u8]>(0))?))
            .transpose()
    }

    /// Streams the records of `records` from key `from` on, lowest first, until `f` breaks.
    pub fn scan<R: Record, E: From<StoreError>>(
        &self,
        records: Records<u64, R>,
        from: u64,
        mut f: impl FnMut(u64, R) -> Result<ControlFlow<()>, E>,
    ) -> Result<(), E> {
        let (table, keycol) = (records.pg_table(), records.pg_key());
        let sql = format!(
            "SELECT {keycol}, record FROM {}.{table} WHERE {keycol} >= $1 ORDER BY {keycol} LIMIT $2",
            self.schema
        );
        let mut from = from;
        loop {
            let rows = self.conn().query(&sql, &[&bound(from), &CHUNK])?;
            let n = rows.len();
            for row in rows {
                let k = un(row.get::<_, i64>(0));
                let rec = records
                    .decode(&k, row.get::<_, &[u8]>(1))
                    .map_err(StoreError::from)?;
                if f(k, rec)?.is_break() {
                    return Ok(());
                }
                from = k + 1;
            }
            if i64::try_from(n).unwrap_or(i64::MAX) < CHUNK {
                return Ok(());
            }
        }
    }

    /// Every record of `records` in key order (small tables: sources, bursts).
    pub fn all<R: Record>(&self, records: Records<u64, R>) -> Result<Vec<R>, StoreError> {
        let mut out = Vec::new();
        self.scan::<R, StoreError>(records, 0, |_, r| {
            out.push(r);
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(out)
    }

    /// How many rows `table` has.
    pub fn count(&self, table: &'static str) -> Result<u64, StoreError> {
        let sql = format!("SELECT count(*) FROM {}.{table}", self.schema);
        Ok(self
            .conn()
            .query(&sql, &[])?
            .first()
            .map_or(0, |r| un(r.get(0))))
    }

    /// Audit heads from the newest back, until `f` breaks.
    pub fn audit_heads_newest_first(
        &self,
        mut f: impl FnMut(u64, AuditHead) -> ControlFlow<()>,
    ) -> Result<(), StoreError> {
        let sql = format!(
            "SELECT audit_index, substring(record FROM 1 FOR 12) FROM {}.audit_log \
             WHERE audit_index < $1 ORDER BY audit_index DESC LIMIT $2",
            self.schema
        );
        let mut below = i64::MAX;
        loop {
            let rows = self.conn().query(&sql, &[&below, &CHUNK])?;
            let n = rows.len();
            for row in rows {
                let k: i64 = row.get(0);
                let head: AuditHead = AUDIT.head(un(k), row.get::<_, &[u8]>(1))?;
                if f(un(k), head).is_break() {
                    return Ok(());
                }
                below = k;
            }
            if i64::try_from(n).unwrap_or(i64::MAX) < CHUNK {
                return Ok(());
            }
        }
    }

    /// The fingerprint kept beside quarantined message `id`.
    pub fn quarantine_fingerprint(&self, id: u64) -> Result<Option<[u8; 32]>, StoreError> {
        let sql = format!(
            "SELECT fp FROM {}.quarantine_fp_by_id WHERE id = $1",
            self.schema
        );
        Ok(self
            .conn()
            .query(&sql, &[&db(id)])?
            .first()
            .and_then(|r| <[u8; 32]>::try_from(r.get::<_, &[u8]>(0)).ok()))
    }

    /// Plans the rest of this view's reads as index probes: no sequential scan, no JIT, no
    /// parallel workers (an index's lookups, whatever the statistics of a growing log say).
    fn probe_by_index(&self) -> Result<(), StoreError> {
        if self.probing.get() {
            return Ok(()); // set already, for the rest of the transaction
        }
        self.conn().batch(
            "SET LOCAL enable_seqscan = off; SET LOCAL jit = off; \
             SET LOCAL max_parallel_workers_per_gather = 0",
        )?;
        self.probing.set(true);
        Ok(())
    }

    /// Whether the schema has the indexes of version 5 (`audit_keys_by_key`,
    /// `audit_sources_by_source`): a schema no writer of this build has upgraded yet is read
    /// by probing a bucket per block instead.
    pub fn indexed_across_blocks(&self) -> Result<bool, StoreError> {
        let sql = format!("SELECT version FROM {}.schema_version", self.schema);
        let rows = self.conn().query(&sql, &[])?;
        Ok(rows.first().is_some_and(|r| r.get::<_, i32>(0) >= 5))
    }

    /// The audit entries in `kept` whose `AUDIT_KEYS` row has `prefix` (a key's first four
    /// bytes) in its bucket, lowest index first (candidates: the caller checks their keys).
    /// One range of `audit_keys_by_key` (schema version 5 on: `indexed_across_blocks`).
    pub fn audit_with_key_prefix(
        &self,
        prefix: u32,
        kept: std::ops::Range<u64>,
    ) -> Result<Vec<(u64, AuditRecord)>, StoreError> {
        self.probe_by_index()?;
        let sql = format!(
            "SELECT audit_index FROM {}.audit_keys WHERE (bucket & 4294967295) = $1 \
             AND audit_index >= $2 AND audit_index < $3",
            self.schema
        );
        let rows = self.conn().query(
            &sql,
            &[&i64::from(prefix), &bound(kept.start), &bound(kept.end)],
        )?;
        let indices: Vec<i64> = rows.iter().map(|r| r.get::<_, i64>(0)).collect();
        self.audit_at(&indices)
    }

    /// Calls `f(epoch, sequence)` for the source index's rows of source number `no`
    /// (numbered buckets) with an audit index in `kept`, in index order, a bounded
    /// number of rows a statement. Ranges of `audit_sources_by_source` (schema version 5 on:
    /// `indexed_across_blocks`), read by the index alone where the table's pages are all
    /// visible (vacuumed).
    pub fn visit_positions_of_source(
        &self,
        no: u64,
        kept: std::ops::Range<u64>,
        f: &mut dyn FnMut(u64, u64),
    ) -> Result<(), StoreError> {
        let Ok(no) = u32::try_from(no) else {
            return Ok(()); // a number past 32 bits: its rows are unnumbered
        };
        self.probe_by_index()?;
        let sql = format!(
            "SELECT audit_index, epoch, sequence FROM {}.audit_sources \
             WHERE bucket >= 0 AND (bucket & 4294967295) = $1 \
             AND audit_index >= $2 AND audit_index < $3 ORDER BY audit_index LIMIT $4",
            self.schema
        );
        // The index alone, in its order: a bitmap scan (the planner's choice where the
        // table has no statistics yet) visited all 4,884 heap pages of one source's 20,000
        // rows at 20M entries and sorted them for each statement (38 ms against 9 ms).
        // Only for these statements: a bitmap scan is what reads `bucket < $1 OR ...`.
        self.conn().defer_batch("SET LOCAL enable_bitmapscan = off");
        let mut from = kept.start;
        loop {
            let rows = self.conn().query(
                &sql,
                &[
                    &i64::from(no),
                    &bound(from),
                    &bound(kept.end),
                    &SOURCE_ROWS_PER_READ,
                ],
            )?;
            for r in &rows {
                let c = |i| un(r.get::<_, i64>(i));
                f(c(1), c(2));
                from = c(0) + 1;
            }
            if i64::try_from(rows.len()).unwrap_or(i64::MAX) < SOURCE_ROWS_PER_READ {
                self.conn().defer_batch("SET LOCAL enable_bitmapscan = on");
                return Ok(());
            }
        }
    }

    /// The audit entries at `indices`, lowest index first.
    fn audit_at(&self, indices: &[i64]) -> Result<Vec<(u64, AuditRecord)>, StoreError> {
        if indices.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT audit_index, record FROM {}.audit_log WHERE audit_index = ANY($1::bigint[]) \
             ORDER BY audit_index",
            self.schema
        );
        self.conn()
            .query(&sql, &[&indices])?
            .iter()
            .map(|r| {
                let index = un(r.get::<_, i64>(0));
                Ok((index, AUDIT.decode(&index, r.get::<_, &[u8]>(1))?))
            })
            .collect()
    }

    /// The audit entries whose `AUDIT_KEYS` bucket is one of `buckets`, lowest index first
    /// (candidates: the caller checks their keys).
    pub fn audit_in_buckets(&self, buckets: &[u64]) -> Result<Vec<(u64, AuditRecord)>, StoreError> {
        // An index probe per bucket, then per candidate, is the plan; the planner's
        // estimates for a growing log (statistics from when it was smaller) are far off: it
        // took a hash join over the whole log (minutes at 16M entries), then a scan of the
        // whole index table (4 s), and JIT-compiled and parallelised the probes (3,001
        // buckets at 13M entries, warm: 110 ms and 1.3 s of JIT, against 21 ms without). So:
        // two statements of one table each, no sequential scan, no JIT, no workers.
        self.probe_by_index()?;
        let buckets: Vec<i64> = buckets.iter().map(|&b| db(b)).collect();
        let sql = format!(
            "SELECT audit_index FROM {}.audit_keys WHERE bucket = ANY($1::bigint[])",
            self.schema
        );
        let indices: Vec<i64> = self
            .conn()
            .query(&sql, &[&buckets])?
            .iter()
            .map(|r| r.get::<_, i64>(0))
            .collect();
        self.audit_at(&indices)
    }

    /// Calls `f(audit index, epoch, sequence)` for the source index's rows whose bucket is one
    /// of `buckets` (numbered buckets: no entry needed), in no particular order, reading
    /// `BUCKETS_PER_READ` buckets a statement.
    pub fn visit_source_positions(
        &self,
        buckets: &[u64],
        f: &mut dyn FnMut(u64, u64, u64),
    ) -> Result<(), StoreError> {
        // The plan `audit_in_buckets` explains: an index probe per bucket, whatever the
        // statistics say.
        self.probe_by_index()?;
        let sql = format!(
            "SELECT audit_index, epoch, sequence FROM {}.audit_sources \
             WHERE bucket = ANY($1::bigint[])",
            self.schema
        );
        for some in buckets.chunks(BUCKETS_PER_READ) {
            let some: Vec<i64> = some.iter().map(|&b| db(b)).collect();
            for r in self.conn().query(&sql, &[&some])? {
                let c = |i| un(r.get::<_, i64>(i));
                f(c(0), c(1), c(2));
            }
        }
        Ok(())
    }

    /// The source index's rows ((bucket, audit index), (epoch, sequence)) with buckets in
    /// any of `ranges` (numbered or unnumbered: `tables::audit_source_ranges`), in bucket
    /// order as bigints (unnumbered, negative, first), one statement.
    pub fn audit_source_rows(
        &self,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Vec<SourceRow>, StoreError> {
        // Index range reads, whatever the statistics say: on a table just filled (a
        // `migrate --from` of 20M entries, not analysed yet) the planner joined the ranges
        // against a parallel scan of the whole table, 2 s a statement, one per block for
        // `verify`.
        self.probe_by_index()?;
        let (mut lo, mut hi) = (Vec::new(), Vec::new());
        for r in ranges {
            lo.push(db(r.start));
            hi.push(db(r.end));
        }
        let sql = format!(
            "SELECT s.bucket, s.audit_index, s.epoch, s.sequence \
             FROM unnest($1::bigint[], $2::bigint[]) AS r(lo, hi) \
             JOIN {}.audit_sources s ON s.bucket >= r.lo AND s.bucket < r.hi \
             ORDER BY s.bucket, s.audit_index",
            self.schema
        );
        Ok(self
            .conn()
            .query(&sql, &[&lo, &hi])?
            .iter()
            .map(|r| {
                let c = |i| un(r.get::<_, i64>(i));
                ((c(0), c(1)), (c(2), c(3)))
            })
            .collect())
    }

    /// A row of the source index with its bucket in neither of `ranges` (numbered, then
    /// unnumbered: `tables::audit_source_ranges`), if any.
    pub fn audit_source_row_outside(
        &self,
        ranges: &[std::ops::Range<u64>; 2],
    ) -> Result<Option<SourceRow>, StoreError> {
        self.probe_by_index()?;
        // As bigints the unnumbered buckets are negative: below the numbered ones. Three
        // plain ranges, each an index range: below, between and above the two.
        let sql = format!(
            "SELECT bucket, audit_index, epoch, sequence FROM {}.audit_sources \
             WHERE bucket < $1 OR (bucket >= $2 AND bucket < $3) OR bucket >= $4 LIMIT 1",
            self.schema
        );
        let [n, u] = ranges;
        Ok(self
            .conn()
            .query(&sql, &[&db(u.start), &db(u.end), &db(n.start), &db(n.end)])?
            .first()
            .map(|r| {
                let c = |i| un(r.get::<_, i64>(i));
                ((c(0), c(1)), (c(2), c(3)))
            }))
    }

    /// The key index's rows with buckets in `lo..hi` (bigint order is bucket order below
    /// 2^63), in order.
    pub fn audit_key_rows(&self, lo: u64, hi: u64) -> Result<Vec<(u64, u64)>, StoreError> {
        self.probe_by_index()?;
        let sql = format!(
            "SELECT bucket, audit_index FROM {}.audit_keys WHERE bucket >= $1 AND bucket < $2 \
             ORDER BY bucket, audit_index",
            self.schema
        );
        Ok(self
            .conn()
            .query(&sql, &[&db(lo), &db(hi)])?
            .iter()
            .map(|r| (un(r.get::<_, i64>(0)), un(r.get::<_, i64>(1))))
            .collect())
    }

    /// A row of the key index with its bucket outside `lo..hi`, if any.
    pub fn audit_key_row_outside(
        &self,
        lo: u64,
        hi: u64,
    ) -> Result<Option<(u64, u64)>, StoreError> {
        self.probe_by_index()?;
        let sql = format!(
            "SELECT bucket, audit_index FROM {}.audit_keys WHERE bucket < $1 OR bucket >= $2 LIMIT 1",
            self.schema
        );
        Ok(self
            .conn()
            .query(&sql, &[&db(lo), &db(hi)])?
            .first()
            .map(|r| (un(r.get::<_, i64>(0)), un(r.get::<_, i64>(1)))))
    }

    /// The source number of (agency, source_id).
    pub fn source_no(&self, agency: &str, source_id: &str) -> Result<Option<u64>, StoreError> {
        let sql = format!(
            "SELECT no FROM {}.source_ids WHERE agency = $1 AND source_id = $2",
            self.schema
        );
        Ok(self
            .conn()
            .query(&sql, &[&agency, &source_id])?
            .first()
            .map(|r| un(r.get(0))))
    }

    /// The window entry of a position.
    pub fn window(&self, key: (u64, u64, u64)) -> Result<Option<WindowRecord>, StoreError> {
        let sql = format!(
            "SELECT record FROM {}.window_entries WHERE source_no = $1 AND epoch = $2 AND sequence = $3",
            self.schema
        );
        let entry = self
            .conn()
            .query(&sql, &[&db(key.0), &db(key.1), &db(key.2)])?
            .first()
            .map(|r| WINDOW.decode(&key, r.get::<_, &[u8]>(0)))
            .transpose()?;
        entry
            .map(|w| w.resolve(key, |offset| self.effect_digest(offset)))
            .transpose()
    }

    /// The content digest the effect at `offset` holds, or its applying audit entry recorded
    /// (`None` if neither: see `WindowEntry::resolve`, `effect_digest_or_audited`).
    pub fn effect_digest(&self, offset: u64) -> Result<Option<[u8; 32]>, StoreError> {
        let sql = format!(
            "SELECT record FROM {}.effects WHERE effect_offset = $1",
            self.schema
        );
        match self.conn().query(&sql, &[&db(offset)])?.first() {
            Some(r) => effect_digest_or_audited(offset, r.get::<_, &[u8]>(0), |index| {
                self.get(AUDIT, index)
            }),
            None => Ok(None),
        }
    }

    /// The first effect at or after `from` (its head only).
    pub fn first_effect_head(&self, from: u64) -> Result<Option<EffectHead>, StoreError> {
        let sql = format!(
            "SELECT effect_offset, substring(record FROM 1 FOR 41) FROM {}.effects \
             WHERE effect_offset >= $1 ORDER BY effect_offset LIMIT 1",
            self.schema
        );
        self.conn()
            .query(&sql, &[&bound(from)])?
            .first()
            .map(|r| {
                let k = un(r.get::<_, i64>(0));
                Ok(EFFECTS.head(k, r.get::<_, &[u8]>(1))?)
            })
            .transpose()
    }

    /// Every sink cursor (or the one named), by name.
    pub fn sink_cursors(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<(String, SinkRecord)>, StoreError> {
        let sql = format!(
            "SELECT name, record FROM {}.sink_cursors WHERE $1::text IS NULL OR name = $1 ORDER BY name",
            self.schema
        );
        let mut out = Vec::new();
        for row in self.conn().query(&sql, &[&name])? {
            let n: String = row.get(0);
            let rec = SINK_CURSORS.decode(&n.as_str(), row.get::<_, &[u8]>(1))?;
            out.push((n, rec));
        }
        Ok(out)
    }

    /// Parked events of one sink (or all), in sink then offset order.
    pub fn sink_parked(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<(String, u64, ParkedRecord)>, StoreError> {
        let sql = format!(
            "SELECT name, effect_offset, record FROM {}.sink_parked \
             WHERE $1::text IS NULL OR name = $1 ORDER BY name, effect_offset",
            self.schema
        );
        let mut out = Vec::new();
        for row in self.conn().query(&sql, &[&name])? {
            let n: String = row.get(0);
            let o = un(row.get::<_, i64>(1));
            let rec = SINK_PARKED.decode(&(n.as_str(), o), row.get::<_, &[u8]>(2))?;
            out.push((n, o, rec));
        }
        Ok(out)
    }

    /// The ledger of sink `name`, by entry number (none in a schema not yet at version 2).
    pub fn sink_ledger(&self, name: &str) -> Result<Vec<(u64, LedgerRecord)>, StoreError> {
        let table = format!("{}.sink_ledger", self.schema);
        let present = self
            .conn()
            .query("SELECT to_regclass($1) IS NOT NULL", &[&table])?
            .first()
            .is_some_and(|r| r.get::<_, bool>(0));
        if !present {
            return Ok(Vec::new());
        }
        let sql = format!("SELECT seq, record FROM {table} WHERE name = $1 ORDER BY seq");
        let mut out = Vec::new();
        for row in self.conn().query(&sql, &[&name])? {
            let seq = un(row.get::<_, i64>(0));
            out.push((
                seq,
                SINK_LEDGER.decode(&(name, seq), row.get::<_, &[u8]>(1))?,
            ));
        }
        Ok(out)
    }

    /// Bytes each table takes on the server: (name, table data, indexes + TOAST + free space
    /// map), like the file's stored and overhead bytes.
    pub fn table_sizes(&self) -> Result<Vec<(&'static str, u64, u64)>, StoreError> {
        let mut out = Vec::new();
        for (name, table) in [
            (AUDIT.name(), AUDIT.pg_table()),
            ("audit_keys", "audit_keys"),
            ("audit_sources", "audit_sources"),
            (EFFECTS.name(), EFFECTS.pg_table()),
            (WINDOW.name(), WINDOW.pg_table()),
            (QUARANTINE.name(), QUARANTINE.pg_table()),
            (SOURCES.name(), SOURCES.pg_table()),
        ] {
            // NULL for a table an older schema lacks (written by an older build).
            let sql = format!(
                "SELECT pg_relation_size(to_regclass('{s}.{table}')), \
                 pg_total_relation_size(to_regclass('{s}.{table}')) \
                 - pg_relation_size(to_regclass('{s}.{table}'))",
                s = self.schema
            );
            let rows = self.conn().query(&sql, &[])?;
            let Some(row) = rows.first() else {
                continue;
            };
            let (Some(data), Some(rest)) = (row.get::<_, Option<i64>>(0), row.get(1)) else {
                continue;
            };
            out.push((name, un(data), un(rest)));
        }
        Ok(out)
    }
}

impl Drop for PgView {
    /// Ends the view's transaction (an idle one would hold back VACUUM) and hands the
    /// connection back to its pool.
    fn drop(&mut self) {
        if let (Some(conn), Some(pool)) = (self.conn.take(), self.pool.take())
            && !conn.is_closed()
            && conn.batch("ROLLBACK").is_ok()
        {
            pool.give(conn);
        }
    }
}
