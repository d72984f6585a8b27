//! `health`: a monitoring-plugin check. Readings are taken from one read-only snapshot (and
//! `statvfs` beside a redb file), judged against thresholds by a pure function, and printed
//! as one line `REPLAY-GUARD STATE - text | perfdata`; the exit code is the state (0 OK,
//! 1 WARNING, 2 CRITICAL, 3 UNKNOWN), as Nagios, Icinga and their kin expect.

use std::io::Write as _;
use std::process::ExitCode;

use crate::cli::HealthArgs;
use crate::cli::values::Threshold;
use crate::readings::Readings;
#[cfg(test)]
use crate::readings::SinkLag;
#[cfg(test)]
use crate::store::DiskSpace;
use crate::timefmt::now_ms;

/// A check's verdict, ordered from best to worst (UNKNOWN ranks last: nothing was judged).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum State {
    Ok,
    Warning,
    Critical,
    Unknown,
}

impl State {
    pub fn code(self) -> u8 {
        match self {
            State::Ok => 0,
            State::Warning => 1,
            State::Critical => 2,
            State::Unknown => 3,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            State::Ok => "OK",
            State::Warning => "WARNING",
            State::Critical => "CRITICAL",
            State::Unknown => "UNKNOWN",
        }
    }
}

/// A warning and a critical bound (`None`: that one is off), as given and as a number in
/// the reading's unit (seconds, a count, or hundredths of a percent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    warn: Option<(String, u64)>,
    crit: Option<(String, u64)>,
}

impl Bounds {
    /// Judges `value`: past a bound is above it, or below it when `low_is_bad`.
    fn judge(&self, value: u64, low_is_bad: bool) -> (State, Option<&str>) {
        fn past(b: &Option<(String, u64)>, value: u64, low_is_bad: bool) -> Option<&str> {
            b.as_ref()
                .filter(|(_, n)| if low_is_bad { value < *n } else { value > *n })
                .map(|(text, _)| text.as_str())
        }
        if let Some(t) = past(&self.crit, value, low_is_bad) {
            (State::Critical, Some(t))
        } else if let Some(t) = past(&self.warn, value, low_is_bad) {
            (State::Warning, Some(t))
        } else {
            (State::Ok, None)
        }
    }

    /// The perfdata `warn;crit` fields, scaled by `unit` (a range `N:` when low is bad).
    fn perf(&self, unit: impl Fn(u64) -> String, low_is_bad: bool) -> String {
        let one = |b: &Option<(String, u64)>| {
            b.as_ref().map_or(String::new(), |(_, n)| {
                if low_is_bad {
                    format!("{}:", unit(*n))
                } else {
                    unit(*n)
                }
            })
        };
        format!("{};{}", one(&self.warn), one(&self.crit))
    }
}

/// Every threshold of the check, parsed from the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thresholds {
    pub commit_age_s: Bounds,
    pub quarantined_1h: Bounds,
    /// Sequences missing in the last hour's upstream gaps.
    pub gaps_1h: Bounds,
    pub sessions_lost_1h: Bounds,
    /// Hundredths of a percent.
    pub window_fill: Bounds,
    pub relay_lag: Bounds,
    pub relay_age_s: Bounds,
    /// Events a sink parked.
    pub parked: Bounds,
    /// Hundredths of a percent.
    pub disk_free: Bounds,
}

impl Thresholds {
    /// The flags' thresholds (clap parsed each one, `cli::values`).
    pub fn from_args(a: &HealthArgs) -> Thresholds {
        let b = |warn: &Threshold, crit: &Threshold| Bounds {
            warn: warn.0.clone(),
            crit: crit.0.clone(),
        };
        Thresholds {
            commit_age_s: b(&a.warn_commit_age, &a.crit_commit_age),
            quarantined_1h: b(&a.warn_quarantine, &a.crit_quarantine),
            gaps_1h: b(&a.warn_gaps, &a.crit_gaps),
            sessions_lost_1h: b(&a.warn_sessions_lost, &a.crit_sessions_lost),
            window_fill: b(&a.warn_window_fill, &a.crit_window_fill),
            relay_lag: b(&a.warn_relay_lag, &a.crit_relay_lag),
            relay_age_s: b(&a.warn_relay_age, &a.crit_relay_age),
            parked: b(&a.warn_parked, &a.crit_parked),
            disk_free: b(&a.warn_disk_free, &a.crit_disk_free),
        }
    }
}

/// One judged reading.
struct Check {
    state: State,
    text: String,
}

