//! Command-line flags (clap derive). Every value is parsed here, once, into its type
//! (`values`): a command receives a zone, a time, a source or a threshold, never its text. No
//! I/O.

pub(crate) mod values;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::model::Outcome;
use crate::timefmt::{TimeSpec, Zone};
use values::{SourceName, Threshold};

#[derive(Parser, Debug)]
#[command(
    name = "replay-guard",
    version,
    about = "Exactly-once incident effects from an at-least-once MQTT feed",
    long_about = "replay-guard decides, for every delivered incident message, whether its effect \
                  is applied, suppressed as a provable duplicate, or quarantined, and records \
                  each decision in a hash-chained audit log, all in one redb file (or one \
                  PostgreSQL schema shared by several members).\n\n\
                  Exit codes: 0 success or clean stop, 1 usage or configuration error, 2 runtime or \
                  storage failure, 3 stopped at once by a second signal, 4 `verify` found a violation."
)]
pub struct Cli {
    /// Log format on stderr (level filter: RUST_LOG, default info).
    #[arg(long, value_enum, global = true, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommand a command line names, read past any error in its flags (for a command whose
/// usage errors have their own form: `health`'s UNKNOWN line). A value of a flag is never
/// taken for it.
pub fn subcommand<I, T>(argv: I) -> Option<String>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::CommandFactory as _;
    Cli::command()
        .ignore_errors(true)
        .try_get_matches_from(argv)
        .ok()?
        .subcommand_name()
        .map(str::to_string)
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per event (for journald/Loki/ELK).
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the MQTT consumer service (until SIGTERM/SIGINT).
    Run(RunArgs),
    /// Validate a config file for `run` (or, without `[mqtt]` and with `[[sink]]` tables, for a
    /// standalone `relay`) and exit (non-zero naming the problem).
    CheckConfig {
        /// TOML config file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Decide a file of captured payloads, one JSON message per line (offline replay).
    Ingest(IngestArgs),
    /// Recompute the audit hash chain and check every invariant of the record (exit 4 on a
    /// violation, naming the first broken entry).
    Verify(DbArgs),
    /// Print the audit log: one decision per line.
    DumpAudit(DumpArgs),
    /// Print the effect log: every applied message, once.
    DumpEffects(DumpArgs),
    /// Print the quarantine: conflicting, stale and malformed messages kept for review.
    DumpQuarantine(DumpArgs),
    /// Tell the whole story of one event: every audit entry with its key, its effect,
    /// quarantine records, and whether a resend now would be suppressed.
    #[command(long_about = EXPLAIN_ABOUT)]
    Explain(ExplainArgs),
    /// List missing sequence ranges per source and epoch (what a producer sent that never
    /// arrived, as far as the audit log can tell).
    #[command(long_about = GAPS_ABOUT)]
    Gaps(GapsArgs),
    /// Release (apply) or discard a quarantined message, audited with who and why. Works
    /// while `run` is consuming.
    Quarantine(QuarantineArgs),
    /// Health at a glance: decisions per outcome (total and last hour), window, per-source
    /// high-water marks, failover replay bursts, quarantine and file size.
    Stats(StatsArgs),
    /// Write the after-action report: one self-contained HTML page (or its JSON twin) with
    /// verify's verdict, a timeline, per-source counts and gaps, the quarantine, sample proofs
    /// of suppressed replays, the relay sinks, and the commands that reproduce each number.
    #[command(long_about = REPORT_ABOUT)]
    Report(ReportArgs),
    /// Monitoring check (Nagios/Icinga plugin, systemd timer): one status line; exit 0 OK,
    /// 1 WARNING, 2 CRITICAL, 3 UNKNOWN (the store cannot be read).
    #[command(long_about = HEALTH_ABOUT)]
    Health(Box<HealthArgs>),
    /// Copy a live database into a new file from one read transaction (consistent while `run`
    /// writes), then verify the copy. redb only: for PostgreSQL use `pg_dump -n SCHEMA`.
    Backup(BackupArgs),
    /// Rewrite the database file to give back the space retention freed. Stop `run` first.
    Compact(DbArgs),
    /// See the problem and the fix: a real broker failover replay, in-process, with a naive
    /// consumer beside replay-guard. Exits 0 only if every event was applied exactly once.
    Demo(DemoArgs),
    /// Deliver applied effects to the configured sinks (standalone), or inspect and steer
    /// the sinks' cursors (`relay status|parked|retry|rewind|forget`).
    #[command(long_about = RELAY_ABOUT, args_conflicts_with_subcommands = true)]
    Relay(RelayArgs),
    /// Create the PostgreSQL schema of `[store] backend = "postgres"`, or bring it to this
    /// build's version (`run` and `ingest` also do this when they start).
    MigrateSchema(MigrateSchemaArgs),
    /// Copy a redb database into a new, empty PostgreSQL schema and verify the copy (move a
    /// single host to a shared store without losing its window). Stop `run` first.
    Migrate(MigrateArgs),
    /// Print the shell completion script for SHELL on stdout (the .deb installs all three).
    #[command(long_about = COMPLETIONS_ABOUT)]
    Completions {
        #[arg(value_enum)]
        shell: CompletionShell,
    },
    /// Print the manual page on stdout, or write one page per command into --dir.
    Man(ManArgs),
}

const COMPLETIONS_ABOUT: &str = "Print the shell completion script for SHELL on stdout (the .deb \
installs all three). For example:\n\n  \
replay-guard completions bash > /etc/bash_completion.d/replay-guard\n  \
replay-guard completions zsh > /usr/local/share/zsh/site-functions/_replay-guard\n  \
replay-guard completions fish > ~/.config/fish/completions/replay-guard.fish";

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Write replay-guard.1 and one page per command (replay-guard-run.1, …) into this
    /// directory instead of printing replay-guard.1.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct MigrateSchemaArgs {
    /// TOML config file whose `[store]` names the PostgreSQL server and schema.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct MigrateArgs {
    /// The redb database file to copy (left unchanged).
    #[arg(long, value_name = "PATH")]
    pub from: PathBuf,
    /// TOML config file whose `[store]` names the PostgreSQL server and (empty) schema, and
    /// whose `[feed]` is the one `run` decides with (to verify the copy).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

const RELAY_ABOUT: &str = "Without a subcommand: run every [[sink]] of --config against the \
database, standalone (for a database fed by `ingest`, or as a unit of its own beside a `run` \
whose config then has no [[sink]]), until SIGTERM/SIGINT. A sink delivers the effect log \
(each applied effect), or with `stream = \"audit\"` the audit log (each decision, quarantine \
and operator action, optionally only the `outcomes` listed); its cursor, offsets and parked \
events are then audit indexes.\n\n\
With a subcommand: inspect the sinks' cursors (`status`), a sink's parked events (`parked`), \
ask for a parked event to be delivered again (`retry`), move a cursor back (`rewind`; receivers \
see the same ids again), or drop a removed sink's cursor so retention may prune past it \
(`forget`). Each retry, rewind and forget is written to the audit log with who and why.";

#[derive(clap::Args, Debug)]
pub struct RelayArgs {
    #[command(subcommand)]
    pub action: Option<RelayAction>,
    /// TOML config file with the `[[sink]]` tables (and `[store] path` unless --db is given).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Database file (overrides `[store] path`).
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum RelayAction {
    /// Per sink: cursor, head, lag in events and seconds, parked count, last error, state.
    Status {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
        format: StatusFormat,
    },
    /// The events a sink parked, with the reason and the receiver's last response.
    Parked {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long, value_name = "NAME")]
        sink: String,
        #[arg(long, value_enum, default_value_t = Format::Jsonl)]
        format: Format,
    },
    /// Ask the sink to deliver a parked event again (by effect offset or event id), or every
    /// parked event of the sink (--all).
    Retry(ParkedAction),
    /// Deliver again from effect OFFSET on (a running sink follows within a second). Only
    /// back: OFFSET above the cursor is refused (see `skip`).
    Rewind(CursorMove),
    /// Move the cursor forward to OFFSET without delivering the effects between: prints how
    /// many undelivered effects it passes over and does it only with --yes. Audited.
    Skip {
        #[command(flatten)]
        cursor: CursorMove,
        /// Pass the effects over (without it, only say how many would be).
        #[arg(long)]
        yes: bool,
    },
    /// Decide that a parked event (by effect offset or event id), or every parked event of the
    /// sink (--all), is not to be delivered: its record goes, the decision is audited, and a
    /// blocking one lets the sink go on. (Retention keeps a parked event's effect until then.)
    Discard(ParkedAction),
    /// Drop the cursor and parked events of a sink that is no longer configured.
    Forget(SinkAction),
}

