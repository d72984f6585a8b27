//! `verify` passes on honest databases built by real `ingest` runs and catches each kind of
//! tampering done to a copy: an edited (decoded and rewritten, or its stored bytes changed in
//! place), deleted, reordered or truncated audit entry, a deleted
//! effect, and a stored effect or quarantine payload edited or damaged in place (which
//! `dump-*` then flag and `quarantine release` names as damage).

use std::path::{Path, PathBuf};

use redb::{Builder, ConcurrencyMode, ReadableTable};
use replay_guard::store::tables::{AUDIT, AuditRecord, EFFECTS, QUARANTINE, Records, SOURCES};

use super::common::run;

fn honest_db(dir: &Path) -> PathBuf {
    let db = dir.join("honest.redb");
    let feed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl");
    for _ in 0..2 {
        ingest(&db, &feed);
    }
    db
}

/// `ingest` of `feed` into `db`, which must succeed.
fn ingest(db: &Path, feed: &Path) {
    let out = run(&[
        "ingest",
        "--db",
        db.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
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
    let bytes = {
        let t = txn.open_table(AUDIT.raw()).unwrap();
        t.get(index).unwrap().unwrap().value().to_vec()
    };
    // Read from the table: an entry may leave its `prev_hash` to the one before it.
    let rec = AUDIT.open_mut(txn).unwrap().get(index).unwrap().unwrap();
    (bytes, rec)
}

fn verify(db: &Path) -> (Option<i32>, String, String) {
    verify_with(db, &[])
}

fn verify_with(db: &Path, extra: &[&str]) -> (Option<i32>, String, String) {
    let mut args = vec!["verify", "--db", db.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = run(&args);
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
        out.contains(
            "28 audit entries, hash chain intact from the first entry; 8 effects each backed by \
             their audit entry and matching its digest"
        ),
        "{out}"
    );
    assert!(
        out.contains("3 quarantine records matching their audit entries"),
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
                AUDIT
                    .open_mut(txn)
                    .unwrap()
                    .put(6, &rec, &mut Vec::new())
                    .unwrap();
            }),
            "audit entry 6: its hash does not match its content",
        ),
        (
            // An entry the writer chained stores no hash (it reads with the hash of its
            // content), and the entries after it, up to a checkpoint, take that hash as
            // their prev_hash: a byte edit of it breaks the next link that is stored, here
            // the chain head, which names the entries it can be in.
            "edited-in-place",
            tampered(dir.path(), &honest, "edited-in-place", |txn| {
                edit_stored(txn, AUDIT, 6, b"ingest", b"INGEST");
            }),
            "audit entry 27: its hash ",
        ),
        (
            // The last entry's link is the database's chain head.
            "last-edited-in-place",
            tampered(dir.path(), &honest, "last-edited-in-place", |txn| {
                edit_stored(txn, AUDIT, 27, b"ingest", b"INGEST");
            }),
            "audit entry 27: its hash ",
        ),
        (
            "deleted",
            tampered(dir.path(), &honest, "deleted", |txn| {
                txn.open_table(AUDIT.raw()).unwrap().remove(5).unwrap();
            }),
            "audit entry 6: entry 5, whose hash it takes as its prev_hash, is missing (damaged)",
        ),
        (
            "reordered",
            tampered(dir.path(), &honest, "reordered", |txn| {
                let (a, _) = audit_record(txn, 3);
                let (b, _) = audit_record(txn, 4);
                let mut t = txn.open_table(AUDIT.raw()).unwrap();
                t.insert(3, b.as_slice()).unwrap();
                t.insert(4, a.as_slice()).unwrap();
            }),
            "audit entry 3:",
        ),
        (
            "truncated",
            tampered(dir.path(), &honest, "truncated", |txn| {
                txn.open_table(AUDIT.raw()).unwrap().remove(27).unwrap();
            }),
            "entries were removed from the end",
        ),
        (
            "effect-deleted",
            tampered(dir.path(), &honest, "effect-deleted", |txn| {
                txn.open_table(EFFECTS.raw()).unwrap().remove(2).unwrap();
            }),
            "audit entry 2: applied but effect 2 does not exist",
        ),
        (
            // Entry 2 made to apply entry 0's position (so its key), its own hash made to
            // match: the chain breaks only after it, and the second application is named.
            "key-applied-twice",
            tampered(dir.path(), &honest, "key-applied-twice", |txn| {
                let (_, first) = audit_record(txn, 0);
                let (_, mut rec) = audit_record(txn, 2);
                assert_ne!(first.key, rec.key);
                rec.agency = first.agency.clone();
                rec.source_id = first.source_id.clone();
                rec.epoch = first.epoch;
                rec.sequence = first.sequence;
                rec.key = first.key;
                rec.hash = replay_guard::store::audit_entry_hash(2, &rec, &rec.prev_hash);
                AUDIT
                    .open_mut(txn)
                    .unwrap()
                    .put(2, &rec, &mut Vec::new())
                    .unwrap();
            }),
            "audit entry 2: key ",
        ),
        (
            // The writer skips the window lookup above a source's mark: a mark lowered under
            // an effect would let a replay of that effect through as new.
            "high-water-lowered",
            tampered(dir.path(), &honest, "high-water-lowered", |txn| {
                let mut t = SOURCES.open_mut(txn).unwrap();
                let all: Vec<_> = t.all().unwrap().map(Result::unwrap).collect();
                let all: Vec<_> = all.into_iter().map(|(no, r)| (no.value(), r)).collect();
                for (no, mut rec) in all {
                    rec.high_water = (0, 0);
                    t.put(no, &rec, &mut Vec::new()).unwrap();
                }
            }),
            "effect 0: its position (epoch 1 sequence 1) lies above its source's high-water mark \
             (epoch 0 sequence 0)",
        ),
    ];
    for (name, db, want) in cases {
        let (code, _, err) = verify(&db);
        assert_eq!(code, Some(4), "{name}: {err}");
        assert!(err.contains(want), "{name}: {err:?} lacks {want:?}");
        if name == "edited-in-place" {
            assert!(
                err.contains(" (an entry from 0 to 27 was edited, or the chain head)"),
                "{name}: {err}"
            );
        }
        if name == "last-edited-in-place" {
            assert!(
                err.contains(" is not the database's chain head "),
                "{name}: {err}"
            );
        }
        if name == "key-applied-twice" {
            assert!(err.contains(" applied a second time"), "{name}: {err}");
        }
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
    }
}

