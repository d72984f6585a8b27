//! The `postgres` sink: each batch is inserted into `table` with the event id as primary key
//! (`ON CONFLICT (id) DO NOTHING`) and the sink's cursor row is upserted in the **same**
//! PostgreSQL transaction, so rows and cursor are committed together or not at all. A
//! redelivered event is a no-op, so this sink is exactly-once by construction, across crashes
//! of either side.
//!
//! The cursor row is keyed by the replay-guard store's id, the events table (as PostgreSQL
//! resolves it) and the sink's name (an audit sink's as `NAME@audit`, a name no effects sink
//! can have): a row written for another store, table or stream is never read. An audit sink's
//! rows hold the audit index in `effect_offset`.
//! The runner adopts the row on start (`stored_cursor`), and passes over offsets on its
//! strength only as far as the rows are actually in the table (`holds_prefix`).
//!
//! tokio-postgres is named only here (and under `store/postgres/`). TLS as the store connects:
//! the dsn's `sslmode`, `sslrootcert`, `sslcert`, `sslkey` through `store::postgres::tls`.
//! Rows are read with `try_get`: a table of another shape is an error shown as the sink's last
//! error and retried, never a panic. Errors name tables, columns and constraints but never
//! quote a row (PostgreSQL's `DETAIL` of a refused row holds the event).

use std::time::Duration;

use tokio::time::{Instant, timeout_at};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use super::{Attempt, CursorAfter, Event, Failure};
use crate::config::PostgresSink as PostgresConfig;
use crate::store::postgres::describe;
use crate::store::postgres::tls::{DsnError, HandshakeError, PgTls, parse_dsn};
use crate::store::tables::Stream;

/// The table holding every postgres sink's cursor, in the schema of the sink's table, keyed
/// by (store id, events table, sink name), so a row of another store or table is never
/// adopted. The older `replay_guard_sink_cursors`, keyed by the sink's name alone, is never
/// read.
const CURSOR_TABLE: &str = "replay_guard_relay_cursors";

pub struct PostgresSink {
    /// The sink's name.
    name: String,
    /// Its cursor row's key: the name, with `@audit` for an audit sink.
    cursor_key: String,
    config: tokio_postgres::Config,
    tls: PgTls,
    /// The events table, as validated (`[a-z_][a-z0-9_]*`, optionally schema-qualified).
    table: String,
    cursor_table: String,
    timeout: Duration,
    conn: Option<Conn>,
}

/// A live connection with the tables made and the statements prepared.
struct Conn {
    client: Client,
    insert: Statement,
    upsert_cursor: Statement,
    read_cursor: Statement,
    present: Statement,
    /// The events table as PostgreSQL resolves it (`schema.table`): the cursor row's key.
    events_table: String,
}

/// Why the sink could not connect, make its tables or read its own cursor: retried, and
/// shown as the sink's last error. Server errors are `describe_safely`'s words, which never
/// quote a row.
#[derive(Debug, thiserror::Error)]
pub enum PgSinkError {
    /// A certificate or host name was refused in the TLS handshake: no retry can mend it.
    #[error(
        "TLS to PostgreSQL ({server}) refused: {error}: a configuration error, not an outage \
         (fix the sink's dsn: host, sslrootcert, sslcert/sslkey; or the server's certificate)"
    )]
    TlsRefused { server: String, error: String },
    #[error("connecting to PostgreSQL ({server}): {error}")]
    Connect { server: String, error: String },
    #[error("connecting to PostgreSQL ({server}): no answer in time (timeout_ms)")]
    ConnectTimeout { server: String },
    /// A round trip outlived the attempt's deadline.
    #[error("PostgreSQL did not answer in time (timeout_ms)")]
    Timeout,
    /// The server or the connection failed a statement.
    #[error("{0}")]
    Server(String),
    #[error("cannot resolve table {table}: {error}")]
    Resolve { table: String, error: String },
    #[error("creating {table}: {error}")]
    Create { table: String, error: String },
    #[error("creating {table}: timed out")]
    CreateTimeout { table: String },
    /// The cursor row is not of the shape replay-guard makes.
    #[error(
        "the cursor row of sink {sink:?} in {cursor_table} cannot be read ({error}): the table \
         is not the one replay-guard makes (next_offset and generation bigint); drop or fix it"
    )]
    CursorShape {
        sink: String,
        cursor_table: String,
        error: String,
    },
    #[error(
        "the cursor row of sink {sink:?} in {cursor_table} holds a negative value (next_offset \
         {next}, generation {generation}): delete the row to let replay-guard's own cursor \
         decide"
    )]
    NegativeCursor {
        sink: String,
        cursor_table: String,
        next: i64,
        generation: i64,
    },
    #[error("no PostgreSQL connection")]
    NoConnection,
}

