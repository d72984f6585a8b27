//! `run`: the MQTT consumer service.

use super::Failure;
use crate::cli::RunArgs;
use crate::config::Config;
use crate::notify::Notifier;
use crate::service::{self, Shutdown};

pub fn run(args: &RunArgs) -> Result<(), Failure> {
    let mut config = Config::resolve(Some(&args.config), args.db.as_deref())?;
    config.store.new_database = args.new_database;
    let (trigger, shutdown) = Shutdown::new();
    crate::signals::install(trigger).map_err(|e| {
        Failure::Runtime(anyhow::Error::new(e).context("cannot install signal handlers"))
    })?;
    let notifier = Notifier::from_env();
    service::run(config, shutdown, &notifier)?;
    Ok(())
}
