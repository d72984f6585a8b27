//! `run`: transport -> wire -> store thread -> ack. Group-commits deliveries, acknowledges each
//! only after the commit holding its decision returned Ok, in arrival order, and drains on
//! shutdown. Shutdown is injected (`Shutdown`); signals are turned into it in `signals`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::metrics::endpoint::Endpoint;
use crate::model::{Outcome, OutcomeCounts};
use crate::notify::Notifier;
use crate::relay::{self, Relay, RelayError, Wake};
use crate::store::postgres::PgStore;
use crate::store::tables::BurstRecord;
use crate::store::upstream::{GapCandidates, GapCheck, ReportedGap};
use crate::store::{Backend, BatchReport, Incoming, Store, StoreError};
use crate::timefmt::now_ms;
use crate::transport::{self, AckToken, TransportEvent, TransportHandle};

/// Why `run` stopped other than by a clean shutdown.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The configuration names a store that cannot be used as configured.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// `run` needs the broker to read from.
    #[error("`run` needs an [mqtt] section")]
    NoMqtt,
    /// The MQTT client cannot be set up from the configuration, or the broker refuses us
    /// for good (CONNACK failure, a SUBACK not granting a topic at QoS 1): no restart mends
    /// either, so it is a configuration error like `Config`.
    #[error(transparent)]
    Transport(#[from] transport::TransportError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Runtime(String),
    /// Its text already says what failed (a `relay: ` prefix would print it twice in a chain).
    #[error(transparent)]
    Relay(#[from] RelayError),
    /// The PostgreSQL server did not answer when the store was opened (`run` waits instead).
    #[error(
        "PostgreSQL at {target} is unreachable ({why}): nothing was decided; try again once \
         the server answers"
    )]
    Unreachable { target: String, why: String },
    /// A second signal cut the drain short.
    #[error(
        "stopped at once by a second signal: what was not acknowledged is redelivered by the \
         broker, and a sink's delivery in progress is made again after the restart"
    )]
    Forced,
}

/// How far a shutdown request has gone: a graceful drain, then (a second signal) at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stop {
    Running,
    /// Commit what is open, flush its acks, let the sinks finish, within the timeout.
    Drain,
    /// Abandon what is in progress: nothing uncommitted was acknowledged, so the broker
    /// redelivers it; a sink's attempt in progress is delivered again after the restart.
    Now,
}

/// Asks a `Shutdown` to stop; `signals` holds it in `run`, tests and the demo hold it directly.
pub struct Trigger(watch::Sender<Stop>);

impl Trigger {
    pub fn drain(&self) {
        self.0.send_if_modified(|s| {
            let asked = *s == Stop::Running;
            if asked {
                *s = Stop::Drain;
            }
            asked
        });
    }
    pub fn now(&self) {
        self.0.send_replace(Stop::Now);
    }
}

/// A shutdown request that can be awaited; `Shutdown::new` also returns its trigger.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<Stop>);

impl Shutdown {
    pub fn new() -> (Trigger, Shutdown) {
        let (tx, rx) = watch::channel(Stop::Running);
        (Trigger(tx), Shutdown(rx))
    }
    async fn reached(&mut self, level: Stop) {
        while *self.0.borrow_and_update() < level {
            if self.0.changed().await.is_err() {
                // The trigger is gone: nobody can ask for shutdown any more.
                std::future::pending::<()>().await;
            }
        }
    }
    async fn requested(&mut self) {
        self.reached(Stop::Drain).await;
    }
    async fn forced(&mut self) {
        self.reached(Stop::Now).await;
    }
    fn is_forced(&self) -> bool {
        *self.0.borrow() == Stop::Now
    }
}

/// What a run did, for logs and tests.
#[derive(Debug, Default, Clone)]
pub struct RunSummary {
    pub counts: OutcomeCounts,
    pub batches: u64,
    pub acks_sent: u64,
    pub acks_stale: u64,
    pub reconnects: u64,
    pub failovers: u64,
}

/// How often the sd_notify STATUS follows the commits, at most.
const STATUS_EVERY: Duration = Duration::from_secs(1);

/// The largest packet the MQTT remaining-length field can express.
const MQTT_MAX_PACKET: usize = 268_435_455;

type Reply = oneshot::Sender<Result<BatchReport, StoreError>>;
/// A submitted batch: the store's answer to come, and the acks to send once it is Ok.
type InFlight = (
    oneshot::Receiver<Result<BatchReport, StoreError>>,
    Vec<Option<AckToken>>,
);

/// Work for the store thread.
enum Job {
    Batch(Vec<Incoming>, Reply),
    /// A replay burst to record for `stats` (its own small transaction; rare).
    Burst(BurstRecord),
    /// A (re)connect: the batches after it are consumed as `client_id` from `broker`, and
    /// a CONNACK without a session may have lost what the broker queued (checked against the
    /// store, recorded in its own small transaction).
    Connected {
        broker: String,
        client_id: String,
        session_present: bool,
    },
}

/// The store on its own thread: redb blocks and fsyncs, so it never runs on the async thread.
struct StoreWorker {
    jobs: Option<std_mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Since when (ms) the PostgreSQL server has been unreachable (0: reachable).
    unreachable_since: Arc<AtomicU64>,
    /// When (ms) the last attempt to commit while the server is unreachable failed: the
    /// store thread is alive and retrying, not hung.
    last_failed_attempt: Arc<AtomicU64>,
    /// Set when the service stops: a commit waiting for the server gives up.
    stopping: Arc<AtomicBool>,
}

