#!/usr/bin/env python3
"""Torture run 1: `kill -9` of `run` at random points of a live surge, of `ingest` mid-file, and
SIGTERM of `run` at random points.

run:    a private Mosquitto (free loopback port, own temp dir) and a field publisher that keeps
        publishing QoS 1 events with a persistent session (bursty, around --rate/s). `run`
        (persistent session, durable commits) is started, killed with SIGKILL after a random
        delay in [0, --max-delay] s, and started again, --kills times. Kills land in start-up
        (opening and repairing the file, connecting), between commits and inside commits. Then
        the publisher drains, one last `run` settles and stops with SIGTERM (exit 0), a fresh
        incarnation must receive nothing (everything acknowledged), and the database must hold
        every published event exactly once (dump-effects and dump-audit, counted per key),
        nothing else applied, nothing quarantined, `verify` exit 0.
ingest: a feed file of --lines events (with exact resends inside it) is ingested into one
        database and killed with SIGKILL after a random delay in [0, one full ingest's time],
        --kills times, each time on the same file; then a last uninterrupted ingest. Every line
        applied exactly once, nothing quarantined, verify exit 0, and the effect log equal to a
        clean run's.
term:   like run, with SIGTERM instead of SIGKILL: every stop must exit 0 (the graceful drain),
        except a signal that lands before main() has installed its handler (the first
        milliseconds after exec, an empty log: the default action ends the process); and since
        the drain acknowledges everything it committed, no delivery may come back as a duplicate.

Usage: scripts/torture-kill.py [run|ingest|term|all] [--kills N] [--rate R] [--max-delay S]
                               [--lines L] [--protocol v5|v3.1.1] [--seed S]
Defaults: all, 1000 kills (stops) each, 1000 events/s, 0.6 s, 2000 lines. Prints one summary
line per part ("torture-kill run: ..."); exit 0 if every check held, 1 with the failing check.
TORTURE_KEEP=1 keeps the temp dir; RG_BIN uses another replay-guard binary.
"""
import argparse
import collections
import os
import random
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torture_lib as T  # noqa: E402
from torture_pub import event  # noqa: E402


