//! Fixtures shared by the unit tests and the integration suite (`tests/it/`), so that the same
//! feed and the same parked event mean the same thing on both sides. Not part of the product's
//! interface.

use std::ops::RangeInclusive;

use crate::store::tables::ParkedRecord;
use crate::store::{Backend, BatchReport, Snapshot, Store, StoreError};
use crate::wire::{FeedContract, Incoming};

/// The fixtures' clock: 2027-01-15T08:00:00Z in milliseconds.
pub const T0: u64 = 1_800_000_000_000;

/// A store `feed` commits to: the redb `Store` the unit tests hold, or either `Backend`.
pub trait CommitBatch {
    fn commit_batch(&mut self, batch: &[Incoming], now_ms: u64) -> Result<BatchReport, StoreError>;
}

impl CommitBatch for Store {
    fn commit_batch(&mut self, batch: &[Incoming], now_ms: u64) -> Result<BatchReport, StoreError> {
        Store::commit_batch(self, batch, now_ms)
    }
}

impl CommitBatch for Backend {
    fn commit_batch(&mut self, batch: &[Incoming], now_ms: u64) -> Result<BatchReport, StoreError> {
        Backend::commit_batch(self, batch, now_ms)
    }
}

/// Commits, as one batch at `at`, one message of source `A`/`S` on topic `t` per sequence
/// number in `seqs` (each an effect). Panics if the commit fails.
pub fn feed(s: &mut impl CommitBatch, seqs: RangeInclusive<u64>, at: u64) {
    let c = FeedContract::default();
    let batch: Vec<Incoming> = seqs
        .clone()
        .map(|q| {
            let p = format!(r#"{{"agency":"A","source_id":"S","sequence":{q}}}"#);
            Incoming::decode("t", p.into_bytes(), at, &c)
        })
        .collect();
    if let Err(e) = s.commit_batch(&batch, at) {
        panic!("feeding sequences {seqs:?}: {e}");
    }
}

/// The event a sink would park at `offset` of the store `snap` views: made from the effect
/// there (as `verify` checks a parked event), refused with HTTP 422; `blocking` as given.
/// Panics if there is no effect at `offset`.
pub fn parked(snap: &Snapshot, offset: u64, blocking: bool) -> (u64, ParkedRecord) {
    use crate::relay::envelope::{EffectView, envelope, event_id};
    let e = match snap.effect(offset) {
        Ok(Some(e)) => e,
        other => panic!("no effect at offset {offset}: {other:?}"),
    };
    let r = &e.record;
    (
        offset,
        ParkedRecord {
            parked_at_ms: T0,
            id: event_id(&r.key, r.released, &r.payload),
            key: r.key,
            agency: r.agency.clone(),
            source_id: r.source_id.clone(),
            topic: r.topic.clone(),
            reason: "HTTP 422".into(),
            response: "HTTP/1.1 422 Unprocessable Entity".into(),
            attempts: 1,
            blocking,
            retry_requested_at_ms: None,
            event: envelope("urn:test", &EffectView::of(offset, r)),
        },
    )
}

/// The relay's one failpoint, for the supervisor's test: while the file named by the
/// environment variable `REPLAY_GUARD_TEST_SINK_PANIC` exists and holds sink `sink`'s name,
/// each start of that sink's task panics. Unset (always, outside that test), it costs one
/// environment lookup per task start.
pub fn sink_panic_requested(sink: &str) -> bool {
    std::env::var_os("REPLAY_GUARD_TEST_SINK_PANIC")
        .and_then(|path| std::fs::read_to_string(path).ok())
        .is_some_and(|name| name.trim() == sink)
}

/// The relay's test hook for the PostgreSQL wake-up's test: with the environment variable
/// `REPLAY_GUARD_TEST_RELAY_POLL_MS` set, the relay's head poll and an idle sink's look for
/// new events wait that many milliseconds instead of `default`, so only a notification wakes
/// it in time. Unset (always, outside that test), `default`.
pub fn relay_poll(default: std::time::Duration) -> std::time::Duration {
    std::env::var("REPLAY_GUARD_TEST_RELAY_POLL_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(default, std::time::Duration::from_millis)
}
