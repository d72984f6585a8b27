//! A scripted fake MQTT 3.1.1 broker for a protocol edge case the real one cannot stage on
//! demand: a PUBLISH and the end of the connection arrive in one read. The consumer must never
//! acknowledge that delivery on the next connection, where its packet id means nothing (or
//! another message).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::common;

/// One MQTT packet as a scripted broker reads it: (packet type, body); `None` once the
/// connection ends.
pub(crate) fn read_packet(s: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut h = [0u8; 1];
    s.read_exact(&mut h).ok()?;
    let (mut len, mut mult) = (0usize, 1usize);
    loop {
        let mut b = [0u8; 1];
        s.read_exact(&mut b).ok()?;
        len += usize::from(b[0] & 127) * mult;
        mult *= 128;
        if b[0] & 128 == 0 {
            break;
        }
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some((h[0] >> 4, body))
}

fn publish_packet(topic: &str, payload: &[u8], pkid: u16) -> Vec<u8> {
    let mut var = Vec::new();
    var.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    var.extend_from_slice(topic.as_bytes());
    var.extend_from_slice(&pkid.to_be_bytes());
    var.extend_from_slice(payload);
    let mut out = vec![0x32];
    let mut n = var.len();
    loop {
        let mut b = (n % 128) as u8;
        n /= 128;
        if n > 0 {
            b |= 128;
        }
        out.push(b);
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&var);
    out
}

/// Kills the consumer if the test fails before it stopped it.
struct KillOnDrop(std::process::Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CONNECT -> CONNACK (no session); SUBSCRIBE -> SUBACK.
fn handshake(s: &mut TcpStream) {
    let (kind, _) = read_packet(s).expect("CONNECT");
    assert_eq!(kind, 1);
    s.write_all(&[0x20, 2, 0, 0]).unwrap();
    let (kind, body) = read_packet(s).expect("SUBSCRIBE");
    assert_eq!(kind, 8);
    s.write_all(&[0x90, 3, body[0], body[1], 1]).unwrap();
}

/// A fake broker's listening socket and a `replay-guard run` (3.1.1) pointed at it, with
/// `extra` config lines.
fn consumer_of_fake_broker(
    dir: &std::path::Path,
    client_id: &str,
    extra: &str,
) -> (TcpListener, KillOnDrop) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\npath = {:?}\n[mqtt]\nbrokers = [\"mqtt://127.0.0.1:{port}\"]\nclient_id = {client_id:?}\n\
             topics = [\"incidents/#\"]\nprotocol = \"v3.1.1\"\nbackoff_initial_ms = 20\nbackoff_max_ms = 50\n{extra}",
            dir.join("db.redb").to_str().unwrap()
        ),
    )
    .unwrap();
    let child = KillOnDrop(
        Command::new(common::bin())
            .args(["run", "--config", cfg.to_str().unwrap()])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (listener, child)
}

#[test]
fn a_delivery_read_with_the_connection_loss_is_never_acknowledged_on_the_next_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, mut child) = consumer_of_fake_broker(dir.path(), "fake", "");

    // Connection 1: a PUBLISH, then the broker vanishes, in one segment.
    let (mut c1, _) = listener.accept().unwrap();
    handshake(&mut c1);
    std::thread::sleep(Duration::from_millis(200));
    let msg = common::msg("CALFIRE", "E1", 1, 1, "A");
    c1.write_all(&publish_packet("incidents/ca", msg.as_bytes(), 1))
        .unwrap();
    drop(c1);

    // Connection 2: no session, nothing published: any PUBACK here is for a stale packet id.
    let (mut c2, _) = listener.accept().unwrap();
    handshake(&mut c2);
    c2.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        match read_packet(&mut c2) {
            Some((4, body)) => panic!(
                "PUBACK for packet id {} on a connection that sent no PUBLISH",
                u16::from_be_bytes([body[0], body[1]])
            ),
            Some((12, _)) => c2.write_all(&[0xD0, 0]).unwrap(), // PINGREQ -> PINGRESP
            Some(_) | None => {}
        }
    }
    super::broker::signal(child.0.id() as i32, "TERM");
    // The drain sends DISCONNECT on connection 2; nothing else may come.
    c2.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while let Some((kind, body)) = read_packet(&mut c2) {
        assert_ne!(kind, 4, "PUBACK {:?} during the drain", body.get(..2));
        if kind == 14 {
            break;
        }
    }
    drop(c2);
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}

