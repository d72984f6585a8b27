//! `run` against real Mosquitto brokers: exactly-once effects across a basic feed, a real
//! failover replay from a restored persistence file, kill -9 of the consumer mid-surge, and
//! SIGTERM mid-surge; over MQTT 5 and 3.1.1.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use replay_guard::model::Outcome;
use replay_guard::store::{Reader, StoreError};

use super::broker::{Broker, signal};
use super::common;

/// A `replay-guard run` process with its config and database.
pub struct Consumer {
    pub config: PathBuf,
    pub db: PathBuf,
    log: PathBuf,
    /// The log's length when the process was last started: what it logged since is after it.
    mark: usize,
    child: Option<Child>,
}

impl Consumer {
    pub fn new(dir: &Path, brokers: &[String], protocol: &str, client_id: &str) -> Consumer {
        let db = dir.join("rg.redb");
        let config = dir.join("rg.toml");
        let list: Vec<String> = brokers.iter().map(|b| format!("{b:?}")).collect();
        std::fs::write(
            &config,
            format!(
                "[store]\npath = {:?}\n[mqtt]\nbrokers = [{}]\nclient_id = {client_id:?}\ntopics = [\"incidents/#\"]\n\
                 protocol = {protocol:?}\nretries_per_broker = 2\nbackoff_initial_ms = 50\nbackoff_max_ms = 200\n\
                 keep_alive_seconds = 5\n[commit]\nmax_batch = 256\nlinger_ms = 5\n[service]\nshutdown_timeout_seconds = 10\n",
                db.to_str().unwrap(),
                list.join(", ")
            ),
        )
        .unwrap();
        Consumer {
            config,
            db,
            log: dir.join("rg.log"),
            mark: 0,
            child: None,
        }
    }

