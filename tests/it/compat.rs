//! The redb file format is unchanged by the store API split: a database written by the
//! previous release (`tests/fixtures/release-f2ebb61/`, made by that commit's `ingest` of
//! `feed.jsonl`) reads back record for record as that release printed it, verifies, and takes
//! new writes that decide its replays as duplicates.

use std::path::Path;

use crate::common::run;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/release-f2ebb61"
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
