//! RFC 3339 timestamps from Unix milliseconds, the wall clock read in one place, and the
//! operator-facing side of time: typed times and durations, and `--tz` zones for tables.
//! The only module naming jiff; the hashed `recorded_at` text comes from `rfc3339_ms`, not jiff.

use std::time::{SystemTime, UNIX_EPOCH};

use jiff::civil::DateTime;
use jiff::fmt::temporal::Pieces;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Span, SpanRelativeTo, Timestamp};

/// Milliseconds since the Unix epoch, now. The only place the engine's callers read the clock.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `2026-11-30T02:52:14.123Z` (UTC, millisecond precision, always the same width).
pub fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let millis = ms % 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// (year, month, day) to days since 1970-01-01, proleptic Gregorian; the inverse of
/// `civil_from_days` (H. Hinnant's `days_from_civil`). `None` before 1970 or for a month
/// outside 1..=12 (the day is not range-checked: callers validate it with `days_in_month`).
pub fn days_from_civil(year: u64, month: u64, day: u64) -> Option<u64> {
    if year < 1970 || !(1..=12).contains(&month) {
        return None;
    }
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).checked_sub(719_468)
}

/// Days in `month` (1..=12) of `year`, Gregorian leap years.
pub fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A zone `--tz` named: `local` (the host's, `TZ` first), `UTC`, or an IANA name looked up in
/// the host's tz database (/usr/share/zoneinfo).
#[derive(Debug, Clone)]
pub struct Zone {
    tz: TimeZone,
    utc: bool,
}

/// An unknown `--tz` value; one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--tz {name:?}: {why} (expected local, UTC or an IANA zone name like Europe/Berlin from \
     /usr/share/zoneinfo)"
)]
pub struct ZoneError {
    name: String,
    why: String,
}

impl ZoneError {
    /// The message without the flag and the value (clap names them).
    pub fn why_expected(&self) -> String {
        format!(
            "{} (expected local, UTC or an IANA zone name like Europe/Berlin from \
             /usr/share/zoneinfo)",
            self.why
        )
    }
}

impl Zone {
    pub fn utc() -> Zone {
        Zone {
            tz: TimeZone::UTC,
            utc: true,
        }
    }

    pub fn parse(name: &str) -> Result<Zone, ZoneError> {
        let err = |e: jiff::Error| ZoneError {
            name: name.to_string(),
            why: one_line(&e),
        };
        if name.eq_ignore_ascii_case("utc") {
            return Ok(Zone::utc());
        }
        let tz = if name == "local" {
            TimeZone::try_system().map_err(err)?
        } else {
            TimeZone::get(name).map_err(err)?
        };
        Ok(Zone { tz, utc: false })
    }

    /// Whether times show as `rfc3339_ms` does, with a `Z`.
    pub fn is_utc(&self) -> bool {
        self.utc
    }

    /// Unix milliseconds shown in this zone: `rfc3339_ms` in UTC, else as `show` does.
    pub fn show_ms(&self, ms: u64) -> String {
        self.show(&rfc3339_ms(ms))
    }

    /// The zone's offset from UTC at `ms`, in milliseconds (east positive): where a report's
    /// round local times (a tick at midnight) fall.
    pub fn offset_ms_at(&self, ms: u64) -> i64 {
        if self.utc {
            return 0;
        }
        match Timestamp::from_millisecond(i64::try_from(ms).unwrap_or(i64::MAX)) {
            Ok(ts) => i64::from(self.tz.to_offset(ts).seconds()) * 1000,
            Err(_) => 0,
        }
    }

    /// A canonical UTC time (`rfc3339_ms`'s form) shown in this zone, same precision, with its
    /// offset: `2026-11-30T03:52:14.123+01:00`. Text that is not such a time is returned as is.
    pub fn show(&self, utc_text: &str) -> String {
        if self.utc {
            return utc_text.to_string();
        }
        match utc_text.parse::<Timestamp>() {
            Ok(ts) => ts
                .to_zoned(self.tz.clone())
                .strftime("%Y-%m-%dT%H:%M:%S%.3f%:z")
                .to_string(),
            Err(_) => utc_text.to_string(),
        }
    }
}

fn one_line(e: &jiff::Error) -> String {
    e.to_string().replace(['\n', '\r'], " ")
}

