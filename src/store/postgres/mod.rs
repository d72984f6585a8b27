//! The PostgreSQL backend: the same store (window, marks, effects, quarantine, hash-chained
//! audit) in a schema that several replay-guard processes share. Each batch is one
//! transaction, decided by the same `engine::Writer` as the redb file's.
//!
//! Concurrency: every write transaction first takes one transaction-level advisory lock per
//! schema, so the members' batches are serialised exactly as redb serialises its writers: each
//! starts from every commit before it (READ COMMITTED takes a fresh snapshot per statement,
//! and the lock is granted only after the previous holder's commit is visible), decides as if
//! alone, and appends to the one audit chain. tokio-postgres is named only in this module
//! (and the relay's postgres sink).

mod conn;
pub(crate) mod copy;
pub(crate) mod schema;
pub(crate) mod tls;
mod tx;
pub mod view;

use conn::Conn;
pub use conn::{DEFAULT_STATEMENT_TIMEOUT, PgConfig, describe, follow_commits};
use schema::{PG_SCHEMA_VERSION, Sql};
use tx::PgTx;

use super::engine::Writer;
use super::tables::*;
use super::{BatchReport, StoreError, StoreOptions};
use crate::wire::Incoming;

/// A member's handle on the shared schema. Reconnects on the next call after the server was
/// lost; a batch whose COMMIT got no answer is reported `Unreachable` and not acknowledged,
/// so its redelivery is decided against whatever did commit.
pub struct PgStore {
    cfg: PgConfig,
    opts: StoreOptions,
    sql: Sql,
    /// `NOTIFY` on the schema's channel, then `COMMIT`.
    notify_commit: String,
    conn: Option<Conn>,
    /// Whom `run` consumes as, recorded by the next batch.
    consumption: crate::store::upstream::Consumption,
}

impl PgStore {
    /// Connects, creates or migrates the schema, and checks its meta record.
    pub fn open(cfg: PgConfig, opts: StoreOptions, now_ms: u64) -> Result<PgStore, StoreError> {
        let mut store = PgStore::unmigrated(cfg, opts);
        store.migrate(now_ms)?;
        Ok(store)
    }

    /// A handle that has not connected nor looked at the schema yet (`migrate-schema`).
    pub fn unmigrated(cfg: PgConfig, opts: StoreOptions) -> PgStore {
        PgStore {
            sql: Sql::new(&cfg.schema),
            notify_commit: format!("NOTIFY {}", channel(&cfg.schema)),
            cfg,
            opts,
            conn: None,
            consumption: Default::default(),
        }
    }

    /// The connection settings (the relay's LISTEN connection uses them too).
    pub fn config(&self) -> &PgConfig {
        &self.cfg
    }

    /// Makes a connection if there is none or it was lost.
    fn conn(&mut self) -> Result<(), StoreError> {
        if self.conn.as_ref().is_none_or(Conn::is_closed) {
            self.conn = None;
            self.conn = Some(Conn::connect(&self.cfg)?);
        }
        Ok(())
    }

    /// Runs `f` in one transaction holding the schema's lock; commits if it returns `Ok`.
    /// A lost connection is dropped (the next call reconnects).
    fn in_txn<R>(
        &mut self,
        f: impl FnOnce(&Conn, &Sql) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.conn()?;
        let (Some(conn), sql) = (self.conn.as_ref(), &self.sql) else {
            return Err(StoreError::Unreachable("no connection".into()));
        };
        let result = (|| {
            // Sent with the transaction's first read (or its COMMIT): one round trip less each.
            conn.defer_batch("BEGIN ISOLATION LEVEL READ COMMITTED");
            conn.defer_batch(&sql.lock);
            let r = f(conn, sql)?;
            conn.batch("COMMIT")?;
            // A commit that appended to a log wakes the relays that LISTEN on the schema's
            // channel, with a NOTIFY of its own after the COMMIT: inside the transaction, a
            // full notification queue (a listener that stopped reading, anywhere on the
            // server) would fail every commit. A lost wake-up costs one head poll.
            if conn.take_appended()
                && let Err(e) = conn.batch(&self.notify_commit)
            {
                // The commit stands; a connection this left given up is made again by the
                // next batch, and this says why.
                tracing::warn!(error = %e, "the NOTIFY after a commit failed (the commit stands; the relays find it by polling the head): {e}");
            }
            Ok(r)
        })();
        if let Err(e) = &result {
            conn.discard_deferred();
            if matches!(e, StoreError::Unreachable(_)) || conn.is_closed() {
                self.conn = None;
            } else {
                // Leaves no transaction open; if even this fails the connection is dropped.
                if conn.batch("ROLLBACK").is_err() {
                    self.conn = None;
                }
            }
        }
        result
    }

