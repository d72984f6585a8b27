//! Publishing at QoS 1 for the relay's `mqtt` sink: one connection, many publishes in flight,
//! and the acknowledged prefix reported in order. Messages are handed over (`Publisher::hand`)
//! while earlier ones are in flight, so the window stays full across the relay's batches;
//! what is in flight is tracked sans-IO (`Flight`).
//!
//! A connection lives only as long as it is healthy. On any error (a lost connection, a
//! timeout, a DISCONNECT from the broker, an attempt that ends with publishes still in flight)
//! the client and its event loop are dropped whole and the next attempt connects afresh, with
//! a clean session: the caller re-publishes everything not acknowledged, so no broker session
//! and no rumqttc retransmission state is needed. This keeps us clear of rumqttc #1056 (a
//! publish stashed on a packet-id collision is never retransmitted once the session is lost,
//! and the event loop stops taking requests for good): a dropped event loop takes its stash
//! with it, and we never have more publishes in flight than the broker's receive maximum, so
//! rumqttc's packet ids never collide in the first place.
//!
//! Packet ids are matched to messages by order: rumqttc's event loop takes requests in the
//! order they were queued and reports each as `Outgoing::Publish(pkid)` before its PUBACK
//! can arrive. rumqttc only logs an MQTT 5 PUBACK's failure reason code; the code is read
//! here from `Incoming::PubAck`.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use rumqttc::v5;
use rumqttc::v5::mqttbytes::v5::{PubAckReason, PublishProperties};
use tokio::sync::mpsc;

use super::{Endpoint, TransportError};
use crate::config::{MqttSink, Protocol};
// The CloudEvents structured-mode content type, sent as an MQTT 5 property.
use crate::relay::envelope::CONTENT_TYPE;

/// Most publishes in flight on one connection (less if the broker's receive maximum is less).
const WINDOW_MAX: u16 = 512;
/// The largest packet MQTT can express (remaining length 268,435,455 + 5 header bytes).
const MQTT_MAX_PACKET: usize = 268_435_460;
/// Largest packet we accept from the broker: we only read acknowledgements.
const MAX_INCOMING: u32 = 64 * 1024;
/// How long `close` waits for the DISCONNECT to leave.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// Why publishing stopped before the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishError {
    /// An MQTT 5 PUBACK with a failure reason code (>= 0x80) for this message.
    Refused {
        code: u8,
        name: &'static str,
        reason_string: Option<String>,
    },
    /// The packet exceeds the broker's maximum packet size (MQTT 5 CONNACK).
    TooLarge { size: usize, max: u32 },
    /// No connection, a lost connection, a refused CONNECT, a DISCONNECT from the broker.
    Connection(String),
    /// The attempt took longer than its limit.
    Timeout(Duration),
}

impl std::fmt::Display for PublishError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PublishError::Refused {
                code,
                name,
                reason_string,
            } => {
                write!(f, "PUBACK reason code 0x{code:02X} ({name})")?;
                if let Some(r) = reason_string {
                    write!(f, ": {r}")?;
                }
                Ok(())
            }
            PublishError::TooLarge { size, max } => write!(
                f,
                "the PUBLISH packet is {size} bytes, above the broker's maximum packet size of \
                 {max} bytes"
            ),
            PublishError::Connection(e) => f.write_str(e),
            PublishError::Timeout(d) => write!(
                f,
                "not every PUBACK arrived within {} ms (the connection is dropped)",
                d.as_millis()
            ),
        }
    }
}

/// What one `progress` call found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// How many more messages, from the front of those pending, the broker acknowledged
    /// (successfully).
    pub acked: usize,
    /// Why the message after them was not; then nothing handed over is pending any more.
    pub failure: Option<PublishError>,
}

/// The reason code of a failed MQTT 5 PUBACK and its name, `None` for success.
pub fn puback_failure(reason: &PubAckReason) -> Option<(u8, &'static str)> {
    use PubAckReason as R;
    match reason {
        R::Success | R::NoMatchingSubscribers => None,
        R::UnspecifiedError => Some((0x80, "unspecified error")),
        R::ImplementationSpecificError => Some((0x83, "implementation specific error")),
        R::NotAuthorized => Some((0x87, "not authorized")),
        R::TopicNameInvalid => Some((0x90, "topic name invalid")),
        R::PacketIdentifierInUse => Some((0x91, "packet identifier in use")),
        R::QuotaExceeded => Some((0x97, "quota exceeded")),
        R::PayloadFormatInvalid => Some((0x99, "payload format invalid")),
    }
}

