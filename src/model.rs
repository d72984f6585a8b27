//! The vocabulary of replay-guard: sources, positions, keys, digests, outcomes. Std only
//! (a `Message`'s key is derived by `key`).

use std::fmt;

/// A producer: the pair (agency, source_id) named by the feed contract.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Source {
    agency: String,
    source_id: String,
}

impl Source {
    /// Callers guarantee both parts are non-empty and at most [`MAX_NAME_BYTES`]; `wire` checks it.
    pub(crate) fn new(agency: String, source_id: String) -> Source {
        Source { agency, source_id }
    }
    pub fn agency(&self) -> &str {
        &self.agency
    }
    pub fn source_id(&self) -> &str {
        &self.source_id
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.agency, self.source_id)
    }
}

/// Longest accepted `agency` or `source_id`, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// Where a message sits in its source's stream: compared lexicographically (epoch first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Position {
    pub epoch: u64,
    pub sequence: u64,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "epoch {} sequence {}", self.epoch, self.sequence)
    }
}

/// The idempotency key v1 of a message. Only `key::derive_key` makes one from a message;
/// `from_bytes` exists to read stored keys back.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey([u8; 32]);

/// SHA-256 of a message's canonical JSON (see `key::message_digest`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

macro_rules! hash_newtype {
    ($t:ident) => {
        impl $t {
            pub(crate) fn from_hash(bytes: [u8; 32]) -> Self {
                $t(bytes)
            }
            /// Rebuilds a value read back from storage or a dump.
            pub fn from_bytes(bytes: [u8; 32]) -> Self {
                $t(bytes)
            }
            pub fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }
            /// 64 lowercase hex digits.
            pub fn to_hex(&self) -> String {
                hex(&self.0)
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.to_hex())
            }
        }
        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($t), self.to_hex())
            }
        }
    };
}
hash_newtype!(IdempotencyKey);
hash_newtype!(Digest);

/// Lowercase hex of any byte string.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    hex_into(&mut s, bytes);
    s
}

/// Appends the lowercase hex of `bytes` to `out`.
pub fn hex_into(out: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
}

/// Writes the lowercase hex of `bytes` into `out`, two digits per byte (`out` holds exactly
/// `2 * bytes.len()`; extra bytes of either are left alone).
pub(crate) fn hex_bytes(out: &mut [u8], bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0x0f)];
    }
}

/// Parses 64 hex digits (either case) into 32 bytes.
pub fn parse_hex32(s: &str) -> Option<[u8; 32]> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = u8::try_from(hi * 16 + lo).ok()?;
    }
    Some(out)
}

/// A decoded, well-formed message: who sent it, where it sits, its key and content digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub source: Source,
    pub position: Position,
    /// Always key v1 of `source` and `position` (`Message::new` is the only way to make one),
    /// so the store never has to recompute it to know that it is.
    key: IdempotencyKey,
    pub digest: Digest,
}

impl Message {
    /// The message at `position` of `source` with content `digest`; its key is key v1 of the
    /// two (`key::derive_key`).
    pub(crate) fn new(source: Source, position: Position, digest: Digest) -> Message {
        Message {
            key: crate::key::derive_key(&source, position),
            source,
            position,
            digest,
        }
    }

    /// Key v1 of the message's source and position.
    pub fn key(&self) -> IdempotencyKey {
        self.key
    }
}

