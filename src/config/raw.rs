//! The config file as written: the serde structs of its tables (unknown keys are errors) with
//! their defaults. `Config::from_raw` validates them; nothing else reads them. `[relay]` and
//! `[[sink]]` are in `sinks.rs`.

use std::path::PathBuf;

use serde::Deserialize;

use crate::store::{DEFAULT_CACHE_BYTES, WindowPolicy};
use crate::wire::{DEFAULT_MAX_DEPTH, DEFAULT_MAX_PAYLOAD_BYTES};

use super::DEFAULT_METRICS_LISTEN;
use super::limits::{
    DEFAULT_AUDIT_MAX_AGE_DAYS, DEFAULT_AUDIT_MAX_ENTRIES, DEFAULT_EFFECTS_MAX_AGE_DAYS,
    DEFAULT_EFFECTS_MAX_ENTRIES, DEFAULT_GAP_GRACE_MS, DEFAULT_LINGER_MS, DEFAULT_MAX_BATCH,
    DEFAULT_QUARANTINE_MAX_AGE_DAYS, DEFAULT_QUARANTINE_MAX_ENTRIES,
};
use super::sinks;

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawConfig {
    pub(super) store: RawStore,
    pub(super) window: RawWindow,
    pub(super) feed: RawFeed,
    pub(super) commit: RawCommit,
    pub(super) retention: RawRetention,
    pub(super) mqtt: Option<RawMqtt>,
    pub(super) service: RawService,
    pub(super) metrics: Option<RawMetrics>,
    pub(super) relay: sinks::RawRelay,
    pub(super) sink: Vec<sinks::RawSink>,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum RawProtocol {
    #[default]
    #[serde(rename = "v5")]
    V5,
    #[serde(rename = "v3.1.1")]
    V311,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawMqtt {
    pub(super) brokers: Vec<String>,
    pub(super) client_id: String,
    pub(super) topics: Vec<String>,
    pub(super) share_group: Option<String>,
    pub(super) protocol: RawProtocol,
    pub(super) session_expiry_seconds: u32,
    pub(super) receive_maximum: u16,
    pub(super) keep_alive_seconds: u64,
    pub(super) username: Option<String>,
    pub(super) password_file: Option<PathBuf>,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) client_cert_file: Option<PathBuf>,
    pub(super) client_key_file: Option<PathBuf>,
    pub(super) retries_per_broker: u32,
    pub(super) backoff_initial_ms: u64,
    pub(super) backoff_max_ms: u64,
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
pub(super) struct RawService {
    pub(super) shutdown_timeout_seconds: u64,
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
pub(super) struct RawMetrics {
    pub(super) enabled: bool,
    pub(super) listen: String,
}
impl Default for RawMetrics {
    fn default() -> Self {
        RawMetrics {
            enabled: true,
            listen: DEFAULT_METRICS_LISTEN.into(),
        }
    }
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawStore {
    pub(super) backend: RawBackend,
    pub(super) path: Option<PathBuf>,
    pub(super) cache_mb: u64,
    pub(super) dsn: Option<String>,
    pub(super) dsn_file: Option<PathBuf>,
    pub(super) schema: Option<String>,
    pub(super) statement_timeout_ms: Option<u64>,
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
pub(super) enum RawBackend {
    #[default]
    Redb,
    Postgres,
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawOutOfOrder {
    #[default]
    Apply,
    Quarantine,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawWindow {
    pub(super) seconds: u64,
    pub(super) max_entries: u64,
    pub(super) out_of_order: RawOutOfOrder,
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
pub(super) struct RawFeed {
    pub(super) agency: String,
    pub(super) source_id: String,
    pub(super) sequence: String,
    pub(super) epoch: String,
    pub(super) digest_ignore: Vec<String>,
    pub(super) max_payload_bytes: usize,
    pub(super) max_depth: usize,
    pub(super) gap_grace_ms: u64,
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
            gap_grace_ms: DEFAULT_GAP_GRACE_MS,
        }
    }
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawCommit {
    pub(super) max_batch: usize,
    pub(super) linger_ms: u64,
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
pub(super) struct RawRetention {
    pub(super) audit_max_age_days: u64,
    pub(super) audit_max_entries: u64,
    pub(super) effects_max_age_days: u64,
    pub(super) effects_max_entries: u64,
    pub(super) quarantine_max_age_days: u64,
    pub(super) quarantine_max_entries: u64,
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
