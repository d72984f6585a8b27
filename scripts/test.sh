#!/usr/bin/env bash
# The test command: installs what the integration tests need if it is missing (Debian/Ubuntu:
# Mosquitto and its clients, openssl, systemd-analyze, python3-fusepy), then runs the whole suite.
# Extra arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v mosquitto >/dev/null || missing+=(mosquitto)
command -v mosquitto_pub >/dev/null || missing+=(mosquitto-clients)
command -v openssl >/dev/null || missing+=(openssl)
command -v systemd-analyze >/dev/null || missing+=(systemd)
# The torture test's fault-injecting file system (FUSE) runs on Debian's Python with fusepy.
/usr/bin/python3 -c 'import fusepy' 2>/dev/null || missing+=(python3-fusepy)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} for the integration tests" >&2
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

exec cargo test --locked --release "$@"
