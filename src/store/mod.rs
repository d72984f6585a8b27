//! The store, on either backend: a redb file (`Store`) or a PostgreSQL schema
//! (`postgres::PgStore`), behind `Backend` for the feed writers. Both commit a batch through
//! the one write path, `engine::Writer::decide_batch`: every message decided with
//! `decide::decide`, its window entry, effect, quarantine record and audit entry written in the
//! backend's one durable write transaction (`Tx`). `read` holds the read-only views used by
//! inspectors, on either backend.

mod audit;
pub(crate) mod backup;
mod engine;
mod file;
pub use file::{DiskSpace, SinkLocks, disk_space};
mod guard;
pub(crate) mod identity;
pub mod index_merge;
pub(crate) mod ledger;
pub(crate) mod lookup;
mod operator;
pub mod postgres;
mod read;
mod redb_tx;
pub mod relay;
mod retention;
mod stored;
pub mod tables;
pub(crate) mod tx;
pub(crate) mod upgrade;
pub mod upstream;
pub mod verify;
mod writer_check;

use std::path::{Path, PathBuf};

use redb::{
    Builder, ConcurrencyMode, Database, DatabaseError, Durability, ReadableDatabase,
    StorageBackend, WriteTransaction,
};

use crate::decide::OutOfOrder;
use crate::model::{IdempotencyKey, Outcome, OutcomeCounts};
pub use crate::wire::Incoming;
pub use audit::body_fields as audit_body_fields;
pub use audit::entry_hash as audit_entry_hash;
use engine::Writer;
use guard::Leak;
pub use guard::install_panic_hook;
pub use operator::{Resolution, compact};
pub use read::{AuditEntry, Effect, QuarantineEntry, Reader, Snapshot};
use redb_tx::RedbTx;
pub use retention::{LogRetention, PruneCounts, RetentionPolicy};
use tables::*;
pub use writer_check::check_writer_open;

/// Who holds the feed writer's lock on the database file at `path` (" (PID n: command)" or
/// ""), if anyone: `run` or `ingest` is writing it.
pub fn feed_writer(path: &Path) -> Result<Option<String>, StoreError> {
    file::feed_lock_holder(path)
}

/// Default redb page cache: bounds the process's memory whatever the window size.
pub const DEFAULT_CACHE_BYTES: usize = 32 * 1024 * 1024;

/// Bounds of the dedup window. Age counts from first sight; a duplicate does not refresh it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowPolicy {
    pub seconds: u64,
    pub max_entries: u64,
}

impl Default for WindowPolicy {
    fn default() -> Self {
        WindowPolicy {
            seconds: 600,
            max_entries: 1_000_000,
        }
    }
}

#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub cache_bytes: usize,
    pub window: WindowPolicy,
    pub out_of_order: OutOfOrder,
    /// redb's concurrency mode. `MultiWriter` (the default, and what every command uses) lets
    /// an operator command such as `quarantine release` write while `run` holds the file;
    /// `SingleWriter` exists only so the benchmark can measure what that costs.
    pub concurrency: Concurrency,
    /// What the logs keep; pruned a bounded slice at a time inside `commit_batch`.
    pub retention: RetentionPolicy,
    /// `--new-database`: the operator asks for a new, empty database, so `Store::open` may
    /// replace a zero-length file (and refuses a file that holds data). Without it a
    /// zero-length file is refused: it is a truncated database whose window would be lost.
    pub new_database: bool,
    /// redb: how many of the window's newest entries gather in their own small table
    /// before they move into the window's main table together (`tables::WINDOW_RECENT`).
    /// Not configurable by operators; tests set it low to move entries often.
    pub window_merge_at: u64,
    /// redb: how many sources' new window entries one write transaction writes straight
    /// into the window's main table rather than its small table (`redb_tx::DIRECT_SOURCES`).
    /// Not configurable by operators; tests set it to 0 or 1 to send entries through the
    /// small table.
    pub window_direct_sources: usize,
    /// redb: blocks of the audit indexes per merged segment of a new store
    /// (`tables::IndexMerge`; a store keeps the size it was created with). Not configurable
    /// by operators; tests set it low to merge after a few thousand entries.
    pub index_segment_blocks: u64,
}

