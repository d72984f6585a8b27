//! A damaged database file never panics a command: every 4 KiB page of a small database is
//! zeroed in turn, then a fixed-seed series of bit flips, zeroed ranges, random overwrites and
//! truncations is applied to copies, and each command runs against the result through the real
//! binary. A command either succeeds (the damage hit space it does not read) or fails with
//! exit 2 and one line saying `database damaged: …` (`verify` may also exit 4 naming a broken
//! record); it never exits 101 or dies of a signal, and `verify` never passes a file that
//! `ingest` cannot open. `scripts/damage-sweep.sh` runs the same sweep with more trials.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::common::{SplitMix64, bin, run};

const PAGE: u64 = 4096;
/// A command that takes longer than this on a 150 KiB file is treated as hung.
const HANG: Duration = Duration::from_secs(30);

fn feed() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl")
}

/// A small database made by the real binary, and a key it holds (for `explain`).
fn small_db(dir: &Path) -> (PathBuf, String) {
    let db = dir.join("base.redb");
    let out = run(&[
        "ingest",
        "--db",
        db.to_str().unwrap(),
        feed().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let audit = run(&["dump-audit", "--db", db.to_str().unwrap()]);
    let text = String::from_utf8(audit.stdout).unwrap();
    let key = text
        .split("\"key\":\"")
        .nth(1)
        .and_then(|rest| rest.get(..64))
        .expect("an audit entry with a key")
        .to_string();
    (db, key)
}

/// Runs the binary, killing it if it hangs (`Err` naming the command).
fn run_bounded(args: &[&str]) -> Result<Output, String> {
    let child = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn replay-guard");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HANG) {
        Ok(out) => {
            waiter.join().unwrap();
            Ok(out.unwrap())
        }
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            waiter.join().unwrap();
            Err(format!("{} hung for {HANG:?}", args.join(" ")))
        }
    }
}

/// One way of damaging a copy of the database.
#[derive(Debug, Clone)]
enum Damage {
    ZeroPage(u64),
    FlipBits(Vec<(u64, u8)>),
    ZeroRange { at: u64, len: u64 },
    Garbage { at: u64, bytes: Vec<u8> },
    Truncate(u64),
}

impl Damage {
    fn apply(&self, original: &[u8]) -> Vec<u8> {
        let mut b = original.to_vec();
        match self {
            Damage::ZeroPage(p) => {
                let start = (p * PAGE) as usize;
                let end = (start + PAGE as usize).min(b.len());
                b[start..end].fill(0);
            }
            Damage::FlipBits(flips) => {
                for (at, bit) in flips {
                    b[*at as usize] ^= 1 << bit;
                }
            }
            Damage::ZeroRange { at, len } => {
                let end = (at + len).min(b.len() as u64) as usize;
                b[*at as usize..end].fill(0);
            }
            Damage::Garbage { at, bytes } => {
                let at = *at as usize;
                let end = (at + bytes.len()).min(b.len());
                b[at..end].copy_from_slice(&bytes[..end - at]);
            }
            Damage::Truncate(len) => b.truncate(*len as usize),
        }
        b
    }
}

/// Every page zeroed in turn, then `random` seeded trials.
fn trials(len: u64, random: usize, seed: u64) -> Vec<Damage> {
    let mut out: Vec<Damage> = (0..len.div_ceil(PAGE)).map(Damage::ZeroPage).collect();
    let mut rng = SplitMix64::new(seed);
    for _ in 0..random {
        out.push(match rng.below(4) {
            0 => Damage::FlipBits(
                (0..1 + rng.below(8))
                    .map(|_| (rng.below(len), rng.below(8) as u8))
                    .collect(),
            ),
            1 => Damage::ZeroRange {
                at: rng.below(len),
                len: 1 + rng.below(2 * PAGE),
            },
            2 => Damage::Garbage {
                at: rng.below(len),
                bytes: (0..1 + rng.below(512))
                    .map(|_| rng.next_u64() as u8)
                    .collect(),
            },
            _ => Damage::Truncate(1 + rng.below(len - 1)),
        });
    }
    out
}

