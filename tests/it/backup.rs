//! `backup` while `run` consumes a surge from a real Mosquitto: every backup taken mid-surge
//! verifies, holds a prefix of the live record (its chain head is the live entry at its last
//! index, and every entry before it is the live one), and restores (a feed replayed into it
//! applies each event once); `run` is not disturbed (every event applied exactly once, clean
//! stop). Also what it refuses: an existing file, a leftover `.partial`, a PostgreSQL store.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use replay_guard::store::{Reader, StoreError};

use crate::broker::Broker;
use crate::common;
use crate::pg::PgDb;
use crate::service::{Consumer, events};

/// Events published in the surge.
const SURGE: u64 = 6_000;

/// Every audit entry's hash, in index order.
fn audit_hashes(db: &Path) -> Vec<[u8; 32]> {
    let snap = Reader::open(db).unwrap().begin().unwrap();
    let mut out = Vec::new();
    snap.scan_audit::<StoreError>(0, |e| {
        assert_eq!(e.index, out.len() as u64);
        out.push(e.record.hash);
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    out
}

fn applied_once(db: &Path) -> HashSet<(String, u64)> {
    let mut seen = HashSet::new();
    for e in common::effects(db) {
        let k = (e.record.source_id.clone(), e.record.sequence);
        assert!(
            seen.insert(k.clone()),
            "{}: {k:?} applied twice",
            db.display()
        );
    }
    seen
}

fn backup(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["backup"];
    all.extend_from_slice(args);
    let out = common::run(&all);
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn backups_taken_mid_surge_verify_hold_a_prefix_of_the_record_and_restore() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let mut c = Consumer::new(dir.path(), &[broker.url()], "v5", "rg-backup");
    c.start();
    c.wait_subscribed();
    let publisher = {
        let port = broker.port;
        std::thread::spawn(move || {
            let b = Broker::attach(port);
            for chunk in events(0, SURGE).chunks(500) {
                b.publish_lines("incidents/ca", chunk, "pub-backup");
            }
        })
    };
    c.wait_decided(1, Duration::from_secs(30));
    let config = c.config.to_str().unwrap().to_string();
    let mut backups: Vec<(PathBuf, u64)> = Vec::new();
    let start = Instant::now();
    while backups.len() < 8 && c.decided().unwrap_or(0) < SURGE {
        let to = dir.path().join(format!("backup-{}.redb", backups.len()));
        let (code, out, err) = backup(&["--config", &config, "--to", to.to_str().unwrap()]);
        assert_eq!(code, 0, "backup mid-surge: {err}");
        assert!(out.starts_with("backed up "), "{out}");
        assert!(out.contains("; verified: hash chain intact"), "{out}");
        assert!(
            !dir.path()
                .join(format!("backup-{}.redb.partial", backups.len()))
                .exists()
        );
        let n = Reader::open(&to)
            .unwrap()
            .begin()
            .unwrap()
            .meta()
            .unwrap()
            .next_audit;
        backups.push((to, n));
        assert!(start.elapsed() < Duration::from_secs(120), "surge too slow");
    }
    publisher.join().unwrap();
    c.wait_decided(SURGE, Duration::from_secs(120));
    assert_eq!(c.stop(Duration::from_secs(20)), Some(0), "{}", c.log_text());

    let mid: Vec<u64> = backups
        .iter()
        .map(|(_, n)| *n)
        .filter(|n| *n > 0 && *n < SURGE)
        .collect();
    assert!(
        mid.len() >= 2,
        "fewer than two backups landed mid-surge: {backups:?}"
    );
    let want: HashSet<(String, u64)> = (0..SURGE).map(|i| (format!("E{}", i % 7), i)).collect();
    assert_eq!(applied_once(&c.db), want, "run was disturbed");
    let live = audit_hashes(&c.db);
    for (path, n) in &backups {
        let out = common::run(&["verify", "--db", path.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let snap = Reader::open(path).unwrap().begin().unwrap();
        let meta = snap.meta().unwrap();
        if *n > 0 {
            assert_eq!(
                meta.chain_head,
                live[*n as usize - 1],
                "{}: chain head is not the live entry #{}",
                path.display(),
                n - 1
            );
        }
        assert_eq!(
            audit_hashes(path),
            live[..*n as usize],
            "{}: not a prefix of the live record",
            path.display()
        );
        assert_eq!(snap.summary().unwrap().effects, meta.next_effect);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{}", path.display());
    }

    // Restore: the first mid-surge backup, fed the whole surge again (as the broker would
    // redeliver after a restore), applies each event once.
    let (restored, _) = backups.iter().find(|(_, n)| *n > 0 && *n < SURGE).unwrap();
    let lines = events(0, SURGE).join("\n") + "\n";
    let out = common::run_with_stdin(
        &["ingest", "--db", restored.to_str().unwrap(), "-"],
        lines.as_bytes(),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(applied_once(restored), want, "the restored database");
}

#[test]
fn backup_refuses_an_existing_file_a_leftover_partial_and_a_postgres_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rg.redb");
    let out = common::run_with_stdin(
        &["ingest", "--db", db.to_str().unwrap(), "-"],
        (events(0, 50).join("\n") + "\n").as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0));
    let db = db.to_str().unwrap();

    let existing = dir.path().join("existing.redb");
    std::fs::write(&existing, b"keep me").unwrap();
    let (code, _, err) = backup(&["--db", db, "--to", existing.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("already exists: a backup never replaces a file"),
        "{err}"
    );
    assert_eq!(std::fs::read(&existing).unwrap(), b"keep me");

    let to = dir.path().join("b.redb");
    let partial = dir.path().join("b.redb.partial");
    std::fs::write(&partial, b"").unwrap();
    let (code, _, err) = backup(&["--db", db, "--to", to.to_str().unwrap()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("b.redb.partial exists"), "{err}");
    assert!(!to.exists());
    std::fs::remove_file(&partial).unwrap();
    let (code, out, err) = backup(&["--db", db, "--to", to.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(": 50 audit entries (chain head "), "{out}");
    assert!(
        out.contains(", 50 effects, 50 window entries, 0 quarantined, 7 sources"),
        "{out}"
    );

    let missing = dir.path().join("missing.redb");
    let (code, _, err) = backup(&[
        "--db",
        missing.to_str().unwrap(),
        "--to",
        dir.path().join("c.redb").to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(!dir.path().join("c.redb.partial").exists());

    let pg = PgDb::new("backup");
    let config = dir.path().join("pg.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"postgres\"\ndsn = \"{}\"\nschema = \"eoc\"\n",
            pg.dsn()
        ),
    )
    .unwrap();
    let (code, _, err) = backup(&[
        "--config",
        config.to_str().unwrap(),
        "--to",
        dir.path().join("pg.redb").to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("pg_dump --schema=eoc"), "{err}");
}
