//! The read-side operator tools through the real binary: `dump-*` filters and CSV, `--follow`
//! against another process's commits, `explain`, `gaps`, `--tz` on the text of `dump-*`,
//! `explain` and `stats`, and one-line usage errors.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use replay_guard::json::{Json, parse};

use crate::common::{self, msg};

type Row = Vec<(String, Json)>;

/// How long a test waits for another process to show what it was given (a failure guard, not
/// a measured assertion).
const PATIENCE: Duration = Duration::from_secs(60);

fn get<'a>(row: &'a Row, name: &str) -> &'a Json {
    &row.iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in {}", Json::Object(row.clone()).to_compact()))
        .1
}

fn text<'a>(row: &'a Row, name: &str) -> &'a str {
    match get(row, name) {
        Json::String(s) => s,
        other => panic!("{name} is not a string: {other:?}"),
    }
}

fn number(row: &Row, name: &str) -> u64 {
    match get(row, name) {
        Json::Number(n) => n.parse().unwrap(),
        other => panic!("{name} is not a number: {other:?}"),
    }
}

fn rows(stdout: &[u8]) -> Vec<Row> {
    String::from_utf8(stdout.to_vec())
        .unwrap()
        .lines()
        .map(|l| match parse(l.as_bytes(), 64).unwrap() {
            Json::Object(m) => m,
            other => panic!("not an object: {other:?}"),
        })
        .collect()
}

/// Runs the binary; it must exit 0. Returns stdout.
fn ok(args: &[&str]) -> Vec<u8> {
    let out = common::run(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// `ingest` of `lines` on `topic`, to completion (one batch for a short input).
fn ingest(db: &Path, topic: &str, config: Option<&Path>, lines: &[String]) {
    let mut args = vec!["ingest", "--db", db.to_str().unwrap(), "--topic", topic];
    if let Some(c) = config {
        args.extend(["--config", c.to_str().unwrap()]);
    }
    args.push("-");
    let input = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    let out = common::run_with_stdin(&args, input.as_bytes());
    assert!(out.status.success(), "ingest: {out:?}");
}

/// A tiny RFC 4180 reader: records of fields, quoted fields with `""` escapes, CRLF ends.
fn read_csv(s: &str) -> Vec<Vec<String>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let mut chars = s.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                c => field.push(c),
            }
            continue;
        }
        match c {
            '"' => {
                assert!(field.is_empty(), "quote inside an unquoted field: {field}");
                quoted = true;
            }
            ',' => record.push(std::mem::take(&mut field)),
            '\r' => {
                assert_eq!(chars.next(), Some('\n'), "CR without LF");
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            '\n' => panic!("bare LF ends a CSV record"),
            c => field.push(c),
        }
    }
    assert!(
        !quoted && field.is_empty() && record.is_empty(),
        "unterminated record"
    );
    records
}

/// What a CSV field holds for a jsonl value.
fn csv_value(v: &Json) -> String {
    match v {
        Json::Null => String::new(),
        Json::String(s) | Json::Number(s) => s.clone(),
        Json::Bool(b) => b.to_string(),
        other => other.to_compact(),
    }
}

/// A database with every outcome: topic `t/a` then `t/b`, two sources, a duplicate, a
/// conflict, a late message and a malformed line. Returns (dir, db).
fn mixed_db() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("mixed.redb");
    ingest(
        &db,
        "t/a",
        None,
        &[
            msg("CALFIRE", "E7", 0, 1, "one"),
            msg("CALFIRE", "E7", 0, 2, "two, \\\"quoted\\\""),
            msg("LAFD", "E33", 0, 1, "one"),
            msg("CALFIRE", "E7", 0, 1, "one"),
            msg("LAFD", "E33", 0, 1, "other"),
            "{\"agency\":\"LAFD\",\"sequence\":\"x, \\\"y\\\"\"}".into(),
            msg("CALFIRE", "E7", 0, 4, "four"),
        ],
    );
    ingest(
        &db,
        "t/b,\"odd\"",
        None,
        &[
            msg("CALFIRE", "E7", 0, 3, "three"),
            msg("CALFIRE", "E7", 0, 2, "two, \\\"quoted\\\""),
            msg("LAFD", "E33", 0, 2, "two"),
            msg("LAFD", "E33", 0, 1, "other"),
        ],
    );
    (dir, db)
}

