//! The audit indexes' merged segments (`store::index_merge`, schema version 4; packed from
//! version 5) through the real binary, on files whose segments are one block (set when the
//! file is created through the library; the binary's writers and readers take the size from
//! the file): the writer moves the rows of complete segments to their merged buckets and
//! `explain` and `gaps --source` give exactly what a scan gives; `verify` checks the merged
//! rows and catches a missing, misplaced or premature one; retention removes whole merged
//! segments; a file of schema version 3 is merged by the upgrade, and one of version 4 packed;
//! `migrate --from` takes merged rows to PostgreSQL under their blocks' buckets.
//!
//! The damage tests edit merged rows one by one: `edited` unpacks the runs into the rows
//! they stand for (as schema version 4 stored them), edits, and packs them again.

use std::path::Path;

use redb::ReadableDatabase as _;
use replay_guard::store::index_merge::{repack, unpack_all};
use replay_guard::store::tables::{
    AUDIT_KEY_BLOCK, AUDIT_KEYS, AUDIT_KEYS_PACKED, AUDIT_SOURCES, AUDIT_SOURCES_PACKED,
    INDEX_MERGE, IndexMerge, MERGED, META_TABLE, SCHEMA_VERSION, UNNUMBERED,
};
use replay_guard::store::{Store, StoreOptions};

use crate::key_index::{
    explain_matches_dump, feed as key_feed, first_index, index_rows, key_index_line, ok, pg_store,
    run,
};
use crate::source_index::{feed as source_feed, gaps_agree, source_index_line, source_rows};

/// Segments of one block: the options a file is created with here.
fn one_block_segments() -> StoreOptions {
    StoreOptions {
        index_segment_blocks: 1,
        ..StoreOptions::default()
    }
}

/// A new file whose audit indexes merge in segments of one block.
fn create(db: &Path) {
    let mut store = Store::open(db, one_block_segments(), 1).unwrap();
    store.commit_batch(&[], 1).unwrap();
    store.close().unwrap();
}

fn index_merge(db: &Path) -> IndexMerge {
    let rdb = redb::Database::open(db).unwrap();
    let txn = rdb.begin_read().unwrap();
    INDEX_MERGE.read(&txn).unwrap().unwrap()
}

fn merged(bucket: u64) -> bool {
    bucket & (MERGED | UNNUMBERED) == MERGED
}

/// The segment a merged bucket belongs to (segments of one block).
fn segment(bucket: u64) -> u64 {
    (bucket & !MERGED) >> 32
}

/// The key index, opened for an edit.
type KeyTable<'t> = redb::Table<'t, (u64, u64), ()>;

/// A copy of `db` with its key index edited.
fn edited_keys(db: &Path, name: &str, edit: &dyn Fn(&mut KeyTable)) -> std::path::PathBuf {
    let copy = db.with_file_name(name);
    std::fs::copy(db, &copy).unwrap();
    let rdb = redb::Database::create(&copy).unwrap();
    let txn = rdb.begin_write().unwrap();
    unpack_all(&txn, AUDIT_KEYS).unwrap();
    edit(&mut txn.open_table(AUDIT_KEYS).unwrap());
    repack(&txn, AUDIT_KEYS).unwrap();
    txn.commit().unwrap();
    copy
}

fn verify_fails(copy: &Path, says: &str) {
    let (code, _, err) = run(&["verify", "--db", copy.to_str().unwrap()]);
    assert_eq!(code, Some(4), "{}: {err}", copy.display());
    assert!(err.contains(says), "{}: {err}", copy.display());
}

