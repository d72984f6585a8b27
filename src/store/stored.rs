//! Record version 2 of `AuditRecord` and `EffectRecord`: the same fields, less what a reader
//! recomputes exactly. Together the two are most of the file (about 230 and 140 bytes per
//! applied message at version 1), and two of their parts repeat what the rest already says:
//!
//! - the idempotency key (32 bytes in each) is key v1 of the agency, source id, epoch and
//!   sequence stored beside it: it is stored as "derived" when recomputing it from them gives
//!   exactly the stored key (checked at every write), and as its bytes otherwise;
//! - an audit reason the decision core wrote from a fixed sentence and one or two numbers
//!   (`decide`: "new position above high-water mark (epoch 1 sequence 99)", 56 bytes) is
//!   stored as the sentence's number in `TEMPLATES` and the numbers, when writing the
//!   template back gives exactly the stored text; every other reason as its text.
//!
//! A decoded record is field for field the record that was encoded, so everything above the
//! store (the hash chain, `verify`, the dumps, the relay) sees no difference. The leading
//! fields (`AuditHead`, `EffectHead`) keep their place, so a head decodes from either version.
//!
//! Effect record version 3 adds the content digest after the head: the window entry leaves it
//! there (`tables::WindowEntry`).
//!
//! Audit record version 3 leaves out the entry's own hash when the writer chained it at the
//! index it is stored at (`StoredHash::Chained`, `note_chained`): a read recomputes it from
//! that index, the content and `prev_hash`, so it decodes only where its index is known.
//!
//! Audit record version 4 also leaves out `prev_hash` when it is the hash of the entry stored
//! at the index before (`StoredPrev::Previous`): the writer chained it so and that entry is in
//! the table, and every `AUDIT_CHECKPOINT`th entry keeps the bytes, so a reader that has not
//! just read the entry before recomputes it from at most that many entries
//! (`tables::Opened::get`). Such an entry decodes only with its predecessor's hash.
//!
//! Effect record version 4 leaves out the content digest when it is the payload's own
//! (`wire::whole_digest`: the contract ignored no member), as the engine notes right before
//! it writes the effect (`StoredDigest::Payload`, `note_whole_digest`): a read parses the
//! payload and recomputes it. An effect under `digest_ignore`, or one the note does not
//! name, keeps the digest's bytes.

use serde::{Deserialize, Serialize};

use crate::key::key_v1;
use crate::model::Message;
use crate::store::tables::{AuditRecord, EffectHead, EffectRecord};

/// How a stored record holds its idempotency key.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
enum StoredKey {
    /// No key (an audit entry of a malformed message or of an operator discard).
    None,
    /// Key v1 of the record's agency, source id, epoch and sequence.
    Derived,
    Bytes([u8; 32]),
}

impl StoredKey {
    fn of(
        key: Option<&[u8; 32]>,
        agency: Option<&str>,
        source_id: Option<&str>,
        epoch: Option<u64>,
        sequence: Option<u64>,
    ) -> StoredKey {
        match (key, agency, source_id, epoch, sequence) {
            (None, ..) => StoredKey::None,
            (Some(k), Some(a), Some(s), Some(e), Some(q)) if is_key_v1(k, a, s, e, q) => {
                StoredKey::Derived
            }
            (Some(k), ..) => StoredKey::Bytes(*k),
        }
    }

    fn key(
        self,
        agency: Option<&str>,
        source_id: Option<&str>,
        epoch: Option<u64>,
        sequence: Option<u64>,
    ) -> Result<Option<[u8; 32]>, postcard::Error> {
        match (self, agency, source_id, epoch, sequence) {
            (StoredKey::None, ..) => Ok(None),
            (StoredKey::Bytes(k), ..) => Ok(Some(k)),
            (StoredKey::Derived, Some(a), Some(s), Some(e), Some(q)) => {
                Ok(Some(key_v1(a, s, e, q)))
            }
            // Never written: "derived" is stored only beside all four fields.
            (StoredKey::Derived, ..) => Err(postcard::Error::SerdeDeCustom),
        }
    }
}

/// The last key known to be key v1 of its fields, with those fields (compared in full).
#[derive(Default)]
struct Last {
    key: [u8; 32],
    agency: String,
    source_id: String,
    epoch: u64,
    sequence: u64,
}

thread_local!(static LAST: std::cell::RefCell<Option<Last>> = const { std::cell::RefCell::new(None) });

fn remember(
    last: &mut Option<Last>,
    key: &[u8; 32],
    agency: &str,
    source_id: &str,
    epoch: u64,
    sequence: u64,
) {
    let l = last.get_or_insert_with(Last::default);
    l.key = *key;
    l.agency.clear();
    l.agency.push_str(agency);
    l.source_id.clear();
    l.source_id.push_str(source_id);
    (l.epoch, l.sequence) = (epoch, sequence);
}

/// Whether `key` is key v1 of the four fields. The engine writes a message's effect and then
/// its audit entry, both with its key: the last key known to be derived is remembered with its
/// fields (compared in full), so the pair costs at most one SHA-256, and none after
/// `note_derived`.
fn is_key_v1(key: &[u8; 32], agency: &str, source_id: &str, epoch: u64, sequence: u64) -> bool {
    LAST.with_borrow_mut(|last| {
        if let Some(l) = last
            && (
                &l.key,
                l.agency.as_str(),
                l.source_id.as_str(),
                l.epoch,
                l.sequence,
            ) == (key, agency, source_id, epoch, sequence)
        {
            return true;
        }
        if key_v1(agency, source_id, epoch, sequence) != *key {
            return false;
        }
        remember(last, key, agency, source_id, epoch, sequence);
        true
    })
}

/// Tells this thread's next record encodings that `msg`'s key is key v1 of its fields, which
/// `Message` guarantees (its key is derived when it is made): the engine calls it before it
/// writes a decoded message's records, so they store the key as "derived" without hashing
/// it again.
pub(crate) fn note_derived(msg: &Message) {
    LAST.with_borrow_mut(|last| {
        remember(
            last,
            msg.key().as_bytes(),
            msg.source.agency(),
            msg.source.source_id(),
            msg.position.epoch,
            msg.position.sequence,
        );
    });
}

/// The arguments a template's sentence takes.
#[derive(Clone, Copy)]
enum Args {
    None,
    /// One number, in decimal.
    Number,
    /// A position: `epoch E sequence S` (`Position`'s display).
    Position,
}

/// The reasons stored by number: (text before the arguments, arguments, text after). Part of
/// the file format: entries are only ever appended, never changed or reordered.
const TEMPLATES: &[(&str, Args, &str)] = &[
    ("first message from this source", Args::None, ""),
    ("new position above high-water mark (", Args::Position, ")"),
    ("same key and content as effect #", Args::Number, ""),
    (
        "below high-water mark (",
        Args::Position,
        ") but key never seen: late, provably not yet applied",
    ),
];

