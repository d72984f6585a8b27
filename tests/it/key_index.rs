//! The audit log's key index (`AUDIT_KEYS`, schema version 2 on) through the real binary:
//! `explain` finds exactly the entries `dump-audit --key` lists, across index blocks and
//! after retention cut into one; `verify` checks the index and catches a missing or stray
//! row; a file of schema version 1 (a release's fixture, and a multi-block file taken back
//! to version 1) is explained by a scan until the next writer builds its index; on
//! PostgreSQL the same, through `migrate --from`, ingest and retention.

use std::path::{Path, PathBuf};

use replay_guard::json::{Json, parse};
use replay_guard::store::index_merge::for_each_packed;
use replay_guard::store::tables::{
    ALL_SEGMENTS, AUDIT, AUDIT_FENCE, AUDIT_KEY_BLOCK, AUDIT_KEYS, AUDIT_KEYS_PACKED,
    AUDIT_SOURCES, META, META_TABLE, SCHEMA_VERSION,
};

use crate::common::{self, msg};
use crate::pg::PgDb;

/// (exit code, stdout, stderr).
pub(crate) fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = common::run(args);
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

pub(crate) fn ok(args: &[&str]) -> String {
    let (code, out, err) = run(args);
    assert_eq!(code, Some(0), "{args:?}: {err}");
    out
}

pub(crate) fn field<'a>(row: &'a Json, name: &str) -> &'a Json {
    match row {
        Json::Object(m) => &m.iter().find(|(k, _)| k == name).unwrap().1,
        other => panic!("not an object: {other:?}"),
    }
}

pub(crate) fn number(j: &Json) -> u64 {
    match j {
        Json::Number(n) => n.parse().unwrap(),
        other => panic!("not a number: {other:?}"),
    }
}

/// Sequences 1..=10,000 of one source, three index blocks' worth: sequence 1 resent after
/// line 5,000 and after line 9,000 (duplicates), sequence 2 with other content after line
/// 8,500 (a conflict), a malformed line after 4,100 (an entry with no key).
const LINES: u64 = 10_000;

pub(crate) fn feed(dir: &Path) -> PathBuf {
    let mut text = String::new();
    for q in 1..=LINES {
        text.push_str(&msg("fd", "e1", 1, q, &format!("count {q}")));
        text.push('\n');
        match q {
            4_100 => text.push_str("{not json\n"),
            5_000 | 9_000 => text.push_str(&(msg("fd", "e1", 1, 1, "count 1") + "\n")),
            8_500 => text.push_str(&(msg("fd", "e1", 1, 2, "other") + "\n")),
            _ => {}
        }
    }
    let path = dir.join("feed.jsonl");
    std::fs::write(&path, text).unwrap();
    path
}

/// `explain --format json` of sequence `seq`: (its key, its audit indices in order; none
/// when it says no entry has the key).
pub(crate) fn explained(store: &[&str], seq: u64) -> (String, Vec<u64>) {
    let seq = seq.to_string();
    let args = [
        &["explain", "--format", "json"][..],
        store,
        &["--source", "fd/e1", "--epoch", "1", "--sequence", &seq],
    ]
    .concat();
    let (code, out, err) = run(&args);
    if code == Some(1)
        && let Some(rest) = err.split("no audit entry has key ").nth(1)
    {
        return (rest[..64].to_string(), Vec::new());
    }
    assert_eq!(code, Some(0), "{args:?}: {err}");
    let j = parse(out.trim().as_bytes(), 64).unwrap();
    let Json::String(key) = field(&j, "key") else {
        panic!("no key")
    };
    let Json::Array(audit) = field(&j, "audit") else {
        panic!("no audit")
    };
    let indices = audit.iter().map(|e| number(field(e, "index"))).collect();
    (key.clone(), indices)
}

/// The indices `dump-audit --key` lists (a scan of the log).
fn dumped(store: &[&str], key: &str) -> Vec<u64> {
    let args = [&["dump-audit"][..], store, &["--key", key]].concat();
    ok(&args)
        .lines()
        .map(|l| number(field(&parse(l.as_bytes(), 64).unwrap(), "index")))
        .collect()
}

