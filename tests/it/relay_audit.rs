//! The audit stream through the real binary: sinks with `stream = "audit"` deliver every
//! audit entry (duplicates, quarantines, relay actions) as an `org.replay-guard.decision.v1`
//! event: `run` fed through a private Mosquitto and killed with -9 mid-delivery (each entry
//! arrives, first arrivals in index order, a redelivery under the same id with the same
//! content, the chain links continuous, `outcomes` honoured); retention of the audit log held
//! by an audit sink and released once it delivered; parking and `relay retry` rebuilt from
//! the entry; `relay rewind` with the same ids; a stream change refused; `verify` and `relay
//! status` with audit sinks; the same on a PostgreSQL store with the postgres sink.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use replay_guard::json::{self, Json};

use super::broker::Broker;
use super::common;
use super::pg::PgDb;
use super::relay::{Setup, field, mqtt_section, setup, stdout, stop};

/// The audit log as `dump-audit` prints it (jsonl), in index order.
fn audit_log(config: &Path) -> Vec<Json> {
    stdout(&common::run(&[
        "dump-audit",
        "--config",
        config.to_str().unwrap(),
    ]))
    .lines()
    .map(|l| json::parse(l.as_bytes(), 64).unwrap())
    .collect()
}

fn member<'a>(v: &'a Json, name: &str) -> &'a Json {
    match v {
        Json::Object(m) => &m.iter().find(|(k, _)| k == name).unwrap().1,
        other => panic!("not an object: {other:?}"),
    }
}

/// The event id an audit entry (as `dump-audit` prints it) gets.
fn entry_id(entry: &Json) -> String {
    format!("{}-{}", field(entry, "index"), &field(entry, "hash")[..16])
}

/// Events in arrival order from a file of JSON lines (complete lines only).
fn arrivals(path: &Path) -> Vec<Json> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |i| &text[..i]);
    complete
        .lines()
        .map(|l| json::parse(l.as_bytes(), 64).unwrap())
        .collect()
}

/// What an audit sink received (`got`, arrival order, repeats included) against the audit
/// log: exactly the entries `selected` keeps arrived; the first arrivals in index order;
/// every arrival of an id is the same event; `data` is the entry as `dump-audit` prints it;
/// each entry's chain link is the log's (and, for a sink that selects every entry,
/// continuous from one arrival to the next). Returns how many arrivals were repeats.
fn assert_audit_delivered(
    got: &[Json],
    log: &[Json],
    selected: impl Fn(&str) -> bool,
    source: &str,
) -> usize {
    let want: Vec<&Json> = log
        .iter()
        .filter(|e| selected(&field(e, "outcome")))
        .collect();
    let mut first: Vec<String> = Vec::new();
    let mut by_id: BTreeMap<String, String> = BTreeMap::new();
    for ev in got {
        let id = field(ev, "id");
        let whole = ev.to_compact();
        match by_id.get(&id) {
            Some(before) => assert_eq!(before, &whole, "id {id} arrived with two contents"),
            None => {
                by_id.insert(id.clone(), whole);
                first.push(id);
            }
        }
    }
    let want_ids: Vec<String> = want.iter().map(|e| entry_id(e)).collect();
    assert_eq!(
        first, want_ids,
        "the first arrivals are not the selected entries in index order"
    );
    let mut prev_hash: Option<String> = None;
    for (entry, id) in want.iter().zip(&want_ids) {
        let ev = json::parse(by_id[id].as_bytes(), 64).unwrap();
        assert_eq!(field(&ev, "type"), "org.replay-guard.decision.v1");
        assert_eq!(field(&ev, "specversion"), "1.0");
        assert_eq!(field(&ev, "source"), source);
        assert_eq!(field(&ev, "rgindex"), field(entry, "index"));
        assert_eq!(field(&ev, "rgoutcome"), field(entry, "outcome"));
        assert_eq!(field(&ev, "time"), field(entry, "recorded_at"));
        assert_eq!(
            member(&ev, "data"),
            *entry,
            "data is not the dump-audit line"
        );
        if let Some(p) = &prev_hash {
            assert_eq!(&field(entry, "prev_hash"), p, "chain broken before {id}");
        }
        if want.len() == log.len() {
            prev_hash = Some(field(entry, "hash"));
        }
    }
    got.len() - first.len()
}