#[test]
fn dump_filters_select_by_time_source_outcome_key_and_topic_alone_and_combined() {
    let (_dir, db) = mixed_db();
    let db = db.to_str().unwrap();
    let tables = [
        ("dump-audit", "recorded_at"),
        ("dump-effects", "received_at"),
        ("dump-quarantine", "received_at"),
    ];
    let all: Vec<Vec<Row>> = tables
        .iter()
        .map(|(cmd, _)| rows(&ok(&[cmd, "--db", db])))
        .collect();
    assert_eq!(all[0].len(), 11, "one audit entry per line");
    assert_eq!(all[1].len(), 6, "CALFIRE/E7 1-4, LAFD/E33 1-2");
    assert_eq!(
        all[2].len(),
        2,
        "the conflict (twice delivered) and the malformed line"
    );

    // The outcome a row matches, per table.
    let outcome = |t: usize, r: &Row| -> String {
        match t {
            1 if get(r, "late") == &Json::Bool(true) => "applied_late".into(),
            1 => "applied".into(),
            _ => text(r, "outcome").into(),
        }
    };
    let source_of = |t: usize, r: &Row| -> Option<(String, String)> {
        if t == 2 {
            // Quarantine records name their source through their first audit entry.
            let index = number(r, "audit_index") as usize;
            let a = &all[0][index];
            return match (get(a, "agency"), get(a, "source_id")) {
                (Json::String(a), Json::String(s)) => Some((a.clone(), s.clone())),
                _ => None,
            };
        }
        match (get(r, "agency"), get(r, "source_id")) {
            (Json::String(a), Json::String(s)) => Some((a.clone(), s.clone())),
            _ => None,
        }
    };
    let conflict_key = text(&all[2][0], "key").to_string();
    // A time between the two ingests: the first entry of the second one.
    let second_start = text(&all[0][7], "recorded_at").to_string();
    assert!(text(&all[0][6], "recorded_at") < second_start.as_str());

    type Pred<'a> = Box<dyn Fn(usize, &Row) -> bool + 'a>;
    let cases: Vec<(Vec<&str>, Pred)> = vec![
        (
            vec!["--since", &second_start],
            Box::new(|t, r| text(r, tables[t].1) >= second_start.as_str()),
        ),
        (
            vec!["--until", &second_start],
            Box::new(|t, r| text(r, tables[t].1) < second_start.as_str()),
        ),
        (vec!["--since", "1h"], Box::new(|_, _| true)),
        (vec!["--until", "1h"], Box::new(|_, _| false)),
        (
            vec!["--source", "CALFIRE/E7"],
            Box::new(|t, r| source_of(t, r) == Some(("CALFIRE".into(), "E7".into()))),
        ),
        (
            vec!["--outcome", "duplicate", "--outcome", "applied_late"],
            Box::new(|t, r| ["duplicate", "applied_late"].contains(&outcome(t, r).as_str())),
        ),
        (
            vec!["--outcome", "conflict"],
            Box::new(|t, r| outcome(t, r) == "conflict"),
        ),
        (
            vec!["--key", &conflict_key],
            Box::new(|_, r| get(r, "key") == &Json::String(conflict_key.clone())),
        ),
        (
            vec!["--topic", "t/b,\"odd\""],
            Box::new(|_, r| text(r, "topic") == "t/b,\"odd\""),
        ),
        (
            vec![
                "--source",
                "LAFD/E33",
                "--outcome",
                "conflict",
                "--outcome",
                "applied",
                "--since",
                &second_start,
            ],
            Box::new(|t, r| {
                source_of(t, r) == Some(("LAFD".into(), "E33".into()))
                    && ["conflict", "applied"].contains(&outcome(t, r).as_str())
                    && text(r, tables[t].1) >= second_start.as_str()
            }),
        ),
    ];
    for (flags, want) in &cases {
        let mut matched_somewhere = false;
        for (t, (cmd, _)) in tables.iter().enumerate() {
            let mut args = vec![*cmd, "--db", db];
            args.extend(flags.iter().copied());
            let got = rows(&ok(&args));
            let expected: Vec<Row> = all[t].iter().filter(|r| want(t, r)).cloned().collect();
            assert_eq!(got, expected, "{cmd} {flags:?}");
            matched_somewhere |= !expected.is_empty();
        }
        if flags != &["--until", "1h"] {
            assert!(matched_somewhere, "{flags:?} selects nothing anywhere");
        }
    }
    // The combined filter is narrower than each of its parts.
    let combined = rows(&ok(&[
        "dump-audit",
        "--db",
        db,
        "--source",
        "LAFD/E33",
        "--outcome",
        "conflict",
        "--since",
        &second_start,
    ]));
    let indexes: Vec<u64> = combined.iter().map(|r| number(r, "index")).collect();
    assert_eq!(
        indexes,
        [10],
        "the second conflicting delivery of LAFD/E33's sequence 1"
    );
}

#[test]
fn csv_output_parses_back_to_the_jsonl_fields() {
    let (_dir, db) = mixed_db();
    let db = db.to_str().unwrap();
    for cmd in ["dump-audit", "dump-effects", "dump-quarantine"] {
        let jsonl = rows(&ok(&[cmd, "--db", db]));
        let csv = String::from_utf8(ok(&[cmd, "--db", db, "--format", "csv"])).unwrap();
        let records = read_csv(&csv);
        let header: Vec<String> = jsonl[0].iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(records[0], header, "{cmd}: header");
        assert_eq!(records.len(), jsonl.len() + 1, "{cmd}");
        for (record, row) in records[1..].iter().zip(&jsonl) {
            let want: Vec<String> = row.iter().map(|(_, v)| csv_value(v)).collect();
            assert_eq!(record, &want, "{cmd}");
        }
        // Filters apply to CSV too; the header stays.
        let none = ok(&[cmd, "--db", db, "--format", "csv", "--until", "1h"]);
        assert_eq!(read_csv(&String::from_utf8(none).unwrap()), [header]);
    }
    // Fields with commas and quotes were really quoted (not just split by luck).
    let effects = String::from_utf8(ok(&["dump-effects", "--db", db, "--format", "csv"])).unwrap();
    assert!(effects.contains("\"t/b,\"\"odd\"\"\""), "{effects}");
}

/// Lines from a child's stdout, read on a thread.
fn line_reader(stdout: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            match line {
                Ok(l) => {
                    if tx.send(l).is_err() {
                        break;
                    }
                }
                Err(_) => break,
            }
        }
    });
    rx
}

/// Reads lines until `n` have arrived, failing after `PATIENCE`.
fn take_lines(rx: &mpsc::Receiver<String>, n: usize, what: &str) -> Vec<String> {
    let deadline = Instant::now() + PATIENCE;
    let mut got = Vec::new();
    while got.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => got.push(l),
            Err(e) => panic!("{what}: only {} of {n} lines ({e}): {got:?}", got.len()),
        }
    }
    got
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig}");
}