/// How many audit entries have a key.
fn keyed_entries(store: &[&str]) -> usize {
    let args = [&["dump-audit"][..], store].concat();
    ok(&args)
        .lines()
        .filter(|l| !matches!(field(&parse(l.as_bytes(), 64).unwrap(), "key"), Json::Null))
        .count()
}

/// `explain` of each sequence agrees with `dump-audit --key`; returns sequence 1's indices.
pub(crate) fn explain_matches_dump(store: &[&str]) -> Vec<u64> {
    let mut first = Vec::new();
    for seq in [1, 2, 3, 4_096, 4_097, 9_999, LINES] {
        let (key, indices) = explained(store, seq);
        assert_eq!(indices, dumped(store, &key), "sequence {seq}");
        if seq == 1 {
            first = indices;
        }
    }
    first
}

/// A PostgreSQL store in a database of its own: the database, the path of a config naming
/// it, and that config's text.
pub(crate) fn pg_store(name: &str, dir: &Path) -> (PgDb, String, String) {
    let pg = PgDb::new(name);
    let cfg = dir.join("pg.toml");
    let base = format!("[store]\nbackend = \"postgres\"\ndsn = \"{}\"\n", pg.dsn());
    std::fs::write(&cfg, &base).unwrap();
    (pg, cfg.to_str().unwrap().to_string(), base)
}

/// The path of a config of `base` that keeps the newest 5,000 audit entries.
/// Drops PostgreSQL schema version 5's indexes (`audit_keys_by_key`, `audit_sources_by_source`).
pub(crate) const DROP_INDEXES_ACROSS_BLOCKS: &str =
    "DROP INDEX replay_guard.audit_keys_by_key; DROP INDEX replay_guard.audit_sources_by_source";

/// How many of PostgreSQL schema version 5's two indexes the schema has.
pub(crate) fn indexes_across_blocks(pg: &PgDb) -> String {
    pg.sql(
        "SELECT count(*) FROM pg_indexes WHERE schemaname = 'replay_guard' \
         AND indexname IN ('audit_keys_by_key', 'audit_sources_by_source')",
    )
}

pub(crate) fn retaining_5000(dir: &Path, base: &str) -> String {
    let retain = dir.join("retain.toml");
    std::fs::write(
        &retain,
        format!("{base}[retention]\naudit_max_entries = 5000\n"),
    )
    .unwrap();
    retain.to_str().unwrap().to_string()
}

/// The index of the oldest entry the log keeps.
pub(crate) fn first_index(store: &[&str]) -> u64 {
    let args = [&["dump-audit"][..], store].concat();
    let out = ok(&args);
    number(field(
        &parse(out.lines().next().unwrap().as_bytes(), 64).unwrap(),
        "index",
    ))
}

pub(crate) fn key_index_line(verified: &str) -> Option<&str> {
    verified.lines().find(|l| l.starts_with("key index:"))
}

/// The audit log's table in a file of schema version 1.
const OLD_AUDIT: redb::TableDefinition<u64, &[u8]> = redb::TableDefinition::new("audit");

/// Takes a file back to schema version 1: no key or source index, the log under its old
/// name, no fence, meta version 1.
fn downgrade(db: &Path) {
    let rdb = redb::Database::create(db).unwrap();
    let txn = rdb.begin_write().unwrap();
    assert!(txn.delete_table(AUDIT_KEYS).unwrap());
    assert!(txn.delete_table(AUDIT_SOURCES).unwrap());
    txn.delete_table(AUDIT_FENCE).unwrap(); // there after an upgrade only
    txn.rename_table(AUDIT.raw(), OLD_AUDIT).unwrap();
    set_schema_version(&txn, SCHEMA_VERSION, 1);
    txn.commit().unwrap();
}