/// Backoff between attempts to commit a batch while PostgreSQL is unreachable.
const UNREACHABLE_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(5));

/// Commits `batch`; while the PostgreSQL server is unreachable, keeps the batch (nothing of
/// it is acknowledged, so the broker keeps the rest of the feed) and tries again with backoff,
/// until it commits or the service stops. A COMMIT that landed without an answer is safe to
/// retry: its messages are then decided `duplicate`.
fn commit_with_retry(
    store: &mut Backend,
    batch: &[Incoming],
    unreachable_since: &AtomicU64,
    last_failed_attempt: &AtomicU64,
    stopping: &AtomicBool,
    metrics: &Metrics,
) -> Result<BatchReport, StoreError> {
    let mut delay = UNREACHABLE_BACKOFF.0;
    let mut attempts = 0u64;
    loop {
        let started = Instant::now();
        match store.commit_batch(batch, now_ms()) {
            Err(StoreError::Unreachable(why)) if !stopping.load(Ordering::Relaxed) => {
                attempts += 1;
                last_failed_attempt.store(now_ms(), Ordering::Relaxed);
                if unreachable_since.load(Ordering::Relaxed) == 0 {
                    unreachable_since.store(now_ms().max(1), Ordering::Relaxed);
                    metrics.store_unreachable(true);
                    tracing::error!(
                        error = %why,
                        "PostgreSQL unreachable ({why}): acknowledgements withheld, retrying the batch"
                    );
                } else if attempts.is_power_of_two() {
                    tracing::warn!(error = %why, attempts, "PostgreSQL still unreachable after {attempts} attempts: {why}");
                }
                std::thread::sleep(delay);
                delay = (delay * 2).min(UNREACHABLE_BACKOFF.1);
            }
            other => {
                if other.is_ok() && unreachable_since.swap(0, Ordering::Relaxed) != 0 {
                    metrics.store_unreachable(false);
                    tracing::info!(attempts, "PostgreSQL reachable again: batch committed");
                }
                if let Ok(report) = &other {
                    metrics.commit_took(started.elapsed());
                    warn_quarantined(batch, report);
                }
                return other;
            }
        }
    }
}

/// One warning per message the batch quarantined (conflict, stale, malformed): each waits
/// for a person (`dump-quarantine`, `quarantine release|discard`), so each is worth a line
/// in `journalctl -p warning`, with its outcome, key and topic as fields and in its text
/// (journald's default view shows only the text).
fn warn_quarantined(batch: &[Incoming], report: &BatchReport) {
    for (m, d) in batch.iter().zip(&report.decided) {
        if let Some(id) = d.quarantine_id {
            let outcome = d.outcome.as_str();
            let topic = crate::textsafe::escape_controls(&m.topic);
            tracing::warn!(
                outcome,
                key = d.key.map(|k| k.to_hex()).unwrap_or_default(),
                topic = %m.topic,
                quarantine_id = id,
                "message quarantined for review: {outcome} on {topic}, quarantine id {id}"
            );
        }
    }
}

/// The store thread's gap candidates (`store::upstream::GapCandidates`): each waits
/// `[feed] gap_grace_ms` on a monotonic clock, then what is still missing of the due ones is
/// confirmed in one write transaction, recorded, warned and counted.
struct PendingGaps {
    candidates: GapCandidates,
    grace_ms: u64,
    clock: Instant,
}

/// How long candidates wait before another attempt when the store could not confirm them
/// (PostgreSQL unreachable), at least.
const CONFIRM_RETRY_MS: u64 = 1_000;

