//! A relay sink's rules, sans-IO: backoff with jitter, when a refused event is parked or
//! blocks the sink, a windowed sink's events in flight across batches, how the outcome of a
//! cursor write is adopted, whether a sink's own cursor is taken over, and the status it
//! reports. No tokio, no store or sink calls, no clock:
//! `runner`'s tasks do the I/O and follow what these say; time and the seed are passed in.

use std::fmt;
use std::time::Duration;

use super::{CursorAfter, Event, Failure};
use crate::store::relay::CursorWrite;
use crate::store::tables::{ParkedRecord, SinkRecord};

/// How a sink's last error starts when the sink is failing: its task ended and is being
/// restarted (`relay status`, `health` and the metrics read it from the cursor record).
pub const FAILING: &str = "failing: ";
/// How a sink's last error starts when every event is refused the same way and the sink is
/// held at the first of them instead of parking the feed.
pub const BLOCKED: &str = "blocked: ";

/// Longest a parked event's reason and response are kept, in characters.
const REASON_MAX: usize = 1024;
const RESPONSE_MAX: usize = 2048;

/// What a sink is doing, as the service reports it (sd_notify STATUS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Starting,
    Connecting,
    Delivering,
    Idle,
    Retrying,
    Blocked,
    Standby,
    Failing,
    Stopped,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Connecting => "connecting",
            Phase::Delivering => "delivering",
            Phase::Idle => "idle",
            Phase::Retrying => "retrying",
            Phase::Blocked => "blocked",
            Phase::Standby => "standby",
            Phase::Failing => "failing",
            Phase::Stopped => "stopped",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One sink as the service reports it (sd_notify STATUS, logs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkStatus {
    pub name: String,
    pub state: Phase,
    /// The first effect offset not yet delivered or parked.
    pub next: u64,
    /// The next effect offset the log will write, as last read.
    pub head: u64,
    /// When the effect at `next` was received (ms since the epoch), as last read; `None`
    /// when caught up or not read yet.
    pub oldest_ms: Option<u64>,
    pub last_error: Option<String>,
}

impl SinkStatus {
    pub fn new(name: &str) -> SinkStatus {
        SinkStatus {
            name: name.to_string(),
            state: Phase::Starting,
            next: 0,
            head: 0,
            oldest_ms: None,
            last_error: None,
        }
    }

    /// Events behind the log's head (`relay status`'s `lag_events`).
    pub fn lag(&self) -> u64 {
        self.head.saturating_sub(self.next)
    }

    /// Age in seconds of the oldest undelivered effect at `now_ms` (`relay status`'s
    /// `lag_seconds`), when behind and known.
    pub fn age_s(&self, now_ms: u64) -> Option<u64> {
        if self.lag() == 0 {
            return None;
        }
        self.oldest_ms.map(|t| now_ms.saturating_sub(t) / 1000)
    }

    /// The sink enters `state` with its cursor at `next`; `error` replaces the last one when
    /// given, and an idle sink has none. A cursor that moved makes the age unknown until the
    /// next `read_lag`.
    pub fn enter(&mut self, state: Phase, next: u64, error: Option<String>) {
        self.state = state;
        if next != self.next {
            self.oldest_ms = None;
        }
        self.next = next;
        if error.is_some() || state == Phase::Idle {
            self.last_error = error;
        }
    }

    /// What the log says of the sink's lag: the head, and when the effect at the cursor was
    /// received (`None`: caught up, or the effect is gone).
    pub fn read_lag(&mut self, next: u64, head: u64, oldest_ms: Option<u64>) {
        self.next = next;
        self.head = head;
        self.oldest_ms = oldest_ms;
    }

    /// `NAME lag=N STATE`, with ` age=Ss` after the lag when the sink is behind and the age
    /// of its oldest undelivered effect is known.
    pub fn line(&self, now_ms: u64) -> String {
        match self.age_s(now_ms) {
            Some(age) => format!("{} lag={} age={age}s {}", self.name, self.lag(), self.state),
            None => format!("{} lag={} {}", self.name, self.lag(), self.state),
        }
    }
}

/// The wait before attempt `failures + 1` at most: `initial` doubled per failure, capped at
/// `max`.
pub fn backoff_cap(initial: Duration, max: Duration, failures: u32) -> Duration {
    initial.saturating_mul(1u32 << failures.min(20)).min(max)
}

/// Full jitter (uniform in [0, cap]) from a xorshift generator: sinks seeded differently do
/// not retry in step.
#[derive(Clone, Debug)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from the sink's name and a time in nanoseconds (the caller's clock).
    pub fn seeded(name: &str, nanos: u64) -> Jitter {
        let h = crate::key::sha256(&[name.as_bytes(), &nanos.to_le_bytes()]);
        Jitter(u64::from_le_bytes(h[..8].try_into().unwrap_or([1; 8])) | 1)
    }

    /// A wait uniform in [0, cap], to the millisecond.
    pub fn full(&mut self, cap: Duration) -> Duration {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let ms = cap.as_millis() as u64;
        Duration::from_millis(if ms == 0 { 0 } else { self.0 % (ms + 1) })
    }

    /// The wait after `failures` failed attempts: full jitter under `backoff_cap`, at least
    /// the receiver's own wish (`after`).
    pub fn backoff(
        &mut self,
        initial: Duration,
        max: Duration,
        failures: u32,
        after: Option<Duration>,
    ) -> Duration {
        self.full(backoff_cap(initial, max, failures))
            .max(after.unwrap_or_default())
    }
}

/// The state `relay status` (and the report) gives a sink, from what the database tells:
/// `removed` (a cursor no config names), `failing` or `blocked` (its last error says so, or
/// a blocking event holds its cursor), `retrying` (behind, the last attempt failed),
/// `parked` (events parked for an operator: they never reached the receiver), `caught_up`
/// (at the head with nothing parked), else `behind`. Only `caught_up` means every event up to
/// the head reached the receiver or was passed over by an audited action.
pub fn reported(
    rec: &SinkRecord,
    head: u64,
    blocked: bool,
    parked: u64,
    configured: bool,
) -> &'static str {
    let condition = rec
        .last_error
        .as_ref()
        .and_then(|(_, e)| super::condition(e));
    if !configured {
        "removed"
    } else if let Some(c) = condition {
        c
    } else if blocked {
        "blocked"
    } else if rec.next < head && rec.last_error.is_some() {
        "retrying"
    } else if parked > 0 {
        "parked"
    } else if rec.next >= head {
        "caught_up"
    } else {
        "behind"
    }
}

