//! `dump-audit`, `dump-effects`, `dump-quarantine`: stream a table of a (possibly live)
//! database as JSON lines, aligned columns or CSV, filtered, and with `--follow` keep printing
//! what other processes commit.

use std::io::{self, BufWriter, Write};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Failure;
use crate::cli::{DumpArgs, Format};
use crate::filter::{Candidate, Filter, effect_outcome};
use crate::json::{self, Json};
use crate::model::{Outcome, hex};
use crate::output::{Row, num, opt_hex, opt_num, text, write_csv_row, write_table_row};
use crate::store::{self, AuditEntry, Effect, QuarantineEntry, Reader, Snapshot};
use crate::textsafe::escape_json;
use crate::timefmt::{Zone, now_ms, rfc3339_ms};

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

/// How rows are printed: the format, and the zone `--format table` shows times in.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub format: Format,
    pub zone: &'a Zone,
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
    let (_, reader) = super::open_reader(&args.db)?;
    let mut out = BufWriter::new(crate::output::stdout());
    let from = args.after.map_or(0, |a| a.saturating_add(1));
    follow(
        &reader,
        table,
        View {
            format: args.format,
            zone: &zone,
        },
        &filter,
        from,
        stop.as_deref(),
        &mut out,
    )
}

/// How long after `--until` `--follow` keeps looking for entries stamped before it.
const UNTIL_GRACE_MS: u64 = 120_000;

/// Prints the header and every matching row of the latest snapshot; with `stop`, keeps taking
/// a new snapshot every `FOLLOW_POLL` and printing the rows committed since, until `stop` is set.
/// Output is flushed after each round.
pub fn follow(
    reader: &Reader,
    table: Table,
    view: View<'_>,
    filter: &Filter,
    from: u64,
    stop: Option<&AtomicBool>,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let View { format, zone } = view;
    write_header(out, table, format, zone)?;
    let mut next = from;
    loop {
        // Taken before the snapshot: whatever commits after it is stamped at or after it.
        let round_started = crate::timefmt::now_ms();
        let snapshot = reader.begin()?;
        next = dump_from(&snapshot, table, view, filter, next, stop, out)?;
        drop(snapshot);
        out.flush()?;
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
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            std::thread::sleep(STOP_CHECK);
            waited += STOP_CHECK;
        }
        if stop.load(Ordering::Relaxed) {
            return Ok(());
        }
    }
}

/// Writes every row of `table` to `out` in `format`, header included.
pub fn dump(
    txn: &Snapshot,
    table: Table,
    format: Format,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let zone = Zone::utc();
    write_header(out, table, format, &zone)?;
    let view = View {
        format,
        zone: &zone,
    };
    dump_from(txn, table, view, &Filter::default(), 0, None, out).map(|_| ())
}

fn write_header(out: &mut impl Write, table: Table, format: Format, zone: &Zone) -> io::Result<()> {
    match format {
        Format::Jsonl => Ok(()),
        Format::Table => write_table_row(out, &table_columns(table, zone), None),
        Format::Csv => write_csv_row(out, csv_columns(table), None),
    }
}

/// Writes the rows of `table` matching `filter` from key `from` on (stopping early once `stop`
/// is set); returns the key after the last one read, where the next round starts.
pub fn dump_from(
    txn: &Snapshot,
    table: Table,
    view: View<'_>,
    filter: &Filter,
    from: u64,
    stop: Option<&AtomicBool>,
    out: &mut impl Write,
) -> Result<u64, Failure> {
    let View { format, zone } = view;
    let mut next = from;
    let mut emit = |key: u64, row: Option<Row>| -> Result<ControlFlow<()>, Failure> {
        next = key + 1;
        if let Some(row) = row {
            write_row(out, format, zone, table, row)?;
        }
        Ok(if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        })
    };
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
            emit(e.index, keep.then(|| audit_row(&e)))
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
            emit(e.offset, keep.then(|| effect_row(&e)))
        }),
        Table::Quarantine => txn.scan_quarantine(from, |q| {
            let r = &q.record;
            // Quarantine records do not name their source: the audit entry of their first
            // delivery does (none for malformed messages).
            let source = if filter.wants_source() {
                txn.audit_entry(r.audit_index)?
                    .and_then(|a| a.record.agency.zip(a.record.source_id))
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
            emit(q.id, keep.then(|| quarantine_row(&q)))
        }),
    }?;
    Ok(next)
}

