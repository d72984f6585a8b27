//! `demo`: a real failover replay, end to end, in one process with nothing installed. Two
//! in-process MQTT brokers (primary and standby), a scripted field feed published at QoS 1,
//! the real `run` service consuming it into a redb file, and a naive consumer that applies
//! everything beside it. The primary autosaves its sessions mid-surge, delivers, then fails;
//! the standby starts from the autosave and re-delivers what the consumers had already
//! applied and acknowledged. The demo then compares the two Common Operating Pictures and
//! checks its own result: it succeeds only if every event was applied exactly once.

mod broker;
pub(crate) mod feed;

/// The broker's packet codec check, for the fuzz target and its regression inputs.
#[doc(hidden)]
pub use broker::check_codec as check_broker_codec;

use std::io::Write;
use std::net::TcpListener;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use broker::Broker;
use feed::{Cop, Script};

use crate::config::{BrokerUrl, Config};
use crate::model::{Outcome, hex};
use crate::store::{Reader, StoreError};
use crate::transport::{self, TransportEvent};

const TOPIC: &str = "incidents/sacramento";
const GUARD_ID: &str = "replay-guard-cop";
const NAIVE_ID: &str = "naive-cop";
/// How long any one stage may take before the demo gives up.
const STAGE_LIMIT: Duration = Duration::from_secs(60);

pub struct DemoOptions {
    pub seed: u64,
    pub messages: usize,
    /// Keep the database here (must not exist yet); default: a new temp directory.
    pub db: Option<PathBuf>,
    pub colour: bool,
}

/// What the demo found.
pub struct DemoResult {
    pub exactly_once: bool,
    pub db: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
}

fn failed(what: impl std::fmt::Display) -> DemoError {
    DemoError::Failed(what.to_string())
}

/// Terminal styling, or none.
struct Style(bool);
impl Style {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\u{1b}[{code}m{s}\u{1b}[0m")
        } else {
            s.to_string()
        }
    }
    fn bold(&self, s: &str) -> String {
        self.paint("1", s)
    }
    fn good(&self, s: &str) -> String {
        self.paint("1;32", s)
    }
    fn bad(&self, s: &str) -> String {
        self.paint("1;31", s)
    }
    fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }
}

/// Binds a free loopback port.
fn listener() -> Result<TcpListener, DemoError> {
    TcpListener::bind("127.0.0.1:0").map_err(|e| failed(format!("cannot bind loopback: {e}")))
}

