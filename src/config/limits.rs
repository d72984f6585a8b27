//! Limits: the allowed range of every numeric key and its default, `in_range`, and the
//! largest file the config reads (`read_bounded`).

use std::path::Path;

use crate::store::LogRetention;

use super::ConfigError;

/// Largest accepted `[commit] max_batch`.
pub const MAX_BATCH_LIMIT: usize = 65_535;
pub const DEFAULT_MAX_BATCH: usize = 1000;
/// How long a batch waits for more messages after its first one before it commits anyway.
pub const DEFAULT_LINGER_MS: u64 = 2;
/// How long an upstream gap may stay open (the sequences between arriving late, here or at
/// another member of a shared subscription) before it is reported.
pub const DEFAULT_GAP_GRACE_MS: u64 = 5_000;

// The allowed range of every numeric key, checked in `Config::from_raw`, which every command
// (`check-config`, `run`, `ingest`, ...) goes through: nothing validates later, so a value
// `check-config` accepts can never panic or misbehave in `run`. README "Configuration" lists
// the same ranges.
pub(super) type Range = std::ops::RangeInclusive<u64>;
pub const CACHE_MB: Range = 1..=65_536;
/// 365 days.
pub const WINDOW_SECONDS: Range = 1..=31_536_000;
pub const WINDOW_MAX_ENTRIES: Range = 1..=1_000_000_000;
/// 64 MiB: far above any incident update; payloads are parsed whole in memory.
pub const MAX_PAYLOAD_BYTES: Range = 1..=67_108_864;
pub const MAX_DEPTH: Range = 1..=crate::wire::STORED_MAX_DEPTH as u64;
pub const MAX_BATCH: Range = 1..=MAX_BATCH_LIMIT as u64;
pub const LINGER_MS: Range = 0..=60_000;
/// 0 confirms a gap at the next commit or tick.
pub const GAP_GRACE_MS: Range = 0..=600_000;
/// 100 years; 0 turns the bound off.
pub const RETENTION_DAYS: Range = 0..=36_500;
/// 0 turns the bound off.
pub const RETENTION_ENTRIES: Range = 0..=10_000_000_000;
/// Up to `u32::MAX`, which MQTT 5 reads as "never expires".
pub const SESSION_EXPIRY_SECONDS: Range = 60..=4_294_967_295;
pub const RECEIVE_MAXIMUM: Range = 1..=65_535;
/// rumqttc's MQTT 5 client panics below 5 s, and the protocol field is 16 bits.
pub const KEEP_ALIVE_SECONDS: Range = 5..=65_535;
pub const RETRIES_PER_BROKER: Range = 0..=1_000;
pub const BACKOFF_INITIAL_MS: Range = 10..=60_000;
/// The lower end is `backoff_initial_ms`.
pub const BACKOFF_MAX_MS: u64 = 600_000;
pub const SHUTDOWN_TIMEOUT_SECONDS: Range = 1..=3_600;
/// `[store] statement_timeout_ms`: 100 ms to 10 minutes per round trip to PostgreSQL.
pub const STATEMENT_TIMEOUT_MS: Range = 100..=600_000;
/// `[[sink]]`'s keys.
pub const SINK_BATCH_MAX: Range = 1..=10_000;
pub const SINK_LINGER_MS: Range = 0..=60_000;
pub const SINK_MAX_IN_FLIGHT: Range = 1..=1_000;
pub const SINK_BACKOFF_INITIAL_MS: Range = 10..=60_000;
/// The lower end is `backoff_initial_ms`.
pub const SINK_BACKOFF_MAX_MS: u64 = 3_600_000;
pub const SINK_TIMEOUT_MS: Range = 100..=600_000;
/// A syslog sink's `settle_ms`: up to 10 s (once per tcp:// or tls:// connection).
pub const SINK_SETTLE_MS: Range = 0..=10_000;
/// A syslog sink's `relp_window`: RELP commands awaiting their `rsp` at once.
pub const SINK_RELP_WINDOW: Range = 1..=10_000;

/// `key = value` within `range`, or a one-line error naming the key and the allowed range.
pub(super) fn in_range(key: &str, value: u64, range: Range) -> Result<(), ConfigError> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(ConfigError::Invalid(format!(
        "{key} = {value} is out of range: allowed {}..={}",
        range.start(),
        range.end()
    )))
}

/// Retention defaults: sized in the README from the measured bytes per entry so that a busy
/// edge host's file stays bounded whatever the feed rate.
pub const DEFAULT_AUDIT_MAX_AGE_DAYS: u64 = 400;
pub const DEFAULT_AUDIT_MAX_ENTRIES: u64 = 20_000_000;
pub const DEFAULT_EFFECTS_MAX_AGE_DAYS: u64 = 30;
pub const DEFAULT_EFFECTS_MAX_ENTRIES: u64 = 5_000_000;
pub const DEFAULT_QUARANTINE_MAX_AGE_DAYS: u64 = 400;
pub const DEFAULT_QUARANTINE_MAX_ENTRIES: u64 = 1_000_000;

pub(super) fn log_retention(days: u64, entries: u64) -> LogRetention {
    LogRetention {
        max_age_seconds: (days > 0).then(|| days.saturating_mul(86_400)),
        max_entries: (entries > 0).then_some(entries),
    }
}