/// An event refused and parked: its offset and its source (agency, source id).
type Refusal = (u64, (String, String));

/// A sink's delivery state between I/O: its cursor as written and as delivered, the events
/// parked since the last write, and what the run of failures so far says.
#[derive(Clone, Debug)]
pub struct SinkState {
    /// `on_poison = "block"`: a parked event holds the cursor.
    blocking_parks: bool,
    /// The cursor as last written (or read).
    rec: Option<SinkRecord>,
    /// Delivered or parked up to here (ahead of `rec.next` until the next write).
    next: u64,
    /// Parked since the last write (written with it).
    parked: Vec<(u64, ParkedRecord)>,
    /// Failed attempts at the batch since it last made progress.
    failures: u32,
    /// The events refused with one class (`Failure::Refused`) and parked one after the other,
    /// while nothing has been delivered since: the class, and each event's offset and source.
    refusals: Option<(String, Vec<Refusal>)>,
    /// The class of refusal that refuses every event: the sink is blocked until an attempt
    /// delivers something.
    blocked: Option<String>,
}

/// What to do after a delivery attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Go on with the rest of the batch.
    Go,
    /// The failure names no event of the batch: end the batch.
    End,
    /// Wait (`Jitter::backoff` for `failures`, at least `after`), noting `error` and showing
    /// `state`, then try the rest of the batch again.
    BackOff {
        failures: u32,
        after: Option<Duration>,
        error: String,
        state: Phase,
    },
    /// Park the event at the front of the rest (`SinkState::park`).
    Park(Park),
    /// The receiver refuses every event: take back the events parked for it and block.
    Block(Block),
}

/// A delivery attempt as the state saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempted {
    /// Events delivered from the front of the rest of the batch.
    pub delivered: usize,
    /// The class of refusal that blocked the sink, when this attempt delivered again.
    pub unblocked: Option<String>,
    pub step: Step,
}

/// An event to park: refused for good, or refused with a class not (yet) seen to refuse
/// every event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Park {
    pub offset: u64,
    pub reason: String,
    pub response: String,
    /// Attempts made at the event, the refused one included.
    pub attempts: u64,
    /// `on_poison = "block"`: the cursor waits at the event.
    pub blocking: bool,
    /// The run of refusals of one class this park extends, held once the sink goes past it.
    run: Option<(String, Vec<Refusal>)>,
    /// The cursor's generation the refused attempt was made in: the park belongs to it.
    generation: Option<u64>,
}

/// What `SinkState::park` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parking {
    /// Parked; the cursor goes past it.
    GoesPast,
    /// Parked with `on_poison = "block"`: the cursor waits at it.
    Blocks,
    /// Not parked: the cursor was moved (an operator's rewind or skip, adopted) after the
    /// attempt that refused the event, so the event is not where the cursor is, and nothing
    /// of that attempt may move the new cursor. Delivery goes on from the new cursor.
    Moved,
}

/// The same class of refusal met an event right after events of another source were
/// parked for it one after the other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub class: String,
    pub reason: String,
    /// The event refused last.
    pub offset: u64,
    pub source: (String, String),
    /// A source of the parked run other than `source`.
    pub other: (String, String),
    /// The stretch to take back (`from..to`, up to `offset`): the events parked for this
    /// refusal, and what lies between them unoffered; the cursor returns to `from`.
    pub take_back: Option<(u64, u64)>,
    /// How many events were parked for this refusal before it.
    pub parked_run: usize,
}

impl Block {
    /// The sink's last error once it waits at offset `at`.
    /// `taken_back`: whether the events parked for it went back (else they stay parked).
    pub fn error(&self, at: u64, taken_back: bool) -> String {
        let parked = if taken_back || self.parked_run == 0 {
            "nothing is parked".to_string()
        } else {
            format!(
                "the {} events refused before it stay parked (`relay parked`, then `relay \
                 retry`)",
                self.parked_run
            )
        };
        format!(
            "{BLOCKED}{}; events of different sources ({}/{} and {}/{}, up to offset {}) \
             were refused the same way, so the receiver refuses every event: {parked}, the \
             sink waits at offset {at} and keeps trying; fix the receiver",
            self.reason, self.other.0, self.other.1, self.source.0, self.source.1, self.offset
        )
    }
}

/// How a cursor write's outcome was adopted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adopted {
    /// Written as this sink meant.
    Written,
    /// An operator moved the cursor meanwhile: delivery goes on from `next`.
    MovedByOperator { next: u64, generation: u64 },
    /// The sink's cursor was forgotten: the sink registers again.
    Forgotten,
    /// The outcome of a write of an older generation than the one already followed (a
    /// windowed sink's cursor write ran beside an operator's move that was seen first):
    /// nothing changes.
    Stale,
}

/// Whether the cursor is to be written now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FlushDue {
    /// No cursor is held: register the sink (which reads it).
    Register,
    Nothing,
    /// Move the cursor of `generation` from `from` to `to`, with the parked events.
    Write {
        generation: u64,
        from: u64,
        to: u64,
    },
}

/// What a retried parked event's failed delivery means.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retried {
    /// Transient: the request stands and is tried again on the next round.
    NotYet(String),
    /// Refused again (or not delivered): it stays parked, this kept as its last response.
    Refused(String),
}

impl Retried {
    pub fn of(failure: Option<Failure>) -> Retried {
        match failure {
            Some(
                Failure::Poison { reason, response }
                | Failure::Refused {
                    reason, response, ..
                },
            ) => Retried::Refused(format!("{reason}: {response}")),
            Some(Failure::Retry { error, .. }) => Retried::NotYet(error),
            None => Retried::Refused("not delivered".into()),
        }
    }
}

impl SinkState {
    pub fn new(blocking_parks: bool) -> SinkState {
        SinkState {
            blocking_parks,
            rec: None,
            next: 0,
            parked: Vec::new(),
            failures: 0,
            refusals: None,
            blocked: None,
        }
    }

