//! `backup`: a consistent copy of a live redb database into a new file (`store::backup`),
//! then `verify`'s checks on the copy. A PostgreSQL store is refused: `pg_dump` does it.

use std::io::Write as _;
use std::time::Instant;

use anyhow::anyhow;

use super::Failure;
use crate::cli::BackupArgs;
use crate::config::{Config, StoreLocation};
use crate::model::hex;
use crate::store::{self, Reader, StoreError};

pub fn run(args: &BackupArgs) -> Result<(), Failure> {
    let config = Config::resolve(args.db.config.as_deref(), args.db.db.as_deref())?;
    if let StoreLocation::Postgres(pg) = config.location()? {
        let cfg = pg.pg_config()?;
        return Err(Failure::Usage(anyhow!(
            "backup copies a redb file, and this store is {}: back it up with PostgreSQL's \
             own tool, one consistent snapshot while `run` writes: pg_dump --schema={} \
             --format=custom --file=FILE DBNAME (see the README, Backup and restore)",
            cfg.target(),
            cfg.schema
        )));
    }
    let db = config.require_db()?.to_path_buf();
    super::require_database(&db, "")?;
    let to = &args.to;
    let started = Instant::now();
    let spinner = crate::progress::Progress::step("copying");
    let report = store::backup::backup(&db, to, config.store.cache_bytes, crate::timefmt::now_ms());
    drop(spinner);
    let report = report.map_err(|e| match e {
        StoreError::Refused(why) => Failure::Usage(anyhow!(why)),
        other => Failure::from(other),
    })?;
    let copied_s = started.elapsed().as_secs_f64();
    // The copy must prove what the database proves: the same checks `verify` runs, and the
    // meta record (chain head, counters) of the snapshot it was taken from.
    let copy = Reader::open(to)?.begin()?;
    let checked = super::verify::checked(&copy, &config.feed, "verifying the backup")?;
    if let Some(v) = &checked.violation {
        return Err(Failure::Violation(anyhow!(
            "the backup {} does not verify: {v} (it holds the database's records unchanged, \
             so the database most likely does not verify either: run `verify` on it)",
            to.display()
        )));
    }
    if copy.meta()? != report.meta {
        return Err(Failure::Violation(anyhow!(
            "the backup {} does not hold the state it was copied from (meta record differs): \
             do not use it",
            to.display()
        )));
    }
    store::check_writer_open(to)?;
    let m = &report.meta;
    let head = if m.next_audit == 0 {
        "empty audit log".to_string()
    } else {
        format!("chain head {} at #{}", hex(&m.chain_head), m.next_audit - 1)
    };
    let _ = writeln!(
        crate::output::stdout(),
        "backed up {} to {} ({:.1} MiB in {copied_s:.1} s): {} audit entries ({head}), {} \
         effects, {} window entries, {} quarantined, {} sources, {} sink cursors; verified: \
         hash chain intact, {} effects and {} quarantine records match their audit entries",
        db.display(),
        to.display(),
        report.bytes as f64 / (1024.0 * 1024.0),
        report.rows(crate::store::tables::AUDIT.stored()),
        report.rows("effects"),
        (report.rows(crate::store::tables::WINDOW.name())
            + report.rows(crate::store::tables::WINDOW_RECENT.name()))
        .saturating_sub(report.rows("window_gone"))
        .saturating_sub(m.window_start.saturating_sub(m.window_purged)),
        report.rows("quarantine"),
        report.rows("sources"),
        report.rows("sink_cursors"),
        checked.effects,
        checked.quarantined,
    );
    Ok(())
}
