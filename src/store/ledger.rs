//! A relay sink's ledger: how every offset below its cursor got there. Entry 0
//! says where the sink's concern starts (`Start`, or `Legacy` for a cursor older than
//! ledgers); the entries after it partition the offsets from there up to the cursor, in
//! order: delivered, parked, retried, or passed over by an audited action (skip, adoption of
//! the sink's own cursor). Consecutive deliveries in one generation extend one entry, so the
//! ledger grows with parks and operator actions, not with traffic.
//!
//! Written only by `store::relay`, in the transaction that moves the cursor; `account` is the
//! pure check that `verify` and `relay status` run over it.

use super::StoreError;
use super::tables::{LedgerKind, LedgerRecord, SinkRecord, Stream};
use super::tx::Tx;

fn entry(
    kind: LedgerKind,
    from: u64,
    to: u64,
    generation: u64,
    now_ms: u64,
    audit_index: Option<u64>,
) -> LedgerRecord {
    LedgerRecord {
        kind: kind.code(),
        from,
        to,
        generation,
        first_at_ms: now_ms,
        last_at_ms: now_ms,
        audit_index,
    }
}

/// Writes entry 0 of a cursor's ledger at its position: `Start` for a new cursor, `Legacy`
/// for one written before ledgers existed. The caller writes `rec` back.
pub(super) fn begin(
    tx: &mut dyn Tx,
    name: &str,
    rec: &mut SinkRecord,
    kind: LedgerKind,
    now_ms: u64,
) -> Result<(), StoreError> {
    tx.put_ledger(
        name,
        0,
        &entry(kind, rec.next, rec.next, rec.generation, now_ms, None),
    )?;
    rec.ledger_len = 1;
    Ok(())
}

/// A cursor written before ledgers existed gets its `Legacy` entry 0 before anything else is
/// recorded about it.
pub(super) fn ensure(
    tx: &mut dyn Tx,
    name: &str,
    rec: &mut SinkRecord,
    now_ms: u64,
) -> Result<(), StoreError> {
    if rec.ledger_len == 0 {
        begin(tx, name, rec, LedgerKind::Legacy, now_ms)?;
    }
    Ok(())
}

/// Appends `e`, or extends the last entry when both are deliveries (or entries not
/// selected) of one generation that meet.
fn append(
    tx: &mut dyn Tx,
    name: &str,
    rec: &mut SinkRecord,
    e: LedgerRecord,
) -> Result<(), StoreError> {
    let merges = [LedgerKind::Delivered.code(), LedgerKind::NotSelected.code()];
    if merges.contains(&e.kind) && rec.ledger_len > 1 {
        let last_seq = rec.ledger_len - 1;
        if let Some((seq, mut last)) = tx.ledger(name, last_seq..=last_seq)?.pop()
            && last.kind == e.kind
            && last.to == e.from
            && last.generation == e.generation
        {
            last.to = e.to;
            last.last_at_ms = e.last_at_ms;
            return tx.put_ledger(name, seq, &last);
        }
    }
    tx.put_ledger(name, rec.ledger_len, &e)?;
    rec.ledger_len += 1;
    Ok(())
}

/// Records a deliverer's move of the cursor from `from` to `to`: every offset in between
/// delivered, except those in `parked` (offsets below `to`, each parked for good) and those
/// in `not_selected` (audit entries an audit sink's `outcomes` passes over).
pub(super) fn advanced(
    tx: &mut dyn Tx,
    name: &str,
    rec: &mut SinkRecord,
    (from, to): (u64, u64),
    parked: &[u64],
    not_selected: &[u64],
    now_ms: u64,
) -> Result<(), StoreError> {
    let generation = rec.generation;
    let mut passed: Vec<(u64, LedgerKind)> = parked
        .iter()
        .map(|p| (*p, LedgerKind::Parked))
        .chain(not_selected.iter().map(|p| (*p, LedgerKind::NotSelected)))
        .filter(|(p, _)| (from..to).contains(p))
        .collect();
    passed.sort_unstable_by_key(|(p, _)| *p);
    passed.dedup_by_key(|(p, _)| *p);
    let mut at = from;
    for (p, kind) in passed {
        if p > at {
            append(
                tx,
                name,
                rec,
                entry(LedgerKind::Delivered, at, p, generation, now_ms, None),
            )?;
        }
        append(
            tx,
            name,
            rec,
            entry(kind, p, p + 1, generation, now_ms, None),
        )?;
        at = p + 1;
    }
    if to > at {
        append(
            tx,
            name,
            rec,
            entry(LedgerKind::Delivered, at, to, generation, now_ms, None),
        )?;
    }
    Ok(())
}