#[test]
fn pubacks_leave_in_the_order_the_publishes_arrived() {
    let dir = tempfile::tempdir().unwrap();
    let (listener, mut child) = consumer_of_fake_broker(
        dir.path(),
        "order",
        "[commit]\nmax_batch = 7\nlinger_ms = 1\n",
    );
    let (mut c, _) = listener.accept().unwrap();
    handshake(&mut c);
    // Packet ids out of numeric order, with duplicates and malformed ones mixed in, across
    // several batches of 7: acks must follow arrival order exactly.
    let pkids: Vec<u16> = (0..60u16).map(|i| 1 + (i * 37) % 97).collect();
    let mut wire = Vec::new();
    for (n, pkid) in pkids.iter().enumerate() {
        let payload = match n % 10 {
            3 => "garbage".to_string(),
            7 => common::msg("A", "S", 0, (n - 1) as u64, "x"), // a replay of an earlier one
            _ => common::msg("A", "S", 0, n as u64, "x"),
        };
        wire.extend_from_slice(&publish_packet("incidents/ca", payload.as_bytes(), *pkid));
    }
    c.write_all(&wire).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut acked = Vec::new();
    while acked.len() < pkids.len() {
        match read_packet(&mut c) {
            Some((4, body)) => acked.push(u16::from_be_bytes([body[0], body[1]])),
            Some((12, _)) => c.write_all(&[0xD0, 0]).unwrap(),
            Some(_) => {}
            None => panic!("connection ended after {} PUBACKs", acked.len()),
        }
    }
    assert_eq!(acked, pkids, "PUBACKs out of arrival order");
    super::broker::signal(child.0.id() as i32, "TERM");
    while let Some((kind, _)) = read_packet(&mut c) {
        if kind == 14 {
            break;
        }
    }
    drop(c);
    assert_eq!(child.0.wait().unwrap().code(), Some(0));
}

/// `run` against a fake broker that answers the SUBSCRIBE with `granted` (after a CONNACK with
/// `session_present`): the exit code within 10 s (or `None`) and stderr.
fn run_with_suback(session_present: bool, granted: u8) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[store]\npath = {:?}\n[mqtt]\nbrokers = [\"mqtt://127.0.0.1:{port}\"]\nclient_id = \"sub\"\n\
             topics = [\"incidents/#\"]\nprotocol = \"v3.1.1\"\nbackoff_initial_ms = 20\nbackoff_max_ms = 50\n",
            dir.path().join("db.redb").to_str().unwrap()
        ),
    )
    .unwrap();
    let mut child = KillOnDrop(
        Command::new(common::bin())
            .args(["run", "--config", cfg.to_str().unwrap()])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (mut s, _) = listener.accept().unwrap();
    let (kind, _) = read_packet(&mut s).expect("CONNECT");
    assert_eq!(kind, 1);
    s.write_all(&[0x20, 2, u8::from(session_present), 0])
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let Some((8, body)) = read_packet(&mut s) else {
        return (None, "no SUBSCRIBE after the CONNACK".into());
    };
    s.write_all(&[0x90, 3, body[0], body[1], granted]).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let start = Instant::now();
    let code = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status.code();
        }
        if start.elapsed() > Duration::from_secs(10) {
            break None;
        }
        if let Some((12, _)) = read_packet(&mut s) {
            s.write_all(&[0xD0, 0]).unwrap();
        }
    };
    let _ = child.0.kill();
    let mut err = String::new();
    std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    (code, err)
}

#[test]
fn a_refused_subscription_stops_run_with_a_configuration_error() {
    let (code, err) = run_with_suback(false, 0x80);
    assert_eq!(code, Some(1), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.contains("incidents/#") && last.contains("refused"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_subscription_granted_only_at_qos_0_stops_run_with_a_configuration_error() {
    // QoS 0 deliveries carry no acknowledgement: the broker would drop what we never commit.
    let (code, err) = run_with_suback(false, 0);
    assert_eq!(code, Some(1), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.contains("incidents/#") && last.contains("QoS 0"),
        "{err}"
    );
}

#[test]
fn run_subscribes_even_when_the_broker_kept_the_session() {
    // The session may predate a config change or hold no subscription at all (a refused one):
    // the configured topics are subscribed on every connect, so a refusal is seen here too.
    let (code, err) = run_with_suback(true, 0x80);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.lines().last().unwrap_or("").contains("incidents/#"),
        "{err}"
    );
}
