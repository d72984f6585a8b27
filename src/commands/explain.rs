//! `explain`: the whole story of one event (one idempotency key) in plain words: its audit
//! entries, the effects and quarantine records they name, and the window and source marks now.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::ops::ControlFlow;

use anyhow::anyhow;

use super::Failure;
use crate::cli::{ExplainArgs, ExplainFormat};
use crate::json::Json;
use crate::key::derive_key;
use crate::model::{Outcome, Position, Source, hex};
use crate::output::rows::{AuditRow, EffectRow, QuarantineRow};
use crate::output::{Record, num};
use crate::store::lookup::PositionState;
use crate::store::{AuditEntry, Effect, QuarantineEntry, Snapshot, StoreError};
use crate::textsafe::{escape_controls, escape_json};
use crate::timefmt::Zone;

pub fn run(args: &ExplainArgs) -> Result<(), Failure> {
    // clap holds the rules: KEY or --source (not both), --source with --sequence, --epoch
    // only with --source.
    let key = match (&args.key, &args.source, args.sequence) {
        (Some(k), _, _) => *k,
        (None, Some(s), Some(sequence)) => *derive_key(
            &Source::new(s.agency.clone(), s.source_id.clone()),
            Position {
                epoch: args.epoch.unwrap_or(0),
                sequence,
            },
        )
        .as_bytes(),
        _ => {
            return Err(Failure::Usage(anyhow!(
                "name the event: KEY, or --source AGENCY/SOURCE --sequence N [--epoch E]"
            )));
        }
    };
    let zone = args.tz.clone().unwrap_or_else(Zone::utc);
    let (_, snapshot) = super::open_existing(&args.db)?;
    let story = Story::collect(&snapshot, key)?;
    if story.audit.is_empty() {
        let named = match (&args.source, &args.sequence) {
            (Some(s), Some(n)) => format!(
                " ({} epoch {} sequence {n})",
                escape_controls(&s.to_string()),
                args.epoch.unwrap_or(0)
            ),
            _ => String::new(),
        };
        // `--epoch` defaults to 0: a source that restarted its numbering is named by epoch.
        let hint = match (&args.source, args.epoch) {
            (Some(s), None) => other_epochs(&snapshot, &s.agency, &s.source_id)?,
            _ => String::new(),
        };
        return Err(Failure::Usage(anyhow!(
            "no audit entry has key {}{named}{hint}",
            hex(&key)
        )));
    }
    let text = match args.format {
        ExplainFormat::Text => story.text(&zone),
        ExplainFormat::Json => format!("{}\n", escape_json(&story.json().to_compact())),
    };
    let mut out = crate::output::stdout();
    out.write_all(text.as_bytes()).and_then(|()| out.flush())?;
    Ok(())
}

/// ": source has epochs 1, 2: add --epoch E" when the audit log holds the source under
/// epochs other than 0, else nothing.
/// Read from the source index, or a scan of the log in a store without one.
fn other_epochs(snapshot: &Snapshot, agency: &str, source_id: &str) -> Result<String, Failure> {
    let mut epochs = std::collections::BTreeSet::new();
    let indexed = snapshot.visit_positions_of(agency, source_id, &mut |epoch, _| {
        if epoch != 0 {
            epochs.insert(epoch);
        }
    })?;
    if !indexed {
        scan_epochs(snapshot, agency, source_id, &mut epochs)?;
    }
    if epochs.is_empty() {
        return Ok(String::new());
    }
    let listed: Vec<String> = epochs.iter().map(u64::to_string).collect();
    Ok(format!(
        ": source has epoch{} {}: add --epoch E",
        if epochs.len() == 1 { "" } else { "s" },
        listed.join(", ")
    ))
}

