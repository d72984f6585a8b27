//! A blocking PostgreSQL connection for the store thread: tokio-postgres driven by a
//! current-thread runtime of its own (the store's callers are plain threads), its errors
//! sorted into "the server is unreachable" (retry later, on a new connection), "the server
//! refused this" (a schema or data problem) and "TLS refused a certificate" (configuration).
//! Every round trip has a deadline (`[store] statement_timeout_ms`), and so has the whole
//! connection attempt (the dsn's `connect_timeout`): a server or proxy that stops answering
//! without closing the connection is a lost connection, not a silent stall.
//!
//! Writes whose answer nothing waits for (a transaction's array inserts, its BEGIN and lock)
//! are queued (`defer`) and pipelined in front of the next statement that needs an answer
//! (a read, the COMMIT): PostgreSQL runs them in order on the session, so the read sees them,
//! and their errors are reported first. A batch so costs a handful of round trips.
//!
//! The relay's wake-up lives here too: `follow_commits` LISTENs on the schema's channel, on
//! which every commit that appended to a log NOTIFYs.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;
use tokio_postgres::types::ToSql;

use tokio_postgres::{Client, Row, Statement};

use super::tls::{DsnError, HandshakeError, PgTls, parse_dsn};
use crate::store::StoreError;

/// The connection settings, parsed once; never printed (the dsn may hold a password).
#[derive(Clone)]
pub struct PgConfig {
    pub(super) config: tokio_postgres::Config,
    /// The dsn's `sslmode` and certificates (files read when the dsn was parsed).
    tls: PgTls,
    /// The schema holding replay-guard's tables.
    pub schema: String,
    /// How long any one round trip may take (`[store] statement_timeout_ms`).
    statement_timeout: Duration,
}

/// `[store] statement_timeout_ms` when not given.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// `connect_timeout` when the dsn gives none (it bounds each host's whole attempt).
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// tokio-postgres's `keepalives_idle` default (2 h, the kernel's): replaced unless the dsn
/// asks for it.
const STOCK_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Hosts and database only: never the password.
        write!(
            f,
            "PgConfig {{ hosts: {:?}, dbname: {:?}, schema: {:?} }}",
            self.config.get_hosts(),
            self.config.get_dbname(),
            self.schema
        )
    }
}

impl PgConfig {
    /// Parses `dsn` (key=value or a postgres:// URL, with libpq's `sslmode`, `sslrootcert`,
    /// `sslcert`, `sslkey`) and reads the certificate files it names. The error never quotes
    /// the dsn.
    pub fn parse(dsn: &str, schema: &str) -> Result<PgConfig, DsnError> {
        let (mut config, tls) = parse_dsn(dsn)?;
        if config.get_application_name().is_none() {
            config.application_name("replay-guard");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        // Our side's keepalives, as the server's (`Conn::connect`): a cut link ends the
        // connection within about 25 s even while no round trip is waiting, unless the dsn
        // chose otherwise. (A peer whose kernel still answers, a frozen proxy, is caught by
        // the round trip's deadline instead.)
        if config.get_keepalives_idle() == STOCK_KEEPALIVES_IDLE {
            config.keepalives_idle(Duration::from_secs(10));
        }
        if config.get_keepalives_interval().is_none() {
            config.keepalives_interval(Duration::from_secs(5));
        }
        if config.get_keepalives_retries().is_none() {
            config.keepalives_retries(3);
        }
        Ok(PgConfig {
            config,
            tls,
            schema: schema.to_string(),
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
        })
    }

    /// The deadline of every round trip (`[store] statement_timeout_ms`).
    pub fn with_statement_timeout(mut self, timeout: Duration) -> PgConfig {
        self.statement_timeout = timeout;
        self
    }

    /// How long a whole connection attempt may take: the dsn's `connect_timeout` (as in
    /// libpq, it bounds TLS and the log-in too) for each host.
    fn connect_deadline(&self) -> Duration {
        let hosts = u32::try_from(self.config.get_hosts().len().max(1)).unwrap_or(u32::MAX);
        self.config
            .get_connect_timeout()
            .copied()
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT)
            .saturating_mul(hosts)
    }

