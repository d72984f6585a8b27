//! Operator writes: `quarantine release` / `quarantine discard`, and the replay-burst notes
//! `run` keeps for `stats`. Each is one durable write transaction of its own, which in redb's
//! `MultiWriter` mode may come from another process while `run` is committing batches: redb
//! serialises the two processes' transactions, and each starts from the latest commit.

use std::collections::HashMap;
use std::ops::ControlFlow;

use super::engine::{EffectOrigin, Writer, pair_pos, pos_pair};
use super::guard::Leak;
use super::redb_tx::RedbTx;
use super::tables::*;
use super::tx::Tx;
use super::{Decided, Store, StoreError};
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
        self.guarded(|s| s.try_resolve_quarantined(id, resolution, contract, now_ms))
    }

    fn try_resolve_quarantined(
        &mut self,
        id: u64,
        resolution: &Resolution,
        contract: &FeedContract,
        now_ms: u64,
    ) -> Result<Decided, StoreError> {
        // A limit lowered since the message was quarantined neither changes its digest nor
        // makes it damaged.
        let contract = &contract.for_stored();
        // The long look for earlier applications runs on a read snapshot, so `run`'s commits
        // are not held up; the write transaction then checks only what was committed since.
        let prior = match resolution {
            Resolution::Release { .. } => Some(prior_applications(&self.reader()?, id, contract)?),
            Resolution::Discard { .. } => None,
        };
        let txn = Leak::new(self.begin_durable()?);
        let decided = {
            let mut w = Leak::new(Writer::open(
                RedbTx::open(&txn)?
                    .merging_at(self.opts.window_merge_at)
                    .direct_sources(self.opts.window_direct_sources)
                    .segments_of(self.opts.index_segment_blocks),
                &self.opts,
            )?);
            let d = w.resolve(id, resolution, contract, prior, now_ms)?;
            drop(w.into_inner().finish()?);
            d
        };
        txn.into_inner().commit()?;
        Ok(decided)
    }

    /// Records a replay burst (duplicates absorbed after a reconnect) for `stats`.
    pub fn record_burst(&mut self, burst: &BurstRecord) -> Result<(), StoreError> {
        self.guarded(|s| s.try_record_burst(burst))
    }

    /// `Backend::note_connect` on this file.
    pub fn note_connect(
        &mut self,
        broker: &str,
        client_id: &str,
        session_present: bool,
        now_ms: u64,
    ) -> Result<Option<SessionLoss>, StoreError> {
        self.guarded(|s| {
            let txn = Leak::new(s.begin_durable()?);
            let loss = {
                let mut tx = Leak::new(RedbTx::open(&txn)?);
                super::upstream::note_connect(&mut *tx, broker, client_id, session_present, now_ms)?
            };
            txn.into_inner().commit()?;
            Ok(loss)
        })
    }

    /// `Backend::confirm_gaps` on this file.
    pub fn confirm_gaps(
        &mut self,
        candidates: &[super::upstream::ReportedGap],
        now_ms: u64,
    ) -> Result<super::upstream::GapCheck, StoreError> {
        self.guarded(|s| {
            let txn = Leak::new(s.begin_durable()?);
            let check = {
                let mut tx = Leak::new(RedbTx::open(&txn)?);
                super::upstream::confirm_gaps(&mut *tx, candidates, now_ms)?
            };
            if check.missing.is_empty() {
                txn.into_inner().abort()?;
            } else {
                txn.into_inner().commit()?;
            }
            Ok(check)
        })
    }

    fn try_record_burst(&mut self, burst: &BurstRecord) -> Result<(), StoreError> {
        use redb::ReadableTable;
        let txn = Leak::new(self.begin_durable()?);
        {
            let mut t = Leak::new(REPLAY_BURSTS.open_mut(&txn)?);
            let next = t.last()?.map_or(0, |(k, _)| k.value() + 1);
            t.put(next, burst, &mut Vec::new())?;
        }
        txn.into_inner().commit().map_err(StoreError::redb)
    }
}

/// What to do about stored bytes that no longer match their audit entry, when the feed
/// contract cannot be ruled out: from the record alone the two causes look the same.
const DAMAGED_OR_CONFIG: &str = "either the record was damaged or edited (`verify` with the same \
     --config names every such record; discard it and have the producer resend), or this \
     --config's [feed] contract differs from the one `run` uses (pass that --config)";

/// What to do about stored bytes that no contract could have accepted.
const DAMAGED: &str = "check the database with `verify`, discard the record and have the \
     producer resend";

fn refuse(why: String) -> StoreError {
    StoreError::Refused(why)
}

/// What has been applied under one key: digest -> effect offset, from every applying audit
/// entry below `scanned_to` (and, where the audit log was pruned, from the effect records).
struct PriorApplications {
    key: Option<[u8; 32]>,
    digests: HashMap<[u8; 32], u64>,
    scanned_to: u64,
}

