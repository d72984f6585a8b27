//! The published formats' test vectors (`docs/spec/vectors/*.json`, the book's "Formats"
//! chapter) checked against the code: each vector's input goes through the real function (key
//! v1, the message digest, the feed contract, the decision table, the window through the
//! engine, the audit entry's hash, the CloudEvents envelope) and must give the vector's
//! expected output. The vectors were generated from this code and then frozen, so a change
//! that breaks one changes a published format (a new version, never an edit). To make a new
//! vector, add its input and run these tests with `RG_SPEC_VECTORS_OUT=DIR`: they then write
//! every file, recomputed from its inputs, into DIR instead of comparing.

use std::path::{Path, PathBuf};

use crate::decide::{self, OutOfOrder, Seen, SourceMarks};
use crate::json::{self, Json, Pointer};
use crate::key::{derive_key, message_digest};
use crate::model::{Digest, Message, Outcome, Position, Source, hex, parse_hex32};
use crate::output::num;
use crate::relay::envelope::{EffectView, audit_envelope, audit_event_id, envelope, event_id};
use crate::store::tables::AuditRecord;
use crate::store::{
    AuditEntry, Store, StoreOptions, WindowPolicy, audit_body_fields, audit_entry_hash,
};
use crate::wire::{FeedContract, Incoming, decode};

type Members = Vec<(String, Json)>;

fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/spec/vectors")
}

fn members(v: &Json) -> &Members {
    match v {
        Json::Object(m) => m,
        other => panic!("expected a JSON object, found {other:?}"),
    }
}

fn field<'a>(v: &'a Json, name: &str) -> Option<&'a Json> {
    members(v).iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn req<'a>(v: &'a Json, name: &str) -> &'a Json {
    field(v, name).unwrap_or_else(|| panic!("vector lacks {name:?}: {}", v.to_compact()))
}

fn u64_of(v: &Json) -> u64 {
    match v {
        Json::Number(t) => t.parse().unwrap_or_else(|_| panic!("not a u64: {t}")),
        other => panic!("expected a number, found {other:?}"),
    }
}

fn str_of(v: &Json) -> &str {
    match v {
        Json::String(s) => s,
        other => panic!("expected a string, found {other:?}"),
    }
}

fn bool_of(v: &Json) -> bool {
    match v {
        Json::Bool(b) => *b,
        other => panic!("expected a boolean, found {other:?}"),
    }
}

fn array_of(v: &Json) -> &[Json] {
    match v {
        Json::Array(a) => a,
        other => panic!("expected an array, found {other:?}"),
    }
}

fn hex32(v: &Json) -> [u8; 32] {
    parse_hex32(str_of(v)).unwrap_or_else(|| panic!("not 64 hex digits: {v:?}"))
}

fn opt<T>(v: Option<&Json>, f: impl Fn(&Json) -> T) -> Option<T> {
    match v {
        None | Some(Json::Null) => None,
        Some(v) => Some(f(v)),
    }
}

fn string(s: impl Into<String>) -> Json {
    Json::String(s.into())
}

fn position(v: &Json) -> Position {
    match array_of(v) {
        [e, s] => Position {
            epoch: u64_of(e),
            sequence: u64_of(s),
        },
        other => panic!("a position is [epoch, sequence], found {other:?}"),
    }
}

/// A payload given as text (`payload`) or, for bytes that are not UTF-8, as hex
/// (`payload_hex`).
fn payload(v: &Json) -> Vec<u8> {
    if let Some(p) = field(v, "payload") {
        return str_of(p).as_bytes().to_vec();
    }
    let h = str_of(req(v, "payload_hex"));
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).expect("payload_hex"))
        .collect()
}

/// Checks every vector of `file` against `compute` (the expected members it returns must be
/// in the vector, equal), or with `RG_SPEC_VECTORS_OUT` writes the file with them recomputed.
fn check(file: &str, compute: impl Fn(&Json) -> Members) {
    let path = vectors_dir().join(file);
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc = json::parse(&text, 64).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let vectors = array_of(req(&doc, "vectors"));
    assert!(!vectors.is_empty(), "{file} holds no vector");
    let out_dir = std::env::var_os("RG_SPEC_VECTORS_OUT").map(PathBuf::from);
    let mut written = Vec::new();
    for (i, v) in vectors.iter().enumerate() {
        let name = field(v, "name").map_or(String::new(), |n| str_of(n).to_string());
        let got = compute(v);
        assert!(!got.is_empty(), "{file} vector {i}: nothing computed");
        if out_dir.is_some() {
            let mut merged: Members = members(v)
                .iter()
                .filter(|(k, _)| !got.iter().any(|(g, _)| g == k))
                .cloned()
                .collect();
            merged.extend(got);
            written.push(Json::Object(merged).to_compact());
            continue;
        }
        for (k, want) in &got {
            let have = field(v, k)
                .unwrap_or_else(|| panic!("{file} vector {i} ({name}) lacks expected {k:?}"));
            assert_eq!(
                have.to_compact(),
                want.to_compact(),
                "{file} vector {i} ({name}): {k} differs from what the code computes"
            );
        }
    }
    if let Some(dir) = out_dir {
        let spec = req(&doc, "spec").to_compact();
        let body = written.join(",\n");
        std::fs::write(
            dir.join(file),
            format!("{{\"spec\":{spec},\n\"vectors\":[\n{body}\n]}}\n"),
        )
        .unwrap();
    }
}