/// How a stored audit entry holds its reason.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
enum StoredReason<S> {
    Text(S),
    /// `TEMPLATES[n]` with its numbers (unused ones 0).
    Template(u8, u64, u64),
}

/// A decimal number written the way `u64`'s `Display` writes it (no sign, no leading zero).
fn number(text: &str) -> Option<u64> {
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text.len() == 1 || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

impl<'a> StoredReason<&'a str> {
    fn of(text: &'a str) -> StoredReason<&'a str> {
        for (n, &(before, args, after)) in TEMPLATES.iter().enumerate() {
            let Some(middle) = text
                .strip_prefix(before)
                .and_then(|rest| rest.strip_suffix(after))
            else {
                continue;
            };
            let numbers = match args {
                Args::None => middle.is_empty().then_some((0, 0)),
                Args::Number => number(middle).map(|a| (a, 0)),
                Args::Position => middle
                    .strip_prefix("epoch ")
                    .and_then(|m| m.split_once(" sequence "))
                    .and_then(|(e, s)| Some((number(e)?, number(s)?))),
            };
            if let Some((a, b)) = numbers {
                return StoredReason::Template(n as u8, a, b);
            }
        }
        StoredReason::Text(text)
    }
}

impl StoredReason<String> {
    fn text(self) -> Result<String, postcard::Error> {
        match self {
            StoredReason::Text(t) => Ok(t),
            StoredReason::Template(n, a, b) => {
                let &(before, args, after) = TEMPLATES
                    .get(usize::from(n))
                    .ok_or(postcard::Error::SerdeDeCustom)?;
                Ok(match args {
                    Args::None => format!("{before}{after}"),
                    Args::Number => format!("{before}{a}{after}"),
                    Args::Position => format!("{before}epoch {a} sequence {b}{after}"),
                })
            }
        }
    }
}

/// `AuditRecord` as stored at record versions 2 and 3 (`S`: `&str` when encoding, `String`
/// when decoding; `H`: the hash, `[u8; 32]` at record version 2, `StoredHash` at 3). The
/// first two fields are `AuditHead`'s. Version 4 is laid out by `encode_audit`.
#[derive(Serialize, Deserialize)]
struct Audit<S, H> {
    recorded_at_ms: u64,
    outcome: u8,
    key: StoredKey,
    agency: Option<S>,
    source_id: Option<S>,
    epoch: Option<u64>,
    sequence: Option<u64>,
    topic: S,
    reason: StoredReason<S>,
    digest: Option<[u8; 32]>,
    effect_offset: Option<u64>,
    quarantine_id: Option<u64>,
    prev_hash: [u8; 32],
    hash: H,
}

/// How an audit entry of record version 3 holds its hash.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
enum StoredHash {
    /// `audit::entry_hash` of the entry's index (its key), content and `prev_hash`: the
    /// writer chained it so (`note_chained`), and a reader recomputes it.
    Chained,
    Bytes([u8; 32]),
}

/// Every entry at an index that is a multiple of this keeps its `prev_hash` bytes, so a
/// reader recomputes an entry's predecessor hash from at most this many entries, and
/// `verify` names an edited entry within this many. Part of the file format: readers follow
/// the tags but give up past `tables::CHAIN_WALK_LIMIT` (four times this), and `verify`
/// requires the bytes at these indices.
pub const AUDIT_CHECKPOINT: u64 = 32;

/// What the writer noted about the next entry it stores: its hash, and whether its
/// `prev_hash` may be left to the entry stored at the index before.
#[derive(Clone, Copy)]
struct Chained {
    hash: [u8; 32],
    prev_left_out: bool,
}

thread_local!(static CHAINED: std::cell::Cell<Option<Chained>> = const { std::cell::Cell::new(None) });

/// Tells this thread's next audit encodings that an entry whose hash is `hash` was chained by
/// `audit::entry_hash` of the index it is stored at, its content and its `prev_hash`: the
/// engine calls it right after it computes an entry's hash, before it stores the entry, so
/// the entry stores "chained" instead of the 32 bytes. `after_stored`: its `prev_hash` is
/// the hash of the entry the table holds at the index before `index` (one not pruned), so
/// the entry leaves that out too (`StoredPrev::Previous`), unless `index` is a multiple of
/// `AUDIT_CHECKPOINT`. Any other entry (a copy, a record decoded and written again) keeps
/// its hashes' bytes, so what was stored is what is read.
pub(crate) fn note_chained(index: u64, hash: &[u8; 32], after_stored: bool) {
    CHAINED.set(Some(Chained {
        hash: *hash,
        prev_left_out: after_stored && !index.is_multiple_of(AUDIT_CHECKPOINT),
    }));
}

/// Tells this thread's next audit encoding to keep the `prev_hash` bytes whatever the writer
/// noted: for a store whose readers take each entry alone (PostgreSQL).
pub(crate) fn keep_prev_hash() {
    if let Some(c) = CHAINED.get() {
        CHAINED.set(Some(Chained {
            prev_left_out: false,
            ..c
        }));
    }
}

/// The bits of an audit entry of record version 4 that say which fields it holds and in
/// which form (`encode_audit`): one varint (two bytes for an applied entry) instead of a
/// tag byte per optional field.
mod bits {
    /// The key is key v1 of the entry's fields (`StoredKey::Derived`).
    pub const KEY_DERIVED: u16 = 1 << 0;
    /// The key's 32 bytes follow (`StoredKey::Bytes`); neither key bit: no key.
    pub const KEY_BYTES: u16 = 1 << 1;
    pub const AGENCY: u16 = 1 << 2;
    pub const SOURCE_ID: u16 = 1 << 3;
    pub const EPOCH: u16 = 1 << 4;
    pub const SEQUENCE: u16 = 1 << 5;
    /// The reason is a template's number and its two numbers (`StoredReason::Template`),
    /// else its text.
    pub const REASON_TEMPLATE: u16 = 1 << 6;
    pub const DIGEST: u16 = 1 << 7;
    pub const EFFECT_OFFSET: u16 = 1 << 8;
    pub const QUARANTINE_ID: u16 = 1 << 9;
    /// `prev_hash`'s bytes follow; else it is the hash of the entry stored before.
    pub const PREV_HASH: u16 = 1 << 10;
    /// The hash's bytes follow; else it is recomputed at the entry's index (chained).
    pub const HASH: u16 = 1 << 11;
    pub const ALL: u16 = (1 << 12) - 1;
}

/// Encodes an audit entry at record version 4: `AuditHead`'s two fields (postcard), the
/// `bits` (a postcard varint), then, each in postcard's form, the fields the bits name, in
/// `AuditRecord`'s order (the topic always).
pub(super) fn encode_audit(r: &AuditRecord, out: Vec<u8>) -> postcard::Result<Vec<u8>> {
    let noted = CHAINED.take().filter(|c| c.hash == r.hash);
    let key = StoredKey::of(
        r.key.as_ref(),
        r.agency.as_deref(),
        r.source_id.as_deref(),
        r.epoch,
        r.sequence,
    );
    let reason = StoredReason::of(&r.reason);
    let mut flags = match key {
        StoredKey::None => 0,
        StoredKey::Derived => bits::KEY_DERIVED,
        StoredKey::Bytes(_) => bits::KEY_BYTES,
    };
    for (present, bit) in [
        (r.agency.is_some(), bits::AGENCY),
        (r.source_id.is_some(), bits::SOURCE_ID),
        (r.epoch.is_some(), bits::EPOCH),
        (r.sequence.is_some(), bits::SEQUENCE),
        (
            matches!(reason, StoredReason::Template(..)),
            bits::REASON_TEMPLATE,
        ),
        (r.digest.is_some(), bits::DIGEST),
        (r.effect_offset.is_some(), bits::EFFECT_OFFSET),
        (r.quarantine_id.is_some(), bits::QUARANTINE_ID),
        (!noted.is_some_and(|c| c.prev_left_out), bits::PREV_HASH),
        (noted.is_none(), bits::HASH),
    ] {
        if present {
            flags |= bit;
        }
    }
    let key_bytes = match &key {
        StoredKey::Bytes(k) => Some(k),
        _ => None,
    };
    let out = Put(postcard::to_extend(
        &(r.recorded_at_ms, r.outcome, flags),
        out,
    )?)
    .field_if(key_bytes)?
    .field_if(r.agency.as_deref())?
    .field_if(r.source_id.as_deref())?
    .field_if(r.epoch.as_ref())?
    .field_if(r.sequence.as_ref())?
    .field(r.topic.as_str())?;
    let out = match reason {
        StoredReason::Template(n, a, b) => out.field(&(n, a, b))?,
        StoredReason::Text(t) => out.field(t)?,
    };
    let out = out
        .field_if(r.digest.as_ref())?
        .field_if(r.effect_offset.as_ref())?
        .field_if(r.quarantine_id.as_ref())?
        .field_if((flags & bits::PREV_HASH != 0).then_some(&r.prev_hash))?
        .field_if((flags & bits::HASH != 0).then_some(&r.hash))?;
    Ok(out.0)
}

/// The fields of a body being written, in order, each in postcard's form.
struct Put(Vec<u8>);

impl Put {
    fn field<T: Serialize + ?Sized>(self, v: &T) -> postcard::Result<Put> {
        postcard::to_extend(v, self.0).map(Put)
    }

    /// `v`'s field if there is one (the bits say whether).
    fn field_if<T: Serialize + ?Sized>(self, v: Option<&T>) -> postcard::Result<Put> {
        match v {
            Some(v) => self.field(v),
            None => Ok(self),
        }
    }
}

/// The fields of a stored body, read in order.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<T: serde::de::DeserializeOwned>(&mut self) -> postcard::Result<T> {
        let (v, rest) = postcard::take_from_bytes(self.0)?;
        self.0 = rest;
        Ok(v)
    }

    /// The next field if `flags` has `bit`.
    fn take_if<T: serde::de::DeserializeOwned>(
        &mut self,
        flags: u16,
        bit: u16,
    ) -> postcard::Result<Option<T>> {
        (flags & bit != 0).then(|| self.take()).transpose()
    }
}

