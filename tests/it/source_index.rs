//! The audit log's source index (`AUDIT_SOURCES`, schema version 3) through the real binary:
//! `gaps --source` (which reads the index) prints exactly what the scan of the whole log
//! (`gaps` without `--source`) prints for that source, across index blocks, with two sources
//! interleaved and after retention cut into a block; `verify` checks the index, catches a
//! missing, stray, misplaced or wrong row, and accepts a row under its block's unnumbered
//! bucket (which the lookup reads, checking the entry's names); a file of schema version 2
//! is read by a scan until the next writer builds the index; on PostgreSQL the same through
//! `migrate --from`, ingest and retention.

use std::path::{Path, PathBuf};

use replay_guard::store::index_merge::for_each_packed;
use replay_guard::store::tables::{
    ALL_SEGMENTS, AUDIT_KEY_BLOCK, AUDIT_SOURCES, AUDIT_SOURCES_PACKED, META, SCHEMA_VERSION,
    SourceRow, UNNUMBERED,
};

use crate::common::msg;
use crate::key_index::{
    DROP_INDEXES_ACROSS_BLOCKS, first_index, indexes_across_blocks, ok, pg_store, retaining_5000,
    run,
};

/// Source e1 (epoch 1, sequences 1..=6,000 but 100..=149 and 5,000) interleaved with e2
/// (epoch 1, 1..=2,000, then epoch 2, 1..=2,000 but 777), three index blocks' worth; a
/// duplicate and a conflict of e1 and a malformed line (no position) among them.
pub(crate) fn feed(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for i in 1..=6_000u64 {
        if !(100..=149).contains(&i) && i != 5_000 {
            text.push_str(&(msg("fd", "e1", 1, i, &format!("e1 {i}")) + "\n"));
        }
        if i <= 4_000 {
            let (epoch, q) = if i <= 2_000 { (1, i) } else { (2, i - 2_000) };
            if !(epoch == 2 && q == 777) {
                text.push_str(&(msg("fd", "e2", epoch, q, &format!("e2 {i}")) + "\n"));
            }
        }
        match i {
            3_000 => text.push_str("{not json\n"),
            4_500 => text.push_str(&(msg("fd", "e1", 1, 2, "other") + "\n")),
            5_500 => text.push_str(&(msg("fd", "e1", 1, 1, "e1 1") + "\n")),
            _ => {}
        }
    }
    let path = dir.join("feed.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

/// Entries of the feed with a source and a position (all but the malformed line).
const POSITIONED: u64 = 5_949 + 3_999 + 2;

/// `gaps --format table` of one source (read from the index), and the lines of the whole
/// log's `gaps` (a scan) that are that source's.
pub(crate) fn gaps_both(store: &[&str], source: &str) -> (Vec<String>, Vec<String>) {
    let table = ["--format", "table"];
    let one = [&["gaps"][..], store, &table, &["--source", source]].concat();
    let all = [&["gaps"][..], store, &table].concat();
    let (agency, id) = source.split_once('/').unwrap();
    let lines = |out: String| -> Vec<String> { out.lines().map(str::to_string).collect() };
    let of_source = |l: &String| {
        let mut words = l.split_whitespace();
        l.starts_with(&format!("# {source} "))
            || (words.next() == Some(agency) && words.next() == Some(id))
    };
    let indexed = lines(ok(&one));
    let scanned: Vec<String> = lines(ok(&all)).into_iter().filter(of_source).collect();
    // The header, then the source's lines.
    (indexed.into_iter().skip(1).collect(), scanned)
}

/// `gaps --source` agrees with the scan for each source; returns e1's lines.
pub(crate) fn gaps_agree(store: &[&str]) -> Vec<String> {
    let (e1, scanned) = gaps_both(store, "fd/e1");
    assert_eq!(e1, scanned, "fd/e1");
    for source in ["fd/e2", "fd/e3", "nobody/never"] {
        let (indexed, scanned) = gaps_both(store, source);
        assert_eq!(indexed, scanned, "{source}");
    }
    e1
}

pub(crate) fn source_index_line(verified: &str) -> Option<&str> {
    verified.lines().find(|l| l.starts_with("source index:"))
}

/// Every row of the source index, in order.
pub(crate) fn source_rows(db: &Path) -> Vec<SourceRow> {
    use redb::{ReadableDatabase as _, ReadableTable as _};
    let rdb = redb::Database::open(db).unwrap();
    let txn = rdb.begin_read().unwrap();
    let t = txn.open_table(AUDIT_SOURCES).unwrap();
    let mut rows: Vec<SourceRow> = t
        .iter()
        .unwrap()
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.value(), v.value())
        })
        .collect();
    if let Ok(packed) = txn.open_table(AUDIT_SOURCES_PACKED) {
        for_each_packed::<(u64, u64)>(&packed, ALL_SEGMENTS, &mut |k, v| {
            rows.push((k, v));
            Ok(())
        })
        .unwrap();
    }
    rows.sort_unstable();
    rows
}

