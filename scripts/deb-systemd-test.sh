#!/usr/bin/env bash
# The .deb in a real systemd: boots a Debian bookworm root (debootstrap, cached) with systemd
# as PID 1 in systemd-nspawn, installs the package as an operator would (`apt install`), then
# `systemctl enable --now`, and checks what the README promises: nothing starts before the
# config is edited, the unit comes up `Type=notify` with its STATUS and watchdog under its
# hardening, a redelivered message is suppressed, a config error stops the unit instead of
# restarting it, an upgrade restarts it, the standalone relay unit runs beside it (the same
# database and dynamic user) and delivers through an exec sink, removal stops both, and the
# store verifies. Prints one line per check; exits non-zero at the first failed one.
#
# Usage: scripts/deb-systemd-test.sh PATH/TO/replay-guard_*.deb
# Env: ROOTFS (the cached root, default ${TMPDIR:-/tmp}/replay-guard-bookworm-root, made on the
# first run: about 35 s and 250 MB, from Debian's mirror). Needs root, debootstrap and
# systemd-container (installed with --no-install-recommends if missing: the recommended
# libnss-mymachines would edit the host's nsswitch.conf). The container has its own network
# namespace (its own loopback and Mosquitto) and a throwaway overlay: the cached root is never
# changed, and nothing of the host's is touched.
set -euo pipefail
deb=$(readlink -f "${1:?usage: $0 PATH/TO/replay-guard_*.deb}")
rootfs=${ROOTFS:-${TMPDIR:-/tmp}/replay-guard-bookworm-root}
name=rgdeb$$
t0=$(date +%s%N)
say() { printf '%6.1fs %s\n' "$(( ($(date +%s%N) - t0) / 100000000 ))e-1" "$*"; }
fail() { say "FAIL: $*"; exit 1; }

if ! command -v systemd-nspawn >/dev/null || ! command -v debootstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        debootstrap systemd-container >/dev/null
fi
if [ ! -x "$rootfs/lib/systemd/systemd" ]; then
    say "making the bookworm root in $rootfs (once)"
    rm -rf "$rootfs.partial"
    debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,mosquitto,mosquitto-clients,man-db \
        bookworm "$rootfs.partial" >/dev/null
    mv "$rootfs.partial" "$rootfs"
fi

console=$(mktemp -t replay-guard-nspawn.XXXXXX)
# The host's PID 1 need not be systemd: no machined, so --register=no --keep-unit.
setsid systemd-nspawn -D "$rootfs" -b -M "$name" --register=no --keep-unit --private-network \
    --volatile=overlay --console=passive >"$console" 2>&1 &
nspawn=$!
cleanup() {
    if kill -0 "$nspawn" 2>/dev/null; then
        kill -TERM "$nspawn"
        for _ in $(seq 100); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$nspawn" 2>/dev/null && kill -KILL "$nspawn"
    fi
    wait "$nspawn" 2>/dev/null || true
    rm -f "$console"
}
trap cleanup EXIT
leader=
for _ in $(seq 200); do
    leader=$(pgrep -P "$nspawn" -x systemd || true)
    [ -n "$leader" ] && break
    sleep 0.05
done
[ -n "$leader" ] || { cat "$console"; fail "the container's systemd did not start"; }
ct() { nsenter -t "$leader" -m -u -i -n -p -- "$@"; }
for _ in $(seq 200); do
    state=$(ct systemctl is-system-running 2>/dev/null || true)
    case "$state" in running | degraded) break ;; esac
    sleep 0.1
done
say "booted: $(ct systemctl is-system-running || true), $(ct systemctl --version | head -n 1)"
ct systemctl is-active --quiet mosquitto || fail "the container's mosquitto is not running"

ct sh -c 'cat > /tmp/replay-guard.deb' <"$deb"
ct env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /tmp/replay-guard.deb >/dev/null 2>&1 ||
    ct dpkg -i /tmp/replay-guard.deb >/dev/null
say "installed $(ct dpkg-query -W -f '${Package} ${Version}' replay-guard)"
for unit in replay-guard replay-guard-relay; do
    [ "$(ct systemctl is-enabled $unit 2>/dev/null || true)" = disabled ] ||
        fail "a first install enabled $unit"
    ct systemctl is-active --quiet $unit && fail "a first install started $unit"
done
say "ok: neither unit enabled nor started before the config is edited"
ct man -w replay-guard-run >/dev/null || fail "man replay-guard-run finds no page"
say "ok: man replay-guard-run"

