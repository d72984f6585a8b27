#!/usr/bin/env python3
"""A field publisher for the torture runs: MQTT 3.1.1, QoS 1, a persistent session (clean
session off), standard library only.

Event i is `{"agency":"TORTURE","source_id":"U<i % 50>","epoch":1,"sequence":i,"note":"x…"}`
(about 200 bytes), so its key is (U<i % 50>, i) and the harness can tell exactly which events
exist. It publishes in bursts around --rate events/s on TOPIC/live until SIGTERM (or --count),
keeping at most --inflight unacknowledged. When a connection breaks it moves to the next of
--ports (a failover), reconnects with the same client id, and then, like a field app that cannot
know what the failed broker kept:
  - resends every event the broker had not acknowledged (DUP=1, same packet id, TOPIC/live);
  - resends the last --resend-last events it *had* acknowledged, as new publishes on
    TOPIC/resend (a broker restored from a snapshot lost whatever it acknowledged after it).
On SIGTERM it stops making events, waits until every one is acknowledged (reconnecting if it
must), writes --stats as JSON and exits 0; 1 if that takes more than --drain-seconds.

Usage: torture_pub.py --ports P[,P2...] --client-id ID --topic T --stats FILE [--rate R]
       [--count N] [--inflight W] [--resend-last K] [--seed S]
"""
import argparse
import json
import random
import select
import signal
import socket
import struct
import sys
import time

PAD = 200


def event(i):
    head = '{"agency":"TORTURE","source_id":"U%02d","epoch":1,"sequence":%d,"note":"' % (i % 50, i)
    return (head + "x" * max(1, PAD - 2 - len(head)) + '"}').encode()


def varint(n):
    out = bytearray()
    while True:
        b, n = n % 128, n // 128
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def utf8(s):
    b = s.encode()
    return struct.pack("!H", len(b)) + b


def packet(first, body):
    return bytes([first]) + varint(len(body)) + body


class Lost(Exception):
    """The connection broke (or was refused)."""


