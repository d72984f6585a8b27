//! Payload bytes -> `Message`: the feed contract, its limits and the `DecodeError` of each way a
//! payload can fail it. Pure: no I/O, never panics on input.

use crate::json::{self, JsonError, Pointer, Value};
use crate::key::{canonical_digest, message_digest, sha256};
use crate::model::{Digest, MAX_NAME_BYTES, Message, Position, Source, hex};

/// Default `max_payload_bytes`: 256 KiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 256 * 1024;
/// Default `max_depth` of nested arrays/objects.
pub const DEFAULT_MAX_DEPTH: usize = 32;

/// Where the producer-controlled fields live in a message, and the limits a message must meet.
#[derive(Clone, Debug)]
pub struct FeedContract {
    pub agency: Pointer,
    pub source_id: Pointer,
    pub sequence: Pointer,
    pub epoch: Pointer,
    pub digest_ignore: Vec<Pointer>,
    pub max_payload_bytes: usize,
    pub max_depth: usize,
}

impl FeedContract {
    /// This contract for re-deciding content already admitted (`verify`, `quarantine
    /// release`): the same fields and digest rule, without the admission limits. The limits
    /// never change a key or a digest, so a record admitted before an operator lowered
    /// `max_payload_bytes` or `max_depth` must not read as damaged afterwards.
    pub fn for_stored(&self) -> FeedContract {
        FeedContract {
            max_payload_bytes: usize::MAX,
            max_depth: STORED_MAX_DEPTH,
            ..self.clone()
        }
    }
}

/// The deepest nesting any config admits (`[feed] max_depth` is at most this).
pub const STORED_MAX_DEPTH: usize = 128;

