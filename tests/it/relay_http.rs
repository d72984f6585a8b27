//! The http sink against a receiver written here (std threads speaking just enough HTTP/1.1,
//! plain or over rustls): it answers 503 at random, 429 with `Retry-After: 1`, drops
//! connections mid-request, closes some after answering, and answers 422 for one chosen event.
//! First through the library (`Sink::deliver`), then end to end: `ingest`, the standalone
//! `relay` command, `relay parked` and `relay retry`: every event but the refused one arrives,
//! every retry of an event carries the same `Idempotency-Key`, and the refused event is parked
//! until the receiver accepts it. Credentials: the receiver answers 401 without the configured
//! `Authorization` (from `authorization_file` or systemd's credential), requires a client
//! certificate (mutual TLS), or is verified against the system trust store (`SSL_CERT_FILE`);
//! and no output of any command, log line or stored byte shows the token or the URL's query.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use replay_guard::config::Config;
use replay_guard::json::{self, Json};
use replay_guard::relay::envelope::{self, EffectView};
use replay_guard::relay::{CursorAfter, Event, Failure, Sink};

use super::common::{self, SplitMix64};

/// One request as the receiver read it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    target: String,
    headers: BTreeMap<String, String>,
    body: String,
    /// The status answered; 0 = the connection was dropped instead.
    answer: u16,
}

impl Seen {
    fn key(&self) -> Option<&str> {
        self.headers.get("idempotency-key").map(String::as_str)
    }
    /// The CloudEvents `id` in the body.
    fn id(&self) -> String {
        body_id(&self.body)
    }
}

fn body_id(body: &str) -> String {
    body_field(body, "id")
}

/// A string member of the envelope (they hold no escapes here).
fn body_field(body: &str, name: &str) -> String {
    let pat = format!("\"{name}\":\"");
    let at = body
        .find(&pat)
        .unwrap_or_else(|| panic!("no {name} in {body}"))
        + pat.len();
    let len = body[at..].find('"').unwrap();
    body[at..at + len].to_string()
}

#[derive(Default)]
struct Log {
    seen: Vec<Seen>,
    /// Ids answered 2xx, in arrival order.
    accepted: Vec<String>,
    connections: usize,
    /// Connections the receiver dropped mid-request, or closed after answering.
    dropped: usize,
    closed: usize,
    /// Answered 422 while set.
    refuse: Option<String>,
    /// Every request is answered with this status while set (a COP whose schema changed).
    refuse_all: Option<u16>,
    /// Requests for this id get no answer while set (the connection is held open).
    hang: Option<String>,
    /// While set, a request without exactly this `Authorization` value is answered 401.
    authorization: Option<String>,
    /// Every request is answered 503 while set.
    unavailable: bool,
    /// A refusal's body quotes the request line and headers back (a debugging receiver).
    echo: bool,
    chaos: bool,
    rng: Option<SplitMix64>,
    too_many: u32,
    /// Requests read and not yet answered, in all and per event subject (the source).
    outstanding: usize,
    by_source: BTreeMap<String, usize>,
    most_outstanding: usize,
    /// Whether two requests of one source were ever outstanding at once.
    source_overlap: bool,
    /// The first `hold` requests are answered only once `barrier` are outstanding (or after
    /// `HOLD_LIMIT`): requests that are really concurrent meet there.
    hold: usize,
    barrier: usize,
    /// `barrier` requests were outstanding at once: the held ones go on (the request that
    /// met the barrier is answered, and no longer outstanding, before they wake).
    met: bool,
}

/// Longest a held request waits for the others.
const HOLD_LIMIT: Duration = Duration::from_secs(10);

impl Log {
    /// What to do with request number `n` for `id`: a status, or 0 = drop the connection.
    fn decide(&mut self, n: usize, id: &str) -> (u16, bool) {
        if self.unavailable {
            return (503, false);
        }
        if self.refuse.as_deref() == Some(id) {
            return (422, false);
        }
        if let Some(code) = self.refuse_all {
            return (code, false);
        }
        if !self.chaos {
            return (200, false);
        }
        // The first three requests go through each failure once for sure; then at random.
        match n {
            0 => return (503, false),
            1 => {
                self.too_many += 1;
                return (429, false);
            }
            2 => return (0, false),
            _ => {}
        }
        let r = self.rng.as_mut().map_or(1.0, |r| r.unit());
        if r < 0.15 {
            (503, false)
        } else if r < 0.22 {
            (0, false)
        } else if r < 0.25 && self.too_many < 3 {
            self.too_many += 1;
            (429, false)
        } else if r < 0.30 {
            (204, true)
        } else if r < 0.35 {
            (201, false)
        } else {
            (200, false)
        }
    }
}

/// The receiver: an accept thread and one thread per connection.
struct Receiver {
    addr: SocketAddr,
    log: Arc<Shared>,
    stop: Arc<AtomicBool>,
}

/// The log and the condition that held requests wait on.
type Shared = (Mutex<Log>, Condvar);

/// A TLS server config for the receiver (certificate chain and key, PEM).
type Tls = Arc<tokio_rustls::rustls::ServerConfig>;

impl Receiver {
    fn start(seed: u64, chaos: bool, tls: Option<Tls>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new((
            Mutex::new(Log {
                chaos,
                rng: Some(SplitMix64::new(seed)),
                ..Log::default()
            }),
            Condvar::new(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, s) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                l.0.lock().unwrap().connections += 1;
                let (l, tls) = (l.clone(), tls.clone());
                std::thread::spawn(move || {
                    conn.set_read_timeout(Some(Duration::from_secs(30))).ok();
                    match tls {
                        None => serve(conn, &l),
                        Some(cfg) => {
                            let Ok(c) = tokio_rustls::rustls::ServerConnection::new(cfg) else {
                                return;
                            };
                            serve(tokio_rustls::rustls::StreamOwned::new(c, conn), &l);
                        }
                    }
                });
            }
        });
        Receiver { addr, log, stop }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Log) -> R) -> R {
        f(&mut self.log.0.lock().unwrap())
    }

    fn seen(&self) -> Vec<Seen> {
        self.with(|l| l.seen.clone())
    }

    fn accepted(&self) -> Vec<String> {
        self.with(|l| l.accepted.clone())
    }

    /// Waits until `f` holds, at most `limit`.
    fn await_until(&self, limit: Duration, what: &str, f: impl Fn(&Log) -> bool) {
        common::wait_until(format!("receiver: {what}"), limit, || self.with(|l| f(l)));
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so that it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Reads requests off one connection and answers them as `Log::decide` says.
fn serve<S: Read + Write>(stream: S, shared: &Shared) {
    let (log, cv) = shared;
    let mut r = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (
            parts.next().unwrap_or_default().to_string(),
            parts.next().unwrap_or_default().to_string(),
        );
        let mut headers = BTreeMap::new();
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').expect("a header line");
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
        let len: usize = headers
            .get("content-length")
            .and_then(|v| v.parse().ok())
            .expect("the sink sends Content-Length");
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let body = String::from_utf8(body).expect("a UTF-8 body");
        let id = body_id(&body);
        // An audit sink's event of an entry without a source has no subject.
        let subject = if body.contains("\"subject\":\"") {
            body_field(&body, "subject")
        } else {
            String::new()
        };
        let (status, close, hang, echoed) = {
            let mut l = log.lock().unwrap();
            l.outstanding += 1;
            l.most_outstanding = l.most_outstanding.max(l.outstanding);
            let same = l.by_source.entry(subject.clone()).or_default();
            *same += 1;
            if *same > 1 {
                l.source_overlap = true;
            }
            if l.outstanding >= l.barrier {
                l.met = true;
            }
            cv.notify_all();
            if l.hold > 0 {
                l.hold -= 1;
                l = cv.wait_timeout_while(l, HOLD_LIMIT, |l| !l.met).unwrap().0;
            }
            let n = l.seen.len();
            let hang = l.hang.as_deref() == Some(id.as_str());
            let unauthorized = l
                .authorization
                .as_ref()
                .is_some_and(|want| headers.get("authorization") != Some(want));
            let (status, close) = if hang {
                (0, false)
            } else if unauthorized {
                (401, false)
            } else {
                l.decide(n, &id)
            };
            let echoed = (l.echo && status >= 400).then(|| {
                let sent: Vec<String> = headers.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                format!("you sent {method} {target} with {}", sent.join("; "))
            });
            l.seen.push(Seen {
                method,
                target,
                headers,
                body,
                answer: status,
            });
            if (200..300).contains(&status) {
                l.accepted.push(id.clone());
            }
            if status == 0 && !hang {
                l.dropped += 1;
            }
            if close {
                l.closed += 1;
            }
            // Answered (or dropped) from here on: the client may send this source's next.
            l.outstanding -= 1;
            *l.by_source.get_mut(&subject).unwrap() -= 1;
            (status, close, hang, echoed)
        };
        if hang {
            // Holds the connection without answering until the client gives up on it.
            let mut rest = Vec::new();
            let _ = r.read_to_end(&mut rest);
            return;
        }
        if status == 0 {
            return;
        }
        let (reason, extra, body) = match status {
            200 => ("OK", "", "{\"ok\":true}"),
            201 => ("Created", "", ""),
            204 => ("No Content", "", ""),
            401 => (
                "Unauthorized",
                "WWW-Authenticate: Bearer\r\n",
                "{\"error\":\"unauthorized\"}",
            ),
            400 => (
                "Bad Request",
                "",
                "{\"error\":\"schema v2: unit_id required\"}",
            ),
            422 => (
                "Unprocessable Entity",
                "",
                "{\"error\":\"data.body: unknown incident kind\"}",
            ),
            429 => ("Too Many Requests", "Retry-After: 1\r\n", "slow down"),
            503 => ("Service Unavailable", "", "maintenance"),
            _ => unreachable!(),
        };
        let body = echoed.as_deref().unwrap_or(body);
        // A 204 has no body and no Content-Length (RFC 9110 8.6).
        let length = if status == 204 {
            String::new()
        } else {
            format!("Content-Length: {}\r\n", body.len())
        };
        let head = format!(
            "HTTP/1.1 {status} {reason}\r\n{length}{extra}{}\r\n",
            if close { "Connection: close\r\n" } else { "" }
        );
        let s = r.get_mut();
        if s.write_all(head.as_bytes()).is_err()
            || s.write_all(body.as_bytes()).is_err()
            || s.flush().is_err()
        {
            return;
        }
        if close {
            return;
        }
    }
}