/// What went wrong with one command on one damaged file, if anything.
fn judge(cmd: &str, out: &Output) -> Option<String> {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let Some(code) = out.status.code() else {
        return Some(format!(
            "{cmd}: killed by a signal ({:?}): {stderr}",
            out.status
        ));
    };
    if code == 0 {
        return None;
    }
    // Log lines (timestamped) may precede the error; the error itself is one line.
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    let allowed = match cmd.split(' ').next() {
        Some("verify" | "report") => code == 2 || code == 4,
        // Damage that reads as valid data (a record gone from the quarantine) is refused as
        // a wrong id: one line, nothing written.
        Some("quarantine") => code == 1 || code == 2,
        _ => code == 2,
    };
    let one_line = lines.len() == 1 && lines[0].starts_with("replay-guard: error: ");
    let damaged = code == 4 || code == 1 || lines.iter().any(|l| l.contains("database damaged: "));
    (!allowed || !one_line || !damaged).then(|| {
        format!(
            "{cmd}: exit {code}, stderr {:?}",
            stderr.chars().take(600).collect::<String>()
        )
    })
}

/// Runs every command against one damaged copy; returns the failures (empty: all sound).
fn check(dir: &Path, base: &[u8], key: &str, damage: &Damage) -> Vec<String> {
    let bytes = damage.apply(base);
    // Read-only commands never change the file, but a fresh copy for each keeps it simple.
    let db = dir.join("damaged.redb");
    let db_s = db.to_str().unwrap().to_string();
    let fresh = || {
        let _ = std::fs::remove_file(dir.join("damaged.redb.lock"));
        std::fs::write(&db, &bytes).unwrap();
    };
    let feed = feed();
    let feed_s = feed.to_str().unwrap();
    // `@` stands for the damaged database's path; writers each get a fresh copy.
    let commands: [&[&str]; 11] = [
        &["verify", "--db", "@"],
        &["report", "--db", "@", "-o", "-"],
        &["dump-audit", "--db", "@"],
        &["dump-effects", "--db", "@"],
        &["dump-quarantine", "--db", "@"],
        &["stats", "--db", "@"],
        &["gaps", "--db", "@"],
        &["explain", "--db", "@", key],
        &["ingest", "--db", "@", feed_s],
        &[
            "quarantine",
            "discard",
            "--db",
            "@",
            "0",
            "--reason",
            "test",
            "--operator",
            "t",
        ],
        &["compact", "--db", "@"],
    ];
    let mut failures = Vec::new();
    let mut verify_code = None;
    let mut ingest_code = None;
    for args in commands {
        fresh();
        let full: Vec<&str> = args
            .iter()
            .map(|a| if *a == "@" { db_s.as_str() } else { a })
            .collect();
        let out = match run_bounded(&full) {
            Ok(out) => out,
            Err(hung) => {
                failures.push(hung);
                continue;
            }
        };
        match args[0] {
            "verify" => verify_code = out.status.code(),
            "ingest" => ingest_code = out.status.code(),
            _ => {}
        }
        if let Some(f) = judge(&args.join(" "), &out) {
            failures.push(f);
        }
    }
    if verify_code == Some(0) && ingest_code != Some(0) {
        failures.push(format!(
            "verify passed a file that ingest could not open (ingest exit {ingest_code:?})"
        ));
    }
    failures
}

/// Runs `trials` over two worker threads; returns each failing trial with its failures.
fn sweep(base: &Path, key: &str, trials: &[Damage]) -> Vec<(Damage, Vec<String>)> {
    let bytes = std::fs::read(base).unwrap();
    let failed = std::sync::Mutex::new(Vec::new());
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let dir = tempfile::tempdir().unwrap();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(d) = trials.get(i) else { break };
                    let f = check(dir.path(), &bytes, key, d);
                    if !f.is_empty() {
                        failed.lock().unwrap().push((d.clone(), f));
                    }
                }
            });
        }
    });
    failed.into_inner().unwrap()
}

fn report(failed: &[(Damage, Vec<String>)], total: usize) -> String {
    let mut s = format!(
        "{} of {total} damaged files broke a command:\n",
        failed.len()
    );
    for (d, f) in failed.iter().take(20) {
        s.push_str(&format!("  {d:?}: {}\n", f.join(" | ")));
    }
    s
}

