//! SIGTERM/SIGINT -> shutdown. The first signal asks for a graceful drain; a second one exits
//! at once, which is safe: nothing is acknowledged before its commit, so the broker redelivers
//! whatever was in flight.

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
