//! The relay's core through the real binary, with the `exec` sink (a shell script as the
//! receiver): every effect delivered with its stable id despite failing batches and `kill -9`
//! of the relay; `run` with a sink; retention held by a lagging sink; a program writing 300 KB
//! to stderr or leaving a child that holds it, decided by its exit; `relay status`,
//! `parked`, `retry`, `rewind`, `forget` field by field, each action audited.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use replay_guard::json::{self, Json};
use replay_guard::store::relay::{RelayStore, StartAt};
use replay_guard::store::{Store, StoreOptions};

use super::broker::{Broker, signal};
use super::common;

/// A member of a JSON object, as text (strings unquoted).
pub(super) fn field(v: &Json, name: &str) -> String {
    match v {
        Json::Object(m) => match m.iter().find(|(k, _)| k == name) {
            Some((_, Json::String(s))) => s.clone(),
            Some((_, other)) => other.to_compact(),
            None => panic!("no {name} in {}", v.to_compact()),
        },
        other => panic!("not an object: {other:?}"),
    }
}

pub(super) fn stdout(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

pub(super) struct Setup {
    pub(super) dir: PathBuf,
    pub(super) db: PathBuf,
    pub(super) config: PathBuf,
    pub(super) out: PathBuf,
}

/// A database, a receiver script and a config with one exec sink `script` (plus `extra`).
pub(super) fn setup(dir: &Path, script_body: &str, sink_extra: &str, extra: &str) -> Setup {
    let db = dir.join("rg.redb");
    let out = dir.join("received.jsonl");
    let script = dir.join("receiver.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nOUT={:?}\nSTATE={:?}\n{script_body}\n",
            out.to_str().unwrap(),
            dir.join("count").to_str().unwrap()
        ),
    )
    .unwrap();
    let config = dir.join("rg.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\npath = {:?}\n[service]\nshutdown_timeout_seconds = 5\n{extra}\n\
             [[sink]]\nname = \"script\"\nkind = \"exec\"\ncommand = [\"/bin/sh\", {:?}]\n\
             backoff_initial_ms = 10\nbackoff_max_ms = 40\n{sink_extra}\n",
            db.to_str().unwrap(),
            script.to_str().unwrap()
        ),
    )
    .unwrap();
    Setup {
        dir: dir.to_path_buf(),
        db,
        config,
        out,
    }
}

impl Setup {
    pub(super) fn ingest(&self, from: u64, to: u64) {
        let lines: Vec<String> = (from..to)
            .map(|i| common::msg("fire", &format!("e{}", i % 5), 1, i, "status"))
            .collect();
        let file = self.dir.join(format!("feed-{from}.jsonl"));
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        stdout(&common::run(&[
            "ingest",
            "--config",
            self.config.to_str().unwrap(),
            file.to_str().unwrap(),
        ]));
    }

    pub(super) fn relay(&self) -> Child {
        common::logged_command(
            &["relay", "--config", self.config.to_str().unwrap()],
            &self.dir.join("relay.log"),
        )
        .spawn()
        .unwrap()
    }

    /// `run` with this config (which then needs an `[mqtt]` section: `mqtt_section`).
    pub(super) fn run(&self) -> Child {
        Command::new(common::bin())
            .args(["run", "--config", self.config.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("relay.log")).unwrap())
            .spawn()
            .unwrap()
    }

    pub(super) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("relay.log")).unwrap_or_default()
    }

    /// Waits until the `run` started last (its log starts afresh) is subscribed.
    pub(super) fn wait_subscribed(&self) {
        common::wait_subscribed(&self.dir.join("relay.log"), 0, "");
    }

    /// Every event the receiver got, in arrival order.
    pub(super) fn received(&self) -> Vec<Json> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        // Only complete lines: the receiver may be appending the last one right now.
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete
            .lines()
            .map(|l| json::parse(l.as_bytes(), 64).unwrap())
            .collect()
    }

    pub(super) fn wait_received(&self, ids: usize, limit: Duration) {
        let got = || {
            let ids: HashSet<String> = self.received().iter().map(|e| field(e, "id")).collect();
            ids.len()
        };
        common::wait_until(
            common::lazy(|| {
                format!(
                    "{ids} events arrive (now {}); relay log:\n{}",
                    got(),
                    self.log()
                )
            }),
            limit,
            || got() >= ids,
        );
    }

    pub(super) fn status(&self, config: &Path) -> BTreeMap<String, Json> {
        let out = stdout(&common::run(&[
            "relay",
            "status",
            "--config",
            config.to_str().unwrap(),
            "--format",
            "json",
        ]));
        let doc = json::parse(out.trim().as_bytes(), 64).unwrap();
        let Json::Object(m) = doc else { panic!() };
        let Json::Array(sinks) = &m[0].1 else {
            panic!()
        };
        sinks
            .iter()
            .map(|s| (field(s, "sink"), s.clone()))
            .collect()
    }

    /// Every effect's event id, by offset, from `dump-effects`.
    pub(super) fn effect_ids(&self) -> Vec<(u64, String, String)> {
        common::effects(&self.db)
            .iter()
            .map(|e| {
                (
                    e.offset,
                    replay_guard::model::hex(&e.record.key),
                    format!("{}/{}", e.record.agency, e.record.source_id),
                )
            })
            .collect()
    }
}

/// An `[mqtt]` section for `run` against `broker`, committing every 5 ms.
pub(super) fn mqtt_section(broker: &Broker, client_id: &str) -> String {
    format!(
        "[mqtt]\nbrokers = [{:?}]\nclient_id = {client_id:?}\ntopics = [\"incidents/#\"]\n\
         [commit]\nlinger_ms = 5\n",
        broker.url()
    )
}

