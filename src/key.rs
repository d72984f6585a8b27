//! Idempotency key v1 and the canonical message digest. Both are published formats: other tools
//! recompute them, so any change is a new version, never an edit.

use sha2::{Digest as _, Sha256};

use crate::json::{Json, JsonError, Pointer, Sink, Value};
use crate::model::{Digest, IdempotencyKey, Position, Source};

/// Domain-separation prefix of key v1 (includes the trailing NUL).
pub const KEY_V1_PREFIX: &[u8] = b"replay-guard/key/v1\0";

/// `SHA-256(b"replay-guard/key/v1\0" || be32(len(agency)) || agency || be32(len(source_id)) ||
/// source_id || be64(epoch) || be64(sequence))`. Length prefixes keep `("a|b","c")` and
/// `("a","b|c")` apart; broker metadata (packet id, DUP, timestamps) is never part of it.
pub fn derive_key(source: &Source, position: Position) -> IdempotencyKey {
    IdempotencyKey::from_hash(key_v1(
        source.agency(),
        source.source_id(),
        position.epoch,
        position.sequence,
    ))
}

/// The bytes of key v1 (`derive_key`) from its four fields as stored: the store recomputes a
/// record's key from them instead of storing it twice.
pub fn key_v1(agency: &str, source_id: &str, epoch: u64, sequence: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(KEY_V1_PREFIX);
    for part in [agency, source_id] {
        // Names are at most MAX_NAME_BYTES (256), so the length always fits in 32 bits; a
        // longer stored name (never written by this build) still hashes to one fixed key.
        h.update((part.len() as u32).to_be_bytes());
        h.update(part.as_bytes());
    }
    h.update(epoch.to_be_bytes());
    h.update(sequence.to_be_bytes());
    h.finalize().into()
}

/// SHA-256 of the message's canonical JSON after removing the `ignore` pointers, so a resend
/// with other member order, spacing or number spelling (`1.0` vs `1`) has the same digest.
/// Every pointer names a value of the original message (`Json::without`): the digest never
/// depends on the order of `ignore`, and a repeated pointer removes one value, not two.
pub fn message_digest(message: &Json, ignore: &[Pointer]) -> Result<Digest, JsonError> {
    let canonical = if ignore.is_empty() {
        message.to_canonical()?
    } else {
        message.without(ignore).to_canonical()?
    };
    Ok(Digest::from_hash(
        Sha256::digest(canonical.as_bytes()).into(),
    ))
}

/// `message_digest` with no `ignore` pointers, of a borrowed tree (the feed's path,
/// `wire::decode`): the canonical form is streamed into the hasher, never held whole. Sorts
/// each object's members in place.
pub(crate) fn canonical_digest(message: &mut Value<'_>) -> Result<Digest, JsonError> {
    let mut sink = Sha256Sink::new();
    message.write_canonical(&mut sink)?;
    Ok(Digest::from_hash(sink.finish()))
}

const SINK_BYTES: usize = 512;

/// SHA-256 of text written in many small pieces (the canonical writers' `Sink`), gathered
/// into whole blocks before they reach the hasher; the text is never held whole.
pub(crate) struct Sha256Sink {
    hash: Sha256,
    buf: [u8; SINK_BYTES],
    len: usize,
}

impl Sha256Sink {
    pub(crate) fn new() -> Sha256Sink {
        Sha256Sink {
            hash: Sha256::new(),
            buf: [0; SINK_BYTES],
            len: 0,
        }
    }

    #[inline]
    pub(crate) fn update(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > SINK_BYTES {
            self.hash.update(&self.buf[..self.len]);
            self.len = 0;
            if bytes.len() > SINK_BYTES {
                self.hash.update(bytes);
                return;
            }
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    pub(crate) fn finish(mut self) -> [u8; 32] {
        self.hash.update(&self.buf[..self.len]);
        self.hash.finalize().into()
    }
}

impl Sink for Sha256Sink {
    #[inline]
    fn put(&mut self, s: &str) {
        self.update(s.as_bytes());
    }
    #[inline]
    fn put_byte(&mut self, b: u8) {
        if self.len == SINK_BYTES {
            self.hash.update(self.buf);
            self.len = 0;
        }
        self.buf[self.len] = b;
        self.len += 1;
    }
}

/// SHA-256 over data that arrives in pieces (an oversized input line).
#[derive(Default, Clone)]
pub struct Sha256Stream(Sha256);

impl Sha256Stream {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    pub fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }
}

/// SHA-256 of arbitrary bytes (quarantine fingerprints of malformed payloads, audit chain).
pub fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::parse;

    fn src(a: &str, s: &str) -> Source {
        Source::new(a.into(), s.into())
    }

    // Expected values computed independently with Python:
    // hashlib.sha256(b"replay-guard/key/v1\0" + len(a).to_bytes(4,"big") + a + ...).hexdigest()
    #[test]
    fn key_v1_test_vectors() {
        let k = derive_key(
            &src("CALFIRE", "E7-AVL"),
            Position {
                epoch: 3,
                sequence: 42,
            },
        );
        assert_eq!(
            k.to_hex(),
            "feef34e794174698184a28c42ed243d685a90cebb8b2cd4c5aeb2160f50d0734"
        );
        let k = derive_key(
            &src("a", "b"),
            Position {
                epoch: 0,
                sequence: 1,
            },
        );
        assert_eq!(
            k.to_hex(),
            "753c8721b78a692eee4410c2d15c6cacddb8122f3b9d8fa053aad0cf6fdc05e0"
        );
        let k = derive_key(
            &src("Cal Fire/ÉMS", "engine 7"),
            Position {
                epoch: u64::MAX,
                sequence: 0,
            },
        );
        assert_eq!(
            k.to_hex(),
            "25510c25ab100a6cfcedd28365a25ce55e3740f50976d4bef2f828437e14e400"
        );
    }