# The example config already names the container's broker (mqtt://127.0.0.1:1883, incidents/#);
# the one edit: turn the metrics on by uncommenting its two lines, as the README says.
ct sed -i -e 's/^# \[metrics\]$/[metrics]/' -e 's/^# listen = "127.0.0.1:9464"$/listen = "127.0.0.1:9464"/' \
    /etc/replay-guard/replay-guard.toml
# (grep reads here-strings, not pipes: with pipefail, `grep -q` leaving a pipe early can fail
# the writer with SIGPIPE, and so the check, though the line was there.)
grep -q 'metrics http://127.0.0.1:9464/metrics' <<<"$(ct replay-guard check-config /etc/replay-guard/replay-guard.toml)" ||
    fail "the example config's [metrics] lines do not turn the endpoint on"
ct systemctl enable --now replay-guard >/dev/null 2>&1
for _ in $(seq 100); do
    ct systemctl is-active --quiet replay-guard && break
    sleep 0.1
done
ct systemctl is-active --quiet replay-guard || {
    ct journalctl -u replay-guard --no-pager | tail -n 20
    fail "the unit did not become active"
}
status=$(ct systemctl show replay-guard -p StatusText --value)
say "ok: active (Type=notify); STATUS: $status"
pid=$(ct systemctl show -p MainPID --value replay-guard)
ct sh -c "grep -E '^(Uid|CapEff|NoNewPrivs|Seccomp):' /proc/$pid/status" | tr '\n' ' ' | sed 's/\t/ /g'
echo
ct sh -c "grep -q '^CapEff:.0000000000000000' /proc/$pid/status" || fail "the service holds capabilities"
ct sh -c "grep -q '^NoNewPrivs:.1' /proc/$pid/status" || fail "NoNewPrivs is off"

for s in 1 2 3 2; do
    ct mosquitto_pub -h 127.0.0.1 -V mqttv5 -q 1 -t incidents/CALFIRE \
        -m "{\"agency\":\"CALFIRE\",\"source_id\":\"IC-1\",\"epoch\":1,\"sequence\":$s}"
done
db=/var/lib/replay-guard/replay-guard.redb
for _ in $(seq 100); do
    n=$(ct replay-guard dump-audit --db "$db" 2>/dev/null | wc -l)
    [ "$n" -ge 4 ] && break
    sleep 0.1
done
applied=$(ct replay-guard dump-effects --db "$db" | wc -l)
dups=$(ct replay-guard dump-audit --db "$db" --outcome duplicate | wc -l)
[ "$applied" -eq 3 ] && [ "$dups" -eq 1 ] || fail "applied $applied (want 3), duplicates $dups (want 1)"
say "ok: 4 deliveries, 3 applied, the redelivery suppressed (read live from $db)"

# The metrics endpoint under the unit's hardening (bash's /dev/tcp: no curl in the container).
scrape() { ct bash -c 'exec 3<>/dev/tcp/127.0.0.1/9464 && printf "GET /metrics HTTP/1.0\r\n\r\n" >&3 && cat <&3'; }
page=$(scrape) || fail "no answer on 127.0.0.1:9464"
for want in 'replay_guard_decisions_total{outcome="applied"} 3' \
    'replay_guard_decisions_total{outcome="duplicate"} 1' \
    'replay_guard_broker_connected{broker="mqtt://127.0.0.1:1883"} 1' \
    'replay_guard_store_readable 1' 'replay_guard_window_entries 3'; do
    grep -qxF "$want" <<<"$page" || fail "the metrics lack '$want': $page"
done
say "ok: the hardened unit serves /metrics: 3 applied, 1 duplicate, connected, store readable"

# journald natively: a quarantined message is a warning with its outcome, key and topic as
# fields (JOURNAL_STREAM is set by systemd).
ct mosquitto_pub -h 127.0.0.1 -V mqttv5 -q 1 -t incidents/CALFIRE -m 'not json'
for _ in $(seq 100); do
    grep -q quarantined <<<"$(ct journalctl -u replay-guard -p warning --no-pager -q OUTCOME=malformed)" && break
    sleep 0.1
done
grep -q "message quarantined for review: malformed on incidents/CALFIRE, quarantine id [0-9]" \
    <<<"$(ct journalctl -u replay-guard -p warning --no-pager -q OUTCOME=malformed)" ||
    fail "journalctl -p warning OUTCOME=malformed shows no quarantine warning naming outcome, topic and id"
entry=$(ct journalctl -u replay-guard -p warning --no-pager -q -o json OUTCOME=malformed | tail -n 1)
case "$entry" in
    *'"PRIORITY":"4"'*'"TOPIC":"incidents/CALFIRE"'* | *'"TOPIC":"incidents/CALFIRE"'*'"PRIORITY":"4"'*)
        say "ok: journalctl -p warning OUTCOME=malformed shows it (priority 4, TOPIC field)" ;;
    *) fail "the journal entry lacks its priority or fields: $entry" ;;
