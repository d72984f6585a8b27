//! The relay on a PostgreSQL store: the relay's writes give the same cursors, parked events
//! and audit entries as on a redb file; one member holds a sink and the others stand by until
//! its session ends; two standalone relays on one schema, the deliverer killed with kill -9
//! again and again, deliver every effect with its one id; `run` members on a shared
//! subscription deliver what the group applies, through kill -9s; a standalone relay is woken
//! by each commit (LISTEN/NOTIFY, the poll made an hour long) and listens again after its
//! connection is killed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use replay_guard::model::Outcome;
use replay_guard::store::postgres::{PgConfig, PgStore};
use replay_guard::store::relay::{CursorWrite, RelayStore, StartAt};
use replay_guard::store::{Backend, Reader, Snapshot, Store, StoreError, StoreOptions};
use replay_guard::testing::{T0, feed, parked};
use replay_guard::wire::FeedContract;

use super::broker::Broker;
use super::common;
use super::pg::PgDb;
use super::service::{Consumer, events};

const SCHEMA: &str = "replay_guard";

fn pg_cfg(db: &PgDb) -> PgConfig {
    PgConfig::parse(&db.dsn(), SCHEMA).unwrap()
}

/// Every relay write the relay and the operator make, on one store; what each returned and
/// what the store then holds, as text to compare across backends.
fn relay_history(s: &mut Backend) -> Vec<String> {
    let mut out = Vec::new();
    feed(s, 1..=10, T0);
    let mut log = |what: &str, v: String| out.push(format!("{what}: {v}"));
    log(
        "register",
        format!(
            "{:?}",
            s.register_sink("cop", "http", StartAt::Beginning, T0)
        ),
    );
    log(
        "register again",
        format!(
            "{:?}",
            s.register_sink("cop", "http", StartAt::Head, T0 + 1)
        ),
    );
    log(
        "register at head",
        format!("{:?}", s.register_sink("late", "exec", StartAt::Head, T0)),
    );
    log(
        "advance",
        format!(
            "{:?}",
            s.advance_sink(
                "cop",
                0,
                0,
                6,
                &[
                    parked(&s.reader().unwrap(), 2, false),
                    parked(&s.reader().unwrap(), 4, false)
                ],
                T0 + 2
            )
        ),
    );
    log(
        "stale advance",
        format!("{:?}", s.advance_sink("cop", 0, 0, 8, &[], T0 + 3)),
    );
    log(
        "advance unknown",
        format!("{:?}", s.advance_sink("nobody", 0, 0, 1, &[], T0)),
    );
    log(
        "error",
        format!("{:?}", s.note_sink_error("cop", "HTTP 503", T0 + 4)),
    );
    log(
        "retry one",
        format!(
            "{:?}",
            s.relay_retry("cop", Some(2), "ana", "fixed", T0 + 5)
        ),
    );
    log(
        "retry missing",
        format!("{:?}", s.relay_retry("cop", Some(3), "ana", "x", T0 + 5)),
    );
    log(
        "retry all",
        format!("{:?}", s.relay_retry("cop", None, "ana", "all", T0 + 6)),
    );
    log(
        "delivered",
        format!("{:?}", s.parked_delivered("cop", 2, 0, T0 + 7)),
    );
    log(
        "failed",
        format!(
            "{:?}",
            s.parked_failed("cop", 4, Some(T0 + 6), "HTTP 422 again", T0 + 8)
        ),
    );
    log(
        "blocking",
        format!(
            "{:?}",
            s.advance_sink(
                "cop",
                0,
                6,
                7,
                &[parked(&s.reader().unwrap(), 7, true)],
                T0 + 9
            )
        ),
    );
    log(
        "rewind",
        format!(
            "{:?}",
            s.relay_rewind("cop", 3, "ana", "COP restored", T0 + 10)
        ),
    );
    log(
        "rewind out of range",
        format!("{:?}", s.relay_rewind("cop", 11, "ana", "x", T0 + 10)),
    );
    log(
        "set",
        format!("{:?}", s.adopt_sink_cursor("cop", 1, 5, "a test", T0 + 11)),
    );
    log(
        "after rewind",
        format!("{:?}", s.advance_sink("cop", 1, 5, 9, &[], T0 + 12)),
    );
    log(
        "forget",
        format!("{:?}", s.relay_forget("late", "ana", "removed", T0 + 13)),
    );
    log(
        "forget again",
        format!("{:?}", s.relay_forget("late", "ana", "again", T0 + 13)),
    );
    feed(s, 11..=12, T0 + 14);
    log(
        "skip",
        format!(
            "{:?}",
            s.relay_skip("cop", 11, "ana", "two passed over", T0 + 15)
        ),
    );
    log(
        "skip back",
        format!("{:?}", s.relay_skip("cop", 5, "ana", "x", T0 + 15)),
    );
    let snap = s.reader().unwrap();
    out.push(format!("ledger: {:?}", snap.sink_ledger("cop").unwrap()));
    out.push(format!(
        "accounting: {:?}",
        snap.sink_accounting("cop", &snap.sink_cursor("cop").unwrap().unwrap())
            .unwrap()
    ));
    out.push(format!("cursors: {:?}", snap.sink_cursors().unwrap()));
    out.push(format!("parked: {:?}", snap.sink_parked(None).unwrap()));
    snap.scan_audit::<StoreError>(0, |e| {
        if e.outcome() == Some(Outcome::Relay) {
            out.push(format!(
                "audit {}: {} {}",
                e.index, e.record.topic, e.record.reason
            ));
        }
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    out.push(format!("meta: {:?}", snap.meta().unwrap()));
    let report = replay_guard::store::verify::verify(&snap, &FeedContract::default()).unwrap();
    out.push(format!("verify: {:?}", report.violation));
    out
}

#[test]
fn relay_writes_give_the_same_cursors_parked_events_and_audit_on_both_backends() {
    let dir = tempfile::tempdir().unwrap();
    let mut redb = Backend::Redb(
        Store::open(&dir.path().join("rg.redb"), StoreOptions::default(), T0).unwrap(),
    );
    let db = PgDb::new("relay_same");
    let mut pg =
        Backend::Postgres(PgStore::open(pg_cfg(&db), StoreOptions::default(), T0).unwrap());
    let a = relay_history(&mut redb);
    let b = relay_history(&mut pg);
    // The history exercised what it names.
    let text = a.join("\n");
    for want in [
        "stale advance: Ok(Moved(Some(",
        "advance unknown: Ok(Moved(None))",
        "retry missing: Err(",
        "retry all: Ok(2)",
        "rewind out of range: Err(",
        "forget again: Err(",
        "relay rewind of sink cop from offset 7 to 3 by ana: COP restored",
        "skip back: Err(",
        "undelivered effects (9-10) passed over: two passed over",
        "accounting: Ok(Accounting",
        "verify: None",
    ] {
        assert!(text.contains(want), "{want} not in:\n{text}");
    }
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x, y, "step {i} differs between redb and PostgreSQL");
    }
    assert_eq!(a.len(), b.len());
}