/// Decodes a version 4 audit body stored at `index`, whose predecessor (the entry at
/// `index - 1`) has the hash `prev`, if the caller knows it: `Ok(None)` when the entry
/// leaves its `prev_hash` to that entry and `prev` is `None` (the caller reads the
/// predecessor and asks again). A "chained" hash is recomputed from `index`; without an
/// index, such an entry does not decode. Bits no build writes, and bytes after the last
/// field, are errors.
pub(super) fn decode_audit(
    body: &[u8],
    index: Option<u64>,
    prev: Option<&[u8; 32]>,
) -> postcard::Result<Option<AuditRecord>> {
    let mut f = Fields(body);
    let (recorded_at_ms, outcome, flags): (u64, u8, u16) = f.take()?;
    let key_bits = flags & (bits::KEY_DERIVED | bits::KEY_BYTES);
    if flags & !bits::ALL != 0 || key_bits == bits::KEY_DERIVED | bits::KEY_BYTES {
        return Err(postcard::Error::SerdeDeCustom);
    }
    let key = match key_bits {
        bits::KEY_DERIVED => StoredKey::Derived,
        bits::KEY_BYTES => StoredKey::Bytes(f.take()?),
        _ => StoredKey::None,
    };
    let agency: Option<String> = f.take_if(flags, bits::AGENCY)?;
    let source_id: Option<String> = f.take_if(flags, bits::SOURCE_ID)?;
    let epoch = f.take_if(flags, bits::EPOCH)?;
    let sequence = f.take_if(flags, bits::SEQUENCE)?;
    let topic = f.take()?;
    let reason = if flags & bits::REASON_TEMPLATE != 0 {
        let (n, a, b) = f.take()?;
        StoredReason::Template(n, a, b)
    } else {
        StoredReason::Text(f.take()?)
    };
    let digest = f.take_if(flags, bits::DIGEST)?;
    let effect_offset = f.take_if(flags, bits::EFFECT_OFFSET)?;
    let quarantine_id = f.take_if(flags, bits::QUARANTINE_ID)?;
    let stored_prev: Option<[u8; 32]> = f.take_if(flags, bits::PREV_HASH)?;
    let stored_hash: Option<[u8; 32]> = f.take_if(flags, bits::HASH)?;
    if !f.0.is_empty() {
        return Err(postcard::Error::SerdeDeCustom);
    }
    let Some(prev_hash) = stored_prev.or(prev.copied()) else {
        return Ok(None);
    };
    let mut r = AuditRecord {
        key: key.key(agency.as_deref(), source_id.as_deref(), epoch, sequence)?,
        recorded_at_ms,
        outcome,
        agency,
        source_id,
        epoch,
        sequence,
        topic,
        reason: reason.text()?,
        digest,
        effect_offset,
        quarantine_id,
        prev_hash,
        hash: [0; 32],
    };
    let stored = match stored_hash {
        Some(h) => StoredHash::Bytes(h),
        None => StoredHash::Chained,
    };
    chained_hash(&mut r, stored, index)?;
    Ok(Some(r))
}

/// Decodes a version 3 audit body stored at `index` (a "chained" hash is recomputed from it;
/// without an index, such an entry does not decode).
pub(super) fn decode_audit_v3(body: &[u8], index: Option<u64>) -> postcard::Result<AuditRecord> {
    let (mut r, stored) = audit_of(postcard::from_bytes::<Audit<String, StoredHash>>(body)?)?;
    chained_hash(&mut r, stored, index)?;
    Ok(r)
}

