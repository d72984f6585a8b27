//! `check-config`: validate a configuration for `run`, or for a standalone `relay` (sinks and
//! no `[mqtt]`), without starting anything: on either backend, a redb file or a PostgreSQL
//! schema, whose server is not contacted (the dsn is parsed and its certificate files read).

use std::io::Write as _;
use std::path::Path;

use anyhow::anyhow;

use super::Failure;
use crate::config::{Config, StoreLocation};

pub fn run(path: &Path) -> Result<(), Failure> {
    let config = Config::load(path)?;
    let db = match config.location()? {
        StoreLocation::File(db) => format!("database {}", db.display()),
        StoreLocation::Postgres(pg) => format!("store {}, not contacted", pg.pg_config()?.target()),
    };
    let metrics = config
        .metrics
        .map_or(String::new(), |a| format!(", metrics http://{a}/metrics"));
    let Some(mqtt) = config.mqtt.as_ref() else {
        // A standalone relay's config names the database and the sinks, and no feed.
        if config.relay.sinks.is_empty() {
            return Err(Failure::Usage(anyhow!(
                "config file {}: no [mqtt] section (needed by `run`) and no [[sink]] (needed \
                 by a standalone `relay`)",
                path.display()
            )));
        }
        let sinks: Vec<String> = config
            .relay
            .sinks
            .iter()
            .map(|s| format!("{} ({})", s.name, s.kind.name()))
            .collect();
        let _ = writeln!(
            crate::output::stdout(),
            "{}: ok for `relay` ({db}, sinks {}, source {}{metrics}; no [mqtt], so not for \
             `run`)",
            path.display(),
            sinks.join(" "),
            config.relay.source
        );
        return Ok(());
    };
    // The database directory may not exist yet: systemd creates StateDirectory at start.
    let brokers: Vec<String> = mqtt.brokers.iter().map(ToString::to_string).collect();
    let _ = writeln!(
        crate::output::stdout(),
        "{}: ok ({db}, brokers {}, topics {}, protocol {:?}{})",
        path.display(),
        brokers.join(" "),
        mqtt.topics.join(" "),
        mqtt.protocol,
        metrics
    );
    Ok(())
}
