#!/usr/bin/env bash
# The damage sweep of tests/it/damage.rs at a larger scale: every page of a small database
# zeroed, then TRIALS seeded bit flips, zeroed ranges, garbage and truncations, each run
# through verify, dump-*, stats, gaps, explain, ingest, quarantine discard and compact.
# Fails naming each damaged file that made a command panic, die of a signal, print more than
# one error line, or exit otherwise than 0 / 2 "database damaged" (verify: also 4).
#
# Usage: scripts/damage-sweep.sh [TRIALS] [SEED]   (defaults: 1000 trials, a random seed,
#        printed in the summary line so a failure can be replayed)
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS="${1:-1000}"
SEED="${2:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}"
case "$TRIALS$SEED" in
*[!0-9]*)
    echo "usage: $0 [TRIALS] [SEED]  (positive integers)" >&2
    exit 1
    ;;
esac
echo "damage sweep: $TRIALS seeded trials, seed $SEED" >&2
DAMAGE_TRIALS="$TRIALS" DAMAGE_SEED="$SEED" exec nice -n 10 cargo test --release --test it -- \
    damage::no_damaged_page_or_random_corruption_panics_any_command --nocapture
