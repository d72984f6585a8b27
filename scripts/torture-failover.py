#!/usr/bin/env python3
"""Torture run 2: live broker failovers with a field app that resends after reconnecting.

Two Mosquitto instances, primary and standby, each with persistence in its own directory of
the run's temp dir (free loopback ports, never 1883), saved only when the harness says so
(SIGUSR1, Mosquitto's autosave) or on a clean exit. One `replay-guard run` (brokers = [primary,
standby], persistent session) consumes a live surge from the field publisher
(scripts/torture_pub.py: QoS 1, persistent session, bursty around --rate/s). Each failover:

  1. let the surge flow for a random 0.2-0.8 s;
  2. stall `run` (SIGSTOP) for a random 0 to --max-stall s, so a backlog queues up for its
     session, and autosave the active broker; `run` resumes (SIGCONT) and acknowledges;
  3. after a random 0.1-0.5 s more (`run` acknowledging on the active broker), kill -9 it;
  4. copy its autosave into the other broker's directory and start that one from it;
  5. wait until `run` has failed over to it and resumed its session there.

The restored broker replays what the autosave held as pending for `run`'s session, though
`run` acknowledged much of it on the dead broker (most with DUP=0). The field publisher
reconnects too and resends what the dead broker had not acknowledged, plus its last
--resend-last acknowledged events (the restored broker never had those accepted after the
autosave). Brokers alternate. At the end: every event exactly once (dump-effects, dump-audit),
every replay suppressed as an audited `duplicate`, nothing quarantined, `verify` exit 0, and a
fresh `run` receives nothing more.

Usage: scripts/torture-failover.py [--failovers N] [--rate R] [--resend-last K] [--max-stall S]
                                   [--protocol v5|v3.1.1] [--seed S]
Defaults: 100 failovers, 500 events/s, 2000, 0.5 s. Prints one summary line with the figures; exit 0
if every check held, 1 with the failing check. TORTURE_KEEP=1 keeps the temp dir.
"""
import argparse
import collections
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torture_lib as T  # noqa: E402


def wait_log(run, needle, count, limit=30):
    deadline = time.monotonic() + limit
    while run.log_text().count(needle) < count:
        if run.proc.poll() is not None:
            raise T.Failed(f"run exited {run.proc.returncode}: {run.logfile}")
        if time.monotonic() > deadline:
            raise T.Failed(f"run did not log '{needle}' #{count} within {limit} s: {run.logfile}")
        time.sleep(0.02)


def torture(a, tmp):
    t0 = time.monotonic()
    rng = random.Random(a.seed)
    brokers = [T.Broker(os.path.join(tmp, name), T.free_port(), persistence=True) for name in ("primary", "standby")]
    ports = [b.port for b in brokers]
    db = os.path.join(tmp, "rg.redb")
    cfg = os.path.join(tmp, "rg.toml")
    T.write_config(cfg, db, ports, "torture-failover", protocol=a.protocol)
    run = T.Run(tmp, cfg)
    pub = None
    try:
        active = 0
        brokers[0].start()
        run.start()
        T.settle_connected(run)
        pub = T.Publisher(tmp, ports, "field-failover", a.rate, resend_last=a.resend_last, seed=a.seed)
        resumed = collections.Counter()
        for i in range(a.failovers):
            time.sleep(rng.uniform(0.2, 0.8))
            old, new = brokers[active], brokers[1 - active]
            # A consumer stall (SIGSTOP) lets a backlog queue up for run's session, so the
            # autosave holds more pending deliveries than the in-flight window alone.
            stall = rng.uniform(0.0, a.max_stall)
            if stall:
                os.kill(run.proc.pid, signal.SIGSTOP)
                time.sleep(stall)
            old.autosave()
            os.kill(run.proc.pid, signal.SIGCONT)
            time.sleep(rng.uniform(0.1, 0.5))
            old.kill9()
            shutil.copyfile(old.db, new.db)
            new.start()
            resumed[new.port] += 1
            wait_log(run, f"connected broker=mqtt://127.0.0.1:{new.port} session_present=true", resumed[new.port])
            active = 1 - active
            if i % 10 == 9:
                T.log(f"{i + 1} failovers; {T.decided(db)} decisions so far")
        stats = pub.finish()
        n = stats["events"]
        decisions = T.settle(db, run, n)
        rc = run.stop()
        if rc != 0:
            raise T.Failed(f"run exited {rc} on SIGTERM: {run.logfile}")
        text = run.log_text()
        trouble = T.scan_log_for_trouble(text)
        if trouble:
            raise T.Failed(f"'{trouble}' in {run.logfile}")
        bursts = [int(x) for x in re.findall(r"replay burst absorbed: (\d+) duplicates", text)]
        switches = text.count("switching broker")
        T.assert_session_empty(db, run)
        outcomes, topics, verify = T.check_exactly_once(db, n)
        dups = outcomes.get("duplicate", 0)
        if dups == 0:
            raise T.Failed("no replay was absorbed: the failovers replayed nothing")
        dt = time.monotonic() - t0
        resent = stats["resent_window"] + stats["resent_unacked"]
        print(f"torture-failover: {a.failovers} live failovers (MQTT {a.protocol} for run; autosave while run acknowledged, kill -9, "
              f"standby started from the autosave, alternating) in {dt:.0f} s; {n} events published; "
              f"{decisions} deliveries decided: {dict(outcomes)}; {dups} replays absorbed as audited "
              f"duplicates, at least {max(0, dups - resent)} of them replayed by a restored broker "
              f"(deliveries run had acknowledged on the failed one), the rest field-app resends "
              f"({len(bursts)} replay bursts logged by run, {sum(bursts)} duplicates in them, largest "
              f"{max(bursts, default=0)}); the field app resent {stats['resent_unacked']} unacknowledged "
              f"and {stats['resent_window']} recent events over {stats['reconnects']} reconnects, and "
              f"{topics.get(('applied', 'torture/field/resend'), 0)} events were first applied from such a "
              f"resend (the failed broker had acknowledged them after its autosave; the standby never had "
              f"them); run switched broker {switches} times; every event applied exactly once, nothing "
              f"quarantined; {verify.split(':')[0]} exit 0", flush=True)
    finally:
        if pub:
            pub.kill()
        if run.proc:
            run.kill9()
        for b in brokers:
            b.kill9()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--failovers", type=int, default=100)
    ap.add_argument("--rate", type=float, default=500)
    ap.add_argument("--resend-last", type=int, default=2000)
    ap.add_argument("--max-stall", type=float, default=0.5)
    ap.add_argument("--protocol", default="v5", choices=["v5", "v3.1.1"], help="run's MQTT version")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    T.build()
    ok = False
    tmp = tempfile.mkdtemp(prefix="rg-torture-failover.")
    try:
        torture(a, tmp)
        ok = True
    except T.Failed as e:
        print(f"torture-failover FAILED: {e}", flush=True)
    finally:
        T.keep_or_remove(tmp, ok)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