/// Waits for `done`, failing if it takes longer than a stage may or the service stops.
fn wait(guard: &mut Guard, what: &str, mut done: impl FnMut() -> bool) -> Result<(), DemoError> {
    let start = Instant::now();
    while !done() {
        if let Some(why) = guard.stopped() {
            return Err(failed(format!(
                "the service stopped while waiting for {what}: {why}"
            )));
        }
        if start.elapsed() > STAGE_LIMIT {
            return Err(failed(format!("timed out waiting for {what}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The naive consumer: the same transport, applies every delivery at once, then acks.
struct Naive {
    cop: Arc<Mutex<Cop>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Naive {
    fn start(config: &Config) -> Result<Naive, DemoError> {
        let mut mqtt = config
            .mqtt
            .clone()
            .ok_or_else(|| failed("demo config has no [mqtt]"))?;
        mqtt.client_id = NAIVE_ID.into();
        let cop = Arc::new(Mutex::new(Cop::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (cop.clone(), stop.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(failed)?;
        let thread = std::thread::Builder::new()
            .name("naive-cop".into())
            .spawn(move || {
                rt.block_on(async move {
                    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                    let Ok((handle, task)) = transport::start(mqtt, 1 << 20, tx) else {
                        return;
                    };
                    let mut disconnecting = false;
                    loop {
                        if s.load(Ordering::Relaxed) && !disconnecting {
                            handle.disconnect();
                            disconnecting = true;
                        }
                        let ev = match tokio::time::timeout(Duration::from_millis(50), rx.recv())
                            .await
                        {
                            Ok(Some(ev)) => ev,
                            Ok(None) => break,
                            Err(_) => continue,
                        };
                        match ev {
                            TransportEvent::Delivery(d) => {
                                c.lock()
                                    .unwrap_or_else(PoisonError::into_inner)
                                    .apply(&d.payload);
                                handle.ack(d.token);
                                handle.release(1);
                            }
                            TransportEvent::Closed => break,
                            _ => {}
                        }
                    }
                    let _ = task.await;
                });
            })
            .map_err(failed)?;
        Ok(Naive {
            cop,
            stop,
            thread: Some(thread),
        })
    }

    fn finish(mut self) -> Cop {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.cop
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// The real service (`replay-guard run`) on its own thread.
struct Guard {
    shutdown: crate::service::Trigger,
    thread: Option<std::thread::JoinHandle<Result<crate::service::RunSummary, String>>>,
}

impl Guard {
    fn start(config: Config) -> Result<Guard, DemoError> {
        let (shutdown, rx) = crate::service::Shutdown::new();
        let thread = std::thread::Builder::new()
            .name("replay-guard".into())
            .spawn(move || {
                crate::service::run(config, rx, &crate::notify::Notifier::none())
                    .map_err(|e| e.to_string())
            })
            .map_err(failed)?;
        Ok(Guard {
            shutdown,
            thread: Some(thread),
        })
    }

    /// Why the service stopped, if it has (before being asked to).
    fn stopped(&mut self) -> Option<String> {
        if !self.thread.as_ref().is_some_and(|t| t.is_finished()) {
            return None;
        }
        Some(match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => e,
            Some(Ok(Ok(_))) => "it exited".into(),
            _ => "its thread panicked".into(),
        })
    }

    fn finish(mut self) -> Result<crate::service::RunSummary, DemoError> {
        self.shutdown.drain();
        self.thread
            .take()
            .ok_or_else(|| failed("the service had already stopped"))?
            .join()
            .map_err(|_| failed("the service thread panicked"))?
            .map_err(|e| failed(format!("the service failed: {e}")))
    }
}

fn demo_config(db: &Path, primary: &str, standby: &str) -> Result<Config, DemoError> {
    Config::parse(&format!(
        "[store]\npath = {:?}\n[commit]\nmax_batch = 256\nlinger_ms = 5\n\
         [mqtt]\nbrokers = [{primary:?}, {standby:?}]\nclient_id = {GUARD_ID:?}\n\
         topics = [\"incidents/#\"]\nprotocol = \"v3.1.1\"\nretries_per_broker = 1\n\
         backoff_initial_ms = 100\nbackoff_max_ms = 400\nkeep_alive_seconds = 5\n\
         [service]\nshutdown_timeout_seconds = 10\n",
        db.to_str()
            .ok_or_else(|| DemoError::Usage("--db must be valid UTF-8".into()))?
    ))
    .map_err(|e| failed(format!("demo config: {e}")))
}

/// A fresh directory for the demo's database, kept afterwards for the commands it suggests.
fn default_db() -> Result<PathBuf, DemoError> {
    let stamp = crate::timefmt::now_ms();
    let dir =
        std::env::temp_dir().join(format!("replay-guard-demo-{}-{stamp}", std::process::id()));
    use std::os::unix::fs::DirBuilderExt as _;
    // 0700 whatever the umask: the database in it holds every payload of the feed.
    let made = std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .and_then(|()| {
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        });
    made.map_err(|e| failed(format!("{}: {e}", dir.display())))?;
    Ok(dir.join("demo.redb"))
}

/// Runs the demo, writing its story to `out`.
pub fn run(opts: &DemoOptions, out: &mut impl Write) -> Result<DemoResult, DemoError> {
    let st = Style(opts.colour);
    let db = match &opts.db {
        Some(p) if p.exists() => {
            return Err(DemoError::Usage(format!(
                "{} already exists: the demo checks its own result on a fresh database; give a new path",
                p.display()
            )));
        }
        Some(p) => {
            let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
            if dir.is_some_and(|d| !d.is_dir()) {
                return Err(DemoError::Usage(format!(
                    "{}: no such directory for --db",
                    p.display()
                )));
            }
            p.clone()
        }
        None => default_db()?,
    };
    let script = feed::script(opts.seed, opts.messages);
    let mut say = |line: String| {
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(failed)?;
    let primary = Broker::start(rt.handle(), listener()?, None).map_err(failed)?;
    let standby_addr = listener()?.local_addr().map_err(failed)?;
    let url = |a: std::net::SocketAddr| format!("mqtt://{a}");
    let config = demo_config(&db, &url(primary.addr), &url(standby_addr))?;
    let publish = |to: std::net::SocketAddr, msgs: &[Vec<u8>]| -> Result<(), DemoError> {
        let broker = BrokerUrl::parse(&url(to)).map_err(failed)?;
        rt.block_on(async {
            tokio::time::timeout(
                STAGE_LIMIT,
                transport::publish_all(&broker, "field-feed", TOPIC, msgs.to_vec()),
            )
            .await
        })
        .map_err(|_| failed(format!("publishing to {broker} timed out")))?
        .map_err(failed)
    };

    say(st.bold(&format!(
        "replay-guard demo: a broker failover replay (seed {}, {} messages)",
        opts.seed,
        script.len()
    )));
    say(format!(
        "  brokers    primary {}, standby {} (in-process MQTT 3.1.1 brokers)",
        primary.addr, standby_addr
    ));
    say(format!(
        "  consumers  replay-guard `run` -> {}\n             naive COP: applies every delivery",
        db.display()
    ));

    let mut guard = Guard::start(config.clone())?;
    let naive = Naive::start(&config)?;
    wait(&mut guard, "both consumers to subscribe", || {
        primary.subscribed(GUARD_ID) && primary.subscribed(NAIVE_ID)
    })?;
    let drained = |b: &Broker| b.pending(GUARD_ID) == 0 && b.pending(NAIVE_ID) == 0;

    publish(primary.addr, &script.opening)?;
    wait(&mut guard, "the opening to be acknowledged", || {
        drained(&primary)
    })?;
    say(format!(
        "[1/5] incident opened, period 1: {} messages applied and acknowledged by both",
        script.opening.len()
    ));

    primary.hold();
    publish(primary.addr, &script.surge)?;
    let autosave = primary.snapshot();
    primary.release();
    wait(&mut guard, "the surge to be acknowledged", || {
        drained(&primary)
    })?;
    say(format!(
        "[2/5] surge of {} messages (3 casualty reports, Engine 7 assigned): the primary \
         autosaved its sessions with {} unacknowledged, then delivered them; both consumers \
         applied and acknowledged all",
        script.surge.len(),
        autosave.pending(GUARD_ID)
    ));

    publish(primary.addr, &script.after_autosave)?;
    wait(&mut guard, "Engine 7's release to be acknowledged", || {
        drained(&primary)
    })?;
    say(format!(
        "[3/5] Engine 7 available again: {} more messages, applied and acknowledged",
        script.after_autosave.len()
    ));

    primary.kill();
    let standby_listener = TcpListener::bind(standby_addr).map_err(|e| {
        failed(format!(
            "cannot rebind the standby port {standby_addr}: {e}"
        ))
    })?;
    let standby = Broker::start(rt.handle(), standby_listener, Some(&autosave)).map_err(failed)?;
    say(st.bold(&format!(
        "[4/5] the primary fails; the standby takes over from its autosave and re-delivers \
         {} messages to each consumer over their new connections (real MQTT \
         re-deliveries from the restored session, as a Mosquitto standby started from the \
         primary's persistence file does)",
        autosave.pending(GUARD_ID)
    )));
    wait(
        &mut guard,
        "both consumers to fail over and take the replay",
        || standby.subscribed(GUARD_ID) && standby.subscribed(NAIVE_ID) && drained(&standby),
    )?;

    publish(standby.addr, &script.after_failover)?;
    wait(
        &mut guard,
        "the rest of the feed to be acknowledged",
        || drained(&standby),
    )?;
    say(format!(
        "[5/5] the feed continues on the standby (period 2, an AVL reboot): {} messages",
        script.after_failover.len()
    ));

    let summary = guard.finish()?;
    let naive_cop = naive.finish();
    drop(standby);
    drop(primary);

    let report = Report::read(&db)?;
    let mut expected = Cop::default();
    script.all().for_each(|m| expected.apply(m));
    let exactly_once = report.problems(&script, &expected).is_empty();
    report.print(&st, &naive_cop, &expected, &summary, &db, &script, out);
    Ok(DemoResult { exactly_once, db })
}

/// What the database says after the run.
struct Report {
    cop: Cop,
    effects: u64,
    effect_keys: std::collections::HashSet<[u8; 32]>,
    counts: crate::model::OutcomeCounts,
    suppressed: Vec<String>,
    quarantined: u64,
    /// What `verify` found wrong with the record, if anything.
    violation: Option<String>,
}

impl Report {
    fn empty() -> Report {
        Report {
            cop: Cop::default(),
            effects: 0,
            effect_keys: Default::default(),
            counts: Default::default(),
            suppressed: Vec::new(),
            quarantined: 0,
            violation: None,
        }
    }

    fn read(db: &Path) -> Result<Report, DemoError> {
        let snap = Reader::open(db)
            .and_then(|r| r.begin())
            .map_err(|e| failed(format!("cannot read {}: {e}", db.display())))?;
        let mut r = Report::empty();
        snap.scan_effects::<StoreError>(0, |e| {
            r.cop.apply(&e.record.payload);
            r.effects += 1;
            r.effect_keys.insert(e.record.key);
            Ok(ControlFlow::Continue(()))
        })
        .map_err(failed)?;
        snap.scan_audit::<StoreError>(0, |e| {
            let Some(o) = e.outcome() else {
                return Ok(ControlFlow::Continue(()));
            };
            r.counts.add(o);
            // The story's own replays (casualty reports, Engine 7) make the point best.
            let story = matches!(
                e.record.source_id.as_deref(),
                Some("IC-4471") | Some("E7-AVL")
            );
            if o == Outcome::Duplicate && story && r.suppressed.len() < 4 {
                r.suppressed.push(format!(
                    "#{} {} {}/{} epoch {} seq {}: {}",
                    e.index,
                    crate::timefmt::rfc3339_ms(e.record.recorded_at_ms),
                    e.record.agency.as_deref().unwrap_or("-"),
                    e.record.source_id.as_deref().unwrap_or("-"),
                    e.record.epoch.unwrap_or(0),
                    e.record.sequence.unwrap_or(0),
                    e.record.reason
                ));
            }
            Ok(ControlFlow::Continue(()))
        })
        .map_err(failed)?;
        r.quarantined = snap.summary().map_err(failed)?.quarantined;
        r.violation = crate::store::verify::verify(&snap, &crate::wire::FeedContract::default())
            .map_err(failed)?
            .violation;
        Ok(r)
    }

    /// Everything that would mean exactly-once did not hold (empty: it held).
    fn problems(&self, script: &Script, expected: &Cop) -> Vec<String> {
        let contract = crate::wire::FeedContract::default();
        let mut p = Vec::new();
        let published: std::collections::HashSet<[u8; 32]> = script
            .all()
            .filter_map(|m| crate::wire::decode(m, &contract).ok())
            .map(|m| *m.key().as_bytes())
            .collect();
        if self.effects != script.len() as u64 || self.effect_keys != published {
            p.push(format!(
                "{} effects for {} published events",
                self.effects,
                script.len()
            ));
        }
        if !self.cop.same_picture(expected) {
            p.push("replay-guard's picture differs from the feed's".into());
        }
        if let Some(v) = &self.violation {
            p.push(format!("verify: {v}"));
        }
        if self.quarantined > 0 {
            p.push(format!("{} messages quarantined", self.quarantined));
        }
        if self.counts.get(Outcome::Duplicate) < script.surge.len() as u64 {
            p.push(format!(
                "only {} duplicates suppressed: the replay did not happen as staged",
                self.counts.get(Outcome::Duplicate)
            ));
        }
        p
    }

    #[allow(clippy::too_many_arguments)]
    fn print(
        &self,
        st: &Style,
        naive: &Cop,
        expected: &Cop,
        summary: &crate::service::RunSummary,
        db: &Path,
        script: &Script,
        out: &mut impl Write,
    ) {
        let mut w = |line: String| {
            let _ = writeln!(out, "{line}");
        };
        let mark = |ok: bool, s: String| if ok { st.good(&s) } else { st.bad(&s) };
        w(String::new());
        w(st.bold("Common Operating Picture"));
        w(format!(
            "  {:<44}{:<22}{}",
            "",
            st.bold("naive consumer"),
            st.bold("replay-guard")
        ));
        let row = |label: &str, n: String, g: String, n_ok: bool, g_ok: bool| {
            format!(
                "  {label:<44}{}{}",
                pad(&mark(n_ok, n.clone()), &n, 22),
                mark(g_ok, g)
            )
        };
        let want_cas = expected.casualties();
        w(row(
            &format!("casualties, {}", feed::INCIDENT_NAME),
            naive.casualties().to_string(),
            self.cop.casualties().to_string(),
            naive.casualties() == want_cas,
            self.cop.casualties() == want_cas,
        ));
        w(row(
            feed::ENGINE,
            naive.engine().to_string(),
            self.cop.engine().to_string(),
            naive.engine() == expected.engine(),
            self.cop.engine() == expected.engine(),
        ));
        w(row(
            "operational period",
            naive.operational_period.to_string(),
            self.cop.operational_period.to_string(),
            naive.operational_period == expected.operational_period,
            self.cop.operational_period == expected.operational_period,
        ));
        w(row(
            "messages applied",
            naive.applied.to_string(),
            self.effects.to_string(),
            naive.applied == script.len() as u64,
            self.effects == script.len() as u64,
        ));
        w(format!(
            "  {:<44}{}",
            "",
            st.dim(&format!(
                "(the feed holds {} events: casualties {}, {} {})",
                script.len(),
                want_cas,
                feed::ENGINE,
                expected.engine()
            ))
        ));
        w(String::new());
        let counts: Vec<String> = Outcome::DECIDED
            .iter()
            .map(|o| format!("{o} {}", self.counts.get(*o)))
            .collect();
        w(format!(
            "{} {}",
            st.bold("replay-guard decisions:"),
            counts.join(", ")
        ));
        w(format!(
            "  {} deliveries in {} batches; {} reconnects, {} broker switch",
            summary.counts.total(),
            summary.batches,
            summary.reconnects,
            summary.failovers
        ));
        if !self.suppressed.is_empty() {
            w(st.bold("suppressed replays (from the audit log):"));
            for s in &self.suppressed {
                w(format!("  {s}"));
            }
        }
        let problems = self.problems(script, expected);
        w(String::new());
        if problems.is_empty() {
            w(st.good(&format!(
                "exactly-once held: {} events, each applied once; {} replayed deliveries suppressed; nothing lost",
                script.len(),
                self.counts.get(Outcome::Duplicate)
            )));
        } else {
            w(st.bad(&format!(
                "exactly-once did NOT hold: {}",
                problems.join("; ")
            )));
        }
        let d = db.display();
        // The way this binary was invoked (e.g. target/release/replay-guard), so the lines
        // below run as printed.
        let bin = std::env::args()
            .next()
            .filter(|a| a.contains('/'))
            .unwrap_or_else(|| "replay-guard".into());
        let key = crate::key::derive_key(
            &crate::model::Source::new("CALFIRE".into(), "IC-4471".into()),
            crate::model::Position {
                epoch: 1,
                sequence: 2,
            },
        );
        w(String::new());
        w(st.bold("Look closer (the database is kept):"));
        w(format!(
            "  {bin} dump-audit --db {d} --outcome duplicate --format table | head"
        ));
        w(format!(
            "  {bin} explain --db {d} --source CALFIRE/IC-4471 --epoch 1 --sequence 2"
        ));
        w(format!("  {bin} explain --db {d} {}", hex(key.as_bytes())));
        w(format!("  {bin} stats --db {d}"));
        w(format!("  {bin} verify --db {d}"));
        w(format!("  {bin} report --db {d} -o demo-report.html"));
    }
}

/// Left-aligns `painted` (the styled form of `plain`) to `width` visible columns.
fn pad(painted: &str, plain: &str, width: usize) -> String {
    let fill = width.saturating_sub(plain.chars().count());
    format!("{painted}{}", " ".repeat(fill))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report_of(applied: &[&Vec<u8>], duplicates: u64) -> Report {
        let contract = crate::wire::FeedContract::default();
        let mut r = Report::empty();
        for m in applied {
            r.cop.apply(m);
            r.effects += 1;
            r.effect_keys
                .insert(*crate::wire::decode(m, &contract).unwrap().key().as_bytes());
            r.counts.add(Outcome::Applied);
        }
        for _ in 0..duplicates {
            r.counts.add(Outcome::Duplicate);
        }
        r
    }

    #[test]
    fn the_self_check_fails_on_a_double_application_a_loss_or_no_replay() {
        let script = feed::script(5, 60);
        let mut expected = Cop::default();
        script.all().for_each(|m| expected.apply(m));
        let all: Vec<&Vec<u8>> = script.all().collect();
        let dups = script.surge.len() as u64;
        assert!(
            report_of(&all, dups)
                .problems(&script, &expected)
                .is_empty()
        );
        // A replayed casualty report applied again.
        let mut twice = all.clone();
        twice.push(&script.surge[0]);
        assert!(
            !report_of(&twice, dups)
                .problems(&script, &expected)
                .is_empty()
        );
        // A genuine update lost.
        let lost = &all[..all.len() - 1];
        assert!(
            !report_of(lost, dups)
                .problems(&script, &expected)
                .is_empty()
        );
        // No replay at all: the demo proved nothing.
        assert!(!report_of(&all, 0).problems(&script, &expected).is_empty());
    }
}
