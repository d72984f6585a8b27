#!/usr/bin/env bash
# The relay on each store, same run: a backlog of EFFECTS effects (made by `ingest`) drained by
# one exec sink that discards what it gets (`cat >/dev/null`), so the figure is the relay's own
# cost: reading effects from the store, framing CloudEvents, writing the cursor. Once from a
# redb file, once from a PostgreSQL schema on the local server (127.0.0.1:5432, user postgres,
# trust auth), ROUNDS rounds each. Makes and drops its own database and temp dir.
# Usage: scripts/bench-relay-store.sh [EFFECTS=50000] [ROUNDS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-50000}
rounds=${2:-2}

. scripts/lib/bench.sh rg_bench_relay

backlog_feed "$n" >"$tmp/feed.jsonl"
# Each round drains with a sink of its own name (a new cursor at the log's beginning).
sink() {
    cat <<TOML
[[sink]]
name = "$1"
kind = "exec"
command = ["/bin/sh", "-c", "cat >/dev/null"]
TOML
}
cat >"$tmp/pg-store.toml" <<TOML
[store]
backend = "postgres"
dsn = "host=127.0.0.1 port=5432 user=postgres dbname=$pgdb"
TOML
"$bin" ingest --db "$tmp/rg.redb" "$tmp/feed.jsonl" 2>/dev/null
"$bin" ingest --config "$tmp/pg-store.toml" "$tmp/feed.jsonl" 2>/dev/null
for r in $(seq "$rounds"); do
    sink "drain$r" >"$tmp/redb-$r.toml"
    { cat "$tmp/pg-store.toml"; sink "drain$r"; } >"$tmp/pg-$r.toml"
    echo "== round $r: redb"
    "$drv" drain "$tmp/redb-$r.toml" "$tmp/rg.redb"
    echo "== round $r: PostgreSQL"
    "$drv" drain "$tmp/pg-$r.toml" -
done
