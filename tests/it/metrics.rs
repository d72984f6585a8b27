//! The Prometheus metrics, read by the real consumers: `run` consumes a real Mosquitto feed
//! through a broker failover while the endpoint is scraped, and the counters move as the
//! decisions do; a real Prometheus server scrapes the endpoint and answers queries on it;
//! node_exporter's textfile collector reads `stats --format prometheus`; promtool lints both.
//! A metrics port already taken leaves the feed flowing. Slow clients (silent or a byte at a
//! time, more than the endpoint holds open) never get a scrape refused. Prometheus, promtool and
//! node_exporter are Debian's, unpacked under target/tools by scripts/test.sh.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use replay_guard::model::Outcome;

use super::broker::{Broker, free_port};
use super::common;
use super::service::{Consumer, events};

/// A tool from Debian's prometheus and prometheus-node-exporter packages.
fn tool(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/tools/usr/bin")
        .join(name);
    assert!(
        path.is_file(),
        "{} is missing: scripts/test.sh unpacks Debian's prometheus and \
         prometheus-node-exporter packages there (run it once)",
        path.display()
    );
    path
}

/// The body of `GET path` on 127.0.0.1:`port` if it answers 200.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    // HTTP/1.0: the body comes whole (no chunks) and the connection closes after it. Another
    // status (Prometheus answers 503 while it starts) is no answer yet.
    let ok = head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200");
    ok.then(|| body.to_string())
}

/// The status line of the answer to `request` (a whole HTTP/1.0 request) on 127.0.0.1:`port`.
fn status_line(port: u16, request: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    raw.lines().next().unwrap_or_default().to_string()
}

/// Every sample of a text-format page: `name{labels}` to value.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("{l:?}"));
            let value = value.parse().unwrap_or_else(|_| panic!("{l:?}"));
            (series.to_string(), value)
        })
        .collect()
}

/// The endpoint's samples, waiting for it to listen.
pub fn scrape(port: u16) -> (String, BTreeMap<String, f64>) {
    let mut text = None;
    common::wait_until(
        format!("the endpoint on {port} answers"),
        Duration::from_secs(20),
        || {
            text = get(port, "/metrics");
            text.is_some()
        },
    );
    let text = text.expect("answered");
    let s = samples(&text);
    (text, s)
}

pub fn value(s: &BTreeMap<String, f64>, series: &str) -> f64 {
    *s.get(series)
        .unwrap_or_else(|| panic!("no {series} in the scrape: {s:#?}"))
}

fn decisions(s: &BTreeMap<String, f64>, o: Outcome) -> f64 {
    value(
        s,
        &format!("replay_guard_decisions_total{{outcome=\"{o}\"}}"),
    )
}

fn connected(s: &BTreeMap<String, f64>, broker: &str) -> f64 {
    value(
        s,
        &format!("replay_guard_broker_connected{{broker=\"{broker}\"}}"),
    )
}