/// How many processes may write the database file at once (all its handles must agree).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Concurrency {
    /// Any number of writing processes; write transactions are serialised by a file lock.
    #[default]
    MultiWriter,
    /// One writing process (benchmark comparison only).
    SingleWriter,
}

impl Concurrency {
    fn mode(self) -> ConcurrencyMode {
        match self {
            Concurrency::MultiWriter => ConcurrencyMode::MultiWriter,
            Concurrency::SingleWriter => ConcurrencyMode::SingleWriter,
        }
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            cache_bytes: DEFAULT_CACHE_BYTES,
            window: WindowPolicy::default(),
            out_of_order: OutOfOrder::Apply,
            concurrency: Concurrency::default(),
            retention: RetentionPolicy::keep_all(),
            new_database: false,
            window_merge_at: tables::WINDOW_MERGE_AT,
            window_direct_sources: redb_tx::DIRECT_SOURCES,
            index_segment_blocks: tables::SEGMENT_BLOCKS,
        }
    }
}

/// `SinkBusy`'s other deliverer when nothing more is known.
pub(crate) const SINK_BUSY_BY: &str =
    "another process (a `run` whose config has this [[sink]], or a standalone `relay`)";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `holder` is empty or " (PID n: command)".
    #[error(
        "another process is writing {path}{holder}: stop it first (read-only commands work \
         meanwhile)"
    )]
    Busy { path: PathBuf, holder: String },
    /// `by` names the other deliverer as far as it is known, "another process (…)".
    #[error(
        "sink {sink:?} of {path} is already delivered by {by}: each sink runs in one place; \
         remove this [[sink]] from one of the two configs (the service's or the relay unit's) \
         or stop the other process"
    )]
    SinkBusy {
        path: PathBuf,
        sink: String,
        by: String,
    },
    #[error(
        "{path} is a {kind}, not a database file: give the path of a database (or of a new \
         one to create); nothing was changed"
    )]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error(
        "{0} is empty (0 bytes) where a database is expected (truncated by a crash or by \
         hand?): restore it from the backup; to start a new, empty database instead (its \
         dedup window and record are lost), remove the file or pass --new-database to `run` \
         or `ingest`"
    )]
    Empty(PathBuf),
    #[error(
        "--new-database: {0} already holds data, which is left as it is: drop \
         --new-database to open it, or move it away first"
    )]
    NotNew(PathBuf),
    #[error("cannot open database {path}: {error}")]
    Open { path: PathBuf, error: DatabaseError },
    /// The file, or a directory above it, may not be read (or written) by this user.
    #[error(
        "permission denied on {} (the file or a directory above it): run the command as \
         root (sudo) or as the user the service runs as",
        .0.display()
    )]
    Denied(PathBuf),
    #[error(
        "{0} needs crash recovery, and another process kept it open for 5 s without \
         recovering it (an inspector can recover it only while no other process has it \
         open): retry, or start the service, whose writer recovers it"
    )]
    NeedsRecovery(PathBuf),
    #[error("storage failure: {0}")]
    Storage(redb::Error),
    /// A write transaction could not be made durable (`Durability::Immediate`): nothing was
    /// written; not a damaged file.
    #[error("cannot make the write transaction durable: {0}; nothing was written")]
    Durability(redb::SetDurabilityError),
    #[error(
        "storage failure while committing a batch: {0}; none of the batch was acknowledged \
         (committed or not, a redelivery of it is decided once after the restart) \
         and the database refuses further writes: restart the process"
    )]
    CommitFailed(redb::Error),
    #[error("database damaged: {0}{DAMAGED_ADVICE}")]
    Record(RecordError),
    /// The file's structure is inconsistent: redb reported corruption, the file is shorter
    /// than its layout, or redb panicked on a page (caught at the store boundary).
    #[error("database damaged: {0}{DAMAGED_ADVICE}")]
    Damaged(String),
    #[error("database schema version {found} is not supported by this build (expects {expected})")]
    Schema { found: u32, expected: u32 },
    /// An operator action that cannot be carried out as asked; nothing was written.
    #[error("{0}")]
    Refused(String),
    /// The PostgreSQL server cannot be reached, or the connection was lost (also during a
    /// COMMIT, whose outcome is then unknown). Nothing of the batch was acknowledged.
    #[error(
        "PostgreSQL is unreachable ({0}): nothing of the batch was acknowledged (committed or \
         not, a redelivery of it is decided once)"
    )]
    Unreachable(String),
    /// The PostgreSQL server refused a statement.
    #[error("PostgreSQL refused a statement: {0}")]
    Postgres(String),
    /// The TLS handshake with PostgreSQL refused a certificate or host name: a configuration
    /// error (exit 1), never waited on as an outage.
    #[error(
        "PostgreSQL: {0}: a configuration error, not an outage (fix the dsn's host, \
         sslrootcert or sslcert/sslkey, or the server's certificate)"
    )]
    TlsRefused(String),
    /// A configured sink names another log (`stream`) than its cursor was made for: a
    /// configuration error (exit 1); nothing was written.
    #[error("{0}")]
    StreamChanged(String),
}