impl PendingGaps {
    fn new(grace: Duration) -> PendingGaps {
        PendingGaps {
            candidates: GapCandidates::default(),
            grace_ms: u64::try_from(grace.as_millis()).unwrap_or(u64::MAX),
            clock: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn add(&mut self, gaps: Vec<ReportedGap>) {
        if !gaps.is_empty() {
            let due = self.now().saturating_add(self.grace_ms);
            self.candidates.add(gaps, due);
        }
    }

    /// How long the store thread may wait for a job before candidates fall due.
    fn wait(&self) -> Option<Duration> {
        let due = self.candidates.next_due()?;
        Some(Duration::from_millis(due.saturating_sub(self.now())))
    }

    /// Confirms the due candidates (`all`: every one, at shutdown); `Some` with the error
    /// when the write failed and latches the store (`latches`).
    fn confirm(&mut self, store: &mut Backend, metrics: &Metrics, all: bool) -> Option<StoreError> {
        let due = if all {
            self.candidates.take_all()
        } else {
            self.candidates.take_due(self.now())
        };
        if due.is_empty() {
            return None;
        }
        match store.confirm_gaps(&due, now_ms()) {
            // The unknown ones were warned as possible gaps by `confirm_gaps`.
            Ok(GapCheck { missing, .. }) => {
                warn_gaps(&missing);
                for g in &missing {
                    metrics.gap(&g.agency, g.gap.missing());
                }
                None
            }
            Err(StoreError::Unreachable(why)) if !all => {
                tracing::debug!(error = %why, candidates = due.len(), "gap candidates not confirmed yet: {why}");
                let again = self
                    .now()
                    .saturating_add(self.grace_ms.max(CONFIRM_RETRY_MS));
                self.candidates.add(due, again);
                None
            }
            // Not silent: what could not be checked is warned as possibly missing.
            Err(e) => {
                for g in &due {
                    let (agency, source_id) = (
                        crate::textsafe::escape_controls(&g.agency),
                        crate::textsafe::escape_controls(&g.source_id),
                    );
                    let (epoch, from, to) = (g.gap.epoch, g.gap.from, g.gap.to);
                    tracing::warn!(
                        outcome = "gap",
                        agency = %g.agency,
                        source_id = %g.source_id,
                        epoch,
                        missing_from = from,
                        missing_to = to,
                        error = %e,
                        "possible upstream gap: {agency}/{source_id} epoch {epoch} {from}-{to} \
                         could not be confirmed ({e}): check `gaps`"
                    );
                }
                latches(e)
            }
        }
    }
}

/// One warning per upstream gap confirmed: sequences of a source's epoch still missing a
/// grace after a later one was applied (a broker dropped them, typically from a full session
/// queue). `journalctl -p warning OUTCOME=gap` selects them. `ingest` warns the same.
pub(crate) fn warn_gaps(gaps: &[ReportedGap]) {
    for g in gaps {
        let agency = crate::textsafe::escape_controls(&g.agency);
        let source_id = crate::textsafe::escape_controls(&g.source_id);
        let (epoch, from, to, missing) = (g.gap.epoch, g.gap.from, g.gap.to, g.gap.missing());
        let implausible = if g.gap.implausible() {
            format!(
                "; an implausible jump (over {} sequences): a producer that restarted its \
                 counter without a new epoch, or a forged sequence",
                crate::decide::PLAUSIBLE_GAP
            )
        } else {
            String::new()
        };
        tracing::warn!(
            outcome = "gap",
            agency = %g.agency,
            source_id = %g.source_id,
            epoch,
            missing_from = from,
            missing_to = to,
            missing,
            implausible = g.gap.implausible(),
            "upstream gap: {agency}/{source_id} epoch {epoch} missing {from}-{to} ({missing} \
             sequences): never delivered before a later sequence was applied{implausible}"
        );
    }
}

/// The store thread's part of a (re)connect: from now on batches are consumed as
/// `client_id`; a CONNACK without a session under a client id the store consumed under
/// means the broker dropped whatever it had queued for us: a warning, a metric, a record.
/// A failed write of the store thread's own (a connect noted, gap candidates confirmed, a
/// burst recorded) that is not a PostgreSQL outage: redb refuses every write after an I/O
/// error ("Previous I/O error occurred"), so the next batch is answered with this error, the
/// cause, instead of being committed (a commit error is fatal; no retry on a latched store).
fn latches(e: StoreError) -> Option<StoreError> {
    (!matches!(e, StoreError::Unreachable(_))).then_some(e)
}

/// Notes a (re)connect; `Some` with the error when the write failed and latches the store
/// (`latches`).
fn on_connected(
    store: &mut Backend,
    metrics: &Metrics,
    (broker, client_id, session_present): (String, String, bool),
) -> Option<StoreError> {
    let loss = store.note_connect(&broker, &client_id, session_present, now_ms());
    store.consume_as(crate::store::upstream::ConsumedAs {
        client_id: client_id.clone(),
        broker: broker.clone(),
    });
    match loss {
        Ok(None) => None,
        Ok(Some(_)) => {
            metrics.session_lost(&broker);
            let id = crate::textsafe::escape_controls(&client_id);
            tracing::warn!(
                outcome = "session_lost",
                %broker,
                client_id = %client_id,
                "broker session lost: {broker} answered the connect of client id {id} without \
                 the session it consumed under: anything published while replay-guard was \
                 away may be lost (check the producers, `gaps`, and the broker's persistence)"
            );
            None
        }
        Err(e) if session_present => {
            tracing::warn!(%broker, error = %e, "could not note the connect to {broker}: {e}");
            latches(e)
        }
        // The store could not be read, so whether the session was one the store consumed
        // under (a loss) is unknown: say so.
        Err(e) => {
            tracing::warn!(
                outcome = "session_lost",
                %broker,
                client_id = %client_id,
                error = %e,
                "broker session possibly lost: {broker} answered the connect of client id {} \
                 without a session, and the store could not be read to tell whether \
                 replay-guard consumed under it before ({e}): if it did, anything published \
                 while it was away may be lost",
                crate::textsafe::escape_controls(&client_id)
            );
            latches(e)
        }
    }
}

impl StoreWorker {
    fn spawn(
        mut store: Backend,
        wake: Wake,
        metrics: Metrics,
        gap_grace: Duration,
    ) -> std::io::Result<StoreWorker> {
        let (tx, rx) = std_mpsc::channel::<Job>();
        let unreachable_since = Arc::new(AtomicU64::new(0));
        let last_failed_attempt = Arc::new(AtomicU64::new(0));
        let stopping = Arc::new(AtomicBool::new(false));
        let (since, last, stop) = (
            unreachable_since.clone(),
            last_failed_attempt.clone(),
            stopping.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("store".into())
            .spawn(move || {
                let mut gaps = PendingGaps::new(gap_grace);
                // The error of a failed write of the thread's own, answered to the next batch.
                let mut latched: Option<StoreError> = None;
                loop {
                    // Wait for a job, or until gap candidates fall due (a quiet feed's too).
                    let job = match gaps.wait() {
                        None => rx.recv().ok(),
                        Some(wait) => match rx.recv_timeout(wait) {
                            Ok(job) => Some(job),
                            Err(std_mpsc::RecvTimeoutError::Timeout) => {
                                latched = latched.or(gaps.confirm(&mut store, &metrics, false));
                                continue;
                            }
                            Err(std_mpsc::RecvTimeoutError::Disconnected) => None,
                        },
                    };
                    let Some(job) = job else { break };
                    match job {
                        Job::Batch(batch, reply) => {
                            if let Some(e) = latched.take() {
                                let _ = reply.send(Err(e));
                                return;
                            }
                            let mut result = commit_with_retry(
                                &mut store, &batch, &since, &last, &stop, &metrics,
                            );
                            if let Ok(r) = &mut result {
                                gaps.add(std::mem::take(&mut r.gaps));
                            }
                            if let Ok(r) = &result
                                && r.pruned.total() > 0
                            {
                                tracing::debug!(
                                    audit = r.pruned.audit,
                                    effects = r.pruned.effects,
                                    quarantine = r.pruned.quarantine,
                                    "retention pruned"
                                );
                            }
                            let failed = result.is_err();
                            if result.is_ok() {
                                wake.bump(); // the relay's sinks read what was committed
                            }
                            let _ = reply.send(result);
                            if failed {
                                return; // latched: no retry loop
                            }
                            // After the reply: confirming never delays an acknowledgement.
                            latched = latched.or(gaps.confirm(&mut store, &metrics, false));
                        }
                        Job::Burst(burst) => {
                            if let Err(e) = store.record_burst(&burst) {
                                tracing::warn!(error = %e, "could not record the replay burst: {e}");
                                latched = latched.or(latches(e));
                            }
                        }
                        Job::Connected {
                            broker,
                            client_id,
                            session_present,
                        } => {
                            latched = latched.or(on_connected(
                                &mut store,
                                &metrics,
                                (broker, client_id, session_present),
                            ))
                        }
                    }
                }
                // Draining: what is still a candidate is confirmed now, without the grace.
                gaps.confirm(&mut store, &metrics, true);
                // Every batch is durable already; a failing close leaves the file needing
                // repair at the next open, or tells of damage.
                if let Err(e) = store.close() {
                    tracing::error!(error = %e, "closing the database failed: {e}");
                }
            })?;
        Ok(StoreWorker {
            jobs: Some(tx),
            thread: Some(thread),
            unreachable_since,
            last_failed_attempt,
            stopping,
        })
    }

    /// Whether the commit under way waits for an unreachable PostgreSQL server, with an
    /// attempt failing within `recent` (the store thread is retrying, not stuck in a call).
    fn retrying(&self, recent: Duration) -> bool {
        self.unreachable_since.load(Ordering::Relaxed) > 0
            && now_ms().saturating_sub(self.last_failed_attempt.load(Ordering::Relaxed))
                <= u64::try_from(recent.as_millis()).unwrap_or(u64::MAX)
    }

    fn submit(&self, batch: Vec<Incoming>) -> oneshot::Receiver<Result<BatchReport, StoreError>> {
        let (tx, rx) = oneshot::channel();
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job::Batch(batch, tx)); // a dead worker drops `tx`: the receiver errors
        }
        rx
    }

    fn record_burst(&self, burst: BurstRecord) {
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job::Burst(burst));
        }
    }

    /// Queued before any batch of the new connection: jobs run in order.
    fn connected(&self, broker: &str, client_id: &str, session_present: bool) {
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Job::Connected {
                broker: broker.into(),
                client_id: client_id.into(),
                session_present,
            });
        }
    }
}

