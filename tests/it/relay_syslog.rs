//! The `syslog` sink against a real rsyslogd the test starts (its own config, work directory
//! and pid file in a temp dir; imtcp, or imrelp for the tests over RELP, on a free loopback
//! port; every message's raw form written to a file the test reads): each event arrives as an
//! RFC 5424 message parsed back field by field, by the test and by rsyslog's own parser
//! alike; across `kill -9` of the relay and a restart of rsyslog mid-stream (over RELP) every
//! event arrives, repeats with the same id and nothing else; the audit stream (`stream =
//! "audit"`, over RELP) from a real `run` fed through a private Mosquitto, killed with -9 four
//! times while rsyslog restarts once: every audit entry arrives (decisions of every outcome,
//! an operator's release and discard, one message larger than rsyslog's default
//! maxMessageSize), MSGID the outcome, severity by outcome, the structured data the
//! `dump-audit` entry's, the chain continuous, and `outcomes` honoured; over TLS (rsyslog's
//! gtls driver, a CA made with openssl) with the receiver verified, a receiver of another CA
//! refused in words in `relay status`; a receiver that closes before a new connection's first
//! batch settles, or stops reading, gets the batch again; one that closed the idle connection
//! costs no failed attempt.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use replay_guard::config::Config;
use replay_guard::json::{self, Json};
use replay_guard::relay::{CursorAfter, Event, Failure, Sink, envelope};

use super::broker::{free_port, signal};
use super::common;
use super::relay::{field, stdout, stop};

/// rsyslogd's TLS set-up: its certificate, key and CA (`tls::make_pki`'s files), and the
/// client authentication it asks for (imtcp: `anon`, or `x509/certvalid` for a client
/// certificate; imrelp: `certvalid`).
pub(super) struct RsyslogTls {
    pub(super) pki: PathBuf,
    pub(super) auth_mode: &'static str,
}

/// What rsyslogd listens with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Input {
    /// imtcp (octet-counted syslog over TCP, or TLS with the gtls driver).
    Tcp,
    /// imrelp (RELP, or RELP over TLS), writing each message to the files before it answers
    /// (`queue.type="Direct"`: an `rsp 200` means the message is in the file).
    Relp,
}

/// rsyslogd's `maxMessageSize`, set explicitly: its default (8 KiB) cuts a longer message into
/// pieces, and an audit entry's message can be far longer (a malformed message's reason quotes
/// it). The value the book's syslog page gives for the default `max_payload_bytes`.
const RSYSLOG_MAX_MESSAGE: &str = "2m";

/// A real rsyslogd of the test's own.
pub(super) struct Rsyslog {
    pub(super) dir: PathBuf,
    pub(super) port: u16,
    tls: Option<RsyslogTls>,
    input: Input,
    child: Option<Child>,
}

impl Rsyslog {
    fn start(dir: &Path, tls: Option<RsyslogTls>) -> Rsyslog {
        Rsyslog::start_with(dir, tls, Input::Tcp)
    }

    pub(super) fn start_with(dir: &Path, tls: Option<RsyslogTls>, input: Input) -> Rsyslog {
        let mut r = Rsyslog {
            dir: dir.to_path_buf(),
            port: free_port(),
            tls,
            input,
            child: None,
        };
        r.spawn();
        r
    }

    /// rsyslogd's process id.
    pub(super) fn pid(&self) -> i32 {
        self.child.as_ref().expect("rsyslogd runs").id() as i32
    }

    /// SIGKILL, waited for (a stopped rsyslogd too): nothing of it is flushed or answered.
    pub(super) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// The file every message's raw form (`%rawmsg%`, the RFC 5424 message as received,
    /// without its octet count) is written to, one per line.
    fn out(&self) -> PathBuf {
        self.dir.join("received.log")
    }

    /// The file where rsyslog writes what its own RFC 5424 parser made of each message:
    /// `PRI|FACILITY|SEVERITY|VERSION|TIMESTAMP|HOSTNAME|APP-NAME|PROCID|MSGID|SD|MSG`.
    fn fields(&self) -> PathBuf {
        self.dir.join("fields.log")
    }

    /// rsyslog's parse of every message so far (complete lines only), in arrival order.
    fn parsed_by_rsyslog(&self) -> Vec<Vec<String>> {
        let text = std::fs::read_to_string(self.fields()).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete
            .lines()
            .map(|l| l.splitn(11, '|').map(str::to_string).collect())
            .collect()
    }

