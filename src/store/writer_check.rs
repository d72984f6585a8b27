//! `verify`'s writer-side check: open the file the way `ingest` and `run` do (which loads
//! redb's allocator state, something a read-only open never reads) and run redb's own
//! integrity check over every page, without writing to the file. Reads come from the file;
//! whatever redb writes (its header, a repaired allocator state) stays in memory. The same
//! overlay lets an inspector read a file needing crash recovery that it may not write.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Bound;
use std::os::unix::fs::FileExt as _;
use std::path::Path;
use std::sync::Mutex;

use redb::StorageBackend;

use super::guard::{self, Leak};
use super::{Concurrency, StoreError, builder};

const CHUNK: u64 = 4096;

/// The file underneath, with writes kept in memory in `CHUNK`-sized pieces.
#[derive(Debug)]
struct Overlay {
    file: File,
    file_len: u64,
    state: Mutex<OverlayState>,
}

impl Overlay {
    /// The file at `path` as it is now, with nothing written over it yet.
    fn over(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        let file_len = file.metadata()?.len();
        Ok(Self {
            file,
            file_len,
            state: Mutex::new(OverlayState {
                len: file_len,
                written: HashMap::new(),
            }),
        })
    }
}

#[derive(Debug)]
struct OverlayState {
    len: u64,
    written: HashMap<u64, Vec<u8>>,
}

impl Overlay {
    fn state(&self) -> std::io::Result<std::sync::MutexGuard<'_, OverlayState>> {
        self.state
            .lock()
            .map_err(|_| std::io::Error::other("overlay lock poisoned"))
    }

    /// The file's bytes at `offset` (zeros past its end, as a grown file would read).
    fn read_file(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let from_file = self.file_len.saturating_sub(offset).min(out.len() as u64) as usize;
        self.file.read_exact_at(&mut out[..from_file], offset)?;
        out[from_file..].fill(0);
        Ok(())
    }
}

impl StorageBackend for Overlay {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.state()?.len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let st = self.state()?;
        let end = offset.saturating_add(out.len() as u64);
        if end > st.len {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.read_file(offset, out)?;
        if st.written.is_empty() {
            return Ok(());
        }
        for chunk in offset / CHUNK..end.div_ceil(CHUNK) {
            if let Some(bytes) = st.written.get(&chunk) {
                let c_start = chunk * CHUNK;
                let from = offset.max(c_start);
                let to = end.min(c_start + CHUNK);
                out[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&bytes[(from - c_start) as usize..(to - c_start) as usize]);
            }
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> std::io::Result<()> {
        let mut st = self.state()?;
        if len < st.len {
            // Bytes past a shrink must read as zeros if the file grows again.
            let mut zeros = vec![0; (st.len - len) as usize];
            drop(st);
            self.write(len, &zeros)?;
            zeros.clear();
            st = self.state()?;
        }
        st.len = len;
        Ok(())
    }

    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }

    // The overlay is private to this process: every lock on it is free. (The real file's
    // locks are not taken: the check neither excludes nor waits for a live writer.)
    fn try_lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, redb::BackendError> {
        Ok(true)
    }

    fn try_lock_shared_range(
        &self,
        _: Bound<u64>,
        _: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        Ok(true)
    }

    fn lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), redb::BackendError> {
        Ok(())
    }

    fn lock_shared_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), redb::BackendError> {
        Ok(())
    }

    fn unlock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), redb::BackendError> {
        Ok(())
    }

    fn query_lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, redb::BackendError> {
        Ok(false)
    }

    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut st = self.state()?;
        let end = offset + data.len() as u64;
        for chunk in offset / CHUNK..end.div_ceil(CHUNK) {
            let c_start = chunk * CHUNK;
            let bytes = match st.written.entry(chunk) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let mut base = vec![0; CHUNK as usize];
                    self.read_file(c_start, &mut base)?;
                    e.insert(base)
                }
            };
            let from = offset.max(c_start);
            let to = end.min(c_start + CHUNK);
            bytes[(from - c_start) as usize..(to - c_start) as usize]
                .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
        }
        st.len = st.len.max(end);
        Ok(())
    }
}

/// Opens `path` as a writer would and runs redb's integrity check, leaving the file
/// untouched. `Err(StoreError::Damaged)` if a writer could not open it, or if the check
/// found pages that do not match their checksums or an allocator state that needed repair.
///
/// Reads the whole file once. A commit by another process (a live `run`) during the check
/// can show it a mix of two commits, so a failure counts only if the file's header and size
/// did not change meanwhile; otherwise the check runs again (three times at most, then the
/// live writer, which opened the file itself, is proof enough).
pub fn check_writer_open(path: &Path) -> Result<(), StoreError> {
    for _ in 0..3 {
        let before = fingerprint(path);
        let result = writer_check(path);
        if result.is_ok() || fingerprint(path) == before {
            return result;
        }
    }
    tracing::warn!(
        path = %path.display(),
        "the writer-side check saw {} change under it three times: skipped",
        path.display()
    );
    Ok(())
}

fn writer_check(path: &Path) -> Result<(), StoreError> {
    let overlay = Overlay::over(path)
        .map_err(|e| StoreError::Damaged(format!("cannot read the file: {e}")))?;
    let clean = guard::catch(|| {
        let mut db = Leak::new(
            builder(16 * 1024 * 1024, Concurrency::MultiWriter)
                .create_with_backend(overlay)
                .map_err(|error| {
                    StoreError::Open {
                        path: path.to_path_buf(),
                        error,
                    }
                    .classify()
                })?,
        );
        let clean = db.check_integrity().map_err(|error| {
            StoreError::Open {
                path: path.to_path_buf(),
                error,
            }
            .classify()
        })?;
        drop(db.into_inner());
        Ok::<bool, StoreError>(clean)
    })??;
    if clean {
        Ok(())
    } else {
        Err(StoreError::Damaged(format!(
            "{}: redb's integrity check found pages or allocator state that a writer would \
             have to repair",
            path.display()
        )))
    }
}

/// The database at `path` opened as a writer would open it, its crash recovery done in
/// memory: nothing is written to the file. For an inspector that may not write a file a
/// killed writer left needing recovery (`Reader::open`).
pub(super) fn recovered_in_memory(path: &Path) -> Result<redb::Database, StoreError> {
    let overlay = Overlay::over(path).map_err(|e| super::file::io_error(path, e))?;
    guard::catch(|| {
        builder(16 * 1024 * 1024, Concurrency::MultiWriter)
            .create_with_backend(overlay)
            .map_err(|error| {
                StoreError::Open {
                    path: path.to_path_buf(),
                    error,
                }
                .classify()
            })
    })?
}

/// A fingerprint of the file's header and size, to tell whether a commit happened between
/// two points.
fn fingerprint(path: &Path) -> Option<(u64, Vec<u8>)> {
    let file = File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let mut head = vec![0; CHUNK.min(len) as usize];
    file.read_exact_at(&mut head, 0).ok()?;
    Some((len, head))
}