#[test]
fn one_member_holds_a_sink_the_others_stand_by_until_its_session_ends() {
    let db = PgDb::new("relay_lock");
    let open = || PgStore::open(pg_cfg(&db), StoreOptions::default(), T0).unwrap();
    let (mut a, mut b) = (open(), open());
    let mut feeder = Backend::Postgres(open());
    feed(&mut feeder, 1..=10, T0);
    let rec = a
        .register_sink("cop", "http", StartAt::Beginning, T0)
        .unwrap();
    let busy = |r: Result<_, StoreError>| matches!(r, Err(StoreError::SinkBusy { .. }));
    assert!(busy(
        b.register_sink("cop", "http", StartAt::Beginning, T0)
            .map(drop)
    ));
    assert!(busy(b.advance_sink("cop", 0, 0, 3, &[], T0).map(drop)));
    assert!(busy(b.note_sink_error("cop", "x", T0)));
    // Another sink is free; an operator's retry or rewind needs no sink lock ...
    b.register_sink("other", "exec", StartAt::Head, T0).unwrap();
    b.relay_rewind("cop", 0, "ana", "check", T0).unwrap();
    // ... but forgetting a sink somebody delivers is refused, naming it.
    let e = b.relay_forget("cop", "ana", "x", T0).unwrap_err();
    assert!(e.to_string().contains("sink \"cop\""), "{e}");
    // The holder moves its cursor; the rewind is seen as a move (generation 1).
    assert!(matches!(
        a.advance_sink("cop", rec.generation, 0, 4, &[], T0).unwrap(),
        CursorWrite::Moved(Some(r)) if r.generation == 1
    ));
    assert!(matches!(
        a.advance_sink("cop", 1, 0, 4, &[], T0).unwrap(),
        CursorWrite::Done(r) if r.next == 4
    ));
    // The holder's session ends (the server terminates it): its lock goes with it, and the
    // standby takes the sink.
    let n = db.terminate_connections();
    assert!(n >= 3, "{n} sessions terminated");
    // Each finds its connection lost once (the relay retries that after a backoff).
    assert!(matches!(
        b.register_sink("cop", "http", StartAt::Beginning, T0),
        Err(StoreError::Unreachable(_))
    ));
    b.register_sink("cop", "http", StartAt::Beginning, T0)
        .unwrap();
    assert!(matches!(
        b.advance_sink("cop", 1, 4, 6, &[], T0).unwrap(),
        CursorWrite::Done(r) if r.next == 6
    ));
    // The old holder reconnects and finds the sink taken: it writes nothing.
    assert!(matches!(
        a.advance_sink("cop", 1, 4, 10, &[], T0),
        Err(StoreError::Unreachable(_))
    ));
    assert!(busy(a.advance_sink("cop", 1, 4, 10, &[], T0).map(drop)));
    let snap = Reader::postgres(pg_cfg(&db)).unwrap().1;
    assert_eq!(snap.sink_cursor("cop").unwrap().unwrap().next, 6);
    // The new holder closes (SIGTERM, kill -9: the session ends); the first takes it back.
    // The server ends the session, and its lock, a moment after the client hangs up.
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match a.register_sink("cop", "http", StartAt::Beginning, T0) {
            Ok(_) => break,
            Err(StoreError::SinkBusy { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("the sink was not handed back within 10 s: {e}"),
        }
    }
    assert!(matches!(
        a.advance_sink("cop", 1, 6, 10, &[], T0).unwrap(),
        CursorWrite::Done(r) if r.next == 10
    ));
}

/// One delivered event as an exec sink wrote it: (the relay process's pid, offset, id).
fn delivered(dir: &Path) -> Vec<(u32, u64, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(pid) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("out-"))
            .and_then(|n| n.strip_suffix(".jsonl"))
        else {
            continue;
        };
        let pid: u32 = pid.parse().unwrap();
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let field = |name: &str| {
                let at = line.find(&format!("\"{name}\":\"")).unwrap() + name.len() + 4;
                line[at..at + line[at..].find('"').unwrap()].to_string()
            };
            out.push((pid, field("rgoffset").parse().unwrap(), field("id")));
        }
    }
    out
}

