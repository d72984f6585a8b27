//! The feed connection's rule book, sans-IO: which broker next, how long to back off, which
//! connection a delivery belongs to, when to subscribe and report `Subscribed`, which acks may
//! go out. Methods only change state and say what to do; `poll_loop` does the I/O.
//!
//! Nothing here names tokio or rumqttc or reads a clock: the driver passes what happened (a
//! CONNACK, a lost connection, a SUBACK's codes, whether `disconnect()` was asked) and times
//! as durations, and performs the returned [`Action`]s in order.

use std::collections::VecDeque;
use std::time::Duration;

/// Why the transport failed, or why the broker would not serve us. The texts are the ones
/// `run` and the `mqtt` sink print.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// An `mqtts://` broker but no CA file in the config section (`[mqtt]`, `[[sink]]`).
    #[error("an mqtts:// broker needs {section} ca_file")]
    MissingCa { section: String },
    /// The TLS client could not be set up from the configured files.
    #[error("{0}")]
    Tls(String),
    /// rumqttc's request queue did not take the SUBSCRIBE.
    #[error("cannot queue the SUBSCRIBE for [mqtt] topics: {0}")]
    Subscribe(String),
    /// The SUBACK refused a filter, or granted it only at QoS 0.
    #[error(
        "the broker did not grant the subscription to {topic:?} at QoS 1: {why}; check [mqtt] \
         topics and the broker's ACL for this client"
    )]
    NotGranted { topic: String, why: String },
    /// A CONNACK with a failure code (its name as the client library spells it).
    #[error("broker refused the connection: {code}")]
    Refused { code: String },
    /// The connection broke or could not be made (the client library's words).
    #[error("{0}")]
    Lost(String),
    /// rumqttc's request queue did not take a PUBLISH.
    #[error("cannot queue a PUBLISH: {0}")]
    Queue(String),
    /// A sink's connection attempt failed.
    #[error("connecting to {broker}: {why}")]
    Connect { broker: String, why: String },
    /// A sink's connection ended before its CONNACK.
    #[error("connecting to {broker}: no CONNACK before the connection ended")]
    NoConnAck { broker: String },
    /// `publish_all` lost its connection.
    #[error("publishing to {broker}: {why}")]
    Publish { broker: String, why: String },
}

/// Why a subscription granted at QoS 0 is as bad as a refused one.
pub(crate) const QOS0: &str = "granted only at QoS 0, whose deliveries carry no \
                               acknowledgement: the broker would drop what replay-guard never \
                               committed; allow QoS 1 for it";

/// How many receive windows of deliveries may await their commit before the poll loop stops
/// reading. Not one: a session resumed after a reconnect is redelivered past the window
/// (Mosquitto resends its queue too), and rumqttc checks the keep-alive only when its buffer
/// of up to 10 read packets is empty, so a loop that stalls with packets buffered goes a
/// keep-alive without a ping answered and loses the connection (seen with three members on a
/// loaded PostgreSQL: a redelivery, a stall and a lost connection every 12 s).
const STALL_WINDOWS: usize = 4;

/// How long to wait between connection attempts: doubling from `initial`, capped at `max`.
pub fn backoff(initial: Duration, max: Duration, failures: u32) -> Duration {
    initial
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(max)
}

/// The `[mqtt]` settings the rules depend on.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// How many brokers the config lists (at least one), tried in order, wrapping.
    pub brokers: usize,
    pub retries_per_broker: u32,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub keep_alive: Duration,
    pub receive_maximum: u16,
    pub topics: Vec<String>,
}

/// What happened on the feed's connection, as the driver saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Input {
    /// A CONNACK that accepted the connection.
    ConnAck { session_present: bool },
    /// The connection is gone or was never made: an I/O error, a refused CONNACK
    /// (`TransportError::Refused`), a protocol error. `stopping`: `disconnect()` was asked.
    Lost {
        error: TransportError,
        stopping: bool,
    },
    /// The client for broker `to` is ready (after [`Action::Prepare`]).
    Switched { to: usize },
    /// The SUBACK's codes, per filter in `topics` order: `None` if granted at QoS 1 or 2,
    /// else why not.
    SubAck(Vec<Option<String>>),
    /// A PUBLISH read by a poll that started on connection `generation`.
    Publish { generation: u64 },
    /// The client reports its DISCONNECT as queued. `stopping`: `disconnect()` was asked.
    DisconnectSent { stopping: bool },
}

