#!/usr/bin/env python3
"""End-to-end measurements of `replay-guard run` against a local Mosquitto.

1. Throughput ratio: N ~200-byte QoS 1 messages (10% replays) are queued on a private broker
   for an offline persistent session, then drained by (a) `mosquitto_sub -q 1` (acks at once,
   stores nothing) and (b) `replay-guard run` (decides, commits durably, then acks). Same
   broker, same run, interleaved ROUNDS times. Reports msg/s of each and the ratio b/a, and
   where the CPU went while `run` drained (from its first commit to its last, from /proc, in
   clock ticks: 1/100 s): its `store` thread, its other threads, the broker, and the machine's
   idle share. A `store` thread near 100% of a core while the machine idles is the bound.
2. Restart after kill -9 with a 1,000,000-entry window: time from process start to the first
   commit (READY + first batch) on a database holding 1M applied messages.
3. Peak RSS of `run` during the drains (from /proc/PID/status VmHWM), and while draining N
   more messages into the 1,000,000-entry window of step 2 with the metrics endpoint on
   (scraped every 0.2 s) and one `mqtt` sink.

4. With RG_WITH_SINK=1: what a running relay costs the feed. Each round also drains the same
   feed with one `mqtt` [[sink]] configured (to a second private Mosquitto), and reports the
   ratio of that run's msg/s to the run without a sink.

5. With RG_METRICS=1: what the metrics endpoint costs the feed. Each round also drains the
   same feed with `[metrics]` on (first or second, alternately, against the order effect)
   while a scraper GETs /metrics every 0.2 s (75 times as often
   as Prometheus's default 15 s; RG_METRICS_SCRAPE=SECONDS, 0 for none), and reports the ratio
   to the run without. RG_METRICS_ONLY=1
   skips the restart measurement (also with another RG_BIN, for a baseline in the same run).

Usage: scripts/bench-run.py [N] [ROUNDS]     (defaults 100000 and 3; ROUNDS 0: steps 2-3 only)
Env:   RG_MAX_BATCH, RG_RECEIVE_MAXIMUM, RG_CACHE_MB override [commit] max_batch,
       [mqtt] receive_maximum and [store] cache_mb; RG_BIN another replay-guard binary (to
       compare builds, e.g. redb concurrency modes).
Needs: mosquitto, mosquitto_sub, and the release builds (cargo build --release --bins --examples).
"""
import os, random, re, shutil, signal, socket, subprocess, sys, tempfile, threading, time
import urllib.request

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("RG_BIN") or os.path.join(ROOT, "target", "release", "replay-guard")
PUB = os.path.join(ROOT, "target", "release", "examples", "publish")
# Settings under test (env overrides; defaults are the shipped defaults).
def setting(key, env):
    return f"{key} = {int(os.environ[env])}\n" if env in os.environ else ""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def feed(n, seed):
    rng = random.Random(seed)
    nxt, out = [1] * 50, []
    for i in range(1, n + 1):
        s = rng.randrange(50)
        if i % 10 == 0 and nxt[s] > 1:
            seq = nxt[s] - 1 - rng.randrange(min(nxt[s] - 1, 1000))
        else:
            seq, nxt[s] = nxt[s], nxt[s] + 1
        head = '{"agency":"agency-%d","source_id":"unit-%03d","epoch":1,"sequence":%d,"note":"' % (s % 5, s, seq)
        out.append(head + "x" * max(1, 198 - len(head)) + '"}')
    return out


