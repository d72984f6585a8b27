//! `verify`: recompute the audit hash chain from its anchor and check the record's invariants,
//! streaming through the logs (point lookups for cross-references).

use std::collections::HashSet;
use std::ops::ControlFlow;

use super::{Snapshot, StoreError};
use crate::model::{Outcome, hex};

/// What `verify` checked, or the first violation it found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub audit_entries: u64,
    pub effects: u64,
    pub counts: crate::model::OutcomeCounts,
    /// The first broken entry, in words; `None` when everything holds.
    pub violation: Option<String>,
}

/// Checks, in order:
/// - the chain: contiguous indices from the anchor, each `prev_hash` the previous `hash`, each
///   `hash` recomputed, the last one the stored chain head;
/// - each `applied`/`applied_late` entry has its effect record (same key, pointing back), and no
///   key is applied twice;
/// - each `duplicate` refers to an earlier applied entry with the same key and digest;
/// - each `conflict`/`stale`/`malformed` entry has its quarantine record;
/// - each effect record has its applied audit entry.
///
/// Memory: one 32-byte key per applied entry (to prove no key is applied twice).
pub fn verify(snap: &Snapshot) -> Result<VerifyReport, StoreError> {
    let meta = snap.meta()?;
    let (mut expected, mut prev) = match meta.audit_anchor {
        Some((index, hash)) => (index + 1, hash),
        None => (0, [0u8; 32]),
    };
    let mut report = VerifyReport::default();
    let mut applied_keys: HashSet<[u8; 32]> = HashSet::new();
    let mut fail = None;
    snap.scan_audit::<StoreError>(expected, |e| {
        let at = |what: String| Some(format!("audit entry {}: {what}", e.index));
        let problem = if e.index != expected {
            at(format!(
                "expected index {expected} (an entry is missing or out of place)"
            ))
        } else if e.record.prev_hash != prev {
            at(format!(
                "prev_hash {} does not match the previous entry's hash {}",
                hex(&e.record.prev_hash),
                hex(&prev)
            ))
        } else if !e.hash_is_valid() {
            at("its hash does not match its content (edited)".into())
        } else {
            check_entry(snap, &e, &mut applied_keys)?.and_then(at)
        };
        if problem.is_some() {
            fail = problem;
            return Ok(ControlFlow::Break(()));
        }
        if let Some(o) = e.outcome() {
            report.counts.add(o);
        }
        report.audit_entries += 1;
        prev = e.record.hash;
        expected += 1;
        Ok(ControlFlow::Continue(()))
    })?;
    if fail.is_none() && (prev != meta.chain_head || expected != meta.next_audit) {
        fail = Some(format!(
            "the audit log ends at index {} with hash {}, but the database's chain head is index {} \
             with hash {} (entries were removed from the end)",
            expected.saturating_sub(1),
            hex(&prev),
            meta.next_audit.saturating_sub(1),
            hex(&meta.chain_head)
        ));
    }
    if fail.is_none() {
        snap.scan_effects::<StoreError>(0, |eff| {
            report.effects += 1;
            let ok = snap.audit_entry(eff.record.audit_index)?.is_some_and(|a| {
                a.outcome().is_some_and(Outcome::applies)
                    && a.record.effect_offset == Some(eff.offset)
            });
            if !ok {
                fail = Some(format!(
                    "effect {}: its audit entry {} is missing or does not record applying it",
                    eff.offset, eff.record.audit_index
                ));
                return Ok(ControlFlow::Break(()));
            }
            Ok(ControlFlow::Continue(()))
        })?;
    }
    report.violation = fail;
    Ok(report)
}

/// The invariants of one (hash-valid) entry; `Some(problem)` if broken.
fn check_entry(
    snap: &Snapshot,
    e: &super::AuditEntry,
    applied_keys: &mut HashSet<[u8; 32]>,
) -> Result<Option<String>, StoreError> {
    let Some(outcome) = e.outcome() else {
        return Ok(Some(format!("unknown outcome code {}", e.record.outcome)));
    };
    Ok(match outcome {
        Outcome::Applied | Outcome::AppliedLate => {
            let Some(offset) = e.record.effect_offset else {
                return Ok(Some(format!("{outcome} without an effect offset")));
            };
            let Some(key) = e.record.key else {
                return Ok(Some(format!("{outcome} without a key")));
            };
            match snap.effect(offset)? {
                None => Some(format!("{outcome} but effect {offset} does not exist")),
                Some(eff) if eff.record.key != key || eff.record.audit_index != e.index => Some(
                    format!("{outcome} but effect {offset} records another key or audit entry"),
                ),
                Some(_) if !applied_keys.insert(key) => {
                    Some(format!("key {} applied a second time", hex(&key)))
                }
                Some(_) => None,
            }
        }
        Outcome::Duplicate => {
            let original = match e.record.effect_offset {
                Some(o) => snap.effect(o)?,
                None => None,
            };
            match original {
                None => Some("duplicate without the effect it duplicates".into()),
                Some(eff) => match snap.audit_entry(eff.record.audit_index)? {
                    Some(a)
                        if a.index < e.index
                            && a.outcome().is_some_and(Outcome::applies)
                            && a.record.key == e.record.key
                            && a.record.digest == e.record.digest =>
                    {
                        None
                    }
                    _ => Some(format!(
                        "duplicate of effect {} is not backed by an earlier applied entry with the same key and digest",
                        eff.offset
                    )),
                },
            }
        }
        Outcome::Conflict | Outcome::Stale | Outcome::Malformed => match e.record.quarantine_id {
            Some(q) if snap.quarantined(q)?.is_some() => None,
            _ => Some(format!("{outcome} without its quarantine record")),
        },
    })
}
