//! `compact`: give back the file space retention freed. Needs the database to itself.

use std::io::Write as _;

use anyhow::anyhow;

use super::Failure;
use crate::cli::DbArgs;
use crate::config::Config;
use crate::store::{self, StoreError};

pub fn run(args: &DbArgs) -> Result<(), Failure> {
    let config = Config::resolve(args.config.as_deref(), args.db.as_deref())?;
    let db = config.require_db()?.to_path_buf();
    super::require_database(&db, "")?;
    let spinner = crate::progress::Progress::step("compacting");
    let report = store::compact(&db, config.store.cache_bytes);
    drop(spinner);
    let report = report.map_err(|e| match e {
        StoreError::Busy { path, holder } => Failure::Runtime(anyhow!(
            "{} is in use by `run` or `ingest`{holder}: stop the service first \
             (systemctl stop replay-guard), then compact",
            path.display()
        )),
        StoreError::Refused(why) => Failure::Runtime(anyhow!(why)),
        other => Failure::from(other),
    })?;
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let _ = writeln!(
        crate::output::stdout(),
        "compacted {}: {:.1} MiB -> {:.1} MiB",
        db.display(),
        mib(report.before_bytes),
        mib(report.after_bytes)
    );
    Ok(())
}