/// What the driver does next, in the order returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Queue one SUBSCRIBE for every topic; if it cannot be queued, report that as fatal.
    Subscribe,
    /// Tell the service. If nobody listens any more the loop ends, except after a
    /// `Failover` (best effort: the reconnect goes on).
    Report(Report),
    /// Build the client for broker `broker`; once it is in place, feed `Input::Switched`.
    /// If it cannot be built, log it and stay on the current broker.
    Prepare { broker: usize },
    /// Wait this long before the next poll (a reconnect attempt), unless stopping: then
    /// report `Closed` and end.
    Wait(Duration),
    /// Hand the delivery to the service (it counts in the backlog).
    Deliver,
    /// Drop the delivery: a leftover of a broken connection, which the broker redelivers.
    DropLeftover,
    /// rumqttc disconnected on its own after a protocol error: warn, and poll on (the next
    /// poll reconnects).
    ProtocolDisconnect,
    /// Report `Closed` and end; with `drain`, first poll the connection until the broker
    /// closes it (or a short while) so the DISCONNECT and the acks ahead of it are written.
    Close { drain: bool },
}

/// News for the service; brokers by their index in the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Report {
    Connected {
        broker: usize,
        session_present: bool,
    },
    Disconnected {
        broker: usize,
        error: TransportError,
    },
    Subscribed {
        broker: usize,
        filters: usize,
    },
    Failover {
        from: usize,
        to: usize,
    },
    /// The broker will not serve this configuration: `run` must stop with this message.
    Fatal(TransportError),
}

/// The feed connection's state.
#[derive(Debug)]
pub(crate) struct Session {
    plan: Plan,
    broker: usize,
    /// Failures on the current broker (for failover).
    failures: u32,
    /// Failures since the last CONNACK (for backoff): a failover does not reset it, so
    /// `retries_per_broker = 0` cannot make a tight loop.
    attempts: u32,
    /// Between a connection error and the next CONNACK no delivery is genuine: a PUBLISH
    /// then is a leftover of the broken connection.
    connected: bool,
    /// Bumped by every lost connection; an ack carries the generation it arrived on.
    generation: u64,
}

impl Session {
    /// A session on the first broker, not connected yet, generation 0.
    pub(crate) fn new(plan: Plan) -> Session {
        Session {
            plan,
            broker: 0,
            failures: 0,
            attempts: 0,
            connected: false,
            generation: 0,
        }
    }

    /// The index of the broker the client is for.
    pub(crate) fn broker(&self) -> usize {
        self.broker
    }

    /// The current connection's generation: only its acks may be sent.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The backlog of deliveries awaiting their commit at which reading stops.
    pub(crate) fn stall_limit(&self) -> usize {
        usize::from(self.plan.receive_maximum) * STALL_WINDOWS
    }

    /// Whether to wait for room before reading more. A stopping transport reads on (its
    /// DISCONNECT must get out).
    pub(crate) fn must_wait_for_room(&self, backlog: usize, stopping: bool) -> bool {
        backlog >= self.stall_limit() && !stopping
    }

    /// The longest wait for room: rumqttc sends PINGREQ and reads PINGRESP only inside
    /// `poll`, and a commit slower than the keep-alive (a loaded PostgreSQL, members queued on
    /// its lock) must not cost the connection, or the broker redelivers the whole window and
    /// the next commit is as slow again.
    pub(crate) fn longest_stall(&self) -> Duration {
        self.plan.keep_alive / 2
    }

    /// What to do about `input`.
    pub(crate) fn handle(&mut self, input: Input) -> Vec<Action> {
        match input {
            Input::Lost { error, stopping } => self.lost(error, stopping),
            Input::ConnAck { session_present } => {
                self.failures = 0;
                self.attempts = 0;
                self.connected = true;
                // On every connect, session or not: a kept session may predate a change of
                // `topics`, or lack a subscription the broker refused before, and would
                // otherwise leave us receiving nothing on it without a word.
                vec![
                    Action::Subscribe,
                    Action::Report(Report::Connected {
                        broker: self.broker,
                        session_present,
                    }),
                ]
            }
            Input::Switched { to } => {
                let from = self.broker;
                self.broker = to;
                self.failures = 0;
                vec![Action::Report(Report::Failover { from, to })]
            }
            // A refusal keeps the loop polling: the service drains (commits, acks,
            // DISCONNECT) and stops.
            Input::SubAck(codes) => match suback_problem(&codes, &self.plan.topics) {
                Some(problem) => vec![Action::Report(Report::Fatal(problem))],
                None => vec![Action::Report(Report::Subscribed {
                    broker: self.broker,
                    filters: codes.len(),
                })],
            },
            Input::Publish { generation } => {
                if self.connected && generation == self.generation {
                    vec![Action::Deliver]
                } else {
                    vec![Action::DropLeftover]
                }
            }
            Input::DisconnectSent { stopping: true } => vec![Action::Close { drain: true }],
            Input::DisconnectSent { stopping: false } => vec![Action::ProtocolDisconnect],
        }
    }

