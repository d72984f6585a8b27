#!/usr/bin/env bash
# Relay throughput of the syslog sink: a backlog of N effects, ingested into a fresh database,
# drained by the standalone `replay-guard relay` to a real rsyslogd of this script's own (a
# temp dir, a free loopback port, each message's raw form to a file). Prints the events/s
# from starting the relay until rsyslog's file holds all N: over tcp:// for the effect stream
# and for the audit stream (`stream = "audit"`, N entries), and over relp:// (rsyslog's
# imrelp) for the audit stream, each with the sink's default settings.
# Baseline in the same run: util-linux `logger --tcp --octet-count` sending N lines of the
# same size to a fresh rsyslogd (the same syslog framing and receiver, without the database,
# the envelope, the acknowledgement check and the cursor writes).
# With OLD_BIN=path (a replay-guard built before the tcp:// sink stopped waiting out
# settle_ms after every batch), the audit stream over tcp:// with that binary too.
#
# Usage: scripts/bench-relay-syslog.sh [N]      (N defaults to 20000)
# Needs: rsyslog and rsyslog-relp (apt-get install rsyslog rsyslog-relp), python3, logger
# (util-linux). Env: BATCH_MAX=n, SETTLE_MS=n and RELP_WINDOW=n set the sink's batch_max,
# settle_ms and relp_window (defaults 500, 100 and 128, the sink's defaults); BENCH_KEEP=1 keeps
# the temp dir.
set -euo pipefail

N="${1:-20000}"
case "$N" in
'' | *[!0-9]*)
    echo "usage: $0 [N]  (N: number of effects, a positive integer)" >&2
    exit 1
    ;;
esac
BATCH_MAX="${BATCH_MAX:-500}"
SETTLE_MS="${SETTLE_MS:-100}"
RELP_WINDOW="${RELP_WINDOW:-128}"
OLD_BIN="${OLD_BIN:-}"
RSYSLOGD=/usr/sbin/rsyslogd
[ -x "$RSYSLOGD" ] || RSYSLOGD="$(command -v rsyslogd || true)"
[ -n "$RSYSLOGD" ] || { echo "rsyslogd not found: apt-get install -y rsyslog" >&2; exit 1; }

cd "$(dirname "$0")/.."
cargo build --release --quiet --bin replay-guard
BIN="$PWD/target/release/replay-guard"

TMP="$(mktemp -d -t replay-guard-syslog-bench.XXXXXX)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ "${BENCH_KEEP:-0}" = "1" ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_rsyslog() { # $1: name, $2: imtcp (default) or imrelp; sets SPORT, SOUT
    local d="$TMP/$1" input="${2:-imtcp}"
    mkdir -p "$d"
    SPORT="$(free_port)"
    SOUT="$d/out.log"
    cat >"$d/rsyslog.conf" <<EOF
global(workDirectory="$d" maxMessageSize="2m")
module(load="$input")
template(name="raw" type="string" string="%rawmsg%\n")
ruleset(name="out") {
  action(type="omfile" file="$SOUT" template="raw")
}
input(type="$input" port="$SPORT" address="127.0.0.1" ruleset="out")
EOF
    "$RSYSLOGD" -n -f "$d/rsyslog.conf" -i "$d/rsyslogd.pid" >"$d/rsyslogd.log" 2>&1 &
    PIDS+=("$!")
    for _ in $(seq 1 500); do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$SPORT),0.2)" 2>/dev/null && return 0
        sleep 0.02
    done
    echo "rsyslogd did not listen on $SPORT:" >&2
    cat "$d/rsyslogd.log" >&2
    exit 2
}

# Waits until $1 holds $2 lines; prints the seconds since $3 (date +%s.%N).
wait_lines() {
    local file="$1" want="$2" start="$3"
    for _ in $(seq 1 60000); do
        if [ -f "$file" ] && [ "$(wc -l <"$file")" -ge "$want" ]; then
            python3 -c "import time; print(f'{time.time() - $start:.2f}')"
            return 0
        fi
        sleep 0.01
    done
    echo "timed out waiting for $want lines in $file" >&2
    exit 2
}

# N distinct ~200-byte messages over 50 sources (no replays: every line is one effect).
python3 - "$N" "$TMP/feed.jsonl" <<'PY'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    for i in range(n):
        s = i % 50
        head = '{"agency":"agency-%d","source_id":"unit-%03d","epoch":1,"sequence":%d,"kind":"fire","note":"' % (s % 5, s, i // 50 + 1)
        f.write(head + "x" * max(0, 198 - len(head)) + '"}\n')
PY
"$BIN" ingest --db "$TMP/bench.redb" "$TMP/feed.jsonl" >/dev/null 2>"$TMP/ingest.log" || { cat "$TMP/ingest.log" >&2; exit 2; }

relay_run() { # $1: name, $2: stream, $3: tcp or relp, $4: the binary, $5: a note
    local scheme="${3:-tcp}" bin="${4:-$BIN}" input=imtcp keys="settle_ms = $SETTLE_MS"
    if [ "$scheme" = relp ]; then input=imrelp; keys="relp_window = $RELP_WINDOW"; fi
    start_rsyslog "$1" "$input"
    cat >"$TMP/$1.toml" <<EOF
[store]
path = "$TMP/bench.redb"
[[sink]]
name = "$1"
kind = "syslog"
url = "$scheme://127.0.0.1:$SPORT"
stream = "$2"
start = "beginning"
batch_max = $BATCH_MAX
$keys
EOF
    local start
    start="$(date +%s.%N)"
    "$bin" relay --config "$TMP/$1.toml" >"$TMP/$1.relay.log" 2>&1 &
    local rpid=$!
    PIDS+=("$rpid")
    local secs
    secs="$(wait_lines "$SOUT" "$N" "$start")"
    kill -TERM "$rpid" 2>/dev/null || true
    wait "$rpid" 2>/dev/null || true
    local bytes
    bytes="$(head -n 1 "$SOUT" | wc -c)"
    python3 -c "print(f'relay $scheme://${5:-}, $2 stream: $N events in $secs s = {$N / $secs:,.0f} events/s (a message ~$bytes bytes; batch_max $BATCH_MAX, $keys)')"
    ACTUAL_BYTES="$bytes"
}

relay_run effects effects tcp
relay_run audit audit tcp
relay_run audit-relp audit relp
if [ -n "$OLD_BIN" ]; then
    relay_run audit-old audit tcp "$OLD_BIN" " (OLD_BIN: settle_ms after every batch)"
fi

# Baseline: logger sends N lines of the same size over one TCP connection, octet-counted.
start_rsyslog logger
python3 -c "import sys; [print('x' * max(1, $ACTUAL_BYTES - 120)) for _ in range($N)]" >"$TMP/lines.txt"
start="$(date +%s.%N)"
logger --tcp --octet-count -n 127.0.0.1 -P "$SPORT" --rfc5424 -t replay-guard -f "$TMP/lines.txt"
secs="$(wait_lines "$SOUT" "$N" "$start")"
python3 -c "print(f'baseline, logger --tcp --octet-count: $N lines in $secs s = {$N / $secs:,.0f} lines/s')"
