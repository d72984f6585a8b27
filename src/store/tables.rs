//! Every redb table replay-guard keeps, and the versioned postcard records stored in them.
//! Nothing outside `store/` sees these types.

use redb::TableDefinition;
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// Schema of the whole file; bump with a migration test and a CHANGELOG line.
pub const SCHEMA_VERSION: u32 = 1;
/// First byte of every stored record.
pub const RECORD_V1: u8 = 1;

/// (agency, source_id) -> source number.
pub const SOURCE_IDS: TableDefinition<(&str, &str), u64> = TableDefinition::new("source_ids");
/// source number -> `SourceRecord` (names, high-water mark, evicted floor).
pub const SOURCES: TableDefinition<u64, &[u8]> = TableDefinition::new("sources");
/// (source number, epoch, sequence) -> `WindowRecord`. Keyed by position so inserts are
/// per-source appends; the SHA-256 key is derived from the same fields and stored in the logs.
pub const WINDOW: TableDefinition<(u64, u64, u64), &[u8]> = TableDefinition::new("window");
/// effect offset -> `EffectRecord`. Also the window's time index: the window holds exactly the
/// effects at offsets >= `Meta::window_start`, in first-seen order.
pub const EFFECTS: TableDefinition<u64, &[u8]> = TableDefinition::new("effects");
/// audit index -> `AuditRecord`, hash-chained.
pub const AUDIT: TableDefinition<u64, &[u8]> = TableDefinition::new("audit");
/// quarantine id -> `QuarantineRecord`.
pub const QUARANTINE: TableDefinition<u64, &[u8]> = TableDefinition::new("quarantine");
/// quarantine fingerprint -> quarantine id, so replays of the same bytes do not grow it.
pub const QUARANTINE_FP: TableDefinition<&[u8; 32], u64> = TableDefinition::new("quarantine_fp");
/// quarantine id -> its fingerprint, so pruning or resolving a quarantined message also
/// removes its `QUARANTINE_FP` entry.
pub const QUARANTINE_FP_BY_ID: TableDefinition<u64, &[u8; 32]> =
    TableDefinition::new("quarantine_fp_by_id");
/// burst number -> `BurstRecord`: failover replay bursts `run` absorbed (for `stats`).
pub const REPLAY_BURSTS: TableDefinition<u64, &[u8]> = TableDefinition::new("replay_bursts");
/// sink name -> `SinkRecord`: a relay sink's durable cursor (issue 10). Written only by
/// `store::relay`.
pub const SINK_CURSORS: TableDefinition<&str, &[u8]> = TableDefinition::new("sink_cursors");
/// (sink name, effect offset) -> `ParkedRecord`: events a sink's receiver refused for good.
pub const SINK_PARKED: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("sink_parked");
/// "meta" -> `Meta`; "retention" -> `RetentionMarks`.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
pub const META_KEY: &str = "meta";
pub const RETENTION_KEY: &str = "retention";
/// "counts" -> `Counters`: audit entries per outcome code since the database was created
/// (retention does not lower them).
pub const COUNTS_KEY: &str = "counts";

/// Audit entries per outcome code, since creation.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub by_outcome: [u64; 8],
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub schema_version: u32,
    pub created_at_ms: u64,
    /// First effect offset still in the window (the eviction cursor).
    pub window_start: u64,
    pub next_effect: u64,
    pub next_audit: u64,
    pub next_quarantine: u64,
    pub next_source: u64,
    /// Hash of the last audit entry (all zeros before the first).
    pub chain_head: [u8; 32],
    /// Index and hash of the last audit entry removed by retention; verification starts there.
    pub audit_anchor: Option<(u64, [u8; 32])>,
}

impl Meta {
    /// The meta record of a new, empty store created at `created_at_ms`.
    pub fn new(created_at_ms: u64) -> Meta {
        Meta {
            schema_version: SCHEMA_VERSION,
            created_at_ms,
            window_start: 0,
            next_effect: 0,
            next_audit: 0,
            next_quarantine: 0,
            next_source: 0,
            chain_head: [0; 32],
            audit_anchor: None,
        }
    }
}

