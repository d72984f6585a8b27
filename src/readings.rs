//! What one snapshot of the store says about its state: the readings `health` judges against
//! its thresholds, and the gauges that the metrics endpoint and `stats --format prometheus`
//! export. Read-only; the time is a parameter.

use std::path::Path;

use crate::config::Config;
use crate::model::{Outcome, OutcomeCounts};
use crate::store::relay::Parked;
use crate::store::tables::SinkRecord;
use crate::store::upstream::LossCounts;
use crate::store::{DiskSpace, Snapshot, StoreError};

const HOUR_MS: u64 = 3_600_000;

/// A sink's distance from the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkLag {
    pub name: String,
    pub events: u64,
    /// Age of the oldest undelivered effect (0 when caught up).
    pub age_s: u64,
    /// Events parked for an operator (`relay parked`).
    pub parked: u64,
    /// Events the receiver acknowledged since the cursor was made.
    pub delivered: u64,
    /// Events offered to the receiver again (`SinkRecord::resent`).
    pub resent: u64,
    /// When the last attempt failed (`None`: none has).
    pub last_error_ms: Option<u64>,
    /// The sink is failing (its task ended and is being restarted) or blocked (its receiver
    /// refuses every event): what its last error says.
    pub failing: Option<String>,
}

impl SinkLag {
    /// Sink `name` with cursor `rec` against the head of the log it delivers (`meta`'s);
    /// `parked` holds every sink's parked events (`Snapshot::sink_parked(None)`). Also `relay
    /// status`'s figures.
    pub fn of(
        snap: &Snapshot,
        meta: &crate::store::tables::Meta,
        (name, rec): (&str, &SinkRecord),
        parked: &[Parked],
        now: u64,
    ) -> Result<SinkLag, StoreError> {
        let audit = rec.stream() == Some(crate::store::tables::Stream::Audit);
        let head = if audit {
            meta.next_audit
        } else {
            meta.next_effect
        };
        let events = head.saturating_sub(rec.next);
        let received = if events == 0 {
            None
        } else if audit {
            snap.audit_entry(rec.next)?.map(|e| e.record.recorded_at_ms)
        } else {
            snap.effect(rec.next)?.map(|e| e.record.received_at_ms)
        };
        let age_s = received.map_or(0, |t| now.saturating_sub(t) / 1000);
        Ok(SinkLag {
            name: name.to_string(),
            events,
            age_s,
            parked: parked.iter().filter(|p| p.sink == name).count() as u64,
            delivered: rec.delivered,
            resent: rec.resent,
            last_error_ms: rec.last_error.as_ref().map(|(at, _)| *at),
            failing: rec
                .last_error
                .as_ref()
                .filter(|(_, e)| crate::relay::condition(e).is_some())
                .map(|(_, e)| e.clone()),
        })
    }
}

/// The database's size: the file's, or a PostgreSQL store's tables' (data, indexes, TOAST).
pub fn database_bytes(snap: &Snapshot, db: &Path) -> Result<u64, StoreError> {
    Ok(if snap.is_postgres() {
        snap.table_sizes()?.iter().map(|(_, a, b)| a + b).sum()
    } else {
        std::fs::metadata(db).map_or(0, |m| m.len())
    })
}

/// What the store holds, read from one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readings {
    /// Seconds since the newest audit entry (or, before the first, since creation).
    pub commit_age_s: u64,
    /// Whether any decision was recorded yet.
    pub decided: bool,
    /// Deliveries quarantined in the last hour whose record is still held (one released or
    /// discarded by an operator waits no more): counted only by `read_with_last_hour` (a scan
    /// back through an hour of audit entries and over the held records, too costly for every
    /// scrape).
    pub quarantined_1h: Option<u64>,
    pub quarantine_held: u64,
    pub window_entries: u64,
    pub window_max: u64,
    /// Age of the oldest effect in the window (`None`: the window is empty).
    pub window_oldest_age_s: Option<u64>,
    /// Decisions recorded since the store was created, by outcome (`None`: a store written
    /// before the counters were kept).
    pub decisions: Option<OutcomeCounts>,
    /// Replay bursts recorded (after reconnects) and the duplicates they absorbed in all.
    pub bursts: u64,
    pub burst_duplicates: u64,
    /// Losses upstream reported since the store was created (`store::upstream`).
    pub upstream_total: LossCounts,
    /// ... and within the last hour.
    pub upstream_1h: LossCounts,
    /// The file's size, or a PostgreSQL store's tables' (data, indexes, TOAST).
    pub database_bytes: u64,
    pub sinks: Vec<SinkLag>,
    /// `None`: a PostgreSQL store, whose disk is the server's.
    pub disk: Option<DiskSpace>,
}

