//! Read-only views of the store for inspectors (`dump-*`, `verify`, `stats`, the relay, the
//! metrics endpoint, tests): a redb file opened read-only in the `MultiWriter` mode every handle
//! shares, so they work while `run` or `ingest` is writing it, or a PostgreSQL schema through
//! pooled read views. They stream: one record in memory at a time.

use std::ops::ControlFlow;
use std::path::Path;

use redb::{
    DatabaseError, ReadOnlyDatabase, ReadTransaction, ReadableDatabase, ReadableTableMetadata,
};

use super::guard::{self, Handle};
use super::postgres::PgConfig;
use super::postgres::view::{PgView, ViewPool};
use super::tables::*;
use super::{StoreError, builder};
use crate::model::{Outcome, OutcomeCounts};

/// A read-only handle that follows a live writer's commits.
pub struct Reader {
    db: Source,
}

enum Source {
    /// Poisoned once redb panicked on a damaged page.
    Redb(Handle<ReadOnlyDatabase>),
    /// A file left needing crash recovery that this user may not write: recovered in memory
    /// (`writer_check::recovered_in_memory`), the file untouched. It does not follow later
    /// commits.
    Recovered(Handle<redb::Database>),
    /// Each snapshot is a transaction on a connection of its own, reused by later ones.
    Pg(Box<PgConfig>, std::sync::Arc<ViewPool>),
}

/// How long an inspector waits for a file left needing crash recovery to be recovered by a
/// writer opening it meanwhile (or by another inspector).
const RECOVERY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

impl Reader {
    /// A read-only handle on the file at `path`. A file a killed writer left needing crash
    /// recovery (which a read-only open cannot do) is recovered first, when no other process
    /// has it open: by redb's own recovery on disk, as the next writer would do (the last
    /// commit's state, nothing of it changed), said in one warning; where this user may not
    /// write the file, in memory only (nothing written; such a reader does not follow later
    /// commits). While another process has it open (a writer starting, which recovers it),
    /// nothing is changed: the open waits for that, at most `RECOVERY_WAIT`.
    pub fn open(path: &Path) -> Result<Reader, StoreError> {
        let deadline = std::time::Instant::now() + RECOVERY_WAIT;
        loop {
            match Reader::open_read_only(path) {
                Err(StoreError::NeedsRecovery(_)) => {}
                other => return other,
            }
            match Reader::recover(path)? {
                Recovery::OnDisk => {
                    tracing::warn!(
                        path = %path.display(),
                        "{} was left needing crash recovery (a writer was killed or lost \
                         power): recovered it as the next writer would (redb's recovery of \
                         the last commit; no record changed)",
                        path.display()
                    );
                }
                Recovery::InMemory(db) => {
                    tracing::warn!(
                        path = %path.display(),
                        "{} needs crash recovery (a writer was killed or lost power) and this \
                         user may not write it: read as recovered in memory, nothing written \
                         (the service's next start recovers the file)",
                        path.display()
                    );
                    return Ok(Reader {
                        db: Source::Recovered(Handle::new(db)),
                    });
                }
                Recovery::InUse if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Recovery::InUse => return Err(StoreError::NeedsRecovery(path.to_path_buf())),
            }
        }
    }

