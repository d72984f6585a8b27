//! The postgres sink against the real PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth;
//! `scripts/test.sh` makes sure one runs). Each test makes its own database and drops it at the
//! end, also when it panics. PostgreSQL is inspected with `psql`. First the sink through the
//! library, then `replay-guard relay` killed with SIGKILL and cut off from PostgreSQL.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use replay_guard::config::Config;
use replay_guard::relay::envelope::{self, EffectView};
use replay_guard::relay::{Attempt, CursorAfter, Event, Failure, Sink};
use replay_guard::store::Reader;

use crate::common::{self, SplitMix64};
use crate::pg::PgDb;

fn sink(db: &PgDb, table: &str) -> Sink {
    let config = Config::parse(&format!(
        "[[sink]]\nname = \"cop-db\"\nkind = \"postgres\"\ndsn = \"{}\"\ntable = \"{table}\"\n\
         timeout_ms = 5000\n",
        db.dsn()
    ))
    .unwrap();
    Sink::new(&config.relay.sinks[0]).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The event of effect `offset` as the runner builds it; `body` is the message's body.
pub(super) fn event(offset: u64, body: &str) -> Event {
    let key = replay_guard::key::sha256(&[offset.to_le_bytes().as_slice()]);
    let payload = format!(
        r#"{{"agency":"fire","source_id":"cad-{}","epoch":1,"sequence":{offset},"body":"{body}"}}"#,
        offset % 3
    );
    let view = EffectView {
        offset,
        key: &key,
        agency: "fire",
        source_id: &format!("cad-{}", offset % 3),
        epoch: 1,
        sequence: offset,
        received_at_ms: 1_764_547_200_000 + offset,
        late: false,
        released: false,
        payload: payload.as_bytes(),
    };
    Event {
        offset,
        id: envelope::event_id(&key, false, payload.as_bytes()),
        key,
        agency: "fire".into(),
        source_id: format!("cad-{}", offset % 3),
        topic: format!("incidents/fire/cad-{}", offset % 3),
        json: envelope::envelope("urn:replay-guard:test", &view),
    }
}

fn events(offsets: std::ops::Range<u64>) -> Vec<Event> {
    offsets.map(|o| event(o, "b")).collect()
}

fn cursor(next_after: u64) -> CursorAfter {
    CursorAfter {
        store: [7; 16],
        generation: 0,
        next_after,
    }
}

#[test]
fn redelivered_events_are_stored_once_and_the_cursor_is_stored_with_them() {
    let db = PgDb::new("once");
    let rt = runtime();
    let mut s = sink(&db, "cop_events");
    rt.block_on(async {
        assert_eq!(s.stored_cursor([7; 16]).await.unwrap(), None);
        assert_eq!(s.deliver(&events(0..5), cursor(5)).await, Attempt::all(5));
        assert_eq!(s.stored_cursor([7; 16]).await.unwrap(), Some(cursor(5)));
        // A crash before the relay wrote its own cursor: the overlap comes again.
        assert_eq!(s.deliver(&events(3..8), cursor(8)).await, Attempt::all(5));
        assert_eq!(s.stored_cursor([7; 16]).await.unwrap(), Some(cursor(8)));
        s.close().await;
    });
    assert_eq!(
        db.sql("SELECT count(*), count(DISTINCT id) FROM cop_events"),
        "8|8"
    );
    assert_eq!(
        db.sql(
            "SELECT store_id, events_table, sink, next_offset, generation \
             FROM replay_guard_relay_cursors"
        ),
        "07070707070707070707070707070707|public.cop_events|cop-db|8|0"
    );
    // The row holds the whole envelope as jsonb, and the columns taken from it.
    let e = event(6, "b");
    let row = db.sql(&format!(
        "SELECT effect_offset, source, agency, source_id, topic, event->>'id', \
         event->'data'->>'body', to_char(received_at AT TIME ZONE 'UTC', \
         'YYYY-MM-DD\"T\"HH24:MI:SS.MS'), event = '{}'::jsonb FROM cop_events WHERE id = '{}'",
        e.json, e.id
    ));
    assert_eq!(
        row,
        format!(
            "6|urn:replay-guard:test|fire|cad-0|incidents/fire/cad-0|{}|b|2025-12-01T00:00:00.006|t",
            e.id
        )
    );
    // A later generation (an operator's rewind) is stored as given.
    rt.block_on(async {
        let rewound = CursorAfter {
            store: [7; 16],
            generation: 1,
            next_after: 4,
        };
        assert_eq!(s.deliver(&events(2..4), rewound).await, Attempt::all(2));
        assert_eq!(s.stored_cursor([7; 16]).await.unwrap(), Some(rewound));
    });
    assert_eq!(db.sql("SELECT count(*) FROM cop_events"), "8");
}

#[test]
fn a_terminated_connection_is_replaced_and_nothing_is_lost_or_doubled() {
    let db = PgDb::new("term");
    let rt = runtime();
    let mut s = sink(&db, "cop_events");
    rt.block_on(async {
        assert_eq!(
            s.deliver(&events(0..10), cursor(10)).await,
            Attempt::all(10)
        );
    });
    assert_eq!(db.terminate_connections(), 1);
    let retries = rt.block_on(async {
        let mut retries = 0;
        loop {
            match s.deliver(&events(10..20), cursor(20)).await {
                a if a == Attempt::all(10) => return retries,
                Attempt {
                    delivered: 0,
                    failure: Some(Failure::Retry { .. }),
                } if retries == 0 => retries += 1,
                other => panic!("after a terminated connection: {other:?}"),
            }
        }
    });
    assert!(retries <= 1);
    rt.block_on(async {
        assert_eq!(s.stored_cursor([7; 16]).await.unwrap(), Some(cursor(20)));
    });
    assert_eq!(
        db.sql("SELECT count(*), count(DISTINCT id) FROM cop_events"),
        "20|20"
    );
}

#[test]
fn an_event_postgres_cannot_store_is_poison_and_the_events_before_it_are_delivered() {
    let db = PgDb::new("poison");
    let rt = runtime();
    let mut s = sink(&db, "cop_events");
    // jsonb cannot hold U+0000: no retry can store this event (SQLSTATE 22P05).
    let mut batch = events(0..5);
    batch[2] = event(2, "a\\u0000b");
    rt.block_on(async {
        let a = s.deliver(&batch, cursor(5)).await;
        assert_eq!(a.delivered, 2, "{a:?}");
        match a.failure {
            Some(Failure::Refused {
                class,
                reason,
                response,
            }) => {
                assert_eq!(class, "SQLSTATE 22P05");
                assert!(
                    reason.contains("table public.cop_events refused"),
                    "{reason}"
                );
                assert!(!response.is_empty());
            }
            other => panic!("{other:?}"),
        }
        // The cursor stops before the poisoned event: a crash before the runner parked it
        // shows it to the runner again, never skips it.
        assert_eq!(s.stored_cursor([7; 16]).await.unwrap(), Some(cursor(2)));
        // Alone, it is poison at once; the rest goes through on the same connection.
        let alone = s.deliver(&batch[2..3], cursor(3)).await;
        assert_eq!(alone.delivered, 0);
        assert!(matches!(alone.failure, Some(Failure::Refused { .. })));
        assert_eq!(s.deliver(&batch[3..], cursor(5)).await, Attempt::all(2));
        assert_eq!(s.stored_cursor([7; 16]).await.unwrap(), Some(cursor(5)));
    });
    assert_eq!(
        db.sql(
            "SELECT string_agg(effect_offset::text, ',' ORDER BY effect_offset) FROM cop_events"
        ),
        "0,1,3,4"
    );
}

#[test]
fn sinks_starting_together_create_the_tables_once_in_the_configured_schema() {
    let db = PgDb::new("schema");
    db.sql("CREATE SCHEMA cop");
    let rt = runtime();
    let mut sinks: Vec<Sink> = (0..6).map(|_| sink(&db, "cop.events")).collect();
    rt.block_on(async {
        let all = futures_join(sinks.iter_mut().map(|s| s.stored_cursor([7; 16]))).await;
        for r in all {
            assert_eq!(r.unwrap(), None);
        }
        assert_eq!(
            sinks[0].deliver(&events(0..3), cursor(3)).await,
            Attempt::all(3)
        );
    });
    assert_eq!(
        db.sql(
            "SELECT string_agg(table_schema || '.' || table_name, ',' ORDER BY table_name) \
             FROM information_schema.tables WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        ),
        "cop.events,cop.replay_guard_relay_cursors"
    );
    assert_eq!(
        db.sql("SELECT next_offset FROM cop.replay_guard_relay_cursors WHERE sink = 'cop-db'"),
        "3"
    );
}

/// Polls every future to completion concurrently (on one thread), in order of the results.
async fn futures_join<F: std::future::Future>(futs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut set = Vec::new();
    for f in futs {
        set.push(Box::pin(f));
    }
    let mut out: Vec<Option<F::Output>> = set.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in set.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

/// Lines per stage of the end-to-end feed (about one in eight is a replay, not an effect).
const STAGE_LINES: u64 = 2_500;
/// `kill -9`s of `relay` that must provably land mid-delivery.
const KILLS: usize = 3;

/// The sink's table and cursor row, read in one statement (one snapshot: a COMMIT the killed
/// relay had sent may still land between two): (rows, distinct ids, one past the highest
/// offset, the cursor row's next offset).
fn table_state(pg: &PgDb) -> (u64, u64, u64, u64) {
    let s = pg.sql(
        "SELECT count(*), count(DISTINCT id), coalesce(max(effect_offset) + 1, 0), \
         (SELECT next_offset FROM replay_guard_relay_cursors WHERE sink = 'cop-db') \
         FROM cop_events",
    );
    let v: Vec<u64> = s.split('|').map(|x| x.parse().unwrap()).collect();
    (v[0], v[1], v[2], v[3])
}

/// The sink's cursor row in PostgreSQL (0 before its first delivery).
fn pg_cursor(pg: &PgDb) -> u64 {
    if pg.sql("SELECT to_regclass('replay_guard_relay_cursors') IS NULL") == "t" {
        return 0;
    }
    let s = pg.sql(
        "SELECT coalesce((SELECT next_offset FROM replay_guard_relay_cursors WHERE sink = 'cop-db'), 0)",
    );
    s.parse().unwrap()
}

/// The sink's cursor in the redb file (the file must not need recovery).
fn own_cursor(db: &std::path::Path) -> u64 {
    Reader::open(db)
        .unwrap()
        .begin()
        .unwrap()
        .sink_cursor("cop-db")
        .unwrap()
        .map_or(0, |r| r.next)
}

/// Rows in the sink's table (0 before the sink made it).
fn rows(pg: &PgDb) -> u64 {
    if pg.sql("SELECT to_regclass('cop_events') IS NULL") == "t" {
        return 0;
    }
    pg.sql("SELECT count(*) FROM cop_events").parse().unwrap()
}

/// Polls `f` every 10 ms until it holds; panics after `limit` naming `what`.
fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn relay_killed_repeatedly_and_cut_off_leaves_each_effect_once_with_the_cursor_at_the_head() {
    let pg = PgDb::new("e2e");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("rg.redb");
    let cfg = dir.path().join("rg.toml");
    // Small batches: many transactions, so a kill lands between and inside them.
    std::fs::write(
        &cfg,
        format!(
            "[store]\npath = \"{}\"\n\n[[sink]]\nname = \"cop-db\"\nkind = \"postgres\"\n\
             dsn = \"{}\"\ntable = \"cop_events\"\nbatch_max = 10\nbackoff_initial_ms = 10\n\
             backoff_max_ms = 200\n",
            db.display(),
            pg.dsn()
        ),
    )
    .unwrap();
    let log = dir.path().join("relay.log");
    let relay = || {
        common::logged_command(&["relay", "--config", cfg.to_str().unwrap()], &log)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn replay-guard relay")
    };
    let relay_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut rng = SplitMix64::new(0x10_5e_a1);
    let mut sent: Vec<String> = Vec::new();
    let mut next_seq = [1u64; 8];
    let mut stage = 0;
    let mut interrupted = 0;
    let mut terminated = false;
    let mut killed_at = None;
    let mut head = 0;
    let mut behind = 0;
    while interrupted < KILLS || !terminated {
        assert!(
            stage < 12,
            "{interrupted} interrupted kills in {stage} stages\n{}",
            relay_log()
        );
        // A stage of the feed, with replays of earlier lines, ingested while no relay runs
        // (and, from the second stage on, after a kill -9).
        let mut lines = String::new();
        for _ in 0..STAGE_LINES {
            let line = if !sent.is_empty() && rng.below(8) == 0 {
                rng.pick(&sent).clone()
            } else {
                let s = rng.below(8) as usize;
                next_seq[s] += 1;
                common::msg("fire", &format!("unit-{s}"), 1, next_seq[s], "update")
            };
            lines.push_str(&line);
            lines.push('\n');
            sent.push(line);
        }
        let feed = dir.path().join(format!("stage-{stage}.jsonl"));
        std::fs::write(&feed, lines).unwrap();
        let out = common::run(&[
            "ingest",
            "--db",
            db.to_str().unwrap(),
            "--config",
            cfg.to_str().unwrap(),
            feed.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stage += 1;
        // Read now that `ingest` has recovered the file from the kill: replay-guard's own
        // cursor is never ahead of the one PostgreSQL committed with the rows.
        if let Some(pg_at) = killed_at {
            let own = own_cursor(&db);
            assert!(
                own <= pg_at,
                "redb cursor {own} ahead of PostgreSQL's {pg_at}"
            );
            if own < pg_at {
                behind += 1;
            }
        }
        head = common::effects(&db).len() as u64;

        let before = rows(&pg);
        let mut child = relay();
        wait_until(Duration::from_secs(60), "the relay to deliver", || {
            rows(&pg) > before
        });
        if !terminated {
            // The relay's connection is cut under it: it reconnects and carries on.
            assert!(pg.terminate_connections() >= 1);
            terminated = true;
            let cut_at = rows(&pg);
            wait_until(Duration::from_secs(60), "delivery after the cut", || {
                rows(&pg) > cut_at || rows(&pg) == head
            });
        }
        child.kill().unwrap();
        child.wait().unwrap();

        // What PostgreSQL holds after the kill: exactly the effects below its cursor row, each
        // once.
        let (n, distinct, end, cursor) = table_state(&pg);
        assert_eq!(
            (n, distinct, end),
            (cursor, cursor, cursor),
            "after kill {stage}"
        );
        killed_at = Some(cursor);
        if cursor < head {
            interrupted += 1;
        }
    }

    // Whenever a kill left replay-guard's own cursor behind PostgreSQL's, a restart trusted
    // the one stored with the rows (the runner says so in its log).
    if behind > 0 {
        assert!(
            relay_log().contains("cursor taken from the sink's own store"),
            "{behind} kills left the redb cursor behind, but no restart took PostgreSQL's\n{}",
            relay_log()
        );
    }
    // A last run delivers the rest and stops on SIGTERM.
    let mut child = relay();
    wait_until(
        Duration::from_secs(120),
        "the relay to reach the head",
        || pg_cursor(&pg) == head,
    );
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "relay after SIGTERM: {status}\n{}",
        relay_log()
    );

    let dumped = common::run(&["dump-effects", "--db", db.to_str().unwrap()]);
    assert!(dumped.status.success());
    let effects = String::from_utf8(dumped.stdout).unwrap().lines().count() as u64;
    assert_eq!(effects, head);
    assert!(head > 2 * STAGE_LINES, "{head} effects");
    assert_eq!(table_state(&pg), (head, head, head, head));
    assert_eq!(own_cursor(&db), head);
    // Every row is the effect at its offset: same id as the relay derives, same offset.
    let ids: std::collections::BTreeMap<u64, String> = common::effects(&db)
        .iter()
        .map(|e| {
            let r = &e.record;
            (e.offset, envelope::event_id(&r.key, r.released, &r.payload))
        })
        .collect();
    let stored = pg.sql("SELECT effect_offset, id, event->>'rgoffset' FROM cop_events ORDER BY 1");
    for line in stored.lines() {
        let f: Vec<&str> = line.split('|').collect();
        let off: u64 = f[0].parse().unwrap();
        assert_eq!(ids[&off], f[1], "offset {off}");
        assert_eq!(f[2], f[0]);
    }
}