impl StoreWorker {
    /// Stops feeding the store thread and lets it go without waiting for it.
    fn detach(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.jobs.take();
        self.thread.take();
    }
}

impl Drop for StoreWorker {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join(); // the store closes cleanly on its own thread
        }
    }
}

/// Reports a store upgrade's progress (`store::upgrade`, which may take minutes on a long
/// audit log) to systemd, when run under it: each step extends the start timeout (and pings
/// the watchdog) with a STATUS saying how far it is, so the unit is not killed mid-upgrade
/// and restarted into an upgrade that starts over.
pub fn report_upgrades() {
    let notifier = Notifier::from_env();
    crate::store::upgrade::on_progress(move |done, total| {
        notifier.notify(&format!(
            "EXTEND_TIMEOUT_USEC=120000000\nWATCHDOG=1\nSTATUS=upgrading the store's schema: indexed {done} of {total} audit entries by key"
        ));
    });
}

/// Opens the feed writer's store: the redb file, or the PostgreSQL schema (created or migrated
/// on the way). Returns what to call it in messages.
pub fn open_store(config: &Config) -> Result<(PathBuf, Backend), ServiceError> {
    match config.location()? {
        crate::config::StoreLocation::File(db) => {
            let store = Store::open(db, config.store.clone(), now_ms())?;
            Ok((db.to_path_buf(), Backend::Redb(store)))
        }
        crate::config::StoreLocation::Postgres(pg) => {
            let cfg = pg.pg_config()?;
            let name = PathBuf::from(cfg.target());
            let store =
                PgStore::open(cfg, config.store.clone(), now_ms()).map_err(|e| match e {
                    StoreError::Unreachable(why) => ServiceError::Unreachable {
                        target: name.display().to_string(),
                        why,
                    },
                    e => e.into(),
                })?;
            Ok((name, Backend::Postgres(store)))
        }
    }
}