/// Takes a file back to schema version 2: no source index, meta version 2.
fn downgrade_to_2(db: &Path) {
    let rdb = redb::Database::create(db).unwrap();
    let txn = rdb.begin_write().unwrap();
    assert!(txn.delete_table(AUDIT_SOURCES).unwrap());
    crate::key_index::set_schema_version(&txn, SCHEMA_VERSION, 2);
    txn.commit().unwrap();
}

#[test]
fn gaps_of_one_source_reads_the_index_across_blocks_and_after_retention_cut_into_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.redb");
    let s = db.to_str().unwrap();
    ok(&["ingest", "--db", s, feed(dir.path()).to_str().unwrap()]);
    let store = ["--db", s];
    let e1 = gaps_agree(&store);
    assert_eq!(e1.len(), 3, "{e1:?}");
    assert!(
        e1[0]
            .split_whitespace()
            .eq(["fd", "e1", "1", "1", "6000", "100", "149", "50"])
    );
    assert!(
        e1[1]
            .split_whitespace()
            .eq(["fd", "e1", "1", "1", "6000", "5000", "5000", "1"])
    );
    assert_eq!(
        e1[2],
        "# fd/e1 epoch 1: sequences 1..6000, 5949 seen, 51 missing in 2 gaps"
    );
    let (e2, _) = gaps_both(&store, "fd/e2");
    assert_eq!(
        e2.iter().filter(|l| l.starts_with('#')).count(),
        2,
        "two epochs: {e2:?}"
    );
    let rows = source_rows(&db);
    assert_eq!(rows.len() as u64, POSITIONED);
    assert!(
        rows.iter().any(|((b, _), _)| b >> 32 == 2),
        "three blocks' worth"
    );
    let verified = ok(&["verify", "--db", s]);
    assert_eq!(
        source_index_line(&verified),
        Some(format!("source index: each of the {POSITIONED} audit entries with a source and a position found under its source, no other row").as_str()),
        "{verified}"
    );

    // Retention down to the newest 5,000 entries: block 0 goes whole, block 1 is cut into.
    let cfg = dir.path().join("retain.toml");
    std::fs::write(
        &cfg,
        "[retention]\naudit_max_entries = 5000\n[commit]\nmax_batch = 1\n",
    )
    .unwrap();
    let three = dir.path().join("three.jsonl");
    let lines: String = (1..=3).map(|q| msg("fd", "e3", 1, q, "x") + "\n").collect();
    std::fs::write(&three, lines).unwrap();
    let cfg = cfg.to_str().unwrap();
    ok(&[
        "ingest",
        "--db",
        s,
        "--config",
        cfg,
        three.to_str().unwrap(),
    ]);
    let first_kept = first_index(&store);
    assert!(
        first_kept > AUDIT_KEY_BLOCK && !first_kept.is_multiple_of(AUDIT_KEY_BLOCK),
        "block 0 pruned whole, block 1 cut into: {first_kept}"
    );
    let e1 = gaps_agree(&store);
    // The kept duplicate of sequence 1 and conflict of 2 still count as seen: the pruned
    // entries between show as a gap (as the scan shows them).
    assert!(
        e1.last().unwrap().contains(", 3499 seen,"),
        "the pruned entries of e1 are not counted: {e1:?}"
    );
    let rows = source_rows(&db);
    assert!(
        rows.iter()
            .all(|((b, _), _)| b >> 32 >= first_kept / AUDIT_KEY_BLOCK),
        "whole pruned blocks leave the index"
    );
    assert!(
        rows.iter().any(|&((_, i), _)| i < first_kept),
        "rows of the block retention cut into stay until it goes (and are not counted)"
    );
    assert!(source_index_line(&ok(&["verify", "--db", s])).is_some());
}

