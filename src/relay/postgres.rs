//! The `postgres` sink: each batch is inserted into `table` with the event id as primary key
//! (`ON CONFLICT (id) DO NOTHING`) and the sink's cursor row is upserted in the **same**
//! PostgreSQL transaction, so rows and cursor are committed together or not at all. The runner
//! trusts that stored cursor on start (`stored_cursor`); a redelivered event is a no-op. This
//! sink is therefore exactly-once by construction, across crashes of either side.
//!
//! tokio-postgres is named only here (and under `store/postgres/`). TLS as the store connects:
//! the dsn's `sslmode`, `sslrootcert`, `sslcert`, `sslkey` through `store::postgres::tls`.

use std::time::Duration;

use tokio::time::{Instant, timeout_at};
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use super::{Attempt, CursorAfter, Event, Failure};
use crate::config::PostgresSink as PostgresConfig;
use crate::store::postgres::describe;
use crate::store::postgres::tls::{HandshakeError, PgTls, parse_dsn};

/// The table holding every postgres sink's cursor, in the schema of the sink's table.
const CURSOR_TABLE: &str = "replay_guard_sink_cursors";

pub struct PostgresSink {
    /// The sink's name: its cursor row's key.
    name: String,
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
}

/// Why a transaction failed.
enum PgError {
    /// The server refused the data itself (SQLSTATE classes 22 data exception and 54 program
    /// limit exceeded): no retry of the same rows can succeed. The connection stays usable.
    Data { reason: String, response: String },
    /// Anything else (connection lost, timeout, a dropped table, missing privileges): retry on
    /// a new connection.
    Other(String),
}

