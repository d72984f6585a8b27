//! The database file itself: what may stand at a database path (a regular file, or nothing
//! for a writer to create), how files are opened for redb, and the one-feed-writer lock, a
//! byte-range lock on the database file so that every path to it (symlink, hard link) meets it.

use std::fs::{Metadata, OpenOptions};
use std::ops::Bound;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

use redb::backends::FileBackend;
use redb::{BackendError, DatabaseError, StorageBackend as _};

use super::StoreError;

/// What stands at a database path, following symlinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Nothing (and no dangling symlink): a writer may create a database there.
    Missing,
    /// A zero-length regular file: a truncated database or a placeholder, never opened as one.
    Empty,
    /// A regular file with content: opened as a database (redb checks its magic number).
    File,
}

/// Classifies `path` without opening it, so that a FIFO is refused before an open could block
/// on it and a device is never handed to redb.
pub(crate) fn probe(path: &Path) -> Result<Found, StoreError> {
    match std::fs::metadata(path) {
        Ok(m) => classify(path, &m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(StoreError::NotAFile {
                    path: path.to_path_buf(),
                    kind: "symbolic link to a missing file",
                });
            }
            Ok(Found::Missing)
        }
        Err(e) => Err(io_error(path, e)),
    }
}

fn classify(path: &Path, m: &Metadata) -> Result<Found, StoreError> {
    let t = m.file_type();
    let kind = if t.is_file() {
        return Ok(if m.len() == 0 {
            Found::Empty
        } else {
            Found::File
        });
    } else if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else {
        "special file"
    };
    Err(StoreError::NotAFile {
        path: path.to_path_buf(),
        kind,
    })
}

/// An I/O error on `path`, as an open error naming it; a permission problem says so and what
/// to do, rather than how the kernel put it.
pub(crate) fn io_error(path: &Path, e: std::io::Error) -> StoreError {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        return StoreError::Denied(path.to_path_buf());
    }
    StoreError::Open {
        path: path.to_path_buf(),
        error: DatabaseError::Storage(redb::StorageError::Io(e)),
    }
}

fn backend_error(path: &Path, e: BackendError) -> StoreError {
    io_error(path, std::io::Error::from(e))
}

/// Opens an existing database file for redb, read-write or read-only, and checks what was
/// opened (not only what `probe` saw): a regular file with content.
pub(crate) fn open_existing(
    path: &Path,
    write: bool,
) -> Result<(FileBackend, Metadata), StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
        .map_err(|e| io_error(path, e))?;
    let meta = file.metadata().map_err(|e| io_error(path, e))?;
    match classify(path, &meta)? {
        Found::File => {}
        _ => return Err(StoreError::Empty(path.to_path_buf())),
    }
    let backend = FileBackend::new(file).map_err(|error| StoreError::Open {
        path: path.to_path_buf(),
        error,
    })?;
    Ok((backend, meta))
}

// The feed lock's bytes. redb 4.6 locks only the header (offset 0 up to its size) and offsets
// from 2^62 up in the modes replay-guard's handles share (`MultiWriter`, read-only), so these
// never meet its locks there; an `ExclusiveWriter` open (`compact`) locks every byte outside
// its backend's reserved range, these included, which excludes a feed writer while it runs.
/// Held exclusively by the one feed writer.
const FEED_BYTE: u64 = 1 << 61;
/// The feed writer also locks `HOLDER_BASE + its pid`, so that others can name it: an OFD
/// lock's owner has no pid (F_OFD_GETLK reports -1), and the kernel drops both on `kill -9`.
const HOLDER_BASE: u64 = FEED_BYTE + (1 << 32);
const HOLDER_SPAN: u64 = 1 << 32;

/// The one-feed-writer lock (`run`, `ingest`), held while the value lives. It is an open file
/// description (OFD) lock on the database file itself, on a descriptor of its own: every path
/// to the file meets it, it conflicts with another descriptor even in the same process, and
/// the kernel releases it when the process dies.
pub(crate) struct FeedLock {
    _held: Held,
    dev: u64,
    ino: u64,
}