/// Why `topic` is not a valid MQTT topic name to publish to, if it is not.
pub fn topic_name_problem(topic: &str) -> Option<&'static str> {
    if topic.is_empty() {
        Some("is empty")
    } else if topic.len() > usize::from(u16::MAX) {
        Some("is longer than 65535 bytes")
    } else if topic.contains(['+', '#']) {
        Some("holds a wildcard ('+' or '#')")
    } else if topic.contains('\0') {
        Some("holds a NUL character")
    } else {
        None
    }
}

/// The size of our MQTT 5 PUBLISH packet (QoS 1, with the two properties we set).
fn packet_size_v5(topic: usize, payload: usize) -> usize {
    // payload format indicator: id + byte; content type: id + length + text.
    let properties = 2 + 1 + 2 + CONTENT_TYPE.len();
    let remaining = 2 + topic + 2 + varint_len(properties) + properties + payload;
    1 + varint_len(remaining) + remaining
}

fn varint_len(n: usize) -> usize {
    match n {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

enum Client {
    V311(rumqttc::AsyncClient),
    V5(v5::AsyncClient),
}

/// What the event loop task reports.
#[derive(Debug)]
enum Report {
    Connected {
        receive_max: Option<u16>,
        max_packet: Option<u32>,
    },
    /// A queued publish went out with this packet id (in queue order).
    Sent(u16),
    /// A PUBACK; `refused` for an MQTT 5 failure reason code.
    Acked {
        pkid: u16,
        refused: Option<PublishError>,
    },
    Lost(String),
}

/// One live connection: the client, and its event loop polled by a task of its own (so that
/// keep-alive pings go out between batches). Dropping it aborts the task, which drops the
/// event loop and its socket.
struct Connection {
    client: Client,
    reports: mpsc::UnboundedReceiver<Report>,
    task: tokio::task::JoinHandle<()>,
    /// Most publishes in flight at once.
    window: usize,
    /// The broker's maximum packet size (MQTT 5 only).
    max_packet: Option<u32>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A QoS 1 publisher to one broker, connected lazily. Messages are handed over (`hand`) and
/// published behind those in flight, up to the window; `progress` reports how many more were
/// acknowledged from the front, so the caller can keep the window full across its batches.
pub struct Publisher {
    sink: MqttSink,
    conn: Option<Connection>,
    /// The messages handed over and not yet reported.
    flight: Flight,
    /// Most publishes in flight on the current connection (grows by one per PUBACK up to
    /// the connection's window after a cautious start).
    window: usize,
    /// When the message at the front of `flight` started waiting: it must be acknowledged
    /// within the limit of `progress` from then, or the connection is dropped.
    since: Instant,
    /// The last message the broker refused (a PUBACK failure code), by digest. Some brokers
    /// (Mosquitto 2.0) close the connection right after such a PUBACK, and the PUBACKs of
    /// the messages before it can be lost with the connection: when the refused message comes
    /// round again it is reported at once, not sent into the same close again. Forgotten once
    /// everything handed over after it was acknowledged.
    refused: Option<(u64, PublishError)>,
    /// The last failure was a lost connection or a timeout: the next connection starts with
    /// one message in flight and widens the window by one per PUBACK, so a message that makes
    /// the broker close the connection takes few acknowledgements of others with it.
    cautious: bool,
    /// A connection being made.
    connecting: Option<Connecting>,
}

/// A connection being made, on a task of its own: a `progress` call cancelled meanwhile
/// finds it again, so no connection is abandoned half made.
type Connecting = tokio::task::JoinHandle<Result<Connection, TransportError>>;

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(c) = &self.connecting {
            c.abort();
        }
    }
}

/// A message handed over and not yet reported.
struct Slot {
    /// Topic and payload until queued to the client.
    message: Option<(String, Vec<u8>)>,
    digest: u64,
    acked: bool,
}

/// The messages handed to a `Publisher` and not yet reported, in order, sans-IO: which are
/// queued to the client, the packet id each went out with, which the broker acknowledged, and
/// the first failure. Messages are numbered in the order handed over; `base` is the number of
/// the first one not yet reported. Only the acknowledged prefix is ever reported: a PUBACK out
/// of order waits for the ones before it.
#[derive(Default)]
struct Flight {
    slots: VecDeque<Slot>,
    base: u64,
    /// The number of the next message to queue.
    next: u64,
    /// Queued, waiting for their packet id (in queue order).
    unsent: VecDeque<u64>,
    by_pkid: HashMap<u16, u64>,
    /// Queued and not yet acknowledged.
    in_flight: usize,
    /// The lowest-numbered failure: nothing at or after it is queued.
    failure: Option<(u64, PublishError)>,
}

impl Flight {
    /// Messages handed over and not yet reported.
    fn pending(&self) -> usize {
        self.slots.len()
    }

    /// Hands a message over; returns its number.
    fn push(&mut self, topic: String, payload: Vec<u8>, digest: u64) -> u64 {
        self.slots.push_back(Slot {
            message: Some((topic, payload)),
            digest,
            acked: false,
        });
        self.base + self.slots.len() as u64 - 1
    }

    fn fail(&mut self, at: u64, e: PublishError) {
        if self.failure.as_ref().is_none_or(|(i, _)| at < *i) {
            self.failure = Some((at, e));
        }
    }

    /// The next message to queue while fewer than `window` are in flight and no failure
    /// stops it: its number and the sizes of its topic and payload.
    fn peek(&self, window: usize) -> Option<(u64, usize, usize)> {
        if self.in_flight >= window || self.failure.as_ref().is_some_and(|(i, _)| *i <= self.next) {
            return None;
        }
        let slot = self
            .slots
            .get(usize::try_from(self.next - self.base).ok()?)?;
        let (topic, payload) = slot.message.as_ref()?;
        Some((self.next, topic.len(), payload.len()))
    }

    /// Takes the message `peek` named, to queue it.
    fn take_next(&mut self) -> Option<(String, Vec<u8>)> {
        let k = usize::try_from(self.next - self.base).ok()?;
        let m = self.slots.get_mut(k)?.message.take()?;
        self.unsent.push_back(self.next);
        self.in_flight += 1;
        self.next += 1;
        Some(m)
    }

    /// A queued message went out with `pkid` (in queue order).
    fn sent(&mut self, pkid: u16) {
        if let Some(n) = self.unsent.pop_front() {
            self.by_pkid.insert(pkid, n);
        }
    }

    /// The first message handed over and not acknowledged.
    fn first_unacked(&self) -> u64 {
        self.base + self.slots.iter().take_while(|s| s.acked).count() as u64
    }

    /// A PUBACK for `pkid`; a refusal returns the refused message's digest.
    fn acked(&mut self, pkid: u16, refused: Option<PublishError>) -> Option<u64> {
        let Some(n) = self.by_pkid.remove(&pkid) else {
            let at = self.first_unacked();
            self.fail(
                at,
                PublishError::Connection(format!(
                    "the broker acknowledged packet id {pkid}, which is not in flight"
                )),
            );
            return None;
        };
        self.in_flight -= 1;
        let k = usize::try_from(n - self.base).ok()?;
        match refused {
            None => {
                if let Some(s) = self.slots.get_mut(k) {
                    s.acked = true;
                }
                None
            }
            Some(e) => {
                self.fail(n, e);
                self.slots.get(k).map(|s| s.digest)
            }
        }
    }

    /// The connection ended: the first message not acknowledged (if any) fails with `e`.
    fn lost(&mut self, e: PublishError) {
        let at = self.first_unacked();
        if at < self.base + self.slots.len() as u64 {
            self.fail(at, e);
        }
    }

    /// What is new at the front: how many more were acknowledged, and the failure of the next
    /// one once the acknowledged prefix reached it (then nothing handed over is pending any
    /// more: what follows the failure is handed over again by the caller). `None`: nothing.
    fn take_progress(&mut self) -> Option<Published> {
        let mut acked = 0;
        while self.slots.front().is_some_and(|s| s.acked) {
            self.slots.pop_front();
            self.base += 1;
            acked += 1;
        }
        if self
            .failure
            .as_ref()
            .is_some_and(|(at, _)| *at <= self.base)
        {
            let failure = self.failure.take().map(|(_, e)| e);
            return Some(Published { acked, failure });
        }
        (acked > 0).then_some(Published {
            acked,
            failure: None,
        })
    }

    /// Forgets everything handed over (the numbering goes on).
    fn clear(&mut self) {
        self.base += self.slots.len() as u64;
        self.next = self.base;
        self.slots.clear();
        self.unsent.clear();
        self.by_pkid.clear();
        self.in_flight = 0;
        self.failure = None;
    }
}

impl Publisher {
    /// No I/O yet: the first `progress` connects.
    pub fn new(sink: &MqttSink) -> Publisher {
        Publisher {
            sink: sink.clone(),
            conn: None,
            flight: Flight::default(),
            window: 1,
            since: Instant::now(),
            refused: None,
            cautious: false,
            connecting: None,
        }
    }

    /// Messages handed over and not yet reported by `progress`.
    pub fn pending(&self) -> usize {
        self.flight.pending()
    }

    /// Hands a message over, to be published at QoS 1, retain false, after those handed
    /// before it (sent by `progress`, as the window allows).
    pub fn hand(&mut self, topic: String, payload: Vec<u8>) {
        let digest = message_digest(&topic, &payload);
        if self.flight.pending() == 0 {
            self.since = Instant::now();
        }
        let n = self.flight.push(topic, payload, digest);
        if self.refused.as_ref().is_some_and(|(d, _)| *d == digest)
            && let Some((_, e)) = self.refused.take()
        {
            self.flight.fail(n, e);
        }
    }

    /// Forgets everything handed over; a connection with publishes still in flight is dropped
    /// (their late PUBACKs must never be matched against messages handed over later).
    pub fn forget(&mut self) {
        if self.flight.in_flight > 0 {
            self.conn = None;
        }
        self.flight.clear();
    }

    /// Publishes what was handed over, pipelined up to the broker's receive maximum, until
    /// more of it is acknowledged from the front or a failure: returns how many more were
    /// acknowledged and, on a failure, what stopped the one after them (everything handed over
    /// is then forgotten: the caller hands the rest over again). Connects first if needed.
    /// The message at the front must be acknowledged within `limit` of its turn. Cancel-safe:
    /// a call dropped mid-way loses nothing; the next one goes on.
    pub async fn progress(&mut self, limit: Duration) -> Published {
        if self.flight.pending() == 0 {
            return Published {
                acked: 0,
                failure: None,
            };
        }
        let deadline = tokio::time::Instant::from_std(self.since + limit);
        if self.flight.in_flight == 0 {
            self.drop_if_lost();
        }
        if self.conn.is_none() {
            let at = self.flight.base;
            let connecting = self
                .connecting
                .get_or_insert_with(|| tokio::spawn(Publisher::connect(self.sink.clone())));
            let made = match tokio::time::timeout_at(deadline, connecting).await {
                Ok(Ok(made)) => Ok(made),
                Ok(Err(e)) => Ok(Err(TransportError::Connect {
                    broker: self.sink.broker.to_string(),
                    why: format!("the connecting task failed: {e}"),
                })),
                Err(elapsed) => {
                    if let Some(c) = &self.connecting {
                        c.abort();
                    }
                    Err(elapsed)
                }
            };
            self.connecting = None;
            match made {
                Ok(Ok(c)) => {
                    self.window = if std::mem::take(&mut self.cautious) {
                        1
                    } else {
                        c.window
                    };
                    self.conn = Some(c);
                }
                Ok(Err(e)) => self
                    .flight
                    .fail(at, PublishError::Connection(e.to_string())),
                Err(_) => self.flight.fail(at, PublishError::Timeout(limit)),
            }
        }
        loop {
            self.fill();
            if let Some(out) = self.flight.take_progress() {
                return self.report(out);
            }
            let at = self.flight.first_unacked();
            let Some(conn) = self.conn.as_mut() else {
                self.flight
                    .fail(at, PublishError::Connection("not connected".into()));
                continue;
            };
            let mut lost = false;
            tokio::select! {
                // Reports already queued win over a deadline that passed meanwhile (the
                // caller may have been busy elsewhere): acknowledged is not timed out.
                biased;
                r = conn.reports.recv() => match r {
                    Some(r) => {
                        lost |= handle(&mut self.flight, &mut self.refused, &mut self.window, conn.window, r);
                        // Whatever else has arrived, before reporting.
                        while let Ok(r) = conn.reports.try_recv() {
                            lost |= handle(&mut self.flight, &mut self.refused, &mut self.window, conn.window, r);
                        }
                    }
                    None => {
                        self.flight.lost(PublishError::Connection("the connection task ended".into()));
                        lost = true;
                    }
                },
                () = tokio::time::sleep_until(deadline) => self.flight.fail(at, PublishError::Timeout(limit)),
            }
            if lost {
                // Never used again: what it left unacknowledged has failed above.
                self.conn = None;
            }
        }
    }

    /// Queues to the client what the window allows.
    fn fill(&mut self) {
        let Some(conn) = self.conn.as_ref() else {
            return;
        };
        while let Some((n, topic, payload)) = self.flight.peek(self.window) {
            if let Some(max) = conn.max_packet {
                let size = packet_size_v5(topic, payload);
                if size > max as usize {
                    self.flight.fail(n, PublishError::TooLarge { size, max });
                    return;
                }
            }
            let Some((topic, payload)) = self.flight.take_next() else {
                return;
            };
            if let Err(e) = queue(&conn.client, &topic, payload) {
                self.flight.fail(n, PublishError::Connection(e.to_string()));
                return;
            }
        }
    }

    /// Follows what `progress` reports: after a failure the connection is kept only if
    /// nothing is left in flight on it and it did not fail.
    fn report(&mut self, out: Published) -> Published {
        match &out.failure {
            Some(e) => {
                let healthy = matches!(
                    e,
                    PublishError::Refused { .. } | PublishError::TooLarge { .. }
                );
                if self.flight.in_flight > 0 || !healthy {
                    self.conn = None;
                }
                // What follows the failure is handed over again.
                self.flight.clear();
                self.cautious = !healthy;
            }
            None => {
                self.since = Instant::now();
                if self.flight.pending() == 0 {
                    self.refused = None;
                }
            }
        }
        out
    }

    /// Forgets a connection that broke while idle.
    fn drop_if_lost(&mut self) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        loop {
            match conn.reports.try_recv() {
                Ok(Report::Lost(e)) => {
                    tracing::debug!(broker = %self.sink.broker, error = %e, "idle sink connection lost; reconnecting");
                    self.conn = None;
                    return;
                }
                Ok(_) => {}
                Err(mpsc::error::TryRecvError::Empty) => return,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    self.conn = None;
                    return;
                }
            }
        }
    }

    /// Connects (a future of its own, kept across cancelled `progress` calls).
    async fn connect(sink: MqttSink) -> Result<Connection, TransportError> {
        let s = &sink;
        let endpoint = Endpoint {
            broker: &s.broker,
            client_id: &s.client_id,
            keep_alive: s.keep_alive,
            credentials: s.credentials.as_ref(),
            tls: s.tls.as_ref(),
            section: "[[sink]]",
        };
        // Room for a whole window and the DISCONNECT: `try_publish` never finds it full.
        let cap = usize::from(WINDOW_MAX) + 8;
        let (tx, mut reports) = mpsc::unbounded_channel();
        let (client, task) = match s.protocol {
            Protocol::V5 => {
                let mut o = endpoint.options_v5()?;
                o.set_clean_start(true)
                    .set_outgoing_inflight_upper_limit(WINDOW_MAX)
                    .set_max_packet_size(Some(MAX_INCOMING))
                    .set_request_channel_capacity(cap);
                let (c, l) = v5::AsyncClient::new(o, cap);
                (Client::V5(c), tokio::spawn(poll_v5(l, tx)))
            }
            Protocol::V311 => {
                let mut o = endpoint.options_v311()?;
                o.set_clean_session(true)
                    .set_inflight(WINDOW_MAX)
                    .set_max_packet_size(MAX_INCOMING as usize, MQTT_MAX_PACKET)
                    .set_request_channel_capacity(cap);
                let (c, l) = rumqttc::AsyncClient::new(o, cap);
                (Client::V311(c), tokio::spawn(poll_v311(l, tx)))
            }
        };
        let mut conn = Connection {
            client,
            reports: mpsc::unbounded_channel().1,
            task,
            window: usize::from(WINDOW_MAX),
            max_packet: None,
        };
        match reports.recv().await {
            Some(Report::Connected {
                receive_max,
                max_packet,
            }) => {
                let broker_max = receive_max.unwrap_or(u16::MAX).max(1);
                conn.window = usize::from(broker_max.min(WINDOW_MAX));
                conn.max_packet = max_packet;
                conn.reports = reports;
                tracing::debug!(broker = %s.broker, window = conn.window, "sink connected");
                Ok(conn)
            }
            Some(Report::Lost(why)) => Err(TransportError::Connect {
                broker: s.broker.to_string(),
                why,
            }),
            _ => Err(TransportError::NoConnAck {
                broker: s.broker.to_string(),
            }),
        }
    }

    /// Sends DISCONNECT and waits a moment for it to leave; the next `publish` reconnects.
    pub async fn close(&mut self) {
        self.flight.clear();
        if let Some(c) = self.connecting.take() {
            c.abort();
        }
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let queued = match &conn.client {
            Client::V5(c) => c.try_disconnect().is_ok(),
            Client::V311(c) => c.try_disconnect().is_ok(),
        };
        if queued {
            let _ = tokio::time::timeout(CLOSE_WAIT, &mut conn.task).await;
        }
    }
}

