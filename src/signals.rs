//! SIGTERM/SIGINT -> shutdown requests, the one place signals are turned into them. The first
//! asks for a graceful drain; a second for a stop at once, which is safe: nothing is
//! acknowledged before its commit, so the broker redelivers whatever was in flight, and a
//! sink's delivery in progress is made again after the restart. Both go through what the
//! command holds (the service's `Trigger`, or a `StopFlag` for the loops that poll: `relay`,
//! `dump-* --follow`); nothing here ends the process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::service::Trigger;

/// Calls `on(n)` on the `n`th SIGTERM or SIGINT, from a thread of its own.
fn watch(mut on: impl FnMut(u32, i32) + Send + 'static) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut seen = 0u32;
            for sig in signals.forever() {
                seen = seen.saturating_add(1);
                on(seen, sig);
            }
        })?;
    Ok(())
}

fn log(seen: u32, sig: i32) {
    if seen == 1 {
        tracing::info!(
            signal = sig,
            "shutdown requested: draining (send it again to stop at once)"
        );
    } else if seen == 2 {
        tracing::warn!(signal = sig, "second signal: stopping at once");
    }
}

/// Turns the first SIGTERM or SIGINT into `trigger.drain()`, the second into `trigger.now()`.
pub fn install(trigger: Trigger) -> std::io::Result<()> {
    watch(move |seen, sig| {
        log(seen, sig);
        if seen == 1 {
            trigger.drain();
        } else {
            trigger.now();
        }
    })
}

/// How many stop signals a polling loop has had: the signals no longer terminate the process,
/// so the loop ends cleanly.
#[derive(Clone)]
pub struct StopFlag(Arc<AtomicU8>);

impl StopFlag {
    /// A stop was asked for (the first signal).
    pub fn requested(&self) -> bool {
        self.0.load(Ordering::Relaxed) >= 1
    }
    /// A stop at once was asked for (the second signal).
    pub fn forced(&self) -> bool {
        self.0.load(Ordering::Relaxed) >= 2
    }
}

/// A `StopFlag` that SIGTERM and SIGINT raise, for loops that poll.
pub fn stop_flag() -> std::io::Result<StopFlag> {
    let flag = StopFlag(Arc::new(AtomicU8::new(0)));
    let raised = flag.clone();
    watch(move |seen, sig| {
        log(seen, sig);
        raised
            .0
            .store(u8::try_from(seen.min(2)).unwrap_or(2), Ordering::Relaxed);
    })?;
    Ok(flag)
}
