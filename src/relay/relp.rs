//! The `syslog` sink over RELP, the Reliable Event Logging Protocol of rsyslog's `imrelp`
//! (`relp://`, and `relp+tls://` with the same TLS client as `tls://`): each event's RFC 5424
//! message (`syslog::message`) is a `syslog` command, and it counts as delivered only when
//! the receiver's `rsp` with code 200 for that command's transaction number has arrived.
//!
//! The protocol (librelp's `doc/relp.md` and `src/relpsess.c`), sans-IO here (`Session`,
//! `Decoder`, `frame`; unit-tested): every frame is `TXNR SP COMMAND SP DATALEN [SP DATA] LF`.
//! A session opens with `1 open` offering `relp_version=0`, our `relp_software` and
//! `commands=syslog`; the receiver answers `rsp` `200 OK` and the offers it accepts, which
//! must include the `syslog` command. Each message then goes as `TXNR syslog LEN MSG`, TXNR
//! counting up from 2 and wrapping from 999,999,999 to 1; the receiver answers each with
//! `TXNR rsp 6 200 OK`, in the order it got them. Up to `relp_window` commands await their
//! `rsp` at once (librelp's default window is 128), so the rate is not one round trip per
//! message. The sink is windowed (`Sink::hand`, `acked`): the runner keeps handing events
//! over while earlier ones await their `rsp`.
//!
//! An `rsp` other than 200, an `rsp` out of order, the receiver's `serverclose` hint, the
//! connection's end, or no `rsp` within `timeout_ms` of the last progress (a hung receiver
//! whose socket still takes bytes) fails every event not yet acknowledged
//! (`Failure::Retry`): the session is dropped and they are sent again on a new one, with the
//! same ids. A receiver killed after it wrote an event but before its `rsp` left gets that
//! event twice; none is counted that it did not acknowledge.

use std::collections::VecDeque;
use std::future::Future as _;
use std::io;
use std::task::Poll;
use std::time::Duration;

use tokio::io::ReadBuf;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

use super::syslog::{self, Conn, Header, SyslogError};
use super::{Attempt, Event};
use crate::config::{SyslogSink as SyslogConfig, SyslogUrl, TlsFiles};

/// The highest transaction number; the next after it is 1 (librelp `relpEngineNextTXNR`).
pub const MAX_TXNR: u32 = 999_999_999;
/// The largest frame a receiver's answer may be: its `open` response's offers, or an
/// `rsp` with a human-readable text.
const MAX_ANSWER: usize = 64 * 1024;
/// The longest COMMAND (relp.md: 1 to 32 letters).
const MAX_COMMAND: usize = 32;

/// The transaction number after `txnr`.
pub fn next_txnr(txnr: u32) -> u32 {
    if txnr >= MAX_TXNR { 1 } else { txnr + 1 }
}

/// Appends the frame `TXNR SP COMMAND SP DATALEN [SP DATA] LF`.
pub fn frame(txnr: u32, command: &str, data: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("{txnr} {command} {}", data.len()).as_bytes());
    if !data.is_empty() {
        out.push(b' ');
        out.extend_from_slice(data);
    }
    out.push(b'\n');
}

/// The `open` command's offers.
pub fn open_offers() -> String {
    format!(
        "relp_version=0\nrelp_software=replay-guard,{}\ncommands=syslog",
        env!("CARGO_PKG_VERSION")
    )
}

/// A frame the receiver sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub txnr: u32,
    pub command: String,
    pub data: Vec<u8>,
}

/// What the receiver did that ends the session. Each message names the receiver's part;
/// the driver adds the URL.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RelpError {
    #[error("the receiver sent a frame RELP does not allow ({0})")]
    Framing(String),
    #[error("the receiver refused the RELP session: {0:?}")]
    OpenRefused(String),
    #[error(
        "the receiver does not offer the RELP syslog command (its offers: {0:?}): is it an \
         rsyslog imrelp input?"
    )]
    NoSyslogCommand(String),
    #[error(
        "the receiver answered transaction {got}, but {} (answers come in order)",
        expected.map_or("none was awaited".to_string(), |e| format!("{e} was awaited"))
    )]
    OutOfOrder { got: u32, expected: Option<u32> },
    #[error("the receiver refused message {txnr}: rsp {text:?}")]
    Refused { txnr: u32, text: String },
    #[error("the receiver closed the RELP session (serverclose)")]
    ServerClose,
    #[error("the receiver sent an unexpected {0:?} command")]
    Unexpected(String),
}

