//! Operator writes: `quarantine release` / `quarantine discard`, and the replay-burst notes
//! `run` keeps for `stats`. Each is one durable write transaction of its own, which in redb's
//! `MultiWriter` mode may come from another process while `run` is committing batches: redb
//! serialises the two processes' transactions, and each starts from the latest commit.

use redb::ReadableTable;

use super::tables::*;
use super::{Decided, Store, StoreError, Writer, pair_pos, pos_pair};
use crate::model::{IdempotencyKey, Outcome, hex};
use crate::wire::{self, FeedContract};

/// What an operator decided about one quarantined message, and who and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Genuine: apply it (effect with `released: true`).
    Release { operator: String, reason: String },
    /// Not to be applied: remove it from the quarantine.
    Discard { operator: String, reason: String },
}

impl Resolution {
    fn outcome(&self) -> Outcome {
        match self {
            Resolution::Release { .. } => Outcome::Released,
            Resolution::Discard { .. } => Outcome::Discarded,
        }
    }

    /// The audit entry's reason: who, and why, in the operator's words.
    fn audit_reason(&self, id: u64) -> String {
        match self {
            Resolution::Release { operator, reason } => {
                format!("quarantine #{id} released by {operator}: {reason}")
            }
            Resolution::Discard { operator, reason } => {
                format!("quarantine #{id} discarded by {operator}: {reason}")
            }
        }
    }
}

impl Store {
    /// Releases or discards quarantined message `id`, with its audit entry, in one durable
    /// transaction. `contract` must be the feed contract `run` decodes with (a release
    /// re-derives the message's key from its stored bytes and refuses a mismatch).
    pub fn resolve_quarantined(
        &mut self,
        id: u64,
        resolution: &Resolution,
        contract: &FeedContract,
        now_ms: u64,
    ) -> Result<Decided, StoreError> {
        let txn = self.begin_durable()?;
        let decided = {
            let mut w = Writer::open(&txn, &self.opts)?;
            let d = w.resolve(id, resolution, contract, now_ms)?;
            w.finish()?;
            d
        };
        txn.commit().map_err(StoreError::redb)?;
        Ok(decided)
    }

    /// Records a replay burst (duplicates absorbed after a reconnect) for `stats`.
    pub fn record_burst(&mut self, burst: &BurstRecord) -> Result<(), StoreError> {
        use redb::ReadableTable;
        let txn = self.begin_durable()?;
        {
            let mut t = txn.open_table(REPLAY_BURSTS).map_err(StoreError::redb)?;
            let next = t
                .last()
                .map_err(StoreError::redb)?
                .map_or(0, |(k, _)| k.value() + 1);
            t.insert(next, encode(burst).as_slice())
                .map_err(StoreError::redb)?;
        }
        txn.commit().map_err(StoreError::redb)
    }
}

fn refuse(why: String) -> StoreError {
    StoreError::Refused(why)
}