    /// Where it connects, for messages: host(s), port and database, never the password.
    pub fn target(&self) -> String {
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .map(|h| match h {
                tokio_postgres::config::Host::Tcp(h) => h.clone(),
                tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
            })
            .collect();
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        format!(
            "postgresql {}:{port}/{} schema {}",
            hosts.join(","),
            self.config.get_dbname().unwrap_or("postgres"),
            self.schema
        )
    }
}

/// One live connection.
pub struct Conn {
    rt: tokio::runtime::Runtime,
    client: Client,
    /// Statements prepared on this connection, by their text: a query then costs one round
    /// trip instead of two (prepare, execute).
    prepared: RefCell<HashMap<String, Statement>>,
    /// Where it is connected, for messages (never the password).
    target: String,
    /// Relay sinks whose session-level advisory lock this connection's session holds (taken
    /// by `PgTx::claim_sink`; they end with the session, so a new connection starts empty).
    sink_locks: RefCell<HashSet<String>>,
    /// The deadline of each round trip.
    statement_timeout: Duration,
    /// Set when a round trip missed its deadline: the session's state is unknown (a request
    /// may still be on its way), so the connection is never used again.
    given_up: Cell<bool>,
    /// Statements queued by `defer`, sent in front of the next round trip.
    pending: RefCell<Vec<Deferred>>,
    /// The open transaction appended to the effect or audit log: its COMMIT notifies.
    appended: Cell<bool>,
}

/// A parameter of a deferred statement, owned until it is sent.
pub type Param = Box<dyn ToSql + Sync + Send>;

/// A statement queued by `Conn::defer`.
enum Deferred {
    /// A simple-protocol statement (no parameters: BEGIN, a lock).
    Simple(String),
    /// A prepared statement and its parameters.
    Prepared(Statement, Vec<Param>),
}

/// A pipelined statement's future, its answer dropped.
type Sent<'a, E = tokio_postgres::Error> = Pin<Box<dyn Future<Output = Result<(), E>> + 'a>>;

