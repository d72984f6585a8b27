//! The validated configuration: a TOML file (unknown keys are errors) plus command-line
//! overrides. Everything else receives these typed values, never raw TOML.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::decide::OutOfOrder;
use crate::json::Pointer;
use crate::store::{
    DEFAULT_CACHE_BYTES, LogRetention, RetentionPolicy, StoreOptions, WindowPolicy,
};
use crate::wire::{DEFAULT_MAX_DEPTH, DEFAULT_MAX_PAYLOAD_BYTES, FeedContract};

mod sinks;
pub use sinks::{
    ExecSink, HttpSink, HttpUrl, MqttSink, OnPoison, PostgresSink, RelayConfig, SinkConfig,
    SinkKind, Start, TOPIC_PLACEHOLDERS, sink_name_problem, sql_name_problem,
};

/// Largest accepted `[commit] max_batch`.
pub const MAX_BATCH_LIMIT: usize = 65_535;
pub const DEFAULT_MAX_BATCH: usize = 1000;
/// How long a batch waits for more messages after its first one before it commits anyway.
pub const DEFAULT_LINGER_MS: u64 = 10;

// The allowed range of every numeric key, checked in `Config::from_raw`, which every command
// (`check-config`, `run`, `ingest`, ...) goes through: nothing validates later, so a value
// `check-config` accepts can never panic or misbehave in `run`. README "Configuration" lists
// the same ranges.
type Range = std::ops::RangeInclusive<u64>;
pub const CACHE_MB: Range = 1..=65_536;
/// 365 days.
pub const WINDOW_SECONDS: Range = 1..=31_536_000;
pub const WINDOW_MAX_ENTRIES: Range = 1..=1_000_000_000;
/// 64 MiB: far above any incident update; payloads are parsed whole in memory.
pub const MAX_PAYLOAD_BYTES: Range = 1..=67_108_864;
pub const MAX_DEPTH: Range = 1..=crate::wire::STORED_MAX_DEPTH as u64;
pub const MAX_BATCH: Range = 1..=MAX_BATCH_LIMIT as u64;
pub const LINGER_MS: Range = 0..=60_000;
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
/// MQTT strings (topic filters) are at most 65,535 bytes.
pub const MAX_TOPIC_FILTER_BYTES: usize = 65_535;

/// `key = value` within `range`, or a one-line error naming the key and the allowed range.
fn in_range(key: &str, value: u64, range: Range) -> Result<(), ConfigError> {
    if range.contains(&value) {
        return Ok(());
    }
    Err(ConfigError::Invalid(format!(
        "{key} = {value} is out of range: allowed {}..={}",
        range.start(),
        range.end()
    )))
}

/// Why a `[mqtt] topics` entry cannot be subscribed to (MQTT 3.1.1 and 5, section 4.7).
pub fn topic_filter_problem(filter: &str) -> Option<String> {
    if filter.is_empty() {
        return Some("is empty".into());
    }
    if filter.len() > MAX_TOPIC_FILTER_BYTES {
        return Some(format!(
            "is {} bytes long (MQTT allows {MAX_TOPIC_FILTER_BYTES})",
            filter.len()
        ));
    }
    if filter.contains('\0') {
        return Some("contains NUL".into());
    }
    if filter.chars().any(char::is_control) {
        return Some("contains a control character (brokers may close the connection)".into());
    }
    if filter.starts_with("$share/") {
        return Some(
            "is a shared subscription: give the plain filter and [mqtt] share_group (with \
             [store] backend = \"postgres\", so every member of the group decides against \
             one window)"
                .into(),
        );
    }
    let levels: Vec<&str> = filter.split('/').collect();
    for (i, level) in levels.iter().enumerate() {
        if level.contains('#') && (*level != "#" || i + 1 != levels.len()) {
            return Some("has '#' that is not the whole last level".into());
        }
        if level.contains('+') && *level != "+" {
            return Some("has '+' that is not a whole level".into());
        }
    }
    None
}

/// Replaces whatever precedes an '@' in a URL-like value (`"mqtt://user:pass@host"`,
/// `"user:pass@host"`) with `<redacted>`, keeping any `scheme://`: a TOML error echoes the
/// offending line and value, and must never echo a password. The hidden part reaches back to
/// the nearest `://`, else to the nearest quote or backtick (a password may hold spaces,
/// commas or quotes); hiding too much is harmless, too little is not.
fn redact_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('@') {
        let before = &rest[..at];
        let start = match before.rfind("://") {
            Some(i) => i + 3,
            None => before.rfind(['"', '\'', '`']).map_or(0, |i| i + 1),
        };
        out.push_str(&before[..start]);
        out.push_str("<redacted>@");
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
    out
}

/// What stands for a URL's query (and fragment) wherever a URL is shown.
pub const REDACTED_QUERY: &str = "<redacted>";