/// What retention has removed: every effect below `effects_floor` and every quarantine id
/// below `quarantine_floor` is gone by policy (the audit log's own mark is
/// `Meta::audit_anchor`). Absent (all zero) until retention first prunes.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionMarks {
    pub effects_floor: u64,
    pub quarantine_floor: u64,
    /// Totals removed so far, per log.
    pub audit_pruned: u64,
    pub effects_pruned: u64,
    pub quarantine_pruned: u64,
    pub last_pruned_at_ms: u64,
}

/// A relay sink's cursor and counters.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SinkRecord {
    /// `mqtt`, `http`, `postgres` or `exec`, as configured when the cursor was made.
    pub kind: String,
    /// The first effect offset neither delivered nor parked.
    pub next: u64,
    /// Bumped by every operator move of the cursor (`relay rewind`); a running sink's cursor
    /// write carrying an older generation is refused, so it reloads instead of overwriting.
    pub generation: u64,
    pub registered_at_ms: u64,
    /// When `next` last moved.
    pub advanced_at_ms: u64,
    pub delivered: u64,
    pub parked: u64,
    /// The last failed attempt: when, and what the receiver or the connection said.
    pub last_error: Option<(u64, String)>,
}

/// An event a sink's receiver refused for good, kept with what it said (`relay parked`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ParkedRecord {
    pub parked_at_ms: u64,
    /// The event id (the CloudEvents `id`).
    pub id: String,
    pub key: [u8; 32],
    pub agency: String,
    pub source_id: String,
    /// The topic the message arrived on (the mqtt sink's `{topic}`).
    pub topic: String,
    pub reason: String,
    /// The receiver's last response (status line and the start of the body, or the
    /// program's exit status and stderr).
    pub response: String,
    pub attempts: u64,
    /// `on_poison = "block"`: the sink's cursor waits at this event.
    pub blocking: bool,
    /// Set by `relay retry`: the sink delivers it again and drops the record once accepted.
    pub retry_requested_at_ms: Option<u64>,
    /// The event exactly as it was offered, so a retry needs no effect record (retention may
    /// have pruned it since).
    pub event: String,
}

/// One replay burst: duplicates absorbed after `run` (re)connected to `broker`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct BurstRecord {
    pub broker: String,
    pub connected_at_ms: u64,
    pub ended_at_ms: u64,
    pub duplicates: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct SourceRecord {
    pub agency: String,
    pub source_id: String,
    /// (epoch, sequence)
    pub high_water: (u64, u64),
    pub evicted_floor: Option<(u64, u64)>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRecord {
    pub digest: [u8; 32],
    pub effect_offset: u64,
}

/// The leading fields of `EffectRecord`; eviction decodes only these.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectHead {
    pub source_no: u64,
    pub epoch: u64,
    pub sequence: u64,
    pub received_at_ms: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct EffectRecord {
    // Must start with exactly the fields of `EffectHead`, in its order.
    pub source_no: u64,
    pub epoch: u64,
    pub sequence: u64,
    pub received_at_ms: u64,
    pub key: [u8; 32],
    pub agency: String,
    pub source_id: String,
    pub topic: String,
    pub late: bool,
    pub released: bool,
    pub audit_index: u64,
    /// The payload exactly as delivered (valid UTF-8 JSON).
    #[serde(with = "bytes")]
    pub payload: Vec<u8>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    // Must start with exactly the fields of `AuditHead`, in its order.
    pub recorded_at_ms: u64,
    pub outcome: u8,
    pub key: Option<[u8; 32]>,
    pub agency: Option<String>,
    pub source_id: Option<String>,
    pub epoch: Option<u64>,
    pub sequence: Option<u64>,
    pub topic: String,
    pub reason: String,
    pub digest: Option<[u8; 32]>,
    pub effect_offset: Option<u64>,
    pub quarantine_id: Option<u64>,
    pub prev_hash: [u8; 32],
    pub hash: [u8; 32],
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct QuarantineRecord {
    pub outcome: u8,
    pub reason: String,
    pub topic: String,
    pub received_at_ms: u64,
    pub last_seen_ms: u64,
    /// How many deliveries of these bytes were quarantined here (1 + replays).
    pub deliveries: u64,
    pub key: Option<[u8; 32]>,
    pub audit_index: u64,
    #[serde(with = "bytes")]
    pub payload: Vec<u8>,
}

/// Byte strings as one length-prefixed blob instead of a sequence of `u8` (same postcard bytes,
/// much less work per byte).
mod bytes {
    use serde::de::{Deserializer, SeqAccess, Visitor};
    use serde::ser::Serializer;

    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(b)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Bytes;
        impl<'de> Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut v = Vec::new();
                while let Some(b) = seq.next_element()? {
                    v.push(b);
                }
                Ok(v)
            }
        }
        d.deserialize_byte_buf(Bytes)
    }
}

