//! Read-only views of the database for inspectors (`dump-*`, tests). They open the file in
//! redb's `SingleWriter` mode, so they work while `run` or `ingest` is writing it, and they
//! stream: one record in memory at a time.

use std::ops::ControlFlow;
use std::path::Path;

use redb::{
    DatabaseError, ReadOnlyDatabase, ReadTransaction, ReadableDatabase, ReadableTableMetadata,
};

use super::tables::*;
use super::{StoreError, builder};
use crate::model::{Digest, IdempotencyKey, Outcome};

/// A read-only handle that follows a live writer's commits.
pub struct Reader {
    db: ReadOnlyDatabase,
}

impl Reader {
    pub fn open(path: &Path) -> Result<Reader, StoreError> {
        if !path.exists() {
            return Err(StoreError::Open {
                path: path.to_path_buf(),
                error: DatabaseError::Storage(redb::StorageError::Io(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such file",
                ))),
            });
        }
        let db = builder(16 * 1024 * 1024)
            .open_read_only(path)
            .map_err(|e| match e {
                DatabaseError::RepairAborted => StoreError::NeedsRecovery(path.to_path_buf()),
                error => StoreError::Open {
                    path: path.to_path_buf(),
                    error,
                },
            })?;
        Ok(Reader { db })
    }

    /// A snapshot of the latest commit.
    pub fn begin(&self) -> Result<Snapshot, StoreError> {
        self.db.begin_read().map(Snapshot).map_err(StoreError::redb)
    }
}

/// A consistent view of one commit: later commits by the writer are not seen through it.
pub struct Snapshot(pub(super) ReadTransaction);

/// One audit entry as `dump-audit` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    pub index: u64,
    pub record: AuditRecord,
}

impl AuditEntry {
    pub fn outcome(&self) -> Option<Outcome> {
        Outcome::from_code(self.record.outcome)
    }
    pub fn key(&self) -> Option<IdempotencyKey> {
        self.record.key.map(IdempotencyKey::from_bytes)
    }
    pub fn digest(&self) -> Option<Digest> {
        self.record.digest.map(Digest::from_bytes)
    }
    /// Whether `hash` matches the entry's content and `prev_hash`.
    pub fn hash_is_valid(&self) -> bool {
        super::audit::entry_hash(self.index, &self.record, &self.record.prev_hash)
            == self.record.hash
    }
}

/// One applied effect as `dump-effects` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub offset: u64,
    pub record: EffectRecord,
}

/// One quarantined message as `dump-quarantine` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineEntry {
    pub id: u64,
    pub record: QuarantineRecord,
}

impl QuarantineEntry {
    pub fn outcome(&self) -> Option<Outcome> {
        Outcome::from_code(self.record.outcome)
    }
}

/// Counts and cursors of the store, read from its meta record and tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSummary {
    pub audit_entries: u64,
    pub effects: u64,
    pub window_entries: u64,
    pub quarantined: u64,
    pub sources: u64,
    pub chain_head: [u8; 32],
}

fn r<E: Into<redb::Error>>(e: E) -> StoreError {
    StoreError::redb(e)
}

impl Snapshot {
    pub fn meta(&self) -> Result<Meta, StoreError> {
        let txn = &self.0;
        let t = txn.open_table(META).map_err(r)?;
        let g = t.get(META_KEY).map_err(r)?.ok_or_else(|| RecordError {
            table: "meta",
            key: META_KEY.into(),
            why: "missing: not a replay-guard database".into(),
        })?;
        Ok(decode("meta", META_KEY, g.value())?)
    }

    pub fn summary(&self) -> Result<StoreSummary, StoreError> {
        let txn = &self.0;
        let m = self.meta()?;
        let window_entries = txn.open_table(WINDOW).map_err(r)?.len().map_err(r)?;
        Ok(StoreSummary {
            audit_entries: m.next_audit,
            effects: m.next_effect,
            window_entries,
            quarantined: txn.open_table(QUARANTINE).map_err(r)?.len().map_err(r)?,
            sources: m.next_source,
            chain_head: m.chain_head,
        })
    }

    /// Calls `f` with each audit entry from index `from` on, until it breaks.
    pub fn scan_audit<E: From<StoreError>>(
        &self,
        from: u64,
        f: impl FnMut(AuditEntry) -> Result<ControlFlow<()>, E>,
    ) -> Result<(), E> {
        self.scan(
            AUDIT,
            "audit",
            from,
            |index, record| AuditEntry { index, record },
            f,
        )
    }

    /// Calls `f` with each effect from offset `from` on, until it breaks.
    pub fn scan_effects<E: From<StoreError>>(
        &self,
        from: u64,
        f: impl FnMut(Effect) -> Result<ControlFlow<()>, E>,
    ) -> Result<(), E> {
        self.scan(
            EFFECTS,
            "effects",
            from,
            |offset, record| Effect { offset, record },
            f,
        )
    }

    /// Calls `f` with each quarantined message from id `from` on, until it breaks.
    pub fn scan_quarantine<E: From<StoreError>>(
        &self,
        from: u64,
        f: impl FnMut(QuarantineEntry) -> Result<ControlFlow<()>, E>,
    ) -> Result<(), E> {
        self.scan(
            QUARANTINE,
            "quarantine",
            from,
            |id, record| QuarantineEntry { id, record },
            f,
        )
    }

    /// One audit entry by index.
    pub fn audit_entry(&self, index: u64) -> Result<Option<AuditEntry>, StoreError> {
        self.get(AUDIT, "audit", index, |index, record| AuditEntry {
            index,
            record,
        })
    }

    /// One effect by offset.
    pub fn effect(&self, offset: u64) -> Result<Option<Effect>, StoreError> {
        self.get(EFFECTS, "effects", offset, |offset, record| Effect {
            offset,
            record,
        })
    }

    /// One quarantined message by id.
    pub fn quarantined(&self, id: u64) -> Result<Option<QuarantineEntry>, StoreError> {
        self.get(QUARANTINE, "quarantine", id, |id, record| QuarantineEntry {
            id,
            record,
        })
    }

    fn get<R: serde::de::DeserializeOwned, T>(
        &self,
        table: redb::TableDefinition<u64, &[u8]>,
        name: &'static str,
        key: u64,
        make: impl Fn(u64, R) -> T,
    ) -> Result<Option<T>, StoreError> {
        let t = self.0.open_table(table).map_err(r)?;
        let Some(v) = t.get(key).map_err(r)? else {
            return Ok(None);
        };
        Ok(Some(make(key, decode(name, key, v.value())?)))
    }

    /// Streams the records of a `u64`-keyed log table from key `from` on.
    fn scan<R: serde::de::DeserializeOwned, T, E: From<StoreError>>(
        &self,
        table: redb::TableDefinition<u64, &[u8]>,
        name: &'static str,
        from: u64,
        make: impl Fn(u64, R) -> T,
        mut f: impl FnMut(T) -> Result<ControlFlow<()>, E>,
    ) -> Result<(), E> {
        let t = self.0.open_table(table).map_err(r)?;
        for item in t.range(from..).map_err(r)? {
            let (k, v) = item.map_err(r)?;
            let record = decode(name, k.value(), v.value()).map_err(StoreError::from)?;
            if f(make(k.value(), record))?.is_break() {
                break;
            }
        }
        Ok(())
    }
}