#[test]
fn key_v1_vectors_match_derive_key() {
    check("key_v1.json", |v| {
        let source = Source::new(
            str_of(req(v, "agency")).into(),
            str_of(req(v, "source_id")).into(),
        );
        let position = Position {
            epoch: u64_of(req(v, "epoch")),
            sequence: u64_of(req(v, "sequence")),
        };
        vec![("key".into(), string(derive_key(&source, position).to_hex()))]
    });
}

#[test]
fn message_digest_vectors_match_the_canonical_form_and_its_sha256() {
    check("digest.json", |v| {
        let message = json::parse(str_of(req(v, "message")).as_bytes(), 128).unwrap();
        let ignore: Vec<Pointer> = opt(field(v, "digest_ignore"), |a| {
            array_of(a)
                .iter()
                .map(|p| Pointer::parse(str_of(p)).unwrap())
                .collect()
        })
        .unwrap_or_default();
        match message.without(&ignore).to_canonical() {
            Ok(canonical) => vec![
                ("canonical".into(), string(canonical)),
                (
                    "digest".into(),
                    string(message_digest(&message, &ignore).unwrap().to_hex()),
                ),
            ],
            Err(e) => vec![("error".into(), string(e.to_string()))],
        }
    });
}

#[test]
fn feed_contract_vectors_match_wire_decode() {
    check("feed_contract.json", |v| {
        let mut contract = FeedContract::default();
        if let Some(c) = field(v, "contract") {
            for (k, val) in members(c) {
                let ptr = || Pointer::parse(str_of(val)).unwrap();
                match k.as_str() {
                    "agency" => contract.agency = ptr(),
                    "source_id" => contract.source_id = ptr(),
                    "sequence" => contract.sequence = ptr(),
                    "epoch" => contract.epoch = ptr(),
                    "max_payload_bytes" => contract.max_payload_bytes = u64_of(val) as usize,
                    "max_depth" => contract.max_depth = u64_of(val) as usize,
                    "digest_ignore" => {
                        contract.digest_ignore = array_of(val)
                            .iter()
                            .map(|p| Pointer::parse(str_of(p)).unwrap())
                            .collect()
                    }
                    other => panic!("unknown contract key {other}"),
                }
            }
        }
        match decode(&payload(v), &contract) {
            Ok(m) => vec![
                ("agency".into(), string(m.source.agency())),
                ("source_id".into(), string(m.source.source_id())),
                ("epoch".into(), num(m.position.epoch)),
                ("sequence".into(), num(m.position.sequence)),
                ("key".into(), string(m.key().to_hex())),
                ("digest".into(), string(m.digest.to_hex())),
            ],
            Err(e) => vec![("malformed".into(), string(e.to_string()))],
        }
    });
}

#[test]
fn decision_table_vectors_match_decide() {
    check("decision_table.json", |v| {
        let source = Source::new("A".into(), "S".into());
        let pos = position(req(v, "position"));
        let msg = Message::new(source, pos, Digest::from_bytes(hex32(req(v, "digest"))));
        let seen = opt(field(v, "seen"), |s| Seen {
            digest: Digest::from_bytes(hex32(req(s, "digest"))),
            effect_offset: u64_of(req(s, "effect_offset")),
        });
        let marks = opt(field(v, "marks"), |m| SourceMarks {
            high_water: position(req(m, "high_water")),
            evicted_floor: opt(field(m, "evicted_floor"), position),
        });
        let policy = match str_of(req(v, "out_of_order")) {
            "apply" => OutOfOrder::Apply,
            "quarantine" => OutOfOrder::Quarantine,
            other => panic!("out_of_order {other}"),
        };
        let d = decide::decide(&msg, seen.as_ref(), marks.as_ref(), policy);
        vec![
            ("outcome".into(), string(d.outcome.as_str())),
            ("reason".into(), string(d.reason)),
        ]
    });
}

#[test]
fn window_vectors_match_the_engine_on_an_in_memory_store() {
    check("window.json", |v| {
        let w = req(v, "window");
        let opts = StoreOptions {
            window: WindowPolicy {
                seconds: u64_of(req(w, "seconds")),
                max_entries: u64_of(req(w, "max_entries")),
            },
            out_of_order: match str_of(req(w, "out_of_order")) {
                "apply" => OutOfOrder::Apply,
                _ => OutOfOrder::Quarantine,
            },
            ..StoreOptions::default()
        };
        let mut store = Store::open_in_memory(opts).unwrap();
        let contract = FeedContract::default();
        let (mut outcomes, mut evicted) = (Vec::new(), Vec::new());
        for batch in array_of(req(v, "batches")) {
            let at = u64_of(req(batch, "at_ms"));
            let incoming: Vec<Incoming> = array_of(req(batch, "payloads"))
                .iter()
                .map(|p| Incoming::decode("t", str_of(p).as_bytes().to_vec(), at, &contract))
                .collect();
            let report = store.commit_batch(&incoming, at).unwrap();
            outcomes.push(Json::Array(
                report
                    .decided
                    .iter()
                    .map(|d| string(d.outcome.as_str()))
                    .collect(),
            ));
            evicted.push(num(report.evicted));
        }
        vec![
            ("outcomes".into(), Json::Array(outcomes)),
            ("evicted".into(), Json::Array(evicted)),
        ]
    });
}

