#!/usr/bin/env bash
# Relay throughput of the http sink: a backlog of N effects, ingested into a fresh database,
# drained by the standalone `replay-guard relay` to a local keep-alive receiver
# (examples/http_receiver.rs: std only, answers 200 to everything). Prints the receiver's
# events/s from its first to its N-th request, and the wall time from starting the relay.
# Baseline in the same run: `ab -k -c 1` POSTing one of those events N times to a fresh
# receiver over one keep-alive connection (the same HTTP work without the database, the
# envelope and the cursor writes).
#
# Usage: scripts/bench-relay-http.sh [N]      (N defaults to 100000)
# Needs: python3 (the feed), ab (apt-get install apache2-utils) for the baseline (skipped with
# a note if missing). Env: BENCH_KEEP=1 keeps the temp dir; BATCH_MAX=n and MAX_IN_FLIGHT=n
# set the sink's batch_max and max_in_flight (defaults 100 and 1, the http sink's defaults);
# DELAY_MS=n holds each of the receiver's answers n ms (a remote receiver's round trip; the
# baseline is then skipped: ab -c 1 would measure only the delay); RG_BIN=path relays with
# another replay-guard binary (an older build, for a comparison in the same session).
set -euo pipefail

N="${1:-100000}"
case "$N" in
'' | *[!0-9]*)
    echo "usage: $0 [N]  (N: number of effects, a positive integer)" >&2
    exit 1
    ;;
esac
BATCH_MAX="${BATCH_MAX:-100}"
MAX_IN_FLIGHT="${MAX_IN_FLIGHT:-1}"

cd "$(dirname "$0")/.."
cargo build --release --bin replay-guard --example http_receiver
BIN="${RG_BIN:-$PWD/target/release/replay-guard}"
RECV="$PWD/target/release/examples/http_receiver"

TMP="$(mktemp -d -t replay-guard-http-bench.XXXXXX)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [ "${BENCH_KEEP:-0}" = "1" ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

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

start_receiver() { # $1: name; sets RPORT and RPID
    rm -f "$TMP/$1.port"
    "$RECV" "$TMP/$1.port" "$N" "$TMP/$1.body" >"$TMP/$1.out" &
    RPID=$!
    PIDS+=("$RPID")
    for _ in $(seq 1 500); do [ -s "$TMP/$1.port" ] && break; sleep 0.01; done
    RPORT="$(cat "$TMP/$1.port")"
}

start_receiver relay
cat >"$TMP/relay.toml" <<TOML
[store]
path = "$TMP/bench.redb"

[[sink]]
name = "bench"
kind = "http"
url = "http://127.0.0.1:$RPORT/events"
batch_max = $BATCH_MAX
max_in_flight = $MAX_IN_FLIGHT
TOML
t0=$(date +%s.%N)
"$BIN" relay --config "$TMP/relay.toml" 2>"$TMP/relay.log" &
RELAY=$!
PIDS+=("$RELAY")
wait "$RPID"
t1=$(date +%s.%N)
kill -TERM "$RELAY"
wait "$RELAY" || { echo "relay exited non-zero; log in $TMP/relay.log" >&2; exit 2; }
echo "relay (http sink, batch_max $BATCH_MAX, max_in_flight $MAX_IN_FLIGHT): $(cat "$TMP/relay.out")"
python3 -c "import sys; n,a,b=int(sys.argv[1]),float(sys.argv[2]),float(sys.argv[3]); print('relay wall from start: %.3f s, %.0f events/s' % (b-a, n/(b-a)))" "$N" "$t0" "$t1"
echo "event body: $(wc -c <"$TMP/relay.body") bytes"

if [ -n "${DELAY_MS:-}" ]; then
    echo "baseline skipped: DELAY_MS is set"
elif command -v ab >/dev/null 2>&1; then
    start_receiver ab
    KEY="\"$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$TMP/relay.body")\""
    ab -q -k -c 1 -n "$N" -p "$TMP/relay.body" -T 'application/cloudevents+json; charset=utf-8' \
        -H "Idempotency-Key: $KEY" "http://127.0.0.1:$RPORT/events" >"$TMP/ab.client" 2>&1 || true
    # A failed ab leaves the receiver short of N requests: stop it rather than wait forever.
    kill "$RPID" 2>/dev/null || true
    wait "$RPID" 2>/dev/null || true
    echo "baseline ab -k -c 1, same body: $(cat "$TMP/ab.out")"
    echo "baseline ab's own figures: $(grep -E 'Requests per second|Failed requests|Keep-Alive requests' "$TMP/ab.client" | tr -s ' ' | paste -sd ';')"
else
    echo "baseline skipped: ab not installed (apt-get install apache2-utils)"
fi
