//! Fault injection under the store: a redb `StorageBackend` that fails every write, sync or
//! resize after the Nth one. A failed commit must leave exactly the previous durable state (or,
//! if the failure came after the commit point, exactly the new one), never part of a batch,
//! and the store must refuse further writes instead of retrying.

use std::fs::{File, OpenOptions};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use redb::StorageBackend;
use redb::backends::FileBackend;
use replay_guard::store::{Incoming, Store, StoreError, StoreOptions};
use replay_guard::wire::FeedContract;

use super::common::msg;

#[derive(Debug)]
struct FailingBackend {
    inner: FileBackend,
    /// Mutating operations left before every one fails; negative means never fail.
    budget: Arc<AtomicI64>,
}

impl FailingBackend {
    fn check(&self) -> std::io::Result<()> {
        let left = self.budget.load(Ordering::SeqCst);
        if left < 0 {
            return Ok(());
        }
        if left == 0 {
            return Err(std::io::Error::other("injected I/O failure"));
        }
        self.budget.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

impl StorageBackend for FailingBackend {
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.check()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.check()?;
        self.inner.write(offset, data)
    }
    fn close(&self) -> std::io::Result<()> {
        self.inner.close()
    }
    fn try_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_range(s, e)
    }
    fn try_lock_shared_range(
        &self,
        s: Bound<u64>,
        e: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.inner.try_lock_shared_range(s, e)
    }
    fn lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.lock_range(s, e)
    }
    fn lock_shared_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.lock_shared_range(s, e)
    }
    fn unlock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<(), redb::BackendError> {
        self.inner.unlock_range(s, e)
    }
    fn query_lock_range(&self, s: Bound<u64>, e: Bound<u64>) -> Result<bool, redb::BackendError> {
        self.inner.query_lock_range(s, e)
    }
}

fn open_file(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap()
}

fn batch(range: std::ops::Range<u64>, replay_of: Option<u64>) -> Vec<Incoming> {
    let contract = FeedContract::default();
    let mut lines: Vec<String> = range
        .map(|i| msg("A", &format!("S{}", i % 3), 0, i, "x"))
        .collect();
    if let Some(r) = replay_of {
        lines.push(msg("A", &format!("S{}", r % 3), 0, r, "x"));
    }
    lines.push("{broken".into());
    lines
        .iter()
        .map(|l| Incoming::decode("t", l.clone().into_bytes(), 5_000, &contract))
        .collect()
}

/// Everything a reviewer can see: audit, effects, quarantine (as debug strings).
fn snapshot(path: &Path) -> Vec<String> {
    let store = Store::open(path, StoreOptions::default(), 1_000).unwrap();
    let txn = store.reader().unwrap();
    let mut out = Vec::new();
    txn.scan_audit::<StoreError>(0, |e| {
        out.push(format!("{e:?}"));
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    txn.scan_effects::<StoreError>(0, |e| {
        out.push(format!("{e:?}"));
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    txn.scan_quarantine::<StoreError>(0, |e| {
        out.push(format!("{e:?}"));
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    out
}

#[test]
fn failed_write_or_sync_during_commit_leaves_the_previous_state_intact() {
    let dir = tempfile::tempdir().unwrap();
    let a = batch(0..50, None);
    let b = batch(50..120, Some(3));

    // Reference states: A alone, and A then B.
    let ref_a = dir.path().join("ref_a.redb");
    let ref_ab = dir.path().join("ref_ab.redb");
    for (path, both) in [(&ref_a, false), (&ref_ab, true)] {
        let mut s = Store::open(path, StoreOptions::default(), 1_000).unwrap();
        s.commit_batch(&a, 10_000).unwrap();
        if both {
            s.commit_batch(&b, 20_000).unwrap();
        }
    }
    let (want_a, want_ab) = (snapshot(&ref_a), snapshot(&ref_ab));
    assert_ne!(want_a, want_ab);

    let mut failed_with_a = 0;
    let mut n = 0;
    loop {
        let path = dir.path().join(format!("f{n}.redb"));
        let budget = Arc::new(AtomicI64::new(-1));
        let backend = FailingBackend {
            inner: FileBackend::new(open_file(&path)).unwrap(),
            budget: budget.clone(),
        };
        let mut store = Store::open_with_backend(backend, StoreOptions::default(), 1_000).unwrap();
        store.commit_batch(&a, 10_000).unwrap();
        budget.store(n, Ordering::SeqCst);
        let result = store.commit_batch(&b, 20_000);
        let succeeded = result.is_ok();
        if let Err(e) = &result {
            assert!(
                matches!(e, StoreError::CommitFailed(_)),
                "unexpected error kind: {e}"
            );
            assert!(e.to_string().contains("restart the process"), "{e}");
            // Latched: no retry loop can make a half-known state look committed.
            budget.store(-1, Ordering::SeqCst);
            assert!(
                store.commit_batch(&b, 30_000).is_err(),
                "a latched store accepted a write"
            );
        }
        drop(store);
        let got = snapshot(&path);
        if succeeded {
            assert_eq!(
                got, want_ab,
                "commit returned Ok but B is not fully there (n={n})"
            );
            break;
        }
        if got == want_a {
            failed_with_a += 1;
        } else {
            // A failure after redb's commit point may leave B durable: then all of it.
            assert_eq!(
                got, want_ab,
                "partial batch visible after failure at op {n}"
            );
        }
        n += 1;
        assert!(n < 10_000, "commit never succeeded");
    }
    assert!(
        failed_with_a >= 3,
        "only {failed_with_a} injected failures exercised the rollback"
    );
}