/// `promtool check metrics`: the page parses and follows the naming conventions.
fn lint(text: &str) {
    let mut p = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A child process killed when the test ends, however it ends.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(program: &Path, args: &[String], log: &Path) -> Process {
    let log = std::fs::File::create(log).unwrap();
    Process(
        Command::new(program)
            .args(args)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// The alert rules the book gives (docs/src/operations/metrics.md, its `yaml` block), as a
/// Prometheus rule file, checked by `promtool check rules`.
fn documented_rules(dir: &Path) -> PathBuf {
    let page = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/src/operations/metrics.md"),
    )
    .unwrap();
    let start = page
        .find("```yaml\n")
        .expect("the metrics page's alert rules")
        + 8;
    let block = &page[start..start + page[start..].find("```").unwrap()];
    let mut rules = String::from("groups:\n  - name: replay-guard\n    rules:\n");
    for line in block.lines() {
        rules.push_str(&format!("      {line}\n"));
    }
    let path = dir.join("rules.yml");
    std::fs::write(&path, rules).unwrap();
    let out = Command::new(tool("promtool"))
        .args(["check", "rules", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// A real Prometheus server scraping 127.0.0.1:`target` every second as job `replay-guard`
/// and evaluating the book's alert rules every second; killed when dropped.
pub struct Alerting {
    _server: Process,
    port: u16,
}

impl Alerting {
    pub fn start(dir: &Path, target: u16) -> Alerting {
        let port = free_port();
        let rules = documented_rules(dir);
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  \
                 - {}\nscrape_configs:\n  - job_name: replay-guard\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{target}']\n",
                rules.display()
            ),
        )
        .unwrap();
        let server = spawn(
            &tool("prometheus"),
            &[
                format!("--config.file={}", config.display()),
                format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
                format!("--web.listen-address=127.0.0.1:{port}"),
            ],
            &dir.join("prometheus.log"),
        );
        Alerting {
            _server: server,
            port,
        }
    }

    /// The names of the alerts firing now.
    pub fn firing(&self) -> Vec<String> {
        let Some(body) = get(self.port, "/api/v1/alerts") else {
            return Vec::new();
        };
        // {"status":"success","data":{"alerts":[{"labels":{"alertname":"X",...},
        // "state":"firing",...},...]}}
        let doc = replay_guard::json::parse(body.as_bytes(), 64).unwrap();
        let mut names = Vec::new();
        let find = |v: &replay_guard::json::Json, k: &str| match v {
            replay_guard::json::Json::Object(m) => {
                m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
            }
            _ => None,
        };
        let alerts = find(&doc, "data").and_then(|d| find(&d, "alerts"));
        if let Some(replay_guard::json::Json::Array(alerts)) = alerts {
            for a in alerts {
                let firing = matches!(find(&a, "state"),
                    Some(replay_guard::json::Json::String(s)) if s == "firing");
                let name = find(&a, "labels").and_then(|l| find(&l, "alertname"));
                if let (true, Some(replay_guard::json::Json::String(n))) = (firing, name) {
                    names.push(n);
                }
            }
        }
        names
    }
}

/// Polls `check` until it holds, or fails after `limit` with `what` and the last reading.
pub fn eventually<T: std::fmt::Debug>(
    limit: Duration,
    what: &str,
    mut check: impl FnMut() -> (bool, T),
) {
    let seen = std::cell::RefCell::new(None);
    common::wait_until(
        common::lazy(|| format!("{what} ({:?})", seen.borrow())),
        limit,
        || {
            let (ok, now) = check();
            *seen.borrow_mut() = Some(now);
            ok
        },
    );
}

#[test]
fn the_endpoint_counts_what_run_decides_through_a_failover_and_prometheus_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    // A logs every packet, so the test sees the PUBACKs arrive.
    let mut a = Broker::start_with(&dir.path().join("a"), true, "log_type all\n");
    let b_port = free_port();
    let b_url = format!("mqtt://127.0.0.1:{b_port}");
    let mut c = Consumer::new(dir.path(), &[a.url(), b_url.clone()], "v5", "rg-metrics");
    let port = free_port();
    let mut config = std::fs::read_to_string(&c.config).unwrap();
    config += &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    std::fs::write(&c.config, config).unwrap();

    // Create the session on A and leave 300 events pending for it in A's snapshot.
    c.start();
    let (_, s) = scrape(port);
    assert_eq!(decisions(&s, Outcome::Applied), 0.0);
    let info = format!(
        "replay_guard_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(value(&s, &info), 1.0);
    assert_eq!(connected(&s, &b_url), 0.0, "B is configured, not connected");
    for (request, status) in [
        ("GET /nothing HTTP/1.0\r\n\r\n", "404"),
        ("POST /metrics HTTP/1.0\r\nContent-Length: 0\r\n\r\n", "405"),
        ("GET / HTTP/1.0\r\n\r\n", "200"),
        ("not http at all\r\n\r\n", "400"),
    ] {
        let line = status_line(port, request);
        assert!(
            line.contains(&format!(" {status} ")),
            "{request:?}: {line:?}"
        );
    }
    eventually(Duration::from_secs(10), "connected to A", || {
        let s = scrape(port).1;
        (connected(&s, &a.url()) == 1.0, s)
    });
    c.wait_subscribed();
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0));
    let mut lines = events(0, 300);
    lines.push("not json".into());
    a.publish_lines("incidents/ca", &lines, "pub-a");
    a.snapshot();

    // A new process: its counters start at 0, the store's carry on.
    c.start();
    c.wait_decided(301, Duration::from_secs(30));
    eventually(Duration::from_secs(10), "the first 301 decisions", || {
        let s = scrape(port).1;
        (decisions(&s, Outcome::Applied) == 300.0, s)
    });
    let (text, s) = scrape(port);
    lint(&text);
    assert_eq!(decisions(&s, Outcome::Malformed), 1.0);
    assert_eq!(decisions(&s, Outcome::Duplicate), 0.0);
    let batches = value(&s, "replay_guard_batch_size_count");
    assert!(batches >= 1.0, "{batches}");
    assert_eq!(value(&s, "replay_guard_batch_size_sum"), 301.0);
    assert_eq!(
        value(&s, "replay_guard_commit_duration_seconds_count"),
        batches,
        "one commit per batch"
    );
    assert!(value(&s, "replay_guard_commit_duration_seconds_sum") > 0.0);
    assert_eq!(value(&s, "replay_guard_acks_total{result=\"sent\"}"), 301.0);
    assert_eq!(value(&s, "replay_guard_store_readable"), 1.0);
    assert_eq!(value(&s, "replay_guard_window_entries"), 300.0);
    assert_eq!(value(&s, "replay_guard_quarantine_held"), 1.0);
    assert_eq!(
        value(
            &s,
            "replay_guard_store_decisions_total{outcome=\"applied\"}"
        ),
        300.0
    );
    assert!(value(&s, "replay_guard_last_commit_timestamp_seconds") > 1.7e9);
    assert!(value(&s, "replay_guard_database_size_bytes") > 0.0);
    assert_eq!(value(&s, "replay_guard_broker_switches_total"), 0.0);

    // A real Prometheus server scrapes the endpoint every second and serves what it read.
    let prom_port = free_port();
    let prom_config = dir.path().join("prometheus.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: rg\n    \
             static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let _prometheus = spawn(
        &tool("prometheus"),
        &[
            format!("--config.file={}", prom_config.display()),
            format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()),
            format!("--web.listen-address=127.0.0.1:{prom_port}"),
        ],
        &dir.path().join("prometheus.log"),
    );
    let query = |q: &str| get(prom_port, &format!("/api/v1/query?query={q}"));
    eventually(
        Duration::from_secs(30),
        "Prometheus to scrape the applied count",
        || {
            // replay_guard_decisions_total{outcome="applied"}, URL-encoded.
            let body = query("replay_guard_decisions_total%7Boutcome%3D%22applied%22%7D");
            let ok = body.as_deref().is_some_and(|b| b.contains(",\"300\"]"));
            (ok, body)
        },
    );
    let up = query("up%7Bjob%3D%22rg%22%7D");
    assert!(
        up.as_deref().is_some_and(|b| b.contains(",\"1\"]")),
        "{up:?}; log: {}",
        std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
    );

    // Failover: A dies, B starts from A's snapshot and replays the 301: each event a
    // duplicate, the malformed line quarantined again (it has no key to be a duplicate of).
    a.wait_pubacks("rg-metrics", 301);
    let b = a.kill_and_restore_into(&dir.path().join("b"), b_port);
    c.wait_decided(602, Duration::from_secs(30));
    b.publish_lines("incidents/ca", &events(300, 310), "pub-b");
    c.wait_decided(612, Duration::from_secs(30));
    eventually(Duration::from_secs(10), "the replay counted", || {
        let s = scrape(port).1;
        let done = decisions(&s, Outcome::Applied) == 310.0
            && value(&s, "replay_guard_replay_burst_duplicates_count") == 1.0;
        (done, s)
    });
    let (text, s) = scrape(port);
    lint(&text);
    assert_eq!(decisions(&s, Outcome::Duplicate), 300.0, "{text}");
    assert_eq!(decisions(&s, Outcome::Malformed), 2.0, "{text}");
    assert_eq!(value(&s, "replay_guard_replay_burst_duplicates_sum"), 300.0);
    assert!(value(&s, "replay_guard_broker_switches_total") >= 1.0);
    assert!(value(&s, "replay_guard_connections_lost_total") >= 1.0);
    assert_eq!(connected(&s, &b_url), 1.0);
    assert_eq!(connected(&s, &a.url()), 0.0);
    assert_eq!(value(&s, "replay_guard_acks_total{result=\"sent\"}"), 612.0);
    assert_eq!(value(&s, "replay_guard_replay_bursts_recorded"), 1.0);
    assert_eq!(value(&s, "replay_guard_window_entries"), 310.0);
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
    // The store agrees with what the endpoint counted.
    let o = c.outcomes();
    assert_eq!(o.get(&Outcome::Applied), Some(&310));
    assert_eq!(o.get(&Outcome::Duplicate), Some(&300));
}

