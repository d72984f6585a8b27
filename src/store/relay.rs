//! The relay's durable state (issue 10): one cursor per sink and the events a sink parked.
//! The relay itself (`crate::relay`) lives outside the store; it reads effects with
//! `Snapshot::scan_effects` and moves its cursor only through these transactions.
//!
//! Every cursor write is a compare-and-set on the cursor's `generation` and position, so a
//! sink that an operator rewound (from another process) reloads instead of overwriting the
//! operator's move. Operator actions (`relay retry|rewind|forget`) write an audit entry with
//! outcome `relay` in the same transaction, naming the sink (in the entry's `topic`), who and
//! why.

use redb::ReadableTable;

use super::engine::Writer;
use super::guard::Leak;
use super::postgres::PgStore;
use super::read::Snapshot;
use super::redb_tx::RedbTx;
use super::tables::*;
use super::tx::Tx;
use super::{Backend, Store, StoreError, StoreOptions};
use crate::model::Outcome;

/// Where a new sink's cursor starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest effect still in the log.
    Beginning,
    /// The next effect to be committed.
    Head,
}

/// The result of a cursor write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CursorWrite {
    /// Written; the record as it now is.
    Done(SinkRecord),
    /// Not written: the cursor is not where the sink thought (an operator moved it, or
    /// forgot the sink). The sink reloads from this record (`None`: forgotten).
    Moved(Option<SinkRecord>),
}

/// One parked event of one sink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parked {
    pub sink: String,
    pub offset: u64,
    pub record: ParkedRecord,
}

/// What `relay forget` removed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forgotten {
    pub record: SinkRecord,
    pub parked: u64,
}

/// Takes the one-deliverer lock of each sink in `names` (see `SinkLocks`).
pub fn lock_sinks(path: &std::path::Path, names: &[&str]) -> Result<super::SinkLocks, StoreError> {
    super::guard::catch(|| super::file::lock_sinks(path, names))?
}

fn refused(why: String) -> StoreError {
    StoreError::Refused(why)
}

fn no_sink(name: &str) -> StoreError {
    refused(format!(
        "no sink named {name:?} has a cursor in this database (`relay status` lists them)"
    ))
}