/// Polls every future in `sent` and then `last`, in that order (so their requests leave in
/// that order), until all have answered; the first error among `sent` wins over `last`'s
/// outcome (a statement after a failed one only reports the aborted transaction).
///
/// A future that fails at its first poll failed in the client (its parameters could not be
/// encoded: a wrong type, a value too large to transmit) and sent nothing, so the server's
/// transaction is not aborted by it: the futures after it, and `last` (the COMMIT, say), are
/// then never polled, never sent. Only those already sent are driven to their answers.
async fn in_order<T, E>(
    sent: Vec<Sent<'_, E>>,
    last: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let mut sent: Vec<Option<Sent<'_, E>>> = sent.into_iter().map(Some).collect();
    let mut first_error = None;
    let mut last = std::pin::pin!(last);
    let mut outcome = None;
    // How many futures of `sent` have been polled (sent) so far, and whether one failed
    // before sending (nothing after it may be sent).
    let mut started = 0;
    let mut refused = false;
    std::future::poll_fn(|cx| {
        for (i, slot) in sent.iter_mut().enumerate() {
            if refused && i >= started {
                break;
            }
            let first_poll = i >= started;
            if let Some(f) = slot {
                if first_poll {
                    started = i + 1;
                }
                if let Poll::Ready(r) = f.as_mut().poll(cx) {
                    *slot = None;
                    if let Err(e) = r {
                        if first_poll {
                            refused = true;
                        }
                        if first_error.is_none() {
                            first_error = Some(e);
                        }
                    }
                }
            }
        }
        if !refused
            && outcome.is_none()
            && let Poll::Ready(r) = last.as_mut().poll(cx)
        {
            outcome = Some(r);
        }
        let sent_done = sent[..started].iter().all(Option::is_none);
        if (refused && sent_done) || (outcome.is_some() && sent.iter().all(Option::is_none)) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    match (first_error, outcome) {
        (Some(e), _) => Err(e),
        (None, Some(r)) => r,
        (None, None) => unreachable!("polled to the end above"),
    }
}

impl Conn {
    pub fn connect(cfg: &PgConfig) -> Result<Conn, StoreError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Unreachable(format!("cannot start a runtime: {e}")))?;
        let within = cfg.connect_deadline();
        let (client, connection) = rt
            .block_on(async {
                tokio::time::timeout(within, cfg.config.connect(cfg.tls.clone())).await
            })
            .map_err(|_| {
                StoreError::Unreachable(format!(
                    "{} did not complete the connection within {} ms (connect_timeout)",
                    cfg.target(),
                    within.as_millis()
                ))
            })?
            .map_err(|e| classify(&e))?;
        // Driven whenever a query is (the runtime runs only inside `block_on`).
        rt.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("postgresql connection ended: {}", describe(&e));
            }
        });
        let conn = Conn {
            rt,
            client,
            prepared: RefCell::new(HashMap::new()),
            target: cfg.target(),
            sink_locks: RefCell::new(HashSet::new()),
            statement_timeout: cfg.statement_timeout,
            given_up: Cell::new(false),
            pending: RefCell::new(Vec::new()),
            appended: Cell::new(false),
        };
        // `CREATE ... IF NOT EXISTS` on every start must not log a NOTICE each time. The
        // keepalives let the server notice within about 25 s a member that vanished (a cut
        // link, not a closed socket) and end its session: its transaction, the schema's lock
        // and its relay sinks' locks are then released instead of holding the group for hours.
        conn.batch(SESSION_SETUP)?;
        Ok(conn)
    }

    /// Where it is connected (host, port, database), for messages.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Whether this session holds sink `name`'s lock (see `PgTx::claim_sink`).
    pub fn holds_sink(&self, name: &str) -> bool {
        self.sink_locks.borrow().contains(name)
    }

    /// Notes that this session took sink `name`'s lock.
    pub fn took_sink(&self, name: &str) {
        self.sink_locks.borrow_mut().insert(name.to_string());
    }

    pub fn is_closed(&self) -> bool {
        self.given_up.get() || self.client.is_closed()
    }

    /// Runs one round trip to its answer or its deadline, the deferred statements sent in
    /// front of it (their first error is its error). A missed deadline is a lost connection
    /// (`Unreachable`): the caller drops this one and retries on a new one, as after a closed
    /// socket; a COMMIT among them has an unknown outcome, as then.
    fn round_trip<'a, T>(
        &'a self,
        f: impl Future<Output = Result<T, tokio_postgres::Error>> + 'a,
    ) -> Result<T, StoreError> {
        self.round_trip_within(self.statement_timeout, f)
    }

    /// `round_trip` with deadline `within` instead of `[store] statement_timeout_ms`.
    fn round_trip_within<'a, T>(
        &'a self,
        within: Duration,
        f: impl Future<Output = Result<T, tokio_postgres::Error>> + 'a,
    ) -> Result<T, StoreError> {
        let pending = self.pending.take();
        if self.given_up.get() {
            return Err(StoreError::Unreachable(format!(
                "the connection to {} was given up after a missed deadline",
                self.target
            )));
        }
        let sent: Vec<Sent<'_>> = pending
            .iter()
            .map(|d| -> Sent<'_> {
                match d {
                    Deferred::Simple(sql) => Box::pin(self.client.batch_execute(sql)),
                    Deferred::Prepared(st, params) => Box::pin(async move {
                        let refs: Vec<&(dyn ToSql + Sync)> = params
                            .iter()
                            .map(|p| -> &(dyn ToSql + Sync) { &**p })
                            .collect();
                        self.client.execute(st, &refs).await.map(|_| ())
                    }),
                }
            })
            .collect();
        match self
            .rt
            .block_on(async { tokio::time::timeout(within, in_order(sent, f)).await })
        {
            Ok(r) => r.map_err(|e| classify(&e)),
            Err(_) => {
                self.given_up.set(true);
                let why = if within == self.statement_timeout {
                    " ([store] statement_timeout_ms)"
                } else {
                    ""
                };
                Err(StoreError::Unreachable(format!(
                    "{} did not answer within {} ms{why}: the connection is given up",
                    self.target,
                    within.as_millis()
                )))
            }
        }
    }

    pub fn batch(&self, sql: &str) -> Result<(), StoreError> {
        self.round_trip(self.client.batch_execute(sql))
    }

    /// `batch` with deadline `within`: DDL that builds an index over a table already
    /// holding rows (a schema upgrade) takes as long as the table needs (24 s at 20M rows
    /// here, more on a slower disk).
    pub fn batch_within(&self, sql: &str, within: Duration) -> Result<(), StoreError> {
        self.round_trip_within(within, self.client.batch_execute(sql))
    }

    /// Queues `sql` (simple protocol, no parameters) to be sent in front of the next round
    /// trip.
    pub fn defer_batch(&self, sql: &str) {
        self.pending
            .borrow_mut()
            .push(Deferred::Simple(sql.to_string()));
    }

    /// Queues the prepared `sql` with `params` to be sent in front of the next round trip;
    /// its error, if any, is that round trip's. (Preparing it the first time is a round trip
    /// of its own, which sends what is queued before.)
    pub fn defer(&self, sql: &str, params: Vec<Param>) -> Result<(), StoreError> {
        let st = self.statement(sql)?;
        self.pending
            .borrow_mut()
            .push(Deferred::Prepared(st, params));
        Ok(())
    }

    /// Forgets the queued statements (the transaction is being rolled back).
    pub fn discard_deferred(&self) {
        self.pending.borrow_mut().clear();
        self.appended.set(false);
    }

    /// Notes that the open transaction appends to a log (its COMMIT notifies the relays).
    pub fn note_appended(&self) {
        self.appended.set(true);
    }

    /// Whether the open transaction appended to a log; resets it.
    pub fn take_appended(&self) -> bool {
        self.appended.replace(false)
    }

    /// The prepared statement for `sql` (prepared on first use).
    fn statement(&self, sql: &str) -> Result<Statement, StoreError> {
        if let Some(st) = self.prepared.borrow().get(sql) {
            return Ok(st.clone());
        }
        let st = self.round_trip(self.client.prepare(sql))?;
        self.prepared
            .borrow_mut()
            .insert(sql.to_string(), st.clone());
        Ok(st)
    }

    pub fn query(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, StoreError> {
        let st = self.statement(sql)?;
        self.round_trip(self.client.query(&st, params))
    }

    /// Several reads in one round trip (after the deferred statements): each one's rows.
    pub fn queries(
        &self,
        reads: &[(&str, &[&(dyn ToSql + Sync)])],
    ) -> Result<Vec<Vec<Row>>, StoreError> {
        let mut sts = Vec::with_capacity(reads.len());
        for (sql, _) in reads {
            sts.push(self.statement(sql)?);
        }
        let client = &self.client;
        self.round_trip(async move {
            let mut futures: Vec<_> = sts
                .iter()
                .zip(reads)
                .map(|(st, (_, params))| Box::pin(client.query(st, params)))
                .collect();
            // Every request is sent (first poll) before any answer is awaited.
            let mut out: Vec<Option<Result<Vec<Row>, tokio_postgres::Error>>> =
                futures.iter().map(|_| None).collect();
            std::future::poll_fn(|cx| {
                for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
                    if o.is_none()
                        && let Poll::Ready(r) = f.as_mut().poll(cx)
                    {
                        *o = Some(r);
                    }
                }
                if out.iter().all(Option::is_some) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            out.into_iter()
                .map(|o| o.unwrap_or_else(|| unreachable!("polled to the end above")))
                .collect()
        })
    }

    pub fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, StoreError> {
        let st = self.statement(sql)?;
        self.round_trip(self.client.execute(&st, params))
    }
}

/// What every session of ours sets first (`Conn::connect`, and the relay's LISTEN session,
/// which must not outlive a vanished member either: a listener nobody reads fills the
/// server's notification queue).
const SESSION_SETUP: &str = "SET client_min_messages TO warning; SET tcp_keepalives_idle TO 10; \
                             SET tcp_keepalives_interval TO 5; SET tcp_keepalives_count TO 3";

/// Wakes `woken` on each commit announced on `channel` (see `PgStore`'s COMMIT), on a
/// connection of its own that LISTENs, and once right after the LISTEN (for what committed
/// while nothing listened); returns when that connection is lost or cannot be made: whether
/// it listened, and why it ended. The caller connects again (`follow_commits`).
async fn listen(cfg: &PgConfig, channel: &str, woken: &tokio::sync::Notify) -> (bool, StoreError) {
    let connected =
        tokio::time::timeout(cfg.connect_deadline(), cfg.config.connect(cfg.tls.clone())).await;
    let (client, mut connection) = match connected {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return (false, classify(&e)),
        Err(_) => {
            let why = format!(
                "{} did not complete the connection (connect_timeout)",
                cfg.target()
            );
            return (false, StoreError::Unreachable(why));
        }
    };
    let (tx, mut notified) = tokio::sync::mpsc::unbounded_channel();
    // Drives the connection (it runs only when polled) and passes each notification on.
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(tokio_postgres::AsyncMessage::Notification(_))) => {
                    if tx.send(()).is_err() {
                        return None;
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Some(classify(&e)),
                None => return None,
            }
        }
    });
    let listening = tokio::time::timeout(cfg.statement_timeout, async {
        // Apart, so that the session's `query` in pg_stat_activity reads `LISTEN ...`.
        client.batch_execute(SESSION_SETUP).await?;
        client.batch_execute(&format!("LISTEN {channel}")).await
    })
    .await;
    let (listened, lost) = match listening {
        Ok(Ok(())) => {
            woken.notify_one();
            while notified.recv().await.is_some() {
                woken.notify_one();
            }
            (true, None)
        }
        Ok(Err(e)) => (false, Some(classify(&e))),
        Err(_) => (
            false,
            Some(StoreError::Unreachable(format!(
                "{} did not answer LISTEN within {} ms",
                cfg.target(),
                cfg.statement_timeout.as_millis()
            ))),
        ),
    };
    driver.abort();
    let ended = driver.await.ok().flatten();
    drop(client);
    let why = lost.or(ended).unwrap_or_else(|| {
        StoreError::Unreachable(format!("the connection to {} ended", cfg.target()))
    });
    (listened, why)
}

