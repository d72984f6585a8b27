//! The last hop's silent-loss paths (issue 20), through the real binary with the `exec` sink:
//! a rewind never moves forward, `relay skip` says what it passes over and asks; every offset
//! below a sink's cursor is accounted for (a cursor edited by hand fails `verify`); a parked
//! event is retried from its effect, never from its stored copy (an edited copy fails
//! `verify`); retention keeps a parked event's effect and never prunes what a configured sink
//! has not delivered, however late its relay starts.

use std::path::Path;
use std::time::Duration;

use redb::{Builder, ConcurrencyMode, ReadableTable};
use replay_guard::json::{self, Json};
use replay_guard::store::tables::{SINK_CURSORS, SINK_PARKED};

use super::common;
use super::relay::{REFUSES_13, Setup, field, parked_list, setup, stdout, stop, wait_until};

/// `replay-guard ARGS --config CONFIG` of `s`: (exit code, stdout, stderr).
fn cmd(s: &Setup, args: &[&str]) -> (Option<i32>, String, String) {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--config", s.config.to_str().unwrap()]);
    let out = common::run(&all);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Changes the database with a raw redb write transaction (the relay and `run` stopped).
fn edit(db: &Path, f: impl FnOnce(&redb::WriteTransaction)) {
    let db = Builder::new()
        .set_concurrency_mode(ConcurrencyMode::SingleWriter)
        .open(db)
        .unwrap();
    let txn = db.begin_write().unwrap();
    f(&txn);
    txn.commit().unwrap();
}

/// The `accounting` object of sink `script` in `relay status --format json`.
fn accounting(s: &Setup) -> Json {
    let st = s.status(&s.config);
    match &st["script"] {
        Json::Object(m) => m
            .iter()
            .find(|(k, _)| k == "accounting")
            .map(|(_, v)| v.clone())
            .unwrap(),
        other => panic!("{other:?}"),
    }
}

/// Every event the receiver got, as (rgoffset, body of its data).
fn received(s: &Setup) -> Vec<(u64, String)> {
    s.received()
        .iter()
        .map(|e| {
            let data = match e {
                Json::Object(m) => m.iter().find(|(k, _)| k == "data").unwrap().1.clone(),
                _ => panic!(),
            };
            (field(e, "rgoffset").parse().unwrap(), field(&data, "body"))
        })
        .collect()
}

#[test]
fn a_rewind_never_moves_forward_and_skip_says_what_it_passes_over_and_is_audited() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", "");
    s.ingest(0, 30);
    let mut relay = s.relay();
    s.wait_received(30, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0));
    s.ingest(30, 60);
    // Forward is not a rewind: refused, and the cursor stays.
    let (code, _, err) = cmd(
        &s,
        &[
            "relay",
            "rewind",
            "--sink",
            "script",
            "--to",
            "50",
            "--reason",
            "x",
            "--operator",
            "ana",
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("offset 50 is above sink \"script\"'s cursor (30)")
            && err.contains("would pass over 20 undelivered effects")
            && err.contains("relay skip --sink script --to 50"),
        "{err}"
    );
    // A skip says what it passes over and does nothing without --yes.
    let skip = [
        "relay",
        "skip",
        "--sink",
        "script",
        "--to",
        "50",
        "--reason",
        "duplicates of a replayed CAD export",
        "--operator",
        "ana",
    ];
    let (code, _, err) = cmd(&s, &skip);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "sink script: skipping from offset 30 to 50 passes over 20 undelivered effects \
             (30-49), which the sink will never deliver: nothing was changed; pass --yes"
        ),
        "{err}"
    );
    assert_eq!(field(&s.status(&s.config)["script"], "cursor"), "30");
    let mut yes = skip.to_vec();
    yes.push("--yes");
    let (code, out, err) = cmd(&s, &yes);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "cursor moved from 30 to 50 (generation 1); 20 undelivered effects passed over"
        ),
        "{out}"
    );
    let (_, audit, _) = cmd(&s, &["dump-audit", "--outcome", "relay"]);
    let e = json::parse(audit.trim().as_bytes(), 64).unwrap();
    assert_eq!(
        field(&e, "reason"),
        "relay skip of sink script from offset 30 to 50 by ana: 20 undelivered effects \
         (30-49) passed over: duplicates of a replayed CAD export"
    );
    // The relay goes on from 50: 30-49 never arrive.
    let mut relay = s.relay();
    s.wait_received(40, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0));
    let offsets: Vec<u64> = received(&s).iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (0..30).chain(50..60).collect::<Vec<_>>());
    // Every offset below the cursor is accounted for, in status and in verify.
    let a = accounting(&s);
    for (k, v) in [
        ("from", "0"),
        ("to", "60"),
        ("delivered", "40"),
        ("skipped", "20"),
        ("parked", "0"),
        ("problem", "null"),
    ] {
        assert_eq!(field(&a, k), v, "{k}");
    }
    let (code, out, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains(
            "sink script: every offset from 0 to its cursor 60 accounted for: 40 delivered, 0 \
             parked, 0 delivered after retry, 20 skipped by an audited operator action"
        ),
        "{out}"
    );
    let (_, text, _) = cmd(&s, &["relay", "status"]);
    assert!(
        text.contains("accounted: offsets 0 to 60: 40 delivered, 0 parked"),
        "{text}"
    );
}

