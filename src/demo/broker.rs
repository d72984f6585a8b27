//! A small in-process MQTT 3.1.1 broker for `demo`: QoS 0/1 publish, subscriptions with `+`/`#`,
//! persistent sessions (clean session = 0) with queued and in-flight messages, PINGREQ. It can
//! hold deliveries, snapshot its session state the way Mosquitto's autosave does, and fail
//! abruptly (every connection dropped, the port closed). A standby started from a snapshot
//! holds the sessions as they were then, so it re-delivers what was unacknowledged *at the
//! snapshot*, including messages the consumers acknowledged since: the failover replay.
//!
//! Not a production broker: no retained messages, wills, QoS 2, auth or limits.

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// In-flight PUBLISHes per session before the broker waits for PUBACKs.
const MAX_INFLIGHT: usize = 100;
/// Largest packet accepted.
const MAX_PACKET: usize = 1 << 20;

#[derive(Clone, Debug)]
struct Msg {
    topic: String,
    payload: Vec<u8>,
}

/// One client's persistent state.
#[derive(Clone, Debug, Default)]
struct Session {
    filters: Vec<String>,
    /// Sent, not yet acknowledged: (packet id, message), oldest first.
    inflight: VecDeque<(u16, Msg)>,
    queue: VecDeque<Msg>,
    next_pid: u16,
    /// Writer of the live connection, and its number (a reconnect replaces it).
    conn: Option<(u64, mpsc::UnboundedSender<Vec<u8>>)>,
}

/// Session state as a standby restores it: subscriptions and every unacknowledged message.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    sessions: HashMap<String, (Vec<String>, Vec<Msg>)>,
}

impl Snapshot {
    /// Unacknowledged messages held for `client`.
    pub fn pending(&self, client: &str) -> usize {
        self.sessions.get(client).map_or(0, |s| s.1.len())
    }
}

#[derive(Default)]
struct State {
    sessions: HashMap<String, Session>,
    held: bool,
    next_conn: u64,
    /// Failed: accepts nothing and serves nothing any more (task aborts are asynchronous).
    killed: bool,
}