impl StoreError {
    /// Whether the operator must fix the configuration (exit 1) rather than the store or
    /// its server (exit 2).
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            StoreError::TlsRefused(_) | StoreError::StreamChanged(_)
        )
    }
}

/// What every "database damaged" error tells the operator to do.
const DAMAGED_ADVICE: &str = " — restore the backup; `dump-audit`, `dump-effects` and `dump-quarantine` print what is \
     still readable";

// Manual conversions: the wrapped error's text is already in the message, so it is not also
// exposed as a `source` (which would print it twice in an error chain).
impl From<redb::Error> for StoreError {
    fn from(e: redb::Error) -> Self {
        match damage(&e) {
            Some(what) => StoreError::Damaged(what),
            None => StoreError::Storage(e),
        }
    }
}

/// What is damaged, if `e` is redb's way of saying the file is inconsistent (rather than an
/// I/O failure, a busy file or a misuse).
fn damage(e: &redb::Error) -> Option<String> {
    use redb::Error as E;
    match e {
        E::Corrupted(what) => Some(what.clone()),
        E::Io(io) => io_damage(io),
        // redb poisons its locks only by panicking, which only a damaged page makes it do.
        E::LockPoisoned(at) => Some(format!("redb failed earlier in this process (at {at})")),
        // Every table exists from creation on, with one type: a missing or retyped one is
        // a damaged table directory.
        E::TableDoesNotExist(name) => Some(format!("table {name} is missing")),
        E::TableTypeMismatch { .. }
        | E::TypeDefinitionChanged { .. }
        | E::TableIsMultimap(_)
        | E::TableIsNotMultimap(_) => Some(format!("the table directory is inconsistent: {e}")),
        _ => None,
    }
}

/// `damage` for the storage errors an open returns.
fn storage_damage(e: &redb::StorageError) -> Option<String> {
    use redb::StorageError as S;
    match e {
        S::Corrupted(what) => Some(what.clone()),
        S::Io(io) => io_damage(io),
        S::LockPoisoned(at) => Some(format!("redb failed earlier in this process (at {at})")),
        _ => None,
    }
}

fn io_damage(io: &std::io::Error) -> Option<String> {
    if io.kind() == std::io::ErrorKind::UnexpectedEof {
        Some("the file ends before its last page (truncated, or cut short by a copy)".into())
    } else if io.to_string().contains("magic number mismatch") {
        Some(
            "the file does not start with a redb header (overwritten or zeroed, or not a \
             database at all)"
                .into(),
        )
    } else {
        None
    }
}

/// Every redb error converts through `redb::Error` (whose `From` classifies damage), so `?`
/// works on each redb call.
macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> StoreError {
                StoreError::from(redb::Error::from(e))
            }
        }
    )*};
}
from_redb!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::CompactionError,
    redb::SavepointError
);

