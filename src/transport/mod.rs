//! The MQTT side, and the only module that names rumqttc: options, subscribe, the poll loop,
//! broker failover, and acknowledgements guarded by connection generation. The rules (which
//! broker, how long to wait, which delivery and which ack belong to the connection) are
//! `session`'s; `poll_loop` is the driver that does the I/O they ask for.
//!
//! The poll loop runs as its own task and is never cancelled mid-poll. Every connection loss
//! bumps a generation counter before the loop awaits anything again; an acknowledgement is sent
//! only for a delivery of the current generation. rumqttc drops PUBACKs still queued when a
//! connection breaks, and a PUBACK carrying an old packet id on a new, session-less connection
//! could acknowledge a message we never committed; so stale acks are dropped and the broker
//! redelivers, which the engine suppresses as duplicates. The service runs on a current-thread
//! runtime, so nothing can run between rumqttc's clean-up and the generation bump.

pub(crate) mod publish;
mod session;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rumqttc::v5;
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedSender;

use crate::config::{BrokerUrl, MqttConfig, Protocol, Secret, TlsFiles};
use session::{AckQueue, Action, Input, Plan, QOS0, Report, Session, Stamped};
pub use session::{AckStats, TransportError};

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
        error: TransportError,
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
    Fatal(TransportError),
}

/// One PUBLISH received, to be decided and then acknowledged.
#[derive(Debug)]
pub struct Delivery {
    pub topic: String,
    pub payload: Vec<u8>,
    /// `None` for QoS 0 (nothing to acknowledge).
    pub token: Option<AckToken>,
}

/// What an acknowledgement needs: the packet id and the connection it arrived on. Only the
/// id is kept, not the PUBLISH: a token waits for its batch's commit (and, when rumqttc's
/// request channel is full, in `AckQueue`), and a whole packet would keep its payload, and
/// the read buffer that payload was cut from, alive that long.
#[derive(Debug)]
pub struct AckToken {
    generation: u64,
    publish: PubRef,
}

impl Stamped for AckToken {
    fn generation(&self) -> u64 {
        self.generation
    }
}

/// The packet id of a QoS 1 PUBLISH, by protocol (the client that acknowledges it must speak
/// the same one).
#[derive(Debug, Clone, Copy)]
enum PubRef {
    V311(u16),
    V5(u16),
}

impl PubRef {
    /// The PUBLISH rumqttc's `try_ack` takes: it reads only the QoS and the packet id.
    fn ack_v311(pkid: u16) -> rumqttc::Publish {
        let mut p = rumqttc::Publish::new("", rumqttc::QoS::AtLeastOnce, Vec::new());
        p.pkid = pkid;
        p
    }

    fn ack_v5(pkid: u16) -> v5::mqttbytes::v5::Publish {
        let mut p =
            v5::mqttbytes::v5::Publish::new("", v5::mqttbytes::QoS::AtLeastOnce, Vec::new(), None);
        p.pkid = pkid;
        p
    }
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
    /// PUBACKs of committed deliveries that did not fit in rumqttc's request queue yet,
    /// queued as the poll loop drains it.
    pending: Arc<Mutex<AckQueue<AckToken>>>,
}

impl TransportHandle {
    /// Queues PUBACKs, in the given order (after any still deferred), for the tokens of the
    /// current connection.
    pub fn ack(&self, tokens: impl IntoIterator<Item = AckToken>) -> AckStats {
        let current = self.generation.load(Ordering::SeqCst);
        let client = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.ack(tokens, current, |t| try_ack(&client, t))
    }