/// A running broker.
pub struct Broker {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Broker {
    /// Starts a broker on `listener` (bound by the caller), seeded with `snapshot`'s sessions.
    pub fn start(
        rt: &tokio::runtime::Handle,
        listener: StdListener,
        snapshot: Option<&Snapshot>,
    ) -> std::io::Result<Broker> {
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let mut st = State::default();
        if let Some(s) = snapshot {
            for (client, (filters, msgs)) in &s.sessions {
                st.sessions.insert(
                    client.clone(),
                    Session {
                        filters: filters.clone(),
                        queue: msgs.iter().cloned().collect(),
                        next_pid: 1,
                        ..Session::default()
                    },
                );
            }
        }
        let state = Arc::new(Mutex::new(st));
        let tasks = Arc::new(Mutex::new(Vec::new()));
        let _guard = rt.enter();
        let listener = TcpListener::from_std(listener)?;
        let (s, t) = (state.clone(), tasks.clone());
        let accept = rt.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                if lock(&s).killed {
                    break;
                }
                let _ = stream.set_nodelay(true);
                let task = tokio::spawn(connection(stream, s.clone()));
                t.lock().unwrap_or_else(PoisonError::into_inner).push(task);
            }
        });
        tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(accept);
        Ok(Broker { addr, state, tasks })
    }

    /// Stops forwarding to subscribers (publishes are still accepted and queued).
    pub fn hold(&self) {
        lock(&self.state).held = true;
    }

    /// Resumes forwarding.
    pub fn release(&self) {
        let mut st = lock(&self.state);
        st.held = false;
        for s in st.sessions.values_mut() {
            pump(s);
        }
    }

    /// The session state now, as an autosave would write it.
    pub fn snapshot(&self) -> Snapshot {
        let st = lock(&self.state);
        Snapshot {
            sessions: st
                .sessions
                .iter()
                .map(|(c, s)| {
                    let msgs = s
                        .inflight
                        .iter()
                        .map(|(_, m)| m.clone())
                        .chain(s.queue.iter().cloned())
                        .collect();
                    (c.clone(), (s.filters.clone(), msgs))
                })
                .collect(),
        }
    }

    /// Unacknowledged messages held for `client` (in flight or queued).
    pub fn pending(&self, client: &str) -> usize {
        lock(&self.state)
            .sessions
            .get(client)
            .map_or(0, |s| s.inflight.len() + s.queue.len())
    }

    /// Whether `client` is connected and subscribed to something.
    pub fn subscribed(&self, client: &str) -> bool {
        lock(&self.state)
            .sessions
            .get(client)
            .is_some_and(|s| s.conn.is_some() && !s.filters.is_empty())
    }

    /// Fails at once: the port closes and every connection drops without a DISCONNECT.
    pub fn kill(&self) {
        lock(&self.state).killed = true;
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            t.abort();
        }
        for s in lock(&self.state).sessions.values_mut() {
            s.conn = None;
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sends what the session may have in flight, unless held.
fn pump(s: &mut Session) {
    let Some((_, tx)) = &s.conn else { return };
    let tx = tx.clone();
    while s.inflight.len() < MAX_INFLIGHT {
        let Some(m) = s.queue.pop_front() else { break };
        let pid = s.next_pid.max(1);
        s.next_pid = pid.wrapping_add(1).max(1);
        let _ = tx.send(publish_packet(&m, pid, false));
        s.inflight.push_back((pid, m));
    }
}

fn pump_unless_held(st: &mut State, client: &str) {
    if !st.held
        && let Some(s) = st.sessions.get_mut(client)
    {
        pump(s);
    }
}

async fn connection(stream: TcpStream, state: Arc<Mutex<State>>) {
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let writer = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if wr.write_all(&frame).await.is_err() {
                break;
            }
        }
    });
    let mut client: Option<(String, u64)> = None;
    let mut clean_session = false;
    while let Ok(Some((header, body))) = read_packet(&mut rd).await {
        if lock(&state).killed {
            break;
        }
        // A malformed CONNECT, PUBLISH or SUBSCRIBE ends the connection.
        let Some(packet) = decode_packet(header, &body) else {
            break;
        };
        match packet {
            Packet::Connect {
                client_id: id,
                clean,
            } => {
                let mut st = lock(&state);
                st.next_conn += 1;
                let conn = st.next_conn;
                if clean {
                    st.sessions.remove(&id);
                }
                clean_session = clean;
                let present = st.sessions.contains_key(&id);
                let s = st.sessions.entry(id.clone()).or_default();
                s.conn = Some((conn, tx.clone()));
                let _ = tx.send(vec![0x20, 2, u8::from(present), 0]);
                // A resumed session: what was in flight goes again (DUP), then the queue.
                for (pid, m) in &s.inflight {
                    let _ = tx.send(publish_packet(m, *pid, true));
                }
                pump_unless_held(&mut st, &id);
                client = Some((id, conn));
            }
            Packet::Publish {
                topic,
                pid,
                payload,
            } => {
                let mut st = lock(&state);
                let msg = Msg { topic, payload };
                let targets: Vec<String> = st
                    .sessions
                    .iter()
                    .filter(|(_, s)| s.filters.iter().any(|f| matches(f, &msg.topic)))
                    .map(|(c, _)| c.clone())
                    .collect();
                for c in targets {
                    if let Some(s) = st.sessions.get_mut(&c) {
                        s.queue.push_back(msg.clone());
                    }
                    pump_unless_held(&mut st, &c);
                }
                if let Some(pid) = pid {
                    let _ = tx.send(puback(pid));
                }
            }
            Packet::Puback(pid) => {
                let (Some((id, _)), Some(pid)) = (&client, pid) else {
                    continue;
                };
                let mut st = lock(&state);
                if let Some(s) = st.sessions.get_mut(id) {
                    s.inflight.retain(|(p, _)| *p != pid);
                }
                pump_unless_held(&mut st, id);
            }
            Packet::Subscribe { pid, filters } => {
                if let Some((id, _)) = &client {
                    let mut st = lock(&state);
                    if let Some(s) = st.sessions.get_mut(id) {
                        for f in &filters {
                            if !s.filters.contains(f) {
                                s.filters.push(f.clone());
                            }
                        }
                    }
                }
                let _ = tx.send(suback(pid, filters.len()));
            }
            Packet::Pingreq => {
                let _ = tx.send(PINGRESP.to_vec());
            }
            Packet::Disconnect => break,
            Packet::Other(_) => {}
        }
    }
    if let Some((id, conn)) = client {
        let mut st = lock(&state);
        if let Some(s) = st.sessions.get_mut(&id)
            && s.conn.as_ref().is_some_and(|(c, _)| *c == conn)
        {
            s.conn = None;
            // A clean session lasts as long as its connection (MQTT-3.1.2-6).
            if clean_session {
                st.sessions.remove(&id);
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// MQTT topic filter matching with `+` and `#`.
fn matches(filter: &str, topic: &str) -> bool {
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

async fn read_packet(
    rd: &mut tokio::net::tcp::OwnedReadHalf,
) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut first = [0u8; 1];
    if rd.read(&mut first).await? == 0 {
        return Ok(None);
    }
    let mut length = Vec::with_capacity(4);
    let len = loop {
        let mut b = [0u8; 1];
        rd.read_exact(&mut b).await?;
        length.push(b[0]);
        match remaining_length(&length) {
            Ok(Some(len)) => break len,
            Ok(None) => {}
            // Malformed or too large: drop the connection.
            Err(_) => return Ok(None),
        }
    };
    let mut body = vec![0u8; len];
    rd.read_exact(&mut body).await?;
    Ok(Some((first[0], body)))
}

/// Why a fixed header is refused.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// A fifth length byte: MQTT's remaining length has at most four.
    LengthTooLong,
    /// Larger than `MAX_PACKET`, refused before anything is allocated for it.
    TooLarge(usize),
}

/// The remaining length from the length bytes read so far: `Ok(None)` while the last byte
/// has its continuation bit set. At most four bytes and `MAX_PACKET`, so a reader never
/// allocates more than `MAX_PACKET` for one packet whatever the peer sends.
fn remaining_length(bytes: &[u8]) -> Result<Option<usize>, FrameError> {
    let mut len = 0usize;
    for (i, b) in bytes.iter().enumerate() {
        if i == 4 {
            return Err(FrameError::LengthTooLong);
        }
        len |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return if len > MAX_PACKET {
                Err(FrameError::TooLarge(len))
            } else {
                Ok(Some(len))
            };
        }
    }
    if bytes.len() >= 4 {
        return Err(FrameError::LengthTooLong);
    }
    Ok(None)
}

/// One frame: its first byte, its body, and how many bytes of the buffer it used.
#[doc(hidden)]
pub type Frame<'a> = (u8, &'a [u8], usize);