/// A second exec sink `siem` in `dir`, of the audit stream, selecting `outcomes`; it writes
/// what it gets to `siem.jsonl`.
fn siem_sink(dir: &Path, outcomes: &str) -> (String, PathBuf) {
    let out = dir.join("siem.jsonl");
    let script = dir.join("siem.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\ncat >> {:?}\n", out.to_str().unwrap()),
    )
    .unwrap();
    (
        format!(
            "[[sink]]\nname = \"siem\"\nkind = \"exec\"\ncommand = [\"/bin/sh\", {:?}]\n\
             stream = \"audit\"\noutcomes = {outcomes}\nbackoff_initial_ms = 10\n\
             backoff_max_ms = 40\n",
            script.to_str().unwrap()
        ),
        out,
    )
}

fn status_of(s: &Setup, config: &Path, sink: &str) -> Json {
    s.status(config)[sink].clone()
}

fn accounted(st: &Json, what: &str) -> String {
    field(member(st, "accounting"), what)
}

#[test]
fn run_delivers_every_audit_entry_once_in_order_with_stable_ids_through_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let (siem, siem_out) = siem_sink(dir.path(), r#"["duplicate", "conflict", "malformed"]"#);
    let s = setup(
        dir.path(),
        "sleep 0.05\ncat >> \"$OUT\"",
        "stream = \"audit\"\nbatch_max = 5",
        &format!("{}{siem}", mqtt_section(&broker, "rg-audit-run")),
    );
    let checked = stdout(&common::run(&["check-config", s.config.to_str().unwrap()]));
    assert!(
        checked.contains(
            "sinks siem (exec, audit stream: duplicate conflict malformed) script (exec, audit \
             stream)"
        ),
        "{checked}"
    );
    let mut lines: Vec<String> = (0..150)
        .map(|i| common::msg("ems", &format!("m{}", i % 3), 1, i, "x"))
        .collect();
    // Replays of the first 40 (duplicates), a conflict and a malformed message.
    lines.extend(lines[..40].to_vec());
    lines.push(common::msg("ems", "m0", 1, 0, "changed"));
    lines.push("not json at all".into());
    let mut run = s.run();
    s.wait_subscribed();
    broker.publish_lines("incidents/ems", &lines, "pub-audit-run");
    common::wait_until("every message is decided", Duration::from_secs(30), || {
        audit_log(&s.config).len() == 192
    });
    // kill -9 while the slow audit sink delivers, three times.
    let mut rng = common::SplitMix64::new(11);
    let mut mid = 0;
    for _ in 0..3 {
        let before = s.received().len();
        common::wait_until(
            common::lazy(|| format!("the audit sink delivers more; log:\n{}", s.log())),
            Duration::from_secs(30),
            || s.received().len() > before || before >= 192,
        );
        std::thread::sleep(Duration::from_millis(20 + rng.below(100)));
        run.kill().unwrap();
        run.wait().unwrap();
        let got: std::collections::HashSet<String> =
            s.received().iter().map(|e| field(e, "id")).collect();
        if got.len() < 192 {
            mid += 1;
        }
        run = s.run();
        s.wait_subscribed();
    }
    s.wait_received(192, Duration::from_secs(60));
    common::wait_until(
        "the siem sink gets its 42 entries",
        Duration::from_secs(30),
        || {
            let ids: std::collections::HashSet<String> =
                arrivals(&siem_out).iter().map(|e| field(e, "id")).collect();
            ids.len() >= 42
        },
    );
    assert_eq!(stop(&mut run), Some(0), "{}", s.log());
    assert!(mid >= 2, "only {mid} of 3 kills landed mid-delivery");
    let log = audit_log(&s.config);
    let count = |o: &str| log.iter().filter(|e| field(e, "outcome") == o).count();
    assert_eq!(
        (
            count("applied"),
            count("duplicate"),
            count("conflict"),
            count("malformed")
        ),
        (150, 40, 1, 1)
    );
    let source = "urn:replay-guard:rg-audit-run";
    let repeats = assert_audit_delivered(&s.received(), &log, |_| true, source);
    assert!(
        repeats < 3 * 100,
        "{repeats} repeats: far more than a cursor flush allows"
    );
    let picked = |o: &str| ["duplicate", "conflict", "malformed"].contains(&o);
    assert_audit_delivered(&arrivals(&siem_out), &log, picked, source);
    // The effects are untouched by the audit sinks: 150 applied, and nothing else delivers them.
    assert_eq!(common::effects(&s.db).len(), 150);
    stdout(&common::run(&[
        "verify",
        "--config",
        s.config.to_str().unwrap(),
    ]));
    let st = status_of(&s, &s.config, "script");
    assert_eq!(
        (
            field(&st, "stream"),
            field(&st, "state"),
            field(&st, "cursor")
        ),
        ("audit".into(), "caught_up".into(), "192".into())
    );
    assert_eq!(field(&st, "lag_events"), "0");
    assert_eq!(accounted(&st, "delivered"), "192");
    let st = status_of(&s, &s.config, "siem");
    assert_eq!(
        (
            accounted(&st, "delivered"),
            accounted(&st, "not_selected"),
            field(&st, "cursor")
        ),
        ("42".into(), "150".into(), "192".into())
    );
    let text = stdout(&common::run(&[
        "relay",
        "status",
        "--config",
        s.config.to_str().unwrap(),
    ]));
    assert!(
        text.contains("siem (exec, audit log): caught_up — cursor 192 of 192, lag 0 entries")
            && text.contains("150 not selected by outcomes"),
        "{text}"
    );
}