/// `text` with the query of every URL in it hidden: in each stretch of `text` between quotes
/// or backticks (or line ends) that holds a `://`, everything after the first `?` or `#`
/// that follows the `://` becomes `<redacted>`; scheme, host, port and path stay. A URL's
/// query may carry a token (`?api_key=...`), and a URL reaches log lines, `relay status`,
/// a sink's stored error and config errors. Hiding too much is harmless, too little is not.
/// `HttpUrl` never holds its query in the clear (`HttpUrl::query`); this is for raw text: a
/// URL as typed, a TOML error quoting a line.
pub fn redact_query(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    loop {
        let (stretch, sep) = match rest.find(['"', '\'', '`', '\n']) {
            Some(i) => (&rest[..i], Some(&rest[i..i + 1])),
            None => (rest, None),
        };
        let keep = stretch
            .find("://")
            .and_then(|s| stretch[s + 3..].find(['?', '#']).map(|q| s + 3 + q + 1));
        match keep {
            Some(k) if k < stretch.len() => {
                out.push_str(&stretch[..k]);
                out.push_str(REDACTED_QUERY);
            }
            _ => out.push_str(stretch),
        }
        match sep {
            Some(sep) => {
                out.push_str(sep);
                rest = &rest[stretch.len() + 1..];
            }
            None => return out,
        }
    }
}

/// A broker URL for an error message: everything between the scheme and the last '@' hidden.
fn redact_url(url: &str) -> String {
    match url.rfind('@') {
        None => url.to_string(),
        Some(at) => {
            let keep = url[..at].find("://").map_or(0, |i| i + 3);
            format!("{}<redacted>@{}", &url[..keep], &url[at + 1..])
        }
    }
}

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

/// A TOML error as one line: where it is, the offending line, and the message, with any URL
/// user info and query redacted (both can quote a broker or sink URL).
fn one_line(e: &toml::de::Error, text: &str) -> String {
    let message = e.message().trim().replace('\n', " ");
    let line = redact_userinfo(&match e.span() {
        None => message,
        Some(span) => {
            let start = span.start.min(text.len());
            let line_no = text.get(..start).unwrap_or(text).matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            format!("line {line_no} `{}`: {message}", redact_secret_line(line))
        }
    });
    redact_query(&line)
}

/// A config line whose key names a secret (`password = "…"` typed where `password_file`
/// belongs) is quoted by its key alone.
fn redact_secret_line(line: &str) -> String {
    let key = line.split('=').next().unwrap_or(line).trim();
    let lower = key.to_ascii_lowercase();
    let secret = ["password", "passwd", "secret", "token", "authorization"]
        .iter()
        .any(|w| lower.contains(w));
    if secret && line.contains('=') && !lower.ends_with("_file") {
        format!("{key} = <redacted>")
    } else {
        line.to_string()
    }
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, default)]
struct RawConfig {
    store: RawStore,
    window: RawWindow,
    feed: RawFeed,
    commit: RawCommit,
    retention: RawRetention,
    mqtt: Option<RawMqtt>,
    service: RawService,
    metrics: Option<RawMetrics>,
    relay: sinks::RawRelay,
    sink: Vec<sinks::RawSink>,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
enum RawProtocol {
    #[default]
    #[serde(rename = "v5")]
    V5,
    #[serde(rename = "v3.1.1")]
    V311,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
struct RawMqtt {
    brokers: Vec<String>,
    client_id: String,
    topics: Vec<String>,
    share_group: Option<String>,
    protocol: RawProtocol,
    session_expiry_seconds: u32,
    receive_maximum: u16,
    keep_alive_seconds: u64,
    username: Option<String>,
    password_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    client_cert_file: Option<PathBuf>,
    client_key_file: Option<PathBuf>,
    retries_per_broker: u32,
    backoff_initial_ms: u64,
    backoff_max_ms: u64,
}
impl Default for RawMqtt {
    fn default() -> Self {
        RawMqtt {
            brokers: Vec::new(),
            client_id: String::new(),
            topics: Vec::new(),
            share_group: None,
            protocol: RawProtocol::V5,
            session_expiry_seconds: 86_400,
            receive_maximum: 1000,
            keep_alive_seconds: 30,
            username: None,
            password_file: None,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
            retries_per_broker: 3,
            backoff_initial_ms: 200,
            backoff_max_ms: 5_000,
        }
    }
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
struct RawService {
    shutdown_timeout_seconds: u64,
}
impl Default for RawService {
    fn default() -> Self {
        RawService {
            shutdown_timeout_seconds: 10,
        }
    }
}

/// `[metrics]`: present turns the endpoint on (unless `enabled = false`).
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
struct RawMetrics {
    enabled: bool,
    listen: String,
}
impl Default for RawMetrics {
    fn default() -> Self {
        RawMetrics {
            enabled: true,
            listen: DEFAULT_METRICS_LISTEN.into(),
        }
    }
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

/// MQTT protocol version spoken to the brokers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    V5,
    V311,
}

/// As the config writes it (`protocol = "v5"`).
impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::V5 => "v5",
            Protocol::V311 => "v3.1.1",
        })
    }
}

