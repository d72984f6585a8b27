//! The postgres sink against the real PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth;
//! `scripts/test.sh` makes sure one runs). Each test makes its own database and drops it at the
//! end, also when it panics. PostgreSQL is inspected with `psql`.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use replay_guard::config::Config;
use replay_guard::relay::envelope::{self, EffectView};
use replay_guard::relay::{Attempt, CursorAfter, Event, Failure, Sink};

/// A database of this test run's own, dropped (WITH (FORCE): the sink may still be connected)
/// when the guard goes, panics included.
pub struct PgDb {
    pub name: String,
}

impl PgDb {
    pub fn new(tag: &str) -> PgDb {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let name = format!(
            "rg_it_{tag}_{}_{}_{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        psql("postgres", &format!("CREATE DATABASE {name}"));
        PgDb { name }
    }

    /// Runs `sql` in this database; the rows, one a line, columns split by `|`.
    pub fn sql(&self, sql: &str) -> String {
        psql(&self.name, sql)
    }

    pub fn dsn(&self) -> String {
        format!(
            "host=127.0.0.1 port=5432 user=postgres dbname={}",
            self.name
        )
    }

    /// Ends every other session on this database (the sink's connection).
    pub fn terminate_connections(&self) -> usize {
        let n = self.sql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            self.name
        ));
        n.trim().parse().unwrap()
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let out = Command::new("psql")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                "5432",
                "-U",
                "postgres",
                "-d",
                "postgres",
            ])
            .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-c"])
            .arg(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .output();
        if let Ok(o) = out
            && !o.status.success()
        {
            eprintln!(
                "could not drop test database {}: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

/// `psql` on database `db`: unaligned, tuples only; panics on any SQL error.
pub fn psql(db: &str, sql: &str) -> String {
    let out = Command::new("psql")
        .args(["-h", "127.0.0.1", "-p", "5432", "-U", "postgres", "-d", db])
        .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("run psql (the PostgreSQL client; scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "psql {sql:?} on {db}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

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
fn event(offset: u64, body: &str) -> Event {
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
        assert_eq!(s.stored_cursor().await.unwrap(), None);
        assert_eq!(s.deliver(&events(0..5), cursor(5)).await, Attempt::all(5));
        assert_eq!(s.stored_cursor().await.unwrap(), Some(cursor(5)));
        // A crash before the relay wrote its own cursor: the overlap comes again.
        assert_eq!(s.deliver(&events(3..8), cursor(8)).await, Attempt::all(5));
        assert_eq!(s.stored_cursor().await.unwrap(), Some(cursor(8)));
        s.close().await;
    });
    assert_eq!(
        db.sql("SELECT count(*), count(DISTINCT id) FROM cop_events"),
        "8|8"
    );
    assert_eq!(
        db.sql("SELECT sink, next_offset, generation FROM replay_guard_sink_cursors"),
        "cop-db|8|0"
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
            generation: 1,
            next_after: 4,
        };
        assert_eq!(s.deliver(&events(2..4), rewound).await, Attempt::all(2));
        assert_eq!(s.stored_cursor().await.unwrap(), Some(rewound));
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
        assert_eq!(s.stored_cursor().await.unwrap(), Some(cursor(20)));
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
            Some(Failure::Poison { reason, response }) => {
                assert!(reason.contains("22P05"), "{reason}");
                assert!(!response.is_empty());
            }
            other => panic!("{other:?}"),
        }
        // The cursor stops before the poisoned event: a crash before the runner parked it
        // shows it to the runner again, never skips it.
        assert_eq!(s.stored_cursor().await.unwrap(), Some(cursor(2)));
        // Alone, it is poison at once; the rest goes through on the same connection.
        let alone = s.deliver(&batch[2..3], cursor(3)).await;
        assert_eq!(alone.delivered, 0);
        assert!(matches!(alone.failure, Some(Failure::Poison { .. })));
        assert_eq!(s.deliver(&batch[3..], cursor(5)).await, Attempt::all(2));
        assert_eq!(s.stored_cursor().await.unwrap(), Some(cursor(5)));
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
        let all = futures_join(sinks.iter_mut().map(|s| s.stored_cursor())).await;
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
        "cop.events,cop.replay_guard_sink_cursors"
    );
    assert_eq!(
        db.sql("SELECT next_offset FROM cop.replay_guard_sink_cursors WHERE sink = 'cop-db'"),
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