/// Splits one frame off the front of `buf` with the same rules as the socket reader:
/// `Ok(None)` if `buf` holds no complete frame yet, else (first byte, body, bytes used).
#[doc(hidden)]
pub fn split_frame(buf: &[u8]) -> Result<Option<Frame<'_>>, FrameError> {
    let Some((&first, rest)) = buf.split_first() else {
        return Ok(None);
    };
    for n in 1..=rest.len().min(4) {
        if let Some(len) = remaining_length(&rest[..n])? {
            return Ok(rest.get(n..n + len).map(|body| (first, body, 1 + n + len)));
        }
    }
    // Four continuation bytes and no end: `remaining_length` already refused it above.
    Ok(None)
}

/// A packet the broker acts on, decoded from one frame's first byte and body.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Connect {
        client_id: String,
        clean: bool,
    },
    Publish {
        topic: String,
        pid: Option<u16>,
        payload: Vec<u8>,
    },
    /// A PUBACK too short to hold a packet id is ignored, not fatal.
    Puback(Option<u16>),
    Subscribe {
        pid: u16,
        filters: Vec<String>,
    },
    Pingreq,
    Disconnect,
    /// Any other packet type, ignored.
    Other(u8),
}

/// Decodes one packet; `None` for a malformed CONNECT, PUBLISH or SUBSCRIBE (the connection
/// is dropped).
#[doc(hidden)]
pub fn decode_packet(header: u8, body: &[u8]) -> Option<Packet> {
    Some(match header >> 4 {
        1 => {
            let (client_id, clean) = parse_connect(body)?;
            Packet::Connect { client_id, clean }
        }
        3 => {
            let (topic, pid, payload) = parse_publish(body, (header >> 1) & 3)?;
            Packet::Publish {
                topic,
                pid,
                payload,
            }
        }
        4 => Packet::Puback(be16(body, 0)),
        8 => {
            let (pid, filters) = parse_subscribe(body)?;
            Packet::Subscribe { pid, filters }
        }
        12 => Packet::Pingreq,
        14 => Packet::Disconnect,
        other => Packet::Other(other),
    })
}

