//! The relay: the effect log as a transactional outbox, delivered to downstream
//! systems by one task per `[[sink]]`, each with a durable cursor in the database.
//!
//! Delivery is at-least-once per sink; every event carries a stable id (`envelope`), so it is
//! exactly-once wherever the receiver keeps the id (the postgres sink keeps it itself, in the
//! same transaction as its cursor). Sinks live here, outside the store and the decision core:
//! the store only keeps cursors and parked events (`store::relay`) and gives effects by
//! offset (`Snapshot::scan_effects`).
//!
//! A sink is driven through `Sink::deliver`: it is handed a batch of events in effect-offset
//! order and says how many of them, from the front, were delivered, and what went wrong with
//! the next one. A windowed sink (`mqtt`, `http`, `syslog` over RELP) is instead handed
//! events as the runner reads them (`Sink::hand`) and reports the acknowledged prefix as it
//! grows (`Sink::acked`), so that events of the next batch go out while the previous batch's
//! acknowledgements are on their way. The runner (`runner`) drives the cursor, backoff, parking and shutdown by
//! the rules of `state`, which does no I/O.

pub mod envelope;
mod exec;
mod http;
mod mqtt;
mod postgres;
mod relp;
mod runner;
mod state;
mod syslog;

use std::time::Duration;

use crate::config::{Config, SinkConfig, SinkKind, Start};
use crate::model::{Outcome, hex};
use crate::store::AuditEntry;
use crate::store::StoreError;
use crate::store::postgres::tls::DsnError;
use crate::store::relay::{RelayStore, StartAt};
use crate::store::tables::{EffectRecord, Stream};

pub use http::HttpError;
pub use postgres::PgSinkError;
pub use runner::{Relay, RelayError, Wake, spawn};
pub use state::{BLOCKED, FAILING, reported as reported_state};
pub use syslog::{APP_NAME as SYSLOG_APP_NAME, SD_ID as SYSLOG_SD_ID};

/// What a sink's last error says of its condition: `Some("failing")` (its task ended and is
/// being restarted), `Some("blocked")` (its receiver refuses every event), else `None` (an
/// ordinary failed attempt, retried).
pub fn condition(last_error: &str) -> Option<&'static str> {
    if last_error.starts_with(FAILING) {
        Some("failing")
    } else if last_error.starts_with(BLOCKED) {
        Some("blocked")
    } else {
        None
    }
}

/// Receiver text (a program's stderr, an HTTP body, a server's message) as it may be logged or
/// printed: control characters escaped, so it can neither forge lines nor drive a terminal.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    crate::textsafe::escape_controls(text)
}

/// Where a sink configured with `start` begins.
pub fn start_at(start: Start) -> StartAt {
    match start {
        Start::Beginning => StartAt::Beginning,
        Start::Head => StartAt::Head,
    }
}

/// Makes the cursor of every `[[sink]]` of `config` that has none (`declare_sinks`): the
/// writers (`run`, `ingest`) and the relay call it as they load the config, before anything
/// commits, so retention keeps from then on every effect a configured sink has yet to
/// deliver, however late its relay starts or however long it keeps failing.
pub fn declare_sinks(store: &mut impl RelayStore, config: &Config) -> Result<(), StoreError> {
    let sinks: Vec<(&str, &str, Stream, StartAt)> = config
        .relay
        .named()
        .map(|s| (s.name.as_str(), s.kind.name(), s.stream, start_at(s.start)))
        .collect();
    store
        .declare_sinks(&sinks, crate::timefmt::now_ms())
        .map(drop)
}

/// Why a sink cannot be made from its configuration, or could not answer the runner's
/// questions about its own store (retried, and shown as the sink's last error).
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The `http` sink's url or header values cannot be sent.
    #[error("sink {sink:?}: {error}")]
    Http { sink: String, error: HttpError },
    /// The `postgres` sink's dsn cannot be used.
    #[error("sink {sink:?}: {error}")]
    Dsn { sink: String, error: DsnError },
    /// The `postgres` sink could not connect, make its tables or read its own cursor.
    #[error(transparent)]
    Postgres(#[from] PgSinkError),
}

/// One event offered to a sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The effect's offset in the log (an audit sink's: the audit entry's index).
    pub offset: u64,
    /// The CloudEvents id (`envelope::event_id`, `envelope::audit_event_id`).
    pub id: String,
    /// The key (all zeros for an audit entry that names none).
    pub key: [u8; 32],
    pub agency: String,
    pub source_id: String,
    /// The MQTT topic the message arrived on (a relay action's entry: the sink's name).
    pub topic: String,
    /// The CloudEvents envelope, one line of compact JSON (`envelope::envelope`).
    pub json: String,
    /// What the event records, for sinks that frame it themselves (`syslog`): the decision's
    /// outcome (`applied` for an effect of the effect log) ...
    pub outcome: String,
    /// ... and its named values, in this order, each present only when known:
    /// `key` (hex), `source` (`agency/source_id`), `sequence`, `epoch`, `outcome`, `reason`,
    /// `effect_offset`, `entry_hash` (hex).
    pub fields: Vec<(&'static str, String)>,
}