pub(super) fn stop(child: &mut Child) -> Option<i32> {
    signal(child.id() as i32, "TERM");
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "relay did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The CloudEvents 1.0 JSON format's rules (spec `formats/json-format.md` and the core spec
/// section "Type System" / "Required Attributes"), checked independently of the writer.
fn assert_cloudevent(e: &Json) {
    let Json::Object(members) = e else {
        panic!("an event is a JSON object: {e:?}")
    };
    let mut names = HashSet::new();
    for (name, value) in members {
        assert!(names.insert(name.as_str()), "member {name} twice");
        match name.as_str() {
            "data" => {}
            "data_base64" => assert!(matches!(value, Json::String(_))),
            "specversion" => assert_eq!(value, &Json::String("1.0".into())),
            "id" | "source" | "type" => match value {
                Json::String(s) => assert!(!s.is_empty(), "{name} is empty"),
                other => panic!("{name} must be a string: {other:?}"),
            },
            "time" => match value {
                // RFC 3339, UTC, with milliseconds.
                Json::String(s) => assert!(
                    s.len() == 24
                        && s.ends_with('Z')
                        && s.as_bytes()[10] == b'T'
                        && s[..4].bytes().all(|b| b.is_ascii_digit()),
                    "time {s:?}"
                ),
                other => panic!("time: {other:?}"),
            },
            "datacontenttype" => assert_eq!(value, &Json::String("application/json".into())),
            "subject" => assert!(matches!(value, Json::String(s) if !s.is_empty())),
            ext => {
                // Extension attribute names: lower-case ASCII letters and digits, at most 20.
                assert!(
                    !ext.is_empty()
                        && ext.len() <= 20
                        && ext
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                    "extension name {ext:?}"
                );
                match value {
                    Json::String(_) | Json::Bool(_) => {}
                    // Integers must fit in 32 bits.
                    Json::Number(n) => assert!(n.parse::<i32>().is_ok(), "{ext} = {n}"),
                    other => panic!("extension {ext} has a type CloudEvents lacks: {other:?}"),
                }
            }
        }
    }
    for required in ["id", "source", "specversion", "type"] {
        assert!(names.contains(required), "no {required}");
    }
    assert!(
        !(names.contains("data") && names.contains("data_base64")),
        "data and data_base64 are exclusive"
    );
}

/// Every effect arrived, with the id of its key, in effect-offset order within each source.
pub(super) fn assert_all_delivered(s: &Setup, exactly_once: bool) {
    let effects = s.effect_ids();
    let received = s.received();
    let want: HashSet<&String> = effects.iter().map(|(_, id, _)| id).collect();
    let got: Vec<String> = received.iter().map(|e| field(e, "id")).collect();
    let got_set: HashSet<&String> = got.iter().collect();
    assert_eq!(got_set, want, "the delivered ids differ from the effects");
    if exactly_once {
        assert_eq!(got.len(), want.len(), "an event was delivered twice");
    }
    // Each arrival carries the offset, key and subject of its effect.
    let by_id: BTreeMap<&String, (u64, &String)> =
        effects.iter().map(|(o, id, s)| (id, (*o, s))).collect();
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    for e in &received {
        assert_cloudevent(e);
        let id = field(e, "id");
        let (offset, subject) = by_id[&id];
        assert_eq!(field(e, "rgoffset"), offset.to_string());
        assert_eq!(field(e, "rgkey"), id);
        assert_eq!(&field(e, "subject"), subject);
        // Redeliveries restart from the cursor; a first delivery never goes backwards.
        if exactly_once {
            let prev = last.insert(subject.clone(), offset);
            assert!(prev.is_none_or(|p| p < offset), "out of order in {subject}");
        }
    }
}

#[test]
fn exec_sink_failing_every_third_batch_delivers_every_effect_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(
        dir.path(),
        "n=$(cat \"$STATE\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \"$STATE\"\n\
         if [ $((n % 3)) -eq 0 ]; then cat > /dev/null; echo \"refusing batch $n\" >&2; exit 1; fi\n\
         cat >> \"$OUT\"",
        "batch_max = 7",
        "",
    );
    s.ingest(0, 100);
    let mut relay = s.relay();
    s.wait_received(100, Duration::from_secs(30));
    // More effects while it runs.
    s.ingest(100, 250);
    s.wait_received(250, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
    assert_all_delivered(&s, true);
    let batches: u64 = std::fs::read_to_string(s.dir.join("count"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        batches >= 36,
        "only {batches} batches: the sink did not batch by 7"
    );
    assert!(s.log().contains("refusing batch 3"), "{}", s.log());
    let st = s.status(&s.config);
    let script = &st["script"];
    assert_eq!(field(script, "cursor"), "250");
    assert_eq!(field(script, "head"), "250");
    assert_eq!(field(script, "lag_events"), "0");
    assert_eq!(field(script, "state"), "caught_up");
    assert_eq!(field(script, "delivered"), "250");
}

#[test]
fn a_standalone_relay_serves_its_sinks_lag_as_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let allow = dir.path().join("allow");
    let port = super::broker::free_port();
    let s = setup(
        dir.path(),
        &format!(
            "[ -f {:?} ] || {{ cat > /dev/null; exit 1; }}\ncat >> \"$OUT\"",
            allow
        ),
        "",
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\""),
    );
    s.ingest(0, 20);
    let mut relay = s.relay();
    use super::metrics::{eventually, scrape, value};
    let lag = "replay_guard_relay_lag_events{sink=\"script\"}";
    let delivered = "replay_guard_relay_delivered_total{sink=\"script\"}";
    let failed = "replay_guard_relay_last_error_timestamp_seconds{sink=\"script\"}";
    // The sink's cursor is written when it starts; the receiver refuses every batch so far,
    // so the sink stays 20 behind, and its failures are on record.
    eventually(Duration::from_secs(10), "a failing sink on record", || {
        let (text, m) = scrape(port);
        (m.contains_key(lag) && m.contains_key(failed), text)
    });
    let (text, m) = scrape(port);
    assert_eq!(value(&m, lag), 20.0, "{text}");
    assert_eq!(value(&m, delivered), 0.0, "{text}");
    assert!(value(&m, failed) > 1.7e9, "{text}");
    assert_eq!(value(&m, "replay_guard_store_readable"), 1.0);
    assert!(
        !text.contains("replay_guard_decisions_total"),
        "a relay decides nothing: {text}"
    );
    std::fs::write(&allow, "").unwrap();
    s.wait_received(20, Duration::from_secs(30));
    eventually(Duration::from_secs(10), "lag 0, 20 delivered", || {
        let m = scrape(port).1;
        (value(&m, lag) == 0.0 && value(&m, delivered) == 20.0, m)
    });
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
}