fn message_digest(topic: &str, payload: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    topic.hash(&mut h);
    payload.hash(&mut h);
    h.finish()
}

/// Follows one report of the connection's task; `true` when the connection is over.
fn handle(
    flight: &mut Flight,
    refused: &mut Option<(u64, PublishError)>,
    window: &mut usize,
    max_window: usize,
    report: Report,
) -> bool {
    match report {
        Report::Sent(pkid) => flight.sent(pkid),
        Report::Acked { pkid, refused: r } => {
            // Slow start after a loss: the window doubles per round trip.
            *window = (*window + 1).min(max_window);
            let e = r.clone();
            if let (Some(digest), Some(e)) = (flight.acked(pkid, r), e) {
                *refused = Some((digest, e));
            }
        }
        Report::Lost(e) => {
            flight.lost(PublishError::Connection(e));
            return true;
        }
        Report::Connected { .. } => {}
    }
    false
}

fn queue(client: &Client, topic: &str, payload: Vec<u8>) -> Result<(), TransportError> {
    match client {
        Client::V5(c) => c
            .try_publish_with_properties(
                topic,
                v5::mqttbytes::QoS::AtLeastOnce,
                false,
                payload,
                PublishProperties {
                    payload_format_indicator: Some(1),
                    content_type: Some(CONTENT_TYPE.to_string()),
                    ..PublishProperties::default()
                },
            )
            .map_err(|e| TransportError::Queue(e.to_string())),
        Client::V311(c) => c
            .try_publish(topic, rumqttc::QoS::AtLeastOnce, false, payload)
            .map_err(|e| TransportError::Queue(e.to_string())),
    }
}

