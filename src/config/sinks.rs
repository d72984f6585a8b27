//! `[relay]` and `[[sink]]`: where applied effects are delivered. Validated here,
//! with the rest of the file, so `check-config` refuses what the relay could not use.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use super::limits::{
    KEEP_ALIVE_SECONDS, MAX_AUTHORIZATION_BYTES, MAX_TEXT, SINK_BACKOFF_INITIAL_MS,
    SINK_BACKOFF_MAX_MS, SINK_BATCH_MAX, SINK_LINGER_MS, SINK_MAX_IN_FLIGHT, SINK_RELP_WINDOW,
    SINK_SETTLE_MS, SINK_TIMEOUT_MS, in_range, read_bounded,
};
use super::mqtt::{MqttConfig, Protocol, TlsFiles, read_password, tls_files};
use super::raw::RawProtocol;
use super::redact::Secret;
use super::topics::topic_template_problem;
use super::url::{BrokerUrl, HttpUrl, SyslogUrl};
use crate::model::Outcome;
use crate::store::tables::Stream;

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawRelay {
    source: Option<String>,
    sinks_from: Option<PathBuf>,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum RawKind {
    Mqtt,
    Http,
    Postgres,
    Exec,
    Syslog,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
enum RawPoison {
    #[default]
    Park,
    Block,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
enum RawStart {
    #[default]
    Beginning,
    Head,
}

/// One `[[sink]]` table as written. Kind-specific keys are optional here and checked against
/// the kind in `sink_from_raw`.
#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSink {
    name: String,
    kind: RawKind,
    #[serde(default)]
    on_poison: RawPoison,
    #[serde(default)]
    start: RawStart,
    stream: Option<String>,
    outcomes: Option<Vec<String>>,
    batch_max: Option<u64>,
    linger_ms: Option<u64>,
    max_in_flight: Option<u64>,
    backoff_initial_ms: Option<u64>,
    backoff_max_ms: Option<u64>,
    timeout_ms: Option<u64>,
    // mqtt
    broker: Option<String>,
    protocol: Option<RawProtocol>,
    client_id: Option<String>,
    topic: Option<String>,
    username: Option<String>,
    password_file: Option<PathBuf>,
    ca_file: Option<PathBuf>,
    client_cert_file: Option<PathBuf>,
    client_key_file: Option<PathBuf>,
    keep_alive_seconds: Option<u64>,
    // http, syslog
    url: Option<String>,
    // http
    authorization_file: Option<PathBuf>,
    // postgres
    dsn: Option<String>,
    dsn_file: Option<PathBuf>,
    table: Option<String>,
    // exec
    command: Option<Vec<String>>,
    // syslog
    hostname: Option<String>,
    facility: Option<String>,
    settle_ms: Option<u64>,
    sd_id: Option<String>,
    relp_window: Option<u64>,
}

/// The validated `[relay]` section and its sinks.
#[derive(Debug, Clone, Default)]
pub struct RelayConfig {
    /// The CloudEvents `source` attribute (a URI reference).
    pub source: String,
    /// The sinks this process delivers.
    pub sinks: Vec<SinkConfig>,
    /// `[relay] sinks_from`: the config of the relay unit that delivers the store's other
    /// sinks (as written; `Config::load` reads it relative to this config's directory).
    pub sinks_from: Option<PathBuf>,
    /// The sinks of `sinks_from`'s config: declared by this process (their cursors made
    /// before its first commit, so retention holds for them), never delivered by it.
    pub declared: Vec<SinkConfig>,
}

impl RelayConfig {
    /// A sink this config names: one it delivers, or one it declares for the relay unit.
    pub fn sink(&self, name: &str) -> Option<&SinkConfig> {
        self.sinks
            .iter()
            .chain(&self.declared)
            .find(|s| s.name == name)
    }

    /// Every sink this config names (delivered, then declared).
    pub fn named(&self) -> impl Iterator<Item = &SinkConfig> {
        self.sinks.iter().chain(&self.declared)
    }
}

/// What a sink does with an event its receiver refuses for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnPoison {
    /// Keep it (with the reason and the last response) and move on.
    Park,
    /// Stop the sink at it until an operator acts (`relay retry`).
    Block,
}

/// Where a sink that has no cursor yet starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// The oldest effect still in the log: every retained effect is delivered.
    Beginning,
    /// The next effect committed: what is already in the log is not delivered.
    Head,
}

/// One validated `[[sink]]`.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    pub name: String,
    pub on_poison: OnPoison,
    pub start: Start,
    /// The log the sink delivers (`stream`, default the effect log).
    pub stream: Stream,
    /// An audit sink's `outcomes`: the audit entries it delivers (`None`: every one).
    pub outcomes: Option<Vec<Outcome>>,
    /// Most events handed to the sink at once.
    pub batch_max: usize,
    /// How long a sink waits for a batch to fill after its first event.
    pub linger: Duration,
    /// Sources whose events may be in flight at once (1 = strict log order).
    pub max_in_flight: usize,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// One delivery attempt's limit.
    pub timeout: Duration,
    pub kind: SinkKind,
}

#[derive(Debug, Clone)]
pub enum SinkKind {
    Mqtt(MqttSink),
    Http(HttpSink),
    Postgres(PostgresSink),
    Exec(ExecSink),
    Syslog(SyslogSink),
}

impl SinkKind {
    pub fn name(&self) -> &'static str {
        match self {
            SinkKind::Mqtt(_) => "mqtt",
            SinkKind::Http(_) => "http",
            SinkKind::Postgres(_) => "postgres",
            SinkKind::Exec(_) => "exec",
            SinkKind::Syslog(_) => "syslog",
        }
    }
}

#[derive(Debug, Clone)]
pub struct MqttSink {
    pub broker: BrokerUrl,
    pub protocol: Protocol,
    pub client_id: String,
    /// Template: `{agency}`, `{source_id}` and `{topic}` are replaced.
    pub topic: String,
    pub credentials: Option<(String, Secret)>,
    pub tls: Option<TlsFiles>,
    pub keep_alive: Duration,
}

#[derive(Debug, Clone)]
pub struct HttpSink {
    pub url: HttpUrl,
    /// CA certificates for `https://`; `None`: the operating system's trust store.
    /// Verification is always on.
    pub ca_file: Option<PathBuf>,
    /// `client_cert_file` and `client_key_file` for mutual TLS (`https://` only), checked to
    /// be a pair when the config was loaded.
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// The whole `Authorization` header value sent with every request (`authorization_file`,
    /// or systemd's credential `NAME-authorization`); never printed.
    pub authorization: Option<Secret>,
}

#[derive(Debug, Clone)]
pub struct PostgresSink {
    /// libpq-style connection string or URL; may hold a password, so it never prints.
    pub dsn: Secret,
    /// Table name, optionally schema-qualified, as a validated SQL identifier (unquoted,
    /// lower case).
    pub table: String,
}