#[test]
fn exec_relay_killed_mid_delivery_delivers_every_effect_with_the_same_id() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(
        dir.path(),
        "sleep 0.02\ncat >> \"$OUT\"",
        "batch_max = 5",
        "",
    );
    s.ingest(0, 600);
    let mut rng = common::SplitMix64::new(3);
    let mut mid = 0;
    for _ in 0..5 {
        let mut relay = s.relay();
        std::thread::sleep(Duration::from_millis(150 + rng.below(150)));
        let got = s.received().len();
        if got > 0 && got < 600 {
            mid += 1;
        }
        relay.kill().unwrap();
        relay.wait().unwrap();
    }
    assert!(mid >= 3, "only {mid} kills landed mid-delivery");
    let mut relay = s.relay();
    s.wait_received(600, Duration::from_secs(60));
    assert_eq!(stop(&mut relay), Some(0));
    // At-least-once across kill -9: repeats carry the same id, and nothing is missing.
    assert_all_delivered(&s, false);
    let n = s.received().len();
    assert!(
        n < 600 + 5 * 100,
        "{n} arrivals: far more redelivery than a cursor flush allows"
    );
    // Every repeat is counted: `relay status` says how many events were offered again,
    // never fewer than the receiver got twice, and says it in its text line too.
    let status = stdout(&common::run(&[
        "relay",
        "status",
        "--config",
        s.config.to_str().unwrap(),
        "--format",
        "json",
    ]));
    let status = json::parse(status.as_bytes(), 64).unwrap();
    let Json::Object(m) = &status else {
        panic!("{}", status.to_compact())
    };
    let Some((_, Json::Array(sinks))) = m.iter().find(|(k, _)| k == "sinks") else {
        panic!("{}", status.to_compact())
    };
    let resent: usize = field(&sinks[0], "resent").parse().unwrap();
    let repeats = n - 600;
    assert!(
        resent >= repeats && (repeats == 0 || resent > 0),
        "the receiver got {repeats} events twice, relay status counts {resent} resent"
    );
    let text = stdout(&common::run(&[
        "relay",
        "status",
        "--config",
        s.config.to_str().unwrap(),
    ]));
    assert!(
        text.contains(&format!("delivered 600, resent {resent}")),
        "{text}"
    );
}

#[test]
fn run_delivers_what_it_applies_to_its_sinks_and_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let s = setup(
        dir.path(),
        "cat >> \"$OUT\"",
        "",
        &mqtt_section(&broker, "rg-relay-run"),
    );
    let mut run = s.run();
    s.wait_subscribed();
    let mut lines: Vec<String> = (0..400)
        .map(|i| common::msg("ems", &format!("m{}", i % 3), 1, i, "x"))
        .collect();
    // Replays: the first 100 again; they are suppressed, so delivered once.
    lines.extend(lines[..100].to_vec());
    broker.publish_lines("incidents/ems", &lines, "pub-relay-run");
    s.wait_received(400, Duration::from_secs(30));
    assert_eq!(stop(&mut run), Some(0), "{}", s.log());
    assert_eq!(common::effects(&s.db).len(), 400);
    assert_all_delivered(&s, true);
    for e in s.received() {
        assert_eq!(field(&e, "source"), "urn:replay-guard:rg-relay-run");
        assert_eq!(field(&e, "type"), "org.replay-guard.effect.v1");
    }
}

#[test]
fn the_relays_notify_status_tells_a_retrying_sinks_lag_as_relay_status_does() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat > /dev/null\nexit 1", "", "");
    s.ingest(0, 20);
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut relay = common::logged_command(
        &["relay", "--config", s.config.to_str().unwrap()],
        &s.dir.join("relay.log"),
    )
    .env("NOTIFY_SOCKET", &sock_path)
    .env("WATCHDOG_USEC", "200000")
    .spawn()
    .unwrap();
    // The receiver refuses every batch: the sink retries from offset 0, 20 events behind,
    // and its STATUS says so (not the lag of a cursor write that never happened).
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(15);
    while !got
        .iter()
        .any(|m: &String| m.contains("sinks: script lag=20 age=") && m.contains("s retrying"))
    {
        assert!(
            Instant::now() < deadline,
            "no STATUS with the retrying sink's lag: {got:?}\n{}",
            s.log()
        );
        let n = sock.recv(&mut buf).expect("no notification within 10 s");
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let st = s.status(&s.config);
    assert_eq!(field(&st["script"], "lag_events"), "20");
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
}

