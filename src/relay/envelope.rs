//! The CloudEvents 1.0 envelope (structured JSON mode) each sink delivers, and the event id.
//! Sans-IO: a pure function of the stored effect.
//!
//! The id is stable across every redelivery of the same effect and unique across effects:
//! - an applied effect (`applied`, `applied_late`): the hex key v1. The feed never applies a
//!   key twice, and the key is derived from (agency, source_id, epoch, sequence), so an
//!   active/standby pair gives the same effect the same id;
//! - a released quarantine message: the hex key, `.`, and the first 16 hex digits of the
//!   SHA-256 of its payload bytes. A release never applies content already applied under
//!   its key, so no two effects share an id.
//!
//! An audit sink's event (`audit_envelope`, type `org.replay-guard.decision.v1`) is one audit
//! entry: its id is the entry's index, `-`, and the first 16 hex digits of its chain hash, and
//! its `data` the entry exactly as `dump-audit --format jsonl` prints it (chain link included).

use crate::json::{self, Json, write_string};
use crate::key::sha256;
use crate::model::Outcome;
use crate::model::{hex, hex_into};
use crate::output::Record as _;
use crate::output::rows::AuditRow;
use crate::store::AuditEntry;
use crate::timefmt::rfc3339_ms;

/// The CloudEvents `type` of every event of the effect log.
pub const EVENT_TYPE: &str = "org.replay-guard.effect.v1";
/// The CloudEvents `type` of every event of the audit log.
pub const DECISION_TYPE: &str = "org.replay-guard.decision.v1";
/// The media type of a structured-mode event.
pub const CONTENT_TYPE: &str = "application/cloudevents+json";

/// The stored effect fields the envelope is made of.
#[derive(Clone, Copy, Debug)]
pub struct EffectView<'a> {
    pub offset: u64,
    pub key: &'a [u8; 32],
    pub agency: &'a str,
    pub source_id: &'a str,
    pub epoch: u64,
    pub sequence: u64,
    pub received_at_ms: u64,
    pub late: bool,
    pub released: bool,
    pub payload: &'a [u8],
}

impl<'a> EffectView<'a> {
    /// The view of the effect stored at `offset`.
    pub fn of(offset: u64, r: &'a crate::store::tables::EffectRecord) -> EffectView<'a> {
        EffectView {
            offset,
            key: &r.key,
            agency: &r.agency,
            source_id: &r.source_id,
            epoch: r.epoch,
            sequence: r.sequence,
            received_at_ms: r.received_at_ms,
            late: r.late,
            released: r.released,
            payload: &r.payload,
        }
    }
}

/// The `source` attribute of an event as `envelope` wrote it (`None` if it is not one).
pub fn source_of(event: &str) -> Option<String> {
    match json::parse(event.as_bytes(), crate::wire::STORED_MAX_DEPTH + 1).ok()? {
        json::Json::Object(members) => members.into_iter().find_map(|(k, v)| match v {
            json::Json::String(s) if k == "source" => Some(s),
            _ => None,
        }),
        _ => None,
    }
}

/// The event id of an effect (see the module doc).
pub fn event_id(key: &[u8; 32], released: bool, payload: &[u8]) -> String {
    let mut id = hex(key);
    if released {
        id.push('.');
        id.push_str(&hex(&sha256(&[payload]))[..16]);
    }
    id
}

/// What an effect's event records (`Event::outcome` and `Event::fields`): the applying
/// outcome (`applied`, `applied_late`, or `released` for a message an operator released) and
/// the named values in the order `Event::fields` gives. The audit entry's hash is not among
/// them: it would take a read of the audit log per event.
pub fn effect_fields(e: &EffectView<'_>) -> (String, Vec<(&'static str, String)>) {
    let outcome = if e.released {
        "released"
    } else if e.late {
        "applied_late"
    } else {
        "applied"
    };
    let fields = vec![
        ("key", hex(e.key)),
        ("source", format!("{}/{}", e.agency, e.source_id)),
        ("sequence", e.sequence.to_string()),
        ("epoch", e.epoch.to_string()),
        ("outcome", outcome.to_string()),
        ("effect_offset", e.offset.to_string()),
    ];
    (outcome.to_string(), fields)
}