/// The relay's writes, each one durable transaction on either backend (`Store`, `PgStore`,
/// `Backend`), written once against `Tx`. A deliverer's write first claims its sink
/// (`Tx::claim_sink`); an operator's action writes its audit entry in the same transaction.
pub trait RelayStore {
    /// Runs `f` on one write transaction's tables; commits if it returns `Ok`.
    fn relay_txn<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Tx, &StoreOptions) -> Result<R, StoreError>,
    ) -> Result<R, StoreError>;

    /// The sink's cursor, made (at `start`) if it has none. A sink's cursor is never made
    /// anywhere else, so `forget` followed by a restart starts afresh.
    fn register_sink(
        &mut self,
        name: &str,
        kind: &str,
        start: StartAt,
        now_ms: u64,
    ) -> Result<SinkRecord, StoreError> {
        self.relay_txn(|tx, _| {
            tx.claim_sink(name)?;
            if let Some(r) = tx.sink_cursor(name)? {
                return Ok(r);
            }
            let next = match start {
                StartAt::Beginning => tx.retention_marks()?.unwrap_or_default().effects_floor,
                StartAt::Head => tx.meta()?.next_effect,
            };
            let rec = SinkRecord {
                kind: kind.to_string(),
                next,
                generation: 0,
                registered_at_ms: now_ms,
                advanced_at_ms: now_ms,
                delivered: 0,
                parked: 0,
                last_error: None,
            };
            tx.put_sink_cursor(name, &rec)?;
            Ok(rec)
        })
    }

    /// Moves the sink's cursor from `from` to `to` (every effect in between delivered or, if
    /// in `parked`, parked), in one durable transaction, if the cursor is still at `from` in
    /// `generation`. Clears the last error.
    fn advance_sink(
        &mut self,
        name: &str,
        generation: u64,
        from: u64,
        to: u64,
        parked: &[(u64, ParkedRecord)],
        now_ms: u64,
    ) -> Result<CursorWrite, StoreError> {
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, generation, Some(from), |tx, rec| {
                // What a rewind re-delivered is no longer parked (unless parked again below).
                if from < to {
                    tx.remove_parked(name, from..=to - 1)?;
                }
                let mut newly = 0;
                for (offset, record) in parked {
                    if tx.put_parked(name, *offset, record)? {
                        newly += 1;
                    }
                }
                let moved_past = to.saturating_sub(from);
                let blocking = parked.iter().filter(|(_, r)| r.blocking).count() as u64;
                rec.delivered += moved_past.saturating_sub(parked.len() as u64 - blocking);
                rec.parked += newly;
                if to != rec.next {
                    rec.advanced_at_ms = now_ms;
                }
                rec.next = to;
                rec.last_error = None;
                Ok(())
            })
        })
    }

    /// Sets the cursor to `to` if it is still in `generation`: the postgres sink trusting the
    /// cursor stored beside its rows.
    fn set_sink_cursor(
        &mut self,
        name: &str,
        generation: u64,
        to: u64,
        now_ms: u64,
    ) -> Result<CursorWrite, StoreError> {
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, generation, None, |_, rec| {
                if to != rec.next {
                    rec.advanced_at_ms = now_ms;
                }
                rec.next = to;
                Ok(())
            })
        })
    }

    /// Records a failed attempt (shown by `relay status`). Not a cursor move: written whatever
    /// the generation.
    fn note_sink_error(&mut self, name: &str, error: &str, now_ms: u64) -> Result<(), StoreError> {
        let error: String = error.chars().take(1024).collect();
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, u64::MAX, None, |_, rec| {
                rec.last_error = Some((now_ms, error));
                Ok(())
            })
        })
        .map(drop)
    }

    /// A parked event was delivered after `relay retry`: its record goes; a blocking one also
    /// lets the cursor past it, if the cursor is still at it in `generation` (not rewound).
    fn parked_delivered(
        &mut self,
        name: &str,
        offset: u64,
        generation: u64,
        now_ms: u64,
    ) -> Result<CursorWrite, StoreError> {
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, u64::MAX, None, |tx, rec| {
                let removed = tx.parked(name, offset..=offset)?.pop();
                if let Some((_, r)) = removed {
                    tx.remove_parked(name, offset..=offset)?;
                    rec.delivered += 1;
                    if r.blocking && rec.next == offset && rec.generation == generation {
                        rec.next = offset + 1;
                        rec.advanced_at_ms = now_ms;
                    }
                }
                rec.last_error = None;
                Ok(())
            })
        })
    }

    /// A retried parked event was refused again: it stays parked with the new response,
    /// and waits for the next `relay retry`.
    fn parked_failed(
        &mut self,
        name: &str,
        offset: u64,
        response: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let response: String = response.chars().take(2048).collect();
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, u64::MAX, None, |tx, rec| {
                if let Some((_, mut r)) = tx.parked(name, offset..=offset)?.pop() {
                    r.attempts += 1;
                    r.response = response.clone();
                    r.retry_requested_at_ms = None;
                    tx.put_parked(name, offset, &r)?;
                }
                rec.last_error = Some((now_ms, response));
                Ok(())
            })
        })
        .map(drop)
    }

    /// `relay retry`: asks the sink to deliver parked event `offset` (or every parked event)
    /// again. Returns how many were marked. One audit entry per event.
    fn relay_retry(
        &mut self,
        name: &str,
        offset: Option<u64>,
        operator: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<u64, StoreError> {
        self.relay_txn(|tx, opts| {
            if tx.sink_cursor(name)?.is_none() {
                return Err(no_sink(name));
            }
            let range = match offset {
                Some(o) => o..=o,
                None => 0..=u64::MAX,
            };
            let mut targets = tx.parked(name, range)?;
            if targets.is_empty() {
                return Err(refused(match offset {
                    Some(o) => format!(
                        "sink {name:?} has no parked event at offset {o} (`relay parked --sink {name}` lists them)"
                    ),
                    None => format!("sink {name:?} has no parked events"),
                }));
            }
            for (o, r) in &mut targets {
                r.retry_requested_at_ms = Some(now_ms);
                tx.put_parked(name, *o, r)?;
            }
            let mut w = Writer::open(tx, opts)?;
            for (o, r) in &targets {
                w.append_audit(relay_entry(
                    now_ms,
                    name,
                    format!(
                        "relay retry of event {} (offset {o}) on sink {name} requested by {operator}: {reason}",
                        r.id
                    ),
                    Some(*o),
                    Some(r.key),
                    Some((&r.agency, &r.source_id)),
                ))?;
            }
            w.finish()?;
            Ok(targets.len() as u64)
        })
    }

    /// `relay rewind`: the sink delivers again from effect `to` (ids are stable, so receivers
    /// that keep them see each effect once). `to` must still be in the log.
    fn relay_rewind(
        &mut self,
        name: &str,
        to: u64,
        operator: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<(SinkRecord, SinkRecord), StoreError> {
        self.relay_txn(|tx, opts| {
            let meta = tx.meta()?;
            let marks = tx.retention_marks()?.unwrap_or_default();
            if to < marks.effects_floor || to > meta.next_effect {
                return Err(refused(format!(
                    "offset {to} is not in the effect log: it holds {}..{} (retention removed \
                     what is below)",
                    marks.effects_floor, meta.next_effect
                )));
            }
            let before = tx.sink_cursor(name)?.ok_or_else(|| no_sink(name))?;
            let mut after = before.clone();
            after.next = to;
            after.generation += 1;
            after.advanced_at_ms = now_ms;
            tx.put_sink_cursor(name, &after)?;
            let mut w = Writer::open(tx, opts)?;
            w.append_audit(relay_entry(
                now_ms,
                name,
                format!(
                    "relay rewind of sink {name} from offset {} to {to} by {operator}: {reason}",
                    before.next
                ),
                Some(to),
                None,
                None,
            ))?;
            w.finish()?;
            Ok((before, after))
        })
    }

    /// `relay forget`: removes a sink's cursor and parked events, so retention no longer
    /// keeps effects for it. The caller refuses a sink that is still configured; a sink a
    /// deliverer holds is refused here (`Tx::sink_idle`).
    fn relay_forget(
        &mut self,
        name: &str,
        operator: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<Forgotten, StoreError> {
        self.relay_txn(|tx, opts| {
            tx.sink_idle(name)?;
            let record = tx.remove_sink_cursor(name)?.ok_or_else(|| no_sink(name))?;
            let parked = tx.remove_parked(name, 0..=u64::MAX)?;
            let mut w = Writer::open(tx, opts)?;
            w.append_audit(relay_entry(
                now_ms,
                name,
                format!(
                    "relay forget of sink {name} (cursor at offset {}, {parked} parked events \
                     removed) by {operator}: {reason}",
                    record.next
                ),
                Some(record.next),
                None,
                None,
            ))?;
            w.finish()?;
            Ok(Forgotten { record, parked })
        })
    }
}

impl RelayStore for Store {
    fn relay_txn<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Tx, &StoreOptions) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.guarded(|s| {
            let txn = Leak::new(s.begin_durable()?);
            let r = {
                // Leaked if redb panics inside `f` (see `guard`).
                let mut tx = Leak::new(RedbTx::open(&txn)?);
                let r = f(&mut *tx, &s.opts)?;
                drop(tx.into_inner());
                r
            };
            txn.into_inner().commit().map_err(StoreError::redb)?;
            Ok(r)
        })
    }
}

