//! `[mqtt]`: the feed's brokers, client, topics, session and reconnect settings, validated;
//! the TLS files and the password file an mqtt sink reads the same way.

use std::path::{Path, PathBuf};

use super::ConfigError;
use super::limits::{
    BACKOFF_INITIAL_MS, BACKOFF_MAX_MS, KEEP_ALIVE_SECONDS, MAX_PASSWORD_BYTES, RECEIVE_MAXIMUM,
    RETRIES_PER_BROKER, SESSION_EXPIRY_SECONDS, in_range, read_bounded,
};
use super::raw::{RawMqtt, RawProtocol};
use super::redact::Secret;
use super::topics::topic_filter_problem;
use super::url::BrokerUrl;

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

impl From<RawProtocol> for Protocol {
    fn from(raw: RawProtocol) -> Protocol {
        match raw {
            RawProtocol::V5 => Protocol::V5,
            RawProtocol::V311 => Protocol::V311,
        }
    }
}

/// TLS material for `mqtts://` brokers. Certificate verification is always on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: PathBuf,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
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

/// The TLS files of an MQTT connection (`[mqtt]` or an mqtt `[[sink]]`); `tls_wanted`: an
/// `mqtts://` broker, which needs `ca_file`. The client is built here as the connection
/// builds it (`crate::tls::verifying_client`), so an unreadable or empty CA file, and a
/// client key that is not the certificate's, are refused when the config loads.
pub(super) fn tls_files(
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
    crate::tls::verifying_client((ca, "ca_file"), identity).map_err(|e| e.to_string())?;
    Ok(Some(TlsFiles {
        ca_file: ca.clone(),
        client_cert_file: cert.cloned(),
        client_key_file: key.cloned(),
    }))
}

pub(super) fn mqtt_from_raw(m: RawMqtt) -> Result<MqttConfig, ConfigError> {
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
            let credentials_dir = std::env::var_os("CREDENTIALS_DIRECTORY");
            let from_systemd = credentials_dir
                .as_ref()
                .map(|d| PathBuf::from(d).join("mqtt-password"));
            let path = m
                .password_file
                .clone()
                .or(from_systemd.filter(|p| p.exists()))
                .ok_or_else(|| invalid(no_password(credentials_dir.is_some())))?;
            Some((user.clone(), read_password(&path).map_err(invalid)?))
        }
    };
    Ok(MqttConfig {
        brokers,
        client_id: m.client_id,
        topics,
        protocol: m.protocol.into(),
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

/// A password file (`[mqtt] password_file`, an mqtt sink's): its text without the line end.
/// The error names the file, never what it holds.
pub(super) fn read_password(path: &Path) -> Result<Secret, String> {
    let text = read_bounded(path, MAX_PASSWORD_BYTES)
        .map_err(|e| format!("password_file {}: {e}", path.display()))?;
    Ok(Secret(text.trim_end_matches(['\r', '\n']).to_string()))
}

/// Why a `username` has no password, and how to check the unit's setup from a shell: outside
/// systemd there is no `$CREDENTIALS_DIRECTORY`, and the packaged unit's
/// `LoadCredential=mqtt-password:/etc/replay-guard/mqtt-password` hands over that file.
fn no_password(under_systemd: bool) -> String {
    if under_systemd {
        "username is set but there is no password_file nor $CREDENTIALS_DIRECTORY/mqtt-password \
         (the unit's LoadCredential=mqtt-password:FILE names no readable file?)"
            .into()
    } else {
        "username is set but there is no password_file, and $CREDENTIALS_DIRECTORY (where \
         systemd hands the unit its mqtt-password credential) is not set outside systemd: to \
         check the packaged unit's setup from a shell, run `sudo CREDENTIALS_DIRECTORY=/etc/\
         replay-guard replay-guard check-config FILE`, or set password_file"
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

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
}
