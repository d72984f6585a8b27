//! One module per subcommand, and the exit-code contract they share.

pub mod backup;
pub mod check_config;
pub mod compact;
pub mod demo;
pub mod dump;
pub mod explain;
pub mod gaps;
pub mod health;
pub mod ingest;
pub mod manual;
pub mod migrate;
pub mod quarantine;
pub mod relay;
pub mod report;
pub mod run;
pub mod stats;
pub mod verify;

use std::process::ExitCode;

/// Exit code of a usage or configuration error: fix the command or the file.
pub const EXIT_USAGE: u8 = 1;
/// Exit code of a runtime or storage failure (systemd restarts the service on it).
pub const EXIT_FAILURE: u8 = 2;
/// Exit code after a second SIGTERM/SIGINT cut the drain short.
pub const EXIT_FORCED: u8 = 3;
/// Exit code of `verify` finding a broken chain or invariant.
pub const EXIT_VIOLATION: u8 = 4;

/// The config `--config` names, with `--db` over its `store.path`: read once per command.
pub fn config(args: &crate::cli::DbArgs) -> Result<crate::config::Config, Failure> {
    Ok(crate::config::Config::resolve(
        args.config.as_deref(),
        args.db.as_deref(),
    )?)
}

/// Reports a store's schema upgrade to systemd as it goes (see `service::report_upgrades`).
pub fn report_upgrades() {
    crate::service::report_upgrades();
}

/// The read-only snapshot of an existing database named by `--db` or `--config`.
pub fn open_existing(
    args: &crate::cli::DbArgs,
) -> Result<(std::path::PathBuf, crate::store::Snapshot), Failure> {
    open_snapshot(&config(args)?)
}

/// The read-only snapshot of the existing store `config` names.
pub fn open_snapshot(
    config: &crate::config::Config,
) -> Result<(std::path::PathBuf, crate::store::Snapshot), Failure> {
    if let crate::config::StoreLocation::Postgres(pg) = config.location()? {
        let cfg = pg.pg_config()?;
        let name = std::path::PathBuf::from(cfg.target());
        let (_, snap) = crate::store::Reader::postgres(cfg)?;
        return Ok((name, snap));
    }
    let (name, reader) = open_reader_of(config)?;
    Ok((name, reader.begin()?))
}

/// A read-only handle on an existing database named by `--db` or `--config`, for commands
/// that take several snapshots (`--follow`).
pub fn open_reader(
    args: &crate::cli::DbArgs,
) -> Result<(std::path::PathBuf, crate::store::Reader), Failure> {
    open_reader_of(&config(args)?)
}

pub fn open_reader_of(
    config: &crate::config::Config,
) -> Result<(std::path::PathBuf, crate::store::Reader), Failure> {
    if let crate::config::StoreLocation::Postgres(pg) = config.location()? {
        let cfg = pg.pg_config()?;
        let name = std::path::PathBuf::from(cfg.target());
        let (reader, _) = crate::store::Reader::postgres(cfg)?;
        return Ok((name, reader));
    }
    let db = config.require_db()?.to_path_buf();
    require_database(&db, "")?;
    let reader = crate::store::Reader::open(&db)?;
    Ok((db, reader))
}

/// The store named by `config` opened for an operator's write (`quarantine`, `relay`): a
/// redb file that must exist (opened beside a running `run`), or the PostgreSQL schema.
pub fn open_operator(config: &crate::config::Config) -> Result<crate::store::Backend, Failure> {
    use crate::store::{Backend, Store, postgres::PgStore};
    Ok(match config.location()? {
        crate::config::StoreLocation::Postgres(pg) => Backend::Postgres(PgStore::open(
            pg.pg_config()?,
            config.store.clone(),
            crate::timefmt::now_ms(),
        )?),
        crate::config::StoreLocation::File(db) => {
            require_database(db, "")?;
            Backend::Redb(Store::open_operator(db, config.store.clone())?)
        }
    })
}

