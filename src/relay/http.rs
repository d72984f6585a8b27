//! The `http` sink: POSTs each event, one request per event in offset order, to `url` over a
//! HTTP/1.1 keep-alive connection (TLS for `https://`, verified against `ca_file` or, without
//! it, the operating system's trust store, with a client certificate if configured), with the event id in an `Idempotency-Key` header so that the receiver can
//! drop the redeliveries at-least-once makes, and the configured `Authorization` value if there
//! is one (a sensitive header value: hyper never prints it; `url` prints its query redacted, so
//! neither reaches a log line or error).
//! With `max_in_flight` > 1, up to that many requests go at once on as many connections, never
//! two for the same source, so each source's events still arrive in log order; the sink is
//! windowed (`Lanes`): the requests in flight are not held to one of the runner's batches.
//!
//! hyper's client is named only here, its I/O adapter in `hyper_io` (ARCHITECTURE.md). The status classes, `Retry-After` and the
//! Structured-Field string are pure functions below, unit-tested.
//!
//! - 2xx: delivered.
//! - 408, 409, 425, 429, 5xx, a timeout, a lost or refused connection: retry (the runner backs
//!   off, at least as long as `Retry-After` asks, up to `MAX_RETRY_AFTER`). So is any status
//!   outside 2xx..5xx (1xx as a final answer, 6xx and up): an odd answer is not a refusal.
//! - any other 3xx or 4xx (redirects are not followed): a refusal classed by its status
//!   (`Failure::Refused`): the event is parked, with the status line and the first
//!   `RESPONSE_KEPT` bytes of the body, unless the next event of another source gets the
//!   same status, which blocks the sink (`state::SinkState`: the receiver refuses the feed).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue, USER_AGENT};
use hyper::{Method, Request, Response, StatusCode, Uri};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types;

use super::{Attempt, Event, Failure};
use crate::config::{HttpSink as HttpConfig, HttpUrl};
use crate::hyper_io::Io;
use crate::timefmt::{days_from_civil, days_in_month};

/// The request's media type: a CloudEvents structured-mode event.
const EVENT_MEDIA_TYPE: &str = "application/cloudevents+json; charset=utf-8";
/// Bytes of a refusing response's body kept with a parked event.
const RESPONSE_KEPT: usize = 512;
/// Bytes of a retryable response's body shown in the sink's last error.
const ERROR_BODY_SHOWN: usize = 200;
/// Most bytes of a response body read to keep the connection; past that the connection is
/// dropped (the next request opens a new one) rather than read to its end.
const BODY_DRAIN_MAX: usize = 64 * 1024;
/// The longest `Retry-After` honoured (the highest `backoff_max_ms`): a receiver cannot stall
/// a sink for a day with one header.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// How long `close` waits for the connection to shut down politely.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

pub struct HttpSink {
    target: Arc<Target>,
    ca_file: Option<PathBuf>,
    /// Certificate chain and key files for mutual TLS.
    client_identity: Option<(PathBuf, PathBuf)>,
    /// Built on the first `https://` delivery (it reads `ca_file` or the system's trust
    /// store), then reused.
    tls: Option<TlsConnector>,
    /// Open keep-alive connections not in use, at most `max_in_flight`.
    idle: Vec<Conn>,
    /// The events handed over and not yet reported (the windowed mode).
    lanes: Lanes,
    /// The requests in flight, each with its event's number in `lanes`.
    requests: JoinSet<(Option<Conn>, Result<(), Failure>)>,
    request_of: HashMap<tokio::task::Id, u64>,
}

/// Where and how requests go; shared by the requests in flight.
struct Target {
    url: HttpUrl,
    /// `url`'s path and query, as the request target (`url` itself prints the query
    /// redacted: it names the receiver in every error and log line).
    path: Uri,
    host: HeaderValue,
    /// Marked sensitive.
    authorization: Option<HeaderValue>,
    timeout: Duration,
    /// What a receiver echoing the request must not get into a stored response or an error:
    /// the `Authorization` value and its credential, the URL's query and its values
    /// (`Secrets::mask`).
    secrets: Secrets,
}

/// Texts never stored or shown as a receiver sent them back (a receiver echoing the
/// request's headers or target into its answer would otherwise put the token into a parked
/// event's response, `relay status` and the logs).
#[derive(Default)]
struct Secrets(Vec<String>);

impl Secrets {
    /// Shortest text masked on its own: shorter ones (a query value `1`) would mask
    /// everything that happens to hold them, and carry no credential.
    const SHORTEST: usize = 4;

    fn of(authorization: Option<&str>, query: Option<&str>) -> Secrets {
        let mut all: Vec<String> = Vec::new();
        if let Some(a) = authorization {
            all.push(a.to_string());
            // "Bearer TOKEN", "Basic B64": the credential alone, as an echo may quote it.
            if let Some((_, credential)) = a.split_once(' ') {
                all.push(credential.trim().to_string());
            }
        }
        if let Some(q) = query {
            all.push(q.to_string());
            for pair in q.split('&') {
                let value = pair.split_once('=').map_or(pair, |(_, v)| v);
                all.push(value.to_string());
            }
        }
        all.retain(|s| s.len() >= Secrets::SHORTEST);
        // Longest first, so a value inside a longer secret never leaves the rest shown.
        all.sort_by_key(|s| std::cmp::Reverse(s.len()));
        all.dedup();
        Secrets(all)
    }

