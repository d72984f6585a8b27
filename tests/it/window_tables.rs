//! redb keeps the dedup window's newest entries in a small table of their own
//! (`WINDOW_RECENT`) and the positions removed from its main table in another
//! (`WINDOW_GONE`), and applies both to the main table every `WINDOW_MERGE_AT` entries. Through the real binary: a feed that crosses a move decides
//! its replays as duplicates and conflicts whichever table holds the original, `stats`
//! counts both tables, `verify` passes, an operator's release replaces an entry of the main
//! table, and `backup` and `migrate --from` (PostgreSQL, one
//! window table) carry both tables' entries, so the copies decide the same replays the same.

use std::path::{Path, PathBuf};

use redb::{ReadableDatabase as _, ReadableTableMetadata as _};
use replay_guard::json::parse;
use replay_guard::store::tables::{META, WINDOW, WINDOW_GONE, WINDOW_MERGE_AT, WINDOW_RECENT};

use crate::common::msg;
use crate::key_index::{field, number, ok, pg_store};

const SOURCES: u64 = 40;
const PER_SOURCE: u64 = 500;

fn write(dir: &Path, name: &str, lines: &[String]) -> String {
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path.to_str().unwrap().to_string()
}

/// 20,000 first sightings, sources interleaved.
fn first(dir: &Path) -> String {
    let mut lines = Vec::new();
    for q in 1..=PER_SOURCE {
        for s in 0..SOURCES {
            lines.push(msg("wt", &format!("s{s:02}"), 1, q, &format!("{s}/{q}")));
        }
    }
    write(dir, "first.jsonl", &lines)
}

/// Replays of the first feed from both ends (held by `WINDOW` and by `WINDOW_RECENT`), with
/// other content for a few (conflicts), and 100 new positions.
fn replays(dir: &Path) -> (String, u64, u64, u64) {
    let mut lines = Vec::new();
    let (mut dup, mut conflict) = (0, 0);
    for s in 0..SOURCES {
        for q in [1, 2, 250, PER_SOURCE - 1, PER_SOURCE] {
            if q == 2 {
                lines.push(msg("wt", &format!("s{s:02}"), 1, q, "other"));
                conflict += 1;
            } else {
                lines.push(msg("wt", &format!("s{s:02}"), 1, q, &format!("{s}/{q}")));
                dup += 1;
            }
        }
        for q in PER_SOURCE + 1..=PER_SOURCE + 2 {
            lines.push(msg("wt", &format!("s{s:02}"), 1, q, "new"));
        }
        lines.push(msg("wt", &format!("n{s:02}"), 1, 1, "new source"));
    }
    (
        write(dir, "replays.jsonl", &lines),
        dup,
        conflict,
        SOURCES * 3,
    )
}

/// The count of outcome `name` in an ingest's summary.
fn count(summary: &str, name: &str) -> u64 {
    summary
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(name)).then(|| w.next().unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("no {name} line in {summary}"))
}

fn ingest_summary(store: &[&str], feed: &str) -> String {
    let (code, _, err) = crate::key_index::run(&[&["ingest"][..], store, &[feed]].concat());
    assert_eq!(code, Some(0), "{err}");
    err
}

/// (applied, duplicate, conflict) of an ingest.
fn ingest(store: &[&str], feed: &str) -> (u64, u64, u64) {
    let s = ingest_summary(store, feed);
    (
        count(&s, "applied"),
        count(&s, "duplicate"),
        count(&s, "conflict"),
    )
}

/// (duplicate, stale) of an ingest.
fn ingest_stale(store: &[&str], feed: &str) -> (u64, u64) {
    let s = ingest_summary(store, feed);
    (count(&s, "duplicate"), count(&s, "stale"))
}

/// Entries in (`WINDOW`, `WINDOW_RECENT`) of a redb file.
fn tables(db: &Path) -> (u64, u64) {
    let (main, recent, _) = all_tables(db);
    (main, recent)
}