    pub fn rec(&self) -> Option<&SinkRecord> {
        self.rec.as_ref()
    }

    pub fn generation(&self) -> Option<u64> {
        self.rec.as_ref().map(|r| r.generation)
    }

    pub fn next(&self) -> u64 {
        self.next
    }

    pub fn has_parked(&self) -> bool {
        !self.parked.is_empty()
    }

    /// The cursor was read as `rec` (the sink registered): what was held in memory about
    /// the cursor's past is derived again.
    pub fn registered(&mut self, rec: SinkRecord) {
        self.forget_progress();
        self.next = rec.next;
        self.rec = Some(rec);
    }

    /// Another member holds the sink: nothing of the cursor is this sink's any more.
    pub fn stand_by(&mut self) {
        self.rec = None;
        self.forget_progress();
    }

    /// Forgets parks not yet written, a run of refusals and a block: after the cursor is
    /// read anew, all of it is derived again.
    pub fn forget_progress(&mut self) {
        self.parked.clear();
        self.refusals = None;
        self.blocked = None;
    }

    /// Whether a class of refusal blocks the sink now.
    pub fn is_blocked(&self) -> bool {
        self.blocked.is_some()
    }

    /// A batch starts: no failed attempt at it yet.
    pub fn begin_batch(&mut self) {
        self.failures = 0;
    }

    /// A delivery moved the cursor (a retried blocking event, delivered) to `next`.
    pub fn advance_to(&mut self, next: u64) {
        self.next = self.next.max(next);
    }

    /// An attempt at `rest` (the batch from the first event not yet delivered or parked)
    /// delivered `delivered` events from its front and then met `failure`.
    pub fn attempt(
        &mut self,
        rest: &[Event],
        delivered: usize,
        failure: Option<Failure>,
    ) -> Attempted {
        let delivered = delivered.min(rest.len());
        let mut unblocked = None;
        if let Some(last) = delivered.checked_sub(1).and_then(|k| rest.get(k)) {
            // Never backwards: a cursor moves only forward over what was delivered.
            self.next = self.next.max(last.offset + 1);
            self.failures = 0;
            self.refusals = None;
            unblocked = self.blocked.take();
        }
        let left = &rest[delivered..];
        let step = match failure {
            None if !left.is_empty() && delivered == 0 => {
                // A sink that delivers nothing and says nothing: treat as a retry.
                self.back_off(None, "the sink delivered nothing".into(), Phase::Retrying)
            }
            None => Step::Go,
            Some(Failure::Retry { error, after }) => self.back_off(after, error, Phase::Retrying),
            Some(Failure::Poison { reason, response }) => {
                self.refusals = None;
                match left.first() {
                    Some(ev) => self.to_park(ev, reason, response, None),
                    None => Step::End,
                }
            }
            Some(Failure::Refused {
                class,
                reason,
                response,
            }) => match left.first() {
                Some(ev) => self.refused(ev, class, reason, response),
                None => Step::End,
            },
        };
        Attempted {
            delivered,
            unblocked,
            step,
        }
    }

    fn back_off(&mut self, after: Option<Duration>, error: String, state: Phase) -> Step {
        self.failures += 1;
        Step::BackOff {
            failures: self.failures,
            after,
            error,
            state,
        }
    }

    fn to_park(
        &self,
        ev: &Event,
        reason: String,
        response: String,
        run: Option<(String, Vec<Refusal>)>,
    ) -> Step {
        Step::Park(Park {
            offset: ev.offset,
            reason,
            response,
            attempts: u64::from(self.failures) + 1,
            blocking: self.blocking_parks,
            run,
            generation: self.generation(),
        })
    }

    /// `ev` refused with `class`: while blocked by it, back off; after a run of events
    /// parked for it that holds another source than `ev`'s, block; else park `ev`.
    fn refused(&mut self, ev: &Event, class: String, reason: String, response: String) -> Step {
        if self.blocked.as_ref() == Some(&class) {
            let error = format!(
                "{BLOCKED}{reason}; every event is refused this way, so none is \
                 parked: fix the receiver (the sink keeps trying)"
            );
            return self.back_off(None, error, Phase::Blocked);
        }
        let source = (ev.agency.clone(), ev.source_id.clone());
        let mut run = match self.refusals.take() {
            Some((c, run)) if c == class => run,
            _ => Vec::new(),
        };
        if let Some((_, other)) = run.iter().find(|(_, src)| *src != source) {
            let first = run.first().map_or(ev.offset, |(o, _)| *o);
            // A delivery ends a run of refusals, so what lies between its events was parked
            // in it, or never offered (an audit sink's entries outside its `outcomes`): the
            // whole stretch is taken back. The store checks that (`RelayStore::unpark`) and
            // takes nothing back otherwise.
            return Step::Block(Block {
                other: other.clone(),
                class,
                reason,
                offset: ev.offset,
                source,
                take_back: (first < ev.offset).then_some((first, ev.offset)),
                parked_run: run.len(),
            });
        }
        run.push((ev.offset, source));
        self.to_park(ev, reason, response, Some((class, run)))
    }

    /// Parks `ev` as `park` says, at `now_ms`, to be written with the next cursor write;
    /// unless it blocks, the cursor goes past it. Nothing is parked when the cursor was moved
    /// to another generation since the attempt (`Parking::Moved`): going past the event
    /// from the moved cursor would pass over everything between them, undelivered.
    pub fn park(&mut self, park: &Park, ev: &Event, now_ms: u64) -> Parking {
        if park.generation != self.generation() {
            return Parking::Moved;
        }
        let record = ParkedRecord {
            parked_at_ms: now_ms,
            id: ev.id.clone(),
            key: ev.key,
            agency: ev.agency.clone(),
            source_id: ev.source_id.clone(),
            topic: ev.topic.clone(),
            reason: park.reason.chars().take(REASON_MAX).collect(),
            response: park.response.chars().take(RESPONSE_MAX).collect(),
            attempts: park.attempts,
            blocking: park.blocking,
            retry_requested_at_ms: None,
            event: ev.json.clone(),
        };
        self.parked.push((ev.offset, record));
        if park.blocking {
            return Parking::Blocks;
        }
        self.next = ev.offset + 1;
        Parking::GoesPast
    }

