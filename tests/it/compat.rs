//! Databases written by earlier releases keep working. The redb file format is unchanged by
//! the store API split: a database written by release f2ebb61 (`tests/fixtures/release-f2ebb61/`,
//! made by that commit's `ingest` of `feed.jsonl`) reads back record for record as that release
//! printed it, verifies, and takes new writes that decide its replays as duplicates. A
//! database with a relay sink written by release 89ca245 (`tests/fixtures/release-89ca245/`:
//! its `ingest` of `feed.jsonl`, then its `relay` with `config.toml`, whose `receiver.sh`
//! refuses the two events of sequence 3; its outputs saved beside) reads its version-1 sink
//! cursor and parked events as that release printed them, verifies, and its sink carries on:
//! the cursor is rewritten at this version's record version (3) with a ledger from there.

use std::path::Path;

use crate::common::run;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/release-f2ebb61"
);
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
    // The cursor record is now of this version's record version (3: it knows its stream).
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
    assert_eq!(bytes[0], 3);
}
