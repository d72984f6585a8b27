//! The `syslog` sink: each event as one RFC 5424 message, framed by octet counting (RFC 6587
//! 3.4.1, `LEN SP MSG`), on one TCP connection (`tcp://`) or TLS connection (`tls://`,
//! RFC 5425; the receiver verified against `ca_file`, with a client certificate if configured).
//!
//! The message, built by `message` (sans-IO, unit-tested):
//! `<PRI>1 TIMESTAMP HOSTNAME replay-guard PROCID MSGID [decision@32473 id=".." ...] MSG`:
//! PRI from the facility and the outcome's severity (`severity`), TIMESTAMP the event's own
//! time (its CloudEvents `time`, never the send time), PROCID this process's id, MSGID the
//! outcome, the structured data the event id and `Event::fields` (`SD_ID`), MSG the
//! CloudEvents JSON line, plain UTF-8 without a BOM.
//!
//! TCP syslog has no acknowledgement of its own, so a batch counts as delivered ("written to
//! the socket") only when (a) it was written and flushed, (b) the receiver's TCP acknowledged
//! every byte of it (Linux `SIOCOUTQ` on the socket is 0, polled until `timeout_ms`; under
//! TLS, the socket beneath), and (c) the connection was not seen ended (a receiver never
//! writes, so anything readable is its end: EOF, a reset, a TLS alert): on a new connection,
//! watched for `settle_ms` after its first batch (a receiver refusing the connection, such as
//! one wanting a client certificate, ends it then); on a connection that has outlived that,
//! looked at once, without a wait, so that the rate is not one batch per `settle_ms`.
//! Anything else fails the whole batch (`Failure::Retry`): it is sent again, on a new
//! connection (a connection is never used again after an error), with the same ids.
//! What this cannot prove, a receiver that loses what its TCP acknowledged (a hung or killed
//! rsyslogd), is said in the book (`docs/src/sinks/syslog.md`); RELP (`relp`) can.

use std::io;
use std::os::fd::AsRawFd as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types;

use super::{Attempt, CursorAfter, Event};
use crate::config::{SyslogSink as SyslogConfig, SyslogUrl, TlsFiles};

/// The default SD-ID of the structured data element every message carries (`sd_id` sets
/// another). A private SD-ID must name an IANA Private Enterprise Number after its `@`
/// (RFC 5424 6.3.2); 32473 is the number IANA reserves for documentation and examples
/// (RFC 5612): an organisation with a number of its own sets `sd_id = "decision@ITS-PEN"`.
pub const SD_ID: &str = "decision@32473";
/// The APP-NAME of every message.
pub const APP_NAME: &str = "replay-guard";
/// Syslog's "no value" (RFC 5424 NILVALUE).
const NIL: &str = "-";
/// How often the acknowledgement of a written batch is looked at, at most (it starts at
/// 1 ms and doubles up to this).
const ACK_POLL_MAX: Duration = Duration::from_millis(20);

/// Why a batch was not delivered. Each message names the receiver.
#[derive(Debug, thiserror::Error)]
pub enum SyslogError {
    #[error("connecting to {url}: {error}")]
    Connect { url: SyslogUrl, error: io::Error },
    #[error("connecting to {url}: no connection within {ms} ms")]
    ConnectTimeout { url: SyslogUrl, ms: u128 },
    /// The TLS client could not be made from `ca_file` or the client certificate.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error("{url}: not a TLS server name: {error}")]
    ServerName {
        url: SyslogUrl,
        error: pki_types::InvalidDnsNameError,
    },
    #[error("TLS handshake with {url}: {}", handshake_cause(.error))]
    TlsHandshake { url: SyslogUrl, error: io::Error },
    #[error("writing to {url}: {error}")]
    Write { url: SyslogUrl, error: io::Error },
    #[error("writing to {url}: not written within {ms} ms")]
    WriteTimeout { url: SyslogUrl, ms: u128 },
    #[error(
        "{url}: {unacked} bytes still unacknowledged by the receiver's TCP after {ms} ms \
         (a stalled or overloaded receiver)"
    )]
    Unacknowledged {
        url: SyslogUrl,
        unacked: u32,
        ms: u128,
    },
    #[error("{url}: the receiver closed the connection before the batch settled")]
    Closed { url: SyslogUrl },
    #[error(
        "{url}: the receiver ended the TLS connection before the batch settled, without a \
         close_notify (or reset it): if it asks for a client certificate, are client_cert_file and \
         client_key_file set, and issued by a CA it trusts? (its log says why)"
    )]
    TlsAborted { url: SyslogUrl },
    #[error("{url}: the connection failed before the batch settled: {error}")]
    Broken { url: SyslogUrl, error: io::Error },
    #[error("{url}: reading the socket's send queue: {error}")]
    OutQueue { url: SyslogUrl, error: io::Error },
}