/// A `syslog` sink: RFC 5424 messages over TCP (RFC 6587 octet counting) or TLS (RFC 5425),
/// or as RELP `syslog` commands (`relp://`, `relp+tls://`).
#[derive(Debug, Clone)]
pub struct SyslogSink {
    pub url: SyslogUrl,
    /// `ca_file` (required for `tls://` and `relp+tls://`) and an optional client
    /// certificate, checked to be usable (and a pair) when the config was loaded.
    pub tls: Option<TlsFiles>,
    /// The HOSTNAME field; `None`: the host's name, read when the sink is made.
    pub hostname: Option<String>,
    /// The facility code (0..=23) of every message's PRI.
    pub facility: u8,
    /// How long a new `tcp://` or `tls://` connection must stay open after the receiver's
    /// TCP acknowledged its first batch before that batch counts as delivered.
    pub settle: Duration,
    /// RELP: how many `syslog` commands may await their `rsp` at once (default 128,
    /// librelp's own window).
    pub relp_window: usize,
    /// The structured data element's SD-ID, `NAME@PEN` (default `decision@32473`).
    pub sd_id: String,
}

/// The facility names `facility` takes (RFC 5424 table 1, as syslog daemons spell them) and
/// their codes; `local0` is the default.
const SYSLOG_FACILITIES: [(&str, u8); 20] = [
    ("kern", 0),
    ("user", 1),
    ("mail", 2),
    ("daemon", 3),
    ("auth", 4),
    ("syslog", 5),
    ("lpr", 6),
    ("news", 7),
    ("uucp", 8),
    ("cron", 9),
    ("authpriv", 10),
    ("ftp", 11),
    ("local0", 16),
    ("local1", 17),
    ("local2", 18),
    ("local3", 19),
    ("local4", 20),
    ("local5", 21),
    ("local6", 22),
    ("local7", 23),
];

#[derive(Debug, Clone)]
pub struct ExecSink {
    /// argv: program and arguments; no shell.
    pub command: Vec<String>,
}

impl ExecSink {
    /// Why the program could not be started, if so: a name with a `/` that is not an
    /// executable file, or a bare name in no directory of `search_path` (the `PATH` the relay
    /// inherits). `check-config` asks; `run` finds out at the first delivery.
    pub fn program_problem(&self, search_path: Option<&std::ffi::OsStr>) -> Option<String> {
        let program = &self.command[0];
        if program.contains('/') {
            return executable(Path::new(program))
                .err()
                .map(|why| format!("program {program:?} {why}"));
        }
        let dirs: Vec<PathBuf> = search_path
            .map(|p| std::env::split_paths(p).collect())
            .unwrap_or_default();
        if dirs.iter().any(|d| executable(&d.join(program)).is_ok()) {
            return None;
        }
        Some(format!(
            "program {program:?} is not an executable file in any directory of PATH ({})",
            std::env::join_paths(&dirs)
                .map_or_else(|_| "unset".into(), |p| p.to_string_lossy().into_owned())
        ))
    }
}

fn executable(path: &Path) -> Result<(), &'static str> {
    use std::os::unix::fs::PermissionsExt as _;
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            Err("cannot be reached (permission denied)")
        }
        Err(_) => Err("does not exist"),
        Ok(m) if !m.is_file() => Err("is not a file"),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Err("is not executable"),
        Ok(_) => Ok(()),
    }
}

/// The default CloudEvents `source` when `[relay] source` is not set.
pub fn default_source(client_id: Option<&str>) -> String {
    format!("urn:replay-guard:{}", client_id.unwrap_or("ingest"))
}

pub(super) fn relay_from_raw(
    relay: RawRelay,
    sinks: Vec<RawSink>,
    client_id: Option<&str>,
) -> Result<RelayConfig, ConfigError> {
    let source = match relay.source {
        Some(s) => {
            if s.is_empty()
                || s.len() > MAX_TEXT
                || s.chars().any(|c| c.is_control() || c.is_whitespace())
            {
                return Err(ConfigError::Invalid(
                    "[relay] source must be a non-empty URI reference without spaces or \
                     control characters (e.g. \"urn:replay-guard:eoc-1\")"
                        .into(),
                ));
            }
            s
        }
        None => default_source(client_id),
    };
    let mut out = Vec::with_capacity(sinks.len());
    for raw in sinks {
        let sink = sink_from_raw(raw)?;
        if out.iter().any(|s: &SinkConfig| s.name == sink.name) {
            return Err(ConfigError::Invalid(format!(
                "[[sink]] name {:?} is used twice: each sink keeps its own cursor under its name",
                sink.name
            )));
        }
        out.push(sink);
    }
    let mut ids: Vec<(&str, &str)> = out
        .iter()
        .filter_map(|s| match &s.kind {
            SinkKind::Mqtt(m) => Some((m.client_id.as_str(), s.name.as_str())),
            _ => None,
        })
        .collect();
    ids.sort();
    if let Some(w) = ids.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ConfigError::Invalid(format!(
            "[[sink]] {:?} and {:?} use the same client_id {:?}: a broker disconnects one when \
             the other connects",
            w[0].1, w[1].1, w[0].0
        )));
    }
    if let Some(p) = &relay.sinks_from
        && p.as_os_str().is_empty()
    {
        return Err(ConfigError::Invalid(
            "[relay] sinks_from is empty: give the relay unit's config, e.g. \
             \"/etc/replay-guard/relay.toml\""
                .into(),
        ));
    }
    Ok(RelayConfig {
        source,
        sinks: out,
        sinks_from: relay.sinks_from,
        declared: Vec::new(),
    })
}

/// Refuses an mqtt sink that would undo the feed on its own broker (one of `[mqtt]
/// brokers`): the feed's `client_id` (its clean connect ends the feed's session, and with it
/// what the broker queued), or a topic the feed's own filters subscribe to (the feed would
/// consume what the sink publishes: an audit sink, each quarantine record one more audit
/// entry to publish, for ever; an effect sink, each effect one more malformed message).
pub(super) fn refuse_feed_loops(mqtt: &MqttConfig, relay: &RelayConfig) -> Result<(), ConfigError> {
    for sink in relay.named() {
        let SinkKind::Mqtt(m) = &sink.kind else {
            continue;
        };
        let same =
            |b: &BrokerUrl| b.host.eq_ignore_ascii_case(&m.broker.host) && b.port == m.broker.port;
        let Some(broker) = mqtt.brokers.iter().find(|b| same(b)) else {
            continue;
        };
        if m.client_id == mqtt.client_id {
            return Err(ConfigError::Invalid(format!(
                "[[sink]] {:?} client_id {:?} is [mqtt] client_id on the same broker ({broker}): \
                 the sink's clean connect would end the feed's session and what the broker \
                 queued for it; give the sink a client_id of its own",
                sink.name, m.client_id
            )));
        }
        if let Some(filter) = mqtt
            .topics
            .iter()
            .find(|f| super::topics::filter_may_match_template(f, &m.topic))
        {
            let what = match sink.stream {
                Stream::Audit => {
                    "every audit entry it publishes would come back as a malformed message, \
                     whose audit entry it would publish again, for ever"
                }
                Stream::Effects => {
                    "every effect it publishes would come back as a malformed message in the \
                     quarantine"
                }
            };
            return Err(ConfigError::Invalid(format!(
                "[[sink]] {:?} topic {:?} on the feed's broker ({broker}) may be matched by [mqtt] \
                 topics {filter:?} (a placeholder can hold any text): the feed would consume \
                 what the sink publishes, and {what}; publish outside the feed's filters",
                sink.name, m.topic
            )));
        }
    }
    Ok(())
}