/// Waits for `child` to exit, failing (and killing it) after `PATIENCE`.
fn wait_exit(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn spawn_follower(db: &str, args: &[&str]) -> Child {
    Command::new(common::bin())
        .args(args)
        .args(["--db", db, "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn follow_prints_what_another_process_commits_and_stops_cleanly_on_sigint_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("follow.redb");
    let db_arg = db.to_str().unwrap();
    ingest(&db, "t", None, &[msg("CALFIRE", "E7", 0, 1, "before")]);

    let mut audit = spawn_follower(db_arg, &["dump-audit"]);
    let audit_lines = line_reader(audit.stdout.take().unwrap());
    let mut effects = spawn_follower(
        db_arg,
        &["dump-effects", "--source", "LAFD/E33", "--format", "csv"],
    );
    let effect_lines = line_reader(effects.stdout.take().unwrap());

    // What existed before the follower started.
    let first = rows(
        take_lines(&audit_lines, 1, "existing")
            .join("\n")
            .as_bytes(),
    );
    assert_eq!(number(&first[0], "index"), 0);
    let header = take_lines(&effect_lines, 1, "csv header");
    assert!(header[0].starts_with("offset,key,agency"), "{header:?}");

    // A writer that keeps its input open: each stage commits after `linger_ms`.
    let mut writer = Command::new(common::bin())
        .args(["ingest", "--db", db_arg, "--topic", "live", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = writer.stdin.take().unwrap();
    let stages = [
        vec![
            msg("LAFD", "E33", 0, 1, "a"),
            msg("CALFIRE", "E7", 0, 2, "b"),
        ],
        vec![
            msg("CALFIRE", "E7", 0, 2, "b"),
            msg("LAFD", "E33", 0, 2, "c"),
            "not json".to_string(),
        ],
    ];
    let mut next_index = 1;
    let mut lafd_seen = 0;
    for (i, stage) in stages.iter().enumerate() {
        for line in stage {
            writeln!(stdin, "{line}").unwrap();
        }
        stdin.flush().unwrap();
        let got = rows(
            take_lines(&audit_lines, stage.len(), &format!("stage {i}"))
                .join("\n")
                .as_bytes(),
        );
        for row in &got {
            assert_eq!(number(row, "index"), next_index, "stage {i}");
            assert_eq!(text(row, "topic"), "live");
            next_index += 1;
        }
        let lafd = stage.iter().filter(|l| l.contains("LAFD")).count();
        let got = take_lines(&effect_lines, lafd, &format!("stage {i} effects"));
        for line in got {
            let record = &read_csv(&format!("{line}\r\n"))[0];
            assert_eq!(record[2..4], ["LAFD", "E33"], "{line}");
            lafd_seen += 1;
            assert_eq!(record[5], lafd_seen.to_string(), "sequence");
        }
    }
    let outcomes: Vec<String> = rows(&ok(&["dump-audit", "--db", db_arg]))
        .iter()
        .map(|r| text(r, "outcome").to_string())
        .collect();
    assert_eq!(
        outcomes,
        [
            "applied",
            "applied",
            "applied",
            "duplicate",
            "applied",
            "malformed"
        ]
    );

    signal(&audit, "-INT");
    let status = wait_exit(&mut audit, "dump-audit --follow after SIGINT");
    assert_eq!(status.code(), Some(0), "SIGINT: {status}");
    signal(&effects, "-TERM");
    let status = wait_exit(&mut effects, "dump-effects --follow after SIGTERM");
    assert_eq!(status.code(), Some(0), "SIGTERM: {status}");
    // Nothing more was printed than the entries (no repeats of earlier rounds).
    for (rx, what) in [
        (&audit_lines, "dump-audit"),
        (&effect_lines, "dump-effects"),
    ] {
        match rx.recv_timeout(PATIENCE) {
            Err(mpsc::RecvTimeoutError::Disconnected) => {}
            other => panic!("{what} printed more: {other:?}"),
        }
    }

    drop(stdin);
    assert!(wait_exit(&mut writer, "writer").success());
}

#[test]
fn follow_exits_0_when_its_reader_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("pipe.redb");
    let db_arg = db.to_str().unwrap();
    ingest(&db, "t", None, &[msg("A", "S", 0, 1, "x")]);
    let mut follower = spawn_follower(db_arg, &["dump-audit"]);
    let stdout = follower.stdout.take().unwrap();
    let mut reader = BufReader::new(stdout);
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert!(first.contains("\"index\":0"), "{first}");
    drop(reader);
    // The next round has something to print and finds the pipe closed. Keep committing until
    // the follower notices (each commit is a new round for it).
    let deadline = Instant::now() + PATIENCE;
    let mut seq = 2;
    let status = loop {
        if let Some(status) = follower.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the follower kept running");
        ingest(&db, "t", None, &[msg("A", "S", 0, seq, "y")]);
        seq += 1;
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut follower.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(0), "{status}: {stderr}");
    assert!(stderr.is_empty(), "{stderr}");
}

/// A window of 3 entries: the first source's sequence 1 is evicted after the first ingest.
fn story_db() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("story.redb");
    let config = dir.path().join("small-window.toml");
    // One batch per ingest (committed at end of input), whatever the machine's speed.
    std::fs::write(
        &config,
        "[window]\nmax_entries = 3\n[commit]\nlinger_ms = 60000\n",
    )
    .unwrap();
    ingest(
        &db,
        "incidents/e7",
        Some(&config),
        &[
            msg("CALFIRE", "E7", 0, 1, "a"),  // #0 applied, effect #0
            msg("CALFIRE", "E7", 0, 1, "a"),  // #1 duplicate of effect #0
            msg("CALFIRE", "E7", 0, 1, "b"),  // #2 conflict, quarantine #0
            msg("LAFD", "E33", 0, 1, "x"),    // #3 applied, effect #1
            msg("LAFD", "E33", 0, 3, "x"),    // #4 applied, effect #2
            msg("LAFD", "E33", 0, 2, "late"), // #5 applied_late, effect #3
        ],
    );
    // Four effects in a window of 3: effect #0 (CALFIRE/E7 1) was evicted at that commit.
    ingest(
        &db,
        "incidents/e7",
        Some(&config),
        &[msg("CALFIRE", "E7", 0, 1, "a")], // #6 stale, quarantine #1
    );
    (dir, db)
}

fn explain(args: &[&str]) -> String {
    String::from_utf8(ok(&[&["explain"], args].concat())).unwrap()
}

/// The time of day of an RFC 3339 time, as explain writes times on the same day.
fn tod(t: &str) -> &str {
    &t[11..]
}

#[test]
fn explain_tells_the_story_of_applied_duplicate_conflict_and_stale_entries() {
    let (_dir, db) = story_db();
    let db = db.to_str().unwrap();
    let audit = rows(&ok(&["dump-audit", "--db", db]));
    let effects = rows(&ok(&["dump-effects", "--db", db]));
    let outcomes: Vec<&str> = audit.iter().map(|r| text(r, "outcome")).collect();
    assert_eq!(
        outcomes,
        [
            "applied",
            "duplicate",
            "conflict",
            "applied",
            "applied",
            "applied_late",
            "stale"
        ]
    );
    let key = text(&audit[0], "key");
    let at = |i: usize| tod(text(&audit[i], "recorded_at"));
    let applied_at = tod(text(&effects[0], "received_at"));

    let story = explain(&["--db", db, key]);
    let lines: Vec<&str> = story.lines().collect();
    assert_eq!(lines[0], "Event CALFIRE/E7 epoch 0 sequence 1");
    assert_eq!(lines[1], format!("key {key} (key v1)"));
    assert!(
        story.contains("Audit log: 4 entries with this key"),
        "{story}"
    );
    let want = [
        format!("applied at {} as effect #0", at(0)),
        format!(
            "suppressed at {}: same content as the message applied at {applied_at} as effect #0",
            at(1)
        ),
        format!(
            "quarantined as a conflict at {} (quarantine #0): same key as the message applied \
             at {applied_at} as effect #0, but different content; not applied",
            at(2)
        ),
        format!(
            "quarantined as stale at {} (quarantine #1): not in the window and not provably \
             new; not applied",
            at(6)
        ),
    ];
    let sentences: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("      ") && !l.trim_start().starts_with("reason:"))
        .map(|l| l.trim_start())
        .collect();
    assert_eq!(sentences, want, "{story}");
    for (n, i) in [0, 1, 2, 6].iter().enumerate() {
        let header = format!(
            "  #{i} {} {} on topic incidents/e7",
            text(&audit[*i], "recorded_at"),
            outcomes[*i]
        );
        assert!(
            lines.contains(&header.as_str()),
            "entry {n}: {header}\n{story}"
        );
        let reason = format!("      reason: {}", text(&audit[*i], "reason"));
        assert!(lines.contains(&reason.as_str()), "{reason}\n{story}");
    }
    assert!(
        story.contains(&format!(
            "  #0 received {} on topic incidents/e7, in order (late: false), not released, \
             audit entry #0",
            text(&effects[0], "received_at")
        )),
        "{story}"
    );
    assert!(story.contains("  #0 conflict, first received"), "{story}");
    assert!(story.contains("  #1 stale, first received"), "{story}");
    assert!(
        story.contains(
            "Position epoch 0 sequence 1 is no longer in the dedup window (at or below the \
             evicted floor): a resend now would be quarantined as stale, never applied twice."
        ),
        "{story}"
    );
    assert!(
        story.contains(
            "Source CALFIRE/E7: high-water mark epoch 0 sequence 1, evicted floor epoch 0 \
             sequence 1."
        ),
        "{story}"
    );

    // The same event named by source and position, with and without --epoch.
    assert_eq!(
        explain(&["--db", db, "--source", "CALFIRE/E7", "--sequence", "1"]),
        story
    );
    assert_eq!(
        explain(&[
            "--db",
            db,
            "--source",
            "CALFIRE/E7",
            "--sequence",
            "1",
            "--epoch",
            "0"
        ]),
        story
    );
    // Upper-case hex names the same key.
    assert_eq!(explain(&["--db", db, &key.to_uppercase()]), story);
}

#[test]
fn explain_names_late_effects_and_the_window_state() {
    let (_dir, db) = story_db();
    let db = db.to_str().unwrap();
    let audit = rows(&ok(&["dump-audit", "--db", db]));
    let effects = rows(&ok(&["dump-effects", "--db", db]));
    let story = explain(&["--db", db, "--source", "LAFD/E33", "--sequence", "2"]);
    assert!(
        story.contains("Audit log: 1 entry with this key"),
        "{story}"
    );
    assert!(
        story.contains(&format!(
            "applied late at {} as effect #3 (late: true; it was never applied before)",
            tod(text(&audit[5], "recorded_at"))
        )),
        "{story}"
    );
    assert!(
        story.contains(&format!(
            "  #3 received {} on topic incidents/e7, late (late: true), not released, audit \
             entry #5",
            text(&effects[3], "received_at")
        )),
        "{story}"
    );
    assert!(story.contains("Quarantine records: none"), "{story}");
    assert!(
        story.contains(
            "Position epoch 0 sequence 2 is still in the dedup window, holding effect #3"
        ),
        "{story}"
    );
    assert!(
        story.contains("Source LAFD/E33: high-water mark epoch 0 sequence 3, evicted floor none"),
        "{story}"
    );

    // The JSON form carries the same facts for scripts.
    let json = ok(&[
        "explain",
        "--db",
        db,
        "--format",
        "json",
        "--source",
        "CALFIRE/E7",
        "--sequence",
        "1",
    ]);
    let text_out = String::from_utf8(json.clone()).unwrap();
    assert_eq!(text_out.lines().count(), 1, "one JSON object on one line");
    let obj = match parse(&json, 64).unwrap() {
        Json::Object(o) => o,
        other => panic!("{other:?}"),
    };
    assert_eq!(get(&obj, "key"), get(&audit[0], "key"));
    assert_eq!(text(&obj, "agency"), "CALFIRE");
    assert_eq!(number(&obj, "sequence"), 1);
    let Json::Array(entries) = get(&obj, "audit") else {
        panic!("audit is not an array")
    };
    let indexes: Vec<u64> = entries
        .iter()
        .map(|e| match e {
            Json::Object(r) => number(r, "index"),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(indexes, [0, 1, 2, 6]);
    let Json::Object(dup) = &entries[1] else {
        panic!()
    };
    assert!(text(dup, "story").starts_with("suppressed at "), "{dup:?}");
    let Json::Array(eff) = get(&obj, "effects") else {
        panic!()
    };
    assert_eq!(eff.len(), 1);
    let Json::Array(q) = get(&obj, "quarantine") else {
        panic!()
    };
    assert_eq!(q.len(), 2);
    assert_eq!(get(&obj, "in_window"), &Json::Bool(false));
    assert_eq!(get(&obj, "window_effect_offset"), &Json::Null);
    let Json::Object(floor) = get(&obj, "evicted_floor") else {
        panic!()
    };
    assert_eq!((number(floor, "epoch"), number(floor, "sequence")), (0, 1));
}

/// agency, source_id, epoch, lowest, highest, missing_from, missing_to, missing_count
type GapRow = (String, String, u64, u64, u64, u64, u64, u64);

#[test]
fn gaps_lists_missing_ranges_per_source_and_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("gaps.redb");
    let db_arg = db.to_str().unwrap();
    let mut lines: Vec<String> = (1..=5)
        .chain([9])
        .chain(13..=20)
        .map(|s| msg("A", "S", 0, s, "x"))
        .collect();
    // Late, duplicate and conflicting deliveries count as seen too.
    lines.push(msg("A", "S", 0, 12, "late"));
    lines.push(msg("A", "S", 0, 9, "x"));
    lines.push(msg("A", "S", 0, 9, "conflicting"));
    lines.extend((1..=3).map(|s| msg("B", "T/1", 0, s, "x")));
    lines.extend([5, 7].map(|s| msg("A", "S", 1, s, "x")));
    lines.push("not json".into());
    ingest(&db, "t", None, &lines);

    let got = rows(&ok(&["gaps", "--db", db_arg]));
    let flat: Vec<GapRow> = got
        .iter()
        .map(|r| {
            (
                text(r, "agency").to_string(),
                text(r, "source_id").to_string(),
                number(r, "epoch"),
                number(r, "lowest"),
                number(r, "highest"),
                number(r, "missing_from"),
                number(r, "missing_to"),
                number(r, "missing_count"),
            )
        })
        .collect();
    let a = |epoch: u64, lo: u64, hi: u64, from: u64, to: u64, n: u64| {
        ("A".to_string(), "S".to_string(), epoch, lo, hi, from, to, n)
    };
    assert_eq!(
        flat,
        [
            a(0, 1, 20, 6, 8, 3),
            a(0, 1, 20, 10, 11, 2),
            a(1, 5, 7, 6, 6, 1)
        ]
    );

    let table = String::from_utf8(ok(&["gaps", "--db", db_arg, "--format", "table"])).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("AGENCY"), "{table}");
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.starts_with('#'))
            .copied()
            .collect::<Vec<_>>(),
        [
            "# A/S epoch 0: sequences 1..20, 15 seen, 5 missing in 2 gaps",
            "# A/S epoch 1: sequences 5..7, 2 seen, 1 missing in 1 gap",
            "# B/T/1 epoch 0: sequences 1..3, 3 seen, no gaps",
        ]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row, ["A", "S", "0", "1", "20", "6", "8", "3"]);

    let csv =
        read_csv(&String::from_utf8(ok(&["gaps", "--db", db_arg, "--format", "csv"])).unwrap());
    assert_eq!(
        csv[0],
        [
            "agency",
            "source_id",
            "epoch",
            "lowest",
            "highest",
            "missing_from",
            "missing_to",
            "missing_count"
        ]
    );
    assert_eq!(csv[2], ["A", "S", "0", "1", "20", "10", "11", "2"]);
    assert_eq!(csv.len(), 4);

    // --source narrows it; a source without gaps prints nothing and still exits 0.
    assert_eq!(
        rows(&ok(&["gaps", "--db", db_arg, "--source", "A/S"])).len(),
        3
    );
    assert!(ok(&["gaps", "--db", db_arg, "--source", "B/T/1"]).is_empty());
}

