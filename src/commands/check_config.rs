//! `check-config`: validate a configuration for `run`, or for a standalone `relay` (sinks and
//! no `[mqtt]`), without starting anything: on either backend, a redb file or a PostgreSQL
//! schema, whose server is not contacted (the dsn is parsed and its certificate files read).

use std::io::Write as _;
use std::path::Path;

use anyhow::anyhow;

use super::Failure;
use crate::config::{Config, StoreLocation};
use crate::textsafe::escape_controls;

pub fn run(path: &Path) -> Result<(), Failure> {
    let config = Config::load(path)?;
    let db = match config.location()? {
        StoreLocation::File(db) => format!("database {}", db.display()),
        StoreLocation::Postgres(pg) => format!("store {}, not contacted", pg.pg_config()?.target()),
    };
    // An exec sink's program is otherwise found missing only at the first delivery (the
    // relay unit's too, when `[relay] sinks_from` names its config: both files are checked).
    for sink in config.relay.named() {
        if let crate::config::SinkKind::Exec(exec) = &sink.kind
            && let Some(why) = exec.program_problem(std::env::var_os("PATH").as_deref())
        {
            return Err(Failure::Usage(anyhow!(
                "config file {}: [[sink]] {:?} command: {}: install it or fix `command` (an \
                 argv array, no shell; a name without `/` is looked up on PATH)",
                path.display(),
                sink.name,
                escape_controls(&why)
            )));
        }
    }
    let sinks: Vec<String> = config
        .relay
        .sinks
        .iter()
        .map(|s| {
            // An effects sink as before; an audit sink says so, with its selection.
            let stream = match (s.stream, &s.outcomes) {
                (crate::store::tables::Stream::Effects, _) => String::new(),
                (_, None) => ", audit stream".into(),
                (_, Some(o)) => format!(
                    ", audit stream: {}",
                    o.iter().map(|o| o.as_str()).collect::<Vec<_>>().join(" ")
                ),
            };
            format!("{} ({}{stream})", escape_controls(&s.name), s.kind.name())
        })
        .collect();
    let declared: Vec<String> = config
        .relay
        .declared
        .iter()
        .map(|s| format!("{} ({})", escape_controls(&s.name), s.kind.name()))
        .collect();
    let declared = match &config.relay.sinks_from {
        Some(from) if !declared.is_empty() => format!(
            ", declares {} for the relay unit ({}: retention holds for them, `run` does not \
             deliver them)",
            declared.join(" "),
            from.display()
        ),
        _ => String::new(),
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
        "{}: ok ({db}, brokers {}, topics {}, protocol {}, {}{declared}{metrics})",
        path.display(),
        brokers.join(" "),
        mqtt.topics.join(" "),
        mqtt.protocol,
        if sinks.is_empty() && declared.is_empty() {
            "no [[sink]]: effects reach no one".to_string()
        } else if sinks.is_empty() {
            "no [[sink]] of its own".to_string()
        } else {
            format!("sinks {}", sinks.join(" "))
        },
    );
    Ok(())
}