/// A sink name: what `relay` commands and the cursor table use.
pub fn sink_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > 64 {
        return Some("must be 1 to 64 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Some("may hold only a-z, 0-9 and '-'");
    }
    None
}

fn sink_from_raw(r: RawSink) -> Result<SinkConfig, ConfigError> {
    if let Some(why) = sink_name_problem(&r.name) {
        let shown: String = r.name.chars().take(64).collect();
        return Err(ConfigError::Invalid(format!(
            "[[sink]] name {shown:?} {why}"
        )));
    }
    let name = r.name.clone();
    let invalid = |m: String| ConfigError::Invalid(format!("[[sink]] {name:?}: {m}"));
    let key = |k: &str| format!("[[sink]] {name:?} {k}");
    let (stream, outcomes) =
        stream_from_raw(r.stream.as_deref(), r.outcomes.as_deref()).map_err(&invalid)?;
    let kind = r.kind;
    let kind_name = match kind {
        RawKind::Mqtt => "mqtt",
        RawKind::Http => "http",
        RawKind::Postgres => "postgres",
        RawKind::Exec => "exec",
        RawKind::Syslog => "syslog",
    };
    // Keys of another kind are mistakes (a typo'd kind, a copied table), not ignored.
    let foreign: [(&str, bool, &[RawKind]); 21] = [
        ("broker", r.broker.is_some(), &[RawKind::Mqtt]),
        ("protocol", r.protocol.is_some(), &[RawKind::Mqtt]),
        ("client_id", r.client_id.is_some(), &[RawKind::Mqtt]),
        ("topic", r.topic.is_some(), &[RawKind::Mqtt]),
        ("username", r.username.is_some(), &[RawKind::Mqtt]),
        ("password_file", r.password_file.is_some(), &[RawKind::Mqtt]),
        (
            "ca_file",
            r.ca_file.is_some(),
            &[RawKind::Mqtt, RawKind::Http, RawKind::Syslog],
        ),
        (
            "client_cert_file",
            r.client_cert_file.is_some(),
            &[RawKind::Mqtt, RawKind::Http, RawKind::Syslog],
        ),
        (
            "client_key_file",
            r.client_key_file.is_some(),
            &[RawKind::Mqtt, RawKind::Http, RawKind::Syslog],
        ),
        (
            "keep_alive_seconds",
            r.keep_alive_seconds.is_some(),
            &[RawKind::Mqtt],
        ),
        ("url", r.url.is_some(), &[RawKind::Http, RawKind::Syslog]),
        (
            "authorization_file",
            r.authorization_file.is_some(),
            &[RawKind::Http],
        ),
        ("dsn", r.dsn.is_some(), &[RawKind::Postgres]),
        ("dsn_file", r.dsn_file.is_some(), &[RawKind::Postgres]),
        ("table", r.table.is_some(), &[RawKind::Postgres]),
        ("command", r.command.is_some(), &[RawKind::Exec]),
        ("hostname", r.hostname.is_some(), &[RawKind::Syslog]),
        ("facility", r.facility.is_some(), &[RawKind::Syslog]),
        ("settle_ms", r.settle_ms.is_some(), &[RawKind::Syslog]),
        ("sd_id", r.sd_id.is_some(), &[RawKind::Syslog]),
        ("relp_window", r.relp_window.is_some(), &[RawKind::Syslog]),
    ];
    for (k, set, kinds) in foreign {
        if set && !kinds.contains(&kind) {
            return Err(invalid(format!(
                "{k} does not apply to kind = \"{kind_name}\""
            )));
        }
    }
    let batch_max = r.batch_max.unwrap_or(match kind {
        // syslog: a tcp:// or tls:// connection waits out `settle_ms` after its first batch
        // only; relp:// keeps `relp_window` messages in flight across batches.
        RawKind::Postgres | RawKind::Exec | RawKind::Syslog => 500,
        RawKind::Mqtt | RawKind::Http => 100,
    });
    let linger_ms = r.linger_ms.unwrap_or(0);
    let max_in_flight = r.max_in_flight.unwrap_or(1);
    let backoff_initial_ms = r.backoff_initial_ms.unwrap_or(200);
    let backoff_max_ms = r.backoff_max_ms.unwrap_or(30_000).max(backoff_initial_ms);
    let timeout_ms = r.timeout_ms.unwrap_or(10_000);
    for (k, v, range) in [
        ("batch_max", batch_max, SINK_BATCH_MAX),
        ("linger_ms", linger_ms, SINK_LINGER_MS),
        ("max_in_flight", max_in_flight, SINK_MAX_IN_FLIGHT),
        (
            "backoff_initial_ms",
            backoff_initial_ms,
            SINK_BACKOFF_INITIAL_MS,
        ),
        (
            "backoff_max_ms",
            backoff_max_ms,
            backoff_initial_ms..=SINK_BACKOFF_MAX_MS,
        ),
        ("timeout_ms", timeout_ms, SINK_TIMEOUT_MS),
    ] {
        in_range(&key(k), v, range)?;
    }
    let readable = |k: &str, p: &Path| -> Result<(), ConfigError> {
        std::fs::File::open(p)
            .map(drop)
            .map_err(|e| invalid(format!("{k} {}: {e}", p.display())))
    };
    let kind = match kind {
        RawKind::Mqtt => {
            let broker = BrokerUrl::parse(
                r.broker
                    .as_deref()
                    .ok_or_else(|| invalid("broker is required (mqtt:// or mqtts://)".into()))?,
            )
            .map_err(|e| invalid(e.to_string()))?;
            let client_id = r.client_id.clone().unwrap_or_default();
            if client_id.is_empty() || client_id.len() > 256 {
                return Err(invalid(
                    "client_id is required (1 to 256 bytes), distinct from [mqtt] client_id".into(),
                ));
            }
            let topic = r.topic.clone().unwrap_or_default();
            if let Some(why) = topic_template_problem(&topic) {
                return Err(invalid(format!("topic {why}")));
            }
            let keep_alive = r.keep_alive_seconds.unwrap_or(30);
            in_range(&key("keep_alive_seconds"), keep_alive, KEEP_ALIVE_SECONDS)?;
            let tls = tls_files(
                r.ca_file.as_ref(),
                r.client_cert_file.as_ref(),
                r.client_key_file.as_ref(),
                broker.tls,
            )
            .map_err(&invalid)?;
            let credentials = match (&r.username, &r.password_file) {
                (None, None) => None,
                (Some(user), Some(path)) => {
                    Some((user.clone(), read_password(path).map_err(&invalid)?))
                }
                _ => {
                    return Err(invalid("username and password_file go together".into()));
                }
            };
            SinkKind::Mqtt(MqttSink {
                broker,
                protocol: r.protocol.unwrap_or_default().into(),
                client_id,
                topic,
                credentials,
                tls,
                keep_alive: Duration::from_secs(keep_alive),
            })
        }
        RawKind::Http => {
            let url = HttpUrl::parse(
                r.url
                    .as_deref()
                    .ok_or_else(|| invalid("url is required (http:// or https://)".into()))?,
            )
            .map_err(|e| invalid(e.to_string()))?;
            if let Some(ca) = &r.ca_file {
                readable("ca_file", ca)?;
            }
            let client_identity = match (&r.client_cert_file, &r.client_key_file) {
                (None, None) => None,
                (Some(cert), Some(key)) => {
                    if !url.tls {
                        return Err(invalid(
                            "client_cert_file and client_key_file are for an https:// url \
                             (mutual TLS)"
                                .into(),
                        ));
                    }
                    readable("client_cert_file", cert)?;
                    readable("client_key_file", key)?;
                    crate::tls::check_identity(cert, key, "client_cert_file", "client_key_file")
                        .map_err(|e| invalid(e.to_string()))?;
                    Some((cert.clone(), key.clone()))
                }
                _ => {
                    return Err(invalid(
                        "client_cert_file and client_key_file go together".into(),
                    ));
                }
            };
            let authorization =
                authorization(&name, r.authorization_file.as_deref()).map_err(&invalid)?;
            if authorization.is_some() && !url.tls && !is_loopback(&url.host) {
                tracing::warn!(
                    sink = %name,
                    url = %url,
                    "the Authorization value of sink {name} goes in clear over http:// ({url}): use https://"
                );
            }
            SinkKind::Http(HttpSink {
                url,
                ca_file: r.ca_file.clone(),
                client_identity,
                authorization,
            })
        }
        RawKind::Postgres => {
            let dsn = super::store::read_dsn(
                r.dsn.as_ref(),
                r.dsn_file.as_deref(),
                "give exactly one of dsn and dsn_file (a dsn with a password belongs \
                         in dsn_file)",
            )
            .map_err(&invalid)?;
            // sslmode and the certificate files, checked here as the store's are.
            crate::store::postgres::tls::parse_dsn(&dsn).map_err(|e| invalid(e.to_string()))?;
            let table = r
                .table
                .clone()
                .unwrap_or_else(|| "replay_guard_events".into());
            if let Some(why) = sql_name_problem(&table) {
                return Err(invalid(format!("table {table:?} {why}")));
            }
            SinkKind::Postgres(PostgresSink {
                dsn: Secret(dsn),
                table,
            })
        }
        RawKind::Exec => {
            let command = r.command.clone().unwrap_or_default();
            if command.is_empty() || command[0].is_empty() {
                return Err(invalid(
                    "command is required: an argv array such as [\"/usr/local/bin/cop-import\", \
                     \"--batch\"] (no shell)"
                        .into(),
                ));
            }
            if command.iter().any(|a| a.contains('\0')) {
                return Err(invalid("command arguments may not hold NUL".into()));
            }
            SinkKind::Exec(ExecSink { command })
        }
        RawKind::Syslog => SinkKind::Syslog(syslog_from_raw(&r, max_in_flight).map_err(&invalid)?),
    };
    Ok(SinkConfig {
        name: r.name,
        on_poison: match r.on_poison {
            RawPoison::Park => OnPoison::Park,
            RawPoison::Block => OnPoison::Block,
        },
        start: match r.start {
            RawStart::Beginning => Start::Beginning,
            RawStart::Head => Start::Head,
        },
        stream,
        outcomes,
        batch_max: usize::try_from(batch_max).unwrap_or(usize::MAX),
        linger: Duration::from_millis(linger_ms),
        max_in_flight: usize::try_from(max_in_flight).unwrap_or(usize::MAX),
        backoff_initial: Duration::from_millis(backoff_initial_ms),
        backoff_max: Duration::from_millis(backoff_max_ms),
        timeout: Duration::from_millis(timeout_ms),
        kind,
    })
}

