//! `health` through the real binary on real stores: OK on a fresh healthy one; WARNING and
//! CRITICAL from real conditions (a last decision committed long ago, a full window,
//! quarantined deliveries, a lagging sink); UNKNOWN (3) for a store that cannot be read; the
//! line parsed field by field in the monitoring-plugin format; and on PostgreSQL.

use std::path::Path;

use replay_guard::store::postgres::{PgConfig, PgStore};
use replay_guard::store::relay::{RelayStore as _, StartAt};
use replay_guard::store::{Backend, Store, StoreOptions};
use replay_guard::testing;
use replay_guard::timefmt::now_ms;

use crate::common;
use crate::pg::PgDb;

/// One perfdata item: `'label'=value[uom];warn;crit;min;max`.
#[derive(Debug)]
struct Perf {
    label: String,
    value: f64,
    uom: String,
    warn: String,
    crit: String,
}

/// The status line, parsed strictly.
#[derive(Debug)]
struct Status {
    code: i32,
    state: String,
    text: String,
    perf: Vec<Perf>,
}

impl Status {
    fn perf(&self, label: &str) -> &Perf {
        self.perf
            .iter()
            .find(|p| p.label == label)
            .unwrap_or_else(|| panic!("no perfdata {label}: {self:?}"))
    }
}

fn parse_perf(item: &str) -> Perf {
    let (label, rest) = item.rsplit_once('=').unwrap_or_else(|| panic!("{item:?}"));
    let label = label.trim_matches('\'').to_string();
    assert!(!label.is_empty() && !label.contains(' '), "label {label:?}");
    let fields: Vec<&str> = rest.split(';').collect();
    assert!((1..=5).contains(&fields.len()), "{item:?}");
    let value = fields[0];
    let digits = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(value.len());
    let uom = value[digits..].to_string();
    assert!(
        ["", "s", "%", "B"].contains(&uom.as_str()),
        "unit {uom:?} in {item:?}"
    );
    Perf {
        label,
        value: value[..digits]
            .parse()
            .unwrap_or_else(|_| panic!("{item:?}")),
        uom,
        warn: fields.get(1).unwrap_or(&"").to_string(),
        crit: fields.get(2).unwrap_or(&"").to_string(),
    }
}

/// Runs `health ARGS` and checks its state and how its text starts (the worst check leads).
fn expect(args: &[&str], state: &str, text: &str) -> Status {
    let s = health(args);
    assert_eq!(s.state, state, "{s:?}");
    assert!(s.text.starts_with(text), "{}", s.text);
    s
}

/// Runs `health ARGS`: exactly one line on stdout, `REPLAY-GUARD STATE - text | perfdata`,
/// whose state agrees with the exit code.
fn health(args: &[&str]) -> Status {
    let mut all = vec!["health"];
    all.extend_from_slice(args);
    let out = common::run(&all);
    let code = out.status.code().expect("exit code");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.ends_with('\n') && stdout.lines().count() == 1,
        "not one line: {stdout:?}"
    );
    let line = stdout.trim_end();
    let rest = line
        .strip_prefix("REPLAY-GUARD ")
        .unwrap_or_else(|| panic!("{line}"));
    let (state, rest) = rest.split_once(" - ").unwrap_or_else(|| panic!("{line}"));
    let want = match state {
        "OK" => 0,
        "WARNING" => 1,
        "CRITICAL" => 2,
        "UNKNOWN" => 3,
        other => panic!("state {other:?}: {line}"),
    };
    assert_eq!(code, want, "exit code vs {line}");
    let (text, perf) = match rest.split_once(" | ") {
        Some((t, p)) => (t, p.split(' ').map(parse_perf).collect()),
        None => (rest, Vec::new()),
    };
    assert!(!text.contains('|'), "{line}");
    Status {
        code,
        state: state.to_string(),
        text: text.to_string(),
        perf,
    }
}