/// Polls an MQTT 5 event loop until its first error (the event loop never reconnects: it is
/// dropped with this task) or until nobody listens.
async fn poll_v5(mut l: v5::EventLoop, tx: mpsc::UnboundedSender<Report>) {
    loop {
        match l.poll().await {
            Ok(event) => {
                if !forward(report_v5(event), &tx) {
                    return;
                }
            }
            Err(e) => {
                let left = l.state.events.drain(..).map(report_v5);
                lost(left, e.to_string(), &tx);
                return;
            }
        }
    }
}

/// Polls an MQTT 3.1.1 event loop, as `poll_v5`.
async fn poll_v311(mut l: rumqttc::EventLoop, tx: mpsc::UnboundedSender<Report>) {
    loop {
        match l.poll().await {
            Ok(event) => {
                if !forward(report_v311(event), &tx) {
                    return;
                }
            }
            Err(e) => {
                let left = l.state.events.drain(..).map(report_v311);
                lost(left, e.to_string(), &tx);
                return;
            }
        }
    }
}

/// Sends `report` on; false once the connection is over (a `Lost`) or nobody listens.
fn forward(report: Option<Report>, tx: &mpsc::UnboundedSender<Report>) -> bool {
    let Some(report) = report else {
        return true;
    };
    let lost = matches!(report, Report::Lost(_));
    tx.send(report).is_ok() && !lost
}

