//! A blocking PostgreSQL connection for the store thread: tokio-postgres driven by a
//! current-thread runtime of its own (the store's callers are plain threads), its errors
//! sorted into "the server is unreachable" (retry later, on a new connection), "the server
//! refused this" (a schema or data problem) and "TLS refused a certificate" (configuration).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use tokio_postgres::types::ToSql;

use tokio_postgres::{Client, Row, Statement};

use super::tls::{HandshakeError, PgTls, parse_dsn};
use crate::store::StoreError;

/// The connection settings, parsed once; never printed (the dsn may hold a password).
#[derive(Clone)]
pub struct PgConfig {
    pub(super) config: tokio_postgres::Config,
    /// The dsn's `sslmode` and certificates (files read when the dsn was parsed).
    tls: PgTls,
    /// The schema holding replay-guard's tables.
    pub schema: String,
}

impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Hosts and database only: never the password.
        write!(
            f,
            "PgConfig {{ hosts: {:?}, dbname: {:?}, schema: {:?} }}",
            self.config.get_hosts(),
            self.config.get_dbname(),
            self.schema
        )
    }
}

impl PgConfig {
    /// Parses `dsn` (key=value or a postgres:// URL, with libpq's `sslmode`, `sslrootcert`,
    /// `sslcert`, `sslkey`) and reads the certificate files it names. The error never quotes
    /// the dsn.
    pub fn parse(dsn: &str, schema: &str) -> Result<PgConfig, String> {
        let (mut config, tls) = parse_dsn(dsn)?;
        if config.get_application_name().is_none() {
            config.application_name("replay-guard");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(std::time::Duration::from_secs(10));
        }
        Ok(PgConfig {
            config,
            tls,
            schema: schema.to_string(),
        })
    }

    /// Where it connects, for messages: host(s), port and database, never the password.
    pub fn target(&self) -> String {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        format!(
            "postgresql {}:{port}/{} schema {}",
            hosts.join(","),
            self.config.get_dbname().unwrap_or("postgres"),
            self.schema
        )
    }
}

/// One live connection.
pub struct Conn {
    rt: tokio::runtime::Runtime,
    client: Client,
    /// Statements prepared on this connection, by their text: a query then costs one round
    /// trip instead of two (prepare, execute).
    prepared: RefCell<HashMap<String, Statement>>,
    /// Where it is connected, for messages (never the password).
    target: String,
    /// Relay sinks whose session-level advisory lock this connection's session holds (taken
    /// by `PgTx::claim_sink`; they end with the session, so a new connection starts empty).
    sink_locks: RefCell<HashSet<String>>,
}

impl Conn {
    pub fn connect(cfg: &PgConfig) -> Result<Conn, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Unreachable(format!("cannot start a runtime: {e}")))?;
        let (client, connection) = rt
            .block_on(cfg.config.connect(cfg.tls.clone()))
            .map_err(|e| classify(&e))?;
        // Driven whenever a query is (the runtime runs only inside `block_on`).
        rt.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("postgresql connection ended: {}", describe(&e));
            }
        });
        let conn = Conn {
            rt,
            client,
            prepared: RefCell::new(HashMap::new()),
            target: cfg.target(),
            sink_locks: RefCell::new(HashSet::new()),
        };
        // `CREATE ... IF NOT EXISTS` on every start must not log a NOTICE each time. The
        // keepalives let the server notice within about 25 s a member that vanished (a cut
        // link, not a closed socket) and end its session: its transaction, the schema's lock
        // and its relay sinks' locks are then released instead of holding the group for hours.
        conn.batch(
            "SET client_min_messages TO warning; SET tcp_keepalives_idle TO 10; \
             SET tcp_keepalives_interval TO 5; SET tcp_keepalives_count TO 3",
        )?;
        Ok(conn)
    }

    /// Where it is connected (host, port, database), for messages.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Whether this session holds sink `name`'s lock (see `PgTx::claim_sink`).
    pub fn holds_sink(&self, name: &str) -> bool {
        self.sink_locks.borrow().contains(name)
    }

    /// Notes that this session took sink `name`'s lock.
    pub fn took_sink(&self, name: &str) {
        self.sink_locks.borrow_mut().insert(name.to_string());
    }

    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    pub fn batch(&self, sql: &str) -> Result<(), StoreError> {
        self.rt
            .block_on(self.client.batch_execute(sql))
            .map_err(|e| classify(&e))
    }

    /// The prepared statement for `sql` (prepared on first use).
    fn statement(&self, sql: &str) -> Result<Statement, StoreError> {
        if let Some(st) = self.prepared.borrow().get(sql) {
            return Ok(st.clone());
        }
        let st = self
            .rt
            .block_on(self.client.prepare(sql))
            .map_err(|e| classify(&e))?;
        self.prepared
            .borrow_mut()
            .insert(sql.to_string(), st.clone());
        Ok(st)
    }

    pub fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, StoreError> {
        let st = self.statement(sql)?;
        self.rt
            .block_on(self.client.query(&st, params))
            .map_err(|e| classify(&e))
    }

    pub fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, StoreError> {
        let st = self.statement(sql)?;
        self.rt
            .block_on(self.client.execute(&st, params))
            .map_err(|e| classify(&e))
    }
}

/// `Unreachable` for a lost or refused connection (and a server shutting down), `Postgres`
/// for a statement the server refused, `TlsRefused` for a certificate or host name the TLS
/// handshake refused (a configuration error: no retry can mend it).
pub fn classify(e: &tokio_postgres::Error) -> StoreError {
    if HandshakeError::refusal_in(e).is_some() {
        return StoreError::TlsRefused(describe(e));
    }
    match e.as_db_error() {
        // 08: connection exception; 57P01..03: admin shutdown, crash shutdown, cannot connect
        // now; 53: insufficient resources (e.g. too many connections).
        Some(db)
            if db.code().code().starts_with("08")
                || db.code().code().starts_with("57P")
                || db.code().code().starts_with("53") =>
        {
            StoreError::Unreachable(describe(e))
        }
        Some(_) => StoreError::Postgres(describe(e)),
        None => StoreError::Unreachable(describe(e)),
    }
}

/// The error with its causes, without the dsn.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{}: {} ({})", db.severity(), db.message(), db.code().code());
        if let Some(d) = db.detail() {
            s.push_str(&format!("; {d}"));
        }
        return s;
    }
    let mut s = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        s.push_str(&format!(": {c}"));
        cause = c.source();
    }
    s
}