/// Records that `from..to` was passed over by the action of audit entry `audit_index`
/// (`Skipped`, `Adopted`), or that the blocking event at `from` was parked for good by it
/// (`Parked`, one offset).
pub(super) fn passed_over(
    tx: &mut dyn Tx,
    name: &str,
    rec: &mut SinkRecord,
    kind: LedgerKind,
    (from, to): (u64, u64),
    audit_index: Option<u64>,
    now_ms: u64,
) -> Result<(), StoreError> {
    if to <= from {
        return Ok(());
    }
    append(
        tx,
        name,
        rec,
        entry(kind, from, to, rec.generation, now_ms, audit_index),
    )
}

/// A parked event at `offset` was resolved: delivered after `relay retry` (`Retried`) or
/// discarded by an operator (`Discarded`, with its audit entry). Its `Parked` entry changes
/// kind; a blocking one at the cursor gets an entry of that kind as the cursor passes it.
pub(super) fn resolved(
    tx: &mut dyn Tx,
    name: &str,
    rec: &mut SinkRecord,
    (offset, kind, audit_index): (u64, LedgerKind, Option<u64>),
    cursor_passes: bool,
    now_ms: u64,
) -> Result<(), StoreError> {
    if cursor_passes {
        return append(
            tx,
            name,
            rec,
            entry(
                kind,
                offset,
                offset + 1,
                rec.generation,
                now_ms,
                audit_index,
            ),
        );
    }
    let found = tx
        .ledger(name, 0..=u64::MAX)?
        .into_iter()
        .rev()
        .find(|(_, e)| e.kind == LedgerKind::Parked.code() && e.from == offset);
    if let Some((seq, mut e)) = found {
        e.kind = kind.code();
        e.audit_index = audit_index;
        e.last_at_ms = now_ms;
        tx.put_ledger(name, seq, &e)?;
    }
    Ok(())
}

/// How many positions of `from..to` the sink's ledger says it passed over as not selected by
/// its `outcomes` (an audit sink's).
pub(super) fn not_selected_in(
    tx: &mut dyn Tx,
    name: &str,
    from: u64,
    to: u64,
) -> Result<u64, StoreError> {
    Ok(tx
        .ledger(name, 0..=u64::MAX)?
        .iter()
        .filter(|(_, e)| e.kind == LedgerKind::NotSelected.code())
        .map(|(_, e)| e.to.min(to).saturating_sub(e.from.max(from)))
        .sum())
}

/// The cursor moves back to `to` (a rewind, or the sink's own cursor adopted backwards):
/// what the ledger says about offsets from `to` up no longer holds and is removed; entry 0
/// moves down to `to` if the cursor goes below where the sink started.
pub(super) fn cut_back(
    tx: &mut dyn Tx,
    name: &str,
    rec: &mut SinkRecord,
    to: u64,
    now_ms: u64,
) -> Result<(), StoreError> {
    let entries = tx.ledger(name, 0..=u64::MAX)?;
    for (seq, mut e) in entries.into_iter().rev() {
        if seq == 0 {
            if e.from > to {
                e.from = to;
                e.to = to;
                e.last_at_ms = now_ms;
                tx.put_ledger(name, 0, &e)?;
            }
            break;
        }
        if e.from >= to {
            tx.remove_ledger(name, seq..=seq)?;
            rec.ledger_len = seq;
        } else {
            if e.to > to {
                e.to = to;
                e.last_at_ms = now_ms;
                tx.put_ledger(name, seq, &e)?;
            }
            break;
        }
    }
    Ok(())
}

