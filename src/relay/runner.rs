//! The relay's thread and its tasks: one per sink, on a runtime of its own, so that a slow or
//! failing sink never stalls the feed's commits or another sink.
//!
//! A task reads effects from its cursor (a read snapshot), delivers them in batches, backs off
//! (capped exponential, full jitter, at least the receiver's `Retry-After`) on a failure, parks
//! a poisoned event with what the receiver said, and writes its cursor durably as soon as
//! the receiver acknowledged something and no write of the sink is in progress
//! (`CURSOR_WRITE_EVERY`; a crash re-delivers what was in flight and what one write's time
//! acknowledged, with the same ids). Redb work runs on the blocking pool, never on the task's thread.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::envelope;
use super::state::{
    self, Adopted, Adoption, Block, FAILING, FlushDue, Jitter, Park, Parking, Phase, Retried,
    SinkState, SinkStatus, Step, Window,
};
use super::{Attempt, CursorAfter, Event, Sink};
use crate::config::StoreLocation;
use crate::config::{Config, OnPoison, SinkConfig};
use crate::metrics::Metrics;
use crate::store::postgres::PgStore;
use crate::store::relay::{CursorWrite, Parked, RelayStore};
use crate::store::tables::{LedgerKind, Stream};
use crate::store::{Backend, Reader, Store, StoreError, StoreOptions};
use crate::timefmt::now_ms;

/// How long the log must hold nothing new before a windowed sink's pump returns (its
/// cursor written), and how often an idle pump looks at the log unwoken.
const CURSOR_FLUSH: Duration = Duration::from_millis(200);
/// Longest an acknowledged cursor position waits in memory before it is written (each
/// write is a durable commit, one at a time per sink): a kill -9 re-sends what was in
/// flight and what was acknowledged in this much time (200 ms before: about 6,000 events of
/// an exec sink at 30,000 a second; `scripts/bench-resend.py`).
const CURSOR_WRITE_EVERY: Duration = Duration::from_millis(20);
/// How far past what it is about to offer a sink raises its `offered_to` (capped at the
/// log's head), in batches: one such write covers the next ones.
const OFFER_AHEAD_BATCHES: u64 = 4;
/// How often a task looks for operator actions (`relay retry|rewind`) from other processes,
/// and an idle standalone relay for new effects when nothing wakes it.
const RELOAD_EVERY: Duration = Duration::from_secs(1);
/// How often the standalone relay looks for new effects on a redb file (`run` wakes it on
/// each commit).
const POLL_EVERY: Duration = Duration::from_millis(20);
/// How often the relay looks for new effects on PostgreSQL, where commits are announced
/// (LISTEN/NOTIFY): a lost notification or a reconnection's gap costs at most this.
const POLL_LISTENING: Duration = Duration::from_secs(1);
/// Least time between two `last_error` writes of one sink.
const ERROR_NOTE_EVERY: Duration = Duration::from_secs(5);
/// Most events a sink's own cursor may pass over at start; beyond, they are delivered again
/// (and not stored twice).
const ADOPT_CHECK_MAX: u64 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The configuration names a store that cannot be opened as configured.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// A `[[sink]]` cannot be made from its configuration.
    #[error(transparent)]
    Sink(#[from] super::SinkError),
    /// The relay's thread or runtime (`what`) could not be started.
    #[error("cannot start the relay {what}: {error}")]
    Start {
        what: &'static str,
        error: std::io::Error,
    },
    /// A task of the relay's runtime (`what`) ended without an answer: it panicked or was
    /// cancelled.
    #[error("{what}: {error}")]
    Task {
        what: &'static str,
        error: tokio::task::JoinError,
    },
    #[error("the relay thread panicked")]
    ThreadPanicked,
    /// The relay's runtime panicked while it was being stopped.
    #[error("the relay panicked: {0}")]
    Panicked(String),
    #[error("relay store lock poisoned")]
    StoreLockPoisoned,
    #[error("relay store closed")]
    StoreClosed,
}

/// What wakes the sinks: `run`'s store thread bumps it after every commit that applied
/// something. Cloned into the store thread.
#[derive(Clone)]
pub struct Wake(Arc<watch::Sender<u64>>);

impl Wake {
    pub fn new() -> Wake {
        Wake(Arc::new(watch::channel(0).0))
    }
    pub fn bump(&self) {
        self.0.send_modify(|n| *n = n.wrapping_add(1));
    }
    fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

impl Default for Wake {
    fn default() -> Self {
        Wake::new()
    }
}

/// The running relay: a thread with one task per sink.
pub struct Relay {
    stop: watch::Sender<bool>,
    /// Set when the shutdown timeout is reached: attempts in progress are abandoned (a
    /// program the exec sink started is killed), cursors are written, the thread ends.
    hard: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<Result<(), RelayError>>>,
    status: Arc<Mutex<Vec<SinkStatus>>>,
}

impl Relay {
    /// Every sink's state, for STATUS lines.
    pub fn status(&self) -> Vec<SinkStatus> {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// `sinks: NAME lag=N [age=Ss] STATE, ...` for sd_notify STATUS: the lag `relay status`
    /// reports, in events and the age of the oldest undelivered one.
    pub fn status_line(&self) -> String {
        let now = now_ms();
        let parts: Vec<String> = self.status().iter().map(|s| s.line(now)).collect();
        if parts.is_empty() {
            // The relay thread has not reported its sinks yet (just after start).
            return "sinks: starting".into();
        }
        format!("sinks: {}", parts.join(", "))
    }

    /// Whether the relay thread is still running.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Asks every sink to finish its attempt in progress, write its cursor and stop, and waits
    /// at most `timeout` for them.
    pub fn stop(self, timeout: Duration) -> Result<(), RelayError> {
        self.stop_or_cut(timeout, &|| false)
    }

    /// `stop`, unless `cut` turns true meanwhile (a second signal): then attempts in progress
    /// are abandoned at once and the cursors written within half a second.
    pub fn stop_or_cut(
        mut self,
        timeout: Duration,
        cut: &dyn Fn() -> bool,
    ) -> Result<(), RelayError> {
        let _ = self.stop.send(true);
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        // Most of the time for attempts to finish; the rest to abandon them and write cursors.
        let soft = Instant::now() + timeout.mul_f64(0.8);
        while !thread.is_finished() && Instant::now() < soft && !cut() {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !thread.is_finished() {
            let _ = self.hard.send(true);
            let rest = if cut() {
                Duration::from_millis(500)
            } else {
                timeout.mul_f64(0.2).max(Duration::from_millis(500))
            };
            let deadline = Instant::now() + rest;
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if !thread.is_finished() {
            tracing::warn!(
                "relay did not stop within the shutdown timeout; undelivered events stay in the \
                 log and are delivered after the restart"
            );
            return Ok(());
        }
        thread.join().map_err(|_| RelayError::ThreadPanicked)?
    }

    /// Waits until the relay stops on its own (a fatal error), or `stop` is requested by the
    /// caller's `until` future returning.
    pub fn join(mut self) -> Result<(), RelayError> {
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| RelayError::ThreadPanicked)?,
            None => Ok(()),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        let _ = self.hard.send(true);
    }
}

/// Starts the relay for every `[[sink]]` of `config` on its store (`None` when there are no
/// sinks). `wake` is bumped by the writer in this process after each commit; without it (and
/// always on PostgreSQL, where other members commit too) the relay polls the log's head.
///
/// On a redb file each sink's byte lock is taken here, and a sink another process delivers
/// is refused (`SinkBusy`). On PostgreSQL several members run the same sinks: each sink
/// task claims its sink's session lock and, while another member holds it, waits as its
/// standby.
pub fn spawn(
    config: &Config,
    wake: Option<&Wake>,
    metrics: Option<&Metrics>,
) -> Result<Option<Relay>, RelayError> {
    if config.relay.sinks.is_empty() {
        return Ok(None);
    }
    // Each sink is built here once to refuse a bad one at start; its task builds its own.
    for cfg in &config.relay.sinks {
        Sink::new(cfg)?;
    }
    let sinks = config.relay.sinks.clone();
    if let Some(m) = metrics {
        for cfg in &sinks {
            m.sink_restarted(&cfg.name, 0);
        }
    }
    let opts = StoreOptions {
        cache_bytes: 16 * 1024 * 1024,
        ..config.store.clone()
    };
    let names: Vec<&str> = config.relay.sinks.iter().map(|s| s.name.as_str()).collect();
    let location = config.location()?;
    let (db, locks, store, reader) = match location {
        StoreLocation::File(db) => {
            let locks = crate::store::relay::lock_sinks(db, &names)?;
            let store = Store::open_operator(db, opts)?;
            let reader = Reader::open(db)?;
            (db.to_path_buf(), Some(locks), Backend::Redb(store), reader)
        }
        StoreLocation::Postgres(pg) => {
            let cfg = pg.pg_config()?;
            let store = PgStore::open(cfg.clone(), opts, now_ms())?;
            let (reader, _) = Reader::postgres(cfg.clone())?;
            (
                PathBuf::from(cfg.target()),
                None,
                Backend::Postgres(store),
                reader,
            )
        }
    };
    // Every sink's cursor exists before any task starts: one whose task cannot start (or a
    // standby member's) still holds retention back.
    let mut store = store;
    super::declare_sinks(&mut store, config)?;
    let shared_store = matches!(store, Backend::Postgres(_));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (hard_tx, hard_rx) = watch::channel(false);
    let status = Arc::new(Mutex::new(Vec::new()));
    let shared = Shared {
        store: Arc::new(Mutex::new(Some(store))),
        reader: Arc::new(reader),
        source: config.relay.source.clone(),
        status: status.clone(),
        shared_store,
        metrics: metrics.cloned(),
    };
    let wake = wake.cloned();
    let thread = std::thread::Builder::new()
        .name("relay".into())
        .spawn(move || {
            let r = run_supervised(&shared, &sinks, wake.as_ref(), &stop_rx, &hard_rx);
            // Released only once every cursor is written (PostgreSQL: with the connection).
            drop(locks);
            // Every cursor is written; closing lets the next open skip the repair.
            if let Ok(mut g) = shared.store.lock()
                && let Some(s) = g.take()
                && let Err(e) = s.close()
            {
                tracing::warn!(error = %e, db = %db.display(), "closing the relay's database handle {}: {e}", db.display());
            }
            r
        })
        .map_err(|error| RelayError::Start {
            what: "thread",
            error,
        })?;
    Ok(Some(Relay {
        stop: stop_tx,
        hard: hard_tx,
        thread: Some(thread),
        status,
    }))
}

/// Runs every sink until the relay is stopped. Should the relay's runtime itself end any
/// other way (a panic outside every sink task), it is logged and started again after a
/// backoff, for as long as the relay is not stopped: a relay inside `run` never dies silently.
fn run_supervised(
    shared: &Shared,
    sinks: &[SinkConfig],
    wake: Option<&Wake>,
    stop: &watch::Receiver<bool>,
    hard: &watch::Receiver<bool>,
) -> Result<(), RelayError> {
    let mut backoff = Duration::from_millis(100);
    loop {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| RelayError::Start {
                what: "runtime",
                error,
            })?;
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(run_all(
                shared.clone(),
                sinks.to_vec(),
                wake.cloned(),
                stop.clone(),
                hard.clone(),
            ))
        }));
        drop(rt);
        match run {
            Ok(r) => return r,
            Err(panic) => {
                let why = panic_text(&*panic);
                tracing::error!(error = %why, "the relay's runtime panicked ({why}); starting it again after a backoff");
                if *stop.borrow() {
                    return Err(RelayError::Panicked(why));
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// A panic's message, as far as it says one.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

#[derive(Clone)]
struct Shared {
    store: Arc<Mutex<Option<Backend>>>,
    reader: Arc<Reader>,
    source: String,
    status: Arc<Mutex<Vec<SinkStatus>>>,
    /// PostgreSQL: other members commit to the log and deliver the same sinks.
    shared_store: bool,
    /// `run`'s metrics (none in a standalone relay).
    metrics: Option<Metrics>,
}

impl Shared {
    /// Runs a store write on the blocking pool.
    async fn write<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Backend) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, RelayError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let mut g = store.lock().map_err(|_| RelayError::StoreLockPoisoned)?;
            let s = g.as_mut().ok_or(RelayError::StoreClosed)?;
            f(s).map_err(RelayError::from)
        })
        .await
        .map_err(|error| RelayError::Task {
            what: "relay store task",
            error,
        })?
    }