/// Refuses a database path that cannot be looked at: missing, or not reachable by this user
/// (said as such, not as a missing file). `hint` follows "does not exist".
pub(crate) fn require_database(db: &std::path::Path, hint: &str) -> Result<(), Failure> {
    match std::fs::metadata(db) {
        Ok(_) => Ok(()),
        Err(e) => Err(Failure::Usage(unreachable_database(db, e.kind(), hint))),
    }
}

fn unreachable_database(
    db: &std::path::Path,
    kind: std::io::ErrorKind,
    hint: &str,
) -> anyhow::Error {
    if kind == std::io::ErrorKind::PermissionDenied {
        crate::store::StoreError::Denied(db.to_path_buf()).into()
    } else {
        anyhow::anyhow!("database {} does not exist{hint}", db.display())
    }
}

/// A command's failure, classified by what the operator must do about it.
#[derive(Debug)]
pub enum Failure {
    Usage(anyhow::Error),
    Runtime(anyhow::Error),
    /// `verify` found tampering or a broken invariant.
    Violation(anyhow::Error),
    /// A second SIGTERM/SIGINT cut the drain short.
    Forced(anyhow::Error),
}

impl Failure {
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Failure::Usage(_) => EXIT_USAGE,
            Failure::Runtime(_) => EXIT_FAILURE,
            Failure::Violation(_) => EXIT_VIOLATION,
            Failure::Forced(_) => EXIT_FORCED,
        })
    }
    pub fn error(&self) -> &anyhow::Error {
        match self {
            Failure::Usage(e)
            | Failure::Runtime(e)
            | Failure::Violation(e)
            | Failure::Forced(e) => e,
        }
    }
}

impl From<crate::config::ConfigError> for Failure {
    fn from(e: crate::config::ConfigError) -> Self {
        Failure::Usage(e.into())
    }
}

impl From<crate::store::StoreError> for Failure {
    fn from(e: crate::store::StoreError) -> Self {
        if e.is_config() {
            Failure::Usage(e.into())
        } else {
            Failure::Runtime(e.into())
        }
    }
}

/// A sink that another process already delivers is a configuration conflict (two configs
/// name it): exit 1, which systemd does not restart in a loop.
impl From<crate::relay::RelayError> for Failure {
    fn from(e: crate::relay::RelayError) -> Self {
        use crate::relay::RelayError;
        match e {
            RelayError::Config(_)
            | RelayError::Sink(_)
            | RelayError::Store(crate::store::StoreError::SinkBusy { .. }) => {
                Failure::Usage(e.into())
            }
            RelayError::Store(e) => e.into(),
            other => Failure::Runtime(other.into()),
        }
    }
}

/// Output errors: a closed pipe (`| head`) ends the command quietly; others are failures.
impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::Runtime(anyhow::Error::new(e).context("cannot write output"))
    }
}

impl From<crate::service::ServiceError> for Failure {
    fn from(e: crate::service::ServiceError) -> Self {
        match e {
            crate::service::ServiceError::Config(_)
            | crate::service::ServiceError::NoMqtt
            | crate::service::ServiceError::Transport(_) => Failure::Usage(e.into()),
            crate::service::ServiceError::Relay(r) => r.into(),
            crate::service::ServiceError::Forced => Failure::Forced(e.into()),
            crate::service::ServiceError::Store(e) => e.into(),
            _ => Failure::Runtime(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use std::path::Path;

    #[test]
    fn an_unreadable_database_path_is_reported_as_permission_denied_not_missing() {
        let e = unreachable_database(Path::new("/x/db.redb"), ErrorKind::PermissionDenied, "");
        let text = e.to_string();
        assert!(text.contains("permission denied on /x/db.redb"), "{text}");
        assert!(text.contains("as root"), "{text}");
        assert!(!text.contains("does not exist"), "{text}");
    }

    #[test]
    fn a_missing_database_path_is_reported_as_missing_with_its_hint() {
        let e = unreachable_database(Path::new("/x/db.redb"), ErrorKind::NotFound, " (hint)");
        assert_eq!(e.to_string(), "database /x/db.redb does not exist (hint)");
    }
}