/// Largest config file read: far above any real one, and it bounds `--config /dev/zero`.
pub(super) const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Largest password file read (`password_file = "/dev/zero"` must not grow memory).
pub(super) const MAX_PASSWORD_BYTES: u64 = 4096;
/// Longest `[relay] source` and sink topic template.
pub(super) const MAX_TEXT: usize = 4096;
/// Largest `dsn_file` read.
pub(super) const MAX_DSN_BYTES: u64 = 16 * 1024;
/// Largest `authorization_file` read: a long JWT fits, `/dev/zero` does not.
pub(super) const MAX_AUTHORIZATION_BYTES: u64 = 16 * 1024;

/// Reads a UTF-8 text file of at most `limit` bytes; a longer one (or an endless device) is an
/// error rather than an unbounded read.
pub(super) fn read_bounded(path: &Path, limit: u64) -> std::io::Result<String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > limit {
        return Err(std::io::Error::other(format!(
            "longer than {limit} bytes: not a file replay-guard reads"
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const MQTT_OK: &str =
        "[mqtt]\nbrokers = [\"mqtt://127.0.0.1:1883\"]\nclient_id = \"rg\"\ntopics = [\"t/#\"]\n";

    /// Every numeric key: (table, key, range, other lines the boundary needs).
    fn every_range() -> Vec<(&'static str, &'static str, Range, &'static str)> {
        vec![
            ("store", "cache_mb", CACHE_MB, ""),
            ("window", "seconds", WINDOW_SECONDS, ""),
            ("window", "max_entries", WINDOW_MAX_ENTRIES, ""),
            ("feed", "max_payload_bytes", MAX_PAYLOAD_BYTES, ""),
            ("feed", "max_depth", MAX_DEPTH, ""),
            ("commit", "max_batch", MAX_BATCH, ""),
            ("commit", "linger_ms", LINGER_MS, ""),
            ("feed", "gap_grace_ms", GAP_GRACE_MS, ""),
            ("retention", "audit_max_age_days", RETENTION_DAYS, ""),
            ("retention", "audit_max_entries", RETENTION_ENTRIES, ""),
            ("retention", "effects_max_age_days", RETENTION_DAYS, ""),
            ("retention", "effects_max_entries", RETENTION_ENTRIES, ""),
            ("retention", "quarantine_max_age_days", RETENTION_DAYS, ""),
            ("retention", "quarantine_max_entries", RETENTION_ENTRIES, ""),
            (
                "store",
                "statement_timeout_ms",
                STATEMENT_TIMEOUT_MS,
                "backend = \"postgres\"\ndsn = \"host=h\"\n",
            ),
            (
                "service",
                "shutdown_timeout_seconds",
                SHUTDOWN_TIMEOUT_SECONDS,
                "",
            ),
            ("mqtt", "session_expiry_seconds", SESSION_EXPIRY_SECONDS, ""),
            ("mqtt", "receive_maximum", RECEIVE_MAXIMUM, ""),
            ("mqtt", "keep_alive_seconds", KEEP_ALIVE_SECONDS, ""),
            (
                "mqtt",
                "keep_alive_seconds",
                KEEP_ALIVE_SECONDS,
                "protocol = \"v3.1.1\"\n",
            ),
            ("mqtt", "retries_per_broker", RETRIES_PER_BROKER, ""),
            (
                "mqtt",
                "backoff_initial_ms",
                BACKOFF_INITIAL_MS,
                "backoff_max_ms = 600000\n",
            ),
            (
                "mqtt",
                "backoff_max_ms",
                10..=BACKOFF_MAX_MS,
                "backoff_initial_ms = 10\n",
            ),
            (
                "mqtt",
                "backoff_max_ms",
                700..=BACKOFF_MAX_MS,
                "backoff_initial_ms = 700\n",
            ),
        ]
    }

    #[test]
    fn every_numeric_key_accepts_its_range_ends_and_names_the_range_beyond_them() {
        for (table, key, range, extra) in every_range() {
            let text = |v: u64| {
                if table == "mqtt" {
                    format!("{MQTT_OK}{extra}{key} = {v}\n")
                } else {
                    format!("{MQTT_OK}[{table}]\n{extra}{key} = {v}\n")
                }
            };
            for ok in [*range.start(), *range.end()] {
                if let Err(e) = Config::parse(&text(ok)) {
                    panic!("[{table}] {key} = {ok} {extra:?}: {e}");
                }
            }
            let mut bad = vec![range.end() + 1];
            if *range.start() > 0 {
                bad.push(range.start() - 1);
            }
            for v in bad {
                let e = Config::parse(&text(v)).unwrap_err().to_string();
                assert!(e.contains(key), "[{table}] {key} = {v}: {e}");
                assert!(!e.contains('\n'), "{e}");
                // Keys typed wider than their range name the range; u16/u32 ones fail in TOML.
                if !matches!(key, "receive_maximum" | "session_expiry_seconds")
                    || v < *range.start()
                {
                    let want = format!("allowed {}..={}", range.start(), range.end());
                    assert!(e.contains(&want), "[{table}] {key} = {v}: {e} lacks {want}");
                }
            }
        }
    }

    #[test]
    fn the_values_that_crashed_run_are_rejected() {
        for (extra, want) in [
            (
                "keep_alive_seconds = 4\n",
                "[mqtt] keep_alive_seconds = 4 is out of range: allowed 5..=65535",
            ),
            (
                "keep_alive_seconds = 0\nprotocol = \"v3.1.1\"\n",
                "keep_alive_seconds = 0",
            ),
            (
                "[service]\nshutdown_timeout_seconds = 18446744073709551615\n",
                "shutdown_timeout_seconds",
            ),
        ] {
            let e = Config::parse(&format!("{MQTT_OK}{extra}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{extra}: {e}");
        }
    }
}
