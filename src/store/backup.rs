//! `backup`: a consistent copy of a redb database into a new file, taken from one read
//! transaction while `run` keeps committing (a file copy of a live database can mix pages of
//! two commits). Every table of `tables::for_each_table` is copied record by record, the same
//! bytes, into `FILE.partial`, committed durably, then linked to `FILE` (never replacing one)
//! and the directory synced. The caller verifies the copy.

use std::fs::OpenOptions;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use redb::{Durability, Key, ReadTransaction, ReadableTable, WriteTransaction};

use super::guard::Leak;
use super::tables::*;
use super::{Concurrency, FILE_MODE, Reader, StoreError, builder, file};

/// What a backup copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    /// Records copied, per redb table, in `for_each_table` order.
    pub tables: Vec<(String, u64)>,
    /// The copied snapshot's meta record (its chain head, counters, window start).
    pub meta: Meta,
    /// The backup file's size.
    pub bytes: u64,
}

impl BackupReport {
    pub fn rows(&self, table: &str) -> u64 {
        self.tables
            .iter()
            .find(|(t, _)| t == table)
            .map_or(0, |(_, n)| *n)
    }
}

/// `to` with `.partial` added to its file name: where the copy is built.
pub fn partial_path(to: &Path) -> PathBuf {
    let mut name = to.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    to.with_file_name(name)
}

/// Copies the latest commit of the database at `from` into a new file `to` (refused if
/// anything stands there), mode 0600. Works beside a running writer: the copy is the state
/// of one commit, marked as a copy made at `made_at_ms` (`store::identity`). `cache_bytes`
/// bounds the new file's page cache.
pub fn backup(
    from: &Path,
    to: &Path,
    cache_bytes: usize,
    made_at_ms: u64,
) -> Result<BackupReport, StoreError> {
    if std::fs::symlink_metadata(to).is_ok() {
        return Err(StoreError::Refused(format!(
            "{} already exists: a backup never replaces a file (pick a new name, or move the \
             old backup away)",
            to.display()
        )));
    }
    let reader = Reader::open(from)?;
    let partial = partial_path(to);
    let created = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(&partial);
    let f = match created {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(StoreError::Refused(format!(
                "{} exists: another backup to {} is running, or one was interrupted (then \
                 remove it)",
                partial.display(),
                to.display()
            )));
        }
        Err(e) => return Err(file::io_error(&partial, e)),
    };
    let result = (|| -> Result<BackupReport, StoreError> {
        // The umask may have taken bits from the mode but never adds any: set it exactly.
        f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
            .map_err(|e| file::io_error(&partial, e))?;
        let snapshot = reader.begin()?;
        let (tables, meta) = copy_into(&snapshot, f, &partial, cache_bytes, made_at_ms)?;
        // redb fsynced its commit; the file's length and metadata, and then the new name in
        // the directory, are made durable here.
        let io = |e| file::io_error(to, e);
        std::fs::File::open(&partial)
            .and_then(|f| f.sync_all())
            .map_err(io)?;
        std::fs::hard_link(&partial, to).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                StoreError::Refused(format!(
                    "{} appeared while the backup was being written: it is left as it is",
                    to.display()
                ))
            } else {
                io(e)
            }
        })?;
        let bytes = std::fs::metadata(to).map_err(io)?.len();
        Ok(BackupReport {
            tables,
            meta,
            bytes,
        })
    })();
    // The partial file is this call's own (created above with O_EXCL): gone either way.
    let removed = std::fs::remove_file(&partial);
    let report = result?;
    removed.map_err(|e| file::io_error(&partial, e))?;
    let dir = match to.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| file::io_error(to, e))?;
    Ok(report)
}

/// Writes every table of `snapshot` into a new database in `f`, in one durable write
/// transaction; the rows per table and the snapshot's meta record.
fn copy_into(
    snapshot: &super::Snapshot,
    f: std::fs::File,
    path: &Path,
    cache_bytes: usize,
    made_at_ms: u64,
) -> Result<(Vec<(String, u64)>, Meta), StoreError> {
    let backend = redb::backends::FileBackend::new(f).map_err(|error| StoreError::Open {
        path: path.to_path_buf(),
        error,
    })?;
    let db = builder(cache_bytes, Concurrency::default())
        .create_with_backend(backend)
        .map_err(|error| StoreError::Open {
            path: path.to_path_buf(),
            error,
        })?;
    // Leaked if a redb panic (a damaged page of the source) unwinds through here.
    let db = Leak::new(db);
    let copied = snapshot.guard(|from| {
        let unlisted = unlisted_tables(from)?;
        if !unlisted.is_empty() {
            return Err(StoreError::Refused(format!(
                "the database holds tables this build does not know ({}): back it up with the \
                 build that wrote it",
                unlisted.join(", ")
            )));
        }
        let meta = META
            .read(from)?
            .ok_or_else(|| META.missing("missing: not a replay-guard database"))?;
        let mut txn = Leak::new(db.begin_write()?);
        txn.set_durability(Durability::Immediate)
            .map_err(StoreError::Durability)?;
        txn.set_quick_repair(true);
        let mut copy = ToFile {
            from,
            to: &txn,
            rows: Vec::new(),
        };
        for_each_table(&mut copy)?;
        let rows = copy.rows;
        // The file is a copy: when it is restored, its first writer draws an id of its own.
        if let Some(identity) =
            super::identity::copied(IDENTITY.read(from)?, "backup", made_at_ms, meta.next_effect)
        {
            let mut t = Leak::new(txn.open_table(META_TABLE)?);
            IDENTITY.put(&mut t, &identity, &mut Vec::new())?;
        }
        txn.into_inner().commit()?;
        Ok((rows, meta))
    });
    let copied = match copied {
        Ok(c) => c,
        // A write transaction was leaked in the unwind: the handle is not closed either.
        Err(e @ StoreError::Damaged(_)) => {
            std::mem::forget(db);
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    // Saves the allocator state, so opening the backup needs no repair.
    db.into_inner()
        .close()
        .map_err(|e| StoreError::from(redb::Error::from(e)))?;
    Ok(copied)
}

/// Copies each table of a read transaction into a write transaction of another file.
struct ToFile<'a> {
    from: &'a ReadTransaction,
    to: &'a WriteTransaction,
    rows: Vec<(String, u64)>,
}

impl CopyTable for ToFile<'_> {
    fn table<K: Cells + Key, V: Cells>(&mut self, t: WholeTable<K, V>) -> Result<(), StoreError> {
        // Absent from a database last written before the table existed: absent here too. A
        // table of an older schema is copied under the name it has there (the copy keeps the
        // source's schema; its first writer upgrades it).
        let Some(source) = t.open_in(self.from)? else {
            return Ok(());
        };
        let name = redb::TableHandle::name(&source).to_string();
        let mut target = Leak::new(
            self.to
                .open_table(redb::TableDefinition::<K, V>::new(&name))?,
        );
        let mut n = 0;
        for item in source.iter()? {
            let (k, v) = item?;
            target.insert(k.value(), v.value())?;
            n += 1;
        }
        drop(target.into_inner());
        // Counted under the table's name in this schema, whatever the source called it.
        self.rows
            .push((redb::TableHandle::name(&t.def).to_string(), n));
        Ok(())
    }
}
