//! Engine throughput: wire decode + `Store::commit_batch` (durable, `Durability::Immediate`)
//! in messages/s, for batch sizes 1, 64 and 512, with 10% replays (exact resends of messages
//! committed in an earlier batch, still in the window), 200-byte feed-contract messages over
//! 50 sources.
//!
//! Groups:
//! - `empty_window/<batch>`: every sample starts on a fresh database file seeded with one
//!   message per source (so replays have something to hit); the window then holds only what
//!   the sample itself commits.
//! - `window_1m/<batch>`: one database per process, prefilled (untimed, once) with 1,000,000
//!   applied messages in batches of 4096 under `max_entries = 1_000_000`, so every measured
//!   applied message also evicts one. Shared by the three batch sizes.
//! - `concurrency/{single_writer,multi_writer}/<batch>`: the empty-window run under each redb
//!   concurrency mode, to measure what letting operator commands write beside `run` costs.
//! - `retention/{keep_all,pruning}/64`: a 2,000-entry window with no retention, or with
//!   every log capped at 2,000 entries so each commit also prunes about a batch's worth.
//! - `window_1m_cache256/512`: the same database reopened with a 256 MiB page cache instead of
//!   the default 64 MiB.
//!
//! One criterion iteration is one batch; `Throughput::Elements(batch)` makes criterion report
//! messages/s. Payload bytes are built before the timed region; `Incoming::decode` and
//! `commit_batch` are timed. Run: `cargo bench --bench engine`.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use replay_guard::model::{Outcome, OutcomeCounts};
use replay_guard::store::{
    Concurrency, DEFAULT_CACHE_BYTES, Incoming, LogRetention, RetentionPolicy, Store, StoreOptions,
    WindowPolicy,
};
use replay_guard::wire::FeedContract;
use tempfile::TempDir;

const SOURCES: usize = 50;
const AGENCIES: usize = 5;
const PAYLOAD_BYTES: usize = 200;
/// Every `REPLAY_EVERY`-th message is a replay: 10%.
const REPLAY_EVERY: u64 = 10;
/// Replays pick among each source's last `REPLAY_SPAN` committed sequences. With 1,000,000
/// entries spread over 50 sources each source holds ~20,000, so these are all in the window.
const REPLAY_SPAN: u64 = 15_000;
const WINDOW_ENTRIES: u64 = 1_000_000;
const PREFILL_BATCH: usize = 4096;
const BATCH_SIZES: [usize; 3] = [1, 64, 512];
const TOPIC: &str = "bench/incidents";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn options(cache_bytes: usize) -> StoreOptions {
    StoreOptions {
        cache_bytes,
        window: WindowPolicy {
            seconds: 86_400,
            max_entries: WINDOW_ENTRIES,
        },
        ..StoreOptions::default()
    }
}

/// splitmix64: deterministic, dependency-free.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The payload of (source, sequence): a pure function, so a replay is byte-identical.
fn payload(source: usize, sequence: u64) -> Vec<u8> {
    const KINDS: [&str; 6] = ["fire", "medical", "traffic", "hazmat", "rescue", "alarm"];
    let h = mix(((source as u64) << 40) ^ sequence);
    let head = format!(
        r#"{{"agency":"agency-{}","source_id":"unit-{source:03}","epoch":1,"sequence":{sequence},"kind":"{}","priority":{},"lat":{}.{:06},"lon":{}.{:06},"note":""#,
        source % AGENCIES,
        KINDS[(h % 6) as usize],
        (h >> 8) % 5 + 1,
        40 + (h >> 12) % 10,
        (h >> 16) % 1_000_000,
        (h >> 36) % 10,
        (h >> 40) % 1_000_000,
    );
    let mut out = head.into_bytes();
    let pad = PAYLOAD_BYTES.saturating_sub(out.len() + 2).max(1);
    out.extend((0..pad).map(|i| b'a' + (mix(h ^ i as u64) % 26) as u8));
    out.extend_from_slice(b"\"}");
    out
}

/// Generates the feed and remembers what has been committed per source.
struct Feed {
    /// Next sequence to issue, per source (sequences start at 1).
    next: Vec<u64>,
    /// Highest sequence committed, per source (0: none yet).
    committed: Vec<u64>,
    counter: u64,
    /// Replays pick among each source's last `span` committed sequences.
    span: u64,
}

/// One batch's payloads and how they must be decided.
struct Planned {
    payloads: Vec<Vec<u8>>,
    applied: u64,
    replays: u64,
}

impl Feed {
    fn new() -> Feed {
        Feed {
            next: vec![1; SOURCES],
            committed: vec![0; SOURCES],
            counter: 0,
            span: REPLAY_SPAN,
        }
    }

