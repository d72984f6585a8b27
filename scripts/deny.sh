#!/usr/bin/env bash
# The dependency tree against deny.toml: bans (duplicate versions, the one TLS stack), licenses,
# sources, and RustSec advisories. The advisory database is fetched from GitHub on every run; if
# that fails the script fails: "ok" must not mean "advisories not checked".
# Not yet part of .ci/run: this CI host cannot reach github.com (the database), and installing
# cargo-deny from source takes ~11 minutes here, over the CI time budget with the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-deny >/dev/null || cargo install --locked cargo-deny --version 0.20.2
deny_start=$SECONDS
cargo deny --locked check bans licenses sources
cargo deny fetch db || {
    echo "deny: cannot fetch the RustSec advisory database (https://github.com/RustSec/advisory-db): advisories NOT checked; fix the network and run again"
    exit 1
}
cargo deny --locked check advisories
echo "deny: cargo deny took $((SECONDS - deny_start)) s"

echo "deny: ok"
