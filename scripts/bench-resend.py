#!/usr/bin/env python3
"""Re-sends per kill -9 of the relay: what a receiver gets twice after the relay is killed
mid-delivery and started again, and what `relay status` counts as re-sent.

Ingests a backlog of N effects into a fresh database, starts the standalone relay with one
exec sink (a program appending each batch to a file), kills it with SIGKILL K times at
random moments while it delivers (each time once it has delivered a random share more of the
backlog), starts it again, and at the end counts, at the receiver, the ids that arrived more
than once and, from `relay status --format json`, the sink's `resent` (when the build has
it). Prints one line per kill and a summary:

    scripts/bench-resend.py [--events 200000] [--kills 10] [--bin target/release/replay-guard]
        [--seed 1] [--batch 500]

Compare two builds in one run with --bin (the old build first). Writes only under its own
temp dir; starts and stops only its own processes.
"""

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time


def status(binary, cfg):
    out = subprocess.run(
        [binary, "relay", "status", "--config", cfg, "--format", "json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)["sinks"][0]


def lines(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0
    return data.count(b"\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--bin", default="target/release/replay-guard")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=500)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    binary = os.path.abspath(a.bin)
    with tempfile.TemporaryDirectory(prefix="rg-bench-resend.") as tmp:
        if os.environ.get("RG_KEEP"):
            tmp = tempfile.mkdtemp(prefix="rg-bench-resend-kept.")
            print(f"keeping {tmp}", file=sys.stderr)
        db = os.path.join(tmp, "rg.redb")
        out = os.path.join(tmp, "received.jsonl")
        cfg = os.path.join(tmp, "rg.toml")
        with open(cfg, "w") as f:
            f.write(
                f'[store]\npath = "{db}"\n[[sink]]\nname = "cop"\nkind = "exec"\n'
                f'command = ["/bin/sh", "-c", "cat >> {out}"]\nbatch_max = {a.batch}\n'
            )
        feed = os.path.join(tmp, "feed.jsonl")
        with open(feed, "w") as f:
            for i in range(a.events):
                f.write(
                    json.dumps(
                        {
                            "agency": "CALFIRE",
                            "source_id": f"E{i % 50}",
                            "epoch": 1,
                            "sequence": i,
                            "status": "available",
                        }
                    )
                    + "\n"
                )
        subprocess.run(
            [binary, "ingest", "--config", cfg, feed],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        log = open(os.path.join(tmp, "relay.log"), "w")
        kills = 0
        for k in range(a.kills):
            relay = subprocess.Popen(
                [binary, "relay", "--config", cfg], stdout=log, stderr=log
            )
            target = lines(out) + int(rng.uniform(0.2, 0.8) * a.events / a.kills)
            deadline = time.monotonic() + 120
            while lines(out) < target and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(rng.uniform(0, 0.01))
            relay.send_signal(signal.SIGKILL)
            relay.wait()
            kills += 1
            print(f"kill {k + 1}: {lines(out)} lines at the receiver", file=sys.stderr)
        relay = subprocess.Popen([binary, "relay", "--config", cfg], stdout=log, stderr=log)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            s = status(binary, cfg)
            if s["cursor"] == s["head"]:
                break
            time.sleep(0.1)
        relay.send_signal(signal.SIGTERM)
        relay.wait()
        seen = collections.Counter()
        torn = 0
        with open(out) as f:
            for line in f:
                # A kill mid-write leaves the program a batch cut short (its last line torn).
                try:
                    seen[json.loads(line)["id"]] += 1
                except json.JSONDecodeError:
                    torn += 1
        repeats = sum(n - 1 for n in seen.values() if n > 1)
        missing = a.events - len(seen)
        s = status(binary, cfg)
        resent = s.get("resent", "n/a")
        print(
            f"events {a.events}, kills {kills}: received {sum(seen.values())}, distinct "
            f"{len(seen)}, missing {missing}, repeats at the receiver {repeats} "
            f"({repeats / max(kills, 1):.0f} per kill), torn lines {torn}, relay status "
            f"resent {resent}"
        )
        if missing:
            sys.exit(1)


if __name__ == "__main__":
    main()