    /// Plans the next `n` messages; replays only when `replays` and only of messages
    /// committed in an earlier batch. Call `committed()` once the batch is committed.
    fn plan(&mut self, n: usize, replays: bool) -> Planned {
        let mut p = Planned {
            payloads: Vec::with_capacity(n),
            applied: 0,
            replays: 0,
        };
        for _ in 0..n {
            self.counter += 1;
            let h = mix(self.counter);
            let s = (h % SOURCES as u64) as usize;
            if replays && self.counter.is_multiple_of(REPLAY_EVERY) && self.committed[s] > 0 {
                let top = self.committed[s];
                let span = top.min(self.span);
                let seq = top - (h >> 32) % span;
                p.payloads.push(payload(s, seq));
                p.replays += 1;
            } else {
                let seq = self.next[s];
                self.next[s] += 1;
                p.payloads.push(payload(s, seq));
                p.applied += 1;
            }
        }
        p
    }

    fn committed(&mut self) {
        for (c, n) in self.committed.iter_mut().zip(&self.next) {
            *c = n - 1;
        }
    }
}

fn decode_all(payloads: Vec<Vec<u8>>, contract: &FeedContract) -> Vec<Incoming> {
    let at = now_ms();
    payloads
        .into_iter()
        .map(|p| Incoming::decode(TOPIC, p, at, contract))
        .collect()
}

/// Plans `batches` batches of `size` (untimed), then times decode + commit of all of them.
fn timed_run(
    store: &mut Store,
    feed: &mut Feed,
    contract: &FeedContract,
    batches: u64,
    size: usize,
) -> Duration {
    let mut plans = Vec::with_capacity(batches as usize);
    let (mut applied, mut replays) = (0, 0);
    for _ in 0..batches {
        let p = feed.plan(size, true);
        // The timed loop commits the batches in order, so each sees all earlier ones.
        feed.committed();
        applied += p.applied;
        replays += p.replays;
        plans.push(p.payloads);
    }
    let mut counts = OutcomeCounts::default();
    let start = Instant::now();
    for payloads in plans {
        let batch = decode_all(payloads, contract);
        let report = store.commit_batch(&batch, now_ms()).expect("commit_batch");
        counts.merge(&report.counts);
    }
    let elapsed = start.elapsed();
    assert_eq!(counts.get(Outcome::Applied), applied, "{counts}");
    assert_eq!(counts.get(Outcome::Duplicate), replays, "{counts}");
    elapsed
}

/// A fresh database seeded (untimed) with one message per source.
fn fresh_store(contract: &FeedContract, concurrency: Concurrency) -> (TempDir, Store, Feed) {
    fresh_store_with(
        contract,
        StoreOptions {
            concurrency,
            ..options(DEFAULT_CACHE_BYTES)
        },
    )
}

fn fresh_store_with(contract: &FeedContract, opts: StoreOptions) -> (TempDir, Store, Feed) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(&dir.path().join("bench.redb"), opts, 1_000).expect("open store");
    let mut feed = Feed::new();
    let mut seed = Vec::new();
    for s in 0..SOURCES {
        seed.push(payload(s, feed.next[s]));
        feed.next[s] += 1;
    }
    store
        .commit_batch(&decode_all(seed, contract), now_ms())
        .expect("seed");
    feed.committed();
    (dir, store, feed)
}

/// The 1,000,000-entry database, built once per process.
struct Prefilled {
    _dir: TempDir,
    path: PathBuf,
    store: Option<Store>,
    cache_bytes: usize,
    feed: Feed,
}

impl Prefilled {
    fn build(contract: &FeedContract) -> Prefilled {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bench-1m.redb");
        let mut store =
            Store::open(&path, options(DEFAULT_CACHE_BYTES), 1_000).expect("open store");
        let mut feed = Feed::new();
        let start = Instant::now();
        let mut done = 0u64;
        while done < WINDOW_ENTRIES {
            let n = PREFILL_BATCH.min((WINDOW_ENTRIES - done) as usize);
            let p = feed.plan(n, false);
            let report = store
                .commit_batch(&decode_all(p.payloads, contract), now_ms())
                .expect("prefill commit");
            assert_eq!(report.counts.get(Outcome::Applied), n as u64);
            feed.committed();
            done += n as u64;
            if done.is_multiple_of(200_704) || done == WINDOW_ENTRIES {
                let secs = start.elapsed().as_secs_f64();
                eprintln!(
                    "prefill: {done} messages in {secs:.1} s ({:.0} msg/s)",
                    done as f64 / secs
                );
            }
        }
        let size = std::fs::metadata(&path).map_or(0, |m| m.len());
        eprintln!(
            "prefill: database file {:.1} MiB ({:.0} bytes/message)",
            size as f64 / (1024.0 * 1024.0),
            size as f64 / WINDOW_ENTRIES as f64
        );
        Prefilled {
            _dir: dir,
            path,
            store: Some(store),
            cache_bytes: DEFAULT_CACHE_BYTES,
            feed,
        }
    }

