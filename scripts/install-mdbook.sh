#!/usr/bin/env bash
# Installs mdbook (the book under docs/) from crates.io with `cargo install --locked`, at the
# version the book is built and tested with: 0.5.4 builds with rustc 1.88 and newer. Only the
# `search` feature: `serve` and `watch` (a web server, a file watcher) are not needed to build.
set -euo pipefail
exec cargo install --locked --quiet mdbook --version 0.5.4 --no-default-features --features search
