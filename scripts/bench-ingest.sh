#!/usr/bin/env bash
# End-to-end ingest benchmark: builds the release binary, generates a feed of N ~200-byte
# feed-contract messages (10% replays = exact resends of earlier lines, 50 sources), runs
# `replay-guard ingest` on a fresh database under /usr/bin/time -v, and prints wall time,
# messages/s, peak RSS, database file size, bytes per message and bytes written to disk.
#
# Usage: scripts/bench-ingest.sh [N]          (N defaults to 1000000)
# Env:   BENCH_KEEP=1  keep the temp dir (feed, database, logs) and print its path.
#        BENCH_CONFIG=FILE  pass --config FILE to ingest (default: built-in defaults,
#                           i.e. 64 MiB cache, window 600 s / 1,000,000 entries, batch 512).
#        RG_BIN=PATH  run that binary instead of building this tree's (compare two builds
#                     in one session, alternating).
set -euo pipefail

N="${1:-1000000}"
case "$N" in
'' | *[!0-9]*)
    echo "usage: $0 [N]  (N: number of messages, a positive integer)" >&2
    exit 1
    ;;
esac

if ! command -v /usr/bin/time >/dev/null 2>&1; then
    echo "/usr/bin/time not found: install it with 'apt-get install -y time'" >&2
    exit 1
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 not found (needed to generate the feed)" >&2
    exit 1
fi

cd "$(dirname "$0")/.."
if [ -n "${RG_BIN:-}" ]; then
    BIN="$RG_BIN"
else
    cargo build --release
    BIN="$PWD/target/release/replay-guard"
fi

TMP="$(mktemp -d -t replay-guard-bench.XXXXXX)"
if [ "${BENCH_KEEP:-0}" = "1" ]; then
    trap 'echo "kept $TMP" >&2' EXIT
else
    trap 'rm -rf "$TMP"' EXIT
fi
FEED="$TMP/feed.jsonl"
DB="$TMP/bench.redb"

echo "generating $N messages into $FEED ..." >&2
python3 scripts/lib/ingest_feed.py "$N" "$FEED"

FEED_BYTES=$(stat -c %s "$FEED")
ARGS=(ingest --db "$DB")
if [ -n "${BENCH_CONFIG:-}" ]; then
    ARGS+=(--config "$BENCH_CONFIG")
fi
ARGS+=("$FEED")

echo "running: /usr/bin/time -v $BIN ${ARGS[*]}" >&2
/usr/bin/time -v -o "$TMP/time.txt" "$BIN" "${ARGS[@]}" 2>"$TMP/ingest.log"
cat "$TMP/ingest.log" >&2

DB_BYTES=$(stat -c %s "$DB")
WALL=$(awk -F': ' '/Elapsed \(wall clock\) time/ {
    n = split($2, p, ":"); s = 0
    for (i = 1; i <= n; i++) s = s * 60 + p[i]
    print s }' "$TMP/time.txt")
RSS_KB=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$TMP/time.txt")
USER_S=$(awk -F': ' '/User time \(seconds\)/ {print $2}' "$TMP/time.txt")
SYS_S=$(awk -F': ' '/System time \(seconds\)/ {print $2}' "$TMP/time.txt")
CPU=$(awk -F': ' '/Percent of CPU this job got/ {print $2}' "$TMP/time.txt")
# "File system outputs" counts 512-byte blocks the process caused to be written to disk.
OUT_BLOCKS=$(awk -F': ' '/File system outputs/ {print $2}' "$TMP/time.txt")

awk -v n="$N" -v wall="$WALL" -v rss="$RSS_KB" -v db="$DB_BYTES" -v feed="$FEED_BYTES" \
    -v user="$USER_S" -v sys="$SYS_S" -v cpu="$CPU" -v out="$OUT_BLOCKS" 'BEGIN {
    printf "messages          %d (feed %.1f MiB, %.1f bytes/line incl. newline)\n", n, feed / 1048576, feed / n
    printf "wall time         %.2f s (user %.2f s, sys %.2f s, CPU %s)\n", wall, user, sys, cpu
    printf "throughput        %.0f messages/s\n", (wall > 0 ? n / wall : 0)
    printf "peak RSS          %.1f MiB (%d KiB)\n", rss / 1024, rss
    printf "database file     %.1f MiB (%d bytes)\n", db / 1048576, db
    printf "bytes/message     %.0f (database file size / messages)\n", db / n
    printf "disk writes       %.1f MiB (%.0f bytes/message)\n", out * 512 / 1048576, out * 512 / n
}'
