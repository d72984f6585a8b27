#!/usr/bin/env bash
# The postgres sink against the local PostgreSQL (127.0.0.1:5432, user postgres, trust auth):
#   1. drain: a backlog of EFFECTS effects (made by `ingest`) delivered by the relay, events/s;
#   2. two baselines on the same rows, same run: psql \copy (PostgreSQL's bulk path) and one
#      autocommit INSERT per row through psql (a naive relay);
#   3. steady: RATE msg/s for SECONDS committed through the engine with the relay in the same
#      process; latency from the redb commit to the sink's PostgreSQL transaction start
#      (inserted_at = now()) and to the row being visible to another session (a watcher polls
#      the cursor row, committed with the rows), p50/p99/max.
# Makes and drops its own database and temp dir.
# Usage: scripts/bench-relay-pg.sh [EFFECTS=100000] [RATE=1000] [SECONDS=30]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
rate=${2:-1000}
secs=${3:-30}

. scripts/lib/bench.sh rg_bench
now() { date +%s.%N; }
rate_of() { python3 -c "import sys; n,a,b=int(sys.argv[1]),float(sys.argv[2]),float(sys.argv[3]); print(f'{n} rows in {b-a:.2f} s: {n/(b-a):.0f} rows/s')" "$@"; }

backlog_feed "$n" >"$tmp/feed.jsonl"
sink() {
    cat <<EOF
[[sink]]
name = "$1"
kind = "postgres"
dsn = "host=127.0.0.1 port=5432 user=postgres dbname=$pgdb"
table = "$2"
EOF
}
sink bench events >"$tmp/drain.toml"
sink steady events_steady >"$tmp/steady.toml"

"$bin" ingest --db "$tmp/drain.redb" "$tmp/feed.jsonl" 2>/dev/null
echo "== drain: $n effects, batch_max 500 (default)"
"$drv" drain "$tmp/drain.toml" "$tmp/drain.redb"
psql_ -d "$pgdb" -At -c "SELECT 'rows: ' || count(*) || ', distinct ids: ' || count(DISTINCT id) FROM events"

cols="id, effect_offset, source, agency, source_id, topic, event, received_at"
psql_ -d "$pgdb" -c "\\copy (SELECT $cols FROM events ORDER BY effect_offset) TO '$tmp/rows.csv' CSV"
psql_ -d "$pgdb" -c "CREATE TABLE events_copy (LIKE events INCLUDING ALL); CREATE TABLE events_naive (LIKE events INCLUDING ALL)"
echo "== baseline: psql \\copy of the same rows into an empty table of the same shape"
a=$(now)
psql_ -d "$pgdb" -c "\\copy events_copy ($cols) FROM '$tmp/rows.csv' CSV"
b=$(now)
rate_of "$n" "$a" "$b"
echo "== baseline: one autocommit INSERT ... ON CONFLICT DO NOTHING per row, through psql"
psql_ -d "$pgdb" -At -c "SELECT format('INSERT INTO events_naive ($cols) VALUES (%L, %s, %L, %L, %L, %L, %L::jsonb, %L) ON CONFLICT (id) DO NOTHING;', $cols) FROM events ORDER BY effect_offset" >"$tmp/inserts.sql"
a=$(now)
psql_ -d "$pgdb" -f "$tmp/inserts.sql" >/dev/null
b=$(now)
rate_of "$n" "$a" "$b"

echo "== steady: $rate msg/s for $secs s, relay in the same process (woken by each commit)"
# A watcher on its own connection polls the sink's cursor row (committed with the rows) and
# notes when each position became visible: commit -> visible, COMMIT included (resolution: one
# poll, about 0.5 ms).
total=$(python3 -c "print(int($rate * $secs) + 1)")  # and the warm-up message
python3 - "$pgdb" "$total" >"$tmp/seen.tsv" <<'EOF' &
import subprocess, sys, time
p = subprocess.Popen(["psql", "-h", "127.0.0.1", "-p", "5432", "-U", "postgres", "-d", sys.argv[1],
                      "-X", "-A", "-t", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     text=True, bufsize=1)
total, last = int(sys.argv[2]), -1
while last < total:
    p.stdin.write("SELECT coalesce(max(next_offset), 0) FROM replay_guard_sink_cursors "
                  "WHERE sink = 'steady';\n")
    p.stdin.flush()
    n = int(p.stdout.readline())
    if n != last:
        print(f"{n}\t{time.time() * 1000:.3f}", flush=True)
        last = n
EOF
watcher=$!
until [ -s "$tmp/seen.tsv" ]; do sleep 0.1; done
"$drv" steady "$tmp/steady.toml" "$tmp/steady.redb" "$rate" "$secs" "$tmp/commits.tsv"
wait "$watcher"
psql_ -d "$pgdb" -At -F $'\t' -c "SELECT effect_offset, extract(epoch FROM inserted_at) * 1000 FROM events_steady" >"$tmp/rows.tsv"
python3 - "$tmp/commits.tsv" "$tmp/rows.tsv" "$tmp/seen.tsv" <<'EOF'
import bisect, sys
def tsv(path): return [l.split('\t') for l in open(path).read().split('\n') if l]
commit = {int(o): float(t) for o, t in tsv(sys.argv[1])}
def report(what, lat):
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    print(f"{what}: {len(lat)} events, p50 {q(0.5):.1f} ms, p99 {q(0.99):.1f} ms, max {lat[-1]:.1f} ms")
report("commit -> the sink's transaction start (inserted_at)",
       [float(t) - commit[int(o)] for o, t in tsv(sys.argv[2]) if int(o) in commit])
seen = [(int(n), float(t)) for n, t in tsv(sys.argv[3])]
nexts = [n for n, _ in seen]
# Offset o is visible from the first sample whose cursor is past it.
report("commit -> row visible to another session (COMMIT included)",
       [seen[bisect.bisect_right(nexts, o)][1] - t for o, t in commit.items()])
EOF