/// Why an operator-typed time or duration cannot be used; one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// A civil time, and no `--tz` to read it in.
    #[error("missing time zone: add Z or an offset like +02:00, or name the zone with --tz")]
    MissingZone,
    /// jiff's words (on one line) for a time it cannot read or place.
    #[error("{0}")]
    Unreadable(String),
    #[error("neither a time nor a duration")]
    NeitherTimeNorDuration,
    #[error("a duration before now cannot be negative")]
    NegativeDuration,
    /// Years, months and weeks have no fixed length.
    #[error("give the duration in days, hours, minutes or seconds")]
    CalendarUnits,
    #[error("duration too large")]
    DurationTooLarge,
    /// Hours above 23 (jiff reads up to 25:59:59), which could only be a typing error.
    #[error("UTC offset {0} is out of range: RFC 3339 allows -23:59 to +23:59")]
    OffsetOutOfRange(jiff::tz::Offset),
    #[error("before 1970")]
    Before1970,
}

impl From<&jiff::Error> for TimeError {
    fn from(e: &jiff::Error) -> TimeError {
        TimeError::Unreadable(one_line(e))
    }
}

/// An operator-typed instant, as typed, before the clock and the zone are known: RFC 3339 with
/// `Z` or an offset (any fraction, rounded *up* to the millisecond so `>= since` and `< until`
/// on stored millisecond times mean what they do on the exact instant); a civil date or
/// date-time (`2026-11-30`, `2026-11-30T08:00`), read in the zone `--tz` names; or a duration
/// before now in jiff's friendly (`90s`, `1h30m`, `2 days`) or ISO 8601 (`PT1H`) form, in days
/// (24 h) and smaller units.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeSpec {
    /// Unix milliseconds.
    At(u64),
    /// A civil date-time, for a zone.
    Civil(DateTime),
    /// Milliseconds before now.
    Ago(u64),
}

impl TimeSpec {
    /// Unix milliseconds: a duration counts back from `now_ms`; a civil time is read in `zone`
    /// and refused without one. The error is one line saying why.
    pub fn resolve(&self, now_ms: u64, zone: Option<&Zone>) -> Result<u64, TimeError> {
        match self {
            TimeSpec::At(ms) => Ok(*ms),
            TimeSpec::Ago(back) => Ok(now_ms.saturating_sub(*back)),
            TimeSpec::Civil(civil) => {
                let zone = zone.ok_or(TimeError::MissingZone)?;
                let zoned = civil
                    .to_zoned(zone.tz.clone())
                    .map_err(|e| TimeError::from(&e))?;
                ceil_ms(zoned.timestamp())
            }
        }
    }
}

impl std::fmt::Display for TimeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TimeSpec::At(ms) => f.write_str(&rfc3339_ms(*ms)),
            TimeSpec::Civil(civil) => write!(f, "{civil}"),
            TimeSpec::Ago(ms) => write!(f, "{}s ago", ms / 1000),
        }
    }
}

/// The `TimeSpec` an operator typed; the error is one line saying why.
pub fn parse_time_spec(value: &str) -> Result<TimeSpec, TimeError> {
    let b = value.as_bytes();
    let looks_like_date = b.len() >= 5 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-';
    if looks_like_date {
        let ts_err = match value.parse::<Timestamp>() {
            Ok(ts) => {
                rfc3339_offset(value)?;
                return ceil_ms(ts).map(TimeSpec::At);
            }
            Err(e) => e,
        };
        return value
            .parse::<DateTime>()
            .map(TimeSpec::Civil)
            .map_err(|_| TimeError::from(&ts_err));
    }
    parse_duration_ms(value).map(TimeSpec::Ago)
}

/// A duration in milliseconds, in jiff's friendly (`90s`, `1h30m`, `2 days`) or ISO 8601
/// (`PT1H`) form, in days (24 h) and smaller units; never negative.
pub fn parse_duration_ms(value: &str) -> Result<u64, TimeError> {
    let span: Span = value
        .parse()
        .map_err(|_| TimeError::NeitherTimeNorDuration)?;
    if span.is_negative() {
        return Err(TimeError::NegativeDuration);
    }
    if span.get_years() != 0 || span.get_months() != 0 || span.get_weeks() != 0 {
        return Err(TimeError::CalendarUnits);
    }
    let back: SignedDuration = span
        .to_duration(SpanRelativeTo::days_are_24_hours())
        .map_err(|e| TimeError::from(&e))?;
    u64::try_from(back.as_millis()).map_err(|_| TimeError::DurationTooLarge)
}

/// `parse_time_spec` resolved at once (`TimeSpec::resolve`).
#[cfg(test)]
pub fn parse_instant(value: &str, now_ms: u64, zone: Option<&Zone>) -> Result<u64, TimeError> {
    parse_time_spec(value)?.resolve(now_ms, zone)
}

