#!/usr/bin/env bash
# The test command: installs what the integration tests need if it is missing (Debian/Ubuntu:
# Mosquitto and its clients, openssl, systemd-analyze), then runs the whole suite.
# Extra arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v mosquitto >/dev/null || missing+=(mosquitto)
command -v mosquitto_pub >/dev/null || missing+=(mosquitto-clients)
command -v openssl >/dev/null || missing+=(openssl)
command -v systemd-analyze >/dev/null || missing+=(systemd)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} for the integration tests" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

exec cargo test --locked --release "$@"
