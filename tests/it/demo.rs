//! `replay-guard demo` as a newcomer runs it: the real failover replay on in-process brokers,
//! exit 0 only when exactly-once held, a database that `verify` and `stats` confirm.

use replay_guard::json::{self, Json, Pointer};

use super::common;

#[test]
fn demo_shows_the_damage_and_the_fix_and_checks_itself() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("demo.redb");
    let dbs = db.to_str().unwrap();
    let out = common::run(&["demo", "--seed", "2", "--messages", "400", "--db", dbs]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains('\u{1b}'), "colour on a pipe: {stdout}");
    let row = |label: &str| -> Vec<String> {
        let line = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} row in:\n{stdout}"));
        line[line.find(label).unwrap() + label.len()..]
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(row("casualties, Structure fire, 1200 Oak St"), ["6", "3"]);
    assert_eq!(row("Engine 7"), ["assigned", "available"]);
    assert_eq!(row("operational period"), ["2", "2"]);
    let surge = 4 + (400 - 10) * 5 / 10;
    assert_eq!(
        row("messages applied"),
        [(400 + surge).to_string(), "400".to_string()]
    );
    assert!(
        stdout.contains(&format!(
            "exactly-once held: 400 events, each applied once; {surge} replayed deliveries suppressed"
        )),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("replay-guard verify --db {dbs}")));

    // The kept database says the same.
    let verify = common::run(&["verify", "--db", dbs]);
    assert_eq!(verify.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&verify.stdout).contains(&format!(
        "applied=400 applied_late=0 duplicate={surge} conflict=0 stale=0 malformed=0"
    )));
    let stats = common::run(&["stats", "--format", "json", "--db", dbs]);
    let stats = json::parse(&stats.stdout, 16).unwrap();
    let bursts = stats
        .pointer(&Pointer::parse("/replay_bursts").unwrap())
        .unwrap();
    let Json::Array(bursts) = bursts else {
        panic!("{bursts:?}")
    };
    assert_eq!(bursts.len(), 1);
    assert_eq!(
        bursts[0].pointer(&Pointer::parse("/duplicates").unwrap()),
        Some(&Json::Number(surge.to_string()))
    );

    // It never reuses a database: its self-check needs a fresh one.
    let again = common::run(&["demo", "--db", dbs]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
}

#[test]
fn demo_is_reproducible_for_a_seed() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, seed: &str| {
        let db = dir.path().join(name);
        let out = common::run(&[
            "demo",
            "--seed",
            seed,
            "--messages",
            "120",
            "--db",
            db.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(0));
        common::effects(&db)
            .into_iter()
            .map(|e| e.record.payload)
            .collect::<Vec<_>>()
    };
    let a = run("a.redb", "7");
    assert_eq!(a.len(), 120);
    assert_eq!(a, run("b.redb", "7"));
    assert_ne!(a, run("c.redb", "8"));
}
