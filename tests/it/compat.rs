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

    // The same feed again: every message is a replay of what the old release decided.
    let feed = Path::new(FIXTURE).join("feed.jsonl");
    let out = run(&["ingest", "--db", db_s, feed.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = String::from_utf8_lossy(&out.stderr).to_string();
    let words: Vec<&str> = report.split_whitespace().collect();
    for want in [
        ["applied", "0"],
        ["duplicate", "29"],
        ["conflict", "1"],
        ["malformed", "1"],
    ] {
        assert!(words.windows(2).any(|w| w == want), "{want:?} in {report}");
    }
    let audit = stdout(&["dump-audit", "--db", db_s]);
    assert_eq!(audit.lines().count(), 62);
    assert!(stdout(&["verify", "--db", db_s]).contains("62 audit entries, hash chain intact"));
}