/// A receiver script in `dir`, which it makes: each batch goes to `out-<relay pid>.jsonl` in
/// `dir`, and `active` names the relay process that delivered last.
fn receiver(dir: &Path) -> PathBuf {
    std::fs::create_dir(dir).unwrap();
    let script = dir.join("receiver.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nD={:?}\necho $PPID > \"$D/active.$$\" && mv \"$D/active.$$\" \"$D/active\"\n\
             cat >> \"$D/out-$PPID.jsonl\"\n",
            dir.to_str().unwrap()
        ),
    )
    .unwrap();
    script
}

fn sink_toml(script: &Path) -> String {
    format!(
        "[[sink]]\nname = \"cop\"\nkind = \"exec\"\ncommand = [\"/bin/sh\", {:?}]\n\
         batch_max = 50\nbackoff_initial_ms = 10\nbackoff_max_ms = 40\n",
        script.to_str().unwrap()
    )
}

fn snapshot(dsn: &str) -> Option<Snapshot> {
    Reader::postgres(PgConfig::parse(dsn, SCHEMA).unwrap())
        .ok()
        .map(|(_, s)| s)
}

/// (the stored cursor of sink `cop`, the log's head).
fn cursor_and_head(dsn: &str) -> Option<(u64, u64)> {
    let snap = snapshot(dsn)?;
    let head = snap.meta().ok()?.next_effect;
    let cursor = snap.sink_cursor("cop").ok()??.next;
    Some((cursor, head))
}