fn scan_epochs(
    snapshot: &Snapshot,
    agency: &str,
    source_id: &str,
    epochs: &mut std::collections::BTreeSet<u64>,
) -> Result<(), Failure> {
    snapshot.scan_audit::<StoreError>(0, |e| {
        let r = &e.record;
        if r.agency.as_deref() == Some(agency)
            && r.source_id.as_deref() == Some(source_id)
            && let Some(epoch) = r.epoch.filter(|&n| n != 0)
        {
            epochs.insert(epoch);
        }
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(())
}

/// A suppressed delivery with the effect it matched and the entry that applied it, told as
/// `explain` tells them, from point lookups (no scan): the report's sample proofs.
pub(crate) struct Suppression(Story);

impl Suppression {
    pub(crate) fn of(snapshot: &Snapshot, duplicate: &AuditEntry) -> Result<Self, StoreError> {
        let mut effects = BTreeMap::new();
        let mut audit = Vec::new();
        if let Some(offset) = duplicate.record.effect_offset
            && let Some(effect) = snapshot.effect(offset)?
        {
            if let Some(applying) = snapshot.audit_entry(effect.record.audit_index)? {
                audit.push(applying);
            }
            effects.insert(offset, effect);
        }
        audit.push(duplicate.clone());
        Ok(Suppression(Story {
            key: duplicate.record.key.unwrap_or_default(),
            audit,
            effects,
            quarantine: BTreeMap::new(),
            position: None,
            state: None,
        }))
    }

    /// The entry that applied the matched effect, if retention kept it.
    pub(crate) fn applying(&self) -> Option<&AuditEntry> {
        (self.0.audit.len() == 2).then(|| &self.0.audit[0])
    }

    /// `explain`'s sentence for `e`, its times in `zone`.
    pub(crate) fn sentence(&self, e: &AuditEntry, zone: &Zone) -> String {
        self.0.sentence(e, zone)
    }
}

/// Everything the database holds about one key.
struct Story {
    key: [u8; 32],
    /// Every audit entry with the key, oldest first.
    audit: Vec<AuditEntry>,
    effects: BTreeMap<u64, Effect>,
    quarantine: BTreeMap<u64, QuarantineEntry>,
    /// (agency, source_id, position), from the audit entries.
    position: Option<(String, String, Position)>,
    state: Option<PositionState>,
}

impl Story {
    fn collect(snapshot: &Snapshot, key: [u8; 32]) -> Result<Story, StoreError> {
        let audit = snapshot.audit_with_key(&key)?;
        let position = audit.iter().find_map(|e| {
            let r = &e.record;
            Some((
                r.agency.clone()?,
                r.source_id.clone()?,
                Position {
                    epoch: r.epoch?,
                    sequence: r.sequence?,
                },
            ))
        });
        let state = match &position {
            Some((a, s, p)) => snapshot.position_state(a, s, *p)?,
            None => None,
        };
        let mut effects = BTreeMap::new();
        let mut quarantine = BTreeMap::new();
        let window_offset = state.as_ref().and_then(|s| s.seen).map(|s| s.effect_offset);
        for offset in audit
            .iter()
            .filter_map(|e| e.record.effect_offset)
            .chain(window_offset)
        {
            if effects.contains_key(&offset) {
                continue;
            }
            if let Some(effect) = snapshot.effect(offset)? {
                effects.insert(offset, effect);
            }
        }
        for id in audit.iter().filter_map(|e| e.record.quarantine_id) {
            if quarantine.contains_key(&id) {
                continue;
            }
            if let Some(q) = snapshot.quarantined(id)? {
                quarantine.insert(id, q);
            }
        }
        Ok(Story {
            key,
            audit,
            effects,
            quarantine,
            position,
            state,
        })
    }

    /// "applied at T as effect #N" for the effect an entry names, with T its reception time.
    fn effect_ref(&self, offset: u64, reference_ms: u64, zone: &Zone) -> String {
        match self.effects.get(&offset) {
            Some(e) => format!(
                "the message applied at {} as effect #{offset}",
                time_near(e.record.received_at_ms, reference_ms, zone)
            ),
            None => format!("effect #{offset} (its record is gone)"),
        }
    }

    /// One audit entry in plain words, its times in `zone`.
    fn sentence(&self, e: &AuditEntry, zone: &Zone) -> String {
        let r = &e.record;
        let t = time_near(r.recorded_at_ms, r.recorded_at_ms, zone);
        let outcome = Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str);
        let quarantined = |what: &str| match r.quarantine_id {
            Some(q) => format!("quarantined as {what} at {t} (quarantine #{q})"),
            None => format!("quarantined as {what} at {t}"),
        };
        match (Outcome::from_code(r.outcome), r.effect_offset) {
            (Some(Outcome::Applied), Some(off)) => format!("applied at {t} as effect #{off}"),
            (Some(Outcome::AppliedLate), Some(off)) => format!(
                "applied late at {t} as effect #{off} (late: true; it was never applied before)"
            ),
            (Some(Outcome::Duplicate), Some(off)) => format!(
                "suppressed at {t}: same content as {}",
                self.effect_ref(off, r.recorded_at_ms, zone)
            ),
            (Some(Outcome::Conflict), Some(off)) => format!(
                "{}: same key as {}, but different content; not applied",
                quarantined("a conflict"),
                self.effect_ref(off, r.recorded_at_ms, zone)
            ),
            (Some(Outcome::Stale), _) => format!(
                "{}: not in the window and not provably new; not applied",
                quarantined("stale")
            ),
            (Some(Outcome::Released), Some(off)) => format!(
                "released from quarantine by an operator at {t}; applied as effect #{off} \
                 (released: true)"
            ),
            (Some(Outcome::Discarded), _) => {
                format!("discarded from quarantine by an operator at {t}; not applied")
            }
            _ => {
                let mut s = format!("{outcome} at {t}");
                if let Some(off) = r.effect_offset {
                    s.push_str(&format!(", effect #{off}"));
                }
                if let Some(q) = r.quarantine_id {
                    s.push_str(&format!(", quarantine #{q}"));
                }
                s
            }
        }
    }

    /// What the window and the source's marks say now, and what a resend would become.
    fn now(&self) -> Vec<String> {
        let Some((agency, source_id, pos)) = &self.position else {
            return vec!["The entries name no source or position.".into()];
        };
        let source = escape_controls(&format!("{agency}/{source_id}")).into_owned();
        let Some(state) = &self.state else {
            return vec![format!(
                "Source {source} has no marks (nothing of it was ever applied): a message at \
                 {pos} now would be applied."
            )];
        };
        let marks = &state.marks;
        let window = match (state.seen, marks.evicted_floor) {
            (Some(seen), _) => format!(
                "Position {pos} is still in the dedup window, holding effect #{}: a resend with the same \
                 content would be suppressed as a duplicate, one with other content \
                 quarantined as a conflict.",
                seen.effect_offset
            ),
            (None, _) if *pos > marks.high_water => format!(
                "Position {pos} is not in the dedup window and lies above the high-water mark: a \
                 message there now would be applied."
            ),
            (None, Some(floor)) if *pos <= floor => format!(
                "Position {pos} is no longer in the dedup window (at or below the evicted floor): a \
                 resend now would be quarantined as stale, never applied twice."
            ),
            (None, _) => format!(
                "Position {pos} is not in the dedup window, below the high-water mark and above the \
                 evicted floor (never applied): a message there now would be applied late \
                 (out_of_order = \"apply\") or quarantined as stale (\"quarantine\")."
            ),
        };
        let floor = marks.evicted_floor.map_or_else(
            || "none (nothing evicted yet)".to_string(),
            |f| f.to_string(),
        );
        vec![
            window,
            format!(
                "Source {source}: high-water mark {}, evicted floor {floor}.",
                marks.high_water
            ),
        ]
    }

    /// The story for people, its times in `zone`.
    fn text(&self, zone: &Zone) -> String {
        let mut s = String::new();
        let mut line = |l: String| {
            s.push_str(&l);
            s.push('\n');
        };
        match &self.position {
            Some((a, src, pos)) => line(format!(
                "Event {} {pos}",
                escape_controls(&format!("{a}/{src}"))
            )),
            None => line("Event without a position".into()),
        }
        line(format!("key {} (key v1)", hex(&self.key)));
        line(String::new());
        line(format!(
            "Audit log: {} {} with this key, oldest first",
            self.audit.len(),
            if self.audit.len() == 1 {
                "entry"
            } else {
                "entries"
            }
        ));
        for e in &self.audit {
            let r = &e.record;
            line(format!(
                "  #{} {} {} on topic {}",
                e.index,
                zone.show_ms(r.recorded_at_ms),
                Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str),
                escape_controls(&r.topic)
            ));
            line(format!("      {}", self.sentence(e, zone)));
            line(format!("      reason: {}", escape_controls(&r.reason)));
        }
        line(String::new());
        if self.effects.is_empty() {
            line("Effect records: none (never applied)".into());
        } else {
            line("Effect records:".into());
        }
        for (offset, e) in &self.effects {
            let r = &e.record;
            line(format!(
                "  #{offset} received {} on topic {}, {}, {}, audit entry #{}",
                zone.show_ms(r.received_at_ms),
                escape_controls(&r.topic),
                if r.late {
                    "late (late: true)"
                } else {
                    "in order (late: false)"
                },
                if r.released {
                    "released from quarantine"
                } else {
                    "not released"
                },
                r.audit_index
            ));
        }
        line(String::new());
        if self.quarantine.is_empty() {
            line("Quarantine records: none".into());
        } else {
            line("Quarantine records:".into());
        }
        for (id, q) in &self.quarantine {
            let r = &q.record;
            line(format!(
                "  #{id} {}, first received {}, last seen {}, {} {}, audit entry #{}",
                Outcome::from_code(r.outcome).map_or("unknown", Outcome::as_str),
                zone.show_ms(r.received_at_ms),
                zone.show_ms(r.last_seen_ms),
                r.deliveries,
                if r.deliveries == 1 {
                    "delivery"
                } else {
                    "deliveries"
                },
                r.audit_index
            ));
            line(format!("      reason: {}", escape_controls(&r.reason)));
        }
        line(String::new());
        line("Now:".into());
        for l in self.now() {
            line(format!("  {l}"));
        }
        s
    }

    fn json(&self) -> Json {
        let pos = |p: Position| {
            Json::Object(vec![
                ("epoch".into(), num(p.epoch)),
                ("sequence".into(), num(p.sequence)),
            ])
        };
        let (agency, source_id, epoch, sequence) = match &self.position {
            Some((a, s, p)) => (
                Json::String(a.clone()),
                Json::String(s.clone()),
                num(p.epoch),
                num(p.sequence),
            ),
            None => (Json::Null, Json::Null, Json::Null, Json::Null),
        };
        let audit = self
            .audit
            .iter()
            .map(|e| {
                let mut row = AuditRow(e).fields();
                // The JSON form is UTC throughout, its sentences too.
                row.push(("story".into(), Json::String(self.sentence(e, &Zone::utc()))));
                Json::Object(row)
            })
            .collect();
        let seen = self.state.as_ref().and_then(|s| s.seen);
        Json::Object(vec![
            ("key".into(), Json::String(hex(&self.key))),
            ("agency".into(), agency),
            ("source_id".into(), source_id),
            ("epoch".into(), epoch),
            ("sequence".into(), sequence),
            ("audit".into(), Json::Array(audit)),
            (
                "effects".into(),
                Json::Array(
                    self.effects
                        .values()
                        .map(|e| Json::Object(EffectRow::new(e).fields()))
                        .collect(),
                ),
            ),
            (
                "quarantine".into(),
                Json::Array(
                    self.quarantine
                        .values()
                        .map(|q| Json::Object(QuarantineRow::new(q).fields()))
                        .collect(),
                ),
            ),
            ("in_window".into(), Json::Bool(seen.is_some())),
            (
                "window_effect_offset".into(),
                seen.map_or(Json::Null, |s| num(s.effect_offset)),
            ),
            (
                "high_water".into(),
                self.state
                    .as_ref()
                    .map_or(Json::Null, |s| pos(s.marks.high_water)),
            ),
            (
                "evicted_floor".into(),
                self.state
                    .as_ref()
                    .and_then(|s| s.marks.evicted_floor)
                    .map_or(Json::Null, pos),
            ),
            (
                "now".into(),
                Json::Array(self.now().into_iter().map(Json::String).collect()),
            ),
        ])
    }
}