/// Splits the receiver's byte stream into frames.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

impl Decoder {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, `None` until one has arrived; an error for anything that is no
    /// frame (the session cannot go on).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, RelpError> {
        let bad = |why: &str| Err(RelpError::Framing(why.to_string()));
        let b = &self.buf;
        // TXNR SP
        let Some((txnr, i)) = number(b, 0)? else {
            return Ok(None);
        };
        let Some(&sp) = b.get(i) else {
            return Ok(None);
        };
        if sp != b' ' {
            return bad("no space after the transaction number");
        }
        // COMMAND SP
        let start = i + 1;
        let mut j = start;
        while j < b.len() && b[j].is_ascii_alphabetic() {
            j += 1;
            if j - start > MAX_COMMAND {
                return bad("a command longer than 32 letters");
            }
        }
        let Some(&sp) = b.get(j) else {
            return Ok(None);
        };
        if sp != b' ' || j == start {
            return bad("no command");
        }
        let command = String::from_utf8_lossy(&b[start..j]).into_owned();
        // DATALEN [SP DATA] LF
        let Some((len, k)) = number(b, j + 1)? else {
            return Ok(None);
        };
        let len = len as usize;
        if len > MAX_ANSWER {
            return bad("a frame over 64 KiB");
        }
        let (data, end) = if len == 0 {
            (k, k)
        } else {
            match b.get(k) {
                None => return Ok(None),
                Some(b' ') => (k + 1, k + 1 + len),
                Some(_) => return bad("no space before the data"),
            }
        };
        let Some(&lf) = b.get(end) else {
            return Ok(None);
        };
        if lf != b'\n' {
            return bad("no LF after the data");
        }
        let f = Frame {
            txnr,
            command,
            data: b[data..end].to_vec(),
        };
        self.buf.drain(..=end);
        Ok(Some(f))
    }
}

/// The decimal number (1 to 9 digits) at `b[at..]` and the index after it; `None` while it
/// may go on.
fn number(b: &[u8], at: usize) -> Result<Option<(u32, usize)>, RelpError> {
    let mut i = at;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
        if i - at > 9 {
            return Err(RelpError::Framing("a number over 9 digits".into()));
        }
    }
    if i == b.len() {
        return Ok(None);
    }
    if i == at {
        return Err(RelpError::Framing("no number".into()));
    }
    let n = b[at..i]
        .iter()
        .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
    Ok(Some((n, i)))
}

/// An `rsp`'s code and text (`200 OK`, `500 ...`), and the offers after its first line.
fn rsp_parts(data: &[u8]) -> (Option<u16>, String, &[u8]) {
    let (line, rest) = match data.iter().position(|&c| c == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &data[data.len()..]),
    };
    let text = crate::textsafe::printable_prefix(line, 200).0;
    let code = line
        .get(..3)
        .filter(|d| d.iter().all(u8::is_ascii_digit))
        .and_then(|d| std::str::from_utf8(d).ok()?.parse().ok());
    (code, text, rest)
}

/// What a frame from the receiver meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// The session is open: `syslog` commands may go.
    Opened,
    /// The oldest command awaiting its answer was acknowledged.
    Acked,
    /// A hint without meaning here.
    Nothing,
}

/// One RELP session's rules, sans-IO: the transaction numbers, the window, and what each
/// answer means.
#[derive(Debug)]
pub struct Session {
    open: bool,
    next: u32,
    window: usize,
    /// Transaction numbers of the `syslog` commands awaiting their `rsp`, oldest first.
    in_flight: VecDeque<u32>,
}

impl Session {
    /// A session that has sent its `open` command (appended to `out`), with room for
    /// `window` commands in flight.
    pub fn new(window: usize, out: &mut Vec<u8>) -> Session {
        frame(1, "open", open_offers().as_bytes(), out);
        Session {
            open: false,
            next: next_txnr(1),
            window: window.max(1),
            in_flight: VecDeque::new(),
        }
    }