impl RelayStore for PgStore {
    fn relay_txn<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Tx, &StoreOptions) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        self.write(|mut tx, opts| {
            let r = f(&mut tx, opts)?;
            Ok((tx, r))
        })
    }
}

impl RelayStore for Backend {
    fn relay_txn<R>(
        &mut self,
        f: impl FnOnce(&mut dyn Tx, &StoreOptions) -> Result<R, StoreError>,
    ) -> Result<R, StoreError> {
        match self {
            Backend::Redb(s) => s.relay_txn(f),
            Backend::Postgres(s) => s.relay_txn(f),
        }
    }
}

/// Reads the cursor, lets `f` change it (and the parked events), and writes it back if it
/// is still in `generation` (`u64::MAX`: any) and, when given, at `at`. Only the sink's
/// deliverer calls it: it claims the sink first.
fn cursor_write(
    tx: &mut dyn Tx,
    name: &str,
    generation: u64,
    at: Option<u64>,
    f: impl FnOnce(&mut dyn Tx, &mut SinkRecord) -> Result<(), StoreError>,
) -> Result<CursorWrite, StoreError> {
    tx.claim_sink(name)?;
    let Some(mut rec) = tx.sink_cursor(name)? else {
        return Ok(CursorWrite::Moved(None));
    };
    let stale = (generation != u64::MAX && rec.generation != generation)
        || at.is_some_and(|a| a != rec.next);
    if stale {
        return Ok(CursorWrite::Moved(Some(rec)));
    }
    f(tx, &mut rec)?;
    tx.put_sink_cursor(name, &rec)?;
    Ok(CursorWrite::Done(rec))
}

