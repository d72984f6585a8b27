#!/usr/bin/env bash
# The relay's model test (tests/it/relay_model.rs) as a soak, through the release binary,
# against a private Mosquitto and the local PostgreSQL on 127.0.0.1:5432 (as the suite); with
# --topology, the topology model instead (tests/it/topology_model.rs: the verdicts' oracle,
# "green means delivered", against private Mosquittos and an http receiver process).
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
#   --topology   the topology model (its suite: 24 steps; seeds alternate the sinks inside
#                run, odd, and in a relay of their own, even)
#   --bin PATH   the binary the topology model runs (an older build, a build with a fix
#                taken out) instead of this build's
# Examples:
#   scripts/relay-model.sh 20 100                       seeds 1..20, 100 steps each
#   scripts/relay-model.sh --from 1000 --seeds 20 --load
#   scripts/relay-model.sh --seed 90210 --steps 120 --repeat 5 --load
#   scripts/relay-model.sh --topology --seeds 10 --steps 60 --load
#   scripts/relay-model.sh --topology --bin /tmp/rg-da44f94 --seeds 4 --steps 40
set -euo pipefail

cd "$(dirname "$0")/.."
seeds=20
steps=100
from=1
repeat=1
load=""
model=relay
bin=""
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
    --topology) model=topology ;;
    --bin) bin="$(realpath "${2:?--bin PATH}")" && shift ;;
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

if [ "$model" = topology ]; then
    prefix=RG_TOPOLOGY
    filter=topology_model::
else
    prefix=RG_RELAY_MODEL
    filter=relay_model::
    [ -z "$bin" ] || { echo "--bin is for the topology model" >&2 && usage; }
fi

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
echo "$model model soak: seeds $from..$last, $steps steps, $repeat round(s), load: ${load:-none} busy loops on $(nproc) CPUs${bin:+, binary $bin}" >&2
verdicts=()
failed=0
started=$SECONDS
for round in $(seq 1 "$repeat"); do
    for seed in $(seq "$from" "$last"); do
        t0=$SECONDS
        if env "${prefix}_SEED=$seed" "${prefix}_STEPS=$steps" ${bin:+"RG_TOPOLOGY_BIN=$bin"} \
            cargo test --release --locked --test it "$filter" -- --nocapture --test-threads=1; then
            verdict=pass
        else
            verdict=FAIL
            failed=$((failed + 1))
        fi
        verdicts+=("round $round seed $seed: $verdict in $((SECONDS - t0)) s")
    done
done
echo "$model model soak: seeds $from..$last, $steps steps, $repeat round(s), load: ${load:-none}${bin:+, binary $bin}" >&2
printf '  %s\n' "${verdicts[@]}" >&2
echo "$model model soak: ${#verdicts[@]} runs, $failed failed, $((SECONDS - started)) s" >&2
[ "$failed" -eq 0 ]
