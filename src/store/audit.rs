//! The audit entry as a reviewer sees it, and its hash chain:
//! `hash = SHA-256(prev_hash || canonical JSON of the entry without prev_hash and hash)`.
//! Canonical JSON is the JCS form produced by `json::Json::to_canonical`, so the chain can be
//! checked from `dump-audit` output alone.

use crate::json::{Json, write_string};
use crate::key::sha256;
use crate::model::{Outcome, hex, hex_into};
use crate::store::tables::AuditRecord;
use crate::timefmt::rfc3339_ms;

/// The fields of an audit entry covered by its hash, in a stable order (canonicalisation sorts).
pub fn body_fields(index: u64, r: &AuditRecord) -> Vec<(String, Json)> {
    let num = |n: u64| Json::Number(n.to_string());
    let opt_num = |n: Option<u64>| n.map_or(Json::Null, num);
    let opt_str = |s: &Option<String>| s.clone().map_or(Json::Null, Json::String);
    let opt_hex = |b: &Option<[u8; 32]>| b.map_or(Json::Null, |b| Json::String(hex(&b)));
    let outcome = Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str);
    vec![
        ("index".into(), num(index)),
        (
            "recorded_at".into(),
            Json::String(rfc3339_ms(r.recorded_at_ms)),
        ),
        ("outcome".into(), Json::String(outcome.into())),
        ("key".into(), opt_hex(&r.key)),
        ("agency".into(), opt_str(&r.agency)),
        ("source_id".into(), opt_str(&r.source_id)),
        ("epoch".into(), opt_num(r.epoch)),
        ("sequence".into(), opt_num(r.sequence)),
        ("topic".into(), Json::String(r.topic.clone())),
        ("reason".into(), Json::String(r.reason.clone())),
        ("digest".into(), opt_hex(&r.digest)),
        ("effect_offset".into(), opt_num(r.effect_offset)),
        ("quarantine_id".into(), opt_num(r.quarantine_id)),
    ]
}

/// The canonical JSON of `body_fields`, written directly (it is on the commit path). Equal to
/// `Json::Object(body_fields(..)).to_canonical()`; a test holds the two together.
pub fn canonical_body(index: u64, r: &AuditRecord) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(512);
    let mut first = true;
    let mut key = |out: &mut String, name: &str| {
        out.push_str(if first { "{\"" } else { ",\"" });
        first = false;
        out.push_str(name);
        out.push_str("\":");
    };
    let opt_str = |out: &mut String, v: &Option<String>| match v {
        Some(s) => write_string(out, s),
        None => out.push_str("null"),
    };
    let opt_num = |out: &mut String, v: Option<u64>| match v {
        Some(n) => {
            let _ = write!(out, "{n}");
        }
        None => out.push_str("null"),
    };
    let opt_hex = |out: &mut String, v: &Option<[u8; 32]>| match v {
        Some(b) => {
            out.push('"');
            hex_into(out, b);
            out.push('"');
        }
        None => out.push_str("null"),
    };
    // Member names are ASCII, so JCS's UTF-16 order is plain byte order, fixed here.
    key(&mut out, "agency");
    opt_str(&mut out, &r.agency);
    key(&mut out, "digest");
    opt_hex(&mut out, &r.digest);
    key(&mut out, "effect_offset");
    opt_num(&mut out, r.effect_offset);
    key(&mut out, "epoch");
    opt_num(&mut out, r.epoch);
    key(&mut out, "index");
    opt_num(&mut out, Some(index));
    key(&mut out, "key");
    opt_hex(&mut out, &r.key);
    key(&mut out, "outcome");
    write_string(
        &mut out,
        Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str),
    );
    key(&mut out, "quarantine_id");
    opt_num(&mut out, r.quarantine_id);
    key(&mut out, "reason");
    write_string(&mut out, &r.reason);
    key(&mut out, "recorded_at");
    // A batch shares one timestamp: format it once per batch, not per entry.
    thread_local!(static LAST: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) });
    LAST.with_borrow_mut(|(ms, text)| {
        if *ms != r.recorded_at_ms {
            *ms = r.recorded_at_ms;
            *text = rfc3339_ms(r.recorded_at_ms);
        }
        write_string(&mut out, text);
    });
    key(&mut out, "sequence");
    opt_num(&mut out, r.sequence);
    key(&mut out, "source_id");
    opt_str(&mut out, &r.source_id);
    key(&mut out, "topic");
    write_string(&mut out, &r.topic);
    out.push('}');
    out
}

/// The hash an entry with this body and predecessor must carry.
pub fn entry_hash(index: u64, r: &AuditRecord, prev_hash: &[u8; 32]) -> [u8; 32] {
    sha256(&[prev_hash, canonical_body(index, r).as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_canonical_writer_matches_the_generic_canonical_form() {
        let full = AuditRecord {
            recorded_at_ms: 1_796_007_134_123,
            outcome: Outcome::Conflict.code(),
            key: Some([7; 32]),
            agency: Some("Cal \"Fire\"\n\u{1}é".into()),
            source_id: Some("E7/AVL".into()),
            epoch: Some(u64::MAX),
            sequence: Some(0),
            topic: "incidents/ca/#".into(),
            reason: "same key as effect #3".into(),
            digest: Some([9; 32]),
            effect_offset: Some(3),
            quarantine_id: Some(12),
            prev_hash: [1; 32],
            hash: [2; 32],
        };
        let sparse = AuditRecord {
            outcome: Outcome::Malformed.code(),
            key: None,
            agency: None,
            source_id: None,
            epoch: None,
            sequence: None,
            digest: None,
            effect_offset: None,
            ..full.clone()
        };
        for (i, r) in [(0u64, &full), (18_446_744_073_709_551_615, &sparse)] {
            let generic = Json::Object(body_fields(i, r)).to_canonical().unwrap();
            assert_eq!(canonical_body(i, r), generic);
        }
    }
}
