#!/usr/bin/env bash
# The test command: installs what the integration tests need if it is missing (Debian/Ubuntu:
# Mosquitto and its clients, openssl, systemd-analyze, python3-fusepy, the PostgreSQL client,
# rsyslog with its TLS driver and RELP input;
# cargo-deb, cargo-deny and mdbook from crates.io; Prometheus and node_exporter unpacked under
# target/tools),
# makes sure a PostgreSQL server answers on 127.0.0.1:5432 and that initdb is installed, then
# runs the whole suite.
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
# The postgres sink's tests talk to PostgreSQL with psql.
command -v psql >/dev/null || missing+=(postgresql-client)
# The syslog sink's tests run a real rsyslogd, over TCP and over TLS (its gtls driver), and
# over RELP and RELP over TLS (imrelp).
command -v rsyslogd >/dev/null || [ -x /usr/sbin/rsyslogd ] || missing+=(rsyslog)
dpkg -s rsyslog-gnutls >/dev/null 2>&1 || missing+=(rsyslog-gnutls)
dpkg -s rsyslog-relp >/dev/null 2>&1 || missing+=(rsyslog-relp)
# The report tests render the page in a headless Chromium and read its PDFs with pdfinfo.
command -v chromium >/dev/null || missing+=(chromium)
command -v pdfinfo >/dev/null || missing+=(poppler-utils)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
updated=""
install() {
    echo "installing $* for the integration tests" >&2
    if [ -z "$updated" ]; then
        $sudo apt-get update -qq
        updated=1
    fi
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
if [ ${#missing[@]} -gt 0 ]; then
    install "${missing[@]}"
fi

# The postgres sink's tests need a server on 127.0.0.1:5432 that lets user postgres in without
# a password (each test creates and drops its own database). A server that answers is used as
# it is, whatever its configuration. Otherwise the distribution's cluster is started, and only a
# cluster this script had to create gets the one pg_hba line the tests need.
pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
if ! pg_up; then
    clusters() { command -v pg_lsclusters >/dev/null && pg_lsclusters -h | awk '{print $1 "/" $2}' | sort; }
    before=$(clusters || true)
    command -v pg_lsclusters >/dev/null && [ -n "$(ls /usr/lib/postgresql 2>/dev/null)" ] ||
        install postgresql
    if [ -z "$(clusters || true)" ]; then
        version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
        $sudo pg_createcluster -p 5432 "$version" main >/dev/null
    fi
    created=$(comm -13 <(echo "$before") <(clusters))
    for c in $created; do
        hba="/etc/postgresql/$c/pg_hba.conf"
        echo "PostgreSQL cluster $c was created for the tests: user postgres may connect over" \
            "127.0.0.1 without a password ($hba)" >&2
        $sudo sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
    done
    for c in $(clusters); do
        $sudo pg_ctlcluster "${c%/*}" "${c#*/}" start 2>/dev/null || true
    done
    for c in $created; do
        $sudo pg_ctlcluster "${c%/*}" "${c#*/}" reload 2>/dev/null || true
    done
    for _ in $(seq 1 60); do
        pg_up && break
        sleep 0.5
    done
    pg_up || {
        echo "no PostgreSQL server answers on 127.0.0.1:5432 (the postgres sink's tests need one;" \
            "see pg_lsclusters)" >&2
        exit 1
    }
fi

# The TLS tests (tests/it/pg_tls.rs) start PostgreSQL servers of their own with initdb (the
# server package; checked after the block above, which may already have installed it).
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || install postgresql

# The package test (tests/it/deb.rs) builds the .deb with cargo-deb, from crates.io.
command -v cargo-deb >/dev/null || cargo install --locked --quiet cargo-deb
# The book (docs/): built by .ci/run and by scripts/build-deb.sh for the package test.
command -v mdbook >/dev/null || scripts/install-mdbook.sh

# `.ci/run`'s supply-chain step (scripts/deny.sh) runs cargo-deny, from crates.io (the version
# tried against the offline advisory snapshot).
command -v cargo-deny >/dev/null || cargo install --locked --quiet cargo-deny --version 0.20.2

# The metrics tests (tests/it/metrics.rs) check the output with its real readers: a Prometheus
# server, promtool and node_exporter's textfile collector, from Debian's packages. They are
# unpacked under target/tools, not installed: no service is started or left running.
tools=target/tools
if ! [ -x $tools/usr/bin/prometheus ] || ! [ -x $tools/usr/bin/promtool ] ||
    ! [ -x $tools/usr/bin/prometheus-node-exporter ]; then
    echo "unpacking Prometheus and node_exporter under $tools for the metrics tests" >&2
    rm -rf "$tools" && mkdir -p "$tools/debs"
    fetch() { (cd "$tools/debs" && apt-get download -qq prometheus prometheus-node-exporter 2>/dev/null); }
    fetch || { $sudo apt-get update -qq && fetch; }
    for deb in "$tools"/debs/*.deb; do dpkg-deb -x "$deb" "$tools"; done
fi

exec cargo test --locked --release "$@"