/// The decision for one delivery. The names are part of the audit format: never rename.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// First sight of a position above the source's high-water mark: effect applied.
    Applied,
    /// First sight of a position below the high-water mark but above the evicted floor:
    /// provably never applied, so applied with `late: true`.
    AppliedLate,
    /// Key in the window with the same digest: suppressed, audited.
    Duplicate,
    /// Key in the window with a different digest: quarantined.
    Conflict,
    /// Position at or below what can be proven (evicted floor), or late under the
    /// `quarantine` policy: quarantined.
    Stale,
    /// Not a feed-contract message: raw bytes quarantined.
    Malformed,
    /// An operator judged a quarantined message genuine (`quarantine release`): its effect is
    /// applied with `released: true`. Never returned by `decide`.
    Released,
    /// An operator judged a quarantined message not to be applied (`quarantine discard`): it
    /// leaves the quarantine, and the audit keeps why. Never returned by `decide`.
    Discarded,
    /// An operator's relay action (`relay retry|rewind|forget`): names the sink, who and why.
    /// Never returned by `decide`, and changes no effect.
    Relay,
}

impl Outcome {
    pub const ALL: [Outcome; 9] = [
        Outcome::Applied,
        Outcome::AppliedLate,
        Outcome::Duplicate,
        Outcome::Conflict,
        Outcome::Stale,
        Outcome::Malformed,
        Outcome::Released,
        Outcome::Discarded,
        Outcome::Relay,
    ];

    /// The outcomes a delivery can get (the rest of `ALL` are operator actions).
    pub const DECIDED: &[Outcome] = Outcome::ALL.split_at(6).0;

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::AppliedLate => "applied_late",
            Outcome::Duplicate => "duplicate",
            Outcome::Conflict => "conflict",
            Outcome::Stale => "stale",
            Outcome::Malformed => "malformed",
            Outcome::Released => "released",
            Outcome::Discarded => "discarded",
            Outcome::Relay => "relay",
        }
    }

    pub fn parse(s: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == s)
    }

    /// Whether this outcome writes an effect record.
    pub fn applies(self) -> bool {
        matches!(
            self,
            Outcome::Applied | Outcome::AppliedLate | Outcome::Released
        )
    }

    /// Stable code used in stored records.
    pub(crate) fn code(self) -> u8 {
        match self {
            Outcome::Applied => 0,
            Outcome::AppliedLate => 1,
            Outcome::Duplicate => 2,
            Outcome::Conflict => 3,
            Outcome::Stale => 4,
            Outcome::Malformed => 5,
            Outcome::Released => 6,
            Outcome::Discarded => 7,
            Outcome::Relay => 8,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.code() == code)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Per-outcome counters, e.g. for a batch or an `ingest` run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutcomeCounts([u64; 9]);

impl OutcomeCounts {
    /// Counts indexed by outcome code (the stored form, which has no `relay` slot).
    pub fn from_array(by_code: [u64; 8]) -> OutcomeCounts {
        let mut all = [0; 9];
        all[..8].copy_from_slice(&by_code);
        OutcomeCounts(all)
    }
    pub fn add(&mut self, outcome: Outcome) {
        self.0[usize::from(outcome.code())] += 1;
    }
    pub fn get(&self, outcome: Outcome) -> u64 {
        self.0[usize::from(outcome.code())]
    }
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
    /// These counts with `outcome`'s set to 0.
    pub fn without(&self, outcome: Outcome) -> OutcomeCounts {
        let mut c = self.clone();
        c.0[usize::from(outcome.code())] = 0;
        c
    }
    pub fn merge(&mut self, other: &OutcomeCounts) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }
}

impl fmt::Display for OutcomeCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = Outcome::ALL
            .iter()
            .map(|o| format!("{}={}", o.as_str(), self.get(*o)))
            .collect();
        write!(f, "total={} {}", self.total(), parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_names_and_codes_round_trip() {
        for o in Outcome::ALL {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
            assert_eq!(Outcome::from_code(o.code()), Some(o));
        }
    }

    #[test]
    fn hex_round_trips() {
        let b: [u8; 32] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(parse_hex32(&hex(&b)), Some(b));
        assert_eq!(parse_hex32("zz"), None);
    }

    #[test]
    fn positions_compare_epoch_first() {
        let a = Position {
            epoch: 1,
            sequence: 99,
        };
        let b = Position {
            epoch: 2,
            sequence: 0,
        };
        assert!(a < b);
    }
}
