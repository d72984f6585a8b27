#!/usr/bin/env python3
"""`replay-guard run` end to end on the PostgreSQL store, against the redb file, same run.

Members are started first and subscribe (a shared subscription, `share_group`, for the
PostgreSQL members); then N ~200-byte QoS 1 messages (10% replays) are published as fast as
the load generator goes, and the clock runs until every message is decided (the audit log
holds N entries). Configurations, interleaved ROUNDS times: redb with 1 member, PostgreSQL
with 1 member, PostgreSQL with 3 members. Also `mosquitto_sub -q 1` as the broker's ceiling.

Usage: scripts/bench-pg-run.py [N] [ROUNDS]   (defaults 30000 and 2)
Environment: RG_BIN, the binary measured (default target/release/replay-guard); RG_OLD_BIN,
another build (e.g. the last release) measured in the same rounds, alternating, as the baseline.
Needs: mosquitto, mosquitto_sub, psql, the local PostgreSQL on 127.0.0.1:5432 (trust, user
postgres), and the release builds (cargo build --release --bins --examples). Creates and
drops its own database (rg_bench_run_PID); starts its own brokers on free loopback ports.
"""
import os, shutil, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 30_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("RG_BIN") or os.path.join(ROOT, "target", "release", "replay-guard")
OLD_BIN = os.environ.get("RG_OLD_BIN")
PUB = os.path.join(ROOT, "target", "release", "examples", "publish")
DB = f"rg_bench_run_{os.getpid()}"
PSQL = ["psql", "-h", "127.0.0.1", "-p", "5432", "-U", "postgres", "-X", "-A", "-t", "-q"]


def _bench_run():
    """scripts/bench-run.py as a module: its feed, broker and free-port helpers."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_run", os.path.join(ROOT, "scripts", "bench-run.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BR = _bench_run()


def psql(sql, db=DB):
    return subprocess.run(PSQL + ["-d", db, "-c", sql], capture_output=True, text=True, check=True).stdout.strip()


def decided(store, schema):
    if store == "redb":
        out = subprocess.run([BIN, "stats", "--format", "json", "--db", schema], capture_output=True, text=True)
        import json
        try:
            return json.loads(out.stdout)["decisions_total"]["total"]
        except Exception:
            return 0
    try:
        # The log is `audit_log` from schema version 3 on (`audit` before: an older build).
        table = psql(f"SELECT coalesce(to_regclass('{schema}.audit_log'), to_regclass('{schema}.audit'))")
        return int(psql(f"SELECT count(*) FROM {table}") or 0) if table else 0
    except subprocess.CalledProcessError:
        return 0


def measure(d, port, store, members, lines, tag, binary=None):
    binary = binary or BIN
    procs, target = [], None
    for m in range(members):
        cfg = os.path.join(d, f"{tag}-{m}.toml")
        if store == "redb":
            target = os.path.join(d, f"{tag}.redb")
            head = f'[store]\npath = "{target}"\n'
            share = ""
        else:
            target = tag
            head = (f'[store]\nbackend = "postgres"\ndsn = "host=127.0.0.1 port=5432 user=postgres dbname={DB}"\n'
                    f'schema = "{tag}"\n')
            share = f'share_group = "{tag}"\n'
        with open(cfg, "w") as f:
            f.write(head + f'[mqtt]\nbrokers = ["mqtt://127.0.0.1:{port}"]\nclient_id = "{tag}-{m}"\n'
                    f'topics = ["bench/#"]\n{share}')
        procs.append(subprocess.Popen([binary, "run", "--config", cfg], stdout=subprocess.DEVNULL,
                                      stderr=open(os.path.join(d, f"{tag}-{m}.log"), "w")))
    time.sleep(1.5)  # connected and subscribed (the schema made)
    t0 = time.monotonic()
    pub = subprocess.Popen([PUB, str(port), "bench/t", f"pub-{tag}"], stdin=subprocess.PIPE)
    pub.communicate(("\n".join(lines) + "\n").encode())
    while decided(store, target) < len(lines):
        if time.monotonic() - t0 > 120:
            for m in range(members):
                with open(os.path.join(d, f"{tag}-{m}.log")) as f:
                    sys.stderr.write(f"--- {tag}-{m}.log (last 20 lines)\n" + "".join(f.readlines()[-20:]))
            raise SystemExit(f"{tag}: only {decided(store, target)} of {len(lines)} decided")
        time.sleep(0.05)
    secs = time.monotonic() - t0
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=30)
    return len(lines) / secs


def main():
    lines = BR.feed(N, 1)
    subprocess.run(PSQL + ["-d", "postgres", "-c", f"CREATE DATABASE {DB}"], check=True)
    d = tempfile.mkdtemp(prefix="rg-bench-pg-run.")
    broker, port = BR.start_broker(d)
    try:
        for r in range(ROUNDS):
            t0 = time.monotonic()
            sub = subprocess.Popen(["mosquitto_sub", "-p", str(port), "-q", "1", "-i", "bench-sub",
                                    "-t", "bench/#", "-C", str(N)], stdout=subprocess.DEVNULL)
            time.sleep(0.5)
            t0 = time.monotonic()
            pub = subprocess.Popen([PUB, str(port), "bench/t", "pub-sub"], stdin=subprocess.PIPE)
            pub.communicate(("\n".join(lines) + "\n").encode())
            sub.wait(timeout=300)
            base = N / (time.monotonic() - t0)
            rates = [measure(d, port, "redb", 1, lines, f"redb_{r}"),
                     measure(d, port, "pg", 1, lines, f"pg1_{r}"),
                     measure(d, port, "pg", 3, lines, f"pg3_{r}")]
            line = (f"round {r + 1}: mosquitto_sub {base:,.0f} msg/s; run redb 1 member {rates[0]:,.0f}; "
                    f"run postgres 1 member {rates[1]:,.0f}; run postgres 3 members {rates[2]:,.0f} msg/s")
            if OLD_BIN:
                old = [measure(d, port, "pg", 1, lines, f"old_pg1_{r}", OLD_BIN),
                       measure(d, port, "pg", 3, lines, f"old_pg3_{r}", OLD_BIN)]
                line += f"; old build: postgres 1 member {old[0]:,.0f}, 3 members {old[1]:,.0f} msg/s"
            print(line, flush=True)
    finally:
        broker.terminate()
        broker.wait()
        subprocess.run(PSQL + ["-d", "postgres", "-c", f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)"])
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
