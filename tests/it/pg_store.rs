//! The PostgreSQL store backend against the real server: the reference-model property test
//! the redb file passes; the same feed through both backends gives the same decisions, the
//! same records and the same audit chain; members committing to one schema at once decide
//! as if alone (each key applied once, one verifiable chain).

use std::ops::ControlFlow;
use std::sync::{Arc, Barrier};

use proptest::prelude::*;
use replay_guard::fuzzing::model::{Case, run_case};
use replay_guard::store::postgres::{PgConfig, PgStore};
use replay_guard::store::{Backend, Incoming, Snapshot, Store, StoreError, StoreOptions};
use replay_guard::wire::FeedContract;

use crate::common::{self, SplitMix64};
use crate::model::op;
use crate::pg::PgDb;

fn pg_store(db: &PgDb, schema: &str, opts: StoreOptions) -> Result<PgStore, StoreError> {
    let cfg = PgConfig::parse(&db.dsn(), schema).unwrap();
    PgStore::open(cfg, opts, 1_000)
}

proptest! {
    // Each case makes two schemas on the server: fewer cases than the redb file's 48.
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn postgres_backend_matches_the_reference_model(
        ops in prop::collection::vec(op(), 1..160),
        swaps in prop::collection::vec(any::<usize>(), 0..20),
        batch_sizes in prop::collection::vec(1usize..24, 1..6),
        steps_ms in prop::collection::vec(0u64..3_000, 1..6),
        max_entries in 1u64..24,
        window_secs in 1u64..10,
        quarantine_late in prop::bool::weighted(0.3),
    ) {
        let case = Case { ops, swaps, batch_sizes, steps_ms, max_entries, window_secs, quarantine_late };
        let db = PgDb::new("model");
        let mut n = 0;
        let mut open = |opts| {
            n += 1;
            pg_store(&db, &format!("m{n}"), opts).map(Backend::Postgres)
        };
        run_case(&case, &mut open).map_err(TestCaseError::fail)?;
    }
}

/// A seeded feed: fresh events from 5 sources, exact replays, re-serialised resends,
/// conflicting contents and malformed bytes.
fn feed(seed: u64, n: usize) -> Vec<Vec<u8>> {
    let mut rng = SplitMix64::new(seed);
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut next = [0u64; 5];
    for _ in 0..n {
        let roll = rng.below(100);
        if roll < 15 && !out.is_empty() {
            let i = usize::try_from(rng.below(out.len() as u64)).unwrap();
            let again = out[i].clone();
            out.push(again);
        } else if roll < 20 {
            out.push(format!("{{not json {}", rng.below(7)).into_bytes());
        } else {
            let s = usize::try_from(rng.below(5)).unwrap();
            let conflict = roll < 24 && next[s] > 0;
            if !conflict {
                next[s] += 1;
            }
            let seq = next[s];
            let count = if conflict { 99 } else { seq % 7 };
            let body = format!("casualties {count}");
            out.push(common::msg("fd", &format!("u{s}"), 1, seq, &body).into_bytes());
        }
    }
    out
}

fn batches(feed: &[Vec<u8>], size: usize, t0: u64) -> Vec<(u64, Vec<Incoming>)> {
    let contract = FeedContract::default();
    feed.chunks(size)
        .enumerate()
        .map(|(i, c)| {
            let now = t0 + i as u64 * 250;
            let batch = c
                .iter()
                .map(|p| Incoming::decode("incidents/fd", p.clone(), now, &contract))
                .collect();
            (now, batch)
        })
        .collect()
}

