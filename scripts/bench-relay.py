#!/usr/bin/env python3
"""Relay drain throughput: ingest a backlog of N effects into a fresh database, start the
standalone relay with the given config's [[sink]] tables, and time until every sink's cursor
reaches the head (polling `relay status --format json`).

    scripts/bench-relay.py --config sinks.toml [--events 100000] [--bin target/release/replay-guard]

The config must not set [store] path (the script passes --db to a temp file). The receivers
the sinks name (a broker, an HTTP server, PostgreSQL) must be running. Prints one line per
sink: events, seconds, events/s (from relay start to the sink's cursor reaching the head).
Writes only under its own temp dir.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--sources", type=int, default=50)
    ap.add_argument("--bin", default="target/release/replay-guard")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rg-bench-relay.") as tmp:
        db = os.path.join(tmp, "rg.redb")
        feed = os.path.join(tmp, "feed.jsonl")
        with open(feed, "w") as f:
            for i in range(a.events):
                f.write(
                    json.dumps(
                        {
                            "agency": "CALFIRE",
                            "source_id": f"E{i % a.sources}",
                            "epoch": 1,
                            "sequence": i,
                            "status": "available",
                            "lat": 38.5 + i * 1e-6,
                        }
                    )
                    + "\n"
                )
        t = time.monotonic()
        subprocess.run(
            [a.bin, "ingest", "--db", db, "--config", a.config, feed],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print(f"ingested {a.events} in {time.monotonic() - t:.1f} s", file=sys.stderr)
        log = open(os.path.join(tmp, "relay.log"), "w")
        start = time.monotonic()
        relay = subprocess.Popen(
            [a.bin, "relay", "--config", a.config, "--db", db], stderr=log
        )
        done = {}
        try:
            while True:
                out = subprocess.run(
                    [a.bin, "relay", "status", "--db", db, "--config", a.config, "--format", "json"],
                    capture_output=True,
                    text=True,
                )
                now = time.monotonic() - start
                if out.returncode == 0:
                    for s in json.loads(out.stdout)["sinks"]:
                        if s["cursor"] is not None and s["cursor"] >= a.events and s["sink"] not in done:
                            done[s["sink"]] = now
                    names = [s["sink"] for s in json.loads(out.stdout)["sinks"]]
                    if names and all(n in done for n in names):
                        break
                if relay.poll() is not None:
                    sys.exit(f"relay exited {relay.returncode}; see {log.name}")
                if now > a.timeout:
                    sys.exit(f"not drained after {a.timeout} s: {out.stdout}")
                time.sleep(0.05)
        finally:
            relay.send_signal(signal.SIGTERM)
            relay.wait(timeout=30)
        for name, secs in sorted(done.items()):
            print(f"{name}: {a.events} events in {secs:.2f} s = {a.events / secs:,.0f} events/s")
        # Same-run baseline: reading and printing the same log with `dump-effects`.
        t = time.monotonic()
        subprocess.run([a.bin, "dump-effects", "--db", db], check=True, stdout=subprocess.DEVNULL)
        secs = time.monotonic() - t
        print(f"baseline dump-effects: {a.events} effects in {secs:.2f} s = {a.events / secs:,.0f} effects/s")


if __name__ == "__main__":
    main()
