//! Losses upstream of replay-guard are loud once confirmed: a real Mosquitto at its stock
//! `max_queued_messages` drops most of a backlog queued for `run`'s session, and the gap
//! still missing after `[feed] gap_grace_ms` is a warning naming the source, epoch and range,
//! a metric, a `health` check and a `stats` total; a feed that merely reorders is none of
//! these (nor are members of a shared subscription on PostgreSQL committing each other's
//! sequences out of order), and a gap half filled within the grace reports only the rest; a
//! drain confirms what still waits, a `kill -9` loses only that. A broker restarted
//! without persistence answers `run`'s reconnect without its session, and that is a warning,
//! a metric and a `health` check too. A fresh store's first connect, and a restart that finds
//! the session kept, are not. The record is the same on redb and PostgreSQL.

use std::path::Path;
use std::time::Duration;

use replay_guard::model::Outcome;
use replay_guard::store::postgres::{PgConfig, PgStore};
use replay_guard::store::upstream::{ConsumedAs, ReportedGap};
use replay_guard::store::{Backend, Incoming, Reader, Store, StoreOptions};
use replay_guard::wire::FeedContract;

use super::broker::{Broker, free_port};
use super::common;
use super::metrics::{eventually, scrape, value};
use super::pg::PgDb;
use super::service::Consumer;

const LIMIT: Duration = Duration::from_secs(30);

/// A consumer of `broker` whose metrics endpoint listens on the port returned, and whose
/// gap candidates wait `grace_ms`.
fn consumer(dir: &Path, broker: &str, client_id: &str, grace_ms: u64) -> (Consumer, u16) {
    let c = Consumer::new(dir, &[broker.to_string()], "v5", client_id);
    let port = free_port();
    let mut config = std::fs::read_to_string(&c.config).unwrap();
    config +=
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n[feed]\ngap_grace_ms = {grace_ms}\n");
    std::fs::write(&c.config, config).unwrap();
    (c, port)
}

/// Sequences `seqs` of fire/engine-7, epoch 3.
fn engine7(seqs: std::ops::RangeInclusive<u64>) -> Vec<String> {
    seqs.map(|q| common::msg("fire", "engine-7", 3, q, "position"))
        .collect()
}

/// Sequences `seqs`, in this order, of fire/`source`, epoch 3.
fn of(source: &str, seqs: &[u64]) -> Vec<String> {
    seqs.iter()
        .map(|q| common::msg("fire", source, 3, *q, "position"))
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
    let (mut c, port) = consumer(dir.path(), &broker.url(), "rg-gap", 200);
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
    // sequence arrives, and then only once the grace has passed without the rest.
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
fn a_reordered_feed_is_no_gap_and_a_half_filled_one_reports_only_what_is_still_missing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("b"), false);
    let (mut c, port) = consumer(dir.path(), &broker.url(), "rg-reorder", 1_000);
    c.start();
    c.wait_subscribed();
    // engine-7 arrives reordered but whole; engine-9's 6..=9 never come. One publisher on one
    // topic: the order is kept, and all of it arrives well within the grace.
    let mut lines = of("engine-7", &[1, 3, 2, 4, 5, 6, 7, 8, 9, 10]);
    lines.extend(of("engine-9", &[1, 10, 2, 3, 4, 5]));
    broker.publish_lines("incidents/fire", &lines, "pub-reorder");
    c.wait_applied(16, LIMIT);
    let warning = "upstream gap: fire/engine-9 epoch 3 missing 6-9 (4 sequences)";
    c.wait_log(warning, LIMIT);
    // engine-7's candidate fell due first: had it been reported, it would be in the log now.
    let log = c.log_since_start();
    assert_eq!(log.matches("upstream gap:").count(), 1, "{log}");
    eventually(LIMIT, "the gap counters", || {
        let s = scrape(port).1;
        let got = (
            value(&s, "replay_guard_upstream_gaps_total{agency=\"fire\"}"),
            value(
                &s,
                "replay_guard_upstream_missing_sequences_total{agency=\"fire\"}",
            ),
            value(&s, "replay_guard_upstream_missing_sequences_recorded"),
        );
        (got == (1.0, 4.0, 4.0), got)
    });
    let (_, out) = command(&["stats", "--format", "json"], &c.config);
    assert!(
        out.contains("\"upstream_losses\":{\"gap_events\":1,\"missing_sequences\":4,"),
        "{out}"
    );
    assert!(
        out.contains(
            "\"source_id\":\"engine-9\",\"epoch\":3,\"missing_from\":6,\"missing_to\":9}]"
        ),
        "{out}"
    );
    assert_eq!(c.stop(LIMIT), Some(0));

    // A candidate still within a long grace is confirmed when `run` drains, before the store
    // closes.
    let config = std::fs::read_to_string(&c.config).unwrap();
    std::fs::write(
        &c.config,
        config.replace("gap_grace_ms = 1000", "gap_grace_ms = 600000"),
    )
    .unwrap();
    c.start();
    c.wait_subscribed();
    broker.publish_lines("incidents/fire", &of("engine-7", &[20]), "pub-reorder");
    c.wait_applied(17, LIMIT);
    assert!(!c.log_since_start().contains("upstream gap:"));
    assert_eq!(c.stop(LIMIT), Some(0));
    let log = c.log_since_start();
    assert!(
        log.contains("upstream gap: fire/engine-7 epoch 3 missing 11-19 (9 sequences)"),
        "{log}"
    );

    // A `kill -9` loses the candidates only: nothing is recorded of 21..=29, and `gaps`
    // still shows them.
    c.start();
    c.wait_subscribed();
    broker.publish_lines("incidents/fire", &of("engine-7", &[30]), "pub-reorder");
    c.wait_applied(18, LIMIT);
    c.kill9();
    // The file needs crash recovery first (an open that decides nothing).
    let out = common::run(&["ingest", "--db", c.db.to_str().unwrap(), "/dev/null"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let (_, out) = command(&["stats", "--format", "json"], &c.config);
    assert!(
        out.contains("\"upstream_losses\":{\"gap_events\":2,\"missing_sequences\":13,"),
        "{out}"
    );
    let (code, out) = command(&["gaps", "--source", "fire/engine-7"], &c.config);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("\"missing_from\":21,\"missing_to\":29,\"missing_count\":9}"),
        "{out}"
    );
}

