//! Inspectors on a live database: `dump-audit`, `dump-effects` and `dump-quarantine` run while
//! another `ingest` process holds the database open and commits to it.

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use replay_guard::json::{self, Json};
use replay_guard::key::sha256;
use replay_guard::model::{hex, parse_hex32};

use crate::common;

/// Lines fed to the writer: deliberately not a multiple of `MAX_BATCH`, so the last, partial
/// batch is committed only at end of input and no read taken while stdin is open can be
/// complete.
const FEED_LINES: usize = 6_001;
/// `[commit] max_batch` of the writer: every commit while input flows is exactly this many
/// decisions (the feed has no blank lines).
const MAX_BATCH: usize = 32;
/// Lines written to the writer's stdin per stage; after each stage the test reads until the
/// stage's full batches are visible.
const CHUNK: usize = 500;
/// How long a stage may wait for the writer to commit what it was given.
const STAGE_TIMEOUT: Duration = Duration::from_secs(60);

type Row = Vec<(String, Json)>;

fn field<'a>(row: &'a Row, name: &str) -> &'a Json {
    row.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| {
            panic!(
                "row lacks {name:?}: {}",
                Json::Object(row.clone()).to_compact()
            )
        })
}

fn u64_field(row: &Row, name: &str) -> u64 {
    match field(row, name) {
        Json::Number(n) => n.parse().unwrap_or_else(|_| panic!("{name} = {n}")),
        other => panic!("{name} is not a number: {other:?}"),
    }
}

fn str_field<'a>(row: &'a Row, name: &str) -> &'a str {
    match field(row, name) {
        Json::String(s) => s,
        other => panic!("{name} is not a string: {other:?}"),
    }
}