impl From<RecordError> for StoreError {
    fn from(e: RecordError) -> Self {
        StoreError::Record(e)
    }
}

impl StoreError {
    fn redb(e: impl Into<redb::Error>) -> StoreError {
        StoreError::from(e.into())
    }

    /// A handle a caught redb panic poisoned earlier.
    fn poisoned() -> StoreError {
        StoreError::Damaged(
            "an earlier read of this file failed and its handle was closed (see above)".into(),
        )
    }

    /// Reclassifies an open error whose cause is a damaged file.
    fn classify(self) -> StoreError {
        if let StoreError::Open {
            error: DatabaseError::Storage(e),
            path,
        } = &self
            && let Some(what) = storage_damage(e)
        {
            return StoreError::Damaged(format!("{}: {what}", path.display()));
        }
        self
    }

    fn busy(path: &Path) -> StoreError {
        StoreError::Busy {
            path: path.to_path_buf(),
            holder: String::new(),
        }
    }

    /// The database file does not exist (commands that never create one).
    fn missing(path: &Path) -> StoreError {
        StoreError::Open {
            path: path.to_path_buf(),
            error: DatabaseError::Storage(redb::StorageError::Io(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such file",
            ))),
        }
    }
}

/// What was decided and written for one delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub outcome: Outcome,
    pub audit_index: u64,
    pub key: Option<IdempotencyKey>,
    pub effect_offset: Option<u64>,
    pub quarantine_id: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct BatchReport {
    pub decided: Vec<Decided>,
    pub counts: OutcomeCounts,
    pub evicted: u64,
    /// What retention removed in the same transaction.
    pub pruned: PruneCounts,
    /// Upstream gap candidates the batch's applied messages revealed: not recorded; the
    /// caller keeps them for a grace, then `Backend::confirm_gaps` reports what is still
    /// missing of them.
    pub gaps: Vec<upstream::ReportedGap>,
}

/// The writer's handle on the database file.
pub struct Store {
    /// Poisoned (and never touched again) once redb panicked on a damaged page.
    db: guard::Handle<Database>,
    opts: StoreOptions,
    /// The feed writer's lock on the database file, held while open; `None` for operator
    /// writers.
    _feed_lock: Option<file::FeedLock>,
    /// Whom `run` consumes as, recorded by the next batch.
    consumption: upstream::Consumption,
    /// The feed writer's source numbers from its committed batches (`engine::SourceNames`).
    names: engine::SourceNames,
}

fn builder(cache_bytes: usize, concurrency: Concurrency) -> Builder {
    let mut b = Builder::new();
    b.set_cache_size(cache_bytes)
        .set_concurrency_mode(concurrency.mode());
    b
}

/// Mode of every file replay-guard creates: the database holds every payload it was sent.
const FILE_MODE: u32 = 0o600;

impl Store {
    /// Opens the database at `path` for the one feed writer (`run`, `ingest`), creating it if
    /// nothing is there (its meta record then says it was created at `now_ms`). Repairs it
    /// after a crash. A damaged file is `StoreError::Damaged`, even where redb panics on it.
    pub fn open(path: &Path, opts: StoreOptions, now_ms: u64) -> Result<Store, StoreError> {
        // An inspector recovering the file after a crash holds it whole for a moment.
        file::waiting_out_whole_file_locks(path, || {
            guard::catch(|| Store::open_unguarded(path, opts.clone(), now_ms))?
                .map_err(StoreError::classify)
        })
    }

