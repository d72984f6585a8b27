//! The one integration-test binary (links once). Module map:
//! - `common`: helpers shared by the modules (temp databases, feeds, running the binary).
//! - `compat`: a database written by the previous release reads, verifies and takes writes.
//! - `model`: reference-model property test of the engine against an in-memory model.
//! - `fuzz_regressions`: the committed fuzz inputs through the fuzz targets' checks.
//! - `faults`: fault-injecting redb backend: a failed write/sync leaves the previous state.
//! - `bad_input`: malformed payloads through the real binary: quarantined, never a panic.
//! - `cli`: exit codes, config errors, `ingest` and `dump-*` output field by field.
//! - `config`: every config range, shared by `check-config` and `run`; digest_ignore; secrets;
//!   `check-config` on both backends with each sink kind.
//! - `crash`: real `kill -9` of `ingest`, re-ingest, compare with a clean run.
//! - `db_file`: what may stand at `--db` (FIFO, device, empty file), the feed lock through
//!   symlinks and hard links, file modes, no stray files after a failed open.
//! - `live_read`: `dump-audit` while another process writes the database.
//! - `inspect`: `dump-*` filters, CSV and `--follow`; `explain`; `gaps`; `--tz` on `dump-*`,
//!   `explain` and `stats` text; one-line usage errors.
//! - `broker`: a real Mosquitto per test on a free loopback port (harness).
//! - `relay_window`: the relay's window through `relay` and a scripted MQTT 5 broker: the
//!   next batch published before the PUBACKs of the one before, a loss mid-window
//!   re-publishing exactly the unacknowledged suffix.
//! - `relay_mqtt`: the `mqtt` sink against a second Mosquitto: order, v5 properties, PUBACK
//!   refusals as poison, the downstream broker killed mid-batch (rumqttc #1056); a scripted
//!   broker whose PUBACKs arrive with the end of the connection.
//! - `service`: `run` against real brokers: basic, failover replay, kill -9, SIGTERM, v5/3.1.1.
//! - `fake_peer`: a scripted fake broker for a reconnect edge case (no stale PUBACK).
//! - `tls`: mqtts with a CA and client certificate made by openssl; wrong CA refused; a
//!   mismatched client certificate and key refused when the config loads.
//! - `verify`: passes on honest databases, catches edits, deletions, reorders, truncation.
//! - `damage`: every page zeroed, seeded flips/truncations: one-line `database damaged`, no panic.
//! - `deb`: the Debian package built from the binary under test, read with dpkg-deb and
//!   unpacked into a throwaway root (the book under /usr/share/doc; every program path the
//!   docs' unit and command examples name is one the package installs); `man` and
//!   `completions`.
//! - `demo`: the in-process failover demo exits 0 with the right pictures; reproducible by seed.
//! - `operator`: quarantine release/discard while `run` consumes; retention; stats; compact.
//! - `relay`: the relay core with the exec sink: failing batches, kill -9, `run` with a sink,
//!   a program's huge stderr or lingering child (decided by its exit, stderr kept escaped),
//!   retention held by a lagging sink, `relay status|parked|retry|rewind|forget`.
//! - `relay_loss`: the last hop's silent-loss paths closed: rewind only back, `relay skip`
//!   audited, every offset below a cursor accounted for (`verify`, `relay status`), retries
//!   rebuilt from the effect, retention holding parked effects and late-starting sinks.
//! - `relay_audit`: the audit stream (`stream = "audit"`): `run` through a private Mosquitto
//!   killed with -9 (every entry once in order, same ids, chain links, `outcomes`),
//!   retention of the audit log held and released, park and retry from the entry, rewind,
//!   a stream change refused, `verify` and `relay status`; on PostgreSQL with the postgres sink.
//! - `relay_http`: the http sink against a chaotic receiver written in the test (503, 429,
//!   dropped connections, a 422): `Sink::deliver`, max_in_flight, timeouts, https with a CA,
//!   and end to end through `ingest` and the `relay` commands; credentials (Authorization from
//!   a file or systemd's credential, mutual TLS, the system trust store), and the token and
//!   the URL's query in no output, log or stored error; an audit sink (`stream = "audit"`).
//! - `relay_syslog`: the syslog sink against a real rsyslogd of the test's own: RFC 5424
//!   messages parsed back field by field; `kill -9` of the relay and a restart of rsyslogd
//!   mid-stream lose nothing; the audit stream from a real `run` through kill -9, every entry
//!   with its outcome's MSGID and severity; TLS (gtls, mutual) verified, another CA refused in words; a
//!   batch counted only if the connection outlives the settle period and the receiver's TCP
//!   acknowledged it all; an idle connection the receiver closed replaced at once.
//! - `relay_relp`: the syslog sink over RELP against a real rsyslogd with imrelp: every event
//!   arrives; a receiver hung (SIGSTOP), killed and restarted loses nothing and gets nothing
//!   counted it did not answer, where plain TCP counts and loses; RELP over TLS.
//! - `green`: what green means: a receiver refusing every event parks them (one source) or
//!   blocks the sink (several), and no verdict is green: `relay status`, `health`, the report,
//!   and the book's alert rules evaluated by a real Prometheus.
//! - `relay_model`: the relay's model test through the binary: seeded random steps (ingest
//!   with replays, kill -9 of `relay` and `run`, rewinds, parks and retries, skips, a sink
//!   forgotten, a second store in the same schema, a restored backup) against exec, http and
//!   postgres receivers; nothing lost, no id with two contents, every ledger holds.
//!   `scripts/relay-model.sh` soaks it (seeds beyond the suite's, `--load` with the CPUs
//!   busy: timing is part of the input).
//! - `topology_model`: what green means, as an oracle after every random step: sinks inside
//!   `run` or in a relay of their own (`sinks_from`, starting late, failing at start),
//!   receivers refusing (http statuses, exec exits, an MQTT ACL), stopped (SIGSTOP) and
//!   killed, retention on, kill -9 of `run` and the relay, operator actions: whenever
//!   `health`, `relay status` and the report are all green, every effect and selected audit
//!   entry is at its receiver or passed over by an audited action, and the counts match.
//!   `scripts/topology-model.sh` soaks it.
//! - `readme`: the README's and the book's commands run as written and print what they show
//!   (README, then the book in SUMMARY.md order); every subcommand has a book page; every
//!   relative link and anchor of the README and the book resolves.
//! - `pg`: a PostgreSQL database of the test's own (harness), `psql`.
//! - `pg_store`: the PostgreSQL store backend: the reference model, the same decisions and
//!   chain as redb for the same feed, members committing concurrently.
//! - `pg_group`: several `run` members on one PostgreSQL schema: a shared subscription
//!   through kill -9s and a broker failover replay, an active/standby takeover, the server
//!   terminating connections mid-surge, the server cut off (watchdog, STATUS and metrics
//!   meanwhile), `run` started while the server is cut off (waits, SIGTERM), fail-fast
//!   refusals at start, a frozen proxy (a hung connection given up after its deadline).
//! - `pg_tls`: TLS to PostgreSQL on a server of the test's own (initdb, its own CA): each
//!   `sslmode`, wrong CA and host name refused in words (`run`, `ingest` exit 1 at once),
//!   channel binding, a client certificate, the postgres sink over verify-full and refused.
//! - `pg_relay`: the relay on a PostgreSQL store: the same relay writes as on redb, one
//!   deliverer per sink with the others standing by, relays and `run` members through kill -9s;
//!   the relay woken by LISTEN/NOTIFY, again after its listening connection is killed.
//! - `relay_pg`: the postgres sink against the real PostgreSQL: exactly once, cursor with
//!   the rows, reconnect, poison, concurrent table creation; `kill -9` of `relay`.
//! - `health`: the monitoring check on real stores (redb and PostgreSQL): OK, WARNING and
//!   CRITICAL from real conditions, UNKNOWN for an unreadable store, the line parsed.
//! - `metrics`: the Prometheus endpoint scraped while `run` consumes a real feed through a
//!   failover, and by a real Prometheus; `stats --format prometheus` through node_exporter's
//!   textfile collector; promtool's lint; a taken port; slow clients never keep a scraper out.
//! - `backup`: online backups taken while `run` consumes a surge: each verifies, is a prefix
//!   of the live record, restores; `run` undisturbed. Refusals (existing file, PostgreSQL).
//! - `systemd`: both units (the service, the standalone relay) verify with an exposure of at
//!   most 2.0 and share one dynamic user and database; check-config of both example configs;
//!   secrets.
//! - `report`: the after-action report of a real failover's store against `stats`, `gaps`,
//!   `verify` and `explain`, its delivery section against `relay status`; rendered by a real
//!   headless Chromium (PNG, PDF on A4 and Letter); a tampered store's verdict; hostile names
//!   escaped; usage errors; a PostgreSQL store.
//! - `upstream_loss`: losses upstream loud at once: a stock Mosquitto dropping a backlog
//!   queued for `run` (the gap warned, counted, in `health` and `stats`), a broker restarted
//!   without its sessions (session lost, likewise); a fresh store's first connect is no loss.
//! - `torture`: the torture scripts, short: repeated failovers, kill -9 of `run`, disk full, EIO.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backup;
mod bad_input;
mod broker;
mod cli;
mod common;
mod compat;
mod config;
mod crash;
mod damage;
mod db_file;
mod deb;
mod demo;
mod fake_peer;
mod faults;
mod fuzz_regressions;
mod green;
mod health;
mod index_merge;
mod inspect;
mod key_index;
mod live_read;
mod metrics;
mod model;
mod operator;
mod pg;
mod pg_group;
mod pg_relay;
mod pg_store;
mod pg_tls;
mod readme;
mod relay;
mod relay_audit;
mod relay_http;
mod relay_loss;
mod relay_model;
mod relay_mqtt;
mod relay_pg;
mod relay_relp;
mod relay_syslog;
mod relay_window;
mod report;
mod service;
mod source_index;
mod systemd;
mod tls;
mod topology_model;
mod torture;
mod upstream_loss;
mod verify;
mod window_tables;
