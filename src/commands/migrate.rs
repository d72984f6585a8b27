//! `migrate-schema` (create or upgrade the PostgreSQL schema) and `migrate --from PATH.redb`
//! (copy a single host's redb database into a new PostgreSQL schema, then verify the copy
//! against the original).

use std::io::Write as _;

use anyhow::anyhow;

use super::Failure;
use crate::cli::{MigrateArgs, MigrateSchemaArgs};
use crate::config::{Config, StoreLocation};
use crate::store::postgres::{PgConfig, PgStore};
use crate::store::{Reader, Snapshot, StoreError};
use crate::timefmt::now_ms;

/// The PostgreSQL settings of `--config`, or a usage error.
fn postgres(config: &Config) -> Result<PgConfig, Failure> {
    match config.location() {
        Ok(StoreLocation::Postgres(pg)) => Ok(pg.pg_config()?),
        _ => Err(Failure::Usage(anyhow!(
            "--config must set [store] backend = \"postgres\" (with dsn or dsn_file, and schema)"
        ))),
    }
}

pub fn run_schema(args: &MigrateSchemaArgs) -> Result<(), Failure> {
    let config = Config::load(&args.config)?;
    let cfg = postgres(&config)?;
    let target = cfg.target();
    let mut store = PgStore::unmigrated(cfg, config.store.clone());
    let report = store.migrate(now_ms())?;
    let what = if report.created {
        "created".to_string()
    } else if report.from == report.to {
        "already current".to_string()
    } else {
        format!("migrated from version {}", report.from)
    };
    let _ = writeln!(
        crate::output::stdout(),
        "{target}: schema version {} ({what})",
        report.to
    );
    Ok(())
}

pub fn run(args: &MigrateArgs) -> Result<(), Failure> {
    let config = Config::load(&args.config)?;
    let cfg = postgres(&config)?;
    let from = &args.from;
    if !from.is_file() {
        return Err(Failure::Usage(anyhow!(
            "{} is not a database file",
            from.display()
        )));
    }
    // A copy of a file a feed writer still extends would leave its later decisions behind.
    if let Some(holder) = crate::store::feed_writer(from)? {
        return Err(Failure::Runtime(anyhow!(
            "{} is being written by `run` or `ingest`{holder}: stop it first, then migrate",
            from.display()
        )));
    }
    let source = Reader::open(from)?.begin()?;
    let before = super::verify::checked(&source, &config.feed, "verifying the source")?;
    if let Some(v) = &before.violation {
        return Err(Failure::Violation(anyhow!(
            "{} does not verify, so it is not copied: {v}",
            from.display()
        )));
    }
    let target = cfg.target();
    let mut store = PgStore::open(cfg.clone(), config.store.clone(), now_ms())?;
    let spinner = crate::progress::Progress::step("copying into PostgreSQL");
    let copied = store.copy_from_redb(&source, now_ms());
    drop(spinner);
    let copied = copied.map_err(|e| match e {
        StoreError::Refused(why) => Failure::Usage(anyhow!(why)),
        other => Failure::from(other),
    })?;
    // The copy proves what the original proves, over the same chain.
    let (_, copy) = Reader::postgres(cfg)?;
    let after = super::verify::checked(&copy, &config.feed, "verifying the copy")?;
    // A file of an older schema is upgraded as it is copied: the copy's meta names this
    // build's version and its key index is checked too (the file may have none).
    let same = |a: &Snapshot, b: &Snapshot| -> Result<bool, StoreError> {
        let version = |mut m: crate::store::tables::Meta| {
            m.schema_version = 0;
            m
        };
        Ok(version(a.meta()?) == version(b.meta()?)
            && b.meta()?.schema_version == crate::store::tables::SCHEMA_VERSION
            && a.retention_marks()? == b.retention_marks()?)
    };
    let indexed = after.key_index.is_some() && after.source_index.is_some();
    let after = crate::store::verify::VerifyReport {
        key_index: before.key_index,
        source_index: before.source_index,
        ..after
    };
    if after.violation.is_some() || !indexed || after != before || !same(&source, &copy)? {
        return Err(Failure::Violation(anyhow!(
            "the copy in {target} does not verify like {}: {:?} (the copy is left for \
             inspection; drop the schema before trying again)",
            from.display(),
            after.violation
        )));
    }
    let meta = copy.meta()?;
    let _ = writeln!(
        crate::output::stdout(),
        "copied {} into {target}: {} audit entries, {} effects, {} window entries, {} \
         quarantined, {} sources; verified: chain head {} identical, {} effects and {} \
         quarantine records match their audit entries",
        from.display(),
        copied.rows(crate::store::tables::AUDIT.pg_table()),
        copied.rows("effects"),
        copied.rows("window_entries"),
        copied.rows("quarantine"),
        copied.rows("sources"),
        crate::model::hex(&meta.chain_head),
        after.effects,
        after.quarantined
    );
    Ok(())
}