/// Sets `r.hash` from its stored form.
fn chained_hash(
    r: &mut AuditRecord,
    stored: StoredHash,
    index: Option<u64>,
) -> postcard::Result<()> {
    r.hash = match (stored, index) {
        (StoredHash::Bytes(h), _) => h,
        (StoredHash::Chained, Some(i)) => crate::store::audit::entry_hash(i, r, &r.prev_hash),
        (StoredHash::Chained, None) => return Err(postcard::Error::SerdeDeCustom),
    };
    Ok(())
}

/// Decodes a version 2 audit body (its hash stored).
pub(super) fn decode_audit_v2(body: &[u8]) -> postcard::Result<AuditRecord> {
    let (mut r, hash) = audit_of(postcard::from_bytes::<Audit<String, [u8; 32]>>(body)?)?;
    r.hash = hash;
    Ok(r)
}

/// The record of a stored audit entry, its hash still zero, and the hash as stored.
fn audit_of<H>(s: Audit<String, H>) -> postcard::Result<(AuditRecord, H)> {
    let record = AuditRecord {
        key: s.key.key(
            s.agency.as_deref(),
            s.source_id.as_deref(),
            s.epoch,
            s.sequence,
        )?,
        recorded_at_ms: s.recorded_at_ms,
        outcome: s.outcome,
        agency: s.agency,
        source_id: s.source_id,
        epoch: s.epoch,
        sequence: s.sequence,
        topic: s.topic,
        reason: s.reason.text()?,
        digest: s.digest,
        effect_offset: s.effect_offset,
        quarantine_id: s.quarantine_id,
        prev_hash: s.prev_hash,
        hash: [0; 32],
    };
    Ok((record, s.hash))
}

/// `EffectRecord` as stored at record version 2: the `EffectHead` fields, then the rest.
/// (postcard writes a nested struct's fields in place, with no framing, so the two parts are
/// the record's fields in order.)
#[derive(Serialize, Deserialize)]
struct Effect<S, B> {
    head: EffectHead,
    rest: EffectRest<S, B>,
}

/// `EffectRecord` as stored at record version 3: version 2 with the content digest right
/// after the `EffectHead` fields, so `effect_digest` reads it without the rest.
#[derive(Serialize, Deserialize)]
struct EffectV3<S, B> {
    head: EffectHead,
    digest: Option<[u8; 32]>,
    rest: EffectRest<S, B>,
}

/// `EffectRecord` as stored at record version 4: version 3 with the digest left out when it
/// is its payload's (`StoredDigest::Payload`).
#[derive(Serialize, Deserialize)]
struct EffectV4<S, B> {
    head: EffectHead,
    digest: StoredDigest,
    rest: EffectRest<S, B>,
}

/// How an effect of record version 4 holds its content digest.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
enum StoredDigest {
    /// None (an effect written before the window left its digest to the effect).
    None,
    /// `wire::whole_digest` of the effect's payload: the writer decoded the payload under a
    /// contract that ignores no member (`note_whole_digest`), and a reader recomputes it.
    Payload,
    Bytes([u8; 32]),
}

thread_local!(static WHOLE: std::cell::Cell<Option<[u8; 32]>> = const { std::cell::Cell::new(None) });

/// Tells this thread's next effect encoding that `digest` is `wire::whole_digest` of the
/// payload of the effect it encodes: the engine calls it right before it writes a decoded
/// message's effect, when the message's contract ignores no member (`Incoming::whole_digest`),
/// and clears it (`forget_whole_digest`) right after; `quarantine release` does the same for
/// the message it re-decodes from the quarantined bytes. Any other effect (a copy, a digest
/// under `digest_ignore`) keeps its digest's bytes.
pub(crate) fn note_whole_digest(digest: &[u8; 32]) {
    WHOLE.set(Some(*digest));
}

/// Undoes an unused `note_whole_digest` (a backend that encodes its effects later).
pub(crate) fn forget_whole_digest() {
    WHOLE.set(None);
}

thread_local!(static RESEND: std::cell::RefCell<(Vec<u8>, Option<[u8; 32]>)> =
    const { std::cell::RefCell::new((Vec::new(), None)) });

/// Tells this thread's next reads of an effect's digest that `payload` (decoded under a
/// contract that ignores no member) has the digest `digest`: an effect whose payload is these
/// very bytes, and whose digest is its payload's, has that digest without parsing the
/// payload again. The engine calls it before it looks a delivery's position up in the window
/// (a broker's redelivery is the same bytes), and `forget_resend` after.
pub(crate) fn expect_resend(payload: &[u8], digest: &[u8; 32]) {
    RESEND.with_borrow_mut(|(bytes, d)| {
        bytes.clear();
        bytes.extend_from_slice(payload);
        *d = Some(*digest);
    });
}

/// Undoes `expect_resend`.
pub(crate) fn forget_resend() {
    RESEND.with_borrow_mut(|(_, d)| *d = None);
}

/// The digest of `payload`, which gives a version-4 effect's digest: `expect_resend`'s when
/// the bytes are the ones it named, else recomputed (`None` if they no longer parse).
fn payload_digest(payload: &[u8]) -> Option<[u8; 32]> {
    let known = RESEND.with_borrow(|(bytes, d)| d.filter(|_| bytes.as_slice() == payload));
    known.or_else(|| {
        crate::wire::whole_digest(payload)
            .ok()
            .map(|d| *d.as_bytes())
    })
}

/// The fields of a stored effect after its head (and digest).
#[derive(Serialize, Deserialize)]
struct EffectRest<S, B> {
    key: StoredKey,
    agency: S,
    source_id: S,
    topic: S,
    late: bool,
    released: bool,
    audit_index: u64,
    payload: B,
}

pub(super) fn encode_effect(r: &EffectRecord, out: Vec<u8>) -> postcard::Result<Vec<u8>> {
    let digest = match r.digest {
        None => StoredDigest::None,
        Some(d) if WHOLE.take() == Some(d) => StoredDigest::Payload,
        Some(d) => StoredDigest::Bytes(d),
    };
    let stored = EffectV4::<&str, bytes::Bytes> {
        head: EffectHead {
            source_no: r.source_no,
            epoch: r.epoch,
            sequence: r.sequence,
            received_at_ms: r.received_at_ms,
        },
        digest,
        rest: EffectRest {
            key: StoredKey::of(
                Some(&r.key),
                Some(&r.agency),
                Some(&r.source_id),
                Some(r.epoch),
                Some(r.sequence),
            ),
            agency: &r.agency,
            source_id: &r.source_id,
            topic: &r.topic,
            late: r.late,
            released: r.released,
            audit_index: r.audit_index,
            payload: bytes::Bytes(&r.payload),
        },
    };
    postcard::to_extend(&stored, out)
}

