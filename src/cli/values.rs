//! Typed flag values: each parser turns a flag's text into the value the commands use, once,
//! while clap parses the command line, so a wrong value is a usage error before anything is
//! opened. The error texts say why and what is expected; clap adds the flag and the value.

use clap::builder::{PossibleValuesParser, TypedValueParser};

use crate::model::{MAX_NAME_BYTES, Outcome, parse_hex32};
use crate::timefmt::{self, TimeSpec, Zone};

/// `--tz ZONE`: `local` (the host's zone, `TZ` first), `UTC`, or an IANA name.
pub fn zone(value: &str) -> Result<Zone, String> {
    Zone::parse(value).map_err(|e| e.why_expected())
}

/// `--since`/`--until T`: an RFC 3339 time, a date-time in the `--tz` zone, or a duration
/// before now; resolved against the clock and the zone by `TimeSpec::resolve`.
pub fn time(value: &str) -> Result<TimeSpec, String> {
    timefmt::parse_time_spec(value).map_err(|why| {
        format!(
            "{why} (expected RFC 3339 like 2026-11-30T02:00:00Z or 2026-11-30T04:00:00.250+02:00, \
             a date-time like 2026-11-30T08:00 with --tz, or a duration ago like 90s, 15m, \
             1h30m, 2 days, PT1H)"
        )
    })
}

/// `--outcome NAME`: one of `Outcome::ALL`'s names (clap lists them in the help and the error).
pub fn outcome() -> impl TypedValueParser<Value = Outcome> {
    PossibleValuesParser::new(Outcome::ALL.map(Outcome::as_str))
        .try_map(|name| Outcome::parse(&name).ok_or("unknown outcome"))
}

/// A producer named `AGENCY/SOURCE`, split at the first `/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceName {
    pub agency: String,
    pub source_id: String,
}

impl std::fmt::Display for SourceName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.agency, self.source_id)
    }
}

/// `AGENCY/SOURCE`, split at the first `/`: an agency containing `/` cannot be named this way,
/// a source id can.
pub fn source(value: &str) -> Result<SourceName, String> {
    match value.split_once('/') {
        Some((a, s))
            if !a.is_empty()
                && !s.is_empty()
                && a.len() <= MAX_NAME_BYTES
                && s.len() <= MAX_NAME_BYTES =>
        {
            Ok(SourceName {
                agency: a.to_string(),
                source_id: s.to_string(),
            })
        }
        _ => Err(format!(
            "expected AGENCY/SOURCE (split at the first '/'), both parts non-empty and at most \
             {MAX_NAME_BYTES} bytes"
        )),
    }
}

/// An idempotency key: 64 hex digits, either case.
pub fn key(value: &str) -> Result<[u8; 32], String> {
    parse_hex32(value).ok_or_else(|| "expected an idempotency key of 64 hex digits".to_string())
}

/// A decimal `u64`: digits only (no sign, no spaces).
pub fn number(value: &str) -> Result<u64, String> {
    digits(value).ok_or_else(|| "expected an unsigned integer".to_string())
}

fn digits(value: &str) -> Option<u64> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse().ok()
}

/// A `health` threshold: `off`, or a bound as typed and as a number in the reading's unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Threshold(pub Option<(String, u64)>);

impl Threshold {
    fn parse(value: &str, unit: fn(&str) -> Option<u64>, expected: &str) -> Result<Self, String> {
        if value == "off" {
            return Ok(Threshold(None));
        }
        unit(value)
            .map(|n| Threshold(Some((value.to_string(), n))))
            .ok_or_else(|| format!("expected {expected}, or off"))
    }
}

/// A duration threshold in seconds: the forms of a duration ago (`90s`, `5m`, `1h30m`,
/// `2 days`, `PT1H`; days are 24 h), whole seconds.
pub fn duration_threshold(value: &str) -> Result<Threshold, String> {
    Threshold::parse(
        value,
        |v| timefmt::parse_duration_ms(v).ok().map(|ms| ms / 1000),
        "a duration like 90s, 5m, 1h30m, 2 days or PT1H",
    )
}