    /// `text` with every secret replaced by `<redacted>`, and a secret's beginning at its
    /// very end too (the body is kept only up to a bound, which may cut a secret in two).
    fn mask(&self, text: &str) -> String {
        let mut out = text.to_string();
        for secret in &self.0 {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), "<redacted>");
            }
        }
        for secret in &self.0 {
            let cut = (Secrets::SHORTEST..secret.len())
                .rev()
                .filter(|n| secret.is_char_boundary(*n))
                .find(|n| out.ends_with(&secret[..*n]));
            if let Some(n) = cut {
                out.truncate(out.len() - n);
                out.push_str("<redacted>");
            }
        }
        out
    }
}

/// One open keep-alive connection: hyper's request handle and the task driving the socket.
/// Dropping it drops the socket at once; `HttpSink::close` shuts it down politely.
struct Conn {
    send: http1::SendRequest<Full<Bytes>>,
    task: Option<JoinHandle<()>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// Why the sink cannot be made from its configuration, or a request could not be sent or
/// its response read. The sink's url prints its query redacted.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    // Urls are kept as printed: the query redacted.
    #[error("url {url}: the path and query are not a request target: {error}")]
    RequestTarget {
        url: String,
        error: hyper::http::uri::InvalidUri,
    },
    #[error("url {url}: the host cannot be sent in a Host header")]
    HostHeader { url: String },
    #[error("the authorization_file value cannot be sent in a header")]
    AuthorizationHeader,
    /// A character outside printable ASCII (`sf_string`).
    #[error("{0:?} cannot be carried by a Structured Field string (printable ASCII only)")]
    NotSfString(char),
    /// The TLS client could not be made from `ca_file`, the system's trust store or the
    /// client certificate.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error("connecting to {url}: {error}")]
    Connect { url: String, error: std::io::Error },
    #[error("{url}: not a TLS server name: {error}")]
    ServerName {
        url: String,
        error: pki_types::InvalidDnsNameError,
    },
    #[error("TLS handshake with {url}: {error}")]
    TlsHandshake { url: String, error: std::io::Error },
    #[error("HTTP/1.1 handshake: {}", chain(.0))]
    Handshake(hyper::Error),
    #[error("no connection")]
    NoConnection,
    #[error("POST {url}: the connection closed at once")]
    ClosedAtOnce { url: String },
    #[error("POST {url}: {}", chain(.error))]
    Send { url: String, error: hyper::Error },
    #[error("POST {url}: {status_line}, then reading the body: {}", chain(.error))]
    Body {
        url: String,
        status_line: String,
        error: hyper::Error,
    },
}

/// How a status is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Delivered,
    Retry,
    Poison,
}

/// The status classes (module doc).
pub fn classify(status: u16) -> Class {
    match status {
        200..=299 => Class::Delivered,
        408 | 409 | 425 | 429 | 500..=599 => Class::Retry,
        300..=499 => Class::Poison,
        _ => Class::Retry,
    }
}

/// `value` as a Structured-Field string (RFC 8941 3.3.3), the form
/// draft-ietf-httpapi-idempotency-key-header gives the key: in double quotes, `\` and `"`
/// escaped with `\`. Only printable ASCII (0x20..=0x7E) can be carried; anything else is
/// refused, not dropped or replaced.
pub fn sf_string(value: &str) -> Result<String, HttpError> {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '\\' | '"' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => return Err(HttpError::NotSfString(c)),
        }
    }
    out.push('"');
    Ok(out)
}

