//! Retention: what the audit log, the effect log and the quarantine keep. Pruning runs inside
//! `commit_batch`'s own write transaction, a bounded slice per commit, so it never holds the
//! write lock for long and costs no extra fsync; a backlog (a policy just tightened) is worked
//! off over the following commits. Each log is pruned from its oldest end only:
//! - the audit log up to an index; the last removed entry's index and hash become
//!   `Meta::audit_anchor`, from which `verify` still proves the rest of the chain;
//! - the effect log up to an offset, never into the dedup window (offsets below
//!   `Meta::window_start` only); `RetentionMarks::effects_floor` records the cut;
//! - the quarantine up to an id (with its fingerprints); `RetentionMarks::quarantine_floor`.

use std::ops::ControlFlow;

use super::StoreError;
use super::engine::Writer;
use super::tables::*;
use super::tx::Tx;

/// Records removed per commit at most (all logs together), so a commit that prunes stays short.
pub(super) const PRUNE_SLICE: u64 = 2_048;

/// What one log keeps: entries younger than `max_age_seconds` and at most `max_entries` of
/// them. `None` keeps without that bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogRetention {
    pub max_age_seconds: Option<u64>,
    pub max_entries: Option<u64>,
}

impl LogRetention {
    pub(super) fn is_active(self) -> bool {
        self.max_age_seconds.is_some() || self.max_entries.is_some()
    }

    /// The oldest time kept, or `None` for no age bound.
    fn cutoff(self, now_ms: u64) -> Option<u64> {
        self.max_age_seconds
            .map(|s| now_ms.saturating_sub(s.saturating_mul(1000)))
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    pub audit: LogRetention,
    pub effects: LogRetention,
    pub quarantine: LogRetention,
}

impl RetentionPolicy {
    /// Nothing is ever pruned (the library default; `run` reads `[retention]`).
    pub fn keep_all() -> RetentionPolicy {
        RetentionPolicy::default()
    }

    pub fn is_active(&self) -> bool {
        self.audit.is_active() || self.effects.is_active() || self.quarantine.is_active()
    }
}

/// Records removed by one commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PruneCounts {
    pub audit: u64,
    pub effects: u64,
    pub quarantine: u64,
    /// The slice ran out before everything due was removed.
    pub more: bool,
}

impl PruneCounts {
    pub fn total(&self) -> u64 {
        self.audit + self.effects + self.quarantine
    }
}

impl<T: Tx> Writer<T> {
    /// Removes, oldest first, what `policy` no longer keeps, at most `PRUNE_SLICE` records.
    pub(super) fn prune(
        &mut self,
        now_ms: u64,
        policy: &RetentionPolicy,
    ) -> Result<PruneCounts, StoreError> {
        let mut budget = PRUNE_SLICE;
        let mut counts = PruneCounts::default();
        let mut marks = self.marks()?;
        if policy.audit.is_active() {
            counts.audit = self.prune_audit(now_ms, policy.audit, &mut budget)?;
            marks.audit_pruned += counts.audit;
        }
        if policy.effects.is_active() {
            counts.effects = self.prune_effects(now_ms, policy.effects, &mut budget, &mut marks)?;
            marks.effects_pruned += counts.effects;
        }
        if policy.quarantine.is_active() {
            counts.quarantine =
                self.prune_quarantine(now_ms, policy.quarantine, &mut budget, &mut marks)?;
            marks.quarantine_pruned += counts.quarantine;
        }
        counts.more = budget == 0;
        if counts.total() > 0 {
            marks.last_pruned_at_ms = now_ms;
            self.set_marks(marks);
        }
        Ok(counts)
    }

    fn prune_audit(
        &mut self,
        now_ms: u64,
        keep: LogRetention,
        budget: &mut u64,
    ) -> Result<u64, StoreError> {
        let start = self.meta.audit_anchor.map_or(0, |(i, _)| i + 1);
        let end = self.meta.next_audit;
        if !self.front_due(Stream::Audit, start, end, keep, now_ms, *budget)? {
            return Ok(0);
        }
        // Never past what an audit sink has yet to deliver or parked.
        let held = self
            .tx
            .lowest_cursor(Stream::Audit, start)?
            .map_or(end, |c| c.min(end))
            .max(start);
        let mut front = Front::new(end - start, keep, now_ms, budget);
        self.tx.scan_audit_heads(start..held, &mut |index, head| {
            Ok(front.visit(index, head.recorded_at_ms))
        })?;
        let due = front.due;
        let Some(&last) = due.last() else {
            return Ok(0);
        };
        let hash = self
            .tx
            .audit(last)?
            .ok_or_else(|| AUDIT.missing(&last, "vanished while pruning"))?
            .hash;
        self.tx.remove_audit(start..=last)?;
        self.meta.audit_anchor = Some((last, hash));
        Ok(due.len() as u64)
    }