    /// A consumer whose config file `{name}.toml` in `dir` holds `text` as given (e.g. a
    /// PostgreSQL store); its log is `{name}.log`. `db`/`decided`/`outcomes` read a redb file
    /// only, so they are of no use with another backend.
    pub fn with_config(dir: &Path, name: &str, text: &str) -> Consumer {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, text).unwrap();
        Consumer {
            config,
            db: dir.join(format!("{name}.redb")),
            log: dir.join(format!("{name}.log")),
            mark: 0,
            child: None,
        }
    }

    /// The exit status if the process has exited on its own (it stays reaped and recorded
    /// by the caller; the consumer then counts as not started).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().unwrap()?;
        self.child = None;
        Some(status)
    }

    pub fn start(&mut self) {
        self.start_env(&[]);
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts it with extra environment variables (e.g. NOTIFY_SOCKET).
    pub fn start_env(&mut self, env: &[(&str, &str)]) {
        assert!(self.child.is_none());
        self.mark = self.log_text().len();
        let child = common::logged_command(
            &["run", "--config", self.config.to_str().unwrap()],
            &self.log,
        )
        .envs(env.iter().copied())
        .spawn()
        .unwrap();
        self.child = Some(child);
    }

    /// SIGTERM, then the exit code (which must come within `limit`; else it is killed when
    /// the consumer drops).
    pub fn stop(&mut self, limit: Duration) -> Option<i32> {
        let child = self.child.as_mut().expect("running");
        signal(child.id() as i32, "TERM");
        let mut status = None;
        let log = self.log.clone();
        common::wait_until(
            common::lazy(|| format!("the consumer stops; log:\n{}", common::log_from(&log, 0))),
            limit,
            || {
                status = child.try_wait().unwrap();
                status.is_some()
            },
        );
        self.child = None;
        status.and_then(|s| s.code())
    }

    /// SIGKILL, and reap it.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What it logged since it was last started.
    pub fn log_since_start(&self) -> String {
        common::log_from(&self.log, self.mark)
    }

    /// Waits until `needle` is logged (since the process was last started).
    pub fn wait_log(&self, needle: &str, limit: Duration) {
        common::wait_until(
            common::lazy(|| format!("{needle:?} is logged:\n{}", self.log_since_start())),
            limit,
            || self.log_since_start().contains(needle),
        );
    }

    /// Waits until, since it was last started, a broker granted its subscription.
    pub fn wait_subscribed(&self) {
        common::wait_subscribed(&self.log, self.mark, "");
    }

    /// Waits until, since it was last started, `broker` granted its subscription.
    pub fn wait_subscribed_to(&self, broker: &str) {
        common::wait_subscribed(&self.log, self.mark, broker);
    }

    /// Number of audit entries, once the database can be read.
    pub fn decided(&self) -> Option<u64> {
        let reader = Reader::open(&self.db).ok()?;
        Some(reader.begin().ok()?.summary().ok()?.audit_entries)
    }

    /// Number of effects (applied deliveries), once the database can be read.
    pub fn applied(&self) -> Option<u64> {
        let reader = Reader::open(&self.db).ok()?;
        Some(reader.begin().ok()?.summary().ok()?.effects)
    }

    pub fn wait_decided(&self, at_least: u64, limit: Duration) {
        common::wait_until(
            common::lazy(|| {
                format!(
                    "{at_least} are decided (now {:?}); log:\n{}",
                    self.decided(),
                    self.log_text()
                )
            }),
            limit,
            || self.decided().unwrap_or(0) >= at_least,
        );
    }

    /// Waits until `n` effects are applied (the audit count alone also counts redeliveries).
    pub fn wait_applied(&self, n: u64, limit: Duration) {
        common::wait_until(
            common::lazy(|| {
                format!(
                    "{n} are applied (now {:?}); log:\n{}",
                    self.applied(),
                    self.log_text()
                )
            }),
            limit,
            || self.applied().unwrap_or(0) >= n,
        );
    }

    /// Outcome counts from the audit log.
    pub fn outcomes(&self) -> BTreeMap<Outcome, u64> {
        let reader = Reader::open(&self.db).unwrap();
        let txn = reader.begin().unwrap();
        let mut out = BTreeMap::new();
        txn.scan_audit::<StoreError>(0, |e| {
            *out.entry(e.outcome().unwrap()).or_insert(0) += 1;
            Ok(std::ops::ControlFlow::Continue(()))
        })
        .unwrap();
        out
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn events(from: u64, to: u64) -> Vec<String> {
    (from..to)
        .map(|i| common::msg("CALFIRE", &format!("E{}", i % 7), 1, i, "status"))
        .collect()
}

/// Every effect's (source, sequence) exactly once, and the set equals `want`.
fn assert_exactly_once(db: &Path, want: &HashSet<(String, u64)>) {
    let effects = common::effects(db);
    let mut seen = HashSet::new();
    for e in &effects {
        let k = (e.record.source_id.clone(), e.record.sequence);
        assert!(seen.insert(k.clone()), "effect {k:?} applied twice");
    }
    assert_eq!(&seen, want, "applied set differs from what was published");
}

fn want(from: u64, to: u64) -> HashSet<(String, u64)> {
    (from..to).map(|i| (format!("E{}", i % 7), i)).collect()
}

fn basic(protocol: &str) {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let mut c = Consumer::new(dir.path(), &[broker.url()], protocol, "rg-basic");
    c.start();
    c.wait_subscribed();
    let mut lines = events(0, 2000);
    lines.push("not json".into());
    // Same key as event 5, other content: a conflict, quarantined; the feed keeps flowing.
    lines.push(common::msg("CALFIRE", "E5", 1, 5, "tampered"));
    broker.publish_lines("incidents/ca", &lines, "pub-basic");
    // The publisher reconnects and resends the same bytes.
    let resent = events(0, 200);
    broker.publish_lines("incidents/ca", &resent, "pub-basic");
    let total = (lines.len() + resent.len()) as u64;
    c.wait_decided(total, Duration::from_secs(30));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    let o = c.outcomes();
    assert_eq!(o.get(&Outcome::Applied), Some(&2000));
    assert_eq!(o.get(&Outcome::Duplicate), Some(&200));
    assert_eq!(o.get(&Outcome::Malformed), Some(&1));
    assert_eq!(o.get(&Outcome::Conflict), Some(&1));
    assert_exactly_once(&c.db, &want(0, 2000));
    // Everything was acknowledged: the kept session holds nothing for us. A broker sends what
    // a resumed session holds right after its CONNACK, before our SUBACK.
    c.start();
    c.wait_subscribed();
    common::assert_quiet(
        "the broker redelivered acknowledged messages",
        Duration::from_millis(500),
        || c.decided().is_some_and(|d| d != total),
    );
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0));
    assert_eq!(
        c.decided(),
        Some(total),
        "the broker redelivered acknowledged messages"
    );
}

#[test]
fn basic_feed_is_applied_once_and_fully_acknowledged_over_mqtt5() {
    basic("v5");
}

#[test]
fn basic_feed_is_applied_once_and_fully_acknowledged_over_mqtt311() {
    basic("v3.1.1");
}

