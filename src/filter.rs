//! Selection of log entries for the read-side tools (`dump-*` filters, `explain`, `gaps`):
//! parsing of operator-typed times, sources, keys and outcome names, and matching. Sans-IO:
//! "now" is a parameter, so relative times are testable.

use crate::cli::FilterArgs;
use crate::model::{MAX_NAME_BYTES, Outcome, parse_hex32};
use crate::timefmt::{Zone, parse_instant};

/// A malformed filter argument; the message is one line naming the flag and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilterError {
    #[error(
        "{flag} {value:?}: {why} (expected RFC 3339 like 2026-11-30T02:00:00Z or \
         2026-11-30T04:00:00.250+02:00, a date-time like 2026-11-30T08:00 with --tz, or a \
         duration ago like 90s, 15m, 1h30m, 2 days, PT1H)"
    )]
    Time {
        flag: &'static str,
        value: String,
        why: String,
    },
    #[error(
        "{flag} {value:?}: expected AGENCY/SOURCE (split at the first '/'), both parts \
         non-empty and at most {MAX_NAME_BYTES} bytes"
    )]
    Source { flag: &'static str, value: String },
    #[error("{flag} {value:?}: expected an idempotency key of 64 hex digits")]
    Key { flag: &'static str, value: String },
    #[error("--outcome {value:?}: unknown outcome (valid: {valid})")]
    Outcome { value: String, valid: String },
    #[error("{flag} {value:?}: expected an unsigned integer")]
    Number { flag: &'static str, value: String },
}

/// Which entries to print: every present condition must hold; `outcomes` match if any does.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Filter {
    /// Inclusive lower bound, Unix milliseconds.
    pub since_ms: Option<u64>,
    /// Exclusive upper bound, Unix milliseconds.
    pub until_ms: Option<u64>,
    pub source: Option<(String, String)>,
    /// Outcome names as `Outcome::as_str` spells them; empty means any.
    pub outcomes: Vec<&'static str>,
    pub key: Option<[u8; 32]>,
    pub topic: Option<String>,
}

/// What a filter looks at in one entry of any of the logs.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    /// Audit: `recorded_at`; effects and quarantine: `received_at`.
    pub time_ms: u64,
    pub outcome: &'a str,
    /// `None` for entries without a source (malformed messages).
    pub source: Option<(&'a str, &'a str)>,
    pub key: Option<&'a [u8; 32]>,
    pub topic: &'a str,
}

impl Filter {
    /// Validates the raw flags; relative times count back from `now_ms`, zoneless ones are
    /// read in `zone` (the `--tz` given, if any).
    pub fn parse(
        args: &FilterArgs,
        now_ms: u64,
        zone: Option<&Zone>,
    ) -> Result<Filter, FilterError> {
        let time = |flag, v: &Option<String>| {
            v.as_deref()
                .map(|v| parse_time(flag, v, now_ms, zone))
                .transpose()
        };
        Ok(Filter {
            since_ms: time("--since", &args.since)?,
            until_ms: time("--until", &args.until)?,
            source: args
                .source
                .as_deref()
                .map(|v| parse_source("--source", v))
                .transpose()?,
            outcomes: args
                .outcome
                .iter()
                .map(|v| parse_outcome(v))
                .collect::<Result<_, _>>()?,
            key: args
                .key
                .as_deref()
                .map(|v| parse_key("--key", v))
                .transpose()?,
            topic: args.topic.clone(),
        })
    }

    /// Whether a matching entry also needs its source, which quarantine records do not carry.
    pub fn wants_source(&self) -> bool {
        self.source.is_some()
    }

    pub fn matches(&self, c: &Candidate<'_>) -> bool {
        self.since_ms.is_none_or(|t| c.time_ms >= t)
            && self.until_ms.is_none_or(|t| c.time_ms < t)
            && (self.outcomes.is_empty() || self.outcomes.contains(&c.outcome))
            && self.topic.as_deref().is_none_or(|t| t == c.topic)
            && self.key.as_ref().is_none_or(|k| c.key == Some(k))
            && self
                .source
                .as_ref()
                .is_none_or(|(a, s)| c.source == Some((a.as_str(), s.as_str())))
    }
}