/// Entries chained after the entry before them leave their `prev_hash` to it, and every
/// 32nd entry (a checkpoint) keeps its bytes: an edit in place shows at the next stored link,
/// the next checkpoint or the chain head, which names the entries the edit can be in (back
/// to the last entry that holds its `prev_hash`, as an older build's entries all do).
#[test]
fn an_edit_in_place_shows_at_the_next_checkpoint_naming_the_entries_it_can_be_in() {
    let dir = tempfile::tempdir().unwrap();
    let feed = dir.path().join("feed.jsonl");
    let lines: Vec<String> = (1..=40)
        .map(|q| format!(r#"{{"agency":"fd","source_id":"e1","epoch":1,"sequence":{q},"v":{q}}}"#))
        .collect();
    std::fs::write(&feed, lines.join("\n") + "\n").unwrap();
    let honest = dir.path().join("forty.redb");
    ingest(&honest, &feed);
    assert_eq!(verify(&honest).0, Some(0));
    for (name, index, want) in [
        ("before-a-checkpoint", 6, "audit entry 32: prev_hash "),
        ("after-it", 35, "audit entry 39: its hash "),
    ] {
        let db = tampered(dir.path(), &honest, name, |txn| {
            edit_stored(txn, AUDIT, index, b"ingest", b"INGEST");
        });
        let (code, _, err) = verify(&db);
        assert_eq!(code, Some(4), "{name}: {err}");
        assert!(err.contains(want), "{name}: {err}");
        let span = if index < 32 {
            " (an entry from 0 to 31 was edited, or this prev_hash)"
        } else {
            " (an entry from 32 to 39 was edited, or the chain head)"
        };
        assert!(err.contains(span), "{name}: {err}");
    }
    // A checkpoint made to leave its prev_hash to the entry before (its bit cleared, its
    // bytes cut): it would read in order with whatever hash entry 31 has, so verify
    // refuses it.
    let db = tampered(dir.path(), &honest, "checkpoint-stripped", |txn| {
        let mut t = txn.open_table(AUDIT.raw()).unwrap();
        let mut bytes = t.get(32).unwrap().unwrap().value().to_vec();
        // version, recorded_at_ms (6-byte varint), outcome, then the bits' varint: bit 10
        // (prev_hash stored) is bit 3 of its second byte; the prev_hash is the last field.
        assert_ne!(bytes[9] & 1 << 3, 0, "{bytes:?}");
        bytes[9] &= !(1 << 3);
        bytes.truncate(bytes.len() - 32);
        t.insert(32, bytes.as_slice()).unwrap();
    });
    let (code, _, err) = verify(&db);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("audit entry 32: leaves its prev_hash to the entry before it at a checkpoint"),
        "{err}"
    );

    // Entry 7 stored again holding its hashes, as an older build stored every entry's
    // prev_hash: an edit after it shows at the next checkpoint, naming the entries from it on.
    let db = tampered(dir.path(), &honest, "held", |txn| {
        let (_, rec) = audit_record(txn, 7);
        AUDIT
            .open_mut(txn)
            .unwrap()
            .put(7, &rec, &mut Vec::new())
            .unwrap();
    });
    assert_eq!(verify(&db).0, Some(0));
    let db = tampered(dir.path(), &db, "held-edited", |txn| {
        edit_stored(txn, AUDIT, 20, b"ingest", b"INGEST");
    });
    let (code, _, err) = verify(&db);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("audit entry 32: prev_hash ")
            && err.contains(" (an entry from 7 to 31 was edited, or this prev_hash)"),
        "{err}"
    );
}

