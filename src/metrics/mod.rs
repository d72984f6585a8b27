//! Prometheus metrics: the live service's counters and histograms (`Metrics`), the store's
//! readings as gauges (`store_families`, shared with `stats --format prometheus`), and the
//! text exposition format 0.0.4 they are served in. The only module naming the prometheus
//! crate; the endpoint that serves them is in `endpoint.rs`. Every metric is listed, with its
//! meaning, in the book (docs/src/operations/metrics.md).

pub(crate) mod endpoint;

use std::sync::Arc;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::model::{Outcome, OutcomeCounts};
use crate::readings::Readings;

/// The media type of the text exposition format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Batch sizes: from a lone message to `[commit] max_batch`'s upper range.
const BATCH_BUCKETS: [f64; 12] = [
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
];
/// Commit durations in seconds: an fsync on a fast disk (~0.5 ms) to a stalled one.
const COMMIT_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Duplicates one replay burst absorbed (a failover replays up to the broker's in-flight
/// window, or a whole queued session).
const BURST_BUCKETS: [f64; 7] = [1.0, 10.0, 100.0, 1000.0, 10_000.0, 100_000.0, 1_000_000.0];

/// A metric's definition is static: it can fail to build only if its name or labels are
/// malformed, which the tests would show at once.
const STATIC: &str = "a static metric definition is valid";

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
}

fn register<C: Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry.register(Box::new(c.clone())).expect(STATIC);
    c
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(r, IntCounter::with_opts(opts(name, help)).expect(STATIC))
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    register(r, IntGauge::with_opts(opts(name, help)).expect(STATIC))
}

fn counter_vec(r: &Registry, name: &str, help: &str, label: &str) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(opts(name, help), &[label]).expect(STATIC),
    )
}

fn gauge_vec(r: &Registry, name: &str, help: &str, label: &str) -> IntGaugeVec {
    register(
        r,
        IntGaugeVec::new(opts(name, help), &[label]).expect(STATIC),
    )
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let o = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(r, Histogram::with_opts(o).expect(STATIC))
}

/// What `run` counts as it goes: cheap to update from any thread (atomics), cloned freely.
#[derive(Clone)]
pub struct Metrics(Arc<Live>);

struct Live {
    registry: Registry,
    /// One counter per outcome, resolved once (no label lookup per batch).
    decisions: Vec<(Outcome, IntCounter)>,
    batch_size: Histogram,
    commit_seconds: Histogram,
    acks_sent: IntCounter,
    acks_stale: IntCounter,
    connected: IntGaugeVec,
    switches: IntCounter,
    lost: IntCounter,
    burst_duplicates: Histogram,
    last_commit: Gauge,
    unreachable: IntGauge,
    sink_restarts: IntCounterVec,
    gap_events: IntCounterVec,
    gap_missing: IntCounterVec,
    sessions_lost: IntCounterVec,
}