    pub(super) fn spawn(&mut self) {
        std::fs::create_dir_all(&self.dir).unwrap();
        let d = self.dir.to_str().unwrap();
        let (global_tls, module_tls) = match &self.tls {
            None => (String::new(), String::new()),
            Some(_) if self.input == Input::Relp => (String::new(), String::new()),
            Some(t) => {
                let p = |f: &str| t.pki.join(f).to_str().unwrap().to_string();
                (
                    format!(
                        " DefaultNetstreamDriver=\"gtls\" DefaultNetstreamDriverCAFile=\"{}\" \
                         DefaultNetstreamDriverCertFile=\"{}\" DefaultNetstreamDriverKeyFile=\"{}\"",
                        p("ca.pem"),
                        p("server.pem"),
                        p("server.key")
                    ),
                    format!(
                        " StreamDriver.Name=\"gtls\" StreamDriver.Mode=\"1\" \
                         StreamDriver.AuthMode=\"{}\"",
                        t.auth_mode
                    ),
                )
            }
        };
        let (module, queue, input_tls) = match (self.input, &self.tls) {
            (Input::Tcp, _) => ("imtcp", "", String::new()),
            (Input::Relp, None) => ("imrelp", " queue.type=\"Direct\"", String::new()),
            (Input::Relp, Some(t)) => {
                let p = |f: &str| t.pki.join(f).to_str().unwrap().to_string();
                (
                    "imrelp",
                    " queue.type=\"Direct\"",
                    format!(
                        " tls=\"on\" tls.caCert=\"{}\" tls.myCert=\"{}\" tls.myPrivKey=\"{}\" \
                         tls.authMode=\"{}\"",
                        p("ca.pem"),
                        p("server.pem"),
                        p("server.key"),
                        t.auth_mode
                    ),
                )
            }
        };
        let conf = self.dir.join("rsyslog.conf");
        std::fs::write(
            &conf,
            format!(
                "global(workDirectory=\"{d}\" maxMessageSize=\"{RSYSLOG_MAX_MESSAGE}\"{global_tls})\n\
                 module(load=\"{module}\"{module_tls})\n\
                 template(name=\"raw\" type=\"string\" string=\"%rawmsg%\\n\")\n\
                 template(name=\"fields\" type=\"string\" string=\"%pri%|%syslogfacility%|\
                 %syslogseverity%|%protocol-version%|%timereported:::date-rfc3339%|%hostname%|\
                 %app-name%|%procid%|%msgid%|%structured-data%|%msg%\\n\")\n\
                 ruleset(name=\"out\"{queue}) {{\n\
                 action(type=\"omfile\" file=\"{}\" template=\"raw\" flushOnTXEnd=\"on\" \
                 asyncWriting=\"off\")\n\
                 action(type=\"omfile\" file=\"{}\" template=\"fields\" flushOnTXEnd=\"on\" \
                 asyncWriting=\"off\")\n}}\n\
                 input(type=\"{module}\" port=\"{}\" address=\"127.0.0.1\" ruleset=\"out\"{input_tls})\n",
                self.out().display(),
                self.fields().display(),
                self.port
            ),
        )
        .unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("rsyslogd.log"))
            .unwrap();
        // Debian puts it in /usr/sbin, which a user's PATH may lack.
        let program = if Path::new("/usr/sbin/rsyslogd").exists() {
            "/usr/sbin/rsyslogd"
        } else {
            "rsyslogd"
        };
        let child = Command::new(program)
            .arg("-n")
            .arg("-f")
            .arg(&conf)
            .arg("-i")
            .arg(self.dir.join("rsyslogd.pid"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect(
                "rsyslogd must be installed: scripts/test.sh installs it (apt-get install -y \
                 rsyslog rsyslog-gnutls rsyslog-relp)",
            );
        self.child = Some(child);
        let port = self.port;
        common::wait_until(
            common::lazy(|| {
                format!(
                    "rsyslogd listens on {port}; its output:\n{}",
                    common::log_from(&self.dir.join("rsyslogd.log"), 0)
                )
            }),
            Duration::from_secs(10),
            || TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
    }

    /// SIGTERM, waited for: rsyslogd closes its connections and exits.
    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            signal(c.id() as i32, "TERM");
            c.wait().unwrap();
        }
    }

    /// Stopped (SIGTERM) and started again on the same port, appending to the same file.
    fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Every message received so far, parsed (complete lines only).
    pub(super) fn received(&self) -> Vec<Syslog5424> {
        let text = std::fs::read_to_string(self.out()).unwrap_or_default();
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete.lines().map(parse_5424).collect()
    }

    pub(super) fn ids(&self) -> BTreeSet<String> {
        self.received().into_iter().map(|m| m.param("id")).collect()
    }
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An RFC 5424 message, split by a parser written here from the RFC's ABNF (section 6),
/// independently of the sink's writer.
#[derive(Debug)]
pub(super) struct Syslog5424 {
    pri: u16,
    version: String,
    timestamp: String,
    hostname: String,
    app_name: String,
    procid: String,
    msgid: String,
    sd_id: String,
    params: Vec<(String, String)>,
    msg: String,
}

impl Syslog5424 {
    pub(super) fn param(&self, name: &str) -> String {
        let mut found = self.params.iter().filter(|(n, _)| n == name);
        let (_, v) = found
            .next()
            .unwrap_or_else(|| panic!("no {name} in {self:?}"));
        assert!(found.next().is_none(), "{name} twice in {self:?}");
        v.clone()
    }
}

fn parse_5424(line: &str) -> Syslog5424 {
    let bad = |why: &str| -> ! { panic!("not an RFC 5424 message ({why}): {line:?}") };
    let rest = line.strip_prefix('<').unwrap_or_else(|| bad("no PRI"));
    let (pri, rest) = rest.split_once('>').unwrap_or_else(|| bad("PRI"));
    let pri: u16 = pri.parse().unwrap_or_else(|_| bad("PRI value"));
    assert!(pri <= 191, "PRI {pri}");
    let mut head = rest.splitn(7, ' ');
    let mut next = |what: &str| head.next().unwrap_or_else(|| bad(what)).to_string();
    let (version, timestamp, hostname, app_name, procid, msgid) = (
        next("VERSION"),
        next("TIMESTAMP"),
        next("HOSTNAME"),
        next("APP-NAME"),
        next("PROCID"),
        next("MSGID"),
    );
    let sd = next("STRUCTURED-DATA");
    let mut chars = sd.char_indices().peekable();
    assert_eq!(chars.next().map(|c| c.1), Some('['), "{line}");
    let mut sd_id = String::new();
    while let Some((_, c)) = chars.next_if(|(_, c)| *c != ' ' && *c != ']') {
        sd_id.push(c);
    }
    let mut params = Vec::new();
    loop {
        match chars.next() {
            Some((_, ']')) => break,
            Some((_, ' ')) => {}
            other => bad(&format!("SD-PARAM separator, found {other:?}")),
        }
        let mut name = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| *c != '=') {
            assert!(c.is_ascii_graphic() && c != ']' && c != '"', "{line}");
            name.push(c);
        }
        assert_eq!(chars.next().map(|c| c.1), Some('='), "{line}");
        assert_eq!(chars.next().map(|c| c.1), Some('"'), "{line}");
        let mut value = String::new();
        loop {
            match chars.next().map(|c| c.1) {
                Some('\\') => {
                    let c = chars.next().unwrap_or_else(|| bad("escape")).1;
                    if !matches!(c, '"' | '\\' | ']') {
                        value.push('\\');
                    }
                    value.push(c);
                }
                Some('"') => break,
                Some(']') => bad("an unescaped ']' in a PARAM-VALUE"),
                Some(c) => value.push(c),
                None => bad("unterminated PARAM-VALUE"),
            }
        }
        params.push((name, value));
    }
    let after = chars.next().map_or(sd.len(), |(i, _)| i);
    let msg = match sd[after..].strip_prefix(' ') {
        Some(m) => m.to_string(),
        None => bad("MSG after the structured data"),
    };
    Syslog5424 {
        pri,
        version,
        timestamp,
        hostname,
        app_name,
        procid,
        msgid,
        sd_id,
        params,
        msg,
    }
}

