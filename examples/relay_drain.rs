//! Relay benchmark driver (figures in the README; `scripts/bench-relay-pg.sh` runs it).
//!
//! - `relay_drain drain CONFIG DB`: starts the relay of CONFIG's sinks on the backlog in DB and
//!   prints how long the first sink took to deliver every effect (events/s). DB `-`: the store
//!   CONFIG names (e.g. `[store] backend = "postgres"`).
//! - `relay_drain steady CONFIG DB RATE SECONDS OUT`: feeds RATE messages/s for SECONDS into DB
//!   through the engine's commit path (as `run` does: whatever is due commits as one batch,
//!   then wakes the relay), with the relay running in this process, and writes
//!   `offset<TAB>commit_unix_ms` per effect to OUT, for joining with the sink's rows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use replay_guard::config::{Config, StoreLocation};
use replay_guard::relay::{self, Relay, Wake};
use replay_guard::store::{Incoming, Reader, Store};

fn now_ms_f() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

fn head(config: &Config) -> u64 {
    let snap = match config.location().unwrap() {
        StoreLocation::File(db) => Reader::open(db).unwrap().begin().unwrap(),
        StoreLocation::Postgres(pg) => Reader::postgres(pg.pg_config().unwrap()).unwrap().1,
    };
    snap.meta().unwrap().next_effect
}

/// Waits until the first sink has delivered up to `target`.
fn wait_delivered(relay: &Relay, target: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let st = relay.status();
        if st.first().is_some_and(|s| s.next >= target) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not delivered within {limit:?}: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let db = Path::new(&args[3]);
    let over = (args[3] != "-").then_some(db);
    let config = Config::resolve(Some(Path::new(&args[2])), over).expect("CONFIG");
    match args[1].as_str() {
        "drain" => {
            let n = head(&config);
            let started = Instant::now();
            let relay = relay::spawn(&config, None, None)
                .unwrap()
                .expect("a [[sink]]");
            wait_delivered(&relay, n, Duration::from_secs(3600));
            let secs = started.elapsed().as_secs_f64();
            relay.stop(Duration::from_secs(10)).unwrap();
            println!(
                "drained {n} effects in {secs:.2} s: {:.0} events/s",
                n as f64 / secs
            );
        }
        "steady" => {
            let rate: f64 = args[4].parse().expect("RATE");
            let seconds: f64 = args[5].parse().expect("SECONDS");
            let mut out = std::io::BufWriter::new(std::fs::File::create(&args[6]).unwrap());
            let mut store =
                Store::open(db, config.store.clone(), replay_guard::timefmt::now_ms()).unwrap();
            let wake = Wake::new();
            let relay = relay::spawn(&config, Some(&wake), None)
                .unwrap()
                .expect("a [[sink]]");
            // One message first, so that the measurement starts with the sink connected.
            let warm = format!(
                r#"{{"agency":"BENCH","source_id":"WARMUP","epoch":1,"sequence":{},"body":"warm-up"}}"#,
                head(&config) + 1
            );
            let now = now_ms_f() as u64;
            let inc = Incoming::decode("bench/steady", warm.into_bytes(), now, &config.feed);
            store.commit_batch(&[inc], now).unwrap();
            wake.bump();
            let first = head(&config);
            wait_delivered(&relay, first, Duration::from_secs(600));
            let started = Instant::now();
            let total = (rate * seconds) as u64;
            let mut sent = 0u64;
            while sent < total {
                let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(total);
                if due <= sent {
                    std::thread::sleep(Duration::from_micros(200));
                    continue;
                }
                let now = now_ms_f() as u64;
                let batch: Vec<Incoming> = (sent..due)
                    .map(|i| {
                        let payload = format!(
                            r#"{{"agency":"BENCH","source_id":"S{}","epoch":1,"sequence":{},"body":"steady load {i}"}}"#,
                            i % 16,
                            i / 16 + 1
                        );
                        Incoming::decode("bench/steady", payload.into_bytes(), now, &config.feed)
                    })
                    .collect();
                store.commit_batch(&batch, now).unwrap();
                let committed = now_ms_f();
                wake.bump();
                for i in sent..due {
                    writeln!(out, "{}\t{committed:.3}", first + i).unwrap();
                }
                sent = due;
            }
            wait_delivered(&relay, first + total, Duration::from_secs(600));
            relay.stop(Duration::from_secs(10)).unwrap();
            store.close().unwrap();
            out.flush().unwrap();
            println!(
                "fed {total} messages at {rate} msg/s in {:.2} s",
                started.elapsed().as_secs_f64()
            );
        }
        other => panic!("unknown mode {other:?}: drain | steady"),
    }
}
