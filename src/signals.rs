//! SIGTERM/SIGINT -> shutdown. The first signal asks for a graceful drain; a second one exits
//! at once, which is safe: nothing is acknowledged before its commit, so the broker redelivers
//! whatever was in flight. `stop_flag` serves the polling inspectors (`--follow`).

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tokio::sync::watch;

use crate::commands::EXIT_FORCED;

/// Turns the first SIGTERM or SIGINT into `trigger.send(true)`; exits on the second.
pub fn install(trigger: watch::Sender<bool>) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGINT])?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut seen = 0;
            for sig in signals.forever() {
                seen += 1;
                if seen == 1 {
                    tracing::info!(
                        signal = sig,
                        "shutdown requested: draining (send it again to stop at once)"
                    );
                    let _ = trigger.send(true);
                } else {
                    tracing::warn!(signal = sig, "second signal: stopping at once");
                    std::process::exit(i32::from(EXIT_FORCED));
                }
            }
        })?;
    Ok(())
}

/// A flag that SIGTERM or SIGINT sets, for loops that poll (`dump-* --follow`); the signals
/// no longer terminate the process, so the loop ends cleanly and exits 0.
pub fn stop_flag() -> std::io::Result<std::sync::Arc<std::sync::atomic::AtomicBool>> {
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [SIGTERM, SIGINT] {
        signal_hook::flag::register(sig, std::sync::Arc::clone(&flag))?;
    }
    Ok(flag)
}