#[test]
fn ingest_reports_only_what_is_still_missing_at_the_end_of_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("i.redb");
    // engine-7 reorders but is whole by the end; engine-9 jumps to 10 and gets 2..=5 later.
    let mut lines = of("engine-7", &[1, 3, 4, 2, 6, 5]);
    lines.extend(of("engine-9", &[1, 10]));
    lines.extend(of("engine-7", &[7, 8]));
    lines.extend(of("engine-9", &[2, 3, 4, 5]));
    let input = lines.join("\n") + "\n";
    let out = common::run_with_stdin(
        &["ingest", "--db", db.to_str().unwrap(), "-"],
        input.as_bytes(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(err.matches("upstream gap:").count(), 1, "{err}");
    assert!(
        err.contains("upstream gap: fire/engine-9 epoch 3 missing 6-9 (4 sequences)"),
        "{err}"
    );
    assert!(
        err.contains("  upstream gaps 1 (4 sequences missing: see the warnings above, or `gaps`)"),
        "{err}"
    );
    let out = common::run(&["stats", "--format", "json", "--db", db.to_str().unwrap()]);
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(
        json.contains("\"upstream_losses\":{\"gap_events\":1,\"missing_sequences\":4,"),
        "{json}"
    );
}

#[test]
fn a_hostile_jump_near_2_64_never_cancels_a_real_loss() {
    // fire/forged jumps from 0 to 2^64 - 999: a gap of 2^64 - 1,000 sequences; with a real
    // loss of 1,000 in engine-7, a plain u64 sum wraps to 0 and every verdict read "nothing
    // missing". The totals saturate instead, and the jump is called implausible.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("i.redb");
    let db = db.to_str().unwrap();
    let mut lines = of("forged", &[0, u64::MAX - 998]);
    lines.extend(of("engine-7", &[1, 1002]));
    let input = lines.join("\n") + "\n";
    let out = common::run_with_stdin(&["ingest", "--db", db, "-"], input.as_bytes());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("missing 2-1001 (1000 sequences)"), "{err}");
    assert!(
        err.contains("an implausible jump (over 4294967296 sequences)"),
        "{err}"
    );
    assert!(
        err.contains("upstream gaps 2 (18446744073709551615 sequences missing"),
        "{err}"
    );
    let out = common::run(&["stats", "--format", "json", "--db", db]);
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(
        json.contains("\"gap_events\":2,\"missing_sequences\":18446744073709551615,"),
        "{json}"
    );
    let out = common::run(&["health", "--db", db]);
    let line = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{line}");
    assert!(
        line.contains("18446744073709551615 sequences missing upstream in the last hour"),
        "{line}"
    );
    let out = common::run(&["report", "--db", db, "--format", "json", "-o", "-"]);
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(json.contains("\"verdict\":\"missing\""), "{json}");
    assert!(json.contains("an implausible jump"), "{json}");
}

