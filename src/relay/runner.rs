//! The relay's thread and its tasks: one per sink, on a runtime of its own, so that a slow or
//! failing sink never stalls the feed's commits or another sink.
//!
//! A task reads effects from its cursor (a read snapshot), delivers them in batches, backs off
//! (capped exponential, full jitter, at least the receiver's `Retry-After`) on a failure, parks
//! a poisoned event with what the receiver said, and writes its cursor durably: at once after
//! a park, otherwise at most every `CURSOR_FLUSH` (a crash re-delivers at most that much,
//! with the same ids). Redb work runs on the blocking pool, never on the task's thread.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::envelope::{self, EffectView};
use super::{Attempt, CursorAfter, Event, Failure, Sink};
use crate::config::StoreLocation;
use crate::config::{Config, OnPoison, SinkConfig};
use crate::metrics::Metrics;
use crate::store::postgres::PgStore;
use crate::store::relay::{CursorWrite, Parked, RelayStore};
use crate::store::tables::{LedgerKind, ParkedRecord, SinkRecord};
use crate::store::{Backend, Reader, Store, StoreError, StoreOptions};
use crate::timefmt::now_ms;

/// How a sink's last error starts when the sink is failing: its task ended and is being
/// restarted (`relay status`, `health` and the metrics read it from the cursor record).
pub const FAILING: &str = "failing: ";
/// How a sink's last error starts when every event is refused the same way and the sink is
/// held at the first of them instead of parking the feed.
pub const BLOCKED: &str = "blocked: ";

/// Longest a delivered cursor position waits in memory before it is written.
const CURSOR_FLUSH: Duration = Duration::from_millis(200);
/// How often a task looks for operator actions (`relay retry|rewind`) from other processes,
/// and an idle standalone relay for new effects when nothing wakes it.
const RELOAD_EVERY: Duration = Duration::from_secs(1);
/// How often the standalone relay looks for new effects (`run` wakes it on each commit).
const POLL_EVERY: Duration = Duration::from_millis(20);
/// Least time between two `last_error` writes of one sink.
const ERROR_NOTE_EVERY: Duration = Duration::from_secs(5);
/// Most events a sink's own cursor may pass over at start; beyond, they are delivered again
/// (and not stored twice).
const ADOPT_CHECK_MAX: u64 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Runtime(String),
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

/// One sink as the service reports it (sd_notify STATUS, logs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkStatus {
    pub name: String,
    pub state: &'static str,
    /// The first effect offset not yet delivered or parked.
    pub next: u64,
    /// The next effect offset the log will write.
    pub head: u64,
    pub last_error: Option<String>,
}