/// A descriptor's byte-range locks, released explicitly when dropped. Closing the descriptor
/// is not enough: a child process forked by another thread shares the open file description
/// until it execs, and the locks live as long as the description does.
pub(crate) struct Held(FileBackend);

impl Drop for Held {
    fn drop(&mut self) {
        // Releases every range this backend took; should that fail, the kernel still releases
        // them once the description is closed.
        let _ = self.0.close();
    }
}

impl FeedLock {
    /// Takes the lock on the database at `path` (an existing regular file with content), or
    /// `Busy` naming the holder.
    pub(crate) fn take(path: &Path) -> Result<FeedLock, StoreError> {
        let (backend, meta) = open_existing(path, true)?;
        let held = Held(backend);
        let backend = &held.0;
        let err = |e| backend_error(path, e);
        if !backend
            .try_lock_range(byte(FEED_BYTE).0, byte(FEED_BYTE).1)
            .map_err(err)?
        {
            return Err(StoreError::Busy {
                path: path.to_path_buf(),
                holder: describe(find_holder(backend).map_err(err)?),
            });
        }
        // Cannot conflict: any holder of this byte also holds the feed byte.
        let mine = byte(HOLDER_BASE + u64::from(std::process::id()));
        backend.try_lock_range(mine.0, mine.1).map_err(err)?;
        Ok(FeedLock {
            _held: held,
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Whether the file `meta` describes is the one this lock is on.
    pub(crate) fn is_on(&self, meta: &Metadata) -> bool {
        meta.dev() == self.dev && meta.ino() == self.ino
    }
}

/// One byte per relay sink name, above the feed writer's holder range: at most one process
/// delivers a sink (a `run` with the sink and a standalone `relay` with it would each move
/// the other's cursor back and forth). Names hash into 2^32 bytes.
const SINK_BASE: u64 = HOLDER_BASE + HOLDER_SPAN;
const SINK_SPAN: u64 = 1 << 32;

/// The relay's locks on its sinks' bytes, held while the value lives; released by the
/// kernel on `kill -9`.
pub struct SinkLocks {
    _held: Held,
}

fn sink_byte(name: &str) -> u64 {
    // FNV-1a: stable across builds and processes.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    SINK_BASE + h % SINK_SPAN
}

/// Locks the bytes of every sink in `names` on the database at `path`, or `SinkBusy` naming
/// the first sink another process delivers.
pub(crate) fn lock_sinks(path: &Path, names: &[&str]) -> Result<SinkLocks, StoreError> {
    let (backend, _) = open_existing(path, true)?;
    let held = Held(backend);
    for name in names {
        let (start, end) = byte(sink_byte(name));
        if !held
            .0
            .try_lock_range(start, end)
            .map_err(|e| backend_error(path, e))?
        {
            return Err(StoreError::SinkBusy {
                path: path.to_path_buf(),
                sink: (*name).to_string(),
                by: sink_holder(&held.0),
            });
        }
    }
    Ok(SinkLocks { _held: held })
}

/// Who delivers a sink whose byte is locked, as far as the holder bytes tell: this process
/// holding the feed lock means a standalone `relay` has it; another feed writer may be the
/// one (its config has the sink) or not (a standalone `relay` beside it).
fn sink_holder(b: &FileBackend) -> String {
    match find_holder(b) {
        Ok(Some(pid)) if pid == u64::from(std::process::id()) => {
            "a standalone `relay` (replay-guard-relay.service, or one started by hand)".into()
        }
        Ok(Some(pid)) if pid > 0 => format!(
            "another process: the `run` on this database{} if its config has this [[sink]], \
             else a standalone `relay`",
            describe(Some(pid))
        ),
        _ => super::SINK_BUSY_BY.into(),
    }
}

/// Takes the feed byte on `backend`, a new database file being created under its temporary
/// name, so that two processes creating it never both initialise it. `None`: another is.
pub(crate) fn lock_for_creation(
    path: &Path,
    backend: FileBackend,
) -> Result<Option<Held>, StoreError> {
    let (start, end) = byte(FEED_BYTE);
    let held = Held(backend);
    let taken = held
        .0
        .try_lock_range(start, end)
        .map_err(|e| backend_error(path, e))?;
    Ok(taken.then_some(held))
}

/// Longest a writer's open waits for a whole-file lock to go: an inspector recovering a
/// file a killed writer left (`Reader::open`) holds one for milliseconds; `compact` holds it
/// while it runs, and a writer is then refused as before.
const WHOLE_FILE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Runs `open` again while it fails because another process holds the whole file of `path`
/// locked (redb's exclusive mode), for at most `WHOLE_FILE_WAIT`.
pub(crate) fn waiting_out_whole_file_locks<T>(
    path: &Path,
    mut open: impl FnMut() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let deadline = std::time::Instant::now() + WHOLE_FILE_WAIT;
    loop {
        match open() {
            Err(_) if std::time::Instant::now() < deadline && whole_file_locked(path) => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// Whether another process holds every byte of the file locked (the holder range's first
/// byte, which no feed writer's pid lock covers).
fn whole_file_locked(path: &Path) -> bool {
    // Probed first: opening a FIFO would block.
    matches!(probe(path), Ok(Found::File))
        && open_existing(path, false).is_ok_and(|(backend, _)| {
            backend
                .query_lock_range(byte(HOLDER_BASE).0, byte(HOLDER_BASE).1)
                .unwrap_or(false)
        })
}

/// Who holds the feed lock of the database at `path`, as text for an error message (`None`:
/// nobody). Takes no lock.
pub(crate) fn feed_lock_holder(path: &Path) -> Result<Option<String>, StoreError> {
    let (backend, _) = open_existing(path, false)?;
    let err = |e| backend_error(path, e);
    if !backend
        .query_lock_range(byte(FEED_BYTE).0, byte(FEED_BYTE).1)
        .map_err(err)?
    {
        return Ok(None);
    }
    Ok(Some(describe(find_holder(&backend).map_err(err)?)))
}

fn byte(offset: u64) -> (Bound<u64>, Bound<u64>) {
    (Bound::Included(offset), Bound::Included(offset))
}

/// The lowest locked offset in the holder range, found by bisection (32 queries at most).
/// `Some(0)` is a lock over the whole range: an `ExclusiveWriter` (`compact`).
fn find_holder(b: &FileBackend) -> Result<Option<u64>, BackendError> {
    let locked = |lo: u64, hi: u64| {
        b.query_lock_range(
            Bound::Included(HOLDER_BASE + lo),
            Bound::Excluded(HOLDER_BASE + hi),
        )
    };
    let (mut lo, mut hi) = (0, HOLDER_SPAN);
    if !locked(lo, hi)? {
        return Ok(None);
    }
    // Invariant: a lock lies in lo..hi (unless its holder just exited).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if locked(lo, mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Ok(locked(lo, lo + 1)?.then_some(lo))
}

/// " (PID 123: replay-guard run --config …)" for a message, or what is known.
fn describe(holder: Option<u64>) -> String {
    match holder {
        None => String::new(),
        Some(0) => " (a process has the whole file locked, such as `compact`)".into(),
        Some(pid) => {
            let command = std::fs::read(format!("/proc/{pid}/cmdline"))
                .ok()
                .map(|raw| {
                    let words: Vec<String> = raw
                        .split(|&b| b == 0)
                        .filter(|w| !w.is_empty())
                        .map(|w| String::from_utf8_lossy(w).into_owned())
                        .collect();
                    words.join(" ")
                })
                .filter(|c| !c.is_empty());
            match command {
                Some(c) => {
                    // One line whatever the holder's arguments hold.
                    let c: String = c
                        .chars()
                        .flat_map(|ch| ch.escape_debug())
                        .take(200)
                        .collect();
                    format!(" (PID {pid}: {c})")
                }
                None => format!(" (PID {pid})"),
            }
        }
    }
}

/// `path` resolved through symlinks when it is one (to an existing file), so that a new
/// database replaces an empty file where it is, not the link to it.
pub(crate) fn resolved(path: &Path) -> Result<PathBuf, StoreError> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        std::fs::canonicalize(path).map_err(|e| io_error(path, e))
    } else {
        Ok(path.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Store, StoreOptions};

    #[test]
    fn a_permission_error_on_the_file_says_permission_denied_and_what_to_do() {
        let e = io_error(
            Path::new("/x/db.redb"),
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        let text = e.to_string();
        assert!(text.contains("permission denied on /x/db.redb"), "{text}");
        assert!(text.contains("as root"), "{text}");
    }

    fn holder_of(err: StoreError) -> String {
        match err {
            StoreError::Busy { holder, .. } => holder,
            other => panic!("not Busy: {other}"),
        }
    }

    #[test]
    fn a_new_database_is_created_at_the_time_given_and_keeps_it_when_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        drop(Store::open(&path, StoreOptions::default(), 1_234).unwrap());
        drop(Store::open(&path, StoreOptions::default(), 9_999).unwrap());
        let meta = crate::store::Reader::open(&path)
            .unwrap()
            .begin()
            .unwrap()
            .meta()
            .unwrap();
        assert_eq!(meta.created_at_ms, 1_234);
    }

    /// Guards the choice of bytes against a redb upgrade: redb's own handles in the modes the
    /// commands use never meet the feed lock, and its exclusive mode does.
    #[test]
    fn the_feed_lock_meets_another_feed_lock_and_redbs_exclusive_mode_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.redb");
        let mut store = Store::open(&path, StoreOptions::default(), 1_000).unwrap();
        // A second feed lock in the same process, through another descriptor: refused, and
        // named after this process.
        let holder = holder_of(FeedLock::take(&path).err().unwrap());
        assert!(
            holder.contains(&format!("PID {}", std::process::id())),
            "{holder}"
        );
        assert!(feed_lock_holder(&path).unwrap().is_some());
        // Operator writers and readers open alongside it, and the writer still commits.
        let operator = Store::open_operator(&path, StoreOptions::default()).unwrap();
        let reader = crate::store::Reader::open(&path).unwrap();
        store.commit_batch(&[], 1).unwrap();
        drop((operator, reader));
        drop(store);
        assert_eq!(feed_lock_holder(&path).unwrap(), None);

        // An exclusive-mode open (what `compact` uses) keeps a feed writer out.
        let db = redb::Builder::new()
            .set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter)
            .open(&path)
            .unwrap();
        let holder = holder_of(
            Store::open(&path, StoreOptions::default(), 1_000)
                .err()
                .unwrap(),
        );
        assert!(holder.contains("whole file locked"), "{holder}");
        drop(db);
        drop(Store::open(&path, StoreOptions::default(), 1_000).unwrap());
    }

    /// A child forked by another thread shares every descriptor until it execs: the locks
    /// must go when the store is dropped, not when the last copy of the descriptor closes.
    #[test]
    fn a_store_reopens_at_once_while_another_thread_spawns_processes() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spawner = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::process::Command::new("true").status();
                }
            })
        };
        let dir = tempfile::tempdir().unwrap();
        let outcome = (0..40).try_for_each(|i| {
            let path = dir.path().join(format!("{i}.redb"));
            drop(Store::open(&path, StoreOptions::default(), 1_000)?);
            drop(Store::open(&path, StoreOptions::default(), 1_000)?);
            Ok::<(), StoreError>(())
        });
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spawner.join().unwrap();
        outcome.unwrap();
    }
}

/// Free space for unprivileged writers, and total size, of the file system holding the
/// database at `path` (its directory is asked, so a missing file still has an answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSpace {
    pub available_bytes: u64,
    pub total_bytes: u64,
}

/// `statvfs` of the directory holding `path`.
pub fn disk_space(path: &Path) -> std::io::Result<DiskSpace> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let s = rustix::fs::statvfs(dir)?;
    Ok(DiskSpace {
        available_bytes: s.f_bavail.saturating_mul(s.f_frsize),
        total_bytes: s.f_blocks.saturating_mul(s.f_frsize),
    })
}
