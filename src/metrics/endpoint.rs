//! The metrics endpoint: `GET /metrics` on `[metrics] listen`, in the text format, served by
//! hyper on a thread and runtime of its own, so that a scrape (which reads the store through a
//! read-only handle, as `stats` does) never delays a commit or an acknowledgement. An address
//! that cannot be bound is logged and tried again: metrics never stop the feed.
//!
//! Slow clients cannot keep a scraper out: a client has `REQUEST_TIMEOUT` to send its request,
//! at most `MAX_CONNECTIONS` are open at once, and a connection beyond those is not closed but
//! left in the kernel's listen queue until one ends (within `REQUEST_TIMEOUT` for one that
//! sends nothing), so a scraper waits its turn. Open sockets, request buffers
//! (`MAX_REQUEST_BYTES`) and store reads at once (`MAX_SCRAPES`) are all bounded.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};

use super::Metrics;
use crate::config::{Config, StoreLocation};
use crate::hyper_io::Io;
use crate::readings::Readings;
use crate::store::{Reader, StoreError};
use crate::timefmt::now_ms;

/// Connections open at once, reading a request or answering it; more wait, unaccepted, in the
/// listen queue. Each holds a socket and at most `MAX_REQUEST_BYTES` of buffer.
const MAX_CONNECTIONS: usize = 64;
/// From accepting a connection to its whole request head (a GET has no body); past it the
/// connection is closed, so a client that sends nothing or a byte at a time frees its place.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// hyper's read buffer, so the longest request head (hyper answers 431 past it); hyper
/// refuses a buffer under 8 KiB.
const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// Scrapes reading the store at once (each on a blocking thread); more wait for a turn.
const MAX_SCRAPES: usize = 4;
/// A connection's whole life: request, a turn, store read, answer.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(15);
/// The store read of one scrape; past it the scrape answers without the store's gauges.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Between attempts to bind an address that was refused.
const BIND_RETRY: Duration = Duration::from_secs(30);

/// The running endpoint; dropping it stops it.
pub struct Endpoint {
    stop: Option<watch::Sender<bool>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What a scrape reads.
struct Scrape {
    live: Option<Metrics>,
    config: Config,
    /// Opened at the first scrape and kept (it follows the writer's commits); dropped after
    /// an error, so the next scrape opens it afresh.
    reader: Mutex<Option<Reader>>,
    /// Whether the last read failed (the failure is logged once, not every scrape).
    failing: std::sync::atomic::AtomicBool,
    /// When (ms) the read under way began, 0 when none is: a read that hangs (a server that
    /// stopped answering) makes later scrapes fail at once instead of each parking a thread
    /// on the lock.
    reading_since: std::sync::atomic::AtomicU64,
}

impl Endpoint {
    /// `start` on `config`'s `[metrics] listen`, if it has one.
    pub fn for_config(config: &Config, live: Option<Metrics>) -> std::io::Result<Option<Endpoint>> {
        config
            .metrics
            .map(|listen| Endpoint::start(listen, live, config.clone()))
            .transpose()
    }