impl PriorApplications {
    fn note(&mut self, e: &AuditRecord) {
        let applies = Outcome::from_code(e.outcome).is_some_and(Outcome::applies);
        if applies
            && e.key == self.key
            && let (Some(d), Some(off)) = (e.digest, e.effect_offset)
        {
            self.digests.entry(d).or_insert(off);
        }
    }
}

/// Every content already applied under quarantined message `id`'s key, read from a
/// snapshot (one pass over the audit log, plus the effects whose audit entries were pruned).
fn prior_applications(
    snap: &super::Snapshot,
    id: u64,
    contract: &FeedContract,
) -> Result<PriorApplications, StoreError> {
    {
        let meta = snap.meta()?;
        let key = snap.quarantined(id)?.and_then(|q| q.record.key);
        let mut prior = PriorApplications {
            key,
            digests: HashMap::new(),
            scanned_to: meta.next_audit,
        };
        if key.is_none() {
            return Ok(prior);
        }
        let audit_from = meta.audit_anchor.map_or(0, |(i, _)| i + 1);
        snap.scan_audit::<StoreError>(audit_from, |e| {
            prior.note(&e.record);
            Ok(ControlFlow::Continue(()))
        })?;
        if audit_from > 0 {
            let floor = snap.retention_marks()?.effects_floor;
            snap.scan_effects::<StoreError>(floor, |e| {
                if e.record.audit_index >= audit_from {
                    return Ok(ControlFlow::Break(()));
                }
                if Some(e.record.key) == key
                    && let Ok(m) = wire::decode(&e.record.payload, contract)
                {
                    prior
                        .digests
                        .entry(*m.digest.as_bytes())
                        .or_insert(e.offset);
                }
                Ok(ControlFlow::Continue(()))
            })?;
        }
        Ok(prior)
    }
}

impl super::postgres::PgStore {
    /// `Store::resolve_quarantined` on PostgreSQL: the same checks and writes, in one
    /// transaction under the schema's lock.
    pub fn resolve_quarantined(
        &mut self,
        id: u64,
        resolution: &Resolution,
        contract: &FeedContract,
        now_ms: u64,
    ) -> Result<Decided, StoreError> {
        let contract = &contract.for_stored();
        let prior = match resolution {
            Resolution::Release { .. } => Some(prior_applications(
                &super::Snapshot::postgres(self.view()?),
                id,
                contract,
            )?),
            Resolution::Discard { .. } => None,
        };
        self.write(|tx, opts| {
            let mut w = Writer::open(tx, opts)?;
            let d = w.resolve(id, resolution, contract, prior, now_ms)?;
            Ok((w.finish()?, d))
        })
    }
}

impl<T: Tx> Writer<T> {
    fn resolve(
        &mut self,
        id: u64,
        resolution: &Resolution,
        contract: &FeedContract,
        prior: Option<PriorApplications>,
        now_ms: u64,
    ) -> Result<Decided, StoreError> {
        let rec: QuarantineRecord = match self.tx.quarantined(id)? {
            Some(rec) => rec,
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
            // `run` decoded these bytes when it quarantined them: a failure now is either
            // another feed contract or bytes that changed since (damaged or edited).
            let msg = decoded.as_ref().map_err(|e| {
                refuse(if e.depends_on_contract() {
                    format!(
                        "quarantine #{id}: its stored payload does not decode under this feed \
                         contract ({e}): {DAMAGED_OR_CONFIG}"
                    )
                } else {
                    format!(
                        "quarantine #{id}: its stored payload is damaged or was edited ({e}), \
                         so it is not what `run` quarantined: {DAMAGED}"
                    )
                })
            })?;
            if rec.key != Some(*msg.key().as_bytes()) {
                return Err(refuse(format!(
                    "quarantine #{id}: its stored payload decodes to key {} but was quarantined \
                     under key {}: {DAMAGED_OR_CONFIG}",
                    msg.key(),
                    rec.key.map_or_else(|| "none".into(), |k| hex(&k))
                )));
            }
            self.check_release(id, msg, &rec, prior)?;
            effect_offset = Some(self.apply_released(
                msg,
                &rec,
                audit_index,
                now_ms,
                contract.digest_ignore.is_empty(),
            )?);
        }
        let msg = decoded.ok();
        let outcome = resolution.outcome();
        self.forget_quarantined(id)?;
        let source_no = match &msg {
            Some(m) => self.source_no(&m.source)?,
            None => None,
        };
        self.append_audit(
            AuditRecord {
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
            },
            source_no,
        )?;
        Ok(Decided {
            outcome,
            audit_index,
            key: rec.key.map(IdempotencyKey::from_bytes),
            effect_offset,
            quarantine_id: Some(id),
        })
    }

