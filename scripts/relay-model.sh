#!/usr/bin/env bash
# The relay's model test (tests/it/relay_model.rs) as a soak, through the release binary,
# against a private Mosquitto and the local PostgreSQL on 127.0.0.1:5432 (as the suite).
# Each seed runs on its own (RG_RELAY_MODEL_SEED=N) and prints one line of figures; a failing
# seed prints its step log and how to replay it, keeps its files under /tmp/rg-relay-model-*,
# and the soak goes on with the next seed. The end prints each seed's verdict and seconds,
# the totals, and exits 1 if any seed failed.
#
# Timing is part of the input (a relay races the operator's commands): a seed that passes on
# an idle machine can fail with the CPUs busy, so a soak runs seeds beyond the suite's and
# with the CPUs loaded.
#
# Usage: scripts/relay-model.sh [options] [SEEDS [STEPS]]
#   --seeds N    how many seeds (default 20)
#   --steps S    random steps per seed (default 100)
#   --from N     the first seed (default 1): seeds N .. N+SEEDS-1
#   --random     the first seed drawn at random (printed, to replay)
#   --seed N     this one seed (same as --from N --seeds 1)
#   --repeat R   run the whole list R times (default 1): the same seed under other timings
#   --load       one busy loop per CPU beside the soak (--load=N: N loops), ended on exit
# Examples:
#   scripts/relay-model.sh 20 100                       seeds 1..20, 100 steps each
#   scripts/relay-model.sh --from 1000 --seeds 20 --load
#   scripts/relay-model.sh --seed 90210 --steps 120 --repeat 5 --load
set -euo pipefail

cd "$(dirname "$0")/.."
seeds=20
steps=100
from=1
repeat=1
load=""
positional=()
usage() {
    sed -n '/^# Usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 1
}
while [ $# -gt 0 ]; do
    case "$1" in
    --seeds) seeds="${2:?--seeds N}" && shift ;;
    --steps) steps="${2:?--steps S}" && shift ;;
    --from) from="${2:?--from N}" && shift ;;
    --seed) from="${2:?--seed N}" && seeds=1 && shift ;;
    --random) from=$((RANDOM * 32768 + RANDOM + 21)) ;;
    --repeat) repeat="${2:?--repeat R}" && shift ;;
    --load) load="$(nproc)" ;;
    --load=*) load="${1#--load=}" ;;
    -h | --help) usage ;;
    -*) echo "unknown option $1" >&2 && usage ;;
    *) positional+=("$1") ;;
    esac
    shift
done
[ ${#positional[@]} -gt 0 ] && seeds="${positional[0]}"
[ ${#positional[@]} -gt 1 ] && steps="${positional[1]}"
[ ${#positional[@]} -gt 2 ] && usage
for n in "$seeds" "$steps" "$from" "$repeat" ${load:+"$load"}; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "not a number: $n" >&2 && usage; }
done

# Built once, before any load starts.
cargo test --release --locked --test it --no-run

busy=()
stop_load() {
    for pid in "${busy[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${busy[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    busy=()
}
trap stop_load EXIT
trap 'exit 130' INT TERM
if [ -n "$load" ]; then
    for _ in $(seq 1 "$load"); do
        (while :; do :; done) &
        busy+=("$!")
    done
fi

last=$((from + seeds - 1))
echo "relay model soak: seeds $from..$last, $steps steps, $repeat round(s), load: ${load:-none} busy loops on $(nproc) CPUs" >&2
verdicts=()
failed=0
started=$SECONDS
for round in $(seq 1 "$repeat"); do
    for seed in $(seq "$from" "$last"); do
        t0=$SECONDS
        if RG_RELAY_MODEL_SEED="$seed" RG_RELAY_MODEL_STEPS="$steps" \
            cargo test --release --locked --test it relay_model:: -- --nocapture --test-threads=1; then
            verdict=pass
        else
            verdict=FAIL
            failed=$((failed + 1))
        fi
        verdicts+=("round $round seed $seed: $verdict in $((SECONDS - t0)) s")
    done
done
echo "relay model soak: seeds $from..$last, $steps steps, $repeat round(s), load: ${load:-none}" >&2
printf '  %s\n' "${verdicts[@]}" >&2
echo "relay model soak: ${#verdicts[@]} runs, $failed failed, $((SECONDS - started)) s" >&2
[ "$failed" -eq 0 ]
