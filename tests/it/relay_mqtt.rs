//! The `mqtt` sink against a second, private Mosquitto, with a `mosquitto_sub` recording every
//! downstream message: order, topics, MQTT 5 properties, a v5 PUBACK refusal (ACL) classed by its code,
//! and the downstream broker killed and restarted mid-batch (rumqttc #1056: no livelock); a
//! scripted broker on the sink's own runtime for PUBACKs read together with the end of the
//! connection; audit events (`stream = "audit"`) under the topic template.

use std::collections::{HashMap, HashSet};
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use replay_guard::config::Config;
use replay_guard::relay::{Attempt, CursorAfter, Event, Failure, Sink};

use super::broker::Broker;
use super::common;

/// One message as the subscriber saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub retained: bool,
    /// MQTT 5 payload format indicator as printed by `mosquitto_sub` (empty when absent).
    pub format: String,
    pub content_type: String,
    pub topic: String,
    pub payload: String,
}

/// `mosquitto_sub` on `#` at QoS 1 with a persistent session, recording every message.
pub struct Subscriber {
    child: Child,
    seen: Arc<Mutex<Vec<Seen>>>,
}

const PROBE: &str = "probe/ready";

impl Subscriber {
    /// Starts the subscriber and waits until it has subscribed (it receives a retained probe).
    pub fn start(broker: &Broker, client_id: &str) -> Subscriber {
        let ok = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &broker.port.to_string()])
            .args(["-q", "1", "-r", "-t", PROBE, "-m", "x"])
            .status()
            .unwrap();
        assert!(ok.success(), "mosquitto_pub of the probe");
        let mut child = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &broker.port.to_string()])
            .args([
                "-V", "mqttv5", "-q", "1", "-c", "-x", "3600", "-i", client_id,
            ])
            .args(["-t", "#", "-F", r"%r\t%F\t%C\t%t\t%p"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto_sub must be installed (apt-get install -y mosquitto-clients)");
        let out = child.stdout.take().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ready = Arc::new(AtomicBool::new(false));
        let (s, r) = (seen.clone(), ready.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                let f: Vec<&str> = line.splitn(5, '\t').collect();
                if f.len() < 5 {
                    continue;
                }
                if f[3] == PROBE {
                    r.store(true, Ordering::SeqCst);
                    continue;
                }
                s.lock().unwrap().push(Seen {
                    retained: f[0] == "1",
                    format: f[1].to_string(),
                    content_type: f[2].to_string(),
                    topic: f[3].to_string(),
                    payload: f[4].to_string(),
                });
            }
        });
        wait_for(
            Duration::from_secs(10),
            "the subscriber to subscribe",
            || ready.load(Ordering::SeqCst),
        );
        Subscriber { child, seen }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Waits until `n` messages arrived.
    pub fn wait_count(&self, n: usize, limit: Duration) {
        wait_for(limit, &format!("{n} messages downstream"), || {
            self.count() >= n
        });
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `common::wait_until` with the limit first.
pub fn wait_for(limit: Duration, what: &str, cond: impl FnMut() -> bool) {
    common::wait_until(what, limit, cond);
}

/// A sink built from config text, as `run` would build it.
fn sink_from(toml: &str) -> Sink {
    let cfg = Config::parse(toml).unwrap();
    Sink::new(&cfg.relay.sinks[0]).unwrap()
}

fn sink_toml(broker: &Broker, protocol: &str, client_id: &str, topic: &str) -> String {
    format!(
        "[[sink]]\nname = \"cop\"\nkind = \"mqtt\"\nbroker = {:?}\nprotocol = {protocol:?}\n\
         client_id = {client_id:?}\ntopic = {topic:?}\ntimeout_ms = 2000\n",
        broker.url()
    )
}

fn event(i: u64, agency: &str, source_id: &str) -> Event {
    Event {
        offset: i,
        id: format!("ev-{i:06}"),
        key: [0; 32],
        agency: agency.to_string(),
        source_id: source_id.to_string(),
        topic: format!("incidents/{}", agency.to_lowercase()),
        json: format!(r#"{{"specversion":"1.0","id":"ev-{i:06}","data":{{"n":{i}}}}}"#),
        outcome: "applied".into(),
        fields: Vec::new(),
    }
}

fn events(n: u64) -> Vec<Event> {
    (0..n)
        .map(|i| event(i, "CALFIRE", &format!("E{}", i % 7)))
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

const CURSOR: CursorAfter = CursorAfter {
    store: [7; 16],
    generation: 1,
    next_after: 0,
};

/// One `deliver` call of `deliver_all`.
struct Call {
    started: Instant,
    from: usize,
    delivered: usize,
}

/// Delivers `batch` as the runner does: the rest again after each retryable failure, until
/// all is delivered. Returns every call and the retryable failures seen.
async fn deliver_all(
    sink: &mut Sink,
    batch: &[Event],
    limit: Duration,
) -> (Vec<Call>, Vec<String>) {
    let start = Instant::now();
    let mut i = 0;
    let (mut calls, mut failures) = (Vec::new(), Vec::new());
    while i < batch.len() {
        assert!(
            start.elapsed() < limit,
            "only {i} of {} delivered after {limit:?}; failures: {failures:?}",
            batch.len()
        );
        let started = Instant::now();
        let Attempt { delivered, failure } = sink.deliver(&batch[i..], CURSOR).await;
        calls.push(Call {
            started,
            from: i,
            delivered,
        });
        i += delivered;
        match failure {
            None => {}
            Some(Failure::Retry { error, .. }) => {
                failures.push(error);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Some(f @ (Failure::Poison { .. } | Failure::Refused { .. })) => {
                panic!("unexpected poison: {f:?}")
            }
        }
    }
    (calls, failures)
}

fn ids(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .map(|s| {
            let at = s.payload.find("\"id\":\"").unwrap() + 6;
            s.payload[at..at + 9].to_string()
        })
        .collect()
}

fn basic(protocol: &str) {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(&dir.path().join("b"), false);
    let sub = Subscriber::start(&b, "sub-basic");
    let mut sink = sink_from(&sink_toml(
        &b,
        protocol,
        "rg-sink",
        "cop/{agency}/{source_id}/{topic}",
    ));
    let batch = events(1500);
    let rt = runtime();
    rt.block_on(async {
        // Two calls: the second reuses the connection.
        let a = sink.deliver(&batch[..1000], CURSOR).await;
        assert_eq!(a, Attempt::all(1000));
        let a = sink.deliver(&batch[1000..], CURSOR).await;
        assert_eq!(a, Attempt::all(500));
        sink.close().await;
    });
    sub.wait_count(batch.len(), Duration::from_secs(20));
    let seen = sub.seen();
    assert_eq!(seen.len(), batch.len(), "no duplicates on a healthy run");
    for (s, e) in seen.iter().zip(&batch) {
        assert_eq!(s.payload, e.json, "in order, payload as is");
        assert_eq!(
            s.topic,
            format!("cop/CALFIRE/{}/incidents/calfire", e.source_id)
        );
        assert!(!s.retained);
        if protocol == "v5" {
            assert_eq!(s.format, "1", "payload format indicator: UTF-8");
            assert_eq!(s.content_type, "application/cloudevents+json");
        } else {
            assert_eq!(s.content_type, "", "3.1.1 carries the payload only");
        }
    }
}

#[test]
fn mqtt5_sink_publishes_every_event_in_order_as_structured_cloudevents() {
    basic("v5");
}

#[test]
fn mqtt311_sink_publishes_every_event_in_order_payload_only() {
    basic("v3.1.1");
}

/// Kills (SIGKILL) the downstream broker while a large batch is in flight and restarts it on
/// the same port: the sink drops its client, reconnects afresh and re-publishes the rest; the
/// batch completes (no rumqttc #1056 livelock). Everything acknowledged by the restarted broker
/// reaches the subscriber. (What the killed broker acknowledged but had not yet passed on is
/// lost by the broker itself: Mosquitto writes to disk only on a snapshot or a clean exit.)
fn broker_restart(protocol: &str) {
    let dir = tempfile::tempdir().unwrap();
    let bdir = dir.path().join("b");
    let mut b = Broker::start(&bdir, true);
    let port = b.port;
    let sub = Subscriber::start(&b, "sub-restart");
    // The subscriber's session survives the kill: the broker has it on disk.
    b.snapshot();
    let mut sink = sink_from(&sink_toml(&b, protocol, "rg-sink", "cop/{source_id}"));
    let batch = events(20_000);
    let killer = {
        let seen = sub.seen.clone();
        std::thread::spawn(move || {
            // Early in the batch: the subscriber's count lags the broker's (its output comes
            // through a pipe in blocks), and on a loaded machine a later mark can come after
            // the whole batch was acknowledged.
            wait_for(Duration::from_secs(60), "the batch to start", || {
                seen.lock().unwrap().len() >= 200
            });
            b.kill();
            let killed = Instant::now();
            let at = seen.lock().unwrap().len();
            std::thread::sleep(Duration::from_millis(300));
            (Broker::start_on(&bdir, port, true), killed, at)
        })
    };
    let rt = runtime();
    let (calls, failures) = rt.block_on(async {
        let r = deliver_all(&mut sink, &batch, Duration::from_secs(120)).await;
        sink.close().await;
        r
    });
    let (_b, killed, seen_at_kill) = killer.join().unwrap();
    let before: usize = calls
        .iter()
        .filter(|c| c.started < killed)
        .map(|c| c.delivered)
        .sum();
    assert!(
        before < batch.len() && seen_at_kill < batch.len(),
        "the kill landed after the batch ({before} acknowledged before it)"
    );
    assert!(
        !failures.is_empty(),
        "the kill must have failed an attempt mid-batch"
    );
    // Re-published after the restart: everything from the first unacknowledged event on.
    let after: Vec<&Event> = calls
        .iter()
        .filter(|c| c.started > killed)
        .flat_map(|c| &batch[c.from..c.from + c.delivered])
        .collect();
    assert_eq!(after.len(), batch.len() - before);
    let want: HashSet<String> = after.iter().map(|e| e.id.clone()).collect();
    wait_for(
        Duration::from_secs(60),
        "every re-published event downstream",
        || {
            ids(&sub.seen())
                .into_iter()
                .collect::<HashSet<_>>()
                .is_superset(&want)
        },
    );
    // Each arrival of one event carries its one payload, and nothing else arrives.
    let sent: HashMap<&str, &str> = batch
        .iter()
        .map(|e| (e.id.as_str(), e.json.as_str()))
        .collect();
    for s in sub.seen() {
        let id = ids(std::slice::from_ref(&s)).remove(0);
        assert_eq!(sent.get(id.as_str()), Some(&s.payload.as_str()));
    }
}

#[test]
fn mqtt5_downstream_broker_killed_mid_batch_and_restarted_the_batch_completes() {
    broker_restart("v5");
}

#[test]
fn mqtt311_downstream_broker_killed_mid_batch_and_restarted_the_batch_completes() {
    broker_restart("v3.1.1");
}

/// A broker whose ACL lets anonymous clients write only `ok/#` (and the probe). Mosquitto 2.0
/// answers a v5 QoS 1 PUBLISH elsewhere with PUBACK 0x87; with `max_queued_messages 0` (the
/// harness default) 2.0.11 then also closes the connection ("Bad socket read/write").
fn acl_broker(dir: &Path, closes_after_refusal: bool) -> Broker {
    let acl = dir.join("acl");
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        &acl,
        "topic readwrite ok/#\ntopic readwrite probe/#\ntopic read #\n",
    )
    .unwrap();
    let mut extra = format!("acl_file {}\n", acl.display());
    if !closes_after_refusal {
        extra.push_str("max_queued_messages 1000\n");
    }
    Broker::start_with(dir, false, &extra)
}

fn acl_batch() -> Vec<Event> {
    let mut batch: Vec<Event> = (0..40).map(|i| event(i, "ok", "u1")).collect();
    batch[25] = event(25, "denied", "u1");
    batch
}

fn assert_refused_0x87(f: Option<Failure>) {
    match f {
        Some(Failure::Refused {
            class,
            reason,
            response,
        }) => {
            assert_eq!(class, "PUBACK 0x87");
            assert!(reason.contains("0x87"), "{reason}");
            assert!(reason.contains("not authorized"), "{reason}");
            assert!(response.contains("PUBACK"), "{response}");
        }
        other => panic!("want a refusal classed by its code, got {other:?}"),
    }
}

fn wait_allowed(sub: &Subscriber, batch: &[Event]) {
    let want: HashSet<String> = batch
        .iter()
        .filter(|e| e.agency == "ok")
        .map(|e| e.id.clone())
        .collect();
    wait_for(Duration::from_secs(20), "the allowed events", || {
        ids(&sub.seen())
            .into_iter()
            .collect::<HashSet<_>>()
            .is_superset(&want)
    });
    assert!(sub.seen().iter().all(|s| s.topic.starts_with("ok/")));
}

#[test]
fn mqtt5_puback_not_authorized_is_a_refusal_naming_the_code_after_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let b = acl_broker(&dir.path().join("b"), false);
    let sub = Subscriber::start(&b, "sub-acl");
    let mut sink = sink_from(&sink_toml(&b, "v5", "rg-sink", "{agency}/{source_id}"));
    let batch = acl_batch();
    let rt = runtime();
    rt.block_on(async {
        let a = sink.deliver(&batch, CURSOR).await;
        assert_eq!(a.delivered, 25, "{a:?}");
        assert_refused_0x87(a.failure);
        // The runner parks it and goes on with the rest.
        assert_eq!(sink.deliver(&batch[26..], CURSOR).await, Attempt::all(14));
        sink.close().await;
    });
    wait_allowed(&sub, &batch);
}

/// A broker that closes the connection after a refusal can take the PUBACKs of the events
/// before it along: the runner's retries still end with every allowed event delivered and
/// only the refused one parked (the sink remembers the refusal and widens its window slowly
/// after a loss).
#[test]
fn mqtt5_refusal_from_a_broker_that_then_disconnects_parks_only_the_refused_event() {
    let dir = tempfile::tempdir().unwrap();
    let b = acl_broker(&dir.path().join("b"), true);
    let sub = Subscriber::start(&b, "sub-acl");
    let mut sink = sink_from(&sink_toml(&b, "v5", "rg-sink", "{agency}/{source_id}"));
    let batch = acl_batch();
    let rt = runtime();
    let parked = rt.block_on(async {
        let (mut i, mut parked, mut attempts) = (0, Vec::new(), 0);
        while i < batch.len() {
            attempts += 1;
            assert!(attempts < 100, "no progress: at {i}, parked {parked:?}");
            let a = sink.deliver(&batch[i..], CURSOR).await;
            i += a.delivered;
            match a.failure {
                None => {}
                Some(Failure::Retry { .. }) => tokio::time::sleep(Duration::from_millis(20)).await,
                f @ Some(Failure::Refused { .. }) => {
                    assert_refused_0x87(f);
                    parked.push(batch[i].offset);
                    i += 1;
                }
                Some(f @ Failure::Poison { .. }) => {
                    panic!("the mqtt sink classes a PUBACK refusal by its code: {f:?}")
                }
            }
        }
        sink.close().await;
        parked
    });
    assert_eq!(parked, [25]);
    wait_allowed(&sub, &batch);
}

/// One packet from a fake broker's side: (packet type, body).
async fn read_packet(s: &mut tokio::net::TcpStream) -> Option<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let kind = s.read_u8().await.ok()?;
    let (mut len, mut mult) = (0usize, 1usize);
    loop {
        let b = s.read_u8().await.ok()?;
        len += usize::from(b & 127) * mult;
        mult *= 128;
        if b & 128 == 0 {
            break;
        }
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.ok()?;
    Some((kind >> 4, body))
}

/// Delivers `batch` once through a scripted broker that reads every PUBLISH, then writes
/// `answer(packet ids)` and closes the connection, with no await in between: it runs on the
/// sink's own single-threaded runtime, and then keeps that thread a moment, so the sink's
/// connection task first runs when the answer and the end of the connection are both in its
/// socket. That is what a loaded machine does to the sink when Mosquitto answers a refused
/// PUBLISH and closes at once: rumqttc reads the PUBACKs and the end of the connection in
/// one bunch and returns only the error, leaving the PUBACKs in its event queue.
fn answer_then_hang_up(
    protocol: &str,
    batch: &[Event],
    answer: impl Fn(&[u16]) -> Vec<u8> + Send + 'static,
) -> Attempt {
    let rt = runtime();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let v5 = protocol == "v5";
        let publishes = batch.len();
        let broker = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let (mut s, _) = listener.accept().await.unwrap();
            let (kind, _) = read_packet(&mut s).await.expect("CONNECT");
            assert_eq!(kind, 1);
            let connack: &[u8] = if v5 { &[0x20, 3, 0, 0, 0] } else { &[0x20, 2, 0, 0] };
            s.write_all(connack).await.unwrap();
            let mut pkids = Vec::new();
            while pkids.len() < publishes {
                let (kind, body) = read_packet(&mut s).await.expect("PUBLISH");
                assert_eq!(kind, 3);
                let at = 2 + usize::from(u16::from_be_bytes([body[0], body[1]]));
                pkids.push(u16::from_be_bytes([body[at], body[at + 1]]));
            }
            let bytes = answer(&pkids);
            assert_eq!(s.try_write(&bytes).unwrap(), bytes.len());
            drop(s);
            std::thread::sleep(Duration::from_millis(100));
        });
        let mut sink = sink_from(&format!(
            "[[sink]]\nname = \"cop\"\nkind = \"mqtt\"\nbroker = \"mqtt://127.0.0.1:{port}\"\n\
             protocol = {protocol:?}\nclient_id = \"rg-sink\"\ntopic = \"{{agency}}/{{source_id}}\"\n\
             timeout_ms = 2000\n"
        ));
        let a = sink.deliver(batch, CURSOR).await;
        broker.await.unwrap();
        a
    })
}