/// A handshake error, said so that an operator knows which file to fix when it is the
/// receiver's certificate that was refused.
fn handshake_cause(e: &io::Error) -> String {
    use tokio_rustls::rustls::Error as E;
    match crate::tls::rustls_error(e) {
        Some(E::InvalidCertificate(c)) => format!(
            "the receiver's certificate was refused ({c:?}): is it signed by a CA in ca_file, \
             and issued for this host name?"
        ),
        Some(E::AlertReceived(a)) => format!(
            "the receiver refused the handshake (alert {a:?}): does it want a client \
             certificate (client_cert_file) it trusts?"
        ),
        Some(other) => other.to_string(),
        None => e.to_string(),
    }
}

/// What every message of this sink says of its sender.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// 0..=23.
    pub facility: u8,
    /// The structured data element's SD-ID (`NAME@PEN`, checked when the config loads).
    pub sd_id: String,
    /// 1 to 255 printable US-ASCII characters, or `-`.
    pub hostname: String,
    /// This process's id.
    pub procid: String,
}

/// The severity (RFC 5424 table 2) of a decision's outcome: warning (4) for what was
/// quarantined (`conflict`, `stale`, `malformed`); notice (5), "normal but significant", for a
/// `duplicate` and for an operator's action (`released`, `discarded`, `relay`: a person
/// changed what the record says or what a sink delivers); informational (6) for the rest
/// (`applied`, `applied_late`, and any other).
pub fn severity(outcome: &str) -> u8 {
    match outcome {
        "conflict" | "stale" | "malformed" => 4,
        "duplicate" | "released" | "discarded" | "relay" => 5,
        _ => 6,
    }
}

/// `value` as an RFC 5424 PARAM-VALUE (without its quotes): `"`, `\` and `]` escaped by `\`
/// (RFC 5424 6.3.3), and every control character, line or paragraph separator and bidi
/// control (`textsafe::is_unsafe`) written as JSON writes it (`\n`, `\u0000`, `\u2028`), so
/// that a value from the feed can neither end the line at a receiver that writes messages to
/// a file or a terminal nor forge another. A receiver keeps a `\` before any other
/// character as it stands (RFC 5424), so it shows the escape itself; the exact value is in
/// MSG, the event's JSON line.
pub fn escape_param_value(value: &str, out: &mut String) {
    for c in value.chars() {
        if matches!(c, '"' | '\\' | ']') {
            out.push('\\');
            out.push(c);
        } else if crate::textsafe::is_unsafe(c) {
            crate::textsafe::push_char(out, c, false);
        } else {
            out.push(c);
        }
    }
}

/// `s` if it is an RFC 5424 header field of at most `max` printable US-ASCII characters
/// (no space), else `-`.
fn header_field(s: &str, max: usize) -> &str {
    if s.is_empty() || s.len() > max || !s.bytes().all(|b| (33..=126).contains(&b)) {
        NIL
    } else {
        s
    }
}

/// An SD-NAME (PARAM-NAME): 1 to 32 printable US-ASCII characters but `=`, space, `]`, `"`.
fn is_sd_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.bytes()
            .all(|b| (33..=126).contains(&b) && !matches!(b, b'=' | b']' | b'"'))
}

/// The CloudEvents `time` of an event line if it is RFC 3339 UTC with milliseconds
/// (`2025-12-01T00:00:00.123Z`), a valid RFC 5424 TIMESTAMP as it stands.
pub fn event_time(json: &str) -> Option<String> {
    let doc = crate::json::parse(json.as_bytes(), crate::wire::STORED_MAX_DEPTH + 1).ok()?;
    let crate::json::Json::Object(members) = doc else {
        return None;
    };
    let time = members.into_iter().find_map(|(k, v)| match v {
        crate::json::Json::String(s) if k == "time" => Some(s),
        _ => None,
    })?;
    let b = time.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let shape = b.len() == 24
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19)
        && b[19] == b'.'
        && digits(20..23)
        && b[23] == b'Z';
    shape.then_some(time)
}

