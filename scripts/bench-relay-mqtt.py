#!/usr/bin/env python3
"""Measurements of the relay's `mqtt` sink against a local private Mosquitto (not tests).

1. Drain throughput: N ~200-byte effects are ingested into a fresh database (`ingest`), then
   `replay-guard relay --config CFG` (standalone) drains the backlog to the broker; timed from
   the relay's start until a `mosquitto_sub -q 1` subscriber has received all N. Same run,
   same broker, baselines: the same N envelopes published by `mosquitto_pub -q 1 -l` and by
   the rumqttc load generator (`examples/publish`), timed the same way (the envelopes the relay
   delivered, as captured by the subscriber). ROUNDS rounds, medians.
2. Latency at RATE msg/s (optional, LAT_SECONDS > 0): a steady feed on an upstream broker A
   consumed by `run` with the sink to broker B; for each event, downstream arrival time (read
   by the subscriber) minus the envelope's `time` (when `run` received the message, so the
   figure includes the commit). p50 / p99 / max.

Usage: scripts/bench-relay-mqtt.py [N] [ROUNDS] [LAT_SECONDS] [RATE]   (100000 3 20 1000)
Env:   RG_BATCH_MAX, RG_LINGER_MS: the sink's batch_max and linger_ms; RG_PROTOCOL (v5);
       RG_BROKER_NODELAY=1: the brokers run with `set_tcp_nodelay true`.
Needs: mosquitto, mosquitto_sub, mosquitto_pub, and release builds (--bins --examples).
"""
import json, os, random, shutil, signal, socket, subprocess, sys, tempfile, threading, time
from datetime import datetime

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
LAT_SECONDS = float(sys.argv[3]) if len(sys.argv) > 3 else 20
RATE = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("RG_BIN") or os.path.join(ROOT, "target", "release", "replay-guard")
PUB = os.path.join(ROOT, "target", "release", "examples", "publish")
PROTOCOL = os.environ.get("RG_PROTOCOL", "v5")