    /// Recovers a file left needing crash recovery, if no other process has it open.
    fn recover(path: &Path) -> Result<Recovery, StoreError> {
        let (backend, _) = match super::file::open_existing(path, true) {
            Ok(b) => b,
            Err(StoreError::Denied(_)) => {
                return Ok(Recovery::InMemory(
                    super::writer_check::recovered_in_memory(path)?,
                ));
            }
            Err(StoreError::Open {
                error: DatabaseError::Storage(redb::StorageError::Io(e)),
                ..
            }) if e.kind() == std::io::ErrorKind::ReadOnlyFilesystem => {
                return Ok(Recovery::InMemory(
                    super::writer_check::recovered_in_memory(path)?,
                ));
            }
            Err(e) => return Err(e),
        };
        // redb's exclusive mode locks every byte of the file: it opens only when no other
        // process has the file open (a writer, a reader, an operator), and keeps a feed
        // writer out while it recovers.
        let opened = guard::catch(|| {
            let mut b = redb::Builder::new();
            b.set_cache_size(16 * 1024 * 1024)
                .set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter);
            match b.create_with_backend(backend) {
                // Closed at once: redb saves the allocator state, so the next open needs no
                // recovery.
                Ok(db) => {
                    drop(db);
                    Ok(Recovery::OnDisk)
                }
                Err(DatabaseError::DatabaseAlreadyOpen) => Ok(Recovery::InUse),
                Err(error) => Err(StoreError::Open {
                    path: path.to_path_buf(),
                    error,
                }),
            }
        })?;
        opened.map_err(StoreError::classify)
    }

    fn open_read_only(path: &Path) -> Result<Reader, StoreError> {
        // Probed before any open: opening a FIFO read-only would block.
        match super::file::probe(path)? {
            super::file::Found::Missing => return Err(StoreError::missing(path)),
            super::file::Found::Empty => return Err(StoreError::Empty(path.to_path_buf())),
            super::file::Found::File => {}
        }
        let opened = guard::catch(|| {
            let (backend, _) = super::file::open_existing(path, false)?;
            builder(16 * 1024 * 1024, super::Concurrency::default())
                .open_read_only_with_backend(backend)
                .map_err(|e| match e {
                    DatabaseError::RepairAborted => StoreError::NeedsRecovery(path.to_path_buf()),
                    error => StoreError::Open {
                        path: path.to_path_buf(),
                        error,
                    },
                })
        })?;
        let db = opened.map_err(StoreError::classify)?;
        Ok(Reader {
            db: Source::Redb(Handle::new(db)),
        })
    }

    /// A reader of a PostgreSQL store; its first snapshot is taken here, so an unreachable
    /// server or a missing schema is reported at once.
    pub fn postgres(cfg: PgConfig) -> Result<(Reader, Snapshot), StoreError> {
        let pool = std::sync::Arc::new(ViewPool::default());
        let first = Snapshot::postgres(PgView::pooled(&cfg, &pool)?);
        first.meta()?;
        Ok((
            Reader {
                db: Source::Pg(Box::new(cfg), pool),
            },
            first,
        ))
    }

    /// A snapshot of the latest commit.
    pub fn begin(&self) -> Result<Snapshot, StoreError> {
        match &self.db {
            Source::Redb(db) => {
                db.guard(|db| db.begin_read().map(Snapshot::new).map_err(StoreError::redb))
            }
            Source::Recovered(db) => {
                db.guard(|db| db.begin_read().map(Snapshot::new).map_err(StoreError::redb))
            }
            Source::Pg(cfg, pool) => Ok(Snapshot::postgres(PgView::pooled(cfg, pool)?)),
        }
    }
}

/// What `Reader::recover` did.
enum Recovery {
    OnDisk,
    /// This user may not write the file: recovered in memory.
    InMemory(redb::Database),
    /// Another process has the file open.
    InUse,
}

/// A consistent view of one commit: later commits by the writer are not seen through it.
/// Every method runs under the panic guard; a redb panic poisons the snapshot.
pub struct Snapshot(View);

/// A snapshot of one backend (on redb, with the audit entries' chain hashes it read last,
/// for the next entry read alone: `Opened::get_remembering`).
enum View {
    Redb(Handle<ReadTransaction>, ChainHashes),
    Pg(Box<PgView>),
}

impl Snapshot {
    pub(super) fn new(txn: ReadTransaction) -> Snapshot {
        Snapshot(View::Redb(Handle::new(txn), ChainHashes::default()))
    }

    /// A view of a PostgreSQL store.
    pub fn postgres(view: PgView) -> Snapshot {
        Snapshot(View::Pg(Box::new(view)))
    }

    /// Whether this is a view of a PostgreSQL store.
    pub fn is_postgres(&self) -> bool {
        self.pg().is_some()
    }

    /// The PostgreSQL view, if this is one.
    pub(super) fn pg(&self) -> Option<&PgView> {
        match &self.0 {
            View::Pg(v) => Some(v),
            View::Redb(..) => None,
        }
    }

