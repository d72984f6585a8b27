//! The relay's model test through the real binary (issue 20, "proof beyond the cases above"):
//! seeded random interleavings of `ingest` batches (several sources, replays of earlier
//! lines), `kill -9` and SIGTERM of standalone relays, `run` fed through a private Mosquitto
//! and killed with -9 while its sinks deliver, `relay rewind` (within bounds, and refused
//! above the cursor), parks (an exec receiver exiting 65 and an http receiver answering 422
//! for tags the test refuses; refusals of two sources one after the other block the sink
//! instead, and the checkpoint then fixes the receiver) and `relay retry` once the receiver
//! is "fixed", `relay skip --yes`, a sink removed from the config and `relay forget`-ed, a
//! second store writing the same PostgreSQL schema under the same sink name (its own table,
//! or the same table), and a backup restored over the live file. Against exec, http and
//! postgres sinks. Timing is part of the input: `scripts/relay-model.sh --load` soaks it with
//! the CPUs busy.
//!
//! At every checkpoint, once each sink is caught up, through what the receivers saw: every
//! effect is at each live sink's receiver, parked, or in a range the model skipped (and the
//! audit log records each skip); a skipped event never arrives unless a rewind or a restore
//! went back over it; no id arrives with two contents, and every envelope is exactly the one
//! an effect makes; `verify` passes and its line for each sink is its accounting; and `relay
//! status`'s accounting, with no problem, is exact: `from + delivered + parked + retried +
//! skipped + adopted == cursor == head`; `parked` is what `relay parked` lists; `skipped` is
//! what the model skipped (its skips, cut back by later rewinds); and `delivered + retried +
//! adopted` is the number of effects in `from..cursor`, neither parked nor skipped, that the
//! receiver holds (exec and http: the exact envelope; postgres: the id, stored once).
//!
//! `RG_RELAY_MODEL_SEED=N` replays one seed, `RG_RELAY_MODEL_SEEDS=N` runs seeds 1..=N (from
//! `RG_RELAY_MODEL_FROM`, `RG_RELAY_MODEL_VERBOSE` prints passing seeds' step logs too),
//! `RG_RELAY_MODEL_STEPS=S` sets the steps per seed (`scripts/relay-model.sh` for a soak).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use replay_guard::json::{self, Json};
use replay_guard::relay::envelope::{self, EffectView};

use super::broker::Broker;
use super::common::{self, SplitMix64};
use super::pg::PgDb;
use super::relay::field;

/// Seeds and steps of the suite's run; the environment sets larger ones for a soak.
const SUITE_SEEDS: [u64; 3] = [1, 2, 3];
const SUITE_STEPS: usize = 40;
/// A checkpoint every this many steps, and one at the end.
const CHECK_EVERY: usize = 10;
/// Longest wait for anything the test waits on.
const PATIENCE: Duration = Duration::from_secs(60);

/// What a model's run of one seed reports: printed per seed, summed over seeds.
pub(super) trait SeedFigures: Default + std::fmt::Display {
    fn add(&mut self, other: &Self);
    fn set_seconds(&mut self, seconds: f64);
    /// Each kind of step the suite's seeds must go on making (the steps are a function of
    /// the seed), with how many the totals hold.
    fn coverage(&self) -> Vec<(&'static str, u64)>;
}

/// A model test's seeds (`name`, e.g. "relay model"; its environment's `prefix`, e.g.
/// `RG_RELAY_MODEL`; its test `filter`): `{prefix}_SEED=N` one seed, `{prefix}_SEEDS=N` N seeds
/// from `{prefix}_FROM` (default 1), or else the suite's; `{prefix}_STEPS` the steps per seed;
/// `{prefix}_VERBOSE` prints the step log of passing seeds too. Runs `model(seed, log, steps)`
/// for each and prints its figures; a failing seed prints its step log (which `model` writes
/// to `log` as it goes) and how to replay it, and fails the test. The suite's seeds must
/// make every kind of step the figures' `coverage` names.
pub(super) fn run_seeds<F: SeedFigures>(
    (name, prefix, filter): (&str, &str, &str),
    (suite_seeds, suite_steps): (&[u64], usize),
    model: impl Fn(u64, Arc<Mutex<Vec<String>>>, usize) -> F,
) {
    let var = |v: &str| {
        let name = format!("{prefix}_{v}");
        std::env::var(&name)
            .ok()
            .map(|v| v.parse::<u64>().unwrap_or_else(|_| panic!("{name}={v:?}")))
    };
    let from = var("FROM").unwrap_or(1);
    let (seeds, suite) = match (var("SEED"), var("SEEDS")) {
        (Some(one), _) => (vec![one], false),
        (None, Some(n)) => ((from..from + n).collect(), false),
        (None, None) => (suite_seeds.to_vec(), true),
    };
    let steps = var("STEPS").map_or(suite_steps, |s| s as usize);
    let verbose = std::env::var_os(format!("{prefix}_VERBOSE")).is_some();
    let mut total = F::default();
    for seed in seeds {
        let log = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            model(seed, log.clone(), steps)
        }));
        match outcome {
            Ok(mut f) => {
                f.set_seconds(started.elapsed().as_secs_f64());
                if verbose {
                    eprintln!("{}", log.lock().unwrap().join("\n"));
                }
                eprintln!("{name} seed {seed}: {f}");
                total.add(&f);
            }
            Err(panic) => {
                let steps_log = log.lock().map(|l| l.join("\n")).unwrap_or_default();
                eprintln!(
                    "{name} seed {seed} FAILED after {:.1} s; step log:\n{steps_log}\n\
                     replay: {prefix}_SEED={seed} {prefix}_STEPS={steps} cargo test \
                     --release --locked --test it {filter} -- --nocapture",
                    started.elapsed().as_secs_f64()
                );
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("{name} total: {total}");
    if suite {
        for (what, n) in total.coverage() {
            assert!(
                n > 0,
                "the suite's seeds {suite_seeds:?} no longer make {what}: {total}"
            );
        }
    }
}

#[test]
fn random_relay_steps_lose_no_effect_and_never_give_an_id_two_contents() {
    run_seeds(
        ("relay model", "RG_RELAY_MODEL", "relay_model::"),
        (&SUITE_SEEDS, SUITE_STEPS),
        |seed, log, steps| Model::new(seed, log).run(steps),
    );
}

/// What one seed did and saw.
#[derive(Clone, Debug, Default)]
struct Figures {
    seeds: u64,
    steps: u64,
    effects: u64,
    kills: u64,
    run_kills: u64,
    parked: u64,
    retries: u64,
    skips: u64,
    skipped: u64,
    rewinds: u64,
    /// Rewinds to an offset inside a range a skip had passed over (cut back, not removed).
    into_skips: u64,
    refused_rewinds: u64,
    restores: u64,
    forgets: u64,
    /// Sinks found blocked at a checkpoint (two sources refused one after the other) whose
    /// receiver the model fixed.
    unblocks: u64,
    deliveries: u64,
    duplicates: u64,
    /// Offsets a postgres sink passed over as found in its table (its own cursor adopted).
    adopted: u64,
    checkpoints: u64,
    seconds: f64,
}

impl SeedFigures for Figures {
    fn set_seconds(&mut self, seconds: f64) {
        self.seconds = seconds;
    }

    fn coverage(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("a kill -9 of a relay", self.kills - self.run_kills),
            ("a kill -9 of run", self.run_kills),
            ("a park", self.parked),
            ("a retry", self.retries),
            ("a skip", self.skips),
            ("a rewind into a skipped range", self.into_skips),
            ("a rewind refused above the cursor", self.refused_rewinds),
            ("a restore", self.restores),
            ("a forget", self.forgets),
            ("a repeat at a receiver", self.duplicates),
        ]
    }

    fn add(&mut self, o: &Figures) {
        self.seeds += 1;
        self.steps += o.steps;
        self.effects += o.effects;
        self.kills += o.kills;
        self.run_kills += o.run_kills;
        self.parked += o.parked;
        self.retries += o.retries;
        self.skips += o.skips;
        self.skipped += o.skipped;
        self.rewinds += o.rewinds;
        self.into_skips += o.into_skips;
        self.refused_rewinds += o.refused_rewinds;
        self.restores += o.restores;
        self.forgets += o.forgets;
        self.unblocks += o.unblocks;
        self.deliveries += o.deliveries;
        self.duplicates += o.duplicates;
        self.adopted += o.adopted;
        self.checkpoints += o.checkpoints;
        self.seconds += o.seconds;
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.seeds > 0 {
            write!(f, "{} seeds, ", self.seeds)?;
        }
        write!(
            f,
            "{} steps, {} effects, {} kills -9 ({} of run), {} events parked, {} retries, {} \
             skips ({} effects), {} rewinds ({} into a skipped range; +{} refused above the \
             cursor), {} restores, {} forgets, {} blocked sinks fixed, {} deliveries seen, {} of them repeats, {} adopted from a postgres sink's own cursor, {} checkpoints, \
             {:.1} s",
            self.steps,
            self.effects,
            self.kills,
            self.run_kills,
            self.parked,
            self.retries,
            self.skips,
            self.skipped,
            self.rewinds,
            self.into_skips,
            self.refused_rewinds,
            self.restores,
            self.forgets,
            self.unblocks,
            self.deliveries,
            self.duplicates,
            self.adopted,
            self.checkpoints,
            self.seconds
        )
    }
}