/// What a sink's ledger accounts for, as `verify` and `relay status` show it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accounting {
    /// Where the sink's concern starts (entry 0).
    pub from: u64,
    /// Entry 0 is `Legacy`: the cursor predates ledgers; offsets below `from` were moved
    /// past by an older version, which kept no account of them.
    pub legacy: bool,
    /// No ledger at all: a cursor older than ledgers that this version has not written yet.
    pub unrecorded: bool,
    /// Offsets from `from` up to the cursor, by how they got below it.
    pub delivered: u64,
    pub parked: u64,
    pub retried: u64,
    pub skipped: u64,
    pub adopted: u64,
    pub discarded: u64,
    /// Audit entries an audit sink passed over: their outcome is not among its `outcomes`.
    pub not_selected: u64,
    /// The ledger's entries.
    pub entries: u64,
    /// Each pass-over (skip, adoption, discard): its kind, offsets and audit entry, for
    /// `verify` to check against the audit log.
    pub passed_over: Vec<(LedgerKind, u64, u64, Option<u64>)>,
}

impl Accounting {
    /// Where the sink began, in words, when that was after the log's first position: "began
    /// at offset 80: 80 effects applied before it existed were not delivered to it" (a sink
    /// added to a store whose older effects were pruned, or made with `start = "head"`).
    /// `None` from the log's start, or for a cursor older than ledgers (which kept no
    /// account of where it began).
    pub fn began_words(&self, stream: super::tables::Stream) -> Option<String> {
        (self.from > 0 && !self.legacy && !self.unrecorded).then(|| {
            let done = match stream {
                super::tables::Stream::Effects => "applied",
                super::tables::Stream::Audit => "recorded",
            };
            format!(
                "began at {} {}: {} {} {done} before it existed were not delivered to it",
                stream.position(),
                self.from,
                self.from,
                stream.entries()
            )
        })
    }

    /// Offsets below the cursor the ledger accounts for.
    #[cfg(test)]
    pub fn total(&self) -> u64 {
        self.delivered
            + self.parked
            + self.retried
            + self.skipped
            + self.adopted
            + self.discarded
            + self.not_selected
    }
}