/// An audited operator action on one sink.
#[derive(clap::Args, Debug)]
pub struct SinkAction {
    #[command(flatten)]
    pub db: DbArgs,
    /// The sink's name (`[[sink]] name`).
    #[arg(long, value_name = "NAME")]
    pub sink: String,
    /// Why, in words a reviewer will read in the audit log.
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Who decided (default: $SUDO_USER, else $USER).
    #[arg(long, value_name = "NAME")]
    pub operator: Option<String>,
}

/// An operator action on a sink's parked events: one, by effect offset or event id, or --all.
#[derive(clap::Args, Debug)]
pub struct ParkedAction {
    #[command(flatten)]
    pub action: SinkAction,
    /// The parked event: its offset (an audit sink's: its audit index) or its event id
    /// (`relay parked` lists them).
    #[arg(value_name = "OFFSET|ID", required_unless_present = "all")]
    pub event: Option<String>,
    /// Every parked event of the sink.
    #[arg(long, conflicts_with = "event")]
    pub all: bool,
}

/// An operator move of a sink's cursor to an effect offset.
#[derive(clap::Args, Debug)]
pub struct CursorMove {
    #[command(flatten)]
    pub action: SinkAction,
    /// The offset the sink delivers next (an audit sink's: the audit index).
    #[arg(long, value_name = "OFFSET")]
    pub to: u64,
}

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Seed of the scripted feed (the same seed gives the same feed).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub seed: u64,
    /// Messages in the feed (at least 40; the surge the standby replays is half of them).
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(40..=1_000_000))]
    pub messages: u64,
    /// Keep the database at this new path (default: a new temporary directory, kept).
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct QuarantineArgs {
    #[command(subcommand)]
    pub action: QuarantineAction,
}

