//! `verify`: prove the audit chain and the record's invariants; exit 4 naming the first
//! broken entry.

use std::io::Write as _;

use anyhow::anyhow;

use super::Failure;
use crate::cli::DbArgs;
use crate::config::Config;
use crate::model::Outcome;
use crate::store::{Reader, verify};

pub fn run(args: &DbArgs) -> Result<(), Failure> {
    let config = Config::resolve(args.config.as_deref(), args.db.as_deref())?;
    let db = config.require_db()?;
    if !db.exists() {
        return Err(Failure::Usage(anyhow!(
            "database {} does not exist",
            db.display()
        )));
    }
    let reader = Reader::open(db)?;
    let report = verify::verify(&reader.begin()?)?;
    let counts: Vec<String> = Outcome::ALL
        .iter()
        .map(|o| format!("{o}={}", report.counts.get(*o)))
        .collect();
    match report.violation {
        None => {
            let _ = writeln!(
                std::io::stdout(),
                "verified {}: {} audit entries, hash chain intact; {} effects each applied once and audited; {}",
                db.display(),
                report.audit_entries,
                report.effects,
                counts.join(" ")
            );
            Ok(())
        }
        Some(v) => Err(Failure::Violation(anyhow!(
            "{}: verification failed: {v}",
            db.display()
        ))),
    }
}
