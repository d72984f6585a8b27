//! `migrate --from PATH.redb`: copies a redb database, table by table and record by record
//! (the same versioned bytes, except an audit entry that leaves its `prev_hash` to the entry
//! before it, copied holding it: `tables::audit_standalone`), into an empty PostgreSQL schema
//! in one transaction, so a single host moves to a shared store without losing its window.
//! The caller then verifies the copy.
//! The tables are `tables::for_each_table`'s, the list `backup` walks too.

use std::collections::HashSet;

use redb::{ReadTransaction, ReadableTable};

use super::PgStore;
use super::conn::Conn;
use super::tx::db;
use crate::store::index_merge::for_each_packed;
use crate::store::tables::*;
use crate::store::{Snapshot, StoreError};

/// Rows sent per INSERT.
const CHUNK: usize = 2_000;

/// Rows copied, per table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CopyReport {
    pub tables: Vec<(&'static str, u64)>,
}

impl CopyReport {
    pub fn rows(&self, table: &str) -> u64 {
        self.tables
            .iter()
            .find(|(t, _)| *t == table)
            .map_or(0, |(_, n)| *n)
    }
}

/// One column's values for a chunk.
enum Col {
    Int(Vec<i64>),
    Text(Vec<String>),
    Bytes(Vec<Vec<u8>>),
}

impl Col {
    /// An empty column of PostgreSQL array type `pg_type`.
    fn of(pg_type: &str) -> Col {
        match pg_type {
            "bigint[]" => Col::Int(Vec::new()),
            "text[]" => Col::Text(Vec::new()),
            _ => Col::Bytes(Vec::new()),
        }
    }
    fn param(&self) -> &(dyn tokio_postgres::types::ToSql + Sync) {
        match self {
            Col::Int(v) => v,
            Col::Text(v) => v,
            Col::Bytes(v) => v,
        }
    }
    fn len(&self) -> usize {
        match self {
            Col::Int(v) => v.len(),
            Col::Text(v) => v.len(),
            Col::Bytes(v) => v.len(),
        }
    }
    fn clear(&mut self) {
        match self {
            Col::Int(v) => v.clear(),
            Col::Text(v) => v.clear(),
            Col::Bytes(v) => v.clear(),
        }
    }
    fn push(&mut self, c: Cell<'_>) {
        match (self, c) {
            (Col::Int(v), Cell::Int(x)) => v.push(db(x)),
            (Col::Text(v), Cell::Text(x)) => v.push(x.to_string()),
            (Col::Bytes(v), Cell::Bytes(x)) => v.push(x.to_vec()),
            // `Cells::PG_TYPES` and `Cells::cells` are written side by side in tables.rs.
            (_, c) => unreachable!("cell {c:?} does not match its column's type"),
        }
    }
}

/// Copies each table of a redb read transaction into the schema, on one connection inside
/// one transaction.
struct ToPg<'a> {
    txn: &'a ReadTransaction,
    conn: &'a Conn,
    schema: &'a str,
    report: CopyReport,
}

impl ToPg<'_> {
    fn send(&mut self, table: &'static str, sql: &str, cols: &mut [Col]) -> Result<(), StoreError> {
        let n = cols.first().map_or(0, Col::len);
        if n == 0 {
            return Ok(());
        }
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            cols.iter().map(Col::param).collect();
        self.conn.execute(sql, &params)?;
        cols.iter_mut().for_each(Col::clear);
        match self.report.tables.iter_mut().find(|(t, _)| *t == table) {
            Some((_, c)) => *c += n as u64,
            None => self.report.tables.push((table, n as u64)),
        }
        Ok(())
    }
}