/// Checks that `ledger` (sink `rec`'s entries, by number) accounts for every offset below
/// the cursor, and that `parked` (the sink's parked events: offset, blocking) match it.
/// `Err` says, in words, the first thing that does not hold.
pub fn account(
    rec: &SinkRecord,
    ledger: &[(u64, LedgerRecord)],
    parked: &[(u64, bool)],
) -> Result<Accounting, String> {
    let mut acc = Accounting {
        entries: ledger.len() as u64,
        ..Accounting::default()
    };
    if rec.ledger_len == 0 {
        if !ledger.is_empty() {
            return Err(format!(
                "its cursor record says it has no ledger, but the ledger holds {} entries \
                 (the cursor record was replaced)",
                ledger.len()
            ));
        }
        acc.unrecorded = true;
        acc.from = rec.next;
        return Ok(acc);
    }
    for (i, (seq, _)) in ledger.iter().enumerate() {
        if *seq != i as u64 {
            return Err(format!(
                "ledger entry {i} is missing (the next one is numbered {seq})"
            ));
        }
    }
    if ledger.len() as u64 != rec.ledger_len {
        return Err(format!(
            "its cursor record counts {} ledger entries but the ledger holds {} (entries were \
             removed or added)",
            rec.ledger_len,
            ledger.len()
        ));
    }
    let Some((_, first)) = ledger.first() else {
        return Err("its ledger is empty".into());
    };
    match LedgerKind::from_code(first.kind) {
        Some(LedgerKind::Start) => {}
        Some(LedgerKind::Legacy) => acc.legacy = true,
        _ => return Err("ledger entry 0 is not where the sink starts".into()),
    }
    acc.from = first.from;
    let mut frontier = first.from;
    let mut parked_entries = Vec::new();
    for (seq, e) in &ledger[1..] {
        let Some(kind) = LedgerKind::from_code(e.kind) else {
            return Err(format!("ledger entry {seq} has unknown kind {}", e.kind));
        };
        if e.from != frontier {
            return Err(format!(
                "ledger entry {seq} ({} {}..{}) does not start where the one before ends \
                 ({frontier}): offsets {} are unaccounted for",
                kind.as_str(),
                e.from,
                e.to,
                range_text(frontier.min(e.from), frontier.max(e.from)),
            ));
        }
        if e.to <= e.from {
            return Err(format!("ledger entry {seq} is empty or backwards"));
        }
        let n = e.to - e.from;
        match kind {
            LedgerKind::Start | LedgerKind::Legacy => {
                return Err(format!("ledger entry {seq} restarts the ledger"));
            }
            LedgerKind::Delivered => acc.delivered += n,
            LedgerKind::NotSelected if rec.stream() != Some(Stream::Audit) => {
                return Err(format!(
                    "ledger entry {seq} passes over offsets {} as not selected, but only an \
                     audit sink selects entries by outcome",
                    range_text(e.from, e.to)
                ));
            }
            LedgerKind::NotSelected => acc.not_selected += n,
            LedgerKind::Parked | LedgerKind::Retried | LedgerKind::Discarded if n != 1 => {
                return Err(format!("ledger entry {seq} parks more than one event"));
            }
            LedgerKind::Parked => {
                acc.parked += 1;
                parked_entries.push(e.from);
            }
            LedgerKind::Retried => acc.retried += 1,
            LedgerKind::Skipped | LedgerKind::Adopted | LedgerKind::Discarded
                if e.audit_index.is_none() =>
            {
                return Err(format!(
                    "ledger entry {seq} passes over offsets {} without an audited action",
                    range_text(e.from, e.to)
                ));
            }
            LedgerKind::Skipped | LedgerKind::Adopted | LedgerKind::Discarded => {
                match kind {
                    LedgerKind::Skipped => acc.skipped += n,
                    LedgerKind::Adopted => acc.adopted += n,
                    _ => acc.discarded += n,
                }
                acc.passed_over.push((kind, e.from, e.to, e.audit_index));
            }
        }
        frontier = e.to;
    }
    if frontier != rec.next {
        return Err(format!(
            "its cursor is at offset {} but its ledger accounts for offsets up to {frontier} \
             only{}",
            rec.next,
            if rec.next > frontier {
                format!(
                    ": offsets {} were neither delivered, parked nor passed over by an \
                     audited action (the cursor was moved by hand?)",
                    range_text(frontier, rec.next)
                )
            } else {
                String::new()
            }
        ));
    }
    for &(offset, blocking) in parked {
        let below = offset < rec.next;
        let recorded = parked_entries.binary_search(&offset).is_ok();
        let ok = if blocking {
            offset == rec.next || recorded
        } else {
            recorded || (acc.legacy && (offset < acc.from || offset >= rec.next))
        };
        if !ok {
            return Err(format!(
                "it holds a parked event at offset {offset}{} that its ledger does not record",
                if below { "" } else { " at or above its cursor" }
            ));
        }
    }
    for p in &parked_entries {
        if !parked.iter().any(|(o, _)| o == p) {
            return Err(format!(
                "its ledger parks the event at offset {p}, but no parked record holds it \
                 (deleted, and not delivered by a retry)"
            ));
        }
    }
    Ok(acc)
}

