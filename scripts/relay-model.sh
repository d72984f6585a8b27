#!/usr/bin/env bash
# The relay's model test (tests/it/relay_model.rs) as a soak: seeds 1..SEEDS (default 20) of
# STEPS random steps each (default 100) through the release binary, against a private
# Mosquitto and the local PostgreSQL on 127.0.0.1:5432 (as the suite). Prints one line of
# figures per seed and the total; a failing seed prints its step log and how to replay it
# (RG_RELAY_MODEL_SEED=N), and keeps its files under /tmp/rg-relay-model-*.
# Usage: scripts/relay-model.sh [SEEDS] [STEPS]
set -euo pipefail

cd "$(dirname "$0")/.."
seeds="${1:-20}"
steps="${2:-100}"
RG_RELAY_MODEL_SEEDS="$seeds" RG_RELAY_MODEL_STEPS="$steps" \
    cargo test --release --locked --test it relay_model:: -- --nocapture --test-threads=1