/// The RFC 5424 message of `ev` (module doc). A value the header cannot carry becomes `-`;
/// a field whose name is not an SD-NAME is left out (the event's own names always are).
pub fn message(h: &Header, ev: &Event) -> String {
    let pri = u16::from(h.facility) * 8 + u16::from(severity(&ev.outcome));
    let time = event_time(&ev.json);
    let mut out = String::with_capacity(ev.json.len() + 256);
    out.push_str(&format!(
        "<{pri}>1 {} {} {APP_NAME} {} {} [{} id=\"",
        time.as_deref().unwrap_or(NIL),
        header_field(&h.hostname, 255),
        header_field(&h.procid, 128),
        header_field(&ev.outcome, 32),
        if is_sd_name(&h.sd_id) {
            &h.sd_id
        } else {
            SD_ID
        },
    ));
    escape_param_value(&ev.id, &mut out);
    out.push('"');
    for (name, value) in &ev.fields {
        if !is_sd_name(name) {
            continue;
        }
        out.push(' ');
        out.push_str(name);
        out.push_str("=\"");
        escape_param_value(value, &mut out);
        out.push('"');
    }
    out.push_str("] ");
    // The JSON line as any JSON reader reads it, but with no DEL, C1 control or separator
    // left raw (JSON itself escapes the C0 controls).
    out.push_str(&crate::textsafe::escape_json(&ev.json));
    out
}

