//! A minimal keep-alive HTTP/1.1 receiver for the http sink's throughput benchmark
//! (`scripts/bench-relay-http.sh`): answers `200 OK` with an empty body to every request
//! (Content-Length bodies only), one thread per connection, and once `EXPECT` requests have
//! arrived prints one line: requests, seconds from the first to the last, requests/s, and how
//! many distinct `Idempotency-Key`s it saw. Std only, so it costs the measurement little.
//!
//! Usage: `cargo run --release --example http_receiver -- PORT_FILE EXPECT [BODY_FILE]`; it
//! binds 127.0.0.1:0 and writes the port to PORT_FILE, and the first request's body to
//! BODY_FILE (a real event, for a baseline client to send). It exits after printing.
//! `DELAY_MS=n` in the environment holds each answer n ms (a remote receiver's round trip).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Default)]
struct Count {
    body_file: Option<String>,
    first: Option<Instant>,
    n: u64,
    keys: HashSet<String>,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (port_file, expect) = (args[1].clone(), args[2].parse::<u64>().expect("EXPECT"));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::fs::write(&port_file, format!("{port}\n")).unwrap();
    let count = Arc::new(Mutex::new(Count {
        body_file: args.get(3).cloned(),
        ..Count::default()
    }));
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let count = count.clone();
        std::thread::spawn(move || serve(conn, &count, expect));
    }
}

fn serve(conn: TcpStream, count: &Mutex<Count>, expect: u64) {
    let delay = std::env::var("DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis);
    conn.set_nodelay(true).ok();
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::with_capacity(64 * 1024, conn);
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let (mut len, mut key) = (0usize, None);
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                } else if k.eq_ignore_ascii_case("idempotency-key") {
                    key = Some(v.trim().to_string());
                }
            }
        }
        body.resize(len, 0);
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let report = {
            let mut c = count.lock().unwrap();
            let now = Instant::now();
            if c.first.is_none()
                && let Some(f) = c.body_file.take()
            {
                std::fs::write(f, &body).unwrap();
            }
            let first = *c.first.get_or_insert(now);
            c.n += 1;
            if let Some(k) = key {
                c.keys.insert(k);
            }
            (c.n == expect).then(|| {
                let secs = now.duration_since(first).as_secs_f64();
                format!(
                    "{} requests in {secs:.3} s: {:.0} requests/s, {} distinct Idempotency-Keys",
                    c.n,
                    (c.n - 1) as f64 / secs,
                    c.keys.len()
                )
            })
        };
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
        let sent = w
            .write_all(b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n")
            .is_ok();
        if let Some(line) = report {
            println!("{line}");
            std::process::exit(0);
        }
        if !sent {
            return;
        }
    }
}
