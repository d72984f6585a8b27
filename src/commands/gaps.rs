//! `gaps`: the sequence ranges missing per source and epoch between the lowest and highest
//! sequence the audit log has seen, from one streaming pass over the log.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::ops::ControlFlow;

use super::Failure;
use crate::cli::{Format, GapsArgs};
use crate::json::Json;
use crate::output::{Row, write_csv_row, write_table_row};
use crate::rangeset::RangeSet;
use crate::store::Snapshot;
use crate::textsafe::{escape_controls, escape_json};

/// Seen sequences per (agency, source_id, epoch).
type Seen = HashMap<(String, String, u64), RangeSet>;

const COLUMNS: &[(&str, usize)] = &[
    ("agency", 14),
    ("source_id", 14),
    ("epoch", 7),
    ("lowest", 11),
    ("highest", 11),
    ("missing_from", 14),
    ("missing_to", 12),
    ("missing_count", 0),
];
const CSV_COLUMNS: &[&str] = &[
    "agency",
    "source_id",
    "epoch",
    "lowest",
    "highest",
    "missing_from",
    "missing_to",
    "missing_count",
];

pub fn run(args: &GapsArgs) -> Result<(), Failure> {
    let source = args
        .source
        .as_ref()
        .map(|s| (s.agency.clone(), s.source_id.clone()));
    let (_, snapshot) = super::open_existing(&args.db)?;
    let seen = collect(&snapshot, source.as_ref())?;
    let mut out = BufWriter::new(crate::output::stdout());
    write(&seen, args.format, &mut out)?;
    out.flush()?;
    Ok(())
}

/// Every position the audit log names, as merged ranges per source and epoch. "Seen" is any
/// entry with a position, whatever its outcome; malformed entries have none.
pub fn collect(snapshot: &Snapshot, only: Option<&(String, String)>) -> Result<Seen, Failure> {
    let mut seen = Seen::new();
    snapshot.scan_audit::<Failure>(0, |e| {
        let r = e.record;
        if let (Some(agency), Some(source_id), Some(epoch), Some(sequence)) =
            (r.agency, r.source_id, r.epoch, r.sequence)
        {
            let wanted = only.is_none_or(|(a, s)| *a == agency && *s == source_id);
            if wanted {
                seen.entry((agency, source_id, epoch))
                    .or_default()
                    .insert(sequence);
            }
        }
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(seen)
}

/// The gap rows in (agency, source_id, epoch) order; `table` adds a summary line per group.
pub fn write(seen: &Seen, format: Format, out: &mut impl Write) -> Result<(), Failure> {
    let mut groups: Vec<_> = seen.iter().collect();
    groups.sort_by(|a, b| a.0.cmp(b.0));
    match format {
        Format::Jsonl => {}
        Format::Table => write_table_row(out, COLUMNS, None)?,
        Format::Csv => write_csv_row(out, CSV_COLUMNS, None)?,
    }
    let num = |n: u64| Json::Number(n.to_string());
    for ((agency, source_id, epoch), set) in groups {
        let (Some(lowest), Some(highest)) = (set.min(), set.max()) else {
            continue;
        };
        let mut holes = 0u64;
        let mut missing = 0u64;
        for (from, to) in set.gaps() {
            holes += 1;
            missing += to - from + 1;
            let row: Row = vec![
                ("agency".into(), Json::String(agency.clone())),
                ("source_id".into(), Json::String(source_id.clone())),
                ("epoch".into(), num(*epoch)),
                ("lowest".into(), num(lowest)),
                ("highest".into(), num(highest)),
                ("missing_from".into(), num(from)),
                ("missing_to".into(), num(to)),
                ("missing_count".into(), num(to - from + 1)),
            ];
            match format {
                Format::Jsonl => writeln!(out, "{}", escape_json(&Json::Object(row).to_compact()))?,
                Format::Table => write_table_row(out, COLUMNS, Some(&row))?,
                Format::Csv => write_csv_row(out, CSV_COLUMNS, Some(&row))?,
            }
        }
        if format == Format::Table {
            let verdict = if holes == 0 {
                "no gaps".to_string()
            } else {
                format!(
                    "{missing} missing in {holes} {}",
                    if holes == 1 { "gap" } else { "gaps" }
                )
            };
            writeln!(
                out,
                "# {} epoch {epoch}: sequences {lowest}..{highest}, {} seen, {verdict}",
                escape_controls(&format!("{agency}/{source_id}")),
                set.len()
            )?;
        }
    }
    Ok(())
}
