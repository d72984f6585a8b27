//! Databases written by earlier releases keep working. The redb file format is unchanged by
//! the store API split: a database written by release f2ebb61 (`tests/fixtures/release-f2ebb61/`,
//! made by that commit's `ingest` of `feed.jsonl`) reads back record for record as that release
//! printed it, verifies, and takes new writes that decide its replays as duplicates. A
//! database with a relay sink written by release 89ca245 (`tests/fixtures/release-89ca245/`:
//! its `ingest` of `feed.jsonl`, then its `relay` with `config.toml`, whose `receiver.sh`
//! refuses the two events of sequence 3; its outputs saved beside) reads its version-1 sink
//! cursor and parked events as that release printed them, verifies, and its sink carries on:
//! the cursor is rewritten at this version's record version (3) with a ledger from there.
//! A database of the last build before the audit and effect records' version 2
//! (`tests/fixtures/records-v1-85f2bf2/`: that build's `ingest` of `feed.jsonl`, with late,
//! duplicate, conflicting and malformed messages, then `quarantine release 2` and
//! `quarantine discard 1` by `j.doe`; its outputs saved beside) reads back as it printed it,
//! and its new entries (version 2) and old ones (version 1) verify as one chain.
//! A database of the last build before the effect record's version 3 and the window entry's
//! version 2 (`tests/fixtures/records-v2-349acce/`: that build's `ingest` of `feed.jsonl`, with
//! duplicates, a late message, a conflict and a malformed line, then `quarantine release 0`
//! by `j.doe`; its outputs saved beside) reads back as it printed it, and its window (entries
//! holding their digests, beside effects without) decides replays beside the new entries
//! (which leave the digest to their effects), and its audit entries (their hashes stored)
//! chain on with new ones that leave the hash out (audit record version 3).
//! A database of the last build of schema version 5 (`tests/fixtures/records-v3-c288fa8/`:
//! that build's `ingest` of the same feed, then `quarantine release 0` by `j.doe`; its outputs
//! saved beside), whose effects hold their digests (effect record version 3), reads back as it
//! printed it, is taken to schema version 6 by its first writer, and decides replays of its
//! effects beside new effects that leave the digest to their payload (effect record version 4).
//! A database of the last build of schema version 6 (`tests/fixtures/records-v4-d22fd6c/`:
//! made the same way), whose audit entries hold their `prev_hash` (audit record version 3),
//! reads back as it printed it, is taken to schema version 8 (7, then 8: nothing rewritten) by
//! its first writer, and its entries chain on with new ones that leave their `prev_hash` to the entry before (audit
//! record version 4); an edit of one of its entries is still named alone.

use std::path::Path;

use crate::common::run;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/release-f2ebb61"
);
const RECORDS_V1_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/records-v1-85f2bf2"
);
const RECORDS_V2_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/records-v2-349acce"
);
const RECORDS_V3_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/records-v3-c288fa8"
);
/// When `RECORDS_V3_FIXTURE` was written (its last effect's `received_at`), in ms.
const RECORDS_V3_WRITTEN_MS: u64 = 1_796_543_969_981;
const RECORDS_V4_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/records-v4-d22fd6c"
);
/// When `RECORDS_V4_FIXTURE` was written (its last effect's `received_at`), in ms.
const RECORDS_V4_WRITTEN_MS: u64 = 1_796_556_639_296;
/// When `RECORDS_V2_FIXTURE` was written (its last effect's `received_at`), in ms.
const RECORDS_V2_WRITTEN_MS: u64 = 1_796_458_589_148;
const RELAY_FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/release-89ca245"
);