    /// Starts serving on `listen`: `live`, the service's metrics (none for a standalone
    /// relay), and the gauges of the store `config` names.
    pub fn start(
        listen: SocketAddr,
        live: Option<Metrics>,
        config: Config,
    ) -> std::io::Result<Endpoint> {
        let (stop, stopped) = watch::channel(false);
        let scrape = Arc::new(Scrape {
            live,
            config,
            reader: Mutex::new(None),
            failing: std::sync::atomic::AtomicBool::new(false),
            reading_since: std::sync::atomic::AtomicU64::new(0),
        });
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "metrics endpoint: cannot start its runtime: {e}");
                        return;
                    }
                };
                rt.block_on(serve(listen, scrape, stopped));
                // A store read still under way (an unreachable server) is not waited for.
                rt.shutdown_timeout(Duration::from_millis(200));
            })?;
        Ok(Endpoint {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn serve(listen: SocketAddr, scrape: Arc<Scrape>, mut stopped: watch::Receiver<bool>) {
    let mut refused = 0u64;
    let listener = loop {
        match TcpListener::bind(listen).await {
            Ok(l) => break l,
            Err(e) => {
                refused += 1;
                if refused == 1 {
                    tracing::error!(%listen, error = %e, "metrics endpoint: cannot listen on {listen} ({e}); the feed goes on, retrying every 30 s");
                } else if refused.is_power_of_two() {
                    // Fewer and fewer lines: an address that never binds must not flood the log.
                    tracing::warn!(%listen, error = %e, attempts = refused, "metrics endpoint: still cannot listen on {listen} after {refused} attempts: {e}");
                }
            }
        }
        tokio::select! {
            _ = stopped.changed() => return,
            () = tokio::time::sleep(BIND_RETRY) => {}
        }
    };
    let addr = listener.local_addr().map_or(listen, |a| a);
    tracing::info!(%addr, "metrics endpoint listening on http://{addr}/metrics");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let turns = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        // A place first, then the connection: while all are taken, new connections wait in
        // the kernel's listen queue (its backlog bounds them), not in this process.
        let slot = tokio::select! {
            _ = stopped.changed() => return,
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => return, // never closed
            },
        };
        let stream = tokio::select! {
            _ = stopped.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    tracing::warn!(error = %e, "metrics endpoint: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        tokio::spawn(connection(stream, scrape.clone(), turns.clone(), slot));
    }
}

/// Serves one connection, one request, within its deadlines; `slot` is its place.
async fn connection(
    stream: TcpStream,
    scrape: Arc<Scrape>,
    turns: Arc<Semaphore>,
    slot: OwnedSemaphorePermit,
) {
    let accepted = tokio::time::Instant::now();
    let requested = Arc::new(Notify::new());
    let service = {
        let requested = requested.clone();
        hyper::service::service_fn(move |req| {
            // hyper calls the service once the request head is read.
            requested.notify_one();
            let scrape = scrape.clone();
            let turns = turns.clone();
            async move { Ok::<_, Infallible>(respond(&scrape, &turns, &req).await) }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .max_buf_size(MAX_REQUEST_BYTES)
        .serve_connection(Io(stream), service);
    tokio::pin!(conn);
    // hyper's own `header_read_timeout` needs a `hyper::rt::Timer` (hyper-util's, a crate
    // this one does without); this is the same deadline, kept here.
    let head = tokio::time::timeout(REQUEST_TIMEOUT, async {
        tokio::select! {
            _ = &mut conn => false,
            () = requested.notified() => true,
        }
    })
    .await;
    if matches!(head, Ok(true)) {
        let _ = tokio::time::timeout_at(accepted + CONNECTION_TIMEOUT, conn).await;
    }
    drop(slot);
}

async fn respond(
    scrape: &Arc<Scrape>,
    turns: &Semaphore,
    req: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let text = |status: StatusCode, body: String, media: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(media));
        r
    };
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "GET /metrics\n".into(),
            PLAIN,
        );
    }
    match req.uri().path() {
        "/metrics" => {
            // Never closed; a scrape without a turn is still bounded by the reader's lock.
            let _turn = turns.acquire().await.ok();
            let s = scrape.clone();
            let read = tokio::task::spawn_blocking(move || s.read_store());
            let readings = match tokio::time::timeout(READ_TIMEOUT, read).await {
                Ok(Ok(r)) => scrape.note(r),
                Ok(Err(_)) => scrape.note(Err(ReadError::Panicked)),
                Err(_) => scrape.note(Err(ReadError::Timeout)),
            };
            let body = super::scrape(scrape.live.as_ref(), readings.as_ref());
            text(StatusCode::OK, body, super::CONTENT_TYPE)
        }
        "/" => text(
            StatusCode::OK,
            "replay-guard: metrics at /metrics\n".into(),
            PLAIN,
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: GET /metrics\n".into(),
            PLAIN,
        ),
    }
}

/// Why a scrape has no readings of the store: its gauges then say it is not readable.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// A read on the blocking pool outlived its scrape and still holds the reader.
    #[error("an earlier store read has not returned for {secs} s")]
    Stuck { secs: u64 },
    #[error("the store read panicked")]
    Panicked,
    #[error("no answer from the store within {} s", READ_TIMEOUT.as_secs())]
    Timeout,
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Scrape {
    fn read_store(&self) -> Result<Readings, ReadError> {
        use std::sync::atomic::Ordering;
        let since = self.reading_since.load(Ordering::Relaxed);
        let limit = u64::try_from(READ_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
        if since > 0 && now_ms().saturating_sub(since) > limit {
            return Err(ReadError::Stuck {
                secs: now_ms().saturating_sub(since) / 1000,
            });
        }
        let mut reader = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        self.reading_since.store(now_ms().max(1), Ordering::Relaxed);
        let result = self.read_locked(&mut reader);
        self.reading_since.store(0, Ordering::Relaxed);
        result
    }

    fn read_locked(&self, reader: &mut Option<Reader>) -> Result<Readings, ReadError> {
        let read = |reader: &Reader| -> Result<Readings, StoreError> {
            let snap = reader.begin()?;
            let db = self.config.db_path.clone().unwrap_or_default();
            Readings::read(&snap, &db, &self.config, now_ms())
        };
        let result = match reader.as_ref() {
            Some(r) => read(r),
            None => self.open().and_then(|r| read(reader.insert(r))),
        };
        if result.is_err() {
            *reader = None;
        }
        Ok(result?)
    }

    fn open(&self) -> Result<Reader, StoreError> {
        match self.config.location() {
            Ok(StoreLocation::File(db)) => Reader::open(db),
            Ok(StoreLocation::Postgres(pg)) => {
                let cfg = pg
                    .pg_config()
                    .map_err(|e| StoreError::Refused(e.to_string()))?;
                Reader::postgres(cfg).map(|(r, _)| r)
            }
            Err(e) => Err(StoreError::Refused(e.to_string())),
        }
    }

    /// Logs a failing read once (and its recovery), and passes the readings on.
    fn note(&self, r: Result<Readings, ReadError>) -> Option<Readings> {
        use std::sync::atomic::Ordering;
        let was = self.failing.swap(r.is_err(), Ordering::Relaxed);
        match r {
            Ok(r) => {
                if was {
                    tracing::info!("metrics endpoint: the store is readable again");
                }
                Some(r)
            }
            Err(why) => {
                if !was {
                    tracing::warn!(error = %why, "metrics endpoint: cannot read the store ({why}); scrapes carry replay_guard_store_readable 0");
                }
                None
            }
        }
    }
}