/// Entries in (`WINDOW`, `WINDOW_RECENT`, `WINDOW_GONE`) of a redb file.
fn all_tables(db: &Path) -> (u64, u64, u64) {
    let file = redb::Database::open(db).unwrap();
    let txn = file.begin_read().unwrap();
    let main = txn.open_table(WINDOW.raw()).unwrap().len().unwrap();
    let recent = txn.open_table(WINDOW_RECENT.raw()).unwrap().len().unwrap();
    let gone = txn.open_table(WINDOW_GONE).unwrap().len().unwrap();
    (main, recent, gone)
}

/// The window's start and purge mark (`Meta::window_start`, `window_purged`).
fn marks(db: &Path) -> (u64, u64) {
    let file = redb::Database::open(db).unwrap();
    let txn = file.begin_read().unwrap();
    let m = META.read(&txn).unwrap().unwrap();
    (m.window_start, m.window_purged)
}

fn window_entries(store: &[&str]) -> u64 {
    let out = ok(&[&["stats"][..], store, &["--format", "json"]].concat());
    let stats = parse(out.as_bytes(), 64).unwrap();
    number(field(field(&stats, "window"), "entries"))
}

#[test]
fn replays_are_decided_alike_whichever_window_table_holds_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("w.redb");
    let file = db.to_str().unwrap();
    let store = ["--db", file];
    let total = SOURCES * PER_SOURCE;
    assert_eq!(ingest(&store, &first(dir.path())), (total, 0, 0));
    // One move happened: the oldest entries are in the main table, the rest recent.
    let (main, recent) = tables(&db);
    assert_eq!(main + recent, total);
    assert!(main >= WINDOW_MERGE_AT && recent > 0, "{main} + {recent}");
    assert_eq!(window_entries(&store), total);

    let copy = dir.path().join("copy.redb");
    ok(&["backup", "--db", file, "--to", copy.to_str().unwrap()]);
    let (feed, dup, conflict, new) = replays(dir.path());
    assert_eq!(ingest(&store, &feed), (new, dup, conflict));
    assert_eq!(window_entries(&store), total + new);
    ok(&["verify", "--db", file]);

    // The backup holds both tables as they were: the same replays decide the same.
    assert_eq!(tables(&copy), (main, recent));
    let copy_store = ["--db", copy.to_str().unwrap()];
    assert_eq!(ingest(&copy_store, &feed), (new, dup, conflict));

    // Releasing a conflict whose original's entry moved to the main table replaces it: the
    // main table's entry is marked gone and the new one is recent; the released content is
    // the duplicate and the original content the conflict.
    let (main_before, recent_before, gone_before) = all_tables(&db);
    ok(&[
        "quarantine",
        "release",
        "0",
        "--db",
        file,
        "--reason",
        "genuine",
    ]);
    assert_eq!(
        all_tables(&db),
        (main_before, recent_before + 1, gone_before + 1)
    );
    assert_eq!(window_entries(&store), total + new);
    let released = write(
        dir.path(),
        "released.jsonl",
        &[msg("wt", "s00", 1, 2, "other")],
    );
    assert_eq!(ingest(&store, &released), (0, 1, 0));
    let original = write(
        dir.path(),
        "original.jsonl",
        &[msg("wt", "s00", 1, 2, "0/2")],
    );
    assert_eq!(ingest(&store, &original), (0, 0, 1));
    ok(&["verify", "--db", file]);

    // PostgreSQL has one window table: `migrate --from` fills it from both.
    let (pg, cfg, _) = pg_store("window_tables", dir.path());
    ok(&[
        "migrate",
        "--from",
        copy.to_str().unwrap(),
        "--config",
        &cfg,
    ]);
    assert_eq!(
        pg.sql("SELECT count(*) FROM replay_guard.window_entries"),
        (total + new).to_string()
    );
    let on_pg = ["--config", cfg.as_str()];
    assert_eq!(ingest(&on_pg, &feed), (0, dup + new, conflict));
}