/// The key of sink `name`'s cursor row: an effects sink's is its name (as before streams
/// existed), an audit sink's `NAME@audit`, so neither ever adopts the other's cursor.
fn cursor_key(name: &str, stream: Stream) -> String {
    match stream {
        Stream::Effects => name.to_string(),
        Stream::Audit => format!("{name}@audit"),
    }
}

/// Why a transaction failed.
enum PgError {
    /// The server refused the data itself (SQLSTATE classes 22 data exception and 54 program
    /// limit exceeded): no retry of the same rows can succeed. The connection stays usable.
    Data {
        code: String,
        reason: String,
        response: String,
    },
    /// Anything else (connection lost, timeout, a dropped table, missing privileges): retry on
    /// a new connection.
    Other(String),
}

impl PostgresSink {
    /// Parses the dsn; no I/O. The error never quotes the dsn (it may hold a password).
    pub fn new(
        name: &str,
        stream: Stream,
        cfg: &PostgresConfig,
        timeout: Duration,
    ) -> Result<PostgresSink, DsnError> {
        let (mut config, tls) = parse_dsn(cfg.dsn.expose())?;
        if config.get_application_name().is_none() {
            config.application_name(format!("replay-guard sink {name}"));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(timeout);
        }
        let cursor_table = match cfg.table.split_once('.') {
            Some((schema, _)) => format!("{schema}.{CURSOR_TABLE}"),
            None => CURSOR_TABLE.to_string(),
        };
        Ok(PostgresSink {
            name: name.to_string(),
            cursor_key: cursor_key(name, stream),
            config,
            tls,
            table: cfg.table.clone(),
            cursor_table,
            timeout,
            conn: None,
        })
    }

    /// One transaction for the whole batch; if the server refuses the data, the batch is
    /// retried one event per transaction to find the event to park.
    pub async fn deliver(&mut self, batch: &[Event], cursor: CursorAfter) -> Attempt {
        if batch.is_empty() {
            return Attempt::all(0);
        }
        let deadline = Instant::now() + self.timeout;
        match self.commit(batch, cursor, deadline).await {
            Ok(()) => return Attempt::all(batch.len()),
            Err(PgError::Other(e)) => return Attempt::retry(0, e),
            Err(PgError::Data {
                code,
                reason,
                response,
            }) if batch.len() == 1 => {
                return refused(0, code, reason, response);
            }
            Err(PgError::Data { reason, .. }) => {
                tracing::info!(sink = %self.name, events = batch.len(), %reason, "batch refused; delivering it one event at a time to find the event to park");
            }
        }
        for (i, ev) in batch.iter().enumerate() {
            let next_after = if i + 1 == batch.len() {
                cursor.next_after
            } else {
                ev.offset + 1
            };
            let one = CursorAfter {
                next_after,
                ..cursor
            };
            match self.commit(std::slice::from_ref(ev), one, deadline).await {
                Ok(()) => {}
                Err(PgError::Other(e)) => return Attempt::retry(i, e),
                Err(PgError::Data {
                    code,
                    reason,
                    response,
                }) => return refused(i, code, reason, response),
            }
        }
        Attempt::all(batch.len())
    }

