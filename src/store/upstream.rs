//! The record of losses upstream of the store (`tables::UpstreamLosses`, meta record
//! "upstream"): confirmed gaps and broker sessions found lost at a connect, kept bounded
//! (totals, per-minute counts of the last hour, the newest events, the client ids `run`
//! consumed under) so `health` and the metrics read it with one point read. Its rules take
//! the time as a parameter; the writes happen in the caller's transaction (`Tx`).
//!
//! A gap a batch reveals is only a *candidate* (`GapCandidates`, in the writer's memory): a
//! reordering feed, or another member of a shared subscription, delivers the sequences
//! between moments later. After the grace, `confirm_gaps` reads which of them the window now
//! holds and records only what is still missing.

use std::collections::BTreeMap;

use super::StoreError;
use super::tables::{ConnectEvent, Consumer, GapEvent, LossMinute, SessionLoss, UpstreamLosses};
use super::tx::Tx;
use crate::decide::Gap;

/// Minutes of per-minute counts kept: the last hour.
pub const MINUTES: u64 = 60;
/// Gap events and session losses kept, each (the newest).
pub const RECENT: usize = 32;
/// Client ids remembered (the oldest forgotten first).
pub const CONSUMERS: usize = 16;
/// Connects kept in `UpstreamLosses::recent_connects`.
pub const CONNECTS: usize = 64;

const MINUTE_MS: u64 = 60_000;

/// Losses reported: since the store was created, or within an hour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossCounts {
    pub gap_events: u64,
    pub missing_sequences: u64,
    pub sessions_lost: u64,
}

/// A gap a batch revealed, for the caller to report (`run` and `ingest` log and count it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedGap {
    pub agency: String,
    pub source_id: String,
    pub gap: crate::decide::Gap,
}

/// What `confirm_gaps` found of its candidates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GapCheck {
    /// Still missing: recorded as upstream losses (and warned by the caller).
    pub missing: Vec<ReportedGap>,
    /// No longer checkable (the window evicted the positions around them before the check):
    /// warned here as possible gaps, neither recorded nor counted as losses.
    pub unknown: Vec<ReportedGap>,
}

/// Gap candidates kept waiting at most: beyond that the ones due soonest are confirmed at
/// once, so a feed losing much cannot grow the writer's memory without bound.
pub const MAX_CANDIDATES: usize = 10_000;

/// (agency, source_id, epoch, first missing sequence) -> (last missing sequence, due).
type CandidateKey = (String, String, u64, u64);

/// Gaps waiting for their grace to pass before `confirm_gaps` checks what is still missing.
/// Candidates of one source and epoch that overlap or touch are merged (the earlier due
/// wins). Times are the caller's clock in milliseconds (`run`: a monotonic one).
#[derive(Debug, Default)]
pub struct GapCandidates {
    pending: BTreeMap<CandidateKey, (u64, u64)>,
}