fn stdout(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Copies `fixture`'s database into `dir` and checks that it reads back as the build that
/// wrote it printed it (the three dumps and `verify`); the copy.
fn fixture_reads_as_printed(fixture: &str, dir: &Path) -> std::path::PathBuf {
    let db = dir.join("prev.redb");
    std::fs::copy(Path::new(fixture).join("prev.redb"), &db).unwrap();
    let db_s = db.to_str().unwrap();
    let saved = |name: &str| std::fs::read_to_string(Path::new(fixture).join(name)).unwrap();
    for cmd in ["dump-audit", "dump-effects", "dump-quarantine"] {
        assert_eq!(
            stdout(&[cmd, "--db", db_s]),
            saved(&format!("{cmd}.jsonl")),
            "{cmd}"
        );
    }
    assert_eq!(
        stdout(&["verify", "--db", db_s]),
        saved("verify.txt").replace("prev.redb", db_s)
    );
    db
}

/// The outcomes of one batch of `lines` committed through the library at `at` (a fixture's
/// window has not aged out a minute after it was written; `ingest` decides at the wall
/// clock).
fn decide_at(
    store: &mut replay_guard::store::Store,
    at: u64,
    lines: &[String],
) -> Vec<replay_guard::model::Outcome> {
    let contract = replay_guard::wire::FeedContract::default();
    let batch: Vec<replay_guard::store::Incoming> = lines
        .iter()
        .map(|l| replay_guard::store::Incoming::decode("t", l.clone().into_bytes(), at, &contract))
        .collect();
    let report = store.commit_batch(&batch, at).unwrap();
    report.decided.iter().map(|d| d.outcome).collect()
}

/// The records fixtures' tests' first batch: replays of the fixture's messages (an applied
/// one, the operator-released one, a late one), other content at an old position, then two
/// new positions.
fn first_replays() -> Vec<String> {
    let msg = crate::common::msg;
    vec![
        msg("fd", "e1", 1, 3, "count 3"),
        msg("fd", "e1", 1, 5, "count 50"),
        msg("ems", "m2", 2, 3, "on scene, triage"),
        msg("fd", "e1", 1, 4, "count 40"),
        msg("fd", "e1", 1, 7, "count 7"),
        msg("ems", "m2", 2, 5, "at hospital"),
    ]
}

/// What the records fixtures' tests check after deciding the same replays (the fixtures'
/// feed, then two batches): the whole record verifies, and the conflict at fd/e1 epoch 1
/// sequence 7 is told.
fn after_the_records_fixtures_replays(db: &str) {
    let verified = stdout(&["verify", "--db", db]);
    assert!(
        verified.contains("24 audit entries, hash chain intact from the first entry; 13 effects"),
        "{verified}"
    );
    let at = ["--source", "fd/e1", "--epoch", "1", "--sequence", "7"];
    let explained = stdout(&[&["explain", "--db", db][..], &at[..]].concat());
    assert!(explained.contains("conflict"), "{explained}");
}

#[test]
fn a_database_written_by_the_previous_release_reads_verifies_and_takes_new_writes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("prev.redb");
    std::fs::copy(Path::new(FIXTURE).join("prev.redb"), &db).unwrap();
    let db_s = db.to_str().unwrap();
    for cmd in ["dump-audit", "dump-effects", "dump-quarantine"] {
        let want =
            std::fs::read_to_string(Path::new(FIXTURE).join(format!("{cmd}.jsonl"))).unwrap();
        assert_eq!(stdout(&[cmd, "--db", db_s]), want, "{cmd}");
    }
    let want = std::fs::read_to_string(Path::new(FIXTURE).join("verify.txt"))
        .unwrap()
        .replace("prev.redb", db_s);
    assert_eq!(stdout(&["verify", "--db", db_s]), want);

    // New events extend the old record: applied, on the old chain. (The old window has aged
    // out since the fixture was made: a replay of it would be `stale`, by time alone.)
    let more: String = (21..26)
        .map(|q| crate::common::msg("fd", "e1", 1, q, &format!("count {q}")) + "\n")
        .collect();
    let feed = dir.path().join("more.jsonl");
    std::fs::write(&feed, more).unwrap();
    let out = run(&["ingest", "--db", db_s, feed.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stderr).to_string();
    let words: Vec<&str> = report.split_whitespace().collect();
    assert!(words.windows(2).any(|w| w == ["applied", "5"]), "{report}");
    let audit = stdout(&["dump-audit", "--db", db_s]);
    assert_eq!(audit.lines().count(), 36);
    assert!(audit.lines().nth(31).unwrap().contains(
        "\"prev_hash\":\"5e5e28b61dcd02a554ed8b2997da0dc1b64bfa39cccff987fa6790c1bfc9cc6a\""
    ));
    assert!(stdout(&["verify", "--db", db_s]).contains("36 audit entries, hash chain intact"));
}

#[test]
fn a_relay_database_written_by_release_89ca245_reads_verifies_and_its_sink_carries_on() {
    use replay_guard::json::{self, Json};
    use replay_guard::store::tables::SINK_CURSORS;

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("prev.redb");
    std::fs::copy(Path::new(RELAY_FIXTURE).join("prev.redb"), &db).unwrap();
    let received = dir.path().join("received.jsonl");
    let cfg = dir.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\npath = {:?}\n\n[[sink]]\nname = \"cop\"\nkind = \"exec\"\n\
             command = [\"/bin/sh\", \"-c\", \"cat >> {}\"]\nbackoff_initial_ms = 10\n\
             backoff_max_ms = 40\n",
            db.to_str().unwrap(),
            received.to_str().unwrap()
        ),
    )
    .unwrap();
    let (db_s, cfg_s) = (db.to_str().unwrap(), cfg.to_str().unwrap());
    let fixture =
        |name: &str| std::fs::read_to_string(Path::new(RELAY_FIXTURE).join(name)).unwrap();
    // Read as that release printed it.
    assert_eq!(
        stdout(&["relay", "parked", "--config", cfg_s, "--sink", "cop"]),
        fixture("relay-parked.jsonl")
    );
    let old = json::parse(fixture("relay-status.json").trim().as_bytes(), 64).unwrap();
    let new = json::parse(
        stdout(&["relay", "status", "--config", cfg_s, "--format", "json"])
            .trim()
            .as_bytes(),
        64,
    )
    .unwrap();
    let sink = |doc: &Json| -> Vec<(String, Json)> {
        let Json::Object(top) = doc else { panic!() };
        let Json::Array(sinks) = &top[0].1 else {
            panic!()
        };
        let Json::Object(m) = &sinks[0] else { panic!() };
        m.clone()
    };
    let new_sink = sink(&new);
    for (k, v) in sink(&old) {
        let got = new_sink
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.clone());
        // That release called a sink at the head with a parked event `caught_up`; a parked
        // event never reached the receiver, so this one says `parked`.
        let v = match (k.as_str(), &v) {
            ("state", Json::String(s)) if s == "caught_up" => Json::String("parked".into()),
            _ => v,
        };
        assert_eq!(got, Some(v), "{k}");
    }
    let accounting = new_sink.iter().find(|(n, _)| n == "accounting").unwrap();
    assert!(
        accounting.1.to_compact().contains("not yet"),
        "{:?}",
        accounting.1
    );
    let verified = stdout(&["verify", "--db", db_s]);
    let first = fixture("verify.txt").replace("prev.redb", db_s);
    assert!(verified.starts_with(&first), "{verified}");
    assert!(
        verified.contains(
            "sink cop: cursor at 25 written before ledgers: its offsets are accounted for from its \
             next move on; 2 parked events match the events their effects make"
        ),
        "{verified}"
    );
    // A read leaves the file as it was: no id drawn.
    let stats = stdout(&["stats", "--db", db_s, "--format", "json"]);
    assert!(stats.contains("\"store_id\":null"), "{stats}");

    // The sink carries on with this version: 5 new effects and the two parked ones retried.
    let more: String = (40..45)
        .map(|q| crate::common::msg("fd", "e9", 1, q, "new") + "\n")
        .collect();
    let feed = dir.path().join("more.jsonl");
    std::fs::write(&feed, more).unwrap();
    stdout(&["ingest", "--config", cfg_s, feed.to_str().unwrap()]);
    stdout(&[
        "relay",
        "retry",
        "--config",
        cfg_s,
        "--sink",
        "cop",
        "--all",
        "--reason",
        "unit E3 added",
        "--operator",
        "ana",
    ]);
    let mut relay =
        crate::common::logged_command(&["relay", "--config", cfg_s], &dir.path().join("relay.log"))
            .spawn()
            .unwrap();
    crate::common::wait_until(
        "7 events arrive",
        std::time::Duration::from_secs(30),
        || std::fs::read_to_string(&received).map_or(0, |t| t.lines().count()) >= 7,
    );
    super::broker::signal(relay.id() as i32, "TERM");
    assert!(relay.wait().unwrap().success());
    assert_eq!(
        stdout(&["relay", "parked", "--config", cfg_s, "--sink", "cop"]),
        ""
    );
    let verified = stdout(&["verify", "--config", cfg_s]);
    assert!(
        verified.contains(
            "sink cop: every offset from 25 to its cursor 30 accounted for (recorded since the \
             upgrade to ledgers): 5 delivered"
        ),
        "{verified}"
    );
    let stats = stdout(&["stats", "--db", db_s, "--format", "json"]);
    assert!(!stats.contains("\"store_id\":null"), "{stats}");
    // Nothing was offered twice: the old cursor reads as one that offered nothing past it.
    let status = stdout(&["relay", "status", "--config", cfg_s, "--format", "json"]);
    assert!(status.contains("\"resent\":0"), "{status}");
    // The cursor record is now of this version's record version (4: it knows its stream, how
    // far it offered and what it re-sent).
    let file = redb::Builder::new()
        .set_concurrency_mode(redb::ConcurrencyMode::SingleWriter)
        .open(&db)
        .unwrap();
    let txn = redb::ReadableDatabase::begin_read(&file).unwrap();
    let t = txn.open_table(SINK_CURSORS.raw()).unwrap();
    let bytes = redb::ReadableTable::get(&t, "cop")
        .unwrap()
        .unwrap()
        .value()
        .to_vec();
    assert_eq!(bytes[0], 4);
}