    /// Creates the schema and its tables, or takes them to this build's version; writes the
    /// meta record of a new store. Safe to run from several members at once (it holds the
    /// schema's lock).
    pub fn migrate(&mut self, now_ms: u64) -> Result<MigrateReport, StoreError> {
        let schema = self.cfg.schema.clone();
        self.in_txn(|conn, sql| {
            conn.batch(&format!(
                "CREATE SCHEMA IF NOT EXISTS {schema};
                 CREATE TABLE IF NOT EXISTS {schema}.schema_version (version integer NOT NULL)"
            ))?;
            let rows = conn.query(&format!("SELECT version FROM {schema}.schema_version"), &[])?;
            let found: i32 = rows.first().map_or(0, |r| r.get(0));
            if found > PG_SCHEMA_VERSION {
                return Err(StoreError::Schema {
                    found: u32::try_from(found).unwrap_or(0),
                    expected: u32::try_from(PG_SCHEMA_VERSION).unwrap_or(0),
                });
            }
            for v in found..PG_SCHEMA_VERSION {
                let ddl = schema::migration(v, &schema).ok_or_else(|| {
                    StoreError::Postgres(format!("no migration from schema version {v}"))
                })?;
                if found > 0 {
                    tracing::info!(
                        schema = %schema,
                        from = v,
                        to = v + 1,
                        "upgrading the PostgreSQL schema {schema} from version {v} to {}: a step that indexes rows already there reads all of them (version 5: about 24 s at 20M audit entries)",
                        v + 1
                    );
                }
                conn.batch_within(&ddl, schema::MIGRATION_DEADLINE)?;
            }
            if found == 0 {
                conn.execute(
                    &format!("INSERT INTO {schema}.schema_version (version) VALUES ($1)"),
                    &[&PG_SCHEMA_VERSION],
                )?;
            } else if found < PG_SCHEMA_VERSION {
                conn.execute(
                    &format!("UPDATE {schema}.schema_version SET version = $1"),
                    &[&PG_SCHEMA_VERSION],
                )?;
            }
            let meta = conn.query(
                &format!("SELECT record FROM {schema}.meta WHERE name = $1"),
                &[&META.key()],
            )?;
            let created = match meta.first() {
                Some(row) => {
                    let m = META.decode(row.get::<_, &[u8]>(0))?;
                    if m.schema_version != SCHEMA_VERSION {
                        // An older store (or one `migrate --from` copied from an older
                        // file): upgraded in this transaction, or refused.
                        let mut tx = PgTx::begin(conn, sql)?;
                        super::upgrade::to_current(&mut tx)?;
                        tx.flush()?;
                    }
                    false
                }
                None => {
                    let m = Meta::new(now_ms);
                    conn.execute(
                        &format!("INSERT INTO {schema}.meta (name, record) VALUES ($1, $2)"),
                        &[&META.key(), &META.encode(&m)],
                    )?;
                    true
                }
            };
            // Every store opened for writing has an id; a copy's first writer draws its own.
            let identity = conn.query(
                &format!("SELECT record FROM {schema}.meta WHERE name = $1"),
                &[&IDENTITY.key()],
            )?;
            let stored = identity
                .first()
                .map(|row| IDENTITY.decode(row.get::<_, &[u8]>(0)))
                .transpose()?;
            if let Some(identity) = super::identity::settled(stored)? {
                conn.execute(
                    &format!(
                        "INSERT INTO {schema}.meta (name, record) VALUES ($1, $2) \
                         ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record"
                    ),
                    &[&IDENTITY.key(), &IDENTITY.encode(&identity)],
                )?;
            }
            Ok(MigrateReport {
                from: found,
                to: PG_SCHEMA_VERSION,
                created,
            })
        })
    }

