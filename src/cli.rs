//! Command-line flags (clap derive). Raw values only: no I/O, no validation beyond types.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "replay-guard",
    version,
    about = "Exactly-once incident effects from an at-least-once MQTT feed",
    long_about = "replay-guard decides, for every delivered incident message, whether its effect \
                  is applied, suppressed as a provable duplicate, or quarantined, and records \
                  each decision in a hash-chained audit log, all in one redb file.\n\n\
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
    /// Validate a config file for `run` and exit (non-zero naming the problem).
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
    /// Release (apply) or discard a quarantined message, audited with who and why. Works
    /// while `run` is consuming.
    Quarantine(QuarantineArgs),
    /// Health at a glance: decisions per outcome (total and last hour), window, per-source
    /// high-water marks, failover replay bursts, quarantine and file size.
    Stats(StatsArgs),
    /// Rewrite the database file to give back the space retention freed. Stop `run` first.
    Compact(DbArgs),
    /// See the problem and the fix: a real broker failover replay, in-process, with a naive
    /// consumer beside replay-guard. Exits 0 only if every event was applied exactly once.
    Demo(DemoArgs),
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
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsFormat {
    /// Labelled lines for people.
    Text,
    /// One JSON object, for scripts and monitoring.
    Json,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// TOML config file.
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Database file; overrides store.path from --config.
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct IngestArgs {
    /// Database file; overrides store.path from --config.
    #[arg(long, value_name = "PATH")]
    pub db: Option<PathBuf>,
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
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line.
    Jsonl,
    /// Aligned columns for people.
    Table,
}