#[test]
fn audit_and_effect_records_of_version_1_read_back_and_chain_on_with_version_2() {
    use replay_guard::store::tables::{AUDIT, EFFECTS};

    let dir = tempfile::tempdir().unwrap();
    let db = fixture_reads_as_printed(RECORDS_V1_FIXTURE, dir.path());
    let db_s = db.to_str().unwrap();
    let fixture =
        |name: &str| std::fs::read_to_string(Path::new(RECORDS_V1_FIXTURE).join(name)).unwrap();

    // New entries of every common reason: a new source, its next positions, a late one, two
    // replays, and a replay of an old effect (stale: the fixture's window has aged out).
    let mut more: Vec<String> = [1, 2, 4, 3, 1, 2]
        .iter()
        .map(|&q| crate::common::msg("ems", "m2", 7, q, "transporting"))
        .collect();
    more.extend(fixture("feed.jsonl").lines().take(1).map(str::to_string));
    let feed = dir.path().join("more.jsonl");
    std::fs::write(&feed, more.join("\n") + "\n").unwrap();
    stdout(&["ingest", "--db", db_s, feed.to_str().unwrap()]);

    // The old entries print as before; the new ones follow on the same chain.
    let audit = stdout(&["dump-audit", "--db", db_s]);
    let old = fixture("dump-audit.jsonl");
    assert!(audit.starts_with(&old));
    let new: Vec<&str> = audit[old.len()..].lines().collect();
    assert_eq!(new.len(), 7);
    for (line, want) in new.iter().zip([
        "\"reason\":\"first message from this source\"",
        "\"reason\":\"new position above high-water mark (epoch 7 sequence 1)\"",
        "\"reason\":\"new position above high-water mark (epoch 7 sequence 2)\"",
        "\"reason\":\"below high-water mark (epoch 7 sequence 4) but key never seen: late, \
         provably not yet applied\"",
        "\"reason\":\"same key and content as effect #29\"",
        "\"reason\":\"same key and content as effect #30\"",
        "\"outcome\":\"stale\"",
    ]) {
        assert!(line.contains(want), "{line}");
    }
    assert!(stdout(&["dump-effects", "--db", db_s]).starts_with(&fixture("dump-effects.jsonl")));
    let verified = stdout(&["verify", "--db", db_s]);
    assert!(
        verified.contains("45 audit entries, hash chain intact from the first entry; 33 effects"),
        "{verified}"
    );
    let explained = stdout(&[
        "explain",
        "--db",
        db_s,
        "--source",
        "ems/m2",
        "--epoch",
        "7",
        "--sequence",
        "3",
    ]);
    assert!(explained.contains("applied_late"), "{explained}");

    // The file holds both versions, and a new entry is smaller than an old one of its kind.
    let file = redb::Builder::new()
        .set_concurrency_mode(redb::ConcurrencyMode::SingleWriter)
        .open(&db)
        .unwrap();
    let txn = redb::ReadableDatabase::begin_read(&file).unwrap();
    let raw = |table: redb::TableDefinition<u64, &[u8]>, key: u64| {
        let t = txn.open_table(table).unwrap();
        let bytes = redb::ReadableTable::get(&t, key).unwrap().unwrap();
        bytes.value().to_vec()
    };
    // Entries 2 and 40: "new position above high-water mark", applied, one digit of sequence.
    // Since record version 3 the entry also leaves out its hash (32 bytes for a 1-byte tag),
    // and since version 4 its presence tags are one varint.
    let (old, new) = (raw(AUDIT.raw(), 2), raw(AUDIT.raw(), 40));
    assert_eq!((old[0], new[0]), (1, 4));
    assert!(
        new.len() + 32 + 50 + 31 <= old.len(),
        "{} vs {}",
        new.len(),
        old.len()
    );
    // Effects 0 and 30, less their strings: the key's 32 bytes are a one-byte tag (and the
    // new one holds the content digest since record version 3, as a one-byte tag since
    // version 4, its payload's digest).
    let fixed = |bytes: &[u8]| {
        let r = EFFECTS.decode(&0, bytes).unwrap();
        bytes.len() - r.payload.len() - r.agency.len() - r.source_id.len() - r.topic.len()
    };
    let (old, new) = (raw(EFFECTS.raw(), 0), raw(EFFECTS.raw(), 30));
    assert_eq!((old[0], new[0]), (1, 4));
    assert!(
        fixed(&new) + 31 <= fixed(&old) + 1,
        "{} vs {}",
        fixed(&new),
        fixed(&old)
    );
}