/// Appends `msg` framed by octet counting (RFC 6587 3.4.1): its length in octets, a space,
/// the message.
pub fn frame(msg: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(msg.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(msg.as_bytes());
}

/// The host's name as the default HOSTNAME (the kernel's node name, as `hostname` prints
/// it; `uname`, since the units' `ProcSubset=pid` hides `/proc/sys`), or `-` when it is not a
/// valid HOSTNAME.
pub fn host_name() -> String {
    let uts = rustix::system::uname();
    uts.nodename()
        .to_str()
        .ok()
        .filter(|s| crate::config::syslog_hostname_problem(s).is_none())
        .map_or_else(|| NIL.to_string(), str::to_string)
}

/// What every message of the sink of `cfg` says of its sender (the host's name read when
/// `hostname` is not set).
pub(super) fn header(cfg: &SyslogConfig) -> Header {
    Header {
        facility: cfg.facility,
        sd_id: cfg.sd_id.clone(),
        hostname: cfg.hostname.clone().unwrap_or_else(host_name),
        procid: std::process::id().to_string(),
    }
}

/// Bytes written to `socket` that its peer's TCP has not acknowledged yet, unsent ones
/// included (Linux `SIOCOUTQ`, which is `TIOCOUTQ`). The only `unsafe` of the crate.
#[allow(unsafe_code)]
fn unacked_bytes(socket: &TcpStream) -> io::Result<u32> {
    let mut n: libc::c_int = 0;
    // SAFETY: the descriptor is `socket`'s, open for as long as the borrow lasts; TIOCOUTQ
    // writes one `c_int` through its argument, which points to `n`, live and writable.
    let r = unsafe {
        libc::ioctl(
            socket.as_raw_fd(),
            libc::TIOCOUTQ,
            &mut n as *mut libc::c_int,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(u32::try_from(n).unwrap_or(0))
}

/// An open connection to the receiver (the RELP sink's too).
pub(super) enum Conn {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    fn is_tls(&self) -> bool {
        matches!(self, Conn::Tls(_))
    }

    fn socket(&self) -> &TcpStream {
        match self {
            Conn::Tcp(s) => s,
            Conn::Tls(s) => s.get_ref().0,
        }
    }

    pub(super) async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => {
                s.write_all(bytes).await?;
                s.flush().await
            }
            Conn::Tls(s) => {
                s.write_all(bytes).await?;
                s.flush().await
            }
        }
    }

    /// Reads what the receiver sent (cancel-safe): `Ok(0)` is its end.
    pub(super) async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(buf).await,
            Conn::Tls(s) => s.read(buf).await,
        }
    }

    /// Whether the receiver has already closed or reset the connection (or sent something,
    /// which a syslog receiver never does but a closing TLS layer may): one look, no wait.
    fn poll_closed(&mut self, cx: &mut std::task::Context<'_>) -> Poll<bool> {
        let mut buf = [0u8; 512];
        let mut rb = ReadBuf::new(&mut buf);
        let r = match self {
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, &mut rb),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, &mut rb),
        };
        match r {
            Poll::Pending => Poll::Ready(false),
            Poll::Ready(Ok(())) if rb.filled().is_empty() => Poll::Ready(true),
            Poll::Ready(Ok(())) => Poll::Ready(false),
            Poll::Ready(Err(_)) => Poll::Ready(true),
        }
    }

    /// Reads what the receiver sent into `buf` (a poll: cancel-safe by nature).
    pub(super) fn poll_read(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self {
            Conn::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }

    /// Writes some of `bytes`.
    pub(super) fn poll_write(
        &mut self,
        cx: &mut std::task::Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        use tokio::io::AsyncWrite as _;
        match self {
            Conn::Tcp(s) => Pin::new(s).poll_write(cx, bytes),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, bytes),
        }
    }

    /// Sends on what was written (TLS records still held).
    pub(super) fn poll_flush(&mut self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<()>> {
        use tokio::io::AsyncWrite as _;
        match self {
            Conn::Tcp(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    pub(super) async fn shutdown(&mut self) {
        let _ = match self {
            Conn::Tcp(s) => s.shutdown().await,
            Conn::Tls(s) => s.shutdown().await,
        };
    }
}

/// A connection to `url` (TCP, then the TLS handshake when `tls` is given), within `timeout`.
pub(super) async fn connect(
    url: &SyslogUrl,
    tls: Option<TlsConnector>,
    timeout: Duration,
) -> Result<Conn, SyslogError> {
    let ms = timeout.as_millis();
    let connecting = async {
        let tcp = TcpStream::connect((url.host.as_str(), url.port))
            .await
            .map_err(|error| SyslogError::Connect {
                url: url.clone(),
                error,
            })?;
        // What is written goes out whole; Nagle would only hold its tail back.
        let _ = tcp.set_nodelay(true);
        let Some(tls) = tls else {
            return Ok::<_, SyslogError>(Conn::Tcp(tcp));
        };
        let name = pki_types::ServerName::try_from(url.host.clone()).map_err(|error| {
            SyslogError::ServerName {
                url: url.clone(),
                error,
            }
        })?;
        let stream = tls
            .connect(name, tcp)
            .await
            .map_err(|error| SyslogError::TlsHandshake {
                url: url.clone(),
                error,
            })?;
        Ok(Conn::Tls(Box::new(stream)))
    };
    let conn = tokio::time::timeout(timeout, connecting)
        .await
        .map_err(|_| SyslogError::ConnectTimeout {
            url: url.clone(),
            ms,
        })??;
    tracing::debug!(url = %url, "syslog sink connected");
    Ok(conn)
}

/// The TLS client of `files` (`ca_file`, and the client certificate if configured).
pub(super) fn tls_connector(files: &TlsFiles) -> Result<TlsConnector, SyslogError> {
    let identity = match (&files.client_cert_file, &files.client_key_file) {
        (Some(c), Some(k)) => Some([
            (c.as_path(), "client_cert_file"),
            (k.as_path(), "client_key_file"),
        ]),
        _ => None,
    };
    let cfg = crate::tls::verifying_client((&files.ca_file, "ca_file"), identity)?;
    Ok(TlsConnector::from(Arc::new(cfg)))
}

pub struct SyslogSink {
    url: SyslogUrl,
    tls_files: Option<TlsFiles>,
    /// Built on the first `tls://` delivery, then reused.
    tls: Option<TlsConnector>,
    header: Header,
    timeout: Duration,
    settle: Duration,
    /// Never used again after an error.
    conn: Option<Conn>,
}

impl SyslogSink {
    /// The sink of `cfg`; no I/O but reading the host's name when `hostname` is not set.
    pub fn new(cfg: &SyslogConfig, timeout: Duration) -> SyslogSink {
        SyslogSink {
            url: cfg.url.clone(),
            tls_files: cfg.tls.clone(),
            tls: None,
            header: header(cfg),
            timeout,
            settle: cfg.settle,
            conn: None,
        }
    }

    /// Sends the whole batch and counts it delivered only once the receiver's TCP
    /// acknowledged all of it and the connection was not seen ended (for `settle` after the
    /// first batch of a new connection; module doc); otherwise nothing of it is counted, and
    /// the connection is dropped.
    pub async fn deliver(&mut self, batch: &[Event], _cursor: CursorAfter) -> Attempt {
        if batch.is_empty() {
            return Attempt::all(0);
        }
        let mut bytes = Vec::with_capacity(batch.iter().map(|e| e.json.len() + 300).sum());
        for ev in batch {
            frame(&message(&self.header, ev), &mut bytes);
        }
        match self.send(&bytes).await {
            Ok(()) => Attempt::all(batch.len()),
            Err(e) => {
                self.conn = None;
                Attempt::retry(0, e.to_string())
            }
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), SyslogError> {
        // A connection the receiver closed while it was idle (a restart) is replaced at once,
        // rather than found broken after a batch was written to it.
        if self.conn.is_some() {
            // Lets the runtime's I/O driver take in what the socket saw while the sink was idle.
            tokio::task::yield_now().await;
        }
        if let Some(c) = self.conn.as_mut()
            && std::future::poll_fn(|cx| c.poll_closed(cx)).await
        {
            tracing::debug!(url = %self.url, "syslog receiver closed the idle connection");
            self.conn = None;
        }
        // A new connection is watched for `settle_ms` after its first batch; later batches on
        // it are not held back (module doc).
        let (mut conn, fresh) = match self.conn.take() {
            Some(c) => (c, false),
            None => (self.connect().await?, true),
        };
        let url = &self.url;
        let ms = self.timeout.as_millis();
        let deadline = Instant::now() + self.timeout;
        match tokio::time::timeout_at(deadline, conn.write_all(bytes)).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                return Err(SyslogError::Write {
                    url: url.clone(),
                    error,
                });
            }
            Err(_) => {
                return Err(SyslogError::WriteTimeout {
                    url: url.clone(),
                    ms,
                });
            }
        }
        wait_acknowledged(&mut conn, url, deadline, ms).await?;
        let settle = if fresh {
            self.settle
        } else {
            // Lets the runtime's I/O driver take in what the socket saw meanwhile.
            tokio::task::yield_now().await;
            Duration::ZERO
        };
        watch_open(&mut conn, url, Instant::now() + settle).await?;
        self.conn = Some(conn);
        Ok(())
    }

    async fn connect(&mut self) -> Result<Conn, SyslogError> {
        let tls = self.tls_connector()?;
        connect(&self.url, tls, self.timeout).await
    }

    /// The TLS client for a `tls://` url, made once.
    fn tls_connector(&mut self) -> Result<Option<TlsConnector>, SyslogError> {
        let Some(files) = &self.tls_files else {
            return Ok(None);
        };
        if let Some(t) = &self.tls {
            return Ok(Some(t.clone()));
        }
        let t = tls_connector(files)?;
        self.tls = Some(t.clone());
        Ok(Some(t))
    }

    /// Closes the connection politely (TLS close_notify, then FIN).
    pub async fn close(&mut self) {
        if let Some(mut c) = self.conn.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), c.shutdown()).await;
        }
    }
}

