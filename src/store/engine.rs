//! The backend-neutral write path: a batch decided message by message with
//! `decide::decide` (the only place outcomes are decided), its effects, window entries,
//! quarantine and hash-chained audit entries written through a backend's `Tx`, the window
//! evicted from its front. A backend opens the transaction, hands it to `Writer`, and commits
//! what `Writer::finish` gives back.

use std::collections::HashMap;
use std::ops::ControlFlow;

use super::tables::*;
use super::tx::Tx;
use super::upstream::{ConsumedAs, ReportedGap};
use super::{BatchReport, Decided, StoreError, StoreOptions, audit};
use crate::decide::{self, Seen, SourceMarks};
use crate::key::sha256;
use crate::model::{Digest, IdempotencyKey, Message, Outcome, Position, Source};
use crate::wire::{DecodeError, Incoming};

/// The quarantine fingerprint of a conflicting or stale message: its outcome, key and
/// digest (replays of the same content land on the same record).
pub(super) fn fingerprint_decided(outcome: u8, key: &[u8; 32], digest: &[u8; 32]) -> [u8; 32] {
    sha256(&[b"replay-guard/quarantine/v1\0", &[outcome], key, digest])
}

/// The quarantine fingerprint of a malformed message: the SHA-256 of all its bytes.
pub(super) fn fingerprint_malformed(whole_sha256: &[u8; 32]) -> [u8; 32] {
    sha256(&[
        b"replay-guard/quarantine/v1\0",
        &[Outcome::Malformed.code()],
        whole_sha256,
    ])
}

/// Where an effect's bytes came from and how it was applied.
pub(super) struct EffectOrigin<'a> {
    pub(super) topic: &'a str,
    pub(super) received_at_ms: u64,
    pub(super) payload: &'a [u8],
    pub(super) late: bool,
    pub(super) released: bool,
    pub(super) audit_index: u64,
    /// The message's digest is `wire::whole_digest(payload)` (`Incoming::whole_digest`).
    pub(super) whole_digest: bool,
}

/// Cached state of one source during a batch.
pub(super) struct SourceState {
    pub(super) record: SourceRecord,
    pub(super) dirty: bool,
}

/// Source numbers by name, kept by a feed writer from one transaction to the next.
///
/// Invariant: a committed source number never changes: `SOURCE_IDS` only grows (nothing
/// renumbers or removes a source), so a number read or assigned in a transaction that
/// committed stays right for every later one, whoever else writes the file. A writer takes
/// the cache into a transaction (`Writer::with_names`) and gives it back only once that
/// transaction committed; a failed one drops it, numbers it assigned included.
#[derive(Default)]
pub(super) struct SourceNames(HashMap<Source, u64>);

impl SourceNames {
    /// Most sources a cache keeps (about 100 bytes each): a feed of more starts again empty,
    /// and reads the numbers it needs from the store.
    const MAX: usize = 65_536;
}

/// One write transaction's batch state over a backend's tables (`Tx`): the meta record,
/// the sources touched so far and the counters, written back by `finish`.
pub(super) struct Writer<T: Tx> {
    pub(super) tx: T,
    pub(super) opts: StoreOptions,
    pub(super) meta: Meta,
    names: SourceNames,
    states: HashMap<u64, SourceState>,
    /// Retention's marks, loaded when first needed; written back by `finish` when changed.
    marks: Option<RetentionMarks>,
    marks_dirty: bool,
    counters: Counters,
    /// Upstream gaps the batch's applied messages revealed, in delivery order.
    gaps: Vec<ReportedGap>,
    /// The effect record and audit entry of the message being decided, kept between
    /// messages so their strings and payload buffer are allocated once per batch.
    effect_buf: Option<EffectRecord>,
    audit_buf: Option<AuditRecord>,
    /// The audit log's next index when the transaction opened.
    audit_at_open: u64,
}

/// Index rows a write transaction merges (`Tx::merge_indexes`) per audit entry it appends,
/// and at least: faster than entries arrive, so a segment is merged well before the next one
/// is complete, and a bounded share of each commit.
const MERGE_PER_ENTRY: u64 = 4;
const MERGE_AT_LEAST: u64 = 256;

/// `dst = src`, in `dst`'s own allocation.
fn refill(dst: &mut String, src: &str) {
    dst.clear();
    dst.push_str(src);
}

/// `dst = Some(src)`, in `dst`'s own allocation when it has one.
fn refill_some(dst: &mut Option<String>, src: &str) {
    match dst {
        Some(d) => refill(d, src),
        None => *dst = Some(src.to_string()),
    }
}