/// Decodes a version 4 effect body. A digest stored as its payload's is recomputed; a
/// payload that no longer parses (damage) reads with no digest, never a guessed one: the
/// record still reads (`dump-effects` and `verify` name its payload), and a window lookup
/// that needs its digest takes the one its applying audit entry recorded
/// (`tables::effect_digest_or_audited`), or is an error naming the entry and the effect
/// (`WindowEntry::resolve`).
pub(super) fn decode_effect(body: &[u8]) -> postcard::Result<EffectRecord> {
    let s: EffectV4<String, bytes::ByteBuf> = postcard::from_bytes(body)?;
    let digest = match s.digest {
        StoredDigest::None => None,
        StoredDigest::Bytes(d) => Some(d),
        StoredDigest::Payload => payload_digest(&s.rest.payload.0),
    };
    effect_of(s.head, digest, s.rest)
}

/// Decodes a version 3 effect body (its digest, if any, stored).
pub(super) fn decode_effect_v3(body: &[u8]) -> postcard::Result<EffectRecord> {
    let s: EffectV3<String, bytes::ByteBuf> = postcard::from_bytes(body)?;
    effect_of(s.head, s.digest, s.rest)
}

/// Decodes a version 2 effect body (no digest).
pub(super) fn decode_effect_v2(body: &[u8]) -> postcard::Result<EffectRecord> {
    let s: Effect<String, bytes::ByteBuf> = postcard::from_bytes(body)?;
    effect_of(s.head, None, s.rest)
}

fn effect_of(
    h: EffectHead,
    digest: Option<[u8; 32]>,
    r: EffectRest<String, bytes::ByteBuf>,
) -> postcard::Result<EffectRecord> {
    let key = r.key.key(
        Some(&r.agency),
        Some(&r.source_id),
        Some(h.epoch),
        Some(h.sequence),
    )?;
    Ok(EffectRecord {
        // An effect always has a key: "none" is never written for one.
        key: key.ok_or(postcard::Error::SerdeDeCustom)?,
        source_no: h.source_no,
        epoch: h.epoch,
        sequence: h.sequence,
        received_at_ms: h.received_at_ms,
        agency: r.agency,
        source_id: r.source_id,
        topic: r.topic,
        late: r.late,
        released: r.released,
        audit_index: r.audit_index,
        payload: r.payload.0,
        digest,
    })
}

/// The digest of a version 3 effect body (`None` if it holds none), without decoding the rest.
pub(super) fn effect_digest_v3(body: &[u8]) -> postcard::Result<Option<[u8; 32]>> {
    let ((_, digest), _) = postcard::take_from_bytes::<(EffectHead, Option<[u8; 32]>)>(body)?;
    Ok(digest)
}

/// The digest of a version 4 effect body (`None` if it holds none, or its payload no longer
/// parses): read from its leading fields when stored, else recomputed from its payload.
pub(super) fn effect_digest(body: &[u8]) -> postcard::Result<Option<[u8; 32]>> {
    let ((_, digest), _) = postcard::take_from_bytes::<(EffectHead, StoredDigest)>(body)?;
    match digest {
        StoredDigest::None => Ok(None),
        StoredDigest::Bytes(d) => Ok(Some(d)),
        StoredDigest::Payload => {
            let s: EffectV4<&str, &[u8]> = postcard::from_bytes(body)?;
            Ok(payload_digest(s.rest.payload))
        }
    }
}