    /// `open` without the panic guard.
    ///
    /// Only a regular file (through symlinks) or a missing path is accepted: a device, FIFO,
    /// socket or directory is refused untouched, and so is a zero-length file unless
    /// `opts.new_database` asks for a new database. A new database is built under a private
    /// temporary name and linked into place only once it holds its tables and meta record, so
    /// a crash during creation never leaves `path` half-initialised (redb writes its magic
    /// number last and refuses a file without it).
    fn open_unguarded(path: &Path, opts: StoreOptions, now_ms: u64) -> Result<Store, StoreError> {
        match file::probe(path)? {
            file::Found::Missing => Store::create_in_place(path, &opts, false, now_ms)?,
            file::Found::Empty if opts.new_database => {
                Store::create_in_place(&file::resolved(path)?, &opts, true, now_ms)?;
            }
            file::Found::Empty => return Err(StoreError::Empty(path.to_path_buf())),
            file::Found::File if opts.new_database => {
                return Err(StoreError::NotNew(path.to_path_buf()));
            }
            file::Found::File => {}
        }
        let lock = file::FeedLock::take(path)?;
        let (backend, meta) = file::open_existing(path, true)?;
        if !lock.is_on(&meta) {
            return Err(file::io_error(
                path,
                std::io::Error::other("the file was replaced while it was being opened: retry"),
            ));
        }
        let db = builder(opts.cache_bytes, opts.concurrency)
            .create_with_backend(backend)
            .map_err(|e| match e {
                DatabaseError::DatabaseAlreadyOpen => StoreError::Busy {
                    path: path.to_path_buf(),
                    holder: String::new(),
                },
                error => StoreError::Open {
                    path: path.to_path_buf(),
                    error,
                },
            })?;
        let mut store = Store::init(db, opts, None)?;
        store._feed_lock = Some(lock);
        Ok(store)
    }

    /// Opens an existing database for an operator's write (`quarantine release`), alongside
    /// a running feed writer: redb's `MultiWriter` mode serialises the two processes' write
    /// transactions. Takes no feed lock and never creates the file.
    pub fn open_operator(path: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        file::waiting_out_whole_file_locks(path, || Store::open_operator_once(path, opts.clone()))
    }

    fn open_operator_once(path: &Path, opts: StoreOptions) -> Result<Store, StoreError> {
        match file::probe(path)? {
            file::Found::Missing => return Err(StoreError::missing(path)),
            file::Found::Empty => return Err(StoreError::Empty(path.to_path_buf())),
            file::Found::File => {}
        }
        let opened = guard::catch(|| {
            let (backend, _) = file::open_existing(path, true)?;
            let db = builder(opts.cache_bytes, opts.concurrency)
                .create_with_backend(backend)
                .map_err(|error| StoreError::Open {
                    path: path.to_path_buf(),
                    error,
                })?;
            Store::init(db, opts, None)
        })?;
        opened.map_err(StoreError::classify)
    }