#[derive(Subcommand, Debug)]
pub enum QuarantineAction {
    /// The message is genuine: apply it now (effect with `released: true`, audit entry
    /// `released`). Replays of the same bytes are duplicates of it from then on.
    Release(ResolveArgs),
    /// The message is not to be applied: take it out of the quarantine (audit entry
    /// `discarded`).
    Discard(ResolveArgs),
}

#[derive(clap::Args, Debug)]
pub struct ResolveArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Quarantine id (the `id` column of `dump-quarantine`).
    #[arg(value_name = "ID")]
    pub id: u64,
    /// Why, in words a reviewer will read in the audit log.
    #[arg(long, value_name = "TEXT")]
    pub reason: String,
    /// Who decided (default: $SUDO_USER, else $USER).
    #[arg(long, value_name = "NAME")]
    pub operator: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = StatsFormat::Text)]
    pub format: StatsFormat,
    /// Show text times in ZONE, with their offset: local (the host's; TZ first), UTC, or an
    /// IANA name like Europe/Berlin. --format json stays UTC. Default: UTC.
    #[arg(long, value_name = "ZONE", value_parser = values::zone)]
    pub tz: Option<Zone>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsFormat {
    /// Labelled lines for people.
    Text,
    /// One JSON object, for scripts and monitoring.
    Json,
    /// Prometheus's text format (0.0.4): the metrics endpoint's store gauges, for
    /// node_exporter's textfile collector.
    Prometheus,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusFormat {
    /// Labelled lines for people.
    Text,
    /// One JSON object, for scripts and monitoring.
    Json,
}

const HEALTH_ABOUT: &str = "Check the store against thresholds and print one line in the \
monitoring-plugin format, `REPLAY-GUARD STATE - text | perfdata`, for Nagios, Icinga or a \
systemd timer. Exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (the store cannot be read, or a \
flag is wrong).\n\n\
Checks: the age of the last decision (the newest audit entry), deliveries quarantined in the \
last hour, sequences missing in the upstream gaps reported in the last hour (an applied \
sequence jumped past its source's high-water mark and the ones between were still missing \
[feed] gap_grace_ms later: a broker dropped them), broker sessions `run` found lost in the last hour, the window's fill (entries against [window] max_entries: pass the --config `run` \
uses), each relay sink's lag (effects behind the head, and the age of the oldest undelivered \
one), and free space on the file system of the database file (not for PostgreSQL). A value \
above a --warn-* threshold is WARNING, above --crit-* CRITICAL (disk free: below). `off` \
turns a threshold off. Read-only, from one snapshot: works while `run` writes.";

#[derive(clap::Args, Debug)]
pub struct HealthArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Last decision older than this: WARNING (90s, 5m, 1h30m, 2d, PT1H; or off).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = values::duration_threshold)]
    pub warn_commit_age: Threshold,
    /// Last decision older than this: CRITICAL.
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = values::duration_threshold)]
    pub crit_commit_age: Threshold,
    /// More deliveries than this quarantined in the last hour: WARNING.
    #[arg(long, value_name = "N", default_value = "0", value_parser = values::count_threshold)]
    pub warn_quarantine: Threshold,
    /// More deliveries than this quarantined in the last hour: CRITICAL.
    #[arg(long, value_name = "N", default_value = "50", value_parser = values::count_threshold)]
    pub crit_quarantine: Threshold,
    /// More sequences than this missing in the upstream gaps reported in the last hour
    /// (messages a broker dropped): WARNING.
    #[arg(long, value_name = "N", default_value = "0", value_parser = values::count_threshold)]
    pub warn_gaps: Threshold,
    /// More sequences than this missing in the last hour's upstream gaps: CRITICAL.
    #[arg(long, value_name = "N", default_value = "1000", value_parser = values::count_threshold)]
    pub crit_gaps: Threshold,
    /// More broker sessions than this found lost in the last hour (what the broker queued
    /// for `run` is gone): WARNING.
    #[arg(long, value_name = "N", default_value = "0", value_parser = values::count_threshold)]
    pub warn_sessions_lost: Threshold,
    /// More broker sessions than this lost in the last hour: CRITICAL.
    #[arg(long, value_name = "N", default_value = "off", value_parser = values::count_threshold)]
    pub crit_sessions_lost: Threshold,
    /// Window fuller than this percentage of `[window] max_entries`: WARNING.
    #[arg(long, value_name = "PERCENT", default_value = "80", value_parser = values::percent_threshold)]
    pub warn_window_fill: Threshold,
    /// Window fuller than this percentage: CRITICAL.
    #[arg(long, value_name = "PERCENT", default_value = "95", value_parser = values::percent_threshold)]
    pub crit_window_fill: Threshold,
    /// A sink more than this many effects behind the head: WARNING.
    #[arg(long, value_name = "N", default_value = "1000", value_parser = values::count_threshold)]
    pub warn_relay_lag: Threshold,
    /// A sink more than this many effects behind: CRITICAL.
    #[arg(long, value_name = "N", default_value = "10000", value_parser = values::count_threshold)]
    pub crit_relay_lag: Threshold,
    /// A sink's oldest undelivered effect older than this: WARNING.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = values::duration_threshold)]
    pub warn_relay_age: Threshold,
    /// A sink's oldest undelivered effect older than this: CRITICAL.
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = values::duration_threshold)]
    pub crit_relay_age: Threshold,
    /// A sink with more events than this parked (refused by its receiver, waiting for an
    /// operator's `relay retry` or `relay discard`): WARNING. A parked event never reached
    /// the receiver.
    #[arg(long, value_name = "N", default_value = "0", value_parser = values::count_threshold)]
    pub warn_parked: Threshold,
    /// A sink with more events than this parked: CRITICAL.
    #[arg(long, value_name = "N", default_value = "100", value_parser = values::count_threshold)]
    pub crit_parked: Threshold,
    /// Less free space than this percentage beside the database: WARNING.
    #[arg(long, value_name = "PERCENT", default_value = "10", value_parser = values::percent_threshold)]
    pub warn_disk_free: Threshold,
    /// Less free space than this percentage: CRITICAL.
    #[arg(long, value_name = "PERCENT", default_value = "5", value_parser = values::percent_threshold)]
    pub crit_disk_free: Threshold,
}