#[test]
fn no_damaged_page_or_random_corruption_panics_any_command() {
    let dir = tempfile::tempdir().unwrap();
    let (base, key) = small_db(dir.path());
    let len = std::fs::metadata(&base).unwrap().len();
    let random: usize = std::env::var("DAMAGE_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let seed: u64 = std::env::var("DAMAGE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(9);
    let all = trials(len, random, seed);
    let started = Instant::now();
    let failed = sweep(&base, &key, &all);
    let panicked = |pages: bool| {
        failed
            .iter()
            .filter(|(d, f)| {
                matches!(d, Damage::ZeroPage(_)) == pages
                    && f.iter().any(|f| f.contains("exit 101"))
            })
            .count()
    };
    eprintln!(
        "damage sweep: {} trials ({} pages + {random} seeded, seed {seed}) in {:?}: {} failing; \
         a command panicked for {} pages and {} seeded trials",
        all.len(),
        len.div_ceil(PAGE),
        started.elapsed(),
        failed.len(),
        panicked(true),
        panicked(false)
    );
    assert!(failed.is_empty(), "{}", report(&failed, all.len()));
}

/// An in-memory file whose pages past the first read back as zeros once `damaged` is set:
/// damage that appears under a store that is already open.
#[derive(Debug)]
struct DecayingBackend {
    bytes: std::sync::Mutex<Vec<u8>>,
    damaged: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl redb::StorageBackend for DecayingBackend {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.bytes.lock().unwrap().len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let b = self.bytes.lock().unwrap();
        let end = offset as usize + out.len();
        if end > b.len() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        out.copy_from_slice(&b[offset as usize..end]);
        if self.damaged.load(std::sync::atomic::Ordering::SeqCst) && offset >= PAGE {
            out.fill(0);
        }
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.bytes.lock().unwrap().resize(len as usize, 0);
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        let mut b = self.bytes.lock().unwrap();
        let end = offset as usize + data.len();
        if end > b.len() {
            b.resize(end, 0);
        }
        b[offset as usize..end].copy_from_slice(data);
        Ok(())
    }
    // Private to this process: every lock is free.
    fn try_lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, redb::BackendError> {
        Ok(true)
    }
    fn try_lock_shared_range(
        &self,
        _: Bound<u64>,
        _: Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        Ok(true)
    }
    fn lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), redb::BackendError> {
        Ok(())
    }
    fn lock_shared_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), redb::BackendError> {
        Ok(())
    }
    fn unlock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<(), redb::BackendError> {
        Ok(())
    }
    fn query_lock_range(&self, _: Bound<u64>, _: Bound<u64>) -> Result<bool, redb::BackendError> {
        Ok(false)
    }
}

#[test]
fn a_store_that_meets_damage_mid_run_fails_the_batch_and_refuses_further_use() {
    use replay_guard::store::{Incoming, Store, StoreError, StoreOptions};
    use replay_guard::wire::FeedContract;
    let damaged = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let backend = DecayingBackend {
        bytes: std::sync::Mutex::new(Vec::new()),
        damaged: damaged.clone(),
    };
    // No page cache: every read after the damage reaches the backend.
    let opts = StoreOptions {
        cache_bytes: 0,
        ..StoreOptions::default()
    };
    let mut store = Store::open_with_backend(backend, opts, 1_000).unwrap();
    let contract = FeedContract::default();
    let batch = |from: u64| -> Vec<Incoming> {
        (from..from + 50)
            .map(|s| {
                let m = super::common::msg("A", "S", 0, s, "x");
                Incoming::decode("t", m.into_bytes(), 1_000, &contract)
            })
            .collect()
    };
    store.commit_batch(&batch(1), 1_000).unwrap();
    damaged.store(true, std::sync::atomic::Ordering::SeqCst);
    let failed = store.commit_batch(&batch(1), 2_000);
    assert!(
        matches!(failed, Err(StoreError::Damaged(_))),
        "{:?}",
        failed.map(|r| r.counts)
    );
    // The damage goes away, but the handle stays refused: its state is not trusted again.
    damaged.store(false, std::sync::atomic::Ordering::SeqCst);
    let again = store.commit_batch(&batch(100), 3_000);
    assert!(matches!(again, Err(StoreError::Damaged(_))));
    assert!(store.reader().is_err());
    drop(store); // leaked, not closed: no panic from redb's destructors
}

#[test]
fn run_on_a_damaged_database_exits_2_with_one_line_and_never_connects() {
    let dir = tempfile::tempdir().unwrap();
    let (base, _) = small_db(dir.path());
    // A writer's open reads the allocator state, which a zeroed page 1 destroys.
    let bytes = Damage::ZeroPage(1).apply(&std::fs::read(&base).unwrap());
    let db = dir.path().join("run.redb");
    std::fs::write(&db, bytes).unwrap();
    let config = dir.path().join("run.toml");
    // Port 1 on loopback: nothing listens, and `run` must stop before trying it.
    std::fs::write(
        &config,
        format!(
            "[store]\npath = {:?}\n[mqtt]\nbrokers = [\"mqtt://127.0.0.1:1\"]\n\
             client_id = \"damage\"\ntopics = [\"t/#\"]\n",
            db.to_str().unwrap()
        ),
    )
    .unwrap();
    let out = run_bounded(&["run", "--config", config.to_str().unwrap()]).unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(judge("run", &out).is_none(), "{out:?}");
}
