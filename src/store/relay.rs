//! The relay's durable state: one cursor per sink and the events a sink parked.
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
use super::ledger;
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
    // An inspector recovering the file after a crash holds it whole for a moment (its lock
    // covers the sinks' bytes too): waited for, not taken for another deliverer.
    super::file::waiting_out_whole_file_locks(path, || {
        super::guard::catch(|| super::file::lock_sinks(path, names))?
    })
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

    /// The sink's cursor, made (at `start`) if it has none, for its deliverer (which claims
    /// the sink first). A sink's cursor is made only here and by `declare_sinks`, so
    /// `forget` followed by a restart starts afresh.
    fn register_sink(
        &mut self,
        name: &str,
        kind: &str,
        start: StartAt,
        now_ms: u64,
    ) -> Result<SinkRecord, StoreError> {
        self.register_sink_on(name, kind, Stream::Effects, start, now_ms)
    }

    /// `register_sink` for a sink delivering `stream`: an existing cursor of another stream
    /// is refused (the stream is part of the sink's identity).
    fn register_sink_on(
        &mut self,
        name: &str,
        kind: &str,
        stream: Stream,
        start: StartAt,
        now_ms: u64,
    ) -> Result<SinkRecord, StoreError> {
        self.relay_txn(|tx, _| {
            tx.claim_sink(name)?;
            make_cursor(tx, name, kind, stream, start, now_ms)
        })
    }

    /// Makes the cursor of every configured sink that has none, in one transaction and
    /// without claiming any: a writer (`run`, `ingest`) does this when it loads its config,
    /// before its first commit, so that retention never prunes an effect a configured sink
    /// has yet to deliver, however late its relay starts. Returns the cursors.
    fn declare_sinks(
        &mut self,
        sinks: &[(&str, &str, Stream, StartAt)],
        now_ms: u64,
    ) -> Result<Vec<SinkRecord>, StoreError> {
        if sinks.is_empty() {
            return Ok(Vec::new());
        }
        self.relay_txn(|tx, _| {
            sinks
                .iter()
                .map(|(name, kind, stream, start)| {
                    make_cursor(tx, name, kind, *stream, *start, now_ms)
                })
                .collect()
        })
    }

    /// Records, before the deliverer offers anything at or past the sink's `offered_to`,
    /// that it may offer up to `to` (raising `offered_to`, never lowering it), and that
    /// `resent` events it is about to offer may already be at the receiver (added to
    /// `resent`): one durable transaction, if the cursor is still of `generation`. The cursor
    /// itself does not move. Returns the record, or `Moved` (an operator's move: the
    /// deliverer follows it before offering anything).
    fn offer_sink(
        &mut self,
        name: &str,
        generation: u64,
        to: u64,
        resent: u64,
        now_ms: u64,
    ) -> Result<CursorWrite, StoreError> {
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, generation, None, now_ms, |_, rec| {
                rec.offered_to = rec.offered_to.max(to);
                rec.resent = rec.resent.saturating_add(resent);
                Ok(())
            })
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
        self.advance_sink_passing(name, generation, from, to, parked, &[], 0, now_ms)
    }

    /// `advance_sink` of an audit sink with an `outcomes` filter: the entries at
    /// `not_selected` (those between `from` and `to` count) were passed over, not delivered;
    /// and `offered_to` raised to `offered` (`offer_sink`'s, with the move: 0 leaves it).
    #[allow(clippy::too_many_arguments)]
    fn advance_sink_passing(
        &mut self,
        name: &str,
        generation: u64,
        from: u64,
        to: u64,
        parked: &[(u64, ParkedRecord)],
        not_selected: &[u64],
        offered: u64,
        now_ms: u64,
    ) -> Result<CursorWrite, StoreError> {
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, generation, Some(from), now_ms, |tx, rec| {
                rec.offered_to = rec.offered_to.max(offered);
                // What a rewind re-delivered is no longer parked (unless parked again below).
                if from < to {
                    tx.remove_parked(name, from..=to - 1)?;
                }
                // Only events of this move: a park from before a cursor move the deliverer
                // had not seen yet is not recorded (it is offered again).
                let parked: Vec<&(u64, ParkedRecord)> = parked
                    .iter()
                    .filter(|(o, r)| (from..to).contains(o) || (r.blocking && *o == to))
                    .collect();
                let mut newly = 0;
                for (offset, record) in &parked {
                    if tx.put_parked(name, *offset, record)? {
                        newly += 1;
                    }
                }
                let moved_past = to.saturating_sub(from);
                let blocking = parked.iter().filter(|(_, r)| r.blocking).count() as u64;
                let passed: Vec<u64> = parked
                    .iter()
                    .filter(|(_, r)| !r.blocking)
                    .map(|(o, _)| *o)
                    .collect();
                let mut not_selected: Vec<u64> = not_selected
                    .iter()
                    .copied()
                    .filter(|o| (from..to).contains(o) && !passed.contains(o))
                    .collect();
                not_selected.sort_unstable();
                not_selected.dedup();
                rec.delivered += moved_past
                    .saturating_sub(parked.len() as u64 - blocking)
                    .saturating_sub(not_selected.len() as u64);
                rec.parked += newly;
                ledger::advanced(tx, name, rec, (from, to), &passed, &not_selected, now_ms)?;
                if to != rec.next {
                    rec.advanced_at_ms = now_ms;
                }
                rec.next = to;
                rec.last_error = None;
                Ok(())
            })
        })
    }

    /// Adopts the cursor a sink keeps beside its data (the postgres sink's row, committed
    /// with its rows) if the cursor here is still in `generation`: forward, the offsets up to
    /// `to` are in the sink's own store already and are passed over; backward (the sink's
    /// store was restored from a backup), they are delivered again. Either way one audit
    /// entry records it, and the ledger.
    fn adopt_sink_cursor(
        &mut self,
        name: &str,
        generation: u64,
        to: u64,
        held_by: &str,
        now_ms: u64,
    ) -> Result<CursorWrite, StoreError> {
        self.relay_txn(|tx, opts| {
            let stream = match tx.sink_cursor(name)? {
                Some(rec) => sink_stream(name, &rec)?,
                None => Stream::Effects,
            };
            let floor = log_floor(tx, stream)?;
            let w = cursor_write(tx, name, generation, None, now_ms, |tx, rec| {
                // Back below what retention kept: those effects cannot be delivered again.
                let lost = (to < floor).then(|| ledger::range_text(to, floor.min(rec.next)));
                let to = to.max(floor.min(rec.next));
                if to == rec.next {
                    return Ok(());
                }
                let from = rec.next;
                let reason = if to > from {
                    format!(
                        "relay sink {name}: cursor taken from the sink's own store ({held_by}) \
                         from offset {from} to {to}: effects {} are there already, committed \
                         with that cursor",
                        ledger::range_text(from, to)
                    )
                } else {
                    format!(
                        "relay sink {name}: cursor taken from the sink's own store ({held_by}) \
                         back from offset {from} to {to}: that store lacks effects {} \
                         (restored from a backup?), which are delivered again{}",
                        ledger::range_text(to, from),
                        lost.as_ref().map_or(String::new(), |l| format!(
                            "; it also lacks effects {l}, which retention has removed here: \
                             they cannot be delivered again"
                        ))
                    )
                };
                let mut w = Writer::open(&mut *tx, opts)?;
                let index = w.append_audit(
                    relay_entry(now_ms, name, reason, Some(to), None, None),
                    None,
                )?;
                w.finish()?;
                if to > from {
                    ledger::passed_over(
                        tx,
                        name,
                        rec,
                        LedgerKind::Adopted,
                        (from, to),
                        Some(index),
                        now_ms,
                    )?;
                } else {
                    tx.remove_parked(name, to..=u64::MAX)?;
                    ledger::cut_back(tx, name, rec, to, now_ms)?;
                }
                rec.advanced_at_ms = now_ms;
                rec.next = to;
                Ok(())
            })?;
            Ok(w)
        })
    }

    /// Takes the non-blocking events parked at offsets `from..to` back out of the parked
    /// events and returns the cursor to `from`, if the cursor is at `to` in `generation` and
    /// every one of them is parked (the runner found that the receiver refuses every event,
    /// not these: it blocks at the first instead).
    fn unpark(
        &mut self,
        name: &str,
        generation: u64,
        from: u64,
        to: u64,
        now_ms: u64,
    ) -> Result<CursorWrite, StoreError> {
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, generation, Some(to), now_ms, |tx, rec| {
                if from >= to {
                    return Ok(());
                }
                // Every position taken back is a parked event, or (an audit sink's) an
                // entry passed over as not selected: the run of refusals held no delivery.
                let parked = tx.parked(name, from..=to - 1)?;
                let passed = ledger::not_selected_in(tx, name, from, to)?;
                if parked.len() as u64 + passed != to - from
                    || parked.iter().any(|(_, p)| p.blocking)
                {
                    return Ok(());
                }
                tx.remove_parked(name, from..=to - 1)?;
                rec.parked = rec.parked.saturating_sub(parked.len() as u64);
                ledger::cut_back(tx, name, rec, from, now_ms)?;
                rec.next = from;
                rec.advanced_at_ms = now_ms;
                Ok(())
            })
        })
    }

    /// Records a failed attempt (shown by `relay status`). Not a cursor move: written whatever
    /// the generation.
    fn note_sink_error(&mut self, name: &str, error: &str, now_ms: u64) -> Result<(), StoreError> {
        let error: String = error.chars().take(1024).collect();
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, u64::MAX, None, now_ms, |_, rec| {
                rec.last_error = Some((now_ms, error));
                Ok(())
            })
        })
        .map(drop)
    }

    /// Clears the sink's last error if it starts with `prefix` (a restarted sink that came
    /// up again is no longer failing, even before it next delivers).
    fn clear_sink_error(
        &mut self,
        name: &str,
        prefix: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, u64::MAX, None, now_ms, |_, rec| {
                if rec
                    .last_error
                    .as_ref()
                    .is_some_and(|(_, e)| e.starts_with(prefix))
                {
                    rec.last_error = None;
                }
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
            cursor_write(tx, name, u64::MAX, None, now_ms, |tx, rec| {
                let removed = tx.parked(name, offset..=offset)?.pop();
                if let Some((_, r)) = removed {
                    tx.remove_parked(name, offset..=offset)?;
                    rec.delivered += 1;
                    let passes = r.blocking && rec.next == offset && rec.generation == generation;
                    if passes || offset < rec.next {
                        ledger::resolved(
                            tx,
                            name,
                            rec,
                            (offset, LedgerKind::Retried, None),
                            passes,
                            now_ms,
                        )?;
                    }
                    if passes {
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
    /// and waits for the next `relay retry` (unless one came after `requested_at_ms`, the
    /// request the attempt answered).
    fn parked_failed(
        &mut self,
        name: &str,
        offset: u64,
        requested_at_ms: Option<u64>,
        response: &str,
        now_ms: u64,
    ) -> Result<(), StoreError> {
        let response: String = response.chars().take(2048).collect();
        self.relay_txn(|tx, _| {
            cursor_write(tx, name, u64::MAX, None, now_ms, |tx, rec| {
                if let Some((_, mut r)) = tx.parked(name, offset..=offset)?.pop() {
                    r.attempts += 1;
                    r.response = response.clone();
                    // A request made while this attempt was under way stands.
                    if r.retry_requested_at_ms <= requested_at_ms {
                        r.retry_requested_at_ms = None;
                    }
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
            let stream = match tx.sink_cursor(name)? {
                Some(rec) => sink_stream(name, &rec)?,
                None => return Err(no_sink(name)),
            };
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
            // A retry sends the event rebuilt from its effect; one whose effect retention
            // removed (before parked events held it) cannot be rebuilt, and is not retried.
            let floor = log_floor(tx, stream)?;
            let lost: Vec<u64> = targets
                .iter()
                .map(|(o, _)| *o)
                .filter(|o| *o < floor)
                .collect();
            targets.retain(|(o, _)| *o >= floor);
            if targets.is_empty() {
                return Err(refused(format!(
                    "sink {name:?}: the {} of the parked events at {}s {lost:?} were \
                     removed by retention (before this version kept them for parked \
                     events), so they cannot be rebuilt from a record `verify` proves; they \
                     are not retried (the copies kept when they were parked are never sent)",
                    stream.entries(),
                    stream.position()
                )));
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
                ), None)?;
            }
            w.finish()?;
            Ok(targets.len() as u64)
        })
    }

    /// `relay rewind`: the sink delivers again from effect `to` (ids are stable, so receivers
    /// that keep them see each effect once). `to` must still be in the log and not above the
    /// cursor: a rewind never passes over an undelivered effect (`relay_skip` does, audited as
    /// such). Events parked from `to` up are offered again with the rest.
    fn relay_rewind(
        &mut self,
        name: &str,
        to: u64,
        operator: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<(SinkRecord, SinkRecord), StoreError> {
        self.relay_txn(|tx, opts| {
            let before = tx.sink_cursor(name)?.ok_or_else(|| no_sink(name))?;
            let stream = sink_stream(name, &before)?;
            let floor = log_floor(tx, stream)?;
            if to > before.next {
                return Err(refused(format!(
                    "{} {to} is above sink {name:?}'s cursor ({}): a rewind only goes back, \
                     and going forward would pass over {} undelivered {}; if that is what you \
                     mean, `relay skip --sink {name} --to {to}` does it, audited as a skip",
                    stream.position(),
                    before.next,
                    to - before.next,
                    stream.entries()
                )));
            }
            if to < floor {
                return Err(refused(format!(
                    "{} {to} is no longer in the {} log: it holds {floor}..{} (retention \
                     removed what is below)",
                    stream.position(),
                    stream.as_str(),
                    log_head(tx, stream)?
                )));
            }
            let mut after = before.clone();
            ledger::ensure(tx, name, &mut after, now_ms)?;
            let reparked = tx.remove_parked(name, to..=u64::MAX)?;
            ledger::cut_back(tx, name, &mut after, to, now_ms)?;
            after.next = to;
            after.generation += 1;
            after.advanced_at_ms = now_ms;
            tx.put_sink_cursor(name, &after)?;
            let mut w = Writer::open(tx, opts)?;
            w.append_audit(
                relay_entry(
                    now_ms,
                    name,
                    format!(
                        "relay rewind of sink {name} from offset {} to {to} by {operator}: \
                     {reason}{}",
                        before.next,
                        if reparked > 0 {
                            format!(" ({reparked} parked events among them are offered again)")
                        } else {
                            String::new()
                        }
                    ),
                    Some(to),
                    None,
                    None,
                ),
                None,
            )?;
            w.finish()?;
            Ok((before, after))
        })
    }

    /// `relay skip`: moves the cursor forward to `to`, passing over the effects between
    /// without delivering them; a blocking event at the cursor stays parked (not blocking),
    /// for `relay retry`. Audited, with how many effects it passed over; returns the cursor
    /// before and after, and what it passed over.
    fn relay_skip(
        &mut self,
        name: &str,
        to: u64,
        operator: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<(SinkRecord, SinkRecord, SkipPlan), StoreError> {
        self.relay_txn(|tx, opts| {
            let before = tx.sink_cursor(name)?.ok_or_else(|| no_sink(name))?;
            let stream = sink_stream(name, &before)?;
            let head = log_head(tx, stream)?;
            let blocking = tx
                .parked(name, before.next..=before.next)?
                .first()
                .is_some_and(|(_, p)| p.blocking);
            let skip = skip_plan(name, &before, (stream, to, head), blocking)?;
            let mut after = before.clone();
            ledger::ensure(tx, name, &mut after, now_ms)?;
            let mut w = Writer::open(&mut *tx, opts)?;
            let index = w.append_audit(
                relay_entry(
                    now_ms,
                    name,
                    format!(
                        // "from offset A to B" for either stream: `verify` reads the range
                        // back (`store::verify`), from entries of every version.
                        "relay skip of sink {name} from offset {} to {to} by {operator}: {} \
                     undelivered {} ({}) passed over{}{}: {reason}",
                        before.next,
                        skip.passed,
                        stream.entries(),
                        ledger::range_text(before.next, to),
                        skip.offered_text(),
                        if skip.blocking_parked {
                            format!(
                                ", the blocking event at {} {} left parked for `relay retry`",
                                stream.position(),
                                before.next
                            )
                        } else {
                            String::new()
                        },
                    ),
                    Some(to),
                    None,
                    None,
                ),
                None,
            )?;
            w.finish()?;
            let mut from = before.next;
            if skip.blocking_parked {
                if let Some((_, mut p)) = tx.parked(name, from..=from)?.pop() {
                    p.blocking = false;
                    tx.put_parked(name, from, &p)?;
                }
                ledger::passed_over(
                    tx,
                    name,
                    &mut after,
                    LedgerKind::Parked,
                    (from, from + 1),
                    None,
                    now_ms,
                )?;
                from += 1;
            }
            ledger::passed_over(
                tx,
                name,
                &mut after,
                LedgerKind::Skipped,
                (from, to),
                Some(index),
                now_ms,
            )?;
            after.next = to;
            after.generation += 1;
            after.advanced_at_ms = now_ms;
            clear_block(&mut after);
            tx.put_sink_cursor(name, &after)?;
            Ok((before, after, skip))
        })
    }

    /// `relay discard`: the operator decides that parked event `offset` (or every parked
    /// event of the sink) is not to be delivered: its record goes, the ledger records it as
    /// discarded by this action, and a blocking one lets the cursor past it (a new
    /// generation, so the running deliverer follows). One audit entry per event; returns how
    /// many.
    fn relay_discard(
        &mut self,
        name: &str,
        offset: Option<u64>,
        operator: &str,
        reason: &str,
        now_ms: u64,
    ) -> Result<u64, StoreError> {
        self.relay_txn(|tx, opts| {
            let mut rec = tx.sink_cursor(name)?.ok_or_else(|| no_sink(name))?;
            let range = offset.map_or(0..=u64::MAX, |o| o..=o);
            let targets = tx.parked(name, range)?;
            if targets.is_empty() {
                return Err(refused(match offset {
                    Some(o) => format!(
                        "sink {name:?} has no parked event at offset {o} (`relay parked --sink {name}` lists them)"
                    ),
                    None => format!("sink {name:?} has no parked events"),
                }));
            }
            ledger::ensure(tx, name, &mut rec, now_ms)?;
            for (o, p) in &targets {
                let mut w = Writer::open(&mut *tx, opts)?;
                let index = w.append_audit(relay_entry(
                    now_ms,
                    name,
                    format!(
                        "relay discard of event {} (offset {o}) on sink {name} by {operator}: \
                         {reason}; it will not be delivered{}",
                        p.id,
                        if p.retry_requested_at_ms.is_some() {
                            // A running relay may be offering it right now: say so rather
                            // than call it never delivered.
                            "; a `relay retry` of it was pending and may have been in \
                             flight, so the receiver may hold it"
                        } else {
                            ""
                        }
                    ),
                    Some(*o),
                    Some(p.key),
                    Some((&p.agency, &p.source_id)),
                ), None)?;
                w.finish()?;
                tx.remove_parked(name, *o..=*o)?;
                let passes = p.blocking && *o == rec.next;
                ledger::resolved(
                    tx,
                    name,
                    &mut rec,
                    (*o, LedgerKind::Discarded, Some(index)),
                    passes,
                    now_ms,
                )?;
                if passes {
                    rec.next = o + 1;
                    rec.generation += 1;
                    rec.advanced_at_ms = now_ms;
                    clear_block(&mut rec);
                }
            }
            tx.put_sink_cursor(name, &rec)?;
            Ok(targets.len() as u64)
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
            tx.remove_ledger(name, 0..=u64::MAX)?;
            let mut w = Writer::open(tx, opts)?;
            w.append_audit(
                relay_entry(
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
                ),
                None,
            )?;
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
            txn.into_inner().commit()?;
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
    now_ms: u64,
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
    ledger::ensure(tx, name, &mut rec, now_ms)?;
    f(tx, &mut rec)?;
    tx.put_sink_cursor(name, &rec)?;
    Ok(CursorWrite::Done(rec))
}

/// The cursor of sink `name`, made at `start` (with its ledger's entry 0) if it has none.
fn make_cursor(
    tx: &mut dyn Tx,
    name: &str,
    kind: &str,
    stream: Stream,
    start: StartAt,
    now_ms: u64,
) -> Result<SinkRecord, StoreError> {
    if let Some(r) = tx.sink_cursor(name)? {
        let had = sink_stream(name, &r)?;
        if had != stream {
            return Err(StoreError::StreamChanged(format!(
                "sink {name:?} has a cursor in the {} log (stream = \"{}\") but the \
                 configuration says stream = \"{}\": a sink's stream cannot change, its \
                 cursor, parked events and ledger count positions of one log. Give the sink \
                 a new name (and `relay forget --sink {name}` the old one once it is out of \
                 the configuration), or put stream = \"{}\" back",
                had.as_str(),
                had.as_str(),
                stream.as_str(),
                had.as_str()
            )));
        }
        return Ok(r);
    }
    let next = match start {
        StartAt::Beginning => log_floor(tx, stream)?,
        StartAt::Head => log_head(tx, stream)?,
    };
    let mut rec = SinkRecord {
        kind: kind.to_string(),
        next,
        generation: 0,
        registered_at_ms: now_ms,
        advanced_at_ms: now_ms,
        delivered: 0,
        parked: 0,
        last_error: None,
        ledger_len: 0,
        stream: stream.code(),
        offered_to: next,
        resent: 0,
    };
    ledger::begin(tx, name, &mut rec, LedgerKind::Start, now_ms)?;
    tx.put_sink_cursor(name, &rec)?;
    Ok(rec)
}

/// The stream of sink `name`'s cursor; a code this build does not know is refused (a newer
/// version wrote it).
pub(super) fn sink_stream(name: &str, rec: &SinkRecord) -> Result<Stream, StoreError> {
    rec.stream().ok_or_else(|| {
        refused(format!(
            "sink {name:?} delivers a log of stream code {}, which this version does not know \
             (a newer version made its cursor)",
            rec.stream
        ))
    })
}

/// The first position retention kept in `stream`'s log.
pub(super) fn log_floor(tx: &mut dyn Tx, stream: Stream) -> Result<u64, StoreError> {
    Ok(match stream {
        Stream::Effects => tx.retention_marks()?.unwrap_or_default().effects_floor,
        Stream::Audit => tx.meta()?.audit_anchor.map_or(0, |(i, _)| i + 1),
    })
}

/// The next position `stream`'s log will write.
pub(super) fn log_head(tx: &mut dyn Tx, stream: Stream) -> Result<u64, StoreError> {
    let meta = tx.meta()?;
    Ok(match stream {
        Stream::Effects => meta.next_effect,
        Stream::Audit => meta.next_audit,
    })
}

/// What `relay skip` to `to` would pass over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SkipPlan {
    /// Undelivered effects passed over (the blocking event left parked is not one).
    pub passed: u64,
    /// A blocking event waits at the cursor: it stays parked, no longer blocking.
    pub blocking_parked: bool,
    /// Those of the passed over that the deliverer may already have offered to the
    /// receiver (below the sink's `offered_to`: in flight, or sent before a kill -9), as a
    /// range: the receiver may hold them, so they are not said to be undelivered.
    pub offered: (u64, u64),
}

impl SkipPlan {
    /// How many passed-over events may be at the receiver.
    pub fn offered_count(&self) -> u64 {
        self.offered.1 - self.offered.0
    }

    /// `; N of them (RANGE) had been offered to the receiver, which may hold them`, or
    /// nothing when none had.
    pub fn offered_text(&self) -> String {
        match self.offered_count() {
            0 => String::new(),
            n => format!(
                "; {n} of them ({}) had been offered to the receiver, which may hold them",
                ledger::range_text(self.offered.0, self.offered.1)
            ),
        }
    }
}

/// An operator moved the cursor past the event a block waits at (a skip, the discard of the
/// blocking event): the block it names is over, so the sink is no longer reported `blocked`
/// (else, with nothing left to deliver, it would stay so until the next event). If the
/// receiver refuses the next events too, the deliverer finds it blocked again.
fn clear_block(rec: &mut SinkRecord) {
    if rec
        .last_error
        .as_ref()
        .is_some_and(|(_, e)| e.starts_with(crate::relay::BLOCKED))
    {
        rec.last_error = None;
    }
}

/// Checks a skip of sink `name` from `rec` to `to` against the `head` of its `stream`'s log;
/// `blocking_at_cursor`: a blocking event waits at the cursor.
fn skip_plan(
    name: &str,
    rec: &SinkRecord,
    (stream, to, head): (Stream, u64, u64),
    blocking_at_cursor: bool,
) -> Result<SkipPlan, StoreError> {
    if to <= rec.next {
        return Err(refused(format!(
            "offset {to} is not above sink {name:?}'s cursor ({}): a skip only goes forward \
             (`relay rewind` goes back)",
            rec.next
        )));
    }
    if to > head {
        return Err(refused(format!(
            "offset {to} is beyond the {} log's head ({head}): a sink can skip at most to \
             the next {} to be written",
            stream.as_str(),
            match stream {
                Stream::Effects => "effect",
                Stream::Audit => "audit entry",
            }
        )));
    }
    let from = rec.next + u64::from(blocking_at_cursor);
    let offered_end = rec.offered_to.clamp(from, to);
    Ok(SkipPlan {
        passed: to - rec.next - u64::from(blocking_at_cursor),
        blocking_parked: blocking_at_cursor,
        offered: (from, offered_end),
    })
}

/// What `relay skip` of sink `name` to `to` would pass over, without writing anything (the
/// command shows it before asking for `--yes`).
pub fn plan_skip(
    snap: &Snapshot,
    name: &str,
    to: u64,
) -> Result<(SinkRecord, SkipPlan), StoreError> {
    let rec = snap.sink_cursor(name)?.ok_or_else(|| no_sink(name))?;
    let stream = sink_stream(name, &rec)?;
    let head = snap.log_head(stream)?;
    let blocking = snap
        .sink_parked_at(name, rec.next)?
        .is_some_and(|p| p.blocking);
    let plan = skip_plan(name, &rec, (stream, to, head), blocking)?;
    Ok((rec, plan))
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

/// The lowest position any sink of `stream` in `cursors` still needs: its cursor, or the
/// lowest event it parked at or above `floor` (`None`: no such sink). Retention may not pass
/// it.
pub(super) fn lowest_needed<C, P>(
    cursors: &Opened<C, &'static str, SinkRecord>,
    parked: &Opened<P, (&'static str, u64), ParkedRecord>,
    stream: Stream,
    floor: u64,
) -> Result<Option<u64>, StoreError>
where
    C: ReadableTable<&'static str, &'static [u8]>,
    P: ReadableTable<(&'static str, u64), &'static [u8]>,
{
    let mut low: Option<u64> = None;
    for entry in cursors.all()? {
        let (name, rec) = entry?;
        // A cursor of a stream this build does not know holds both logs.
        if rec.stream().is_some_and(|s| s != stream) {
            continue;
        }
        let name = name.value();
        let first_parked = parked
            .range((name, floor)..=(name, u64::MAX))?
            .next()
            .transpose()?
            .map(|(k, _)| k.value().1);
        let needed = first_parked.map_or(rec.next, |p| p.min(rec.next));
        low = Some(low.map_or(needed, |l: u64| l.min(needed)));
    }
    Ok(low)
}

impl Snapshot {
    /// The next position `stream`'s log will write.
    pub fn log_head(&self, stream: Stream) -> Result<u64, StoreError> {
        let meta = self.meta()?;
        Ok(match stream {
            Stream::Effects => meta.next_effect,
            Stream::Audit => meta.next_audit,
        })
    }

    /// The first position retention kept in `stream`'s log.
    pub fn log_floor(&self, stream: Stream) -> Result<u64, StoreError> {
        Ok(match stream {
            Stream::Effects => self.retention_marks()?.effects_floor,
            Stream::Audit => self.meta()?.audit_anchor.map_or(0, |(i, _)| i + 1),
        })
    }

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

    /// The ledger of sink `name` (`store::ledger`), by entry number.
    pub fn sink_ledger(&self, name: &str) -> Result<Vec<(u64, LedgerRecord)>, StoreError> {
        if let Some(pg) = self.pg() {
            return pg.sink_ledger(name);
        }
        self.guard(|txn| {
            let Some(t) = SINK_LEDGER.open_if_present(txn)? else {
                return Ok(Vec::new());
            };
            t.range((name, 0)..=(name, u64::MAX))?
                .map(|entry| entry.map(|(k, record)| (k.value().1, record)))
                .collect()
        })
    }

    /// The accounting of sink `name`'s ledger against its cursor and parked events
    /// (`store::ledger::account`): `Ok(Err(problem))` when it does not hold.
    pub fn sink_accounting(
        &self,
        name: &str,
        rec: &SinkRecord,
    ) -> Result<Result<ledger::Accounting, String>, StoreError> {
        let ledger_entries = self.sink_ledger(name)?;
        let parked: Vec<(u64, bool)> = self
            .sink_parked(Some(name))?
            .iter()
            .map(|p| (p.offset, p.record.blocking))
            .collect();
        Ok(ledger::account(rec, &ledger_entries, &parked))
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
            .advance_sink(
                "cop",
                0,
                0,
                4,
                &[parked(&s.reader().unwrap(), 2, false)],
                T0,
            )
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
        s.advance_sink(
            "cop",
            0,
            0,
            10,
            &[
                parked(&s.reader().unwrap(), 3, false),
                parked(&s.reader().unwrap(), 7, false),
            ],
            T0,
        )
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
        s.parked_failed("cop", 7, Some(T0), "HTTP/1.1 422 again", T0)
            .unwrap();
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
        // rewind: generation bumps, range checked; never forward
        let (before, after) = s.relay_rewind("cop", 8, "ana", "COP restored", T0).unwrap();
        assert_eq!((before.next, after.next, after.generation), (10, 8, 1));
        let e = s.relay_rewind("cop", 9, "ana", "x", T0).unwrap_err();
        assert!(
            e.to_string().contains("relay skip --sink cop --to 9"),
            "{e}"
        );
        // forget removes cursor and parked events
        let f = s.relay_forget("cop", "ana", "sink removed", T0).unwrap();
        assert_eq!((f.record.next, f.parked), (8, 1));
        assert!(s.reader().unwrap().sink_cursor("cop").unwrap().is_none());
        assert!(s.relay_forget("cop", "ana", "again", T0).is_err());
        let entries = relay_entries(&s);
        assert_eq!(entries.len(), 5, "{entries:#?}");
        assert!(
            entries[0].starts_with("cop relay retry of event ")
                && entries[0]
                    .contains(" (offset 3) on sink cop requested by ana: fixed the schema"),
            "{}",
            entries[0]
        );
        assert!(
            entries[3]
                .contains("relay rewind of sink cop from offset 10 to 8 by ana: COP restored"),
            "{entries:#?}"
        );
        assert!(entries[4].contains(
            "relay forget of sink cop (cursor at offset 8, 1 parked events removed) by ana"
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
        s.advance_sink(
            "cop",
            0,
            0,
            6,
            &[
                parked(&s.reader().unwrap(), 2, false),
                parked(&s.reader().unwrap(), 4, false),
            ],
            T0,
        )
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
        s.advance_sink("cop", 0, 0, 2, &[parked(&s.reader().unwrap(), 2, true)], T0)
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
        s.advance_sink("cop", 0, 0, 6, &[parked(&s.reader().unwrap(), 6, true)], T0)
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

    fn pruning(max_entries: u64) -> StoreOptions {
        let mut opts = StoreOptions {
            retention: RetentionPolicy {
                audit: LogRetention::default(),
                effects: LogRetention {
                    max_age_seconds: None,
                    max_entries: Some(max_entries),
                },
                quarantine: LogRetention::default(),
            },
            ..StoreOptions::default()
        };
        opts.window.max_entries = 2;
        opts
    }

    fn floor(s: &Store) -> u64 {
        s.reader().unwrap().retention_marks().unwrap().effects_floor
    }

    fn accounting(s: &Store, name: &str) -> crate::store::ledger::Accounting {
        let snap = s.reader().unwrap();
        let rec = snap.sink_cursor(name).unwrap().unwrap();
        snap.sink_accounting(name, &rec).unwrap().unwrap()
    }

    #[test]
    fn a_parked_event_holds_retention_until_it_is_discarded_and_the_discard_is_accounted() {
        let mut s = Store::open_in_memory(pruning(5)).unwrap();
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        feed(&mut s, 1..=10, T0);
        let p3 = parked(&s.reader().unwrap(), 3, false);
        s.advance_sink("cop", 0, 0, 10, &[p3], T0).unwrap();
        for i in 0..4 {
            feed(&mut s, 11 + i * 5..=15 + i * 5, T0);
        }
        assert_eq!(floor(&s), 3, "the parked event's effect is kept");
        let n = s
            .relay_discard("cop", Some(3), "ana", "superseded by a later report", T0)
            .unwrap();
        assert_eq!(n, 1);
        let a = accounting(&s, "cop");
        assert_eq!((a.parked, a.discarded, a.delivered), (0, 1, 9));
        assert!(
            s.reader()
                .unwrap()
                .sink_parked(Some("cop"))
                .unwrap()
                .is_empty()
        );
        let report = verify(&s.reader().unwrap(), &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
        // Released: the sink's cursor (10) is what holds the log now.
        feed(&mut s, 100..=100, T0);
        assert_eq!(floor(&s), 10);
        assert!(
            relay_entries(&s)
                .iter()
                .any(|e| e.contains("relay discard of event ")
                    && e.contains("(offset 3) on sink cop by ana: superseded by a later report"))
        );
    }

    #[test]
    fn a_discard_of_an_event_whose_retry_was_pending_says_the_receiver_may_hold_it() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=6, T0);
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        let snap = s.reader().unwrap();
        let (p2, p4) = (parked(&snap, 2, false), parked(&snap, 4, false));
        drop(snap);
        s.advance_sink("cop", 0, 0, 6, &[p2, p4], T0).unwrap();
        s.relay_retry("cop", Some(2), "ana", "fixed", T0).unwrap();
        assert_eq!(
            s.relay_discard("cop", None, "ana", "superseded", T0)
                .unwrap(),
            2
        );
        let said = |o: u64| {
            relay_entries(&s)
                .into_iter()
                .find(|e| {
                    e.contains("relay discard of event ")
                        && e.contains(&format!("(offset {o}) on sink cop"))
                })
                .unwrap()
        };
        assert!(said(2).ends_with("it will not be delivered; a `relay retry` of it was pending and may have been in flight, so the receiver may hold it"), "{}", said(2));
        assert!(said(4).ends_with("it will not be delivered"), "{}", said(4));
    }

    #[test]
    fn discarding_a_blocking_event_lets_the_cursor_past_it_in_a_new_generation() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=5, T0);
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        let p2 = parked(&s.reader().unwrap(), 2, true);
        s.advance_sink("cop", 0, 0, 2, &[p2], T0).unwrap();
        s.relay_discard("cop", None, "ana", "bad unit id", T0)
            .unwrap();
        let rec = s.reader().unwrap().sink_cursor("cop").unwrap().unwrap();
        assert_eq!((rec.next, rec.generation), (3, 1));
        assert_eq!(accounting(&s, "cop").discarded, 1);
        assert!(s.relay_discard("cop", None, "ana", "again", T0).is_err());
        let report = verify(&s.reader().unwrap(), &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
    }

    #[test]
    fn a_sink_cursor_adopted_back_below_retention_stops_at_the_floor_and_says_what_is_lost() {
        let mut s = Store::open_in_memory(pruning(5)).unwrap();
        feed(&mut s, 1..=30, T0);
        s.register_sink("cop", "postgres", StartAt::Head, T0)
            .unwrap();
        feed(&mut s, 31..=60, T0);
        s.advance_sink("cop", 0, 30, 60, &[], T0).unwrap();
        feed(&mut s, 61..=61, T0);
        let low = floor(&s);
        assert!(low > 40, "{low}");
        // The sink's own store was restored from a backup at offset 35.
        match s.adopt_sink_cursor("cop", 0, 35, "test table", T0).unwrap() {
            CursorWrite::Done(r) => assert_eq!(r.next, low),
            other => panic!("{other:?}"),
        }
        let entries = relay_entries(&s);
        let last = entries.last().unwrap();
        assert!(
            last.contains(&format!(
                "back from offset 60 to {low}: that store lacks effects {low}-59"
            )) && last.contains(&format!(
                "it also lacks effects 35-{}, which retention has removed here: they cannot be \
                 delivered again",
                low - 1
            )),
            "{last}"
        );
        let report = verify(&s.reader().unwrap(), &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
    }

    #[test]
    fn a_retry_requested_during_a_failed_attempt_is_not_lost() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=5, T0);
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        let p2 = parked(&s.reader().unwrap(), 2, false);
        s.advance_sink("cop", 0, 0, 5, &[p2], T0).unwrap();
        s.relay_retry("cop", Some(2), "ana", "first", T0).unwrap();
        // A second request lands while the first one's attempt is refused.
        s.relay_retry("cop", Some(2), "ana", "second", T0 + 10)
            .unwrap();
        s.parked_failed("cop", 2, Some(T0), "HTTP 422", T0 + 20)
            .unwrap();
        let p = s
            .reader()
            .unwrap()
            .sink_parked_at("cop", 2)
            .unwrap()
            .unwrap();
        assert_eq!(p.retry_requested_at_ms, Some(T0 + 10));
        s.parked_failed("cop", 2, Some(T0 + 10), "HTTP 422", T0 + 30)
            .unwrap();
        let p = s
            .reader()
            .unwrap()
            .sink_parked_at("cop", 2)
            .unwrap()
            .unwrap();
        assert_eq!(p.retry_requested_at_ms, None);
    }

    #[test]
    fn an_event_parked_below_the_retention_floor_holds_nothing() {
        let mut s = Store::open_in_memory(pruning(5)).unwrap();
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        feed(&mut s, 1..=10, T0);
        let p3 = parked(&s.reader().unwrap(), 3, false);
        s.advance_sink("cop", 0, 0, 10, &[p3], T0).unwrap();
        // As an older version left it: the retention floor already past the parked event.
        s.relay_txn(|tx, _| {
            let mut marks = tx.retention_marks()?.unwrap_or_default();
            marks.effects_floor = 5;
            tx.remove_effects(0..=4)?;
            tx.put_retention_marks(&marks)
        })
        .unwrap();
        for i in 0..3 {
            feed(&mut s, 11 + i * 5..=15 + i * 5, T0);
        }
        assert_eq!(floor(&s), 10, "pruned up to the cursor, past the old park");
    }

    #[test]
    fn verify_refuses_a_pass_over_that_cites_another_action() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=20, T0);
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        s.advance_sink("cop", 0, 0, 3, &[], T0).unwrap();
        let p3 = parked(&s.reader().unwrap(), 3, false);
        s.advance_sink("cop", 0, 3, 4, &[p3], T0).unwrap();
        s.relay_retry("cop", Some(3), "ana", "fixed", T0).unwrap();
        let retry_index = s.reader().unwrap().meta().unwrap().next_audit - 1;
        // A forged skip of 4..15 citing the retry's audit entry, with the cursor moved to match.
        s.relay_txn(|tx, _| {
            let mut rec = tx.sink_cursor("cop")?.unwrap();
            let skip = LedgerRecord {
                kind: LedgerKind::Skipped.code(),
                from: 4,
                to: 15,
                generation: 0,
                first_at_ms: T0,
                last_at_ms: T0,
                audit_index: Some(retry_index),
            };
            tx.put_ledger("cop", rec.ledger_len, &skip)?;
            rec.ledger_len += 1;
            rec.next = 15;
            tx.put_sink_cursor("cop", &rec)
        })
        .unwrap();
        let report = verify(&s.reader().unwrap(), &FeedContract::default()).unwrap();
        let v = report.violation.unwrap();
        assert!(
            v.contains(
                "sink cop: its ledger says offsets 4-14 were skipped by the action of audit entry"
            ),
            "{v}"
        );
    }

    fn audit_pruning(max_entries: u64) -> StoreOptions {
        StoreOptions {
            retention: RetentionPolicy {
                audit: LogRetention {
                    max_age_seconds: None,
                    max_entries: Some(max_entries),
                },
                effects: LogRetention::default(),
                quarantine: LogRetention::default(),
            },
            ..StoreOptions::default()
        }
    }

    fn audit_floor(s: &Store) -> u64 {
        s.reader().unwrap().log_floor(Stream::Audit).unwrap()
    }

    /// The event an audit sink would park for the entry at `index`.
    fn parked_entry(s: &Store, index: u64) -> (u64, ParkedRecord) {
        let e = s.reader().unwrap().audit_entry(index).unwrap().unwrap();
        let ev = crate::relay::Event::of_audit("urn:test", &e);
        (
            index,
            ParkedRecord {
                parked_at_ms: T0,
                id: ev.id,
                key: ev.key,
                agency: ev.agency,
                source_id: ev.source_id,
                topic: ev.topic,
                reason: "exit 65".into(),
                response: "exit status 65".into(),
                attempts: 1,
                blocking: false,
                retry_requested_at_ms: None,
                event: ev.json,
            },
        )
    }

    #[test]
    fn retention_never_prunes_an_audit_entry_an_audit_sink_has_not_delivered() {
        let mut s = Store::open_in_memory(audit_pruning(5)).unwrap();
        s.register_sink_on("siem", "exec", Stream::Audit, StartAt::Beginning, T0)
            .unwrap();
        for i in 0..6 {
            feed(&mut s, 1 + i * 5..=5 + i * 5, T0);
        }
        // 30 entries, retention keeps 5; the audit sink is still at 0.
        assert_eq!(audit_floor(&s), 0, "held by the audit sink");
        s.advance_sink_passing("siem", 0, 0, 12, &[], &[], 0, T0)
            .unwrap();
        let p = parked_entry(&s, 12);
        s.advance_sink_passing("siem", 0, 12, 20, &[p], &[], 0, T0)
            .unwrap();
        feed(&mut s, 100..=100, T0);
        assert_eq!(audit_floor(&s), 12, "held by the entry parked at 12");
        s.relay_discard("siem", Some(12), "ana", "not for the SIEM", T0)
            .unwrap();
        feed(&mut s, 101..=101, T0);
        // The discard's own entry is not delivered yet either: the cursor (20) holds.
        assert_eq!(audit_floor(&s), 20);
        // An effects sink does not hold the audit log.
        s.register_sink("cop", "http", StartAt::Beginning, T0)
            .unwrap();
        let head = s.reader().unwrap().meta().unwrap().next_audit;
        s.advance_sink_passing("siem", 0, 20, head, &[], &[], 0, T0)
            .unwrap();
        feed(&mut s, 102..=102, T0);
        let snap = s.reader().unwrap();
        let next = snap.meta().unwrap().next_audit;
        assert_eq!(next - snap.log_floor(Stream::Audit).unwrap(), 5);
        let report = verify(&snap, &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
        // Forgotten, an audit sink holds nothing; until then a removed one does.
        drop(snap);
        let before = audit_floor(&s);
        s.relay_forget("siem", "ana", "removed", T0).unwrap();
        for i in 0..3 {
            feed(&mut s, 200 + i * 5..=204 + i * 5, T0);
        }
        assert!(audit_floor(&s) > before);
    }

    #[test]
    fn a_sinks_stream_cannot_change_under_the_same_name() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        s.register_sink("cop", "exec", StartAt::Beginning, T0)
            .unwrap();
        let e = s
            .register_sink_on("cop", "exec", Stream::Audit, StartAt::Beginning, T0)
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("sink \"cop\" has a cursor in the effects log")
                && text.contains("stream cannot change")
                && text.contains("relay forget --sink cop"),
            "{text}"
        );
        let e = s
            .declare_sinks(&[("cop", "exec", Stream::Audit, StartAt::Head)], T0)
            .unwrap_err();
        assert!(e.to_string().contains("stream cannot change"), "{e}");
        // The same stream again is the same sink.
        s.register_sink_on("cop", "exec", Stream::Effects, StartAt::Head, T0)
            .unwrap();
    }

    #[test]
    fn a_skip_over_events_offered_to_the_receiver_says_they_may_be_there() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=10, T0);
        s.register_sink("cop", "exec", StartAt::Beginning, T0)
            .unwrap();
        s.advance_sink("cop", 0, 0, 2, &[], T0).unwrap();
        // The deliverer offers 2..6 (a batch in flight), then an operator skips to 8.
        let w = s.offer_sink("cop", 0, 6, 0, T0).unwrap();
        let CursorWrite::Done(r) = w else {
            panic!("offer refused: {w:?}")
        };
        assert_eq!((r.next, r.offered_to, r.resent), (2, 6, 0));
        let (_, after, plan) = s.relay_skip("cop", 8, "ana", "COP rebuilt", T0).unwrap();
        assert_eq!((after.next, plan.passed, plan.offered), (8, 6, (2, 6)));
        let text = relay_entries(&s).pop().unwrap();
        assert!(
            text.contains(
                "6 undelivered effects (2-7) passed over; 4 of them (2-5) had been \
                           offered to the receiver, which may hold them: COP rebuilt"
            ),
            "{text}"
        );
        // The deliverer's acknowledgement after the skip moves nothing, nor does its offer.
        assert!(matches!(
            s.advance_sink("cop", 0, 2, 6, &[], T0).unwrap(),
            CursorWrite::Moved(_)
        ));
        assert!(matches!(
            s.offer_sink("cop", 0, 9, 0, T0).unwrap(),
            CursorWrite::Moved(_)
        ));
        // Nothing offered past the cursor: a skip says nothing of the receiver.
        let (_, _, plan) = s.relay_skip("cop", 10, "ana", "again", T0).unwrap();
        assert_eq!(
            (plan.offered_count(), plan.offered_text()),
            (0, String::new())
        );
        let report = verify(&s.reader().unwrap(), &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
    }

    #[test]
    fn an_audit_sink_starts_in_the_audit_log_and_accounts_for_entries_not_selected() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=4, T0);
        feed(&mut s, 1..=2, T0); // two duplicates: entries 4 and 5
        let rec = s
            .register_sink_on("siem", "exec", Stream::Audit, StartAt::Head, T0)
            .unwrap();
        assert_eq!((rec.next, rec.stream()), (6, Some(Stream::Audit)));
        s.relay_forget("siem", "ana", "again from the start", T0)
            .unwrap();
        let rec = s
            .register_sink_on("siem", "exec", Stream::Audit, StartAt::Beginning, T0)
            .unwrap();
        assert_eq!(rec.next, 0);
        // Selecting duplicates: 4 and 5 delivered, 0..4 and 6 (the forget) not selected.
        s.advance_sink_passing("siem", 0, 0, 6, &[], &[0, 1, 2, 3], 0, T0)
            .unwrap();
        s.advance_sink_passing("siem", 0, 6, 7, &[], &[6], 0, T0)
            .unwrap();
        let a = accounting(&s, "siem");
        assert_eq!((a.delivered, a.not_selected, a.entries), (2, 5, 4));
        let rec = s.reader().unwrap().sink_cursor("siem").unwrap().unwrap();
        assert_eq!((rec.next, rec.delivered), (7, 2));
        let report = verify(&s.reader().unwrap(), &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
        // Skips and rewinds move in audit indexes: up to the audit log's head (7, the
        // forget's entry included), which is past the effect log's (4).
        let head = s.reader().unwrap().log_head(Stream::Audit).unwrap();
        assert_eq!(
            (head, s.reader().unwrap().log_head(Stream::Effects).unwrap()),
            (7, 4)
        );
        let e = s.relay_skip("siem", head + 1, "ana", "x", T0).unwrap_err();
        assert!(
            e.to_string().contains("beyond the audit log's head (7)"),
            "{e}"
        );
        feed(&mut s, 3..=3, T0); // entry 7, a duplicate
        let (_, after, plan) = s.relay_skip("siem", 8, "ana", "SIEM rebuilt", T0).unwrap();
        assert_eq!((after.next, plan.passed), (8, 1));
        s.relay_rewind("siem", 6, "ana", "SIEM restored", T0)
            .unwrap();
        let a = accounting(&s, "siem");
        assert_eq!((a.delivered, a.not_selected, a.skipped), (2, 4, 0));
        let report = verify(&s.reader().unwrap(), &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
        // An effects sink never passes anything over as not selected.
        s.register_sink("cop", "exec", StartAt::Beginning, T0)
            .unwrap();
        s.advance_sink_passing("cop", 0, 0, 2, &[], &[1], 0, T0)
            .unwrap();
        let v = verify(&s.reader().unwrap(), &FeedContract::default())
            .unwrap()
            .violation
            .unwrap();
        assert!(
            v.contains("sink cop: ledger entry") && v.contains("not selected"),
            "{v}"
        );
    }

    #[test]
    fn verify_proves_an_audit_sinks_parked_copy_against_its_entry() {
        let mut s = Store::open_in_memory(StoreOptions::default()).unwrap();
        feed(&mut s, 1..=3, T0);
        s.register_sink_on("siem", "exec", Stream::Audit, StartAt::Beginning, T0)
            .unwrap();
        let p = parked_entry(&s, 1);
        s.advance_sink_passing("siem", 0, 0, 3, std::slice::from_ref(&p), &[], 0, T0)
            .unwrap();
        let report = verify(&s.reader().unwrap(), &FeedContract::default()).unwrap();
        assert_eq!(report.violation, None);
        assert_eq!(report.sinks[0].parked_checked, 1);
        // A retry of it is audited, and names the entry's event id.
        s.relay_retry("siem", Some(1), "ana", "SIEM back", T0)
            .unwrap();
        // The copy altered: verify says so.
        s.relay_txn(|tx, _| {
            let (o, mut r) = p.clone();
            r.event = r
                .event
                .replace("\"outcome\":\"applied\"", "\"outcome\":\"stale\"");
            tx.put_parked("siem", o, &r).map(drop)
        })
        .unwrap();
        let v = verify(&s.reader().unwrap(), &FeedContract::default())
            .unwrap()
            .violation
            .unwrap();
        assert!(
            v.contains("sink siem: event parked at audit index 1: its stored event differs"),
            "{v}"
        );
    }
}