    /// Refuses a release that would apply content already applied under the same key (in
    /// the window or not), or whose digest differs from the one `run` computed when it
    /// quarantined the message (another `[feed] digest_ignore`).
    fn check_release(
        &mut self,
        id: u64,
        msg: &crate::model::Message,
        rec: &QuarantineRecord,
        prior: Option<PriorApplications>,
    ) -> Result<(), StoreError> {
        let decided_with = match self.tx.audit(rec.audit_index)? {
            Some(entry) => entry.digest,
            None => {
                return Err(refuse(format!(
                    "quarantine #{id}: the audit entry that quarantined it (#{}) was pruned, so its \
                     content cannot be checked against what was applied; discard it instead",
                    rec.audit_index
                )));
            }
        };
        if decided_with != Some(*msg.digest.as_bytes()) {
            return Err(refuse(format!(
                "quarantine #{id}: its stored payload does not match the digest audit entry {} \
                 recorded: {DAMAGED_OR_CONFIG}",
                rec.audit_index
            )));
        }
        let mut prior = prior.unwrap_or(PriorApplications {
            key: rec.key,
            digests: HashMap::new(),
            scanned_to: 0,
        });
        if prior.key != rec.key {
            return Err(refuse(format!(
                "quarantine #{id} changed while it was being checked; run the command again"
            )));
        }
        // What was committed since the snapshot.
        self.tx
            .scan_audit(prior.scanned_to..self.meta.next_audit, &mut |_, e| {
                prior.note(&e);
                Ok(ControlFlow::Continue(()))
            })?;
        if let Some(offset) = prior.digests.get(msg.digest.as_bytes()) {
            return Err(refuse(format!(
                "quarantine #{id}: key {} with this same content is already applied as effect \
                 #{offset}; discard it instead",
                msg.key()
            )));
        }
        Ok(())
    }

    /// Writes the released message's effect and makes it the window's entry for its
    /// position, so a replay of the released bytes is a duplicate of it from now on.
    fn apply_released(
        &mut self,
        msg: &crate::model::Message,
        rec: &QuarantineRecord,
        audit_index: u64,
        now_ms: u64,
        whole_digest: bool,
    ) -> Result<u64, StoreError> {
        let (no, late) = match self.source_no(&msg.source)? {
            Some(no) => {
                let state = self.state(no)?;
                let late = msg.position <= pair_pos(state.record.high_water);
                if !late {
                    state.record.high_water = pos_pair(msg.position);
                    state.dirty = true;
                }
                (no, late)
            }
            None => (self.new_source(&msg.source, msg.position)?, false),
        };
        // The position may hold another message's entry (a released conflict): it is
        // replaced, and removed first so a backend keeping entries in two tables (redb's
        // `WINDOW_RECENT`) never holds the position in both.
        self.tx
            .remove_window((no, msg.position.epoch, msg.position.sequence))?;
        self.write_effect(
            no,
            msg,
            &EffectOrigin {
                topic: &rec.topic,
                // Applied now: the window keeps it (and suppresses its replays) from now on.
                received_at_ms: now_ms,
                payload: &rec.payload,
                late,
                released: true,
                audit_index,
                whole_digest,
            },
        )
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
    // The database is this function's own: a redb panic leaves nothing behind to poison.
    super::guard::catch(|| compact_unguarded(path, cache_bytes))?.map_err(StoreError::classify)
}

fn compact_unguarded(
    path: &std::path::Path,
    cache_bytes: usize,
) -> Result<CompactReport, StoreError> {
    match super::file::probe(path)? {
        super::file::Found::Missing => {
            return Err(refuse(format!(
                "database {} does not exist",
                path.display()
            )));
        }
        super::file::Found::Empty => return Err(StoreError::Empty(path.to_path_buf())),
        super::file::Found::File => {}
    }
    // A feed writer is refused by name. There is no lock to take for it: the exclusive open
    // below locks every byte of the file, the feed lock's included, so no feed writer can
    // start while compaction runs.
    let busy = |holder| StoreError::Busy {
        path: path.to_path_buf(),
        holder,
    };
    if let Some(holder) = super::file::feed_lock_holder(path)? {
        return Err(busy(holder));
    }
    // Never compact a damaged file: compaction rewrites it, and on a damaged freed-page list
    // redb's compaction can loop without end. The check reads the file once, writes nothing.
    super::check_writer_open(path)?;
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let before_bytes = size(path);
    let mut builder = redb::Builder::new();
    builder
        .set_cache_size(cache_bytes)
        .set_concurrency_mode(redb::ConcurrencyMode::ExclusiveWriter);
    let (backend, _) = super::file::open_existing(path, true)?;
    let mut db = Leak::new(builder.create_with_backend(backend).map_err(|e| match e {
        // A feed writer that started meanwhile, or another process's handle.
        redb::DatabaseError::DatabaseAlreadyOpen => match super::file::feed_lock_holder(path) {
            Ok(Some(holder)) => busy(holder),
            _ => refuse(format!(
                "{} is open in another process (an inspector such as dump-audit --follow, or \
                 a quarantine command): compact needs it to itself; retry when that has finished",
                path.display()
            )),
        },
        error => StoreError::Open {
            path: path.to_path_buf(),
            error,
        },
    })?);
    while db.compact()? {}
    drop(db.into_inner());
    Ok(CompactReport {
        before_bytes,
        after_bytes: size(path),
    })
}