#[test]
fn the_writer_merges_complete_segments_and_explain_reads_them_across_retention() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("k.redb");
    let s = db.to_str().unwrap();
    create(&db);
    let feed = key_feed(dir.path());
    ok(&["ingest", "--db", s, feed.to_str().unwrap()]);
    // 10,004 entries: segments 0 and 1 complete and merged, segment 2 still in its block.
    let merge = index_merge(&db);
    assert_eq!(merge.blocks, 1);
    assert_eq!((merge.keys.segment, merge.sources.segment), (2, 2));
    let rows = index_rows(&db);
    assert!(
        rows.iter().all(|&(b, i)| if i < 2 * AUDIT_KEY_BLOCK {
            merged(b) && segment(b) == i / AUDIT_KEY_BLOCK
        } else {
            b >> 32 == 2
        }),
        "every row of a complete segment merged, none of the newest"
    );
    let store = ["--db", s];
    let first = explain_matches_dump(&store);
    assert_eq!(first.len(), 3, "applied + two duplicates: {first:?}");
    assert!(
        first[0] < AUDIT_KEY_BLOCK && first[2] / AUDIT_KEY_BLOCK == 2,
        "two merged segments and a block: {first:?}"
    );
    let verified = ok(&["verify", "--db", s]);
    assert_eq!(
        key_index_line(&verified),
        Some(
            format!(
                "key index: each of the {} audit entries with a key found under it, no other row",
                rows.len()
            )
            .as_str()
        ),
        "{verified}"
    );

    // Damage verify must name: a merged row gone, a merged row back in its block (a lookup
    // reads only the merged bucket there), a row merged beyond the mark.
    let (bucket, index) = *rows.iter().find(|(b, _)| merged(*b)).unwrap();
    verify_fails(
        &edited_keys(&db, "missing.redb", &|t| {
            t.remove((bucket, index)).unwrap();
        }),
        &format!("audit entry {index}: missing from the key index"),
    );
    let block = (index / AUDIT_KEY_BLOCK) << 32 | (bucket & 0xFFFF_FFFF);
    verify_fails(
        &edited_keys(&db, "unmerged.redb", &|t| {
            t.remove((bucket, index)).unwrap();
            t.insert((block, index), ()).unwrap();
        }),
        &format!("audit entry {index}: missing from the key index"),
    );
    verify_fails(
        &edited_keys(&db, "twice.redb", &|t| {
            t.insert((block, index), ()).unwrap();
        }),
        &format!("the key index has a row for audit entry {index}"),
    );
    let (newest_bucket, newest) = *rows.iter().rfind(|(b, _)| !merged(*b)).unwrap();
    let premature = MERGED | 2 << 32 | (newest_bucket & 0xFFFF_FFFF);
    verify_fails(
        &edited_keys(&db, "premature.redb", &|t| {
            t.remove((newest_bucket, newest)).unwrap();
            t.insert((premature, newest), ()).unwrap();
        }),
        &format!("the key index has a row for audit entry {newest}"),
    );

    // Retention down to the newest 5,000 entries: segment 0 goes whole, segment 1 is cut into.
    let cfg = dir.path().join("retain.toml");
    std::fs::write(
        &cfg,
        "[retention]\naudit_max_entries = 5000\n[commit]\nmax_batch = 1\n",
    )
    .unwrap();
    let three = dir.path().join("three.jsonl");
    let lines: String = (1..=3)
        .map(|q| crate::common::msg("fd", "e2", 1, q, "x") + "\n")
        .collect();
    std::fs::write(&three, lines).unwrap();
    ok(&[
        "ingest",
        "--db",
        s,
        "--config",
        cfg.to_str().unwrap(),
        three.to_str().unwrap(),
    ]);
    let first_kept = first_index(&store);
    assert_eq!(first_kept / AUDIT_KEY_BLOCK, 1, "{first_kept}");
    let after = explain_matches_dump(&store);
    let kept: Vec<u64> = first.iter().copied().filter(|&i| i >= first_kept).collect();
    assert_eq!(after, kept, "the entries retention kept");
    let rows = index_rows(&db);
    assert!(
        rows.iter().all(|&(b, _)| !merged(b) || segment(b) >= 1),
        "a whole pruned segment leaves the index"
    );
    assert!(
        rows.iter().any(|&(b, i)| merged(b) && i < first_kept),
        "rows of the segment retention cut into stay until it goes"
    );
    let verified = ok(&["verify", "--db", s]);
    assert!(verified.contains("retention anchor"), "{verified}");
    assert!(key_index_line(&verified).is_some(), "{verified}");
}