    fn prune_effects(
        &mut self,
        now_ms: u64,
        keep: LogRetention,
        budget: &mut u64,
        marks: &mut RetentionMarks,
    ) -> Result<u64, StoreError> {
        let start = marks.effects_floor;
        let len = self.meta.next_effect.saturating_sub(start);
        // Never into the window (the effect log is its time index), nor past what a relay
        // sink has yet to deliver or parked.
        let window = self.meta.window_start.max(start);
        if !self.front_due(Stream::Effects, start, window, keep, now_ms, *budget)? {
            return Ok(0);
        }
        let end = self
            .tx
            .lowest_cursor(Stream::Effects, start)?
            .map_or(window, |c| c.min(window))
            .max(start);
        let mut front = Front::new(len, keep, now_ms, budget);
        self.tx.scan_effect_heads(start..end, &mut |offset, head| {
            Ok(front.visit(offset, head.received_at_ms))
        })?;
        let due = front.due;
        let Some(&last) = due.last() else {
            return Ok(0);
        };
        self.tx.remove_effects(start..=last)?;
        marks.effects_floor = last + 1;
        Ok(due.len() as u64)
    }

    /// Whether the oldest entry of a log (at `start`, of those below `end`) is due: one read,
    /// so a commit with nothing to prune never reads the sinks' cursors (the lowest cursor is
    /// read only by a commit that will prune, once per log).
    fn front_due(
        &mut self,
        stream: Stream,
        start: u64,
        end: u64,
        keep: LogRetention,
        now_ms: u64,
        budget: u64,
    ) -> Result<bool, StoreError> {
        if budget == 0 || start >= end {
            return Ok(false);
        }
        let len = match stream {
            Stream::Audit => self.meta.next_audit,
            Stream::Effects => self.meta.next_effect,
        }
        .saturating_sub(start);
        let mut one = 1;
        let mut front = Front::new(len, keep, now_ms, &mut one);
        match stream {
            Stream::Audit => self
                .tx
                .scan_audit_heads(start..start + 1, &mut |index, head| {
                    Ok(front.visit(index, head.recorded_at_ms))
                })?,
            Stream::Effects => self
                .tx
                .scan_effect_heads(start..start + 1, &mut |offset, head| {
                    Ok(front.visit(offset, head.received_at_ms))
                })?,
        }
        Ok(!front.due.is_empty())
    }

    fn prune_quarantine(
        &mut self,
        now_ms: u64,
        keep: LogRetention,
        budget: &mut u64,
        marks: &mut RetentionMarks,
    ) -> Result<u64, StoreError> {
        let start = marks.quarantine_floor;
        let len = self.tx.quarantine_len()?;
        // Ids are taken in order of first receipt; released and discarded ids are already gone.
        let mut front = Front::new(len, keep, now_ms, budget);
        self.tx.scan_quarantine(
            start,
            &mut |id, rec| Ok(front.visit(id, rec.received_at_ms)),
        )?;
        let due = front.due;
        for id in &due {
            self.forget_quarantined(*id)?;
        }
        if let Some(&last) = due.last() {
            marks.quarantine_floor = last + 1;
        }
        Ok(due.len() as u64)
    }

    /// Removes quarantine record `id` and its fingerprint entries.
    pub(super) fn forget_quarantined(&mut self, id: u64) -> Result<(), StoreError> {
        self.tx.remove_quarantined(id)?;
        self.tx.forget_fingerprint(id)
    }
}

/// Collects the keys at the front of a log that `keep` no longer keeps, oldest first, at
/// most `budget` of them (taken from it), from a scan of (key, time of recording or receipt).
/// `len` is how many entries the log holds. Stops the scan at the first entry still kept.
struct Front<'b> {
    len: u64,
    keep: LogRetention,
    cutoff: Option<u64>,
    budget: &'b mut u64,
    due: Vec<u64>,
}