impl GapCandidates {
    /// Adds `gaps`, each due at `due`.
    pub fn add(&mut self, gaps: impl IntoIterator<Item = ReportedGap>, due: u64) {
        for g in gaps {
            let (mut from, mut to, mut due) = (g.gap.from, g.gap.to, due);
            loop {
                // The candidate starting highest at or below `to + 1`, if it reaches `from - 1`.
                let lo = (g.agency.clone(), g.source_id.clone(), g.gap.epoch, 0);
                let hi = (
                    g.agency.clone(),
                    g.source_id.clone(),
                    g.gap.epoch,
                    to.saturating_add(1),
                );
                let touching = self
                    .pending
                    .range(lo..=hi)
                    .next_back()
                    .filter(|(_, (end, _))| end.saturating_add(1) >= from)
                    .map(|(k, v)| (k.clone(), *v));
                let Some((key, (end, d))) = touching else {
                    break;
                };
                self.pending.remove(&key);
                from = from.min(key.3);
                to = to.max(end);
                due = due.min(d);
            }
            self.pending
                .insert((g.agency, g.source_id, g.gap.epoch, from), (to, due));
        }
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// When the next candidate is due.
    pub fn next_due(&self) -> Option<u64> {
        self.pending.values().map(|(_, due)| *due).min()
    }

    /// Removes and returns the candidates due at `now`, and, while more than
    /// `MAX_CANDIDATES` would stay, the ones due soonest.
    pub fn take_due(&mut self, now: u64) -> Vec<ReportedGap> {
        let mut due: Vec<CandidateKey> = self
            .pending
            .iter()
            .filter(|(_, (_, d))| *d <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let over = self
            .pending
            .len()
            .saturating_sub(due.len() + MAX_CANDIDATES);
        if over > 0 {
            let mut rest: Vec<(u64, &CandidateKey)> = self
                .pending
                .iter()
                .filter(|(_, (_, d))| *d > now)
                .map(|(k, (_, d))| (*d, k))
                .collect();
            rest.sort_unstable();
            due.extend(rest.into_iter().take(over).map(|(_, k)| k.clone()));
        }
        self.take(due)
    }

    /// Removes and returns every candidate (at the end of the input, or at shutdown).
    pub fn take_all(&mut self) -> Vec<ReportedGap> {
        let keys: Vec<CandidateKey> = self.pending.keys().cloned().collect();
        self.take(keys)
    }

    fn take(&mut self, keys: Vec<CandidateKey>) -> Vec<ReportedGap> {
        keys.into_iter()
            .filter_map(|k| {
                let (to, _) = self.pending.remove(&k)?;
                let (agency, source_id, epoch, from) = k;
                Some(ReportedGap {
                    agency,
                    source_id,
                    gap: Gap { epoch, from, to },
                })
            })
            .collect()
    }
}

/// What is still missing of `candidates` now, in one transaction: for each, the sequences
/// the window holds are read as ranges (`Tx::window_present`) and the rest reported (a
/// candidate may split into several gaps, or vanish). Sequences at or below the source's
/// evicted floor are unknown (a message there may have arrived and been evicted since) and
/// never reported as missing: they are warned as possible gaps and returned as `unknown`.
/// Records what it reports missing (`UpstreamLosses::note_gaps`) and returns both.
pub(crate) fn confirm_gaps(
    tx: &mut impl Tx,
    candidates: &[ReportedGap],
    now_ms: u64,
) -> Result<GapCheck, StoreError> {
    let mut missing = Vec::new();
    let mut unknown = Vec::new();
    for c in candidates {
        let Some(no) = tx.source_no(&c.agency, &c.source_id)? else {
            continue; // nothing known of the source: nothing to confirm against
        };
        let mut from = c.gap.from;
        if let Some((epoch, seq)) = tx.source(no)?.and_then(|r| r.evicted_floor) {
            if epoch > c.gap.epoch || (epoch == c.gap.epoch && seq >= c.gap.to) {
                unknown.push(warn_unknown(c, c.gap.from, c.gap.to));
                continue;
            }
            if epoch == c.gap.epoch && seq >= from {
                unknown.push(warn_unknown(c, from, seq));
                from = seq + 1;
            }
        }
        let present = tx.window_present(no, c.gap.epoch, from..=c.gap.to)?;
        for (a, b) in holes(from, c.gap.to, &present) {
            missing.push(ReportedGap {
                agency: c.agency.clone(),
                source_id: c.source_id.clone(),
                gap: Gap {
                    epoch: c.gap.epoch,
                    from: a,
                    to: b,
                },
            });
        }
    }
    if !missing.is_empty() {
        let mut rec = tx.upstream_losses()?.unwrap_or_default();
        rec.note_gaps(&missing, now_ms);
        tx.put_upstream_losses(&rec)?;
    }
    Ok(GapCheck { missing, unknown })
}

/// Says, as a warning, that sequences `from..=to` of candidate `c` can no longer be told
/// missing or not: the window evicted the positions around them before they were checked (a
/// window smaller than what arrived meanwhile). Neither counted nor recorded as a loss, but
/// never silent: `gaps` reads the audit log, which still tells. Returns that range of `c`.
fn warn_unknown(c: &ReportedGap, from: u64, to: u64) -> ReportedGap {
    let agency = crate::textsafe::escape_controls(&c.agency);
    let source_id = crate::textsafe::escape_controls(&c.source_id);
    let epoch = c.gap.epoch;
    tracing::warn!(
        outcome = "gap",
        agency = %c.agency,
        source_id = %c.source_id,
        epoch,
        unconfirmed_from = from,
        unconfirmed_to = to,
        "possible upstream gap: {agency}/{source_id} epoch {epoch} {from}-{to} was missing when \
         a later sequence was applied, and the window evicted those positions before it was \
         checked: `gaps --source {agency}/{source_id}` tells from the audit log"
    );
    ReportedGap {
        gap: crate::decide::Gap { epoch, from, to },
        ..c.clone()
    }
}

/// The ranges of `from..=to` not covered by `present` (sorted, disjoint, within it).
fn holes(from: u64, to: u64, present: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut next = Some(from);
    for &(a, b) in present {
        let Some(n) = next else { break };
        if a > n {
            out.push((n, a - 1));
        }
        next = b.checked_add(1).map(|x| x.max(n));
    }
    if let Some(n) = next
        && n <= to
    {
        out.push((n, to));
    }
    out
}

/// Who a batch's deliveries came from: `run`'s MQTT client id and broker, recorded with the
/// batch (`UpstreamLosses::consumers`) so that a later connect finding no session under that
/// id is known to be a loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumedAs {
    pub client_id: String,
    pub broker: String,
}

/// A store handle's note of whom it consumes as, and whether a commit recorded it yet (so
/// that the batches after the first read nothing more for it).
#[derive(Debug, Default)]
pub(crate) struct Consumption {
    current: Option<ConsumedAs>,
    recorded: bool,
}

impl Consumption {
    pub(crate) fn set(&mut self, c: ConsumedAs) {
        if self.current.as_ref() != Some(&c) {
            self.current = Some(c);
            self.recorded = false;
        }
    }