const PINGRESP: [u8; 2] = [0xd0, 0];

fn puback(pid: u16) -> Vec<u8> {
    frame(0x40, &pid.to_be_bytes())
}

/// One return code (QoS 1) per filter. The remaining length is a varint: a SUBSCRIBE with
/// more than 253 filters needs two length bytes.
fn suback(pid: u16, filters: usize) -> Vec<u8> {
    let mut body = pid.to_be_bytes().to_vec();
    body.extend(std::iter::repeat_n(1u8, filters));
    frame(0x90, &body)
}

/// A frame: first byte, remaining length as a varint, body.
fn frame(first: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 5);
    out.push(first);
    let mut len = body.len();
    loop {
        let mut byte = (len % 128) as u8;
        len /= 128;
        if len > 0 {
            byte |= 0x80;
        }
        out.push(byte);
        if len == 0 {
            break;
        }
    }
    out.extend_from_slice(body);
    out
}

/// The fuzz check of the codec (`fuzz/` target `broker_codec` and its regression inputs):
/// arbitrary bytes split into frames and decode into packets or refusals without panicking,
/// and every reply the broker would send for a packet is a frame that decodes back.
#[doc(hidden)]
pub fn check_codec(bytes: &[u8]) {
    let mut rest = bytes;
    while let Ok(Some((header, body, used))) = split_frame(rest) {
        rest = &rest[used..];
        let Some(packet) = decode_packet(header, body) else {
            continue;
        };
        let replies = match &packet {
            Packet::Connect { .. } => vec![vec![0x20, 2, 0, 0]],
            Packet::Publish {
                topic,
                pid,
                payload,
            } => {
                let m = Msg {
                    topic: topic.clone(),
                    payload: payload.clone(),
                };
                let forward = publish_packet(&m, pid.unwrap_or(1), true);
                let (h, b, n) = split_frame(&forward)
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| panic!("forwarded PUBLISH is not a frame: {packet:?}"));
                assert_eq!(n, forward.len(), "forwarded PUBLISH has a wrong length");
                assert_eq!(
                    decode_packet(h, b),
                    Some(Packet::Publish {
                        topic: topic.clone(),
                        pid: Some(pid.unwrap_or(1)),
                        payload: payload.clone(),
                    }),
                    "forwarded PUBLISH does not decode to what was published"
                );
                pid.map(puback).into_iter().collect()
            }
            Packet::Subscribe { pid, filters } => vec![suback(*pid, filters.len())],
            Packet::Pingreq => vec![PINGRESP.to_vec()],
            Packet::Puback(_) | Packet::Disconnect | Packet::Other(_) => Vec::new(),
        };
        for reply in replies {
            let parsed = split_frame(&reply);
            assert!(
                matches!(parsed, Ok(Some((_, _, n))) if n == reply.len()),
                "reply {reply:?} to {packet:?} is not one well-formed frame: {parsed:?}"
            );
        }
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn string(b: &[u8], at: usize) -> Option<(String, usize)> {
    let len = usize::from(be16(b, at)?);
    let s = b.get(at + 2..at + 2 + len)?;
    Some((String::from_utf8(s.to_vec()).ok()?, at + 2 + len))
}

/// (client id, clean session) of a CONNECT.
fn parse_connect(b: &[u8]) -> Option<(String, bool)> {
    let (_, at) = string(b, 0)?; // protocol name
    let flags = *b.get(at + 1)?;
    let (id, _) = string(b, at + 4)?;
    Some((id, flags & 0x02 != 0))
}

fn parse_publish(b: &[u8], qos: u8) -> Option<(String, Option<u16>, Vec<u8>)> {
    let (topic, mut at) = string(b, 0)?;
    let pid = if qos > 0 {
        let p = be16(b, at)?;
        at += 2;
        Some(p)
    } else {
        None
    };
    Some((topic, pid, b.get(at..)?.to_vec()))
}

fn parse_subscribe(b: &[u8]) -> Option<(u16, Vec<String>)> {
    let pid = be16(b, 0)?;
    let mut at = 2;
    let mut filters = Vec::new();
    while at < b.len() {
        let (f, next) = string(b, at)?;
        filters.push(f);
        at = next + 1; // requested QoS
    }
    Some((pid, filters))
}

fn publish_packet(m: &Msg, pid: u16, dup: bool) -> Vec<u8> {
    let mut body = Vec::with_capacity(m.topic.len() + m.payload.len() + 4);
    body.extend_from_slice(&(m.topic.len() as u16).to_be_bytes());
    body.extend_from_slice(m.topic.as_bytes());
    body.extend_from_slice(&pid.to_be_bytes());
    body.extend_from_slice(&m.payload);
    frame(0x32 | if dup { 0x08 } else { 0 }, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_filters_match_like_mqtt() {
        assert!(matches("incidents/#", "incidents/ca/fire"));
        assert!(matches("incidents/+/fire", "incidents/ca/fire"));
        assert!(!matches("incidents/+", "incidents/ca/fire"));
        assert!(matches("a/b", "a/b"));
        assert!(!matches("a/b", "a/c"));
    }

    #[test]
    fn suback_for_more_than_253_filters_is_one_well_formed_frame() {
        let ack = suback(9, 300);
        assert_eq!(split_frame(&ack), Ok(Some((0x90, &ack[3..], ack.len()))));
        assert_eq!(ack.len(), 1 + 2 + 2 + 300);
    }

    #[test]
    fn a_fifth_length_byte_or_an_oversized_packet_is_refused() {
        assert_eq!(
            split_frame(&[0x30, 0x80, 0x80, 0x80, 0x80, 0x01]),
            Err(FrameError::LengthTooLong)
        );
        assert_eq!(
            split_frame(&[0x30, 0x80, 0x80, 0x80, 0x01]),
            Err(FrameError::TooLarge(1 << 21))
        );
        assert_eq!(split_frame(&[0x30, 0x80]), Ok(None));
    }

    #[test]
    fn publish_packets_round_trip() {
        let m = Msg {
            topic: "t/x".into(),
            payload: vec![7; 300],
        };
        let p = publish_packet(&m, 513, true);
        assert_eq!(p[0], 0x3a);
        // 300 + 2 + 3 + 2 = 307 = 0xb3 0x02 as a varint
        assert_eq!(&p[1..3], &[0xb3, 0x02]);
        let (topic, pid, payload) = parse_publish(&p[3..], 1).unwrap();
        assert_eq!(
            (topic.as_str(), pid, payload.len()),
            ("t/x", Some(513), 300)
        );
    }
}