fn puback(pkid: u16) -> Vec<u8> {
    let [hi, lo] = pkid.to_be_bytes();
    vec![0x40, 2, hi, lo]
}

/// An MQTT 5 PUBACK with reason code 0x87 (not authorized).
fn puback_refused(pkid: u16) -> Vec<u8> {
    let [hi, lo] = pkid.to_be_bytes();
    vec![0x40, 3, hi, lo, 0x87]
}

#[test]
fn mqtt5_refusal_read_together_with_the_end_of_the_connection_is_a_refusal() {
    let batch = [
        event(0, "ok", "u1"),
        event(1, "denied", "u1"),
        event(2, "ok", "u1"),
    ];
    let a = answer_then_hang_up("v5", &batch, |p| {
        [puback(p[0]), puback_refused(p[1])].concat()
    });
    assert_eq!(a.delivered, 1, "{a:?}");
    assert_refused_0x87(a.failure);
}

#[test]
fn mqtt5_refusal_read_together_with_a_disconnect_is_a_refusal() {
    // rumqttc turns an incoming DISCONNECT into an error at once, whatever it read before.
    let batch = [
        event(0, "ok", "u1"),
        event(1, "denied", "u1"),
        event(2, "ok", "u1"),
    ];
    let a = answer_then_hang_up("v5", &batch, |p| {
        [puback(p[0]), puback_refused(p[1]), vec![0xE0, 2, 0x87, 0]].concat()
    });
    assert_eq!(a.delivered, 1, "{a:?}");
    assert_refused_0x87(a.failure);
}