    /// The cursor row of this sink for `store` and its table, making the tables if they are
    /// missing.
    pub async fn stored_cursor(
        &mut self,
        store: [u8; 16],
    ) -> Result<Option<CursorAfter>, PgSinkError> {
        let deadline = Instant::now() + self.timeout;
        let (name, cursor_table) = (self.cursor_key.clone(), self.cursor_table.clone());
        let store_id = crate::model::hex(&store);
        let r = async {
            let conn = self.connected(deadline).await?;
            let row = timed(
                deadline,
                conn.client
                    .query_opt(&conn.read_cursor, &[&store_id, &conn.events_table, &name]),
            )
            .await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let shape = |e: tokio_postgres::Error| PgSinkError::CursorShape {
                sink: name.clone(),
                cursor_table: cursor_table.clone(),
                error: describe_safely(&e),
            };
            let next = row.try_get::<_, i64>(0).map_err(shape)?;
            let generation = row.try_get::<_, i64>(1).map_err(shape)?;
            match (u64::try_from(next), u64::try_from(generation)) {
                (Ok(next_after), Ok(generation)) => Ok(Some(CursorAfter {
                    store,
                    generation,
                    next_after,
                })),
                _ => Err(PgSinkError::NegativeCursor {
                    sink: name.clone(),
                    cursor_table: cursor_table.clone(),
                    next,
                    generation,
                }),
            }
        }
        .await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    /// How many of `ids`, from the front, are in the events table.
    pub async fn holds_prefix(&mut self, ids: &[String]) -> Result<usize, PgSinkError> {
        let deadline = Instant::now() + self.timeout;
        let r = async {
            let conn = self.connected(deadline).await?;
            let mut held = 0;
            for chunk in ids.chunks(1000) {
                let rows = timed(deadline, conn.client.query(&conn.present, &[&chunk])).await?;
                let mut found = std::collections::HashSet::with_capacity(rows.len());
                for row in rows {
                    let id = row
                        .try_get::<_, String>(0)
                        .map_err(|e| PgSinkError::Server(describe_safely(&e)))?;
                    found.insert(id);
                }
                for id in chunk {
                    if !found.contains(id) {
                        return Ok(held);
                    }
                    held += 1;
                }
            }
            Ok(held)
        }
        .await;
        if r.is_err() {
            self.conn = None;
        }
        r
    }

    /// The cursor row's place, as the audit entry adopting it names it.
    pub fn cursor_home(&self) -> String {
        format!(
            "{} for table {} on {}",
            self.cursor_table,
            self.conn
                .as_ref()
                .map_or(self.table.as_str(), |c| c.events_table.as_str()),
            self.server()
        )
    }

    pub async fn close(&mut self) {
        // Dropping the client ends the connection task, which says goodbye to the server.
        self.conn = None;
    }

    /// Inserts `batch` and moves the cursor row to `cursor`, in one transaction. Any failure
    /// but a data error drops the connection, so the next attempt starts on a fresh one.
    async fn commit(
        &mut self,
        batch: &[Event],
        cursor: CursorAfter,
        deadline: Instant,
    ) -> Result<(), PgError> {
        let r = self.try_commit(batch, cursor, deadline).await;
        if let Err(PgError::Other(_)) = &r {
            self.conn = None;
        }
        r
    }

    async fn try_commit(
        &mut self,
        batch: &[Event],
        cursor: CursorAfter,
        deadline: Instant,
    ) -> Result<(), PgError> {
        let mut ids = Vec::with_capacity(batch.len());
        let mut offsets = Vec::with_capacity(batch.len());
        let mut agencies = Vec::with_capacity(batch.len());
        let mut source_ids = Vec::with_capacity(batch.len());
        let mut topics = Vec::with_capacity(batch.len());
        let mut events = Vec::with_capacity(batch.len());
        for e in batch {
            ids.push(e.id.as_str());
            offsets.push(pg_int(e.offset));
            agencies.push(e.agency.as_str());
            source_ids.push(e.source_id.as_str());
            topics.push(e.topic.as_str());
            events.push(e.json.as_str());
        }
        let (next, generation) = (pg_int(cursor.next_after), pg_int(cursor.generation));
        let store_id = crate::model::hex(&cursor.store);
        let timeout_ms = self.timeout.as_millis();
        let name = self.cursor_key.clone();
        let conn = self
            .connected(deadline)
            .await
            .map_err(|e| PgError::Other(e.to_string()))?;
        let work = async {
            let tx = conn.client.transaction().await?;
            tx.execute(
                &conn.insert,
                &[&ids, &offsets, &agencies, &source_ids, &topics, &events],
            )
            .await?;
            tx.execute(
                &conn.upsert_cursor,
                &[&store_id, &conn.events_table, &name, &next, &generation],
            )
            .await?;
            tx.commit().await
        };
        match timeout_at(deadline, work).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(classify(&e, &conn.events_table)),
            Err(_) => Err(PgError::Other(format!(
                "PostgreSQL did not commit the batch within {timeout_ms} ms (timeout_ms); \
                 the connection is dropped and the batch retried"
            ))),
        }
    }