/// A sink's `stream` and `outcomes` as written: `outcomes` only on an audit sink, each a
/// known outcome, none twice, not empty.
fn stream_from_raw(
    stream: Option<&str>,
    outcomes: Option<&[String]>,
) -> Result<(Stream, Option<Vec<Outcome>>), String> {
    let stream = match stream {
        None | Some("effects") => Stream::Effects,
        Some("audit") => Stream::Audit,
        Some(other) => {
            let shown: String = other.chars().take(64).collect();
            return Err(format!(
                "stream {shown:?} is not one of \"effects\" (the effect log, the default) and \
                 \"audit\" (the audit log)"
            ));
        }
    };
    let Some(names) = outcomes else {
        return Ok((stream, None));
    };
    if stream != Stream::Audit {
        return Err(
            "outcomes selects audit entries: it needs stream = \"audit\" (an effects sink \
             delivers every applied effect)"
                .into(),
        );
    }
    let valid = || {
        Outcome::ALL
            .iter()
            .map(|o| o.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if names.is_empty() {
        return Err(format!(
            "outcomes is empty: name at least one of {}, or leave the key out to deliver \
             every audit entry",
            valid()
        ));
    }
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let Some(o) = Outcome::parse(n) else {
            let shown: String = n.chars().take(64).collect();
            return Err(format!(
                "outcomes names {shown:?}, which is not an outcome: valid are {}",
                valid()
            ));
        };
        if out.contains(&o) {
            return Err(format!("outcomes names {n:?} twice"));
        }
        out.push(o);
    }
    Ok((stream, Some(out)))
}

/// A syslog sink's own keys (the shared ones are checked by `sink_from_raw`).
fn syslog_from_raw(r: &RawSink, max_in_flight: u64) -> Result<SyslogSink, String> {
    let url = SyslogUrl::parse(r.url.as_deref().ok_or(
        "url is required (tcp://HOST:PORT or relp://HOST:PORT, or tls://HOST:PORT or \
                 relp+tls://HOST:PORT with ca_file)",
    )?)
    .map_err(|e| e.to_string())?;
    if max_in_flight != 1 {
        return Err(format!(
            "max_in_flight = {max_in_flight}: a syslog sink sends on one connection, in log \
             order (leave max_in_flight out)"
        ));
    }
    let tls = if url.tls {
        if r.ca_file.is_none() {
            return Err(format!(
                "a {} url needs ca_file (the receiver's certificate is always verified): {url}",
                if url.relp { "relp+tls://" } else { "tls://" }
            ));
        }
        tls_files(
            r.ca_file.as_ref(),
            r.client_cert_file.as_ref(),
            r.client_key_file.as_ref(),
            true,
        )?
    } else {
        if r.ca_file.is_some() || r.client_cert_file.is_some() || r.client_key_file.is_some() {
            return Err(
                "ca_file, client_cert_file and client_key_file are for a tls:// or relp+tls:// \
                 url"
                .into(),
            );
        }
        None
    };
    let hostname = match &r.hostname {
        None => None,
        Some(h) => {
            if let Some(why) = syslog_hostname_problem(h) {
                return Err(format!("hostname {h:?} {why}"));
            }
            Some(h.clone())
        }
    };
    let facility = match &r.facility {
        None => 16,
        Some(f) => SYSLOG_FACILITIES
            .iter()
            .find(|(name, _)| name == f)
            .map(|(_, code)| *code)
            .ok_or_else(|| {
                let names: Vec<&str> = SYSLOG_FACILITIES.iter().map(|(n, _)| *n).collect();
                format!("facility {f:?} is not one of {}", names.join(", "))
            })?,
    };
    if url.relp && r.settle_ms.is_some() {
        return Err(format!(
            "settle_ms is for tcp:// and tls://: over RELP a message counts once the \
             receiver's rsp says so (leave settle_ms out): {url}"
        ));
    }
    if !url.relp && r.relp_window.is_some() {
        return Err(format!(
            "relp_window is for relp:// and relp+tls:// (leave it out): {url}"
        ));
    }
    let relp_window = r.relp_window.unwrap_or(128);
    if !SINK_RELP_WINDOW.contains(&relp_window) {
        return Err(format!(
            "relp_window = {relp_window} is out of range: allowed {}..={}",
            SINK_RELP_WINDOW.start(),
            SINK_RELP_WINDOW.end()
        ));
    }
    let settle_ms = r.settle_ms.unwrap_or(100);
    if !SINK_SETTLE_MS.contains(&settle_ms) {
        return Err(format!(
            "settle_ms = {settle_ms} is out of range: allowed {}..={}",
            SINK_SETTLE_MS.start(),
            SINK_SETTLE_MS.end()
        ));
    }
    let sd_id = match &r.sd_id {
        None => crate::relay::SYSLOG_SD_ID.to_string(),
        Some(id) => {
            if let Some(why) = sd_id_problem(id) {
                let shown: String = id.chars().take(64).collect();
                return Err(format!("sd_id {shown:?} {why}"));
            }
            id.clone()
        }
    };
    Ok(SyslogSink {
        url,
        tls,
        hostname,
        facility,
        settle: Duration::from_millis(settle_ms),
        relp_window: usize::try_from(relp_window).unwrap_or(usize::MAX),
        sd_id,
    })
}

/// Why `id` cannot be a private RFC 5424 SD-ID: `NAME@PEN`, at most 32 printable US-ASCII
/// characters without `=`, `]`, `"` or a space, NAME without `@`, PEN an IANA Private
/// Enterprise Number (digits, with optional dotted sub-identifiers).
pub fn sd_id_problem(id: &str) -> Option<&'static str> {
    let printable = id
        .bytes()
        .all(|b| (33..=126).contains(&b) && !matches!(b, b'=' | b']' | b'"'));
    if id.is_empty() || id.len() > 32 || !printable {
        return Some(
            "must be 1 to 32 printable US-ASCII characters without '=', ']', '\"' or a space \
             (RFC 5424 SD-NAME)",
        );
    }
    let pen_ok = |pen: &str| {
        !pen.is_empty()
            && pen
                .split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    match id.split_once('@') {
        Some((name, pen)) if !name.is_empty() && pen_ok(pen) => None,
        _ => Some(
            "must be NAME@PEN, PEN your organisation's IANA Private Enterprise Number (RFC \
             5424 6.3.2), e.g. \"decision@32473\"",
        ),
    }
}

/// Why `h` cannot be an RFC 5424 HOSTNAME: 1 to 255 printable US-ASCII characters, no space.
pub fn syslog_hostname_problem(h: &str) -> Option<&'static str> {
    if h.is_empty() || h.len() > 255 || !h.bytes().all(|b| (33..=126).contains(&b)) {
        return Some("must be 1 to 255 printable US-ASCII characters without spaces (RFC 5424)");
    }
    if h == "-" {
        return Some("is syslog's \"no value\": leave hostname out to send the host's name");
    }
    None
}

