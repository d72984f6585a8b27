//! The MQTT side, and the only module that names rumqttc: options, subscribe, the poll loop,
//! broker failover, and acknowledgements guarded by connection generation.
//!
//! The poll loop runs as its own task and is never cancelled mid-poll. Every connection loss
//! bumps a generation counter before the loop awaits anything again; an acknowledgement is sent
//! only for a delivery of the current generation. rumqttc drops PUBACKs still queued when a
//! connection breaks, and a PUBACK carrying an old packet id on a new, session-less connection
//! could acknowledge a message we never committed; so stale acks are dropped and the broker
//! redelivers, which the engine suppresses as duplicates. The service runs on a current-thread
//! runtime, so nothing can run between rumqttc's clean-up and the generation bump.

pub mod publish;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rumqttc::v5;
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedSender;

use crate::config::{BrokerUrl, MqttConfig, Protocol, Secret, TlsFiles};

/// What the poll loop reports to the service.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per delivery; boxing would cost an allocation each
pub enum TransportEvent {
    Connected {
        broker: String,
        session_present: bool,
    },
    Disconnected {
        broker: String,
        error: String,
    },
    /// The broker granted every filter of the SUBSCRIBE sent after a CONNACK: from now on
    /// it routes the configured topics to us on this connection.
    Subscribed {
        broker: String,
        filters: usize,
    },
    /// A broker switch after `retries_per_broker` failures.
    Failover {
        from: String,
        to: String,
    },
    Delivery(Delivery),
    /// The DISCONNECT went out (or the connection was already gone) after `disconnect()`.
    Closed,
    /// A configuration the broker will not serve (a refused subscription): `run` must stop
    /// with this one-line message rather than stay up receiving nothing.
    Fatal(String),
}

/// One PUBLISH received, to be decided and then acknowledged.
#[derive(Debug)]
pub struct Delivery {
    pub topic: String,
    pub payload: Vec<u8>,
    /// `None` for QoS 0 (nothing to acknowledge).
    pub token: Option<AckToken>,
}

/// What an acknowledgement needs: the packet and the connection it arrived on.
#[derive(Debug)]
pub struct AckToken {
    generation: u64,
    publish: PubRef,
}

#[derive(Debug)]
enum PubRef {
    V311(rumqttc::Publish),
    V5(v5::mqttbytes::v5::Publish),
}

enum Client {
    V311(rumqttc::AsyncClient),
    V5(v5::AsyncClient),
}

#[allow(clippy::large_enum_variant)] // one per process
enum Loop {
    V311(rumqttc::EventLoop),
    V5(v5::EventLoop),
}

/// The service's handle: acknowledge, release, disconnect. Cheap to clone.
#[derive(Clone)]
pub struct TransportHandle {
    client: Arc<Mutex<Client>>,
    generation: Arc<AtomicU64>,
    stopping: Arc<AtomicBool>,
    /// Deliveries handed to the service and not yet released (decided and committed).
    backlog: Arc<AtomicUsize>,
    room: Arc<Notify>,
    /// The poll loop stops reading while `backlog` is at this (`STALL_WINDOWS` receive
    /// maximums): a broker that ignores our Receive Maximum then waits on TCP instead of
    /// filling our memory. It still polls once per half keep-alive, so pings go on.
    limit: usize,
    /// PUBACKs of committed deliveries that did not fit in rumqttc's request queue yet, in
    /// delivery order: queued as the poll loop drains it, never dropped (a dropped PUBACK
    /// leaves the message in flight at the broker until a reconnect, and a broker whose
    /// in-flight window is full of them stops delivering).
    pending: Arc<Mutex<std::collections::VecDeque<AckToken>>>,
}

/// Counts of one `ack` call.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AckStats {
    pub sent: usize,
    /// Deliveries of an earlier connection: the broker redelivers them.
    pub stale: usize,
    /// The request queue was full: kept, in order, and queued as it drains.
    pub deferred: usize,
}

impl TransportHandle {
    /// Queues PUBACKs, in the given order (after any still deferred), for the tokens of the
    /// current connection.
    pub fn ack(&self, tokens: impl IntoIterator<Item = AckToken>) -> AckStats {
        let current = self.generation.load(Ordering::SeqCst);
        let client = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stats = AckStats::default();
        flush(&client, &mut pending, current);
        for t in tokens {
            if t.generation != current {
                stats.stale += 1;
                continue;
            }
            if pending.is_empty() && try_ack(&client, &t) {
                stats.sent += 1;
            } else {
                stats.deferred += 1;
                pending.push_back(t);
            }
        }
        stats
    }