/// A `Retry-After` value (RFC 9110 10.2.3) as a wait from `now`: delta-seconds, or an
/// HTTP-date in any of the three forms a recipient must accept (IMF-fixdate, RFC 850,
/// asctime); a date in the past is no wait. `None` for anything else. Capped at
/// `MAX_RETRY_AFTER`.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits to parse is a long wait, not no wait.
        let secs = v.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    }
    let now_secs = now.duration_since(UNIX_EPOCH).ok()?.as_secs();
    let at = http_date(v, now_secs)?;
    Some(Duration::from_secs(at.saturating_sub(now_secs)).min(MAX_RETRY_AFTER))
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];
const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const LONG_DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// An HTTP-date as Unix seconds. `now_secs` places an RFC 850 two-digit year: one that would
/// be more than 50 years ahead is the most recent past year with those digits (RFC 9110
/// 5.6.7). The weekday is checked for its spelling, not against the date.
fn http_date(v: &str, now_secs: u64) -> Option<u64> {
    let parts: Vec<&str> = v.split(' ').collect();
    let (year, month, day, time) = match parts.as_slice() {
        // IMF-fixdate: Sun, 06 Nov 1994 08:49:37 GMT
        [wd, d, m, y, t, "GMT"] => {
            let wd = wd.strip_suffix(',')?;
            if !DAYS.contains(&wd) || d.len() != 2 || y.len() != 4 {
                return None;
            }
            (number(y)?, month_number(m)?, number(d)?, *t)
        }
        // RFC 850: Sunday, 06-Nov-94 08:49:37 GMT
        [wd, dmy, t, "GMT"] => {
            let wd = wd.strip_suffix(',')?;
            if !LONG_DAYS.contains(&wd) {
                return None;
            }
            let mut f = dmy.split('-');
            let (d, m, yy) = (f.next()?, f.next()?, f.next()?);
            if f.next().is_some() || d.len() != 2 || yy.len() != 2 {
                return None;
            }
            let this_year = crate::timefmt::rfc3339_ms(now_secs.saturating_mul(1000))
                .get(..4)
                .and_then(number)?;
            let mut year = this_year - this_year % 100 + number(yy)?;
            if year > this_year + 50 {
                year -= 100;
            }
            (year, month_number(m)?, number(d)?, *t)
        }
        // asctime: Sun Nov  6 08:49:37 1994 (a one-digit day is padded with a space)
        [wd, m, "", d, t, y] | [wd, m, d, t, y] => {
            if !DAYS.contains(wd) || y.len() != 4 || d.is_empty() || d.len() > 2 {
                return None;
            }
            if parts.len() == 5 && d.len() != 2 || parts.len() == 6 && d.len() != 1 {
                return None;
            }
            (number(y)?, month_number(m)?, number(d)?, *t)
        }
        _ => return None,
    };
    if day == 0 || day > days_in_month(year, month) {
        return None;
    }
    let mut hms = time.split(':');
    let (h, mi, s) = (hms.next()?, hms.next()?, hms.next()?);
    if hms.next().is_some() || h.len() != 2 || mi.len() != 2 || s.len() != 2 {
        return None;
    }
    let (h, mi, s) = (number(h)?, number(mi)?, number(s)?);
    // 60: a leap second (RFC 9110 allows it).
    if h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day)?;
    Some(days * 86_400 + h * 3600 + mi * 60 + s)
}

fn number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn month_number(m: &str) -> Option<u64> {
    MONTHS.iter().position(|x| *x == m).map(|i| i as u64 + 1)
}

/// A response, read: what classification and the operator need.
struct Reply {
    status: StatusCode,
    /// The status line as received (`HTTP/1.1 422 Unprocessable Entity`).
    status_line: String,
    retry_after: Option<String>,
    /// The body's first `RESPONSE_KEPT` bytes.
    body: Vec<u8>,
}

