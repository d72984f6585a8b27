//! The listings' records: one type per listing (`dump-*`, `explain --format json`, `relay
//! parked`, `relay status`, `gaps`), each naming its fields once, in `Record::COLUMNS`.

use super::{Record, num, opt_hex, opt_num, opt_text, text, time};
use crate::json::{self, Json};
use crate::model::{Outcome, hex};
use crate::store::relay::Parked;
use crate::store::{self, AuditEntry, Effect, QuarantineEntry};

/// An audit entry: its hashed fields (`store::audit_body_fields`, shared with the hash chain),
/// then `prev_hash` and `hash`.
pub struct AuditRow<'a>(pub &'a AuditEntry);

impl Record for AuditRow<'_> {
    const COLUMNS: &'static [&'static str] = &[
        "index",
        "recorded_at",
        "outcome",
        "key",
        "agency",
        "source_id",
        "epoch",
        "sequence",
        "topic",
        "reason",
        "digest",
        "effect_offset",
        "quarantine_id",
        "prev_hash",
        "hash",
    ];
    const TABLE: &'static [(&'static str, usize)] = &[
        ("index", 8),
        ("recorded_at", 25),
        ("outcome", 13),
        ("agency", 12),
        ("source_id", 14),
        ("epoch", 6),
        ("sequence", 10),
        ("key", 17),
        ("effect_offset", 14),
        ("quarantine_id", 14),
        ("reason", 0),
    ];
    const TIMES: &'static [&'static str] = &["recorded_at"];

    fn values(&self) -> Vec<Json> {
        let AuditEntry { index, record } = self.0;
        let mut values: Vec<Json> = store::audit_body_fields(*index, record)
            .into_iter()
            .map(|(_, v)| v)
            .collect();
        values.push(Json::String(hex(&record.prev_hash)));
        values.push(Json::String(hex(&record.hash)));
        values
    }
}

/// An effect: its stored message as the JSON object it parsed as when it was applied.
pub struct EffectRow<'a> {
    effect: &'a Effect,
    message: Json,
    damaged: Option<String>,
}

impl<'a> EffectRow<'a> {
    pub fn new(effect: &'a Effect) -> Self {
        // Effects hold payloads that parsed as JSON objects (at most 128 levels deep, the
        // largest `max_depth`); if that fails now, show the bytes as a string and say so.
        let payload = &effect.record.payload;
        let (message, damaged) = match json::parse(payload, 128) {
            Ok(v) => (v, None),
            Err(e) => (Json::String(escape_bytes(payload).0), Some(e.to_string())),
        };
        EffectRow {
            effect,
            message,
            damaged,
        }
    }
}

impl Record for EffectRow<'_> {
    const COLUMNS: &'static [&'static str] = &[
        "offset",
        "key",
        "agency",
        "source_id",
        "epoch",
        "sequence",
        "topic",
        "received_at",
        "late",
        "released",
        "audit_index",
        "message",
    ];
    const TABLE: &'static [(&'static str, usize)] = &[
        ("offset", 8),
        ("received_at", 25),
        ("agency", 12),
        ("source_id", 14),
        ("epoch", 6),
        ("sequence", 10),
        ("late", 6),
        ("key", 17),
        ("topic", 20),
        ("message", 0),
    ];
    const TIMES: &'static [&'static str] = &["received_at"];

    fn values(&self) -> Vec<Json> {
        let r = &self.effect.record;
        vec![
            num(self.effect.offset),
            opt_hex(Some(r.key)),
            text(&r.agency),
            text(&r.source_id),
            num(r.epoch),
            num(r.sequence),
            text(&r.topic),
            time(r.received_at_ms),
            Json::Bool(r.late),
            Json::Bool(r.released),
            num(r.audit_index),
            self.message.clone(),
        ]
    }

    fn damage(&self) -> Option<(&'static str, &str)> {
        self.damaged.as_deref().map(|e| ("message", e))
    }
}

/// A quarantine record: its payload as reversible text (`escape_bytes`).
pub struct QuarantineRow<'a> {
    entry: &'a QuarantineEntry,
    outcome: Option<Outcome>,
    payload: String,
    encoding: &'static str,
    damaged: Option<String>,
}

impl<'a> QuarantineRow<'a> {
    pub fn new(entry: &'a QuarantineEntry) -> Self {
        let r = &entry.record;
        let (payload, encoding) = escape_bytes(&r.payload);
        let outcome = Outcome::from_code(r.outcome);
        // A conflicting or stale message decoded when it was quarantined; a malformed one need
        // not be JSON at all.
        let damaged = match outcome {
            Some(Outcome::Malformed) => None,
            _ => json::parse(&r.payload, 128).err().map(|e| e.to_string()),
        };
        QuarantineRow {
            entry,
            outcome,
            payload,
            encoding,
            damaged,
        }
    }
}