/// Broker A snapshots with messages pending for our session, the consumer applies and acks
/// them, A dies, standby B starts from A's snapshot and replays them (mostly with DUP = 0).
fn failover_replay(protocol: &str) {
    let dir = tempfile::tempdir().unwrap();
    // A logs every packet, so the test sees our PUBACKs arrive.
    let mut a = Broker::start_with(&dir.path().join("a"), true, "log_type all\n");
    let b_port = super::broker::free_port();
    let b_url = format!("mqtt://127.0.0.1:{b_port}");
    let mut c = Consumer::new(dir.path(), &[a.url(), b_url], protocol, "rg-failover");
    // Create the session on A, then go away keeping it.
    c.start();
    c.wait_subscribed();
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0));
    a.publish_lines("incidents/ca", &events(0, 300), "pub-a");
    a.snapshot(); // 300 pending for our session in A's snapshot
    c.start();
    c.wait_decided(300, Duration::from_secs(30));
    a.wait_pubacks("rg-failover", 300);
    let b = a.kill_and_restore_into(&dir.path().join("b"), b_port);
    // B replays the 300 from its restored session: each is suppressed.
    c.wait_decided(600, Duration::from_secs(30));
    b.publish_lines("incidents/ca", &events(300, 400), "pub-b");
    c.wait_decided(700, Duration::from_secs(30));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    let o = c.outcomes();
    assert_eq!(o.get(&Outcome::Applied), Some(&400), "{o:?}");
    assert_eq!(o.get(&Outcome::Duplicate), Some(&300), "{o:?}");
    assert_exactly_once(&c.db, &want(0, 400));
    let log = c.log_text();
    assert!(log.contains("switching broker"), "{log}");
    assert!(
        log.contains("replay burst absorbed: 300 duplicates"),
        "{log}"
    );
    // `stats` reports the burst, with the broker that replayed it.
    let stats = common::run(&["stats", "--format", "json", "--db", c.db.to_str().unwrap()]);
    assert_eq!(stats.status.code(), Some(0));
    let stats = replay_guard::json::parse(&stats.stdout, 16).unwrap();
    let bursts = match stats.pointer(&replay_guard::json::Pointer::parse("/replay_bursts").unwrap())
    {
        Some(replay_guard::json::Json::Array(b)) => b.clone(),
        other => panic!("replay_bursts: {other:?}"),
    };
    assert_eq!(bursts.len(), 1, "{bursts:?}");
    let field = |name: &str| {
        bursts[0]
            .pointer(&replay_guard::json::Pointer::parse(&format!("/{name}")).unwrap())
            .cloned()
    };
    assert_eq!(
        field("duplicates"),
        Some(replay_guard::json::Json::Number("300".into()))
    );
    assert_eq!(
        field("broker"),
        Some(replay_guard::json::Json::String(b.url()))
    );
}

#[test]
fn failover_replay_from_a_restored_broker_is_suppressed_over_mqtt5() {
    failover_replay("v5");
}

#[test]
fn failover_replay_from_a_restored_broker_is_suppressed_over_mqtt311() {
    failover_replay("v3.1.1");
}

#[test]
fn consumer_killed_mid_surge_ten_times_applies_every_event_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let mut c = Consumer::new(dir.path(), &[broker.url()], "v5", "rg-kill");
    c.start();
    c.wait_subscribed();
    const N: u64 = 12_000;
    let publisher = {
        let lines = events(0, N);
        let port = broker.port;
        std::thread::spawn(move || {
            let b = Broker::attach(port);
            for chunk in lines.chunks(400) {
                b.publish_lines("incidents/ca", chunk, "pub-kill");
                std::thread::sleep(Duration::from_millis(60));
            }
        })
    };
    let mut rng = common::SplitMix64::new(7);
    let mut mid_surge = 0;
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(100 + (rng.next_u64() % 200)));
        let decided = c.decided().unwrap_or(0);
        if !publisher.is_finished() && decided > 0 && decided < N {
            mid_surge += 1;
        }
        c.kill9();
        c.start();
    }
    assert!(
        mid_surge >= 5,
        "only {mid_surge} of 10 kills landed mid-surge"
    );
    publisher.join().unwrap();
    // Redeliveries after the kills are decided too: the audit count is no measure here.
    c.wait_applied(N, Duration::from_secs(60));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    assert_exactly_once(&c.db, &want(0, N));
}