impl Metrics {
    /// The service's metrics, with a series for each outcome and each of `brokers` from the
    /// start (a counter that appears only once it moves hides its first increase from `rate`).
    pub fn new<'a>(brokers: impl IntoIterator<Item = &'a str>) -> Metrics {
        let r = Registry::new();
        let info = register(
            &r,
            IntGaugeVec::new(
                opts(
                    "replay_guard_build_info",
                    "Always 1; labelled with the version.",
                ),
                &["version"],
            )
            .expect(STATIC),
        );
        info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        let by_outcome = counter_vec(
            &r,
            "replay_guard_decisions_total",
            "Deliveries decided by this process, by outcome.",
            "outcome",
        );
        let decisions = Outcome::ALL
            .iter()
            .map(|o| (*o, by_outcome.with_label_values(&[o.as_str()])))
            .collect();
        let acks = counter_vec(
            &r,
            "replay_guard_acks_total",
            "PUBACKs after a commit: sent, or stale (the delivery's connection was gone, so \
             the broker redelivers it).",
            "result",
        );

        let connected = gauge_vec(
            &r,
            "replay_guard_broker_connected",
            "1 while connected to this broker, else 0.",
            "broker",
        );
        let brokers: Vec<&str> = brokers.into_iter().collect();
        for b in &brokers {
            connected.with_label_values(&[b]);
        }
        Metrics(Arc::new(Live {
            decisions,
            batch_size: histogram(
                &r,
                "replay_guard_batch_size",
                "Deliveries per committed batch (its count is the number of batches).",
                &BATCH_BUCKETS,
            ),
            commit_seconds: histogram(
                &r,
                "replay_guard_commit_duration_seconds",
                "Time to commit one batch durably (the store's write transaction and fsync).",
                &COMMIT_BUCKETS,
            ),
            acks_sent: acks.with_label_values(&["sent"]),
            acks_stale: acks.with_label_values(&["stale"]),
            connected,
            switches: counter(
                &r,
                "replay_guard_broker_switches_total",
                "Failovers: switches from one broker to the next.",
            ),
            lost: counter(
                &r,
                "replay_guard_connections_lost_total",
                "Broker connections lost (each is followed by a reconnect or a switch).",
            ),
            burst_duplicates: histogram(
                &r,
                "replay_guard_replay_burst_duplicates",
                "Duplicates absorbed by each replay burst after a reconnect (its count is the \
                 number of bursts, its sum the duplicates in all).",
                &BURST_BUCKETS,
            ),
            last_commit: register(
                &r,
                Gauge::with_opts(opts(
                    "replay_guard_last_commit_timestamp_seconds",
                    "Unix time of this process's last committed batch (0: none yet).",
                ))
                .expect(STATIC),
            ),
            unreachable: gauge(
                &r,
                "replay_guard_store_unreachable",
                "1 while the PostgreSQL store is unreachable (acknowledgements withheld).",
            ),
            sink_restarts: counter_vec(
                &r,
                "replay_guard_relay_sink_restarts_total",
                "Times a relay sink's task ended other than by a stop (a panic) and was \
                 restarted.",
                "sink",
            ),
            gap_events: counter_vec(
                &r,
                "replay_guard_upstream_gaps_total",
                "Upstream gaps this process reported: an applied sequence jumped past its \
                 source's high-water mark within an epoch and the sequences between were \
                 still missing a grace later, by agency.",
                "agency",
            ),
            gap_missing: counter_vec(
                &r,
                "replay_guard_upstream_missing_sequences_total",
                "Sequences missing in the upstream gaps this process reported, by agency.",
                "agency",
            ),
            sessions_lost: {
                let c = counter_vec(
                    &r,
                    "replay_guard_broker_sessions_lost_total",
                    "Connects answered without the session of a client id the store consumed \
                     under (what the broker queued for it is lost), by broker.",
                    "broker",
                );
                for b in &brokers {
                    c.with_label_values(&[b]);
                }
                c
            },
            registry: r,
        }))
    }

    /// An upstream gap of `missing` sequences in a source of `agency`.
    pub fn gap(&self, agency: &str, missing: u64) {
        self.0.gap_events.with_label_values(&[agency]).inc();
        // Saturating: prometheus' integer counter wraps, and one hostile jump must not
        // cancel a real loss.
        let c = self.0.gap_missing.with_label_values(&[agency]);
        c.inc_by(missing.min(u64::MAX - c.get()));
    }

    /// A broker session found lost at a connect to `broker`.
    pub fn session_lost(&self, broker: &str) {
        self.0.sessions_lost.with_label_values(&[broker]).inc();
    }

    /// A batch committed: its decisions and how long the commit took.
    pub fn committed(&self, counts: &OutcomeCounts, size: usize, at_ms: u64) {
        for (o, c) in &self.0.decisions {
            c.inc_by(counts.get(*o));
        }
        self.0.batch_size.observe(size as f64);
        self.0.last_commit.set(at_ms as f64 / 1000.0);
    }

    pub fn commit_took(&self, d: Duration) {
        self.0.commit_seconds.observe(d.as_secs_f64());
    }

    pub fn acks(&self, sent: u64, stale: u64) {
        self.0.acks_sent.inc_by(sent);
        self.0.acks_stale.inc_by(stale);
    }

    pub fn connected(&self, broker: &str, up: bool) {
        self.0
            .connected
            .with_label_values(&[broker])
            .set(i64::from(up));
    }

    pub fn connection_lost(&self, broker: &str) {
        self.connected(broker, false);
        self.0.lost.inc();
    }

    pub fn switched(&self) {
        self.0.switches.inc();
    }

    pub fn burst(&self, duplicates: u64) {
        self.0.burst_duplicates.observe(duplicates as f64);
    }

    /// A relay sink's task was restarted `n` times more (0: only make its series exist).
    pub fn sink_restarted(&self, sink: &str, n: u64) {
        self.0.sink_restarts.with_label_values(&[sink]).inc_by(n);
    }

    pub fn store_unreachable(&self, yes: bool) {
        self.0.unreachable.set(i64::from(yes));
    }

    fn families(&self) -> Vec<MetricFamily> {
        self.0.registry.gather()
    }
}

