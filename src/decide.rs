//! The decision table: a pure function of the message, what the store already knows about its
//! key and source, and the out-of-order policy. No I/O, no clock; the store calls it inside the
//! write transaction, and `Decision` says what to write.

use crate::model::{Digest, Message, Outcome, Position};

/// What to do with a message that is new but sits below its source's high-water mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OutOfOrder {
    /// Apply it with `late: true` (default): it provably was never applied.
    #[default]
    Apply,
    /// Quarantine it as `stale` for an operator to release.
    Quarantine,
}

/// The window's record of a key: the digest first applied under it and that effect's offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub digest: Digest,
    pub effect_offset: u64,
}

/// What the store knows about a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceMarks {
    /// Highest position applied as `applied` (not late).
    pub high_water: Position,
    /// Highest position ever evicted from the window; `None` until the first eviction.
    pub evicted_floor: Option<Position>,
}

/// The decided outcome and the audit reason, in plain words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub outcome: Outcome,
    pub reason: String,
}

/// Decides one well-formed message (malformed payloads never reach here: `wire` rejects them).
pub fn decide(
    msg: &Message,
    seen: Option<&Seen>,
    marks: Option<&SourceMarks>,
    policy: OutOfOrder,
) -> Decision {
    let pos = msg.position;
    if let Some(seen) = seen {
        return if seen.digest == msg.digest {
            Decision {
                outcome: Outcome::Duplicate,
                reason: format!("same key and content as effect #{}", seen.effect_offset),
            }
        } else {
            Decision {
                outcome: Outcome::Conflict,
                reason: format!(
                    "same key as effect #{} but different content (applied digest {})",
                    seen.effect_offset, seen.digest
                ),
            }
        };
    }
    let Some(marks) = marks else {
        return Decision {
            outcome: Outcome::Applied,
            reason: "first message from this source".into(),
        };
    };
    if pos > marks.high_water {
        return Decision {
            outcome: Outcome::Applied,
            reason: format!("new position above high-water mark ({})", marks.high_water),
        };
    }
    match marks.evicted_floor {
        Some(floor) if pos <= floor => Decision {
            outcome: Outcome::Stale,
            reason: format!(
                "key not in window and position is at or below the evicted floor ({floor}): \
                 cannot prove it was never applied"
            ),
        },
        _ => match policy {
            OutOfOrder::Apply => Decision {
                outcome: Outcome::AppliedLate,
                reason: format!(
                    "below high-water mark ({}) but key never seen: late, provably not yet applied",
                    marks.high_water
                ),
            },
            OutOfOrder::Quarantine => Decision {
                outcome: Outcome::Stale,
                reason: format!(
                    "below high-water mark ({}) and key never seen: late, quarantined by policy \
                     out_of_order = \"quarantine\"",
                    marks.high_water
                ),
            },
        },
    }
}

/// Sequences of one source and epoch that never arrived before a later one was applied: the
/// broker (or the path to it) dropped them, or they are still on their way (a late arrival is
/// then `applied_late`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    pub epoch: u64,
    /// The first and last missing sequence (inclusive).
    pub from: u64,
    pub to: u64,
}

/// A jump past this many sequences is not a plausible loss: a producer that restarted its
/// counter without a new epoch, or a forged sequence. Its missing sequences are counted all
/// the same (saturating), and the warning and the report say it is implausible.
pub const PLAUSIBLE_GAP: u64 = 1 << 32;

impl Gap {
    /// How many sequences are missing.
    pub fn missing(&self) -> u64 {
        self.to - self.from + 1
    }

    /// Whether the jump is larger than any real loss could be (`PLAUSIBLE_GAP`).
    pub fn implausible(&self) -> bool {
        self.missing() > PLAUSIBLE_GAP
    }
}

/// The sum of counts of missing sequences, saturating at `u64::MAX`: one hostile jump (a
/// sequence near 2^64) must never wrap the total around and cancel a real loss.
pub fn total_missing(counts: impl IntoIterator<Item = u64>) -> u64 {
    counts.into_iter().fold(0, u64::saturating_add)
}