/// Refuses a UTC offset RFC 3339 does not allow (hours above 23; jiff reads up to 25:59:59
/// and already refuses minutes above 59), which could only be a typing error.
fn rfc3339_offset(value: &str) -> Result<(), TimeError> {
    let Some(offset) = Pieces::parse(value)
        .ok()
        .and_then(|p| p.to_numeric_offset())
    else {
        return Ok(());
    };
    if offset.seconds().unsigned_abs() < 24 * 3600 {
        return Ok(());
    }
    Err(TimeError::OffsetOutOfRange(offset))
}

fn ceil_ms(ts: Timestamp) -> Result<u64, TimeError> {
    let ns = ts.as_nanosecond();
    u64::try_from((ns + 999_999).div_euclid(1_000_000)).map_err(|_| TimeError::Before1970)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339_ms(1_796_007_134_123), "2026-11-30T02:52:14.123Z");
        assert_eq!(rfc3339_ms(4_107_542_399_999), "2100-02-28T23:59:59.999Z");
    }

    #[test]
    fn a_zones_offset_follows_daylight_saving_time() {
        let winter = 1_796_007_134_123; // 2026-11-30
        let summer = 1_782_864_000_000; // 2026-07-01
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        assert_eq!(berlin.offset_ms_at(winter), 3_600_000);
        assert_eq!(berlin.offset_ms_at(summer), 7_200_000);
        assert_eq!(
            Zone::parse("America/St_Johns")
                .unwrap()
                .offset_ms_at(winter),
            -(3 * 3600 + 1800) * 1000
        );
        assert_eq!(Zone::utc().offset_ms_at(winter), 0);
    }

    #[test]
    fn zones_show_canonical_utc_times_with_their_offset() {
        let utc_text = rfc3339_ms(1_796_007_134_123);
        assert_eq!(Zone::utc().show(&utc_text), "2026-11-30T02:52:14.123Z");
        assert_eq!(Zone::parse("utc").unwrap().show(&utc_text), utc_text);
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        assert!(!berlin.is_utc());
        assert_eq!(berlin.show(&utc_text), "2026-11-30T03:52:14.123+01:00");
        assert_eq!(
            berlin.show("2026-07-01T00:00:00.000Z"),
            "2026-07-01T02:00:00.000+02:00"
        );
        assert_eq!(
            Zone::parse("America/St_Johns").unwrap().show(&utc_text),
            "2026-11-29T23:22:14.123-03:30"
        );
        assert_eq!(berlin.show("not a time"), "not a time");
        assert_eq!(
            berlin.show_ms(1_796_007_134_123),
            "2026-11-30T03:52:14.123+01:00"
        );
        assert_eq!(Zone::utc().show_ms(1_796_007_134_123), utc_text);
    }

    #[test]
    fn unknown_zones_are_one_line_errors() {
        for bad in ["Europe/Nowhere", "", "Local", "../../etc/passwd", "+02:00"] {
            let e = Zone::parse(bad).expect_err(bad).to_string();
            assert!(e.starts_with("--tz ") && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn offsets_beyond_23_59_are_refused() {
        let at = |s: &str| parse_instant(s, 0, None);
        assert_eq!(at("2026-11-30T02:52:14Z"), Ok(1_796_007_134_000));
        assert_eq!(
            at("2026-11-30T02:52:14+23:59"),
            Ok(1_796_007_134_000 - 86_340_000)
        );
        assert_eq!(
            at("2026-11-30T02:52:14-23:59"),
            Ok(1_796_007_134_000 + 86_340_000)
        );
        for bad in [
            "2026-11-30T02:52:14+25:00",
            "2026-11-30T02:52:14+24:00",
            "2026-11-30T02:52:14-24:00",
            "2026-11-30T02:52:14+2400",
            "2026-11-30T02:52:14-25:59",
            "2026-11-30T02:52:14+23:60",
        ] {
            let e = at(bad).expect_err(bad).to_string();
            assert!(!e.contains('\n'), "{e}");
        }
        let e = at("2026-11-30T02:52:14+25:00").unwrap_err().to_string();
        assert!(e.contains("RFC 3339 allows -23:59 to +23:59"), "{e}");
    }

    #[test]
    fn days_from_civil_inverts_civil_from_days() {
        for days in (0..200_000).step_by(7).chain([59, 60, 365, 10_956, 47_541]) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), Some(days), "{y}-{m}-{d}");
            assert!(d <= days_in_month(y, m));
        }
        assert_eq!(days_from_civil(1969, 12, 31), None);
        assert_eq!(days_from_civil(2026, 13, 1), None);
        assert_eq!(days_in_month(2000, 2), 29);
        assert_eq!(days_in_month(2100, 2), 28);
    }
}