/// The `Authorization` value of http sink `sink`: read from `file`, else from
/// `$CREDENTIALS_DIRECTORY/SINK-authorization` when systemd handed that credential over
/// (`LoadCredential=`; found as `[mqtt]`'s `mqtt-password` is), else none. One line of
/// printable ASCII, its line end trimmed. A file others than its owner may read or write is
/// used, with a warning. Errors name the file, never what it holds.
fn authorization(sink: &str, file: Option<&Path>) -> Result<Option<Secret>, String> {
    let from_systemd = std::env::var_os("CREDENTIALS_DIRECTORY")
        .map(|d| PathBuf::from(d).join(format!("{sink}-authorization")));
    let Some(path) = file
        .map(Path::to_path_buf)
        .or(from_systemd.filter(|p| p.exists()))
    else {
        return Ok(None);
    };
    let shown = path.display();
    let text = read_bounded(&path, MAX_AUTHORIZATION_BYTES)
        .map_err(|e| format!("authorization_file {shown}: {e}"))?;
    let value = text.trim_end_matches(['\r', '\n']);
    if value.trim().is_empty() {
        return Err(format!(
            "authorization_file {shown} is empty: it holds the whole Authorization header \
             value, e.g. \"Bearer TOKEN\""
        ));
    }
    if !value.chars().all(|c| (' '..='~').contains(&c)) {
        return Err(format!(
            "authorization_file {shown}: the value must be one line of printable ASCII (it \
             holds a control character, a line break or a non-ASCII character)"
        ));
    }
    if value.starts_with(' ') || value.ends_with(' ') {
        return Err(format!(
            "authorization_file {shown}: the value starts or ends with a space"
        ));
    }
    warn_if_shared(sink, &path);
    Ok(Some(Secret(value.to_string())))
}

/// Logs a warning when a secret's file can be read or written by others than its owner
/// (mode 0600 or stricter is expected). A warning, not a refusal: the operator may have
/// reasons (a group-readable file under a directory only the service can enter).
fn warn_if_shared(sink: &str, path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(m) = std::fs::metadata(path) {
        let mode = m.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                sink = %sink,
                file = %path.display(),
                mode = %format!("{mode:04o}"),
                "authorization_file {} of sink {sink} may be read or written by others than its owner (mode {mode:04o}): chmod 0600 it",
                path.display()
            );
        }
    }
}