    /// What the next batch records, if it is not recorded yet.
    pub(crate) fn pending(&self) -> Option<&ConsumedAs> {
        self.current.as_ref().filter(|_| !self.recorded)
    }

    /// A batch recording `pending` committed.
    pub(crate) fn committed(&mut self) {
        self.recorded = self.current.is_some();
    }
}

impl UpstreamLosses {
    /// The bucket of the minute of `now_ms`, after dropping those an hour old or older. A
    /// clock stepped back counts in the newest bucket.
    fn bucket(&mut self, now_ms: u64) -> &mut LossMinute {
        let minute = now_ms / MINUTE_MS;
        self.minutes
            .retain(|m| m.minute + MINUTES > minute || m.minute > minute);
        match self.minutes.last() {
            Some(last) if last.minute >= minute => {}
            _ => self.minutes.push(LossMinute {
                minute,
                ..LossMinute::default()
            }),
        }
        while self.minutes.len() as u64 > MINUTES {
            self.minutes.remove(0);
        }
        let n = self.minutes.len() - 1;
        &mut self.minutes[n]
    }

    /// Counts the gaps one batch reported at `now_ms`.
    pub fn note_gaps(&mut self, gaps: &[ReportedGap], now_ms: u64) {
        if gaps.is_empty() {
            return;
        }
        let missing = crate::decide::total_missing(gaps.iter().map(|g| g.gap.missing()));
        let events = gaps.len() as u64;
        self.gap_events += events;
        self.missing_sequences = self.missing_sequences.saturating_add(missing);
        let b = self.bucket(now_ms);
        b.gap_events += events;
        b.missing_sequences = b.missing_sequences.saturating_add(missing);
        for g in gaps {
            self.recent_gaps.push(GapEvent {
                at_ms: now_ms,
                agency: g.agency.clone(),
                source_id: g.source_id.clone(),
                epoch: g.gap.epoch,
                from: g.gap.from,
                to: g.gap.to,
            });
        }
        let over = self.recent_gaps.len().saturating_sub(RECENT);
        self.recent_gaps.drain(..over);
    }

    /// Counts a lost session.
    pub fn note_session_lost(&mut self, loss: SessionLoss) {
        self.sessions_lost += 1;
        self.bucket(loss.at_ms).sessions_lost += 1;
        self.recent_sessions_lost.push(loss);
        let over = self.recent_sessions_lost.len().saturating_sub(RECENT);
        self.recent_sessions_lost.drain(..over);
    }

    /// Whether `run` committed deliveries under `client_id` before.
    pub fn consumed_under(&self, client_id: &str) -> bool {
        self.consumers.iter().any(|c| c.client_id == client_id)
    }