/// Keeps a connection LISTENing on `channel` for as long as it is polled, waking `woken` on
/// each notification and after each (re)connection; a lost connection is made again after a
/// backoff (0.1 s doubling to 5 s). Meanwhile the caller's slower poll covers the gap.
pub async fn follow_commits(
    cfg: PgConfig,
    channel: String,
    woken: std::sync::Arc<tokio::sync::Notify>,
) {
    let mut backoff = Duration::from_millis(100);
    // Warned about this outage already: the next attempts' failures are debug lines.
    let mut warned = false;
    loop {
        let (listened, e) = listen(&cfg, &channel, &woken).await;
        if listened {
            backoff = Duration::from_millis(100);
            warned = false;
        }
        if warned {
            tracing::debug!(error = %e, "listening for commits on {}: {e}", cfg.target());
        } else {
            tracing::warn!(error = %e, "the relay's connection listening for commits on {} ended ({e}); connecting again, polling meanwhile", cfg.target());
            warned = true;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// `Unreachable` for a lost or refused connection (and a server shutting down), `Postgres`
/// for a statement the server refused, `TlsRefused` for a certificate or host name the TLS
/// handshake refused (a configuration error: no retry can mend it).
pub fn classify(e: &tokio_postgres::Error) -> StoreError {
    if HandshakeError::refusal_in(e).is_some() {
        return StoreError::TlsRefused(describe(e));
    }
    match e.as_db_error() {
        // 08: connection exception; 57P01..03: admin shutdown, crash shutdown, cannot connect
        // now; 53: insufficient resources (e.g. too many connections).
        Some(db)
            if db.code().code().starts_with("08")
                || db.code().code().starts_with("57P")
                || db.code().code().starts_with("53") =>
        {
            StoreError::Unreachable(describe(e))
        }
        Some(_) => StoreError::Postgres(describe(e)),
        None => StoreError::Unreachable(describe(e)),
    }
}

/// The error with its causes, without the dsn.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{}: {} ({})", db.severity(), db.message(), db.code().code());
        if let Some(d) = db.detail() {
            s.push_str(&format!("; {d}"));
        }
        return s;
    }
    let mut s = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        s.push_str(&format!(": {c}"));
        cause = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A statement future that records that it was polled (sent) and answers `answer`, at
    /// once or after one `Pending` (an answer from the server).
    fn statement<'a>(
        log: &'a std::cell::RefCell<Vec<&'static str>>,
        name: &'static str,
        answer: Result<(), &'static str>,
        at_once: bool,
    ) -> Sent<'a, &'static str> {
        Box::pin(async move {
            log.borrow_mut().push(name);
            if !at_once {
                let mut yielded = false;
                std::future::poll_fn(|cx| {
                    if yielded {
                        Poll::Ready(())
                    } else {
                        yielded = true;
                        cx.waker().wake_by_ref();
                        Poll::Pending
                    }
                })
                .await;
            }
            answer
        })
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_statement_refused_before_sending_stops_what_follows_and_the_commit() {
        let log = std::cell::RefCell::new(Vec::new());
        let sent = vec![
            statement(&log, "insert audit", Ok(()), false),
            statement(
                &log,
                "insert effects",
                Err("value too large to transmit"),
                true,
            ),
            statement(&log, "insert window", Ok(()), false),
        ];
        let commit = statement(&log, "COMMIT", Ok(()), false);
        let r = block_on(in_order(sent, commit));
        assert_eq!(r, Err("value too large to transmit"));
        assert_eq!(
            log.into_inner(),
            ["insert audit", "insert effects"],
            "nothing after the refused statement is sent, the COMMIT least of all"
        );
    }

    #[test]
    fn a_server_error_is_reported_first_and_everything_is_sent_in_order() {
        let log = std::cell::RefCell::new(Vec::new());
        let sent = vec![
            statement(&log, "a", Ok(()), false),
            statement(&log, "b", Err("unique violation"), false),
            statement(&log, "c", Err("transaction aborted"), false),
        ];
        let commit = statement(&log, "COMMIT", Ok(()), false);
        assert_eq!(block_on(in_order(sent, commit)), Err("unique violation"));
        assert_eq!(log.into_inner(), ["a", "b", "c", "COMMIT"]);
        let log = std::cell::RefCell::new(Vec::new());
        let sent = vec![statement(&log, "a", Ok(()), true)];
        let commit = async { Ok::<_, &'static str>(7) };
        assert_eq!(block_on(in_order(sent, commit)), Ok(7));
    }

    #[test]
    fn keepalives_and_deadlines_have_defaults_and_the_dsn_overrides_keepalives() {
        let c = PgConfig::parse("host=h", "s").unwrap();
        assert_eq!(c.config.get_keepalives_idle(), Duration::from_secs(10));
        assert_eq!(
            c.config.get_keepalives_interval(),
            Some(Duration::from_secs(5))
        );
        assert_eq!(c.config.get_keepalives_retries(), Some(3));
        assert_eq!(c.statement_timeout, DEFAULT_STATEMENT_TIMEOUT);
        assert_eq!(c.connect_deadline(), DEFAULT_CONNECT_TIMEOUT);
        let c = PgConfig::parse(
            "host=a,b keepalives_idle=60 keepalives_interval=7 keepalives_retries=9 \
             connect_timeout=3",
            "s",
        )
        .unwrap()
        .with_statement_timeout(Duration::from_millis(250));
        assert_eq!(c.config.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(
            c.config.get_keepalives_interval(),
            Some(Duration::from_secs(7))
        );
        assert_eq!(c.config.get_keepalives_retries(), Some(9));
        assert_eq!(c.statement_timeout, Duration::from_millis(250));
        // Each host gets the dsn's connect_timeout for its whole attempt.
        assert_eq!(c.connect_deadline(), Duration::from_secs(6));
    }
}