    /// Creates and initialises a database created at `now_ms` (mode 0600 whatever the umask)
    /// at a temporary name next to `path`, then links it to `path`, never replacing a file another process put
    /// there meanwhile, except, when `replace_empty`, a zero-length regular file. Leaves no
    /// temporary file behind when it fails, unless another process is creating it.
    fn create_in_place(
        path: &Path,
        opts: &StoreOptions,
        replace_empty: bool,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        // Errors name the path the operator gave, whichever file the step touched.
        let io_err = |e: std::io::Error| file::io_error(path, e);
        let name = path
            .file_name()
            .map_or_else(|| "db".into(), |n| n.to_string_lossy().into_owned());
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let tmp = dir.join(format!(".{name}.creating"));
        let created = match Store::create_file(&tmp, opts, now_ms) {
            Err(StoreError::Busy { .. }) => return Err(StoreError::busy(path)),
            // A leftover of a creation that crashed before completing: ours to discard.
            Err(_) if std::fs::symlink_metadata(&tmp).is_ok() => {
                std::fs::remove_file(&tmp).map_err(io_err)?;
                Store::create_file(&tmp, opts, now_ms)
            }
            other => other,
        };
        // Held until the temporary name is gone, so that no other creator initialises it.
        let _creating = match created {
            Ok(lock) => lock,
            Err(e) => {
                if !matches!(e, StoreError::Busy { .. }) {
                    let _ = std::fs::remove_file(&tmp);
                }
                return Err(e);
            }
        };
        let linked = (|| {
            if replace_empty
                && std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0)
            {
                std::fs::remove_file(path).map_err(io_err)?;
            }
            match std::fs::hard_link(&tmp, path) {
                Ok(()) => Ok(()),
                // Another process created the database first: it wins, this one is discarded.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                // ... and had already removed the temporary name this one had opened.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && path.exists() => Ok(()),
                Err(e) => Err(io_err(e)),
            }
        })();
        let removed = match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_err(e)),
            _ => Ok(()),
        };
        linked?;
        removed?;
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err)
    }

    /// Creates (or reuses) `tmp` with mode 0600 and initialises a database created at `now_ms`
    /// in it. Returns the creation lock on it.
    fn create_file(tmp: &Path, opts: &StoreOptions, now_ms: u64) -> Result<file::Held, StoreError> {
        use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
        let io_err = |e: std::io::Error| file::io_error(tmp, e);
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(FILE_MODE)
                .open(tmp)
                .map_err(io_err)
        };
        let new_backend = |f| {
            redb::backends::FileBackend::new(f).map_err(|error| StoreError::Open {
                path: tmp.to_path_buf(),
                error,
            })
        };
        let f = open()?;
        // The umask may have taken bits from `mode` but never adds any: set it exactly.
        f.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))
            .map_err(io_err)?;
        let identity = |f: &std::fs::File| {
            use std::os::unix::fs::MetadataExt as _;
            f.metadata().map(|m| (m.dev(), m.ino())).map_err(io_err)
        };
        let locked = identity(&f)?;
        let Some(lock) = file::lock_for_creation(tmp, new_backend(f)?)? else {
            return Err(StoreError::busy(tmp));
        };
        // Another creator may have finished and unlinked the name between the two opens: the
        // lock must be on the very file that is initialised.
        let g = open()?;
        if identity(&g)? != locked {
            return Err(StoreError::busy(tmp));
        }
        let db = builder(opts.cache_bytes, opts.concurrency)
            .create_with_backend(new_backend(g)?)
            .map_err(|error| match error {
                DatabaseError::DatabaseAlreadyOpen => StoreError::busy(tmp),
                error => StoreError::Open {
                    path: tmp.to_path_buf(),
                    error,
                },
            })?;
        drop(Store::init(db, opts.clone(), Some(now_ms))?);
        Ok(lock)
    }

    /// Opens a database on a caller-supplied backend (fault-injection tests); a new one is
    /// created at `now_ms`.
    pub fn open_with_backend(
        backend: impl StorageBackend,
        opts: StoreOptions,
        now_ms: u64,
    ) -> Result<Store, StoreError> {
        let opened = guard::catch(|| {
            let db = builder(opts.cache_bytes, opts.concurrency)
                .create_with_backend(backend)
                .map_err(|source| StoreError::Open {
                    path: PathBuf::from("<backend>"),
                    error: source,
                })?;
            Store::init(db, opts, Some(now_ms))
        })?;
        opened.map_err(StoreError::classify)
    }

    /// A new database held in memory (the engine fuzz target: no file, no fsync). A memory
    /// backend has no locks, and redb then allows only its `ExclusiveWriter` mode. Its meta
    /// record says it was created at time 0: it lives for one fuzz case or test, where a fixed
    /// time keeps runs reproducible and nothing reads it.
    #[doc(hidden)]
    pub fn open_in_memory(opts: StoreOptions) -> Result<Store, StoreError> {
        let mut b = Builder::new();
        b.set_cache_size(opts.cache_bytes)
            .set_concurrency_mode(ConcurrencyMode::ExclusiveWriter);
        let db = b
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .map_err(|error| StoreError::Open {
                path: PathBuf::from("<memory>"),
                error,
            })?;
        Store::init(db, opts, Some(0))
    }

    /// Checks the meta record, or writes that of a new store created at `created_at_ms` when
    /// there is none and that is given; makes sure every table exists.
    fn init(
        db: Database,
        opts: StoreOptions,
        created_at_ms: Option<u64>,
    ) -> Result<Store, StoreError> {
        // Held in `Leak`s: a redb panic below must not run their destructors (see `guard`).
        let db = Leak::new(db);
        let txn = Leak::new(db.begin_write()?);
        {
            let mut meta = Leak::new(txn.open_table(META_TABLE)?);
            let mut found = SCHEMA_VERSION;
            match (META.get(&*meta)?, created_at_ms) {
                // An older schema is upgraded below.
                (Some(m), _) => found = m.schema_version,
                (None, None) => {
                    return Err(META
                        .missing("missing: this redb file is not a replay-guard database")
                        .into());
                }
                (None, Some(created_at_ms)) => {
                    META.put(&mut meta, &Meta::new(created_at_ms), &mut Vec::new())?;
                }
            }
            // Every store opened for writing has an id; a copy's first writer draws its own.
            if let Some(identity) = identity::settled(IDENTITY.get(&*meta)?)? {
                IDENTITY.put(&mut meta, &identity, &mut Vec::new())?;
            }
            // Create every table (the one list) so read-only inspectors never meet a
            // missing one.
            drop(meta); // the list holds the meta table too
            // Before any table is opened under its new name.
            upgrade::upgrade_redb_tables(&txn, found)?;
            struct Create<'a>(&'a WriteTransaction);
            impl CopyTable for Create<'_> {
                fn table<K: Cells + redb::Key, V: Cells>(
                    &mut self,
                    t: WholeTable<K, V>,
                ) -> Result<(), StoreError> {
                    self.0.open_table(t.def)?;
                    Ok(())
                }
            }
            for_each_table(&mut Create(&txn))?;
            let mut tx = Leak::new(RedbTx::open(&txn)?.segments_of(opts.index_segment_blocks));
            upgrade::to_current(&mut *tx)?;
            drop(tx.into_inner());
        }
        txn.into_inner().commit()?;
        Ok(Store {
            db: guard::Handle::new(db.into_inner()),
            opts,
            _feed_lock: None,
            consumption: upstream::Consumption::default(),
            names: engine::SourceNames::default(),
        })
    }

    /// Runs `f` under the panic guard; a redb panic poisons this store for good.
    fn guarded<R>(
        &mut self,
        f: impl FnOnce(&mut Store) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.db.get()?;
        match guard::catch(|| f(self)) {
            Ok(r) => r,
            Err(damaged) => {
                self.db.poison();
                Err(damaged)
            }
        }
    }

    /// Closes the file (redb saves its allocator state, so the next open needs no repair).
    /// Dropping a `Store` does the same but cannot report a failure.
    pub fn close(mut self) -> Result<(), StoreError> {
        let db = self.db.take()?;
        guard::catch(move || db.close())?.map_err(|e| StoreError::from(redb::Error::from(e)))
    }

    /// A read view of this store (the same views `Reader` gives another process).
    pub fn reader(&self) -> Result<Snapshot, StoreError> {
        self.db
            .guard(|db| db.begin_read().map(Snapshot::new).map_err(StoreError::redb))
    }

    /// Decides and durably records every delivery of `batch`, in order, in one write
    /// transaction committed with `Durability::Immediate`. On `Err` the caller must not
    /// acknowledge any of the batch (a failure past redb's commit point may still have made it
    /// durable, so a redelivery is then decided `duplicate`); the error is fatal (redb latches
    /// after an I/O failure), so callers stop rather than retry.
    pub fn commit_batch(
        &mut self,
        batch: &[Incoming],
        now_ms: u64,
    ) -> Result<BatchReport, StoreError> {
        self.guarded(|s| s.try_commit_batch(batch, now_ms))
            .map_err(|e| match e {
                StoreError::Storage(e) => StoreError::CommitFailed(e),
                other => other,
            })
    }

    /// A durable write transaction with quick-repair on (every writer's).
    fn begin_durable(&self) -> Result<WriteTransaction, StoreError> {
        let mut txn = self.db.get()?.begin_write()?;
        txn.set_durability(Durability::Immediate)
            .map_err(StoreError::Durability)?;
        txn.set_quick_repair(true);
        Ok(txn)
    }

    fn try_commit_batch(
        &mut self,
        batch: &[Incoming],
        now_ms: u64,
    ) -> Result<BatchReport, StoreError> {
        let txn = Leak::new(self.begin_durable()?);
        let (report, names) = {
            let mut w = Leak::new(
                Writer::open(
                    RedbTx::open(&txn)?
                        .merging_at(self.opts.window_merge_at)
                        .direct_sources(self.opts.window_direct_sources)
                        .segments_of(self.opts.index_segment_blocks),
                    &self.opts,
                )?
                .with_names(std::mem::take(&mut self.names)),
            );
            let report = w.decide_batch(batch, now_ms, self.consumption.pending())?;
            let names = w.take_names();
            drop(w.into_inner().finish()?);
            (report, names)
        };
        txn.into_inner().commit()?;
        // Only once committed: the numbers a failed transaction assigned were never stored.
        self.names = names;
        self.consumption.committed();
        Ok(report)
    }
}