/// Sets the meta record's schema version of a redb file from `from` (checked) to `to`, in
/// `txn`: the downgrades of the index tests.
pub(crate) fn set_schema_version(txn: &redb::WriteTransaction, from: u32, to: u32) {
    let mut t = txn.open_table(META_TABLE).unwrap();
    let mut meta = META.get(&t).unwrap().unwrap();
    assert_eq!(meta.schema_version, from);
    meta.schema_version = to;
    META.put(&mut t, &meta, &mut Vec::new()).unwrap();
}

/// The key index, opened for an edit.
type IndexTable<'t> = redb::Table<'t, (u64, u64), ()>;

fn meta_version(db: &redb::Database) -> u32 {
    use redb::ReadableDatabase as _;
    let txn = db.begin_read().unwrap();
    let t = txn.open_table(META_TABLE).unwrap();
    META.get(&t).unwrap().unwrap().schema_version
}

/// Every row of the key index, merged rows packed or not as the rows they stand for, in
/// order.
pub(crate) fn index_rows(db: &Path) -> Vec<(u64, u64)> {
    use redb::{ReadableDatabase as _, ReadableTable as _};
    let rdb = redb::Database::open(db).unwrap();
    let txn = rdb.begin_read().unwrap();
    let t = txn.open_table(AUDIT_KEYS).unwrap();
    let mut rows: Vec<(u64, u64)> = t.iter().unwrap().map(|r| r.unwrap().0.value()).collect();
    if let Ok(packed) = txn.open_table(AUDIT_KEYS_PACKED) {
        for_each_packed::<()>(&packed, ALL_SEGMENTS, &mut |k, ()| {
            rows.push(k);
            Ok(())
        })
        .unwrap();
    }
    rows.sort_unstable();
    rows
}

#[test]
fn explain_reads_the_key_index_across_blocks_and_after_retention_cut_into_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("k.redb");
    let s = db.to_str().unwrap();
    let feed = feed(dir.path());
    ok(&["ingest", "--db", s, feed.to_str().unwrap()]);
    let store = ["--db", s];
    let first = explain_matches_dump(&store);
    assert_eq!(first.len(), 3, "applied + two duplicates: {first:?}");
    assert!(
        first[2] / AUDIT_KEY_BLOCK == 2 && first[1] / AUDIT_KEY_BLOCK == 1,
        "the entries of sequence 1 lie in three blocks: {first:?}"
    );
    let verified = ok(&["verify", "--db", s]);
    let keyed = keyed_entries(&store);
    assert_eq!(keyed as u64, LINES + 3, "one malformed line has no key");
    assert_eq!(
        key_index_line(&verified),
        Some(format!("key index: each of the {keyed} audit entries with a key found under it, no other row").as_str()),
        "{verified}"
    );
    assert_eq!(index_rows(&db).len(), keyed);

    // Retention down to the newest 5,000 entries: block 0 goes whole, block 1 is cut into.
    let cfg = dir.path().join("retain.toml");
    // Retention removes a bounded slice per commit: three commits of one message each.
    std::fs::write(
        &cfg,
        "[retention]\naudit_max_entries = 5000\n[commit]\nmax_batch = 1\n",
    )
    .unwrap();
    let one = dir.path().join("three.jsonl");
    let three: String = (1..=3).map(|q| msg("fd", "e2", 1, q, "x") + "\n").collect();
    std::fs::write(&one, three).unwrap();
    ok(&[
        "ingest",
        "--db",
        s,
        "--config",
        cfg.to_str().unwrap(),
        one.to_str().unwrap(),
    ]);
    let first_kept = first_index(&store);
    assert!(
        first_kept > AUDIT_KEY_BLOCK && !first_kept.is_multiple_of(AUDIT_KEY_BLOCK),
        "block 0 pruned whole, block {} cut into: {first_kept}",
        first_kept / AUDIT_KEY_BLOCK
    );
    let after = explain_matches_dump(&store);
    let kept: Vec<u64> = first.iter().copied().filter(|&i| i >= first_kept).collect();
    assert_eq!(after, kept, "the entries retention kept");
    assert!(after.len() < first.len());
    let verified = ok(&["verify", "--db", s]);
    assert!(verified.contains("retention anchor"), "{verified}");
    let keyed = keyed_entries(&store);
    assert!(
        key_index_line(&verified).is_some_and(|l| l.contains(&format!("each of the {keyed} "))),
        "{verified}"
    );
    let rows = index_rows(&db);
    assert!(
        rows.iter()
            .all(|(b, _)| b >> 32 >= first_kept / AUDIT_KEY_BLOCK),
        "whole pruned blocks leave the index"
    );
    assert!(
        rows.iter().any(|&(_, i)| i < first_kept),
        "rows of the block retention cut into stay until it goes"
    );
}

