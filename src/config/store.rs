//! `[store]`: where the store lives (a redb file or a PostgreSQL schema), validated.

use std::path::Path;

use super::ConfigError;
use super::limits::{MAX_DSN_BYTES, STATEMENT_TIMEOUT_MS, in_range, read_bounded};
use super::raw::{RawBackend, RawStore};
use super::redact::Secret;

/// Where the store lives: `[store] backend`.
#[derive(Debug, Clone)]
pub enum StoreBackend {
    /// One redb file (`[store] path` or `--db`).
    Redb,
    /// A PostgreSQL schema that several members may share.
    Postgres(PostgresStore),
}

/// `[store] backend = "postgres"`: the server and the schema.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    /// From `dsn` or `dsn_file`; never printed.
    pub dsn: Secret,
    pub schema: String,
    /// `statement_timeout_ms`: how long any one round trip to the server may take before
    /// the connection counts as lost.
    pub statement_timeout: std::time::Duration,
}

/// Where the store is, as `Config::location` found it.
#[derive(Debug, Clone, Copy)]
pub enum StoreLocation<'a> {
    File(&'a Path),
    Postgres(&'a PostgresStore),
}

impl PostgresStore {
    /// The connection settings (parsed when the config was validated).
    pub fn pg_config(&self) -> Result<crate::store::postgres::PgConfig, ConfigError> {
        crate::store::postgres::PgConfig::parse(self.dsn.expose(), &self.schema)
            .map(|c| c.with_statement_timeout(self.statement_timeout))
            .map_err(|e| ConfigError::Invalid(e.to_string()))
    }
}

/// The schema name when `[store] schema` is not given.
pub const DEFAULT_PG_SCHEMA: &str = "replay_guard";

/// Validates `[store]`'s backend keys.
pub(super) fn store_backend(raw: &RawStore) -> Result<StoreBackend, ConfigError> {
    let invalid = |m: String| ConfigError::Invalid(format!("[store] {m}"));
    match raw.backend {
        RawBackend::Redb => {
            for (key, set) in [
                ("dsn", raw.dsn.is_some()),
                ("dsn_file", raw.dsn_file.is_some()),
                ("schema", raw.schema.is_some()),
                ("statement_timeout_ms", raw.statement_timeout_ms.is_some()),
            ] {
                if set {
                    return Err(invalid(format!(
                        "{key} belongs to backend = \"postgres\" (this store is a redb file)"
                    )));
                }
            }
            Ok(StoreBackend::Redb)
        }
        RawBackend::Postgres => {
            if raw.path.is_some() {
                return Err(invalid(
                    "path belongs to backend = \"redb\": a postgres store has dsn (or \
                     dsn_file) and schema"
                        .into(),
                ));
            }
            let dsn = read_dsn(
                raw.dsn.as_ref(),
                raw.dsn_file.as_deref(),
                "backend = \"postgres\" needs exactly one of dsn and dsn_file (a dsn \
                         with a password belongs in dsn_file)",
            )
            .map_err(invalid)?;
            let schema = raw
                .schema
                .clone()
                .unwrap_or_else(|| DEFAULT_PG_SCHEMA.into());
            if let Some(why) = crate::store::postgres::schema::schema_name_problem(&schema) {
                return Err(invalid(format!("schema {schema:?} {why}")));
            }
            crate::store::postgres::PgConfig::parse(&dsn, &schema)
                .map_err(|e| invalid(e.to_string()))?;
            let timeout = crate::store::postgres::DEFAULT_STATEMENT_TIMEOUT;
            let timeout_ms = raw
                .statement_timeout_ms
                .unwrap_or(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
            in_range(
                "[store] statement_timeout_ms",
                timeout_ms,
                STATEMENT_TIMEOUT_MS,
            )?;
            Ok(StoreBackend::Postgres(PostgresStore {
                dsn: Secret(dsn),
                schema,
                statement_timeout: std::time::Duration::from_millis(timeout_ms),
            }))
        }
    }
}

/// The dsn given inline or in `file` (read bounded, trimmed): exactly one of them, not empty.
/// `neither_or_both` says why otherwise.
pub(super) fn read_dsn(
    dsn: Option<&String>,
    file: Option<&Path>,
    neither_or_both: &str,
) -> Result<String, String> {
    let dsn = match (dsn, file) {
        (Some(d), None) => d.clone(),
        (None, Some(p)) => read_bounded(p, MAX_DSN_BYTES)
            .map_err(|e| format!("dsn_file {}: {e}", p.display()))?
            .trim()
            .to_string(),
        _ => return Err(neither_or_both.to_string()),
    };
    if dsn.is_empty() {
        return Err("the dsn is empty".into());
    }
    Ok(dsn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_postgres_backend_is_validated_and_its_dsn_never_echoed() {
        let c = Config::parse(
            "[store]\nbackend = \"postgres\"\ndsn = \"host=db.eoc user=rg password=hunter2\"\n",
        )
        .unwrap();
        let StoreBackend::Postgres(pg) = &c.backend else {
            panic!("postgres expected")
        };
        assert_eq!(pg.schema, DEFAULT_PG_SCHEMA);
        assert_eq!(pg.statement_timeout, std::time::Duration::from_secs(10));
        assert!(!format!("{c:?}").contains("hunter2"));
        let target = pg.pg_config().unwrap().target();
        assert_eq!(
            target,
            "postgresql db.eoc:5432/postgres schema replay_guard"
        );
        assert!(c.require_db().is_err(), "a postgres store has no file");
        for (text, want) in [
            ("backend = \"postgres\"", "exactly one of dsn and dsn_file"),
            (
                "backend = \"postgres\"\ndsn = \"host=h\"\npath = \"/x\"",
                "path belongs to backend = \"redb\"",
            ),
            ("dsn = \"host=h\"", "dsn belongs to backend = \"postgres\""),
            (
                "statement_timeout_ms = 500",
                "statement_timeout_ms belongs to backend = \"postgres\"",
            ),
            (
                "backend = \"postgres\"\ndsn = \"host=h\"\nschema = \"Drop Table\"",
                "lower-case SQL name",
            ),
            (
                "backend = \"postgres\"\ndsn = \"host=h\"\nschema = \"pg_x\"",
                "must not start with pg_",
            ),
            (
                "backend = \"postgres\"\ndsn = \"host=h password=hunter2 sslmode=verify-full\"",
                "sslmode=verify-full needs sslrootcert=FILE",
            ),
            (
                "backend = \"postgres\"\ndsn = \"host=h password=hunter2 sslmode=verify-ca \
                 sslrootcert=/nonexistent/ca.pem\"",
                "sslrootcert /nonexistent/ca.pem",
            ),
            (
                "backend = \"postgres\"\ndsn = \"postgres://u:hunter2@h:notaport/db\"",
                "dsn is not understood",
            ),
            ("backend = \"sqlite\"", "unknown variant"),
        ] {
            let e = Config::parse(&format!("[store]\n{text}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        // The relay reads a PostgreSQL store too.
        let c = Config::parse(
            "[store]\nbackend = \"postgres\"\ndsn = \"host=h\"\n[[sink]]\nname = \"a\"\n\
             kind = \"exec\"\ncommand = [\"cat\"]\n",
        )
        .unwrap();
        assert_eq!(c.relay.sinks.len(), 1);
    }

    #[test]
    fn a_dsn_comes_inline_or_from_its_file_trimmed_exactly_one_and_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("dsn");
        std::fs::write(&file, "host=h user=u password=p\n").unwrap();
        let inline = "host=x".to_string();
        assert_eq!(
            super::read_dsn(Some(&inline), None, "one").unwrap(),
            "host=x"
        );
        assert_eq!(
            super::read_dsn(None, Some(&file), "one").unwrap(),
            "host=h user=u password=p"
        );
        assert_eq!(
            super::read_dsn(Some(&inline), Some(&file), "one"),
            Err("one".into())
        );
        assert_eq!(super::read_dsn(None, None, "one"), Err("one".into()));
        std::fs::write(&file, " \n").unwrap();
        assert_eq!(
            super::read_dsn(None, Some(&file), "one"),
            Err("the dsn is empty".into())
        );
        let missing = dir.path().join("none");
        assert!(
            super::read_dsn(None, Some(&missing), "one")
                .unwrap_err()
                .starts_with(&format!("dsn_file {}: ", missing.display()))
        );
    }
}