/// A count threshold.
pub fn count_threshold(value: &str) -> Result<Threshold, String> {
    Threshold::parse(value, digits, "an unsigned integer")
}

/// A percentage threshold in hundredths of a percent: `80`, `80%`, `2.5`, at most 100 %.
pub fn percent_threshold(value: &str) -> Result<Threshold, String> {
    Threshold::parse(
        value,
        percent,
        "a percentage from 0 to 100 like 80, 80% or 2.5",
    )
}

fn percent(v: &str) -> Option<u64> {
    let v = v.strip_suffix('%').unwrap_or(v);
    let (whole, frac) = v.split_once('.').unwrap_or((v, ""));
    if frac.len() > 2 || (!frac.is_empty() && digits(frac).is_none()) {
        return None;
    }
    let frac = format!("{frac:0<2}").parse::<u64>().ok()?;
    let n = digits(whole)?.checked_mul(100)?.checked_add(frac)?;
    (n <= 10_000).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_keep_their_text_and_their_number() {
        let t = |r: Result<Threshold, String>| r.map(|t| t.0);
        assert_eq!(t(duration_threshold("5m")), Ok(Some(("5m".into(), 300))));
        assert_eq!(
            t(duration_threshold("1h30m")),
            Ok(Some(("1h30m".into(), 5400)))
        );
        assert_eq!(
            t(duration_threshold("2d")),
            Ok(Some(("2d".into(), 172_800)))
        );
        assert_eq!(
            t(duration_threshold("PT1H")),
            Ok(Some(("PT1H".into(), 3600)))
        );
        assert_eq!(t(duration_threshold("off")), Ok(None));
        assert!(duration_threshold("5").is_err());
        assert!(duration_threshold("-5m").is_err());
        assert_eq!(t(count_threshold("50")), Ok(Some(("50".into(), 50))));
        assert!(count_threshold("+5").is_err());
        assert!(count_threshold("5.0").is_err());
        assert_eq!(t(percent_threshold("80%")), Ok(Some(("80%".into(), 8000))));
        assert_eq!(t(percent_threshold("2.5")), Ok(Some(("2.5".into(), 250))));
        assert_eq!(
            t(percent_threshold("100")),
            Ok(Some(("100".into(), 10_000)))
        );
        assert!(percent_threshold("100.01").is_err());
        assert!(percent_threshold("150").is_err());
        assert!(percent_threshold("2.555").is_err());
        for bad in ["", "%", "101", "1.234", "-1", "x"] {
            assert!(percent_threshold(bad).is_err(), "{bad:?}");
        }
        for bad in ["", "5", "m", "-5m", "1 month"] {
            assert!(duration_threshold(bad).is_err(), "{bad:?}");
        }
        assert!(count_threshold("-1").is_err());
    }

    #[test]
    fn sources_split_at_the_first_slash() {
        assert_eq!(
            source("Cal/Fire/E7"),
            Ok(SourceName {
                agency: "Cal".into(),
                source_id: "Fire/E7".into()
            })
        );
        for bad in ["Cal", "/E7", "Cal/", ""] {
            assert!(source(bad).is_err(), "{bad}");
        }
        let long = format!("{}/x", "a".repeat(MAX_NAME_BYTES + 1));
        assert!(source(&long).is_err());
    }

    #[test]
    fn keys_and_numbers() {
        assert_eq!(key(&"Ab".repeat(32)), Ok([0xab; 32]));
        assert!(key(&"ab".repeat(31)).is_err());
        assert!(key(&"zz".repeat(32)).is_err());
        assert_eq!(number("42"), Ok(42));
        for bad in ["", "-1", "+1", " 1", "1e3", "18446744073709551616"] {
            assert!(number(bad).is_err(), "{bad}");
        }
    }
}
