//! `verify`: prove the audit chain, the record's invariants and every stored payload against
//! its audit entry; exit 4 naming the first broken entry or record.

use std::io::Write as _;

use anyhow::anyhow;

use super::Failure;
use crate::cli::DbArgs;
use crate::model::Outcome;
use crate::store::verify;

pub fn run(args: &DbArgs) -> Result<(), Failure> {
    // Digests depend on the feed contract: `run`'s --config, or the defaults.
    let config = super::config(args)?;
    let (db, snapshot) = super::open_snapshot(&config)?;
    let report = checked(&snapshot, &config.feed, "verifying")?;
    let counts: Vec<String> = Outcome::ALL
        .iter()
        .map(|o| format!("{o}={}", report.counts.get(*o)))
        .collect();
    match report.violation {
        None => {
            // The snapshot above is what readers see; a writer also needs redb's allocator
            // state and every page's checksum to hold (a file can pass one and not the other).
            // (A redb file's; PostgreSQL checks its own pages.)
            if !snapshot.is_postgres() {
                crate::store::check_writer_open(&db)?;
            }
            let from = if report.audit_from == 0 {
                "from the first entry".to_string()
            } else {
                format!(
                    "from the retention anchor (entries before #{} were pruned)",
                    report.audit_from
                )
            };
            let _ = writeln!(
                crate::output::stdout(),
                "verified {}: {} audit entries, hash chain intact {from}; {} effects each backed by their audit entry and matching its digest, no key applied twice except by operator release; {} quarantine records matching their audit entries; {}",
                db.display(),
                report.audit_entries,
                report.effects,
                report.quarantined,
                counts.join(" ")
            );
            if let Some(n) = report.key_index {
                let _ = writeln!(
                    crate::output::stdout(),
                    "key index: each of the {n} audit entries with a key found under it, no other row"
                );
            }
            if let Some(n) = report.source_index {
                let _ = writeln!(
                    crate::output::stdout(),
                    "source index: each of the {n} audit entries with a source and a position found under its source, no other row"
                );
            }
            for sink in &report.sinks {
                let _ = writeln!(crate::output::stdout(), "{}", sink_line(sink));
            }
            Ok(())
        }
        Some(v) => Err(Failure::Violation(anyhow!(
            "{}: verification failed: {v}",
            db.display()
        ))),
    }
}

/// What `verify` proved of one relay sink, in one line (also the report's verdict).
pub(crate) fn sink_line(s: &verify::SinkReport) -> String {
    let a = &s.accounting;
    let mut line = if a.unrecorded {
        format!(
            "sink {}: cursor at {} written before ledgers: its offsets are accounted for from \
             its next move on",
            s.name, s.next
        )
    } else {
        let mut parts = format!(
            "{} delivered, {} parked, {} delivered after retry, {} skipped by an audited \
             operator action, {} discarded by an audited operator action, {} found in the \
             sink's own store (audited)",
            a.delivered, a.parked, a.retried, a.skipped, a.discarded, a.adopted
        );
        if s.stream == crate::store::tables::Stream::Audit {
            parts.push_str(&format!(
                ", {} not selected by its outcomes",
                a.not_selected
            ));
        }
        // An effects sink's line reads as it always has; an audit sink's names its stream.
        let name = match s.stream {
            crate::store::tables::Stream::Effects => s.name.clone(),
            crate::store::tables::Stream::Audit => format!("{} (audit stream)", s.name),
        };
        format!(
            "sink {name}: every {} from {} to its cursor {} accounted for{}: {parts}",
            s.stream.position(),
            a.from,
            s.next,
            if a.legacy {
                " (recorded since the upgrade to ledgers)"
            } else {
                ""
            },
        )
    };
    if let Some(began) = a.began_words(s.stream) {
        line.push_str(&format!("; {began}"));
    }
    line.push_str(&format!(
        "; {} parked events match the events their effects make",
        s.parked_checked
    ));
    if s.parked_unprovable > 0 {
        line.push_str(&format!(
            "; {} parked events cannot be checked (their effects were removed by retention \
             before this version kept them; `relay retry` refuses them)",
            s.parked_unprovable
        ));
    }
    line
}

/// `verify` with a progress bar of audit entries on a terminal (`what`: its label).
pub fn checked(
    snapshot: &crate::store::Snapshot,
    contract: &crate::wire::FeedContract,
    what: &str,
) -> Result<verify::VerifyReport, crate::store::StoreError> {
    let total = verify::entries_to_verify(snapshot)?;
    let bar = crate::progress::Progress::bar(what, total, "audit entries");
    verify::verify_reporting(snapshot, contract, &mut |n| bar.inc(n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ledger::Accounting;
    use crate::store::tables::Stream;

    #[test]
    fn an_audit_sinks_line_counts_the_entries_its_outcomes_passed_over() {
        let s = verify::SinkReport {
            name: "siem".into(),
            stream: Stream::Audit,
            next: 10,
            accounting: Accounting {
                delivered: 3,
                not_selected: 7,
                ..Accounting::default()
            },
            ..verify::SinkReport::default()
        };
        let line = sink_line(&s);
        assert!(
            line.starts_with("sink siem (audit stream): every audit index from 0 to its cursor 10")
                && line.contains("3 delivered")
                && line.contains("7 not selected by its outcomes"),
            "{line}"
        );
        // The parts add up to the cursor.
        let a = &s.accounting;
        let parts = a.delivered + a.parked + a.retried + a.skipped + a.discarded + a.adopted;
        assert_eq!(parts + a.not_selected, s.next - a.from);
        let effects = verify::SinkReport {
            stream: Stream::Effects,
            ..s.clone()
        };
        let line = sink_line(&effects);
        assert!(
            line.starts_with("sink siem: every offset from 0 to its cursor 10")
                && !line.contains("not selected"),
            "{line}"
        );
    }
}