/// One broker address from `[mqtt] brokers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for BrokerUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.tls { "mqtts" } else { "mqtt" };
        if self.host.contains(':') {
            write!(f, "{scheme}://[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{scheme}://{}:{}", self.host, self.port)
        }
    }
}

impl BrokerUrl {
    /// `mqtt://host[:port]` or `mqtts://host[:port]` (IPv6 hosts in brackets). User info
    /// (`user:pass@`) is refused without being echoed: it would be printed in every log line
    /// naming the broker, and resolved as part of the host name.
    pub fn parse(s: &str) -> Result<BrokerUrl, String> {
        if s.contains('@') {
            return Err(format!(
                "broker {:?}: a user name or password in the URL is not accepted (it would be \
                 logged); use [mqtt] username and password_file",
                redact_url(s)
            ));
        }
        let (tls, rest) = if let Some(r) = s.strip_prefix("mqtts://") {
            (true, r)
        } else if let Some(r) = s.strip_prefix("mqtt://") {
            (false, r)
        } else {
            return Err(format!("broker {s:?} must start with mqtt:// or mqtts://"));
        };
        let default_port = if tls { 8883 } else { 1883 };
        let (host, port) = if let Some(r) = rest.strip_prefix('[') {
            let (h, after) = r
                .split_once(']')
                .ok_or_else(|| format!("broker {s:?}: unclosed '['"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err(format!("broker {s:?}: unexpected {after:?} after the host")),
            };
            (h.to_string(), port)
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (rest.to_string(), None),
            }
        };
        if host.is_empty() || host.contains('/') {
            return Err(format!("broker {s:?}: no host, or a path after it"));
        }
        let port = match port {
            None => default_port,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| format!("broker {s:?}: bad port {p:?}"))?,
        };
        Ok(BrokerUrl { tls, host, port })
    }
}

/// TLS material for `mqtts://` brokers. Certificate verification is always on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: PathBuf,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
}

/// A secret that never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);
impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}
impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The validated `[mqtt]` section.
#[derive(Debug, Clone)]
pub struct MqttConfig {
    pub brokers: Vec<BrokerUrl>,
    pub client_id: String,
    pub topics: Vec<String>,
    pub protocol: Protocol,
    pub session_expiry_seconds: u32,
    pub receive_maximum: u16,
    pub keep_alive: std::time::Duration,
    pub credentials: Option<(String, Secret)>,
    pub tls: Option<TlsFiles>,
    pub retries_per_broker: u32,
    pub backoff_initial: std::time::Duration,
    pub backoff_max: std::time::Duration,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
struct RawStore {
    backend: RawBackend,
    path: Option<PathBuf>,
    cache_mb: u64,
    dsn: Option<String>,
    dsn_file: Option<PathBuf>,
    schema: Option<String>,
    statement_timeout_ms: Option<u64>,
}
impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            backend: RawBackend::Redb,
            path: None,
            cache_mb: (DEFAULT_CACHE_BYTES / (1024 * 1024)) as u64,
            dsn: None,
            dsn_file: None,
            schema: None,
            statement_timeout_ms: None,
        }
    }
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
enum RawBackend {
    #[default]
    Redb,
    Postgres,
}

/// Where the store lives: `[store] backend`.
#[derive(Debug, Clone)]
pub enum StoreBackend {
    /// One redb file (`[store] path` or `--db`).
    Redb,
    /// A PostgreSQL schema that several members may share.
    Postgres(PostgresStore),
}

/// `[store] backend = "postgres"`: the server and the schema.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    /// From `dsn` or `dsn_file`; never printed.
    pub dsn: Secret,
    pub schema: String,
    /// `statement_timeout_ms`: how long any one round trip to the server may take before
    /// the connection counts as lost.
    pub statement_timeout: std::time::Duration,
}