#[test]
fn a_lagging_sink_holds_retention_and_a_removed_sink_is_forgotten_only_on_command() {
    let dir = tempfile::tempdir().unwrap();
    let retention = "[window]\nmax_entries = 2\n[retention]\neffects_max_entries = 5\n";
    let s = setup(
        dir.path(),
        "cat > /dev/null\necho 'COP import is down' >&2\nexit 3",
        "",
        retention,
    );
    // The sink starts with the log (a cursor made later starts at the oldest effect kept).
    s.ingest(0, 1);
    let mut relay = s.relay();
    // The cursor exists and the failure is recorded.
    wait_until("a delivery fails", &s, || {
        s.log().contains("delivery failed")
    });
    assert_eq!(stop(&mut relay), Some(0));
    s.ingest(1, 40);
    // Retention would keep 5; the sink at 0 holds all 40.
    assert_eq!(common::effects(&s.db).len(), 40);
    let st = s.status(&s.config);
    let script = &st["script"];
    assert_eq!(field(script, "state"), "retrying");
    assert_eq!(field(script, "configured"), "true");
    assert_eq!(field(script, "cursor"), "0");
    assert_eq!(field(script, "lag_events"), "40");
    assert_eq!(field(script, "parked"), "0");
    assert!(
        field(script, "last_error").contains("exited with exit status: 3: COP import is down"),
        "{}",
        field(script, "last_error")
    );
    let stats = stdout(&common::run(&[
        "stats",
        "--config",
        s.config.to_str().unwrap(),
    ]));
    assert!(
        stats.contains("sink script holds the effect log: 38 effects outside the window"),
        "{stats}"
    );
    // The sink is removed from the config: nothing is pruned for that alone.
    let removed = dir.path().join("removed.toml");
    std::fs::write(
        &removed,
        format!("[store]\npath = {:?}\n{retention}", s.db.to_str().unwrap()),
    )
    .unwrap();
    assert_eq!(field(&s.status(&removed)["script"], "state"), "removed");
    s.ingest(40, 45);
    assert_eq!(common::effects(&s.db).len(), 45);
    // Forgetting a configured sink is refused.
    let out = common::run(&[
        "relay",
        "forget",
        "--config",
        s.config.to_str().unwrap(),
        "--sink",
        "script",
        "--reason",
        "gone",
        "--operator",
        "ana",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("still in the config"));
    let line = stdout(&common::run(&[
        "relay",
        "forget",
        "--config",
        removed.to_str().unwrap(),
        "--sink",
        "script",
        "--reason",
        "COP import retired",
        "--operator",
        "ana",
    ]));
    assert!(
        line.contains(
            "sink script forgotten: its cursor was at offset 0 (0 parked events removed)"
        ),
        "{line}"
    );
    // Ingested with the config that no longer names it: nothing holds the log now. (With the
    // old config, the writer would make the sink's cursor again: a configured sink holds the
    // log from the moment a writer loads the config.)
    let feed = dir.path().join("last.jsonl");
    std::fs::write(&feed, common::msg("fire", "e0", 1, 45, "status") + "\n").unwrap();
    stdout(&common::run(&[
        "ingest",
        "--config",
        removed.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]));
    assert_eq!(common::effects(&s.db).len(), 5);
    let audit = stdout(&common::run(&[
        "dump-audit",
        "--db",
        s.db.to_str().unwrap(),
        "--outcome",
        "relay",
    ]));
    let entry = json::parse(audit.trim().as_bytes(), 64).unwrap();
    assert_eq!(field(&entry, "topic"), "script");
    assert!(field(&entry, "reason").ends_with("by ana: COP import retired"));
    stdout(&common::run(&[
        "verify",
        "--config",
        removed.to_str().unwrap(),
    ]));
}

#[test]
fn rewind_redelivers_with_the_same_ids_and_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", "");
    s.ingest(0, 30);
    let mut relay = s.relay();
    s.wait_received(30, Duration::from_secs(20));
    // The receiver has them before the relay commits its cursor past them: a rewind to 20
    // from a cursor still at 0 would be a forward move, refused.
    wait_until("the cursor passes the 30 events", &s, || {
        field(&s.status(&s.config)["script"], "cursor") == "30"
    });
    let first: Vec<String> = s.received().iter().map(|e| field(e, "id")).collect();
    let line = stdout(&common::run(&[
        "relay",
        "rewind",
        "--config",
        s.config.to_str().unwrap(),
        "--sink",
        "script",
        "--to",
        "20",
        "--reason",
        "COP database restored",
        "--operator",
        "ana",
    ]));
    assert!(
        line.contains("sink script: cursor moved from 30 to 20 (generation 1)"),
        "{line}"
    );
    wait_until("40 events arrive", &s, || s.received().len() >= 40);
    assert_eq!(stop(&mut relay), Some(0));
    let all: Vec<String> = s.received().iter().map(|e| field(e, "id")).collect();
    assert_eq!(all.len(), 40);
    assert_eq!(all[30..], first[20..], "the re-delivered events differ");
    let st = s.status(&s.config);
    assert_eq!(field(&st["script"], "generation"), "1");
    assert_eq!(field(&st["script"], "cursor"), "30");
    // Forward is not a rewind: refused, naming `relay skip`.
    let out = common::run(&[
        "relay",
        "rewind",
        "--config",
        s.config.to_str().unwrap(),
        "--sink",
        "script",
        "--to",
        "31",
        "--reason",
        "x",
        "--operator",
        "ana",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("offset 31 is above sink \"script\"'s cursor (30)")
            && err.contains("relay skip"),
        "{err}"
    );
    let audit = stdout(&common::run(&[
        "dump-audit",
        "--db",
        s.db.to_str().unwrap(),
        "--outcome",
        "relay",
    ]));
    assert!(audit.contains(
        "relay rewind of sink script from offset 30 to 20 by ana: COP database restored"
    ));
}

#[test]
fn parked_events_are_listed_field_by_field_and_retry_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", "");
    s.ingest(0, 5);
    // A parked event as a sink writes it (the http sink's 422 test drives this end to end).
    let parked_id = {
        let mut store = Store::open_operator(&s.db, StoreOptions::default()).unwrap();
        store
            .register_sink("script", "exec", StartAt::Beginning, 1_000)
            .unwrap();
        let (_, mut record) = replay_guard::testing::parked(&store.reader().unwrap(), 2, false);
        record.parked_at_ms = 1_764_547_200_000;
        record.reason = "HTTP 422 Unprocessable Entity".into();
        record.response = "HTTP/1.1 422 Unprocessable Entity\r\n\r\nbad unit".into();
        let id = record.id.clone();
        store
            .advance_sink("script", 0, 0, 3, &[(2, record)], 2_000)
            .unwrap();
        store.close().unwrap();
        id
    };
    let cfg = s.config.to_str().unwrap();
    let out = stdout(&common::run(&[
        "relay", "parked", "--config", cfg, "--sink", "script",
    ]));
    let p = json::parse(out.trim().as_bytes(), 64).unwrap();
    for (k, v) in [
        ("sink", "script"),
        ("offset", "2"),
        ("id", parked_id.as_str()),
        ("agency", "fire"),
        ("source_id", "e2"),
        ("parked_at", "2025-12-01T00:00:00.000Z"),
        ("reason", "HTTP 422 Unprocessable Entity"),
        (
            "response",
            "HTTP/1.1 422 Unprocessable Entity\r\n\r\nbad unit",
        ),
        ("attempts", "1"),
        ("blocking", "false"),
        ("retry_requested_at", "null"),
    ] {
        assert_eq!(field(&p, k), v, "{k}");
    }
    assert!(field(&p, "event").contains(&format!("\"id\":\"{parked_id}\"")));
    let table = stdout(&common::run(&[
        "relay", "parked", "--config", cfg, "--sink", "script", "--format", "table",
    ]));
    assert!(table.starts_with("OFFSET"), "{table}");
    assert_eq!(table.lines().count(), 2);
    let st = s.status(&s.config);
    assert_eq!(field(&st["script"], "parked"), "1");
    assert_eq!(field(&st["script"], "state"), "parked");
    // Unknown ids and sinks are usage errors.
    for args in [
        vec![
            "relay", "retry", "--config", cfg, "--sink", "script", "nope", "--reason", "x",
        ],
        vec![
            "relay", "retry", "--config", cfg, "--sink", "other", "--all", "--reason", "x",
        ],
        vec![
            "relay", "retry", "--config", cfg, "--sink", "script", "2", "--reason", " ",
        ],
    ] {
        assert_eq!(common::run(&args).status.code(), Some(1), "{args:?}");
    }
    let line = stdout(&common::run(&[
        "relay",
        "retry",
        "--config",
        cfg,
        "--sink",
        "script",
        &parked_id,
        "--reason",
        "unit list fixed",
        "--operator",
        "ana",
    ]));
    assert!(line.contains("1 parked event marked for retry"), "{line}");
    // The relay delivers it (the exec receiver accepts everything) and drops the record.
    let mut relay = s.relay();
    wait_until("the parked event arrives", &s, || {
        s.received().iter().any(|e| field(e, "id") == parked_id)
    });
    s.wait_received(3, Duration::from_secs(20));
    assert_eq!(stop(&mut relay), Some(0));
    let out = stdout(&common::run(&[
        "relay", "parked", "--config", cfg, "--sink", "script",
    ]));
    assert_eq!(out, "");
    let audit = stdout(&common::run(&[
        "dump-audit",
        "--config",
        cfg,
        "--outcome",
        "relay",
    ]));
    let e = json::parse(audit.trim().as_bytes(), 64).unwrap();
    assert_eq!(
        field(&e, "reason"),
        format!(
            "relay retry of event {parked_id} (offset 2) on sink script requested by ana: unit \
             list fixed"
        )
    );
    assert_eq!(field(&e, "effect_offset"), "2");
    assert_eq!(field(&e, "agency"), "fire");
}