/// The payload as `tables::bytes` stores it (one length-prefixed blob), borrowed when
/// encoding: the same postcard bytes as version 1's `#[serde(with = "bytes")]` field.
mod bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::store::tables::bytes as blob;

    pub struct Bytes<'a>(pub &'a [u8]);

    impl Serialize for Bytes<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            blob::serialize(self.0, s)
        }
    }

    pub struct ByteBuf(pub Vec<u8>);

    impl<'de> Deserialize<'de> for ByteBuf {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ByteBuf, D::Error> {
            blob::deserialize(d).map(ByteBuf)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::{OutOfOrder, Seen, SourceMarks, decide};
    use crate::model::{Digest, Message, Outcome, Position, Source};
    use crate::store::tables::{
        AUDIT, AuditHead, EFFECTS, EffectHead, RECORD_V1, RECORD_V2, RECORD_V3, RECORD_V4, WINDOW,
        WindowEntry, WindowRecord, effect_digest,
    };

    fn audit(reason: &str) -> AuditRecord {
        AuditRecord {
            recorded_at_ms: 1_796_007_134_123,
            outcome: Outcome::Applied.code(),
            key: Some(key_v1("fd", "e1", 2, 99)),
            agency: Some("fd".into()),
            source_id: Some("e1".into()),
            epoch: Some(2),
            sequence: Some(99),
            topic: "incidents/ca/units".into(),
            reason: reason.into(),
            digest: Some([9; 32]),
            effect_offset: Some(41),
            quarantine_id: None,
            prev_hash: [1; 32],
            hash: [2; 32],
        }
    }

    fn effect() -> EffectRecord {
        EffectRecord {
            source_no: 3,
            epoch: 2,
            sequence: 99,
            received_at_ms: 1_796_007_134_123,
            key: key_v1("fd", "e1", 2, 99),
            agency: "fd".into(),
            source_id: "e1".into(),
            topic: "incidents/ca/units".into(),
            late: false,
            released: false,
            audit_index: 77,
            payload: br#"{"agency":"fd","source_id":"e1","epoch":2,"sequence":99}"#.to_vec(),
            digest: Some([5; 32]),
        }
    }

    /// Encodes at version 3, checks the version byte and the round trip, and returns the size.
    fn audit_round_trip(r: &AuditRecord) -> usize {
        let bytes = AUDIT.encode(r);
        assert_eq!(bytes[0], RECORD_V4);
        assert_eq!(AUDIT.decode(&0, &bytes).unwrap(), *r);
        let head: AuditHead = AUDIT.head(0, &bytes).unwrap();
        assert_eq!(
            (head.recorded_at_ms, head.outcome),
            (r.recorded_at_ms, r.outcome)
        );
        bytes.len()
    }

    fn version_1(r: &impl Serialize) -> Vec<u8> {
        let mut bytes = vec![RECORD_V1];
        bytes.extend(postcard::to_allocvec(r).unwrap());
        bytes
    }

    #[test]
    fn an_audit_entry_decodes_to_the_entry_that_was_encoded_and_is_smaller() {
        let r = audit("new position above high-water mark (epoch 2 sequence 98)");
        let v1 = version_1(&r);
        // The key (32 bytes) and the reason (56 bytes, now a template number and two numbers).
        assert!(audit_round_trip(&r) + 32 + 50 <= v1.len(), "{}", v1.len());
        // A version-1 entry (every file before schema 3) still decodes, head included.
        assert_eq!(AUDIT.decode(&0, &v1).unwrap(), r);
        let head: AuditHead = AUDIT.head(0, &v1).unwrap();
        assert_eq!(head.recorded_at_ms, r.recorded_at_ms);
    }

    /// An entry the writer chained at its index leaves its hash out and reads it back there
    /// (recomputed); at another index it reads with another hash, which is how an edit of
    /// it shows (the next entry's link breaks). Every other entry keeps its hash's bytes,
    /// and entries of versions 2 and 3 (hash always stored; `prev_hash` always stored)
    /// still decode, head included.
    #[test]
    fn an_audit_entry_chained_at_its_index_leaves_its_hash_out_and_others_keep_theirs() {
        let mut r = audit("first message from this source");
        r.hash = crate::store::audit::entry_hash(7, &r, &r.prev_hash);
        let kept = AUDIT.encode(&r);
        note_chained(7, &r.hash, false);
        let chained = AUDIT.encode(&r);
        assert_eq!((chained[0], chained.len() + 32), (RECORD_V4, kept.len()));
        assert_eq!(AUDIT.decode(&7, &chained).unwrap(), r);
        assert_eq!(AUDIT.decode(&7, &kept).unwrap(), r);
        let elsewhere = AUDIT.decode(&8, &chained).unwrap();
        assert_ne!(elsewhere.hash, r.hash);
        assert_eq!(AUDIT.decode(&8, &kept).unwrap().hash, r.hash);
        // No index, no hash: an error, not a guess.
        assert!(decode_audit(&chained[1..], None, None).is_err());
        // The note is for one entry, and only for the hash noted.
        assert_eq!(AUDIT.encode(&r), kept);
        note_chained(7, &[3; 32], true);
        assert_eq!(AUDIT.encode(&r), kept);

        let stored = audit("x");
        fn body<H: Serialize>(stored: &AuditRecord, hash: H) -> Vec<u8> {
            postcard::to_allocvec(&Audit::<&str, _> {
                recorded_at_ms: stored.recorded_at_ms,
                outcome: stored.outcome,
                key: StoredKey::Derived,
                agency: stored.agency.as_deref(),
                source_id: stored.source_id.as_deref(),
                epoch: stored.epoch,
                sequence: stored.sequence,
                topic: &stored.topic,
                reason: StoredReason::Text("x"),
                digest: stored.digest,
                effect_offset: stored.effect_offset,
                quarantine_id: stored.quarantine_id,
                prev_hash: stored.prev_hash,
                hash,
            })
            .unwrap()
        }
        let v2 = [vec![RECORD_V2], body(&stored, stored.hash)].concat();
        assert_eq!(AUDIT.decode(&5, &v2).unwrap(), stored);
        let head: AuditHead = AUDIT.head(5, &v2).unwrap();
        assert_eq!(head.recorded_at_ms, stored.recorded_at_ms);
        // One bits varint (2 bytes) instead of nine tag bytes.
        assert_eq!(AUDIT.encode(&stored).len() + 7, v2.len());
        // Version 3, as the builds of schema 5 and 6 wrote it: the hash left out, the
        // `prev_hash` stored.
        let mut chained3 = stored.clone();
        chained3.hash = crate::store::audit::entry_hash(5, &chained3, &chained3.prev_hash);
        let v3 = [vec![RECORD_V3], body(&stored, StoredHash::Chained)].concat();
        assert_eq!(AUDIT.decode(&5, &v3).unwrap(), chained3);
        let v3 = [
            vec![RECORD_V3],
            body(&stored, StoredHash::Bytes(stored.hash)),
        ];
        assert_eq!(AUDIT.decode(&5, &v3.concat()).unwrap(), stored);
    }

    /// An entry chained after the entry the table holds before it leaves its `prev_hash` to
    /// that entry, except at a checkpoint index: alone it does not decode (an error, not a
    /// guess), and with its predecessor's hash it decodes to the entry that was encoded.
    #[test]
    fn an_audit_entry_after_a_stored_one_leaves_its_prev_hash_to_it_except_at_checkpoints() {
        let at = |index: u64, after_stored: bool| {
            let mut r = audit("first message from this source");
            r.hash = crate::store::audit::entry_hash(index, &r, &r.prev_hash);
            let kept = AUDIT.encode(&r);
            note_chained(index, &r.hash, after_stored);
            let bytes = AUDIT.encode(&r);
            (r, kept, bytes)
        };
        let (r, kept, bytes) = at(7, true);
        assert_eq!(bytes.len() + 64, kept.len(), "both hashes left out");
        assert_eq!(decode_audit(&bytes[1..], Some(7), None).unwrap(), None);
        let e = AUDIT.decode(&7, &bytes).unwrap_err().to_string();
        assert!(
            e.contains("leaves its prev_hash to the entry before it"),
            "{e}"
        );
        let back = decode_audit(&bytes[1..], Some(7), Some(&r.prev_hash));
        assert_eq!(back.unwrap().as_ref(), Some(&r));
        // Given another predecessor hash, it reads with that one, and so with another hash
        // of its own: how an edit of the entry before shows at the next checkpoint.
        let other = decode_audit(&bytes[1..], Some(7), Some(&[8; 32]))
            .unwrap()
            .unwrap();
        assert_eq!(other.prev_hash, [8; 32]);
        assert_ne!(other.hash, r.hash);
        // The head still decodes alone (retention, `stats`).
        let head: AuditHead = AUDIT.head(7, &bytes).unwrap();
        assert_eq!(head.recorded_at_ms, r.recorded_at_ms);
        // At a checkpoint, or after an entry the table no longer holds, it keeps the bytes.
        for (index, after_stored) in [
            (AUDIT_CHECKPOINT, true),
            (2 * AUDIT_CHECKPOINT, true),
            (7, false),
        ] {
            let (r, kept, bytes) = at(index, after_stored);
            assert_eq!(bytes.len() + 32, kept.len(), "{index}");
            assert_eq!(AUDIT.decode(&index, &bytes).unwrap(), r);
        }
    }

    /// The head and the rest of `e` as every stored version since 2 writes them.
    fn parts(e: &EffectRecord) -> (EffectHead, EffectRest<&str, bytes::Bytes<'_>>) {
        let head = EffectHead {
            source_no: e.source_no,
            epoch: e.epoch,
            sequence: e.sequence,
            received_at_ms: e.received_at_ms,
        };
        let rest = EffectRest {
            key: StoredKey::Derived,
            agency: e.agency.as_str(),
            source_id: e.source_id.as_str(),
            topic: e.topic.as_str(),
            late: e.late,
            released: e.released,
            audit_index: e.audit_index,
            payload: bytes::Bytes(&e.payload),
        };
        (head, rest)
    }

    /// The stored form of `e` at record version 3 (its digest, if any, always stored).
    fn effect_v3(e: &EffectRecord) -> Vec<u8> {
        let (head, rest) = parts(e);
        let stored = EffectV3 {
            head,
            digest: e.digest,
            rest,
        };
        let mut v3 = vec![RECORD_V3];
        v3.extend(postcard::to_allocvec(&stored).unwrap());
        v3
    }

    /// Version 3 adds the content digest after the head; a version-2 effect (every file
    /// before it) decodes with none, and its head and digest read as before; a version-3
    /// effect (every file of schema 5) decodes with its digest.
    #[test]
    fn an_effect_holds_its_digest_from_version_3_and_older_ones_still_decode() {
        let e = effect();
        let v4 = EFFECTS.encode(&e);
        assert_eq!(effect_digest(0, &v4).unwrap(), Some([5; 32]));
        let v3 = effect_v3(&e);
        assert_eq!(v3.len(), v4.len());
        assert_eq!(EFFECTS.decode(&0, &v3).unwrap(), e);
        assert_eq!(effect_digest(0, &v3).unwrap(), Some([5; 32]));
        let none = EffectRecord {
            digest: None,
            ..e.clone()
        };
        assert_eq!(effect_digest(0, &EFFECTS.encode(&none)).unwrap(), None);
        assert_eq!(effect_digest(0, &effect_v3(&none)).unwrap(), None);
        assert_eq!(EFFECTS.decode(&0, &effect_v3(&none)).unwrap(), none);
        let (head, rest) = parts(&e);
        let mut v2 = vec![RECORD_V2];
        v2.extend(postcard::to_allocvec(&Effect { head, rest }).unwrap());
        assert_eq!(EFFECTS.decode(&0, &v2).unwrap(), none);
        assert_eq!(effect_digest(0, &v2).unwrap(), None);
        let head: EffectHead = EFFECTS.head(0, &v2).unwrap();
        assert_eq!((head.source_no, head.sequence), (3, 99));
        assert_eq!(v3.len(), v2.len() + 33);
        // A version-1 effect (serde form, no digest field) decodes with none too.
        assert_eq!(EFFECTS.decode(&0, &version_1(&none)).unwrap(), none);
    }

    /// An effect whose digest the engine noted as its payload's (version 4) leaves the
    /// 32 bytes out and reads back with the digest recomputed; an effect the note does not
    /// name keeps them; a payload that no longer parses reads with none, never a guessed one.
    #[test]
    fn an_effect_leaves_out_its_payloads_digest_only_when_noted_and_reads_it_back() {
        let mut e = effect();
        let whole = *crate::wire::whole_digest(&e.payload).unwrap().as_bytes();
        e.digest = Some(whole);
        let kept = EFFECTS.encode(&e);
        note_whole_digest(&whole);
        let derived = EFFECTS.encode(&e);
        assert_eq!((derived[0], derived.len() + 32), (RECORD_V4, kept.len()));
        assert_eq!(EFFECTS.decode(&0, &derived).unwrap(), e);
        assert_eq!(effect_digest(0, &derived).unwrap(), Some(whole));
        // The note is used once, and only for the digest it names.
        assert_eq!(EFFECTS.encode(&e), kept);
        note_whole_digest(&[5; 32]);
        assert_eq!(EFFECTS.encode(&e), kept);
        forget_whole_digest();
        note_whole_digest(&whole);
        forget_whole_digest();
        assert_eq!(EFFECTS.encode(&e), kept);
        // The same content spelled otherwise has the same digest, read back from its bytes.
        let mut respelled = e.clone();
        respelled.payload =
            br#"{ "sequence": 99.0, "epoch": 2, "source_id": "e1", "agency": "fd" }"#.to_vec();
        note_whole_digest(&whole);
        let bytes = EFFECTS.encode(&respelled);
        assert_eq!(EFFECTS.decode(&0, &bytes).unwrap(), respelled);
        // A damaged payload: the record reads with no digest, not a guessed one.
        let mut damaged = derived.clone();
        let at = damaged.len() - 2;
        damaged[at] = b'{';
        let read = EFFECTS.decode(&7, &damaged).unwrap();
        assert_eq!((read.digest, read.sequence), (None, 99));
        assert_eq!(effect_digest(7, &damaged).unwrap(), None);
        // A lookup for a resend of the same bytes takes the resend's digest without parsing
        // the payload (shown here with a digest no parse would give); other bytes are parsed.
        expect_resend(&e.payload, &[7; 32]);
        assert_eq!(effect_digest(0, &derived).unwrap(), Some([7; 32]));
        expect_resend(&respelled.payload, &[7; 32]);
        assert_eq!(effect_digest(0, &derived).unwrap(), Some(whole));
        forget_resend();
        assert_eq!(effect_digest(0, &derived).unwrap(), Some(whole));
        // Head reads (eviction, retention) are unchanged.
        let head: EffectHead = EFFECTS.head(0, &derived).unwrap();
        assert_eq!((head.source_no, head.epoch, head.sequence), (3, 2, 99));
    }

    /// A window entry of version 2 stores its digest only when its effect does not hold it;
    /// one of version 1 (always with the digest) decodes to an entry that holds it.
    #[test]
    fn a_window_entry_leaves_its_digest_to_its_effect_and_older_ones_keep_theirs() {
        let key = (3, 2, 99);
        let bare = WindowEntry {
            effect_offset: 41,
            digest: None,
        };
        let bytes = WINDOW.encode(&bare);
        assert_eq!((bytes[0], bytes.len()), (RECORD_V2, 3));
        assert_eq!(WINDOW.decode(&key, &bytes).unwrap(), bare);
        let v1 = version_1(&WindowRecord {
            digest: [6; 32],
            effect_offset: 41,
        });
        let old = WINDOW.decode(&key, &v1).unwrap();
        assert_eq!(old.digest, Some([6; 32]));
        // Resolved: its own digest without a read, else its effect's.
        let resolved = old.resolve(key, |_| unreachable!("read")).unwrap();
        assert_eq!(resolved.digest, [6; 32]);
        let resolved = bare
            .resolve(key, |offset| Ok((offset == 41).then_some([5; 32])))
            .unwrap();
        assert_eq!((resolved.digest, resolved.effect_offset), ([5; 32], 41));
        // An effect without one (damage): an error naming the window entry, not a guess.
        let err = bare.resolve(key, |_| Ok(None)).unwrap_err().to_string();
        assert!(err.contains("window") && err.contains("effect 41"), "{err}");
    }

    #[test]
    fn a_key_is_left_out_only_when_it_is_key_v1_of_the_fields_beside_it() {
        let derived = audit("x");
        let mut other = derived.clone();
        other.key = Some([7; 32]);
        assert_eq!(audit_round_trip(&other), audit_round_trip(&derived) + 32);
        // A key without all four fields beside it is kept, and so is no key.
        for strip in 0..4 {
            let mut r = derived.clone();
            match strip {
                0 => r.agency = None,
                1 => r.source_id = None,
                2 => r.epoch = None,
                _ => r.sequence = None,
            }
            assert_eq!(
                audit_round_trip(&r),
                audit_round_trip(&other) - [3, 3, 1, 1][strip]
            );
        }
        let mut none = derived.clone();
        none.key = None;
        audit_round_trip(&none);
        // The last derived key is remembered with every field: the same key beside another
        // sequence or agency is kept.
        let size = audit_round_trip(&derived);
        for change in 0..2 {
            let mut r = derived.clone();
            match change {
                0 => r.sequence = Some(100),
                _ => r.agency = Some("fe".into()),
            }
            assert_eq!(audit_round_trip(&r), size + 32);
        }

        let e = effect();
        let bytes = EFFECTS.encode(&e);
        assert_eq!(bytes[0], RECORD_V4);
        assert_eq!(EFFECTS.decode(&0, &bytes).unwrap(), e);
        // The key's 32 bytes become a one-byte tag; the digest (not in version 1) takes 33.
        assert_eq!(bytes.len() + 31, version_1(&e).len() + 33);
        let head: EffectHead = EFFECTS.head(0, &bytes).unwrap();
        assert_eq!((head.source_no, head.epoch, head.sequence), (3, 2, 99));
        assert_eq!(head.received_at_ms, e.received_at_ms);
        let mut kept = e.clone();
        kept.key[0] ^= 1;
        let bytes = EFFECTS.encode(&kept);
        assert_eq!(EFFECTS.decode(&0, &bytes).unwrap(), kept);
        // The tag's byte, and the digest's 33 (not in version 1).
        assert_eq!(bytes.len(), version_1(&kept).len() + 1 + 33);
        let without = EffectRecord { digest: None, ..e };
        assert_eq!(EFFECTS.decode(&0, &version_1(&without)).unwrap(), without);
    }

    #[test]
    fn a_message_noted_as_derived_leaves_its_key_out_and_no_other_key() {
        let r = audit("x");
        let derived = audit_round_trip(&r);
        // What the engine notes: a message's key is key v1 of its fields by construction.
        let msg = Message::new(
            Source::new("fd".into(), "e1".into()),
            Position {
                epoch: 2,
                sequence: 99,
            },
            Digest::from_bytes([9; 32]),
        );
        assert_eq!(Some(*msg.key().as_bytes()), r.key);
        note_derived(&msg);
        assert_eq!(audit_round_trip(&r), derived);
        // The note names the key and every field: another key beside the same fields is kept,
        // and so is the noted key beside another sequence.
        note_derived(&msg);
        let mut other = r.clone();
        other.key = Some([7; 32]);
        assert_eq!(audit_round_trip(&other), derived + 32);
        note_derived(&msg);
        let mut moved = r.clone();
        moved.sequence = Some(100);
        assert_eq!(audit_round_trip(&moved), derived + 32);
    }

    #[test]
    fn the_decision_cores_reasons_are_stored_as_templates_and_read_back_exactly() {
        let source = Source::new("fd".into(), "e1".into());
        let at = |sequence| Position { epoch: 2, sequence };
        let msg = Message::new(source, at(5), Digest::from_bytes([1; 32]));
        let above = SourceMarks {
            high_water: at(4),
            evicted_floor: None,
        };
        let below = SourceMarks {
            high_water: at(12_345_678_901),
            evicted_floor: Some(at(1)),
        };
        let seen = Seen {
            digest: Digest::from_bytes([1; 32]),
            effect_offset: u64::MAX,
        };
        let cases = [
            (None, None, Outcome::Applied),
            (None, Some(&above), Outcome::Applied),
            (Some(&seen), None, Outcome::Duplicate),
            (None, Some(&below), Outcome::AppliedLate),
        ];
        for (seen, marks, want) in cases {
            let d = decide(&msg, seen, marks, OutOfOrder::Apply);
            assert_eq!(d.outcome, want);
            assert!(
                matches!(StoredReason::of(&d.reason), StoredReason::Template(..)),
                "{:?} is not stored by number",
                d.reason
            );
            let r = audit(&d.reason);
            assert!(audit_round_trip(&r) < version_1(&r).len() - 32 - d.reason.len() + 20);
        }
    }

    #[test]
    fn a_reason_that_only_resembles_a_template_is_stored_as_its_text() {
        for text in [
            "",
            "first message from this source ",
            "new position above high-water mark (epoch 01 sequence 2)",
            "new position above high-water mark (epoch 1 sequence 2",
            "new position above high-water mark (epoch 1  sequence 2)",
            "new position above high-water mark (epoch -1 sequence 2)",
            "new position above high-water mark (epoch 1 sequence 18446744073709551616)",
            "same key and content as effect #",
            "same key and content as effect #+4",
            "same key and content as effect #4 ",
            "below high-water mark (epoch 1 sequence 2) but key never seen",
            "quarantine #2 released by j.doe: unit really released",
        ] {
            assert_eq!(StoredReason::of(text), StoredReason::Text(text), "{text:?}");
            audit_round_trip(&audit(text));
        }
        for text in [
            "new position above high-water mark (epoch 0 sequence 18446744073709551615)",
            "same key and content as effect #0",
        ] {
            assert!(matches!(StoredReason::of(text), StoredReason::Template(..)));
            audit_round_trip(&audit(text));
        }
    }

    #[test]
    fn stored_forms_no_build_writes_are_errors_not_guesses() {
        let r = audit("x");
        let bytes = AUDIT.encode(&r);
        assert_eq!(AUDIT.decode(&0, &bytes).unwrap(), r);
        let at = 1 + 6 + 1; // version, recorded_at_ms (6-byte varint), outcome; then the bits
        let forge = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut forged = bytes.clone();
            edit(&mut forged);
            AUDIT.decode(&0, &forged)
        };
        // Both key forms at once; a bit no build writes (bit 12: the second varint byte's
        // sixth); a byte after the last field.
        assert!(forge(&|b| b[at] |= 0b11).is_err());
        assert!(forge(&|b| b[at + 1] |= 1 << 5).is_err());
        assert!(forge(&|b| b.push(0)).is_err());
        // "Derived" without the fields to derive from.
        let mut r = audit("x");
        r.agency = None;
        r.key = None;
        let bytes = AUDIT.encode(&r);
        assert_eq!(bytes[at] & 0b11, 0, "no key");
        let mut forged = bytes.clone();
        forged[at] |= 1; // KEY_DERIVED
        assert!(AUDIT.decode(&0, &forged).is_err());
        // A template number past the end of the list.
        let r = audit("first message from this source");
        let bytes = AUDIT.encode(&r);
        let topic = r.topic.as_bytes();
        let n = bytes
            .windows(topic.len())
            .position(|w| w == topic)
            .expect("the topic")
            + topic.len();
        assert_eq!(bytes[n..n + 3], [0, 0, 0], "Template(0, 0, 0)");
        let mut forged = bytes.clone();
        forged[n] = TEMPLATES.len() as u8;
        assert!(AUDIT.decode(&0, &forged).is_err());
    }
}