#[test]
fn malformed_arguments_are_one_line_errors_with_exit_1() {
    let (_dir, db) = story_db();
    let db = db.to_str().unwrap();
    let key = "ab".repeat(32);
    let cases: Vec<Vec<&str>> = vec![
        vec!["dump-audit", "--since", "yesterday"],
        vec!["dump-audit", "--until", "5w"],
        vec!["dump-audit", "--since", "2026-11-30T02:00:00"],
        vec!["dump-effects", "--since", "2026-02-30T00:00:00Z"],
        vec!["dump-effects", "--source", "CALFIRE"],
        vec!["dump-quarantine", "--source", "/E7"],
        vec!["dump-audit", "--outcome", "aplied"],
        vec![
            "dump-quarantine",
            "--outcome",
            "applied",
            "--outcome",
            "nope",
        ],
        vec!["dump-audit", "--key", "abc"],
        vec!["dump-effects", "--key", &key[1..]],
        vec!["dump-audit", "--follow", "--since", "soon"],
        vec!["explain"],
        vec!["explain", "xyz"],
        vec!["explain", &key, "--source", "A/B"],
        vec!["explain", &key, "--sequence", "1"],
        vec!["explain", "--source", "A/B"],
        vec!["explain", "--source", "AB", "--sequence", "1"],
        vec!["explain", "--source", "A/B", "--sequence", "-1"],
        vec!["explain", "--source", "A/B", "--sequence", "x"],
        vec![
            "explain",
            "--source",
            "A/B",
            "--sequence",
            "1",
            "--epoch",
            "1.5",
        ],
        vec!["explain", "--sequence", "1"],
        vec!["explain", &key],
        vec!["explain", "--source", "A/B", "--sequence", "1"],
        vec!["gaps", "--source", "nosep"],
    ];
    for case in cases {
        let mut args = case.clone();
        args.extend(["--db", db]);
        let out = common::run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{case:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{case:?}: {stderr}");
        assert!(
            stderr.starts_with("replay-guard: error: "),
            "{case:?}: {stderr}"
        );
        assert!(out.stdout.is_empty(), "{case:?}");
    }
    let out = common::run(&["explain", "--db", db, &key]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("no audit entry has key {key}"))
    );
    for sub in ["explain", "gaps"] {
        let help = String::from_utf8(ok(&[sub, "--help"])).unwrap();
        assert!(
            help.contains("--db") && help.contains("--source"),
            "{sub}: {help}"
        );
    }
}