#[test]
fn parked_reasons_responses_and_errors_are_printed_escaped_by_every_relay_listing() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", "");
    s.ingest(0, 5);
    let reason = "HTTP 422\nparked by root\u{1b}[2J";
    let response = "HTTP/1.1 422\r\n\r\n\u{202e}tinu dab\u{9b}31m";
    let error = "HTTP 500\n  last error at 2000-01-01: none\u{1b}[2J";
    {
        let mut store = Store::open_operator(&s.db, StoreOptions::default()).unwrap();
        store
            .register_sink("script", "exec", StartAt::Beginning, 1_000)
            .unwrap();
        let (_, mut record) = replay_guard::testing::parked(&store.reader().unwrap(), 2, false);
        record.parked_at_ms = 1_764_547_200_000;
        record.reason = reason.into();
        record.response = response.into();
        store
            .advance_sink("script", 0, 0, 3, &[(2, record)], 2_000)
            .unwrap();
        store.note_sink_error("script", error, 3_000).unwrap();
        store.close().unwrap();
    }
    let cfg = s.config.to_str().unwrap();
    let raw = common::terminal_control;
    let parked = |format: &str| {
        stdout(&common::run(&[
            "relay", "parked", "--config", cfg, "--sink", "script", "--format", format,
        ]))
    };
    // jsonl and JSON: the exact text, nothing raw for the terminal.
    let jsonl = parked("jsonl");
    assert_eq!(raw(&jsonl), None, "{jsonl:?}");
    assert_eq!(jsonl.lines().count(), 1);
    let p = json::parse(jsonl.trim().as_bytes(), 64).unwrap();
    assert_eq!(field(&p, "reason"), reason);
    assert_eq!(field(&p, "response"), response);
    assert_eq!(field(&s.status(&s.config)["script"], "last_error"), error);
    // table and CSV: one line per event, the reason escaped.
    let shown = "HTTP 422\\nparked by root\\u001b[2J";
    let table = parked("table");
    assert_eq!(raw(&table), None, "{table:?}");
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(table.lines().last().unwrap().ends_with(shown), "{table}");
    let csv = parked("csv");
    assert_eq!(raw(&csv), None, "{csv:?}");
    assert_eq!(csv.lines().count(), 2, "{csv}");
    // RFC 4180 with every jsonl field (header unquoted, a field quoted only when it must be).
    assert!(
        csv.starts_with("sink,offset,id,agency,source_id,parked_at,reason,"),
        "{csv}"
    );
    assert!(csv.contains(&format!(",{shown},")), "{csv}");
    // status text: the sink's line, its accounting and one line for its last error.
    let status = stdout(&common::run(&["relay", "status", "--config", cfg]));
    assert_eq!(raw(&status), None, "{status:?}");
    assert_eq!(status.lines().count(), 3, "{status}");
    assert!(
        status.ends_with(": HTTP 500\\n  last error at 2000-01-01: none\\u001b[2J\n"),
        "{status}"
    );
}

#[test]
fn dump_effects_after_starts_past_the_offset() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", "");
    s.ingest(0, 10);
    let out = stdout(&common::run(&[
        "dump-effects",
        "--db",
        s.db.to_str().unwrap(),
        "--after",
        "6",
    ]));
    let offsets: Vec<String> = out
        .lines()
        .map(|l| field(&json::parse(l.as_bytes(), 64).unwrap(), "offset"))
        .collect();
    assert_eq!(offsets, ["7", "8", "9"]);
}