    /// Times `batches` batches of `size` on the store opened with `cache_bytes` (reopening it
    /// first, untimed, if it is open with another cache size).
    fn run(
        &mut self,
        cache_bytes: usize,
        contract: &FeedContract,
        batches: u64,
        size: usize,
    ) -> Duration {
        if self.cache_bytes != cache_bytes {
            drop(self.store.take());
            self.store =
                Some(Store::open(&self.path, options(cache_bytes), 1_000).expect("reopen store"));
            self.cache_bytes = cache_bytes;
        }
        let store = self.store.as_mut().expect("store is open");
        timed_run(store, &mut self.feed, contract, batches, size)
    }
}

fn configure(group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(3))
        .measurement_time(Duration::from_secs(10));
}

fn empty_window(c: &mut Criterion, contract: &FeedContract) {
    let mut group = c.benchmark_group("empty_window");
    configure(&mut group);
    for size in BATCH_SIZES {
        group.throughput(Throughput::Elements(size as u64));
        group.bench_function(BenchmarkId::from_parameter(size), |b| {
            b.iter_custom(|batches| {
                let (dir, mut store, mut feed) = fresh_store(contract, Concurrency::default());
                let t = timed_run(&mut store, &mut feed, contract, batches, size);
                drop(store);
                drop(dir);
                t
            });
        });
    }
    group.finish();
}

/// What redb's `MultiWriter` mode (the default: operator commands may write while `run` runs)
/// costs against `SingleWriter`, at `run`'s typical batch size and at batch 1.
fn concurrency(c: &mut Criterion, contract: &FeedContract) {
    let mut group = c.benchmark_group("concurrency");
    configure(&mut group);
    for size in [1, 64] {
        group.throughput(Throughput::Elements(size as u64));
        for (name, mode) in [
            ("single_writer", Concurrency::SingleWriter),
            ("multi_writer", Concurrency::MultiWriter),
        ] {
            group.bench_function(BenchmarkId::new(name, size), |b| {
                b.iter_custom(|batches| {
                    let (dir, mut store, mut feed) = fresh_store(contract, mode);
                    let t = timed_run(&mut store, &mut feed, contract, batches, size);
                    drop(store);
                    drop(dir);
                    t
                });
            });
        }
    }
    group.finish();
}

/// What retention costs while it is pruning: a window of 2,000 entries, and either no
/// retention or every log capped at 2,000 entries, so that in steady state each commit also
/// deletes about one batch's worth of audit entries and effects.
fn retention(c: &mut Criterion, contract: &FeedContract) {
    let mut group = c.benchmark_group("retention");
    configure(&mut group);
    let cap = LogRetention {
        max_age_seconds: None,
        max_entries: Some(2_000),
    };
    for (name, policy) in [
        ("keep_all", RetentionPolicy::keep_all()),
        (
            "pruning",
            RetentionPolicy {
                audit: cap,
                effects: cap,
                quarantine: cap,
            },
        ),
    ] {
        group.throughput(Throughput::Elements(64));
        group.bench_function(BenchmarkId::new(name, 64), |b| {
            b.iter_custom(|batches| {
                let opts = StoreOptions {
                    window: WindowPolicy {
                        seconds: 86_400,
                        max_entries: 2_000,
                    },
                    retention: policy,
                    ..options(DEFAULT_CACHE_BYTES)
                };
                let (dir, mut store, mut feed) = fresh_store_with(contract, opts);
                feed.span = 10; // ~40 entries per source in the window: replays stay in it
                // Untimed: fill past the caps so every timed commit prunes.
                timed_run(&mut store, &mut feed, contract, 100, 64);
                let t = timed_run(&mut store, &mut feed, contract, batches, 64);
                drop(store);
                drop(dir);
                t
            });
        });
    }
    group.finish();
}

fn window_1m(c: &mut Criterion, contract: &FeedContract) {
    let mut big: Option<Prefilled> = None;
    let mut group = c.benchmark_group("window_1m");
    configure(&mut group);
    for size in BATCH_SIZES {
        group.throughput(Throughput::Elements(size as u64));
        group.bench_function(BenchmarkId::from_parameter(size), |b| {
            let big = big.get_or_insert_with(|| Prefilled::build(contract));
            b.iter_custom(|batches| big.run(DEFAULT_CACHE_BYTES, contract, batches, size));
        });
    }
    group.finish();

    let mut group = c.benchmark_group("window_1m_cache256");
    configure(&mut group);
    group.throughput(Throughput::Elements(512));
    group.bench_function(BenchmarkId::from_parameter(512), |b| {
        let big = big.get_or_insert_with(|| Prefilled::build(contract));
        b.iter_custom(|batches| big.run(256 * 1024 * 1024, contract, batches, 512));
    });
    group.finish();
}

fn main() {
    let contract = FeedContract::default();
    assert_eq!(payload(7, 123_456).len(), PAYLOAD_BYTES);
    let mut c = Criterion::default().configure_from_args();
    empty_window(&mut c, &contract);
    concurrency(&mut c, &contract);
    retention(&mut c, &contract);
    window_1m(&mut c, &contract);
    c.final_summary();
}