#[derive(clap::Args, Debug)]
pub struct BackupArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The new backup file (refused if it exists; built as FILE.partial, then renamed).
    #[arg(long, value_name = "FILE")]
    pub to: PathBuf,
}

const EXPLAIN_ABOUT: &str = "Tell the whole story of one event, named by its idempotency key or \
by --source/--sequence/--epoch (key v1 is derived from them): every audit entry with that key \
in order (index, time, outcome, topic, reason, in plain words), the effect records they name \
(offset, received_at, late, released), the quarantine records they name, and the state now: \
whether the position is still in the dedup window, the source's high-water mark and evicted \
floor, and what a resend would become.\n\n\
It scans the whole audit log for the key (about 1 s per million entries), read-only, so it \
works on a live database. Exits 1 if no audit entry has the key.";

const REPORT_ABOUT: &str = "Write the after-action report of a store: one self-contained HTML \
page (inline CSS and SVG; no script, font, image or network; prints on A4 and Letter, each \
section on its own page) or, with --format json, its JSON twin (schema \
replay-guard.report.v1).\n\n\
In order: the verdict (verify's result over the whole store: a red banner at the top if it \
failed, amber if it passed but sequences are missing in range; the sequences missing, the \
upstream losses run recorded, the chain head, the retention anchor and how many entries it \
pruned, the range, the counts in words), a timeline of decisions per interval stacked by \
outcome with every failover replay burst shaded, every lost broker session marked, and strips \
of deliveries held and upstream gap events per interval, per-source counts, gaps (the first 20 \
per source) and high-water marks, the quarantine (every record still open, operator releases \
and discards), up to three sample proofs per burst (the duplicate, the effect it matched, the \
entry that applied it), the relay sinks (stream, delivered, parked, lag, operator actions), \
and the commands that reproduce each number.\n\n\
Read-only, from one read snapshot: verify's pass plus one pass over the audit log. Memory is \
verify's: it grows with the log, as verify keeps one 32-byte key per applied entry (about 74 MiB \
at a million entries); the report's own pass adds counters, seen sequences as ranges and capped \
lists. Exit 0 when the report is written and verify passed; 4 when \
it is written and verify found a violation (the report says so at the top); 1 on a usage error, \
2 if the store cannot be read or the report cannot be written.";