/// A receiver that refuses the event of sequence 13 (exit 65) until `count.fixed` exists.
pub(super) const REFUSES_13: &str = "input=$(cat)\n\
    if [ ! -e \"$STATE.fixed\" ] && printf '%s\\n' \"$input\" | grep -q '\"rgsequence\":\"13\"'; then\n\
    echo 'unit E13 unknown to CAD' >&2; exit 65; fi\n\
    printf '%s\\n' \"$input\" >> \"$OUT\"";

pub(super) fn wait_until(what: &str, s: &Setup, cond: impl FnMut() -> bool) {
    common::wait_until(
        common::lazy(|| format!("{what}; relay log:\n{}", s.log())),
        Duration::from_secs(20),
        cond,
    );
}

/// The sink's parked events (none before the relay made its cursor).
pub(super) fn parked_list(s: &Setup) -> Vec<Json> {
    let out = common::run(&[
        "relay",
        "parked",
        "--config",
        s.config.to_str().unwrap(),
        "--sink",
        "script",
    ]);
    if String::from_utf8_lossy(&out.stderr).contains("has a cursor") {
        return Vec::new();
    }
    stdout(&out)
        .lines()
        .map(|l| json::parse(l.as_bytes(), 64).unwrap())
        .collect()
}

#[test]
fn a_refused_event_is_parked_the_rest_flows_and_retry_delivers_it_once_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), REFUSES_13, "batch_max = 8", "");
    s.ingest(0, 30);
    let mut relay = s.relay();
    s.wait_received(29, Duration::from_secs(20));
    wait_until("the refused event is parked", &s, || {
        parked_list(&s).len() == 1
    });
    let p = &parked_list(&s)[0];
    assert_eq!(field(p, "offset"), "13");
    assert_eq!(field(p, "blocking"), "false");
    assert!(field(p, "reason").contains("refused the event (exit status 65, EX_DATAERR)"));
    assert!(
        field(p, "response").contains("unit E13 unknown to CAD"),
        "{}",
        field(p, "response")
    );
    let ids: Vec<String> = s.received().iter().map(|e| field(e, "id")).collect();
    assert!(!ids.contains(&field(p, "id")));
    let st = s.status(&s.config);
    assert_eq!(field(&st["script"], "state"), "parked", "never caught_up");
    assert_eq!(field(&st["script"], "parked"), "1");
    // The receiver is fixed; the operator asks for the retry.
    std::fs::write(dir.path().join("count.fixed"), "").unwrap();
    stdout(&common::run(&[
        "relay",
        "retry",
        "--config",
        s.config.to_str().unwrap(),
        "--sink",
        "script",
        "--all",
        "--reason",
        "unit E13 added to CAD",
        "--operator",
        "ana",
    ]));
    s.wait_received(30, Duration::from_secs(20));
    wait_until("the parked record goes", &s, || parked_list(&s).is_empty());
    assert_eq!(stop(&mut relay), Some(0));
    // Each effect exactly once; 13 arrived last.
    let got: Vec<String> = s
        .received()
        .iter()
        .map(|e| field(e, "rgsequence"))
        .collect();
    assert_eq!(got.len(), 30);
    assert_eq!(got.last().map(String::as_str), Some("13"));
    assert_all_delivered(&s, false);
}

#[test]
fn on_poison_block_stops_the_sink_at_the_event_until_an_operator_acts() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(
        dir.path(),
        REFUSES_13,
        "batch_max = 8\non_poison = \"block\"",
        "",
    );
    s.ingest(0, 30);
    let mut relay = s.relay();
    wait_until("the refused event blocks the sink", &s, || {
        parked_list(&s)
            .first()
            .is_some_and(|p| field(p, "blocking") == "true")
    });
    // Nothing after it goes out while it blocks.
    assert_eq!(s.received().len(), 13);
    let st = s.status(&s.config);
    assert_eq!(field(&st["script"], "state"), "blocked");
    assert_eq!(field(&st["script"], "cursor"), "13");
    assert_eq!(field(&st["script"], "lag_events"), "17");
    std::fs::write(dir.path().join("count.fixed"), "").unwrap();
    stdout(&common::run(&[
        "relay",
        "retry",
        "--config",
        s.config.to_str().unwrap(),
        "--sink",
        "script",
        "13",
        "--reason",
        "unit E13 added",
        "--operator",
        "ana",
    ]));
    s.wait_received(30, Duration::from_secs(20));
    assert_eq!(stop(&mut relay), Some(0));
    // In order, each once: the block kept the log order.
    assert_all_delivered(&s, true);
    assert_eq!(field(&s.status(&s.config)["script"], "state"), "caught_up");
}

/// A config with sink "script" (accepts everything) and sink "hung", whose program records
/// its pid in `pidfile` and sleeps far past the shutdown timeout, fed by `broker`.
fn hung_setup(dir: &Path, broker: &Broker, client_id: &str, pidfile: &Path) -> Setup {
    setup(
        dir,
        "cat >> \"$OUT\"",
        &format!(
            "[[sink]]\nname = \"hung\"\nkind = \"exec\"\ncommand = [\"/bin/sh\", \"-c\", \"echo $$ > {}; exec sleep 300\"]\n\
             timeout_ms = 600000\n",
            pidfile.to_str().unwrap()
        ),
        &mqtt_section(broker, client_id),
    )
}

/// Whether process `pid` has ended (or is a zombie its parent has yet to reap).
fn gone(pid: i32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| st.contains(") Z "))
}

#[test]
fn a_hung_sink_holds_up_neither_the_feed_nor_another_sink_nor_the_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let pidfile = dir.path().join("hung.pid");
    // "hung" never finishes a batch (its program sleeps far past the shutdown timeout and
    // records its pid); "script" accepts everything.
    let s = hung_setup(dir.path(), &broker, "rg-relay-hung", &pidfile);
    let mut run = s.run();
    s.wait_subscribed();
    let lines: Vec<String> = (0..300)
        .map(|i| common::msg("ems", &format!("m{}", i % 3), 1, i, "x"))
        .collect();
    broker.publish_lines("incidents/ems", &lines, "pub-relay-hung");
    s.wait_received(300, Duration::from_secs(30));
    assert_eq!(common::effects(&s.db).len(), 300);
    wait_until("the hung sink's program runs", &s, || pidfile.exists());
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // shutdown_timeout_seconds = 5: the drain gives up on the hung attempt, kills its
    // program and exits 0.
    let started = Instant::now();
    assert_eq!(stop(&mut run), Some(0), "{}", s.log());
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(gone(pid), "the hung sink's program outlived the service");
    let st = s.status(&s.config);
    assert_eq!(field(&st["hung"], "cursor"), "0");
    assert_eq!(field(&st["script"], "cursor"), "300");
}

