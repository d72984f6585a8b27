//! The store boundary's defence against a damaged file: redb answers some inconsistent pages
//! with a panic (`entered unreachable code`, an index out of bounds) instead of an error.
//! `catch` turns a panic raised inside redb's own code into `StoreError::Damaged`; the handle
//! whose call panicked is then poisoned (`Handle`) and never touched again, not even by its
//! destructor. A panic anywhere else is not ours to judge: it is printed by the previous hook
//! and keeps unwinding.

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe, PanicHookInfo};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use super::StoreError;

thread_local! {
    /// How many `catch` frames this thread is inside.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// What the hook saw of the redb panic now unwinding towards the innermost `catch`.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// Installs (once per process) the panic hook that keeps quiet about redb panics a `catch`
/// will turn into an error, and hands every other panic to the hook installed before it.
pub fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if DEPTH.with(Cell::get) > 0
                && let Some(what) = redb_panic(info)
            {
                CAUGHT.with(|c| *c.borrow_mut() = Some(what));
                return;
            }
            previous(info);
        }));
    });
}

/// `Some(description)` if the panic was raised in redb's source (a registry, git or vendored
/// copy: a path component `redb` or `redb-VERSION` followed by `src`).
fn redb_panic(info: &PanicHookInfo<'_>) -> Option<String> {
    let location = info.location()?;
    let file = location.file().replace('\\', "/");
    let parts: Vec<&str> = file.split('/').collect();
    let at = parts.windows(2).position(|w| {
        (w[0] == "redb" || w[0].strip_prefix("redb-").is_some_and(|v| !v.is_empty()))
            && w[1] == "src"
    })?;
    let message = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into());
    Some(format!(
        "redb met an inconsistent page ({message}, at {}:{})",
        parts[at..].join("/"),
        location.line()
    ))
}

/// Decrements `DEPTH` when a `catch` frame ends, by return or by unwinding.
struct Depth;

impl Depth {
    fn enter() -> Depth {
        DEPTH.with(|d| d.set(d.get() + 1));
        Depth
    }
}

impl Drop for Depth {
    fn drop(&mut self) {
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Runs `f`; a panic raised inside redb becomes `Err(StoreError::Damaged)`, any other panic
/// continues to unwind. The caller must poison every redb handle `f` used.
///
/// `AssertUnwindSafe` is sound here because nothing `f` may have left half-changed is used
/// again: the redb handle is poisoned by the caller, and the callers' own state (a scan's
/// accumulator, a half-written batch report) is dropped with the error they return.
pub(super) fn catch<R>(f: impl FnOnce() -> R) -> Result<R, StoreError> {
    install_panic_hook();
    let depth = Depth::enter();
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    drop(depth);
    match result {
        Ok(r) => Ok(r),
        Err(payload) => match CAUGHT.with(|c| c.borrow_mut().take()) {
            Some(what) => Err(StoreError::Damaged(what)),
            None => panic::resume_unwind(payload),
        },
    }
}

/// A redb handle (database or transaction) that a caught panic poisons: from then on every
/// use is refused, and it is leaked rather than dropped, because redb's destructors would
/// write to (or walk) the same inconsistent state. The process exits soon after; the kernel
/// closes the file and releases its locks.
pub(super) struct Handle<T> {
    inner: Option<T>,
    poisoned: AtomicBool,
}

impl<T> Handle<T> {
    pub(super) fn new(inner: T) -> Handle<T> {
        Handle {
            inner: Some(inner),
            poisoned: AtomicBool::new(false),
        }
    }

    pub(super) fn get(&self) -> Result<&T, StoreError> {
        match &self.inner {
            Some(t) if !self.poisoned.load(Ordering::Acquire) => Ok(t),
            _ => Err(StoreError::poisoned()),
        }
    }

    /// Runs `f` on the handle under `catch`; a redb panic poisons the handle.
    pub(super) fn guard<R, E: From<StoreError>>(
        &self,
        f: impl FnOnce(&T) -> Result<R, E>,
    ) -> Result<R, E> {
        let t = self.get()?;
        match catch(|| f(t)) {
            Ok(r) => r,
            Err(damaged) => {
                self.poison();
                Err(damaged.into())
            }
        }
    }

    /// Takes the value out (to close it); refused once poisoned.
    pub(super) fn take(&mut self) -> Result<T, StoreError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(StoreError::poisoned());
        }
        self.inner.take().ok_or_else(StoreError::poisoned)
    }

    pub(super) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }
}

impl<T> Drop for Handle<T> {
    fn drop(&mut self) {
        let Some(t) = self.inner.take() else { return };
        if self.poisoned.load(Ordering::Acquire) {
            std::mem::forget(t);
        } else if catch(move || drop(t)).is_err() {
            // Closing a database writes its allocator state, which can meet the damage first;
            // a destructor can only say so. Every commit was durable already.
            tracing::error!("database damaged: closing it failed; restore the backup");
        }
    }
}

/// A redb value held in a frame a redb panic may unwind through: while the thread panics it
/// is leaked, not dropped, because redb's destructors (a table's `close_table`, a database's
/// close) lock mutexes the panic poisoned, and a second panic during unwinding aborts.
pub(super) struct Leak<T>(Option<T>);

impl<T> Leak<T> {
    pub(super) fn new(t: T) -> Leak<T> {
        Leak(Some(t))
    }

    pub(super) fn into_inner(mut self) -> T {
        match self.0.take() {
            Some(t) => t,
            None => unreachable!("a Leak is emptied only by into_inner or drop"),
        }
    }
}

impl<T> std::ops::Deref for Leak<T> {
    type Target = T;
    fn deref(&self) -> &T {
        match &self.0 {
            Some(t) => t,
            None => unreachable!("a Leak is emptied only by into_inner or drop"),
        }
    }
}

impl<T> std::ops::DerefMut for Leak<T> {
    fn deref_mut(&mut self) -> &mut T {
        match &mut self.0 {
            Some(t) => t,
            None => unreachable!("a Leak is emptied only by into_inner or drop"),
        }
    }
}

impl<T> Drop for Leak<T> {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(t) = self.0.take()
        {
            std::mem::forget(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_outside_redb_keeps_unwinding() {
        let r = panic::catch_unwind(|| catch(|| panic!("a bug of ours")));
        assert!(r.is_err());
    }

    #[test]
    fn a_poisoned_handle_refuses_use_and_is_not_dropped() {
        struct Loud;
        impl Drop for Loud {
            fn drop(&mut self) {
                panic!("dropped a poisoned handle");
            }
        }
        let h = Handle::new(Loud);
        h.poison();
        assert!(matches!(h.get(), Err(StoreError::Damaged(_))));
        drop(h);
    }
}
