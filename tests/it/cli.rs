//! The command line as an operator meets it: exit codes, config errors, and `ingest` /
//! `dump-*` output on the shipped sample feed, asserted field by field.

use std::path::{Path, PathBuf};

use replay_guard::json::{Json, parse};

use super::common::{self, run};

fn sample_feed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl")
}

fn rows(stdout: &[u8]) -> Vec<Vec<(String, Json)>> {
    String::from_utf8(stdout.to_vec())
        .unwrap()
        .lines()
        .map(|l| match parse(l.as_bytes(), 64).unwrap() {
            Json::Object(m) => m,
            other => panic!("not an object: {other:?}"),
        })
        .collect()
}

fn get<'a>(row: &'a [(String, Json)], name: &str) -> &'a Json {
    &row.iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .1
}
fn s(v: &str) -> Json {
    Json::String(v.into())
}
fn n(v: u64) -> Json {
    Json::Number(v.to_string())
}

#[test]
fn every_subcommand_has_help_and_usage_errors_exit_1() {
    for sub in ["ingest", "dump-audit", "dump-effects", "dump-quarantine"] {
        let out = run(&[sub, "--help"]);
        assert_eq!(out.status.code(), Some(0), "{sub} --help");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("--db"),
            "{sub}"
        );
    }
    let out = run(&["--help"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Exit codes"));
    assert_eq!(run(&["frobnicate"]).status.code(), Some(1));
    assert_eq!(
        run(&["dump-audit", "--format", "xml", "--db", "x"])
            .status
            .code(),
        Some(1)
    );

    let no_db = run(&["dump-audit"]);
    assert_eq!(no_db.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&no_db.stderr).contains("--db PATH"));

    let missing = run(&["dump-effects", "--db", "/nonexistent/x.redb"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("does not exist"));
}

#[test]
fn config_errors_name_the_problem_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[window]\nseconds = 60\nmax_entires = 5\n").unwrap();
    let out = run(&[
        "ingest",
        "--config",
        cfg.to_str().unwrap(),
        "--db",
        "x.redb",
        "/dev/null",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("max_entires") && err.contains("c.toml"),
        "{err}"
    );

    let out = run(&["ingest", "--config", "/nonexistent.toml", "/dev/null"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read config file"));
}

#[test]
fn config_file_supplies_the_database_path_and_flags_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    let from_cfg = dir.path().join("from-config.redb");
    std::fs::write(
        &cfg,
        format!("[store]\npath = {:?}\n", from_cfg.to_str().unwrap()),
    )
    .unwrap();
    let feed = sample_feed();
    let out = run(&[
        "ingest",
        "--config",
        cfg.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(from_cfg.exists());
    let flag = dir.path().join("flag.redb");
    let out = run(&[
        "ingest",
        "--config",
        cfg.to_str().unwrap(),
        "--db",
        flag.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(flag.exists());
    let dump = run(&["dump-effects", "--config", cfg.to_str().unwrap()]);
    assert_eq!(rows(&dump.stdout).len(), 8);
}

#[test]
fn sample_feed_decides_as_documented_and_dumps_field_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.redb");
    let db_s = db.to_str().unwrap();
    let feed = sample_feed();
    let out = run(&[
        "ingest",
        "--db",
        db_s,
        "--topic",
        "incidents/ca",
        feed.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let summary = String::from_utf8_lossy(&out.stderr);
    for line in [
        "applied               7",
        "applied_late          1",
        "duplicate             3",
        "conflict              1",
        "malformed             2",
    ] {
        assert!(summary.contains(line), "{summary}");
    }

    let audit = rows(&run(&["dump-audit", "--db", db_s]).stdout);
    let outcomes: Vec<String> = audit
        .iter()
        .map(|r| match get(r, "outcome") {
            Json::String(s) => s.clone(),
            _ => panic!(),
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            "applied",
            "applied",
            "applied",
            "applied",
            "applied",
            "duplicate",
            "duplicate",
            "duplicate",
            "applied",
            "applied_late",
            "conflict",
            "malformed",
            "malformed",
            "applied"
        ]
    );
    let names: Vec<&str> = audit[0].iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "index",
            "recorded_at",
            "outcome",
            "key",
            "agency",
            "source_id",
            "epoch",
            "sequence",
            "topic",
            "reason",
            "digest",
            "effect_offset",
            "quarantine_id",
            "prev_hash",
            "hash"
        ]
    );
    let first = &audit[0];
    assert_eq!(get(first, "index"), &n(0));
    assert_eq!(
        get(first, "key"),
        &s("258a39cc3f0c92fa60dba8e7ba9b0b86aa499b4773d2629e7332dd587c23fc7c")
    );
    assert_eq!(get(first, "agency"), &s("CALFIRE"));
    assert_eq!(get(first, "source_id"), &s("IC-4471"));
    assert_eq!(get(first, "epoch"), &n(1));
    assert_eq!(get(first, "sequence"), &n(1));
    assert_eq!(get(first, "topic"), &s("incidents/ca"));
    assert_eq!(get(first, "effect_offset"), &n(0));
    assert_eq!(get(first, "quarantine_id"), &Json::Null);
    assert_eq!(get(first, "prev_hash"), &s(&"0".repeat(64)));
    let Json::String(at) = get(first, "recorded_at") else {
        panic!()
    };
    assert!(
        at.len() == 24 && at.ends_with('Z') && at.as_bytes()[10] == b'T',
        "{at}"
    );
    // The re-serialised resend (line 7) is a duplicate of effect #2.
    assert_eq!(get(&audit[6], "effect_offset"), &n(2));
    assert_eq!(get(&audit[6], "digest"), get(&audit[2], "digest"));
    // The conflicting line keeps its own digest and points at the quarantine.
    assert_ne!(get(&audit[10], "digest"), get(&audit[2], "digest"));
    assert_eq!(get(&audit[10], "quarantine_id"), &n(0));
    assert_eq!(get(&audit[11], "key"), &Json::Null);
    for pair in audit.windows(2) {
        assert_eq!(get(&pair[1], "prev_hash"), get(&pair[0], "hash"));
    }

    let effects = rows(&run(&["dump-effects", "--db", db_s]).stdout);
    assert_eq!(effects.len(), 8);
    let late = &effects[6];
    assert_eq!(get(late, "offset"), &n(6));
    assert_eq!(get(late, "agency"), &s("OES"));
    assert_eq!(get(late, "late"), &Json::Bool(true));
    assert_eq!(get(late, "released"), &Json::Bool(false));
    let Json::Object(message) = get(late, "message") else {
        panic!("message is not an object")
    };
    assert_eq!(message.iter().find(|(k, _)| k == "period").unwrap().1, n(1));

    let q = rows(&run(&["dump-quarantine", "--db", db_s]).stdout);
    assert_eq!(q.len(), 3);
    assert_eq!(get(&q[0], "outcome"), &s("conflict"));
    assert_eq!(get(&q[0], "key"), get(&audit[10], "key"));
    assert_eq!(get(&q[0], "audit_index"), &n(10));
    assert_eq!(get(&q[2], "payload"), &s("not json at all"));

    let table = run(&["dump-audit", "--db", db_s, "--format", "table"]);
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(text.lines().next().unwrap().starts_with("INDEX"));
    assert_eq!(text.lines().count(), 15);

    // A second ingest of the same feed applies nothing new.
    let again = run(&["ingest", "--db", db_s, feed.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("applied               0"));
    assert_eq!(rows(&run(&["dump-effects", "--db", db_s]).stdout).len(), 8);
}

#[test]
fn ingest_with_a_closed_stderr_still_succeeds_and_closes_the_database_cleanly() {
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("e.redb");
    let mut child = Command::new(super::common::bin())
        .args([
            "ingest",
            "--db",
            db.to_str().unwrap(),
            sample_feed().to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take()); // the reader goes away: writes to stderr now fail (EPIPE)
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{status}");
    let dump = run(&["dump-effects", "--db", db.to_str().unwrap()]);
    assert_eq!(
        dump.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    assert_eq!(rows(&dump.stdout).len(), 8);
}

#[test]
fn a_directory_as_input_is_a_usage_error_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.redb");
    let out = run(&[
        "ingest",
        "--db",
        db.to_str().unwrap(),
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory"));
    assert!(!db.exists());
}

/// Long work shows progress on a terminal and nothing otherwise: `ingest` counts messages and
/// `verify` draws a bar of audit entries under a pseudo-terminal (`script`), while the same
/// commands with stderr on a pipe print exactly their result lines.
#[test]
fn progress_shows_on_a_terminal_only() {
    let dir = tempfile::tempdir().unwrap();
    let feed = dir.path().join("feed.jsonl");
    std::fs::write(&feed, common::generate_feed(7, 60_000).bytes).unwrap();
    let bin = common::bin();
    let on_tty = |db: &Path, args: &str| {
        let out = std::process::Command::new("script")
            .args(["-qfec"])
            .arg(format!("{} {args} --db {}", bin.display(), db.display()))
            .arg("/dev/null")
            .output()
            .expect("script (util-linux) must be installed");
        assert!(out.status.success(), "{args}: {out:?}");
        String::from_utf8_lossy(&out.stdout).replace('\r', "\n")
    };
    let a = dir.path().join("a.redb");
    let text = on_tty(&a, &format!("ingest {}", feed.display()));
    assert!(text.contains("ingesting: "), "{text}");
    assert!(text.contains("messages decided"), "{text}");
    let text = on_tty(&a, "verify");
    assert!(text.contains("verifying ["), "{text}");
    assert!(text.contains("audit entries ("), "{text}");
    assert!(text.contains("verified "), "{text}");

    let b = dir.path().join("b.redb");
    let out = common::run(&[
        "ingest",
        "--db",
        b.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("ingesting"), "{err}");
    // The generated feed reorders (every late position is filled by the end, so none is a
    // gap) but never delivers the positions it still holds back when it ends: those are
    // real upstream gaps, warned before the summary, and nothing else is.
    let (warnings, rest): (Vec<&str>, Vec<&str>) = err
        .lines()
        .partition(|l| !l.starts_with("replay-guard ingest: ") && !l.starts_with("  "));
    assert!(
        warnings
            .iter()
            .all(|l| l.contains("WARN") && l.contains("upstream gap: ")),
        "{err}"
    );
    assert!(rest[0].starts_with("replay-guard ingest: "), "{err}");
    let out = common::run(&["verify", "--db", b.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn csv_text_a_spreadsheet_would_evaluate_is_prefixed_and_jsonl_keeps_it_exact() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.redb");
    let db = db.to_str().unwrap();
    let topic = "=HYPERLINK(\"http://evil.example\",\"open\")";
    let line = common::msg("A", "E1", 0, 1, "{}");
    let out = common::run_with_stdin(
        &["ingest", "--db", db, "--topic", topic, "-"],
        line.as_bytes(),
    );
    assert!(out.status.success(), "{out:?}");
    let csv = run(&["dump-effects", "--db", db, "--format", "csv"]);
    let csv = String::from_utf8(csv.stdout).unwrap();
    assert!(
        csv.contains(",\"'=HYPERLINK(\"\"http://evil.example\"\",\"\"open\"\")\","),
        "{csv}"
    );
    let jsonl = run(&["dump-effects", "--db", db]);
    let rows = rows(&jsonl.stdout);
    assert_eq!(get(&rows[0], "topic"), &Json::String(topic.into()));
}

#[test]
fn a_closed_standard_output_ends_every_listing_with_success() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.redb");
    let db = db.to_str().unwrap();
    let feed = sample_feed();
    assert!(
        run(&["ingest", "--db", db, feed.to_str().unwrap()])
            .status
            .success()
    );
    for args in [
        &["dump-audit", "--db", db][..],
        &["dump-effects", "--db", db, "--format", "csv"],
        &["dump-quarantine", "--db", db, "--format", "table"],
        &["stats", "--db", db],
        &["gaps", "--db", db],
        &["verify", "--db", db],
        &["report", "--db", db, "-o", "-"],
        &["relay", "status", "--db", db],
        &["man"],
        &["completions", "bash"],
    ] {
        // The reader is gone before the command starts: its first write fails with EPIPE.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = std::process::Command::new(common::bin())
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(!stderr.contains("rror"), "{args:?}: {stderr}");
    }
}