#[test]
fn verify_catches_a_missing_and_a_stray_key_index_row() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("k.redb");
    let feed = feed(dir.path());
    ok(&[
        "ingest",
        "--db",
        db.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    let rows = index_rows(&db);
    let damaged = |name: &str, edit: &dyn Fn(&mut IndexTable)| {
        let copy = dir.path().join(name);
        std::fs::copy(&db, &copy).unwrap();
        let rdb = redb::Database::create(&copy).unwrap();
        let txn = rdb.begin_write().unwrap();
        edit(&mut txn.open_table(AUDIT_KEYS).unwrap());
        txn.commit().unwrap();
        drop(rdb);
        run(&["verify", "--db", copy.to_str().unwrap()])
    };
    let victim = rows[rows.len() / 2];
    let (code, _, err) = damaged("missing.redb", &|t| {
        t.remove(victim).unwrap();
    });
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(&format!(
            "audit entry {}: missing from the key index",
            victim.1
        )),
        "{err}"
    );
    let (code, _, err) = damaged("stray.redb", &|t| {
        t.insert((victim.0 ^ 1, victim.1), ()).unwrap();
    });
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(&format!(
            "the key index has a row for audit entry {}",
            victim.1
        )),
        "{err}"
    );
    let (code, _, err) = damaged("beyond.redb", &|t| {
        t.insert((100 << 32, 100 * AUDIT_KEY_BLOCK), ()).unwrap();
    });
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(&format!(
            "the key index has a row for audit entry {}",
            100 * AUDIT_KEY_BLOCK
        )),
        "{err}"
    );
}

#[test]
fn a_file_of_schema_version_1_is_explained_by_a_scan_until_a_writer_builds_its_index() {
    // A release's file (one block).
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("prev.redb");
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/release-f2ebb61/prev.redb"
        ),
        &old,
    )
    .unwrap();
    let s = old.to_str().unwrap();
    let explain = |seq: &str| {
        ok(&[
            "explain",
            "--db",
            s,
            "--source",
            "fd/e1",
            "--epoch",
            "1",
            "--sequence",
            seq,
        ])
    };
    // The audit entries and records they name (the window's state after the next ingest is
    // another: the fixture's window has aged out by now).
    let explain = |seq: &str| {
        let text = explain(seq);
        text[..text.find("\nNow:").unwrap()].to_string()
    };
    let before: Vec<String> = ["1", "2", "3", "7"].iter().map(|q| explain(q)).collect();
    assert!(
        before[0].contains("with this key, oldest first"),
        "{}",
        before[0]
    );
    assert_eq!(key_index_line(&ok(&["verify", "--db", s])), None);
    let more = dir.path().join("more.jsonl");
    std::fs::write(&more, msg("fd", "e9", 1, 1, "new") + "\n").unwrap();
    ok(&["ingest", "--db", s, more.to_str().unwrap()]);
    let after: Vec<String> = ["1", "2", "3", "7"].iter().map(|q| explain(q)).collect();
    assert_eq!(after, before, "the built index tells the same stories");
    let keyed = keyed_entries(&["--db", s]);
    assert!(
        key_index_line(&ok(&["verify", "--db", s]))
            .is_some_and(|l| l.contains(&format!("each of the {keyed} "))),
    );
    assert_eq!(index_rows(&old).len(), keyed);

    // A file of three blocks taken back to version 1.
    let db = dir.path().join("k.redb");
    let s = db.to_str().unwrap();
    let feed = feed(dir.path());
    ok(&["ingest", "--db", s, feed.to_str().unwrap()]);
    let want = index_rows(&db);
    let want_sources = crate::source_index::source_rows(&db);
    downgrade(&db);
    let store = ["--db", s];
    let scanned = explain_matches_dump(&store);
    assert_eq!(key_index_line(&ok(&["verify", "--db", s])), None);
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    // A process of the old build holds the file open meanwhile.
    let old_process = redb::Builder::new()
        .set_concurrency_mode(redb::ConcurrencyMode::MultiWriter)
        .open(&db)
        .unwrap();
    assert_eq!(meta_version(&old_process), 1);
    ok(&["ingest", "--db", s, empty.to_str().unwrap()]);
    // Its next write transaction opens the log as it knows it: refused, nothing written.
    let txn = old_process.begin_write().unwrap();
    match txn.open_table(OLD_AUDIT) {
        Err(redb::TableError::TableTypeMismatch { table, .. }) => assert_eq!(table, "audit"),
        Err(e) => panic!("not the fence: {e}"),
        Ok(_) => panic!("an old build could still append to the audit log"),
    }
    drop(txn);
    drop(old_process);
    assert_eq!(index_rows(&db), want, "the upgrade builds the same rows");
    assert_eq!(
        crate::source_index::source_rows(&db),
        want_sources,
        "and the same source index"
    );
    assert_eq!(explain_matches_dump(&store), scanned);
    assert!(key_index_line(&ok(&["verify", "--db", s])).is_some());
}

