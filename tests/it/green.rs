//! What green means (docs/src/green.md), through the real binary: while a sink's receiver
//! has not received every event, no verdict is green. A program that refuses every event of
//! a one-source feed parks them all: `relay status` says `parked` (never `caught_up`),
//! `health` warns, the report is amber naming what never reached the receiver, and a real
//! Prometheus server evaluating the book's alert rules fires `ReplayGuardSinkParked`. A
//! program refusing a feed of several sources blocks instead (nothing parked, `health`
//! CRITICAL). Fixed, everything arrives, and only then is every verdict green.

use std::time::Duration;

use replay_guard::json::{self, Json};

use super::broker::free_port;
use super::common;
use super::metrics::Alerting;
use super::relay::{Setup, field, parked_list, setup, stdout, stop, wait_until};

/// Refuses every event (exit 65, as a program whose schema changed would) until
/// `count.fixed` exists; then appends what it got to the received file.
const REFUSES_ALL: &str = "input=$(cat)\n\
    if [ ! -e \"$STATE.fixed\" ]; then echo 'schema v2: unit_id required' >&2; exit 65; fi\n\
    printf '%s\\n' \"$input\" >> \"$OUT\"";

/// `n` events of one source, fire/engine-1, sequences 1..=n, decided by `ingest`.
fn ingest_one_source(s: &Setup, n: u64) {
    let lines: Vec<String> = (1..=n)
        .map(|i| common::msg("fire", "engine-1", 1, i, "status"))
        .collect();
    let file = s.dir.join("feed.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    stdout(&common::run(&[
        "ingest",
        "--config",
        s.config.to_str().unwrap(),
        file.to_str().unwrap(),
    ]));
}

/// Member `k` of object `v`.
fn json_at(v: &Json, k: &str) -> Json {
    match v {
        Json::Object(m) => m.iter().find(|(n, _)| n == k).unwrap().1.clone(),
        other => panic!("{other:?}"),
    }
}

fn health(s: &Setup) -> (Option<i32>, String) {
    let out = common::run(&["health", "--config", s.config.to_str().unwrap()]);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The report's JSON: (verify.verdict, summary.undelivered).
fn report(s: &Setup) -> (String, Json) {
    let out = common::run(&[
        "report",
        "--config",
        s.config.to_str().unwrap(),
        "--format",
        "json",
        "-o",
        "-",
    ]);
    let doc = json::parse(&out.stdout, 64).unwrap();
    let get = |k: &str| match &doc {
        Json::Object(m) => m.iter().find(|(n, _)| n == k).unwrap().1.clone(),
        _ => panic!(),
    };
    let summary = get("summary");
    let Json::Object(summary) = summary else {
        panic!()
    };
    (
        field(&get("verify"), "verdict"),
        summary
            .iter()
            .find(|(n, _)| n == "undelivered")
            .unwrap()
            .1
            .clone(),
    )
}

#[test]
fn a_program_refusing_every_event_of_one_source_parks_them_and_no_verdict_is_green() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let s = setup(
        dir.path(),
        REFUSES_ALL,
        "batch_max = 8",
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    ingest_one_source(&s, 60);
    let alerts = Alerting::start(dir.path(), port);
    let mut relay = s.relay();
    wait_until("60 events parked", &s, || parked_list(&s).len() == 60);
    let st = s.status(&s.config);
    assert_eq!(field(&st["script"], "state"), "parked", "{st:?}");
    assert_eq!(field(&st["script"], "delivered"), "0");
    let (code, line) = health(&s);
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.starts_with(
            "REPLAY-GUARD WARNING - sink script 60 parked (never reached the receiver: relay \
             parked) (WARNING 0)"
        ),
        "{line}"
    );
    assert_eq!(
        report(&s),
        (
            "undelivered".to_string(),
            Json::String("script: 0 delivered, 60 parked (never reached the receiver)".into())
        )
    );
    common::wait_until(
        common::lazy(|| format!("the alert fires: {:?}", alerts.firing())),
        Duration::from_secs(60),
        || alerts.firing().iter().any(|a| a == "ReplayGuardSinkParked"),
    );

    // The program is fixed and the operator retries: all 60 arrive, and only now is every
    // verdict green.
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
        "CAD schema v2 deployed",
        "--operator",
        "ana",
    ]));
    s.wait_received(60, Duration::from_secs(30));
    wait_until("nothing parked", &s, || parked_list(&s).is_empty());
    assert_eq!(field(&s.status(&s.config)["script"], "state"), "caught_up");
    assert_eq!(health(&s).0, Some(0), "{}", health(&s).1);
    // The retry is an audit entry (outcome `relay`), not a decision: the hour never counts
    // more decisions than the total.
    let stats = stdout(&common::run(&[
        "stats",
        "--config",
        s.config.to_str().unwrap(),
        "--format",
        "json",
    ]));
    let stats = json::parse(stats.trim().as_bytes(), 64).unwrap();
    let total = |k: &str| field(&json_at(&stats, k), "total");
    assert_eq!(total("decisions_last_hour"), total("decisions_total"));
    // `relay retry --all` audits each event it takes back.
    assert_eq!(field(&stats, "relay_actions_last_hour"), "60");
    assert_eq!(report(&s), ("ok".to_string(), Json::Null));
    common::wait_until(
        common::lazy(|| format!("the alert resolves: {:?}", alerts.firing())),
        Duration::from_secs(60),
        || !alerts.firing().iter().any(|a| a == "ReplayGuardSinkParked"),
    );
    assert_eq!(stop(&mut relay), Some(0));
}

