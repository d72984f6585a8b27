#!/usr/bin/env bash
# The PostgreSQL store against the redb file, same machine, same run: examples/store_bench
# commits N messages (10% exact replays) in batches of B through `Store::commit_batch` with
# (a) one redb file, (b) one PostgreSQL member, (c) three members sharing one schema,
# interleaved ROUNDS times; prints msg/s and commit p50/p99 for each.
#
# Usage: scripts/bench-pg.sh [N] [B] [ROUNDS]       (defaults 30000, 64, 3)
# Needs: the local PostgreSQL on 127.0.0.1:5432 (trust, user postgres; scripts/test.sh starts
# one). Creates and drops its own database, rg_bench_PID; touches no other.
set -euo pipefail
N="${1:-30000}"
B="${2:-64}"
ROUNDS="${3:-3}"
cd "$(dirname "$0")/.."
cargo build --release --example store_bench >&2
BENCH="$PWD/target/release/examples/store_bench"
DB="rg_bench_$$"
TMP="$(mktemp -d -t replay-guard-bench-pg.XXXXXX)"
PSQL=(psql -h 127.0.0.1 -p 5432 -U postgres -X -q -v ON_ERROR_STOP=1)
cleanup() {
    "${PSQL[@]}" -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$TMP"
}
trap cleanup EXIT
"${PSQL[@]}" -d postgres -c "CREATE DATABASE $DB"
DSN="host=127.0.0.1 port=5432 user=postgres dbname=$DB"
echo "N=$N messages, batches of $B, $ROUNDS rounds"
for r in $(seq 1 "$ROUNDS"); do
    echo "round $r:"
    "$BENCH" redb "$TMP/r$r.redb" "$N" "$B"
    "$BENCH" pg "$DSN" "one_$r" 1 "$N" "$B"
    "$BENCH" pg "$DSN" "three_$r" 3 "$N" "$B"
done
