#!/usr/bin/env bash
# Fuzz smoke: every cargo-fuzz target in fuzz/ for SECONDS (default 60) each, seeded from
# fuzz/regressions/TARGET and a scratch corpus in fuzz/corpus/TARGET (git-ignored). Installs
# cargo-fuzz if missing; needs a nightly toolchain. Not part of CI's time budget.
# Usage: scripts/fuzz-smoke.sh [SECONDS] [TARGET...]
set -euo pipefail

cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(decode config broker_codec records engine)
fi

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz-smoke: needs a nightly toolchain: rustup toolchain install nightly" >&2
    exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz
fi

cargo +nightly fuzz build -O
failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "== $t: ${seconds}s"
    if ! nice -n 10 cargo +nightly fuzz run -O "$t" "corpus/$t" "regressions/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 \
        -rss_limit_mb=2048 -max_len=16384 -timeout=10 2>&1 | tail -n 12; then
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz-smoke: FAILED: ${failed[*]} (crash inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz-smoke: all ${#targets[@]} targets ran ${seconds}s without a finding"