/// The outcome name an effect record matches: `applied`, `applied_late`, or `released` for
/// an effect an operator released from quarantine. Matched as a string so it does not depend
/// on which `Outcome` variants this build has.
pub fn effect_outcome(late: bool, released: bool) -> &'static str {
    if released {
        "released"
    } else if late {
        Outcome::AppliedLate.as_str()
    } else {
        Outcome::Applied.as_str()
    }
}

/// An outcome name known to `Outcome::parse`.
pub fn parse_outcome(value: &str) -> Result<&'static str, FilterError> {
    Outcome::parse(value)
        .map(Outcome::as_str)
        .ok_or_else(|| FilterError::Outcome {
            value: value.to_string(),
            valid: Outcome::ALL.map(Outcome::as_str).join(", "),
        })
}

/// `AGENCY/SOURCE`, split at the first `/`: an agency containing `/` cannot be named this way,
/// a source id can.
pub fn parse_source(flag: &'static str, value: &str) -> Result<(String, String), FilterError> {
    match value.split_once('/') {
        Some((a, s))
            if !a.is_empty()
                && !s.is_empty()
                && a.len() <= MAX_NAME_BYTES
                && s.len() <= MAX_NAME_BYTES =>
        {
            Ok((a.to_string(), s.to_string()))
        }
        _ => Err(FilterError::Source {
            flag,
            value: value.to_string(),
        }),
    }
}

/// 64 hex digits, either case.
pub fn parse_key(flag: &'static str, value: &str) -> Result<[u8; 32], FilterError> {
    parse_hex32(value).ok_or_else(|| FilterError::Key {
        flag,
        value: value.to_string(),
    })
}

