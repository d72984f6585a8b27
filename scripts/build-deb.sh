#!/usr/bin/env bash
# Builds the Debian package: the release binary, its man pages (one per command) and shell
# completions generated from the binary itself, the book (docs/, with mdbook, installed if
# missing), then `cargo deb` (installed if missing) with the binary stripped. Prints the
# .deb's path.
#
# Usage: scripts/build-deb.sh [--no-build] [--output PATH]
#   --no-build   package target/release/replay-guard as it is (the tests use this with
#                CARGO_TARGET_DIR pointing at their own temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."
build=1
out=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build="" ;;
        --output) out=(--output "$2"); shift ;;
        *) echo "build-deb.sh: unknown argument $1" >&2; exit 1 ;;
    esac
    shift
done
command -v cargo-deb >/dev/null || cargo install --locked cargo-deb
command -v mdbook >/dev/null || scripts/install-mdbook.sh
target=${CARGO_TARGET_DIR:-target}
[ -z "$build" ] || cargo build --release --locked
bin="$target/release/replay-guard"
assets="$target/release/assets"
rm -rf "$assets"
mkdir -p "$assets/man" "$assets/completions"
"$bin" man --dir "$assets/man"
gzip -9n "$assets"/man/*.1
"$bin" completions bash >"$assets/completions/replay-guard"
"$bin" completions zsh >"$assets/completions/_replay-guard"
"$bin" completions fish >"$assets/completions/replay-guard.fish"
# The book, into the assets (the package's /usr/share/doc/replay-guard/html/), not docs/book.
mdbook build docs --dest-dir "$(realpath "$assets")/book" >/dev/null 2>&1 ||
    { mdbook build docs --dest-dir "$(realpath "$assets")/book"; exit 1; }
cargo deb --no-build --strip --locked "${out[@]}" | tail -n 1
