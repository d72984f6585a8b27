//! redb keeps the dedup window's newest entries in a small table of their own
//! (`WINDOW_RECENT`) and moves them into the window's main table every
//! `WINDOW_MERGE_AT` entries. Through the real binary: a feed that crosses a move decides
//! its replays as duplicates and conflicts whichever table holds the original, `stats`
//! counts both tables, `verify` passes, an operator's release replaces an entry of the main
//! table, and `backup` and `migrate --from` (PostgreSQL, one
//! window table) carry both tables' entries, so the copies decide the same replays the same.

use std::path::{Path, PathBuf};

use redb::{ReadableDatabase as _, ReadableTableMetadata as _};
use replay_guard::json::parse;
use replay_guard::store::tables::{WINDOW, WINDOW_MERGE_AT, WINDOW_RECENT};

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

/// (applied, duplicate, conflict) of an ingest's summary.
fn outcomes(summary: &str) -> (u64, u64, u64) {
    let count = |name: &str| -> u64 {
        summary
            .lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some(name)).then(|| w.next().unwrap().parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no {name} line in {summary}"))
    };
    (count("applied"), count("duplicate"), count("conflict"))
}

fn ingest(store: &[&str], feed: &str) -> (u64, u64, u64) {
    let (code, _, err) = crate::key_index::run(&[&["ingest"][..], store, &[feed]].concat());
    assert_eq!(code, Some(0), "{err}");
    outcomes(&err)
}

/// Entries in (`WINDOW`, `WINDOW_RECENT`) of a redb file.
fn tables(db: &Path) -> (u64, u64) {
    let file = redb::Database::open(db).unwrap();
    let txn = file.begin_read().unwrap();
    let main = txn.open_table(WINDOW.raw()).unwrap().len().unwrap();
    let recent = txn.open_table(WINDOW_RECENT.raw()).unwrap().len().unwrap();
    (main, recent)
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
    // position is then in one table only, the released content is the duplicate and the
    // original content the conflict.
    let (main_before, recent_before) = tables(&db);
    ok(&[
        "quarantine",
        "release",
        "0",
        "--db",
        file,
        "--reason",
        "genuine",
    ]);
    let (main_after, recent_after) = tables(&db);
    assert_eq!(
        (main_after, recent_after),
        (main_before - 1, recent_before + 1)
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