impl Default for FeedContract {
    fn default() -> Self {
        let ptr = |s: &str| Pointer::parse(s).unwrap_or_else(|_| unreachable!("static pointer"));
        FeedContract {
            agency: ptr("/agency"),
            source_id: ptr("/source_id"),
            sequence: ptr("/sequence"),
            epoch: ptr("/epoch"),
            digest_ignore: Vec::new(),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

/// Why a payload is `malformed`. The text is the audit `reason`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error(
        "payload of {size} bytes (SHA-256 {}) exceeds max_payload_bytes ({limit}); only its \
         first {limit} bytes are kept",
        hex(sha256)
    )]
    TooLarge {
        size: usize,
        limit: usize,
        /// SHA-256 of the whole payload, which is not kept.
        sha256: [u8; 32],
    },
    #[error("{0}")]
    Json(#[from] JsonError),
    #[error("payload is a JSON {0}, not an object")]
    NotObject(&'static str),
    #[error("missing field {field} (pointer {pointer:?})")]
    Missing {
        field: &'static str,
        pointer: String,
    },
    #[error("field {field} {why}")]
    Invalid { field: &'static str, why: String },
}

impl DecodeError {
    /// Whether the failure could be a matter of the feed contract (its pointers and limits)
    /// rather than of the bytes: a payload that is not UTF-8, not JSON, has a duplicate name
    /// or an out-of-range number, or is not an object fails under every contract.
    pub fn depends_on_contract(&self) -> bool {
        match self {
            DecodeError::Json(JsonError::TooDeep(_)) => true,
            DecodeError::Json(_) | DecodeError::NotObject(_) => false,
            DecodeError::TooLarge { .. } | DecodeError::Missing { .. } => true,
            DecodeError::Invalid { .. } => true,
        }
    }

    /// The whole payload's size, the limit and its SHA-256, read back from the text of a
    /// `TooLarge` error (the audit reason of an oversized message: only the first `limit`
    /// bytes of it were kept). `None` for any other text.
    pub fn parse_too_large(reason: &str) -> Option<(usize, usize, [u8; 32])> {
        let rest = reason.strip_prefix("payload of ")?;
        let (size, rest) = rest.split_once(" bytes (SHA-256 ")?;
        let (sha, rest) = rest.split_once(") exceeds max_payload_bytes (")?;
        let (limit, rest) = rest.split_once("); only its first ")?;
        if rest != format!("{limit} bytes are kept") || sha.len() != 64 {
            return None;
        }
        let mut digest = [0u8; 32];
        for (i, b) in digest.iter_mut().enumerate() {
            *b = u8::from_str_radix(sha.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        let size: usize = size.parse().ok()?;
        let limit: usize = limit.parse().ok()?;
        (DecodeError::TooLarge {
            size,
            limit,
            sha256: digest,
        }
        .to_string()
            == reason)
            .then_some((size, limit, digest))
    }
}

/// Decodes one payload under `contract`.
pub fn decode(payload: &[u8], contract: &FeedContract) -> Result<Message, DecodeError> {
    if payload.len() > contract.max_payload_bytes {
        return Err(DecodeError::TooLarge {
            size: payload.len(),
            limit: contract.max_payload_bytes,
            sha256: sha256(&[payload]),
        });
    }
    let mut value = json::parse_borrowed(payload, contract.max_depth)?;
    if !matches!(value, Value::Object(_)) {
        return Err(DecodeError::NotObject(kind(&value)));
    }
    let agency = name(&value, &contract.agency, "agency")?;
    let source_id = name(&value, &contract.source_id, "source_id")?;
    let sequence = required_u64(&value, &contract.sequence, "sequence")?;
    let epoch = match value.pointer(&contract.epoch) {
        None => 0,
        Some(v) => as_u64(v, "epoch")?,
    };
    let source = Source::new(agency, source_id);
    let position = Position { epoch, sequence };
    let digest = if contract.digest_ignore.is_empty() {
        canonical_digest(&mut value)?
    } else {
        message_digest(&value.into_owned(), &contract.digest_ignore)?
    };
    Ok(Message::new(source, position, digest))
}

/// The content digest `decode` gives a well-formed payload under a contract that ignores no
/// member: SHA-256 of its canonical JSON. The store recomputes a stored effect's digest with
/// it (`store::stored`), so the limits are the widest any config admits.
pub fn whole_digest(payload: &[u8]) -> Result<Digest, JsonError> {
    let mut value = json::parse_borrowed(payload, STORED_MAX_DEPTH)?;
    canonical_digest(&mut value)
}

fn kind(v: &Value<'_>) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn pointer_text(p: &Pointer) -> String {
    p.to_string()
}

fn name(v: &Value<'_>, p: &Pointer, field: &'static str) -> Result<String, DecodeError> {
    match v.pointer(p) {
        None => Err(DecodeError::Missing {
            field,
            pointer: pointer_text(p),
        }),
        Some(Value::String(s)) if s.is_empty() => Err(DecodeError::Invalid {
            field,
            why: "is an empty string".into(),
        }),
        Some(Value::String(s)) if s.len() > MAX_NAME_BYTES => Err(DecodeError::Invalid {
            field,
            why: format!("is {} bytes long (at most {MAX_NAME_BYTES})", s.len()),
        }),
        Some(Value::String(s)) => Ok(s.to_string()),
        Some(other) => Err(DecodeError::Invalid {
            field,
            why: format!("must be a string, found a {}", kind(other)),
        }),
    }
}

fn required_u64(v: &Value<'_>, p: &Pointer, field: &'static str) -> Result<u64, DecodeError> {
    match v.pointer(p) {
        None => Err(DecodeError::Missing {
            field,
            pointer: pointer_text(p),
        }),
        Some(x) => as_u64(x, field),
    }
}

/// Accepts only a plain unsigned integer literal (`0`, `42`), never `4.0`, `4e1`, `-1` or `"4"`.
fn as_u64(v: &Value<'_>, field: &'static str) -> Result<u64, DecodeError> {
    let Value::Number(text) = v else {
        return Err(DecodeError::Invalid {
            field,
            why: format!("must be an unsigned integer, found a {}", kind(v)),
        });
    };
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(DecodeError::Invalid {
            field,
            why: format!("must be an unsigned integer, found {text}"),
        });
    }
    text.parse::<u64>().map_err(|_| DecodeError::Invalid {
        field,
        why: format!("{text} does not fit in 64 bits"),
    })
}

/// One delivery to decide: where it came from, its bytes, and what `wire` made of them.
#[derive(Debug, Clone)]
pub struct Incoming {
    pub topic: String,
    pub payload: Vec<u8>,
    pub received_at_ms: u64,
    pub decoded: Result<Message, DecodeError>,
    /// `decoded`'s digest is `whole_digest(&payload)` (the contract ignores no member), so a
    /// stored effect of it need not hold the digest (`store::stored`).
    pub whole_digest: bool,
}

impl Incoming {
    pub fn decode(
        topic: impl Into<String>,
        payload: Vec<u8>,
        received_at_ms: u64,
        contract: &FeedContract,
    ) -> Incoming {
        let decoded = decode(&payload, contract);
        Incoming {
            topic: topic.into(),
            payload,
            received_at_ms,
            // `whole_digest` parses at most `STORED_MAX_DEPTH` deep: a contract admitting more
            // (a library caller's) keeps the digest's bytes.
            whole_digest: decoded.is_ok()
                && contract.digest_ignore.is_empty()
                && contract.max_depth <= STORED_MAX_DEPTH,
            decoded,
        }
    }
}

impl Incoming {
    /// A payload too large to accept, of which only `prefix` (at least `limit` bytes, or all
    /// of it) was read; `size` and `sha256` describe the whole payload.
    pub fn oversized(
        topic: impl Into<String>,
        prefix: Vec<u8>,
        size: usize,
        sha256: [u8; 32],
        received_at_ms: u64,
        limit: usize,
    ) -> Incoming {
        Incoming {
            topic: topic.into(),
            payload: prefix,
            received_at_ms,
            decoded: Err(DecodeError::TooLarge {
                size,
                limit,
                sha256,
            }),
            whole_digest: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> Result<Message, DecodeError> {
        decode(s.as_bytes(), &FeedContract::default())
    }

    #[test]
    fn well_formed_message_decodes() {
        let m = d(r#"{"agency":"A","source_id":"S","sequence":7,"epoch":2,"x":[1]}"#).unwrap();
        assert_eq!(m.source.agency(), "A");
        assert_eq!(
            m.position,
            Position {
                epoch: 2,
                sequence: 7
            }
        );
    }

    #[test]
    fn epoch_defaults_to_zero() {
        let m = d(r#"{"agency":"A","source_id":"S","sequence":7}"#).unwrap();
        assert_eq!(m.position.epoch, 0);
    }

    #[test]
    fn every_malformed_kind_is_an_error_with_a_reason() {
        let cases = [
            ("[1]", "array, not an object"),
            ("\"x\"", "string, not an object"),
            ("{", "invalid JSON"),
            (r#"{"source_id":"S","sequence":1}"#, "missing field agency"),
            (
                r#"{"agency":"","source_id":"S","sequence":1}"#,
                "agency is an empty string",
            ),
            (
                r#"{"agency":5,"source_id":"S","sequence":1}"#,
                "must be a string",
            ),
            (
                r#"{"agency":"A","source_id":"S"}"#,
                "missing field sequence",
            ),
            (
                r#"{"agency":"A","source_id":"S","sequence":-1}"#,
                "found -1",
            ),
            (
                r#"{"agency":"A","source_id":"S","sequence":1.5}"#,
                "found 1.5",
            ),
            (
                r#"{"agency":"A","source_id":"S","sequence":1.0}"#,
                "found 1.0",
            ),
            (
                r#"{"agency":"A","source_id":"S","sequence":"1"}"#,
                "found a string",
            ),
            (
                r#"{"agency":"A","source_id":"S","sequence":18446744073709551616}"#,
                "64 bits",
            ),
            (
                r#"{"agency":"A","source_id":"S","sequence":1,"epoch":null}"#,
                "epoch must be",
            ),
            (
                r#"{"agency":"A","agency":"B","source_id":"S","sequence":1}"#,
                "duplicate member",
            ),
        ];
        for (input, want) in cases {
            let err = d(input).unwrap_err().to_string();
            assert!(err.contains(want), "{input}: {err:?} lacks {want:?}");
        }
        let long = format!(
            r#"{{"agency":"{}","source_id":"S","sequence":1}}"#,
            "a".repeat(257)
        );
        assert!(d(&long).unwrap_err().to_string().contains("257 bytes"));
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(d(&deep).unwrap_err().to_string().contains("nesting deeper"));
        let big = vec![b' '; DEFAULT_MAX_PAYLOAD_BYTES + 1];
        let err = decode(&big, &FeedContract::default()).unwrap_err();
        assert!(matches!(err, DecodeError::TooLarge { .. }));
        assert!(
            decode(b"\xff\xfe", &FeedContract::default())
                .unwrap_err()
                .to_string()
                .contains("UTF-8")
        );
    }

    #[test]
    fn a_too_large_reason_reads_back_its_size_limit_and_digest() {
        let e = DecodeError::TooLarge {
            size: 300,
            limit: 256,
            sha256: [0xab; 32],
        };
        let text = e.to_string();
        assert_eq!(
            DecodeError::parse_too_large(&text),
            Some((300, 256, [0xab; 32]))
        );
        assert_eq!(DecodeError::parse_too_large(&text[1..]), None);
        assert_eq!(DecodeError::parse_too_large("missing field sequence"), None);
        assert!(e.depends_on_contract());
        assert!(!DecodeError::NotObject("array").depends_on_contract());
    }

    #[test]
    fn custom_pointers_are_followed() {
        let c = FeedContract {
            agency: Pointer::parse("/hdr/org").unwrap(),
            source_id: Pointer::parse("/hdr/dev").unwrap(),
            sequence: Pointer::parse("/hdr/n").unwrap(),
            epoch: Pointer::parse("/hdr/boot").unwrap(),
            ..FeedContract::default()
        };
        let m = decode(br#"{"hdr":{"org":"A","dev":"D","n":3,"boot":1}}"#, &c).unwrap();
        assert_eq!(
            m.position,
            Position {
                epoch: 1,
                sequence: 3
            }
        );
    }
}