/// The refusal of sink "script" delivered elsewhere: who has it, the fix, all said once.
fn assert_sink_conflict(text: &str, by: &str) {
    assert!(
        text.contains("sink \"script\" of")
            && text.contains(&format!("is already delivered by {by}"))
            && text.contains("remove this [[sink]] from one of the two configs"),
        "{text}"
    );
    assert_eq!(
        text.matches("each sink runs in one place").count(),
        1,
        "{text}"
    );
}

#[test]
fn a_sink_is_delivered_by_one_process_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", "");
    s.ingest(0, 5);
    let mut first = s.relay();
    s.wait_received(5, Duration::from_secs(20));
    let out = common::run(&["relay", "--config", s.config.to_str().unwrap()]);
    // A sink named in two configs is a configuration conflict: exit 1 (systemd does not
    // restart the unit in a loop on it), with the fix said once.
    assert_eq!(out.status.code(), Some(1));
    assert_sink_conflict(&String::from_utf8_lossy(&out.stderr), "another process");
    // Nor may a running sink be forgotten (it would make its cursor again at once).
    let removed = dir.path().join("removed.toml");
    std::fs::write(
        &removed,
        format!("[store]\npath = {:?}\n", s.db.to_str().unwrap()),
    )
    .unwrap();
    let out = common::run(&[
        "relay",
        "forget",
        "--config",
        removed.to_str().unwrap(),
        "--sink",
        "script",
        "--reason",
        "x",
        "--operator",
        "ana",
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stop(&mut first), Some(0));
    // Once the first is gone (also after kill -9: the kernel drops the lock), another may.
    let mut second = s.relay();
    s.ingest(5, 8);
    s.wait_received(8, Duration::from_secs(20));
    second.kill().unwrap();
    second.wait().unwrap();
    let mut third = s.relay();
    s.ingest(8, 9);
    s.wait_received(9, Duration::from_secs(20));
    assert_eq!(stop(&mut third), Some(0));
}

/// The sink's cursor, once it has one.
fn cursor(s: &Setup) -> Option<u64> {
    let st = s.status(&s.config);
    let script = st.get("script")?;
    field(script, "cursor").parse().ok()
}

/// Times the receiver ran (the script counts its runs in `$STATE`).
fn runs(s: &Setup) -> u64 {
    std::fs::read_to_string(s.dir.join("count")).map_or(0, |n| n.trim().parse().unwrap())
}

/// Counts the run, as the first thing the receiver does.
const COUNT_RUN: &str = "n=$(cat \"$STATE\" 2>/dev/null || echo 0); echo $((n+1)) > \"$STATE\"";

#[test]
fn an_exec_program_writing_300_kb_to_stderr_is_delivered_once_and_not_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    // More than a pipe holds (64 KiB) and more than any prefix the sink keeps: a sink that
    // stops reading stderr leaves the program blocked until the timeout kills it.
    let s = setup(
        dir.path(),
        &format!("{COUNT_RUN}\ncat >> \"$OUT\"\nhead -c 300000 /dev/zero | tr '\\0' e >&2\nexit 0"),
        "batch_max = 100\ntimeout_ms = 3000",
        "",
    );
    s.ingest(0, 10);
    let mut relay = s.relay();
    wait_until("the batch delivered", &s, || cursor(&s) == Some(10));
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
    assert_eq!(runs(&s), 1, "the batch was retried; log:\n{}", s.log());
    assert_all_delivered(&s, true);
    assert!(!s.log().contains("did not finish"), "{}", s.log());
}

#[test]
fn an_exec_program_whose_background_child_keeps_stderr_open_is_decided_by_its_exit() {
    let dir = tempfile::tempdir().unwrap();
    let children = dir.path().join("children");
    // The program exits 0 at once; the child it leaves behind holds the stderr pipe for 30 s,
    // three times the attempt's timeout.
    let s = setup(
        dir.path(),
        &format!(
            "{COUNT_RUN}\ncat >> \"$OUT\"\nsleep 30 >&2 &\necho $! >> {:?}\nexit 0",
            children.to_str().unwrap()
        ),
        "batch_max = 100\ntimeout_ms = 10000",
        "",
    );
    /// Kills the children left behind, however the test ends.
    struct Reap(PathBuf);
    impl Drop for Reap {
        fn drop(&mut self) {
            for pid in std::fs::read_to_string(&self.0).unwrap_or_default().lines() {
                let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
            }
        }
    }
    let _reap = Reap(children);
    s.ingest(0, 10);
    let started = Instant::now();
    let mut relay = s.relay();
    wait_until("the batch delivered", &s, || cursor(&s) == Some(10));
    let took = started.elapsed();
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
    assert!(
        took < Duration::from_secs(8),
        "delivered after {took:?}, near the 10 s timeout; log:\n{}",
        s.log()
    );
    assert_eq!(runs(&s), 1, "the batch was retried; log:\n{}", s.log());
    assert_all_delivered(&s, true);
}

/// `(shown, dropped)` from "(stderr: first SHOWN bytes shown, DROPPED more dropped)".
fn stderr_counts(text: &str) -> (usize, usize) {
    let rest = text
        .split_once("(stderr: first ")
        .unwrap_or_else(|| panic!("no stderr counts in {text:?}"))
        .1;
    let (shown, rest) = rest.split_once(" bytes shown, ").unwrap();
    let dropped = rest.split_once(" more dropped)").unwrap().0;
    (shown.parse().unwrap(), dropped.parse().unwrap())
}