impl HttpSink {
    /// Checks what the request needs from the URL; no I/O.
    pub fn new(
        cfg: &HttpConfig,
        timeout: Duration,
        max_in_flight: usize,
    ) -> Result<HttpSink, HttpError> {
        let url = cfg.url.clone();
        let path: Uri = url
            .request_target()
            .parse()
            .map_err(|error| HttpError::RequestTarget {
                url: url.to_string(),
                error,
            })?;
        let default_port = if url.tls { 443 } else { 80 };
        let host = if url.host.contains(':') {
            format!("[{}]", url.host)
        } else {
            url.host.clone()
        };
        let host = if url.port == default_port {
            host
        } else {
            format!("{host}:{}", url.port)
        };
        let host = HeaderValue::from_str(&host).map_err(|_| HttpError::HostHeader {
            url: url.to_string(),
        })?;
        let authorization = match &cfg.authorization {
            None => None,
            Some(a) => {
                // The config allows printable ASCII only, which a header value always takes.
                let mut v = HeaderValue::from_str(a.expose())
                    .map_err(|_| HttpError::AuthorizationHeader)?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        let secrets = Secrets::of(
            cfg.authorization.as_ref().map(|a| a.expose()),
            url.request_target().split_once('?').map(|(_, q)| q),
        );
        Ok(HttpSink {
            target: Arc::new(Target {
                url,
                path,
                host,
                authorization,
                timeout,
                secrets,
            }),
            ca_file: cfg.ca_file.clone(),
            client_identity: cfg.client_identity.clone(),
            tls: None,
            idle: Vec::new(),
            lanes: Lanes::new(max_in_flight),
            requests: JoinSet::new(),
            request_of: HashMap::new(),
        })
    }

    /// Hands `events` over, to be POSTed after those handed over before (the windowed mode:
    /// `acked` reports them).
    pub fn hand(&mut self, events: &[Event]) {
        for e in events {
            self.lanes.hand(e.clone());
        }
    }

    /// Starts what `Lanes` allows and waits until more of what was handed over is delivered
    /// from the front, or the event after the delivered ones failed: every event handed over
    /// is then forgotten (the requests still in flight are abandoned; the runner hands the
    /// events over again). Cancel-safe: the requests run as tasks, and their state is kept
    /// here between calls.
    pub async fn acked(&mut self) -> Attempt {
        loop {
            if let Some(a) = self.lanes.report() {
                if a.failure.is_some() {
                    self.forget();
                }
                return a;
            }
            if self.lanes.is_empty() {
                return Attempt {
                    delivered: 0,
                    failure: None,
                };
            }
            let tls = match self.tls_connector() {
                Ok(t) => t,
                Err(e) => {
                    self.forget();
                    return Attempt::retry(0, e.to_string());
                }
            };
            while let Some((n, ev)) = self.lanes.start() {
                let (target, tls) = (self.target.clone(), tls.clone());
                let mut conn = self.idle.pop();
                let task = self.requests.spawn(async move {
                    let r = post(&target, tls.as_ref(), &mut conn, &ev).await;
                    (conn, r)
                });
                self.request_of.insert(task.id(), n);
            }
            let Some(joined) = self.requests.join_next_with_id().await else {
                // `Lanes` starts the front event whenever nothing is in flight, so this is
                // not reached; were it, nothing would ever be reported.
                self.forget();
                return Attempt::retry(0, "no request in flight for the pending events");
            };
            let (id, result) = match joined {
                Ok((id, (conn, r))) => {
                    self.idle.extend(conn);
                    (id, r)
                }
                Err(e) => (
                    e.id(),
                    Err(Failure::Retry {
                        error: format!("POST {}: the request task failed: {e}", self.target.url),
                        after: None,
                    }),
                ),
            };
            if let Some(n) = self.request_of.remove(&id) {
                self.lanes.finished(n, result);
            }
        }
    }

    /// Forgets every event handed over. Requests in flight are not cut off: the receiver may
    /// be working on them, so their sources stay busy (and they count against
    /// `max_in_flight`) until they end, and what they come to is dropped.
    pub fn forget(&mut self) {
        self.lanes.forget();
    }

    /// Closes the connections: hyper shuts each socket down (a TLS close_notify first) once
    /// its request handle is gone.
    pub async fn close(&mut self) {
        self.lanes.abort();
        self.requests.abort_all();
        self.requests.detach_all();
        self.request_of.clear();
        for mut conn in self.idle.drain(..) {
            let task = conn.task.take();
            drop(conn);
            if let Some(task) = task {
                let abort = task.abort_handle();
                if tokio::time::timeout(CLOSE_WAIT, task).await.is_err() {
                    abort.abort();
                }
            }
        }
    }

    /// The TLS client for an `https://` url, made once.
    fn tls_connector(&mut self) -> Result<Option<TlsConnector>, HttpError> {
        if !self.target.url.tls {
            return Ok(None);
        }
        if let Some(t) = &self.tls {
            return Ok(Some(t.clone()));
        }
        let t = tls_connector(self.ca_file.as_deref(), self.client_identity.as_ref())?;
        self.tls = Some(t.clone());
        Ok(Some(t))
    }
}

/// The events handed to the sink and not yet reported, and which of them may be POSTed now
/// (sans-IO; `HttpSink::acked` makes the requests): at most `max` at once, never two of one
/// source (agency, source_id), so each source's events arrive in log order; none at or after
/// the first failure. Reports the delivered prefix as it grows; a failure once no request is
/// in flight any more, so the report is exact: the delivered prefix and the failure of the
/// event after it. Events of other sources after the failed one that were already delivered
/// are delivered again when the runner hands them over again (same `Idempotency-Key`).
#[derive(Debug)]
struct Lanes {
    /// In log order; `slots[0]` is event number `front` (numbers are never reused, so a
    /// request's result that arrives after `clear` matches nothing).
    slots: VecDeque<Slot>,
    front: u64,
    max: usize,
    flying: usize,
    /// The sources with a request in flight (`source_key`), forgotten events' requests
    /// included.
    busy: HashSet<u64>,
    /// Requests of forgotten events still in flight: number -> source.
    abandoned: HashMap<u64, u64>,
    /// The number of the first failed event: nothing at or after it is started.
    stop: u64,
}

#[derive(Debug)]
enum Slot {
    /// With its `source_key`.
    Waiting(Event, u64),
    /// Its request is in flight, for this source.
    Flying(u64),
    Delivered,
    Failed(Failure),
}

impl Lanes {
    fn new(max: usize) -> Lanes {
        Lanes {
            slots: VecDeque::new(),
            front: 0,
            max: max.max(1),
            flying: 0,
            busy: HashSet::new(),
            abandoned: HashMap::new(),
            stop: u64::MAX,
        }
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn hand(&mut self, ev: Event) {
        let key = source_key(&ev);
        self.slots.push_back(Slot::Waiting(ev, key));
    }

    /// The next event to POST, by number, if one may start now (it is then in flight).
    fn start(&mut self) -> Option<(u64, Event)> {
        if self.flying >= self.max {
            return None;
        }
        let limit = usize::try_from(self.stop.saturating_sub(self.front)).unwrap_or(usize::MAX);
        let (i, source) = self
            .slots
            .iter()
            .take(limit)
            .enumerate()
            .find_map(|(i, s)| match s {
                Slot::Waiting(_, key) if !self.busy.contains(key) => Some((i, *key)),
                _ => None,
            })?;
        let Slot::Waiting(ev, _) = std::mem::replace(&mut self.slots[i], Slot::Flying(source))
        else {
            return None;
        };
        self.busy.insert(source);
        self.flying += 1;
        Some((self.front + i as u64, ev))
    }

    /// The request for event `n` ended with `result`.
    fn finished(&mut self, n: u64, result: Result<(), Failure>) {
        if let Some(source) = self.abandoned.remove(&n) {
            self.release(source);
            return;
        }
        let Some(i) = n
            .checked_sub(self.front)
            .and_then(|i| usize::try_from(i).ok())
            .filter(|i| *i < self.slots.len())
        else {
            return;
        };
        let Slot::Flying(source) = self.slots[i] else {
            return;
        };
        self.release(source);
        self.slots[i] = match result {
            Ok(()) => Slot::Delivered,
            Err(f) => {
                self.stop = self.stop.min(n);
                Slot::Failed(f)
            }
        };
    }

    fn release(&mut self, source: u64) {
        self.busy.remove(&source);
        self.flying = self.flying.saturating_sub(1);
    }

    /// What to report now: the delivered events from the front (they leave), and the failure
    /// of the event after them once it is at the front (then everything is cleared); `None`
    /// while the front awaits its request.
    fn report(&mut self) -> Option<Attempt> {
        let delivered = self
            .slots
            .iter()
            .take_while(|s| matches!(s, Slot::Delivered))
            .count();
        self.slots.drain(..delivered);
        self.front += delivered as u64;
        // Requests after the failed one still in flight are let finish first: the receiver
        // is never sent an event again while it may still be working on it, and their
        // connections are kept.
        let failure = if self.flying == 0 && matches!(self.slots.front(), Some(Slot::Failed(_))) {
            match self.slots.pop_front() {
                Some(Slot::Failed(f)) => Some(f),
                _ => None,
            }
        } else {
            None
        };
        if failure.is_some() {
            self.front += 1;
            self.forget();
        }
        (delivered > 0 || failure.is_some()).then_some(Attempt { delivered, failure })
    }

    /// Forgets every event handed over; those in flight are abandoned: their sources stay
    /// busy until their requests end (`finished`).
    fn forget(&mut self) {
        let n = self.slots.len() as u64;
        for (i, slot) in self.slots.drain(..).enumerate() {
            if let Slot::Flying(source) = slot {
                self.abandoned.insert(self.front + i as u64, source);
            }
        }
        self.front += n;
        self.stop = u64::MAX;
    }

    /// Forgets everything, the requests in flight too (they were cut off).
    fn abort(&mut self) {
        self.forget();
        self.abandoned.clear();
        self.busy.clear();
        self.flying = 0;
    }
}

/// An event's source (agency, source_id) as `Lanes` tells sources apart: a hash, so that
/// telling whether its source is busy costs no copy of its names. Two sources that shared a
/// hash would only be sent one after the other, never out of order.
fn source_key(ev: &Event) -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (ev.agency.as_str(), ev.source_id.as_str()).hash(&mut h);
    h.finish()
}

/// POSTs one event on `conn` (opened if `None`; left `None` when it is of no further use).
async fn post(
    t: &Target,
    tls: Option<&TlsConnector>,
    conn: &mut Option<Conn>,
    ev: &Event,
) -> Result<(), Failure> {
    let key = sf_string(&ev.id).map_err(|e| Failure::Poison {
        reason: "the event id cannot be an Idempotency-Key".into(),
        response: e.to_string(),
    })?;
    let key = HeaderValue::from_str(&key).map_err(|e| Failure::Poison {
        reason: "the event id cannot be an Idempotency-Key".into(),
        response: e.to_string(),
    })?;
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(t.path.clone())
        .header(HOST, t.host.clone())
        .header(CONTENT_TYPE, EVENT_MEDIA_TYPE)
        .header("idempotency-key", key)
        .header(
            USER_AGENT,
            concat!("replay-guard/", env!("CARGO_PKG_VERSION")),
        );
    if let Some(a) = &t.authorization {
        req = req.header(AUTHORIZATION, a.clone());
    }
    let req = req
        .body(Full::new(Bytes::from(ev.json.clone())))
        .map_err(|e| Failure::Poison {
            reason: "the request cannot be built".into(),
            response: e.to_string(),
        })?;
    let reply = match tokio::time::timeout(t.timeout, exchange(t, tls, conn, req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(error)) => {
            *conn = None;
            return Err(Failure::Retry {
                error: error.to_string(),
                after: None,
            });
        }
        Err(_) => {
            // The request may be half-written or its answer half-read: the connection is of
            // no further use.
            *conn = None;
            return Err(Failure::Retry {
                error: format!(
                    "POST {}: no complete response within {} ms",
                    t.url,
                    t.timeout.as_millis()
                ),
                after: None,
            });
        }
    };
    let code = reply.status.as_u16();
    let reason = match reply.status.canonical_reason() {
        Some(r) => format!("HTTP {code} {r}"),
        None => format!("HTTP {code}"),
    };
    match classify(code) {
        Class::Delivered => Ok(()),
        Class::Retry => {
            let shown = t.secrets.mask(
                &String::from_utf8_lossy(&reply.body[..reply.body.len().min(ERROR_BODY_SHOWN)])
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" "),
            );
            Err(Failure::Retry {
                error: if shown.is_empty() {
                    format!("POST {}: {reason}", t.url)
                } else {
                    format!("POST {}: {reason}: {shown}", t.url)
                },
                after: reply
                    .retry_after
                    .as_deref()
                    .and_then(|v| retry_after(v, SystemTime::now())),
            })
        }
        Class::Poison => {
            let response = t.secrets.mask(&format!(
                "{}\n{}",
                reply.status_line,
                String::from_utf8_lossy(&reply.body)
            ));
            // Classed by its status: the runner parks the event, and blocks the sink if the
            // next event of another source gets the same answer (a receiver refusing the
            // feed, not one event: its credentials, its address, or a schema change that
            // answers 400 or 422 to everything).
            Err(Failure::Refused {
                class: format!("HTTP {code}"),
                reason,
                response,
            })
        }
    }
}

/// Sends `req` on `conn` (opening one if there is none) and reads the reply. A request that
/// hyper hands back unsent (the server closed the idle connection first) goes once more on a
/// new connection.
async fn exchange(
    t: &Target,
    tls: Option<&TlsConnector>,
    conn: &mut Option<Conn>,
    req: Request<Full<Bytes>>,
) -> Result<Reply, HttpError> {
    let mut req = req;
    let mut fresh = false;
    loop {
        if conn.as_ref().is_none_or(|c| c.send.is_closed()) {
            *conn = None;
            *conn = Some(connect(t, tls).await?);
            fresh = true;
        }
        let Some(c) = conn.as_mut() else {
            return Err(HttpError::NoConnection);
        };
        if c.send.ready().await.is_err() {
            *conn = None;
            if fresh {
                return Err(HttpError::ClosedAtOnce {
                    url: t.url.to_string(),
                });
            }
            continue;
        }
        match c.send.try_send_request(req).await {
            Ok(resp) => return read(t, conn, resp).await,
            Err(mut e) => {
                *conn = None;
                match e.take_message() {
                    Some(unsent) if !fresh => req = unsent,
                    _ => {
                        return Err(HttpError::Send {
                            url: t.url.to_string(),
                            error: e.into_error(),
                        });
                    }
                }
            }
        }
    }
}

/// Reads the response to its end, so the connection can carry the next request (past
/// `BODY_DRAIN_MAX` the connection is dropped instead).
async fn read(
    t: &Target,
    conn: &mut Option<Conn>,
    resp: Response<Incoming>,
) -> Result<Reply, HttpError> {
    let status = resp.status();
    let phrase = resp
        .extensions()
        .get::<hyper::ext::ReasonPhrase>()
        .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
        .or_else(|| status.canonical_reason().map(str::to_string))
        .unwrap_or_default();
    let status_line = format!("{:?} {} {phrase}", resp.version(), status.as_u16());
    let retry_after = resp
        .headers()
        .get(hyper::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = resp.into_body();
    let mut kept = Vec::new();
    let mut read = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| HttpError::Body {
            url: t.url.to_string(),
            status_line: status_line.clone(),
            error,
        })?;
        if let Ok(data) = frame.into_data() {
            let room = RESPONSE_KEPT.saturating_sub(kept.len());
            kept.extend_from_slice(&data[..data.len().min(room)]);
            read += data.len();
            if read > BODY_DRAIN_MAX {
                *conn = None;
                break;
            }
        }
    }
    Ok(Reply {
        status,
        status_line,
        retry_after,
        body: kept,
    })
}