def start_broker(d):
    port = free_port()
    conf = os.path.join(d, "mosquitto.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\nuser root\npersistence false\n"
                "max_queued_messages 0\nmax_inflight_messages 1000\n")
    p = subprocess.Popen(["mosquitto", "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return p, port
        except OSError:
            time.sleep(0.02)
    raise SystemExit("mosquitto did not start")


def publish(port, lines):
    # mosquitto_pub -l drops lines at these rates (2.0.11): use our rumqttc load generator.
    p = subprocess.Popen([PUB, str(port), "bench/t", "bench-pub"], stdin=subprocess.PIPE)
    p.communicate(("\n".join(lines) + "\n").encode())
    assert p.returncode == 0


def sub_session(port, cid):
    subprocess.run(["mosquitto_sub", "-p", str(port), "-q", "1", "-c", "-i", cid, "-t", "bench/#", "-W", "1"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def drain_mosquitto_sub(port, n):
    t0 = time.monotonic()
    subprocess.run(["mosquitto_sub", "-p", str(port), "-q", "1", "-c", "-i", "bench-sub", "-t", "bench/#", "-C", str(n)],
                   stdout=subprocess.DEVNULL, check=True)
    return time.monotonic() - t0


def write_config(d, port, db, window=600, sink_port=None, metrics_port=None):
    cfg = os.path.join(d, "rg.toml")
    with open(cfg, "w") as f:
        f.write(f'[store]\npath = "{db}"\n' + setting("cache_mb", "RG_CACHE_MB")
                + f'[window]\nseconds = {window}\n[mqtt]\nbrokers = ["mqtt://127.0.0.1:{port}"]\n'
                + 'client_id = "bench-rg"\ntopics = ["bench/#"]\n' + setting("receive_maximum", "RG_RECEIVE_MAXIMUM")
                + '[commit]\n' + setting("max_batch", "RG_MAX_BATCH"))
        if metrics_port:
            f.write(f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n')
        if sink_port:
            f.write(f'[[sink]]\nname = "cop"\nkind = "mqtt"\nbroker = "mqtt://127.0.0.1:{sink_port}"\n'
                    'client_id = "bench-rg-relay"\ntopic = "cop/{agency}/{source_id}"\n')
    return cfg


def stat_ticks(path):
    """(name, CPU ticks of user + system time) from a /proc stat file, or None if gone."""
    try:
        with open(path) as f:
            stat = f.read()
    except OSError:
        return None
    # The name is in parentheses and may hold spaces; the fields after it are fixed.
    fields = stat[stat.rindex(")") + 2:].split()
    return stat[stat.index("(") + 1:stat.rindex(")")], int(fields[11]) + int(fields[12])


def thread_ticks(pid):
    """CPU ticks of each thread of `pid`, summed by thread name."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        got = stat_ticks(f"/proc/{pid}/task/{tid}/stat")
        if got:
            out[got[0]] = out.get(got[0], 0) + got[1]
    return out


def machine_ticks():
    """(all, idle) CPU ticks of the machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    return sum(cpu), cpu[3] + cpu[4]


def cpu_split(before, after, seconds):
    """Where the CPU went between two snapshots of (run's threads, broker, machine), as
    shares of one core (the machine's idle: of all its cores)."""
    hz = os.sysconf("SC_CLK_TCK")
    (run0, broker0, (all0, idle0)), (run1, broker1, (all1, idle1)) = before, after
    store = (run1.get("store", 0) - run0.get("store", 0)) / hz / seconds
    rest = (sum(run1.values()) - sum(run0.values())) / hz / seconds - store
    broker = (broker1 - broker0) / hz / seconds
    idle = (idle1 - idle0) / max(1, all1 - all0)
    return (f"store thread {store:.0%} of a core, run's other threads {rest:.0%}, "
            f"broker {broker:.0%}, machine idle {idle:.0%} of its {os.cpu_count()} cores")


def run_until(cfg, n, rss, broker_pid=None, split=None):
    """Starts `run`, returns (seconds until n messages are committed, seconds to first commit).
    With `split` (a list), appends where the CPU went from the first commit to the last
    (`cpu_split`): the time `run` drained at full speed."""
    env = dict(os.environ, RUST_LOG="replay_guard=debug")
    t0 = time.monotonic()
    p = subprocess.Popen([BIN, "--log-format", "text", "run", "--config", cfg], stderr=subprocess.PIPE, env=env, text=True)
    done, first = 0, None
    broker_ticks = lambda: (stat_ticks(f"/proc/{broker_pid}/stat") or ("", 0))[1] if broker_pid else 0
    snap = lambda: (thread_ticks(p.pid), broker_ticks(), machine_ticks())
    before = None
    for line in p.stderr:
        m = re.search(r"batch committed size=(\d+)", line)
        if m:
            if before is None:
                before, t_first = snap(), time.monotonic()
            first = first or time.monotonic() - t0
            done += int(m.group(1))
            if done >= n and split is not None:
                split.append(cpu_split(before, snap(), max(1e-3, time.monotonic() - t_first)))
            try:
                with open(f"/proc/{p.pid}/status") as st:
                    hwm = int(re.search(r"VmHWM:\s+(\d+)", st.read()).group(1))
                    rss.append(hwm)
            except (OSError, AttributeError):
                pass
            if done >= n:
                break
    elapsed = time.monotonic() - t0
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    return elapsed, first


def main():
    subprocess.run(["cargo", "build", "--release", "--bins", "--examples", "-q"], cwd=ROOT, check=True)
    tmp = tempfile.mkdtemp(prefix="rg-bench-run.")
    broker = None
    try:
        broker, port = start_broker(tmp)
        lines = feed(N, 1)
        rss, sub_rates, rg_rates, sink_rates, metrics_rates, splits = [], [], [], [], [], []
        scrapes = []
        sink_port = None
        if os.environ.get("RG_WITH_SINK"):
            sink_dir = os.path.join(tmp, "downstream")
            os.mkdir(sink_dir)
            sink_broker, sink_port = start_broker(sink_dir)
        sub_session(port, "bench-sub")
        for r in range(ROUNDS):
            publish(port, lines)
            t = drain_mosquitto_sub(port, N)
            sub_rates.append(N / t)
            def drain_run(name, **kw):
                """`run` drains the queued feed into a new database; returns msg/s."""
                cfg = write_config(tmp, port, os.path.join(tmp, f"rg{r}{name}.redb"), **kw)
                # create the session, then queue the feed for it while it is offline
                p = subprocess.Popen([BIN, "run", "--config", cfg], stderr=subprocess.DEVNULL)
                time.sleep(0.5)
                p.send_signal(signal.SIGTERM)
                p.wait()
                publish(port, lines)
                stop = threading.Event()
                mport, every = kw.get("metrics_port"), float(os.environ.get("RG_METRICS_SCRAPE", "0.2"))

                def scraper():
                    while mport and every > 0 and not stop.wait(every):
                        try:
                            urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read()
                            scrapes.append(1)
                        except OSError:
                            pass
                th = threading.Thread(target=scraper)
                th.start()
                t, _ = run_until(cfg, N, rss, broker.pid, splits)
                stop.set()
                th.join()
                return N / t

            # With metrics, the two drains swap places every round: the second drain of a
            # round is often slower on this VM whatever it runs.
            with_metrics = bool(os.environ.get("RG_METRICS"))
            if with_metrics and r % 2 == 1:
                metrics_rates.append(drain_run("-metrics", metrics_port=free_port()))
            rg_rates.append(drain_run(""))
            print(f"round {r + 1}: mosquitto_sub {sub_rates[-1]:,.0f} msg/s, "
                  f"replay-guard {rg_rates[-1]:,.0f} msg/s, ratio {rg_rates[-1] / sub_rates[-1]:.2f}", flush=True)
            print(f"round {r + 1}: during run's drain: {splits[-1]}", flush=True)
            if with_metrics and r % 2 == 0:
                metrics_rates.append(drain_run("-metrics", metrics_port=free_port()))
            if with_metrics:
                print(f"round {r + 1}: replay-guard with metrics on "
                      f"{metrics_rates[-1]:,.0f} msg/s, ratio to without {metrics_rates[-1] / rg_rates[-1]:.2f}"
                      f" ({'first' if r % 2 else 'second'})", flush=True)
            if sink_port:
                sink_rates.append(drain_run("-sink", sink_port=sink_port))
                print(f"round {r + 1}: replay-guard with one mqtt sink {sink_rates[-1]:,.0f} msg/s, "
                      f"ratio to no sink {sink_rates[-1] / rg_rates[-1]:.2f}", flush=True)
        med = lambda xs: sorted(xs)[len(xs) // 2]
        if rg_rates:  # ROUNDS 0: only the 1M-window measurements below
            print(f"median: mosquitto_sub {med(sub_rates):,.0f} msg/s, replay-guard {med(rg_rates):,.0f} msg/s, "
                  f"ratio {med(rg_rates) / med(sub_rates):.2f}")
            print(f"peak RSS of run: {max(rss) / 1024:.1f} MiB")
        if sink_port:
            print(f"median with one mqtt sink: {med(sink_rates):,.0f} msg/s, ratio to no sink "
                  f"{med(sink_rates) / med(rg_rates):.2f}")
            sink_broker.terminate()
            sink_broker.wait()
            if os.environ.get("RG_SINK_ONLY"):
                return
        if metrics_rates:
            every = os.environ.get("RG_METRICS_SCRAPE", "0.2")
            print(f"median with metrics on (scraped every {every} s): {med(metrics_rates):,.0f} msg/s, "
                  f"ratio to without {med(metrics_rates) / med(rg_rates):.2f} ({len(scrapes)} scrapes answered)")
        if os.environ.get("RG_METRICS_ONLY"):
            return

        # Restart after kill -9 with a 1,000,000-entry window.
        db = os.path.join(tmp, "big.redb")
        big = os.path.join(tmp, "big.jsonl")
        with open(big, "w") as f:
            for i in range(1_000_000):
                f.write('{"agency":"a","source_id":"s%d","sequence":%d,"note":"%s"}\n' % (i % 50, i, "y" * 150))
        subprocess.run([BIN, "ingest", "--db", db, big], check=True, stderr=subprocess.DEVNULL)
        cfg = write_config(tmp, port, db, window=86400)
        p = subprocess.Popen([BIN, "run", "--config", cfg], stderr=subprocess.DEVNULL)
        time.sleep(1.0)
        p.kill()
        p.wait()
        publish(port, feed(1000, 2))
        rss2 = []
        _, first = run_until(cfg, 1, rss2)
        print(f"kill -9 -> restart -> first commit with a 1,000,000-entry window: {first:.3f} s; "
              f"peak RSS {max(rss2) / 1024:.1f} MiB")
        # Memory while draining N messages into that 1M-entry window, with the metrics endpoint
        # on (scraped every 0.2 s) and one mqtt sink delivering to a second broker.
        full_dir = os.path.join(tmp, "full")
        os.mkdir(full_dir)
        full_broker, full_sink_port = start_broker(full_dir)
        mport = free_port()
        cfg = write_config(tmp, port, db, window=86400, sink_port=full_sink_port, metrics_port=mport)
        publish(port, feed(N, 3))
        stop = threading.Event()

        def scrape():
            while not stop.wait(0.2):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5).read()
                except OSError:
                    pass
        th = threading.Thread(target=scrape)
        th.start()
        rss3 = []
        t, _ = run_until(cfg, N, rss3)
        stop.set()
        th.join()
        full_broker.terminate()
        full_broker.wait()
        print(f"draining {N} into the 1,000,000-entry window with metrics and one mqtt sink: "
              f"{N / t:,.0f} msg/s, peak RSS {max(rss3) / 1024:.1f} MiB")
        broker.terminate()
        broker.wait()
    finally:
        # An early return (RG_SINK_ONLY, RG_METRICS_ONLY) must not leave the broker running.
        if broker and broker.poll() is None:
            broker.terminate()
            broker.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
