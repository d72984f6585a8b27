//! The postgres sink against the real PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth;
//! `scripts/test.sh` makes sure one runs). Each test makes its own database and drops it at the
//! end, also when it panics. PostgreSQL is inspected with `psql`. First the sink through the
//! library, then `replay-guard relay` killed with SIGKILL and cut off from PostgreSQL.

use std::process::{Command, Stdio};
use std::time::Duration;

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
        outcome: envelope::effect_fields(&view).0,
        fields: envelope::effect_fields(&view).1,
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

/// `common::wait_until` with the limit first.
fn wait_until(limit: Duration, what: &str, f: impl FnMut() -> bool) {
    common::wait_until(what, limit, f);
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

/// One edge host for the loss tests: a redb file at `dir/NAME.redb` whose sink `cop-db`
/// writes `table` of `pg`, and a log of its relays.
struct Host {
    db: std::path::PathBuf,
    cfg: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl Host {
    fn new(dir: &std::path::Path, name: &str, pg: &PgDb, table: &str) -> Host {
        let db = dir.join(format!("{name}.redb"));
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "[store]\npath = \"{}\"\n\n[[sink]]\nname = \"cop-db\"\nkind = \"postgres\"\n\
                 dsn = \"{}\"\ntable = \"{table}\"\nbatch_max = 5\nbackoff_initial_ms = 10\n\
                 backoff_max_ms = 100\n",
                db.display(),
                pg.dsn()
            ),
        )
        .unwrap();
        Host {
            db,
            cfg,
            log: dir.join(format!("{name}.log")),
        }
    }

    /// Ingests one message per sequence in `seqs` of source `fire/SOURCE`.
    fn ingest(&self, source: &str, seqs: std::ops::Range<u64>) {
        let lines: String = seqs
            .map(|q| common::msg("fire", source, 1, q, "status") + "\n")
            .collect();
        let feed = self
            .db
            .with_extension(format!("{source}-{}.jsonl", lines.len()));
        std::fs::write(&feed, lines).unwrap();
        let out = common::run(&[
            "ingest",
            "--config",
            self.cfg.to_str().unwrap(),
            feed.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs `replay-guard relay` until `done` holds, then stops it with SIGTERM.
    fn relay_until(&self, what: &str, done: impl FnMut() -> bool) {
        let mut child = common::logged_command(
            &["relay", "--config", self.cfg.to_str().unwrap()],
            &self.log,
        )
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until(Duration::from_secs(60), what, done)
        }));
        super::broker::signal(child.id() as i32, "TERM");
        let status = child.wait().unwrap();
        if let Err(e) = waited {
            panic!("{e:?}\n{}", self.log());
        }
        assert!(status.success(), "relay: {status}\n{}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `replay-guard ARGS --config CFG`: exit code and stdout + stderr.
    fn cmd(&self, args: &[&str]) -> (Option<i32>, String) {
        let mut all = args.to_vec();
        all.extend(["--config", self.cfg.to_str().unwrap()]);
        let out = common::run(&all);
        (
            out.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }
}

/// Rows of `table` (0 before the sink made it).
fn count(pg: &PgDb, table: &str) -> u64 {
    if pg.sql(&format!("SELECT to_regclass('{table}') IS NULL")) == "t" {
        return 0;
    }
    pg.sql(&format!("SELECT count(*) FROM {table}"))
        .parse()
        .unwrap()
}

/// `offset:id` of every row of `table`, in offset order.
fn table_rows(pg: &PgDb, table: &str) -> Vec<String> {
    pg.sql(&format!(
        "SELECT effect_offset || ':' || id FROM {table} ORDER BY effect_offset, id"
    ))
    .lines()
    .map(str::to_string)
    .collect()
}

/// `offset:id` of every effect of the store at `db`, in offset order.
fn store_rows(db: &std::path::Path) -> Vec<String> {
    common::effects(db)
        .iter()
        .map(|e| {
            let r = &e.record;
            format!(
                "{}:{}",
                e.offset,
                envelope::event_id(&r.key, r.released, &r.payload)
            )
        })
        .collect()
}

#[test]
fn two_stores_with_one_sink_name_in_one_schema_never_adopt_each_others_cursor() {
    let pg = PgDb::new("two_stores");
    pg.sql("CREATE SCHEMA cop");
    let dir = tempfile::tempdir().unwrap();
    let a = Host::new(dir.path(), "a", &pg, "cop.events_a");
    let b = Host::new(dir.path(), "b", &pg, "cop.events_b");
    a.ingest("a1", 0..8);
    a.relay_until("A delivers 8", || count(&pg, "cop.events_a") == 8);
    b.ingest("b1", 0..20);
    b.relay_until("B delivers 20", || count(&pg, "cop.events_b") == 20);
    a.ingest("a1", 8..23);
    a.relay_until("A delivers 23", || count(&pg, "cop.events_a") == 23);
    // Each table holds its own store's effects, each once, and each cursor row names its
    // store and table.
    assert_eq!(table_rows(&pg, "cop.events_a"), store_rows(&a.db));
    assert_eq!(table_rows(&pg, "cop.events_b"), store_rows(&b.db));
    assert_eq!(
        pg.sql(
            "SELECT events_table || '=' || next_offset FROM cop.replay_guard_relay_cursors \
             WHERE sink = 'cop-db' ORDER BY 1"
        ),
        "cop.events_a=23\ncop.events_b=20"
    );
    assert!(
        !a.log().contains("cursor taken from the sink's own store"),
        "{}",
        a.log()
    );
    let (code, out) = a.cmd(&["verify"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(
            "sink cop-db: every offset from 0 to its cursor 23 accounted for: 23 delivered"
        ),
        "{out}"
    );
}

#[test]
fn a_restored_backup_draws_a_new_id_and_delivers_what_it_decides_after_the_restore() {
    let pg = PgDb::new("restore");
    let dir = tempfile::tempdir().unwrap();
    let a = Host::new(dir.path(), "a", &pg, "cop_events");
    a.ingest("e1", 0..10);
    a.relay_until("10 delivered", || count(&pg, "cop_events") == 10);
    let backup = dir.path().join("a.backup.redb");
    let (code, out) = a.cmd(&["backup", "--to", backup.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{out}");
    a.ingest("e1", 10..20);
    a.relay_until("20 delivered", || count(&pg, "cop_events") == 20);
    let (_, before) = a.cmd(&["stats", "--format", "json"]);
    // The disk is lost; the backup is restored in its place and takes new messages (other
    // content at the offsets the lost file had used).
    std::fs::copy(&backup, &a.db).unwrap();
    a.ingest("e2", 0..15);
    a.relay_until("the restored store's 15 new effects delivered", || {
        count(&pg, "cop_events") == 35
    });
    // The restored file drew an id of its own on its first write, and says where it came from.
    let (_, after) = a.cmd(&["stats", "--format", "json"]);
    let id = |stats: &str| {
        let doc = replay_guard::json::parse(stats.trim().as_bytes(), 64).unwrap();
        super::relay::field(&doc, "store_id")
    };
    let (original, restored) = (id(&before), id(&after));
    assert_ne!(restored, original);
    assert!(
        after.contains(&format!("\"id\":\"{original}\",\"how\":\"backup\"")),
        "{after}"
    );
    // Everything the restored store holds is in the table (offsets 10-24 twice over: the lost
    // file's and the restored one's, under different ids), each id once.
    let rows = table_rows(&pg, "cop_events");
    for r in store_rows(&a.db) {
        assert!(rows.contains(&r), "{r} missing from the table");
    }
    assert_eq!(pg.sql("SELECT count(DISTINCT id) FROM cop_events"), "35");
    let (code, out) = a.cmd(&["verify"]);
    assert_eq!(code, Some(0), "{out}");
}

#[test]
fn a_cursor_table_of_another_shape_is_an_error_shown_and_retried_never_a_panic() {
    let pg = PgDb::new("shape");
    let dir = tempfile::tempdir().unwrap();
    let a = Host::new(dir.path(), "a", &pg, "cop_events");
    a.ingest("e1", 0..6);
    let (_, stats) = a.cmd(&["stats", "--format", "json"]);
    let doc = replay_guard::json::parse(stats.trim().as_bytes(), 64).unwrap();
    let store_id = super::relay::field(&doc, "store_id");
    // A cursor table someone made with next_offset numeric, holding a row for this store.
    pg.sql(
        "CREATE TABLE replay_guard_relay_cursors (store_id text, events_table text, sink text, \
         next_offset numeric, generation numeric, updated_at timestamptz, \
         PRIMARY KEY (store_id, events_table, sink))",
    );
    pg.sql(&format!(
        "INSERT INTO replay_guard_relay_cursors VALUES \
         ('{store_id}', 'public.cop_events', 'cop-db', 3, 0, now())"
    ));
    let mut child = common::logged_command(&["relay", "--config", a.cfg.to_str().unwrap()], &a.log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "the error in relay status", || {
        a.cmd(&["relay", "status"]).1.contains("cannot be read")
    });
    let (_, status) = a.cmd(&["relay", "status"]);
    assert!(
        status.contains(
            "the cursor row of sink \"cop-db\" in replay_guard_relay_cursors cannot be read"
        ),
        "{status}"
    );
    // Still running, and it delivers once the table is put right.
    assert!(child.try_wait().unwrap().is_none(), "{}", a.log());
    pg.sql("DROP TABLE replay_guard_relay_cursors");
    wait_until(Duration::from_secs(60), "6 delivered", || {
        count(&pg, "cop_events") == 6
    });
    super::broker::signal(child.id() as i32, "TERM");
    assert!(child.wait().unwrap().success(), "{}", a.log());
    assert!(!a.log().contains("panicked"), "{}", a.log());
    assert_eq!(table_rows(&pg, "cop_events"), store_rows(&a.db));
}

#[test]
fn a_table_that_refuses_every_event_blocks_the_sink_instead_of_parking_the_feed() {
    let pg = PgDb::new("refuses");
    let dir = tempfile::tempdir().unwrap();
    let a = Host::new(dir.path(), "a", &pg, "cop_events");
    // A pre-existing table whose id column is too short for any event id.
    pg.sql(
        "CREATE TABLE cop_events (id varchar(10) PRIMARY KEY, effect_offset bigint NOT NULL, \
         source text NOT NULL, agency text NOT NULL, source_id text NOT NULL, \
         topic text NOT NULL, event jsonb NOT NULL, received_at timestamptz, \
         inserted_at timestamptz NOT NULL DEFAULT now())",
    );
    for (i, source) in ["e1", "e2", "e3", "e4"].iter().enumerate() {
        let i = i as u64;
        a.ingest(source, i * 2..i * 2 + 2);
    }
    let mut child = common::logged_command(&["relay", "--config", a.cfg.to_str().unwrap()], &a.log)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "the sink blocked", || {
        a.cmd(&["relay", "status"]).1.contains(": blocked")
    });
    let (_, status) = a.cmd(&["relay", "status"]);
    assert!(
        status.contains("cop-db (postgres): blocked — cursor 0 of 8")
            && status.contains("table public.cop_events refused the event")
            && status.contains("SQLSTATE 22001")
            && status.contains("nothing is parked"),
        "{status}"
    );
    assert_eq!(a.cmd(&["relay", "parked", "--sink", "cop-db"]).1, "");
    assert!(a.log().contains("relay sink blocked"), "{}", a.log());
    // The table is put right: the feed flows, each event once, nothing parked.
    pg.sql("ALTER TABLE cop_events ALTER COLUMN id TYPE text");
    wait_until(Duration::from_secs(60), "8 delivered", || {
        count(&pg, "cop_events") == 8
    });
    super::broker::signal(child.id() as i32, "TERM");
    assert!(child.wait().unwrap().success(), "{}", a.log());
    assert_eq!(table_rows(&pg, "cop_events"), store_rows(&a.db));
    let (code, out) = a.cmd(&["verify"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("8 delivered, 0 parked"), "{out}");
}

#[test]
fn a_sink_forgotten_and_added_again_at_the_head_does_not_adopt_its_old_cursor_row() {
    let pg = PgDb::new("readded");
    let dir = tempfile::tempdir().unwrap();
    let a = Host::new(dir.path(), "a", &pg, "cop_events");
    a.ingest("e1", 0..10);
    a.relay_until("10 delivered", || count(&pg, "cop_events") == 10);
    a.ingest("e1", 10..20);
    // The sink is taken out of the config and forgotten, effects 10-19 undelivered...
    let config = std::fs::read_to_string(&a.cfg).unwrap();
    let (store, _) = config.split_once("[[sink]]").unwrap();
    let removed = dir.path().join("removed.toml");
    std::fs::write(&removed, store).unwrap();
    let out = common::run(&[
        "relay",
        "forget",
        "--config",
        removed.to_str().unwrap(),
        "--sink",
        "cop-db",
        "--reason",
        "COP table moved",
        "--operator",
        "ana",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // ... and added again to start at the head: its old row (next_offset 10) is not adopted.
    std::fs::write(&a.cfg, format!("{config}start = \"head\"\n")).unwrap();
    a.ingest("e1", 20..25);
    a.relay_until("the 5 new effects delivered", || {
        count(&pg, "cop_events") == 15
    });
    let rows: Vec<u64> = table_rows(&pg, "cop_events")
        .iter()
        .map(|r| r.split(':').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(rows, (0..10).chain(20..25).collect::<Vec<_>>());
    assert!(
        a.log()
            .contains("the sink's own cursor row is older than this cursor: not adopted"),
        "{}",
        a.log()
    );
    let (code, out) = a.cmd(&["verify"]);
    assert_eq!(code, Some(0), "{out}");
}