const GAPS_ABOUT: &str = "List, per source and epoch, the sequence numbers missing between the \
lowest and the highest sequence the audit log has seen. Every audit entry with a position \
counts as seen (applied, applied_late, duplicate, conflict, stale; malformed messages have \
none). Nothing before the lowest or after the highest sequence of an epoch is reported, and \
gaps are never counted across epochs (a new epoch may restart its counter).\n\n\
It streams the audit log once, keeping per source and epoch only the seen sequences as merged \
ranges: memory grows with the number of gaps, not entries. Exit code 0 whether or not gaps \
exist: they are information, not an error.";

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// TOML config file.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Database file; overrides store.path from --config.
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Start a new, empty database: only where none is (a missing path, or a zero-length
    /// file, which it replaces); a file holding data is refused. Without it, a zero-length
    /// file is refused as a truncated database (restore the backup). One-off: do not leave it
    /// in a unit file.
    #[arg(long)]
    pub new_database: bool,
}

#[derive(clap::Args, Debug)]
pub struct IngestArgs {
    /// Database file; overrides store.path from --config.
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// Start a new, empty database: only where none is (a missing path, or a zero-length
    /// file, which it replaces); a file holding data is refused. Without it, a zero-length
    /// file is refused as a truncated database (restore the backup). One-off: do not leave it
    /// in a unit file.
    #[arg(long)]
    pub new_database: bool,
    /// TOML config file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Topic recorded with each message.
    #[arg(long, value_name = "T", default_value = "ingest")]
    pub topic: String,
    /// Input file, or - for standard input.
    #[arg(value_name = "FILE|-", default_value = "-")]
    pub input: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct DbArgs {
    /// Database file; overrides store.path from --config.
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
    /// TOML config file (its store.path names the database).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    pub format: Format,
    #[command(flatten)]
    pub filter: FilterArgs,
    /// After printing what exists, keep printing new entries as they are committed (polls every
    /// 200 ms, like `tail -f`) until SIGINT/SIGTERM or a closed pipe, then exit 0. Only new
    /// entries are printed: an existing quarantine record whose delivery counter grows is not
    /// printed again.
    #[arg(long)]
    pub follow: bool,
    /// Only rows after this key: an effect offset (`dump-effects`), an audit index or a
    /// quarantine id.
    #[arg(long, value_name = "OFFSET")]
    pub after: Option<u64>,
    /// Show `--format table` times in ZONE: local (the host's; TZ first), UTC, or an IANA name
    /// like Europe/Berlin. Also the zone of --since/--until times written without an offset.
    /// jsonl and CSV stay UTC. Default: UTC.
    #[arg(long, value_name = "ZONE", value_parser = values::zone)]
    pub tz: Option<Zone>,
}

/// Which entries to print. Every given flag must hold (AND); repeated --outcome flags match any
/// of their outcomes (OR). Values are checked before the database is opened.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct FilterArgs {
    /// Only entries at or after T: RFC 3339 (2026-11-30T02:00:00Z, 2026-11-30T04:00:00.250+02:00),
    /// a date or date-time in the --tz zone (2026-11-30T08:00, with --tz only), or a duration
    /// before now (90s, 15m, 1h30m, 2 days, PT1H; days are 24 h). The time is recorded_at for audit entries,
    /// received_at for effects and quarantine records.
    #[arg(long, value_name = "T", allow_hyphen_values = true, value_parser = values::time)]
    pub since: Option<TimeSpec>,
    /// Only entries before T (exclusive); same forms as --since.
    #[arg(long, value_name = "T", allow_hyphen_values = true, value_parser = values::time)]
    pub until: Option<TimeSpec>,
    /// Only entries of this producer. Split at the first '/': `Cal/Fire/E7` is agency `Cal`,
    /// source `Fire/E7` (an agency containing '/' cannot be selected).
    #[arg(long, value_name = "AGENCY/SOURCE", value_parser = values::source)]
    pub source: Option<SourceName>,
    /// Only entries with this outcome; repeat for several. Effects are applied, applied_late
    /// or, once released from quarantine, released.
    #[arg(long, value_name = "NAME", value_parser = values::outcome())]
    pub outcome: Vec<Outcome>,
    /// Only entries with this idempotency key (64 hex digits).
    #[arg(long, value_name = "HEX64", value_parser = values::key)]
    pub key: Option<[u8; 32]>,
    /// Only entries received on exactly this MQTT topic.
    #[arg(long, value_name = "TOPIC")]
    pub topic: Option<String>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// Aligned columns for people.
    Table,
    /// RFC 4180 CSV: a header row of the jsonl field names, CRLF line ends, null as an empty
    /// field, nested JSON as compact JSON text.
    Csv,
}