#[test]
fn window_entries_with_their_digest_decide_replays_beside_entries_that_leave_it_to_the_effect() {
    use replay_guard::model::Outcome;
    use replay_guard::store::tables::{AUDIT, EFFECTS, SOURCE_IDS, WINDOW, WINDOW_RECENT};
    use replay_guard::store::{Store, StoreOptions};

    let dir = tempfile::tempdir().unwrap();
    let db = fixture_reads_as_printed(RECORDS_V2_FIXTURE, dir.path());
    let db_s = db.to_str().unwrap();
    // Decided a minute after the fixture was written.
    let at = RECORDS_V2_WRITTEN_MS + 60_000;
    let decide = |store: &mut Store, lines: &[String]| decide_at(store, at, lines);
    let msg = crate::common::msg;
    let mut store = Store::open(&db, StoreOptions::default(), at).unwrap();
    let old = decide(
        &mut store,
        // Replays of the fixture's messages found in its window (each entry with its digest,
        // each effect without); new positions: effects with the digest, entries without.
        &first_replays(),
    );
    use Outcome::*;
    assert_eq!(
        old,
        [Duplicate, Duplicate, Duplicate, Conflict, Applied, Applied]
    );
    // Replays of the new ones, in a later batch: the digest comes from the effect.
    let new = decide(
        &mut store,
        &[
            msg("fd", "e1", 1, 7, "count 7"),
            msg("ems", "m2", 2, 5, "at hospital"),
            msg("fd", "e1", 1, 7, "count 70"),
        ],
    );
    assert_eq!(new, [Duplicate, Duplicate, Conflict]);
    store.close().unwrap();
    after_the_records_fixtures_replays(db_s);

    // The file holds both versions of each: an old window entry with its 32-byte digest, a
    // new one of a few bytes; an old effect without the digest, a new one with it (from
    // effect record version 4 as its payload's, recomputed when read).
    let file = redb::Builder::new()
        .set_concurrency_mode(redb::ConcurrencyMode::SingleWriter)
        .open(&db)
        .unwrap();
    let txn = redb::ReadableDatabase::begin_read(&file).unwrap();
    let ids = txn.open_table(SOURCE_IDS).unwrap();
    let no = redb::ReadableTable::get(&ids, ("fd", "e1"))
        .unwrap()
        .unwrap()
        .value();
    // The newest entries are in the window's small table until they move (`WINDOW_RECENT`).
    let tables = [
        txn.open_table(WINDOW_RECENT.raw()).unwrap(),
        txn.open_table(WINDOW.raw()).unwrap(),
    ];
    let entry = |seq: u64| {
        tables
            .iter()
            .find_map(|t| redb::ReadableTable::get(t, (no, 1, seq)).unwrap())
            .unwrap()
            .value()
            .to_vec()
    };
    let (old, new) = (entry(3), entry(7));
    assert_eq!((old[0], new[0]), (1, 2));
    assert!(
        old.len() >= 33 && new.len() <= 4,
        "{} {}",
        old.len(),
        new.len()
    );
    let effects = txn.open_table(EFFECTS.raw()).unwrap();
    let first = |offset: u64| {
        let bytes = redb::ReadableTable::get(&effects, offset).unwrap().unwrap();
        bytes.value()[0]
    };
    assert_eq!((first(0), first(11)), (2, 4));
    // Audit entries: the fixture's store their hashes (version 2), the new ones, chained at
    // their index, leave them out (version 3); `verify` above read them as one chain.
    let audit = txn.open_table(AUDIT.raw()).unwrap();
    let stored = |index: u64| {
        let bytes = redb::ReadableTable::get(&audit, index).unwrap().unwrap();
        bytes.value().to_vec()
    };
    let (old, new) = (stored(0), stored(23));
    assert_eq!((old[0], new[0]), (2, 4));
    // Record version 4 also leaves out the `prev_hash` of an entry chained after one the
    // table holds: alone it does not decode; read from the table it takes entry 22's hash.
    assert!(AUDIT.decode(&23, &new).is_err());
    let opened = AUDIT.open(&txn).unwrap();
    let entry = |index: u64| opened.get(index).unwrap().unwrap();
    assert_eq!(entry(22).hash, entry(23).prev_hash);
    assert_eq!(
        entry(23).hash,
        replay_guard::store::audit_entry_hash(23, &entry(23), &entry(22).hash),
        "recomputed at its index"
    );
}