/// The upstream gap that applying `pos` (decided `applied`, not late) opens: the sequences
/// between the source's high-water mark and `pos`, when both are in the same epoch. A new
/// source or a new epoch opens none: the feed contract asks sequences to be monotonic per
/// (source, epoch), not to start at any number (a new epoch may restart its counter anywhere).
pub fn upstream_gap(marks: Option<&SourceMarks>, pos: Position) -> Option<Gap> {
    let hwm = marks?.high_water;
    (pos.epoch == hwm.epoch && pos.sequence > hwm.sequence.saturating_add(1)).then(|| Gap {
        epoch: pos.epoch,
        from: hwm.sequence + 1,
        to: pos.sequence - 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Digest, Source};

    fn msg(seq: u64, digest_byte: u8) -> Message {
        let source = Source::new("A".into(), "S".into());
        let position = Position {
            epoch: 0,
            sequence: seq,
        };
        Message::new(source, position, Digest::from_bytes([digest_byte; 32]))
    }
    fn pos(sequence: u64) -> Position {
        Position { epoch: 0, sequence }
    }
    fn marks(hwm: u64, floor: Option<u64>) -> SourceMarks {
        SourceMarks {
            high_water: pos(hwm),
            evicted_floor: floor.map(pos),
        }
    }
    fn seen(digest_byte: u8) -> Seen {
        Seen {
            digest: Digest::from_bytes([digest_byte; 32]),
            effect_offset: 9,
        }
    }
    fn outcome(m: &Message, s: Option<&Seen>, k: Option<&SourceMarks>, p: OutOfOrder) -> Outcome {
        decide(m, s, k, p).outcome
    }

    #[test]
    fn key_in_window_with_same_digest_is_duplicate() {
        let d = decide(
            &msg(5, 1),
            Some(&seen(1)),
            Some(&marks(5, None)),
            OutOfOrder::Apply,
        );
        assert_eq!(d.outcome, Outcome::Duplicate);
        assert!(d.reason.contains("effect #9"));
    }

    #[test]
    fn key_in_window_with_other_digest_is_conflict() {
        let o = outcome(
            &msg(5, 2),
            Some(&seen(1)),
            Some(&marks(5, None)),
            OutOfOrder::Apply,
        );
        assert_eq!(o, Outcome::Conflict);
    }

    #[test]
    fn a_jump_past_the_high_water_mark_within_an_epoch_is_a_gap() {
        let k = marks(1000, None);
        let gap = upstream_gap(Some(&k), pos(3001)).unwrap();
        assert_eq!(
            (gap.epoch, gap.from, gap.to, gap.missing()),
            (0, 1001, 3000, 2000)
        );
        assert_eq!(upstream_gap(Some(&k), pos(1002)).unwrap().missing(), 1);
    }

    #[test]
    fn the_next_sequence_a_new_source_or_a_new_epoch_is_no_gap() {
        let k = marks(1000, None);
        assert_eq!(upstream_gap(Some(&k), pos(1001)), None);
        assert_eq!(
            upstream_gap(None, pos(900)),
            None,
            "a source may start anywhere"
        );
        let next_epoch = Position {
            epoch: 1,
            sequence: 5000,
        };
        assert_eq!(upstream_gap(Some(&k), next_epoch), None);
        let top = marks(u64::MAX, None);
        assert_eq!(upstream_gap(Some(&top), pos(u64::MAX)), None);
    }

    #[test]
    fn new_source_is_applied() {
        assert_eq!(
            outcome(&msg(5, 1), None, None, OutOfOrder::Apply),
            Outcome::Applied
        );
    }

    #[test]
    fn position_above_high_water_is_applied() {
        let o = outcome(
            &msg(6, 1),
            None,
            Some(&marks(5, Some(4))),
            OutOfOrder::Quarantine,
        );
        assert_eq!(o, Outcome::Applied);
    }

    #[test]
    fn unseen_position_between_floor_and_high_water_is_applied_late_by_default() {
        let o = outcome(
            &msg(4, 1),
            None,
            Some(&marks(5, Some(3))),
            OutOfOrder::Apply,
        );
        assert_eq!(o, Outcome::AppliedLate);
        let o = outcome(&msg(4, 1), None, Some(&marks(5, None)), OutOfOrder::Apply);
        assert_eq!(o, Outcome::AppliedLate);
    }

    #[test]
    fn unseen_position_between_floor_and_high_water_is_stale_under_quarantine_policy() {
        let o = outcome(
            &msg(4, 1),
            None,
            Some(&marks(5, Some(3))),
            OutOfOrder::Quarantine,
        );
        assert_eq!(o, Outcome::Stale);
    }

    #[test]
    fn position_at_or_below_evicted_floor_is_stale() {
        for seq in [2, 3] {
            let o = outcome(
                &msg(seq, 1),
                None,
                Some(&marks(5, Some(3))),
                OutOfOrder::Apply,
            );
            assert_eq!(o, Outcome::Stale);
        }
    }

    #[test]
    fn a_newer_epoch_is_above_any_sequence_of_an_older_one() {
        let mut m = msg(0, 1);
        m.position = Position {
            epoch: 1,
            sequence: 0,
        };
        let o = outcome(
            &m,
            None,
            Some(&marks(1_000_000, Some(999_999))),
            OutOfOrder::Apply,
        );
        assert_eq!(o, Outcome::Applied);
    }
}