/// `open_store` for `run`: a PostgreSQL server that cannot be reached at start is waited for,
/// as `run` rides out an outage later on: attempts with the same backoff, READY=1 and a
/// STATUS saying what it waits for (so that systemd's start timeout does not restart it in a
/// loop), watchdog pings while attempts keep failing. Any other error fails at once. `None`:
/// `shutdown` came while waiting. Nothing subscribes before this returns the store.
fn open_store_waiting(
    config: &Config,
    shutdown: &mut Shutdown,
    notifier: &Notifier,
    metrics: &Metrics,
) -> Result<Option<(PathBuf, Backend)>, ServiceError> {
    let pg = match config.location()? {
        crate::config::StoreLocation::File(_) => return open_store(config).map(Some),
        crate::config::StoreLocation::Postgres(pg) => pg.pg_config()?,
    };
    let target = pg.target();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ServiceError::Runtime(format!("cannot start the runtime: {e}")))?;
    let watchdog = Notifier::watchdog_interval();
    rt.block_on(async {
        let period = watchdog.unwrap_or_default() * 2;
        let mut ticker = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
        let mut delay = UNREACHABLE_BACKOFF.0;
        let mut attempts = 0u64;
        // The STATUS line once the first attempt failed (and READY=1 was sent).
        let mut waiting: Option<String> = None;
        loop {
            // Each attempt on a thread of its own (it blocks, up to the connect timeout, or
            // longer while another member migrates the schema), so that it never holds up a
            // shutdown.
            let (tx, mut attempt) = oneshot::channel();
            let (cfg, opts) = (pg.clone(), config.store.clone());
            std::thread::Builder::new()
                .name("store-open".into())
                .spawn(move || {
                    let _ = tx.send(PgStore::open(cfg, opts, now_ms()));
                })
                .map_err(|e| ServiceError::Runtime(format!("cannot start a thread: {e}")))?;
            let started = Instant::now();
            let opened = loop {
                tokio::select! {
                    biased;
                    () = shutdown.requested() => return Ok(None),
                    r = &mut attempt => {
                        let died = |_| ServiceError::Runtime("opening the store panicked".into());
                        break r.map_err(died)?;
                    }
                    _ = ticker.tick(), if watchdog.is_some() => {
                        // An attempt hanging for a whole watchdog period lets systemd restart
                        // us, as a stuck commit does.
                        if let Some(status) = &waiting
                            && started.elapsed() <= period
                        {
                            notifier.notify(&format!("WATCHDOG=1\nSTATUS={status}"));
                        }
                    }
                }
            };
            attempts += 1;
            let why = match opened {
                Ok(store) => {
                    metrics.store_unreachable(false);
                    if waiting.is_some() {
                        tracing::info!(
                            store = %target,
                            attempts,
                            "PostgreSQL reachable again: store open"
                        );
                    }
                    return Ok(Some((PathBuf::from(&target), Backend::Postgres(store))));
                }
                Err(StoreError::Unreachable(why)) => why,
                Err(e) => return Err(e.into()),
            };
            let status = match &waiting {
                Some(status) => {
                    if attempts.is_power_of_two() {
                        tracing::warn!(
                            store = %target,
                            error = %why,
                            attempts,
                            "PostgreSQL still unreachable at {target} after {attempts} attempts: {why}"
                        );
                    }
                    status
                }
                None => {
                    tracing::error!(
                        store = %target,
                        error = %why,
                        "PostgreSQL unreachable at start; retrying ({target}: {why})"
                    );
                    metrics.store_unreachable(true);
                    // Started, as far as systemd is concerned: the outage is ridden out as one
                    // that comes later is. The feed waits at the broker meanwhile.
                    let status = waiting.insert(waiting_status(&target, now_ms()));
                    notifier.notify(&format!("READY=1\nSTATUS={status}"));
                    status
                }
            };
            let pause = tokio::time::sleep(delay);
            tokio::pin!(pause);
            loop {
                tokio::select! {
                    biased;
                    () = shutdown.requested() => return Ok(None),
                    () = &mut pause => break,
                    _ = ticker.tick(), if watchdog.is_some() => {
                        notifier.notify(&format!("WATCHDOG=1\nSTATUS={status}"));
                    }
                }
            }
            delay = (delay * 2).min(UNREACHABLE_BACKOFF.1);
        }
    })
}

/// The systemd STATUS while `run` waits for PostgreSQL at start.
fn waiting_status(target: &str, since_ms: u64) -> String {
    format!(
        "waiting for PostgreSQL at {target} since {} (not subscribed yet, retrying)",
        crate::timefmt::rfc3339_ms(since_ms)
    )
}

/// Runs the consumer until `shutdown`, or a fatal storage error.
pub fn run(
    config: Config,
    mut shutdown: Shutdown,
    notifier: &Notifier,
) -> Result<RunSummary, ServiceError> {
    let mqtt = config.mqtt.clone().ok_or(ServiceError::NoMqtt)?;
    let brokers: Vec<String> = mqtt.brokers.iter().map(ToString::to_string).collect();
    let metrics = Metrics::new(brokers.iter().map(String::as_str));
    // Served from the start: a scrape while PostgreSQL is waited for says so.
    let _endpoint = Endpoint::for_config(&config, Some(metrics.clone()))
        .map_err(|e| ServiceError::Runtime(format!("cannot start the metrics thread: {e}")))?;
    let Some((db, store)) = open_store_waiting(&config, &mut shutdown, notifier, &metrics)? else {
        tracing::info!(
            "shutdown requested while waiting for PostgreSQL: stopped, nothing consumed"
        );
        notifier.notify("STOPPING=1");
        return Ok(RunSummary::default());
    };
    let mut store = store;
    // Before the first commit: retention never prunes what a configured sink has yet to
    // deliver, whenever its relay starts.
    relay::declare_sinks(&mut store, &config)?;
    let wake = Wake::new();
    // The sinks run beside the feed on their own thread: a slow or failing sink never holds
    // up a commit or an acknowledgement.
    let relay = relay::spawn(&config, Some(&wake), Some(&metrics))?;
    let worker = StoreWorker::spawn(store, wake, metrics.clone(), config.gap_grace)
        .map_err(|e| ServiceError::Runtime(format!("cannot start the store thread: {e}")))?;
    tracing::info!(db = %db.display(), brokers = mqtt.brokers.len(), protocol = ?mqtt.protocol, "database open");
    notifier.notify("READY=1\nSTATUS=database open, connecting");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| ServiceError::Runtime(format!("cannot start the runtime: {e}")))?;
    let started_stop = std::cell::Cell::new(None);
    let result = rt.block_on(
        Consumer::new(
            &config,
            worker,
            notifier,
            relay.as_ref(),
            &started_stop,
            metrics,
        )
        .run(mqtt, shutdown.clone()),
    );
    notifier.notify("STOPPING=1");
    if let Some(relay) = relay {
        // What the feed committed while draining is delivered in what is left of the timeout,
        // unless a second signal cuts it short.
        let spent = started_stop
            .get()
            .map_or(Duration::ZERO, |t: Instant| t.elapsed());
        let left = config.shutdown_timeout.saturating_sub(spent);
        let cut = || shutdown.is_forced();
        if let Err(e) = relay.stop_or_cut(left.max(Duration::from_millis(100)), &cut) {
            tracing::error!(error = %e, "the relay stopped with an error: {e}");
        }
    }
    match result {
        Ok(_) if shutdown.is_forced() => Err(ServiceError::Forced),
        other => other,
    }
}