def torture_run(a, tmp, term=False):
    """kill -9 (or, with `term`, SIGTERM) of `run` at random points of a live surge."""
    what = "term" if term else "run"
    tmp = os.path.join(tmp, what)
    os.makedirs(tmp)
    t0 = time.monotonic()
    rng = random.Random(a.seed)
    broker = T.Broker(os.path.join(tmp, "broker"), T.free_port())
    broker.start()
    db = os.path.join(tmp, "rg.redb")
    cfg = os.path.join(tmp, "rg.toml")
    T.write_config(cfg, db, [broker.port], f"torture-{what}", protocol=a.protocol)
    run = T.Run(tmp, cfg)
    # Create the session before the surge, so that every event is queued for us.
    run.start()
    T.settle_connected(run)
    if run.stop() != 0:
        raise T.Failed(f"first run did not stop cleanly: {run.logfile}")
    pub = T.Publisher(tmp, [broker.port], f"field-{what}", a.rate, seed=a.seed)
    try:
        kills = collections.Counter()
        commits_before_kill = []
        slowest = 0.0
        for k in range(a.kills):
            run.start()
            time.sleep(rng.uniform(0, a.max_delay))
            if term:
                started = time.monotonic()
                rc = run.stop(limit=30)
                slowest = max(slowest, time.monotonic() - started)
                text = run.log_text()
                # A SIGTERM that lands before main() has installed its handler (the first
                # milliseconds after exec) terminates by the signal: nothing was open yet.
                if rc == -15 and not text.strip():
                    kills["before the signal handler existed (killed by SIGTERM)"] += 1
                    continue
                if rc != 0:
                    raise T.Failed(f"SIGTERM {k}: run exited {rc} (want 0): {run.logfile}")
            else:
                running, rc = run.kill9()
                text = run.log_text()
                if not running:
                    raise T.Failed(f"kill {k}: run had exited on its own ({rc}): {run.logfile}")
            trouble = T.scan_log_for_trouble(text)
            if trouble:
                raise T.Failed(f"kill {k}: '{trouble}' in {run.logfile}")
            commits = len(re.findall(r"batch committed", text))
            commits_before_kill.append(commits)
            kills["mid-surge (after >= 1 commit)" if commits else
                  "connected, nothing committed yet" if "connected" in text else
                  "start-up (before connecting)"] += 1
            os.remove(run.logfile)
            if k % 100 == 99:
                T.log(f"{what}: {k + 1} stops")
        stats = pub.finish()
        n = stats["events"]
        run.start()
        decisions = T.settle(db, run, n)
        rc = run.stop()
        if rc != 0:
            raise T.Failed(f"final run exited {rc}: {run.logfile}")
        T.assert_session_empty(db, run)
        outcomes, _, verify = T.check_exactly_once(db, n)
        dt = time.monotonic() - t0
        median = sorted(commits_before_kill)[len(commits_before_kill) // 2] if commits_before_kill else 0
        if term:
            # The drain acknowledges every delivery it committed: nothing committed comes back.
            if outcomes.get("duplicate", 0):
                raise T.Failed(f"{outcomes['duplicate']} committed deliveries were redelivered after SIGTERMs")
            early = kills["before the signal handler existed (killed by SIGTERM)"]
            head = (f"torture-kill term: {a.kills} SIGTERM of run (MQTT {a.protocol}) in {dt:.0f} s, "
                    f"{a.kills - early} drained and exited 0 (slowest stop {slowest:.2f} s), no duplicate")
        else:
            head = f"torture-kill run: {a.kills} kill -9 of run (MQTT {a.protocol}) in {dt:.0f} s"
        print(f"{head} ({dict(kills)}; commits per incarnation median {median}, max "
              f"{max(commits_before_kill, default=0)}); {n} events published at QoS 1, {decisions} "
              f"deliveries decided: {dict(outcomes)}; every event applied exactly once, none lost, nothing "
              f"quarantined; {verify.split(':')[0]} exit 0", flush=True)
    finally:
        pub.kill()
        if run.proc:
            run.kill9()
        broker.stop()


def feed(lines, seed):
    """Events 0..n-1 (n distinct) plus exact resends of earlier lines, about 10%."""
    rng = random.Random(seed)
    out, n = [], 0
    while len(out) < lines:
        if n and rng.random() < 0.1:
            out.append(event(rng.randrange(n)).decode())
        else:
            out.append(event(n).decode())
            n += 1
    return out, n


def torture_ingest(a, tmp):
    import subprocess
    t0 = time.monotonic()
    rng = random.Random(a.seed + 1)
    lines, n = feed(a.lines, a.seed)
    path = os.path.join(tmp, "feed.jsonl")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    cfg = os.path.join(tmp, "ingest.toml")
    # Small batches: many commits per file, so kills fall between and inside many of them.
    with open(cfg, "w") as f:
        f.write("[window]\nseconds = 86400\n[commit]\nmax_batch = 64\n")
    clean = os.path.join(tmp, "clean.redb")
    T.rg("ingest", "--config", cfg, "--db", clean, path)
    # A full ingest's time, as the killed runs see it: most of their lines are already decided
    # (re-deciding a line that is a duplicate is quicker than applying it).
    started = time.monotonic()
    T.rg("ingest", "--config", cfg, "--db", clean, path)
    full = time.monotonic() - started
    db = os.path.join(tmp, "crash.redb")
    T.rg("ingest", "--config", cfg, "--db", db, os.devnull)
    interrupted = completed = 0
    errlog = os.path.join(tmp, "ingest.log")
    for k in range(a.kills):
        with open(errlog, "wb") as e:
            p = subprocess.Popen([T.BIN, "ingest", "--config", cfg, "--db", db, path],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=e)
        time.sleep(rng.uniform(0, full))
        running = p.poll() is None
        p.kill()
        rc = p.wait()
        if rc == -9 and running:
            interrupted += 1
        elif rc == 0:
            completed += 1
        else:
            raise T.Failed(f"ingest kill {k}: exit {rc}: {open(errlog).read()[-2000:]}")
        if k % 100 == 99:
            T.log(f"ingest: {k + 1} kills ({interrupted} interrupted a run)")
    T.rg("ingest", "--config", cfg, "--db", db, path)
    outcomes, _, verify = T.check_exactly_once(db, n)
    if interrupted < a.kills // 3:
        raise T.Failed(f"only {interrupted} of {a.kills} kills interrupted an ingest")
    clean_effects = sorted((e["source_id"], e["sequence"], e["message"]["note"]) for e in T.jsonl(clean, "dump-effects"))
    crash_effects = sorted((e["source_id"], e["sequence"], e["message"]["note"]) for e in T.jsonl(db, "dump-effects"))
    if clean_effects != crash_effects:
        raise T.Failed("the effect log after kills differs from the clean run's")
    dt = time.monotonic() - t0
    print(f"torture-kill ingest: {a.kills} kill -9 of ingest in {dt:.0f} s on one {a.lines}-line file "
          f"({n} events, a full re-ingest takes {full:.2f} s; {interrupted} kills interrupted a run, "
          f"{completed} came after it finished), re-ingested each time: {dict(outcomes)}; every "
          f"event applied exactly once, effect log equal to the clean run's, nothing quarantined; "
          f"{verify.split(':')[0]} exit 0", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", nargs="?", default="all", choices=["run", "ingest", "term", "all"])
    ap.add_argument("--kills", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--max-delay", type=float, default=0.6)
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--protocol", default="v5", choices=["v5", "v3.1.1"], help="run's MQTT version")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    T.build()
    ok = False
    tmp = tempfile.mkdtemp(prefix="rg-torture-kill.")
    try:
        if a.part in ("run", "all"):
            torture_run(a, tmp)
        if a.part in ("ingest", "all"):
            torture_ingest(a, tmp)
        if a.part in ("term", "all"):
            torture_run(a, tmp, term=True)
        ok = True
    except T.Failed as e:
        print(f"torture-kill FAILED: {e}", flush=True)
    finally:
        T.keep_or_remove(tmp, ok)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