impl<'b> Front<'b> {
    fn new(len: u64, keep: LogRetention, now_ms: u64, budget: &'b mut u64) -> Front<'b> {
        Front {
            len,
            keep,
            cutoff: keep.cutoff(now_ms),
            budget,
            due: Vec::new(),
        }
    }

    fn visit(&mut self, key: u64, time: u64) -> ControlFlow<()> {
        if *self.budget == 0 {
            return ControlFlow::Break(());
        }
        let too_old = self.cutoff.is_some_and(|c| time < c);
        let too_many = self.keep.max_entries.is_some_and(|m| self.len > m);
        if !(too_old || too_many) {
            return ControlFlow::Break(());
        }
        self.due.push(key);
        self.len -= 1;
        *self.budget -= 1;
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::verify::verify;
    use crate::store::{Incoming, Resolution, Store, StoreOptions};
    use crate::wire::FeedContract;

    const T0: u64 = 1_800_000_000_000;
    const DAY: u64 = 86_400_000;

    fn msg(seq: u64, body: &str) -> Vec<u8> {
        format!(r#"{{"agency":"A","source_id":"S","epoch":0,"sequence":{seq},"b":"{body}"}}"#)
            .into_bytes()
    }

    fn batch(payloads: Vec<Vec<u8>>, at: u64) -> Vec<Incoming> {
        let c = FeedContract::default();
        payloads
            .into_iter()
            .map(|p| Incoming::decode("t", p, at, &c))
            .collect()
    }

    fn store(dir: &tempfile::TempDir, retention: RetentionPolicy) -> Store {
        let mut opts = StoreOptions {
            retention,
            ..StoreOptions::default()
        };
        opts.window.seconds = 60;
        Store::open(&dir.path().join("r.redb"), opts, 1_000).unwrap()
    }

    fn days(d: u64) -> LogRetention {
        LogRetention {
            max_age_seconds: Some(d * 86_400),
            max_entries: None,
        }
    }

    #[test]
    fn pruning_by_age_keeps_the_window_and_a_verifiable_chain() {
        let dir = tempfile::tempdir().unwrap();
        let policy = RetentionPolicy {
            audit: days(2),
            effects: days(2),
            quarantine: days(2),
        };
        let mut s = store(&dir, policy);
        // Day 0: 10 applied, 1 duplicate, 1 conflict (quarantined).
        let mut day0: Vec<_> = (1..=10).map(|q| msg(q, "x")).collect();
        day0.push(msg(3, "x"));
        day0.push(msg(4, "changed"));
        s.commit_batch(&batch(day0, T0), T0).unwrap();
        // Day 3: 5 more; everything from day 0 is now older than 2 days.
        let day3 = T0 + 3 * DAY;
        let r = s
            .commit_batch(&batch((11..=15).map(|q| msg(q, "x")).collect(), day3), day3)
            .unwrap();
        assert_eq!(
            (r.pruned.audit, r.pruned.effects, r.pruned.quarantine),
            (12, 10, 1),
            "{:?}",
            r.pruned
        );
        let snap = s.reader().unwrap();
        let meta = snap.meta().unwrap();
        assert_eq!(meta.audit_anchor.map(|a| a.0), Some(11));
        let marks = snap.retention_marks().unwrap();
        assert_eq!((marks.effects_floor, marks.quarantine_floor), (10, 1));
        // The window (effects 10..15 received on day 3) is untouched.
        assert_eq!(snap.summary().unwrap().window_entries, 5);
        let report = verify(&snap, &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
        assert_eq!((report.audit_from, report.audit_entries), (12, 5));
        // A replay of a pruned, evicted message is stale, never applied again.
        drop(snap);
        let r = s
            .commit_batch(&batch(vec![msg(2, "x")], day3 + 1), day3 + 1)
            .unwrap();
        assert_eq!(r.decided[0].outcome, crate::model::Outcome::Stale);
        assert_eq!(
            verify(&s.reader().unwrap(), &FeedContract::default())
                .unwrap()
                .violation,
            None
        );
    }

    #[test]
    fn pruning_by_count_goes_a_slice_per_commit_and_never_into_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let keep = LogRetention {
            max_age_seconds: None,
            max_entries: Some(100),
        };
        let policy = RetentionPolicy {
            audit: keep,
            effects: keep,
            quarantine: keep,
        };
        let mut s = store(&dir, policy);
        let n = PRUNE_SLICE + 500;
        // All within the window's 60 s: effects stay, the audit log is cut to 100.
        let r = s
            .commit_batch(&batch((1..=n).map(|q| msg(q, "x")).collect(), T0), T0)
            .unwrap();
        assert!(r.pruned.more, "{:?}", r.pruned);
        assert_eq!(r.pruned.audit, PRUNE_SLICE);
        assert_eq!(
            r.pruned.effects, 0,
            "effects in the window are never pruned"
        );
        let r = s.commit_batch(&[], T0 + 1).unwrap();
        assert_eq!(r.pruned.audit, n - PRUNE_SLICE - 100);
        assert!(!r.pruned.more);
        // After the window passes, the effect log is cut to 100 too (a slice at a time).
        let later = T0 + 120_000;
        let mut pruned = 0;
        for i in 0..3 {
            pruned += s.commit_batch(&[], later + i).unwrap().pruned.effects;
        }
        assert_eq!(pruned, n - 100);
        let snap = s.reader().unwrap();
        assert_eq!(
            verify(&snap, &FeedContract::default()).unwrap().violation,
            None
        );
        assert_eq!(snap.summary().unwrap().window_entries, 0);
    }

    #[test]
    fn release_and_discard_are_audited_and_verified() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(&dir, RetentionPolicy::keep_all());
        let r = s
            .commit_batch(
                &batch(vec![msg(1, "a"), msg(1, "b"), b"{oops".to_vec()], T0),
                T0,
            )
            .unwrap();
        let conflict = r.decided[1].quarantine_id.unwrap();
        let malformed = r.decided[2].quarantine_id.unwrap();
        let who = |reason: &str| Resolution::Release {
            operator: "alice".into(),
            reason: reason.into(),
        };
        let c = FeedContract::default();
        let e = s
            .resolve_quarantined(malformed, &who("no"), &c, T0 + 1)
            .unwrap_err();
        assert!(e.to_string().contains("malformed"), "{e}");
        let d = s
            .resolve_quarantined(conflict, &who("IC confirmed by radio"), &c, T0 + 2)
            .unwrap();
        assert_eq!(d.outcome, crate::model::Outcome::Released);
        assert_eq!(d.effect_offset, Some(1));
        let gone = s
            .resolve_quarantined(conflict, &who("again"), &c, T0 + 3)
            .unwrap_err();
        assert!(gone.to_string().contains("does not exist"), "{gone}");
        let discard = Resolution::Discard {
            operator: "bob".into(),
            reason: "test rig noise".into(),
        };
        s.resolve_quarantined(malformed, &discard, &c, T0 + 4)
            .unwrap();
        // The released bytes are now the window's version: a replay is a duplicate of it.
        let r = s
            .commit_batch(&batch(vec![msg(1, "b"), msg(1, "a")], T0 + 5), T0 + 5)
            .unwrap();
        assert_eq!(r.decided[0].outcome, crate::model::Outcome::Duplicate);
        assert_eq!(r.decided[0].effect_offset, Some(1));
        assert_eq!(r.decided[1].outcome, crate::model::Outcome::Conflict);
        // That replay of the original is quarantined again; releasing it would apply "a" a
        // second time: refused, naming the effect that already holds it.
        let again = r.decided[1].quarantine_id.unwrap();
        let twice = s
            .resolve_quarantined(again, &who("looks genuine"), &c, T0 + 6)
            .unwrap_err();
        assert!(
            twice.to_string().contains("already applied as effect #0"),
            "{twice}"
        );
        let snap = s.reader().unwrap();
        let eff = snap.effect(1).unwrap().unwrap();
        assert!(eff.record.released);
        let audit = snap.audit_entry(d.audit_index).unwrap().unwrap();
        assert_eq!(
            audit.record.reason,
            format!("quarantine #{conflict} released by alice: IC confirmed by radio")
        );
        assert!(snap.quarantined(conflict).unwrap().is_none());
        let report = verify(&snap, &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
        assert_eq!(report.counts.get(crate::model::Outcome::Released), 1);
        assert_eq!(report.counts.get(crate::model::Outcome::Discarded), 1);
    }

    #[test]
    fn a_release_under_another_digest_contract_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store(&dir, RetentionPolicy::keep_all());
        // `run` ignores "/b" in the digest; the operator's contract does not.
        let run_contract = FeedContract {
            digest_ignore: vec![crate::json::Pointer::parse("/b").unwrap()],
            ..FeedContract::default()
        };
        let conflicting =
            r#"{"agency":"A","source_id":"S","epoch":0,"sequence":1,"b":"y","c":2}"#.to_string();
        let batch: Vec<Incoming> = [msg(1, "a"), conflicting.into_bytes()]
            .into_iter()
            .map(|p| Incoming::decode("t", p, T0, &run_contract))
            .collect();
        let r = s.commit_batch(&batch, T0).unwrap();
        assert_eq!(r.decided[1].outcome, crate::model::Outcome::Conflict);
        let q = r.decided[1].quarantine_id.unwrap();
        let release = Resolution::Release {
            operator: "alice".into(),
            reason: "r".into(),
        };
        let e = s
            .resolve_quarantined(q, &release, &FeedContract::default(), T0 + 1)
            .unwrap_err();
        assert!(e.to_string().contains("digest"), "{e}");
        // With `run`'s own contract it goes through.
        s.resolve_quarantined(q, &release, &run_contract, T0 + 2)
            .unwrap();
    }
}