struct Consumer<'a> {
    max_batch: usize,
    linger: Duration,
    window: usize,
    drain_timeout: Duration,
    feed: crate::wire::FeedContract,
    worker: StoreWorker,
    notifier: &'a Notifier,
    summary: RunSummary,
    /// Duplicates absorbed since the last (re)connect (broker, connected at, count), reported
    /// and recorded once the burst ends.
    burst: Option<(String, u64, u64)>,
    /// A configuration error the broker reported (a refused subscription): drain, then stop.
    fatal: Option<transport::TransportError>,
    relay: Option<&'a Relay>,
    /// When the shutdown began (the relay gets what is left of the timeout).
    stop_started: &'a std::cell::Cell<Option<Instant>>,
    metrics: Metrics,
    /// When this process started counting (the STATUS counters are since then).
    started_ms: u64,
    /// When the last STATUS went out: refreshed after commits, at most once a second.
    status_sent: Instant,
    /// `[mqtt] client_id`: the session the broker keeps for us.
    client_id: String,
}

/// The batch being filled and the one being committed (at most one: commits are ordered, so
/// acknowledgements go out in arrival order).
struct Pipeline {
    open: Vec<(Incoming, Option<AckToken>)>,
    first_at: Option<Instant>,
    committing: Option<InFlight>,
    /// When the batch in `committing` was submitted (a hung disk stops the watchdog pings).
    commit_started: Option<Instant>,
}