    /// Queues deferred PUBACKs that now fit (the poll loop calls this after each poll).
    fn flush_deferred(&self) {
        let current = self.generation.load(Ordering::SeqCst);
        let client = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        flush(&client, &mut pending, current);
    }

    /// Marks `n` deliveries as decided and committed, letting the poll loop read more.
    pub fn release(&self, n: usize) {
        let _ = self
            .backlog
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| {
                Some(b.saturating_sub(n))
            });
        self.room.notify_one();
    }

    /// Sends DISCONNECT after the acks already queued (the session is kept) and makes the poll
    /// loop end once it is out.
    pub fn disconnect(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.room.notify_one();
        self.flush_deferred();
        let client = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = match &*client {
            Client::V311(c) => c.try_disconnect().is_ok(),
            Client::V5(c) => c.try_disconnect().is_ok(),
        };
    }
}

fn try_ack(client: &Client, t: &AckToken) -> bool {
    match (client, &t.publish) {
        (Client::V311(c), PubRef::V311(p)) => c.try_ack(p).is_ok(),
        (Client::V5(c), PubRef::V5(p)) => c.try_ack(p).is_ok(),
        _ => false,
    }
}

/// Queues deferred PUBACKs, oldest first, until the request queue is full again. Those of an
/// earlier connection are dropped: the broker redelivers their messages.
fn flush(client: &Client, pending: &mut std::collections::VecDeque<AckToken>, current: u64) {
    while let Some(t) = pending.front() {
        if t.generation != current {
            pending.pop_front();
            continue;
        }
        if !try_ack(client, t) {
            return;
        }
        pending.pop_front();
    }
}

fn request_capacity(cfg: &MqttConfig) -> usize {
    // Room for a whole in-flight window of PUBACKs plus subscribes and the disconnect.
    usize::from(cfg.receive_maximum) * 2 + 64
}

/// What every connection of ours shares, the feed's and a sink's: where, who, how.
pub(crate) struct Endpoint<'a> {
    pub broker: &'a BrokerUrl,
    pub client_id: &'a str,
    pub keep_alive: Duration,
    pub credentials: Option<&'a (String, Secret)>,
    pub tls: Option<&'a TlsFiles>,
    /// The config section that names `tls`, for the error when it is missing.
    pub section: &'a str,
}

impl Endpoint<'_> {
    fn transport(&self) -> Result<Option<rumqttc::Transport>, String> {
        if !self.broker.tls {
            return Ok(None);
        }
        let tls = self
            .tls
            .ok_or_else(|| format!("an mqtts:// broker needs {} ca_file", self.section))?;
        // Our own rustls config, not rumqttc's `TlsConfiguration::Simple`: that one is built
        // with `ClientConfig::builder()`, which needs a process-default crypto provider.
        let identity = match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(c), Some(k)) => Some([
                (c.as_path(), "client_cert_file"),
                (k.as_path(), "client_key_file"),
            ]),
            _ => None,
        };
        let client = crate::tls::verifying_client((&tls.ca_file, "ca_file"), identity)?;
        Ok(Some(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Rustls(Arc::new(client)),
        )))
    }

    /// `Config` guarantees 5..=65535 s; clamped again because rumqttc's MQTT 5 client panics
    /// below 5 s and both clients truncate the 16-bit protocol field above 65535 s.
    fn keep_alive(&self) -> Duration {
        self.keep_alive
            .clamp(Duration::from_secs(5), Duration::from_secs(65_535))
    }

    /// MQTT 5 options: address, keep-alive, credentials and TLS; the caller adds the rest.
    pub(crate) fn options_v5(&self) -> Result<v5::MqttOptions, String> {
        let mut o = v5::MqttOptions::new(self.client_id, &self.broker.host, self.broker.port);
        o.set_keep_alive(self.keep_alive());
        if let Some((user, pass)) = self.credentials {
            o.set_credentials(user, pass.expose());
        }
        if let Some(t) = self.transport()? {
            o.set_transport(t);
        }
        Ok(o)
    }

    /// MQTT 3.1.1 options: address, keep-alive, credentials and TLS; the caller adds the rest.
    pub(crate) fn options_v311(&self) -> Result<rumqttc::MqttOptions, String> {
        let mut o = rumqttc::MqttOptions::new(self.client_id, &self.broker.host, self.broker.port);
        o.set_keep_alive(self.keep_alive());
        if let Some((user, pass)) = self.credentials {
            o.set_credentials(user, pass.expose());
        }
        if let Some(t) = self.transport()? {
            o.set_transport(t);
        }
        Ok(o)
    }
}