    /// Whether another `syslog` command may go now.
    pub fn may_send(&self) -> bool {
        self.open && self.in_flight.len() < self.window
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Appends `msg` as the next `syslog` command (only when `may_send`).
    pub fn send(&mut self, msg: &[u8], out: &mut Vec<u8>) {
        let txnr = self.next;
        frame(txnr, "syslog", msg, out);
        self.in_flight.push_back(txnr);
        self.next = next_txnr(txnr);
    }

    /// What `f`, the receiver's next frame, means; an error ends the session.
    pub fn on_frame(&mut self, f: &Frame) -> Result<Received, RelpError> {
        if f.txnr == 0 {
            // Hints: only `serverclose` is defined.
            return if f.command == "serverclose" {
                Err(RelpError::ServerClose)
            } else {
                Ok(Received::Nothing)
            };
        }
        if f.command != "rsp" {
            return Err(RelpError::Unexpected(f.command.clone()));
        }
        let (code, text, offers) = rsp_parts(&f.data);
        if !self.open {
            if f.txnr != 1 {
                return Err(RelpError::OutOfOrder {
                    got: f.txnr,
                    expected: Some(1),
                });
            }
            if code != Some(200) {
                return Err(RelpError::OpenRefused(text));
            }
            let syslog = offers.split(|&c| c == b'\n').any(|o| {
                o.strip_prefix(b"commands=")
                    .is_some_and(|v| v.split(|&c| c == b',').any(|c| c == b"syslog"))
            });
            if !syslog {
                return Err(RelpError::NoSyslogCommand(
                    crate::textsafe::printable_prefix(offers, 200).0,
                ));
            }
            self.open = true;
            return Ok(Received::Opened);
        }
        let expected = self.in_flight.front().copied();
        if expected != Some(f.txnr) {
            return Err(RelpError::OutOfOrder {
                got: f.txnr,
                expected,
            });
        }
        if code != Some(200) {
            return Err(RelpError::Refused { txnr: f.txnr, text });
        }
        self.in_flight.pop_front();
        Ok(Received::Acked)
    }
}

/// Why events handed to the RELP sink were not delivered. Each message names the receiver.
#[derive(Debug, thiserror::Error)]
pub enum RelpSinkError {
    /// Connecting (TCP, TLS) failed, as for `tcp://` and `tls://`.
    #[error(transparent)]
    Connect(#[from] SyslogError),
    #[error("{url}: {error}")]
    Protocol { url: SyslogUrl, error: RelpError },
    #[error("{url}: the receiver closed the connection with {unacked} messages unacknowledged")]
    Closed { url: SyslogUrl, unacked: usize },
    #[error("{url}: the connection failed: {error}")]
    Broken { url: SyslogUrl, error: io::Error },
    #[error(
        "{url}: no RELP answer within {ms} ms ({unacked} messages unacknowledged): a hung or \
         overloaded receiver"
    )]
    Timeout {
        url: SyslogUrl,
        ms: u128,
        unacked: usize,
    },
    #[error(
        "{url}: no RELP answer within {ms} ms to the session's open: a hung receiver, or no \
         RELP server (rsyslog's imrelp) on this port"
    )]
    OpenTimeout { url: SyslogUrl, ms: u128 },
}

/// A session with its connection and what is on its way.
struct Live {
    conn: Conn,
    session: Session,
    /// Frames not yet written, from `written` on.
    out: Vec<u8>,
    written: usize,
    /// Everything written has been flushed (TLS records sent on).
    flushed: bool,
    decoder: Decoder,
    /// What a read takes in at a time.
    rbuf: Box<[u8]>,
    /// How many events at the front of the queue went out as commands in this session.
    sent: usize,
    /// When the session last made progress (opened, an answer, the first command after none
    /// was in flight): no progress for `timeout_ms` ends it.
    progress: Instant,
}

/// What one look at the connection found.
enum Seen {
    Read(usize),
    Wrote,
    Flushed,
    Timeout,
}

pub struct RelpSink {
    url: SyslogUrl,
    tls_files: Option<TlsFiles>,
    /// Built on the first `relp+tls://` connection, then reused.
    tls: Option<TlsConnector>,
    header: Header,
    timeout: Duration,
    window: usize,
    /// The messages of the events handed over and not yet reported, oldest first.
    queue: VecDeque<Vec<u8>>,
    /// Never used again after an error.
    live: Option<Live>,
}

impl RelpSink {
    /// The sink of `cfg` (a `relp://` or `relp+tls://` url); no I/O but reading the host's
    /// name when `hostname` is not set.
    pub fn new(cfg: &SyslogConfig, timeout: Duration) -> RelpSink {
        RelpSink {
            url: cfg.url.clone(),
            tls_files: cfg.tls.clone(),
            tls: None,
            header: syslog::header(cfg),
            timeout,
            window: cfg.relp_window,
            queue: VecDeque::new(),
            live: None,
        }
    }