/// The (agency, source id, epoch, sequence) of each decodable delivery of `batch`: what a
/// backend prefetches before the batch is decided.
pub(super) fn positions(batch: &[Incoming]) -> Vec<(&str, &str, u64, u64)> {
    batch
        .iter()
        .filter_map(|i| i.decoded.as_ref().ok())
        .map(|m| {
            let (agency, source_id) = (m.source.agency(), m.source.source_id());
            (agency, source_id, m.position.epoch, m.position.sequence)
        })
        .collect()
}

pub(super) fn pos_pair(p: Position) -> (u64, u64) {
    (p.epoch, p.sequence)
}
pub(super) fn pair_pos((epoch, sequence): (u64, u64)) -> Position {
    Position { epoch, sequence }
}

/// Evictions allowed per transaction beyond the batch's own size, so a long-idle window is
/// drained over a few commits instead of one huge one.
const EVICTION_SLACK: u64 = 4096;

impl<T: Tx> Writer<T> {
    /// Decides every delivery of `batch`, in order, at time `now_ms`; evicts what the window
    /// no longer keeps and prunes what retention no longer keeps; returns the upstream gap
    /// candidates the batch revealed (not recorded) and records, if given, the client id it
    /// was consumed under. The caller commits.
    pub(super) fn decide_batch(
        &mut self,
        batch: &[Incoming],
        now_ms: u64,
        consumed_as: Option<&ConsumedAs>,
    ) -> Result<BatchReport, StoreError> {
        self.tx.prefetch(&positions(batch))?;
        self.hint_repeated_sources(batch)?;
        let mut budget = batch.len() as u64 + EVICTION_SLACK;
        let mut report = BatchReport::default();
        report.evicted += self.evict(now_ms, &mut budget)?;
        for incoming in batch {
            let d = self.decide_one(incoming, now_ms)?;
            report.counts.add(d.outcome);
            report.decided.push(d);
        }
        report.evicted += self.evict(now_ms, &mut budget)?;
        // Candidates only: the caller confirms them after a grace (`upstream::confirm_gaps`).
        report.gaps = std::mem::take(&mut self.gaps);
        if let Some(c) = consumed_as.filter(|_| !batch.is_empty()) {
            let mut losses = self.tx.upstream_losses()?.unwrap_or_default();
            if losses.note_consumer(&c.client_id, &c.broker, now_ms) {
                self.tx.put_upstream_losses(&losses)?;
            }
        }
        // Looking costs one read at the oldest end of each log, so every commit looks.
        if self.opts.retention.is_active() {
            let policy = self.opts.retention;
            report.pruned = self.prune(now_ms, &policy)?;
        }
        Ok(report)
    }

    pub(super) fn open(mut tx: T, opts: &StoreOptions) -> Result<Writer<T>, StoreError> {
        let meta = tx.meta()?;
        let counters = match tx.counters()? {
            Some(c) => c,
            // A database from before the counters: count its (never pruned) audit log once.
            None => {
                let mut c = Counters::default();
                tx.scan_audit_heads(0..meta.next_audit, &mut |_, head| {
                    if let Some(n) = c.by_outcome.get_mut(usize::from(head.outcome)) {
                        *n += 1;
                    }
                    Ok(ControlFlow::Continue(()))
                })?;
                c
            }
        };
        Ok(Writer {
            tx,
            opts: opts.clone(),
            audit_at_open: meta.next_audit,
            meta,
            names: SourceNames::default(),
            states: HashMap::new(),
            marks: None,
            marks_dirty: false,
            counters,
            gaps: Vec::new(),
            effect_buf: None,
            audit_buf: None,
        })
    }

    /// Starts from the source numbers `names` holds (a feed writer's, from its earlier
    /// committed transactions) instead of none.
    pub(super) fn with_names(mut self, mut names: SourceNames) -> Self {
        if names.0.len() > SourceNames::MAX {
            names.0.clear();
        }
        self.names = names;
        self
    }

    /// The source numbers this transaction read or assigned, with those it started from: for
    /// the next transaction once this one has committed, never before.
    pub(super) fn take_names(&mut self) -> SourceNames {
        std::mem::take(&mut self.names)
    }

    /// Tells the transaction which numbered sources the batch names more than once, in the
    /// order their second message comes (`Tx::several_window_entries`). The numbers come
    /// from the cache, or are read now instead of when their first message is decided.
    fn hint_repeated_sources(&mut self, batch: &[Incoming]) -> Result<(), StoreError> {
        let mut seen: HashMap<&Source, u8> = HashMap::with_capacity(batch.len());
        let mut again = Vec::new();
        for m in batch.iter().filter_map(|i| i.decoded.as_ref().ok()) {
            let n = seen.entry(&m.source).or_insert(0);
            if *n == 1 {
                again.push(&m.source);
            }
            *n = n.saturating_add(1);
        }
        for source in again {
            if let Some(no) = self.source_no(source)? {
                self.tx.several_window_entries(no);
            }
        }
        Ok(())
    }

