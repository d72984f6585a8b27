//! `migrate --from PATH.redb`: copies a redb database, table by table and record by record
//! (the same versioned bytes), into an empty PostgreSQL schema in one transaction, so a single
//! host moves to a shared store without losing its window. The caller then verifies the copy.

use redb::{ReadableTable, TableDefinition};

use super::PgStore;
use super::tx::db;
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
}

/// A PostgreSQL table's columns and their array types, in `unnest` order.
struct Target {
    table: &'static str,
    columns: &'static str,
    types: &'static str,
}

impl PgStore {
    /// Copies every table of the redb snapshot `from` into this (empty) schema in one
    /// transaction; refused if the schema already holds a decision.
    pub fn copy_from_redb(&mut self, from: &Snapshot) -> Result<CopyReport, StoreError> {
        let schema = self.cfg.schema.clone();
        self.in_txn(|conn, _| {
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
            let mut report = CopyReport::default();
            let mut send = |t: &Target, cols: &mut Vec<Col>| -> Result<(), StoreError> {
                let n = cols.first().map_or(0, Col::len);
                if n == 0 {
                    return Ok(());
                }
                let sql = format!(
                    "INSERT INTO {schema}.{} ({}) SELECT * FROM unnest({})",
                    t.table, t.columns, t.types
                );
                let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                    cols.iter().map(Col::param).collect();
                conn.execute(&sql, &params)?;
                for c in cols.iter_mut() {
                    *c = match c {
                        Col::Int(_) => Col::Int(Vec::new()),
                        Col::Text(_) => Col::Text(Vec::new()),
                        Col::Bytes(_) => Col::Bytes(Vec::new()),
                    };
                }
                match report.tables.iter_mut().find(|(name, _)| *name == t.table) {
                    Some((_, c)) => *c += n as u64,
                    None => report.tables.push((t.table, n as u64)),
                }
                Ok(())
            };
            from.guard(|txn| {
                // Records keyed by u64: effects, audit, quarantine, sources, bursts.
                let logs: [(TableDefinition<u64, &[u8]>, Target); 5] = [
                    (
                        EFFECTS.raw(),
                        t(
                            EFFECTS.pg_table(),
                            "effect_offset, record",
                            "$1::bigint[], $2::bytea[]",
                        ),
                    ),
                    (
                        AUDIT.raw(),
                        t(
                            AUDIT.pg_table(),
                            "audit_index, record",
                            "$1::bigint[], $2::bytea[]",
                        ),
                    ),
                    (
                        QUARANTINE.raw(),
                        t(
                            QUARANTINE.pg_table(),
                            "id, record",
                            "$1::bigint[], $2::bytea[]",
                        ),
                    ),
                    (
                        SOURCES.raw(),
                        t(
                            SOURCES.pg_table(),
                            "no, record",
                            "$1::bigint[], $2::bytea[]",
                        ),
                    ),
                    (
                        REPLAY_BURSTS.raw(),
                        t(
                            REPLAY_BURSTS.pg_table(),
                            "no, record",
                            "$1::bigint[], $2::bytea[]",
                        ),
                    ),
                ];
                for (def, target) in &logs {
                    let table = match txn.open_table(*def) {
                        Ok(table) => table,
                        Err(redb::TableError::TableDoesNotExist(_)) => continue,
                        Err(e) => return Err(StoreError::redb(e)),
                    };
                    let mut cols = vec![Col::Int(Vec::new()), Col::Bytes(Vec::new())];
                    for item in table.iter().map_err(StoreError::redb)? {
                        let (k, v) = item.map_err(StoreError::redb)?;
                        push_int(&mut cols[0], db(k.value()));
                        push_bytes(&mut cols[1], v.value().to_vec());
                        if cols[0].len() >= CHUNK {
                            send(target, &mut cols)?;
                        }
                    }
                    send(target, &mut cols)?;
                }
                let ids = txn.open_table(SOURCE_IDS).map_err(StoreError::redb)?;
                let target = t(
                    "source_ids",
                    "agency, source_id, no",
                    "$1::text[], $2::text[], $3::bigint[]",
                );
                let mut cols = vec![
                    Col::Text(Vec::new()),
                    Col::Text(Vec::new()),
                    Col::Int(Vec::new()),
                ];
                for item in ids.iter().map_err(StoreError::redb)? {
                    let (k, v) = item.map_err(StoreError::redb)?;
                    let (agency, source_id) = k.value();
                    push_text(&mut cols[0], agency.to_string());
                    push_text(&mut cols[1], source_id.to_string());
                    push_int(&mut cols[2], db(v.value()));
                    if cols[0].len() >= CHUNK {
                        send(&target, &mut cols)?;
                    }
                }
                send(&target, &mut cols)?;
                let window = txn.open_table(WINDOW.raw()).map_err(StoreError::redb)?;
                let target = t(
                    WINDOW.pg_table(),
                    "source_no, epoch, sequence, record",
                    "$1::bigint[], $2::bigint[], $3::bigint[], $4::bytea[]",
                );
                let mut cols = vec![
                    Col::Int(Vec::new()),
                    Col::Int(Vec::new()),
                    Col::Int(Vec::new()),
                    Col::Bytes(Vec::new()),
                ];
                for item in window.iter().map_err(StoreError::redb)? {
                    let (k, v) = item.map_err(StoreError::redb)?;
                    let (no, e, s) = k.value();
                    push_int(&mut cols[0], db(no));
                    push_int(&mut cols[1], db(e));
                    push_int(&mut cols[2], db(s));
                    push_bytes(&mut cols[3], v.value().to_vec());
                    if cols[0].len() >= CHUNK {
                        send(&target, &mut cols)?;
                    }
                }
                send(&target, &mut cols)?;
                let fps = txn.open_table(QUARANTINE_FP).map_err(StoreError::redb)?;
                let target = t("quarantine_fp", "fp, id", "$1::bytea[], $2::bigint[]");
                let mut cols = vec![Col::Bytes(Vec::new()), Col::Int(Vec::new())];
                for item in fps.iter().map_err(StoreError::redb)? {
                    let (k, v) = item.map_err(StoreError::redb)?;
                    push_bytes(&mut cols[0], k.value().to_vec());
                    push_int(&mut cols[1], db(v.value()));
                }
                send(&target, &mut cols)?;
                if let Ok(by_id) = txn.open_table(QUARANTINE_FP_BY_ID) {
                    let target = t("quarantine_fp_by_id", "id, fp", "$1::bigint[], $2::bytea[]");
                    let mut cols = vec![Col::Int(Vec::new()), Col::Bytes(Vec::new())];
                    for item in by_id.iter().map_err(StoreError::redb)? {
                        let (k, v) = item.map_err(StoreError::redb)?;
                        push_int(&mut cols[0], db(k.value()));
                        push_bytes(&mut cols[1], v.value().to_vec());
                    }
                    send(&target, &mut cols)?;
                }
                for (def, target) in [
                    (
                        SINK_CURSORS.raw(),
                        t(
                            SINK_CURSORS.pg_table(),
                            "name, record",
                            "$1::text[], $2::bytea[]",
                        ),
                    ),
                    (
                        META_TABLE,
                        t("meta", "name, record", "$1::text[], $2::bytea[]"),
                    ),
                ] {
                    let table = match txn.open_table(def) {
                        Ok(table) => table,
                        Err(redb::TableError::TableDoesNotExist(_)) => continue,
                        Err(e) => return Err(StoreError::redb(e)),
                    };
                    let mut cols = vec![Col::Text(Vec::new()), Col::Bytes(Vec::new())];
                    for item in table.iter().map_err(StoreError::redb)? {
                        let (k, v) = item.map_err(StoreError::redb)?;
                        push_text(&mut cols[0], k.value().to_string());
                        push_bytes(&mut cols[1], v.value().to_vec());
                    }
                    send(&target, &mut cols)?;
                }
                if let Ok(parked) = txn.open_table(SINK_PARKED.raw()) {
                    let target = t(
                        SINK_PARKED.pg_table(),
                        "name, effect_offset, record",
                        "$1::text[], $2::bigint[], $3::bytea[]",
                    );
                    let mut cols = vec![
                        Col::Text(Vec::new()),
                        Col::Int(Vec::new()),
                        Col::Bytes(Vec::new()),
                    ];
                    for item in parked.iter().map_err(StoreError::redb)? {
                        let (k, v) = item.map_err(StoreError::redb)?;
                        let (name, offset) = k.value();
                        push_text(&mut cols[0], name.to_string());
                        push_int(&mut cols[1], db(offset));
                        push_bytes(&mut cols[2], v.value().to_vec());
                    }
                    send(&target, &mut cols)?;
                }
                Ok(())
            })?;
            Ok(report)
        })
    }
}

fn t(table: &'static str, columns: &'static str, types: &'static str) -> Target {
    Target {
        table,
        columns,
        types,
    }
}

fn push_int(c: &mut Col, x: i64) {
    if let Col::Int(v) = c {
        v.push(x);
    }
}
fn push_text(c: &mut Col, x: String) {
    if let Col::Text(v) = c {
        v.push(x);
    }
}
fn push_bytes(c: &mut Col, x: Vec<u8>) {
    if let Col::Bytes(v) = c {
        v.push(x);
    }
}
