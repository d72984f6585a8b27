#!/usr/bin/env bash
# CPU cost of `replay-guard ingest`, counted: builds the release binary, generates the
# bench-ingest feed of N messages (scripts/lib/ingest_feed.py: ~200-byte messages, 10% replays,
# 50 sources), runs `ingest` of it into a fresh database under `valgrind --tool=callgrind`
# (every thread counted), and prints the total instructions and instructions per message.
# Instruction counts barely vary between runs, unlike wall time, so they compare two builds
# on a busy machine. Valgrind hides the CPU's SHA extensions (sha2 falls back to its portable
# code under it, about 3,300 instructions a 64-byte block): compare binaries measured by this
# script with each other, not with perf; the SHA-256 share is printed apart.
#
# Usage: scripts/bench-callgrind.sh [N]       (N defaults to 20000)
# Env:   RG_BIN=PATH    measure that binary instead of building this tree's
#                       (e.g. RG_BIN=/tmp/rg-old/replay-guard for a baseline).
#        BENCH_KEEP=1   keep the temp dir (feed, database, callgrind.out) and print its path,
#                       for `callgrind_annotate DIR/callgrind.out`.
set -euo pipefail

N="${1:-20000}"
case "$N" in
'' | *[!0-9]* | 0)
    echo "usage: $0 [N]  (N: number of messages, a positive integer)" >&2
    exit 1
    ;;
esac
for tool in valgrind python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "$tool not found (apt-get install -y valgrind python3)" >&2
        exit 1
    fi
done

cd "$(dirname "$0")/.."
if [ -n "${RG_BIN:-}" ]; then
    BIN="$RG_BIN"
else
    cargo build --release --quiet
    BIN="$PWD/target/release/replay-guard"
fi

TMP="$(mktemp -d -t replay-guard-callgrind.XXXXXX)"
if [ "${BENCH_KEEP:-0}" = "1" ]; then
    trap 'echo "kept $TMP" >&2' EXIT
else
    trap 'rm -rf "$TMP"' EXIT
fi
FEED="$TMP/feed.jsonl"
python3 scripts/lib/ingest_feed.py "$N" "$FEED"

OUT="$TMP/callgrind.out"
echo "running: valgrind --tool=callgrind $BIN ingest --db $TMP/bench.redb $FEED" >&2
valgrind --tool=callgrind --callgrind-out-file="$OUT" \
    "$BIN" ingest --db "$TMP/bench.redb" "$FEED" 2>"$TMP/valgrind.log" || {
    cat "$TMP/valgrind.log" >&2
    exit 1
}
grep -v '^==' "$TMP/valgrind.log" >&2 || true

# The `summary:` line holds the total of the default event, instructions (Ir).
IR=$(awk '/^summary:/ {print $2}' "$OUT")
if [ -z "$IR" ]; then
    echo "no summary line in $OUT" >&2
    exit 1
fi
# SHA-256's block function (the key, the digest, the audit chain: a fixed number of blocks per
# message, which the formats set) apart from the rest: natively it runs on the SHA extensions.
SHA=$(callgrind_annotate --inclusive=no --auto=no --threshold=100 "$OUT" 2>/dev/null |
    awk '/^ *[0-9,]+ +\(.*:sha2::sha256::[a-z_:]*compress/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')
awk -v n="$N" -v ir="$IR" -v sha="$SHA" -v bin="$BIN" 'BEGIN {
    printf "binary            %s\n", bin
    printf "messages          %d\n", n
    printf "instructions      %d\n", ir
    printf "instructions/msg  %.0f (SHA-256 compress %.0f, the rest %.0f)\n", ir / n, sha / n, (ir - sha) / n
}'