/// A database and a config with one syslog sink `siem` delivering to `url` (plus
/// `sink_extra`, one key per line: the place for a `stream`).
pub(super) struct Setup {
    pub(super) dir: PathBuf,
    pub(super) db: PathBuf,
    pub(super) config: PathBuf,
}

pub(super) fn setup(dir: &Path, url: &str, sink_extra: &str) -> Setup {
    let db = dir.join("rg.redb");
    let config = dir.join("rg.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\npath = {:?}\n[service]\nshutdown_timeout_seconds = 5\n\
             [[sink]]\nname = \"siem\"\nkind = \"syslog\"\nurl = {url:?}\n\
             backoff_initial_ms = 10\nbackoff_max_ms = 200\ntimeout_ms = 2000\n{sink_extra}\n",
            db.to_str().unwrap()
        ),
    )
    .unwrap();
    Setup {
        dir: dir.to_path_buf(),
        db,
        config,
    }
}

impl Setup {
    pub(super) fn ingest(&self, from: u64, to: u64) {
        let lines: Vec<String> = (from..to)
            .map(|i| common::msg("fire", &format!("e{}", i % 5), 1, i, "status"))
            .collect();
        let file = self.dir.join(format!("feed-{from}.jsonl"));
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        stdout(&common::run(&[
            "ingest",
            "--config",
            self.config.to_str().unwrap(),
            file.to_str().unwrap(),
        ]));
    }

    pub(super) fn relay(&self) -> Child {
        common::logged_command(
            &["relay", "--config", self.config.to_str().unwrap()],
            &self.dir.join("relay.log"),
        )
        .spawn()
        .unwrap()
    }

    pub(super) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("relay.log")).unwrap_or_default()
    }

    /// `relay status` of the sink, as JSON.
    pub(super) fn status(&self) -> Json {
        let out = stdout(&common::run(&[
            "relay",
            "status",
            "--config",
            self.config.to_str().unwrap(),
            "--format",
            "json",
        ]));
        let doc = json::parse(out.trim().as_bytes(), 64).unwrap();
        let Json::Object(m) = doc else { panic!() };
        let Json::Array(sinks) = &m[0].1 else {
            panic!()
        };
        sinks
            .iter()
            .find(|s| field(s, "sink") == "siem")
            .cloned()
            .unwrap()
    }

    /// Every effect's id, with its effect, by id.
    pub(super) fn effects(&self) -> BTreeMap<String, replay_guard::store::Effect> {
        common::effects(&self.db)
            .into_iter()
            .map(|e| {
                let r = &e.record;
                (envelope::event_id(&r.key, r.released, &r.payload), e)
            })
            .collect()
    }

    pub(super) fn wait_all(&self, rsyslog: &Rsyslog, n: usize, limit: Duration) {
        common::wait_until(
            common::lazy(|| {
                format!(
                    "{n} ids arrive (now {}); relay log:\n{}\nrsyslogd:\n{}",
                    rsyslog.ids().len(),
                    self.log(),
                    common::log_from(&rsyslog.dir.join("rsyslogd.log"), 0)
                )
            }),
            limit,
            || rsyslog.ids().len() >= n,
        );
    }
}

/// Each received message is the event of its effect: RFC 5424 version 1, APP-NAME, MSGID
/// the outcome, PRI from `facility` and the outcome's severity, the decision's time, the
/// SD-ID and every field, and the CloudEvents line (same id) as MSG; and no id but the
/// effects' arrived.
pub(super) fn assert_messages_are_the_effects(
    s: &Setup,
    got: &[Syslog5424],
    facility: u16,
    host: &str,
) {
    let effects = s.effects();
    for m in got {
        let id = m.param("id");
        let e = effects
            .get(&id)
            .unwrap_or_else(|| panic!("id {id} is no effect's: {m:?}"));
        let r = &e.record;
        assert_eq!(m.version, "1");
        assert_eq!(m.pri, facility * 8 + 6, "{m:?}");
        assert_eq!(m.app_name, "replay-guard");
        assert_eq!(m.hostname, host);
        assert!(
            !m.procid.is_empty() && m.procid.bytes().all(|b| b.is_ascii_digit()),
            "{m:?}"
        );
        assert_eq!(m.msgid, "applied");
        assert_eq!(m.sd_id, "decision@32473");
        assert_eq!(
            m.timestamp,
            replay_guard::timefmt::rfc3339_ms(r.received_at_ms)
        );
        let names: Vec<&str> = m.params.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "id",
                "key",
                "source",
                "sequence",
                "epoch",
                "outcome",
                "effect_offset"
            ]
        );
        assert_eq!(m.param("key"), replay_guard::model::hex(&r.key));
        assert_eq!(m.param("source"), format!("{}/{}", r.agency, r.source_id));
        assert_eq!(m.param("sequence"), r.sequence.to_string());
        assert_eq!(m.param("epoch"), r.epoch.to_string());
        assert_eq!(m.param("outcome"), "applied");
        assert_eq!(m.param("effect_offset"), e.offset.to_string());
        let ce = json::parse(m.msg.as_bytes(), 64)
            .unwrap_or_else(|e| panic!("MSG is not the JSON line ({e}): {:?}", m.msg));
        assert_eq!(field(&ce, "id"), id);
        assert_eq!(field(&ce, "rgoffset"), e.offset.to_string());
    }
}