#[test]
fn a_rewind_into_a_skipped_range_keeps_the_rest_of_the_skip_audited_and_verify_passing() {
    // Found by the relay model test (`relay_model`): the rewind cuts the skip's ledger entry
    // back to its own offset, and verify then wanted the cut entry to end where the skip's
    // audit entry ends.
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", "");
    s.ingest(0, 30);
    let skip = [
        "relay",
        "skip",
        "--sink",
        "script",
        "--to",
        "20",
        "--reason",
        "x",
        "--operator",
        "ana",
        "--yes",
    ];
    let (code, _, err) = cmd(&s, &skip);
    assert_eq!(code, Some(0), "{err}");
    let rewind = [
        "relay",
        "rewind",
        "--sink",
        "script",
        "--to",
        "10",
        "--reason",
        "x",
        "--operator",
        "ana",
    ];
    let (code, _, err) = cmd(&s, &rewind);
    assert_eq!(code, Some(0), "{err}");
    // 0-9 stay skipped (by the skip's audit entry); 10-19 are delivered again.
    let a = accounting(&s);
    assert_eq!(field(&a, "problem"), "null");
    assert_eq!(
        (field(&a, "to"), field(&a, "skipped")),
        ("10".into(), "10".into())
    );
    let (code, out, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("every offset from 0 to its cursor 10 accounted for: 0 delivered, 0 parked, 0 delivered after retry, 10 skipped"),
        "{out}"
    );
    let mut relay = s.relay();
    s.wait_received(20, Duration::from_secs(30));
    wait_until("the cursor at the head", &s, || {
        field(&s.status(&s.config)["script"], "cursor") == "30"
    });
    assert_eq!(stop(&mut relay), Some(0));
    let offsets: Vec<u64> = received(&s).iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (10..30).collect::<Vec<_>>());
    let (code, out, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("every offset from 0 to its cursor 30 accounted for: 20 delivered, 0 parked, 0 delivered after retry, 10 skipped"),
        "{out}"
    );
}

#[test]
fn a_cursor_moved_by_hand_fails_verify_naming_the_sink_and_the_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", "");
    s.ingest(0, 8);
    let mut relay = s.relay();
    s.wait_received(8, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0));
    s.ingest(8, 23);
    let (code, _, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
    // As if another store's cursor had been adopted: 8 -> 20.
    edit(&s.db, |txn| {
        let mut t = txn.open_table(SINK_CURSORS.raw()).unwrap();
        let bytes = t.get("script").unwrap().unwrap().value().to_vec();
        let mut rec = SINK_CURSORS.decode(&"script", &bytes).unwrap();
        assert_eq!(rec.next, 8);
        rec.next = 20;
        t.insert("script", SINK_CURSORS.encode(&rec).as_slice())
            .unwrap();
    });
    let (code, _, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(
            "sink script: its cursor is at offset 20 but its ledger accounts for offsets up to \
             8 only: offsets 8-19 were neither delivered, parked nor passed over by an audited \
             action"
        ),
        "{err}"
    );
    let (_, text, _) = cmd(&s, &["relay", "status"]);
    assert!(text.contains("ACCOUNTING DOES NOT HOLD"), "{text}");
}

