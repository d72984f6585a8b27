#!/usr/bin/env python3
"""Latency of `replay-guard run` at a steady feed, for choosing `[commit] linger_ms`.

1. The maximum rate: N messages queued on a private Mosquitto for an offline session, drained
   by `run` (as scripts/bench-run.py does); RATE defaults to half of it.
2. For each linger_ms in LINGERS: a fresh database, `run` subscribed, then SECONDS of a steady
   feed at RATE msg/s (one source, sequences 1, 2, ...; the load generator `examples/publish`
   paces it). Two small TCP relays in this script see every packet and stamp it:
   publisher -> broker (when each PUBLISH left the publisher) and broker -> `run` (when it
   reached `run`, and when `run`'s PUBACK for it left). The durable commit of each message is
   the `batch committed size=N` debug line `run` logs after its commit returns (batches are in
   delivery order). Reported per linger_ms, p50 / p99 / p999 in ms, of
   publish -> durable commit and publish -> PUBACK leaving `run`.

Usage: scripts/bench-latency.py [SECONDS] [RATE] [LINGERS]   (defaults 20, half the max, "0,2,5,10,20")
Env:   RG_BIN another replay-guard binary; RG_MAX_N messages for the maximum (default 50000).
Needs: mosquitto, mosquitto_sub and the release builds (cargo build --release --bins --examples).
Writes only under its own temp dir; starts its own broker on a free loopback port.
"""
import importlib.util, os, re, shutil, signal, socket, subprocess, sys, tempfile, threading, time

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("bench_run", os.path.join(HERE, "bench-run.py"))
br = importlib.util.module_from_spec(spec)
argv, sys.argv = sys.argv, sys.argv[:1]
spec.loader.exec_module(br)
sys.argv = argv

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 20
RATE = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
LINGERS = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "0,2,5,10,20").split(",")]
MAX_N = int(os.environ.get("RG_MAX_N", "50000"))
SEQ = re.compile(rb'"sequence":(\d+)')


def varint(buf, i):
    """MQTT remaining length at buf[i:]: (value, next index) or None if incomplete."""
    mult, val = 1, 0
    for k in range(4):
        if i + k >= len(buf):
            return None
        b = buf[i + k]
        val += (b & 0x7F) * mult
        if not b & 0x80:
            return val, i + k + 1
        mult *= 128
    raise ValueError("bad remaining length")


class Stamper:
    """Parses one direction of an MQTT stream; calls on_packet(kind, pkid, payload) per packet."""

    def __init__(self, v5, on_packet):
        self.buf, self.v5, self.on_packet = bytearray(), v5, on_packet

    def feed(self, data, now):
        self.buf += data
        while True:
            if len(self.buf) < 2:
                return
            r = varint(self.buf, 1)
            if r is None:
                return
            length, start = r
            if len(self.buf) < start + length:
                return
            body = bytes(self.buf[start:start + length])
            first = self.buf[0]
            del self.buf[:start + length]
            kind = first >> 4
            if kind == 3 and (first >> 1) & 3:  # PUBLISH, QoS > 0
                tl = int.from_bytes(body[0:2], "big")
                pkid = int.from_bytes(body[2 + tl:4 + tl], "big")
                rest = body[4 + tl:]
                if self.v5:
                    plen, j = varint(rest, 0)
                    rest = rest[j + plen:]
                self.on_packet("publish", pkid, rest, now)
            elif kind == 4:  # PUBACK
                self.on_packet("puback", int.from_bytes(body[0:2], "big"), b"", now)