#[test]
fn gaps_of_one_source_read_merged_segments_and_verify_checks_their_positions() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.redb");
    let s = db.to_str().unwrap();
    create(&db);
    ok(&[
        "ingest",
        "--db",
        s,
        source_feed(dir.path()).to_str().unwrap(),
    ]);
    let merge = index_merge(&db);
    assert_eq!(merge.sources.segment, 2, "{merge:?}");
    let rows = source_rows(&db);
    assert!(
        rows.iter().filter(|((b, _), _)| merged(*b)).count() as u64 > AUDIT_KEY_BLOCK,
        "two segments merged"
    );
    let mut reference = dir.path().join("plain.redb");
    ok(&[
        "ingest",
        "--db",
        reference.to_str().unwrap(),
        source_feed(dir.path()).to_str().unwrap(),
    ]);
    assert_eq!(
        gaps_agree(&["--db", s]),
        gaps_agree(&["--db", reference.to_str().unwrap()]),
        "the same gaps as a file of unmerged blocks"
    );
    assert!(source_index_line(&ok(&["verify", "--db", s])).is_some());

    // A merged row holding another position is named.
    let ((bucket, index), (epoch, sequence)) = *rows.iter().find(|((b, _), _)| merged(*b)).unwrap();
    reference = db.with_file_name("position.redb");
    std::fs::copy(&db, &reference).unwrap();
    {
        let rdb = redb::Database::create(&reference).unwrap();
        let txn = rdb.begin_write().unwrap();
        unpack_all(&txn, AUDIT_SOURCES).unwrap();
        txn.open_table(AUDIT_SOURCES)
            .unwrap()
            .insert((bucket, index), (epoch, sequence + 1))
            .unwrap();
        repack(&txn, AUDIT_SOURCES).unwrap();
        txn.commit().unwrap();
    }
    verify_fails(
        &reference,
        &format!("the source index has a row for audit entry {index}"),
    );
}

/// Takes a file of this version back to schema version 3: no merge record (nothing was
/// merged in segments of the default size), meta version 3.
fn downgrade_to_3(db: &Path) {
    let rdb = redb::Database::create(db).unwrap();
    let txn = rdb.begin_write().unwrap();
    crate::key_index::set_schema_version(&txn, SCHEMA_VERSION, 3);
    txn.open_table(META_TABLE)
        .unwrap()
        .remove(INDEX_MERGE.key())
        .unwrap();
    txn.commit().unwrap();
}

#[test]
fn a_file_of_schema_version_3_is_merged_by_the_upgrade_and_copied_to_postgresql_unmerged() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("k.redb");
    let s = db.to_str().unwrap();
    let feed = key_feed(dir.path());
    ok(&["ingest", "--db", s, feed.to_str().unwrap()]);
    let rows = index_rows(&db);
    assert!(rows.iter().all(|&(b, _)| !merged(b)), "nothing merged yet");
    let store = ["--db", s];
    let want = explain_matches_dump(&store);
    downgrade_to_3(&db);
    // Read as it is until a writer upgrades it.
    assert_eq!(explain_matches_dump(&store), want);
    // The upgrade (here in segments of one block) merges every complete segment at once.
    Store::open(&db, one_block_segments(), 2)
        .unwrap()
        .close()
        .unwrap();
    let merge = index_merge(&db);
    assert_eq!((merge.blocks, merge.keys.segment), (1, 2), "{merge:?}");
    let upgraded = index_rows(&db);
    assert_eq!(upgraded.len(), rows.len());
    assert_eq!(
        upgraded.iter().filter(|(b, _)| merged(*b)).count() as u64,
        2 * AUDIT_KEY_BLOCK - 1,
        "every keyed entry of segments 0 and 1 (one malformed line has no key)"
    );
    assert_eq!(explain_matches_dump(&store), want);
    let verified = ok(&["verify", "--db", s]);
    assert!(
        key_index_line(&verified)
            .is_some_and(|l| l.contains(&format!("each of the {} ", rows.len()))),
        "{verified}"
    );
    assert!(source_index_line(&verified).is_some(), "{verified}");

    // PostgreSQL reads the index across blocks and never merges: the copy puts each row
    // under its block's bucket, and drops the merge record.
    let (pg, cfg, _) = pg_store("index_merge", dir.path());
    ok(&["migrate", "--from", s, "--config", &cfg]);
    let pg_rows = pg.sql(
        "SELECT string_agg(bucket::text || ':' || audit_index::text, ',' \
         ORDER BY bucket, audit_index) FROM replay_guard.audit_keys",
    );
    let plain: Vec<String> = rows.iter().map(|(b, i)| format!("{b}:{i}")).collect();
    assert_eq!(pg_rows, plain.join(","));
    assert_eq!(
        pg.sql(&format!(
            "SELECT count(*) FROM replay_guard.meta WHERE name = '{}'",
            INDEX_MERGE.key()
        )),
        "0"
    );
    assert_eq!(explain_matches_dump(&["--config", &cfg]), want);
    let verified = ok(&["verify", "--config", &cfg]);
    assert!(source_index_line(&verified).is_some(), "{verified}");
}