/// A store on either backend: what the feed writers and the tests that must hold for both
/// use. Each arm decides through the same `engine::Writer`.
// One per process: the size of the larger arm costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    Redb(Store),
    Postgres(postgres::PgStore),
}

impl Backend {
    pub fn commit_batch(
        &mut self,
        batch: &[Incoming],
        now_ms: u64,
    ) -> Result<BatchReport, StoreError> {
        match self {
            Backend::Redb(s) => s.commit_batch(batch, now_ms),
            Backend::Postgres(s) => s.commit_batch(batch, now_ms),
        }
    }

    /// A consistent view of the latest commit.
    pub fn reader(&self) -> Result<Snapshot, StoreError> {
        match self {
            Backend::Redb(s) => s.reader(),
            Backend::Postgres(s) => Ok(Snapshot::postgres(s.view()?)),
        }
    }

    /// Whom the next batches are consumed as (`run`'s client id and broker): the first
    /// batch committed after this records it, if the store did not know it yet.
    pub fn consume_as(&mut self, c: upstream::ConsumedAs) {
        match self {
            Backend::Redb(s) => s.consumption.set(c),
            Backend::Postgres(s) => s.consume_as(c),
        }
    }

    /// What is still missing of the gap `candidates` (`upstream::confirm_gaps`), in one
    /// write transaction: recorded and returned (none missing: every one was filled, or lies
    /// at or below its source's evicted floor, returned as `unknown`; nothing is then written).
    pub fn confirm_gaps(
        &mut self,
        candidates: &[upstream::ReportedGap],
        now_ms: u64,
    ) -> Result<upstream::GapCheck, StoreError> {
        if candidates.is_empty() {
            return Ok(upstream::GapCheck::default());
        }
        match self {
            Backend::Redb(s) => s.confirm_gaps(candidates, now_ms),
            Backend::Postgres(s) => s.confirm_gaps(candidates, now_ms),
        }
    }

    /// A (re)connect's answer, noted (its own small transaction): a broker that kept no
    /// session for a client id the store consumed under lost what it queued for it. Returns
    /// the loss, recorded with the connect; `None` when there is none.
    pub fn note_connect(
        &mut self,
        broker: &str,
        client_id: &str,
        session_present: bool,
        now_ms: u64,
    ) -> Result<Option<SessionLoss>, StoreError> {
        match self {
            Backend::Redb(s) => s.note_connect(broker, client_id, session_present, now_ms),
            Backend::Postgres(s) => s.note_connect(broker, client_id, session_present, now_ms),
        }
    }

    /// Records a replay burst `run` absorbed, for `stats`.
    pub fn record_burst(&mut self, burst: &BurstRecord) -> Result<(), StoreError> {
        match self {
            Backend::Redb(s) => s.record_burst(burst),
            Backend::Postgres(s) => s.record_burst(burst),
        }
    }

    /// Closes the store (redb saves its allocator state; a PostgreSQL connection just ends).
    pub fn close(self) -> Result<(), StoreError> {
        match self {
            Backend::Redb(s) => s.close(),
            Backend::Postgres(_) => Ok(()),
        }
    }
}