#[test]
fn verify_checks_the_source_index_and_accepts_a_row_under_its_unnumbered_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.redb");
    ok(&[
        "ingest",
        "--db",
        db.to_str().unwrap(),
        feed(dir.path()).to_str().unwrap(),
    ]);
    let rows = source_rows(&db);
    type Rows<'t> = redb::Table<'t, (u64, u64), (u64, u64)>;
    let edited = |name: &str, edit: &dyn Fn(&mut Rows)| {
        let copy = dir.path().join(name);
        std::fs::copy(&db, &copy).unwrap();
        let rdb = redb::Database::create(&copy).unwrap();
        let txn = rdb.begin_write().unwrap();
        edit(&mut txn.open_table(AUDIT_SOURCES).unwrap());
        txn.commit().unwrap();
        drop(rdb);
        copy
    };
    let verify = |copy: &Path| run(&["verify", "--db", copy.to_str().unwrap()]);
    let ((bucket, index), (epoch, sequence)) = rows[rows.len() / 2];
    let fails = |name: &str, edit: &dyn Fn(&mut Rows), says: &str| {
        let (code, _, err) = verify(&edited(name, edit));
        assert_eq!(code, Some(4), "{name}: {err}");
        assert!(err.contains(says), "{name}: {err}");
    };
    fails(
        "missing.redb",
        &|t| {
            t.remove((bucket, index)).unwrap();
        },
        &format!("audit entry {index}: missing from the source index"),
    );
    let stray = format!("the source index has a row for audit entry {index}");
    fails(
        "position.redb",
        &|t| {
            t.insert((bucket, index), (epoch, sequence + 1)).unwrap();
        },
        &stray,
    );
    fails(
        "other-source.redb",
        &|t| {
            t.remove((bucket, index)).unwrap();
            t.insert((bucket ^ 1, index), (epoch, sequence)).unwrap();
        },
        &stray,
    );
    fails(
        "twice.redb",
        &|t| {
            t.insert((bucket ^ 1, index), (epoch, sequence)).unwrap();
        },
        &stray,
    );
    let beyond = 100 * AUDIT_KEY_BLOCK;
    fails(
        "beyond.redb",
        &|t| {
            t.insert((100 << 32, beyond), (1, 1)).unwrap();
        },
        &format!("the source index has a row for audit entry {beyond}"),
    );
    fails(
        "beyond-unnumbered.redb",
        &|t| {
            t.insert((UNNUMBERED | 100, beyond), (1, 1)).unwrap();
        },
        &format!("the source index has a row for audit entry {beyond}"),
    );

    // Every row of block 1 moved to its unnumbered bucket: the lookup checks their
    // entries' names (e1 and e2 share the bucket) and finds the same positions.
    let moved = edited("unnumbered.redb", &|t| {
        for (k, v) in rows.iter().filter(|((b, _), _)| b >> 32 == 1) {
            t.remove(*k).unwrap();
            t.insert((UNNUMBERED | 1, k.1), *v).unwrap();
        }
    });
    let (code, out, err) = verify(&moved);
    assert_eq!(code, Some(0), "{err}");
    assert!(source_index_line(&out).is_some(), "{out}");
    let m = moved.to_str().unwrap();
    assert!(
        source_rows(&moved)
            .iter()
            .filter(|((b, _), _)| *b == UNNUMBERED | 1)
            .count()
            > 4_000
    );
    let e1 = gaps_agree(&["--db", m]);
    let s = db.to_str().unwrap();
    assert_eq!(
        e1,
        gaps_agree(&["--db", s]),
        "the same as from the numbered rows"
    );
    let e2 = |store: &str| gaps_both(&["--db", store], "fd/e2").0;
    assert_eq!(e2(m), e2(s));
}