#[test]
fn every_event_arrives_as_an_rfc5424_message_parsed_back_field_by_field() {
    let dir = tempfile::tempdir().unwrap();
    let rsyslog = Rsyslog::start(&dir.path().join("rsyslog"), None);
    let s = setup(
        dir.path(),
        &format!("tcp://127.0.0.1:{}", rsyslog.port),
        "hostname = \"eoc-1.example\"\nfacility = \"local3\"\nbatch_max = 7",
    );
    s.ingest(0, 40);
    let mut relay = s.relay();
    s.wait_all(&rsyslog, 40, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
    let got = rsyslog.received();
    assert_eq!(got.len(), 40, "each event once: {got:?}");
    assert_messages_are_the_effects(&s, &got, 19, "eoc-1.example");
    // rsyslog's own RFC 5424 parser reads every field as the test's parser does.
    let parsed = rsyslog.parsed_by_rsyslog();
    assert_eq!(parsed.len(), 40);
    for (m, p) in got.iter().zip(&parsed) {
        let sd = format!(
            "[{}{}]",
            m.sd_id,
            m.params
                .iter()
                .map(|(n, v)| format!(
                    " {n}=\"{}\"",
                    v.replace('\\', "\\\\")
                        .replace('"', "\\\"")
                        .replace(']', "\\]")
                ))
                .collect::<String>()
        );
        let want = [
            m.pri.to_string(),
            "19".into(),
            "6".into(),
            m.version.clone(),
            m.timestamp.clone(),
            m.hostname.clone(),
            m.app_name.clone(),
            m.procid.clone(),
            m.msgid.clone(),
            sd,
            m.msg.clone(),
        ];
        assert_eq!(p.as_slice(), want.as_slice());
    }
    assert_eq!(rsyslog.ids(), s.effects().keys().cloned().collect());
    let st = s.status();
    assert_eq!(field(&st, "kind"), "syslog");
    assert_eq!(field(&st, "cursor"), "40");
    assert_eq!(field(&st, "delivered"), "40");
}

#[test]
fn kill_9_of_the_relay_and_a_restart_of_rsyslog_mid_stream_lose_no_event() {
    let dir = tempfile::tempdir().unwrap();
    // Over RELP: a receiver restarted (SIGTERM) with a batch in its socket unread loses it
    // over tcp://, where delivered means written to the socket (`relay_relp` shows that);
    // over RELP nothing it did not answer counts. One message in flight at a time, and 60,000
    // events (some 4 s), so that the kills and the restart below land mid-stream.
    let mut rsyslog = Rsyslog::start_with(&dir.path().join("rsyslog"), None, Input::Relp);
    let s = setup(
        dir.path(),
        &format!("relp://127.0.0.1:{}", rsyslog.port),
        "batch_max = 10\nrelp_window = 1",
    );
    let total = 60_000;
    s.ingest(0, total as u64);
    let mut rng = common::SplitMix64::new(11);
    let mut mid = 0;
    for round in 0..6 {
        let before = rsyslog.ids().len();
        let mut relay = s.relay();
        // Killed while it sends: once this relay has delivered something, within a batch or
        // two of that.
        // (Or everything arrived: the kill is then not mid-stream, which `mid` says below.)
        common::wait_until(
            common::lazy(|| format!("the relay delivers more than {before}; log:\n{}", s.log())),
            Duration::from_secs(30),
            || rsyslog.ids().len() > before || before >= total,
        );
        std::thread::sleep(Duration::from_millis(rng.below(50)));
        if round == 3 {
            // The receiver goes away and comes back while the relay is sending.
            rsyslog.restart();
            std::thread::sleep(Duration::from_millis(100 + rng.below(200)));
        }
        if rsyslog.ids().len() < total {
            mid += 1;
        }
        relay.kill().unwrap();
        relay.wait().unwrap();
    }
    assert_eq!(mid, 6, "a kill landed after the last event");
    let mut relay = s.relay();
    s.wait_all(&rsyslog, total, Duration::from_secs(60));
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
    let got = rsyslog.received();
    // Every id arrived at least once, repeats carry the same id and content, and no other id.
    assert_messages_are_the_effects(&s, &got, 16, &replay_guard_host());
    assert_eq!(rsyslog.ids(), s.effects().keys().cloned().collect());
    assert!(got.len() >= total);
    // A kill re-sends at most what was answered since the cursor's last write (every 200 ms).
    assert!(
        got.len() < total + 6 * 10_000,
        "{} arrivals: more redelivery than the kills explain",
        got.len()
    );
    assert_eq!(field(&s.status(), "cursor"), total.to_string());
}

/// The HOSTNAME the sink sends by default: the kernel's host name, as `hostname` prints it.
pub(super) fn replay_guard_host() -> String {
    let out = Command::new("hostname").output().expect("hostname");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub(super) fn pki(dir: &Path, ca_name: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    super::tls::make_pki(dir, ca_name);
    dir.to_path_buf()
}

#[test]
fn tls_verifies_the_receiver_and_a_receiver_of_another_ca_is_refused_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let ours = pki(&dir.path().join("pki"), "rg-syslog-ca");
    let theirs = pki(&dir.path().join("other-pki"), "rg-other-ca");
    // A receiver that wants a client certificate of its CA (mutual TLS).
    let rsyslog = Rsyslog::start(
        &dir.path().join("rsyslog"),
        Some(RsyslogTls {
            pki: ours.clone(),
            auth_mode: "x509/certvalid",
        }),
    );
    let url = format!("tls://127.0.0.1:{}", rsyslog.port);
    let p = |d: &Path, f: &str| d.join(f).to_str().unwrap().to_string();
    let s = setup(
        dir.path(),
        &url,
        &format!(
            "ca_file = {:?}\nclient_cert_file = {:?}\nclient_key_file = {:?}",
            p(&ours, "ca.pem"),
            p(&ours, "client.pem"),
            p(&ours, "client.key")
        ),
    );
    s.ingest(0, 25);
    let mut relay = s.relay();
    s.wait_all(&rsyslog, 25, Duration::from_secs(30));
    assert_eq!(stop(&mut relay), Some(0), "{}", s.log());
    let got = rsyslog.received();
    assert_eq!(got.len(), 25);
    assert_messages_are_the_effects(&s, &got, 16, &replay_guard_host());

    // A sink trusting another CA: the handshake fails, nothing is sent, and `relay status`
    // says why.
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let refused = setup(
        &other,
        &url,
        &format!("ca_file = {:?}", p(&theirs, "ca.pem")),
    );
    refused.ingest(0, 5);
    let mut relay = refused.relay();
    common::wait_until(
        common::lazy(|| format!("the refusal is on record; log:\n{}", refused.log())),
        Duration::from_secs(20),
        || {
            refused
                .status()
                .to_compact()
                .contains("certificate was refused")
        },
    );
    let st = refused.status();
    let error = field(&st, "last_error");
    assert!(
        error.contains(&format!("TLS handshake with {url}")) && error.contains("ca_file"),
        "{error}"
    );
    assert_eq!(field(&st, "cursor"), "0");
    assert_eq!(stop(&mut relay), Some(0), "{}", refused.log());

    // A sink without a client certificate: the receiver ends the connection after the
    // handshake (TLS 1.3 lets the client finish first), nothing counts, and the error says
    // what to check.
    let anonymous = dir.path().join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    let unknown = setup(
        &anonymous,
        &url,
        &format!("ca_file = {:?}", p(&ours, "ca.pem")),
    );
    unknown.ingest(0, 5);
    let mut relay = unknown.relay();
    common::wait_until(
        common::lazy(|| format!("a failure is on record; log:\n{}", unknown.log())),
        Duration::from_secs(20),
        || {
            let st = unknown.status();
            field(&st, "state") == "retrying" && field(&st, "last_error").contains(&url)
        },
    );
    let st = unknown.status();
    let error = field(&st, "last_error");
    // Usually seen as the TLS connection's end (hence the hint); a write can meet the reset
    // first, which names the connection's failure instead.
    assert!(
        error.contains("client_cert_file") || error.contains(&format!("writing to {url}")),
        "{error}"
    );
    assert_eq!(field(&st, "cursor"), "0");
    assert_eq!(stop(&mut relay), Some(0), "{}", unknown.log());
    assert_eq!(rsyslog.received().len(), 25, "nothing more arrived");
}

fn event(i: u64) -> Event {
    let key = replay_guard::key::sha256(&[&i.to_le_bytes()]);
    let payload = common::msg("fire", "e1", 1, i, "x");
    let view = envelope::EffectView {
        offset: i,
        key: &key,
        agency: "fire",
        source_id: "e1",
        epoch: 1,
        sequence: i,
        received_at_ms: 1_780_000_000_000 + i,
        late: false,
        released: false,
        payload: payload.as_bytes(),
    };
    let (outcome, fields) = envelope::effect_fields(&view);
    Event {
        offset: i,
        id: envelope::event_id(&key, false, payload.as_bytes()),
        key,
        agency: "fire".into(),
        source_id: "e1".into(),
        topic: "incidents/fire".into(),
        json: envelope::envelope("urn:replay-guard:test", &view),
        outcome,
        fields,
    }
}

fn syslog_sink(port: u16, settle_ms: u64) -> Sink {
    let cfg = Config::parse(&format!(
        "[[sink]]\nname = \"siem\"\nkind = \"syslog\"\nurl = \"tcp://127.0.0.1:{port}\"\n\
         settle_ms = {settle_ms}\ntimeout_ms = 2000\n"
    ))
    .unwrap();
    Sink::new(cfg.relay.sink("siem").unwrap()).unwrap()
}

const CURSOR: CursorAfter = CursorAfter {
    store: [7; 16],
    generation: 1,
    next_after: 3,
};

/// A receiver (a plain listener in the test) that reads everything of each of two connections
/// for `keep_open`, then closes it, saying so on the channel; how many bytes each brought.
fn closing_receiver(
    keep_open: Duration,
) -> (
    u16,
    std::thread::JoinHandle<Vec<usize>>,
    std::sync::mpsc::Receiver<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, closed) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let mut sizes = Vec::new();
        for _ in 0..2 {
            let (mut c, _) = listener.accept().unwrap();
            c.set_read_timeout(Some(keep_open)).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            sizes.push(got.len());
            drop(c);
            let _ = tx.send(());
        }
        sizes
    });
    (port, h, closed)
}