/// The event as one line of compact JSON (no newline inside: the exec sink writes JSON lines).
/// `data` is the original message re-written compactly with its members and numbers exactly
/// as received; a payload that is not JSON (never stored by `run`, but a damaged record could
/// hold one) goes in `data_base64` instead, so nothing is withheld.
pub fn envelope(source: &str, e: &EffectView<'_>) -> String {
    let mut out = String::with_capacity(e.payload.len() + 512);
    out.push_str("{\"specversion\":\"1.0\",\"id\":");
    write_string(&mut out, &event_id(e.key, e.released, e.payload));
    out.push_str(",\"source\":");
    write_string(&mut out, source);
    out.push_str(",\"type\":\"");
    out.push_str(EVENT_TYPE);
    out.push_str("\",\"subject\":");
    write_string(&mut out, &format!("{}/{}", e.agency, e.source_id));
    out.push_str(",\"time\":\"");
    out.push_str(&rfc3339_ms(e.received_at_ms));
    out.push_str("\",\"datacontenttype\":\"application/json\"");
    // Extension values above 2^31 are not CloudEvents integers: offsets, epochs and sequences
    // are decimal strings.
    out.push_str(&format!(",\"rgoffset\":\"{}\",\"rgkey\":\"", e.offset));
    hex_into(&mut out, e.key);
    out.push_str(&format!(
        "\",\"rgepoch\":\"{}\",\"rgsequence\":\"{}\",\"rglate\":{},\"rgreleased\":{}",
        e.epoch, e.sequence, e.late, e.released
    ));
    match json::parse(e.payload, crate::wire::STORED_MAX_DEPTH) {
        Ok(v) => {
            out.push_str(",\"data\":");
            out.push_str(&v.to_compact());
        }
        Err(_) => {
            out.push_str(",\"data_base64\":\"");
            base64_into(&mut out, e.payload);
            out.push('"');
        }
    }
    out.push('}');
    out
}

/// The event id of the audit entry at `index` whose chain hash is `hash`: stable (the entry
/// never changes) and unique (one entry per index; the hash tells a store's history from
/// another's).
pub fn audit_event_id(index: u64, hash: &[u8; 32]) -> String {
    format!("{index}-{}", &hex(hash)[..16])
}

/// The audit entry `entry` as one line of compact JSON (CloudEvents, structured mode).
/// `data` is the entry as `dump-audit --format jsonl` prints it: its hashed fields, then
/// `prev_hash` and `hash`, so a receiver can check that the entries it got link up.
pub fn audit_envelope(source: &str, entry: &AuditEntry) -> String {
    let r = &entry.record;
    let outcome = Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str);
    let data = Json::Object(AuditRow(entry).fields()).to_compact();
    let mut out = String::with_capacity(data.len() + 384);
    out.push_str("{\"specversion\":\"1.0\",\"id\":");
    write_string(&mut out, &audit_event_id(entry.index, &r.hash));
    out.push_str(",\"source\":");
    write_string(&mut out, source);
    out.push_str(",\"type\":\"");
    out.push_str(DECISION_TYPE);
    out.push('"');
    if let (Some(agency), Some(source_id)) = (&r.agency, &r.source_id) {
        out.push_str(",\"subject\":");
        write_string(&mut out, &format!("{agency}/{source_id}"));
    }
    out.push_str(",\"time\":\"");
    out.push_str(&rfc3339_ms(r.recorded_at_ms));
    out.push_str("\",\"datacontenttype\":\"application/json\"");
    out.push_str(&format!(
        ",\"rgindex\":\"{}\",\"rgoutcome\":\"{outcome}\",\"data\":",
        entry.index
    ));
    out.push_str(&data);
    out.push('}');
    out
}