/// A config for `relay`/`ingest` with one audit exec sink `script` and audit retention of 5.
fn retention_setup(dir: &Path, receiver: &str) -> Setup {
    setup(
        dir,
        receiver,
        "stream = \"audit\"",
        "[retention]\naudit_max_entries = 5\n",
    )
}

#[test]
fn an_audit_sink_holds_audit_retention_until_it_delivers_parks_and_retries_from_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let s = retention_setup(
        dir.path(),
        "cat > /dev/null\necho 'SIEM is down' >&2\nexit 3",
    );
    // `ingest` makes the sink's cursor before its first commit: it holds from entry 0.
    s.ingest(0, 30);
    assert_eq!(audit_log(&s.config).len(), 30, "retention kept only 5");
    let mut relay = s.relay();
    super::relay::wait_until("a delivery fails", &s, || {
        s.log().contains("delivery failed")
    });
    assert_eq!(stop(&mut relay), Some(0));
    let st = status_of(&s, &s.config, "script");
    assert_eq!(
        (
            field(&st, "state"),
            field(&st, "cursor"),
            field(&st, "lag_events")
        ),
        ("retrying".into(), "0".into(), "30".into())
    );
    s.ingest(30, 32);
    assert_eq!(audit_log(&s.config).len(), 32, "still held");
    // The receiver refuses sequence 5's entry for good (EX_DATAERR) until it is fixed.
    std::fs::write(
        s.dir.join("receiver.sh"),
        format!(
            "#!/bin/sh\nOUT={:?}\nIN=$(cat)\nif [ ! -e {:?} ] && printf '%s' \"$IN\" | grep -q \
             '\"sequence\":5,'; then echo 'unit 5 unknown' >&2; exit 65; fi\n\
             printf '%s\\n' \"$IN\" >> \"$OUT\"\n",
            s.out.to_str().unwrap(),
            s.dir.join("fixed").to_str().unwrap()
        ),
    )
    .unwrap();
    let mut relay = s.relay();
    s.wait_received(31, Duration::from_secs(30));
    let parked = super::relay::parked_list(&s);
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(field(&parked[0], "offset"), "5");
    let log = audit_log(&s.config);
    assert_eq!(field(&parked[0], "id"), entry_id(&log[5]));
    assert!(field(&parked[0], "response").contains("unit 5 unknown"));
    // The parked entry holds retention; so does the cursor of what is not yet delivered.
    s.ingest(32, 33);
    let log = audit_log(&s.config);
    assert_eq!(
        field(&log[0], "index"),
        "5",
        "pruned up to the parked entry only"
    );
    stdout(&common::run(&[
        "verify",
        "--config",
        s.config.to_str().unwrap(),
    ]));
    // Fixed: the retry sends the event rebuilt from entry 5, and the log is released.
    std::fs::write(s.dir.join("fixed"), "").unwrap();
    stdout(&common::run(&[
        "relay",
        "retry",
        "--config",
        s.config.to_str().unwrap(),
        "--sink",
        "script",
        "--all",
        "--reason",
        "unit 5 registered",
        "--operator",
        "ana",
    ]));
    // 33 entries, the retry's own (33) and entry 5 again: 34 ids.
    s.wait_received(34, Duration::from_secs(30));
    super::relay::wait_until("the parked entry is delivered", &s, || {
        super::relay::parked_list(&s).is_empty()
    });
    assert_eq!(stop(&mut relay), Some(0));
    let log = audit_log(&s.config);
    let got = s.received();
    let five: Vec<&Json> = got.iter().filter(|e| field(e, "rgindex") == "5").collect();
    assert_eq!(five.len(), 1);
    let entry5 = log.iter().find(|e| field(e, "index") == "5").unwrap();
    assert_eq!(member(five[0], "data"), entry5, "rebuilt from the entry");
    let retry = log.last().unwrap();
    assert_eq!(field(retry, "outcome"), "relay");
    assert!(field(retry, "reason").contains("requested by ana: unit 5 registered"));
    // Delivered: the next commit prunes down to retention's 5.
    s.ingest(33, 34);
    let log = audit_log(&s.config);
    assert_eq!(log.len(), 5, "released once the sink delivered");
    stdout(&common::run(&[
        "verify",
        "--config",
        s.config.to_str().unwrap(),
    ]));
    let st = status_of(&s, &s.config, "script");
    assert_eq!(accounted(&st, "retried"), "1");
    assert_eq!(field(&st, "lag_events"), "1", "the last ingest's entry");
}