/// A failure's kept stderr: one line, controls escaped, short, and every byte counted.
fn assert_kept_stderr(text: &str, head: &str, stderr_len: usize) {
    assert!(
        !text.contains(['\u{1b}', '\r', '\n', '\u{7}']),
        "a raw control character is kept: {text:?}"
    );
    assert!(
        text.chars().count() < 1024,
        "{} characters kept",
        text.len()
    );
    let (shown, dropped) = stderr_counts(text);
    assert_eq!(shown + dropped, stderr_len, "{text:?}");
    let body = text.split_once(" more dropped): ").unwrap().1;
    assert!(body.starts_with(head), "{body:?}");
    // What follows the escaped head is the 'e's, as many as the shown bytes say.
    let es = &body[head.len()..];
    assert!(es.bytes().all(|b| b == b'e'), "{es:?}");
    assert_eq!(es.len(), shown - 21, "{text:?}");
}

#[test]
fn a_failing_exec_programs_huge_stderr_is_kept_short_escaped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    // 21 bytes with terminal controls, then 300,000 bytes: exit 3 (retry) until the test
    // asks for 65 (refused: parked with the text as its response).
    let s = setup(
        dir.path(),
        "cat > /dev/null\n\
         printf 'first line\\n\\033[31mred\\r\\a' >&2\n\
         head -c 300000 /dev/zero | tr '\\0' e >&2\n\
         if [ -e \"$STATE.refuse\" ]; then exit 65; fi\nexit 3",
        "timeout_ms = 3000",
        "",
    );
    let head = "first line\\n\\u001b[31mred\\r\\u0007";
    s.ingest(0, 1);
    let mut relay = s.relay();
    let error = || {
        s.status(&s.config)
            .get("script")
            .map(|v| field(v, "last_error"))
            .unwrap_or_default()
    };
    wait_until("the failure on record", &s, || {
        error().contains("exited with exit status: 3")
    });
    let last_error = error();
    assert!(
        last_error.starts_with("/bin/sh exited with exit status: 3 (stderr: first "),
        "{last_error:?}"
    );
    assert_kept_stderr(&last_error, head, 300_021);
    std::fs::write(dir.path().join("count.refuse"), "").unwrap();
    wait_until("the event parked", &s, || parked_list(&s).len() == 1);
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
    let response = field(&parked_list(&s)[0], "response");
    assert!(
        response.starts_with("exit status: 65 (stderr: first "),
        "{response:?}"
    );
    assert_kept_stderr(&response, head, 300_021);
    // The log lines carry the same escaped text.
    let log = s.log();
    assert!(
        log.contains("more dropped): first line\\n\\u001b[31mred"),
        "{log}"
    );
    assert!(!log.contains('\u{1b}'), "{log}");
}

#[test]
fn run_refuses_a_sink_a_standalone_relay_delivers_naming_it_and_the_fix_once() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let s = setup(
        dir.path(),
        "cat >> \"$OUT\"",
        "",
        &mqtt_section(&broker, "rg-relay-twice"),
    );
    s.ingest(0, 3);
    let mut relay = s.relay();
    s.wait_received(3, Duration::from_secs(20));
    let mut run = s.run();
    let status = run.wait().unwrap();
    let log = s.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert_sink_conflict(&log, "a standalone `relay`");
    // And the relay, started second beside a `run` that has the sink, names that `run`.
    assert_eq!(stop(&mut relay), Some(0));
    let mut run = s.run();
    s.wait_subscribed();
    let out = common::run(&["relay", "--config", s.config.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("the `run` on this database (PID {}", run.id())),
        "{err}"
    );
    assert_eq!(stop(&mut run), Some(0));
}

/// A second SIGTERM goes through the same shutdown channel as the first: the wait for a hung
/// sink is cut short, its program killed, its cursor left where it was, and the process exits
/// 3 (not 0 after the shutdown timeout); for `run` and the standalone `relay` alike.
#[test]
fn a_second_sigterm_abandons_a_hung_sink_at_once_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let pidfile = dir.path().join("hung.pid");
    let s = hung_setup(dir.path(), &broker, "rg-relay-twice-term", &pidfile);
    let hung_program = || -> i32 {
        wait_until("the hung sink's program runs", &s, || {
            std::fs::read_to_string(&pidfile).is_ok_and(|p| p.ends_with('\n'))
        });
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        std::fs::remove_file(&pidfile).unwrap();
        pid.trim().parse().unwrap()
    };
    // The second signal is sent once the first was handled (two pending ones would merge).
    let twice = |child: &mut Child| {
        let before = s.log().matches("shutdown requested").count();
        signal(child.id() as i32, "TERM");
        wait_until("the first signal is logged", &s, || {
            s.log().matches("shutdown requested").count() > before
        });
        signal(child.id() as i32, "TERM");
        child.wait().unwrap().code()
    };
    let mut run = s.run();
    s.wait_subscribed();
    let lines: Vec<String> = (0..30)
        .map(|i| common::msg("ems", &format!("m{}", i % 3), 1, i, "x"))
        .collect();
    broker.publish_lines("incidents/ems", &lines, "pub-relay-twice-term");
    s.wait_received(30, Duration::from_secs(30));
    let pid = hung_program();
    assert_eq!(twice(&mut run), Some(3), "{}", s.log());
    assert!(
        s.log().contains("second signal: stopping at once"),
        "{}",
        s.log()
    );
    assert!(
        s.log().contains("stopped at once by a second signal"),
        "{}",
        s.log()
    );
    common::wait_until("the hung program is killed", Duration::from_secs(5), || {
        gone(pid)
    });
    // The standalone relay: the same.
    let mut relay = s.relay();
    let pid = hung_program();
    assert_eq!(twice(&mut relay), Some(3), "{}", s.log());
    common::wait_until("the hung program is killed", Duration::from_secs(5), || {
        gone(pid)
    });
    let st = s.status(&s.config);
    assert_eq!(field(&st["hung"], "cursor"), "0");
    assert_eq!(field(&st["script"], "cursor"), "30");
}