#[test]
fn on_postgresql_the_index_is_built_by_migrate_kept_by_ingest_and_pruned_by_retention() {
    let dir = tempfile::tempdir().unwrap();
    let (pg, cfg, base) = pg_store("key_index", dir.path());
    let cfg = cfg.as_str();
    // A file of version 1 copied in: the copy is upgraded in the same transaction.
    let db = dir.path().join("k.redb");
    let file = db.to_str().unwrap();
    let feed = feed(dir.path());
    ok(&["ingest", "--db", file, feed.to_str().unwrap()]);
    let want = index_rows(&db).len();
    downgrade(&db);
    ok(&["migrate", "--from", file, "--config", cfg]);
    assert_eq!(
        pg.sql("SELECT count(*) FROM replay_guard.audit_keys"),
        want.to_string()
    );
    let store = ["--config", cfg];
    let on_pg = explain_matches_dump(&store);
    assert_eq!(on_pg, explain_matches_dump(&["--db", file]));
    // A schema of version 4 (no index across blocks: `explain` of an upgraded reader before
    // a writer upgraded the schema) is read by a probe per block: the same entries.
    pg.sql(&format!(
        "{DROP_INDEXES_ACROSS_BLOCKS}; UPDATE replay_guard.schema_version SET version = 4"
    ));
    assert_eq!(explain_matches_dump(&store), on_pg);
    let verified = ok(&["verify", "--config", cfg]);
    assert!(
        key_index_line(&verified).is_some_and(|l| l.contains(&format!("each of the {want} "))),
        "{verified}"
    );

    // Ingest writes each entry's row in its statement; retention removes whole blocks.
    let retain = retaining_5000(dir.path(), &base);
    ok(&["ingest", "--config", &retain, feed.to_str().unwrap()]);
    assert_eq!(
        indexes_across_blocks(&pg),
        "2",
        "the writer takes the schema to version 5"
    );
    let first_kept = first_index(&store);
    assert!(first_kept > LINES, "{first_kept}");
    let kept = explain_matches_dump(&store);
    assert!(
        !kept.is_empty() && kept.iter().all(|&i| i >= first_kept),
        "{kept:?}"
    );
    let verified = ok(&["verify", "--config", cfg]);
    assert!(verified.contains("retention anchor"), "{verified}");
    assert!(key_index_line(&verified).is_some(), "{verified}");
    let below = pg.sql(&format!(
        "SELECT count(*) FROM replay_guard.audit_keys WHERE audit_index < {}",
        first_kept / AUDIT_KEY_BLOCK * AUDIT_KEY_BLOCK
    ));
    assert_eq!(below, "0", "whole pruned blocks leave the index");
}