impl Record for QuarantineRow<'_> {
    const COLUMNS: &'static [&'static str] = &[
        "id",
        "outcome",
        "reason",
        "topic",
        "received_at",
        "last_seen_at",
        "deliveries",
        "key",
        "audit_index",
        "payload_encoding",
        "payload",
    ];
    const TABLE: &'static [(&'static str, usize)] = &[
        ("id", 6),
        ("received_at", 25),
        ("outcome", 10),
        ("deliveries", 11),
        ("key", 17),
        ("topic", 20),
        ("reason", 0),
    ];
    const TIMES: &'static [&'static str] = &["received_at"];

    fn values(&self) -> Vec<Json> {
        let r = &self.entry.record;
        vec![
            num(self.entry.id),
            text(self.outcome.map_or("unknown", Outcome::as_str)),
            text(&r.reason),
            text(&r.topic),
            time(r.received_at_ms),
            time(r.last_seen_ms),
            num(r.deliveries),
            opt_hex(r.key),
            num(r.audit_index),
            text(self.encoding),
            text(&self.payload),
        ]
    }

    /// The `payload` column stays the reversible bytes: the flag goes on the `reason`.
    fn damage(&self) -> Option<(&'static str, &str)> {
        self.damaged.as_deref().map(|e| ("reason", e))
    }
}

/// The payload as text: verbatim when it is UTF-8 (`"utf-8"`); otherwise `"escaped"`, where
/// `\` is written `\\` and each byte of an invalid sequence `\xNN`, which is reversible.
pub fn escape_bytes(bytes: &[u8]) -> (String, &'static str) {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return (s.to_string(), "utf-8");
    }
    let mut out = String::with_capacity(bytes.len() + 16);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&chunk.valid().replace('\\', "\\\\"));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    (out, "escaped")
}

/// A parked event as `relay parked` lists it.
pub struct ParkedRow<'a>(pub &'a Parked);

impl Record for ParkedRow<'_> {
    const COLUMNS: &'static [&'static str] = &[
        "sink",
        "offset",
        "id",
        "agency",
        "source_id",
        "parked_at",
        "reason",
        "response",
        "attempts",
        "blocking",
        "retry_requested_at",
        "event",
    ];
    const TABLE: &'static [(&'static str, usize)] = &[
        ("offset", 10),
        ("id", 20),
        ("agency", 12),
        ("source_id", 14),
        ("parked_at", 25),
        ("attempts", 10),
        ("blocking", 10),
        ("reason", 40),
    ];
    const TIMES: &'static [&'static str] = &["parked_at"];

    fn values(&self) -> Vec<Json> {
        let p = self.0;
        let r = &p.record;
        let event =
            json::parse(r.event.as_bytes(), 256).unwrap_or_else(|_| Json::String(r.event.clone()));
        vec![
            text(&p.sink),
            num(p.offset),
            text(&r.id),
            text(&r.agency),
            text(&r.source_id),
            time(r.parked_at_ms),
            text(&r.reason),
            text(&r.response),
            num(r.attempts),
            Json::Bool(r.blocking),
            r.retry_requested_at_ms.map_or(Json::Null, time),
            event,
        ]
    }
}

/// One sink as `relay status` shows it: a sink with a cursor, or a configured one without
/// one yet (`not_started`: its cursor, lags, generation and times are null).
pub struct SinkStatusRow {
    pub sink: String,
    pub kind: String,
    /// The log it delivers: `effects` or `audit`.
    pub stream: String,
    pub configured: bool,
    pub state: &'static str,
    pub cursor: Option<u64>,
    pub head: u64,
    pub lag_events: Option<u64>,
    pub lag_seconds: Option<u64>,
    pub parked: u64,
    pub retry_requested: u64,
    pub delivered: u64,
    /// Events offered to the receiver again (it may hold them twice): `SinkRecord::resent`.
    pub resent: u64,
    pub generation: Option<u64>,
    pub advanced_at_ms: Option<u64>,
    /// (when, what)
    pub last_error: Option<(u64, String)>,
    /// What the sink's ledger accounts for below its cursor, or the problem with it.
    pub accounting: Json,
}

impl Record for SinkStatusRow {
    const COLUMNS: &'static [&'static str] = &[
        "sink",
        "kind",
        "stream",
        "configured",
        "state",
        "cursor",
        "head",
        "lag_events",
        "lag_seconds",
        "parked",
        "retry_requested",
        "delivered",
        "resent",
        "generation",
        "advanced_at",
        "last_error",
        "last_error_at",
        "accounting",
    ];

    fn values(&self) -> Vec<Json> {
        vec![
            text(&self.sink),
            text(&self.kind),
            text(&self.stream),
            Json::Bool(self.configured),
            text(self.state),
            opt_num(self.cursor),
            num(self.head),
            opt_num(self.lag_events),
            opt_num(self.lag_seconds),
            num(self.parked),
            num(self.retry_requested),
            num(self.delivered),
            num(self.resent),
            opt_num(self.generation),
            self.advanced_at_ms.map_or(Json::Null, time),
            opt_text(self.last_error.as_ref().map(|(_, e)| e.as_str())),
            self.last_error
                .as_ref()
                .map_or(Json::Null, |(t, _)| time(*t)),
            self.accounting.clone(),
        ]
    }
}