    pub(super) fn source_no(&mut self, source: &Source) -> Result<Option<u64>, StoreError> {
        if let Some(no) = self.names.0.get(source) {
            return Ok(Some(*no));
        }
        let found = self.tx.source_no(source.agency(), source.source_id())?;
        if let Some(no) = found {
            self.names.0.insert(source.clone(), no);
        }
        Ok(found)
    }

    pub(super) fn state(&mut self, no: u64) -> Result<&mut SourceState, StoreError> {
        if !self.states.contains_key(&no) {
            let record = self.tx.source(no)?.ok_or_else(|| {
                SOURCES.missing(&no, "missing (named in source_ids or the effect log)")
            })?;
            self.states.insert(
                no,
                SourceState {
                    record,
                    dirty: false,
                },
            );
        }
        self.states
            .get_mut(&no)
            .ok_or_else(|| unreachable!("inserted above"))
    }

    pub(super) fn decide_one(
        &mut self,
        incoming: &Incoming,
        now_ms: u64,
    ) -> Result<Decided, StoreError> {
        let msg = match &incoming.decoded {
            Err(e) => return self.record_malformed(incoming, e, now_ms),
            Ok(m) => m,
        };
        super::stored::note_derived(msg);
        let no = self.source_no(&msg.source)?;
        let (seen, marks) = match no {
            None => (None, None),
            Some(no) => {
                let rec = &self.state(no)?.record;
                let marks = SourceMarks {
                    high_water: pair_pos(rec.high_water),
                    evicted_floor: rec.evicted_floor.map(pair_pos),
                };
                // Invariant: the window holds no position above its source's high-water
                // mark (an entry is written only for an effect at or below the mark once
                // that effect is applied, and marks only rise), so a position above the
                // mark needs no lookup. `verify` checks it.
                let seen = if msg.position > marks.high_water {
                    None
                } else {
                    let wkey = (no, msg.position.epoch, msg.position.sequence);
                    if incoming.whole_digest {
                        super::stored::expect_resend(&incoming.payload, msg.digest.as_bytes());
                    }
                    let found = self.tx.window(wkey);
                    super::stored::forget_resend();
                    found?.map(|w| Seen {
                        digest: Digest::from_bytes(w.digest),
                        effect_offset: w.effect_offset,
                    })
                };
                (seen, Some(marks))
            }
        };
        let decision = decide::decide(msg, seen.as_ref(), marks.as_ref(), self.opts.out_of_order);
        let audit_index = self.meta.next_audit;
        let mut effect_offset = seen.map(|s| s.effect_offset);
        let mut quarantine_id = None;
        let mut source_no = no;
        match decision.outcome {
            Outcome::Applied | Outcome::AppliedLate => {
                let late = decision.outcome == Outcome::AppliedLate;
                let no = match no {
                    Some(no) => no,
                    None => self.new_source(&msg.source, msg.position)?,
                };
                source_no = Some(no);
                let offset = self.write_effect(
                    no,
                    msg,
                    &EffectOrigin {
                        topic: &incoming.topic,
                        received_at_ms: incoming.received_at_ms,
                        payload: &incoming.payload,
                        late,
                        released: false,
                        audit_index,
                        whole_digest: incoming.whole_digest,
                    },
                )?;
                if !late {
                    if let Some(gap) = decide::upstream_gap(marks.as_ref(), msg.position) {
                        self.gaps.push(ReportedGap {
                            agency: msg.source.agency().into(),
                            source_id: msg.source.source_id().into(),
                            gap,
                        });
                    }
                    let st = self.state(no)?;
                    st.record.high_water = pos_pair(msg.position);
                    st.dirty = true;
                }
                effect_offset = Some(offset);
            }
            Outcome::Duplicate => {}
            Outcome::Conflict | Outcome::Stale => {
                let fp = fingerprint_decided(
                    decision.outcome.code(),
                    msg.key().as_bytes(),
                    msg.digest.as_bytes(),
                );
                quarantine_id = Some(self.quarantine(
                    fp,
                    decision.outcome,
                    &decision.reason,
                    incoming,
                    &incoming.payload,
                    Some(msg.key()),
                    audit_index,
                )?);
            }
            Outcome::Malformed | Outcome::Released | Outcome::Discarded | Outcome::Relay => {
                unreachable!("decide never returns {}", decision.outcome)
            }
        }
        let mut rec = self.audit_buf.take().unwrap_or_default();
        rec.recorded_at_ms = now_ms;
        rec.outcome = decision.outcome.code();
        rec.key = Some(*msg.key().as_bytes());
        refill_some(&mut rec.agency, msg.source.agency());
        refill_some(&mut rec.source_id, msg.source.source_id());
        rec.epoch = Some(msg.position.epoch);
        rec.sequence = Some(msg.position.sequence);
        refill(&mut rec.topic, &incoming.topic);
        rec.reason = decision.reason;
        rec.digest = Some(*msg.digest.as_bytes());
        rec.effect_offset = effect_offset;
        rec.quarantine_id = quarantine_id;
        let appended = self.chain_audit(&mut rec, source_no);
        self.audit_buf = Some(rec);
        appended?;
        Ok(Decided {
            outcome: decision.outcome,
            audit_index,
            key: Some(msg.key()),
            effect_offset,
            quarantine_id,
        })
    }

