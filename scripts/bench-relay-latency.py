#!/usr/bin/env python3
"""Relay latency at a steady feed: `run` consumes RATE msg/s from a private upstream Mosquitto
for SECONDS and relays every applied effect to one sink; for each effect, the latency is the
time from its commit (the audit entry's recorded_at: when its batch was decided, just before
the commit) to its arrival downstream:

- mqtt: the arrival at a `mosquitto_sub -q 1` on a second private Mosquitto (printed with
  nanosecond time stamps), just after the broker accepted the PUBLISH the sink awaits the
  PUBACK of;
- postgres: the row's `inserted_at` (`now()` of the sink's transaction) in a database this
  script creates and drops on the local server (127.0.0.1:5432, user postgres).

Prints p50, p90, p99 and max in ms. Same clock: everything runs on this machine.

    scripts/bench-relay-latency.py mqtt|postgres [RATE] [SECONDS]     (defaults 1000 and 20)

Needs mosquitto, mosquitto_sub, psql (postgres), and the release builds
(cargo build --release --bins --examples). Writes only under its own temp dir.
"""
import calendar, json, os, shutil, signal, socket, subprocess, sys, tempfile, time

KIND = sys.argv[1] if len(sys.argv) > 1 else "mqtt"
RATE = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
SECONDS = int(sys.argv[3]) if len(sys.argv) > 3 else 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("RG_BIN") or os.path.join(ROOT, "target", "release", "replay-guard")
PUB = os.path.join(ROOT, "target", "release", "examples", "publish")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_broker(d):
    os.makedirs(d, exist_ok=True)
    port = free_port()
    conf = os.path.join(d, "mosquitto.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\nuser root\npersistence false\n"
                "max_queued_messages 0\n")
    p = subprocess.Popen(["mosquitto", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return p, port
        except OSError:
            time.sleep(0.02)
    raise SystemExit("mosquitto did not start")


def psql(db, sql):
    return subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-Atqc", sql],
                          check=True, capture_output=True, text=True).stdout


def pct(xs, p):
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def main():
    tmp = tempfile.mkdtemp(prefix="rg-bench-latency.")
    procs, pgdb = [], None
    try:
        up, up_port = start_broker(os.path.join(tmp, "up"))
        procs.append(up)
        db = os.path.join(tmp, "rg.redb")
        sink = ""
        arrivals_file = os.path.join(tmp, "arrivals.txt")
        if KIND == "mqtt":
            down, down_port = start_broker(os.path.join(tmp, "down"))
            procs.append(down)
            sub = subprocess.Popen(["mosquitto_sub", "-p", str(down_port), "-q", "1", "-t", "cop/#", "-F", "%U %p"],
                                   stdout=open(arrivals_file, "w"), stderr=subprocess.DEVNULL)
            procs.append(sub)
            sink = (f'[[sink]]\nname = "cop"\nkind = "mqtt"\nbroker = "mqtt://127.0.0.1:{down_port}"\n'
                    'client_id = "bench-relay-latency"\ntopic = "cop/{agency}/{source_id}"\n')
        elif KIND == "postgres":
            pgdb = f"rg_bench_latency_{os.getpid()}"
            psql("postgres", f"CREATE DATABASE {pgdb}")
            sink = (f'[[sink]]\nname = "cop"\nkind = "postgres"\n'
                    f'dsn = "host=127.0.0.1 port=5432 user=postgres dbname={pgdb}"\ntable = "cop_events"\n')
        else:
            raise SystemExit("kind: mqtt or postgres")
        cfg = os.path.join(tmp, "rg.toml")
        with open(cfg, "w") as f:
            f.write(f'[store]\npath = "{db}"\n[mqtt]\nbrokers = ["mqtt://127.0.0.1:{up_port}"]\n'
                    'client_id = "bench-latency-rg"\ntopics = ["incidents/#"]\n' + sink)
        run = subprocess.Popen([BIN, "run", "--config", cfg], stderr=open(os.path.join(tmp, "run.log"), "w"))
        procs.append(run)
        time.sleep(1.0)
        n = RATE * SECONDS
        lines = "".join(
            json.dumps({"agency": "CALFIRE", "source_id": f"E{i % 50}", "epoch": 1, "sequence": i,
                        "status": "available", "note": "x" * 120}) + "\n" for i in range(n))
        p = subprocess.Popen([PUB, str(up_port), "incidents/ca", "bench-latency-pub", str(RATE)], stdin=subprocess.PIPE)
        p.communicate(lines.encode())
        # Let the last ones arrive.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            st = subprocess.run([BIN, "relay", "status", "--config", cfg, "--format", "json"],
                                capture_output=True, text=True)
            if st.returncode == 0:
                s = json.loads(st.stdout)["sinks"][0]
                if s["cursor"] is not None and s["cursor"] >= n:
                    break
            time.sleep(0.2)
        time.sleep(0.5)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=30)
        committed = {}
        out = subprocess.run([BIN, "dump-audit", "--db", db, "--outcome", "applied"], capture_output=True,
                             text=True, check=True).stdout
        for line in out.splitlines():
            e = json.loads(line)
            t = e["recorded_at"]  # 2026-12-01T06:25:09.907Z
            committed[e["key"]] = calendar.timegm(time.strptime(t[:19], "%Y-%m-%dT%H:%M:%S")) \
                + int(t[20:23]) / 1000
        arrived = {}
        if KIND == "mqtt":
            time.sleep(0.5)
            for line in open(arrivals_file):
                ts, _, payload = line.partition(" ")
                try:
                    ev = json.loads(payload)
                except ValueError:
                    continue
                arrived.setdefault(ev["id"], float(ts))
        else:
            for row in psql(pgdb, "SELECT id, extract(epoch from inserted_at) FROM cop_events").splitlines():
                i, t = row.split("|")
                arrived[i] = float(t)
        lat = sorted((arrived[k] - committed[k]) * 1000 for k in committed if k in arrived)
        missing = len(committed) - len(lat)
        print(f"{KIND}: {len(lat)} effects at {RATE} msg/s for {SECONDS} s ({missing} not seen downstream); "
              f"commit -> downstream latency p50 {pct(lat, 0.5):.1f} ms, p90 {pct(lat, 0.9):.1f} ms, "
              f"p99 {pct(lat, 0.99):.1f} ms, max {lat[-1]:.1f} ms")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        if pgdb:
            subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-Atqc",
                            f"DROP DATABASE IF EXISTS {pgdb} WITH (FORCE)"], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
