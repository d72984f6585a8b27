//! `check-config`: validate a configuration for `run` without starting anything.

use std::io::Write as _;
use std::path::Path;

use anyhow::anyhow;

use super::Failure;
use crate::config::Config;

pub fn run(path: &Path) -> Result<(), Failure> {
    let config = Config::load(path)?;
    let db = config.require_db()?;
    let mqtt = config.mqtt.as_ref().ok_or_else(|| {
        Failure::Usage(anyhow!(
            "config file {}: no [mqtt] section (needed by `run`)",
            path.display()
        ))
    })?;
    // The database directory may not exist yet: systemd creates StateDirectory at start.
    let brokers: Vec<String> = mqtt.brokers.iter().map(ToString::to_string).collect();
    let _ = writeln!(
        std::io::stdout(),
        "{}: ok (database {}, brokers {}, topics {}, protocol {:?}{})",
        path.display(),
        db.display(),
        brokers.join(" "),
        mqtt.topics.join(" "),
        mqtt.protocol,
        config
            .metrics
            .map_or(String::new(), |a| format!(", metrics http://{a}/metrics"))
    );
    Ok(())
}