    /// Writes an applied message's effect record at the next offset and makes it the window
    /// entry of its position (the feed's decision and an operator's release both apply here).
    pub(super) fn write_effect(
        &mut self,
        no: u64,
        msg: &Message,
        origin: &EffectOrigin<'_>,
    ) -> Result<u64, StoreError> {
        let offset = self.meta.next_effect;
        self.meta.next_effect += 1;
        let mut effect = self.effect_buf.take().unwrap_or_default();
        effect.source_no = no;
        effect.epoch = msg.position.epoch;
        effect.sequence = msg.position.sequence;
        effect.received_at_ms = origin.received_at_ms;
        effect.key = *msg.key().as_bytes();
        refill(&mut effect.agency, msg.source.agency());
        refill(&mut effect.source_id, msg.source.source_id());
        refill(&mut effect.topic, origin.topic);
        effect.late = origin.late;
        effect.released = origin.released;
        effect.audit_index = origin.audit_index;
        effect.payload.clear();
        effect.payload.extend_from_slice(origin.payload);
        effect.digest = Some(*msg.digest.as_bytes());
        if origin.whole_digest {
            super::stored::note_whole_digest(msg.digest.as_bytes());
        }
        let put = self.tx.put_effect(offset, &effect);
        super::stored::forget_whole_digest();
        self.effect_buf = Some(effect);
        put?;
        let w = WindowRecord {
            digest: *msg.digest.as_bytes(),
            effect_offset: offset,
        };
        self.tx
            .put_window((no, msg.position.epoch, msg.position.sequence), &w)?;
        Ok(offset)
    }

    fn record_malformed(
        &mut self,
        incoming: &Incoming,
        err: &DecodeError,
        now_ms: u64,
    ) -> Result<Decided, StoreError> {
        let audit_index = self.meta.next_audit;
        let reason = err.to_string();
        // An oversized payload is identified by the hash of all of it, and only its first
        // `limit` bytes are kept (the caller may already have dropped the rest).
        let (whole, kept) = match err {
            DecodeError::TooLarge { limit, sha256, .. } => (
                *sha256,
                &incoming.payload[..incoming.payload.len().min(*limit)],
            ),
            _ => (sha256(&[&incoming.payload]), incoming.payload.as_slice()),
        };
        let fp = fingerprint_malformed(&whole);
        let qid = self.quarantine(
            fp,
            Outcome::Malformed,
            &reason,
            incoming,
            kept,
            None,
            audit_index,
        )?;
        self.append_audit(
            AuditRecord {
                recorded_at_ms: now_ms,
                outcome: Outcome::Malformed.code(),
                key: None,
                agency: None,
                source_id: None,
                epoch: None,
                sequence: None,
                topic: incoming.topic.clone(),
                reason,
                digest: None,
                effect_offset: None,
                quarantine_id: Some(qid),
                prev_hash: [0; 32],
                hash: [0; 32],
            },
            None,
        )?;
        Ok(Decided {
            outcome: Outcome::Malformed,
            audit_index,
            key: None,
            effect_offset: None,
            quarantine_id: Some(qid),
        })
    }

    pub(super) fn new_source(
        &mut self,
        source: &Source,
        first: Position,
    ) -> Result<u64, StoreError> {
        let no = self.meta.next_source;
        self.meta.next_source += 1;
        self.tx
            .put_source_no(source.agency(), source.source_id(), no)?;
        self.names.0.insert(source.clone(), no);
        self.states.insert(
            no,
            SourceState {
                record: SourceRecord {
                    agency: source.agency().into(),
                    source_id: source.source_id().into(),
                    high_water: pos_pair(first),
                    evicted_floor: None,
                },
                dirty: true,
            },
        );
        Ok(no)
    }

