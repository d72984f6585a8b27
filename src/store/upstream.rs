//! The record of losses upstream of the store (`tables::UpstreamLosses`, meta record
//! "upstream"): gaps a batch revealed and broker sessions found lost at a connect, kept
//! bounded (totals, per-minute counts of the last hour, the newest events, the client ids
//! `run` consumed under) so `health` and the metrics read it with one point read. Its rules
//! take the time as a parameter; the writes happen in the caller's transaction (`Tx`).

use super::StoreError;
use super::tables::{Consumer, GapEvent, LossMinute, SessionLoss, UpstreamLosses};
use super::tx::Tx;

/// Minutes of per-minute counts kept: the last hour.
pub const MINUTES: u64 = 60;
/// Gap events and session losses kept, each (the newest).
pub const RECENT: usize = 32;
/// Client ids remembered (the oldest forgotten first).
pub const CONSUMERS: usize = 16;

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
        let missing: u64 = gaps.iter().map(|g| g.gap.missing()).sum();
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

/// What a connect told about the session: `Some` with the loss recorded when the broker
/// kept no session (`session_present` false) for a client id the store consumed under.
/// A first connect under a client id is no loss: nothing was queued for it yet.
pub(crate) fn note_connect(
    tx: &mut impl Tx,
    broker: &str,
    client_id: &str,
    session_present: bool,
    now_ms: u64,
) -> Result<Option<SessionLoss>, StoreError> {
    if session_present {
        return Ok(None);
    }
    let mut rec = tx.upstream_losses()?.unwrap_or_default();
    if !rec.consumed_under(client_id) {
        return Ok(None);
    }
    let loss = SessionLoss {
        at_ms: now_ms,
        broker: broker.into(),
        client_id: client_id.into(),
    };
    rec.note_session_lost(loss.clone());
    tx.put_upstream_losses(&rec)?;
    Ok(Some(loss))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::Gap;

    fn gap(from: u64, to: u64) -> ReportedGap {
        ReportedGap {
            agency: "fire".into(),
            source_id: "engine-7".into(),
            gap: Gap { epoch: 3, from, to },
        }
    }

    const T0: u64 = 1_800_000_000_000;

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
    fn a_client_id_is_a_consumer_once() {
        let mut r = UpstreamLosses::default();
        assert!(!r.consumed_under("rg"));
        assert!(r.note_consumer("rg", "mqtt://a", T0));
        assert!(!r.note_consumer("rg", "mqtt://b", T0 + 1));
        assert!(r.consumed_under("rg"));
        assert_eq!(r.consumers.len(), 1);
    }
}