impl Event {
    /// An effect's event of source `fire/SOURCE` at `offset`, for the sinks' unit tests.
    #[cfg(test)]
    pub(crate) fn for_test(offset: u64, source: &str) -> Event {
        Event {
            offset,
            id: format!("id{offset}"),
            key: [0; 32],
            agency: "fire".into(),
            source_id: source.into(),
            topic: "t".into(),
            json: "{}".into(),
            outcome: "applied".into(),
            fields: Vec::new(),
        }
    }

    /// The event of the effect at `offset` (the effect log's), under CloudEvents `source`.
    pub fn of_effect(source: &str, offset: u64, r: &EffectRecord) -> Event {
        let view = envelope::EffectView::of(offset, r);
        let (outcome, fields) = envelope::effect_fields(&view);
        Event {
            offset,
            id: envelope::event_id(&r.key, r.released, &r.payload),
            key: r.key,
            agency: r.agency.clone(),
            source_id: r.source_id.clone(),
            topic: r.topic.clone(),
            json: envelope::envelope(source, &view),
            outcome,
            fields,
        }
    }

    /// The event of audit entry `entry` (an audit sink's), under CloudEvents `source`.
    pub fn of_audit(source: &str, entry: &AuditEntry) -> Event {
        let r = &entry.record;
        let outcome = Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str);
        let mut fields = Vec::with_capacity(8);
        if let Some(k) = &r.key {
            fields.push(("key", hex(k)));
        }
        if let (Some(a), Some(s)) = (&r.agency, &r.source_id) {
            fields.push(("source", format!("{a}/{s}")));
        }
        if let Some(s) = r.sequence {
            fields.push(("sequence", s.to_string()));
        }
        if let Some(e) = r.epoch {
            fields.push(("epoch", e.to_string()));
        }
        fields.push(("outcome", outcome.to_string()));
        if !r.reason.is_empty() {
            fields.push(("reason", r.reason.clone()));
        }
        if let Some(o) = r.effect_offset {
            fields.push(("effect_offset", o.to_string()));
        }
        fields.push(("entry_hash", hex(&r.hash)));
        Event {
            offset: entry.index,
            id: envelope::audit_event_id(entry.index, &r.hash),
            key: r.key.unwrap_or_default(),
            agency: r.agency.clone().unwrap_or_default(),
            source_id: r.source_id.clone().unwrap_or_default(),
            topic: r.topic.clone(),
            json: envelope::audit_envelope(source, entry),
            outcome: outcome.to_string(),
            fields,
        }
    }
}

/// Why the event after the delivered prefix was not delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Try again after a backoff: a timeout, a lost connection, an overloaded receiver.
    /// `after` is the receiver's own wish (`Retry-After`), honoured as the least wait.
    Retry {
        error: String,
        after: Option<Duration>,
    },
    /// The receiver refuses this event for good (HTTP 4xx other than 408/409/425/429, an
    /// MQTT 5 PUBACK saying "not authorized", ...): park it (or block, per `on_poison`).
    Poison { reason: String, response: String },
    /// As `Poison`, for a refusal of a kind (`class`, e.g. a SQLSTATE) that may hold for
    /// every event rather than for this one (a table whose shape refuses the feed): parked
    /// like a poisoned event, unless the same class refuses the next event of another source
    /// too, which blocks the sink instead (`runner`).
    Refused {
        class: String,
        reason: String,
        response: String,
    },
}

/// What one delivery attempt of a batch achieved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// How many events, from the front of the batch, the receiver has acknowledged.
    pub delivered: usize,
    /// What went wrong with `batch[delivered]`; `None` only when the whole batch was
    /// delivered.
    pub failure: Option<Failure>,
}

impl Attempt {
    pub fn all(n: usize) -> Attempt {
        Attempt {
            delivered: n,
            failure: None,
        }
    }
    pub fn retry(delivered: usize, error: impl Into<String>) -> Attempt {
        Attempt {
            delivered,
            failure: Some(Failure::Retry {
                error: error.into(),
                after: None,
            }),
        }
    }
}

/// Where the sink's durable cursor will be once the batch is delivered. Sinks that store a
/// cursor beside the data (postgres) write `next_after` with the data, in one transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CursorAfter {
    /// The store's id (`store::identity`): a sink's own cursor is kept for one store only.
    pub store: [u8; 16],
    pub generation: u64,
    /// The first offset after the batch.
    pub next_after: u64,
}