    /// Keeps the message in quarantine; the same fingerprint again only bumps its counter.
    #[allow(clippy::too_many_arguments)]
    fn quarantine(
        &mut self,
        fp: [u8; 32],
        outcome: Outcome,
        reason: &str,
        incoming: &Incoming,
        payload: &[u8],
        key: Option<IdempotencyKey>,
        audit_index: u64,
    ) -> Result<u64, StoreError> {
        if let Some(id) = self.tx.fingerprint_owner(&fp)?
            && let Some(mut rec) = self.tx.quarantined(id)?
        {
            rec.deliveries += 1;
            rec.last_seen_ms = incoming.received_at_ms.max(rec.last_seen_ms);
            self.tx.put_quarantined(id, &rec)?;
            return Ok(id);
        }
        let id = self.meta.next_quarantine;
        self.meta.next_quarantine += 1;
        let rec = QuarantineRecord {
            outcome: outcome.code(),
            reason: reason.into(),
            topic: incoming.topic.clone(),
            received_at_ms: incoming.received_at_ms,
            last_seen_ms: incoming.received_at_ms,
            deliveries: 1,
            key: key.map(|k| *k.as_bytes()),
            audit_index,
            payload: payload.to_vec(),
        };
        self.tx.put_quarantined(id, &rec)?;
        self.tx.put_fingerprint(&fp, id)?;
        Ok(id)
    }

    /// Appends `rec`; `source_no` is the number of the source it names, if it names one
    /// that has a number (the source index's bucket).
    pub(super) fn append_audit(
        &mut self,
        mut rec: AuditRecord,
        source_no: Option<u64>,
    ) -> Result<u64, StoreError> {
        self.chain_audit(&mut rec, source_no)
    }

    /// Chains `rec` (its `prev_hash` and `hash` are set here) and stores it at the next index.
    fn chain_audit(
        &mut self,
        rec: &mut AuditRecord,
        source_no: Option<u64>,
    ) -> Result<u64, StoreError> {
        let index = self.meta.next_audit;
        rec.prev_hash = self.meta.chain_head;
        rec.hash = audit::entry_hash(index, rec, &rec.prev_hash);
        // Stored at `index`, so the stored entry may leave the hash out, and its `prev_hash`
        // too when the entry before it is stored (not pruned by retention).
        let after_stored = index > 0
            && self
                .meta
                .audit_anchor
                .is_none_or(|(pruned, _)| pruned + 1 < index);
        super::stored::note_chained(index, &rec.hash, after_stored);
        self.tx.put_audit(index, rec, source_no)?;
        self.meta.chain_head = rec.hash;
        self.meta.next_audit += 1;
        if let Some(n) = self.counters.by_outcome.get_mut(usize::from(rec.outcome)) {
            *n += 1;
        }
        Ok(index)
    }

    /// Evicts from the front of the window (oldest first sight first) every entry older than
    /// the window's age, and more while it holds more than `max_entries`, within `budget`.
    /// Each eviction raises its source's evicted floor.
    pub(super) fn evict(&mut self, now_ms: u64, budget: &mut u64) -> Result<u64, StoreError> {
        let cutoff = now_ms.checked_sub(self.opts.window.seconds.saturating_mul(1000));
        let mut victims = Vec::new();
        let mut len = self.meta.next_effect - self.meta.window_start;
        let max_entries = self.opts.window.max_entries;
        let limit = *budget;
        self.tx.scan_effect_heads(
            self.meta.window_start..self.meta.next_effect,
            &mut |offset, head| {
                if victims.len() as u64 >= limit {
                    return Ok(ControlFlow::Break(()));
                }
                let expired = cutoff.is_some_and(|c| head.received_at_ms <= c);
                if !expired && len <= max_entries {
                    return Ok(ControlFlow::Break(()));
                }
                victims.push((offset, head));
                len -= 1;
                Ok(ControlFlow::Continue(()))
            },
        )?;
        for (offset, head) in &victims {
            let wkey = (head.source_no, head.epoch, head.sequence);
            // The window entry normally belongs to this effect; if another effect owns the
            // position (e.g. an operator-released message), it stays.
            self.tx.evict_window(wkey, *offset)?;
            let evicted = (head.epoch, head.sequence);
            let st = self.state(head.source_no)?;
            if st.record.evicted_floor.is_none_or(|f| f < evicted) {
                st.record.evicted_floor = Some(evicted);
                st.dirty = true;
            }
            self.meta.window_start = offset + 1;
        }
        let n = victims.len() as u64;
        *budget -= n;
        Ok(n)
    }