impl SinkStatus {
    pub fn lag(&self) -> u64 {
        self.head.saturating_sub(self.next)
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

    /// `sinks: NAME lag N (state), ...` for sd_notify STATUS.
    pub fn status_line(&self) -> String {
        let parts: Vec<String> = self
            .status()
            .iter()
            .map(|s| format!("{} lag={} {}", s.name, s.lag(), s.state))
            .collect();
        format!("sinks: {}", parts.join(", "))
    }

    /// Whether the relay thread is still running.
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Asks every sink to finish its attempt in progress, write its cursor and stop, and waits
    /// at most `timeout` for them.
    pub fn stop(mut self, timeout: Duration) -> Result<(), RelayError> {
        let _ = self.stop.send(true);
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        // Most of the time for attempts to finish; the rest to abandon them and write cursors.
        let soft = Instant::now() + timeout.mul_f64(0.8);
        while !thread.is_finished() && Instant::now() < soft {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !thread.is_finished() {
            let _ = self.hard.send(true);
            let deadline = Instant::now() + timeout.mul_f64(0.2).max(Duration::from_millis(500));
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
        thread
            .join()
            .map_err(|_| RelayError::Runtime("the relay thread panicked".into()))?
    }

    /// Waits until the relay stops on its own (a fatal error), or `stop` is requested by the
    /// caller's `until` future returning.
    pub fn join(mut self) -> Result<(), RelayError> {
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| RelayError::Runtime("the relay thread panicked".into()))?,
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
        Sink::new(cfg).map_err(RelayError::Config)?;
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
    let location = config
        .location()
        .map_err(|e| RelayError::Config(e.to_string()))?;
    let (db, locks, store, reader) = match location {
        StoreLocation::File(db) => {
            let locks = crate::store::relay::lock_sinks(db, &names)?;
            let store = Store::open_operator(db, opts)?;
            let reader = Reader::open(db)?;
            (db.to_path_buf(), Some(locks), Backend::Redb(store), reader)
        }
        StoreLocation::Postgres(pg) => {
            let cfg = pg
                .pg_config()
                .map_err(|e| RelayError::Config(e.to_string()))?;
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
                tracing::warn!(error = %e, db = %db.display(), "closing the relay's database handle");
            }
            r
        })
        .map_err(|e| RelayError::Runtime(format!("cannot start the relay thread: {e}")))?;
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
            .map_err(|e| RelayError::Runtime(format!("cannot start the relay runtime: {e}")))?;
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
                tracing::error!(error = %why, "the relay's runtime panicked; starting it again after a backoff");
                if *stop.borrow() {
                    return Err(RelayError::Runtime(format!("the relay panicked: {why}")));
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
            let mut g = store
                .lock()
                .map_err(|_| RelayError::Runtime("relay store lock poisoned".into()))?;
            let s = g
                .as_mut()
                .ok_or_else(|| RelayError::Runtime("relay store closed".into()))?;
            f(s).map_err(RelayError::from)
        })
        .await
        .map_err(|e| RelayError::Runtime(format!("relay store task: {e}")))?
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
        .map_err(|e| RelayError::Runtime(format!("relay read task: {e}")))?
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
    // Standalone, or on a store other members commit to: watch the log's head.
    let polled = wake.is_none() || shared.shared_store;
    let wake = wake.unwrap_or_default();
    if polled {
        let s = shared.clone();
        let mut stop = stop.clone();
        let bump = wake.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let head = s.read(|snap| Ok(snap.meta()?.next_effect)).await;
                if let Ok(h) = head
                    && last != Some(h)
                {
                    last = Some(h);
                    bump.bump();
                }
                tokio::select! {
                    _ = stop.changed() => return,
                    () = tokio::time::sleep(POLL_EVERY) => {}
                }
            }
        });
    }
    let wake = wake.subscribe();
    if let Ok(mut st) = shared.status.lock() {
        *st = sinks
            .iter()
            .map(|c| SinkStatus {
                name: c.name.clone(),
                state: "starting",
                next: 0,
                head: 0,
                last_error: None,
            })
            .collect();
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
        let r = done.map_err(|e| RelayError::Runtime(format!("a sink task failed: {e}")));
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
            rng: seed(&self.cfg.name),
            sink: Sink::new(&self.cfg).map_err(RelayError::Config)?,
            ctx: self.clone(),
            rec: None,
            store_id: None,
            next: 0,
            parked: Vec::new(),
            flushed_at: Instant::now(),
            error_noted_at: None,
            standby: false,
            refusals: None,
            blocked: None,
            reloaded_at: None,
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
        tracing::error!(sink = %name, error = %super::terminal_safe(&why), "relay sink failed; restarting it after a backoff");
        if let Some(m) = &ctx.shared.metrics {
            m.sink_restarted(&name, 1);
        }
        let error = format!("{FAILING}{why}; restarting it");
        ctx.shared.set_status(ctx.idx, |s| {
            s.state = "failing";
            s.last_error = Some(error.clone());
        });
        let noted = ctx
            .shared
            .write(move |s| s.note_sink_error(&name, &error, now_ms()))
            .await;
        if let Err(e) = noted {
            tracing::warn!(sink = %ctx.cfg.name, error = %e, "could not record the sink's failure");
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

fn seed(name: &str) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let h = crate::key::sha256(&[name.as_bytes(), &t.to_le_bytes()]);
    u64::from_le_bytes(h[..8].try_into().unwrap_or([1; 8])) | 1
}

struct SinkTask {
    ctx: TaskContext,
    sink: Sink,
    /// The cursor as last written (or read).
    rec: Option<SinkRecord>,
    /// Delivered or parked up to here (ahead of `rec.next` until the next flush).
    next: u64,
    /// Parked since the last flush (written with it).
    parked: Vec<(u64, ParkedRecord)>,
    flushed_at: Instant,
    error_noted_at: Option<Instant>,
    rng: u64,
    /// Another member holds the sink (PostgreSQL): this task waits to take over.
    standby: bool,
    /// The store's id (`store::identity`), read when the sink registers.
    store_id: Option<[u8; 16]>,
    /// The events refused with one class (`Failure::Refused`) and parked one after the other,
    /// while nothing has been delivered since: the class, and each event's offset and source.
    refusals: Option<(String, Vec<Refusal>)>,
    /// The class of refusal that refuses every event: the sink is blocked until an attempt
    /// delivers something.
    blocked: Option<String>,
    /// When operator actions were last looked for (`follow_operators`).
    reloaded_at: Option<Instant>,
}

/// An event refused and parked: its offset and its source (agency, source id).
type Refusal = (u64, (String, String));

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
                    self.rec = None;
                    self.forget_progress();
                    self.status("standby", None);
                    if self.sleep(RELOAD_EVERY).await == Woken::Stop {
                        break Ok(());
                    }
                }
                Err(e) => {
                    tracing::error!(sink = %self.ctx.cfg.name, error = %super::terminal_safe(&e.to_string()), "relay sink failed; restarting it after a backoff");
                    self.status("failing", Some(e.to_string()));
                    let wait = self.jitter(backoff);
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
            .set_status(self.ctx.idx, |s| s.state = "stopped");
        r.and(flushed)
    }

    async fn work(&mut self) -> Result<(), RelayError> {
        self.register().await?;
        self.adopt_sink_cursor().await?;
        self.reloaded_at = None;
        loop {
            if self.stopping() {
                return Ok(());
            }
            self.follow_operators().await?;
            let (blocked, mut batch) = self.read_batch().await?;
            if blocked {
                self.status("blocked", None);
                if self.wait(RELOAD_EVERY).await == Woken::Stop {
                    return Ok(());
                }
                self.reloaded_at = None;
                continue;
            }
            if batch.is_empty() {
                self.flush(true).await?;
                self.status("idle", None);
                if self.wait(RELOAD_EVERY).await == Woken::Stop {
                    return Ok(());
                }
                continue;
            }
            if batch.len() < self.ctx.cfg.batch_max && !self.ctx.cfg.linger.is_zero() {
                if self.sleep(self.ctx.cfg.linger).await == Woken::Stop {
                    return Ok(());
                }
                let (_, more) = self.read_batch().await?;
                if more.len() > batch.len() {
                    batch = more;
                }
            }
            self.status("delivering", None);
            self.deliver(&batch).await?;
            if self.flushed_at.elapsed() >= CURSOR_FLUSH || !self.parked.is_empty() {
                self.flush(false).await?;
            }
        }
    }

    /// Operator actions from other processes (`relay retry|rewind|skip|discard|forget`), looked
    /// for at most every RELOAD_EVERY: between batches, and between attempts while a batch
    /// keeps failing, so a sink that is retrying or blocked follows them within a second.
    async fn follow_operators(&mut self) -> Result<(), RelayError> {
        if self.reloaded_at.is_some_and(|t| t.elapsed() < RELOAD_EVERY) {
            return Ok(());
        }
        self.reload_if_moved().await?;
        self.retry_requested().await?;
        self.reloaded_at = Some(Instant::now());
        Ok(())
    }

    /// Forgets what this task held in memory about the cursor's past (parks not yet written,
    /// a run of refusals, a block): after the cursor is read anew, all of it is derived again.
    fn forget_progress(&mut self) {
        self.parked.clear();
        self.refusals = None;
        self.blocked = None;
    }

    async fn register(&mut self) -> Result<(), RelayError> {
        let (name, kind) = (self.name().to_string(), self.ctx.cfg.kind.name());
        let start = super::start_at(self.ctx.cfg.start);
        let rec = self
            .ctx
            .shared
            .write(move |s| s.register_sink(&name, kind, start, now_ms()))
            .await?;
        if self.store_id.is_none() {
            let identity = self.ctx.shared.read(|s| s.identity()).await?;
            self.store_id = identity.map(|i| i.id);
        }
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
        }
        if self.standby {
            tracing::info!(sink = %self.ctx.cfg.name, kind, next = rec.next, "relay sink taken over from another member");
            self.standby = false;
        } else {
            tracing::info!(sink = %self.ctx.cfg.name, kind, next = rec.next, "relay sink started");
        }
        self.forget_progress();
        self.next = rec.next;
        self.rec = Some(rec);
        Ok(())
    }

    /// A sink that keeps its cursor beside its data (postgres), for this store and its table,
    /// committed with its rows, is adopted: backwards (the sink's store was restored from a
    /// backup: what it lacks is delivered again), and forwards as far as the rows are really
    /// there (checked by id). An operator's rewind made since (a newer generation here) wins
    /// over it. Either way the move is audited.
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
                    self.status("connecting", Some(e.clone()));
                    self.note_error(&e).await?;
                    let wait = self.jitter(backoff);
                    if self.sleep(wait).await == Woken::Stop {
                        return Ok(());
                    }
                    backoff = (backoff * 2).min(self.ctx.cfg.backoff_max);
                }
            }
        };
        let (Some(c), Some(rec)) = (stored, self.rec.clone()) else {
            return Ok(());
        };
        if c.generation != rec.generation || c.next_after == rec.next {
            return Ok(());
        }
        let mut to = c.next_after;
        if to < rec.next {
            // A row from before this cursor was made (the sink forgotten and added again, or
            // started at the head): it says nothing of what this cursor delivered.
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
            if start.is_some_and(|st| to < st) {
                tracing::info!(sink = %self.ctx.cfg.name, stored = to, start = ?start, "the sink's own cursor row is older than this cursor: not adopted");
                return Ok(());
            }
        }
        if to > rec.next {
            // Forward: only as far as the events' rows are in the sink's table.
            let (from, limit) = (rec.next, to.min(rec.next + ADOPT_CHECK_MAX));
            let ids = self
                .ctx
                .shared
                .read(move |s| {
                    let mut ids = Vec::new();
                    s.scan_effects::<StoreError>(from, |e| {
                        if e.offset >= limit {
                            return Ok(std::ops::ControlFlow::Break(()));
                        }
                        let r = &e.record;
                        ids.push(envelope::event_id(&r.key, r.released, &r.payload));
                        Ok(std::ops::ControlFlow::Continue(()))
                    })?;
                    Ok(ids)
                })
                .await?;
            let held = match self.sink.holds_prefix(&ids).await {
                Ok(n) => n as u64,
                Err(e) => {
                    tracing::warn!(sink = %self.ctx.cfg.name, error = %super::terminal_safe(&e), "cannot check the sink's own store; its cursor is not adopted (what it holds is delivered again, and not stored twice)");
                    return Ok(());
                }
            };
            if rec.next + held < to {
                tracing::warn!(sink = %self.ctx.cfg.name, stored = to, held_to = rec.next + held, "the sink's own cursor is ahead of the events its table holds: adopting it only as far as they go");
            }
            to = rec.next + held;
            if to == rec.next {
                return Ok(());
            }
        }
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
            tracing::error!(sink = %self.ctx.cfg.name, lacked_from = to, kept_from = r.next, "the sink's own store lacks effects that retention has removed here: they cannot be delivered again (see the audit log)");
        }
        if let CursorWrite::Done(r) = &w {
            // Also backwards: a sink store restored from a backup gets what it lacks.
            self.next = r.next;
        }
        self.adopt(w);
        Ok(())
    }

    /// `adopt` for a write that moved the cursor back (`unpark`).
    fn adopt_back(&mut self, w: CursorWrite) {
        match w {
            CursorWrite::Done(r) => {
                self.next = r.next;
                self.rec = Some(r);
            }
            other => self.adopt(other),
        }
    }

    fn adopt(&mut self, w: CursorWrite) {
        match w {
            CursorWrite::Done(r)
                if self
                    .rec
                    .as_ref()
                    .is_some_and(|o| o.generation != r.generation) =>
            {
                // Written, but an operator had rewound meanwhile: deliver from there.
                self.adopt(CursorWrite::Moved(Some(r)));
            }
            CursorWrite::Done(r) => {
                self.next = self.next.max(r.next);
                self.rec = Some(r);
            }
            CursorWrite::Moved(Some(r)) => {
                tracing::info!(sink = %self.ctx.cfg.name, next = r.next, generation = r.generation, "cursor moved by an operator: delivering from there");
                self.forget_progress();
                self.next = r.next;
                self.rec = Some(r);
            }
            CursorWrite::Moved(None) => {
                tracing::warn!(sink = %self.ctx.cfg.name, "the sink's cursor was forgotten while it ran: registering it again");
                self.rec = None;
                self.forget_progress();
            }
        }
    }

    /// Writes the cursor if it moved (or parked something), or when `always` and unwritten
    /// progress exists. A cursor moved meanwhile by an operator is adopted instead.
    async fn flush(&mut self, always: bool) -> Result<(), RelayError> {
        let Some(rec) = self.rec.clone() else {
            return self.register().await;
        };
        if self.next == rec.next && self.parked.is_empty() {
            return Ok(());
        }
        if !always && self.flushed_at.elapsed() < CURSOR_FLUSH && self.parked.is_empty() {
            return Ok(());
        }
        let name = self.name().to_string();
        let (from, to, parked) = (rec.next, self.next, std::mem::take(&mut self.parked));
        let kept = parked.clone();
        let w = match self
            .ctx
            .shared
            .write(move |s| s.advance_sink(&name, rec.generation, from, to, &parked, now_ms()))
            .await
        {
            Ok(w) => w,
            Err(e) => {
                // Not written: the parked events must go with the next write that succeeds.
                self.parked = kept;
                return Err(e);
            }
        };
        self.flushed_at = Instant::now();
        self.adopt(w);
        let head = self
            .ctx
            .shared
            .read(|s| Ok(s.meta()?.next_effect))
            .await
            .unwrap_or(0);
        let next = self.next;
        self.ctx.shared.set_status(self.ctx.idx, |s| {
            s.next = next;
            s.head = head;
        });
        Ok(())
    }

    async fn reload_if_moved(&mut self) -> Result<(), RelayError> {
        let name = self.name().to_string();
        let stored = self.ctx.shared.read(move |s| s.sink_cursor(&name)).await?;
        let Some(rec) = self.rec.clone() else {
            return self.register().await;
        };
        match stored {
            None => self.adopt(CursorWrite::Moved(None)),
            Some(s) if s.generation != rec.generation => self.adopt(CursorWrite::Moved(Some(s))),
            Some(_) => {}
        }
        if self.rec.is_none() {
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
        let wanted = self
            .ctx
            .shared
            .read(move |s| {
                let mut out = Vec::new();
                for p in s.sink_parked(Some(&name))? {
                    if p.record.retry_requested_at_ms.is_none() {
                        continue;
                    }
                    let event = s.effect(p.offset)?.map(|e| {
                        let r = &e.record;
                        Event {
                            offset: e.offset,
                            id: envelope::event_id(&r.key, r.released, &r.payload),
                            key: r.key,
                            agency: r.agency.clone(),
                            source_id: r.source_id.clone(),
                            topic: r.topic.clone(),
                            json: envelope::envelope(&source, &EffectView::of(e.offset, r)),
                        }
                    });
                    out.push((p, event));
                }
                Ok(out)
            })
            .await?;
        for (p, ev) in wanted {
            let Some(ev) = ev else {
                let why = format!(
                    "not retried: effect {} is no longer in the log (retention removed it \
                     before this version kept the effects of parked events), so the event \
                     cannot be rebuilt from a record `verify` proves, and the copy kept when \
                     it was parked is not sent",
                    p.offset
                );
                tracing::error!(sink = %self.ctx.cfg.name, offset = p.offset, "{why}");
                self.retry_failed(&p, why).await?;
                continue;
            };
            // A blocking event's delivery moves the cursor past it (the postgres sink stores
            // that with the row).
            let after = if p.record.blocking {
                self.next.max(p.offset + 1)
            } else {
                self.next
            };
            let cursor = self.cursor_after(after);
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
                    self.next = self.next.max(r.next);
                }
                self.adopt(w);
            } else {
                let why = match attempt.failure {
                    Some(
                        Failure::Poison { reason, response }
                        | Failure::Refused {
                            reason, response, ..
                        },
                    ) => format!("{reason}: {response}"),
                    Some(Failure::Retry { error, .. }) => {
                        // Transient (a 503, a lost connection): the request stands and is
                        // tried again on the next round, about a second later.
                        tracing::warn!(sink = %self.ctx.cfg.name, offset = p.offset, error = %super::terminal_safe(&error), "retried parked event not delivered yet; trying again");
                        self.status("retrying", Some(error.clone()));
                        self.note_error(&error).await?;
                        continue;
                    }
                    None => "not delivered".into(),
                };
                tracing::warn!(sink = %self.ctx.cfg.name, offset = p.offset, error = %super::terminal_safe(&why), "retried parked event refused again; it stays parked");
                self.retry_failed(&p, why).await?;
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
                tracing::warn!(sink = %self.ctx.cfg.name, "shutdown timeout: abandoning the delivery in progress");
                None
            }
        }
    }

    fn cursor_after(&self, next_after: u64) -> CursorAfter {
        CursorAfter {
            store: self.store_id.unwrap_or_default(),
            generation: self.rec.as_ref().map_or(0, |r| r.generation),
            next_after,
        }
    }

    /// From one snapshot: whether an event parked with `on_poison = "block"` holds the
    /// cursor, and else the next batch from it.
    async fn read_batch(&self) -> Result<(bool, Vec<Event>), RelayError> {
        let (from, max) = (self.next, self.ctx.cfg.batch_max);
        let source = self.ctx.shared.source.clone();
        let name = self.name().to_string();
        self.ctx
            .shared
            .read(move |snap| {
                if snap
                    .sink_parked_at(&name, from)?
                    .is_some_and(|p| p.blocking)
                {
                    return Ok((true, Vec::new()));
                }
                let mut out = Vec::with_capacity(max.min(1024));
                snap.scan_effects::<StoreError>(from, |e| {
                    let r = &e.record;
                    let view = EffectView::of(e.offset, r);
                    out.push(Event {
                        offset: e.offset,
                        id: envelope::event_id(&r.key, r.released, &r.payload),
                        key: r.key,
                        agency: r.agency.clone(),
                        source_id: r.source_id.clone(),
                        topic: r.topic.clone(),
                        json: envelope::envelope(&source, &view),
                    });
                    Ok(if out.len() >= max {
                        std::ops::ControlFlow::Break(())
                    } else {
                        std::ops::ControlFlow::Continue(())
                    })
                })?;
                Ok((false, out))
            })
            .await
    }

    /// Delivers `batch` until all of it is delivered or parked, or the relay stops.
    async fn deliver(&mut self, batch: &[Event]) -> Result<(), RelayError> {
        let mut i = 0;
        let mut failures: u32 = 0;
        // A cursor write below may find that an operator moved the cursor (`relay rewind`):
        // the rest of this batch is then not ours to deliver.
        let generation = self.rec.as_ref().map(|r| r.generation);
        let moved = |t: &SinkTask| t.rec.as_ref().map(|r| r.generation) != generation;
        while i < batch.len() {
            let rest = &batch[i..];
            let cursor = self.cursor_after(rest[rest.len() - 1].offset + 1);
            let Some(Attempt { delivered, failure }) = self.abortable_deliver(rest, cursor).await
            else {
                return Ok(());
            };
            let delivered = delivered.min(rest.len());
            if delivered > 0 {
                i += delivered;
                self.next = batch[i - 1].offset + 1;
                failures = 0;
                self.refusals = None;
                if let Some(class) = self.blocked.take() {
                    tracing::info!(sink = %self.ctx.cfg.name, %class, "the receiver accepts events again: the sink is no longer blocked");
                }
            }
            match failure {
                None if i < batch.len() && delivered == 0 => {
                    // A sink that delivers nothing and says nothing: treat as a retry.
                    failures += 1;
                    if self
                        .back_off(failures, None, "the sink delivered nothing", "retrying")
                        .await
                        || self.followed(moved).await?
                    {
                        return Ok(());
                    }
                }
                None => {}
                Some(Failure::Retry { error, after }) => {
                    failures += 1;
                    if self.back_off(failures, after, &error, "retrying").await
                        || self.followed(moved).await?
                    {
                        return Ok(());
                    }
                }
                Some(Failure::Poison { reason, response }) => {
                    self.refusals = None;
                    let Some(ev) = batch.get(i) else {
                        return Ok(());
                    };
                    if self.park(ev, reason, response, failures).await? || moved(self) {
                        return Ok(());
                    }
                    i += 1;
                    failures = 0;
                }
                Some(Failure::Refused {
                    class,
                    reason,
                    response,
                }) => {
                    let Some(ev) = batch.get(i) else {
                        return Ok(());
                    };
                    let source = (ev.agency.clone(), ev.source_id.clone());
                    if self.blocked.as_ref() == Some(&class) {
                        failures += 1;
                        let error = format!(
                            "{BLOCKED}{reason}; every event is refused this way, so none is \
                             parked: fix the receiver (the sink keeps trying)"
                        );
                        if self.back_off(failures, None, &error, "blocked").await
                            || self.followed(moved).await?
                        {
                            return Ok(());
                        }
                        continue;
                    }
                    let mut run = match self.refusals.take() {
                        Some((c, run)) if c == class => run,
                        _ => Vec::new(),
                    };
                    if let Some((_, other)) = run.iter().find(|(_, src)| *src != source) {
                        let other = other.clone();
                        self.block(ev, &run, other, &class, &reason).await?;
                        return Ok(());
                    }
                    if self.park(ev, reason, response, failures).await? || moved(self) {
                        return Ok(());
                    }
                    run.push((ev.offset, source));
                    self.refusals = Some((class, run));
                    i += 1;
                    failures = 0;
                }
            }
        }
        Ok(())
    }

    /// Between two attempts at a failing batch: follows operator actions; `true` when one
    /// moved the cursor (the rest of the batch is then not this task's to deliver).
    async fn followed(&mut self, moved: impl Fn(&SinkTask) -> bool) -> Result<bool, RelayError> {
        self.follow_operators().await?;
        Ok(moved(self))
    }

    /// Parks `ev`, refused for good (`on_poison = "block"`: the cursor waits at it). `true`
    /// when the rest of the batch is not to be delivered now (the sink blocks at it).
    async fn park(
        &mut self,
        ev: &Event,
        reason: String,
        response: String,
        failures: u32,
    ) -> Result<bool, RelayError> {
        let blocking = self.ctx.cfg.on_poison == OnPoison::Block;
        tracing::warn!(sink = %self.ctx.cfg.name, offset = ev.offset, id = %ev.id, reason = %super::terminal_safe(&reason), blocking, "event refused for good: parked");
        let record = ParkedRecord {
            parked_at_ms: now_ms(),
            id: ev.id.clone(),
            key: ev.key,
            agency: ev.agency.clone(),
            source_id: ev.source_id.clone(),
            topic: ev.topic.clone(),
            reason: reason.chars().take(1024).collect(),
            response: response.chars().take(2048).collect(),
            attempts: u64::from(failures) + 1,
            blocking,
            retry_requested_at_ms: None,
            event: ev.json.clone(),
        };
        self.parked.push((ev.offset, record));
        if blocking {
            // The cursor stays at the event until an operator acts.
            self.flush(true).await?;
            return Ok(true);
        }
        self.next = ev.offset + 1;
        self.flush(true).await?;
        Ok(false)
    }

    /// The same refusal (`class`) met `ev` right after the events of `run` were parked for
    /// it one after the other, one of them (`other`) of another source than `ev`: the
    /// receiver refuses every event, not these. They are taken back out of the parked events
    /// (the cursor returns to the first) and the sink holds there, retrying with backoff,
    /// until the receiver accepts events again.
    async fn block(
        &mut self,
        ev: &Event,
        run: &[Refusal],
        other: (String, String),
        class: &str,
        reason: &str,
    ) -> Result<(), RelayError> {
        let mut at = ev.offset;
        let first = run.first().map_or(ev.offset, |(o, _)| *o);
        let contiguous = run
            .iter()
            .enumerate()
            .all(|(k, (o, _))| *o == first + k as u64)
            && first + run.len() as u64 == ev.offset;
        if contiguous
            && first < ev.offset
            && let Some(rec) = self.rec.clone()
        {
            let name = self.name().to_string();
            let to = ev.offset;
            let w = self
                .ctx
                .shared
                .write(move |s| s.unpark(&name, rec.generation, first, to, now_ms()))
                .await?;
            if let CursorWrite::Done(r) = &w
                && r.next == first
            {
                at = first;
            }
            self.adopt_back(w);
        }
        self.blocked = Some(class.to_string());
        let error = format!(
            "{BLOCKED}{reason}; events of different sources ({}/{} and {}/{}, up to offset {}) \
             were refused the same way, so the receiver refuses every event: nothing is \
             parked, the sink waits at offset {at} and keeps trying; fix the receiver",
            other.0, other.1, ev.agency, ev.source_id, ev.offset
        );
        tracing::error!(sink = %self.ctx.cfg.name, offset = at, %class, error = %super::terminal_safe(&error), "relay sink blocked");
        self.error_noted_at = None;
        self.back_off(1, None, &error, "blocked").await;
        Ok(())
    }

    /// Waits before the next attempt; `true` when the relay is stopping.
    async fn back_off(
        &mut self,
        failures: u32,
        after: Option<Duration>,
        error: &str,
        state: &'static str,
    ) -> bool {
        let cap = self
            .ctx
            .cfg
            .backoff_initial
            .saturating_mul(1u32 << failures.min(20))
            .min(self.ctx.cfg.backoff_max);
        let wait = self.jitter(cap).max(after.unwrap_or_default());
        tracing::warn!(sink = %self.ctx.cfg.name, attempt = failures, wait_ms = wait.as_millis() as u64, error = %super::terminal_safe(error), "delivery failed; retrying");
        self.status(state, Some(error.to_string()));
        if let Err(e) = self.note_error(error).await {
            tracing::warn!(sink = %self.ctx.cfg.name, error = %e, "could not record the sink's error");
        }
        // Progress made before the failure is written now, not after the backoff.
        if let Err(e) = self.flush(true).await {
            tracing::warn!(sink = %self.ctx.cfg.name, error = %e, "could not write the cursor");
        }
        self.sleep(wait).await == Woken::Stop
    }

    /// Full jitter: uniform in [0, cap].
    fn jitter(&mut self, cap: Duration) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let ms = cap.as_millis() as u64;
        Duration::from_millis(if ms == 0 { 0 } else { self.rng % (ms + 1) })
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

    async fn note_error(&mut self, error: &str) -> Result<(), RelayError> {
        if self
            .error_noted_at
            .is_some_and(|t| t.elapsed() < ERROR_NOTE_EVERY)
        {
            return Ok(());
        }
        self.error_noted_at = Some(Instant::now());
        let (name, error) = (self.name().to_string(), error.to_string());
        self.ctx
            .shared
            .write(move |s| s.note_sink_error(&name, &error, now_ms()))
            .await
    }

    fn status(&self, state: &'static str, error: Option<String>) {
        let next = self.next;
        self.ctx.shared.set_status(self.ctx.idx, |s| {
            s.state = state;
            s.next = next;
            if error.is_some() || state == "idle" {
                s.last_error = error;
            }
        });
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