/// Everything a snapshot holds, as comparable text: meta, every audit entry, effect and
/// quarantined message.
fn dump(snap: &Snapshot) -> Vec<String> {
    // The creation time and redb's purge mark (how far it has deleted evicted window
    // entries; PostgreSQL deletes them at eviction) are the fields the two do not share.
    let mut meta = snap.meta().unwrap();
    assert!(meta.window_purged <= meta.window_start, "{meta:?}");
    meta.created_at_ms = 0;
    meta.window_purged = 0;
    let mut out = vec![format!("{meta:?}")];
    snap.scan_audit::<StoreError>(0, |e| {
        out.push(format!("{e:?}"));
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    snap.scan_effects::<StoreError>(0, |e| {
        out.push(format!("{e:?}"));
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    snap.scan_quarantine::<StoreError>(0, |q| {
        out.push(format!("{q:?}"));
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    out.push(format!("{:?}", snap.sources().unwrap()));
    out.push(format!("{:?}", snap.counters().unwrap()));
    out
}

#[test]
fn the_same_feed_gives_the_same_decisions_records_and_chain_on_both_backends() {
    let db = PgDb::new("same");
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        window: replay_guard::store::WindowPolicy {
            seconds: 30,
            max_entries: 150,
        },
        ..StoreOptions::default()
    };
    let mut redb =
        Backend::Redb(Store::open(&dir.path().join("a.redb"), opts.clone(), 1_000).unwrap());
    let mut pg = Backend::Postgres(pg_store(&db, "replay_guard", opts).unwrap());
    let feed = feed(7, 1_500);
    let mut outcomes = std::collections::BTreeMap::new();
    for (now, batch) in batches(&feed, 37, 5_000_000) {
        let a = redb.commit_batch(&batch, now).unwrap();
        let b = pg.commit_batch(&batch, now).unwrap();
        assert_eq!(a.decided, b.decided, "batch at {now}");
        assert_eq!(a.evicted, b.evicted);
        for d in &a.decided {
            *outcomes.entry(d.outcome.to_string()).or_insert(0) += 1;
        }
    }
    // The feed exercised every decision the feed alone can make, and eviction.
    for o in ["applied", "duplicate", "conflict", "malformed"] {
        assert!(outcomes.contains_key(o), "{o} missing: {outcomes:?}");
    }
    let (a, b) = (redb.reader().unwrap(), pg.reader().unwrap());
    assert!(a.meta().unwrap().window_start > 0, "the window evicted");
    let (da, db_) = (dump(&a), dump(&b));
    assert_eq!(da.len(), db_.len());
    for (x, y) in da.iter().zip(&db_) {
        assert_eq!(x, y);
    }
    let contract = FeedContract::default();
    let va = replay_guard::store::verify::verify(&a, &contract).unwrap();
    let vb = replay_guard::store::verify::verify(&b, &contract).unwrap();
    assert!(vb.violation.is_none(), "{:?}", vb.violation);
    assert_eq!(format!("{va:?}"), format!("{vb:?}"));
}

#[test]
fn members_committing_at_once_apply_each_key_once_and_keep_one_chain() {
    let db = PgDb::new("group");
    // Each of 3 members gets every message of the feed, in its own batch sizes and order of
    // batches, and all commit at once: each genuine key must be applied exactly once.
    let feed = feed(11, 600);
    let members = 3;
    let start = Arc::new(Barrier::new(members));
    // Created once (concurrent creation is tested by `migrate_is_safe_from_several_members`).
    drop(pg_store(&db, "replay_guard", StoreOptions::default()).unwrap());
    let handles: Vec<_> = (0..members)
        .map(|m| {
            let feed = feed.clone();
            let start = start.clone();
            let dsn = db.dsn();
            std::thread::spawn(move || {
                let cfg = PgConfig::parse(&dsn, "replay_guard").unwrap();
                let mut store = PgStore::open(cfg, StoreOptions::default(), 1_000).unwrap();
                let mut applied = 0u64;
                let mut bs = batches(&feed, 5 + 7 * m, 9_000_000);
                if m == 1 {
                    bs.reverse();
                }
                start.wait();
                for (now, batch) in bs {
                    let r = store.commit_batch(&batch, now).unwrap();
                    applied += r.decided.iter().filter(|d| d.outcome.applies()).count() as u64;
                }
                applied
            })
        })
        .collect();
    let applied: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();

    let cfg = PgConfig::parse(&db.dsn(), "replay_guard").unwrap();
    let snap = Snapshot::postgres(replay_guard::store::postgres::view::PgView::open(&cfg).unwrap());
    let mut keys = std::collections::HashSet::new();
    let mut effects = 0u64;
    snap.scan_effects::<StoreError>(0, |e| {
        assert!(keys.insert(e.record.key), "key applied twice: {e:?}");
        effects += 1;
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    assert_eq!(
        effects, applied,
        "what the members reported applied is what is stored"
    );
    // Exactly the distinct genuine keys of the feed were applied (one reference run).
    let dir = tempfile::tempdir().unwrap();
    let mut alone =
        Store::open(&dir.path().join("ref.redb"), StoreOptions::default(), 1_000).unwrap();
    let mut alone_applied = 0;
    for (now, batch) in batches(&feed, 50, 9_000_000) {
        let r = alone.commit_batch(&batch, now).unwrap();
        alone_applied += r.decided.iter().filter(|d| d.outcome.applies()).count() as u64;
    }
    assert_eq!(effects, alone_applied);
    let meta = snap.meta().unwrap();
    assert_eq!(
        meta.next_audit,
        3 * feed.len() as u64,
        "one audit entry per delivery"
    );
    let v = replay_guard::store::verify::verify(&snap, &FeedContract::default()).unwrap();
    assert!(v.violation.is_none(), "{:?}", v.violation);
}

#[test]
fn migrate_is_safe_from_several_members_and_refuses_a_newer_schema() {
    let db = PgDb::new("migrate");
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let dsn = db.dsn();
            std::thread::spawn(move || {
                let cfg = PgConfig::parse(&dsn, "shared").unwrap();
                PgStore::open(cfg, StoreOptions::default(), 1_000).map(|_| ())
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    assert_eq!(db.sql("SELECT version FROM shared.schema_version"), "5");
    assert_eq!(db.sql("SELECT count(*) FROM shared.meta"), "2");
    db.sql("UPDATE shared.schema_version SET version = 99");
    let err = pg_store(&db, "shared", StoreOptions::default())
        .err()
        .expect("a newer schema is refused");
    assert!(err.to_string().contains("schema version 99"), "{err}");
}

#[test]
fn connections_terminated_mid_surge_lose_nothing_and_apply_nothing_twice() {
    let db = PgDb::new("cut");
    let feed = feed(23, 2_000);
    let mut store = pg_store(&db, "replay_guard", StoreOptions::default()).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let stop = stop.clone();
        let name = db.name.clone();
        std::thread::spawn(move || {
            let db = PgDb::existing(&name);
            let mut killed = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(15));
                killed += db.terminate_connections();
            }
            killed
        })
    };
    let mut unreachable = 0;
    let mut applied = 0u64;
    // The feed, then its replays (a broker redelivering it), until the connection was lost
    // under at least 5 commits (how many a pass meets depends on the machine's speed).
    for pass in 0.. {
        if pass > 0 && (unreachable >= 5 || pass == 20) {
            break;
        }
        for (now, batch) in batches(&feed, 20, 7_000_000) {
            // What `run` does: the batch stays unacknowledged and is committed again until
            // the server answers; a COMMIT that landed unanswered makes the retry's messages
            // duplicates.
            loop {
                match store.commit_batch(&batch, now) {
                    Ok(r) => {
                        applied += r.decided.iter().filter(|d| d.outcome.applies()).count() as u64;
                        break;
                    }
                    Err(StoreError::Unreachable(_)) => unreachable += 1,
                    Err(e) => panic!("{e}"),
                }
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let killed = killer.join().unwrap();
    assert!(
        killed >= 5 && unreachable >= 5,
        "killed {killed}, retried {unreachable}"
    );

    let dir = tempfile::tempdir().unwrap();
    let mut alone =
        Store::open(&dir.path().join("ref.redb"), StoreOptions::default(), 1_000).unwrap();
    let mut want = 0;
    for (now, batch) in batches(&feed, 20, 7_000_000) {
        let r = alone.commit_batch(&batch, now).unwrap();
        want += r.decided.iter().filter(|d| d.outcome.applies()).count() as u64;
    }
    let snap = Backend::Postgres(store).reader().unwrap();
    let mut keys = std::collections::HashSet::new();
    snap.scan_effects::<StoreError>(0, |e| {
        assert!(keys.insert(e.record.key), "key applied twice: {e:?}");
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    assert_eq!(keys.len() as u64, want, "every genuine event applied once");
    assert!(applied <= want);
    let v = replay_guard::store::verify::verify(&snap, &FeedContract::default()).unwrap();
    assert!(v.violation.is_none(), "{:?}", v.violation);
}

/// A `dump-*` JSON line without the fields that depend on the clock (the times, and the
/// hashes over them).
fn timeless(line: &str) -> String {
    let mut out = line.to_string();
    for key in [
        "recorded_at",
        "received_at",
        "last_seen_at",
        "prev_hash",
        "hash",
    ] {
        let pat = format!("\"{key}\":");
        while let Some(at) = out.find(&pat) {
            let rest = &out[at + pat.len()..];
            let end = rest
                .find(",\"")
                .map_or(out.len() - 1, |e| at + pat.len() + e + 1);
            out.replace_range(at..end, "");
        }
    }
    out
}

#[test]
fn the_operator_commands_work_on_postgres_through_the_config_and_print_what_redb_prints() {
    let db = PgDb::new("cmds");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pg.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\nbackend = \"postgres\"\ndsn = \"{}\"\nschema = \"eoc\"\n",
            db.dsn()
        ),
    )
    .unwrap();
    let file = dir.path().join("a.redb");
    let feed = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/release-f2ebb61/feed.jsonl"
    );
    let (cfg, file) = (cfg.to_str().unwrap(), file.to_str().unwrap());
    let ok = |args: &[&str]| {
        let out = common::run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    ok(&["ingest", "--config", cfg, feed]);
    ok(&["ingest", "--db", file, feed]);
    for cmd in ["dump-audit", "dump-effects", "dump-quarantine"] {
        let (pg, _) = ok(&[cmd, "--config", cfg]);
        let (rd, _) = ok(&[cmd, "--db", file]);
        let pg: Vec<String> = pg.lines().map(timeless).collect();
        let rd: Vec<String> = rd.lines().map(timeless).collect();
        assert!(!pg.is_empty());
        assert_eq!(pg, rd, "{cmd}");
    }
    for args in [
        &[
            "quarantine",
            "release",
            "--operator",
            "ops",
            "--reason",
            "confirmed by phone",
            "0",
        ][..],
        &[
            "quarantine",
            "discard",
            "--operator",
            "ops",
            "--reason",
            "not json",
            "1",
        ][..],
    ] {
        let (pg, _) = ok(&[args, &["--config", cfg]].concat());
        let (rd, _) = ok(&[args, &["--db", file]].concat());
        assert_eq!(pg, rd);
    }
    let (pg, _) = ok(&["verify", "--config", cfg]);
    let (rd, _) = ok(&["verify", "--db", file]);
    assert!(
        pg.contains("schema eoc: 33 audit entries, hash chain intact"),
        "{pg}"
    );
    assert_eq!(
        pg.split_once(": ").unwrap().1,
        rd.split_once(": ").unwrap().1
    );
    let (pg, _) = ok(&["gaps", "--config", cfg]);
    let (rd, _) = ok(&["gaps", "--db", file]);
    assert_eq!(pg, rd);
    let (pg, _) = ok(&[
        "explain",
        "--config",
        cfg,
        "--source",
        "fd/e1",
        "--epoch",
        "1",
        "--sequence",
        "3",
    ]);
    assert!(pg.contains("still in the dedup window"), "{pg}");
    let (pg, _) = ok(&["stats", "--config", cfg]);
    assert!(pg.contains("decisions      33"), "{pg}");
    // Nothing of the password-less dsn is a secret, but the config never echoes it.
    let bad = common::run(&["dump-audit", "--config", cfg, "--db", file]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("drop --db"));
}

#[test]
fn migrate_copies_a_redb_database_into_a_new_schema_verifies_it_and_the_window_carries_over() {
    let db = PgDb::new("migrate_from");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("pg.toml");
    std::fs::write(
        &cfg,
        format!("[store]\nbackend = \"postgres\"\ndsn = \"{}\"\n", db.dsn()),
    )
    .unwrap();
    let file = dir.path().join("host.redb");
    let feed = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/release-f2ebb61/feed.jsonl"
    );
    let (cfg, file) = (cfg.to_str().unwrap(), file.to_str().unwrap());
    let run = |args: &[&str]| {
        let out = common::run(args);
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    assert_eq!(run(&["ingest", "--db", file, feed]).0, Some(0));
    let (code, out, err) = run(&["migrate-schema", "--config", cfg]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("schema replay_guard: schema version 5 (created)"),
        "{out}"
    );
    let (code, out, err) = run(&["migrate-schema", "--config", cfg]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("(already current)"), "{out}");

    let (code, out, err) = run(&["migrate", "--from", file, "--config", cfg]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("31 audit entries, 25 effects, 25 window entries, 2 quarantined, 2 sources; verified: chain head"), "{out}");
    // Record for record, hashes and times included.
    for cmd in ["dump-audit", "dump-effects", "dump-quarantine"] {
        assert_eq!(
            run(&[cmd, "--config", cfg]).1,
            run(&[cmd, "--db", file]).1,
            "{cmd}"
        );
    }
    // The first effect's payload damaged on the shared store: it gives no digest (effect
    // record version 4 reads its digest from its payload, and the copied window entry leaves
    // it to the effect), so the window takes the one its applying audit entry recorded.
    db.sql(
        "UPDATE replay_guard.effects SET record = set_byte(record, length(record) - 2, 123) \
         WHERE effect_offset = 0",
    );
    let (_, effects, _) = run(&["dump-effects", "--config", cfg]);
    assert!(
        effects.lines().next().unwrap().contains("payload_error"),
        "{effects}"
    );
    // The window came along: the host's replays are duplicates on the shared store.
    let (code, _, err) = run(&["ingest", "--config", cfg, feed]);
    assert_eq!(code, Some(0), "{err}");
    let words: Vec<&str> = err.split_whitespace().collect();
    assert!(words.windows(2).any(|w| w == ["applied", "0"]), "{err}");
    assert!(words.windows(2).any(|w| w == ["duplicate", "29"]), "{err}");
    // A second copy into the now non-empty schema is refused; the schema is untouched.
    let (code, _, err) = run(&["migrate", "--from", file, "--config", cfg]);
    assert_eq!(code, Some(1));
    assert!(err.contains("already holds decisions"), "{err}");
    assert_eq!(db.sql("SELECT count(*) FROM replay_guard.audit_log"), "62");
    // A redb config is not a migration target.
    let (code, _, err) = run(&["migrate", "--from", file, "--config", "/dev/null"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("backend = \"postgres\""), "{err}");
}

/// A redb file whose writer has evicted effects since its last merge of the window's small
/// tables still holds their entries (out of the window by its start, deleted at the merge):
/// the copy leaves them out, as the PostgreSQL writer deletes an evicted entry at once.
#[test]
fn migrate_leaves_out_the_window_entries_of_effects_evicted_since_the_last_merge() {
    let db = PgDb::new("migrate_evicted");
    let dir = tempfile::tempdir().unwrap();
    let pg = dir.path().join("pg.toml");
    std::fs::write(
        &pg,
        format!("[store]\nbackend = \"postgres\"\ndsn = \"{}\"\n", db.dsn()),
    )
    .unwrap();
    let small = dir.path().join("small.toml");
    std::fs::write(&small, "[window]\nmax_entries = 10\n").unwrap();
    let file = dir.path().join("host.redb");
    let feed = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/release-f2ebb61/feed.jsonl"
    );
    let (pg, small, file) = (
        pg.to_str().unwrap(),
        small.to_str().unwrap(),
        file.to_str().unwrap(),
    );
    let run = |args: &[&str]| {
        let out = common::run(args);
        (
            out.status.code(),
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    let (code, _, err) = run(&["ingest", "--config", small, "--db", file, feed]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = run(&["stats", "--db", file, "--format", "json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("\"window\":{\"entries\":10,"), "{out}");
    let (code, _, err) = run(&["migrate-schema", "--config", pg]);
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) = run(&["migrate", "--from", file, "--config", pg]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("25 effects, 10 window entries"), "{out}");
    assert_eq!(
        db.sql("SELECT count(*) FROM replay_guard.window_entries"),
        "10"
    );
    // The copy decides like the file: the last ten are duplicates, the evicted are not.
    let (code, _, err) = run(&["ingest", "--config", pg, feed]);
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err2) = run(&["ingest", "--config", small, "--db", file, feed]);
    assert_eq!(code, Some(0), "{err2}");
    // The summary's counts (after its first line, which names the database).
    let tally = |e: &str| -> Vec<String> {
        e.lines()
            .skip_while(|l| !l.starts_with("replay-guard ingest:"))
            .skip(1)
            .map(String::from)
            .collect()
    };
    assert!(tally(&err).iter().any(|l| l.contains("duplicate")), "{err}");
    assert_eq!(tally(&err), tally(&err2), "{err}\n{err2}");
}
