#!/usr/bin/env bash
# The dependency tree against deny.toml: RustSec advisories, bans (duplicate versions, the one
# TLS stack), licenses and sources, with cargo-deny, offline. The advisory database is a
# snapshot (a git bundle; this machine cannot reach the database's home): $RG_ADVISORY_DB, else
# ../shared/advisory-db/advisory-db.bundle beside the checkout, else
# /work/shared/advisory-db/advisory-db.bundle. Without one the script fails: "ok" must never
# mean "advisories not checked". It prints the snapshot's commit date and age.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.20.2
command -v cargo-deny >/dev/null || cargo install --locked --quiet cargo-deny --version "$version"

bundle=""
for candidate in "${RG_ADVISORY_DB:-}" ../shared/advisory-db/advisory-db.bundle \
    /work/shared/advisory-db/advisory-db.bundle; do
    if [ -n "$candidate" ] && [ -f "$candidate" ]; then
        bundle=$candidate
        break
    fi
done
[ -n "$bundle" ] || {
    echo "deny: no RustSec advisory database snapshot (set RG_ADVISORY_DB to an advisory-db git" \
        "bundle): advisories NOT checked" >&2
    exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# cargo-deny 0.20 names the database's directory after its default URL; --offline stops any
# fetch, so it reads exactly this clone.
db="$work/db/advisory-db-3157b0e258782691"
git -c init.defaultBranch=main clone -q "$bundle" "$db"
committed=$(git -C "$db" log -1 --format=%cs)
age_days=$(((($(date +%s) - $(git -C "$db" log -1 --format=%ct))) / 86400))
# A copy of deny.toml pointing at the clone: the checked-in file names no machine path.
awk -v db="$work/db" '{ print } /^\[advisories\]$/ { print "db-path = \"" db "\"" }' deny.toml \
    >"$work/deny.toml"

cargo fetch --locked --quiet # every target's crates, so --offline metadata works
start=$SECONDS
cargo deny --offline --locked --config "$work/deny.toml" check advisories bans licenses sources
echo "deny: ok: advisories from the RustSec snapshot of $committed ($age_days days old)," \
    "bans, licenses, sources; $((SECONDS - start)) s"