#[test]
fn a_program_refusing_every_event_of_several_sources_blocks_and_delivers_all_once_fixed() {
    let dir = tempfile::tempdir().unwrap();
    let s = setup(dir.path(), REFUSES_ALL, "batch_max = 8", "");
    s.ingest(0, 30);
    let mut relay = s.relay();
    wait_until("the sink blocks", &s, || {
        field(&s.status(&s.config)["script"], "state") == "blocked"
    });
    assert!(
        parked_list(&s).is_empty(),
        "the parked events were taken back"
    );
    assert!(s.received().is_empty());
    let (code, line) = health(&s);
    assert_eq!(code, Some(2), "{line}");
    assert!(
        line.starts_with("REPLAY-GUARD CRITICAL - sink script blocked: "),
        "{line}"
    );
    let (verdict, undelivered) = report(&s);
    assert_eq!(verdict, "undelivered");
    let Json::String(words) = undelivered else {
        panic!("{undelivered:?}")
    };
    assert!(
        words.starts_with("script (blocked): 0 delivered, 30 effects behind ("),
        "{words}"
    );
    // Fixed: the blocked sink, still trying, delivers all 30 in log order, none parked.
    std::fs::write(dir.path().join("count.fixed"), "").unwrap();
    s.wait_received(30, Duration::from_secs(30));
    wait_until("caught up", &s, || {
        field(&s.status(&s.config)["script"], "state") == "caught_up"
    });
    assert_eq!(stop(&mut relay), Some(0));
    let got: Vec<String> = s.received().iter().map(|e| field(e, "id")).collect();
    let want: Vec<String> = s.effect_ids().into_iter().map(|(_, id, _)| id).collect();
    assert_eq!(got, want);
}

/// A sink blocked by a receiver refusing everything, skipped to the head by an operator
/// (`relay skip`): the block is over, and with nothing left to deliver no verdict may go on
/// saying blocked (found by the topology model, seed 4: `health` CRITICAL and `relay status`
/// `blocked` for good after the skip, until the next event arrived). With the relay running
/// (it may note the refusal of an attempt in flight after the skip) and with it stopped.
#[test]
fn a_blocked_sink_skipped_to_the_head_is_caught_up_running_or_not() {
    for running in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let s = setup(dir.path(), REFUSES_ALL, "batch_max = 8", "");
        s.ingest(0, 30);
        let mut relay = s.relay();
        wait_until("the sink blocks", &s, || {
            field(&s.status(&s.config)["script"], "state") == "blocked"
        });
        let still = if running {
            Some(relay)
        } else {
            assert_eq!(stop(&mut relay), Some(0));
            None
        };
        let out = stdout(&common::run(&[
            "relay",
            "skip",
            "--config",
            s.config.to_str().unwrap(),
            "--sink",
            "script",
            "--to",
            "30",
            "--yes",
            "--reason",
            "COP schema change: the 30 events re-keyed by hand",
            "--operator",
            "ana",
        ]));
        assert!(out.contains("30 undelivered effects passed over"), "{out}");
        wait_until("caught up", &s, || {
            field(&s.status(&s.config)["script"], "state") == "caught_up"
        });
        // (The test's feed has gaps upstream, which health and the report say apart.)
        let out = common::run(&[
            "health",
            "--config",
            s.config.to_str().unwrap(),
            "--warn-gaps",
            "off",
            "--crit-gaps",
            "off",
        ]);
        let line = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "running {running}: {line}");
        let (verdict, undelivered) = report(&s);
        assert_eq!(verdict, "missing", "running {running}: {undelivered:?}");
        assert_eq!(undelivered, Json::Null, "running {running}");
        if let Some(mut relay) = still {
            // Still so a while later: the deliverer does not write the block back.
            std::thread::sleep(Duration::from_millis(1500));
            assert_eq!(field(&s.status(&s.config)["script"], "state"), "caught_up");
            assert_eq!(stop(&mut relay), Some(0));
        }
        assert!(s.received().is_empty());
    }
}