#[test]
fn sigterm_mid_surge_exits_0_in_time_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let mut c = Consumer::new(dir.path(), &[broker.url()], "v5", "rg-term");
    c.start();
    c.wait_subscribed();
    const N: u64 = 8_000;
    let port = broker.port;
    let publisher = std::thread::spawn(move || {
        Broker::attach(port).publish_lines("incidents/ca", &events(0, N), "pub-term")
    });
    c.wait_decided(500, Duration::from_secs(30));
    let started = Instant::now();
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    assert!(started.elapsed() < Duration::from_secs(10));
    publisher.join().unwrap();
    c.start();
    c.wait_decided(N, Duration::from_secs(60));
    common::assert_quiet(
        "a committed delivery came back",
        Duration::from_millis(500),
        || c.decided().is_some_and(|d| d != N),
    );
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0));
    assert_exactly_once(&c.db, &want(0, N));
    // The drain acknowledged everything it had committed: nothing committed came back.
    let o = c.outcomes();
    assert_eq!(
        o.get(&Outcome::Duplicate),
        None,
        "committed deliveries were redelivered: {o:?}"
    );
}

#[test]
fn failover_to_a_standby_without_the_session_resubscribes_and_keeps_flowing() {
    // The standby has no session for us (session_present = false): the consumer must
    // subscribe again and not livelock reconnecting (rumqttc issue #1056 needs a stashed
    // outgoing publish; we never publish, and this proves the path).
    let dir = tempfile::tempdir().unwrap();
    let mut a = Broker::start(&dir.path().join("a"), false);
    let b_port = super::broker::free_port();
    let mut c = Consumer::new(
        dir.path(),
        &[a.url(), format!("mqtt://127.0.0.1:{b_port}")],
        "v5",
        "rg-nosession",
    );
    c.start();
    c.wait_subscribed();
    a.publish_lines("incidents/ca", &events(0, 100), "pub-a");
    c.wait_decided(100, Duration::from_secs(30));
    a.kill();
    let b = Broker::start_on(&dir.path().join("b"), b_port, false);
    c.wait_log(
        &format!("connected broker={} session_present=false", b.url()),
        Duration::from_secs(20),
    );
    c.wait_subscribed_to(&b.url());
    b.publish_lines("incidents/ca", &events(100, 200), "pub-b");
    c.wait_decided(200, Duration::from_secs(30));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0));
    assert_exactly_once(&c.db, &want(0, 200));
}

#[test]
fn a_failed_commit_stops_the_service_with_code_2_and_acknowledges_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let mut c = Consumer::new(dir.path(), &[broker.url()], "v5", "rg-fail");
    c.start();
    c.wait_subscribed();
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0));
    for chunk in events(0, 3000).chunks(1000) {
        broker.publish_lines("incidents/ca", chunk, "pub-fail");
    }
    // The file may grow to 1 MiB only: a later commit fails with EFBIG (SIGXFSZ ignored).
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "trap '' XFSZ; ulimit -f 1024; exec {} run --config {}",
            common::bin().display(),
            c.config.display()
        ))
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("storage failure while committing a batch"),
        "{stderr}"
    );
    // Unlimited again: everything not committed before the failure comes back from the broker.
    c.start();
    // Batches committed before the failure whose PUBACKs never left come back as duplicates.
    c.wait_applied(3000, Duration::from_secs(30));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    assert_exactly_once(&c.db, &want(0, 3000));
}

fn oversized(protocol: &str) {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let mut c = Consumer::new(dir.path(), &[broker.url()], protocol, "rg-big");
    let mut text = std::fs::read_to_string(&c.config).unwrap();
    text.push_str("[feed]\nmax_payload_bytes = 1024\n");
    std::fs::write(&c.config, text).unwrap();
    c.start();
    c.wait_subscribed();
    let big = common::msg("CALFIRE", "E9", 1, 9, &"x".repeat(100_000));
    broker.publish_lines(
        "incidents/ca",
        &[events(0, 5), vec![big], events(5, 10)].concat(),
        "pub-big",
    );
    c.wait_decided(11, Duration::from_secs(20));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    let o = c.outcomes();
    assert_eq!(o.get(&Outcome::Applied), Some(&10), "{o:?}");
    assert_eq!(o.get(&Outcome::Malformed), Some(&1), "{o:?}");
    assert!(
        !c.log_text().contains("connection lost"),
        "{}",
        c.log_text()
    );
}

#[test]
fn an_oversized_message_is_quarantined_not_dropped_over_mqtt5() {
    oversized("v5");
}

#[test]
fn an_oversized_message_is_quarantined_not_dropped_over_mqtt311() {
    oversized("v3.1.1");
}