    /// The sink goes on past the event of `park` (parked and written): the run of refusals
    /// it extends is held, and the next event starts without failures.
    pub fn passed(&mut self, park: Park) {
        self.refusals = park.run;
        self.failures = 0;
    }

    /// The sink holds at the first refused event until `class` stops refusing.
    pub fn block(&mut self, class: String) {
        self.blocked = Some(class);
    }

    /// Whether the cursor is to be written: `always`, or once `since_write` reaches `every`;
    /// at once when events were parked.
    pub fn flush_due(&self, always: bool, since_write: Duration, every: Duration) -> FlushDue {
        let Some(rec) = &self.rec else {
            return FlushDue::Register;
        };
        if self.next == rec.next && self.parked.is_empty() {
            return FlushDue::Nothing;
        }
        if !always && since_write < every && self.parked.is_empty() {
            return FlushDue::Nothing;
        }
        FlushDue::Write {
            generation: rec.generation,
            from: rec.next,
            to: self.next,
        }
    }

    /// The parked events to write now (`restore_parked` when the write failed: they go with
    /// the next write that succeeds).
    pub fn take_parked(&mut self) -> Vec<(u64, ParkedRecord)> {
        std::mem::take(&mut self.parked)
    }

    pub fn restore_parked(&mut self, parked: Vec<(u64, ParkedRecord)>) {
        self.parked = parked;
    }

    /// Follows the outcome of a cursor write: a record of another generation (an operator
    /// rewound or skipped meanwhile) is delivered from, a forgotten cursor registered again.
    pub fn adopt(&mut self, w: CursorWrite) -> Adopted {
        if let CursorWrite::Done(r) | CursorWrite::Moved(Some(r)) = &w
            && self.generation().is_some_and(|g| r.generation < g)
        {
            return Adopted::Stale;
        }
        match w {
            CursorWrite::Done(r) if self.generation().is_some_and(|g| g != r.generation) => {
                // Written, but an operator had moved the cursor meanwhile: deliver from there.
                self.adopt(CursorWrite::Moved(Some(r)))
            }
            CursorWrite::Done(r) => {
                self.next = self.next.max(r.next);
                self.rec = Some(r);
                Adopted::Written
            }
            CursorWrite::Moved(Some(r)) => {
                self.forget_progress();
                let moved = Adopted::MovedByOperator {
                    next: r.next,
                    generation: r.generation,
                };
                self.next = r.next;
                self.rec = Some(r);
                moved
            }
            CursorWrite::Moved(None) => {
                self.rec = None;
                self.forget_progress();
                Adopted::Forgotten
            }
        }
    }

    /// `adopt` for a write that moved the cursor back (taking parked events back, or a
    /// sink's own cursor adopted backwards): delivery goes on from the record's `next`.
    pub fn adopt_back(&mut self, w: CursorWrite) -> Adopted {
        match w {
            CursorWrite::Done(r) => {
                self.next = r.next;
                self.rec = Some(r);
                Adopted::Written
            }
            other => self.adopt(other),
        }
    }

    /// `adopt` for a write that set the cursor where the sink's own store says (possibly
    /// back): delivery goes on from the record's `next` unless an operator moved it.
    pub fn adopt_from(&mut self, w: CursorWrite) -> Adopted {
        if let CursorWrite::Done(r) = &w {
            self.next = r.next;
        }
        self.adopt(w)
    }

    /// The cursor a retried parked event is delivered with: a blocking event's delivery
    /// moves the cursor past it (the postgres sink stores that with the row).
    pub fn retry_cursor(&self, offset: u64, blocking: bool) -> u64 {
        if blocking {
            self.next.max(offset + 1)
        } else {
            self.next
        }
    }
}

/// The events handed to a windowed sink (`Sink::windowed`) and not yet acknowledged, in
/// offset order, and where the log is read next. The next events are read and handed over
/// while earlier ones await their acknowledgement (up to two batches are pending), so the sink
/// never waits for a batch's last acknowledgement before it sends the next batch. Only the
/// acknowledged prefix leaves the window (`acked`), and the cursor follows it
/// (`SinkState::attempt` on `pending`); after a failure the window starts again at the cursor
/// (`restart`): everything after it is handed over again.
#[derive(Clone, Debug)]
pub struct Window {
    events: std::collections::VecDeque<Event>,
    /// The log position after the last one read (an audit sink's passed-over entries too).
    read_to: u64,
    /// Events read at a time; more are read once no more than this many are pending.
    batch: usize,
    /// The last read found nothing more in the log.
    drained: bool,
}

impl Window {
    /// An empty window reading from `next`, `batch` events at a time.
    pub fn new(next: u64, batch: usize) -> Window {
        Window {
            events: std::collections::VecDeque::new(),
            read_to: next,
            batch: batch.max(1),
            drained: false,
        }
    }

    /// Where to read next and how many, when there is room and the log may hold more.
    pub fn wants(&self) -> Option<(u64, usize)> {
        (!self.drained && self.events.len() <= self.batch).then_some((self.read_to, self.batch))
    }

    /// `events` were read from where `wants` said, up to `scanned_to`, and handed over.
    pub fn read(&mut self, events: Vec<Event>, scanned_to: u64) {
        self.drained = events.is_empty();
        self.read_to = self.read_to.max(scanned_to);
        self.events.extend(events);
    }

    /// The log has grown since it was found drained.
    pub fn woken(&mut self) {
        self.drained = false;
    }

    pub fn drained(&self) -> bool {
        self.drained
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The events handed over and not yet acknowledged.
    pub fn pending(&mut self) -> &[Event] {
        self.events.make_contiguous()
    }

    /// The first `n` pending events were acknowledged (`Attempted::delivered`). Once none is
    /// pending, the position the cursor may pass to: the end of what was read (audit entries
    /// passed over after the last event included).
    pub fn acked(&mut self, n: usize) -> Option<u64> {
        self.events.drain(..n.min(self.events.len()));
        self.events.is_empty().then_some(self.read_to)
    }

    /// Nothing handed over is pending any more (a failure, an operator moved the cursor):
    /// reading starts again at the cursor, `next`.
    pub fn restart(&mut self, next: u64) {
        self.events.clear();
        self.read_to = next;
        self.drained = false;
    }
}

/// What to make of the cursor a sink keeps beside its data (`Sink::stored_cursor`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// Not adopted: of another store or generation, or where the cursor already is.
    Keep,
    /// Backwards to `to` (the sink's store was restored from a backup: what it lacks is
    /// delivered again), unless `to` is below where this cursor started (`back_allowed`).
    Back { to: u64 },
    /// Forwards, only as far as the events from `from` (checked up to `check_to`) are found
    /// by id in the sink's store (`forward_to`); `stored` is where the sink's cursor says.
    Forward {
        from: u64,
        check_to: u64,
        stored: u64,
    },
}

