#!/usr/bin/env bash
# The README's picture of the after-action report: runs `demo` into a temp dir, makes the
# report of its database and renders it in headless Chromium to docs/img/demo-report.png
# (1200x1600, the first screen and the timeline; kept under 400 KB).
#
# Usage: scripts/report-screenshot.sh
# Needs: chromium (apt-get install chromium).
set -euo pipefail

if ! command -v chromium >/dev/null 2>&1; then
    echo "chromium not found: install it with 'apt-get install -y chromium' (scripts/test.sh does)" >&2
    exit 1
fi
cd "$(dirname "$0")/.."
cargo build --release --quiet
BIN="$PWD/target/release/replay-guard"
TMP="$(mktemp -d -t replay-guard-report.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT

"$BIN" demo --db "$TMP/demo.redb" >"$TMP/demo.log"
"$BIN" report --db "$TMP/demo.redb" -o "$TMP/report.html"
# The temp path is of no interest in the picture.
sed -i "s|$TMP/||g" "$TMP/report.html"
mkdir -p docs/img
timeout 120 chromium --headless --disable-gpu --no-sandbox --hide-scrollbars \
    --user-data-dir="$TMP/chromium" --window-size=1200,1600 \
    --screenshot="$TMP/report.png" "file://$TMP/report.html" 2>"$TMP/chromium.log"
size=$(stat -c %s "$TMP/report.png")
if [ "$size" -ge 409600 ]; then
    echo "the screenshot is $size bytes, over 400 KB" >&2
    exit 1
fi
cp "$TMP/report.png" docs/img/demo-report.png
echo "docs/img/demo-report.png: $size bytes"