#[test]
fn effects_holding_their_digest_decide_replays_beside_effects_that_leave_it_to_their_payload() {
    use replay_guard::model::Outcome;
    use replay_guard::store::tables::{EFFECTS, META, META_TABLE};
    use replay_guard::store::{Store, StoreOptions};

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("prev.redb");
    let schema = || {
        let file = redb::Database::open(&db).unwrap();
        let txn = redb::ReadableDatabase::begin_read(&file).unwrap();
        let meta = META
            .get(&txn.open_table(META_TABLE).unwrap())
            .unwrap()
            .unwrap();
        meta.schema_version
    };
    // Read as that build printed it, before any writer of this one opened it.
    assert_eq!(fixture_reads_as_printed(RECORDS_V3_FIXTURE, dir.path()), db);
    let db_s = db.to_str().unwrap();
    let fixture =
        |name: &str| std::fs::read_to_string(Path::new(RECORDS_V3_FIXTURE).join(name)).unwrap();
    assert_eq!(schema(), 5);
    // Decided a minute after the fixture was written.
    let at = RECORDS_V3_WRITTEN_MS + 60_000;
    let decide = |store: &mut Store, lines: &[String]| decide_at(store, at, lines);
    let msg = crate::common::msg;
    let mut store = Store::open(&db, StoreOptions::default(), at).unwrap();
    use Outcome::*;
    // Replays of the fixture's effects (each holding its digest); new positions: effects that
    // leave the digest to their payload.
    assert_eq!(
        decide(&mut store, &first_replays()),
        [Duplicate, Duplicate, Duplicate, Conflict, Applied, Applied]
    );
    // Replays of the new ones in a later batch, one spelled otherwise (the same canonical
    // content): the digest is recomputed from the stored payload; other content conflicts.
    let respelled =
        r#"{ "body": "count 7", "sequence": 7, "epoch": 1, "source_id": "e1", "agency": "fd" }"#;
    let new = [
        respelled.to_string(),
        msg("ems", "m2", 2, 5, "at hospital"),
        msg("fd", "e1", 1, 7, "count 70"),
    ];
    assert_eq!(decide(&mut store, &new), [Duplicate, Duplicate, Conflict]);
    store.close().unwrap();
    assert_eq!(schema(), 8);
    after_the_records_fixtures_replays(db_s);
    // The old effects print as they did.
    let effects = stdout(&["dump-effects", "--db", db_s]);
    assert!(
        effects.starts_with(&fixture("dump-effects.jsonl")),
        "{effects}"
    );

    // The file holds both versions: an old effect with its 33-byte digest, a new one whose
    // digest is a one-byte tag, each read with the digest its audit entry recorded.
    let audit = stdout(&["dump-audit", "--db", db_s]);
    let file = redb::Database::open(&db).unwrap();
    let txn = redb::ReadableDatabase::begin_read(&file).unwrap();
    let table = txn.open_table(EFFECTS.raw()).unwrap();
    let raw = |offset: u64| {
        redb::ReadableTable::get(&table, offset)
            .unwrap()
            .unwrap()
            .value()
            .to_vec()
    };
    let fixed = |offset: u64, bytes: &[u8]| {
        let r = EFFECTS.decode(&offset, bytes).unwrap();
        bytes.len() - r.payload.len()
    };
    let (old, new) = (raw(2), raw(11));
    assert_eq!((old[0], new[0]), (3, 4));
    assert!(fixed(11, &new) + 30 <= fixed(2, &old), "{old:?} {new:?}");
    for offset in [2, 11] {
        let digest = EFFECTS
            .decode(&offset, &raw(offset))
            .unwrap()
            .digest
            .unwrap();
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert!(
            audit
                .lines()
                .any(|l| l.contains(&format!("\"effect_offset\":{offset},"))
                    && l.contains(&format!("\"digest\":\"{hex}\""))),
            "effect {offset}: {hex}"
        );
    }
}