#[test]
fn audit_chain_vectors_match_the_entry_hash() {
    check("audit_chain.json", |v| {
        let mut prev = hex32(req(v, "first_prev_hash"));
        let (mut canonical, mut hashes) = (Vec::new(), Vec::new());
        for e in array_of(req(v, "entries")) {
            let outcome = str_of(req(e, "outcome"));
            let r = AuditRecord {
                recorded_at_ms: u64_of(req(e, "recorded_at_ms")),
                outcome: Outcome::parse(outcome)
                    .unwrap_or_else(|| panic!("outcome {outcome}"))
                    .code(),
                key: opt(field(e, "key"), hex32),
                agency: opt(field(e, "agency"), |s| str_of(s).to_string()),
                source_id: opt(field(e, "source_id"), |s| str_of(s).to_string()),
                epoch: opt(field(e, "epoch"), u64_of),
                sequence: opt(field(e, "sequence"), u64_of),
                topic: str_of(req(e, "topic")).into(),
                reason: str_of(req(e, "reason")).into(),
                digest: opt(field(e, "digest"), hex32),
                effect_offset: opt(field(e, "effect_offset"), u64_of),
                quarantine_id: opt(field(e, "quarantine_id"), u64_of),
                prev_hash: prev,
                hash: [0; 32],
            };
            let index = u64_of(req(e, "index"));
            // The canonical body is what the hash covers (equal to the commit path's direct writer).
            let body = Json::Object(audit_body_fields(index, &r))
                .to_canonical()
                .unwrap();
            canonical.push(string(body));
            prev = audit_entry_hash(index, &r, &prev);
            hashes.push(string(hex(&prev)));
        }
        vec![
            ("canonical".into(), Json::Array(canonical)),
            ("hashes".into(), Json::Array(hashes)),
        ]
    });
}

/// The audit record a vector's `entry` describes (its `hash` computed from its `prev_hash`).
fn audit_record(e: &Json) -> AuditEntry {
    let outcome = str_of(req(e, "outcome"));
    let mut record = AuditRecord {
        recorded_at_ms: u64_of(req(e, "recorded_at_ms")),
        outcome: Outcome::parse(outcome)
            .unwrap_or_else(|| panic!("outcome {outcome}"))
            .code(),
        key: opt(field(e, "key"), hex32),
        agency: opt(field(e, "agency"), |s| str_of(s).to_string()),
        source_id: opt(field(e, "source_id"), |s| str_of(s).to_string()),
        epoch: opt(field(e, "epoch"), u64_of),
        sequence: opt(field(e, "sequence"), u64_of),
        topic: str_of(req(e, "topic")).into(),
        reason: str_of(req(e, "reason")).into(),
        digest: opt(field(e, "digest"), hex32),
        effect_offset: opt(field(e, "effect_offset"), u64_of),
        quarantine_id: opt(field(e, "quarantine_id"), u64_of),
        prev_hash: hex32(req(e, "prev_hash")),
        hash: [0; 32],
    };
    let index = u64_of(req(e, "index"));
    record.hash = audit_entry_hash(index, &record, &record.prev_hash);
    AuditEntry { index, record }
}

#[test]
fn decision_event_vectors_match_the_audit_streams_envelope() {
    check("decision_event.json", |v| {
        let entry = audit_record(req(v, "entry"));
        vec![
            ("hash".into(), string(hex(&entry.record.hash))),
            (
                "id".into(),
                string(audit_event_id(entry.index, &entry.record.hash)),
            ),
            (
                "envelope".into(),
                string(audit_envelope(str_of(req(v, "source")), &entry)),
            ),
        ]
    });
}

#[test]
fn envelope_vectors_match_the_cloudevents_envelope() {
    check("envelope.json", |v| {
        let e = req(v, "effect");
        let key = hex32(req(e, "key"));
        let bytes = payload(e);
        let view = EffectView {
            offset: u64_of(req(e, "offset")),
            key: &key,
            agency: str_of(req(e, "agency")),
            source_id: str_of(req(e, "source_id")),
            epoch: u64_of(req(e, "epoch")),
            sequence: u64_of(req(e, "sequence")),
            received_at_ms: u64_of(req(e, "received_at_ms")),
            late: bool_of(req(e, "late")),
            released: bool_of(req(e, "released")),
            payload: &bytes,
        };
        vec![
            ("id".into(), string(event_id(&key, view.released, &bytes))),
            (
                "envelope".into(),
                string(envelope(str_of(req(v, "source")), &view)),
            ),
        ]
    });
}
