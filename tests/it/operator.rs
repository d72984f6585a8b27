//! Operator writes and upkeep against real processes: `quarantine release|discard` while `run`
//! consumes from a real Mosquitto, retention pruning during `ingest` with `verify` still
//! proving the rest (and still catching tampering), `stats` field by field, and `compact`
//! refusing while another process has the database.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use replay_guard::json::{self, Json, Pointer};
use replay_guard::store::tables::{AUDIT, EFFECTS, META_TABLE, QUARANTINE, RETENTION};

use super::broker::Broker;
use super::common;
use super::service::{Consumer, events};

fn get(v: &Json, pointer: &str) -> Json {
    v.pointer(&Pointer::parse(pointer).unwrap())
        .cloned()
        .unwrap_or_else(|| panic!("no {pointer} in {}", v.to_compact()))
}
fn num(v: &Json, pointer: &str) -> u64 {
    match get(v, pointer) {
        Json::Number(n) => n.parse().unwrap(),
        other => panic!("{pointer} is not a number: {other:?}"),
    }
}
fn text(v: &Json, pointer: &str) -> String {
    match get(v, pointer) {
        Json::String(s) => s,
        other => panic!("{pointer} is not a string: {other:?}"),
    }
}

/// `dump-*` output as JSON values, one per line.
fn rows(command: &str, db: &Path) -> Vec<Json> {
    let out = common::run(&[command, "--db", db.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{command}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| json::parse(l.as_bytes(), 64).unwrap())
        .collect()
}

fn stats(db: &Path) -> Json {
    let out = common::run(&["stats", "--format", "json", "--db", db.to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json::parse(&out.stdout, 16).unwrap()
}

fn verify(db: &Path) -> (Option<i32>, String) {
    let out = common::run(&["verify", "--db", db.to_str().unwrap()]);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn release_and_discard_while_run_consumes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let mut c = Consumer::new(dir.path(), &[broker.url()], "v5", "rg-operator");
    c.start();
    c.wait_subscribed();
    let mut first = events(0, 500);
    first.push(common::msg("CALFIRE", "E5", 1, 5, "corrected"));
    first.push("not json".into());
    broker.publish_lines("incidents/ca", &first, "pub-op");
    c.wait_decided(502, Duration::from_secs(30));
    let quarantined = rows("dump-quarantine", &c.db);
    let id_of = |outcome: &str| {
        quarantined
            .iter()
            .find(|q| text(q, "/outcome") == outcome)
            .map(|q| num(q, "/id").to_string())
            .unwrap()
    };
    let (conflict, malformed) = (id_of("conflict"), id_of("malformed"));

    // A surge keeps `run` committing while the operator writes.
    const SURGE: u64 = 6_000;
    let publisher = {
        let port = broker.port;
        std::thread::spawn(move || {
            let b = Broker::attach(port);
            for chunk in events(500, 500 + SURGE).chunks(500) {
                b.publish_lines("incidents/ca", chunk, "pub-op-surge");
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    c.wait_decided(1_000, Duration::from_secs(30));
    let config = c.config.to_str().unwrap();
    let release = common::run(&[
        "quarantine",
        "release",
        &conflict,
        "--config",
        config,
        "--reason",
        "IC confirmed the corrected report by radio",
        "--operator",
        "alice",
    ]);
    let during = c.decided().unwrap();
    assert_eq!(
        release.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&release.stderr)
    );
    let discard = common::run(&[
        "quarantine",
        "discard",
        &malformed,
        "--config",
        config,
        "--reason",
        "test rig noise",
        "--operator",
        "bob",
    ]);
    assert_eq!(
        discard.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&discard.stderr)
    );
    assert!(
        !publisher.is_finished() && during < 502 + SURGE,
        "the release did not land mid-surge ({during} decided)"
    );
    publisher.join().unwrap();
    c.wait_decided(502 + SURGE + 2, Duration::from_secs(60));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());

    // Released: a second effect for (E5, 5), marked, with the corrected content.
    let effects = rows("dump-effects", &c.db);
    assert_eq!(effects.len() as u64, 500 + SURGE + 1);
    let released: Vec<&Json> = effects
        .iter()
        .filter(|e| get(e, "/released") == Json::Bool(true))
        .collect();
    assert_eq!(released.len(), 1);
    assert_eq!(text(released[0], "/source_id"), "E5");
    assert_eq!(num(released[0], "/sequence"), 5);
    assert_eq!(text(released[0], "/message/body"), "corrected");
    let audit = rows("dump-audit", &c.db);
    let by_outcome =
        |o: &str| -> Vec<&Json> { audit.iter().filter(|a| text(a, "/outcome") == o).collect() };
    let rel = by_outcome("released");
    assert_eq!(rel.len(), 1);
    assert_eq!(
        text(rel[0], "/reason"),
        format!(
            "quarantine #{conflict} released by alice: IC confirmed the corrected report by radio"
        )
    );
    assert_eq!(num(rel[0], "/effect_offset"), num(released[0], "/offset"));
    let dis = by_outcome("discarded");
    assert_eq!(dis.len(), 1);
    assert_eq!(
        text(dis[0], "/reason"),
        format!("quarantine #{malformed} discarded by bob: test rig noise")
    );
    assert!(rows("dump-quarantine", &c.db).is_empty());
    let (code, out) = verify(&c.db);
    assert_eq!(code, Some(0), "{out}");
    // A second release of the same id is refused, naming why, and writes nothing.
    let again = common::run(&[
        "quarantine",
        "release",
        &conflict,
        "--db",
        c.db.to_str().unwrap(),
        "--reason",
        "again",
    ]);
    assert_eq!(again.status.code(), Some(1));
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(err.contains("does not exist"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(rows("dump-audit", &c.db).len(), audit.len());
}

/// A config for `ingest` with the given `[window]`/`[retention]` body.
fn config(dir: &Path, body: &str) -> String {
    let path = dir.join("rg.toml");
    std::fs::write(&path, body).unwrap();
    path.to_str().unwrap().to_string()
}

fn ingest(cfg: &str, db: &Path, feed: &[u8]) {
    let out = common::run_with_stdin(
        &["ingest", "--config", cfg, "--db", db.to_str().unwrap(), "-"],
        feed,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn retention_prunes_during_ingest_and_verify_still_proves_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("pruned.redb");
    let cfg = config(
        dir.path(),
        "[window]\nmax_entries = 200\n[commit]\nmax_batch = 100\n\
         [retention]\naudit_max_entries = 1000\neffects_max_entries = 300\nquarantine_max_entries = 5\n",
    );
    let feed = common::generate_feed(11, 5_000);
    ingest(&cfg, &db, &feed.bytes);

    let s = stats(&db);
    assert_eq!(
        num(&s, "/decisions_total/total"),
        5_000,
        "counters survive pruning"
    );
    let first = num(&s, "/audit/first_index");
    assert_eq!(num(&s, "/audit/next_index"), 5_000);
    assert_eq!(5_000 - first, 1_000, "the audit log keeps 1000 entries");
    assert_eq!(num(&s, "/audit/anchor/index"), first - 1);
    assert_eq!(num(&s, "/retention/audit_pruned"), first);
    assert!(num(&s, "/retention/effects_pruned") > 0);
    assert!(num(&s, "/quarantined") <= 5);

    let audit = rows("dump-audit", &db);
    assert_eq!(audit.len(), 1_000);
    assert_eq!(num(&audit[0], "/index"), first);
    assert_eq!(
        text(&audit[0], "/prev_hash"),
        text(&s, "/audit/anchor/hash")
    );
    let effects = rows("dump-effects", &db);
    assert_eq!(effects.len(), 300);
    assert_eq!(
        num(&effects[0], "/offset"),
        num(&s, "/retention/effects_floor")
    );

    let (code, out) = verify(&db);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("retention anchor"), "{out}");

    // Tampering after the anchor is still caught.
    let edited = dir.path().join("edited.redb");
    std::fs::copy(&db, &edited).unwrap();
    {
        let rdb = redb::Database::create(&edited).unwrap();
        let txn = rdb.begin_write().unwrap();
        {
            let mut t = AUDIT.open_mut(&txn).unwrap();
            let index = first + 10;
            let mut rec = t.get(index).unwrap().unwrap();
            rec.reason.push_str(" (edited)");
            t.put(index, &rec, &mut Vec::new()).unwrap();
        }
        txn.commit().unwrap();
    }
    let (code, out) = verify(&edited);
    assert_eq!(code, Some(4), "{out}");
    assert!(
        out.contains(&format!("audit entry {}", first + 10)),
        "{out}"
    );

    // A quarantine record deleted above the retention floor is caught too.
    let floor = num(&s, "/retention/quarantine_floor");
    let kept: Vec<u64> = rows("dump-quarantine", &db)
        .iter()
        .map(|q| num(q, "/id"))
        .collect();
    let victim = *kept.iter().find(|id| **id >= floor).expect("a kept record");
    let deleted = dir.path().join("deleted.redb");
    std::fs::copy(&db, &deleted).unwrap();
    {
        let rdb = redb::Database::create(&deleted).unwrap();
        let txn = rdb.begin_write().unwrap();
        txn.open_table(QUARANTINE.raw())
            .unwrap()
            .remove(victim)
            .unwrap();
        txn.commit().unwrap();
    }
    let (code, out) = verify(&deleted);
    assert_eq!(code, Some(4), "{out}");
    assert!(
        out.contains(&format!("quarantine record #{victim}")),
        "{out}"
    );

    // An effect whose audit entry was pruned, deleted: the offsets no longer run unbroken.
    let short = tempfile::tempdir().unwrap();
    let gap = short.path().join("gap.redb");
    let short_cfg = config(
        short.path(),
        "[window]\nmax_entries = 100\n[commit]\nmax_batch = 100\n\
         [retention]\naudit_max_entries = 50\neffects_max_entries = 300\n",
    );
    ingest(&short_cfg, &gap, &common::generate_feed(12, 2_000).bytes);
    let effects_floor = num(&stats(&gap), "/retention/effects_floor");
    let (code, out) = verify(&gap);
    assert_eq!(code, Some(0), "{out}");
    {
        let rdb = redb::Database::create(&gap).unwrap();
        let txn = rdb.begin_write().unwrap();
        txn.open_table(EFFECTS.raw())
            .unwrap()
            .remove(effects_floor + 1)
            .unwrap();
        txn.commit().unwrap();
    }
    let (code, out) = verify(&gap);
    assert_eq!(code, Some(4), "{out}");
    assert!(
        out.contains(&format!("effect {} is missing", effects_floor + 1)),
        "{out}"
    );

    // Hiding a deletion by raising the retention floor into the window is caught too.
    let floor = dir.path().join("floor.redb");
    std::fs::copy(&db, &floor).unwrap();
    {
        let rdb = redb::Database::create(&floor).unwrap();
        let txn = rdb.begin_write().unwrap();
        {
            let mut t = txn.open_table(META_TABLE).unwrap();
            let mut marks = RETENTION.get(&t).unwrap().unwrap();
            marks.effects_floor = 4_999;
            RETENTION.put(&mut t, &marks, &mut Vec::new()).unwrap();
        }
        txn.commit().unwrap();
    }
    let (code, out) = verify(&floor);
    assert_eq!(code, Some(4), "{out}");
    assert!(out.contains("lies inside the dedup window"), "{out}");
}

#[test]
fn stats_reports_the_record_field_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.redb");
    let cfg = config(dir.path(), "[window]\nmax_entries = 3\n");
    let lines = [
        common::msg("A", "S1", 0, 1, "x"),
        common::msg("A", "S1", 0, 2, "x"),
        common::msg("A", "S1", 0, 2, "x"),
        common::msg("A", "S1", 0, 2, "changed"),
        common::msg("B", "S2", 3, 7, "x"),
        common::msg("B", "S2", 3, 8, "x"),
        "garbage".to_string(),
    ];
    ingest(&cfg, &db, (lines.join("\n") + "\n").as_bytes());
    let s = stats(&db);
    assert_eq!(text(&s, "/database"), db.to_str().unwrap());
    assert_eq!(
        num(&s, "/file_bytes"),
        std::fs::metadata(&db).unwrap().len()
    );
    for (pointer, want) in [
        ("/decisions_total/total", 7),
        ("/decisions_total/applied", 4),
        ("/decisions_total/duplicate", 1),
        ("/decisions_total/conflict", 1),
        ("/decisions_total/malformed", 1),
        ("/decisions_total/released", 0),
        ("/decisions_last_hour/total", 7),
        ("/decisions_last_hour/applied", 4),
        ("/window/entries", 3),
        ("/quarantined", 2),
        ("/audit/first_index", 0),
        ("/audit/next_index", 7),
        ("/retention/audit_pruned", 0),
    ] {
        assert_eq!(num(&s, pointer), want, "{pointer}");
    }
    assert_eq!(get(&s, "/audit/anchor"), Json::Null);
    let sources = match get(&s, "/sources") {
        Json::Array(a) => a,
        other => panic!("{other:?}"),
    };
    assert_eq!(sources.len(), 2);
    assert_eq!(text(&sources[0], "/agency"), "A");
    assert_eq!(num(&sources[0], "/high_water_sequence"), 2);
    // Four applied into a window of three: S1's first entry was evicted.
    assert_eq!(num(&sources[0], "/evicted_floor/sequence"), 1);
    assert_eq!(text(&sources[1], "/source_id"), "S2");
    assert_eq!(
        (
            num(&sources[1], "/high_water_epoch"),
            num(&sources[1], "/high_water_sequence")
        ),
        (3, 8)
    );
    assert_eq!(get(&sources[1], "/evicted_floor"), Json::Null);
    assert_eq!(get(&s, "/replay_bursts"), Json::Array(vec![]));
    assert!(num(&s, "/window/oldest_age_seconds") < 3_600);
    // The text form says the same for people.
    let out = common::run(&["stats", "--db", db.to_str().unwrap()]);
    let t = String::from_utf8(out.stdout).unwrap();
    assert!(
        t.contains("decisions      7 (applied 4, duplicate 1, conflict 1, malformed 1)"),
        "{t}"
    );
    assert!(t.contains("A/S1  high-water 0/2  evicted floor 0/1"), "{t}");
}

#[test]
fn compact_needs_the_database_to_itself_and_gives_space_back() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("c.redb");
    let dbs = db.to_str().unwrap().to_string();
    let cfg = config(
        dir.path(),
        "[window]\nmax_entries = 100\n[commit]\nmax_batch = 500\n\
         [retention]\naudit_max_entries = 100\neffects_max_entries = 100\n",
    );
    ingest(&cfg, &db, &common::generate_feed(5, 30_000).bytes);
    let before = rows("dump-effects", &db);

    // A feed writer holds it: refused, and it says what to do.
    let mut writer = Command::new(common::bin())
        .args(["ingest", "--db", &dbs, "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = writer.stdin.take().unwrap();
    stdin
        .write_all((common::msg("Z", "Z", 0, 1, "x") + "\n").as_bytes())
        .unwrap();
    let mut waited = 0;
    while rows("dump-audit", &db).len() < 101 {
        std::thread::sleep(Duration::from_millis(50));
        waited += 1;
        assert!(waited < 400, "the writer never committed");
    }
    let busy = common::run(&["compact", "--db", &dbs]);
    assert_eq!(busy.status.code(), Some(2));
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(err.contains("stop the service first"), "{err}");
    drop(stdin);
    assert!(writer.wait().unwrap().success());

    // A reader (another process's inspector) holds it: refused too.
    let reader = replay_guard::store::Reader::open(&db).unwrap();
    let busy = common::run(&["compact", "--db", &dbs]);
    assert_eq!(busy.status.code(), Some(2));
    let err = String::from_utf8_lossy(&busy.stderr);
    assert!(err.contains("is open in another process"), "{err}");
    drop(reader);

    let size = std::fs::metadata(&db).unwrap().len();
    let out = common::run(&["compact", "--db", &dbs]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = std::fs::metadata(&db).unwrap().len();
    assert!(after < size * 3 / 4, "compact left {after} of {size} bytes");
    let mut kept = rows("dump-effects", &db);
    kept.pop(); // the writer's one message
    assert_eq!(kept, before[before.len() - kept.len()..].to_vec());
    let (code, out) = verify(&db);
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn malformed_operator_arguments_are_one_line_errors_exiting_1() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.redb");
    ingest(
        &config(dir.path(), ""),
        &db,
        (common::msg("A", "S", 0, 1, "x") + "\n").as_bytes(),
    );
    let dbs = db.to_str().unwrap();
    for args in [
        vec!["quarantine", "release", "0", "--db", dbs],
        vec![
            "quarantine",
            "release",
            "zero",
            "--db",
            dbs,
            "--reason",
            "r",
        ],
        vec!["quarantine", "discard", "0", "--db", dbs, "--reason", "  "],
        vec!["quarantine", "frobnicate", "0"],
        vec!["quarantine", "release", "7", "--db", dbs, "--reason", "r"],
        vec!["stats", "--db", dbs, "--format", "xml"],
        vec!["stats", "--db", "/nonexistent/x.redb"],
        vec!["compact", "--db", "/nonexistent/x.redb"],
        vec!["compact"],
    ] {
        let out = common::run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("replay-guard: "), "{args:?}: {err}");
    }
    for sub in [
        &["quarantine", "release", "--help"][..],
        &["quarantine", "discard", "--help"],
        &["stats", "--help"],
        &["compact", "--help"],
    ] {
        let out = common::run(sub);
        assert_eq!(out.status.code(), Some(0), "{sub:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("--db"),
            "{sub:?}"
        );
    }
}

/// A database holding one conflict in quarantine (id 0), and its audit log as `dump-audit`
/// prints it.
fn one_conflict(dir: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let db = dir.join("q.redb");
    let lines = [
        common::msg("A", "S", 0, 1, "x"),
        common::msg("A", "S", 0, 1, "changed"),
    ];
    ingest(&config(dir, ""), &db, (lines.join("\n") + "\n").as_bytes());
    let audit = common::run(&["dump-audit", "--db", db.to_str().unwrap()]);
    assert_eq!(audit.status.code(), Some(0));
    (db, audit.stdout)
}

/// The first character in `bytes` that a terminal would act on, other than a line end.
fn has_terminal_controls(bytes: &[u8]) -> Option<char> {
    common::terminal_control(&String::from_utf8_lossy(bytes))
}

#[test]
fn operator_names_holding_a_colon_are_refused_as_they_would_split_wrongly() {
    let dir = tempfile::tempdir().unwrap();
    let (db, audit_before) = one_conflict(dir.path());
    let dbs = db.to_str().unwrap();
    let cfg = config(dir.path(), "");
    let commands: [&[&str]; 5] = [
        &["quarantine", "release", "0", "--db", dbs],
        &["quarantine", "discard", "0", "--db", dbs],
        &["relay", "retry", "--sink", "s", "--all", "--db", dbs],
        &["relay", "rewind", "--sink", "s", "--to", "0", "--db", dbs],
        &["relay", "forget", "--sink", "s", "--config", &cfg],
    ];
    for command in commands {
        for name in ["eve: admin", "eve:admin"] {
            let mut args = command.to_vec();
            args.extend(["--reason", "checked by radio", "--operator", name]);
            let out = common::run(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.contains(&format!("--operator \"{name}\" holds ':'"))
                    && err.contains("separates it from the reason"),
                "{args:?}: {err}"
            );
            assert!(out.stdout.is_empty(), "{args:?}");
        }
    }
    let audit = common::run(&["dump-audit", "--db", dbs]);
    assert_eq!(audit.stdout, audit_before);
    assert_eq!(rows("dump-quarantine", &db).len(), 1);
}

#[test]
fn operator_names_with_control_or_bidi_characters_are_refused_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (db, audit_before) = one_conflict(dir.path());
    let dbs = db.to_str().unwrap();
    let cfg = config(dir.path(), "");
    let forged = [
        "root\nadmin\u{1b}[2J",
        "alice\r",
        "\tbob",
        "bell\u{7}",
        "del\u{7f}",
        "csi\u{9b}2J",
        "line\u{2028}sep",
        "para\u{2029}sep",
        "nimda\u{202e}",
        "iso\u{2066}late\u{2069}",
    ];
    let commands: [&[&str]; 5] = [
        &["quarantine", "release", "0", "--db", dbs],
        &["quarantine", "discard", "0", "--db", dbs],
        &["relay", "retry", "--sink", "s", "--all", "--db", dbs],
        &["relay", "rewind", "--sink", "s", "--to", "0", "--db", dbs],
        &["relay", "forget", "--sink", "s", "--config", &cfg],
    ];
    for command in commands {
        for name in forged {
            let mut args = command.to_vec();
            args.extend(["--reason", "checked by radio", "--operator", name]);
            let out = common::run(&args);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.starts_with("replay-guard: ")
                    && err.contains("--operator \"")
                    && err.contains("an operator name may not hold control"),
                "{args:?}: {err}"
            );
            assert_eq!(has_terminal_controls(err.as_bytes()), None, "{err:?}");
            assert!(out.stdout.is_empty(), "{args:?}");
        }
        // The name the environment gives is checked the same way.
        for var in ["SUDO_USER", "USER", "LOGNAME"] {
            let mut args = command.to_vec();
            args.extend(["--reason", "checked by radio"]);
            let out = Command::new(common::bin())
                .args(&args)
                .env_remove("SUDO_USER")
                .env_remove("USER")
                .env_remove("LOGNAME")
                .env(var, "eve\u{1b}[2J\nalice")
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?} {var}: {err}");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.contains(&format!("${var} \"eve\\u001b[2J\\nalice\" holds U+001B"))
                    && err.contains("pass --operator NAME"),
                "{args:?}: {err}"
            );
        }
    }
    // Nothing was written: the same audit log, the conflict still held.
    let audit = common::run(&["dump-audit", "--db", dbs]);
    assert_eq!(audit.stdout, audit_before);
    assert_eq!(rows("dump-quarantine", &db).len(), 1);
    // A plain name goes through, printable Unicode included.
    let out = common::run(&[
        "quarantine",
        "release",
        "0",
        "--db",
        dbs,
        "--reason",
        "checked by radio",
        "--operator",
        "Zoë Ørsted",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let audit = rows("dump-audit", &db);
    assert_eq!(
        text(&audit[audit.len() - 1], "/reason"),
        "quarantine #0 released by Zoë Ørsted: checked by radio"
    );
}

#[test]
fn a_reason_keeps_its_control_characters_but_every_listing_prints_them_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = one_conflict(dir.path());
    let dbs = db.to_str().unwrap();
    let typed = "IC confirmed\nreleased by root\u{1b}[2J \u{202e}dlrow\u{85} C:\\radio";
    let out = common::run(&[
        "quarantine",
        "release",
        "0",
        "--db",
        dbs,
        "--reason",
        typed,
        "--operator",
        "alice",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stored = format!("quarantine #0 released by alice: {typed}");
    let shown = "quarantine #0 released by alice: IC confirmed\\nreleased by root\\u001b[2J \
                 \\u202edlrow\\u0085 C:\\\\radio";

    // jsonl: the exact text, read back by any JSON reader; nothing raw for the terminal.
    let jsonl = common::run(&["dump-audit", "--db", dbs]).stdout;
    assert_eq!(has_terminal_controls(&jsonl), None);
    let audit = rows("dump-audit", &db);
    assert_eq!(jsonl.iter().filter(|b| **b == b'\n').count(), audit.len());
    let released = &audit[audit.len() - 1];
    assert_eq!(text(released, "/outcome"), "released");
    assert_eq!(text(released, "/reason"), stored);

    // table and CSV: one line (record) per entry, the reason escaped.
    let table = common::run(&["dump-audit", "--db", dbs, "--format", "table"]).stdout;
    let table = String::from_utf8(table).unwrap();
    assert_eq!(has_terminal_controls(table.as_bytes()), None, "{table}");
    assert_eq!(table.lines().count(), 1 + audit.len(), "{table}");
    assert!(table.lines().last().unwrap().ends_with(shown), "{table}");
    let csv = common::run(&["dump-audit", "--db", dbs, "--format", "csv"]).stdout;
    let csv = String::from_utf8(csv).unwrap();
    assert_eq!(has_terminal_controls(csv.as_bytes()), None, "{csv}");
    assert_eq!(csv.split("\r\n").count(), 1 + audit.len() + 1, "{csv}");
    assert!(!csv.replace("\r\n", "").contains('\n'), "{csv}");
    assert!(csv.contains(&format!(",{shown},")), "{csv}");

    // explain: text escaped, JSON exact.
    let key = text(released, "/key");
    let story = common::run(&["explain", "--db", dbs, &key]).stdout;
    let story = String::from_utf8(story).unwrap();
    assert_eq!(has_terminal_controls(story.as_bytes()), None, "{story}");
    assert!(
        story.contains(&format!("      reason: {shown}\n")),
        "{story}"
    );
    let story = common::run(&["explain", "--db", dbs, &key, "--format", "json"]).stdout;
    assert_eq!(has_terminal_controls(&story), None);
    let story = json::parse(&story, 64).unwrap();
    let entries = match get(&story, "/audit") {
        Json::Array(a) => a,
        other => panic!("{other:?}"),
    };
    assert_eq!(text(&entries[entries.len() - 1], "/reason"), stored);

    // The hashed text is what was typed: the chain verifies.
    let (code, out) = verify(&db);
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn stats_last_hour_says_it_counts_only_what_retention_kept() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kept.redb");
    let cfg = config(
        dir.path(),
        "[commit]\nmax_batch = 100\n[retention]\naudit_max_entries = 100\n",
    );
    let lines: Vec<String> = (1..=1_700)
        .map(|n| common::msg("A", "S", 0, n, "x"))
        .collect();
    ingest(&cfg, &db, (lines.join("\n") + "\n").as_bytes());
    let s = stats(&db);
    assert_eq!(num(&s, "/decisions_total/total"), 1_700);
    assert_eq!(num(&s, "/decisions_total/applied"), 1_700);
    assert_eq!(num(&s, "/decisions_last_hour/total"), 100);
    assert_eq!(get(&s, "/decisions_last_hour_complete"), Json::Bool(false));
    assert_eq!(num(&s, "/audit/first_index"), 1_600);
    let first_at = text(&s, "/audit/first_recorded_at");
    let audit = rows("dump-audit", &db);
    assert_eq!(text(&audit[0], "/recorded_at"), first_at);
    let out = common::run(&["stats", "--db", db.to_str().unwrap()]);
    let t = String::from_utf8(out.stdout).unwrap();
    assert!(t.contains("decisions      1700 (applied 1700)\n"), "{t}");
    assert!(
        t.contains(&format!(
            "last hour      at least 100 (applied 100): retained audit entries only, from \
             {first_at} on; the 1600 pruned before them may hold more of the hour\n"
        )),
        "{t}"
    );

    // Nothing pruned: the hour is counted whole and said as before.
    let whole = dir.path().join("whole.redb");
    ingest(
        &config(dir.path(), ""),
        &whole,
        (lines[..5].join("\n") + "\n").as_bytes(),
    );
    let s = stats(&whole);
    assert_eq!(num(&s, "/decisions_last_hour/total"), 5);
    assert_eq!(get(&s, "/decisions_last_hour_complete"), Json::Bool(true));
    let out = common::run(&["stats", "--db", whole.to_str().unwrap()]);
    let t = String::from_utf8(out.stdout).unwrap();
    assert!(t.contains("last hour      5 (applied 5)\n"), "{t}");
}