    /// Queues deferred PUBACKs that now fit (the poll loop calls this after each poll).
    fn flush_deferred(&self) {
        let current = self.generation.load(Ordering::SeqCst);
        let client = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.flush(current, |t| try_ack(&client, t));
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
        let current = self.generation.load(Ordering::SeqCst);
        let client = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.disconnect(
            current,
            |t| try_ack(&client, t),
            || {
                let _ = match &*client {
                    Client::V311(c) => c.try_disconnect().is_ok(),
                    Client::V5(c) => c.try_disconnect().is_ok(),
                };
            },
        );
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

fn try_ack(client: &Client, t: &AckToken) -> bool {
    match (client, &t.publish) {
        (Client::V311(c), PubRef::V311(pkid)) => c.try_ack(&PubRef::ack_v311(*pkid)).is_ok(),
        (Client::V5(c), PubRef::V5(pkid)) => c.try_ack(&PubRef::ack_v5(*pkid)).is_ok(),
        _ => false,
    }
}

/// Publishes the feed's connection may have in flight: it sends none.
const FEED_OUTGOING_INFLIGHT: u16 = 8;

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
    fn transport(&self) -> Result<Option<rumqttc::Transport>, TransportError> {
        if !self.broker.tls {
            return Ok(None);
        }
        let tls = self.tls.ok_or_else(|| TransportError::MissingCa {
            section: self.section.to_string(),
        })?;
        // Our own rustls config, not rumqttc's `TlsConfiguration::Simple`: that one is built
        // with `ClientConfig::builder()`, which needs a process-default crypto provider.
        let identity = match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(c), Some(k)) => Some([
                (c.as_path(), "client_cert_file"),
                (k.as_path(), "client_key_file"),
            ]),
            _ => None,
        };
        let client = crate::tls::verifying_client((&tls.ca_file, "ca_file"), identity)
            .map_err(|e| TransportError::Tls(e.to_string()))?;
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
    pub(crate) fn options_v5(&self) -> Result<v5::MqttOptions, TransportError> {
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
    pub(crate) fn options_v311(&self) -> Result<rumqttc::MqttOptions, TransportError> {
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
) -> Result<(Client, Loop), TransportError> {
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
                .set_request_channel_capacity(cap)
                // The feed's connection publishes nothing; rumqttc otherwise sizes its table of
                // outgoing publishes for 65,535 of them (14 MiB).
                .set_outgoing_inflight_upper_limit(FEED_OUTGOING_INFLIGHT);
            let (c, l) = v5::AsyncClient::new(o, cap);
            (Client::V5(c), Loop::V5(l))
        }
        Protocol::V311 => {
            let mut o = endpoint.options_v311()?;
            o.set_manual_acks(true)
                .set_clean_session(false)
                .set_max_packet_size(max_packet, max_packet)
                .set_request_channel_capacity(cap)
                .set_inflight(FEED_OUTGOING_INFLIGHT);
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
    Error(TransportError),
}

async fn poll_once(l: &mut Loop, generation: u64) -> Polled {
    match l {
        Loop::V5(l) => match l.poll().await {
            Ok(v5::Event::Incoming(v5::Incoming::ConnAck(a))) => {
                if a.code == v5::mqttbytes::v5::ConnectReturnCode::Success {
                    Polled::ConnAck {
                        session_present: a.session_present,
                    }
                } else {
                    Polled::Error(TransportError::Refused {
                        code: format!("{:?}", a.code),
                    })
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
                token: (p.qos != v5::mqttbytes::QoS::AtMostOnce).then_some(AckToken {
                    generation,
                    publish: PubRef::V5(p.pkid),
                }),
            }),
            Ok(v5::Event::Outgoing(rumqttc::Outgoing::Disconnect)) => Polled::DisconnectSent,
            Ok(_) => Polled::Other,
            Err(e) => Polled::Error(TransportError::Lost(e.to_string())),
        },
        Loop::V311(l) => match l.poll().await {
            Ok(rumqttc::Event::Incoming(rumqttc::Incoming::ConnAck(a))) => {
                if a.code == rumqttc::ConnectReturnCode::Success {
                    Polled::ConnAck {
                        session_present: a.session_present,
                    }
                } else {
                    Polled::Error(TransportError::Refused {
                        code: format!("{:?}", a.code),
                    })
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
                    token: (p.qos != rumqttc::QoS::AtMostOnce).then_some(AckToken {
                        generation,
                        publish: PubRef::V311(p.pkid),
                    }),
                })
            }
            Ok(rumqttc::Event::Outgoing(rumqttc::Outgoing::Disconnect)) => Polled::DisconnectSent,
            Ok(_) => Polled::Other,
            Err(e) => Polled::Error(TransportError::Lost(e.to_string())),
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
fn subscribe(client: &Client, topics: &[String]) -> Result<(), TransportError> {
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
    queued.map_err(TransportError::Subscribe)
}

/// Starts the poll loop on the current runtime. Events go to `events`; the loop ends after
/// `disconnect()` or when `events` is closed.
pub fn start(
    cfg: MqttConfig,
    max_packet: usize,
    events: UnboundedSender<TransportEvent>,
) -> Result<(TransportHandle, tokio::task::JoinHandle<()>), TransportError> {
    let (client, eventloop) = build(&cfg, &cfg.brokers[0], max_packet)?;
    let handle = TransportHandle {
        client: Arc::new(Mutex::new(client)),
        generation: Arc::new(AtomicU64::new(0)),
        stopping: Arc::new(AtomicBool::new(false)),
        backlog: Arc::new(AtomicUsize::new(0)),
        room: Arc::new(Notify::new()),
        pending: Arc::new(Mutex::new(AckQueue::new())),
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
    let mut session = Session::new(Plan {
        brokers: cfg.brokers.len(),
        retries_per_broker: cfg.retries_per_broker,
        backoff_initial: cfg.backoff_initial,
        backoff_max: cfg.backoff_max,
        keep_alive: cfg.keep_alive,
        receive_maximum: cfg.receive_maximum,
        topics: cfg.topics.clone(),
    });
    loop {
        // Backpressure: a broker that ignores our Receive Maximum waits on TCP instead of
        // filling our memory; the wait ends at the latest after `longest_stall`, and such a
        // poll reads at most one delivery more.
        let stalled_until = tokio::time::Instant::now() + session.longest_stall();
        while session.must_wait_for_room(handle.backlog.load(Ordering::SeqCst), handle.stopping()) {
            let room = handle.room.notified();
            if !session.must_wait_for_room(handle.backlog.load(Ordering::SeqCst), handle.stopping())
            {
                break;
            }
            tokio::select! {
                () = room => {}
                () = tokio::time::sleep_until(stalled_until) => break,
            }
        }
        let generation = session.generation();
        let polled = poll_once(&mut eventloop, generation).await;
        handle.flush_deferred();
        let mut delivery = None;
        let input = match polled {
            Polled::Error(error) => {
                eventloop.discard_leftovers();
                Input::Lost {
                    error,
                    stopping: handle.stopping(),
                }
            }
            Polled::ConnAck { session_present } => Input::ConnAck { session_present },
            Polled::SubAck(codes) => Input::SubAck(codes),
            Polled::Publish(d) => {
                delivery = Some(d);
                Input::Publish { generation }
            }
            Polled::DisconnectSent => Input::DisconnectSent {
                stopping: handle.stopping(),
            },
            Polled::Other => continue,
        };
        let mut todo = VecDeque::from(session.handle(input));
        // No await between a connection error and the generation bump (see module docs).
        handle
            .generation
            .store(session.generation(), Ordering::SeqCst);
        while let Some(action) = todo.pop_front() {
            match action {
                Action::Subscribe => {
                    let queued = subscribe(
                        &handle.client.lock().unwrap_or_else(PoisonError::into_inner),
                        &cfg.topics,
                    );
                    if let Err(e) = queued {
                        let _ = events.send(TransportEvent::Fatal(e));
                    }
                }
                Action::Report(report) => {
                    let best_effort = matches!(report, Report::Failover { .. });
                    if events.send(event(&cfg, report)).is_err() && !best_effort {
                        return;
                    }
                }
                Action::Prepare { broker: next } => {
                    match build(&cfg, &cfg.brokers[next], max_packet) {
                        Ok((client, l)) => {
                            *handle.client.lock().unwrap_or_else(PoisonError::into_inner) = client;
                            eventloop = l;
                            for a in session
                                .handle(Input::Switched { to: next })
                                .into_iter()
                                .rev()
                            {
                                todo.push_front(a);
                            }
                        }
                        Err(e) => {
                            tracing::error!(broker = %cfg.brokers[next], error = %e, "cannot prepare broker {}: {e}", cfg.brokers[next])
                        }
                    }
                }
                Action::Wait(wait) => {
                    if !wait_unless_stopping(&handle, wait).await {
                        let _ = events.send(TransportEvent::Closed);
                        return;
                    }
                }
                Action::Deliver => {
                    if let Some(d) = delivery.take() {
                        handle.backlog.fetch_add(1, Ordering::SeqCst);
                        if events.send(TransportEvent::Delivery(d)).is_err() {
                            return;
                        }
                    }
                }
                Action::DropLeftover => {
                    tracing::debug!(
                        "dropped a delivery read before a reconnect; the broker redelivers it"
                    );
                }
                Action::ProtocolDisconnect => {
                    tracing::warn!(broker = %cfg.brokers[session.broker()], "client-side disconnect after a protocol error on {}", cfg.brokers[session.broker()]);
                }
                Action::Close { drain } => {
                    if drain {
                        // rumqttc reports DISCONNECT once it is queued, before its write
                        // buffer (with the last PUBACKs ahead of it) reaches the socket: keep
                        // polling until the broker closes the connection, as it must after
                        // DISCONNECT, or a short while.
                        let flush = async {
                            while !matches!(
                                poll_once(&mut eventloop, generation).await,
                                Polled::Error(_)
                            ) {}
                        };
                        let _ = tokio::time::timeout(Duration::from_secs(2), flush).await;
                    }
                    let _ = events.send(TransportEvent::Closed);
                    return;
                }
            }
        }
    }
}

/// The service's event for `report`, brokers by name.
fn event(cfg: &MqttConfig, report: Report) -> TransportEvent {
    let name = |i: usize| cfg.brokers[i].to_string();
    match report {
        Report::Connected {
            broker,
            session_present,
        } => TransportEvent::Connected {
            broker: name(broker),
            session_present,
        },
        Report::Disconnected { broker, error } => TransportEvent::Disconnected {
            broker: name(broker),
            error,
        },
        Report::Subscribed { broker, filters } => TransportEvent::Subscribed {
            broker: name(broker),
            filters,
        },
        Report::Failover { from, to } => TransportEvent::Failover {
            from: name(from),
            to: name(to),
        },
        Report::Fatal(e) => TransportEvent::Fatal(e),
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

/// Publishes `payloads` to `topic` at QoS 1 over MQTT 3.1.1, in order, and returns once the
/// broker has acknowledged every one (a field feed for `demo` and tests).
pub async fn publish_all(
    broker: &BrokerUrl,
    client_id: &str,
    topic: &str,
    payloads: Vec<Vec<u8>>,
) -> Result<(), TransportError> {
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
            Err(e) => {
                return Err(TransportError::Publish {
                    broker: broker.to_string(),
                    why: e.to_string(),
                });
            }
        }
    }
    if let Ok(client) = sender.await {
        let _ = client.disconnect().await;
        // Let the DISCONNECT go out.
        let _ = tokio::time::timeout(Duration::from_millis(200), eventloop.poll()).await;
    }
    Ok(())
}