    #[test]
    fn separator_in_names_cannot_collide() {
        let p = Position {
            epoch: 0,
            sequence: 1,
        };
        assert_ne!(
            derive_key(&src("a|b", "c"), p),
            derive_key(&src("a", "b|c"), p)
        );
        assert_ne!(
            derive_key(&src("ab", "c"), p),
            derive_key(&src("a", "bc"), p)
        );
    }

    #[test]
    fn key_depends_on_epoch_and_sequence() {
        let s = src("x", "y");
        let a = derive_key(
            &s,
            Position {
                epoch: 0,
                sequence: 1,
            },
        );
        let b = derive_key(
            &s,
            Position {
                epoch: 1,
                sequence: 0,
            },
        );
        assert_ne!(a, b);
    }

    #[test]
    fn digest_ignores_order_spacing_number_spelling_and_ignored_fields() {
        let a = parse(
            br#"{"agency":"A","sequence":1,"tally":3.0,"sent_at":"t1"}"#,
            32,
        )
        .unwrap();
        let b = parse(
            br#"{ "tally" : 3, "sequence":1, "agency":"A", "sent_at":"t2" }"#,
            32,
        )
        .unwrap();
        let ignore = [Pointer::parse("/sent_at").unwrap()];
        assert_eq!(
            message_digest(&a, &ignore).unwrap(),
            message_digest(&b, &ignore).unwrap()
        );
        assert_ne!(
            message_digest(&a, &[]).unwrap(),
            message_digest(&b, &[]).unwrap()
        );
    }

    #[test]
    fn the_streamed_digest_equals_the_digest_of_the_whole_canonical_text() {
        let long = "x".repeat(3 * SINK_BYTES);
        for text in [
            r#"{"b":[1,2.0,{"z":null,"y":"\u0007"}],"a":"é😀","c":-0.0e3}"#.to_string(),
            format!(r#"{{"pad":"{long}","n":1e400,"m":{{"q":"{long}"}}}}"#),
            "{}".to_string(),
        ] {
            let mut borrowed = crate::json::parse_borrowed(text.as_bytes(), 32).unwrap();
            let owned = parse(text.as_bytes(), 32).unwrap();
            let want = Sha256::digest(owned.to_canonical().unwrap().as_bytes());
            assert_eq!(
                canonical_digest(&mut borrowed).unwrap().as_bytes()[..],
                want[..]
            );
            assert_eq!(
                message_digest(&owned, &[]).unwrap().as_bytes()[..],
                want[..]
            );
        }
    }

    fn ptrs(list: &[&str]) -> Vec<Pointer> {
        list.iter().map(|s| Pointer::parse(s).unwrap()).collect()
    }

    #[test]
    fn a_repeated_ignore_pointer_removes_one_item_not_two() {
        let a = parse(
            br#"{"agency":"A","source_id":"S","sequence":1,"list":["stamp-1","casualties:3"]}"#,
            32,
        )
        .unwrap();
        let b = parse(
            br#"{"agency":"A","source_id":"S","sequence":1,"list":["stamp-2","casualties:6"]}"#,
            32,
        )
        .unwrap();
        let twice = ptrs(&["/list/0", "/list/0"]);
        assert_ne!(
            message_digest(&a, &twice).unwrap(),
            message_digest(&b, &twice).unwrap(),
            "casualties 3 -> 6 is a real change"
        );
        assert_eq!(
            message_digest(&a, &twice).unwrap(),
            message_digest(&a, &ptrs(&["/list/0"])).unwrap()
        );
    }

    #[test]
    fn the_digest_is_the_same_whatever_the_order_of_digest_ignore() {
        let m = parse(
            br#"{"agency":"A","list":["t0","keep","t2","t3"],"meta":{"at":1,"by":"x"},"z":true}"#,
            32,
        )
        .unwrap();
        let set = ["/list/0", "/list/2", "/list/3", "/meta/at", "/z"];
        let want = parse(br#"{"agency":"A","list":["keep"],"meta":{"by":"x"}}"#, 32).unwrap();
        let want = message_digest(&want, &[]).unwrap();
        // Every rotation and the reverse of every rotation.
        for r in 0..set.len() {
            let mut order: Vec<&str> = set[r..].iter().chain(&set[..r]).copied().collect();
            assert_eq!(
                message_digest(&m, &ptrs(&order)).unwrap(),
                want,
                "{order:?}"
            );
            order.reverse();
            assert_eq!(
                message_digest(&m, &ptrs(&order)).unwrap(),
                want,
                "{order:?}"
            );
        }
    }

    #[test]
    fn removing_list_0_and_list_1_removes_exactly_those_items_of_the_original() {
        let m = parse(br#"{"list":["a","b","c"]}"#, 32).unwrap();
        let only_c = parse(br#"{"list":["c"]}"#, 32).unwrap();
        for order in [["/list/0", "/list/1"], ["/list/1", "/list/0"]] {
            assert_eq!(
                message_digest(&m, &ptrs(&order)).unwrap(),
                message_digest(&only_c, &[]).unwrap(),
                "{order:?}"
            );
        }
    }
}