/// Standard base64 with padding (RFC 4648 section 4), as CloudEvents' `data_base64` wants.
fn base64_into(out: &mut String, bytes: &[u8]) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::Json;

    fn view<'a>(key: &'a [u8; 32], payload: &'a [u8], released: bool) -> EffectView<'a> {
        EffectView {
            offset: 7,
            key,
            agency: "fire",
            source_id: "engine-7",
            epoch: 1,
            sequence: 3_000_000_000,
            received_at_ms: 1_764_547_200_123,
            late: false,
            released,
            payload,
        }
    }

    fn member<'a>(v: &'a Json, name: &str) -> &'a Json {
        match v {
            Json::Object(m) => &m.iter().find(|(k, _)| k == name).expect(name).1,
            other => panic!("not an object: {other:?}"),
        }
    }

    #[test]
    fn the_envelope_carries_every_required_and_extension_attribute() {
        let key = [0xab; 32];
        let payload = br#"{ "agency":"fire", "n": 1.50, "nested": {"b":1,"a":2} }"#;
        let line = envelope("urn:replay-guard:eoc-1", &view(&key, payload, false));
        assert!(!line.contains('\n'));
        let v = json::parse(line.as_bytes(), 64).unwrap();
        let s = |name| match member(&v, name) {
            Json::String(s) => s.clone(),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(s("specversion"), "1.0");
        assert_eq!(s("id"), hex(&key));
        assert_eq!(s("source"), "urn:replay-guard:eoc-1");
        assert_eq!(s("type"), EVENT_TYPE);
        assert_eq!(s("subject"), "fire/engine-7");
        assert_eq!(s("time"), "2025-12-01T00:00:00.123Z");
        assert_eq!(s("datacontenttype"), "application/json");
        assert_eq!(s("rgoffset"), "7");
        assert_eq!(s("rgsequence"), "3000000000");
        assert_eq!(s("rgkey"), hex(&key));
        assert_eq!(member(&v, "rglate"), &Json::Bool(false));
        // The data is the message, compact, numbers and member order as received.
        assert_eq!(
            member(&v, "data").to_compact(),
            r#"{"agency":"fire","n":1.50,"nested":{"b":1,"a":2}}"#
        );
    }

    #[test]
    fn an_effects_fields_name_its_applying_outcome_in_the_shared_order() {
        let key = [0xab; 32];
        let (outcome, fields) = effect_fields(&view(&key, b"{}", false));
        assert_eq!(outcome, "applied");
        let names: Vec<&str> = fields.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "key",
                "source",
                "sequence",
                "epoch",
                "outcome",
                "effect_offset"
            ]
        );
        assert_eq!(fields[0].1, hex(&key));
        assert_eq!(fields[1].1, "fire/engine-7");
        assert_eq!(fields[2].1, "3000000000");
        assert_eq!(fields[5].1, "7");
        assert_eq!(effect_fields(&view(&key, b"{}", true)).0, "released");
        let late = EffectView {
            late: true,
            ..view(&key, b"{}", false)
        };
        assert_eq!(effect_fields(&late).0, "applied_late");
        assert_eq!(effect_fields(&late).1[4].1, "applied_late");
    }

    #[test]
    fn a_released_message_gets_its_own_stable_id() {
        let key = [1; 32];
        let a = event_id(&key, false, b"{\"v\":1}");
        let r1 = event_id(&key, true, b"{\"v\":2}");
        let r2 = event_id(&key, true, b"{\"v\":3}");
        assert_ne!(a, r1);
        assert_ne!(r1, r2);
        assert_eq!(r1, event_id(&key, true, b"{\"v\":2}"));
        assert!(r1.starts_with(&a));
    }

    #[test]
    fn bytes_that_are_not_json_travel_as_base64() {
        let key = [2; 32];
        let line = envelope("urn:x", &view(&key, b"\xff\x00ab", false));
        let v = json::parse(line.as_bytes(), 64).unwrap();
        assert_eq!(member(&v, "data_base64"), &Json::String("/wBhYg==".into()));
        let mut s = String::new();
        base64_into(&mut s, b"foobar");
        assert_eq!(s, "Zm9vYmFy");
        s.clear();
        base64_into(&mut s, b"fo");
        assert_eq!(s, "Zm8=");
    }

    #[test]
    fn an_audit_event_carries_the_entry_as_dump_audit_prints_it_and_a_stable_id() {
        use crate::store::tables::AuditRecord;
        let entry = AuditEntry {
            index: 12,
            record: AuditRecord {
                recorded_at_ms: 1_764_547_200_123,
                outcome: Outcome::Conflict.code(),
                key: Some([7; 32]),
                agency: Some("fire".into()),
                source_id: Some("engine-7".into()),
                epoch: Some(1),
                sequence: Some(9),
                topic: "incidents/fire".into(),
                reason: "same key, other content \u{1b}[31m".into(),
                digest: Some([8; 32]),
                effect_offset: Some(3),
                quarantine_id: Some(2),
                prev_hash: [9; 32],
                hash: [0xab; 32],
            },
        };
        let line = audit_envelope("urn:x", &entry);
        assert!(!line.contains('\n'));
        let v = json::parse(line.as_bytes(), 64).unwrap();
        assert_eq!(member(&v, "type"), &Json::String(DECISION_TYPE.into()));
        assert_eq!(
            member(&v, "id"),
            &Json::String(format!("12-{}", "ab".repeat(8)))
        );
        assert_eq!(
            audit_event_id(12, &[0xab; 32]),
            format!("12-{}", "ab".repeat(8))
        );
        assert_eq!(member(&v, "rgoutcome"), &Json::String("conflict".into()));
        assert_eq!(member(&v, "subject"), &Json::String("fire/engine-7".into()));
        // `data` is the line `dump-audit --format jsonl` prints, chain link included.
        let mut printed = Vec::new();
        let zone = crate::timefmt::Zone::utc();
        crate::output::Printer::start::<AuditRow<'_>>(
            crate::cli::Format::Jsonl,
            &zone,
            &mut printed,
        )
        .and_then(|mut p| p.print(&AuditRow(&entry)))
        .unwrap();
        let printed = json::parse(&printed, 64).unwrap();
        assert_eq!(member(&v, "data"), &printed);
        assert_eq!(member(&v, "data").to_compact(), printed.to_compact());
        assert_eq!(
            member(member(&v, "data"), "prev_hash"),
            &Json::String(hex(&[9; 32]))
        );
    }
}