/// Whether the cursor `stored`, kept by the sink for store `store`, is adopted by the cursor
/// `rec`: only one of this store, of the cursor's generation (an operator's rewind made since
/// wins over it), that is elsewhere. Forwards, at most `check_max` events are checked.
pub fn adoption(
    store: [u8; 16],
    rec: &SinkRecord,
    stored: &CursorAfter,
    check_max: u64,
) -> Adoption {
    if stored.store != store || stored.generation != rec.generation || stored.next_after == rec.next
    {
        return Adoption::Keep;
    }
    let to = stored.next_after;
    if to < rec.next {
        Adoption::Back { to }
    } else {
        Adoption::Forward {
            from: rec.next,
            check_to: to.min(rec.next.saturating_add(check_max)),
            stored: to,
        }
    }
}

/// Backwards adoption to `to` is allowed unless `to` is below where the cursor started
/// (`start`, its ledger's first entry): a row from before this cursor was made says nothing
/// of what it delivered.
pub fn back_allowed(to: u64, start: Option<u64>) -> bool {
    start.is_none_or(|st| to >= st)
}

/// Where a forward adoption from `from` ends: past the `held` events from `from` the sink's
/// store holds (found by id, from the front); `None` when it holds none.
pub fn forward_to(from: u64, held: u64) -> Option<u64> {
    (held > 0).then_some(from + held)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(offset: u64, source: &str) -> Event {
        Event::for_test(offset, source)
    }

    fn rec(next: u64, generation: u64) -> SinkRecord {
        SinkRecord {
            kind: "exec".into(),
            next,
            generation,
            registered_at_ms: 0,
            advanced_at_ms: 0,
            delivered: 0,
            parked: 0,
            last_error: None,
            ledger_len: 1,
            stream: 0,
            offered_to: next,
            resent: 0,
        }
    }

    fn state_at(next: u64) -> SinkState {
        let mut s = SinkState::new(false);
        s.registered(rec(next, 1));
        s
    }

    fn refused(class: &str) -> Option<Failure> {
        Some(Failure::Refused {
            class: class.into(),
            reason: format!("refused ({class})"),
            response: "no".into(),
        })
    }

    fn retry(error: &str) -> Option<Failure> {
        Some(Failure::Retry {
            error: error.into(),
            after: None,
        })
    }

    /// Parks the front of `rest` as the state says, going past it; panics on another step.
    fn park_front(s: &mut SinkState, rest: &[Event], failure: Option<Failure>) {
        let a = s.attempt(rest, 0, failure);
        let Step::Park(p) = a.step else {
            panic!("expected a park, got {:?}", a.step)
        };
        assert_eq!(s.park(&p, &rest[0], 7), Parking::GoesPast);
        s.passed(p);
    }

    /// Reads what `w` wants from a log of events at every offset below `head`.
    fn read_into(w: &mut Window, head: u64) -> Vec<Event> {
        let (from, max) = w.wants().expect("room for more");
        let to = head.min(from + max as u64);
        let events: Vec<Event> = (from..to).map(|o| ev(o, "a")).collect();
        w.read(events.clone(), to.max(from));
        events
    }

    #[test]
    fn an_acknowledged_prefix_never_moves_the_cursor_backwards() {
        let mut s = SinkState::new(false);
        let first: Vec<Event> = (0..10).map(|o| ev(o, "a/u1")).collect();
        s.attempt(&first, 10, None);
        assert_eq!(s.next(), 10);
        // Events handed over twice (a read that overlapped the one before): their
        // acknowledgement says nothing new, and the cursor stays where it was.
        let again: Vec<Event> = (3..7).map(|o| ev(o, "a/u1")).collect();
        s.attempt(&again, 4, None);
        assert_eq!(s.next(), 10);
    }

    #[test]
    fn a_window_hands_over_the_next_batch_before_the_previous_one_is_acknowledged() {
        let mut s = state_at(0);
        let mut w = Window::new(s.next(), 100);
        assert_eq!(read_into(&mut w, 1_000).len(), 100);
        // Not one acknowledgement yet, and the next batch is read and handed over already.
        assert_eq!(w.wants(), Some((100, 100)));
        assert_eq!(read_into(&mut w, 1_000)[0].offset, 100);
        assert_eq!(w.wants(), None, "two batches pending: no more");
        // The sink acknowledges the first 30: the cursor moves over them, no further.
        let a = s.attempt(w.pending(), 30, None);
        assert_eq!((a.delivered, &a.step), (30, &Step::Go));
        assert_eq!(w.acked(30), None);
        assert_eq!(s.next(), 30);
        assert_eq!(w.wants(), None);
        // 70 more: a batch's worth is pending, so the third batch is read, from 200.
        s.attempt(w.pending(), 70, None);
        w.acked(70);
        assert_eq!((s.next(), w.wants()), (100, Some((200, 100))));
        assert_eq!(w.pending()[0].offset, 100);
    }

    #[test]
    fn a_failure_mid_window_keeps_the_acknowledged_prefix_and_reads_again_from_it() {
        let mut s = state_at(0);
        let mut w = Window::new(0, 50);
        read_into(&mut w, 1_000);
        read_into(&mut w, 1_000);
        // 12 acknowledged, then the connection is lost with 88 in flight.
        let a = s.attempt(w.pending(), 12, retry("connection lost"));
        assert!(
            matches!(a.step, Step::BackOff { failures: 1, .. }),
            "{:?}",
            a.step
        );
        assert_eq!(s.next(), 12);
        w.restart(s.next());
        assert!(w.is_empty());
        assert_eq!(
            w.wants(),
            Some((12, 50)),
            "the unacknowledged suffix goes out again"
        );
        // A refusal of the front event parks it; the window goes on after it.
        read_into(&mut w, 1_000);
        let Step::Park(p) = s.attempt(w.pending(), 0, refused("0x87")).step else {
            panic!()
        };
        assert_eq!(p.offset, 12);
        assert_eq!(s.park(&p, &w.pending()[0].clone(), 1), Parking::GoesPast);
        s.passed(p);
        w.restart(s.next());
        assert_eq!(w.wants(), Some((13, 50)));
    }

    #[test]
    fn a_drained_window_reads_again_once_woken_and_lets_the_cursor_pass_skipped_entries() {
        let mut s = state_at(0);
        let mut w = Window::new(0, 10);
        w.read(vec![ev(0, "a"), ev(3, "a")], 5);
        assert_eq!(w.wants(), Some((5, 10)));
        w.read(Vec::new(), 5);
        assert!(w.drained());
        assert_eq!(w.wants(), None);
        w.woken();
        assert_eq!(w.wants(), Some((5, 10)));
        s.attempt(w.pending(), 2, None);
        // Entries 4 (not selected by an audit sink) lie before the end of the read.
        assert_eq!(w.acked(2), Some(5));
        s.advance_to(5);
        assert_eq!(s.next(), 5);
    }

    #[test]
    fn the_same_refusal_from_two_sources_blocks_the_sink() {
        let mut s = state_at(10);
        let batch = [ev(10, "a"), ev(11, "b")];
        park_front(&mut s, &batch, refused("42P01"));
        let a = s.attempt(&batch[1..], 0, refused("42P01"));
        let Step::Block(b) = a.step else {
            panic!("{:?}", a.step)
        };
        assert_eq!(b.class, "42P01");
        assert_eq!(b.other, ("fire".into(), "a".into()));
        assert_eq!(b.source, ("fire".into(), "b".into()));
        assert_eq!(
            b.error(10, true),
            "blocked: refused (42P01); events of different sources (fire/a and fire/b, up to \
             offset 11) were refused the same way, so the receiver refuses every event: \
             nothing is parked, the sink waits at offset 10 and keeps trying; fix the receiver"
        );
    }

    #[test]
    fn a_refusal_from_one_source_only_parks() {
        let mut s = state_at(0);
        let batch: Vec<Event> = (0..5).map(|o| ev(o, "a")).collect();
        for k in 0..5 {
            park_front(&mut s, &batch[k..], refused("401"));
        }
        assert_eq!(s.next(), 5);
        assert_eq!(s.take_parked().len(), 5);
    }

    #[test]
    fn refusals_of_different_classes_or_a_delivery_between_them_only_park() {
        let mut s = state_at(0);
        let batch = [ev(0, "a"), ev(1, "b"), ev(2, "c"), ev(3, "d")];
        park_front(&mut s, &batch, refused("401"));
        // Another class starts a new run.
        park_front(&mut s, &batch[1..], refused("403"));
        // A delivery ends the run.
        let a = s.attempt(&batch[2..], 1, refused("403"));
        assert_eq!(a.delivered, 1);
        assert!(matches!(a.step, Step::Park(_)), "{:?}", a.step);
    }

    #[test]
    fn a_poisoned_event_is_parked_and_breaks_a_run_of_refusals() {
        let mut s = state_at(0);
        let batch = [ev(0, "a"), ev(1, "b"), ev(2, "c")];
        park_front(&mut s, &batch, refused("404"));
        park_front(
            &mut s,
            &batch[1..],
            Some(Failure::Poison {
                reason: "bad".into(),
                response: "400".into(),
            }),
        );
        let a = s.attempt(&batch[2..], 0, refused("404"));
        assert!(matches!(a.step, Step::Park(_)), "{:?}", a.step);
    }

    #[test]
    fn a_block_takes_back_the_events_parked_meanwhile() {
        let mut s = state_at(20);
        let batch = [ev(20, "a"), ev(21, "a"), ev(22, "b")];
        park_front(&mut s, &batch, refused("415"));
        park_front(&mut s, &batch[1..], refused("415"));
        let Step::Block(b) = s.attempt(&batch[2..], 0, refused("415")).step else {
            panic!()
        };
        assert_eq!(b.take_back, Some((20, 22)));
        assert_eq!(b.parked_run, 2);
        // Parked with entries between them that were never offered (an audit sink's not
        // selected): the whole stretch goes back; the store takes back only such a stretch.
        let mut s = state_at(20);
        park_front(&mut s, &[ev(20, "a")], refused("415"));
        let Step::Block(b) = s.attempt(&[ev(25, "b")], 0, refused("415")).step else {
            panic!()
        };
        assert_eq!(b.take_back, Some((20, 25)));
        assert!(
            b.error(20, true)
                .contains(": nothing is parked, the sink waits at offset 20")
        );
        assert!(
            b.error(25, false)
                .contains("the 1 events refused before it stay parked (`relay parked`")
        );
    }

    #[test]
    fn a_blocked_sink_backs_off_until_an_attempt_delivers() {
        let mut s = state_at(0);
        s.block("42501".into());
        let batch = [ev(0, "a"), ev(1, "b")];
        for n in 1..=3 {
            let a = s.attempt(&batch, 0, refused("42501"));
            let Step::BackOff {
                failures, state, ..
            } = a.step
            else {
                panic!("{:?}", a.step)
            };
            assert_eq!((failures, state), (n, Phase::Blocked));
        }
        assert!(!s.has_parked());
        let a = s.attempt(&batch, 1, None);
        assert_eq!(a.unblocked.as_deref(), Some("42501"));
        assert_eq!(s.next(), 1);
        assert_eq!(a.step, Step::Go);
    }

    #[test]
    fn failures_count_until_progress_and_a_silent_sink_is_retried() {
        let mut s = state_at(0);
        let batch = [ev(0, "a"), ev(1, "a")];
        let a = s.attempt(&batch, 0, retry("timeout"));
        assert!(matches!(a.step, Step::BackOff { failures: 1, .. }));
        let a = s.attempt(&batch, 0, None);
        assert_eq!(
            a.step,
            Step::BackOff {
                failures: 2,
                after: None,
                error: "the sink delivered nothing".into(),
                state: Phase::Retrying
            }
        );
        // The park counts the attempts made at the event.
        let Step::Park(p) = s.attempt(&batch, 0, refused("401")).step else {
            panic!()
        };
        assert_eq!(p.attempts, 3);
        let a = s.attempt(&batch, 1, retry("timeout"));
        assert!(matches!(a.step, Step::BackOff { failures: 1, .. }));
    }

    #[test]
    fn a_blocking_park_holds_the_cursor_at_the_event() {
        let mut s = SinkState::new(true);
        s.registered(rec(4, 1));
        let batch = [ev(4, "a")];
        let Step::Park(p) = s
            .attempt(
                &batch,
                0,
                Some(Failure::Poison {
                    reason: "r".repeat(5000),
                    response: "x".into(),
                }),
            )
            .step
        else {
            panic!()
        };
        assert_eq!(s.park(&p, &batch[0], 99), Parking::Blocks);
        assert_eq!(s.next(), 4);
        let parked = s.take_parked();
        assert_eq!(parked[0].0, 4);
        assert!(parked[0].1.blocking);
        assert_eq!(parked[0].1.reason.chars().count(), 1024);
        assert_eq!(parked[0].1.parked_at_ms, 99);
    }

    #[test]
    fn a_refusal_met_before_an_operators_rewind_parks_nothing_and_leaves_the_rewound_cursor() {
        // A windowed sink's acknowledgements move its cursor to 130 in generation 1; the
        // event at 135 is refused (HTTP 422).
        let mut s = state_at(100);
        let window: Vec<Event> = (100..140).map(|o| ev(o, "a")).collect();
        let a = s.attempt(&window, 35, refused("422"));
        assert_eq!(s.next(), 135);
        let Step::Park(p) = a.step else {
            panic!("{:?}", a.step)
        };
        // The cursor write in flight beside the window returns the operator's rewind to 1
        // (generation 2), adopted before the refusal is followed.
        assert_eq!(
            s.adopt(CursorWrite::Moved(Some(rec(1, 2)))),
            Adopted::MovedByOperator {
                next: 1,
                generation: 2
            }
        );
        // The event refused in generation 1 is not parked in generation 2: that would write
        // the cursor from 1 past 135, over 134 effects never delivered again.
        let parking = s.park(&p, &window[35], 7);
        assert_eq!(
            s.flush_due(true, Duration::ZERO, Duration::ZERO),
            FlushDue::Nothing
        );
        assert_eq!(
            (s.next(), s.has_parked(), parking),
            (1, false, Parking::Moved)
        );
        // Offered again from the rewound cursor and refused in generation 2, it parks.
        let again: Vec<Event> = (1..140).map(|o| ev(o, "a")).collect();
        let a = s.attempt(&again, 134, refused("422"));
        let Step::Park(p) = a.step else {
            panic!("{:?}", a.step)
        };
        assert_eq!(s.park(&p, &again[134], 8), Parking::GoesPast);
        assert_eq!(
            s.flush_due(true, Duration::ZERO, Duration::ZERO),
            FlushDue::Write {
                generation: 2,
                from: 1,
                to: 136
            }
        );
    }

    #[test]
    fn a_refusal_met_before_an_operators_skip_does_not_take_the_cursor_back() {
        let mut s = state_at(30);
        let batch: Vec<Event> = (30..40).map(|o| ev(o, "a")).collect();
        let Step::Park(p) = s.attempt(&batch, 5, refused("422")).step else {
            panic!()
        };
        // `relay skip --to 200` (generation 2) is adopted before the refusal is followed.
        s.adopt(CursorWrite::Moved(Some(rec(200, 2))));
        // Going past 35 from there would write the cursor back from 200 to 36, and deliver
        // the skipped effects after all.
        let parking = s.park(&p, &batch[5], 7);
        assert_eq!(
            s.flush_due(true, Duration::ZERO, Duration::ZERO),
            FlushDue::Nothing
        );
        assert_eq!(
            (s.next(), s.has_parked(), parking),
            (200, false, Parking::Moved)
        );
    }

    #[test]
    fn backoff_grows_with_failures_and_is_capped() {
        let (i, max) = (Duration::from_millis(200), Duration::from_secs(30));
        assert_eq!(backoff_cap(i, max, 0), i);
        assert_eq!(backoff_cap(i, max, 1), Duration::from_millis(400));
        assert_eq!(backoff_cap(i, max, 5), Duration::from_millis(6400));
        assert_eq!(backoff_cap(i, max, 8), max);
        assert_eq!(backoff_cap(i, max, u32::MAX), max);
        let mut j = Jitter::seeded("cop", 1);
        for failures in 0..30 {
            let after = Some(Duration::from_secs(40));
            assert_eq!(j.backoff(i, max, failures, after), Duration::from_secs(40));
            assert!(j.backoff(i, max, failures, None) <= backoff_cap(i, max, failures));
        }
    }

    #[test]
    fn jitter_is_deterministic_for_a_seed() {
        let cap = Duration::from_secs(10);
        let draws = |name: &str, nanos: u64| {
            let mut j = Jitter::seeded(name, nanos);
            (0..20).map(|_| j.full(cap)).collect::<Vec<_>>()
        };
        assert_eq!(draws("cop", 42), draws("cop", 42));
        assert_ne!(draws("cop", 42), draws("cop", 43));
        assert_ne!(draws("cop", 42), draws("web", 42));
        assert!(draws("cop", 42).iter().all(|d| *d <= cap));
        assert_eq!(
            Jitter::seeded("cop", 42).full(Duration::ZERO),
            Duration::ZERO
        );
    }

    #[test]
    fn an_operator_move_seen_in_a_write_wins_and_forgets_the_sinks_progress() {
        let mut s = state_at(10);
        let batch = [ev(10, "a"), ev(11, "a")];
        park_front(&mut s, &batch, refused("401"));
        // Written, but under a newer generation: an operator rewound meanwhile.
        let got = s.adopt(CursorWrite::Done(rec(3, 2)));
        assert_eq!(
            got,
            Adopted::MovedByOperator {
                next: 3,
                generation: 2
            }
        );
        assert_eq!((s.next(), s.generation()), (3, Some(2)));
        assert!(!s.has_parked());
        // The run of refusals is forgotten too: the next refusal parks.
        let Step::Park(_) = s.attempt(&[ev(3, "b")], 0, refused("401")).step else {
            panic!()
        };
        assert_eq!(s.adopt(CursorWrite::Moved(None)), Adopted::Forgotten);
        assert_eq!(
            s.flush_due(true, Duration::ZERO, Duration::ZERO),
            FlushDue::Register
        );
    }

    #[test]
    fn a_write_of_an_older_generation_arriving_after_an_operator_move_changes_nothing() {
        let mut s = state_at(10);
        s.attempt(&[ev(10, "a"), ev(11, "a")], 2, None);
        // The operator's rewind to 3 is followed first (generation 2) ...
        assert_eq!(
            s.adopt(CursorWrite::Moved(Some(rec(3, 2)))),
            Adopted::MovedByOperator {
                next: 3,
                generation: 2
            }
        );
        // ... then the window's write of generation 1, made before the rewind, returns.
        assert_eq!(s.adopt(CursorWrite::Done(rec(12, 1))), Adopted::Stale);
        assert_eq!(
            s.adopt(CursorWrite::Moved(Some(rec(12, 1)))),
            Adopted::Stale
        );
        assert_eq!((s.next(), s.generation()), (3, Some(2)));
    }

    #[test]
    fn a_written_cursor_never_moves_delivery_back_unless_written_back() {
        let mut s = state_at(10);
        s.attempt(&[ev(10, "a"), ev(11, "a")], 2, None);
        assert_eq!(s.adopt(CursorWrite::Done(rec(11, 1))), Adopted::Written);
        assert_eq!(s.next(), 12);
        assert_eq!(s.adopt_back(CursorWrite::Done(rec(8, 1))), Adopted::Written);
        assert_eq!(s.next(), 8);
    }

    #[test]
    fn the_cursor_is_written_when_asked_when_due_or_at_once_after_a_park() {
        let every = Duration::from_millis(200);
        let mut s = state_at(0);
        assert_eq!(s.flush_due(true, every, every), FlushDue::Nothing);
        s.attempt(&[ev(0, "a")], 1, None);
        assert_eq!(s.flush_due(false, Duration::ZERO, every), FlushDue::Nothing);
        let write = FlushDue::Write {
            generation: 1,
            from: 0,
            to: 1,
        };
        assert_eq!(s.flush_due(false, every, every), write);
        assert_eq!(s.flush_due(true, Duration::ZERO, every), write);
        park_front(&mut s, &[ev(1, "a")], refused("401"));
        assert!(matches!(
            s.flush_due(false, Duration::ZERO, every),
            FlushDue::Write { to: 2, .. }
        ));
    }

    fn stored(store: u8, generation: u64, next_after: u64) -> CursorAfter {
        CursorAfter {
            store: [store; 16],
            generation,
            next_after,
        }
    }

    #[test]
    fn a_cursor_of_another_store_is_never_adopted() {
        let r = rec(10, 1);
        assert_eq!(
            adoption([1; 16], &r, &stored(2, 1, 50), 100),
            Adoption::Keep
        );
        assert_eq!(adoption([1; 16], &r, &stored(2, 1, 5), 100), Adoption::Keep);
        // Nor one of another generation (an operator's rewind since wins), nor the same place.
        assert_eq!(
            adoption([1; 16], &r, &stored(1, 2, 50), 100),
            Adoption::Keep
        );
        assert_eq!(
            adoption([1; 16], &r, &stored(1, 1, 10), 100),
            Adoption::Keep
        );
        assert_eq!(
            adoption([1; 16], &r, &stored(1, 1, 5), 100),
            Adoption::Back { to: 5 }
        );
    }

    #[test]
    fn forward_adoption_stops_at_the_first_missing_id() {
        let r = rec(10, 1);
        assert_eq!(
            adoption([1; 16], &r, &stored(1, 1, 50), 100),
            Adoption::Forward {
                from: 10,
                check_to: 50,
                stored: 50
            }
        );
        // At most `check_max` events are checked.
        assert_eq!(
            adoption([1; 16], &r, &stored(1, 1, 500), 100),
            Adoption::Forward {
                from: 10,
                check_to: 110,
                stored: 500
            }
        );
        // The sink's store holds the first 7 ids: adopted to the first it lacks.
        assert_eq!(forward_to(10, 7), Some(17));
        assert_eq!(forward_to(10, 0), None);
    }

    #[test]
    fn backward_adoption_never_goes_below_where_the_cursor_started() {
        assert!(!back_allowed(4, Some(5)));
        assert!(back_allowed(5, Some(5)));
        assert!(back_allowed(6, Some(5)));
        // A cursor whose ledger does not say where it started.
        assert!(back_allowed(0, None));
    }

    #[test]
    fn a_retried_event_refused_again_stays_parked_and_a_transient_failure_keeps_the_request() {
        assert_eq!(
            Retried::of(Some(Failure::Poison {
                reason: "bad".into(),
                response: "400 Bad Request".into()
            })),
            Retried::Refused("bad: 400 Bad Request".into())
        );
        assert_eq!(Retried::of(retry("503")), Retried::NotYet("503".into()));
        assert_eq!(Retried::of(None), Retried::Refused("not delivered".into()));
        let s = state_at(10);
        assert_eq!(s.retry_cursor(4, false), 10);
        assert_eq!(s.retry_cursor(10, true), 11);
    }

    #[test]
    fn the_status_line_tells_the_lag_and_the_age_of_the_oldest_undelivered_event() {
        let mut st = SinkStatus::new("cop");
        assert_eq!(st.line(0), "cop lag=0 starting");
        st.enter(Phase::Retrying, 10, Some("503".into()));
        st.read_lag(10, 61, Some(1_000));
        assert_eq!(st.line(39_500), "cop lag=51 age=38s retrying");
        // Delivered some since: the age of the new oldest is not known before the next read.
        st.enter(Phase::Delivering, 20, None);
        assert_eq!(st.line(39_500), "cop lag=41 delivering");
        assert_eq!(st.last_error.as_deref(), Some("503"));
        // Caught up: no age, whatever was read before.
        st.read_lag(61, 61, Some(1_000));
        st.enter(Phase::Idle, 61, None);
        assert_eq!(st.line(39_500), "cop lag=0 idle");
        assert_eq!(st.last_error, None);
    }
}
