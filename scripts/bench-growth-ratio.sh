#!/usr/bin/env bash
# The growth goal's ratio, measured the way a noisy shared machine allows: ROUNDS rounds of
# `scripts/bench-growth.sh 200000 2000000` (a fresh database each, ~60-byte payloads from
# 1,000 sources), and with RG_BIN a baseline binary run before this tree's build in every
# round, so both see the same minutes of the machine. Prints each round's rates and the
# ratio of the 2,000,000-message rate to the 200,000-message one (the issue's goal: at least
# 0.8), then each binary's medians.
#
# Usage: scripts/bench-growth-ratio.sh [ROUNDS]     (defaults to 3)
# Env:   RG_BIN=PATH  a baseline replay-guard binary (e.g. the previous commit's build)
set -euo pipefail

ROUNDS="${1:-3}"
case "$ROUNDS" in
'' | *[!0-9]* | 0)
    echo "usage: $0 [ROUNDS]  (a positive integer)" >&2
    exit 1
    ;;
esac
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin replay-guard
NEW="$PWD/target/release/replay-guard"
BINS=()
[ -n "${RG_BIN:-}" ] && BINS+=("$RG_BIN")
BINS+=("$NEW")

OUT="$(mktemp -t replay-guard-growth-ratio.XXXXXX)"
trap 'rm -f "$OUT"' EXIT
for round in $(seq 1 "$ROUNDS"); do
    for bin in "${BINS[@]}"; do
        rates=$(RG_BIN="$bin" scripts/bench-growth.sh 200000 2000000 |
            sed -n 's/^N=\([0-9]*\): \([0-9]*\) msg\/s.*/\2/p' | tr '\n' ' ')
        echo "$round $bin $rates" | tee -a "$OUT"
    done
done
python3 - "$OUT" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    _, bin, small, large = line.split()
    runs.setdefault(bin, []).append((int(small), int(large)))
for bin, rs in runs.items():
    ratios = [large / small for small, large in rs]
    print("%s: rounds %s; median 200k %.0f msg/s, 2M %.0f msg/s, ratio %.2f" % (
        bin, " / ".join("%.2f" % r for r in ratios),
        statistics.median(s for s, _ in rs), statistics.median(l for _, l in rs),
        statistics.median(ratios)))
PY
