#!/usr/bin/env bash
# `report` on a large database: builds the release binary, makes an N-message database with
# scripts/bench-ingest.sh (its feed: ~200-byte messages, 50 sources, 10% replays), then runs
# `verify`, `report --format html` and `report --format json` on it under /usr/bin/time -v
# and prints wall time, peak RSS and the output's size for each. `report` is verify's pass
# plus one pass over the audit log: its time should be about verify's plus a dump-audit's,
# and its memory verify's (the audit pass keeps counters, ranges and capped lists only).
#
# Usage: scripts/bench-report.sh [N]          (N defaults to 1000000)
# Env:   BENCH_KEEP=1  keep the temp dir (feed, database, reports) and print its path.
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

cd "$(dirname "$0")/.."
cargo build --release
BIN="$PWD/target/release/replay-guard"

# bench-ingest.sh keeps its temp dir with BENCH_KEEP=1 and names it on stderr.
echo "building a $N-message database with scripts/bench-ingest.sh ..." >&2
KEPT="$(BENCH_KEEP=1 scripts/bench-ingest.sh "$N" 2>&1 >/dev/null | sed -n 's/^kept //p')"
if [ -z "$KEPT" ] || [ ! -f "$KEPT/bench.redb" ]; then
    echo "scripts/bench-ingest.sh did not leave a database" >&2
    exit 2
fi
if [ "${BENCH_KEEP:-0}" = "1" ]; then
    trap 'echo "kept $KEPT" >&2' EXIT
else
    trap 'rm -rf "$KEPT"' EXIT
fi
DB="$KEPT/bench.redb"
rm -f "$KEPT/feed.jsonl"

measure() {
    local name="$1" out="$2"
    shift 2
    /usr/bin/time -v -o "$KEPT/$name.time" "$BIN" "$@" >/dev/null 2>"$KEPT/$name.log"
    local wall rss size
    wall=$(awk -F': ' '/Elapsed \(wall clock\) time/ {
        n = split($2, p, ":"); s = 0
        for (i = 1; i <= n; i++) s = s * 60 + p[i]
        print s }' "$KEPT/$name.time")
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$KEPT/$name.time")
    size=0
    if [ -n "$out" ]; then size=$(stat -c %s "$out"); fi
    awk -v name="$name" -v wall="$wall" -v rss="$rss" -v size="$size" 'BEGIN {
        printf "%-14s wall %6.2f s   peak RSS %6.1f MiB   output %7.1f KiB\n",
            name, wall, rss / 1024, size / 1024 }'
}

echo "database: $N messages, $(stat -c %s "$DB") bytes" >&2
measure verify "" verify --db "$DB"
measure dump-audit "" dump-audit --db "$DB"
measure report-html "$KEPT/report.html" report --db "$DB" -o "$KEPT/report.html"
measure report-json "$KEPT/report.json" report --db "$DB" --format json -o "$KEPT/report.json"
