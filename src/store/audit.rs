//! The audit entry as a reviewer sees it, and its hash chain:
//! `hash = SHA-256(prev_hash || canonical JSON of the entry without prev_hash and hash)`.
//! Canonical JSON is the JCS form produced by `json::Json::to_canonical`, so the chain can be
//! checked from `dump-audit` output alone.

use crate::json::{Json, Sink, write_string};
use crate::key::Sha256Sink;
use crate::model::{Outcome, hex, hex_bytes};
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

/// The canonical JSON of `body_fields`, written directly (it is on the commit path, streamed
/// into SHA-256 by `entry_hash`). Equal to `Json::Object(body_fields(..)).to_canonical()`; a
/// test holds the two together.
fn write_body(out: &mut impl Sink, index: u64, r: &AuditRecord) {
    let mut first = true;
    let mut key = |out: &mut dyn Sink, name: &str| {
        out.put(if first { "{\"" } else { ",\"" });
        first = false;
        out.put(name);
        out.put("\":");
    };
    let opt_str = |out: &mut dyn Sink, v: &Option<String>| match v {
        Some(s) => write_string(out, s),
        None => out.put("null"),
    };
    let opt_num = |out: &mut dyn Sink, v: Option<u64>| match v {
        Some(n) => put_u64(out, n),
        None => out.put("null"),
    };
    let opt_hex = |out: &mut dyn Sink, v: &Option<[u8; 32]>| match v {
        Some(b) => {
            let mut text = [b'"'; 66];
            hex_bytes(&mut text[1..65], b);
            out.put(std::str::from_utf8(&text).unwrap_or_default());
        }
        None => out.put("null"),
    };
    // Member names are ASCII, so JCS's UTF-16 order is plain byte order, fixed here.
    key(out, "agency");
    opt_str(out, &r.agency);
    key(out, "digest");
    opt_hex(out, &r.digest);
    key(out, "effect_offset");
    opt_num(out, r.effect_offset);
    key(out, "epoch");
    opt_num(out, r.epoch);
    key(out, "index");
    opt_num(out, Some(index));
    key(out, "key");
    opt_hex(out, &r.key);
    key(out, "outcome");
    write_string(
        out,
        Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str),
    );
    key(out, "quarantine_id");
    opt_num(out, r.quarantine_id);
    key(out, "reason");
    write_string(out, &r.reason);
    key(out, "recorded_at");
    // A batch shares one timestamp: format it once per batch, not per entry.
    thread_local!(static LAST: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) });
    LAST.with_borrow_mut(|(ms, text)| {
        if *ms != r.recorded_at_ms {
            *ms = r.recorded_at_ms;
            *text = rfc3339_ms(r.recorded_at_ms);
        }
        write_string(out, text);
    });
    key(out, "sequence");
    opt_num(out, r.sequence);
    key(out, "source_id");
    opt_str(out, &r.source_id);
    key(out, "topic");
    write_string(out, &r.topic);
    out.put_byte(b'}');
}

/// Writes `n` in decimal.
fn put_u64(out: &mut dyn Sink, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put(std::str::from_utf8(&digits[at..]).unwrap_or_default());
}

/// The hash an entry with this body and predecessor must carry.
pub fn entry_hash(index: u64, r: &AuditRecord, prev_hash: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256Sink::new();
    h.update(prev_hash);
    write_body(&mut h, index, r);
    h.finish()
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
            let mut direct = String::new();
            write_body(&mut direct, i, r);
            assert_eq!(direct, generic);
        }
    }
}
