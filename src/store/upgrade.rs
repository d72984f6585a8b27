//! Takes a store written by an older build to this build's schema (`tables::SCHEMA_VERSION`),
//! inside the first write transaction a writer opens on it, on either backend: the store is
//! upgraded whole or not at all, and a build that only knows the old version refuses the
//! upgraded store (its meta record names the new version) instead of writing past the new
//! tables.
//!
//! Version 1 -> 2: the audit log's key index (`tables::AUDIT_KEYS`), built from every entry
//! still held; the log itself renamed `audit_log` (on redb with a fence left under its old
//! name, on PostgreSQL by the schema migration), so that a process of an older build still
//! running fails instead of writing entries the index would not name.
//!
//! Version 2 -> 3: the audit log's source index (`tables::AUDIT_SOURCES`), built the same way.
//! Version 2 was never released (only builds of the main branch wrote it), so nothing fences
//! a process of such a build.
//!
//! Version 3 -> 4: on redb, both indexes' rows of every complete segment moved to their merged
//! buckets (`store::index_merge`), so that a lookup reads one bucket per old segment at once;
//! nothing changes on PostgreSQL. A writer of a version-3 build refuses the upgraded store;
//! its inspectors do not check the version and, reading only the blocks, miss every merged
//! row (version 3 was never released; docs/src/install.md says so).
//!
//! Version 4 -> 5: on redb, the merged rows, stored one by one in the indexes' tables, moved
//! into packed runs (`store::index_merge`, `tables::AUDIT_KEYS_PACKED`,
//! `tables::AUDIT_SOURCES_PACKED`): a few bytes a row instead of 16 or 32 plus the B-tree's.
//! Nothing changes on PostgreSQL. A writer of a version-4 build refuses the upgraded store;
//! its inspectors, reading merged rows only one by one, would miss the packed ones.
//!
//! Version 5 -> 6: nothing is rewritten. From version 6 an effect whose content digest is its
//! payload's leaves the digest out (effect record version 4, `store::stored`), which a build
//! of version 5 cannot decode: the version only makes such a build refuse the store. Effects
//! of record version 3 keep their digest and read as before.
//!
//! Version 6 -> 7: nothing is rewritten. From version 7 an audit entry chained after the
//! entry stored before it leaves its `prev_hash` to that entry (audit record version 4,
//! `store::stored`), which a build of version 6 cannot decode: the version only makes such a
//! build refuse the store. Entries of record version 3 keep their `prev_hash` and read as
//! before.
//!
//! Version 7 -> 8: nothing is rewritten. From version 8 a relay sink's cursor record holds
//! how far the sink may have offered events and how many it offered again (`SinkRecord`
//! version 4: `offered_to`, `resent`), which a build of version 7 cannot decode: the version
//! only makes such a build refuse the store. A cursor of record version 3 reads as one that
//! offered nothing past its position and re-sent nothing, and is written as version 4 at its
//! next move.

use std::collections::HashMap;

use redb::{TableDefinition, TableError, WriteTransaction};

use super::StoreError;
use super::tables::{AUDIT, AUDIT_FENCE, SCHEMA_VERSION, audit_source_bucket};

/// An entry's source (agency, source_id) and position (epoch, sequence).
type Named = ((String, String), (u64, u64));
use super::tx::Tx;

/// Audit entries read per step of the index build (their keys are held, then written).
const CHUNK: u64 = 65_536;

/// Told (entries indexed, entries to index) after each step of an index build.
type Progress = Box<dyn Fn(u64, u64) + Send + Sync>;
static PROGRESS: std::sync::OnceLock<Progress> = std::sync::OnceLock::new();

/// Sets what is told of an upgrade's progress (once per process; `service` extends
/// systemd's start timeout with it, so a long build is not killed and started over).
pub fn on_progress(f: impl Fn(u64, u64) + Send + Sync + 'static) {
    let _ = PROGRESS.set(Box::new(f));
}

/// What an upgrade did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upgraded {
    pub from: u32,
    pub to: u32,
    /// Audit entries added to the key index.
    pub indexed: u64,
    /// Audit entries added to the source index.
    pub indexed_sources: u64,
    /// Index rows moved to their merged segments (redb; `store::index_merge`).
    pub merged: u64,
}