fn ingest(db: &Path, config: Option<&Path>, lines: &[String]) {
    let db = db.to_str().unwrap();
    let mut args = vec!["ingest", "--db", db];
    if let Some(c) = config {
        args.extend(["--config", c.to_str().unwrap()]);
    }
    args.push("-");
    let out = common::run_with_stdin(&args, (lines.join("\n") + "\n").as_bytes());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn clean(from: u64, to: u64) -> Vec<String> {
    (from..to)
        .map(|i| common::msg("CALFIRE", "E7-AVL", 1, i, "position"))
        .collect()
}

#[test]
fn a_fresh_healthy_store_is_ok_and_the_line_parses() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rg.redb");
    ingest(&db, None, &clean(1, 51));
    let s = health(&["--db", db.to_str().unwrap()]);
    assert_eq!((s.code, s.state.as_str()), (0, "OK"), "{s:?}");
    assert!(s.text.starts_with("last decision "), "{}", s.text);
    let age = s.perf("commit_age");
    assert_eq!(
        (age.uom.as_str(), age.warn.as_str(), age.crit.as_str()),
        ("s", "300", "900")
    );
    assert!(age.value < 60.0, "{age:?}");
    assert_eq!(s.perf("quarantined_1h").value, 0.0);
    assert_eq!(s.perf("window_entries").value, 50.0);
    let fill = s.perf("window_fill");
    assert_eq!((fill.uom.as_str(), fill.value), ("%", 0.0));
    let disk = s.perf("disk_free");
    assert_eq!(
        (disk.warn.as_str(), disk.crit.as_str()),
        ("10.00:", "5.00:")
    );
    assert!(disk.value > 0.0 && disk.value <= 100.0, "{disk:?}");
    // A new store that has decided nothing yet is healthy too.
    let empty = dir.path().join("empty.redb");
    ingest(&empty, None, &[]);
    expect(
        &["--db", empty.to_str().unwrap()],
        "OK",
        "no decision yet, created ",
    );
}

/// A store whose only decisions were committed `ago_ms` before now.
fn decided_long_ago(db: &Path, ago_ms: u64) {
    let then = now_ms() - ago_ms;
    let mut store = Store::open(db, StoreOptions::default(), then).unwrap();
    testing::feed(&mut store, 1..=3, then);
    store.close().unwrap();
}

#[test]
fn an_old_last_decision_is_a_warning_and_older_critical() {
    let dir = tempfile::tempdir().unwrap();
    let (warn, crit) = (dir.path().join("warn.redb"), dir.path().join("crit.redb"));
    decided_long_ago(&warn, 10 * 60_000);
    decided_long_ago(&crit, 20 * 60_000);
    let s = expect(
        &["--db", warn.to_str().unwrap()],
        "WARNING",
        "last decision 10 min ago (WARNING 5m)",
    );
    assert!((600.0..660.0).contains(&s.perf("commit_age").value));
    expect(
        &["--db", crit.to_str().unwrap()],
        "CRITICAL",
        "last decision 20 min ago (CRITICAL 15m)",
    );
    // Thresholds from the flags, `off` included.
    let s = health(&["--db", crit.to_str().unwrap(), "--crit-commit-age", "1h"]);
    assert_eq!(s.state, "WARNING", "{s:?}");
    let s = health(&[
        "--db",
        crit.to_str().unwrap(),
        "--warn-commit-age",
        "off",
        "--crit-commit-age",
        "90m",
    ]);
    assert_eq!(s.state, "OK", "{s:?}");
    assert_eq!(s.perf("commit_age").warn, "");
}