    /// Runs `f` on a `Tx` of one transaction under the schema's lock, then sends what it
    /// wrote and commits (operator writes).
    pub(crate) fn write<R>(
        &mut self,
        f: impl for<'a> FnOnce(PgTx<'a>, &StoreOptions) -> Result<(PgTx<'a>, R), StoreError>,
    ) -> Result<R, StoreError> {
        let opts = self.opts.clone();
        self.in_txn(|conn, sql| {
            let (mut tx, r) = f(PgTx::begin(conn, sql)?, &opts)?;
            tx.flush()?;
            Ok(r)
        })
    }

    /// Decides and records every delivery of `batch` in one PostgreSQL transaction. On `Err`
    /// nothing of the batch may be acknowledged; `Unreachable` is worth retrying (the same
    /// batch, after a backoff): if an unanswered COMMIT did land, the retry decides its
    /// messages `duplicate` and applies nothing twice.
    pub fn commit_batch(
        &mut self,
        batch: &[Incoming],
        now_ms: u64,
    ) -> Result<BatchReport, StoreError> {
        let opts = self.opts.clone();
        let consumed_as = self.consumption.pending().cloned();
        let positions = crate::store::engine::positions(batch);
        let report = self.in_txn(|conn, sql| {
            let tx = PgTx::begin_batch(conn, sql, &positions)?;
            let mut w = Writer::open(tx, &opts)?;
            let report = w.decide_batch(batch, now_ms, consumed_as.as_ref())?;
            w.finish()?.flush()?;
            Ok(report)
        })?;
        self.consumption.committed();
        Ok(report)
    }

    /// `Backend::consume_as`.
    pub fn consume_as(&mut self, c: crate::store::upstream::ConsumedAs) {
        self.consumption.set(c);
    }

    /// `Backend::confirm_gaps` on this schema (its own transaction under the lock).
    pub fn confirm_gaps(
        &mut self,
        candidates: &[crate::store::upstream::ReportedGap],
        now_ms: u64,
    ) -> Result<crate::store::upstream::GapCheck, StoreError> {
        self.write(|mut tx, _| {
            let check = crate::store::upstream::confirm_gaps(&mut tx, candidates, now_ms)?;
            Ok((tx, check))
        })
    }

    /// `Backend::note_connect` on this schema (its own transaction under the lock).
    pub fn note_connect(
        &mut self,
        broker: &str,
        client_id: &str,
        session_present: bool,
        now_ms: u64,
    ) -> Result<Option<SessionLoss>, StoreError> {
        self.write(|mut tx, _| {
            let loss = crate::store::upstream::note_connect(
                &mut tx,
                broker,
                client_id,
                session_present,
                now_ms,
            )?;
            Ok((tx, loss))
        })
    }
}

impl PgStore {
    /// Records a replay burst (its own small transaction).
    pub fn record_burst(&mut self, burst: &BurstRecord) -> Result<(), StoreError> {
        let schema = self.cfg.schema.clone();
        self.in_txn(|conn, _| {
            conn.execute(
                &format!(
                    "INSERT INTO {schema}.replay_bursts (no, record) \
                     SELECT coalesce(max(no) + 1, 0), $1 FROM {schema}.replay_bursts"
                ),
                &[&REPLAY_BURSTS.encode(burst)],
            )?;
            Ok(())
        })
    }
}

/// The channel a schema's commits are announced on (`NOTIFY`), which the relays `LISTEN`
/// on: `rg_` and the schema's name, cut to PostgreSQL's 63-byte identifiers (two schemas
/// that share their first 60 bytes then share a channel: a wake-up too many, no harm).
pub fn channel(schema: &str) -> String {
    let mut name = format!("rg_{schema}");
    while name.len() > 63 {
        name.pop();
    }
    name
}

/// What `migrate` found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrateReport {
    /// The schema's version before (0: none).
    pub from: i32,
    pub to: i32,
    /// A new, empty store was created.
    pub created: bool,
}