fn build(
    cfg: &MqttConfig,
    broker: &BrokerUrl,
    max_packet: usize,
) -> Result<(Client, Loop), String> {
    let cap = request_capacity(cfg);
    let endpoint = Endpoint {
        broker,
        client_id: &cfg.client_id,
        keep_alive: cfg.keep_alive,
        credentials: cfg.credentials.as_ref(),
        tls: cfg.tls.as_ref(),
        section: "[mqtt]",
    };
    let max_packet_u32 = u32::try_from(max_packet).unwrap_or(u32::MAX);
    Ok(match cfg.protocol {
        Protocol::V5 => {
            let mut o = endpoint.options_v5()?;
            o.set_manual_acks(true)
                .set_clean_start(false)
                .set_session_expiry_interval(Some(cfg.session_expiry_seconds))
                .set_receive_maximum(Some(cfg.receive_maximum))
                .set_max_packet_size(Some(max_packet_u32))
                .set_request_channel_capacity(cap);
            let (c, l) = v5::AsyncClient::new(o, cap);
            (Client::V5(c), Loop::V5(l))
        }
        Protocol::V311 => {
            let mut o = endpoint.options_v311()?;
            o.set_manual_acks(true)
                .set_clean_session(false)
                .set_max_packet_size(max_packet, max_packet)
                .set_request_channel_capacity(cap);
            let (c, l) = rumqttc::AsyncClient::new(o, cap);
            (Client::V311(c), Loop::V311(l))
        }
    })
}

/// What one poll produced, protocol-independent.
#[allow(clippy::large_enum_variant)] // short-lived, one at a time
enum Polled {
    ConnAck {
        session_present: bool,
    },
    /// Per filter of our SUBSCRIBE, in order: `None` if granted at QoS 1 or 2, else why not.
    SubAck(Vec<Option<String>>),
    Publish(Delivery),
    DisconnectSent,
    Other,
    Error(String),
}

/// Why a subscription granted at QoS 0 is as bad as a refused one.
const QOS0: &str = "granted only at QoS 0, whose deliveries carry no acknowledgement: the \
                    broker would drop what replay-guard never committed; allow QoS 1 for it";

async fn poll_once(l: &mut Loop, generation: u64) -> Polled {
    match l {
        Loop::V5(l) => match l.poll().await {
            Ok(v5::Event::Incoming(v5::Incoming::ConnAck(a))) => {
                if a.code == v5::mqttbytes::v5::ConnectReturnCode::Success {
                    Polled::ConnAck {
                        session_present: a.session_present,
                    }
                } else {
                    Polled::Error(format!("broker refused the connection: {:?}", a.code))
                }
            }
            Ok(v5::Event::Incoming(v5::Incoming::SubAck(a))) => Polled::SubAck(
                a.return_codes
                    .iter()
                    .map(|c| {
                        use v5::mqttbytes::v5::SubscribeReasonCode as C;
                        match c {
                            C::Success(v5::mqttbytes::QoS::AtMostOnce) => Some(QOS0.to_string()),
                            C::Success(_) => None,
                            other => Some(format!("refused ({other:?})")),
                        }
                    })
                    .collect(),
            ),
            Ok(v5::Event::Incoming(v5::Incoming::Publish(p))) => Polled::Publish(Delivery {
                topic: String::from_utf8_lossy(&p.topic).into_owned(),
                payload: p.payload.to_vec(),
                token: (p.qos != v5::mqttbytes::QoS::AtMostOnce).then(|| AckToken {
                    generation,
                    publish: PubRef::V5(p),
                }),
            }),
            Ok(v5::Event::Outgoing(rumqttc::Outgoing::Disconnect)) => Polled::DisconnectSent,
            Ok(_) => Polled::Other,
            Err(e) => Polled::Error(e.to_string()),
        },
        Loop::V311(l) => match l.poll().await {
            Ok(rumqttc::Event::Incoming(rumqttc::Incoming::ConnAck(a))) => {
                if a.code == rumqttc::ConnectReturnCode::Success {
                    Polled::ConnAck {
                        session_present: a.session_present,
                    }
                } else {
                    Polled::Error(format!("broker refused the connection: {:?}", a.code))
                }
            }
            Ok(rumqttc::Event::Incoming(rumqttc::Incoming::SubAck(a))) => Polled::SubAck(
                a.return_codes
                    .iter()
                    .map(|c| match c {
                        rumqttc::SubscribeReasonCode::Success(rumqttc::QoS::AtMostOnce) => {
                            Some(QOS0.to_string())
                        }
                        rumqttc::SubscribeReasonCode::Success(_) => None,
                        rumqttc::SubscribeReasonCode::Failure => {
                            Some("refused (Failure)".to_string())
                        }
                    })
                    .collect(),
            ),
            Ok(rumqttc::Event::Incoming(rumqttc::Incoming::Publish(p))) => {
                Polled::Publish(Delivery {
                    topic: p.topic.clone(),
                    payload: p.payload.to_vec(),
                    token: (p.qos != rumqttc::QoS::AtMostOnce).then(|| AckToken {
                        generation,
                        publish: PubRef::V311(p),
                    }),
                })
            }
            Ok(rumqttc::Event::Outgoing(rumqttc::Outgoing::Disconnect)) => Polled::DisconnectSent,
            Ok(_) => Polled::Other,
            Err(e) => Polled::Error(e.to_string()),
        },
    }
}