/// Replaces `from` with `to` inside the stored bytes of record `key` of `table`, as an edit of
/// the file would: the record is not decoded, so its other fields stay byte for byte.
fn edit_stored(
    txn: &redb::WriteTransaction,
    table: Records<u64, impl Sized>,
    key: u64,
    from: &[u8],
    to: &[u8],
) {
    let mut t = txn.open_table(table.raw()).unwrap();
    let mut bytes = t.get(key).unwrap().unwrap().value().to_vec();
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .unwrap_or_else(|| panic!("{key} lacks {:?}", String::from_utf8_lossy(from)));
    bytes.splice(at..at + from.len(), to.iter().copied());
    t.insert(key, bytes.as_slice()).unwrap();
}

fn output(args: &[&str]) -> (Option<i32>, String, String) {
    let out = run(args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_effect_payload_edited_in_place_fails_verify_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let honest = honest_db(dir.path());
    let db = tampered(dir.path(), &honest, "forged", |txn| {
        edit_stored(txn, EFFECTS, 0, br#""delta":1"#, br#""delta":7"#);
    });
    // Same length: the record still reads, and dump-effects shows the forged value.
    let (code, out, _) = output(&["dump-effects", "--db", db.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert!(
        out.lines().next().unwrap().contains(r#""delta":7"#),
        "{out}"
    );
    let (code, _, err) = verify(&db);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("effect 0: content differs from what audit entry 0 recorded"),
        "{err}"
    );
    assert!(err.contains("damaged or edited"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// The digest an effect holds (record version 3) is what the window compares replays of its
/// position with: one that differs from its audit entry's fails `verify`.
#[test]
fn an_effect_digest_edited_in_place_fails_verify_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let honest = honest_db(dir.path());
    let db = tampered(dir.path(), &honest, "digest", |txn| {
        let mut t = txn.open_table(EFFECTS.raw()).unwrap();
        let bytes = t.get(0).unwrap().unwrap().value().to_vec();
        let mut rec = EFFECTS.decode(&0, &bytes).unwrap();
        let digest = rec.digest.as_mut().expect("a new effect holds its digest");
        digest[0] ^= 1;
        t.insert(0, EFFECTS.encode(&rec).as_slice()).unwrap();
    });
    let (code, _, err) = verify(&db);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("effect 0: its digest differs from what audit entry 0 recorded"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn an_unparseable_effect_payload_fails_verify_and_dump_flags_it() {
    let dir = tempfile::tempdir().unwrap();
    let honest = honest_db(dir.path());
    // One bit flipped: ':' (0x3a) becomes ';' (0x3b).
    let db = tampered(dir.path(), &honest, "flipped", |txn| {
        edit_stored(txn, EFFECTS, 1, br#""unit":"#, br#""unit";"#);
    });
    let (code, _, err) = verify(&db);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("effect 1: stored payload does not decode: invalid JSON at byte"),
        "{err}"
    );
    // Not a contract question: the bytes are damaged whatever the config.
    assert!(!err.contains("--config"), "{err}");

    let d = db.to_str().unwrap();
    let (code, jsonl, _) = output(&["dump-effects", "--db", d]);
    assert_eq!(code, Some(0));
    let lines: Vec<&str> = jsonl.lines().collect();
    assert!(
        lines[1].contains(r#""payload_error":"invalid JSON at byte"#),
        "{}",
        lines[1]
    );
    assert!(
        lines.iter().filter(|l| l.contains("payload_error")).count() == 1,
        "only the damaged record is flagged: {jsonl}"
    );
    for format in ["table", "csv"] {
        let (code, text, _) = output(&["dump-effects", "--db", d, "--format", format]);
        assert_eq!(code, Some(0));
        let row = text.lines().nth(2).unwrap();
        assert!(
            row.contains("[payload damaged: invalid JSON at byte"),
            "{format}: {row}"
        );
        assert_eq!(
            text.matches("payload damaged").count(),
            1,
            "{format}: {text}"
        );
    }
    // `explain` shows the same field. Effect 1 is Engine 7's epoch 3 sequence 40.
    let (code, story, err) = output(&[
        "explain",
        "--db",
        d,
        "--source",
        "CALFIRE/E7-AVL",
        "--epoch",
        "3",
        "--sequence",
        "40",
        "--format",
        "json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        story.contains(r#""payload_error":"invalid JSON at byte"#),
        "{story}"
    );
    // The writer still tells a replay of the applied message: the effect gives no digest (its
    // payload gave it), so the window reads the one its audit entry recorded. The feed a
    // third time decides as the second time did.
    let feed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl");
    let out = run(&["ingest", "--db", d, feed.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let (_, audit, _) = output(&["dump-audit", "--db", d]);
    let outcomes: Vec<&str> = audit
        .lines()
        .map(|l| {
            l.split(r#""outcome":""#)
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
        })
        .collect();
    let third = outcomes.len() / 3;
    assert_eq!(outcomes[third..2 * third], outcomes[2 * third..], "{audit}");
    assert!(outcomes[2 * third..].contains(&"duplicate"), "{audit}");
}

#[test]
fn an_edited_conflict_payload_fails_verify_and_release_names_the_damage() {
    let dir = tempfile::tempdir().unwrap();
    let honest = honest_db(dir.path());
    let db = tampered(dir.path(), &honest, "conflict", |txn| {
        edit_stored(txn, QUARANTINE, 0, br#""delta":5"#, br#""delta":9"#);
    });
    let (code, _, err) = verify(&db);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("quarantine #0: content differs from what audit entry 10 recorded"),
        "{err}"
    );
    let (code, _, err) = output(&[
        "quarantine",
        "release",
        "0",
        "--db",
        db.to_str().unwrap(),
        "--reason",
        "confirmed by radio",
        "--operator",
        "t",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("stored payload does not match the digest audit entry 10 recorded"),
        "{err}"
    );
    assert!(err.contains("damaged or edited"), "{err}");
    assert!(err.contains("--config"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn a_damaged_conflict_payload_is_flagged_by_dump_and_named_by_release() {
    let dir = tempfile::tempdir().unwrap();
    let honest = honest_db(dir.path());
    let db = tampered(dir.path(), &honest, "conflict-flipped", |txn| {
        edit_stored(txn, QUARANTINE, 0, br#""delta":"#, br#""delta";"#);
    });
    let d = db.to_str().unwrap();
    let (_, jsonl, _) = output(&["dump-quarantine", "--db", d]);
    let lines: Vec<&str> = jsonl.lines().collect();
    assert!(
        lines[0].contains(r#""payload_error":"invalid JSON"#),
        "{jsonl}"
    );
    // Malformed records are not JSON by nature: not flagged.
    assert_eq!(jsonl.matches("payload_error").count(), 1, "{jsonl}");
    let (_, table, _) = output(&["dump-quarantine", "--db", d, "--format", "table"]);
    assert!(table.contains("[payload damaged: invalid JSON"), "{table}");
    let (code, _, err) = verify(&db);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("quarantine #0: stored payload does not decode"),
        "{err}"
    );
    let (code, _, err) = output(&[
        "quarantine",
        "release",
        "0",
        "--db",
        d,
        "--reason",
        "r",
        "--operator",
        "t",
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("stored payload is damaged or was edited"),
        "{err}"
    );
}

#[test]
fn an_edited_malformed_payload_fails_verify_against_its_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let honest = honest_db(dir.path());
    let db = tampered(dir.path(), &honest, "malformed", |txn| {
        edit_stored(txn, QUARANTINE, 2, b"not json", b"NOT JSON");
    });
    let (code, _, err) = verify(&db);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(
            "quarantine #2: stored payload differs from the fingerprint taken when it was \
             quarantined"
        ),
        "{err}"
    );
}

#[test]
fn verify_under_another_feed_contract_says_so_and_fails() {
    let dir = tempfile::tempdir().unwrap();
    let honest = honest_db(dir.path());
    let cfg = dir.path().join("other.toml");
    std::fs::write(&cfg, "[feed]\ndigest_ignore = [\"/delta\"]\n").unwrap();
    let (code, _, err) = verify_with(&honest, &["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("effect 0: content differs from what audit entry 0 recorded")
            && err.contains("under this feed contract")
            && err.contains("pass its --config"),
        "{err}"
    );
}

#[test]
fn verify_passes_after_releases_discards_and_late_effects() {
    let dir = tempfile::tempdir().unwrap();
    let db = honest_db(dir.path());
    let d = db.to_str().unwrap();
    for (action, id) in [("release", "0"), ("discard", "2")] {
        let (code, _, err) = output(&[
            "quarantine",
            action,
            id,
            "--db",
            d,
            "--reason",
            "checked",
            "--operator",
            "t",
        ]);
        assert_eq!(code, Some(0), "{action}: {err}");
    }
    let (code, out, err) = verify(&db);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("9 effects each backed by their audit entry and matching its digest")
            && out.contains("1 quarantine records matching")
            && out.contains("applied_late=1 ")
            && out.contains("released=1 discarded=1"),
        "{out}"
    );
}

#[test]
fn effects_whose_audit_entry_was_pruned_are_still_checked_where_provable() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("pruned.redb");
    let cfg = dir.path().join("rg.toml");
    std::fs::write(
        &cfg,
        "[commit]\nmax_batch = 1\n[retention]\naudit_max_entries = 4\n",
    )
    .unwrap();
    // Effects 0..=5, then a replay of effect 0's message: its `duplicate` entry is kept after
    // the applying entries 0..=5 are pruned.
    let mut feed = String::new();
    for seq in 1..=6 {
        feed.push_str(&super::common::msg(
            "A",
            "S",
            0,
            seq,
            &format!("body-{seq}"),
        ));
        feed.push('\n');
    }
    feed.push_str(&super::common::msg("A", "S", 0, 1, "body-1"));
    feed.push('\n');
    let out = super::common::run_with_stdin(
        &[
            "ingest",
            "--config",
            cfg.to_str().unwrap(),
            "--db",
            db.to_str().unwrap(),
            "-",
        ],
        feed.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let (code, out, err) = verify(&db);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("entries before #3 were pruned"), "{out}");

    // Effect 0's applying entry is gone, but the retained duplicate records its digest.
    let forged = tampered(dir.path(), &db, "dup-backed", |txn| {
        edit_stored(txn, EFFECTS, 0, b"body-1", b"body-X");
    });
    let (code, _, err) = verify(&forged);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(
            "audit entry 6: duplicate of effect 0, whose content differs from what this \
             duplicate entry recorded"
        ),
        "{err}"
    );
    // Effect 1 has no retained entry at all: the payload must still name the record's key.
    let moved = tampered(dir.path(), &db, "moved", |txn| {
        edit_stored(txn, EFFECTS, 1, br#""sequence":2"#, br#""sequence":9"#);
    });
    let (code, _, err) = verify(&moved);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains("effect 1: stored payload decodes to key",)
            && err.contains("not the key the effect record holds (its audit entry was pruned)"),
        "{err}"
    );
    // Its content edited under the same key: under the default contract the effect reads its
    // digest from its payload (effect record version 4), so nothing outside the edited bytes
    // recorded the old content: `verify` proves the key only (docs/src/limitations.md).
    let edited = tampered(dir.path(), &db, "edited", |txn| {
        edit_stored(txn, EFFECTS, 1, b"body-2", b"body-Y");
    });
    let (code, _, err) = verify(&edited);
    assert_eq!(code, Some(0), "{err}");
    // Under `digest_ignore` the effect holds its digest's bytes, which the edit contradicts.
    let ignoring = dir.path().join("ignoring.toml");
    std::fs::write(
        &ignoring,
        "[commit]\nmax_batch = 1\n[retention]\naudit_max_entries = 4\n\
         [feed]\ndigest_ignore = [\"/epoch\"]\n",
    )
    .unwrap();
    let kept = dir.path().join("kept.redb");
    let out = super::common::run_with_stdin(
        &[
            "ingest",
            "--config",
            ignoring.to_str().unwrap(),
            "--db",
            kept.to_str().unwrap(),
            "-",
        ],
        feed.as_bytes(),
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let edited = tampered(dir.path(), &kept, "edited-kept", |txn| {
        edit_stored(txn, EFFECTS, 1, b"body-2", b"body-Y");
    });
    let (code, _, err) = verify_with(&edited, &["--config", ignoring.to_str().unwrap()]);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(
            "effect 1: content differs from what the effect record holds (its audit entry was \
             pruned)"
        ),
        "{err}"
    );
}

#[test]
fn lowered_admission_limits_neither_fail_verify_nor_block_a_release() {
    // Every line of the example feed is over 40 bytes: under the lowered limit each stored
    // record would be refused on admission, yet its key and digest are what they were.
    let dir = tempfile::tempdir().unwrap();
    let db = honest_db(dir.path());
    let cfg = dir.path().join("lowered.toml");
    std::fs::write(&cfg, "[feed]\nmax_payload_bytes = 40\nmax_depth = 1\n").unwrap();
    let cfg = cfg.to_str().unwrap();
    let (code, out, err) = verify_with(&db, &["--config", cfg]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = output(&[
        "quarantine",
        "release",
        "0",
        "--db",
        db.to_str().unwrap(),
        "--config",
        cfg,
        "--reason",
        "checked",
        "--operator",
        "t",
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = verify_with(&db, &["--config", cfg]);
    assert_eq!(code, Some(0), "{out}{err}");
}
