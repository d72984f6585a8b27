//! The topology model (issue 50, "green means delivered"): the verdicts checked against what
//! the receivers hold, after every step of a seeded random run through the real binary.
//!
//! The topology is a function of the seed: the sinks inside `run` (odd seeds), or in a
//! relay of their own (even seeds), which `run`'s config names with `[relay] sinks_from`,
//! which starts late (not before a step drawn from 10..17, retention pruning meanwhile),
//! whose first start is with a broken config (it must exit at once, and lose nothing), and
//! which an operator sometimes starts so again. `run` consumes a private Mosquitto
//! (QoS 1, a persistent session) and keeps a short window and a short effect log
//! (`[retention] effects_max_entries`), so retention prunes all the time. Four sinks:
//! - `cop`: http to a receiver process (Python's http.server) that answers what the test sets
//!   (200, 400, 401, 403, 404, 409, 422, 429, 500, 503), is stopped (SIGSTOP) and continued,
//!   killed (SIGKILL) and started again on its port;
//! - `log`: the audit stream (`stream = "audit"`, `outcomes = ["duplicate", "relay"]`) to the
//!   same receiver;
//! - `ex`: an exec program that exits 0, 1, 65 or 75, or hangs, as the test sets;
//! - `bus`: mqtt to a second Mosquitto whose ACL the test flips (PUBACK 0x87 while it
//!   refuses), and which is stopped (SIGSTOP) and continued; a persistent subscriber reads it.
//!
//! Steps: feed batches (one source, or two interleaved, with replays), `kill -9` and SIGTERM
//! of `run` and of the relay, starts, the receivers' faults above, and operator actions
//! (`relay retry --all`, `relay discard --all`, `relay skip --to` the head, also while the
//! http receiver is stopped with requests in flight). Every few steps the
//! operator heals everything (receivers fixed, processes up, parked events retried) and the
//! verdicts must turn green within the patience: the oracle is not vacuous.
//!
//! **The oracle**, after every step, for each config an operator points the tools at (the
//! sinks' config; in the relay topology also `run`'s): if `health` exits 0 (OK), `relay status`
//! says `caught_up` for every sink it lists and the report's verdict is `ok`, then for every
//! sink, every effect the audit log says was applied below the sink's head (and every audit
//! entry the audit sink selects) is at its receiver, or an audited operator action (a skip, a
//! discard) passed over it; nothing a skip or discard passed over is at the receiver unless
//! it said the receiver may hold it; the receiver holds no id no effect made; and the
//! accounting `relay status` prints (`delivered + retried + adopted`, `skipped + discarded`)
//! equals what the receiver and the audit log hold. The inspectors answer after any kill -9.
//!
//! `RG_TOPOLOGY_SEED=N` replays one seed, `RG_TOPOLOGY_SEEDS=N` runs seeds 1..=N (with
//! `RG_TOPOLOGY_FROM=F`: F..F+N-1), `RG_TOPOLOGY_STEPS=S` sets the steps per seed,
//! `RG_TOPOLOGY_VERBOSE=1` prints the step log of passing seeds too, `RG_TOPOLOGY_BIN=PATH`
//! runs another build of the binary (an older release, or a build with one fix taken out):
//! `scripts/relay-model.sh --topology` for a soak.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use replay_guard::json::Json;

use super::broker::{Broker, free_port, signal};
use super::common::{self, SplitMix64};
use super::relay::field;
use super::relay_model::{Group, SeedFigures, parse, run_seeds, wait_for};

/// Seeds and steps of the suite's run (one of each topology); the environment sets more.
const SUITE_SEEDS: [u64; 2] = [1, 6];
const SUITE_STEPS: usize = 32;
/// The operator heals everything every this many steps, and at the end.
const HEAL_EVERY: usize = 8;
/// Longest wait for the verdicts to turn green after a heal.
const PATIENCE: Duration = Duration::from_secs(90);
/// The sinks, in the order their receivers are checked.
const SINKS: [&str; 4] = ["cop", "log", "ex", "bus"];
/// Replays are drawn from this many of the latest lines (the window holds 24 keys).
const REPLAY_RECENT: usize = 8;
/// The audit sink's outcomes.
const AUDIT_OUTCOMES: [&str; 2] = ["duplicate", "relay"];

#[test]
fn green_verdicts_mean_every_effect_reached_its_receiver_in_every_topology() {
    run_seeds(
        ("topology model", "RG_TOPOLOGY", "topology_model::"),
        (&SUITE_SEEDS, SUITE_STEPS),
        |seed, log, steps| Model::new(seed, log).run(steps),
    );
}

/// What one seed did and saw.
#[derive(Clone, Debug, Default)]
struct Figures {
    seeds: u64,
    steps: u64,
    /// Oracle evaluations (per config) that found every verdict green, and that did not.
    green: u64,
    not_green: u64,
    heals: u64,
    kills: u64,
    relay_kills: u64,
    failed_starts: u64,
    refusals: u64,
    stops: u64,
    actions: u64,
    effects: u64,
    pruned: u64,
    /// Events the receivers got (all four), and repeats among them.
    received: u64,
    repeats: u64,
    seconds: f64,
}

impl SeedFigures for Figures {
    fn set_seconds(&mut self, seconds: f64) {
        self.seconds = seconds;
    }

    fn coverage(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("a green verdict checked against the receivers", self.green),
            ("a non-green verdict", self.not_green),
            ("a kill -9 of run", self.kills - self.relay_kills),
            ("a kill -9 of the relay", self.relay_kills),
            ("a relay failing at start", self.failed_starts),
            ("a receiver refusing", self.refusals),
            ("a receiver stopped (SIGSTOP)", self.stops),
            ("an operator action", self.actions),
            ("an effect pruned by retention", self.pruned),
        ]
    }

    fn add(&mut self, o: &Figures) {
        self.seeds += 1;
        self.steps += o.steps;
        self.green += o.green;
        self.not_green += o.not_green;
        self.heals += o.heals;
        self.kills += o.kills;
        self.relay_kills += o.relay_kills;
        self.failed_starts += o.failed_starts;
        self.refusals += o.refusals;
        self.stops += o.stops;
        self.actions += o.actions;
        self.effects += o.effects;
        self.pruned += o.pruned;
        self.received += o.received;
        self.repeats += o.repeats;
        self.seconds += o.seconds;
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} steps, {} green verdicts checked against the receivers, {} not green, {} heals, \
             {} kill -9 ({} of the relay), {} failed relay starts, {} refusals set, {} receivers stopped, {} \
             operator actions, {} effects ({} pruned), {} events received ({} repeats), {:.1} s",
            self.steps,
            self.green,
            self.not_green,
            self.heals,
            self.kills,
            self.relay_kills,
            self.failed_starts,
            self.refusals,
            self.stops,
            self.actions,
            self.effects,
            self.pruned,
            self.received,
            self.repeats,
            self.seconds
        )
    }
}