esac

# A config error: exit 1 stops the unit (RestartPreventExitStatus=1), no restart loop.
ct sh -c 'cp /etc/replay-guard/replay-guard.toml /tmp/good.toml; sed -i "s/^topics = .*/topics = []/" /etc/replay-guard/replay-guard.toml'
ct systemctl restart replay-guard 2>/dev/null || true
sleep 3
result=$(ct systemctl show replay-guard -p ActiveState -p NRestarts -p Result | tr '\n' ' ')
case "$result" in
    *ActiveState=failed*) ;;
    *) fail "a config error left the unit running or restarting: $result" ;;
esac
case "$result" in
    *NRestarts=0*) say "ok: a config error stops the unit: $result" ;;
    *) fail "a config error restarted the unit: $result" ;;
esac
ct sh -c 'cp /tmp/good.toml /etc/replay-guard/replay-guard.toml'
ct systemctl reset-failed replay-guard
ct systemctl start replay-guard
ct systemctl is-active --quiet replay-guard || fail "the unit did not come back with a good config"

# An upgrade (the same package again) restarts the running service.
before=$(ct systemctl show -p MainPID --value replay-guard)
ct dpkg -i /tmp/replay-guard.deb >/dev/null 2>&1
after=$(ct systemctl show -p MainPID --value replay-guard)
ct systemctl is-active --quiet replay-guard && [ "$after" != "$before" ] ||
    fail "an upgrade did not restart the service (pid $before, then $after)"
say "ok: an upgrade restarted the service (pid $before -> $after)"

# The standalone relay as its own unit beside the service: the same database, the same
# dynamic user, and an exec sink appending the events to a file in the state directory.
ct sh -c 'cat > /etc/replay-guard/relay.toml' <<'EOF'
[store]
path = "/var/lib/replay-guard/replay-guard.redb"
[relay]
source = "urn:replay-guard:replay-guard-eoc-1"
[[sink]]
name = "spool"
kind = "exec"
command = ["/bin/sh", "-c", "cat >> /var/lib/replay-guard/spool.jsonl"]
EOF
ct replay-guard check-config /etc/replay-guard/relay.toml >/dev/null || fail "check-config refuses relay.toml"
ct systemctl start replay-guard-relay || true
ct systemctl is-active --quiet replay-guard-relay || {
    ct journalctl -u replay-guard-relay --no-pager | tail -n 20
    fail "the relay unit did not become active"
}
uid() { ct awk '/^Uid:/ { print $2 }' "/proc/$(ct systemctl show -p MainPID --value "$1")/status"; }
[ "$(uid replay-guard)" = "$(uid replay-guard-relay)" ] ||
    fail "the units run as different users: $(uid replay-guard) and $(uid replay-guard-relay)"
say "ok: the relay unit active (Type=notify) beside the service, both as uid $(uid replay-guard-relay)"
spool=/var/lib/private/replay-guard/spool.jsonl
lines() { ct sh -c "cat $spool 2>/dev/null | wc -l"; }
for _ in $(seq 300); do [ "$(lines)" -ge 3 ] && break; sleep 0.1; done
[ "$(lines)" -eq 3 ] || fail "the relay delivered $(lines) events of the 3 applied"
ct mosquitto_pub -h 127.0.0.1 -V mqttv5 -q 1 -t incidents/CALFIRE \
    -m '{"agency":"CALFIRE","source_id":"IC-1","epoch":1,"sequence":4}'
for _ in $(seq 300); do [ "$(lines)" -ge 4 ] && break; sleep 0.1; done
grep -q '"rgsequence":"4"' <<<"$(ct tail -n 1 "$spool")" || fail "the new effect did not reach the sink"
ids=$(ct grep -o '"id":"[^"]*"' "$spool" | sort -u | wc -l)
[ "$(lines)" -eq 4 ] && [ "$ids" -eq 4 ] || fail "the sink got $(lines) lines with $ids ids, not 4 events once"
say "ok: the relay unit delivered the 3 applied effects and a new one, each once"

# Removal stops both units and keeps the database; verify it.
ct env DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq replay-guard >/dev/null 2>&1
for unit in replay-guard replay-guard-relay; do
    ct systemctl is-active --quiet $unit && fail "removal left $unit running"
done
say "ok: apt remove stopped both units"
ct test -s /var/lib/private/replay-guard/replay-guard.redb || fail "removal lost the database"
ct dpkg -i /tmp/replay-guard.deb >/dev/null 2>&1
ct replay-guard verify --db "$db" | cut -c1-120
say "ok: the database stayed and verifies"
say "all checks passed"
