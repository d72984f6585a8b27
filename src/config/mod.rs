//! The validated configuration: a TOML file (unknown keys are errors) plus command-line
//! overrides. Everything else receives these typed values, never raw TOML.
//!
//! Here: `Config`, its loading and `Config::from_raw`, the one place every value is checked.
//! Beside it, by concern: `raw` (the file as written), `limits` (ranges, defaults, bounded
//! reads), `topics`, `redact` (`Secret`, what errors and logs hide), `url` (the one URL
//! parser: brokers and http sinks), `store` (`[store]`), `mqtt` (`[mqtt]`) and `sinks`
//! (`[relay]`, `[[sink]]`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::decide::OutOfOrder;
use crate::json::Pointer;
use crate::store::{RetentionPolicy, StoreOptions, WindowPolicy};
use crate::wire::FeedContract;

mod limits;
mod mqtt;
mod raw;
mod redact;
mod sinks;
mod store;
mod topics;
mod url;

pub use limits::*;
pub use mqtt::{MqttConfig, Protocol, TlsFiles};
pub use redact::Secret;
pub(crate) use sinks::syslog_hostname_problem;
pub use sinks::{
    ExecSink, HttpSink, MqttSink, OnPoison, PostgresSink, RelayConfig, SinkConfig, SinkKind, Start,
    SyslogSink,
};
pub use store::{StoreBackend, StoreLocation};
pub use topics::TOPIC_PLACEHOLDERS;
pub use url::{BrokerUrl, HttpUrl, SyslogUrl};

use mqtt::mqtt_from_raw;
use raw::{RawConfig, RawMetrics, RawOutOfOrder};
use store::store_backend;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("config: {0}")]
    Invalid(String),
}

/// Where `[metrics]` listens unless told: loopback only (the endpoint has no authentication).
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9464";

/// `[metrics] listen`: an IP address and a port (no host names: nothing to resolve at start).
fn metrics_from_raw(raw: Option<RawMetrics>) -> Result<Option<SocketAddr>, ConfigError> {
    let Some(raw) = raw.filter(|m| m.enabled) else {
        return Ok(None);
    };
    raw.listen.parse().map(Some).map_err(|_| {
        ConfigError::Invalid(format!(
            "[metrics] listen = {:?}: not an IP address and port (e.g. \"{DEFAULT_METRICS_LISTEN}\", \"[::1]:9464\")",
            raw.listen
        ))
    })
}