/// The binary under test: this build's, or `RG_TOPOLOGY_BIN`.
fn bin() -> PathBuf {
    std::env::var_os("RG_TOPOLOGY_BIN").map_or_else(common::bin, PathBuf::from)
}

fn rg(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn spawn_logged(args: &[&str], log: &Path) -> Group {
    Group::spawn(common::logged_command_of(&bin(), args, log))
}

fn member(v: &Json, k: &str) -> Json {
    match v {
        Json::Object(m) => m
            .iter()
            .find(|(n, _)| n == k)
            .map_or(Json::Null, |(_, v)| v.clone()),
        _ => Json::Null,
    }
}

fn num(v: &Json, k: &str) -> u64 {
    field(v, k).parse().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------
// Receivers

/// The http receiver: a process of its own (so it can be stopped and killed), answering each
/// POST with the status in its `status` file and keeping the body of each 2xx'd request, one
/// line per event, in `got_cop` or `got_audit` by path.
const WEB_PY: &str = r#"
import http.server, os, sys
port, d = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a):
        pass
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        try:
            code = int(open(os.path.join(d, "status")).read().strip() or "200")
        except (OSError, ValueError):
            code = 200
        if 200 <= code < 300:
            with open(os.path.join(d, "got_" + self.path.strip("/")), "ab") as f:
                for line in body.splitlines():
                    if line.strip():
                        f.write(line.strip() + b"\n")
                f.flush()
                os.fsync(f.fileno())
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()
class S(http.server.ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
S(("127.0.0.1", port), H).serve_forever()
"#;

struct Web {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    stopped: bool,
}

impl Web {
    fn start(dir: &Path) -> Web {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("web.py"), WEB_PY).unwrap();
        let mut w = Web {
            port: free_port(),
            dir: dir.to_path_buf(),
            child: None,
            stopped: false,
        };
        w.set_status(200);
        w.revive();
        w
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    fn set_status(&self, code: u16) {
        let tmp = self.dir.join("status.new");
        std::fs::write(&tmp, code.to_string()).unwrap();
        std::fs::rename(&tmp, self.dir.join("status")).unwrap();
    }

    fn alive(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the process (again) on its port; returns once it answers.
    fn revive(&mut self) {
        assert!(self.child.is_none());
        let child = Command::new("python3")
            .arg(self.dir.join("web.py"))
            .arg(self.port.to_string())
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3");
        self.child = Some(child);
        self.stopped = false;
        let port = self.port;
        wait_for("the http receiver listens", || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    fn sig(&mut self, sig: &str) {
        signal(self.child.as_ref().unwrap().id() as i32, sig);
    }

    fn stop(&mut self) {
        self.sig("STOP");
        self.stopped = true;
    }

    fn cont(&mut self) {
        self.sig("CONT");
        self.stopped = false;
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.stopped = false;
    }

    /// The ids of the events received on `path`.
    fn seen(&self, path: &str) -> Vec<String> {
        ids_of_lines(
            &std::fs::read_to_string(self.dir.join(format!("got_{path}"))).unwrap_or_default(),
        )
    }
}

impl Drop for Web {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `id` of each complete JSON line.
fn ids_of_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| field(&parse(l), "id"))
        .collect()
}

/// The exec sink's program: exits with the code in its `mode` file (0 keeps the batch,
/// renamed into its spool whole), or hangs with `hang`.
struct Exec {
    dir: PathBuf,
    script: PathBuf,
}

impl Exec {
    fn new(dir: &Path) -> Exec {
        let spool = dir.join("spool");
        std::fs::create_dir_all(&spool).unwrap();
        let script = dir.join("receiver.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nD={:?}\ntmp=\"$D/spool/.in.$$\"\nmode=$(cat \"$D/mode\" 2>/dev/null)\n\
                 cat > \"$tmp\" || exit 1\n\
                 if [ -s \"$tmp\" ] && [ -n \"$(tail -c 1 \"$tmp\")\" ]; then\n\
                 rm -f \"$tmp\"; echo 'incomplete batch' >&2; exit 1; fi\n\
                 case \"$mode\" in\n\
                 hang) rm -f \"$tmp\"; exec sleep 600 ;;\n\
                 0|'') mv \"$tmp\" \"$D/spool/$(date +%s%N).$$\" ;;\n\
                 *) rm -f \"$tmp\"; echo \"refused: exit $mode\" >&2; exit \"$mode\" ;;\n\
                 esac\n",
                dir.to_str().unwrap()
            ),
        )
        .unwrap();
        let e = Exec {
            dir: dir.to_path_buf(),
            script,
        };
        e.set_mode("0");
        e
    }

    fn set_mode(&self, mode: &str) {
        let tmp = self.dir.join("mode.new");
        std::fs::write(&tmp, mode).unwrap();
        std::fs::rename(&tmp, self.dir.join("mode")).unwrap();
    }

    fn seen(&self) -> Vec<String> {
        let spool = self.dir.join("spool");
        let mut names: Vec<String> = std::fs::read_dir(&spool)
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
            .iter()
            .flat_map(|n| ids_of_lines(&std::fs::read_to_string(spool.join(n)).unwrap()))
            .collect()
    }
}

/// The mqtt sink's broker (its ACL flipped to refuse the sink's topics) and a persistent
/// QoS 1 subscriber writing each payload on a line of its own.
struct Bus {
    broker: Broker,
    acl: PathBuf,
    sub: Child,
    out: PathBuf,
    allowed: bool,
    stopped: bool,
}

impl Bus {
    fn start(dir: &Path) -> Bus {
        std::fs::create_dir_all(dir).unwrap();
        let acl = dir.join("acl");
        std::fs::write(&acl, "topic read #\ntopic write cop/#\n").unwrap();
        let broker = Broker::start_with(
            dir,
            false,
            &format!("acl_file {}\nmax_queued_messages 100000\n", acl.display()),
        );
        let out = dir.join("sub.out");
        let sub = Command::new("mosquitto_sub")
            .args(["-h", "127.0.0.1", "-p", &broker.port.to_string()])
            .args([
                "-i",
                "rg-topology-rx",
                "-c",
                "-q",
                "1",
                "-t",
                "cop/#",
                "-F",
                "%p",
            ])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let b = Bus {
            broker,
            acl,
            sub,
            out,
            allowed: true,
            stopped: false,
        };
        // The subscriber is in before the first event is published.
        let probe = b.broker.port;
        wait_for("the bus subscriber is connected", || {
            Command::new("mosquitto_pub")
                .args(["-h", "127.0.0.1", "-p", &probe.to_string()])
                .args(["-q", "1", "-t", "cop/probe", "-m", "{\"id\":\"probe\"}"])
                .status()
                .unwrap()
                .success()
                && std::fs::read_to_string(&b.out)
                    .unwrap_or_default()
                    .contains("probe")
        });
        b
    }

    fn pid(&self) -> i32 {
        self.broker.pid()
    }

    /// Flips the ACL: the sink's topics writable or not (Mosquitto re-reads it on SIGHUP).
    fn allow(&mut self, yes: bool) {
        let text = if yes {
            "topic read #\ntopic write cop/#\n"
        } else {
            "topic read #\n"
        };
        std::fs::write(&self.acl, text).unwrap();
        signal(self.pid(), "HUP");
        self.allowed = yes;
    }

    fn stop(&mut self) {
        signal(self.pid(), "STOP");
        self.stopped = true;
    }

    fn cont(&mut self) {
        signal(self.pid(), "CONT");
        self.stopped = false;
    }

    fn seen(&self) -> Vec<String> {
        ids_of_lines(&std::fs::read_to_string(&self.out).unwrap_or_default())
            .into_iter()
            .filter(|id| id != "probe")
            .collect()
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        if self.stopped {
            self.cont();
        }
        let _ = self.sub.kill();
        let _ = self.sub.wait();
    }
}

// ---------------------------------------------------------------------------------------
// The model

/// What the verdicts said under one config.
struct Verdicts {
    health: Option<i32>,
    health_text: String,
    /// Each sink `relay status` lists: its row.
    rows: BTreeMap<String, Json>,
    report: String,
}

impl Verdicts {
    fn green(&self) -> bool {
        self.health == Some(0)
            && self.report == "ok"
            && self.rows.values().all(|r| field(r, "state") == "caught_up")
    }

    fn summary(&self) -> String {
        let states: Vec<String> = self
            .rows
            .iter()
            .map(|(n, r)| format!("{n} {}", field(r, "state")))
            .collect();
        format!(
            "health {:?} ({}), report {}, {}",
            self.health,
            self.health_text.lines().next().unwrap_or_default(),
            self.report,
            states.join(", ")
        )
    }
}

/// The audit log as the oracle reads it.
#[derive(Default)]
struct Audit {
    /// Applied effects: offset -> event id.
    applied: BTreeMap<u64, String>,
    /// Entries the audit sink selects: index -> event id.
    selected: BTreeMap<u64, String>,
    /// Per sink: positions an audited action passed over, and those a skip said had been
    /// offered to the receiver, or a discard said a pending retry may have delivered (the
    /// receiver may hold them).
    passed: BTreeMap<String, BTreeSet<u64>>,
    offered: BTreeMap<String, BTreeSet<u64>>,
}

struct Model {
    plan: SplitMix64,
    rng: SplitMix64,
    seed: u64,
    dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    /// Sinks in a relay of their own (`[relay] sinks_from`), or inside `run`.
    unit: bool,
    feed: Broker,
    web: Web,
    exec: Exec,
    bus: Bus,
    run_cfg: PathBuf,
    relay_cfg: PathBuf,
    db: PathBuf,
    run: Option<Group>,
    relay: Option<Group>,
    runs: u64,
    sources: Vec<&'static str>,
    next_seq: Vec<u64>,
    /// Every line published (replays are drawn from these).
    lines: Vec<String>,
    /// Published fresh messages: the effects the store must come to hold.
    fresh: u64,
    /// The relay has been started once (it starts late).
    relay_began: bool,
    /// Before this step the relay is never started, nor the operator heals (the relay
    /// topology): retention has pruned by then.
    late_until: usize,
    figures: Figures,
}

impl Model {
    fn new(seed: u64, log: Arc<Mutex<Vec<String>>>) -> Model {
        let mut plan = SplitMix64::new(seed.wrapping_mul(0x9e37_79b9) ^ 0x70b0);
        let dir = tempfile::Builder::new()
            .prefix("rg-topology-model-")
            .tempdir()
            .unwrap()
            .keep();
        let unit = seed.is_multiple_of(2);
        let feed = Broker::start(&dir.join("feed"), false);
        let web = Web::start(&dir.join("web"));
        let exec = Exec::new(&dir.join("ex"));
        let bus = Bus::start(&dir.join("bus"));
        let db = dir.join("rg.redb");
        let backoff = "backoff_initial_ms = 10\nbackoff_max_ms = 200\n";
        let sinks = format!(
            "[[sink]]\nname = \"cop\"\nkind = \"http\"\nurl = \"{}\"\nbatch_max = {}\n\
             max_in_flight = {}\ntimeout_ms = 1500\n{backoff}\
             [[sink]]\nname = \"log\"\nkind = \"http\"\nurl = \"{}\"\nstream = \"audit\"\n\
             outcomes = {AUDIT_OUTCOMES:?}\nbatch_max = {}\ntimeout_ms = 1500\n{backoff}\
             [[sink]]\nname = \"ex\"\nkind = \"exec\"\ncommand = [\"/bin/sh\", {:?}]\n\
             batch_max = {}\ntimeout_ms = 1500\n{backoff}\
             [[sink]]\nname = \"bus\"\nkind = \"mqtt\"\nbroker = \"{}\"\nprotocol = \"v5\"\n\
             client_id = \"rg-topology-bus\"\ntopic = \"cop/{{agency}}/{{source_id}}\"\n\
             batch_max = {}\ntimeout_ms = 1500\n{backoff}",
            web.url("cop"),
            1 + plan.below(20),
            1 + plan.below(3),
            web.url("audit"),
            1 + plan.below(20),
            exec.script.to_str().unwrap(),
            1 + plan.below(20),
            bus.broker.url(),
            1 + plan.below(20),
        );
        let store = format!(
            "[store]\npath = {:?}\n[service]\nshutdown_timeout_seconds = 5\n",
            db.to_str().unwrap()
        );
        // A short window and effect log: retention prunes as the feed goes.
        let retention = "[window]\nmax_entries = 24\n[retention]\neffects_max_entries = 12\n";
        let relay_section = "[relay]\nsource = \"urn:rg-topology\"\n";
        let mqtt = format!(
            "[mqtt]\nbrokers = [{:?}]\nclient_id = \"rg-topology-run\"\ntopics = [\"incidents/#\"]\n\
             [commit]\nlinger_ms = 5\n",
            feed.url()
        );
        let run_cfg = dir.join("run.toml");
        let relay_cfg = dir.join("relay.toml");
        if unit {
            std::fs::write(
                &run_cfg,
                format!("{store}{retention}{mqtt}[relay]\nsinks_from = \"relay.toml\"\n"),
            )
            .unwrap();
            std::fs::write(
                &relay_cfg,
                format!("{store}{retention}{relay_section}{sinks}"),
            )
            .unwrap();
        } else {
            std::fs::write(
                &run_cfg,
                format!("{store}{retention}{mqtt}{relay_section}{sinks}"),
            )
            .unwrap();
        }
        let plan_late = plan.below(8);
        let m = Model {
            rng: SplitMix64::new(plan.next_u64()),
            plan,
            seed,
            dir,
            log,
            unit,
            feed,
            web,
            exec,
            bus,
            run_cfg,
            relay_cfg,
            db,
            run: None,
            relay: None,
            runs: 0,
            sources: vec!["e1", "e2", "e3"],
            next_seq: vec![1; 3],
            lines: Vec::new(),
            fresh: 0,
            relay_began: false,
            late_until: if unit { 10 + plan_late as usize } else { 0 },
            figures: Figures::default(),
        };
        m.note(format!(
            "seed {} in {}: the sinks {}",
            m.seed,
            m.dir.display(),
            if unit {
                "in a relay of their own (run's config: sinks_from)"
            } else {
                "inside run"
            }
        ));
        m
    }

    fn note(&self, line: String) {
        self.log.lock().unwrap().push(line);
    }

    /// The config the sinks are in (the operator's commands name it).
    fn sinks_cfg(&self) -> &Path {
        if self.unit {
            &self.relay_cfg
        } else {
            &self.run_cfg
        }
    }

    fn cmd(&self, cfg: &Path, args: &[&str]) -> (Option<i32>, String, String) {
        let mut all = args.to_vec();
        all.extend(["--config", cfg.to_str().unwrap()]);
        rg(&all)
    }

    fn run(mut self, steps: usize) -> Figures {
        self.start_run();
        for step in 1..=steps {
            self.figures.steps += 1;
            let what = self.step(step);
            self.note(format!("{step:>3} {what}"));
            std::thread::sleep(Duration::from_millis(self.rng.below(150)));
            self.oracle(step);
            if (step % HEAL_EVERY == 0 && step >= self.late_until) || step == steps {
                self.heal(step);
            }
        }
        if let Some(r) = self.relay.take() {
            assert_eq!(r.term(), Some(0), "relay on SIGTERM");
        }
        if let Some(r) = self.run.take() {
            assert_eq!(r.term(), Some(0), "run on SIGTERM");
        }
        let audit = self.audit();
        self.figures.effects = audit.applied.len() as u64;
        for sink in SINKS {
            let seen = self.seen(sink);
            let ids: HashSet<&String> = seen.iter().collect();
            self.figures.received += seen.len() as u64;
            self.figures.repeats += (seen.len() - ids.len()) as u64;
        }
        self.figures.pruned = audit
            .applied
            .len()
            .saturating_sub(common::effects(&self.db).len()) as u64;
        let figures = self.figures.clone();
        let dir = self.dir.clone();
        drop(self);
        std::fs::remove_dir_all(&dir).unwrap();
        figures
    }

    fn start_run(&mut self) {
        assert!(self.run.is_none());
        self.runs += 1;
        let log = self.dir.join(format!("run-{}.log", self.runs));
        let mut run = spawn_logged(&["run", "--config", self.run_cfg.to_str().unwrap()], &log);
        wait_for("run subscribed", || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(run.running(), "run exited: {text}");
            text.contains("subscribed broker=")
        });
        self.run = Some(run);
    }

    fn start_relay(&mut self) {
        assert!(self.relay.is_none() && self.unit);
        let log = self.dir.join("relay.log");
        let before = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("relay started")
            .count();
        let mut relay = spawn_logged(
            &["relay", "--config", self.relay_cfg.to_str().unwrap()],
            &log,
        );
        wait_for("relay up", || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(relay.running(), "relay exited: {text}");
            text.matches("relay started").count() > before
        });
        self.relay = Some(relay);
        self.relay_began = true;
    }

    /// One random step among those that apply now.
    fn step(&mut self, step: usize) -> String {
        #[derive(Clone, Copy, Debug)]
        enum Kind {
            Publish,
            KillRun,
            StopRun,
            StartRun,
            StartRelay,
            KillRelay,
            StopRelay,
            BrokenRelay,
            WebStatus,
            WebStop,
            WebCont,
            WebKill,
            WebRevive,
            ExecMode,
            BusAcl,
            BusStop,
            BusCont,
            Retry,
            Discard,
            Skip,
            StallSkip,
            Pause,
        }
        let mut choices: Vec<(u64, Kind)> = vec![(12, Kind::Publish), (3, Kind::Pause)];
        if self.run.is_some() {
            choices.extend([(3, Kind::KillRun), (1, Kind::StopRun)]);
        } else {
            choices.push((8, Kind::StartRun));
        }
        if self.unit {
            if self.relay.is_some() {
                choices.extend([(3, Kind::KillRelay), (1, Kind::StopRelay)]);
            } else if step >= self.late_until {
                choices.push((5, Kind::StartRelay));
            }
            choices.push((1, Kind::BrokenRelay));
        }
        if !self.web.alive() {
            choices.push((4, Kind::WebRevive));
        } else if self.web.stopped {
            choices.push((4, Kind::WebCont));
        } else {
            choices.extend([(6, Kind::WebStatus), (2, Kind::WebStop), (1, Kind::WebKill)]);
        }
        choices.extend([(4, Kind::ExecMode), (2, Kind::BusAcl)]);
        choices.push(if self.bus.stopped {
            (4, Kind::BusCont)
        } else {
            (1, Kind::BusStop)
        });
        choices.extend([
            (4, Kind::Retry),
            (2, Kind::Discard),
            (2, Kind::Skip),
            (2, Kind::StallSkip),
        ]);
        if self.unit && step + 1 == self.late_until {
            // The relay's first start fails: a TOML error in its config.
            choices = vec![(1, Kind::BrokenRelay)];
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
        match kind {
            Kind::Publish => self.publish(),
            Kind::KillRun => {
                self.run.take().unwrap().kill9();
                self.figures.kills += 1;
                "run killed -9".into()
            }
            Kind::StopRun => {
                let code = self.run.take().unwrap().term();
                assert_eq!(code, Some(0), "run on SIGTERM");
                "run stopped (SIGTERM, exit 0)".into()
            }
            Kind::StartRun => {
                self.start_run();
                "run started".into()
            }
            Kind::StartRelay => {
                let late = if self.relay_began {
                    ""
                } else {
                    " (late: its first start)"
                };
                self.start_relay();
                format!("relay started{late}")
            }
            Kind::KillRelay => {
                self.relay.take().unwrap().kill9();
                self.figures.kills += 1;
                self.figures.relay_kills += 1;
                "relay killed -9".into()
            }
            Kind::StopRelay => {
                let code = self.relay.take().unwrap().term();
                assert_eq!(code, Some(0), "relay on SIGTERM");
                "relay stopped (SIGTERM, exit 0)".into()
            }
            Kind::BrokenRelay => self.broken_relay(),
            Kind::WebStatus => {
                const CODES: [u16; 14] = [
                    200, 200, 200, 200, 400, 401, 403, 404, 409, 422, 429, 500, 502, 503,
                ];
                let code = CODES[self.rng.below(CODES.len() as u64) as usize];
                self.web.set_status(code);
                if code != 200 {
                    self.figures.refusals += 1;
                }
                format!("http receiver answers {code}")
            }
            Kind::WebStop => {
                self.web.stop();
                self.figures.stops += 1;
                "http receiver stopped (SIGSTOP)".into()
            }
            Kind::WebCont => {
                self.web.cont();
                "http receiver continued (SIGCONT)".into()
            }
            Kind::WebKill => {
                self.web.kill();
                "http receiver killed (SIGKILL)".into()
            }
            Kind::WebRevive => {
                self.web.revive();
                "http receiver started again".into()
            }
            Kind::ExecMode => {
                const MODES: [&str; 7] = ["0", "0", "0", "1", "65", "75", "hang"];
                let mode = MODES[self.rng.below(MODES.len() as u64) as usize];
                self.exec.set_mode(mode);
                if mode != "0" {
                    self.figures.refusals += 1;
                }
                format!("exec program: {mode}")
            }
            Kind::BusAcl => {
                let yes = !self.bus.allowed;
                self.bus.allow(yes);
                if !yes {
                    self.figures.refusals += 1;
                }
                format!(
                    "bus broker's ACL {}",
                    if yes {
                        "allows the sink"
                    } else {
                        "refuses the sink (0x87)"
                    }
                )
            }
            Kind::BusStop => {
                self.bus.stop();
                self.figures.stops += 1;
                "bus broker stopped (SIGSTOP)".into()
            }
            Kind::BusCont => {
                self.bus.cont();
                "bus broker continued (SIGCONT)".into()
            }
            Kind::Retry => self.action("retry", None),
            Kind::Discard => self.action("discard", None),
            Kind::Skip => self.action("skip", None),
            Kind::StallSkip => self.stall_skip(),
            Kind::Pause => {
                let ms = 200 + self.rng.below(1500);
                std::thread::sleep(Duration::from_millis(ms));
                format!("pause {ms} ms")
            }
        }
    }

    /// A batch to the feed: one source, or two interleaved; a fifth replays earlier lines.
    fn publish(&mut self) -> String {
        let n = 1 + self.rng.below(25) as usize;
        let two = self.rng.below(3) == 0;
        let a = self.rng.below(3) as usize;
        let b = (a + 1 + self.rng.below(2) as usize) % 3;
        let mut out = Vec::new();
        let mut fresh = 0;
        for k in 0..n {
            // Replays of recent lines: within the window, so provably duplicates.
            if !self.lines.is_empty() && self.rng.below(5) == 0 {
                let recent = self.lines.len().min(REPLAY_RECENT);
                let at = self.lines.len() - 1 - self.rng.below(recent as u64) as usize;
                let l = self.lines[at].clone();
                out.push(l);
                continue;
            }
            let s = if two && k % 2 == 1 { b } else { a };
            let seq = self.next_seq[s];
            self.next_seq[s] += 1;
            let line = common::msg("fire", self.sources[s], 1, seq, &format!("status-{seq}"));
            self.lines.push(line.clone());
            out.push(line);
            fresh += 1;
        }
        self.fresh += fresh;
        self.feed
            .publish_lines("incidents/feed", &out, "rg-topology-pub");
        // Mostly applied before the next step (the sinks then have work); sometimes not.
        let applied = if self.run.is_some() && self.rng.below(3) > 0 {
            let fresh = self.fresh;
            wait_for("run applies the batch", || {
                self.audit().applied.len() as u64 >= fresh
            });
            ", applied"
        } else {
            ""
        };
        format!(
            "{n} lines published ({fresh} fresh, {}){applied}, {} fresh in all",
            if two {
                "two sources interleaved"
            } else {
                "one source"
            },
            self.fresh
        )
    }

    /// `relay` with a config holding a TOML error: it must exit non-zero, at once.
    fn broken_relay(&mut self) -> String {
        let broken = self.dir.join("relay-broken.toml");
        let text = std::fs::read_to_string(if self.unit {
            &self.relay_cfg
        } else {
            &self.run_cfg
        })
        .unwrap();
        std::fs::write(&broken, format!("{text}\n[[sink]\nname = \"typo\"\n")).unwrap();
        let mut child = Command::new(bin())
            .args(["relay", "--config", broken.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (status, err) = common::exit_and_stderr(
            &mut child,
            Duration::from_secs(20),
            "a relay with a broken config",
        );
        let code = status.code();
        assert!(
            matches!(code, Some(1) | Some(2)),
            "a relay with a broken config: {status:?}: {err}"
        );
        self.figures.failed_starts += 1;
        format!(
            "relay started with a TOML error: exit {code:?}: {}",
            err.lines().next().unwrap_or_default()
        )
    }

    /// An operator action on a random sink: `retry --all`, `discard --all` or `skip --to`
    /// the head.
    fn action(&mut self, what: &str, only: Option<&'static str>) -> String {
        // A sink the action does something to, where there is one: parked events for a retry
        // or a discard, a cursor short of its head for a skip.
        let cfg = self.sinks_cfg().to_path_buf();
        let rows = self.rows(&cfg);
        let fits: Vec<&str> = SINKS
            .iter()
            .copied()
            .filter(|k| {
                rows.get(*k).is_some_and(|r| match what {
                    "skip" => num(r, "cursor") < num(r, "head"),
                    _ => num(r, "parked") > 0,
                })
            })
            .collect();
        let sink = if let Some(k) = only {
            k
        } else if fits.is_empty() {
            SINKS[self.rng.below(SINKS.len() as u64) as usize]
        } else {
            fits[self.rng.below(fits.len() as u64) as usize]
        };
        let (code, out, err) = match what {
            "skip" => {
                let head = rows.get(sink).map_or("0".to_string(), |r| field(r, "head"));
                self.cmd(
                    &cfg,
                    &[
                        "relay",
                        "skip",
                        "--sink",
                        sink,
                        "--to",
                        &head,
                        "--yes",
                        "--reason",
                        "model: pass over",
                        "--operator",
                        "model",
                    ],
                )
            }
            _ => self.cmd(
                &cfg,
                &[
                    "relay",
                    what,
                    "--sink",
                    sink,
                    "--all",
                    "--reason",
                    "model",
                    "--operator",
                    "model",
                ],
            ),
        };
        // Refused when there is nothing to do (no parked event, nothing to pass over): exit 1
        // with a reason, never a crash.
        assert!(
            code == Some(0) || (code == Some(1) && err.starts_with("replay-guard: error: ")),
            "relay {what} --sink {sink}: {code:?}\n{out}{err}"
        );
        if code == Some(0) {
            self.figures.actions += 1;
        }
        let said = if code == Some(0) { out } else { err };
        format!(
            "relay {what} --sink {sink}: exit {code:?}: {}",
            said.lines().next().unwrap_or_default()
        )
    }

    /// The http receiver stalls (SIGSTOP) with requests in flight, the operator skips the
    /// `cop` sink to its head, and the receiver goes on: it takes in what it had read, which
    /// the skip must have said may be there.
    fn stall_skip(&mut self) -> String {
        if !self.web.alive() {
            self.web.revive();
        }
        if !self.web.stopped {
            self.web.stop();
            self.figures.stops += 1;
        }
        let published = self.publish();
        std::thread::sleep(Duration::from_millis(100 + self.rng.below(400)));
        let skipped = self.action("skip", Some("cop"));
        std::thread::sleep(Duration::from_millis(self.rng.below(200)));
        self.web.cont();
        format!("http receiver stopped (SIGSTOP); {published}; {skipped}; receiver continued")
    }

    /// The operator fixes everything: receivers answer, processes run, parked events are
    /// retried; then every verdict must turn green.
    fn heal(&mut self, step: usize) {
        self.figures.heals += 1;
        if !self.web.alive() {
            self.web.revive();
        }
        if self.web.stopped {
            self.web.cont();
        }
        self.web.set_status(200);
        self.exec.set_mode("0");
        if !self.bus.allowed {
            self.bus.allow(true);
        }
        if self.bus.stopped {
            self.bus.cont();
        }
        if self.run.is_none() {
            self.start_run();
        }
        if self.unit && self.relay.is_none() {
            self.start_relay();
        }
        // Everything published is applied before the verdicts are awaited.
        let fresh = self.fresh;
        wait_for("run applies everything published", || {
            self.audit().applied.len() as u64 >= fresh
        });
        let start = Instant::now();
        let mut retried = BTreeSet::new();
        loop {
            let cfgs = self.cfgs();
            let v: Vec<Verdicts> = cfgs.iter().map(|c| self.verdicts(c)).collect();
            if v.iter().all(Verdicts::green) {
                break;
            }
            // Parked events: retried once the receivers are fixed.
            for (name, row) in &v[0].rows {
                if num(row, "parked") > 0 && retried.insert(name.clone()) {
                    let (code, _, err) = self.cmd(
                        &cfgs[0],
                        &[
                            "relay",
                            "retry",
                            "--sink",
                            name,
                            "--all",
                            "--reason",
                            "receiver fixed",
                            "--operator",
                            "model",
                        ],
                    );
                    assert!(matches!(code, Some(0) | Some(1)), "relay retry: {err}");
                }
            }
            assert!(
                start.elapsed() < PATIENCE,
                "step {step}: healed, but not green within {PATIENCE:?}: {}",
                v.iter()
                    .map(Verdicts::summary)
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.note(format!(
            "{step:>3} healed: green after {:.1} s",
            start.elapsed().as_secs_f64()
        ));
        self.oracle(step);
    }

    /// The configs an operator points the tools at.
    fn cfgs(&self) -> Vec<PathBuf> {
        let mut v = vec![self.sinks_cfg().to_path_buf()];
        if self.unit {
            v.push(self.run_cfg.clone());
        }
        v
    }

    fn verdicts(&self, cfg: &Path) -> Verdicts {
        // The window is small on purpose (retention prunes only below it), so always full:
        // its fill is no check of the relay's.
        let (health, health_text, herr) = self.cmd(
            cfg,
            &[
                "health",
                "--warn-window-fill",
                "off",
                "--crit-window-fill",
                "off",
            ],
        );
        assert!(
            matches!(health, Some(0..=2)),
            "health --config {}: {health:?} (UNKNOWN: the inspector could not read the file)\n\
             {health_text}{herr}",
            cfg.display()
        );
        let (code, out, err) = self.cmd(cfg, &["relay", "status", "--format", "json"]);
        assert_eq!(
            code,
            Some(0),
            "relay status --config {}: {err}",
            cfg.display()
        );
        let rows = status_rows(&out);
        let (code, out, err) = self.cmd(cfg, &["report", "--format", "json", "-o", "-"]);
        assert_eq!(code, Some(0), "report --config {}: {err}", cfg.display());
        let doc = parse(out.trim());
        let report = field(&member(&doc, "verify"), "verdict");
        Verdicts {
            health,
            health_text,
            rows,
            report,
        }
    }

    /// The audit log: applied effects, the entries the audit sink selects, and each sink's
    /// passed-over positions.
    fn audit(&self) -> Audit {
        let (code, out, err) = self.cmd(&self.run_cfg, &["dump-audit"]);
        assert_eq!(code, Some(0), "dump-audit: {err}");
        let mut a = Audit::default();
        for l in out.lines().filter(|l| !l.trim().is_empty()) {
            let e = parse(l);
            let outcome = field(&e, "outcome");
            let index: u64 = field(&e, "index").parse().unwrap();
            if matches!(outcome.as_str(), "applied" | "applied_late") {
                a.applied.insert(
                    field(&e, "effect_offset").parse().unwrap(),
                    field(&e, "key"),
                );
            }
            if AUDIT_OUTCOMES.contains(&outcome.as_str()) {
                let hash = field(&e, "hash");
                a.selected.insert(index, format!("{index}-{}", &hash[..16]));
            }
            if outcome != "relay" {
                continue;
            }
            let reason = field(&e, "reason");
            if let Some(rest) = reason.strip_prefix("relay skip of sink ") {
                // "NAME from offset A to B by ...: ..., the blocking event at offset A left parked"
                let w: Vec<&str> = rest.split(' ').collect();
                let (from, to): (u64, u64) = (w[3].parse().unwrap(), w[5].parse().unwrap());
                let from = if reason.contains("left parked") {
                    from + 1
                } else {
                    from
                };
                a.passed
                    .entry(w[0].to_string())
                    .or_default()
                    .extend(from..to);
                if reason.contains("offered") {
                    a.offered
                        .entry(w[0].to_string())
                        .or_default()
                        .extend(from..to);
                }
            } else if let Some(rest) = reason.strip_prefix("relay discard of event ") {
                // "ID (offset O) on sink NAME by ..."
                let o: u64 = rest
                    .split("(offset ")
                    .nth(1)
                    .and_then(|r| r.split(')').next())
                    .unwrap()
                    .parse()
                    .unwrap();
                let name = rest
                    .split(" on sink ")
                    .nth(1)
                    .unwrap()
                    .split(' ')
                    .next()
                    .unwrap();
                a.passed.entry(name.to_string()).or_default().insert(o);
                if reason.ends_with("so the receiver may hold it") {
                    a.offered.entry(name.to_string()).or_default().insert(o);
                }
            }
        }
        a
    }

    /// The ids a sink's receiver holds (the bus: what the subscriber has read).
    fn seen(&self, sink: &str) -> Vec<String> {
        match sink {
            "cop" => self.web.seen("cop"),
            "log" => self.web.seen("audit"),
            "ex" => self.exec.seen(),
            "bus" => self.bus.seen(),
            _ => unreachable!(),
        }
    }

    /// `relay status`'s rows under `cfg`.
    fn rows(&self, cfg: &Path) -> BTreeMap<String, Json> {
        let (code, out, err) = self.cmd(cfg, &["relay", "status", "--format", "json"]);
        assert_eq!(
            code,
            Some(0),
            "relay status --config {}: {err}",
            cfg.display()
        );
        status_rows(&out)
    }

    /// The oracle, under each config: each verdict on its own, then all together.
    /// - a sink `relay status` says is `caught_up`: its receiver holds everything below the
    ///   head that row gives (or an audited action passed over it), and its counts match;
    /// - the report's verdict `ok`: every sink's receiver holds everything below the heads
    ///   read before the report;
    /// - `health` OK: no sink had an event parked, nor was blocked, both before and after it;
    /// - all three: counted as a green verdict.
    fn oracle(&mut self, step: usize) {
        for cfg in self.cfgs() {
            let name = cfg.file_name().unwrap().to_string_lossy().into_owned();
            let before = self.rows(self.sinks_cfg());
            let parked_before: BTreeMap<&str, BTreeSet<u64>> = SINKS
                .iter()
                .filter(|k| before.get(**k).is_some_and(|r| num(r, "parked") > 0))
                .map(|k| (*k, self.parked(k)))
                .collect();
            let v = self.verdicts(&cfg);
            let after = self.rows(self.sinks_cfg());
            let mut audit = None;
            let mut lines = Vec::new();
            // The report.
            if v.report == "ok" {
                let a = audit.get_or_insert_with(|| self.audit());
                for sink in SINKS {
                    let head = before.get(sink).map(|r| num(r, "head"));
                    let what = format!("the report's verdict is ok under {name}");
                    lines.push(self.check_receiver(step, &what, a, sink, head, None));
                }
            }
            // Each sink said caught up.
            for (sink, row) in &v.rows {
                if field(row, "state") != "caught_up" {
                    continue;
                }
                let a = audit.get_or_insert_with(|| self.audit());
                let what = format!("relay status --config {name} says {sink} is caught_up");
                let head = Some(num(row, "head"));
                self.check_receiver(step, &what, a, sink, head, Some(row));
            }
            // Health.
            if v.health == Some(0) {
                for sink in SINKS {
                    let (Some(b), Some(a)) = (before.get(sink), after.get(sink)) else {
                        continue;
                    };
                    let blocked = |r: &Json| field(r, "state") == "blocked";
                    assert!(
                        !(blocked(b) && blocked(a)),
                        "step {step}, seed {}: health --config {name} is OK while sink {sink} \
                         was blocked before and after it: {}",
                        self.seed,
                        v.summary()
                    );
                    if let Some(p1) = parked_before.get(sink)
                        && num(a, "parked") > 0
                    {
                        // Parked before the health check and still now: parked throughout
                        // (a parked record goes only when its event is delivered or
                        // discarded; the model's steps do not run during the oracle).
                        let now = self.parked(sink);
                        let both: Vec<&u64> = p1.intersection(&now).collect();
                        assert!(
                            both.is_empty(),
                            "step {step}, seed {}: health --config {name} is OK while sink \
                             {sink} has had events parked throughout ({both:?}): {}",
                            self.seed,
                            v.summary()
                        );
                    }
                }
            }
            if v.green() {
                self.figures.green += 1;
                self.note(format!(
                    "{step:>3} green under {name}: {}",
                    lines.join("; ")
                ));
            } else {
                self.figures.not_green += 1;
            }
        }
    }

    /// The offsets sink `sink` has parked (`relay parked`).
    fn parked(&self, sink: &str) -> BTreeSet<u64> {
        let (code, out, err) = self.cmd(self.sinks_cfg(), &["relay", "parked", "--sink", sink]);
        assert_eq!(code, Some(0), "relay parked --sink {sink}: {err}");
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| field(&parse(l), "offset").parse().unwrap())
            .collect()
    }

    /// One sink's receiver against the audit log, below `head`; with `row` (its `relay
    /// status` row), also its accounting.
    fn check_receiver(
        &mut self,
        step: usize,
        what: &str,
        audit: &Audit,
        sink: &str,
        head: Option<u64>,
        row: Option<&Json>,
    ) -> String {
        let label = format!("step {step}, seed {}: {what}, sink {sink}", self.seed);
        let Some(head) = head else {
            panic!("{label}: relay status does not list the sink");
        };
        let audit_sink = sink == "log";
        let wanted: &BTreeMap<u64, String> = if audit_sink {
            &audit.selected
        } else {
            &audit.applied
        };
        let passed = audit.passed.get(sink).cloned().unwrap_or_default();
        let offered = audit.offered.get(sink).cloned().unwrap_or_default();
        let due: Vec<(u64, &String)> = wanted
            .range(..head)
            .filter(|(o, _)| !passed.contains(o))
            .map(|(o, id)| (*o, id))
            .collect();
        // The bus's subscriber reads what the broker acknowledged a moment later.
        let mut seen = self.seen(sink);
        if sink == "bus" {
            let start = Instant::now();
            while due.iter().any(|(_, id)| !seen.contains(id))
                && start.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(50));
                seen = self.seen(sink);
            }
        }
        let ids: HashSet<&str> = seen.iter().map(String::as_str).collect();
        // Every due effect (or selected entry) is at the receiver.
        let missing: Vec<u64> = due
            .iter()
            .filter(|(_, id)| !ids.contains(id.as_str()))
            .map(|(o, _)| *o)
            .collect();
        assert!(
            missing.is_empty(),
            "{label}: {} of the {} due below head {head} are not at the receiver, and no \
             audited action passed over them: {missing:?} (passed over: {passed:?})",
            missing.len(),
            due.len()
        );
        // Nothing at the receiver that no effect (entry) made; nothing an audited action
        // passed over as never delivered, unless it said the receiver may hold it.
        let by_id: BTreeMap<&str, u64> = wanted.iter().map(|(o, id)| (id.as_str(), *o)).collect();
        for id in &ids {
            let Some(o) = by_id.get(id) else {
                panic!("{label}: the receiver holds {id}, which no effect or selected entry made");
            };
            assert!(
                !passed.contains(o) || offered.contains(o),
                "{label}: {id} (position {o}) is at the receiver, but an audited action passed \
                 it over as never delivered"
            );
        }
        let summary = format!(
            "{sink} {} due, {} received ({} ids), {} passed over",
            due.len(),
            seen.len(),
            ids.len(),
            passed.len()
        );
        let Some(row) = row else {
            return summary;
        };
        // The accounting equals what the receiver and the audit log hold.
        let acc = member(row, "accounting");
        assert_eq!(
            field(&acc, "problem"),
            "null",
            "{label}: {}",
            acc.to_compact()
        );
        let (from, to) = (num(&acc, "from"), num(&acc, "to"));
        let in_ledger = |o: &u64| (from..to).contains(o);
        let delivered = num(&acc, "delivered") + num(&acc, "retried") + num(&acc, "adopted");
        let want_delivered = due.iter().filter(|(o, _)| in_ledger(o)).count() as u64;
        assert_eq!(
            delivered,
            want_delivered,
            "{label}: delivered + retried + adopted against the due positions in {from}..{to}: {}",
            acc.to_compact()
        );
        if !audit_sink {
            let passed_here = passed.iter().filter(|o| in_ledger(o)).count() as u64;
            assert_eq!(
                num(&acc, "skipped") + num(&acc, "discarded"),
                passed_here,
                "{label}: skipped + discarded against the audit log's pass-overs: {}",
                acc.to_compact()
            );
        }
        assert_eq!(
            num(&acc, "parked"),
            0,
            "{label}: caught up with events parked"
        );
        summary
    }
}

/// `relay status --format json`'s rows, by sink.
fn status_rows(out: &str) -> BTreeMap<String, Json> {
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