async fn connect(t: &Target, tls: Option<&TlsConnector>) -> Result<Conn, HttpError> {
    let tcp = TcpStream::connect((t.url.host.as_str(), t.url.port))
        .await
        .map_err(|error| HttpError::Connect {
            url: t.url.to_string(),
            error,
        })?;
    // Each request is written whole; Nagle would only hold its tail back.
    let _ = tcp.set_nodelay(true);
    tracing::debug!(url = %t.url, "http sink connected");
    let Some(tls) = tls else {
        return handshake(tcp).await;
    };
    let name = pki_types::ServerName::try_from(t.url.host.clone()).map_err(|error| {
        HttpError::ServerName {
            url: t.url.to_string(),
            error,
        }
    })?;
    let stream = tls
        .connect(name, tcp)
        .await
        .map_err(|error| HttpError::TlsHandshake {
            url: t.url.to_string(),
            error,
        })?;
    handshake(stream).await
}

/// Starts HTTP/1.1 on `io` and spawns the task that drives it.
async fn handshake<S>(io: S) -> Result<Conn, HttpError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = http1::handshake(Io(io))
        .await
        .map_err(HttpError::Handshake)?;
    let task = tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %chain(&e), "http sink connection ended");
        }
    });
    Ok(Conn {
        send,
        task: Some(task),
    })
}