#[test]
fn a_batch_is_counted_only_if_the_connection_outlives_the_settle_period() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let batch: Vec<Event> = (0..3).map(event).collect();
    // Closed 50 ms after the batch arrived, inside a settle period of 2 s: not delivered,
    // every event of it is retried, naming the cause; the next attempt goes on a new
    // connection.
    let (port, receiver, _closed) = closing_receiver(Duration::from_millis(50));
    let mut sink = syslog_sink(port, 2000);
    let first = rt.block_on(sink.deliver(&batch, CURSOR));
    assert_eq!(first.delivered, 0, "{first:?}");
    match &first.failure {
        Some(Failure::Retry { error, .. }) => assert!(
            error.contains("the receiver closed the connection before the batch settled"),
            "{error}"
        ),
        other => panic!("{other:?}"),
    }
    // Closed 50 ms after, with a settle period of 10 ms: delivered, on a second connection.
    let mut sink_short = syslog_sink(port, 10);
    let second = rt.block_on(sink_short.deliver(&batch, CURSOR));
    assert_eq!(second.delivered, 3, "{second:?}");
    assert!(second.failure.is_none());
    let sizes = receiver.join().unwrap();
    assert_eq!(sizes.len(), 2);
    assert_eq!(sizes[0], sizes[1], "the same bytes both times");
    assert!(sizes[0] > 3 * 300, "{sizes:?}");
}