#[derive(clap::Args, Debug)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The event's idempotency key (64 hex digits, as in dump-audit's `key`).
    #[arg(
        value_name = "KEY",
        value_parser = values::key,
        required_unless_present = "source",
        conflicts_with_all = ["source", "sequence", "epoch"]
    )]
    pub key: Option<[u8; 32]>,
    /// Instead of KEY: the producer, AGENCY/SOURCE (split at the first '/').
    #[arg(
        long,
        value_name = "AGENCY/SOURCE",
        value_parser = values::source,
        requires = "sequence"
    )]
    pub source: Option<SourceName>,
    /// With --source: the message's sequence number.
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        value_parser = values::number,
        requires = "source"
    )]
    pub sequence: Option<u64>,
    /// With --source: the message's epoch (default 0).
    #[arg(
        long,
        value_name = "E",
        allow_hyphen_values = true,
        value_parser = values::number,
        requires = "source"
    )]
    pub epoch: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ExplainFormat::Text)]
    pub format: ExplainFormat,
    /// Show text times in ZONE, with their offset: local (the host's; TZ first), UTC, or an
    /// IANA name like Europe/Berlin. --format json (its story sentences too) stays UTC.
    /// Default: UTC.
    #[arg(long, value_name = "ZONE", value_parser = values::zone)]
    pub tz: Option<Zone>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExplainFormat {
    /// Sentences for people.
    Text,
    /// One JSON object, for scripts.
    Json,
}

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Only decisions recorded at or after T: RFC 3339, a date or date-time in the --tz zone
    /// (with --tz only), or a duration before now (90s, 15m, 2 days), as dump-audit takes it.
    #[arg(long, value_name = "T", allow_hyphen_values = true, value_parser = values::time)]
    pub since: Option<TimeSpec>,
    /// Only decisions recorded before T (exclusive); same forms as --since.
    #[arg(long, value_name = "T", allow_hyphen_values = true, value_parser = values::time)]
    pub until: Option<TimeSpec>,
    /// Only this producer, AGENCY/SOURCE (split at the first '/'); repeat for several.
    /// Without it every source is covered, unparseable deliveries included.
    #[arg(long, value_name = "AGENCY/SOURCE", value_parser = values::source)]
    pub source: Vec<SourceName>,
    /// Show times in ZONE: local (the host's; TZ first), UTC, or an IANA name like
    /// Europe/Berlin; also the zone of --since/--until written without an offset. JSON stays
    /// UTC. Default: UTC.
    #[arg(long, value_name = "ZONE", value_parser = values::zone)]
    pub tz: Option<Zone>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ReportFormat::Html)]
    pub format: ReportFormat,
    /// Where to write the report (- for standard output). An existing file is replaced.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportFormat {
    /// One self-contained HTML page.
    Html,
    /// One JSON object (schema replay-guard.report.v1).
    Json,
}