    /// Hands `events` over, to be sent after those handed over before.
    pub fn hand(&mut self, events: &[Event]) {
        for ev in events {
            self.queue
                .push_back(syslog::message(&self.header, ev).into_bytes());
        }
    }

    /// Waits until more of what was handed over is acknowledged from the front (`rsp 200`),
    /// or a failure, after which nothing handed over is pending and the session is gone.
    /// Cancel-safe: what was written and read is kept in `live`.
    pub async fn acked(&mut self) -> Attempt {
        if self.queue.is_empty() {
            return Attempt::all(0);
        }
        let (acked, error) = self.progress().await;
        self.queue.drain(..acked);
        if let Some(live) = &mut self.live {
            live.sent -= acked;
        }
        match error {
            None => Attempt::all(acked),
            Some(e) => {
                tracing::debug!(url = %self.url, error = %e, "RELP session ended");
                self.live = None;
                self.queue.clear();
                Attempt::retry(acked, e.to_string())
            }
        }
    }

    /// Forgets everything handed over: a session with commands still unanswered is dropped,
    /// or their answers would be credited to what is handed over next.
    pub fn forget(&mut self) {
        self.queue.clear();
        if self
            .live
            .as_ref()
            .is_some_and(|l| l.session.in_flight() > 0 || l.written < l.out.len())
        {
            self.live = None;
        }
    }