/// `replay-guard ARGS`: (exit code, stdout, stderr).
pub(super) fn rg(args: &[&str]) -> (Option<i32>, String, String) {
    let out = common::run(args);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `common::wait_until` with the model's patience.
pub(super) fn wait_for(what: &str, f: impl FnMut() -> bool) {
    common::wait_until(what, PATIENCE, f);
}

/// A JSON value with every object's members sorted (jsonb reorders them).
fn canonical(v: &Json) -> String {
    fn sorted(v: &Json) -> Json {
        match v {
            Json::Object(m) => {
                let mut m: Vec<(String, Json)> =
                    m.iter().map(|(k, v)| (k.clone(), sorted(v))).collect();
                m.sort_by(|a, b| a.0.cmp(&b.0));
                Json::Object(m)
            }
            Json::Array(a) => Json::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_compact()
}

pub(super) fn parse(text: &str) -> Json {
    json::parse(text.as_bytes(), 64).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The `data` member of an envelope, canonical.
fn data_of(envelope: &Json) -> String {
    match envelope {
        Json::Object(m) => canonical(
            &m.iter()
                .find(|(k, _)| k == "data")
                .unwrap_or_else(|| panic!("no data in {}", envelope.to_compact()))
                .1,
        ),
        other => panic!("not an object: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------
// Processes

/// A child in a process group of its own, so that a kill -9 takes the exec sink's programs
/// with it (as systemd's control group would): killed and waited for when dropped.
pub(super) struct Group {
    child: Child,
}

impl Group {
    pub(super) fn spawn(mut cmd: Command) -> Group {
        cmd.process_group(0).stdin(Stdio::null());
        Group {
            child: cmd.spawn().expect("spawn replay-guard"),
        }
    }

    pub(super) fn pgid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// kill -9 of the whole group; returns once none of its processes runs any more.
    pub(super) fn kill9(mut self) {
        kill_group(self.pgid());
        let _ = self.child.wait();
        wait_group_gone(self.pgid());
    }

    /// SIGTERM to the process itself (its sinks drain), then its exit code.
    pub(super) fn term(mut self) -> Option<i32> {
        super::broker::signal(self.child.id() as i32, "TERM");
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no exit within 20 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        kill_group(self.pgid());
        wait_group_gone(self.pgid());
        status.code()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        kill_group(self.pgid());
        let _ = self.child.wait();
    }
}

fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

/// Waits until no live (non-zombie) process is in process group `pgid`. Orphans are
/// reparented to PID 1, which here may not reap them: zombies do not count.
fn wait_group_gone(pgid: u32) {
    let alive = || {
        std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                return false;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // "pid (comm) state ppid pgrp ...": comm may hold anything, so after the last ')'.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.len() > 2 && f[0] != "Z" && f[2] == pgid.to_string()
        })
    };
    wait_for(&format!("process group {pgid} gone"), || !alive());
}

// ---------------------------------------------------------------------------------------
// Receivers

/// The exec sink's receiver: a script that takes a batch whole (an incomplete one, written by
/// a relay killed mid-batch, it fails), refuses it with 65 when it holds a tag listed in its
/// rule file, and otherwise files it in its spool directory under the time it arrived
/// (renamed into place, so a kill never leaves half a batch).
struct ExecRx {
    spool: PathBuf,
    rule: PathBuf,
    script: PathBuf,
}

impl ExecRx {
    fn new(dir: &Path) -> ExecRx {
        let spool = dir.join("spool");
        std::fs::create_dir_all(&spool).unwrap();
        let rule = dir.join("rule");
        std::fs::write(&rule, "").unwrap();
        let script = dir.join("receiver.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nSPOOL={:?}\nRULE={:?}\ntmp=\"$SPOOL/.in.$$\"\n\
                 cat > \"$tmp\" || exit 1\n\
                 if [ -s \"$tmp\" ] && [ -n \"$(tail -c 1 \"$tmp\")\" ]; then\n\
                 rm -f \"$tmp\"; echo 'incomplete batch' >&2; exit 1; fi\n\
                 if [ -s \"$RULE\" ] && grep -q -F -f \"$RULE\" \"$tmp\"; then\n\
                 rm -f \"$tmp\"; echo 'refused by the test rule' >&2; exit 65; fi\n\
                 mv \"$tmp\" \"$SPOOL/$(date +%s%N).$$\"\n",
                spool.to_str().unwrap(),
                rule.to_str().unwrap()
            ),
        )
        .unwrap();
        ExecRx {
            spool,
            rule,
            script,
        }
    }

    fn set_refused(&self, tags: &BTreeSet<String>) {
        let text: String = tags.iter().map(|t| format!("\"tag\":\"{t}\"\n")).collect();
        let tmp = self.rule.with_extension("new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.rule).unwrap();
    }

    /// Every event received, in arrival order.
    fn seen(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.spool)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
            .iter()
            .flat_map(|n| {
                std::fs::read_to_string(self.spool.join(n))
                    .unwrap()
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// The http sink's receiver (std threads, keep-alive HTTP/1.1): 422 for an event whose tag
/// the test refuses, 503 for about one request in 20 (seeded), else 200 and the body kept.
struct Web {
    addr: SocketAddr,
    shared: Arc<WebShared>,
}

struct WebShared {
    state: Mutex<WebState>,
    stop: AtomicBool,
}

struct WebState {
    accepted: Vec<String>,
    refused: BTreeSet<String>,
    rng: SplitMix64,
    /// Connections accepted and not yet finished.
    open: usize,
}

/// The `tag` member of an event's data.
fn tag_of(body: &str) -> Option<&str> {
    let at = body.find("\"tag\":\"")? + 7;
    let len = body[at..].find('"')?;
    Some(&body[at..at + len])
}

impl Web {
    fn start(seed: u64) -> Web {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(WebShared {
            state: Mutex::new(WebState {
                accepted: Vec::new(),
                refused: BTreeSet::new(),
                rng: SplitMix64::new(seed),
                open: 0,
            }),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                s.state.lock().unwrap().open += 1;
                let s = s.clone();
                std::thread::spawn(move || {
                    conn.set_read_timeout(Some(Duration::from_secs(30))).ok();
                    serve(conn, &s);
                    s.state.lock().unwrap().open -= 1;
                });
            }
        });
        Web { addr, shared }
    }

    fn url(&self) -> String {
        format!("http://{}/cop", self.addr)
    }

    fn seen(&self) -> Vec<String> {
        self.shared.state.lock().unwrap().accepted.clone()
    }

    fn set_refused(&self, tags: &BTreeSet<String>) {
        self.shared.state.lock().unwrap().refused = tags.clone();
    }

    /// Once the relay is gone: a probe connection, accepted after every connection the
    /// relay opened (one accept loop, in order), then every connection finished, so no
    /// request of the relay's is still to be logged.
    fn quiesce(&self) {
        let mut probe = TcpStream::connect(self.addr).unwrap();
        probe
            .write_all(b"POST /probe HTTP/1.1\r\nHost: probe\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(probe.read(&mut byte).unwrap(), 1, "probe answer cut short");
            head.push(byte[0]);
        }
        drop(probe);
        wait_for("the http receiver's connections finished", || {
            self.shared.state.lock().unwrap().open == 0
        });
    }
}

impl Drop for Web {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(stream: TcpStream, shared: &WebShared) {
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let target = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.trim().eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        let body = String::from_utf8(body).unwrap();
        let status = if target == "/probe" {
            200
        } else {
            let mut st = shared.state.lock().unwrap();
            if tag_of(&body).is_some_and(|t| st.refused.contains(t)) {
                422
            } else if st.rng.unit() < 0.05 {
                503
            } else {
                st.accepted.push(body);
                200
            }
        };
        let reason = match status {
            200 => "OK",
            422 => "Unprocessable Entity",
            _ => "Service Unavailable",
        };
        let answer = format!("HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\n\r\n");
        if w.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

enum Rx {
    Exec(ExecRx),
    Web(Web),
    /// The postgres sink's table.
    Pg(String),
}

// ---------------------------------------------------------------------------------------
// The model

struct Sink {
    name: &'static str,
    rx: Rx,
    /// In the config (a forgotten sink is not).
    live: bool,
    /// Its `[[sink]]` table.
    toml: String,
    /// Every `relay skip` of this history, as (from, to), in order: what the audit log says.
    skips: Vec<(u64, u64)>,
    /// The same ranges as the ledger keeps them: cut back by later rewinds.
    skipped: Vec<(u64, u64)>,
    /// Ids of skipped effects the receiver had not seen at the skip: they must never arrive
    /// (until a rewind or a restore goes back over them). Id -> offset.
    protected: BTreeMap<String, u64>,
    /// Tags the receiver refuses.
    refused: BTreeSet<String>,
    /// After `relay forget`: what the receiver had seen; it must see nothing more.
    silent_at: Option<usize>,
}

impl Sink {
    fn in_skipped(&self, offset: u64) -> bool {
        self.skipped.iter().any(|(a, b)| (*a..*b).contains(&offset))
    }
}

/// A sink's skips, skipped ranges and protected ids, as a backup keeps them.
type SinkSkips = (Vec<(u64, u64)>, Vec<(u64, u64)>, BTreeMap<String, u64>);

/// The model state a backup captured, put back by a restore.
struct Backup {
    path: PathBuf,
    keys: HashSet<String>,
    /// Per sink: skips, skipped, protected.
    sinks: Vec<SinkSkips>,
}

struct Store {
    name: &'static str,
    db: PathBuf,
    cfg: PathBuf,
    log: PathBuf,
    /// `[store]`, `[service]` and `[relay]`.
    head: String,
    source: String,
    /// PostgreSQL's application_name of its sinks' connections.
    app: String,
    agency: &'static str,
    sources: Vec<&'static str>,
    next_seq: Vec<u64>,
    next_tag: u64,
    /// Keys the store holds an effect for (agency/source/sequence): the model of the engine.
    keys: HashSet<String>,
    /// Every line ever fed to it (replays are drawn from these).
    lines: Vec<String>,
    relay: Option<Group>,
    /// "relay started" lines in the log before the running relay was started.
    relays: usize,
    sinks: Vec<Sink>,
    backup: Option<Backup>,
}

impl Store {
    fn write_config(&self) {
        let mut text = self.head.clone();
        for s in self.sinks.iter().filter(|s| s.live) {
            text.push_str(&s.toml);
        }
        std::fs::write(&self.cfg, text).unwrap();
    }

    fn cfg(&self) -> &str {
        self.cfg.to_str().unwrap()
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// `replay-guard ARGS --config CFG`.
    fn cmd(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let mut all = args.to_vec();
        all.extend(["--config", self.cfg()]);
        rg(&all)
    }

    /// `relay status --format json`, by sink.
    fn status(&self) -> BTreeMap<String, Json> {
        let (code, out, err) = self.cmd(&["relay", "status", "--format", "json"]);
        assert_eq!(code, Some(0), "relay status: {err}");
        let doc = parse(out.trim());
        let Json::Object(m) = doc else {
            panic!("{out}")
        };
        let Json::Array(sinks) = &m[0].1 else {
            panic!("{out}")
        };
        sinks
            .iter()
            .map(|s| (field(s, "sink"), s.clone()))
            .collect()
    }

    /// The sink's parked events: (offset, id).
    fn parked(&self, sink: &str) -> Vec<(u64, String)> {
        let (code, out, err) = self.cmd(&["relay", "parked", "--sink", sink]);
        assert_eq!(code, Some(0), "relay parked --sink {sink}: {err}");
        out.lines()
            .map(|l| {
                let p = parse(l);
                (field(&p, "offset").parse().unwrap(), field(&p, "id"))
            })
            .collect()
    }

    /// Every effect: (offset, id, envelope).
    fn effects(&self) -> Vec<(u64, String, String)> {
        common::effects(&self.db)
            .iter()
            .map(|e| {
                let r = &e.record;
                (
                    e.offset,
                    envelope::event_id(&r.key, r.released, &r.payload),
                    envelope::envelope(&self.source, &EffectView::of(e.offset, r)),
                )
            })
            .collect()
    }

    /// After a kill -9 of a writer (`relay`, `run`) the file needs crash recovery, which
    /// only a writer does: `ingest` of nothing, as the error message says.
    fn repair(&self) {
        let (code, _, err) = self.cmd(&["ingest", "/dev/null"]);
        assert_eq!(code, Some(0), "ingest /dev/null: {err}");
    }

    fn start_relay(&mut self) {
        assert!(self.relay.is_none());
        self.relays = self.started();
        self.relay = Some(Group::spawn(common::logged_command(
            &["relay", "--config", self.cfg()],
            &self.log,
        )));
    }

    /// Waits until the running relay is up: its sinks are locked, its signals handled.
    fn wait_up(&self) {
        wait_for(&format!("relay {} up", self.name), || {
            self.started() > self.relays
        });
    }

    /// "relay started" lines in the log (one per relay that came up).
    fn started(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .matches("relay started")
            .count()
    }

    /// SIGTERM to the relay, once it is up (a signal before its handler is in place kills
    /// it): it exits 0.
    fn term_relay(&mut self) {
        self.wait_up();
        let r = self.relay.take().unwrap();
        assert_eq!(
            r.term(),
            Some(0),
            "relay {}: {}",
            self.name,
            self.log_tail()
        );
    }
}

/// What a receiver saw: (id, envelope as received), in arrival order.
type Seen = Vec<(String, String)>;

struct Model {
    /// Draws the steps (and the first ingests): a function of the seed alone.
    plan: SplitMix64,
    /// The current step's own draws, seeded by `plan`: a step whose choices depend on what
    /// it finds (a cursor, parked events) does not change the steps after it.
    rng: SplitMix64,
    dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    pg: PgDb,
    broker: Option<Broker>,
    /// 0 = "a" (exec, http, postgres and the sink to forget), 1 = "b" (postgres).
    stores: Vec<Store>,
    /// Every envelope any effect of any store made, by id (several after a restore: the
    /// same message decided again at another offset and time).
    known: HashMap<String, BTreeSet<String>>,
    /// The data of each id: one, whatever the envelope.
    data: HashMap<String, String>,
    parked_seen: HashSet<(usize, &'static str, String)>,
    /// Runs of `run` and backups taken: numbers their files.
    runs: u64,
    figures: Figures,
}

impl Model {
    fn new(seed: u64, log: Arc<Mutex<Vec<String>>>) -> Model {
        let mut rng = SplitMix64::new(seed.wrapping_mul(0x9e37_79b9) ^ 0x5eed);
        // Kept on failure (the step log names it); removed when the seed passes.
        let dir = tempfile::Builder::new()
            .prefix("rg-relay-model-")
            .tempdir()
            .unwrap()
            .keep();
        let pg = PgDb::new("relay_model");
        pg.sql("CREATE SCHEMA cop");
        let shared_table = seed.is_multiple_of(2);
        let backoff = "backoff_initial_ms = 10\nbackoff_max_ms = 80\n";
        let mut stores = Vec::new();
        for (i, name) in ["a", "b"].into_iter().enumerate() {
            let db = dir.join(format!("{name}.redb"));
            let source = format!("urn:rg-model:{name}");
            let app = format!("rg-model-{name}");
            let head = format!(
                "[store]\npath = {:?}\n[service]\nshutdown_timeout_seconds = 5\n\
                 [relay]\nsource = {source:?}\n",
                db.to_str().unwrap()
            );
            let table = if i == 0 || shared_table {
                "cop.events_a"
            } else {
                "cop.events_b"
            };
            let pg_sink = Sink::new(
                "pg",
                Rx::Pg(table.to_string()),
                format!(
                    "[[sink]]\nname = \"pg\"\nkind = \"postgres\"\n\
                     dsn = \"{} application_name={app}\"\ntable = \"{table}\"\n\
                     batch_max = {}\ntimeout_ms = 5000\n{backoff}",
                    pg.dsn(),
                    1 + rng.below(40)
                ),
            );
            let sinks = if i == 0 {
                let ex = ExecRx::new(&dir.join("ex"));
                let ex_toml = exec_toml("ex", &ex, 1 + rng.below(30), backoff);
                let gone = ExecRx::new(&dir.join("gone"));
                let gone_toml = exec_toml("gone", &gone, 1 + rng.below(30), backoff);
                let web = Web::start(seed ^ 0x3eb);
                let web_toml = format!(
                    "[[sink]]\nname = \"web\"\nkind = \"http\"\nurl = \"{}\"\nbatch_max = {}\n\
                     max_in_flight = {}\ntimeout_ms = 5000\n{backoff}",
                    web.url(),
                    1 + rng.below(30),
                    1 + rng.below(3)
                );
                vec![
                    Sink::new("ex", Rx::Exec(ex), ex_toml),
                    Sink::new("web", Rx::Web(web), web_toml),
                    pg_sink,
                    Sink::new("gone", Rx::Exec(gone), gone_toml),
                ]
            } else {
                vec![pg_sink]
            };
            let (agency, sources) = if i == 0 {
                ("fire", vec!["e1", "e2", "e3", "e4"])
            } else {
                ("ems", vec!["m1", "m2", "m3"])
            };
            let store = Store {
                name,
                db,
                cfg: dir.join(format!("{name}.toml")),
                log: dir.join(format!("{name}.log")),
                head,
                source,
                app,
                agency,
                next_seq: vec![1; sources.len()],
                sources,
                next_tag: 0,
                keys: HashSet::new(),
                lines: Vec::new(),
                relay: None,
                relays: 0,
                sinks,
                backup: None,
            };
            store.write_config();
            stores.push(store);
        }
        let model = Model {
            rng: SplitMix64::new(rng.next_u64()),
            plan: rng,
            dir,
            log,
            pg,
            broker: None,
            stores,
            known: HashMap::new(),
            data: HashMap::new(),
            parked_seen: HashSet::new(),
            runs: 0,
            figures: Figures::default(),
        };
        model.note(format!(
            "seed {seed} in {}: store b's sink pg writes {}",
            model.dir.display(),
            if shared_table {
                "store a's table cop.events_a"
            } else {
                "its own table cop.events_b"
            }
        ));
        model
    }

    fn note(&self, line: String) {
        self.log.lock().unwrap().push(line);
    }

    fn run(mut self, steps: usize) -> Figures {
        // Both files exist before any relay starts.
        for i in 0..2 {
            let n = 1 + self.rng.below(20) as usize;
            let what = self.ingest(i, n, false);
            self.note(format!("  0 {what}"));
        }
        for step in 1..=steps {
            self.figures.steps += 1;
            self.step(step);
            if step % CHECK_EVERY == 0 || step == steps {
                self.checkpoint(step);
            }
        }
        for s in &mut self.stores {
            if s.relay.is_some() {
                s.term_relay();
            }
        }
        self.figures.effects = self.stores.iter().map(|s| s.keys.len() as u64).sum();
        let figures = self.figures.clone();
        let dir = self.dir.clone();
        drop(self);
        std::fs::remove_dir_all(&dir).unwrap();
        figures
    }

    /// One random step among those that apply now.
    fn step(&mut self, step: usize) {
        #[derive(Clone, Copy, Debug)]
        enum Kind {
            Ingest(usize),
            Start(usize),
            Kill(usize),
            Stop(usize),
            Rewind,
            Skip,
            Retry,
            Backup,
            Restore,
            Forget,
            Run,
        }
        let mut choices: Vec<(u64, Kind)> = vec![(10, Kind::Ingest(0)), (4, Kind::Ingest(1))];
        for i in 0..2 {
            if self.stores[i].relay.is_some() {
                choices.push((if i == 0 { 5 } else { 2 }, Kind::Kill(i)));
                choices.push((1, Kind::Stop(i)));
            } else {
                choices.push((if i == 0 { 6 } else { 3 }, Kind::Start(i)));
            }
        }
        choices.extend([
            (5, Kind::Rewind),
            (3, Kind::Skip),
            (3, Kind::Retry),
            (2, Kind::Backup),
            (2, Kind::Run),
        ]);
        if self.stores[0].backup.is_some() {
            choices.push((2, Kind::Restore));
        }
        if self.stores[0].sinks[3].live && step > 3 {
            choices.push((2, Kind::Forget));
        }
        let total: u64 = choices.iter().map(|(w, _)| w).sum();
        let mut roll = self.plan.below(total);
        self.rng = SplitMix64::new(self.plan.next_u64());
        let kind = choices
            .iter()
            .find(|(w, _)| {
                if roll < *w {
                    true
                } else {
                    roll -= w;
                    false
                }
            })
            .unwrap()
            .1;
        let what = match kind {
            Kind::Ingest(i) => {
                let n = 1 + self.rng.below(30) as usize;
                self.ingest(i, n, true)
            }
            Kind::Start(i) => {
                self.stores[i].start_relay();
                format!("relay {} started", self.stores[i].name)
            }
            Kind::Kill(i) => self.kill(i),
            Kind::Stop(i) => {
                self.stores[i].term_relay();
                self.quiesce(i);
                format!("relay {} stopped (SIGTERM, exit 0)", self.stores[i].name)
            }
            Kind::Rewind => self.rewind(),
            Kind::Skip => self.skip(),
            Kind::Retry => self.retry(),
            Kind::Backup => self.backup(),
            Kind::Restore => self.restore(),
            Kind::Forget => self.forget(),
            Kind::Run => self.run_feed(),
        };
        self.note(format!("{step:>3} {what}"));
    }

    /// Ingests `n` lines into store `i`: fresh messages (each with its own tag, some refused
    /// by the exec or the http receiver) and, if `replays`, a quarter replays of earlier
    /// lines. Checks the engine's decisions against the model.
    fn ingest(&mut self, i: usize, n: usize, replays: bool) -> String {
        let (lines, fresh, refused) = self.lines(i, n, replays);
        let s = &self.stores[i];
        let feed = self
            .dir
            .join(format!("feed-{}-{}.jsonl", s.name, s.lines.len()));
        std::fs::write(&feed, lines.join("\n") + "\n").unwrap();
        let (code, _, err) = s.cmd(&["ingest", feed.to_str().unwrap()]);
        assert_eq!(code, Some(0), "ingest: {err}");
        let count = |outcome: &str| -> usize {
            err.lines()
                .find_map(|l| {
                    let mut w = l.split_whitespace();
                    (w.next() == Some(outcome)).then(|| w.next().unwrap().parse().unwrap())
                })
                .unwrap_or_else(|| panic!("no {outcome} in {err}"))
        };
        assert_eq!(
            count("applied") + count("applied_late"),
            fresh,
            "fresh messages applied: {err}"
        );
        assert_eq!(count("duplicate"), n - fresh, "replays suppressed: {err}");
        self.capture(i);
        let s = &self.stores[i];
        assert_eq!(common::effects(&s.db).len(), s.keys.len());
        format!(
            "ingest {}: {n} lines, {fresh} fresh, {} replays{refused}; {} effects",
            s.name,
            n - fresh,
            s.keys.len()
        )
    }

    /// `n` lines for store `i` (updating the model and the receivers' refusals): the lines,
    /// how many are fresh to the store, and the refusals in words.
    fn lines(&mut self, i: usize, n: usize, replays: bool) -> (Vec<String>, usize, String) {
        let mut out = Vec::new();
        let mut fresh = 0;
        let mut refused = String::new();
        for _ in 0..n {
            let s = &mut self.stores[i];
            let line = if replays && !s.lines.is_empty() && self.rng.below(4) == 0 {
                s.lines[self.rng.below(s.lines.len() as u64) as usize].clone()
            } else {
                let src = self.rng.below(s.sources.len() as u64) as usize;
                let seq = s.next_seq[src];
                s.next_seq[src] += 1;
                s.next_tag += 1;
                let tag = format!("{}{}", s.name, s.next_tag);
                // Refusals only where a receiver can be fixed: a's exec and http sinks.
                if i == 0 {
                    for (k, sink) in [(0, "ex"), (1, "web")] {
                        if self.rng.below(25) == 0 {
                            s.sinks[k].refused.insert(tag.clone());
                            refused.push_str(&format!(", {tag} refused by {sink}"));
                        }
                    }
                }
                format!(
                    "{{\"agency\":\"{}\",\"source_id\":\"{}\",\"epoch\":1,\"sequence\":{seq},\
                     \"tag\":\"{tag}\",\"body\":\"status of {tag}\"}}",
                    s.agency, s.sources[src]
                )
            };
            let key = {
                let v = parse(&line);
                format!("{}/{}", field(&v, "source_id"), field(&v, "sequence"))
            };
            if s.keys.insert(key) {
                fresh += 1;
            }
            s.lines.push(line.clone());
            out.push(line);
        }
        self.apply_refusals();
        (out, fresh, refused)
    }

    /// Gives the receivers of store a the refusals the model holds.
    fn apply_refusals(&self) {
        for s in &self.stores[0].sinks {
            match &s.rx {
                Rx::Exec(x) => x.set_refused(&s.refused),
                Rx::Web(w) => w.set_refused(&s.refused),
                Rx::Pg(_) => {}
            }
        }
    }

    /// Adds every effect's envelope of store `i` to what may arrive; one data per id.
    fn capture(&mut self, i: usize) {
        for (_, id, env) in self.stores[i].effects() {
            let data = data_of(&parse(&env));
            let had = self.data.entry(id.clone()).or_insert_with(|| data.clone());
            assert_eq!(*had, data, "id {id} made with two contents");
            self.known.entry(id).or_default().insert(env);
        }
    }

    fn kill(&mut self, i: usize) -> String {
        // Now and then while it delivers: a random moment up to 300 ms on.
        std::thread::sleep(Duration::from_millis(self.rng.below(300)));
        let lag = self.stores[i].status();
        let behind: Vec<String> = lag
            .iter()
            .filter(|(_, v)| field(v, "lag_events") != "0")
            .map(|(k, v)| format!("{k} {}", field(v, "lag_events")))
            .collect();
        self.stores[i].relay.take().unwrap().kill9();
        self.quiesce(i);
        self.stores[i].repair();
        self.figures.kills += 1;
        format!(
            "relay {} killed -9 ({})",
            self.stores[i].name,
            if behind.is_empty() {
                "caught up".to_string()
            } else {
                format!("behind: {}", behind.join(", "))
            }
        )
    }

    /// Once store `i`'s relay is gone: nothing it sent is still on its way to a receiver.
    fn quiesce(&self, i: usize) {
        for s in &self.stores[i].sinks {
            if let Rx::Web(w) = &s.rx {
                w.quiesce();
            }
        }
        let app = &self.stores[i].app;
        wait_for(&format!("{app}'s PostgreSQL sessions ended"), || {
            self.pg.sql(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = '{app}'"
            )) == "0"
        });
    }

    /// Stops store `i`'s relay if it runs (kill -9 or SIGTERM).
    fn stop_relay(&mut self, i: usize) -> &'static str {
        if self.stores[i].relay.is_none() {
            return "";
        }
        let how = if self.rng.below(2) == 0 {
            self.stores[i].relay.take().unwrap().kill9();
            self.stores[i].repair();
            self.figures.kills += 1;
            "relay killed -9, "
        } else {
            self.stores[i].term_relay();
            "relay stopped, "
        };
        self.quiesce(i);
        how
    }

    /// A live sink of a random store.
    fn pick_sink(&mut self) -> (usize, usize) {
        let all: Vec<(usize, usize)> = (0..2)
            .flat_map(|i| {
                self.stores[i]
                    .sinks
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.live)
                    .map(move |(k, _)| (i, k))
            })
            .collect();
        *self.rng.pick(&all)
    }

    fn rewind(&mut self) -> String {
        // Mostly a sink with a skipped range to go into, if there is one.
        let with_skips: Vec<(usize, usize)> = (0..2)
            .flat_map(|i| (0..self.stores[i].sinks.len()).map(move |k| (i, k)))
            .filter(|&(i, k)| {
                let sink = &self.stores[i].sinks[k];
                sink.live && sink.skipped.iter().any(|(a, b)| b - a >= 2)
            })
            .collect();
        let into_skip = !with_skips.is_empty() && self.rng.below(3) != 0;
        let (i, k) = if into_skip {
            *self.rng.pick(&with_skips)
        } else {
            self.pick_sink()
        };
        let name = self.stores[i].sinks[k].name;
        let mut st = self.stores[i].status();
        let mut what = String::new();
        if self.stores[i].relay.is_none() && field(&st[name], "cursor") == field(&st[name], "head")
        {
            // Effects above the cursor, for a rewind there to be refused.
            let n = 1 + self.rng.below(5) as usize;
            what = format!(" (after {})", self.ingest(i, n, false));
            st = self.stores[i].status();
        }
        let s = &self.stores[i];
        let row = &st[name];
        let cursor: u64 = field(row, "cursor").parse().unwrap();
        let head: u64 = field(row, "head").parse().unwrap();
        // Above the cursor (only with the relay stopped: a running one could pass it first):
        // refused, exit 1, nothing changed.
        if s.relay.is_none() && cursor < head {
            let above = cursor + 1 + self.rng.below(head - cursor);
            let audit_before = s.cmd(&["dump-audit", "--outcome", "relay"]).1;
            let (code, _, err) = s.cmd(&[
                "relay",
                "rewind",
                "--sink",
                name,
                "--to",
                &above.to_string(),
                "--reason",
                "model: above",
                "--operator",
                "model",
            ]);
            assert_eq!(code, Some(1), "a rewind above the cursor: {err}");
            assert!(
                err.contains(&format!(
                    "offset {above} is above sink \"{name}\"'s cursor ({cursor})"
                )),
                "{err}"
            );
            let after = s.status();
            for f in ["cursor", "generation", "accounting"] {
                assert_eq!(
                    field(&after[name], f),
                    field(row, f),
                    "{f} changed by a refused rewind"
                );
            }
            assert_eq!(
                s.cmd(&["dump-audit", "--outcome", "relay"]).1,
                audit_before,
                "a refused rewind was audited"
            );
            self.figures.refused_rewinds += 1;
            what.push_str(&format!(", to {above} refused (exit 1, nothing changed)"));
        }
        // Into a range a skip passed over, for such a sink.
        let inside: Vec<(u64, u64)> = s.sinks[k]
            .skipped
            .iter()
            .copied()
            .filter(|(a, b)| b - a >= 2)
            .collect();
        let to = if into_skip && !inside.is_empty() {
            let (a, b) = *self.rng.pick(&inside);
            a + 1 + self.rng.below(b - a - 1)
        } else {
            self.rng.below(cursor + 1)
        };
        let (code, out, err) = s.cmd(&[
            "relay",
            "rewind",
            "--sink",
            name,
            "--to",
            &to.to_string(),
            "--reason",
            "model",
            "--operator",
            "model",
        ]);
        assert_eq!(code, Some(0), "rewind: {err}");
        assert!(out.contains(&format!(" to {to} (generation ")), "{out}");
        let sink = &mut self.stores[i].sinks[k];
        if sink.skipped.iter().any(|(a, b)| *a < to && to < *b) {
            self.figures.into_skips += 1;
        }
        sink.skipped = sink
            .skipped
            .iter()
            .filter(|(a, _)| *a < to)
            .map(|(a, b)| (*a, (*b).min(to)))
            .collect();
        sink.protected.retain(|_, o| *o < to);
        self.figures.rewinds += 1;
        format!(
            "rewind {}/{name} from {} to {to}{what}",
            self.stores[i].name,
            out.split("cursor moved from ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .unwrap_or("?")
        )
    }

    fn skip(&mut self) -> String {
        let (i, k) = self.pick_sink();
        // Only with the relay gone and quiet, so what arrives after is known to come after.
        let stopped = self.stop_relay(i);
        let name = self.stores[i].sinks[k].name;
        let mut st = self.stores[i].status();
        let mut ingested = String::new();
        let lag = |st: &BTreeMap<String, Json>| {
            field(&st[name], "head").parse::<u64>().unwrap()
                - field(&st[name], "cursor").parse::<u64>().unwrap()
        };
        if lag(&st) < 2 {
            // Something to skip (two effects at least, to rewind into later): effects the
            // stopped relay has not delivered.
            let n = 2 + self.rng.below(20) as usize;
            ingested = format!("{}, ", self.ingest(i, n, false));
            st = self.stores[i].status();
        }
        let s = &self.stores[i];
        let cursor: u64 = field(&st[name], "cursor").parse().unwrap();
        let head: u64 = field(&st[name], "head").parse().unwrap();
        let to = cursor + 2 + self.rng.below(head - cursor - 1);
        let args = |yes: bool| {
            let mut a = vec![
                "relay".to_string(),
                "skip".into(),
                "--sink".into(),
                name.into(),
                "--to".into(),
                to.to_string(),
                "--reason".into(),
                "model".into(),
                "--operator".into(),
                "model".into(),
            ];
            if yes {
                a.push("--yes".into());
            }
            a
        };
        if self.rng.below(3) == 0 {
            let a = args(false);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let (code, _, err) = s.cmd(&a);
            assert_eq!(code, Some(1), "skip without --yes: {err}");
            assert!(err.contains("nothing was changed; pass --yes"), "{err}");
            assert_eq!(field(&s.status()[name], "cursor"), cursor.to_string());
        }
        let a = args(true);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let (code, out, err) = s.cmd(&a);
        assert_eq!(code, Some(0), "skip: {err}");
        assert!(
            out.contains(&format!(
                "cursor moved from {cursor} to {to} (generation {}); {} undelivered effects \
                 passed over",
                field(&st[name], "generation").parse::<u64>().unwrap() + 1,
                to - cursor
            )),
            "{out}"
        );
        let seen: HashSet<String> = self.seen(i, k).into_iter().map(|(id, _)| id).collect();
        let effects = s.effects();
        let sink = &mut self.stores[i].sinks[k];
        for (o, id, _) in effects {
            if (cursor..to).contains(&o) && !seen.contains(&id) {
                sink.protected.insert(id, o);
            }
        }
        sink.skips.push((cursor, to));
        sink.skipped.push((cursor, to));
        self.figures.skips += 1;
        self.figures.skipped += to - cursor;
        format!(
            "skip {}/{name}: {stopped}{ingested}{cursor} to {to}",
            self.stores[i].name
        )
    }

    /// A receiver of store a is fixed (some or all of its refused tags accepted from now
    /// on) and the operator retries its parked events (all, or one).
    fn retry(&mut self) -> String {
        let k = self.rng.below(2) as usize;
        let s = &mut self.stores[0];
        let name = s.sinks[k].name;
        let tags: Vec<String> = s.sinks[k].refused.iter().cloned().collect();
        let mut fixed = 0;
        for t in tags {
            if self.rng.below(3) != 0 {
                s.sinks[k].refused.remove(&t);
                fixed += 1;
            }
        }
        self.apply_refusals();
        let s = &self.stores[0];
        let parked = s.parked(name);
        for (_, id) in &parked {
            self.parked_seen.insert((0, name, id.clone()));
        }
        let one = !parked.is_empty() && self.rng.below(3) == 0;
        let target = if one {
            parked[self.rng.below(parked.len() as u64) as usize]
                .0
                .to_string()
        } else {
            "--all".to_string()
        };
        let (code, out, err) = s.cmd(&[
            "relay",
            "retry",
            "--sink",
            name,
            &target,
            "--reason",
            "fixed",
            "--operator",
            "model",
        ]);
        if parked.is_empty() || s.relay.is_some() {
            // A running relay may have parked one since, or delivered one an earlier retry
            // asked for (or re-delivered it after a rewind) and so unparked it.
            assert!(
                code == Some(0) || (code == Some(1) && err.contains("has no parked event")),
                "retry: {err}"
            );
        } else {
            assert_eq!(code, Some(0), "retry: {err}");
            assert!(out.contains("marked for retry"), "{out}");
        }
        self.figures.retries += 1;
        format!(
            "retry a/{name} {target}: {fixed} tags fixed, {} still refused, {} parked before",
            self.stores[0].sinks[k].refused.len(),
            parked.len()
        )
    }

    fn backup(&mut self) -> String {
        self.runs += 1;
        let s = &mut self.stores[0];
        let path = self.dir.join(format!("a-backup-{}.redb", self.runs));
        let (code, out, err) = s.cmd(&["backup", "--to", path.to_str().unwrap()]);
        assert_eq!(code, Some(0), "backup: {err}{out}");
        s.backup = Some(Backup {
            path,
            keys: s.keys.clone(),
            sinks: s
                .sinks
                .iter()
                .map(|k| (k.skips.clone(), k.skipped.clone(), k.protected.clone()))
                .collect(),
        });
        format!("backup of a with {} effects", s.keys.len())
    }

    /// The disk of store a is lost: its backup is copied over the file, and the restored
    /// store takes new messages.
    fn restore(&mut self) -> String {
        let stopped = self.stop_relay(0);
        // Receivers saw what they saw: protections are for what comes next.
        let seen: Vec<HashSet<String>> = (0..self.stores[0].sinks.len())
            .map(|k| self.seen(0, k).into_iter().map(|(id, _)| id).collect())
            .collect();
        let s = &mut self.stores[0];
        let b = s.backup.as_ref().unwrap();
        std::fs::copy(&b.path, &s.db).unwrap();
        s.keys = b.keys.clone();
        for (k, (skips, skipped, protected)) in b.sinks.iter().enumerate() {
            let sink = &mut s.sinks[k];
            sink.skips = skips.clone();
            sink.skipped = skipped.clone();
            sink.protected = protected
                .iter()
                .filter(|(id, _)| !seen[k].contains(*id))
                .map(|(id, o)| (id.clone(), *o))
                .collect();
        }
        let effects = s.keys.len();
        let ingested = {
            let n = 1 + self.rng.below(20) as usize;
            self.ingest(0, n, false)
        };
        // A sink forgotten after the backup has its cursor again: forget it again.
        let mut again = String::new();
        let st = self.stores[0].status();
        if st
            .get("gone")
            .is_some_and(|r| field(r, "configured") == "false")
        {
            let (code, _, err) = self.stores[0].cmd(&[
                "relay",
                "forget",
                "--sink",
                "gone",
                "--reason",
                "again",
                "--operator",
                "model",
            ]);
            assert_eq!(code, Some(0), "forget after the restore: {err}");
            again = ", gone forgotten again".into();
        }
        self.figures.restores += 1;
        format!(
            "restore a: {stopped}backup with {effects} effects copied over the file; then \
             {ingested}{again}"
        )
    }

    /// Sink gone is removed from store a's config and forgotten; its receiver gets nothing
    /// more.
    fn forget(&mut self) -> String {
        if self.stores[0].relay.is_some() {
            // Up, and so running with the config that still names the sink.
            self.stores[0].wait_up();
        }
        self.stores[0].sinks[3].live = false;
        self.stores[0].write_config();
        let forget = [
            "relay",
            "forget",
            "--sink",
            "gone",
            "--reason",
            "COP import moved",
            "--operator",
            "model",
        ];
        let mut what = String::new();
        if self.stores[0].relay.is_some() {
            // The running relay still holds it.
            let (code, _, err) = self.stores[0].cmd(&forget);
            assert_eq!(code, Some(2), "forget of a sink being delivered: {err}");
            what.push_str("refused while the relay holds it (exit 2), ");
        }
        what.push_str(self.stop_relay(0));
        let (code, out, err) = self.stores[0].cmd(&forget);
        assert_eq!(code, Some(0), "forget: {err}");
        assert!(out.contains("sink gone forgotten"), "{out}");
        let seen = self.seen(0, 3).len();
        self.stores[0].sinks[3].silent_at = Some(seen);
        self.figures.forgets += 1;
        format!("forget a/gone: {what}its receiver had {seen} events")
    }

    /// `run` of store a fed through Mosquitto, killed with -9 (or stopped) while its sinks
    /// deliver.
    fn run_feed(&mut self) -> String {
        let stopped = self.stop_relay(0);
        if self.broker.is_none() {
            self.broker = Some(Broker::start(&self.dir.join("broker"), false));
        }
        let broker = self.broker.as_ref().unwrap();
        self.runs += 1;
        let client = "rg-model-run";
        let cfg = self.dir.join("a-run.toml");
        std::fs::write(
            &cfg,
            std::fs::read_to_string(&self.stores[0].cfg).unwrap()
                + &super::relay::mqtt_section(broker, client),
        )
        .unwrap();
        let log = self.dir.join(format!("run-{}.log", self.runs));
        let mut run = Group::spawn(common::logged_command(
            &["run", "--config", cfg.to_str().unwrap()],
            &log,
        ));
        let run_log = || std::fs::read_to_string(&log).unwrap_or_default();
        wait_for("run subscribed", || {
            assert!(run.running(), "run exited: {}", run_log());
            run_log().contains("subscribed broker=")
        });
        // A probe message, applied once it arrives.
        let (probe, fresh, _) = self.lines(0, 1, false);
        assert_eq!(fresh, 1);
        let want = self.stores[0].keys.len();
        let db = self.stores[0].db.clone();
        let broker = self.broker.as_ref().unwrap();
        broker.publish_lines("incidents/a", &probe, "rg-model-pub");
        wait_for("the probe is applied", || {
            common::effects(&db).len() >= want
        });
        let n = 1 + self.rng.below(40) as usize;
        let (lines, fresh, refused) = self.lines(0, n, true);
        let broker = self.broker.as_ref().unwrap();
        broker.publish_lines("incidents/a", &lines, "rg-model-pub");
        let want = self.stores[0].keys.len();
        wait_for("run applies the published lines", || {
            common::effects(&db).len() >= want
        });
        assert_eq!(common::effects(&db).len(), want, "{}", run_log());
        std::thread::sleep(Duration::from_millis(self.rng.below(300)));
        let how = if self.rng.below(4) == 0 {
            assert_eq!(run.term(), Some(0), "run on SIGTERM: {}", run_log());
            "stopped"
        } else {
            run.kill9();
            self.stores[0].repair();
            self.figures.kills += 1;
            self.figures.run_kills += 1;
            "killed -9"
        };
        self.quiesce(0);
        // A clean session under run's client id drops what the broker kept for it
        // (messages run took but did not acknowledge before the kill): the next run starts
        // afresh, whatever the store holds by then.
        let out = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &broker.port.to_string()])
            .args(["-i", client, "-t", "rg-model/clear", "-n"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.capture(0);
        format!(
            "run a: {stopped}{n} lines published ({fresh} fresh{refused}) and a probe, {} \
             effects, run {how}",
            self.stores[0].keys.len()
        )
    }

    /// What sink `k` of store `i`'s receiver saw: (id, envelope).
    fn seen(&self, i: usize, k: usize) -> Seen {
        let envs = match &self.stores[i].sinks[k].rx {
            Rx::Exec(x) => x.seen(),
            Rx::Web(w) => w.seen(),
            Rx::Pg(table) => {
                if self
                    .pg
                    .sql(&format!("SELECT to_regclass('{table}') IS NULL"))
                    == "t"
                {
                    return Vec::new();
                }
                return self
                    .pg
                    .sql(&format!("SELECT id, event::text FROM {table}"))
                    .lines()
                    .map(|l| {
                        let (id, ev) = l.split_once('|').unwrap();
                        (id.to_string(), ev.to_string())
                    })
                    .collect();
            }
        };
        envs.into_iter()
            .map(|e| (field(&parse(&e), "id"), e))
            .collect()
    }

    /// Every sink caught up, then everything the model knows checked against the store and
    /// the receivers.
    fn checkpoint(&mut self, step: usize) {
        for i in 0..2 {
            if self.stores[i].relay.is_none() {
                self.stores[i].start_relay();
            }
            self.capture(i);
        }
        let mut fixed = Vec::new();
        for i in 0..2 {
            let live: Vec<&str> = self.stores[i]
                .sinks
                .iter()
                .filter(|k| k.live)
                .map(|k| k.name)
                .collect();
            let start = Instant::now();
            loop {
                let st = self.stores[i].status();
                // Refusals of two sources one after the other block the sink (the receiver
                // seems to refuse every event; nothing is parked): the operator fixes the
                // receiver, and the sink delivers on.
                let store = self.stores[i].name;
                let mut any = false;
                for sink in &mut self.stores[i].sinks {
                    if sink.live
                        && !sink.refused.is_empty()
                        && st
                            .get(sink.name)
                            .is_some_and(|r| field(r, "state") == "blocked")
                    {
                        fixed.push(format!(
                            "{store}/{} blocked at {}: receiver fixed ({} tags accepted)",
                            sink.name,
                            field(&st[sink.name], "cursor"),
                            sink.refused.len()
                        ));
                        sink.refused.clear();
                        self.figures.unblocks += 1;
                        any = true;
                    }
                }
                if any {
                    self.apply_refusals();
                }
                let s = &self.stores[i];
                let waiting: Vec<String> = live
                    .iter()
                    .filter_map(|name| {
                        let r = st.get(*name)?;
                        (field(r, "cursor") != field(r, "head")
                            || field(r, "retry_requested") != "0")
                            .then(|| {
                                format!(
                                    "{name}: {} cursor {} of {}, {} retries asked, {}",
                                    field(r, "state"),
                                    field(r, "cursor"),
                                    field(r, "head"),
                                    field(r, "retry_requested"),
                                    field(r, "last_error")
                                )
                            })
                    })
                    .collect();
                if waiting.is_empty() && live.iter().all(|n| st.contains_key(*n)) {
                    break;
                }
                assert!(
                    start.elapsed() < PATIENCE,
                    "store {}'s sinks not caught up: {waiting:?}\n{}",
                    s.name,
                    s.log_tail()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let mut lines = Vec::new();
        let mut deliveries = 0;
        let mut duplicates = 0;
        let mut adopted = 0;
        for i in 0..2 {
            for k in 0..self.stores[i].sinks.len() {
                let (seen, line, took) = self.check_sink(i, k);
                adopted += took;
                let distinct: HashSet<&String> = seen.iter().map(|(id, _)| id).collect();
                deliveries += seen.len() as u64;
                duplicates += (seen.len() - distinct.len()) as u64;
                lines.push(line);
            }
            self.check_store(i);
        }
        self.figures.deliveries = deliveries;
        self.figures.duplicates = duplicates;
        self.figures.adopted = adopted;
        self.figures.parked = self.parked_seen.len() as u64;
        self.figures.checkpoints += 1;
        for f in fixed {
            self.note(format!("{step:>3} {f}"));
        }
        self.note(format!("{step:>3} checkpoint: {}", lines.join("; ")));
    }

    /// One sink's receiver against the store and the model; returns what it saw, a summary
    /// and how many offsets its accounting says were adopted.
    fn check_sink(&mut self, i: usize, k: usize) -> (Seen, String, u64) {
        let seen = self.seen(i, k);
        let s = &self.stores[i];
        let sink = &s.sinks[k];
        let name = sink.name;
        let label = format!("{}/{name}", s.name);
        let exact = !matches!(sink.rx, Rx::Pg(_));
        // No id with two contents; every envelope is one an effect made.
        let mut data_by_id: HashMap<&str, String> = HashMap::new();
        for (id, env) in &seen {
            let v = parse(env);
            let known = self
                .known
                .get(id)
                .unwrap_or_else(|| panic!("{label}: id {id} was never an effect: {env}"));
            let ok = if exact {
                known.contains(env)
            } else {
                let c = canonical(&v);
                known.iter().any(|k| canonical(&parse(k)) == c)
            };
            assert!(
                ok,
                "{label}: id {id} arrived as an envelope no effect made:\n{env}\nknown: {known:?}"
            );
            let data = data_of(&v);
            if let Some(prev) = data_by_id.insert(id, data.clone()) {
                assert_eq!(prev, data, "{label}: id {id} arrived with two contents");
            }
        }
        let ids: HashSet<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
        for id in sink.protected.keys() {
            assert!(
                !ids.contains(id.as_str()),
                "{label}: {id} arrived after it was skipped"
            );
        }
        if let Some(at) = sink.silent_at {
            assert_eq!(seen.len(), at, "{label}: events arrived after the forget");
            return (seen, format!("{label} forgotten, {at} events"), 0);
        }
        let envs: HashSet<&str> = seen.iter().map(|(_, e)| e.as_str()).collect();
        let received = |id: &str, env: &str| {
            if exact {
                envs.contains(env)
            } else {
                ids.contains(id)
            }
        };
        let effects = s.effects();
        let parked = s.parked(name);
        let parked_at: HashSet<u64> = parked.iter().map(|(o, _)| *o).collect();
        // 1. Every effect arrived, is parked, or was skipped.
        for (o, id, env) in &effects {
            assert!(
                received(id, env) || parked_at.contains(o) || sink.in_skipped(*o),
                "{label}: effect {o} ({id}) neither arrived, nor is parked, nor was skipped; \
                 skipped {:?}, parked {parked:?}\n{}",
                sink.skipped,
                s.log_tail()
            );
        }
        // 4. The accounting holds and says what the receiver saw.
        let st = s.status();
        let row = &st[name];
        let acc = match row {
            Json::Object(m) => m.iter().find(|(k, _)| k == "accounting").unwrap().1.clone(),
            _ => unreachable!(),
        };
        assert_eq!(
            field(&acc, "problem"),
            "null",
            "{label}: {}",
            acc.to_compact()
        );
        let n = |f: &str| -> u64 { field(&acc, f).parse().unwrap() };
        let (from, to) = (n("from"), n("to"));
        assert_eq!(to.to_string(), field(row, "head"), "{label}: caught up");
        assert_eq!(
            from + n("delivered") + n("parked") + n("retried") + n("skipped") + n("adopted"),
            to,
            "{label}: the ledger partitions {from}..{to}: {}",
            acc.to_compact()
        );
        assert_eq!(
            n("parked"),
            parked.len() as u64,
            "{label}: parked {parked:?}"
        );
        let model_skipped: u64 = sink.skipped.iter().map(|(a, b)| b - a).sum();
        assert_eq!(
            n("skipped"),
            model_skipped,
            "{label}: skipped {:?}",
            sink.skipped
        );
        let arrived_in_ledger = effects
            .iter()
            .filter(|(o, id, env)| {
                (from..to).contains(o)
                    && !sink.in_skipped(*o)
                    && !parked_at.contains(o)
                    && received(id, env)
            })
            .count() as u64;
        assert_eq!(
            n("delivered") + n("retried") + n("adopted"),
            arrived_in_ledger,
            "{label}: delivered + retried + adopted against the effects the receiver holds \
             (neither parked nor skipped): {}",
            acc.to_compact()
        );
        if !parked.is_empty() {
            let store = i;
            for (_, id) in &parked {
                self.parked_seen.insert((store, name, id.clone()));
            }
        }
        let line = format!(
            "{label} {} seen ({} ids), cursor {to}, {} delivered, {} parked, {} retried, {} \
             skipped, {} adopted",
            seen.len(),
            ids.len(),
            n("delivered"),
            n("parked"),
            n("retried"),
            n("skipped"),
            n("adopted")
        );
        (seen, line, n("adopted"))
    }

    /// 3. `verify` and its sink lines; the audit log's skips; `dump-effects`.
    fn check_store(&self, i: usize) {
        let s = &self.stores[i];
        let (code, out, err) = s.cmd(&["verify"]);
        assert_eq!(code, Some(0), "verify {}: {err}", s.name);
        for (name, row) in s.status() {
            let acc = match &row {
                Json::Object(m) => m.iter().find(|(k, _)| k == "accounting").unwrap().1.clone(),
                _ => unreachable!(),
            };
            let line = format!(
                "sink {name}: every offset from {} to its cursor {} accounted for: {} \
                 delivered, {} parked, {} delivered after retry, {} skipped by an audited \
                 operator action, {} discarded by an audited operator action, {} found in the \
                 sink's own store (audited); {} parked events match",
                field(&acc, "from"),
                field(&acc, "to"),
                field(&acc, "delivered"),
                field(&acc, "parked"),
                field(&acc, "retried"),
                field(&acc, "skipped"),
                field(&acc, "discarded"),
                field(&acc, "adopted"),
                field(&acc, "parked"),
            );
            assert!(
                out.contains(&line),
                "verify {}: no {line:?} in\n{out}",
                s.name
            );
        }
        let (code, audit, err) = s.cmd(&["dump-audit", "--outcome", "relay"]);
        assert_eq!(code, Some(0), "{err}");
        let mut skips: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
        for l in audit.lines() {
            let reason = field(&parse(l), "reason");
            if let Some(rest) = reason.strip_prefix("relay skip of sink ") {
                let w: Vec<&str> = rest.split(' ').collect();
                assert_eq!((w[1], w[2], w[4]), ("from", "offset", "to"), "{reason}");
                skips
                    .entry(w[0].to_string())
                    .or_default()
                    .push((w[3].parse().unwrap(), w[5].parse().unwrap()));
            }
        }
        for sink in &s.sinks {
            assert_eq!(
                skips.remove(sink.name).unwrap_or_default(),
                sink.skips,
                "{}/{}: the audit log's skips",
                s.name,
                sink.name
            );
        }
        assert!(skips.is_empty(), "skips of unknown sinks: {skips:?}");
        let (code, dump, err) = s.cmd(&["dump-effects"]);
        assert_eq!(code, Some(0), "{err}");
        let dumped: Vec<(u64, String)> = dump
            .lines()
            .map(|l| {
                let v = parse(l);
                (field(&v, "offset").parse().unwrap(), field(&v, "key"))
            })
            .collect();
        let read: Vec<(u64, String)> = common::effects(&s.db)
            .iter()
            .map(|e| (e.offset, replay_guard::model::hex(&e.record.key)))
            .collect();
        assert_eq!(dumped, read, "dump-effects of {}", s.name);
        assert_eq!(read.len(), s.keys.len(), "effects of {}", s.name);
    }
}

impl Sink {
    fn new(name: &'static str, rx: Rx, toml: String) -> Sink {
        Sink {
            name,
            rx,
            live: true,
            toml,
            skips: Vec::new(),
            skipped: Vec::new(),
            protected: BTreeMap::new(),
            refused: BTreeSet::new(),
            silent_at: None,
        }
    }
}

fn exec_toml(name: &str, rx: &ExecRx, batch_max: u64, backoff: &str) -> String {
    format!(
        "[[sink]]\nname = \"{name}\"\nkind = \"exec\"\ncommand = [\"/bin/sh\", {:?}]\n\
         batch_max = {batch_max}\ntimeout_ms = 10000\n{backoff}",
        rx.script.to_str().unwrap()
    )
}