#[test]
fn pubacks_read_together_with_the_end_of_the_connection_count_as_delivered() {
    // Counted as lost, these events would be published a second time.
    for protocol in ["v5", "v3.1.1"] {
        let batch = events(3);
        let a = answer_then_hang_up(protocol, &batch, |p| {
            p.iter().flat_map(|&k| puback(k)).collect()
        });
        assert_eq!(a, Attempt::all(3), "{protocol}");
    }
}

#[test]
fn a_filled_topic_that_is_not_a_topic_name_is_poison_without_publishing_it() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(&dir.path().join("b"), false);
    let sub = Subscriber::start(&b, "sub-topic");
    let mut sink = sink_from(&sink_toml(&b, "v5", "rg-sink", "cop/{agency}/{source_id}"));
    let batch = vec![
        event(0, "A", "u1"),
        event(1, "A", "u2"),
        event(2, "A", "u+3"),
        event(3, "A", "u4"),
    ];
    let rt = runtime();
    rt.block_on(async {
        let a = sink.deliver(&batch, CURSOR).await;
        assert_eq!(a.delivered, 2, "{a:?}");
        match a.failure {
            Some(Failure::Poison { reason, .. }) => {
                assert!(reason.contains("cop/A/u+3"), "{reason}");
                assert!(reason.contains("wildcard"), "{reason}");
            }
            other => panic!("want poison, got {other:?}"),
        }
        // Poison at the front: nothing is published.
        let a = sink.deliver(&batch[2..], CURSOR).await;
        assert_eq!(a.delivered, 0);
        assert!(matches!(a.failure, Some(Failure::Poison { .. })));
        assert_eq!(sink.deliver(&batch[3..], CURSOR).await, Attempt::all(1));
        sink.close().await;
    });
    sub.wait_count(3, Duration::from_secs(20));
    let got = ids(&sub.seen());
    assert_eq!(got, ["ev-000000", "ev-000001", "ev-000003"]);
}