/// Whether a URL's host is this machine (nothing leaves it).
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A PostgreSQL table name replay-guard will put in SQL unquoted: `name` or `schema.name`,
/// each `[a-z_][a-z0-9_]*`, at most 63 bytes.
pub fn sql_name_problem(t: &str) -> Option<&'static str> {
    let ok = |part: &str| {
        !part.is_empty()
            && part.len() <= 63
            && part
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    let parts: Vec<&str> = t.split('.').collect();
    if parts.len() > 2 || !parts.iter().all(|p| ok(p)) {
        return Some("must be NAME or SCHEMA.NAME, each [a-z_][a-z0-9_]* and at most 63 bytes");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;

    fn exec(program: &str) -> ExecSink {
        ExecSink {
            command: vec![program.to_string(), "--batch".to_string()],
        }
    }

    #[test]
    fn an_exec_sink_program_must_be_an_executable_file_or_on_path() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("cop-import");
        std::fs::write(&script, "#!/bin/sh\ncat >/dev/null\n").unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "x").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = std::ffi::OsString::from(format!("/nonexistent:{}", dir.path().display()));
        let s = |p: &Path| p.to_str().unwrap().to_string();
        assert_eq!(exec(&s(&script)).program_problem(None), None);
        assert_eq!(exec("cop-import").program_problem(Some(&path)), None);
        let missing = exec("/usr/local/bin/cop-import-missing")
            .program_problem(None)
            .unwrap();
        assert!(
            missing.contains("\"/usr/local/bin/cop-import-missing\" does not exist"),
            "{missing}"
        );
        let not_exec = exec(&s(&plain)).program_problem(None).unwrap();
        assert!(not_exec.ends_with("is not executable"), "{not_exec}");
        let dir_named = exec(&s(dir.path())).program_problem(None).unwrap();
        assert!(dir_named.ends_with("is not a file"), "{dir_named}");
        let bare = exec("cop-import-missing")
            .program_problem(Some(&path))
            .unwrap();
        assert!(
            bare.contains("in any directory of PATH (/nonexistent:"),
            "{bare}"
        );
        assert!(exec("plain").program_problem(Some(&path)).is_some());
        assert!(exec("cop-import").program_problem(None).is_some());
    }

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_sink_carries_the_audit_stream_with_its_outcomes_checked() {
        let sink = |extra: &str| {
            parse(&format!(
                "[[sink]]\nname = \"siem\"\nkind = \"exec\"\ncommand = [\"/bin/cat\"]\n{extra}"
            ))
        };
        let c = sink("").unwrap();
        assert_eq!(
            (c.relay.sinks[0].stream, &c.relay.sinks[0].outcomes),
            (Stream::Effects, &None)
        );
        let c = sink("stream = \"audit\"").unwrap();
        assert_eq!(
            (c.relay.sinks[0].stream, &c.relay.sinks[0].outcomes),
            (Stream::Audit, &None)
        );
        let c = sink("stream = \"audit\"\noutcomes = [\"duplicate\", \"conflict\"]").unwrap();
        assert_eq!(
            c.relay.sinks[0].outcomes,
            Some(vec![Outcome::Duplicate, Outcome::Conflict])
        );
        for (extra, want) in [
            (
                "stream = \"audit\"\noutcomes = [\"duplicate\", \"dupe\"]",
                "[[sink]] \"siem\": outcomes names \"dupe\", which is not an outcome: valid are \
                 applied, applied_late, duplicate, conflict, stale, malformed, released, \
                 discarded, relay",
            ),
            (
                "outcomes = [\"duplicate\"]",
                "[[sink]] \"siem\": outcomes selects audit entries: it needs stream = \"audit\"",
            ),
            (
                "stream = \"effects\"\noutcomes = [\"duplicate\"]",
                "it needs stream = \"audit\"",
            ),
            ("stream = \"audit\"\noutcomes = []", "outcomes is empty"),
            (
                "stream = \"audit\"\noutcomes = [\"stale\", \"stale\"]",
                "outcomes names \"stale\" twice",
            ),
            (
                "stream = \"decisions\"",
                "stream \"decisions\" is not one of \"effects\"",
            ),
        ] {
            let e = sink(extra).unwrap_err();
            assert!(e.contains(want), "{extra}: {e}");
        }
    }

    #[test]
    fn a_config_without_sinks_has_no_relay_work() {
        let c = parse("").unwrap();
        assert!(c.relay.sinks.is_empty());
        assert_eq!(c.relay.source, "urn:replay-guard:ingest");
    }

    #[test]
    fn every_kind_parses_with_its_defaults() {
        let c = parse(
            r#"
[mqtt]
brokers = ["mqtt://127.0.0.1:1883"]
client_id = "rg-1"
topics = ["incidents/#"]

[[sink]]
name = "cop-mqtt"
kind = "mqtt"
broker = "mqtt://127.0.0.1:1884"
client_id = "rg-1-relay"
topic = "cop/{agency}/{source_id}"

[[sink]]
name = "cad"
kind = "http"
url = "http://127.0.0.1:8080/events?x=1"
timeout_ms = 2000
on_poison = "block"

[[sink]]
name = "db"
kind = "postgres"
dsn = "host=127.0.0.1 user=postgres dbname=cop"

[[sink]]
name = "script"
kind = "exec"
command = ["/bin/cat"]
start = "head"
"#,
        )
        .unwrap();
        assert_eq!(c.relay.source, "urn:replay-guard:rg-1");
        let s = &c.relay.sinks;
        assert_eq!(s.len(), 4);
        assert_eq!(s[0].batch_max, 100);
        assert_eq!(s[0].max_in_flight, 1);
        assert_eq!(s[0].on_poison, OnPoison::Park);
        match &s[0].kind {
            SinkKind::Mqtt(m) => {
                assert_eq!(m.protocol, Protocol::V5);
                assert_eq!(m.topic, "cop/{agency}/{source_id}");
            }
            other => panic!("{other:?}"),
        }
        match &s[1].kind {
            SinkKind::Http(h) => {
                assert_eq!(h.url.path, "/events");
                assert_eq!(h.url.request_target(), "/events?x=1");
                assert_eq!(h.url.port, 8080);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(s[1].on_poison, OnPoison::Block);
        assert_eq!(s[1].timeout, Duration::from_secs(2));
        match &s[2].kind {
            SinkKind::Postgres(p) => assert_eq!(p.table, "replay_guard_events"),
            other => panic!("{other:?}"),
        }
        assert_eq!(s[2].batch_max, 500);
        assert_eq!(s[3].start, Start::Head);
    }

    #[test]
    fn sink_mistakes_are_named() {
        let cases = [
            (
                "name = \"Bad_Name\"\nkind = \"exec\"\ncommand = [\"x\"]",
                "a-z, 0-9",
            ),
            (
                "name = \"a\"\nkind = \"exec\"\ncommand = []",
                "command is required",
            ),
            (
                "name = \"a\"\nkind = \"exec\"\ncommand = [\"x\"]\nurl = \"http://h/\"",
                "url does not apply",
            ),
            (
                "name = \"a\"\nkind = \"http\"\nurl = \"ftp://h/\"",
                "http://",
            ),
            (
                "name = \"a\"\nkind = \"http\"\nurl = \"http://u:p@h/\"",
                "user name",
            ),
            (
                "name = \"a\"\nkind = \"http\"\nurl = \"http://h/\"\nbatch_max = 0",
                "batch_max",
            ),
            (
                "name = \"a\"\nkind = \"mqtt\"\nbroker = \"mqtt://h\"\nclient_id = \"c\"\ntopic = \"a/#\"",
                "topic",
            ),
            (
                "name = \"a\"\nkind = \"mqtt\"\nbroker = \"mqtt://h\"\nclient_id = \"c\"\ntopic = \"a/{bogus}\"",
                "placeholder",
            ),
            (
                "name = \"a\"\nkind = \"postgres\"\ndsn = \"host=h\"\ntable = \"drop table\"",
                "SCHEMA.NAME",
            ),
            ("name = \"a\"\nkind = \"postgres\"", "exactly one of dsn"),
            (
                "name = \"a\"\nkind = \"postgres\"\ndsn = \"host=h sslmode=verify-full\"",
                "needs sslrootcert=FILE",
            ),
            (
                "name = \"a\"\nkind = \"postgres\"\ndsn = \"host=h sslmode=allow\"",
                "sslmode=allow is not supported",
            ),
            ("name = \"a\"\nkind = \"nats\"", "unknown variant"),
        ];
        for (body, want) in cases {
            let e = parse(&format!("[[sink]]\n{body}\n")).unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
        }
        let e = parse(
            "[[sink]]\nname = \"a\"\nkind = \"exec\"\ncommand = [\"x\"]\n\
             [[sink]]\nname = \"a\"\nkind = \"exec\"\ncommand = [\"y\"]\n",
        )
        .unwrap_err();
        assert!(e.contains("used twice"), "{e}");
    }

    #[test]
    fn a_syslog_sink_parses_with_its_defaults_and_its_mistakes_are_named() {
        let c = parse(
            "[[sink]]\nname = \"siem\"\nkind = \"syslog\"\nurl = \"tcp://127.0.0.1:5514\"\n\
             [[sink]]\nname = \"siem-2\"\nkind = \"syslog\"\nurl = \"tcp://[::1]\"\n\
             hostname = \"eoc-1.example\"\nfacility = \"user\"\nsettle_ms = 0\n\
             sd_id = \"decision@55555.1\"\n",
        )
        .unwrap();
        let SinkKind::Syslog(s) = &c.relay.sinks[0].kind else {
            panic!("syslog expected")
        };
        assert_eq!(s.url.to_string(), "tcp://127.0.0.1:5514");
        assert!(s.tls.is_none() && s.hostname.is_none());
        assert_eq!((s.facility, s.settle), (16, Duration::from_millis(100)));
        assert_eq!(s.sd_id, "decision@32473");
        assert_eq!(c.relay.sinks[0].batch_max, 500);
        assert_eq!(c.relay.sinks[0].kind.name(), "syslog");
        let SinkKind::Syslog(s) = &c.relay.sinks[1].kind else {
            panic!("syslog expected")
        };
        assert_eq!(s.url.to_string(), "tcp://[::1]:514");
        assert_eq!(s.hostname.as_deref(), Some("eoc-1.example"));
        assert_eq!((s.facility, s.settle), (1, Duration::ZERO));
        assert_eq!(s.sd_id, "decision@55555.1");
        assert_eq!(SyslogUrl::parse("tls://h").unwrap().port, 6514);
        let c = parse(
            "[[sink]]\nname = \"siem\"\nkind = \"syslog\"\nurl = \"relp://h\"\n\
             [[sink]]\nname = \"siem-2\"\nkind = \"syslog\"\nurl = \"relp://h:20514\"\n\
             relp_window = 1\n",
        )
        .unwrap();
        let SinkKind::Syslog(s) = &c.relay.sinks[0].kind else {
            panic!("syslog expected")
        };
        assert_eq!(
            (s.url.to_string().as_str(), s.relp_window),
            ("relp://h:2514", 128)
        );
        assert_eq!(c.relay.sinks[0].batch_max, 500);
        let SinkKind::Syslog(s) = &c.relay.sinks[1].kind else {
            panic!("syslog expected")
        };
        assert_eq!((s.url.port, s.relp_window), (20514, 1));
        for (body, want) in [
            ("", "url is required"),
            (
                "url = \"udp://h:514\"",
                "must start with tcp://, tls://, relp:// or relp+tls://",
            ),
            ("url = \"relp+tls://h\"", "a relp+tls:// url needs ca_file"),
            (
                "url = \"relp://h\"\nsettle_ms = 5",
                "settle_ms is for tcp://",
            ),
            (
                "url = \"tcp://h\"\nrelp_window = 5",
                "relp_window is for relp://",
            ),
            (
                "url = \"relp://h\"\nrelp_window = 0",
                "relp_window = 0 is out of range",
            ),
            (
                "url = \"relp://h\"\nrelp_window = 100001",
                "relp_window = 100001 is out of range",
            ),
            ("url = \"tcp://u:p@h\"", "client certificate"),
            ("url = \"tcp://h/x\"", "no host, or a path"),
            ("url = \"tls://h\"", "needs ca_file"),
            (
                "url = \"tcp://h\"\nca_file = \"/dev/null\"",
                "are for a tls:// or relp+tls:// url",
            ),
            (
                "url = \"tls://h\"\nca_file = \"/nonexistent/ca.pem\"",
                "ca_file /nonexistent/ca.pem",
            ),
            (
                "url = \"tcp://h\"\nhostname = \"eoc 1\"",
                "printable US-ASCII",
            ),
            ("url = \"tcp://h\"\nhostname = \"-\"", "no value"),
            ("url = \"tcp://h\"\nfacility = \"local8\"", "local0, local1"),
            ("url = \"tcp://h\"\nsettle_ms = 10001", "settle_ms = 10001"),
            ("url = \"tcp://h\"\nmax_in_flight = 2", "one connection"),
            (
                "url = \"tcp://h\"\nsd_id = \"decision\"",
                "must be NAME@PEN",
            ),
            (
                "url = \"tcp://h\"\nsd_id = \"decision@acme\"",
                "must be NAME@PEN",
            ),
            ("url = \"tcp://h\"\nsd_id = \"@32473\"", "must be NAME@PEN"),
            ("url = \"tcp://h\"\nsd_id = \"a b@1\"", "RFC 5424 SD-NAME"),
            ("url = \"tcp://h\"\nsd_id = \"a]@1\"", "RFC 5424 SD-NAME"),
            (
                "url = \"tcp://h\"\nauthorization_file = \"/x\"",
                "does not apply",
            ),
        ] {
            let e = parse(&format!(
                "[[sink]]\nname = \"siem\"\nkind = \"syslog\"\n{body}\n"
            ))
            .unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
        }
        let e = parse(
            "[[sink]]\nname = \"a\"\nkind = \"http\"\nurl = \"http://h/\"\nfacility = \"user\"\n",
        )
        .unwrap_err();
        assert!(
            e.contains("facility does not apply to kind = \"http\""),
            "{e}"
        );
    }

    #[test]
    fn an_http_url_query_never_prints_and_is_still_sent() {
        let c = parse(
            "[[sink]]\nname = \"cop\"\nkind = \"http\"\n\
             url = \"https://cop.example:8443/in/events?api_key=hunter2&x=1\"\n\
             ca_file = \"/dev/null\"\n",
        )
        .unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        let SinkKind::Http(h) = &c.relay.sinks[0].kind else {
            panic!("http expected")
        };
        assert_eq!(
            h.url.to_string(),
            "https://cop.example:8443/in/events?<redacted>"
        );
        assert_eq!(h.url.request_target(), "/in/events?api_key=hunter2&x=1");
        for (url, want) in [
            ("http://h?k=hunter2", "http://h:80/?<redacted>"),
            ("http://[::1]:81/?hunter2", "http://[::1]:81/?<redacted>"),
            ("http://h/p", "http://h:80/p"),
        ] {
            assert_eq!(HttpUrl::parse(url).unwrap().to_string(), want);
        }
        // Every error that quotes the URL hides the query (and any user info).
        for url in [
            "ftp://h/?k=hunter2",
            "cop.example/in?k=hunter2",
            "http://u:p@h/?k=hunter2",
            "http://h:notaport/?k=hunter2",
            "http://h/p?k=hunter2#frag",
            "http://h/p?k=hunter2 x",
            "http://h/p#hunter2",
            "http://[::1/?k=hunter2",
            "http://:80/?k=hunter2",
        ] {
            let e = HttpUrl::parse(url).unwrap_err().to_string();
            assert!(!e.contains("hunter2"), "{url}: {e}");
            let e = parse(&format!(
                "[[sink]]\nname = \"a\"\nkind = \"http\"\nurl = {url:?}\n"
            ))
            .unwrap_err();
            assert!(!e.contains("hunter2"), "{url}: {e}");
        }
        // TOML errors quote the line: its URL's query is hidden too.
        for text in [
            "[[sink]]\nname = \"a\"\nkind = \"http\"\nurl = \"http://h/?k=hunter2\" x\n",
            "[[sink]]\nname = \"a\"\nkind = \"http\"\nurl = [\"http://h/?k=hunter2\"]\n",
            "[[sink]]\nname = \"a\"\nkind = \"http\"\nurl = http://h/?k=hunter2\n",
            "[[sink]]\nname = \"a\"\nkind = \"http\"\nauthorization = \"Bearer hunter2\"\n",
        ] {
            let e = parse(text).unwrap_err();
            assert!(!e.contains("hunter2"), "{text}: {e}");
        }
    }

    /// An http sink whose `authorization_file` holds `content` (mode `mode`).
    fn with_authorization(content: &[u8], mode: u32) -> (tempfile::TempDir, String) {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cop-authorization");
        std::fs::write(&file, content).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        let text = format!(
            "[[sink]]\nname = \"cop\"\nkind = \"http\"\nurl = \"http://127.0.0.1/\"\n\
             authorization_file = {:?}\n",
            file.to_str().unwrap()
        );
        (dir, text)
    }

    #[test]
    fn authorization_file_holds_the_header_value_trimmed_and_never_prints() {
        for content in [
            &b"Bearer hunter2"[..],
            b"Bearer hunter2\n",
            b"Bearer hunter2\r\n",
            b"Bearer hunter2\n\n",
        ] {
            let (_dir, text) = with_authorization(content, 0o600);
            let c = parse(&text).unwrap();
            let SinkKind::Http(h) = &c.relay.sinks[0].kind else {
                panic!("http expected")
            };
            assert_eq!(h.authorization.as_ref().unwrap().expose(), "Bearer hunter2");
            assert!(!format!("{c:?}").contains("hunter2"));
        }
        // Group-readable is used (with a warning, logged).
        let (_dir, text) = with_authorization(b"Basic aHVudGVyMg==", 0o644);
        assert!(parse(&text).is_ok());
        // No key and no systemd credential: no header.
        let c = parse("[[sink]]\nname = \"cop\"\nkind = \"http\"\nurl = \"http://h/\"\n").unwrap();
        let SinkKind::Http(h) = &c.relay.sinks[0].kind else {
            panic!("http expected")
        };
        assert!(h.authorization.is_none());
    }

    #[test]
    fn a_bad_authorization_file_is_refused_without_quoting_it() {
        for (content, want) in [
            (&b""[..], "is empty"),
            (b"\n", "is empty"),
            (b"  \n", "is empty"),
            (b"Bearer hun\ter2", "printable ASCII"),
            (b"Bearer hun\nter2\n", "printable ASCII"),
            (b"Bearer hun\x7fter2", "printable ASCII"),
            ("Bearer hünter2".as_bytes(), "printable ASCII"),
            (b"\xffhunter2", "valid UTF-8"),
            (b" Bearer hunter2", "starts or ends with a space"),
        ] {
            let (dir, text) = with_authorization(content, 0o600);
            // The temporary directory's random name is not what the file holds.
            let e = parse(&text)
                .unwrap_err()
                .replace(dir.path().to_str().unwrap(), "DIR");
            assert!(
                e.contains("authorization_file DIR/cop-authorization") && e.contains(want),
                "{content:?}: {e}"
            );
            assert!(!e.contains("hun"), "{e}");
        }
        let e = parse(
            "[[sink]]\nname = \"cop\"\nkind = \"http\"\nurl = \"http://h/\"\n\
             authorization_file = \"/nonexistent/cop-authorization\"\n",
        )
        .unwrap_err();
        assert!(
            e.contains("authorization_file /nonexistent/cop-authorization: "),
            "{e}"
        );
        let e = parse(
            "[[sink]]\nname = \"a\"\nkind = \"exec\"\ncommand = [\"x\"]\n\
             authorization_file = \"/x\"\n",
        )
        .unwrap_err();
        assert!(e.contains("authorization_file does not apply"), "{e}");
    }

    #[test]
    fn https_without_ca_file_is_accepted_and_trusts_the_system_store() {
        let c = parse("[[sink]]\nname = \"a\"\nkind = \"http\"\nurl = \"https://h/\"\n").unwrap();
        let SinkKind::Http(h) = &c.relay.sinks[0].kind else {
            panic!("http expected")
        };
        assert!(h.url.tls && h.ca_file.is_none() && h.client_identity.is_none());
    }

    #[test]
    fn a_postgres_password_never_prints() {
        let c = parse(
            "[[sink]]\nname = \"db\"\nkind = \"postgres\"\ndsn = \"postgres://u:hunter2@h/db\"\n",
        )
        .unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn an_mqtt_sink_that_would_undo_the_feed_on_its_own_broker_is_refused_naming_both() {
        let feed = "[mqtt]\nbrokers = [\"mqtt://a.example:1883\", \"mqtt://b.example\"]\n\
                    client_id = \"rg-1\"\ntopics = [\"incidents/#\", \"+/units/+\"]\n";
        let sink = |broker: &str, client_id: &str, topic: &str, stream: &str| {
            format!(
                "{feed}[[sink]]\nname = \"cop\"\nkind = \"mqtt\"\nbroker = \"{broker}\"\n\
                 client_id = \"{client_id}\"\ntopic = \"{topic}\"\nstream = \"{stream}\"\n"
            )
        };
        for (toml, want) in [
            (
                sink("mqtt://A.example", "rg-1", "cop/{agency}", "effects"),
                "[[sink]] \"cop\" client_id \"rg-1\" is [mqtt] client_id on the same broker \
                 (mqtt://a.example:1883)",
            ),
            (
                sink(
                    "mqtt://b.example:1883",
                    "rg-1-relay",
                    "incidents/audit",
                    "audit",
                ),
                "[[sink]] \"cop\" topic \"incidents/audit\" on the feed's broker \
                 (mqtt://b.example:1883) may be matched by [mqtt] topics \"incidents/#\"",
            ),
            (
                sink(
                    "mqtt://a.example",
                    "rg-1-relay",
                    "x/units/{source_id}",
                    "audit",
                ),
                "may be matched by [mqtt] topics \"+/units/+\" (a placeholder can hold any \
                 text): the feed would consume what the sink publishes, and every audit entry \
                 it publishes would come back as a malformed message, whose audit entry it \
                 would publish again, for ever",
            ),
            (
                sink(
                    "mqtt://a.example",
                    "rg-1-relay",
                    "z/{agency}/units/x",
                    "effects",
                ),
                "every effect it publishes would come back as a malformed message",
            ),
        ] {
            let e = Config::parse(&toml).unwrap_err().to_string();
            assert!(e.contains(want), "{toml}\n{e}");
        }
        // Another broker, or topics the filters cannot match, are fine.
        for ok in [
            sink("mqtt://cop.example", "rg-1", "incidents/audit", "audit"),
            sink("mqtt://a.example:1884", "rg-1", "incidents/x", "audit"),
            sink(
                "mqtt://a.example",
                "rg-1-relay",
                "cop/audit/{agency}",
                "audit",
            ),
        ] {
            Config::parse(&ok).unwrap_or_else(|e| panic!("{ok}\n{e}"));
        }
    }
}