/// (merged rows stored one by one in the two indexes' tables, packed runs of both; `None`
/// for a packed table that does not exist).
fn merged_storage(db: &Path) -> (usize, Option<usize>) {
    use redb::ReadableTableMetadata as _;
    let rdb = redb::Database::open(db).unwrap();
    let txn = rdb.begin_read().unwrap();
    let keys = txn.open_table(AUDIT_KEYS).unwrap();
    let sources = txn.open_table(AUDIT_SOURCES).unwrap();
    let one_by_one = keys.range((MERGED, 0)..(UNNUMBERED, 0)).unwrap().count()
        + sources.range((MERGED, 0)..(UNNUMBERED, 0)).unwrap().count();
    let runs = match (
        txn.open_table(AUDIT_KEYS_PACKED),
        txn.open_table(AUDIT_SOURCES_PACKED),
    ) {
        (Ok(k), Ok(s)) => Some((k.len().unwrap() + s.len().unwrap()) as usize),
        _ => None,
    };
    (one_by_one, runs)
}

/// Takes a file of this version back to schema version 4: every packed run unpacked into the
/// merged rows it stands for, stored one by one in the indexes' tables as version 4 wrote
/// them, and the packed tables gone.
fn downgrade_to_4(db: &Path) {
    let rdb = redb::Database::create(db).unwrap();
    let txn = rdb.begin_write().unwrap();
    unpack_all(&txn, AUDIT_KEYS).unwrap();
    unpack_all(&txn, AUDIT_SOURCES).unwrap();
    assert!(txn.delete_table(AUDIT_KEYS_PACKED).unwrap());
    assert!(txn.delete_table(AUDIT_SOURCES_PACKED).unwrap());
    crate::key_index::set_schema_version(&txn, SCHEMA_VERSION, 4);
    txn.commit().unwrap();
}