fn wait_delivered(dsn: &str, head_at_least: u64, limit: Duration) {
    common::wait_until(
        common::lazy(|| {
            format!(
                "the cursor reaches a head of at least {head_at_least} (cursor and head {:?})",
                cursor_and_head(dsn)
            )
        }),
        limit,
        || cursor_and_head(dsn).is_some_and(|(c, h)| h >= head_at_least && c == h),
    );
}

/// Every effect of the log arrived, each with one id (the same on every arrival), and the
/// ids are unique per effect. Returns how many arrivals were repeats.
fn assert_each_effect_arrived_with_one_id(dir: &Path, head: u64) -> usize {
    let arrivals = delivered(dir);
    let mut ids: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for (_, offset, id) in &arrivals {
        ids.entry(*offset).or_default().insert(id.clone());
    }
    let offsets: Vec<u64> = ids.keys().copied().collect();
    assert_eq!(
        offsets,
        (0..head).collect::<Vec<_>>(),
        "an effect is missing"
    );
    for (offset, set) in &ids {
        assert_eq!(
            set.len(),
            1,
            "effect {offset} arrived under several ids: {set:?}"
        );
    }
    let unique: BTreeSet<&String> = ids.values().flatten().collect();
    assert_eq!(unique.len() as u64, head, "two effects share an id");
    arrivals.len() - head as usize
}

fn relay_process(config: &Path, log: &Path) -> Child {
    common::logged_command(&["relay", "--config", config.to_str().unwrap()], log)
        .spawn()
        .unwrap()
}

