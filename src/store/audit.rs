//! The audit entry as a reviewer sees it, and its hash chain:
//! `hash = SHA-256(prev_hash || canonical JSON of the entry without prev_hash and hash)`.
//! Canonical JSON is the JCS form produced by `json::Json::to_canonical`, so the chain can be
//! checked from `dump-audit` output alone.

use crate::json::Json;
use crate::key::sha256;
use crate::model::{Outcome, hex};
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

/// The hash an entry with this body and predecessor must carry.
pub fn entry_hash(index: u64, r: &AuditRecord, prev_hash: &[u8; 32]) -> [u8; 32] {
    let body = Json::Object(body_fields(index, r));
    // Every number here is a plain integer, which always canonicalises.
    let canonical = body.to_canonical().unwrap_or_else(|e| unreachable!("{e}"));
    sha256(&[prev_hash, canonical.as_bytes()])
}