fn write_row(
    out: &mut impl Write,
    format: Format,
    zone: &Zone,
    table: Table,
    mut row: Row,
) -> io::Result<()> {
    if format != Format::Jsonl {
        mark_damaged(table, &mut row);
    }
    match format {
        Format::Jsonl => writeln!(out, "{}", escape_json(&Json::Object(row).to_compact())),
        Format::Table => {
            // A view only: the row (and the audit hash input it came from) keeps UTC text.
            if !zone.is_utc() {
                for (name, v) in &mut row {
                    if let (true, Json::String(t)) = (TIME_COLUMNS.contains(&name.as_str()), &*v) {
                        *v = Json::String(zone.show(t));
                    }
                }
            }
            write_table_row(out, &table_columns(table, zone), Some(&row))
        }
        Format::Csv => write_csv_row(out, csv_columns(table), Some(&row)),
    }
}

/// Table and CSV have fixed columns: a damaged payload is flagged in front of the effect's
/// `message` (the bytes as a string) or the quarantine record's `reason` (its `payload`
/// column stays the reversible bytes).
fn mark_damaged(table: Table, row: &mut Row) {
    let Some(err) = row
        .iter()
        .find(|(k, _)| k == PAYLOAD_ERROR)
        .map(|(_, v)| v.clone())
    else {
        return;
    };
    let column = match table {
        Table::Effects => "message",
        Table::Quarantine => "reason",
        Table::Audit => return,
    };
    if let (Some((_, v)), Json::String(err)) = (row.iter_mut().find(|(k, _)| k == column), err) {
        let shown = match &*v {
            Json::String(s) => s.clone(),
            other => other.to_compact(),
        };
        *v = Json::String(format!("[payload damaged: {err}] {shown}"));
    }
}

/// The audit entry's hashed fields (shared with the hash chain) plus `prev_hash` and `hash`.
pub fn audit_row(e: &AuditEntry) -> Row {
    let mut row = store::audit_body_fields(e.index, &e.record);
    row.push(("prev_hash".into(), Json::String(hex(&e.record.prev_hash))));
    row.push(("hash".into(), Json::String(hex(&e.record.hash))));
    row
}

/// The field a row gains, only when its stored payload should be JSON and is not (the record
/// was damaged or edited): the parser's error.
pub const PAYLOAD_ERROR: &str = "payload_error";

pub fn effect_row(e: &Effect) -> Row {
    let r = &e.record;
    // Effects hold payloads that parsed as JSON objects (at most 128 levels deep, the
    // largest `max_depth`); if that fails now, show the bytes as a string and say so.
    let (message, damaged) = match json::parse(&r.payload, 128) {
        Ok(v) => (v, None),
        Err(e) => (Json::String(escape_bytes(&r.payload).0), Some(e)),
    };
    let mut row = vec![
        ("offset".into(), num(e.offset)),
        ("key".into(), opt_hex(Some(r.key))),
        ("agency".into(), text(&r.agency)),
        ("source_id".into(), text(&r.source_id)),
        ("epoch".into(), num(r.epoch)),
        ("sequence".into(), num(r.sequence)),
        ("topic".into(), text(&r.topic)),
        ("received_at".into(), text(&rfc3339_ms(r.received_at_ms))),
        ("late".into(), Json::Bool(r.late)),
        ("released".into(), Json::Bool(r.released)),
        ("audit_index".into(), num(r.audit_index)),
        ("message".into(), message),
    ];
    if let Some(e) = damaged {
        row.push((PAYLOAD_ERROR.into(), text(&e.to_string())));
    }
    row
}

pub fn quarantine_row(q: &QuarantineEntry) -> Row {
    let r = &q.record;
    let (payload, encoding) = escape_bytes(&r.payload);
    let outcome = Outcome::from_code(r.outcome);
    // A conflicting or stale message decoded when it was quarantined; a malformed one need
    // not be JSON at all.
    let damaged = match outcome {
        Some(Outcome::Malformed) => None,
        _ => json::parse(&r.payload, 128).err(),
    };
    let mut row = vec![
        ("id".into(), num(q.id)),
        (
            "outcome".into(),
            text(outcome.map_or("unknown", Outcome::as_str)),
        ),
        ("reason".into(), text(&r.reason)),
        ("topic".into(), text(&r.topic)),
        ("received_at".into(), text(&rfc3339_ms(r.received_at_ms))),
        ("last_seen_at".into(), text(&rfc3339_ms(r.last_seen_ms))),
        ("deliveries".into(), num(r.deliveries)),
        ("key".into(), opt_hex(r.key)),
        ("audit_index".into(), opt_num(Some(r.audit_index))),
        ("payload_encoding".into(), text(encoding)),
        ("payload".into(), Json::String(payload)),
    ];
    if let Some(e) = damaged {
        row.push((PAYLOAD_ERROR.into(), text(&e.to_string())));
    }
    row
}

/// The payload as text: verbatim when it is UTF-8 (`"utf-8"`); otherwise `"escaped"`, where
/// `\` is written `\\` and each byte of an invalid sequence `\xNN`, which is reversible.
pub fn escape_bytes(bytes: &[u8]) -> (String, &'static str) {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return (s.to_string(), "utf-8");
    }
    let mut out = String::with_capacity(bytes.len() + 16);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&chunk.valid().replace('\\', "\\\\"));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    (out, "escaped")
}