/// One missing range of a source's sequences in one epoch, with the range it was seen in.
pub struct GapRow<'a> {
    pub agency: &'a str,
    pub source_id: &'a str,
    pub epoch: u64,
    pub lowest: u64,
    pub highest: u64,
    pub missing_from: u64,
    pub missing_to: u64,
}

impl Record for GapRow<'_> {
    const COLUMNS: &'static [&'static str] = &[
        "agency",
        "source_id",
        "epoch",
        "lowest",
        "highest",
        "missing_from",
        "missing_to",
        "missing_count",
    ];
    const TABLE: &'static [(&'static str, usize)] = &[
        ("agency", 14),
        ("source_id", 14),
        ("epoch", 7),
        ("lowest", 11),
        ("highest", 11),
        ("missing_from", 14),
        ("missing_to", 12),
        ("missing_count", 0),
    ];

    fn values(&self) -> Vec<Json> {
        vec![
            text(self.agency),
            text(self.source_id),
            num(self.epoch),
            num(self.lowest),
            num(self.highest),
            num(self.missing_from),
            num(self.missing_to),
            num(self.missing_to - self.missing_from + 1),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tables::{AuditRecord, EffectRecord, QuarantineRecord};

    #[test]
    fn non_utf8_payloads_are_escaped_reversibly() {
        assert_eq!(
            escape_bytes(b"{\"a\":1}"),
            ("{\"a\":1}".to_string(), "utf-8")
        );
        assert_eq!(
            escape_bytes(b"a\\b\xff"),
            ("a\\\\b\\xff".to_string(), "escaped")
        );
    }

    fn audit() -> AuditEntry {
        AuditEntry {
            index: 0,
            record: AuditRecord::default(),
        }
    }

    fn effect(payload: &[u8]) -> Effect {
        Effect {
            offset: 0,
            record: EffectRecord {
                payload: payload.to_vec(),
                ..EffectRecord::default()
            },
        }
    }

    fn quarantined(outcome: Outcome, payload: &[u8]) -> QuarantineEntry {
        QuarantineEntry {
            id: 0,
            record: QuarantineRecord {
                outcome: outcome.code(),
                reason: String::new(),
                topic: String::new(),
                received_at_ms: 0,
                last_seen_ms: 0,
                deliveries: 1,
                key: None,
                audit_index: 0,
                payload: payload.to_vec(),
            },
        }
    }

    /// A record has one value per column, and its table and time columns are among them.
    fn check<R: Record>(record: &R) {
        assert_eq!(record.values().len(), R::COLUMNS.len());
        for (name, _) in R::TABLE {
            assert!(R::COLUMNS.contains(name), "{name}");
        }
        for name in R::TIMES {
            assert!(R::TABLE.iter().any(|(n, _)| n == name), "{name}");
        }
        let names: Vec<String> = record.fields().into_iter().map(|(k, _)| k).collect();
        assert_eq!(names, R::COLUMNS);
    }

    #[test]
    fn every_record_has_one_value_per_column_and_tables_choose_among_them() {
        let (a, e, q) = (
            audit(),
            effect(b"{}"),
            quarantined(Outcome::Conflict, b"{}"),
        );
        check(&AuditRow(&a));
        check(&EffectRow::new(&e));
        check(&QuarantineRow::new(&q));
        check(&GapRow {
            agency: "A",
            source_id: "S",
            epoch: 1,
            lowest: 1,
            highest: 9,
            missing_from: 3,
            missing_to: 4,
        });
    }

    /// A padded column as wide as its name would run its header into the next one.
    #[test]
    fn every_padded_table_column_is_wider_than_its_header() {
        fn wide<R: Record>() {
            for (name, width) in R::TABLE {
                assert!(*width == 0 || *width > name.len(), "{name}: {width}");
            }
        }
        wide::<AuditRow<'_>>();
        wide::<EffectRow<'_>>();
        wide::<QuarantineRow<'_>>();
        wide::<ParkedRow<'_>>();
        wide::<SinkStatusRow>();
        wide::<GapRow<'_>>();
    }

    #[test]
    fn the_audit_columns_begin_with_the_hashed_fields_in_order() {
        let a = audit();
        let hashed: Vec<String> = store::audit_body_fields(a.index, &a.record)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(hashed, AuditRow::COLUMNS[..hashed.len()]);
        assert_eq!(AuditRow::COLUMNS[hashed.len()..], ["prev_hash", "hash"]);
    }

    #[test]
    fn a_damaged_payload_adds_payload_error_after_the_columns() {
        let e = effect(b"{\"a\":");
        let row = EffectRow::new(&e).fields();
        assert_eq!(row.len(), EffectRow::COLUMNS.len() + 1);
        assert_eq!(row[11], ("message".into(), text("{\"a\":")));
        assert_eq!(row[12].0, crate::output::PAYLOAD_ERROR);
        // Malformed messages are not JSON by nature: never flagged.
        let m = quarantined(Outcome::Malformed, b"not json");
        assert!(QuarantineRow::new(&m).damage().is_none());
        let c = quarantined(Outcome::Conflict, b"not json");
        assert_eq!(
            QuarantineRow::new(&c).damage().map(|(col, _)| col),
            Some("reason")
        );
    }
}