#[test]
fn ingest_checks_a_gap_before_the_window_evicts_it_and_warns_what_it_could_not_check() {
    // A window of 200 entries, batches of 50: engine-7 jumps 1 -> 3, then 1,000 more lines
    // pass (a long capture: the window evicts 1 and 3 long before the end of the input).
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "[window]\nmax_entries = 200\n[commit]\nmax_batch = 50\n",
    )
    .unwrap();
    let ingest = |db: &str, lines: &[String]| {
        let input = lines.join("\n") + "\n";
        let out = common::run_with_stdin(
            &[
                "ingest",
                "--config",
                config.to_str().unwrap(),
                "--db",
                db,
                "-",
            ],
            input.as_bytes(),
        );
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "{err}");
        err
    };
    let mut lines = of("engine-7", &[1, 3]);
    lines.extend(engine7(4..=1003));
    let db = dir.path().join("a.redb");
    let err = ingest(db.to_str().unwrap(), &lines);
    assert!(
        err.contains("upstream gap: fire/engine-7 epoch 3 missing 2-2 (1 sequences)")
            && err.contains("  upstream gaps 1 (1 sequences missing"),
        "checked while the window still held 1 and 3: {err}"
    );
    assert!(!err.contains("possible upstream gap"), "{err}");

    // One batch larger than the window: 1 and 3 are evicted in the commit that saw the jump.
    // What can no longer be told is warned, not counted.
    std::fs::write(
        &config,
        "[window]\nmax_entries = 20\n[commit]\nmax_batch = 1000\n",
    )
    .unwrap();
    let db = dir.path().join("b.redb");
    let err = ingest(db.to_str().unwrap(), &lines[..200]);
    assert!(
        err.contains("possible upstream gap: fire/engine-7 epoch 3 2-2 was missing when a later sequence was applied, and the window evicted those positions before it was checked"),
        "{err}"
    );
    assert!(!err.contains("  upstream gaps"), "{err}");
    assert!(
        err.contains("  possible upstream gaps 1 (1 sequences the window no longer held"),
        "the summary counts what it could not check: {err}"
    );
    let out = common::run(&["gaps", "--db", db.to_str().unwrap()]);
    let gaps = String::from_utf8_lossy(&out.stdout);
    assert!(
        gaps.contains("\"missing_from\":2,\"missing_to\":2"),
        "{gaps}"
    );
}

#[test]
fn members_of_a_shared_subscription_fill_each_others_jumps_and_warn_only_a_real_gap() {
    let pg_db = PgDb::new("upshare");
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("b"), false);
    let config = |client_id: &str| {
        format!(
            "[store]\nbackend = \"postgres\"\ndsn = {:?}\nschema = \"replay_guard\"\n\
             [mqtt]\nbrokers = [{:?}]\nclient_id = {client_id:?}\ntopics = [\"incidents/#\"]\n\
             share_group = \"g\"\nretries_per_broker = 2\nbackoff_initial_ms = 50\n\
             backoff_max_ms = 200\n[commit]\nmax_batch = 50\nlinger_ms = 5\n\
             [feed]\ngap_grace_ms = 5000\n",
            pg_db.dsn(),
            broker.url()
        )
    };
    let mut members = [
        Consumer::with_config(dir.path(), "m1", &config("rg-m1")),
        Consumer::with_config(dir.path(), "m2", &config("rg-m2")),
    ];
    for m in &mut members {
        m.start();
        m.wait_subscribed();
    }
    let effects = || {
        let cfg = PgConfig::parse(&pg_db.dsn(), "replay_guard").unwrap();
        Reader::postgres(cfg)
            .ok()
            .and_then(|(_, snap)| snap.meta().ok())
            .map_or(0, |m| m.next_effect)
    };
    // The broker deals engine-7's 1..=400 out to both members in turn: each commits jumps
    // the other fills (with a grace of 0 this warns dozens of times).
    broker.publish_lines("incidents/fire", &engine7(1..=400), "pub-share");
    common::wait_until("400 effects", LIMIT, || effects() == 400);
    // engine-9's 2..=4 never come.
    broker.publish_lines("incidents/fire", &of("engine-9", &[1]), "pub-share");
    common::wait_until("401 effects", LIMIT, || effects() == 401);
    broker.publish_lines("incidents/fire", &of("engine-9", &[5]), "pub-share");
    common::wait_until("402 effects", LIMIT, || effects() == 402);
    // Draining confirms whatever still waits: after it, every candidate was checked.
    for m in &mut members {
        assert_eq!(m.stop(LIMIT), Some(0), "{}", m.log_text());
    }
    let logs: String = members.iter().map(|m| m.log_text()).collect();
    let late = scan_late(&pg_db.dsn());
    assert!(
        late > 0,
        "the members did interleave (else this proves nothing)"
    );
    assert_eq!(
        logs.matches("upstream gap:").count(),
        1,
        "{late} late; {logs}"
    );
    assert!(
        logs.contains("upstream gap: fire/engine-9 epoch 3 missing 2-4 (3 sequences)"),
        "{logs}"
    );
    let cfg = PgConfig::parse(&pg_db.dsn(), "replay_guard").unwrap();
    let (_, snap) = Reader::postgres(cfg).unwrap();
    let rec = snap.upstream_losses().unwrap();
    assert_eq!((rec.gap_events, rec.missing_sequences), (1, 3));
}