/// The verdict and the status line (without a newline).
pub fn evaluate(r: &Readings, t: &Thresholds) -> (State, String) {
    let mut checks = Vec::new();
    let mut perf = Vec::new();
    let secs = |n: u64| n.to_string();
    let pct = |bp: u64| format!("{}.{:02}", bp / 100, bp % 100);
    let mut judged = |state: State, bound: Option<&str>, text: String| {
        let text = match bound {
            Some(b) if state != State::Ok => format!("{text} ({} {b})", state.name()),
            _ => text,
        };
        checks.push(Check { state, text });
    };

    let (s, b) = t.commit_age_s.judge(r.commit_age_s, false);
    let what = if r.decided {
        "last decision"
    } else {
        "no decision yet, created"
    };
    judged(s, b, format!("{what} {} ago", age(r.commit_age_s)));
    perf.push(format!(
        "commit_age={}s;{};0",
        r.commit_age_s,
        t.commit_age_s.perf(secs, false)
    ));

    let quarantined_1h = r.quarantined_1h.unwrap_or(0);
    let (s, b) = t.quarantined_1h.judge(quarantined_1h, false);
    judged(
        s,
        b,
        format!(
            "{} quarantined in the last hour ({} held)",
            quarantined_1h, r.quarantine_held
        ),
    );
    perf.push(format!(
        "quarantined_1h={};{};0",
        quarantined_1h,
        t.quarantined_1h.perf(secs, false)
    ));
    perf.push(format!("quarantine_held={};;;0", r.quarantine_held));

    let up = &r.upstream_1h;
    let (s, b) = t.gaps_1h.judge(up.missing_sequences, false);
    judged(
        s,
        b,
        format!(
            "{} sequences missing upstream in the last hour ({} gaps)",
            up.missing_sequences, up.gap_events
        ),
    );
    perf.push(format!(
        "upstream_missing_1h={};{};0",
        up.missing_sequences,
        t.gaps_1h.perf(secs, false)
    ));
    let (s, b) = t.sessions_lost_1h.judge(up.sessions_lost, false);
    judged(
        s,
        b,
        format!("{} broker sessions lost in the last hour", up.sessions_lost),
    );
    perf.push(format!(
        "sessions_lost_1h={};{};0",
        up.sessions_lost,
        t.sessions_lost_1h.perf(secs, false)
    ));

    let fill = (u128::from(r.window_entries) * 10_000 / u128::from(r.window_max.max(1))) as u64;
    let (s, b) = t.window_fill.judge(fill, false);
    judged(
        s,
        b,
        format!(
            "window {}% full ({} of {})",
            fill / 100,
            r.window_entries,
            r.window_max
        ),
    );
    perf.push(format!(
        "window_fill={}%;{};0;100",
        pct(fill),
        t.window_fill.perf(pct, false)
    ));
    perf.push(format!(
        "window_entries={};;;0;{}",
        r.window_entries, r.window_max
    ));

    for sink in &r.sinks {
        if let Some(why) = &sink.failing {
            let why: String = crate::textsafe::escape_controls(why)
                .chars()
                .take(200)
                .collect();
            judged(State::Critical, None, format!("sink {} {why}", sink.name));
        }
        let (s1, b1) = t.relay_lag.judge(sink.events, false);
        let (s2, b2) = t.relay_age_s.judge(sink.age_s, false);
        let (s, b) = if s2 > s1 { (s2, b2) } else { (s1, b1) };
        judged(
            s,
            b,
            format!(
                "sink {} {} behind ({} old)",
                sink.name,
                sink.events,
                age(sink.age_s)
            ),
        );
        if sink.parked > 0 {
            let (s, b) = t.parked.judge(sink.parked, false);
            judged(
                s,
                b,
                format!(
                    "sink {} {} parked (never reached the receiver: relay parked)",
                    sink.name, sink.parked
                ),
            );
        }
        let label = label(&sink.name);
        perf.push(format!(
            "'relay_lag_{label}'={};{};0",
            sink.events,
            t.relay_lag.perf(secs, false)
        ));
        perf.push(format!(
            "'relay_parked_{label}'={};{};0",
            sink.parked,
            t.parked.perf(secs, false)
        ));
        perf.push(format!(
            "'relay_age_{label}'={}s;{};0",
            sink.age_s,
            t.relay_age_s.perf(secs, false)
        ));
    }

    match r.disk {
        Some(d) => {
            let free =
                (u128::from(d.available_bytes) * 10_000 / u128::from(d.total_bytes.max(1))) as u64;
            let (s, b) = t.disk_free.judge(free, true);
            judged(
                s,
                b,
                format!("disk {}% free ({})", free / 100, size(d.available_bytes)),
            );
            perf.push(format!(
                "disk_free={}%;{};0;100",
                pct(free),
                t.disk_free.perf(pct, true)
            ));
            perf.push(format!(
                "disk_free_bytes={}B;;;0;{}",
                d.available_bytes, d.total_bytes
            ));
        }
        None => judged(
            State::Ok,
            None,
            "disk not checked (PostgreSQL: watch the server)".into(),
        ),
    }

    let state = checks.iter().map(|c| c.state).max().unwrap_or(State::Ok);
    // The worst first: a monitoring system shows the start of the line.
    checks.sort_by_key(|c| std::cmp::Reverse(c.state));
    let text: Vec<String> = checks.into_iter().map(|c| c.text).collect();
    let line = format!(
        "REPLAY-GUARD {} - {} | {}",
        state.name(),
        clean(&text.join(", ")),
        perf.join(" ")
    );
    (state, line)
}