/// Runs `replay-guard <command> --db <db>`; it must succeed and print one JSON object per line.
fn dump(command: &str, db: &Path) -> Vec<Row> {
    let out = common::run(&[command, "--db", db.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{command} on a live database: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("dump output is UTF-8");
    stdout
        .lines()
        .map(|line| match json::parse(line.as_bytes(), 64) {
            Ok(Json::Object(row)) => row,
            other => {
                panic!("{command} printed a line that is not a JSON object: {other:?}\n{line}")
            }
        })
        .collect()
}

/// Checks that `rows` carry `name` = 0, 1, 2, ... in order.
fn assert_contiguous(rows: &[Row], name: &str, what: &str) {
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(
            u64_field(row, name),
            i as u64,
            "{what}: {name} sequence broken"
        );
    }
}

/// Verifies the audit chain from the dump alone and returns every entry's hash.
fn verify_audit(rows: &[Row]) -> Vec<String> {
    assert_contiguous(rows, "index", "dump-audit");
    let mut prev = "0".repeat(64);
    let mut hashes = Vec::with_capacity(rows.len());
    for row in rows {
        let index = u64_field(row, "index");
        assert_eq!(
            str_field(row, "prev_hash"),
            prev,
            "audit #{index}: broken link"
        );
        let prev_bytes = parse_hex32(&prev).unwrap();
        let body: Row = row
            .iter()
            .filter(|(k, _)| k != "prev_hash" && k != "hash")
            .cloned()
            .collect();
        let canonical = Json::Object(body).to_canonical().unwrap();
        let want = hex(&sha256(&[&prev_bytes, canonical.as_bytes()]));
        let hash = str_field(row, "hash");
        assert!(parse_hex32(hash).is_some(), "audit #{index}: hash {hash:?}");
        assert_eq!(
            hash, want,
            "audit #{index}: hash does not match its content"
        );
        prev = hash.to_string();
        hashes.push(prev.clone());
    }
    hashes
}

/// What one round of reads saw.
#[derive(Debug, Clone)]
struct Snapshot {
    audit: Vec<String>,
    effects: usize,
    quarantine: usize,
}

fn assert_running(writer: &mut Child, when: &str) {
    if let Some(status) = writer.try_wait().unwrap() {
        panic!("the writer exited ({status}) {when}: the read did not overlap it");
    }
}

/// One round: `dump-audit`, `dump-effects`, `dump-quarantine`, each checked, with the writer
/// provably alive before and after.
fn read_round(db: &Path, writer: &mut Child, previous: Option<&Snapshot>) -> Snapshot {
    assert_running(writer, "before a read");
    let audit = verify_audit(&dump("dump-audit", db));
    let effects = dump("dump-effects", db);
    assert_contiguous(&effects, "offset", "dump-effects");
    let quarantine = dump("dump-quarantine", db);
    assert_contiguous(&quarantine, "id", "dump-quarantine");
    assert_running(writer, "after a read");
    assert_eq!(
        audit.len() % MAX_BATCH,
        0,
        "a read saw {} audit entries: part of a batch",
        audit.len()
    );
    let snap = Snapshot {
        audit,
        effects: effects.len(),
        quarantine: quarantine.len(),
    };
    if let Some(p) = previous {
        assert!(
            snap.audit.len() >= p.audit.len()
                && snap.audit[..p.audit.len()] == p.audit[..]
                && snap.effects >= p.effects
                && snap.quarantine >= p.quarantine,
            "a later read is not an extension of an earlier one: {} audit / {} effects / {} \
             quarantined after {} / {} / {}",
            snap.audit.len(),
            snap.effects,
            snap.quarantine,
            p.audit.len(),
            p.effects,
            p.quarantine
        );
    }
    snap
}

#[test]
fn dump_audit_reads_a_database_while_ingest_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("live.redb");
    let db_arg = db.to_str().unwrap();
    let config = dir.path().join("small-batches.toml");
    // A linger longer than the test keeps every commit a full batch until input ends.
    std::fs::write(
        &config,
        format!("[commit]\nmax_batch = {MAX_BATCH}\nlinger_ms = 60000\n"),
    )
    .unwrap();
    let feed = common::generate_feed(0x11fe_f00d, FEED_LINES);
    assert_eq!(feed.lines, FEED_LINES);
    let lines: Vec<&[u8]> = feed.bytes.split_inclusive(|b| *b == b'\n').collect();
    assert_eq!(lines.len(), FEED_LINES);

    // An existing, empty database, so a read can never race the file's creation.
    let out = common::run_with_stdin(&["ingest", "--db", db_arg], b"");
    assert!(out.status.success(), "{out:?}");
    assert!(dump("dump-audit", &db).is_empty());

    let stderr = dir.path().join("writer.stderr");
    let mut writer = Command::new(common::bin())
        .args(["ingest", "--db", db_arg, "--config"])
        .arg(&config)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(File::create(&stderr).unwrap())
        .spawn()
        .expect("spawn replay-guard");
    let mut stdin = writer.stdin.take().unwrap();

    let started = Instant::now();
    let mut snaps: Vec<Snapshot> = Vec::new();
    // For each snapshot, how many decisions its stage could commit.
    let mut stage_of: Vec<usize> = Vec::new();
    let mut written = 0;
    while written < FEED_LINES {
        // Feed a stage, then read (while the writer commits it) until its full batches show.
        let end = (written + CHUNK).min(FEED_LINES);
        for line in &lines[written..end] {
            stdin.write_all(line).unwrap();
        }
        stdin.flush().unwrap();
        written = end;
        let committable = written / MAX_BATCH * MAX_BATCH;
        let deadline = Instant::now() + STAGE_TIMEOUT;
        loop {
            let snap = read_round(&db, &mut writer, snaps.last());
            let seen = snap.audit.len();
            assert!(
                seen <= committable,
                "{seen} entries after {written} lines written"
            );
            snaps.push(snap);
            stage_of.push(committable);
            if seen == committable {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the writer committed only {seen} of {committable} decisions in \
                 {STAGE_TIMEOUT:?}; its stderr:\n{}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
    }
    let live = started.elapsed();

    // Every read above ran against a writer that was alive and had input open; all of them
    // were incomplete (the last partial batch cannot commit before end of input).
    let counts: Vec<usize> = snaps.iter().map(|s| s.audit.len()).collect();
    assert!(counts.iter().all(|n| *n < FEED_LINES));
    assert!(
        counts.iter().any(|n| *n > 0),
        "no read saw a non-empty log: {counts:?}"
    );
    // Reads that caught the writer between two commits of a stage (informational: how often
    // a read overlapped active writing rather than a writer waiting for input).
    let mid_stage = snaps
        .iter()
        .zip(&stage_of)
        .filter(|(s, c)| s.audit.len() < **c)
        .count();

    drop(stdin);
    let status = writer.wait().unwrap();
    assert!(
        status.success(),
        "writer: {status}\n{}",
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
    let audit = dump("dump-audit", &db);
    let hashes = verify_audit(&audit);
    assert_eq!(hashes.len(), FEED_LINES, "one audit entry per line");
    for s in &snaps {
        assert_eq!(
            s.audit[..],
            hashes[..s.audit.len()],
            "a live read is not a prefix of the final log"
        );
    }
    let effects = dump("dump-effects", &db);
    assert_contiguous(&effects, "offset", "dump-effects");
    assert_eq!(
        effects.len(),
        feed.distinct_keys,
        "one effect per distinct key"
    );
    let quarantine = dump("dump-quarantine", &db);
    assert_contiguous(&quarantine, "id", "dump-quarantine");
    assert!(quarantine.len() >= snaps.last().unwrap().quarantine);
    eprintln!(
        "live_read: {} read rounds over {live:?} while the writer ran, {mid_stage} of them \
         mid-stage; counts {counts:?}",
        snaps.len()
    );
}