#[test]
fn a_file_of_schema_version_2_is_read_by_a_scan_until_a_writer_builds_its_source_index() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.redb");
    let s = db.to_str().unwrap();
    ok(&["ingest", "--db", s, feed(dir.path()).to_str().unwrap()]);
    let store = ["--db", s];
    let want_rows = source_rows(&db);
    let want = gaps_agree(&store);
    downgrade_to_2(&db);
    assert_eq!(gaps_agree(&store), want, "scanned");
    let verified = ok(&["verify", "--db", s]);
    assert_eq!(source_index_line(&verified), None, "{verified}");
    assert!(verified.contains("key index:"), "{verified}");
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    ok(&["ingest", "--db", s, empty.to_str().unwrap()]);
    assert_eq!(
        source_rows(&db),
        want_rows,
        "the upgrade builds the same rows"
    );
    assert_eq!(gaps_agree(&store), want);
    assert!(source_index_line(&ok(&["verify", "--db", s])).is_some());
}

#[test]
fn on_postgresql_the_source_index_is_built_by_migrate_kept_by_ingest_and_pruned_by_retention() {
    let dir = tempfile::tempdir().unwrap();
    let (pg, cfg, base) = pg_store("source_index", dir.path());
    let cfg = cfg.as_str();
    // A file of version 2 copied in: the copy is upgraded in the same transaction.
    let db = dir.path().join("s.redb");
    let file = db.to_str().unwrap();
    let feed = feed(dir.path());
    ok(&["ingest", "--db", file, feed.to_str().unwrap()]);
    downgrade_to_2(&db);
    ok(&["migrate", "--from", file, "--config", cfg]);
    assert_eq!(
        pg.sql("SELECT count(*) FROM replay_guard.audit_sources"),
        POSITIONED.to_string()
    );
    let store = ["--config", cfg];
    let on_pg = gaps_agree(&store);
    assert_eq!(on_pg, gaps_agree(&["--db", file]));
    // A schema of version 4 (no index across blocks) is read by a probe per block.
    pg.sql(&format!(
        "{DROP_INDEXES_ACROSS_BLOCKS}; UPDATE replay_guard.schema_version SET version = 4"
    ));
    assert_eq!(gaps_agree(&store), on_pg);
    let verified = ok(&["verify", "--config", cfg]);
    assert!(
        source_index_line(&verified)
            .is_some_and(|l| l.contains(&format!("each of the {POSITIONED} "))),
        "{verified}"
    );

    // Ingest writes each entry's row in its statement; retention removes whole blocks.
    let retain = retaining_5000(dir.path(), &base);
    let more = dir.path().join("more.jsonl");
    let lines: String = (6_001..=12_000)
        .map(|q| msg("fd", "e1", 1, q, "x") + "\n")
        .collect();
    std::fs::write(&more, lines).unwrap();
    ok(&["ingest", "--config", &retain, more.to_str().unwrap()]);
    assert_eq!(
        indexes_across_blocks(&pg),
        "2",
        "the writer takes the schema to version 5"
    );
    let first_kept = first_index(&store);
    assert!(first_kept > AUDIT_KEY_BLOCK, "{first_kept}");
    let e1 = gaps_agree(&store);
    assert!(
        e1.last().unwrap().ends_with("seen, no gaps") && e1.len() == 1,
        "the kept entries of e1 have no gap: {e1:?}"
    );
    let verified = ok(&["verify", "--config", cfg]);
    assert!(verified.contains("retention anchor"), "{verified}");
    assert!(source_index_line(&verified).is_some(), "{verified}");
    let below = pg.sql(&format!(
        "SELECT count(*) FROM replay_guard.audit_sources WHERE audit_index < {}",
        first_kept / AUDIT_KEY_BLOCK * AUDIT_KEY_BLOCK
    ));
    assert_eq!(below, "0", "whole pruned blocks leave the index");
}

