//! `demo`: the failover replay story, checked. Exit 0 only if exactly-once held.

use std::io::IsTerminal as _;

use anyhow::anyhow;

use super::Failure;
use crate::cli::DemoArgs;
use crate::demo::{self, DemoError, DemoOptions};

pub fn run(args: &DemoArgs) -> Result<(), Failure> {
    let opts = DemoOptions {
        seed: args.seed,
        messages: usize::try_from(args.messages).unwrap_or(usize::MAX),
        db: args.db.clone(),
        colour: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    let mut out = crate::output::stdout();
    match demo::run(&opts, &mut out) {
        Ok(r) if r.exactly_once => Ok(()),
        Ok(r) => Err(Failure::Violation(anyhow!(
            "exactly-once did not hold (database kept at {})",
            r.db.display()
        ))),
        Err(DemoError::Usage(e)) => Err(Failure::Usage(anyhow!(e))),
        Err(DemoError::Failed(e)) => Err(Failure::Runtime(anyhow!("demo: {e}"))),
    }
}
