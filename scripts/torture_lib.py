"""Shared parts of the torture runs (scripts/torture-*.py): private Mosquitto brokers, the
field publisher, `replay-guard run` incarnations, and the final exactly-once check.

Everything lives in one temp dir per run; brokers listen on free loopback ports (never 1883);
every process is started here and stopped by its PID.
"""
import collections
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("RG_BIN") or os.path.join(ROOT, "target", "release", "replay-guard")
PUB = os.path.join(ROOT, "scripts", "torture_pub.py")
SOURCES = 50


class Failed(Exception):
    """A torture check failed: the message says what and where."""


def log(msg):
    print(time.strftime("%H:%M:%S ") + msg, flush=True)


def build():
    if "RG_BIN" not in os.environ:
        subprocess.run(["cargo", "build", "--release", "--bin", "replay-guard", "-q"], cwd=ROOT, check=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port, up=True, limit=10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            if up:
                return
        except OSError:
            if not up:
                return
        time.sleep(0.01)
    raise Failed(f"port {port} did not come {'up' if up else 'down'} within {limit} s")


class Broker:
    """A Mosquitto in its own directory. With `persistence`, mosquitto.db there is written only
    on SIGUSR1 (the harness's "autosave") and on a clean exit."""

    def __init__(self, d, port, persistence=False, inflight=100):
        os.makedirs(d, exist_ok=True)
        self.dir, self.port, self.proc = d, port, None
        conf = [f"listener {port} 127.0.0.1", "allow_anonymous true", "user root",
                "max_queued_messages 0", f"max_inflight_messages {inflight}"]
        if persistence:
            conf += ["persistence true", f"persistence_location {d}/", "autosave_interval 0"]
        else:
            conf.append("persistence false")
        self.conf = os.path.join(d, "mosquitto.conf")
        with open(self.conf, "w") as f:
            f.write("\n".join(conf) + "\n")

    @property
    def db(self):
        return os.path.join(self.dir, "mosquitto.db")

    def start(self):
        assert self.proc is None
        with open(os.path.join(self.dir, "mosquitto.log"), "ab") as logf:
            self.proc = subprocess.Popen(["mosquitto", "-c", self.conf], stdout=subprocess.DEVNULL, stderr=logf)
        wait_port(self.port)

    def autosave(self):
        """SIGUSR1, and wait until the new mosquitto.db is in place (temp file + rename)."""
        before = os.stat(self.db).st_mtime_ns if os.path.exists(self.db) else None
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while True:
            try:
                now = os.stat(self.db).st_mtime_ns
                if now != before:
                    return
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline:
                raise Failed(f"broker on {self.port}: no autosave written")
            time.sleep(0.005)

    def kill9(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.proc = None


def write_config(path, db, ports, client_id, extra="", protocol="v5"):
    brokers = ", ".join(f'"mqtt://127.0.0.1:{p}"' for p in ports)
    with open(path, "w") as f:
        f.write(f'[store]\npath = "{db}"\n[window]\nseconds = 86400\n'
                f'[mqtt]\nbrokers = [{brokers}]\nclient_id = "{client_id}"\ntopics = ["torture/#"]\n'
                f'protocol = "{protocol}"\n'
                'retries_per_broker = 2\nbackoff_initial_ms = 20\nbackoff_max_ms = 200\nkeep_alive_seconds = 5\n'
                f'[service]\nshutdown_timeout_seconds = 20\n{extra}')


class Run:
    """`replay-guard run` incarnations on one config; each one's stderr goes to its own log."""

    def __init__(self, d, config):
        self.dir, self.config, self.proc, self.n = d, config, None, 0
        self.logs = os.path.join(d, "run-logs")
        os.makedirs(self.logs, exist_ok=True)

    @property
    def logfile(self):
        return os.path.join(self.logs, f"run-{self.n:05d}.log")

    def start(self, prefix=()):
        assert self.proc is None
        self.n += 1
        env = dict(os.environ, RUST_LOG="replay_guard=debug,info")
        with open(self.logfile, "wb") as logf:
            self.proc = subprocess.Popen(list(prefix) + [BIN, "--log-format", "text", "run", "--config", self.config],
                                         stdout=subprocess.DEVNULL, stderr=logf, env=env)
        self.started = time.monotonic()

    def log_text(self):
        with open(self.logfile, errors="replace") as f:
            return f.read()

    def kill9(self):
        """SIGKILL; returns (still running at the kill, exit status)."""
        running = self.proc.poll() is None
        self.proc.kill()
        rc = self.proc.wait()
        self.proc = None
        return running, rc

    def stop(self, limit=30):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise Failed(f"run did not stop within {limit} s: {self.logfile}")
        self.proc = None
        return rc

    def wait_exit(self, limit):
        try:
            rc = self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            return None
        self.proc = None
        return rc


class Publisher:
    def __init__(self, d, ports, client_id, rate, inflight=200, resend_last=0, count=0, seed=1):
        self.stats_path = os.path.join(d, f"{client_id}.stats.json")
        args = [sys.executable, PUB, "--ports", ",".join(map(str, ports)), "--client-id", client_id,
                "--topic", "torture/field", "--stats", self.stats_path, "--rate", str(rate),
                "--inflight", str(inflight), "--resend-last", str(resend_last), "--seed", str(seed)]
        if count:
            args += ["--count", str(count)]
        self.errlog = os.path.join(d, f"{client_id}.log")
        with open(self.errlog, "wb") as e:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=e)

    def finish(self, limit=180):
        """SIGTERM: stop making events, drain every unacknowledged one, return the stats."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise Failed("publisher did not drain in time")
        if rc != 0:
            raise Failed(f"publisher exited {rc}: {open(self.errlog).read()[-2000:]}")
        with open(self.stats_path) as f:
            return json.load(f)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def rg(*args, check=True):
    p = subprocess.run([BIN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if check and p.returncode != 0:
        raise Failed(f"replay-guard {' '.join(args)} exited {p.returncode}: {p.stderr.decode()[-2000:]}")
    return p


def decided(db):
    """Audit entries committed so far (a read-only look, as an operator's `stats` would)."""
    p = rg("stats", "--format", "json", "--db", db, check=False)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout)["audit"]["next_index"]


def jsonl(db, what):
    """The records `replay-guard WHAT --db DB` prints, streamed one at a time."""
    p = subprocess.Popen([BIN, what, "--db", db], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in p.stdout:
        if line.strip():
            yield json.loads(line)
    err = p.stderr.read()
    if p.wait() != 0:
        raise Failed(f"replay-guard {what} --db {db} exited {p.returncode}: {err.decode()[-2000:]}")


def check_exactly_once(db, n_events, extra_ok=()):
    """Every event 0..n_events-1 applied exactly once (dump-effects and dump-audit), nothing
    else applied, nothing quarantined, every other decision a `duplicate` of an applied event,
    and `verify` exit 0. Returns the outcome counts, the counts per (outcome, topic) and verify's
    summary line."""
    per_key = collections.Counter((e["source_id"], e["sequence"]) for e in jsonl(db, "dump-effects"))
    want = {("U%02d" % (i % SOURCES), i) for i in range(n_events)}
    twice = [k for k, c in per_key.items() if c > 1]
    missing = want - set(per_key)
    extra = set(per_key) - want
    if twice or missing or extra:
        raise Failed(f"effects: {len(twice)} applied twice (e.g. {twice[:3]}), {len(missing)} missing "
                     f"(e.g. {sorted(missing)[:3]}), {len(extra)} unexpected (e.g. {sorted(extra)[:3]})")
    outcomes, applied, topics = collections.Counter(), collections.Counter(), collections.Counter()
    for e in jsonl(db, "dump-audit"):
        outcomes[e["outcome"]] += 1
        topics[(e["outcome"], e["topic"])] += 1
        if e["outcome"] in ("applied", "applied_late"):
            applied[(e["source_id"], e["sequence"])] += 1
    if any(c != 1 for c in applied.values()) or set(applied) != want:
        raise Failed(f"audit: applied entries do not name every event once: {len(applied)} keys, "
                     f"max {max(applied.values(), default=0)} per key")
    others = set(outcomes) - {"applied", "applied_late", "duplicate", *extra_ok}
    if others:
        raise Failed(f"audit: unexpected outcomes {dict(outcomes)}")
    quarantine = list(jsonl(db, "dump-quarantine"))
    if quarantine:
        raise Failed(f"{len(quarantine)} messages quarantined, e.g. {quarantine[0]}")
    v = rg("verify", "--db", db, check=False)
    if v.returncode != 0:
        raise Failed(f"verify exited {v.returncode}: {v.stdout.decode()}{v.stderr.decode()}")
    return outcomes, topics, v.stdout.decode().strip()


def settle(db, run, n_events, quiet=1.5, limit=300):
    """Waits until `run` has applied every event and the audit stops growing for `quiet` s."""
    deadline = time.monotonic() + limit
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        if run.proc is not None and run.proc.poll() is not None:
            raise Failed(f"run exited {run.proc.returncode} while settling: {run.logfile}")
        n = decided(db)
        if n != last:
            last, since = n, time.monotonic()
        elif n is not None and n >= n_events and time.monotonic() - since >= quiet:
            return n
        time.sleep(0.2)
    raise Failed(f"run did not settle within {limit} s ({last} decisions for {n_events} events)")


def assert_session_empty(db, run):
    """A fresh incarnation gets nothing from the broker: everything was acknowledged."""
    before = decided(db)
    run.start()
    time.sleep(2.0)
    rc = run.stop()
    after = decided(db)
    if rc != 0:
        raise Failed(f"run exited {rc} on SIGTERM: {run.logfile}")
    if after != before:
        raise Failed(f"the broker redelivered {after - before} acknowledged messages")


def scan_log_for_trouble(text):
    for marker in ("panicked", "database damaged", "storage failure", "ERROR"):
        if marker in text:
            return marker
    return None


def keep_or_remove(tmp, ok, keep_env="TORTURE_KEEP"):
    if ok and not os.environ.get(keep_env):
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        log(f"kept {tmp}")


def settle_connected(run, limit=20):
    """Waits until `run` has connected and subscribed (its log says so)."""
    deadline = time.monotonic() + limit
    while "connected" not in run.log_text():
        if run.proc.poll() is not None or time.monotonic() > deadline:
            raise Failed(f"run did not connect: {run.logfile}")
        time.sleep(0.02)
    time.sleep(0.3)  # the SUBSCRIBE reaches the broker