#[test]
fn a_rewound_audit_sink_redelivers_the_same_ids_and_a_stream_change_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // `siem` selects duplicates only: the log ends with entries it passes over.
    let (siem, siem_out) = siem_sink(dir.path(), r#"["duplicate"]"#);
    let s = setup(dir.path(), "cat >> \"$OUT\"", "stream = \"audit\"", &siem);
    s.ingest(0, 20);
    s.ingest(0, 5); // five duplicates: entries 20..25
    let mut relay = s.relay();
    s.wait_received(25, Duration::from_secs(30));
    stdout(&common::run(&[
        "relay",
        "rewind",
        "--config",
        s.config.to_str().unwrap(),
        "--sink",
        "script",
        "--to",
        "18",
        "--reason",
        "SIEM restored",
        "--operator",
        "ana",
    ]));
    // 18..25 again, and the rewind's own entry 25.
    super::relay::wait_until("the rewound entries arrive again", &s, || {
        s.received().len() > 25 + 7
    });
    super::relay::wait_until("the selective sink passes the last entry", &s, || {
        field(&status_of(&s, &s.config, "siem"), "cursor") == "26"
    });
    assert_eq!(stop(&mut relay), Some(0));
    let log = audit_log(&s.config);
    let got = s.received();
    let order: Vec<String> = got.iter().map(|e| field(e, "rgindex")).collect();
    let repeats = assert_audit_delivered(&got, &log, |_| true, "urn:replay-guard:ingest");
    // 18..=24 again; the rewind's own entry (25) may have gone out once before the running
    // relay saw the rewind, and then again with the rest.
    let mut again: Vec<u64> = order[25..].iter().map(|i| i.parse().unwrap()).collect();
    if repeats == 8 && again.first() == Some(&25) {
        again.remove(0);
    }
    assert_eq!(again, (18..=25).collect::<Vec<_>>(), "{order:?}");
    // The selective sink got the five duplicates and passed over the rest, the trailing
    // rewind entry included: caught up, every entry accounted for.
    assert_audit_delivered(
        &arrivals(&siem_out),
        &log,
        |o| o == "duplicate",
        "urn:replay-guard:ingest",
    );
    let st = status_of(&s, &s.config, "siem");
    assert_eq!(
        (
            field(&st, "cursor"),
            field(&st, "state"),
            accounted(&st, "delivered"),
            accounted(&st, "not_selected")
        ),
        ("26".into(), "caught_up".into(), "5".into(), "21".into())
    );
    // A skip on an audit sink passes over audit entries, and its own entry says so (it said
    // "effects" before); verify reads its range back.
    s.ingest(30, 33);
    let head = audit_log(&s.config).len();
    stdout(&common::run(&[
        "relay",
        "skip",
        "--config",
        s.config.to_str().unwrap(),
        "--sink",
        "script",
        "--to",
        &head.to_string(),
        "--yes",
        "--reason",
        "SIEM has these from its own backup",
        "--operator",
        "ana",
    ]));
    let skipped = audit_log(&s.config);
    let reason = field(skipped.last().unwrap(), "reason");
    assert!(
        reason.starts_with(&format!(
            "relay skip of sink script from offset {} to {head} by ana: 3 undelivered audit \
             entries (",
            head - 3
        )),
        "{reason}"
    );
    stdout(&common::run(&[
        "verify",
        "--config",
        s.config.to_str().unwrap(),
    ]));
    let log = skipped;
    // The same sink name with the effect log's stream: refused by every writer, saying what
    // to do, and nothing is written.
    let effects = dir.path().join("effects.toml");
    let mut text = std::fs::read_to_string(&s.config).unwrap();
    let at = text.rfind("stream = \"audit\"\n").unwrap(); // the `script` sink's
    text.replace_range(at..at + "stream = \"audit\"\n".len(), "");
    std::fs::write(&effects, text).unwrap();
    let feed = dir.path().join("one.jsonl");
    std::fs::write(&feed, common::msg("fire", "e0", 1, 99, "status") + "\n").unwrap();
    for args in [
        vec![
            "ingest",
            "--config",
            effects.to_str().unwrap(),
            feed.to_str().unwrap(),
        ],
        vec!["relay", "--config", effects.to_str().unwrap()],
    ] {
        let out = common::run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("sink \"script\" has a cursor in the audit log (stream = \"audit\")")
                && err.contains("a sink's stream cannot change")
                && err.contains("relay forget --sink script"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(audit_log(&s.config).len(), log.len());
    stdout(&common::run(&[
        "verify",
        "--config",
        s.config.to_str().unwrap(),
    ]));
}

/// A PostgreSQL store's config (schema `rg`) with the postgres sink `siem-db` of `stream`
/// writing into `table` of the same database, then the postgres sink `dup-db` of the audit
/// stream selecting duplicates into `dup_events`, and audit retention of 5.
fn pg_config(dir: &Path, db: &PgDb, table: &str, stream: &str) -> PathBuf {
    let dsn = db.dsn();
    let config = dir.join(format!("rg-{stream}.toml"));
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"postgres\"\ndsn = {dsn:?}\nschema = \"rg\"\n\
             [service]\nshutdown_timeout_seconds = 5\n\
             [retention]\naudit_max_entries = 5\n\
             [[sink]]\nname = \"siem-db\"\nkind = \"postgres\"\ndsn = {dsn:?}\n\
             table = {table:?}\nstream = {stream:?}\nbatch_max = 7\nbackoff_initial_ms = 10\n\
             backoff_max_ms = 40\n\
             [[sink]]\nname = \"dup-db\"\nkind = \"postgres\"\ndsn = {dsn:?}\n\
             table = \"dup_events\"\nstream = \"audit\"\noutcomes = [\"duplicate\"]\n\
             backoff_initial_ms = 10\nbackoff_max_ms = 40\n"
        ),
    )
    .unwrap();
    config
}