#[test]
fn a_parked_copy_edited_by_hand_fails_verify_and_the_retry_sends_the_effect() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), REFUSES_13, "batch_max = 8", "");
    s.ingest(0, 20);
    let mut relay = s.relay();
    s.wait_received(19, Duration::from_secs(30));
    wait_until("the refused event is parked", &s, || {
        parked_list(&s).len() == 1
    });
    assert_eq!(stop(&mut relay), Some(0));
    let (code, out, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("1 parked events match the events their effects make"),
        "{out}"
    );
    // "status" -> "destroyed" in the copy kept with the parked record.
    edit(&s.db, |txn| {
        let mut t = txn.open_table(SINK_PARKED.raw()).unwrap();
        let bytes = t.get(("script", 13)).unwrap().unwrap().value().to_vec();
        let mut rec = SINK_PARKED.decode(&("script", 13), &bytes).unwrap();
        assert!(rec.event.contains("\"body\":\"status\""), "{}", rec.event);
        rec.event = rec
            .event
            .replace("\"body\":\"status\"", "\"body\":\"destroyed\"");
        t.insert(("script", 13), SINK_PARKED.encode(&rec).as_slice())
            .unwrap();
    });
    let (code, _, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(4), "{err}");
    assert!(
        err.contains(
            "sink script: event parked at offset 13: its stored event differs from the event \
             effect 13 makes"
        ),
        "{err}"
    );
    // The receiver is fixed and the event retried: what arrives is the effect, not the copy.
    std::fs::write(dir.path().join("count.fixed"), "").unwrap();
    let (code, _, err) = cmd(
        &s,
        &[
            "relay",
            "retry",
            "--sink",
            "script",
            "13",
            "--reason",
            "unit E13 added to CAD",
            "--operator",
            "ana",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let mut relay = s.relay();
    s.wait_received(20, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0));
    let got = received(&s);
    assert_eq!(got.len(), 20);
    assert!(got.iter().all(|(_, body)| body == "status"), "{got:?}");
    assert!(got.iter().any(|(o, _)| *o == 13));
    // The retried event is accounted as such, and the database verifies again.
    assert_eq!(field(&accounting(&s), "retried"), "1");
    let (code, _, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn retention_keeps_the_effect_of_a_parked_event_until_it_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let retention = "[window]\nmax_entries = 2\n[retention]\neffects_max_entries = 5\n";
    let s = setup(dir.path(), REFUSES_13, "batch_max = 8", retention);
    s.ingest(0, 20);
    let mut relay = s.relay();
    s.wait_received(19, Duration::from_secs(30));
    wait_until("the refused event is parked", &s, || {
        parked_list(&s).len() == 1
    });
    assert_eq!(stop(&mut relay), Some(0));
    // The sink is caught up; retention would keep 5 effects but the parked one holds 13 on.
    s.ingest(20, 40);
    let offsets: Vec<u64> = common::effects(&s.db).iter().map(|e| e.offset).collect();
    assert_eq!(offsets.first(), Some(&13), "{offsets:?}");
    let (code, out, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("1 parked events match the events their effects make"),
        "{out}"
    );
    std::fs::write(dir.path().join("count.fixed"), "").unwrap();
    stdout(&common::run(&[
        "relay",
        "retry",
        "--config",
        s.config.to_str().unwrap(),
        "--sink",
        "script",
        "--all",
        "--reason",
        "fixed",
        "--operator",
        "ana",
    ]));
    let mut relay = s.relay();
    s.wait_received(40, Duration::from_secs(30));
    wait_until("the parked record goes", &s, || parked_list(&s).is_empty());
    assert_eq!(stop(&mut relay), Some(0));
    // Delivered: retention may take it now.
    s.ingest(40, 41);
    assert_eq!(common::effects(&s.db).len(), 5);
    let (code, _, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_configured_sink_holds_the_log_from_the_first_ingest_however_late_its_relay_starts() {
    let dir = tempfile::tempdir().unwrap();
    let retention = "[window]\nmax_entries = 10\n[retention]\neffects_max_entries = 20\n";
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", retention);
    // No relay has run yet: `ingest` with the config made the sink's cursor first.
    s.ingest(0, 100);
    assert_eq!(common::effects(&s.db).len(), 100);
    let mut relay = s.relay();
    s.wait_received(100, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0));
    let offsets: Vec<u64> = received(&s).iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (0..100).collect::<Vec<_>>());
    s.ingest(100, 101);
    assert_eq!(common::effects(&s.db).len(), 20);
}

#[test]
fn a_sink_forgotten_and_added_again_at_the_head_misses_nothing_its_writer_committed() {
    let dir = tempfile::tempdir().unwrap();
    let retention = "[window]\nmax_entries = 10\n[retention]\neffects_max_entries = 20\n";
    let s = setup(dir.path(), "cat >> \"$OUT\"", "start = \"head\"", retention);
    s.ingest(0, 10);
    // The sink is removed from the config and forgotten.
    let removed = dir.path().join("removed.toml");
    std::fs::write(
        &removed,
        format!("[store]\npath = {:?}\n{retention}", s.db.to_str().unwrap()),
    )
    .unwrap();
    stdout(&common::run(&[
        "relay",
        "forget",
        "--config",
        removed.to_str().unwrap(),
        "--sink",
        "script",
        "--reason",
        "COP import moved",
        "--operator",
        "ana",
    ]));
    // Added again (start = "head"): the next writer makes its cursor before committing, so
    // its relay, started later, gets all 30 effects that writer committed.
    s.ingest(10, 40);
    let mut relay = s.relay();
    s.wait_received(30, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0));
    let offsets: Vec<u64> = received(&s).iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (10..40).collect::<Vec<_>>());
    let (code, _, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_sink_task_that_dies_inside_run_is_restarted_and_said_everywhere_while_run_consumes() {
    use super::broker::{Broker, free_port};
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let port = free_port();
    let s = setup(
        dir.path(),
        "cat >> \"$OUT\"",
        "",
        &format!(
            "{}[metrics]\nlisten = \"127.0.0.1:{port}\"\n",
            super::relay::mqtt_section(&broker, "rg-relay-panic")
        ),
    );
    // While this file names the sink, each start of its task panics (the test's failpoint).
    let panic_file = dir.path().join("panic");
    std::fs::write(&panic_file, "script").unwrap();
    let mut run = std::process::Command::new(common::bin())
        .args(["run", "--config", s.config.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .env("REPLAY_GUARD_TEST_SINK_PANIC", &panic_file)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("relay.log")).unwrap())
        .spawn()
        .unwrap();
    wait_until("the sink's failure is logged", &s, || {
        s.log()
            .contains("relay sink failed; restarting it after a backoff")
    });
    let lines: Vec<String> = (0..50)
        .map(|i| common::msg("ems", &format!("m{}", i % 3), 1, i / 3 + 1, "x"))
        .collect();
    broker.publish_lines("incidents/ems", &lines, "pub-relay-panic");
    // run goes on consuming while the sink fails.
    wait_until("run applies the feed", &s, || {
        common::effects(&s.db).len() == 50
    });
    assert!(s.received().is_empty());
    let st = s.status(&s.config);
    assert_eq!(field(&st["script"], "state"), "failing");
    assert!(
        field(&st["script"], "last_error")
            .contains("failing: its task panicked: sink script panics at start"),
        "{}",
        field(&st["script"], "last_error")
    );
    let (code, out, _) = cmd(&s, &["health"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(
        out.starts_with("REPLAY-GUARD CRITICAL - sink script failing: its task panicked"),
        "{out}"
    );
    let (_, samples) = super::metrics::scrape(port);
    assert!(samples["replay_guard_relay_sink_restarts_total{sink=\"script\"}"] >= 1.0);
    assert_eq!(
        samples["replay_guard_relay_sink_failing{sink=\"script\"}"],
        1.0
    );
    // The cause goes: the restarted task delivers everything, once, and says so.
    std::fs::remove_file(&panic_file).unwrap();
    s.wait_received(50, Duration::from_secs(30));
    wait_until("the sink is caught up", &s, || {
        field(&s.status(&s.config)["script"], "state") == "caught_up"
    });
    let (code, out, _) = cmd(&s, &["health"]);
    assert!(!out.contains("failing"), "{out}");
    assert_eq!(code, Some(0), "{out}");
    let (_, samples) = super::metrics::scrape(port);
    assert_eq!(
        samples["replay_guard_relay_sink_failing{sink=\"script\"}"],
        0.0
    );
    assert_eq!(stop(&mut run), Some(0), "{}", s.log());
    super::relay::assert_all_delivered(&s, true);
}

#[test]
fn a_sink_retrying_a_failing_event_follows_a_skip_within_a_second() {
    let dir = tempfile::tempdir().unwrap();
    // A receiver failing transiently (exit 3) on sequence 0, whatever happens.
    let s = setup(
        dir.path(),
        "input=$(cat)\n\
         if printf '%s\\n' \"$input\" | grep -q '\"rgsequence\":\"0\"'; then exit 3; fi\n\
         printf '%s\\n' \"$input\" >> \"$OUT\"",
        "batch_max = 1",
        "",
    );
    s.ingest(0, 6);
    let mut relay = s.relay();
    wait_until("the sink retries offset 0", &s, || {
        s.log().contains("delivery failed; retrying")
    });
    let (code, _, err) = cmd(
        &s,
        &[
            "relay",
            "skip",
            "--sink",
            "script",
            "--to",
            "1",
            "--reason",
            "the receiver cannot take it",
            "--operator",
            "ana",
            "--yes",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let started = std::time::Instant::now();
    s.wait_received(5, Duration::from_secs(10));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the running sink followed the skip only after {:?}",
        started.elapsed()
    );
    assert_eq!(stop(&mut relay), Some(0));
    let offsets: Vec<u64> = received(&s).iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (1..6).collect::<Vec<_>>());
    let a = accounting(&s);
    assert_eq!(
        (field(&a, "skipped"), field(&a, "delivered")),
        ("1".into(), "5".into())
    );
}

#[test]
fn a_discarded_parked_event_is_audited_accounted_and_no_longer_holds_retention() {
    let dir = tempfile::tempdir().unwrap();
    let retention = "[window]\nmax_entries = 2\n[retention]\neffects_max_entries = 5\n";
    let s = setup(dir.path(), REFUSES_13, "batch_max = 8", retention);
    s.ingest(0, 20);
    let mut relay = s.relay();
    s.wait_received(19, Duration::from_secs(30));
    wait_until("the refused event is parked", &s, || {
        parked_list(&s).len() == 1
    });
    assert_eq!(stop(&mut relay), Some(0));
    s.ingest(20, 40);
    let (_, stats, _) = cmd(&s, &["stats"]);
    assert!(
        stats.contains(
            "kept from its parked event at offset 13 on (`relay retry` or `relay discard` it)"
        ),
        "{stats}"
    );
    let id = field(&parked_list(&s)[0], "id");
    let (code, out, err) = cmd(
        &s,
        &[
            "relay",
            "discard",
            "--sink",
            "script",
            &id,
            "--reason",
            "E13 was decommissioned; CAD never takes it",
            "--operator",
            "ana",
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("sink script: 1 parked event discarded"),
        "{out}"
    );
    assert!(parked_list(&s).is_empty());
    let (_, audit, _) = cmd(&s, &["dump-audit", "--outcome", "relay"]);
    assert!(
        audit.contains(&format!(
            "relay discard of event {id} (offset 13) on sink script by ana: E13 was \
             decommissioned; CAD never takes it; it will not be delivered"
        )),
        "{audit}"
    );
    let (code, out, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("19 delivered, 0 parked"), "{out}");
    assert_eq!(field(&accounting(&s), "discarded"), "1");
    // Nothing holds the log below the cursor (20) any more.
    s.ingest(40, 41);
    let offsets: Vec<u64> = common::effects(&s.db).iter().map(|e| e.offset).collect();
    assert_eq!(offsets.first(), Some(&20), "{offsets:?}");
}

/// A config for the feed writer beside the relay unit's `s.config`: the same store and
/// retention, no sink of its own, and `[relay] sinks_from` naming the relay unit's config
/// (relative to its own directory) when `declare` is set.
fn writer_config(s: &Setup, retention: &str, declare: bool) -> std::path::PathBuf {
    let path = s
        .dir
        .join(if declare { "run.toml" } else { "run-old.toml" });
    std::fs::write(
        &path,
        format!(
            "[store]\npath = {:?}\n[mqtt]\nbrokers = [\"mqtt://127.0.0.1:1\"]\n\
             client_id = \"rg-writer\"\ntopics = [\"incidents/#\"]\n{retention}{}",
            s.db.to_str().unwrap(),
            if declare {
                "[relay]\nsinks_from = \"rg.toml\"\n"
            } else {
                ""
            }
        ),
    )
    .unwrap();
    path
}

fn ingest_with(config: &Path, s: &Setup, from: u64, to: u64) {
    let lines: Vec<String> = (from..to)
        .map(|i| common::msg("fire", &format!("e{}", i % 5), 1, i, "status"))
        .collect();
    let file = s.dir.join(format!("writer-{from}.jsonl"));
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    stdout(&common::run(&[
        "ingest",
        "--config",
        config.to_str().unwrap(),
        file.to_str().unwrap(),
    ]));
}

#[test]
fn a_relay_unit_that_starts_late_loses_nothing_once_the_writer_declares_its_sinks() {
    let retention = "[window]\nmax_entries = 10\n[retention]\neffects_max_entries = 20\n";
    // As relay-unit.md told operators before: the sinks moved out of the writer's config.
    // Until the relay unit first opens the store, retention prunes what no sink claimed;
    // the sink then begins at offset 80, and every verdict says so.
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", retention);
    let old = writer_config(&s, retention, false);
    ingest_with(&old, &s, 0, 100);
    assert_eq!(common::effects(&s.db).len(), 20);
    let mut relay = s.relay();
    s.wait_received(20, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0));
    let began = "began at offset 80: 80 effects applied before it existed were not delivered \
                 to it";
    let (code, out, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(began), "{out}");
    let (_, status, _) = cmd(&s, &["relay", "status"]);
    assert!(status.contains(began), "{status}");
    let (_, report, err) = cmd(&s, &["report", "--format", "json", "-o", "-"]);
    assert!(
        report.contains(&format!("script caught up ({began})")),
        "{err}{report}"
    );

    // With `[relay] sinks_from`, the writer makes the relay unit's cursors before its first
    // commit: retention holds for them, however late the relay unit starts.
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", retention);
    let run = writer_config(&s, retention, true);
    let checked = common::run(&["check-config", run.to_str().unwrap()]);
    let (code, out, err) = (
        checked.status.code(),
        String::from_utf8_lossy(&checked.stdout).into_owned(),
        String::from_utf8_lossy(&checked.stderr).into_owned(),
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("declares script (exec) for the relay unit (rg.toml: retention holds"),
        "{out}"
    );
    ingest_with(&run, &s, 0, 100);
    assert_eq!(common::effects(&s.db).len(), 100, "nothing pruned");
    let status = stdout(&common::run(&[
        "relay",
        "status",
        "--config",
        run.to_str().unwrap(),
    ]));
    assert!(
        status.starts_with("script (exec): behind — cursor 0 of 100"),
        "{status}"
    );
    let mut relay = s.relay();
    s.wait_received(100, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0));
    let offsets: Vec<u64> = received(&s).iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, (0..100).collect::<Vec<_>>());
    let (code, out, err) = cmd(&s, &["verify"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("began at"), "{out}");
    // Delivered: retention may take them now.
    ingest_with(&run, &s, 100, 101);
    assert_eq!(common::effects(&s.db).len(), 20);
}

#[test]
fn check_config_reads_the_relay_units_config_with_the_writers_and_refuses_what_loses_retention() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), "cat >> \"$OUT\"", "", "");
    let relay_toml = std::fs::read_to_string(&s.config).unwrap();
    let run = writer_config(&s, "", true);
    let check = |what: &str, want: &str| {
        let out = common::run(&["check-config", run.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{what}: {err}");
        assert!(
            err.contains("[relay] sinks_from") && err.contains(want),
            "{what}: {err}"
        );
        // `run` and `ingest` load it the same way: nothing decided or pruned meanwhile.
        let out = common::run_with_stdin(&["ingest", "--config", run.to_str().unwrap(), "-"], b"");
        assert_eq!(out.status.code(), Some(1), "{what}: ingest");
    };
    // A TOML error in the relay unit's config.
    std::fs::write(&s.config, format!("{relay_toml}\nnot toml at all\n")).unwrap();
    check("a TOML error", "rg.toml");
    // A path typo.
    std::fs::write(&s.config, &relay_toml).unwrap();
    std::fs::write(
        &run,
        format!(
            "[store]\npath = {:?}\n[relay]\nsinks_from = \"rg.tom\"\n",
            s.db.to_str().unwrap()
        ),
    )
    .unwrap();
    check("a path typo", "rg.tom");
    // A sink in both.
    std::fs::write(
        &run,
        format!(
            "[relay]\nsinks_from = \"rg.toml\"\n{}",
            relay_toml.replace("[service]\nshutdown_timeout_seconds = 5\n", "")
        ),
    )
    .unwrap();
    check("a sink in both", "sink \"script\" is in both configs");
    // Another store.
    std::fs::write(
        &run,
        format!(
            "[store]\npath = {:?}\n[relay]\nsinks_from = \"rg.toml\"\n",
            s.dir.join("other.redb").to_str().unwrap()
        ),
    )
    .unwrap();
    check("another store", "it names another store");
}