/// `n` events of three sources, made as the relay makes them.
fn events(n: u64) -> Vec<Event> {
    (0..n)
        .map(|i| {
            let key = replay_guard::key::sha256(&[&i.to_le_bytes()]);
            let (agency, source_id) = ("fire", ["e1", "e2", "e3"][(i % 3) as usize]);
            let payload = common::msg(agency, source_id, 1, i, "x");
            let view = EffectView {
                offset: i,
                key: &key,
                agency,
                source_id,
                epoch: 1,
                sequence: i,
                received_at_ms: 1_780_000_000_000 + i,
                late: false,
                released: false,
                payload: payload.as_bytes(),
            };
            Event {
                offset: i,
                id: envelope::event_id(&key, false, payload.as_bytes()),
                key,
                agency: agency.into(),
                source_id: source_id.into(),
                topic: format!("incidents/{agency}"),
                json: envelope::envelope("urn:replay-guard:test", &view),
                outcome: "applied".into(),
                fields: Vec::new(),
            }
        })
        .collect()
}

fn http_sink(toml_sink: &str) -> Sink {
    let cfg = Config::parse(&format!(
        "[[sink]]\nname = \"cop\"\nkind = \"http\"\n{toml_sink}"
    ))
    .unwrap();
    Sink::new(cfg.relay.sink("cop").unwrap()).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// What a tiny runner saw driving a sink over `events` in batches of `batch`: retries go
/// again at once (this test is about the sink, not backoff); a poisoned event is skipped.
#[derive(Default, Debug)]
struct Driven {
    retries: Vec<(String, Option<Duration>)>,
    poisoned: Vec<(u64, String, String)>,
    /// The class of each refusal said of the endpoint (`Failure::Refused`), in order.
    classes: Vec<String>,
}

async fn drive(sink: &mut Sink, events: &[Event], batch: usize) -> Driven {
    let mut out = Driven::default();
    let mut i = 0;
    while i < events.len() {
        let b = &events[i..(i + batch).min(events.len())];
        let cursor = CursorAfter {
            store: [7; 16],
            generation: 1,
            next_after: b[b.len() - 1].offset + 1,
        };
        let a = sink.deliver(b, cursor).await;
        assert!(a.delivered <= b.len());
        i += a.delivered;
        match a.failure {
            None => assert_eq!(a.delivered, b.len(), "no failure means the whole batch"),
            Some(Failure::Retry { error, after }) => out.retries.push((error, after)),
            Some(Failure::Poison { reason, response }) => {
                out.poisoned.push((events[i].offset, reason, response));
                i += 1;
            }
            Some(Failure::Refused {
                class,
                reason,
                response,
            }) => {
                out.poisoned.push((events[i].offset, reason, response));
                out.classes.push(class);
                i += 1;
            }
        }
        assert!(out.retries.len() < 1000, "the sink never got through");
    }
    out
}

/// Every request carried the quoted id of the event in its body, and the same event always
/// the same key.
fn assert_keys_are_the_quoted_ids(seen: &[Seen]) {
    let mut by_id: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in seen {
        let key = s.key().expect("every request has an Idempotency-Key");
        assert_eq!(
            key,
            format!("\"{}\"", s.id()),
            "the key is the sf-string of the id"
        );
        by_id.entry(s.id()).or_default().insert(key.to_string());
    }
    for (id, keys) in by_id {
        assert_eq!(keys.len(), 1, "{id} was sent with different keys: {keys:?}");
    }
}

#[test]
fn sink_delivers_every_event_but_the_refused_one_through_503s_429s_and_dropped_connections() {
    let rx = Receiver::start(0x5eed_0001, true, None);
    let evs = events(90);
    let refused = evs[41].id.clone();
    rx.with(|l| l.refuse = Some(refused.clone()));
    let mut sink = http_sink(&format!(
        "url = \"http://127.0.0.1:{}/cop/events?src=rg\"\ntimeout_ms = 5000\n",
        rx.port()
    ));
    let driven = runtime().block_on(async {
        let d = drive(&mut sink, &evs, 8).await;
        sink.close().await;
        d
    });

    // All but the refused event arrived, each accepted exactly once, in log order.
    let want: Vec<String> = evs
        .iter()
        .map(|e| e.id.clone())
        .filter(|id| *id != refused)
        .collect();
    assert_eq!(rx.accepted(), want);

    // The refusal is a poison with the status and what the receiver said.
    assert_eq!(driven.poisoned.len(), 1, "{:?}", driven.poisoned);
    let (offset, reason, response) = &driven.poisoned[0];
    assert_eq!(*offset, 41);
    assert_eq!(reason, "HTTP 422 Unprocessable Entity");
    assert_eq!(
        response,
        "HTTP/1.1 422 Unprocessable Entity\n{\"error\":\"data.body: unknown incident kind\"}"
    );

    // Retries: 503s, the 429s (with their Retry-After) and the dropped connections.
    let seen = rx.seen();
    let count = |code: u16| seen.iter().filter(|s| s.answer == code).count();
    let (s503, s429, dropped) = (count(503), count(429), count(0));
    assert!(s503 >= 1 && s429 >= 1 && dropped >= 1);
    assert_eq!(
        driven.retries.len(),
        s503 + s429 + dropped,
        "{:?}",
        driven.retries
    );
    let with_wait = driven
        .retries
        .iter()
        .filter(|(e, after)| {
            e.contains("429 Too Many Requests") && *after == Some(Duration::from_secs(1))
        })
        .count();
    assert_eq!(
        with_wait, s429,
        "every 429 asked for 1 s: {:?}",
        driven.retries
    );
    assert!(
        driven.retries.iter().any(|(e, after)| e
            .contains("HTTP 503 Service Unavailable: maintenance")
            && after.is_none()),
        "{:?}",
        driven.retries
    );

    // Every request: POST to the path and query, the event as a CloudEvents structured body.
    for s in &seen {
        assert_eq!(s.method, "POST");
        assert_eq!(s.target, "/cop/events?src=rg");
        assert_eq!(
            s.headers.get("content-type").map(String::as_str),
            Some("application/cloudevents+json; charset=utf-8")
        );
        assert_eq!(
            s.headers.get("host").map(String::as_str),
            Some(format!("127.0.0.1:{}", rx.port()).as_str())
        );
        let ev = evs.iter().find(|e| e.id == s.id()).unwrap();
        assert_eq!(s.body, ev.json);
    }
    assert_keys_are_the_quoted_ids(&seen);
    // Redeliveries happened and kept their key (checked above), so the check is not vacuous.
    let ids: BTreeSet<String> = seen.iter().map(Seen::id).collect();
    assert!(seen.len() > ids.len() + 3);

    // Keep-alive: a new connection only after the receiver dropped or closed one.
    let (conns, dropped_n, closed) = rx.with(|l| (l.connections, l.dropped, l.closed));
    assert!(closed >= 1);
    assert_eq!(
        conns,
        1 + dropped_n + closed,
        "one connection reused across events and batches"
    );
}

#[test]
fn max_in_flight_sends_sources_at_once_but_each_source_in_log_order() {
    let rx = Receiver::start(0x5eed_0003, true, None);
    let evs = events(90);
    let refused = evs[50].id.clone();
    rx.with(|l| {
        l.refuse = Some(refused.clone());
        l.hold = 3;
        l.barrier = 3;
    });
    let mut sink = http_sink(&format!(
        "url = \"http://127.0.0.1:{}/\"\ntimeout_ms = 20000\nmax_in_flight = 3\n",
        rx.port()
    ));
    let driven = runtime().block_on(async {
        let d = drive(&mut sink, &evs, 16).await;
        sink.close().await;
        d
    });

    // Three sources, three requests at once (the first three met at the barrier), never two
    // of one source.
    let (most, overlap) = rx.with(|l| (l.most_outstanding, l.source_overlap));
    assert_eq!(most, 3);
    assert!(
        !overlap,
        "two requests of one source were in flight at once"
    );

    // Everything but the refused event arrived; per source, in log order of first arrival
    // (a retried batch may deliver other sources' events again, with the same key).
    let accepted = rx.accepted();
    let got: BTreeSet<&String> = accepted.iter().collect();
    let want: BTreeSet<&String> = evs
        .iter()
        .map(|e| &e.id)
        .filter(|i| **i != refused)
        .collect();
    assert_eq!(got, want);
    let offset = |id: &str| evs.iter().find(|e| e.id == id).unwrap().offset;
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    let mut first_seen = BTreeSet::new();
    for id in &accepted {
        if !first_seen.insert(id.clone()) {
            continue;
        }
        let o = offset(id);
        if let Some(prev) = last.insert(o % 3, o) {
            assert!(prev < o, "source {} got {o} after {prev}", o % 3);
        }
    }
    assert_eq!(driven.poisoned.len(), 1);
    assert_eq!(driven.poisoned[0].0, 50);
    assert_eq!(driven.poisoned[0].1, "HTTP 422 Unprocessable Entity");
    assert!(!driven.retries.is_empty());
    assert_keys_are_the_quoted_ids(&rx.seen());
    let (conns, dropped, closed) = rx.with(|l| (l.connections, l.dropped, l.closed));
    assert!(conns <= 3 + dropped + closed, "{conns} connections");
}

#[test]
fn a_receiver_that_does_not_answer_is_retried_after_timeout_ms_on_a_new_connection() {
    let rx = Receiver::start(1, false, None);
    let evs = events(3);
    rx.with(|l| l.hang = Some(evs[1].id.clone()));
    let mut sink = http_sink(&format!(
        "url = \"http://127.0.0.1:{}/\"\ntimeout_ms = 300\n",
        rx.port()
    ));
    let rt = runtime();
    let a = rt.block_on(sink.deliver(
        &evs,
        CursorAfter {
            store: [7; 16],
            generation: 1,
            next_after: 3,
        },
    ));
    assert_eq!(a.delivered, 1);
    match a.failure {
        Some(Failure::Retry { error, after: None }) => {
            assert!(
                error.contains("no complete response within 300 ms"),
                "{error}"
            )
        }
        other => panic!("{other:?}"),
    }
    rx.with(|l| l.hang = None);
    let a = rt.block_on(sink.deliver(
        &evs[1..],
        CursorAfter {
            store: [7; 16],
            generation: 1,
            next_after: 3,
        },
    ));
    assert_eq!((a.delivered, a.failure), (2, None));
    rt.block_on(sink.close());
    assert_eq!(
        rx.accepted(),
        evs.iter().map(|e| e.id.clone()).collect::<Vec<_>>()
    );
    assert_eq!(rx.with(|l| l.connections), 2);
}

#[test]
fn a_refused_connection_is_a_retry_naming_the_url_without_its_query() {
    // A port nothing listens on: bound, then closed.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut sink = http_sink(&format!(
        "url = \"http://127.0.0.1:{port}/in?api_key=s3cret-in-query\"\n"
    ));
    let a = runtime().block_on(sink.deliver(
        &events(2),
        CursorAfter {
            store: [7; 16],
            generation: 1,
            next_after: 2,
        },
    ));
    assert_eq!(a.delivered, 0);
    match a.failure {
        Some(Failure::Retry { error, .. }) => {
            assert!(
                error.starts_with(&format!(
                    "connecting to http://127.0.0.1:{port}/in?<redacted>: "
                )),
                "{error}"
            );
            assert!(!error.contains("s3cret"), "{error}");
        }
        other => panic!("{other:?}"),
    }
}