#[test]
fn an_unreachable_broker_is_a_retry_within_the_timeout() {
    let port = super::broker::free_port();
    let toml = format!(
        "[[sink]]\nname = \"cop\"\nkind = \"mqtt\"\nbroker = \"mqtt://127.0.0.1:{port}\"\n\
         client_id = \"rg-sink\"\ntopic = \"cop/{{agency}}\"\ntimeout_ms = 500\n"
    );
    let mut sink = sink_from(&toml);
    let rt = runtime();
    let a = rt.block_on(sink.deliver(&events(3), CURSOR));
    assert_eq!(a.delivered, 0);
    assert!(matches!(a.failure, Some(Failure::Retry { .. })), "{a:?}");
}

/// `run` with an mqtt sink, end to end: upstream broker A feeds `run`, whose sink publishes to
/// broker B. A 5,000-event surge with replays; `run` killed with SIGKILL six times while it
/// delivers (restarted each time); B stopped and restarted once while `run` delivers (SIGTERM,
/// so that B itself loses nothing it acknowledged; SIGKILL of B is the test above). Every
/// effect arrives, every arrival of one effect carries the same id, and ids are unique per
/// effect, compared with `dump-effects`.
#[test]
fn run_with_an_mqtt_sink_killed_mid_delivery_delivers_every_effect_with_one_stable_id() {
    use replay_guard::json::{self, Json};
    use std::collections::BTreeMap;

    const N: u64 = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let a = Broker::start(&dir.path().join("a"), false);
    let bdir = dir.path().join("b");
    let mut b = Broker::start(&bdir, true);
    let b_port = b.port;
    let sub = Subscriber::start(&b, "sub-e2e");
    b.snapshot();
    let db = dir.path().join("rg.redb");
    let config = dir.path().join("rg.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\npath = {:?}\n[service]\nshutdown_timeout_seconds = 10\n\
             [mqtt]\nbrokers = [{:?}]\nclient_id = \"rg-e2e\"\ntopics = [\"incidents/#\"]\n\
             protocol = \"v5\"\nkeep_alive_seconds = 5\nbackoff_initial_ms = 50\nbackoff_max_ms = 200\n\
             [commit]\nmax_batch = 256\nlinger_ms = 5\n\
             [[sink]]\nname = \"cop\"\nkind = \"mqtt\"\nbroker = {:?}\nclient_id = \"rg-e2e-cop\"\n\
             topic = \"cop/{{agency}}/{{source_id}}\"\ntimeout_ms = 2000\n\
             backoff_initial_ms = 20\nbackoff_max_ms = 200\n",
            db.to_str().unwrap(),
            a.url(),
            b.url()
        ),
    )
    .unwrap();
    let log = dir.path().join("run.log");
    let start_run = || {
        super::common::logged_command(&["run", "--config", config.to_str().unwrap()], &log)
            .spawn()
            .unwrap()
    };
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut run = start_run();
    // The session at A exists before the surge, so A keeps the feed for `run` between kills.
    wait_for(Duration::from_secs(20), "run to connect", || {
        log_text().contains("connected")
    });
    let publisher = {
        let lines: Vec<String> = (0..N)
            .map(|i| super::common::msg("CALFIRE", &format!("E{}", i % 7), 1, i, "status"))
            .collect();
        let port = a.port;
        let seen = sub.seen.clone();
        std::thread::spawn(move || {
            let a = Broker::attach(port);
            for (n, chunk) in lines.chunks(250).enumerate() {
                // Paced by the downstream (at most ~1,000 events ahead), so that the kills
                // land while there is still a surge to deliver.
                wait_for(
                    Duration::from_secs(120),
                    "the downstream to catch up",
                    || seen.lock().unwrap().len() + 1000 >= n * 250,
                );
                a.publish_lines("incidents/ca", chunk, "pub-e2e");
                // Replays: every third chunk, an earlier chunk again.
                if n % 3 == 2 {
                    a.publish_lines(
                        "incidents/ca",
                        &lines[(n - 2) * 250..(n - 1) * 250],
                        "pub-e2e",
                    );
                }
            }
        })
    };
    let distinct = |sub: &Subscriber| {
        ids_e2e(&sub.seen())
            .into_iter()
            .collect::<HashSet<_>>()
            .len()
    };
    let mut rng = super::common::SplitMix64::new(11);
    let (mut kills, mut mid_delivery, mut b_restarted) = (0, 0, false);
    let failed = || log_text().matches("delivery failed").count();
    while kills < 6 {
        let from = sub.count();
        let step = 100 + rng.below(400) as usize;
        wait_for(Duration::from_secs(60), "deliveries between kills", || {
            sub.count() >= from + step || distinct(&sub) as u64 >= N
        });
        if kills == 3 && !b_restarted {
            // Downstream restart while `run` delivers.
            assert!((distinct(&sub) as u64) < N, "B restarted after the surge");
            let before = failed();
            b.stop();
            wait_for(Duration::from_secs(20), "the sink to notice", || {
                failed() > before
            });
            b = Broker::start_on(&bdir, b_port, true);
            b_restarted = true;
            continue;
        }
        if (distinct(&sub) as u64) < N {
            mid_delivery += 1;
        }
        run.kill().unwrap();
        run.wait().unwrap();
        kills += 1;
        run = start_run();
    }
    assert!(
        mid_delivery >= 5,
        "only {mid_delivery} of {kills} kills landed mid-delivery"
    );
    publisher.join().unwrap();
    wait_for(Duration::from_secs(120), "every effect downstream", || {
        super::common::effects(&db).len() as u64 == N && distinct(&sub) as u64 == N
    });
    signal_term(&mut run);
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", log_text());

    // dump-effects: offset, key, released -> the id each arrival must carry.
    let out = super::common::run(&["dump-effects", "--db", db.to_str().unwrap()]);
    assert!(out.status.success());
    let mut want: BTreeMap<u64, String> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let e = json::parse(line.as_bytes(), 64).unwrap();
        assert_eq!(member(&e, "released"), "false");
        want.insert(member(&e, "offset").parse().unwrap(), member(&e, "key"));
    }
    assert_eq!(want.len() as u64, N, "replays were applied once each");
    let mut arrivals_by_offset: BTreeMap<u64, HashSet<String>> = BTreeMap::new();
    let seen = sub.seen();
    for s in &seen {
        let e = json::parse(s.payload.as_bytes(), 64).unwrap();
        let offset: u64 = member(&e, "rgoffset").parse().unwrap();
        let id = member(&e, "id");
        assert_eq!(want.get(&offset), Some(&id), "the id of offset {offset}");
        assert_eq!(member(&e, "rgkey"), id);
        let subject = member(&e, "subject");
        assert_eq!(s.topic, format!("cop/{subject}"));
        assert_eq!(s.content_type, "application/cloudevents+json");
        arrivals_by_offset.entry(offset).or_default().insert(id);
    }
    // Every effect arrived; each with one id; no id names two effects.
    assert_eq!(arrivals_by_offset.len(), want.len());
    assert!(arrivals_by_offset.values().all(|ids| ids.len() == 1));
    let ids: HashSet<&String> = want.values().collect();
    assert_eq!(ids.len(), want.len());
    eprintln!(
        "{} arrivals for {} effects ({} re-deliveries after {kills} kills)",
        seen.len(),
        want.len(),
        seen.len() - want.len()
    );

    fn member(v: &Json, name: &str) -> String {
        let Json::Object(m) = v else {
            panic!("not an object")
        };
        match m.iter().find(|(k, _)| k == name) {
            Some((_, Json::String(s))) => s.clone(),
            Some((_, other)) => other.to_compact(),
            None => panic!("no {name}"),
        }
    }
}