#[test]
fn follow_with_a_past_until_ends_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("u.redb");
    let out = common::run_with_stdin(
        &["ingest", "--db", db.to_str().unwrap(), "-"],
        (common::msg("A", "S", 0, 1, "x") + "\n").as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0));
    // Everything before an `--until` three minutes ago: nothing can match any more.
    let mut child = std::process::Command::new(common::bin())
        .args([
            "dump-audit",
            "--follow",
            "--until",
            "3m",
            "--db",
            db.to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            panic!("--follow --until 3m was still following after 20 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
}

/// Runs the binary with the host zone set to `tz` (so `local` does not depend on the machine);
/// it must exit 0. Returns stdout.
fn ok_in_zone(tz: &str, args: &[&str]) -> String {
    let out = Command::new(common::bin())
        .env("TZ", tz)
        .args(args)
        .output()
        .expect("spawn replay-guard");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The `recorded_at` cells of a `dump-audit --format table` output.
fn table_times(table: &str) -> Vec<String> {
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("INDEX"), "{table}");
    lines
        .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
        .collect()
}

/// Whether `shown` is the UTC time `utc` (`…T02:52:14.123Z`) at a whole-or-half-hour `offset`
/// like `+05:30`: same minutes' remainder and seconds, hours and minutes shifted by it.
fn same_instant_at(utc: &str, shown: &str, offset: &str) -> bool {
    let minutes = |t: &str| -> i64 {
        let h: i64 = t[11..13].parse().unwrap();
        let m: i64 = t[14..16].parse().unwrap();
        h * 60 + m
    };
    let sign = if offset.starts_with('-') { -1 } else { 1 };
    let off =
        sign * (offset[1..3].parse::<i64>().unwrap() * 60 + offset[4..6].parse::<i64>().unwrap());
    shown.ends_with(offset)
        && shown[16..23] == utc[16..23]
        && (minutes(shown) - minutes(utc) - off).rem_euclid(24 * 60) == 0
}

#[test]
fn table_times_show_in_the_tz_zone_and_zoneless_filters_are_read_in_it() {
    let (_dir, db) = story_db();
    let db = db.to_str().unwrap();
    let utc: Vec<String> = rows(&ok(&["dump-audit", "--db", db]))
        .iter()
        .map(|r| text(r, "recorded_at").to_string())
        .collect();
    assert_eq!(utc.len(), 7);

    // Default and --tz UTC: the stored UTC text, whatever the host's zone.
    for extra in [&[][..], &["--tz", "UTC"][..]] {
        let mut args = vec![
            "dump-audit",
            "--db",
            db,
            "--since",
            "2h",
            "--format",
            "table",
        ];
        args.extend(extra);
        assert_eq!(table_times(&ok_in_zone("Asia/Kolkata", &args)), utc);
    }

    // A named zone (Berlin is +01:00 in winter, +02:00 in summer) and `local` from TZ.
    let berlin = ok_in_zone(
        "Asia/Kolkata",
        &[
            "dump-audit",
            "--db",
            db,
            "--since",
            "2h",
            "--format",
            "table",
            "--tz",
            "Europe/Berlin",
        ],
    );
    let shown = table_times(&berlin);
    assert_eq!(shown.len(), utc.len());
    for (u, s) in utc.iter().zip(&shown) {
        assert!(
            same_instant_at(u, s, "+01:00") || same_instant_at(u, s, "+02:00"),
            "{u} shown as {s}"
        );
    }
    let local = ok_in_zone(
        "Asia/Kolkata",
        &[
            "dump-audit",
            "--db",
            db,
            "--format",
            "table",
            "--tz",
            "local",
        ],
    );
    for (u, s) in utc.iter().zip(table_times(&local)) {
        assert!(same_instant_at(u, &s, "+05:30"), "{u} shown as {s}");
    }

    // jsonl and CSV keep UTC with --tz.
    let jsonl = ok_in_zone("Asia/Kolkata", &["dump-audit", "--db", db, "--tz", "local"]);
    assert_eq!(
        rows(jsonl.as_bytes())
            .iter()
            .map(|r| text(r, "recorded_at").to_string())
            .collect::<Vec<_>>(),
        utc
    );
    let csv = ok_in_zone(
        "Asia/Kolkata",
        &[
            "dump-audit",
            "--db",
            db,
            "--format",
            "csv",
            "--tz",
            "Europe/Berlin",
        ],
    );
    assert!(!csv.contains("+01:00") && !csv.contains("+02:00"), "{csv}");

    // A zoneless --since is read in --tz: Berlin's civil time of entry #6 selects from it on,
    // like the UTC time does. Friendly and ISO durations select everything recent.
    let civil = &shown[6][..shown[6].len() - 6];
    let from_civil = ok_in_zone(
        "Asia/Kolkata",
        &[
            "dump-audit",
            "--db",
            db,
            "--since",
            civil,
            "--tz",
            "Europe/Berlin",
        ],
    );
    let from_utc = ok(&["dump-audit", "--db", db, "--since", &utc[6]]);
    assert_eq!(from_civil.as_bytes(), &from_utc[..]);
    assert_eq!(rows(&from_utc).len(), 1);
    for ago in ["1h30m", "2 days", "PT1H"] {
        assert_eq!(
            rows(&ok(&["dump-audit", "--db", db, "--since", ago])).len(),
            7,
            "{ago}"
        );
        assert!(
            rows(&ok(&["dump-audit", "--db", db, "--until", ago])).is_empty(),
            "{ago}"
        );
    }

    // An unknown zone is a one-line usage error.
    let out = common::run(&["dump-audit", "--db", db, "--tz", "Mars/Olympus_Mons"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("invalid value 'Mars/Olympus_Mons' for '--tz <ZONE>'"),
        "{stderr}"
    );
}

/// `text` with every time of the form `2026-11-30T02:52:14.123` or `02:52:14.123` followed by
/// `suffix` (`Z`, or `+dd:dd` where `d` is any digit) replaced by `<T>`, and the seconds of
/// stats' `(N s ago)` by `N` (they tick between two runs).
fn mask_times(text: &str, suffix: &str) -> String {
    let at = |b: &[u8], i: usize, shape: &str| {
        i + shape.len() <= b.len()
            && shape.bytes().zip(&b[i..]).all(|(p, c)| {
                if p == b'd' {
                    c.is_ascii_digit()
                } else {
                    p == *c
                }
            })
    };
    let (full, short) = (
        format!("dddd-dd-ddTdd:dd:dd.ddd{suffix}"),
        format!("dd:dd:dd.ddd{suffix}"),
    );
    let b = text.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if let Some(shape) = [&full, &short].into_iter().find(|s| at(b, i, s)) {
            out.push_str("<T>");
            i += shape.len();
        } else if text[i..].starts_with('(')
            && text[i..]
                .find(" s ago)")
                .is_some_and(|n| n > 1 && text[i + 1..i + n].bytes().all(|c| c.is_ascii_digit()))
        {
            out.push_str("(N");
            i += 1 + text[i + 1..].find(' ').unwrap();
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

#[test]
fn explain_and_stats_show_text_times_in_the_tz_zone_and_json_in_utc() {
    let (_dir, db) = story_db();
    let db = db.to_str().unwrap();
    let audit = rows(&ok(&["dump-audit", "--db", db]));
    let effects = rows(&ok(&["dump-effects", "--db", db]));
    let key = text(&audit[0], "key");
    let explain_with = |extra: &[&str]| {
        ok_in_zone(
            "Asia/Kolkata",
            &[&["explain", "--db", db, key][..], extra].concat(),
        )
    };

    // Default and --tz UTC: the UTC text explain always printed, whatever the host's zone.
    let utc = explain_with(&[]);
    assert_eq!(explain_with(&["--tz", "UTC"]), utc);
    let header = format!(
        "  #0 {} applied on topic incidents/e7",
        text(&audit[0], "recorded_at")
    );
    assert!(utc.lines().any(|l| l == header), "{utc}");

    // Europe/Berlin (+01:00 in winter, +02:00 in summer): every time converted, with its
    // offset, nothing else changed; a sentence's time of day is Berlin's.
    let berlin = explain_with(&["--tz", "Europe/Berlin"]);
    assert_eq!(mask_times(&berlin, "+dd:dd"), mask_times(&utc, "Z"));
    assert!(
        !mask_times(&berlin, "Z").contains("<T>"),
        "a UTC time left: {berlin}"
    );
    let shown = |prefix: &str| -> String {
        let line = berlin
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line: {berlin}"));
        line[prefix.len()..]
            .split([' ', ','])
            .next()
            .unwrap()
            .to_string()
    };
    let in_berlin = |utc: &str, shown: &str| {
        same_instant_at(utc, shown, "+01:00") || same_instant_at(utc, shown, "+02:00")
    };
    let recorded = shown("  #0 ");
    assert!(
        in_berlin(text(&audit[0], "recorded_at"), &recorded),
        "{berlin}"
    );
    assert!(
        berlin.contains(&format!(
            "      applied at {} as effect #0\n",
            tod(&recorded)
        )),
        "{berlin}"
    );
    let received = shown("  #0 received ");
    assert!(
        in_berlin(text(&effects[0], "received_at"), &received),
        "{berlin}"
    );
    let quarantined = shown("  #0 conflict, first received ");
    let quarantine = rows(&ok(&["dump-quarantine", "--db", db]));
    assert!(
        in_berlin(text(&quarantine[0], "received_at"), &quarantined),
        "{berlin}"
    );
    let local = explain_with(&["--tz", "local"]);
    assert_eq!(mask_times(&local, "+05:30"), mask_times(&utc, "Z"));

    // --format json stays UTC, its story sentences too.
    assert_eq!(
        explain_with(&["--format", "json", "--tz", "Europe/Berlin"]),
        explain_with(&["--format", "json"])
    );

    // stats: the same for its created and oldest-received times.
    let stats_with = |extra: &[&str]| {
        ok_in_zone(
            "Asia/Kolkata",
            &[&["stats", "--db", db][..], extra].concat(),
        )
    };
    let utc = stats_with(&[]);
    assert_eq!(
        mask_times(&stats_with(&["--tz", "UTC"]), "Z"),
        mask_times(&utc, "Z")
    );
    let berlin = stats_with(&["--tz", "Europe/Berlin"]);
    assert_eq!(mask_times(&berlin, "+dd:dd"), mask_times(&utc, "Z"));
    assert!(
        !mask_times(&berlin, "Z").contains("<T>"),
        "a UTC time left: {berlin}"
    );
    let json = stats_with(&["--format", "json", "--tz", "Europe/Berlin"]);
    let Json::Object(s) = parse(json.as_bytes(), 64).unwrap() else {
        panic!("{json}")
    };
    let created = text(&s, "created_at");
    assert!(created.ends_with('Z'), "{json}");
    let Json::Object(window) = get(&s, "window") else {
        panic!("{json}")
    };
    let oldest = text(window, "oldest_at");
    assert!(oldest.ends_with('Z'), "{json}");
    let field = |label: &str, before: &str| -> String {
        let line = berlin.lines().find(|l| l.starts_with(label)).unwrap();
        let at = line.find(before).unwrap() + before.len();
        line[at..].split([' ', ')']).next().unwrap().to_string()
    };
    assert!(
        in_berlin(created, &field("database", "created ")),
        "{berlin}"
    );
    assert!(
        in_berlin(oldest, &field("window", "oldest received ")),
        "{berlin}"
    );
    assert!(
        utc.contains(&format!("created {created})")),
        "{utc}\nwithout --tz the stored UTC time"
    );

    // An unknown zone is a one-line usage error, before the database is opened.
    for args in [
        &[
            "explain",
            "--db",
            "/nonexistent/x.redb",
            key,
            "--tz",
            "Mars/Olympus_Mons",
        ][..],
        &[
            "stats",
            "--db",
            "/nonexistent/x.redb",
            "--tz",
            "Mars/Olympus_Mons",
        ],
    ] {
        let out = common::run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("invalid value 'Mars/Olympus_Mons' for '--tz <ZONE>'"),
            "{stderr}"
        );
    }
}

#[test]
fn the_time_mask_can_fail() {
    assert_eq!(
        mask_times(
            "at 2026-11-30T02:52:14.123Z and 02:52:14.123Z (12 s ago)",
            "Z"
        ),
        "at <T> and <T> (N s ago)"
    );
    assert_eq!(
        mask_times("at 2026-11-30T03:52:14.123+01:00", "+dd:dd"),
        "at <T>"
    );
    assert_ne!(
        mask_times("at 2026-11-30T03:52:14.123+01:00", "Z"),
        "at <T>"
    );
}

#[test]
fn since_and_until_refuse_utc_offsets_beyond_23_59() {
    let (_dir, db) = story_db();
    let db = db.to_str().unwrap();
    for (flag, value) in [
        ("--since", "2026-11-30T02:00:00+25:00"),
        ("--until", "2026-11-30T02:00:00-24:00"),
    ] {
        for command in ["dump-audit", "dump-effects", "dump-quarantine"] {
            let out = common::run(&[command, "--db", db, flag, value]);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{command} {flag}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(
                stderr.starts_with(&format!(
                    "replay-guard: error: invalid value '{value}' for '{flag} <T>'"
                )),
                "{stderr}"
            );
            assert!(stderr.contains("-23:59 to +23:59"), "{stderr}");
            assert!(out.stdout.is_empty());
        }
    }
    // The largest offsets RFC 3339 allows still work.
    let all = rows(&ok(&["dump-audit", "--db", db]));
    let early = rows(&ok(&[
        "dump-audit",
        "--db",
        db,
        "--since",
        "1970-01-02T00:00:00+23:59",
    ]));
    assert_eq!(early.len(), all.len());
    let late = rows(&ok(&[
        "dump-audit",
        "--db",
        db,
        "--until",
        "1970-01-01T00:00:00-23:59",
    ]));
    assert!(late.is_empty());
}

#[test]
fn explain_without_epoch_names_the_epochs_the_source_has() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("epochs.redb");
    let db_arg = db.to_str().unwrap();
    ingest(
        &db,
        "t",
        None,
        &[
            msg("A", "S", 2, 1, "x"),
            msg("A", "S", 1, 1, "x"),
            msg("B", "T", 7, 1, "x"),
        ],
    );
    let run = |extra: &[&str]| {
        let out = common::run(
            &[
                &[
                    "explain",
                    "--db",
                    db_arg,
                    "--source",
                    "A/S",
                    "--sequence",
                    "1",
                ],
                extra,
            ]
            .concat(),
        );
        assert_eq!(out.status.code(), Some(1));
        String::from_utf8(out.stderr).unwrap()
    };
    let err = run(&[]);
    assert!(
        err.trim_end()
            .ends_with("(A/S epoch 0 sequence 1): source has epochs 1, 2: add --epoch E"),
        "{err}"
    );
    // An explicit epoch is taken as meant; a source seen only under epoch 0 needs no hint.
    assert!(!run(&["--epoch", "3"]).contains("source has epoch"));
    assert!(
        explain(&[
            "--db",
            db_arg,
            "--source",
            "A/S",
            "--sequence",
            "1",
            "--epoch",
            "1"
        ])
        .starts_with("Event A/S epoch 1 sequence 1")
    );
}
