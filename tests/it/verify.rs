//! `verify` passes on honest databases built by real `ingest` runs and catches each kind of
//! tampering done to a copy: an edited, deleted, reordered or truncated audit entry, and a
//! deleted effect.

use std::path::{Path, PathBuf};

use redb::{Builder, ConcurrencyMode, ReadableTable};
use replay_guard::store::tables::{AUDIT, AuditRecord, EFFECTS, decode, encode};

use super::common::run;

fn honest_db(dir: &Path) -> PathBuf {
    let db = dir.join("honest.redb");
    let feed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl");
    for _ in 0..2 {
        let out = run(&[
            "ingest",
            "--db",
            db.to_str().unwrap(),
            feed.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(0));
    }
    db
}

/// Copies the database and lets `edit` change it with a raw redb write transaction.
fn tampered(
    dir: &Path,
    honest: &Path,
    name: &str,
    edit: impl FnOnce(&redb::WriteTransaction),
) -> PathBuf {
    let copy = dir.join(format!("{name}.redb"));
    std::fs::copy(honest, &copy).unwrap();
    let db = Builder::new()
        .set_concurrency_mode(ConcurrencyMode::SingleWriter)
        .open(&copy)
        .unwrap();
    let txn = db.begin_write().unwrap();
    edit(&txn);
    txn.commit().unwrap();
    copy
}

fn audit_record(txn: &redb::WriteTransaction, index: u64) -> (Vec<u8>, AuditRecord) {
    let t = txn.open_table(AUDIT).unwrap();
    let bytes = t.get(index).unwrap().unwrap().value().to_vec();
    let rec = decode("audit", index, &bytes).unwrap();
    (bytes, rec)
}

fn verify(db: &Path) -> (Option<i32>, String, String) {
    let out = run(&["verify", "--db", db.to_str().unwrap()]);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn verify_passes_on_an_honest_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = honest_db(dir.path());
    let (code, out, err) = verify(&db);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("28 audit entries, hash chain intact from the first entry; 8 effects"),
        "{out}"
    );
    assert!(out.contains("duplicate=14"), "{out}");
}

#[test]
fn verify_catches_each_kind_of_tampering() {
    let dir = tempfile::tempdir().unwrap();
    let honest = honest_db(dir.path());
    let cases: Vec<(&str, PathBuf, &str)> = vec![
        (
            "edited",
            tampered(dir.path(), &honest, "edited", |txn| {
                let (_, mut rec) = audit_record(txn, 6);
                rec.reason = "nothing to see here".into();
                txn.open_table(AUDIT)
                    .unwrap()
                    .insert(6, encode(&rec).as_slice())
                    .unwrap();
            }),
            "audit entry 6: its hash does not match its content",
        ),
        (
            "deleted",
            tampered(dir.path(), &honest, "deleted", |txn| {
                txn.open_table(AUDIT).unwrap().remove(5).unwrap();
            }),
            "audit entry 6: expected index 5",
        ),
        (
            "reordered",
            tampered(dir.path(), &honest, "reordered", |txn| {
                let (a, _) = audit_record(txn, 3);
                let (b, _) = audit_record(txn, 4);
                let mut t = txn.open_table(AUDIT).unwrap();
                t.insert(3, b.as_slice()).unwrap();
                t.insert(4, a.as_slice()).unwrap();
            }),
            "audit entry 3:",
        ),
        (
            "truncated",
            tampered(dir.path(), &honest, "truncated", |txn| {
                txn.open_table(AUDIT).unwrap().remove(27).unwrap();
            }),
            "entries were removed from the end",
        ),
        (
            "effect-deleted",
            tampered(dir.path(), &honest, "effect-deleted", |txn| {
                txn.open_table(EFFECTS).unwrap().remove(2).unwrap();
            }),
            "audit entry 2: applied but effect 2 does not exist",
        ),
    ];
    for (name, db, want) in cases {
        let (code, _, err) = verify(&db);
        assert_eq!(code, Some(4), "{name}: {err}");
        assert!(err.contains(want), "{name}: {err:?} lacks {want:?}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
    }
}