/// A decimal `u64` (no sign, no spaces).
pub fn parse_u64(flag: &'static str, value: &str) -> Result<u64, FilterError> {
    let err = || FilterError::Number {
        flag,
        value: value.to_string(),
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    value.parse().map_err(|_| err())
}

/// An operator-typed time as Unix milliseconds (forms: `timefmt::parse_instant`); relative
/// times count back from `now_ms`, zoneless ones are read in `zone` and refused without one.
pub fn parse_time(
    flag: &'static str,
    value: &str,
    now_ms: u64,
    zone: Option<&Zone>,
) -> Result<u64, FilterError> {
    parse_instant(value, now_ms, zone).map_err(|why| FilterError::Time {
        flag,
        value: value.to_string(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_796_007_134_123; // 2026-11-30T02:52:14.123Z

    fn t(s: &str) -> Result<u64, FilterError> {
        parse_time("--since", s, NOW, None)
    }

    #[test]
    fn rfc3339_times_parse_to_unix_milliseconds() {
        assert_eq!(t("2026-11-30T02:52:14.123Z"), Ok(NOW));
        assert_eq!(t("2026-11-30t02:52:14.123z"), Ok(NOW));
        assert_eq!(t("2026-11-30 02:52:14.123Z"), Ok(NOW));
        assert_eq!(t("2026-11-30T04:52:14.123+02:00"), Ok(NOW));
        assert_eq!(t("2026-11-29T21:22:14.123-05:30"), Ok(NOW));
        assert_eq!(t("2026-11-30T02:52:14Z"), Ok(NOW - 123));
        assert_eq!(t("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(t("2000-02-29T00:00:00Z"), Ok(951_782_400_000));
        // Sub-millisecond fractions round up: `>= since` on stored milliseconds stays exact.
        assert_eq!(t("2026-11-30T02:52:14.1221Z"), Ok(NOW));
        assert_eq!(t("2026-11-30T02:52:14.123000Z"), Ok(NOW));
        assert_eq!(t("2026-11-30T02:52:14.5Z"), Ok(NOW - 123 + 500));
    }

    #[test]
    fn relative_times_count_back_from_now() {
        assert_eq!(t("90s"), Ok(NOW - 90_000));
        assert_eq!(t("15m"), Ok(NOW - 900_000));
        assert_eq!(t("2h"), Ok(NOW - 7_200_000));
        assert_eq!(t("3d"), Ok(NOW - 259_200_000));
        assert_eq!(t("0s"), Ok(NOW));
        assert_eq!(t("999999d"), Ok(0));
        assert!(t("99999999999999999999d").is_err());
    }

    #[test]
    fn friendly_and_iso_durations_count_back_from_now() {
        assert_eq!(t("1h30m"), Ok(NOW - 5_400_000));
        assert_eq!(t("1h 30m"), Ok(NOW - 5_400_000));
        assert_eq!(t("2 days"), Ok(NOW - 172_800_000));
        assert_eq!(t("2 days 3 hours"), Ok(NOW - 183_600_000));
        assert_eq!(t("5 m"), Ok(NOW - 300_000));
        assert_eq!(t("1.5h"), Ok(NOW - 5_400_000));
        assert_eq!(t("PT1H"), Ok(NOW - 3_600_000));
        assert_eq!(t("P1DT2H"), Ok(NOW - 93_600_000));
        assert_eq!(t("250ms"), Ok(NOW - 250));
    }

    #[test]
    fn zoneless_times_are_read_in_the_named_zone_only() {
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        let at = |s: &str, z: &Zone| parse_time("--until", s, NOW, Some(z));
        // 03:52:14.123 in Berlin (CET, +01:00) is NOW.
        assert_eq!(at("2026-11-30T03:52:14.123", &berlin), Ok(NOW));
        assert_eq!(at("2026-11-30 03:52:14.123", &berlin), Ok(NOW));
        assert_eq!(
            at("2026-11-30T03:52:14.123", &Zone::utc()),
            Ok(NOW + 3_600_000)
        );
        // Summer time: +02:00.
        assert_eq!(at("2026-07-01T02:00", &berlin), t("2026-07-01T00:00:00Z"));
        // A date alone is its midnight.
        assert_eq!(at("2026-11-30", &berlin), t("2026-11-29T23:00:00Z"));
        // An offset or Z wins over the zone; durations ignore it.
        assert_eq!(at("2026-11-30T02:52:14.123Z", &berlin), Ok(NOW));
        assert_eq!(at("2h", &berlin), Ok(NOW - 7_200_000));
        let e = t("2026-11-30T03:52:14").unwrap_err().to_string();
        assert!(e.contains("missing time zone") && e.contains("--tz"), "{e}");
        assert!(at("2026-11-31T00:00", &berlin).is_err());
    }

    #[test]
    fn malformed_times_are_one_line_errors() {
        for bad in [
            "",
            "s",
            "15",
            "-5m",
            "5w",
            "1 month",
            "P1Y",
            "2h ago",
            "PT",
            "yesterday",
            "5é",
            "é",
            "2026-11-30",
            "2026-11-30T02:52:14",
            "2026-13-01T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "2026-11-31T00:00:00Z",
            "2026-11-30T24:00:00Z",
            "2026-11-30T02:60:00Z",
            "2026-11-30T02:52:14.Z",
            "2026-11-30T02:52:14+2:00",
            "2026-11-30T02:52:14Zjunk",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:00:00+00:01",
            "２026-11-30T02:52:14Z",
        ] {
            let e = t(bad).expect_err(bad);
            let text = e.to_string();
            assert!(
                text.starts_with("--since ") && !text.contains('\n'),
                "{text}"
            );
        }
    }

    #[test]
    fn sources_split_at_the_first_slash() {
        assert_eq!(
            parse_source("--source", "CALFIRE/E7-AVL"),
            Ok(("CALFIRE".into(), "E7-AVL".into()))
        );
        assert_eq!(
            parse_source("--source", "Cal Fire/ÉMS/air/1"),
            Ok(("Cal Fire".into(), "ÉMS/air/1".into()))
        );
        for bad in ["CALFIRE", "/E7", "CALFIRE/", ""] {
            assert!(parse_source("--source", bad).is_err(), "{bad}");
        }
        let long = format!("{}/x", "a".repeat(MAX_NAME_BYTES + 1));
        assert!(parse_source("--source", &long).is_err());
    }

    #[test]
    fn outcomes_are_validated_by_name() {
        assert_eq!(parse_outcome("applied_late"), Ok("applied_late"));
        let e = parse_outcome("aplied").unwrap_err().to_string();
        assert!(e.contains("applied, applied_late, duplicate"), "{e}");
    }

    #[test]
    fn keys_and_numbers_are_validated() {
        assert_eq!(parse_key("--key", &"Ab".repeat(32)), Ok([0xab; 32]));
        assert!(parse_key("--key", &"ab".repeat(31)).is_err());
        assert!(parse_key("--key", &"zz".repeat(32)).is_err());
        assert_eq!(parse_u64("--sequence", "42"), Ok(42));
        for bad in ["", "-1", "+1", "1.0", " 1", "18446744073709551616"] {
            assert!(parse_u64("--sequence", bad).is_err(), "{bad}");
        }
    }

    fn args() -> FilterArgs {
        FilterArgs::default()
    }

    #[test]
    fn filters_combine_with_and_and_outcomes_with_or() {
        let key = [7u8; 32];
        let entry = Candidate {
            time_ms: NOW,
            outcome: "duplicate",
            source: Some(("CALFIRE", "E7")),
            key: Some(&key),
            topic: "incidents/e7",
        };
        let malformed = Candidate {
            time_ms: NOW,
            outcome: "malformed",
            source: None,
            key: None,
            topic: "incidents/e7",
        };
        let f = |a: FilterArgs| Filter::parse(&a, NOW, None).unwrap();
        assert!(f(args()).matches(&entry) && f(args()).matches(&malformed));

        let since = |s: &str| FilterArgs {
            since: Some(s.into()),
            ..args()
        };
        assert!(f(since("0s")).matches(&entry));
        assert!(!f(since("2026-11-30T02:52:14.124Z")).matches(&entry));
        let until = |s: &str| FilterArgs {
            until: Some(s.into()),
            ..args()
        };
        assert!(!f(until("0s")).matches(&entry), "until is exclusive");
        assert!(f(until("2026-11-30T02:52:14.124Z")).matches(&entry));

        let by_source = f(FilterArgs {
            source: Some("CALFIRE/E7".into()),
            ..args()
        });
        assert!(by_source.matches(&entry) && !by_source.matches(&malformed));
        assert!(by_source.wants_source());
        assert!(
            !f(FilterArgs {
                source: Some("CALFIRE/E".into()),
                ..args()
            })
            .matches(&entry)
        );

        let outcomes = |o: &[&str]| FilterArgs {
            outcome: o.iter().map(|s| s.to_string()).collect(),
            ..args()
        };
        assert!(f(outcomes(&["applied", "duplicate"])).matches(&entry));
        assert!(!f(outcomes(&["applied"])).matches(&entry));
        assert!(f(outcomes(&["malformed", "stale"])).matches(&malformed));

        let by_key = f(FilterArgs {
            key: Some("07".repeat(32)),
            ..args()
        });
        assert!(by_key.matches(&entry) && !by_key.matches(&malformed));
        assert!(
            !f(FilterArgs {
                topic: Some("incidents".into()),
                ..args()
            })
            .matches(&entry)
        );

        let all = f(FilterArgs {
            since: Some("1m".into()),
            until: Some("2099-01-01T00:00:00Z".into()),
            source: Some("CALFIRE/E7".into()),
            outcome: vec!["conflict".into(), "duplicate".into()],
            key: Some("07".repeat(32)),
            topic: Some("incidents/e7".into()),
        });
        assert!(all.matches(&entry));
        assert!(!all.matches(&Candidate {
            topic: "other",
            ..entry
        }));
        assert!(!all.matches(&Candidate {
            outcome: "applied",
            ..entry
        }));
    }

    #[test]
    fn effects_match_by_derived_outcome_name() {
        assert_eq!(effect_outcome(false, false), "applied");
        assert_eq!(effect_outcome(true, false), "applied_late");
        assert_eq!(effect_outcome(true, true), "released");
        let f = Filter {
            outcomes: vec!["released"],
            ..Filter::default()
        };
        let released = Candidate {
            time_ms: 0,
            outcome: effect_outcome(false, true),
            source: None,
            key: None,
            topic: "",
        };
        assert!(f.matches(&released));
    }
}