    /// Closes the session politely: `close`, its answer awaited briefly, then TLS
    /// close_notify and FIN.
    pub async fn close(&mut self) {
        let Some(mut live) = self.live.take() else {
            return;
        };
        let polite = async {
            if live.session.open && live.session.in_flight() == 0 && live.written == live.out.len()
            {
                let mut bye = Vec::new();
                frame(live.session.next, "close", b"", &mut bye);
                if live.conn.write_all(&bye).await.is_ok() {
                    let mut buf = [0u8; 512];
                    // Its `rsp`, then (rsyslog) `serverclose` and the end: whatever comes.
                    while matches!(live.conn.read(&mut buf).await, Ok(n) if n > 0) {}
                }
            }
            live.conn.shutdown().await;
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), polite).await;
    }

    /// Sends what the window allows and reads answers until at least one event is
    /// acknowledged, or an error; how many were, and the error.
    async fn progress(&mut self) -> (usize, Option<RelpSinkError>) {
        if self.live.is_none() {
            match self.open().await {
                Ok(l) => self.live = Some(l),
                Err(e) => return (0, Some(e)),
            }
        }
        let url = &self.url;
        let timeout = self.timeout;
        let Some(live) = self.live.as_mut() else {
            return (0, None);
        };
        let mut acked = 0;
        loop {
            while live.sent < self.queue.len() && live.session.may_send() {
                if live.session.in_flight() == 0 {
                    live.progress = Instant::now();
                }
                live.session.send(&self.queue[live.sent], &mut live.out);
                live.flushed = false;
                live.sent += 1;
            }
            let sleep = tokio::time::sleep_until(live.progress + timeout);
            tokio::pin!(sleep);
            let seen = std::future::poll_fn(|cx| {
                // Answers first: each frees room in the window.
                let mut rb = ReadBuf::new(&mut live.rbuf);
                match live.conn.poll_read(cx, &mut rb) {
                    Poll::Ready(Ok(())) => return Poll::Ready(Ok(Seen::Read(rb.filled().len()))),
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
                if live.written < live.out.len() {
                    match live.conn.poll_write(cx, &live.out[live.written..]) {
                        Poll::Ready(Ok(n)) => {
                            live.written += n;
                            if live.written == live.out.len() {
                                live.out.clear();
                                live.written = 0;
                            }
                            return Poll::Ready(Ok(Seen::Wrote));
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => {}
                    }
                } else if !live.flushed {
                    match live.conn.poll_flush(cx) {
                        Poll::Ready(Ok(())) => {
                            live.flushed = true;
                            return Poll::Ready(Ok(Seen::Flushed));
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => {}
                    }
                }
                sleep.as_mut().poll(cx).map(|()| Ok(Seen::Timeout))
            })
            .await;
            let unacked = live.session.in_flight();
            match seen {
                Ok(Seen::Wrote | Seen::Flushed) => {}
                Ok(Seen::Timeout) => {
                    let (url, ms) = (url.clone(), timeout.as_millis());
                    let e = if live.session.open {
                        RelpSinkError::Timeout { url, ms, unacked }
                    } else {
                        RelpSinkError::OpenTimeout { url, ms }
                    };
                    return (acked, Some(e));
                }
                Ok(Seen::Read(0)) => {
                    return (
                        acked,
                        Some(RelpSinkError::Closed {
                            url: url.clone(),
                            unacked,
                        }),
                    );
                }
                Ok(Seen::Read(n)) => {
                    live.decoder.push(&live.rbuf[..n]);
                    loop {
                        let step = live
                            .decoder
                            .next_frame()
                            .and_then(|f| f.map(|f| live.session.on_frame(&f)).transpose());
                        match step {
                            Ok(None) => break,
                            Ok(Some(Received::Acked)) => {
                                acked += 1;
                                live.progress = Instant::now();
                            }
                            Ok(Some(Received::Opened)) => live.progress = Instant::now(),
                            Ok(Some(Received::Nothing)) => {}
                            Err(error) => {
                                let e = RelpSinkError::Protocol {
                                    url: url.clone(),
                                    error,
                                };
                                return (acked, Some(e));
                            }
                        }
                    }
                    if acked > 0 {
                        return (acked, None);
                    }
                }
                Err(error) => {
                    return (
                        acked,
                        Some(RelpSinkError::Broken {
                            url: url.clone(),
                            error,
                        }),
                    );
                }
            }
        }
    }

    /// A new connection with its `open` command queued (its answer is read with the rest).
    async fn open(&mut self) -> Result<Live, RelpSinkError> {
        let tls = match (&self.tls_files, &self.tls) {
            (None, _) => None,
            (Some(_), Some(t)) => Some(t.clone()),
            (Some(files), None) => {
                let t = syslog::tls_connector(files)?;
                self.tls = Some(t.clone());
                Some(t)
            }
        };
        let conn = syslog::connect(&self.url, tls, self.timeout).await?;
        let mut out = Vec::new();
        let session = Session::new(self.window, &mut out);
        Ok(Live {
            conn,
            session,
            out,
            written: 0,
            flushed: false,
            decoder: Decoder::default(),
            rbuf: vec![0u8; 64 * 1024].into_boxed_slice(),
            sent: 0,
            progress: Instant::now(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(bytes: &[u8]) -> Vec<Frame> {
        let mut d = Decoder::default();
        d.push(bytes);
        let mut out = Vec::new();
        while let Some(f) = d.next_frame().unwrap() {
            out.push(f);
        }
        out
    }

    fn rsp(txnr: u32, text: &str) -> Frame {
        Frame {
            txnr,
            command: "rsp".into(),
            data: text.as_bytes().to_vec(),
        }
    }

    #[test]
    fn frames_are_txnr_command_datalen_data_and_lf() {
        let mut out = Vec::new();
        frame(7, "syslog", b"<134>1 - h a - - - x", &mut out);
        frame(8, "close", b"", &mut out);
        assert_eq!(out, b"7 syslog 20 <134>1 - h a - - - x\n8 close 0\n");
        // What librelp's server sends: the open answer, acknowledgements, the hint.
        let got = frames(
            b"1 rsp 93 200 OK\nrelp_version=0\nrelp_software=librelp,1.11.0,http://librelp.adiscon.com\ncommands=syslog\n\
              2 rsp 6 200 OK\n0 serverclose 0\n",
        );
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].txnr, got[0].command.as_str()), (1, "rsp"));
        assert!(got[0].data.starts_with(b"200 OK\nrelp_version=0\n"));
        assert_eq!(got[1], rsp(2, "200 OK"));
        assert_eq!(
            (got[2].txnr, got[2].command.as_str(), got[2].data.len()),
            (0, "serverclose", 0)
        );
    }

    #[test]
    fn a_frame_split_anywhere_decodes_the_same() {
        let whole = b"12 rsp 6 200 OK\n13 rsp 13 500 not today\n";
        for cut in 0..whole.len() {
            let mut d = Decoder::default();
            d.push(&whole[..cut]);
            let mut got = Vec::new();
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
            d.push(&whole[cut..]);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
            assert_eq!(got, [rsp(12, "200 OK"), rsp(13, "500 not today")], "{cut}");
        }
    }

    #[test]
    fn what_is_no_frame_ends_the_session() {
        for bad in [
            &b"x rsp 6 200 OK\n"[..],
            b"1rsp 6 200 OK\n",
            b"1 rsp 6 200 OKK\n",
            b"1 rsp 6x200 OK\n",
            b"1234567890 rsp 0\n",
            b"1  rsp 0\n",
            b"1 r2 0\n",
            b"1 rsp 99999999 ",
        ] {
            let mut d = Decoder::default();
            d.push(bad);
            assert!(
                matches!(d.next_frame(), Err(RelpError::Framing(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn transaction_numbers_wrap_from_999999999_to_1() {
        assert_eq!(next_txnr(1), 2);
        assert_eq!(next_txnr(MAX_TXNR - 1), MAX_TXNR);
        assert_eq!(next_txnr(MAX_TXNR), 1);
        let mut out = Vec::new();
        let mut s = Session::new(4, &mut out);
        s.on_frame(&rsp(1, "200 OK\ncommands=syslog")).unwrap();
        s.next = MAX_TXNR;
        out.clear();
        s.send(b"a", &mut out);
        s.send(b"b", &mut out);
        assert_eq!(out, b"999999999 syslog 1 a\n1 syslog 1 b\n");
        assert_eq!(s.on_frame(&rsp(MAX_TXNR, "200 OK")), Ok(Received::Acked));
        assert_eq!(s.on_frame(&rsp(1, "200 OK")), Ok(Received::Acked));
    }

    #[test]
    fn a_session_opens_only_on_200_with_the_syslog_command_offered() {
        let mut out = Vec::new();
        let mut s = Session::new(2, &mut out);
        let open = String::from_utf8(out).unwrap();
        let data = open_offers();
        assert_eq!(open, format!("1 open {} {data}\n", data.len()));
        assert!(data.starts_with("relp_version=0\nrelp_software=replay-guard,"));
        assert!(data.ends_with("\ncommands=syslog"));
        assert!(!s.may_send(), "nothing before the open answer");
        assert_eq!(
            s.on_frame(&rsp(1, "200 OK\nrelp_version=0\ncommands=syslog\n")),
            Ok(Received::Opened)
        );
        assert!(s.may_send());

        for (answer, want) in [
            ("500 error 3 on connect", "refused the RELP session"),
            ("200 OK\nrelp_version=0\ncommands=", "does not offer"),
            ("200 OK\nrelp_version=0", "does not offer"),
        ] {
            let mut s = Session::new(2, &mut Vec::new());
            let e = s.on_frame(&rsp(1, answer)).unwrap_err();
            assert!(e.to_string().contains(want), "{answer}: {e}");
        }
    }

    #[test]
    fn the_window_holds_at_most_its_size_and_answers_come_in_order() {
        let mut out = Vec::new();
        let mut s = Session::new(2, &mut out);
        s.on_frame(&rsp(1, "200 OK\ncommands=syslog")).unwrap();
        s.send(b"a", &mut out);
        assert!(s.may_send());
        s.send(b"b", &mut out);
        assert!(!s.may_send(), "two in flight fill a window of 2");
        assert_eq!(s.on_frame(&rsp(2, "200 OK")), Ok(Received::Acked));
        assert!(s.may_send());
        // Transaction 4 was never sent; 3 is the one awaited.
        assert_eq!(
            s.on_frame(&rsp(4, "200 OK")),
            Err(RelpError::OutOfOrder {
                got: 4,
                expected: Some(3)
            })
        );
    }

    #[test]
    fn only_rsp_200_acknowledges_and_serverclose_ends_the_session() {
        let mut s = Session::new(8, &mut Vec::new());
        s.on_frame(&rsp(1, "200 OK\ncommands=syslog")).unwrap();
        let mut out = Vec::new();
        s.send(b"a", &mut out);
        s.send(b"b", &mut out);
        assert_eq!(
            s.on_frame(&rsp(2, "500 command disabled")),
            Err(RelpError::Refused {
                txnr: 2,
                text: "500 command disabled".into()
            })
        );
        let mut s = Session::new(8, &mut Vec::new());
        s.on_frame(&rsp(1, "200 OK\ncommands=syslog")).unwrap();
        s.send(b"a", &mut out);
        let hint = |c: &str| Frame {
            txnr: 0,
            command: c.into(),
            data: Vec::new(),
        };
        assert_eq!(s.on_frame(&hint("other")), Ok(Received::Nothing));
        assert_eq!(
            s.on_frame(&hint("serverclose")),
            Err(RelpError::ServerClose)
        );
        let cmd = Frame {
            txnr: 5,
            command: "syslog".into(),
            data: b"x".to_vec(),
        };
        assert!(matches!(s.on_frame(&cmd), Err(RelpError::Unexpected(_))));
    }
}