/// How many deliveries of the shared schema were decided `applied_late`.
fn scan_late(dsn: &str) -> u64 {
    let cfg = PgConfig::parse(dsn, "replay_guard").unwrap();
    let (_, snap) = Reader::postgres(cfg).unwrap();
    snap.counters()
        .unwrap()
        .map_or(0, |c| c.get(Outcome::AppliedLate))
}

#[test]
fn a_broker_restarted_without_its_sessions_is_a_lost_session_warned_counted_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    let bdir = dir.path().join("b");
    let mut broker = Broker::start(&bdir, false);
    let port_b = broker.port;
    let (mut c, port) = consumer(dir.path(), &broker.url(), "rg-lost", 200);
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
    let batch = |source: &str, seqs: &[u64]| -> Vec<Incoming> {
        of(source, seqs)
            .into_iter()
            .map(|l| Incoming::decode("incidents/fire", l.into_bytes(), t0, &contract))
            .collect()
    };
    for mut store in [Backend::Redb(redb), Backend::Postgres(pg)] {
        let commit = |store: &mut Backend, source: &str, seqs: &[u64]| {
            store.commit_batch(&batch(source, seqs), t0).unwrap().gaps
        };
        assert_eq!(
            store.note_connect("mqtt://b", "rg", false, t0).unwrap(),
            None
        );
        store.consume_as(ConsumedAs {
            client_id: "rg".into(),
            broker: "mqtt://b".into(),
        });
        // Reordered: 3 before 2 opens a candidate that 2 fills.
        let mut candidates = commit(&mut store, "engine-7", &[1, 3]);
        assert_eq!(ranges(&candidates), [("engine-7", 2, 2)]);
        assert!(commit(&mut store, "engine-7", &[2, 4, 5, 6, 7, 8, 9, 10]).is_empty());
        // Half filled: 10 opens 2..=9, of which 2..=5 arrive.
        candidates.extend(commit(&mut store, "engine-9", &[1, 10]));
        assert!(commit(&mut store, "engine-9", &[2, 3, 4, 5]).is_empty());
        // A wide one, read as ranges: 2..=1_000_001 with 2 and 3 present.
        candidates.extend(commit(&mut store, "engine-11", &[1, 1_000_002, 3, 2]));
        // Around 2^63, where PostgreSQL's bigint turns negative: 2^63 fills the middle.
        const HALF: u64 = 1 << 63;
        candidates.extend(commit(&mut store, "engine-13", &[HALF - 2, HALF + 2, HALF]));
        assert_eq!(
            ranges(&candidates),
            [
                ("engine-7", 2, 2),
                ("engine-9", 2, 9),
                ("engine-11", 2, 1_000_001),
                ("engine-13", HALF - 1, HALF + 1)
            ]
        );
        let before = store.reader().unwrap().upstream_losses().unwrap();
        assert_eq!(before.gap_events, 0, "candidates are not recorded");
        let check = store.confirm_gaps(&candidates, t0 + 5).unwrap();
        assert!(check.unknown.is_empty(), "{:?}", check.unknown);
        assert_eq!(
            ranges(&check.missing),
            [
                ("engine-9", 6, 9),
                ("engine-11", 4, 1_000_001),
                ("engine-13", HALF - 1, HALF - 1),
                ("engine-13", HALF + 1, HALF + 1)
            ]
        );
        // Nothing left to confirm: nothing reported, nothing written.
        assert!(
            store
                .confirm_gaps(&candidates[..1], t0 + 6)
                .unwrap()
                .missing
                .is_empty()
        );
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
            (4, 4 + 999_998 + 2, 1)
        );
        let hour = rec.last_hour(t0 + 5);
        assert_eq!((hour.missing_sequences, hour.sessions_lost), (1_000_004, 1));
        assert_eq!(rec.consumers.len(), 1);
        assert_eq!(rec.recent_gaps.len(), 4);
        assert_eq!(
            (
                rec.recent_gaps[0].from,
                rec.recent_gaps[0].to,
                rec.recent_gaps[0].at_ms
            ),
            (6, 9, t0 + 5)
        );
        store.close().unwrap();
    }
}

/// Each gap's (source_id, first, last missing sequence).
fn ranges(gaps: &[ReportedGap]) -> Vec<(&str, u64, u64)> {
    gaps.iter()
        .map(|g| (g.source_id.as_str(), g.gap.from, g.gap.to))
        .collect()
}
