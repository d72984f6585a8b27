//! Helpers shared by the integration tests.

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use replay_guard::store::{Effect, Reader};

/// The real binary built by cargo for this test run.
/// The README and every Markdown page of the book (docs/src, any depth).
pub fn doc_files() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_replay-guard"))
}

/// Runs the binary with `args` to completion.
pub fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("spawn replay-guard")
}

/// Runs the binary with `args` and `stdin` bytes to completion.
pub fn run_with_stdin(args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn replay-guard");
    let mut sin = child.stdin.take().unwrap();
    // A command that fails before reading its input (an unreachable server) closes the pipe:
    // what it printed and its exit code are the result, not this write.
    match sin.write_all(stdin) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        r => r.unwrap(),
    }
    drop(sin);
    child.wait_with_output().unwrap()
}

/// Waits for `child` (spawned with its stderr piped) to exit, at most `within`: its exit
/// status and what it wrote to stderr. Killed, and the test failed naming `what`, if it is
/// still running then.
pub fn exit_and_stderr(child: &mut Child, within: Duration, what: &str) -> (ExitStatus, String) {
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    (status, err)
}

/// The binary with `args`, logging at `info` (whatever RUST_LOG the suite runs under) to
/// `log`, appended, so that a restarted process's lines follow its predecessor's; stdout
/// discarded. The caller adds what else it needs and spawns it.
pub fn logged_command(args: &[&str], log: &Path) -> Command {
    logged_command_of(&bin(), args, log)
}

/// `logged_command` of another build of the binary.
pub fn logged_command_of(bin: &Path, args: &[&str], log: &Path) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log);
    cmd
}

/// How often `wait_until` and `assert_quiet` look.
const POLL: Duration = Duration::from_millis(20);

/// Waits until `cond` holds, looking every 20 ms; fails the test after `limit`, saying what it
/// waited for. `what` is formatted only then, so `lazy` can put a log read at that moment in.
/// The one wait of the suite: a test waits for what it needs to have happened, never a while.
pub fn wait_until(what: impl Display, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "waited {limit:?} in vain until {what}"
        );
        std::thread::sleep(POLL);
    }
}

/// Watches for `d` that `happened` stays false, looking every 20 ms, and fails the test the
/// moment it turns true: for the few places where a test must show that nothing happens for a
/// while (nothing redelivered, nothing decided without the server, no exit).
pub fn assert_quiet(what: impl Display, d: Duration, mut happened: impl FnMut() -> bool) {
    let start = Instant::now();
    loop {
        assert!(
            !happened(),
            "{what}, {:?} into a quiet period of {d:?}",
            start.elapsed()
        );
        let left = d.saturating_sub(start.elapsed());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(POLL.min(left));
    }
}

/// A failure message made only when it is shown: `lazy(|| format!("...:\n{}", log()))`.
pub struct Lazy<F>(F);

pub fn lazy<F: Fn() -> String>(f: F) -> Lazy<F> {
    Lazy(f)
}

impl<F: Fn() -> String> Display for Lazy<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&(self.0)())
    }
}

/// The file at `log`, from byte `from` on (empty while it is not there).
pub fn log_from(log: &Path, from: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.get(from..).unwrap_or_default().to_string()
}

/// Waits until `run`, logging to `log`, says after the log's first `from` bytes that `broker`
/// (any broker if empty) granted every filter of its SUBSCRIBE: the broker routes the topics
/// to it from then on, so what is published now reaches it.
pub fn wait_subscribed(log: &Path, from: usize, broker: &str) {
    let needle = format!("subscribed broker={broker}");
    wait_until(
        lazy(|| {
            format!(
                "{needle:?} is logged (a SUBACK granting every filter); log:\n{}",
                log_from(log, from)
            )
        }),
        Duration::from_secs(20),
        || log_from(log, from).contains(&needle),
    );
}

/// Every effect in the database, in offset order, read through a read-only handle.
pub fn effects(db: &Path) -> Vec<Effect> {
    let reader = Reader::open(db).unwrap();
    let txn = reader.begin().unwrap();
    let mut out = Vec::new();
    txn.scan_effects::<replay_guard::store::StoreError>(0, |e| {
        out.push(e);
        Ok(std::ops::ControlFlow::Continue(()))
    })
    .unwrap();
    out
}

/// The first character in `text` that a terminal would act on (other than a line end): a
/// control character, U+2028/U+2029 or a bidi embedding, override or isolate. Written out
/// here rather than taken from `textsafe`, so that the tests check the library against it.
pub fn terminal_control(text: &str) -> Option<char> {
    text.chars().find(|c| {
        *c != '\n'
            && *c != '\r'
            && (c.is_control()
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
                ))
    })
}

