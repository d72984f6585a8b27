#!/usr/bin/env bash
# How `ingest`'s rate and the database's size grow with the work: for each N, a fresh database
# is fed N messages of ~60-byte payloads from 1,000 sources (no replays), and the script prints
# messages/s, file bytes per message (and the bytes the file occupies on disk), and where the
# bytes are (`stats`' table sizes). The issue's goals: the rate at 2M at least 0.8x the rate at 200k, at most 300 bytes per message
# at 1M.
#
# Usage: scripts/bench-growth.sh [N ...]     (defaults 200000 1000000 2000000)
# Env:   RG_BIN=PATH another replay-guard binary (a baseline build in the same session);
#        BENCH_KEEP=1 keeps the temp dir.
set -euo pipefail

cd "$(dirname "$0")/.."
if [ -n "${RG_BIN:-}" ]; then
    BIN="$RG_BIN"
else
    cargo build --release --quiet --bin replay-guard
    BIN="$PWD/target/release/replay-guard"
fi
[ "$#" -gt 0 ] || set -- 200000 1000000 2000000
TMP="$(mktemp -d -t replay-guard-growth.XXXXXX)"
cleanup() { if [ "${BENCH_KEEP:-0}" = "1" ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi; }
trap cleanup EXIT

for N in "$@"; do
    case "$N" in '' | *[!0-9]*) echo "usage: $0 [N ...]" >&2; exit 1 ;; esac
    python3 - "$N" "$TMP/feed.jsonl" <<'PY'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    for i in range(n):
        s = i % 1000
        f.write('{"agency":"a%d","source_id":"u%04d","epoch":1,"sequence":%d,"v":%d}\n'
                % (s % 10, s, i // 1000 + 1, i % 10))
PY
    rm -f "$TMP/db.redb"
    t0=$(date +%s.%N)
    "$BIN" ingest --db "$TMP/db.redb" "$TMP/feed.jsonl" >/dev/null 2>"$TMP/ingest.log" || { cat "$TMP/ingest.log" >&2; exit 2; }
    t1=$(date +%s.%N)
    size=$(stat -c %s "$TMP/db.redb")
    "$BIN" stats --db "$TMP/db.redb" --format json >"$TMP/stats.json"
    # The blocks the file occupies: redb grows the file ahead of use, and the part never
    # written is a hole (no disk blocks) until it is.
    alloc=$(( $(stat -c %b "$TMP/db.redb") * $(stat -c %B "$TMP/db.redb") ))
    python3 - "$N" "$t0" "$t1" "$size" "$alloc" "$TMP/stats.json" <<'PY'
import json, sys
n, t0, t1, size, alloc = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tables = json.load(open(sys.argv[6]))["tables"]
used = sum(t["stored_bytes"] + t["overhead_bytes"] for t in tables)
parts = ", ".join("%s %.0f+%.0f" % (t["name"], t["stored_bytes"] / n, t["overhead_bytes"] / n)
                  for t in tables if t["stored_bytes"])
print("N=%d: %.0f msg/s; bytes/message: file %.0f, allocated on disk %.0f, in tables %.0f "
      "(stored+B-tree overhead: %s)" % (n, n / (t1 - t0), size / n, alloc / n, used / n, parts))
PY
done