/// The CloudEvents ids of what arrived (the envelope's first `"id"` member).
fn ids_e2e(seen: &[Seen]) -> Vec<String> {
    seen.iter()
        .filter_map(|s| {
            let at = s.payload.find("\"id\":\"")? + 6;
            let end = s.payload[at..].find('"')? + at;
            Some(s.payload[at..end].to_string())
        })
        .collect()
}

fn signal_term(child: &mut Child) {
    super::broker::signal(child.id() as i32, "TERM");
}

/// An audit entry as an audit sink reads it (outcome code `outcome`: 2 duplicate, 5
/// malformed, 8 relay; with or without a source).
fn audit_entry(
    index: u64,
    outcome: u8,
    source: Option<(&str, &str)>,
    topic: &str,
) -> replay_guard::store::AuditEntry {
    replay_guard::store::AuditEntry {
        index,
        record: replay_guard::store::tables::AuditRecord {
            recorded_at_ms: 1_796_009_401_995 + index,
            outcome,
            key: source.map(|_| [index as u8; 32]),
            agency: source.map(|s| s.0.to_string()),
            source_id: source.map(|s| s.1.to_string()),
            epoch: source.map(|_| 1),
            sequence: source.map(|_| index),
            topic: topic.into(),
            reason: format!("entry {index}"),
            digest: None,
            effect_offset: None,
            quarantine_id: None,
            prev_hash: [index as u8; 32],
            hash: [index as u8 + 1; 32],
        },
    }
}

