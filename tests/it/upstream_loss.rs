//! Losses upstream of replay-guard are loud at once: a real Mosquitto at its stock
//! `max_queued_messages` drops most of a backlog queued for `run`'s session, and the gap is a
//! warning naming the source, epoch and range, a metric, a `health` check and a `stats`
//! total; a broker restarted without persistence answers `run`'s reconnect without its
//! session, and that is a warning, a metric and a `health` check too. A fresh store's first
//! connect, and a restart that finds the session kept, are not. The record is the same on
//! redb and PostgreSQL.

use std::path::Path;
use std::time::Duration;

use replay_guard::store::postgres::{PgConfig, PgStore};
use replay_guard::store::upstream::ConsumedAs;
use replay_guard::store::{Backend, Incoming, Store, StoreOptions};
use replay_guard::wire::FeedContract;

use super::broker::{Broker, free_port};
use super::common;
use super::metrics::{eventually, scrape, value};
use super::pg::PgDb;
use super::service::Consumer;

const LIMIT: Duration = Duration::from_secs(30);

/// A consumer of `broker` whose metrics endpoint listens on the port returned.
fn consumer(dir: &Path, broker: &str, client_id: &str) -> (Consumer, u16) {
    let c = Consumer::new(dir, &[broker.to_string()], "v5", client_id);
    let port = free_port();
    let mut config = std::fs::read_to_string(&c.config).unwrap();
    config += &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    std::fs::write(&c.config, config).unwrap();
    (c, port)
}

/// Sequences `seqs` of fire/engine-7, epoch 3.
fn engine7(seqs: std::ops::RangeInclusive<u64>) -> Vec<String> {
    seqs.map(|q| common::msg("fire", "engine-7", 3, q, "position"))
        .collect()
}

/// `replay-guard ARGS --config CONFIG`: exit code and stdout.
fn command(args: &[&str], config: &Path) -> (i32, String) {
    let mut all = args.to_vec();
    all.extend(["--config", config.to_str().unwrap()]);
    let out = common::run(&all);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn a_backlog_the_broker_dropped_is_warned_counted_and_checked_once_a_later_sequence_comes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start_stock(&dir.path().join("b"), false);
    let (mut c, port) = consumer(dir.path(), &broker.url(), "rg-gap");
    // The persistent session is made, then `run` is away while the producer sends 3,000.
    c.start();
    c.wait_subscribed();
    assert_eq!(c.stop(LIMIT), Some(0));
    assert!(
        !c.log_text().contains("session lost"),
        "a fresh store's first connect is no loss:\n{}",
        c.log_text()
    );
    broker.publish_lines("incidents/fire", &engine7(1..=3_000), "pub-gap");

    c.start();
    c.wait_applied(1_000, LIMIT);
    // The broker delivered what its queue held; nothing says more is missing until a later
    // sequence arrives.
    broker.publish_lines("incidents/fire", &engine7(3_001..=3_001), "pub-gap");
    c.wait_applied(1_001, LIMIT);
    let warning = "upstream gap: fire/engine-7 epoch 3 missing 1001-3000 (2000 sequences)";
    c.wait_log(warning, LIMIT);
    let log = c.log_since_start();
    let line = log.lines().find(|l| l.contains(warning)).unwrap();
    assert!(line.contains("WARN"), "{line}");
    for field in ["outcome=\"gap\"", "missing_from=1001", "missing_to=3000"] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert_eq!(log.matches("upstream gap:").count(), 1, "{log}");
    assert!(
        !log.contains("session lost"),
        "the session was kept:\n{log}"
    );

    eventually(LIMIT, "the gap counters", || {
        let s = scrape(port).1;
        let got = (
            value(&s, "replay_guard_upstream_gaps_total{agency=\"fire\"}"),
            value(
                &s,
                "replay_guard_upstream_missing_sequences_total{agency=\"fire\"}",
            ),
            value(&s, "replay_guard_upstream_missing_sequences_recorded"),
            value(&s, "replay_guard_upstream_missing_sequences_last_hour"),
        );
        (got == (1.0, 2_000.0, 2_000.0, 2_000.0), got)
    });

    let (code, out) = command(&["health", "--crit-gaps", "1"], &c.config);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.starts_with(
            "REPLAY-GUARD CRITICAL - 2000 sequences missing upstream in the last hour (1 gaps) \
             (CRITICAL 1)"
        ),
        "{out}"
    );
    assert!(out.contains(" upstream_missing_1h=2000;0;1;0 "), "{out}");
    let (code, out) = command(&["health"], &c.config);
    assert_eq!(code, 2, "2000 is past the default critical bound: {out}");
    assert!(out.contains("(1 gaps) (CRITICAL 1000)"), "{out}");
    let (code, out) = command(&["health", "--crit-gaps", "5000"], &c.config);
    assert_eq!(code, 1, "any missing sequence warns by default: {out}");

    let (code, out) = command(&["stats", "--format", "json"], &c.config);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(
            "\"upstream_losses\":{\"gap_events\":1,\"missing_sequences\":2000,\
             \"sessions_lost\":0,\"last_hour\":{\"gap_events\":1,\"missing_sequences\":2000,\
             \"sessions_lost\":0},\"recent_gaps\":[{\"at\":"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "\"agency\":\"fire\",\"source_id\":\"engine-7\",\"epoch\":3,\"missing_from\":1001,\
             \"missing_to\":3000}]"
        ),
        "{out}"
    );
    let (_, text) = command(&["stats"], &c.config);
    assert!(
        text.contains("upstream loss  1 gaps (2000 sequences missing), 0 broker sessions lost"),
        "{text}"
    );
    assert_eq!(c.stop(LIMIT), Some(0));
}