/// Ends the connection's reports after rumqttc's `poll` failed. rumqttc reads packets in
/// bunches and queues an event for each before handling it; when the bunch ends in an error
/// (the end of the connection read with the PUBACKs before it, or a DISCONNECT, which rumqttc
/// turns into an error) `poll` returns only the error, and the PUBACKs stay in the event loop's
/// queue. They are genuine acknowledgements of this connection's publishes, so they are
/// reported first, in the order read: a refusal must not be lost with the connection (the
/// broker answers the same publish the same way and closes again), nor an acknowledgement
/// (its message would be published twice). A CONNACK among them is one rumqttc refused.
fn lost(
    left: impl Iterator<Item = Option<Report>>,
    error: String,
    tx: &mpsc::UnboundedSender<Report>,
) {
    for report in left {
        let report = report.filter(|r| !matches!(r, Report::Connected { .. }));
        if !forward(report, tx) {
            return;
        }
    }
    let _ = tx.send(Report::Lost(error));
}

fn report_v5(event: v5::Event) -> Option<Report> {
    use v5::mqttbytes::v5::Packet;
    Some(match event {
        v5::Event::Incoming(Packet::ConnAck(a)) => {
            let p = a.properties.as_ref();
            Report::Connected {
                receive_max: p.and_then(|p| p.receive_max),
                max_packet: p.and_then(|p| p.max_packet_size),
            }
        }
        v5::Event::Incoming(Packet::PubAck(a)) => Report::Acked {
            pkid: a.pkid,
            refused: puback_failure(&a.reason).map(|(code, name)| PublishError::Refused {
                code,
                name,
                reason_string: a.properties.and_then(|p| p.reason_string),
            }),
        },
        v5::Event::Incoming(Packet::Disconnect(d)) => {
            Report::Lost(format!("the broker sent DISCONNECT ({:?})", d.reason_code))
        }
        v5::Event::Outgoing(rumqttc::Outgoing::Publish(pkid)) => Report::Sent(pkid),
        _ => return None,
    })
}

