//! Selection of log entries for the read-side tools (`dump-*` filters): the typed flags
//! (`cli::values` parsed them) resolved against the clock and the `--tz` zone, and matching.
//! Sans-IO: "now" is a parameter, so relative times are testable.

use crate::cli::FilterArgs;
use crate::model::Outcome;
use crate::timefmt::{TimeError, TimeSpec, Zone};

/// A time flag that cannot be resolved (a zoneless time without `--tz`); one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{flag} {value}: {why}")]
pub struct FilterError {
    flag: &'static str,
    value: String,
    why: TimeError,
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
    /// The flags' filter: relative times count back from `now_ms`, zoneless ones are read in
    /// `zone` (the `--tz` given, if any) and refused without one.
    pub fn resolve(
        args: &FilterArgs,
        now_ms: u64,
        zone: Option<&Zone>,
    ) -> Result<Filter, FilterError> {
        let time = |flag, spec: &Option<TimeSpec>| {
            spec.as_ref()
                .map(|spec| {
                    spec.resolve(now_ms, zone).map_err(|why| FilterError {
                        flag,
                        value: spec.to_string(),
                        why,
                    })
                })
                .transpose()
        };
        Ok(Filter {
            since_ms: time("--since", &args.since)?,
            until_ms: time("--until", &args.until)?,
            source: args
                .source
                .as_ref()
                .map(|s| (s.agency.clone(), s.source_id.clone())),
            outcomes: args.outcome.iter().map(|o| o.as_str()).collect(),
            key: args.key,
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

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_796_007_134_123; // 2026-11-30T02:52:14.123Z

    /// The filter flags as clap parses them.
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        filter: FilterArgs,
    }

    fn flags(argv: &[&str]) -> Result<FilterArgs, String> {
        use clap::Parser as _;
        Flags::try_parse_from(std::iter::once("x").chain(argv.iter().copied()))
            .map(|f| f.filter)
            .map_err(|e| e.to_string())
    }

    fn at(s: &str, zone: Option<&Zone>) -> Result<u64, String> {
        let f = flags(&["--since", s])?;
        Filter::resolve(&f, NOW, zone)
            .map(|f| f.since_ms.unwrap_or(u64::MAX))
            .map_err(|e| e.to_string())
    }

    fn t(s: &str) -> Result<u64, String> {
        at(s, None)
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
        let at = |s: &str, z: &Zone| at(s, Some(z));
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
        let e = t("2026-11-30T03:52:14").unwrap_err();
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
            let text = t(bad).expect_err(bad);
            assert!(
                text.contains("--since") && text.trim_end().lines().count() <= 3,
                "{text}"
            );
        }
    }

    #[test]
    fn outcomes_are_validated_by_name() {
        let f = flags(&["--outcome", "applied_late", "--outcome", "relay"]).unwrap();
        assert_eq!(f.outcome, [Outcome::AppliedLate, Outcome::Relay]);
        let e = flags(&["--outcome", "aplied"]).unwrap_err();
        assert!(e.contains("applied, applied_late, duplicate"), "{e}");
        for bad in [
            &["--key", "ab"][..],
            &["--source", "CALFIRE"],
            &["--since", "yesterday"],
        ] {
            assert!(flags(bad).is_err(), "{bad:?}");
        }
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
        let f = |argv: &[&str]| Filter::resolve(&flags(argv).unwrap(), NOW, None).unwrap();
        assert!(f(&[]).matches(&entry) && f(&[]).matches(&malformed));

        let since = |s: &str| f(&["--since", s]);
        assert!(since("0s").matches(&entry));
        assert!(!since("2026-11-30T02:52:14.124Z").matches(&entry));
        let until = |s: &str| f(&["--until", s]);
        assert!(!until("0s").matches(&entry), "until is exclusive");
        assert!(until("2026-11-30T02:52:14.124Z").matches(&entry));

        let by_source = f(&["--source", "CALFIRE/E7"]);
        assert!(by_source.matches(&entry) && !by_source.matches(&malformed));
        assert!(by_source.wants_source());
        assert!(!f(&["--source", "CALFIRE/E"]).matches(&entry));

        let outcomes = |o: &[&str]| {
            let argv: Vec<&str> = o.iter().flat_map(|o| ["--outcome", o]).collect();
            f(&argv)
        };
        assert!(outcomes(&["applied", "duplicate"]).matches(&entry));
        assert!(!outcomes(&["applied"]).matches(&entry));
        assert!(outcomes(&["malformed", "stale"]).matches(&malformed));

        let key_hex = "07".repeat(32);
        let by_key = f(&["--key", &key_hex]);
        assert!(by_key.matches(&entry) && !by_key.matches(&malformed));
        assert!(!f(&["--topic", "incidents"]).matches(&entry));

        let all = f(&[
            "--since",
            "1m",
            "--until",
            "2099-01-01T00:00:00Z",
            "--source",
            "CALFIRE/E7",
            "--outcome",
            "conflict",
            "--outcome",
            "duplicate",
            "--key",
            &key_hex,
            "--topic",
            "incidents/e7",
        ]);
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