#[test]
fn mqtt5_audit_events_go_out_under_the_topic_template_with_empty_fields_for_no_source() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::start(&dir.path().join("b"), false);
    let sub = Subscriber::start(&b, "sub-audit");
    let mut toml = sink_toml(&b, "v5", "rg-siem", "siem/{agency}/{source_id}/{topic}");
    toml.push_str("stream = \"audit\"\n");
    let mut sink = sink_from(&toml);
    let batch: Vec<Event> = [
        audit_entry(4, 2, Some(("CALFIRE", "E7")), "incidents/calfire"),
        audit_entry(5, 5, None, "incidents/calfire"),
        audit_entry(6, 8, None, "cop"),
    ]
    .iter()
    .map(|e| Event::of_audit("urn:replay-guard:eoc-1", e))
    .collect();
    runtime().block_on(async {
        assert_eq!(sink.deliver(&batch, CURSOR).await, Attempt::all(3));
        sink.close().await;
    });
    sub.wait_count(3, Duration::from_secs(20));
    let seen = sub.seen();
    let topics: Vec<&str> = seen.iter().map(|s| s.topic.as_str()).collect();
    assert_eq!(
        topics,
        [
            "siem/CALFIRE/E7/incidents/calfire",
            "siem///incidents/calfire",
            "siem///cop"
        ]
    );
    for (s, e) in seen.iter().zip(&batch) {
        assert_eq!(s.payload, e.json);
        assert!(
            s.payload
                .contains("\"type\":\"org.replay-guard.decision.v1\"")
        );
        assert_eq!(s.content_type, "application/cloudevents+json");
    }
    assert!(
        seen[0]
            .payload
            .starts_with("{\"specversion\":\"1.0\",\"id\":\"4-0505050505050505\"")
    );
}
