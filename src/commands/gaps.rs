//! `gaps`: the sequence ranges missing per source and epoch between the lowest and highest
//! sequence the audit log has seen, from one streaming pass over the log; for one source
//! (`--source`), from the log's source index instead.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::ops::ControlFlow;

use super::Failure;
use crate::cli::{Format, GapsArgs};
use crate::output::Printer;
use crate::output::rows::GapRow;
use crate::rangeset::RangeSet;
use crate::store::Snapshot;
use crate::textsafe::escape_controls;
use crate::timefmt::Zone;

/// Seen sequences per (agency, source_id, epoch).
type Seen = HashMap<(String, String, u64), RangeSet>;

pub fn run(args: &GapsArgs) -> Result<(), Failure> {
    let source = args
        .source
        .as_ref()
        .map(|s| (s.agency.clone(), s.source_id.clone()));
    let (_, snapshot) = super::open_existing(&args.db)?;
    let seen = collect(&snapshot, source.as_ref())?;
    write(&seen, args.format, BufWriter::new(crate::output::stdout()))
}

/// Every position the audit log names, as merged ranges per source and epoch. "Seen" is any
/// entry with a position, whatever its outcome; malformed entries have none. One source is
/// read from the source index when the store has one.
pub fn collect(snapshot: &Snapshot, only: Option<&(String, String)>) -> Result<Seen, Failure> {
    let mut seen = Seen::new();
    if let Some((agency, source_id)) = only {
        // Merged as they come: memory grows with the gaps, not the entries.
        let mut by_epoch: HashMap<u64, RangeSet> = HashMap::new();
        let indexed = snapshot.visit_positions_of(agency, source_id, &mut |epoch, sequence| {
            by_epoch.entry(epoch).or_default().insert(sequence);
        })?;
        if indexed {
            for (epoch, set) in by_epoch {
                seen.insert((agency.clone(), source_id.clone(), epoch), set);
            }
            return Ok(seen);
        }
    }
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
pub fn write(seen: &Seen, format: Format, out: impl Write) -> Result<(), Failure> {
    let mut groups: Vec<_> = seen.iter().collect();
    groups.sort_by(|a, b| a.0.cmp(b.0));
    let zone = Zone::utc();
    let mut printer = Printer::start::<GapRow>(format, &zone, out)?;
    for ((agency, source_id, epoch), set) in groups {
        let (Some(lowest), Some(highest)) = (set.min(), set.max()) else {
            continue;
        };
        let mut holes = 0u64;
        let mut missing = 0u64;
        for (from, to) in set.gaps() {
            holes += 1;
            missing = missing.saturating_add(to - from + 1);
            printer.print(&GapRow {
                agency,
                source_id,
                epoch: *epoch,
                lowest,
                highest,
                missing_from: from,
                missing_to: to,
            })?;
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
                printer.out(),
                "# {} epoch {epoch}: sequences {lowest}..{highest}, {} seen, {verdict}",
                escape_controls(&format!("{agency}/{source_id}")),
                set.len()
            )?;
        }
    }
    printer.flush()?;
    Ok(())
}