#[test]
fn a_file_of_schema_version_4_is_read_as_it_is_and_its_merged_rows_packed_by_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("k.redb");
    let s = db.to_str().unwrap();
    create(&db);
    ok(&["ingest", "--db", s, key_feed(dir.path()).to_str().unwrap()]);
    let store = ["--db", s];
    let (keys, sources) = (index_rows(&db), source_rows(&db));
    let merged_rows = keys.iter().filter(|(b, _)| merged(*b)).count()
        + sources.iter().filter(|((b, _), _)| merged(*b)).count();
    assert!(merged_rows > 3 * AUDIT_KEY_BLOCK as usize, "{merged_rows}");
    let (one_by_one, runs) = merged_storage(&db);
    assert_eq!(one_by_one, 0, "the writer stores merged rows packed only");
    let runs = runs.unwrap();
    // Segments of one block give each key group about one row; the one source's rows of a
    // segment fill few runs.
    assert!(
        runs > 0 && runs * 2 < merged_rows,
        "{runs} runs for {merged_rows} rows"
    );
    let (want, gaps) = (explain_matches_dump(&store), gaps_agree(&store));

    downgrade_to_4(&db);
    assert_eq!(merged_storage(&db), (merged_rows, None));
    // Read as it is until a writer upgrades it.
    assert_eq!(
        (index_rows(&db), source_rows(&db)),
        (keys.clone(), sources.clone())
    );
    assert_eq!(explain_matches_dump(&store), want);
    assert_eq!(gaps_agree(&store), gaps);
    let verified = ok(&["verify", "--db", s]);
    assert!(key_index_line(&verified).is_some(), "{verified}");

    // A writer's open packs every merged row, in the upgrade's one transaction.
    Store::open(&db, StoreOptions::default(), 2)
        .unwrap()
        .close()
        .unwrap();
    assert_eq!(merged_storage(&db), (0, Some(runs)));
    assert_eq!((index_rows(&db), source_rows(&db)), (keys.clone(), sources));
    assert_eq!(explain_matches_dump(&store), want);
    assert_eq!(gaps_agree(&store), gaps);
    let verified = ok(&["verify", "--db", s]);
    assert!(
        key_index_line(&verified)
            .is_some_and(|l| l.contains(&format!("each of the {} ", keys.len()))),
        "{verified}"
    );
    assert!(source_index_line(&verified).is_some(), "{verified}");
    let rdb = redb::Database::open(&db).unwrap();
    let txn = rdb.begin_read().unwrap();
    let meta = txn.open_table(META_TABLE).unwrap();
    let meta = replay_guard::store::tables::META
        .get(&meta)
        .unwrap()
        .unwrap();
    assert_eq!(meta.schema_version, SCHEMA_VERSION);
}

#[test]
fn lookups_and_verify_read_a_segment_the_writer_is_still_merging() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("k.redb");
    let s = db.to_str().unwrap();
    create(&db);
    // 4,400 entries in commits of 50: each merges 4 rows per entry it appends and 256 more,
    // so segment 0 (complete at entry 4,096) is only partly merged by the end.
    let all = std::fs::read_to_string(key_feed(dir.path())).unwrap();
    let part: String = all.lines().take(4_400).map(|l| format!("{l}\n")).collect();
    let feed = dir.path().join("part.jsonl");
    std::fs::write(&feed, part).unwrap();
    let cfg = dir.path().join("batch.toml");
    std::fs::write(&cfg, "[commit]\nmax_batch = 50\n").unwrap();
    ok(&[
        "ingest",
        "--db",
        s,
        "--config",
        cfg.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    let merge = index_merge(&db);
    assert_eq!(merge.keys.segment, 0, "{merge:?}");
    assert_ne!(merge.keys.next, (0, 0), "{merge:?}");
    let rows = index_rows(&db);
    let in_segment_0 = |&&(_, i): &&(u64, u64)| i < AUDIT_KEY_BLOCK;
    let moved = rows
        .iter()
        .filter(in_segment_0)
        .filter(|(b, _)| merged(*b))
        .count();
    assert!(
        moved > 0 && moved < rows.iter().filter(in_segment_0).count(),
        "partly merged: {moved}"
    );
    explain_matches_dump(&["--db", s]);
    let verified = ok(&["verify", "--db", s]);
    assert!(
        key_index_line(&verified)
            .is_some_and(|l| l.contains(&format!("each of the {} ", rows.len()))),
        "{verified}"
    );
    // A row of the segment left in its block below the mark would vanish from lookups once
    // the segment is merged: named.
    let (bucket, index) = *rows.iter().find(|(b, _)| merged(*b)).unwrap();
    let block = (index / AUDIT_KEY_BLOCK) << 32 | (bucket & 0xFFFF_FFFF);
    verify_fails(
        &edited_keys(&db, "below-mark.redb", &|t| {
            t.remove((bucket, index)).unwrap();
            t.insert((block, index), ()).unwrap();
        }),
        &format!("the key index has a row for audit entry {index} under bucket {block:#x}"),
    );
    // Further writes finish the merge.
    let rest: String = all
        .lines()
        .skip(4_400)
        .take(400)
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&feed, rest).unwrap();
    ok(&["ingest", "--db", s, feed.to_str().unwrap()]);
    assert_eq!(index_merge(&db).keys.segment, 1);
    explain_matches_dump(&["--db", s]);
    assert!(key_index_line(&ok(&["verify", "--db", s])).is_some());
}