/// `02:14:07.120Z` (`03:14:07.120+01:00` in a zone) when `ms` falls on the same day as
/// `reference_ms` in `zone`, else the full time.
fn time_near(ms: u64, reference_ms: u64, zone: &Zone) -> String {
    let full = zone.show_ms(ms);
    let day = |t: &str| t.split_once('T').map(|(d, _)| d.to_string());
    match day(&full) {
        Some(d) if Some(&d) == day(&zone.show_ms(reference_ms)).as_ref() => {
            full[d.len() + 1..].to_string()
        }
        _ => full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_on_the_same_day_are_shortened() {
        let t = 1_796_007_134_123; // 2026-11-30T02:52:14.123Z
        let utc = Zone::utc();
        assert_eq!(time_near(t, t, &utc), "02:52:14.123Z");
        assert_eq!(
            time_near(t - 86_400_000, t, &utc),
            "2026-11-29T02:52:14.123Z"
        );
    }

    #[test]
    fn the_same_day_is_the_zones_day() {
        let t = 1_796_007_134_123; // 2026-11-30T02:52:14.123Z, 03:52 in Berlin
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        assert_eq!(time_near(t, t, &berlin), "03:52:14.123+01:00");
        // 2026-11-29T23:30Z is 00:30 on the 30th in Berlin: the same day there, not in UTC.
        let before_midnight = t - (3 * 60 + 22) * 60_000 - 14_123;
        assert_eq!(time_near(before_midnight, t, &berlin), "00:30:00.000+01:00");
        assert_eq!(
            time_near(before_midnight, t, &Zone::utc()),
            "2026-11-29T23:30:00.000Z"
        );
    }
}