fn relay_entry(
    now_ms: u64,
    sink: &str,
    reason: String,
    offset: Option<u64>,
    key: Option<[u8; 32]>,
    source: Option<(&String, &String)>,
) -> AuditRecord {
    AuditRecord {
        recorded_at_ms: now_ms,
        outcome: Outcome::Relay.code(),
        key,
        agency: source.map(|s| s.0.clone()),
        source_id: source.map(|s| s.1.clone()),
        epoch: None,
        sequence: None,
        topic: sink.to_string(),
        reason,
        digest: None,
        effect_offset: offset,
        quarantine_id: None,
        prev_hash: [0; 32],
        hash: [0; 32],
    }
}

/// The lowest cursor of every sink in `t` (`None`: no sink), which retention may not pass.
pub(super) fn lowest_cursor<T: ReadableTable<&'static str, &'static [u8]>>(
    t: &Opened<T, &'static str, SinkRecord>,
) -> Result<Option<u64>, StoreError> {
    let mut low: Option<u64> = None;
    for entry in t.all()? {
        let (_, rec) = entry?;
        low = Some(low.map_or(rec.next, |l: u64| l.min(rec.next)));
    }
    Ok(low)
}

impl Snapshot {
    /// Every sink with a cursor, by name.
    pub fn sink_cursors(&self) -> Result<Vec<(String, SinkRecord)>, StoreError> {
        if let Some(pg) = self.pg() {
            return pg.sink_cursors(None);
        }
        self.guard(|txn| {
            let Some(t) = SINK_CURSORS.open_if_present(txn)? else {
                return Ok(Vec::new());
            };
            t.all()?
                .map(|entry| entry.map(|(k, record)| (k.value().to_string(), record)))
                .collect()
        })
    }

    pub fn sink_cursor(&self, name: &str) -> Result<Option<SinkRecord>, StoreError> {
        if let Some(pg) = self.pg() {
            return Ok(pg.sink_cursors(Some(name))?.pop().map(|(_, r)| r));
        }
        self.guard(|txn| match SINK_CURSORS.open_if_present(txn)? {
            Some(t) => t.get(name),
            None => Ok(None),
        })
    }

    /// The event `sink` parked at `offset`, if any.
    pub fn sink_parked_at(
        &self,
        sink: &str,
        offset: u64,
    ) -> Result<Option<ParkedRecord>, StoreError> {
        if let Some(pg) = self.pg() {
            let all = pg.sink_parked(Some(sink))?;
            return Ok(all
                .into_iter()
                .find(|(_, o, _)| *o == offset)
                .map(|(_, _, r)| r));
        }
        self.guard(|txn| match SINK_PARKED.open_if_present(txn)? {
            Some(t) => t.get((sink, offset)),
            None => Ok(None),
        })
    }