impl Loop {
    /// Drops events rumqttc read from a connection before it broke but has not handed out yet
    /// (its `clean()` keeps them): a PUBLISH among them would otherwise surface after the
    /// reconnect looking like a delivery of the new connection.
    fn discard_leftovers(&mut self) {
        match self {
            Loop::V5(l) => l.state.events.clear(),
            Loop::V311(l) => l.state.events.clear(),
        }
    }
}

/// Subscribes to every filter in one SUBSCRIBE, so its SUBACK lists them in `topics` order.
/// MQTT 5 asks for retained messages only for subscriptions the session does not hold yet
/// (Retain Handling 1); a 3.1.1 broker re-sends them, and the engine absorbs them as replays.
fn subscribe(client: &Client, topics: &[String]) -> Result<(), String> {
    let queued = match client {
        Client::V5(c) => c
            .try_subscribe_many(topics.iter().map(|t| {
                let mut f =
                    v5::mqttbytes::v5::Filter::new(t.clone(), v5::mqttbytes::QoS::AtLeastOnce);
                f.retain_forward_rule = v5::mqttbytes::v5::RetainForwardRule::OnNewSubscribe;
                f
            }))
            .map_err(|e| e.to_string()),
        Client::V311(c) => c
            .try_subscribe_many(
                topics
                    .iter()
                    .map(|t| rumqttc::SubscribeFilter::new(t.clone(), rumqttc::QoS::AtLeastOnce)),
            )
            .map_err(|e| e.to_string()),
    };
    queued.map_err(|e| format!("cannot queue the SUBSCRIBE for [mqtt] topics: {e}"))
}

/// The one-line error for a SUBACK that refused (or downgraded) some of `topics`, if any.
fn suback_problem(codes: &[Option<String>], topics: &[String]) -> Option<String> {
    let (i, why) = codes
        .iter()
        .enumerate()
        .find_map(|(i, c)| c.as_ref().map(|why| (i, why)))?;
    let topic = topics.get(i).map_or("?", String::as_str);
    Some(format!(
        "the broker did not grant the subscription to {topic:?} at QoS 1: {why}; check [mqtt] \
         topics and the broker's ACL for this client"
    ))
}

/// How many receive windows of deliveries may await their commit before the poll loop stops
/// reading. Not one: a session resumed after a reconnect is redelivered past the window
/// (Mosquitto resends its queue too), and rumqttc checks the keep-alive only when its buffer
/// of up to 10 read packets is empty, so a loop that stalls with packets buffered goes a
/// keep-alive without a ping answered and loses the connection (seen with three members on a
/// loaded PostgreSQL: a redelivery, a stall and a lost connection every 12 s).
const STALL_WINDOWS: usize = 4;