    fn lost(&mut self, error: TransportError, stopping: bool) -> Vec<Action> {
        // Before anything else: from here on no ack of the broken connection goes out.
        self.generation += 1;
        self.connected = false;
        if stopping {
            return vec![Action::Close { drain: false }];
        }
        self.failures = self.failures.saturating_add(1);
        self.attempts = self.attempts.saturating_add(1);
        let mut actions = vec![Action::Report(Report::Disconnected {
            broker: self.broker,
            error,
        })];
        if self.failures > self.plan.retries_per_broker && self.plan.brokers > 1 {
            actions.push(Action::Prepare {
                broker: (self.broker + 1) % self.plan.brokers,
            });
        }
        // Every reconnect attempt, to the same broker or the next, waits first.
        actions.push(Action::Wait(backoff(
            self.plan.backoff_initial,
            self.plan.backoff_max,
            self.attempts,
        )));
        actions
    }
}

/// The error for a SUBACK that refused (or downgraded) some of `topics`, if any.
fn suback_problem(codes: &[Option<String>], topics: &[String]) -> Option<TransportError> {
    let (i, why) = codes
        .iter()
        .enumerate()
        .find_map(|(i, c)| c.as_ref().map(|why| (i, why)))?;
    let topic = topics.get(i).map_or("?", String::as_str);
    Some(TransportError::NotGranted {
        topic: topic.to_string(),
        why: why.clone(),
    })
}

/// An acknowledgement that knows the connection its delivery arrived on.
pub(crate) trait Stamped {
    fn generation(&self) -> u64;
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

/// PUBACKs of committed deliveries that did not fit in the client's request queue yet, in
/// delivery order: queued as it drains, never dropped unless stale (a dropped PUBACK leaves the
/// message in flight at the broker until a reconnect, and a broker whose in-flight window is
/// full of them stops delivering). One of an earlier connection is never sent: rumqttc drops
/// PUBACKs still queued when a connection breaks, and an old packet id on a new, session-less
/// connection could acknowledge a message we never committed; the broker redelivers instead.
///
/// `send` is the driver's non-blocking attempt to queue one PUBACK: false when the queue is
/// full.
#[derive(Debug)]
pub(crate) struct AckQueue<T> {
    pending: VecDeque<T>,
}

impl<T: Stamped> AckQueue<T> {
    pub(crate) fn new() -> AckQueue<T> {
        AckQueue {
            pending: VecDeque::new(),
        }
    }

    /// Sends the acks of `tokens` of connection `current`, in order, after any still deferred;
    /// defers what does not fit and drops what is stale.
    pub(crate) fn ack(
        &mut self,
        tokens: impl IntoIterator<Item = T>,
        current: u64,
        mut send: impl FnMut(&T) -> bool,
    ) -> AckStats {
        let mut stats = AckStats::default();
        self.flush(current, &mut send);
        for t in tokens {
            if t.generation() != current {
                stats.stale += 1;
                continue;
            }
            if self.pending.is_empty() && send(&t) {
                stats.sent += 1;
            } else {
                stats.deferred += 1;
                self.pending.push_back(t);
            }
        }
        stats
    }

    /// Sends deferred acks, oldest first, until the queue is full again; drops those of an
    /// earlier connection.
    pub(crate) fn flush(&mut self, current: u64, mut send: impl FnMut(&T) -> bool) {
        while let Some(t) = self.pending.front() {
            if t.generation() != current {
                self.pending.pop_front();
                continue;
            }
            if !send(t) {
                return;
            }
            self.pending.pop_front();
        }
    }