#[test]
fn a_window_near_its_bound_is_a_warning_and_a_full_one_critical() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rg.redb");
    let config = dir.path().join("rg.toml");
    std::fs::write(&config, "[window]\nmax_entries = 10\n").unwrap();
    ingest(&db, Some(&config), &clean(1, 10));
    let args = [
        "--db",
        db.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
    ];
    expect(&args, "WARNING", "window 90% full (9 of 10) (WARNING 80)");
    ingest(&db, Some(&config), &clean(10, 30));
    let s = expect(
        &args,
        "CRITICAL",
        "window 100% full (10 of 10) (CRITICAL 95)",
    );
    assert_eq!(s.perf("window_fill").value, 100.0);
    // Without the config the default bound (1,000,000) applies: the same store is OK.
    assert_eq!(health(&["--db", db.to_str().unwrap()]).state, "OK");
}

#[test]
fn quarantined_deliveries_are_a_warning_and_many_critical() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rg.redb");
    let mut feed = clean(1, 5);
    // Same position, other content: a conflict, quarantined.
    feed.push(common::msg("CALFIRE", "E7-AVL", 1, 2, "corrected"));
    ingest(&db, None, &feed);
    expect(
        &["--db", db.to_str().unwrap()],
        "WARNING",
        "1 quarantined in the last hour (1 held) (WARNING 0)",
    );
    // An operator discards it: nothing waits any more, so nothing warns (before, health
    // stayed WARNING for the rest of the hour).
    let out = common::run(&[
        "quarantine",
        "discard",
        "0",
        "--db",
        db.to_str().unwrap(),
        "--reason",
        "a test edit",
        "--operator",
        "ana",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    expect(&["--db", db.to_str().unwrap()], "OK", "last decision");
    let conflicts: Vec<String> = (0..50)
        .map(|i| common::msg("CALFIRE", "E7-AVL", 1, 3, &format!("edit {i}")))
        .chain(["not json".to_string()])
        .collect();
    ingest(&db, None, &conflicts);
    let s = expect(
        &["--db", db.to_str().unwrap()],
        "CRITICAL",
        "51 quarantined in the last hour (51 held) (CRITICAL 50)",
    );
    assert_eq!(s.perf("quarantine_held").value, 51.0);
}

#[test]
fn a_lagging_sink_is_a_warning_and_a_far_behind_one_critical() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rg.redb");
    ingest(&db, None, &clean(1, 1_002));
    let mut store = Store::open_operator(&db, StoreOptions::default()).unwrap();
    store
        .register_sink("cop", "exec", StartAt::Beginning, now_ms())
        .unwrap();
    let args = ["--db", db.to_str().unwrap()];
    let s = health(&args);
    assert_eq!(s.state, "WARNING", "{s:?}");
    assert!(s.text.starts_with("sink cop 1001 behind ("), "{}", s.text);
    assert!(s.text.contains("(WARNING 1000)"), "{}", s.text);
    assert_eq!(s.perf("relay_lag_cop").value, 1001.0);
    let s = health(&[args[0], args[1], "--crit-relay-lag", "500"]);
    assert_eq!(s.state, "CRITICAL", "{s:?}");
    // Caught up: healthy again.
    store
        .advance_sink("cop", 0, 0, 1_001, &[], now_ms())
        .unwrap();
    let s = health(&args);
    assert_eq!(s.state, "OK", "{s:?}");
    assert_eq!(s.perf("relay_lag_cop").value, 0.0);
    store.close().unwrap();

    // A sink whose oldest undelivered effect is old, however few are behind.
    let old = dir.path().join("old.redb");
    decided_long_ago(&old, 10 * 60_000);
    let mut store = Store::open_operator(&old, StoreOptions::default()).unwrap();
    store
        .register_sink("cop", "exec", StartAt::Beginning, now_ms())
        .unwrap();
    store.close().unwrap();
    let old = old.to_str().unwrap();
    let quiet = ["--warn-commit-age", "off", "--crit-commit-age", "off"];
    let s = expect(
        &[&["--db", old][..], &quiet].concat(),
        "WARNING",
        "sink cop 3 behind (10 min old) (WARNING 5m)",
    );
    assert!((600.0..660.0).contains(&s.perf("relay_age_cop").value));
}