fn report_v311(event: rumqttc::Event) -> Option<Report> {
    use rumqttc::Packet;
    Some(match event {
        rumqttc::Event::Incoming(Packet::ConnAck(_)) => Report::Connected {
            receive_max: None,
            max_packet: None,
        },
        rumqttc::Event::Incoming(Packet::PubAck(a)) => Report::Acked {
            pkid: a.pkid,
            refused: None,
        },
        rumqttc::Event::Outgoing(rumqttc::Outgoing::Publish(pkid)) => Report::Sent(pkid),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flight of `n` messages, queued under a window of `window` and sent with packet ids
    /// from 1, as the connection's task would report them.
    fn flight(n: usize, window: usize) -> Flight {
        let mut f = Flight::default();
        for i in 0..n {
            f.push(format!("t/{i}"), vec![b'x'; i], i as u64);
        }
        let mut pkid = 0;
        while f.peek(window).is_some() {
            assert!(f.take_next().is_some());
            pkid += 1;
            f.sent(pkid);
        }
        f
    }

    fn refused() -> PublishError {
        PublishError::Refused {
            code: 0x87,
            name: "not authorized",
            reason_string: None,
        }
    }

    #[test]
    fn only_the_acknowledged_prefix_is_reported_whatever_order_the_pubacks_come_in() {
        let mut f = flight(3, 20);
        assert_eq!(f.in_flight, 3);
        assert_eq!(f.acked(2, None), None);
        assert_eq!(f.take_progress(), None, "the first is not acknowledged yet");
        f.acked(1, None);
        let two = Published {
            acked: 2,
            failure: None,
        };
        assert_eq!(f.take_progress(), Some(two));
        // A message handed over meanwhile goes out behind the one still in flight.
        f.push("t/3".into(), Vec::new(), 3);
        assert_eq!(f.peek(20).map(|p| p.0), Some(3));
        f.acked(3, None);
        assert_eq!(f.take_progress().map(|p| p.acked), Some(1));
        assert_eq!(f.pending(), 1);
    }

    #[test]
    fn the_window_bounds_what_is_in_flight() {
        let mut f = flight(5, 2);
        assert_eq!((f.in_flight, f.peek(2)), (2, None));
        f.acked(1, None);
        assert!(f.peek(2).is_some());
    }

    #[test]
    fn a_refusal_mid_window_is_reported_once_the_prefix_before_it_is_acknowledged() {
        let mut f = flight(4, 20);
        f.acked(1, None);
        assert_eq!(
            f.acked(3, Some(refused())),
            Some(2),
            "the refused message's digest"
        );
        assert_eq!(
            f.take_progress().map(|p| (p.acked, p.failure)),
            Some((1, None))
        );
        f.acked(2, None);
        assert_eq!(
            f.take_progress(),
            Some(Published {
                acked: 1,
                failure: Some(refused())
            })
        );
        // Nothing is queued after a failure, and the caller hands the rest over again.
        f.clear();
        assert_eq!((f.pending(), f.in_flight, f.peek(20)), (0, 0, None));
    }

    #[test]
    fn a_lost_connection_fails_the_first_unacknowledged_message_only_if_there_is_one() {
        let mut f = flight(3, 20);
        for pkid in 1..=3 {
            f.acked(pkid, None);
        }
        f.lost(PublishError::Connection("gone".into()));
        assert_eq!(
            f.take_progress().map(|p| (p.acked, p.failure)),
            Some((3, None))
        );
        let mut f = flight(3, 20);
        f.acked(1, None);
        f.lost(PublishError::Connection("gone".into()));
        assert_eq!(
            f.take_progress(),
            Some(Published {
                acked: 1,
                failure: Some(PublishError::Connection("gone".into()))
            })
        );
        // A PUBACK for a packet id not in flight fails the connection at the front.
        let mut f = flight(2, 20);
        f.acked(9, None);
        assert!(matches!(
            f.take_progress(),
            Some(Published {
                acked: 0,
                failure: Some(PublishError::Connection(_))
            })
        ));
    }

    #[test]
    fn packet_size_matches_rumqttc() {
        for (topic, payload) in [(1, 0), (10, 100), (300, 20_000), (5, 3_000_000)] {
            let t = "t".repeat(topic);
            let mut p = v5::mqttbytes::v5::Publish::new(
                t,
                v5::mqttbytes::QoS::AtLeastOnce,
                vec![b'x'; payload],
                Some(PublishProperties {
                    payload_format_indicator: Some(1),
                    content_type: Some(CONTENT_TYPE.to_string()),
                    ..PublishProperties::default()
                }),
            );
            p.pkid = 1;
            assert_eq!(packet_size_v5(topic, payload), p.size());
        }
    }

    #[test]
    fn topic_names_refused_as_the_spec_says() {
        assert!(topic_name_problem("cop/a/b").is_none());
        assert!(topic_name_problem("").is_some());
        assert!(topic_name_problem("a/+/b").is_some());
        assert!(topic_name_problem("a/#").is_some());
        assert!(topic_name_problem("a\0b").is_some());
        assert!(topic_name_problem(&"x".repeat(65_535)).is_none());
        assert!(topic_name_problem(&"x".repeat(65_536)).is_some());
    }

    #[test]
    fn failure_reason_codes_are_those_of_the_spec() {
        assert_eq!(puback_failure(&PubAckReason::Success), None);
        assert_eq!(puback_failure(&PubAckReason::NoMatchingSubscribers), None);
        assert_eq!(
            puback_failure(&PubAckReason::NotAuthorized).map(|c| c.0),
            Some(0x87)
        );
        assert_eq!(
            puback_failure(&PubAckReason::QuotaExceeded).map(|c| c.0),
            Some(0x97)
        );
    }
}