#[test]
fn a_broker_restarted_without_its_sessions_is_a_lost_session_warned_counted_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let bdir = dir.path().join("b");
    let mut broker = Broker::start(&bdir, false);
    let port_b = broker.port;
    let (mut c, port) = consumer(dir.path(), &broker.url(), "rg-lost");
    c.start();
    c.wait_subscribed();
    broker.publish_lines("incidents/fire", &engine7(1..=5), "pub-lost");
    c.wait_applied(5, LIMIT);
    assert!(
        !c.log_text().contains("session lost"),
        "a fresh store's first connect is no loss:\n{}",
        c.log_text()
    );

    // The broker restarts on the same port with no persistence: every session is gone.
    let mark = c.log_text().len();
    broker.stop();
    let broker = Broker::start_on(&bdir, port_b, false);
    let warning = format!(
        "broker session lost: {} answered the connect of client id rg-lost without the session",
        broker.url()
    );
    c.wait_log(&warning, LIMIT);
    let log = c.log_since_start();
    let line = log.lines().find(|l| l.contains(&warning)).unwrap();
    assert!(
        line.contains("WARN") && line.contains("outcome=\"session_lost\""),
        "{line}"
    );
    // It resubscribes and the feed flows on.
    common::wait_subscribed(c.log_path(), mark, "");
    broker.publish_lines("incidents/fire", &engine7(6..=8), "pub-lost");
    c.wait_applied(8, LIMIT);

    let series = format!(
        "replay_guard_broker_sessions_lost_total{{broker=\"{}\"}}",
        broker.url()
    );
    eventually(LIMIT, "the session-lost counters", || {
        let s = scrape(port).1;
        let got = (
            value(&s, &series),
            value(&s, "replay_guard_broker_sessions_lost_recorded"),
        );
        (got == (1.0, 1.0), got)
    });
    let (code, out) = command(&["health"], &c.config);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.starts_with(
            "REPLAY-GUARD WARNING - 1 broker sessions lost in the last hour (WARNING 0)"
        ),
        "{out}"
    );
    let (code, out) = command(&["health", "--crit-sessions-lost", "0"], &c.config);
    assert_eq!(code, 2, "{out}");
    let (_, out) = command(&["stats", "--format", "json"], &c.config);
    assert!(out.contains("\"sessions_lost\":1,"), "{out}");
    assert!(
        out.contains(&format!(
            "\"broker\":\"{}\",\"client_id\":\"rg-lost\"}}]",
            broker.url()
        )),
        "{out}"
    );

    // Restarted against the broker that kept its session now: no loss.
    assert_eq!(c.stop(LIMIT), Some(0));
    c.start();
    c.wait_subscribed();
    broker.publish_lines("incidents/fire", &engine7(9..=9), "pub-lost");
    c.wait_applied(9, LIMIT);
    assert!(
        !c.log_since_start().contains("session lost"),
        "{}",
        c.log_since_start()
    );
    assert_eq!(c.stop(LIMIT), Some(0));
}

#[test]
fn gaps_and_lost_sessions_are_recorded_alike_on_redb_and_postgres() {
    let pg_db = PgDb::new("upstream");
    let dir = tempfile::tempdir().unwrap();
    let t0 = 1_800_000_000_000;
    let redb = Store::open(&dir.path().join("a.redb"), StoreOptions::default(), t0).unwrap();
    let cfg = PgConfig::parse(&pg_db.dsn(), "replay_guard").unwrap();
    let pg = PgStore::open(cfg, StoreOptions::default(), t0).unwrap();
    let contract = FeedContract::default();
    for mut store in [Backend::Redb(redb), Backend::Postgres(pg)] {
        let batch = |seqs: &[u64]| -> Vec<Incoming> {
            engine7_seqs(seqs)
                .into_iter()
                .map(|l| Incoming::decode("incidents/fire", l.into_bytes(), t0, &contract))
                .collect()
        };
        assert_eq!(
            store.note_connect("mqtt://b", "rg", false, t0).unwrap(),
            None
        );
        store.consume_as(ConsumedAs {
            client_id: "rg".into(),
            broker: "mqtt://b".into(),
        });
        assert!(
            store
                .commit_batch(&batch(&[1, 2]), t0)
                .unwrap()
                .gaps
                .is_empty()
        );
        let gaps = store.commit_batch(&batch(&[10, 4, 12]), t0).unwrap().gaps;
        let got: Vec<(u64, u64, u64)> = gaps
            .iter()
            .map(|g| (g.gap.epoch, g.gap.from, g.gap.to))
            .collect();
        // 4 (below 10) is applied late and opens nothing; 12 opens 11.
        assert_eq!(got, vec![(3, 3, 9), (3, 11, 11)]);
        assert!(
            store
                .note_connect("mqtt://b", "rg", true, t0)
                .unwrap()
                .is_none()
        );
        let loss = store.note_connect("mqtt://b", "rg", false, t0 + 1).unwrap();
        assert_eq!(loss.map(|l| l.client_id), Some("rg".to_string()));
        let rec = store.reader().unwrap().upstream_losses().unwrap();
        assert_eq!(
            (rec.gap_events, rec.missing_sequences, rec.sessions_lost),
            (2, 8, 1)
        );
        let hour = rec.last_hour(t0 + 1);
        assert_eq!((hour.missing_sequences, hour.sessions_lost), (8, 1));
        assert_eq!(rec.consumers.len(), 1);
        assert_eq!(rec.recent_gaps.len(), 2);
        store.close().unwrap();
    }
}

fn engine7_seqs(seqs: &[u64]) -> Vec<String> {
    seqs.iter()
        .map(|q| common::msg("fire", "engine-7", 3, *q, "position"))
        .collect()
}