/// A configured sink, connected lazily (the first `deliver` connects; a lost connection is
/// reconnected by the next one).
pub enum Sink {
    Exec(exec::ExecSink),
    Mqtt(mqtt::MqttSink),
    Http(Box<http::HttpSink>),
    Postgres(Box<postgres::PostgresSink>),
    Syslog(Box<syslog::SyslogSink>),
    /// A `syslog` sink with a `relp://` or `relp+tls://` url.
    Relp(Box<relp::RelpSink>),
}

impl Sink {
    /// Builds the sink from its validated configuration; no I/O yet.
    pub fn new(cfg: &SinkConfig) -> Result<Sink, SinkError> {
        match &cfg.kind {
            SinkKind::Exec(e) => Ok(Sink::Exec(exec::ExecSink::new(e, cfg.timeout))),
            SinkKind::Mqtt(m) => Ok(Sink::Mqtt(mqtt::MqttSink::new(m, cfg.timeout))),
            SinkKind::Http(h) => http::HttpSink::new(h, cfg.timeout, cfg.max_in_flight)
                .map(|s| Sink::Http(Box::new(s)))
                .map_err(|error| SinkError::Http {
                    sink: cfg.name.clone(),
                    error,
                }),
            SinkKind::Postgres(p) => {
                postgres::PostgresSink::new(&cfg.name, cfg.stream, p, cfg.timeout)
                    .map(|s| Sink::Postgres(Box::new(s)))
                    .map_err(|error| SinkError::Dsn {
                        sink: cfg.name.clone(),
                        error,
                    })
            }
            SinkKind::Syslog(s) if s.url.relp => {
                Ok(Sink::Relp(Box::new(relp::RelpSink::new(s, cfg.timeout))))
            }
            SinkKind::Syslog(s) => Ok(Sink::Syslog(Box::new(syslog::SyslogSink::new(
                s,
                cfg.timeout,
            )))),
        }
    }

    /// Delivers `batch` (in offset order; within one source, order matters). Never panics on
    /// what a receiver says; every failure is an `Attempt` with a `Failure`.
    pub async fn deliver(&mut self, batch: &[Event], cursor: CursorAfter) -> Attempt {
        match self {
            Sink::Exec(s) => s.deliver(batch, cursor).await,
            Sink::Mqtt(_) | Sink::Http(_) | Sink::Relp(_) => self.deliver_windowed(batch).await,
            Sink::Postgres(s) => s.deliver(batch, cursor).await,
            Sink::Syslog(s) => s.deliver(batch, cursor).await,
        }
    }

    /// A windowed sink's `deliver`: the window over this one batch.
    async fn deliver_windowed(&mut self, batch: &[Event]) -> Attempt {
        // Anything left by a call abandoned mid-way is not ours to report.
        self.forget();
        self.hand(batch);
        let mut delivered = 0;
        while delivered < batch.len() {
            let a = self.acked().await;
            delivered += a.delivered;
            if a.failure.is_some() || a.delivered == 0 {
                self.forget();
                return Attempt {
                    delivered,
                    failure: a.failure,
                };
            }
        }
        Attempt::all(batch.len())
    }

    /// Whether the sink takes events as a window (`hand`, `acked`, `forget`) that the runner
    /// keeps full across its batches, rather than batch by batch (`deliver`).
    pub fn windowed(&self) -> bool {
        matches!(self, Sink::Mqtt(_) | Sink::Http(_) | Sink::Relp(_))
    }

    /// Windowed: hands `events` (the ones after those handed over before, in offset order)
    /// to the sink, which sends them behind those in flight. A sink without the mode ignores
    /// them.
    pub fn hand(&mut self, events: &[Event]) {
        match self {
            Sink::Mqtt(s) => s.hand(events),
            Sink::Http(s) => s.hand(events),
            Sink::Relp(s) => s.hand(events),
            _ => {}
        }
    }

    /// Windowed: waits until more of the events handed over are acknowledged from the
    /// front (`delivered`, never 0 without a failure while any are pending), or one fails:
    /// `failure` is then that of the event after the acknowledged ones, and the sink has
    /// forgotten every event handed over (the runner hands the rest over again). Cancel-safe.
    pub async fn acked(&mut self) -> Attempt {
        match self {
            Sink::Mqtt(s) => s.acked().await,
            Sink::Http(s) => s.acked().await,
            Sink::Relp(s) => s.acked().await,
            _ => Attempt::retry(0, "the sink takes no window"),
        }
    }

    /// Windowed: forgets every event handed over and not yet reported (an operator moved the
    /// cursor, or the relay stops): whatever of them still arrives is delivered again later.
    pub fn forget(&mut self) {
        match self {
            Sink::Mqtt(s) => s.forget(),
            Sink::Http(s) => s.forget(),
            Sink::Relp(s) => s.forget(),
            _ => {}
        }
    }