impl Readings {
    /// `read`, plus the deliveries quarantined in the last hour (`health`).
    pub fn read_with_last_hour(
        snap: &Snapshot,
        db: &Path,
        config: &Config,
        now: u64,
    ) -> Result<Readings, StoreError> {
        let mut r = Readings::read(snap, db, config, now)?;
        let since = now.saturating_sub(HOUR_MS);
        let hour = snap.counts_since(since)?;
        let quarantined: u64 = [Outcome::Conflict, Outcome::Stale, Outcome::Malformed]
            .iter()
            .map(|o| hour.get(*o))
            .sum();
        // What an operator resolved (released or discarded) waits no more: only deliveries
        // whose record is still held count, at most one per held record seen in the hour.
        let held_recent = if quarantined == 0 {
            0
        } else {
            let mut n = 0u64;
            snap.scan_quarantine::<StoreError>(0, |q| {
                n += u64::from(q.record.last_seen_ms >= since);
                Ok(std::ops::ControlFlow::Continue(()))
            })?;
            n
        };
        r.quarantined_1h = Some(quarantined.min(held_recent));
        Ok(r)
    }

    /// Everything but the last hour's count: point reads and table metadata, cheap at any
    /// size (the metrics endpoint reads this at every scrape).
    pub fn read(
        snap: &Snapshot,
        db: &Path,
        config: &Config,
        now: u64,
    ) -> Result<Readings, StoreError> {
        let meta = snap.meta()?;
        let summary = snap.summary()?;
        let newest = snap.newest_audit_ms()?;
        let last = newest.unwrap_or_else(|| {
            // Retention may have pruned every entry: its last run is then the last write.
            let pruned = snap.retention_marks().map_or(0, |m| m.last_pruned_at_ms);
            meta.created_at_ms.max(pruned)
        });
        let parked = snap.sink_parked(None)?;
        let sinks = snap
            .sink_cursors()?
            .iter()
            .map(|(name, rec)| SinkLag::of(snap, &meta, (name, rec), &parked, now))
            .collect::<Result<_, _>>()?;
        let disk = if snap.is_postgres() {
            None
        } else {
            Some(crate::store::disk_space(db).map_err(|e| {
                StoreError::Refused(format!(
                    "cannot read the free space beside {}: {e}",
                    db.display()
                ))
            })?)
        };
        let bursts = snap.replay_bursts()?;
        let losses = snap.upstream_losses()?;
        Ok(Readings {
            upstream_total: LossCounts {
                gap_events: losses.gap_events,
                missing_sequences: losses.missing_sequences,
                sessions_lost: losses.sessions_lost,
            },
            upstream_1h: losses.last_hour(now),
            commit_age_s: now.saturating_sub(last) / 1000,
            decided: newest.is_some(),
            quarantined_1h: None,
            quarantine_held: summary.quarantined,
            window_entries: summary.window_entries,
            window_max: config.store.window.max_entries,
            window_oldest_age_s: snap
                .oldest_in_window_ms()?
                .map(|t| now.saturating_sub(t) / 1000),
            decisions: snap.counters()?,
            bursts: bursts.len() as u64,
            burst_duplicates: bursts.iter().map(|b| b.duplicates).sum(),
            database_bytes: database_bytes(snap, db)?,
            sinks,
            disk,
        })
    }
}