    /// Writes back the sources, marks, counters and meta record the batch changed, and
    /// hands the transaction back for the backend to commit.
    pub(super) fn finish(mut self) -> Result<T, StoreError> {
        for (no, st) in &self.states {
            if st.dirty {
                self.tx.put_source(*no, &st.record)?;
            }
        }
        if let (Some(marks), true) = (&self.marks, self.marks_dirty) {
            self.tx.put_retention_marks(marks)?;
        }
        self.tx.put_counters(&self.counters)?;
        let appended = self.meta.next_audit.saturating_sub(self.audit_at_open);
        let budget = appended
            .saturating_mul(MERGE_PER_ENTRY)
            .saturating_add(MERGE_AT_LEAST);
        self.tx.merge_indexes(&self.meta, budget)?;
        self.tx.put_meta(&self.meta)?;
        Ok(self.tx)
    }

    /// Retention's marks (all zero before anything was pruned).
    pub(super) fn marks(&mut self) -> Result<RetentionMarks, StoreError> {
        if let Some(m) = self.marks {
            return Ok(m);
        }
        let stored = self.tx.retention_marks()?.unwrap_or_default();
        self.marks = Some(stored);
        Ok(stored)
    }

    pub(super) fn set_marks(&mut self, marks: RetentionMarks) {
        self.marks = Some(marks);
        self.marks_dirty = true;
    }
}

#[cfg(test)]
mod tests {
    use crate::decide::Gap;
    use crate::store::upstream::{ConsumedAs, GapCheck, ReportedGap};
    use crate::store::{Backend, Incoming, Store, StoreOptions};
    use crate::testing::T0;
    use crate::wire::FeedContract;

    /// One batch of messages of `fire/engine-7`, each (epoch, sequence), committed at T0.
    fn commit(s: &mut Store, positions: &[(u64, u64)]) -> Vec<ReportedGap> {
        let c = FeedContract::default();
        let batch: Vec<Incoming> = positions
            .iter()
            .map(|(e, q)| {
                let p = format!(
                    r#"{{"agency":"fire","source_id":"engine-7","epoch":{e},"sequence":{q}}}"#
                );
                Incoming::decode("t", p.into_bytes(), T0, &c)
            })
            .collect();
        s.commit_batch(&batch, T0).unwrap().gaps
    }

    fn gap(epoch: u64, from: u64, to: u64) -> ReportedGap {
        ReportedGap {
            agency: "fire".into(),
            source_id: "engine-7".into(),
            gap: Gap { epoch, from, to },
        }
    }