#[test]
fn a_metrics_port_already_taken_is_logged_and_the_feed_still_flows() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut c = Consumer::new(dir.path(), &[broker.url()], "v5", "rg-metrics-taken");
    let mut config = std::fs::read_to_string(&c.config).unwrap();
    config += &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    std::fs::write(&c.config, config).unwrap();
    let check = common::run(&["check-config", c.config.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        said.contains(&format!(", metrics http://127.0.0.1:{port}/metrics)")),
        "{said}"
    );
    c.start();
    c.wait_subscribed();
    broker.publish_lines("incidents/ca", &events(0, 50), "pub-taken");
    c.wait_decided(50, Duration::from_secs(30));
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0));
    let log = c.log_text();
    assert!(log.contains("metrics endpoint: cannot listen"), "{log}");
    assert_eq!(c.outcomes().get(&Outcome::Applied), Some(&50));
}

#[test]
fn stats_in_prometheus_format_is_read_by_node_exporters_textfile_collector() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("s.redb");
    let feed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl");
    let out = common::run(&[
        "ingest",
        "--db",
        db.to_str().unwrap(),
        feed.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let out = common::run(&[
        "stats",
        "--db",
        db.to_str().unwrap(),
        "--format",
        "prometheus",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    lint(&text);
    let textfiles = dir.path().join("textfile");
    std::fs::create_dir(&textfiles).unwrap();
    std::fs::write(textfiles.join("replay-guard.prom"), &text).unwrap();

    let port = free_port();
    let _exporter = spawn(
        &tool("prometheus-node-exporter"),
        &[
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--collector.disable-defaults".into(),
            "--collector.textfile".into(),
            format!("--collector.textfile.directory={}", textfiles.display()),
        ],
        &dir.path().join("node_exporter.log"),
    );
    let (page, s) = scrape(port);
    assert_eq!(value(&s, "node_textfile_scrape_error"), 0.0, "{page}");
    // The sample feed: 7 applied, 1 late, 3 duplicates, 1 conflict, 2 malformed.
    for (outcome, n) in [("applied", 7.0), ("duplicate", 3.0), ("malformed", 2.0)] {
        assert_eq!(
            value(
                &s,
                &format!("replay_guard_store_decisions_total{{outcome=\"{outcome}\"}}")
            ),
            n
        );
    }
    assert_eq!(value(&s, "replay_guard_window_entries"), 8.0);
    assert_eq!(value(&s, "replay_guard_quarantine_held"), 3.0);
    assert!(value(&s, "replay_guard_disk_free_bytes") > 0.0);
}

#[test]
fn stats_in_prometheus_format_reads_a_postgres_store_without_disk_gauges() {
    let db = super::pg::PgDb::new("metrics");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("pg.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nbackend = \"postgres\"\ndsn = \"{}\"\nschema = \"rg\"\n[window]\nmax_entries = 5000\n",
            db.dsn()
        ),
    )
    .unwrap();
    let feed = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/feed.jsonl");
    let config = config.to_str().unwrap();
    let out = common::run(&["ingest", "--config", config, feed.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = common::run(&["stats", "--config", config, "--format", "prometheus"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    lint(&text);
    let s = samples(&text);
    assert_eq!(
        value(
            &s,
            "replay_guard_store_decisions_total{outcome=\"applied\"}"
        ),
        7.0
    );
    assert_eq!(value(&s, "replay_guard_window_entries"), 8.0);
    assert_eq!(value(&s, "replay_guard_window_max_entries"), 5000.0);
    assert!(value(&s, "replay_guard_database_size_bytes") > 0.0);
    assert!(
        !text.contains("replay_guard_disk_free_bytes"),
        "the disk is the server's: {text}"
    );
}

/// A client that connects to 127.0.0.1:`port` and never finishes a request: silent, or
/// `trickle` (a header line one byte every 100 ms). Each time the endpoint closes its
/// connection it connects again, until `stop`. Its first connection counts in `arrived`.
fn slow_client(
    port: u16,
    trickle: bool,
    arrived: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    use std::sync::atomic::Ordering;
    std::thread::spawn(move || {
        let mut first = true;
        while !stop.load(Ordering::Relaxed) {
            let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            if std::mem::take(&mut first) {
                arrived.fetch_add(1, Ordering::Relaxed);
            }
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            if trickle {
                let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nX-Slow: ");
            }
            while !stop.load(Ordering::Relaxed) {
                let open = if trickle {
                    std::thread::sleep(Duration::from_millis(100));
                    s.write_all(b"a").is_ok()
                } else {
                    // Ok(0) is the endpoint closing; a timeout is the connection still open.
                    let mut byte = [0u8; 1];
                    matches!(s.read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut)
                };
                if !open {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

/// Sockets the process `pid` holds open.
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(Result::ok)
                .filter(|fd| {
                    std::fs::read_link(fd.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Scrapes every 100 ms for `during`; returns the slowest answer, failing at a refusal.
fn scrape_under_load(port: u16, during: Duration, pid: u32, open: &mut usize) -> Duration {
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    while start.elapsed() < during {
        let asked = Instant::now();
        let page = get(port, "/metrics");
        let took = asked.elapsed();
        assert!(
            page.is_some_and(|p| p.contains("replay_guard_store_readable 1")),
            "a scrape was refused after {took:?}, {:?} into the slow clients",
            start.elapsed()
        );
        slowest = slowest.max(took);
        *open = (*open).max(sockets(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    slowest
}

#[test]
fn slow_clients_holding_connections_open_do_not_keep_a_scraper_out() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&dir.path().join("broker"), false);
    let port = free_port();
    let mut c = Consumer::new(dir.path(), &[broker.url()], "v5", "rg-metrics-slow");
    let mut config = std::fs::read_to_string(&c.config).unwrap();
    config += &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    std::fs::write(&c.config, config).unwrap();
    c.start();
    let pid = c.pid().unwrap();
    scrape(port);
    let stop = Arc::new(AtomicBool::new(false));
    let arrived = Arc::new(AtomicUsize::new(0));
    let all_connected = |n: usize| {
        eventually(
            Duration::from_secs(10),
            "the slow clients connected",
            || {
                let k = arrived.load(Ordering::Relaxed);
                (k >= n, k)
            },
        )
    };
    let mut clients = Vec::new();
    let mut open = 0;
    // 16 slow clients, silent and trickling, well under the endpoint's 64 connections: each
    // scrape is answered at once, for longer than the 2 s a request may take to arrive (so
    // the slow ones are cut off and come back meanwhile).
    for i in 0..16 {
        clients.push(slow_client(port, i % 2 == 1, arrived.clone(), stop.clone()));
    }
    all_connected(16);
    let slowest = scrape_under_load(port, Duration::from_secs(5), pid, &mut open);
    assert!(
        slowest < Duration::from_secs(2),
        "a scrape took {slowest:?}"
    );
    // 80 more: more than the endpoint holds open. The excess waits in the listen queue, so
    // a scrape waits for a turn (at most the request deadline, plus a turn or so), is never
    // refused, and the process's open sockets stay bounded.
    for i in 0..80 {
        clients.push(slow_client(port, i % 2 == 1, arrived.clone(), stop.clone()));
    }
    all_connected(96);
    let slowest = scrape_under_load(port, Duration::from_secs(6), pid, &mut open);
    assert!(
        slowest < Duration::from_secs(6),
        "a scrape took {slowest:?}"
    );
    // 64 connections, the listener, the broker's, and a few of the store's and the runtime's.
    assert!(open <= 64 + 8, "{open} sockets open at once");
    stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.join().unwrap();
    }
    assert_eq!(c.stop(Duration::from_secs(10)), Some(0), "{}", c.log_text());
}