    /// Parked events of `sink` (every sink when `None`), in sink then offset order.
    pub fn sink_parked(&self, sink: Option<&str>) -> Result<Vec<Parked>, StoreError> {
        if let Some(pg) = self.pg() {
            return Ok(pg
                .sink_parked(sink)?
                .into_iter()
                .map(|(sink, offset, record)| Parked {
                    sink,
                    offset,
                    record,
                })
                .collect());
        }
        self.guard(|txn| {
            let Some(t) = SINK_PARKED.open_if_present(txn)? else {
                return Ok(Vec::new());
            };
            let parked = |entry: Entry<'_, (&'static str, u64), ParkedRecord>| {
                entry.map(|(k, record)| Parked {
                    sink: k.value().0.to_string(),
                    offset: k.value().1,
                    record,
                })
            };
            match sink {
                Some(name) => t.range((name, 0)..=(name, u64::MAX))?.map(parked).collect(),
                None => t.all()?.map(parked).collect(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::retention::{LogRetention, RetentionPolicy};
    use crate::store::verify::verify;
    use crate::testing::{T0, feed, parked};
    use crate::wire::FeedContract;

    fn relay_entries(s: &Store) -> Vec<String> {
        let mut out = Vec::new();
        s.reader()
            .unwrap()
            .scan_audit::<StoreError>(0, |e| {
                if e.outcome() == Some(Outcome::Relay) {
                    out.push(format!("{} {}", e.record.topic, e.record.reason));
                }
                Ok(std::ops::ControlFlow::Continue(()))
            })
            .unwrap();
        out
    }

    #[test]
    fn a_cursor_moves_only_from_where_it_is_in_its_generation() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=10, T0);
        let r = s
            .register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        assert_eq!((r.next, r.generation), (0, 0));
        // Registering again returns the same cursor, not a new one.
        assert_eq!(
            s.register_sink("cop", "http", StartAt::Head, T0).unwrap(),
            r
        );
        let head = s.register_sink("late", "exec", StartAt::Head, T0).unwrap();
        assert_eq!(head.next, 10);
        match s
            .advance_sink("cop", 0, 0, 4, &[parked(2, false)], T0)
            .unwrap()
        {
            CursorWrite::Done(r) => assert_eq!((r.next, r.delivered, r.parked), (4, 3, 1)),
            other => panic!("{other:?}"),
        }
        // A stale start or generation is refused, and the current cursor returned.
        assert!(matches!(
            s.advance_sink("cop", 0, 0, 6, &[], T0).unwrap(),
            CursorWrite::Moved(Some(r)) if r.next == 4
        ));
        assert!(matches!(
            s.advance_sink("cop", 1, 4, 6, &[], T0).unwrap(),
            CursorWrite::Moved(Some(_))
        ));
        assert_eq!(
            s.advance_sink("nobody", 0, 0, 1, &[], T0).unwrap(),
            CursorWrite::Moved(None)
        );
        let snap = s.reader().unwrap();
        let p = snap.sink_parked(Some("cop")).unwrap();
        assert_eq!((p.len(), p[0].offset), (1, 2));
        assert!(snap.sink_parked(Some("late")).unwrap().is_empty());
        assert_eq!(snap.sink_cursors().unwrap().len(), 2);
    }

    #[test]
    fn operator_actions_are_audited_and_keep_the_chain_verifiable() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=10, T0);
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        s.advance_sink("cop", 0, 0, 10, &[parked(3, false), parked(7, false)], T0)
            .unwrap();
        // retry one, then all
        assert_eq!(
            s.relay_retry("cop", Some(3), "ana", "fixed the schema", T0)
                .unwrap(),
            1
        );
        let e = s.relay_retry("cop", Some(4), "ana", "x", T0).unwrap_err();
        assert!(e.to_string().contains("no parked event at offset 4"), "{e}");
        assert_eq!(s.relay_retry("cop", None, "ana", "all", T0).unwrap(), 2);
        let p = s.reader().unwrap().sink_parked(Some("cop")).unwrap();
        assert!(p.iter().all(|p| p.record.retry_requested_at_ms == Some(T0)));
        // A delivered retry removes the record; a refused one clears the request.
        s.parked_delivered("cop", 3, 0, T0).unwrap();
        s.parked_failed("cop", 7, "HTTP/1.1 422 again", T0).unwrap();
        let p = s.reader().unwrap().sink_parked(Some("cop")).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(
            (
                p[0].offset,
                p[0].record.attempts,
                p[0].record.retry_requested_at_ms
            ),
            (7, 2, None)
        );
        // rewind: generation bumps, range checked
        let (before, after) = s.relay_rewind("cop", 2, "ana", "COP restored", T0).unwrap();
        assert_eq!((before.next, after.next, after.generation), (10, 2, 1));
        assert!(s.relay_rewind("cop", 11, "ana", "x", T0).is_err());
        // forget removes cursor and parked events
        let f = s.relay_forget("cop", "ana", "sink removed", T0).unwrap();
        assert_eq!((f.record.next, f.parked), (2, 1));
        assert!(s.reader().unwrap().sink_cursor("cop").unwrap().is_none());
        assert!(s.relay_forget("cop", "ana", "again", T0).is_err());
        let entries = relay_entries(&s);
        assert_eq!(entries.len(), 5, "{entries:#?}");
        assert!(entries[0].starts_with("cop relay retry of event id-3 (offset 3) on sink cop requested by ana: fixed the schema"), "{}", entries[0]);
        assert!(
            entries[3]
                .contains("relay rewind of sink cop from offset 10 to 2 by ana: COP restored")
        );
        assert!(entries[4].contains(
            "relay forget of sink cop (cursor at offset 2, 1 parked events removed) by ana"
        ));
        let report = verify(&s.reader().unwrap(), &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
    }

    #[test]
    fn an_event_delivered_after_a_rewind_is_no_longer_parked() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=6, T0);
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        s.advance_sink("cop", 0, 0, 6, &[parked(2, false), parked(4, false)], T0)
            .unwrap();
        s.relay_rewind("cop", 3, "ana", "COP restored", T0).unwrap();
        // Re-delivered from 3: 4 went through this time; 2 (before the rewind) stays parked.
        s.advance_sink("cop", 1, 3, 6, &[], T0).unwrap();
        let p = s.reader().unwrap().sink_parked(Some("cop")).unwrap();
        assert_eq!(p.iter().map(|p| p.offset).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn a_blocking_event_holds_the_cursor_until_its_retry_is_delivered() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=5, T0);
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        s.advance_sink("cop", 0, 0, 2, &[parked(2, true)], T0)
            .unwrap();
        assert_eq!(
            s.reader()
                .unwrap()
                .sink_cursor("cop")
                .unwrap()
                .unwrap()
                .next,
            2
        );
        s.relay_retry("cop", Some(2), "ana", "receiver fixed", T0)
            .unwrap();
        match s.parked_delivered("cop", 2, 0, T0).unwrap() {
            CursorWrite::Done(r) => assert_eq!(r.next, 3),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_retry_delivered_after_a_rewind_does_not_undo_the_rewind() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=8, T0);
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        s.advance_sink("cop", 0, 0, 6, &[parked(6, true)], T0)
            .unwrap();
        s.relay_retry("cop", Some(6), "ana", "fixed", T0).unwrap();
        // The rewind lands while the retried delivery (started in generation 0) is in flight.
        s.relay_rewind("cop", 2, "ana", "COP restored", T0).unwrap();
        match s.parked_delivered("cop", 6, 0, T0).unwrap() {
            CursorWrite::Done(r) => assert_eq!((r.next, r.generation), (2, 1)),
            other => panic!("{other:?}"),
        }
        assert!(
            s.reader()
                .unwrap()
                .sink_parked(Some("cop"))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn retention_never_prunes_what_a_sink_has_not_delivered() {
        let mut opts = StoreOptions {
            retention: RetentionPolicy {
                audit: LogRetention::default(),
                effects: LogRetention {
                    max_age_seconds: None,
                    max_entries: Some(5),
                },
                quarantine: LogRetention::default(),
            },
            ..StoreOptions::default()
        };
        opts.window.max_entries = 2;
        let mut s = Store::open_in_memory(opts).unwrap();
        feed(&mut s, 1..=3, T0);
        s.register_sink("slow", "exec", StartAt::Beginning, T0)
            .unwrap();
        s.advance_sink("slow", 0, 0, 3, &[], T0).unwrap();
        for i in 0..5 {
            feed(&mut s, 4 + i * 5..=8 + i * 5, T0);
        }
        // 28 effects, the window keeps 2, retention 5 entries; the sink is at 3.
        let floor = s.reader().unwrap().retention_marks().unwrap().effects_floor;
        assert_eq!(floor, 3);
        s.advance_sink("slow", 0, 3, 20, &[], T0).unwrap();
        feed(&mut s, 100..=100, T0);
        let floor = s.reader().unwrap().retention_marks().unwrap().effects_floor;
        assert_eq!(floor, 20);
        s.relay_forget("slow", "ana", "removed", T0).unwrap();
        feed(&mut s, 101..=101, T0);
        let snap = s.reader().unwrap();
        let (floor, next) = (
            snap.retention_marks().unwrap().effects_floor,
            snap.meta().unwrap().next_effect,
        );
        assert_eq!(next - floor, 5);
    }
}