#[test]
fn an_idle_connection_the_receiver_closed_is_replaced_without_a_failure() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let batch: Vec<Event> = (0..3).map(event).collect();
    // Each connection read for 50 ms, then closed by the receiver (a restart, say).
    let (port, receiver, closed) = closing_receiver(Duration::from_millis(50));
    let mut sink = syslog_sink(port, 10);
    let first = rt.block_on(sink.deliver(&batch, CURSOR));
    assert_eq!(first.delivered, 3, "{first:?}");
    closed.recv_timeout(Duration::from_secs(10)).unwrap();
    // The next batch goes on a new connection at once: no failed attempt, no backoff.
    let second = rt.block_on(sink.deliver(&batch, CURSOR));
    assert_eq!(second.delivered, 3, "{second:?}");
    assert!(second.failure.is_none());
    let sizes = receiver.join().unwrap();
    assert_eq!(sizes.len(), 2);
    assert_eq!(sizes[0], sizes[1]);
}

#[test]
fn a_receiver_that_stops_reading_gets_the_batch_again_after_timeout_ms() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Accepts and never reads: its receive window fills, and the rest of the batch stays
    // unacknowledged in the sender's queue (or unwritten).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let stalled = std::thread::spawn(move || {
        let (c, _) = listener.accept().unwrap();
        let _ = wait.recv();
        drop(c);
    });
    let mut batch: Vec<Event> = (0..64).map(event).collect();
    for e in &mut batch {
        // 32 KiB of padding each, 2 MiB in all.
        e.json = format!("{}{}", e.json, " ".repeat(32 * 1024));
    }
    let cfg = Config::parse(&format!(
        "[[sink]]\nname = \"siem\"\nkind = \"syslog\"\nurl = \"tcp://127.0.0.1:{port}\"\n\
         timeout_ms = 500\n"
    ))
    .unwrap();
    let mut sink = Sink::new(cfg.relay.sink("siem").unwrap()).unwrap();
    let start = std::time::Instant::now();
    let a = rt.block_on(sink.deliver(&batch, CURSOR));
    let took = start.elapsed();
    assert_eq!(a.delivered, 0, "{a:?}");
    match &a.failure {
        Some(Failure::Retry { error, .. }) => assert!(
            error.contains("still unacknowledged by the receiver's TCP after 500 ms")
                || error.contains("not written within 500 ms"),
            "{error}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(5),
        "{took:?}"
    );
    done.send(()).unwrap();
    stalled.join().unwrap();
}

#[test]
fn a_refused_connection_is_a_retry_naming_the_receiver() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let port = free_port();
    let mut sink = syslog_sink(port, 10);
    let a = rt.block_on(sink.deliver(&[event(0)], CURSOR));
    assert_eq!(a.delivered, 0);
    match a.failure {
        Some(Failure::Retry { error, .. }) => assert!(
            error.starts_with(&format!("connecting to tcp://127.0.0.1:{port}: ")),
            "{error}"
        ),
        other => panic!("{other:?}"),
    }
}

/// The audit log as `dump-audit --format jsonl` prints it, in index order.
fn audit_log(config: &Path) -> Vec<Json> {
    stdout(&common::run(&[
        "dump-audit",
        "--config",
        config.to_str().unwrap(),
        "--format",
        "jsonl",
    ]))
    .lines()
    .map(|l| json::parse(l.as_bytes(), 64).unwrap())
    .collect()
}

/// The severity a decision's message must carry: warning for what was quarantined, notice
/// for a duplicate and for an operator's action, informational for what was applied.
fn expected_severity(outcome: &str) -> u16 {
    match outcome {
        "conflict" | "stale" | "malformed" => 4,
        "duplicate" | "released" | "discarded" | "relay" => 5,
        "applied" | "applied_late" => 6,
        other => panic!("an outcome the test does not know: {other}"),
    }
}

/// The structured data an audit entry (a `dump-audit` line) must arrive with, in order:
/// the event id, then each value the entry has.
fn expected_params(entry: &Json) -> Vec<(String, String)> {
    let known = |name: &str| Some(field(entry, name)).filter(|v| v != "null");
    let mut p = vec![(
        "id".to_string(),
        format!("{}-{}", field(entry, "index"), &field(entry, "hash")[..16]),
    )];
    let mut push = |name: &str, v: Option<String>| {
        if let Some(v) = v {
            p.push((name.to_string(), v));
        }
    };
    push("key", known("key"));
    push(
        "source",
        known("agency")
            .zip(known("source_id"))
            .map(|(a, s)| format!("{a}/{s}")),
    );
    push("sequence", known("sequence"));
    push("epoch", known("epoch"));
    push("outcome", known("outcome"));
    push("reason", known("reason").filter(|r| !r.is_empty()));
    push("effect_offset", known("effect_offset"));
    push("entry_hash", known("hash"));
    p
}