impl Writer<'_> {
    fn resolve(
        &mut self,
        id: u64,
        resolution: &Resolution,
        contract: &FeedContract,
        now_ms: u64,
    ) -> Result<Decided, StoreError> {
        let rec: QuarantineRecord = match self.quarantine.get(id).map_err(StoreError::redb)? {
            Some(g) => decode("quarantine", id, g.value())?,
            None => {
                return Err(refuse(format!(
                    "quarantine #{id} does not exist: it was never created, or was already \
                     released, discarded or pruned (see `dump-audit --outcome released \
                     --outcome discarded`)"
                )));
            }
        };
        let was = Outcome::from_code(rec.outcome);
        let decoded = wire::decode(&rec.payload, contract);
        let audit_index = self.meta.next_audit;
        let mut effect_offset = None;
        if let Resolution::Release { .. } = resolution {
            if was == Some(Outcome::Malformed) {
                return Err(refuse(format!(
                    "quarantine #{id} is a malformed message: it has no key or position to \
                     apply it under; discard it and have the producer resend it"
                )));
            }
            let msg = decoded.as_ref().map_err(|e| {
                refuse(format!(
                    "quarantine #{id} does not decode under this feed contract ({e}): run the \
                     command with the --config that `run` uses"
                ))
            })?;
            if rec.key != Some(*msg.key.as_bytes()) {
                return Err(refuse(format!(
                    "quarantine #{id} decodes to key {} but was quarantined under key {}: run \
                     the command with the --config that `run` uses",
                    msg.key,
                    rec.key.map_or_else(|| "none".into(), |k| hex(&k))
                )));
            }
            effect_offset = Some(self.apply_released(msg, &rec, audit_index)?);
        }
        let msg = decoded.ok();
        let outcome = resolution.outcome();
        self.forget_quarantined(id)?;
        self.append_audit(AuditRecord {
            recorded_at_ms: now_ms,
            outcome: outcome.code(),
            key: rec.key,
            agency: msg.as_ref().map(|m| m.source.agency().to_string()),
            source_id: msg.as_ref().map(|m| m.source.source_id().to_string()),
            epoch: msg.as_ref().map(|m| m.position.epoch),
            sequence: msg.as_ref().map(|m| m.position.sequence),
            topic: rec.topic.clone(),
            reason: resolution.audit_reason(id),
            digest: msg.as_ref().map(|m| *m.digest.as_bytes()),
            effect_offset,
            quarantine_id: Some(id),
            prev_hash: [0; 32],
            hash: [0; 32],
        })?;
        Ok(Decided {
            outcome,
            audit_index,
            key: rec.key.map(IdempotencyKey::from_bytes),
            effect_offset,
            quarantine_id: Some(id),
        })
    }

    /// Writes the released message's effect and makes it the window's entry for its
    /// position, so a replay of the released bytes is a duplicate of it from now on.
    fn apply_released(
        &mut self,
        msg: &crate::model::Message,
        rec: &QuarantineRecord,
        audit_index: u64,
    ) -> Result<u64, StoreError> {
        let no = match self.source_no(&msg.source)? {
            Some(no) => no,
            None => self.new_source(&msg.source, msg.position)?,
        };
        let wkey = (no, msg.position.epoch, msg.position.sequence);
        if let Some(g) = self.window.get(wkey).map_err(StoreError::redb)? {
            let w: WindowRecord = decode("window", format_args!("{wkey:?}"), g.value())?;
            if w.digest == *msg.digest.as_bytes() {
                return Err(refuse(format!(
                    "key {} with these exact contents is already applied as effect #{}",
                    msg.key, w.effect_offset
                )));
            }
        }
        let state = self.state(no)?;
        let late = msg.position <= pair_pos(state.record.high_water);
        if !late {
            state.record.high_water = pos_pair(msg.position);
            state.dirty = true;
        }
        let offset = self.meta.next_effect;
        self.meta.next_effect += 1;
        let effect = EffectRecord {
            source_no: no,
            epoch: msg.position.epoch,
            sequence: msg.position.sequence,
            received_at_ms: rec.received_at_ms,
            key: *msg.key.as_bytes(),
            agency: msg.source.agency().into(),
            source_id: msg.source.source_id().into(),
            topic: rec.topic.clone(),
            late,
            released: true,
            audit_index,
            payload: rec.payload.clone(),
        };
        self.effects
            .insert(offset, encode_into(&effect, &mut self.buf))
            .map_err(StoreError::redb)?;
        let w = WindowRecord {
            digest: *msg.digest.as_bytes(),
            effect_offset: offset,
        };
        self.window
            .insert(wkey, encode_into(&w, &mut self.buf))
            .map_err(StoreError::redb)?;
        Ok(offset)
    }
}

/// File sizes before and after `compact`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CompactReport {
    pub before_bytes: u64,
    pub after_bytes: u64,
}

/// Rewrites the file to reclaim the pages retention freed. Needs the database to itself: it
/// takes the feed writer's lock (refused while `run` or `ingest` holds it) and opens the file
/// in redb's exclusive mode (refused while any inspector or operator command has it open).
pub fn compact(path: &std::path::Path, cache_bytes: usize) -> Result<CompactReport, StoreError> {
    if !path.exists() {
        return Err(refuse(format!(
            "database {} does not exist",
            path.display()
        )));
    }
    let _lock = super::take_feed_lock(path)?;
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let before_bytes = size(path);
    let mut builder = redb::Builder::new();
    builder
        .set_cache_size(cache_bytes)
        .set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter);
    let mut db = builder.open(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => refuse(format!(
            "{} is open in another process (an inspector such as dump-audit --follow, or a \
             quarantine command): compact needs it to itself; retry when that has finished",
            path.display()
        )),
        error => StoreError::Open {
            path: path.to_path_buf(),
            error,
        },
    })?;
    while db.compact().map_err(StoreError::redb)? {}
    drop(db);
    Ok(CompactReport {
        before_bytes,
        after_bytes: size(path),
    })
}