    /// Shutdown: the deferred acks that fit go out before the DISCONNECT, which ends the
    /// connection (the session is kept; the broker redelivers what stays unacknowledged).
    pub(crate) fn disconnect(
        &mut self,
        current: u64,
        send: impl FnMut(&T) -> bool,
        disconnect: impl FnOnce(),
    ) {
        self.flush(current, send);
        disconnect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(brokers: usize, retries_per_broker: u32) -> Plan {
        Plan {
            brokers,
            retries_per_broker,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_millis(1000),
            keep_alive: Duration::from_secs(30),
            receive_maximum: 10,
            topics: vec!["feed/a".into(), "feed/b".into()],
        }
    }

    fn lost(s: &mut Session) -> Vec<Action> {
        s.handle(Input::Lost {
            error: TransportError::Lost("connection reset".into()),
            stopping: false,
        })
    }

    /// Loses the connection; switches if told to prepare; returns the wait.
    fn fail(s: &mut Session) -> Duration {
        let mut wait = None;
        for a in lost(s) {
            match a {
                Action::Prepare { broker } => {
                    s.handle(Input::Switched { to: broker });
                }
                Action::Wait(d) => wait = Some(d),
                _ => {}
            }
        }
        wait.expect("a lost connection waits before reconnecting")
    }

    fn connack(s: &mut Session) -> Vec<Action> {
        s.handle(Input::ConnAck {
            session_present: true,
        })
    }

    #[test]
    fn a_lost_connection_is_reported_at_its_broker_then_waits_before_reconnecting() {
        let mut s = Session::new(plan(2, 3));
        connack(&mut s);
        assert_eq!(
            lost(&mut s),
            vec![
                Action::Report(Report::Disconnected {
                    broker: 0,
                    error: TransportError::Lost("connection reset".into()),
                }),
                Action::Wait(Duration::from_millis(100)),
            ]
        );
    }

    #[test]
    fn failover_moves_to_the_next_broker_after_the_retries_of_one() {
        let mut s = Session::new(plan(3, 2));
        for _ in 0..2 {
            assert!(!lost(&mut s).contains(&Action::Prepare { broker: 1 }));
        }
        let third = lost(&mut s);
        assert!(third.contains(&Action::Prepare { broker: 1 }), "{third:?}");
        assert_eq!(
            s.handle(Input::Switched { to: 1 }),
            vec![Action::Report(Report::Failover { from: 0, to: 1 })]
        );
        assert_eq!(s.broker(), 1);
        // The count starts again on the new broker, and the last one wraps to the first.
        for _ in 0..3 {
            fail(&mut s);
        }
        assert_eq!(s.broker(), 2);
        for _ in 0..3 {
            fail(&mut s);
        }
        assert_eq!(s.broker(), 0);
    }

    #[test]
    fn a_broker_that_cannot_be_prepared_is_asked_for_again_at_the_next_failure() {
        let mut s = Session::new(plan(2, 0));
        assert!(lost(&mut s).contains(&Action::Prepare { broker: 1 }));
        // No `Switched`: the client for broker 1 could not be built.
        assert_eq!(s.broker(), 0);
        assert!(lost(&mut s).contains(&Action::Prepare { broker: 1 }));
    }

    #[test]
    fn a_single_broker_is_retried_forever_without_failover() {
        let mut s = Session::new(plan(1, 0));
        for _ in 0..20 {
            assert!(
                !lost(&mut s)
                    .iter()
                    .any(|a| matches!(a, Action::Prepare { .. }))
            );
        }
        assert_eq!(s.broker(), 0);
    }

    #[test]
    fn a_good_connection_resets_the_retries_of_its_broker() {
        let mut s = Session::new(plan(2, 1));
        fail(&mut s);
        connack(&mut s);
        // One failure after the CONNACK is the first again: no failover yet.
        fail(&mut s);
        assert_eq!(s.broker(), 0);
        fail(&mut s);
        assert_eq!(s.broker(), 1);
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets_after_a_good_connection() {
        let mut s = Session::new(plan(1, 0));
        let waits: Vec<u64> = (0..6).map(|_| fail(&mut s).as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        connack(&mut s);
        assert_eq!(fail(&mut s), Duration::from_millis(100));
    }

    #[test]
    fn backoff_keeps_growing_across_a_failover_even_with_zero_retries_per_broker() {
        let mut s = Session::new(plan(2, 0));
        let waits: Vec<u64> = (0..4).map(|_| fail(&mut s).as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800]);
        assert_eq!(s.broker(), 0, "four switches between two brokers");
    }

    #[test]
    fn backoff_never_overflows() {
        assert_eq!(
            backoff(Duration::from_secs(1), Duration::MAX, u32::MAX),
            Duration::from_secs(1 << 16)
        );
        assert_eq!(
            backoff(Duration::from_secs(1), Duration::MAX, 0),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn every_lost_connection_starts_a_new_generation() {
        let mut s = Session::new(plan(2, 0));
        assert_eq!(s.generation(), 0);
        fail(&mut s);
        assert_eq!(s.generation(), 1);
        s.handle(Input::Lost {
            error: TransportError::Refused {
                code: "NotAuthorized".into(),
            },
            stopping: false,
        });
        assert_eq!(s.generation(), 2);
        s.handle(Input::Lost {
            error: TransportError::Lost("eof".into()),
            stopping: true,
        });
        assert_eq!(s.generation(), 3, "a loss while stopping counts too");
    }

    #[test]
    fn a_delivery_read_before_the_reconnect_is_dropped() {
        let mut s = Session::new(plan(1, 0));
        connack(&mut s);
        let old = s.generation();
        assert_eq!(
            s.handle(Input::Publish { generation: old }),
            vec![Action::Deliver]
        );
        fail(&mut s);
        // Between the loss and the next CONNACK nothing is genuine, whatever its generation.
        let now = s.generation();
        assert_eq!(
            s.handle(Input::Publish { generation: now }),
            vec![Action::DropLeftover]
        );
        connack(&mut s);
        assert_eq!(
            s.handle(Input::Publish { generation: old }),
            vec![Action::DropLeftover]
        );
        assert_eq!(
            s.handle(Input::Publish { generation: now }),
            vec![Action::Deliver]
        );
    }

    #[test]
    fn every_connack_subscribes_before_reporting_connected() {
        let mut s = Session::new(plan(1, 0));
        for session_present in [false, true] {
            assert_eq!(
                s.handle(Input::ConnAck { session_present }),
                vec![
                    Action::Subscribe,
                    Action::Report(Report::Connected {
                        broker: 0,
                        session_present
                    }),
                ]
            );
        }
    }

    #[test]
    fn subscribed_is_emitted_only_after_a_good_suback() {
        let mut s = Session::new(plan(1, 0));
        let actions = connack(&mut s);
        assert!(
            !actions
                .iter()
                .any(|a| matches!(a, Action::Report(Report::Subscribed { .. })))
        );
        assert_eq!(
            s.handle(Input::SubAck(vec![None, None])),
            vec![Action::Report(Report::Subscribed {
                broker: 0,
                filters: 2
            })]
        );
        let refused = s.handle(Input::SubAck(vec![None, Some("refused (Failure)".into())]));
        assert!(matches!(
            refused.as_slice(),
            [Action::Report(Report::Fatal(_))]
        ));
    }

    #[test]
    fn a_refused_subscription_stops_with_the_topic_named() {
        let mut s = Session::new(plan(1, 0));
        connack(&mut s);
        let actions = s.handle(Input::SubAck(vec![None, Some("refused (Failure)".into())]));
        let [Action::Report(Report::Fatal(e))] = actions.as_slice() else {
            panic!("{actions:?}")
        };
        assert_eq!(
            e.to_string(),
            "the broker did not grant the subscription to \"feed/b\" at QoS 1: refused \
             (Failure); check [mqtt] topics and the broker's ACL for this client"
        );
    }

    #[test]
    fn a_subscription_granted_at_qos_0_is_refused_too() {
        let mut s = Session::new(plan(1, 0));
        let actions = s.handle(Input::SubAck(vec![Some(QOS0.into()), None]));
        let [Action::Report(Report::Fatal(e))] = actions.as_slice() else {
            panic!("{actions:?}")
        };
        let text = e.to_string();
        assert!(text.contains("\"feed/a\""), "{text}");
        assert!(text.contains("allow QoS 1 for it"), "{text}");
    }

    #[test]
    fn a_stopping_transport_closes_instead_of_reconnecting() {
        let mut s = Session::new(plan(2, 0));
        connack(&mut s);
        assert_eq!(
            s.handle(Input::Lost {
                error: TransportError::Lost("eof".into()),
                stopping: true,
            }),
            vec![Action::Close { drain: false }]
        );
        assert_eq!(
            s.handle(Input::DisconnectSent { stopping: true }),
            vec![Action::Close { drain: true }]
        );
        assert_eq!(
            s.handle(Input::DisconnectSent { stopping: false }),
            vec![Action::ProtocolDisconnect]
        );
    }

    #[test]
    fn reading_stalls_at_the_backlog_limit_but_not_while_stopping() {
        let s = Session::new(plan(1, 0));
        assert_eq!(s.stall_limit(), 40);
        assert!(!s.must_wait_for_room(39, false));
        assert!(s.must_wait_for_room(40, false));
        assert!(!s.must_wait_for_room(400, true));
        assert_eq!(s.longest_stall(), Duration::from_secs(15));
    }

    /// An ack of delivery `id` on connection `generation`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct Ack {
        generation: u64,
        id: u32,
    }

    impl Stamped for Ack {
        fn generation(&self) -> u64 {
            self.generation
        }
    }

    fn acks(generation: u64, ids: std::ops::Range<u32>) -> Vec<Ack> {
        ids.map(|id| Ack { generation, id }).collect()
    }

    /// A request queue with `room` free places, recording what was queued.
    fn queue(room: &mut usize, sent: &mut Vec<u32>) -> impl FnMut(&Ack) -> bool {
        move |a| {
            if *room == 0 {
                return false;
            }
            *room -= 1;
            sent.push(a.id);
            true
        }
    }

    #[test]
    fn an_ack_of_an_older_generation_is_never_sent_on_a_new_connection() {
        let mut s = Session::new(plan(1, 0));
        let mut q = AckQueue::new();
        let (mut room, mut sent) = (1, Vec::new());
        // Two of generation 0 committed while the queue had room for one: one deferred.
        let stats = q.ack(acks(0, 0..2), s.generation(), queue(&mut room, &mut sent));
        assert_eq!((stats.sent, stats.deferred), (1, 1));
        fail(&mut s);
        connack(&mut s);
        let (mut room, mut sent) = (10, Vec::new());
        q.flush(s.generation(), queue(&mut room, &mut sent));
        let stats = q.ack(
            [acks(0, 2..3), acks(1, 3..4)].concat(),
            s.generation(),
            queue(&mut room, &mut sent),
        );
        assert_eq!(
            sent,
            [3],
            "neither the deferred nor the late ack of generation 0"
        );
        assert_eq!(stats.stale, 1);
    }

    #[test]
    fn acks_keep_delivery_order_behind_deferred_ones() {
        let mut q = AckQueue::new();
        let (mut room, mut sent) = (2, Vec::new());
        let stats = q.ack(acks(0, 0..4), 0, queue(&mut room, &mut sent));
        assert_eq!(
            stats,
            AckStats {
                sent: 2,
                stale: 0,
                deferred: 2
            }
        );
        // Room again: the next call sends the deferred ones first, and nothing jumps ahead.
        let (mut room, mut later) = (3, Vec::new());
        let stats = q.ack(acks(0, 4..6), 0, queue(&mut room, &mut later));
        assert_eq!(later, [2, 3, 4]);
        assert_eq!((stats.sent, stats.deferred), (1, 1));
    }

    #[test]
    fn deferred_acks_are_flushed_before_disconnect() {
        let mut q = AckQueue::new();
        let (mut room, mut sent) = (0, Vec::new());
        q.ack(acks(0, 0..3), 0, queue(&mut room, &mut sent));
        let order = std::cell::RefCell::new(Vec::new());
        q.disconnect(
            0,
            |a| {
                order.borrow_mut().push(format!("PUBACK {}", a.id));
                true
            },
            || order.borrow_mut().push("DISCONNECT".into()),
        );
        assert_eq!(
            order.into_inner(),
            ["PUBACK 0", "PUBACK 1", "PUBACK 2", "DISCONNECT"]
        );
    }

    #[test]
    fn deferred_acks_of_a_broken_connection_are_dropped_at_disconnect() {
        let mut q = AckQueue::new();
        let (mut room, mut sent) = (0, Vec::new());
        q.ack(acks(0, 0..2), 0, queue(&mut room, &mut sent));
        let (mut room, mut sent) = (10, Vec::new());
        let mut disconnected = false;
        q.disconnect(1, queue(&mut room, &mut sent), || disconnected = true);
        assert!(sent.is_empty());
        assert!(disconnected);
    }
}