fn pg_ingest(config: &Path, dir: &Path, from: u64, to: u64) {
    let lines: Vec<String> = (from..to)
        .map(|i| common::msg("fire", &format!("e{}", i % 5), 1, i, "status"))
        .collect();
    let file = dir.join(format!("feed-{from}-{to}.jsonl"));
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    stdout(&common::run(&[
        "ingest",
        "--config",
        config.to_str().unwrap(),
        file.to_str().unwrap(),
    ]));
}

fn pg_relay(config: &Path, log: &Path) -> Child {
    common::logged_command(&["relay", "--config", config.to_str().unwrap()], log)
        .spawn()
        .unwrap()
}

/// The rows of the events table: (audit index, id, event), by index.
fn rows(db: &PgDb, table: &str) -> Vec<(u64, String, String)> {
    db.sql(&format!(
        "SELECT effect_offset, id, event::text FROM {table} ORDER BY effect_offset"
    ))
    .lines()
    .filter(|l| !l.is_empty())
    .map(|l| {
        let mut parts = l.splitn(3, '|');
        (
            parts.next().unwrap().parse().unwrap(),
            parts.next().unwrap().to_string(),
            parts.next().unwrap().to_string(),
        )
    })
    .collect()
}

#[test]
fn on_postgresql_the_postgres_sink_stores_each_audit_entry_once_and_holds_retention() {
    let db = PgDb::new("audit_sink");
    let dir = tempfile::tempdir().unwrap();
    let config = pg_config(dir.path(), &db, "siem_events", "audit");
    pg_ingest(&config, dir.path(), 0, 60);
    pg_ingest(&config, dir.path(), 0, 10); // ten duplicates
    // Held by the sinks that have delivered nothing yet.
    assert_eq!(audit_log(&config).len(), 70);
    let log_path = dir.path().join("relay.log");
    // kill -9 of the relay mid-delivery, twice; the rows and their cursor commit together.
    for _ in 0..2 {
        let mut relay = pg_relay(&config, &log_path);
        common::wait_until(
            common::lazy(|| {
                format!(
                    "rows arrive; log:\n{}",
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                )
            }),
            Duration::from_secs(30),
            || {
                db.sql("SELECT to_regclass('siem_events') IS NOT NULL")
                    .trim()
                    == "t"
                    && !rows(&db, "siem_events").is_empty()
            },
        );
        relay.kill().unwrap();
        relay.wait().unwrap();
    }
    // One more entry after the last duplicate, which `dup-db` passes over: a rewind of
    // `siem-db` to where it is (audited; unlike a commit of the feed, it prunes nothing).
    let status = stdout(&common::run(&[
        "relay",
        "status",
        "--config",
        config.to_str().unwrap(),
        "--format",
        "json",
    ]));
    let Json::Object(top) = json::parse(status.trim().as_bytes(), 64).unwrap() else {
        panic!("{status}")
    };
    let Json::Array(sinks) = &top[0].1 else {
        panic!("{status}")
    };
    let siem = sinks
        .iter()
        .find(|s| field(s, "sink") == "siem-db")
        .unwrap();
    stdout(&common::run(&[
        "relay",
        "rewind",
        "--config",
        config.to_str().unwrap(),
        "--sink",
        "siem-db",
        "--to",
        &field(siem, "cursor"),
        "--reason",
        "checked",
        "--operator",
        "ana",
    ]));
    let mut relay = pg_relay(&config, &log_path);
    let caught_up = || {
        let st = stdout(&common::run(&[
            "relay",
            "status",
            "--config",
            config.to_str().unwrap(),
            "--format",
            "json",
        ]));
        st.matches("\"state\":\"caught_up\"").count() == 2
    };
    // (Each restart may adopt the sink's own cursor: an audited entry, delivered too.)
    common::wait_until("the sinks are caught up", Duration::from_secs(30), || {
        rows(&db, "siem_events").len() >= 70 && caught_up()
    });
    assert_eq!(stop(&mut relay), Some(0));
    let log = audit_log(&config);
    let stored = rows(&db, "siem_events");
    assert_eq!(stored.len(), log.len(), "each entry exactly once");
    for ((index, id, event), entry) in stored.iter().zip(&log) {
        assert_eq!(index.to_string(), field(entry, "index"));
        assert_eq!(id, &entry_id(entry));
        let ev = json::parse(event.as_bytes(), 64).unwrap();
        assert_eq!(field(&ev, "type"), "org.replay-guard.decision.v1");
        assert_eq!(field(member(&ev, "data"), "hash"), field(entry, "hash"));
    }
    // The selective sink stored the ten duplicates once each.
    let dups = rows(&db, "dup_events");
    let want: Vec<String> = log
        .iter()
        .filter(|e| field(e, "outcome") == "duplicate")
        .map(entry_id)
        .collect();
    assert_eq!(dups.iter().map(|r| r.1.clone()).collect::<Vec<_>>(), want);
    // The sinks' own cursor rows are the audit stream's, never an effects sink's; the
    // selective sink's stays after its last duplicate (60..70) while its cursor here passed
    // the entries after it that it does not select.
    let cursor = db.sql("SELECT sink, next_offset FROM replay_guard_relay_cursors ORDER BY sink");
    assert_eq!(
        cursor.trim(),
        format!("dup-db@audit|70\nsiem-db@audit|{}", log.len()),
        "{cursor}"
    );
    // Started again, neither sink takes its own row for a cursor to move back to (which
    // would write an audit entry).
    let again = dir.path().join("relay-again.log");
    let mut relay = pg_relay(&config, &again);
    common::wait_until("both sinks start", Duration::from_secs(30), || {
        std::fs::read_to_string(&again)
            .unwrap_or_default()
            .matches("relay sink started")
            .count()
            >= 2
    });
    assert_eq!(stop(&mut relay), Some(0));
    assert_eq!(
        audit_log(&config).len(),
        log.len(),
        "{:?}",
        audit_log(&config).last()
    );
    // Delivered: the next commit prunes the audit log down to 5.
    pg_ingest(&config, dir.path(), 60, 61);
    assert_eq!(audit_log(&config).len(), 5);
    stdout(&common::run(&[
        "verify",
        "--config",
        config.to_str().unwrap(),
    ]));
    let st = stdout(&common::run(&[
        "relay",
        "status",
        "--config",
        config.to_str().unwrap(),
        "--format",
        "json",
    ]));
    assert!(
        st.contains("\"stream\":\"audit\"") && st.contains("\"lag_events\":1"),
        "{st}"
    );
    // The stream cannot change under the same name on PostgreSQL either.
    let effects = pg_config(dir.path(), &db, "siem_events", "effects");
    let out = common::run(&["relay", "--config", effects.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("a sink's stream cannot change"), "{err}");
}
