//! The relay's window through the real `relay` binary and a scripted MQTT 5 broker on a
//! thread of the test's own: the events of the next batch go out before any PUBACK of the
//! batch before them (the broker answers none until it has read more than a batch), PUBACKs
//! out of order move the cursor over the acknowledged prefix only, and a connection lost
//! mid-window re-publishes exactly the unacknowledged suffix, in order.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

use replay_guard::json;

use super::common;
use super::fake_peer::read_packet;
use super::relay::{Setup, field, setup, stop};

/// The packet id and the effect offset (`rgoffset`) of an MQTT 5 QoS 1 PUBLISH's body.
fn publish(body: &[u8]) -> (u16, u64) {
    let topic_len = usize::from(u16::from_be_bytes([body[0], body[1]]));
    let at = 2 + topic_len;
    let pkid = u16::from_be_bytes([body[at], body[at + 1]]);
    // Properties (a variable-length count), then the payload.
    let (mut props, mut mult, mut i) = (0usize, 1usize, at + 2);
    loop {
        let b = body[i];
        i += 1;
        props += usize::from(b & 127) * mult;
        mult *= 128;
        if b & 128 == 0 {
            break;
        }
    }
    let payload = &body[i + props..];
    let doc = json::parse(payload, 64).unwrap();
    (pkid, field(&doc, "rgoffset").parse().unwrap())
}

fn puback(pkid: u16) -> [u8; 4] {
    let [hi, lo] = pkid.to_be_bytes();
    [0x40, 2, hi, lo]
}

/// Accepts one connection and answers its CONNECT (MQTT 5, no receive maximum).
fn accept(l: &TcpListener) -> TcpStream {
    let (mut s, _) = l.accept().unwrap();
    let (kind, _) = read_packet(&mut s).expect("CONNECT");
    assert_eq!(kind, 1);
    s.write_all(&[0x20, 3, 0, 0, 0]).unwrap();
    s
}

/// The next PUBLISH on `s` (PINGREQs answered).
fn next_publish(s: &mut TcpStream) -> (u16, u64) {
    loop {
        let (kind, body) = read_packet(s).expect("a PUBLISH");
        match kind {
            3 => return publish(&body),
            12 => s.write_all(&[0xD0, 0]).unwrap(),
            other => panic!("unexpected packet type {other}"),
        }
    }
}

const EVENTS: u64 = 60;
const BATCH: u64 = 10;
/// Read on the first connection before any PUBACK: more than a batch.
const HELD: usize = 15;
/// Acknowledged on the first connection before it is lost.
const ACKED: u64 = 25;
/// Read on the first connection before it is lost.
const READ: usize = 30;

fn window_setup(dir: &std::path::Path, port: u16) -> Setup {
    let s = setup(dir, "exit 0", "", "");
    let config = format!(
        "[store]\npath = {:?}\n[service]\nshutdown_timeout_seconds = 5\n\
         [[sink]]\nname = \"cop\"\nkind = \"mqtt\"\nbroker = \"mqtt://127.0.0.1:{port}\"\n\
         protocol = \"v5\"\nclient_id = \"rg-window\"\ntopic = \"cop/{{agency}}/{{source_id}}\"\n\
         batch_max = {BATCH}\nbackoff_initial_ms = 10\nbackoff_max_ms = 40\ntimeout_ms = 20000\n",
        s.db.to_str().unwrap()
    );
    std::fs::write(&s.config, config).unwrap();
    s.ingest(0, EVENTS);
    s
}

#[test]
fn the_next_batch_goes_out_before_the_pubacks_and_a_loss_republishes_exactly_the_unacknowledged_suffix()
 {
    let dir = tempfile::tempdir().unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let s = window_setup(dir.path(), port);
    let (tx, rx) = mpsc::channel();
    let broker = std::thread::spawn(move || {
        let mut first = Vec::new();
        let mut c = accept(&l);
        // No PUBACK until more than a batch was published: a sink that waits for a batch's
        // PUBACKs before it sends the next batch never gets here.
        while first.len() < HELD {
            first.push(next_publish(&mut c));
        }
        tx.send(first.clone()).unwrap();
        // Acknowledged in reverse order: the cursor may move only once the first is.
        for (pkid, _) in first.iter().rev() {
            c.write_all(&puback(*pkid)).unwrap();
        }
        // Then each as it comes, up to ACKED; the rest read and never acknowledged.
        while first.len() < READ {
            let (pkid, offset) = next_publish(&mut c);
            if offset < ACKED {
                c.write_all(&puback(pkid)).unwrap();
            }
            first.push((pkid, offset));
        }
        // Closed with a FIN after what was written (unread input would make it a reset,
        // which may take the last PUBACKs with it), then read to the sink's end.
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let _ = std::io::copy(&mut c, &mut std::io::sink());
        drop(c);
        let mut second = Vec::new();
        let mut c = accept(&l);
        while second.last().is_none_or(|(_, o)| *o + 1 < EVENTS) {
            let (pkid, offset) = next_publish(&mut c);
            c.write_all(&puback(pkid)).unwrap();
            second.push((pkid, offset));
        }
        (first, second, c)
    });
    let mut relay = s.relay();
    let held = rx
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| {
            panic!(
                "no second batch before the first one's PUBACKs:\n{}",
                s.log()
            )
        });
    let offsets: Vec<u64> = held.iter().map(|(_, o)| *o).collect();
    assert_eq!(offsets, (0..HELD as u64).collect::<Vec<_>>());
    let (first, second, _conn) = broker
        .join()
        .unwrap_or_else(|_| panic!("the broker's script failed; relay log:\n{}", s.log()));
    let offsets: Vec<u64> = first.iter().map(|(_, o)| *o).collect();
    assert_eq!(
        offsets,
        (0..READ as u64).collect::<Vec<_>>(),
        "in log order"
    );
    // The second connection starts at the first event not acknowledged and goes on in order:
    // nothing acknowledged is published again, nothing unacknowledged is skipped.
    let offsets: Vec<u64> = second.iter().map(|(_, o)| *o).collect();
    assert_eq!(offsets, (ACKED..EVENTS).collect::<Vec<_>>());
    common::wait_until(
        "the cursor at the end of the log",
        Duration::from_secs(30),
        || {
            s.status(&s.config)
                .get("cop")
                .is_some_and(|v| field(v, "cursor") == EVENTS.to_string())
        },
    );
    assert_eq!(stop(&mut relay), Some(0));
}