/// Under a contract that ignores members the digest is not the payload's: the effect keeps
/// its digest's bytes, and a replay differing only in an ignored member is a duplicate of it
/// in a later run, while a changed member conflicts.
#[test]
fn an_effect_under_digest_ignore_keeps_its_digest() {
    use replay_guard::store::tables::EFFECTS;

    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.redb");
    let cfg = dir.path().join("config.toml");
    let one = r#"{"agency":"A","source_id":"S","sequence":1,"stamp":"t-1","casualties":3}"#;
    let plain_db = dir.path().join("plain.redb");
    let stored = |db: &Path| {
        let file = redb::Database::open(db).unwrap();
        let txn = redb::ReadableDatabase::begin_read(&file).unwrap();
        let table = txn.open_table(EFFECTS.raw()).unwrap();
        redb::ReadableTable::get(&table, 0u64)
            .unwrap()
            .unwrap()
            .value()
            .to_vec()
    };
    // The same message under the default contract: its digest left out.
    let feed = dir.path().join("one.jsonl");
    std::fs::write(&feed, format!("{one}\n")).unwrap();
    stdout(&[
        "ingest",
        "--db",
        plain_db.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    std::fs::write(
        &cfg,
        format!(
            "[store]\npath = {:?}\n\n[feed]\ndigest_ignore = [\"/stamp\"]\n",
            db.to_str().unwrap()
        ),
    )
    .unwrap();
    let cfg_s = cfg.to_str().unwrap();
    stdout(&["ingest", "--config", cfg_s, feed.to_str().unwrap()]);
    let (plain, kept) = (stored(&plain_db), stored(&db));
    assert_eq!((plain[0], kept[0]), (4, 4));
    assert_eq!(kept.len(), plain.len() + 32);
    let replays = concat!(
        r#"{"agency":"A","source_id":"S","sequence":1,"stamp":"t-2","casualties":3}"#,
        "\n",
        r#"{"agency":"A","source_id":"S","sequence":1,"stamp":"t-3","casualties":6}"#,
        "\n"
    );
    std::fs::write(&feed, replays).unwrap();
    stdout(&["ingest", "--config", cfg_s, feed.to_str().unwrap()]);
    let audit = stdout(&["dump-audit", "--config", cfg_s]);
    let outcomes: Vec<&str> = audit
        .lines()
        .map(|l| {
            l.split("\"outcome\":\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
        })
        .collect();
    assert_eq!(outcomes, ["applied", "duplicate", "conflict"]);
    assert!(stdout(&["verify", "--config", cfg_s]).contains("hash chain intact"));
}

#[test]
fn audit_entries_holding_their_prev_hash_chain_on_with_entries_that_leave_it_to_the_one_before() {
    use replay_guard::model::Outcome::*;
    use replay_guard::store::tables::{AUDIT, META, META_TABLE};
    use replay_guard::store::{Store, StoreOptions};

    let dir = tempfile::tempdir().unwrap();
    let db = fixture_reads_as_printed(RECORDS_V4_FIXTURE, dir.path());
    let db_s = db.to_str().unwrap();
    let schema = || {
        let file = redb::Database::open(&db).unwrap();
        let txn = redb::ReadableDatabase::begin_read(&file).unwrap();
        let meta = META.get(&txn.open_table(META_TABLE).unwrap()).unwrap();
        meta.unwrap().schema_version
    };
    assert_eq!(schema(), 6);
    let at = RECORDS_V4_WRITTEN_MS + 60_000;
    let mut store = Store::open(&db, StoreOptions::default(), at).unwrap();
    assert_eq!(
        decide_at(&mut store, at, &first_replays()),
        [Duplicate, Duplicate, Duplicate, Conflict, Applied, Applied]
    );
    let msg = crate::common::msg;
    let new = [
        msg("fd", "e1", 1, 7, "count 7"),
        msg("ems", "m2", 2, 5, "at hospital"),
        msg("fd", "e1", 1, 7, "count 70"),
    ];
    assert_eq!(
        decide_at(&mut store, at, &new),
        [Duplicate, Duplicate, Conflict]
    );
    store.close().unwrap();
    assert_eq!(schema(), 8);
    after_the_records_fixtures_replays(db_s);
    let audit = stdout(&["dump-audit", "--db", db_s]);
    let fixture = std::fs::read_to_string(Path::new(RECORDS_V4_FIXTURE).join("dump-audit.jsonl"));
    assert!(audit.starts_with(&fixture.unwrap()), "{audit}");

    // The fixture's entries hold their prev_hash (version 3); the new ones after entry 15,
    // chained after an entry the file holds, leave it out (version 4) and read with the hash
    // of the entry before.
    {
        let file = redb::Database::open(&db).unwrap();
        let txn = redb::ReadableDatabase::begin_read(&file).unwrap();
        let raw = {
            let t = txn.open_table(AUDIT.raw()).unwrap();
            move |index: u64| {
                let bytes = redb::ReadableTable::get(&t, index).unwrap().unwrap();
                bytes.value().to_vec()
            }
        };
        let (old, new) = (raw(14), raw(16));
        assert_eq!((old[0], new[0]), (3, 4));
        assert!(AUDIT.decode(&14, &old).is_ok());
        assert!(AUDIT.decode(&16, &new).is_err(), "needs entry 15's hash");
        assert!(new.len() + 32 < old.len(), "{} vs {}", new.len(), old.len());
        let opened = AUDIT.open(&txn).unwrap();
        let entry = |index: u64| opened.get(index).unwrap().unwrap();
        assert_eq!(entry(16).prev_hash, entry(15).hash);
        assert_eq!(entry(15).prev_hash, entry(14).hash);
    }

    // An edit in place of a fixture's entry is named alone: the entry after it holds the
    // prev_hash it breaks.
    {
        let file = redb::Database::open(&db).unwrap();
        let txn = file.begin_write().unwrap();
        {
            let mut t = txn.open_table(AUDIT.raw()).unwrap();
            let mut bytes = redb::ReadableTable::get(&t, 6)
                .unwrap()
                .unwrap()
                .value()
                .to_vec();
            let at = bytes.windows(6).position(|w| w == b"ingest").unwrap();
            bytes[at..at + 6].copy_from_slice(b"INGEST");
            t.insert(6, bytes.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    let out = run(&["verify", "--db", db_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(
        err.contains("audit entry 7: prev_hash ")
            && err.contains(" (entry 6 was edited, or this prev_hash)"),
        "{err}"
    );
}