    /// The cursor this sink keeps beside its data for `store`, which the runner adopts on
    /// start (`None`: the sink keeps none, or none for this store). Connects if needed.
    pub async fn stored_cursor(
        &mut self,
        store: [u8; 16],
    ) -> Result<Option<CursorAfter>, SinkError> {
        match self {
            Sink::Exec(_) => Ok(None),
            Sink::Http(_) => Ok(None),
            Sink::Postgres(s) => Ok(s.stored_cursor(store).await?),
            Sink::Mqtt(_) => Ok(None),
            Sink::Syslog(_) | Sink::Relp(_) => Ok(None),
        }
    }

    /// How many of `ids`, from the front, the sink's own store holds (a sink with a cursor
    /// of its own: before the runner passes over events on the strength of that cursor).
    pub async fn holds_prefix(&mut self, ids: &[String]) -> Result<usize, SinkError> {
        match self {
            Sink::Postgres(s) => Ok(s.holds_prefix(ids).await?),
            _ => Ok(0),
        }
    }

    /// Where the cursor of `stored_cursor` lives, for the audit entry that adopts it.
    pub fn cursor_home(&self) -> String {
        match self {
            Sink::Postgres(s) => s.cursor_home(),
            _ => String::new(),
        }
    }

    /// Closes connections politely (within the shutdown timeout).
    pub async fn close(&mut self) {
        match self {
            Sink::Exec(_) => {}
            Sink::Mqtt(s) => s.close().await,
            Sink::Http(s) => s.close().await,
            Sink::Postgres(s) => s.close().await,
            Sink::Syslog(s) => s.close().await,
            Sink::Relp(s) => s.close().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tables::AuditRecord;

    #[test]
    fn an_effects_event_names_its_outcome_and_fields_in_the_shared_order() {
        let r = EffectRecord {
            source_no: 0,
            epoch: 2,
            sequence: 7,
            received_at_ms: 1_000,
            key: [1; 32],
            agency: "fire".into(),
            source_id: "e7".into(),
            topic: "incidents/fire".into(),
            late: true,
            released: false,
            audit_index: 4,
            payload: br#"{"a":1}"#.to_vec(),
            digest: Some([2; 32]),
        };
        let ev = Event::of_effect("urn:x", 9, &r);
        assert_eq!(ev.outcome, "applied_late");
        // The fields are `envelope::effect_fields`' (whose order its own test checks).
        assert_eq!(
            ev.fields,
            envelope::effect_fields(&envelope::EffectView::of(9, &r)).1
        );
        assert_eq!(ev.fields[1].1, "fire/e7");
        assert_eq!(ev.fields[5].1, "9");
        let released = Event::of_effect(
            "urn:x",
            9,
            &EffectRecord {
                released: true,
                ..r
            },
        );
        assert_eq!(released.outcome, "released");
    }

    #[test]
    fn an_audit_event_names_every_field_its_entry_has() {
        let mut r = AuditRecord {
            recorded_at_ms: 1_000,
            outcome: Outcome::Stale.code(),
            key: Some([2; 32]),
            agency: Some("fire".into()),
            source_id: Some("e7".into()),
            epoch: Some(1),
            sequence: Some(3),
            topic: "incidents/fire".into(),
            reason: "at or below the evicted floor".into(),
            digest: None,
            effect_offset: None,
            quarantine_id: Some(0),
            prev_hash: [0; 32],
            hash: [3; 32],
        };
        let ev = Event::of_audit(
            "urn:x",
            &AuditEntry {
                index: 5,
                record: r.clone(),
            },
        );
        assert_eq!((ev.offset, ev.outcome.as_str()), (5, "stale"));
        assert_eq!(ev.id, format!("5-{}", "03".repeat(8)));
        let names: Vec<&str> = ev.fields.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            names,
            [
                "key",
                "source",
                "sequence",
                "epoch",
                "outcome",
                "reason",
                "entry_hash"
            ]
        );
        // A malformed message's entry: no key, no source, no position; an applying one has
        // its effect's offset.
        r.outcome = Outcome::Malformed.code();
        (r.key, r.agency, r.source_id, r.epoch, r.sequence) = (None, None, None, None, None);
        r.effect_offset = Some(8);
        let ev = Event::of_audit(
            "urn:x",
            &AuditEntry {
                index: 6,
                record: r,
            },
        );
        let names: Vec<&str> = ev.fields.iter().map(|(k, _)| *k).collect();
        assert_eq!(names, ["outcome", "reason", "effect_offset", "entry_hash"]);
        assert_eq!((ev.agency.as_str(), ev.key), ("", [0; 32]));
    }
}
