//! Commit throughput and latency of the store backends, without MQTT: M members each commit
//! their share of N feed-contract messages (10% exact replays of earlier ones) in batches of
//! B, as fast as the store allows; prints msg/s over all members and the p50/p99 of one
//! `commit_batch`. Usage:
//!   store_bench redb PATH N B
//!   store_bench pg DSN SCHEMA MEMBERS N B
//! (`scripts/bench-pg.sh` runs both, same machine, same run.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use replay_guard::store::postgres::{PgConfig, PgStore};
use replay_guard::store::{Backend, Incoming, Store, StoreOptions};
use replay_guard::wire::FeedContract;

fn message(i: u64) -> Vec<u8> {
    // 50 sources; a pure function of i, so a replay is byte-identical.
    let (s, seq) = (i % 50, i / 50 + 1);
    format!(
        r#"{{"agency":"agency-{}","source_id":"unit-{s:03}","epoch":1,"sequence":{seq},"kind":"status","note":"{:0>120}"}}"#,
        s % 5,
        i
    )
    .into_bytes()
}

/// Member `m` of `members`: its messages, in batches (every 10th an exact replay).
fn batches(m: u64, members: u64, n: u64, b: usize) -> Vec<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut i = m;
    let mut k = 0u64;
    while i < n {
        k += 1;
        let payload = if k.is_multiple_of(10) && i > 1000 {
            message(i - 1000)
        } else {
            message(i)
        };
        batch.push(payload);
        if batch.len() == b {
            out.push(std::mem::take(&mut batch));
        }
        i += members;
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}

fn drive(store: &mut Backend, batches: Vec<Vec<Vec<u8>>>) -> (u64, Vec<f64>) {
    let contract = FeedContract::default();
    let mut lat = Vec::new();
    let mut n = 0;
    for batch in batches {
        let now = replay_guard::timefmt::now_ms();
        let incoming: Vec<Incoming> = batch
            .into_iter()
            .map(|p| Incoming::decode("bench", p, now, &contract))
            .collect();
        n += incoming.len() as u64;
        let t = Instant::now();
        store.commit_batch(&incoming, now).unwrap();
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    (n, lat)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let started = Instant::now();
    let (label, mut all, total) = match args[1].as_str() {
        "redb" => {
            let (n, b): (u64, usize) = (args[3].parse().unwrap(), args[4].parse().unwrap());
            let mut store = Backend::Redb(
                Store::open(
                    std::path::Path::new(&args[2]),
                    StoreOptions::default(),
                    replay_guard::timefmt::now_ms(),
                )
                .unwrap(),
            );
            let (done, lat) = drive(&mut store, batches(0, 1, n, b));
            ("redb, 1 member".to_string(), lat, done)
        }
        "pg" => {
            let (dsn, schema) = (args[2].clone(), args[3].clone());
            let members: u64 = args[4].parse().unwrap();
            let (n, b): (u64, usize) = (args[5].parse().unwrap(), args[6].parse().unwrap());
            let cfg = PgConfig::parse(&dsn, &schema).unwrap();
            drop(PgStore::open(cfg.clone(), StoreOptions::default(), 0).unwrap());
            let handles: Vec<_> = (0..members)
                .map(|m| {
                    let cfg = cfg.clone();
                    std::thread::spawn(move || {
                        let mut store = Backend::Postgres(
                            PgStore::open(cfg, StoreOptions::default(), 0).unwrap(),
                        );
                        drive(&mut store, batches(m, members, n, b))
                    })
                })
                .collect();
            let mut lat = Vec::new();
            let mut done = 0;
            for h in handles {
                let (d, l) = h.join().unwrap();
                done += d;
                lat.extend(l);
            }
            (format!("postgres, {members} member(s)"), lat, done)
        }
        other => panic!("unknown backend {other}"),
    };
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{label}: {total} messages in {secs:.2} s = {:.0} msg/s; commit p50 {:.2} ms, p99 {:.2} ms ({} commits)",
        total as f64 / secs,
        pct(&mut all, 0.5),
        pct(&mut all, 0.99),
        all.len()
    );
}