/// Upgrades the store `tx` is a write transaction of, if its meta record names an older
/// schema; `None` when it is current. A version this build does not know is an error.
pub fn to_current(tx: &mut dyn Tx) -> Result<Option<Upgraded>, StoreError> {
    let mut meta = tx.meta()?;
    let from = meta.schema_version;
    if from == SCHEMA_VERSION {
        return Ok(None);
    }
    if from == 0 || from > SCHEMA_VERSION {
        return Err(StoreError::Schema {
            found: from,
            expected: SCHEMA_VERSION,
        });
    }
    let first = meta.audit_anchor.map_or(0, |(i, _)| i + 1);
    let entries = meta.next_audit.saturating_sub(first);
    tracing::info!(
        from,
        to = SCHEMA_VERSION,
        entries,
        "upgrading the store's schema from version {from} to {SCHEMA_VERSION}: {} ({entries} audit entries; a build before this one refuses the upgraded store)",
        match from {
            1 => "building and merging the audit log's indexes",
            2 => "completing and merging the audit log's indexes",
            3 => "merging the audit log's indexes",
            4 => "packing the merged rows of the audit log's indexes",
            _ => "nothing to rewrite",
        }
    );
    let (indexed, indexed_sources) = if from < 3 {
        index_audit(tx, first, meta.next_audit, from < 2)?
    } else {
        (0, 0)
    };
    let merged = merge_all(tx, &meta)?;
    meta.schema_version = SCHEMA_VERSION;
    tx.put_meta(&meta)?;
    tracing::info!(
        from,
        to = SCHEMA_VERSION,
        indexed,
        indexed_sources,
        merged,
        "upgraded the store's schema from version {from} to {SCHEMA_VERSION}: indexed {indexed} audit entries by key and {indexed_sources} by source, merged {merged} index rows of old segments"
    );
    Ok(Some(Upgraded {
        from,
        to: SCHEMA_VERSION,
        indexed,
        indexed_sources,
        merged,
    }))
}

/// The redb half of an upgrade from schema `from`, before any table is opened: refuses a
/// version this build does not know, from version 1 renames the audit log to its new
/// name (`tables::AUDIT`) and leaves the fence under the old one (`tables::AUDIT_FENCE`),
/// and from version 4 packs the merged index rows (`index_merge::repack_both`).
pub fn upgrade_redb_tables(txn: &WriteTransaction, from: u32) -> Result<(), StoreError> {
    if from == SCHEMA_VERSION {
        return Ok(());
    }
    if from == 0 || from > SCHEMA_VERSION {
        return Err(StoreError::Schema {
            found: from,
            expected: SCHEMA_VERSION,
        });
    }
    if from == 1
        && let Some(old) = AUDIT.formerly()
    {
        let old = TableDefinition::<u64, &[u8]>::new(old);
        match txn.rename_table(old, AUDIT.raw()) {
            Ok(()) | Err(TableError::TableDoesNotExist(_)) => {}
            Err(e) => return Err(StoreError::redb(e)),
        }
        txn.open_table(AUDIT_FENCE)?;
    }
    if from == 4 {
        let packed = super::index_merge::repack_both(txn)?;
        tracing::info!(
            packed,
            "packed {packed} merged rows of the audit log's indexes (schema version 4 to 5)"
        );
    }
    Ok(())
}

/// Merges every complete segment of both audit indexes (none on PostgreSQL); how many rows
/// moved.
fn merge_all(tx: &mut dyn Tx, meta: &super::tables::Meta) -> Result<u64, StoreError> {
    let total = meta
        .next_audit
        .saturating_sub(meta.audit_anchor.map_or(0, |(i, _)| i + 1));
    let mut merged = 0;
    loop {
        let moved = tx.merge_indexes(meta, CHUNK)?;
        if moved == 0 {
            return Ok(merged);
        }
        merged += moved;
        if let Some(progress) = PROGRESS.get() {
            // Two rows for most entries (one in each index).
            progress((merged / 2).min(total), total);
        }
    }
}

/// Adds every entry in `from..to` to the source index, and to the key index too when
/// `keys`; how many each got.
fn index_audit(tx: &mut dyn Tx, from: u64, to: u64, keys: bool) -> Result<(u64, u64), StoreError> {
    let (mut indexed, mut indexed_sources) = (0, 0);
    // What the rows need of each entry, not the whole entry (a chunk is held at once).
    let mut entries: Vec<(u64, Option<[u8; 32]>, Option<Named>)> = Vec::new();
    let mut numbers: HashMap<(String, String), Option<u64>> = HashMap::new();
    let mut start = from;
    while start < to {
        let end = start.saturating_add(CHUNK).min(to);
        entries.clear();
        tx.scan_audit(start..end, &mut |index, r| {
            let named = match (r.agency, r.source_id, r.epoch, r.sequence) {
                (Some(a), Some(s), Some(e), Some(q)) => Some(((a, s), (e, q))),
                _ => None,
            };
            entries.push((index, r.key, named));
            Ok(std::ops::ControlFlow::Continue(()))
        })?;
        for (index, key, named) in entries.drain(..) {
            if keys && let Some(key) = &key {
                tx.index_audit_key(index, key)?;
                indexed += 1;
            }
            let Some((name, position)) = named else {
                continue;
            };
            let no = match numbers.get(&name) {
                Some(no) => *no,
                None => {
                    let no = tx.source_no(&name.0, &name.1)?;
                    numbers.insert(name, no);
                    no
                }
            };
            tx.index_audit_source(((audit_source_bucket(index, no), index), position))?;
            indexed_sources += 1;
        }
        start = end;
        if let Some(progress) = PROGRESS.get() {
            progress(start - from, to - from);
        }
    }
    Ok((indexed, indexed_sources))
}
