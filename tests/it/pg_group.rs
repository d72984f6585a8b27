//! Several `run` members on one PostgreSQL schema through real brokers: three members on a
//! shared subscription through kill -9s and a broker failover replay; an active member killed
//! and a standby (other client id, other config file) taking over and absorbing the replay;
//! the server terminating the member's connections mid-surge; the server cut off behind a
//! proxy while the member keeps pinging the watchdog with an UNREACHABLE status; `run` started
//! while the server is cut off (it waits, unsubscribed, and stops at once on SIGTERM), and
//! what still fails at start (a newer schema; `ingest` with the server unreachable); the proxy
//! frozen (no forwarding, sockets open): the hang is given up within the round trip's
//! deadline, logged and shown, and the feed decided once after the thaw.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write as _;
use std::ops::ControlFlow;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use replay_guard::model::Outcome;
use replay_guard::store::postgres::PgConfig;
use replay_guard::store::{AuditEntry, Effect, Reader, Snapshot, StoreError};

use super::broker::{Broker, free_port};
use super::common::{self, SplitMix64};
use super::pg::PgDb;
use super::service::{Consumer, events};

const SCHEMA: &str = "replay_guard";
const TOPIC: &str = "incidents/ca";

/// A member's config: the shared schema, fast reconnects, small batches.
fn member_config(
    dsn: &str,
    brokers: &[String],
    client_id: &str,
    share_group: Option<&str>,
    protocol: &str,
) -> String {
    let list: Vec<String> = brokers.iter().map(|b| format!("{b:?}")).collect();
    let group = share_group.map_or(String::new(), |g| format!("share_group = {g:?}\n"));
    format!(
        "[store]\nbackend = \"postgres\"\ndsn = {dsn:?}\nschema = {SCHEMA:?}\n\
         [mqtt]\nbrokers = [{}]\nclient_id = {client_id:?}\ntopics = [\"incidents/#\"]\n{group}\
         protocol = {protocol:?}\nretries_per_broker = 2\nbackoff_initial_ms = 50\nbackoff_max_ms = 200\n\
         keep_alive_seconds = 5\n[commit]\nmax_batch = 500\nlinger_ms = 20\n[service]\nshutdown_timeout_seconds = 10\n",
        list.join(", ")
    )
}

/// A fresh snapshot of the shared schema; `None` while it cannot be read (not created yet, or
/// our own connection was just terminated).
fn snapshot(dsn: &str) -> Option<Snapshot> {
    let cfg = PgConfig::parse(dsn, SCHEMA).unwrap();
    Reader::postgres(cfg).ok().map(|(_, snap)| snap)
}

/// (audit entries, effects) of the shared schema.
fn counts(dsn: &str) -> Option<(u64, u64)> {
    let m = snapshot(dsn)?.meta().ok()?;
    Some((m.next_audit, m.next_effect))
}