class Conn:
    def __init__(self, port, client_id):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # CONNECT: protocol MQTT level 4, flags 0 (clean session off), keep-alive 30 s.
        body = utf8("MQTT") + bytes([4, 0]) + struct.pack("!H", 30) + utf8(client_id)
        self.sock.sendall(packet(0x10, body))
        self.buf = b""
        self.out = bytearray()
        deadline = time.monotonic() + 2
        while True:
            for kind, data in self.read(max(0.0, deadline - time.monotonic())):
                if kind == 0x20:
                    if data[1] != 0:
                        raise Lost(f"CONNACK return code {data[1]}")
                    self.session_present = bool(data[0] & 1)
                    self.sock.setblocking(False)
                    return
            if time.monotonic() > deadline:
                raise Lost("no CONNACK")

    def read(self, timeout):
        """Packets (type, body) that arrived within `timeout`."""
        try:
            r, _, _ = select.select([self.sock], [], [], timeout)
            if r:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise Lost("closed by the broker")
                self.buf += chunk
        except (OSError, ValueError) as e:
            raise Lost(str(e))
        out = []
        while len(self.buf) >= 2:
            mult, n, pos = 1, 0, 1
            while True:
                if pos >= len(self.buf):
                    return out
                b = self.buf[pos]
                n += (b & 127) * mult
                mult *= 128
                pos += 1
                if not b & 128:
                    break
            if len(self.buf) < pos + n:
                return out
            out.append((self.buf[0] & 0xF0, self.buf[pos:pos + n]))
            self.buf = self.buf[pos + n:]
        return out

    def queue(self, data):
        self.out += data

    def flush(self):
        try:
            while self.out:
                n = self.sock.send(self.out)
                del self.out[:n]
        except BlockingIOError:
            pass
        except OSError as e:
            raise Lost(str(e))

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def publish(topic, pkid, payload, dup=False):
    return packet(0x32 | (0x08 if dup else 0), utf8(topic) + struct.pack("!H", pkid) + payload)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ports", required=True)
    ap.add_argument("--client-id", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--stats", required=True)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--count", type=int, default=0)
    ap.add_argument("--inflight", type=int, default=200)
    ap.add_argument("--resend-last", type=int, default=0)
    ap.add_argument("--drain-seconds", type=float, default=120)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    ports = [int(p) for p in a.ports.split(",")]
    rng = random.Random(a.seed)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(time.monotonic()))

    made = 0                    # events 0..made-1 exist
    unacked = {}                # pkid -> event index, in send order (dicts keep insertion order)
    acked_recent = []           # most recent acknowledged events, for the resend window
    next_pkid = 0
    stats = dict(events=0, reconnects=0, failovers=0, resent_unacked=0, resent_window=0,
                 session_present_after_reconnect=0)
    which = 0
    conn = None
    budget = 0.0
    last = time.monotonic()

    def new_pkid():
        nonlocal next_pkid
        for _ in range(65535):
            next_pkid = next_pkid % 65535 + 1
            if next_pkid not in unacked:
                return next_pkid
        raise SystemExit("no free packet id")

    def connect(first):
        nonlocal conn, which
        attempts = 0
        while True:
            port = ports[which]
            try:
                c = Conn(port, a.client_id)
                break
            except (OSError, Lost):
                attempts += 1
                # Retry the same broker twice, then fail over to the next one.
                if attempts % 2 == 0 and len(ports) > 1:
                    which = (which + 1) % len(ports)
                    stats["failovers"] += 1
                time.sleep(0.05)
                if stopping and time.monotonic() - stopping[0] > a.drain_seconds:
                    raise SystemExit("publisher: no broker reachable while draining")
        conn = c
        if first:
            return
        stats["reconnects"] += 1
        stats["session_present_after_reconnect"] += conn.session_present
        for pkid, i in unacked.items():
            conn.queue(publish(a.topic + "/live", pkid, event(i), dup=True))
            stats["resent_unacked"] += 1
        for i in acked_recent[-a.resend_last:] if a.resend_last else []:
            pkid = new_pkid()
            unacked[pkid] = i
            conn.queue(publish(a.topic + "/resend", pkid, event(i)))
            stats["resent_window"] += 1

    connect(True)
    while True:
        now = time.monotonic()
        if stopping and now - stopping[0] > a.drain_seconds:
            print(f"publisher: {len(unacked)} events still unacknowledged after "
                  f"{a.drain_seconds} s of draining", file=sys.stderr)
            sys.exit(1)
        done = stopping or (a.count and made >= a.count)
        if done and not unacked:
            break
        try:
            if not done:
                # Bursty: the budget refills at a rate that wanders between 0.2x and 2x.
                budget = min(budget + (now - last) * a.rate * rng.uniform(0.2, 2.0), a.inflight)
                last = now
                while budget >= 1 and len(unacked) < a.inflight and not (a.count and made >= a.count):
                    pkid = new_pkid()
                    unacked[pkid] = made
                    conn.queue(publish(a.topic + "/live", pkid, event(made)))
                    made += 1
                    budget -= 1
            conn.flush()
            for kind, body in conn.read(0.005):
                if kind == 0x40 and len(body) >= 2:
                    pkid = struct.unpack("!H", body[:2])[0]
                    i = unacked.pop(pkid, None)
                    if i is not None:
                        acked_recent.append(i)
                        if len(acked_recent) > 2 * max(a.resend_last, 1):
                            del acked_recent[: len(acked_recent) - max(a.resend_last, 1)]
        except Lost:
            conn.close()
            which = (which + 1) % len(ports) if len(ports) > 1 else which
            stats["failovers"] += len(ports) > 1
            connect(False)
    conn.sock.setblocking(True)
    conn.sock.sendall(packet(0xE0, b""))  # DISCONNECT, keeping the session
    conn.close()
    stats["events"] = made
    with open(a.stats, "w") as f:
        json.dump(stats, f)


if __name__ == "__main__":
    main()