/// The store's readings as metric families: what `stats --format prometheus` prints and the
/// endpoint adds to each scrape.
pub fn store_families(r: &Readings) -> Vec<MetricFamily> {
    let reg = Registry::new();
    let set = |name: &str, help: &str, v: u64| {
        gauge(&reg, name, help).set(i64::try_from(v).unwrap_or(i64::MAX));
    };
    if let Some(counts) = &r.decisions {
        let c = counter_vec(
            &reg,
            "replay_guard_store_decisions_total",
            "Decisions recorded in the store since it was created, by outcome (every member \
             of a shared PostgreSQL store, and operators' resolutions).",
            "outcome",
        );
        for o in Outcome::ALL {
            c.with_label_values(&[o.as_str()]).inc_by(counts.get(o));
        }
    }
    set(
        "replay_guard_last_commit_age_seconds",
        "Seconds since the newest audit entry (before the first: since the store was created).",
        r.commit_age_s,
    );
    set(
        "replay_guard_window_entries",
        "Keys in the dedup window.",
        r.window_entries,
    );
    set(
        "replay_guard_window_max_entries",
        "[window] max_entries of the config read (the window's capacity).",
        r.window_max,
    );
    if let Some(age) = r.window_oldest_age_s {
        set(
            "replay_guard_window_oldest_age_seconds",
            "Age of the oldest key in the window (absent while the window is empty).",
            age,
        );
    }
    set(
        "replay_guard_quarantine_held",
        "Quarantined messages waiting for an operator.",
        r.quarantine_held,
    );
    set(
        "replay_guard_replay_bursts_recorded",
        "Replay bursts recorded in the store (duplicates absorbed after a reconnect).",
        r.bursts,
    );
    set(
        "replay_guard_replay_burst_duplicates_recorded",
        "Duplicates absorbed by all the recorded replay bursts.",
        r.burst_duplicates,
    );
    set(
        "replay_guard_upstream_gaps_recorded",
        "Upstream gaps recorded in the store since it was created (every writer's).",
        r.upstream_total.gap_events,
    );
    set(
        "replay_guard_upstream_missing_sequences_recorded",
        "Sequences missing in the recorded upstream gaps, when each was reported.",
        r.upstream_total.missing_sequences,
    );
    set(
        "replay_guard_upstream_missing_sequences_last_hour",
        "Sequences missing in the upstream gaps reported in the last hour.",
        r.upstream_1h.missing_sequences,
    );
    set(
        "replay_guard_broker_sessions_lost_recorded",
        "Broker sessions recorded lost (a connect without the session of a client id the \
         store consumed under) since the store was created.",
        r.upstream_total.sessions_lost,
    );
    set(
        "replay_guard_database_size_bytes",
        "Size of the redb file (PostgreSQL: of the schema's tables, indexes and TOAST).",
        r.database_bytes,
    );
    if let Some(d) = &r.disk {
        set(
            "replay_guard_disk_free_bytes",
            "Bytes available to replay-guard on the database file's file system.",
            d.available_bytes,
        );
        set(
            "replay_guard_disk_size_bytes",
            "Size of the database file's file system.",
            d.total_bytes,
        );
    }
    if !r.sinks.is_empty() {
        let lag = gauge_vec(
            &reg,
            "replay_guard_relay_lag_events",
            "Applied effects the sink has not delivered yet (behind the log's head).",
            "sink",
        );
        let age = gauge_vec(
            &reg,
            "replay_guard_relay_lag_seconds",
            "Age of the oldest effect the sink has not delivered (0 when caught up).",
            "sink",
        );
        let parked = gauge_vec(
            &reg,
            "replay_guard_relay_parked",
            "Events the sink parked for an operator (`relay parked`).",
            "sink",
        );
        let delivered = counter_vec(
            &reg,
            "replay_guard_relay_delivered_total",
            "Events the sink's receiver acknowledged since its cursor was made (rate() is the \
             last hop's throughput).",
            "sink",
        );
        let resent = counter_vec(
            &reg,
            "replay_guard_relay_resent_total",
            "Events the sink offered to its receiver again (after a failed attempt, a restart, a \
             kill -9 or a rewind), each under the same id: the receiver may hold them twice. An \
             upper bound.",
            "sink",
        );
        let failed = register(
            &reg,
            prometheus::GaugeVec::new(
                opts(
                    "replay_guard_relay_last_error_timestamp_seconds",
                    "Unix time of the sink's last failed attempt (absent if none failed).",
                ),
                &["sink"],
            )
            .expect(STATIC),
        );
        let failing = gauge_vec(
            &reg,
            "replay_guard_relay_sink_failing",
            "1 while the sink is failing (its task ended and is being restarted) or blocked \
             (its receiver refuses every event); its last error says which.",
            "sink",
        );
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for s in &r.sinks {
            failing
                .with_label_values(&[&s.name])
                .set(i64::from(s.failing.is_some()));
            lag.with_label_values(&[&s.name]).set(n(s.events));
            age.with_label_values(&[&s.name]).set(n(s.age_s));
            parked.with_label_values(&[&s.name]).set(n(s.parked));
            delivered.with_label_values(&[&s.name]).inc_by(s.delivered);
            resent.with_label_values(&[&s.name]).inc_by(s.resent);
            if let Some(at) = s.last_error_ms {
                failed.with_label_values(&[&s.name]).set(at as f64 / 1000.0);
            }
        }
    }
    reg.gather()
}