BROKERS = []  # stopped on the way out, whatever happens


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_broker(d, name):
    """A stock Mosquitto: only a private listener (so its defaults, e.g. receive maximum 20)."""
    port = free_port()
    conf = os.path.join(d, f"{name}.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\nuser root\npersistence false\n"
                "max_queued_messages 0\n")
        if os.environ.get("RG_BROKER_NODELAY"):
            f.write("set_tcp_nodelay true\n")
    p = subprocess.Popen(["mosquitto", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    BROKERS.append(p)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return p, port
        except OSError:
            time.sleep(0.02)
    raise SystemExit("mosquitto did not start")


def feed(n, seed):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s = rng.randrange(50)
        head = '{"agency":"agency-%d","source_id":"unit-%03d","epoch":1,"sequence":%d,"note":"' % (s % 5, s, i)
        out.append(head + "x" * max(1, 198 - len(head)) + '"}')
    return out


def sink_toml(port, extra=""):
    s = (f'[[sink]]\nname = "bench"\nkind = "mqtt"\nbroker = "mqtt://127.0.0.1:{port}"\n'
         f'protocol = "{PROTOCOL}"\nclient_id = "bench-sink"\ntopic = "cop/{{agency}}/{{source_id}}"\n')
    if "RG_BATCH_MAX" in os.environ:
        s += f"batch_max = {int(os.environ['RG_BATCH_MAX'])}\n"
    if "RG_LINGER_MS" in os.environ:
        s += f"linger_ms = {int(os.environ['RG_LINGER_MS'])}\n"
    return s + extra


class Sub:
    """mosquitto_sub on cop/#; counts lines, optionally keeps (arrival time, line)."""

    def __init__(self, port, cid, keep=False):
        self.p = subprocess.Popen(["mosquitto_sub", "-p", str(port), "-q", "1", "-i", cid, "-t", "cop/#"],
                                  stdout=subprocess.PIPE, text=True, bufsize=1)
        self.count, self.keep, self.lines = 0, keep, []
        self.cv = threading.Condition()
        threading.Thread(target=self.read, daemon=True).start()
        time.sleep(0.3)  # its SUBSCRIBE

    def read(self):
        for line in self.p.stdout:
            now = time.time()
            with self.cv:
                self.count += 1
                if self.keep:
                    self.lines.append((now, line))
                self.cv.notify_all()

    def wait(self, n, limit=600):
        with self.cv:
            ok = self.cv.wait_for(lambda: self.count >= n, timeout=limit)
        if not ok:
            raise SystemExit(f"only {self.count} of {n} arrived")

    def stop(self):
        self.p.terminate()
        self.p.wait()


def timed(port, n, start, keep=False, limit=600):
    sub = Sub(port, "bench-sub", keep)
    try:
        t0 = time.monotonic()
        p = start()
        try:
            sub.wait(n, limit)
        except SystemExit:
            p.kill()
            p.wait()
            raise
        return time.monotonic() - t0, p, [l for _, l in sub.lines]
    finally:
        sub.stop()


def main():
    subprocess.run(["cargo", "build", "--release", "--bins", "--examples", "-q"], cwd=ROOT, check=True)
    tmp = tempfile.mkdtemp(prefix="rg-bench-relay.")
    med = lambda xs: sorted(xs)[len(xs) // 2]
    try:
        broker, port = start_broker(tmp, "b")
        lines = feed(N, 1)
        src = os.path.join(tmp, "feed.jsonl")
        with open(src, "w") as f:
            f.write("\n".join(lines) + "\n")
        relay, mpub, rpub = [], [], []
        for r in range(ROUNDS):
            db = os.path.join(tmp, f"rg{r}.redb")
            subprocess.run([BIN, "ingest", "--db", db, src], check=True, stderr=subprocess.DEVNULL)
            cfg = os.path.join(tmp, f"rg{r}.toml")
            with open(cfg, "w") as f:
                f.write(f'[store]\npath = "{db}"\n' + sink_toml(port))
            t, p, envs = timed(port, N, lambda: subprocess.Popen([BIN, "relay", "--config", cfg],
                                                                  stderr=subprocess.DEVNULL), keep=True)
            p.send_signal(signal.SIGTERM)
            p.wait()
            relay.append(N / t)
            # The baselines publish the very envelopes the relay delivered.
            body = "".join(envs[:N]).encode()

            # mosquitto_pub -l (2.0.11) stops at end of input with messages still queued:
            # its input stays open until the subscriber has them all.
            def mosq():
                p = subprocess.Popen(["mosquitto_pub", "-p", str(port), "-q", "1", "-t", "cop/a/b", "-l"],
                                     stdin=subprocess.PIPE)
                p.stdin.write(body)
                p.stdin.flush()
                return p
            try:
                t, p, _ = timed(port, N, mosq, limit=120)
                p.stdin.close()
                p.wait()
                mpub.append(N / t)
            except SystemExit as e:
                print(f"mosquitto_pub -l: {e}", flush=True)

            def rumq():
                p = subprocess.Popen([PUB, str(port), "cop/a/b", "bench-pub"], stdin=subprocess.PIPE)
                p.stdin.write(body)
                p.stdin.close()
                return p
            t, p, _ = timed(port, N, rumq)
            p.wait()
            rpub.append(N / t)
            print(f"round {r + 1}: relay {relay[-1]:,.0f} ev/s, mosquitto_pub -q 1 -l "
                  f"{mpub[-1] if len(mpub) > r else float('nan'):,.0f} msg/s, rumqttc publish example "
                  f"{rpub[-1]:,.0f} msg/s", flush=True)
        print(f"median over {ROUNDS}: relay {med(relay):,.0f} ev/s; mosquitto_pub {med(mpub) if mpub else float('nan'):,.0f} "
              f"msg/s; rumqttc example {med(rpub):,.0f} msg/s")
        if LAT_SECONDS > 0:
            latency(tmp)
        broker.terminate()
        broker.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def latency(tmp):
    a, pa = start_broker(tmp, "a")
    b, pb = start_broker(tmp, "lat-b")
    db = os.path.join(tmp, "lat.redb")
    cfg = os.path.join(tmp, "lat.toml")
    with open(cfg, "w") as f:
        f.write(f'[store]\npath = "{db}"\n[mqtt]\nbrokers = ["mqtt://127.0.0.1:{pa}"]\nclient_id = "lat-rg"\n'
                f'topics = ["incidents/#"]\n' + sink_toml(pb))
    sub = Sub(pb, "lat-sub", keep=True)
    rg = subprocess.Popen([BIN, "run", "--config", cfg], stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    n = int(LAT_SECONDS * RATE)
    # mosquitto_pub -l publishes each line as it reads it (the rumqttc example reads all first);
    # its input stays open until everything arrived (it stops at end of input, see above).
    pub = subprocess.Popen(["mosquitto_pub", "-p", str(pa), "-q", "1", "-t", "incidents/x", "-l"],
                           stdin=subprocess.PIPE)
    t0 = time.monotonic()
    for i, line in enumerate(feed(n, 3)):
        pub.stdin.write((line + "\n").encode())
        pub.stdin.flush()
        d = t0 + (i + 1) / RATE - time.monotonic()
        if d > 0:
            time.sleep(d)
    sub.wait(n, limit=120)
    pub.stdin.close()
    pub.wait()
    lat = []
    for arrived, line in sub.lines:
        ev = json.loads(line)
        received = datetime.fromisoformat(ev["time"].replace("Z", "+00:00")).timestamp()
        lat.append((arrived - received) * 1000)
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    print(f"latency at {RATE} msg/s over {LAT_SECONDS:.0f} s ({len(lat)} events), receipt by run -> "
          f"downstream subscriber: p50 {q(0.50):.1f} ms, p99 {q(0.99):.1f} ms, max {lat[-1]:.1f} ms")
    rg.send_signal(signal.SIGTERM)
    rg.wait()
    sub.stop()
    for p in (a, b):
        p.terminate()
        p.wait()


if __name__ == "__main__":
    main()