/// One feed-contract message as a JSON line.
pub fn msg(agency: &str, source: &str, epoch: u64, seq: u64, body: &str) -> String {
    format!(
        r#"{{"agency":"{agency}","source_id":"{source}","epoch":{epoch},"sequence":{seq},"body":"{body}"}}"#
    )
}

/// splitmix64: a tiny deterministic PRNG for generated feeds and kill timings (no `rand`).
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0; the modulo bias is irrelevant here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// Uniform in `0.0..1.0`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// A generated feed and how many lines of each kind went into it.
#[derive(Debug, Default)]
pub struct GeneratedFeed {
    /// One payload per line, each line ending in `\n`; never a blank line.
    pub bytes: Vec<u8>,
    pub lines: usize,
    /// First deliveries of a position (in order or held back), i.e. distinct keys.
    pub distinct_keys: usize,
    pub held_back: usize,
    pub exact_replays: usize,
    pub reserialised: usize,
    pub conflicting: usize,
    pub malformed: usize,
    pub epoch_bumps: usize,
}

/// One generated incident message, kept structured so it can be re-serialised.
#[derive(Clone, Debug)]
struct FeedMsg {
    agency: &'static str,
    source_id: &'static str,
    epoch: u64,
    omit_epoch: bool,
    sequence: u64,
    kind: &'static str,
    incident: u64,
    units: Vec<u64>,
    delta: u64,
}

impl FeedMsg {
    /// (name, compact value, re-spelt value) of every member, in the producer's order.
    fn members(&self) -> Vec<(&'static str, String, String)> {
        let units = |sep: &str| {
            let u: Vec<String> = self.units.iter().map(u64::to_string).collect();
            format!("[{}]", u.join(sep))
        };
        let mut m = vec![
            (
                "agency",
                format!("\"{}\"", self.agency),
                format!("\"{}\"", self.agency),
            ),
            (
                "source_id",
                format!("\"{}\"", self.source_id),
                format!("\"{}\"", self.source_id),
            ),
        ];
        if !self.omit_epoch {
            m.push(("epoch", self.epoch.to_string(), self.epoch.to_string()));
        }
        m.push((
            "sequence",
            self.sequence.to_string(),
            self.sequence.to_string(),
        ));
        m.push((
            "type",
            format!("\"{}\"", self.kind),
            format!("\"{}\"", self.kind),
        ));
        m.push((
            "incident",
            format!(
                "{{\"id\":\"INC-{}\",\"units\":{}}}",
                self.incident,
                units(",")
            ),
            format!(
                "{{ \"units\" : {} , \"id\" : \"INC-{}\" }}",
                units(", "),
                self.incident
            ),
        ));
        // `delta` is spelt `3` by the producer and `3.0` / `30e-1` by a re-serialising relay:
        // the same JSON number, so the same canonical digest.
        m.push(("delta", self.delta.to_string(), format!("{}.0", self.delta)));
        m
    }

    fn compact(&self) -> String {
        let parts: Vec<String> = self
            .members()
            .into_iter()
            .map(|(k, v, _)| format!("\"{k}\":{v}"))
            .collect();
        format!("{{{}}}", parts.join(","))
    }

    /// The same object with shuffled member order, other spacing and number spelling.
    fn reserialised(&self, rng: &mut SplitMix64) -> String {
        let mut members = self.members();
        for i in (1..members.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            members.swap(i, j);
        }
        let spaces = [" ", "  ", "\t", ""];
        let parts: Vec<String> = members
            .into_iter()
            .map(|(k, _, v)| {
                format!(
                    "{}\"{k}\"{}:{}{v}",
                    rng.pick(&spaces),
                    rng.pick(&spaces),
                    rng.pick(&spaces)
                )
            })
            .collect();
        format!("{{{} }}", parts.join(","))
    }
}

