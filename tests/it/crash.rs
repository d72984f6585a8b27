//! Crash safety: the real binary is `kill -9`ed at random moments of an `ingest`, re-run on the
//! same database, and the final effect log must equal the one of an uninterrupted run; and an
//! `ingest` killed while it creates its database file must be able to start again.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::ControlFlow;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use replay_guard::model::hex;
use replay_guard::store::{Reader, StoreError};

use crate::common::{self, SplitMix64};

/// Lines in the generated feed.
const FEED_LINES: usize = 40_000;
/// Runs killed with SIGKILL before the final, uninterrupted one.
const KILLS: usize = 24;
/// Of those, how many must provably have been interrupted (killed while still running).
const MIN_INTERRUPTED: usize = 10;

/// Attempts of `ingest` on a fresh path killed while it creates the database file.
const CREATE_ATTEMPTS: usize = 40;

/// One effect as compared between two databases: (agency, source_id, epoch, sequence,
/// payload). `late` and offsets may legitimately differ; payloads are stored verbatim (UTF-8).
type EffectId = (String, String, u64, u64, String);

fn ingest(db: &Path, feed: &Path) -> Command {
    let mut cmd = Command::new(common::bin());
    cmd.arg("ingest")
        .arg("--db")
        .arg(db)
        .arg(feed)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

fn ingest_to_completion(db: &Path, feed: &Path) -> Duration {
    let started = Instant::now();
    let out = ingest(db, feed)
        .stderr(Stdio::piped())
        .output()
        .expect("spawn replay-guard");
    assert!(
        out.status.success(),
        "ingest into {} failed: {}\n{}",
        db.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    started.elapsed()
}

#[cfg(unix)]
fn killed_by_sigkill(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt as _;
    status.signal() == Some(9)
}

#[cfg(not(unix))]
fn killed_by_sigkill(status: ExitStatus) -> bool {
    // `Child::kill` is TerminateProcess, which makes the exit code 1.
    status.code() == Some(1)
}

/// The effect log as a map from identity to how often it occurs.
fn effect_multiset(db: &Path) -> (usize, BTreeMap<EffectId, usize>) {
    let effects = common::effects(db);
    let mut set = BTreeMap::new();
    let mut keys = HashSet::new();
    for (i, e) in effects.iter().enumerate() {
        assert_eq!(
            e.offset,
            i as u64,
            "effect offsets of {} have a gap",
            db.display()
        );
        let r = &e.record;
        assert!(
            keys.insert(r.key),
            "key {} appears twice in the effect log of {}",
            hex(&r.key),
            db.display()
        );
        let id = (
            r.agency.clone(),
            r.source_id.clone(),
            r.epoch,
            r.sequence,
            String::from_utf8(r.payload.clone()).expect("an effect payload is UTF-8"),
        );
        *set.entry(id).or_insert(0) += 1;
    }
    (effects.len(), set)
}

/// How many effects `db` holds after crash recovery, which a read-only open cannot do: a copy
/// is repaired by an `ingest` of empty input, then read.
fn recovered_effects(db: &Path, scratch: &Path) -> u64 {
    std::fs::copy(db, scratch).unwrap();
    let out = common::run_with_stdin(&["ingest", "--db", scratch.to_str().unwrap()], b"");
    assert!(
        out.status.success(),
        "recovery after a kill failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let reader = Reader::open(scratch).unwrap();
    let txn = reader.begin().unwrap();
    txn.summary().unwrap().effects
}

/// Checks the audit chain link by link and returns its length.
fn verified_audit_len(db: &Path) -> u64 {
    let reader = Reader::open(db).unwrap();
    let txn = reader.begin().unwrap();
    let mut next = 0u64;
    let mut prev = [0u8; 32];
    txn.scan_audit::<StoreError>(0, |e| {
        assert_eq!(e.index, next, "audit index gap in {}", db.display());
        assert_eq!(
            e.record.prev_hash,
            prev,
            "audit #{} of {}: broken link",
            e.index,
            db.display()
        );
        assert!(
            e.hash_is_valid(),
            "audit #{} of {}: bad hash",
            e.index,
            db.display()
        );
        prev = e.record.hash;
        next += 1;
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    next
}

/// The quarantine as a set of (outcome code, payload); delivery counts legitimately differ.
fn quarantine_set(db: &Path) -> BTreeSet<(u8, Vec<u8>)> {
    let reader = Reader::open(db).unwrap();
    let txn = reader.begin().unwrap();
    let mut out = BTreeSet::new();
    txn.scan_quarantine::<StoreError>(0, |q| {
        assert!(
            out.insert((q.record.outcome, q.record.payload)),
            "quarantine of {} holds the same message twice",
            db.display()
        );
        Ok(ControlFlow::Continue(()))
    })
    .unwrap();
    out
}

/// Effects committed in `db` as a read-only inspector sees them now, or `None` while the file
/// still awaits the crash recovery that the next writer does on open.
fn live_effects(db: &Path) -> Option<u64> {
    match Reader::open(db) {
        Ok(reader) => Some(reader.begin().unwrap().summary().unwrap().effects),
        Err(StoreError::NeedsRecovery(_)) => None,
        Err(e) => panic!("reading {} under a live writer: {e}", db.display()),
    }
}

/// Waits until `child` has committed at least `target` effects into `db` (watched through a
/// read-only handle, as `dump-*` would), or until it exits.
fn wait_for_progress(child: &mut Child, db: &Path, target: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if live_effects(db).is_some_and(|n| n >= target) {
            return;
        }
        assert!(Instant::now() < deadline, "no progress to {target} effects");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn ingest_killed_at_random_moments_converges_to_the_clean_run() {
    let dir = tempfile::tempdir().unwrap();
    let feed = common::generate_feed(0x5eed_c0de_2024, FEED_LINES);
    assert!(
        feed.distinct_keys > 20_000 && feed.exact_replays > 3_000,
        "{feed:?}"
    );
    assert!(feed.reserialised > 0 && feed.malformed > 0 && feed.held_back > 0);
    assert!(feed.conflicting > 0 && feed.epoch_bumps > 0, "{feed:?}");
    let feed_path = dir.path().join("feed.jsonl");
    std::fs::write(&feed_path, &feed.bytes).unwrap();

    // The reference: one uninterrupted run.
    let clean = dir.path().join("clean.redb");
    let full_run = ingest_to_completion(&clean, &feed_path);
    // Roughly one commit's worth of time (512 lines per commit).
    let commit_time = full_run.mul_f64(512.0 / FEED_LINES as f64);

    // The crash database exists before the first kill: kills while a database file is being
    // created are the subject of their own test below. Creating it also times start-up.
    let crash = dir.path().join("crash.redb");
    let started = Instant::now();
    let created = common::run_with_stdin(&["ingest", "--db", crash.to_str().unwrap()], b"");
    let startup = started.elapsed();
    assert!(created.status.success(), "{created:?}");

    // Where kills land is steered by progress, not by wall time alone, so the spread does not
    // depend on machine speed, build profile or what else runs: kill i first waits until the
    // run has committed a random number of effects from the i-th of KILLS slices of the first
    // 97% of the clean run's, then a random part of a commit's time more, so the kill falls
    // anywhere in the commit cycle (decoding, writing, fsync). Every fourth kill instead
    // falls within start-up: opening the file and repairing the previous kill's damage.
    let total = feed.distinct_keys as f64;
    let mut rng = SplitMix64::new(0xdead_beef);
    let mut interrupted = 0;
    let mut completed = 0;
    // Effects in the crash database after each kill (and its recovery).
    let mut progress: Vec<u64> = Vec::new();
    for i in 0..KILLS {
        let mut child = ingest(&crash, &feed_path)
            .spawn()
            .expect("spawn replay-guard");
        if i % 4 == 3 {
            std::thread::sleep(startup.mul_f64(2.0 * rng.unit()));
        } else {
            let target = total * 0.97 * (i as f64 + rng.unit()) / KILLS as f64;
            wait_for_progress(&mut child, &crash, target as u64);
            std::thread::sleep(commit_time.mul_f64(rng.unit()));
        }
        let running = child.try_wait().unwrap().is_none();
        child.kill().unwrap();
        let status = child.wait().unwrap();
        if killed_by_sigkill(status) {
            assert!(
                running,
                "kill {i}: killed by a signal yet had already exited"
            );
            interrupted += 1;
        } else {
            // It finished before the kill: then it must have finished cleanly, crash recovery
            // of the previous kill included.
            assert!(
                status.success(),
                "kill {i}: ingest exited with {status} on its own"
            );
            completed += 1;
        }
        progress.push(recovered_effects(&crash, &dir.path().join("scratch.redb")));
    }
    assert!(
        interrupted >= MIN_INTERRUPTED,
        "only {interrupted} of {KILLS} kills interrupted a run ({completed} completed): \
         {progress:?}"
    );
    let final_run = ingest_to_completion(&crash, &feed_path);
    // Committed batches survive `kill -9`: the effect log never shrinks from one kill to the
    // next. And the kills landed at many different points of the feed.
    assert!(
        progress.windows(2).all(|w| w[0] <= w[1]),
        "effects were lost across a kill: {progress:?}"
    );
    let mut points: Vec<u64> = progress
        .iter()
        .copied()
        .filter(|n| *n > 0 && *n < feed.distinct_keys as u64)
        .collect();
    points.dedup();
    assert!(
        points.len() >= MIN_INTERRUPTED,
        "kills left the effect log at only {} distinct partial states: {progress:?}",
        points.len()
    );

    let (clean_n, clean_set) = effect_multiset(&clean);
    let (crash_n, crash_set) = effect_multiset(&crash);
    assert_eq!(
        clean_n, feed.distinct_keys,
        "the clean run applied one effect per distinct key"
    );
    let twice: Vec<_> = crash_set.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} effects applied more than once after crashes, e.g. {:?}",
        twice.len(),
        twice.first()
    );
    assert_eq!(crash_n, clean_n, "effect count after crashes");
    if crash_set != clean_set {
        let missing = clean_set.keys().find(|k| !crash_set.contains_key(*k));
        let extra = crash_set.keys().find(|k| !clean_set.contains_key(*k));
        panic!("effect logs differ: e.g. missing {missing:?}, extra {extra:?}");
    }
    // The rest of the database converges too: an intact audit chain across every crash (the
    // crash database holds one entry per decided line of every run) and the same quarantine.
    assert_eq!(verified_audit_len(&clean), FEED_LINES as u64);
    assert!(verified_audit_len(&crash) >= FEED_LINES as u64);
    assert_eq!(
        quarantine_set(&crash),
        quarantine_set(&clean),
        "quarantined messages"
    );
    eprintln!(
        "crash: {FEED_LINES} lines, {clean_n} effects, {progress:?} after each kill; full \
         run {full_run:?}, final run {final_run:?}; {interrupted} kills interrupted a run, \
         {completed} came too late"
    );
}

#[test]
fn ingest_killed_while_creating_its_database_can_be_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let feed = common::generate_feed(7, 2_000);
    let feed_path = dir.path().join("feed.jsonl");
    std::fs::write(&feed_path, &feed.bytes).unwrap();
    // How long creating a database takes: start-up, file creation and the first commit.
    let probe = dir.path().join("probe.redb");
    let started = Instant::now();
    let out = common::run_with_stdin(&["ingest", "--db", probe.to_str().unwrap()], b"");
    let create = started.elapsed();
    assert!(out.status.success(), "{out:?}");

    let mut rng = SplitMix64::new(0xc4ea7e);
    let mut left_a_file = 0;
    let mut unusable = Vec::new();
    for i in 0..CREATE_ATTEMPTS {
        let db = dir.path().join(format!("new-{i}.redb"));
        let at = create.mul_f64((i as f64 + rng.unit()) / CREATE_ATTEMPTS as f64);
        let mut child = ingest(&db, &feed_path).spawn().expect("spawn replay-guard");
        std::thread::sleep(at);
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(
            killed_by_sigkill(status) || status.success(),
            "attempt {i}: ingest exited with {status} on its own"
        );
        // A database is built under a temporary name and linked into place when complete; a
        // kill leaves either, or nothing if it came before the first write.
        let tmp = dir.path().join(format!(".new-{i}.redb.creating"));
        if !db.exists() && !tmp.exists() {
            continue;
        }
        left_a_file += 1;
        // Whatever state the kill left, starting again must work (the service restarts on
        // failure and would otherwise loop), and so must reading afterwards.
        let again = common::run_with_stdin(&["ingest", "--db", db.to_str().unwrap()], b"");
        if !again.status.success() {
            let size = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
            let stderr = String::from_utf8_lossy(&again.stderr);
            unusable.push(format!(
                "killed after {at:?}: {size}-byte file; restart: {}",
                stderr.lines().next().unwrap_or("")
            ));
            continue;
        }
        let audit = common::run(&["dump-audit", "--db", db.to_str().unwrap()]);
        assert!(audit.status.success(), "attempt {i}: {audit:?}");
    }
    assert!(
        unusable.is_empty(),
        "{} of {left_a_file} killed creations left a database that `ingest` can never open \
         again:\n{}",
        unusable.len(),
        unusable.join("\n")
    );
    assert!(
        left_a_file >= CREATE_ATTEMPTS / 4,
        "only {left_a_file} of {CREATE_ATTEMPTS} kills (spread over {create:?}) left a \
         database or a half-created one behind"
    );
}

/// Runs `replay-guard ARGS` and returns (exit code, stderr).
fn inspect(args: &[&str]) -> (Option<i32>, String) {
    let out = common::run(args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Each inspector, on its own copy of `crashed` (a file a killed writer left needing crash
/// recovery): it recovers the file itself, says so in one line, and reads it; the next one on
/// the same copy needs no recovery.
fn every_inspector_recovers(crashed: &Path, dir: &Path, config: Option<&Path>) {
    let commands: [&[&str]; 8] = [
        &["stats"],
        &["dump-audit"],
        &["dump-effects"],
        &["relay", "status"],
        &["verify"],
        &["report", "-o", "-"],
        &["health"],
        &["gaps"],
    ];
    for (i, command) in commands.iter().enumerate() {
        let copy = dir.join(format!("inspected-{i}.redb"));
        std::fs::copy(crashed, &copy).unwrap();
        let mut args = command.to_vec();
        args.extend(["--db", copy.to_str().unwrap()]);
        if let Some(c) = config {
            args.extend(["--config", c.to_str().unwrap()]);
        }
        let (code, err) = inspect(&args);
        // health judges the store (the feed quarantines and skips on purpose): never
        // UNKNOWN, which says it could not be read.
        let fine = if command[0] == "health" {
            matches!(code, Some(0..=2))
        } else {
            code == Some(0)
        };
        assert!(fine, "{command:?} after a kill -9: {code:?}\n{err}");
        assert_eq!(
            err.matches("was left needing crash recovery").count(),
            1,
            "{command:?} says it recovered the file, once:\n{err}"
        );
        assert!(err.contains("no record changed"), "{err}");
        let (code, err) = inspect(&args);
        assert!(
            !err.contains("crash recovery"),
            "{command:?} again: recovered already ({code:?}):\n{err}"
        );
    }
}

#[test]
fn after_kill_9_of_a_writer_every_inspector_recovers_the_file_itself() {
    let dir = tempfile::tempdir().unwrap();
    let feed = common::generate_feed(0x1a5_7ea1, 40_000);
    let feed_path = dir.path().join("feed.jsonl");
    std::fs::write(&feed_path, &feed.bytes).unwrap();
    // kill -9 of `ingest` mid-feed (again if it finished first).
    let db = dir.path().join("ingest.redb");
    let killed = (0..5).any(|_| {
        let _ = std::fs::remove_file(&db);
        let made = common::run_with_stdin(&["ingest", "--db", db.to_str().unwrap()], b"");
        assert!(made.status.success(), "{made:?}");
        let mut child = ingest(&db, &feed_path).spawn().unwrap();
        wait_for_progress(&mut child, &db, 2_000);
        child.kill().unwrap();
        killed_by_sigkill(child.wait().unwrap())
    });
    assert!(killed, "ingest always finished before the kill");
    every_inspector_recovers(&db, dir.path(), None);

    // kill -9 of the standalone relay while its sink delivers.
    let relay_dir = dir.path().join("relay");
    std::fs::create_dir(&relay_dir).unwrap();
    let s = super::relay::setup(
        &relay_dir,
        "cat >> \"$OUT\"; sleep 0.05",
        "batch_max = 10",
        "",
    );
    s.ingest(0, 400);
    let mut relay = s.relay();
    s.wait_received(50, Duration::from_secs(30));
    relay.kill().unwrap();
    assert!(killed_by_sigkill(relay.wait().unwrap()));
    every_inspector_recovers(&s.db, dir.path(), Some(&s.config));
}