    #[test]
    fn a_sequence_jumping_past_the_high_water_mark_is_a_candidate_not_a_record() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        // The first message of a source is no gap, wherever it starts.
        assert_eq!(commit(&mut s, &[(3, 900)]), vec![]);
        let seqs: Vec<(u64, u64)> = (901..=1000).map(|q| (3, q)).collect();
        assert_eq!(commit(&mut s, &seqs), vec![], "consecutive: no gap");
        assert_eq!(commit(&mut s, &[(3, 3001)]), vec![gap(3, 1001, 3000)]);
        // Two in one batch: each against the mark the one before it left.
        assert_eq!(
            commit(&mut s, &[(3, 3003), (3, 3004), (3, 3010)]),
            vec![gap(3, 3002, 3002), gap(3, 3005, 3009)]
        );
        let losses = s.reader().unwrap().upstream_losses().unwrap();
        assert_eq!(losses.gap_events, 0, "a candidate is not recorded");
        // Confirmed with nothing filled: recorded as they were.
        let candidates = [gap(3, 1001, 3000), gap(3, 3002, 3002), gap(3, 3005, 3009)];
        let check = s.confirm_gaps(&candidates, T0 + 5).unwrap();
        assert_eq!(
            (check.missing, check.unknown),
            (candidates.to_vec(), vec![])
        );
        let losses = s.reader().unwrap().upstream_losses().unwrap();
        assert_eq!((losses.gap_events, losses.missing_sequences), (3, 2006));
        assert_eq!(losses.last_hour(T0 + 5).missing_sequences, 2006);
        assert_eq!(losses.recent_gaps.len(), 3);
        assert_eq!(losses.recent_gaps[0].from, 1001);
    }

    #[test]
    fn late_arrivals_leave_only_the_rest_of_a_candidate_missing() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        assert_eq!(commit(&mut s, &[(3, 1), (3, 10)]), vec![gap(3, 2, 9)]);
        // 3, 4 and 7 arrive late (applied_late), 10 again is a duplicate.
        assert_eq!(commit(&mut s, &[(3, 3), (3, 4), (3, 7), (3, 10)]), vec![]);
        // A new epoch may start its counter anywhere.
        assert_eq!(commit(&mut s, &[(4, 70)]), vec![]);
        assert_eq!(commit(&mut s, &[(4, 72)]), vec![gap(4, 71, 71)]);
        assert_eq!(commit(&mut s, &[(4, 71)]), vec![]);
        let check = s.confirm_gaps(&[gap(3, 2, 9), gap(4, 71, 71)], T0).unwrap();
        assert_eq!(
            check.missing,
            vec![gap(3, 2, 2), gap(3, 5, 6), gap(3, 8, 9)]
        );
        let losses = s.reader().unwrap().upstream_losses().unwrap();
        assert_eq!((losses.gap_events, losses.missing_sequences), (3, 5));
        // Every one filled: nothing reported, nothing written.
        assert_eq!(
            commit(&mut s, &[(3, 2), (3, 5), (3, 6), (3, 8), (3, 9)]),
            vec![]
        );
        assert_eq!(
            s.confirm_gaps(&[gap(3, 2, 9)], T0).unwrap(),
            GapCheck::default()
        );
        let after = s.reader().unwrap().upstream_losses().unwrap();
        assert_eq!(after, losses);
    }

    #[test]
    fn a_candidate_at_or_below_the_evicted_floor_is_unknown_not_missing() {
        let mut opts = StoreOptions::default();
        opts.window.max_entries = 2;
        let mut s = Store::open_in_memory(opts).unwrap();
        assert_eq!(commit(&mut s, &[(3, 1), (3, 10)]), vec![gap(3, 2, 9)]);
        // 2..=5 arrive; the window keeps the newest two arrivals, so 1 and 10 are evicted
        // by the time 3 is in: the floor is 10 (4 and 5 are stale), and whether 6..=9
        // arrived can no longer be told.
        for q in 2..=5 {
            commit(&mut s, &[(3, q)]);
        }
        assert_eq!(
            s.confirm_gaps(&[gap(3, 2, 9)], T0).unwrap(),
            GapCheck {
                missing: vec![],
                unknown: vec![gap(3, 2, 9)]
            }
        );
        // Above the floor, what is absent is missing.
        assert_eq!(commit(&mut s, &[(3, 14)]), vec![gap(3, 11, 13)]);
        commit(&mut s, &[(3, 12)]);
        assert_eq!(
            s.confirm_gaps(&[gap(3, 11, 13)], T0).unwrap().missing,
            vec![gap(3, 11, 11), gap(3, 13, 13)]
        );
    }

    #[test]
    fn a_batch_records_the_client_id_it_was_consumed_under_once() {
        let store = Store::open_in_memory(StoreOptions::default()).unwrap();
        let mut b = Backend::Redb(store);
        // Nothing consumed yet: a connect without a session is no loss.
        assert_eq!(b.note_connect("mqtt://b", "rg", false, T0).unwrap(), None);
        b.consume_as(ConsumedAs {
            client_id: "rg".into(),
            broker: "mqtt://b".into(),
        });
        crate::testing::feed(&mut b, 1..=3, T0);
        let losses = b.reader().unwrap().upstream_losses().unwrap();
        assert_eq!(losses.consumers.len(), 1);
        assert_eq!(losses.consumers[0].client_id, "rg");
        // With the session kept, nothing is lost; without it, the loss is recorded.
        assert_eq!(b.note_connect("mqtt://b", "rg", true, T0).unwrap(), None);
        let loss = b.note_connect("mqtt://b", "rg", false, T0 + 5).unwrap();
        assert_eq!(
            loss.map(|l| (l.at_ms, l.client_id)),
            Some((T0 + 5, "rg".into()))
        );
        // Another client id never consumed under: no loss.
        assert_eq!(
            b.note_connect("mqtt://b", "other", false, T0).unwrap(),
            None
        );
        let losses = b.reader().unwrap().upstream_losses().unwrap();
        assert_eq!(losses.sessions_lost, 1);
        assert_eq!(losses.last_hour(T0 + 5).sessions_lost, 1);
        assert_eq!(losses.recent_sessions_lost[0].broker, "mqtt://b");
        // Every connect is noted, kept session or not: the report draws the switches.
        let connects: Vec<(&str, bool)> = losses
            .recent_connects
            .iter()
            .map(|c| (c.client_id.as_str(), c.session_present))
            .collect();
        assert_eq!(
            connects,
            [("rg", false), ("rg", true), ("rg", false), ("other", false)]
        );
    }

    #[test]
    fn the_connects_noted_stay_bounded_newest_kept() {
        let mut b = Backend::Redb(Store::open_in_memory(StoreOptions::default()).unwrap());
        for i in 0..(crate::store::upstream::CONNECTS as u64 + 10) {
            b.note_connect(&format!("mqtt://b{i}"), "rg", true, T0 + i)
                .unwrap();
        }
        let connects = b
            .reader()
            .unwrap()
            .upstream_losses()
            .unwrap()
            .recent_connects;
        assert_eq!(connects.len(), crate::store::upstream::CONNECTS);
        assert_eq!(connects.last().unwrap().broker, "mqtt://b73");
        assert_eq!(connects[0].at_ms, T0 + 10);
    }

    /// The source numbers of `sources`, as `SOURCE_IDS` holds them.
    fn numbers(s: &Store, sources: &[&str]) -> Vec<Option<u64>> {
        let txn = redb::ReadableDatabase::begin_read(s.db.get().unwrap()).unwrap();
        let ids = txn.open_table(crate::store::tables::SOURCE_IDS).unwrap();
        sources
            .iter()
            .map(|id| ids.get(("fire", *id)).unwrap().map(|g| g.value()))
            .collect()
    }

    fn batch_of(sources: &[&str]) -> Vec<Incoming> {
        let c = FeedContract::default();
        sources
            .iter()
            .map(|id| {
                let p = format!(r#"{{"agency":"fire","source_id":"{id}","epoch":1,"sequence":1}}"#);
                Incoming::decode("t", p.into_bytes(), T0, &c)
            })
            .collect()
    }

    /// A batch naming a numbered source more than once hints it to the transaction
    /// (`Tx::several_window_entries`): on redb its first new window entry of the commit goes
    /// straight into the window's main table too; a source named once, or not numbered yet,
    /// goes through the small table.
    #[test]
    fn a_source_the_batch_names_twice_is_hinted_before_it_is_decided() {
        let c = FeedContract::default();
        let at = |id: &str, seq: u64| {
            let p = format!(r#"{{"agency":"fire","source_id":"{id}","epoch":1,"sequence":{seq}}}"#);
            Incoming::decode("t", p.into_bytes(), T0, &c)
        };
        let tables = |s: &Store| {
            use redb::ReadableTableMetadata;
            let txn = redb::ReadableDatabase::begin_read(s.db.get().unwrap()).unwrap();
            let len = |t: &str| {
                let def = redb::TableDefinition::<(u64, u64, u64), &[u8]>::new(t);
                txn.open_table(def).unwrap().len().unwrap()
            };
            (len("window"), len("window_recent"))
        };
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        // Not numbered yet: both of a's entries start through the small table, the second
        // goes straight in as a source's later entry always did.
        s.commit_batch(&[at("a", 1), at("b", 1), at("a", 2)], T0)
            .unwrap();
        assert_eq!(tables(&s), (1, 2));
        // Numbered now: a (twice) is hinted, b (once) is not.
        s.commit_batch(&[at("a", 3), at("b", 2), at("a", 4)], T0)
            .unwrap();
        assert_eq!(tables(&s), (3, 3));
    }

    #[test]
    fn a_source_number_of_a_transaction_that_did_not_commit_is_not_kept() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        s.commit_batch(&batch_of(&["engine-7"]), T0).unwrap();
        assert_eq!(numbers(&s, &["engine-7"]), [Some(0)]);
        // engine-7's source record goes missing: a batch that reaches it fails, after it
        // numbered a new source (engine-8, number 1) that the failed transaction never stored.
        {
            let txn = s.db.get().unwrap().begin_write().unwrap();
            txn.open_table(super::SOURCES.raw())
                .unwrap()
                .remove(0)
                .unwrap();
            txn.commit().unwrap();
        }
        let failed = s.commit_batch(&batch_of(&["engine-8", "engine-7"]), T0);
        assert!(failed.is_err(), "{failed:?}");
        assert_eq!(numbers(&s, &["engine-8"]), [None]);
        // Number 1 goes to the next new source; engine-8 gets its own, not the failed one's.
        s.commit_batch(&batch_of(&["engine-9"]), T0).unwrap();
        s.commit_batch(&batch_of(&["engine-8"]), T0).unwrap();
        assert_eq!(
            numbers(&s, &["engine-7", "engine-9", "engine-8"]),
            [Some(0), Some(1), Some(2)]
        );
        let txn = redb::ReadableDatabase::begin_read(s.db.get().unwrap()).unwrap();
        let sources = super::SOURCES.open(&txn).unwrap();
        for (no, id) in [(1, "engine-9"), (2, "engine-8")] {
            assert_eq!(sources.get(no).unwrap().unwrap().source_id, id);
        }
    }
}
