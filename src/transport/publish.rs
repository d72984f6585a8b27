//! Publishing at QoS 1 for the relay's `mqtt` sink: one connection, many publishes in flight,
//! and the acknowledged prefix reported in order.
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
use std::time::Duration;

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

/// One message to publish.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub topic: &'a str,
    pub payload: &'a str,
}

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

/// What one `publish` call achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// How many messages, from the front, the broker acknowledged (successfully).
    pub acked: usize,
    /// Why `messages[acked]` was not; `None` only when all were.
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

/// A QoS 1 publisher to one broker, connected lazily.
pub struct Publisher {
    sink: MqttSink,
    conn: Option<Connection>,
    /// The last message the broker refused (a PUBACK failure code), by digest. Some brokers
    /// (Mosquitto 2.0) close the connection right after such a PUBACK, and the PUBACKs of
    /// the messages before it can be lost with the connection: when the refused message comes
    /// round again it is reported at once, not sent into the same close again.
    refused: Option<(u64, PublishError)>,
    /// The last call ended on a lost connection or a timeout: the next one starts with one
    /// message in flight and widens the window by one per PUBACK, so a message that makes the
    /// broker close the connection takes few acknowledgements of others with it.
    cautious: bool,
    /// A `publish` call is under way; still set at the next call if the last one was dropped
    /// mid-way (cancelled), whose connection may then hold publishes in flight.
    busy: bool,
}

/// Progress of one `publish` call, kept outside the future so a timeout can read it.
struct Progress {
    /// Whether each message was acknowledged.
    acked: Vec<bool>,
    /// Acknowledged from the front.
    prefix: usize,
    /// The lowest-index failure so far.
    failure: Option<(usize, PublishError)>,
    /// Publishes queued and not yet acknowledged.
    in_flight: usize,
}

impl Progress {
    fn fail(&mut self, at: usize, e: PublishError) {
        if self.failure.as_ref().is_none_or(|(i, _)| at < *i) {
            self.failure = Some((at, e));
        }
    }

    fn advance(&mut self) {
        while self.acked.get(self.prefix).copied().unwrap_or(false) {
            self.prefix += 1;
        }
    }

    /// The outcome, once the prefix reached the end or the first failure.
    fn settled(&self) -> Option<Published> {
        if let Some((at, e)) = &self.failure
            && self.prefix >= *at
        {
            return Some(Published {
                acked: *at,
                failure: Some(e.clone()),
            });
        }
        (self.prefix == self.acked.len()).then_some(Published {
            acked: self.prefix,
            failure: None,
        })
    }
}

impl Publisher {
    /// No I/O yet: the first `publish` connects.
    pub fn new(sink: &MqttSink) -> Publisher {
        Publisher {
            sink: sink.clone(),
            conn: None,
            refused: None,
            cautious: false,
            busy: false,
        }
    }