#[test]
fn a_store_that_cannot_be_read_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.redb");
    let garbage = dir.path().join("garbage.redb");
    std::fs::write(&garbage, vec![0x55u8; 8192]).unwrap();
    let empty = dir.path().join("empty.redb");
    std::fs::write(&empty, b"").unwrap();
    let path = |p: &Path| p.to_str().unwrap().to_string();
    for (args, says) in [
        (vec!["--db".to_string(), path(&missing)], "does not exist"),
        (vec!["--db".into(), path(&garbage)], "database damaged"),
        (vec!["--db".into(), path(&empty)], "is empty"),
        (vec!["--db".into(), path(dir.path())], "directory"),
        (vec![], "no database"),
        (
            vec![
                "--db".into(),
                path(&missing),
                "--warn-disk-free".into(),
                "150".into(),
            ],
            "invalid value '150' for '--warn-disk-free <PERCENT>'",
        ),
        (vec!["--bogus".into()], "unexpected argument '--bogus'"),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let s = health(&args);
        assert_eq!(
            (s.code, s.state.as_str()),
            (3, "UNKNOWN"),
            "{args:?}: {s:?}"
        );
        assert!(s.text.contains(says), "{args:?}: {}", s.text);
    }
}

#[test]
fn on_postgres_a_fresh_store_is_ok_an_old_one_critical_and_the_disk_is_left_to_the_server() {
    let db = PgDb::new("health");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pg.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"postgres\"\ndsn = \"{}\"\nschema = \"rg\"\n",
            db.dsn()
        ),
    )
    .unwrap();
    let cfg = PgConfig::parse(&db.dsn(), "rg").unwrap();
    let mut store =
        Backend::Postgres(PgStore::open(cfg, StoreOptions::default(), now_ms()).unwrap());
    testing::feed(&mut store, 1..=5, now_ms());
    let args = ["--config", config.to_str().unwrap()];
    let s = health(&args);
    assert_eq!(s.state, "OK", "{s:?}");
    assert!(
        s.text
            .ends_with("disk not checked (PostgreSQL: watch the server)"),
        "{}",
        s.text
    );
    assert!(s.perf.iter().all(|p| !p.label.starts_with("disk")), "{s:?}");
    assert_eq!(s.perf("window_entries").value, 5.0);
    testing::feed(&mut store, 6..=8, now_ms() - 20 * 60_000);
    store
        .register_sink("cop", "exec", StartAt::Beginning, now_ms())
        .unwrap();
    let s = expect(&args, "CRITICAL", "last decision 20 min ago (CRITICAL 15m)");
    assert_eq!(s.perf("relay_lag_cop").value, 8.0);
    store.close().unwrap();
    // An unreachable server is UNKNOWN.
    std::fs::write(
        &config,
        "[store]\nbackend = \"postgres\"\ndsn = \"host=127.0.0.1 port=1 user=postgres dbname=x connect_timeout=2\"\nschema = \"rg\"\n",
    )
    .unwrap();
    let s = health(&args);
    assert_eq!(s.state, "UNKNOWN", "{s:?}");
}

#[test]
fn the_word_health_in_another_command_line_leaves_its_usage_error_alone() {
    // A topic named `health` once made any usage error print the check's UNKNOWN line.
    for args in [
        &["dump-audit", "--topic", "health", "--bogus"][..],
        &["explain", "--source", "health/x", "--sequence", "nope"],
    ] {
        let out = common::run(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(
            stderr.starts_with("replay-guard: error: ") && !stderr.contains("UNKNOWN"),
            "{args:?}: {stderr}"
        );
    }
    // The check's own usage error stays its UNKNOWN line on stdout, exit 3.
    let s = health(&["--warn-commit-age", "soon"]);
    assert_eq!((s.code, s.state.as_str()), (3, "UNKNOWN"), "{s:?}");
    assert!(
        s.text.contains("'--warn-commit-age <DURATION>'"),
        "{}",
        s.text
    );
}