/// Starts the poll loop on the current runtime. Events go to `events`; the loop ends after
/// `disconnect()` or when `events` is closed.
pub fn start(
    cfg: MqttConfig,
    max_packet: usize,
    events: UnboundedSender<TransportEvent>,
) -> Result<(TransportHandle, tokio::task::JoinHandle<()>), String> {
    let (client, eventloop) = build(&cfg, &cfg.brokers[0], max_packet)?;
    let handle = TransportHandle {
        client: Arc::new(Mutex::new(client)),
        generation: Arc::new(AtomicU64::new(0)),
        stopping: Arc::new(AtomicBool::new(false)),
        backlog: Arc::new(AtomicUsize::new(0)),
        room: Arc::new(Notify::new()),
        limit: usize::from(cfg.receive_maximum) * STALL_WINDOWS,
        pending: Arc::new(Mutex::new(std::collections::VecDeque::new())),
    };
    let h = handle.clone();
    let task = tokio::spawn(poll_loop(cfg, max_packet, eventloop, h, events));
    Ok((handle, task))
}

async fn poll_loop(
    cfg: MqttConfig,
    max_packet: usize,
    mut eventloop: Loop,
    handle: TransportHandle,
    events: UnboundedSender<TransportEvent>,
) {
    let mut broker = 0usize;
    // Failures on the current broker (for failover) and since the last CONNACK (for backoff:
    // a failover does not reset it, so `retries_per_broker = 0` cannot make a tight loop).
    let mut failures = 0u32;
    let mut attempts = 0u32;
    // Between a connection error and the next CONNACK no delivery is genuine: a PUBLISH then
    // is a leftover of the broken connection (second guard beside `discard_leftovers`).
    let mut connected = false;
    loop {
        // Backpressure: wait for room before reading more deliveries, but poll at least every
        // half keep-alive: rumqttc sends PINGREQ and reads PINGRESP only inside `poll`, and a
        // commit that takes longer than the keep-alive (a loaded PostgreSQL, members queued on
        // its lock) must not cost the connection, or the broker redelivers the whole window
        // and the next commit is as slow again. Such a poll reads at most one delivery more.
        let stalled_until = tokio::time::Instant::now() + cfg.keep_alive / 2;
        while handle.backlog.load(Ordering::SeqCst) >= handle.limit
            && !handle.stopping.load(Ordering::SeqCst)
        {
            let room = handle.room.notified();
            if handle.backlog.load(Ordering::SeqCst) < handle.limit
                || handle.stopping.load(Ordering::SeqCst)
            {
                break;
            }
            tokio::select! {
                () = room => {}
                () = tokio::time::sleep_until(stalled_until) => break,
            }
        }
        let generation = handle.generation.load(Ordering::SeqCst);
        let polled = poll_once(&mut eventloop, generation).await;
        handle.flush_deferred();
        // No await between a connection error and the generation bump (see module docs).
        let event = match polled {
            Polled::Error(error) => {
                eventloop.discard_leftovers();
                handle.generation.fetch_add(1, Ordering::SeqCst);
                connected = false;
                if handle.stopping.load(Ordering::SeqCst) {
                    let _ = events.send(TransportEvent::Closed);
                    return;
                }
                failures = failures.saturating_add(1);
                attempts = attempts.saturating_add(1);
                let name = cfg.brokers[broker].to_string();
                if events
                    .send(TransportEvent::Disconnected {
                        broker: name.clone(),
                        error,
                    })
                    .is_err()
                {
                    return;
                }
                if failures > cfg.retries_per_broker && cfg.brokers.len() > 1 {
                    let next = (broker + 1) % cfg.brokers.len();
                    match build(&cfg, &cfg.brokers[next], max_packet) {
                        Ok((client, l)) => {
                            *handle.client.lock().unwrap_or_else(PoisonError::into_inner) = client;
                            eventloop = l;
                            broker = next;
                            failures = 0;
                            let to = cfg.brokers[next].to_string();
                            let _ = events.send(TransportEvent::Failover { from: name, to });
                        }
                        Err(e) => {
                            tracing::error!(broker = %cfg.brokers[next], error = %e, "cannot prepare broker")
                        }
                    }
                }
                // Every reconnect attempt, to the same broker or the next, waits first.
                let wait = backoff(cfg.backoff_initial, cfg.backoff_max, attempts);
                if !wait_unless_stopping(&handle, wait).await {
                    let _ = events.send(TransportEvent::Closed);
                    return;
                }
                continue;
            }
            Polled::ConnAck { session_present } => {
                failures = 0;
                attempts = 0;
                connected = true;
                // On every connect, session or not: a kept session may predate a change of
                // `topics`, or lack a subscription the broker refused before, and would
                // otherwise leave us receiving nothing on it without a word.
                let queued = subscribe(
                    &handle.client.lock().unwrap_or_else(PoisonError::into_inner),
                    &cfg.topics,
                );
                if let Err(e) = queued {
                    let _ = events.send(TransportEvent::Fatal(e));
                }
                TransportEvent::Connected {
                    broker: cfg.brokers[broker].to_string(),
                    session_present,
                }
            }
            Polled::SubAck(codes) => match suback_problem(&codes, &cfg.topics) {
                // Keep polling: the service drains (commits, acks, DISCONNECT) and stops.
                Some(problem) => TransportEvent::Fatal(problem),
                None => TransportEvent::Subscribed {
                    broker: cfg.brokers[broker].to_string(),
                    filters: codes.len(),
                },
            },
            Polled::Publish(_) if !connected => {
                tracing::debug!(
                    "dropped a delivery read before a reconnect; the broker redelivers it"
                );
                continue;
            }
            Polled::Publish(d) => {
                handle.backlog.fetch_add(1, Ordering::SeqCst);
                TransportEvent::Delivery(d)
            }
            Polled::DisconnectSent if handle.stopping.load(Ordering::SeqCst) => {
                // rumqttc reports DISCONNECT once it is queued, before its write buffer (with
                // the last PUBACKs ahead of it) reaches the socket: keep polling until the
                // broker closes the connection, as it must after DISCONNECT, or a short while.
                let flush = async {
                    while !matches!(
                        poll_once(&mut eventloop, generation).await,
                        Polled::Error(_)
                    ) {}
                };
                let _ = tokio::time::timeout(Duration::from_secs(2), flush).await;
                let _ = events.send(TransportEvent::Closed);
                return;
            }
            // rumqttc disconnects on its own after a protocol error: treat it as a lost
            // connection (the next poll reconnects), not as the end of the service.
            Polled::DisconnectSent => {
                tracing::warn!(broker = %cfg.brokers[broker], "client-side disconnect after a protocol error");
                continue;
            }
            Polled::Other => continue,
        };
        if events.send(event).is_err() {
            return;
        }
    }
}