/// Waits until the receiver's TCP has acknowledged every byte written to `conn`, or the
/// deadline; meanwhile anything readable is the connection's end.
async fn wait_acknowledged(
    conn: &mut Conn,
    url: &SyslogUrl,
    deadline: Instant,
    ms: u128,
) -> Result<(), SyslogError> {
    let mut pause = Duration::from_millis(1);
    let mut buf = [0u8; 512];
    loop {
        let unacked = unacked_bytes(conn.socket()).map_err(|error| SyslogError::OutQueue {
            url: url.clone(),
            error,
        })?;
        if unacked == 0 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(SyslogError::Unacknowledged {
                url: url.clone(),
                unacked,
                ms,
            });
        }
        let wake = (Instant::now() + pause).min(deadline);
        let tls = conn.is_tls();
        tokio::select! {
            // The connection's end first: it is what must not be missed.
            biased;
            r = conn.read(&mut buf) => ended(r, url, tls)?,
            _ = tokio::time::sleep_until(wake) => {}
        }
        pause = (pause * 2).min(ACK_POLL_MAX);
    }
}

/// Watches `conn` until `until`: it must not end (EOF, a reset, a TLS alert) meanwhile.
async fn watch_open(conn: &mut Conn, url: &SyslogUrl, until: Instant) -> Result<(), SyslogError> {
    let mut buf = [0u8; 512];
    loop {
        let tls = conn.is_tls();
        tokio::select! {
            // An end already seen is reported even with `settle_ms` 0.
            biased;
            r = conn.read(&mut buf) => ended(r, url, tls)?,
            _ = tokio::time::sleep_until(until) => return Ok(()),
        }
        // A receiver that keeps sending does not hold the batch past the settle period.
        if Instant::now() >= until {
            return Ok(());
        }
    }
}