    /// Publishes `messages` at QoS 1, retain false, pipelined up to the broker's receive
    /// maximum, and returns how many from the front were acknowledged and what stopped the
    /// next one. Connects first if needed; the whole call is bounded by `limit`.
    pub async fn publish(&mut self, messages: &[Message<'_>], limit: Duration) -> Published {
        let mut progress = Progress {
            acked: vec![false; messages.len()],
            prefix: 0,
            failure: None,
            in_flight: 0,
        };
        if messages.is_empty() {
            return Published {
                acked: 0,
                failure: None,
            };
        }
        if self.busy {
            self.conn = None;
            self.cautious = true;
        }
        self.busy = true;
        let run = self.run(messages, &mut progress);
        let out = match tokio::time::timeout(limit, run).await {
            Ok(out) => out,
            Err(_) => {
                progress.fail(progress.prefix, PublishError::Timeout(limit));
                progress.settled().unwrap_or(Published {
                    acked: progress.prefix,
                    failure: Some(PublishError::Timeout(limit)),
                })
            }
        };
        // A connection is kept only if nothing is left in flight on it and it did not fail:
        // a late PUBACK must never be matched against the next call's messages.
        let healthy = matches!(
            out.failure,
            None | Some(PublishError::Refused { .. } | PublishError::TooLarge { .. })
        );
        if progress.in_flight > 0 || !healthy {
            self.conn = None;
        }
        self.cautious = !healthy;
        self.busy = false;
        out
    }

    async fn run(&mut self, messages: &[Message<'_>], progress: &mut Progress) -> Published {
        self.drop_if_lost();
        if self.conn.is_none() {
            match self.connect().await {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    return Published {
                        acked: 0,
                        failure: Some(PublishError::Connection(e.to_string())),
                    };
                }
            }
        }
        let Some(conn) = self.conn.as_mut() else {
            return Published {
                acked: 0,
                failure: Some(PublishError::Connection("not connected".into())),
            };
        };
        // Messages queued and waiting for their packet id, in queue order.
        let mut unsent: VecDeque<usize> = VecDeque::new();
        let mut by_pkid: HashMap<u16, usize> = HashMap::new();
        let mut next = 0usize;
        // Publishing stops at the first failure: what follows would only be re-sent.
        let mut stop = messages.len();
        if let Some((digest, e)) = self.refused.take()
            && let Some(k) = messages.iter().position(|m| message_digest(m) == digest)
        {
            progress.fail(k, e);
            stop = k;
        }
        let mut window = if self.cautious { 1 } else { conn.window };
        loop {
            while progress.in_flight < window && next < stop {
                let m = messages[next];
                if let Some(max) = conn.max_packet {
                    let size = packet_size_v5(m.topic.len(), m.payload.len());
                    if size > max as usize {
                        progress.fail(next, PublishError::TooLarge { size, max });
                        stop = next;
                        break;
                    }
                }
                if let Err(e) = queue(&conn.client, m) {
                    progress.fail(next, PublishError::Connection(e.to_string()));
                    stop = next;
                    break;
                }
                unsent.push_back(next);
                progress.in_flight += 1;
                next += 1;
            }
            progress.advance();
            if let Some(out) = progress.settled() {
                return out;
            }
            let Some(report) = conn.reports.recv().await else {
                progress.fail(
                    progress.prefix,
                    PublishError::Connection("the connection task ended".into()),
                );
                stop = next;
                continue;
            };
            match report {
                Report::Sent(pkid) => {
                    if let Some(i) = unsent.pop_front() {
                        by_pkid.insert(pkid, i);
                    }
                }
                Report::Acked { pkid, refused } => {
                    let Some(i) = by_pkid.remove(&pkid) else {
                        progress.fail(
                            progress.prefix,
                            PublishError::Connection(format!(
                                "the broker acknowledged packet id {pkid}, which is not in flight"
                            )),
                        );
                        stop = next;
                        continue;
                    };
                    progress.in_flight -= 1;
                    // Slow start after a loss: the window doubles per round trip.
                    window = (window + 1).min(conn.window);
                    match refused {
                        None => progress.acked[i] = true,
                        Some(e) => {
                            self.refused = Some((message_digest(&messages[i]), e.clone()));
                            progress.fail(i, e);
                            stop = stop.min(next);
                        }
                    }
                }
                Report::Lost(e) => {
                    progress.fail(progress.prefix, PublishError::Connection(e));
                    stop = next;
                }
                Report::Connected { .. } => {}
            }
        }
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

    async fn connect(&self) -> Result<Connection, TransportError> {
        let s = &self.sink;
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

fn message_digest(m: &Message<'_>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    m.topic.hash(&mut h);
    m.payload.hash(&mut h);
    h.finish()
}

fn queue(client: &Client, m: Message<'_>) -> Result<(), TransportError> {
    let payload = m.payload.as_bytes().to_vec();
    match client {
        Client::V5(c) => c
            .try_publish_with_properties(
                m.topic,
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
            .try_publish(m.topic, rumqttc::QoS::AtLeastOnce, false, payload)
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