/// Sleeps `wait`, cut short by `disconnect()`; false if the transport is stopping.
async fn wait_unless_stopping(handle: &TransportHandle, wait: Duration) -> bool {
    let until = tokio::time::Instant::now() + wait;
    while !handle.stopping.load(Ordering::SeqCst) {
        let room = handle.room.notified();
        if handle.stopping.load(Ordering::SeqCst) {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep_until(until) => return true,
            () = room => {}
        }
    }
    false
}

/// How long to wait between connection attempts: doubling from `initial`, capped at `max`.
pub fn backoff(initial: Duration, max: Duration, failures: u32) -> Duration {
    initial
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(max)
}

/// Publishes `payloads` to `topic` at QoS 1 over MQTT 3.1.1, in order, and returns once the
/// broker has acknowledged every one (a field feed for `demo` and tests).
pub async fn publish_all(
    broker: &BrokerUrl,
    client_id: &str,
    topic: &str,
    payloads: Vec<Vec<u8>>,
) -> Result<(), String> {
    let mut o = rumqttc::MqttOptions::new(client_id, &broker.host, broker.port);
    o.set_clean_session(true)
        .set_keep_alive(Duration::from_secs(30));
    let (client, mut eventloop) = rumqttc::AsyncClient::new(o, 64);
    let n = payloads.len();
    let topic = topic.to_string();
    let sender = tokio::spawn(async move {
        for p in payloads {
            if client
                .publish(topic.clone(), rumqttc::QoS::AtLeastOnce, false, p)
                .await
                .is_err()
            {
                break;
            }
        }
        client
    });
    let mut acked = 0;
    while acked < n {
        match eventloop.poll().await {
            Ok(rumqttc::Event::Incoming(rumqttc::Incoming::PubAck(_))) => acked += 1,
            Ok(_) => {}
            Err(e) => return Err(format!("publishing to {broker}: {e}")),
        }
    }
    if let Ok(client) = sender.await {
        let _ = client.disconnect().await;
        // Let the DISCONNECT go out.
        let _ = tokio::time::timeout(Duration::from_millis(200), eventloop.poll()).await;
    }
    Ok(())
}
