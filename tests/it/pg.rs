//! PostgreSQL for the tests: the real server on 127.0.0.1:5432 (user postgres, trust auth;
//! `scripts/test.sh` makes sure one runs). Each test makes its own database and drops it at
//! the end, also when it panics; no other database is touched.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// A database of this test run's own, dropped (WITH (FORCE): the sink may still be connected)
/// when the guard goes, panics included.
pub struct PgDb {
    pub name: String,
}

impl PgDb {
    pub fn new(tag: &str) -> PgDb {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "rg_it_{tag}_{}_{}_{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        psql("postgres", &format!("CREATE DATABASE {name}"));
        PgDb { name }
    }

    /// A handle on a database another guard owns (it is not dropped with this one).
    pub fn existing(name: &str) -> std::mem::ManuallyDrop<PgDb> {
        std::mem::ManuallyDrop::new(PgDb {
            name: name.to_string(),
        })
    }

    /// Runs `sql` in this database; the rows, one a line, columns split by `|`.
    pub fn sql(&self, sql: &str) -> String {
        psql(&self.name, sql)
    }

    pub fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port=5432 user=postgres dbname={}",
            self.name
        )
    }

    /// Ends every other client session on this database (the sink's connection; not an
    /// autovacuum worker that happens to be there).
    pub fn terminate_connections(&self) -> usize {
        let n = self.sql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
            self.name
        ));
        n.trim().parse().unwrap()
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let out = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                "5432",
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-c"])
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .output();
        if let Ok(o) = out
            && !o.status.success()
        {
            eprintln!(
                "could not drop test database {}: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

/// `psql` on database `db`: unaligned, tuples only; panics on any SQL error.
pub fn psql(db: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args(["-h", "127.0.0.1", "-p", "5432", "-U", "postgres", "-d", db])
        .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("run psql (the PostgreSQL client; scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "psql {sql:?} on {db}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