impl CopyTable for ToPg<'_> {
    fn table<K: Cells + redb::Key, V: Cells>(
        &mut self,
        t: WholeTable<K, V>,
    ) -> Result<(), StoreError> {
        // Absent from a database last written before the table existed (or, renamed since,
        // under its old name).
        // `WINDOW_GONE` (redb's removed-but-not-yet-deleted window positions) has no table
        // here: its positions are left out of the window's copy instead.
        if t.pg_table.is_empty() {
            return Ok(());
        }
        let Some(table) = t.open_in(self.txn)? else {
            return Ok(());
        };
        let name = redb::TableHandle::name(&t.def);
        let gone = if name == WINDOW.stored() {
            gone_keys(self.txn)?
        } else {
            HashSet::new()
        };
        // The entries of effects evicted since the writer's last merge are no longer in the
        // window (`Meta::window_purged`): left out, as PostgreSQL deletes them at eviction.
        let window_start = if name == WINDOW.stored() || name == WINDOW_RECENT.stored() {
            META.read(self.txn)?.map(|m| m.window_start)
        } else {
            None
        };
        let unmerge = name == redb::TableHandle::name(&AUDIT_KEYS)
            || name == redb::TableHandle::name(&AUDIT_SOURCES);
        let types: Vec<&str> = K::PG_TYPES.iter().chain(V::PG_TYPES).copied().collect();
        let params: Vec<String> = types
            .iter()
            .enumerate()
            .map(|(i, ty)| format!("${}::{ty}", i + 1))
            .collect();
        // A key-only table (`AUDIT_KEYS`) has no value columns.
        let columns: Vec<&str> = t.pg_columns.into_iter().filter(|c| !c.is_empty()).collect();
        let sql = format!(
            "INSERT INTO {}.{} ({}) SELECT * FROM unnest({})",
            self.schema,
            t.pg_table,
            columns.join(", "),
            params.join(", ")
        );
        let mut cols: Vec<Col> = types.iter().map(|ty| Col::of(ty)).collect();
        // PostgreSQL's readers take each audit entry alone: an entry that leaves its
        // `prev_hash` to the one before goes in holding it (the hash carried in index order).
        let audit = name == AUDIT.stored();
        let mut audit_prev: Option<(u64, [u8; 32])> = None;
        for item in table.iter()? {
            let (k, v) = item?;
            let standalone = if audit {
                let (key, value) = (k.value(), v.value());
                let index = <K as redb::Value>::as_bytes(&key);
                let index = <u64 as redb::Value>::from_bytes(index.as_ref());
                let bytes = <V as redb::Value>::as_bytes(&value);
                // Only the hash of the entry right before it (a gap is damage, named).
                let prev = audit_prev.filter(|(at, _)| at.checked_add(1) == Some(index));
                let (bytes, hash) =
                    audit_standalone(index, bytes.as_ref(), prev.map(|p| p.1).as_ref())?;
                audit_prev = Some((index, hash));
                bytes
            } else {
                None
            };
            if !gone.is_empty() && gone.contains(<K as redb::Value>::as_bytes(&k.value()).as_ref())
            {
                continue;
            }
            if let Some(start) = window_start {
                let (key, value) = (k.value(), v.value());
                let key = <K as redb::Value>::as_bytes(&key);
                let key = <(u64, u64, u64) as redb::Value>::from_bytes(key.as_ref());
                let entry = WINDOW.decode(&key, <V as redb::Value>::as_bytes(&value).as_ref())?;
                if entry.effect_offset < start {
                    continue;
                }
            }
            let mut i = 0;
            let mut push = |c: Cell<'_>| {
                cols[i].push(c);
                i += 1;
            };
            let key = k.value();
            if unmerge {
                // A merged index row goes in under its block's bucket: PostgreSQL reads the
                // index across blocks and never merges (`tables::block_bucket`).
                let mut cells = Vec::with_capacity(2);
                K::cells(key, &mut |c| cells.push(c));
                if let [Cell::Int(bucket), Cell::Int(index)] = cells[..] {
                    cells[0] = Cell::Int(block_bucket(bucket, index));
                }
                cells.into_iter().for_each(&mut push);
            } else {
                K::cells(key, &mut push);
            }
            match &standalone {
                Some(bytes) => push(Cell::Bytes(bytes)),
                None => V::cells(v.value(), &mut push),
            }
            if cols[0].len() >= CHUNK {
                self.send(t.pg_table, &sql, &mut cols)?;
            }
        }
        if unmerge {
            // The packed merged rows (`index_merge`), each under its block's bucket.
            let keys = name == redb::TableHandle::name(&AUDIT_KEYS);
            let def = if keys {
                AUDIT_KEYS_PACKED
            } else {
                AUDIT_SOURCES_PACKED
            };
            let packed = match self.txn.open_table(def) {
                Ok(t) => Some(t),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(StoreError::redb(e)),
            };
            if let Some(packed) = packed {
                let mut row = |(bucket, index): (u64, u64),
                               position: Option<(u64, u64)>|
                 -> Result<(), StoreError> {
                    let mut cells = vec![block_bucket(bucket, index), index];
                    cells.extend(position.into_iter().flat_map(|(e, q)| [e, q]));
                    for (col, x) in cols.iter_mut().zip(cells) {
                        col.push(Cell::Int(x));
                    }
                    if cols[0].len() >= CHUNK {
                        self.send(t.pg_table, &sql, &mut cols)?;
                    }
                    Ok(())
                };
                let all = ALL_SEGMENTS;
                if keys {
                    for_each_packed::<()>(&packed, all, &mut |k, ()| row(k, None))?;
                } else {
                    for_each_packed::<(u64, u64)>(&packed, all, &mut |k, v| row(k, Some(v)))?;
                }
            }
        }
        self.send(t.pg_table, &sql, &mut cols)
    }
}