/// Eviction moves the window's start and leaves the evicted entries in their tables until
/// the next move: they decide `stale` at once, are not counted, and are left out of a copy
/// into PostgreSQL; `backup` copies them and the mark, and the next move deletes them.
#[test]
fn evicted_entries_of_the_main_table_are_gone_at_once_and_in_every_copy() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("w.redb");
    let file = db.to_str().unwrap();
    let cfg = dir.path().join("evict.toml");
    let keep = 18_000u64;
    std::fs::write(
        &cfg,
        format!("[store]\npath = \"{file}\"\n[window]\nmax_entries = {keep}\n"),
    )
    .unwrap();
    let store = ["--config", cfg.to_str().unwrap()];
    let total = SOURCES * PER_SOURCE;
    assert_eq!(ingest(&store, &first(dir.path())), (total, 0, 0));
    // The oldest 2,000 (sequences 1..=50 of each source) were evicted after the move at
    // 16,384 (`WINDOW_MERGE_AT`): still stored, in both tables, none marked gone, and out
    // of the window by its start.
    let (main, recent, gone) = all_tables(&db);
    assert_eq!((main + recent, gone), (total, 0), "{main} {recent} {gone}");
    assert!(main > 0 && recent > 0, "{main} {recent} {gone}");
    assert_eq!(marks(&db), (total - keep, 0), "start, purged");
    assert_eq!(window_entries(&store), keep);

    // Sequence 1 (evicted) is stale; 250 and 500 (the newest) are duplicates.
    let mut lines = Vec::new();
    for s in 0..SOURCES {
        for q in [1, 250, PER_SOURCE] {
            lines.push(msg("wt", &format!("s{s:02}"), 1, q, &format!("{s}/{q}")));
        }
    }
    let feed = write(dir.path(), "replays.jsonl", &lines);
    let want = (SOURCES * 2, SOURCES);

    let copy = dir.path().join("copy.redb");
    ok(&["backup", "--db", file, "--to", copy.to_str().unwrap()]);
    assert_eq!(all_tables(&copy), (main, recent, gone));
    let (pg, pg_cfg, _) = pg_store("window_gone", dir.path());
    ok(&[
        "migrate",
        "--from",
        copy.to_str().unwrap(),
        "--config",
        &pg_cfg,
    ]);
    assert_eq!(
        pg.sql("SELECT count(*) FROM replay_guard.window_entries"),
        keep.to_string()
    );
    assert_eq!(ingest_stale(&store, &feed), want);
    assert_eq!(ingest_stale(&["--db", copy.to_str().unwrap()], &feed), want);
    assert_eq!(ingest_stale(&["--config", pg_cfg.as_str()], &feed), want);
    ok(&["verify", "--db", file]);
    ok(&["verify", "--config", &pg_cfg]);

    // 17,000 more new positions evict as many: with the 2,000 evicted before, the evicted
    // entries alone reach the move (`WINDOW_MERGE_AT`), however many went through the
    // small table; it deletes them (found from their effects) and moves the purge mark.
    let mut lines = Vec::new();
    for q in PER_SOURCE + 1..=PER_SOURCE + 425 {
        for s in 0..SOURCES {
            lines.push(msg("wt", &format!("s{s:02}"), 1, q, &format!("{s}/{q}")));
        }
    }
    let more = write(dir.path(), "more.jsonl", &lines);
    assert_eq!(ingest(&store, &more), (17_000, 0, 0));
    let (main, recent, gone) = all_tables(&db);
    let (start, purged) = marks(&db);
    assert_eq!(start, total + 17_000 - keep);
    assert!(purged > total - keep, "{start} {purged}");
    assert_eq!(
        (main + recent, gone),
        (keep + (start - purged), 0),
        "{main} {recent} {gone} {start} {purged}"
    );
    assert_eq!(window_entries(&store), keep);
    ok(&["verify", "--db", file]);
}