/// The table's time columns, shown in the `--tz` zone.
const TIME_COLUMNS: [&str; 2] = ["recorded_at", "received_at"];

/// The table columns; a time with an offset (`+01:00`, not `Z`) needs five more characters.
fn table_columns(table: Table, zone: &Zone) -> Vec<(&'static str, usize)> {
    columns(table)
        .iter()
        .map(|&(name, width)| {
            let wide = !zone.is_utc() && TIME_COLUMNS.contains(&name);
            (name, if wide { width + 5 } else { width })
        })
        .collect()
}

fn columns(table: Table) -> &'static [(&'static str, usize)] {
    match table {
        Table::Audit => &[
            ("index", 8),
            ("recorded_at", 25),
            ("outcome", 13),
            ("agency", 12),
            ("source_id", 14),
            ("epoch", 6),
            ("sequence", 10),
            ("key", 17),
            ("effect_offset", 14),
            ("quarantine_id", 14),
            ("reason", 0),
        ],
        Table::Effects => &[
            ("offset", 8),
            ("received_at", 25),
            ("agency", 12),
            ("source_id", 14),
            ("epoch", 6),
            ("sequence", 10),
            ("late", 6),
            ("key", 17),
            ("topic", 20),
            ("message", 0),
        ],
        Table::Quarantine => &[
            ("id", 6),
            ("received_at", 25),
            ("outcome", 10),
            ("deliveries", 11),
            ("key", 17),
            ("topic", 20),
            ("reason", 0),
        ],
    }
}

/// The CSV columns: every jsonl field, in the jsonl order.
fn csv_columns(table: Table) -> &'static [&'static str] {
    match table {
        Table::Audit => &[
            "index",
            "recorded_at",
            "outcome",
            "key",
            "agency",
            "source_id",
            "epoch",
            "sequence",
            "topic",
            "reason",
            "digest",
            "effect_offset",
            "quarantine_id",
            "prev_hash",
            "hash",
        ],
        Table::Effects => &[
            "offset",
            "key",
            "agency",
            "source_id",
            "epoch",
            "sequence",
            "topic",
            "received_at",
            "late",
            "released",
            "audit_index",
            "message",
        ],
        Table::Quarantine => &[
            "id",
            "outcome",
            "reason",
            "topic",
            "received_at",
            "last_seen_at",
            "deliveries",
            "key",
            "audit_index",
            "payload_encoding",
            "payload",
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_utf8_payloads_are_escaped_reversibly() {
        assert_eq!(
            escape_bytes(b"{\"a\":1}"),
            ("{\"a\":1}".to_string(), "utf-8")
        );
        assert_eq!(
            escape_bytes(b"a\\b\xff"),
            ("a\\\\b\\xff".to_string(), "escaped")
        );
    }

    #[test]
    fn csv_columns_are_the_jsonl_fields_in_order() {
        let audit = crate::store::tables::AuditRecord {
            recorded_at_ms: 0,
            outcome: 0,
            key: None,
            agency: None,
            source_id: None,
            epoch: None,
            sequence: None,
            topic: String::new(),
            reason: String::new(),
            digest: None,
            effect_offset: None,
            quarantine_id: None,
            prev_hash: [0; 32],
            hash: [0; 32],
        };
        let effect = crate::store::tables::EffectRecord {
            source_no: 0,
            epoch: 0,
            sequence: 0,
            received_at_ms: 0,
            key: [0; 32],
            agency: String::new(),
            source_id: String::new(),
            topic: String::new(),
            late: false,
            released: false,
            audit_index: 0,
            payload: b"{}".to_vec(),
        };
        // Intact records: a damaged one adds `payload_error`, which CSV shows as a marker.
        let quarantine = crate::store::tables::QuarantineRecord {
            outcome: Outcome::Conflict.code(),
            reason: String::new(),
            topic: String::new(),
            received_at_ms: 0,
            last_seen_ms: 0,
            deliveries: 1,
            key: None,
            audit_index: 0,
            payload: b"{}".to_vec(),
        };
        let names = |row: Row| row.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        let rows = [
            (
                Table::Audit,
                names(audit_row(&AuditEntry {
                    index: 0,
                    record: audit,
                })),
            ),
            (
                Table::Effects,
                names(effect_row(&Effect {
                    offset: 0,
                    record: effect,
                })),
            ),
            (
                Table::Quarantine,
                names(quarantine_row(&QuarantineEntry {
                    id: 0,
                    record: quarantine,
                })),
            ),
        ];
        for (table, fields) in rows {
            assert_eq!(csv_columns(table), fields, "{table:?}");
        }
    }
}