    /// The live connection, or a new one (tables made, statements prepared).
    async fn connected(&mut self, deadline: Instant) -> Result<&mut Conn, PgSinkError> {
        if self.conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let conn = self.connect(deadline).await?;
            tracing::info!(sink = %self.name, table = %self.table, "connected to PostgreSQL");
            self.conn = Some(conn);
        }
        self.conn.as_mut().ok_or(PgSinkError::NoConnection)
    }

    async fn connect(&self, deadline: Instant) -> Result<Conn, PgSinkError> {
        let (client, connection) =
            match timeout_at(deadline, self.config.connect(self.tls.clone())).await {
                Ok(Ok(c)) => c,
                // Not an outage: retried (a sink cannot stop the process), but said plainly.
                Ok(Err(e)) if HandshakeError::refusal_in(&e).is_some() => {
                    return Err(PgSinkError::TlsRefused {
                        server: self.server(),
                        error: describe(&e),
                    });
                }
                Ok(Err(e)) => {
                    return Err(PgSinkError::Connect {
                        server: self.server(),
                        error: describe(&e),
                    });
                }
                Err(_) => {
                    return Err(PgSinkError::ConnectTimeout {
                        server: self.server(),
                    });
                }
            };
        let name = self.name.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(sink = %name, error = %describe(&e), "PostgreSQL connection ended");
            }
        });
        // The server gives up on a statement when we do, so no lock wait outlives an attempt.
        let ms = self.timeout.as_millis();
        timed(
            deadline,
            client.batch_execute(&format!("SET statement_timeout = {ms}")),
        )
        .await?;
        self.create_tables(&client, deadline).await?;
        let insert = timed(
            deadline,
            client.prepare_typed(
                &format!(
                    "INSERT INTO {} (id, effect_offset, source, agency, source_id, topic, event, \
                     received_at) \
                     SELECT u.id, u.off, j.e->>'source', u.agency, u.source_id, u.topic, j.e, \
                            (j.e->>'time')::timestamptz \
                     FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], \
                                 $6::text[]) AS u(id, off, agency, source_id, topic, ev) \
                     CROSS JOIN LATERAL (SELECT u.ev::jsonb AS e) AS j \
                     ON CONFLICT (id) DO NOTHING",
                    self.table
                ),
                &[
                    Type::TEXT_ARRAY,
                    Type::INT8_ARRAY,
                    Type::TEXT_ARRAY,
                    Type::TEXT_ARRAY,
                    Type::TEXT_ARRAY,
                    Type::TEXT_ARRAY,
                ],
            ),
        )
        .await?;
        let resolved = timed(
            deadline,
            client.query_one(
                "SELECT n.nspname::text || '.' || c.relname::text FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
                &[&self.table],
            ),
        )
        .await?;
        let events_table = resolved
            .try_get::<_, String>(0)
            .map_err(|e| PgSinkError::Resolve {
                table: self.table.clone(),
                error: describe_safely(&e),
            })?;
        let upsert_cursor = timed(
            deadline,
            client.prepare_typed(
                &format!(
                    "INSERT INTO {} (store_id, events_table, sink, next_offset, generation, \
                       updated_at) \
                     VALUES ($1, $2, $3, $4, $5, now()) \
                     ON CONFLICT (store_id, events_table, sink) DO UPDATE SET \
                       next_offset = EXCLUDED.next_offset, generation = EXCLUDED.generation, \
                       updated_at = EXCLUDED.updated_at",
                    self.cursor_table
                ),
                &[Type::TEXT, Type::TEXT, Type::TEXT, Type::INT8, Type::INT8],
            ),
        )
        .await?;
        let read_cursor = timed(
            deadline,
            client.prepare_typed(
                &format!(
                    "SELECT next_offset, generation FROM {} \
                     WHERE store_id = $1 AND events_table = $2 AND sink = $3",
                    self.cursor_table
                ),
                &[Type::TEXT, Type::TEXT, Type::TEXT],
            ),
        )
        .await?;
        let present = timed(
            deadline,
            client.prepare_typed(
                &format!(
                    "SELECT id::text FROM {} WHERE id = ANY($1::text[])",
                    self.table
                ),
                &[Type::TEXT_ARRAY],
            ),
        )
        .await?;
        Ok(Conn {
            client,
            insert,
            upsert_cursor,
            read_cursor,
            present,
            events_table,
        })
    }

    /// Makes the two tables if they are missing. An existing table is left as it is (and
    /// needs no CREATE privilege). Two sinks creating the same table at once can collide in
    /// the catalog (unique_violation on pg_type, duplicate_table, or duplicate_object for the
    /// row type): the loser tries again (at most twice) and then sees the table.
    async fn create_tables(&self, client: &Client, deadline: Instant) -> Result<(), PgSinkError> {
        let ddl = [
            (
                self.table.as_str(),
                format!(
                    "CREATE TABLE IF NOT EXISTS {} (\
                       id text PRIMARY KEY, \
                       effect_offset bigint NOT NULL, \
                       source text NOT NULL, \
                       agency text NOT NULL, \
                       source_id text NOT NULL, \
                       topic text NOT NULL, \
                       event jsonb NOT NULL, \
                       received_at timestamptz, \
                       inserted_at timestamptz NOT NULL DEFAULT now())",
                    self.table
                ),
            ),
            (
                self.cursor_table.as_str(),
                format!(
                    "CREATE TABLE IF NOT EXISTS {} (\
                       store_id text NOT NULL, \
                       events_table text NOT NULL, \
                       sink text NOT NULL, \
                       next_offset bigint NOT NULL, \
                       generation bigint NOT NULL, \
                       updated_at timestamptz NOT NULL, \
                       PRIMARY KEY (store_id, events_table, sink))",
                    self.cursor_table
                ),
            ),
        ];
        for (table, create) in ddl {
            let exists = timed(
                deadline,
                client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&table]),
            )
            .await?;
            if exists.try_get::<_, bool>(0).unwrap_or(false) {
                continue;
            }
            let mut tries = 0;
            loop {
                tries += 1;
                match timeout_at(deadline, client.batch_execute(&create)).await {
                    Ok(Ok(())) => break,
                    Ok(Err(e)) if tries < 3 && is_creation_race(&e) => {
                        tracing::debug!(sink = %self.name, %table, "concurrent CREATE TABLE; trying again");
                    }
                    Ok(Err(e)) => {
                        return Err(PgSinkError::Create {
                            table: table.to_string(),
                            error: describe_safely(&e),
                        });
                    }
                    Err(_) => {
                        return Err(PgSinkError::CreateTimeout {
                            table: table.to_string(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// `host:port` of the configured server(s), for errors (never the dsn: it may hold a
    /// password).
    fn server(&self) -> String {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let ports = self.config.get_ports();
        let port = ports.first().copied().unwrap_or(5432);
        if hosts.is_empty() {
            format!("localhost:{port}")
        } else {
            format!("{}:{port}", hosts.join(","))
        }
    }
}

fn refused(delivered: usize, class: String, reason: String, response: String) -> Attempt {
    Attempt {
        delivered,
        failure: Some(Failure::Refused {
            class,
            reason,
            response,
        }),
    }
}

/// Offsets and generations stay far below 2^63; PostgreSQL has no unsigned bigint.
fn pg_int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Runs `f` until `deadline`; a late answer is an error like any other.
async fn timed<T>(
    deadline: Instant,
    f: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, PgSinkError> {
    match timeout_at(deadline, f).await {
        Ok(r) => r.map_err(|e| PgSinkError::Server(describe_safely(&e))),
        Err(_) => Err(PgSinkError::Timeout),
    }
}

/// An error in words without quoting data: the server's message, SQLSTATE, and the table,
/// column, constraint and type it names, but never its `DETAIL` (for a refused row,
/// "Failing row contains (...)": the event itself).
fn describe_safely(e: &tokio_postgres::Error) -> String {
    let Some(db) = e.as_db_error() else {
        return describe(e);
    };
    // A data exception's message may quote the value refused (`invalid input syntax for
    // type integer: "…"`): a piece of the event. Quoted text is left out of those.
    let message = if db.code().code().starts_with("22") {
        unquoted(db.message())
    } else {
        db.message().to_string()
    };
    let mut s = format!(
        "{}: {message} (SQLSTATE {})",
        db.severity(),
        db.code().code()
    );
    for (what, v) in [
        ("table", db.table()),
        ("column", db.column()),
        ("constraint", db.constraint()),
        ("type", db.datatype()),
    ] {
        if let Some(v) = v {
            s.push_str(&format!(", {what} {v}"));
        }
    }
    s
}

/// `text` with each double-quoted part replaced by `"…"`.
fn unquoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut parts = text.split('"');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    let rest: Vec<&str> = parts.collect();
    for (i, part) in rest.iter().enumerate() {
        if i % 2 == 0 {
            // Inside quotes, if a closing quote follows.
            if i + 1 < rest.len() {
                out.push_str("\"…\"");
            } else {
                out.push('"');
                out.push_str(part);
            }
        } else {
            out.push_str(part);
        }
    }
    out
}

fn classify(e: &tokio_postgres::Error, table: &str) -> PgError {
    match e.as_db_error() {
        Some(db) if ["22", "54"].contains(&&db.code().code()[..2]) => PgError::Data {
            code: format!("SQLSTATE {}", db.code().code()),
            reason: format!(
                "table {table} refused the event: {} (SQLSTATE {})",
                unquoted(db.message()),
                db.code().code()
            ),
            response: describe_safely(e),
        },
        _ => PgError::Other(describe_safely(e)),
    }
}

fn is_creation_race(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    e.code().is_some_and(|c| {
        [
            SqlState::UNIQUE_VIOLATION,
            SqlState::DUPLICATE_TABLE,
            SqlState::DUPLICATE_OBJECT,
        ]
        .contains(c)
    })
}

#[cfg(test)]
mod tests {
    use super::unquoted;

    #[test]
    fn quoted_values_are_left_out_of_data_errors() {
        assert_eq!(
            unquoted("invalid input syntax for type integer: \"abc\""),
            "invalid input syntax for type integer: \"…\""
        );
        assert_eq!(unquoted("a \"x\" b \"y\" c"), "a \"…\" b \"…\" c");
        assert_eq!(unquoted("no quotes"), "no quotes");
        assert_eq!(unquoted("one \" open"), "one \" open");
    }
}