    /// Remembers that `run` commits deliveries under `client_id` (from `broker`); whether
    /// that is news (the record changed).
    pub fn note_consumer(&mut self, client_id: &str, broker: &str, now_ms: u64) -> bool {
        if self.consumed_under(client_id) {
            return false;
        }
        self.consumers.push(Consumer {
            client_id: client_id.into(),
            broker: broker.into(),
            since_ms: now_ms,
        });
        let over = self.consumers.len().saturating_sub(CONSUMERS);
        self.consumers.drain(..over);
        true
    }

    /// The losses reported in the hour before `now_ms` (by whole minutes).
    pub fn last_hour(&self, now_ms: u64) -> LossCounts {
        let minute = now_ms / MINUTE_MS;
        self.minutes
            .iter()
            .filter(|m| m.minute + MINUTES > minute)
            .fold(LossCounts::default(), |h, m| LossCounts {
                gap_events: h.gap_events + m.gap_events,
                missing_sequences: h.missing_sequences.saturating_add(m.missing_sequences),
                sessions_lost: h.sessions_lost + m.sessions_lost,
            })
    }
}

/// Notes a connect (every one: the after-action report draws the broker switches) and what
/// it told about the session: `Some` with the loss recorded when the broker kept no session
/// (`session_present` false) for a client id the store consumed under. A first connect
/// under a client id is no loss: nothing was queued for it yet.
pub(crate) fn note_connect(
    tx: &mut impl Tx,
    broker: &str,
    client_id: &str,
    session_present: bool,
    now_ms: u64,
) -> Result<Option<SessionLoss>, StoreError> {
    let mut rec = tx.upstream_losses()?.unwrap_or_default();
    rec.recent_connects.push(ConnectEvent {
        at_ms: now_ms,
        broker: broker.into(),
        client_id: client_id.into(),
        session_present,
    });
    let over = rec.recent_connects.len().saturating_sub(CONNECTS);
    rec.recent_connects.drain(..over);
    let loss = (!session_present && rec.consumed_under(client_id)).then(|| SessionLoss {
        at_ms: now_ms,
        broker: broker.into(),
        client_id: client_id.into(),
    });
    if let Some(l) = &loss {
        rec.note_session_lost(l.clone());
    }
    tx.put_upstream_losses(&rec)?;
    Ok(loss)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gap(from: u64, to: u64) -> ReportedGap {
        ReportedGap {
            agency: "fire".into(),
            source_id: "engine-7".into(),
            gap: Gap { epoch: 3, from, to },
        }
    }

    const T0: u64 = 1_800_000_000_000;

    #[test]
    fn a_hostile_jump_saturates_the_counts_instead_of_cancelling_a_real_loss() {
        // 0 then 2^64 - 999 opens a gap of 2^64 - 1000 sequences: added to a real loss of
        // 1,000 in a plain u64 it wraps to 0, and health would read "nothing missing".
        let hostile = gap(1, u64::MAX - 999);
        assert!(hostile.gap.implausible() && !gap(1, 1000).gap.implausible());
        let mut r = UpstreamLosses::default();
        r.note_gaps(&[gap(1, 1000), hostile.clone()], T0);
        assert_eq!(r.missing_sequences, u64::MAX);
        assert_eq!(r.last_hour(T0).missing_sequences, u64::MAX);
        // Batch by batch too.
        let mut r = UpstreamLosses::default();
        r.note_gaps(&[hostile], T0);
        r.note_gaps(&[gap(1, 1000)], T0);
        assert_eq!(r.missing_sequences, u64::MAX);
        assert_eq!(r.last_hour(T0).missing_sequences, u64::MAX);
    }

    #[test]
    fn buckets_older_than_an_hour_age_out_while_totals_stay() {
        let mut r = UpstreamLosses::default();
        r.note_gaps(&[gap(1001, 3000)], T0);
        r.note_gaps(&[gap(5, 5), gap(7, 8)], T0 + 30 * MINUTE_MS);
        let h = r.last_hour(T0 + 30 * MINUTE_MS);
        assert_eq!((h.gap_events, h.missing_sequences), (3, 2003));
        // 59 minutes after the first: still within the hour; 60: aged out.
        assert_eq!(r.last_hour(T0 + 59 * MINUTE_MS).missing_sequences, 2003);
        assert_eq!(r.last_hour(T0 + 60 * MINUTE_MS).missing_sequences, 3);
        assert_eq!(r.last_hour(T0 + 91 * MINUTE_MS), LossCounts::default());
        // A write drops the aged buckets; the totals keep everything.
        r.note_session_lost(SessionLoss {
            at_ms: T0 + 61 * MINUTE_MS,
            broker: "mqtt://b".into(),
            client_id: "rg".into(),
        });
        assert_eq!(r.minutes.len(), 2);
        assert_eq!(
            (r.gap_events, r.missing_sequences, r.sessions_lost),
            (3, 2003, 1)
        );
        let h = r.last_hour(T0 + 61 * MINUTE_MS);
        assert_eq!((h.gap_events, h.sessions_lost), (2, 1));
    }

    #[test]
    fn the_record_stays_bounded_whatever_the_history() {
        let mut r = UpstreamLosses::default();
        for i in 0..500u64 {
            r.note_gaps(&[gap(i * 10, i * 10 + 1)], T0 + i * MINUTE_MS);
            r.note_consumer(&format!("c{i}"), "mqtt://b", T0);
        }
        assert_eq!(r.minutes.len() as u64, MINUTES);
        assert_eq!(r.recent_gaps.len(), RECENT);
        assert_eq!(r.recent_gaps.last().unwrap().from, 4990, "the newest kept");
        assert_eq!(r.consumers.len(), CONSUMERS);
        assert_eq!(r.gap_events, 500);
        assert_eq!(r.last_hour(T0 + 499 * MINUTE_MS).gap_events, 60);
    }

    #[test]
    fn a_clock_stepped_back_counts_in_the_newest_minute() {
        let mut r = UpstreamLosses::default();
        r.note_gaps(&[gap(1, 1)], T0);
        r.note_gaps(&[gap(3, 3)], T0 - 5 * MINUTE_MS);
        assert_eq!(r.minutes.len(), 1);
        assert_eq!(r.last_hour(T0).gap_events, 2);
    }

    #[test]
    fn holes_are_what_the_present_ranges_leave() {
        assert_eq!(holes(1, 10, &[]), vec![(1, 10)]);
        assert_eq!(holes(1, 10, &[(1, 10)]), vec![]);
        assert_eq!(holes(6, 9, &[(6, 6), (8, 8)]), vec![(7, 7), (9, 9)]);
        assert_eq!(holes(2, 9, &[(2, 5)]), vec![(6, 9)]);
        assert_eq!(holes(1, u64::MAX, &[(5, u64::MAX)]), vec![(1, 4)]);
    }

    #[test]
    fn candidates_wait_for_their_due_and_touching_ones_merge() {
        let mut c = GapCandidates::default();
        c.add([gap(10, 20)], 100);
        c.add([gap(21, 30), gap(50, 60)], 200);
        assert_eq!(c.len(), 2, "10-20 and 21-30 touch: one candidate");
        assert_eq!(c.next_due(), Some(100));
        assert_eq!(c.take_due(99), vec![]);
        assert_eq!(c.take_due(100), vec![gap(10, 30)], "the earlier due wins");
        // Another epoch or source never merges.
        let mut other = gap(40, 61);
        other.gap.epoch = 4;
        c.add([other.clone(), gap(55, 70)], 300);
        assert_eq!(c.len(), 2);
        assert_eq!(c.take_all(), vec![gap(50, 70), other]);
        assert!(c.is_empty());
        assert_eq!(c.next_due(), None);
    }

    #[test]
    fn beyond_the_bound_the_soonest_due_are_taken_at_once() {
        let mut c = GapCandidates::default();
        for i in 0..(MAX_CANDIDATES as u64 + 3) {
            c.add([gap(i * 10, i * 10 + 1)], 1_000 + i);
        }
        let taken = c.take_due(0);
        assert_eq!(taken.len(), 3);
        assert_eq!(
            taken.iter().map(|g| g.gap.from).collect::<Vec<_>>(),
            [0, 10, 20]
        );
        assert_eq!(c.len(), MAX_CANDIDATES);
    }

    #[test]
    fn a_client_id_is_a_consumer_once() {
        let mut r = UpstreamLosses::default();
        assert!(!r.consumed_under("rg"));
        assert!(r.note_consumer("rg", "mqtt://a", T0));
        assert!(!r.note_consumer("rg", "mqtt://b", T0 + 1));
        assert!(r.consumed_under("rg"));
        assert_eq!(r.consumers.len(), 1);
    }
}