/// What a receiver of an audit sink got (`got`, arrival order, repeats included) against the
/// audit log: exactly the entries `selected` keeps, each at least once; every arrival of an
/// id the same message (but PROCID, which names the sending process); each message is its
/// entry: MSGID the outcome, PRI `local0` × 8 + the outcome's severity, TIMESTAMP the
/// entry's time, the structured data its values, MSG the decision event whose `data` is the
/// `dump-audit` line; when every entry is selected, the chain links in MSG continuous over
/// the delivered ids. Returns the messages by index, first arrivals.
fn assert_audit_messages(
    got: &[Syslog5424],
    log: &[Json],
    selected: impl Fn(&str) -> bool,
) -> BTreeMap<u64, usize> {
    let by_id: BTreeMap<String, &Json> = log
        .iter()
        .filter(|e| selected(&field(e, "outcome")))
        .map(|e| (expected_params(e)[0].1.clone(), e))
        .collect();
    let mut first: BTreeMap<String, &Syslog5424> = BTreeMap::new();
    for m in got {
        let id = m.param("id");
        let entry = by_id
            .get(&id)
            .unwrap_or_else(|| panic!("id {id} is no selected entry's: {m:?}"));
        if let Some(before) = first.get(&id) {
            let same = |a: &Syslog5424| {
                (
                    a.pri,
                    a.timestamp.clone(),
                    a.msgid.clone(),
                    a.params.clone(),
                    a.msg.clone(),
                )
            };
            assert_eq!(same(before), same(m), "id {id} arrived with two contents");
            continue;
        }
        first.insert(id.clone(), m);
        let outcome = field(entry, "outcome");
        assert_eq!(m.version, "1");
        assert_eq!(m.app_name, "replay-guard");
        assert_eq!(m.msgid, outcome, "MSGID: {m:?}");
        assert_eq!(m.pri, 16 * 8 + expected_severity(&outcome), "PRI: {m:?}");
        assert_eq!(m.timestamp, field(entry, "recorded_at"));
        assert_eq!(m.sd_id, "decision@32473");
        assert_eq!(m.params, expected_params(entry), "structured data of {id}");
        let ce = json::parse(m.msg.as_bytes(), 64)
            .unwrap_or_else(|e| panic!("MSG is not the JSON line ({e}): {:?}", m.msg));
        assert_eq!(field(&ce, "id"), id);
        assert_eq!(field(&ce, "type"), "org.replay-guard.decision.v1");
        assert_eq!(field(&ce, "rgoutcome"), outcome);
        let Json::Object(members) = &ce else { panic!() };
        let data = &members.iter().find(|(k, _)| k == "data").unwrap().1;
        assert_eq!(data, *entry, "MSG's data is not the dump-audit line");
    }
    let missing: Vec<&String> = by_id.keys().filter(|id| !first.contains_key(*id)).collect();
    assert!(missing.is_empty(), "never arrived: {missing:?}");
    // The chain, as a receiver checks it from what it got: each entry's prev_hash is the hash
    // of the entry before it.
    let mut chain: Vec<(u64, String, String)> = first
        .values()
        .map(|m| {
            let ce = json::parse(m.msg.as_bytes(), 64).unwrap();
            let Json::Object(members) = &ce else { panic!() };
            let data = &members.iter().find(|(k, _)| k == "data").unwrap().1;
            (
                field(data, "index").parse().unwrap(),
                field(data, "prev_hash"),
                field(data, "hash"),
            )
        })
        .collect();
    chain.sort();
    if by_id.len() == log.len() {
        for w in chain.windows(2) {
            assert_eq!(w[1].0, w[0].0 + 1, "an index is missing after {}", w[0].0);
            assert_eq!(w[1].1, w[0].2, "chain broken before entry {}", w[1].0);
        }
    }
    chain
        .iter()
        .enumerate()
        .map(|(i, (index, ..))| (*index, i))
        .collect()
}

impl Setup {
    /// `run` with this config (which then has an `[mqtt]` section), its log afresh.
    fn run(&self) -> Child {
        Command::new(common::bin())
            .args(["run", "--config", self.config.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("relay.log")).unwrap())
            .spawn()
            .unwrap()
    }

    fn quarantine(&self, action: &str, id: &str, reason: &str) {
        stdout(&common::run(&[
            "quarantine",
            action,
            id,
            "--config",
            self.config.to_str().unwrap(),
            "--reason",
            reason,
            "--operator",
            "ana",
        ]));
    }
}