fn scan_effects(dsn: &str) -> Vec<Effect> {
    let snap = snapshot(dsn).expect("read the schema");
    let mut out = Vec::new();
    snap.scan_effects::<StoreError>(0, |e| {
        out.push(e);
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    out
}

fn scan_audit(dsn: &str) -> Vec<AuditEntry> {
    let snap = snapshot(dsn).expect("read the schema");
    let mut out = Vec::new();
    snap.scan_audit::<StoreError>(0, |e| {
        out.push(e);
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    out
}

fn outcomes(audit: &[AuditEntry]) -> BTreeMap<Outcome, u64> {
    let mut out = BTreeMap::new();
    for e in audit {
        *out.entry(e.outcome().unwrap()).or_insert(0) += 1;
    }
    out
}

/// Waits until `done(audit entries, effects)` holds.
fn wait_counts(dsn: &str, limit: Duration, what: &str, done: impl Fn(u64, u64) -> bool) {
    common::wait_until(
        common::lazy(|| format!("{what} ((audit entries, effects) = {:?})", counts(dsn))),
        limit,
        || counts(dsn).is_some_and(|(a, e)| done(a, e)),
    );
}

/// Waits until the audit log has not grown for `quiet` (the members settled: what a broker
/// still had to redeliver was decided); returns (audit entries, effects).
fn wait_quiet(dsn: &str, quiet: Duration, limit: Duration) -> (u64, u64) {
    let mut last: Option<(u64, u64)> = None;
    let mut since = Instant::now();
    common::wait_until("the audit log goes quiet", limit, || {
        let now = counts(dsn);
        if now.is_none() || now.map(|c| c.0) != last.map(|c| c.0) {
            (last, since) = (now, Instant::now());
        }
        last.is_some() && since.elapsed() >= quiet
    });
    last.expect("read")
}

/// Every effect's (source, sequence) exactly once, no key twice, and the set equals `want`.
fn assert_exactly_once(effects: &[Effect], want: &HashSet<(String, u64)>) {
    let mut seen = HashSet::new();
    let mut keys = HashSet::new();
    for e in effects {
        assert!(keys.insert(e.record.key), "key applied twice: {e:?}");
        let k = (e.record.source_id.clone(), e.record.sequence);
        assert!(seen.insert(k.clone()), "effect {k:?} applied twice");
    }
    let missing: Vec<_> = want.difference(&seen).take(10).collect();
    let extra: Vec<_> = seen.difference(want).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "applied set differs from what was published ({} applied, {} published): \
         missing e.g. {missing:?}, never published e.g. {extra:?}",
        seen.len(),
        want.len()
    );
}

/// `verify --config` exits 0 (the whole chain and every effect checked against the schema).
fn assert_verifies(config: &Path) {
    let out = common::run(&["verify", "--config", config.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One mosquitto_pub run: each line a QoS 1 message, every PUBACK awaited. Err when the
/// broker is down or dies under it (then some of the lines may have landed); killed after 15 s.
fn try_publish(port: u16, lines: &[String], client_id: &str) -> Result<(), String> {
    let mut child = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-q", "1"])
        .args(["-t", TOPIC, "-i", client_id, "-l"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_pub must be installed (apt-get install -y mosquitto-clients)");
    let mut stdin = child.stdin.take().unwrap();
    let mut text = String::new();
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    // A broker that is down makes mosquitto_pub exit early: a broken pipe here.
    let _ = stdin.write_all(text.as_bytes());
    drop(stdin);
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return if status.success() {
                Ok(())
            } else {
                Err(format!("mosquitto_pub on {port}: {status}"))
            };
        }
        if start.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("mosquitto_pub on {port} hung"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The field app: publishes to whichever of its brokers takes the messages, and keeps a log
/// of every line it sent (a chunk that failed half way is sent again whole).
struct FieldApp {
    ports: Vec<u16>,
    current: usize,
    client_id: String,
    log: Vec<String>,
}

impl FieldApp {
    fn publish(&mut self, lines: &[String]) {
        self.log.extend_from_slice(lines);
        self.send(lines);
    }

    fn send(&mut self, lines: &[String]) {
        let start = Instant::now();
        loop {
            match try_publish(self.ports[self.current], lines, &self.client_id) {
                Ok(()) => return,
                Err(e) => {
                    assert!(
                        start.elapsed() < Duration::from_secs(30),
                        "field app could not publish for 30 s: {e}"
                    );
                    self.current = (self.current + 1) % self.ports.len();
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
}

/// (source, sequence) of a line `common::msg` made.
fn key_of(line: &str) -> (String, u64) {
    let j = replay_guard::json::parse(line.as_bytes(), 8).unwrap();
    let get = |name: &str| {
        j.pointer(&replay_guard::json::Pointer::parse(&format!("/{name}")).unwrap())
            .cloned()
    };
    let source = match get("source_id") {
        Some(replay_guard::json::Json::String(s)) => s,
        other => panic!("source_id {other:?}"),
    };
    let seq = match get("sequence") {
        Some(replay_guard::json::Json::Number(n)) => n.parse().unwrap(),
        other => panic!("sequence {other:?}"),
    };
    (source, seq)
}

#[test]
fn three_members_on_a_shared_subscription_apply_every_event_once_through_kills_and_a_failover() {
    const EVENTS: usize = 20_000;
    const SOURCES: u64 = 6;
    let db = PgDb::new("group");
    let dsn = db.dsn();
    let dir = tempfile::tempdir().unwrap();
    let mut a = Broker::start(&dir.path().join("a"), true);
    let b_port = free_port();
    let b_url = format!("mqtt://127.0.0.1:{b_port}");
    let brokers = [a.url(), b_url.clone()];
    let mut members: Vec<Consumer> = (0..3)
        .map(|i| {
            let text = member_config(&dsn, &brokers, &format!("rg-m{i}"), Some("cop"), "v5");
            Consumer::with_config(dir.path(), &format!("m{i}"), &text)
        })
        .collect();
    for m in &mut members {
        m.start();
    }
    for m in &members {
        m.wait_subscribed();
    }

    // The field app: a surge of fresh events from several sources, some exact replays of
    // lines it sent before, in chunks with small sleeps.
    let progress = Arc::new(AtomicUsize::new(0));
    let publisher = {
        let progress = progress.clone();
        let ports = vec![a.port, b_port];
        std::thread::spawn(move || {
            let mut app = FieldApp {
                ports,
                current: 0,
                client_id: "field-app".into(),
                log: Vec::new(),
            };
            let mut rng = SplitMix64::new(0x5eed);
            let mut next = vec![1u64; SOURCES as usize];
            let mut fresh = 0;
            let mut replays = 0;
            while fresh < EVENTS {
                let mut chunk = Vec::new();
                while chunk.len() < 400 && fresh < EVENTS {
                    if rng.below(100) < 3 && !app.log.is_empty() {
                        chunk.push(app.log[rng.below(app.log.len() as u64) as usize].clone());
                        replays += 1;
                    } else {
                        let s = rng.below(SOURCES) as usize;
                        chunk.push(common::msg(
                            "CALFIRE",
                            &format!("S{s}"),
                            1,
                            next[s],
                            "status",
                        ));
                        next[s] += 1;
                        fresh += 1;
                    }
                }
                app.publish(&chunk);
                progress.store(fresh, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20 + rng.below(40)));
            }
            (app, replays)
        })
    };

    // Meanwhile: kill -9 members at random and restart them; half way, a broker failover.
    let mut rng = SplitMix64::new(0xdead);
    let (mut kills, mut mid_surge) = (0, 0);
    let mut b: Option<Broker> = None;
    let mut failover_at = None;
    let started = Instant::now();
    while !publisher.is_finished() || kills < 10 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "surge too slow"
        );
        std::thread::sleep(Duration::from_millis(150 + rng.below(300)));
        for (i, m) in members.iter_mut().enumerate() {
            if let Some(status) = m.exited() {
                panic!("member {i} exited on its own: {status}\n{}", m.log_text());
            }
        }
        if b.is_none() && progress.load(Ordering::SeqCst) >= EVENTS / 2 {
            // A saves the sessions with what is in flight for the members; they go on
            // deciding and acknowledging to A; A dies; standby B starts from A's file and
            // replays.
            let at_snapshot = counts(&dsn).map_or(0, |c| c.0);
            a.snapshot();
            wait_counts(
                &dsn,
                Duration::from_secs(30),
                "the group decides more after A's snapshot",
                |audit, _| audit >= at_snapshot + 400,
            );
            b = Some(a.kill_and_restore_into(&dir.path().join("b"), b_port));
            failover_at = Some(counts(&dsn));
            continue;
        }
        let i = rng.below(3) as usize;
        if !publisher.is_finished() {
            mid_surge += 1;
        }
        members[i].kill9();
        kills += 1;
        if rng.below(3) == 0 {
            std::thread::sleep(Duration::from_millis(300)); // stays away a little
        }
        members[i].start();
    }
    let (mut app, replays) = publisher.join().unwrap();
    let b = b.expect("the failover happened mid-surge");
    eprintln!(
        "surge: {} lines ({replays} exact replays) in {:?}; {kills} kills, {mid_surge} mid-surge; \
         failover at (audit, effects) {failover_at:?}",
        app.log.len(),
        started.elapsed()
    );
    assert!(kills >= 10, "{kills} kills");
    assert!(
        mid_surge >= 10 && mid_surge * 3 >= kills * 2,
        "only {mid_surge} of {kills} kills landed mid-surge"
    );

    // What the group has decided by now; then the field app re-publishes its whole log (to B,
    // the broker alive): messages a broker dropped or lost in the failover come now, the rest
    // must come back `duplicate`.
    let (a0, _) = wait_quiet(&dsn, Duration::from_millis(1000), Duration::from_secs(60));
    eprintln!("quiet after {:?}: {a0} decided", started.elapsed());
    let republished = app.log.clone();
    for chunk in republished.chunks(2500) {
        app.send(chunk);
    }
    let want: HashSet<(String, u64)> = app.log.iter().map(|l| key_of(l)).collect();
    assert_eq!(want.len(), EVENTS);
    let target = a0 + republished.len() as u64;
    wait_counts(
        &dsn,
        Duration::from_secs(60),
        "all decided",
        |audit, effects| effects >= EVENTS as u64 && audit >= target,
    );
    // The audit count alone can be reached by late redeliveries of earlier messages while
    // the broker still holds some re-published ones in flight: wait until every re-published
    // line was decided again (each key as often as it was re-published).
    let mut again: HashMap<(String, u64), u64> = HashMap::new();
    for l in &republished {
        *again.entry(key_of(l)).or_insert(0) += 1;
    }
    let redecided = Instant::now();
    loop {
        let mut seen: HashMap<(String, u64), u64> = HashMap::new();
        for e in scan_audit(&dsn).iter().filter(|e| e.index >= a0) {
            if let (Some(s), Some(q)) = (e.record.source_id.clone(), e.record.sequence) {
                *seen.entry((s, q)).or_insert(0) += 1;
            }
        }
        let missing = again
            .iter()
            .filter(|(k, n)| seen.get(*k).copied().unwrap_or(0) < **n)
            .count();
        if missing == 0 {
            break;
        }
        assert!(
            redecided.elapsed() < Duration::from_secs(60),
            "{missing} re-published keys not decided again after 60 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!("all decided after {:?}", started.elapsed());
    // Late redeliveries are decided before the members stop.
    wait_quiet(&dsn, Duration::from_millis(500), Duration::from_secs(30));
    for (i, m) in members.iter_mut().enumerate() {
        assert_eq!(
            m.stop(Duration::from_secs(15)),
            Some(0),
            "member {i}:\n{}",
            m.log_text()
        );
    }

    eprintln!("stopped after {:?}", started.elapsed());
    let effects = scan_effects(&dsn);
    eprintln!("effects read after {:?}", started.elapsed());
    assert_exactly_once(&effects, &want);
    assert_verifies(&members[0].config);
    eprintln!("verified after {:?}", started.elapsed());

    // Every re-published line was decided again: `duplicate`, or `applied` for the one
    // delivery of a message that had been lost before (then its effect is recorded after a0).
    let audit = scan_audit(&dsn);
    eprintln!("audit read after {:?}", started.elapsed());
    let applied_late_in_run: HashSet<(String, u64)> = effects
        .iter()
        .filter(|e| e.record.audit_index >= a0)
        .map(|e| (e.record.source_id.clone(), e.record.sequence))
        .collect();
    let mut dups_after: HashMap<(String, u64), u64> = HashMap::new();
    for e in audit.iter().filter(|e| e.index >= a0) {
        if e.outcome() == Some(Outcome::Duplicate) {
            let k = (
                e.record.source_id.clone().unwrap(),
                e.record.sequence.unwrap(),
            );
            *dups_after.entry(k).or_insert(0) += 1;
        }
    }
    let mut sent_again: HashMap<(String, u64), u64> = HashMap::new();
    for l in &republished {
        *sent_again.entry(key_of(l)).or_insert(0) += 1;
    }
    for (k, n) in &sent_again {
        let lost_before = u64::from(applied_late_in_run.contains(k));
        let d = dups_after.get(k).copied().unwrap_or(0);
        assert!(
            d + lost_before >= *n,
            "{k:?} re-published {n} times: {d} duplicates after the re-publication, \
             lost before: {lost_before}"
        );
    }
    let o = outcomes(&audit);
    eprintln!(
        "outcomes {o:?}; {} effects recorded only after the re-publication (lost by a broker)",
        applied_late_in_run.len()
    );
    // (Surge replays are not counted here: a replay whose original a broker lost is the
    // copy that applies.)
    assert!(
        o.get(&Outcome::Duplicate).copied().unwrap_or(0)
            >= republished.len() as u64 - applied_late_in_run.len() as u64,
        "{o:?}"
    );
    assert_eq!(
        o.get(&Outcome::Conflict).copied().unwrap_or(0)
            + o.get(&Outcome::Malformed).copied().unwrap_or(0)
            + o.get(&Outcome::Stale).copied().unwrap_or(0),
        0,
        "{o:?}"
    );
    // Every member found its session (and shared subscription) on B after the failover.
    for (i, m) in members.iter().enumerate() {
        let log = m.log_text();
        assert!(
            log.contains(&format!("connected broker={b_url} session_present=true")),
            "member {i} never resumed its session on B:\n{log}"
        );
    }
    // The replay B made to members that were connected through the failover was absorbed
    // as a burst, recorded with B as the broker (`stats` reads it from the schema).
    let bursts = snapshot(&dsn).unwrap().replay_bursts().unwrap();
    assert!(
        bursts.iter().any(|r| r.broker == b_url && r.duplicates > 0),
        "no replay burst from B: {bursts:?}"
    );
    let stats = common::run(&["stats", "--config", members[0].config.to_str().unwrap()]);
    assert_eq!(stats.status.code(), Some(0), "{stats:?}");
    eprintln!("done after {:?}", started.elapsed());
    drop(b);
}

#[test]
fn active_standby_member_b_takes_over_after_a_is_killed_and_absorbs_the_replay() {
    const FIRST: u64 = 4_000;
    const TOTAL: u64 = 5_000;
    let db = PgDb::new("standby");
    let dsn = db.dsn();
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let mut a = Consumer::with_config(
        dir.path(),
        "a",
        &member_config(&dsn, &[broker.url()], "rg-a", None, "v5"),
    );
    let mut b = Consumer::with_config(
        dir.path(),
        "b",
        &member_config(&dsn, &[broker.url()], "rg-b", None, "v5"),
    );
    assert_ne!(a.config, b.config);
    // The standby's durable session exists from deployment on: B subscribes once and goes
    // away; from then on the broker keeps every message of the feed for it too.
    b.start();
    b.wait_subscribed();
    assert_eq!(b.stop(Duration::from_secs(10)), Some(0), "{}", b.log_text());
    a.start();
    a.wait_subscribed();
    let port = broker.port;
    let publisher = std::thread::spawn(move || {
        let broker = Broker::attach(port);
        for chunk in events(0, FIRST).chunks(500) {
            broker.publish_lines(TOPIC, chunk, "pub-standby");
            std::thread::sleep(Duration::from_millis(30));
        }
    });
    wait_counts(&dsn, Duration::from_secs(30), "A applies", |_, e| {
        e >= 2_000
    });
    a.kill9();
    let killed_at = counts(&dsn).unwrap();
    publisher.join().unwrap();
    // The feed goes on while nobody consumes.
    broker.publish_lines(TOPIC, &events(FIRST, TOTAL), "pub-standby");
    let (a_audit, a_applied) = counts(&dsn).unwrap();
    assert_eq!((a_audit, a_applied), killed_at, "A is dead");
    assert!(a_applied < FIRST, "A was killed mid-feed ({a_applied})");
    assert_eq!(
        a_audit, a_applied,
        "A decided every delivery once, all applied"
    );

    b.start();
    wait_counts(&dsn, Duration::from_secs(60), "B takes over", |audit, _| {
        audit >= a_audit + TOTAL
    });
    common::assert_quiet(
        "B got a message of its session twice",
        Duration::from_millis(800),
        || counts(&dsn).is_some_and(|(audit, _)| audit != a_audit + TOTAL),
    );
    let audit = scan_audit(&dsn);
    assert_eq!(
        audit.len() as u64,
        a_audit + TOTAL,
        "B got each message of its session once"
    );
    let o = outcomes(&audit[a_audit as usize..]);
    assert_eq!(
        o.get(&Outcome::Duplicate),
        Some(&a_applied),
        "B decides what A applied duplicate: {o:?}"
    );
    assert_eq!(
        o.get(&Outcome::Applied).copied().unwrap_or(0)
            + o.get(&Outcome::AppliedLate).copied().unwrap_or(0),
        TOTAL - a_applied,
        "{o:?}"
    );
    let want: HashSet<(String, u64)> = (0..TOTAL).map(|i| (format!("E{}", i % 7), i)).collect();
    assert_exactly_once(&scan_effects(&dsn), &want);

    // A comes back as the standby: its session held what it had not acknowledged and all
    // that came since; every one of those is a duplicate now.
    a.start();
    let at_least = a_audit + TOTAL + (TOTAL - a_applied);
    wait_counts(
        &dsn,
        Duration::from_secs(60),
        "A's session drained",
        |audit, _| audit >= at_least,
    );
    let (end_audit, end_effects) =
        wait_quiet(&dsn, Duration::from_secs(1), Duration::from_secs(30));
    assert_eq!(end_effects, TOTAL, "A applied something again");
    let audit = scan_audit(&dsn);
    let o = outcomes(&audit[(a_audit + TOTAL) as usize..]);
    assert_eq!(
        o.get(&Outcome::Duplicate).copied(),
        Some(end_audit - a_audit - TOTAL),
        "{o:?}"
    );
    assert_eq!(b.stop(Duration::from_secs(10)), Some(0), "{}", b.log_text());
    assert_eq!(a.stop(Duration::from_secs(10)), Some(0), "{}", a.log_text());
    assert_exactly_once(&scan_effects(&dsn), &want);
    assert_verifies(&b.config);
}

#[test]
fn postgres_connections_terminated_mid_surge_through_run_lose_nothing() {
    const N: u64 = 10_000;
    let db = PgDb::new("terminate");
    let dsn = db.dsn();
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let mut c = Consumer::with_config(
        dir.path(),
        "rg",
        &member_config(&dsn, &[broker.url()], "rg-term", None, "v5"),
    );
    c.start();
    c.wait_subscribed();
    let port = broker.port;
    let publisher = std::thread::spawn(move || {
        let broker = Broker::attach(port);
        for chunk in events(0, N).chunks(250) {
            broker.publish_lines(TOPIC, chunk, "pub-term");
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    wait_counts(&dsn, Duration::from_secs(30), "first commits", |_, e| {
        e >= 300
    });
    let before = counts(&dsn);
    assert!(
        !publisher.is_finished(),
        "the surge ended before the terminations"
    );
    let mut terminated = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(2500) {
        terminated += db.terminate_connections();
        if let Some(status) = c.exited() {
            panic!("run exited: {status}\n{}", c.log_text());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = counts(&dsn);
    eprintln!("{terminated} connections terminated; (audit, effects) {before:?} -> {after:?}");
    assert!(terminated >= 5, "only {terminated} connections terminated");
    publisher.join().unwrap();
    wait_counts(&dsn, Duration::from_secs(60), "all applied", |_, e| e >= N);
    // Retried batches are decided (duplicates) before the member stops.
    wait_quiet(&dsn, Duration::from_millis(500), Duration::from_secs(30));
    if let Some(status) = c.exited() {
        panic!("run exited: {status}\n{}", c.log_text());
    }
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    let log = c.log_text();
    assert!(
        log.contains("PostgreSQL unreachable"),
        "no commit saw its connection terminated:\n{log}"
    );
    assert!(log.contains("PostgreSQL reachable again"), "{log}");
    let want: HashSet<(String, u64)> = (0..N).map(|i| (format!("E{}", i % 7), i)).collect();
    assert_exactly_once(&scan_effects(&dsn), &want);
    let audit = scan_audit(&dsn);
    let o = outcomes(&audit);
    // Each delivery decided once, plus a duplicate per message of a batch whose COMMIT landed
    // unanswered and was retried (the broker never redelivers: the member stayed connected).
    assert_eq!(
        o.get(&Outcome::Applied).copied().unwrap_or(0)
            + o.get(&Outcome::AppliedLate).copied().unwrap_or(0),
        N,
        "{o:?}"
    );
    let other: u64 = o
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k,
                Outcome::Applied | Outcome::AppliedLate | Outcome::Duplicate
            )
        })
        .map(|(_, n)| n)
        .sum();
    assert_eq!(other, 0, "{o:?}");
    assert_verifies(&c.config);
}

/// A TCP proxy in front of the local PostgreSQL that the test can cut off or freeze. Cut:
/// every connection through it is closed and new ones are closed at once (the server is
/// unreachable for whoever connects through it; nobody else is disturbed). Frozen: it stops
/// forwarding and accepting but closes nothing, as a proxy process stopped with SIGSTOP (the
/// kernel still completes new TCP handshakes and buffers what is sent): the server stops
/// answering, and no socket says so.
struct PgProxy {
    port: u16,
    down: Arc<std::sync::atomic::AtomicBool>,
    frozen: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
}

/// Copies `from` to `to` until either ends, holding what it read while `frozen`.
fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    frozen: &std::sync::atomic::AtomicBool,
) {
    use std::io::{Read as _, Write as _};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

impl PgProxy {
    fn start() -> PgProxy {
        use std::net::{TcpListener, TcpStream};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let frozen = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns = Arc::new(std::sync::Mutex::new(Vec::<TcpStream>::new()));
        let (d, f, c) = (down.clone(), frozen.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                while f.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                if d.load(Ordering::SeqCst) {
                    continue; // dropped: closed at once
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", 5432)) else {
                    continue;
                };
                {
                    let mut list = c.lock().unwrap();
                    list.push(client.try_clone().unwrap());
                    list.push(server.try_clone().unwrap());
                }
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let f = f.clone();
                    std::thread::spawn(move || pump(from, to, &f));
                }
            }
        });
        PgProxy {
            port,
            down,
            frozen,
            conns,
        }
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    fn thaw(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }

    fn cut(&self) {
        self.down.store(true, Ordering::SeqCst);
        for s in self.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.down.store(false, Ordering::SeqCst);
    }

    /// `db`'s dsn through this proxy.
    fn dsn(&self, db: &PgDb) -> String {
        db.dsn()
            .replace("port=5432", &format!("port={}", self.port))
    }
}

/// A database of the test's own that the member reaches only through a `PgProxy`, a broker of
/// its own, and the member on both (not started). In the order a test declares them, so the
/// member goes first when they drop.
fn member_behind_proxy(
    db_name: &str,
    client_id: &str,
) -> (PgDb, PgProxy, tempfile::TempDir, Broker, Consumer) {
    let db = PgDb::new(db_name);
    let proxy = PgProxy::start();
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let c = Consumer::with_config(
        dir.path(),
        "rg",
        &member_config(&proxy.dsn(&db), &[broker.url()], client_id, None, "v5"),
    );
    (db, proxy, dir, broker, c)
}

#[test]
fn while_postgres_is_cut_off_run_keeps_pinging_the_watchdog_with_an_unreachable_status() {
    const N: u64 = 3_000;
    let (db, proxy, dir, broker, mut c) = member_behind_proxy("cutoff", "rg-cut");
    let dsn = db.dsn();
    // The metrics say so too (their store reads go through the proxy as well).
    let port = super::broker::free_port();
    let mut config = std::fs::read_to_string(&c.config).unwrap();
    config += &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    std::fs::write(&c.config, config).unwrap();
    let gauges = || {
        let m = super::metrics::scrape(port).1;
        let v = |name: &str| super::metrics::value(&m, name);
        (
            v("replay_guard_store_unreachable"),
            v("replay_guard_store_readable"),
        )
    };
    let (sock_path, notes) = notify_socket(dir.path());
    // A 1 s watchdog: a ping is due every 500 ms.
    c.start_env(&[
        ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
        ("WATCHDOG_USEC", "1000000"),
    ]);
    c.wait_subscribed();
    broker.publish_lines(TOPIC, &events(0, 2_000), "pub-cut");
    wait_counts(&dsn, Duration::from_secs(30), "first commits", |_, e| {
        e >= 2_000
    });
    proxy.cut();
    let cut_at = Instant::now();
    // The feed goes on while the server is out of reach: the member keeps it unacknowledged.
    broker.publish_lines(TOPIC, &events(2_000, N), "pub-cut");
    // systemd (WatchdogSec) restarts a service that stops pinging: an outage of the server
    // must not starve the watchdog, and the STATUS says why nothing is acknowledged.
    let during = || -> Vec<String> {
        notes
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| *t > cut_at + Duration::from_secs(2))
            .map(|(_, m)| m.clone())
            .collect()
    };
    let pinged = |m: &String| {
        m.starts_with("WATCHDOG=1") && m.contains("STATUS=PostgreSQL UNREACHABLE since")
    };
    common::wait_until(
        common::lazy(|| {
            format!(
                "a watchdog ping with the unreachable status from 2 s into the outage on: \
                 {:?}\nlog:\n{}",
                during(),
                c.log_text()
            )
        }),
        Duration::from_secs(10),
        || during().iter().filter(|m| pinged(m)).count() >= 2,
    );
    if let Some(status) = c.exited() {
        panic!("run exited: {status}\n{}", c.log_text());
    }
    assert_eq!(
        counts(&dsn).unwrap().1,
        2_000,
        "committed without the server?"
    );
    assert_eq!(gauges(), (1.0, 0.0), "unreachable, and the store unread");
    proxy.restore();
    wait_counts(&dsn, Duration::from_secs(30), "all applied", |_, e| e >= N);
    super::metrics::eventually(Duration::from_secs(10), "reachable again", || {
        let g = gauges();
        (g == (0.0, 1.0), g)
    });
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    let log = c.log_text();
    assert!(log.contains("PostgreSQL unreachable"), "{log}");
    assert!(log.contains("PostgreSQL reachable again"), "{log}");
    let want: HashSet<(String, u64)> = (0..N).map(|i| (format!("E{}", i % 7), i)).collect();
    assert_exactly_once(&scan_effects(&dsn), &want);
    assert_verifies(&c.config);
}

#[test]
fn a_postgres_connection_that_stops_answering_is_given_up_logged_and_retried_and_each_message_decided_once()
 {
    const N: u64 = 2_000;
    let (db, proxy, dir, broker, mut c) = member_behind_proxy("frozen", "rg-frozen");
    let dsn = db.dsn();
    // A 1 s deadline per round trip, a 2 s one per connection attempt, and the metrics.
    let port = super::broker::free_port();
    let config = std::fs::read_to_string(&c.config)
        .unwrap()
        .replacen("[mqtt]\n", "statement_timeout_ms = 1000\n[mqtt]\n", 1)
        .replacen(
            &format!("dbname={}\"", db.name),
            &format!("dbname={} connect_timeout=2\"", db.name),
            1,
        )
        + &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    assert!(config.contains("connect_timeout=2"), "{config}");
    std::fs::write(&c.config, config).unwrap();
    let unreachable = || {
        let m = super::metrics::scrape(port).1;
        super::metrics::value(&m, "replay_guard_store_unreachable")
    };
    let (sock_path, notes) = notify_socket(dir.path());
    // A 2 s watchdog: a ping, with the STATUS, every second.
    c.start_env(&[
        ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
        ("WATCHDOG_USEC", "2000000"),
    ]);
    c.wait_subscribed();
    broker.publish_lines(TOPIC, &events(0, 1_000), "pub-frozen");
    wait_counts(&dsn, Duration::from_secs(30), "first commits", |_, e| {
        e >= 1_000
    });
    let mark = c.log_text().len();
    proxy.freeze();
    let frozen_at = Instant::now();
    // The next batch's round trips reach a proxy that takes them and never answers.
    broker.publish_lines(TOPIC, &events(1_000, N), "pub-frozen");
    common::wait_until(
        common::lazy(|| format!("the hang is logged:\n{}", &c.log_text()[mark..])),
        Duration::from_secs(10),
        || c.log_text()[mark..].contains("PostgreSQL unreachable"),
    );
    let logged = frozen_at.elapsed();
    eprintln!("proxy frozen -> `PostgreSQL unreachable` logged after {logged:?}");
    let log = c.log_text()[mark..].to_string();
    assert!(
        log.contains("did not answer within 1000 ms ([store] statement_timeout_ms)"),
        "{log}"
    );
    assert!(logged < Duration::from_secs(5), "{logged:?}");
    super::metrics::eventually(Duration::from_secs(5), "unreachable gauge", || {
        let v = unreachable();
        (v == 1.0, v)
    });
    let status = "STATUS=PostgreSQL UNREACHABLE since";
    super::metrics::eventually(Duration::from_secs(5), "STATUS", || {
        let seen: Vec<String> = notes
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| *t > frozen_at)
            .map(|(_, m)| m.clone())
            .collect();
        (
            seen.iter()
                .any(|m| m.starts_with("WATCHDOG=1") && m.contains(status)),
            seen,
        )
    });
    if let Some(exit) = c.exited() {
        panic!("run exited: {exit}\n{}", c.log_text());
    }
    assert_eq!(
        counts(&dsn).unwrap().1,
        1_000,
        "committed through a frozen proxy?"
    );

    proxy.thaw();
    let thawed = Instant::now();
    wait_counts(&dsn, Duration::from_secs(30), "all applied", |_, e| e >= N);
    eprintln!(
        "proxy thawed -> all {N} applied after {:?}",
        thawed.elapsed()
    );
    super::metrics::eventually(Duration::from_secs(10), "reachable again", || {
        let v = unreachable();
        (v == 0.0, v)
    });
    wait_quiet(&dsn, Duration::from_millis(500), Duration::from_secs(20));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    assert!(
        c.log_text()[mark..].contains("PostgreSQL reachable again"),
        "{}",
        c.log_text()
    );
    let want: HashSet<(String, u64)> = (0..N).map(|i| (format!("E{}", i % 7), i)).collect();
    assert_exactly_once(&scan_effects(&dsn), &want);
    // Each delivery decided: applied once, and a redelivery of what an unanswered commit
    // had landed is a duplicate, never a second application.
    let o = outcomes(&scan_audit(&dsn));
    assert_eq!(o.get(&Outcome::Applied).copied().unwrap_or(0), N, "{o:?}");
    assert!(
        o.keys()
            .all(|k| matches!(k, Outcome::Applied | Outcome::Duplicate)),
        "{o:?}"
    );
    assert_verifies(&c.config);
}

/// The datagrams a fake systemd notify socket in `dir` receives, with their arrival times.
type Notes = Arc<std::sync::Mutex<Vec<(Instant, String)>>>;

fn notify_socket(dir: &Path) -> (std::path::PathBuf, Notes) {
    let path = dir.join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    let notes: Notes = Arc::default();
    let out = notes.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1024];
        while let Ok(n) = sock.recv(&mut buf) {
            let m = String::from_utf8_lossy(&buf[..n]).into_owned();
            out.lock().unwrap().push((Instant::now(), m));
        }
    });
    (path, notes)
}

#[test]
fn run_started_while_postgres_is_unreachable_waits_subscribes_only_once_open_and_decides_the_queued_feed_once()
 {
    const N: u64 = 1_000;
    let (db, proxy, dir, broker, mut c) = member_behind_proxy("startwait", "rg-startwait");
    let dsn = db.dsn();
    // A first start makes the schema and the member's persistent session; then the service
    // restarts while the server is out of reach (a reboot where PostgreSQL comes up later).
    c.start();
    c.wait_subscribed();
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    proxy.cut();
    let mark = c.log_text().len();
    let (sock, notes) = notify_socket(dir.path());
    // A 1 s watchdog: a ping is due every 500 ms.
    c.start_env(&[
        ("NOTIFY_SOCKET", sock.to_str().unwrap()),
        ("WATCHDOG_USEC", "1000000"),
    ]);
    c.wait_log(
        "PostgreSQL unreachable at start; retrying",
        Duration::from_secs(10),
    );
    // The feed goes on: the broker keeps it in the member's session.
    broker.publish_lines(TOPIC, &events(0, N), "pub-startwait");
    let target = format!(
        "postgresql 127.0.0.1:{}/{} schema {SCHEMA}",
        proxy.port, db.name
    );
    let status = format!("STATUS=waiting for PostgreSQL at {target} since ");
    // Pings from 1 s after READY on: the watchdog does not restart a member that waits.
    let pings = || {
        let during = notes.lock().unwrap().clone();
        let ready = during.iter().find(|(_, m)| m.starts_with("READY=1"))?.0;
        let n = during
            .iter()
            .filter(|(t, m)| {
                *t > ready + Duration::from_secs(1)
                    && m.starts_with("WATCHDOG=1")
                    && m.contains(&status)
            })
            .count();
        Some(n)
    };
    common::wait_until(
        common::lazy(|| {
            format!(
                "two watchdog pings while waiting: {:?}",
                notes.lock().unwrap()
            )
        }),
        Duration::from_secs(10),
        || pings().is_some_and(|n| n >= 2),
    );
    if let Some(status) = c.exited() {
        panic!("run exited while waiting: {status}\n{}", c.log_text());
    }
    assert_eq!(counts(&dsn), Some((0, 0)), "decided without the server?");
    let waiting = c.log_text()[mark..].to_string();
    assert!(
        !waiting.contains("connected broker") && !waiting.contains("database open"),
        "connected to the broker before the store was open:\n{waiting}"
    );
    assert!(
        !waiting.contains(&format!("port={}", proxy.port)) && !waiting.contains("user=postgres"),
        "the dsn was logged:\n{waiting}"
    );
    let during: Vec<(Instant, String)> = notes.lock().unwrap().clone();
    let ready = during
        .iter()
        .find(|(_, m)| m.starts_with("READY=1"))
        .unwrap_or_else(|| panic!("no READY=1 while waiting: {during:?}"));
    assert!(ready.1.contains(&status), "{ready:?}");

    proxy.restore();
    let opened = Instant::now();
    wait_counts(&dsn, Duration::from_secs(15), "first commit", |_, e| e > 0);
    let first_commit = opened.elapsed();
    wait_counts(&dsn, Duration::from_secs(30), "all applied", |_, e| e >= N);
    eprintln!(
        "server reachable again -> first commit {first_commit:?}, all {N} applied {:?}",
        opened.elapsed()
    );
    common::assert_quiet(
        "a delivery was decided twice",
        Duration::from_millis(500),
        || counts(&dsn).is_some_and(|(audit, _)| audit != N),
    );
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    let log = c.log_text()[mark..].to_string();
    assert!(log.contains("PostgreSQL reachable again"), "{log}");
    assert!(log.contains("session_present=true"), "{log}");
    let want: HashSet<(String, u64)> = (0..N).map(|i| (format!("E{}", i % 7), i)).collect();
    assert_exactly_once(&scan_effects(&dsn), &want);
    let dump = common::run(&["dump-audit", "--config", c.config.to_str().unwrap()]);
    assert_eq!(dump.status.code(), Some(0), "{dump:?}");
    let lines = String::from_utf8(dump.stdout).unwrap();
    assert_eq!(
        lines.lines().count() as u64,
        N,
        "each delivery decided once"
    );
    assert!(
        lines.lines().all(|l| l.contains("\"outcome\":\"applied\"")),
        "{}",
        lines
            .lines()
            .find(|l| !l.contains("\"outcome\":\"applied\""))
            .unwrap()
    );
    assert_verifies(&c.config);
}

#[test]
fn sigterm_while_run_waits_for_postgres_at_start_exits_0_at_once() {
    let db = PgDb::new("startterm");
    let proxy = PgProxy::start();
    proxy.cut();
    let via_proxy = proxy.dsn(&db);
    let dir = tempfile::tempdir().unwrap();
    // No broker at all: nothing may connect to one before the store is open.
    let broker = format!("mqtt://127.0.0.1:{}", free_port());
    let mut c = Consumer::with_config(
        dir.path(),
        "rg",
        &member_config(&via_proxy, &[broker], "rg-startterm", None, "v5"),
    );
    c.start();
    c.wait_log(
        "PostgreSQL unreachable at start; retrying",
        Duration::from_secs(10),
    );
    // Its 2nd and 4th attempts failed too (logged at each power of two): it waits between
    // attempts, as it would for long.
    common::wait_until(
        common::lazy(|| format!("the 4th attempt fails:\n{}", c.log_text())),
        Duration::from_secs(10),
        || c.log_text().matches("PostgreSQL still unreachable").count() >= 2,
    );
    assert!(c.exited().is_none(), "{}", c.log_text());
    let asked = Instant::now();
    assert_eq!(c.stop(Duration::from_secs(5)), Some(0), "{}", c.log_text());
    let took = asked.elapsed();
    eprintln!("SIGTERM while waiting for PostgreSQL -> exit 0 in {took:?}");
    assert!(took < Duration::from_secs(1), "stopped after {took:?}");
    let log = c.log_text();
    assert!(
        log.contains("shutdown requested while waiting for PostgreSQL"),
        "{log}"
    );
    assert!(!log.contains("connected"), "{log}");
    assert_eq!(
        db.sql("SELECT count(*) FROM pg_namespace WHERE nspname = 'replay_guard'"),
        "0",
        "the schema was made through a closed proxy?"
    );
}

#[test]
fn run_fails_fast_on_a_newer_schema_and_ingest_on_an_unreachable_server() {
    let db = PgDb::new("startfail");
    db.sql(&format!(
        "CREATE SCHEMA {SCHEMA}; CREATE TABLE {SCHEMA}.schema_version (version integer NOT NULL); \
         INSERT INTO {SCHEMA}.schema_version VALUES (99)"
    ));
    let dir = tempfile::tempdir().unwrap();
    let broker = format!("mqtt://127.0.0.1:{}", free_port());
    let mut c = Consumer::with_config(
        dir.path(),
        "rg",
        &member_config(
            &db.dsn(),
            std::slice::from_ref(&broker),
            "rg-startfail",
            None,
            "v5",
        ),
    );
    // A refusal is not an outage: no waiting, exit 2 (systemd restarts; the log says why).
    c.start();
    let mut status = None;
    common::wait_until(
        "run exits on a newer schema",
        Duration::from_secs(10),
        || {
            status = c.exited();
            status.is_some()
        },
    );
    let status = status.expect("exited");
    assert_eq!(status.code(), Some(2), "{}", c.log_text());
    let log = c.log_text();
    assert!(log.contains("schema version 99"), "{log}");
    assert!(!log.contains("unreachable"), "{log}");

    // `ingest` is a one-shot command: an unreachable server is an error at once.
    let proxy = PgProxy::start();
    proxy.cut();
    let via_proxy = proxy.dsn(&db);
    let config = dir.path().join("ingest.toml");
    std::fs::write(
        &config,
        member_config(&via_proxy, &[broker], "rg-ingest", None, "v5"),
    )
    .unwrap();
    let feed = events(0, 10).join("\n");
    let start = Instant::now();
    let out = common::run_with_stdin(
        &["ingest", "--config", config.to_str().unwrap(), "-"],
        feed.as_bytes(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    assert!(
        stderr.contains(&format!(
            "PostgreSQL at postgresql 127.0.0.1:{}/{} schema {SCHEMA} is unreachable",
            proxy.port, db.name
        )) && stderr.contains("nothing was decided"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("user=postgres"),
        "the dsn was printed: {stderr}"
    );
}