/// The families in the text format.
pub fn encode(families: &[MetricFamily]) -> String {
    let mut text = String::new();
    // Fails only on a family without metrics or with a mistyped one; ours are built above.
    if let Err(e) = TextEncoder::new().encode_utf8(families, &mut text) {
        tracing::error!(error = %e, "encoding the metrics failed: {e}");
    }
    text
}

/// One scrape: the service's metrics, then the store's (when it could be read), and whether
/// it could.
pub fn scrape(live: Option<&Metrics>, store: Option<&Readings>) -> String {
    let mut families = live.map(Metrics::families).unwrap_or_default();
    let reg = Registry::new();
    gauge(
        &reg,
        "replay_guard_store_readable",
        "1 if this scrape could read the store's gauges, else 0 (see the log).",
    )
    .set(i64::from(store.is_some()));
    families.extend(reg.gather());
    if let Some(r) = store {
        families.extend(store_families(r));
    }
    families.sort_by(|a, b| a.name().cmp(b.name()));
    encode(&families)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readings() -> Readings {
        Readings {
            commit_age_s: 4,
            decided: true,
            quarantined_1h: None,
            quarantine_held: 2,
            window_entries: 120,
            window_max: 1_000,
            window_oldest_age_s: Some(60),
            decisions: Some(OutcomeCounts::default()),
            bursts: 1,
            burst_duplicates: 7,
            upstream_total: crate::store::upstream::LossCounts {
                gap_events: 2,
                missing_sequences: 2001,
                sessions_lost: 1,
            },
            upstream_1h: crate::store::upstream::LossCounts::default(),
            database_bytes: 1 << 20,
            sinks: vec![crate::readings::SinkLag {
                name: "cop \"db\"".into(),
                events: 3,
                age_s: 9,
                parked: 1,
                delivered: 40,
                resent: 3,
                last_error_ms: Some(1_700_000_000_250),
                failing: None,
            }],
            disk: None,
        }
    }

    /// The value of the sample that starts with `series` (name and labels).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn a_scrape_holds_the_service_metrics_and_the_store_gauges_in_text_format() {
        let m = Metrics::new(["mqtt://127.0.0.1:1883", "mqtt://127.0.0.1:1884"]);
        let mut counts = OutcomeCounts::default();
        counts.add(Outcome::Applied);
        counts.add(Outcome::Applied);
        counts.add(Outcome::Duplicate);
        m.committed(&counts, 3, 1_700_000_000_500);
        m.commit_took(Duration::from_millis(3));
        m.acks(3, 0);
        m.connected("mqtt://127.0.0.1:1883", true);
        m.burst(5);
        m.gap("fire", 2000);
        m.gap("fire", 1);
        m.session_lost("mqtt://127.0.0.1:1884");
        let text = scrape(Some(&m), Some(&readings()));
        for (series, value) in [
            ("replay_guard_decisions_total{outcome=\"applied\"}", 2.0),
            ("replay_guard_decisions_total{outcome=\"duplicate\"}", 1.0),
            ("replay_guard_decisions_total{outcome=\"malformed\"}", 0.0),
            ("replay_guard_batch_size_count", 1.0),
            ("replay_guard_batch_size_sum", 3.0),
            ("replay_guard_commit_duration_seconds_count", 1.0),
            ("replay_guard_acks_total{result=\"sent\"}", 3.0),
            ("replay_guard_acks_total{result=\"stale\"}", 0.0),
            (
                "replay_guard_broker_connected{broker=\"mqtt://127.0.0.1:1883\"}",
                1.0,
            ),
            (
                "replay_guard_broker_connected{broker=\"mqtt://127.0.0.1:1884\"}",
                0.0,
            ),
            ("replay_guard_replay_burst_duplicates_sum", 5.0),
            ("replay_guard_upstream_gaps_total{agency=\"fire\"}", 2.0),
            (
                "replay_guard_upstream_missing_sequences_total{agency=\"fire\"}",
                2001.0,
            ),
            (
                "replay_guard_broker_sessions_lost_total{broker=\"mqtt://127.0.0.1:1883\"}",
                0.0,
            ),
            (
                "replay_guard_broker_sessions_lost_total{broker=\"mqtt://127.0.0.1:1884\"}",
                1.0,
            ),
            ("replay_guard_upstream_gaps_recorded", 2.0),
            ("replay_guard_upstream_missing_sequences_recorded", 2001.0),
            ("replay_guard_upstream_missing_sequences_last_hour", 0.0),
            ("replay_guard_broker_sessions_lost_recorded", 1.0),
            (
                "replay_guard_last_commit_timestamp_seconds",
                1_700_000_000.5,
            ),
            ("replay_guard_store_readable", 1.0),
            ("replay_guard_window_entries", 120.0),
            ("replay_guard_window_oldest_age_seconds", 60.0),
            (
                "replay_guard_relay_lag_events{sink=\"cop \\\"db\\\"\"}",
                3.0,
            ),
            ("replay_guard_relay_parked{sink=\"cop \\\"db\\\"\"}", 1.0),
            (
                "replay_guard_relay_delivered_total{sink=\"cop \\\"db\\\"\"}",
                40.0,
            ),
            (
                "replay_guard_relay_last_error_timestamp_seconds{sink=\"cop \\\"db\\\"\"}",
                1_700_000_000.25,
            ),
            (
                "replay_guard_store_decisions_total{outcome=\"applied\"}",
                0.0,
            ),
        ] {
            assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
        }
        assert!(text.contains("# TYPE replay_guard_decisions_total counter\n"));
        assert!(text.contains("# TYPE replay_guard_commit_duration_seconds histogram\n"));
        // Format 0.0.4, not OpenMetrics: node_exporter's textfile collector rejects these.
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"));
    }

    #[test]
    fn an_unreadable_store_is_a_zero_and_leaves_its_gauges_out() {
        let text = scrape(Some(&Metrics::new([])), None);
        assert_eq!(sample(&text, "replay_guard_store_readable"), Some(0.0));
        assert!(!text.contains("replay_guard_window_entries"));
    }
}