fn ingest(config: &Path, dir: &Path, from: u64, to: u64) {
    let lines: Vec<String> = (from..to)
        .map(|i| common::msg("fire", &format!("e{}", i % 5), 1, i, "status"))
        .collect();
    let file = dir.join(format!("feed-{from}.jsonl"));
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let out = common::run(&[
        "ingest",
        "--config",
        config.to_str().unwrap(),
        file.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn sigterm(child: &mut Child) -> Option<i32> {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn two_relays_on_one_schema_deliver_every_effect_once_with_its_id_through_kill_9s() {
    const MAX_ROUNDS: u64 = 12;
    const PER_ROUND: u64 = 400;
    let db = PgDb::new("relay_pair");
    let dsn = db.dsn();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let script = receiver(&out);
    let config = dir.path().join("rg.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"postgres\"\ndsn = {dsn:?}\nschema = {SCHEMA:?}\n\
             [service]\nshutdown_timeout_seconds = 5\n{}",
            sink_toml(&script)
        ),
    )
    .unwrap();
    ingest(&config, dir.path(), 0, PER_ROUND);
    let logs = [
        dir.path().join("relay-a.log"),
        dir.path().join("relay-b.log"),
    ];
    let mut relays = [
        relay_process(&config, &logs[0]),
        relay_process(&config, &logs[1]),
    ];
    let mut kills = 0;
    let mut rounds = 0;
    for round in 1..=MAX_ROUNDS {
        rounds = round;
        // More effects while the pair delivers; the active one dies mid-delivery.
        ingest(
            &config,
            dir.path(),
            round * PER_ROUND,
            (round + 1) * PER_ROUND,
        );
        std::thread::sleep(Duration::from_millis(150));
        let active: u32 = std::fs::read_to_string(out.join("active"))
            .map(|s| s.trim().parse().unwrap())
            .unwrap_or(0);
        if let Some(i) = relays.iter().position(|c| c.id() == active) {
            relays[i].kill().unwrap();
            relays[i].wait().unwrap();
            kills += 1;
            relays[i] = relay_process(&config, &logs[i]);
        }
        if kills == 4 {
            break;
        }
    }
    assert_eq!(kills, 4, "the active relay was killed {kills} times");
    let head = (rounds + 1) * PER_ROUND;
    wait_delivered(&dsn, head, Duration::from_secs(60));
    let repeats = assert_each_effect_arrived_with_one_id(&out, head);
    // Both took turns, and the one that waited said why.
    let delivering: BTreeSet<u32> = delivered(&out).iter().map(|d| d.0).collect();
    assert!(delivering.len() >= 3, "deliverers: {delivering:?}");
    let text = logs
        .iter()
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect::<String>();
    assert!(
        text.contains("another member delivers this sink; standing by"),
        "{text}"
    );
    for mut r in relays {
        assert_eq!(sigterm(&mut r), Some(0), "{text}");
    }
    // `relay status` reads the shared cursor: caught up.
    let status = common::run(&["relay", "status", "--config", config.to_str().unwrap()]);
    let status_text = String::from_utf8_lossy(&status.stdout);
    assert!(status_text.contains("caught_up"), "{status_text}");
    let verify = common::run(&["verify", "--config", config.to_str().unwrap()]);
    assert_eq!(verify.status.code(), Some(0));
    eprintln!("{kills} kills, {repeats} repeated arrivals of {head} effects");
}

#[test]
fn run_members_on_a_shared_subscription_deliver_what_the_group_applies_through_kill_9s() {
    const TOTAL: u64 = 3_000;
    let db = PgDb::new("relay_group");
    let dsn = db.dsn();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let script = receiver(&out);
    let broker = Broker::start(&dir.path().join("broker"), false);
    let config = |id: &str| {
        format!(
            "[store]\nbackend = \"postgres\"\ndsn = {dsn:?}\nschema = {SCHEMA:?}\n\
             [mqtt]\nbrokers = [{:?}]\nclient_id = {id:?}\ntopics = [\"incidents/#\"]\n\
             share_group = \"rg\"\nprotocol = \"v5\"\nbackoff_initial_ms = 50\nbackoff_max_ms = 200\n\
             [commit]\nmax_batch = 200\nlinger_ms = 10\n[service]\nshutdown_timeout_seconds = 5\n{}",
            broker.url(),
            sink_toml(&script)
        )
    };
    let mut members: Vec<Consumer> = ["a", "b"]
        .iter()
        .map(|m| Consumer::with_config(dir.path(), m, &config(&format!("rg-{m}"))))
        .collect();
    for m in &mut members {
        m.start();
    }
    for m in &members {
        m.wait_subscribed();
    }
    let lines = events(0, TOTAL);
    let mut kills = 0;
    for chunk in lines.chunks(300) {
        broker.publish_lines("incidents/ca", chunk, "pub-relay-group");
        std::thread::sleep(Duration::from_millis(250));
        let active: u32 = std::fs::read_to_string(out.join("active"))
            .map(|s| s.trim().parse().unwrap())
            .unwrap_or(0);
        if let Some(m) = members.iter_mut().find(|m| m.pid() == Some(active)) {
            m.kill9();
            kills += 1;
            m.start();
        }
    }
    assert!(kills >= 3, "the delivering member was killed {kills} times");
    // Mosquitto may drop what it had handed a killed member of a shared subscription: the
    // field app re-publishes its log once the group is quiet, and only what is missing is
    // applied (the rest is decided duplicate).
    let applied = || {
        snapshot(&dsn)
            .and_then(|s| s.meta().ok())
            .map(|m| m.next_effect)
    };
    let mut last = (applied(), Instant::now());
    let quiet_by = Instant::now() + Duration::from_secs(30);
    while last.1.elapsed() < Duration::from_secs(2) && Instant::now() < quiet_by {
        std::thread::sleep(Duration::from_millis(100));
        let now = applied();
        if now != last.0 {
            last = (now, Instant::now());
        }
    }
    broker.publish_lines("incidents/ca", &lines, "pub-relay-group-again");
    common::wait_until(
        common::lazy(|| format!("{TOTAL} are applied (now {:?})", applied())),
        Duration::from_secs(60),
        || applied() == Some(TOTAL),
    );
    wait_delivered(&dsn, TOTAL, Duration::from_secs(60));
    let repeats = assert_each_effect_arrived_with_one_id(&out, TOTAL);
    for m in &mut members {
        assert_eq!(m.stop(Duration::from_secs(15)), Some(0), "{}", m.log_text());
    }
    let cfg = members[0].config.clone();
    let verify = common::run(&["verify", "--config", cfg.to_str().unwrap()]);
    assert_eq!(verify.status.code(), Some(0));
    eprintln!("{kills} kills, {repeats} repeated arrivals of {TOTAL} effects");
}

/// The pids of the sessions LISTENing on database `db` (the relay's wake-up connection).
fn listeners(db: &PgDb) -> Vec<String> {
    db.sql(&format!(
        "SELECT pid FROM pg_stat_activity WHERE datname = '{}' AND query LIKE 'LISTEN %'",
        db.name
    ))
    .lines()
    .map(str::to_string)
    .collect()
}

#[test]
fn a_standalone_relay_on_postgres_is_woken_by_each_commit_and_listens_again_after_its_connection_is_killed()
 {
    let db = PgDb::new("relay_listen");
    let dsn = db.dsn();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let script = receiver(&out);
    let config = dir.path().join("rg.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"postgres\"\ndsn = {dsn:?}\nschema = {SCHEMA:?}\n\
             [service]\nshutdown_timeout_seconds = 5\n{}",
            sink_toml(&script)
        ),
    )
    .unwrap();
    ingest(&config, dir.path(), 0, 20);
    // The head poll and an idle sink's own look wait an hour: within the deadlines below
    // only a notification (or the look right after a LISTEN) can wake the relay.
    let log = dir.path().join("relay.log");
    let mut relay = common::logged_command(&["relay", "--config", config.to_str().unwrap()], &log)
        .env("REPLAY_GUARD_TEST_RELAY_POLL_MS", "3600000")
        .spawn()
        .unwrap();
    let limit = Duration::from_secs(30);
    wait_delivered(&dsn, 20, limit);
    common::wait_until("the relay LISTENs", limit, || listeners(&db).len() == 1);
    // Idle (its cursor was written at the head just before it waited): a commit wakes it.
    ingest(&config, dir.path(), 20, 40);
    wait_delivered(&dsn, 40, limit);

    // Its LISTEN connection killed: it connects and listens again, and commits wake it.
    let first = listeners(&db);
    db.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'");
    common::wait_until("the relay LISTENs again", limit, || {
        let now = listeners(&db);
        now.len() == 1 && now != first
    });
    ingest(&config, dir.path(), 40, 60);
    wait_delivered(&dsn, 60, limit);

    // A commit while no one listens is found by the look right after the next LISTEN.
    db.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN %'");
    ingest(&config, dir.path(), 60, 80);
    wait_delivered(&dsn, 80, limit);

    assert_eq!(sigterm(&mut relay), Some(0));
    assert_eq!(assert_each_effect_arrived_with_one_id(&out, 80), 0);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("listening for commits") && text.contains("connecting again"),
        "{text}"
    );
}