/// A record that failed to decode: names the table and key so an operator can find it.
#[derive(Debug, thiserror::Error)]
#[error("record {table}#{key} cannot be decoded: {why}")]
pub struct RecordError {
    pub table: &'static str,
    pub key: String,
    pub why: String,
}

pub fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(record, &mut out);
    out
}

/// Encodes into `buf` (cleared first), reusing its allocation on the commit path.
pub fn encode_into<'b, T: Serialize>(record: &T, buf: &'b mut Vec<u8>) -> &'b [u8] {
    buf.clear();
    buf.push(RECORD_V1);
    let taken = std::mem::take(buf);
    // postcard only fails on unsupported serde features (none used) or a full fixed buffer.
    *buf = match postcard::to_extend(record, taken) {
        Ok(v) => v,
        Err(e) => unreachable!("postcard cannot encode a record: {e}"),
    };
    buf.as_slice()
}

pub fn decode<T: DeserializeOwned>(
    table: &'static str,
    key: impl std::fmt::Display,
    bytes: &[u8],
) -> Result<T, RecordError> {
    let err = |why: String| RecordError {
        table,
        key: key.to_string(),
        why,
    };
    match bytes.split_first() {
        Some((&RECORD_V1, rest)) => {
            postcard::from_bytes(rest).map_err(|e| err(format!("postcard: {e}")))
        }
        Some((v, _)) => Err(err(format!("unknown record version {v}"))),
        None => Err(err("empty record".into())),
    }
}

/// The leading fields of `AuditRecord`; retention and `stats` decode only these.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditHead {
    // Must be exactly the first fields of `AuditRecord`, in its order.
    pub recorded_at_ms: u64,
    pub outcome: u8,
}

/// Decodes only the leading fields `H` of a stored record (a prefix struct of its record).
pub fn decode_head<'a, H: Deserialize<'a>>(
    table: &'static str,
    key: u64,
    bytes: &'a [u8],
) -> Result<H, RecordError> {
    let err = |why: String| RecordError {
        table,
        key: key.to_string(),
        why,
    };
    match bytes.split_first() {
        Some((&RECORD_V1, rest)) => postcard::take_from_bytes::<H>(rest)
            .map(|(h, _)| h)
            .map_err(|e| err(format!("postcard: {e}"))),
        Some((v, _)) => Err(err(format!("unknown record version {v}"))),
        None => Err(err("empty record".into())),
    }
}

/// Decodes only the leading `EffectHead` of an effect record.
pub fn decode_effect_head(offset: u64, bytes: &[u8]) -> Result<EffectHead, RecordError> {
    decode_head("effects", offset, bytes)
}