/// A deterministic feed of `lines` lines from `seed`: 12 sources over 4 agencies with increasing
/// sequences and occasional epoch bumps, ~10% exact replays of earlier lines, ~3% re-serialised
/// resends, ~0.5% held-back (late) deliveries, a few same-key-other-content conflicts and ~0.5%
/// malformed lines.
pub fn generate_feed(seed: u64, lines: usize) -> GeneratedFeed {
    const SOURCES: [(&str, &str); 12] = [
        ("CALFIRE", "E7-AVL"),
        ("CALFIRE", "IC-4471"),
        ("CALFIRE", "T12"),
        ("LAFD", "E33"),
        ("LAFD", "RA-9"),
        ("LAFD", "B4"),
        ("SACCO-EMS", "M12"),
        ("SACCO-EMS", "M14"),
        ("SACCO-EMS", "dispatch"),
        ("Cal Fire/ÉMS", "engine 7"),
        ("Cal Fire/ÉMS", "engine 8"),
        ("Cal Fire/ÉMS", "air/1"),
    ];
    const KINDS: [&str; 4] = ["unit_status", "casualty_delta", "dispatch", "note"];
    let mut rng = SplitMix64::new(seed);
    let mut feed = GeneratedFeed::default();
    // Per source: (epoch, next sequence).
    let mut cursor: Vec<(u64, u64)> = (0..SOURCES.len())
        .map(|_| (rng.below(4), 1 + rng.below(1000)))
        .collect();
    let mut sent: Vec<FeedMsg> = Vec::new();
    let mut sent_lines: Vec<String> = Vec::new();
    let mut held: Vec<FeedMsg> = Vec::new();
    let push = |feed: &mut GeneratedFeed, line: &[u8]| {
        assert!(!line.contains(&b'\n'));
        feed.bytes.extend_from_slice(line);
        feed.bytes.push(b'\n');
        feed.lines += 1;
    };
    let mut fresh = |rng: &mut SplitMix64, feed: &mut GeneratedFeed| {
        let s = rng.below(SOURCES.len() as u64) as usize;
        if rng.below(1000) < 2 {
            cursor[s] = (cursor[s].0 + 1, rng.below(3));
            feed.epoch_bumps += 1;
        }
        let (epoch, sequence) = cursor[s];
        cursor[s].1 += 1;
        let units = (0..rng.below(4)).map(|_| rng.below(100)).collect();
        FeedMsg {
            agency: SOURCES[s].0,
            source_id: SOURCES[s].1,
            epoch,
            omit_epoch: epoch == 0 && rng.below(2) == 0,
            sequence,
            kind: KINDS[rng.below(KINDS.len() as u64) as usize],
            incident: 1000 + rng.below(9000),
            units,
            delta: rng.below(10),
        }
    };
    while feed.lines < lines {
        let roll = rng.below(1000);
        if roll < 100 && !sent_lines.is_empty() {
            // Exact replay of an earlier line, mostly a recent one.
            let back = 1 + rng.below(sent_lines.len().min(2000) as u64) as usize;
            let line = sent_lines[sent_lines.len() - back].clone();
            push(&mut feed, line.as_bytes());
            feed.exact_replays += 1;
        } else if roll < 130 && !sent.is_empty() {
            let m = sent[rng.below(sent.len() as u64) as usize].clone();
            push(&mut feed, m.reserialised(&mut rng).as_bytes());
            feed.reserialised += 1;
        } else if roll < 135 && !sent.is_empty() {
            // Same key as an earlier message, other content: quarantined as a conflict.
            let mut m = sent[rng.below(sent.len() as u64) as usize].clone();
            m.delta += 10;
            push(&mut feed, m.compact().as_bytes());
            feed.conflicting += 1;
        } else if roll < 140 {
            let m = malformed(&mut rng);
            push(&mut feed, &m);
            feed.malformed += 1;
        } else if roll < 145 {
            // Take a position now, deliver it later (below the high-water mark by then).
            held.push(fresh(&mut rng, &mut feed));
            feed.distinct_keys += 1;
            feed.held_back += 1;
        } else {
            let m = if roll < 160 && !held.is_empty() {
                held.swap_remove(rng.below(held.len() as u64) as usize)
            } else {
                feed.distinct_keys += 1;
                fresh(&mut rng, &mut feed)
            };
            let line = m.compact();
            push(&mut feed, line.as_bytes());
            sent.push(m);
            sent_lines.push(line);
        }
    }
    // Positions still held back were never delivered.
    feed.distinct_keys -= held.len();
    feed.held_back -= held.len();
    feed
}

/// One line that fails the feed contract, of one of several kinds.
fn malformed(rng: &mut SplitMix64) -> Vec<u8> {
    let n = rng.below(100_000);
    let line = match rng.below(8) {
        0 => format!(r#"{{"agency":"CALFIRE","source_id":"E7-AVL","sequence":{n},"type":"#),
        1 => format!(r#"{{"agency":"CALFIRE","source_id":"E7-AVL","type":"note","n":{n}}}"#),
        2 => format!(r#"{{"agency":"LAFD","source_id":"E33","sequence":-{n}}}"#),
        3 => format!(r#"{{"agency":"LAFD","source_id":"E33","sequence":{n}.5}}"#),
        4 => format!(r#"{{"agency":"LAFD","source_id":"E33","sequence":"{n}"}}"#),
        5 => format!("[{n},{n}]"),
        6 => format!(r#"{{"agency":"A","agency":"B","source_id":"S","sequence":{n}}}"#),
        _ => {
            let mut b =
                format!(r#"{{"agency":"LAFD","source_id":"E33","sequence":{n},"x":""#).into_bytes();
            b.extend_from_slice(b"\xff\xfe\"}");
            return b;
        }
    };
    line.into_bytes()
}