def relay(listen_port, target_port, up_v5, down_v5, on_up, on_down):
    """A one-connection TCP relay 127.0.0.1:listen_port -> target_port that stamps packets."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", listen_port))
    srv.listen(4)

    def pump(a, b, stamper):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                now = time.monotonic()
                b.sendall(data)
                if stamper:
                    stamper.feed(data, now)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def accept():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            u = socket.create_connection(("127.0.0.1", target_port))
            u.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=pump, args=(c, u, on_up and Stamper(up_v5, on_up)), daemon=True).start()
            threading.Thread(target=pump, args=(u, c, on_down and Stamper(down_v5, on_down)), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return srv


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] * 1000


def config(d, port, db, linger):
    cfg = os.path.join(d, f"lat-{linger}.toml")
    with open(cfg, "w") as f:
        f.write(f'[store]\npath = "{db}"\n[mqtt]\nbrokers = ["mqtt://127.0.0.1:{port}"]\n'
                f'client_id = "lat-rg-{linger}"\ntopics = ["lat/#"]\n[commit]\nlinger_ms = {linger}\n')
    return cfg


def max_rate(tmp, port):
    lines = br.feed(MAX_N, 7)
    cfg = br.write_config(tmp, port, os.path.join(tmp, "max.redb"))
    p = subprocess.Popen([br.BIN, "run", "--config", cfg], stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    p.wait()
    br.publish(port, lines)
    t, _ = br.run_until(cfg, MAX_N, [])
    return MAX_N / t


def one(tmp, broker_port, rate, linger):
    n = int(rate * SECONDS)
    pub_t, recv_t, ack_t, by_pkid, order = {}, {}, {}, {}, []
    lock = threading.Lock()

    def on_pub_up(kind, pkid, payload, now):
        if kind == "publish":
            m = SEQ.search(payload)
            if m:
                pub_t[int(m.group(1))] = now

    def on_rg_down(kind, pkid, payload, now):  # broker -> run
        if kind == "publish":
            m = SEQ.search(payload)
            if m:
                seq = int(m.group(1))
                with lock:
                    by_pkid[pkid] = seq
                    recv_t.setdefault(seq, now)
                    order.append(seq)

    def on_rg_up(kind, pkid, payload, now):  # run -> broker
        if kind == "puback":
            with lock:
                seq = by_pkid.get(pkid)
            if seq is not None:
                ack_t.setdefault(seq, now)

    pub_port, rg_port = br.free_port(), br.free_port()
    r1 = relay(pub_port, broker_port, False, False, on_pub_up, None)
    r2 = relay(rg_port, broker_port, True, True, on_rg_up, on_rg_down)
    db = os.path.join(tmp, f"lat-{linger}.redb")
    cfg = config(tmp, rg_port, db, linger)
    env = dict(os.environ, RUST_LOG="replay_guard=debug")
    p = subprocess.Popen([br.BIN, "--log-format", "text", "run", "--config", cfg],
                         stderr=subprocess.PIPE, env=env, text=True)
    commits = []  # (time, cumulative count)
    ready = threading.Event()

    def read_log():
        done = 0
        for line in p.stderr:
            if "subscribed" in line.lower():
                ready.set()
            m = re.search(r"batch committed size=(\d+)", line)
            if m:
                done += int(m.group(1))
                commits.append((time.monotonic(), done))
        ready.set()

    th = threading.Thread(target=read_log, daemon=True)
    th.start()
    ready.wait(30)
    time.sleep(0.5)
    feed = "\n".join('{"agency":"lat","source_id":"s1","sequence":%d,"note":"%s"}' % (i, "x" * 150)
                     for i in range(1, n + 1)) + "\n"
    pub = subprocess.run([br.PUB, str(pub_port), "lat/t", f"lat-pub-{linger}", str(rate)],
                         input=feed.encode(), check=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not commits or commits[-1][1] < n or len(ack_t) < n):
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    r1.close()
    r2.close()
    commit_t = {}
    with lock:
        seqs = list(order)
    k = 0
    for t, total in commits:
        while k < total and k < len(seqs):
            commit_t.setdefault(seqs[k], t)
            k += 1
    to_commit = [commit_t[s] - pub_t[s] for s in commit_t if s in pub_t]
    to_ack = [ack_t[s] - pub_t[s] for s in ack_t if s in pub_t]
    to_recv = [recv_t[s] - pub_t[s] for s in recv_t if s in pub_t]
    if not to_commit or not to_ack:
        raise SystemExit(f"linger_ms {linger}: nothing measured (commits {len(commits)}, acks {len(ack_t)})")
    batches = len(commits)
    print(f"linger_ms {linger:>3}: {n} msgs at {rate}/s, {batches} batches (mean {n / max(batches, 1):.1f}); "
          f"publish->run p50 {pct(to_recv, .5):.2f} ms; "
          f"publish->durable commit p50 {pct(to_commit, .5):.2f} p99 {pct(to_commit, .99):.2f} "
          f"p999 {pct(to_commit, .999):.2f} ms; publish->PUBACK leaving p50 {pct(to_ack, .5):.2f} "
          f"p99 {pct(to_ack, .99):.2f} p999 {pct(to_ack, .999):.2f} ms "
          f"({len(to_ack)}/{n} acks seen)", flush=True)


def main():
    subprocess.run(["cargo", "build", "--release", "--bins", "--examples", "-q"], cwd=br.ROOT, check=True)
    tmp = tempfile.mkdtemp(prefix="rg-bench-latency.")
    broker = None
    try:
        broker, port = br.start_broker(tmp)
        rate = RATE
        if rate is None:
            m = max_rate(tmp, port)
            rate = int(m / 2)
            print(f"maximum rate of run (drain of {MAX_N} queued): {m:,.0f} msg/s; probing at {rate:,} msg/s", flush=True)
        for linger in LINGERS:
            one(tmp, port, rate, linger)
    finally:
        if broker and broker.poll() is None:
            broker.terminate()
            broker.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