#[derive(clap::Args, Debug)]
pub struct GapsArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Only this producer, AGENCY/SOURCE (split at the first '/').
    #[arg(long, value_name = "AGENCY/SOURCE", value_parser = values::source)]
    pub source: Option<SourceName>,
    /// Output format (table adds a summary line per source and epoch).
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    pub format: Format,
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("replay-guard").chain(argv.iter().copied()))
    }

    fn argv(args: &[&str]) -> Vec<String> {
        std::iter::once("replay-guard")
            .chain(args.iter().copied())
            .map(String::from)
            .collect()
    }

    #[test]
    fn the_subcommand_is_found_past_bad_flags_and_never_taken_from_a_value() {
        let named = |a: &[&str]| subcommand(argv(a));
        assert_eq!(
            named(&["dump-audit", "--topic", "health", "--bogus"]).as_deref(),
            Some("dump-audit")
        );
        assert_eq!(named(&["health", "--bogus"]).as_deref(), Some("health"));
        assert_eq!(
            named(&["--log-format", "json", "health", "--warn-disk-free", "150"]).as_deref(),
            Some("health")
        );
        assert_eq!(
            named(&["explain", "--source", "health/x", "--nope"]).as_deref(),
            Some("explain")
        );
        assert_eq!(named(&["--bogus"]), None);
    }

    #[test]
    fn values_are_typed_when_the_line_is_parsed() {
        let Command::Health(h) = parse(&["health", "--warn-commit-age", "1h30m"])
            .unwrap()
            .command
        else {
            panic!("not health")
        };
        assert_eq!(h.warn_commit_age.0, Some(("1h30m".into(), 5400)));
        assert_eq!(
            h.crit_commit_age.0,
            Some(("15m".into(), 900)),
            "the default"
        );
        assert_eq!(h.warn_quarantine.0, Some(("0".into(), 0)));
        assert_eq!(h.warn_window_fill.0, Some(("80".into(), 8000)));
        assert!(parse(&["health", "--crit-relay-lag", "off"]).is_ok());
        for bad in [
            &["health", "--warn-disk-free", "150"][..],
            &["health", "--warn-commit-age", "5"],
            &["dump-audit", "--tz", "Mars/Olympus_Mons"],
            &["dump-audit", "--since", "yesterday"],
            &["dump-audit", "--outcome", "aplied"],
            &["gaps", "--source", "nosplit"],
            &["stats", "--tz", "Nowhere/Atall"],
        ] {
            let e = parse(bad).unwrap_err();
            use clap::error::ErrorKind;
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::ValueValidation | ErrorKind::InvalidValue
                ),
                "{bad:?}: {:?}",
                e.kind()
            );
        }
    }

    #[test]
    fn explain_takes_a_key_or_a_source_with_a_sequence() {
        let key = "ab".repeat(32);
        let Command::Explain(e) = parse(&["explain", &key]).unwrap().command else {
            panic!("not explain")
        };
        assert_eq!(e.key, Some([0xab; 32]));
        let Command::Explain(e) = parse(&[
            "explain",
            "--source",
            "Cal/E7",
            "--sequence",
            "4",
            "--epoch",
            "2",
        ])
        .unwrap()
        .command
        else {
            panic!("not explain")
        };
        assert_eq!((e.sequence, e.epoch), (Some(4), Some(2)));
        for bad in [
            &["explain"][..],
            &["explain", &key, "--source", "Cal/E7", "--sequence", "4"],
            &["explain", &key, "--sequence", "4"],
            &["explain", "--source", "Cal/E7"],
            &["explain", "--source", "Cal/E7", "--epoch", "1"],
            &["explain", "--source", "Cal/E7", "--sequence", "-1"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn relay_actions_share_their_flags() {
        let Some(RelayAction::Skip { cursor, yes }) = (match parse(&[
            "relay", "skip", "--sink", "cop", "--to", "9", "--reason", "r", "--yes",
        ])
        .unwrap()
        .command
        {
            Command::Relay(r) => r.action,
            _ => None,
        }) else {
            panic!("not relay skip")
        };
        assert_eq!(
            (cursor.action.sink.as_str(), cursor.to, yes),
            ("cop", 9, true)
        );
        assert!(parse(&["relay", "retry", "--sink", "cop", "--reason", "r"]).is_err());
        assert!(parse(&["relay", "retry", "--sink", "cop", "--reason", "r", "--all"]).is_ok());
        assert!(
            parse(&[
                "relay", "discard", "--sink", "c", "--reason", "r", "3", "--all"
            ])
            .is_err()
        );
    }
}