/// Everything the engine needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    /// `[store] backend`: a redb file (at `db_path`) or a PostgreSQL schema.
    pub backend: StoreBackend,
    /// The database file; `None` until a config file or `--db` names it.
    pub db_path: Option<PathBuf>,
    pub store: StoreOptions,
    pub feed: FeedContract,
    pub max_batch: usize,
    pub linger: std::time::Duration,
    /// `[feed] gap_grace_ms`: how long a gap stays a candidate before what is still missing
    /// of it is reported (`store::upstream::GapCandidates`).
    pub gap_grace: std::time::Duration,
    /// `None` when the file has no `[mqtt]` section (enough for `ingest` and the dumps).
    pub mqtt: Option<MqttConfig>,
    pub shutdown_timeout: std::time::Duration,
    /// `[metrics]`: where the Prometheus endpoint listens (`None`: off, the default).
    pub metrics: Option<SocketAddr>,
    /// `[relay]` and `[[sink]]`: where applied effects are delivered.
    pub relay: RelayConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config::from_raw(RawConfig::default()).unwrap_or_else(|e| unreachable!("defaults: {e}"))
    }
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let mut c = Config::load_one(path)?;
        if let Some(from) = c.relay.sinks_from.clone() {
            c.declare_from(path, &from)?;
        }
        Ok(c)
    }

    /// `[relay] sinks_from`: reads the relay unit's config at `from` (relative to the
    /// directory of `path`, this config's file), which must name the same store and no sink
    /// of this one, and declares its sinks. Either file's error stops the load: a config
    /// whose relay unit's sinks cannot be known would let retention prune what they have not
    /// delivered.
    fn declare_from(&mut self, path: &Path, from: &Path) -> Result<(), ConfigError> {
        let from = match path.parent() {
            Some(dir) if from.is_relative() => dir.join(from),
            _ => from.to_path_buf(),
        };
        let refuse = |m: String| ConfigError::Parse {
            path: path.to_path_buf(),
            message: format!("[relay] sinks_from {:?}: {m}", from.display().to_string()),
        };
        let other = Config::load_one(&from).map_err(|e| refuse(e.to_string()))?;
        if other.relay.sinks_from.is_some() {
            return Err(refuse(
                "it has a [relay] sinks_from of its own; name the relay unit's config, whose \
                 sinks are delivered there"
                    .into(),
            ));
        }
        if !self.same_store(&other) {
            return Err(refuse(
                "it names another store ([store]): its sinks' cursors are in that store, so \
                 this one cannot hold retention for them; give both configs the same [store]"
                    .into(),
            ));
        }
        if other.relay.sinks.is_empty() {
            return Err(refuse(
                "it has no [[sink]]: there is nothing to declare".into(),
            ));
        }
        if let Some(both) = other
            .relay
            .sinks
            .iter()
            .find(|s| self.relay.sinks.iter().any(|m| m.name == s.name))
        {
            return Err(refuse(format!(
                "sink {:?} is in both configs: one sink has one deliverer; keep its [[sink]] \
                 in the relay unit's config only",
                both.name
            )));
        }
        self.relay.declared = other.relay.sinks;
        if let Some(m) = &self.mqtt {
            sinks::refuse_feed_loops(m, &self.relay).map_err(|e| refuse(e.to_string()))?;
        }
        Ok(())
    }

    /// Whether `other` names the same store: the same file (the same path once resolved),
    /// or the same PostgreSQL target and schema.
    fn same_store(&self, other: &Config) -> bool {
        match (&self.backend, &other.backend) {
            (StoreBackend::Redb, StoreBackend::Redb) => match (&self.db_path, &other.db_path) {
                (Some(a), Some(b)) => {
                    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.into());
                    a == b || canon(a) == canon(b)
                }
                // `--db` may name the file at the command line.
                _ => true,
            },
            (StoreBackend::Postgres(a), StoreBackend::Postgres(b)) => {
                a.schema == b.schema
                    && match (a.pg_config(), b.pg_config()) {
                        (Ok(x), Ok(y)) => x.target() == y.target(),
                        _ => false,
                    }
            }
            _ => false,
        }
    }

    fn load_one(path: &Path) -> Result<Config, ConfigError> {
        let text = read_bounded(path, MAX_CONFIG_BYTES).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Config::parse(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            ConfigError::Invalid(m) => ConfigError::Parse {
                path: path.to_path_buf(),
                message: m,
            },
            other => other,
        })
    }

    /// Parses and validates config text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: redact::one_line(&e, text),
        })?;
        Config::from_raw(raw)
    }

    /// `--config` if given, else defaults; then `--db` overrides `[store] path`.
    pub fn resolve(config: Option<&Path>, db: Option<&Path>) -> Result<Config, ConfigError> {
        let mut c = match config {
            Some(p) => Config::load(p)?,
            None => Config::default(),
        };
        if let Some(db) = db {
            if let StoreBackend::Postgres(_) = c.backend {
                return Err(ConfigError::Invalid(
                    "--db names a redb file, but the config's [store] backend is postgres: \
                     drop --db (the config names the server)"
                        .into(),
                ));
            }
            c.db_path = Some(db.to_path_buf());
        }
        Ok(c)
    }

    /// Where the store is: a redb file (named by `--db` or `[store] path`) or a PostgreSQL
    /// schema.
    pub fn location(&self) -> Result<StoreLocation<'_>, ConfigError> {
        match &self.backend {
            StoreBackend::Postgres(pg) => Ok(StoreLocation::Postgres(pg)),
            StoreBackend::Redb => self.require_db().map(StoreLocation::File),
        }
    }

    /// The database path, or a usage error naming both ways to give one.
    pub fn require_db(&self) -> Result<&Path, ConfigError> {
        if let StoreBackend::Postgres(_) = self.backend {
            return Err(ConfigError::Invalid(
                "this command works on a redb file, and the config's [store] backend is \
                 postgres"
                    .into(),
            ));
        }
        self.db_path.as_deref().ok_or_else(|| {
            ConfigError::Invalid(
                "no database: pass --db PATH or set [store] path in --config".into(),
            )
        })
    }

    fn from_raw(raw: RawConfig) -> Result<Config, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(m);
        let ptr = |key: &str, s: &str| {
            Pointer::parse(s).map_err(|e| invalid(format!("[feed] {key}: {e}")))
        };
        let r = &raw.retention;
        let wide = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let numbers: [(&str, u64, Range); 15] = [
            ("[store] cache_mb", raw.store.cache_mb, CACHE_MB),
            ("[window] seconds", raw.window.seconds, WINDOW_SECONDS),
            (
                "[window] max_entries",
                raw.window.max_entries,
                WINDOW_MAX_ENTRIES,
            ),
            (
                "[feed] max_payload_bytes",
                wide(raw.feed.max_payload_bytes),
                MAX_PAYLOAD_BYTES,
            ),
            ("[feed] max_depth", wide(raw.feed.max_depth), MAX_DEPTH),
            ("[feed] gap_grace_ms", raw.feed.gap_grace_ms, GAP_GRACE_MS),
            ("[commit] max_batch", wide(raw.commit.max_batch), MAX_BATCH),
            ("[commit] linger_ms", raw.commit.linger_ms, LINGER_MS),
            (
                "[retention] audit_max_age_days",
                r.audit_max_age_days,
                RETENTION_DAYS,
            ),
            (
                "[retention] audit_max_entries",
                r.audit_max_entries,
                RETENTION_ENTRIES,
            ),
            (
                "[retention] effects_max_age_days",
                r.effects_max_age_days,
                RETENTION_DAYS,
            ),
            (
                "[retention] effects_max_entries",
                r.effects_max_entries,
                RETENTION_ENTRIES,
            ),
            (
                "[retention] quarantine_max_age_days",
                r.quarantine_max_age_days,
                RETENTION_DAYS,
            ),
            (
                "[retention] quarantine_max_entries",
                r.quarantine_max_entries,
                RETENTION_ENTRIES,
            ),
            (
                "[service] shutdown_timeout_seconds",
                raw.service.shutdown_timeout_seconds,
                SHUTDOWN_TIMEOUT_SECONDS,
            ),
        ];
        for (key, value, range) in numbers {
            in_range(key, value, range)?;
        }
        let fields = [
            ("agency", &raw.feed.agency),
            ("source_id", &raw.feed.source_id),
            ("sequence", &raw.feed.sequence),
            ("epoch", &raw.feed.epoch),
        ];
        for (i, (name, p)) in fields.iter().enumerate() {
            if p.is_empty() {
                return Err(invalid(format!(
                    "[feed] {name} must point into the message, not be \"\""
                )));
            }
            if let Some((other, _)) = fields[..i].iter().find(|(_, q)| q == p) {
                return Err(invalid(format!(
                    "[feed] {name} and {other} both point at {p:?}"
                )));
            }
        }
        if raw.feed.digest_ignore.iter().any(String::is_empty) {
            return Err(invalid(
                "[feed] digest_ignore: \"\" would ignore the whole message; name fields".into(),
            ));
        }
        let digest_ignore: Vec<Pointer> = raw
            .feed
            .digest_ignore
            .iter()
            .map(|s| ptr("digest_ignore", s))
            .collect::<Result<_, _>>()?;
        // Each ignored value named once: a repeated or nested pointer would make the removal
        // depend on how the list is read ("/list/0" twice would remove two items).
        for (i, a) in digest_ignore.iter().enumerate() {
            if let Some(b) = digest_ignore[..i].iter().find(|b| b.overlaps(a)) {
                return Err(invalid(format!(
                    "[feed] digest_ignore: {:?} and {:?} overlap (the same value, or one inside \
                     the other): list each field once",
                    b.to_string(),
                    a.to_string()
                )));
            }
        }
        let feed = FeedContract {
            agency: ptr("agency", &raw.feed.agency)?,
            source_id: ptr("source_id", &raw.feed.source_id)?,
            sequence: ptr("sequence", &raw.feed.sequence)?,
            epoch: ptr("epoch", &raw.feed.epoch)?,
            digest_ignore,
            max_payload_bytes: raw.feed.max_payload_bytes,
            max_depth: raw.feed.max_depth,
        };
        let client_id = raw.mqtt.as_ref().map(|m| m.client_id.clone());
        let relay = sinks::relay_from_raw(raw.relay, raw.sink, client_id.as_deref())?;
        let mqtt = raw.mqtt.map(mqtt_from_raw).transpose()?;
        if let Some(m) = &mqtt {
            sinks::refuse_feed_loops(m, &relay)?;
        }
        let backend = store_backend(&raw.store)?;
        let shared = mqtt
            .as_ref()
            .is_some_and(|m| m.topics.iter().any(|t| t.starts_with("$share/")));
        if shared && matches!(backend, StoreBackend::Redb) {
            return Err(invalid(
                "[mqtt] share_group needs [store] backend = \"postgres\": the broker redelivers \
                 a member's unacknowledged messages to another member, whose own redb file \
                 would not know them (shared subscriptions need one shared window)"
                    .into(),
            ));
        }
        Ok(Config {
            metrics: metrics_from_raw(raw.metrics)?,
            relay,
            backend,
            db_path: raw.store.path,
            store: StoreOptions {
                cache_bytes: usize::try_from(raw.store.cache_mb.saturating_mul(1024 * 1024))
                    .unwrap_or(usize::MAX),
                window: WindowPolicy {
                    seconds: raw.window.seconds,
                    max_entries: raw.window.max_entries,
                },
                out_of_order: match raw.window.out_of_order {
                    RawOutOfOrder::Apply => OutOfOrder::Apply,
                    RawOutOfOrder::Quarantine => OutOfOrder::Quarantine,
                },
                retention: RetentionPolicy {
                    audit: log_retention(r.audit_max_age_days, r.audit_max_entries),
                    effects: log_retention(r.effects_max_age_days, r.effects_max_entries),
                    quarantine: log_retention(r.quarantine_max_age_days, r.quarantine_max_entries),
                },
                ..StoreOptions::default()
            },
            feed,
            max_batch: raw.commit.max_batch,
            linger: std::time::Duration::from_millis(raw.commit.linger_ms),
            gap_grace: std::time::Duration::from_millis(raw.feed.gap_grace_ms),
            mqtt,
            shutdown_timeout: std::time::Duration::from_secs(raw.service.shutdown_timeout_seconds),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_gives_documented_defaults() {
        let c = Config::parse("").unwrap();
        assert_eq!(
            c.store.window,
            WindowPolicy {
                seconds: 600,
                max_entries: 1_000_000
            }
        );
        assert_eq!(c.store.out_of_order, OutOfOrder::Apply);
        assert_eq!(c.feed.max_payload_bytes, 262_144);
        assert_eq!(c.max_batch, 1000);
        assert_eq!(c.gap_grace, std::time::Duration::from_millis(5000));
        assert!(c.db_path.is_none());
        let r = c.store.retention;
        assert_eq!(r.audit.max_age_seconds, Some(400 * 86_400));
        assert_eq!(r.audit.max_entries, Some(20_000_000));
        assert_eq!(r.effects.max_age_seconds, Some(30 * 86_400));
        assert_eq!(r.quarantine.max_entries, Some(1_000_000));
    }

    #[test]
    fn metrics_are_off_unless_asked_for_and_loopback_when_on() {
        assert_eq!(Config::parse("").unwrap().metrics, None);
        let on = |text: &str| Config::parse(text).map(|c| c.metrics);
        assert_eq!(
            on("[metrics]\n").unwrap(),
            Some("127.0.0.1:9464".parse().unwrap())
        );
        assert_eq!(on("[metrics]\nenabled = false\n").unwrap(), None);
        assert_eq!(
            on("[metrics]\nlisten = \"[::1]:9100\"\n").unwrap(),
            Some("[::1]:9100".parse().unwrap())
        );
        for bad in ["localhost:9464", "127.0.0.1", "127.0.0.1:99999", ""] {
            let e = on(&format!("[metrics]\nlisten = {bad:?}\n")).unwrap_err();
            assert!(e.to_string().contains("[metrics] listen"), "{bad}: {e}");
        }
        assert!(
            on("[metrics]\nport = 9464\n").is_err(),
            "unknown keys are errors"
        );
    }

    #[test]
    fn retention_bounds_turn_off_with_zero() {
        let c = Config::parse("[retention]\naudit_max_age_days = 0\neffects_max_entries = 0\n")
            .unwrap();
        assert_eq!(c.store.retention.audit.max_age_seconds, None);
        assert_eq!(c.store.retention.audit.max_entries, Some(20_000_000));
        assert_eq!(c.store.retention.effects.max_entries, None);
        let e = Config::parse("[retention]\naudit_days = 3\n").unwrap_err();
        assert!(e.to_string().contains("audit_days"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::parse("[window]\nsecnds = 5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("secnds"), "{e}");
        let e = Config::parse("[wndow]\n").unwrap_err().to_string();
        assert!(e.contains("wndow"), "{e}");
    }

    #[test]
    fn bad_values_are_rejected_with_the_key() {
        for (text, want) in [
            ("[window]\nseconds = 0", "[window] seconds"),
            ("[window]\nout_of_order = \"drop\"", "drop"),
            ("[feed]\nagency = \"agency\"", "[feed] agency"),
            ("[commit]\nmax_batch = 0", "max_batch"),
            ("[feed]\nepoch = \"/sequence\"", "both point at"),
            ("[feed]\ndigest_ignore = [\"\"]", "whole message"),
        ] {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn endless_or_huge_files_are_refused_not_read_to_the_end() {
        let e = Config::load(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("longer than 1048576 bytes"), "{e}");
        let text = "[mqtt]\nbrokers = [\"mqtt://h\"]\nclient_id = \"x\"\ntopics = [\"t\"]\n\
                    username = \"u\"\npassword_file = \"/dev/zero\"";
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(
            e.contains("password_file /dev/zero: longer than 4096 bytes"),
            "{e}"
        );
    }

    #[test]
    fn full_config_parses() {
        let c = Config::parse(
            r#"
            [store]
            path = "/var/lib/replay-guard/db.redb"
            cache_mb = 32
            [window]
            seconds = 60
            max_entries = 10
            out_of_order = "quarantine"
            [feed]
            agency = "/hdr/agency"
            digest_ignore = ["/sent_at"]
            max_payload_bytes = 1024
            max_depth = 8
            [commit]
            max_batch = 64
            "#,
        )
        .unwrap();
        assert_eq!(c.store.out_of_order, OutOfOrder::Quarantine);
        assert_eq!(c.feed.digest_ignore.len(), 1);
        assert_eq!(c.store.cache_bytes, 32 * 1024 * 1024);
    }

    #[test]
    fn repeated_or_nested_digest_ignore_pointers_are_refused_naming_both() {
        for (list, a, b) in [
            ("[\"/list/0\", \"/list/0\"]", "/list/0", "/list/0"),
            ("[\"/a\", \"/x\", \"/a/b\"]", "/a", "/a/b"),
            ("[\"/a/b/0\", \"/a/b\"]", "/a/b/0", "/a/b"),
            ("[\"/m~1n\", \"/m~1n/x\"]", "/m~1n", "/m~1n/x"),
        ] {
            let e = Config::parse(&format!("[feed]\ndigest_ignore = {list}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("{a:?} and {b:?} overlap")),
                "{list}: {e}"
            );
        }
        // Distinct siblings, and "/list/00" (an object member, never array item 0), are fine.
        for ok in [
            "[\"/list/0\", \"/list/1\"]",
            "[\"/a\", \"/ab\"]",
            "[\"/list/0\", \"/list/00\"]",
        ] {
            let c = Config::parse(&format!("[feed]\ndigest_ignore = {ok}\n")).unwrap();
            assert_eq!(c.feed.digest_ignore.len(), 2, "{ok}");
        }
    }
}