/// What a read from the receiver means: its end (an error), or bytes a syslog receiver has no
/// reason to send, dropped (TLS records the TLS layer consumes never get here).
fn ended(r: io::Result<usize>, url: &SyslogUrl, tls: bool) -> Result<(), SyslogError> {
    match r {
        Ok(0) => Err(SyslogError::Closed { url: url.clone() }),
        Ok(n) => {
            tracing::debug!(url = %url, bytes = n, "syslog receiver sent bytes; dropped");
            Ok(())
        }
        Err(e)
            if tls
                && matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                ) =>
        {
            Err(SyslogError::TlsAborted { url: url.clone() })
        }
        Err(error) => Err(SyslogError::Broken {
            url: url.clone(),
            error,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            facility: 16,
            sd_id: SD_ID.into(),
            hostname: "eoc-1".into(),
            procid: "4242".into(),
        }
    }

    fn event(outcome: &str, json: &str) -> Event {
        Event {
            offset: 7,
            id: "ab12".into(),
            key: [0xab; 32],
            agency: "fire".into(),
            source_id: "engine-7".into(),
            topic: "incidents/fire".into(),
            json: json.into(),
            outcome: outcome.into(),
            fields: vec![
                ("key", "ab".repeat(32)),
                ("source", "fire/engine-7".into()),
                ("sequence", "3".into()),
                ("epoch", "1".into()),
                ("outcome", outcome.into()),
                ("effect_offset", "7".into()),
            ],
        }
    }

    const JSON: &str =
        r#"{"specversion":"1.0","id":"ab12","time":"2025-12-01T00:00:00.123Z","data":{"n":1}}"#;

    #[test]
    fn a_message_is_rfc5424_with_the_decision_in_structured_data() {
        let m = message(&header(), &event("applied", JSON));
        assert_eq!(
            m,
            format!(
                "<134>1 2025-12-01T00:00:00.123Z eoc-1 replay-guard 4242 applied \
                 [decision@32473 id=\"ab12\" key=\"{}\" source=\"fire/engine-7\" sequence=\"3\" \
                 epoch=\"1\" outcome=\"applied\" effect_offset=\"7\"] {JSON}",
                "ab".repeat(32)
            )
        );
    }

    #[test]
    fn pri_is_facility_times_eight_plus_the_outcomes_severity() {
        for (outcome, sev) in [
            ("applied", 6),
            ("applied_late", 6),
            ("released", 5),
            ("discarded", 5),
            ("relay", 5),
            ("duplicate", 5),
            ("unknown", 6),
            ("conflict", 4),
            ("stale", 4),
            ("malformed", 4),
        ] {
            assert_eq!(severity(outcome), sev, "{outcome}");
            for facility in [0u8, 1, 16, 23] {
                let h = Header {
                    facility,
                    ..header()
                };
                let m = message(&h, &event(outcome, JSON));
                let want = format!("<{}>1 ", u16::from(facility) * 8 + u16::from(sev));
                assert!(m.starts_with(&want), "{m}");
            }
        }
    }

    #[test]
    fn param_values_escape_quote_backslash_and_bracket_only() {
        let mut s = String::new();
        escape_param_value(r#"a"b\c]d[e=f é"#, &mut s);
        assert_eq!(s, r#"a\"b\\c\]d[e=f é"#);
        let mut ev = event("conflict", JSON);
        ev.id = "x\"]".into();
        ev.fields = vec![("reason", "digest \"differs\" [a]\\".into())];
        let m = message(&header(), &ev);
        assert!(
            m.contains(r#"[decision@32473 id="x\"\]" reason="digest \"differs\" [a\]\\"] {"#),
            "{m}"
        );
    }

    #[test]
    fn param_values_escape_control_characters_so_no_line_can_be_forged() {
        let mut s = String::new();
        escape_param_value("a\nb\r\0c\u{1b}[2J\u{85}\u{2028}\u{202e}\t\\n", &mut s);
        assert_eq!(s, r#"a\nb\r\u0000c\u001b[2J\u0085\u2028\u202e\t\\n"#);
        let mut ev = event("malformed", JSON);
        ev.fields = vec![(
            "reason",
            "bad\n<134>1 2025-12-01T00:00:00.000Z forged - - - - x".into(),
        )];
        let m = message(&header(), &ev);
        assert!(!m.chars().any(crate::textsafe::is_unsafe), "{m:?}");
        assert!(m.contains(r#"reason="bad\n<134>1 "#), "{m}");
        // MSG stays the same JSON document, its DEL, C1 and separators escaped.
        let mut ev = event("applied", "{\"a\":\"x\u{7f}\u{85}\u{2028}y\"}");
        ev.fields.clear();
        let m = message(&header(), &ev);
        assert!(m.ends_with(r#"] {"a":"x\u007f\u0085\u2028y"}"#), "{m}");
    }

    #[test]
    fn frames_count_octets_not_characters() {
        let mut out = Vec::new();
        frame("abc", &mut out);
        frame("é", &mut out);
        assert_eq!(out, "3 abc2 é".as_bytes());
        let m = message(&header(), &event("applied", JSON));
        let mut out = Vec::new();
        frame(&m, &mut out);
        let (len, rest) = std::str::from_utf8(&out).unwrap().split_once(' ').unwrap();
        assert_eq!(len.parse::<usize>().unwrap(), rest.len());
        assert_eq!(rest, m);
    }

    #[test]
    fn the_timestamp_is_the_events_time_or_nil() {
        assert_eq!(
            event_time(JSON).as_deref(),
            Some("2025-12-01T00:00:00.123Z")
        );
        for bad in [
            r#"{"time":"2025-12-01T00:00:00Z"}"#,
            r#"{"time":"2025-12-01 00:00:00.123Z"}"#,
            r#"{"time":"2025-12-01T00:00:00.123+01:00"}"#,
            r#"{"time":1}"#,
            r#"{"id":"x"}"#,
            "not json",
        ] {
            assert_eq!(event_time(bad), None, "{bad}");
            let m = message(&header(), &event("applied", bad));
            assert!(m.starts_with("<134>1 - eoc-1 "), "{m}");
        }
        // A nested `time` is not the event's.
        assert_eq!(
            event_time(r#"{"data":{"time":"2025-12-01T00:00:00.123Z"}}"#),
            None
        );
    }

    #[test]
    fn the_sd_id_is_the_configured_one() {
        let h = Header {
            sd_id: "decision@55555".into(),
            ..header()
        };
        let m = message(&h, &event("duplicate", JSON));
        assert!(m.contains(" [decision@55555 id=\""), "{m}");
        assert!(!m.contains("32473"), "{m}");
    }

    #[test]
    fn header_fields_it_cannot_carry_become_nil() {
        let h = Header {
            facility: 16,
            sd_id: SD_ID.into(),
            hostname: "a b".into(),
            procid: String::new(),
        };
        let mut ev = event(&"x".repeat(33), JSON);
        ev.fields.push(("bad name", "v".into()));
        let m = message(&h, &ev);
        assert!(
            m.starts_with("<134>1 2025-12-01T00:00:00.123Z - replay-guard - - [decision@32473 "),
            "{m}"
        );
        assert!(!m.contains("bad name"), "{m}");
    }

    #[test]
    fn the_host_name_is_a_valid_hostname_or_nil() {
        let h = host_name();
        assert!(
            h == "-" || crate::config::syslog_hostname_problem(&h).is_none(),
            "{h}"
        );
    }

    #[test]
    fn the_sd_id_names_the_documentation_enterprise_number() {
        assert!(is_sd_name(SD_ID));
        assert_eq!(SD_ID.split_once('@').map(|(_, pen)| pen), Some("32473"));
    }
}
