# Sourced by the relay benchmarks (scripts/bench-relay-*.sh) from the repository root, as
# `. scripts/lib/bench.sh DBPREFIX`: builds the binary and the relay_drain example (bin, drv),
# makes a temp dir (tmp) and a database (pgdb, DBPREFIX_PID) on the local PostgreSQL
# (127.0.0.1:5432, user postgres, trust auth), both removed when the script exits; psql_ runs
# psql on that server, backlog_feed N prints N feed lines (16 sources, typical update size).

cargo build --release --quiet --example relay_drain --bin replay-guard
bin=target/release/replay-guard
drv=target/release/examples/relay_drain
tmp=$(mktemp -d)
pgdb="${1:?usage: . scripts/lib/bench.sh DBPREFIX}_$$"
psql_() { psql -h 127.0.0.1 -p 5432 -U postgres -X -q -v ON_ERROR_STOP=1 "$@"; }
cleanup() {
    psql_ -d postgres -c "DROP DATABASE IF EXISTS $pgdb WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$tmp"
}
trap cleanup EXIT
psql_ -d postgres -c "CREATE DATABASE $pgdb"

backlog_feed() {
    python3 - "$1" <<'PY'
import sys
n = int(sys.argv[1])
for i in range(n):
    print('{"agency":"BENCH","source_id":"S%d","epoch":1,"sequence":%d,"type":"dispatch",'
          '"incident":{"id":"INC-%d","units":[%d,%d]},"body":"backlog message %d, padded to '
          'a typical incident update size with some free text"}'
          % (i % 16, i // 16 + 1, i // 7, i % 97, i % 89, i))
PY
}