/// The stored key bytes of every position in `WINDOW_GONE` (at most `WINDOW_MERGE_AT`).
fn gone_keys(txn: &redb::ReadTransaction) -> Result<HashSet<Vec<u8>>, StoreError> {
    use redb::Value as _;
    let table = match txn.open_table(WINDOW_GONE) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(HashSet::new()),
        Err(e) => return Err(StoreError::redb(e)),
    };
    let mut keys = HashSet::new();
    for item in table.iter()? {
        let (k, _) = item?;
        let bytes: &[u8] = &<(u64, u64, u64)>::as_bytes(&k.value());
        keys.insert(bytes.to_vec());
    }
    Ok(keys)
}

impl PgStore {
    /// Copies every table of the redb snapshot `from` into this (empty) schema in one
    /// transaction, at `now_ms`; refused if the schema already holds a decision. The copy's
    /// identity is marked as a copy (`store::identity`).
    pub fn copy_from_redb(
        &mut self,
        from: &Snapshot,
        now_ms: u64,
    ) -> Result<CopyReport, StoreError> {
        let schema = self.cfg.schema.clone();
        self.in_txn(|conn, sql| {
            let meta = conn.query(
                &format!("SELECT record FROM {schema}.meta WHERE name = $1"),
                &[&META.key()],
            )?;
            let held = match meta.first() {
                Some(r) => {
                    let m = META.decode(r.get::<_, &[u8]>(0))?;
                    m.next_audit > 0 || m.next_effect > 0 || m.next_quarantine > 0
                }
                None => false,
            };
            if held {
                return Err(StoreError::Refused(format!(
                    "schema {schema} already holds decisions: migrate --from copies into a new, \
                     empty schema only (pick another [store] schema, or drop this one)"
                )));
            }
            conn.batch(&format!("DELETE FROM {schema}.meta"))?;
            from.guard(|txn| {
                let unlisted = unlisted_tables(txn)?;
                if !unlisted.is_empty() {
                    return Err(StoreError::Refused(format!(
                        "the file holds tables this build does not know ({}): migrate it with \
                         the build that wrote it",
                        unlisted.join(", ")
                    )));
                }
                let mut copy = ToPg {
                    txn,
                    conn,
                    schema: &schema,
                    report: CopyReport::default(),
                };
                for_each_table(&mut copy)?;
                // The redb index merge's marks mean nothing here (rows went in unmerged).
                conn.execute(
                    &format!("DELETE FROM {schema}.meta WHERE name = $1"),
                    &[&INDEX_MERGE.key()],
                )?;
                // A copy of an older file is taken to this build's schema in the same
                // transaction (its key index built).
                let mut tx = super::tx::PgTx::begin(conn, sql)?;
                super::super::upgrade::to_current(&mut tx)?;
                tx.flush()?;
                // The schema is a copy: its first writer draws an id of its own.
                let meta = META
                    .read(txn)?
                    .ok_or_else(|| META.missing("missing: not a replay-guard database"))?;
                let marked = super::super::identity::copied(
                    IDENTITY.read(txn)?,
                    "migrate",
                    now_ms,
                    meta.next_effect,
                );
                if let Some(identity) = marked {
                    conn.execute(
                        &format!("UPDATE {schema}.meta SET record = $2 WHERE name = $1"),
                        &[&IDENTITY.key(), &IDENTITY.encode(&identity)],
                    )?;
                }
                Ok(copy.report)
            })
        })
    }
}
