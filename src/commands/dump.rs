//! `dump-audit`, `dump-effects`, `dump-quarantine`: stream a table of a (possibly live)
//! database as JSON lines, aligned columns or CSV, filtered, and with `--follow` keep printing
//! what other processes commit.

use std::io::{BufWriter, Write};
use std::ops::ControlFlow;
use std::time::Duration;

use super::Failure;
use crate::cli::DumpArgs;
use crate::filter::{Candidate, Filter, effect_outcome};
use crate::model::Outcome;
use crate::output::rows::{AuditRow, EffectRow, QuarantineRow};
use crate::output::{Printer, Record};
use crate::signals::StopFlag;
use crate::store::{Reader, Snapshot};
use crate::timefmt::{Zone, now_ms};

/// How long `--follow` waits between two read snapshots.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
/// How often a waiting `--follow` looks at the stop flag.
const STOP_CHECK: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Audit,
    Effects,
    Quarantine,
}

pub fn run(table: Table, args: &DumpArgs) -> Result<(), Failure> {
    let filter = Filter::resolve(&args.filter, now_ms(), args.tz.as_ref())
        .map_err(|e| Failure::Usage(e.into()))?;
    let zone = args.tz.clone().unwrap_or_else(Zone::utc);
    let stop = if args.follow {
        Some(crate::signals::stop_flag().map_err(|e| {
            Failure::Runtime(anyhow::Error::new(e).context("cannot install signal handlers"))
        })?)
    } else {
        None
    };
    let config = super::config(&args.db)?;
    let (_, reader) = super::open_reader_of(&config)?;
    let out = BufWriter::new(crate::output::stdout());
    let from = args.after.map_or(0, |a| a.saturating_add(1));
    let mut printer = match table {
        Table::Audit => Printer::start::<AuditRow>(args.format, &zone, out),
        Table::Effects => Printer::start::<EffectRow>(args.format, &zone, out),
        Table::Quarantine => Printer::start::<QuarantineRow>(args.format, &zone, out),
    }?;
    follow(
        &reader,
        table,
        &filter,
        &config.feed,
        from,
        stop.as_ref(),
        &mut printer,
    )
}

/// How long after `--until` `--follow` keeps looking for entries stamped before it.
const UNTIL_GRACE_MS: u64 = 120_000;

/// Prints every matching row of the latest snapshot (after the header `printer` started
/// with); with `stop`, keeps taking a new snapshot every `FOLLOW_POLL` and printing the rows
/// committed since, until `stop` is set. Output is flushed after each round.
pub fn follow<W: Write>(
    reader: &Reader,
    table: Table,
    filter: &Filter,
    contract: &crate::wire::FeedContract,
    from: u64,
    stop: Option<&StopFlag>,
    printer: &mut Printer<'_, W>,
) -> Result<(), Failure> {
    let mut next = from;
    loop {
        // Taken before the snapshot: whatever commits after it is stamped at or after it.
        let round_started = crate::timefmt::now_ms();
        let snapshot = reader.begin()?;
        next = dump_from(&snapshot, table, filter, contract, next, stop, printer)?;
        drop(snapshot);
        printer.flush()?;
        let Some(stop) = stop else {
            return Ok(());
        };
        // Well past `--until`, nothing committed from now on can match (an entry's time is
        // taken when it is received, at most `linger_ms` plus a commit before it is
        // committed): following is over.
        if filter
            .until_ms
            .is_some_and(|u| round_started >= u.saturating_add(UNTIL_GRACE_MS))
        {
            return Ok(());
        }
        let mut waited = Duration::ZERO;
        while waited < FOLLOW_POLL {
            if stop.requested() {
                return Ok(());
            }
            std::thread::sleep(STOP_CHECK);
            waited += STOP_CHECK;
        }
        if stop.requested() {
            return Ok(());
        }
    }
}

/// Prints the rows of `table` matching `filter` from key `from` on (stopping early once `stop`
/// is set); returns the key after the last one read, where the next round starts.
pub fn dump_from<W: Write>(
    txn: &Snapshot,
    table: Table,
    filter: &Filter,
    contract: &crate::wire::FeedContract,
    from: u64,
    stop: Option<&StopFlag>,
    printer: &mut Printer<'_, W>,
) -> Result<u64, Failure> {
    let mut next = from;
    match table {
        Table::Audit => txn.scan_audit(from, |e| {
            let r = &e.record;
            let keep = filter.matches(&Candidate {
                time_ms: r.recorded_at_ms,
                outcome: Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str),
                source: r.agency.as_deref().zip(r.source_id.as_deref()),
                key: r.key.as_ref(),
                topic: &r.topic,
            });
            next = e.index + 1;
            emit(printer, keep.then_some(AuditRow(&e)), stop)
        }),
        Table::Effects => txn.scan_effects(from, |e| {
            let r = &e.record;
            let keep = filter.matches(&Candidate {
                time_ms: r.received_at_ms,
                outcome: effect_outcome(r.late, r.released),
                source: Some((&r.agency, &r.source_id)),
                key: Some(&r.key),
                topic: &r.topic,
            });
            next = e.offset + 1;
            emit(printer, keep.then(|| EffectRow::new(&e)), stop)
        }),
        Table::Quarantine => txn.scan_quarantine(from, |q| {
            let r = &q.record;
            // Quarantine records do not name their source: the audit entry of their first
            // delivery does (none for malformed messages), and once retention pruned that
            // entry, the stored message decoded under the feed contract (as `report` and
            // `quarantine release` read it).
            let source = if filter.wants_source() {
                match txn.audit_entry(r.audit_index)? {
                    Some(a) => a.record.agency.zip(a.record.source_id),
                    None => crate::wire::decode(&r.payload, contract).ok().map(|m| {
                        (
                            m.source.agency().to_string(),
                            m.source.source_id().to_string(),
                        )
                    }),
                }
            } else {
                None
            };
            let keep = filter.matches(&Candidate {
                time_ms: r.received_at_ms,
                outcome: Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str),
                source: source.as_ref().map(|(a, s)| (a.as_str(), s.as_str())),
                key: r.key.as_ref(),
                topic: &r.topic,
            });
            next = q.id + 1;
            emit(printer, keep.then(|| QuarantineRow::new(&q)), stop)
        }),
    }?;
    Ok(next)
}

/// Prints `record` if the filter kept it; whether to read on (not once `stop` is set).
fn emit<W: Write>(
    printer: &mut Printer<'_, W>,
    record: Option<impl Record>,
    stop: Option<&StopFlag>,
) -> Result<ControlFlow<()>, Failure> {
    if let Some(record) = record {
        printer.print(&record)?;
    }
    Ok(if stop.is_some_and(StopFlag::requested) {
        ControlFlow::Break(())
    } else {
        ControlFlow::Continue(())
    })
}