/// A perfdata label from a sink name: letters, digits, `_`, `-` and `.` kept, else `_`.
fn label(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Text fit for the one line: no line breaks, and no `|` (it starts the perfdata).
fn clean(text: &str) -> String {
    text.replace(['\n', '\r'], " ").replace('|', "/")
}

fn age(s: u64) -> String {
    match s {
        0..120 => format!("{s} s"),
        120..7_200 => format!("{} min", s / 60),
        7_200..172_800 => format!("{} h", s / 3_600),
        _ => format!("{} d", s / 86_400),
    }
}

fn size(bytes: u64) -> String {
    let gib = bytes as f64 / (1024.0 * 1024.0 * 1024.0);
    if gib >= 1.0 {
        format!("{gib:.1} GiB")
    } else {
        format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
    }
}

/// Whether the command line asks for `health` (so that a usage error is reported the
/// plugin's way: one line on stdout, exit 3).
pub fn requested() -> bool {
    crate::cli::subcommand(std::env::args_os()).as_deref() == Some("health")
}

/// Prints an UNKNOWN line for `why`; exit code 3.
pub fn unknown(why: &str) -> ExitCode {
    print_line(&format!("REPLAY-GUARD UNKNOWN - {}", clean(why)));
    ExitCode::from(State::Unknown.code())
}

fn print_line(line: &str) {
    // A closed stdout cannot be told about; the exit code still says it.
    let mut out = crate::output::stdout();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

pub fn run(args: &HealthArgs) -> ExitCode {
    let thresholds = Thresholds::from_args(args);
    let now = now_ms();
    let judged = super::config(&args.db).and_then(|config| {
        let (db, snap) = super::open_snapshot(&config)?;
        let readings = Readings::read_with_last_hour(&snap, &db, &config, now).map_err(|e| {
            super::Failure::Runtime(anyhow::Error::new(e).context(db.display().to_string()))
        })?;
        Ok(evaluate(&readings, &thresholds))
    });
    match judged {
        Ok((state, line)) => {
            print_line(&line);
            ExitCode::from(state.code())
        }
        Err(f) => unknown(&format!("{:#}", f.error())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Thresholds {
        use clap::Parser as _;
        let cli = crate::cli::Cli::parse_from(["replay-guard", "health", "--db", "x"]);
        let crate::cli::Command::Health(a) = cli.command else {
            panic!("not health")
        };
        Thresholds::from_args(&a)
    }

    fn healthy() -> Readings {
        Readings {
            commit_age_s: 3,
            decided: true,
            quarantined_1h: Some(0),
            quarantine_held: 2,
            window_entries: 120,
            window_max: 1_000,
            window_oldest_age_s: Some(60),
            decisions: None,
            bursts: 0,
            burst_duplicates: 0,
            upstream_total: Default::default(),
            upstream_1h: Default::default(),
            database_bytes: 1 << 20,
            sinks: vec![SinkLag {
                name: "cop db".into(),
                events: 0,
                age_s: 0,
                parked: 0,
                delivered: 0,
                resent: 0,
                last_error_ms: None,
                failing: None,
            }],
            disk: Some(DiskSpace {
                available_bytes: 40 << 30,
                total_bytes: 100 << 30,
            }),
        }
    }

    #[test]
    fn a_healthy_store_is_ok_with_every_reading_in_the_perfdata() {
        let (state, line) = evaluate(&healthy(), &defaults());
        assert_eq!(state, State::Ok);
        assert_eq!(
            line,
            "REPLAY-GUARD OK - last decision 3 s ago, 0 quarantined in the last hour (2 held), \
             0 sequences missing upstream in the last hour (0 gaps), 0 broker sessions lost in \
             the last hour, window 12% full (120 of 1000), sink cop db 0 behind (0 s old), disk \
             40% free (40.0 GiB) | commit_age=3s;300;900;0 quarantined_1h=0;0;50;0 \
             quarantine_held=2;;;0 upstream_missing_1h=0;0;1000;0 sessions_lost_1h=0;0;;0 \
             window_fill=12.00%;80.00;95.00;0;100 window_entries=120;;;0;1000 \
             'relay_lag_cop_db'=0;1000;10000;0 'relay_parked_cop_db'=0;0;100;0 \
             'relay_age_cop_db'=0s;300;900;0 disk_free=40.00%;10.00:;5.00:;0;100 disk_free_bytes=42949672960B;;;0;107374182400"
        );
    }

    #[test]
    fn each_reading_past_its_bounds_sets_the_state_and_leads_the_text() {
        let t = defaults();
        type Case = (fn(&mut Readings), State, &'static str);
        let cases: [Case; 13] = [
            (
                |r| r.sinks[0].parked = 1,
                State::Warning,
                "sink cop db 1 parked (never reached the receiver: relay parked) (WARNING 0)",
            ),
            (
                |r| r.sinks[0].parked = 101,
                State::Critical,
                "sink cop db 101 parked (never reached the receiver: relay parked) (CRITICAL 100)",
            ),
            (
                |r| {
                    r.upstream_1h.missing_sequences = 2000;
                    r.upstream_1h.gap_events = 1
                },
                State::Critical,
                "2000 sequences missing upstream in the last hour (1 gaps) (CRITICAL 1000)",
            ),
            (
                |r| {
                    r.upstream_1h.missing_sequences = 3;
                    r.upstream_1h.gap_events = 2
                },
                State::Warning,
                "3 sequences missing upstream in the last hour (2 gaps) (WARNING 0)",
            ),
            (
                |r| r.upstream_1h.sessions_lost = 1,
                State::Warning,
                "1 broker sessions lost in the last hour (WARNING 0)",
            ),
            (
                |r| r.commit_age_s = 301,
                State::Warning,
                "last decision 5 min ago (WARNING 5m)",
            ),
            (
                |r| r.commit_age_s = 901,
                State::Critical,
                "last decision 15 min ago (CRITICAL 15m)",
            ),
            (
                |r| r.quarantined_1h = Some(1),
                State::Warning,
                "1 quarantined in the last hour (2 held) (WARNING 0)",
            ),
            (
                |r| r.window_entries = 801,
                State::Warning,
                "window 80% full (801 of 1000) (WARNING 80)",
            ),
            (
                |r| r.window_entries = 1_000,
                State::Critical,
                "window 100% full (1000 of 1000) (CRITICAL 95)",
            ),
            (
                |r| r.sinks[0].events = 10_001,
                State::Critical,
                "sink cop db 10001 behind (0 s old) (CRITICAL 10000)",
            ),
            (
                |r| {
                    r.sinks[0].events = 1;
                    r.sinks[0].age_s = 301
                },
                State::Warning,
                "sink cop db 1 behind (5 min old) (WARNING 5m)",
            ),
            (
                |r| {
                    r.disk = Some(DiskSpace {
                        available_bytes: 4,
                        total_bytes: 100,
                    })
                },
                State::Critical,
                "disk 4% free (0.0 MiB) (CRITICAL 5)",
            ),
        ];
        for (change, want, text) in cases {
            let mut r = healthy();
            change(&mut r);
            let (state, line) = evaluate(&r, &t);
            assert_eq!(state, want, "{line}");
            let lead = format!("REPLAY-GUARD {} - {text}", want.name());
            assert!(
                line.starts_with(&lead),
                "{line}\n  should start with\n{lead}"
            );
        }
    }

    #[test]
    fn the_worst_state_wins_and_off_turns_a_bound_off() {
        let mut r = healthy();
        r.commit_age_s = 400;
        r.window_entries = 1_000;
        assert_eq!(evaluate(&r, &defaults()).0, State::Critical);
        let mut t = defaults();
        t.window_fill = Bounds {
            warn: None,
            crit: None,
        };
        assert_eq!(evaluate(&r, &t).0, State::Warning);
        t.commit_age_s.warn = None;
        assert_eq!(evaluate(&r, &t).0, State::Ok);
    }

    #[test]
    fn a_postgres_store_skips_the_disk_with_a_note() {
        let mut r = healthy();
        r.disk = None;
        let (state, line) = evaluate(&r, &defaults());
        assert_eq!(state, State::Ok);
        assert!(line.contains("disk not checked (PostgreSQL: watch the server)"));
        assert!(!line.contains("disk_free"));
    }

    #[test]
    fn text_cannot_break_the_line_or_start_the_perfdata() {
        assert_eq!(clean("a\nb | c"), "a b / c");
        assert_eq!(label("cop db/'x'=1"), "cop_db__x__1");
    }
}