    /// Runs `f` on the redb transaction under the panic guard. A read only redb has (a
    /// file's table sizes) is refused on PostgreSQL.
    pub(super) fn guard<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&ReadTransaction) -> Result<R, E>,
    ) -> Result<R, E> {
        match &self.0 {
            View::Redb(h, _) => h.guard(f),
            View::Pg(_) => Err(StoreError::Refused(
                "this view is not available on the PostgreSQL backend".into(),
            )
            .into()),
        }
    }
}

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
    /// Whether `hash` matches the entry's content and `prev_hash`. Always, for an entry that
    /// stores no hash (record version 3 on: it reads with the hash of its content); an edit
    /// of such an entry breaks the next link that is stored (the next entry's `prev_hash`,
    /// from record version 4 the next that stores it, or the chain head), which `verify`
    /// checks.
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
        if let Some(pg) = self.pg() {
            return pg
                .meta_row(META)?
                .ok_or_else(|| META.missing("missing: not a replay-guard schema").into());
        }
        self.guard(|txn| {
            META.read(txn)?
                .ok_or_else(|| META.missing("missing: not a replay-guard database").into())
        })
    }

    /// The store's identity (`store::identity`); `None` for a store made before ids that no
    /// writer of this version has opened yet.
    pub fn identity(&self) -> Result<Option<StoreIdentity>, StoreError> {
        if let Some(pg) = self.pg() {
            return pg.meta_row(IDENTITY);
        }
        self.guard(|txn| IDENTITY.read(txn))
    }

    /// What retention has removed so far (all zero if nothing).
    pub fn retention_marks(&self) -> Result<RetentionMarks, StoreError> {
        if let Some(pg) = self.pg() {
            return Ok(pg.meta_row(RETENTION)?.unwrap_or_default());
        }
        self.guard(|txn| Ok(RETENTION.read(txn)?.unwrap_or_default()))
    }

    /// What was lost upstream of the store (`store::upstream`): gap events and lost broker
    /// sessions, totals, the last hour by minute, the newest events (all empty before the
    /// first). One point read.
    pub fn upstream_losses(&self) -> Result<UpstreamLosses, StoreError> {
        if let Some(pg) = self.pg() {
            return Ok(pg.meta_row(UPSTREAM)?.unwrap_or_default());
        }
        self.guard(|txn| Ok(UPSTREAM.read(txn)?.unwrap_or_default()))
    }

    /// Audit entries per outcome since the database was created (`None` for a database no
    /// writer of this version has opened yet).
    pub fn counters(&self) -> Result<Option<OutcomeCounts>, StoreError> {
        let counters = match self.pg() {
            Some(pg) => pg.meta_row(COUNTS)?,
            None => self.guard(|txn| COUNTS.read(txn))?,
        };
        Ok(counters.map(|c| OutcomeCounts::from_array(c.by_outcome)))
    }

    /// Audit entries per outcome recorded at or after `since_ms` (a backward scan from the
    /// newest entry, stopping at the first older one).
    pub fn counts_since(&self, since_ms: u64) -> Result<OutcomeCounts, StoreError> {
        if let Some(pg) = self.pg() {
            let mut counts = OutcomeCounts::default();
            pg.audit_heads_newest_first(|_, head| {
                if head.recorded_at_ms < since_ms {
                    return ControlFlow::Break(());
                }
                if let Some(o) = Outcome::from_code(head.outcome) {
                    counts.add(o);
                }
                ControlFlow::Continue(())
            })?;
            return Ok(counts);
        }
        self.guard(|txn| {
            let t = AUDIT.open(txn)?;
            let mut counts = OutcomeCounts::default();
            for entry in t.heads::<AuditHead>(..)?.rev() {
                let (_, head) = entry?;
                if head.recorded_at_ms < since_ms {
                    break;
                }
                if let Some(o) = Outcome::from_code(head.outcome) {
                    counts.add(o);
                }
            }
            Ok(counts)
        })
    }

    /// When the newest audit entry was recorded (`None`: the log is empty).
    pub fn newest_audit_ms(&self) -> Result<Option<u64>, StoreError> {
        let mut newest = None;
        if let Some(pg) = self.pg() {
            pg.audit_heads_newest_first(|_, head| {
                newest = Some(head.recorded_at_ms);
                ControlFlow::Break(())
            })?;
            return Ok(newest);
        }
        self.guard(|txn| {
            let t = AUDIT.open(txn)?;
            if let Some(entry) = t.heads::<AuditHead>(..)?.next_back() {
                newest = Some(entry?.1.recorded_at_ms);
            }
            Ok(newest)
        })
    }

    /// Every source with its marks, in source-number order.
    pub fn sources(&self) -> Result<Vec<SourceRecord>, StoreError> {
        if let Some(pg) = self.pg() {
            return pg.all(SOURCES);
        }
        self.guard(|txn| {
            let t = SOURCES.open(txn)?;
            t.all()?.map(|entry| entry.map(|(_, r)| r)).collect()
        })
    }

    /// When the oldest effect still in the window was received (`None`: empty window).
    pub fn oldest_in_window_ms(&self) -> Result<Option<u64>, StoreError> {
        if let Some(pg) = self.pg() {
            let m = self.meta()?;
            if m.window_start >= m.next_effect {
                return Ok(None);
            }
            return Ok(pg
                .first_effect_head(m.window_start)?
                .map(|h| h.received_at_ms));
        }
        self.guard(|txn| {
            let m = self.meta()?;
            if m.window_start >= m.next_effect {
                return Ok(None);
            }
            let t = EFFECTS.open(txn)?;
            let first = t
                .heads::<EffectHead>(m.window_start..)?
                .next()
                .transpose()?;
            Ok(first.map(|(_, head)| head.received_at_ms))
        })
    }

    /// Bytes each table takes in the file: (name, stored, metadata + fragmentation).
    pub fn table_sizes(&self) -> Result<Vec<(&'static str, u64, u64)>, StoreError> {
        if let Some(pg) = self.pg() {
            return pg.table_sizes();
        }
        self.guard(|txn| {
            let mut out = Vec::new();
            // A name given twice adds to its line (the window's three tables are one line).
            let mut add = |name: &'static str, s: redb::TableStats| {
                let (stored, other) = (s.stored_bytes(), s.metadata_bytes() + s.fragmented_bytes());
                match out.iter_mut().find(|(n, _, _)| *n == name) {
                    Some((_, a, b)) => {
                        *a += stored;
                        *b += other;
                    }
                    None => out.push((name, stored, other)),
                }
            };
            add(AUDIT.name(), AUDIT.open(txn)?.stats().map_err(r)?);
            // Absent from a file of an older schema no writer has opened since.
            // Each index's packed merged rows count on its line.
            for (name, def) in [
                ("audit_keys", AUDIT_KEYS_PACKED),
                ("audit_sources", AUDIT_SOURCES_PACKED),
            ] {
                let stats = match name {
                    "audit_keys" => txn.open_table(AUDIT_KEYS).map(|t| t.stats()),
                    _ => txn.open_table(AUDIT_SOURCES).map(|t| t.stats()),
                };
                match stats {
                    Ok(s) => add(name, s.map_err(r)?),
                    Err(redb::TableError::TableDoesNotExist(_)) => {}
                    Err(e) => return Err(StoreError::redb(e)),
                }
                match txn.open_table(def) {
                    Ok(t) => add(name, t.stats().map_err(r)?),
                    Err(redb::TableError::TableDoesNotExist(_)) => {}
                    Err(e) => return Err(StoreError::redb(e)),
                }
            }
            add(EFFECTS.name(), EFFECTS.open(txn)?.stats().map_err(r)?);
            add(WINDOW.name(), WINDOW.open(txn)?.stats().map_err(r)?);
            if let Some(t) = WINDOW_RECENT.open_if_present(txn)? {
                add(WINDOW.name(), t.stats().map_err(r)?);
            }
            match txn.open_table(WINDOW_GONE) {
                Ok(t) => add(WINDOW.name(), t.stats().map_err(r)?),
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(StoreError::redb(e)),
            }
            add(QUARANTINE.name(), QUARANTINE.open(txn)?.stats().map_err(r)?);
            add(SOURCES.name(), SOURCES.open(txn)?.stats().map_err(r)?);
            Ok(out)
        })
    }

    /// Every recorded replay burst, oldest first (a handful per failover).
    pub fn replay_bursts(&self) -> Result<Vec<BurstRecord>, StoreError> {
        if let Some(pg) = self.pg() {
            return pg.all(REPLAY_BURSTS);
        }
        self.guard(|txn| {
            // Absent from a database last written before bursts were recorded.
            let Some(t) = REPLAY_BURSTS.open_if_present(txn)? else {
                return Ok(Vec::new());
            };
            t.all()?.map(|entry| entry.map(|(_, r)| r)).collect()
        })
    }

    pub fn summary(&self) -> Result<StoreSummary, StoreError> {
        if let Some(pg) = self.pg() {
            let m = self.meta()?;
            return Ok(StoreSummary {
                audit_entries: m.next_audit,
                effects: m.next_effect,
                window_entries: pg.count(WINDOW.pg_table())?,
                quarantined: pg.count(QUARANTINE.pg_table())?,
                sources: m.next_source,
                chain_head: m.chain_head,
            });
        }
        self.guard(|txn| {
            let m = self.meta()?;
            let recent = match WINDOW_RECENT.open_if_present(txn)? {
                Some(t) => t.len().map_err(r)?,
                None => 0,
            };
            // Every position of `WINDOW_GONE` is in `WINDOW`, no longer in the window.
            let gone = match txn.open_table(WINDOW_GONE) {
                Ok(t) => t.len().map_err(r)?,
                Err(redb::TableError::TableDoesNotExist(_)) => 0,
                Err(e) => return Err(StoreError::redb(e)),
            };
            // And the entries of the effects evicted since the last merge, until it deletes
            // them (`Meta::window_purged`; fewer if a release had replaced one already).
            let evicted = m.window_start.saturating_sub(m.window_purged);
            let window_entries = (WINDOW.open(txn)?.len().map_err(r)? + recent)
                .saturating_sub(gone)
                .saturating_sub(evicted);
            Ok(StoreSummary {
                audit_entries: m.next_audit,
                effects: m.next_effect,
                window_entries,
                quarantined: QUARANTINE.open(txn)?.len().map_err(r)?,
                sources: m.next_source,
                chain_head: m.chain_head,
            })
        })
    }

    /// Calls `f` with each audit entry from index `from` on, until it breaks.
    pub fn scan_audit<E: From<StoreError>>(
        &self,
        from: u64,
        f: impl FnMut(AuditEntry) -> Result<ControlFlow<()>, E>,
    ) -> Result<(), E> {
        self.scan(AUDIT, from, |index, record| AuditEntry { index, record }, f)
    }

    /// Calls `f` with each effect from offset `from` on, until it breaks.
    pub fn scan_effects<E: From<StoreError>>(
        &self,
        from: u64,
        f: impl FnMut(Effect) -> Result<ControlFlow<()>, E>,
    ) -> Result<(), E> {
        self.scan(EFFECTS, from, |offset, record| Effect { offset, record }, f)
    }

    /// Calls `f` with each quarantined message from id `from` on, until it breaks.
    pub fn scan_quarantine<E: From<StoreError>>(
        &self,
        from: u64,
        f: impl FnMut(QuarantineEntry) -> Result<ControlFlow<()>, E>,
    ) -> Result<(), E> {
        self.scan(
            QUARANTINE,
            from,
            |id, record| QuarantineEntry { id, record },
            f,
        )
    }

    /// Whether the audit entry stored at `index` holds its `prev_hash` (every entry but one
    /// of record version 4 that leaves it to the entry before it; `true` when there is none).
    pub fn audit_holds_prev_hash(&self, index: u64) -> Result<bool, StoreError> {
        if self.pg().is_some() {
            return Ok(true);
        }
        self.guard(|txn| {
            let opened = AUDIT.open(txn)?;
            let raw: &ReadOnly<u64> = &opened;
            Ok(!raw
                .get(index)?
                .is_some_and(|g| audit_leaves_prev_hash(g.value())))
        })
    }

    /// Where an edit that shows at the link into entry `index` (its stored `prev_hash`, or
    /// the chain head for `index` = the next index) can be: from the returned index to
    /// `index - 1`. Entries that leave their `prev_hash` to the entry before them (audit
    /// record version 4) pass an edit of that entry on to the next that holds its own: the
    /// span goes back over them, to the first that holds it (at most
    /// `stored::AUDIT_CHECKPOINT` back).
    pub fn audit_link_span(&self, index: u64) -> Result<u64, StoreError> {
        let last = index.saturating_sub(1);
        if self.pg().is_some() {
            return Ok(last);
        }
        self.guard(|txn| {
            let opened = AUDIT.open(txn)?;
            let raw: &ReadOnly<u64> = &opened;
            let mut at = last;
            // As far back as a reader follows them (a file that stores none stops there).
            let floor = last.saturating_sub(CHAIN_WALK_LIMIT);
            while at > floor {
                match raw.get(at)? {
                    Some(g) if audit_leaves_prev_hash(g.value()) => at -= 1,
                    _ => break,
                }
            }
            Ok(at)
        })
    }

    /// One audit entry by index.
    pub fn audit_entry(&self, index: u64) -> Result<Option<AuditEntry>, StoreError> {
        self.get(AUDIT, index, |index, record| AuditEntry { index, record })
    }

    /// One effect by offset.
    pub fn effect(&self, offset: u64) -> Result<Option<Effect>, StoreError> {
        self.get(EFFECTS, offset, |offset, record| Effect { offset, record })
    }

    /// One quarantined message by id.
    pub fn quarantined(&self, id: u64) -> Result<Option<QuarantineEntry>, StoreError> {
        self.get(QUARANTINE, id, |id, record| QuarantineEntry { id, record })
    }

    /// The fingerprint stored beside quarantined message `id` when it was quarantined.
    /// `None` also for a database last written before that table existed.
    pub fn quarantine_fingerprint(&self, id: u64) -> Result<Option<[u8; 32]>, StoreError> {
        if let Some(pg) = self.pg() {
            return pg.quarantine_fingerprint(id);
        }
        self.guard(|txn| {
            let t = match txn.open_table(QUARANTINE_FP_BY_ID) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(r(e)),
            };
            Ok(t.get(id).map_err(r)?.map(|g| *g.value()))
        })
    }

    fn get<R: Record, T>(
        &self,
        table: Records<u64, R>,
        key: u64,
        make: impl Fn(u64, R) -> T,
    ) -> Result<Option<T>, StoreError> {
        let record = match &self.0 {
            View::Pg(pg) => pg.get(table, key)?,
            View::Redb(h, chain) => h.guard(|txn| table.open(txn)?.get_remembering(key, chain))?,
        };
        Ok(record.map(|r| make(key, r)))
    }

    /// Streams the records of a `u64`-keyed log table from key `from` on.
    fn scan<R: Record, T, E: From<StoreError>>(
        &self,
        table: Records<u64, R>,
        from: u64,
        make: impl Fn(u64, R) -> T,
        mut f: impl FnMut(T) -> Result<ControlFlow<()>, E>,
    ) -> Result<(), E> {
        if let Some(pg) = self.pg() {
            return pg.scan(table, from, |k, r| f(make(k, r)));
        }
        self.guard(|txn| {
            let t = table.open(txn)?;
            for entry in t.range(from..)? {
                let (k, record) = entry?;
                if f(make(k.value(), record))?.is_break() {
                    break;
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Store, StoreOptions};
    use crate::testing::{T0, feed};

    /// A copy of a file taken while its writer has it open: its header says a writer is in
    /// it, as after a `kill -9`, and no process holds it.
    fn left_by_a_killed_writer(dir: &Path) -> std::path::PathBuf {
        let live = dir.join("live.redb");
        let mut store = Store::open(&live, StoreOptions::default(), T0).unwrap();
        feed(&mut store, 1..=5, T0);
        let copy = dir.join("crashed.redb");
        std::fs::copy(&live, &copy).unwrap();
        drop(store);
        assert!(
            matches!(
                Reader::open_read_only(&copy),
                Err(StoreError::NeedsRecovery(_))
            ),
            "the copy needs crash recovery"
        );
        copy
    }

    #[test]
    fn an_inspector_recovers_a_file_no_process_has_open_and_reads_the_last_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = left_by_a_killed_writer(dir.path());
        let reader = Reader::open(&path).unwrap();
        assert_eq!(reader.begin().unwrap().summary().unwrap().effects, 5);
        drop(reader);
        // Recovered on disk: a read-only open needs nothing more.
        let again = Reader::open_read_only(&path).unwrap();
        assert_eq!(again.begin().unwrap().summary().unwrap().effects, 5);
    }

    #[test]
    fn a_file_this_user_may_not_write_is_recovered_in_memory_and_left_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = left_by_a_killed_writer(dir.path());
        let before = std::fs::read(&path).unwrap();
        let db = super::super::writer_check::recovered_in_memory(&path).unwrap();
        let reader = Reader {
            db: Source::Recovered(Handle::new(db)),
        };
        assert_eq!(reader.begin().unwrap().summary().unwrap().effects, 5);
        drop(reader);
        assert_eq!(std::fs::read(&path).unwrap(), before, "nothing written");
        assert!(matches!(
            Reader::open_read_only(&path),
            Err(StoreError::NeedsRecovery(_))
        ));
    }

    #[test]
    fn while_another_process_has_the_file_open_nothing_is_recovered() {
        let dir = tempfile::tempdir().unwrap();
        let path = left_by_a_killed_writer(dir.path());
        // A writer (an operator's, which recovers the file at its open) has it open.
        let writer = Store::open_operator(&path, StoreOptions::default()).unwrap();
        let before = std::fs::read(&path).unwrap();
        assert!(matches!(Reader::recover(&path), Ok(Recovery::InUse)));
        assert_eq!(std::fs::read(&path).unwrap(), before);
        drop(writer);
    }
}