fn tls_server(pki: &Path) -> Tls {
    tls_server_with(pki, false)
}

/// The receiver's TLS: `pki`'s server certificate; with `client_auth`, it requires a client
/// certificate issued by `pki`'s CA.
fn tls_server_with(pki: &Path, client_auth: bool) -> Tls {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(pki.join("server.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(pki.join("server.key")).unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if client_auth {
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(pki.join("ca.pem")).unwrap() {
            roots.add(ca.unwrap()).unwrap();
        }
        let verifier = tokio_rustls::rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider,
        )
        .build()
        .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    Arc::new(builder.with_single_cert(certs, key).unwrap())
}

#[test]
fn https_verifies_the_receiver_against_ca_file_and_refuses_another_ca() {
    let dir = tempfile::tempdir().unwrap();
    let (good, other) = (dir.path().join("good"), dir.path().join("other"));
    for (d, name) in [(&good, "rg-http-ca"), (&other, "rg-other-ca")] {
        std::fs::create_dir(d).unwrap();
        super::tls::make_pki(d, name);
    }
    let rx = Receiver::start(2, false, Some(tls_server(&good)));
    let evs = events(5);
    let rt = runtime();

    let mut wrong = http_sink(&format!(
        "url = \"https://127.0.0.1:{}/e\"\nca_file = {:?}\n",
        rx.port(),
        other.join("ca.pem").to_str().unwrap()
    ));
    let a = rt.block_on(wrong.deliver(
        &evs,
        CursorAfter {
            store: [7; 16],
            generation: 1,
            next_after: 5,
        },
    ));
    assert_eq!(a.delivered, 0);
    match a.failure {
        Some(Failure::Retry { error, .. }) => {
            assert!(
                error.starts_with("TLS handshake with https://127.0.0.1:"),
                "{error}"
            );
            assert!(error.contains("certificate"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        rx.seen().is_empty(),
        "nothing is sent to an unverified receiver"
    );

    let mut sink = http_sink(&format!(
        "url = \"https://127.0.0.1:{}/e\"\nca_file = {:?}\n",
        rx.port(),
        good.join("ca.pem").to_str().unwrap()
    ));
    let a = rt.block_on(sink.deliver(
        &evs,
        CursorAfter {
            store: [7; 16],
            generation: 1,
            next_after: 5,
        },
    ));
    assert_eq!((a.delivered, a.failure), (5, None));
    rt.block_on(sink.close());
    assert_eq!(
        rx.accepted(),
        evs.iter().map(|e| e.id.clone()).collect::<Vec<_>>()
    );
    // The refused handshake, then one connection for all five events.
    assert_eq!(rx.with(|l| l.connections), 2);
    assert_keys_are_the_quoted_ids(&rx.seen());
}

/// A database fed by the real `ingest` with `n` effects of three sources, and a config with
/// one http sink `cop` to `port`. Returns (config path, database path, event ids by offset).
fn ingested(
    dir: &Path,
    n: u64,
    port: u16,
) -> (std::path::PathBuf, std::path::PathBuf, Vec<String>) {
    let sink = format!("url = \"http://127.0.0.1:{port}/cop\"\n");
    let (cfg, db, ids, _) = ingested_with(dir, n, &sink);
    (cfg, db, ids)
}

/// `ingested` with the sink's `url` and any other keys given as TOML lines; also returns
/// what `ingest` printed (stdout, then stderr).
fn ingested_with(
    dir: &Path,
    n: u64,
    sink: &str,
) -> (std::path::PathBuf, std::path::PathBuf, Vec<String>, String) {
    ingested_from(dir, n, sink, 3, 16, 5000)
}

/// `ingested_with` from `sources` sources taking turns, the sink reading `batch_max` at a time
/// with `timeout_ms`.
fn ingested_from(
    dir: &Path,
    n: u64,
    sink: &str,
    sources: u64,
    batch_max: usize,
    timeout_ms: u64,
) -> (std::path::PathBuf, std::path::PathBuf, Vec<String>, String) {
    let db = dir.join("rg.redb");
    let cfg = dir.join("rg.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\npath = {:?}\n\n[[sink]]\nname = \"cop\"\nkind = \"http\"\n{sink}\
             timeout_ms = {timeout_ms}\nbatch_max = {batch_max}\nbackoff_initial_ms = 10\nbackoff_max_ms = 200\n",
            db.to_str().unwrap()
        ),
    )
    .unwrap();
    let feed = dir.join("feed.jsonl");
    let lines: String = (0..n)
        .map(|i| common::msg("fire", &format!("e{}", i % sources + 1), 1, i, "x") + "\n")
        .collect();
    std::fs::write(&feed, lines).unwrap();
    let out = common::run(&[
        "ingest",
        "--db",
        db.to_str().unwrap(),
        "--config",
        cfg.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<String> = common::effects(&db)
        .iter()
        .enumerate()
        .map(|(i, e)| {
            assert_eq!(e.offset, i as u64);
            envelope::event_id(&e.record.key, e.record.released, &e.record.payload)
        })
        .collect();
    assert_eq!(ids.len() as u64, n);
    (cfg, db, ids, output(&out))
}

/// stdout, then stderr.
fn output(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `content` written to `path` with `mode`.
fn secret_file(path: &Path, content: &str, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, content).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The standalone `relay` on `cfg`, its stderr in `log`, with `env` set and `unset` removed.
fn spawn_relay(
    cfg: &Path,
    log: &Path,
    env: &[(&str, &str)],
    unset: &[&str],
) -> std::process::Child {
    let mut c = Command::new(common::bin());
    c.args(["relay", "--config", cfg.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    for (k, v) in env {
        c.env(k, v);
    }
    for k in unset {
        c.env_remove(k);
    }
    c.spawn().unwrap()
}

/// SIGTERM to `relay`; it must exit 0 within 30 s. Returns its log.
fn stop_relay(mut relay: std::process::Child, log: &Path) -> String {
    Command::new("kill")
        .args(["-TERM", &relay.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = relay.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = relay.kill();
            panic!(
                "relay did not stop on SIGTERM:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "SIGTERM: {status}\n{text}");
    text
}

/// `relay parked --sink cop` as JSON objects.
fn parked(cfg: &Path) -> Vec<Vec<(String, Json)>> {
    let out = common::run(&[
        "relay",
        "parked",
        "--config",
        cfg.to_str().unwrap(),
        "--sink",
        "cop",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| match json::parse(l.as_bytes(), 64).unwrap() {
            Json::Object(m) => m,
            other => panic!("not an object: {other:?}"),
        })
        .collect()
}

fn field<'a>(row: &'a [(String, Json)], name: &str) -> &'a Json {
    &row.iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in {row:?}"))
        .1
}

fn text(v: &str) -> Json {
    Json::String(v.into())
}

/// Polls `f` every 20 ms until it holds, at most `limit`.
fn poll(limit: Duration, what: &str, f: impl FnMut() -> bool) {
    common::wait_until(what, limit, f);
}

#[test]
fn an_audit_sink_posts_each_selected_entry_once_in_order_through_a_chaotic_receiver() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(0x5eed_0a0d, true, None);
    let sink = format!(
        "url = \"http://127.0.0.1:{}/siem\"\nstream = \"audit\"\n\
         outcomes = [\"duplicate\", \"malformed\"]\n",
        rx.port()
    );
    let (cfg, _db, _, _) = ingested_with(dir.path(), 60, &sink);
    // Replays of the first 20 (duplicates) and a line that is not JSON (malformed).
    let feed = dir.path().join("replays.jsonl");
    let mut lines: String = (0..20)
        .map(|i| common::msg("fire", ["e1", "e2", "e3"][(i % 3) as usize], 1, i, "x") + "\n")
        .collect();
    lines.push_str("not json\n");
    std::fs::write(&feed, lines).unwrap();
    let out = common::run(&[
        "ingest",
        "--config",
        cfg.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", output(&out));
    // What the sink must deliver: the audit log's duplicates and malformed entries.
    let audit = output(&common::run(&[
        "dump-audit",
        "--config",
        cfg.to_str().unwrap(),
    ]));
    let member = |e: &Json, k: &str| match e {
        Json::Object(m) => match &m.iter().find(|(n, _)| n == k).unwrap().1 {
            Json::String(s) => s.clone(),
            other => other.to_compact(),
        },
        other => panic!("{other:?}"),
    };
    let want: Vec<String> = audit
        .lines()
        .map(|l| json::parse(l.as_bytes(), 64).unwrap())
        .filter(|e| ["duplicate", "malformed"].contains(&member(e, "outcome").as_str()))
        .map(|e| format!("{}-{}", member(&e, "index"), &member(&e, "hash")[..16]))
        .collect();
    assert_eq!(want.len(), 21);
    let log = dir.path().join("relay.log");
    let relay = spawn_relay(&cfg, &log, &[], &[]);
    rx.await_until(Duration::from_secs(60), "the 21 selected entries", |l| {
        l.accepted.len() >= want.len()
    });
    stop_relay(relay, &log);
    assert_eq!(rx.accepted(), want, "each once, in log order");
    let seen = rx.seen();
    assert_keys_are_the_quoted_ids(&seen);
    assert!(
        seen.iter()
            .all(|s| s.body.contains("\"type\":\"org.replay-guard.decision.v1\"")),
        "every request is a decision event"
    );
    let verified = common::run(&["verify", "--config", cfg.to_str().unwrap()]);
    assert_eq!(verified.status.code(), Some(0), "{}", output(&verified));
}

#[test]
fn relay_command_delivers_all_but_the_refused_event_parks_it_and_delivers_it_on_retry() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(0x5eed_0002, true, None);
    let (cfg, _db, ids) = ingested(dir.path(), 120, rx.port());
    let refused = ids[37].clone();
    rx.with(|l| l.refuse = Some(refused.clone()));
    let log = dir.path().join("relay.log");
    let relay = spawn_relay(&cfg, &log, &[], &[]);

    let others: Vec<String> = ids.iter().filter(|i| **i != refused).cloned().collect();
    rx.await_until(Duration::from_secs(60), "all but the refused event", |l| {
        l.accepted.len() >= others.len()
    });
    assert_eq!(rx.accepted(), others, "each once, in log order");

    // Parked (at once: a park writes the cursor), with what the receiver said.
    poll(Duration::from_secs(30), "the refused event parked", || {
        !parked(&cfg).is_empty()
    });
    let p = parked(&cfg);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(field(&p[0], "offset"), &Json::Number("37".into()));
    assert_eq!(field(&p[0], "id"), &text(&refused));
    assert_eq!(
        field(&p[0], "reason"),
        &text("HTTP 422 Unprocessable Entity")
    );
    assert_eq!(
        field(&p[0], "response"),
        &text(
            "HTTP/1.1 422 Unprocessable Entity\n{\"error\":\"data.body: unknown incident kind\"}"
        )
    );
    match field(&p[0], "event") {
        Json::Object(ev) => assert_eq!(field(ev, "id"), &text(&refused)),
        other => panic!("the parked event is the envelope: {other:?}"),
    }

    // The receiver is fixed (and calm: the runner tries a retried parked event once, and a
    // 503 then would leave it parked for the next `relay retry`); an operator asks again.
    rx.with(|l| {
        l.refuse = None;
        l.chaos = false;
    });
    let out = common::run(&[
        "relay",
        "retry",
        "--config",
        cfg.to_str().unwrap(),
        "--sink",
        "cop",
        "37",
        "--reason",
        "fixed",
        "--operator",
        "test",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rx.await_until(
        Duration::from_secs(30),
        "the refused event after the retry",
        |l| l.accepted.contains(&refused),
    );
    poll(
        Duration::from_secs(30),
        "the delivered event unparked",
        || parked(&cfg).is_empty(),
    );

    stop_relay(relay, &log);

    // Each effect accepted once, the retried one last; every retry carried the same key.
    let mut want = others.clone();
    want.push(refused.clone());
    assert_eq!(rx.accepted(), want);
    let seen = rx.seen();
    assert_keys_are_the_quoted_ids(&seen);
    assert!(seen.iter().filter(|s| s.id() == refused).count() >= 2);
    let ids_seen: BTreeSet<String> = seen.iter().map(Seen::id).collect();
    assert!(seen.len() > ids_seen.len() + 3, "retries happened");
}

/// The requests in flight are not held to one batch: with `batch_max` 4 and `max_in_flight`
/// 8, the next batch is read and sent while the first awaits its answers. The receiver holds
/// the first 8 requests until 8 are outstanding at once: a sink that waits for each batch's
/// last answer before it sends the next batch never has more than 4 (the barrier then gives
/// up after `HOLD_LIMIT`, within the sink's `timeout_ms`, and `most_outstanding` says 4).
#[test]
fn the_relay_keeps_max_in_flight_requests_going_across_batch_boundaries() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(1, false, None);
    rx.with(|l| {
        l.hold = 8;
        l.barrier = 8;
    });
    let sink = format!(
        "url = \"http://127.0.0.1:{}/cop\"\nmax_in_flight = 8\nlinger_ms = 0\n",
        rx.port()
    );
    let (cfg, _db, ids, _) = ingested_from(dir.path(), 64, &sink, 8, 4, 30_000);
    let log = dir.path().join("relay.log");
    let relay = spawn_relay(&cfg, &log, &[], &[]);
    rx.await_until(Duration::from_secs(60), "every event", |l| {
        l.accepted.len() >= ids.len()
    });
    let text = stop_relay(relay, &log);

    let (most, overlap) = rx.with(|l| (l.most_outstanding, l.source_overlap));
    assert_eq!(
        most, 8,
        "requests outstanding at once, batches of 4\n{text}"
    );
    assert!(
        !overlap,
        "two requests of one source were in flight at once\n{text}"
    );
    // Each once (nothing failed), and per source in log order.
    let accepted = rx.accepted();
    assert_eq!(
        accepted.iter().collect::<BTreeSet<_>>(),
        ids.iter().collect::<BTreeSet<_>>()
    );
    assert_eq!(accepted.len(), ids.len(), "each event once");
    let offset = |id: &String| ids.iter().position(|i| i == id).unwrap();
    let mut last: BTreeMap<usize, usize> = BTreeMap::new();
    for id in &accepted {
        let o = offset(id);
        if let Some(prev) = last.insert(o % 8, o) {
            assert!(prev < o, "source {} got {o} after {prev}", o % 8);
        }
    }
}

#[test]
fn with_authorization_file_each_event_is_delivered_once_and_a_wrong_token_is_refused_as_401() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(3, false, None);
    rx.with(|l| l.authorization = Some("Bearer right-7f3a91".into()));
    let evs = events(12);
    let rt = runtime();
    let sink_with = |content: &str, name: &str| {
        let file = dir.path().join(name);
        secret_file(&file, content, 0o600);
        http_sink(&format!(
            "url = \"http://127.0.0.1:{}/cop\"\nauthorization_file = {:?}\n",
            rx.port(),
            file.to_str().unwrap()
        ))
    };

    // A wrong token: 401 is a refusal for good, as before (not a retry), said of the endpoint
    // (class "HTTP 401": the runner blocks the sink when events of two sources get it in a
    // row) and none is accepted. What the sink reports never holds the token.
    let mut wrong = sink_with("Bearer wrong-c0ffee\n", "wrong");
    let driven = rt.block_on(async {
        let d = drive(&mut wrong, &evs, 5).await;
        wrong.close().await;
        d
    });
    assert!(rx.accepted().is_empty());
    assert!(driven.retries.is_empty(), "{:?}", driven.retries);
    assert_eq!(driven.poisoned.len(), evs.len());
    assert!(driven.classes.iter().all(|c| c == "HTTP 401"), "{driven:?}");
    assert_eq!(driven.classes.len(), evs.len());
    for (_, reason, response) in &driven.poisoned {
        assert_eq!(reason, "HTTP 401 Unauthorized");
        assert_eq!(
            response,
            "HTTP/1.1 401 Unauthorized\n{\"error\":\"unauthorized\"}"
        );
    }
    assert!(!format!("{driven:?}").contains("c0ffee"));
    assert!(
        rx.seen()
            .iter()
            .all(|s| s.headers.get("authorization").map(String::as_str)
                == Some("Bearer wrong-c0ffee")),
        "the file's value, its line end trimmed, on every request"
    );

    // The right one: each event delivered once, in order, the header on every request.
    let before = rx.seen().len();
    let mut right = sink_with("Bearer right-7f3a91\r\n", "right");
    let driven = rt.block_on(async {
        let d = drive(&mut right, &evs, 5).await;
        right.close().await;
        d
    });
    assert!(
        driven.poisoned.is_empty() && driven.retries.is_empty(),
        "{driven:?}"
    );
    assert_eq!(
        rx.accepted(),
        evs.iter().map(|e| e.id.clone()).collect::<Vec<_>>()
    );
    let seen = rx.seen();
    assert_eq!(seen.len() - before, evs.len(), "one request per event");
    assert!(seen[before..].iter().all(|s| s.answer == 200));
}

#[test]
fn a_wrong_token_blocks_the_sink_instead_of_parking_the_feed_and_the_right_one_delivers_all() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(5, false, None);
    rx.with(|l| l.authorization = Some("Bearer right-5d2e".into()));
    let token = dir.path().join("cop-authorization");
    secret_file(&token, "Bearer wrong-5d2e\n", 0o600);
    let (cfg, _db, ids, _) = ingested_with(
        dir.path(),
        9,
        &format!(
            "url = \"http://127.0.0.1:{}/cop\"\nauthorization_file = {:?}\n",
            rx.port(),
            token.to_str().unwrap()
        ),
    );
    let log = dir.path().join("relay.log");
    let relay = spawn_relay(&cfg, &log, &[], &[]);
    let status = || {
        let out = common::run(&["relay", "status", "--config", cfg.to_str().unwrap()]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    common::wait_until(
        common::lazy(|| format!("the sink is blocked: {}", status())),
        Duration::from_secs(30),
        || status().contains("cop (http): blocked"),
    );
    let text = status();
    assert!(
        text.contains("cursor 0 of 9") && text.contains("HTTP 401 Unauthorized"),
        "{text}"
    );
    assert!(parked(&cfg).is_empty(), "nothing parked");
    let log_text = stop_relay(relay, &log);
    assert!(log_text.contains("relay sink blocked"), "{log_text}");
    // The token is put right; the restarted relay delivers all nine, once, in order.
    secret_file(&token, "Bearer right-5d2e\n", 0o600);
    let relay = spawn_relay(&cfg, &log, &[], &[]);
    rx.await_until(Duration::from_secs(60), "the nine events", |l| {
        l.accepted.len() >= 9
    });
    stop_relay(relay, &log);
    assert_eq!(rx.accepted(), ids);
    assert!(parked(&cfg).is_empty());
}

/// `health --config CFG`: exit code and line.
fn health(cfg: &Path) -> (Option<i32>, String) {
    let out = common::run(&["health", "--config", cfg.to_str().unwrap()]);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `report --format json` of the store `cfg` names: (verdict, summary.undelivered).
fn report_verdict(cfg: &Path) -> (String, Json) {
    let out = common::run(&[
        "report",
        "--config",
        cfg.to_str().unwrap(),
        "--format",
        "json",
        "-o",
        "-",
    ]);
    let doc = json::parse(&out.stdout, 64).unwrap();
    let Json::Object(m) = doc else { panic!() };
    let get = |k: &str| match &m.iter().find(|(n, _)| n == k).unwrap().1 {
        Json::Object(o) => o.clone(),
        _ => panic!(),
    };
    let verdict = match field(&get("verify"), "verdict") {
        Json::String(v) => v.clone(),
        other => panic!("{other:?}"),
    };
    (verdict, field(&get("summary"), "undelivered").clone())
}

#[test]
fn a_cop_answering_422_to_everything_blocks_the_sink_and_no_verdict_is_green() {
    // A COP whose schema changed answers 422 to every event. Events of two sources refused
    // the same way one after the other: the receiver refuses the feed, not an event. The
    // sink blocks at the first (nothing parked), every verdict says so, and once the COP is
    // fixed it delivers all, in order, with nothing for an operator to retry.
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(7, false, None);
    rx.with(|l| l.refuse_all = Some(422));
    let (cfg, _db, ids) = ingested(dir.path(), 60, rx.port());
    let log = dir.path().join("relay.log");
    let relay = spawn_relay(&cfg, &log, &[], &[]);
    let status = || {
        let out = common::run(&["relay", "status", "--config", cfg.to_str().unwrap()]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    common::wait_until(
        common::lazy(|| format!("the sink is blocked: {}", status())),
        Duration::from_secs(30),
        || status().contains("cop (http): blocked"),
    );
    assert!(
        status().contains("HTTP 422 Unprocessable Entity"),
        "{}",
        status()
    );
    assert!(parked(&cfg).is_empty(), "the parked events were taken back");
    let (code, line) = health(&cfg);
    assert_eq!(code, Some(2), "{line}");
    assert!(
        line.starts_with("REPLAY-GUARD CRITICAL - sink cop blocked: "),
        "{line}"
    );
    let (verdict, undelivered) = report_verdict(&cfg);
    assert_eq!(verdict, "undelivered");
    let Json::String(words) = undelivered else {
        panic!("{undelivered:?}")
    };
    assert!(
        words.starts_with("cop (blocked): 0 delivered, 60 effects behind ("),
        "{words}"
    );
    // The COP is fixed: the blocked sink, still trying, delivers every event once, in order.
    rx.with(|l| l.refuse_all = None);
    rx.await_until(Duration::from_secs(60), "the 60 events", |l| {
        l.accepted.len() >= 60
    });
    common::wait_until("the cursor at the head", Duration::from_secs(20), || {
        status().contains("cop (http): caught_up")
    });
    stop_relay(relay, &log);
    assert_eq!(rx.accepted(), ids);
    // All delivered: the report is amber only for what `ingest` reported upstream (the three
    // sources take turns at one counter, so each skips sequences).
    assert_eq!(report_verdict(&cfg), ("missing".to_string(), Json::Null));
}

#[test]
fn a_one_source_feed_refused_with_400_parks_every_event_and_every_verdict_says_so() {
    // With one source nothing tells the receiver's fault from the events': every event is
    // parked. That is never "caught up": the state is `parked`, health warns, the report is
    // not green and says the events never reached the receiver.
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(8, false, None);
    rx.with(|l| l.refuse_all = Some(400));
    let sink = format!("url = \"http://127.0.0.1:{}/cop\"\n", rx.port());
    let (cfg, _db, ids, _) = ingested_from(dir.path(), 60, &sink, 1, 16, 5000);
    let log = dir.path().join("relay.log");
    let relay = spawn_relay(&cfg, &log, &[], &[]);
    poll(Duration::from_secs(30), "60 parked", || {
        parked(&cfg).len() == 60
    });
    let out = common::run(&["relay", "status", "--config", cfg.to_str().unwrap()]);
    let st = String::from_utf8_lossy(&out.stdout);
    assert!(
        st.starts_with(
            "cop (http): parked — cursor 60 of 60, lag 0 events / 0 s, parked 60, delivered 0"
        ),
        "{st}"
    );
    let (code, line) = health(&cfg);
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.starts_with(
            "REPLAY-GUARD WARNING - sink cop 60 parked (never reached the receiver: relay \
             parked) (WARNING 0)"
        ),
        "{line}"
    );
    assert!(line.contains("'relay_parked_cop'=60;0;100;0"), "{line}");
    let (verdict, undelivered) = report_verdict(&cfg);
    assert_eq!(verdict, "undelivered");
    assert_eq!(
        undelivered,
        text("cop: 0 delivered, 60 parked (never reached the receiver)")
    );
    // Fixed and retried: everything arrives, and only then is every verdict green.
    rx.with(|l| l.refuse_all = None);
    let out = common::run(&[
        "relay",
        "retry",
        "--config",
        cfg.to_str().unwrap(),
        "--sink",
        "cop",
        "--all",
        "--reason",
        "COP schema v2 deployed",
        "--operator",
        "ana",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", output(&out));
    rx.await_until(Duration::from_secs(60), "the 60 events", |l| {
        l.accepted.len() >= 60
    });
    poll(Duration::from_secs(20), "nothing parked", || {
        parked(&cfg).is_empty()
    });
    stop_relay(relay, &log);
    let mut got = rx.accepted();
    got.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(report_verdict(&cfg), ("ok".to_string(), Json::Null));
    assert_eq!(health(&cfg).0, Some(0), "{}", health(&cfg).1);
}

#[test]
fn the_systemd_credential_named_after_the_sink_is_the_default_authorization_file() {
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(5, false, None);
    rx.with(|l| l.authorization = Some("Bearer from-systemd-91ab".into()));
    let creds = dir.path().join("credentials");
    std::fs::create_dir(&creds).unwrap();
    // systemd makes LoadCredential= files 0400, owned by the service's user.
    secret_file(
        &creds.join("cop-authorization"),
        "Bearer from-systemd-91ab\n",
        0o400,
    );
    let (cfg, _db, ids) = ingested(dir.path(), 6, rx.port());
    let log = dir.path().join("relay.log");
    let relay = spawn_relay(
        &cfg,
        &log,
        &[("CREDENTIALS_DIRECTORY", creds.to_str().unwrap())],
        &[],
    );
    rx.await_until(Duration::from_secs(60), "the six events", |l| {
        l.accepted.len() >= 6
    });
    let log = stop_relay(relay, &log);
    assert_eq!(rx.accepted(), ids, "each once, in log order\n{log}");
    assert!(rx.seen().iter().all(|s| s.answer == 200), "no 401: {log}");
    assert!(!log.contains("from-systemd"), "{log}");
    assert!(
        !log.contains("chmod 0600"),
        "a 0400 file is not warned about: {log}"
    );
}

#[test]
fn check_config_accepts_an_authorization_file_others_can_read_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cop-authorization");
    let cfg = dir.path().join("relay.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\npath = {:?}\n[[sink]]\nname = \"cop\"\nkind = \"http\"\n\
             url = \"http://127.0.0.1:9/cop\"\nauthorization_file = {:?}\n",
            dir.path().join("rg.redb").to_str().unwrap(),
            file.to_str().unwrap()
        ),
    )
    .unwrap();
    for (mode, warned) in [(0o644, true), (0o640, true), (0o600, false), (0o400, false)] {
        secret_file(&file, "Bearer mode-test-77aa\n", mode);
        let out = common::run(&["check-config", cfg.to_str().unwrap()]);
        let text = output(&out);
        assert_eq!(out.status.code(), Some(0), "{mode:o}: {text}");
        assert!(text.contains("ok for `relay`"), "{text}");
        assert_eq!(
            text.contains("WARN")
                && text.contains("authorization_file")
                && text.contains("chmod 0600"),
            warned,
            "{mode:o}: {text}"
        );
        assert!(!text.contains("mode-test"), "{text}");
    }
}

#[test]
fn no_command_output_log_or_stored_error_shows_the_authorization_value_or_the_url_query() {
    const TOKEN: &str = "tok-5ecret-a1b2c3";
    const QUERY: &str = "qry-5ecret-d4e5f6";
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(6, false, None);
    rx.with(|l| {
        l.authorization = Some(format!("Bearer {TOKEN}"));
        l.unavailable = true;
        // Every refusal quotes the request back, the token and the query with it.
        l.echo = true;
    });
    let auth = dir.path().join("cop-authorization");
    secret_file(&auth, &format!("Bearer {TOKEN}\n"), 0o600);
    let (cfg, db, ids, ingest_out) = ingested_with(
        dir.path(),
        9,
        &format!(
            "url = \"http://127.0.0.1:{}/cop?api_key={QUERY}\"\nauthorization_file = {:?}\n",
            rx.port(),
            auth.to_str().unwrap()
        ),
    );
    let cfg_s = cfg.to_str().unwrap();
    // Everything any command printed, and the relay's log.
    let mut all = format!("ingest:\n{ingest_out}\n");
    let run = |all: &mut String, what: &str, args: &[&str]| -> String {
        let out = common::run(args);
        let text = output(&out);
        all.push_str(&format!("{what}:\n{text}\n"));
        assert_eq!(out.status.code(), Some(0), "{what}: {text}");
        text
    };
    let checked = run(&mut all, "check-config", &["check-config", cfg_s]);
    assert!(checked.contains("cop (http)"), "{checked}");

    // The receiver answers 503 until the sink's error is stored and shown.
    let log = dir.path().join("relay.log");
    let relay = spawn_relay(&cfg, &log, &[("RUST_LOG", "debug")], &[]);
    let shown = format!("http://127.0.0.1:{}/cop?<redacted>", rx.port());
    poll(Duration::from_secs(60), "the 503 in relay status", || {
        let out = common::run(&["relay", "status", "--config", cfg_s]);
        String::from_utf8_lossy(&out.stdout).contains("503 Service Unavailable")
    });
    let status = run(
        &mut all,
        "relay status (retrying)",
        &["relay", "status", "--config", cfg_s],
    );
    assert!(
        status.contains("last error at ") && status.contains(&shown),
        "the stored error names the URL, its query redacted: {status}"
    );
    let json = run(
        &mut all,
        "relay status --format json (retrying)",
        &["relay", "status", "--config", cfg_s, "--format", "json"],
    );
    assert!(json.contains(&shown), "{json}");

    // The last event is refused (422, echoing the request): parked with the response.
    rx.with(|l| {
        l.unavailable = false;
        l.refuse = Some(ids[8].clone());
    });
    rx.await_until(Duration::from_secs(60), "the eight events", |l| {
        l.accepted.len() >= 8
    });
    poll(Duration::from_secs(30), "the ninth parked", || {
        parked(&cfg).len() == 1
    });
    let relay_log = stop_relay(relay, &log);
    assert_eq!(rx.accepted(), ids[..8], "each once, in log order");
    let response = match field(&parked(&cfg)[0], "response") {
        Json::String(r) => r.clone(),
        other => panic!("{other:?}"),
    };
    assert!(
        response.contains("you sent POST /cop?<redacted> with ")
            && response.contains("authorization: <redacted>"),
        "the echo is kept, its secrets masked: {response}"
    );
    // Both secrets went where they belong.
    for s in rx.seen() {
        assert_eq!(s.target, format!("/cop?api_key={QUERY}"));
        assert_eq!(
            s.headers.get("authorization"),
            Some(&format!("Bearer {TOKEN}"))
        );
    }
    assert!(
        relay_log.contains("delivery failed; retrying") && relay_log.contains(&shown),
        "the retries are logged, naming the URL redacted: {relay_log}"
    );
    all.push_str(&format!("relay log:\n{relay_log}\n"));

    run(
        &mut all,
        "relay status",
        &["relay", "status", "--config", cfg_s],
    );
    run(
        &mut all,
        "relay status --format json",
        &["relay", "status", "--config", cfg_s, "--format", "json"],
    );
    run(
        &mut all,
        "relay parked",
        &["relay", "parked", "--config", cfg_s, "--sink", "cop"],
    );
    run(
        &mut all,
        "stats --format prometheus",
        &["stats", "--config", cfg_s, "--format", "prometheus"],
    );
    run(
        &mut all,
        "stats",
        &["stats", "--config", cfg_s, "--format", "json"],
    );

    // Config errors that quote the URL or the line holding it.
    let text = std::fs::read_to_string(&cfg).unwrap();
    let url_line = text
        .lines()
        .find(|l| l.starts_with("url = "))
        .unwrap()
        .to_string();
    for (what, bad) in [
        ("a bad port", url_line.replace("127.0.0.1:", "127.0.0.1:x")),
        ("a TOML error", format!("{url_line} trailing")),
        ("an array", url_line.replace("url = ", "url = [") + "]"),
        (
            "the token typed inline",
            format!("authorization = \"Bearer {TOKEN}\""),
        ),
        (
            "a quote in a single-quoted URL",
            format!(
                "url = 'http://127.0.0.1:x{}/cop?a=1\"&api_key={QUERY}'",
                rx.port()
            ),
        ),
        (
            "a multi-line string",
            format!(
                "url = \"\"\"\nhttp://127.0.0.1:{}/cop?api_key={QUERY}\n\"\"\"",
                rx.port()
            ),
        ),
        (
            "a quote in a single-quoted URL, and more on the line",
            format!(
                "url = 'http://127.0.0.1:{}/cop?a=1\"&api_key={QUERY}' trailing",
                rx.port()
            ),
        ),
        (
            "a multi-line literal string, unclosed",
            format!(
                "url = '''\nhttp://127.0.0.1:{}/cop?api_key={QUERY}",
                rx.port()
            ),
        ),
    ] {
        let bad_cfg = dir.path().join("bad.toml");
        std::fs::write(&bad_cfg, text.replace(&url_line, &bad)).unwrap();
        let out = common::run(&["check-config", bad_cfg.to_str().unwrap()]);
        let e = output(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {e}");
        all.push_str(&format!("check-config, {what}:\n{e}\n"));
    }

    for secret in [TOKEN, QUERY] {
        assert!(!all.contains(secret), "{secret} shown:\n{all}");
    }
    // Nor anywhere in the database (the stored last error, the cursor record).
    let bytes = std::fs::read(&db).unwrap();
    for secret in [TOKEN, QUERY] {
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} stored in the database"
        );
    }
}

#[test]
fn mutual_tls_delivers_with_the_client_certificate_and_is_refused_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    super::tls::make_pki(&pki, "rg-mtls-ca");
    let rx = Receiver::start(7, false, Some(tls_server_with(&pki, true)));
    let evs = events(4);
    let rt = runtime();
    let path = |f: &str| pki.join(f).to_str().unwrap().to_string();
    let base = format!(
        "url = \"https://127.0.0.1:{}/e\"\nca_file = {:?}\n",
        rx.port(),
        path("ca.pem")
    );
    let cursor = CursorAfter {
        store: [7; 16],
        generation: 1,
        next_after: 4,
    };

    let mut anonymous = http_sink(&base);
    let a = rt.block_on(async {
        let a = anonymous.deliver(&evs, cursor).await;
        anonymous.close().await;
        a
    });
    assert_eq!(a.delivered, 0);
    assert!(
        matches!(&a.failure, Some(Failure::Retry { .. })),
        "a refused handshake is retried: {:?}",
        a.failure
    );
    assert!(rx.seen().is_empty(), "the receiver read no request");

    let mut sink = http_sink(&format!(
        "{base}client_cert_file = {:?}\nclient_key_file = {:?}\n",
        path("client.pem"),
        path("client.key")
    ));
    let a = rt.block_on(async {
        let a = sink.deliver(&evs, cursor).await;
        sink.close().await;
        a
    });
    assert_eq!((a.delivered, a.failure), (4, None));
    assert_eq!(
        rx.accepted(),
        evs.iter().map(|e| e.id.clone()).collect::<Vec<_>>()
    );
}

#[test]
fn check_config_refuses_a_client_key_that_is_not_the_certificates_naming_both_keys() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    super::tls::make_pki(&pki, "rg-pair-ca");
    let path = |f: &str| pki.join(f).to_str().unwrap().to_string();
    let check = |sink: &str| {
        let cfg = dir.path().join("relay.toml");
        std::fs::write(
            &cfg,
            format!(
                "[store]\npath = {:?}\n[[sink]]\nname = \"cop\"\nkind = \"http\"\n{sink}",
                dir.path().join("rg.redb").to_str().unwrap()
            ),
        )
        .unwrap();
        let out = common::run(&["check-config", cfg.to_str().unwrap()]);
        (out.status.code(), output(&out))
    };
    let https = format!(
        "url = \"https://127.0.0.1:9/e\"\nca_file = {:?}\n",
        path("ca.pem")
    );
    let pair = |cert: &str, key: &str| {
        format!(
            "client_cert_file = {:?}\nclient_key_file = {:?}\n",
            path(cert),
            path(key)
        )
    };

    let (code, text) = check(&format!("{https}{}", pair("client.pem", "client.key")));
    assert_eq!(code, Some(0), "{text}");

    // The server's key with the client's certificate: both are valid PEM, not a pair.
    let (code, text) = check(&format!("{https}{}", pair("client.pem", "server.key")));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(&format!(
            "client_key_file {} is not the private key of client_cert_file {}",
            path("server.key"),
            path("client.pem")
        )),
        "{text}"
    );

    let (code, text) = check(&format!(
        "url = \"http://127.0.0.1:9/e\"\n{}",
        pair("client.pem", "client.key")
    ));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("client_cert_file and client_key_file are for an https:// url"),
        "{text}"
    );

    let (code, text) = check(&format!(
        "{https}client_cert_file = {:?}\n",
        path("client.pem")
    ));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("client_cert_file and client_key_file go together"),
        "{text}"
    );
}

#[test]
fn without_ca_file_https_verifies_against_the_system_store_which_refuses_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    super::tls::make_pki(dir.path(), "rg-private-ca");
    let rx = Receiver::start(8, false, Some(tls_server(dir.path())));
    // Accepted without ca_file; this process's system store (the host's CA bundle, or what
    // SSL_CERT_FILE/SSL_CERT_DIR name) does not hold the test's CA.
    let mut sink = http_sink(&format!("url = \"https://127.0.0.1:{}/e\"\n", rx.port()));
    let a = runtime().block_on(sink.deliver(
        &events(2),
        CursorAfter {
            store: [7; 16],
            generation: 1,
            next_after: 2,
        },
    ));
    assert_eq!(a.delivered, 0);
    match a.failure {
        Some(Failure::Retry { error, .. }) => {
            // A handshake refused for its certificate: the store was read (an empty one is
            // another error) and the receiver checked against it.
            assert!(
                error.starts_with("TLS handshake with https://127.0.0.1:"),
                "{error}"
            );
            assert!(error.contains("UnknownIssuer"), "{error}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        rx.seen().is_empty(),
        "nothing is sent to an unverified receiver"
    );
}

#[test]
fn relay_without_ca_file_trusts_the_system_store_that_ssl_cert_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let (good, other) = (dir.path().join("good"), dir.path().join("other"));
    for (d, name) in [(&good, "rg-system-ca"), (&other, "rg-not-trusted-ca")] {
        std::fs::create_dir(d).unwrap();
        super::tls::make_pki(d, name);
    }
    let rx = Receiver::start(9, false, Some(tls_server(&good)));
    let (cfg, _db, ids, _) = ingested_with(
        dir.path(),
        5,
        &format!("url = \"https://127.0.0.1:{}/cop\"\n", rx.port()),
    );
    let log = dir.path().join("relay.log");
    // rustls-native-certs reads only SSL_CERT_FILE when it is set (and SSL_CERT_DIR is not):
    // a system store that holds another CA refuses the receiver ...
    let relay = spawn_relay(
        &cfg,
        &log,
        &[("SSL_CERT_FILE", other.join("ca.pem").to_str().unwrap())],
        &["SSL_CERT_DIR"],
    );
    poll(Duration::from_secs(60), "the refused handshake", || {
        let out = common::run(&["relay", "status", "--config", cfg.to_str().unwrap()]);
        String::from_utf8_lossy(&out.stdout).contains("UnknownIssuer")
    });
    let text = stop_relay(relay, &log);
    assert!(rx.accepted().is_empty(), "{text}");
    // ... and one that holds the receiver's CA trusts it.
    let relay = spawn_relay(
        &cfg,
        &log,
        &[("SSL_CERT_FILE", good.join("ca.pem").to_str().unwrap())],
        &["SSL_CERT_DIR"],
    );
    rx.await_until(Duration::from_secs(60), "the five events", |l| {
        l.accepted.len() >= 5
    });
    let text = stop_relay(relay, &log);
    assert_eq!(rx.accepted(), ids, "each once, in log order\n{text}");
}

#[test]
fn an_outcomes_filtered_audit_sink_refused_with_401_blocks_and_delivers_every_selected_entry() {
    // The audit sink selects duplicates; between them lie applied entries it passes over.
    // Refused with 401 (a wrong token), it blocks; the duplicate parked before the block is
    // taken back too (before, it stayed parked while the error said "nothing is parked"),
    // and once the token is right every selected entry arrives, once, in order.
    let dir = tempfile::tempdir().unwrap();
    let rx = Receiver::start(9, false, None);
    rx.with(|l| l.authorization = Some("Bearer right-81c4".into()));
    let token = dir.path().join("cop-authorization");
    secret_file(&token, "Bearer wrong-81c4\n", 0o600);
    let sink = format!(
        "url = \"http://127.0.0.1:{}/siem\"\nstream = \"audit\"\noutcomes = [\"duplicate\"]\n\
         authorization_file = {:?}\n",
        rx.port(),
        token.to_str().unwrap()
    );
    let (cfg, _db, _, _) = ingested_from(dir.path(), 0, &sink, 1, 16, 5000);
    let feed = dir.path().join("pairs.jsonl");
    let lines: String = ["e1", "e2", "e3", "e4"]
        .iter()
        .flat_map(|s| {
            let m = common::msg("fire", s, 1, 1, "x");
            [m.clone() + "\n", m + "\n"]
        })
        .collect();
    std::fs::write(&feed, lines).unwrap();
    let out = common::run(&[
        "ingest",
        "--config",
        cfg.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", output(&out));
    let log = dir.path().join("relay.log");
    let relay = spawn_relay(&cfg, &log, &[], &[]);
    let status = || {
        let out = common::run(&["relay", "status", "--config", cfg.to_str().unwrap()]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    common::wait_until(
        common::lazy(|| format!("the sink is blocked: {}", status())),
        Duration::from_secs(30),
        || status().contains("cop (http, audit log): blocked"),
    );
    let text = status();
    assert!(
        text.contains("cursor 1 of 8") && text.contains("nothing is parked"),
        "{text}"
    );
    assert!(
        parked(&cfg).is_empty(),
        "the parked duplicate was taken back"
    );
    stop_relay(relay, &log);
    secret_file(&token, "Bearer right-81c4\n", 0o600);
    let relay = spawn_relay(&cfg, &log, &[], &[]);
    rx.await_until(Duration::from_secs(60), "the four duplicates", |l| {
        l.accepted.len() >= 4
    });
    common::wait_until("caught up", Duration::from_secs(20), || {
        status().contains("cop (http, audit log): caught_up")
    });
    stop_relay(relay, &log);
    let got: Vec<u64> = rx
        .accepted()
        .iter()
        .map(|id| id.split('-').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(got, [1, 3, 5, 7]);
    assert!(parked(&cfg).is_empty());
    let out = common::run(&["verify", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", output(&out));
}