    /// Runs a read on a fresh snapshot on the blocking pool.
    async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&crate::store::Snapshot) -> Result<R, StoreError> + Send + 'static,
    ) -> Result<R, RelayError> {
        let reader = self.reader.clone();
        tokio::task::spawn_blocking(move || {
            let snap = reader.begin()?;
            f(&snap).map_err(RelayError::from)
        })
        .await
        .map_err(|error| RelayError::Task {
            what: "relay read task",
            error,
        })?
    }

    fn set_status(&self, idx: usize, f: impl FnOnce(&mut SinkStatus)) {
        if let Ok(mut s) = self.status.lock()
            && let Some(st) = s.get_mut(idx)
        {
            f(st);
        }
    }
}

async fn run_all(
    shared: Shared,
    sinks: Vec<SinkConfig>,
    wake: Option<Wake>,
    stop: watch::Receiver<bool>,
    hard: watch::Receiver<bool>,
) -> Result<(), RelayError> {
    // Standalone, or on a store other members commit to: watch the log's head. PostgreSQL
    // announces each commit on the schema's channel: a connection of our own LISTENs, and the
    // poll is only the fallback.
    let polled = wake.is_none() || shared.shared_store;
    let wake = wake.unwrap_or_default();
    if polled {
        let listen = shared.store.lock().ok().and_then(|g| match g.as_ref() {
            Some(Backend::Postgres(pg)) => Some(pg.config().clone()),
            _ => None,
        });
        let notified = Arc::new(tokio::sync::Notify::new());
        let poll_every = crate::testing::relay_poll(if listen.is_some() {
            POLL_LISTENING
        } else {
            POLL_EVERY
        });
        let listener = listen.map(|cfg| {
            let channel = crate::store::postgres::channel(&cfg.schema);
            tokio::spawn(crate::store::postgres::follow_commits(
                cfg,
                channel,
                notified.clone(),
            ))
        });
        let s = shared.clone();
        let mut stop = stop.clone();
        let bump = wake.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                // Both logs: an audit sink follows entries that applied nothing.
                let head = s
                    .read(|snap| {
                        let m = snap.meta()?;
                        Ok((m.next_effect, m.next_audit))
                    })
                    .await;
                if let Ok(h) = head
                    && last != Some(h)
                {
                    last = Some(h);
                    bump.bump();
                }
                tokio::select! {
                    _ = stop.changed() => break,
                    () = tokio::time::sleep(poll_every) => {}
                    () = notified.notified() => {}
                }
            }
            if let Some(l) = listener {
                l.abort();
            }
        });
    }
    let wake = wake.subscribe();
    if let Ok(mut st) = shared.status.lock() {
        *st = sinks.iter().map(|c| SinkStatus::new(&c.name)).collect();
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (idx, cfg) in sinks.into_iter().enumerate() {
        let ctx = TaskContext {
            idx,
            shared: shared.clone(),
            cfg,
            wake: wake.clone(),
            stop: stop.clone(),
            hard: hard.clone(),
        };
        tasks.spawn(supervise(ctx));
    }
    let mut first_error = None;
    while let Some(done) = tasks.join_next().await {
        let r = done.map_err(|error| RelayError::Task {
            what: "a sink task failed",
            error,
        });
        if let Err(e) | Ok(Err(e)) = r
            && first_error.is_none()
        {
            first_error = Some(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// What a sink task is made from, again after a restart.
#[derive(Clone)]
struct TaskContext {
    idx: usize,
    shared: Shared,
    cfg: SinkConfig,
    wake: watch::Receiver<u64>,
    stop: watch::Receiver<bool>,
    hard: watch::Receiver<bool>,
}

impl TaskContext {
    fn task(&self) -> Result<SinkTask, RelayError> {
        Ok(SinkTask {
            jitter: Jitter::seeded(&self.cfg.name, nanos_now()),
            sink: Sink::new(&self.cfg)?,
            state: SinkState::new(self.cfg.on_poison == OnPoison::Block),
            ctx: self.clone(),
            store_id: None,
            flushed_at: Instant::now(),
            error_noted_at: None,
            error_stored: false,
            lag_read_at: None,
            standby: false,
            reloaded_at: None,
            not_selected: std::collections::BTreeSet::new(),
            offered: 0,
            sent_to: 0,
            head: 0,
            background: None,
        })
    }
}

/// Runs one sink's task until the relay stops. A task that ends any other way (a panic: a
/// bug, or a receiver's answer no code path expected) is restarted with a fresh connection
/// after a backoff, and surfaced at once: an ERROR line, the sink `failing` in `relay status`
/// and `health` (its last error says so), and `replay_guard_relay_sink_restarts_total`.
async fn supervise(ctx: TaskContext) -> Result<(), RelayError> {
    let mut backoff = ctx.cfg.backoff_initial.max(Duration::from_millis(10));
    loop {
        let task = ctx.task()?;
        let ended = tokio::spawn(task.run()).await;
        let why = match ended {
            Ok(r) => return r,
            Err(e) if e.is_panic() => {
                format!("its task panicked: {}", panic_text(&*e.into_panic()))
            }
            Err(e) => format!("its task ended: {e}"),
        };
        let name = ctx.cfg.name.clone();
        tracing::error!(sink = %name, error = %super::terminal_safe(&why), "relay sink failed; restarting it after a backoff: sink {name}: {}", super::terminal_safe(&why));
        if let Some(m) = &ctx.shared.metrics {
            m.sink_restarted(&name, 1);
        }
        let error = format!("{FAILING}{why}; restarting it");
        ctx.shared.set_status(ctx.idx, |s| {
            s.state = Phase::Failing;
            s.last_error = Some(error.clone());
        });
        let noted = ctx
            .shared
            .write(move |s| s.note_sink_error(&name, &error, now_ms()))
            .await;
        if let Err(e) = noted {
            tracing::warn!(sink = %ctx.cfg.name, error = %e, "could not record the failure of sink {}: {e}", ctx.cfg.name);
        }
        let mut stop = ctx.stop.clone();
        if *stop.borrow() {
            return Ok(());
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(()),
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(ctx.cfg.backoff_max.max(backoff));
    }
}

/// The clock's nanoseconds, the jitter's seed.
fn nanos_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The driver of one sink: reads effects, delivers them, writes cursors and parked events,
/// sleeps and wakes; what to do after each attempt and write is `state`'s to say.
struct SinkTask {
    ctx: TaskContext,
    sink: Sink,
    /// The cursor, the parked events not yet written and the run of failures.
    state: SinkState,
    flushed_at: Instant,
    error_noted_at: Option<Instant>,
    /// The cursor record may hold a last error this task (or one before it) noted: cleared
    /// once the sink is idle with nothing blocked (a block an operator passed over, a failure
    /// whose events are gone), so no verdict goes on naming it.
    error_stored: bool,
    /// When the lag shown in the status was last read while the cursor stood still.
    lag_read_at: Option<Instant>,
    jitter: Jitter,
    /// Another member holds the sink (PostgreSQL): this task waits to take over.
    standby: bool,
    /// The store's id (`store::identity`), read when the sink registers.
    store_id: Option<[u8; 16]>,
    /// When operator actions were last looked for (`follow_operators`).
    reloaded_at: Option<Instant>,
    /// An audit sink's: entries its `outcomes` passes over, read but not yet below a written
    /// cursor (each goes into the ledger with the cursor write that passes it).
    not_selected: std::collections::BTreeSet<u64>,
    /// How far the store says the sink may have offered events (`SinkRecord::offered_to`,
    /// as last written or read): nothing at or past it is offered before it is raised.
    offered: u64,
    /// Positions below this may be at the receiver already (offered by this task, or by
    /// an earlier one before a restart or a kill): offering one again is a re-send.
    sent_to: u64,
    /// The log's head as last read (how far `offered_to` may be raised ahead).
    head: u64,
    /// A batch sink's cursor write running beside its next delivery, and where it moves
    /// the cursor (`flush_in_background`).
    background: Option<(
        tokio::task::JoinHandle<Result<CursorWrite, RelayError>>,
        u64,
    )>,
}

/// A cursor write under way beside a windowed sink's deliveries (`SinkTask::start_flush`).
struct Flushing {
    write: std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<CursorWrite, RelayError>> + Send>,
    >,
    /// Where it moves the cursor.
    to: u64,
}

/// What `read_batch` found.
struct Read {
    /// An event parked with `on_poison = "block"` holds the cursor.
    blocked: bool,
    /// The next batch.
    events: Vec<Event>,
    /// The position after the last one read (an audit sink's not selected included).
    scanned_to: u64,
    /// The log's head when it was read.
    head: u64,
}

/// Calls `f` with each position of `stream`'s log from `from` and the id of its event, or
/// `None` for an audit entry `selection` (outcome codes) does not select, until it breaks.
fn scan_log(
    snap: &crate::store::Snapshot,
    stream: Stream,
    from: u64,
    mut f: impl FnMut(u64, Option<String>) -> std::ops::ControlFlow<()>,
    selection: &Option<Vec<u8>>,
) -> Result<(), StoreError> {
    match stream {
        Stream::Effects => snap.scan_effects::<StoreError>(from, |e| {
            let r = &e.record;
            Ok(f(
                e.offset,
                Some(envelope::event_id(&r.key, r.released, &r.payload)),
            ))
        }),
        Stream::Audit => snap.scan_audit::<StoreError>(from, |e| {
            let selected = selection
                .as_ref()
                .is_none_or(|s| s.contains(&e.record.outcome));
            let id = selected.then(|| envelope::audit_event_id(e.index, &e.record.hash));
            Ok(f(e.index, id))
        }),
    }
}

/// How a wait ended.
#[derive(PartialEq, Eq)]
enum Woken {
    Stop,
    More,
}

impl SinkTask {
    fn name(&self) -> &str {
        &self.ctx.cfg.name
    }

    fn stopping(&self) -> bool {
        *self.ctx.stop.borrow()
    }

    async fn run(mut self) -> Result<(), RelayError> {
        if crate::testing::sink_panic_requested(&self.ctx.cfg.name) {
            panic!(
                "sink {} panics at start (failpoint REPLAY_GUARD_TEST_SINK_PANIC)",
                self.ctx.cfg.name
            );
        }
        // A store error (a failed read or cursor write) restarts the sink's loop after a
        // backoff rather than ending it: a stopped sink would hold retention back for good.
        let mut backoff = self.ctx.cfg.backoff_initial;
        let r = loop {
            match self.work().await {
                Ok(()) => break Ok(()),
                Err(RelayError::Store(StoreError::SinkBusy { .. }))
                    if self.ctx.shared.shared_store =>
                {
                    // Another member delivers this sink (or took it over while this one's
                    // connection was lost): stand by, and take over once its lock is free.
                    // What this task delivered since its last cursor write is delivered again
                    // by the other, with the same ids.
                    if !self.standby {
                        tracing::info!(sink = %self.ctx.cfg.name, "another member delivers this sink; standing by");
                        self.standby = true;
                    }
                    self.state.stand_by();
                    self.status(Phase::Standby, None);
                    if self.sleep(RELOAD_EVERY).await == Woken::Stop {
                        break Ok(());
                    }
                }
                Err(e) => {
                    tracing::error!(sink = %self.ctx.cfg.name, error = %super::terminal_safe(&e.to_string()), "relay sink failed; restarting it after a backoff: sink {}: {}", self.ctx.cfg.name, super::terminal_safe(&e.to_string()));
                    self.status(Phase::Failing, Some(e.to_string()));
                    let wait = self.jitter.full(backoff);
                    if self.sleep(wait).await == Woken::Stop {
                        break Err(e);
                    }
                    backoff = (backoff * 2).min(self.ctx.cfg.backoff_max);
                }
            }
        };
        let flushed = if self.standby {
            Ok(())
        } else {
            self.flush(true).await
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), self.sink.close()).await;
        self.ctx
            .shared
            .set_status(self.ctx.idx, |s| s.state = Phase::Stopped);
        r.and(flushed)
    }

    async fn work(&mut self) -> Result<(), RelayError> {
        // A cursor write left running by the loop before (it ended on an error) ends first:
        // registering reads the cursor it may move. Its own error is the one already met.
        if let Err(e) = self.settle_background().await {
            tracing::debug!(sink = %self.ctx.cfg.name, error = %e, "an earlier cursor write of sink {} failed: {e}", self.ctx.cfg.name);
        }
        self.register().await?;
        self.adopt_sink_cursor().await?;
        self.reloaded_at = None;
        loop {
            if self.stopping() {
                return Ok(());
            }
            self.follow_operators().await?;
            let Read {
                blocked,
                events: mut batch,
                mut scanned_to,
                mut head,
            } = self.read_batch().await?;
            if blocked {
                self.status(Phase::Blocked, None);
                self.refresh_lag(false).await;
                if self.wait(RELOAD_EVERY).await == Woken::Stop {
                    return Ok(());
                }
                self.reloaded_at = None;
                continue;
            }
            if batch.is_empty() && scanned_to > self.state.next() {
                // Only entries this audit sink does not select: passed over, accounted.
                self.state.advance_to(scanned_to);
                self.flush(true).await?;
                continue;
            }
            if batch.is_empty() {
                self.flush(true).await?;
                self.clear_stale_error().await?;
                self.status(Phase::Idle, None);
                if self.wait(crate::testing::relay_poll(RELOAD_EVERY)).await == Woken::Stop {
                    return Ok(());
                }
                continue;
            }
            if batch.len() < self.ctx.cfg.batch_max && !self.ctx.cfg.linger.is_zero() {
                if self.sleep(self.ctx.cfg.linger).await == Woken::Stop {
                    return Ok(());
                }
                // The read kept says how far the log was scanned: the window reads on from
                // there, so an event is never handed over twice.
                let more = self.read_batch().await?;
                if more.events.len() > batch.len() {
                    batch = more.events;
                    scanned_to = more.scanned_to;
                    head = more.head;
                }
            }
            self.status(Phase::Delivering, None);
            if self.sink.windowed() {
                self.settle_background().await?;
                self.pump(batch, scanned_to, head).await?;
            } else {
                self.deliver(&batch, head).await?;
            }
            if self.state.has_parked() {
                self.flush(false).await?;
            } else if self.flushed_at.elapsed() >= CURSOR_WRITE_EVERY {
                // Beside the next batch's delivery, as a windowed sink's is.
                self.flush_in_background().await?;
            }
        }
    }

    /// Starts the cursor write that is due now (one at a time: a finished one is followed
    /// first; one still under way is left to finish), to run while the next batch is
    /// delivered.
    async fn flush_in_background(&mut self) -> Result<(), RelayError> {
        if self
            .background
            .as_ref()
            .is_some_and(|(h, _)| !h.is_finished())
        {
            return Ok(());
        }
        self.settle_background().await?;
        if let Some(f) = self.start_flush() {
            self.background = Some((tokio::spawn(f.write), f.to));
        }
        Ok(())
    }

    /// Finishes the background cursor write, if any: every other write of this sink comes
    /// after it (a cursor write is a compare-and-set on where the cursor stands).
    async fn settle_background(&mut self) -> Result<(), RelayError> {
        if let Some((handle, to)) = self.background.take() {
            let w = handle.await.map_err(|error| RelayError::Task {
                what: "relay cursor write",
                error,
            })?;
            self.flushed(to, w).await?;
        }
        Ok(())
    }

    /// Operator actions from other processes (`relay retry|rewind|skip|discard|forget`), looked
    /// for at most every RELOAD_EVERY: between batches, and between attempts while a batch
    /// keeps failing, so a sink that is retrying or blocked follows them within a second.
    async fn follow_operators(&mut self) -> Result<(), RelayError> {
        if self.reloaded_at.is_some_and(|t| t.elapsed() < RELOAD_EVERY) {
            return Ok(());
        }
        self.settle_background().await?;
        self.reload_if_moved().await?;
        self.retry_requested().await?;
        self.reloaded_at = Some(Instant::now());
        Ok(())
    }

    async fn register(&mut self) -> Result<(), RelayError> {
        let (name, kind) = (self.name().to_string(), self.ctx.cfg.kind.name());
        let (start, stream) = (super::start_at(self.ctx.cfg.start), self.ctx.cfg.stream);
        let rec = self
            .ctx
            .shared
            .write(move |s| s.register_sink_on(&name, kind, stream, start, now_ms()))
            .await?;
        if self.store_id.is_none() {
            let identity = self.ctx.shared.read(|s| s.identity()).await?;
            self.store_id = identity.map(|i| i.id);
        }
        self.error_stored = rec.last_error.is_some();
        if rec
            .last_error
            .as_ref()
            .is_some_and(|(_, e)| e.starts_with(FAILING))
        {
            // Up again after a restart: no longer failing.
            let name = self.name().to_string();
            self.ctx
                .shared
                .write(move |s| s.clear_sink_error(&name, FAILING, now_ms()))
                .await?;
            self.error_stored = false;
        }
        if self.standby {
            tracing::info!(sink = %self.ctx.cfg.name, kind, next = rec.next, "relay sink taken over from another member");
            self.standby = false;
        } else {
            tracing::info!(sink = %self.ctx.cfg.name, kind, next = rec.next, "relay sink started");
        }
        self.offered = rec.offered_to.max(rec.next);
        self.sent_to = self.sent_to.max(self.offered);
        self.state.registered(rec);
        Ok(())
    }

    /// The `offered_to` a cursor write left, as far as this task may now offer.
    fn note_offered(&mut self, w: &CursorWrite) {
        if let CursorWrite::Done(r) = w {
            self.offered = self.offered.max(r.offered_to);
        }
    }

    /// What a cursor write raises `offered_to` to beside its move: `OFFER_AHEAD_BATCHES`
    /// past what was offered, not past the head last read, so that the offers up to there
    /// need no write of their own.
    fn offer_ahead(&self) -> u64 {
        self.ahead_of(self.sent_to, self.head)
    }

    /// `OFFER_AHEAD_BATCHES` batches past `end`, but not past `head` (a later event would
    /// count as re-sent at its first offer after a restart), nor below `end`.
    fn ahead_of(&self, end: u64, head: u64) -> u64 {
        let ahead = (self.ctx.cfg.batch_max as u64).saturating_mul(OFFER_AHEAD_BATCHES);
        end.saturating_add(ahead).min(head.max(end))
    }

    /// Before `events` are offered to the receiver: counts those that may be there already
    /// (below `sent_to`) as re-sent, and raises the store's `offered_to` past the last of
    /// them if it is not there yet, durably, in one write that also records the re-sends.
    /// So the store's `resent` is never below what a receiver can have got twice, and after
    /// a kill -9 everything offered since the last cursor write lies below `offered_to`.
    /// `false` when an operator moved the cursor meanwhile (the events are then not this
    /// task's to offer).
    async fn offer(&mut self, events: &[Event], head: u64) -> Result<bool, RelayError> {
        self.head = self.head.max(head);
        let Some(last) = events.last() else {
            return Ok(true);
        };
        let end = last.offset + 1;
        let resent = events.iter().filter(|e| e.offset < self.sent_to).count() as u64;
        self.sent_to = self.sent_to.max(end);
        if end <= self.offered && resent == 0 {
            return Ok(true);
        }
        self.settle_background().await?;
        let Some(generation) = self.state.generation() else {
            return Ok(true);
        };
        let name = self.name().to_string();
        // Ahead of what is offered now, so that the next batches need no write of their own.
        let to = self.ahead_of(end, head).max(self.offered);
        let w = self
            .ctx
            .shared
            .write(move |s| s.offer_sink(&name, generation, to, resent, now_ms()))
            .await?;
        match w {
            CursorWrite::Done(r) => {
                self.offered = r.offered_to;
                Ok(true)
            }
            CursorWrite::Moved(_) => {
                self.reloaded_at = None;
                self.follow_operators().await?;
                Ok(false)
            }
        }
    }

    /// A sink that keeps its cursor beside its data (postgres), for this store and its table,
    /// committed with its rows, is adopted (`state::adoption`): backwards (the sink's store
    /// was restored from a backup: what it lacks is delivered again), and forwards as far as
    /// the rows are really there (checked by id). An operator's rewind made since (a newer
    /// generation here) wins over it. Either way the move is audited.
    async fn adopt_sink_cursor(&mut self) -> Result<(), RelayError> {
        let Some(store) = self.store_id else {
            return Ok(());
        };
        let mut backoff = self.ctx.cfg.backoff_initial;
        let stored = loop {
            let mut stop = self.ctx.stop.clone();
            let stored = tokio::select! {
                c = self.sink.stored_cursor(store) => c,
                _ = stop.wait_for(|s| *s) => return Ok(()),
            };
            match stored {
                Ok(c) => break c,
                Err(e) => {
                    let e = e.to_string();
                    self.status(Phase::Connecting, Some(e.clone()));
                    self.refresh_lag(false).await;
                    self.note_error(&e).await?;
                    let wait = self.jitter.full(backoff);
                    if self.sleep(wait).await == Woken::Stop {
                        return Ok(());
                    }
                    backoff = (backoff * 2).min(self.ctx.cfg.backoff_max);
                }
            }
        };
        let (Some(c), Some(rec)) = (stored, self.state.rec().cloned()) else {
            return Ok(());
        };
        let to = match state::adoption(store, &rec, &c, ADOPT_CHECK_MAX) {
            Adoption::Keep => return Ok(()),
            Adoption::Back { to } => {
                // A row from before this cursor was made (the sink forgotten and added
                // again, or started at the head) says nothing of what this cursor delivered.
                let name = self.name().to_string();
                let start = self
                    .ctx
                    .shared
                    .read(move |s| {
                        Ok(s.sink_ledger(&name)?
                            .first()
                            .filter(|(_, e)| e.kind == LedgerKind::Start.code())
                            .map(|(_, e)| e.from))
                    })
                    .await?;
                if !state::back_allowed(to, start) {
                    tracing::info!(sink = %self.ctx.cfg.name, stored = to, start = ?start, "the sink's own cursor row is older than this cursor: not adopted");
                    return Ok(());
                }
                // An audit sink's own row stays at its last delivered entry while the
                // cursor here passes the entries its `outcomes` does not select: nothing
                // between them is for the sink's store.
                let (stream, selection, next) = (self.ctx.cfg.stream, self.selection(), rec.next);
                let lacks_any = self
                    .ctx
                    .shared
                    .read(move |s| {
                        let mut any = false;
                        scan_log(
                            s,
                            stream,
                            to,
                            |pos, id| {
                                any = pos < next && id.is_some();
                                if any || pos + 1 >= next {
                                    std::ops::ControlFlow::Break(())
                                } else {
                                    std::ops::ControlFlow::Continue(())
                                }
                            },
                            &selection,
                        )?;
                        Ok(any)
                    })
                    .await?;
                if !lacks_any {
                    return Ok(());
                }
                to
            }
            Adoption::Forward {
                from,
                check_to,
                stored,
            } => {
                // The events the sink would hold from `from`, by position (an audit sink's
                // selected entries only).
                let (stream, selection) = (self.ctx.cfg.stream, self.selection());
                let events = self
                    .ctx
                    .shared
                    .read(move |s| {
                        let mut events = Vec::new();
                        scan_log(
                            s,
                            stream,
                            from,
                            |pos, id| {
                                if pos >= check_to {
                                    return std::ops::ControlFlow::Break(());
                                }
                                if let Some(id) = id {
                                    events.push((pos, id));
                                }
                                std::ops::ControlFlow::Continue(())
                            },
                            &selection,
                        )?;
                        Ok(events)
                    })
                    .await?;
                let ids: Vec<String> = events.iter().map(|(_, id)| id.clone()).collect();
                let held = match self.sink.holds_prefix(&ids).await {
                    // Up to the first event it lacks (or all that was checked).
                    Ok(n) => events.get(n).map_or(check_to, |(pos, _)| *pos) - from,
                    Err(e) => {
                        let e = e.to_string();
                        tracing::warn!(sink = %self.ctx.cfg.name, error = %super::terminal_safe(&e), "cannot check the own store of sink {} ({}); its cursor is not adopted (what it holds is delivered again, and not stored twice)", self.ctx.cfg.name, super::terminal_safe(&e));
                        return Ok(());
                    }
                };
                if from + held < stored {
                    tracing::warn!(sink = %self.ctx.cfg.name, stored, held_to = from + held, "the own cursor of sink {} ({stored}) is ahead of the events its table holds: adopting it only as far as they go ({})", self.ctx.cfg.name, from + held);
                }
                match state::forward_to(from, held) {
                    Some(to) => to,
                    None => return Ok(()),
                }
            }
        };
        let name = self.name().to_string();
        let held_by = self.sink.cursor_home();
        let w = self
            .ctx
            .shared
            .write(move |s| s.adopt_sink_cursor(&name, rec.generation, to, &held_by, now_ms()))
            .await?;
        tracing::info!(sink = %self.ctx.cfg.name, from = rec.next, to, "cursor taken from the sink's own store (audited)");
        if let CursorWrite::Done(r) = &w
            && r.next > to
        {
            tracing::error!(sink = %self.ctx.cfg.name, lacked_from = to, kept_from = r.next, "the own store of sink {} lacks effects {to}..{} that retention has removed here: they cannot be delivered again (see the audit log)", self.ctx.cfg.name, r.next);
        }
        // Also backwards: a sink store restored from a backup gets what it lacks.
        let adopted = self.state.adopt_from(w);
        self.adopted(adopted);
        Ok(())
    }

    /// Follows a cursor write's outcome (`SinkState::adopt`).
    fn adopt(&mut self, w: CursorWrite) {
        let adopted = self.state.adopt(w);
        self.adopted(adopted);
    }

    fn adopted(&self, adopted: Adopted) {
        match adopted {
            Adopted::Written => {}
            Adopted::MovedByOperator { next, generation } => {
                tracing::info!(sink = %self.ctx.cfg.name, next, generation, "cursor moved by an operator: delivering from there");
            }
            Adopted::Forgotten => {
                tracing::warn!(sink = %self.ctx.cfg.name, "the cursor of sink {} was forgotten while it ran: registering it again", self.ctx.cfg.name);
            }
            Adopted::Stale => {
                tracing::debug!(sink = %self.ctx.cfg.name, "a cursor write of an older generation ended after an operator's move: ignored");
            }
        }
    }

    /// Writes the cursor if it moved (or parked something), or when `always` and unwritten
    /// progress exists. A cursor moved meanwhile by an operator is adopted instead.
    async fn flush(&mut self, always: bool) -> Result<(), RelayError> {
        self.settle_background().await?;
        let (generation, from, to) =
            match self
                .state
                .flush_due(always, self.flushed_at.elapsed(), CURSOR_WRITE_EVERY)
            {
                FlushDue::Register => return self.register().await,
                FlushDue::Nothing => return Ok(()),
                FlushDue::Write {
                    generation,
                    from,
                    to,
                } => (generation, from, to),
            };
        let name = self.name().to_string();
        let parked = self.state.take_parked();
        let kept = parked.clone();
        let passed: Vec<u64> = self.not_selected.range(from..to).copied().collect();
        let offered = self.offer_ahead();
        let w = match self
            .ctx
            .shared
            .write(move |s| {
                s.advance_sink_passing(
                    &name,
                    generation,
                    from,
                    to,
                    &parked,
                    &passed,
                    offered,
                    now_ms(),
                )
            })
            .await
        {
            Ok(w) => {
                // Below a written cursor: accounted for, or (after a rewind) read again.
                self.not_selected = self.not_selected.split_off(&to);
                self.note_offered(&w);
                w
            }
            Err(e) => {
                // Not written: the parked events must go with the next write that succeeds.
                self.state.restore_parked(kept);
                return Err(e);
            }
        };
        self.flushed_at = Instant::now();
        self.adopt(w);
        self.refresh_lag(true).await;
        Ok(())
    }

    /// Reads the log's head and when the effect at the cursor was received into the sink's
    /// status (as `relay status` computes its lag); `force`: whatever the last read, else at
    /// most every RELOAD_EVERY. A failed read leaves the last figures.
    async fn refresh_lag(&mut self, force: bool) {
        if !force && self.lag_read_at.is_some_and(|t| t.elapsed() < RELOAD_EVERY) {
            return;
        }
        self.lag_read_at = Some(Instant::now());
        let (next, stream) = (self.state.next(), self.ctx.cfg.stream);
        let read = self
            .ctx
            .shared
            .read(move |s| {
                let head = s.log_head(stream)?;
                let oldest = if head <= next {
                    None
                } else if stream == Stream::Audit {
                    s.audit_entry(next)?.map(|e| e.record.recorded_at_ms)
                } else {
                    s.effect(next)?.map(|e| e.record.received_at_ms)
                };
                Ok((head, oldest))
            })
            .await;
        match read {
            Ok((head, oldest)) => self
                .ctx
                .shared
                .set_status(self.ctx.idx, |s| s.read_lag(next, head, oldest)),
            Err(e) => {
                tracing::debug!(sink = %self.ctx.cfg.name, error = %e, "could not read the sink's lag");
                self.ctx.shared.set_status(self.ctx.idx, |s| s.next = next);
            }
        }
    }

    async fn reload_if_moved(&mut self) -> Result<(), RelayError> {
        let name = self.name().to_string();
        let stored = self.ctx.shared.read(move |s| s.sink_cursor(&name)).await?;
        let Some(generation) = self.state.generation() else {
            return self.register().await;
        };
        match stored {
            None => self.adopt(CursorWrite::Moved(None)),
            Some(s) if s.generation != generation => self.adopt(CursorWrite::Moved(Some(s))),
            Some(_) => {}
        }
        if self.state.rec().is_none() {
            self.register().await?;
        }
        Ok(())
    }

    /// Delivers every parked event an operator asked to retry (`relay retry`), once each. The
    /// event is rebuilt from its effect in the log (which `verify` proves), never sent from
    /// the copy kept in the parked record; an event whose effect is gone is not sent.
    async fn retry_requested(&mut self) -> Result<(), RelayError> {
        let name = self.name().to_string();
        let source = self.ctx.shared.source.clone();
        let stream = self.ctx.cfg.stream;
        let wanted = self
            .ctx
            .shared
            .read(move |s| {
                let mut out = Vec::new();
                for p in s.sink_parked(Some(&name))? {
                    if p.record.retry_requested_at_ms.is_none() {
                        continue;
                    }
                    let event = match stream {
                        Stream::Effects => s
                            .effect(p.offset)?
                            .map(|e| Event::of_effect(&source, e.offset, &e.record)),
                        Stream::Audit => s
                            .audit_entry(p.offset)?
                            .map(|e| Event::of_audit(&source, &e)),
                    };
                    out.push((p, event));
                }
                Ok(out)
            })
            .await?;
        for (p, ev) in wanted {
            let Some(ev) = ev else {
                let why = format!(
                    "not retried: {} {} is no longer in the {} log (retention removed it \
                     before this version kept what parked events need), so the event \
                     cannot be rebuilt from a record `verify` proves, and the copy kept when \
                     it was parked is not sent",
                    match stream {
                        Stream::Effects => "effect",
                        Stream::Audit => "audit entry",
                    },
                    p.offset,
                    stream.as_str()
                );
                tracing::error!(sink = %self.ctx.cfg.name, offset = p.offset, "sink {}, offset {}: {why}", self.ctx.cfg.name, p.offset);
                self.retry_failed(&p, why).await?;
                continue;
            };
            let cursor = self.cursor_after(self.state.retry_cursor(p.offset, p.record.blocking));
            let generation = cursor.generation;
            let Some(attempt) = self
                .abortable_deliver(std::slice::from_ref(&ev), cursor)
                .await
            else {
                return Ok(());
            };
            let name = self.name().to_string();
            if attempt.delivered == 1 {
                tracing::info!(sink = %self.ctx.cfg.name, offset = p.offset, id = %ev.id, "parked event delivered after retry");
                let w = self
                    .ctx
                    .shared
                    .write(move |s| s.parked_delivered(&name, p.offset, generation, now_ms()))
                    .await?;
                if p.record.blocking
                    && let CursorWrite::Done(r) = &w
                {
                    self.state.advance_to(r.next);
                }
                self.adopt(w);
            } else {
                match Retried::of(attempt.failure) {
                    Retried::NotYet(error) => {
                        // Transient (a 503, a lost connection): the request stands and is
                        // tried again on the next round, about a second later.
                        tracing::warn!(sink = %self.ctx.cfg.name, offset = p.offset, error = %super::terminal_safe(&error), "retried parked event not delivered yet; trying again: sink {}, offset {}: {}", self.ctx.cfg.name, p.offset, super::terminal_safe(&error));
                        self.status(Phase::Retrying, Some(error.clone()));
                        self.note_error(&error).await?;
                    }
                    Retried::Refused(why) => {
                        tracing::warn!(sink = %self.ctx.cfg.name, offset = p.offset, error = %super::terminal_safe(&why), "retried parked event refused again; it stays parked: sink {}, offset {}: {}", self.ctx.cfg.name, p.offset, super::terminal_safe(&why));
                        self.retry_failed(&p, why).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `deliver`, abandoned (`None`) when the shutdown timeout is reached: dropping the attempt
    /// closes its connection or kills its program; what it did not confirm is delivered again
    /// after the restart.
    async fn abortable_deliver(&mut self, batch: &[Event], cursor: CursorAfter) -> Option<Attempt> {
        let mut hard = self.ctx.hard.clone();
        tokio::select! {
            a = self.sink.deliver(batch, cursor) => Some(a),
            _ = hard.wait_for(|h| *h) => {
                tracing::warn!(sink = %self.ctx.cfg.name, "shutdown timeout: abandoning the delivery in progress to sink {}", self.ctx.cfg.name);
                None
            }
        }
    }

    fn cursor_after(&self, next_after: u64) -> CursorAfter {
        CursorAfter {
            store: self.store_id.unwrap_or_default(),
            generation: self.state.generation().unwrap_or(0),
            next_after,
        }
    }

    /// An audit sink's `outcomes` (`None`: every entry; always `None` for an effects sink).
    fn selection(&self) -> Option<Vec<u8>> {
        self.ctx
            .cfg
            .outcomes
            .as_ref()
            .map(|o| o.iter().map(|o| o.code()).collect())
    }

    /// From one snapshot: whether an event parked with `on_poison = "block"` holds the
    /// cursor, and else the next batch from it. An audit sink's entries that its `outcomes`
    /// does not select are noted (`not_selected`), not offered.
    async fn read_batch(&mut self) -> Result<Read, RelayError> {
        let (read, passed) = self
            .read_from(self.state.next(), self.ctx.cfg.batch_max)
            .await?;
        self.not_selected.extend(passed);
        Ok(read)
    }

    /// `read_batch` from `from`, at most `max` events, as a future that borrows nothing of
    /// the task (the windowed sink's reads run beside its acknowledgements); the audit
    /// entries passed over come back beside the read, for `not_selected`.
    fn read_from(
        &self,
        from: u64,
        max: usize,
    ) -> impl std::future::Future<Output = Result<(Read, Vec<u64>), RelayError>> + Send + 'static
    {
        let source = self.ctx.shared.source.clone();
        let name = self.name().to_string();
        let (stream, selection) = (self.ctx.cfg.stream, self.selection());
        let shared = self.ctx.shared.clone();
        async move {
            shared
                .read(move |snap| {
                    if snap
                        .sink_parked_at(&name, from)?
                        .is_some_and(|p| p.blocking)
                    {
                        return Ok((
                            Read {
                                blocked: true,
                                events: Vec::new(),
                                scanned_to: from,
                                head: from,
                            },
                            Vec::new(),
                        ));
                    }
                    let meta = snap.meta()?;
                    let head = match stream {
                        Stream::Effects => meta.next_effect,
                        Stream::Audit => meta.next_audit,
                    };
                    let mut events = Vec::with_capacity(max.min(1024));
                    let mut passed = Vec::new();
                    let mut scanned_to = from;
                    // Entries passed over count too, so one batch reads a bounded stretch.
                    let scan_max = max.saturating_mul(16).max(1024);
                    let mut scanned = 0;
                    let mut push = |pos: u64, ev: Option<Event>| {
                        scanned_to = pos + 1;
                        scanned += 1;
                        match ev {
                            Some(ev) => events.push(ev),
                            None => passed.push(pos),
                        }
                        if events.len() >= max || scanned >= scan_max {
                            std::ops::ControlFlow::Break(())
                        } else {
                            std::ops::ControlFlow::Continue(())
                        }
                    };
                    match stream {
                        Stream::Effects => snap.scan_effects::<StoreError>(from, |e| {
                            Ok(push(
                                e.offset,
                                Some(Event::of_effect(&source, e.offset, &e.record)),
                            ))
                        })?,
                        Stream::Audit => snap.scan_audit::<StoreError>(from, |e| {
                            let selected = selection
                                .as_ref()
                                .is_none_or(|s| s.contains(&e.record.outcome));
                            let ev = selected.then(|| Event::of_audit(&source, &e));
                            Ok(push(e.index, ev))
                        })?,
                    }
                    Ok((
                        Read {
                            blocked: false,
                            events,
                            scanned_to,
                            head: head.max(scanned_to),
                        },
                        passed,
                    ))
                })
                .await
        }
    }

    /// Delivers `batch` until all of it is delivered or parked, or the relay stops; after
    /// each attempt, does what `SinkState::attempt` says.
    async fn deliver(&mut self, batch: &[Event], head: u64) -> Result<(), RelayError> {
        let mut i = 0;
        self.state.begin_batch();
        // A cursor write below may find that an operator moved the cursor (`relay rewind`):
        // the rest of this batch is then not ours to deliver.
        let generation = self.state.generation();
        let moved = |t: &SinkTask| t.state.generation() != generation;
        while i < batch.len() {
            let rest = &batch[i..];
            if !self.offer(rest, head).await? || moved(self) {
                return Ok(());
            }
            let cursor = self.cursor_after(rest[rest.len() - 1].offset + 1);
            let Some(Attempt { delivered, failure }) = self.abortable_deliver(rest, cursor).await
            else {
                return Ok(());
            };
            let attempted = self.state.attempt(rest, delivered, failure);
            i += attempted.delivered;
            if let Some(class) = attempted.unblocked {
                tracing::info!(sink = %self.ctx.cfg.name, %class, "the receiver accepts events again: the sink is no longer blocked");
            }
            match attempted.step {
                Step::Go => {}
                Step::End => return Ok(()),
                Step::BackOff {
                    failures,
                    after,
                    error,
                    state,
                } => {
                    if self.back_off(failures, after, &error, state).await
                        || self.followed(moved).await?
                    {
                        return Ok(());
                    }
                }
                Step::Park(park) => {
                    let Some(ev) = batch.get(i) else {
                        return Ok(());
                    };
                    if self.park(&park, ev).await? || moved(self) {
                        return Ok(());
                    }
                    self.state.passed(park);
                    i += 1;
                }
                Step::Block(block) => {
                    self.block(&block).await?;
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Delivers through a windowed sink from the cursor on, starting with `first` (read up to
    /// `scanned_to`): the next events are read and handed over while earlier ones await
    /// their acknowledgement (`state::Window`), and the cursor moves over the acknowledged
    /// prefix only. A failure is followed as `deliver` follows it (backoff, park, block);
    /// everything after the cursor is then handed over again. Returns once nothing is pending
    /// and the log held nothing more for `CURSOR_FLUSH`, or the sink blocks, an operator moves
    /// the cursor, or the relay stops (what is in flight is acknowledged first, unless the
    /// shutdown timeout is reached).
    async fn pump(
        &mut self,
        first: Vec<Event>,
        scanned_to: u64,
        head: u64,
    ) -> Result<(), RelayError> {
        type Reading = std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<(Read, Vec<u64>), RelayError>> + Send>,
        >;
        self.state.begin_batch();
        let generation = self.state.generation();
        let moved = |t: &SinkTask| t.state.generation() != generation;
        let mut win = Window::new(self.state.next(), self.ctx.cfg.batch_max);
        // A window starts empty, at the cursor: whatever an earlier pump left in flight (it
        // returned on an error) is forgotten, or its acknowledgements would be credited to
        // this window's events.
        self.sink.forget();
        if !self.offer(&first, head).await? || moved(self) {
            return Ok(());
        }
        self.sink.hand(&first);
        win.read(first, scanned_to);
        let mut reading: Option<Reading> = None;
        let (mut stop, mut hard) = (self.ctx.stop.clone(), self.ctx.hard.clone());
        let (mut stop_seen, mut wake_closed) = (false, false);
        // Parked events an operator asked to retry go out once the window is empty.
        let mut hold = false;
        let mut idle_since: Option<Instant> = None;
        let mut failing = false;
        let mut flushing: Option<Flushing> = None;
        loop {
            let stopping = stop_seen || self.stopping();
            if win.is_empty() && reading.is_none() {
                if stopping {
                    break;
                }
                if hold {
                    self.settle_flush(&mut flushing).await?;
                    self.retry_requested().await?;
                    hold = false;
                    if moved(self) {
                        break;
                    }
                    win.restart(self.state.next());
                }
                if win.drained() {
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= CURSOR_FLUSH {
                        break;
                    }
                } else {
                    idle_since = None;
                }
            }
            // The cursor is written beside the deliveries (a write in progress is finished
            // before any other write of this sink: a park, a backoff's, a retried event's).
            if flushing.is_none() {
                flushing = self.start_flush();
            }
            if moved(self) {
                self.sink.forget();
                break;
            }
            if self.reloaded_at.is_none_or(|t| t.elapsed() >= RELOAD_EVERY) {
                self.reload_if_moved().await?;
                hold |= self.retry_wanted().await?;
                self.reloaded_at = Some(Instant::now());
                if moved(self) {
                    self.sink.forget();
                    break;
                }
            }
            if reading.is_none()
                && !stopping
                && !hold
                && let Some((from, max)) = win.wants()
            {
                reading = Some(Box::pin(self.read_from(from, max)));
            }
            let tick =
                idle_since.map_or(CURSOR_FLUSH, |t| CURSOR_FLUSH.saturating_sub(t.elapsed()));
            let pending = !win.is_empty();
            tokio::select! {
                r = async {
                    match reading.as_mut() {
                        Some(f) => f.await,
                        None => std::future::pending().await,
                    }
                } => {
                    reading = None;
                    let (read, passed) = r?;
                    self.not_selected.extend(passed);
                    if read.blocked {
                        // An event parked to block holds the cursor: the work loop waits there.
                        if win.is_empty() {
                            break;
                        }
                        win.read(Vec::new(), read.scanned_to);
                        continue;
                    }
                    // The cursor write under way, if any, goes first (one write of this
                    // sink at a time), then what is offered is recorded, then offered.
                    if !read.events.is_empty() {
                        self.settle_flush(&mut flushing).await?;
                        if !self.offer(&read.events, read.head).await? || moved(self) {
                            self.sink.forget();
                            break;
                        }
                    }
                    self.sink.hand(&read.events);
                    win.read(read.events, read.scanned_to);
                    if win.is_empty() {
                        // Only entries this audit sink does not select: passed over.
                        if let Some(to) = win.acked(0) {
                            self.state.advance_to(to);
                        }
                    }
                }
                a = self.sink.acked(), if pending => {
                    let Attempt { delivered, failure } = a;
                    let attempted = self.state.attempt(win.pending(), delivered, failure);
                    if let Some(class) = attempted.unblocked {
                        tracing::info!(sink = %self.ctx.cfg.name, %class, "the receiver accepts events again: the sink is no longer blocked");
                    }
                    if attempted.step == Step::Go {
                        if let Some(to) = win.acked(attempted.delivered) {
                            self.state.advance_to(to);
                        }
                        if failing {
                            failing = false;
                            self.status(Phase::Delivering, None);
                        }
                        continue;
                    }
                    // A failure: the sink forgot everything handed over; what is read from
                    // here on starts at the cursor again.
                    let front = win.pending().get(attempted.delivered).cloned();
                    self.settle_flush(&mut flushing).await?;
                    self.sink.forget();
                    if moved(self) {
                        // The write in flight found an operator's move: the failure is of
                        // events of the old generation, and nothing of it (a park past the
                        // refused event, above all) may move the new cursor.
                        break;
                    }
                    reading = None;
                    win.restart(self.state.next());
                    failing = true;
                    match attempted.step {
                        Step::Go | Step::End => {}
                        Step::BackOff { failures, after, error, state } => {
                            if self.back_off(failures, after, &error, state).await
                                || self.followed(moved).await?
                            {
                                break;
                            }
                        }
                        Step::Park(park) => {
                            let Some(ev) = front else {
                                break;
                            };
                            if self.park(&park, &ev).await? || moved(self) {
                                break;
                            }
                            self.state.passed(park);
                        }
                        Step::Block(block) => {
                            self.block(&block).await?;
                            break;
                        }
                    }
                    win.restart(self.state.next());
                }
                r = self.ctx.wake.changed(), if win.drained() && !wake_closed => {
                    wake_closed = r.is_err();
                    win.woken();
                }
                _ = async { stop.wait_for(|s| *s).await.is_ok() }, if !stop_seen => {
                    // Stopping (or nobody can ask any more): nothing more is read.
                    stop_seen = true;
                }
                w = async {
                    match flushing.as_mut() {
                        Some(f) => (&mut f.write).await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Some(f) = flushing.take() {
                        self.flushed(f.to, w).await?;
                    }
                }
                _ = async { hard.wait_for(|h| *h).await.is_ok() } => {
                    tracing::warn!(sink = %self.ctx.cfg.name, "shutdown timeout: abandoning the deliveries in flight to sink {}", self.ctx.cfg.name);
                    self.sink.forget();
                    break;
                }
                () = tokio::time::sleep(tick) => {
                    // The log is looked at again at least this often, woken or not.
                    if win.drained() && !pending {
                        win.woken();
                    }
                }
            }
        }
        self.settle_flush(&mut flushing).await
    }

    /// The cursor write `flush(false)` would make now, started beside the window's
    /// deliveries (`None`: none due, or one with parked events, which `flush` makes).
    fn start_flush(&mut self) -> Option<Flushing> {
        if self.state.has_parked() {
            return None;
        }
        let FlushDue::Write {
            generation,
            from,
            to,
        } = self
            .state
            .flush_due(false, self.flushed_at.elapsed(), CURSOR_WRITE_EVERY)
        else {
            return None;
        };
        let name = self.name().to_string();
        let passed: Vec<u64> = self.not_selected.range(from..to).copied().collect();
        let shared = self.ctx.shared.clone();
        let offered = self.offer_ahead();
        Some(Flushing {
            write: Box::pin(async move {
                shared
                    .write(move |s| {
                        s.advance_sink_passing(
                            &name,
                            generation,
                            from,
                            to,
                            &[],
                            &passed,
                            offered,
                            now_ms(),
                        )
                    })
                    .await
            }),
            to,
        })
    }

    /// Follows a cursor write `start_flush` made, as `flush` does.
    async fn flushed(
        &mut self,
        to: u64,
        w: Result<CursorWrite, RelayError>,
    ) -> Result<(), RelayError> {
        let w = w?;
        self.not_selected = self.not_selected.split_off(&to);
        self.flushed_at = Instant::now();
        self.note_offered(&w);
        self.adopt(w);
        self.refresh_lag(true).await;
        Ok(())
    }

    /// Finishes the cursor write in progress, if any.
    async fn settle_flush(&mut self, flushing: &mut Option<Flushing>) -> Result<(), RelayError> {
        match flushing.take() {
            Some(f) => {
                let w = f.write.await;
                self.flushed(f.to, w).await
            }
            None => Ok(()),
        }
    }

    /// Whether an operator asked to retry a parked event of this sink (`relay retry`).
    fn retry_wanted(
        &self,
    ) -> impl std::future::Future<Output = Result<bool, RelayError>> + Send + 'static {
        let name = self.name().to_string();
        let shared = self.ctx.shared.clone();
        async move {
            shared
                .read(move |s| {
                    Ok(s.sink_parked(Some(&name))?
                        .iter()
                        .any(|p| p.record.retry_requested_at_ms.is_some()))
                })
                .await
        }
    }

    /// Between two attempts at a failing batch: follows operator actions; `true` when one
    /// moved the cursor (the rest of the batch is then not this task's to deliver).
    async fn followed(&mut self, moved: impl Fn(&SinkTask) -> bool) -> Result<bool, RelayError> {
        self.follow_operators().await?;
        Ok(moved(self))
    }

    /// Parks `ev` as `park` says and writes the cursor with it (`on_poison = "block"`: the
    /// cursor waits at it). `true` when the rest of the batch is not to be delivered now (the
    /// sink blocks at it, or an operator moved the cursor since the attempt: nothing parked).
    async fn park(&mut self, park: &Park, ev: &Event) -> Result<bool, RelayError> {
        let parking = self.state.park(park, ev, now_ms());
        if parking == Parking::Moved {
            tracing::info!(sink = %self.ctx.cfg.name, offset = ev.offset, id = %ev.id, next = self.state.next(), "event refused before an operator moved the cursor: not parked; delivering from the moved cursor");
            return Ok(true);
        }
        tracing::warn!(sink = %self.ctx.cfg.name, offset = ev.offset, id = %ev.id, reason = %super::terminal_safe(&park.reason), blocking = park.blocking, "event refused for good: parked: sink {}, offset {}, id {}: {}", self.ctx.cfg.name, ev.offset, ev.id, super::terminal_safe(&park.reason));
        self.flush(true).await?;
        Ok(parking == Parking::Blocks)
    }

    /// The receiver refuses every event (`Step::Block`): the events parked for it right
    /// before are taken back out of the parked events (the cursor returns to the first) and
    /// the sink holds there, retrying with backoff, until the receiver accepts events again.
    async fn block(&mut self, block: &Block) -> Result<(), RelayError> {
        // The cursor first goes up to the refused event over what it passed over meanwhile
        // (an audit sink's entries outside its `outcomes`), so that the take-back below
        // finds every position of its stretch accounted for.
        let mut next = self.state.next();
        while next < block.offset && self.not_selected.contains(&next) {
            next += 1;
        }
        if next == block.offset {
            self.state.advance_to(next);
        }
        self.flush(true).await?;
        let mut at = block.offset;
        if let Some((first, to)) = block.take_back
            && let Some(generation) = self.state.generation()
        {
            let name = self.name().to_string();
            let w = self
                .ctx
                .shared
                .write(move |s| s.unpark(&name, generation, first, to, now_ms()))
                .await?;
            if let CursorWrite::Done(r) = &w
                && r.next == first
            {
                at = first;
            }
            let adopted = self.state.adopt_back(w);
            self.adopted(adopted);
        }
        self.state.block(block.class.clone());
        let error = block.error(at, at != block.offset);
        tracing::error!(sink = %self.ctx.cfg.name, offset = at, class = %block.class, error = %super::terminal_safe(&error), "relay sink blocked: sink {} at offset {at} ({}): {}", self.ctx.cfg.name, block.class, super::terminal_safe(&error));
        self.error_noted_at = None;
        self.back_off(1, None, &error, Phase::Blocked).await;
        Ok(())
    }

    /// Waits before the next attempt; `true` when the relay is stopping.
    async fn back_off(
        &mut self,
        failures: u32,
        after: Option<Duration>,
        error: &str,
        state: Phase,
    ) -> bool {
        let (initial, max) = (self.ctx.cfg.backoff_initial, self.ctx.cfg.backoff_max);
        let wait = self.jitter.backoff(initial, max, failures, after);
        tracing::warn!(sink = %self.ctx.cfg.name, attempt = failures, wait_ms = wait.as_millis() as u64, error = %super::terminal_safe(error), "delivery failed; retrying: sink {}, attempt {failures}, in {} ms: {}", self.ctx.cfg.name, wait.as_millis(), super::terminal_safe(error));
        // The lag shown while failing is the log's, not the one of the last cursor write.
        self.refresh_lag(false).await;
        self.status(state, Some(error.to_string()));
        if let Err(e) = self.note_error(error).await {
            tracing::warn!(sink = %self.ctx.cfg.name, error = %e, "could not record the error of sink {}: {e}", self.ctx.cfg.name);
        }
        // Progress made before the failure is written now, not after the backoff.
        if let Err(e) = self.flush(true).await {
            tracing::warn!(sink = %self.ctx.cfg.name, error = %e, "could not write the cursor of sink {}: {e}", self.ctx.cfg.name);
        }
        self.sleep(wait).await == Woken::Stop
    }

    /// Records that the retry of parked event `p` did not deliver it: it stays parked, `why`
    /// kept as its last response.
    async fn retry_failed(&self, p: &Parked, why: String) -> Result<(), RelayError> {
        let (name, offset, requested) = (
            self.name().to_string(),
            p.offset,
            p.record.retry_requested_at_ms,
        );
        self.ctx
            .shared
            .write(move |s| s.parked_failed(&name, offset, requested, &why, now_ms()))
            .await
    }

    /// Idle, nothing blocked: a last error still in the cursor record names what is over
    /// (a block an operator passed over with `relay skip` while an attempt was refused, a
    /// failure whose events were delivered or passed over since). Cleared, once.
    async fn clear_stale_error(&mut self) -> Result<(), RelayError> {
        if !self.error_stored || self.state.is_blocked() {
            return Ok(());
        }
        self.settle_background().await?;
        let name = self.name().to_string();
        self.ctx
            .shared
            .write(move |s| s.clear_sink_error(&name, "", now_ms()))
            .await?;
        self.error_stored = false;
        Ok(())
    }

    async fn note_error(&mut self, error: &str) -> Result<(), RelayError> {
        self.settle_background().await?;
        if self
            .error_noted_at
            .is_some_and(|t| t.elapsed() < ERROR_NOTE_EVERY)
        {
            return Ok(());
        }
        self.error_noted_at = Some(Instant::now());
        self.error_stored = true;
        let (name, error) = (self.name().to_string(), error.to_string());
        self.ctx
            .shared
            .write(move |s| s.note_sink_error(&name, &error, now_ms()))
            .await
    }

    fn status(&self, state: Phase, error: Option<String>) {
        let next = self.state.next();
        self.ctx
            .shared
            .set_status(self.ctx.idx, |s| s.enter(state, next, error));
    }

    /// Sleeps `d` unless the relay stops first.
    async fn sleep(&mut self, d: Duration) -> Woken {
        if self.stopping() {
            return Woken::Stop;
        }
        tokio::select! {
            _ = self.ctx.stop.changed() => Woken::Stop,
            () = tokio::time::sleep(d) => Woken::More,
        }
    }

    /// Waits for a commit, at most `d`, unless the relay stops first.
    async fn wait(&mut self, d: Duration) -> Woken {
        if self.stopping() {
            return Woken::Stop;
        }
        tokio::select! {
            _ = self.ctx.stop.changed() => Woken::Stop,
            r = self.ctx.wake.changed() => {
                if r.is_err() {
                    // Nothing will wake us any more: time alone does.
                    return self.sleep(d).await;
                }
                Woken::More
            }
            () = tokio::time::sleep(d) => Woken::More,
        }
    }
}