#[test]
fn run_sends_every_audit_entry_to_rsyslog_through_kill_9_and_a_restart_of_rsyslog() {
    let dir = tempfile::tempdir().unwrap();
    let broker = super::broker::Broker::start(&dir.path().join("broker"), false);
    // Over RELP, as the book recommends for the audit stream: over tcp:// a receiver restarted
    // with entries unread in its socket loses them (delivered there means written to it).
    let mut rsyslog = Rsyslog::start_with(&dir.path().join("rsyslog"), None, Input::Relp);
    // A second receiver, for a sink that selects duplicates and stale messages only.
    let picky = Rsyslog::start_with(&dir.path().join("rsyslog-picky"), None, Input::Relp);
    let s = setup(
        dir.path(),
        &format!("relp://127.0.0.1:{}", rsyslog.port),
        &format!(
            "stream = \"audit\"\nbatch_max = 5\nrelp_window = 1\n\
             [[sink]]\nname = \"picky\"\nkind = \"syslog\"\nurl = \"relp://127.0.0.1:{}\"\n\
             stream = \"audit\"\noutcomes = [\"duplicate\", \"stale\"]\n\
             backoff_initial_ms = 10\nbackoff_max_ms = 200\ntimeout_ms = 2000\n\
             [window]\nout_of_order = \"quarantine\"\n{}",
            picky.port,
            super::relay::mqtt_section(&broker, "rg-syslog-audit")
        ),
    );
    // 200 messages but sequence 100 (applied), replays of the first 40 (duplicates), a
    // conflict, sequence 100 late (stale, by policy), and two malformed ones: one not JSON,
    // one whose reason quotes a 12,000-byte member name, so that its message is larger than
    // rsyslog's default maxMessageSize (8 KiB).
    let mut lines: Vec<String> = (0..200)
        .filter(|i| *i != 100)
        .map(|i| common::msg("ems", &format!("m{}", i % 4), 1, i, "x"))
        .collect();
    lines.extend(lines[..40].to_vec());
    lines.push(common::msg("ems", "m0", 1, 0, "changed"));
    lines.push(common::msg("ems", "m0", 1, 100, "late"));
    lines.push("not json at all".into());
    let long = "n".repeat(12_000);
    lines.push(format!(r#"{{"{long}":1,"{long}":2}}"#));
    let decided = lines.len();
    // And the operator's two resolutions and one relay action.
    let total = decided + 3;
    let mut run = s.run();
    common::wait_subscribed(&s.dir.join("relay.log"), 0, "");
    broker.publish_lines("incidents/ems", &lines, "pub-syslog-audit");
    common::wait_until(
        common::lazy(|| format!("every message is decided; log:\n{}", s.log())),
        Duration::from_secs(30),
        || audit_log(&s.config).len() == decided,
    );
    // Read while `run` holds the store: after a kill -9 only a writer may open it.
    let decisions = audit_log(&s.config);
    let quarantined = |outcome: &str| {
        let e = decisions
            .iter()
            .find(|e| field(e, "outcome") == outcome)
            .unwrap();
        field(e, "quarantine_id")
    };
    // kill -9 once the sink has sent something, four times; while the service is down an
    // operator resolves the two quarantined messages, then rewinds the picky sink; the
    // receiver restarts in the third round. (The sink drains these 246 entries in less time
    // than a kill takes to land, so the kills may come after the last one was sent: kills
    // mid-stream are `kill_9_of_the_relay_and_a_restart_of_rsyslog_mid_stream_lose_no_event`'s.)
    let mut rng = common::SplitMix64::new(22);
    for round in 0..4 {
        let before = rsyslog.ids().len();
        // (Or every decision has arrived already.)
        common::wait_until(
            common::lazy(|| format!("the sink delivers more than {before}; log:\n{}", s.log())),
            Duration::from_secs(30),
            || rsyslog.ids().len() > before || before >= decided,
        );
        std::thread::sleep(Duration::from_millis(rng.below(250)));
        if round == 2 {
            rsyslog.restart();
            std::thread::sleep(Duration::from_millis(100 + rng.below(200)));
        }
        run.kill().unwrap();
        run.wait().unwrap();
        if round == 0 {
            s.quarantine("discard", &quarantined("conflict"), "a test's changed copy");
            s.quarantine("release", &quarantined("stale"), "unit m0 confirmed it");
        }
        if round == 1 {
            // A relay action: the picky sink sent again from the start (the same ids).
            stdout(&common::run(&[
                "relay",
                "rewind",
                "--config",
                s.config.to_str().unwrap(),
                "--sink",
                "picky",
                "--to",
                "0",
                "--reason",
                "the SIEM lost its index",
                "--operator",
                "ana",
            ]));
        }
        run = s.run();
    }
    s.wait_all(&rsyslog, total, Duration::from_secs(60));
    common::wait_until(
        "the picky receiver gets the duplicates and the stale message",
        Duration::from_secs(30),
        || picky.ids().len() >= 41,
    );
    // Everything may have arrived before the last `run` got going: a SIGTERM before it
    // handles signals would end it by the signal, not by its shutdown.
    common::wait_subscribed(&s.dir.join("relay.log"), 0, "");
    assert_eq!(stop(&mut run), Some(0), "{}", s.log());
    let log = audit_log(&s.config);
    assert_eq!(log.len(), total);
    let count = |o: &str| log.iter().filter(|e| field(e, "outcome") == o).count();
    assert_eq!(
        [
            "applied",
            "duplicate",
            "conflict",
            "stale",
            "malformed",
            "discarded",
            "released",
            "relay"
        ]
        .map(count),
        [199, 40, 1, 1, 2, 1, 1, 1]
    );
    let got = rsyslog.received();
    let firsts = assert_audit_messages(&got, &log, |_| true);
    assert_eq!(firsts.len(), total);
    // A kill re-sends at most what was delivered since the cursor's last flush (every 200 ms),
    // at most every entry once.
    assert!(
        got.len() <= total + 4 * total,
        "{} arrivals: more redelivery than the interrupted batches explain",
        got.len()
    );
    // The largest message arrived whole: its reason (twice) makes it larger than 8 KiB.
    let malformed = log
        .iter()
        .find(|e| field(e, "reason").contains(&long))
        .unwrap();
    let id = expected_params(malformed)[0].1.clone();
    let raw = std::fs::read_to_string(rsyslog.out()).unwrap();
    let big = raw.lines().find(|l| l.contains(&id)).unwrap();
    assert!(big.len() > 2 * 12_000, "{} bytes", big.len());
    let picked = |o: &str| o == "duplicate" || o == "stale";
    let picky_got = picky.received();
    assert_audit_messages(&picky_got, &log, picked);
    assert_eq!(picky.ids().len(), 41);
    let st = s.status();
    assert_eq!(field(&st, "cursor"), total.to_string());
    assert_eq!(field(&st, "stream"), "audit");
    stdout(&common::run(&[
        "verify",
        "--config",
        s.config.to_str().unwrap(),
    ]));
}