/// A verifying TLS client trusting exactly the certificates in `ca_file`, or without it the
/// operating system's store, on the provider of `crate::tls` (ring), presenting the client
/// certificate if there is one.
fn tls_connector(
    ca_file: Option<&Path>,
    identity: Option<&(PathBuf, PathBuf)>,
) -> Result<TlsConnector, HttpError> {
    let identity = identity.map(|(cert, key)| {
        [
            (cert.as_path(), "client_cert_file"),
            (key.as_path(), "client_key_file"),
        ]
    });
    let roots = match ca_file {
        Some(ca) => crate::tls::roots(ca, "ca_file")?,
        None => crate::tls::system_roots()?,
    };
    let mut cfg = crate::tls::client_trusting(roots, identity)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(cfg)))
}

/// An error and its causes on one line (hyper's own message is terse: "connection error").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::envelope;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// 1994-11-06T08:49:37Z, RFC 9110's example instant.
    const EXAMPLE: u64 = 784_111_777;

    #[test]
    fn retry_after_delta_seconds_is_a_wait() {
        assert_eq!(retry_after("1", at(0)), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(" 120 ", at(0)), Some(Duration::from_secs(120)));
        assert_eq!(retry_after("0", at(0)), Some(Duration::ZERO));
        assert_eq!(
            retry_after("99999999999999999999999", at(0)),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(retry_after("7200", at(0)), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn retry_after_http_date_in_all_three_forms_is_a_wait_from_now() {
        let now = at(EXAMPLE - 30);
        for v in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(retry_after(v, now), Some(Duration::from_secs(30)), "{v}");
        }
        assert_eq!(
            retry_after("Sun, 06 Nov 1994 08:49:37 GMT", at(EXAMPLE + 5)),
            Some(Duration::ZERO),
            "a date in the past is no wait"
        );
        assert_eq!(
            retry_after("Thu, 01 Jan 2026 00:00:00 GMT", at(1_767_225_600 - 7)),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after("Sat, 01 Jan 2000 00:00:00 GMT", at(0)),
            Some(MAX_RETRY_AFTER)
        );
    }

    #[test]
    fn rfc850_two_digit_years_are_never_more_than_fifty_years_ahead() {
        // In 2026, "30" is 2030 and "94" is 1994.
        let now = 1_780_000_000; // 2026
        assert_eq!(
            http_date("Tuesday, 01-Jan-30 00:00:00 GMT", now),
            Some(1_893_456_000)
        );
        assert_eq!(
            http_date("Sunday, 06-Nov-94 08:49:37 GMT", now),
            Some(EXAMPLE)
        );
    }

    #[test]
    fn retry_after_garbage_is_ignored() {
        for v in [
            "",
            "-1",
            "1.5",
            "soon",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 31 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun 06 Nov 1994 08:49:37 GMT",
            "Sun Nov 6 08:49:37 1994",
            "Sun Nov  06 08:49:37 1994",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
        ] {
            assert_eq!(retry_after(v, at(EXAMPLE)), None, "{v:?}");
        }
    }

    #[test]
    fn sf_string_quotes_and_escapes() {
        assert_eq!(sf_string("ab12.ef").unwrap(), r#""ab12.ef""#);
        assert_eq!(sf_string("").unwrap(), r#""""#);
        assert_eq!(sf_string(r#"a"b\c"#).unwrap(), r#""a\"b\\c""#);
        assert_eq!(sf_string(" ~").unwrap(), "\" ~\"");
    }

    #[test]
    fn sf_string_refuses_what_it_cannot_carry() {
        for bad in ["a\tb", "a\nb", "\u{7f}", "\u{0}", "é", "日本"] {
            assert!(sf_string(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_event_id_is_a_valid_header_value() {
        let id = format!("{}.{}", "ab".repeat(32), "0123456789abcdef");
        let v = sf_string(&id).unwrap();
        assert!(HeaderValue::from_str(&v).is_ok());
        assert_eq!(v.len(), id.len() + 2);
    }

    #[test]
    fn the_request_says_cloudevents_structured_mode() {
        assert!(EVENT_MEDIA_TYPE.starts_with(envelope::CONTENT_TYPE));
    }

    #[test]
    fn status_classes() {
        let table: &[(u16, Class)] = &[
            (200, Class::Delivered),
            (201, Class::Delivered),
            (202, Class::Delivered),
            (204, Class::Delivered),
            (299, Class::Delivered),
            (301, Class::Poison),
            (302, Class::Poison),
            (304, Class::Poison),
            (307, Class::Poison),
            (308, Class::Poison),
            (400, Class::Poison),
            (401, Class::Poison),
            (403, Class::Poison),
            (404, Class::Poison),
            (405, Class::Poison),
            (408, Class::Retry),
            (409, Class::Retry),
            (410, Class::Poison),
            (413, Class::Poison),
            (415, Class::Poison),
            (422, Class::Poison),
            (425, Class::Retry),
            (429, Class::Retry),
            (451, Class::Poison),
            (499, Class::Poison),
            (500, Class::Retry),
            (502, Class::Retry),
            (503, Class::Retry),
            (504, Class::Retry),
            (599, Class::Retry),
            (100, Class::Retry),
            (101, Class::Retry),
            (600, Class::Retry),
            (999, Class::Retry),
        ];
        for (code, class) in table {
            assert_eq!(classify(*code), *class, "{code}");
        }
    }

    fn ev(offset: u64, source: &str) -> Event {
        Event::for_test(offset, source)
    }

    fn started(l: &mut Lanes) -> Vec<u64> {
        std::iter::from_fn(|| l.start())
            .map(|(n, e)| {
                assert_eq!(n, e.offset, "events are numbered as handed over");
                n
            })
            .collect()
    }

    #[test]
    fn an_echoed_authorization_value_or_query_is_masked_even_cut_short() {
        let s = Secrets::of(Some("Bearer tok-5d2e-91ab"), Some("key=qs-secret-77&v=1"));
        assert_eq!(
            s.mask(
                "401\nyou sent Authorization: Bearer tok-5d2e-91ab to /cop?key=qs-secret-77&v=1"
            ),
            "401\nyou sent Authorization: <redacted> to /cop?<redacted>"
        );
        assert_eq!(
            s.mask("token tok-5d2e-91ab unknown"),
            "token <redacted> unknown"
        );
        assert_eq!(s.mask("key qs-secret-77 expired"), "key <redacted> expired");
        // A body cut by the bound inside the token: its beginning goes too.
        assert_eq!(s.mask("got Bearer tok-5d2"), "got <redacted>");
        // Short values ("1") mask nothing; text without a secret is unchanged.
        assert_eq!(s.mask("v=1, 1 event refused"), "v=1, 1 event refused");
        assert_eq!(Secrets::of(None, None).mask("Bearer x"), "Bearer x");
    }

    fn poison() -> Failure {
        Failure::Poison {
            reason: "HTTP 422".into(),
            response: String::new(),
        }
    }

    #[test]
    fn lanes_start_up_to_max_never_two_of_a_source_and_report_the_delivered_prefix() {
        let mut l = Lanes::new(3);
        for (i, s) in ["a", "a", "b", "c", "d"].iter().enumerate() {
            l.hand(ev(i as u64, s));
        }
        // 1 waits for 0 (same source); 2 and 3 fill the three lanes.
        assert_eq!(started(&mut l), [0, 2, 3]);
        l.finished(2, Ok(()));
        // Delivered out of order: nothing to report until the front is.
        assert!(l.report().is_none());
        assert_eq!(started(&mut l), [4]);
        l.finished(0, Ok(()));
        let a = l.report().unwrap();
        assert_eq!((a.delivered, a.failure.is_none()), (1, true));
        // Source a is free again: 1 starts; the front is now 1.
        assert_eq!(started(&mut l), [1]);
        l.finished(1, Ok(()));
        assert_eq!(l.report().unwrap().delivered, 2, "1 and the earlier 2");
        // More handed over behind those in flight: the window stays full across batches.
        l.hand(ev(5, "e"));
        assert_eq!(started(&mut l), [5]);
        l.finished(3, Ok(()));
        l.finished(4, Ok(()));
        l.finished(5, Ok(()));
        assert_eq!(l.report().unwrap().delivered, 3);
        assert!(l.is_empty());
    }

    #[test]
    fn a_failure_is_reported_once_no_request_is_in_flight_and_then_all_is_forgotten() {
        let mut l = Lanes::new(4);
        for (i, s) in ["a", "b", "c", "d", "e", "c"].iter().enumerate() {
            l.hand(ev(i as u64, s));
        }
        assert_eq!(started(&mut l), [0, 1, 2, 3]);
        l.finished(2, Err(poison()));
        // Nothing at or after the failed event starts, though a lane is free.
        assert!(started(&mut l).is_empty());
        assert!(l.report().is_none(), "0 and 1 are still in flight");
        l.finished(1, Ok(()));
        l.finished(0, Ok(()));
        let a = l.report().unwrap();
        assert_eq!((a.delivered, a.failure.is_none()), (2, true));
        // 3 is still in flight: the failure waits for it.
        assert!(l.report().is_none());
        l.finished(3, Ok(()));
        let a = l.report().unwrap();
        assert_eq!(a.delivered, 0);
        assert!(matches!(a.failure, Some(Failure::Poison { .. })));
        assert!(
            l.is_empty(),
            "3 (delivered after the failure) is handed over again"
        );
        // Numbering goes on.
        l.hand(ev(6, "a"));
        assert_eq!(l.start().map(|(n, _)| n), Some(6));
        assert!(l.report().is_none());
    }

    #[test]
    fn a_forgotten_events_request_keeps_its_source_busy_and_its_lane_until_it_ends() {
        let mut l = Lanes::new(2);
        l.hand(ev(0, "a"));
        l.hand(ev(1, "b"));
        assert_eq!(started(&mut l), [0, 1]);
        // An operator moved the cursor: the window is forgotten with 0 and 1 in flight.
        l.forget();
        assert!(l.is_empty());
        l.hand(ev(2, "a"));
        l.hand(ev(3, "c"));
        // The receiver may still be working on 0 (source a) and 1: nothing starts.
        assert!(started(&mut l).is_empty());
        l.finished(1, Ok(()));
        assert_eq!(started(&mut l), [3], "a lane is free, source a is not");
        assert!(l.report().is_none(), "what 1 came to is not reported");
        l.finished(0, Err(poison()));
        assert!(l.report().is_none(), "nor what 0 came to");
        assert_eq!(started(&mut l), [2]);
        l.finished(2, Ok(()));
        l.finished(3, Ok(()));
        let a = l.report().unwrap();
        assert_eq!((a.delivered, a.failure.is_none()), (2, true));
        // Cut off (the sink closes): nothing stays busy.
        l.hand(ev(4, "a"));
        assert_eq!(started(&mut l), [4]);
        l.abort();
        l.hand(ev(5, "a"));
        assert_eq!(started(&mut l), [5]);
    }

    #[test]
    fn a_failure_at_the_front_is_reported_at_once() {
        let mut l = Lanes::new(1);
        l.hand(ev(0, "a"));
        l.hand(ev(1, "b"));
        assert_eq!(started(&mut l), [0], "one lane");
        l.finished(
            0,
            Err(Failure::Retry {
                error: "503".into(),
                after: None,
            }),
        );
        let a = l.report().unwrap();
        assert_eq!(a.delivered, 0);
        assert!(matches!(a.failure, Some(Failure::Retry { .. })));
        assert!(l.is_empty());
    }
}