impl PostgresSink {
    /// Parses the dsn; no I/O. The error never quotes the dsn (it may hold a password).
    pub fn new(
        name: &str,
        cfg: &PostgresConfig,
        timeout: Duration,
    ) -> Result<PostgresSink, String> {
        let (mut config, tls) =
            parse_dsn(cfg.dsn.expose()).map_err(|e| format!("sink {name:?}: {e}"))?;
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
            Err(PgError::Data { reason, response }) if batch.len() == 1 => {
                return poison(0, reason, response);
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
                generation: cursor.generation,
                next_after,
            };
            match self.commit(std::slice::from_ref(ev), one, deadline).await {
                Ok(()) => {}
                Err(PgError::Other(e)) => return Attempt::retry(i, e),
                Err(PgError::Data { reason, response }) => return poison(i, reason, response),
            }
        }
        Attempt::all(batch.len())
    }

    /// The cursor row of this sink, making the tables if they are missing.
    pub async fn stored_cursor(&mut self) -> Result<Option<CursorAfter>, String> {
        let deadline = Instant::now() + self.timeout;
        let (name, cursor_table) = (self.name.clone(), self.cursor_table.clone());
        let r = async {
            let conn = self.connected(deadline).await?;
            let row = timed(deadline, conn.client.query_opt(&conn.read_cursor, &[&name])).await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let (next, generation): (i64, i64) = (row.get(0), row.get(1));
            match (u64::try_from(next), u64::try_from(generation)) {
                (Ok(next_after), Ok(generation)) => Ok(Some(CursorAfter {
                    generation,
                    next_after,
                })),
                _ => Err(format!(
                    "the cursor row of sink {:?} in {} holds a negative value \
                     (next_offset {next}, generation {generation}): delete the row to let \
                     replay-guard's own cursor decide",
                    name, cursor_table
                )),
            }
        }
        .await;
        if r.is_err() {
            self.conn = None;
        }
        r
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
        let timeout_ms = self.timeout.as_millis();
        let name = self.name.clone();
        let conn = self.connected(deadline).await.map_err(PgError::Other)?;
        let work = async {
            let tx = conn.client.transaction().await?;
            tx.execute(
                &conn.insert,
                &[&ids, &offsets, &agencies, &source_ids, &topics, &events],
            )
            .await?;
            tx.execute(&conn.upsert_cursor, &[&name, &next, &generation])
                .await?;
            tx.commit().await
        };
        match timeout_at(deadline, work).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(classify(&e)),
            Err(_) => Err(PgError::Other(format!(
                "PostgreSQL did not commit the batch within {timeout_ms} ms (timeout_ms); \
                 the connection is dropped and the batch retried"
            ))),
        }
    }

    /// The live connection, or a new one (tables made, statements prepared).
    async fn connected(&mut self, deadline: Instant) -> Result<&mut Conn, String> {
        if self.conn.as_ref().is_some_and(|c| c.client.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let conn = self.connect(deadline).await?;
            tracing::info!(sink = %self.name, table = %self.table, "connected to PostgreSQL");
            self.conn = Some(conn);
        }
        self.conn
            .as_mut()
            .ok_or_else(|| "no PostgreSQL connection".to_string())
    }

    async fn connect(&self, deadline: Instant) -> Result<Conn, String> {
        let (client, connection) =
            match timeout_at(deadline, self.config.connect(self.tls.clone())).await {
                Ok(Ok(c)) => c,
                // Not an outage: retried (a sink cannot stop the process), but said plainly.
                Ok(Err(e)) if HandshakeError::refusal_in(&e).is_some() => {
                    return Err(format!(
                        "TLS to PostgreSQL ({}) refused: {}: a configuration error, not an \
                         outage (fix the sink's dsn: host, sslrootcert, sslcert/sslkey; or the \
                         server's certificate)",
                        self.server(),
                        describe(&e)
                    ));
                }
                Ok(Err(e)) => {
                    return Err(format!(
                        "connecting to PostgreSQL ({}): {}",
                        self.server(),
                        describe(&e)
                    ));
                }
                Err(_) => {
                    return Err(format!(
                        "connecting to PostgreSQL ({}): no answer in time (timeout_ms)",
                        self.server()
                    ));
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
        let upsert_cursor = timed(
            deadline,
            client.prepare_typed(
                &format!(
                    "INSERT INTO {} (sink, next_offset, generation, updated_at) \
                     VALUES ($1, $2, $3, now()) \
                     ON CONFLICT (sink) DO UPDATE SET next_offset = EXCLUDED.next_offset, \
                       generation = EXCLUDED.generation, updated_at = EXCLUDED.updated_at",
                    self.cursor_table
                ),
                &[Type::TEXT, Type::INT8, Type::INT8],
            ),
        )
        .await?;
        let read_cursor = timed(
            deadline,
            client.prepare_typed(
                &format!(
                    "SELECT next_offset, generation FROM {} WHERE sink = $1",
                    self.cursor_table
                ),
                &[Type::TEXT],
            ),
        )
        .await?;
        Ok(Conn {
            client,
            insert,
            upsert_cursor,
            read_cursor,
        })
    }

    /// Makes the two tables if they are missing. An existing table is left as it is (and
    /// needs no CREATE privilege). Two sinks creating the same table at once can collide in
    /// the catalog (unique_violation on pg_type, duplicate_table, or duplicate_object for the
    /// row type): the loser tries again (at most twice) and then sees the table.
    async fn create_tables(&self, client: &Client, deadline: Instant) -> Result<(), String> {
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
                       sink text PRIMARY KEY, \
                       next_offset bigint NOT NULL, \
                       generation bigint NOT NULL, \
                       updated_at timestamptz NOT NULL)",
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
            if exists.get::<_, bool>(0) {
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
                    Ok(Err(e)) => return Err(format!("creating {table}: {}", describe(&e))),
                    Err(_) => return Err(format!("creating {table}: timed out")),
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

fn poison(delivered: usize, reason: String, response: String) -> Attempt {
    Attempt {
        delivered,
        failure: Some(Failure::Poison { reason, response }),
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
) -> Result<T, String> {
    match timeout_at(deadline, f).await {
        Ok(r) => r.map_err(|e| describe(&e)),
        Err(_) => Err("PostgreSQL did not answer in time (timeout_ms)".into()),
    }
}

fn classify(e: &tokio_postgres::Error) -> PgError {
    match e.as_db_error() {
        Some(db) if ["22", "54"].contains(&&db.code().code()[..2]) => PgError::Data {
            reason: format!(
                "PostgreSQL refused the event: {} ({})",
                db.message(),
                db.code().code()
            ),
            response: describe(e),
        },
        _ => PgError::Other(describe(e)),
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