/// Where the store is, as `Config::location` found it.
#[derive(Debug, Clone, Copy)]
pub enum StoreLocation<'a> {
    File(&'a Path),
    Postgres(&'a PostgresStore),
}

impl PostgresStore {
    /// The connection settings (parsed when the config was validated).
    pub fn pg_config(&self) -> Result<crate::store::postgres::PgConfig, ConfigError> {
        crate::store::postgres::PgConfig::parse(self.dsn.expose(), &self.schema)
            .map(|c| c.with_statement_timeout(self.statement_timeout))
            .map_err(ConfigError::Invalid)
    }
}

/// The schema name when `[store] schema` is not given.
pub const DEFAULT_PG_SCHEMA: &str = "replay_guard";

/// Validates `[store]`'s backend keys.
fn store_backend(raw: &RawStore) -> Result<StoreBackend, ConfigError> {
    let invalid = |m: String| ConfigError::Invalid(format!("[store] {m}"));
    match raw.backend {
        RawBackend::Redb => {
            for (key, set) in [
                ("dsn", raw.dsn.is_some()),
                ("dsn_file", raw.dsn_file.is_some()),
                ("schema", raw.schema.is_some()),
                ("statement_timeout_ms", raw.statement_timeout_ms.is_some()),
            ] {
                if set {
                    return Err(invalid(format!(
                        "{key} belongs to backend = \"postgres\" (this store is a redb file)"
                    )));
                }
            }
            Ok(StoreBackend::Redb)
        }
        RawBackend::Postgres => {
            if raw.path.is_some() {
                return Err(invalid(
                    "path belongs to backend = \"redb\": a postgres store has dsn (or \
                     dsn_file) and schema"
                        .into(),
                ));
            }
            let dsn = match (&raw.dsn, &raw.dsn_file) {
                (Some(d), None) => d.clone(),
                (None, Some(p)) => read_bounded(p, sinks::MAX_DSN_BYTES)
                    .map_err(|e| invalid(format!("dsn_file {}: {e}", p.display())))?
                    .trim()
                    .to_string(),
                _ => {
                    return Err(invalid(
                        "backend = \"postgres\" needs exactly one of dsn and dsn_file (a dsn \
                         with a password belongs in dsn_file)"
                            .into(),
                    ));
                }
            };
            if dsn.is_empty() {
                return Err(invalid("the dsn is empty".into()));
            }
            let schema = raw
                .schema
                .clone()
                .unwrap_or_else(|| DEFAULT_PG_SCHEMA.into());
            if let Some(why) = crate::store::postgres::schema::schema_name_problem(&schema) {
                return Err(invalid(format!("schema {schema:?} {why}")));
            }
            crate::store::postgres::PgConfig::parse(&dsn, &schema).map_err(invalid)?;
            let timeout = crate::store::postgres::DEFAULT_STATEMENT_TIMEOUT;
            let timeout_ms = raw
                .statement_timeout_ms
                .unwrap_or(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
            in_range(
                "[store] statement_timeout_ms",
                timeout_ms,
                STATEMENT_TIMEOUT_MS,
            )?;
            Ok(StoreBackend::Postgres(PostgresStore {
                dsn: Secret(dsn),
                schema,
                statement_timeout: std::time::Duration::from_millis(timeout_ms),
            }))
        }
    }
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
enum RawOutOfOrder {
    #[default]
    Apply,
    Quarantine,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
struct RawWindow {
    seconds: u64,
    max_entries: u64,
    out_of_order: RawOutOfOrder,
}
impl Default for RawWindow {
    fn default() -> Self {
        let w = WindowPolicy::default();
        RawWindow {
            seconds: w.seconds,
            max_entries: w.max_entries,
            out_of_order: RawOutOfOrder::Apply,
        }
    }
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
struct RawFeed {
    agency: String,
    source_id: String,
    sequence: String,
    epoch: String,
    digest_ignore: Vec<String>,
    max_payload_bytes: usize,
    max_depth: usize,
}
impl Default for RawFeed {
    fn default() -> Self {
        RawFeed {
            agency: "/agency".into(),
            source_id: "/source_id".into(),
            sequence: "/sequence".into(),
            epoch: "/epoch".into(),
            digest_ignore: Vec::new(),
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
struct RawCommit {
    max_batch: usize,
    linger_ms: u64,
}
impl Default for RawCommit {
    fn default() -> Self {
        RawCommit {
            max_batch: DEFAULT_MAX_BATCH,
            linger_ms: DEFAULT_LINGER_MS,
        }
    }
}

/// `[retention]`: per log, an age in days and an entry count; 0 turns that bound off.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
struct RawRetention {
    audit_max_age_days: u64,
    audit_max_entries: u64,
    effects_max_age_days: u64,
    effects_max_entries: u64,
    quarantine_max_age_days: u64,
    quarantine_max_entries: u64,
}
impl Default for RawRetention {
    fn default() -> Self {
        RawRetention {
            audit_max_age_days: DEFAULT_AUDIT_MAX_AGE_DAYS,
            audit_max_entries: DEFAULT_AUDIT_MAX_ENTRIES,
            effects_max_age_days: DEFAULT_EFFECTS_MAX_AGE_DAYS,
            effects_max_entries: DEFAULT_EFFECTS_MAX_ENTRIES,
            quarantine_max_age_days: DEFAULT_QUARANTINE_MAX_AGE_DAYS,
            quarantine_max_entries: DEFAULT_QUARANTINE_MAX_ENTRIES,
        }
    }
}

/// Retention defaults: sized in the README from the measured bytes per entry so that a busy
/// edge host's file stays bounded whatever the feed rate.
pub const DEFAULT_AUDIT_MAX_AGE_DAYS: u64 = 400;
pub const DEFAULT_AUDIT_MAX_ENTRIES: u64 = 20_000_000;
pub const DEFAULT_EFFECTS_MAX_AGE_DAYS: u64 = 30;
pub const DEFAULT_EFFECTS_MAX_ENTRIES: u64 = 5_000_000;
pub const DEFAULT_QUARANTINE_MAX_AGE_DAYS: u64 = 400;
pub const DEFAULT_QUARANTINE_MAX_ENTRIES: u64 = 1_000_000;

fn log_retention(days: u64, entries: u64) -> LogRetention {
    LogRetention {
        max_age_seconds: (days > 0).then(|| days.saturating_mul(86_400)),
        max_entries: (entries > 0).then_some(entries),
    }
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

/// Largest config file read: far above any real one, and it bounds `--config /dev/zero`.
const MAX_CONFIG_BYTES: u64 = 1024 * 1024;
/// Largest password file read (`password_file = "/dev/zero"` must not grow memory).
const MAX_PASSWORD_BYTES: u64 = 4096;

/// Reads a UTF-8 text file of at most `limit` bytes; a longer one (or an endless device) is an
/// error rather than an unbounded read.
fn read_bounded(path: &Path, limit: u64) -> std::io::Result<String> {
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

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
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
            message: one_line(&e, text),
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
        let numbers: [(&str, u64, Range); 14] = [
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
        let backend = store_backend(&raw.store)?;
        let shared = raw.mqtt.as_ref().is_some_and(|m| m.share_group.is_some());
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
            mqtt: raw.mqtt.map(mqtt_from_raw).transpose()?,
            shutdown_timeout: std::time::Duration::from_secs(raw.service.shutdown_timeout_seconds),
        })
    }
}

/// The TLS files of an MQTT connection (`[mqtt]` or an mqtt `[[sink]]`); `tls_wanted`: an
/// `mqtts://` broker, which needs `ca_file`. The client is built here as the connection
/// builds it (`crate::tls::verifying_client`), so an unreadable or empty CA file, and a
/// client key that is not the certificate's, are refused when the config loads.
fn tls_files(
    ca: Option<&PathBuf>,
    cert: Option<&PathBuf>,
    key: Option<&PathBuf>,
    tls_wanted: bool,
) -> Result<Option<TlsFiles>, String> {
    let Some(ca) = ca else {
        return if tls_wanted {
            Err("an mqtts:// broker needs ca_file (certificates are always verified)".into())
        } else {
            Ok(None)
        };
    };
    let identity = match (cert, key) {
        (Some(c), Some(k)) => Some([
            (c.as_path(), "client_cert_file"),
            (k.as_path(), "client_key_file"),
        ]),
        (None, None) => None,
        _ => return Err("client_cert_file and client_key_file go together".into()),
    };
    crate::tls::verifying_client((ca, "ca_file"), identity)?;
    Ok(Some(TlsFiles {
        ca_file: ca.clone(),
        client_cert_file: cert.cloned(),
        client_key_file: key.cloned(),
    }))
}

fn mqtt_from_raw(m: RawMqtt) -> Result<MqttConfig, ConfigError> {
    let invalid = |m: String| ConfigError::Invalid(format!("[mqtt] {m}"));
    if m.brokers.is_empty() {
        return Err(invalid(
            "brokers: give at least one, e.g. [\"mqtt://127.0.0.1:1883\"]".into(),
        ));
    }
    let brokers = m
        .brokers
        .iter()
        .map(|b| BrokerUrl::parse(b))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("brokers: {e}")))?;
    if m.client_id.is_empty() || m.client_id.len() > 256 {
        return Err(invalid(
            "client_id is required (1 to 256 bytes): a fixed id keeps the broker session".into(),
        ));
    }
    if m.topics.is_empty() {
        return Err(invalid("topics: give at least one topic filter".into()));
    }
    for t in &m.topics {
        if let Some(why) = topic_filter_problem(t) {
            // Quote at most 64 characters: a filter can be 64 KiB long.
            let shown: String = t.chars().take(64).collect();
            return Err(invalid(format!(
                "topics: {shown:?}{} {why}",
                if shown.len() < t.len() { "..." } else { "" }
            )));
        }
    }
    let topics = match &m.share_group {
        None => m.topics.clone(),
        Some(g) => {
            if g.is_empty() || g.len() > 256 || g.contains(['/', '+', '#', '\0']) {
                return Err(invalid(format!(
                    "share_group {g:?}: give 1 to 256 bytes without '/', '+', '#' (it becomes \
                     $share/{{share_group}}/FILTER)"
                )));
            }
            if let Some(t) = m.topics.iter().find(|t| t.starts_with("$share/")) {
                return Err(invalid(format!(
                    "topics: {t:?} is already a shared subscription; with share_group give \
                     the plain filters"
                )));
            }
            m.topics.iter().map(|t| format!("$share/{g}/{t}")).collect()
        }
    };
    for (key, value, range) in [
        (
            "session_expiry_seconds",
            u64::from(m.session_expiry_seconds),
            SESSION_EXPIRY_SECONDS,
        ),
        (
            "receive_maximum",
            u64::from(m.receive_maximum),
            RECEIVE_MAXIMUM,
        ),
        (
            "keep_alive_seconds",
            m.keep_alive_seconds,
            KEEP_ALIVE_SECONDS,
        ),
        (
            "retries_per_broker",
            u64::from(m.retries_per_broker),
            RETRIES_PER_BROKER,
        ),
        (
            "backoff_initial_ms",
            m.backoff_initial_ms,
            BACKOFF_INITIAL_MS,
        ),
        (
            "backoff_max_ms",
            m.backoff_max_ms,
            m.backoff_initial_ms..=BACKOFF_MAX_MS,
        ),
    ] {
        in_range(&format!("[mqtt] {key}"), value, range)?;
    }
    if m.username.is_some() && brokers.iter().any(|b| b.tls) && brokers.iter().any(|b| !b.tls) {
        return Err(invalid(
            "brokers mix mqtts:// and mqtt:// while a username is set: a failover would send the \
             password in clear; use mqtts:// for all of them"
                .into(),
        ));
    }
    let tls = tls_files(
        m.ca_file.as_ref(),
        m.client_cert_file.as_ref(),
        m.client_key_file.as_ref(),
        brokers.iter().any(|b| b.tls),
    )
    .map_err(invalid)?;
    let credentials = match &m.username {
        None => None,
        Some(user) => {
            let from_systemd = std::env::var_os("CREDENTIALS_DIRECTORY")
                .map(|d| PathBuf::from(d).join("mqtt-password"));
            let path = m.password_file.clone().or(from_systemd.filter(|p| p.exists())).ok_or_else(|| {
                invalid("username is set but there is no password_file nor $CREDENTIALS_DIRECTORY/mqtt-password".into())
            })?;
            let text = read_bounded(&path, MAX_PASSWORD_BYTES)
                .map_err(|e| invalid(format!("password_file {}: {e}", path.display())))?;
            Some((
                user.clone(),
                Secret(text.trim_end_matches(['\r', '\n']).to_string()),
            ))
        }
    };
    Ok(MqttConfig {
        brokers,
        client_id: m.client_id,
        topics,
        protocol: match m.protocol {
            RawProtocol::V5 => Protocol::V5,
            RawProtocol::V311 => Protocol::V311,
        },
        session_expiry_seconds: m.session_expiry_seconds,
        receive_maximum: m.receive_maximum,
        keep_alive: std::time::Duration::from_secs(m.keep_alive_seconds),
        credentials,
        tls,
        retries_per_broker: m.retries_per_broker,
        backoff_initial: std::time::Duration::from_millis(m.backoff_initial_ms),
        backoff_max: std::time::Duration::from_millis(m.backoff_max_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_postgres_backend_is_validated_and_its_dsn_never_echoed() {
        let c = Config::parse(
            "[store]\nbackend = \"postgres\"\ndsn = \"host=db.eoc user=rg password=hunter2\"\n",
        )
        .unwrap();
        let StoreBackend::Postgres(pg) = &c.backend else {
            panic!("postgres expected")
        };
        assert_eq!(pg.schema, DEFAULT_PG_SCHEMA);
        assert_eq!(pg.statement_timeout, std::time::Duration::from_secs(10));
        assert!(!format!("{c:?}").contains("hunter2"));
        let target = pg.pg_config().unwrap().target();
        assert_eq!(
            target,
            "postgresql db.eoc:5432/postgres schema replay_guard"
        );
        assert!(c.require_db().is_err(), "a postgres store has no file");
        for (text, want) in [
            ("backend = \"postgres\"", "exactly one of dsn and dsn_file"),
            (
                "backend = \"postgres\"\ndsn = \"host=h\"\npath = \"/x\"",
                "path belongs to backend = \"redb\"",
            ),
            ("dsn = \"host=h\"", "dsn belongs to backend = \"postgres\""),
            (
                "statement_timeout_ms = 500",
                "statement_timeout_ms belongs to backend = \"postgres\"",
            ),
            (
                "backend = \"postgres\"\ndsn = \"host=h\"\nschema = \"Drop Table\"",
                "lower-case SQL name",
            ),
            (
                "backend = \"postgres\"\ndsn = \"host=h\"\nschema = \"pg_x\"",
                "must not start with pg_",
            ),
            (
                "backend = \"postgres\"\ndsn = \"host=h password=hunter2 sslmode=verify-full\"",
                "sslmode=verify-full needs sslrootcert=FILE",
            ),
            (
                "backend = \"postgres\"\ndsn = \"host=h password=hunter2 sslmode=verify-ca \
                 sslrootcert=/nonexistent/ca.pem\"",
                "sslrootcert /nonexistent/ca.pem",
            ),
            (
                "backend = \"postgres\"\ndsn = \"postgres://u:hunter2@h:notaport/db\"",
                "dsn is not understood",
            ),
            ("backend = \"sqlite\"", "unknown variant"),
        ] {
            let e = Config::parse(&format!("[store]\n{text}\n"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        // The relay reads a PostgreSQL store too.
        let c = Config::parse(
            "[store]\nbackend = \"postgres\"\ndsn = \"host=h\"\n[[sink]]\nname = \"a\"\n\
             kind = \"exec\"\ncommand = [\"cat\"]\n",
        )
        .unwrap();
        assert_eq!(c.relay.sinks.len(), 1);
    }

    #[test]
    fn share_group_makes_every_filter_a_shared_subscription() {
        let e = Config::parse(
            "[mqtt]\nbrokers = [\"mqtt://127.0.0.1\"]\nclient_id = \"m1\"\ntopics = [\"t\"]\n\
             share_group = \"cop\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("share_group needs [store] backend"), "{e}");
        let base = "[store]\nbackend = \"postgres\"\ndsn = \"host=h\"\n\
                    [mqtt]\nbrokers = [\"mqtt://127.0.0.1\"]\nclient_id = \"m1\"\n";
        let c = Config::parse(&format!(
            "{base}topics = [\"incidents/#\", \"units/+\"]\nshare_group = \"cop\"\n"
        ))
        .unwrap();
        assert_eq!(
            c.mqtt.unwrap().topics,
            ["$share/cop/incidents/#", "$share/cop/units/+"]
        );
        for (group, want) in [("a/b", "without '/'"), ("", "1 to 256 bytes")] {
            let e = Config::parse(&format!(
                "{base}topics = [\"t\"]\nshare_group = \"{group}\"\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(e.contains(want), "{e}");
        }
        let e = Config::parse(&format!(
            "{base}topics = [\"$share/x/t\"]\nshare_group = \"g\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("is a shared subscription: give the plain filter"),
            "{e}"
        );
    }

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
    fn broker_urls_parse_or_say_why_not() {
        let b = BrokerUrl::parse("mqtt://127.0.0.1:1884").unwrap();
        assert_eq!((b.tls, b.host.as_str(), b.port), (false, "127.0.0.1", 1884));
        assert_eq!(BrokerUrl::parse("mqtts://broker.local").unwrap().port, 8883);
        assert_eq!(BrokerUrl::parse("mqtt://[::1]:1885").unwrap().host, "::1");
        assert_eq!(
            BrokerUrl::parse("mqtt://[::1]:1885").unwrap().to_string(),
            "mqtt://[::1]:1885"
        );
        for bad in [
            "tcp://x:1",
            "mqtt://:1883",
            "mqtt://h:0",
            "mqtt://h:99999",
            "mqtt://h/x",
        ] {
            assert!(BrokerUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn mqtt_section_is_validated() {
        let ok = "[mqtt]\nbrokers = [\"mqtt://127.0.0.1:1883\"]\nclient_id = \"rg\"\ntopics = [\"t/#\"]\n";
        let c = Config::parse(ok).unwrap();
        let m = c.mqtt.unwrap();
        assert_eq!(m.protocol, Protocol::V5);
        assert_eq!(m.receive_maximum, 1000);
        for (text, want) in [
            ("[mqtt]\nclient_id = \"rg\"\ntopics = [\"t\"]", "brokers"),
            (
                "[mqtt]\nbrokers = [\"mqtt://h\"]\ntopics = [\"t\"]",
                "client_id",
            ),
            (
                "[mqtt]\nbrokers = [\"mqtts://h\"]\nclient_id = \"x\"\ntopics = [\"t\"]",
                "ca_file",
            ),
            (
                "[mqtt]\nbrokers = [\"mqtt://h\"]\nclient_id = \"x\"\ntopics = [\"t\"]\nprotocol = \"v4\"",
                "v4",
            ),
            (
                "[mqtt]\nbrokers = [\"mqtt://h\"]\nclient_id = \"x\"\ntopics = [\"t\"]\nusername = \"u\"\npassword_file = \"/nonexistent\"",
                "password_file",
            ),
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
    fn a_secret_typed_inline_is_not_echoed_in_the_error() {
        let text = "[mqtt]\nbrokers = [\"mqtt://h\"]\nclient_id = \"x\"\ntopics = [\"t\"]\n\
                    password = \"hunter2\"\n";
        let e = Config::parse(text).unwrap_err().to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(
            e.contains("`password = <redacted>`") && e.contains("password"),
            "{e}"
        );
        // A file path is not a secret and is still quoted.
        let e = Config::parse("[mqtt]\npassword_file = 3\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("password_file = 3"), "{e}");
    }

    #[test]
    fn redact_query_hides_every_url_query_in_text_and_keeps_the_rest() {
        for (text, want) in [
            ("https://h:1/p?k=v", "https://h:1/p?<redacted>"),
            ("https://h/p#f", "https://h/p#<redacted>"),
            ("https://h/p", "https://h/p"),
            ("https://h/p?", "https://h/p?"),
            ("no url? here", "no url? here"),
            (
                "line 4 `url = \"http://h/?k=v w\" x`: expected newline",
                "line 4 `url = \"http://h/?<redacted>\" x`: expected newline",
            ),
            (
                "a \"http://h/?k\" and 'https://g/x?y' and `http://i?z`",
                "a \"http://h/?<redacted>\" and 'https://g/x?<redacted>' and `http://i?<redacted>`",
            ),
            // Unquoted, the rest of the line may be the query: it goes too.
            ("see http://h/?k=v w: more", "see http://h/?<redacted>"),
        ] {
            assert_eq!(redact_query(text), want, "{text}");
        }
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret("hunter2".into());
        assert!(!format!("{s:?}").contains("hunter2"));
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

    #[test]
    fn topic_filters_follow_the_mqtt_rules() {
        for ok in [
            "#",
            "+",
            "a/b",
            "a/+/c",
            "a/#",
            "+/+/#",
            "/",
            "a//b",
            "$SYS/#",
            "é/ü",
            "$shared/x",
        ] {
            assert_eq!(topic_filter_problem(ok), None, "{ok}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("a/#/b", "'#'"),
            ("#/a", "'#'"),
            ("a#", "'#'"),
            ("a/b#", "'#'"),
            ("a+", "'+'"),
            ("+a/b", "'+'"),
            ("a/+b/c", "'+'"),
            ("a\0b", "NUL"),
            ("a\u{7}b", "control"),
            ("$share/group/t", "shared subscription"),
        ] {
            let got = topic_filter_problem(bad).unwrap_or_default();
            assert!(got.contains(why), "{bad:?}: {got}");
        }
        let long = "x".repeat(MAX_TOPIC_FILTER_BYTES);
        assert_eq!(topic_filter_problem(&long), None);
        let longer = format!("{long}x");
        assert!(
            topic_filter_problem(&longer)
                .unwrap()
                .contains("65536 bytes")
        );
        let e = Config::parse(
            "[mqtt]\nbrokers = [\"mqtt://h\"]\nclient_id = \"c\"\ntopics = [\"ok\", \"a/#/b\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("[mqtt] topics: \"a/#/b\" has '#'"), "{e}");
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

    #[test]
    fn credentials_in_broker_urls_are_refused_and_never_echoed() {
        for url in [
            "mqtt://user:s3cret@h:1883",
            "mqtts://user:s3cret@[::1]",
            "mqtt://:s3cret@h",
            "tcp://user:s3cret@h",
            "user:s3cret@h",
            "mqtt://us@er:s3cret@h",
            "mqtt://user:s3cr/et@h",
            "mqtt://user:s3cr et@h",
            "mqtt://user:s3cr\"et@h",
        ] {
            let e = BrokerUrl::parse(url).unwrap_err();
            assert!(!e.contains("s3cr"), "{url}: {e}");
            assert!(e.contains("password_file"), "{url}: {e}");
            let e = Config::parse(&format!(
                "[mqtt]\nbrokers = [{url:?}]\nclient_id = \"c\"\ntopics = [\"t\"]\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(!e.contains("s3cr"), "{url}: {e}");
        }
        // TOML errors quote the line and the value: redacted too.
        for text in [
            "[mqtt]\nbrokers = \"mqtt://user:s3cret@h\"\n",
            "[mqtt]\nbrokers = [\"mqtt://user:s3cret@h\", 5]\n",
            "[mqtt]\nbrokers = [\"user:s3cret@h\"] x\n",
            "[mqtt]\nbrokers = [\"mqtt://user:s3c, ret@h\", 5]\n",
            "[mqtt]\nbrokers = [mqtt://user:s3cret@h]\n",
            "[mqtt]\nbrokers = 'mqtt://user:s3c\"ret@h'\n",
        ] {
            let e = Config::parse(text).unwrap_err().to_string();
            assert!(!e.contains("s3c"), "{text}: {e}");
        }
        assert_eq!(
            redact_userinfo("line 2 `brokers = [\"mqtt://u:p@h:1\", \"u2:p2@h2\"]`"),
            "line 2 `brokers = [\"mqtt://<redacted>@h:1\", \"<redacted>@h2\"]`"
        );
    }
}