impl<'a> Consumer<'a> {
    fn new(
        config: &Config,
        worker: StoreWorker,
        notifier: &'a Notifier,
        relay: Option<&'a Relay>,
        stop_started: &'a std::cell::Cell<Option<Instant>>,
        metrics: Metrics,
    ) -> Consumer<'a> {
        let window = config
            .mqtt
            .as_ref()
            .map_or(usize::MAX, |m| usize::from(m.receive_maximum));
        Consumer {
            max_batch: config.max_batch,
            linger: config.linger,
            window,
            drain_timeout: config.shutdown_timeout,
            feed: config.feed.clone(),
            worker,
            notifier,
            summary: RunSummary::default(),
            burst: None,
            fatal: None,
            relay,
            stop_started,
            metrics,
            started_ms: now_ms(),
            status_sent: Instant::now(),
            client_id: config
                .mqtt
                .as_ref()
                .map_or_else(String::new, |m| m.client_id.clone()),
        }
    }

    async fn run(
        mut self,
        mqtt: crate::config::MqttConfig,
        mut shutdown: Shutdown,
    ) -> Result<RunSummary, ServiceError> {
        // Accept any packet MQTT allows: an oversized payload must reach `wire` to be
        // quarantined (a smaller client limit makes v5 brokers drop it silently and v3.1.1
        // connections loop on reconnect). The broker's message_size_limit bounds memory.
        let max_packet = MQTT_MAX_PACKET;
        let (ev_tx, mut events) = mpsc::unbounded_channel();
        let (handle, poller) = transport::start(mqtt, max_packet, ev_tx)?;
        let mut p = Pipeline {
            open: Vec::new(),
            first_at: None,
            committing: None,
            commit_started: None,
        };
        let watchdog = Notifier::watchdog_interval();
        let mut ticker = tokio::time::interval(watchdog.unwrap_or(Duration::from_secs(3600)));
        loop {
            let linger_at = p.first_at.map(|t| t + self.linger);
            tokio::select! {
                biased;
                () = shutdown.requested() => break,
                done = async { (&mut p.committing.as_mut().expect("guarded").0).await }, if p.committing.is_some() => {
                    let (_, tokens) = p.committing.take().expect("guarded");
                    self.finish_commit(done, tokens, &handle)?;
                }
                ev = events.recv() => match ev {
                    Some(TransportEvent::Fatal(e)) => {
                        self.fatal = Some(e);
                        break;
                    }
                    Some(ev) => self.on_event(ev, &mut p),
                    None => return Err(ServiceError::Runtime("the MQTT poll loop stopped unexpectedly".into())),
                },
                () = sleep_until(linger_at), if linger_at.is_some() && p.committing.is_none() => {}
                _ = ticker.tick(), if watchdog.is_some() => {
                    // Ping only while commits make progress: a commit stuck for a whole
                    // watchdog period (a hung disk) lets systemd restart us. A commit
                    // retrying against an unreachable PostgreSQL server is not stuck: its
                    // attempts keep failing (each bounded by the connect timeout) and the
                    // STATUS says so; a restart would only fail to open the store.
                    let period = watchdog.unwrap_or_default() * 2;
                    let retrying = self.worker.retrying(period + UNREACHABLE_BACKOFF.1);
                    match p.commit_started.filter(|_| p.committing.is_some()) {
                        Some(t) if t.elapsed() > period && !retrying => {
                            tracing::warn!(waiting = ?t.elapsed(), "commit not finished after {:?}: withholding the watchdog ping", t.elapsed());
                        }
                        _ => {
                            self.notifier.notify(&format!("WATCHDOG=1\nSTATUS={}", self.status()));
                            self.status_sent = Instant::now();
                        }
                    }
                }
            }
            self.maybe_commit(&mut p, false);
        }
        self.drain(p, &handle, &mut events, poller, &mut shutdown)
            .await?;
        match self.fatal.take() {
            Some(e) => Err(ServiceError::Transport(e)),
            None => Ok(self.summary),
        }
    }

    fn status(&self) -> String {
        let c = &self.summary.counts;
        let since = self.worker.unreachable_since.load(Ordering::Relaxed);
        let mut line = if since > 0 {
            format!(
                "PostgreSQL UNREACHABLE since {} (acknowledgements withheld, retrying); ",
                crate::timefmt::rfc3339_ms(since)
            )
        } else {
            String::new()
        };
        // This process's counts: a restart starts them again, so the line says since when
        // (`stats` reads the store's own).
        line += &format!(
            "applied={} duplicate={} quarantined={} reconnects={} failovers={} since {}",
            c.get(Outcome::Applied) + c.get(Outcome::AppliedLate),
            c.get(Outcome::Duplicate),
            c.get(Outcome::Conflict) + c.get(Outcome::Stale) + c.get(Outcome::Malformed),
            self.summary.reconnects,
            self.summary.failovers,
            crate::timefmt::rfc3339_ms(self.started_ms)
        );
        if let Some(r) = self.relay {
            line.push_str("; ");
            line.push_str(&if r.is_running() {
                r.status_line()
            } else {
                "relay stopped (see the log)".into()
            });
        }
        line
    }

    fn on_event(&mut self, ev: TransportEvent, p: &mut Pipeline) {
        match ev {
            TransportEvent::Delivery(d) => {
                let incoming = Incoming::decode(d.topic, d.payload, now_ms(), &self.feed);
                if p.open.is_empty() {
                    p.first_at = Some(Instant::now());
                }
                p.open.push((incoming, d.token));
            }
            TransportEvent::Connected {
                broker,
                session_present,
            } => {
                tracing::info!(%broker, session_present, "connected");
                self.metrics.connected(&broker, true);
                self.worker
                    .connected(&broker, &self.client_id, session_present);
                self.end_burst();
                // Replays come after a reconnect: count what is absorbed until a batch has none.
                if self.summary.reconnects > 0 {
                    self.burst = Some((broker, now_ms(), 0));
                }
            }
            TransportEvent::Subscribed { broker, filters } => {
                // The integration tests wait on this line before they publish: keep its text.
                tracing::info!(%broker, filters, "subscribed");
            }
            TransportEvent::Disconnected { broker, error } => {
                self.summary.reconnects += 1;
                self.metrics.connection_lost(&broker);
                tracing::warn!(%broker, %error, "connection lost to {broker} ({error}); unacknowledged deliveries will be redelivered");
            }
            TransportEvent::Failover { from, to } => {
                self.summary.failovers += 1;
                self.metrics.switched();
                tracing::warn!(%from, %to, "switching broker from {from} to {to}");
            }
            TransportEvent::Closed => {}
            TransportEvent::Fatal(e) => self.fatal = Some(e),
        }
    }

    /// Starts a commit when the batch is full, the broker's in-flight window is used up (no
    /// more deliveries can come until we ack), its linger has passed, or we are draining.
    fn maybe_commit(&mut self, p: &mut Pipeline, draining: bool) {
        if p.committing.is_some() || p.open.is_empty() {
            return;
        }
        let lingered = p.first_at.is_some_and(|t| t.elapsed() >= self.linger);
        if !(draining || lingered || p.open.len() >= self.max_batch || p.open.len() >= self.window)
        {
            return;
        }
        let take = p.open.len().min(self.max_batch);
        let rest = p.open.split_off(take);
        let batch = std::mem::replace(&mut p.open, rest);
        p.first_at = (!p.open.is_empty()).then(Instant::now);
        let (incoming, tokens): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        p.committing = Some((self.worker.submit(incoming), tokens));
        p.commit_started = Some(Instant::now());
    }

    fn finish_commit(
        &mut self,
        done: Result<Result<BatchReport, StoreError>, oneshot::error::RecvError>,
        tokens: Vec<Option<AckToken>>,
        handle: &TransportHandle,
    ) -> Result<(), ServiceError> {
        let report = match done {
            Ok(Ok(report)) => report,
            // Fatal by design: nothing of this batch is acknowledged; the broker redelivers.
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(ServiceError::Runtime("the store thread died".into())),
        };
        let delivered = tokens.len();
        let stats = handle.ack(tokens.into_iter().flatten());
        handle.release(delivered);
        self.summary.acks_sent += stats.sent as u64;
        self.summary.acks_stale += stats.stale as u64;
        self.metrics.acks(stats.sent as u64, stats.stale as u64);
        self.metrics
            .committed(&report.counts, report.decided.len(), now_ms());
        if stats.deferred > 0 {
            tracing::debug!(
                deferred = stats.deferred,
                "the request queue is full: PUBACKs deferred, queued in order as it drains"
            );
        }
        self.summary.counts.merge(&report.counts);
        self.summary.batches += 1;
        // Between watchdog pings (every WatchdogSec/2), `systemctl status` follows the feed.
        if self.status_sent.elapsed() >= STATUS_EVERY {
            self.notifier.notify(&format!("STATUS={}", self.status()));
            self.status_sent = Instant::now();
        }
        let dups = report.counts.get(Outcome::Duplicate);
        match &mut self.burst {
            Some((_, _, n)) if dups > 0 => *n += dups,
            Some(_) => self.end_burst(),
            None => {}
        }
        tracing::debug!(
            size = report.decided.len(),
            duplicates = dups,
            evicted = report.evicted,
            "batch committed"
        );
        Ok(())
    }

    fn end_burst(&mut self) {
        if let Some((broker, connected_at_ms, n)) = self.burst.take()
            && n > 0
        {
            self.metrics.burst(n);
            tracing::info!(%broker, duplicates = n, "replay burst absorbed: {n} duplicates after connecting to {broker}");
            self.worker.record_burst(BurstRecord {
                broker,
                connected_at_ms,
                ended_at_ms: now_ms(),
                duplicates: n,
            });
        }
    }

    /// Stop taking deliveries, commit what is open, flush its acks, DISCONNECT keeping the
    /// session; all within the shutdown timeout.
    async fn drain(
        &mut self,
        mut p: Pipeline,
        handle: &TransportHandle,
        events: &mut mpsc::UnboundedReceiver<TransportEvent>,
        poller: tokio::task::JoinHandle<()>,
        shutdown: &mut Shutdown,
    ) -> Result<(), ServiceError> {
        self.notifier.notify("STOPPING=1");
        self.stop_started.set(Some(Instant::now()));
        tracing::info!(open = p.open.len(), "draining");
        // `Config` bounds the timeout (at most an hour); checked so no value can panic here.
        let now = tokio::time::Instant::now();
        let deadline = now
            .checked_add(self.drain_timeout)
            .unwrap_or_else(|| now + Duration::from_secs(3600));
        let work = async {
            loop {
                if let Some((rx, tokens)) = p.committing.take() {
                    let done = rx.await;
                    self.finish_commit(done, tokens, handle)?;
                }
                self.maybe_commit(&mut p, true);
                if p.committing.is_none() {
                    break;
                }
            }
            self.end_burst();
            handle.disconnect();
            // Deliveries still arriving are not acknowledged: the broker keeps them.
            while let Some(ev) = events.recv().await {
                if matches!(ev, TransportEvent::Closed) {
                    break;
                }
            }
            Ok::<(), ServiceError>(())
        };
        tokio::select! {
            r = tokio::time::timeout_at(deadline, work) => match r {
                Ok(r) => r?,
                Err(_) => tracing::warn!(
                    "shutdown timeout reached; unacknowledged deliveries will be redelivered"
                ),
            },
            () = shutdown.forced() => {
                poller.abort();
                // A commit in progress may be stuck on the disk: the store thread is left to
                // the process's exit rather than joined.
                self.worker.detach();
                return Err(ServiceError::Forced);
            }
        }
        poller.abort();
        tracing::info!(summary = %self.status(), "stopped");
        Ok(())
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::Gap;
    use crate::store::StoreOptions;
    use crate::testing::{T0, feed};

    fn gap(from: u64, to: u64) -> ReportedGap {
        ReportedGap {
            agency: "A".into(),
            source_id: "S".into(),
            gap: Gap { epoch: 0, from, to },
        }
    }

    fn recorded(store: &Backend) -> Vec<(u64, u64)> {
        let rec = store.reader().unwrap().upstream_losses().unwrap();
        rec.recent_gaps.iter().map(|g| (g.from, g.to)).collect()
    }

    #[test]
    fn candidates_wait_for_the_grace_and_a_drain_confirms_them_at_once() {
        let mut store = Backend::Redb(Store::open_in_memory(StoreOptions::default()).unwrap());
        let metrics = Metrics::new(std::iter::empty());
        feed(&mut store, 1..=1, T0);
        feed(&mut store, 5..=5, T0); // opens 2..=4
        let mut p = PendingGaps::new(Duration::from_secs(600));
        p.add(vec![gap(2, 4)]);
        assert!(p.wait().unwrap() > Duration::from_secs(500));
        p.confirm(&mut store, &metrics, false);
        assert_eq!(p.candidates.len(), 1, "within its grace it waits");
        assert_eq!(recorded(&store), []);
        feed(&mut store, 3..=3, T0);
        // Draining: confirmed at once, without the grace; 3 arrived meanwhile.
        p.confirm(&mut store, &metrics, true);
        assert!(p.candidates.is_empty());
        assert_eq!(p.wait(), None);
        assert_eq!(recorded(&store), [(2, 2), (4, 4)]);

        // A grace of 0: due at the next commit or tick.
        let mut p = PendingGaps::new(Duration::ZERO);
        feed(&mut store, 10..=10, T0); // opens 6..=9
        p.add(vec![gap(6, 9)]);
        assert_eq!(p.wait(), Some(Duration::ZERO));
        p.confirm(&mut store, &metrics, false);
        assert!(p.candidates.is_empty());
        assert_eq!(recorded(&store), [(2, 2), (4, 4), (6, 9)]);
    }
}