/// The fuzz check of every table's record decoder (`fuzz/` target `records` and its
/// regression inputs): arbitrary bytes decode to a record or a `RecordError`, never a panic;
/// a decoded record re-encodes to bytes that decode to the same record; a head decodes from
/// any record it is a prefix of, with the same fields.
#[doc(hidden)]
pub fn check_decoders(bytes: &[u8]) {
    fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
        table: &'static str,
        bytes: &[u8],
    ) -> Option<T> {
        let record = decode::<T>(table, 0, bytes).ok()?;
        let again = decode::<T>(table, 0, &encode(&record));
        assert!(
            again.as_ref().is_ok_and(|r| *r == record),
            "{table}: {record:?} does not survive re-encoding: {again:?}"
        );
        Some(record)
    }
    round_trip::<Meta>("meta", bytes);
    round_trip::<RetentionMarks>("meta", bytes);
    round_trip::<Counters>("meta", bytes);
    round_trip::<BurstRecord>("replay_bursts", bytes);
    round_trip::<SourceRecord>("sources", bytes);
    round_trip::<WindowRecord>("window", bytes);
    round_trip::<QuarantineRecord>("quarantine", bytes);
    let effect_head = decode_effect_head(0, bytes);
    if let Some(e) = round_trip::<EffectRecord>("effects", bytes) {
        let h = effect_head.as_ref().ok();
        assert_eq!(
            h.map(|h| (h.source_no, h.epoch, h.sequence, h.received_at_ms)),
            Some((e.source_no, e.epoch, e.sequence, e.received_at_ms)),
            "EffectHead disagrees with the EffectRecord it prefixes"
        );
    }
    let audit_head = decode_head::<AuditHead>("audit", 0, bytes);
    if let Some(a) = round_trip::<AuditRecord>("audit", bytes) {
        assert_eq!(
            audit_head.ok().map(|h| (h.recorded_at_ms, h.outcome)),
            Some((a.recorded_at_ms, a.outcome)),
            "AuditHead disagrees with the AuditRecord it prefixes"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effect_head_is_a_prefix_of_the_effect_record() {
        let r = EffectRecord {
            source_no: 7,
            epoch: 2,
            sequence: 300,
            received_at_ms: 1_700_000_000_000,
            key: [1; 32],
            agency: "A".into(),
            source_id: "S".into(),
            topic: "t".into(),
            late: false,
            released: false,
            audit_index: 5,
            payload: b"{}".to_vec(),
        };
        let bytes = encode(&r);
        // Same bytes as serde's default sequence-of-u8 encoding: length, then raw bytes.
        assert!(bytes.ends_with(&[2, b'{', b'}']));
        let h = decode_effect_head(0, &bytes).unwrap();
        assert_eq!(
            (h.source_no, h.epoch, h.sequence, h.received_at_ms),
            (7, 2, 300, 1_700_000_000_000)
        );
        assert_eq!(decode::<EffectRecord>("effects", 0, &bytes).unwrap(), r);
    }

    #[test]
    fn audit_head_is_a_prefix_of_the_audit_record() {
        let r = AuditRecord {
            recorded_at_ms: 1_700_000_000_123,
            outcome: 2,
            key: Some([3; 32]),
            agency: Some("A".into()),
            source_id: Some("S".into()),
            epoch: Some(1),
            sequence: Some(9),
            topic: "t".into(),
            reason: "r".into(),
            digest: None,
            effect_offset: Some(4),
            quarantine_id: None,
            prev_hash: [0; 32],
            hash: [1; 32],
        };
        let h: AuditHead = decode_head("audit", 0, &encode(&r)).unwrap();
        assert_eq!((h.recorded_at_ms, h.outcome), (1_700_000_000_123, 2));
    }

    #[test]
    fn unknown_versions_are_named_errors() {
        let e = decode::<Meta>("meta", "meta", &[9, 1, 2]).unwrap_err();
        assert!(e.to_string().contains("unknown record version 9"), "{e}");
    }
}