#[test]
fn a_discarded_message_of_a_source_never_applied_is_counted_through_its_unnumbered_bucket() {
    // Too deep for `[feed] max_depth = 2`: quarantined malformed (no position). `quarantine
    // discard` decodes it again without the admission limits: its entry has a source and a
    // position, and the source no number (nothing of it was ever applied).
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.redb");
    let s = db.to_str().unwrap();
    let cfg = dir.path().join("deep.toml");
    std::fs::write(&cfg, "[feed]\nmax_depth = 2\n").unwrap();
    let input = dir.path().join("deep.jsonl");
    let deep = r#"{"agency":"fd","source_id":"deep","epoch":4,"sequence":9,"v":{"a":{"b":1}}}"#;
    std::fs::write(&input, format!("{}\n{deep}\n", msg("fd", "e1", 1, 1, "x"))).unwrap();
    ok(&[
        "ingest",
        "--db",
        s,
        "--config",
        cfg.to_str().unwrap(),
        input.to_str().unwrap(),
    ]);
    let store = ["--db", s];
    assert_eq!(gaps_both(&store, "fd/deep"), (Vec::new(), Vec::new()));
    ok(&[
        "quarantine",
        "discard",
        "0",
        "--db",
        s,
        "--reason",
        "too deep",
    ]);
    let rows = source_rows(&db);
    assert!(
        rows.contains(&((UNNUMBERED, 2), (4, 9))),
        "the discard's row, unnumbered: {rows:?}"
    );
    let (indexed, scanned) = gaps_both(&store, "fd/deep");
    assert_eq!(indexed, scanned);
    assert_eq!(
        indexed,
        ["# fd/deep epoch 4: sequences 9..9, 1 seen, no gaps"]
    );
    // Another source's lookup reads the same bucket and leaves the entry out.
    let (e1, _) = gaps_both(&store, "fd/e1");
    assert_eq!(e1, ["# fd/e1 epoch 1: sequences 1..1, 1 seen, no gaps"]);
    let (code, out, err) = run(&[
        "explain",
        "--db",
        s,
        "--source",
        "fd/deep",
        "--sequence",
        "9",
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        err.ends_with(": source has epoch 4: add --epoch E\n"),
        "{err}"
    );
    assert!(source_index_line(&ok(&["verify", "--db", s])).is_some());
}

/// Hex of `bytes`, and back, for a `bytea` through `psql`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn a_populated_postgresql_schema_of_version_2_is_upgraded_in_place_by_the_next_writer() {
    // A schema as the last release left it (PostgreSQL schema 2, store schema 1: the log
    // named `audit`, no indexes), made by taking a store of this build back, then opened
    // by `ingest` (`PgStore::migrate`: DDL 2 -> 3 -> 4 -> 5, then `store::upgrade` in the same
    // transaction).
    let dir = tempfile::tempdir().unwrap();
    let (pg, cfg, _) = pg_store("source_index_in_place", dir.path());
    let cfg = cfg.as_str();
    ok(&[
        "ingest",
        "--config",
        cfg,
        feed(dir.path()).to_str().unwrap(),
    ]);
    let store = ["--config", cfg];
    let want = gaps_agree(&store);
    let count = |table: &str| pg.sql(&format!("SELECT count(*) FROM replay_guard.{table}"));
    let (keys, sources) = (count("audit_keys"), count("audit_sources"));
    assert_eq!(sources, POSITIONED.to_string());
    let meta_hex =
        pg.sql("SELECT encode(record, 'hex') FROM replay_guard.meta WHERE name = 'meta'");
    let mut meta = META.decode(&unhex(meta_hex.trim())).unwrap();
    assert_eq!(meta.schema_version, SCHEMA_VERSION);
    meta.schema_version = 1;
    pg.sql(&format!(
        "DROP TABLE replay_guard.audit_keys; DROP TABLE replay_guard.audit_sources; \
         ALTER TABLE replay_guard.audit_log RENAME TO audit; \
         UPDATE replay_guard.schema_version SET version = 2; \
         UPDATE replay_guard.meta SET record = decode('{}', 'hex') WHERE name = 'meta'",
        hex(&META.encode(&meta))
    ));
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    ok(&["ingest", "--config", cfg, empty.to_str().unwrap()]);
    assert_eq!(
        pg.sql("SELECT version FROM replay_guard.schema_version"),
        "5"
    );
    assert_eq!(indexes_across_blocks(&pg), "2");
    assert_eq!(
        (count("audit_keys"), count("audit_sources")),
        (keys, sources)
    );
    assert_eq!(gaps_agree(&store), want);
    let verified = ok(&["verify", "--config", cfg]);
    assert!(
        verified.contains("key index:") && source_index_line(&verified).is_some(),
        "{verified}"
    );
}