/// `a..b` as an operator reads offsets: "7", "7-9".
pub fn range_text(a: u64, b: u64) -> String {
    if b <= a + 1 {
        a.to_string()
    } else {
        format!("{a}-{}", b - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(next: u64, ledger_len: u64) -> SinkRecord {
        SinkRecord {
            kind: "exec".into(),
            next,
            generation: 0,
            registered_at_ms: 0,
            advanced_at_ms: 0,
            delivered: 0,
            parked: 0,
            last_error: None,
            ledger_len,
            stream: 0,
            offered_to: next,
            resent: 0,
        }
    }

    fn e(kind: LedgerKind, from: u64, to: u64, audit: Option<u64>) -> LedgerRecord {
        entry(kind, from, to, 0, 0, audit)
    }

    fn numbered(v: Vec<LedgerRecord>) -> Vec<(u64, LedgerRecord)> {
        v.into_iter()
            .enumerate()
            .map(|(i, r)| (i as u64, r))
            .collect()
    }

    #[test]
    fn a_ledger_that_partitions_the_offsets_below_the_cursor_accounts_for_each() {
        let l = numbered(vec![
            e(LedgerKind::Start, 2, 2, None),
            e(LedgerKind::Delivered, 2, 5, None),
            e(LedgerKind::Parked, 5, 6, None),
            e(LedgerKind::Skipped, 6, 9, Some(40)),
            e(LedgerKind::Retried, 9, 10, None),
            e(LedgerKind::Adopted, 10, 12, Some(41)),
        ]);
        let a = account(&rec(12, 6), &l, &[(5, false)]).unwrap();
        assert_eq!(
            (
                a.from,
                a.delivered,
                a.parked,
                a.skipped,
                a.retried,
                a.adopted
            ),
            (2, 3, 1, 3, 1, 2)
        );
        assert_eq!(a.total(), 10);
        assert_eq!(a.passed_over.len(), 2);
    }

    #[test]
    fn a_cursor_moved_by_hand_is_named_with_the_offsets_nobody_accounts_for() {
        let l = numbered(vec![
            e(LedgerKind::Start, 0, 0, None),
            e(LedgerKind::Delivered, 0, 8, None),
        ]);
        let err = account(&rec(20, 2), &l, &[]).unwrap_err();
        assert!(err.contains("offsets 8-19 were neither delivered"), "{err}");
    }

    #[test]
    fn gaps_missing_entries_and_orphan_parks_are_violations() {
        let gap = numbered(vec![
            e(LedgerKind::Start, 0, 0, None),
            e(LedgerKind::Delivered, 0, 3, None),
            e(LedgerKind::Delivered, 4, 6, None),
        ]);
        assert!(
            account(&rec(6, 3), &gap, &[])
                .unwrap_err()
                .contains("offsets 3 are unaccounted")
        );
        let short = numbered(vec![e(LedgerKind::Start, 0, 0, None)]);
        assert!(
            account(&rec(0, 2), &short, &[])
                .unwrap_err()
                .contains("counts 2 ledger entries")
        );
        let parked = numbered(vec![
            e(LedgerKind::Start, 0, 0, None),
            e(LedgerKind::Delivered, 0, 6, None),
        ]);
        assert!(
            account(&rec(6, 2), &parked, &[(3, false)])
                .unwrap_err()
                .contains("parked event at offset 3")
        );
        // A blocking event waits at the cursor, unrecorded until it is resolved.
        assert!(account(&rec(6, 2), &parked, &[(6, true)]).is_ok());
        let lost_park = numbered(vec![
            e(LedgerKind::Start, 0, 0, None),
            e(LedgerKind::Parked, 0, 1, None),
        ]);
        assert!(
            account(&rec(1, 2), &lost_park, &[])
                .unwrap_err()
                .contains("no parked record holds it")
        );
        let unaudited = numbered(vec![
            e(LedgerKind::Start, 0, 0, None),
            e(LedgerKind::Skipped, 0, 4, None),
        ]);
        assert!(
            account(&rec(4, 2), &unaudited, &[])
                .unwrap_err()
                .contains("without an audited action")
        );
    }

    #[test]
    fn a_cursor_older_than_ledgers_is_reported_not_failed() {
        let a = account(&rec(7, 0), &[], &[(3, false)]).unwrap();
        assert!(a.unrecorded);
        let legacy = numbered(vec![
            e(LedgerKind::Legacy, 7, 7, None),
            e(LedgerKind::Delivered, 7, 9, None),
        ]);
        let a = account(&rec(9, 2), &legacy, &[(3, false)]).unwrap();
        assert!(a.legacy);
        assert_eq!((a.from, a.delivered), (7, 2));
    }
}
